//! The worker side: counters, the local responder (ARP/ICMP for the appliance's own
//! addresses), the neighbour table, and the run-to-completion loop.
pub mod awaiting;
pub mod capture;
pub mod counters;
pub mod exception;
pub mod forwarder;
pub mod held;
pub mod loads;
pub mod local;
pub mod mesh;
pub mod neighbour;
pub mod overload;
pub mod probe_acks;
pub mod query;
pub mod realserver_stats;
pub mod sync_events;
pub mod synproxy_retry;
pub mod worker;

/// The management core's loop period: it sleeps this long after each turn's work.
/// What it moves per turn (sync events and datagrams, exception frames, template
/// scans) is bounded per turn, so rates follow from this.
pub const MANAGEMENT_TICK_MS: u32 = 5;
