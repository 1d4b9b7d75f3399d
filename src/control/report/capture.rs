//! `sluicectl capture`: where a packet capture writes, how far it got, and why it
//! ended.
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CaptureReport {
    /// Whether the capture still runs.
    pub running: bool,
    /// The pcapng file (empty when no capture ran yet).
    pub path: String,
    /// Packets written to the file.
    pub written: u64,
    /// Frames the filter selected that found no free copy slot (the workers' copy
    /// rings were full): missing from the file.
    pub dropped: u64,
    /// Why it ended: `count`, `duration`, `stopped` or a write error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<String>,
}
