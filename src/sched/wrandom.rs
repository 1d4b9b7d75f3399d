//! Weighted random (`wrandom`): each new connection goes to server `i` with
//! probability `weight(i) / total weight` (seed 003, 2.6: lay the weights end to end
//! and see where a random number lands). No shared state between workers and no
//! sequence to keep, at the price of short-term noise: with few servers and few
//! connections the split wanders more than wrr's.
//!
//! The running sums of the weights are computed when the scheduler is built and
//! follow [`Scheduler::set_weight`] (connection thresholds take a server out and give
//! it back that way, O(n)); a pick is one random number ([`Rng`]) and a binary search
//! over those sums, O(log n).
use crate::model::rng::Rng;
use crate::model::RealServer;
use crate::model::SchedulerKind;
use crate::sched::{PickContext, Scheduler};

/// Running sums of the weights: `ends[i]` = weight(0) + ... + weight(i). A number `r`
/// in `0..total` belongs to the first server whose end exceeds it, so server `i` owns
/// `[ends[i-1], ends[i])`, an interval as long as its weight (empty for weight 0).
#[derive(Clone, Debug, Default)]
pub(crate) struct CumulativeWeights {
    ends: Vec<u64>,
}

impl CumulativeWeights {
    pub(crate) fn new(servers: &[RealServer]) -> Self {
        let mut weights = CumulativeWeights::default();
        weights.refill(servers);
        weights
    }

    /// Recompute from `servers`; allocates only if the list grew since last time.
    pub(crate) fn refill(&mut self, servers: &[RealServer]) {
        self.ends.clear();
        let mut sum = 0u64;
        for server in servers {
            sum += u64::from(server.weight);
            self.ends.push(sum);
        }
    }

    /// Server `index` now has `weight`: the sums from it on move by the difference.
    /// O(n), no allocation; ignored past the end.
    pub(crate) fn set(&mut self, index: usize, weight: u32) {
        if index >= self.ends.len() {
            return;
        }
        let old = self.weight(index);
        let new = u64::from(weight);
        for end in &mut self.ends[index..] {
            *end = *end - old + new;
        }
    }

    /// Whether `servers` cannot be the list these sums were computed from (another
    /// length): the misuse path of a caller that did not rebuild.
    #[inline]
    pub(crate) fn is_stale(&self, servers: &[RealServer]) -> bool {
        self.ends.len() != servers.len()
    }

    #[inline]
    pub(crate) fn total(&self) -> u64 {
        self.ends.last().copied().unwrap_or(0)
    }

    /// Where server `index`'s interval starts.
    #[inline]
    pub(crate) fn start(&self, index: usize) -> u64 {
        if index == 0 {
            0
        } else {
            self.ends[index - 1]
        }
    }

    #[inline]
    pub(crate) fn weight(&self, index: usize) -> u64 {
        self.ends[index] - self.start(index)
    }

    /// The server owning `r` (`r < total`).
    #[inline]
    pub(crate) fn owner(&self, r: u64) -> usize {
        self.ends.partition_point(|&end| end <= r)
    }
}

/// Weighted random state: the running sums and the random source.
#[derive(Clone, Debug)]
pub struct WeightedRandom {
    weights: CumulativeWeights,
    rng: Rng,
}

impl WeightedRandom {
    /// For `servers`, drawing from a generator seeded with `seed`.
    pub fn new(servers: &[RealServer], seed: u64) -> Self {
        WeightedRandom {
            weights: CumulativeWeights::new(servers),
            rng: Rng::new(seed),
        }
    }
}

impl Scheduler for WeightedRandom {
    fn kind(&self) -> SchedulerKind {
        SchedulerKind::Wrandom
    }

    fn pick(&mut self, servers: &[RealServer], _ctx: &PickContext) -> Option<usize> {
        if self.weights.is_stale(servers) {
            self.weights.refill(servers);
        }
        for _ in 0..2 {
            let total = self.weights.total();
            if total == 0 {
                return None;
            }
            let index = self.weights.owner(self.rng.below(total));
            if servers[index].accepts_new() {
                return Some(index);
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
        if let Some(previous) = crate::sched::same_kind::<WeightedRandom>(previous) {
            self.rng = previous.rng.clone();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::test_support::*;

    #[test]
    fn intervals_follow_the_weights() {
        let weights = CumulativeWeights::new(&servers(&[2, 0, 3]));
        assert_eq!(weights.total(), 5);
        let owners: Vec<usize> = (0..5).map(|r| weights.owner(r)).collect();
        assert_eq!(owners, vec![0, 0, 2, 2, 2]);
        assert_eq!((weights.start(2), weights.weight(2)), (2, 3));
        assert_eq!(weights.weight(1), 0);
    }

    #[test]
    fn one_million_picks_match_the_weights_within_1_percent() {
        let weights = [1, 2, 3, 4, 10];
        let servers = servers(&weights);
        let mut wrandom = WeightedRandom::new(&servers, 42);
        let hits = histogram(&mut wrandom, &servers, 1_000_000);
        let err = worst_relative_error(&hits, &weights);
        assert!(err < 0.01, "{hits:?} {err}");
    }

    #[test]
    fn same_seed_same_sequence() {
        let servers = servers(&[1, 1, 1, 1]);
        let mut a = WeightedRandom::new(&servers, 7);
        let mut b = WeightedRandom::new(&servers, 7);
        let mut c = WeightedRandom::new(&servers, 8);
        let sa = sequence(&mut a, &servers, 64);
        assert_eq!(sa, sequence(&mut b, &servers, 64));
        assert_ne!(sa, sequence(&mut c, &servers, 64));
    }

    #[test]
    fn weight_zero_is_never_picked() {
        let servers = servers(&[0, 1, 0, 2, 0]);
        let mut wrandom = WeightedRandom::new(&servers, 1);
        let hits = histogram(&mut wrandom, &servers, 30_000);
        assert_eq!((hits[0], hits[2], hits[4]), (0, 0, 0));
        assert!(hits[3] > hits[1]);
    }

    #[test]
    fn a_drain_without_rebuild_is_still_respected() {
        let mut servers = servers(&[1, 1, 1]);
        let mut wrandom = WeightedRandom::new(&servers, 3);
        servers[0].weight = 0;
        let hits = histogram(&mut wrandom, &servers, 3_000);
        assert_eq!(hits[0], 0);
    }

    #[test]
    fn a_changed_list_does_not_panic() {
        let four = servers(&[1, 1, 1, 1]);
        let mut wrandom = WeightedRandom::new(&four, 3);
        let two = servers(&[1, 1]);
        for _ in 0..100 {
            assert!(wrandom.pick(&two, &ctx()).unwrap() < 2);
        }
    }

    #[test]
    fn none_when_empty_or_all_draining() {
        let mut wrandom = WeightedRandom::new(&[], 0);
        assert_eq!(wrandom.pick(&[], &ctx()), None);
        let drained = servers(&[0, 0]);
        let mut wrandom = WeightedRandom::new(&drained, 0);
        assert_eq!(wrandom.pick(&drained, &ctx()), None);
    }

    #[test]
    fn set_weight_moves_the_intervals() {
        let servers = servers(&[2, 0, 3]);
        let mut weights = CumulativeWeights::new(&servers);
        weights.set(1, 4);
        assert_eq!(
            (weights.total(), weights.start(2), weights.weight(1)),
            (9, 6, 4)
        );
        weights.set(0, 0);
        let owners: Vec<usize> = (0..7).map(|r| weights.owner(r)).collect();
        assert_eq!(owners, vec![1, 1, 1, 1, 2, 2, 2]);
        weights.set(9, 1);
        assert_eq!(weights.total(), 7);
    }
}
