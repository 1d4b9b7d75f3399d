//! Plain values several layers share: what a service is, which protocols and
//! schedulers it names, how packets reach a real server, why a frame was dropped; and
//! the one pseudo-random generator.
//!
//! This is the layer above `wire` and below everything else (see
//! docs/ARCHITECTURE.md, "Layers"): it imports nothing from the crate, so the flow
//! parser, the rewrites, the schedulers, the session table and the service table can
//! all speak these types without importing each other.
pub mod drop_reason;
pub mod protocol;
pub mod rng;
pub mod scheduler;
pub mod service;
pub mod siphash;

pub use drop_reason::DropReason;
pub use protocol::Protocol;
pub use scheduler::{SchedFlags, SchedulerKind, MH_DEFAULT_TABLE_SIZE};
pub use service::{
    ForwardMode, Persistence, RealServer, RealServerSpec, Service, ServiceKey, SorryServer,
    SorryServerSpec, SynProxy, SynProxyMode, DEFAULT_SYNPROXY_AUTO_SYN_RATE,
    DEFAULT_SYNPROXY_SYN_RETRIES, MAX_CONN_THRESHOLD, MAX_LOCAL_ADDRESSES,
    MAX_PERSISTENCE_TIMEOUT_S, MAX_REAL_SERVER_IDS, MAX_SYNPROXY_SYN_RETRIES, MAX_WEIGHT,
};
