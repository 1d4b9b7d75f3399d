//! Weighted failover (`fo`), as IPVS's `ip_vs_fo`: every new connection goes to the
//! available server with the highest weight; ties to the first in list order. Give
//! the primary the highest weight and the standbys lower ones: when the primary
//! drains (weight 0) the next highest takes over, and new connections return to the
//! primary once its weight is restored.
//!
//! Weights are read when the scheduler is built and through
//! [`Scheduler::set_weight`] (the data plane rebuilds it on every weight change); the
//! choice is kept in a tournament over them ([`LoadIndex`]), so a pick is one read
//! and a weight change O(log n).
use crate::model::RealServer;
use crate::model::SchedulerKind;
use crate::sched::tree::{LoadIndex, Rank};
use crate::sched::{PickContext, Scheduler, ServerLoad};

/// fo's key: the weight; the higher wins, the first of equal weights stays.
#[derive(Clone, Copy, Debug, Default)]
struct Weight(u32);

impl Rank for Weight {
    #[inline]
    fn of(weight: u32, _load: ServerLoad) -> Self {
        Weight(weight)
    }

    /// Weight 0: beaten by any server that can take connections.
    #[inline]
    fn absent() -> Self {
        Weight(0)
    }

    #[inline]
    fn beats(&self, earlier: &Self) -> bool {
        self.0 > earlier.0
    }
}

/// Weighted failover over an index of the servers' weights.
#[derive(Clone, Debug)]
pub struct WeightedFailover {
    index: LoadIndex<Weight>,
}

impl WeightedFailover {
    pub fn new(servers: &[RealServer]) -> Self {
        WeightedFailover {
            index: LoadIndex::new(servers),
        }
    }
}

impl Scheduler for WeightedFailover {
    fn kind(&self) -> SchedulerKind {
        SchedulerKind::Fo
    }

    fn pick(&mut self, servers: &[RealServer], _ctx: &PickContext) -> Option<usize> {
        if servers.len() != self.index.len() {
            // Kept across a list change (a caller that did not rebuild): start over
            // from this list. Allocation happens only on that misuse path.
            self.index.rebuild(servers, &[]);
        }
        self.index.winner()
    }

    fn set_weight(&mut self, index: usize, weight: u32) {
        self.index.set_weight(index, weight);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::test_support::*;

    #[test]
    fn picks_the_highest_weight_every_time() {
        let servers = servers(&[2, 5, 3]);
        let mut fo = WeightedFailover::new(&servers);
        assert_eq!(sequence(&mut fo, &servers, 5), "bbbbb");
    }

    #[test]
    fn ties_go_to_the_first() {
        let servers = servers(&[1, 4, 4]);
        let mut fo = WeightedFailover::new(&servers);
        assert_eq!(sequence(&mut fo, &servers, 3), "bbb");
    }

    #[test]
    fn fails_over_when_the_primary_drains_and_back() {
        let mut servers = servers(&[10, 5, 1]);
        let mut fo = WeightedFailover::new(&servers);
        assert_eq!(sequence(&mut fo, &servers, 2), "aa");
        for (index, weight, expected) in [(0, 0, "bb"), (1, 0, "cc"), (2, 0, "--"), (0, 10, "aa")] {
            servers[index].weight = weight;
            fo.set_weight(index, weight);
            assert_eq!(sequence(&mut fo, &servers, 2), expected);
            // A rebuild from the changed list agrees.
            let mut rebuilt = WeightedFailover::new(&servers);
            assert_eq!(sequence(&mut rebuilt, &servers, 2), expected);
        }
    }

    /// The reference: IPVS's walk, keeping the first of the highest weights.
    fn scan(servers: &[RealServer]) -> Option<usize> {
        let mut best: Option<(usize, u32)> = None;
        for (index, server) in servers.iter().enumerate() {
            if server.weight > best.map_or(0, |(_, w)| w) {
                best = Some((index, server.weight));
            }
        }
        best.map(|(index, _)| index)
    }

    #[test]
    fn picks_equal_the_linear_scan_through_weight_changes() {
        let mut found = 0;
        for case in 0..300 {
            let mut rng = crate::model::rng::Rng::new(0xf0_0000 + case);
            let (max_weight, weights) = random_pool(&mut rng);
            let n = weights.len();
            let weight = |rng: &mut crate::model::rng::Rng| random_weight(rng, max_weight);
            let mut servers = servers(&weights);
            let mut fo = WeightedFailover::new(&servers);
            for step in 0..500 {
                if rng.below(3) == 0 {
                    let i = rng.below(n as u64) as usize;
                    servers[i].weight = weight(&mut rng);
                    fo.set_weight(i, servers[i].weight);
                }
                let pick = fo.pick(&servers, &ctx());
                assert_eq!(pick, scan(&servers), "case {case} step {step}");
                found += usize::from(pick.is_some());
            }
        }
        assert!(found > 100_000, "{found}");
    }

    #[test]
    fn loads_are_ignored() {
        let servers = servers(&[3, 1]);
        let loads = loads(&[(1000, 0), (0, 0)]);
        let mut fo = WeightedFailover::new(&servers);
        assert_eq!(fo.pick(&servers, &ctx_with(&loads)), Some(0));
    }

    #[test]
    fn none_when_empty_or_all_draining() {
        let mut fo = WeightedFailover::new(&[]);
        assert_eq!(fo.pick(&[], &ctx()), None);
        let drained = servers(&[0, 0]);
        assert_eq!(fo.pick(&drained, &ctx()), None);
    }
}
