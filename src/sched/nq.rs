//! Never queue (`nq`), as IPVS's `ip_vs_nq`: if an available server has no active
//! connection, it gets the new one at once (the first such in list order); otherwise
//! the choice is sed's, smallest `(active + 1) * 256 / weight` ([`super::sed`]).
//!
//! "Idle" follows the kernel, which tests only `activeconns == 0`: inactive
//! connections (TIME_WAIT and the like) do not make a server busy. Seed 001 (3.2)
//! describes idle as both counts at zero; the kernel code is what ipvsadm users get,
//! so Sluice follows it.
//!
//! The kernel's one pass (the first idle server, else the sed choice) is an order:
//! idle before busy, idle ones by list order, busy ones by delay. It is sed's order
//! with an idle server's delay taken as 0. The choice is kept in a tournament by that
//! order ([`LoadIndex`](super::tree::LoadIndex)): O(log n) per load change, one read
//! per pick when the caller tracks loads ([`Scheduler::tracks_loads`]).
use crate::model::RealServer;
use crate::model::SchedulerKind;
use crate::sched::sed::expected_delay_overhead;
use crate::sched::tree::{LoadIndex, Rank};
use crate::sched::wlc::Ratio;
use crate::sched::{PickContext, Scheduler, ServerLoad};

/// nq's key: sed's delay, or 0 for an idle server. A zero delay is below every busy
/// server's (whose overhead is at least 512 and weight above 0), and two idle servers
/// tie, so the first stays.
#[derive(Clone, Copy, Debug, Default)]
struct IdleThenDelay(Ratio);

impl Rank for IdleThenDelay {
    #[inline]
    fn of(weight: u32, load: ServerLoad) -> Self {
        let overhead = if load.active == 0 {
            0
        } else {
            expected_delay_overhead(load)
        };
        IdleThenDelay(Ratio { overhead, weight })
    }

    #[inline]
    fn absent() -> Self {
        IdleThenDelay(Ratio::ABSENT)
    }

    #[inline]
    fn beats(&self, earlier: &Self) -> bool {
        self.0.below(&earlier.0)
    }
}

/// Never queue over an index of the servers' loads.
#[derive(Clone, Debug)]
pub struct NeverQueue {
    index: LoadIndex<IdleThenDelay>,
}

impl NeverQueue {
    pub fn new(servers: &[RealServer]) -> Self {
        NeverQueue {
            index: LoadIndex::new(servers),
        }
    }
}

impl Scheduler for NeverQueue {
    fn kind(&self) -> SchedulerKind {
        SchedulerKind::Nq
    }

    fn pick(&mut self, servers: &[RealServer], ctx: &PickContext) -> Option<usize> {
        self.index.pick(servers, ctx)
    }

    fn tracks_loads(&self) -> bool {
        true
    }

    fn set_load(&mut self, index: usize, load: ServerLoad) {
        self.index.set_load(index, load);
    }

    fn set_weight(&mut self, index: usize, weight: u32) {
        self.index.set_weight(index, weight);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::test_support::*;

    fn pick(weights: &[u32], pairs: &[(u32, u32)]) -> Option<usize> {
        let servers = servers(weights);
        let loads = loads(pairs);
        NeverQueue::new(&servers).pick(&servers, &ctx_with(&loads))
    }

    #[test]
    fn an_idle_server_goes_first() {
        // sed would pick a: (1+1)*256/3 = 170.7 < b's (0+1)*256/1 = 256.
        // nq: b has no active connection, so b.
        assert_eq!(pick(&[3, 1], &[(1, 0), (0, 0)]), Some(1));
    }

    #[test]
    fn the_first_idle_one_in_list_order() {
        // b and c idle: b, whatever the weights (c's is larger).
        assert_eq!(pick(&[1, 1, 9], &[(4, 0), (0, 0), (0, 0)]), Some(1));
    }

    #[test]
    fn inactive_connections_do_not_make_a_server_busy() {
        // As the kernel: b has 50 inactive but 0 active, so b is idle.
        assert_eq!(pick(&[1, 1], &[(1, 0), (0, 50)]), Some(1));
    }

    #[test]
    fn otherwise_shortest_expected_delay() {
        // No idle server. a: w=1, 2 active -> 3*256 = 768; b: w=2, 3 active ->
        // 4*256/2 = 512; c: w=4, 7 active -> 8*256/4 = 512: b (first of the tie).
        assert_eq!(pick(&[1, 2, 4], &[(2, 0), (3, 0), (7, 0)]), Some(1));
        // c at 6 active -> 7*256/4 = 448 < 512: c.
        assert_eq!(pick(&[1, 2, 4], &[(2, 0), (3, 0), (6, 0)]), Some(2));
    }

    #[test]
    fn a_draining_idle_server_is_not_taken() {
        // a: w=0 and idle; b: w=1, 2 active; c: w=1, 1 active -> sed: c (512 < 768).
        assert_eq!(pick(&[0, 1, 1], &[(0, 0), (2, 0), (1, 0)]), Some(2));
    }

    #[test]
    fn missing_loads_mean_idle() {
        assert_eq!(pick(&[1, 1], &[(3, 0)]), Some(1));
    }

    #[test]
    fn equals_sed_whenever_no_server_is_idle() {
        let servers = servers(&[1, 3, 0, 2, 5]);
        let mut rng = crate::model::rng::Rng::new(4);
        let mut sed = crate::sched::ShortestExpectedDelay::new(&servers);
        let mut nq = NeverQueue::new(&servers);
        for _ in 0..10_000 {
            let load: Vec<_> = (0..5)
                .map(|_| crate::sched::ServerLoad::new(1 + rng.below(20) as u32, 0))
                .collect();
            let ctx = ctx_with(&load);
            assert_eq!(nq.pick(&servers, &ctx), sed.pick(&servers, &ctx));
        }
    }

    /// The reference: the kernel's one pass, returning the first idle server met and
    /// meanwhile keeping the sed choice among the busy ones seen so far.
    fn scan(servers: &[RealServer], loads: &[ServerLoad]) -> Option<usize> {
        let mut least: Option<(usize, u64, u32)> = None;
        for (index, server) in servers.iter().enumerate() {
            if !server.accepts_new() {
                continue;
            }
            let active = loads.get(index).copied().unwrap_or_default().active;
            if active == 0 {
                return Some(index);
            }
            let doh = (u64::from(active) + 1) << 8;
            match least {
                Some((_, loh, lw))
                    if u128::from(loh) * u128::from(server.weight)
                        <= u128::from(doh) * u128::from(lw) => {}
                _ => least = Some((index, doh, server.weight)),
            }
        }
        least.map(|(index, _, _)| index)
    }

    #[test]
    fn tracked_picks_equal_the_kernels_pass() {
        let found = tracked_picks_match_scan(SchedulerKind::Nq, scan, 300);
        assert!(found > 100_000, "{found}");
    }

    #[test]
    fn none_when_empty_or_all_draining() {
        assert_eq!(pick(&[], &[]), None);
        assert_eq!(pick(&[0, 0], &[]), None);
    }
}
