//! EAL integration over net_ring: a real worker loop on lcore 1, fed through an
//! in-process ring port pair, answers ARP and ICMP echo and counts a malformed frame;
//! then a panic with a job running, which `LcoreJobs` stops before the EAL's cleanup.
//! One test function only: the EAL initialises once per process.
mod common;

use common::eal::{eal_args, ring_ports, worker, LB_MAC};
use sluice::dataplane::counters::Event;
use sluice::dpdk::{launch_on_lcore, wait_lcore, Burst, Eal, LcoreJobs, Mempool, RingPortPair};
use sluice::emulator::frames::{self, Garbage, Reply};
use sluice::model::DropReason;
use sluice::service::SnapshotPublisher;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const PEER_MAC: [u8; 6] = [0x02, 0x50, 0x45, 0x45, 0x52, 1];

#[test]
fn worker_answers_arp_and_ping_over_net_ring() {
    let eal =
        Eal::init(&eal_args("eal_ring")).expect("EAL init (run scripts/setup.sh; tests need root)");
    assert!(
        Eal::init(&eal_args("eal_ring")).is_err(),
        "a second EAL init in one process must be refused"
    );
    let pool = Arc::new(Mempool::new("test_pool", 4095, 64, 2048).unwrap());
    let pair = RingPortPair::new("t", 1, 256).unwrap();
    let (mut lb, mut peer) = ring_ports(pair, &pool);
    assert_eq!(lb.mac().unwrap(), LB_MAC, "MAC override applied");
    assert!(lb.link().up, "ring ports report link up once started");

    let lb_ip: Ipv4Addr = "198.18.0.1".parse().unwrap();
    let peer_ip: Ipv4Addr = "198.18.0.2".parse().unwrap();
    // No virtual services: the worker only answers for its own address.
    let publisher = SnapshotPublisher::default();
    let (worker, counters, stop) = worker("eal_ring", &mut lb, lb_ip, &pool, &publisher);
    assert!(lb.take_queues().is_err(), "queues are handed out once");
    launch_on_lcore(1, move || worker.run()).unwrap();

    let (mut prx, mut ptx) = peer.take_queues().unwrap().pop().unwrap();
    let mut out = Burst::new();
    let push = |out: &mut Burst, build: &dyn Fn(&mut [u8]) -> usize| {
        assert!(out.alloc_from(&pool, 1));
        let i = out.len() - 1;
        out.set_packet_len(i, frames::MAX_FRAME as u16);
        let len = build(out.packet_mut(i));
        out.set_packet_len(i, len as u16);
    };
    push(&mut out, &|b| {
        frames::arp_request(b, PEER_MAC, peer_ip, lb_ip)
    });
    for seq in 0..3 {
        push(&mut out, &|b| {
            frames::echo_request(b, PEER_MAC, LB_MAC, peer_ip, lb_ip, 1, seq, 42)
        });
    }
    push(&mut out, &|b| {
        frames::garbage(b, Garbage::Runt, PEER_MAC, LB_MAC, peer_ip, lb_ip)
    });
    push(&mut out, &|b| {
        frames::garbage(b, Garbage::BadIpChecksum, PEER_MAC, LB_MAC, peer_ip, lb_ip)
    });
    assert_eq!(ptx.tx(&mut out), 6);

    let mut replies = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut rxb = Burst::new();
    while replies.len() < 4 && Instant::now() < deadline {
        if prx.rx(&mut rxb) == 0 {
            std::thread::sleep(Duration::from_millis(1));
            continue;
        }
        for i in 0..rxb.len() {
            replies.push(frames::parse_reply(rxb.packet(i), LB_MAC, lb_ip));
        }
        rxb.free_all();
    }
    stop.store(true, Ordering::SeqCst);
    assert_eq!(wait_lcore(1).unwrap(), 0);

    assert_eq!(
        replies.len(),
        4,
        "one ARP reply and three echo replies: {replies:?}"
    );
    assert_eq!(
        replies[0],
        Reply::Arp {
            target_mac: PEER_MAC,
            target_ip: peer_ip
        }
    );
    for r in &replies[1..] {
        assert_eq!(
            r,
            &Reply::Echo {
                dst_mac: PEER_MAC,
                dst_ip: peer_ip,
                id: 1,
                stamp: 42
            }
        );
    }
    let drops = counters.drops_snapshot();
    let events = counters.events_snapshot();
    assert_eq!(drops[DropReason::Truncated as usize], 1);
    assert_eq!(drops[DropReason::BadIpv4Checksum as usize], 1);
    assert_eq!(drops.iter().sum::<u64>(), 2, "no other drops: {drops:?}");
    assert_eq!(events[Event::ArpReplied as usize], 1);
    assert_eq!(events[Event::IcmpEchoReplied as usize], 3);
    assert_eq!(events[Event::NeighbourLearned as usize], 1);
    assert_eq!(counters.rx_packets.load(Ordering::Relaxed), 6);
    assert_eq!(counters.tx_packets.load(Ordering::Relaxed), 4);
    let lb_stats = lb.stats().unwrap();
    assert_eq!((lb_stats.rx_packets, lb_stats.tx_packets), (6, 4));
    assert!(!lb.xstats().unwrap().is_empty(), "net_ring exposes xstats");

    // Every mbuf is back in the pool: nothing leaked on the reply or drop paths.
    let _ = (prx, ptx);
    assert_eq!(pool.in_use(), 0, "mbufs leaked");
    drop(lb);
    drop(peer);
    drop(pool);

    // A panic while a job still runs on lcore 1: the LcoreJobs that launched it stops
    // it and waits for it as the panic unwinds, so the EAL's cleanup (which waits for
    // every worker lcore, and would wait forever for a running one) returns.
    let mut jobs = LcoreJobs::new();
    let flag = jobs.stop_flag().clone();
    let returned = Arc::new(AtomicBool::new(false));
    let seen = returned.clone();
    jobs.launch(1, move || {
        while !flag.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(1));
        }
        seen.store(true, Ordering::SeqCst);
        0
    })
    .unwrap();
    let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let _jobs = jobs;
        panic!("the management core panics with a job running");
    }));
    assert!(unwound.is_err());
    assert!(
        returned.load(Ordering::SeqCst),
        "the job was told to stop and waited for"
    );
    drop(eal);
}
