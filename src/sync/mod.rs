//! Session sync and failover foundations for high availability: what an
//! active node tells its standby about sessions, how the standby checks it, and the
//! VRRPv3 state machine that decides which node is active. Pure and tested; the daemon
//! wires them up (`crate::daemon::sync`, `crate::daemon::vrrp`). See `docs/SYNC.md`.
//!
//! - [`wire`]: the versioned sync message format (header, records, builder).
//! - [`auth`]: the optional HMAC-SHA256 trailer.
//! - [`events`]: per-worker bounded event rings and the IPVS-style sync policy.
//! - [`sender`]: batching drained events into messages, dumps, resync requests.
//! - [`receiver`]: validation of a received datagram, reject counters, and which
//!   worker owns a synced session.
//! - [`peers`]: per-peer sequence tracking (lost, reordered, restarts), the time since
//!   each peer was last heard, and the progress and retries of a bulk resync.
//! - [`templates`]: persistence templates: which to send, mapping them to and from
//!   identities, installing a peer's.
//! - [`frame`]: sync datagrams as Ethernet/IPv4/UDP frames, for sync over a DPDK port.
//! - [`vrrp`]: the VRRPv3 (RFC 5798) state machine; the packet is `crate::wire::vrrp`.
pub mod auth;
pub mod events;
pub mod frame;
pub mod peers;
pub mod receiver;
pub mod sender;
pub mod templates;
pub mod vrrp;
pub mod wire;
