//! Immutable configuration snapshots and their RCU-style publication to workers.
//!
//! The management core edits a [`ServiceTable`], builds a [`Snapshot`] from it and
//! [`publish`](SnapshotPublisher::publish)es it. Each worker owns a [`SnapshotReader`]
//! and calls [`refresh`](SnapshotReader::refresh) once per RX burst, then reads
//! [`current`](SnapshotReader::current) for every packet of the burst.
//!
//! **Cost per packet: none.** `current` is a plain reference to the reader's own `Arc`.
//! **Cost per burst:** one relaxed atomic load of the published generation, compared
//! with the reader's cached copy. Only when they differ (once per configuration change)
//! does the reader take the publisher's mutex, for as long as it takes to clone an
//! `Arc`. The mutex is therefore touched by each worker once per change, never per
//! packet, and the publisher holds it only for a pointer swap.
//!
//! **Visibility bound.** A change is seen by a worker at its first `refresh` after the
//! generation store becomes visible to its core, i.e. within one burst: a burst takes
//! microseconds, so new sessions use the new configuration microseconds after
//! `publish` returns. Packets already inside the current burst finish with the old
//! snapshot. A worker that polls an idle queue still loops, so it refreshes too.
//!
//! **No torn reads.** A snapshot is never mutated after it is built; a reader holds
//! either the old `Arc` or the new one, never a mixture.
//!
//! **Freed by the publisher.** The publisher keeps every snapshot it replaced until no
//! reader holds it, and frees it in [`SnapshotPublisher::reap`] (also called by each
//! publish), so a worker letting go of the old snapshot only decrements a count. A
//! snapshot of a large table is many allocations (a list per service, a route list per
//! NAT real server); freed by the last worker to adopt, they stalled that worker's
//! forwarding for as long as the frees took. The cost is memory: a replaced snapshot
//! lives until the publisher's next `reap` after the last worker adopted its
//! successor.
use crate::model::Protocol;
use crate::model::SchedulerKind;
use crate::model::{ForwardMode, Service, ServiceKey};
use crate::sched::Maglev;
use crate::service::admission::Admission;
use crate::service::table::ServiceTable;
use crate::session::Timeouts;
use crossbeam::utils::CachePadded;
use hashbrown::HashMap;
use parking_lot::Mutex;
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Real server id -> (service index, position in the service's list).
pub type LoadPositions = HashMap<u32, (u32, u32)>;

/// One immutable view of every virtual service, as the workers read it.
#[derive(Debug)]
pub struct Snapshot {
    generation: u64,
    services: Vec<Service>,
    by_key: HashMap<ServiceKey, usize>,
    /// Sorted and deduplicated, for [`Snapshot::is_vip`].
    vips: Vec<Ipv4Addr>,
    /// The IPv6 ones, for [`Snapshot::is_vip6`].
    vips6: Vec<Ipv6Addr>,
    /// Every service's FullNAT local addresses, sorted and deduplicated, for
    /// [`Snapshot::is_local_address`].
    local_addresses: Vec<Ipv4Addr>,
    local_addresses6: Vec<Ipv6Addr>,
    /// Every service's real servers' addresses (sorry servers included), sorted and
    /// deduplicated, for [`Snapshot::is_real_server`]: the only sources whose answers
    /// to the health checker's probes are handed to the management core.
    real_servers: Vec<Ipv4Addr>,
    real_servers6: Vec<Ipv6Addr>,
    /// Ids of the real servers in the table (sorry servers included) that health
    /// checking has not evicted, sorted: a SYN on a session of any other opens a new
    /// connection elsewhere ([`Snapshot::keeps_real_server`]).
    kept_real_ids: Vec<u32>,
    /// Per service (same index): the positions of the servers its scheduler leaves
    /// out ([`Snapshot::scheduler_params`]), worked out here once rather than by
    /// every worker at every adoption (a search of `kept_real_ids` per server).
    withdrawn: Vec<Vec<usize>>,
    /// (service id, index in `services`), sorted by id: a session names its service
    /// by id, and a worker's housekeeping finds it by binary search, not a scan.
    by_id: Vec<(u32, u32)>,
    /// NAT real servers (protocol, address, port) -> the services (VIP, port) they
    /// serve in NAT mode: a reply from one names its client but not the VIP, and the
    /// VIP is what the owner worker's RSS hash used.
    nat_reply_services: HashMap<(Protocol, IpAddr, u16), ServedBy>,
    /// Session timeouts (`ipvsadm --set`), when the publisher sets them; workers keep
    /// their start-up timeouts otherwise.
    timeouts: Option<Timeouts>,
    /// Per service (same index): a number that names its scheduler's inputs (the
    /// scheduler, its real servers as scheduled, the Maglev table size, the flags and
    /// the servers it leaves out). A service whose inputs equal those in the snapshot
    /// this one was built from keeps that snapshot's number; any other gets one never
    /// handed out before ([`Snapshot::scheduling_version`]). Equal inputs are equal
    /// transitively, so a worker that skipped snapshots in between can still keep
    /// the scheduler it built for the same number.
    scheduling: Vec<u64>,
    /// Where each real server of a service whose loads are tracked (its scheduler
    /// [tracks loads](crate::sched::tracks_loads), or a server has an upper
    /// connection threshold) sits: id -> (service index, position). Mapped here once
    /// and shared by every worker's load view, rather than by each worker at each
    /// adoption (a hash insert per real server).
    load_positions: Arc<LoadPositions>,
    /// Per service (same index): the Maglev table of an mh service, built here, on
    /// the management core, so workers adopt it without a millisecond-long build.
    maglev: Vec<Option<Arc<Maglev>>>,
    /// Per service (same index): answer a new TCP connection with an RST when no real
    /// server can take it (health checking's `all_down = "rst"`).
    reset_when_down: Vec<bool>,
    /// Per service (same index): its access list and rate limit, when it has any;
    /// the table's compiled `Arc`, shared by every snapshot until the rules change.
    admission: Vec<Option<Arc<Admission>>>,
    /// Whether this node answers ARP and ping for the VIPs and local addresses: always,
    /// unless VRRP makes it a backup.
    serving_vips: bool,
    /// VRRP's virtual addresses besides VIPs and local addresses (the NAT real servers'
    /// gateway), answered like them while serving.
    extra_addresses: Vec<Ipv4Addr>,
}

impl Snapshot {
    /// The configuration before any service exists (generation 0).
    pub fn empty() -> Self {
        Snapshot::from_services(0, Vec::new())
    }

    /// A snapshot of everything in `table`, in the table's order. Use a generation
    /// larger than the last one published, e.g. [`ServiceTable::version`].
    pub fn build(generation: u64, table: &ServiceTable) -> Self {
        Snapshot::build_with(generation, table, &HealthOverlay::default(), &[])
    }

    /// As [`Snapshot::build`], with health checking's view laid over the table:
    /// evicted real servers are scheduled as if they weighed 0 (the table keeps their
    /// weight: eviction and weight stay separate), and the services that reset new TCP
    /// connections when no server can take them are marked. `departed` are NAT real
    /// servers no longer in the table whose sessions may still be live: their replies
    /// must still find their owner worker (removed real servers keep their sessions).
    pub fn build_with(
        generation: u64,
        table: &ServiceTable,
        health: &HealthOverlay,
        departed: &[NatRoute],
    ) -> Self {
        Snapshot::build_reusing(generation, table, health, departed, None)
    }

    /// As [`Snapshot::build_with`], taking from `previous` the Maglev table of each mh
    /// service whose servers (as scheduled: weights, evictions, order), table size and
    /// flags did not change (the same [`Snapshot::scheduling_version`], which also
    /// asks for the same service id and servers left out), instead of
    /// building it again: a Maglev table of M slots costs O(M) to build (M is 65537 by
    /// default), so with hundreds of mh services a change to one of them rebuilt them
    /// all, for hundreds of milliseconds on the management core. Comparing costs
    /// O(servers) per service, once for the version.
    pub fn build_reusing(
        generation: u64,
        table: &ServiceTable,
        health: &HealthOverlay,
        departed: &[NatRoute],
        previous: Option<&Snapshot>,
    ) -> Self {
        let services = table.services().map(|s| pool(s, health)).collect();
        let mut snap =
            Snapshot::from_services_reusing(generation, services, &health.evicted, previous)
                .with_departed_nat(departed.iter().copied());
        snap.reset_when_down = snap
            .services
            .iter()
            .map(|s| health.reset_when_down.contains(&s.key))
            .collect();
        snap.admission = snap
            .services
            .iter()
            .map(|s| {
                let rules = table.admission(s.key).filter(|r| !r.is_empty())?;
                Some(rules.compiled(s.id))
            })
            .collect();
        snap
    }

    /// A snapshot of `services` as given. Keys are expected to be unique (as a
    /// [`ServiceTable`] guarantees); if one repeats, lookups find its first occurrence.
    pub fn from_services(generation: u64, services: Vec<Service>) -> Self {
        Snapshot::from_services_reusing(generation, services, &Default::default(), None)
    }

    /// As [`Snapshot::from_services`], with the `evicted` real servers no longer kept,
    /// reusing `previous`'s unchanged Maglev tables ([`Snapshot::build_reusing`]) and
    /// scheduling versions.
    fn from_services_reusing(
        generation: u64,
        services: Vec<Service>,
        evicted: &std::collections::HashSet<u32>,
        previous: Option<&Snapshot>,
    ) -> Self {
        let mut by_key = HashMap::with_capacity(services.len());
        for (index, service) in services.iter().enumerate() {
            by_key.entry(service.key).or_insert(index);
        }
        let (vips, vips6) = split_families(services.iter().map(|s| s.key.vip));
        let (local_addresses, local_addresses6) = split_families(
            services
                .iter()
                .flat_map(|s| s.local_addresses.iter().copied()),
        );
        let (real_servers, real_servers6) = split_families(
            services
                .iter()
                .flat_map(|s| s.real_servers.iter().map(|r| r.ip)),
        );
        let mut kept_real_ids: Vec<u32> = services
            .iter()
            .flat_map(|s| s.real_servers.iter().map(|r| r.id))
            .collect();
        kept_real_ids.sort_unstable();
        kept_real_ids.dedup();
        if !evicted.is_empty() {
            kept_real_ids.retain(|id| !evicted.contains(id));
        }
        let mut by_id: Vec<(u32, u32)> = services
            .iter()
            .enumerate()
            .map(|(index, s)| (s.id, index as u32))
            .collect();
        by_id.sort_unstable();
        // Sized first: grown insert by insert, a table of 50,000 NAT real servers was
        // rehashed a dozen times at every publish.
        let nat_servers = services.iter().flat_map(|s| &s.real_servers);
        let nat_servers = nat_servers.filter(|r| r.mode == ForwardMode::Nat).count();
        let mut nat_reply_services = HashMap::with_capacity(nat_servers);
        for s in &services {
            for rs in s.real_servers.iter().filter(|r| r.mode == ForwardMode::Nat) {
                let key = (s.key.proto, rs.ip, rs.port);
                ServedBy::add(&mut nat_reply_services, key, (s.key.vip, s.key.port));
            }
        }
        let tracked = |s: &Service| {
            crate::sched::tracks_loads(s.scheduler) || s.real_servers.iter().any(|r| r.upper > 0)
        };
        let tracked_servers = services.iter().filter(|s| tracked(s));
        let tracked_servers = tracked_servers.map(|s| s.real_servers.len()).sum();
        let mut load_positions = LoadPositions::with_capacity(tracked_servers);
        for (index, s) in services.iter().enumerate() {
            if tracked(s) {
                for (position, r) in s.real_servers.iter().enumerate() {
                    load_positions.insert(r.id, (index as u32, position as u32));
                }
            }
        }
        let mut snap = Snapshot {
            maglev: Vec::new(),
            generation,
            services,
            by_key,
            vips,
            vips6,
            local_addresses,
            local_addresses6,
            real_servers,
            real_servers6,
            kept_real_ids,
            withdrawn: Vec::new(),
            scheduling: Vec::new(),
            load_positions: Arc::new(load_positions),
            by_id,
            nat_reply_services,
            timeouts: None,
            reset_when_down: Vec::new(),
            admission: Vec::new(),
            serving_vips: true,
            extra_addresses: Vec::new(),
        };
        snap.withdrawn = snap.withdrawn_servers();
        snap.scheduling = snap.scheduling_versions(previous);
        snap.maglev = snap.maglev_tables(previous);
        snap
    }

    /// Every mh service's Maglev table: `previous`'s when the service's scheduling
    /// version is the same (its servers as scheduled, table size and flags did not
    /// change), else built again.
    fn maglev_tables(&self, previous: Option<&Snapshot>) -> Vec<Option<Arc<Maglev>>> {
        (self.services.iter().enumerate())
            .map(|(index, s)| {
                if s.scheduler != SchedulerKind::Mh {
                    return None;
                }
                let kept = previous.and_then(|p| {
                    let before = *p.by_key.get(&s.key)?;
                    let same = p.scheduling_version(before) == self.scheduling_version(index);
                    same.then(|| p.maglev(before).cloned()).flatten()
                });
                kept.or_else(|| {
                    Maglev::new(&s.real_servers, s.mh_table_size, s.sched_flags)
                        .ok()
                        .map(Arc::new)
                })
            })
            .collect()
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// All services; a service's position here is its index for [`Snapshot::find_index`]
    /// (workers can keep per-service state, such as schedulers, in a parallel `Vec`).
    pub fn services(&self) -> &[Service] {
        &self.services
    }

    /// The IPv4 virtual addresses of all services, sorted, each once.
    pub fn vips(&self) -> &[Ipv4Addr] {
        &self.vips
    }

    /// The IPv6 virtual addresses of all services, sorted, each once.
    pub fn vips6(&self) -> &[Ipv6Addr] {
        &self.vips6
    }

    /// The IPv4 FullNAT local addresses of all services, sorted, each once (a local
    /// address may serve several services).
    pub fn local_addresses(&self) -> &[Ipv4Addr] {
        &self.local_addresses
    }

    /// The IPv6 FullNAT local addresses of all services, sorted, each once.
    pub fn local_addresses6(&self) -> &[Ipv6Addr] {
        &self.local_addresses6
    }

    #[inline]
    pub fn find(&self, key: &ServiceKey) -> Option<&Service> {
        self.find_index(key).map(|index| &self.services[index])
    }

    #[inline]
    pub fn find_index(&self, key: &ServiceKey) -> Option<usize> {
        self.by_key.get(key).copied()
    }

    /// The service numbered `id` (ids are unique; a repeated one finds the first
    /// in table order). A binary search.
    pub fn by_id(&self, id: u32) -> Option<&Service> {
        let at = self.by_id.partition_point(|&(i, _)| i < id);
        match self.by_id.get(at) {
            Some(&(i, index)) if i == id => self.services.get(index as usize),
            _ => None,
        }
    }

    /// Whether `addr` is the VIP of some service (on any protocol or port), e.g. to
    /// answer ARP and ICMP echo for it.
    #[inline]
    pub fn is_vip(&self, addr: Ipv4Addr) -> bool {
        self.vips.binary_search(&addr).is_ok()
    }

    /// Whether `addr` is a FullNAT local address of some service, e.g. to answer ARP
    /// for it and to recognise real servers' replies.
    #[inline]
    pub fn is_local_address(&self, addr: Ipv4Addr) -> bool {
        self.local_addresses.binary_search(&addr).is_ok()
    }

    /// Whether `addr` is the IPv6 VIP of some service.
    #[inline]
    pub fn is_vip6(&self, addr: Ipv6Addr) -> bool {
        self.vips6.binary_search(&addr).is_ok()
    }

    /// Whether `addr` is an IPv6 FullNAT local address of some service.
    #[inline]
    pub fn is_local_address6(&self, addr: Ipv6Addr) -> bool {
        self.local_addresses6.binary_search(&addr).is_ok()
    }

    /// Whether real server `id` is still in the table and not evicted by health
    /// checking. Its sessions carry on either way; a client's SYN on one that is not
    /// (its retransmission, or a new connection from a reused port) is better sent to
    /// a server that can answer, as IPVS's `expire_nodest_conn` does.
    #[inline]
    pub fn keeps_real_server(&self, id: u32) -> bool {
        self.kept_real_ids.binary_search(&id).is_ok()
    }

    /// What service `index`'s scheduler is built with, for worker `seed`: the
    /// service's parameters and the servers its pool keeps only for their sessions
    /// ([`SchedulerParams::withdrawn`](crate::sched::SchedulerParams)): the sorry
    /// server while not in use, and those health checking evicted, unless the
    /// service is sh with `sh-fallback`. Withdrawing a server moves every bucket after
    /// it (sh and dh do not hash consistently), so most clients change server; with
    /// `sh-fallback` an evicted server keeps its buckets, whose clients fall back to
    /// another server while the rest stay where they were. Without it those clients
    /// would be refused: better moved.
    pub fn scheduler_params(&self, index: usize, seed: u64) -> crate::sched::SchedulerParams {
        let Some(service) = self.services.get(index) else {
            return crate::sched::SchedulerParams {
                seed,
                ..Default::default()
            };
        };
        let mut params = crate::sched::SchedulerParams::for_service(service, seed);
        params.withdrawn = self.withdrawn.get(index).cloned().unwrap_or_default();
        params
    }

    /// Where the real servers whose loads are tracked sit (see the field's docs).
    pub fn load_positions(&self) -> &Arc<LoadPositions> {
        &self.load_positions
    }

    /// The number that names service `index`'s scheduler inputs: equal in two
    /// snapshots only when the service (same id) would get the same scheduler from
    /// both, so a worker keeps the one it has (and its state: a round-robin's place,
    /// a least-connection index's loads) instead of building it again. 0 for an
    /// index out of range.
    #[inline]
    pub fn scheduling_version(&self, index: usize) -> u64 {
        self.scheduling.get(index).copied().unwrap_or(0)
    }

    /// Every service's [`Snapshot::scheduling_version`]: `previous`'s for a service
    /// whose inputs did not change since it, a fresh one otherwise. Comparing costs
    /// O(servers) per service, on the management core; it spares every worker
    /// rebuilding the scheduler of every service at every change to one of them.
    fn scheduling_versions(&self, previous: Option<&Snapshot>) -> Vec<u64> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        (self.services.iter().enumerate())
            .map(|(index, s)| {
                let unchanged = |p: &Snapshot| {
                    let before_index = *p.by_key.get(&s.key)?;
                    let before = &p.services[before_index];
                    let same = before.id == s.id
                        && before.scheduler == s.scheduler
                        && before.mh_table_size == s.mh_table_size
                        && before.sched_flags == s.sched_flags
                        && before.real_servers == s.real_servers
                        && p.withdrawn.get(before_index) == self.withdrawn.get(index);
                    same.then(|| p.scheduling_version(before_index))
                };
                previous
                    .and_then(unchanged)
                    .unwrap_or_else(|| NEXT.fetch_add(1, Ordering::Relaxed))
            })
            .collect()
    }

    /// Every service's [`Snapshot::withdrawn`], from `kept_real_ids`.
    fn withdrawn_servers(&self) -> Vec<Vec<usize>> {
        (self.services.iter())
            .map(|service| {
                let sorry = service.sorry_server.map(|s| s.id);
                let falls_back = service.scheduler == crate::model::SchedulerKind::Sh
                    && service.sched_flags.sh_fallback;
                (service.real_servers.iter())
                    .enumerate()
                    .filter(|(_, r)| {
                        let idle_sorry = Some(r.id) == sorry && r.weight == 0;
                        idle_sorry || (!falls_back && !self.keeps_real_server(r.id))
                    })
                    .map(|(i, _)| i)
                    .collect()
            })
            .collect()
    }

    /// Every service's IPv4 real servers, sorted, each once.
    pub fn real_servers_v4(&self) -> &[Ipv4Addr] {
        &self.real_servers
    }

    /// Every service's IPv6 real servers, sorted, each once.
    pub fn real_servers_v6(&self) -> &[Ipv6Addr] {
        &self.real_servers6
    }

    /// Whether `addr` is a real server of some service (on any protocol or port).
    #[inline]
    pub fn is_real_server(&self, addr: IpAddr) -> bool {
        match addr {
            IpAddr::V4(a) => self.real_servers.binary_search(&a).is_ok(),
            IpAddr::V6(a) => self.real_servers6.binary_search(&a).is_ok(),
        }
    }
}

/// Service `s` as the workers schedule it: evicted real servers at weight 0 and,
/// when it has a sorry server, that server last, at weight 1 while no other can take
/// a new connection and 0 otherwise. Being always there, the sorry server's sessions
/// keep their real server (counters, NAT reply routing) after the others come back;
/// every scheduler sees it as an ordinary real server.
fn pool(s: &Service, health: &HealthOverlay) -> Service {
    let mut s = s.clone();
    for rs in s.real_servers.iter_mut() {
        if health.evicted.contains(&rs.id) {
            rs.weight = 0;
        }
    }
    if let Some(sorry) = s.sorry_server {
        let in_use = s.sorry_in_use(&s.real_servers);
        s.real_servers.push(sorry.as_real_server(in_use));
    }
    s
}

/// The IPv4 and the IPv6 addresses of `addrs`, each sorted and deduplicated.
fn split_families(addrs: impl Iterator<Item = IpAddr>) -> (Vec<Ipv4Addr>, Vec<Ipv6Addr>) {
    let (mut v4, mut v6) = (Vec::new(), Vec::new());
    for addr in addrs {
        match addr {
            IpAddr::V4(a) => v4.push(a),
            IpAddr::V6(a) => v6.push(a),
        }
    }
    // By the address as a number: the same order, without a `memcmp` call per compare
    // (50,000 real servers are sorted at every publish).
    v4.sort_unstable_by_key(|a| a.to_bits());
    v4.dedup();
    v6.sort_unstable_by_key(|a| a.to_bits());
    v6.dedup();
    (v4, v6)
}

/// A NAT real server of a service, as the workers need it to send the server's
/// replies to the worker owning their session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct NatRoute {
    pub proto: Protocol,
    pub real_ip: IpAddr,
    pub real_port: u16,
    pub vip: IpAddr,
    pub vport: u16,
}

/// Health checking's part of a snapshot (see [`Snapshot::build_with_health`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HealthOverlay {
    /// Ids of evicted real servers.
    pub evicted: std::collections::HashSet<u32>,
    /// Services whose new TCP connections get an RST when no real server can take them.
    pub reset_when_down: std::collections::HashSet<ServiceKey>,
}

impl Snapshot {
    /// Whether a new TCP connection to service `index` that no real server can take is
    /// answered with an RST (rather than dropped).
    #[inline]
    pub fn resets_when_down(&self, index: usize) -> bool {
        self.reset_when_down.get(index).copied().unwrap_or(false)
    }

    /// The same snapshot with VRRP's say on the VIPs: a backup does not answer for them.
    pub fn with_serving_vips(mut self, serving: bool) -> Self {
        self.serving_vips = serving;
        self
    }

    /// Whether this node answers ARP and ping for the VIPs and local addresses.
    pub fn serving_vips(&self) -> bool {
        self.serving_vips
    }

    /// The same snapshot with VRRP's extra virtual addresses.
    pub fn with_extra_addresses(mut self, addresses: &[Ipv4Addr]) -> Self {
        self.extra_addresses = addresses.to_vec();
        self
    }

    /// VRRP's extra virtual addresses (answered while serving the VIPs).
    pub fn extra_addresses(&self) -> &[Ipv4Addr] {
        &self.extra_addresses
    }

    /// The same snapshot carrying session timeouts for the workers to adopt.
    pub fn with_timeouts(mut self, timeouts: Timeouts) -> Self {
        self.timeouts = Some(timeouts);
        self
    }

    pub fn timeouts(&self) -> Option<&Timeouts> {
        self.timeouts.as_ref()
    }

    /// The access list and rate limit of service `index`, when it has any.
    #[inline]
    pub fn admission(&self, index: usize) -> Option<&Admission> {
        self.admission.get(index)?.as_deref()
    }

    /// The prebuilt Maglev table of service `index`, when it uses mh.
    pub fn maglev(&self, index: usize) -> Option<&Arc<Maglev>> {
        self.maglev.get(index)?.as_ref()
    }

    /// The same snapshot also routing the replies of `departed`, NAT real servers no
    /// longer in the table whose sessions may still be live.
    pub fn with_departed_nat(mut self, departed: impl IntoIterator<Item = NatRoute>) -> Self {
        for route in departed {
            let key = (route.proto, route.real_ip, route.real_port);
            ServedBy::add(&mut self.nat_reply_services, key, (route.vip, route.vport));
        }
        self
    }

    /// The NAT routes of `previous`'s services that this snapshot's services no longer
    /// have: every one of a service gone, and those of a changed service (another
    /// [`Snapshot::scheduling_version`]) that are no longer among its NAT real servers.
    /// A service with the same scheduling version has the same real servers, so its
    /// routes are not looked at: a change to one service among 50,000 NAT real servers
    /// checks that service's. Routes `previous` held only as departed ones are not
    /// listed. Call before laying departed routes over this snapshot
    /// ([`Snapshot::with_departed_nat`]): one laid over counts as still routed.
    pub fn nat_routes_gone_since<'a>(
        &'a self,
        previous: &'a Snapshot,
    ) -> impl Iterator<Item = NatRoute> + 'a {
        let changed = move |(before, s): &(usize, &Service)| {
            let now = self.by_key.get(&s.key);
            now.is_none_or(|&i| self.scheduling_version(i) != previous.scheduling_version(*before))
        };
        (previous.services.iter().enumerate())
            .filter(changed)
            .flat_map(|(_, s)| {
                (s.real_servers.iter())
                    .filter(|r| r.mode == ForwardMode::Nat)
                    .map(move |r| NatRoute {
                        proto: s.key.proto,
                        real_ip: r.ip,
                        real_port: r.port,
                        vip: s.key.vip,
                        vport: s.key.port,
                    })
            })
            .filter(move |route| !self.routes_nat(route))
    }

    /// Whether the replies of `route`'s real server are routed for its service.
    pub fn routes_nat(&self, route: &NatRoute) -> bool {
        self.nat_reply_services(route.proto, route.real_ip, route.real_port)
            .contains(&(route.vip, route.vport))
    }

    /// The services (VIP, port) for which `proto` `addr:port` is a NAT real server, in
    /// snapshot order; empty for any other address.
    pub fn nat_reply_services(
        &self,
        proto: Protocol,
        addr: impl Into<IpAddr>,
        port: u16,
    ) -> &[(IpAddr, u16)] {
        self.nat_reply_services
            .get(&(proto, addr.into(), port))
            .map_or(&[], ServedBy::as_slice)
    }
}

/// The services (VIP, port) a NAT real server serves. Nearly every real server serves
/// one, held in place: a snapshot of 50,000 NAT real servers then makes no vector for
/// each (and the management core frees none when the snapshot is replaced).
#[derive(Clone, Debug)]
enum ServedBy {
    One((IpAddr, u16)),
    Many(Vec<(IpAddr, u16)>),
}

impl ServedBy {
    fn as_slice(&self) -> &[(IpAddr, u16)] {
        match self {
            ServedBy::One(service) => std::slice::from_ref(service),
            ServedBy::Many(services) => services,
        }
    }

    /// Adds `service` to `key`'s, once, in order.
    fn add(
        map: &mut HashMap<(Protocol, IpAddr, u16), ServedBy>,
        key: (Protocol, IpAddr, u16),
        service: (IpAddr, u16),
    ) {
        match map.entry(key) {
            hashbrown::hash_map::Entry::Vacant(e) => {
                e.insert(ServedBy::One(service));
            }
            hashbrown::hash_map::Entry::Occupied(mut e) => {
                let served = e.get_mut();
                match served {
                    ServedBy::One(first) if *first != service => {
                        *served = ServedBy::Many(vec![*first, service]);
                    }
                    ServedBy::Many(services) if !services.contains(&service) => {
                        services.push(service)
                    }
                    _ => {}
                }
            }
        }
    }
}

impl Default for Snapshot {
    fn default() -> Self {
        Snapshot::empty()
    }
}

/// `publish` was given a snapshot whose generation is not newer than the current one;
/// readers compare generations, so they would never pick it up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StaleGeneration {
    pub current: u64,
    pub offered: u64,
}

impl fmt::Display for StaleGeneration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "snapshot generation {} is not newer than the published generation {}",
            self.offered, self.current
        )
    }
}

impl std::error::Error for StaleGeneration {}

/// State shared by the publisher and its readers.
struct Shared {
    /// Read by every worker once per burst and written once per change: its own cache
    /// line, so the mutex's lock word changing does not evict it from the readers.
    generation: CachePadded<AtomicU64>,
    current: Mutex<Arc<Snapshot>>,
}

/// The management side: swaps in new snapshots.
pub struct SnapshotPublisher {
    shared: Arc<Shared>,
    /// Snapshots replaced while some reader still held them, freed by [`Self::reap`].
    retired: Mutex<Vec<Arc<Snapshot>>>,
}

impl SnapshotPublisher {
    pub fn new(initial: Snapshot) -> Self {
        SnapshotPublisher {
            shared: Arc::new(Shared {
                generation: CachePadded::new(AtomicU64::new(initial.generation)),
                current: Mutex::new(Arc::new(initial)),
            }),
            retired: Mutex::new(Vec::new()),
        }
    }

    /// Frees the replaced snapshots no reader holds any more, here rather than on the
    /// worker that lets go last. Call it after the workers adopted a publish and now
    /// and then; returns how many are still held.
    pub fn reap(&self) -> usize {
        let mut retired = self.retired.lock();
        // Only the current snapshot is ever handed out again: a count of one on a
        // replaced one is final.
        retired.retain(|s| Arc::strong_count(s) > 1);
        retired.len()
    }

    /// Makes `snapshot` the current one; readers adopt it at their next `refresh`.
    /// Refused, changing nothing, unless its generation is newer than the current one.
    pub fn publish(&self, snapshot: Snapshot) -> Result<(), StaleGeneration> {
        let generation = snapshot.generation;
        let snapshot = Arc::new(snapshot);
        let previous = {
            let mut current = self.shared.current.lock();
            if generation <= current.generation {
                return Err(StaleGeneration {
                    current: current.generation,
                    offered: generation,
                });
            }
            let previous = std::mem::replace(&mut *current, snapshot);
            // Stored under the lock so the atomic never runs ahead of or behind the
            // snapshot a reader would find there. Relaxed is enough: the atomic is only
            // a "something changed" hint, and the snapshot itself is handed over
            // through the mutex, which orders the reads of its contents.
            self.shared.generation.store(generation, Ordering::Relaxed);
            previous
        };
        // Freed here, outside the lock, once no reader holds it.
        self.retired.lock().push(previous);
        self.reap();
        Ok(())
    }

    /// The generation to give the next snapshot when not using the table's version.
    pub fn next_generation(&self) -> u64 {
        self.generation() + 1
    }

    pub fn generation(&self) -> u64 {
        self.shared.current.lock().generation
    }

    /// The snapshot readers currently converge on.
    pub fn current(&self) -> Arc<Snapshot> {
        Arc::clone(&self.shared.current.lock())
    }

    /// A reader for one worker, starting at the current snapshot.
    pub fn reader(&self) -> SnapshotReader {
        let snapshot = self.current();
        SnapshotReader {
            shared: Arc::clone(&self.shared),
            cached_generation: snapshot.generation,
            snapshot,
            replaced: None,
        }
    }
}

impl Default for SnapshotPublisher {
    fn default() -> Self {
        SnapshotPublisher::new(Snapshot::empty())
    }
}

/// A worker's handle: its own `Arc` of the snapshot in use, replaced only by `refresh`.
pub struct SnapshotReader {
    shared: Arc<Shared>,
    snapshot: Arc<Snapshot>,
    cached_generation: u64,
    /// The snapshot the last adoption replaced, held until the worker has let go of
    /// what it derived from it ([`SnapshotReader::let_go_of_replaced`]): its schedulers
    /// share the old snapshot's Maglev tables, and the publisher, which frees
    /// snapshots, must stay their last holder.
    replaced: Option<Arc<Snapshot>>,
}

impl SnapshotReader {
    /// Adopts the published snapshot if it changed since the last call; returns whether
    /// it did (the worker then rebuilds anything derived from it, e.g. schedulers).
    /// Call once per burst; see the module documentation for the cost and the bound.
    #[inline]
    pub fn refresh(&mut self) -> bool {
        if self.shared.generation.load(Ordering::Relaxed) == self.cached_generation {
            return false;
        }
        self.adopt_published()
    }

    // Out of line: runs once per configuration change, keeps `refresh` small to inline.
    #[cold]
    #[inline(never)]
    fn adopt_published(&mut self) -> bool {
        let published = Arc::clone(&self.shared.current.lock());
        // The generation is taken from the snapshot itself, never from the atomic, so
        // cache and content always agree.
        self.cached_generation = published.generation;
        if Arc::ptr_eq(&published, &self.snapshot) {
            return false;
        }
        // Kept until `let_go_of_replaced` (or the next adoption); the publisher frees
        // it (SnapshotPublisher::reap). A reader letting go of a replaced snapshot
        // never frees it: the publisher holds every replaced snapshot until no
        // reader does.
        self.replaced = Some(std::mem::replace(&mut self.snapshot, published));
        true
    }

    /// Lets go of the snapshot the last adoption replaced, once nothing derived from
    /// it (a worker's schedulers) is left.
    pub fn let_go_of_replaced(&mut self) {
        self.replaced = None;
    }

    /// The snapshot in use; stable between two `refresh` calls.
    #[inline]
    pub fn current(&self) -> &Snapshot {
        &self.snapshot
    }

    /// The snapshot in use, to keep it alive beyond the next `refresh`.
    pub fn current_arc(&self) -> Arc<Snapshot> {
        Arc::clone(&self.snapshot)
    }
}

impl Clone for SnapshotReader {
    fn clone(&self) -> Self {
        SnapshotReader {
            shared: Arc::clone(&self.shared),
            snapshot: Arc::clone(&self.snapshot),
            cached_generation: self.cached_generation,
            replaced: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Protocol;
    use crate::model::SchedulerKind;
    use crate::model::{ForwardMode, RealServer, RealServerSpec};
    use std::sync::atomic::AtomicBool;

    fn key(vip_last: u8, port: u16) -> ServiceKey {
        ServiceKey::new(Protocol::Tcp, Ipv4Addr::new(198, 18, 1, vip_last), port)
    }

    #[test]
    fn health_overlay_schedules_evicted_servers_as_weight_0_and_marks_reset_services() {
        let mut table = ServiceTable::new();
        table
            .add_service(key(1, 80), SchedulerKind::Rr, None)
            .unwrap();
        table
            .add_service(key(1, 443), SchedulerKind::Rr, None)
            .unwrap();
        let spec = RealServerSpec::new(Ipv4Addr::new(10, 0, 0, 1), 80, 4, ForwardMode::Dr);
        let evicted = table.add_server(key(1, 80), spec).unwrap();
        let spec = RealServerSpec::new(Ipv4Addr::new(10, 0, 0, 2), 80, 2, ForwardMode::Dr);
        table.add_server(key(1, 80), spec).unwrap();
        let health = HealthOverlay {
            evicted: [evicted].into_iter().collect(),
            reset_when_down: [key(1, 443)].into_iter().collect(),
        };
        let snap = Snapshot::build_with(2, &table, &health, &[]);
        let weights: Vec<u32> = snap
            .find(&key(1, 80))
            .unwrap()
            .real_servers
            .iter()
            .map(|r| r.weight)
            .collect();
        assert_eq!(weights, vec![0, 2]);
        // The table keeps the configured weight.
        assert_eq!(table.get(key(1, 80)).unwrap().real_servers[0].weight, 4);
        let i80 = snap.find_index(&key(1, 80)).unwrap();
        let i443 = snap.find_index(&key(1, 443)).unwrap();
        assert!(!snap.resets_when_down(i80));
        assert!(snap.resets_when_down(i443));
        assert!(!Snapshot::build(3, &table).resets_when_down(i443));
    }

    /// The sorry server's weight in the snapshot: last in the pool, 1 only while no
    /// real server can take a new connection.
    #[test]
    fn the_sorry_server_takes_new_connections_only_while_no_real_server_can() {
        let mut table = ServiceTable::new();
        table
            .add_service(key(1, 80), SchedulerKind::Rr, None)
            .unwrap();
        let spec = |last, weight| {
            RealServerSpec::new(Ipv4Addr::new(10, 0, 0, last), 80, weight, ForwardMode::Nat)
        };
        let a = table.add_server(key(1, 80), spec(1, 3)).unwrap();
        let b = table.add_server(key(1, 80), spec(2, 1)).unwrap();
        let weights = |table: &ServiceTable, evicted: &[u32]| -> Vec<(u8, u32)> {
            let health = HealthOverlay {
                evicted: evicted.iter().copied().collect(),
                ..Default::default()
            };
            let snap = Snapshot::build_with(1, table, &health, &[]);
            let service = snap.find(&key(1, 80)).unwrap();
            service
                .real_servers
                .iter()
                .map(|r| (r.ipv4().octets()[3], r.weight))
                .collect()
        };
        // No sorry server: as before, every server evicted leaves nothing at weight > 0.
        assert_eq!(weights(&table, &[a, b]), [(1, 0), (2, 0)]);
        let sorry = crate::model::SorryServerSpec {
            ip: Ipv4Addr::new(10, 0, 0, 9).into(),
            port: 8080,
            mode: ForwardMode::Nat,
            inhibit: false,
        };
        table.set_sorry_server(key(1, 80), Some(sorry)).unwrap();
        // Regular servers up: the sorry server is in the pool at weight 0.
        assert_eq!(weights(&table, &[]), [(1, 3), (2, 1), (9, 0)]);
        assert_eq!(weights(&table, &[a]), [(1, 0), (2, 1), (9, 0)]);
        // All evicted: the sorry server takes the new connections.
        assert_eq!(weights(&table, &[a, b]), [(1, 0), (2, 0), (9, 1)]);
        // One back: the sorry server stops taking new ones (and stays, for its
        // sessions).
        assert_eq!(weights(&table, &[b]), [(1, 3), (2, 0), (9, 0)]);
        // Weights 0 (drained) count as down; evictions and weights together too.
        table.edit_server(key(1, 80), spec(1, 0)).unwrap();
        assert_eq!(weights(&table, &[]), [(1, 0), (2, 1), (9, 0)]);
        assert_eq!(weights(&table, &[b]), [(1, 0), (2, 0), (9, 1)]);
        table.edit_server(key(1, 80), spec(2, 0)).unwrap();
        assert_eq!(weights(&table, &[]), [(1, 0), (2, 0), (9, 1)]);
        // Every real server removed.
        for last in [1, 2] {
            table
                .delete_server(key(1, 80), Ipv4Addr::new(10, 0, 0, last).into(), 80)
                .unwrap();
        }
        assert_eq!(weights(&table, &[]), [(9, 1)]);
        // A server added back takes over.
        table.add_server(key(1, 80), spec(3, 2)).unwrap();
        assert_eq!(weights(&table, &[]), [(3, 2), (9, 0)]);
        // The sorry server's replies reach their owner worker (NAT).
        let snap = Snapshot::build(2, &table);
        assert_eq!(
            snap.nat_reply_services(Protocol::Tcp, Ipv4Addr::new(10, 0, 0, 9), 8080),
            &[(key(1, 80).vip, 80)]
        );
    }

    #[test]
    fn a_sorry_server_is_refused_as_a_real_server_and_keeps_its_id() {
        let mut table = ServiceTable::new();
        table
            .add_service(key(1, 80), SchedulerKind::Rr, None)
            .unwrap();
        let rs = RealServerSpec::new(Ipv4Addr::new(10, 0, 0, 1), 80, 1, ForwardMode::Dr);
        table.add_server(key(1, 80), rs).unwrap();
        let sorry = |last, port, mode| crate::model::SorryServerSpec {
            ip: Ipv4Addr::new(10, 0, 0, last).into(),
            port,
            mode,
            inhibit: false,
        };
        let version = table.version();
        for (bad, why) in [
            (
                sorry(1, 80, ForwardMode::Dr),
                "is both a real server and the sorry server",
            ),
            (
                sorry(9, 8080, ForwardMode::Dr),
                "only nat and fullnat can map ports",
            ),
        ] {
            let e = table.set_sorry_server(key(1, 80), Some(bad)).unwrap_err();
            assert!(e.to_string().contains(why), "{e}");
        }
        assert_eq!(table.version(), version, "nothing changed");
        table
            .set_sorry_server(key(1, 80), Some(sorry(9, 80, ForwardMode::Dr)))
            .unwrap();
        let id = table.get(key(1, 80)).unwrap().sorry_server.unwrap().id;
        let again = crate::model::SorryServerSpec {
            inhibit: true,
            ..sorry(9, 80, ForwardMode::Dr)
        };
        table.set_sorry_server(key(1, 80), Some(again)).unwrap();
        assert_eq!(table.get(key(1, 80)).unwrap().sorry_server.unwrap().id, id);
        let rs = RealServerSpec::new(Ipv4Addr::new(10, 0, 0, 9), 80, 1, ForwardMode::Dr);
        let e = table.add_server(key(1, 80), rs).unwrap_err();
        assert!(e.to_string().contains("sorry server"), "{e}");
        table.set_sorry_server(key(1, 80), None).unwrap();
        assert_eq!(table.get(key(1, 80)).unwrap().sorry_server, None);
    }

    #[test]
    fn build_indexes_services_and_vips() {
        let mut table = ServiceTable::new();
        for k in [key(2, 80), key(1, 443), key(1, 80)] {
            table.add_service(k, SchedulerKind::Rr, None).unwrap();
        }
        let udp = ServiceKey::new(Protocol::Udp, Ipv4Addr::new(198, 18, 1, 2), 80);
        table.add_service(udp, SchedulerKind::Rr, None).unwrap();
        let spec = RealServerSpec::new(Ipv4Addr::new(10, 0, 0, 1), 80, 4, ForwardMode::Dr);
        table.add_server(key(1, 80), spec).unwrap();

        let snap = Snapshot::build(table.version(), &table);
        assert_eq!(snap.generation(), table.version());
        assert_eq!(snap.services().len(), 4);
        assert_eq!(
            snap.vips(),
            &[Ipv4Addr::new(198, 18, 1, 1), Ipv4Addr::new(198, 18, 1, 2)]
        );
        assert!(snap.is_vip(Ipv4Addr::new(198, 18, 1, 2)));
        assert!(!snap.is_vip(Ipv4Addr::new(198, 18, 1, 3)));
        for service in snap.services() {
            assert_eq!(snap.find(&service.key), Some(service));
        }
        let index = snap.find_index(&key(1, 80)).unwrap();
        assert_eq!(snap.services()[index].real_servers[0].weight, 4);
        assert!(snap.find(&key(1, 8080)).is_none());
        assert!(snap
            .find(&ServiceKey::new(
                Protocol::Udp,
                Ipv4Addr::new(198, 18, 1, 1),
                80
            ))
            .is_none());
    }

    #[test]
    fn local_addresses_of_all_services_sorted_and_deduplicated() {
        let mut table = ServiceTable::new();
        for k in [key(1, 80), key(1, 443), key(2, 80)] {
            table.add_service(k, SchedulerKind::Rr, None).unwrap();
        }
        let lip = |last: u8| Ipv4Addr::new(198, 18, 0, last);
        table.add_laddr(key(1, 80), lip(52).into()).unwrap();
        table.add_laddr(key(1, 80), lip(50).into()).unwrap();
        table.add_laddr(key(1, 443), lip(51).into()).unwrap();
        table.add_laddr(key(1, 443), lip(50).into()).unwrap();
        let snap = Snapshot::build(table.version(), &table);
        assert_eq!(snap.local_addresses(), &[lip(50), lip(51), lip(52)]);
        assert!(snap.is_local_address(lip(51)));
        assert!(!snap.is_local_address(lip(53)));
        // VIPs are unchanged by local addresses, and the other way round.
        assert_eq!(
            snap.vips(),
            &[Ipv4Addr::new(198, 18, 1, 1), Ipv4Addr::new(198, 18, 1, 2)]
        );
        assert!(!snap.is_vip(lip(50)));
        assert!(!snap.is_local_address(Ipv4Addr::new(198, 18, 1, 1)));
        // Each service keeps its own list in the order it was added.
        assert_eq!(
            snap.find(&key(1, 80)).unwrap().local_addresses,
            vec![lip(52), lip(50)]
        );
        assert!(snap.find(&key(2, 80)).unwrap().local_addresses.is_empty());
    }

    #[test]
    fn a_snapshot_is_unaffected_by_later_table_edits() {
        let mut table = ServiceTable::new();
        table
            .add_service(key(1, 80), SchedulerKind::Rr, None)
            .unwrap();
        let snap = Snapshot::build(1, &table);
        table.delete_service(key(1, 80)).unwrap();
        assert!(snap.find(&key(1, 80)).is_some());
        assert!(snap.is_vip(Ipv4Addr::new(198, 18, 1, 1)));
    }

    #[test]
    fn empty_snapshot() {
        let snap = Snapshot::empty();
        assert_eq!(snap.generation(), 0);
        assert!(snap.services().is_empty() && snap.vips().is_empty());
        assert!(snap.local_addresses().is_empty());
        assert!(!snap.is_vip(Ipv4Addr::new(198, 18, 1, 1)));
    }

    /// A replaced snapshot is freed by the publisher's `reap` once no reader holds
    /// it, never by the reader that lets go of it last; a publish reaps too.
    #[test]
    fn the_publisher_frees_what_readers_let_go() {
        let publisher = SnapshotPublisher::default();
        let mut readers = [publisher.reader(), publisher.reader()];
        let first = Arc::downgrade(&publisher.current());
        publisher
            .publish(Snapshot::from_services(1, Vec::new()))
            .unwrap();
        assert!(readers[0].refresh());
        readers[0].let_go_of_replaced();
        assert_eq!(publisher.reap(), 1, "one reader still holds generation 0");
        assert!(first.upgrade().is_some());
        assert!(readers[1].refresh());
        // Held as the replaced snapshot until the reader lets go of it.
        assert_eq!(publisher.reap(), 1);
        readers[1].let_go_of_replaced();
        // The last reader let go: the snapshot is still there for the publisher.
        assert!(first.upgrade().is_some());
        assert_eq!(publisher.reap(), 0);
        assert!(first.upgrade().is_none(), "freed by reap");
        // A publish frees what no reader holds; a reader's next adoption lets go of
        // what it had not let go of.
        let second = Arc::downgrade(&publisher.current());
        publisher
            .publish(Snapshot::from_services(2, Vec::new()))
            .unwrap();
        for r in &mut readers {
            assert!(r.refresh());
        }
        publisher
            .publish(Snapshot::from_services(3, Vec::new()))
            .unwrap();
        assert!(second.upgrade().is_some(), "held as replaced");
        for r in &mut readers {
            assert!(r.refresh());
        }
        assert!(
            second.upgrade().is_some(),
            "the publisher frees it, not a reader"
        );
        publisher
            .publish(Snapshot::from_services(4, Vec::new()))
            .unwrap();
        assert!(second.upgrade().is_none(), "freed by the next publish");
        assert_eq!(
            publisher.reap(),
            2,
            "generation 2 held as replaced, 3 as current"
        );
    }

    #[test]
    fn reader_sees_a_publish_exactly_once() {
        let publisher = SnapshotPublisher::default();
        let mut reader = publisher.reader();
        assert!(!reader.refresh());
        assert_eq!(reader.current().generation(), 0);

        let mut table = ServiceTable::new();
        table
            .add_service(key(1, 80), SchedulerKind::Rr, None)
            .unwrap();
        publisher
            .publish(Snapshot::build(table.version(), &table))
            .unwrap();
        let held = reader.current_arc();
        assert!(reader.refresh());
        assert!(!reader.refresh());
        assert_eq!(reader.current().generation(), 1);
        assert!(reader.current().find(&key(1, 80)).is_some());
        // What the worker kept from before is still intact.
        assert_eq!(held.generation(), 0);
        assert!(held.services().is_empty());
        // A reader created now starts current.
        let mut late = publisher.reader();
        assert!(!late.refresh());
        assert_eq!(late.current().generation(), 1);
    }

    #[test]
    fn readers_skip_intermediate_generations() {
        let publisher = SnapshotPublisher::default();
        let mut reader = publisher.reader();
        for generation in 1..=5 {
            publisher
                .publish(Snapshot::from_services(generation, Vec::new()))
                .unwrap();
        }
        assert!(reader.refresh());
        assert_eq!(reader.current().generation(), 5);
        assert_eq!(publisher.generation(), 5);
        assert_eq!(publisher.next_generation(), 6);
    }

    #[test]
    fn stale_generations_are_refused_and_change_nothing() {
        let publisher = SnapshotPublisher::new(Snapshot::from_services(7, Vec::new()));
        let mut reader = publisher.reader();
        for offered in [7, 3] {
            let err = publisher
                .publish(Snapshot::from_services(offered, Vec::new()))
                .unwrap_err();
            assert_eq!(
                err,
                StaleGeneration {
                    current: 7,
                    offered
                }
            );
            assert!(err.to_string().contains("not newer"));
        }
        assert!(!reader.refresh());
        assert_eq!(publisher.current().generation(), 7);
    }

    #[test]
    fn reader_is_send() {
        fn assert_send<T: Send>() {}
        assert_send::<SnapshotReader>();
        assert_send::<SnapshotPublisher>();
        fn assert_sync<T: Sync>() {}
        assert_sync::<SnapshotPublisher>();
    }

    /// A snapshot whose every part encodes its generation: the number of services, the
    /// ports, the weights and the VIP set. A reader that saw parts of two snapshots
    /// would find a mismatch.
    fn coded_snapshot(generation: u64) -> Snapshot {
        let service_count = 1 + (generation % 7) as usize;
        let weight = (generation % 65536) as u32;
        let services = (0..service_count)
            .map(|i| Service {
                id: i as u32 + 1,
                key: key(1 + i as u8, 1000 + (generation % 50_000) as u16),
                scheduler: SchedulerKind::Wrr,
                persistence: None,
                real_servers: (0..3)
                    .map(|j| RealServer {
                        id: j + 1,
                        ip: Ipv4Addr::new(10, 0, i as u8, j as u8 + 1).into(),
                        port: 80,
                        weight,
                        mode: ForwardMode::Nat,
                        upper: 0,
                        lower: 0,
                    })
                    .collect(),
                local_addresses: vec![Ipv4Addr::new(198, 18, 0, 50 + i as u8).into()],
                toa: false,
                sched_flags: Default::default(),
                mh_table_size: crate::model::MH_DEFAULT_TABLE_SIZE,
                synproxy: crate::model::SynProxy::default(),
                sorry_server: None,
                sloppy_tcp: false,
            })
            .collect();
        Snapshot::from_services(generation, services)
    }

    fn assert_consistent(snap: &Snapshot) {
        let generation = snap.generation();
        let expected_services = 1 + (generation % 7) as usize;
        assert_eq!(snap.services().len(), expected_services, "gen {generation}");
        assert_eq!(snap.vips().len(), expected_services, "gen {generation}");
        assert_eq!(
            snap.local_addresses().len(),
            expected_services,
            "gen {generation}"
        );
        let port = 1000 + (generation % 50_000) as u16;
        for (i, service) in snap.services().iter().enumerate() {
            assert_eq!(service.key.port, port, "gen {generation}");
            assert_eq!(snap.find_index(&service.key), Some(i), "gen {generation}");
            assert!(snap.is_vip(service.key.vip4().unwrap()));
            for rs in &service.real_servers {
                assert_eq!(u64::from(rs.weight), generation % 65536, "gen {generation}");
            }
        }
    }

    #[test]
    fn concurrent_readers_never_see_a_half_applied_change() {
        const PUBLISHES: u64 = 5000;
        const READERS: usize = 4;
        let publisher = SnapshotPublisher::new(coded_snapshot(0));
        let done = Arc::new(AtomicBool::new(false));
        let readers: Vec<_> = (0..READERS)
            .map(|_| {
                let mut reader = publisher.reader();
                let done = Arc::clone(&done);
                std::thread::spawn(move || {
                    let mut last_generation = 0;
                    let (mut refreshes, mut changes) = (0u64, 0u64);
                    loop {
                        // Read `done` first so the final refresh below runs after the
                        // last publish.
                        let finished = done.load(Ordering::Acquire);
                        if reader.refresh() {
                            changes += 1;
                        }
                        refreshes += 1;
                        let snap = reader.current();
                        assert!(snap.generation() >= last_generation, "went backwards");
                        last_generation = snap.generation();
                        assert_consistent(snap);
                        if finished {
                            break;
                        }
                    }
                    (last_generation, refreshes, changes)
                })
            })
            .collect();

        for generation in 1..=PUBLISHES {
            publisher.publish(coded_snapshot(generation)).unwrap();
            if generation % 64 == 0 {
                std::thread::yield_now();
            }
        }
        done.store(true, Ordering::Release);

        for handle in readers {
            let (last, refreshes, changes) = handle.join().unwrap();
            assert_eq!(last, PUBLISHES, "a reader missed the final snapshot");
            assert!(changes >= 1 && changes <= refreshes);
        }
    }

    /// A NAT sorry server's replies are routed like a real server's (so its route
    /// departs when it is removed: `daemon::services`), a DR one's not at all; a
    /// departed route laid over a snapshot is routed again.
    #[test]
    fn nat_routes_include_a_nat_sorry_server() {
        let mut table = ServiceTable::new();
        table
            .add_service(key(1, 80), SchedulerKind::Rr, None)
            .unwrap();
        let rs = Ipv4Addr::new(10, 0, 0, 1);
        table
            .add_server(key(1, 80), RealServerSpec::new(rs, 80, 1, ForwardMode::Nat))
            .unwrap();
        let sorry = Ipv4Addr::new(10, 0, 0, 99);
        let route = |ip: Ipv4Addr, port| NatRoute {
            proto: Protocol::Tcp,
            real_ip: ip.into(),
            real_port: port,
            vip: key(1, 80).vip,
            vport: 80,
        };
        let set_sorry = |table: &mut ServiceTable, mode| {
            table
                .set_sorry_server(
                    key(1, 80),
                    Some(crate::model::SorryServerSpec {
                        ip: sorry.into(),
                        port: 80,
                        mode,
                        inhibit: false,
                    }),
                )
                .unwrap()
        };
        let routed = |snap: &Snapshot| [rs, sorry].map(|ip| snap.routes_nat(&route(ip, 80)));
        set_sorry(&mut table, ForwardMode::Nat);
        let nat = Snapshot::build(1, &table);
        assert_eq!(routed(&nat), [true, true]);
        // A DR sorry server needs no reply route.
        set_sorry(&mut table, ForwardMode::Dr);
        let dr = Snapshot::build_reusing(2, &table, &HealthOverlay::default(), &[], Some(&nat));
        assert_eq!(routed(&dr), [true, false]);
        let gone: Vec<NatRoute> = dr.nat_routes_gone_since(&nat).collect();
        assert_eq!(gone, [route(sorry, 80)]);
        // Laid over the snapshot, a departed route is routed again.
        assert_eq!(routed(&dr.with_departed_nat(gone)), [true, true]);
    }

    /// The routes a change takes away: a NAT real server removed or turned FullNAT, every
    /// one of a service deleted, none for a weight change or a service left alone,
    /// and a server two services share only for the service that lost it.
    #[test]
    fn nat_routes_gone_since_are_the_routes_the_change_took_away() {
        let mut table = ServiceTable::new();
        let nat = |last: u8, port: u16, weight: u32, mode: ForwardMode| {
            RealServerSpec::new(Ipv4Addr::new(10, 0, 0, last), port, weight, mode)
        };
        for port in [80, 81, 82] {
            table
                .add_service(key(1, port), SchedulerKind::Wlc, None)
                .unwrap();
            for last in [11, 12] {
                (table.add_server(key(1, port), nat(last, 8080, 1, ForwardMode::Nat))).unwrap();
            }
        }
        let route = |last: u8, vport: u16| NatRoute {
            proto: Protocol::Tcp,
            real_ip: Ipv4Addr::new(10, 0, 0, last).into(),
            real_port: 8080,
            vip: key(1, vport).vip,
            vport,
        };
        let mut generation = 1;
        let mut last = Snapshot::build(generation, &table);
        let mut next = |table: &ServiceTable| {
            generation += 1;
            let health = HealthOverlay::default();
            let snap = Snapshot::build_reusing(generation, table, &health, &[], Some(&last));
            let mut gone: Vec<NatRoute> = snap.nat_routes_gone_since(&last).collect();
            gone.sort_by_key(|r| (r.vport, r.real_ip));
            last = snap;
            gone
        };
        assert_eq!(next(&table), []);
        table
            .edit_server(key(1, 80), nat(11, 8080, 5, ForwardMode::Nat))
            .unwrap();
        assert_eq!(next(&table), [], "a weight");
        let ip = Ipv4Addr::new(10, 0, 0, 12).into();
        table.delete_server(key(1, 80), ip, 8080).unwrap();
        assert_eq!(
            next(&table),
            [route(12, 80)],
            "one of two services sharing it"
        );
        table
            .edit_server(key(1, 81), nat(11, 8080, 1, ForwardMode::FullNat))
            .unwrap();
        assert_eq!(next(&table), [route(11, 81)], "turned FullNAT");
        table.delete_service(key(1, 82)).unwrap();
        assert_eq!(
            next(&table),
            [route(11, 82), route(12, 82)],
            "a service deleted"
        );
        assert_eq!(next(&table), []);
    }

    /// sh and dh with an idle sorry server, or with a server health checking evicted,
    /// give their clients to the other servers; a server an operator set to weight 0
    /// keeps its bucket, as in IPVS.
    #[test]
    fn hashing_schedulers_leave_evicted_servers_and_an_idle_sorry_server_out() {
        use crate::sched::{self, PickContext};
        for kind in [SchedulerKind::Sh, SchedulerKind::Dh, SchedulerKind::Mh] {
            let mut table = ServiceTable::new();
            table.add_service(key(1, 80), kind, None).unwrap();
            let ids: Vec<u32> = (0..3u8)
                .map(|i| {
                    let spec = RealServerSpec::new(
                        Ipv4Addr::new(10, 0, 0, 11 + i),
                        80,
                        1,
                        ForwardMode::Dr,
                    );
                    table.add_server(key(1, 80), spec).unwrap()
                })
                .collect();
            let sorry = crate::model::SorryServerSpec {
                ip: Ipv4Addr::new(10, 0, 0, 99).into(),
                port: 80,
                mode: ForwardMode::Dr,
                inhibit: false,
            };
            table.set_sorry_server(key(1, 80), Some(sorry)).unwrap();
            // Each client's pick, by snapshot.
            let picks = |table: &ServiceTable, evicted: &[u32]| -> Vec<Option<usize>> {
                let health = HealthOverlay {
                    evicted: evicted.iter().copied().collect(),
                    ..Default::default()
                };
                let snap = Snapshot::build_with(1, table, &health, &[]);
                let servers = &snap.services()[0].real_servers;
                let mut s = sched::build_with(kind, servers, &snap.scheduler_params(0, 1));
                (0..10_000u32)
                    .map(|i| {
                        let client =
                            Ipv4Addr::from(0x6440_0000 | (i.wrapping_mul(0x9e37_79b1) >> 10));
                        let ctx = PickContext::new(client, 1024, &[]).with_destination(client);
                        s.pick(servers, &ctx)
                    })
                    .collect()
            };
            let all_up = picks(&table, &[]);
            assert!(all_up.iter().all(|p| matches!(p, Some(0..=2))), "{kind}");
            let one_down = picks(&table, &[ids[1]]);
            assert!(
                one_down.iter().all(|p| matches!(p, Some(0) | Some(2))),
                "{kind}"
            );
            assert!(one_down.iter().filter(|p| **p == Some(0)).count() > 3_000);
            assert!(one_down.iter().filter(|p| **p == Some(2)).count() > 3_000);
            // All evicted: the sorry server takes everyone.
            let all_down = picks(&table, &ids);
            assert!(all_down.iter().all(|p| *p == Some(3)), "{kind}");
            // An operator's weight 0 keeps its bucket in sh and dh: its clients get
            // no server (sh-fallback aside), as in IPVS.
            let spec = RealServerSpec::new(Ipv4Addr::new(10, 0, 0, 12), 80, 0, ForwardMode::Dr);
            table.edit_server(key(1, 80), spec).unwrap();
            let quiesced = picks(&table, &[]);
            let refused = quiesced.iter().filter(|p| p.is_none()).count();
            assert!(
                quiesced.iter().all(|p| *p != Some(1) && *p != Some(3)),
                "{kind}"
            );
            if kind == SchedulerKind::Mh {
                assert_eq!(refused, 0);
            } else {
                assert!((2_000..4_500).contains(&refused), "{kind}: {refused}");
            }
        }
    }

    /// sh with `sh-fallback`: an evicted server keeps its buckets, so its clients
    /// fall back to others and every other client keeps its server (withdrawing it
    /// would move most of them).
    #[test]
    fn sh_with_fallback_moves_only_an_evicted_servers_clients() {
        use crate::sched::{self, PickContext};
        let mut table = ServiceTable::new();
        table
            .add_service(key(1, 80), SchedulerKind::Sh, None)
            .unwrap();
        let ids: Vec<u32> = (0..10u8)
            .map(|i| {
                let ip = Ipv4Addr::new(10, 0, 0, 11 + i);
                let spec = RealServerSpec::new(ip, 80, 1, ForwardMode::Dr);
                table.add_server(key(1, 80), spec).unwrap()
            })
            .collect();
        table
            .set_sched_params(key(1, 80), "sh-fallback".parse().unwrap(), None)
            .unwrap();
        let picks = |evicted: &[u32]| -> Vec<Option<usize>> {
            let health = HealthOverlay {
                evicted: evicted.iter().copied().collect(),
                ..Default::default()
            };
            let snap = Snapshot::build_with(1, &table, &health, &[]);
            let servers = &snap.services()[0].real_servers;
            let mut s = sched::build_with(SchedulerKind::Sh, servers, &snap.scheduler_params(0, 1));
            (0..10_000u32)
                .map(|i| {
                    let client = Ipv4Addr::from(0x6440_0000 | (i.wrapping_mul(0x9e37_79b1) >> 10));
                    s.pick(servers, &PickContext::new(client, 1024, &[]))
                })
                .collect()
        };
        let before = picks(&[]);
        let after = picks(&[ids[3]]);
        let mut moved = 0;
        for (b, a) in before.iter().zip(&after) {
            assert!(a.is_some() && *a != Some(3), "{b:?} -> {a:?}");
            if *b != Some(3) {
                assert_eq!(a, b, "a client of a healthy server moved");
            } else {
                moved += 1;
            }
        }
        assert!(moved > 500, "{moved} clients of the evicted server");
    }

    /// A snapshot keeps the previous one's Maglev table for an mh service whose
    /// servers (as scheduled), table size and flags did not change, and builds the
    /// table again, the same as from scratch, for one whose did.
    #[test]
    fn unchanged_maglev_tables_are_reused_and_changed_ones_rebuilt() {
        let mut table = ServiceTable::new();
        for port in [80, 81] {
            table
                .add_service(key(1, port), SchedulerKind::Mh, None)
                .unwrap();
            for last in [11, 12] {
                let spec =
                    RealServerSpec::new(Ipv4Addr::new(10, 0, 0, last), port, 1, ForwardMode::Dr);
                table.add_server(key(1, port), spec).unwrap();
            }
        }
        let health = HealthOverlay::default();
        let first = Snapshot::build(1, &table);
        let reused = |before: &Snapshot, after: &Snapshot, port| {
            let (i, j) = (before.by_key[&key(1, port)], after.by_key[&key(1, port)]);
            Arc::ptr_eq(before.maglev(i).unwrap(), after.maglev(j).unwrap())
        };
        let same = |snap: &Snapshot, table: &ServiceTable, port| {
            let fresh = Snapshot::build(9, table);
            let (i, j) = (snap.by_key[&key(1, port)], fresh.by_key[&key(1, port)]);
            snap.maglev(i).unwrap().table() == fresh.maglev(j).unwrap().table()
        };
        let second = Snapshot::build_reusing(2, &table, &health, &[], Some(&first));
        assert!(reused(&first, &second, 80) && reused(&first, &second, 81));
        // A weight changes on :81: its table is rebuilt, :80's kept.
        let spec = RealServerSpec::new(Ipv4Addr::new(10, 0, 0, 12), 81, 5, ForwardMode::Dr);
        table.edit_server(key(1, 81), spec).unwrap();
        let third = Snapshot::build_reusing(3, &table, &health, &[], Some(&second));
        assert!(reused(&second, &third, 80) && !reused(&second, &third, 81));
        assert!(same(&third, &table, 80) && same(&third, &table, 81));
        // An eviction, a new table size, flags: rebuilt each time.
        let evicted = HealthOverlay {
            evicted: [table.get(key(1, 80)).unwrap().real_servers[0].id].into(),
            ..HealthOverlay::default()
        };
        let fourth = Snapshot::build_reusing(4, &table, &evicted, &[], Some(&third));
        assert!(!reused(&third, &fourth, 80) && reused(&third, &fourth, 81));
        table
            .set_sched_params(key(1, 80), Default::default(), Some(251))
            .unwrap();
        let fifth = Snapshot::build_reusing(5, &table, &health, &[], Some(&fourth));
        assert!(!reused(&fourth, &fifth, 80) && same(&fifth, &table, 80));
        let flags = crate::model::SchedFlags {
            mh_port: true,
            ..Default::default()
        };
        table
            .set_sched_params(key(1, 80), flags, Some(251))
            .unwrap();
        let sixth = Snapshot::build_reusing(6, &table, &health, &[], Some(&fifth));
        assert!(!reused(&fifth, &sixth, 80) && reused(&fifth, &sixth, 81));
    }

    /// A NAT real server's reply services: each service it serves once, in snapshot
    /// order, then the departed routes not already there; none for a DR real server
    /// or an unknown address.
    #[test]
    fn nat_reply_services_name_each_service_once_in_order() {
        let mut table = ServiceTable::new();
        let rip = Ipv4Addr::new(10, 0, 0, 11);
        for port in [80, 81] {
            table
                .add_service(key(1, port), SchedulerKind::Rr, None)
                .unwrap();
            let spec = RealServerSpec::new(rip, 8080, 1, ForwardMode::Nat);
            table.add_server(key(1, port), spec).unwrap();
        }
        let dr = Ipv4Addr::new(10, 0, 0, 12);
        let spec = RealServerSpec::new(dr, 80, 1, ForwardMode::Dr);
        table.add_server(key(1, 80), spec).unwrap();
        let vip = key(1, 80).vip;
        let route = |vport| NatRoute {
            proto: Protocol::Tcp,
            real_ip: rip.into(),
            real_port: 8080,
            vip,
            vport,
        };
        let departed = [route(81), route(82), route(82)];
        let snap = Snapshot::build_with(1, &table, &HealthOverlay::default(), &departed);
        let served = |ip: Ipv4Addr, port| snap.nat_reply_services(Protocol::Tcp, ip, port).to_vec();
        assert_eq!(served(rip, 8080), [(vip, 80), (vip, 81), (vip, 82)]);
        assert!(served(dr, 80).is_empty());
        assert!(served(Ipv4Addr::new(10, 0, 0, 13), 8080).is_empty());
        let one = Snapshot::build(2, &table);
        table.delete_service(key(1, 81)).unwrap();
        let alone = Snapshot::build(3, &table);
        assert_eq!(one.nat_reply_services(Protocol::Tcp, rip, 8080).len(), 2);
        assert_eq!(
            alone.nat_reply_services(Protocol::Tcp, rip, 8080),
            [(vip, 80)]
        );
    }

    /// The load positions map every server of a service whose scheduler tracks loads
    /// or that has an upper threshold, by id, to its service's index and its place,
    /// and no other server.
    #[test]
    fn load_positions_cover_the_tracked_services() {
        let mut table = ServiceTable::new();
        for (port, scheduler) in [(80, SchedulerKind::Rr), (81, SchedulerKind::Wlc)] {
            table.add_service(key(1, port), scheduler, None).unwrap();
            for last in [11, 12] {
                let spec =
                    RealServerSpec::new(Ipv4Addr::new(10, 0, 0, last), port, 1, ForwardMode::Nat);
                table.add_server(key(1, port), spec).unwrap();
            }
        }
        let positions = |table: &ServiceTable| {
            let snap = Snapshot::build(1, table);
            let mut got: Vec<_> = (snap.load_positions().iter())
                .map(|(&id, &(index, position))| {
                    let service = &snap.services()[index as usize];
                    assert_eq!(service.real_servers[position as usize].id, id);
                    (service.key.port, position)
                })
                .collect();
            got.sort_unstable();
            got
        };
        assert_eq!(positions(&table), [(81, 0), (81, 1)]);
        let mut spec = RealServerSpec::new(Ipv4Addr::new(10, 0, 0, 12), 80, 1, ForwardMode::Nat);
        spec.upper = 10;
        table.edit_server(key(1, 80), spec).unwrap();
        assert_eq!(positions(&table), [(80, 0), (80, 1), (81, 0), (81, 1)]);
    }

    /// A service keeps its scheduling version while its scheduler's inputs stay the
    /// same (also over a snapshot it did not change in), and gets a number never seen
    /// before when its servers, a weight, an eviction, its scheduler, its flags, or
    /// the service itself (deleted and added again) change, or when a snapshot is
    /// built without a previous one.
    #[test]
    fn scheduling_versions_follow_the_schedulers_inputs() {
        let mut table = ServiceTable::new();
        for port in [80, 81] {
            table
                .add_service(key(1, port), SchedulerKind::Wlc, None)
                .unwrap();
            for last in [11, 12] {
                let spec =
                    RealServerSpec::new(Ipv4Addr::new(10, 0, 0, last), port, 1, ForwardMode::Nat);
                table.add_server(key(1, port), spec).unwrap();
            }
        }
        let mut seen = std::collections::HashSet::new();
        let version = |snap: &Snapshot, port| snap.scheduling_version(snap.by_key[&key(1, port)]);
        let mut last = Snapshot::build(1, &table);
        seen.extend([version(&last, 80), version(&last, 81)]);
        assert_eq!(seen.len(), 2, "two services, two numbers");
        let mut generation = 1;
        // Builds the next snapshot from `last` with `health`: whether each of :80
        // and :81 kept its number, and that every new number is new.
        let mut next = |table: &ServiceTable, health: &HealthOverlay, previous: bool| {
            generation += 1;
            let snap =
                Snapshot::build_reusing(generation, table, health, &[], previous.then_some(&last));
            let kept = [80, 81].map(|port| {
                let kept = version(&snap, port) == version(&last, port);
                assert!(
                    kept || seen.insert(version(&snap, port)),
                    "a number came back"
                );
                kept
            });
            last = snap;
            kept
        };
        let healthy = HealthOverlay::default();
        assert_eq!(next(&table, &healthy, true), [true, true]);
        // A weight on :81.
        let spec = RealServerSpec::new(Ipv4Addr::new(10, 0, 0, 12), 81, 5, ForwardMode::Nat);
        table.edit_server(key(1, 81), spec).unwrap();
        assert_eq!(next(&table, &healthy, true), [true, false]);
        assert_eq!(next(&table, &healthy, true), [true, true]);
        // An eviction of one of :80's servers, then its end.
        let evicted = HealthOverlay {
            evicted: [table.get(key(1, 80)).unwrap().real_servers[0].id].into(),
            ..HealthOverlay::default()
        };
        assert_eq!(next(&table, &evicted, true), [false, true]);
        assert_eq!(next(&table, &evicted, true), [true, true]);
        assert_eq!(next(&table, &healthy, true), [false, true]);
        // A server added to :80, one removed from :81.
        let spec = RealServerSpec::new(Ipv4Addr::new(10, 0, 0, 13), 80, 1, ForwardMode::Nat);
        table.add_server(key(1, 80), spec).unwrap();
        assert_eq!(next(&table, &healthy, true), [false, true]);
        let rs = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 11));
        table.delete_server(key(1, 81), rs, 81).unwrap();
        assert_eq!(next(&table, &healthy, true), [true, false]);
        // :81's table size (even for wlc, which does not use it).
        table
            .set_sched_params(key(1, 81), Default::default(), Some(251))
            .unwrap();
        assert_eq!(next(&table, &healthy, true), [true, false]);
        // Only the servers left out change: :81's server, at weight 0, then evicted
        // (scheduled at weight 0 either way).
        let spec = RealServerSpec::new(Ipv4Addr::new(10, 0, 0, 12), 81, 0, ForwardMode::Nat);
        table.edit_server(key(1, 81), spec).unwrap();
        assert_eq!(next(&table, &healthy, true), [true, false]);
        let idle = HealthOverlay {
            evicted: [table.get(key(1, 81)).unwrap().real_servers[0].id].into(),
            ..HealthOverlay::default()
        };
        let scheduled = |health: &HealthOverlay| {
            let snap = Snapshot::build_with(99, &table, health, &[]);
            snap.services()[snap.by_key[&key(1, 81)]]
                .real_servers
                .clone()
        };
        assert_eq!(
            scheduled(&healthy),
            scheduled(&idle),
            "the same servers as scheduled"
        );
        assert_eq!(next(&table, &idle, true), [true, false]);
        assert_eq!(next(&table, &healthy, true), [true, false]);
        // The scheduler, then the flags of :80.
        table
            .edit_service(key(1, 80), SchedulerKind::Sh, None)
            .unwrap();
        assert_eq!(next(&table, &healthy, true), [false, true]);
        let flags = crate::model::SchedFlags {
            sh_port: true,
            ..Default::default()
        };
        table.set_sched_params(key(1, 80), flags, None).unwrap();
        assert_eq!(next(&table, &healthy, true), [false, true]);
        // :81 deleted and added again with the same servers: a new service.
        let servers = table.delete_service(key(1, 81)).unwrap().real_servers;
        table
            .add_service(key(1, 81), SchedulerKind::Wlc, None)
            .unwrap();
        for r in &servers {
            let spec = RealServerSpec::new(r.ip, r.port, r.weight, r.mode);
            table.add_server(key(1, 81), spec).unwrap();
        }
        assert_eq!(next(&table, &healthy, true), [true, false]);
        // No previous snapshot: nothing is known to be the same.
        assert_eq!(next(&table, &healthy, false), [false, false]);
        assert_eq!(next(&table, &healthy, true), [true, true]);
    }
}
