//! EAL integration over net_ring: the rings a worker hands frames up to the management
//! core on, one per kind. A flood of datagrams from a sync peer's address fills the
//! sync ring (nobody drains it here, as when the management core falls behind); a
//! probe's answer after it still goes up, so the flood cannot make live real servers
//! look dead. A flood of segments forged from a real server's address to a probe port,
//! acknowledging anything but the probe's sequence numbers, never reaches the probe
//! ring. A flood that does acknowledge them (as only someone who saw the probe's SYN
//! could send) then fills the probe ring; a peer's VRRP advertisement after it still
//! reaches the management core, on the VRRP ring, so the flood cannot make a live
//! master look dead. With one shared ring, the sync flood would leave the answer no
//! room, and the probe flood the advert.
//! One test function only: the EAL initialises once per process.
mod common;

use common::eal::{eal_args, forwarder_config, ring_ports, worker_from, LB_MAC};
use sluice::dataplane::counters::{Event, WorkerCounters};
use sluice::dataplane::forwarder::{HealthTap, VrrpSenders};
use sluice::dataplane::mesh::HEALTH_RING_SIZE;
use sluice::dataplane::probe_acks::ProbeAcks;
use sluice::dpdk::{launch_on_lcore, wait_lcore, Burst, Eal, Mempool, RingPortPair};
use sluice::emulator::frames::{self, Endpoints};
use sluice::ha::vrrp::node::{VirtualAddresses, VrrpNode};
use sluice::ha::vrrp::router::VrrpConfig;
use sluice::model::{DropReason, ForwardMode, Protocol, RealServerSpec, SchedulerKind, ServiceKey};
use sluice::service::{ServiceTable, Snapshot, SnapshotPublisher};
use sluice::wire::MacAddr;
use std::net::Ipv4Addr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

const PEER_MAC: [u8; 6] = [0x02, 0x50, 0x45, 0x45, 0x52, 1];
/// Forged probe answers: more than the punt ring holds.
const FLOOD: u64 = 1100;

/// Polls the worker's counters until `done` holds, for at most 5 s.
fn wait_until(counters: &WorkerCounters, done: impl Fn(&[u64], &[u64]) -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if done(&counters.events_snapshot(), &counters.drops_snapshot()) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    false
}

#[test]
fn each_kind_reaches_the_management_core_past_a_flood_of_another() {
    let _eal =
        Eal::init(&eal_args("eal_punt")).expect("EAL init (run scripts/setup.sh; tests need root)");
    let pool = Arc::new(Mempool::new("test_pool", 4095, 64, 2048).unwrap());
    let pair = RingPortPair::new("t", 1, 256).unwrap();
    let (mut lb, mut peer) = ring_ports(pair, &pool);
    let lb_ip = Ipv4Addr::new(198, 18, 0, 1);
    let peer_ip = Ipv4Addr::new(198, 18, 0, 2);
    let real = Ipv4Addr::new(198, 18, 0, 11);
    let probe_ports = 50000..=50099;

    let mut table = ServiceTable::new();
    let service = ServiceKey::new(Protocol::Tcp, Ipv4Addr::new(198, 18, 1, 1), 80);
    table.add_service(service, SchedulerKind::Rr, None).unwrap();
    table
        .add_server(service, RealServerSpec::new(real, 80, 1, ForwardMode::Nat))
        .unwrap();
    let publisher = SnapshotPublisher::new(Snapshot::build(1, &table));
    // A probe went out from the first port with ISN 0: its answers acknowledge 1.
    let acks = Arc::new(ProbeAcks::new(probe_ports.clone()));
    acks.sent(*probe_ports.start(), 0);
    let mut config = forwarder_config(&publisher);
    config.health = Some(HealthTap {
        source: lb_ip,
        sources6: Vec::new(),
        acks: Arc::clone(&acks),
        passive_syn_ms: 1000,
    });
    config.vrrp = VrrpSenders::Peers(vec![peer_ip]);
    let sync_listen = std::net::SocketAddrV4::new(lb_ip, 8848);
    config.sync_port = Some((sync_listen, None));
    config.sync_peers = vec![peer_ip];
    let (worker, counters, stop, punted) =
        worker_from("eal_punt", &mut lb, (lb_ip, &[]), &pool, config, None);
    launch_on_lcore(1, move || worker.run()).unwrap();
    let (mut prx, mut ptx) = peer.take_queues().unwrap().pop().unwrap();

    // The flood: SYN-ACKs from the real server's address to a probe port.
    let forged = Endpoints {
        src_mac: PEER_MAC,
        dst_mac: LB_MAC,
        src: real,
        dst: lb_ip,
        sport: 80,
        dport: *probe_ports.start(),
    };
    let from_peer = Endpoints {
        src: peer_ip,
        sport: 8848,
        dport: 8848,
        ..forged
    };
    let mut out = Burst::new();
    // Sends `count` frames, each written by `write` into a fresh mbuf.
    let mut flood = |count: u64, write: &dyn Fn(&mut [u8]) -> usize| {
        let mut sent = 0u64;
        let deadline = Instant::now() + Duration::from_secs(10);
        while sent < count && Instant::now() < deadline {
            while !out.is_full() && sent + (out.len() as u64) < count {
                assert!(out.alloc_from(&pool, 1));
                let i = out.len() - 1;
                out.set_packet_len(i, frames::MAX_FRAME as u16);
                let len = write(out.packet_mut(i));
                out.set_packet_len(i, len as u16);
            }
            sent += ptx.tx(&mut out) as u64;
        }
        out.free_all();
        assert_eq!(sent, count, "the peer could not send them all");
    };
    let sync_datagram = |b: &mut [u8]| frames::udp_datagram(b, &from_peer, b"a sync datagram");
    let probe_answer = |b: &mut [u8]| frames::tcp_segment(b, &forged, 1, 1, 0x12, &[]);
    // A SYN-ACK that acknowledges a number past the probe's span.
    let not_an_answer =
        |b: &mut [u8]| frames::tcp_segment(b, &forged, 1, 1 + ProbeAcks::SPAN, 0x12, &[]);
    let (up, full) = (
        Event::HealthReplyUp as usize,
        DropReason::HealthRingFull as usize,
    );
    let (sync_up, sync_full) = (
        Event::SyncFrameUp as usize,
        DropReason::SyncRingFull as usize,
    );
    // Each ring keeps one slot free.
    let ring_holds = u64::from(HEALTH_RING_SIZE) - 1;
    let counted = |what: &str, done: &dyn Fn(&[u64], &[u64]) -> bool| {
        assert!(
            wait_until(&counters, done),
            "{what}: events {:?} drops {:?}",
            counters.events_snapshot(),
            counters.drops_snapshot()
        );
    };

    // A flood of datagrams from a peer's address to the sync port (forged or not:
    // the management core checks them) fills the sync ring, and only that one: a
    // probe's answer after it still goes up.
    flood(FLOOD, &sync_datagram);
    counted("the sync flood", &|e, d| e[sync_up] + d[sync_full] == FLOOD);
    assert_eq!(counters.events_snapshot()[sync_up], ring_holds);
    flood(1, &probe_answer);
    counted("a probe answer after the sync flood", &|e, _| e[up] == 1);

    // Forged from the real server's address, but acknowledging what no probe sent:
    // dropped by the worker, the probe ring untouched.
    let not_answer = DropReason::NotAProbeAnswer as usize;
    flood(FLOOD, &not_an_answer);
    counted("the forged flood", &|_, d| d[not_answer] == FLOOD);
    assert_eq!(counters.events_snapshot()[up], 1, "nothing forged went up");
    assert_eq!(
        counters.drops_snapshot()[full],
        0,
        "the probe ring never filled"
    );

    // A flood of answers that acknowledge the probe (a forger who saw its SYN) fills
    // the probe ring, and only that one.
    flood(FLOOD, &probe_answer);
    counted("the probe flood", &|e, d| e[up] + d[full] == FLOOD + 1);
    assert_eq!(
        counters.events_snapshot()[up],
        ring_holds,
        "the punt ring is full"
    );
    assert_eq!(counters.drops_snapshot()[full], FLOOD + 1 - ring_holds);

    // Then the peer's advertisement.
    let mut node = VrrpNode::new(
        VrrpConfig {
            vrid: 51,
            priority: 255,
            advert_interval_cs: 100,
            preempt: true,
            primary_addr: peer_ip,
        },
        MacAddr(PEER_MAC),
    );
    let mut advert = Vec::new();
    let addrs = VirtualAddresses {
        v4: vec![Ipv4Addr::new(198, 18, 1, 1)],
        v6: Vec::new(),
    };
    node.start(0, &addrs, &mut |f: &[u8]| {
        if sluice::wire::vrrp::carries_vrrp(f) && advert.is_empty() {
            advert = f.to_vec();
        }
        true
    });
    assert!(!advert.is_empty(), "the node advertised");
    assert!(out.alloc_from(&pool, 1));
    out.set_packet_len(0, advert.len() as u16);
    out.packet_mut(0).copy_from_slice(&advert);
    assert_eq!(ptx.tx(&mut out), 1);
    let vrrp_full = DropReason::VrrpRingFull as usize;
    let vrrp_up = Event::VrrpAdvertUp as usize;
    assert!(
        wait_until(&counters, |e, d| e[vrrp_up] + d[vrrp_full] == 1),
        "the advert was never handled: events {:?} drops {:?}",
        counters.events_snapshot(),
        counters.drops_snapshot()
    );
    stop.store(true, Ordering::SeqCst);
    assert_eq!(wait_lcore(1).unwrap(), 0);

    let events = counters.events_snapshot();
    let drops = counters.drops_snapshot();
    assert_eq!(drops[vrrp_full], 0, "{drops:?}");
    assert_eq!(
        (drops[full], drops[sync_full]),
        (FLOOD + 1 - ring_holds, FLOOD - ring_holds),
        "{drops:?}"
    );
    // Each frame counted once, as what it is: probe answers, sync datagrams, the
    // advert.
    assert_eq!(
        (events[up], events[sync_up], events[vrrp_up]),
        (ring_holds, ring_holds, 1),
        "{events:?}"
    );
    let mut got = Burst::new();
    assert_eq!(punted.vrrp.dequeue(&mut got), 1);
    assert_eq!(got.packet(0), &advert[..], "the advert, as sent");
    got.free_all();
    // The answers and the datagrams wait on their rings; every mbuf goes back to the
    // pool.
    for (ring, what) in [
        (&punted.punted, "probe answers"),
        (&punted.sync, "sync datagrams"),
    ] {
        let mut waiting = 0;
        loop {
            let n = ring.dequeue(&mut got);
            if n == 0 {
                break;
            }
            waiting += n as u64;
            got.free_all();
        }
        assert_eq!(waiting, ring_holds, "{what}");
    }
    // What the worker sent the peer meanwhile (ARP requests for the real server).
    while prx.rx(&mut got) > 0 {
        got.free_all();
    }
    assert_eq!(pool.in_use(), 0, "mbufs leaked");
}
