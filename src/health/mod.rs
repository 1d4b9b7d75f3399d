//! Health checking, run by the management core: active TCP and HTTP probes sent
//! through the data plane, passive detection from the workers' counts, and the
//! eviction and restoration of real servers (`lb=evict` / `lb=restore`, seed 004).
//!
//! Probes leave through worker 0 (the inject ring, `dataplane::mesh`), which
//! fills in the MAC addresses from its neighbour table, and the real servers' answers
//! (TCP to the probe source address and ports) come back from whichever worker the
//! NIC gave them to (the punt ring). IPv4 real servers are probed from the IPv4
//! source address, IPv6 ones from the IPv6 source address (none configured: the
//! server is not probed, and its report says why). The monitor owns every probe's state;
//! workers only move frames. Eviction never touches a weight: the management core
//! publishes snapshots in which evicted servers are scheduled as weight 0
//! (`service::HealthOverlay`).
pub mod probe;
pub mod spec;
pub mod verdict;

use crate::dataplane::probe_acks::ProbeAcks;
use crate::dataplane::realserver_stats::{PassiveTotals, PASSIVE_FIELD_MASK};
use crate::forward::synproxy::SipKey;
use crate::model::{ForwardMode, ServiceKey};
use crate::service::{HealthOverlay, ServiceTable};
use hashbrown::HashMap;
use probe::{Check, Endpoints, Probe, Segment};
use spec::{AllDown, CheckKind, CheckOverride, CheckSpec, HealthConfig};
use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use verdict::{Change, Pace, PassiveDelta, Verdict};

/// A change the management core logs and publishes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthEvent {
    /// The real server's id.
    pub id: u32,
    pub service: ServiceKey,
    pub ip: IpAddr,
    pub port: u16,
    pub change: Change,
}

impl HealthEvent {
    /// The event line of seed 004: `lb=evict svc=VIP:port rs=IP:port reason=2fail`
    /// (an IPv6 real server as `[IP]:port`).
    pub fn line(&self) -> String {
        let (op, reason) = match &self.change {
            Change::Evicted { reason } => ("evict", reason),
            Change::Restored { reason } => ("restore", reason),
        };
        format!(
            "lb={op} svc={} rs={} reason={reason}",
            self.service.event_name(),
            SocketAddr::new(self.ip, self.port)
        )
    }
}

/// The monitor's own counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct MonitorStats {
    pub probes_sent: u64,
    pub probes_ok: u64,
    pub probes_failed: u64,
    pub probes_timed_out: u64,
    /// Probes not started: no frame could be queued, or no source address of the
    /// real server's family (IPv6 without an IPv6 source); and one per tick (5 ms)
    /// in which due probes waited because every source port had a probe in flight.
    pub probes_skipped: u64,
    pub replies: u64,
    /// Frames to the probe ports that belong to no probe in flight (late answers).
    pub stray_replies: u64,
}

/// The warning that every probe source port has a probe in flight comes at most this
/// often.
const PORTS_WARNING_MS: u64 = 60_000;

/// The least time between two overlays [`HealthMonitor::overlay_if_changed`] gives.
/// Each becomes a snapshot the management core builds and publishes (about 15 ms at
/// 50,000 real servers), and an outage of many servers evicts them over many ticks:
/// a snapshot a tick would take the whole core, which also sends VRRP advertisements
/// and answers `sluicectl`. The first change after a quiet spell is given at once;
/// the ones after it wait at most this long, and go together.
pub const OVERLAY_SPACING_MS: u64 = 100;

struct Target {
    service: ServiceKey,
    ip: IpAddr,
    port: u16,
    spec: CheckSpec,
    verdict: Verdict,
    next_probe_ms: u64,
    /// What `next_probe_ms` was planned from.
    plan: Plan,
    last_outcome: Option<String>,
    passive_seen: Option<PassiveTotals>,
    /// A probe of it is in flight (an entry of `in_flight` names it).
    probing: bool,
}

/// The probes due, earliest first: (when, real-server id). An entry is pushed when
/// a target comes, when a reload moves its next probe or turns its check on, when a
/// probe ends (which plans the next) and when one could not start (no source
/// address, a frame not queued); a probe that starts pushes none, its end will. An
/// entry is checked when it comes up: it stands only if the target still exists,
/// has an active check, has no probe in flight and is still planned for that
/// moment; any other entry (left by a re-plan) is stale and dropped. So the tick
/// looks at the probes due, not at every watched server, and a probe that waits for
/// a source port keeps its place: the longest due go first.
#[derive(Default)]
struct DueQueue {
    heap: BinaryHeap<Reverse<(u64, u32)>>,
}

impl DueQueue {
    /// Files `t`'s next probe (none without an active check).
    fn file(&mut self, id: u32, t: &Target) {
        if t.spec.kind != CheckKind::None {
            self.heap.push(Reverse((t.next_probe_ms, id)));
        }
    }

    /// Takes the next entry due by `now_ms` that still stands for a target of
    /// `targets`, dropping the stale ones before it.
    fn pop_due(&mut self, now_ms: u64, targets: &BTreeMap<u32, Target>) -> Option<(u64, u32)> {
        while let Some(&Reverse((at, id))) = self.heap.peek() {
            if at > now_ms {
                return None;
            }
            self.heap.pop();
            let stands = targets
                .get(&id)
                .is_some_and(|t| t.awaits_probe() && t.next_probe_ms == at);
            if stands {
                return Some((at, id));
            }
        }
        None
    }

    /// Puts back an entry [`DueQueue::pop_due`] gave (its probe could not start).
    fn put_back(&mut self, at: u64, id: u32) {
        self.heap.push(Reverse((at, id)));
    }

    /// Files every target afresh (those with an active check and no probe in
    /// flight) when the entries outnumber twice the targets and 64 more (each
    /// re-plan leaves a stale one behind), so the heap stays within a small multiple
    /// of the targets.
    fn compact(&mut self, targets: &BTreeMap<u32, Target>) {
        if self.heap.len() > 2 * targets.len() + 64 {
            let entries: Vec<_> = targets
                .iter()
                .filter(|(_, t)| t.awaits_probe())
                .map(|(&id, t)| Reverse((t.next_probe_ms, id)))
                .collect();
            self.heap = BinaryHeap::from(entries);
        }
    }
}

/// When a target's next probe was planned, and which setting spaced it: a reload
/// that changes that setting re-plans the probe from the same moment, rather than
/// leaving it where the old setting put it (up to `retry_ms`, a day, away).
#[derive(Clone, Copy, Debug)]
struct Plan {
    from_ms: u64,
    pace: Pace,
    /// How far after `from_ms` the probe was planned: the setting's value, or more
    /// (a passive eviction's grown back-off).
    delay_ms: u64,
}

impl Plan {
    fn new(from_ms: u64, pace: Pace, delay_ms: u64) -> Plan {
        Plan {
            from_ms,
            pace,
            delay_ms,
        }
    }

    /// The next probe under `spec` when its spacing setting changed, or `None` to
    /// keep the one planned: only a shorter spacing moves it, to the first point after
    /// `now_ms` of the grid `from_ms + k * new`. A point already past would send every
    /// server a reload touched at the same tick, and they would stay bunched (each
    /// verdict spaces the next probe from its own start); the grid keeps each
    /// server's phase, as their first probes' random offsets spread them.
    fn replanned(&self, spec: &CheckSpec, now_ms: u64) -> Option<u64> {
        let new = self.pace.ms(spec).max(1);
        if new >= self.delay_ms {
            return None;
        }
        let since = now_ms.saturating_sub(self.from_ms);
        Some(self.from_ms + since.div_ceil(new).max(1) * new)
    }
}

impl Target {
    /// It has an active check and no probe in flight: its next probe is to be filed.
    fn awaits_probe(&self) -> bool {
        self.spec.kind != CheckKind::None && !self.probing
    }

    fn plan(&mut self, from_ms: u64, pace: Pace) {
        // Never the same moment: the tick's loop over the probes due ends because a
        // probe started (or not) is planned later than now.
        let delay_ms = pace.ms(&self.spec).max(1);
        self.plan = Plan::new(from_ms, pace, delay_ms);
        self.next_probe_ms = from_ms + delay_ms;
    }
}

struct InFlight {
    target: u32,
    probe: Probe,
    started_ms: u64,
    deadline_ms: u64,
}

/// One real server's health, for `sluicectl health` and the metrics.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TargetReport {
    pub service: String,
    pub ip: String,
    pub port: u16,
    pub check: CheckKind,
    pub probe_port: u16,
    pub interval_ms: u32,
    pub timeout_ms: u32,
    pub fall: u32,
    pub rise: u32,
    pub retry_ms: u32,
    pub passive: bool,
    pub evicted: bool,
    pub evictions: u64,
    pub restores: u64,
    pub last_reason: String,
    pub last_outcome: Option<String>,
    /// Milliseconds since the last eviction or restoration (none yet: since start).
    pub since_change_ms: u64,
}

/// The last outcome of an IPv6 real server's check when the appliance has no IPv6
/// address to probe from.
pub const NO_SOURCE6: &str = "no IPv6 source";

pub struct HealthMonitor {
    cfg: HealthConfig,
    source: Ipv4Addr,
    /// The addresses probes to IPv6 real servers may come from (each server's: the
    /// one sharing the longest prefix with it); none: they are not probed.
    sources6: Vec<Ipv6Addr>,
    service_checks: HashMap<ServiceKey, (CheckOverride, Option<AllDown>)>,
    server_checks: HashMap<(ServiceKey, IpAddr, u16), CheckOverride>,
    /// By real-server id.
    targets: BTreeMap<u32, Target>,
    /// By local (source) port.
    in_flight: HashMap<u16, InFlight>,
    next_port: u16,
    /// When the last warning that every source port had a probe in flight was
    /// logged (at most one a minute).
    ports_warned_ms: Option<u64>,
    /// The probes due, by when.
    due: DueQueue,
    /// The targets with passive detection on, by id.
    passive_ids: Vec<u32>,
    /// Spreads the first probes; seeded by the caller, so not secret.
    rng: crate::model::rng::Rng,
    /// The secret of the probes' initial sequence numbers, from the kernel's
    /// randomness: a reply must acknowledge the ISN, and that keeps a sender that
    /// forges a real server's address out only if it cannot work the ISN out.
    isn_key: SipKey,
    /// Probes given an ISN so far: no two probes hash the same input.
    isns_drawn: u64,
    /// The workers' copy of each port's last ISN (none in tests without workers).
    probe_acks: Option<Arc<ProbeAcks>>,
    table_version: Option<u64>,
    /// Whether the settings can watch any real server at all (`[health]` or some
    /// service's or server's `health` table turns a check or passive detection on):
    /// when not, and nothing is watched, a change of the table needs no look at each
    /// of its real servers.
    can_watch: bool,
    /// The table's services as of the last reconcile.
    services: Vec<ServiceKey>,
    /// Whether [`HealthMonitor::overlay`] may have changed since
    /// [`HealthMonitor::overlay_if_changed`] last gave it: set by every verdict
    /// change (each comes with an event), every look at a changed table and every
    /// reconfiguration.
    overlay_stale: bool,
    /// The overlay [`HealthMonitor::overlay_if_changed`] last gave, and when.
    overlay_given: Option<(HealthOverlay, u64)>,
    pub stats: MonitorStats,
}

/// Whether a key of both `old` and `new` has another value: a new key comes with its
/// service or real server, whose addition is the change.
fn settings_changed<K, V>(old: &HashMap<K, V>, new: &HashMap<K, V>) -> bool
where
    K: Eq + std::hash::Hash,
    V: PartialEq,
{
    new.iter()
        .any(|(k, v)| old.get(k).is_some_and(|before| before != v))
}

/// Whether `cfg` and `overrides` can turn a check or passive detection on for some
/// real server (an over-estimate: a UDP service's check without a port watches
/// nothing, see [`HealthMonitor::spec_for`]).
fn can_watch(cfg: &HealthConfig, overrides: &Overrides) -> bool {
    let turns_on =
        |o: &CheckOverride| o.kind.is_some_and(|k| k != CheckKind::None) || o.passive == Some(true);
    cfg.defaults.watches()
        || overrides.services.values().any(|(o, _)| turns_on(o))
        || overrides.servers.values().any(turns_on)
}

/// What a service and its real servers override, from the config.
#[derive(Clone, Debug, Default)]
pub struct Overrides {
    pub services: HashMap<ServiceKey, (CheckOverride, Option<AllDown>)>,
    pub servers: HashMap<(ServiceKey, IpAddr, u16), CheckOverride>,
}

/// `sluicectl health`: every watched real server and the monitor's counters.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HealthReport {
    pub source: String,
    /// The IPv6 probes' possible sources; none: IPv6 real servers are not actively
    /// checked.
    #[serde(default)]
    pub sources6: Vec<String>,
    pub targets: Vec<TargetReport>,
    pub stats: MonitorStats,
}

/// Below one target in this many with passive detection on, the tick looks those up
/// by id rather than walk all the targets.
const PASSIVE_LOOKUP_SHARE: usize = 4;

/// Target `id`'s passive verdict on the counts `totals` (the workers' sums), and the
/// time-outs of a passive eviction's back-off; an eviction under an active check
/// plans the probe that may restore it, after the back-off.
fn read_passive(
    id: u32,
    t: &mut Target,
    totals: PassiveTotals,
    now_ms: u64,
    due: &mut DueQueue,
) -> impl Iterator<Item = HealthEvent> {
    let delta = match t.passive_seen {
        Some(seen) => PassiveDelta {
            answered: totals.answered.wrapping_sub(seen.answered) & PASSIVE_FIELD_MASK,
            unanswered: totals.unanswered.wrapping_sub(seen.unanswered) & PASSIVE_FIELD_MASK,
            refused: totals.refused.wrapping_sub(seen.refused) & PASSIVE_FIELD_MASK,
        },
        None => PassiveDelta::default(),
    };
    t.passive_seen = Some(totals);
    let passive = t.verdict.on_passive(&t.spec, delta, now_ms);
    let timed = t.verdict.on_time(&t.spec, now_ms);
    if let Some(Change::Evicted { .. }) = passive {
        if t.spec.kind != CheckKind::None {
            t.next_probe_ms = t.verdict.retry_at_ms;
            t.plan = Plan::new(
                now_ms,
                Pace::Retry,
                t.verdict.retry_at_ms.saturating_sub(now_ms),
            );
            due.file(id, t);
        }
    }
    let (service, ip, port) = (t.service, t.ip, t.port);
    passive
        .into_iter()
        .chain(timed)
        .map(move |change| HealthEvent {
            id,
            service,
            ip,
            port,
            change,
        })
}

impl HealthMonitor {
    pub fn new(cfg: HealthConfig, source: Ipv4Addr, overrides: Overrides, seed: u64) -> Self {
        HealthMonitor {
            can_watch: can_watch(&cfg, &overrides),
            next_port: *cfg.source_ports.start(),
            ports_warned_ms: None,
            due: DueQueue::default(),
            passive_ids: Vec::new(),
            overlay_stale: true,
            overlay_given: None,
            cfg,
            source,
            sources6: Vec::new(),
            service_checks: overrides.services,
            server_checks: overrides.servers,
            targets: BTreeMap::new(),
            in_flight: HashMap::new(),
            rng: crate::model::rng::Rng::new(seed),
            isn_key: SipKey::random(),
            isns_drawn: 0,
            probe_acks: None,
            table_version: None,
            services: Vec::new(),
            stats: MonitorStats::default(),
        }
    }

    /// New settings (a config reload): every server's check is worked out again at
    /// the next tick; verdicts are kept.
    /// Returns whether a setting changed (for the reload's count of changes): the
    /// section's, or a `health` table of a service or real server that stays (one that
    /// comes or goes with its service or server is that one's change).
    pub fn reconfigure(&mut self, cfg: HealthConfig, overrides: Overrides) -> bool {
        // The probes' source addresses and ports stay: the workers hand the checker
        // only answers to the ports they were told at start, so probes from other
        // ports would go unanswered and evict every real server.
        let cfg = HealthConfig {
            source: self.cfg.source,
            source6: self.cfg.source6,
            source_ports: self.cfg.source_ports.clone(),
            ..cfg
        };
        let changed = cfg != self.cfg
            || settings_changed(&self.service_checks, &overrides.services)
            || settings_changed(&self.server_checks, &overrides.servers);
        self.can_watch = can_watch(&cfg, &overrides);
        self.cfg = cfg;
        self.service_checks = overrides.services;
        self.server_checks = overrides.servers;
        self.table_version = None;
        changed
    }

    /// Probes IPv6 real servers from `sources6` (the appliance's IPv6 addresses on
    /// the probes' port; each server from the one sharing the longest prefix with it;
    /// none: they are not probed).
    pub fn with_sources6(mut self, sources6: Vec<Ipv6Addr>) -> Self {
        self.sources6 = sources6;
        self
    }

    /// Where each probe's ISN is written before its SYN goes out, for the workers,
    /// which hand up only the answers that acknowledge it.
    pub fn with_probe_acks(mut self, acks: Arc<ProbeAcks>) -> Self {
        self.probe_acks = Some(acks);
        self
    }

    pub fn source(&self) -> Ipv4Addr {
        self.source
    }

    pub fn sources6(&self) -> &[Ipv6Addr] {
        &self.sources6
    }

    /// The source address for a probe to `ip`: of its family, and for IPv6 the one
    /// on its link if any (the longest common prefix).
    fn source_for(&self, ip: IpAddr) -> Option<IpAddr> {
        match ip {
            IpAddr::V4(_) => Some(IpAddr::V4(self.source)),
            IpAddr::V6(ip) => {
                let common = |a: &&Ipv6Addr| (u128::from(**a) ^ u128::from(ip)).leading_zeros();
                self.sources6
                    .iter()
                    .max_by_key(common)
                    .map(|&a| IpAddr::V6(a))
            }
        }
    }

    pub fn source_ports(&self) -> std::ops::RangeInclusive<u16> {
        self.cfg.source_ports.clone()
    }

    /// The effective check of a real server. The probes are TCP, so a UDP service's
    /// real server is probed only when its service's or its own `health` table names
    /// the TCP port to probe: a check inherited from `[health]` alone (whose port, if
    /// any, is meant for the TCP services) would send SYNs to a UDP port, fail, and
    /// evict every UDP real server.
    pub fn spec_for(&self, service: ServiceKey, ip: IpAddr, port: u16) -> CheckSpec {
        let service_override = self.service_checks.get(&service).map(|(o, _)| o);
        let server_override = self.server_checks.get(&(service, ip, port));
        // One copy of the defaults, however many overrides apply (this runs for
        // every real server at every change of the table).
        let with_service = service_override.map(|o| o.apply(&self.cfg.defaults));
        let mut spec = match (with_service, server_override) {
            (Some(spec), Some(o)) => o.apply(&spec),
            (Some(spec), None) => spec,
            (None, Some(o)) => o.apply(&self.cfg.defaults),
            (None, None) => self.cfg.defaults.clone(),
        };
        let port_given = service_override.is_some_and(|o| o.port.is_some())
            || server_override.is_some_and(|o| o.port.is_some());
        if service.proto == crate::model::Protocol::Udp && !port_given {
            spec.kind = CheckKind::None;
        }
        spec
    }

    /// [`HealthMonitor::overlay`] when it differs from the one this last gave and
    /// that was at least [`OVERLAY_SPACING_MS`] before `now_ms`, else `None`: the
    /// walk of every watched real server is not made at every tick (200 a second)
    /// when nothing changed, and many changes in a row make one snapshot every
    /// [`OVERLAY_SPACING_MS`], not one a tick. A change of the table or the settings
    /// that evicts or restores nobody gives nothing and holds nothing back.
    pub fn overlay_if_changed(&mut self, now_ms: u64) -> Option<HealthOverlay> {
        let spaced = self
            .overlay_given
            .as_ref()
            .is_none_or(|(_, at)| now_ms >= at.saturating_add(OVERLAY_SPACING_MS));
        if !(self.overlay_stale && spaced) {
            return None;
        }
        self.overlay_stale = false;
        let overlay = self.overlay();
        if self
            .overlay_given
            .as_ref()
            .is_some_and(|(given, _)| *given == overlay)
        {
            return None;
        }
        self.overlay_given = Some((overlay.clone(), now_ms));
        Some(overlay)
    }

    /// Evictions and reset-when-down services for the next snapshot.
    pub fn overlay(&self) -> HealthOverlay {
        HealthOverlay {
            evicted: self
                .targets
                .iter()
                .filter(|(_, t)| t.verdict.evicted)
                .map(|(&id, _)| id)
                .collect(),
            reset_when_down: self
                .services
                .iter()
                .filter(|k| self.all_down_for(k) == AllDown::Rst)
                .copied()
                .collect(),
        }
    }

    /// What a service does when no real server can take a new connection.
    pub fn all_down_for(&self, service: &ServiceKey) -> AllDown {
        self.service_checks
            .get(service)
            .and_then(|(_, a)| *a)
            .unwrap_or(self.cfg.all_down)
    }

    fn random(&mut self) -> u64 {
        self.rng.next_u64()
    }

    /// A probe's initial sequence number, as RFC 6528 has a TCP's: a keyed hash of
    /// its four addresses and ports and of a count of probes, under a secret from the
    /// kernel. The seeded generator would not do: its seed (pid, start time) can be
    /// guessed, and one ISN seen gives away the next. RFC 6528's clock, which moves
    /// a reused four-tuple's ISNs past an old connection's, is not needed: the count
    /// makes every probe's input new, and an old probe's late answer on the same
    /// ports acknowledges another ISN, which the probe ignores as a forger's.
    fn isn(&mut self, ends: &Endpoints) -> u32 {
        let wide = |ip: IpAddr| match ip {
            IpAddr::V4(v4) => u128::from(v4.to_ipv6_mapped()),
            IpAddr::V6(v6) => u128::from(v6),
        };
        let (local, remote) = (wide(ends.local.ip()), wide(ends.remote.ip()));
        self.isns_drawn += 1;
        let hash = self.isn_key.hash([
            (local >> 64) as u64,
            local as u64,
            (remote >> 64) as u64,
            remote as u64,
            (u64::from(ends.local.port()) << 16) | u64::from(ends.remote.port()),
            self.isns_drawn,
        ]);
        hash as u32
    }

    /// Follows the service table and the checks: new real servers get a check (first
    /// probe at a random point of their first interval, so a thousand servers are not
    /// probed in one burst), removed ones lose theirs, and changed checks apply to
    /// the probe already planned. An eviction whose checks are now off ends (an
    /// event says so). Returns those events and whether anyone's eviction ended
    /// (also by the server's removal).
    fn reconcile(&mut self, table: &ServiceTable, now_ms: u64) -> (Vec<HealthEvent>, bool) {
        let mut events = Vec::new();
        if self.table_version == Some(table.version()) {
            return (events, false);
        }
        self.table_version = Some(table.version());
        self.overlay_stale = true;
        self.services = table.services().map(|s| s.key).collect();
        if !self.can_watch && self.targets.is_empty() {
            // What the walk below would find: every server unwatched, nothing to
            // restore, no probe to keep.
            self.in_flight.clear();
            self.due = DueQueue::default();
            self.passive_ids.clear();
            return (events, false);
        }
        let mut present = hashbrown::HashSet::new();
        let mut unwatched = hashbrown::HashSet::new();
        let mut changed = false;
        for s in table.services() {
            for rs in &s.real_servers {
                let ip = rs.ip;
                let spec = self.spec_for(s.key, rs.ip, rs.port);
                if !spec.watches() {
                    unwatched.insert(rs.id);
                    continue;
                }
                present.insert(rs.id);
                let jitter = self.random() % u64::from(spec.interval_ms.max(1));
                match self.targets.get_mut(&rs.id) {
                    Some(t) => {
                        let next_before = t.next_probe_ms;
                        if t.spec.kind != spec.kind && spec.kind != CheckKind::None {
                            t.next_probe_ms = now_ms + jitter;
                            t.plan = Plan::new(now_ms, Pace::Interval, jitter);
                        } else if let Some(due) = t.plan.replanned(&spec, now_ms) {
                            if due < t.next_probe_ms {
                                t.next_probe_ms = due;
                                t.plan.delay_ms = due - t.plan.from_ms;
                            }
                        }
                        if spec.passive && !t.spec.passive {
                            // Counts from before passive detection was on are no
                            // failures of it: it starts from the next tick's.
                            t.passive_seen = None;
                        }
                        if let Some(change) = t.verdict.on_check_off(&spec, now_ms) {
                            changed = true;
                            events.push(HealthEvent {
                                id: rs.id,
                                service: t.service,
                                ip,
                                port: t.port,
                                change,
                            });
                        }
                        let refile = t.spec.kind == CheckKind::None && spec.kind != CheckKind::None
                            || next_before != t.next_probe_ms;
                        t.spec = spec;
                        if refile {
                            // Otherwise the entry filed with the plan still stands.
                            self.due.file(rs.id, t);
                        }
                    }
                    None => {
                        if spec.passive
                            && spec.kind == CheckKind::None
                            && matches!(rs.mode, ForwardMode::Dr | ForwardMode::Tun)
                        {
                            log::warn!(
                                "health: {} of {} is watched by passive detection alone, which \
                                 cannot see a DR or TUN real server's answers and never evicts \
                                 it: give it an active check (docs/HEALTH.md, Passive detection)",
                                SocketAddr::new(ip, rs.port),
                                s.key.event_name()
                            );
                        }
                        if ip.is_ipv6() && spec.kind != CheckKind::None && self.sources6.is_empty()
                        {
                            log::warn!(
                                "health: {} of {} has a {} check but the appliance has no IPv6 \
                                 address to probe it from: it is not probed (add an IPv6 \
                                 address to a port, or set [health] source6)",
                                SocketAddr::new(ip, rs.port),
                                s.key.event_name(),
                                spec.kind.name()
                            );
                        }
                        let t = self.targets.entry(rs.id).or_insert(Target {
                            service: s.key,
                            ip,
                            port: rs.port,
                            spec,
                            verdict: Verdict::default(),
                            next_probe_ms: now_ms + jitter,
                            plan: Plan::new(now_ms, Pace::Interval, jitter),
                            last_outcome: None,
                            passive_seen: None,
                            probing: false,
                        });
                        self.due.file(rs.id, t);
                    }
                }
            }
        }
        self.targets.retain(|&id, t| {
            let keep = present.contains(&id);
            if !keep && t.verdict.evicted {
                changed = true;
                // Still in the table but watched by nothing now: back in service,
                // and an event says which watcher was turned off, as for any
                // restoration.
                if unwatched.contains(&id) {
                    let reason = if t.verdict.passive_evicted {
                        "passive-off"
                    } else {
                        "check-off"
                    };
                    events.push(HealthEvent {
                        id,
                        service: t.service,
                        ip: t.ip,
                        port: t.port,
                        change: Change::Restored {
                            reason: reason.into(),
                        },
                    });
                }
            }
            keep
        });
        let targets = &self.targets;
        self.in_flight
            .retain(|_, f| targets.contains_key(&f.target));
        self.passive_ids = targets
            .iter()
            .filter(|(_, t)| t.spec.passive)
            .map(|(&id, _)| id)
            .collect();
        (events, changed)
    }

    /// A frame the workers handed up (TCP to the probe source); `send` transmits.
    pub fn on_frame(
        &mut self,
        frame: &[u8],
        now_ms: u64,
        send: &mut impl FnMut(&[u8]) -> bool,
    ) -> Vec<HealthEvent> {
        self.stats.replies += 1;
        let Some(seg) = probe::parse_segment(frame) else {
            self.stats.stray_replies += 1;
            return Vec::new();
        };
        let events = self.on_segment(&seg, now_ms, send);
        self.overlay_stale |= !events.is_empty();
        events
    }

    fn on_segment(
        &mut self,
        seg: &Segment,
        now_ms: u64,
        send: &mut impl FnMut(&[u8]) -> bool,
    ) -> Vec<HealthEvent> {
        let port = seg.to.port();
        let Some(f) = self.in_flight.get_mut(&port) else {
            self.stats.stray_replies += 1;
            return Vec::new();
        };
        if f.probe.ends.remote != seg.from || f.probe.ends.local.ip() != seg.to.ip() {
            self.stats.stray_replies += 1;
            return Vec::new();
        }
        let mut tx = |b: &[u8]| {
            send(b);
        };
        let Some(outcome) = f.probe.on_segment(seg, &mut tx) else {
            return Vec::new();
        };
        let f = self.in_flight.remove(&port).expect("present above");
        self.conclude(f.target, f.started_ms, outcome, now_ms)
    }

    /// A probe's verdict. Probes keep a fixed rate (the next one is due an interval
    /// after this one started, not after its verdict), so a dead server is evicted
    /// within `fall * interval + timeout` of its death. A probe whose check a reload
    /// turned off meanwhile decides nothing: its eviction could never be undone.
    fn conclude(
        &mut self,
        id: u32,
        started_ms: u64,
        outcome: probe::Outcome,
        now_ms: u64,
    ) -> Vec<HealthEvent> {
        let Some(t) = self.targets.get_mut(&id) else {
            return Vec::new();
        };
        t.probing = false;
        if t.spec.kind == CheckKind::None {
            return Vec::new();
        }
        let ok = outcome.is_ok();
        if ok {
            self.stats.probes_ok += 1;
        } else {
            self.stats.probes_failed += 1;
        }
        t.last_outcome = Some(match &outcome {
            Ok(()) => "ok".into(),
            Err(e) => e.clone(),
        });
        let change = t.verdict.on_probe(&t.spec, ok, now_ms);
        if let Some(pace) = t.verdict.next_pace(&t.spec, ok) {
            t.plan(started_ms, pace);
        }
        self.due.file(id, t);
        change
            .map(|change| HealthEvent {
                id,
                service: t.service,
                ip: t.ip,
                port: t.port,
                change,
            })
            .into_iter()
            .collect()
    }

    /// Timeouts, passive counts, due probes. `passive` gives a real server's summed
    /// worker counts; `send` queues a frame for transmission (false: not queued).
    /// Returns the changes and whether the overlay changed for another reason.
    pub fn tick(
        &mut self,
        table: &ServiceTable,
        now_ms: u64,
        passive: impl Fn(u32) -> PassiveTotals,
        send: &mut impl FnMut(&[u8]) -> bool,
    ) -> (Vec<HealthEvent>, bool) {
        let (mut events, reconciled) = self.reconcile(table, now_ms);
        let expired: Vec<u16> = self
            .in_flight
            .iter()
            .filter(|(_, f)| now_ms >= f.deadline_ms)
            .map(|(&p, _)| p)
            .collect();
        for port in expired {
            let f = self.in_flight.remove(&port).expect("listed above");
            f.probe.abort(&mut |b| {
                send(b);
            });
            self.stats.probes_timed_out += 1;
            events.extend(self.conclude(f.target, f.started_ms, Err("timeout".into()), now_ms));
        }
        // Passive counts for the servers that have passive detection on: looked up
        // by id when they are few, else in one pass over the targets without a
        // lookup each; with none, the targets are not walked (50,000 watched
        // servers, 200 ticks a second).
        let mut read = |id: u32, t: &mut Target, due: &mut DueQueue| {
            events.extend(read_passive(id, t, passive(id), now_ms, due));
        };
        if self.passive_ids.len() * PASSIVE_LOOKUP_SHARE < self.targets.len() {
            for &id in &self.passive_ids {
                if let Some(t) = self.targets.get_mut(&id) {
                    read(id, t, &mut self.due);
                }
            }
        } else {
            for (&id, t) in self.targets.iter_mut().filter(|(_, t)| t.spec.passive) {
                read(id, t, &mut self.due);
            }
        }
        // The probes due, the longest due first: when the ports run out, the ones
        // left keep their place and take the ports the next ticks free.
        while let Some((at, id)) = self.due.pop_due(now_ms, &self.targets) {
            if !self.start_probe(id, now_ms, send) {
                // Every source port has a probe in flight.
                self.due.put_back(at, id);
                break;
            }
        }
        self.due.compact(&self.targets);
        self.overlay_stale |= !events.is_empty() || reconciled;
        (events, reconciled)
    }

    /// Starts a probe of target `id`, or says why not; `false` only when no source
    /// port is free (the target stays due).
    fn start_probe(&mut self, id: u32, now_ms: u64, send: &mut impl FnMut(&[u8]) -> bool) -> bool {
        let Some(port) = self.free_port() else {
            self.stats.probes_skipped += 1;
            if self
                .ports_warned_ms
                .is_none_or(|at| now_ms >= at + PORTS_WARNING_MS)
            {
                self.ports_warned_ms = Some(now_ms);
                let ports = &self.cfg.source_ports;
                log::warn!(
                    "health: every probe source port ({}-{}) has a probe in flight: due \
                     probes wait for one (unanswered probes hold theirs for timeout_ms; \
                     widen source_port_first..source_port_last)",
                    ports.start(),
                    ports.end()
                );
            }
            return false;
        };
        let ip = self.targets.get(&id).expect("caller checked").ip;
        let source = self.source_for(ip);
        let t = self.targets.get_mut(&id).expect("caller checked");
        let Some(source) = source else {
            // An IPv6 real server and no IPv6 source (warned when it was added): the
            // report shows why it is never probed, and it is never evicted by it.
            t.last_outcome = Some(NO_SOURCE6.into());
            t.plan(now_ms, Pace::Interval);
            self.due.file(id, t);
            self.stats.probes_skipped += 1;
            return true;
        };
        let remote = SocketAddr::new(t.ip, t.spec.port.unwrap_or(t.port));
        let check = match t.spec.kind {
            CheckKind::Http => Check::http(&t.spec.path, t.ip, t.spec.expect),
            _ => Check::Tcp,
        };
        // The next probe is planned now, so a frame that could not be queued cannot
        // stop the checks; the verdict re-plans it from the same start. The servers
        // stay as spread out as their first probes were.
        t.plan(now_ms, Pace::Interval);
        let deadline_ms = now_ms + u64::from(t.spec.timeout_ms);
        let mut queued = true;
        let ends = Endpoints {
            local: SocketAddr::new(source, port),
            remote,
        };
        let isn = self.isn(&ends);
        if let Some(acks) = &self.probe_acks {
            // Before the SYN: its answer can come back through any worker at once.
            acks.sent(port, isn);
        }
        let probe = Probe::start(ends, check, isn, &mut |b| queued &= send(b));
        if !queued {
            self.stats.probes_skipped += 1;
            // No probe in flight: this is its next try.
            if let Some(t) = self.targets.get(&id) {
                self.due.file(id, t);
            }
            return true;
        }
        self.stats.probes_sent += 1;
        self.in_flight.insert(
            port,
            InFlight {
                target: id,
                probe,
                started_ms: now_ms,
                deadline_ms,
            },
        );
        if let Some(t) = self.targets.get_mut(&id) {
            t.probing = true;
        }
        true
    }

    fn free_port(&mut self) -> Option<u16> {
        let range = self.cfg.source_ports.clone();
        let span = u32::from(*range.end() - *range.start()) + 1;
        if self.in_flight.len() >= span as usize {
            // All taken: known without a look at each.
            return None;
        }
        for _ in 0..span {
            let p = self.next_port;
            self.next_port = if p >= *range.end() {
                *range.start()
            } else {
                p + 1
            };
            if !self.in_flight.contains_key(&p) {
                return Some(p);
            }
        }
        None
    }

    /// Every watched real server, in id order.
    pub fn report(&self, now_ms: u64) -> Vec<TargetReport> {
        self.targets
            .values()
            .map(|t| TargetReport {
                service: t.service.event_name(),
                ip: t.ip.to_string(),
                port: t.port,
                check: t.spec.kind,
                probe_port: t.spec.port.unwrap_or(t.port),
                interval_ms: t.spec.interval_ms,
                timeout_ms: t.spec.timeout_ms,
                fall: t.spec.fall,
                rise: t.spec.rise,
                retry_ms: t.spec.retry_ms,
                passive: t.spec.passive,
                evicted: t.verdict.evicted,
                evictions: t.verdict.evictions,
                restores: t.verdict.restores,
                last_reason: t.verdict.last_reason.clone(),
                last_outcome: t.last_outcome.clone(),
                since_change_ms: now_ms.saturating_sub(t.verdict.changed_at_ms),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
