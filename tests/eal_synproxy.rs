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
//! - The SYN timer (a service with `syn_retries = 2`, the worker's first wait
//!   shortened to 100 ms): a SYN the server does not answer goes again after the
//!   wait, the same frame byte for byte, and the server's SYN-ACK to it completes the
//!   handshake; a server that answers none gets the SYN twice more, then the client
//!   a reset at the number it expects and the server a bare reset; a server answering
//!   with an older connection's ACK gets its reset, then the SYN again at once. The
//!   services above have no retries: nothing is sent again unless the client sends.
//!
//! One test function only: the EAL initialises once per process.
mod common;

use common::eal::{eal_args, forwarder_config, ring_ports, send_frame, worker_from, LB_MAC};
use sluice::dataplane::counters::Event;
use sluice::dataplane::forwarder::ForwarderConfig;
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

/// The TCP segment in frame `f`, as a [`Seg`].
fn seg(f: &[u8]) -> Option<Seg> {
    match frames::parse(f) {
        Frame::Tcp(s) => Some((s.e.dst, s.flags, s.seq, s.ack, s.payload.len())),
        _ => None,
    }
}

/// `frame` (a TCP segment without options, as `frames::tcp_segment` writes it) with
/// TCP options `options` (a multiple of 4 bytes), its lengths and checksums redone.
fn with_options(frame: &[u8], options: &[u8]) -> Vec<u8> {
    assert_eq!(options.len() % 4, 0);
    let end = 14 + usize::from(u16::from_be_bytes([frame[16], frame[17]]));
    let mut out = frame[..54].to_vec();
    out.extend_from_slice(options);
    out.extend_from_slice(&frame[54..end]);
    let ip_len = (out.len() - 14) as u16;
    out[16..18].copy_from_slice(&ip_len.to_be_bytes());
    out[46] = (((20 + options.len()) / 4) as u8) << 4;
    let mut ip = sluice::wire::ipv4::Packet::new_unchecked(&mut out[14..34]);
    ip.fill_checksum();
    let (src, dst) = (ip.src_addr(), ip.dst_addr());
    sluice::wire::tcp::Packet::new_unchecked(&mut out[34..]).fill_checksum(src, dst);
    out
}

/// The TSval of the TCP segment in `frame` (IPv4 without options), if it has one.
fn tsval(frame: &[u8]) -> Option<u32> {
    let end = 34 + usize::from(frame[46] >> 4) * 4;
    let mut at = 54;
    while at < end {
        match frame[at] {
            0 => return None,
            1 => at += 1,
            8 => {
                return Some(u32::from_be_bytes(
                    frame[at + 2..at + 6].try_into().unwrap(),
                ))
            }
            _ => at += usize::from(frame[at + 1]).max(2),
        }
    }
    None
}

#[test]
fn the_proxy_around_the_real_servers_handshake() {
    let eal = Eal::init(&eal_args("eal_synproxy"))
        .expect("EAL init (run scripts/setup.sh; tests need root)");
    let pool = Arc::new(Mempool::new("sp_pool", 4095, 64, 2048).unwrap());
    let pair = RingPortPair::new("sp", 1, 256).unwrap();
    let (mut lb, mut peer) = ring_ports(pair, &pool);

    let (lb_ip, rs, client) = (ip("198.18.0.1"), ip("198.18.0.11"), ip("198.18.0.100"));
    let (vip, vip_rst, vip_drop) = (ip("198.18.1.1"), ip("198.18.1.2"), ip("198.18.1.3"));
    let vip_timed = ip("198.18.1.4");
    let on = SynProxy {
        mode: SynProxyMode::On,
        ..Default::default()
    };
    let mut table = ServiceTable::new();
    let key = |vip| ServiceKey::new(Protocol::Tcp, vip, 80);
    for (v, syn_retries) in [(vip, 0), (vip_rst, 3), (vip_drop, 3), (vip_timed, 2)] {
        table.add_service(key(v), SchedulerKind::Rr, None).unwrap();
        let sp = SynProxy { syn_retries, ..on };
        table.set_synproxy(key(v), sp).unwrap();
    }
    for v in [vip, vip_timed] {
        table
            .add_server(key(v), RealServerSpec::new(rs, 8080, 1, ForwardMode::Nat))
            .unwrap();
    }
    // The other two services have no real server; one says `all_down = "rst"`.
    let health = HealthOverlay {
        reset_when_down: [key(vip_rst)].into_iter().collect(),
        ..HealthOverlay::default()
    };
    let publisher = SnapshotPublisher::new(Snapshot::build_with(1, &table, &health, &[]));
    // The SYN timer's first wait shortened from 1 s: its retries come within the
    // test's time.
    let config = ForwarderConfig {
        synproxy_syn_timeout_ms: 100,
        ..forwarder_config(&publisher)
    };
    let (worker, counters, stop, _punted) =
        worker_from("eal_synproxy", &mut lb, (lb_ip, &[]), &pool, config, None);
    launch_on_lcore(1, move || worker.run()).unwrap();

    let (mut prx, mut ptx) = peer.take_queues().unwrap().pop().unwrap();
    let mut send = |frame: &[u8]| send_frame(&mut ptx, &pool, frame);
    // The TCP frames the worker sends within `wait`, or until `n` of them came.
    let mut tcp_frames = |wait: Duration, n: usize| -> Vec<Vec<u8>> {
        let deadline = Instant::now() + wait;
        let mut got = Vec::new();
        let mut rxb = Burst::new();
        while Instant::now() < deadline && got.len() < n {
            if prx.rx(&mut rxb) == 0 {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            got.extend(
                (0..rxb.len())
                    .map(|i| rxb.packet(i).to_vec())
                    .filter(|f| seg(f).is_some()),
            );
            rxb.free_all();
        }
        got
    };
    macro_rules! segments {
        ($wait:expr) => {
            (tcp_frames($wait, usize::MAX).iter())
                .filter_map(|f| seg(f))
                .collect::<Vec<Seg>>()
        };
    }
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
    let _ = segments!(wait);
    // A client's SYN to `vip` from `sport`: the cookie.
    macro_rules! cookie_for {
        ($vip:expr, $sport:expr) => {{
            send(&build(|b| {
                frames::tcp_segment(b, &from_client($vip, $sport), isn, 0, SYN, &[])
            }));
            let out = segments!(wait);
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
        segments!(wait),
        [(rs, SYN, isn, 0, 0)],
        "the SYN to the server"
    );
    send(&build(|b| {
        frames::tcp_segment(b, &from_server(40001), 7777, 0x5000_0000, ACK, &[])
    }));
    assert_eq!(
        segments!(wait),
        [(rs, RST, 0x5000_0000, 0, 0)],
        "a stale ACK from the server: a reset to the server, nothing to the client"
    );
    send(&cookie_ack);
    assert_eq!(segments!(wait), [(rs, SYN, isn, 0, 0)], "the SYN again");
    // A SYN-ACK for another SYN (its ack is not the SYN's ISN + 1): a reset at its
    // ack, as a client in SYN-SENT answers it; the session waits on.
    send(&build(|b| {
        frames::tcp_segment(b, &from_server(40001), 31_337, isn + 77, SYN_ACK, &[])
    }));
    assert_eq!(
        segments!(wait),
        [(rs, RST, isn + 77, 0, 0)],
        "a SYN-ACK not for the pending SYN: a reset to the server"
    );
    send(&build(|b| {
        frames::tcp_segment(b, &from_server(40001), server_isn, isn + 1, SYN_ACK, &[])
    }));
    assert_eq!(
        segments!(wait),
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
        segments!(wait),
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
    assert_eq!(segments!(wait), [(rs, SYN, isn, 0, 0)]);
    send(&build(|b| {
        frames::tcp_segment(b, &from_server(40002), 0, 5, RST | ACK, &[])
    }));
    assert_eq!(segments!(wait), [], "a reset not acknowledging the SYN");
    send(&build(|b| {
        frames::tcp_segment(b, &from_server(40002), 0, isn + 1, RST | ACK, &[])
    }));
    assert_eq!(
        segments!(wait),
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
            segments!(wait),
            [(rs, SYN, isn, 0, 0)],
            "a cookie ACK with flags {flags:#x} opens the connection"
        );
        send(&build(|b| {
            frames::tcp_segment(b, &from_server(sport), server_isn, isn + 1, SYN_ACK, &[])
        }));
        assert_eq!(
            segments!(wait),
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
            segments!(wait),
            [(client, RST, cookie + 1, 0, 0)],
            "{vip}: the refused connection's client gets a reset"
        );
    }

    // The SYN timer. A Linux client's SYN (MSS 1460, SACK, timestamps, window scale
    // 7) and its cookie ACK with timestamps: the SYN to the server carries them all.
    let linux_syn = |sport: u16| {
        let syn =
            build(|b| frames::tcp_segment(b, &from_client(vip_timed, sport), isn, 0, SYN, &[]));
        let mut options = vec![2, 4, 0x05, 0xb4, 4, 2, 8, 10];
        options.extend_from_slice(&5000u32.to_be_bytes());
        options.extend_from_slice(&[0, 0, 0, 0, 1, 3, 3, 7]);
        with_options(&syn, &options)
    };
    let linux_ack = |sport: u16, cookie: u32, cookie_tsval: u32| {
        let ack = build(|b| {
            frames::tcp_segment(
                b,
                &from_client(vip_timed, sport),
                isn + 1,
                cookie + 1,
                ACK,
                &[],
            )
        });
        let mut options = vec![1, 1, 8, 10];
        options.extend_from_slice(&5001u32.to_be_bytes());
        options.extend_from_slice(&cookie_tsval.to_be_bytes());
        with_options(&ack, &options)
    };
    // The client's handshake on `sport`: the cookie ACK sent, the first SYN to the
    // server (the frame) returned as soon as it is out, with when.
    macro_rules! timed_open {
        ($sport:expr) => {{
            send(&linux_syn($sport));
            let out = tcp_frames(wait, 1);
            assert_eq!(out.len(), 1, "one cookie SYN-ACK");
            let synack = seg(&out[0]).unwrap();
            assert_eq!((synack.0, synack.1), (client, SYN_ACK));
            let (cookie, cookie_tsval) = (synack.2, tsval(&out[0]).unwrap());
            send(&linux_ack($sport, cookie, cookie_tsval));
            let out = tcp_frames(wait, 1);
            assert_eq!(out.len(), 1, "the SYN to the server");
            assert_eq!(seg(&out[0]), Some((rs, SYN, isn, 0, 0)));
            assert_eq!(tsval(&out[0]), Some(5001), "the cookie ACK's TSval");
            (cookie, out[0].clone(), Instant::now())
        }};
    }

    // The first SYN is lost (the server does not answer): the timer sends it again
    // after its first wait, the same frame, and the SYN-ACK to it completes the
    // handshake with the client's numbers.
    let (cookie, first, sent) = timed_open!(40011);
    let again = tcp_frames(Duration::from_millis(250), 1);
    let waited = sent.elapsed();
    assert_eq!(
        again.len(),
        1,
        "the SYN again: {:?}",
        again.iter().map(|f| seg(f)).collect::<Vec<_>>()
    );
    assert_eq!(again[0], first, "the same SYN, options and all");
    assert!(
        waited >= Duration::from_millis(50),
        "sent again after {waited:?}: before its time"
    );
    send(&build(|b| {
        frames::tcp_segment(b, &from_server(40011), server_isn, isn + 1, SYN_ACK, &[])
    }));
    assert_eq!(
        segments!(wait),
        [(rs, ACK, isn + 1, server_isn + 1, 0)],
        "the server's handshake completed, and nothing sent again"
    );
    send(&build(|b| {
        frames::tcp_segment(
            b,
            &from_client(vip_timed, 40011),
            isn + 1,
            cookie + 1,
            PSH | ACK,
            b"GET",
        )
    }));
    assert_eq!(
        segments!(wait),
        [(rs, PSH | ACK, isn + 1, server_isn + 1, 3)],
        "spliced"
    );

    // The server answers none: the SYN goes twice more (after 100 and 200 ms), and
    // 400 ms after the last the client gets a reset at the number it expects and the
    // server a bare reset. The server's late SYN-ACK then goes nowhere.
    let (cookie, first, sent) = timed_open!(40012);
    let out = tcp_frames(Duration::from_millis(1500), 4);
    let waited = sent.elapsed();
    assert_eq!(
        out.iter().map(|f| seg(f).unwrap()).collect::<Vec<_>>(),
        [
            (rs, SYN, isn, 0, 0),
            (rs, SYN, isn, 0, 0),
            (client, RST, cookie + 1, 0, 0),
            (rs, RST, isn + 1, 0, 0),
        ],
        "two retries, then a reset each way"
    );
    assert!(out[..2].iter().all(|f| *f == first));
    assert!(
        waited >= Duration::from_millis(600),
        "given up after {waited:?}: before its time"
    );
    send(&build(|b| {
        frames::tcp_segment(b, &from_server(40012), server_isn, isn + 1, SYN_ACK, &[])
    }));
    assert_eq!(segments!(wait), [], "given up: the late SYN-ACK is dropped");

    // The client's side moves to another router (its retransmitted cookie ACK comes
    // from router B's MAC) while the server answers none: the timer's SYNs keep B as
    // the way back, so the reset that gives the connection up goes to B.
    const ROUTER_B: [u8; 6] = [0x02, 0x52, 0x54, 0, 0, 0xb];
    let (cookie, _, _) = timed_open!(40014);
    let mut via_b = linux_ack(40014, cookie, 0);
    via_b[6..12].copy_from_slice(&ROUTER_B);
    send(&via_b);
    let out = tcp_frames(Duration::from_millis(1500), 5);
    let to_client: Vec<[u8; 6]> = out
        .iter()
        .filter(|f| seg(f).is_some_and(|s| s.0 == client))
        .map(|f| f[0..6].try_into().unwrap())
        .collect();
    assert_eq!(
        to_client,
        [ROUTER_B],
        "the give-up reset to the client's latest next hop: {:?}",
        out.iter().map(|f| seg(f)).collect::<Vec<_>>()
    );

    // The server answers with an older connection's ACK: it gets its reset, and the
    // SYN goes again at once (not after the timer's wait), which it answers.
    let (_, first, _) = timed_open!(40013);
    send(&build(|b| {
        frames::tcp_segment(b, &from_server(40013), 7777, 0x5000_0000, ACK, &[])
    }));
    let sent = Instant::now();
    let out = tcp_frames(Duration::from_millis(80), 2);
    let waited = sent.elapsed();
    assert_eq!(
        out.iter().map(|f| seg(f).unwrap()).collect::<Vec<_>>(),
        [(rs, RST, 0x5000_0000, 0, 0), (rs, SYN, isn, 0, 0)],
        "a stale ACK: its reset, then the SYN again"
    );
    assert_eq!(out[1], first);
    assert!(
        waited < Duration::from_millis(80),
        "the SYN again after {waited:?}"
    );
    send(&build(|b| {
        frames::tcp_segment(b, &from_server(40013), server_isn, isn + 1, SYN_ACK, &[])
    }));
    assert_eq!(
        segments!(wait),
        [(rs, ACK, isn + 1, server_isn + 1, 0)],
        "the server's handshake completed"
    );

    stop.store(true, Ordering::SeqCst);
    assert_eq!(wait_lcore(1).unwrap(), 0);
    let drops = counters.drops_snapshot();
    let events = counters.events_snapshot();
    assert_eq!(events[Event::SynproxyCookieSent as usize], 10);
    assert_eq!(events[Event::SynproxyCookieValid as usize], 10);
    assert_eq!(events[Event::SynproxyCookieInvalid as usize], 0);
    assert_eq!(events[Event::SynproxyStaleReset as usize], 3);
    assert_eq!(events[Event::SynproxySynResent as usize], 2);
    assert_eq!(events[Event::SynproxySynRetried as usize], 6);
    assert_eq!(events[Event::SynproxyGaveUp as usize], 2);
    assert_eq!(events[Event::SynproxyRetryFull as usize], 0);
    assert_eq!(events[Event::SynproxyClientReset as usize], 0);
    assert_eq!(events[Event::SynproxyConnection as usize], 5);
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
    assert_eq!(
        drops[DropReason::ClientReset as usize],
        1,
        "the late SYN-ACK"
    );
    let _ = (prx, ptx);
    assert_eq!(pool.in_use(), 0, "mbufs leaked");
    drop(lb);
    drop(peer);
    drop(pool);
    drop(eal);
}
