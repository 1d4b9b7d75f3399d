//! High availability: the protocols between Sluice nodes. Pure and tested; the daemon
//! wires them to sockets, ports and timers (`crate::daemon`). See `docs/SYNC.md`.
//!
//! - [`bgp`]: whether this node announces each VIP, told to BIRD 2 through an include
//!   file and `birdc` (docs/CLUSTER.md).
//! - [`sync`]: session sync to standby nodes (authentication, batching, validation,
//!   per-peer sequence tracking, persistence templates, frames over a DPDK port). Its
//!   message format is `crate::session::replication`; the workers' event rings are
//!   `crate::dataplane::sync_events`.
//! - [`vrrp`]: VRRPv3 (RFC 5798), interoperable with keepalived: the state machine and
//!   the node that feeds it frames and sends its advertisements.
pub mod auth;
pub mod bgp;
pub mod sync;
pub mod vrrp;
