//! Smooth weighted round robin (`wrr`), with nginx's semantics (seed 003).
//!
//! On every pick each available server's `current` grows by its weight; the server with
//! the strictly largest `current` wins (ties go to the first in list order, so the
//! sequence is reproducible) and loses the total weight. Over one cycle of `total`
//! picks each server is chosen exactly `weight` times, interleaved rather than in runs:
//! 5:1:1 gives `a a b a c a a`, after which every `current` is back to 0.
//!
//! This differs from IPVS's own `ip_vs_wrr`, which walks a decreasing weight threshold
//! and therefore sends runs (`a a a a a b c` for 5:1:1); the smooth order is kinder to
//! real servers' accept queues.
use crate::model::RealServer;
use crate::model::SchedulerKind;
use crate::sched::{PickContext, Scheduler};

/// Smooth WRR state: one running `current` weight per real server.
#[derive(Clone, Debug)]
pub struct SmoothWeightedRoundRobin {
    /// Indexed like the servers slice. `i64` so sums of up to 65535 × many servers can
    /// neither overflow nor lose the zero-sum property that keeps the cycle exact.
    current: Vec<i64>,
}

impl SmoothWeightedRoundRobin {
    /// State for `servers`, all `current` weights 0 (the sequence starts afresh).
    pub fn new(servers: &[RealServer]) -> Self {
        SmoothWeightedRoundRobin {
            current: vec![0; servers.len()],
        }
    }

    /// The running weights, for tests and diagnostics.
    pub fn current_weights(&self) -> &[i64] {
        &self.current
    }
}

impl Scheduler for SmoothWeightedRoundRobin {
    fn kind(&self) -> SchedulerKind {
        SchedulerKind::Wrr
    }

    fn pick(&mut self, servers: &[RealServer], _ctx: &PickContext) -> Option<usize> {
        if self.current.len() != servers.len() {
            // The caller kept this instance across a server-list change: restart rather
            // than misattribute state. Allocation happens only on that misuse path.
            self.current.clear();
            self.current.resize(servers.len(), 0);
        }
        let mut total: i64 = 0;
        let mut best: Option<usize> = None;
        for (index, server) in servers.iter().enumerate() {
            // Draining servers take no part: no weight added, never picked, and left out
            // of the total so the others still sum to zero over a cycle.
            if !server.accepts_new() {
                continue;
            }
            let weight = i64::from(server.weight);
            self.current[index] += weight;
            total += weight;
            // Strictly greater: on a tie the earlier server stays the choice.
            if best.is_none_or(|b| self.current[index] > self.current[b]) {
                best = Some(index);
            }
        }
        let chosen = best?;
        self.current[chosen] -= total;
        Some(chosen)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::test_support::*;

    #[test]
    fn seed_003_sequence_5_1_1_and_return_to_zero() {
        let servers = servers(&[5, 1, 1]);
        let mut wrr = SmoothWeightedRoundRobin::new(&servers);
        assert_eq!(sequence(&mut wrr, &servers, 7), "aabacaa");
        assert_eq!(wrr.current_weights(), &[0, 0, 0]);
        // The cycle repeats exactly.
        assert_eq!(sequence(&mut wrr, &servers, 14), "aabacaaaabacaa");
    }

    #[test]
    fn seed_003_intermediate_current_weights() {
        // The table in seed 003: current weights after each pick's subtraction.
        let expected: [[i64; 3]; 7] = [
            [-2, 1, 1],
            [-4, 2, 2],
            [1, -4, 3],
            [-1, -3, 4],
            [4, -2, -2],
            [2, -1, -1],
            [0, 0, 0],
        ];
        let servers = servers(&[5, 1, 1]);
        let mut wrr = SmoothWeightedRoundRobin::new(&servers);
        for row in expected {
            wrr.pick(&servers, &ctx()).unwrap();
            assert_eq!(wrr.current_weights(), &row);
        }
    }

    #[test]
    fn ties_go_to_the_first_in_list() {
        let equal = servers(&[1, 1, 1]);
        let mut wrr = SmoothWeightedRoundRobin::new(&equal);
        assert_eq!(sequence(&mut wrr, &equal, 6), "abcabc");
        let pair = servers(&[2, 2]);
        let mut wrr = SmoothWeightedRoundRobin::new(&pair);
        assert_eq!(sequence(&mut wrr, &pair, 4), "abab");
    }

    #[test]
    fn exact_proportions_3_2_1_over_600_picks() {
        let servers = servers(&[3, 2, 1]);
        let mut wrr = SmoothWeightedRoundRobin::new(&servers);
        assert_eq!(histogram(&mut wrr, &servers, 600), vec![300, 200, 100]);
    }

    #[test]
    fn every_window_of_one_cycle_is_exact() {
        // Smoothness: any `total` consecutive picks contain each server `weight` times.
        let servers = servers(&[3, 2, 1]);
        let mut wrr = SmoothWeightedRoundRobin::new(&servers);
        let seq: Vec<char> = sequence(&mut wrr, &servers, 60).chars().collect();
        for window in seq.windows(6) {
            let count = |c| window.iter().filter(|&&x| x == c).count();
            assert_eq!(
                (count('a'), count('b'), count('c')),
                (3, 2, 1),
                "{window:?}"
            );
        }
    }

    #[test]
    fn none_when_empty_or_all_zero() {
        let mut wrr = SmoothWeightedRoundRobin::new(&[]);
        assert_eq!(wrr.pick(&[], &ctx()), None);
        let drained = servers(&[0, 0, 0]);
        let mut wrr = SmoothWeightedRoundRobin::new(&drained);
        assert_eq!(wrr.pick(&drained, &ctx()), None);
        assert_eq!(wrr.current_weights(), &[0, 0, 0]);
    }

    #[test]
    fn weight_zero_is_never_picked() {
        let servers = servers(&[2, 0, 1]);
        let mut wrr = SmoothWeightedRoundRobin::new(&servers);
        assert_eq!(histogram(&mut wrr, &servers, 300), vec![200, 0, 100]);
    }

    #[test]
    fn draining_one_server_shifts_new_picks_to_the_rest() {
        let mut servers = servers(&[1, 1, 1]);
        let mut wrr = SmoothWeightedRoundRobin::new(&servers);
        assert_eq!(sequence(&mut wrr, &servers, 3), "abc");
        // The operator drains b; the worker rebuilds its scheduler from the new snapshot.
        servers[1].weight = 0;
        let mut wrr = SmoothWeightedRoundRobin::new(&servers);
        assert_eq!(sequence(&mut wrr, &servers, 6), "acacac");
    }

    #[test]
    fn rebuilding_restarts_the_sequence() {
        let servers = servers(&[5, 1, 1]);
        let mut wrr = SmoothWeightedRoundRobin::new(&servers);
        assert_eq!(sequence(&mut wrr, &servers, 3), "aab");
        let mut rebuilt = SmoothWeightedRoundRobin::new(&servers);
        assert_eq!(sequence(&mut rebuilt, &servers, 7), "aabacaa");
    }

    #[test]
    fn a_changed_list_length_restarts_instead_of_panicking() {
        let three = servers(&[5, 1, 1]);
        let mut wrr = SmoothWeightedRoundRobin::new(&three);
        assert_eq!(sequence(&mut wrr, &three, 2), "aa");
        let two = servers(&[1, 1]);
        assert_eq!(sequence(&mut wrr, &two, 4), "abab");
    }

    #[test]
    fn one_million_picks_match_the_weights_within_1_percent() {
        let weights = [1, 2, 3, 4, 10];
        let servers = servers(&weights);
        let mut wrr = SmoothWeightedRoundRobin::new(&servers);
        let hits = histogram(&mut wrr, &servers, 1_000_000);
        // 1 000 000 picks = 50 000 whole cycles of 20: exact, not just within 1%.
        assert_eq!(hits, vec![50_000, 100_000, 150_000, 200_000, 500_000]);
        assert!(worst_relative_error(&hits, &weights) < 0.01);
    }

    #[test]
    fn max_weights_do_not_overflow() {
        let servers = servers(&[65535; 200]);
        let mut wrr = SmoothWeightedRoundRobin::new(&servers);
        let hits = histogram(&mut wrr, &servers, 2000);
        assert!(hits.iter().all(|&h| h == 10), "{hits:?}");
    }
}
