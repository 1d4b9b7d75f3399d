//! The management core's service registry: built from the config, edited by control
//! requests (ipvsadm `-A/-E/-D/-a/-e/-d/-C`, DPVS's `--add-laddr/--del-laddr`),
//! published to the workers as immutable snapshots, and listed with the workers'
//! per-real-server counters.
use crate::config::Config;
use crate::control::protocol::Request;
use crate::control::report::{
    AclRuleStatus, AdmissionReport, EventLine, EventsReport, LaddrReport, RealServerStatus,
    ServiceAdmission, ServiceCounts, ServiceRates, ServiceStatus, ServicesReport, TimeoutsReport,
};
use crate::dataplane::realserver_stats::{
    RealServerCounters, RealServerTotals, MAX_REAL_SERVER_IDS,
};
use crate::model::SchedulerKind;
use crate::model::{RealServerSpec, ServiceKey};
use crate::service::{
    HealthOverlay, NatRoute, ServiceError, ServiceTable, Snapshot, SnapshotPublisher,
};
use crate::session::Timeouts;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Scheduler of a service added without `-s`: weighted, so weights mean something.
pub const DEFAULT_SCHEDULER: SchedulerKind = SchedulerKind::DEFAULT;

/// The editable table and the generation of the last snapshot published from it.
pub struct Services {
    pub table: ServiceTable,
    /// Session timeouts: the config's, then `--set` changes; published with every
    /// snapshot.
    pub timeouts: Timeouts,
    pub generation: u64,
    /// When `generation` was published (clock and TSC): adoption by the workers is
    /// timed from here.
    pub published_at: Option<(std::time::Instant, u64)>,
    /// The ports' own addresses, which can never be local addresses (the table does
    /// not know the ports).
    pub own_addresses: Vec<std::net::IpAddr>,
    /// Services with no real server able to take a new connection, as of the last
    /// publish, and how many times a service became so (alerts raised).
    pub unavailable: Vec<ServiceKey>,
    pub alerts: u64,
    /// Per-real-server rates, sampled once a second by the management loop.
    pub rates: super::rates::Rates,
    /// The last [`EVENTS_KEPT`] config changes and alerts (`sluicectl events`), as
    /// (milliseconds since the Unix epoch, `lb=...` line).
    pub events: std::collections::VecDeque<(u64, String)>,
    /// Health checking's evictions (and all-down behaviour), laid over the table in
    /// every snapshot.
    pub health: HealthOverlay,
    /// Evictions so far, by real-server id.
    pub evictions: std::collections::HashMap<u32, u64>,
    /// NAT routes the table no longer has (a real server removed or given another
    /// mode, a service deleted), with when, kept in snapshots for the longest session
    /// timeout so the replies of sessions they still carry reach their
    /// owner worker.
    pub departed_nat: hashbrown::HashMap<NatRoute, std::time::Instant>,
    /// By service id: each service's real servers and sorry server as of the last
    /// publish, and those removed from it since: the service's counters go on
    /// counting them ([`ServiceCounts`]) until the id is released ([`Retiring`]),
    /// when its counts move to [`Services::released_traffic`]. Service ids are never
    /// reused, so a service deleted and added again (a new id) starts from zero.
    pub member_ids: hashbrown::HashMap<u32, Vec<u32>>,
    pub departed_ids: hashbrown::HashMap<u32, Vec<u32>>,
    /// By real-server id: its traffic counts summed over the workers when `-Z` (or
    /// `sluicectl zero`) last zeroed it. Listings and metrics show the counts since;
    /// the workers' own counters are never written by this core, as each worker
    /// updates them with a plain load and store that would undo a zero written
    /// meanwhile. Rates read the workers' counters, which never go back.
    pub zeroed_at: std::collections::HashMap<u32, Traffic>,
    /// Removed real and sorry servers' ids, in the order they left, until each is
    /// released back to the table ([`Services::release_server_ids`]).
    pub retiring: std::collections::VecDeque<Retiring>,
    /// By real-server id: its traffic counts summed over the workers when it was
    /// released for another server, which counts from there (in its service's
    /// rates, which read the workers' counters, not the counts since `-Z`).
    pub reissued_at: std::collections::HashMap<u32, Traffic>,
    /// By service id: the traffic of its departed real servers whose ids were
    /// released, as (the workers' counts, the counts since the service was last
    /// zeroed). Its counters go on counting them.
    pub released_traffic: std::collections::HashMap<u32, (Traffic, Traffic)>,
    /// Whether some published service has had persistence (so templates may exist).
    pub had_persistence: bool,
    /// Whether the first port has an IPv6 address: Neighbor Discovery for IPv6 real
    /// servers leaves from it, so without one an IPv6 real server is refused (the
    /// config's own check, for `sluicectl` too).
    pub first_port_ipv6: bool,
    /// Whether this node answers for the VIPs (false while VRRP makes it a backup).
    pub serving_vips: bool,
    /// VRRP's virtual addresses besides VIPs and local addresses (`[vrrp] addresses`).
    pub vrrp_addresses: Vec<Ipv4Addr>,
}

/// The requests that turn `current` into `desired` (a config reload's diff), in an
/// order the table accepts: removals first, then additions and edits. TOA is not an
/// ipvsadm request: a reload that changes it reports that instead of ignoring it.
pub fn diff(current: &ServiceTable, desired: &ServiceTable) -> Result<Vec<Request>, String> {
    let mut out = Vec::new();
    let spec = |r: &crate::model::RealServer| {
        RealServerSpec::new(r.ip, r.port, r.weight, r.mode).with_thresholds(r.upper, r.lower)
    };
    let sorry = |s: &crate::model::Service| s.sorry_server.map(|s| s.spec());
    for s in current.services() {
        if desired.get(s.key).is_none() {
            out.push(Request::DeleteService { service: s.key });
        }
    }
    // Every removal before any addition, across services: an address may leave one
    // role (a real server, a local address) in a service that sorts after the one
    // taking it in another role (a VIP), which the table refuses while both hold.
    for d in desired.services() {
        let Some(c) = current.get(d.key) else {
            continue;
        };
        if c.toa != d.toa {
            return Err(format!(
                "{}: toa changes need a restart (not an ipvsadm change)",
                d.key
            ));
        }
        for r in &c.real_servers {
            if d.server(r.ip, r.port).is_none() {
                out.push(Request::DeleteServer {
                    service: d.key,
                    ip: r.ip,
                    port: r.port,
                });
            }
        }
        for lip in &c.local_addresses {
            if !d.local_addresses.contains(lip) {
                out.push(Request::DelLaddr {
                    service: d.key,
                    ip: *lip,
                });
            }
        }
        // A sorry server that goes or changes: the old one goes now too.
        if sorry(c).is_some() && sorry(c) != sorry(d) {
            out.push(Request::SetSorryServer {
                service: d.key,
                sorry_server: None,
            });
        }
    }
    for d in desired.services() {
        let key = d.key;
        // Kept by -A/-E (their size is the current one, or the default for a new
        // service): set on its own when the file's differs. A larger table goes in
        // before an -E that may make the service mh (which needs a slot for each of its
        // real servers), a smaller one after an -E that may make it something else.
        let size = current
            .get(key)
            .map_or(crate::model::MH_DEFAULT_TABLE_SIZE, |c| c.mh_table_size);
        let set_size = (size != d.mh_table_size).then_some(Request::SetMhTableSize {
            service: key,
            size: d.mh_table_size,
        });
        let (size_first, size_after) = match set_size {
            Some(r) if current.get(key).is_some() && d.mh_table_size > size => (Some(r), None),
            other => (None, other),
        };
        out.extend(size_first);
        match current.get(key) {
            None => out.push(Request::AddService {
                service: key,
                scheduler: Some(d.scheduler),
                persistence: d.persistence,
                sched_flags: Some(d.sched_flags),
            }),
            Some(c) => {
                if (c.scheduler, c.persistence, c.sched_flags)
                    != (d.scheduler, d.persistence, d.sched_flags)
                {
                    out.push(Request::EditService {
                        service: key,
                        scheduler: Some(d.scheduler),
                        persistence: d.persistence,
                        sched_flags: Some(d.sched_flags),
                    });
                }
            }
        }
        out.extend(size_after);
        let existing = current.get(key);
        for lip in &d.local_addresses {
            if !existing.is_some_and(|c| c.local_addresses.contains(lip)) {
                out.push(Request::AddLaddr {
                    service: key,
                    ip: *lip,
                });
            }
        }
        // The SYN proxy refuses DR and TUN servers: off before servers change, on after.
        let synproxy = (existing.map_or(crate::model::SynProxy::default(), |c| c.synproxy)
            != d.synproxy)
            .then_some(Request::SetSynproxy {
                service: key,
                synproxy: d.synproxy,
            });
        let proxy_on = d.synproxy.mode != crate::model::SynProxyMode::Off;
        if !proxy_on {
            out.extend(synproxy.clone());
        }
        // sloppy_tcp refuses FullNAT servers too: off before servers change, on after.
        let sloppy = (existing.is_some_and(|c| c.sloppy_tcp) != d.sloppy_tcp).then_some(
            Request::SetSloppyTcp {
                service: key,
                on: d.sloppy_tcp,
            },
        );
        if !d.sloppy_tcp {
            out.extend(sloppy.clone());
        }
        // After the real servers that go have gone (one may become the sorry server),
        // before those that come (one may be the sorry server until now), before the
        // SYN proxy or sloppy_tcp goes on (they refuse some sorry servers).
        // (One that changed was taken away with the removals.)
        let kept = existing
            .and_then(sorry)
            .filter(|old| sorry(d).as_ref() == Some(old));
        if kept != sorry(d) {
            out.push(Request::SetSorryServer {
                service: key,
                sorry_server: sorry(d),
            });
        }
        for r in &d.real_servers {
            match existing.and_then(|c| c.server(r.ip, r.port)) {
                None => out.push(Request::AddServer {
                    service: key,
                    server: spec(r),
                }),
                Some(old) if spec(old) != spec(r) => out.push(Request::EditServer {
                    service: key,
                    server: spec(r),
                }),
                Some(_) => {}
            }
        }
        admission_diff(current, desired, key, &mut out);
        if proxy_on {
            out.extend(synproxy);
        }
        if d.sloppy_tcp {
            out.extend(sloppy);
        }
    }
    Ok(out)
}

/// The requests that give service `key` the access list and rate limit it has in
/// `desired`: the whole list again when it differs (cleared, then its allow and deny
/// rules), the limit when it differs.
fn admission_diff(
    current: &ServiceTable,
    desired: &ServiceTable,
    key: ServiceKey,
    out: &mut Vec<Request>,
) {
    use crate::service::AclAction;
    let empty = std::collections::BTreeMap::new();
    let acl = |t: &ServiceTable| t.admission(key).map_or(&empty, |r| r.acl()).clone();
    let limit = |t: &ServiceTable| t.admission(key).and_then(|r| r.rate_limit());
    let (have, want) = (acl(current), acl(desired));
    if have != want {
        if !have.is_empty() {
            out.push(Request::AclClear { service: key });
        }
        for action in [AclAction::Allow, AclAction::Deny] {
            let prefixes: Vec<_> = want
                .iter()
                .filter(|(_, a)| **a == action)
                .map(|(p, _)| *p)
                .collect();
            if !prefixes.is_empty() {
                out.push(Request::AclAdd {
                    service: key,
                    action,
                    prefixes,
                });
            }
        }
    }
    if limit(current) != limit(desired) {
        out.push(Request::SetRateLimit {
            service: key,
            limit: limit(desired),
        });
    }
}

/// Events `sluicectl events` can show.
pub const EVENTS_KEPT: usize = 256;

/// `vip:port/proto`, one token for `key=value` event lines.
fn svc(key: &ServiceKey) -> String {
    key.event_name()
}

/// The event line of a change request (seed 004's `lb=...` style).
fn describe(req: &Request) -> Option<String> {
    let line = match req {
        Request::AddService {
            service, scheduler, ..
        } => format!(
            "lb=config op=add-svc svc={} sched={}",
            svc(service),
            scheduler.unwrap_or(DEFAULT_SCHEDULER)
        ),
        Request::EditService {
            service, scheduler, ..
        } => match scheduler {
            Some(s) => format!("lb=config op=edit-svc svc={} sched={s}", svc(service)),
            None => format!("lb=config op=edit-svc svc={}", svc(service)),
        },
        Request::DeleteService { service } => format!("lb=config op=del-svc svc={}", svc(service)),
        Request::SetSynproxy { service, synproxy } => format!(
            "lb=config op=synproxy svc={} mode={} auto_syn_rate={} syn_retries={}",
            svc(service),
            synproxy.mode.name(),
            synproxy.auto_syn_rate,
            synproxy.syn_retries
        ),
        Request::SetSorryServer {
            service,
            sorry_server: Some(s),
        } => format!(
            "lb=config op=sorry-rs svc={} rs={} fwd={}{}",
            svc(service),
            crate::control::render::endpoint(s.ip, s.port),
            s.mode.name(),
            if s.inhibit { " inhibit" } else { "" }
        ),
        Request::SetSorryServer {
            service,
            sorry_server: None,
        } => format!("lb=config op=sorry-rs svc={} rs=none", svc(service)),
        Request::SetSloppyTcp { service, on } => format!(
            "lb=config op=sloppy-tcp svc={} {}",
            svc(service),
            if *on { "on" } else { "off" }
        ),
        Request::SetMhTableSize { service, size } => format!(
            "lb=config op=mh-table-size svc={} size={size}",
            svc(service)
        ),
        Request::AddServer { service, server } | Request::EditServer { service, server } => {
            let op = if matches!(req, Request::AddServer { .. }) {
                "add-rs"
            } else {
                "edit-rs"
            };
            format!(
                "lb=config op={op} svc={} rs={} weight={} mode={}",
                svc(service),
                std::net::SocketAddr::new(server.ip, server.port),
                server.weight,
                server.mode.name()
            )
        }
        Request::DeleteServer { service, ip, port } => {
            let rs = std::net::SocketAddr::new(*ip, *port);
            format!("lb=config op=del-rs svc={} rs={rs}", svc(service))
        }
        Request::Clear => "lb=config op=clear".to_string(),
        Request::AddLaddr { service, ip } => {
            format!("lb=config op=add-laddr svc={} lip={ip}", svc(service))
        }
        Request::DelLaddr { service, ip } => {
            format!("lb=config op=del-laddr svc={} lip={ip}", svc(service))
        }
        Request::SetTimeouts { tcp, tcpfin, udp } => {
            format!("lb=config op=set-timeouts tcp={tcp} tcpfin={tcpfin} udp={udp}")
        }
        Request::AclAdd {
            service,
            action,
            prefixes,
        } => format!(
            "lb=config op=acl-add svc={} action={} prefixes={}{}",
            svc(service),
            action.name(),
            prefixes.len(),
            prefixes
                .first()
                .map(|p| format!(" first={p}"))
                .unwrap_or_default()
        ),
        Request::AclDel { service, prefixes } => format!(
            "lb=config op=acl-del svc={} prefixes={}{}",
            svc(service),
            prefixes.len(),
            prefixes
                .first()
                .map(|p| format!(" first={p}"))
                .unwrap_or_default()
        ),
        Request::AclClear { service } => format!("lb=config op=acl-clear svc={}", svc(service)),
        Request::SetRateLimit { service, limit } => match limit {
            Some(l) => format!(
                "lb=config op=rate-limit svc={} rate={} burst={} prefix={}",
                svc(service),
                l.rate,
                l.burst,
                l.prefix_len
            ),
            None => format!("lb=config op=rate-limit svc={} off", svc(service)),
        },
        _ => return None,
    };
    Some(line)
}

/// Batches longer than this log one summary line instead of one line per command:
/// a restore of 100k services must not flood the log (the event list keeps only
/// [`EVENTS_KEPT`] anyway).
pub const BATCH_EVENT_LINES: usize = 64;

/// Alert lines one publish logs one by one; beyond them, one summary line (the count
/// of alerts still grows by one per service).
pub const ALERT_LINES: usize = 64;

/// The event lines of a batch's commands, or none for a long batch.
fn describe_all(requests: &[Request]) -> Vec<String> {
    if requests.len() > BATCH_EVENT_LINES {
        return Vec::new();
    }
    requests.iter().filter_map(describe).collect()
}

/// A real server's traffic counts at one moment ([`Services::zeroed_at`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Traffic {
    pub connections: u64,
    pub in_packets: u64,
    pub in_bytes: u64,
    pub out_packets: u64,
    pub out_bytes: u64,
}

impl Traffic {
    fn of(t: &RealServerTotals) -> Traffic {
        Traffic {
            connections: t.connections,
            in_packets: t.in_packets,
            in_bytes: t.in_bytes,
            out_packets: t.out_packets,
            out_bytes: t.out_bytes,
        }
    }
}

/// What one request did to the services.
enum Applied {
    /// The table (or the timeouts) changed: publish.
    Changed,
    /// A query: this is the answer.
    Answer(serde_json::Value),
}

impl Traffic {
    /// These counts less `base` (counts taken earlier), or these.
    fn since(self, base: Option<&Traffic>) -> Traffic {
        let Some(b) = base else {
            return self;
        };
        Traffic {
            connections: self.connections.saturating_sub(b.connections),
            in_packets: self.in_packets.saturating_sub(b.in_packets),
            in_bytes: self.in_bytes.saturating_sub(b.in_bytes),
            out_packets: self.out_packets.saturating_sub(b.out_packets),
            out_bytes: self.out_bytes.saturating_sub(b.out_bytes),
        }
    }

    fn add(&mut self, t: &Traffic) {
        self.connections += t.connections;
        self.in_packets += t.in_packets;
        self.in_bytes += t.in_bytes;
        self.out_packets += t.out_packets;
        self.out_bytes += t.out_bytes;
    }
}

/// Real server `id`'s counters summed over the workers, less its counts when it was
/// last zeroed (`zeroed_at`).
fn totals_since_zero(
    zeroed_at: &std::collections::HashMap<u32, Traffic>,
    counters: &[Arc<Box<[RealServerCounters]>>],
    id: u32,
) -> RealServerTotals {
    let t = RealServerTotals::sum(counters, id);
    let since = Traffic::of(&t).since(zeroed_at.get(&id));
    RealServerTotals {
        connections: since.connections,
        in_packets: since.in_packets,
        in_bytes: since.in_bytes,
        out_packets: since.out_packets,
        out_bytes: since.out_bytes,
        ..t
    }
}

/// Real server `id`'s traffic summed over the workers since its id was last handed to
/// a new server (`reissued_at`), or since start.
fn raw_since_reissue(
    reissued_at: &std::collections::HashMap<u32, Traffic>,
    counters: &[Arc<Box<[RealServerCounters]>>],
    id: u32,
) -> Traffic {
    Traffic::of(&RealServerTotals::sum(counters, id)).since(reissued_at.get(&id))
}

/// A removed real or sorry server's id on its way back to the table.
///
/// The workers count each real server in a slot of a fixed array indexed by its id
/// ([`MAX_REAL_SERVER_IDS`]), and sessions and persistence templates name their real
/// server by id, so an id may be handed out again only once nothing refers to it:
///
/// - every worker has adopted a snapshot without it: no new session or template can
///   name it (sync installs find servers by address in the current table), and its
///   overload marks are cleared;
/// - no worker has a session counted on it (its active and inactive gauges read 0 on
///   every worker: a worker counts every session it files, synced ones too), on
///   [`QUIET_CHECKS`] checks in a row over at least [`QUIET_FOR`]: a session changing
///   state moves from one gauge to the other in two stores, and one reading may fall
///   between them;
/// - no live template names it (templates are renewed by their client's sessions,
///   whichever server those went to, and a peer's may outlive ours; a template that
///   has expired is never renewed). Looked for only once some service has had
///   persistence: there are no templates before.
#[derive(Clone, Copy, Debug)]
pub struct Retiring {
    pub id: u32,
    /// The first snapshot without it.
    pub generation: u64,
    /// Since when no worker has had a session counted on it, as of the checks so far,
    /// and how many checks in a row found none.
    pub quiet_since: Option<Instant>,
    pub quiet_checks: u32,
}

/// Checks in a row that must find no session counted on a removed server before its
/// id may be released, and the least time they span (they run once a second).
pub const QUIET_CHECKS: u32 = 3;
pub const QUIET_FOR: Duration = Duration::from_secs(2);

impl Services {
    pub fn from_config(cfg: &Config) -> Result<Services, String> {
        let own_addresses: Vec<std::net::IpAddr> = cfg
            .ports
            .iter()
            .flat_map(|p| {
                let v4 = p.addresses.iter().map(|a| a.addr.into());
                v4.chain(p.addresses6.iter().map(|a| a.addr.into()))
            })
            .collect();
        let mut table = ServiceTable::new();
        table.set_server_id_limit(MAX_REAL_SERVER_IDS as u32);
        table.set_server_address_limit(cfg.sessions.server_addresses() as usize);
        table.set_own_addresses(own_addresses.clone());
        table.set_workers(cfg.lcores.workers.len());
        for (i, sc) in cfg.services.iter().enumerate() {
            // A refusal names its field as load errors do (FILE:LINE:COLUMN: field), or
            // the service's line for a field left to its default. The file's own checks
            // read one service at a time; the table also sees the others (an address
            // another service holds in another role, say).
            let at_field = |field: String| {
                move |e: ServiceError| match cfg.locate(&field) {
                    Some((line, column)) => {
                        format!("{}:{line}:{column}: {field}: {e}", cfg.path.display())
                    }
                    None => format!("{}:{}: {field}: {e}", cfg.path.display(), sc.line),
                }
            };
            let field = |name: &str| format!("services[{i}].{name}");
            let persistence = sc.persistence;
            table
                .add_service(sc.key, sc.scheduler, persistence)
                .map_err(at_field(field("vip")))?;
            for (j, rs) in sc.real_servers.iter().enumerate() {
                let spec = RealServerSpec::new(rs.ip, rs.port, rs.weight, rs.mode)
                    .with_thresholds(rs.upper, rs.lower);
                table
                    .add_server(sc.key, spec)
                    .map_err(at_field(field(&format!("real_servers[{j}].ip"))))?;
            }
            for (k, &ip) in sc.local_addresses.iter().enumerate() {
                table
                    .add_laddr(sc.key, ip)
                    .map_err(at_field(field(&format!("local_addresses[{k}]"))))?;
            }
            if sc.toa {
                table
                    .set_toa(sc.key, true)
                    .map_err(at_field(field("toa")))?;
            }
            for action in [
                crate::service::AclAction::Allow,
                crate::service::AclAction::Deny,
            ] {
                let prefixes: Vec<_> = sc
                    .acl
                    .iter()
                    .filter(|(a, _)| *a == action)
                    .map(|(_, p)| *p)
                    .collect();
                if !prefixes.is_empty() {
                    let written = match action {
                        crate::service::AclAction::Allow => "acl_allow",
                        crate::service::AclAction::Deny => "acl_deny",
                    };
                    // Where the rules came from is looked for only on a refusal:
                    // `locate` parses the whole file again.
                    table.acl_add(sc.key, action, &prefixes).map_err(|e| {
                        let name = match cfg.locate(&field(written)) {
                            Some(_) => written,
                            None => "acl_file",
                        };
                        at_field(field(name))(e)
                    })?;
                }
            }
            if sc.rate_limit.is_some() {
                table
                    .set_rate_limit(sc.key, sc.rate_limit)
                    .map_err(at_field(field("rate_limit")))?;
            }
            table
                .set_synproxy(sc.key, sc.synproxy)
                .map_err(at_field(field("synproxy")))?;
            if sc.sorry_server.is_some() {
                table
                    .set_sorry_server(sc.key, sc.sorry_server)
                    .map_err(at_field(field("sorry_server.ip")))?;
            }
            if sc.sloppy_tcp {
                table
                    .set_sloppy_tcp(sc.key, true)
                    .map_err(at_field(field("sloppy_tcp")))?;
            }
            table
                .set_sched_params(sc.key, sc.sched_flags, sc.mh_table_size)
                .map_err(|e| {
                    let name = match cfg.locate(&field("mh_table_size")) {
                        Some(_) => "mh_table_size",
                        None => "scheduler_flags",
                    };
                    at_field(field(name))(e)
                })?;
        }
        let mut services = Services {
            table,
            timeouts: super::timeouts_from_config(cfg),
            generation: 0,
            published_at: None,
            own_addresses,
            unavailable: Vec::new(),
            alerts: 0,
            rates: Default::default(),
            events: Default::default(),
            health: HealthOverlay::default(),
            evictions: Default::default(),
            departed_nat: Default::default(),
            member_ids: Default::default(),
            departed_ids: Default::default(),
            zeroed_at: Default::default(),
            retiring: Default::default(),
            reissued_at: Default::default(),
            released_traffic: Default::default(),
            had_persistence: false,
            first_port_ipv6: cfg.ports.first().is_some_and(|p| !p.addresses6.is_empty()),
            serving_vips: cfg.vrrp.is_none(),
            vrrp_addresses: cfg
                .vrrp
                .as_ref()
                .map(|v| v.addresses.clone())
                .unwrap_or_default(),
        };
        services.note_departed_ids();
        Ok(services)
    }

    /// Whether this request is about services (handled here, not by the stats view).
    pub fn handles(req: &Request) -> bool {
        matches!(
            req,
            Request::ListServices
                | Request::ZeroService { .. }
                | Request::ZeroServices
                | Request::SaveServices
                | Request::ServiceRates { .. }
                | Request::AddService { .. }
                | Request::EditService { .. }
                | Request::DeleteService { .. }
                | Request::SetSynproxy { .. }
                | Request::SetSorryServer { .. }
                | Request::SetSloppyTcp { .. }
                | Request::SetMhTableSize { .. }
                | Request::AddServer { .. }
                | Request::EditServer { .. }
                | Request::DeleteServer { .. }
                | Request::Clear
                | Request::AddLaddr { .. }
                | Request::DelLaddr { .. }
                | Request::GetLaddr { .. }
                | Request::AclAdd { .. }
                | Request::AclDel { .. }
                | Request::AclClear { .. }
                | Request::AclList { .. }
                | Request::SetRateLimit { .. }
                | Request::SetTimeouts { .. }
                | Request::GetTimeouts
                | Request::Batch { .. }
                | Request::ApplyEach { .. }
                | Request::Events
        )
    }

    /// Applies one request. A change is validated by the table first (nothing changes
    /// on error) and then published to every worker as one new snapshot, so no worker
    /// ever sees half of it. A batch (`-R`, reload) is applied whole or not at all, and
    /// published as one snapshot.
    pub fn handle(
        &mut self,
        req: Request,
        publisher: &SnapshotPublisher,
        counters: &[Arc<Box<[RealServerCounters]>>],
    ) -> Result<serde_json::Value, String> {
        if let Request::Events = req {
            let report = EventsReport {
                events: self
                    .events
                    .iter()
                    .map(|(ms, line)| EventLine {
                        unix_ms: *ms,
                        line: line.clone(),
                    })
                    .collect(),
            };
            return serde_json::to_value(report).map_err(|e| e.to_string());
        }
        if let Request::Batch { requests, replace } = req {
            return self.batch(requests, replace, None, publisher, counters);
        }
        if let Request::ApplyEach { requests } = req {
            return self.apply_each(requests, publisher, counters);
        }
        let line = describe(&req);
        match self.apply(req, counters)? {
            Applied::Answer(v) => Ok(v),
            Applied::Changed => {
                if let Some(line) = line {
                    self.record(line);
                }
                self.publish(publisher)?;
                Ok(serde_json::json!({ "generation": self.generation }))
            }
        }
    }

    /// A batch, all or nothing, published as one snapshot. With `replace` the batch is
    /// first built on an empty table (so every command is checked before anything
    /// changes), then the live table is turned into it by the smallest set of changes
    /// ([`diff`]): real servers that stay keep their ids, counters and sessions.
    /// `preface`, an event line saying what the batch is (a reload), is recorded
    /// before the batch's own lines if it is applied, and not at all if it is refused.
    pub(crate) fn batch(
        &mut self,
        requests: Vec<Request>,
        replace: bool,
        preface: Option<String>,
        publisher: &SnapshotPublisher,
        counters: &[Arc<Box<[RealServerCounters]>>],
    ) -> Result<serde_json::Value, String> {
        let (saved_table, saved_timeouts) = (self.table.clone(), self.timeouts);
        let count = requests.len();
        let outcome = if replace {
            self.replace_with(requests, counters)
        } else {
            let lines = describe_all(&requests);
            self.apply_all(requests, counters).map(|()| (count, lines))
        };
        let (changes, lines) = match outcome {
            Ok(done) => done,
            Err(error) => {
                self.table = saved_table;
                self.timeouts = saved_timeouts;
                return Err(format!("{error} (nothing was changed)"));
            }
        };
        for line in preface.into_iter().chain(lines) {
            self.record(line);
        }
        if replace {
            self.record(format!(
                "lb=config op=batch-replace commands={count} changes={changes}"
            ));
        } else {
            self.record(format!("lb=config op=batch commands={count}"));
        }
        if changes > 0 || !replace {
            self.publish(publisher)?;
        }
        Ok(serde_json::json!({
            "generation": self.generation,
            "applied": count,
            "changes": changes,
        }))
    }

    /// `-R` as ipvsadm applies it, without a snapshot per line: each command applied
    /// on its own, in order, exactly as [`Services::handle`] would apply it alone (a
    /// refused one changes nothing and is answered with the same words), then one
    /// publish for all the changes. A restore of N lines with a refusal among them
    /// costs one snapshot, not N: each publish builds the workers' snapshot from the
    /// whole table, and every worker pauses to adopt it. Nothing is published when
    /// nothing changed (only `-Z` lines, or every line refused).
    ///
    /// A command that is itself a batch can only be a service's `-A` or `-E` with its
    /// `--synproxy`, which stands or falls whole ([`Services::apply_pair`]); any other
    /// batch is refused.
    pub(crate) fn apply_each(
        &mut self,
        requests: Vec<Request>,
        publisher: &SnapshotPublisher,
        counters: &[Arc<Box<[RealServerCounters]>>],
    ) -> Result<serde_json::Value, String> {
        let count = requests.len();
        let (mut applied, mut changed) = (0, 0);
        let mut refused = Vec::new();
        let mut lines = Vec::new();
        for (i, request) in requests.into_iter().enumerate() {
            let outcome = match request {
                Request::Batch {
                    requests,
                    replace: false,
                } if is_service_pair(&requests) => {
                    let n = requests.len();
                    let mut described = describe_all(&requests);
                    described.push(format!("lb=config op=batch commands={n}"));
                    self.apply_pair(requests, counters)
                        .map(|()| (described, true))
                }
                Request::Batch {
                    replace: false,
                    requests,
                } if !requests.iter().any(Request::is_batch) => Err(NOT_A_PAIR.to_string()),
                request if request.is_batch() => Err("batches do not nest".to_string()),
                request => {
                    let described = describe(&request);
                    match self.apply(request, counters) {
                        Ok(Applied::Changed) => Ok((described.into_iter().collect(), true)),
                        // `-Z` among the lines: done in its place, nothing to publish.
                        Ok(Applied::Answer(_)) => Ok((Vec::new(), false)),
                        Err(error) => Err(error),
                    }
                }
            };
            match outcome {
                Ok((described, change)) => {
                    applied += 1;
                    changed += usize::from(change);
                    if count <= BATCH_EVENT_LINES {
                        lines.extend(described);
                    }
                }
                Err(error) => refused.push(serde_json::json!({
                    "command": i + 1,
                    "error": error,
                })),
            }
        }
        if changed > 0 {
            for line in lines {
                self.record(line);
            }
            if count > BATCH_EVENT_LINES {
                self.record(format!(
                    "lb=config op=apply-each commands={count} applied={applied}"
                ));
            }
            self.publish(publisher)?;
        }
        Ok(serde_json::json!({
            "generation": self.generation,
            "applied": applied,
            "refused": refused,
        }))
    }

    /// A batch within [`Services::apply_each`] ([`is_service_pair`]: a service's
    /// `-A` or `-E` then its SYN proxy, as an ipvsadm line makes it), all or nothing:
    /// a refused proxy is undone by deleting the service just added or editing it
    /// back, O(1). (Other batches are refused there: undoing any batch would take a
    /// copy of the whole table, tens of milliseconds at 100,000 services, and one
    /// request line could hold thousands.)
    fn apply_pair(
        &mut self,
        requests: Vec<Request>,
        counters: &[Arc<Box<[RealServerCounters]>>],
    ) -> Result<(), String> {
        let undo = match requests.as_slice() {
            [Request::AddService { service, .. }, Request::SetSynproxy { .. }]
                if self.table.get(*service).is_none() =>
            {
                Some(Request::DeleteService { service: *service })
            }
            [Request::EditService { service, .. }, Request::SetSynproxy { .. }] => {
                self.table.get(*service).map(|s| Request::EditService {
                    service: *service,
                    scheduler: Some(s.scheduler),
                    persistence: s.persistence,
                    sched_flags: Some(s.sched_flags),
                })
            }
            _ => None,
        };
        let mut pair = requests.into_iter();
        let (Some(first), Some(second)) = (pair.next(), pair.next()) else {
            return Err(NOT_A_PAIR.to_string());
        };
        let refused_first = |e| format!("command 1 of 2: {e} (nothing was changed)");
        let Some(undo) = undo else {
            // An `-A` of a service that exists, an `-E` of one that does not: the
            // table refuses the first command, with the words it has alone.
            return match self.apply_change(first, counters) {
                Err(e) => Err(refused_first(e)),
                Ok(()) => unreachable!("the table holds, or lacks, the service named"),
            };
        };
        self.apply_change(first, counters).map_err(refused_first)?;
        let Err(error) = self.apply_change(second, counters) else {
            return Ok(());
        };
        match self.apply(undo, counters) {
            Ok(_) => Err(format!("command 2 of 2: {error} (nothing was changed)")),
            // Cannot happen: the undo puts back what was valid a moment ago. Said if
            // it does, rather than claiming nothing changed.
            Err(undo_error) => Err(format!(
                "command 2 of 2: {error}; undoing command 1 failed: {undo_error}"
            )),
        }
    }

    /// One command of a batch: a change, or the reason it is not applied.
    fn apply_change(
        &mut self,
        request: Request,
        counters: &[Arc<Box<[RealServerCounters]>>],
    ) -> Result<(), String> {
        if request.is_batch() {
            return Err("batches do not nest".to_string());
        }
        match self.apply(request, counters)? {
            Applied::Changed => Ok(()),
            Applied::Answer(_) => Err("not a change".to_string()),
        }
    }

    /// Applies `requests` in order; the first failure names its command and stops
    /// (the caller restores the table).
    fn apply_all(
        &mut self,
        requests: Vec<Request>,
        counters: &[Arc<Box<[RealServerCounters]>>],
    ) -> Result<(), String> {
        let count = requests.len();
        for (i, r) in requests.into_iter().enumerate() {
            self.apply_change(r, counters)
                .map_err(|error| format!("command {} of {count}: {error}", i + 1))?;
        }
        Ok(())
    }

    /// `-R --replace`: the table becomes what `requests` build from nothing. Returns
    /// the number of changes made and their event lines.
    fn replace_with(
        &mut self,
        requests: Vec<Request>,
        counters: &[Arc<Box<[RealServerCounters]>>],
    ) -> Result<(usize, Vec<String>), String> {
        // What the requests set themselves, which the carries below leave alone.
        let mut set_sloppy = hashbrown::HashSet::new();
        let mut set_sorry = hashbrown::HashSet::new();
        let mut set_size = hashbrown::HashSet::new();
        for request in &requests {
            match request {
                Request::SetSloppyTcp { service, .. } => set_sloppy.insert(*service),
                Request::SetSorryServer { service, .. } => set_sorry.insert(*service),
                Request::SetMhTableSize { service, .. } => set_size.insert(*service),
                _ => false,
            };
        }
        let scratch = self.table.empty_like();
        let live = std::mem::replace(&mut self.table, scratch);
        let built = self.apply_all(requests, counters);
        let mut desired = std::mem::replace(&mut self.table, live);
        built?;
        // TOA is a config-file setting that ipvsadm-save lines cannot carry: a service
        // that stays keeps it.
        for service in self.table.services().filter(|s| s.toa) {
            if desired.get(service.key).is_some() {
                desired
                    .set_toa(service.key, true)
                    .map_err(|e| e.to_string())?;
            }
        }
        // So are sloppy_tcp and the sorry server, unless the requests set them.
        for service in self.table.services().filter(|s| s.sloppy_tcp) {
            if desired.get(service.key).is_some() && !set_sloppy.contains(&service.key) {
                desired
                    .set_sloppy_tcp(service.key, true)
                    .map_err(|e| e.to_string())?;
            }
        }
        for service in self.table.services() {
            if let Some(sorry) = service.sorry_server {
                if desired.get(service.key).is_some() && !set_sorry.contains(&service.key) {
                    desired
                        .set_sorry_server(service.key, Some(sorry.spec()))
                        .map_err(|e| e.to_string())?;
                }
            }
        }
        // And the Maglev table size (the config file's `mh_table_size`), whatever the
        // scheduler the lines give: without it a replace would quietly take every
        // staying service back to the default size, moving its clients and parting
        // it from nodes that run the file's.
        for service in self.table.services() {
            let Some(wanted) = desired.get(service.key) else {
                continue;
            };
            if wanted.mh_table_size != service.mh_table_size && !set_size.contains(&service.key) {
                let flags = wanted.sched_flags;
                desired
                    .set_sched_params(service.key, flags, Some(service.mh_table_size))
                    .map_err(|e| {
                        format!(
                            "{e} (the table size is the running service's, which a restore \
                             keeps: `mh_table_size` in the config file and `sluicectl reload` \
                             change it)"
                        )
                    })?;
            }
        }
        let changes = diff(&self.table, &desired)?;
        let (count, lines) = (changes.len(), describe_all(&changes));
        self.apply_all(changes, counters)
            .map_err(|e| format!("replacing the table: {e}"))?;
        Ok((count, lines))
    }

    /// One request against the table, without publishing.
    fn apply(
        &mut self,
        req: Request,
        counters: &[Arc<Box<[RealServerCounters]>>],
    ) -> Result<Applied, String> {
        if let Some(report) = self.listing_report(&req, counters) {
            return serde_json::to_value(report)
                .map(Applied::Answer)
                .map_err(|e| e.to_string());
        }
        self.check_ipv6_neighbour_source(&req)?;
        let t = &mut self.table;
        let changed = match req {
            Request::AddService {
                service,
                scheduler,
                persistence,
                sched_flags,
            } => {
                let scheduler = scheduler.unwrap_or(DEFAULT_SCHEDULER);
                let flags = sched_flags.unwrap_or_default();
                // Checked before the service exists, so a bad flag adds nothing.
                flags.check_compatible(scheduler)?;
                t.add_service(service, scheduler, persistence)
                    .and_then(|_| t.set_sched_params(service, flags, None))
            }
            Request::EditService {
                service,
                scheduler,
                persistence,
                sched_flags,
            } => {
                let current = t.get(service).map(|s| (s.scheduler, s.sched_flags));
                let scheduler = scheduler
                    .or(current.map(|c| c.0))
                    .unwrap_or(DEFAULT_SCHEDULER);
                // Without -b the flags stay, unless the new scheduler cannot use them.
                let flags = sched_flags.unwrap_or_else(|| {
                    current
                        .map(|c| c.1)
                        .filter(|f| f.check_compatible(scheduler).is_ok())
                        .unwrap_or_default()
                });
                flags.check_compatible(scheduler)?;
                t.edit_service(service, scheduler, persistence)
                    .and_then(|()| t.set_sched_params(service, flags, None))
            }
            Request::DeleteService { service } => t.delete_service(service).map(drop),
            Request::SetSynproxy { service, synproxy } => t.set_synproxy(service, synproxy),
            Request::SetSloppyTcp { service, on } => t.set_sloppy_tcp(service, on),
            Request::SetMhTableSize { service, size } => {
                let flags = t.get(service).map(|s| s.sched_flags).unwrap_or_default();
                t.set_sched_params(service, flags, Some(size))
            }
            Request::SetSorryServer {
                service,
                sorry_server,
            } => t.set_sorry_server(service, sorry_server),
            Request::AddServer { service, server } => t.add_server(service, server).map(drop),
            Request::EditServer { service, server } => t.edit_server(service, server),
            Request::DeleteServer { service, ip, port } => {
                t.delete_server(service, ip, port).map(drop)
            }
            Request::Clear => {
                t.clear();
                Ok(())
            }
            Request::ZeroService { service } => {
                let s = self
                    .table
                    .get(service)
                    .ok_or_else(|| ServiceError::NoSuchService(service).to_string())?;
                // Everything the service's counters count.
                let service_id = s.id;
                for id in self.counted_ids(s) {
                    self.zeroed_at
                        .insert(id, Traffic::of(&RealServerTotals::sum(counters, id)));
                }
                if let Some((_, since_zero)) = self.released_traffic.get_mut(&service_id) {
                    *since_zero = Traffic::default();
                }
                return Ok(Applied::Answer(serde_json::json!({ "zeroed": true })));
            }
            Request::ZeroServices => {
                self.zero_all(counters);
                return Ok(Applied::Answer(serde_json::json!({ "zeroed": true })));
            }
            Request::AddLaddr { service, ip } => t.add_laddr(service, ip),
            Request::DelLaddr { service, ip } => t.del_laddr(service, ip),
            Request::AclAdd {
                service,
                action,
                prefixes,
            } => t.acl_add(service, action, &prefixes),
            Request::AclDel { service, prefixes } => t.acl_del(service, &prefixes),
            Request::AclClear { service } => t.acl_clear(service),
            Request::SetRateLimit { service, limit } => t.set_rate_limit(service, limit),
            Request::AclList { service, max } => {
                let report = self
                    .admission_report(service, max.map_or(usize::MAX, |m| m as usize))
                    .ok_or_else(|| ServiceError::NoSuchService(service).to_string())?;
                return serde_json::to_value(report)
                    .map(Applied::Answer)
                    .map_err(|e| e.to_string());
            }
            Request::GetTimeouts => {
                let (tcp, tcpfin, udp) = self.timeouts.get();
                let report = TimeoutsReport { tcp, tcpfin, udp };
                return serde_json::to_value(report)
                    .map(Applied::Answer)
                    .map_err(|e| e.to_string());
            }
            Request::SetTimeouts { tcp, tcpfin, udp } => {
                let mut next = self.timeouts;
                next.set_tcp_tcpfin_udp(tcp, tcpfin, udp)
                    .map_err(|e| e.to_string())?;
                self.timeouts = next;
                Ok(())
            }
            Request::GetLaddr { service } => {
                let report = LaddrReport {
                    service,
                    local_addresses: t.laddrs(service).map_err(|e| e.to_string())?.to_vec(),
                    // The workers' pools and the sizing are added by the management loop.
                    pools: Vec::new(),
                    sizing: None,
                };
                return serde_json::to_value(report)
                    .map(Applied::Answer)
                    .map_err(|e| e.to_string());
            }
            other => return Err(format!("{} is not a service command", other.command_name())),
        };
        changed.map_err(|e| e.to_string())?;
        Ok(Applied::Changed)
    }

    /// Publishes the table as the workers' next snapshot.
    pub fn publish(&mut self, publisher: &SnapshotPublisher) -> Result<(), String> {
        self.note_departed_ids();
        let generation = publisher.next_generation();
        let removed = self.table.take_removed_server_ids().into_iter();
        self.retiring.extend(removed.map(|id| Retiring {
            id,
            generation,
            quiet_since: None,
            quiet_checks: 0,
        }));
        self.had_persistence |= self.table.services().any(|s| s.persistence.is_some());
        let previous = publisher.current();
        let snapshot =
            Snapshot::build_reusing(generation, &self.table, &self.health, &[], Some(&previous));
        // A route of the previous snapshot's services that the table no longer has
        // departs now: taken from the snapshot, not from the last publish, so that
        // the first change after the start (whose snapshot `publish` did not build)
        // is no exception.
        let now = std::time::Instant::now();
        for route in snapshot.nat_routes_gone_since(&previous) {
            self.departed_nat.insert(route, now);
        }
        let keep = Duration::from_millis(u64::from(self.timeouts.longest_ms()));
        self.departed_nat
            .retain(|r, at| !snapshot.routes_nat(r) && now.duration_since(*at) <= keep);
        let snapshot = snapshot
            .with_departed_nat(self.departed_nat.keys().copied())
            .with_timeouts(self.timeouts)
            .with_serving_vips(self.serving_vips)
            .with_extra_addresses(&self.vrrp_addresses);
        // Stamped just before the swap: a worker may adopt before publish returns.
        let at = (std::time::Instant::now(), crate::dpdk::tsc());
        publisher.publish(snapshot).map_err(|e| e.to_string())?;
        self.table.admission_published();
        self.published_at = Some(at);
        self.generation = generation;
        self.alert_on_unavailable();
        Ok(())
    }

    /// Moves the ids that left a service since the last publish to its departed ones;
    /// a service that is gone takes its departed ids with it (added again, it has a
    /// new id and counts from zero, as in IPVS).
    fn note_departed_ids(&mut self) {
        let mut before = std::mem::take(&mut self.member_ids);
        let mut members = hashbrown::HashMap::with_capacity(self.table.len());
        let mut ids = Vec::new();
        for s in self.table.services() {
            let sorry = s.sorry_server.map(|r| r.id);
            ids.clear();
            ids.extend(s.real_servers.iter().map(|r| r.id).chain(sorry));
            // Sorted, so a service of thousands of real servers costs n log n here.
            ids.sort_unstable();
            // A service whose members did not change (nearly all, at a change) keeps
            // its vector: no allocation per service per publish.
            let kept = match before.remove(&s.id) {
                Some(old) if old == ids => old,
                Some(mut old) => {
                    let gone = old.iter().filter(|id| ids.binary_search(id).is_err());
                    self.departed_ids.entry(s.id).or_default().extend(gone);
                    old.clone_from(&ids);
                    old
                }
                None => ids.clone(),
            };
            members.insert(s.id, kept);
        }
        self.departed_ids.retain(|k, _| members.contains_key(k));
        self.released_traffic.retain(|k, _| members.contains_key(k));
        self.member_ids = members;
    }

    /// The real-server ids service `s`'s counters count, each once: its real servers,
    /// its sorry server, and those it had at the last publish or lost before.
    fn counted_ids(&self, s: &crate::model::Service) -> Vec<u32> {
        let sorry = s.sorry_server.map(|r| r.id);
        let earlier = [self.member_ids.get(&s.id), self.departed_ids.get(&s.id)];
        let mut ids: Vec<u32> = (s.real_servers.iter().map(|r| r.id).chain(sorry))
            .chain(earlier.into_iter().flatten().flatten().copied())
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// How many real-server ids are held, and by what (`sluicectl status`).
    pub fn id_report(&self) -> crate::control::report::RealServerIdsReport {
        let in_use = self
            .table
            .services()
            .map(|s| s.real_servers.len() as u64 + u64::from(s.sorry_server.is_some()));
        crate::control::report::RealServerIdsReport {
            in_use: in_use.sum(),
            waiting: self.table.unreleased_server_ids() as u64,
            limit: MAX_REAL_SERVER_IDS as u64 - 1,
        }
    }

    /// Releases to the table the ids of removed servers nothing refers to any more
    /// ([`Retiring`]), given the workers' counters, the oldest snapshot generation a
    /// worker holds, and `templates_naming`, which returns those of the ids it is given
    /// that a live persistence template names (a scan of the templates, made only when
    /// some id is otherwise ready). Called once a second on the management core: each
    /// check reads one counter line per waiting id and worker. A released id's traffic
    /// stays in its former service's counters; its next holder's counts start from
    /// zero. Returns how many were released.
    pub fn release_server_ids(
        &mut self,
        counters: &[Arc<Box<[RealServerCounters]>>],
        adopted: u64,
        now: Instant,
        templates_naming: impl FnOnce(&std::collections::HashSet<u32>) -> std::collections::HashSet<u32>,
    ) -> usize {
        let mut ready = std::collections::HashSet::new();
        for r in self.retiring.iter_mut() {
            // In publish order: the rest are newer still.
            if r.generation > adopted {
                break;
            }
            let counted = counters.iter().any(|table| {
                table.get(r.id as usize).is_some_and(|c| {
                    c.active.load(std::sync::atomic::Ordering::Relaxed) != 0
                        || c.inactive.load(std::sync::atomic::Ordering::Relaxed) != 0
                })
            });
            if counted {
                r.quiet_since = None;
                r.quiet_checks = 0;
                continue;
            }
            let quiet_since = *r.quiet_since.get_or_insert(now);
            r.quiet_checks += 1;
            if r.quiet_checks >= QUIET_CHECKS && now.duration_since(quiet_since) >= QUIET_FOR {
                ready.insert(r.id);
            }
        }
        if ready.is_empty() {
            return 0;
        }
        if self.had_persistence {
            for named in templates_naming(&ready) {
                ready.remove(&named);
            }
        }
        let released = ready;
        if released.is_empty() {
            return 0;
        }
        self.retiring.retain(|r| !released.contains(&r.id));
        for (service_id, ids) in self.departed_ids.iter_mut() {
            let (gone, kept): (Vec<u32>, Vec<u32>) =
                ids.iter().partition(|id| released.contains(id));
            if gone.is_empty() {
                continue;
            }
            *ids = kept;
            let (raw, since_zero) = self.released_traffic.entry(*service_id).or_default();
            for id in gone {
                raw.add(&raw_since_reissue(&self.reissued_at, counters, id));
                since_zero.add(&Traffic::of(&totals_since_zero(
                    &self.zeroed_at,
                    counters,
                    id,
                )));
            }
        }
        for &id in &released {
            // The next holder's counts start here, in listings (as after a `-Z`) and
            // in its service's rates.
            let now_counts = Traffic::of(&RealServerTotals::sum(counters, id));
            self.zeroed_at.insert(id, now_counts);
            self.reissued_at.insert(id, now_counts);
            self.evictions.remove(&id);
            self.health.evicted.remove(&id);
            let ok = self.table.release_server_id(id);
            debug_assert!(ok, "real-server id {id} released twice");
        }
        released.len()
    }

    /// One sample of every real server's and every service's own counters, once a
    /// second, for the rates `-L --rate` shows.
    pub fn sample_rates(&mut self, counters: &[Arc<Box<[RealServerCounters]>>], now: Instant) {
        self.rates.sample(&self.table, counters, now);
        let services: Vec<(u32, [u64; 5])> = (self.table.services())
            .map(|s| {
                let c = self.service_counts(s, counters, false);
                let values = [
                    c.connections,
                    c.in_packets,
                    c.out_packets,
                    c.in_bytes,
                    c.out_bytes,
                ];
                (s.id, values)
            })
            .collect();
        self.rates.sample_services(services.into_iter(), now);
    }

    /// Refuses an IPv6 real server or sorry server when the first port has no IPv6
    /// address, as a config with one is refused: its MAC would never be resolved and
    /// every packet to it would be dropped (`neighbour_unresolved`).
    fn check_ipv6_neighbour_source(&self, req: &Request) -> Result<(), String> {
        let (ip, port, what) = match req {
            Request::AddServer { server, .. } | Request::EditServer { server, .. } => {
                (server.ip, server.port, "real server")
            }
            Request::SetSorryServer {
                sorry_server: Some(s),
                ..
            } => (s.ip, s.port, "sorry server"),
            _ => return Ok(()),
        };
        if !ip.is_ipv6() || self.first_port_ipv6 {
            return Ok(());
        }
        Err(format!(
            "{what} {} is IPv6, but the first port has no IPv6 address: Sluice finds its \
             MAC by Neighbor Discovery from that port's IPv6 address; add one to the first \
             port's addresses (a restart)",
            std::net::SocketAddr::new(ip, port)
        ))
    }

    /// Zeroes every real server's traffic counts and every service's admission
    /// counts (`-Z`, `sluicectl zero`).
    pub fn zero_all(&mut self, counters: &[Arc<Box<[RealServerCounters]>>]) {
        let ids: Vec<u32> = (self.table.services())
            .flat_map(|s| self.counted_ids(s))
            .collect();
        for id in ids {
            self.zeroed_at
                .insert(id, Traffic::of(&RealServerTotals::sum(counters, id)));
        }
        for (_, since_zero) in self.released_traffic.values_mut() {
            *since_zero = Traffic::default();
        }
        self.table.zero_admission_counts();
    }

    /// Real server `id`'s counters summed over the workers, its traffic counted since
    /// it was last zeroed.
    fn totals(&self, counters: &[Arc<Box<[RealServerCounters]>>], id: u32) -> RealServerTotals {
        totals_since_zero(&self.zeroed_at, counters, id)
    }

    /// Service `s`'s counters ([`Services::counted_ids`]), summed over the workers:
    /// since the last zero (`since_zero`), or as the workers count them (for rates).
    fn service_counts(
        &self,
        s: &crate::model::Service,
        counters: &[Arc<Box<[RealServerCounters]>>],
        since_zero: bool,
    ) -> ServiceCounts {
        let released = self.released_traffic.get(&s.id);
        let mut c = released.map_or_else(Traffic::default, |(raw, since)| match since_zero {
            true => *since,
            false => *raw,
        });
        for id in self.counted_ids(s) {
            c.add(&match since_zero {
                true => Traffic::of(&self.totals(counters, id)),
                false => raw_since_reissue(&self.reissued_at, counters, id),
            });
        }
        ServiceCounts {
            connections: c.connections,
            in_packets: c.in_packets,
            out_packets: c.out_packets,
            in_bytes: c.in_bytes,
            out_bytes: c.out_bytes,
        }
    }

    /// Seed 004: when every real server of a service weighs 0 (or there is none), new
    /// connections to it are dropped; say so once when it happens and once when it
    /// ends, not on every packet.
    pub fn alert_on_unavailable(&mut self) {
        let now: Vec<ServiceKey> = self
            .table
            .services()
            .filter(|s| !self.has_available_server(s))
            .map(|s| s.key)
            .collect();
        // Sets, so that a table of 100k services without real servers costs O(n).
        let now_set: std::collections::HashSet<&ServiceKey> = now.iter().collect();
        let before: std::collections::HashSet<&ServiceKey> = self.unavailable.iter().collect();
        let mut pending = Vec::new();
        let mut unlisted = 0usize;
        for key in now.iter().filter(|k| !before.contains(k)) {
            self.alerts += 1;
            if pending.len() >= ALERT_LINES {
                unlisted += 1;
                continue;
            }
            let has_sorry = self
                .table
                .get(*key)
                .is_some_and(|s| s.sorry_server.is_some());
            let fate = if has_sorry {
                "the sorry server takes new connections"
            } else if self.health.reset_when_down.contains(key) {
                "new TCP connections get an RST"
            } else {
                "new connections are dropped"
            };
            pending.push(format!(
                "lb=alert svc={} reason=no-available-rs (every real server is evicted or has weight 0, or none is left): {fate}",
                svc(key)
            ));
        }
        if unlisted > 0 {
            pending.push(format!(
                "lb=alert services={unlisted} reason=no-available-rs (and as many more services without an available real server; sluicectl -L -n lists them)"
            ));
        }
        let mut cleared = 0usize;
        for key in self.unavailable.iter().filter(|k| !now_set.contains(k)) {
            if self.table.get(*key).is_some() {
                cleared += 1;
                if cleared <= ALERT_LINES {
                    pending.push(format!(
                        "lb=alert-clear svc={} reason=rs-available",
                        svc(key)
                    ));
                }
            }
        }
        if cleared > ALERT_LINES {
            pending.push(format!(
                "lb=alert-clear services={} reason=rs-available (and as many more services)",
                cleared - ALERT_LINES
            ));
        }
        self.unavailable = now;
        for line in pending {
            self.record(line);
        }
    }

    /// The addresses VRRP moves between nodes: every VIP and FullNAT local address
    /// (and `[vrrp] addresses`), by family, sorted, each once.
    pub fn virtual_addresses(&self) -> crate::ha::vrrp::node::VirtualAddresses {
        let mut v4: Vec<Ipv4Addr> = self
            .table
            .services()
            .flat_map(|s| s.key.vip4().into_iter().chain(s.local_addresses4()))
            .chain(self.vrrp_addresses.iter().copied())
            .collect();
        v4.sort_unstable();
        v4.dedup();
        let mut v6: Vec<std::net::Ipv6Addr> = self
            .table
            .services()
            .flat_map(|s| {
                let vip = match s.key.vip {
                    std::net::IpAddr::V6(a) => Some(a),
                    std::net::IpAddr::V4(_) => None,
                };
                vip.into_iter().chain(s.local_addresses6())
            })
            .collect();
        v6.sort_unstable();
        v6.dedup();
        crate::ha::vrrp::node::VirtualAddresses { v4, v6 }
    }

    /// Whether some real server of `s` can take a new connection: weight above 0 and
    /// not evicted.
    pub fn has_available_server(&self, s: &crate::model::Service) -> bool {
        s.real_servers
            .iter()
            .any(|r| r.accepts_new() && !self.health.evicted.contains(&r.id))
    }

    /// Logs an event line and keeps it for `sluicectl events`.
    pub fn record(&mut self, line: String) {
        if line.starts_with("lb=alert ") {
            log::warn!("{line}");
        } else {
            log::info!("{line}");
        }
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        if self.events.len() == EVENTS_KEPT {
            self.events.pop_front();
        }
        self.events.push_back((ms, line));
    }

    /// `--acl-list`: service `key`'s access list (its first `max_rules` rules, with
    /// their hits summed over workers), default, rate limit and counts; `None` when
    /// there is no such service.
    pub fn admission_report(&self, key: ServiceKey, max_rules: usize) -> Option<AdmissionReport> {
        let service = self.table.get(key)?;
        let Some(rules) = self.table.admission(key) else {
            return Some(AdmissionReport::empty(key));
        };
        let compiled = rules.compiled(service.id);
        let (listed, total, denies_unmatched) = match &compiled.acl {
            Some(acl) => (
                acl.rules()
                    .iter()
                    .take(max_rules)
                    .enumerate()
                    .map(|(i, r)| AclRuleStatus {
                        prefix: r.prefix,
                        action: r.action,
                        hits: acl.hits(i),
                    })
                    .collect(),
                acl.len(),
                acl.denies_unmatched(),
            ),
            None => (Vec::new(), 0, false),
        };
        Some(AdmissionReport {
            service: key,
            rules_total: total,
            unmatched: if denies_unmatched {
                crate::service::AclAction::Deny
            } else {
                crate::service::AclAction::Allow
            },
            rules: listed,
            rate_limit: rules.rate_limit(),
            workers: compiled.workers,
            totals: rules.totals(),
        })
    }

    /// The admission report of every service that has rules, without the rules (for
    /// the metrics).
    pub fn admission_reports(&self) -> Vec<AdmissionReport> {
        self.table
            .services()
            .filter(|s| self.table.admission(s.key).is_some())
            .filter_map(|s| self.admission_report(s.key, 0))
            .collect()
    }

    /// A service's access list and rate limit in the listing, with the access-list
    /// rules themselves when `with_rules` (`-S`); `None` when it never had either.
    fn service_admission(&self, key: ServiceKey, with_rules: bool) -> Option<ServiceAdmission> {
        use crate::service::AclAction;
        let rules = self.table.admission(key)?;
        let (mut allow, mut deny) = (Vec::new(), Vec::new());
        let (mut allow_rules, mut deny_rules) = (0, 0);
        for (prefix, action) in rules.acl() {
            let (count, list) = match action {
                AclAction::Allow => (&mut allow_rules, &mut allow),
                AclAction::Deny => (&mut deny_rules, &mut deny),
            };
            *count += 1;
            if with_rules {
                list.push(*prefix);
            }
        }
        Some(ServiceAdmission {
            allow_rules,
            deny_rules,
            unmatched: if allow_rules > 0 {
                AclAction::Deny
            } else {
                AclAction::Allow
            },
            rate_limit: rules.rate_limit(),
            workers: rules.workers(),
            totals: rules.totals(),
            allow,
            deny,
        })
    }

    /// The report a listing request answers with (`-L` in all its forms, `skew` with
    /// its window, `-S`); `None` for any other request. Turning it into JSON is the
    /// caller's: the daemon has the control socket's executor thread do it, off the
    /// management loop.
    pub fn listing_report(
        &self,
        req: &Request,
        counters: &[Arc<Box<[RealServerCounters]>>],
    ) -> Option<ServicesReport> {
        match *req {
            Request::ListServices => Some(self.report(counters, super::rates::DEFAULT_WINDOW)),
            Request::ServiceRates { window_s } => {
                let window = match window_s {
                    Some(s) => {
                        Duration::from_secs(u64::from(s.clamp(1, super::rates::MAX_WINDOW_S)))
                    }
                    None => super::rates::DEFAULT_WINDOW,
                };
                Some(self.report(counters, window))
            }
            Request::SaveServices => Some(self.save_report(counters)),
            _ => None,
        }
    }

    /// `-S`: the listing with every service's access-list rules.
    pub fn save_report(&self, counters: &[Arc<Box<[RealServerCounters]>>]) -> ServicesReport {
        self.listing(counters, super::rates::DEFAULT_WINDOW, true)
    }

    /// The listing for `sluicectl -L`, with counters summed over workers.
    pub fn report(
        &self,
        counters: &[Arc<Box<[RealServerCounters]>>],
        window: Duration,
    ) -> ServicesReport {
        self.listing(counters, window, false)
    }

    /// One real server's line of the listing.
    fn rs_status(
        &self,
        r: &crate::model::RealServer,
        counters: &[Arc<Box<[RealServerCounters]>>],
        window: Duration,
    ) -> RealServerStatus {
        let t = self.totals(counters, r.id);
        let rate = self.rates.rate(r.id, window);
        RealServerStatus {
            ip: r.ip.to_string(),
            port: r.port,
            weight: r.weight,
            mode: r.mode.name().into(),
            active: t.active,
            inactive: t.inactive,
            connections: t.connections,
            in_packets: t.in_packets,
            out_packets: t.out_packets,
            in_bytes: t.in_bytes,
            out_bytes: t.out_bytes,
            upper: r.upper,
            lower: r.lower,
            cps: rate.cps.round() as u64,
            in_pps: rate.in_pps.round() as u64,
            out_pps: rate.out_pps.round() as u64,
            in_bps: rate.in_bps.round() as u64,
            out_bps: rate.out_bps.round() as u64,
            evicted: self.health.evicted.contains(&r.id),
            evictions: self.evictions.get(&r.id).copied().unwrap_or(0),
            overloaded: t.overloaded,
            sorry: false,
            inhibit: false,
        }
    }

    fn listing(
        &self,
        counters: &[Arc<Box<[RealServerCounters]>>],
        window: Duration,
        with_rules: bool,
    ) -> ServicesReport {
        ServicesReport {
            services: self
                .table
                .services()
                .map(|s| {
                    let sorry = s.sorry_server.map(|sorry| {
                        let in_use = !self.has_available_server(s);
                        RealServerStatus {
                            sorry: true,
                            inhibit: sorry.inhibit,
                            ..self.rs_status(&sorry.as_real_server(in_use), counters, window)
                        }
                    });
                    ServiceStatus {
                        proto: s.key.proto.name().to_lowercase(),
                        vip: s.key.vip.to_string(),
                        port: s.key.port,
                        scheduler: s.scheduler.name().into(),
                        persistence_s: s.persistence.map(|p| p.timeout_s),
                        // An IPv6 service's is its prefix length, as ipvsadm prints it.
                        persistence_netmask: s.persistence.map(|p| match s.key.vip {
                            std::net::IpAddr::V6(_) => p.prefix6.to_string(),
                            std::net::IpAddr::V4(_) => p.netmask.to_string(),
                        }),
                        sched_flags: s.sched_flags.to_string(),
                        real_servers: {
                            let mut list: Vec<RealServerStatus> = s
                                .real_servers
                                .iter()
                                .map(|r| self.rs_status(r, counters, window))
                                .collect();
                            // As keepalived keeps IPVS: the sorry server is a real server
                            // while in use, or always (at weight 0) with inhibit. Not in
                            // `-S`: restored, it would become a real server.
                            if let Some(sorry) = &sorry {
                                if !with_rules && (sorry.weight > 0 || sorry.inhibit) {
                                    list.push(sorry.clone());
                                }
                            }
                            list
                        },
                        sorry_in_use: sorry.as_ref().is_some_and(|r| r.weight > 0),
                        sorry_server: sorry,
                        available: self.has_available_server(s),
                        local_addresses: s.local_addresses.iter().map(|a| a.to_string()).collect(),
                        toa: s.toa,
                        sloppy_tcp: s.sloppy_tcp,
                        synproxy: s.synproxy,
                        admission: self.service_admission(s.key, with_rules),
                        stats: Some(self.service_counts(s, counters, true)),
                        rates: Some({
                            let r = self.rates.service_rate(s.id, window);
                            ServiceRates {
                                cps: r.cps.round() as u64,
                                in_pps: r.in_pps.round() as u64,
                                out_pps: r.out_pps.round() as u64,
                                in_bps: r.in_bps.round() as u64,
                                out_bps: r.out_bps.round() as u64,
                            }
                        }),
                    }
                })
                .collect(),
        }
    }
}

/// Why [`Services::apply_each`] refuses a batch other than [`is_service_pair`].
const NOT_A_PAIR: &str = "a batch within apply_each can only be a service's add_service or \
     edit_service then its set_synproxy; send other batches as batches of their own";

/// Whether `requests` is the one batch an ipvsadm line makes: a service's `-A` or
/// `-E`, then the same service's `--synproxy`.
fn is_service_pair(requests: &[Request]) -> bool {
    match requests {
        [Request::AddService { service, .. } | Request::EditService { service, .. }, Request::SetSynproxy {
            service: proxied, ..
        }] => service == proxied,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Protocol;
    use crate::model::{ForwardMode, ServiceKey};
    use serde_json::json;
    use std::path::Path;

    const CONFIG: &str = r#"[lcores]
management = 0
workers = [1]

[[ports]]
name = "lan0"
vdev = "net_null0"
addresses = ["198.18.0.1/24"]

[[services]]
proto = "tcp"
vip = "198.18.1.1"
port = 80
local_addresses = ["198.18.0.50", "198.18.0.51"]
toa = true

  [[services.real_servers]]
  ip = "10.0.0.11"
  port = 8080
  mode = "fullnat"

[[services]]
proto = "udp"
vip = "198.18.1.1"
port = 53
"#;

    fn http() -> ServiceKey {
        ServiceKey::new(Protocol::Tcp, Ipv4Addr::new(198, 18, 1, 1), 80)
    }

    fn dns() -> ServiceKey {
        ServiceKey::new(Protocol::Udp, Ipv4Addr::new(198, 18, 1, 1), 53)
    }

    fn lip(last: u8) -> Ipv4Addr {
        Ipv4Addr::new(198, 18, 0, last)
    }

    fn setup() -> (Services, SnapshotPublisher) {
        setup_from(CONFIG)
    }

    /// The services of config `text` and the start's snapshot, built from the config
    /// as the daemon's start builds it (not by `publish`).
    fn setup_from(text: &str) -> (Services, SnapshotPublisher) {
        let cfg = Config::parse(text, Path::new("test.toml")).unwrap();
        let mut services = Services::from_config(&cfg).unwrap();
        let publisher = SnapshotPublisher::new(Snapshot::build(1, &services.table));
        services.generation = 1;
        (services, publisher)
    }

    /// The services whose NAT real server `rip:8080` the published snapshot routes
    /// replies for.
    fn routed(publisher: &SnapshotPublisher, rip: Ipv4Addr) -> Vec<(std::net::IpAddr, u16)> {
        (publisher.current())
            .nat_reply_services(Protocol::Tcp, rip, 8080)
            .to_vec()
    }

    /// `-d` of `rip:8080` from the http service.
    fn delete_server(rip: Ipv4Addr) -> Request {
        Request::DeleteServer {
            service: http(),
            ip: rip.into(),
            port: 8080,
        }
    }

    /// `-R` lines as the requests sluicectl sends for them.
    fn parse_lines(text: &str) -> Vec<Request> {
        text.lines()
            .map(|l| {
                let args: Vec<String> = l.split_whitespace().map(String::from).collect();
                crate::control::ipvsadm::parse(&args).unwrap().request
            })
            .collect()
    }

    /// `-R --replace` of `requests`.
    fn replace(requests: Vec<Request>) -> Request {
        Request::Batch {
            requests,
            replace: true,
        }
    }

    fn call(
        services: &mut Services,
        publisher: &SnapshotPublisher,
        req: Request,
    ) -> Result<serde_json::Value, String> {
        services.handle(req, publisher, &[])
    }

    #[test]
    fn a_removed_nat_server_keeps_routing_its_replies_to_their_owner() {
        let (mut services, publisher) = setup();
        let rip = Ipv4Addr::new(10, 0, 0, 12);
        let server = RealServerSpec::new(rip, 8080, 1, crate::model::ForwardMode::Nat);
        call(
            &mut services,
            &publisher,
            Request::AddServer {
                service: http(),
                server,
            },
        )
        .unwrap();
        assert_eq!(routed(&publisher, rip), vec![(http().vip, 80)]);
        call(&mut services, &publisher, delete_server(rip)).unwrap();
        // Gone from the service, still known for its sessions' replies.
        assert!(publisher
            .current()
            .find(&http())
            .unwrap()
            .server(rip, 8080)
            .is_none());
        assert_eq!(routed(&publisher, rip), vec![(http().vip, 80)]);
        // Sessions outlive their last packet by the longest timeout at most: then the
        // route goes.
        services.departed_nat.values_mut().for_each(|at| {
            *at -= Duration::from_millis(u64::from(services.timeouts.longest_ms()) + 1000)
        });
        call(&mut services, &publisher, Request::Clear).unwrap();
        assert!(routed(&publisher, rip).is_empty());
    }

    /// The start's snapshot is built from the config, not published by `publish`: a
    /// NAT real server of the config removed by the first change after the start
    /// still has its replies routed, as one removed by any later change.
    #[test]
    fn a_nat_server_removed_by_the_first_change_keeps_routing_its_replies() {
        let (mut services, publisher) =
            setup_from(&CONFIG.replace(r#"mode = "fullnat""#, r#"mode = "nat""#));
        let rip = Ipv4Addr::new(10, 0, 0, 11);
        assert_eq!(routed(&publisher, rip), vec![(http().vip, 80)]);
        call(&mut services, &publisher, delete_server(rip)).unwrap();
        assert!(publisher
            .current()
            .find(&http())
            .unwrap()
            .real_servers
            .is_empty());
        assert_eq!(routed(&publisher, rip), vec![(http().vip, 80)]);
        let departed_at = services.departed_nat.values().copied().collect::<Vec<_>>();
        assert_eq!(departed_at.len(), 1);
        // A NAT sorry server departs the same way when it goes; a change meanwhile
        // keeps the route departed earlier, with when it departed.
        let sorry = Ipv4Addr::new(10, 0, 0, 99);
        let set_sorry = |sorry_server| Request::SetSorryServer {
            service: http(),
            sorry_server,
        };
        let spec = crate::model::SorryServerSpec {
            ip: sorry.into(),
            port: 8080,
            mode: crate::model::ForwardMode::Nat,
            inhibit: false,
        };
        call(&mut services, &publisher, set_sorry(Some(spec))).unwrap();
        call(&mut services, &publisher, set_sorry(None)).unwrap();
        let current = publisher.current();
        assert_eq!(
            current.nat_reply_services(Protocol::Tcp, sorry, 8080),
            [(http().vip, 80)]
        );
        assert_eq!(routed(&publisher, rip), vec![(http().vip, 80)]);
        assert_eq!(services.departed_nat.len(), 2);
        let first = services.departed_nat.iter().find(|(r, _)| r.real_ip == rip);
        assert_eq!(first.map(|(_, at)| *at), Some(departed_at[0]));
    }

    /// A service's counters never go backwards while it exists: a removed real
    /// server's counts stay in them (its sessions may still be counting), as does the
    /// sorry server's when it is not listed; `-Z` of the service zeroes those too;
    /// deleted and added again, the service counts from zero.
    #[test]
    fn service_counters_keep_removed_real_servers_and_the_sorry_server() {
        let (mut services, publisher) = setup();
        let counters = vec![Arc::new(crate::dataplane::realserver_stats::new_table())];
        let server = |last: u8| {
            RealServerSpec::new(Ipv4Addr::new(10, 0, 0, last), 8080, 1, ForwardMode::FullNat)
        };
        let handle = |services: &mut Services, req: Request| {
            services.handle(req, &publisher, &counters).unwrap();
        };
        handle(
            &mut services,
            Request::AddServer {
                service: http(),
                server: server(12),
            },
        );
        let sorry = crate::model::SorryServerSpec {
            ip: Ipv4Addr::new(10, 0, 0, 99).into(),
            port: 8080,
            mode: ForwardMode::FullNat,
            inhibit: false,
        };
        handle(
            &mut services,
            Request::SetSorryServer {
                service: http(),
                sorry_server: Some(sorry),
            },
        );
        let s = services.table.get(http()).unwrap();
        let ids: Vec<u32> = s.real_servers.iter().map(|r| r.id).collect();
        let sorry_id = s.sorry_server.unwrap().id;
        // 10.0.0.11: 1 connection, 10.0.0.12: 2, the sorry server 4; each as many
        // packets times 10 and bytes times 1000.
        for (id, n) in ids.iter().copied().chain([sorry_id]).zip([1u64, 2, 4]) {
            let c = &counters[0][id as usize];
            use std::sync::atomic::Ordering::Relaxed;
            c.connections.store(n, Relaxed);
            c.in_packets.store(10 * n, Relaxed);
            c.out_packets.store(10 * n, Relaxed);
            c.in_bytes.store(1000 * n, Relaxed);
            c.out_bytes.store(1000 * n, Relaxed);
        }
        let own = |services: &Services| {
            let report = services.report(&counters, super::super::rates::DEFAULT_WINDOW);
            let s = report.services.into_iter().find(|s| s.port == 80).unwrap();
            (s.stats.unwrap(), s.real_servers.len())
        };
        let all = ServiceCounts {
            connections: 7,
            in_packets: 70,
            out_packets: 70,
            in_bytes: 7000,
            out_bytes: 7000,
        };
        // The sorry server is not listed (not in use) and still counts.
        assert_eq!(own(&services), (all, 2));
        handle(
            &mut services,
            Request::DeleteServer {
                service: http(),
                ip: Ipv4Addr::new(10, 0, 0, 12).into(),
                port: 8080,
            },
        );
        assert_eq!(own(&services), (all, 1), "10.0.0.12 removed");
        // Its sessions go on counting, on the service.
        counters[0][ids[1] as usize]
            .connections
            .store(3, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(own(&services).0.connections, 8);
        // The other service is another service's business.
        let report = services.report(&counters, super::super::rates::DEFAULT_WINDOW);
        let udp = report.services.iter().find(|s| s.port == 53).unwrap();
        assert_eq!(udp.stats, Some(ServiceCounts::default()));
        handle(&mut services, Request::ZeroService { service: http() });
        assert_eq!(own(&services).0, ServiceCounts::default());
        // 5 more since the zero (the workers' counter goes on from 3).
        counters[0][ids[1] as usize]
            .connections
            .store(8, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(own(&services).0.connections, 5);
        // Deleted and added again: a new service, counting from zero.
        handle(&mut services, Request::DeleteService { service: http() });
        handle(
            &mut services,
            Request::AddService {
                service: http(),
                scheduler: None,
                persistence: None,
                sched_flags: None,
            },
        );
        assert_eq!(own(&services), (ServiceCounts::default(), 0));
        // The same within one batch (one publish): still a new service.
        handle(
            &mut services,
            Request::AddServer {
                service: http(),
                server: server(13),
            },
        );
        let id = services.table.get(http()).unwrap().real_servers[0].id;
        counters[0][id as usize]
            .connections
            .store(9, std::sync::atomic::Ordering::Relaxed);
        assert_eq!(own(&services).0.connections, 9);
        let add = Request::AddService {
            service: http(),
            scheduler: None,
            persistence: None,
            sched_flags: None,
        };
        handle(
            &mut services,
            Request::Batch {
                requests: vec![Request::DeleteService { service: http() }, add],
                replace: false,
            },
        );
        assert_eq!(own(&services), (ServiceCounts::default(), 0));
    }

    /// A removed real server's id is handed out again only once every worker has
    /// adopted a snapshot without it, no worker has counted a session on it for
    /// [`QUIET_FOR`], and no live template names it; its traffic stays in its former
    /// service's counters and rates, and its next holder starts from zero.
    #[test]
    fn a_removed_servers_id_is_released_once_nothing_refers_to_it() {
        use std::collections::HashSet;
        use std::sync::atomic::Ordering::Relaxed;
        let (mut services, publisher) = setup();
        let counters: Vec<_> = (0..2)
            .map(|_| Arc::new(crate::dataplane::realserver_stats::new_table()))
            .collect();
        // 10.0.0.11 holds id 1; only id 2 is left.
        services.table.set_server_id_limit(3);
        let server = |last: u8| {
            RealServerSpec::new(Ipv4Addr::new(10, 0, 0, last), 8080, 1, ForwardMode::FullNat)
        };
        let add = |last: u8| Request::AddServer {
            service: http(),
            server: server(last),
        };
        services.handle(add(12), &publisher, &counters).unwrap();
        let id = services.table.get(http()).unwrap().real_servers[1].id;
        assert_eq!(id, 2);
        let refused = services.handle(add(13), &publisher, &counters).unwrap_err();
        assert!(
            refused.contains("too many real servers: at most 2"),
            "{refused}"
        );
        // 10.0.0.12's traffic: 5 connections, one session still open on worker 1.
        counters[0][id as usize].connections.store(3, Relaxed);
        counters[1][id as usize].connections.store(2, Relaxed);
        counters[1][id as usize].inactive.store(1, Relaxed);
        let counts = |services: &Services| {
            let report = services.report(&counters, super::super::rates::DEFAULT_WINDOW);
            let s = report.services.into_iter().find(|s| s.port == 80).unwrap();
            let listed = s.real_servers.iter().map(|r| r.connections).collect();
            let service = services.table.get(http()).unwrap();
            let raw = services.service_counts(service, &counters, false);
            (s.stats.unwrap().connections, raw.connections, listed)
        };
        assert_eq!(counts(&services), (5, 5, vec![0, 5]));
        let delete = Request::DeleteServer {
            service: http(),
            ip: Ipv4Addr::new(10, 0, 0, 12).into(),
            port: 8080,
        };
        services.handle(delete, &publisher, &counters).unwrap();
        let gone = services.generation;
        let ids = |services: &Services| {
            let r = services.id_report();
            (r.in_use, r.waiting)
        };
        assert_eq!(ids(&services), (1, 1));
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        // No service has had persistence: no template to look for.
        let no_template = |_: &HashSet<u32>| -> HashSet<u32> { unreachable!("templates") };
        let release = |services: &mut Services, adopted: u64, now: Instant| {
            services.release_server_ids(&counters, adopted, now, no_template)
        };
        // A worker still holds the snapshot with it.
        assert_eq!(release(&mut services, gone - 1, at(0)), 0);
        // Adopted, but a session is still counted on it.
        assert_eq!(release(&mut services, gone, at(0)), 0);
        assert!(services.handle(add(13), &publisher, &counters).is_err());
        counters[1][id as usize].inactive.store(0, Relaxed);
        // Quiet from 1 s on, until a reading at 2 s sees a session (one moving
        // between the gauges reads as none for an instant): quiet again from 3 s.
        assert_eq!(release(&mut services, gone, at(1)), 0);
        counters[0][id as usize].active.store(1, Relaxed);
        assert_eq!(release(&mut services, gone, at(2)), 0);
        counters[0][id as usize].active.store(0, Relaxed);
        assert_eq!(release(&mut services, gone, at(3)), 0);
        // Two quiet checks 5 s apart (a stalled loop): not enough.
        assert_eq!(release(&mut services, gone, at(8)), 0);
        // With persistence somewhere, a live template may still name it.
        services.had_persistence = true;
        let named = services.release_server_ids(&counters, gone, at(9), |ready| {
            assert_eq!(*ready, HashSet::from([id]));
            ready.clone()
        });
        assert_eq!(named, 0);
        // Nothing refers to it: released, once.
        let none = |_: &HashSet<u32>| HashSet::new();
        assert_eq!(
            services.release_server_ids(&counters, gone, at(10), none),
            1
        );
        assert_eq!(
            services.release_server_ids(&counters, gone, at(11), none),
            0,
            "once"
        );
        assert_eq!(ids(&services), (1, 0));
        assert_eq!(counts(&services), (5, 5, vec![0]));
        services.handle(add(13), &publisher, &counters).unwrap();
        assert_eq!(services.table.get(http()).unwrap().real_servers[1].id, id);
        // The new holder starts from zero, in the listing and in the service's rates;
        // the service keeps the old one's 5.
        assert_eq!(counts(&services), (5, 5, vec![0, 0]));
        counters[0][id as usize].connections.store(4, Relaxed);
        assert_eq!(counts(&services), (6, 6, vec![0, 1]));
        services
            .handle(
                Request::ZeroService { service: http() },
                &publisher,
                &counters,
            )
            .unwrap();
        assert_eq!(counts(&services), (0, 6, vec![0, 0]));
    }

    /// As a config is refused: an IPv6 real server or sorry server needs an IPv6
    /// address on the first port. Refused, the table does not change; with one, taken.
    #[test]
    fn an_ipv6_real_server_needs_an_ipv6_address_on_the_first_port() {
        let counters = vec![Arc::new(crate::dataplane::realserver_stats::new_table())];
        let v6: std::net::IpAddr = "2001:db8:1a::11".parse().unwrap();
        let service = ServiceKey {
            proto: Protocol::Tcp,
            vip: "2001:db8:18::100".parse().unwrap(),
            port: 80,
        };
        let requests = [
            Request::AddServer {
                service,
                server: RealServerSpec::new(v6, 8080, 1, ForwardMode::Nat),
            },
            Request::SetSorryServer {
                service,
                sorry_server: Some(crate::model::SorryServerSpec {
                    ip: v6,
                    port: 8081,
                    mode: ForwardMode::Nat,
                    inhibit: false,
                }),
            },
        ];
        let with_service = |cfg: &str| {
            let cfg = Config::parse(cfg, Path::new("test.toml")).unwrap();
            let mut services = Services::from_config(&cfg).unwrap();
            let publisher = SnapshotPublisher::new(Snapshot::build(0, &services.table));
            let add = Request::AddService {
                service,
                scheduler: None,
                persistence: None,
                sched_flags: None,
            };
            services.handle(add, &publisher, &counters).unwrap();
            (services, publisher)
        };
        let (mut services, publisher) = with_service(CONFIG);
        let version = services.table.version();
        for req in requests.clone() {
            let err = services.handle(req, &publisher, &counters).unwrap_err();
            assert!(
                err.contains("2001:db8:1a::11]:808")
                    && err.contains("is IPv6, but the first port has no IPv6 address"),
                "{err}"
            );
        }
        assert_eq!(services.table.version(), version, "the table changed");
        let with_v6 = CONFIG.replace(
            "addresses = [\"198.18.0.1/24\"]",
            "addresses = [\"198.18.0.1/24\", \"2001:db8:1a::1/64\"]",
        );
        let (mut services, publisher) = with_service(&with_v6);
        for req in requests {
            let answer = services.handle(req, &publisher, &counters);
            assert!(answer.is_ok(), "{answer:?}");
        }
    }

    /// A worker updates its counters with a plain load and store: a zero that lands
    /// between the two is undone by the store. `-Z` (and `sluicectl zero`) must hold
    /// all the same: the count shown is what the worker counted since.
    #[test]
    fn a_zero_holds_against_a_worker_update_in_flight() {
        use std::sync::atomic::Ordering::Relaxed;
        let (mut services, publisher) = setup();
        let counters = vec![Arc::new(crate::dataplane::realserver_stats::new_table())];
        let id = services.table.get(http()).unwrap().real_servers[0].id;
        let c = &counters[0][id as usize];
        c.in_packets.store(1000, Relaxed);
        c.connections.store(10, Relaxed);
        let shown = |services: &Services| {
            let report = services.report(&counters, super::super::rates::DEFAULT_WINDOW);
            let s = report.services.into_iter().find(|s| s.port == 80).unwrap();
            (s.real_servers[0].in_packets, s.stats.unwrap().in_packets)
        };
        assert_eq!(shown(&services), (1000, 1000));
        for zero in [
            Request::ZeroService { service: http() },
            Request::ZeroServices,
        ] {
            // The worker has loaded its count when the zero comes, and stores one
            // more after it.
            let loaded = c.in_packets.load(Relaxed);
            services.handle(zero, &publisher, &counters).unwrap();
            c.in_packets.store(loaded + 1, Relaxed);
            assert_eq!(shown(&services), (1, 1));
            c.in_packets.store(loaded + 5, Relaxed);
            assert_eq!(shown(&services), (5, 5));
        }
        services.zero_all(&counters);
        assert_eq!(shown(&services), (0, 0));
    }

    #[test]
    fn all_weights_zero_alerts_once_per_transition() {
        let (mut services, publisher) = setup();
        // The udp service has no real server at all: unavailable from the start.
        services.alert_on_unavailable();
        assert_eq!(
            (services.alerts, services.unavailable.clone()),
            (1, vec![dns()])
        );
        let weight = |w: u32| Request::EditServer {
            service: http(),
            server: RealServerSpec::new(Ipv4Addr::new(10, 0, 0, 11), 8080, w, ForwardMode::FullNat),
        };
        call(&mut services, &publisher, weight(0)).unwrap();
        assert_eq!(services.alerts, 2, "http lost its last server");
        call(&mut services, &publisher, weight(0)).unwrap();
        assert_eq!(services.alerts, 2, "still drained: no new alert");
        call(&mut services, &publisher, weight(3)).unwrap();
        assert_eq!(services.unavailable, vec![dns()]);
        call(&mut services, &publisher, weight(0)).unwrap();
        assert_eq!(services.alerts, 3, "drained again: a new transition");
        let listed = call(&mut services, &publisher, Request::ListServices).unwrap();
        assert_eq!(listed["services"][0]["available"], false);
        // An invalid weight changes nothing and raises nothing (seed 004: a bad
        // weight never becomes 0).
        assert!(call(&mut services, &publisher, weight(70_000)).is_err());
        assert_eq!(services.alerts, 3);
    }

    #[test]
    fn config_local_addresses_and_toa_reach_the_table_and_the_snapshot() {
        let (services, publisher) = setup();
        let svc = services.table.get(http()).unwrap();
        assert_eq!(svc.local_addresses, vec![lip(50), lip(51)]);
        assert!(svc.toa);
        assert_eq!(svc.real_servers[0].mode, ForwardMode::FullNat);
        assert!(!services.table.get(dns()).unwrap().toa);
        assert_eq!(services.own_addresses, vec![lip(1)]);
        let snap = publisher.current();
        assert_eq!(snap.local_addresses(), &[lip(50), lip(51)]);
        assert!(snap.is_local_address(lip(51)));
        assert_eq!(snap.vips(), &[Ipv4Addr::new(198, 18, 1, 1)]);
    }

    #[test]
    fn laddr_requests_edit_publish_and_list() {
        let (mut services, publisher) = setup();
        let got = call(
            &mut services,
            &publisher,
            Request::GetLaddr { service: http() },
        )
        .unwrap();
        assert_eq!(
            got,
            json!({
                "service": {"proto": "tcp", "vip": "198.18.1.1", "port": 80},
                "local_addresses": ["198.18.0.50", "198.18.0.51"],
                "pools": []
            })
        );
        // A query publishes nothing.
        assert_eq!(publisher.generation(), 1);

        let add = Request::AddLaddr {
            service: dns(),
            ip: lip(50).into(),
        };
        assert_eq!(
            call(&mut services, &publisher, add).unwrap(),
            json!({"generation": 2})
        );
        assert_eq!(services.generation, 2);
        assert_eq!(
            publisher.current().find(&dns()).unwrap().local_addresses,
            vec![lip(50)]
        );
        let del = Request::DelLaddr {
            service: http(),
            ip: lip(50).into(),
        };
        call(&mut services, &publisher, del).unwrap();
        let snap = publisher.current();
        assert_eq!(snap.generation(), 3);
        assert_eq!(snap.find(&http()).unwrap().local_addresses, vec![lip(51)]);
        // 198.18.0.50 is still dns's.
        assert_eq!(snap.local_addresses(), &[lip(50), lip(51)]);

        let report = services.report(&[], super::super::rates::DEFAULT_WINDOW);
        let http_status = &report.services[0];
        assert_eq!(http_status.proto, "tcp");
        assert_eq!(http_status.local_addresses, vec!["198.18.0.51".to_string()]);
        assert!(http_status.toa);
        assert_eq!(
            report.services[1].local_addresses,
            vec!["198.18.0.50".to_string()]
        );
        assert!(!report.services[1].toa);
        let listed = call(&mut services, &publisher, Request::ListServices).unwrap();
        assert_eq!(
            listed["services"][0]["local_addresses"],
            json!(["198.18.0.51"])
        );
        assert_eq!(listed["services"][0]["toa"], json!(true));
    }

    #[test]
    fn bad_laddr_requests_change_and_publish_nothing() {
        let (mut services, publisher) = setup();
        let missing = ServiceKey::new(Protocol::Tcp, Ipv4Addr::new(198, 18, 1, 9), 80);
        for (req, needle) in [
            (
                Request::AddLaddr {
                    service: missing,
                    ip: lip(60).into(),
                },
                "No such service: TCP 198.18.1.9:80",
            ),
            (
                Request::DelLaddr {
                    service: missing,
                    ip: lip(50).into(),
                },
                "No such service",
            ),
            (Request::GetLaddr { service: missing }, "No such service"),
            (
                Request::AddLaddr {
                    service: http(),
                    ip: lip(50).into(),
                },
                "Local address already exists: 198.18.0.50 in TCP 198.18.1.1:80",
            ),
            (
                Request::DelLaddr {
                    service: http(),
                    ip: lip(60).into(),
                },
                "No such local address: 198.18.0.60 in TCP 198.18.1.1:80",
            ),
            (
                Request::AddLaddr {
                    service: http(),
                    ip: lip(1).into(),
                },
                "invalid local address 198.18.0.1: it is one of the appliance's own port addresses",
            ),
            (
                Request::AddLaddr {
                    service: dns(),
                    ip: Ipv4Addr::new(198, 18, 1, 1).into(),
                },
                "already the VIP of",
            ),
            (
                Request::AddLaddr {
                    service: dns(),
                    ip: Ipv4Addr::new(10, 0, 0, 11).into(),
                },
                "already a real server of TCP 198.18.1.1:80",
            ),
            (
                Request::AddLaddr {
                    service: dns(),
                    ip: Ipv4Addr::new(224, 0, 0, 1).into(),
                },
                "not a unicast address",
            ),
        ] {
            let before: Vec<_> = services.table.services().cloned().collect();
            let err = call(&mut services, &publisher, req.clone()).unwrap_err();
            assert!(err.contains(needle), "{req:?}: {err}");
            assert_eq!(
                services.table.services().cloned().collect::<Vec<_>>(),
                before
            );
            assert_eq!(publisher.generation(), 1, "{req:?}");
            assert_eq!(services.generation, 1);
        }
    }

    #[test]
    fn laddr_requests_are_service_requests() {
        for req in [
            Request::AddLaddr {
                service: http(),
                ip: lip(50).into(),
            },
            Request::DelLaddr {
                service: http(),
                ip: lip(50).into(),
            },
            Request::GetLaddr { service: http() },
        ] {
            assert!(Services::handles(&req), "{req:?}");
        }
        assert!(!Services::handles(&Request::Status));
    }

    #[test]
    fn access_lists_change_hot_and_unrelated_changes_reuse_the_compiled_list() {
        use crate::service::{AclAction, Prefix};
        let (mut services, publisher) = setup();
        let deny: Prefix = "198.18.5.0/24".parse().unwrap();
        call(
            &mut services,
            &publisher,
            Request::AclAdd {
                service: http(),
                action: AclAction::Deny,
                prefixes: vec![deny],
            },
        )
        .unwrap();
        let snap = publisher.current();
        let index = snap.find_index(&http()).unwrap();
        let first = snap.admission(index).expect("the service has a list");
        assert!(
            !first
                .acl
                .as_ref()
                .unwrap()
                .decide("198.18.5.9".parse().unwrap())
                .allowed
        );
        first.acl.as_ref().unwrap().count(0, 0);
        // A weight change elsewhere publishes again: the list is the same Arc.
        call(
            &mut services,
            &publisher,
            Request::SetTimeouts {
                tcp: 60,
                tcpfin: 0,
                udp: 0,
            },
        )
        .unwrap();
        let again = publisher.current();
        assert!(std::ptr::eq(first, again.admission(index).unwrap()));
        assert!(snap.admission(snap.find_index(&dns()).unwrap()).is_none());
        let listed = call(
            &mut services,
            &publisher,
            Request::AclList {
                service: http(),
                max: None,
            },
        )
        .unwrap();
        assert_eq!(listed["rules"][0]["prefix"], "198.18.5.0/24");
        assert_eq!(listed["rules"][0]["hits"], 1);
        assert_eq!(listed["unmatched"], "allow");
        // A bad change changes nothing.
        let err = call(
            &mut services,
            &publisher,
            Request::AclDel {
                service: http(),
                prefixes: vec!["10.0.0.0/8".parse().unwrap()],
            },
        )
        .unwrap_err();
        assert!(err.contains("not in the list"), "{err}");
        assert_eq!(services.table.admission(http()).unwrap().acl().len(), 1);
        // -S lines carry the list, so -R --replace of them keeps it...
        let saved = crate::control::render::render_save(&services.save_report(&[]));
        assert!(
            saved.contains("--acl-add -t 198.18.1.1:80 --deny 198.18.5.0/24\n"),
            "{saved}"
        );
        let answer = call(&mut services, &publisher, replace(parse_lines(&saved))).unwrap();
        assert_eq!(answer["changes"], 0, "{answer}");
        assert_eq!(services.table.admission(http()).unwrap().acl().len(), 1);
        // ...and lines without it (plain ipvsadm-save) are the whole table: no list.
        let plain: String = saved
            .lines()
            .filter(|l| !l.starts_with("--acl-add"))
            .map(|l| format!("{l}\n"))
            .collect();
        call(&mut services, &publisher, replace(parse_lines(&plain))).unwrap();
        assert!(services.table.admission(http()).unwrap().acl().is_empty());
        call(&mut services, &publisher, replace(parse_lines(&saved))).unwrap();
        assert_eq!(services.table.admission(http()).unwrap().acl().len(), 1);
        // A reload whose file has another list: the diff replaces it.
        let mut desired = services.table.clone();
        desired.acl_clear(http()).unwrap();
        desired
            .acl_add(http(), AclAction::Allow, &["10.0.0.0/8".parse().unwrap()])
            .unwrap();
        desired
            .set_rate_limit(
                http(),
                Some(crate::service::RateLimit::new(5, 5, 32).unwrap()),
            )
            .unwrap();
        let requests = diff(&services.table, &desired).unwrap();
        assert_eq!(
            requests,
            vec![
                Request::AclClear { service: http() },
                Request::AclAdd {
                    service: http(),
                    action: AclAction::Allow,
                    prefixes: vec!["10.0.0.0/8".parse().unwrap()],
                },
                Request::SetRateLimit {
                    service: http(),
                    limit: Some(crate::service::RateLimit::new(5, 5, 32).unwrap()),
                },
            ]
        );
    }

    /// `-R --replace` of saved lines keeps a staying service's Maglev table size
    /// (ipvsadm lines cannot say it): no change, no move to the default size; and a
    /// replace that gives it more real servers than that table holds is refused,
    /// changing nothing.
    #[test]
    fn a_replace_keeps_a_staying_services_maglev_table_size() {
        let (mut services, publisher) = setup();
        services
            .table
            .edit_service(http(), SchedulerKind::Mh, None)
            .unwrap();
        services
            .table
            .set_sched_params(http(), Default::default(), Some(5))
            .unwrap();
        let saved = crate::control::render::render_save(&services.save_report(&[]));
        let answer = call(&mut services, &publisher, replace(parse_lines(&saved))).unwrap();
        assert_eq!(answer["changes"], 0, "{answer}");
        assert_eq!(services.table.get(http()).unwrap().mh_table_size, 5);
        let before = crate::control::render::render_save(&services.save_report(&[]));
        let crowded: String = (12..17)
            .map(|last| format!("-a -t 198.18.1.1:80 -r 10.0.0.{last}:8080 -b\n"))
            .collect();
        let err = call(
            &mut services,
            &publisher,
            replace(parse_lines(&(saved.clone() + &crowded))),
        )
        .unwrap_err();
        assert!(
            err.contains("an mh table of 5 slots cannot hold 6 real servers")
                && err.contains("mh_table_size` in the config file"),
            "{err}"
        );
        let after = crate::control::render::render_save(&services.save_report(&[]));
        assert_eq!(after, before);
        assert_eq!(services.table.get(http()).unwrap().mh_table_size, 5);
        // A size the requests set themselves is theirs.
        let mut requests = parse_lines(&saved);
        requests.push(Request::SetMhTableSize {
            service: http(),
            size: 251,
        });
        call(&mut services, &publisher, replace(requests)).unwrap();
        assert_eq!(services.table.get(http()).unwrap().mh_table_size, 251);
    }

    /// The sorry server and a real server trade places in one reload: the old sorry
    /// server comes in as a real server, the old real server becomes the sorry server.
    #[test]
    fn a_reload_swaps_the_sorry_server_and_a_real_server() {
        let (mut services, publisher) = setup();
        let real = services.table.get(http()).unwrap().real_servers[0].clone();
        let sorry = crate::model::SorryServerSpec {
            ip: Ipv4Addr::new(10, 0, 0, 99).into(),
            port: 8080,
            mode: ForwardMode::FullNat,
            inhibit: false,
        };
        call(
            &mut services,
            &publisher,
            Request::SetSorryServer {
                service: http(),
                sorry_server: Some(sorry),
            },
        )
        .unwrap();
        let mut desired = services.table.clone();
        desired.delete_server(http(), real.ip, real.port).unwrap();
        desired.set_sorry_server(http(), None).unwrap();
        desired
            .add_server(
                http(),
                RealServerSpec::new(sorry.ip, sorry.port, 1, sorry.mode),
            )
            .unwrap();
        let old_real = crate::model::SorryServerSpec {
            ip: real.ip,
            port: real.port,
            mode: real.mode,
            inhibit: false,
        };
        desired.set_sorry_server(http(), Some(old_real)).unwrap();
        for r in diff(&services.table, &desired).unwrap() {
            call(&mut services, &publisher, r.clone()).unwrap_or_else(|e| panic!("{r:?}: {e}"));
        }
        let now = services.table.get(http()).unwrap();
        assert_eq!(
            now.real_servers
                .iter()
                .map(|r| (r.ip, r.port))
                .collect::<Vec<_>>(),
            [(sorry.ip, sorry.port)]
        );
        assert_eq!(now.sorry_server.map(|s| s.spec()), Some(old_real));
    }

    /// sloppy_tcp refuses FullNAT servers, so a reload turns it on after the servers
    /// change and off before they do; the listing's JSON shows it.
    #[test]
    fn a_reload_orders_sloppy_tcp_around_the_real_servers() {
        let (mut services, publisher) = setup();
        let fullnat = services.table.get(http()).unwrap().real_servers[0].clone();
        assert_eq!(fullnat.mode, ForwardMode::FullNat);
        let mut desired = services.table.clone();
        desired
            .delete_server(http(), fullnat.ip, fullnat.port)
            .unwrap();
        let nat = RealServerSpec::new(Ipv4Addr::new(10, 0, 0, 12), 8080, 1, ForwardMode::Nat);
        desired.add_server(http(), nat).unwrap();
        desired.set_sloppy_tcp(http(), true).unwrap();
        let on = Request::SetSloppyTcp {
            service: http(),
            on: true,
        };
        let requests = diff(&services.table, &desired).unwrap();
        assert_eq!(requests.last(), Some(&on), "{requests:?}");
        for r in requests {
            call(&mut services, &publisher, r).unwrap();
        }
        let report = services.report(&[], super::super::rates::DEFAULT_WINDOW);
        assert!(report.services[0].sloppy_tcp && !report.services[1].sloppy_tcp);
        // And back: off first, then the FullNAT server returns.
        let mut back =
            Services::from_config(&Config::parse(CONFIG, Path::new("test.toml")).unwrap())
                .unwrap()
                .table;
        back.delete_server(http(), fullnat.ip, fullnat.port)
            .unwrap();
        back.add_server(
            http(),
            RealServerSpec::new(fullnat.ip, fullnat.port, fullnat.weight, fullnat.mode),
        )
        .unwrap();
        let requests = diff(&services.table, &back).unwrap();
        let at = |want: fn(&Request) -> bool| requests.iter().position(want);
        let off = at(|r| matches!(r, Request::SetSloppyTcp { on: false, .. }));
        let added = at(|r| matches!(r, Request::AddServer { .. }));
        assert!(off.is_some() && off < added, "{requests:?}");
        for r in requests {
            call(&mut services, &publisher, r).unwrap();
        }
        assert!(!services.table.get(http()).unwrap().sloppy_tcp);
    }

    /// `mh_table_size` is the config's only: a reload that changes it, on a service
    /// kept or a new one, sets it, so every node started or reloaded from one file
    /// has the same Maglev table (ECMP moves flows between them).
    #[test]
    fn a_reload_sets_the_maglev_table_size() {
        let (mut services, publisher) = setup();
        assert!(diff(&services.table, &services.table.clone())
            .unwrap()
            .is_empty());
        let mut desired = services.table.clone();
        desired
            .edit_service(http(), SchedulerKind::Mh, None)
            .unwrap();
        desired
            .set_sched_params(http(), Default::default(), Some(1009))
            .unwrap();
        let added = ServiceKey::new(Protocol::Tcp, Ipv4Addr::new(198, 18, 1, 9), 80);
        desired.add_service(added, SchedulerKind::Mh, None).unwrap();
        desired
            .set_sched_params(added, Default::default(), Some(4099))
            .unwrap();
        let requests = diff(&services.table, &desired).unwrap();
        for r in requests {
            call(&mut services, &publisher, r).unwrap();
        }
        for (key, size) in [(http(), 1009), (added, 4099)] {
            let s = services.table.get(key).unwrap();
            assert_eq!((s.scheduler, s.mh_table_size), (SchedulerKind::Mh, size));
        }
        assert!(diff(&services.table, &desired).unwrap().is_empty());
    }

    /// A config whose real server is another service's VIP is refused naming that
    /// value, FILE:LINE:COLUMN: field, as load errors do (the line found here by a
    /// plain text scan, not by the config's own parser).
    #[test]
    fn a_cross_service_conflict_names_the_value() {
        let text = format!(
            "{CONFIG}\n[[services]]\nproto = \"tcp\"\nvip = \"198.18.1.2\"\nport = 80\n\n  \
             [[services.real_servers]]\n  ip = \"198.18.1.1\"\n  port = 80\n  mode = \"dr\"\n"
        );
        let (line, column) = text
            .lines()
            .enumerate()
            .find(|(_, l)| l.trim_start() == "ip = \"198.18.1.1\"")
            .map(|(n, l)| (n + 1, l.find("ip").unwrap() + 6))
            .unwrap();
        let cfg = Config::parse(&text, Path::new("test.toml")).unwrap();
        let err = Services::from_config(&cfg).err().unwrap();
        let place = format!("test.toml:{line}:{column}: services[2].real_servers[0].ip: ");
        assert!(err.starts_with(&place), "{err} (wanted {place})");
        assert!(
            err.contains("address 198.18.1.1 is already the VIP"),
            "{err}"
        );
    }

    /// A sorry server at another service's VIP is refused by the table, not by the
    /// file's own checks (they read one service at a time): the refusal still names
    /// the field and where it is written.
    #[test]
    fn a_sorry_server_conflict_names_the_field() {
        let text = format!(
            "{CONFIG}\n[[services]]\nproto = \"tcp\"\nvip = \"198.18.1.2\"\nport = 80\n\n  \
             [[services.real_servers]]\n  ip = \"10.0.0.21\"\n  port = 80\n  mode = \"nat\"\n\n  \
             [services.sorry_server]\n  ip = \"198.18.1.1\"\n  port = 80\n  mode = \"nat\"\n"
        );
        let line = text
            .lines()
            .position(|l| l.trim_start() == "ip = \"198.18.1.1\"")
            .unwrap()
            + 1;
        let cfg = Config::parse(&text, Path::new("test.toml")).unwrap();
        let err = Services::from_config(&cfg).err().unwrap();
        let place = format!("test.toml:{line}:8: services[2].sorry_server.ip: ");
        assert!(err.starts_with(&place), "{err} (wanted {place})");
        assert!(err.contains("198.18.1.1"), "{err}");
    }

    /// A reload where an address leaves a role in one service (a real server, a local
    /// address, the sorry server) and takes another (a VIP) in a service that sorts
    /// before it: every removal goes first, so the table never holds both at once.
    #[test]
    fn a_reload_frees_an_address_before_another_service_takes_it() {
        let (mut services, publisher) = setup();
        let old_sorry = Ipv4Addr::new(10, 0, 0, 9);
        let sorry = crate::model::SorryServerSpec {
            ip: old_sorry.into(),
            port: 8080,
            mode: ForwardMode::FullNat,
            inhibit: false,
        };
        let set = Request::SetSorryServer {
            service: http(),
            sorry_server: Some(sorry),
        };
        call(&mut services, &publisher, set).unwrap();
        let mut desired = services.table.clone();
        desired.set_sorry_server(http(), None).unwrap();
        let (old_server, old_lip) = (Ipv4Addr::new(10, 0, 0, 11), lip(51));
        desired
            .delete_server(http(), old_server.into(), 8080)
            .unwrap();
        let nat = RealServerSpec::new(Ipv4Addr::new(10, 0, 0, 12), 8080, 1, ForwardMode::FullNat);
        desired.add_server(http(), nat).unwrap();
        desired.del_laddr(http(), old_lip.into()).unwrap();
        // All three sort before 198.18.1.1.
        for vip in [old_server, old_lip, old_sorry] {
            let key = ServiceKey::new(Protocol::Tcp, vip, 80);
            desired
                .add_service(key, crate::model::SchedulerKind::Rr, None)
                .unwrap();
            let dr = RealServerSpec::new(Ipv4Addr::new(10, 0, 0, 13), 80, 1, ForwardMode::Dr);
            desired.add_server(key, dr).unwrap();
        }
        let requests = diff(&services.table, &desired).unwrap();
        let batch = Request::Batch {
            requests,
            replace: false,
        };
        call(&mut services, &publisher, batch).unwrap();
        assert_eq!(services.table.services().count(), 5);
        let http = services.table.get(http()).unwrap();
        assert!(http
            .server(std::net::IpAddr::V4(old_server), 8080)
            .is_none());
        assert_eq!(http.local_addresses, vec![std::net::IpAddr::V4(lip(50))]);
    }

    /// A reload that adds, changes or removes a sorry server: one request each, which
    /// the table applies; the listing shows it while in use only.
    #[test]
    fn a_reload_sets_the_sorry_server_and_the_listing_shows_it_in_use() {
        let (mut services, publisher) = setup();
        let sorry = crate::model::SorryServerSpec {
            ip: Ipv4Addr::new(10, 0, 0, 99).into(),
            port: 8080,
            mode: ForwardMode::FullNat,
            inhibit: false,
        };
        let mut desired = services.table.clone();
        desired.set_sorry_server(http(), Some(sorry)).unwrap();
        let requests = diff(&services.table, &desired).unwrap();
        assert_eq!(
            requests,
            vec![Request::SetSorryServer {
                service: http(),
                sorry_server: Some(sorry),
            }]
        );
        for r in requests {
            call(&mut services, &publisher, r).unwrap();
        }
        let report = services.report(&[], super::super::rates::DEFAULT_WINDOW);
        let s = &report.services[0];
        assert_eq!(s.sorry_server.as_ref().unwrap().weight, 0);
        assert!(!s.sorry_in_use);
        assert_eq!(s.real_servers.len(), 1, "not listed while not in use");
        // The only real server evicted: the sorry server is in use, and listed.
        let id = services.table.get(http()).unwrap().real_servers[0].id;
        services.health.evicted.insert(id);
        let report = services.report(&[], super::super::rates::DEFAULT_WINDOW);
        let s = &report.services[0];
        assert!(s.sorry_in_use);
        assert_eq!(s.real_servers.len(), 2);
        assert!(s.real_servers[1].sorry && s.real_servers[1].weight == 1);
        // Not in -S.
        assert_eq!(services.save_report(&[]).services[0].real_servers.len(), 1);
        let mut without = services.table.clone();
        without.set_sorry_server(http(), None).unwrap();
        assert_eq!(
            diff(&services.table, &without).unwrap(),
            vec![Request::SetSorryServer {
                service: http(),
                sorry_server: None,
            }]
        );
    }

    /// A replaced list is freed on the management core once no worker's snapshot
    /// holds it, never by the worker letting go of its last snapshot.
    #[test]
    fn a_replaced_list_waits_for_the_workers_and_is_freed_here() {
        use crate::service::AclAction;
        let (mut services, publisher) = setup();
        let add = |p: &str| Request::AclAdd {
            service: http(),
            action: AclAction::Deny,
            prefixes: vec![p.parse().unwrap()],
        };
        call(&mut services, &publisher, add("198.18.5.0/24")).unwrap();
        let mut worker = publisher.reader();
        call(&mut services, &publisher, add("198.18.6.0/24")).unwrap();
        // The worker still reads the first list: kept here.
        assert_eq!(services.table.retired_admission(), 1);
        let first = worker.current().admission(0).map(|a| a as *const _);
        assert!(worker.refresh());
        // As a worker does once its schedulers are rebuilt.
        worker.let_go_of_replaced();
        assert_ne!(worker.current().admission(0).map(|a| a as *const _), first);
        call(&mut services, &publisher, add("198.18.7.0/24")).unwrap();
        // The first list is gone; the second waits for the worker to adopt the third.
        assert_eq!(services.table.retired_admission(), 1);
        call(
            &mut services,
            &publisher,
            Request::DeleteService { service: http() },
        )
        .unwrap();
        assert!(worker.refresh());
        // As a worker does once its schedulers are rebuilt.
        worker.let_go_of_replaced();
        call(
            &mut services,
            &publisher,
            Request::SetTimeouts {
                tcp: 60,
                tcpfin: 0,
                udp: 0,
            },
        )
        .unwrap();
        assert_eq!(services.table.retired_admission(), 0);
    }

    /// `-S` writes a service's access list and rate limit as lines `-R` reads back
    /// (the same lines again after a restore into an empty table); the listing sums
    /// them up without the rules; `-Z` zeroes their counts.
    #[test]
    fn saved_lists_and_limits_restore_and_the_listing_and_zero_cover_them() {
        use crate::service::{AclAction, AdmissionEvent, RateLimit};
        let (mut services, publisher) = setup();
        let deny: Vec<_> = (0..250u32)
            .map(|i| format!("10.{}.{}.0/24", i / 256, i % 256).parse().unwrap())
            .collect();
        let allow: Vec<_> = ["198.18.0.0/15", "10.0.0.0/8", "192.0.2.7/32"]
            .iter()
            .map(|p| p.parse().unwrap())
            .collect();
        let limit = RateLimit::new(50, 100, 24).unwrap();
        for req in [
            Request::AclAdd {
                service: http(),
                action: AclAction::Deny,
                prefixes: deny,
            },
            Request::AclAdd {
                service: http(),
                action: AclAction::Allow,
                prefixes: allow,
            },
            Request::SetRateLimit {
                service: http(),
                limit: Some(limit),
            },
        ] {
            call(&mut services, &publisher, req).unwrap();
        }
        let saved = crate::control::render::render_save(&services.save_report(&[]));
        let own: Vec<&str> = saved
            .lines()
            .filter(|l| l.starts_with("--"))
            .map(|l| l.split_once(',').map_or(l, |(head, _)| head))
            .collect();
        assert_eq!(
            own,
            vec![
                "--acl-add -t 198.18.1.1:80 --allow 10.0.0.0/8",
                "--acl-add -t 198.18.1.1:80 --deny 10.0.0.0/24",
                "--acl-add -t 198.18.1.1:80 --deny 10.0.100.0/24",
                "--acl-add -t 198.18.1.1:80 --deny 10.0.200.0/24",
                "--rate-limit 50 -t 198.18.1.1:80 --burst 100 --per-prefix 24",
            ]
        );
        // 100 prefixes a line: 100 + 100 + 50 deny rules.
        let deny_lines: Vec<usize> = saved
            .lines()
            .filter(|l| l.contains("--deny"))
            .map(|l| l.matches('/').count())
            .collect();
        assert_eq!(deny_lines, vec![100, 100, 50]);

        call(&mut services, &publisher, Request::Clear).unwrap();
        assert_eq!(
            crate::control::render::render_save(&services.save_report(&[])),
            ""
        );
        let requests = saved
            .lines()
            .map(|l| {
                let args: Vec<String> = l.split_whitespace().map(String::from).collect();
                crate::control::ipvsadm::parse(&args).unwrap().request
            })
            .collect();
        call(
            &mut services,
            &publisher,
            Request::Batch {
                requests,
                replace: false,
            },
        )
        .unwrap();
        assert_eq!(
            crate::control::render::render_save(&services.save_report(&[])),
            saved
        );
        let rules = services.table.admission(http()).unwrap();
        assert_eq!((rules.acl().len(), rules.rate_limit()), (253, Some(limit)));

        // The listing: counts, default, limit and counters; no rules; nothing for a
        // service without any.
        let snap = publisher.current();
        let compiled = snap.admission(snap.find_index(&http()).unwrap()).unwrap();
        compiled.counters.count(0, AdmissionEvent::AclDenied);
        compiled.counters.count(0, AdmissionEvent::RateLimited);
        compiled.counters.count(0, AdmissionEvent::RateLimited);
        compiled.acl.as_ref().unwrap().count(0, 0);
        let listed = call(&mut services, &publisher, Request::ListServices).unwrap();
        assert_eq!(
            listed["services"][0]["admission"],
            json!({
                "allow_rules": 3,
                "deny_rules": 250,
                "unmatched": "deny",
                "rate_limit": {"rate": 50, "burst": 100, "prefix_len": 24},
                "workers": 1,
                "totals": {"acl_denied": 1, "rate_limited": 2, "rate_evicted_live": 0}
            })
        );
        assert!(listed["services"][1].get("admission").is_none(), "{listed}");
        let hits = |services: &mut Services| {
            let list = call(
                services,
                &publisher,
                Request::AclList {
                    service: http(),
                    max: Some(1),
                },
            )
            .unwrap();
            list["rules"][0]["hits"].as_u64().unwrap()
        };
        assert_eq!(hits(&mut services), 1);

        // -Z: the service's counts and the rules' hits start again from zero.
        services.table.zero_admission_counts();
        let listed = call(&mut services, &publisher, Request::ListServices).unwrap();
        assert_eq!(
            listed["services"][0]["admission"]["totals"],
            json!({"acl_denied": 0, "rate_limited": 0, "rate_evicted_live": 0})
        );
        assert_eq!(hits(&mut services), 0);
        compiled.counters.count(0, AdmissionEvent::AclDenied);
        let listed = call(&mut services, &publisher, Request::ListServices).unwrap();
        assert_eq!(
            listed["services"][0]["admission"]["totals"]["acl_denied"],
            1
        );
    }

    /// `-L --rate`'s service line comes from the service's own counters, sampled
    /// once a second: a real server removed from the service still counts there
    /// while its sessions carry traffic, as in IPVS's service estimator, though it
    /// is no longer listed to be summed.
    #[test]
    fn service_rates_come_from_its_own_counters() {
        use std::sync::atomic::Ordering::Relaxed;
        let (mut services, publisher) = setup();
        let counters = vec![Arc::new(crate::dataplane::realserver_stats::new_table())];
        let service = services.table.get(http()).unwrap();
        let (service_id, id) = (service.id, service.real_servers[0].id);
        let c = &counters[0][id as usize];
        let t0 = Instant::now();
        let window = super::super::rates::DEFAULT_WINDOW;
        let listed = |services: &Services| {
            let report = services.report(&counters, window);
            report.services.into_iter().find(|s| s.port == 80).unwrap()
        };
        // 20 connections and 300 packets a second.
        for second in 0..=2u64 {
            c.connections.store(20 * second, Relaxed);
            c.in_packets.store(300 * second, Relaxed);
            services.sample_rates(&counters, t0 + Duration::from_secs(second));
        }
        let s = listed(&services);
        assert_eq!((s.real_servers[0].cps, s.real_servers[0].in_pps), (20, 300));
        let rates = s.rates.unwrap();
        assert_eq!((rates.cps, rates.in_pps, rates.out_pps), (20, 300, 0));
        services
            .handle(
                Request::DeleteServer {
                    service: http(),
                    ip: Ipv4Addr::new(10, 0, 0, 11).into(),
                    port: 8080,
                },
                &publisher,
                &counters,
            )
            .unwrap();
        for second in 3..=5u64 {
            c.connections.store(20 * second, Relaxed);
            c.in_packets.store(300 * second, Relaxed);
            services.sample_rates(&counters, t0 + Duration::from_secs(second));
        }
        let s = listed(&services);
        assert!(s.real_servers.is_empty(), "{s:?}");
        assert_eq!(s.rates.map(|r| (r.cps, r.in_pps)), Some((20, 300)));
        let text = crate::control::render::render_rates(
            &crate::control::report::ServicesReport { services: vec![s] },
            false,
        );
        assert!(
            text.contains(&format!("TCP  {:<28}{:>9}{:>9}", "198.18.1.1:80", 20, 300)),
            "{text}"
        );
        // Deleted, the service's history goes with it.
        services
            .handle(
                Request::DeleteService { service: http() },
                &publisher,
                &counters,
            )
            .unwrap();
        assert_ne!(
            services.rates.service_rate(service_id, window),
            Default::default()
        );
        services.sample_rates(&counters, t0 + Duration::from_secs(6));
        assert_eq!(
            services.rates.service_rate(service_id, window),
            Default::default()
        );
    }

    #[test]
    fn a_batch_preface_is_recorded_only_when_the_batch_is_applied() {
        let (mut services, publisher) = setup();
        let events = |s: &Services| -> Vec<String> {
            s.events.iter().map(|(_, line)| line.clone()).collect()
        };
        let before = events(&services);
        // The second command names no service: the whole batch is refused.
        let refused = services.batch(
            vec![
                Request::DeleteService { service: dns() },
                Request::DeleteService {
                    service: ServiceKey::new(Protocol::Tcp, Ipv4Addr::new(198, 18, 1, 9), 80),
                },
            ],
            false,
            Some("lb=config op=reload file=x commands=2".into()),
            &publisher,
            &[],
        );
        assert!(refused.is_err());
        assert_eq!(events(&services), before, "a refused batch records nothing");
        services
            .batch(
                vec![Request::DeleteService { service: dns() }],
                false,
                Some("lb=config op=reload file=x commands=1".into()),
                &publisher,
                &[],
            )
            .unwrap();
        let added = &events(&services)[before.len()..];
        assert_eq!(added.len(), 3, "{added:?}");
        assert_eq!(added[0], "lb=config op=reload file=x commands=1");
        assert_eq!(added[1], "lb=config op=del-svc svc=198.18.1.1:53/udp");
        assert_eq!(added[2], "lb=config op=batch commands=1");
    }

    /// `--synproxy on` for `service`, as an ipvsadm line sends it.
    fn synproxy(service: ServiceKey) -> Request {
        Request::SetSynproxy {
            service,
            synproxy: crate::model::SynProxy {
                mode: crate::model::SynProxyMode::On,
                auto_syn_rate: 1000,
                syn_retries: 3,
            },
        }
    }

    /// A `-A` of a service that exists, or an `-E` of one that does not, with its
    /// `--synproxy`: the pair is refused with the first command's own words, and
    /// nothing changes or is published.
    #[test]
    fn apply_each_refuses_a_proxy_pair_whose_first_command_the_table_refuses() {
        let (mut services, publisher) = setup();
        let missing = ServiceKey::new(Protocol::Tcp, Ipv4Addr::new(198, 18, 1, 9), 80);
        let add_existing = Request::AddService {
            service: http(),
            scheduler: Some(SchedulerKind::Wrr),
            persistence: None,
            sched_flags: None,
        };
        let edit_missing = Request::EditService {
            service: missing,
            scheduler: Some(SchedulerKind::Wrr),
            persistence: None,
            sched_flags: None,
        };
        // The words each first command has alone.
        let alone = [add_existing.clone(), edit_missing.clone()]
            .map(|r| call(&mut services, &publisher, r).unwrap_err());
        let http_before = services.table.get(http()).unwrap().clone();
        let before = publisher.current().generation();
        let pair = |first, second| Request::Batch {
            requests: vec![first, second],
            replace: false,
        };
        let answer = call(
            &mut services,
            &publisher,
            Request::ApplyEach {
                requests: vec![
                    pair(add_existing, synproxy(http())),
                    pair(edit_missing, synproxy(missing)),
                ],
            },
        )
        .unwrap();
        assert_eq!(answer["applied"], json!(0), "{answer}");
        for (i, words) in alone.iter().enumerate() {
            let error = format!("command 1 of 2: {words} (nothing was changed)");
            assert_eq!(
                answer["refused"][i],
                json!({"command": i + 1, "error": error})
            );
        }
        assert_eq!(services.table.get(http()).unwrap(), &http_before);
        assert!(services.table.get(missing).is_none());
        assert_eq!(
            publisher.current().generation(),
            before,
            "nothing published"
        );
    }

    /// `-R` line by line: each command is applied as if alone (a refused one changes
    /// nothing and answers with its own words, the next still goes on), a two-change
    /// line stands or falls whole, and all of it is published as one snapshot.
    #[test]
    fn apply_each_applies_what_it_can_and_publishes_once() {
        let (mut services, publisher) = setup();
        let rip = |last| Ipv4Addr::new(10, 0, 0, last);
        let add = |last| Request::AddServer {
            service: http(),
            server: RealServerSpec::new(rip(last), 8080, 1, crate::model::ForwardMode::FullNat),
        };
        let other = ServiceKey::new(Protocol::Tcp, Ipv4Addr::new(198, 18, 1, 2), 80);
        let udp = ServiceKey::new(Protocol::Udp, Ipv4Addr::new(198, 18, 1, 3), 53);
        let add_service = |service| Request::AddService {
            service,
            scheduler: None,
            persistence: None,
            sched_flags: None,
        };
        let pair = |first, second| Request::Batch {
            requests: vec![first, second],
            replace: false,
        };
        // The words a refused command has when it is sent alone.
        let alone = call(&mut services, &publisher, add(11)).unwrap_err();
        let alone_pair = call(
            &mut services,
            &publisher,
            pair(add_service(udp), synproxy(udp)),
        )
        .unwrap_err();
        let dns_before = services.table.get(dns()).unwrap().clone();
        let before = publisher.current().generation();
        let answer = call(
            &mut services,
            &publisher,
            Request::ApplyEach {
                requests: vec![
                    add(12),
                    add(11),
                    // Not a service's -A with its proxy: refused whole (undoing
                    // any batch would copy the table). Then pairs whose second
                    // command is refused: the first is undone, by deleting the
                    // service just added, then by editing the service back.
                    pair(add_service(other), add(11)),
                    pair(add_service(udp), synproxy(udp)),
                    pair(
                        Request::EditService {
                            service: dns(),
                            scheduler: Some(SchedulerKind::Wrr),
                            persistence: None,
                            sched_flags: None,
                        },
                        synproxy(dns()),
                    ),
                    Request::ZeroService { service: http() },
                    add(13),
                    Request::BatchCommit,
                    Request::Batch {
                        requests: Vec::new(),
                        replace: false,
                    },
                ],
            },
        )
        .unwrap();
        assert_eq!(answer["applied"], json!(3), "{answer}");
        let refused = answer["refused"].as_array().unwrap();
        assert_eq!(refused.len(), 6, "{answer}");
        assert_eq!(refused[0], json!({"command": 2, "error": alone}));
        assert_eq!(refused[1], json!({"command": 3, "error": NOT_A_PAIR}));
        assert_eq!(refused[5], json!({"command": 9, "error": NOT_A_PAIR}));
        assert_eq!(refused[2], json!({"command": 4, "error": alone_pair}));
        assert_eq!(refused[3]["command"], json!(5));
        assert!(
            refused[3]["error"]
                .as_str()
                .unwrap()
                .ends_with("(nothing was changed)"),
            "{answer}"
        );
        assert_eq!(
            refused[4],
            json!({"command": 8, "error": "batches do not nest"})
        );
        let now = publisher.current();
        assert_eq!(now.generation(), before + 1, "one snapshot for all of it");
        assert_eq!(answer["generation"], json!(now.generation()));
        let servers = |s: &Snapshot| {
            let mut ips: Vec<std::net::IpAddr> = s
                .find(&http())
                .unwrap()
                .real_servers
                .iter()
                .map(|r| r.ip)
                .collect();
            ips.sort();
            ips
        };
        assert_eq!(
            servers(&now),
            [11, 12, 13].map(|l| std::net::IpAddr::V4(rip(l)))
        );
        for gone in [other, udp] {
            assert!(
                now.find(&gone).is_none(),
                "the refused line's service is undone"
            );
            assert!(services.table.get(gone).is_none());
        }
        assert_eq!(services.table.get(dns()).unwrap(), &dns_before);
        // Nothing changed: nothing published.
        let answer = call(
            &mut services,
            &publisher,
            Request::ApplyEach {
                requests: vec![add(11), Request::ZeroService { service: http() }],
            },
        )
        .unwrap();
        assert_eq!(answer["applied"], json!(1));
        assert_eq!(publisher.current().generation(), before + 1);
    }

    /// A reload that makes a service mh and raises its table size at once, or makes
    /// it something else and lowers the size, applies: the larger table goes in
    /// before the scheduler change, the smaller one after (an mh service needs a slot
    /// for each of its real servers at every step).
    #[test]
    fn a_reload_changes_the_scheduler_and_the_table_size_in_an_order_that_fits() {
        let (mut services, publisher) = setup();
        for last in 20..30 {
            let server = RealServerSpec::new(
                Ipv4Addr::new(10, 0, 0, last),
                8080,
                1,
                crate::model::ForwardMode::FullNat,
            );
            services.table.add_server(http(), server).unwrap();
        }
        services
            .table
            .set_sched_params(http(), Default::default(), Some(7))
            .unwrap();
        let servers = services.table.get(http()).unwrap().real_servers.len();
        assert_eq!(servers, 11);
        for (scheduler, size) in [(SchedulerKind::Mh, 13), (SchedulerKind::Rr, 7)] {
            // The desired table itself is built in the order that fits.
            let mut desired = services.table.clone();
            let resize = |t: &mut crate::service::ServiceTable| {
                t.set_sched_params(http(), Default::default(), Some(size))
            };
            if scheduler == SchedulerKind::Mh {
                resize(&mut desired).unwrap();
            }
            desired.edit_service(http(), scheduler, None).unwrap();
            resize(&mut desired).unwrap();
            let requests = diff(&services.table, &desired).unwrap();
            call(
                &mut services,
                &publisher,
                Request::Batch {
                    requests,
                    replace: false,
                },
            )
            .unwrap();
            let s = services.table.get(http()).unwrap();
            assert_eq!((s.scheduler, s.mh_table_size), (scheduler, size));
        }
    }
}
