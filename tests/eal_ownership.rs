//! The DPDK layer's ownership rules, on a real EAL (net_ring ports, no huge pages):
//! nothing is built before the EAL is up; an ethdev has one `Port`; a port is not
//! stopped or reconfigured while a queue handle is alive, and its device is closed
//! only when the port and every handle are gone; a ring port pair's rings outlive
//! their devices, also when the pair fails half-way; a pool is not freed with mbufs
//! out, nor while a port refills from it; lcore launches are checked; and the EAL is
//! not cleaned up while a DPDK object is alive.
//! One test function only: the EAL initialises once per process.
mod common;

use common::eal::eal_args;
use sluice::dpdk::{
    launch_on_lcore, wait_lcore, Burst, Eal, Mempool, PacketRing, Port, PortSettings, RingPortPair,
};
use std::ffi::CString;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

fn pool_exists(name: &str) -> bool {
    let c = CString::new(name).unwrap();
    // SAFETY: a lookup by name in the EAL's list of pools; the EAL is up.
    !unsafe { dpdk_sys::rte_mempool_lookup(c.as_ptr()) }.is_null()
}

fn ring_exists(name: &str) -> bool {
    let c = CString::new(name).unwrap();
    // SAFETY: a lookup by name in the EAL's list of rings; the EAL is up.
    !unsafe { dpdk_sys::rte_ring_lookup(c.as_ptr()) }.is_null()
}

/// Whether the ethdev `name` exists (a ring port's is `net_ring_<name>`).
fn ethdev_exists(name: &str) -> bool {
    let c = CString::new(name).unwrap();
    let mut id = 0u16;
    // SAFETY: c is a C string, id a valid out pointer; the EAL is up.
    unsafe { dpdk_sys::rte_eth_dev_get_port_by_name(c.as_ptr(), &mut id) == 0 }
}

fn settings() -> PortSettings {
    PortSettings {
        queues: 1,
        rx_desc: 64,
        tx_desc: 64,
        ..Default::default()
    }
}

/// A single-producer ring made outside the wrapper, for a device the test owns.
fn raw_ring(name: &str) -> *mut dpdk_sys::rte_ring {
    let c = CString::new(name).unwrap();
    // SAFETY: a valid name; the EAL is up.
    let ring = unsafe {
        dpdk_sys::rte_ring_create(
            c.as_ptr(),
            64,
            dpdk_sys::SOCKET_ID_ANY,
            dpdk_sys::RING_F_SP_ENQ | dpdk_sys::RING_F_SC_DEQ,
        )
    };
    assert!(!ring.is_null(), "rte_ring_create({name})");
    ring
}

#[test]
fn dpdk_objects_are_owned_and_outlive_what_points_at_them() {
    // Nothing is built, and no job launched, before the EAL is up.
    assert!(Mempool::new("early_pool", 63, 0, 2048).is_err());
    assert!(PacketRing::single_producer("early_ring", 64).is_err());
    assert!(Port::new(0).is_err());
    assert!(launch_on_lcore(1, || 0).is_err());

    let eal = Eal::init(&eal_args("eal_ownership"))
        .expect("EAL init (run scripts/setup.sh; tests need root)");
    lcore_launches_are_checked();

    let pool = Arc::new(Mempool::new("own_pool", 1023, 0, 2048).unwrap());
    let RingPortPair { mut a, mut b } = RingPortPair::new("own", 1, 64).unwrap();
    let (a_id, b_id) = (a.id(), b.id());

    // One Port per ethdev.
    let twice = Port::new(a_id).err().expect("a second Port for port a");
    assert!(twice.message.contains("already owned"), "{twice}");
    assert!(Port::new(dpdk_sys::RTE_MAX_ETHPORTS as u16).is_err());
    assert!(Port::new(dpdk_sys::RTE_MAX_ETHPORTS as u16 - 1).is_err());

    // The port keeps the pool its RX queues refill from.
    let refill = Arc::new(Mempool::new("refill_pool", 63, 0, 2048).unwrap());
    a.configure(&settings(), &refill).unwrap();
    b.configure(&settings(), &pool).unwrap();
    drop(refill);
    assert!(pool_exists("refill_pool"), "freed under port a's RX queue");
    a.start().unwrap();
    b.start().unwrap();

    // Not stopped, reconfigured or started while a queue handle is alive.
    let queues = a.take_queues().unwrap();
    let stop = a.stop().expect_err("stop with a queue handle alive");
    assert!(stop.message.contains("queue handles"), "{stop}");
    assert!(a.configure(&settings(), &pool).is_err());
    drop(queues);
    a.stop().unwrap();
    a.configure(&settings(), &pool).unwrap();
    let queues = a.take_queues().unwrap();
    let start = a.start().expect_err("start with a queue handle alive");
    assert!(start.message.contains("queue handles"), "{start}");
    drop(queues);
    // Queues are handed out once per configuration.
    a.configure(&settings(), &pool).unwrap();
    a.start().unwrap();

    // Dropping the port with a handle alive leaves the device open for the handle;
    // the last of them closes it and releases the pools it refilled from, while the
    // rings it shares with the other port stay until that one goes too.
    let (rx, tx) = a.take_queues().unwrap().pop().unwrap();
    drop(a);
    assert!(
        ethdev_exists("net_ring_own_a"),
        "closed under a live queue handle"
    );
    assert!(Port::new(a_id).is_err(), "still owned through its handles");
    drop((rx, tx));
    assert!(
        !ethdev_exists("net_ring_own_a"),
        "closed once the last handle went"
    );
    assert!(
        !pool_exists("refill_pool"),
        "freed with the port it refilled"
    );
    assert!(ring_exists("own_ab0") && ring_exists("own_ba0"));
    drop(b);
    assert!(!ethdev_exists("net_ring_own_b"));
    assert!(!ring_exists("own_ab0") && !ring_exists("own_ba0"));
    assert!(Port::new(b_id).is_err(), "no such ethdev any more");

    // A pair whose second device cannot be made (its name is taken) closes the first
    // before freeing the rings it points at.
    let (rx, tx) = (raw_ring("taken_rx"), raw_ring("taken_tx"));
    let taken = CString::new("half_b").unwrap();
    assert!(!ethdev_exists("net_ring_half_b"));
    // SAFETY: one live ring each way, freed below only after the device is closed.
    let taken_id = unsafe { dpdk_sys::rte_eth_from_rings(taken.as_ptr(), &rx, 1, &tx, 1, 0) };
    assert!(taken_id >= 0, "rte_eth_from_rings(half_b)");
    assert!(RingPortPair::new("half", 1, 64).is_err());
    assert!(
        !ethdev_exists("net_ring_half_a"),
        "the first device outlived its pair"
    );
    assert!(!ring_exists("half_ab0") && !ring_exists("half_ba0"));
    // SAFETY: the test's own device, then its rings, which nothing else uses.
    unsafe {
        assert_eq!(dpdk_sys::rte_eth_dev_close(taken_id as u16), 0);
        dpdk_sys::rte_ring_free(rx);
        dpdk_sys::rte_ring_free(tx);
    }

    // A pool with mbufs out is leaked, not freed: they still point into it.
    let leaky = Mempool::new("leaky_pool", 63, 0, 2048).unwrap();
    let mut out = Burst::new();
    assert!(out.alloc_from(&leaky, 4));
    drop(leaky);
    if !pool_exists("leaky_pool") {
        // The mbufs point into freed memory: never touch them.
        std::mem::forget(out);
        panic!("a pool with mbufs out was freed");
    }
    out.free_all();
    let fine = Mempool::new("fine_pool", 63, 0, 2048).unwrap();
    assert!(out.alloc_from(&fine, 4));
    out.free_all();
    drop(fine);
    assert!(
        !pool_exists("fine_pool"),
        "a pool with every mbuf back is freed"
    );
    assert_eq!(pool.in_use(), 0);
    drop(pool);

    // The leaked pool (and this ring) still live in the EAL's memory: dropping the
    // EAL skips its cleanup, and they stay usable.
    let (producer, consumer) = PacketRing::single_producer("late_ring", 64).unwrap();
    drop(eal);
    let after = Mempool::new("after_pool", 63, 0, 2048).expect("the EAL is still up");
    let mut one = Burst::new();
    assert!(one.alloc_from(&after, 1));
    assert_eq!(producer.enqueue(&mut one), 1);
    assert_eq!(consumer.count(), 1);
    drop((producer, consumer));
    assert_eq!(after.in_use(), 0, "the ring returned its mbuf");
}

/// Launches on lcores the EAL does not run jobs on are refused, before any DPDK call
/// indexes its lcore table with them; a launch on a busy lcore is refused and its job
/// never runs.
fn lcore_launches_are_checked() {
    for lcore in [dpdk_sys::RTE_MAX_LCORE, u32::MAX, 0, 5] {
        assert!(launch_on_lcore(lcore, || 0).is_err(), "launch on {lcore}");
        assert!(wait_lcore(lcore).is_err(), "wait for {lcore}");
    }
    let release = Arc::new(AtomicBool::new(false));
    let runs = Arc::new(AtomicU32::new(0));
    let (go, count) = (release.clone(), runs.clone());
    launch_on_lcore(1, move || {
        count.fetch_add(1, Ordering::SeqCst);
        while !go.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(1));
        }
        7
    })
    .unwrap();
    let count = runs.clone();
    let busy = launch_on_lcore(1, move || {
        count.fetch_add(100, Ordering::SeqCst);
        0
    });
    assert!(busy.is_err(), "lcore 1 is busy");
    release.store(true, Ordering::SeqCst);
    assert_eq!(wait_lcore(1).unwrap(), 7);
    assert_eq!(runs.load(Ordering::SeqCst), 1, "only the first job ran");
}
