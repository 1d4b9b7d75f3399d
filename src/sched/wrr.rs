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
//!
//! A pick does not walk the list. Every running weight grows by its weight at every
//! pick, so after `t` picks server `i`'s is the line `weight * t + base`, and the
//! largest is kept in a kinetic tournament over those lines ([`SmoothMax`]): a pick
//! replays the matches whose order changed since the last one and the chosen
//! server's path, O(log n) on usual weight spreads instead of n additions. The
//! sequence is the scan's, pick for pick: same sums, same strict comparison, same
//! tie-breaking. Weights are read when the scheduler is built and through
//! [`Scheduler::set_weight`] (the data plane rebuilds it on every weight change).
use crate::model::RealServer;
use crate::model::SchedulerKind;
use crate::sched::tree::SmoothMax;
use crate::sched::{PickContext, Scheduler};

/// Smooth WRR state: the running weights, as lines in a tournament.
#[derive(Clone, Debug)]
pub struct SmoothWeightedRoundRobin {
    max: SmoothMax,
    /// Id and weight of each server it was built for, to tell whether a rebuilt one
    /// may carry on from it.
    built: Vec<(u32, u32)>,
}

impl SmoothWeightedRoundRobin {
    /// State for `servers`, all running weights 0 (the sequence starts afresh).
    pub fn new(servers: &[RealServer]) -> Self {
        SmoothWeightedRoundRobin {
            max: SmoothMax::new(servers),
            built: servers.iter().map(|s| (s.id, s.weight)).collect(),
        }
    }

    /// The running weights, for tests and diagnostics.
    pub fn current_weights(&self) -> Vec<i64> {
        self.max.current_weights()
    }
}

impl Scheduler for SmoothWeightedRoundRobin {
    fn kind(&self) -> SchedulerKind {
        SchedulerKind::Wrr
    }

    fn pick(&mut self, servers: &[RealServer], _ctx: &PickContext) -> Option<usize> {
        if self.max.len() != servers.len() {
            // The caller kept this instance across a server-list change: restart rather
            // than misattribute state. Allocation happens only on that misuse path.
            self.max = SmoothMax::new(servers);
        }
        self.max.pick()
    }

    fn set_weight(&mut self, index: usize, weight: u32) {
        self.max.set_weight(index, weight);
    }

    /// The running weights carry over when the servers and their weights are the
    /// same; those `previous` was told of since (thresholds) go back to the built ones.
    fn inherit(&mut self, previous: &dyn Scheduler) {
        let Some(previous) = crate::sched::same_kind::<SmoothWeightedRoundRobin>(previous) else {
            return;
        };
        if previous.built != self.built {
            return;
        }
        self.max = previous.max.clone();
        for (index, &(_, weight)) in self.built.iter().enumerate() {
            if self.max.weight(index) != weight {
                self.max.set_weight(index, weight);
            }
        }
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
        assert_eq!(wrr.current_weights(), vec![0, 0, 0]);
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
            assert_eq!(wrr.current_weights(), row.to_vec());
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
        assert_eq!(wrr.current_weights(), vec![0, 0, 0]);
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

    /// The reference: nginx's pass over the list, as the scheduler did before it kept
    /// its running weights in a tournament.
    struct Scan {
        current: Vec<i64>,
    }

    impl Scan {
        fn pick(&mut self, servers: &[RealServer]) -> Option<usize> {
            let mut total: i64 = 0;
            let mut best: Option<usize> = None;
            for (index, server) in servers.iter().enumerate() {
                if !server.accepts_new() {
                    continue;
                }
                let weight = i64::from(server.weight);
                self.current[index] += weight;
                total += weight;
                if best.is_none_or(|b| self.current[index] > self.current[b]) {
                    best = Some(index);
                }
            }
            let chosen = best?;
            self.current[chosen] -= total;
            Some(chosen)
        }
    }

    #[test]
    fn the_sequence_equals_the_scan_through_weight_changes() {
        let mut found = 0;
        for case in 0..300 {
            let mut rng = crate::model::rng::Rng::new(0x5177_0000 + case);
            let (max_weight, weights) = random_pool(&mut rng);
            let n = weights.len();
            let weight = |rng: &mut crate::model::rng::Rng| random_weight(rng, max_weight);
            let mut servers = servers(&weights);
            let mut wrr = SmoothWeightedRoundRobin::new(&servers);
            let mut scan = Scan {
                current: vec![0; n],
            };
            // Whole cycles between changes as well as changes mid-cycle.
            let change_every = [7, 50, 1000][rng.below(3) as usize];
            for step in 0..3000 {
                if step % change_every == change_every - 1 {
                    let i = rng.below(n as u64) as usize;
                    servers[i].weight = weight(&mut rng);
                    wrr.set_weight(i, servers[i].weight);
                }
                let pick = wrr.pick(&servers, &ctx());
                assert_eq!(pick, scan.pick(&servers), "case {case} step {step}");
                assert_eq!(
                    wrr.current_weights(),
                    scan.current,
                    "case {case} step {step}"
                );
                found += usize::from(pick.is_some());
            }
        }
        assert!(found > 500_000, "{found}");
    }

    #[test]
    fn the_first_cycle_is_recorded_then_replayed_and_a_change_leaves_replay() {
        let mut servers = servers(&[10, 4, 6, 0, 2]);
        let mut wrr = SmoothWeightedRoundRobin::new(&servers);
        let mut scan = Scan {
            current: vec![0; servers.len()],
        };
        // Weights 10:4:6:2 have divisor 2: a cycle of 11 picks.
        for step in 0..11 {
            assert!(!wrr.max.replaying(), "step {step}");
            assert_eq!(wrr.pick(&servers, &ctx()), scan.pick(&servers));
        }
        assert!(wrr.max.replaying());
        for step in 0..30 {
            assert_eq!(wrr.pick(&servers, &ctx()), scan.pick(&servers), "{step}");
            assert_eq!(wrr.current_weights(), scan.current, "{step}");
        }
        servers[3].weight = 7;
        wrr.set_weight(3, 7);
        assert!(!wrr.max.replaying());
        for step in 0..100 {
            assert_eq!(wrr.pick(&servers, &ctx()), scan.pick(&servers), "{step}");
        }
        assert_eq!(wrr.current_weights(), scan.current);
    }

    #[test]
    fn a_cycle_too_long_to_record_keeps_the_tournament() {
        // 65535 + 65533 + ... : a cycle far beyond the recorded maximum.
        let weights: Vec<u32> = (0..10u32).map(|i| 65535 - 2 * i).collect();
        let servers = servers(&weights);
        let mut wrr = SmoothWeightedRoundRobin::new(&servers);
        let mut scan = Scan {
            current: vec![0; servers.len()],
        };
        for _ in 0..10_000 {
            assert_eq!(wrr.pick(&servers, &ctx()), scan.pick(&servers));
        }
        assert!(!wrr.max.replaying());
        assert_eq!(wrr.current_weights(), scan.current);
    }

    #[test]
    fn a_long_run_of_large_weights_equals_the_scan() {
        // Many picks with weights up to the maximum: the lines' values reach far past
        // 32 bits and the overtaking picks are far apart.
        let weights: Vec<u32> = (0..40u32).map(|i| 65535 - i * 1637).collect();
        let servers = servers(&weights);
        let mut wrr = SmoothWeightedRoundRobin::new(&servers);
        let mut scan = Scan {
            current: vec![0; servers.len()],
        };
        for step in 0..200_000 {
            assert_eq!(
                wrr.pick(&servers, &ctx()),
                scan.pick(&servers),
                "step {step}"
            );
        }
        assert_eq!(wrr.current_weights(), scan.current);
    }

    #[test]
    fn max_weights_do_not_overflow() {
        let servers = servers(&[65535; 200]);
        let mut wrr = SmoothWeightedRoundRobin::new(&servers);
        let hits = histogram(&mut wrr, &servers, 2000);
        assert!(hits.iter().all(|&h| h == 10), "{hits:?}");
    }
}
