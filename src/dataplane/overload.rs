//! Connection thresholds (`ipvsadm -x upper -y lower`): a real server that reaches
//! `upper` connections gets no new ones until it falls below `lower`, as IPVS's
//! `IP_VS_DEST_F_OVERLOAD`. Its existing connections carry on.
//!
//! **The rule** ([`overloaded_after`], IPVS's `ip_vs_bind_dest`/`ip_vs_unbind_dest`):
//! connections are active plus inactive (IPVS's `ip_vs_dest_totalconns`: a
//! connection in TIME_WAIT still counts). A server becomes overloaded when they reach
//! `upper` (> 0), and stops being overloaded when they fall below `lower`, or below
//! 3/4 of `upper` when `lower` is 0. Without `upper` a server is never overloaded
//! (IPVS ignores a lone `lower` too).
//!
//! **How schedulers skip an overloaded server.** Every scheduler already skips a
//! server of weight 0 (draining). For a service with thresholds the worker keeps its
//! own copy of the service's real servers, in which an overloaded server's weight is
//! 0, and picks from that copy; schedulers that read weights only when built
//! (wrr, fo, wrandom, p2c, and the load-tracking lc, wlc, sed, nq, lblc and lblcr) hear the change through
//! [`Scheduler::set_weight`](crate::sched::Scheduler::set_weight). So every
//! scheduler, fo included, honours overload, and none had to learn a second notion of
//! "not available". A persistence template still sends its client network to its
//! server when that server is overloaded, as IPVS does.
//!
//! **Over all workers.** The counts are the [`LoadView`](super::loads::LoadView)'s:
//! this worker's exact, the other workers' as re-read at most
//! [`REFRESH`](super::loads::REFRESH) ago. With `W` workers a server can therefore
//! take up to what the other `W - 1` workers open in one refresh interval beyond
//! `upper` (at 100k new connections/s per worker spread over 10 servers: 5 per other
//! worker). With one worker the limit is exact.
//!
//! **What operators see.** Each worker sets a bit in its counters of the server
//! ([`RealServerCounters::set_overloaded`]) when it flips the state; the management
//! core shows a server as overloaded when some worker says so (`-Ln`, `--thresholds`,
//! the JSON listing and the metrics).
//!
//! **Cost.** Services without thresholds: nothing (no copy, no check). With
//! thresholds: a copy of the service's real servers per worker, and on every change of
//! one of its servers' counts one comparison, plus an O(log n) `set_weight` when the
//! state flips.
use crate::dataplane::realserver_stats::RealServerCounters;
use crate::model::RealServer;
use crate::sched::{Scheduler, ServerLoad};

/// Whether a server with thresholds `upper`/`lower` that `was` overloaded is
/// overloaded with `connections` (active + inactive) connections. See the module docs.
pub fn overloaded_after(upper: u32, lower: u32, was: bool, connections: u64) -> bool {
    if upper == 0 {
        return false;
    }
    let upper = u64::from(upper);
    if connections >= upper {
        return true;
    }
    if !was {
        return false;
    }
    if lower != 0 {
        connections >= u64::from(lower)
    } else {
        connections * 4 >= upper * 3
    }
}

/// One service's servers as its scheduler sees them, with overloaded ones at weight 0.
struct ServiceOverload {
    servers: Vec<RealServer>,
    /// The weights of the snapshot, to give back when a server recovers.
    weights: Vec<u32>,
    overloaded: Vec<bool>,
}

/// One worker's overload state for the services of the snapshot it runs.
#[derive(Default)]
pub struct Overload {
    /// By snapshot index; `None` for a service without thresholds.
    services: Vec<Option<ServiceOverload>>,
    /// Real-server ids this worker marked overloaded in its counters.
    marked: Vec<u32>,
}

/// An overload state that flipped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flip {
    pub overloaded: bool,
    /// The weight the scheduler is to use from now on (0 while overloaded).
    pub weight: u32,
}

impl Overload {
    /// Takes up a new snapshot's services (off the packet path). A server that is
    /// overloaded stays so when the new snapshot still has it (same id) with the same
    /// thresholds: leaving the state only below `lower` (or 3/4 of `upper`) is the
    /// point of the rule, and a change elsewhere in the configuration must not let a
    /// server between the two take new connections again. Every other server starts
    /// not overloaded until its counts say so, and the marks this worker left in
    /// `own` for servers no longer overloaded are cleared. The new snapshot's
    /// schedulers still have to hear of the servers kept overloaded: [`Overload::tell`].
    pub fn reset<'a>(
        &mut self,
        services: impl Iterator<Item = &'a [RealServer]>,
        own: &[RealServerCounters],
    ) {
        // (id, upper, lower) of every server overloaded now.
        let mut carried: Vec<(u32, u32, u32)> = self
            .services
            .iter()
            .flatten()
            .flat_map(|s| {
                s.servers
                    .iter()
                    .zip(&s.overloaded)
                    .filter(|(_, &overloaded)| overloaded)
                    .map(|(r, _)| (r.id, r.upper, r.lower))
            })
            .collect();
        carried.sort_unstable();
        self.services.clear();
        let mut kept = Vec::new();
        for servers in services {
            let thresholds = servers.iter().any(|r| r.upper > 0);
            self.services.push(thresholds.then(|| {
                let mut copy = servers.to_vec();
                let overloaded = copy
                    .iter_mut()
                    .map(|r| {
                        let was =
                            r.upper > 0 && carried.binary_search(&(r.id, r.upper, r.lower)).is_ok();
                        if was {
                            r.weight = 0;
                            kept.push(r.id);
                        }
                        was
                    })
                    .collect();
                ServiceOverload {
                    servers: copy,
                    weights: servers.iter().map(|r| r.weight).collect(),
                    overloaded,
                }
            }));
        }
        for id in self.marked.drain(..) {
            if !kept.contains(&id) {
                if let Some(c) = own.get(id as usize) {
                    c.set_overloaded(false);
                }
            }
        }
        self.marked = kept;
    }

    /// Tells service `index`'s scheduler, freshly built from the snapshot's weights,
    /// that the servers [`Overload::reset`] kept overloaded have weight 0.
    pub fn tell(&self, index: usize, scheduler: &mut dyn Scheduler) {
        let Some(Some(s)) = self.services.get(index) else {
            return;
        };
        for (position, _) in s.overloaded.iter().enumerate().filter(|(_, &o)| o) {
            scheduler.set_weight(position, 0);
        }
    }

    /// Whether service `index` has a real server with an upper threshold.
    #[inline]
    pub fn has_thresholds(&self, index: usize) -> bool {
        matches!(self.services.get(index), Some(Some(_)))
    }

    /// The servers service `index`'s scheduler is to pick from, when they differ from
    /// the snapshot's (the service has thresholds).
    #[inline]
    pub fn servers(&self, index: usize) -> Option<&[RealServer]> {
        self.services
            .get(index)?
            .as_ref()
            .map(|s| s.servers.as_slice())
    }

    /// Server `position` of service `index` now has `load`: the flip, if its state
    /// changed.
    #[inline]
    pub fn observe(&mut self, index: usize, position: usize, load: ServerLoad) -> Option<Flip> {
        let s = self.services.get_mut(index)?.as_mut()?;
        let rs = s.servers.get_mut(position)?;
        if rs.upper == 0 {
            return None;
        }
        let was = s.overloaded[position];
        let connections = u64::from(load.active) + u64::from(load.inactive);
        let now = overloaded_after(rs.upper, rs.lower, was, connections);
        if now == was {
            return None;
        }
        s.overloaded[position] = now;
        rs.weight = if now { 0 } else { s.weights[position] };
        Some(Flip {
            overloaded: now,
            weight: rs.weight,
        })
    }

    /// [`observe`](Self::observe), and on a flip tells `scheduler` the server's
    /// weight and marks the server in this worker's counters `own`.
    #[inline]
    pub fn apply(
        &mut self,
        index: usize,
        position: usize,
        load: ServerLoad,
        scheduler: &mut dyn Scheduler,
        own: &[RealServerCounters],
    ) {
        let Some(flip) = self.observe(index, position, load) else {
            return;
        };
        scheduler.set_weight(position, flip.weight);
        let Some(id) = self.services[index]
            .as_ref()
            .and_then(|s| s.servers.get(position))
            .map(|r| r.id)
        else {
            return;
        };
        if let Some(c) = own.get(id as usize) {
            c.set_overloaded(flip.overloaded);
        }
        if flip.overloaded {
            self.marked.push(id);
        } else {
            self.marked.retain(|&m| m != id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::realserver_stats;
    use crate::model::ForwardMode;
    use crate::model::SchedulerKind;
    use crate::sched::{self, PickContext};
    use std::net::Ipv4Addr;

    #[test]
    fn the_ipvs_rule() {
        // (upper, lower, was, connections) -> overloaded
        let table = [
            (0, 0, false, 1_000_000, false), // no upper: never
            (0, 5, true, 10, false),         // a lone lower: never (as IPVS)
            (5, 0, false, 4, false),
            (5, 0, false, 5, true), // reaches upper
            (5, 0, true, 4, true),  // 4*4 = 16 >= 15: still over 3/4
            (5, 0, true, 3, false), // 12 < 15: below 3/4 of upper
            (8, 2, true, 3, true),  // lower given: stays until below it
            (8, 2, true, 2, true),
            (8, 2, true, 1, false),
            (8, 2, false, 3, false), // not overloaded: only upper sets it
            (5, 5, true, 4, false),
        ];
        for (upper, lower, was, n, want) in table {
            assert_eq!(
                overloaded_after(upper, lower, was, n),
                want,
                "upper {upper} lower {lower} was {was} connections {n}"
            );
        }
    }

    fn servers(thresholds: &[(u32, u32)]) -> Vec<RealServer> {
        thresholds
            .iter()
            .enumerate()
            .map(|(i, &(upper, lower))| RealServer {
                id: i as u32 + 1,
                ip: Ipv4Addr::new(10, 0, 0, i as u8 + 1).into(),
                port: 80,
                weight: 3,
                mode: ForwardMode::Nat,
                upper,
                lower,
            })
            .collect()
    }

    #[test]
    fn an_overloaded_server_gets_weight_zero_and_its_weight_back() {
        let own = realserver_stats::new_table();
        let mut o = Overload::default();
        let plain = servers(&[(0, 0), (0, 0)]);
        let limited = servers(&[(2, 0), (0, 0)]);
        o.reset([plain.as_slice(), limited.as_slice()].into_iter(), &own);
        assert!(!o.has_thresholds(0) && o.servers(0).is_none());
        assert!(o.has_thresholds(1));
        let mut s = sched::build(SchedulerKind::Fo, o.servers(1).unwrap());
        o.apply(1, 0, ServerLoad::new(1, 0), &mut *s, &own);
        assert_eq!(o.servers(1).unwrap()[0].weight, 3);
        o.apply(1, 0, ServerLoad::new(1, 1), &mut *s, &own);
        assert_eq!(
            o.servers(1).unwrap()[0].weight,
            0,
            "2 connections reach upper"
        );
        assert!(own[1].overloaded());
        // fo picks the highest weight; ties go to the first. Server 0 is out now.
        let ctx = PickContext::new(Ipv4Addr::LOCALHOST, 1, &[]);
        assert_eq!(s.pick(o.servers(1).unwrap(), &ctx), Some(1));
        // A server without thresholds never flips.
        assert_eq!(o.observe(1, 1, ServerLoad::new(1000, 0)), None);
        // 1 connection: 4 < 2 * 3, below 3/4 of upper.
        o.apply(1, 0, ServerLoad::new(1, 0), &mut *s, &own);
        assert_eq!(o.servers(1).unwrap()[0].weight, 3);
        assert!(!own[1].overloaded());
        assert_eq!(s.pick(o.servers(1).unwrap(), &ctx), Some(0));
        // A reset clears the marks this worker left.
        o.apply(1, 0, ServerLoad::new(2, 0), &mut *s, &own);
        assert!(own[1].overloaded());
        o.reset([plain.as_slice()].into_iter(), &own);
        assert!(!own[1].overloaded());
    }

    #[test]
    fn the_random_schedulers_pick_a_server_again_once_its_overload_ends() {
        for kind in [SchedulerKind::Wrandom, SchedulerKind::P2c] {
            let own = realserver_stats::new_table();
            let mut limited = servers(&[(2, 0), (0, 0)]);
            for rs in &mut limited {
                rs.weight = 1;
            }
            let mut o = Overload::default();
            o.reset([limited.as_slice()].into_iter(), &own);
            let mut s = sched::build(kind, o.servers(0).unwrap());
            let ctx = PickContext::new(Ipv4Addr::LOCALHOST, 1, &[]);
            o.apply(0, 0, ServerLoad::new(2, 0), &mut *s, &own);
            assert_eq!(o.servers(0).unwrap()[0].weight, 0, "{kind}");
            for _ in 0..100 {
                assert_eq!(s.pick(o.servers(0).unwrap(), &ctx), Some(1), "{kind}");
            }
            // 1 connection: below 3/4 of upper, the server takes new ones again.
            o.apply(0, 0, ServerLoad::new(1, 0), &mut *s, &own);
            assert_eq!(o.servers(0).unwrap()[0].weight, 1, "{kind}");
            let again = (0..1000)
                .filter(|_| s.pick(o.servers(0).unwrap(), &ctx) == Some(0))
                .count();
            assert!(again >= 250, "{kind}: picked {again} times in 1000");
        }
    }

    #[test]
    fn a_new_snapshot_keeps_an_overloaded_server_overloaded_until_below_lower() {
        let own = realserver_stats::new_table();
        let mut o = Overload::default();
        let mut limited = servers(&[(100, 0), (0, 0)]);
        o.reset([limited.as_slice()].into_iter(), &own);
        let mut s = sched::build(SchedulerKind::Wrr, o.servers(0).unwrap());
        o.apply(0, 0, ServerLoad::new(100, 0), &mut *s, &own);
        assert_eq!(o.servers(0).unwrap()[0].weight, 0);
        // 90 is between 3/4 of upper (75) and upper: still overloaded.
        o.apply(0, 0, ServerLoad::new(90, 0), &mut *s, &own);
        assert_eq!(o.servers(0).unwrap()[0].weight, 0);
        // An unrelated change (the other server's weight) makes a new snapshot.
        limited[1].weight = 5;
        o.reset([limited.as_slice()].into_iter(), &own);
        assert!(own[1].overloaded(), "the mark stays");
        let mut s = sched::build(SchedulerKind::Wrr, &limited);
        o.tell(0, &mut *s);
        let ctx = PickContext::new(Ipv4Addr::LOCALHOST, 1, &[]);
        assert_eq!(o.observe(0, 0, ServerLoad::new(90, 0)), None);
        assert_eq!(o.servers(0).unwrap()[0].weight, 0);
        for _ in 0..20 {
            assert_eq!(s.pick(o.servers(0).unwrap(), &ctx), Some(1));
        }
        // Below 3/4 of upper: it takes new connections again.
        o.apply(0, 0, ServerLoad::new(74, 0), &mut *s, &own);
        assert_eq!(o.servers(0).unwrap()[0].weight, 3);
        assert!(!own[1].overloaded());
        assert!((0..20).any(|_| s.pick(o.servers(0).unwrap(), &ctx) == Some(0)));
        // New thresholds start afresh: 90 is below the new upper.
        o.apply(0, 0, ServerLoad::new(100, 0), &mut *s, &own);
        o.apply(0, 0, ServerLoad::new(90, 0), &mut *s, &own);
        limited[0].upper = 200;
        o.reset([limited.as_slice()].into_iter(), &own);
        assert!(!own[1].overloaded());
        assert_eq!(o.servers(0).unwrap()[0].weight, 3);
        assert_eq!(o.observe(0, 0, ServerLoad::new(90, 0)), None);
    }
}
