//! Least connection (`lc`), as IPVS's `ip_vs_lc`: the available server with the
//! smallest overhead `active * 256 + inactive` ([`ServerLoad::overhead`]); weights only
//! decide availability (weight 0 drains). Ties go to the first in list order (IPVS
//! replaces its choice only on a strictly smaller overhead).
//!
//! Counting inactive connections (TIME_WAIT, FIN_WAIT, SYN_RECV...) at 1/256 of an
//! active one keeps a server that just closed many connections from looking idle,
//! while active connections dominate the decision (seed 001, 3.1).
//!
//! The choice is kept in a tournament over the servers' overheads
//! ([`LoadIndex`](super::tree::LoadIndex)): O(log n) per load change, one read per pick
//! when the caller tracks loads ([`Scheduler::tracks_loads`]).
//!
//! [`ServerLoad::overhead`]: super::ServerLoad::overhead
use crate::model::RealServer;
use crate::model::SchedulerKind;
use crate::sched::tree::{LoadIndex, Rank};
use crate::sched::{PickContext, Scheduler, ServerLoad};

/// lc's key: the overhead; the smaller wins.
#[derive(Clone, Copy, Debug, Default)]
struct Overhead(u64);

impl Rank for Overhead {
    #[inline]
    fn of(_weight: u32, load: ServerLoad) -> Self {
        Overhead(load.overhead())
    }

    /// Above any overhead (at most about 2^40).
    #[inline]
    fn absent() -> Self {
        Overhead(u64::MAX)
    }

    #[inline]
    fn beats(&self, earlier: &Self) -> bool {
        self.0 < earlier.0
    }
}

/// Least connection over an index of the servers' loads.
#[derive(Clone, Debug)]
pub struct LeastConnection {
    index: LoadIndex<Overhead>,
}

impl LeastConnection {
    pub fn new(servers: &[RealServer]) -> Self {
        LeastConnection {
            index: LoadIndex::new(servers),
        }
    }
}

impl Scheduler for LeastConnection {
    fn kind(&self) -> SchedulerKind {
        SchedulerKind::Lc
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
        LeastConnection::new(&servers).pick(&servers, &ctx_with(&loads))
    }

    #[test]
    fn fewest_active_wins() {
        // Overheads: a = 3*256 + 0 = 768, b = 1*256 + 0 = 256, c = 2*256 + 0 = 512.
        assert_eq!(pick(&[1, 1, 1], &[(3, 0), (1, 0), (2, 0)]), Some(1));
    }

    #[test]
    fn inactive_counts_at_one_256th() {
        // a = 1*256 + 300 = 556, b = 2*256 + 0 = 512: b, despite more active ones.
        assert_eq!(pick(&[1, 1], &[(1, 300), (2, 0)]), Some(1));
        // a = 1*256 + 255 = 511, b = 512: a.
        assert_eq!(pick(&[1, 1], &[(1, 255), (2, 0)]), Some(0));
    }

    #[test]
    fn weight_magnitude_is_ignored() {
        // a (weight 100) = 10*256 = 2560, b (weight 1) = 9*256 = 2304: b.
        assert_eq!(pick(&[100, 1], &[(10, 0), (9, 0)]), Some(1));
    }

    #[test]
    fn ties_go_to_the_first_and_draining_is_skipped() {
        // a is drained although idle; b = c = 256 + 4 = 260: b (first of the tie).
        assert_eq!(pick(&[0, 1, 1], &[(0, 0), (1, 4), (1, 4)]), Some(1));
    }

    #[test]
    fn missing_loads_count_as_idle() {
        // Only a's load is known (5*256 = 1280); b and c count as 0: b.
        assert_eq!(pick(&[1, 1, 1], &[(5, 0)]), Some(1));
        assert_eq!(pick(&[1, 1, 1], &[]), Some(0));
    }

    #[test]
    fn none_when_empty_or_all_draining() {
        assert_eq!(pick(&[], &[]), None);
        assert_eq!(pick(&[0, 0], &[(0, 0), (0, 0)]), None);
    }

    #[test]
    fn counts_never_overflow() {
        let max = u32::MAX;
        assert_eq!(pick(&[1, 1], &[(max, max), (max, max - 1)]), Some(1));
    }

    /// The reference: IPVS's walk of the list, replacing its choice only on a
    /// strictly smaller overhead.
    fn scan(servers: &[RealServer], loads: &[ServerLoad]) -> Option<usize> {
        let mut least: Option<(usize, u64)> = None;
        for (index, server) in servers.iter().enumerate() {
            if !server.accepts_new() {
                continue;
            }
            let overhead = loads.get(index).copied().unwrap_or_default().overhead();
            if least.is_none_or(|(_, loh)| overhead < loh) {
                least = Some((index, overhead));
            }
        }
        least.map(|(index, _)| index)
    }

    #[test]
    fn tracked_picks_equal_the_linear_scan() {
        let found = tracked_picks_match_scan(crate::model::SchedulerKind::Lc, scan, 300);
        assert!(found > 100_000, "{found}");
    }

    #[test]
    fn a_load_change_moves_the_choice_without_a_context() {
        let servers = servers(&[1, 1, 1]);
        let mut lc = LeastConnection::new(&servers);
        let tracked = ctx().with_tracked_loads();
        assert_eq!(lc.pick(&servers, &tracked), Some(0));
        lc.set_load(0, ServerLoad::new(1, 0));
        assert_eq!(lc.pick(&servers, &tracked), Some(1));
        lc.set_load(1, ServerLoad::new(0, 1));
        assert_eq!(lc.pick(&servers, &tracked), Some(2));
        lc.set_weight(2, 0);
        assert_eq!(lc.pick(&servers, &tracked), Some(1));
        lc.set_load(0, ServerLoad::default());
        assert_eq!(lc.pick(&servers, &tracked), Some(0));
    }
}
