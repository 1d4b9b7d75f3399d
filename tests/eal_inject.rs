//! EAL integration over net_ring: frames the management core hands worker 0 to send
//! (the inject ring), built with zero MACs for the worker to address. A health probe
//! to a real server the worker has not resolved goes out as a broadcast ARP request
//! for it from the port, in the probe's place, although the probe is shorter than an
//! ARP frame (an IPv4 SYN probe is 58 bytes, a RST 54, an ARP frame 60); so does a
//! short frame to a unicast VRRP peer. None leaves with the zero MACs it was built
//! with, and one whose destination cannot be read is dropped. Once the real server
//! answered, a probe goes to its MAC from the port's.
//! One test function only: the EAL initialises once per process.
mod common;

use common::eal::{eal_args, forwarder_config, ring_ports, worker_from, LB_MAC};
use sluice::dataplane::mesh::Injected;
use sluice::dpdk::{launch_on_lcore, wait_lcore, Burst, Eal, Mempool, RingPortPair};
use sluice::emulator::frames::{self, Frame};
use sluice::health::probe;
use sluice::model::DropReason;
use sluice::service::{ServiceTable, Snapshot, SnapshotPublisher};
use sluice::wire::tcp::TcpFlags;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

const REAL_MAC: [u8; 6] = [0x02, 0x52, 0x45, 0x41, 0x4c, 1];

#[test]
fn injected_frames_to_unresolved_addresses_become_arp_requests_never_unaddressed_frames() {
    let _eal = Eal::init(&eal_args("eal_inject"))
        .expect("EAL init (run scripts/setup.sh; tests need root)");
    let pool = Arc::new(Mempool::new("test_pool", 4095, 64, 2048).unwrap());
    let pair = RingPortPair::new("t", 1, 256).unwrap();
    let (mut lb, mut peer) = ring_ports(pair, &pool);
    let lb_ip = Ipv4Addr::new(198, 18, 0, 1);
    let real = Ipv4Addr::new(198, 18, 0, 11);
    let vrrp_peer = Ipv4Addr::new(198, 18, 0, 2);
    let publisher = SnapshotPublisher::new(Snapshot::build(1, &ServiceTable::new()));
    let (worker, counters, stop, punted) = worker_from(
        "eal_inject",
        &mut lb,
        (lb_ip, &[]),
        &pool,
        forwarder_config(&publisher),
        None,
    );
    launch_on_lcore(1, move || worker.run()).unwrap();
    let (mut prx, mut ptx) = peer.take_queues().unwrap().pop().unwrap();

    // Built as the management core builds them (`health::probe`): no MACs, the SYN
    // with its MSS option, 58 bytes.
    let segment = |to: Ipv4Addr, buf: &mut [u8; probe::MAX_FRAME_LEN]| {
        let ends = probe::Endpoints {
            local: SocketAddr::from((lb_ip, 50000)),
            remote: SocketAddr::from((to, 80)),
        };
        probe::write_segment(buf, &ends, 1, 0, TcpFlags::SYN, Some(1460), &[])
    };
    let inject = |kind: Injected, frame: &[u8]| {
        let mut b = Burst::new();
        assert!(b.push_copy(&pool, frame));
        b.set_user_tag(0, kind.tag());
        assert_eq!(punted.inject.enqueue(&mut b), 1, "inject ring full");
    };
    // The frames the worker sends within `wait` (stops early at `want`).
    let mut sent = |want: usize, wait: Duration| -> Vec<Vec<u8>> {
        let mut got = Vec::new();
        let mut burst = Burst::new();
        let deadline = Instant::now() + wait;
        while got.len() < want && Instant::now() < deadline {
            if prx.rx(&mut burst) == 0 {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            got.extend((0..burst.len()).map(|i| burst.packet(i).to_vec()));
            burst.free_all();
        }
        got
    };
    let unresolved = || counters.drops_snapshot()[DropReason::NeighbourUnresolved as usize];
    let arp_request_for = |f: &[u8], target: Ipv4Addr| match frames::parse(f) {
        Frame::Arp(a) => {
            assert_eq!(f.len(), 60, "padded to Ethernet's minimum");
            assert_eq!(
                (a.eth_dst, a.eth_src, a.operation),
                ([0xff; 6], LB_MAC, 1),
                "a broadcast request from the port: {f:02x?}"
            );
            assert_eq!((a.sender_mac, a.sender_ip), (LB_MAC, lb_ip));
            assert_eq!(a.target_ip, target);
        }
        other => panic!("not an ARP request: {other:?} {f:02x?}"),
    };

    // A probe (shorter than an ARP frame) to an unresolved real server: an ARP
    // request for it takes its place.
    let mut buf = [0u8; probe::MAX_FRAME_LEN];
    let len = segment(real, &mut buf);
    assert_eq!(len, 58, "the case needs a probe shorter than an ARP frame");
    inject(Injected::HealthProbe, &buf[..len]);
    let out = sent(1, Duration::from_secs(5));
    assert_eq!(out.len(), 1, "{out:02x?}");
    arp_request_for(&out[0], real);
    assert_eq!(unresolved(), 1);

    // The same for a short frame to a unicast VRRP peer (addressed by IP only).
    let len = segment(vrrp_peer, &mut buf);
    inject(Injected::Addressed, &buf[..len]);
    let out = sent(1, Duration::from_secs(5));
    assert_eq!(out.len(), 1, "{out:02x?}");
    arp_request_for(&out[0], vrrp_peer);
    assert_eq!(unresolved(), 2);

    // A probe whose IPv4 header cannot be read has no address to resolve: dropped.
    let mut broken = buf;
    broken[14] = 0x4f; // a header length of 60 bytes, longer than the frame's
    inject(Injected::HealthProbe, &broken[..len]);
    let out = sent(1, Duration::from_millis(300));
    assert!(out.is_empty(), "sent: {out:02x?}");

    // The real server answers the ARP; the next probe goes to its MAC, from the port's.
    let mut reply = Burst::new();
    assert!(reply.alloc_from(&pool, 1));
    reply.set_packet_len(0, 60);
    let n = frames::arp_reply(reply.packet_mut(0), REAL_MAC, real, LB_MAC, lb_ip);
    reply.set_packet_len(0, n.max(60) as u16);
    assert_eq!(ptx.tx(&mut reply), 1);
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut out = Vec::new();
    while out.is_empty() && Instant::now() < deadline {
        let len = segment(real, &mut buf);
        inject(Injected::HealthProbe, &buf[..len]);
        out = sent(1, Duration::from_millis(100))
            .into_iter()
            .filter(|f| !matches!(frames::parse(f), Frame::Arp(_)))
            .collect();
    }
    assert_eq!(out.len(), 1, "no probe sent once the real server answered");
    assert_eq!(out[0][..6], REAL_MAC, "to the real server's MAC");
    assert_eq!(out[0][6..12], LB_MAC, "from the port's");
    assert_eq!(out[0].len(), 58);

    stop.store(true, Ordering::Relaxed);
    wait_lcore(1).unwrap();
}
