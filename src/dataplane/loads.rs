//! Real-server loads as the load-aware schedulers (lc, wlc, sed, nq, lblc, lblcr, p2c)
//! see them: active and inactive connections summed over **all** workers.
//!
//! Each worker counts its own sessions per real server (`realserver_stats`, one writer
//! per line). Reading every other worker's lines on every new connection would cost a
//! cache miss per real server per worker, so other workers' counts are summed lazily:
//! per service, at most once per refresh interval, and added to this worker's own
//! counts read fresh each time.
//!
//! **Staleness bound.** A decision sees this worker's connections exactly and the
//! other workers' as they were at most one refresh interval ago ([`REFRESH`]): the
//! error is what the other workers opened or closed in that interval. With `W`
//! workers each opening `r` connections per second spread evenly, a real server's
//! count is off by at most about `(W - 1) * r * REFRESH / servers`.
//!
//! **Tracked loads.** A scheduler that keeps its own index over loads (lc, wlc, sed,
//! nq: [`Scheduler::tracks_loads`](crate::sched::Scheduler::tracks_loads)) is not handed every server's load at each pick,
//! which would cost O(n) again. The worker tells it instead: each change of one of
//! its own counts ([`LoadView::tracked_position`] and [`LoadView::load`], O(log n) in
//! the scheduler), and the other workers' sums when they are re-read, only for the
//! servers whose sum moved ([`LoadView::refresh_tracked`]). The staleness bound is
//! the same.
use crate::dataplane::realserver_stats::RealServerCounters;
use crate::model::RealServer;
use crate::sched::ServerLoad;
use crate::service::LoadPositions;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

/// How old the other workers' counts may be.
pub const REFRESH: Duration = Duration::from_micros(500);

/// One worker's view of every worker's real-server counters.
pub struct LoadView {
    /// Every worker's table, by worker index.
    tables: Vec<Arc<Box<[RealServerCounters]>>>,
    me: usize,
    refresh_tsc: u64,
    /// Per service (snapshot index): when the others' sums were taken, and the sums
    /// (indexed like the service's real servers).
    others: Vec<(Option<u64>, Vec<ServerLoad>)>,
    /// Real servers of services whose loads are tracked: id -> (service index,
    /// position in its list), the snapshot's.
    tracked: Arc<LoadPositions>,
}

impl LoadView {
    /// `tables[me]` is this worker's own; `tsc_hz` converts [`REFRESH`] to TSC cycles.
    pub fn new(tables: Vec<Arc<Box<[RealServerCounters]>>>, me: usize, tsc_hz: u64) -> Self {
        LoadView {
            tables,
            me,
            refresh_tsc: (tsc_hz as u128 * REFRESH.as_nanos() / 1_000_000_000) as u64,
            others: Vec::new(),
            tracked: Arc::default(),
        }
    }

    /// Sizes the caches for a new snapshot's services (off the packet path: called when
    /// the worker adopts a snapshot). Each service comes with the index it had in the
    /// snapshot the view was last reset for when its scheduling version did not change
    /// since (the same servers in the same places): it keeps its sums and when they
    /// were taken (a kept load-tracking scheduler already holds them), so its next
    /// pick does not re-read every server. Every other service's sums are forgotten. `tracked` says which servers' count changes are
    /// to be told ([`Snapshot::load_positions`](crate::service::Snapshot::load_positions)).
    pub fn reset<'a>(
        &mut self,
        services: impl Iterator<Item = (&'a [RealServer], Option<usize>)>,
        tracked: Arc<LoadPositions>,
    ) {
        let mut old = std::mem::take(&mut self.others);
        self.tracked = tracked;
        for (servers, kept_from) in services {
            let kept = kept_from
                .and_then(|j| old.get_mut(j))
                .filter(|(_, sums)| sums.len() == servers.len())
                .map(std::mem::take);
            self.others
                .push(kept.unwrap_or_else(|| (None, vec![ServerLoad::default(); servers.len()])));
        }
    }

    /// Fills `out` with the loads of `servers` (service `index` of the snapshot the
    /// view was reset for) at `now_tsc`. Never allocates once `out` has room.
    pub fn loads(
        &mut self,
        index: usize,
        servers: &[RealServer],
        now_tsc: u64,
        out: &mut Vec<ServerLoad>,
    ) {
        out.clear();
        let own = &self.tables[self.me];
        let Some((taken, others)) = self.others.get_mut(index) else {
            // Not reset for this snapshot: own counts only.
            out.extend(servers.iter().map(|rs| load_of(own, rs.id)));
            return;
        };
        let stale = taken.is_none_or(|t| now_tsc.wrapping_sub(t) >= self.refresh_tsc);
        if stale && others.len() == servers.len() {
            for (sum, rs) in others.iter_mut().zip(servers) {
                *sum = ServerLoad::default();
                for (w, table) in self.tables.iter().enumerate() {
                    if w != self.me {
                        let l = load_of(table, rs.id);
                        sum.active = sum.active.wrapping_add(l.active);
                        sum.inactive = sum.inactive.wrapping_add(l.inactive);
                    }
                }
            }
            *taken = Some(now_tsc);
        }
        out.extend(servers.iter().enumerate().map(|(i, rs)| {
            let mine = load_of(own, rs.id);
            let theirs = others.get(i).copied().unwrap_or_default();
            ServerLoad {
                active: mine.active.wrapping_add(theirs.active),
                inactive: mine.inactive.wrapping_add(theirs.inactive),
            }
        }));
    }
}

impl LoadView {
    /// Where real server `id` sits, when its service's loads are tracked:
    /// (service index, position in the service's list).
    #[inline]
    pub fn tracked_position(&self, id: u32) -> Option<(usize, usize)> {
        if self.tracked.is_empty() {
            return None;
        }
        let &(service, position) = self.tracked.get(&id)?;
        Some((service as usize, position as usize))
    }

    /// The load of real server `id`, at `position` in service `index`: this worker's
    /// count now plus the other workers' as last re-read.
    #[inline]
    pub fn load(&self, index: usize, position: usize, id: u32) -> ServerLoad {
        let mine = load_of(&self.tables[self.me], id);
        let theirs = self
            .others
            .get(index)
            .and_then(|(_, others)| others.get(position))
            .copied()
            .unwrap_or_default();
        ServerLoad {
            active: mine.active.wrapping_add(theirs.active),
            inactive: mine.inactive.wrapping_add(theirs.inactive),
        }
    }

    /// For service `index`, whose loads are tracked (its scheduler tracks loads, or
    /// it has connection thresholds): when the other workers' counts are due for a
    /// re-read at `now_tsc`, re-reads them and calls `tell` with the position and load
    /// of each server whose sum moved; the first time after a reset, with every
    /// server's. O(1) between re-reads; never allocates.
    pub fn refresh_tracked(
        &mut self,
        index: usize,
        servers: &[RealServer],
        now_tsc: u64,
        mut tell: impl FnMut(usize, ServerLoad),
    ) {
        let Some((taken, others)) = self.others.get_mut(index) else {
            return;
        };
        let first = taken.is_none();
        if !first && now_tsc.wrapping_sub(taken.unwrap_or(0)) < self.refresh_tsc {
            return;
        }
        *taken = Some(now_tsc);
        if others.len() != servers.len() || (!first && self.tables.len() == 1) {
            // No other worker: nothing to re-read.
            return;
        }
        let own = &self.tables[self.me];
        for (position, (sum, rs)) in others.iter_mut().zip(servers).enumerate() {
            let mut fresh = ServerLoad::default();
            for (w, table) in self.tables.iter().enumerate() {
                if w != self.me {
                    let l = load_of(table, rs.id);
                    fresh.active = fresh.active.wrapping_add(l.active);
                    fresh.inactive = fresh.inactive.wrapping_add(l.inactive);
                }
            }
            if first || fresh != *sum {
                *sum = fresh;
                let mine = load_of(own, rs.id);
                tell(
                    position,
                    ServerLoad {
                        active: mine.active.wrapping_add(fresh.active),
                        inactive: mine.inactive.wrapping_add(fresh.inactive),
                    },
                );
            }
        }
    }
}

fn load_of(table: &[RealServerCounters], id: u32) -> ServerLoad {
    match table.get(id as usize) {
        Some(c) => ServerLoad {
            active: c.active.load(Relaxed) as u32,
            inactive: c.inactive.load(Relaxed) as u32,
        },
        None => ServerLoad::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::realserver_stats;
    use crate::model::ForwardMode;
    use std::net::Ipv4Addr;

    fn servers(n: u32) -> Vec<RealServer> {
        (1..=n)
            .map(|id| RealServer {
                id,
                ip: Ipv4Addr::new(10, 0, 0, id as u8).into(),
                port: 80,
                weight: 1,
                mode: ForwardMode::Nat,
                upper: 0,
                lower: 0,
            })
            .collect()
    }

    fn open(table: &[RealServerCounters], id: u32, active: bool) {
        let c = &table[id as usize];
        RealServerCounters::gauge_add(if active { &c.active } else { &c.inactive }, 1);
    }

    /// A service reset with the index it had keeps its sums and when they were
    /// taken (no re-read, nothing told, within the interval); one reset without it
    /// starts over (every server told at the next refresh).
    #[test]
    fn a_kept_service_keeps_its_sums_across_a_reset() {
        let tables: Vec<_> = (0..2)
            .map(|_| Arc::new(realserver_stats::new_table()))
            .collect();
        let mut view = LoadView::new(tables.clone(), 0, 1_000_000_000);
        let (a, b) = (servers(2), servers(3));
        view.reset(
            [(a.as_slice(), None), (b.as_slice(), None)].into_iter(),
            Arc::default(),
        );
        let mut told = Vec::new();
        view.refresh_tracked(1, &b, 0, |p, _| told.push(p));
        assert_eq!(told, [0, 1, 2], "the first refresh tells every server");
        open(&tables[1], 3, true);
        // The same servers, now at index 0, kept from index 1; a new service after.
        view.reset(
            [(b.as_slice(), Some(1)), (a.as_slice(), None)].into_iter(),
            Arc::default(),
        );
        told.clear();
        view.refresh_tracked(0, &b, 100_000, |p, _| told.push(p));
        assert!(told.is_empty(), "kept sums, taken 100 us ago: {told:?}");
        let mut moved = Vec::new();
        view.refresh_tracked(0, &b, 600_000, |p, l| moved.push((p, l.active)));
        assert_eq!(
            moved,
            [(2, 1)],
            "past the interval only the moved server is told"
        );
        let mut fresh = Vec::new();
        view.refresh_tracked(1, &a, 600_000, |p, _| fresh.push(p));
        assert_eq!(fresh, [0, 1], "not kept: told afresh");
    }

    #[test]
    fn own_counts_are_fresh_others_refresh_after_the_interval() {
        let tables: Vec<_> = (0..2)
            .map(|_| Arc::new(realserver_stats::new_table()))
            .collect();
        let hz = 1_000_000_000; // 1 cycle = 1 ns
        let mut view = LoadView::new(tables.clone(), 0, hz);
        let rs = servers(2);
        view.reset(std::iter::once((rs.as_slice(), None)), Arc::default());
        let mut out = Vec::new();
        view.loads(0, &rs, 0, &mut out);
        assert_eq!(out, vec![ServerLoad::default(); 2]);

        open(&tables[0], 1, true); // mine
        open(&tables[1], 2, true); // another worker's
        open(&tables[1], 2, false);
        view.loads(0, &rs, 100_000, &mut out); // 100 us later: others not re-read
        assert_eq!(
            out[0],
            ServerLoad {
                active: 1,
                inactive: 0
            }
        );
        assert_eq!(out[1], ServerLoad::default());
        view.loads(0, &rs, 600_000, &mut out); // past REFRESH (500 us)
        assert_eq!(
            out[1],
            ServerLoad {
                active: 1,
                inactive: 1
            }
        );
    }

    /// Worker 0 tells a wlc scheduler its own count changes as they happen and the
    /// other worker's at re-reads; a second wlc handed the load slice of a second view
    /// over the same counters must pick the same server at every decision.
    #[test]
    fn a_tracking_scheduler_picks_what_the_load_slice_picks() {
        use crate::model::SchedulerKind;
        use crate::sched::{self, PickContext};
        let tables: Vec<_> = (0..2)
            .map(|_| Arc::new(realserver_stats::new_table()))
            .collect();
        let mut rs = servers(6);
        for (r, w) in rs.iter_mut().zip([3, 1, 0, 2, 2, 5]) {
            r.weight = w;
        }
        let mut tracked_view = LoadView::new(tables.clone(), 0, 1_000_000_000);
        let mut slice_view = LoadView::new(tables.clone(), 0, 1_000_000_000);
        let positions = (rs.iter().enumerate())
            .map(|(position, r)| (r.id, (0, position as u32)))
            .collect();
        tracked_view.reset(std::iter::once((rs.as_slice(), None)), Arc::new(positions));
        slice_view.reset(std::iter::once((rs.as_slice(), None)), Arc::default());
        // Connections from before the scheduler was built.
        open(&tables[0], 4, true);
        open(&tables[1], 5, false);
        let mut tracking = sched::build(SchedulerKind::Wlc, &rs);
        let mut reference = sched::build(SchedulerKind::Wlc, &rs);
        let mut rng = crate::model::rng::Rng::new(11);
        let (mut now, mut out, mut picks) = (0u64, Vec::new(), [0usize; 6]);
        let client = Ipv4Addr::new(198, 18, 0, 9);
        for step in 0..20_000 {
            now += rng.below(100_000);
            let worker = rng.below(2) as usize;
            let id = 1 + rng.below(6) as u32;
            let c = &tables[worker][id as usize];
            match rng.below(4) {
                0 | 1 => {
                    let gauge = if rng.below(2) == 0 {
                        &c.active
                    } else {
                        &c.inactive
                    };
                    let closing = rng.below(2) == 0 && gauge.load(Relaxed) > 0;
                    RealServerCounters::gauge_add(gauge, if closing { -1 } else { 1 });
                    if worker == 0 {
                        let (service, position) = tracked_view.tracked_position(id).unwrap();
                        let load = tracked_view.load(service, position, id);
                        tracking.set_load(position, load);
                    }
                }
                _ => {
                    tracked_view.refresh_tracked(0, &rs, now, |p, l| tracking.set_load(p, l));
                    slice_view.loads(0, &rs, now, &mut out);
                    let tracked_ctx = PickContext::new(client, 40000, &[]).with_tracked_loads();
                    let pick = tracking.pick(&rs, &tracked_ctx);
                    let expected = reference.pick(&rs, &PickContext::new(client, 40000, &out));
                    assert_eq!(pick, expected, "step {step}");
                    picks[pick.unwrap()] += 1;
                }
            }
        }
        // The choice moved over every server that can take connections, never to the
        // drained one.
        let picked: Vec<bool> = picks.iter().map(|&p| p > 0).collect();
        assert_eq!(picked, [true, true, false, true, true, true], "{picks:?}");
    }

    #[test]
    fn a_service_the_view_was_not_reset_for_uses_own_counts() {
        let tables: Vec<_> = (0..2)
            .map(|_| Arc::new(realserver_stats::new_table()))
            .collect();
        let mut view = LoadView::new(tables.clone(), 1, 1_000_000_000);
        let rs = servers(1);
        open(&tables[0], 1, true);
        open(&tables[1], 1, false);
        let mut out = Vec::new();
        view.loads(3, &rs, 0, &mut out);
        assert_eq!(
            out,
            vec![ServerLoad {
                active: 0,
                inactive: 1
            }]
        );
    }
}

/// The staleness bound in action. Worker 0 schedules with the real lc scheduler;
/// worker 1 opens a run of connections per refresh interval, interleaved with worker
/// 0's decisions and all on one server
/// (clients pinned there, say by persistence): the worst case for worker 0's view.
/// At every decision of worker 0 the test compares the loads it saw with the true
/// totals: the error must stay within what worker 1 did in one refresh interval.
#[cfg(test)]
mod skew_tests {
    use super::*;
    use crate::dataplane::realserver_stats;
    use crate::model::ForwardMode;
    use crate::model::SchedulerKind;
    use crate::sched::{self, PickContext};
    use std::net::Ipv4Addr;

    /// The largest error (true minus seen, active connections of one server) over
    /// all of worker 0's decisions, and how many decisions lc would have made
    /// differently with the true counts.
    fn view_error(run: u64) -> (u64, u64) {
        let servers: Vec<RealServer> = (1..=4)
            .map(|id| RealServer {
                id,
                ip: Ipv4Addr::new(10, 0, 0, id as u8).into(),
                port: 80,
                weight: 1,
                mode: ForwardMode::Nat,
                upper: 0,
                lower: 0,
            })
            .collect();
        let tables: Vec<_> = (0..2)
            .map(|_| Arc::new(realserver_stats::new_table()))
            .collect();
        let step = REFRESH.as_nanos() as u64;
        let mut view = LoadView::new(tables.clone(), 0, 1_000_000_000);
        view.reset(std::iter::once((servers.as_slice(), None)), Arc::default());
        let mut lc = sched::build(SchedulerKind::Lc, &servers);
        let mut fresh_lc = sched::build(SchedulerKind::Lc, &servers);
        let (mut seen, mut truth) = (Vec::new(), Vec::new());
        let (mut now, mut worst, mut different) = (0u64, 0u64, 0u64);
        let open = |w: usize, index: usize| {
            let c = &tables[w][servers[index].id as usize];
            RealServerCounters::gauge_add(&c.active, 1);
        };
        for _ in 0..50 {
            for i in 0..run {
                // Worker 1 keeps opening while worker 0 decides.
                open(1, 0);
                // Worker 0's decisions are spread over the interval.
                view.loads(0, &servers, now + i * step / run.max(1), &mut seen);
                truth.clear();
                truth.extend(servers.iter().map(|rs| {
                    ServerLoad {
                        active: tables
                            .iter()
                            .map(|t| t[rs.id as usize].active.load(Relaxed) as u32)
                            .sum(),
                        inactive: 0,
                    }
                }));
                for (s, t) in seen.iter().zip(&truth) {
                    worst = worst.max(u64::from(t.active - s.active));
                }
                let client = Ipv4Addr::new(198, 18, 0, 9);
                let pick = lc
                    .pick(&servers, &PickContext::new(client, 40000, &seen))
                    .expect("a server");
                let ideal = fresh_lc
                    .pick(&servers, &PickContext::new(client, 40000, &truth))
                    .expect("a server");
                different += u64::from(pick != ideal);
                open(0, pick);
            }
            now += step;
        }
        (worst, different)
    }

    #[test]
    fn the_view_is_off_by_at_most_one_interval_of_the_other_worker() {
        for run in [1u64, 4, 16, 64] {
            let (worst, _) = view_error(run);
            assert!(worst <= run, "run {run}: view off by {worst}");
        }
        // Staleness is real and does change decisions: the test can tell.
        let (worst, different) = view_error(64);
        assert!(
            worst > 0 && different > 0,
            "off by {worst}, {different} different"
        );
    }
}
