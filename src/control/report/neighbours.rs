//! `sluicectl neigh`: what the workers' neighbour tables hold (IPv4 ARP and IPv6
//! Neighbor Discovery), and which real servers some worker has not resolved.
//!
//! Each worker keeps its own tables (worker 0 learns from ARP and Neighbor
//! Advertisements, the others from what it shares and from their own requests), so the
//! listing says, for each address and MAC, which workers hold it: two MACs for one
//! address, or a real server missing on one worker, is what an operator looks for when
//! one worker's share of the connections fails.
use crate::dataplane::query::{NeighbourEntry, NeighbourRole, NeighbourTables};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::IpAddr;

/// `sluicectl neigh`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NeighboursReport {
    /// How full each worker's tables are.
    pub workers: Vec<WorkerNeighbourTables>,
    /// One row per address and MAC, IPv4 before IPv6, by address.
    pub neighbours: Vec<NeighbourStatus>,
    /// Real servers of the current services with no entry on some worker: that
    /// worker holds their packets while it asks (and drops them if nobody answers).
    pub unresolved: Vec<UnresolvedNeighbour>,
}

/// One worker's tables.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WorkerNeighbourTables {
    pub worker: u16,
    pub ipv4: usize,
    pub ipv6: usize,
    /// Entries the IPv4 table holds at most, and the IPv6 one (`[sessions]
    /// neighbours`, both).
    pub capacity: usize,
    #[serde(default)]
    pub capacity6: usize,
}

/// An address with one MAC, on the workers that hold it so.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NeighbourStatus {
    pub address: IpAddr,
    /// `aa:bb:cc:dd:ee:ff`.
    pub mac: String,
    /// `real_server`, `peer` (`[vrrp] peers`, `[sync] peers`) or `other`.
    pub role: String,
    /// The workers whose table maps the address to this MAC, ascending.
    pub workers: Vec<u16>,
    /// Milliseconds since one of those workers last learned or confirmed it (the
    /// youngest of their entries).
    pub age_ms: u64,
}

/// A real server some worker has no entry for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UnresolvedNeighbour {
    pub address: IpAddr,
    /// The workers without an entry, ascending.
    pub workers: Vec<u16>,
}

/// The name a role has in the report.
pub fn role_name(role: NeighbourRole) -> &'static str {
    match role {
        NeighbourRole::RealServer => "real_server",
        NeighbourRole::Peer => "peer",
        NeighbourRole::Static => "static",
        NeighbourRole::Other => "other",
    }
}

impl NeighboursReport {
    /// The report from every worker's entries and table sizes (`tables`, one per
    /// worker, in worker order), with `real_servers` the current services' real-server
    /// addresses.
    pub fn build(
        tables: &[(u16, NeighbourTables)],
        entries: &[NeighbourEntry],
        real_servers: &[IpAddr],
    ) -> NeighboursReport {
        let workers = tables
            .iter()
            .map(|&(worker, t)| WorkerNeighbourTables {
                worker,
                ipv4: t.ipv4,
                ipv6: t.ipv6,
                capacity: t.capacity,
                capacity6: t.capacity6,
            })
            .collect();
        // IpAddr orders IPv4 before IPv6, each by address.
        let mut rows: BTreeMap<(IpAddr, [u8; 6]), NeighbourStatus> = BTreeMap::new();
        for e in entries {
            let row = rows
                .entry((e.ip, e.mac.0))
                .or_insert_with(|| NeighbourStatus {
                    address: e.ip,
                    mac: e.mac.to_string(),
                    role: role_name(e.role).to_string(),
                    workers: Vec::new(),
                    age_ms: e.age_ms,
                });
            row.workers.push(e.worker);
            row.age_ms = row.age_ms.min(e.age_ms);
        }
        let mut neighbours: Vec<NeighbourStatus> = rows.into_values().collect();
        for row in &mut neighbours {
            row.workers.sort_unstable();
            row.workers.dedup();
        }
        let mut wanted = real_servers.to_vec();
        wanted.sort_unstable();
        wanted.dedup();
        // Built once: tens of thousands of real servers times every worker's entries
        // would otherwise stall the management loop that builds this.
        let held: std::collections::HashSet<(IpAddr, u16)> =
            entries.iter().map(|e| (e.ip, e.worker)).collect();
        let unresolved = wanted
            .into_iter()
            .filter_map(|address| {
                let missing: Vec<u16> = tables
                    .iter()
                    .map(|&(worker, _)| worker)
                    .filter(|&w| !held.contains(&(address, w)))
                    .collect();
                (!missing.is_empty()).then_some(UnresolvedNeighbour {
                    address,
                    workers: missing,
                })
            })
            .collect();
        NeighboursReport {
            workers,
            neighbours,
            unresolved,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::MacAddr;

    fn entry(worker: u16, ip: &str, mac: u8, age_ms: u64, role: NeighbourRole) -> NeighbourEntry {
        NeighbourEntry {
            worker,
            ip: ip.parse().unwrap(),
            mac: MacAddr([2, 0, 0, 0, 0, mac]),
            age_ms,
            role,
        }
    }

    #[test]
    fn neighbours_are_grouped_by_address_and_mac_with_the_workers_missing_a_real_server() {
        let t = NeighbourTables {
            ipv4: 2,
            ipv6: 1,
            capacity: 4096,
            capacity6: 4096,
        };
        let rs = NeighbourRole::RealServer;
        let entries = [
            entry(1, "198.18.0.11", 0x11, 900, rs),
            entry(0, "198.18.0.11", 0x11, 300, rs),
            entry(0, "2001:db8::11", 0x21, 5, rs),
            // Worker 1 still has the MAC the real server had before it moved.
            entry(0, "198.18.0.12", 0x12, 10, rs),
            entry(1, "198.18.0.12", 0x99, 70_000, rs),
            entry(0, "198.18.0.2", 0x02, 1, NeighbourRole::Peer),
        ];
        let real_servers: Vec<IpAddr> = ["198.18.0.13", "2001:db8::11", "198.18.0.11"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect();
        let r = NeighboursReport::build(&[(0, t), (1, t)], &entries, &real_servers);
        let rows: Vec<(String, &str, &str, Vec<u16>, u64)> = r
            .neighbours
            .iter()
            .map(|n| {
                (
                    n.address.to_string(),
                    n.mac.as_str(),
                    n.role.as_str(),
                    n.workers.clone(),
                    n.age_ms,
                )
            })
            .collect();
        assert_eq!(
            rows,
            [
                ("198.18.0.2".into(), "02:00:00:00:00:02", "peer", vec![0], 1),
                (
                    "198.18.0.11".into(),
                    "02:00:00:00:00:11",
                    "real_server",
                    vec![0, 1],
                    300
                ),
                (
                    "198.18.0.12".into(),
                    "02:00:00:00:00:12",
                    "real_server",
                    vec![0],
                    10
                ),
                (
                    "198.18.0.12".into(),
                    "02:00:00:00:00:99",
                    "real_server",
                    vec![1],
                    70_000
                ),
                (
                    "2001:db8::11".into(),
                    "02:00:00:00:00:21",
                    "real_server",
                    vec![0],
                    5
                ),
            ]
        );
        let unresolved: Vec<(String, Vec<u16>)> = r
            .unresolved
            .iter()
            .map(|u| (u.address.to_string(), u.workers.clone()))
            .collect();
        assert_eq!(
            unresolved,
            [
                ("198.18.0.13".to_string(), vec![0, 1]),
                ("2001:db8::11".to_string(), vec![1]),
            ]
        );
        assert_eq!(r.workers.len(), 2);
        assert_eq!((r.workers[1].worker, r.workers[1].ipv4), (1, 2));
    }
}
