//! Weighted failover (`fo`), as IPVS's `ip_vs_fo`: every new connection goes to the
//! available server with the highest weight; ties to the first in list order. Give
//! the primary the highest weight and the standbys lower ones: when the primary
//! drains (weight 0) the next highest takes over, and new connections return to the
//! primary once its weight is restored.
use crate::model::RealServer;
use crate::model::SchedulerKind;
use crate::sched::{PickContext, Scheduler};

/// Weighted failover; stateless.
#[derive(Clone, Debug, Default)]
pub struct WeightedFailover;

impl WeightedFailover {
    pub fn new(_servers: &[RealServer]) -> Self {
        WeightedFailover
    }
}

impl Scheduler for WeightedFailover {
    fn kind(&self) -> SchedulerKind {
        SchedulerKind::Fo
    }

    fn pick(&mut self, servers: &[RealServer], _ctx: &PickContext) -> Option<usize> {
        let mut best: Option<(usize, u32)> = None;
        for (index, server) in servers.iter().enumerate() {
            // Strictly greater: the first of equal weights stays (weight 0 never wins).
            if server.weight > best.map_or(0, |(_, w)| w) {
                best = Some((index, server.weight));
            }
        }
        best.map(|(index, _)| index)
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
        servers[0].weight = 0;
        assert_eq!(sequence(&mut fo, &servers, 2), "bb");
        servers[1].weight = 0;
        assert_eq!(sequence(&mut fo, &servers, 2), "cc");
        servers[2].weight = 0;
        assert_eq!(sequence(&mut fo, &servers, 2), "--");
        servers[0].weight = 10;
        assert_eq!(sequence(&mut fo, &servers, 2), "aa");
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
