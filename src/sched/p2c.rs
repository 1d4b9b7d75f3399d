//! Power of two choices (`p2c`): draw two different servers at random, each with
//! probability proportional to its weight, and give the connection to the one with
//! fewer active connections (then fewer inactive ones; on a full tie, the one first in
//! list order). Seed 003 (2.5): barely more work than random, but the busiest server
//! stays close to the average, and independent workers do not all rush to the same
//! least-loaded server as they would with a global least-connection choice.
//!
//! The second draw excludes the first server (its weight interval is skipped), so with
//! two or more available servers there are always two distinct candidates, and the
//! most loaded server is never chosen while another is available. With a single
//! available server, that one is picked.
use crate::model::rng::Rng;
use crate::model::RealServer;
use crate::model::SchedulerKind;
use crate::sched::wrandom::CumulativeWeights;
use crate::sched::{PickContext, Scheduler};

/// Power-of-two-choices state: the running weight sums and the random source.
#[derive(Clone, Debug)]
pub struct PowerOfTwoChoices {
    weights: CumulativeWeights,
    rng: Rng,
}

impl PowerOfTwoChoices {
    /// For `servers`, drawing from a generator seeded with `seed`.
    pub fn new(servers: &[RealServer], seed: u64) -> Self {
        PowerOfTwoChoices {
            weights: CumulativeWeights::new(servers),
            rng: Rng::new(seed),
        }
    }

    /// The two candidates (equal when only one server has weight), or None.
    #[inline]
    fn candidates(&mut self) -> Option<(usize, usize)> {
        let total = self.weights.total();
        if total == 0 {
            return None;
        }
        let first = self.weights.owner(self.rng.below(total));
        let first_weight = self.weights.weight(first);
        if first_weight == total {
            return Some((first, first));
        }
        // A number in the total minus the first's interval, mapped around that interval.
        let mut r = self.rng.below(total - first_weight);
        if r >= self.weights.start(first) {
            r += first_weight;
        }
        Some((first, self.weights.owner(r)))
    }
}

impl Scheduler for PowerOfTwoChoices {
    fn kind(&self) -> SchedulerKind {
        SchedulerKind::P2c
    }

    fn pick(&mut self, servers: &[RealServer], ctx: &PickContext) -> Option<usize> {
        if self.weights.is_stale(servers) {
            self.weights.refill(servers);
        }
        for _ in 0..2 {
            let (a, b) = self.candidates()?;
            if servers[a].accepts_new() && servers[b].accepts_new() {
                let (first, second) = (a.min(b), a.max(b));
                let key = |i: usize| {
                    let load = ctx.load(i);
                    (load.active, load.inactive)
                };
                return Some(if key(second) < key(first) {
                    second
                } else {
                    first
                });
            }
            // A weight changed to 0 without a rebuild: recompute once and redraw.
            self.weights.refill(servers);
        }
        None
    }

    fn set_weight(&mut self, index: usize, weight: u32) {
        self.weights.set(index, weight);
    }

    fn inherit(&mut self, previous: &dyn Scheduler) {
        if let Some(previous) = crate::sched::same_kind::<PowerOfTwoChoices>(previous) {
            self.rng = previous.rng.clone();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::test_support::*;
    use crate::sched::ServerLoad;

    #[test]
    fn prefers_the_less_loaded_of_two() {
        // Two servers: the candidates are always both, so the less loaded always wins.
        let servers = servers(&[1, 1]);
        let loads = loads(&[(10, 0), (3, 0)]);
        let mut p2c = PowerOfTwoChoices::new(&servers, 1);
        for _ in 0..1000 {
            assert_eq!(p2c.pick(&servers, &ctx_with(&loads)), Some(1));
        }
    }

    #[test]
    fn inactive_breaks_active_ties_then_list_order() {
        let servers = servers(&[1, 1]);
        let mut p2c = PowerOfTwoChoices::new(&servers, 1);
        let loads_a = loads(&[(2, 9), (2, 1)]);
        assert_eq!(p2c.pick(&servers, &ctx_with(&loads_a)), Some(1));
        let equal = loads(&[(2, 1), (2, 1)]);
        for _ in 0..100 {
            assert_eq!(p2c.pick(&servers, &ctx_with(&equal)), Some(0));
        }
    }

    #[test]
    fn the_most_loaded_is_never_chosen_and_the_least_loaded_wins_often() {
        // Five equal servers, e idle, a swamped. Picks among distinct pairs: a never
        // wins; e wins whenever it is drawn (in 2 of every 5 pairs).
        let servers = servers(&[1, 1, 1, 1, 1]);
        let loads = loads(&[(50, 0), (10, 0), (11, 0), (12, 0), (0, 0)]);
        let mut p2c = PowerOfTwoChoices::new(&servers, 9);
        let mut hits = [0usize; 5];
        for _ in 0..100_000 {
            hits[p2c.pick(&servers, &ctx_with(&loads)).unwrap()] += 1;
        }
        assert_eq!(hits[0], 0, "{hits:?}");
        assert!((39_000..41_000).contains(&hits[4]), "{hits:?}");
    }

    #[test]
    fn balances_a_growing_load() {
        // Each pick adds an active connection: the spread stays tight.
        let servers = servers(&[1; 10]);
        let mut p2c = PowerOfTwoChoices::new(&servers, 5);
        let mut load = vec![ServerLoad::default(); 10];
        for _ in 0..10_000 {
            let i = p2c.pick(&servers, &ctx_with(&load)).unwrap();
            load[i].active += 1;
        }
        let max = load.iter().map(|l| l.active).max().unwrap();
        let min = load.iter().map(|l| l.active).min().unwrap();
        assert!(max - min <= 10, "{load:?}");
    }

    #[test]
    fn candidates_follow_weights() {
        // Without loads (all ties) the first of the two candidates in list order wins;
        // check the draws themselves instead: a (weight 3) is drawn first 3x as often.
        let servers = servers(&[3, 1]);
        let mut p2c = PowerOfTwoChoices::new(&servers, 11);
        let mut first_a = 0;
        for _ in 0..40_000 {
            let (a, b) = p2c.candidates().unwrap();
            assert_ne!(a, b);
            if a == 0 {
                first_a += 1;
            }
        }
        assert!((29_000..31_000).contains(&first_a), "{first_a}");
    }

    #[test]
    fn a_single_available_server_and_draining() {
        let servers = servers(&[0, 2, 0]);
        let loads = loads(&[(0, 0), (99, 0), (0, 0)]);
        let mut p2c = PowerOfTwoChoices::new(&servers, 3);
        for _ in 0..100 {
            assert_eq!(p2c.pick(&servers, &ctx_with(&loads)), Some(1));
        }
    }

    #[test]
    fn same_seed_same_sequence() {
        let servers = servers(&[1, 2, 3, 4]);
        let loads = loads(&[(1, 0), (2, 0), (1, 5), (3, 0)]);
        let mut a = PowerOfTwoChoices::new(&servers, 17);
        let mut b = PowerOfTwoChoices::new(&servers, 17);
        for _ in 0..100 {
            assert_eq!(
                a.pick(&servers, &ctx_with(&loads)),
                b.pick(&servers, &ctx_with(&loads))
            );
        }
    }

    #[test]
    fn none_when_empty_or_all_draining() {
        let mut p2c = PowerOfTwoChoices::new(&[], 0);
        assert_eq!(p2c.pick(&[], &ctx()), None);
        let drained = servers(&[0, 0]);
        let mut p2c = PowerOfTwoChoices::new(&drained, 0);
        assert_eq!(p2c.pick(&drained, &ctx()), None);
    }
}
