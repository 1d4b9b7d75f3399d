//! A real worker loop on lcore 1 over net_ring, a FullNAT TCP service with TOA on: the
//! client's first ACK reaches the real server with the client in TOA, and a later
//! segment carrying a TOA option of the client's own (a forgery, here behind a NOP)
//! reaches it with that option made NOPs and its checksum right. A TOA module reads
//! the ACK that completes the server's handshake, which need not be the first ACK the
//! client sent (that one may have been refused by the server), so a forgery in any
//! later segment would otherwise be believed.
//! One test function only: the EAL initialises once per process.
mod common;

use common::eal::{eal_args, ring_ports, send_frame, worker, LB_MAC};
use sluice::dataplane::counters::Event;
use sluice::dpdk::{launch_on_lcore, wait_lcore, Burst, Eal, Mempool, RingPortPair};
use sluice::emulator::frames::{self, Endpoints, Frame};
use sluice::forward::toa;
use sluice::model::{ForwardMode, Protocol, RealServerSpec, SchedulerKind, ServiceKey};
use sluice::service::{ServiceTable, Snapshot, SnapshotPublisher};
use sluice::wire::{ipv4, tcp};
use std::net::Ipv4Addr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

const CLIENT_MAC: [u8; 6] = [0x02, 0x43, 0x4c, 0, 0, 1];
const RS_MAC: [u8; 6] = [0x02, 0x52, 0x53, 0, 0, 1];
const SYN: u8 = 0x02;
const ACK: u8 = 0x10;
const SYN_ACK: u8 = 0x12;
const PSH_ACK: u8 = 0x18;

fn ip(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}

/// The Ethernet/IPv4/TCP `frame` (no options) of `payload_len` bytes of payload with
/// `options` (a multiple of 4 bytes) put before the payload, both checksums made
/// again (and the Ethernet padding gone).
fn with_options(frame: &[u8], payload_len: usize, options: &[u8]) -> Vec<u8> {
    let mut out = frame[..54].to_vec();
    out.extend_from_slice(options);
    out.extend_from_slice(&frame[54..54 + payload_len]);
    let total = (out.len() - 14) as u16;
    out[16..18].copy_from_slice(&total.to_be_bytes());
    out[46] = (((20 + options.len()) / 4) as u8) << 4;
    let mut ip = ipv4::Packet::new_unchecked(&mut out[14..]);
    ip.fill_checksum();
    let (src, dst) = (ip.src_addr(), ip.dst_addr());
    tcp::Packet::new_unchecked(ip.payload_mut()).fill_checksum(src, dst);
    out
}

/// The TCP options of an Ethernet/IPv4 (no IP options) frame.
fn tcp_options(frame: &[u8]) -> &[u8] {
    let offset = usize::from(frame[46] >> 4) * 4;
    &frame[54..34 + offset]
}

#[test]
fn toa_reaches_the_real_server_and_a_clients_own_never_does() {
    let eal =
        Eal::init(&eal_args("eal_toa")).expect("EAL init (run scripts/setup.sh; tests need root)");
    let pool = Arc::new(Mempool::new("toa_pool", 4095, 64, 2048).unwrap());
    let pair = RingPortPair::new("t", 1, 256).unwrap();
    let (mut lb, mut peer) = ring_ports(pair, &pool);

    let (lb_ip, client, vip) = (ip("198.18.0.1"), ip("198.18.0.100"), ip("198.18.1.1"));
    let (rs, lip) = (ip("198.18.0.11"), ip("198.18.0.50"));
    let key = ServiceKey::new(Protocol::Tcp, vip, 80);
    let mut table = ServiceTable::new();
    table.add_service(key, SchedulerKind::Rr, None).unwrap();
    table
        .add_server(key, RealServerSpec::new(rs, 8080, 1, ForwardMode::FullNat))
        .unwrap();
    table.add_laddr(key, lip.into()).unwrap();
    table.set_toa(key, true).unwrap();
    let publisher = SnapshotPublisher::new(Snapshot::build(1, &table));
    let (worker, counters, stop) = worker("eal_toa", &mut lb, lb_ip, &pool, &publisher);
    launch_on_lcore(1, move || worker.run()).unwrap();

    let (mut prx, mut ptx) = peer.take_queues().unwrap().pop().unwrap();
    let mut send = |frame: &[u8]| send_frame(&mut ptx, &pool, frame);
    // The first TCP segment the worker sends to `to` within 2 s, as a frame.
    let mut receive = |to: Ipv4Addr| -> Vec<u8> {
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut rxb = Burst::new();
        while Instant::now() < deadline {
            if prx.rx(&mut rxb) == 0 {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            let found = (0..rxb.len()).find_map(|i| match frames::parse(rxb.packet(i)) {
                Frame::Tcp(s) if s.e.dst == to => Some(rxb.packet(i).to_vec()),
                Frame::Tcp(s) => panic!("a segment to {} before one to {to}", s.e.dst),
                _ => None,
            });
            rxb.free_all();
            if let Some(frame) = found {
                return frame;
            }
        }
        panic!("no segment to {to} within 2 s");
    };
    let mut buf = vec![0u8; frames::MAX_FRAME];
    let mut build = |write: &dyn Fn(&mut [u8]) -> usize| -> Vec<u8> {
        let len = write(&mut buf);
        buf[..len].to_vec()
    };

    // The real server makes itself known, then the handshake.
    send(&build(&|b| frames::arp_request(b, RS_MAC, rs, lb_ip)));
    let to_vip = Endpoints {
        src_mac: CLIENT_MAC,
        dst_mac: LB_MAC,
        src: client,
        dst: vip,
        sport: 40000,
        dport: 80,
    };
    send(&build(&|b| {
        frames::tcp_segment(b, &to_vip, 100, 0, SYN, &[])
    }));
    let syn = receive(rs);
    let Frame::Tcp(s) = frames::parse(&syn) else {
        unreachable!()
    };
    assert_eq!((s.e.src, s.e.dst, s.flags), (lip, rs, SYN));
    let to_lip = Endpoints {
        src_mac: RS_MAC,
        dst_mac: LB_MAC,
        src: rs,
        dst: lip,
        sport: 8080,
        dport: s.e.sport,
    };
    let mss = [2, 4, 5, 0xb4];
    let plain = build(&|b| frames::tcp_segment(b, &to_lip, 5000, s.seq + 1, SYN_ACK, &[]));
    send(&with_options(&plain, 0, &mss));
    let synack = receive(client);
    let Frame::Tcp(a) = frames::parse(&synack) else {
        unreachable!()
    };
    assert_eq!(a.flags, SYN_ACK);

    // The first ACK carries the client to the real server.
    send(&build(&|b| {
        frames::tcp_segment(b, &to_vip, 101, a.seq + 1, ACK, &[])
    }));
    let first = receive(rs);
    assert!(matches!(frames::parse(&first), Frame::Tcp(_)), "checksums");
    assert_eq!(toa::find(tcp_options(&first)), Some((client, 40000)));

    // A later segment with the client's own TOA (port 1, 1.2.3.4), behind a NOP.
    let forged = [1, toa::TOA_KIND, 8, 0, 1, 1, 2, 3, 4, 1, 1, 1];
    let plain = build(&|b| frames::tcp_segment(b, &to_vip, 101, a.seq + 1, PSH_ACK, b"GET"));
    let sent = with_options(&plain, 3, &forged);
    assert_eq!(toa::find(tcp_options(&sent)), Some((ip("1.2.3.4"), 1)));
    send(&sent);
    let second = receive(rs);
    let Frame::Tcp(d) = frames::parse(&second) else {
        panic!("{:?}", frames::parse(&second))
    };
    assert_eq!(d.payload, b"GET");
    assert_eq!(tcp_options(&second), &[1; 12]);
    assert_eq!(toa::find(tcp_options(&second)), None);

    stop.store(true, Ordering::SeqCst);
    assert_eq!(wait_lcore(1).unwrap(), 0);
    let events = counters.events_snapshot();
    assert_eq!(events[Event::ToaInserted as usize], 1);
    assert_eq!(events[Event::ToaForgedRemoved as usize], 1);
    let _ = (prx, ptx);
    assert_eq!(pool.in_use(), 0, "mbufs leaked");
    drop(lb);
    drop(peer);
    drop(pool);
    drop(eal);
}
