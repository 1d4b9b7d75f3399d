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
pub mod query;
pub mod realserver_stats;
pub mod sync_events;
pub mod worker;
