//! Destination hashing (`dh`), after IPVS's `ip_vs_dh`: the connection's destination
//! address picks one of 256 buckets, each naming a real server, so every connection to
//! one destination (a cache object's address, a site behind a transparent proxy) goes
//! to the same server while the server list does not change (seed 001, 2.2). It is not
//! consistent hashing: changing the list remaps most destinations.
//!
//! **Table**: as sh's ([`super::sh`]): each server takes `weight` consecutive buckets
//! in list order, wrapping until the 256 are filled, so shares follow the weights.
//! The kernel's `ip_vs_dh_reassign` gives every server one bucket per round whatever
//! its weight; with equal weights of 1 the two tables are identical.
//!
//! **Hash**: `(addr * 2654435761) >> 24` on the host-order address (Knuth's
//! multiplicative hash, the kernel's constant). The kernel masks the *low* 8 bits of
//! that product instead, which depend only on the address's last octet
//! (10.1.0.5 and 10.2.0.5 always collide); the top bits mix all four octets.
//!
//! A destination whose bucket names a draining server (weight 0) gets no server, as in
//! the kernel (dh has no fallback flag). As in sh, servers health checking evicted and
//! a sorry server not in use take no bucket (keepalived would have deleted them). In an ordinary virtual service every
//! connection has the same destination (the VIP), so dh sends all of them to one
//! server: it is meant for services that see many destinations.
use crate::model::RealServer;
use crate::model::SchedulerKind;
use crate::sched::sh::BucketTable;
use crate::sched::{available, PickContext, Scheduler};

/// Knuth's multiplicative-hash constant, as in `ip_vs_dh_hashkey`.
const KNUTH: u32 = 2_654_435_761;

/// Destination hashing state: the bucket table.
#[derive(Clone, Debug)]
pub struct DestinationHashing {
    table: BucketTable,
}

impl DestinationHashing {
    pub fn new(servers: &[RealServer]) -> Self {
        DestinationHashing::withdrawing(servers, &[])
    }

    /// As [`DestinationHashing::new`], the servers at positions `withdrawn` left out
    /// of the table (see [`SchedulerParams::withdrawn`](crate::sched::SchedulerParams)).
    pub fn withdrawing(servers: &[RealServer], withdrawn: &[usize]) -> Self {
        DestinationHashing {
            table: BucketTable::new(servers, withdrawn),
        }
    }

    /// The bucket a destination hashes to.
    #[inline]
    pub fn bucket_of(&self, ctx: &PickContext) -> usize {
        (u32::from(ctx.destination).wrapping_mul(KNUTH) >> 24) as usize
    }

    /// The bucket → server index table (256 entries), for tests and diagnostics.
    pub fn buckets(&self) -> &[u32; super::sh::TABLE_SIZE] {
        self.table.buckets()
    }
}

impl Scheduler for DestinationHashing {
    fn kind(&self) -> SchedulerKind {
        SchedulerKind::Dh
    }

    fn pick(&mut self, servers: &[RealServer], ctx: &PickContext) -> Option<usize> {
        if servers.is_empty() {
            return None;
        }
        self.table.refresh(servers);
        let index = self.table.get(self.bucket_of(ctx));
        available(servers, index).then_some(index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sched::test_support::*;
    use std::net::Ipv4Addr;

    fn to(destination: Ipv4Addr, client: u32) -> PickContext<'static> {
        let (addr, port) = self::client(client);
        ctx_from(addr, port).with_destination(destination)
    }

    #[test]
    fn same_destination_same_server_whoever_the_client_and_across_rebuilds() {
        let servers = servers(&[1, 1, 1, 1, 1]);
        let mut dh = DestinationHashing::new(&servers);
        let mut rebuilt = DestinationHashing::new(&servers);
        for d in 0..1000u32 {
            let destination = Ipv4Addr::from(0xc612_0000 + d * 17);
            let pick = dh.pick(&servers, &to(destination, 0)).unwrap();
            for c in 1..20 {
                assert_eq!(dh.pick(&servers, &to(destination, c)), Some(pick));
            }
            assert_eq!(rebuilt.pick(&servers, &to(destination, 99)), Some(pick));
        }
    }

    #[test]
    fn the_hash_uses_every_octet() {
        let servers = servers(&[1; 16]);
        let mut dh = DestinationHashing::new(&servers);
        // Same last octet, different third octet: the kernel's low-bit mask would send
        // all of these to one bucket.
        let picks: std::collections::HashSet<_> = (0..64u8)
            .map(|third| {
                dh.pick(&servers, &to(Ipv4Addr::new(10, 1, third, 5), 0))
                    .unwrap()
            })
            .collect();
        assert!(picks.len() > 8, "{picks:?}");
        // The formula.
        let d = Ipv4Addr::new(10, 1, 2, 5);
        let expected = (u32::from(d).wrapping_mul(2_654_435_761) >> 24) as usize;
        assert_eq!(dh.bucket_of(&to(d, 0)), expected);
    }

    #[test]
    fn distribution_over_many_destinations_follows_weights() {
        let weights = [1, 2, 3, 4];
        let servers = servers(&weights);
        let mut dh = DestinationHashing::new(&servers);
        let mut hits = vec![0usize; 4];
        for i in 0..200_000u32 {
            let (destination, _) = client(i);
            hits[dh.pick(&servers, &to(destination, 0)).unwrap()] += 1;
        }
        let err = worst_relative_error(&hits, &weights);
        assert!(err < 0.05, "{hits:?} {err}");
    }

    #[test]
    fn draining_server_refuses_its_destinations() {
        let mut servers = servers(&[1, 1]);
        servers[0].weight = 0;
        let mut dh = DestinationHashing::new(&servers);
        let mut refused = 0;
        for i in 0..1000 {
            let (destination, _) = client(i);
            match dh.pick(&servers, &to(destination, 0)) {
                None => refused += 1,
                Some(pick) => assert_eq!(pick, 1),
            }
        }
        assert!((400..600).contains(&refused), "{refused}");
    }

    #[test]
    fn none_when_empty_or_all_draining() {
        let mut dh = DestinationHashing::new(&[]);
        assert_eq!(dh.pick(&[], &ctx()), None);
        let drained = servers(&[0, 0]);
        let mut dh = DestinationHashing::new(&drained);
        assert_eq!(dh.pick(&drained, &ctx()), None);
    }
}
