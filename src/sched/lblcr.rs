//! Locality-based least connection with replication (`lblcr`), as IPVS's
//! `ip_vs_lblcr`: like lblc, but a destination maps to a *set* of servers, which grows
//! when all of it is busy and shrinks again when it has been stable for long (seed 001,
//! 3.3: "replicate a hot cache object onto more nodes").
//!
//! The pick, step by step (`ip_vs_lblcr_schedule`; the kernel's own pseudo code):
//! 1. Look the destination up. An entry not used for [`EXPIRATION_MS`] is gone.
//!    - No entry: pick by wlc among all servers, create the entry with that server as
//!      the whole set, and pick it.
//! 2. `n` = the set member with the least `(active * 256 + inactive) / weight` among
//!    members with weight > 0 (none if all members drain).
//! 3. If the set has more than one member and was last modified more than
//!    [`EXPIRATION_MS`] ago, remove its *most* loaded member (same ratio, largest),
//!    which counts as a modification. This happens before step 4 and uses `n` as found
//!    in step 2, as the kernel does.
//! 4. If `n` exists and is not [overloaded](super::lblc::is_overloaded), pick it.
//! 5. Otherwise pick by wlc among all servers and add that server to the set (if it is
//!    not already a member; a modification).
//!
//! **The expiry is 24 hours for both entries and set shrinking**: the kernel compares
//! `set.lastmod` with the `lblcr_expiration` sysctl, whose default is
//! `DEFAULT_EXPIRATION` = 24 h, and expires idle entries with the same sysctl. Its
//! 6-minute `ENTRY_TIMEOUT` is only the idle time after which its garbage collector
//! may drop entries once the table is over its maximum size, which Sluice's fixed
//! table replaces by least-recently-used replacement ([`super::lblc`]).
//!
//! Ties within a set go to the most recently added member (the kernel adds members at
//! the head of the set's list and scans from there). A set holds at most
//! [`MAX_REPLICAS`] members in a fixed array; when it is full, step 5 still picks the
//! wlc server but does not add it, as the kernel does when it cannot allocate a member.
//!
//! Time, destination, capacity and rebuilds: as lblc ([`super::lblc`]).
use crate::model::RealServer;
use crate::model::SchedulerKind;
use crate::sched::lblc::{is_overloaded, LocalityLoads};
use crate::sched::locality::LocalityTable;
use crate::sched::wlc::least_weighted_connection;
use crate::sched::{available, PickContext, Scheduler, ServerLoad};

/// How long an entry lives without use, and how long a set must stay unmodified
/// before it sheds a member: IPVS's `lblcr_expiration` default (24 h).
pub const EXPIRATION_MS: u64 = 24 * 60 * 60 * 1000;

/// Destinations remembered at most: IPVS's `max_size` (`IP_VS_LBLCR_TAB_SIZE * 16`).
pub const TABLE_CAPACITY: usize = 1024 * 16;

/// Most servers in one destination's set.
pub const MAX_REPLICAS: usize = 8;

/// One destination's server set, most recently added first.
#[derive(Clone, Copy, Debug)]
struct ServerSet {
    members: [u32; MAX_REPLICAS],
    len: u8,
    last_modified: u64,
}

impl ServerSet {
    fn single(index: usize, now_ms: u64) -> Self {
        let mut members = [0; MAX_REPLICAS];
        members[0] = index as u32;
        ServerSet {
            members,
            len: 1,
            last_modified: now_ms,
        }
    }

    fn members(&self) -> &[u32] {
        &self.members[..usize::from(self.len)]
    }

    /// `ip_vs_dest_set_min`: the member with the least overhead / weight among members
    /// with weight > 0; ties to the earlier (more recent) member.
    fn least_loaded(&self, servers: &[RealServer], ctx: &PickContext) -> Option<usize> {
        let mut least: Option<(usize, u64, u32)> = None;
        for &member in self.members() {
            let index = member as usize;
            if !available(servers, index) {
                continue;
            }
            let (doh, dw) = (ctx.load(index).overhead(), servers[index].weight);
            let better = least.is_none_or(|(_, loh, lw)| {
                u128::from(loh) * u128::from(dw) > u128::from(doh) * u128::from(lw)
            });
            if better {
                least = Some((index, doh, dw));
            }
        }
        least.map(|(index, _, _)| index)
    }

    /// `ip_vs_dest_set_max`: the member with the largest overhead / weight among
    /// members with weight > 0; ties to the earlier member.
    fn most_loaded(&self, servers: &[RealServer], ctx: &PickContext) -> Option<usize> {
        let mut most: Option<(usize, u64, u32)> = None;
        for &member in self.members() {
            let index = member as usize;
            if !available(servers, index) {
                continue;
            }
            let (doh, dw) = (ctx.load(index).overhead(), servers[index].weight);
            let worse = most.is_none_or(|(_, moh, mw)| {
                u128::from(moh) * u128::from(dw) < u128::from(doh) * u128::from(mw)
            });
            if worse {
                most = Some((index, doh, dw));
            }
        }
        most.map(|(index, _, _)| index)
    }

    /// Adds `index` at the head unless it is a member or the set is full.
    fn insert(&mut self, index: usize, now_ms: u64) {
        let len = usize::from(self.len);
        if self.members().contains(&(index as u32)) || len == MAX_REPLICAS {
            return;
        }
        self.members.copy_within(0..len, 1);
        self.members[0] = index as u32;
        self.len += 1;
        self.last_modified = now_ms;
    }

    fn erase(&mut self, index: usize, now_ms: u64) {
        let len = usize::from(self.len);
        if let Some(position) = self.members().iter().position(|&m| m as usize == index) {
            self.members.copy_within(position + 1..len, position);
            self.len -= 1;
            self.last_modified = now_ms;
        }
    }
}

/// lblcr state: destination address → server set.
#[derive(Clone, Debug)]
pub struct LocalityLeastConnectionReplicated {
    table: LocalityTable<ServerSet>,
    expiration_ms: u64,
    /// The loads as told, when the caller tracks them (see [`super::lblc`]'s cost).
    loads: LocalityLoads,
}

impl LocalityLeastConnectionReplicated {
    /// With the IPVS defaults: [`TABLE_CAPACITY`] entries, [`EXPIRATION_MS`].
    pub fn new(servers: &[RealServer]) -> Self {
        Self::with_limits(servers, TABLE_CAPACITY, EXPIRATION_MS)
    }

    /// With a table of `capacity` destinations (at least 1), and `expiration_ms` both
    /// for idle entries and for shrinking an unmodified set.
    pub fn with_limits(servers: &[RealServer], capacity: usize, expiration_ms: u64) -> Self {
        LocalityLeastConnectionReplicated {
            table: LocalityTable::new(capacity, expiration_ms),
            expiration_ms,
            loads: LocalityLoads::new(servers),
        }
    }

    /// The server set recorded for `destination`, most recently added first.
    pub fn replicas(&self, destination: std::net::Ipv4Addr) -> Vec<usize> {
        self.table
            .peek(u32::from(destination))
            .map(|set| set.members().iter().map(|&m| m as usize).collect())
            .unwrap_or_default()
    }

    /// How many destinations the table holds.
    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn is_empty(&self) -> bool {
        self.table.len() == 0
    }
}

impl Scheduler for LocalityLeastConnectionReplicated {
    fn kind(&self) -> SchedulerKind {
        SchedulerKind::Lblcr
    }

    fn pick(&mut self, servers: &[RealServer], ctx: &PickContext) -> Option<usize> {
        let key = u32::from(ctx.destination);
        let now = ctx.now_ms;
        let tracked = self.loads.usable(servers, ctx);
        // The set's rules read its members' loads (at most MAX_REPLICAS): from what
        // was told when tracked.
        let told = self.loads.context(ctx);
        let ctx = if tracked { &told } else { ctx };
        let loads = &self.loads;
        let overloaded = |i| match tracked {
            true => loads.overloaded(servers, i),
            false => is_overloaded(servers, ctx, i),
        };
        let least_weighted = || match tracked {
            true => loads.least_weighted(),
            false => least_weighted_connection(servers, ctx),
        };
        if let Some(set) = self.table.lookup(key, now) {
            let least = set.least_loaded(servers, ctx);
            if set.len > 1 && now > set.last_modified.saturating_add(self.expiration_ms) {
                if let Some(most) = set.most_loaded(servers, ctx) {
                    set.erase(most, now);
                }
            }
            if let Some(index) = least {
                if !overloaded(index) {
                    return Some(index);
                }
            }
            let index = least_weighted()?;
            set.insert(index, now);
            return Some(index);
        }
        let index = least_weighted()?;
        self.table.insert(key, ServerSet::single(index, now), now);
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
    use std::net::Ipv4Addr;

    const D: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 80);
    const HOUR: u64 = 3_600_000;

    /// lblc and lblcr told every load and weight change pick exactly what they pick
    /// when handed every load at each pick, over random pools, loads (active counts
    /// near the weights, where the overload rule turns), weight changes, destinations
    /// and clocks (sets shrink after an hour here).
    #[test]
    fn told_loads_pick_what_handed_loads_pick() {
        use crate::model::rng::Rng;
        use crate::sched::lblc::LocalityLeastConnection;
        use crate::sched::ServerLoad;
        let mut rng = Rng::new(7);
        for pool in 0..60 {
            let (max_weight, weights) = random_pool(&mut rng);
            let mut servers = servers(&weights);
            let n = servers.len();
            let build = |servers: &[RealServer], replicated: bool| -> Box<dyn Scheduler> {
                if replicated {
                    Box::new(LocalityLeastConnectionReplicated::with_limits(
                        servers, 64, HOUR,
                    ))
                } else {
                    Box::new(LocalityLeastConnection::with_limits(servers, 64, HOUR))
                }
            };
            let replicated = pool % 2 == 0;
            let (mut told, mut handed) = (build(&servers, replicated), build(&servers, replicated));
            let mut loads = vec![ServerLoad::default(); n];
            let mut now = 0u64;
            for step in 0..400 {
                match rng.below(6) {
                    0..=2 => {
                        let i = rng.below(n as u64) as usize;
                        let near = u64::from(servers[i].weight.min(50)) * 2 + 2;
                        loads[i] = ServerLoad::new(rng.below(near) as u32, rng.below(600) as u32);
                        told.set_load(i, loads[i]);
                    }
                    3 if step % 7 == 0 => {
                        let i = rng.below(n as u64) as usize;
                        servers[i].weight = random_weight(&mut rng, max_weight);
                        told.set_weight(i, servers[i].weight);
                        handed.set_weight(i, servers[i].weight);
                    }
                    _ => {
                        now += rng.below(HOUR / 4);
                        let d = Ipv4Addr::new(203, 0, 113, rng.below(6) as u8);
                        let ctx = ctx_to(d, now, &[]).with_tracked_loads();
                        let want = handed.pick(&servers, &ctx_to(d, now, &loads));
                        assert_eq!(
                            told.pick(&servers, &ctx),
                            want,
                            "pool {pool} step {step} replicated {replicated}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn locality_while_not_overloaded() {
        let servers = servers(&[2, 2, 2]);
        let mut lblcr = LocalityLeastConnectionReplicated::new(&servers);
        assert_eq!(lblcr.pick(&servers, &ctx_to(D, 0, &[])), Some(0));
        // a at 2 active (not > weight 2): stays, though b and c are idle.
        let load = loads(&[(2, 0), (0, 0), (0, 0)]);
        for t in 1..10 {
            assert_eq!(lblcr.pick(&servers, &ctx_to(D, t, &load)), Some(0));
        }
        assert_eq!(lblcr.replicas(D), vec![0]);
    }

    #[test]
    fn the_set_grows_under_overload_then_uses_its_least_loaded_member() {
        let servers = servers(&[1, 1, 1, 1]);
        let mut lblcr = LocalityLeastConnectionReplicated::new(&servers);
        assert_eq!(lblcr.pick(&servers, &ctx_to(D, 0, &[])), Some(0));
        // a: 2 active > 1 and d is idle (0*2 < 1): overloaded. wlc over all:
        // a 512, b 256, c 512, d 0 -> d joins the set: {d, a}.
        let load = loads(&[(2, 0), (1, 0), (2, 0), (0, 0)]);
        assert_eq!(lblcr.pick(&servers, &ctx_to(D, 1, &load)), Some(3));
        assert_eq!(lblcr.replicas(D), vec![3, 0]);
        // Next: the set's least loaded is d (0 < 512): picked, no growth.
        assert_eq!(lblcr.pick(&servers, &ctx_to(D, 2, &load)), Some(3));
        // d now at 2, a at 2 (both overloaded, b idle): set min = d (tie, most
        // recent first) is overloaded -> wlc: b (0) joins: {b, d, a}.
        let load = loads(&[(2, 0), (0, 0), (2, 0), (2, 0)]);
        assert_eq!(lblcr.pick(&servers, &ctx_to(D, 3, &load)), Some(1));
        assert_eq!(lblcr.replicas(D), vec![1, 3, 0]);
    }

    #[test]
    fn a_busy_set_without_a_lighter_server_does_not_grow() {
        let servers = servers(&[1, 1]);
        let mut lblcr = LocalityLeastConnectionReplicated::new(&servers);
        assert_eq!(lblcr.pick(&servers, &ctx_to(D, 0, &[])), Some(0));
        // a: 3 > 1, but b: 1*2 = 2, not < 1: nobody lighter, stay on a.
        let load = loads(&[(3, 0), (1, 0)]);
        assert_eq!(lblcr.pick(&servers, &ctx_to(D, 1, &load)), Some(0));
        assert_eq!(lblcr.replicas(D), vec![0]);
    }

    #[test]
    fn the_set_shrinks_after_24_hours_without_modification() {
        let servers = servers(&[1, 1, 1]);
        let mut lblcr = LocalityLeastConnectionReplicated::new(&servers);
        lblcr.pick(&servers, &ctx_to(D, 0, &[]));
        let overload_a = loads(&[(2, 0), (0, 0), (0, 0)]);
        assert_eq!(lblcr.pick(&servers, &ctx_to(D, 1, &overload_a)), Some(1));
        let overload_ab = loads(&[(2, 0), (2, 0), (0, 0)]);
        assert_eq!(lblcr.pick(&servers, &ctx_to(D, 2, &overload_ab)), Some(2));
        // Last modified at t = 2.
        assert_eq!(lblcr.replicas(D), vec![2, 1, 0]);
        // The load settles: a lightly used, b and c busier. Used every hour (the entry
        // stays alive); no shrink until more than 24 h after the last modification.
        let settled = loads(&[(0, 0), (1, 3), (1, 0)]);
        let mut t = 2;
        while t + HOUR <= 2 + 24 * HOUR {
            t += HOUR;
            assert_eq!(lblcr.pick(&servers, &ctx_to(D, t, &settled)), Some(0));
            assert_eq!(lblcr.replicas(D).len(), 3, "t = {t}");
        }
        // t = 2 + 24 h: not yet *more* than 24 h. One ms later: the most loaded member
        // (b: 256 + 3 = 259 > c's 256 > a's 0) leaves.
        assert_eq!(t, 2 + 24 * HOUR);
        assert_eq!(lblcr.pick(&servers, &ctx_to(D, t + 1, &settled)), Some(0));
        assert_eq!(lblcr.replicas(D), vec![2, 0]);
        // The removal was a modification: the next one waits another 24 h.
        assert_eq!(lblcr.pick(&servers, &ctx_to(D, t + 2, &settled)), Some(0));
        assert_eq!(lblcr.replicas(D), vec![2, 0]);
        let t2 = t + 1 + 24 * HOUR + 1;
        for step in 1..24 {
            lblcr.pick(&servers, &ctx_to(D, t + 1 + step * HOUR, &settled));
        }
        assert_eq!(lblcr.pick(&servers, &ctx_to(D, t2, &settled)), Some(0));
        assert_eq!(lblcr.replicas(D), vec![0]);
        // A single member is never removed, however long the set stays unmodified.
        for step in 1..=48 {
            let now = t2 + step * HOUR;
            assert_eq!(lblcr.pick(&servers, &ctx_to(D, now, &settled)), Some(0));
        }
        assert_eq!(lblcr.replicas(D), vec![0]);
    }

    #[test]
    fn an_idle_entry_expires_after_24_hours() {
        let servers = servers(&[1, 1]);
        let mut lblcr = LocalityLeastConnectionReplicated::new(&servers);
        assert_eq!(lblcr.pick(&servers, &ctx_to(D, 0, &[])), Some(0));
        let a_busy = loads(&[(1, 0), (0, 0)]);
        assert_eq!(
            lblcr.pick(&servers, &ctx_to(D, 24 * HOUR - 1, &a_busy)),
            Some(0)
        );
        // 24 h idle: forgotten, wlc -> b, a fresh set {b}.
        assert_eq!(
            lblcr.pick(&servers, &ctx_to(D, 48 * HOUR - 1, &a_busy)),
            Some(1)
        );
        assert_eq!(lblcr.replicas(D), vec![1]);
    }

    #[test]
    fn draining_members_are_skipped_and_replaced() {
        let mut servers = servers(&[1, 1, 1]);
        let mut lblcr = LocalityLeastConnectionReplicated::new(&servers);
        assert_eq!(lblcr.pick(&servers, &ctx_to(D, 0, &[])), Some(0));
        servers[0].weight = 0;
        // The set's only member drains: no least member -> wlc: b joins.
        assert_eq!(lblcr.pick(&servers, &ctx_to(D, 1, &[])), Some(1));
        assert_eq!(lblcr.replicas(D), vec![1, 0]);
        assert_eq!(lblcr.pick(&servers, &ctx_to(D, 2, &[])), Some(1));
    }

    #[test]
    fn a_full_set_still_picks_but_stops_growing() {
        let n = MAX_REPLICAS + 2;
        let servers = servers(&vec![1; n]);
        let mut lblcr = LocalityLeastConnectionReplicated::new(&servers);
        lblcr.pick(&servers, &ctx_to(D, 0, &[]));
        // Each round, every server already picked is overloaded (2 active), the rest
        // idle: the set's min is overloaded and the next idle server joins.
        let mut load = vec![crate::sched::ServerLoad::default(); n];
        for round in 1..n {
            load[round - 1].active = 2;
            assert_eq!(
                lblcr.pick(&servers, &ctx_to(D, round as u64, &load)),
                Some(round)
            );
        }
        assert_eq!(lblcr.replicas(D).len(), MAX_REPLICAS);
    }

    #[test]
    fn none_when_empty_or_all_draining() {
        let mut lblcr = LocalityLeastConnectionReplicated::new(&[]);
        assert_eq!(lblcr.pick(&[], &ctx()), None);
        let drained = servers(&[0, 0]);
        let mut lblcr = LocalityLeastConnectionReplicated::new(&drained);
        assert_eq!(lblcr.pick(&drained, &ctx()), None);
        assert!(lblcr.is_empty());
    }
}
