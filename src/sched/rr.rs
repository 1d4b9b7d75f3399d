//! Round robin (`rr`): each new connection goes to the next real server in list order,
//! skipping servers with weight 0 (draining), as IPVS's `ip_vs_rr`.
use crate::model::RealServer;
use crate::model::SchedulerKind;
use crate::sched::{PickContext, Scheduler};

/// Round robin state: where the next search starts.
#[derive(Clone, Debug, Default)]
pub struct RoundRobin {
    /// Index tried first on the next pick: the one after the last picked.
    next: usize,
    /// Length of the list it was built for.
    len: usize,
}

impl RoundRobin {
    pub fn new(servers: &[RealServer]) -> Self {
        RoundRobin {
            next: 0,
            len: servers.len(),
        }
    }
}

impl Scheduler for RoundRobin {
    fn kind(&self) -> SchedulerKind {
        SchedulerKind::Rr
    }

    fn pick(&mut self, servers: &[RealServer], _ctx: &PickContext) -> Option<usize> {
        let count = servers.len();
        // A shorter list than last time (a caller that did not rebuild) restarts at 0.
        let mut index = if self.next < count { self.next } else { 0 };
        for _ in 0..count {
            if servers[index].accepts_new() {
                self.next = if index + 1 == count { 0 } else { index + 1 };
                return Some(index);
            }
            index = if index + 1 == count { 0 } else { index + 1 };
        }
        None
    }

    fn inherit(&mut self, previous: &dyn Scheduler) {
        if let Some(previous) = crate::sched::same_kind::<RoundRobin>(previous) {
            self.next = previous.next.checked_rem(self.len).unwrap_or(0);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::test_support::*;

    #[test]
    fn cycles_in_list_order() {
        let servers = servers(&[1, 1, 1]);
        let mut rr = RoundRobin::new(&servers);
        assert_eq!(sequence(&mut rr, &servers, 7), "abcabca");
    }

    #[test]
    fn ignores_weight_magnitude() {
        let servers = servers(&[5, 1, 1]);
        let mut rr = RoundRobin::new(&servers);
        assert_eq!(histogram(&mut rr, &servers, 300), vec![100, 100, 100]);
    }

    #[test]
    fn skips_draining_servers() {
        let servers = servers(&[1, 0, 1, 0]);
        let mut rr = RoundRobin::new(&servers);
        assert_eq!(sequence(&mut rr, &servers, 5), "acaca");
    }

    #[test]
    fn drain_mid_sequence_moves_on_without_repeating() {
        let mut servers = servers(&[1, 1, 1]);
        let mut rr = RoundRobin::new(&servers);
        assert_eq!(sequence(&mut rr, &servers, 1), "a");
        servers[1].weight = 0;
        assert_eq!(sequence(&mut rr, &servers, 4), "caca");
        servers[1].weight = 1;
        assert_eq!(sequence(&mut rr, &servers, 3), "bca");
    }

    #[test]
    fn none_when_empty_or_all_draining() {
        let mut rr = RoundRobin::new(&[]);
        assert_eq!(rr.pick(&[], &ctx()), None);
        let drained = servers(&[0, 0, 0]);
        assert_eq!(rr.pick(&drained, &ctx()), None);
    }

    #[test]
    fn a_shorter_list_does_not_panic() {
        let long = servers(&[1, 1, 1, 1]);
        let mut rr = RoundRobin::new(&long);
        assert_eq!(sequence(&mut rr, &long, 3), "abc");
        let short = servers(&[1, 1]);
        assert_eq!(sequence(&mut rr, &short, 3), "aba");
    }
}
