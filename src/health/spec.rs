//! What a health check is: its kind and timing (`CheckSpec`), partial overrides per
//! service and per real server (`CheckOverride`), and the appliance-wide settings
//! (`HealthConfig`). Defaults follow seed 004's production values: probe every 5 s,
//! evict after 2 failures in a row, retry an evicted server after 30 s.
use std::net::{Ipv4Addr, Ipv6Addr};
use std::ops::RangeInclusive;

/// How a real server is probed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CheckKind {
    /// No active probe (passive detection may still evict).
    #[default]
    None,
    /// SYN -> SYN-ACK is up (then an RST); RST or silence is down.
    Tcp,
    /// A TCP connection, `GET path`, and the expected status within the timeout.
    Http,
}

impl CheckKind {
    pub fn parse(s: &str) -> Option<CheckKind> {
        match s {
            "none" => Some(CheckKind::None),
            "tcp" => Some(CheckKind::Tcp),
            "http" => Some(CheckKind::Http),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            CheckKind::None => "none",
            CheckKind::Tcp => "tcp",
            CheckKind::Http => "http",
        }
    }
}

/// What new connections to a service get when no real server can take them (every one
/// evicted or at weight 0).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AllDown {
    /// Dropped silently: clients retry their SYN until they give up.
    #[default]
    Drop,
    /// A new TCP connection is answered with an RST, so clients fail fast (UDP is
    /// still dropped).
    Rst,
}

impl AllDown {
    pub fn parse(s: &str) -> Option<AllDown> {
        match s {
            "drop" => Some(AllDown::Drop),
            "rst" => Some(AllDown::Rst),
            _ => None,
        }
    }
}

/// Longest HTTP path accepted (the request must fit one segment).
pub const MAX_PATH_LEN: usize = 256;

/// One real server's effective check.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct CheckSpec {
    pub kind: CheckKind,
    /// Between two probes of an up (or recovering) server.
    pub interval_ms: u32,
    /// A probe with no verdict after this long failed.
    pub timeout_ms: u32,
    /// Failures in a row that evict.
    pub fall: u32,
    /// Successes in a row that restore an evicted server.
    pub rise: u32,
    /// After an eviction (or a failed probe of an evicted server), the wait before the
    /// next probe; also the first back-off of passive eviction.
    pub retry_ms: u32,
    /// Port probed; the real server's own port when `None`.
    pub port: Option<u16>,
    /// HTTP: the path requested and the status expected.
    pub path: String,
    pub expect: u16,
    /// Passive detection: evict after `passive_fall` new connections in a row that the
    /// server left unanswered or refused.
    pub passive: bool,
    pub passive_fall: u32,
}

impl Default for CheckSpec {
    fn default() -> Self {
        CheckSpec {
            kind: CheckKind::None,
            interval_ms: 5000,
            timeout_ms: 2000,
            fall: 2,
            rise: 1,
            retry_ms: 30_000,
            port: None,
            path: "/".into(),
            expect: 200,
            passive: false,
            passive_fall: 3,
        }
    }
}

impl CheckSpec {
    /// Whether anything watches this server (an active check or passive detection).
    pub fn watches(&self) -> bool {
        self.kind != CheckKind::None || self.passive
    }

    /// The rules that involve two fields; `Err` says which and why.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if self.timeout_ms > self.interval_ms {
            return Err((
                "timeout_ms",
                format!(
                    "timeout {} ms is longer than the interval {} ms: probes of one server would overlap",
                    self.timeout_ms, self.interval_ms
                ),
            ));
        }
        Ok(())
    }
}

/// A partial check from a `health` table: the fields it sets.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckOverride {
    pub kind: Option<CheckKind>,
    pub interval_ms: Option<u32>,
    pub timeout_ms: Option<u32>,
    pub fall: Option<u32>,
    pub rise: Option<u32>,
    pub retry_ms: Option<u32>,
    pub port: Option<u16>,
    pub path: Option<String>,
    pub expect: Option<u16>,
    pub passive: Option<bool>,
    pub passive_fall: Option<u32>,
}

impl CheckOverride {
    /// `base` with every field this override sets replaced.
    pub fn apply(&self, base: &CheckSpec) -> CheckSpec {
        CheckSpec {
            kind: self.kind.unwrap_or(base.kind),
            interval_ms: self.interval_ms.unwrap_or(base.interval_ms),
            timeout_ms: self.timeout_ms.unwrap_or(base.timeout_ms),
            fall: self.fall.unwrap_or(base.fall),
            rise: self.rise.unwrap_or(base.rise),
            retry_ms: self.retry_ms.unwrap_or(base.retry_ms),
            port: self.port.or(base.port),
            path: self.path.clone().unwrap_or_else(|| base.path.clone()),
            expect: self.expect.unwrap_or(base.expect),
            passive: self.passive.unwrap_or(base.passive),
            passive_fall: self.passive_fall.unwrap_or(base.passive_fall),
        }
    }
}

/// The `[health]` section: where probes come from, the defaults of every check, and
/// passive detection's window.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HealthConfig {
    /// Source address of probes; the first port's first address when `None`.
    pub source: Option<Ipv4Addr>,
    /// Source address of probes to IPv6 real servers; when `None`, the first port's
    /// IPv6 address sharing the longest prefix with the real server.
    pub source6: Option<Ipv6Addr>,
    /// Source ports of probes (one per probe in flight).
    pub source_ports: RangeInclusive<u16>,
    /// Every service's check unless it overrides fields.
    pub defaults: CheckSpec,
    pub all_down: AllDown,
    /// A client's SYN sent again at least this long after the first, with nothing
    /// from the real server in between, counts as unanswered (Linux resends after
    /// 1 s, so the default catches the first resend).
    pub passive_syn_ms: u32,
}

impl Default for HealthConfig {
    fn default() -> Self {
        HealthConfig {
            source: None,
            source6: None,
            source_ports: 61000..=61999,
            defaults: CheckSpec::default(),
            all_down: AllDown::Drop,
            passive_syn_ms: 800,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_override_replaces_only_what_it_sets() {
        let base = CheckSpec::default();
        let o = CheckOverride {
            kind: Some(CheckKind::Http),
            path: Some("/health".into()),
            fall: Some(3),
            ..Default::default()
        };
        let got = o.apply(&base);
        assert_eq!(got.kind, CheckKind::Http);
        assert_eq!(got.path, "/health");
        assert_eq!(got.fall, 3);
        assert_eq!(got.interval_ms, 5000);
        assert_eq!(got.retry_ms, 30_000);
        assert_eq!(CheckOverride::default().apply(&got), got);
    }

    #[test]
    fn seed_004_defaults() {
        let d = CheckSpec::default();
        assert_eq!((d.interval_ms, d.fall, d.retry_ms), (5000, 2, 30_000));
        assert!(!d.watches());
        assert!(d.validate().is_ok());
    }

    #[test]
    fn a_timeout_longer_than_the_interval_is_refused() {
        let s = CheckSpec {
            timeout_ms: 6000,
            ..Default::default()
        };
        assert_eq!(s.validate().unwrap_err().0, "timeout_ms");
    }
}
