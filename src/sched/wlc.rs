//! Weighted least connection (`wlc`), as IPVS's `ip_vs_wlc`, and the default
//! scheduler ([`SchedulerKind::DEFAULT`]).
//!
//! The available server with the smallest `overhead / weight`, where overhead is
//! `active * 256 + inactive` (seed 001, 3.1: `(active*256+inactive)/weight`). As in the
//! kernel there is no division: server `d` replaces the current choice `least` when
//! `overhead(least) * weight(d) > overhead(d) * weight(least)`, strictly, so ties go to
//! the first in list order. Products are computed in 128 bits (an overhead reaches
//! 2^40 and a weight 2^32 in this model), so nothing overflows.
//!
//! The choice is kept in a tournament over `(overhead, weight)` pairs compared the same
//! way ([`LoadIndex`](super::tree::LoadIndex)): O(log n) per load change, one read per
//! pick when the caller tracks loads ([`Scheduler::tracks_loads`]).
//!
//! Seed 001 warns where it misleads: a fast server's active count falls first, so wlc
//! keeps feeding it; with long-lived connections, counts stop reflecting load.
use crate::model::RealServer;
use crate::model::SchedulerKind;
use crate::sched::tree::{LoadIndex, Rank};
use crate::sched::{PickContext, Scheduler, ServerLoad};

/// `overhead / weight` as a pair, compared by cross-multiplication in 128 bits.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Ratio {
    pub overhead: u64,
    pub weight: u32,
}

impl Ratio {
    /// No server: `u64::MAX / 0`, an infinite ratio. [`Ratio::below`] then holds
    /// for every real ratio (`MAX * w > overhead * 0`) and never for it (`x * 0 >`
    /// is false).
    pub const ABSENT: Ratio = Ratio {
        overhead: u64::MAX,
        weight: 0,
    };

    /// `self < other` as fractions (both weights > 0), exactly as the scan compares.
    #[inline]
    pub fn below(&self, other: &Ratio) -> bool {
        u128::from(other.overhead) * u128::from(self.weight)
            > u128::from(self.overhead) * u128::from(other.weight)
    }
}

/// wlc's key: `(active * 256 + inactive) / weight`.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Weighted(Ratio);

impl Rank for Weighted {
    #[inline]
    fn of(weight: u32, load: ServerLoad) -> Self {
        Weighted(Ratio {
            overhead: load.overhead(),
            weight,
        })
    }

    #[inline]
    fn absent() -> Self {
        Weighted(Ratio::ABSENT)
    }

    #[inline]
    fn beats(&self, earlier: &Self) -> bool {
        self.0.below(&earlier.0)
    }
}

/// Weighted least connection over an index of the servers' loads.
#[derive(Clone, Debug)]
pub struct WeightedLeastConnection {
    index: LoadIndex<Weighted>,
}

impl WeightedLeastConnection {
    pub fn new(servers: &[RealServer]) -> Self {
        WeightedLeastConnection {
            index: LoadIndex::new(servers),
        }
    }
}

/// The index minimising `overhead(i) / weight(i)` over servers with weight > 0, where
/// `overhead` is given per index; ties to the first: the linear scan lblc and lblcr
/// fall back on (IPVS repeats this loop in each module), and the reference wlc's and
/// sed's tests check their indexes against.
#[inline]
pub(crate) fn least_weighted_by(
    servers: &[RealServer],
    overhead: impl Fn(usize) -> u64,
) -> Option<usize> {
    let mut least: Option<(usize, u64, u32)> = None;
    for (index, server) in servers.iter().enumerate() {
        if !server.accepts_new() {
            continue;
        }
        let doh = overhead(index);
        match least {
            // loh / lw > doh / dw  <=>  loh * dw > doh * lw  (both weights > 0).
            Some((_, loh, lw))
                if u128::from(loh) * u128::from(server.weight)
                    <= u128::from(doh) * u128::from(lw) => {}
            _ => least = Some((index, doh, server.weight)),
        }
    }
    least.map(|(index, _, _)| index)
}

/// The wlc choice: least `(active * 256 + inactive) / weight`. Also lblc's and lblcr's
/// fallback when their cached server will not do (`__ip_vs_lblc_schedule`).
#[inline]
pub(crate) fn least_weighted_connection(
    servers: &[RealServer],
    ctx: &PickContext,
) -> Option<usize> {
    least_weighted_by(servers, |i| ctx.load(i).overhead())
}

impl Scheduler for WeightedLeastConnection {
    fn kind(&self) -> SchedulerKind {
        SchedulerKind::Wlc
    }

    fn pick(&mut self, servers: &[RealServer], ctx: &PickContext) -> Option<usize> {
        self.index.pick(servers, ctx)
    }

    fn tracks_loads(&self) -> bool {
        true
    }

    fn set_load(&mut self, index: usize, load: ServerLoad) {
        self.index.set_load(index, load);
    }

    fn set_weight(&mut self, index: usize, weight: u32) {
        self.index.set_weight(index, weight);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::test_support::*;

    fn pick(weights: &[u32], pairs: &[(u32, u32)]) -> Option<usize> {
        let servers = servers(weights);
        let loads = loads(pairs);
        WeightedLeastConnection::new(&servers).pick(&servers, &ctx_with(&loads))
    }

    #[test]
    fn weight_scales_the_overhead() {
        // a: w=3, 6 active, 0 inactive -> 6*256/3 = 512
        // b: w=1, 2 active, 10 inactive -> (512+10)/1 = 522
        // c: w=2, 4 active, 0 inactive -> 1024/2 = 512 (ties a: a stays, first)
        assert_eq!(pick(&[3, 1, 2], &[(6, 0), (2, 10), (4, 0)]), Some(0));
        // Same with a one more inactive: a = 1537/3 = 512.33 > c = 512: c.
        assert_eq!(pick(&[3, 1, 2], &[(6, 1), (2, 10), (4, 0)]), Some(2));
    }

    #[test]
    fn heavier_server_takes_more_before_the_lighter_one() {
        // a: w=4, 3 active -> 768/4 = 192; b: w=1, 1 active -> 256/1 = 256: a, even
        // with three times b's connections.
        assert_eq!(pick(&[4, 1], &[(3, 0), (1, 0)]), Some(0));
        // a: 4 active -> 1024/4 = 256 = b's 256: tie, a (first).
        assert_eq!(pick(&[4, 1], &[(4, 0), (1, 0)]), Some(0));
        // a: 5 active -> 1280/4 = 320 > 256: b.
        assert_eq!(pick(&[4, 1], &[(5, 0), (1, 0)]), Some(1));
    }

    #[test]
    fn inactive_connections_break_active_ties() {
        // Both w=1, 2 active; a has 3 inactive (515), b has 1 (513): b.
        assert_eq!(pick(&[1, 1], &[(2, 3), (2, 1)]), Some(1));
    }

    #[test]
    fn idle_servers_tie_to_the_first_available() {
        // All zero overhead: 0 * w > 0 * w never holds, so the first available wins.
        assert_eq!(pick(&[0, 5, 1], &[]), Some(1));
    }

    #[test]
    fn draining_server_is_skipped_even_when_idle() {
        // a: w=0, idle; b: w=1, 9 active -> 2304: b.
        assert_eq!(pick(&[0, 1], &[(0, 0), (9, 0)]), Some(1));
    }

    #[test]
    fn none_when_empty_or_all_draining() {
        assert_eq!(pick(&[], &[]), None);
        assert_eq!(pick(&[0, 0, 0], &[]), None);
    }

    #[test]
    fn extreme_values_do_not_overflow() {
        let max = u32::MAX;
        // a: (max*256 + max) * max_weight vs b: one less active, same weight: b.
        assert_eq!(pick(&[max, max], &[(max, max), (max - 1, max)]), Some(1));
        // a: w=max, 1 active -> tiny ratio; b: w=1, idle -> 0: b.
        assert_eq!(pick(&[max, 1], &[(1, 0), (0, 0)]), Some(1));
    }

    #[test]
    fn tracked_picks_equal_the_linear_scan() {
        fn scan(servers: &[RealServer], loads: &[ServerLoad]) -> Option<usize> {
            least_weighted_by(servers, |i| {
                loads.get(i).copied().unwrap_or_default().overhead()
            })
        }
        let found = tracked_picks_match_scan(SchedulerKind::Wlc, scan, 300);
        assert!(found > 100_000, "{found}");
    }

    #[test]
    fn follows_weights_when_connections_accumulate() {
        // Each pick opens a connection that stays active: over 600 picks the counts
        // settle at the 3:2:1 weights exactly (every new connection equalises ratios).
        let servers = servers(&[3, 2, 1]);
        let mut wlc = WeightedLeastConnection::new(&servers);
        let mut load = vec![crate::sched::ServerLoad::default(); 3];
        for _ in 0..600 {
            let i = wlc.pick(&servers, &ctx_with(&load)).unwrap();
            load[i].active += 1;
        }
        let active: Vec<u32> = load.iter().map(|l| l.active).collect();
        assert_eq!(active, vec![300, 200, 100]);
    }
}
