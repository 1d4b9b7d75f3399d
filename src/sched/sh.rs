//! Source hashing (`sh`), as IPVS's `ip_vs_sh`: the client's address picks one of 256
//! buckets, each naming a real server, so a client keeps reaching the same server as
//! long as the server list does not change (seed 001, 2.2: affinity, not balance).
//!
//! **Table** (`ip_vs_sh_reassign`): buckets 0..255 are filled walking the server list
//! in order, each server taking `weight` consecutive buckets before the next one, and
//! wrapping around the list until all 256 are filled. So weights 1:2:3 give
//! `a b b c c c a b b ...` and the shares follow the weights. Two kernel quirks are
//! kept: a server with weight 0 still takes one bucket per round (clients hashing there
//! get no server unless `sh-fallback`), and when the weights add up to more than 256
//! the servers late in the list get fewer buckets than their weight says, or none.
//! Keep sh weights small (1..=10 or so).
//!
//! The weight-0 quirk is IPVS's for a server an operator quiesced (`-e -w 0`), and
//! stays so. Servers that keepalived would have deleted from IPVS instead, those
//! health checking evicted and a sorry server not in use, are also at weight 0 in the
//! workers' pool (so their sessions keep their real server) but take no bucket:
//! their clients hash to the other servers, as after keepalived's delete
//! ([`SchedulerParams::withdrawn`](crate::sched::SchedulerParams)). With
//! `sh-fallback` an evicted server keeps its buckets instead: its clients fall back
//! and the rest stay put, where a walk without it moves most of them.
//!
//! **Hash** (current kernels): bucket = `hash_32(addr + port, 8)`, the top 8 bits of
//! `(addr + port) * 0x61C88647` (the kernel's `GOLDEN_RATIO_32`), with the address and
//! port as host-order integers and `port` = 0 unless `sh-port` is set.
//!
//! **sh-fallback** (`ip_vs_sh_get_fallback`): when the hashed bucket's server is
//! unavailable (weight 0), walk the table and take the first available server. As in
//! the kernel the walk probes bucket `(2 * h + offset) mod 256` for offset 0..255
//! (it adds the offset to the hash's seed and then the hash again), which visits all
//! 256 buckets from a start that depends only on the client, so it is deterministic.
//!
//! The table is an array in the scheduler (no allocation, ever); a pick is one
//! multiply and one lookup.
use crate::model::RealServer;
use crate::model::{SchedFlags, SchedulerKind};
use crate::sched::{available, PickContext, Scheduler};

/// Buckets of the sh and dh tables (`IP_VS_SH_TAB_SIZE`, 1 << 8).
pub const TABLE_SIZE: usize = 256;

/// The kernel's `GOLDEN_RATIO_32` (`include/linux/hash.h`).
const GOLDEN_RATIO_32: u32 = 0x61c8_8647;

/// `hash_32(value, 8)`: the top 8 bits of `value * GOLDEN_RATIO_32`.
#[inline]
pub(crate) fn hash_32_bits8(value: u32) -> usize {
    (value.wrapping_mul(GOLDEN_RATIO_32) >> 24) as usize
}

/// A 256-bucket table of server indices, filled as `ip_vs_sh_reassign` does.
#[derive(Clone, Debug)]
pub(crate) struct BucketTable {
    buckets: [u32; TABLE_SIZE],
    /// Length of the server list the table was filled from.
    built_for: usize,
}

impl BucketTable {
    /// The table for `servers`, the servers at positions `withdrawn` left out.
    pub(crate) fn new(servers: &[RealServer], withdrawn: &[usize]) -> Self {
        let mut table = BucketTable {
            buckets: [0; TABLE_SIZE],
            built_for: 0,
        };
        table.fill(servers, withdrawn);
        table
    }

    /// Walk the list, `weight` consecutive buckets per server (at least one, as the
    /// kernel's `++d_count >= weight` moves on after one bucket when weight is 0),
    /// skipping the `withdrawn` positions, which keepalived would have deleted from
    /// IPVS: their clients hash to the others. When every server is withdrawn (none
    /// can take a connection anyway) the walk takes them all. The servers walked are
    /// listed once, so the cost is the list plus the buckets, however many are
    /// withdrawn.
    fn fill(&mut self, servers: &[RealServer], withdrawn: &[usize]) {
        self.built_for = servers.len();
        let mut out = vec![false; servers.len()];
        for &i in withdrawn {
            if let Some(o) = out.get_mut(i) {
                *o = true;
            }
        }
        let mut walked: Vec<usize> = (0..servers.len()).filter(|&i| !out[i]).collect();
        if walked.is_empty() {
            walked = (0..servers.len()).collect();
        }
        let Some(&first) = walked.first() else {
            return;
        };
        let (mut at, mut server, mut taken) = (0, first, 0u32);
        for bucket in self.buckets.iter_mut() {
            *bucket = server as u32;
            taken += 1;
            if taken >= servers[server].weight {
                at = (at + 1) % walked.len();
                server = walked[at];
                taken = 0;
            }
        }
    }

    /// Refill in place if the caller passes a list of another length than the one the
    /// table was built from (no allocation: the table is an array).
    #[inline]
    pub(crate) fn refresh(&mut self, servers: &[RealServer]) {
        if self.built_for != servers.len() {
            self.fill(servers, &[]);
        }
    }

    #[inline]
    pub(crate) fn get(&self, bucket: usize) -> usize {
        self.buckets[bucket % TABLE_SIZE] as usize
    }

    /// The bucket → server index table, for tests and diagnostics.
    pub(crate) fn buckets(&self) -> &[u32; TABLE_SIZE] {
        &self.buckets
    }
}

/// Source hashing state: the bucket table and the flags.
#[derive(Clone, Debug)]
pub struct SourceHashing {
    table: BucketTable,
    port: bool,
    fallback: bool,
}

impl SourceHashing {
    /// The table for `servers`; `flags.sh_port` and `flags.sh_fallback` apply.
    pub fn new(servers: &[RealServer], flags: SchedFlags) -> Self {
        SourceHashing::withdrawing(servers, flags, &[])
    }

    /// As [`SourceHashing::new`], the servers at positions `withdrawn` left out of
    /// the table (see [`SchedulerParams::withdrawn`](crate::sched::SchedulerParams)).
    pub fn withdrawing(servers: &[RealServer], flags: SchedFlags, withdrawn: &[usize]) -> Self {
        SourceHashing {
            table: BucketTable::new(servers, withdrawn),
            port: flags.sh_port,
            fallback: flags.sh_fallback,
        }
    }

    /// The bucket → server index table (256 entries), for tests and diagnostics.
    pub fn buckets(&self) -> &[u32; TABLE_SIZE] {
        self.table.buckets()
    }

    /// The bucket a client hashes to.
    #[inline]
    pub fn bucket_of(&self, ctx: &PickContext) -> usize {
        let port = if self.port { ctx.client_port } else { 0 };
        hash_32_bits8(u32::from(ctx.client).wrapping_add(u32::from(port)))
    }
}

impl Scheduler for SourceHashing {
    fn kind(&self) -> SchedulerKind {
        SchedulerKind::Sh
    }

    fn pick(&mut self, servers: &[RealServer], ctx: &PickContext) -> Option<usize> {
        if servers.is_empty() {
            return None;
        }
        self.table.refresh(servers);
        let ihash = self.bucket_of(ctx);
        let index = self.table.get(ihash);
        if available(servers, index) {
            return Some(index);
        }
        if !self.fallback {
            return None;
        }
        (0..TABLE_SIZE)
            .map(|offset| self.table.get(((offset + ihash) % TABLE_SIZE) + ihash))
            .find(|&index| available(servers, index))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::test_support::*;
    use std::net::Ipv4Addr;

    fn sh(servers: &[RealServer], flags: &str) -> SourceHashing {
        SourceHashing::new(servers, flags.parse().unwrap())
    }

    #[test]
    fn table_follows_ipvs_reassign() {
        let servers = servers(&[1, 2, 3]);
        let table = sh(&servers, "");
        assert_eq!(&table.buckets()[..8], &[0, 1, 1, 2, 2, 2, 0, 1]);
        let count = |i| table.buckets().iter().filter(|&&b| b == i).count();
        // 256 = 42 rounds of 6 + 4 buckets (a b b c).
        assert_eq!((count(0), count(1), count(2)), (43, 86, 127));
        // Weight 0 still takes one bucket per round.
        let drained = crate::sched::test_support::servers(&[1, 0]);
        let table = sh(&drained, "");
        assert_eq!(&table.buckets()[..4], &[0, 1, 0, 1]);
    }

    #[test]
    fn weights_over_256_starve_the_end_of_the_list_as_in_ipvs() {
        let servers = servers(&[200, 100, 100]);
        let table = sh(&servers, "");
        let count = |i| table.buckets().iter().filter(|&&b| b == i).count();
        assert_eq!((count(0), count(1), count(2)), (200, 56, 0));
    }

    #[test]
    fn hash_is_the_kernels_hash_32() {
        // hash_32(0x0a000001, 8) = (0x0a000001 * 0x61c88647 mod 2^32) >> 24.
        let v: u32 = 0x0a00_0001;
        let expected = ((u64::from(v) * 0x61c8_8647) as u32 >> 24) as usize;
        assert_eq!(hash_32_bits8(v), expected);
        let servers = servers(&[1]);
        let table = sh(&servers, "");
        assert_eq!(
            table.bucket_of(&ctx_from(Ipv4Addr::new(10, 0, 0, 1), 9)),
            expected
        );
        let with_port = sh(&servers, "sh-port");
        assert_eq!(
            with_port.bucket_of(&ctx_from(Ipv4Addr::new(10, 0, 0, 1), 9)),
            hash_32_bits8(v + 9)
        );
    }

    #[test]
    fn same_client_same_server_over_picks_and_rebuilds() {
        let servers = servers(&[1, 2, 3, 1, 1]);
        let mut first = sh(&servers, "");
        let mut rebuilt = sh(&servers, "");
        for i in 0..2000 {
            let (addr, _) = client(i);
            let pick = first.pick(&servers, &ctx_from(addr, 1000)).unwrap();
            for port in [1001, 2000, 65535] {
                // Without sh-port the port does not matter.
                assert_eq!(first.pick(&servers, &ctx_from(addr, port)), Some(pick));
            }
            assert_eq!(rebuilt.pick(&servers, &ctx_from(addr, 7)), Some(pick));
        }
    }

    #[test]
    fn distribution_over_many_clients_follows_weights() {
        let weights = [1, 2, 3, 4];
        let servers = servers(&weights);
        let mut table = sh(&servers, "");
        let mut hits = vec![0usize; 4];
        for i in 0..200_000 {
            let (addr, port) = client(i);
            hits[table.pick(&servers, &ctx_from(addr, port)).unwrap()] += 1;
        }
        // The table itself is 26:51:77:102 of 256 (25 rounds of 10 + a b b c c c), so
        // within a few percent of 1:2:3:4; the hash spreads clients evenly over it.
        let err = worst_relative_error(&hits, &weights);
        assert!(err < 0.05, "{hits:?} {err}");
    }

    #[test]
    fn sh_port_changes_the_mapping_with_the_port() {
        let servers = servers(&[1, 1, 1, 1]);
        let mut plain = sh(&servers, "");
        let mut ported = sh(&servers, "sh-port");
        let addr = Ipv4Addr::new(203, 0, 113, 7);
        let mut seen = [false; 4];
        for port in 1024..1124 {
            seen[ported.pick(&servers, &ctx_from(addr, port)).unwrap()] = true;
            // Stable for the same (address, port).
            assert_eq!(
                ported.pick(&servers, &ctx_from(addr, port)),
                ported.pick(&servers, &ctx_from(addr, port))
            );
        }
        assert_eq!(
            seen, [true; 4],
            "one address spreads over all servers by port"
        );
        let only = plain.pick(&servers, &ctx_from(addr, 1024));
        assert!((1024..1124).all(|p| plain.pick(&servers, &ctx_from(addr, p)) == only));
    }

    #[test]
    fn draining_server_without_fallback_refuses_its_clients() {
        let mut servers = servers(&[1, 1, 1]);
        servers[1].weight = 0;
        let mut table = sh(&servers, "");
        // b keeps one bucket per round (weight 0 -> 1 bucket): a third of the clients
        // hash to a server that takes none, and get None; the others keep theirs.
        let mut refused = 0;
        for i in 0..9_000 {
            let (a, p) = client(i);
            let ctx = ctx_from(a, p);
            match table.pick(&servers, &ctx) {
                None => {
                    assert_eq!(table.buckets()[table.bucket_of(&ctx)], 1);
                    refused += 1;
                }
                Some(pick) => assert_ne!(pick, 1),
            }
        }
        assert!((2_700..3_300).contains(&refused), "{refused}");
    }

    #[test]
    fn sh_fallback_takes_the_next_available_bucket() {
        let mut servers = servers(&[1, 1, 1]);
        servers[1].weight = 0;
        let mut fallback = sh(&servers, "sh-fallback");
        let mut plain = sh(&servers, "");
        for i in 0..10_000 {
            let (a, p) = client(i);
            let ctx = ctx_from(a, p);
            let pick = fallback.pick(&servers, &ctx);
            assert!(matches!(pick, Some(0) | Some(2)), "{pick:?}");
            // Clients whose bucket is available are not moved.
            if let Some(kept) = plain.pick(&servers, &ctx) {
                assert_eq!(pick, Some(kept));
            } else {
                // The kernel's probe order: bucket (2h + offset) mod 256.
                let h = fallback.bucket_of(&ctx);
                let expected = (0..256)
                    .map(|o| fallback.buckets()[(2 * h + o) % 256] as usize)
                    .find(|&s| s != 1);
                assert_eq!(pick, expected);
            }
        }
    }

    #[test]
    fn none_when_empty_or_all_draining() {
        let mut table = sh(&[], "sh-fallback");
        assert_eq!(table.pick(&[], &ctx()), None);
        let drained = servers(&[0, 0]);
        for flags in ["", "sh-fallback"] {
            let mut table = sh(&drained, flags);
            assert_eq!(table.pick(&drained, &ctx()), None);
        }
    }

    #[test]
    fn a_changed_list_refills_the_table_in_place() {
        let three = servers(&[1, 1, 1]);
        let mut table = sh(&three, "");
        let two = servers(&[1, 1]);
        for i in 0..1000 {
            let (a, p) = client(i);
            assert!(table.pick(&two, &ctx_from(a, p)).unwrap() < 2);
        }
        assert_eq!(table.buckets(), sh(&two, "").buckets());
    }
}
