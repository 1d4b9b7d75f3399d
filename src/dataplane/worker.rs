//! The run-to-completion loop of one worker lcore: RX burst -> process -> TX burst, on
//! every port, until told to stop. The worker owns its queues, its neighbour table, its
//! session table and its counters' only writer; it takes no lock and makes no syscall.
use crate::dataplane::capture::{CaptureTap, Direction};
use crate::dataplane::counters::{bump, Event, WorkerCounters};
use crate::dataplane::exception::{self, ExceptionLink};
use crate::dataplane::forwarder::{Action, Forwarder, PortContext};
use crate::dataplane::held::Held;
use crate::dataplane::local::LocalResponder;
use crate::dataplane::mesh::{Injected, Mesh};
use crate::dataplane::neighbour::{Learn, NeighbourTable};
use crate::dataplane::query::Mailbox;
use crate::dpdk::{tsc, tsc_hz, Burst, Mempool, RingConsumer, RxQueue, TxQueue};
use crate::model::DropReason;
use crate::wire::{ethernet, IpProtocol, MacAddr};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::Arc;

/// Synced sessions a worker installs per poll at most, so a bulk of them never
/// stalls its RX loop.
const INSTALLS_PER_POLL: usize = 256;

/// How often a worker does its housekeeping ([`Worker::housekeeping`]), in
/// microseconds. Each of its steps is cheap when it finds nothing, but together they
/// read a dozen queues and counters that other cores write: about 100 TSC cycles per
/// poll, half of what an empty poll costs (perf/results/harness.md), paid again on
/// every small burst. Every 10 µs keeps each step's delay far below anything it
/// serves (the session clock ticks in milliseconds, a management query waits up to its
/// own timeout), while a saturated worker, whose 32-packet bursts take about that
/// long, still runs it about every poll.
const HOUSEKEEPING_PERIOD_US: u64 = 10;

/// Neighbour entries per worker and family by default (`[sessions] neighbours`);
/// inserting beyond the capacity is refused and counted.
pub const NEIGHBOUR_CAPACITY: usize = 4096;

/// How long a frame may wait for its next hop's MAC (`Held`): an ARP answer takes
/// well under a millisecond on a LAN; past this the sender's own retransmission is
/// due anyway.
const HOLD_MS: u64 = 200;

/// One port as a worker sees it: its own queue pair, the port's local responder, and
/// what the forwarder needs to source packets from it.
pub struct WorkerPort {
    pub rx: RxQueue,
    pub tx: TxQueue,
    pub responder: LocalResponder,
    /// Source address of Sluice's own ARP, ICMP and tunnel packets on this port.
    pub addr: Ipv4Addr,
    pub mtu: u16,
    /// The port's exception path to its kernel interface, if it has one.
    pub exception: Option<ExceptionLink>,
}

pub struct Worker {
    pub id: u16,
    /// Source of the mbufs for Sluice's own packets (ARP requests for real servers).
    pub pool: Arc<Mempool>,
    pub ports: Vec<WorkerPort>,
    pub neighbours: NeighbourTable,
    pub forwarder: Forwarder,
    pub counters: Arc<WorkerCounters>,
    pub links: Links,
    /// Rewritten frames waiting for their next hop's MAC.
    held: Held,
    /// How long to sleep after [`IDLE_POLLS_BEFORE_SLEEP`] polls in a row found
    /// nothing; `None` (the default) polls without pause. See [`Worker::with_idle_sleep`].
    idle_sleep: Option<std::time::Duration>,
    /// Which family the next resolution round asks for first: the two share a
    /// round's burst, so they take turns at it.
    resolve_v6_first: bool,
}

/// Empty polls in a row before an idle worker sleeps: a burst gap shorter than this
/// (a few microseconds) never costs a sleep's wake-up latency.
pub const IDLE_POLLS_BEFORE_SLEEP: u32 = 256;

/// What connects a worker to the rest of the process.
pub struct Links {
    /// Set by the management core to end the loop.
    pub stop: Arc<AtomicBool>,
    /// The other workers' inboxes and the management core's punt ring.
    pub mesh: Arc<Mesh>,
    /// This worker's own inbox: packets other workers redirected here.
    pub inbox: RingConsumer,
    /// Worker 0's only: the management core's frames to transmit.
    pub inject: Option<RingConsumer>,
    /// Questions from the management core (listings of sessions and port pools).
    pub mailbox: Arc<Mailbox>,
    /// Packet capture: copies of the frames a running capture selects.
    pub capture: CaptureTap,
}

impl Worker {
    pub fn new(
        id: u16,
        pool: Arc<Mempool>,
        ports: Vec<WorkerPort>,
        forwarder: Forwarder,
        counters: Arc<WorkerCounters>,
        links: Links,
    ) -> Self {
        Worker {
            id,
            pool,
            ports,
            // The same size as the forwarder's IPv6 table: both are `[sessions]
            // neighbours`.
            neighbours: {
                let mut table = NeighbourTable::with_capacity(forwarder.neighbour_capacity());
                for &(ip, mac) in forwarder.static_neighbours4() {
                    // The config check keeps them within an eighth of the table.
                    let pinned = table.pin(ip, mac);
                    debug_assert!(pinned, "static neighbour {ip} does not fit");
                }
                table
            },
            forwarder,
            counters,
            links,
            held: Held::new(tsc_hz() / 1000 * HOLD_MS),
            idle_sleep: None,
            resolve_v6_first: false,
        }
    }

    /// Lets the worker sleep `sleep` whenever [`IDLE_POLLS_BEFORE_SLEEP`] polls in a
    /// row found no packet (`lcores.idle_sleep_us`). A polling loop never yields its
    /// CPU: right for a dedicated core, wasteful where workers share CPUs with each
    /// other or with other programs (loopback tests, demos, small VMs). The price is
    /// up to one sleep (plus the kernel's timer slack) of added latency for the first
    /// packet after a quiet spell; a busy worker never sleeps.
    pub fn with_idle_sleep(mut self, sleep: Option<std::time::Duration>) -> Self {
        self.idle_sleep = sleep.filter(|d| !d.is_zero());
        self
    }

    /// Polls until `stop` is set. Returns 0 (the lcore's exit code).
    pub fn run(mut self) -> i32 {
        log::info!("worker {} polling {} port(s)", self.id, self.ports.len());
        let mut rx = Burst::new();
        let mut tx = Burst::new();
        let mut next_resolve = 0u64;
        let mut outbox = Outbox::new(self.links.mesh.workers());
        let mut idle_polls = 0u32;
        self.counters
            .session_table_bytes
            .store(self.forwarder.sessions().memory_bytes() as u64, Relaxed);
        let housekeeping_period = tsc_hz() / 1_000_000 * HOUSEKEEPING_PERIOD_US;
        let mut next_housekeeping = 0u64;
        while !self.links.stop.load(Relaxed) {
            let start = tsc();
            let housekeeping = start >= next_housekeeping;
            if housekeeping {
                next_housekeeping = start + housekeeping_period;
                self.housekeeping(start, &mut next_resolve, &mut tx);
            }
            let mut received = self.drain_redirected(start, &mut rx, &mut tx, &mut outbox);
            for (index, port) in self.ports.iter_mut().enumerate() {
                let mut cx = BurstContext {
                    forwarder: &mut self.forwarder,
                    neighbours: &mut self.neighbours,
                    counters: &self.counters,
                    held: &mut self.held,
                    outbox: &mut outbox,
                    capture: &self.links.capture,
                    now: start,
                };
                received += poll_port(port, index as u16, &mut cx, &mut rx, &mut tx);
                outbox.send(&self.links.mesh, &self.counters);
            }
            if housekeeping {
                self.release_awaiting(start, &mut tx, &mut outbox);
                self.retry_syns(start, &mut tx, &mut outbox);
                self.send_held(start);
                self.share_neighbours();
                self.counters
                    .neighbour_entries
                    .store(self.neighbours.len() as u64, Relaxed);
            }
            let cycles = tsc().wrapping_sub(start);
            bump(&self.counters.total_cycles, cycles);
            bump(&self.counters.polls, 1);
            if received > 0 {
                bump(&self.counters.busy_cycles, cycles);
                idle_polls = 0;
            } else if let Some(sleep) = self.idle_sleep {
                idle_polls = idle_polls.saturating_add(1);
                if idle_polls >= IDLE_POLLS_BEFORE_SLEEP {
                    // Slept time counts as idle time: busy / total stays the load.
                    let before = tsc();
                    std::thread::sleep(sleep);
                    bump(&self.counters.total_cycles, tsc().wrapping_sub(before));
                }
            }
        }
        log::info!("worker {} stopped", self.id);
        0
    }
}

impl Worker {
    /// What a worker does besides moving packets, at most once per
    /// [`HOUSEKEEPING_PERIOD_US`]: advance its clock and expire sessions, adopt a new
    /// service snapshot, answer the management core's questions, learn the neighbours
    /// and install the synced sessions other workers and the management core sent, and
    /// transmit the management core's frames.
    fn housekeeping(&mut self, now: u64, next_resolve: &mut u64, tx: &mut Burst) {
        self.forwarder.poll(now, &self.counters);
        self.counters.zero_if_requested();
        let wanted = self.forwarder.take_resolve_wanted();
        if self.forwarder.take_snapshot_changed() || wanted || now >= *next_resolve {
            *next_resolve = now + tsc_hz();
            self.resolve_real_servers(now);
        }
        let (forwarder, id, neighbours) = (&self.forwarder, self.id, &self.neighbours);
        self.links
            .mailbox
            .serve(|query| forwarder.answer(query, id, neighbours, now));
        let me = self.id as usize;
        let (neighbours, policy) = (&mut self.neighbours, self.forwarder.neighbour_policy());
        let counters = &self.counters;
        self.links.mesh.take_neighbours(me, |ip, mac| {
            // The learning worker judged the entry against its own table; this one may
            // be fuller, so the reserve for real servers is kept here too.
            let room = neighbours.unreserved();
            if policy.learn(neighbours, ip, mac, now, room, false) == Learn::Reclaimed {
                counters.event(Event::NeighbourReclaimed);
            }
        });
        let forwarder = &mut self.forwarder;
        self.links.mesh.take_neighbours6(me, |ip, mac| {
            if forwarder.learn_shared_neighbour6(ip, mac, now) == Learn::Reclaimed {
                counters.event(Event::Neighbour6Reclaimed);
            }
        });
        let (forwarder, counters) = (&mut self.forwarder, &self.counters);
        self.links
            .mesh
            .take_installs(me, INSTALLS_PER_POLL, |record| {
                counters.event(
                    forwarder
                        .install(&record)
                        .unwrap_or(Event::SyncInstallFailed),
                );
            });
        self.send_injected(tx);
    }

    /// Handles the packets other workers redirected here, grouped by the port they
    /// arrived on; returns how many there were.
    fn drain_redirected(
        &mut self,
        now: u64,
        rx: &mut Burst,
        tx: &mut Burst,
        outbox: &mut Outbox,
    ) -> usize {
        let n = self.links.inbox.dequeue(rx);
        if n == 0 {
            return 0;
        }
        self.counters.event_n(Event::RedirectedIn, n as u64);
        let mut same_port = Burst::new();
        while !rx.is_empty() {
            let port_index = rx.port(0);
            let mut i = 0;
            while i < rx.len() {
                if rx.port(i) == port_index {
                    rx.move_to(i, &mut same_port);
                }
                i += 1;
            }
            rx.compact_moved();
            match self.ports.get_mut(port_index as usize) {
                Some(port) => {
                    let mut cx = BurstContext {
                        forwarder: &mut self.forwarder,
                        neighbours: &mut self.neighbours,
                        counters: &self.counters,
                        held: &mut self.held,
                        outbox,
                        capture: &self.links.capture,
                        now,
                    };
                    process(port, port_index, true, &mut cx, &mut same_port, tx)
                }
                // Cannot happen (the port field is ours): free rather than misroute.
                None => same_port.free_all(),
            }
        }
        n
    }

    /// Transmits the management core's frames (worker 0 only), each as its kind
    /// ([`Injected`], in the mbuf) says: health probes and unicast sync datagrams get
    /// the first port's MAC and their destination's, or become an ARP request (a
    /// Neighbor Solicitation for an IPv6 probe) for it when unknown (the probe is lost then, and times out; so is the datagram, which
    /// sync tolerates); frames already addressed (VRRP, ARP, sync to a multicast
    /// group) just get the port's MAC as their source; an `Addressed` frame to the
    /// zero MAC (a VRRP advert to a unicast peer) is resolved as a probe is. The
    /// source IP is the frame's own (any address of the port).
    fn send_injected(&mut self, out: &mut Burst) {
        let Some(inject) = &self.links.inject else {
            return;
        };
        let n = inject.dequeue(out);
        if n == 0 {
            return;
        }
        // The kernel's frames leave only as their port's own.
        let mut foreign = Burst::new();
        for i in 0..out.len() {
            if Injected::from_tag(out.user_tag(i)) == Some(Injected::Kernel) {
                let port = self.ports.get(usize::from(out.port(i)));
                if !port
                    .is_some_and(|p| exception::kernel_frame_is_ours(out.packet(i), &p.responder))
                {
                    out.move_to(i, &mut foreign);
                }
            }
        }
        if !foreign.is_empty() {
            self.counters
                .drop_n(DropReason::ExceptionForeignSource, foreign.len() as u64);
            foreign.free_all();
            out.compact_moved();
        }
        let Some(port) = self.ports.first_mut() else {
            out.free_all();
            return;
        };
        let (mac, addr) = (port.responder.mac(), port.addr);
        let mut untagged = Burst::new();
        let mut elsewhere = Burst::new();
        for i in 0..out.len() {
            let kind = Injected::from_tag(out.user_tag(i));
            if kind == Some(Injected::Kernel) {
                // The kernel addressed it (its interface has the port's MAC); the
                // mbuf's port field says which port's interface wrote it.
                if out.port(i) != 0 {
                    out.move_to(i, &mut elsewhere);
                }
                continue;
            }
            let frame = out.packet_mut(i);
            let to = ethernet::Frame::new_unchecked(&*frame).dst_addr();
            let sent = match kind {
                Some(Injected::Addressed) if to != MacAddr::ZERO => {
                    let _ = crate::forward::dr::forward(frame, to, mac);
                    continue;
                }
                // To a neighbour by address only (a unicast VRRP advert).
                Some(Injected::Addressed) => None,
                Some(Injected::SyncDatagram) if to != MacAddr::ZERO => {
                    // To a group: addressed already.
                    let _ = crate::forward::dr::forward(frame, to, mac);
                    self.counters.event(Event::SyncFrameSent);
                    continue;
                }
                Some(Injected::SyncDatagram) => Some(Event::SyncFrameSent),
                Some(Injected::HealthProbe) => Some(Event::HealthProbeSent),
                Some(Injected::Kernel) => continue,
                None => {
                    // Only `inject` fills the ring, and it tags every frame.
                    out.move_to(i, &mut untagged);
                    continue;
                }
            };
            if ethernet::Frame::new_unchecked(&*frame).ethertype() == ethernet::EtherType::IPV6 {
                // To an IPv6 real server: its MAC from the IPv6 neighbour table, else a
                // Neighbor Solicitation from the frame's source in its place.
                let ends = crate::wire::ipv6::Packet::new_checked(&frame[ethernet::HEADER_LEN..])
                    .ok()
                    .map(|ip| (ip.src_addr(), ip.dst_addr()));
                let Some((src, target)) = ends else {
                    out.move_to(i, &mut untagged);
                    continue;
                };
                if let Some(peer) = self.forwarder.neighbour6(target) {
                    let _ = crate::forward::dr::forward(frame, peer, mac);
                    if let Some(sent) = sent {
                        self.counters.event(sent);
                    }
                    continue;
                }
                let solicit = out.set_packet_len(i, SOLICIT_LEN as u16).then(|| {
                    let frame = out.packet_mut(i);
                    crate::wire::icmpv6::write_solicit(
                        frame,
                        ethernet::HEADER_LEN,
                        mac,
                        src,
                        target,
                        None,
                    )
                });
                match solicit.flatten() {
                    Some(len) => {
                        out.set_packet_len(i, len as u16);
                    }
                    None => {
                        out.move_to(i, &mut untagged);
                    }
                }
                WorkerCounters::drop(&self.counters, DropReason::NeighbourUnresolved);
                continue;
            }
            let target = crate::wire::ipv4::Packet::new_checked(&frame[ethernet::HEADER_LEN..])
                .ok()
                .map(|ip| ip.dst_addr());
            let Some(target) = target else {
                // No address to resolve: never on the wire unaddressed.
                out.move_to(i, &mut untagged);
                continue;
            };
            match self.neighbours.lookup(target) {
                Some(peer) => {
                    let _ = crate::forward::dr::forward(frame, peer, mac);
                    if let Some(sent) = sent {
                        self.counters.event(sent);
                    }
                }
                None => {
                    // An ARP request in its place, in a frame grown to the request's
                    // 60 bytes first (an IPv4 SYN probe is 58); one that cannot be
                    // made is freed, never sent unaddressed.
                    let request = out.set_packet_len(i, ARP_FRAME_LEN as u16).then(|| {
                        crate::wire::arp::write_request(
                            out.packet_mut(i),
                            ethernet::HEADER_LEN,
                            mac,
                            addr,
                            target,
                        )
                    });
                    match request.flatten() {
                        Some(len) => {
                            out.set_packet_len(i, len as u16);
                        }
                        None => {
                            out.move_to(i, &mut untagged);
                        }
                    }
                    WorkerCounters::drop(&self.counters, DropReason::NeighbourUnresolved);
                }
            }
        }
        untagged.free_all();
        out.compact_moved();
        let kernel = (0..out.len())
            .filter(|&i| out.user_tag(i) == Injected::Kernel.tag())
            .count();
        self.counters
            .event_n(Event::ExceptionInjected, kernel as u64);
        self.links.capture.tap(out, 0, Direction::Tx, tsc());
        let queued = out.len() as u64;
        let sent = port.tx.tx(out) as u64;
        bump(&self.counters.tx_packets, sent);
        for _ in sent..queued {
            WorkerCounters::drop(&self.counters, DropReason::TxFull);
        }
        out.free_all();
        if !elsewhere.is_empty() {
            self.send_kernel_frames(&mut elsewhere);
        }
    }

    /// The kernel's frames for ports other than the first (rare: the exception path
    /// of a second port), each out of the port its mbuf names.
    fn send_kernel_frames(&mut self, frames: &mut Burst) {
        while !frames.is_empty() {
            let index = frames.port(0);
            let mut same = Burst::new();
            for i in 0..frames.len() {
                if frames.port(i) == index {
                    frames.move_to(i, &mut same);
                }
            }
            frames.compact_moved();
            match self.ports.get_mut(usize::from(index)) {
                Some(port) => {
                    self.counters
                        .event_n(Event::ExceptionInjected, same.len() as u64);
                    let tap = (&self.links.capture, index, tsc());
                    transmit_all(port, &mut same, &self.counters, tap);
                }
                // Cannot happen: the management core names a port it has.
                None => same.free_all(),
            }
        }
    }

    /// Offers what the neighbour table learned since the last poll to the other workers.
    fn share_neighbours(&mut self) {
        let (mesh, me, counters) = (&self.links.mesh, self.id as usize, &self.counters);
        let lost = self.neighbours.take_changes(|ip, mac| {
            counters.event(Event::NeighbourShared);
            let full = mesh.share_neighbour(me, ip, mac);
            counters.event_n(Event::NeighbourShareLost, full as u64);
        });
        counters.event_n(Event::NeighbourShareLost, lost as u64);
        let lost = self.forwarder.take_neighbour6_changes(|ip, mac| {
            counters.event(Event::NeighbourShared);
            let full = mesh.share_neighbour6(me, ip, mac);
            counters.event_n(Event::NeighbourShareLost, full as u64);
        });
        counters.event_n(Event::NeighbourShareLost, lost as u64);
    }

    /// Sends ARP requests for real servers whose MAC is unknown, from the first port
    /// (Sluice is one-armed so far: clients and real servers share its port).
    fn resolve_real_servers(&mut self, now: u64) {
        let Some(port) = self.ports.first_mut() else {
            return;
        };
        let mut out = Burst::new();
        let (pool, mac, addr) = (&self.pool, port.responder.mac(), port.addr);
        // Worker 0 rechecks known ones: a NIC hands it the ARP answers, and the
        // health probes leave from it.
        let recheck = self.id == 0;
        // The families share the round's burst and take turns at going first, so
        // unanswered addresses of one cannot keep the other from every round.
        self.resolve_v6_first = !self.resolve_v6_first;
        for v6 in [self.resolve_v6_first, !self.resolve_v6_first] {
            if !v6 {
                self.forwarder
                    .resolve_real_servers(&mut self.neighbours, now, recheck, |target| {
                        push_arp_request(&mut out, pool, mac, addr, target)
                    });
                continue;
            }
            // IPv6 real servers are solicited from the port's IPv6 address that shares
            // the longest prefix with them (the one on their link).
            let addrs6 = port.responder.addrs6();
            if !addrs6.is_empty() {
                self.forwarder
                    .resolve_real_servers_v6(now, recheck, |target| {
                        let common =
                            |a: &Ipv6Addr| (u128::from(*a) ^ u128::from(target)).leading_zeros();
                        match addrs6.iter().max_by_key(|a| common(a)) {
                            Some(&src) => push_solicit(&mut out, pool, mac, src, target),
                            None => true,
                        }
                    });
            }
        }
        let tap = (&self.links.capture, 0, now);
        transmit_all(port, &mut out, &self.counters, tap);
    }

    /// The SYN proxy's waiting client segments (`Awaiting`): copies that become SYNs
    /// to real servers, and the segments whose real server has answered, go through
    /// the forwarder as if just received (after this poll's bursts, so after the ACK
    /// that completed the server's handshake); those that waited too long are
    /// dropped. Nothing to do (one branch) while nothing waits.
    fn release_awaiting(&mut self, now: u64, tx: &mut Burst, outbox: &mut Outbox) {
        if !self.forwarder.has_awaiting() {
            return;
        }
        for (index, port) in self.ports.iter_mut().enumerate() {
            let mut frames = Burst::new();
            let done = self
                .forwarder
                .release_awaiting(index as u16, now, &self.pool, &mut frames);
            self.counters
                .event_n(Event::SynproxyDataSent, done.frames as u64);
            self.counters
                .drop_n(DropReason::ServerUnanswered, done.expired as u64);
            self.counters
                .drop_n(DropReason::ClientReset, done.reset as u64);
            if frames.is_empty() {
                continue;
            }
            let mut cx = BurstContext {
                forwarder: &mut self.forwarder,
                neighbours: &mut self.neighbours,
                counters: &self.counters,
                held: &mut self.held,
                outbox,
                capture: &self.links.capture,
                now,
            };
            // As redirected frames: they are this worker's, never to be steered again.
            process(port, index as u16, true, &mut cx, &mut frames, tx);
            outbox.send(&self.links.mesh, &self.counters);
        }
    }

    /// The SYN proxy's timer, once its scan period is up while it times anything:
    /// the SYNs due again and the connections given up (`Forwarder::synproxy_retry`).
    /// The rebuilt client segments go through the forwarder as redirected frames do
    /// (flagged as the timer's, for its counters); the resets to clients go out as
    /// they are.
    fn retry_syns(&mut self, now: u64, tx: &mut Burst, outbox: &mut Outbox) {
        if !self.forwarder.synproxy_timer_due(now) {
            return;
        }
        for (index, port) in self.ports.iter_mut().enumerate() {
            let (mut frames, mut to_clients) = (Burst::new(), Burst::new());
            self.forwarder.synproxy_retry(
                index as u16,
                port.responder.mac(),
                now,
                &self.pool,
                &mut frames,
                &mut to_clients,
            );
            let capture = (&self.links.capture, index as u16, now);
            transmit_all(port, &mut to_clients, &self.counters, capture);
            if frames.is_empty() {
                continue;
            }
            let mut cx = BurstContext {
                forwarder: &mut self.forwarder,
                neighbours: &mut self.neighbours,
                counters: &self.counters,
                held: &mut self.held,
                outbox,
                capture: &self.links.capture,
                now,
            };
            cx.forwarder.synproxy_timer_frames(true);
            process(port, index as u16, true, &mut cx, &mut frames, tx);
            cx.forwarder.synproxy_timer_frames(false);
            outbox.send(&self.links.mesh, &self.counters);
        }
    }

    /// The held frames' turn (`Held`): ARP requests for their next hops, then the
    /// frames whose next hop was learned meanwhile go out, and those held too long
    /// are dropped. Nothing to do (one branch) while nothing is held.
    fn send_held(&mut self, now: u64) {
        if self.held.is_empty() {
            return;
        }
        let (pool, ports, counters) = (&self.pool, &mut self.ports, &self.counters);
        let capture = &self.links.capture;
        let forwarder = &mut self.forwarder;
        self.held.take_asks(|target, index| match target {
            std::net::IpAddr::V4(target) => {
                if let Some(port) = ports.get_mut(usize::from(index)) {
                    let mut out = Burst::new();
                    push_arp_request(&mut out, pool, port.responder.mac(), port.addr, target);
                    transmit_all(port, &mut out, counters, (capture, index, now));
                }
            }
            // Not asked for (see `process`); the next poll would solicit them.
            std::net::IpAddr::V6(_) => forwarder.request_resolution_v6(),
        });
        let learned = self
            .neighbours
            .learned_total()
            .wrapping_add(self.forwarder.neighbour6_learned_total());
        if !self.held.due(learned, now) {
            return;
        }
        let (neighbours, forwarder) = (&self.neighbours, &self.forwarder);
        for (index, port) in ports.iter_mut().enumerate() {
            let mut out = Burst::new();
            let (sent, expired) = self.held.release(
                index as u16,
                port.responder.mac(),
                now,
                |ip| match ip {
                    std::net::IpAddr::V4(ip) => neighbours.lookup(ip),
                    std::net::IpAddr::V6(ip) => forwarder.neighbour6(ip),
                },
                &mut out,
            );
            counters.event_n(Event::NeighbourHeldSent, sent as u64);
            counters.drop_n(DropReason::NeighbourUnresolved, expired as u64);
            transmit_all(port, &mut out, counters, (capture, index as u16, now));
        }
        self.held.looked(learned);
    }
}

/// Bytes of an Ethernet+IPv6 Neighbor Solicitation with its source link-layer option.
const SOLICIT_LEN: usize = 86;

/// Bytes of an Ethernet frame carrying an ARP request: the 42 of the request padded to
/// Ethernet's minimum (what `wire::arp::write_request` needs).
const ARP_FRAME_LEN: usize = 60;

/// Appends a Neighbor Solicitation for `target` from (`mac`, `src`) to `out`; false
/// when there was no room (`out` full or the pool empty).
fn push_solicit(
    out: &mut Burst,
    pool: &Mempool,
    mac: MacAddr,
    src: Ipv6Addr,
    target: Ipv6Addr,
) -> bool {
    if out.is_full() || !out.alloc_from(pool, 1) {
        return false;
    }
    let i = out.len() - 1;
    out.set_packet_len(i, SOLICIT_LEN as u16);
    match crate::wire::icmpv6::write_solicit(
        out.packet_mut(i),
        ethernet::HEADER_LEN,
        mac,
        src,
        target,
        None,
    ) {
        Some(len) => {
            out.set_packet_len(i, len as u16);
        }
        // Cannot happen: 86 bytes hold an Ethernet+IPv6+NS with its option.
        None => out.free_all(),
    }
    true
}

/// Appends an ARP request for `target`, from `mac`/`addr`, to `out`; false when there
/// was no room (`out` full or the pool empty).
fn push_arp_request(
    out: &mut Burst,
    pool: &Mempool,
    mac: MacAddr,
    addr: Ipv4Addr,
    target: Ipv4Addr,
) -> bool {
    if out.is_full() || !out.alloc_from(pool, 1) {
        return false;
    }
    let i = out.len() - 1;
    out.set_packet_len(i, ARP_FRAME_LEN as u16);
    match crate::wire::arp::write_request(
        out.packet_mut(i),
        ethernet::HEADER_LEN,
        mac,
        addr,
        target,
    ) {
        Some(len) => {
            out.set_packet_len(i, len as u16);
        }
        // Cannot happen: a 60-byte frame always holds an Ethernet+ARP request.
        // Should it ever, send nothing rather than a malformed frame.
        None => out.free_all(),
    }
    true
}

/// Transmits Sluice's own frames in `out` on `port` (a capture sees them as sent on
/// `tap`'s port index at its time); what the TX ring refuses is counted and freed.
fn transmit_all(
    port: &mut WorkerPort,
    out: &mut Burst,
    counters: &WorkerCounters,
    tap: (&CaptureTap, u16, u64),
) {
    if out.is_empty() {
        return;
    }
    tap.0.tap(out, tap.1, Direction::Tx, tap.2);
    let queued = out.len() as u64;
    let sent = port.tx.tx(out) as u64;
    bump(&counters.tx_packets, sent);
    counters.drop_n(DropReason::TxFull, queued - sent);
    out.free_all();
}

/// What handling bursts hands on besides transmitting: packets for the workers that
/// own their sessions, and frames for the management core. Filled during a burst,
/// sent (`send`) after it.
struct Outbox {
    /// Per destination worker, by worker id.
    redirect: Vec<Burst>,
    /// Frames for the management core: probe answers.
    punt: Burst,
    /// VRRP advertisements, on their own ring.
    vrrp: Burst,
    /// Peers' sync datagrams, on their own ring.
    sync: Burst,
}

impl Outbox {
    fn new(workers: usize) -> Outbox {
        Outbox {
            redirect: (0..workers).map(|_| Burst::new()).collect(),
            punt: Burst::new(),
            vrrp: Burst::new(),
            sync: Burst::new(),
        }
    }

    /// Hands the packets to their rings; what a full ring refuses is counted and freed.
    fn send(&mut self, mesh: &Mesh, counters: &WorkerCounters) {
        for (owner, out) in self.redirect.iter_mut().enumerate() {
            if out.is_empty() {
                continue;
            }
            let taken = match mesh.redirect_to(owner) {
                Some(ring) => ring.enqueue(out),
                None => 0,
            };
            counters.event_n(Event::RedirectedOut, taken as u64);
            counters.drop_n(DropReason::RedirectRingFull, out.len() as u64);
            out.free_all();
        }
        let rings = [
            (
                &mut self.punt,
                mesh.punt(),
                Event::HealthReplyUp,
                DropReason::HealthRingFull,
            ),
            (
                &mut self.sync,
                mesh.sync_punt(),
                Event::SyncFrameUp,
                DropReason::SyncRingFull,
            ),
            (
                &mut self.vrrp,
                mesh.vrrp_punt(),
                Event::VrrpAdvertUp,
                DropReason::VrrpRingFull,
            ),
        ];
        for (out, ring, up, full) in rings {
            if out.is_empty() {
                continue;
            }
            let taken = ring.enqueue(out);
            counters.event_n(up, taken as u64);
            counters.drop_n(full, out.len() as u64);
            out.free_all();
        }
    }
}

/// What handling one burst needs of its worker besides the port and the bursts.
struct BurstContext<'a> {
    forwarder: &'a mut Forwarder,
    neighbours: &'a mut NeighbourTable,
    counters: &'a WorkerCounters,
    /// Frames waiting for their next hop's MAC.
    held: &'a mut Held,
    outbox: &'a mut Outbox,
    capture: &'a CaptureTap,
    /// The poll's start (TSC).
    now: u64,
}

/// One burst from one port: returns how many packets were received.
#[inline]
fn poll_port(
    port: &mut WorkerPort,
    port_index: u16,
    cx: &mut BurstContext,
    rx: &mut Burst,
    tx: &mut Burst,
) -> usize {
    let n = port.rx.rx(rx);
    if n == 0 {
        return 0;
    }
    bump(&cx.counters.rx_packets, n as u64);
    cx.capture.tap(rx, port_index, Direction::Rx, cx.now);
    process(port, port_index, false, cx, rx, tx);
    n
}

/// Handles every packet of `rx` (all from `port`), transmits what is to be sent on the
/// port's queue, puts redirected and punted packets in the outbox and frees the rest.
#[inline]
fn process(
    port: &mut WorkerPort,
    port_index: u16,
    redirected: bool,
    cx: &mut BurstContext,
    rx: &mut Burst,
    tx: &mut Burst,
) {
    let BurstContext {
        forwarder,
        neighbours,
        counters,
        held,
        outbox,
        capture,
        now,
    } = cx;
    let (counters, now) = (*counters, *now);
    let n = rx.len();
    let ctx = PortContext {
        responder: &port.responder,
        index: port_index,
        mac: port.responder.mac(),
        addr: port.addr,
        mtu: port.mtu,
        redirected,
        exception: port.exception.is_some(),
    };
    let mut rx_bytes = 0u64;
    let mut tx_bytes = 0u64;
    for i in 0..n {
        rx_bytes += rx.packet_len(i) as u64;
    }
    let exception = &mut port.exception;
    forwarder.handle_burst(
        rx,
        &ctx,
        neighbours,
        now,
        counters,
        |forwarder, rx, i, action| {
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
                Action::Redirect(owner) => {
                    // The owner learns the port from the mbuf (ring PMDs leave it unset).
                    rx.set_port(i, port_index);
                    // Counted once the owner's ring took it (Outbox::send).
                    let moved = match outbox.redirect.get_mut(owner as usize) {
                        Some(out) => rx.move_to(i, out),
                        None => false,
                    };
                    if !moved {
                        counters.drop(DropReason::RedirectRingFull);
                    }
                    false
                }
                Action::Hold(target) => {
                    // IPv6: the forwarder has asked for a solicitation (one at most every
                    // 100 ms per address, within the hold time: an answer to the last
                    // one releases the frame as well).
                    let ask = match target {
                        std::net::IpAddr::V4(ip) => forwarder.arp_due(ip, now),
                        std::net::IpAddr::V6(_) => false,
                    };
                    if held.hold(rx, i, target, port_index, now, ask) {
                        counters.event(Event::NeighbourHeld);
                    } else {
                        counters.drop(DropReason::NeighbourUnresolved);
                    }
                    false
                }
                Action::AwaitServer(what) => {
                    if forwarder.await_server(rx, i, what, port_index, now) {
                        counters.event(Event::SynproxyDataHeld);
                    } else {
                        // Cannot happen: the forwarder asks only when there is room.
                        counters.drop(DropReason::ServerUnanswered);
                    }
                    false
                }
                Action::Punt => {
                    // Counted once the punt ring took it (Outbox::send).
                    // The forwarder punts VRRP, sync (UDP) and probe answers (TCP).
                    let frame = rx.packet(i);
                    let (out, full) = if crate::wire::vrrp::carries_vrrp(frame) {
                        (&mut outbox.vrrp, DropReason::VrrpRingFull)
                    } else if crate::wire::ipv4::carries(frame, IpProtocol::UDP) {
                        (&mut outbox.sync, DropReason::SyncRingFull)
                    } else {
                        (&mut outbox.punt, DropReason::HealthRingFull)
                    };
                    if !rx.move_to(i, out) {
                        counters.drop(full);
                    }
                    false
                }
                Action::Exception(punt) => {
                    // Counted once the exception ring took it (`ExceptionLink::flush`).
                    let taken = match exception.as_mut() {
                        Some(link) => link.take(rx, i, punt, now),
                        // Cannot happen: the forwarder asks only on a port with a link.
                        None => Err(DropReason::UnsupportedProtocol),
                    };
                    if let Err(reason) = taken {
                        counters.drop(reason);
                    }
                    false
                }
                // Never handed on: `handle_burst` gives the parked packet's real action.
                Action::Parked => false,
            };
            if send {
                // tx can hold a whole burst, and it is empty at the start of each poll.
                tx_bytes += rx.packet_len(i) as u64;
                rx.move_to(i, tx);
            }
        },
    );
    if let Some(link) = port.exception.as_mut() {
        link.flush(counters);
    }
    // Dropped packets are still in rx (sent ones were moved out); one bulk free.
    rx.free_all();
    bump(&counters.rx_bytes, rx_bytes);
    capture.tap(tx, port_index, Direction::Tx, now);
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
}
