//! Locality-based least connection (`lblc`), as IPVS's `ip_vs_lblc`: connections to
//! one destination address keep going to the server that last took that destination
//! (a cache node keeps its objects hot), unless that server is unavailable or
//! overloaded; then the weighted-least-connection choice ([`super::wlc`]) takes the
//! destination over (seed 001, 3.3: "dh with an escape hatch").
//!
//! The pick, step by step (`ip_vs_lblc_schedule`):
//! 1. Look the destination up in the table. An entry not used for
//!    [`EXPIRATION_MS`] (24 h, the kernel's `lblc_expiration` sysctl default) is gone.
//!    A hit marks the entry used now.
//! 2. If the entry's server has weight > 0 and is not [overloaded](is_overloaded),
//!    pick it.
//! 3. Otherwise pick by wlc among all servers, and record that server for the
//!    destination (replacing the old one).
//!
//! The table has a fixed capacity ([`TABLE_CAPACITY`] = 16384, the kernel's
//! `max_size`, 1024 buckets × 16) allocated when the scheduler is built; a pick never
//! allocates. When it is full, a new destination replaces the least recently used one.
//! The kernel lets its table grow past `max_size` and trims it once a minute, dropping
//! entries idle for more than 6 minutes (`ENTRY_TIMEOUT`); under that pressure the two
//! forget the same kind of entry, the coldest.
//!
//! Time is [`PickContext::now_ms`] and the destination [`PickContext::destination`]:
//! the caller must set both (`with_now_ms`, `with_destination`), or every connection
//! looks like one destination at time 0.
//!
//! A worker rebuilds its schedulers when it adopts a new snapshot, and a rebuilt lblc
//! starts with an empty table: changing any service forgets the localities.
//!
//! **Cost.** Read plainly, both the overload rule and the wlc fallback look at every
//! server, O(n) per pick. When the caller tracks loads ([`Scheduler::tracks_loads`]),
//! lblc and lblcr keep what those two need instead ([`LocalityLoads`]): the wlc choice
//! in a tournament over the servers, O(log n) per load change and one read per pick,
//! and how many servers are light (`active * 2 < weight`), O(1) per change. A pick is
//! then a table lookup and a few reads whatever the pool's size.
use crate::model::RealServer;
use crate::model::SchedulerKind;
use crate::sched::locality::LocalityTable;
use crate::sched::tree::LoadIndex;
use crate::sched::wlc::{least_weighted_connection, Weighted};
use crate::sched::{available, PickContext, Scheduler, ServerLoad};

/// How long a destination entry lives without use: IPVS's `lblc_expiration` default.
pub const EXPIRATION_MS: u64 = 24 * 60 * 60 * 1000;

/// Destinations remembered at most: IPVS's `max_size` (`IP_VS_LBLC_TAB_SIZE * 16`).
pub const TABLE_CAPACITY: usize = 1024 * 16;

/// IPVS's `is_overloaded` for lblc and lblcr: server `index` is overloaded when it has
/// more active connections than its weight **and** some server in the service (any,
/// the server itself included, weight 0 never qualifying) has fewer than half its
/// weight in active connections, `active * 2 < weight`: a busier-than-weight server is
/// left only when there is a clearly lighter one to go to.
#[inline]
pub fn is_overloaded(servers: &[RealServer], ctx: &PickContext, index: usize) -> bool {
    u64::from(ctx.load(index).active) > u64::from(servers[index].weight)
        && servers
            .iter()
            .enumerate()
            .any(|(i, s)| u64::from(ctx.load(i).active) * 2 < u64::from(s.weight))
}

/// What lblc and lblcr know of the servers' loads when the caller tracks them: every
/// load and weight as last told, the wlc choice kept in a tournament, and the number
/// of light servers (`active * 2 < weight`, which [`is_overloaded`] asks about).
#[derive(Clone, Debug)]
pub(crate) struct LocalityLoads {
    wlc: LoadIndex<Weighted>,
    light: usize,
}

impl LocalityLoads {
    pub(crate) fn new(servers: &[RealServer]) -> Self {
        LocalityLoads {
            wlc: LoadIndex::new(servers),
            // Every load starts at zero: light exactly when the weight is above 0.
            light: servers.iter().filter(|s| s.weight > 0).count(),
        }
    }

    fn is_light(&self, index: usize) -> bool {
        let active = self.wlc.loads().get(index).map_or(0, |l| l.active);
        u64::from(active) * 2 < u64::from(self.wlc.weight(index))
    }

    /// Runs `change` on server `index` and keeps the light count in step.
    fn changing(&mut self, index: usize, change: impl FnOnce(&mut LoadIndex<Weighted>)) {
        let before = self.is_light(index);
        change(&mut self.wlc);
        match (before, self.is_light(index)) {
            (false, true) => self.light += 1,
            (true, false) => self.light -= 1,
            _ => {}
        }
    }

    pub(crate) fn set_load(&mut self, index: usize, load: ServerLoad) {
        self.changing(index, |wlc| wlc.set_load(index, load));
    }

    pub(crate) fn set_weight(&mut self, index: usize, weight: u32) {
        self.changing(index, |wlc| wlc.set_weight(index, weight));
    }

    /// Whether a pick with `ctx` over `servers` can use what was told: the caller
    /// says it told every change, and the list is the one this was built for.
    pub(crate) fn usable(&self, servers: &[RealServer], ctx: &PickContext) -> bool {
        ctx.loads_tracked && servers.len() == self.wlc.len()
    }

    /// `ctx` with the loads as told, for the rules that read a few servers' loads.
    pub(crate) fn context<'a>(&'a self, ctx: &PickContext) -> PickContext<'a> {
        PickContext {
            loads: self.wlc.loads(),
            ..*ctx
        }
    }

    /// [`is_overloaded`] from what was told: O(1).
    pub(crate) fn overloaded(&self, servers: &[RealServer], index: usize) -> bool {
        let active = self.wlc.loads().get(index).map_or(0, |l| l.active);
        u64::from(active) > u64::from(servers[index].weight) && self.light > 0
    }

    /// The wlc choice from what was told: one read.
    pub(crate) fn least_weighted(&self) -> Option<usize> {
        self.wlc.winner()
    }
}

/// lblc state: destination address → server index.
#[derive(Clone, Debug)]
pub struct LocalityLeastConnection {
    table: LocalityTable<u32>,
    loads: LocalityLoads,
}

impl LocalityLeastConnection {
    /// With the IPVS defaults: [`TABLE_CAPACITY`] entries, [`EXPIRATION_MS`].
    pub fn new(servers: &[RealServer]) -> Self {
        Self::with_limits(servers, TABLE_CAPACITY, EXPIRATION_MS)
    }

    /// With a table of `capacity` destinations (at least 1) whose entries expire after
    /// `expiration_ms` without use.
    pub fn with_limits(servers: &[RealServer], capacity: usize, expiration_ms: u64) -> Self {
        LocalityLeastConnection {
            table: LocalityTable::new(capacity, expiration_ms),
            loads: LocalityLoads::new(servers),
        }
    }

    /// The server recorded for `destination`, if any (without touching the entry).
    pub fn cached(&self, destination: std::net::Ipv4Addr) -> Option<usize> {
        self.table
            .peek(u32::from(destination))
            .map(|&index| index as usize)
    }

    /// How many destinations the table holds.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.table.len() == 0
    }
}

impl Scheduler for LocalityLeastConnection {
    fn kind(&self) -> SchedulerKind {
        SchedulerKind::Lblc
    }

    fn pick(&mut self, servers: &[RealServer], ctx: &PickContext) -> Option<usize> {
        let key = u32::from(ctx.destination);
        let tracked = self.loads.usable(servers, ctx);
        if let Some(&mut cached) = self.table.lookup(key, ctx.now_ms) {
            let index = cached as usize;
            let overloaded = |i| match tracked {
                true => self.loads.overloaded(servers, i),
                false => is_overloaded(servers, ctx, i),
            };
            if available(servers, index) && !overloaded(index) {
                return Some(index);
            }
        }
        let index = match tracked {
            true => self.loads.least_weighted(),
            false => least_weighted_connection(servers, ctx),
        }?;
        self.table.insert(key, index as u32, ctx.now_ms);
        Some(index)
    }

    fn tracks_loads(&self) -> bool {
        true
    }

    fn set_load(&mut self, index: usize, load: ServerLoad) {
        self.loads.set_load(index, load);
    }

    fn set_weight(&mut self, index: usize, weight: u32) {
        self.loads.set_weight(index, weight);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::test_support::*;
    use crate::sched::ServerLoad;
    use std::net::Ipv4Addr;

    const D1: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 1);
    const D2: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 2);

    #[test]
    fn overload_rule_needs_a_lighter_server() {
        let servers = servers(&[2, 4]);
        let check = |pairs: &[(u32, u32)]| {
            let loads = loads(pairs);
            is_overloaded(&servers, &ctx_with(&loads), 0)
        };
        // a: 3 active > weight 2; b: 1*2 = 2 < 4: a lighter server exists -> overloaded.
        assert!(check(&[(3, 0), (1, 0)]));
        // b: 2*2 = 4, not < 4: nowhere lighter to go -> not overloaded.
        assert!(!check(&[(3, 0), (2, 0)]));
        // a: 2 active, not > weight 2 -> not overloaded, whatever b does.
        assert!(!check(&[(2, 0), (0, 0)]));
        // Inactive connections do not count.
        assert!(!check(&[(2, 1000), (0, 0)]));
    }

    #[test]
    fn same_destination_stays_on_its_server_while_not_overloaded() {
        let servers = servers(&[1, 1, 1]);
        let mut lblc = LocalityLeastConnection::new(&servers);
        let mut load = vec![ServerLoad::default(); 3];
        // First connection to D1: wlc over idle servers -> a (first).
        assert_eq!(lblc.pick(&servers, &ctx_to(D1, 0, &load)), Some(0));
        // D2 arrives when a has 1 active: wlc -> b (0 < 256/1).
        load[0].active = 1;
        assert_eq!(lblc.pick(&servers, &ctx_to(D2, 1, &load)), Some(1));
        load[1].active = 1;
        // D1 again: a has 1 active, not > weight 1: stays on a, although c is idle.
        assert_eq!(lblc.pick(&servers, &ctx_to(D1, 2, &load)), Some(0));
        assert_eq!(lblc.cached(D1), Some(0));
        assert_eq!(lblc.cached(D2), Some(1));
    }

    #[test]
    fn overload_moves_the_destination_and_it_stays_moved() {
        let servers = servers(&[1, 1, 1]);
        let mut lblc = LocalityLeastConnection::new(&servers);
        assert_eq!(lblc.pick(&servers, &ctx_to(D1, 0, &[])), Some(0));
        // a: 2 active > weight 1, and c has 0*2 < 1: overloaded. wlc over
        // a = 512, b = 1*256 = 256, c = 0: c.
        let busy = loads(&[(2, 0), (1, 0), (0, 0)]);
        assert_eq!(lblc.pick(&servers, &ctx_to(D1, 1, &busy)), Some(2));
        assert_eq!(lblc.cached(D1), Some(2));
        // a recovers; D1 stays with c (not overloaded at 1 active).
        let later = loads(&[(0, 0), (0, 0), (1, 0)]);
        assert_eq!(lblc.pick(&servers, &ctx_to(D1, 2, &later)), Some(2));
    }

    #[test]
    fn busy_but_no_lighter_server_keeps_the_locality() {
        let servers = servers(&[1, 1]);
        let mut lblc = LocalityLeastConnection::new(&servers);
        assert_eq!(lblc.pick(&servers, &ctx_to(D1, 0, &[])), Some(0));
        // a: 5 > 1, but b: 1*2 = 2, not < 1: nobody is lighter -> stay on a, even
        // though wlc alone would pick b.
        let load = loads(&[(5, 0), (1, 0)]);
        assert_eq!(lblc.pick(&servers, &ctx_to(D1, 1, &load)), Some(0));
    }

    #[test]
    fn a_draining_cached_server_is_replaced() {
        let mut servers = servers(&[1, 1]);
        let mut lblc = LocalityLeastConnection::new(&servers);
        assert_eq!(lblc.pick(&servers, &ctx_to(D1, 0, &[])), Some(0));
        servers[0].weight = 0;
        assert_eq!(lblc.pick(&servers, &ctx_to(D1, 1, &[])), Some(1));
        servers[0].weight = 1;
        // The entry now says b.
        assert_eq!(lblc.pick(&servers, &ctx_to(D1, 2, &[])), Some(1));
    }

    #[test]
    fn entries_expire_after_24_hours_idle() {
        let servers = servers(&[1, 1]);
        let mut lblc = LocalityLeastConnection::new(&servers);
        assert_eq!(lblc.pick(&servers, &ctx_to(D1, 0, &[])), Some(0));
        // Still remembered after 23 h idle, even when wlc would now say b.
        let a_busy = loads(&[(1, 0), (0, 0)]);
        let hour = 3_600_000;
        assert_eq!(
            lblc.pick(&servers, &ctx_to(D1, 23 * hour, &a_busy)),
            Some(0)
        );
        // 24 h after that use: expired, scheduled afresh by wlc -> b.
        assert_eq!(
            lblc.pick(&servers, &ctx_to(D1, 47 * hour, &a_busy)),
            Some(1)
        );
    }

    #[test]
    fn a_full_table_forgets_the_least_recently_used_destination() {
        let servers = servers(&[1, 1]);
        let mut lblc = LocalityLeastConnection::with_limits(&servers, 2, EXPIRATION_MS);
        let d3 = Ipv4Addr::new(203, 0, 113, 3);
        lblc.pick(&servers, &ctx_to(D1, 0, &[]));
        lblc.pick(&servers, &ctx_to(D2, 1, &[]));
        lblc.pick(&servers, &ctx_to(D1, 2, &[]));
        lblc.pick(&servers, &ctx_to(d3, 3, &[]));
        assert_eq!(lblc.len(), 2);
        assert_eq!(lblc.cached(D2), None);
        assert!(lblc.cached(D1).is_some() && lblc.cached(d3).is_some());
    }

    #[test]
    fn many_destinations_spread_by_wlc() {
        // With connections accumulating, new destinations follow the weights.
        let servers = servers(&[2, 1]);
        let mut lblc = LocalityLeastConnection::new(&servers);
        let mut load = vec![ServerLoad::default(); 2];
        for d in 0..300u32 {
            let i = lblc
                .pick(&servers, &ctx_to(Ipv4Addr::from(d), 0, &load))
                .unwrap();
            load[i].active += 1;
        }
        assert_eq!((load[0].active, load[1].active), (200, 100));
    }

    #[test]
    fn none_when_empty_or_all_draining() {
        let mut lblc = LocalityLeastConnection::new(&[]);
        assert_eq!(lblc.pick(&[], &ctx()), None);
        let drained = servers(&[0, 0]);
        let mut lblc = LocalityLeastConnection::new(&drained);
        assert_eq!(lblc.pick(&drained, &ctx()), None);
        assert!(lblc.is_empty());
    }
}
