//! `sluicectl neigh` as text.
use crate::control::report::NeighboursReport;
use std::fmt::Write;

/// The workers of a row: `all` when every worker, else the list.
fn workers(of: &[u16], all: usize) -> String {
    if of.len() == all && all > 1 {
        return "all".into();
    }
    let list: Vec<String> = of.iter().map(u16::to_string).collect();
    list.join(",")
}

/// `sluicectl neigh`: one line per address and MAC (the workers that hold it so, the
/// freshest age), then the real servers some worker has not resolved.
pub fn render_neighbours(r: &NeighboursReport) -> String {
    let mut out = String::new();
    for w in &r.workers {
        let _ = writeln!(
            out,
            "worker {}: IPv4 {} of {}, IPv6 {} of {}",
            w.worker, w.ipv4, w.capacity, w.ipv6, w.capacity6
        );
    }
    let all = r.workers.len();
    let _ = writeln!(
        out,
        "{:<40} {:<17} {:<11} {:>9} Workers",
        "Address", "MAC", "Role", "Age"
    );
    for n in &r.neighbours {
        let _ = writeln!(
            out,
            "{:<40} {:<17} {:<11} {:>8.1}s {}",
            n.address,
            n.mac,
            n.role,
            n.age_ms as f64 / 1000.0,
            workers(&n.workers, all)
        );
    }
    for u in &r.unresolved {
        let _ = writeln!(
            out,
            "{:<40} {:<17} {:<11} {:>9} {}",
            u.address,
            "(unresolved)",
            "real_server",
            "-",
            workers(&u.workers, all)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::render_neighbours;
    use crate::control::report::{
        NeighbourStatus, NeighboursReport, UnresolvedNeighbour, WorkerNeighbourTables,
    };

    #[test]
    fn neighbours_show_each_address_mac_and_the_unresolved_real_servers() {
        let tables = |worker| WorkerNeighbourTables {
            worker,
            ipv4: 2,
            ipv6: 1,
            capacity: 4096,
            capacity6: 2048,
        };
        let r = NeighboursReport {
            workers: vec![tables(0), tables(1)],
            neighbours: vec![
                NeighbourStatus {
                    address: "198.18.0.11".parse().unwrap(),
                    mac: "02:00:00:00:00:11".into(),
                    role: "real_server".into(),
                    workers: vec![0, 1],
                    age_ms: 1_260,
                },
                NeighbourStatus {
                    address: "2001:db8::11".parse().unwrap(),
                    mac: "02:00:00:00:00:21".into(),
                    role: "other".into(),
                    workers: vec![1],
                    age_ms: 61_000,
                },
            ],
            unresolved: vec![UnresolvedNeighbour {
                address: "198.18.0.13".parse().unwrap(),
                workers: vec![0, 1],
            }],
        };
        assert_eq!(
            render_neighbours(&r),
            "worker 0: IPv4 2 of 4096, IPv6 1 of 2048\n\
             worker 1: IPv4 2 of 4096, IPv6 1 of 2048\n\
             Address                                  MAC               Role              Age Workers\n\
             198.18.0.11                              02:00:00:00:00:11 real_server      1.3s all\n\
             2001:db8::11                             02:00:00:00:00:21 other           61.0s 1\n\
             198.18.0.13                              (unresolved)      real_server         - all\n"
        );
    }
}
