//! `Forwarder::handle_burst` against `Forwarder::handle` one packet at a time: two
//! forwarders over the same services get the same random bursts of real DPDK mbufs
//! (new connections, retransmitted SYNs, data, FINs, RSTs, port reuse, replies from
//! the real servers, a NAT reply key two VIPs want at once, FullNAT UDP, DR), one
//! through each. Every packet must leave with the same action and the same bytes,
//! and the tables and counters must end the same; only the order in which the
//! actions are handed on may differ (parked new sessions last). Then two bursts
//! whose order is known show that parking happens at all, and session sync is
//! checked to hear of each session as its packet left it.
//! One test function only: the EAL initialises once per process.
mod common;

use common::eal::eal_args;
use sluice::dataplane::counters::WorkerCounters;
use sluice::dataplane::forwarder::{
    Action, Forwarder, ForwarderConfig, PortContext, RssView, SyncLink,
};
use sluice::dataplane::local::LocalResponder;
use sluice::dataplane::neighbour::NeighbourTable;
use sluice::dataplane::realserver_stats::{self, RealServerCounters};
use sluice::dataplane::sync_events::{EventKind, EventRing, SyncPolicy};
use sluice::dpdk::{Burst, Eal, Mempool, BURST_SIZE};
use sluice::emulator::frames::{self, Endpoints};
use sluice::model::{DropReason, ForwardMode, Protocol, RealServerSpec, SchedulerKind, ServiceKey};
use sluice::service::{ServiceTable, Snapshot, SnapshotPublisher};
use sluice::session::Timeouts;
use sluice::wire::ethernet::MacAddr;
use std::net::Ipv4Addr;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

const LB_MAC: [u8; 6] = [0x02, 0x53, 0x4c, 0, 0, 1];
const CLIENT_MAC: [u8; 6] = [0x02, 0x43, 0x4c, 0, 0, 1];
const HZ: u64 = 1_000_000_000;
const SYN: u8 = 0x02;
const ACK: u8 = 0x10;
const FIN_ACK: u8 = 0x11;
const RST: u8 = 0x04;
const SYN_ACK: u8 = 0x12;

fn ip(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}

fn rs_mac(rs: Ipv4Addr) -> [u8; 6] {
    [0x02, 0x52, 0x53, 0, 0, rs.octets()[3]]
}

/// The services both forwarders serve:
/// - VIP1:80/tcp NAT wlc over rs1-rs3 (weights 1-3: picks depend on the loads the
///   same burst's earlier connections added);
/// - VIP2:80/tcp and VIP3:80/tcp NAT rr, both to rs4:80: the same client port to
///   both wants one reply key (`nat_tuple_in_use`, or the finished one gives way);
/// - VIP1:53/udp FullNAT rr over rs5, rs6;
/// - VIP4:80/tcp DR to rs7 (no reply key: never parked).
fn services() -> ServiceTable {
    let mut t = ServiceTable::new();
    let tcp = |vip: &str| ServiceKey::new(Protocol::Tcp, ip(vip), 80);
    let add = |t: &mut ServiceTable, key, sched, servers: &[(&str, u16, u32, ForwardMode)]| {
        t.add_service(key, sched, None).unwrap();
        for &(rs, port, weight, mode) in servers {
            t.add_server(key, RealServerSpec::new(ip(rs), port, weight, mode))
                .unwrap();
        }
    };
    use ForwardMode::*;
    add(
        &mut t,
        tcp("198.18.1.1"),
        SchedulerKind::Wlc,
        &[
            ("198.18.0.11", 80, 1, Nat),
            ("198.18.0.12", 80, 2, Nat),
            ("198.18.0.13", 80, 3, Nat),
        ],
    );
    for vip in ["198.18.1.2", "198.18.1.3"] {
        add(
            &mut t,
            tcp(vip),
            SchedulerKind::Rr,
            &[("198.18.0.14", 80, 1, Nat)],
        );
    }
    let dns = ServiceKey::new(Protocol::Udp, ip("198.18.1.1"), 53);
    add(
        &mut t,
        dns,
        SchedulerKind::Rr,
        &[
            ("198.18.0.15", 53, 1, FullNat),
            ("198.18.0.16", 53, 1, FullNat),
        ],
    );
    t.add_laddr(dns, ip("198.18.2.1").into()).unwrap();
    add(
        &mut t,
        tcp("198.18.1.4"),
        SchedulerKind::Rr,
        &[("198.18.0.17", 80, 1, Dr)],
    );
    t
}

/// One forwarder with its own counters and neighbours (every real server known).
struct Side {
    fwd: Forwarder,
    counters: WorkerCounters,
    real_servers: Arc<Box<[RealServerCounters]>>,
    neighbours: NeighbourTable,
}

fn side(publisher: &SnapshotPublisher) -> Side {
    side_with_sync(publisher, None)
}

/// [`side`], its forwarder telling session sync through `sync`.
fn side_with_sync(publisher: &SnapshotPublisher, sync: Option<SyncLink>) -> Side {
    let real_servers = Arc::new(realserver_stats::new_table());
    // A small table, which would not park by default: parking forced.
    let fwd = Forwarder::new(ForwarderConfig {
        park_new_sessions: Some(true),
        sync,
        ..ForwarderConfig::new(
            4096,
            publisher.reader(),
            Timeouts::default().in_ticks(100),
            HZ / 100,
            HZ,
            real_servers.clone(),
            RssView::default_spread(1, 0),
        )
    });
    let mut neighbours = NeighbourTable::with_capacity(64);
    for last in 11..=17u8 {
        let rs = Ipv4Addr::new(198, 18, 0, last);
        neighbours.learn(rs, MacAddr(rs_mac(rs)), 0);
    }
    neighbours.learn(ip("198.18.0.100"), MacAddr(CLIENT_MAC), 0);
    Side {
        fwd,
        counters: WorkerCounters::default(),
        real_servers,
        neighbours,
    }
}

/// xorshift64: the bursts are the same on every run.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[(self.next() % from.len() as u64) as usize]
    }
}

/// Writes a random frame into `buf`: mostly client segments to the services from a
/// few client ports (so connections repeat, collide and reuse ports within a burst),
/// some replies from the NAT real servers to those ports, and a few frames no session
/// takes (ARP, malformed frames, segments to another MAC or a group, or from one).
fn random_frame(rng: &mut Rng, buf: &mut [u8]) -> usize {
    let client = rng.pick(&[ip("198.18.0.100"), ip("198.18.0.101")]);
    let cport = 1000 + (rng.next() % 6) as u16;
    let flags = rng.pick(&[SYN, SYN, SYN, ACK, ACK, FIN_ACK, RST]);
    let to = |dst: Ipv4Addr, dport: u16| Endpoints {
        src_mac: CLIENT_MAC,
        dst_mac: LB_MAC,
        src: client,
        dst,
        sport: cport,
        dport,
    };
    match rng.next() % 10 {
        // What is not a session's: an ARP request for the port's address, a
        // malformed or unwanted frame (classify refuses most), a segment to
        // another host's MAC, to the broadcast or an IPv6 group MAC (parsed, then
        // refused) or the VRRP group's, or from a group MAC.
        9 => match rng.next() % 6 {
            0 => frames::arp_request(buf, CLIENT_MAC, client, ip("198.18.0.1")),
            1 => {
                let kind = rng.pick(&frames::Garbage::ALL);
                frames::garbage(buf, kind, CLIENT_MAC, LB_MAC, client, ip("198.18.1.1"))
            }
            2 => {
                let other = Endpoints {
                    src_mac: [0x03, 0xc1, 0, 0, 0, 1],
                    ..to(ip("198.18.1.1"), 80)
                };
                frames::tcp_segment(buf, &other, 1, 0, flags, &[])
            }
            3 => {
                let other = Endpoints {
                    dst_mac: rng.pick(&[
                        [0xff; 6],
                        [0x33, 0x33, 0, 0, 0, 1],
                        [0x01, 0x00, 0x5e, 0, 0, 0x12],
                    ]),
                    ..to(ip("198.18.1.1"), 80)
                };
                frames::tcp_segment(buf, &other, 1, 0, flags, &[])
            }
            _ => {
                let other = Endpoints {
                    dst_mac: [0x02, 0x4f, 0x54, 0, 0, 1],
                    ..to(ip("198.18.1.1"), 80)
                };
                frames::tcp_segment(buf, &other, 1, 0, flags, &[])
            }
        },
        0 | 1 => frames::tcp_segment(buf, &to(ip("198.18.1.1"), 80), 1, 0, flags, &[]),
        2 => frames::tcp_segment(buf, &to(ip("198.18.1.2"), 80), 1, 0, flags, &[]),
        3 => frames::tcp_segment(buf, &to(ip("198.18.1.3"), 80), 1, 0, flags, &[]),
        4 => frames::tcp_segment(buf, &to(ip("198.18.1.4"), 80), 1, 0, flags, &[]),
        5 => frames::udp_datagram(buf, &to(ip("198.18.1.1"), 53), b"q"),
        6 => {
            // A host unreachable from a NAT real server's side about the client's
            // segment to it (parked or not, in this burst or an earlier one).
            let rs = rng.pick(&[ip("198.18.0.11"), ip("198.18.0.14")]);
            icmp_error_about(buf, rs, client, cport, rs, 80)
        }
        _ => {
            // A NAT real server answers the client's port.
            let rs = rng.pick(&[
                ip("198.18.0.11"),
                ip("198.18.0.12"),
                ip("198.18.0.13"),
                ip("198.18.0.14"),
            ]);
            let flags = rng.pick(&[SYN_ACK, ACK, FIN_ACK]);
            let e = Endpoints {
                src_mac: rs_mac(rs),
                dst_mac: LB_MAC,
                src: rs,
                dst: client,
                sport: 80,
                dport: cport,
            };
            frames::tcp_segment(buf, &e, 9, 2, flags, &[])
        }
    }
}

/// An ICMP host unreachable from `from` (its MAC a real server's) to `client`,
/// quoting the client's TCP segment `client:cport -> dst:dport`. Returns its length.
fn icmp_error_about(
    buf: &mut [u8],
    from: Ipv4Addr,
    client: Ipv4Addr,
    cport: u16,
    dst: Ipv4Addr,
    dport: u16,
) -> usize {
    let mut quoted = [0u8; frames::MAX_FRAME];
    let e = Endpoints {
        src_mac: CLIENT_MAC,
        dst_mac: rs_mac(dst),
        src: client,
        dst,
        sport: cport,
        dport,
    };
    frames::tcp_segment(&mut quoted, &e, 1, 0, SYN, &[]);
    // Its IPv4 header and 8 bytes of TCP.
    frames::icmp_error(
        buf,
        rs_mac(from),
        LB_MAC,
        from,
        client,
        3,
        1,
        &quoted[14..14 + 28],
    )
}

/// A burst of `frames` (written by `write`), allocated from `pool`.
fn burst_of(pool: &Mempool, lens: &[Vec<u8>]) -> Burst {
    let mut b = Burst::new();
    assert!(b.alloc_from(pool, lens.len()), "mempool exhausted");
    for (i, f) in lens.iter().enumerate() {
        b.set_packet_len(i, frames::MAX_FRAME as u16);
        b.packet_mut(i)[..f.len()].copy_from_slice(f);
        b.set_packet_len(i, f.len() as u16);
    }
    b
}

/// What happened to each packet of a burst: its action and its bytes afterwards, and
/// the order in which the actions were handed on.
struct Outcome {
    actions: Vec<Action>,
    bytes: Vec<Vec<u8>>,
    order: Vec<usize>,
}

fn one_by_one(s: &mut Side, port: &PortContext, pool: &Mempool, f: &[Vec<u8>]) -> Outcome {
    let mut b = burst_of(pool, f);
    s.fwd.prefetch_sessions(&b);
    let actions = (0..b.len())
        .map(|i| {
            s.fwd
                .handle(b.packet_at(i), port, &mut s.neighbours, 0, &s.counters)
        })
        .collect();
    let bytes = (0..b.len()).map(|i| b.packet(i).to_vec()).collect();
    b.free_all();
    Outcome {
        actions,
        bytes,
        order: (0..f.len()).collect(),
    }
}

fn as_burst(s: &mut Side, port: &PortContext, pool: &Mempool, f: &[Vec<u8>]) -> Outcome {
    let mut b = burst_of(pool, f);
    let mut actions = vec![None; f.len()];
    let mut order = Vec::new();
    // Connections are a counter (Prometheus `_total`): never lower than before, even
    // while a session that will be refused is parked.
    let real_servers = s.real_servers.clone();
    let connections = |c: &RealServerCounters| c.connections.load(Relaxed);
    let mut seen: Vec<u64> = real_servers.iter().map(connections).collect();
    s.fwd.handle_burst(
        &mut b,
        port,
        &mut s.neighbours,
        0,
        &s.counters,
        |_, _, i, a| {
            assert!(actions[i].is_none(), "packet {i} handed on twice");
            actions[i] = Some(a);
            order.push(i);
            for (c, seen) in real_servers.iter().zip(seen.iter_mut()) {
                assert!(connections(c) >= *seen, "a connection count went down");
                *seen = connections(c);
            }
        },
    );
    let bytes = (0..b.len()).map(|i| b.packet(i).to_vec()).collect();
    b.free_all();
    Outcome {
        actions: actions
            .into_iter()
            .enumerate()
            .map(|(i, a)| a.unwrap_or_else(|| panic!("packet {i} never handed on")))
            .collect(),
        bytes,
        order,
    }
}

/// Each real server's (connections, active, inactive, in packets, out packets).
fn books(s: &Side) -> Vec<[u64; 5]> {
    s.real_servers[..32]
        .iter()
        .map(|c| {
            [
                c.connections.load(Relaxed),
                c.active.load(Relaxed),
                c.inactive.load(Relaxed),
                c.in_packets.load(Relaxed),
                c.out_packets.load(Relaxed),
            ]
        })
        .collect()
}

fn frame(write: impl FnOnce(&mut [u8]) -> usize) -> Vec<u8> {
    let mut buf = vec![0u8; frames::MAX_FRAME];
    let len = write(&mut buf);
    buf.truncate(len);
    buf
}

/// One EAL per process: every check over real mbufs runs from this one test.
#[test]
fn forwarding_over_real_mbufs() {
    let _eal = Eal::init(&eal_args("eal_burst"))
        .expect("EAL init (run scripts/setup.sh; tests need root)");
    let pool = Mempool::new("burst_pool", 1023, 64, 2048).unwrap();
    let publisher = SnapshotPublisher::new(Snapshot::build(1, &services()));
    let responder = LocalResponder::new(LB_MAC, &[(ip("198.18.0.1"), 24)]);
    let port = PortContext {
        redirected: false,
        responder: &responder,
        index: 0,
        mac: MacAddr(LB_MAC),
        addr: ip("198.18.0.1"),
        mtu: 1500,
        exception: false,
    };
    a_burst_decides_every_packet_as_one_by_one_handling_does(&pool, &publisher, &port);
    nat_replies_follow_the_client_sides_latest_next_hop(&pool, &publisher, &port);
    a_dr_session_follows_its_real_servers_mac_and_keeps_the_last_one(&pool, &publisher, &port);
    sync_events_carry_what_the_packet_moved_the_session_to(&pool, &publisher, &port);
    assert_eq!(pool.in_use(), 0, "mbufs leaked");
}

/// Session sync hears of a session as its packet left it: the standby installs what
/// the event carries. A NAT connection's handshake-completing ACK is its first sync,
/// in ESTABLISHED (its SYN, in SYN_RECV, is not synced), and its FIN a state change;
/// each event carries the state the session is in after the packet. A UDP flow is
/// synced first on its third datagram (the policy's threshold), not before. Run one
/// packet at a time and as bursts of one.
fn sync_events_carry_what_the_packet_moved_the_session_to(
    pool: &Mempool,
    publisher: &SnapshotPublisher,
    port: &PortContext,
) {
    for batched in [false, true] {
        let rings = Arc::new(vec![EventRing::with_capacity(64)]);
        let link = SyncLink {
            rings: rings.clone(),
            index: 0,
            policy: SyncPolicy::default(),
        };
        let mut s = side_with_sync(publisher, Some(link));
        s.fwd.poll(0, &s.counters);
        let run = |s: &mut Side, f: Vec<u8>| {
            let out = if batched {
                as_burst(s, port, pool, &[f])
            } else {
                one_by_one(s, port, pool, &[f])
            };
            assert_eq!(out.actions, [Action::Transmit], "batched {batched}");
        };
        // The events since the last call, each with the state it carries and the
        // state its session is in now.
        let events = |s: &Side| {
            let mut got = Vec::new();
            rings[0].drain(64, |e| {
                let live = s
                    .fwd
                    .sessions()
                    .iter()
                    .find(|(_, l)| l.client_port == e.record.client.port())
                    .map(|(_, l)| l.state());
                got.push((e.kind, e.record.state, live));
            });
            got
        };
        let client = Endpoints {
            src_mac: CLIENT_MAC,
            dst_mac: LB_MAC,
            src: ip("203.0.113.9"),
            dst: ip("198.18.1.2"),
            sport: 3002,
            dport: 80,
        };
        let server = Endpoints {
            src_mac: rs_mac(ip("198.18.0.14")),
            dst_mac: LB_MAC,
            src: ip("198.18.0.14"),
            dst: client.src,
            sport: 80,
            dport: client.sport,
        };
        let tcp = |e: &Endpoints, seq: u32, ack: u32, flags: u8| {
            frame(|b| frames::tcp_segment(b, e, seq, ack, flags, &[]))
        };
        run(&mut s, tcp(&client, 1, 0, SYN));
        assert_eq!(events(&s), [], "SYN_RECV is not synced");
        run(&mut s, tcp(&server, 100, 2, SYN_ACK));
        assert_eq!(events(&s), []);
        run(&mut s, tcp(&client, 2, 101, ACK));
        let established = sluice::session::TcpState::Established;
        assert_eq!(
            events(&s),
            [(EventKind::Created, established, Some(established))],
            "batched {batched}"
        );
        run(&mut s, tcp(&client, 2, 101, FIN_ACK));
        let got = events(&s);
        assert!(
            matches!(got[..], [(EventKind::StateChanged, carried, Some(live))]
                if carried == live && carried != established),
            "the FIN's event carries the state it moved to (batched {batched}): {got:?}"
        );
        // UDP, FullNAT: the third datagram is the first synced.
        let dns = Endpoints {
            dport: 53,
            dst: ip("198.18.1.1"),
            ..client
        };
        for n in 1..=3 {
            run(&mut s, frame(|b| frames::udp_datagram(b, &dns, b"q")));
            let got = events(&s);
            let kinds: Vec<EventKind> = got.iter().map(|e| e.0).collect();
            let want: &[EventKind] = if n < 3 { &[] } else { &[EventKind::Created] };
            assert_eq!(kinds, want, "datagram {n} (batched {batched})");
        }
    }
}

/// A DR connection whose real server moves to another MAC (a NIC swapped, a VM
/// migrated): its next packet goes to the MAC the neighbour table learned, and once
/// the table has no entry for the server at all (a removed server's entry gave its
/// slot to another), to the MAC it last went to.
fn a_dr_session_follows_its_real_servers_mac_and_keeps_the_last_one(
    pool: &Mempool,
    publisher: &SnapshotPublisher,
    port: &PortContext,
) {
    const MOVED: [u8; 6] = [0x02, 0x52, 0x53, 1, 0, 17];
    let mut s = side(publisher);
    s.fwd.poll(0, &s.counters);
    let rs = ip("198.18.0.17");
    let e = Endpoints {
        src_mac: CLIENT_MAC,
        dst_mac: LB_MAC,
        src: ip("203.0.113.9"),
        dst: ip("198.18.1.4"),
        sport: 3001,
        dport: 80,
    };
    let mut seq = 0;
    let mut send = |s: &mut Side, flags: u8| {
        seq += 1;
        let f = frame(|b| frames::tcp_segment(b, &e, seq, 1, flags, &[]));
        let out = one_by_one(s, port, pool, &[f]);
        assert_eq!(out.actions, [Action::Transmit]);
        <[u8; 6]>::try_from(&out.bytes[0][0..6]).unwrap()
    };
    assert_eq!(send(&mut s, SYN), rs_mac(rs), "to the MAC it has at first");
    s.neighbours.learn(rs, MacAddr(MOVED), 1);
    assert_eq!(send(&mut s, ACK), MOVED, "after the real server moved");
    assert!(s.neighbours.remove(rs).is_some());
    assert_eq!(
        send(&mut s, ACK),
        MOVED,
        "no entry: the MAC it last went to"
    );
}

/// A NAT (TCP) and a FullNAT (UDP) connection whose client side moves to another router (an
/// upstream failover or ECMP change without a shared MAC): the real server's replies
/// go to the MAC the client's packets came from last, not to the first one.
fn nat_replies_follow_the_client_sides_latest_next_hop(
    pool: &Mempool,
    publisher: &SnapshotPublisher,
    port: &PortContext,
) {
    const ROUTER_A: [u8; 6] = [0x02, 0x52, 0x54, 0, 0, 0xa];
    const ROUTER_B: [u8; 6] = [0x02, 0x52, 0x54, 0, 0, 0xb];
    let mut s = side(publisher);
    s.fwd.poll(0, &s.counters);
    let client = ip("203.0.113.9");
    for (proto, vip, vport) in [
        (Protocol::Tcp, "198.18.1.1", 80),
        (Protocol::Udp, "198.18.1.1", 53),
    ] {
        let from = |mac: [u8; 6]| Endpoints {
            src_mac: mac,
            dst_mac: LB_MAC,
            src: client,
            dst: ip(vip),
            sport: 3000,
            dport: vport,
        };
        let send = |s: &mut Side, f: Vec<u8>| {
            let out = one_by_one(s, port, pool, &[f]);
            assert_eq!(out.actions, [Action::Transmit], "{proto:?}");
            out.bytes[0].clone()
        };
        let open = match proto {
            Protocol::Tcp => frame(|b| frames::tcp_segment(b, &from(ROUTER_A), 1, 0, SYN, &[])),
            Protocol::Udp => frame(|b| frames::udp_datagram(b, &from(ROUTER_A), b"q")),
        };
        let forwarded = send(&mut s, open);
        // The real server's answer to what it got, from its own MAC to ours.
        let answer = |forwarded: &[u8]| {
            let seg = match frames::parse(forwarded) {
                frames::Frame::Tcp(seg) | frames::Frame::Udp(seg) => seg,
                other => panic!("{proto:?}: forwarded {other:?}"),
            };
            let e = Endpoints {
                src_mac: rs_mac(seg.e.dst),
                dst_mac: LB_MAC,
                src: seg.e.dst,
                dst: seg.e.src,
                sport: seg.e.dport,
                dport: seg.e.sport,
            };
            match proto {
                Protocol::Tcp => frame(|b| frames::tcp_segment(b, &e, 50, 2, SYN_ACK, &[])),
                Protocol::Udp => frame(|b| frames::udp_datagram(b, &e, b"a")),
            }
        };
        let reply_mac = |bytes: &[u8]| -> [u8; 6] { bytes[0..6].try_into().unwrap() };
        let reply = send(&mut s, answer(&forwarded));
        assert_eq!(reply_mac(&reply), ROUTER_A, "{proto:?}: before the move");
        // The client's next packet comes through router B.
        let next = match proto {
            Protocol::Tcp => frame(|b| frames::tcp_segment(b, &from(ROUTER_B), 2, 51, ACK, &[])),
            Protocol::Udp => frame(|b| frames::udp_datagram(b, &from(ROUTER_B), b"q")),
        };
        let forwarded = send(&mut s, next);
        let reply = send(&mut s, answer(&forwarded));
        assert_eq!(reply_mac(&reply), ROUTER_B, "{proto:?}: after the move");
    }
}

fn a_burst_decides_every_packet_as_one_by_one_handling_does(
    pool: &Mempool,
    publisher: &SnapshotPublisher,
    port: &PortContext,
) {
    let (mut one, mut many) = (side(publisher), side(publisher));
    for s in [&mut one, &mut many] {
        s.fwd.poll(0, &s.counters);
    }

    let mut rng = Rng(0x5eed_1234_abcd_0001);
    let (mut reordered, mut frames_seen) = (0, 0);
    // Drops by reason, as the worker would count them from the actions.
    let mut dropped = std::collections::BTreeMap::<String, usize>::new();
    let mut icmp_sent = 0;
    for round in 0..400 {
        let n = 1 + (rng.next() % BURST_SIZE as u64) as usize;
        let f: Vec<Vec<u8>> = (0..n)
            .map(|_| frame(|b| random_frame(&mut rng, b)))
            .collect();
        let a = one_by_one(&mut one, port, pool, &f);
        let b = as_burst(&mut many, port, pool, &f);
        for (i, sent) in f.iter().enumerate() {
            assert_eq!(
                a.actions[i], b.actions[i],
                "round {round}, packet {i} of {n}: one by one {:?}, as a burst {:?}",
                a.actions[i], b.actions[i]
            );
            assert_eq!(
                a.bytes[i], b.bytes[i],
                "round {round}, packet {i}: bytes differ"
            );
            if let Action::Drop(reason) = b.actions[i] {
                *dropped.entry(format!("{reason:?}")).or_default() += 1;
            }
            // IPv4 protocol 1: an ICMP error, translated and sent.
            if b.actions[i] == Action::Transmit && sent[23] == 1 {
                icmp_sent += 1;
            }
        }
        if b.order.windows(2).any(|w| w[0] > w[1]) {
            reordered += 1;
        }
        frames_seen += n;
    }
    assert_eq!(one.fwd.sessions().len(), many.fwd.sessions().len());
    assert_eq!(books(&one), books(&many), "real-server books differ");
    assert_eq!(
        one.counters.events_snapshot(),
        many.counters.events_snapshot()
    );
    assert_eq!(
        one.counters.sessions_created.load(Relaxed),
        many.counters.sessions_created.load(Relaxed)
    );
    // The random bursts did reach the cases the test is about.
    let created = many.counters.sessions_created.load(Relaxed);
    eprintln!(
        "{frames_seen} frames, {created} sessions opened, {reordered} bursts handed on \
         out of order, {icmp_sent} ICMP errors translated, drops {dropped:?}"
    );
    assert!(created > 200, "only {created} sessions opened");
    assert!(reordered > 100, "only {reordered} bursts parked anything");
    let in_use = format!("{:?}", DropReason::NatTupleInUse);
    assert!(dropped.get(&in_use).is_some_and(|&n| n > 0), "{dropped:?}");
    // Frames the burst's passes skip (decided on their Ethernet header) and ones
    // they classify for nothing (to the broadcast or an IPv6 group).
    for reason in [DropReason::BadSourceMac, DropReason::NotOurMac] {
        let name = format!("{reason:?}");
        assert!(dropped.get(&name).is_some_and(|&n| n > 0), "{dropped:?}");
    }
    assert!(icmp_sent > 0, "no ICMP error was translated");

    // Known order: a DR SYN is handed on at once; the NAT SYN before it is parked,
    // and so is the ACK of the same connection after it, which then finds the session.
    let client = |sport: u16, dst: &str| Endpoints {
        src_mac: CLIENT_MAC,
        dst_mac: LB_MAC,
        src: ip("198.18.0.102"),
        dst: ip(dst),
        sport,
        dport: 80,
    };
    let f = vec![
        frame(|b| frames::tcp_segment(b, &client(2000, "198.18.1.1"), 1, 0, SYN, &[])),
        frame(|b| frames::tcp_segment(b, &client(2001, "198.18.1.4"), 1, 0, SYN, &[])),
        frame(|b| frames::tcp_segment(b, &client(2000, "198.18.1.1"), 2, 1, ACK, &[])),
    ];
    let before = many.counters.sessions_created.load(Relaxed);
    let out = as_burst(&mut many, port, pool, &f);
    assert_eq!(out.order, [1, 0, 2]);
    assert_eq!(out.actions, [Action::Transmit; 3]);
    assert_eq!(many.counters.sessions_created.load(Relaxed) - before, 2);
    let sent = |i: usize| match frames::parse(&out.bytes[i]) {
        frames::Frame::Tcp(s) => (s.e.dst, s.flags),
        other => panic!("packet {i}: {other:?}"),
    };
    let nat_rs = sent(0).0;
    assert!(
        [ip("198.18.0.11"), ip("198.18.0.12"), ip("198.18.0.13")].contains(&nat_rs),
        "{nat_rs}"
    );
    assert_eq!(
        sent(2),
        (nat_rs, ACK),
        "the ACK follows its SYN's real server"
    );
    assert_eq!(sent(1).0, ip("198.18.1.4"), "DR keeps the VIP");
}
