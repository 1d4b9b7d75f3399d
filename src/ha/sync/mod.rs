//! Session sync: what an active node tells its standby about sessions, and how the
//! standby checks it. Pure and tested; the daemon wires it up (`crate::daemon`). See
//! `docs/SYNC.md`.
//!
//! - The versioned message format (header, records, builder) is
//!   `crate::session::replication`; the workers' event rings and the IPVS-style sync
//!   policy are `crate::dataplane::sync_events`.
//! - [`auth`]: the optional HMAC-SHA256 trailer.
//! - [`sender`]: batching drained events into messages, dumps, resync requests.
//! - [`cursor`]: where a dump stands in the tables, listed a slice per turn.
//! - [`dumps`]: the dumps under way, one per peer, listed and sent in turn.
//! - [`receiver`]: validation of a received datagram, reject counters, and which
//!   worker owns a synced session.
//! - [`peers`]: per-peer sequence tracking (lost, reordered, restarts), the time since
//!   each peer was last heard, and the progress and retries of a bulk resync.
//! - [`templates`]: persistence templates: which to send, mapping them to and from
//!   identities, installing a peer's.
//! - [`frame`]: sync datagrams as Ethernet/IPv4/UDP frames, for sync over a DPDK port.
//! - [`report`]: what `sluicectl sync` shows (counters, per-peer state), as plain values.
pub mod auth;
pub mod cursor;
pub mod dumps;
pub mod frame;
pub mod peers;
pub mod receiver;
pub mod report;
pub mod sender;
pub mod templates;
