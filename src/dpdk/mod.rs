//! The thin, owning layer over DPDK. Every DPDK object is released by the `Drop` of its
//! last Rust owner (a port shares its device with its queue handles, a ring port its
//! rings with its pair, a pool with the ports that refill from it), and nothing is
//! built before the EAL is up or left alive by its cleanup; per-lcore objects
//! (`RxQueue`, `TxQueue`) are `Send` but not `Sync`, so the type system keeps a queue on
//! one lcore. Packet bytes are reached through mbuf fields read from Rust, never through
//! a per-packet FFI call.
mod burst;
mod eal;
mod error;
mod lcore;
mod mempool;
mod port;
mod ring;
mod threads;

pub use burst::{Burst, Packet, BURST_SIZE};
pub use eal::Eal;
pub use error::DpdkError;
pub use lcore::{
    current_lcore, launch_on_lcore, register_thread, tsc, tsc_hz, wait_lcore, LaunchError,
    LcoreJobs,
};
pub use mempool::{Mempool, PoolFootprint, MBUF_DATA_ROOM};
pub use port::{
    DeviceLimits, LinkStatus, Port, PortSettings, PortStats, RssSettings, RxQueue, TxQueue,
};
pub use ring::{PacketRing, RingConsumer, RingPortPair, RingProducer, SharedProducer};
pub use threads::{cpu_list, spawn_helper, thread_cpus};
