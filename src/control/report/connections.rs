//! `-Lnc`: the workers' sessions.
use serde::{Deserialize, Serialize};

/// `-Lnc`: the sessions of every worker.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ConnectionsReport {
    pub connections: Vec<ConnectionStatus>,
    /// More sessions exist than the listing's bound allowed.
    pub truncated: bool,
    /// A paged listing: where the next page starts; none after the last page.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<crate::control::protocol::ConnectionsCursor>,
}

/// One session.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectionStatus {
    /// The worker whose table holds the session (DPVS's `[lcore]`); none for a
    /// persistence template (shared by all workers).
    pub worker: Option<u16>,
    /// `"tcp"` or `"udp"`.
    pub proto: String,
    /// Seconds until it expires unless a packet refreshes it.
    pub expires_s: u32,
    /// IPVS state name.
    pub state: String,
    pub client: String,
    #[serde(rename = "virtual")]
    pub virtual_service: String,
    /// FullNAT: the local address and port the real server sees.
    #[serde(default)]
    pub local: Option<String>,
    pub destination: String,
    /// A persistence template's standing (`unconfirmed`, `unverified`, `confirmed`:
    /// how far its connections showed their client; CONFIG.md,
    /// `persistence_timeout`); none for a session.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub standing: Option<String>,
}
