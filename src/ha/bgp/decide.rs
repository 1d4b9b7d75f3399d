//! Whether this node announces each VIP: pure over the services' health and the
//! node's state.
use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;

/// Why a VIP this node knows is not announced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Withdrawal {
    /// The node is stopping (SIGTERM/SIGINT): every VIP goes, before the workers stop.
    ShuttingDown,
    /// `sluicectl drain`: withdrawn for maintenance; connections are still forwarded.
    Draining,
    /// With `[vrrp]` too: the node is VRRP backup, so the VIPs are not its to serve
    /// (it neither owns nor answers for them); announcing them would draw their
    /// traffic to a node that drops it.
    VrrpBackup,
    /// No service has this VIP any more (deleted, or gone in a reload).
    ServiceGone,
    /// Every real server of every service on the VIP is evicted by its health check or
    /// has weight 0 (a sorry server does not count).
    NoHealthyServer,
}

impl Withdrawal {
    pub fn name(self) -> &'static str {
        match self {
            Withdrawal::ShuttingDown => "shutting down",
            Withdrawal::Draining => "draining",
            Withdrawal::VrrpBackup => "vrrp backup",
            Withdrawal::ServiceGone => "service gone",
            Withdrawal::NoHealthyServer => "no healthy server",
        }
    }
}

/// One service as the decision sees it: its VIP and whether some real server can take
/// a new connection (weight above 0 and not evicted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServiceHealth {
    pub vip: IpAddr,
    pub available: bool,
}

/// The node's side of the decision.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeState {
    pub draining: bool,
    pub shutting_down: bool,
    /// VRRP runs on this node and it is not master.
    pub vrrp_backup: bool,
}

/// The decision for one VIP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct VipDecision {
    pub vip: IpAddr,
    /// The services on it (several ports or protocols may share a VIP).
    pub services: usize,
    /// `None`: announced.
    pub withdrawn: Option<Withdrawal>,
}

/// Decides every VIP of `services`, and of `known` (the VIPs seen earlier in this run,
/// so one whose last service went is reported as withdrawn, not forgotten), sorted by
/// address. A VIP is announced when it has a service, one of its services has an
/// available real server, and the node is neither draining, nor shutting down, nor a
/// VRRP backup. The reason given is the first that holds of: shutting down, draining,
/// VRRP backup, service gone, no healthy server.
pub fn decide(
    services: &[ServiceHealth],
    known: &BTreeSet<IpAddr>,
    node: NodeState,
) -> Vec<VipDecision> {
    // Per VIP: its services, and whether one of them has an available server.
    let mut vips: BTreeMap<IpAddr, (usize, bool)> =
        known.iter().map(|&vip| (vip, (0, false))).collect();
    for s in services {
        let e = vips.entry(s.vip).or_default();
        e.0 += 1;
        e.1 |= s.available;
    }
    vips.into_iter()
        .map(|(vip, (count, available))| {
            let withdrawn = if node.shutting_down {
                Some(Withdrawal::ShuttingDown)
            } else if node.draining {
                Some(Withdrawal::Draining)
            } else if node.vrrp_backup {
                Some(Withdrawal::VrrpBackup)
            } else if count == 0 {
                Some(Withdrawal::ServiceGone)
            } else if !available {
                Some(Withdrawal::NoHealthyServer)
            } else {
                None
            };
            VipDecision {
                vip,
                services: count,
                withdrawn,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn svc(vip: &str, available: bool) -> ServiceHealth {
        ServiceHealth {
            vip: ip(vip),
            available,
        }
    }

    fn reasons(d: &[VipDecision]) -> Vec<(String, Option<Withdrawal>)> {
        d.iter().map(|v| (v.vip.to_string(), v.withdrawn)).collect()
    }

    #[test]
    fn announces_a_vip_with_one_available_server_among_its_services() {
        let services = [
            svc("198.18.5.1", false),
            svc("198.18.5.1", true),
            svc("198.18.5.2", false),
            svc("2001:db8::5", true),
        ];
        let d = decide(&services, &BTreeSet::new(), NodeState::default());
        assert_eq!(
            reasons(&d),
            vec![
                ("198.18.5.1".into(), None),
                ("198.18.5.2".into(), Some(Withdrawal::NoHealthyServer)),
                ("2001:db8::5".into(), None),
            ]
        );
        assert_eq!(d[0].services, 2);
    }

    #[test]
    fn a_known_vip_without_services_is_gone() {
        let known: BTreeSet<IpAddr> = [ip("198.18.5.9")].into();
        let d = decide(&[svc("198.18.5.1", true)], &known, NodeState::default());
        assert_eq!(d[1].withdrawn, Some(Withdrawal::ServiceGone));
        assert_eq!(d[1].services, 0);
    }

    #[test]
    fn draining_and_shutting_down_withdraw_everything_shutdown_first() {
        let services = [svc("198.18.5.1", true), svc("198.18.5.2", false)];
        let draining = NodeState {
            draining: true,
            ..NodeState::default()
        };
        let d = decide(&services, &BTreeSet::new(), draining);
        assert!(d.iter().all(|v| v.withdrawn == Some(Withdrawal::Draining)));
        let both = NodeState {
            draining: true,
            shutting_down: true,
            vrrp_backup: true,
        };
        let d = decide(&services, &BTreeSet::new(), both);
        assert!(d
            .iter()
            .all(|v| v.withdrawn == Some(Withdrawal::ShuttingDown)));
    }

    #[test]
    fn a_vrrp_backup_withdraws_every_vip_until_it_is_master() {
        let services = [svc("198.18.5.1", true), svc("198.18.5.2", false)];
        let backup = NodeState {
            vrrp_backup: true,
            ..NodeState::default()
        };
        let d = decide(&services, &BTreeSet::new(), backup);
        assert!(d
            .iter()
            .all(|v| v.withdrawn == Some(Withdrawal::VrrpBackup)));
        let draining = NodeState {
            draining: true,
            ..backup
        };
        let d = decide(&services, &BTreeSet::new(), draining);
        assert!(d.iter().all(|v| v.withdrawn == Some(Withdrawal::Draining)));
        let master = decide(&services, &BTreeSet::new(), NodeState::default());
        assert_eq!(master[0].withdrawn, None);
    }
}
