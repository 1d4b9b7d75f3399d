//! Schedulers: which real server gets a new connection. One trait, one file each.
//!
//! A scheduler runs only when a connection is new (a TCP SYN, the first UDP packet):
//! established sessions are forwarded from the session table without asking it.
//!
//! **State is per worker.** Each worker builds its own scheduler instances from the
//! snapshot it reads and, when it picks up a new snapshot, rebuilds those of the
//! services whose scheduling inputs changed (each carrying on from the one it replaces:
//! [`Scheduler::inherit`]) and keeps the others, so `pick` takes
//! `&mut self` and needs no locks or atomics. The consequence: with N workers, each
//! runs its own sequence. Round robin over 3 servers with 2 workers gives each worker
//! `a b c a b c ...` over the connections *it* sees, so the global spread is exact only
//! per worker, and over many connections the sum converges to the same proportions.
use crate::model::{RealServer, SchedFlags, SchedulerKind, Service};
use std::net::Ipv4Addr;

pub mod dh;
pub mod fo;
pub mod lblc;
pub mod lblcr;
pub mod lc;
mod locality;
pub mod mh;
pub mod nq;
pub mod p2c;
pub mod rr;
pub mod sed;
pub mod sh;
mod tree;
pub mod wlc;
pub mod wrandom;
pub mod wrr;

pub use dh::DestinationHashing;
pub use fo::WeightedFailover;
pub use lblc::LocalityLeastConnection;
pub use lblcr::LocalityLeastConnectionReplicated;
pub use lc::LeastConnection;
pub use mh::Maglev;
pub use nq::NeverQueue;
pub use p2c::PowerOfTwoChoices;
pub use rr::RoundRobin;
pub use sed::ShortestExpectedDelay;
pub use sh::SourceHashing;
pub use wlc::WeightedLeastConnection;
pub use wrandom::WeightedRandom;
pub use wrr::SmoothWeightedRoundRobin;

/// The seed of [`SchedulerParams::default`]; workers pass their own.
pub const DEFAULT_SEED: u64 = 0x5eed_51c1_ce5c_4ed0;

/// What some schedulers need besides the servers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SchedulerParams {
    /// Maglev lookup table size M (mh only); must be prime. Default 65537.
    pub maglev_table_size: u32,
    pub flags: SchedFlags,
    /// Seed of the random schedulers (wrandom, p2c). The data plane passes one per
    /// worker so workers do not draw the same sequence.
    pub seed: u64,
    /// Positions of the servers that sh and dh leave out of their bucket tables:
    /// those health checking evicted and a sorry server not in use, at weight 0 in
    /// the pool so that their sessions keep their real server, where keepalived would
    /// have deleted them from IPVS. A server an operator set to weight 0 is not
    /// withdrawn and keeps a bucket, as in IPVS. Empty unless the snapshot says
    /// ([`Snapshot::scheduler_params`](crate::service::Snapshot::scheduler_params)).
    pub withdrawn: Vec<usize>,
}

impl Default for SchedulerParams {
    fn default() -> Self {
        SchedulerParams {
            maglev_table_size: crate::model::MH_DEFAULT_TABLE_SIZE,
            flags: SchedFlags::default(),
            seed: DEFAULT_SEED,
            withdrawn: Vec::new(),
        }
    }
}

impl SchedulerParams {
    /// What `service`'s scheduler is built with, for worker `seed`.
    pub fn for_service(service: &Service, seed: u64) -> SchedulerParams {
        SchedulerParams {
            maglev_table_size: service.mh_table_size,
            flags: service.sched_flags,
            seed,
            withdrawn: Vec::new(),
        }
    }

    /// An error if [`build_with`] would have to replace a value (a non-prime or
    /// out-of-range Maglev table size). For config and control-plane checks.
    pub fn validate(&self) -> Result<(), String> {
        mh::check_table_size(self.maglev_table_size)
    }
}

/// Load of one real server as the scheduler sees it (same index as the servers slice).
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct ServerLoad {
    /// Connections in ESTABLISHED (IPVS "ActiveConn").
    pub active: u32,
    /// Connections in any other state (IPVS "InActConn").
    pub inactive: u32,
}

impl ServerLoad {
    pub const fn new(active: u32, inactive: u32) -> Self {
        ServerLoad { active, inactive }
    }

    /// IPVS's `ip_vs_dest_conn_overhead`: `active * 256 + inactive`, so an active
    /// connection weighs 256 inactive ones. At most about 2^40: no overflow in u64.
    #[inline]
    pub fn overhead(self) -> u64 {
        (u64::from(self.active) << 8) + u64::from(self.inactive)
    }
}

/// An address as the hashing schedulers (sh, dh, mh, lblc, lblcr) see it: an IPv4
/// address as it is, an IPv6 one folded to 32 bits by XOR of its four words, as IPVS
/// folds it for the same schedulers (`ip_vs_sh_hashkey`), so every bit counts.
#[inline]
pub fn fold_address(address: std::net::IpAddr) -> Ipv4Addr {
    match address {
        std::net::IpAddr::V4(a) => a,
        std::net::IpAddr::V6(a) => fold_ipv6(a),
    }
}

/// An IPv6 address folded to 32 bits (see [`fold_address`]).
#[inline]
pub fn fold_ipv6(address: std::net::Ipv6Addr) -> Ipv4Addr {
    let w = u128::from(address);
    Ipv4Addr::from((w >> 96) as u32 ^ (w >> 64) as u32 ^ (w >> 32) as u32 ^ w as u32)
}

/// What a scheduler may look at besides the servers themselves.
#[derive(Clone, Copy, Debug)]
pub struct PickContext<'a> {
    /// Source of the new connection (for hashing schedulers such as sh and mh).
    pub client: Ipv4Addr,
    pub client_port: u16,
    /// Destination address of the new connection (dh, lblc, lblcr); 0.0.0.0 unless set
    /// with [`PickContext::with_destination`].
    pub destination: Ipv4Addr,
    /// A monotonic clock in milliseconds (lblc and lblcr expire their entries with it);
    /// 0 unless set with [`PickContext::with_now_ms`].
    pub now_ms: u64,
    /// Per-server loads, indexed like the `servers` slice; may be empty or shorter for
    /// schedulers that ignore load. A missing load counts as zero connections.
    pub loads: &'a [ServerLoad],
    /// The caller has told the scheduler every load change with
    /// [`Scheduler::set_load`]: a scheduler that [tracks loads](Scheduler::tracks_loads)
    /// then picks from what it was told, without reading `loads` (O(log n) instead
    /// of O(n)). False unless set with [`PickContext::with_tracked_loads`].
    pub loads_tracked: bool,
}

impl<'a> PickContext<'a> {
    pub fn new(client: Ipv4Addr, client_port: u16, loads: &'a [ServerLoad]) -> Self {
        PickContext {
            client,
            client_port,
            destination: Ipv4Addr::UNSPECIFIED,
            now_ms: 0,
            loads,
            loads_tracked: false,
        }
    }

    /// Says that the scheduler was told every load change (see
    /// [`PickContext::loads_tracked`]).
    pub fn with_tracked_loads(mut self) -> Self {
        self.loads_tracked = true;
        self
    }

    pub fn with_destination(mut self, destination: Ipv4Addr) -> Self {
        self.destination = destination;
        self
    }

    pub fn with_now_ms(mut self, now_ms: u64) -> Self {
        self.now_ms = now_ms;
        self
    }

    /// The load of server `index`; zero when `loads` does not reach it.
    #[inline]
    pub fn load(&self, index: usize) -> ServerLoad {
        self.loads.get(index).copied().unwrap_or_default()
    }
}

/// A scheduling algorithm with its per-worker state.
///
/// Contract for implementations:
/// - `pick` is called on the packet path: it must not allocate, lock or block.
/// - `servers` is the real-server list the scheduler was built from (the worker
///   rebuilds the scheduler when a new snapshot changes it). A scheduler that keeps
///   per-server state must still not panic if the slice length differs; it restarts.
/// - A server with weight 0 is draining and is never picked.
/// - Weights: wrr, fo, wrandom and p2c read them when built and through
///   [`Scheduler::set_weight`];
///   lc, wlc, sed, nq, lblc and lblcr read them from `servers` at each pick unless the context
///   says loads are tracked, and then also only when built and through `set_weight`.
///   The data plane rebuilds a service's scheduler on every change of its list,
///   weights included, and has it carry on from the one it replaces
///   ([`Scheduler::inherit`]); a service whose scheduling inputs did not change
///   (list, weights, flags, table size, servers left out) keeps its own.
pub trait Scheduler: Send + std::any::Any {
    fn kind(&self) -> SchedulerKind;
    /// Index into `servers` of the real server for a new connection; None when no server
    /// can take it (all weight 0 / none).
    fn pick(&mut self, servers: &[RealServer], ctx: &PickContext) -> Option<usize>;

    /// Whether this scheduler keeps its own index over loads (lc, wlc, sed, nq, lblc, lblcr): a
    /// caller that reports every change with [`Scheduler::set_load`] and picks with
    /// [`PickContext::with_tracked_loads`] gets O(log n) picks and never has to
    /// gather the loads of all servers.
    fn tracks_loads(&self) -> bool {
        false
    }

    /// Server `index` now has `load` (O(log n)). A no-op for schedulers that do not
    /// track loads, and for an index past the list.
    fn set_load(&mut self, _index: usize, _load: ServerLoad) {}

    /// Server `index` now has `weight` (0: draining) without a rebuild: O(log n) for
    /// fo, lc, wlc, sed, nq, lblc and lblcr, and for wrr unless it leaves a replayed cycle (then
    /// O(n) once); O(n) for wrandom and p2c (their running sums); a no-op for the
    /// others, which read `servers` at each pick or need a rebuild.
    fn set_weight(&mut self, _index: usize, _weight: u32) {}

    /// Carries on from `previous`, the scheduler this one replaces for the same
    /// service when a worker adopts a new snapshot, where that makes sense: rr keeps
    /// its position (modulo the new list), wrr its running weights while the list
    /// and weights are unchanged, wrandom and p2c their generator's state. Without it
    /// every change to the service (a health flap, a weight) would restart them,
    /// and with few new connections between snapshots each worker's first pick, the
    /// same server every time, would take most of them. A no-op for the others and
    /// for a `previous` of another kind.
    fn inherit(&mut self, _previous: &dyn Scheduler) {}
}

/// `previous` as a `T`, when it is one (for [`Scheduler::inherit`]).
pub(crate) fn same_kind<T: Scheduler>(previous: &dyn Scheduler) -> Option<&T> {
    let any: &dyn std::any::Any = previous;
    any.downcast_ref::<T>()
}

/// Whether `index` is a server of `servers` that takes new connections: how the
/// schedulers that keep indices check them against the slice they are given.
#[inline]
pub(crate) fn available(servers: &[RealServer], index: usize) -> bool {
    servers.get(index).is_some_and(RealServer::accepts_new)
}

/// A fresh scheduler of `kind` for `servers` with default [`SchedulerParams`].
pub fn build(kind: SchedulerKind, servers: &[RealServer]) -> Box<dyn Scheduler> {
    build_with(kind, servers, &SchedulerParams::default())
}

/// Whether the scheduler [`build_with`] makes for `kind` keeps its own index over
/// loads ([`Scheduler::tracks_loads`]), known without building one: the snapshot
/// maps the tracked servers once for every worker.
pub const fn tracks_loads(kind: SchedulerKind) -> bool {
    matches!(
        kind,
        SchedulerKind::Lc
            | SchedulerKind::Wlc
            | SchedulerKind::Sed
            | SchedulerKind::Nq
            | SchedulerKind::Lblc
            | SchedulerKind::Lblcr
    )
}

/// A fresh scheduler of `kind` for `servers`; state starts from the beginning.
///
/// Never fails: a Maglev table size that [`SchedulerParams::validate`] rejects is
/// replaced by the default (65537) with a warning. Building mh costs a table
/// population (about a millisecond for 1000 servers): do it off the packet path.
pub fn build_with(
    kind: SchedulerKind,
    servers: &[RealServer],
    params: &SchedulerParams,
) -> Box<dyn Scheduler> {
    match kind {
        SchedulerKind::Rr => Box::new(RoundRobin::new(servers)),
        SchedulerKind::Wrr => Box::new(SmoothWeightedRoundRobin::new(servers)),
        SchedulerKind::Lc => Box::new(LeastConnection::new(servers)),
        SchedulerKind::Wlc => Box::new(WeightedLeastConnection::new(servers)),
        SchedulerKind::Sed => Box::new(ShortestExpectedDelay::new(servers)),
        SchedulerKind::Nq => Box::new(NeverQueue::new(servers)),
        SchedulerKind::Dh => Box::new(DestinationHashing::withdrawing(servers, &params.withdrawn)),
        SchedulerKind::Sh => Box::new(SourceHashing::withdrawing(
            servers,
            params.flags,
            &params.withdrawn,
        )),
        SchedulerKind::Lblc => Box::new(LocalityLeastConnection::new(servers)),
        SchedulerKind::Lblcr => Box::new(LocalityLeastConnectionReplicated::new(servers)),
        SchedulerKind::Mh => Box::new(
            Maglev::new(servers, params.maglev_table_size, params.flags).unwrap_or_else(|e| {
                log::warn!(
                    "mh: {e}; using the default table size {}",
                    crate::model::MH_DEFAULT_TABLE_SIZE
                );
                Maglev::new(servers, crate::model::MH_DEFAULT_TABLE_SIZE, params.flags)
                    .expect("the default table size is valid")
            }),
        ),
        SchedulerKind::Wrandom => Box::new(WeightedRandom::new(servers, params.seed)),
        SchedulerKind::P2c => Box::new(PowerOfTwoChoices::new(servers, params.seed)),
        SchedulerKind::Fo => Box::new(WeightedFailover::new(servers)),
    }
}

/// Helpers for the scheduler tests in this module's files.
#[cfg(test)]
pub(crate) mod test_support {
    use super::*;
    use crate::model::ForwardMode;

    /// Real servers 10.0.0.1, 10.0.0.2, ... with the given weights.
    pub fn servers(weights: &[u32]) -> Vec<RealServer> {
        weights
            .iter()
            .enumerate()
            .map(|(i, &weight)| RealServer {
                id: i as u32 + 1,
                ip: Ipv4Addr::new(10, 0, 0, i as u8 + 1).into(),
                port: 80,
                weight,
                mode: ForwardMode::Dr,
                upper: 0,
                lower: 0,
            })
            .collect()
    }

    /// A random pool for the property tests: 1 to 50 servers, weights up to 2, 5, 100
    /// or the maximum (chosen per pool, so ties are common in some), a quarter of them
    /// 0 (draining). Returns the pool's weight bound and the weights.
    pub fn random_pool(rng: &mut crate::model::rng::Rng) -> (u32, Vec<u32>) {
        let n = 1 + rng.below(50) as usize;
        let max_weight = [2, 5, 100, crate::model::MAX_WEIGHT][rng.below(4) as usize];
        (
            max_weight,
            (0..n).map(|_| random_weight(rng, max_weight)).collect(),
        )
    }

    /// A weight for [`random_pool`]'s pools: 0 one time in four, else 1..=max_weight.
    pub fn random_weight(rng: &mut crate::model::rng::Rng, max_weight: u32) -> u32 {
        if rng.below(4) == 0 {
            0
        } else {
            1 + rng.below(u64::from(max_weight)) as u32
        }
    }

    pub fn ctx() -> PickContext<'static> {
        PickContext::new(Ipv4Addr::new(198, 18, 0, 100), 40000, &[])
    }

    /// `count` picks rendered as letters (`a` = index 0, `-` = None).
    pub fn sequence(scheduler: &mut dyn Scheduler, servers: &[RealServer], count: usize) -> String {
        (0..count)
            .map(|_| match scheduler.pick(servers, &ctx()) {
                Some(i) => (b'a' + i as u8) as char,
                None => '-',
            })
            .collect()
    }

    /// A real server `ip:port` with `weight` (id 0: tests that need ids use `servers`).
    pub fn server(ip: [u8; 4], port: u16, weight: u32) -> RealServer {
        RealServer {
            id: 0,
            ip: Ipv4Addr::from(ip).into(),
            port,
            weight,
            mode: ForwardMode::Dr,
            upper: 0,
            lower: 0,
        }
    }

    /// Loads from `(active, inactive)` pairs.
    pub fn loads(pairs: &[(u32, u32)]) -> Vec<ServerLoad> {
        pairs
            .iter()
            .map(|&(active, inactive)| ServerLoad::new(active, inactive))
            .collect()
    }

    /// The default test client with `loads`.
    pub fn ctx_with(loads: &[ServerLoad]) -> PickContext<'_> {
        PickContext::new(Ipv4Addr::new(198, 18, 0, 100), 40000, loads)
    }

    /// A connection from `client:port` without loads.
    pub fn ctx_from(client: Ipv4Addr, port: u16) -> PickContext<'static> {
        PickContext::new(client, port, &[])
    }

    /// A connection to `destination` at `now_ms` with `loads`.
    pub fn ctx_to(destination: Ipv4Addr, now_ms: u64, loads: &[ServerLoad]) -> PickContext<'_> {
        ctx_with(loads)
            .with_destination(destination)
            .with_now_ms(now_ms)
    }

    /// Client `i` of a large population: distinct addresses in 100.64.0.0/10 and
    /// distinct ports, spread so that neighbours differ in every octet.
    pub fn client(i: u32) -> (Ipv4Addr, u16) {
        let spread = i.wrapping_mul(0x9e37_79b1);
        let addr = Ipv4Addr::from(0x6440_0000 | (spread >> 10));
        (addr, 1024 + (i % 60000) as u16)
    }

    /// Each server's share of `hits`, compared with its share of the weights: the
    /// largest relative deviation (0.01 = 1%) over servers with weight > 0.
    pub fn worst_relative_error(hits: &[usize], weights: &[u32]) -> f64 {
        let total_hits: usize = hits.iter().sum();
        let total_weight: u64 = weights.iter().map(|&w| u64::from(w)).sum();
        hits.iter()
            .zip(weights)
            .filter(|(_, &w)| w > 0)
            .map(|(&h, &w)| {
                let expected = total_hits as f64 * f64::from(w) / total_weight as f64;
                (h as f64 - expected).abs() / expected
            })
            .fold(0.0, f64::max)
    }

    /// A linear scan the indexed schedulers must agree with: the choice for `servers`
    /// with `loads` (indexed alike).
    pub type Scan = fn(&[RealServer], &[ServerLoad]) -> Option<usize>;

    /// Property check of a scheduler that tracks loads against `scan`, its linear
    /// reference: `cases` random pools of 1..=50 servers, each driven through 1500
    /// random steps: picks (the chosen server gains a connection, as placement opens
    /// one in an inactive state), connections becoming established, completions (a
    /// count drops), weight changes (a quarter of them to 0, draining) and now and
    /// then a pick that hands the loads in the context instead. Every pick must equal
    /// the scan's over the same weights and loads. Small weights and counts make ties
    /// common, so tie-breaking is exercised. Returns how many picks found a server,
    /// so a caller can check the run was not vacuous.
    pub fn tracked_picks_match_scan(kind: SchedulerKind, scan: Scan, cases: u64) -> usize {
        let mut found = 0;
        for case in 0..cases {
            let mut rng = crate::model::rng::Rng::new(0x5c4e_d000 + case);
            let (max_weight, weights) = random_pool(&mut rng);
            let n = weights.len();
            let weight = |rng: &mut crate::model::rng::Rng| random_weight(rng, max_weight);
            let mut pool = servers(&weights);
            let mut scheduler = build(kind, &pool);
            assert!(scheduler.tracks_loads(), "{kind}");
            let mut load = vec![ServerLoad::default(); n];
            // Start from loads the scheduler is told one by one.
            for (i, l) in load.iter_mut().enumerate() {
                *l = ServerLoad::new(rng.below(4) as u32, rng.below(300) as u32);
                scheduler.set_load(i, *l);
            }
            for step in 0..1500 {
                match rng.below(10) {
                    0..=3 => {
                        let tracked = rng.below(8) != 0;
                        let ctx = if tracked {
                            ctx_with(&[]).with_tracked_loads()
                        } else {
                            ctx_with(&load)
                        };
                        let pick = scheduler.pick(&pool, &ctx);
                        assert_eq!(
                            pick,
                            scan(&pool, &load),
                            "{kind}: case {case} step {step} tracked {tracked}"
                        );
                        if let Some(i) = pick {
                            found += 1;
                            load[i].inactive += 1;
                            scheduler.set_load(i, load[i]);
                        }
                    }
                    4..=5 => {
                        let i = rng.below(n as u64) as usize;
                        if load[i].inactive > 0 {
                            load[i].inactive -= 1;
                            load[i].active += 1;
                            scheduler.set_load(i, load[i]);
                        }
                    }
                    6..=8 => {
                        let i = rng.below(n as u64) as usize;
                        let l = &mut load[i];
                        if rng.below(2) == 0 {
                            l.active = l.active.saturating_sub(1);
                        } else {
                            l.inactive = l.inactive.saturating_sub(1);
                        }
                        scheduler.set_load(i, load[i]);
                    }
                    _ => {
                        let i = rng.below(n as u64) as usize;
                        pool[i].weight = weight(&mut rng);
                        scheduler.set_weight(i, pool[i].weight);
                    }
                }
            }
        }
        found
    }

    /// How many times each index is picked in `count` picks.
    pub fn histogram(
        scheduler: &mut dyn Scheduler,
        servers: &[RealServer],
        count: usize,
    ) -> Vec<usize> {
        let mut hits = vec![0; servers.len()];
        for _ in 0..count {
            let i = scheduler.pick(servers, &ctx()).expect("a server");
            hits[i] += 1;
        }
        hits
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::*;
    use super::*;

    #[test]
    fn factory_builds_every_kind() {
        let servers = servers(&[1, 1]);
        for &kind in SchedulerKind::ALL {
            let mut scheduler = build(kind, &servers);
            assert_eq!(scheduler.kind(), kind);
            assert_eq!(scheduler.tracks_loads(), tracks_loads(kind), "{kind:?}");
            assert!(scheduler.pick(&servers, &ctx()).is_some());
        }
    }

    #[test]
    fn every_kind_returns_none_without_servers() {
        for &kind in SchedulerKind::ALL {
            let mut scheduler = build(kind, &[]);
            assert_eq!(scheduler.pick(&[], &ctx()), None, "{kind}");
            let drained = servers(&[0, 0]);
            let mut scheduler = build(kind, &drained);
            assert_eq!(scheduler.pick(&drained, &ctx()), None, "{kind}");
        }
    }

    #[test]
    fn kind_names_round_trip() {
        for &kind in SchedulerKind::ALL {
            assert_eq!(kind.name().parse::<SchedulerKind>(), Ok(kind));
            let json = serde_json::to_string(&kind).unwrap();
            assert_eq!(json, format!("\"{}\"", kind.name()));
            assert_eq!(serde_json::from_str::<SchedulerKind>(&json).unwrap(), kind);
        }
        assert!("fastest".parse::<SchedulerKind>().is_err());
    }

    #[test]
    fn all_ipvs_names_and_the_default() {
        let names: Vec<_> = SchedulerKind::ALL.iter().map(|k| k.name()).collect();
        assert_eq!(
            names.join(" "),
            "rr wrr lc wlc sed nq dh sh lblc lblcr mh wrandom p2c fo"
        );
        assert_eq!(SchedulerKind::DEFAULT, SchedulerKind::Wlc);
        let with_loads: Vec<_> = SchedulerKind::ALL
            .iter()
            .filter(|k| k.uses_loads())
            .map(|k| k.name())
            .collect();
        assert_eq!(with_loads.join(" "), "lc wlc sed nq lblc lblcr p2c");
    }

    #[test]
    fn no_kind_picks_a_draining_server_whatever_the_context() {
        let servers = servers(&[0, 3, 0, 1, 0, 2, 0]);
        let weights: Vec<u32> = servers.iter().map(|s| s.weight).collect();
        let load = loads(&[(0, 0), (5, 1), (0, 0), (1, 0), (0, 0), (2, 9), (0, 0)]);
        let params = SchedulerParams {
            flags: "sh-fallback,mh-fallback".parse().unwrap(),
            ..SchedulerParams::default()
        };
        for &kind in SchedulerKind::ALL {
            for with_flags in [false, true] {
                let p = if with_flags {
                    params.clone()
                } else {
                    SchedulerParams::default()
                };
                let mut scheduler = build_with(kind, &servers, &p);
                for i in 0..2000u32 {
                    let (addr, port) = client(i);
                    let ctx = PickContext::new(addr, port, &load)
                        .with_destination(Ipv4Addr::from(i.wrapping_mul(7919)))
                        .with_now_ms(u64::from(i) * 1000);
                    if let Some(pick) = scheduler.pick(&servers, &ctx) {
                        assert!(weights[pick] > 0, "{kind} picked draining server {pick}");
                    }
                }
            }
        }
    }

    #[test]
    fn every_kind_survives_short_loads_and_a_changed_list() {
        let four = servers(&[1, 2, 3, 4]);
        let two = servers(&[1, 1]);
        let short = loads(&[(3, 1)]);
        for &kind in SchedulerKind::ALL {
            let mut scheduler = build(kind, &four);
            for loads in [&[][..], &short[..]] {
                assert!(scheduler.pick(&four, &ctx_with(loads)).is_some(), "{kind}");
                // A caller that did not rebuild: no panic, and any pick is in range.
                if let Some(i) = scheduler.pick(&two, &ctx_with(loads)) {
                    assert!(i < 2, "{kind}");
                }
                assert_eq!(scheduler.pick(&[], &ctx_with(loads)), None, "{kind}");
            }
        }
    }

    #[test]
    fn sched_flags_parse_like_ipvsadm() {
        assert_eq!("".parse::<SchedFlags>(), Ok(SchedFlags::default()));
        let flags: SchedFlags = "sh-fallback,sh-port".parse().unwrap();
        assert!(flags.sh_fallback && flags.sh_port && !flags.mh_fallback && !flags.mh_port);
        let flags: SchedFlags = "mh-port, mh-fallback".parse().unwrap();
        assert!(flags.mh_fallback && flags.mh_port && !flags.sh_fallback);
        assert_eq!(flags.to_string(), "mh-fallback,mh-port");
        let all: SchedFlags = "mh-port,sh-port,mh-fallback,sh-fallback".parse().unwrap();
        assert_eq!(all.to_string(), "sh-fallback,sh-port,mh-fallback,mh-port");
        assert_eq!(all.to_string().parse::<SchedFlags>(), Ok(all));
        let err = "sh-port,flag-9".parse::<SchedFlags>().unwrap_err();
        assert_eq!(
            err,
            "unknown scheduler flag \"flag-9\" (known: sh-fallback, sh-port, mh-fallback, mh-port)"
        );
        assert!("sh-port,".parse::<SchedFlags>().is_err());
    }

    #[test]
    fn sched_flags_compatibility() {
        let sh: SchedFlags = "sh-port".parse().unwrap();
        assert_eq!(sh.check_compatible(SchedulerKind::Sh), Ok(()));
        assert!(sh.check_compatible(SchedulerKind::Mh).is_err());
        assert!(sh.check_compatible(SchedulerKind::Rr).is_err());
        let none = SchedFlags::default();
        assert!(none.is_empty());
        for &kind in SchedulerKind::ALL {
            assert_eq!(none.check_compatible(kind), Ok(()));
        }
    }

    #[test]
    fn params_default_and_validation() {
        let params = SchedulerParams::default();
        assert_eq!(params.maglev_table_size, 65537);
        assert_eq!(params.flags, SchedFlags::default());
        assert_eq!(params.seed, DEFAULT_SEED);
        assert_eq!(params.validate(), Ok(()));
        let bad = SchedulerParams {
            maglev_table_size: 65536,
            ..SchedulerParams::default()
        };
        assert!(bad.validate().unwrap_err().contains("prime"));
        // build_with does not fail: it falls back to the default size.
        let servers = servers(&[1, 1]);
        let mut mh = build_with(SchedulerKind::Mh, &servers, &bad);
        assert!(mh.pick(&servers, &ctx()).is_some());
    }

    #[test]
    fn pick_context_defaults_and_builders() {
        let load = loads(&[(2, 3)]);
        let ctx = PickContext::new(Ipv4Addr::new(1, 2, 3, 4), 5, &load);
        assert_eq!(ctx.destination, Ipv4Addr::UNSPECIFIED);
        assert_eq!(ctx.now_ms, 0);
        let ctx = ctx
            .with_destination(Ipv4Addr::new(9, 9, 9, 9))
            .with_now_ms(42);
        assert_eq!(
            (ctx.destination, ctx.now_ms),
            (Ipv4Addr::new(9, 9, 9, 9), 42)
        );
        assert_eq!(ctx.load(0), ServerLoad::new(2, 3));
        assert_eq!(ctx.load(0).overhead(), 2 * 256 + 3);
        assert_eq!(ctx.load(7), ServerLoad::default());
        assert_eq!(
            ServerLoad::new(u32::MAX, u32::MAX).overhead(),
            u64::from(u32::MAX) * 257
        );
    }

    /// A worker rebuilds a service's scheduler on every change to it; with one new
    /// connection between changes the sequence must go on, not restart at the same
    /// server.
    #[test]
    fn a_rebuild_between_every_pick_keeps_the_spread() {
        let servers = servers(&[1, 1, 1]);
        let params = SchedulerParams {
            seed: 99,
            ..SchedulerParams::default()
        };
        for kind in [
            SchedulerKind::Rr,
            SchedulerKind::Wrr,
            SchedulerKind::Wrandom,
            SchedulerKind::P2c,
        ] {
            let mut scheduler = build_with(kind, &servers, &params);
            let mut hits = [0usize; 3];
            // Each connection stays open (p2c's loads).
            let mut load = vec![ServerLoad::default(); 3];
            for _ in 0..300 {
                let mut rebuilt = build_with(kind, &servers, &params);
                rebuilt.inherit(&*scheduler);
                scheduler = rebuilt;
                let pick = scheduler.pick(&servers, &ctx_with(&load)).unwrap();
                hits[pick] += 1;
                load[pick].active += 1;
            }
            if matches!(kind, SchedulerKind::Rr | SchedulerKind::Wrr) {
                assert_eq!(hits, [100; 3], "{kind}");
            } else {
                assert!(
                    hits.iter().all(|h| (60..=140).contains(h)),
                    "{kind}: {hits:?}"
                );
            }
        }
        // rr keeps its position modulo a shorter list; another kind inherits nothing.
        let mut rr = build(SchedulerKind::Rr, &servers);
        assert_eq!(sequence(&mut *rr, &servers, 2), "ab");
        let two = super::test_support::servers(&[1, 1]);
        let mut shorter = build(SchedulerKind::Rr, &two);
        shorter.inherit(&*rr);
        assert_eq!(sequence(&mut *shorter, &two, 3), "aba");
        let mut wrr = build(SchedulerKind::Wrr, &servers);
        wrr.inherit(&*rr);
        assert_eq!(sequence(&mut *wrr, &servers, 3), "abc");
    }
}
