//! The bounded channels between workers, the only way one worker's traffic reaches
//! another. Every worker has two inboxes here:
//!
//! - a packet ring (DPDK `rte_ring`, any producer, one consumer) for NAT replies the
//!   NIC's hash delivered to a worker that does not own their session;
//! - a neighbour queue for ARP entries another worker learned (a NIC delivers ARP to
//!   one queue, so without it only that worker would know the real servers' MACs),
//!   and one for IPv6 neighbours (a Neighbor Advertisement lands on the queue RSS
//!   picks, maybe not the soliciting worker's, and worker 0 addresses the health
//!   probes from its own table).
//!
//! And two rings link the workers with the management core: frames it originates
//! (health probes, VRRP advertisements, gratuitous ARP, sync datagrams over a DPDK
//! port) go out through worker 0 on the **inject** ring (one producer, one consumer),
//! and frames the workers hand up to it come back on three **punt** rings (any worker
//! produces, the management core consumes), one per kind so that none can crowd out
//! another: probe answers, VRRP advertisements, sync datagrams. Sync over a DPDK port
//! (`[sync] port`) makes the inject ring and the probe and sync punt rings larger
//! (`SYNC_PORT_RING_SIZE`).
//!
//! All refuse when full and the sender counts it; nothing blocks. The shared side
//! (the producers any worker may use) lives in [`Mesh`]; each single end is handed to
//! its one owner at start-up in [`MeshEnds`].
use crate::dpdk::{DpdkError, PacketRing, RingConsumer, RingProducer, SharedProducer};
use crate::wire::MacAddr;
use crossbeam::queue::ArrayQueue;
use std::net::{Ipv4Addr, Ipv6Addr};

/// Packets a worker's redirect ring holds (power of two; the ring keeps one free).
pub const REDIRECT_RING_SIZE: u32 = 2048;
/// Neighbour updates a worker's inbox holds.
pub const NEIGHBOUR_INBOX: usize = 1024;
/// Synced sessions waiting in a worker's install inbox.
pub const INSTALL_INBOX: usize = 8192;
/// Frames in flight on the inject ring (health probes, VRRP adverts, gratuitous ARP)
/// and on the probes' and the sync punt rings.
pub const HEALTH_RING_SIZE: u32 = 1024;
/// VRRP advertisements handed up on a ring of their own, so that nothing else the
/// workers hand up (a flood of forged probe answers, a burst of sync datagrams) can
/// crowd them out and make a master look dead. Adverts come at most every 10 ms per
/// peer; the management core drains the ring first, every tick.
pub const VRRP_RING_SIZE: u32 = 64;
/// The same rings when session sync also travels through them (`[sync] port`): at
/// ~26k sync datagrams/s (measured at 343k new connections/s), 130 per 5 ms
/// management tick each way, 4096 slots are ~150 ms of them (1024 would be ~40 ms,
/// a few slow ticks), and hold the most one tick sends at once (65536 events at 38
/// records per 1500-byte authenticated datagram: ~1700 datagrams).
pub const SYNC_PORT_RING_SIZE: u32 = 4096;

/// What a frame on the inject ring is, set by the management core in the mbuf
/// ([`Burst::set_user_tag`](crate::dpdk::Burst::set_user_tag)) so that worker 0
/// addresses and counts it without guessing from its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Injected {
    /// A health probe to a real server: worker 0 writes the port's MAC and the real
    /// server's from its neighbour table (or sends an ARP request instead).
    HealthProbe = 1,
    /// A session sync datagram: to a peer, addressed as a probe is; to a multicast
    /// group, addressed already.
    SyncDatagram = 2,
    /// Addressed already (VRRP advertisements, gratuitous ARP, ARP requests): worker 0
    /// only writes the port's MAC as the source. To the zero MAC (a VRRP advert to a
    /// unicast peer): worker 0 resolves the destination as it does a probe's.
    Addressed = 3,
    /// Written by the kernel to a port's exception interface (`[ports.exception]`):
    /// sent as it is, out of the port the mbuf's port field names.
    Kernel = 4,
}

impl Injected {
    pub fn tag(self) -> u32 {
        self as u32
    }

    pub fn from_tag(tag: u32) -> Option<Injected> {
        match tag {
            1 => Some(Injected::HealthProbe),
            2 => Some(Injected::SyncDatagram),
            3 => Some(Injected::Addressed),
            4 => Some(Injected::Kernel),
            _ => None,
        }
    }
}

pub struct Mesh {
    /// Each worker's inbox, by worker id.
    redirect: Vec<SharedProducer>,
    neighbours: NeighbourInboxes<Ipv4Addr>,
    neighbours6: NeighbourInboxes<Ipv6Addr>,
    /// Frames for the management core: health probes' answers.
    punt: SharedProducer,
    /// VRRP advertisements for the management core.
    vrrp_punt: SharedProducer,
    /// Peers' sync datagrams for the management core (sync over a port).
    sync_punt: SharedProducer,
    management_ring_size: u32,
    /// Session sync: records from the peer, for the worker that will own each session.
    installs: Vec<ArrayQueue<crate::session::replication::RecordRepr>>,
}

/// The single ends of the mesh's rings, each for its one owner.
pub struct MeshEnds {
    /// Worker w's inbox of redirected packets, for worker w.
    pub redirect_inboxes: Vec<RingConsumer>,
    /// The management core's frames, for worker 0 to transmit.
    pub inject_out: RingConsumer,
    /// Where the management core queues its frames.
    pub inject_in: RingProducer,
    /// What the workers punted, for the management core.
    pub punted: RingConsumer,
    /// The VRRP advertisements the workers punted.
    pub vrrp_punted: RingConsumer,
    /// The sync datagrams the workers punted.
    pub sync_punted: RingConsumer,
}

impl Mesh {
    /// Inboxes for `workers` workers; `name` keeps ring names unique per process.
    pub fn new(name: &str, workers: usize) -> Result<(Mesh, MeshEnds), DpdkError> {
        Self::with_management_ring(name, workers, HEALTH_RING_SIZE)
    }

    /// As `new`, with inject and punt rings of `ring_size` slots (a power of two).
    pub fn with_management_ring(
        name: &str,
        workers: usize,
        ring_size: u32,
    ) -> Result<(Mesh, MeshEnds), DpdkError> {
        let (redirect, redirect_inboxes): (Vec<_>, Vec<_>) = (0..workers)
            .map(|w| PacketRing::multi_producer(&format!("{name}_redir{w}"), REDIRECT_RING_SIZE))
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .unzip();
        let (inject_in, inject_out) =
            PacketRing::single_producer(&format!("{name}_inject"), ring_size)?;
        let (punt, punted) = PacketRing::multi_producer(&format!("{name}_punt"), ring_size)?;
        let (vrrp_punt, vrrp_punted) =
            PacketRing::multi_producer(&format!("{name}_vrrp"), VRRP_RING_SIZE)?;
        let (sync_punt, sync_punted) =
            PacketRing::multi_producer(&format!("{name}_sync"), ring_size)?;
        Ok((
            Mesh {
                redirect,
                neighbours: NeighbourInboxes::new(workers, NEIGHBOUR_INBOX),
                neighbours6: NeighbourInboxes::new(workers, NEIGHBOUR_INBOX),
                installs: (0..workers)
                    .map(|_| ArrayQueue::new(INSTALL_INBOX))
                    .collect(),
                punt,
                vrrp_punt,
                sync_punt,
                management_ring_size: ring_size,
            },
            MeshEnds {
                redirect_inboxes,
                inject_out,
                inject_in,
                punted,
                vrrp_punted,
                sync_punted,
            },
        ))
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

    /// Where a worker hands frames up to the management core.
    pub fn punt(&self) -> &SharedProducer {
        &self.punt
    }

    /// Where a worker hands VRRP advertisements up ([`VRRP_RING_SIZE`]).
    pub fn vrrp_punt(&self) -> &SharedProducer {
        &self.vrrp_punt
    }

    /// Where a worker hands a peer's sync datagram up: a ring of its own, so that a
    /// burst of them, or a flood forged from a peer's address (checked only by the
    /// management core), cannot crowd out the probes' answers and make live real
    /// servers look dead, nor the answers crowd out sync.
    pub fn sync_punt(&self) -> &SharedProducer {
        &self.sync_punt
    }

    /// Slots of the inject and punt rings.
    pub fn management_ring_size(&self) -> u32 {
        self.management_ring_size
    }

    pub fn workers(&self) -> usize {
        self.redirect.len()
    }

    /// Where any worker hands packets to worker `w` (`None` past the last worker).
    pub fn redirect_to(&self, w: usize) -> Option<&SharedProducer> {
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

    /// Offers a learned IPv6 neighbour to every worker but `from`; returns how many
    /// inboxes were full.
    pub fn share_neighbour6(&self, from: usize, ip: Ipv6Addr, mac: MacAddr) -> usize {
        self.neighbours6.share(from, ip, mac)
    }

    /// Takes the IPv6 neighbour updates waiting for worker `w`.
    pub fn take_neighbours6(&self, w: usize, each: impl FnMut(Ipv6Addr, MacAddr)) {
        self.neighbours6.take(w, each)
    }
}

/// One bounded queue of neighbour updates per worker.
struct NeighbourInboxes<A>(Vec<ArrayQueue<(A, MacAddr)>>);

impl<A: Copy> NeighbourInboxes<A> {
    fn new(workers: usize, capacity: usize) -> Self {
        NeighbourInboxes((0..workers).map(|_| ArrayQueue::new(capacity)).collect())
    }

    fn share(&self, from: usize, ip: A, mac: MacAddr) -> usize {
        self.0
            .iter()
            .enumerate()
            .filter(|&(w, q)| w != from && q.push((ip, mac)).is_err())
            .count()
    }

    fn take(&self, w: usize, mut each: impl FnMut(A, MacAddr)) {
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
