//! The bounded channels between workers, the only way one worker's traffic reaches
//! another. Every worker has two inboxes here:
//!
//! - a packet ring (DPDK `rte_ring`, any producer, one consumer) for NAT replies the
//!   NIC's hash delivered to a worker that does not own their session;
//! - a neighbour queue for ARP entries another worker learned (a NIC delivers ARP to
//!   one queue, so without it only that worker would know the real servers' MACs).
//!
//! And two rings link the workers with the management core's health checker: probes
//! go out through worker 0 (`health_inject`, one producer, one consumer), answers
//! come back from any worker (`health_replies`, any producer, one consumer). VRRP
//! uses them too, and so does session sync over a DPDK port (`[sync] port`), which
//! makes them larger (`SYNC_PORT_RING_SIZE`).
//!
//! All refuse when full and the sender counts it; nothing blocks.
use crate::dpdk::{DpdkError, PacketRing};
use crate::wire::MacAddr;
use crossbeam::queue::ArrayQueue;
use std::net::Ipv4Addr;

/// Packets a worker's redirect ring holds (power of two; the ring keeps one free).
pub const REDIRECT_RING_SIZE: u32 = 2048;
/// Neighbour updates a worker's inbox holds.
pub const NEIGHBOUR_INBOX: usize = 1024;
/// Synced sessions waiting in a worker's install inbox.
pub const INSTALL_INBOX: usize = 8192;
/// Health probe frames in flight between the management core and the workers.
pub const HEALTH_RING_SIZE: u32 = 1024;
/// The same rings when session sync also travels through them (`[sync] port`): at
/// ~26k sync datagrams/s (measured at 343k new connections/s), 130 per 5 ms
/// management tick each way, 4096 slots are ~150 ms of them (1024 would be ~40 ms,
/// a few slow ticks), and hold the most one tick sends at once (65536 events at 38
/// records per 1500-byte authenticated datagram: ~1700 datagrams).
pub const SYNC_PORT_RING_SIZE: u32 = 4096;

pub struct Mesh {
    redirect: Vec<PacketRing>,
    neighbours: NeighbourInboxes,
    health_inject: PacketRing,
    health_replies: PacketRing,
    health_ring_size: u32,
    /// Session sync: records from the peer, for the worker that will own each session.
    installs: Vec<ArrayQueue<crate::session::replication::RecordRepr>>,
}

impl Mesh {
    /// Inboxes for `workers` workers; `name` keeps ring names unique per process.
    pub fn new(name: &str, workers: usize) -> Result<Mesh, DpdkError> {
        Self::with_health_ring(name, workers, HEALTH_RING_SIZE)
    }

    /// As `new`, with health rings of `health_ring_size` slots (a power of two).
    pub fn with_health_ring(
        name: &str,
        workers: usize,
        health_ring_size: u32,
    ) -> Result<Mesh, DpdkError> {
        let redirect = (0..workers)
            .map(|w| {
                PacketRing::new_multi_producer(&format!("{name}_redir{w}"), REDIRECT_RING_SIZE)
            })
            .collect::<Result<_, _>>()?;
        Ok(Mesh {
            redirect,
            neighbours: NeighbourInboxes::new(workers, NEIGHBOUR_INBOX),
            installs: (0..workers)
                .map(|_| ArrayQueue::new(INSTALL_INBOX))
                .collect(),
            health_inject: PacketRing::new(&format!("{name}_hc_out"), health_ring_size)?,
            health_replies: PacketRing::new_multi_producer(
                &format!("{name}_hc_in"),
                health_ring_size,
            )?,
            health_ring_size,
        })
    }

    /// Offers a synced session to worker `w`; false when its inbox is full (or there
    /// is no such worker).
    pub fn install(&self, w: usize, record: crate::session::replication::RecordRepr) -> bool {
        self.installs.get(w).is_some_and(|q| q.push(record).is_ok())
    }

    /// Takes up to `max` synced sessions waiting for worker `w`.
    pub fn take_installs(
        &self,
        w: usize,
        max: usize,
        mut each: impl FnMut(crate::session::replication::RecordRepr),
    ) {
        if let Some(q) = self.installs.get(w) {
            for _ in 0..max {
                match q.pop() {
                    Some(r) => each(r),
                    None => break,
                }
            }
        }
    }

    /// Probe frames from the management core, for worker 0 to transmit.
    pub fn health_inject(&self) -> &PacketRing {
        &self.health_inject
    }

    /// Answers to probes, from the workers to the management core (and VRRP
    /// advertisements, and sync datagrams with `[sync] port`).
    pub fn health_replies(&self) -> &PacketRing {
        &self.health_replies
    }

    /// Slots of each health ring.
    pub fn health_ring_size(&self) -> u32 {
        self.health_ring_size
    }

    pub fn workers(&self) -> usize {
        self.redirect.len()
    }

    /// Worker `w`'s packet inbox (`None` past the last worker).
    pub fn redirect_ring(&self, w: usize) -> Option<&PacketRing> {
        self.redirect.get(w)
    }

    /// Offers a learned neighbour to every worker but `from`; returns how many inboxes
    /// were full.
    pub fn share_neighbour(&self, from: usize, ip: Ipv4Addr, mac: MacAddr) -> usize {
        self.neighbours.share(from, ip, mac)
    }

    /// Takes the neighbour updates waiting for worker `w`.
    pub fn take_neighbours(&self, w: usize, each: impl FnMut(Ipv4Addr, MacAddr)) {
        self.neighbours.take(w, each)
    }
}

/// One bounded queue of neighbour updates per worker.
struct NeighbourInboxes(Vec<ArrayQueue<(Ipv4Addr, MacAddr)>>);

impl NeighbourInboxes {
    fn new(workers: usize, capacity: usize) -> Self {
        NeighbourInboxes((0..workers).map(|_| ArrayQueue::new(capacity)).collect())
    }

    fn share(&self, from: usize, ip: Ipv4Addr, mac: MacAddr) -> usize {
        self.0
            .iter()
            .enumerate()
            .filter(|&(w, q)| w != from && q.push((ip, mac)).is_err())
            .count()
    }

    fn take(&self, w: usize, mut each: impl FnMut(Ipv4Addr, MacAddr)) {
        if let Some(q) = self.0.get(w) {
            while let Some((ip, mac)) = q.pop() {
                each(ip, mac);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn neighbours_reach_every_other_worker_and_a_full_inbox_is_reported() {
        // Only the neighbour queues: the packet rings need an EAL (tests/eal_ring.rs).
        let inboxes = NeighbourInboxes::new(3, 2);
        let ip = Ipv4Addr::new(198, 18, 0, 9);
        let mac = MacAddr([2, 0, 0, 0, 0, 9]);
        assert_eq!(inboxes.share(1, ip, mac), 0);
        let mut got = Vec::new();
        inboxes.take(0, |i, m| got.push((0, i, m)));
        inboxes.take(1, |i, m| got.push((1, i, m)));
        inboxes.take(2, |i, m| got.push((2, i, m)));
        assert_eq!(got, vec![(0, ip, mac), (2, ip, mac)]);
        for _ in 0..2 {
            assert_eq!(inboxes.share(0, ip, mac), 0);
        }
        assert_eq!(inboxes.share(0, ip, mac), 2, "both inboxes full");
    }
}
