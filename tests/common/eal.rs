//! The EAL test bed of the `eal_*` tests: one EAL per process, a net_ring port
//! pair (the appliance's port and a peer the test drives), and a worker polling the
//! appliance's port on lcore 1.
use sluice::dataplane::capture::{Capture, CaptureTap};
use sluice::dataplane::counters::WorkerCounters;
use sluice::dataplane::forwarder::{Forwarder, ForwarderConfig, RssView};
use sluice::dataplane::local::LocalResponder;
use sluice::dataplane::mesh::Mesh;
use sluice::dataplane::query::Mailbox;
use sluice::dataplane::realserver_stats;
use sluice::dataplane::worker::{Links, Worker, WorkerPort};
use sluice::dpdk::{
    Burst, Mempool, Port, PortSettings, RingConsumer, RingPortPair, RingProducer, TxQueue,
};
use sluice::service::SnapshotPublisher;
use sluice::session::Timeouts;
use std::net::Ipv4Addr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

pub const LB_MAC: [u8; 6] = [0x02, 0x53, 0x4c, 0, 0, 1];

/// EAL arguments: lcores 0 and 1, no huge pages, no PCI, a file prefix of this process.
pub fn eal_args(name: &str) -> Vec<String> {
    let prefix = format!("sl-{name}-{}", std::process::id());
    [
        name,
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

/// Sends `frame` to the appliance's port from the peer's queue `tx`, in an mbuf of
/// `pool`.
pub fn send_frame(tx: &mut TxQueue, pool: &Mempool, frame: &[u8]) {
    let mut out = Burst::new();
    assert!(out.push_copy(pool, frame));
    assert_eq!(tx.tx(&mut out), 1);
}

/// The appliance's port (MAC `LB_MAC`) and the peer's, both started, one queue each.
pub fn ring_ports(pair: RingPortPair, pool: &Arc<Mempool>) -> (Port, Port) {
    let settings = PortSettings {
        queues: 1,
        rx_desc: 256,
        tx_desc: 256,
        mac: Some(LB_MAC),
        ..Default::default()
    };
    let RingPortPair {
        a: mut lb,
        b: mut peer,
    } = pair;
    lb.configure(&settings, pool).unwrap();
    lb.start().unwrap();
    peer.configure(
        &PortSettings {
            mac: None,
            ..settings
        },
        pool,
    )
    .unwrap();
    peer.start().unwrap();
    (lb, peer)
}

/// A worker (id 0) on `lb`'s queue with address `lb_ip` and the services `publisher`
/// publishes; its counters and stop flag for the test.
pub fn worker(
    name: &str,
    lb: &mut Port,
    lb_ip: Ipv4Addr,
    pool: &Arc<Mempool>,
    publisher: &SnapshotPublisher,
) -> (Worker, Arc<WorkerCounters>, Arc<AtomicBool>) {
    worker_with(name, lb, (lb_ip, &[]), pool, publisher, None)
}

/// As [`worker`], with IPv6 addresses on the port and an exception path.
pub fn worker_with(
    name: &str,
    lb: &mut Port,
    (lb_ip, lb_ip6): (Ipv4Addr, &[std::net::Ipv6Addr]),
    pool: &Arc<Mempool>,
    publisher: &SnapshotPublisher,
    exception: Option<sluice::dataplane::exception::ExceptionLink>,
) -> (Worker, Arc<WorkerCounters>, Arc<AtomicBool>) {
    // The management core's ends (inject producer, punt consumers) are dropped: these
    // tests inject nothing and read no punted frames.
    let (worker, counters, stop, _punted) = worker_from(
        name,
        lb,
        (lb_ip, lb_ip6),
        pool,
        forwarder_config(publisher),
        exception,
    );
    (worker, counters, stop)
}

/// The forwarder config of [`worker`]: the services `publisher` publishes, one
/// worker.
pub fn forwarder_config(publisher: &SnapshotPublisher) -> ForwarderConfig {
    let hz = sluice::dpdk::tsc_hz();
    ForwarderConfig::new(
        1024,
        publisher.reader(),
        Timeouts::default().in_ticks(100),
        hz / 10,
        hz,
        Arc::new(realserver_stats::new_table()),
        RssView::default_spread(1, 0),
    )
}

/// The management core's ends of the rings the worker hands frames up on: the punt
/// ring and the VRRP ring.
pub struct Punted {
    pub punted: RingConsumer,
    pub vrrp: RingConsumer,
    pub sync: RingConsumer,
    /// The management core's end of the inject ring (frames for worker 0 to send).
    pub inject: RingProducer,
}

/// As [`worker_with`], the worker's forwarder made from `config`, with the ends of
/// the rings it hands frames up on.
pub fn worker_from(
    name: &str,
    lb: &mut Port,
    (lb_ip, lb_ip6): (Ipv4Addr, &[std::net::Ipv6Addr]),
    pool: &Arc<Mempool>,
    config: ForwarderConfig,
    exception: Option<sluice::dataplane::exception::ExceptionLink>,
) -> (Worker, Arc<WorkerCounters>, Arc<AtomicBool>, Punted) {
    let forwarder = Forwarder::new(config);
    let (rx, tx) = lb.take_queues().unwrap().pop().unwrap();
    let counters = Arc::new(WorkerCounters::default());
    let stop = Arc::new(AtomicBool::new(false));
    let (mesh, ends) = Mesh::new(name, 1).unwrap();
    let inbox = ends.redirect_inboxes.into_iter().next().unwrap();
    let worker = Worker::new(
        0,
        pool.clone(),
        vec![WorkerPort {
            rx,
            tx,
            responder: LocalResponder::new(LB_MAC, &[(lb_ip, 24)]).with_ipv6(lb_ip6),
            addr: lb_ip,
            mtu: 1500,
            exception,
        }],
        forwarder,
        counters.clone(),
        Links {
            stop: stop.clone(),
            mesh: Arc::new(mesh),
            inbox,
            inject: Some(ends.inject_out),
            mailbox: Arc::new(Mailbox::default()),
            capture: CaptureTap::new(Arc::new(Capture::new(1)), 0),
        },
    );
    let punted = Punted {
        punted: ends.punted,
        vrrp: ends.vrrp_punted,
        sync: ends.sync_punted,
        inject: ends.inject_in,
    };
    (worker, counters, stop, punted)
}
