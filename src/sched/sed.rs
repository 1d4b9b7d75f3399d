//! Shortest expected delay (`sed`), as IPVS's `ip_vs_sed`: the available server with
//! the smallest `(active + 1) * 256 / weight` (seed 001, 3.2), the delay a new
//! connection would see if each server worked through its active connections at a
//! speed proportional to its weight. Inactive connections do not count. Compared by
//! cross-multiplication like wlc (ties to the first in list order).
//!
//! The kernel computes `active + 1` without the factor 256; a common factor changes no
//! comparison, so the choices are the same.
//!
//! The choice is kept in a tournament over the delays
//! ([`LoadIndex`](super::tree::LoadIndex)): O(log n) per load change, one read per pick
//! when the caller tracks loads ([`Scheduler::tracks_loads`]).
use crate::model::RealServer;
use crate::model::SchedulerKind;
use crate::sched::tree::{LoadIndex, Rank};
use crate::sched::wlc::Ratio;
use crate::sched::{PickContext, Scheduler, ServerLoad};

/// `(active + 1) * 256`: the sed (and nq) overhead of a server with `load`.
#[inline]
pub(super) fn expected_delay_overhead(load: ServerLoad) -> u64 {
    (u64::from(load.active) + 1) << 8
}

/// sed's key: `(active + 1) * 256 / weight`.
#[derive(Clone, Copy, Debug, Default)]
struct ExpectedDelay(Ratio);

impl Rank for ExpectedDelay {
    #[inline]
    fn of(weight: u32, load: ServerLoad) -> Self {
        ExpectedDelay(Ratio {
            overhead: expected_delay_overhead(load),
            weight,
        })
    }

    #[inline]
    fn absent() -> Self {
        ExpectedDelay(Ratio::ABSENT)
    }

    #[inline]
    fn beats(&self, earlier: &Self) -> bool {
        self.0.below(&earlier.0)
    }
}

/// Shortest expected delay over an index of the servers' loads.
#[derive(Clone, Debug)]
pub struct ShortestExpectedDelay {
    index: LoadIndex<ExpectedDelay>,
}

impl ShortestExpectedDelay {
    pub fn new(servers: &[RealServer]) -> Self {
        ShortestExpectedDelay {
            index: LoadIndex::new(servers),
        }
    }
}

impl Scheduler for ShortestExpectedDelay {
    fn kind(&self) -> SchedulerKind {
        SchedulerKind::Sed
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
        ShortestExpectedDelay::new(&servers).pick(&servers, &ctx_with(&loads))
    }

    #[test]
    fn the_heavy_server_takes_connections_while_idle_light_ones_wait() {
        // a: w=3, 1 active -> (1+1)*256/3 = 170.7; b: w=1, idle -> (0+1)*256/1 = 256.
        // sed sends to a although b is idle (nq would pick b).
        assert_eq!(pick(&[3, 1], &[(1, 0), (0, 0)]), Some(0));
        // a: 2 active -> 3*256/3 = 256 = b: tie, a (first).
        assert_eq!(pick(&[3, 1], &[(2, 0), (0, 0)]), Some(0));
        // a: 3 active -> 4*256/3 = 341.3 > 256: b.
        assert_eq!(pick(&[3, 1], &[(3, 0), (0, 0)]), Some(1));
    }

    #[test]
    fn inactive_connections_do_not_count() {
        // Both w=1: a = (2+1)*256 = 768 with 1000 inactive, b = (3+1)*256 = 1024: a.
        assert_eq!(pick(&[1, 1], &[(2, 1000), (3, 0)]), Some(0));
    }

    #[test]
    fn differs_from_wlc_on_the_same_state() {
        // a: w=2, 1 active; b: w=1, idle.
        // wlc: a = 256/2 = 128, b = 0/1 = 0 -> b.
        // sed: a = 2*256/2 = 256, b = 1*256/1 = 256 -> tie, a.
        let servers = servers(&[2, 1]);
        let loads = loads(&[(1, 0), (0, 0)]);
        let mut wlc = crate::sched::WeightedLeastConnection::new(&servers);
        assert_eq!(wlc.pick(&servers, &ctx_with(&loads)), Some(1));
        assert_eq!(pick(&[2, 1], &[(1, 0), (0, 0)]), Some(0));
    }

    #[test]
    fn draining_and_empty() {
        // a drained and idle; b: w=1, 7 active -> 2048; c: w=2, 15 active -> 2048: b.
        assert_eq!(pick(&[0, 1, 2], &[(0, 0), (7, 0), (15, 0)]), Some(1));
        assert_eq!(pick(&[], &[]), None);
        assert_eq!(pick(&[0, 0], &[]), None);
    }

    #[test]
    fn tracked_picks_equal_the_linear_scan() {
        fn scan(servers: &[RealServer], loads: &[ServerLoad]) -> Option<usize> {
            crate::sched::wlc::least_weighted_by(servers, |i| {
                expected_delay_overhead(loads.get(i).copied().unwrap_or_default())
            })
        }
        let found = tracked_picks_match_scan(SchedulerKind::Sed, scan, 300);
        assert!(found > 100_000, "{found}");
    }

    #[test]
    fn max_active_does_not_overflow() {
        let max = u32::MAX;
        assert_eq!(pick(&[max, max], &[(max, 0), (max - 1, 0)]), Some(1));
    }
}
