//! A real worker loop on lcore 1 over net_ring, TCP services with the SYN proxy on,
//! the test playing clients and the real server: what the proxy does with the
//! segments around the handshake with the real server (docs/SYNPROXY.md).
//!
//! - The real server answers the SYN with a bare ACK (it still holds an older
//!   connection on the tuple, in TIME_WAIT): it gets a reset at that ACK's number, the
//!   ACK goes nowhere, and the SYN sent again is answered and spliced with the
//!   server's own numbers.
//! - The real server refuses the SYN: its reset reaches the client at the number the
//!   client expects, unless it does not acknowledge the SYN.
//! - A cookie ACK that carries a FIN (with and without data) opens the connection,
//!   and the FIN reaches the server after its handshake.
//! - A valid cookie ACK whose connection cannot be placed (no real server; with
//!   `all_down = "rst"` and without) is answered with a reset to the client.
//!
//! One test function only: the EAL initialises once per process.
mod common;

use common::eal::{eal_args, ring_ports, send_frame, worker, LB_MAC};
use sluice::dataplane::counters::Event;
use sluice::dpdk::{launch_on_lcore, wait_lcore, Burst, Eal, Mempool, RingPortPair};
use sluice::emulator::frames::{self, Endpoints, Frame};
use sluice::model::{
    DropReason, ForwardMode, Protocol, RealServerSpec, SchedulerKind, ServiceKey, SynProxy,
    SynProxyMode,
};
use sluice::service::{HealthOverlay, ServiceTable, Snapshot, SnapshotPublisher};
use std::net::Ipv4Addr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

const CLIENT_MAC: [u8; 6] = [0x02, 0x43, 0x4c, 0, 0, 1];
const RS_MAC: [u8; 6] = [0x02, 0x52, 0x53, 0, 0, 1];
const FIN: u8 = 0x01;
const SYN: u8 = 0x02;
const RST: u8 = 0x04;
const PSH: u8 = 0x08;
const ACK: u8 = 0x10;
const SYN_ACK: u8 = 0x12;

fn ip(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}

/// A frame `write` writes.
fn build(write: impl Fn(&mut [u8]) -> usize) -> Vec<u8> {
    let mut buf = vec![0u8; frames::MAX_FRAME];
    let len = write(&mut buf);
    buf.truncate(len);
    buf
}

/// A TCP segment the worker sent: destination, flags, seq, ack, payload length.
type Seg = (Ipv4Addr, u8, u32, u32, usize);

#[test]
fn the_proxy_around_the_real_servers_handshake() {
    let eal = Eal::init(&eal_args("eal_synproxy"))
        .expect("EAL init (run scripts/setup.sh; tests need root)");
    let pool = Arc::new(Mempool::new("sp_pool", 4095, 64, 2048).unwrap());
    let pair = RingPortPair::new("sp", 1, 256).unwrap();
    let (mut lb, mut peer) = ring_ports(pair, &pool);

    let (lb_ip, rs, client) = (ip("198.18.0.1"), ip("198.18.0.11"), ip("198.18.0.100"));
    let (vip, vip_rst, vip_drop) = (ip("198.18.1.1"), ip("198.18.1.2"), ip("198.18.1.3"));
    let on = SynProxy {
        mode: SynProxyMode::On,
        ..Default::default()
    };
    let mut table = ServiceTable::new();
    let key = |vip| ServiceKey::new(Protocol::Tcp, vip, 80);
    for v in [vip, vip_rst, vip_drop] {
        table.add_service(key(v), SchedulerKind::Rr, None).unwrap();
        table.set_synproxy(key(v), on).unwrap();
    }
    table
        .add_server(key(vip), RealServerSpec::new(rs, 8080, 1, ForwardMode::Nat))
        .unwrap();
    // The other two services have no real server; one says `all_down = "rst"`.
    let health = HealthOverlay {
        reset_when_down: [key(vip_rst)].into_iter().collect(),
        ..HealthOverlay::default()
    };
    let publisher = SnapshotPublisher::new(Snapshot::build_with(1, &table, &health, &[]));
    let (worker, counters, stop) = worker("eal_synproxy", &mut lb, lb_ip, &pool, &publisher);
    launch_on_lcore(1, move || worker.run()).unwrap();

    let (mut prx, mut ptx) = peer.take_queues().unwrap().pop().unwrap();
    let mut send = |frame: &[u8]| send_frame(&mut ptx, &pool, frame);
    let mut segments = |wait: Duration| -> Vec<Seg> {
        let deadline = Instant::now() + wait;
        let mut got = Vec::new();
        let mut rxb = Burst::new();
        while Instant::now() < deadline {
            if prx.rx(&mut rxb) == 0 {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            got.extend(
                (0..rxb.len()).filter_map(|i| match frames::parse(rxb.packet(i)) {
                    Frame::Tcp(s) => Some((s.e.dst, s.flags, s.seq, s.ack, s.payload.len())),
                    _ => None,
                }),
            );
            rxb.free_all();
        }
        got
    };
    let from_client = |vip: Ipv4Addr, sport: u16| Endpoints {
        src_mac: CLIENT_MAC,
        dst_mac: LB_MAC,
        src: client,
        dst: vip,
        sport,
        dport: 80,
    };
    let from_server = |dport: u16| Endpoints {
        src_mac: RS_MAC,
        dst_mac: LB_MAC,
        src: rs,
        dst: client,
        sport: 8080,
        dport,
    };
    let wait = Duration::from_millis(300);
    let (isn, server_isn) = (1000u32, 90_000u32);

    // The real server and the client make themselves known.
    send(&build(|b| frames::arp_request(b, RS_MAC, rs, lb_ip)));
    send(&build(|b| {
        frames::arp_request(b, CLIENT_MAC, client, lb_ip)
    }));
    segments(wait);
    // A client's SYN to `vip` from `sport`: the cookie.
    macro_rules! cookie_for {
        ($vip:expr, $sport:expr) => {{
            send(&build(|b| {
                frames::tcp_segment(b, &from_client($vip, $sport), isn, 0, SYN, &[])
            }));
            let out = segments(wait);
            assert_eq!(out.len(), 1, "one cookie SYN-ACK: {out:?}");
            assert_eq!((out[0].0, out[0].1), (client, SYN_ACK));
            out[0].2
        }};
    }

    // The server still holds the tuple's older connection: it answers the SYN with
    // the old connection's ACK, which must not splice the new one. It gets a reset at
    // that ACK's number; the client's next segment sends the SYN again, which the
    // server answers; the client's data then reaches it with its own numbers.
    let cookie = cookie_for!(vip, 40001);
    let cookie_ack =
        build(|b| frames::tcp_segment(b, &from_client(vip, 40001), isn + 1, cookie + 1, ACK, &[]));
    send(&cookie_ack);
    assert_eq!(
        segments(wait),
        [(rs, SYN, isn, 0, 0)],
        "the SYN to the server"
    );
    send(&build(|b| {
        frames::tcp_segment(b, &from_server(40001), 7777, 0x5000_0000, ACK, &[])
    }));
    assert_eq!(
        segments(wait),
        [(rs, RST, 0x5000_0000, 0, 0)],
        "a stale ACK from the server: a reset to the server, nothing to the client"
    );
    send(&cookie_ack);
    assert_eq!(segments(wait), [(rs, SYN, isn, 0, 0)], "the SYN again");
    // A SYN-ACK for another SYN (its ack is not the SYN's ISN + 1): a reset at its
    // ack, as a client in SYN-SENT answers it; the session waits on.
    send(&build(|b| {
        frames::tcp_segment(b, &from_server(40001), 31_337, isn + 77, SYN_ACK, &[])
    }));
    assert_eq!(
        segments(wait),
        [(rs, RST, isn + 77, 0, 0)],
        "a SYN-ACK not for the pending SYN: a reset to the server"
    );
    send(&build(|b| {
        frames::tcp_segment(b, &from_server(40001), server_isn, isn + 1, SYN_ACK, &[])
    }));
    assert_eq!(
        segments(wait),
        [(rs, ACK, isn + 1, server_isn + 1, 0)],
        "the server's handshake completed"
    );
    send(&build(|b| {
        frames::tcp_segment(
            b,
            &from_client(vip, 40001),
            isn + 1,
            cookie + 1,
            PSH | ACK,
            b"GET",
        )
    }));
    assert_eq!(
        segments(wait),
        [(rs, PSH | ACK, isn + 1, server_isn + 1, 3)],
        "spliced on the server's SYN-ACK, not its stale ACK"
    );

    // The server refuses the SYN: a reset that does not acknowledge it is not about
    // this connection and goes nowhere; one that does reaches the client at the
    // number it expects.
    let cookie = cookie_for!(vip, 40002);
    send(&build(|b| {
        frames::tcp_segment(b, &from_client(vip, 40002), isn + 1, cookie + 1, ACK, &[])
    }));
    assert_eq!(segments(wait), [(rs, SYN, isn, 0, 0)]);
    send(&build(|b| {
        frames::tcp_segment(b, &from_server(40002), 0, 5, RST | ACK, &[])
    }));
    assert_eq!(segments(wait), [], "a reset not acknowledging the SYN");
    send(&build(|b| {
        frames::tcp_segment(b, &from_server(40002), 0, isn + 1, RST | ACK, &[])
    }));
    assert_eq!(
        segments(wait),
        [(client, RST | ACK, cookie + 1, isn + 1, 0)],
        "the server's refusal, at the client's numbers"
    );

    // A cookie ACK with a FIN, with and without data: the connection opens (a copy
    // of the ACK is the SYN), and the FIN reaches the server after its handshake.
    for (sport, flags, data) in [
        (40003, FIN | ACK, &b""[..]),
        (40004, FIN | PSH | ACK, b"GET / HTTP/1.0\r\n\r\n"),
    ] {
        let cookie = cookie_for!(vip, sport);
        send(&build(|b| {
            frames::tcp_segment(
                b,
                &from_client(vip, sport),
                isn + 1,
                cookie + 1,
                flags,
                data,
            )
        }));
        assert_eq!(
            segments(wait),
            [(rs, SYN, isn, 0, 0)],
            "a cookie ACK with flags {flags:#x} opens the connection"
        );
        send(&build(|b| {
            frames::tcp_segment(b, &from_server(sport), server_isn, isn + 1, SYN_ACK, &[])
        }));
        assert_eq!(
            segments(wait),
            [
                (rs, ACK, isn + 1, server_isn + 1, 0),
                (rs, flags, isn + 1, server_isn + 1, data.len())
            ],
            "the server's handshake, then the client's FIN"
        );
    }

    // A valid cookie ACK with no real server to take its connection: a reset to the
    // client at the cookie ACK's acknowledgement number, as a bare ACK and carrying
    // data, whatever `all_down` says.
    for (vip, sport, data) in [(vip_rst, 40005, &b""[..]), (vip_drop, 40006, b"GET")] {
        let cookie = cookie_for!(vip, sport);
        send(&build(|b| {
            frames::tcp_segment(b, &from_client(vip, sport), isn + 1, cookie + 1, ACK, data)
        }));
        assert_eq!(
            segments(wait),
            [(client, RST, cookie + 1, 0, 0)],
            "{vip}: the refused connection's client gets a reset"
        );
    }

    stop.store(true, Ordering::SeqCst);
    assert_eq!(wait_lcore(1).unwrap(), 0);
    let drops = counters.drops_snapshot();
    let events = counters.events_snapshot();
    assert_eq!(events[Event::SynproxyCookieSent as usize], 6);
    assert_eq!(events[Event::SynproxyCookieValid as usize], 6);
    assert_eq!(events[Event::SynproxyCookieInvalid as usize], 0);
    assert_eq!(events[Event::SynproxyStaleReset as usize], 2);
    assert_eq!(events[Event::SynproxySynResent as usize], 1);
    assert_eq!(events[Event::SynproxyConnection as usize], 3);
    assert_eq!(events[Event::SynproxyDataHeld as usize], 2);
    assert_eq!(events[Event::SynproxyDataSent as usize], 2);
    assert_eq!(events[Event::SynproxyRefused as usize], 2);
    assert_eq!(
        events[Event::AllDownReset as usize],
        1,
        "all_down = rst only"
    );
    assert_eq!(drops[DropReason::NoRealServer as usize], 2);
    assert_eq!(drops[DropReason::ResetOutOfWindow as usize], 1);
    assert_eq!(drops[DropReason::TcpNoSession as usize], 0);
    let _ = (prx, ptx);
    assert_eq!(pool.in_use(), 0, "mbufs leaked");
    drop(lb);
    drop(peer);
    drop(pool);
    drop(eal);
}
