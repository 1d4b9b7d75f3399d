//! EAL integration over net_ring: the rings a worker hands frames up to the management
//! core on. A flood of probe answers forged from a real server's address fills the
//! punt ring (nobody drains it here, as when the management core falls behind); a
//! peer's VRRP advertisement after it still reaches the management core, on the VRRP
//! ring, so the flood cannot make a live master look dead. With one shared ring the
//! advert would be dropped as `health_ring_full`. A peer's sync datagram, which shares
//! the punt ring with the probe answers, is counted apart from them.
//! One test function only: the EAL initialises once per process.
mod common;

use common::eal::{eal_args, forwarder_config, ring_ports, worker_from, LB_MAC};
use sluice::dataplane::counters::{Event, WorkerCounters};
use sluice::dataplane::forwarder::{HealthTap, VrrpSenders};
use sluice::dataplane::mesh::HEALTH_RING_SIZE;
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
fn a_vrrp_advert_reaches_the_management_core_past_a_full_punt_ring() {
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
    let mut config = forwarder_config(&publisher);
    config.health = Some(HealthTap {
        source: lb_ip,
        sources6: Vec::new(),
        ports: probe_ports.clone(),
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
    let mut out = Burst::new();
    // First a peer's sync datagram: up the same punt ring, counted as what it is.
    let sync_up = Event::SyncFrameUp as usize;
    let from_peer = Endpoints {
        src: peer_ip,
        sport: 8848,
        dport: 8848,
        ..forged
    };
    assert!(out.alloc_from(&pool, 1));
    out.set_packet_len(0, frames::MAX_FRAME as u16);
    let len = frames::udp_datagram(out.packet_mut(0), &from_peer, b"a sync datagram");
    out.set_packet_len(0, len as u16);
    assert_eq!(ptx.tx(&mut out), 1);
    assert!(
        wait_until(&counters, |e, _| e[sync_up] == 1),
        "the sync datagram did not go up: events {:?} drops {:?}",
        counters.events_snapshot(),
        counters.drops_snapshot()
    );
    let mut sent = 0u64;
    let deadline = Instant::now() + Duration::from_secs(10);
    while sent < FLOOD && Instant::now() < deadline {
        while !out.is_full() && sent + (out.len() as u64) < FLOOD {
            assert!(out.alloc_from(&pool, 1));
            let i = out.len() - 1;
            out.set_packet_len(i, frames::MAX_FRAME as u16);
            let len = frames::tcp_segment(out.packet_mut(i), &forged, 1, 1, 0x12, &[]);
            out.set_packet_len(i, len as u16);
        }
        sent += ptx.tx(&mut out) as u64;
    }
    out.free_all();
    assert_eq!(sent, FLOOD, "the peer could not send the flood");
    let up = Event::HealthReplyUp as usize;
    let full = DropReason::HealthRingFull as usize;
    // The punt ring keeps one slot free.
    let ring_holds = u64::from(HEALTH_RING_SIZE) - 1;
    assert!(
        wait_until(&counters, |e, d| e[up] + d[full] == FLOOD),
        "events {:?} drops {:?}",
        counters.events_snapshot(),
        counters.drops_snapshot()
    );
    assert_eq!(
        counters.events_snapshot()[up],
        ring_holds - 1,
        "the punt ring is full"
    );
    assert_eq!(counters.drops_snapshot()[full], FLOOD - (ring_holds - 1));

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
    assert_eq!(drops[full], FLOOD - (ring_holds - 1), "{drops:?}");
    // Each frame counted once, as what it is: probe answers, the sync datagram, the
    // advert.
    assert_eq!(
        (events[up], events[sync_up], events[vrrp_up]),
        (ring_holds - 1, 1, 1),
        "{events:?}"
    );
    let mut got = Burst::new();
    assert_eq!(punted.vrrp.dequeue(&mut got), 1);
    assert_eq!(got.packet(0), &advert[..], "the advert, as sent");
    got.free_all();
    // The forged answers wait on the punt ring; every mbuf goes back to the pool.
    let mut waiting = 0;
    loop {
        let n = punted.punted.dequeue(&mut got);
        if n == 0 {
            break;
        }
        waiting += n as u64;
        got.free_all();
    }
    assert_eq!(waiting, ring_holds);
    // What the worker sent the peer meanwhile (ARP requests for the real server).
    while prx.rx(&mut got) > 0 {
        got.free_all();
    }
    assert_eq!(pool.in_use(), 0, "mbufs leaked");
}
