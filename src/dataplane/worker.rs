//! The run-to-completion loop of one worker lcore: RX burst -> process -> TX burst, on
//! every port, until told to stop. The worker owns its queues, its neighbour table, its
//! session table and its counters' only writer; it takes no lock and makes no syscall.
use super::counters::{bump, DropReason, WorkerCounters};
use super::forwarder::{write_arp_request, Action, Forwarder, PortContext};
use super::local::LocalResponder;
use super::neighbour::NeighbourTable;
use crate::dpdk::{tsc, tsc_hz, Burst, Mempool, RxQueue, TxQueue};
use crate::wire::ethernet;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

/// Neighbour entries per worker; inserting beyond this is refused and counted.
pub const NEIGHBOUR_CAPACITY: usize = 4096;

/// One port as a worker sees it: its own queue pair, the port's local responder, and
/// what the forwarder needs to source packets from it.
pub struct WorkerPort {
    pub rx: RxQueue,
    pub tx: TxQueue,
    pub responder: LocalResponder,
    /// Source address of Sluice's own ARP, ICMP and tunnel packets on this port.
    pub addr: Ipv4Addr,
    pub mtu: u16,
}

pub struct Worker {
    pub id: u16,
    /// Source of the mbufs for Sluice's own packets (ARP requests for real servers).
    pub pool: Arc<Mempool>,
    pub ports: Vec<WorkerPort>,
    pub neighbours: NeighbourTable,
    pub forwarder: Forwarder,
    pub counters: Arc<WorkerCounters>,
    pub stop: Arc<AtomicBool>,
}

impl Worker {
    pub fn new(
        id: u16,
        pool: Arc<Mempool>,
        ports: Vec<WorkerPort>,
        forwarder: Forwarder,
        counters: Arc<WorkerCounters>,
        stop: Arc<AtomicBool>,
    ) -> Self {
        Worker {
            id,
            pool,
            ports,
            neighbours: NeighbourTable::with_capacity(NEIGHBOUR_CAPACITY),
            forwarder,
            counters,
            stop,
        }
    }

    /// Polls until `stop` is set. Returns 0 (the lcore's exit code).
    pub fn run(mut self) -> i32 {
        log::info!("worker {} polling {} port(s)", self.id, self.ports.len());
        let mut rx = Burst::new();
        let mut tx = Burst::new();
        let second = tsc_hz();
        let mut next_resolve = 0u64;
        while !self.stop.load(Relaxed) {
            let start = tsc();
            self.forwarder.poll(start, &self.counters);
            if self.forwarder.take_snapshot_changed() || start >= next_resolve {
                next_resolve = start + second;
                self.resolve_real_servers(start);
            }
            let mut received = 0;
            for port in &mut self.ports {
                received += poll_port(
                    port,
                    &mut self.forwarder,
                    &mut self.neighbours,
                    &self.counters,
                    start,
                    &mut rx,
                    &mut tx,
                );
            }
            let cycles = tsc().wrapping_sub(start);
            bump(&self.counters.total_cycles, cycles);
            bump(&self.counters.polls, 1);
            if received > 0 {
                bump(&self.counters.busy_cycles, cycles);
            }
        }
        log::info!("worker {} stopped", self.id);
        0
    }
}

impl Worker {
    /// Sends ARP requests for real servers whose MAC is unknown, from the first port
    /// (Sluice is one-armed so far: clients and real servers share its port).
    fn resolve_real_servers(&mut self, now: u64) {
        let Some(port) = self.ports.first_mut() else {
            return;
        };
        let mut out = Burst::new();
        let (pool, mac, addr) = (&self.pool, port.responder.mac(), port.addr);
        self.forwarder
            .resolve_real_servers(&self.neighbours, now, |target| {
                if out.is_full() || !out.alloc_from(pool, 1) {
                    return;
                }
                let i = out.len() - 1;
                out.set_packet_len(i, 60);
                match write_arp_request(out.packet_mut(i), ethernet::HEADER_LEN, mac, addr, target)
                {
                    Some(len) => {
                        out.set_packet_len(i, len as u16);
                    }
                    // Cannot happen: a 60-byte frame always holds an Ethernet+ARP request.
                    // Should it ever, send nothing rather than a malformed frame.
                    None => out.free_all(),
                }
            });
        let queued = out.len() as u64;
        let sent = port.tx.tx(&mut out) as u64;
        bump(&self.counters.tx_packets, sent);
        if sent < queued {
            (sent..queued).for_each(|_| WorkerCounters::drop(&self.counters, DropReason::TxFull));
        }
    }
}

/// One burst from one port: returns how many packets were received.
#[inline]
fn poll_port(
    port: &mut WorkerPort,
    forwarder: &mut Forwarder,
    neighbours: &mut NeighbourTable,
    counters: &WorkerCounters,
    now: u64,
    rx: &mut Burst,
    tx: &mut Burst,
) -> usize {
    let n = port.rx.rx(rx);
    if n == 0 {
        return 0;
    }
    let ctx = PortContext {
        responder: &port.responder,
        mac: port.responder.mac(),
        addr: port.addr,
        mtu: port.mtu,
    };
    let mut rx_bytes = 0u64;
    let mut tx_bytes = 0u64;
    forwarder.prefetch_sessions(rx);
    for i in 0..n {
        rx.prefetch(i + 1);
        rx_bytes += rx.packet_len(i) as u64;
        let action = forwarder.handle(rx, i, &ctx, neighbours, now, counters);
        let send = match action {
            Action::Transmit => true,
            Action::TransmitInstead(reason) => {
                counters.drop(reason);
                true
            }
            Action::Drop(reason) => {
                counters.drop(reason);
                false
            }
        };
        if send {
            // tx can hold a whole burst, and it is empty at the start of each poll.
            tx_bytes += rx.packet_len(i) as u64;
            rx.move_to(i, tx);
        }
    }
    // Dropped packets are still in rx (sent ones were moved out); one bulk free.
    rx.free_all();
    bump(&counters.rx_packets, n as u64);
    bump(&counters.rx_bytes, rx_bytes);
    let queued = tx.len();
    let sent = port.tx.tx(tx);
    if sent < queued {
        // The TX ring is full: count each refused packet and free it, never wait.
        for i in 0..tx.len() {
            tx_bytes -= tx.packet_len(i) as u64;
            counters.drop(DropReason::TxFull);
        }
        tx.free_all();
    }
    bump(&counters.tx_packets, sent as u64);
    bump(&counters.tx_bytes, tx_bytes);
    counters
        .neighbour_entries
        .store(neighbours.len() as u64, Relaxed);
    n
}
