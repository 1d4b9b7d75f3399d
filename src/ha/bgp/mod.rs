//! BGP announcements of the VIPs through BIRD 2 (docs/CLUSTER.md). Sluice decides per
//! VIP whether this node should attract its traffic, and tells BIRD through BIRD's own
//! interfaces: an include file of static routes and `birdc configure`. BIRD speaks
//! BGP (and BFD) to the routers; Sluice never does.
//!
//! - [`decide`]: the rule, pure: a service, an available real server, not draining,
//!   not shutting down.
//! - [`bird`]: the include file Sluice writes and the `birdc show protocols` parser.
//! - [`speaker`]: the thread that writes the file and runs `birdc`, bounded in time
//!   and retried, so the management loop never waits for BIRD.
//! - [`BgpNode`]: the management loop's part: drain, shutdown, what changed, reports.
pub mod bird;
pub mod decide;
pub mod speaker;

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use bird::{BirdProtocol, Community};
use decide::{NodeState, ServiceHealth, VipDecision, Withdrawal};
use speaker::{BirdLink, Speaker};

/// `[bgp]`: how Sluice reaches BIRD and what it writes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BgpSettings {
    /// The `birdc` program; default `birdc` (on PATH).
    pub birdc: PathBuf,
    /// BIRD's control socket (`bird -s`); default `/run/bird/bird.ctl`.
    pub socket: PathBuf,
    /// The file Sluice writes and BIRD's config includes.
    pub include: PathBuf,
    /// Name prefix of the two static protocols in it (`PREFIX4`, `PREFIX6`).
    pub protocol: String,
    /// BGP communities added to every announced route.
    pub communities: Vec<Community>,
    /// The longest one `birdc` call may take.
    pub timeout_ms: u32,
    /// The wait before a failed `birdc configure` is tried again.
    pub retry_ms: u32,
    /// How often `birdc show protocols` is read for `sluicectl cluster`.
    pub poll_ms: u32,
    /// On SIGTERM/SIGINT: the time between BIRD's acceptance of the withdrawal and the
    /// workers' stop, for the routers to move the flows elsewhere.
    pub shutdown_grace_ms: u32,
}

impl BgpSettings {
    fn link(&self) -> BirdLink {
        BirdLink {
            birdc: self.birdc.clone(),
            socket: self.socket.clone(),
            include: self.include.clone(),
            timeout: Duration::from_millis(self.timeout_ms.into()),
            retry: Duration::from_millis(self.retry_ms.into()),
            poll: Duration::from_millis(self.poll_ms.into()),
        }
    }
}

/// One VIP in `sluicectl cluster`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct VipReport {
    pub vip: String,
    pub services: usize,
    pub announced: bool,
    /// Why it is withdrawn (`None` while announced).
    pub reason: Option<Withdrawal>,
}

/// `sluicectl cluster`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ClusterReport {
    pub draining: bool,
    pub shutting_down: bool,
    /// With `[vrrp]` too: the node is VRRP backup, so it announces nothing.
    #[serde(default)]
    pub vrrp_backup: bool,
    pub socket: String,
    pub include: String,
    /// Whether BIRD has accepted the include file for the current decision.
    pub in_sync: bool,
    pub applies: u64,
    pub failures: u64,
    /// The last `birdc configure` failure, until one succeeds.
    pub error: Option<String>,
    /// BIRD's BGP protocols (its sessions) from the last `birdc show protocols`.
    pub sessions: Vec<BirdProtocol>,
    /// BIRD's BFD protocols, from the same read.
    pub bfd: Vec<BirdProtocol>,
    /// How old that read is, in ms (`None`: none yet).
    pub sessions_age_ms: Option<u64>,
    /// Why the last read failed (BIRD down, wrong socket).
    pub sessions_error: Option<String>,
    pub vips: Vec<VipReport>,
}

/// The management loop's BGP state.
pub struct BgpNode {
    settings: BgpSettings,
    speaker: Speaker,
    state: NodeState,
    /// Every VIP seen in this run, so a deleted one is reported as gone.
    known: BTreeSet<IpAddr>,
    decisions: Vec<VipDecision>,
    /// The VIPs of the include file last handed to the speaker, and its generation.
    announced: Option<Vec<IpAddr>>,
    generation: u64,
    /// When shutdown began, and when BIRD accepted the withdrawal (or gave up).
    shutdown_at: Option<Instant>,
    withdrawn_at: Option<Instant>,
}

/// The event lines of one tick (announcements, withdrawals, with their reason).
pub type Lines = Vec<String>;

impl BgpNode {
    pub fn new(settings: BgpSettings) -> std::io::Result<BgpNode> {
        let speaker = Speaker::start(settings.link())?;
        Ok(BgpNode {
            settings,
            speaker,
            state: NodeState::default(),
            known: BTreeSet::new(),
            decisions: Vec::new(),
            announced: None,
            generation: 0,
            shutdown_at: None,
            withdrawn_at: None,
        })
    }

    pub fn settings(&self) -> &BgpSettings {
        &self.settings
    }

    /// Decides every VIP from `services` and hands BIRD a new include file when the
    /// announced set changed (the first call always writes one, replacing whatever an
    /// earlier run left). Returns the changes as event lines.
    pub fn tick(&mut self, services: &[ServiceHealth]) -> Lines {
        self.known.extend(services.iter().map(|s| s.vip));
        let decisions = decide::decide(services, &self.known, self.state);
        let mut lines = Vec::new();
        for d in &decisions {
            // Both sorted by address.
            let before = self
                .decisions
                .binary_search_by_key(&d.vip, |b| b.vip)
                .ok()
                .map(|i| &self.decisions[i]);
            let was = before.map(|b| b.withdrawn.is_none());
            let now = d.withdrawn.is_none();
            if was == Some(now) || (was.is_none() && !now && d.services == 0) {
                continue;
            }
            lines.push(match d.withdrawn {
                None => format!("lb=bgp vip={} announce", d.vip),
                Some(w) => format!("lb=bgp vip={} withdraw reason=\"{}\"", d.vip, w.name()),
            });
        }
        self.decisions = decisions;
        let announced: Vec<IpAddr> = self
            .decisions
            .iter()
            .filter(|d| d.withdrawn.is_none())
            .map(|d| d.vip)
            .collect();
        if self.announced.as_ref() != Some(&announced) {
            let text = bird::render_include(
                &self.settings.protocol,
                &announced,
                &self.settings.communities,
            );
            self.generation += 1;
            self.speaker.apply(self.generation, text);
            self.announced = Some(announced);
        }
        if self.shutdown_at.is_some() && self.withdrawn_at.is_none() {
            let s = self.speaker.status();
            let limit = Duration::from_millis(u64::from(self.settings.timeout_ms) * 2);
            if s.applied >= self.generation {
                log::info!(
                    "bgp: every VIP withdrawn; stopping in {} ms",
                    self.settings.shutdown_grace_ms
                );
                self.withdrawn_at = Some(Instant::now());
            } else if self.shutdown_at.is_some_and(|t| t.elapsed() >= limit) {
                log::error!(
                    "bgp: BIRD did not accept the withdrawal within {} ms ({}); stopping anyway",
                    limit.as_millis(),
                    s.error.as_deref().unwrap_or("no answer")
                );
                self.withdrawn_at = Some(Instant::now());
            }
        }
        lines
    }

    /// `sluicectl drain` / `undrain`; true when it changed anything.
    pub fn set_draining(&mut self, on: bool) -> bool {
        let changed = self.state.draining != on;
        self.state.draining = on;
        changed
    }

    /// With `[vrrp]` too: whether the node is VRRP backup (every VIP withdrawn at the
    /// next tick while it is); true when it changed anything.
    pub fn set_vrrp_backup(&mut self, backup: bool) -> bool {
        let changed = self.state.vrrp_backup != backup;
        self.state.vrrp_backup = backup;
        changed
    }

    /// Starts the shutdown: every VIP is withdrawn at the next tick.
    pub fn begin_shutdown(&mut self) {
        if self.shutdown_at.is_none() {
            log::info!("bgp: withdrawing every VIP before stopping");
            self.state.shutting_down = true;
            self.shutdown_at = Some(Instant::now());
        }
    }

    pub fn shutting_down(&self) -> bool {
        self.shutdown_at.is_some()
    }

    /// Whether the shutdown may go on: BIRD accepted the withdrawal (or did not
    /// within twice the birdc timeout) and the grace has passed since.
    pub fn shutdown_done(&self) -> bool {
        self.withdrawn_at.is_some_and(|t| {
            t.elapsed() >= Duration::from_millis(self.settings.shutdown_grace_ms.into())
        })
    }

    pub fn report(&self) -> ClusterReport {
        let s = self.speaker.status();
        let of = |proto: &str| {
            s.protocols
                .iter()
                .filter(|p| p.proto == proto)
                .cloned()
                .collect::<Vec<_>>()
        };
        ClusterReport {
            draining: self.state.draining,
            shutting_down: self.state.shutting_down,
            vrrp_backup: self.state.vrrp_backup,
            socket: self.settings.socket.display().to_string(),
            include: self.settings.include.display().to_string(),
            in_sync: s.applied == self.generation,
            applies: s.applies,
            failures: s.failures,
            error: s.error.clone(),
            sessions: of("BGP"),
            bfd: of("BFD"),
            sessions_age_ms: s.protocols_at.map(|t| t.elapsed().as_millis() as u64),
            sessions_error: s.protocols_error.clone(),
            vips: self
                .decisions
                .iter()
                .map(|d| VipReport {
                    vip: d.vip.to_string(),
                    services: d.services,
                    announced: d.withdrawn.is_none(),
                    reason: d.withdrawn,
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Settings whose `birdc` is a shell script in `dir` running `body`.
    fn settings(dir: &std::path::Path, body: &str) -> BgpSettings {
        use std::os::unix::fs::PermissionsExt;
        let birdc = dir.join("birdc");
        std::fs::write(&birdc, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&birdc, std::fs::Permissions::from_mode(0o755)).unwrap();
        BgpSettings {
            birdc,
            socket: dir.join("bird.ctl"),
            include: dir.join("vips.conf"),
            protocol: "sluice".into(),
            communities: vec![],
            timeout_ms: 200,
            retry_ms: 100,
            poll_ms: 60_000,
            shutdown_grace_ms: 300,
        }
    }

    fn svc(vip: &str, available: bool) -> ServiceHealth {
        ServiceHealth {
            vip: vip.parse().unwrap(),
            available,
        }
    }

    /// Ticks every 5 ms until `done` holds or `limit` passes; the time it took.
    fn tick_until(node: &mut BgpNode, s: &[ServiceHealth], limit: Duration) -> Option<Duration> {
        let start = Instant::now();
        while start.elapsed() < limit {
            node.tick(s);
            if node.shutdown_done() {
                return Some(start.elapsed());
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        None
    }

    #[test]
    fn changes_are_events_and_reach_the_include_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut node = BgpNode::new(settings(dir.path(), "exit 0")).unwrap();
        let up = [svc("198.18.1.1", true), svc("198.18.1.2", false)];
        assert_eq!(
            node.tick(&up),
            vec![
                "lb=bgp vip=198.18.1.1 announce".to_string(),
                "lb=bgp vip=198.18.1.2 withdraw reason=\"no healthy server\"".to_string(),
            ]
        );
        assert!(node.tick(&up).is_empty(), "no change, no event");
        assert!(node.set_draining(true));
        assert_eq!(
            node.tick(&up),
            vec!["lb=bgp vip=198.18.1.1 withdraw reason=\"draining\"".to_string()]
        );
        let deadline = Instant::now() + Duration::from_secs(5);
        while !node.report().in_sync && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let text = std::fs::read_to_string(dir.path().join("vips.conf")).unwrap();
        assert!(!text.contains("route "), "{text}");
        node.set_draining(false);
        assert!(node.set_vrrp_backup(true));
        assert!(!node.set_vrrp_backup(true));
        assert!(
            node.tick(&up).is_empty(),
            "already withdrawn (draining): no new event"
        );
        assert_eq!(node.report().vips[0].reason, Some(Withdrawal::VrrpBackup));
        node.set_vrrp_backup(false);
        node.tick(&[svc("198.18.1.2", true)]);
        let r = node.report();
        assert_eq!(r.vips[0].reason, Some(Withdrawal::ServiceGone));
        assert!(r.vips[1].announced);
    }

    #[test]
    fn shutdown_waits_for_birds_withdrawal_then_the_grace() {
        let dir = tempfile::tempdir().unwrap();
        let mut node = BgpNode::new(settings(dir.path(), "exit 0")).unwrap();
        let up = [svc("198.18.1.1", true)];
        node.tick(&up);
        node.begin_shutdown();
        assert!(!node.shutdown_done());
        let took = tick_until(&mut node, &up, Duration::from_secs(5)).expect("done");
        assert!(
            took >= Duration::from_millis(300),
            "{took:?}: before the grace"
        );
        let text = std::fs::read_to_string(dir.path().join("vips.conf")).unwrap();
        assert!(!text.contains("route "), "{text}");
        assert_eq!(node.report().vips[0].reason, Some(Withdrawal::ShuttingDown));
    }

    #[test]
    fn shutdown_gives_up_on_a_bird_that_refuses_after_twice_the_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let mut node = BgpNode::new(settings(dir.path(), "echo refused; exit 1")).unwrap();
        let up = [svc("198.18.1.1", true)];
        node.tick(&up);
        node.begin_shutdown();
        let took = tick_until(&mut node, &up, Duration::from_secs(5)).expect("done");
        // 2 x 200 ms, then the 300 ms grace.
        assert!(took >= Duration::from_millis(700), "{took:?}");
        let r = node.report();
        assert!(!r.in_sync && r.failures > 0, "{r:?}");
        assert!(r.error.unwrap().contains("refused"));
    }
}
