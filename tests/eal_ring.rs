//! EAL integration over net_ring: a real worker loop on lcore 1, fed through an
//! in-process ring port pair, answers ARP and ICMP echo and counts a malformed frame.
//! One test function only: the EAL initialises once per process.
use sluice::dataplane::counters::{DropReason, Event, WorkerCounters};
use sluice::dataplane::forwarder::{Forwarder, RssView};
use sluice::dataplane::local::LocalResponder;
use sluice::dataplane::mesh::Mesh;
use sluice::dataplane::query::Mailbox;
use sluice::dataplane::realserver_stats;
use sluice::dataplane::worker::{Links, Worker, WorkerPort};
use sluice::dpdk::{
    launch_on_lcore, wait_lcore, Burst, Eal, Mempool, Port, PortSettings, RingPortPair,
};
use sluice::emulator::frames::{self, Garbage, Reply};
use sluice::flow::rss::{HashFields, Reta, Toeplitz, DEFAULT_RSS_KEY};
use sluice::service::SnapshotPublisher;
use sluice::session::Timeouts;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

const LB_MAC: [u8; 6] = [0x02, 0x53, 0x4c, 0, 0, 1];
const PEER_MAC: [u8; 6] = [0x02, 0x50, 0x45, 0x45, 0x52, 1];

fn eal_args() -> Vec<String> {
    let prefix = format!("sl-ring-{}", std::process::id());
    [
        "eal_ring",
        "-l",
        "0,1",
        "--main-lcore",
        "0",
        "--no-huge",
        "-m",
        "256",
        "--no-shconf",
        "--no-pci",
        "--file-prefix",
        &prefix,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

#[test]
fn worker_answers_arp_and_ping_over_net_ring() {
    let eal = Eal::init(&eal_args()).expect("EAL init (run scripts/setup.sh; tests need root)");
    assert!(
        Eal::init(&eal_args()).is_err(),
        "a second EAL init in one process must be refused"
    );
    let pool = Arc::new(Mempool::new("test_pool", 4095, 64, 2048).unwrap());
    let pair = RingPortPair::new("t", 1, 256).unwrap();
    let settings = PortSettings {
        queues: 1,
        rx_desc: 256,
        tx_desc: 256,
        mac: Some(LB_MAC),
        ..Default::default()
    };
    let mut lb = Port::new(pair.a);
    lb.configure(&settings, &pool).unwrap();
    lb.start().unwrap();
    assert_eq!(lb.mac().unwrap(), LB_MAC, "MAC override applied");
    let mut peer = Port::new(pair.b);
    peer.configure(
        &PortSettings {
            mac: None,
            ..settings.clone()
        },
        &pool,
    )
    .unwrap();
    peer.start().unwrap();
    assert!(lb.link().up, "ring ports report link up once started");

    let lb_ip: Ipv4Addr = "198.18.0.1".parse().unwrap();
    let peer_ip: Ipv4Addr = "198.18.0.2".parse().unwrap();
    let (rx, tx) = lb.take_queues().unwrap().pop().unwrap();
    assert!(lb.take_queues().is_err(), "queues are handed out once");
    let counters = Arc::new(WorkerCounters::default());
    let stop = Arc::new(AtomicBool::new(false));
    // No virtual services: the worker only answers for its own address.
    let publisher = SnapshotPublisher::default();
    let hz = sluice::dpdk::tsc_hz();
    let forwarder = Forwarder::new(
        1024,
        publisher.reader(),
        Timeouts::default().in_ticks(100),
        hz / 10,
        hz,
        Arc::new(realserver_stats::new_table()),
        RssView {
            toeplitz: Toeplitz::new(&DEFAULT_RSS_KEY).unwrap(),
            reta: Reta::new_round_robin(128, 1).unwrap(),
            fields: HashFields::L3L4,
            queue: 0,
        },
    );
    let port = WorkerPort {
        rx,
        tx,
        responder: LocalResponder::new(LB_MAC, &[lb_ip]),
        addr: lb_ip,
        mtu: 1500,
    };
    let worker = Worker::new(
        0,
        pool.clone(),
        vec![port],
        forwarder,
        counters.clone(),
        Links {
            stop: stop.clone(),
            mesh: Arc::new(Mesh::new("eal_ring", 1).unwrap()),
            mailbox: Arc::new(Mailbox::default()),
        },
    );
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
    assert_eq!(wait_lcore(1), 0);

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
    drop(pair);
    drop(pool);
    drop(eal);
}
