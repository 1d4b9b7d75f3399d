//! A real worker loop on lcore 1 over net_ring, two DR services whose real servers are
//! not resolved: each first SYN is held (not dropped) while the worker asks for the
//! real server's MAC; the one whose real server answers the ARP request goes out to
//! it, addressed, as soon as the answer arrives; the other is dropped after the hold
//! time as `neighbour_unresolved`. No mbuf leaks either way.
//! One test function only: the EAL initialises once per process.
mod common;

use common::eal::{eal_args, ring_ports, worker, LB_MAC};
use sluice::dataplane::counters::Event;
use sluice::dpdk::{launch_on_lcore, wait_lcore, Burst, Eal, Mempool, RingPortPair};
use sluice::emulator::frames::{self, Endpoints, Frame};
use sluice::model::DropReason;
use sluice::model::Protocol;
use sluice::model::SchedulerKind;
use sluice::model::{ForwardMode, RealServerSpec, ServiceKey};
use sluice::service::{ServiceTable, Snapshot, SnapshotPublisher};
use std::net::Ipv4Addr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

const CLIENT_MAC: [u8; 6] = [0x02, 0x43, 0x4c, 0, 0, 1];
const RS1_MAC: [u8; 6] = [0x02, 0x52, 0x53, 0, 0, 1];
const SYN: u8 = 0x02;

fn ip(s: &str) -> Ipv4Addr {
    s.parse().unwrap()
}

#[test]
fn first_syn_waits_for_its_real_servers_mac_instead_of_being_dropped() {
    let eal =
        Eal::init(&eal_args("eal_held")).expect("EAL init (run scripts/setup.sh; tests need root)");
    let pool = Arc::new(Mempool::new("held_pool", 4095, 64, 2048).unwrap());
    let pair = RingPortPair::new("h", 1, 256).unwrap();
    let (mut lb, mut peer) = ring_ports(pair, &pool);

    let (lb_ip, client) = (ip("198.18.0.1"), ip("198.18.0.100"));
    let (vip1, rs1) = (ip("198.18.1.1"), ip("198.18.0.11"));
    let (vip2, rs2) = (ip("198.18.1.2"), ip("198.18.0.12"));
    let mut table = ServiceTable::new();
    for (vip, rs) in [(vip1, rs1), (vip2, rs2)] {
        let key = ServiceKey::new(Protocol::Tcp, vip, 80);
        table.add_service(key, SchedulerKind::Rr, None).unwrap();
        table
            .add_server(key, RealServerSpec::new(rs, 80, 1, ForwardMode::Dr))
            .unwrap();
    }
    let publisher = SnapshotPublisher::new(Snapshot::build(1, &table));
    let (worker, counters, stop) = worker("eal_held", &mut lb, lb_ip, &pool, &publisher);
    launch_on_lcore(1, move || worker.run()).unwrap();

    let (mut prx, mut ptx) = peer.take_queues().unwrap().pop().unwrap();
    let push = |out: &mut Burst, build: &dyn Fn(&mut [u8]) -> usize| {
        assert!(out.alloc_from(&pool, 1));
        let i = out.len() - 1;
        out.set_packet_len(i, frames::MAX_FRAME as u16);
        let len = build(out.packet_mut(i));
        out.set_packet_len(i, len as u16);
    };
    let syn_to = |vip: Ipv4Addr, sport: u16| Endpoints {
        src_mac: CLIENT_MAC,
        dst_mac: LB_MAC,
        src: client,
        dst: vip,
        sport,
        dport: 80,
    };
    // Every frame the worker sends within `wait`, as (ARP targets asked, SYNs seen as
    // (destination MAC, destination IP, source port)).
    type Seen = (Vec<Ipv4Addr>, Vec<([u8; 6], Ipv4Addr, u16)>);
    let mut collect = |wait: Duration, until: &dyn Fn(&Seen) -> bool| -> Seen {
        let mut seen: Seen = (Vec::new(), Vec::new());
        let deadline = Instant::now() + wait;
        let mut rxb = Burst::new();
        while Instant::now() < deadline && !until(&seen) {
            if prx.rx(&mut rxb) == 0 {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            for i in 0..rxb.len() {
                match frames::parse(rxb.packet(i)) {
                    Frame::Arp(a) if a.operation == 1 => seen.0.push(a.target_ip),
                    Frame::Tcp(s) if s.flags == SYN => {
                        seen.1.push((s.e.dst_mac, s.e.dst, s.e.sport))
                    }
                    other => panic!("unexpected frame from the worker: {other:?}"),
                }
            }
            rxb.free_all();
        }
        seen
    };

    // Both first SYNs: nothing can go out yet, the worker asks for both MACs.
    let mut out = Burst::new();
    push(&mut out, &|b| {
        frames::tcp_segment(b, &syn_to(vip1, 1001), 7, 0, SYN, &[])
    });
    push(&mut out, &|b| {
        frames::tcp_segment(b, &syn_to(vip2, 1002), 9, 0, SYN, &[])
    });
    assert_eq!(ptx.tx(&mut out), 2);
    let (asked, syns) = collect(Duration::from_millis(150), &|_| false);
    assert!(
        syns.is_empty(),
        "a SYN left before its next hop was known: {syns:?}"
    );
    assert!(
        asked.contains(&rs1) && asked.contains(&rs2),
        "ARP requests for both real servers: {asked:?}"
    );
    let held = counters.events_snapshot()[Event::NeighbourHeld as usize];
    assert_eq!(held, 2, "both SYNs held");

    // rs1 answers: the held SYN goes out to it at once, unchanged but for its MACs.
    let answered = Instant::now();
    push(&mut out, &|b| {
        frames::arp_reply(b, RS1_MAC, rs1, LB_MAC, lb_ip)
    });
    assert_eq!(ptx.tx(&mut out), 1);
    let (_, syns) = collect(Duration::from_secs(1), &|s| !s.1.is_empty());
    let took = answered.elapsed();
    assert_eq!(syns, vec![(RS1_MAC, vip1, 1001)], "the held SYN, to rs1");
    eprintln!("held SYN sent {took:?} after the ARP answer");

    // rs2 never answers: its SYN is dropped after the hold time, and nothing is sent.
    let (_, syns) = collect(Duration::from_millis(400), &|_| false);
    assert!(syns.is_empty(), "{syns:?}");
    stop.store(true, Ordering::SeqCst);
    assert_eq!(wait_lcore(1).unwrap(), 0);
    let events = counters.events_snapshot();
    let drops = counters.drops_snapshot();
    assert_eq!(events[Event::NeighbourHeldSent as usize], 1);
    assert_eq!(
        drops[DropReason::NeighbourUnresolved as usize],
        1,
        "{drops:?}"
    );

    let _ = (prx, ptx);
    assert_eq!(pool.in_use(), 0, "mbufs leaked");
    drop(lb);
    drop(peer);
    drop(pool);
    drop(eal);
}
