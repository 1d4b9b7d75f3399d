//! Schedulers: which real server gets a new connection. One trait, one file each.
//!
//! A scheduler runs only when a connection is new (a TCP SYN, the first UDP packet):
//! established sessions are forwarded from the session table without asking it.
//!
//! **State is per worker.** Each worker builds its own scheduler instances from the
//! snapshot it reads and rebuilds them when it picks up a new snapshot, so `pick` takes
//! `&mut self` and needs no locks or atomics. The consequence: with N workers, each
//! runs its own sequence. Round robin over 3 servers with 2 workers gives each worker
//! `a b c a b c ...` over the connections *it* sees, so the global spread is exact only
//! per worker, and over many connections the sum converges to the same proportions.
use crate::service::model::RealServer;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

pub mod rr;
pub mod wrr;

pub use rr::RoundRobin;
pub use wrr::SmoothWeightedRoundRobin;

/// The scheduling algorithms, by their ipvsadm names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SchedulerKind {
    /// Round robin over real servers with weight > 0.
    Rr,
    /// Smooth weighted round robin (nginx semantics).
    Wrr,
}

impl SchedulerKind {
    pub const ALL: &'static [SchedulerKind] = &[SchedulerKind::Rr, SchedulerKind::Wrr];

    pub fn name(self) -> &'static str {
        match self {
            SchedulerKind::Rr => "rr",
            SchedulerKind::Wrr => "wrr",
        }
    }
}

impl fmt::Display for SchedulerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for SchedulerKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        SchedulerKind::ALL
            .iter()
            .copied()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                let known: Vec<_> = SchedulerKind::ALL.iter().map(|k| k.name()).collect();
                format!("unknown scheduler {s:?} (known: {})", known.join(", "))
            })
    }
}

impl Serialize for SchedulerKind {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for SchedulerKind {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

/// Load of one real server as the scheduler sees it (same index as the servers slice).
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct ServerLoad {
    /// Connections in ESTABLISHED (IPVS "ActiveConn").
    pub active: u32,
    /// Connections in any other state (IPVS "InActConn").
    pub inactive: u32,
}

/// What a scheduler may look at besides the servers themselves.
#[derive(Clone, Copy, Debug)]
pub struct PickContext<'a> {
    /// Source of the new connection (for hashing schedulers such as sh and mh).
    pub client: Ipv4Addr,
    pub client_port: u16,
    /// Per-server loads, indexed like the `servers` slice; may be empty for schedulers
    /// that ignore load.
    pub loads: &'a [ServerLoad],
}

impl<'a> PickContext<'a> {
    pub fn new(client: Ipv4Addr, client_port: u16, loads: &'a [ServerLoad]) -> Self {
        PickContext {
            client,
            client_port,
            loads,
        }
    }
}

/// A scheduling algorithm with its per-worker state.
///
/// Contract for implementations:
/// - `pick` is called on the packet path: it must not allocate, lock or block.
/// - `servers` is the real-server list the scheduler was built from (the worker
///   rebuilds the scheduler when it adopts a new snapshot). A scheduler that keeps
///   per-server state must still not panic if the slice length differs; it restarts.
/// - A server with weight 0 is draining and is never picked.
pub trait Scheduler: Send {
    fn kind(&self) -> SchedulerKind;
    /// Index into `servers` of the real server for a new connection; None when no server
    /// can take it (all weight 0 / none).
    fn pick(&mut self, servers: &[RealServer], ctx: &PickContext) -> Option<usize>;
}

/// A fresh scheduler of `kind` for `servers`; state starts from the beginning.
pub fn build(kind: SchedulerKind, servers: &[RealServer]) -> Box<dyn Scheduler> {
    match kind {
        SchedulerKind::Rr => Box::new(RoundRobin::new(servers)),
        SchedulerKind::Wrr => Box::new(SmoothWeightedRoundRobin::new(servers)),
    }
}

/// Helpers for the scheduler tests in this module's files.
#[cfg(test)]
pub(crate) mod test_support {
    use super::*;
    use crate::service::model::ForwardMode;

    /// Real servers 10.0.0.1, 10.0.0.2, ... with the given weights.
    pub fn servers(weights: &[u32]) -> Vec<RealServer> {
        weights
            .iter()
            .enumerate()
            .map(|(i, &weight)| RealServer {
                id: i as u32 + 1,
                ip: Ipv4Addr::new(10, 0, 0, i as u8 + 1),
                port: 80,
                weight,
                mode: ForwardMode::Dr,
                upper: 0,
                lower: 0,
            })
            .collect()
    }

    pub fn ctx() -> PickContext<'static> {
        PickContext::new(Ipv4Addr::new(198, 18, 0, 100), 40000, &[])
    }

    /// `count` picks rendered as letters (`a` = index 0, `-` = None).
    pub fn sequence(scheduler: &mut dyn Scheduler, servers: &[RealServer], count: usize) -> String {
        (0..count)
            .map(|_| match scheduler.pick(servers, &ctx()) {
                Some(i) => (b'a' + i as u8) as char,
                None => '-',
            })
            .collect()
    }

    /// How many times each index is picked in `count` picks.
    pub fn histogram(
        scheduler: &mut dyn Scheduler,
        servers: &[RealServer],
        count: usize,
    ) -> Vec<usize> {
        let mut hits = vec![0; servers.len()];
        for _ in 0..count {
            let i = scheduler.pick(servers, &ctx()).expect("a server");
            hits[i] += 1;
        }
        hits
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::*;
    use super::*;

    #[test]
    fn factory_builds_every_kind() {
        let servers = servers(&[1, 1]);
        for &kind in SchedulerKind::ALL {
            let mut scheduler = build(kind, &servers);
            assert_eq!(scheduler.kind(), kind);
            assert!(scheduler.pick(&servers, &ctx()).is_some());
        }
    }

    #[test]
    fn every_kind_returns_none_without_servers() {
        for &kind in SchedulerKind::ALL {
            let mut scheduler = build(kind, &[]);
            assert_eq!(scheduler.pick(&[], &ctx()), None, "{kind}");
            let drained = servers(&[0, 0]);
            let mut scheduler = build(kind, &drained);
            assert_eq!(scheduler.pick(&drained, &ctx()), None, "{kind}");
        }
    }

    #[test]
    fn kind_names_round_trip() {
        for &kind in SchedulerKind::ALL {
            assert_eq!(kind.name().parse::<SchedulerKind>(), Ok(kind));
            let json = serde_json::to_string(&kind).unwrap();
            assert_eq!(json, format!("\"{}\"", kind.name()));
            assert_eq!(serde_json::from_str::<SchedulerKind>(&json).unwrap(), kind);
        }
        assert!("fastest".parse::<SchedulerKind>().is_err());
    }
}
