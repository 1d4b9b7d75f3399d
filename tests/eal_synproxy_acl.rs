//! A real worker loop on lcore 1 over net_ring, a NAT TCP service with the SYN proxy
//! on: a client whose SYN got a cookie, and whose address is then denied by the
//! access list (an operator's `--acl-add` during an incident), cannot use that cookie:
//! its ACK is dropped as `acl_denied`, and the real server sees nothing. A cookie
//! lives about two minutes, so without this every client handed one before the deny
//! would still get through. An allowed client's cookie ACK opens its connection.
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
use sluice::service::acl::{AclAction, Prefix};
use sluice::service::{ServiceTable, Snapshot, SnapshotPublisher};
use std::net::Ipv4Addr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

const CLIENT_MAC: [u8; 6] = [0x02, 0x43, 0x4c, 0, 0, 1];
const RS_MAC: [u8; 6] = [0x02, 0x52, 0x53, 0, 0, 1];
const SYN: u8 = 0x02;
const ACK: u8 = 0x10;
const SYN_ACK: u8 = 0x12;

fn ip(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}

#[test]
fn a_cookie_handed_out_before_a_deny_does_not_open_a_connection() {
    let eal = Eal::init(&eal_args("eal_synproxy_acl"))
        .expect("EAL init (run scripts/setup.sh; tests need root)");
    let pool = Arc::new(Mempool::new("spacl_pool", 4095, 64, 2048).unwrap());
    let pair = RingPortPair::new("sa", 1, 256).unwrap();
    let (mut lb, mut peer) = ring_ports(pair, &pool);

    let (lb_ip, vip, rs) = (ip("198.18.0.1"), ip("198.18.1.1"), ip("198.18.0.11"));
    let (denied, allowed) = (ip("198.18.2.100"), ip("198.18.2.101"));
    let key = ServiceKey::new(Protocol::Tcp, vip, 80);
    let mut table = ServiceTable::new();
    table.add_service(key, SchedulerKind::Rr, None).unwrap();
    table
        .add_server(key, RealServerSpec::new(rs, 8080, 1, ForwardMode::Nat))
        .unwrap();
    let on = SynProxy {
        mode: SynProxyMode::On,
        ..Default::default()
    };
    table.set_synproxy(key, on).unwrap();
    let publisher = SnapshotPublisher::new(Snapshot::build(1, &table));
    let (worker, counters, stop) = worker("eal_synproxy_acl", &mut lb, lb_ip, &pool, &publisher);
    launch_on_lcore(1, move || worker.run()).unwrap();

    let (mut prx, mut ptx) = peer.take_queues().unwrap().pop().unwrap();
    let mut send = |frame: &[u8]| send_frame(&mut ptx, &pool, frame);
    // The TCP segments the worker sends within `wait`, as (destination, flags, seq).
    let mut segments = |wait: Duration| -> Vec<(Ipv4Addr, u8, u32)> {
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
                    Frame::Tcp(s) => Some((s.e.dst, s.flags, s.seq)),
                    _ => None,
                }),
            );
            rxb.free_all();
        }
        got
    };
    let mut buf = vec![0u8; frames::MAX_FRAME];
    let mut build = |write: &dyn Fn(&mut [u8]) -> usize| -> Vec<u8> {
        let len = write(&mut buf);
        buf[..len].to_vec()
    };
    let from = |client: Ipv4Addr| Endpoints {
        src_mac: CLIENT_MAC,
        dst_mac: LB_MAC,
        src: client,
        dst: vip,
        sport: 40000,
        dport: 80,
    };
    let wait = Duration::from_millis(300);

    // The real server makes itself known; both clients get a cookie.
    send(&build(&|b| frames::arp_request(b, RS_MAC, rs, lb_ip)));
    let mut cookies = Vec::new();
    for client in [denied, allowed] {
        send(&build(&|b| {
            frames::tcp_segment(b, &from(client), 100, 0, SYN, &[])
        }));
        let out = segments(wait);
        assert_eq!(out.len(), 1, "one cookie SYN-ACK: {out:?}");
        assert_eq!((out[0].0, out[0].1), (client, SYN_ACK));
        cookies.push(out[0].2);
    }

    // The operator denies the first client.
    let one = Prefix::new(denied, 32).unwrap();
    table.acl_add(key, AclAction::Deny, &[one]).unwrap();
    publisher.publish(Snapshot::build(2, &table)).unwrap();
    std::thread::sleep(Duration::from_millis(50));

    // Its cookie ACK opens nothing; the allowed client's opens the server's side.
    send(&build(&|b| {
        frames::tcp_segment(b, &from(denied), 101, cookies[0] + 1, ACK, &[])
    }));
    let out = segments(wait);
    assert!(out.is_empty(), "nothing for the denied client: {out:?}");
    send(&build(&|b| {
        frames::tcp_segment(b, &from(allowed), 101, cookies[1] + 1, ACK, &[])
    }));
    let out = segments(wait);
    assert_eq!(
        out.iter().map(|s| (s.0, s.1)).collect::<Vec<_>>(),
        [(rs, SYN)],
        "the allowed client's connection opens towards the real server"
    );

    stop.store(true, Ordering::SeqCst);
    assert_eq!(wait_lcore(1).unwrap(), 0);
    let drops = counters.drops_snapshot();
    let events = counters.events_snapshot();
    assert_eq!(drops[DropReason::AclDenied as usize], 1);
    assert_eq!(events[Event::SynproxyCookieSent as usize], 2);
    assert_eq!(events[Event::SynproxyCookieValid as usize], 2);
    let _ = (prx, ptx);
    assert_eq!(pool.in_use(), 0, "mbufs leaked");
    drop(lb);
    drop(peer);
    drop(pool);
    drop(eal);
}
