//! The bounded channels between workers, the only way one worker's traffic reaches
//! another. Every worker has two inboxes here:
//!
//! - a packet ring (DPDK `rte_ring`, any producer, one consumer) for NAT replies the
//!   NIC's hash delivered to a worker that does not own their session;
//! - a neighbour queue for ARP entries another worker learned (a NIC delivers ARP to
//!   one queue, so without it only that worker would know the real servers' MACs).
//!
//! Both refuse when full and the sender counts it; nothing blocks.
use crate::dpdk::{DpdkError, PacketRing};
use crate::wire::MacAddr;
use crossbeam::queue::ArrayQueue;
use std::net::Ipv4Addr;

/// Packets a worker's redirect ring holds (power of two; the ring keeps one free).
pub const REDIRECT_RING_SIZE: u32 = 2048;
/// Neighbour updates a worker's inbox holds.
pub const NEIGHBOUR_INBOX: usize = 1024;

pub struct Mesh {
    redirect: Vec<PacketRing>,
    neighbours: Vec<ArrayQueue<(Ipv4Addr, MacAddr)>>,
}

impl Mesh {
    /// Inboxes for `workers` workers; `name` keeps ring names unique per process.
    pub fn new(name: &str, workers: usize) -> Result<Mesh, DpdkError> {
        let redirect = (0..workers)
            .map(|w| {
                PacketRing::new_multi_producer(&format!("{name}_redir{w}"), REDIRECT_RING_SIZE)
            })
            .collect::<Result<_, _>>()?;
        Ok(Mesh {
            redirect,
            neighbours: (0..workers)
                .map(|_| ArrayQueue::new(NEIGHBOUR_INBOX))
                .collect(),
        })
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
        self.neighbours
            .iter()
            .enumerate()
            .filter(|&(w, q)| w != from && q.push((ip, mac)).is_err())
            .count()
    }

    /// Takes the neighbour updates waiting for worker `w`.
    pub fn take_neighbours(&self, w: usize, mut each: impl FnMut(Ipv4Addr, MacAddr)) {
        if let Some(q) = self.neighbours.get(w) {
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
        let mesh = Mesh {
            redirect: Vec::new(),
            neighbours: (0..3).map(|_| ArrayQueue::new(2)).collect(),
        };
        let ip = Ipv4Addr::new(198, 18, 0, 9);
        let mac = MacAddr([2, 0, 0, 0, 0, 9]);
        assert_eq!(mesh.share_neighbour(1, ip, mac), 0);
        let mut got = Vec::new();
        mesh.take_neighbours(0, |i, m| got.push((0, i, m)));
        mesh.take_neighbours(1, |i, m| got.push((1, i, m)));
        mesh.take_neighbours(2, |i, m| got.push((2, i, m)));
        assert_eq!(got, vec![(0, ip, mac), (2, ip, mac)]);
        for _ in 0..2 {
            assert_eq!(mesh.share_neighbour(0, ip, mac), 0);
        }
        assert_eq!(mesh.share_neighbour(0, ip, mac), 2, "both inboxes full");
    }
}
