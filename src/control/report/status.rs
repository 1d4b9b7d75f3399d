//! `sluicectl status` and `xstats`: the ports, lcores, drops, events and service
//! adoption of the running appliance, and one port's NIC statistics.
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Everything `sluicectl status` shows.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StatusReport {
    pub version: String,
    pub pid: u32,
    pub uptime_ms: u64,
    pub ports: Vec<PortStatus>,
    pub lcores: Vec<LcoreStatus>,
    /// Drop counters summed over workers, keyed by reason name. The daemon fills in
    /// every reason, zeros included, so an operator sees what *could* be dropping.
    pub drops: BTreeMap<String, u64>,
    /// Event counters summed over workers, keyed by event name.
    pub events: BTreeMap<String, u64>,
    /// Entries in the neighbour (ARP) table.
    pub neighbours: u64,
    /// Live sessions, summed over workers.
    #[serde(default)]
    pub sessions: u64,
    /// Sessions created and expired since start (or the last zeroing).
    #[serde(default)]
    pub sessions_created: u64,
    #[serde(default)]
    pub sessions_expired: u64,
    /// How long published service changes took to reach every worker.
    #[serde(default)]
    pub snapshot_adoption: AdoptionReport,
    /// Real-server ids: each real and sorry server holds one, and a removed one's
    /// stays held until nothing refers to it.
    #[serde(default)]
    pub real_server_ids: RealServerIdsReport,
    /// Live persistence templates by table and standing, as the last whole count
    /// found them (`None` until the first count is done, a few seconds after start).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistence_templates: Option<TemplatesReport>,
    /// The management loop's turns and the control requests they answered (`None`
    /// where no loop runs: a report built outside the daemon).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub management: Option<ManagementReport>,
}

/// The management loop: one thread whose turns, 5 ms apart, run the health checks,
/// VRRP, sync, the exception path and the control requests. A long turn delays all
/// of them: VRRP adverts late by three intervals make the backup take over.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManagementReport {
    /// Turns since start.
    pub turns: u64,
    /// The longest turn's work (its sleep excluded), over the last 30 to 60 seconds.
    pub longest_turn_us: u64,
    /// Control requests answered since start.
    pub control_requests: u64,
    /// Turns that spent their control budget and left requests for the next turn.
    pub control_turns_cut: u64,
}

/// The persistence templates (shared by all workers): the management core counts the
/// live ones by standing, a slice of the table per tick, a whole count every
/// `pass_ms` (docs/CONFIG.md, *Spoofed SYNs*: what the standings mean).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplatesReport {
    pub ipv4: TemplateTableReport,
    pub ipv6: TemplateTableReport,
    /// How long ago the count shown was finished.
    pub counted_ms_ago: u64,
    /// How long a whole count takes.
    pub pass_ms: u64,
}

/// One template table: its slots, and its live templates by standing.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TemplateTableReport {
    pub slots: u64,
    pub unconfirmed: u64,
    pub unverified: u64,
    pub confirmed: u64,
}

impl TemplateTableReport {
    /// Live templates of every standing.
    pub fn live(&self) -> u64 {
        self.unconfirmed + self.unverified + self.confirmed
    }
}

/// Real-server ids: the workers count each real server in a slot indexed by its id,
/// so at most `limit` are held at once. A removed server's id is held until no worker
/// has a session counted on it and its templates can have expired, then handed out
/// again.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RealServerIdsReport {
    /// Held by the real and sorry servers in the table.
    pub in_use: u64,
    /// Held by removed servers, waiting for their last session (and templates).
    pub waiting: u64,
    /// Ids there are: `in_use + waiting` never exceeds it.
    pub limit: u64,
}

/// Publish -> every worker adopted, for the service snapshots published since start
/// (each change, `-R` batch or reload is one). A worker adopts at the top of its next
/// poll, so a new session sees the change after at most one poll loop.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct AdoptionReport {
    /// The last generation published (and waited for).
    pub generation: u64,
    /// Publishes measured, and how many of them some worker had not adopted within
    /// `timeout_ms` (the management core stops waiting then).
    pub publishes: u64,
    pub late: u64,
    pub timeout_ms: u64,
    /// The last publish's latency (`None` when it was late or there was none).
    pub last_ns: Option<u64>,
    /// Largest and summed latency over all publishes adopted in time.
    pub max_ns: u64,
    pub sum_ns: u64,
    /// Median and 99th percentile over the `recent` latest publishes (up to 1024).
    pub p50_ns: Option<u64>,
    pub p99_ns: Option<u64>,
    pub recent: u64,
    /// Publishes every worker adopted within 1 ms (the visibility target).
    #[serde(default)]
    pub within_1ms: u64,
}

/// One DPDK port and its basic counters (`rte_eth_stats`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PortStatus {
    pub id: u16,
    pub name: String,
    pub driver: String,
    pub mac: String,
    pub addresses: Vec<String>,
    pub link_up: bool,
    pub speed_mbps: u32,
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    /// Frames the NIC dropped because the RX ring was full: the workers fell behind.
    pub rx_missed: u64,
    pub rx_errors: u64,
    pub tx_errors: u64,
    /// RX failures for want of an mbuf: the mempool is too small or mbufs leak.
    pub rx_nombuf: u64,
    /// How packets reach the worker owning their session: `single`, `device`,
    /// `emulated` or `steered` (`flow::ownership`).
    #[serde(default)]
    pub ownership: String,
    /// The same in words, with the reason for steering.
    #[serde(default)]
    pub ownership_detail: String,
    /// The port's exception path to its kernel interface (`[ports.exception]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exception: Option<ExceptionStatus>,
}

/// A port's kernel interface (docs/EXCEPTION_PATH.md) and what crossed it, as the
/// management core counted it. The workers' side (punted, dropped by the rate limit
/// or a full ring, injected) is in the events and drops.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExceptionStatus {
    pub port: String,
    pub interface: String,
    /// `tap` or `virtio-user`.
    pub kind: String,
    /// Frames per second to the kernel at most.
    pub rate: u32,
    pub ring_size: u32,
    #[serde(flatten)]
    pub counts: ExceptionCounts,
}

/// Frames across one kernel interface.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExceptionCounts {
    /// Written to the kernel interface.
    pub to_kernel: u64,
    /// Refused by the interface (the kernel's queue full).
    pub to_kernel_lost: u64,
    /// Written by the kernel, handed to worker 0 to send.
    pub from_kernel: u64,
    /// Written by the kernel, lost to a full inject ring.
    pub from_kernel_lost: u64,
}

/// One lcore: a worker or the management core.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct LcoreStatus {
    pub lcore: u32,
    /// `"worker"` or `"management"`.
    pub role: String,
    /// The worker index for workers; `None` for the management core.
    pub worker: Option<u16>,
    /// Share of the lcore's cycles spent on polls that found packets, 0 to 100.
    pub busy_percent: f64,
    pub rx_packets: u64,
    pub tx_packets: u64,
    pub polls: u64,
    /// Workers: live sessions in the worker's table, sessions it created.
    #[serde(default)]
    pub sessions: u64,
    #[serde(default)]
    pub sessions_created: u64,
    /// Workers: packets handed to another worker's redirect ring (NAT replies that
    /// arrived here but belong there) and taken from this worker's own.
    #[serde(default)]
    pub redirected_out: u64,
    #[serde(default)]
    pub redirected_in: u64,
    /// Workers: entries in the worker's neighbour table.
    #[serde(default)]
    pub neighbours: u64,
    /// Workers: TSC cycles of polls that received packets (cycles per packet =
    /// `busy_cycles / rx_packets`, what the benchmark harness reports).
    #[serde(default)]
    pub busy_cycles: u64,
    /// Workers: TSC cycles of all polls, busy or idle (busy share over a window =
    /// difference of `busy_cycles` over difference of this).
    #[serde(default)]
    pub total_cycles: u64,
    /// Workers: bytes allocated for the session table at its capacity.
    #[serde(default)]
    pub session_table_bytes: u64,
    /// Workers: the service snapshot generation the worker uses.
    #[serde(default)]
    pub snapshot_generation: u64,
    /// Workers: frames a packet capture selected and the worker copied, and those it
    /// could not copy because its copy ring was full (both since start).
    #[serde(default)]
    pub capture_copied: u64,
    #[serde(default)]
    pub capture_dropped: u64,
}

/// The NIC's extended statistics for one port, in the driver's order.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct XstatsReport {
    pub port: u16,
    pub name: String,
    pub stats: Vec<(String, u64)>,
}
