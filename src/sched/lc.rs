//! Least connection (`lc`), as IPVS's `ip_vs_lc`: the available server with the
//! smallest overhead `active * 256 + inactive` ([`ServerLoad::overhead`]); weights only
//! decide availability (weight 0 drains). Ties go to the first in list order (IPVS
//! replaces its choice only on a strictly smaller overhead).
//!
//! Counting inactive connections (TIME_WAIT, FIN_WAIT, SYN_RECV...) at 1/256 of an
//! active one keeps a server that just closed many connections from looking idle,
//! while active connections dominate the decision (seed 001, 3.1).
//!
//! [`ServerLoad::overhead`]: super::ServerLoad::overhead
use crate::model::RealServer;
use crate::model::SchedulerKind;
use crate::sched::{PickContext, Scheduler};

/// Least connection; stateless.
#[derive(Clone, Debug, Default)]
pub struct LeastConnection;

impl LeastConnection {
    pub fn new(_servers: &[RealServer]) -> Self {
        LeastConnection
    }
}

impl Scheduler for LeastConnection {
    fn kind(&self) -> SchedulerKind {
        SchedulerKind::Lc
    }

    fn pick(&mut self, servers: &[RealServer], ctx: &PickContext) -> Option<usize> {
        let mut least: Option<(usize, u64)> = None;
        for (index, server) in servers.iter().enumerate() {
            if !server.accepts_new() {
                continue;
            }
            let overhead = ctx.load(index).overhead();
            if least.is_none_or(|(_, loh)| overhead < loh) {
                least = Some((index, overhead));
            }
        }
        least.map(|(index, _)| index)
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
}
