//! The ipvsadm-style listings of the service table: `-L` (services and real servers
//! with counters and rates, also read by `sluicectl skew` and `-S`), `-L --timeout`
//! and `--get-laddr`.
use crate::model::ServiceKey;
use serde::{Deserialize, Serialize};
use std::net::Ipv4Addr;

/// `sluicectl -L`: virtual services, their real servers and counters summed over
/// workers.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ServicesReport {
    pub services: Vec<ServiceStatus>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ServiceStatus {
    /// "tcp" or "udp".
    pub proto: String,
    pub vip: String,
    pub port: u16,
    pub scheduler: String,
    /// Persistence timeout in seconds, when set (`-p`).
    pub persistence_s: Option<u32>,
    /// Persistence netmask (`-M`), when persistence is set: dotted for an IPv4
    /// service, the prefix length ("64") for an IPv6 one.
    #[serde(default)]
    pub persistence_netmask: Option<String>,
    /// Scheduler flags (`-b`), comma-separated; empty when none.
    #[serde(default)]
    pub sched_flags: String,
    /// Whether some real server can take a new connection (weight > 0); when not,
    /// new connections are dropped and an `lb=alert` line was logged.
    #[serde(default)]
    pub available: bool,
    pub real_servers: Vec<RealServerStatus>,
    /// FullNAT local addresses (`--add-laddr`), in the order they were added. Only in
    /// the JSON: the ipvsadm text layout has no place for them (see `--get-laddr`).
    #[serde(default)]
    pub local_addresses: Vec<String>,
    /// Whether TOA (the client address as a TCP option) is on for FullNAT sessions.
    #[serde(default)]
    pub toa: bool,
    /// Whether sessions open from any TCP segment but an RST (`sloppy_tcp`). Only in
    /// the JSON.
    #[serde(default)]
    pub sloppy_tcp: bool,
    /// The SYN proxy's mode and `auto` rate. Only in the JSON (`-Ln --json`), as
    /// ipvsadm's text layout has no place for it.
    #[serde(default)]
    pub synproxy: crate::model::SynProxy,
    /// The access list and rate limit with the service's admission counts, for a
    /// service that has or had either; only in the JSON and `--acl-list` (the
    /// ipvsadm text layout has no place for it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub admission: Option<super::ServiceAdmission>,
    /// The sorry server (weight 1 while in use, else 0) with its counters, when the
    /// service has one. `real_servers` lists it too (marked `sorry`) while in use, or
    /// always with `inhibit`, as keepalived's entries in IPVS would be.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sorry_server: Option<RealServerStatus>,
    /// Whether the sorry server takes the new connections (no real server can).
    #[serde(default)]
    pub sorry_in_use: bool,
    /// The service's own counters (`-Ln --stats`'s service line). None in a report
    /// from a Sluice that predates them: the listed real servers' sum then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stats: Option<ServiceCounts>,
    /// The service's own rates over `-L --rate`'s window, from its own counters (so
    /// they go on counting real servers removed from it). None in a report from a
    /// Sluice that predates them: the listed real servers' sum then.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rates: Option<ServiceRates>,
}

/// A service's connections, packets and bytes per second, as `-L --rate` shows them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceRates {
    pub cps: u64,
    pub in_pps: u64,
    pub out_pps: u64,
    pub in_bps: u64,
    pub out_bps: u64,
}

/// A service's counters as IPVS keeps them: never backwards while the service exists.
/// They count its real servers, those removed from it since it was added (their
/// sessions may still be carrying traffic), and its sorry server, listed or not.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceCounts {
    pub connections: u64,
    pub in_packets: u64,
    pub out_packets: u64,
    pub in_bytes: u64,
    pub out_bytes: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RealServerStatus {
    pub ip: String,
    pub port: u16,
    pub weight: u32,
    /// "dr", "nat", "tun" or "fullnat".
    pub mode: String,
    pub active: u64,
    pub inactive: u64,
    pub connections: u64,
    pub in_packets: u64,
    pub out_packets: u64,
    pub in_bytes: u64,
    pub out_bytes: u64,
    /// Connection thresholds (`-x`, `-y`); 0 = none.
    #[serde(default)]
    pub upper: u32,
    #[serde(default)]
    pub lower: u32,
    /// Per second over the listing's window (`-L --rate`: 2 s, as IPVS).
    #[serde(default)]
    pub cps: u64,
    #[serde(default)]
    pub in_pps: u64,
    #[serde(default)]
    pub out_pps: u64,
    #[serde(default)]
    pub in_bps: u64,
    #[serde(default)]
    pub out_bps: u64,
    /// Evicted by health checking (no new connections; the weight stays).
    #[serde(default)]
    pub evicted: bool,
    /// Times health checking evicted it.
    #[serde(default)]
    pub evictions: u64,
    /// Its upper connection threshold keeps it from new connections (`-x`/`-y`).
    #[serde(default)]
    pub overloaded: bool,
    /// The service's sorry server (`sorry_server`), not one of its real servers.
    #[serde(default)]
    pub sorry: bool,
    /// keepalived's `sorry_server_inhibit` (sorry server only).
    #[serde(default)]
    pub inhibit: bool,
}

/// `-L --timeout`: the session timeouts in seconds, as ipvsadm names them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimeoutsReport {
    pub tcp: u32,
    pub tcpfin: u32,
    pub udp: u32,
}

/// `--get-laddr`: one service's FullNAT local addresses, in the order they were added,
/// and each worker's port pool on each of them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LaddrReport {
    pub service: ServiceKey,
    pub local_addresses: Vec<std::net::IpAddr>,
    /// Per worker and local address (as DPVS's `dpip addr show -s` per lcore); empty
    /// when the service has no FullNAT real server (no pools) or before traffic.
    #[serde(default)]
    pub pools: Vec<LaddrPoolStatus>,
    /// For the sizing rule: the service's new FullNAT connections per second (`-L
    /// --rate`'s window), the real servers' TIME-WAIT as configured (`[sessions]
    /// server_time_wait`), and the local ports per address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sizing: Option<LaddrSizing>,
}

/// What the local-address sizing rule is computed from (see [`LaddrSizing::needed`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaddrSizing {
    pub connections_per_second: u64,
    pub server_time_wait_s: u32,
    pub ports_per_address: u32,
}

impl LaddrSizing {
    /// Local addresses needed so that no port comes round to a real server within its
    /// TIME-WAIT: rate x TIME-WAIT / ports per address, rounded up (at least 1).
    pub fn needed(&self) -> u64 {
        (self.connections_per_second * u64::from(self.server_time_wait_s))
            .div_ceil(u64::from(self.ports_per_address.max(1)))
            .max(1)
    }
}

/// One worker's ports on one local address.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaddrPoolStatus {
    pub worker: u16,
    pub lip: Ipv4Addr,
    /// Ports this worker has in use on the address.
    pub used: u32,
    /// Ports of this worker's share not in use.
    pub free: u32,
    /// Allocations on this address that found no suitable free port.
    pub misses: u64,
    /// Ports reused towards the same real server within its TIME-WAIT.
    #[serde(default)]
    pub early_reuses: u64,
    /// Of those, the ones without TCP timestamps to rewrite.
    #[serde(default)]
    pub unprotected_reuses: u64,
}
