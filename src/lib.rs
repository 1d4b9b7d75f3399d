//! Sluice: an L4 load-balancing appliance on DPDK.
//!
//! Packet logic (`wire`, `dataplane::local`, ...) works on byte slices and is testable
//! without DPDK; `dpdk` is the thin owning layer over the C library.
pub mod config;
pub mod control;
pub mod daemon;
pub mod dataplane;
pub mod dpdk;
pub mod emulator;
pub mod flow;
pub mod forward;
pub mod ha;
pub mod health;
pub mod model;
pub mod sched;
pub mod service;
pub mod session;
pub mod simulate;
pub mod wire;
