//! `sluicectl events`: the recent config changes and alerts.
use serde::{Deserialize, Serialize};

/// `sluicectl events`: the recent config changes and alerts, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventsReport {
    pub events: Vec<EventLine>,
}

/// One event: when it happened (milliseconds since the Unix epoch) and its log line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventLine {
    pub unix_ms: u64,
    pub line: String,
}
