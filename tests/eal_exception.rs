//! A real worker loop on lcore 1 over net_ring, its port with an exception path (a
//! ring the test reads as the management core would): what the worker hands to the
//! kernel and what it keeps, frame by frame, IPv4 and IPv6, and the rate limit.
//!
//! - ARP: a request for the port's address is answered, not handed up; a reply to
//!   the port's MAC is learned and handed up; a broadcast reply is not.
//! - IPv4: TCP to the port's address (BGP), UDP (BFD) and OSPF go up; an echo
//!   request is answered, an echo reply goes up; TCP to a VIP port without a
//!   service, or to the port's address but to another MAC, does not.
//! - IPv6: TCP to the port's IPv6 address and to a link-local one goes up, to
//!   another address does not.
//! - A burst of 100 datagrams to the port's address at a rate of 50/s: the bucket
//!   (8) goes up, the rest is `exception_rate_limited`.
//! - Then 30 BFD datagrams and 30 SYNs to port 22, all with TTL 255, at once: the
//!   BFD ones all go up on the control budget (`exception_punted_control`), the SYNs
//!   get no more than the rate's refill.
//!
//! One test function only: the EAL initialises once per process.
mod common;

use common::eal::{eal_args, ring_ports, worker_with, LB_MAC};
use sluice::dataplane::counters::Event;
use sluice::dataplane::exception::{ExceptionLink, PuntRings};
use sluice::dpdk::{launch_on_lcore, wait_lcore, Burst, Eal, Mempool, PacketRing, RingPortPair};
use sluice::emulator::frames::{self, Endpoints};
use sluice::model::{DropReason, ForwardMode, Protocol, RealServerSpec, SchedulerKind, ServiceKey};
use sluice::service::{ServiceTable, Snapshot, SnapshotPublisher};
use sluice::wire::checksum;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

const PEER_MAC: [u8; 6] = [0x02, 0x50, 0x45, 0, 0, 1];
const OTHER_MAC: [u8; 6] = [0x02, 0x50, 0x45, 0, 0, 2];
const SYN: u8 = 0x02;
const RATE: u32 = 50;
/// `ExceptionLink::new`'s bucket for that rate: a twentieth of it, at least 8.
const BUCKET: u64 = 8;

/// An Ethernet/IPv6/TCP SYN from `src` to `dst`:179 with a valid checksum.
fn syn6(buf: &mut [u8], src: Ipv6Addr, dst: Ipv6Addr) -> usize {
    buf[0..6].copy_from_slice(&LB_MAC);
    buf[6..12].copy_from_slice(&PEER_MAC);
    buf[12..14].copy_from_slice(&[0x86, 0xdd]);
    let ip = &mut buf[14..54];
    ip[0..4].copy_from_slice(&[0x60, 0, 0, 0]);
    ip[4..6].copy_from_slice(&20u16.to_be_bytes());
    ip[6] = 6;
    ip[7] = 64;
    ip[8..24].copy_from_slice(&src.octets());
    ip[24..40].copy_from_slice(&dst.octets());
    let tcp = &mut buf[54..74];
    tcp.fill(0);
    tcp[0..2].copy_from_slice(&40000u16.to_be_bytes());
    tcp[2..4].copy_from_slice(&179u16.to_be_bytes());
    tcp[12] = 5 << 4;
    tcp[13] = SYN;
    tcp[14..16].copy_from_slice(&65535u16.to_be_bytes());
    let sum = checksum::pseudo_header_sum_v6(src, dst, 6, 20) + checksum::sum(tcp);
    let c = checksum::finish(sum);
    tcp[16..18].copy_from_slice(&c.to_be_bytes());
    74
}

/// Sets an IPv4 frame's TTL to 255 (as GTSM senders and BFD do), its header
/// checksum redone.
fn ttl_255(frame: &mut [u8]) {
    frame[22] = 255;
    frame[24..26].fill(0);
    let c = checksum::finish(checksum::sum(&frame[14..34]));
    frame[24..26].copy_from_slice(&c.to_be_bytes());
}

/// An IPv4 packet of protocol 89 (OSPF) from `src` to `dst`, 20 bytes of payload.
fn ospf(buf: &mut [u8], src: Ipv4Addr, dst: Ipv4Addr) -> usize {
    buf[0..6].copy_from_slice(&LB_MAC);
    buf[6..12].copy_from_slice(&PEER_MAC);
    buf[12..14].copy_from_slice(&[0x08, 0x00]);
    let ip = &mut buf[14..34];
    ip.copy_from_slice(&[
        0x45, 0, 0, 40, 0, 1, 0x40, 0, 1, 89, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ]);
    ip[12..16].copy_from_slice(&src.octets());
    ip[16..20].copy_from_slice(&dst.octets());
    let c = checksum::finish(checksum::sum(ip));
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    buf[34..54].fill(0);
    60
}

/// Stops the worker on lcore 1 and waits for it, when dropped.
struct StopOnDrop(Arc<std::sync::atomic::AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
        let _ = wait_lcore(1);
    }
}

/// A link's two rings: four bursts of 24 general and 8 control frames each into a
/// general ring of 63 slots that nobody empties meanwhile (a flood the management
/// core has not written out yet) and a control ring. The general ring takes what fits
/// and refuses the rest (`exception_ring_full`); every control frame reaches its own
/// ring, whose frames the management core writes first. Then a control ring of 15
/// slots that nobody empties (a stalled management core) refuses control frames as
/// `exception_control_ring_full`, and only as that.
fn rings_apart(pool: &Mempool) {
    use sluice::dataplane::counters::WorkerCounters;
    use sluice::dataplane::exception::Punt;
    let (general, general_out) = PacketRing::multi_producer("exc_flood", 64).unwrap();
    let (control, control_out) = PacketRing::multi_producer("exc_flood_c", 256).unwrap();
    // A rate whose bucket (a twentieth of it) holds every general frame.
    let mut link = ExceptionLink::new(
        PuntRings { general, control },
        100_000,
        1,
        sluice::dpdk::tsc_hz(),
    );
    let counters = WorkerCounters::default();
    for _ in 0..4 {
        let mut rx = Burst::new();
        assert!(rx.alloc_from(pool, 32));
        for i in 0..32 {
            rx.set_packet_len(i, 64);
            let punt = if i % 4 == 0 {
                Punt::Control
            } else {
                Punt::General
            };
            link.take(&mut rx, i, punt, sluice::dpdk::tsc()).unwrap();
        }
        rx.free_all();
        link.flush(&counters);
    }
    let count = |ring: &sluice::dpdk::RingConsumer| {
        let mut n = 0;
        loop {
            let mut got = Burst::new();
            let k = ring.dequeue(&mut got);
            got.free_all();
            if k == 0 {
                return n;
            }
            n += k;
        }
    };
    assert_eq!(count(&general_out), 63, "the general ring's room");
    assert_eq!(
        count(&control_out),
        32,
        "every control frame, on its own ring"
    );
    assert_eq!(
        counters.drops_snapshot()[DropReason::ExceptionRingFull as usize],
        96 - 63
    );
    assert_eq!(
        counters.events_snapshot()[Event::ExceptionPuntedControl as usize],
        32
    );
    assert_eq!(
        counters.drops_snapshot()[DropReason::ExceptionControlRingFull as usize],
        0
    );

    let (general, _general_out) = PacketRing::multi_producer("exc_stall", 64).unwrap();
    let (control, control_out) = PacketRing::multi_producer("exc_stall_c", 16).unwrap();
    let mut link = ExceptionLink::new(
        PuntRings { general, control },
        100_000,
        1,
        sluice::dpdk::tsc_hz(),
    );
    let counters = WorkerCounters::default();
    let mut rx = Burst::new();
    assert!(rx.alloc_from(pool, 32));
    for i in 0..32 {
        rx.set_packet_len(i, 64);
        link.take(&mut rx, i, Punt::Control, sluice::dpdk::tsc())
            .unwrap();
    }
    link.flush(&counters);
    assert_eq!(count(&control_out), 15, "the stalled control ring's room");
    let drops = counters.drops_snapshot();
    assert_eq!(
        drops[DropReason::ExceptionControlRingFull as usize],
        32 - 15
    );
    assert_eq!(drops[DropReason::ExceptionRingFull as usize], 0);
}

#[test]
fn the_worker_hands_the_kernel_its_own_traffic_and_nothing_else() {
    let eal = Eal::init(&eal_args("eal_exception"))
        .expect("EAL init (run scripts/setup.sh; tests need root)");
    let pool = Arc::new(Mempool::new("exc_pool", 4095, 64, 2048).unwrap());
    let pair = RingPortPair::new("x", 1, 256).unwrap();
    let (mut lb, mut peer) = ring_ports(pair, &pool);

    let ip = |s: &str| -> Ipv4Addr { s.parse().unwrap() };
    let ip6 = |s: &str| -> Ipv6Addr { s.parse().unwrap() };
    let (lb_ip, peer_ip, vip) = (ip("198.18.0.1"), ip("198.18.0.50"), ip("198.18.1.1"));
    let lb_ip6 = ip6("2001:db8::1");
    let mut table = ServiceTable::new();
    let key = ServiceKey::new(Protocol::Tcp, vip, 80);
    table.add_service(key, SchedulerKind::Rr, None).unwrap();
    table
        .add_server(
            key,
            RealServerSpec::new(ip("198.18.0.11"), 80, 1, ForwardMode::Dr),
        )
        .unwrap();
    let publisher = SnapshotPublisher::new(Snapshot::build(1, &table));
    let (general, kernel) = PacketRing::multi_producer("exc_ring", 256).unwrap();
    let (control, kernel_control) = PacketRing::multi_producer("exc_ring_c", 256).unwrap();
    let rings = PuntRings { general, control };
    let link = ExceptionLink::new(rings, RATE, 1, sluice::dpdk::tsc_hz());
    let (worker, counters, stop) = worker_with(
        "eal_exception",
        &mut lb,
        (lb_ip, &[lb_ip6]),
        &pool,
        &publisher,
        Some(link),
    );
    launch_on_lcore(1, move || worker.run()).unwrap();
    // Should an assertion fail, the worker stops before the ports drop under it.
    let _stop_first = StopOnDrop(stop.clone());
    let (mut prx, mut ptx) = peer.take_queues().unwrap().pop().unwrap();

    // Sends one frame, waits for the worker to have handled it (its rx count), and
    // returns (frames the peer got back, frames handed to the kernel).
    let mut handled = 0u64;
    let mut send = |build: &dyn Fn(&mut [u8]) -> usize| -> (usize, usize) {
        let mut out = Burst::new();
        assert!(out.alloc_from(&pool, 1));
        out.set_packet_len(0, frames::MAX_FRAME as u16);
        let len = build(out.packet_mut(0));
        out.set_packet_len(0, len as u16);
        assert_eq!(ptx.tx(&mut out), 1);
        handled += 1;
        let deadline = Instant::now() + Duration::from_secs(5);
        while counters.rx_packets.load(Ordering::Relaxed) < handled {
            assert!(
                Instant::now() < deadline,
                "the worker did not take frame {handled}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        // One more poll's time for its transmission and the ring.
        std::thread::sleep(Duration::from_millis(20));
        // Sluice's own ARP requests (for the real server) are not answers.
        let mut back = Burst::new();
        prx.rx(&mut back);
        let replies = (0..back.len())
            .filter(|&i| {
                let f = back.packet(i);
                !(f[12..14] == [0x08, 0x06] && f[20..22] == [0, 1])
            })
            .count();
        back.free_all();
        let mut up = Burst::new();
        let n = kernel.dequeue(&mut up) + kernel_control.dequeue(&mut up);
        up.free_all();
        (replies, n)
    };
    let e = |sport: u16, dst: Ipv4Addr, dport: u16, dst_mac: [u8; 6]| Endpoints {
        src_mac: PEER_MAC,
        dst_mac,
        src: peer_ip,
        dst,
        sport,
        dport,
    };

    // ARP: a request is Sluice's to answer; a reply to our MAC is learned and goes up;
    // a broadcast one does not.
    assert_eq!(
        send(&|b| frames::arp_request(b, PEER_MAC, peer_ip, lb_ip)),
        (1, 0)
    );
    let learned = counters.events_snapshot()[Event::NeighbourLearned as usize];
    assert_eq!(
        send(&|b| frames::arp_reply(b, OTHER_MAC, ip("198.18.0.60"), LB_MAC, lb_ip)),
        (0, 1)
    );
    assert_eq!(
        counters.events_snapshot()[Event::NeighbourLearned as usize],
        learned + 1
    );
    assert_eq!(
        send(&|b| {
            let n = frames::arp_reply(b, OTHER_MAC, ip("198.18.0.61"), LB_MAC, lb_ip);
            b[0..6].fill(0xff);
            n
        }),
        (0, 0)
    );

    // IPv4 to the port's address: BGP, BFD, OSPF up; ping answered, its reply up.
    let syn = |sport, dst, dport, mac| {
        move |b: &mut [u8]| frames::tcp_segment(b, &e(sport, dst, dport, mac), 1, 0, SYN, &[])
    };
    assert_eq!(send(&syn(40000, lb_ip, 179, LB_MAC)), (0, 1));
    assert_eq!(
        send(&|b| frames::udp_datagram(b, &e(49152, lb_ip, 3784, LB_MAC), b"bfd")),
        (0, 1)
    );
    assert_eq!(send(&|b| ospf(b, peer_ip, lb_ip)), (0, 1));
    assert_eq!(
        send(&|b| frames::echo_request(b, PEER_MAC, LB_MAC, peer_ip, lb_ip, 1, 1, 0)),
        (1, 0)
    );
    assert_eq!(
        send(&|b| {
            let n = frames::echo_request(b, PEER_MAC, LB_MAC, peer_ip, lb_ip, 1, 2, 0);
            // An echo reply: type 0, the checksum moved by the type's difference.
            b[34] = 0;
            let c = u16::from_be_bytes([b[36], b[37]]);
            let (sum, carry) = c.overflowing_add(0x0800);
            b[36..38].copy_from_slice(&(sum + u16::from(carry)).to_be_bytes());
            n
        }),
        (0, 1)
    );
    // Not the kernel's: a VIP port without a service, the port's address to another
    // station's MAC.
    assert_eq!(send(&syn(40001, vip, 22, LB_MAC)), (0, 0));
    assert_eq!(send(&syn(40002, lb_ip, 179, OTHER_MAC)), (0, 0));

    // IPv6: to the port's address and a link-local one up, to another not.
    let from6 = ip6("2001:db8::50");
    assert_eq!(send(&|b| syn6(b, from6, lb_ip6)), (0, 1));
    assert_eq!(send(&|b| syn6(b, ip6("fe80::50"), ip6("fe80::1"))), (0, 1));
    assert_eq!(send(&|b| syn6(b, from6, ip6("2001:db8::99"))), (0, 0));
    let up_so_far = counters.events_snapshot()[Event::ExceptionPunted as usize];
    assert_eq!(
        up_so_far, 7,
        "every frame above that went up was counted once"
    );

    // Sends `n` frames built by `build(k, frame)` at once, waits until the worker has
    // handled them all, and returns (frames handed to the kernel, when the worker was
    // done).
    let mut in_flight = handled;
    // Returns the frames that went up (the general and the control ring's), those of
    // them on the control ring, and when the worker was done.
    let mut burst =
        |n: usize, build: &dyn Fn(usize, &mut [u8]) -> usize| -> (usize, usize, Instant) {
            let mut out = Burst::new();
            let (mut sent, mut up, mut up_control) = (0, 0, 0);
            let take = |up: &mut usize, up_control: &mut usize| {
                let mut got = Burst::new();
                *up += kernel.dequeue(&mut got);
                got.free_all();
                *up_control += kernel_control.dequeue(&mut got);
                got.free_all();
            };
            while sent < n {
                let room = (n - sent).min(16);
                assert!(out.alloc_from(&pool, room));
                for i in 0..room {
                    out.set_packet_len(i, frames::MAX_FRAME as u16);
                    let len = build(sent + i, out.packet_mut(i));
                    out.set_packet_len(i, len as u16);
                }
                sent += ptx.tx(&mut out);
                out.free_all();
                take(&mut up, &mut up_control);
            }
            in_flight += n as u64;
            let deadline = Instant::now() + Duration::from_secs(5);
            while counters.rx_packets.load(Ordering::Relaxed) < in_flight {
                assert!(
                    Instant::now() < deadline,
                    "the worker did not take the burst"
                );
                std::thread::sleep(Duration::from_millis(1));
            }
            let done = Instant::now();
            std::thread::sleep(Duration::from_millis(20));
            take(&mut up, &mut up_control);
            (up + up_control, up_control, done)
        };

    // The rate: 100 datagrams at once at 50/s pass the bucket's worth, and what the
    // rate refills while they go through (measured, so a slow machine cannot fail it).
    let refilled =
        |since: Instant| (since.elapsed().as_millis() as u64 * u64::from(RATE)).div_ceil(1000) + 1;
    let burst_start = Instant::now();
    // From when the worker is done, the general bucket is spent (refilling at RATE).
    let (up, _, general_spent) = burst(100, &|k, b| {
        frames::udp_datagram(b, &e(50000 + k as u16, lb_ip, 3784, LB_MAC), b"x")
    });
    let limited = counters.drops_snapshot()[DropReason::ExceptionRateLimited as usize];
    // The bucket, plus what the rate refilled while the burst went through (1 per
    // 20 ms at 50/s).
    let refill = refilled(burst_start);
    assert!(
        (BUCKET..=BUCKET + refill).contains(&(up as u64)),
        "{up} of 100 went up at {RATE}/s (bucket {BUCKET}, refill {refill})"
    );
    assert_eq!(up as u64 + limited, 100, "{up} up, {limited} rate-limited");
    assert_eq!(
        counters.drops_snapshot()[DropReason::ExceptionRingFull as usize],
        0
    );

    // The control budget: 30 BFD datagrams and 30 SSH SYNs at once, all with TTL 255,
    // the rate's bucket still spent: every BFD one goes up, on the control budget;
    // the SYNs get no priority, the rate's refill at most.
    let control0 = counters.events_snapshot()[Event::ExceptionPuntedControl as usize];
    let limited0 = counters.drops_snapshot()[DropReason::ExceptionRateLimited as usize];
    let (up, up_control, _) = burst(60, &|k, b| {
        let len = if k % 2 == 0 {
            frames::udp_datagram(b, &e(50000 + k as u16, lb_ip, 3784, LB_MAC), b"bfd")
        } else {
            frames::tcp_segment(b, &e(50000 + k as u16, lb_ip, 22, LB_MAC), 1, 0, SYN, &[])
        };
        ttl_255(b);
        len
    });
    let control = counters.events_snapshot()[Event::ExceptionPuntedControl as usize] - control0;
    let limited = counters.drops_snapshot()[DropReason::ExceptionRateLimited as usize] - limited0;
    assert_eq!(control, 30, "the BFD datagrams, on the control budget");
    assert_eq!(
        up_control, 30,
        "the BFD datagrams on the control ring, the SYNs on the general one"
    );
    let refill = refilled(general_spent);
    assert!(
        (30..=30 + refill as usize).contains(&up) && up as u64 + limited == 60,
        "{up} up ({control} control, refill {refill}), {limited} rate-limited"
    );

    rings_apart(&pool);

    stop.store(true, Ordering::SeqCst);
    assert_eq!(wait_lcore(1).unwrap(), 0);
    let _ = (prx, ptx);
    drop(_stop_first);
    drop(kernel);
    drop(kernel_control);
    assert_eq!(pool.in_use(), 0, "mbufs leaked");
    drop(lb);
    drop(peer);
    drop(pool);
    drop(eal);
}
