//! The status and xstats reports: built by the daemon, carried as JSON, rendered as text
//! by `sluicectl`. Keeping both sides on these types means a field added here shows up
//! in `--json` output with no protocol change.
use crate::ha::sync::peers::ResyncState;
use crate::ha::sync::report::SyncReport;
use crate::ha::vrrp::node::VrrpReport;
use crate::health::HealthReport;
use crate::model::ServiceKey;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::Ipv4Addr;

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
    /// Workers: bytes allocated for the session table at its capacity.
    #[serde(default)]
    pub session_table_bytes: u64,
    /// Workers: the service snapshot generation the worker uses.
    #[serde(default)]
    pub snapshot_generation: u64,
}

/// The NIC's extended statistics for one port, in the driver's order.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct XstatsReport {
    pub port: u16,
    pub name: String,
    pub stats: Vec<(String, u64)>,
}

/// The human-readable status: a header line, then the ports, lcores, drops and events
/// sections. Counters are printed exactly (no unit scaling) so they can be diffed and
/// grepped.
pub fn render_status(report: &StatusReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "sluice {}  pid {}  up {}  neighbours {}",
        report.version,
        report.pid,
        format_uptime(report.uptime_ms),
        report.neighbours
    );
    let _ = writeln!(
        out,
        "sessions {} (created {}, expired {})",
        report.sessions, report.sessions_created, report.sessions_expired
    );
    out.push_str(&render_adoption(&report.snapshot_adoption));

    out.push_str("\nports\n");
    if report.ports.is_empty() {
        out.push_str("  (none)\n");
    } else {
        let mut table = Table::new(&[
            ("PORT", Align::Right),
            ("NAME", Align::Left),
            ("DRIVER", Align::Left),
            ("MAC", Align::Left),
            ("LINK", Align::Left),
            ("SPEED", Align::Right),
            ("RX-PKTS", Align::Right),
            ("RX-BYTES", Align::Right),
            ("TX-PKTS", Align::Right),
            ("TX-BYTES", Align::Right),
            ("MISSED", Align::Right),
            ("RX-ERR", Align::Right),
            ("TX-ERR", Align::Right),
            ("NOMBUF", Align::Right),
            ("ADDRESSES", Align::Left),
        ]);
        for port in &report.ports {
            table.row(vec![
                port.id.to_string(),
                port.name.clone(),
                port.driver.clone(),
                port.mac.clone(),
                if port.link_up { "up" } else { "down" }.to_string(),
                format_speed(port.link_up, port.speed_mbps),
                port.rx_packets.to_string(),
                port.rx_bytes.to_string(),
                port.tx_packets.to_string(),
                port.tx_bytes.to_string(),
                port.rx_missed.to_string(),
                port.rx_errors.to_string(),
                port.tx_errors.to_string(),
                port.rx_nombuf.to_string(),
                if port.addresses.is_empty() {
                    "-".to_string()
                } else {
                    port.addresses.join(",")
                },
            ]);
        }
        table.render_into(&mut out);
        for port in report
            .ports
            .iter()
            .filter(|p| !p.ownership_detail.is_empty())
        {
            let _ = writeln!(
                out,
                "  port {} ownership: {}",
                port.name, port.ownership_detail
            );
        }
    }

    out.push_str("\nlcores\n");
    if report.lcores.is_empty() {
        out.push_str("  (none)\n");
    } else {
        let mut table = Table::new(&[
            ("LCORE", Align::Right),
            ("ROLE", Align::Left),
            ("WORKER", Align::Right),
            ("BUSY%", Align::Right),
            ("RX-PKTS", Align::Right),
            ("TX-PKTS", Align::Right),
            ("POLLS", Align::Right),
            ("SESSIONS", Align::Right),
            ("CREATED", Align::Right),
            ("REDIR-OUT", Align::Right),
            ("REDIR-IN", Align::Right),
        ]);
        for lcore in &report.lcores {
            table.row(vec![
                lcore.lcore.to_string(),
                lcore.role.clone(),
                lcore
                    .worker
                    .map_or_else(|| "-".to_string(), |worker| worker.to_string()),
                format!("{:.1}", lcore.busy_percent),
                lcore.rx_packets.to_string(),
                lcore.tx_packets.to_string(),
                lcore.polls.to_string(),
                lcore.sessions.to_string(),
                lcore.sessions_created.to_string(),
                lcore.redirected_out.to_string(),
                lcore.redirected_in.to_string(),
            ]);
        }
        table.render_into(&mut out);
    }

    render_counters(&mut out, "drops", &report.drops);
    render_counters(&mut out, "events", &report.events);
    out
}

/// One line: how fast service changes reached every worker.
fn render_adoption(a: &AdoptionReport) -> String {
    if a.publishes == 0 {
        return "changes: none published since start\n".into();
    }
    let us = |ns: Option<u64>| {
        ns.map_or_else(|| "-".into(), |ns| format!("{:.1} us", ns as f64 / 1000.0))
    };
    format!(
        "changes: {} published (generation {}), {} adopted everywhere within 1 ms; last {}, p50 {}, p99 {}, max {}; {} late (> {} ms)\n",
        a.publishes,
        a.generation,
        a.within_1ms,
        us(a.last_ns),
        us(a.p50_ns),
        us(a.p99_ns),
        us((a.publishes > a.late).then_some(a.max_ns)),
        a.late,
        a.timeout_ms
    )
}

/// The human-readable xstats: one `name value` line per statistic.
pub fn render_xstats(report: &XstatsReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "port {} ({}): {} extended statistics",
        report.port,
        report.name,
        report.stats.len()
    );
    let mut table = Table::new(&[("", Align::Left), ("", Align::Right)]);
    for (name, value) in &report.stats {
        table.row(vec![name.clone(), value.to_string()]);
    }
    table.render_rows_into(&mut out);
    out
}

/// A titled `name count` list with its total; every entry is shown, zeros included,
/// in name order (the map is sorted).
fn render_counters(out: &mut String, title: &str, counters: &BTreeMap<String, u64>) {
    let total: u64 = counters.values().fold(0, |sum, v| sum.saturating_add(*v));
    let _ = writeln!(out, "\n{title} (total {total})");
    if counters.is_empty() {
        out.push_str("  (none)\n");
        return;
    }
    let mut table = Table::new(&[("", Align::Left), ("", Align::Right)]);
    for (name, count) in counters {
        table.row(vec![name.clone(), count.to_string()]);
    }
    table.render_rows_into(out);
}

/// `1d 02:03:04` or `02:03:04`.
fn format_uptime(uptime_ms: u64) -> String {
    let seconds = uptime_ms / 1000;
    let (days, hours, minutes, secs) = (
        seconds / 86_400,
        seconds / 3600 % 24,
        seconds / 60 % 60,
        seconds % 60,
    );
    if days > 0 {
        format!("{days}d {hours:02}:{minutes:02}:{secs:02}")
    } else {
        format!("{hours:02}:{minutes:02}:{secs:02}")
    }
}

/// `10G`, `2.5G`, `100M`; `-` when the link is down or the speed is unknown.
fn format_speed(link_up: bool, speed_mbps: u32) -> String {
    match speed_mbps {
        _ if !link_up => "-".to_string(),
        0 => "-".to_string(),
        mbps if mbps % 1000 == 0 => format!("{}G", mbps / 1000),
        mbps if mbps >= 1000 => format!("{:.1}G", f64::from(mbps) / 1000.0),
        mbps => format!("{mbps}M"),
    }
}

#[derive(Clone, Copy)]
enum Align {
    Left,
    Right,
}

/// A minimal aligned text table, indented two spaces, columns two spaces apart.
struct Table {
    columns: Vec<(String, Align)>,
    rows: Vec<Vec<String>>,
}

impl Table {
    fn new(columns: &[(&str, Align)]) -> Table {
        Table {
            columns: columns
                .iter()
                .map(|(title, align)| (title.to_string(), *align))
                .collect(),
            rows: Vec::new(),
        }
    }

    fn row(&mut self, cells: Vec<String>) {
        debug_assert_eq!(cells.len(), self.columns.len());
        self.rows.push(cells);
    }

    fn render_into(&self, out: &mut String) {
        let header: Vec<String> = self.columns.iter().map(|(t, _)| t.clone()).collect();
        self.render_lines(out, std::iter::once(&header).chain(&self.rows));
    }

    fn render_rows_into(&self, out: &mut String) {
        self.render_lines(out, self.rows.iter());
    }

    fn render_lines<'a>(&self, out: &mut String, lines: impl Iterator<Item = &'a Vec<String>>) {
        let lines: Vec<&Vec<String>> = lines.collect();
        let widths: Vec<usize> = (0..self.columns.len())
            .map(|column| {
                lines
                    .iter()
                    .map(|cells| cells[column].chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        for cells in lines {
            let mut line = String::from("  ");
            for (index, ((cell, width), (_, align))) in
                cells.iter().zip(&widths).zip(&self.columns).enumerate()
            {
                if index > 0 {
                    line.push_str("  ");
                }
                let _ = match align {
                    Align::Left => write!(line, "{cell:<width$}"),
                    Align::Right => write!(line, "{cell:>width$}"),
                };
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> StatusReport {
        StatusReport {
            version: "0.1.0".into(),
            pid: 4242,
            uptime_ms: 90_061_000,
            ports: vec![PortStatus {
                id: 0,
                name: "net_ring0".into(),
                driver: "net_ring".into(),
                mac: "02:00:00:00:00:01".into(),
                addresses: vec!["10.0.0.1/24".into(), "10.0.0.2/24".into()],
                link_up: true,
                speed_mbps: 10_000,
                rx_packets: 1234,
                rx_bytes: 567_890,
                tx_packets: 1200,
                tx_bytes: 560_000,
                rx_missed: 7,
                rx_errors: 1,
                tx_errors: 2,
                rx_nombuf: 3,
                ownership: "steered".into(),
                ownership_detail: "software steering (the device has no Toeplitz RSS)".into(),
            }],
            lcores: vec![
                LcoreStatus {
                    lcore: 0,
                    role: "management".into(),
                    worker: None,
                    busy_percent: 0.5,
                    ..LcoreStatus::default()
                },
                LcoreStatus {
                    lcore: 2,
                    role: "worker".into(),
                    worker: Some(0),
                    busy_percent: 37.26,
                    rx_packets: 1234,
                    tx_packets: 1200,
                    polls: 99_000,
                    sessions: 17,
                    sessions_created: 40,
                    redirected_out: 5,
                    redirected_in: 6,
                    neighbours: 3,
                    busy_cycles: 0,
                    session_table_bytes: 0,
                    snapshot_generation: 7,
                },
            ],
            drops: [("truncated", 5), ("bad_arp", 0), ("tx_full", 2)]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
            events: [("arp_replied", 4)]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
            neighbours: 3,
            sessions: 0,
            sessions_created: 0,
            sessions_expired: 0,
            snapshot_adoption: AdoptionReport {
                generation: 7,
                publishes: 6,
                late: 1,
                timeout_ms: 50,
                last_ns: Some(12_345),
                max_ns: 250_000,
                sum_ns: 300_000,
                p50_ns: Some(9_000),
                p99_ns: Some(250_000),
                recent: 5,
                within_1ms: 5,
            },
        }
    }

    fn line_with<'a>(text: &'a str, needle: &str) -> &'a str {
        text.lines()
            .find(|line| line.contains(needle))
            .unwrap_or_else(|| panic!("no line with {needle:?} in:\n{text}"))
    }

    fn words(line: &str) -> Vec<&str> {
        line.split_whitespace().collect()
    }

    #[test]
    fn status_header_summarises_the_daemon() {
        let text = render_status(&sample());
        assert_eq!(
            text.lines().next(),
            Some("sluice 0.1.0  pid 4242  up 1d 01:01:01  neighbours 3")
        );
    }

    #[test]
    fn each_port_says_how_packets_reach_their_owner() {
        let text = render_status(&sample());
        let line = line_with(&text, "ownership:");
        assert!(
            line.ends_with("ownership: software steering (the device has no Toeplitz RSS)"),
            "{line}"
        );
    }

    #[test]
    fn port_row_carries_every_counter_in_header_order() {
        let text = render_status(&sample());
        let header = words(line_with(&text, "RX-PKTS  RX-BYTES"));
        assert_eq!(
            header,
            [
                "PORT",
                "NAME",
                "DRIVER",
                "MAC",
                "LINK",
                "SPEED",
                "RX-PKTS",
                "RX-BYTES",
                "TX-PKTS",
                "TX-BYTES",
                "MISSED",
                "RX-ERR",
                "TX-ERR",
                "NOMBUF",
                "ADDRESSES"
            ]
        );
        let row = words(line_with(&text, "net_ring0"));
        assert_eq!(
            row,
            [
                "0",
                "net_ring0",
                "net_ring",
                "02:00:00:00:00:01",
                "up",
                "10G",
                "1234",
                "567890",
                "1200",
                "560000",
                "7",
                "1",
                "2",
                "3",
                "10.0.0.1/24,10.0.0.2/24"
            ]
        );
    }

    #[test]
    fn lcore_rows_show_role_worker_and_busy_percent() {
        let text = render_status(&sample());
        assert_eq!(
            words(line_with(&text, "management")),
            [
                "0",
                "management",
                "-",
                "0.5",
                "0",
                "0",
                "0",
                "0",
                "0",
                "0",
                "0"
            ]
        );
        assert_eq!(
            words(line_with(&text, "worker ")),
            ["2", "worker", "0", "37.3", "1234", "1200", "99000", "17", "40", "5", "6"]
        );
    }

    #[test]
    fn drops_list_every_reason_sorted_with_zeros_and_a_total() {
        let text = render_status(&sample());
        let section: Vec<&str> = text
            .split("\ndrops (total 7)\n")
            .nth(1)
            .expect("drops section with total")
            .lines()
            .take_while(|line| !line.is_empty())
            .collect();
        let rows: Vec<Vec<&str>> = section.iter().map(|line| words(line)).collect();
        assert_eq!(
            rows,
            [["bad_arp", "0"], ["truncated", "5"], ["tx_full", "2"]]
        );
        assert!(
            text.contains("\nevents (total 4)\n  arp_replied  4\n"),
            "{text}"
        );
    }

    #[test]
    fn numeric_columns_are_right_aligned() {
        let mut report = sample();
        let mut second = report.ports[0].clone();
        second.id = 1;
        second.name = "net_ring1".into();
        second.rx_packets = 5;
        second.link_up = false;
        report.ports.push(second);
        let text = render_status(&report);
        let first = line_with(&text, "net_ring0");
        let second = line_with(&text, "net_ring1");
        // Right alignment means the RX-PKTS cells end in the same column.
        let end_of = |line: &str, cell: &str| line.find(cell).unwrap() + cell.len();
        assert_eq!(end_of(first, " 1234 "), end_of(second, "    5 "));
        assert_eq!(words(second)[4..6], ["down", "-"]);
    }

    #[test]
    fn status_shows_how_fast_changes_reached_the_workers() {
        let text = render_status(&sample());
        assert_eq!(
            text.lines().nth(2),
            Some(
                "changes: 6 published (generation 7), 5 adopted everywhere within 1 ms; \
                 last 12.3 us, p50 9.0 us, p99 250.0 us, max 250.0 us; 1 late (> 50 ms)"
            )
        );
        let none = render_status(&StatusReport::default());
        assert_eq!(
            none.lines().nth(2),
            Some("changes: none published since start")
        );
    }

    #[test]
    fn empty_sections_say_none() {
        let text = render_status(&StatusReport::default());
        assert!(text.contains("\nports\n  (none)\n"), "{text}");
        assert!(text.contains("\nlcores\n  (none)\n"), "{text}");
        assert!(text.contains("\ndrops (total 0)\n  (none)\n"), "{text}");
        assert!(text.lines().all(|line| line == line.trim_end()));
    }

    #[test]
    fn status_report_round_trips_through_json() {
        let report = sample();
        let json = serde_json::to_string(&report).unwrap();
        let back: StatusReport = serde_json::from_str(&json).unwrap();
        assert_eq!(back, report);
    }

    #[test]
    fn xstats_render_one_line_per_statistic_in_driver_order() {
        let report = XstatsReport {
            port: 1,
            name: "net_ring1".into(),
            stats: vec![("rx_good_packets".into(), 10), ("rx_q0_bytes".into(), 640)],
        };
        assert_eq!(
            render_xstats(&report),
            "port 1 (net_ring1): 2 extended statistics\n  rx_good_packets   10\n  rx_q0_bytes      640\n"
        );
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["stats"][0], serde_json::json!(["rx_good_packets", 10]));
    }

    #[test]
    fn speeds_and_uptimes_format_compactly() {
        assert_eq!(format_speed(true, 100), "100M");
        assert_eq!(format_speed(true, 2500), "2.5G");
        assert_eq!(format_speed(true, 100_000), "100G");
        assert_eq!(format_speed(true, 0), "-");
        assert_eq!(format_speed(false, 10_000), "-");
        assert_eq!(format_uptime(0), "00:00:00");
        assert_eq!(format_uptime(3_661_999), "01:01:01");
        assert_eq!(format_uptime(2 * 86_400_000 + 5_000), "2d 00:00:05");
    }
}

/// `sluicectl -L`: virtual services, their real servers and counters summed over
/// workers.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ServicesReport {
    pub services: Vec<ServiceStatus>,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ServiceStatus {
    /// "tcp" or "udp".
    pub proto: String,
    pub vip: String,
    pub port: u16,
    pub scheduler: String,
    /// Persistence timeout in seconds, when set (`-p`).
    pub persistence_s: Option<u32>,
    /// Persistence netmask (`-M`), when persistence is set.
    #[serde(default)]
    pub persistence_netmask: Option<String>,
    /// Scheduler flags (`-b`), comma-separated; empty when none.
    #[serde(default)]
    pub sched_flags: String,
    /// Whether some real server can take a new connection (weight > 0); when not,
    /// new connections are dropped and an `lb=alert` line was logged.
    #[serde(default)]
    pub available: bool,
    pub real_servers: Vec<RealServerStatus>,
    /// FullNAT local addresses (`--add-laddr`), in the order they were added. Only in
    /// the JSON: the ipvsadm text layout has no place for them (see `--get-laddr`).
    #[serde(default)]
    pub local_addresses: Vec<String>,
    /// Whether TOA (the client address as a TCP option) is on for FullNAT sessions.
    #[serde(default)]
    pub toa: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RealServerStatus {
    pub ip: String,
    pub port: u16,
    pub weight: u32,
    /// "dr", "nat", "tun" or "fullnat".
    pub mode: String,
    pub active: u64,
    pub inactive: u64,
    pub connections: u64,
    pub in_packets: u64,
    pub out_packets: u64,
    pub in_bytes: u64,
    pub out_bytes: u64,
    /// Connection thresholds (`-x`, `-y`); 0 = none.
    #[serde(default)]
    pub upper: u32,
    #[serde(default)]
    pub lower: u32,
    /// Per second over the listing's window (`-L --rate`: 2 s, as IPVS).
    #[serde(default)]
    pub cps: u64,
    #[serde(default)]
    pub in_pps: u64,
    #[serde(default)]
    pub out_pps: u64,
    #[serde(default)]
    pub in_bps: u64,
    #[serde(default)]
    pub out_bps: u64,
    /// Evicted by health checking (no new connections; the weight stays).
    #[serde(default)]
    pub evicted: bool,
    /// Times health checking evicted it.
    #[serde(default)]
    pub evictions: u64,
}

fn ipvsadm_forward(mode: &str) -> &str {
    match mode {
        "dr" => "Route",
        "nat" => "Masq",
        "tun" => "Tunnel",
        "fullnat" => "FullNat",
        other => other,
    }
}

/// Renders the report in `ipvsadm -Ln` layout (or `ipvsadm -Ln --stats` with `stats`),
/// so scripts that parse ipvsadm's columns keep working. Counters are always exact, as
/// `ipvsadm --exact` prints them: a 33-column name, then each number right-aligned in
/// 8 after a space (wider when it has more digits), never abbreviated to K/M/G.
pub fn render_services(report: &ServicesReport, stats: bool) -> String {
    let mut out = String::from("IP Virtual Server version 1.2.1 (size=4096)\n");
    if stats {
        out += "Prot LocalAddress:Port               Conns   InPkts  OutPkts  InBytes OutBytes\n";
        out += "  -> RemoteAddress:Port\n";
    } else {
        out += "Prot LocalAddress:Port Scheduler Flags\n";
        out += "  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn\n";
    }
    for s in &report.services {
        let proto = s.proto.to_uppercase();
        let local = format!("{}:{}", s.vip, s.port);
        if stats {
            let sum = |f: fn(&RealServerStatus) -> u64| s.real_servers.iter().map(f).sum::<u64>();
            let _ = writeln!(
                out,
                "{proto:<4} {local:<28} {:>8} {:>8} {:>8} {:>8} {:>8}",
                sum(|r| r.connections),
                sum(|r| r.in_packets),
                sum(|r| r.out_packets),
                sum(|r| r.in_bytes),
                sum(|r| r.out_bytes)
            );
        } else {
            // ipvsadm: "persistent 300" and, for a netmask other than /32, "mask M".
            let persistent = s
                .persistence_s
                .map(|p| match s.persistence_netmask.as_deref() {
                    Some(m) if m != "255.255.255.255" => format!(" persistent {p} mask {m}"),
                    _ => format!(" persistent {p}"),
                })
                .unwrap_or_default();
            let _ = writeln!(out, "{proto:<4} {local} {}{persistent}", s.scheduler);
        }
        for r in &s.real_servers {
            let remote = format!("{}:{}", r.ip, r.port);
            if stats {
                let _ = writeln!(
                    out,
                    "  -> {remote:<28} {:>8} {:>8} {:>8} {:>8} {:>8}",
                    r.connections, r.in_packets, r.out_packets, r.in_bytes, r.out_bytes
                );
            } else {
                let _ = writeln!(
                    out,
                    "  -> {remote:<28} {:<7} {:<6} {:<10} {:<10}",
                    ipvsadm_forward(&r.mode),
                    r.weight,
                    r.active,
                    r.inactive
                );
            }
        }
    }
    out
}

/// `-L --rate`, in ipvsadm's layout: per service and real server, connections, packets
/// and bytes per second each way.
pub fn render_rates(report: &ServicesReport) -> String {
    let mut out = String::from("IP Virtual Server version 1.2.1 (size=4096)\n");
    out += "Prot LocalAddress:Port                 CPS    InPPS   OutPPS    InBPS   OutBPS\n";
    out += "  -> RemoteAddress:Port\n";
    for s in &report.services {
        let sum = |f: fn(&RealServerStatus) -> u64| s.real_servers.iter().map(f).sum::<u64>();
        let local = format!("{}:{}", s.vip, s.port);
        let _ = writeln!(
            out,
            "{:<4} {local:<28} {:>8} {:>8} {:>8} {:>8} {:>8}",
            s.proto.to_uppercase(),
            sum(|r| r.cps),
            sum(|r| r.in_pps),
            sum(|r| r.out_pps),
            sum(|r| r.in_bps),
            sum(|r| r.out_bps)
        );
        for r in &s.real_servers {
            let remote = format!("{}:{}", r.ip, r.port);
            let _ = writeln!(
                out,
                "  -> {remote:<28} {:>8} {:>8} {:>8} {:>8} {:>8}",
                r.cps, r.in_pps, r.out_pps, r.in_bps, r.out_bps
            );
        }
    }
    out
}

/// Connection skew above this (max over average, percent) earns a WARN (seed 000).
pub const DEFAULT_SKEW_THRESHOLD_PCT: u32 = 300;
/// In-packets per new connection above this: traffic rides on a few long-lived
/// connections, and L4 balance is luck (seed 000's rule of thumb, with in-packets as
/// the L4 proxy for requests).
pub const PACKETS_PER_CONNECTION_ADVISORY: u64 = 1000;

/// max / average of `values`, in percent (100 = even); 0 without traffic.
pub fn skew_pct(values: &[u64]) -> u64 {
    let total: u64 = values.iter().sum();
    if values.is_empty() || total == 0 {
        return 0;
    }
    let max = *values.iter().max().unwrap();
    max * 100 * values.len() as u64 / total
}

/// `sluicectl skew`: per service, each real server's connections (active + inactive,
/// as `ipvsadm -Lnc` counts them), new connections/s, packets/s and bytes/s, the
/// max/avg skew of each, a WARN when connection skew passes `threshold_pct`, and an
/// advisory when in-packets per new connection pass [`PACKETS_PER_CONNECTION_ADVISORY`].
pub fn render_skew(report: &ServicesReport, only: Option<&str>, threshold_pct: u32) -> String {
    let mut out = String::new();
    for s in &report.services {
        let name = format!("{} {}:{}", s.proto.to_uppercase(), s.vip, s.port);
        if only.is_some_and(|o| o != format!("{}:{}", s.vip, s.port)) {
            continue;
        }
        let conns: Vec<u64> = s
            .real_servers
            .iter()
            .map(|r| r.active + r.inactive)
            .collect();
        let cps: Vec<u64> = s.real_servers.iter().map(|r| r.cps).collect();
        let pps: Vec<u64> = s
            .real_servers
            .iter()
            .map(|r| r.in_pps + r.out_pps)
            .collect();
        let bps: Vec<u64> = s
            .real_servers
            .iter()
            .map(|r| r.in_bps + r.out_bps)
            .collect();
        let _ = writeln!(out, "{name} ({})", s.scheduler);
        let _ = writeln!(
            out,
            "  {:<24} {:>8} {:>8} {:>10} {:>12}",
            "RemoteAddress:Port", "Conns", "CPS", "PPS", "BPS"
        );
        for (i, r) in s.real_servers.iter().enumerate() {
            let _ = writeln!(
                out,
                "  {:<24} {:>8} {:>8} {:>10} {:>12}",
                format!("{}:{}", r.ip, r.port),
                conns[i],
                cps[i],
                pps[i],
                bps[i]
            );
        }
        let (sc, scps, spps, sbps) = (
            skew_pct(&conns),
            skew_pct(&cps),
            skew_pct(&pps),
            skew_pct(&bps),
        );
        let _ = writeln!(
            out,
            "  skew max/avg: conns {sc}%  cps {scps}%  pps {spps}%  bps {sbps}%"
        );
        if sc > u64::from(threshold_pct) {
            let _ = writeln!(
                out,
                "  WARN connection skew {sc}% > {threshold_pct}% on {name}: one real server holds far more connections than the average"
            );
        }
        let (new, inp): (u64, u64) = (
            cps.iter().sum(),
            s.real_servers.iter().map(|r| r.in_pps).sum(),
        );
        if inp > 0 && (new == 0 || inp / new.max(1) > PACKETS_PER_CONNECTION_ADVISORY) {
            let per = match inp.checked_div(new) {
                Some(n) => format!("{n} in-packets per new connection"),
                None => "no new connections".to_string(),
            };
            let _ = writeln!(
                out,
                "  ADVISORY {per} (in-packets are the L4 proxy for requests): traffic rides on few long-lived connections, so L4 balance is luck (seed 000); balance requests at L7 or recycle connections"
            );
        }
    }
    if out.is_empty() {
        out = match only {
            Some(o) => format!("no service {o}\n"),
            None => "no services\n".to_string(),
        };
    }
    out
}

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

/// `-L --timeout`: the session timeouts in seconds, as ipvsadm names them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimeoutsReport {
    pub tcp: u32,
    pub tcpfin: u32,
    pub udp: u32,
}

/// `sluicectl events`: one line per event, oldest first, stamped in UTC.
pub fn render_events(report: &EventsReport) -> String {
    let mut out = String::new();
    for e in &report.events {
        let _ = writeln!(out, "{} {}", utc(e.unix_ms), e.line);
    }
    if out.is_empty() {
        out.push_str("no events\n");
    }
    out
}

/// `sluicectl vrrp`.
pub fn render_vrrp(r: &VrrpReport) -> String {
    let s = &r.stats;
    // No master heard prints as JSON's null, as it always has.
    let master_priority = r
        .master_priority
        .map_or_else(|| "null".to_string(), |p| p.to_string());
    format!(
        "VRRP vrid {} {} (priority {}, advert {} ms, preempt {}) from {} for {:.1}s\n\
         master heard: {} (priority {})\n\
         adverts sent {} received {} rejected {}; gratuitous ARP {}; transitions {}\n",
        r.vrid,
        r.state,
        r.priority,
        r.advert_interval_ms,
        r.preempt,
        r.primary,
        r.since_change_ms as f64 / 1000.0,
        r.master.as_deref().unwrap_or("-"),
        master_priority,
        s.adverts_sent,
        s.adverts_received,
        s.adverts_rejected,
        s.gratuitous_arps_sent,
        s.transitions
    )
}

/// `sluicectl sync`: what was sent and received, the rejections, then one line per
/// peer (when last heard, sequence gaps, the bulk resync asked of it).
pub fn render_sync(r: &SyncReport) -> String {
    let s = &r.stats;
    let mut out = String::new();
    let multicast = r
        .multicast
        .as_deref()
        .map(|g| format!(", multicast {g}"))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "sync on {}{multicast}, peers {}, {}",
        r.listen,
        r.peers.join(" "),
        if r.authenticated {
            "HMAC on"
        } else {
            "UNAUTHENTICATED (unauthenticated = true: no key; forged messages from a peer's address are believed)"
        }
    );
    let _ = writeln!(
        out,
        "sent: {} messages ({} bytes), {} session events, {} templates, {} send errors; \
         events lost to full rings {}",
        s.messages_sent,
        s.bytes_sent,
        s.events_sent,
        s.templates_sent,
        s.send_errors,
        r.events_dropped
    );
    let _ = writeln!(
        out,
        "received: {} datagrams, {} accepted with {} records; {} templates installed; \
         records lost to full install inboxes {}",
        s.datagrams_received,
        r.accepted_messages,
        r.accepted_records,
        s.templates_installed,
        s.install_inbox_full
    );
    let rejected: Vec<String> = r
        .rejected
        .iter()
        .filter(|(_, v)| **v > 0)
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    let _ = writeln!(
        out,
        "rejected: {}",
        if rejected.is_empty() {
            "none".to_string()
        } else {
            rejected.join(", ")
        }
    );
    let _ = writeln!(
        out,
        "records refused (contradict this node's config): real server {}, mode {}, local address {}; \
         timeouts cut to this node's {}",
        s.records_refused_real_server,
        s.records_refused_mode,
        s.records_refused_local,
        s.timeouts_clamped
    );
    let _ = writeln!(
        out,
        "resync: {} requests sent, {} received ({} ignored: rate limit), {} dumps sent, {} chunks received",
        s.resync_requests_sent,
        s.resync_requests_received,
        s.resync_requests_ignored,
        s.dumps_sent,
        s.dump_chunks_received
    );
    let _ = writeln!(
        out,
        "{:<16} {:>10} {:>9} {:>6} {:>9} {:>8}  Resync",
        "Peer", "Heard", "Messages", "Lost", "Reordered", "Restarts"
    );
    for p in &r.peer_status {
        let heard = p.last_heard_ms_ago.map_or_else(
            || "never".to_string(),
            |ms| format!("{:.3}s ago", ms as f64 / 1000.0),
        );
        let rs = &p.resync;
        let under_way = |state: &str| {
            format!(
                "{state}: {} chunk(s), {} records (attempt {})",
                rs.chunks, rs.records, rs.attempts
            )
        };
        let resync = match rs.state {
            ResyncState::None => "-".to_string(),
            ResyncState::Complete => format!(
                "complete: {} chunk(s), {} records in {} ms (attempt {})",
                rs.chunks,
                rs.records,
                rs.took_ms.unwrap_or(0),
                rs.attempts
            ),
            ResyncState::Requested => under_way("requested"),
            ResyncState::Receiving => under_way("receiving"),
            ResyncState::Failed => under_way("failed"),
        };
        let _ = writeln!(
            out,
            "{:<16} {:>10} {:>9} {:>6} {:>9} {:>8}  {resync}",
            p.addr.to_string(),
            heard,
            p.messages,
            p.lost,
            p.reordered,
            p.restarts
        );
    }
    for p in &r.peer_status {
        let epoch = p
            .epoch
            .map_or_else(|| "not confirmed".to_string(), |e| e.to_string());
        let _ = writeln!(
            out,
            "{:<16} epoch {epoch}; refused: replayed {}, too old {}, old epoch {}, unconfirmed epoch {}; \
             out of window {}; resync requests rate-limited {}",
            p.addr.to_string(),
            p.replayed,
            p.too_old,
            p.old_epoch,
            p.unconfirmed_epoch,
            p.out_of_window,
            p.resync_rate_limited
        );
    }
    out
}

/// `sluicectl health`: one line per watched real server, then the probe counters.
pub fn render_health(report: &HealthReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<24} {:<21} {:<5} {:<8} {:>9} {:>6} {:<22} {:>10}",
        "Service", "RealServer", "Check", "State", "Evictions", "Fall", "LastProbe", "SinceChange"
    );
    for t in &report.targets {
        let rs = format!("{}:{}", t.ip, t.port);
        let state = if t.evicted { "EVICTED" } else { "up" };
        let check = t.check.name();
        let check = if t.passive {
            format!("{check}+p")
        } else {
            check.to_string()
        };
        let _ = writeln!(
            out,
            "{:<24} {:<21} {:<5} {:<8} {:>9} {:>6} {:<22} {:>9.1}s",
            t.service,
            rs,
            check,
            state,
            t.evictions,
            format!("{}/{}", t.fall, t.rise),
            t.last_outcome.as_deref().unwrap_or("-"),
            t.since_change_ms as f64 / 1000.0
        );
    }
    let s = &report.stats;
    let _ = writeln!(
        out,
        "probes from {}: sent {} ok {} failed {} (timed out {}) skipped {}; replies {} stray {}",
        report.source,
        s.probes_sent,
        s.probes_ok,
        s.probes_failed,
        s.probes_timed_out,
        s.probes_skipped,
        s.replies,
        s.stray_replies
    );
    out
}

/// `2026-11-30T11:55:27.123Z` for milliseconds since the Unix epoch (proleptic
/// Gregorian calendar, Howard Hinnant's days-to-civil).
pub fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:03}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        ms % 1000
    )
}

/// `-L --timeout`, as ipvsadm prints it.
pub fn render_timeouts(t: &TimeoutsReport) -> String {
    format!(
        "Timeout (tcp tcpfin udp): {} {} {}\n",
        t.tcp, t.tcpfin, t.udp
    )
}

/// `-S`: the services as `ipvsadm-save -n` lines, which `-R` reads back: one `-A` per
/// service (scheduler, persistence), one `-a` per real server (mode, weight,
/// thresholds when set), and DPVS's `-P` for FullNAT local addresses. TOA is a
/// config-file setting and is not saved.
pub fn render_save(report: &ServicesReport) -> String {
    let mut out = String::new();
    for s in &report.services {
        let flag = if s.proto == "udp" { "-u" } else { "-t" };
        let service = format!("{flag} {}:{}", s.vip, s.port);
        let mut line = format!("-A {service} -s {}", s.scheduler);
        if !s.sched_flags.is_empty() {
            let _ = write!(line, " -b {}", s.sched_flags);
        }
        if let Some(p) = s.persistence_s {
            let _ = write!(line, " -p {p}");
            if let Some(mask) = s
                .persistence_netmask
                .as_deref()
                .filter(|m| *m != "255.255.255.255")
            {
                let _ = write!(line, " -M {mask}");
            }
        }
        let _ = writeln!(out, "{line}");
        for r in &s.real_servers {
            let mode = match r.mode.as_str() {
                "nat" => "-m",
                "tun" => "-i",
                "fullnat" => "-b",
                _ => "-g",
            };
            let mut line = format!("-a {service} -r {}:{} {mode} -w {}", r.ip, r.port, r.weight);
            if r.upper > 0 {
                let _ = write!(line, " -x {}", r.upper);
            }
            if r.lower > 0 {
                let _ = write!(line, " -y {}", r.lower);
            }
            let _ = writeln!(out, "{line}");
        }
        for lip in &s.local_addresses {
            let _ = writeln!(out, "-P {service} -z {lip}");
        }
    }
    out
}

/// `--get-laddr`: one service's FullNAT local addresses, in the order they were added,
/// and each worker's port pool on each of them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LaddrReport {
    pub service: ServiceKey,
    pub local_addresses: Vec<Ipv4Addr>,
    /// Per worker and local address (as DPVS's `dpip addr show -s` per lcore); empty
    /// when the service has no FullNAT real server (no pools) or before traffic.
    #[serde(default)]
    pub pools: Vec<LaddrPoolStatus>,
}

/// One worker's ports on one local address.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LaddrPoolStatus {
    pub worker: u16,
    pub lip: Ipv4Addr,
    /// Ports this worker has in use on the address.
    pub used: u32,
    /// Ports of this worker's share not in use.
    pub free: u32,
    /// Allocations on this address that found no suitable free port.
    pub misses: u64,
}

/// Renders `--get-laddr` as DPVS's ipvsadm lays it out: the service with the number of
/// local addresses, then one local address per line in the last column; then, when
/// there are pools, one line per worker and address with its port counts.
pub fn render_laddrs(report: &LaddrReport) -> String {
    let mut out = format!("{:<20} {:<8} {}\n", "VIP:VPORT", "TOTAL", "LIP");
    let service = format!("{}:{}", report.service.vip, report.service.port);
    let _ = writeln!(out, "{service:<20} {}", report.local_addresses.len());
    for lip in &report.local_addresses {
        let _ = writeln!(out, "{:<20} {:<8} {lip}", "", "");
    }
    if !report.pools.is_empty() {
        let _ = writeln!(
            out,
            "\n{:<8} {:<16} {:>8} {:>8} {:>10}",
            "WORKER", "LIP", "USED", "FREE", "MISS"
        );
        for p in &report.pools {
            let _ = writeln!(
                out,
                "{:<8} {:<16} {:>8} {:>8} {:>10}",
                p.worker,
                p.lip.to_string(),
                p.used,
                p.free,
                p.misses
            );
        }
    }
    out
}

/// `-Lnc`: the sessions of every worker.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ConnectionsReport {
    pub connections: Vec<ConnectionStatus>,
    /// More sessions exist than the listing's bound allowed.
    pub truncated: bool,
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
}

/// Renders `-Lnc`: ipvsadm's columns (`pro expire state source virtual destination`,
/// the real server last so `awk '{print $NF}'` pipelines keep working) with DPVS's
/// additions: the worker as `[w]` before the protocol and the FullNAT local address
/// before the destination (`-` for other modes).
pub fn render_connections(report: &ConnectionsReport) -> String {
    let mut out = String::from("IPVS connection entries\n");
    let _ = writeln!(
        out,
        "pro expire state       source                virtual               local                 destination"
    );
    for c in &report.connections {
        let expire = format!("{:02}:{:02}", c.expires_s / 60, c.expires_s % 60);
        let _ = writeln!(
            out,
            "{:<6} {expire:<6} {:<11} {:<21} {:<21} {:<21} {}",
            format!(
                "[{}]{}",
                c.worker.map_or_else(|| "-".to_string(), |w| w.to_string()),
                c.proto.to_uppercase()
            ),
            c.state,
            c.client,
            c.virtual_service,
            c.local.as_deref().unwrap_or("-"),
            c.destination
        );
    }
    if report.truncated {
        out.push_str("(more sessions exist than this listing holds)\n");
    }
    out
}

#[cfg(test)]
mod services_tests {
    use super::*;

    fn report() -> ServicesReport {
        ServicesReport {
            services: vec![ServiceStatus {
                proto: "tcp".into(),
                vip: "198.18.1.1".into(),
                port: 80,
                scheduler: "rr".into(),
                persistence_s: None,
                persistence_netmask: None,
                sched_flags: String::new(),
                available: true,
                real_servers: vec![RealServerStatus {
                    ip: "198.18.0.11".into(),
                    port: 80,
                    weight: 1,
                    mode: "dr".into(),
                    active: 2,
                    inactive: 1,
                    connections: 3,
                    in_packets: 15,
                    in_bytes: 900,
                    ..Default::default()
                }],
                local_addresses: vec!["198.18.0.50".into()],
                toa: true,
            }],
        }
    }

    #[test]
    fn save_prints_ipvsadm_save_lines() {
        let mut r = report();
        r.services[0].persistence_s = Some(600);
        r.services[0].persistence_netmask = Some("255.255.255.0".into());
        r.services[0].real_servers.push(RealServerStatus {
            ip: "198.18.0.12".into(),
            port: 8080,
            weight: 3,
            mode: "fullnat".into(),
            upper: 100,
            lower: 10,
            ..Default::default()
        });
        r.services.push(ServiceStatus {
            proto: "udp".into(),
            vip: "198.18.1.2".into(),
            port: 53,
            scheduler: "wrr".into(),
            persistence_s: Some(300),
            persistence_netmask: Some("255.255.255.255".into()),
            ..Default::default()
        });
        assert_eq!(
            render_save(&r),
            "-A -t 198.18.1.1:80 -s rr -p 600 -M 255.255.255.0\n\
             -a -t 198.18.1.1:80 -r 198.18.0.11:80 -g -w 1\n\
             -a -t 198.18.1.1:80 -r 198.18.0.12:8080 -b -w 3 -x 100 -y 10\n\
             -P -t 198.18.1.1:80 -z 198.18.0.50\n\
             -A -u 198.18.1.2:53 -s wrr -p 300\n"
        );
        // Every line parses back as the command it stands for.
        for line in render_save(&r).lines() {
            let args: Vec<String> = line.split_whitespace().map(str::to_string).collect();
            let parsed = crate::control::ipvsadm::parse(&args).unwrap();
            assert_eq!(
                parsed.output,
                crate::control::ipvsadm::Output::Quiet,
                "{line}"
            );
        }
    }

    #[test]
    fn skew_ratios_warnings_and_the_long_lived_advisory() {
        assert_eq!(skew_pct(&[47, 6, 5, 4, 4, 3, 3, 2]), 47 * 100 * 8 / 74);
        assert_eq!(skew_pct(&[10, 10, 10]), 100);
        assert_eq!(skew_pct(&[0, 0]), 0);
        let mut r = report();
        let rs = |ip: &str, active: u64, cps: u64, in_pps: u64| RealServerStatus {
            ip: ip.into(),
            port: 80,
            active,
            cps,
            in_pps,
            ..Default::default()
        };
        // Seed 000: 78 long connections, 47 on one server, 6000+ packets/s, no new
        // connections.
        r.services[0].real_servers = vec![
            rs("10.0.3.14", 47, 0, 3600),
            rs("10.0.3.11", 6, 0, 460),
            rs("10.0.3.17", 5, 0, 380),
            rs("10.0.3.12", 4, 0, 300),
            rs("10.0.3.13", 4, 0, 300),
            rs("10.0.3.15", 4, 0, 300),
            rs("10.0.3.16", 4, 0, 300),
            rs("10.0.3.18", 4, 0, 300),
        ];
        let text = render_skew(&r, None, DEFAULT_SKEW_THRESHOLD_PCT);
        assert!(text.contains("WARN connection skew 482% > 300%"), "{text}");
        assert!(text.contains("ADVISORY no new connections"), "{text}");
        let calm = render_skew(&r, None, 500);
        assert!(!calm.contains("WARN"), "{calm}");
        // Many new connections for the packets: no advisory.
        for s in &mut r.services[0].real_servers {
            s.cps = 100;
        }
        assert!(!render_skew(&r, None, 300).contains("ADVISORY"));
        assert_eq!(
            render_skew(&r, Some("198.18.9.9:80"), 300),
            "no service 198.18.9.9:80\n"
        );
    }

    #[test]
    fn rates_render_in_ipvsadm_layout() {
        let mut r = report();
        r.services[0].real_servers[0].cps = 12;
        r.services[0].real_servers[0].in_pps = 340;
        let text = render_rates(&r);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>(),
            [
                "Prot",
                "LocalAddress:Port",
                "CPS",
                "InPPS",
                "OutPPS",
                "InBPS",
                "OutBPS"
            ]
        );
        assert_eq!(
            lines[3].split_whitespace().collect::<Vec<_>>(),
            ["TCP", "198.18.1.1:80", "12", "340", "0", "0", "0"]
        );
        assert_eq!(
            lines[4].split_whitespace().collect::<Vec<_>>(),
            ["->", "198.18.0.11:80", "12", "340", "0", "0", "0"]
        );
    }

    #[test]
    fn events_are_stamped_in_utc() {
        assert_eq!(utc(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(utc(951_782_400_000), "2000-02-29T00:00:00.000Z");
        assert_eq!(utc(1_796_039_727_123), "2026-11-30T11:55:27.123Z");
        let events = EventsReport {
            events: vec![EventLine {
                unix_ms: 1_796_039_727_123,
                line: "lb=config op=clear".into(),
            }],
        };
        assert_eq!(
            render_events(&events),
            "2026-11-30T11:55:27.123Z lb=config op=clear\n"
        );
        assert_eq!(render_events(&EventsReport::default()), "no events\n");
    }

    #[test]
    fn timeouts_render_as_ipvsadm() {
        let t = TimeoutsReport {
            tcp: 900,
            tcpfin: 120,
            udp: 300,
        };
        assert_eq!(
            render_timeouts(&t),
            "Timeout (tcp tcpfin udp): 900 120 300\n"
        );
    }

    #[test]
    fn list_shows_persistence_and_its_mask_as_ipvsadm() {
        let mut r = report();
        r.services[0].persistence_s = Some(300);
        r.services[0].persistence_netmask = Some("255.255.255.255".into());
        assert_eq!(
            render_services(&r, false).lines().nth(3),
            Some("TCP  198.18.1.1:80 rr persistent 300")
        );
        r.services[0].persistence_netmask = Some("255.255.0.0".into());
        assert_eq!(
            render_services(&r, false).lines().nth(3),
            Some("TCP  198.18.1.1:80 rr persistent 300 mask 255.255.0.0")
        );
    }

    #[test]
    fn list_matches_ipvsadm_columns() {
        let text = render_services(&report(), false);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[1], "Prot LocalAddress:Port Scheduler Flags");
        assert_eq!(lines[3], "TCP  198.18.1.1:80 rr");
        assert_eq!(
            lines[4],
            "  -> 198.18.0.11:80               Route   1      2          1         "
        );
        // The seed-000 pipeline: the last field of each real-server line is InActConn.
        assert_eq!(lines[4].split_whitespace().last(), Some("1"));
    }

    #[test]
    fn local_addresses_and_toa_stay_out_of_the_ipvsadm_text() {
        let mut bare = report();
        bare.services[0].local_addresses.clear();
        bare.services[0].toa = false;
        for stats in [false, true] {
            assert_eq!(
                render_services(&report(), stats),
                render_services(&bare, stats)
            );
        }
    }

    #[test]
    fn services_report_json_carries_local_addresses_and_defaults_without_them() {
        let json = serde_json::to_value(report()).unwrap();
        assert_eq!(
            json["services"][0]["local_addresses"],
            serde_json::json!(["198.18.0.50"])
        );
        assert_eq!(json["services"][0]["toa"], serde_json::json!(true));
        let back: ServicesReport = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(back, report());
        // A reply from a daemon that predates them still parses.
        let mut old = json;
        let service = old["services"][0].as_object_mut().unwrap();
        service.remove("local_addresses");
        service.remove("toa");
        let back: ServicesReport = serde_json::from_value(old).unwrap();
        assert!(back.services[0].local_addresses.is_empty());
        assert!(!back.services[0].toa);
    }

    #[test]
    fn laddr_pools_render_per_worker_after_the_addresses() {
        let report = LaddrReport {
            service: ServiceKey::new(
                crate::model::Protocol::Tcp,
                Ipv4Addr::new(198, 18, 1, 1),
                80,
            ),
            local_addresses: vec![Ipv4Addr::new(198, 18, 0, 50)],
            pools: vec![
                LaddrPoolStatus {
                    worker: 0,
                    lip: Ipv4Addr::new(198, 18, 0, 50),
                    used: 3,
                    free: 32253,
                    misses: 0,
                },
                LaddrPoolStatus {
                    worker: 1,
                    lip: Ipv4Addr::new(198, 18, 0, 50),
                    used: 8,
                    free: 0,
                    misses: 12,
                },
            ],
        };
        let text = render_laddrs(&report);
        let rows: Vec<Vec<&str>> = text
            .lines()
            .skip_while(|l| !l.starts_with("WORKER"))
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            rows,
            [
                vec!["WORKER", "LIP", "USED", "FREE", "MISS"],
                vec!["0", "198.18.0.50", "3", "32253", "0"],
                vec!["1", "198.18.0.50", "8", "0", "12"],
            ]
        );
    }

    #[test]
    fn connections_render_ipvsadm_columns_with_worker_and_local_address() {
        let conn = |worker, local: Option<&str>, rs: &str| ConnectionStatus {
            worker: Some(worker),
            proto: "tcp".into(),
            expires_s: 899,
            state: "ESTABLISHED".into(),
            client: "198.18.0.9:40000".into(),
            virtual_service: "198.18.1.1:80".into(),
            local: local.map(str::to_string),
            destination: rs.into(),
        };
        let report = ConnectionsReport {
            connections: vec![
                conn(0, None, "198.18.0.2:8080"),
                conn(1, Some("198.18.0.50:1031"), "198.18.0.3:8080"),
            ],
            truncated: false,
        };
        let text = render_connections(&report);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "IPVS connection entries");
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>(),
            [
                "pro",
                "expire",
                "state",
                "source",
                "virtual",
                "local",
                "destination"
            ]
        );
        assert_eq!(
            lines[2].split_whitespace().collect::<Vec<_>>(),
            [
                "[0]TCP",
                "14:59",
                "ESTABLISHED",
                "198.18.0.9:40000",
                "198.18.1.1:80",
                "-",
                "198.18.0.2:8080"
            ]
        );
        assert_eq!(
            lines[3].split_whitespace().collect::<Vec<_>>(),
            [
                "[1]TCP",
                "14:59",
                "ESTABLISHED",
                "198.18.0.9:40000",
                "198.18.1.1:80",
                "198.18.0.50:1031",
                "198.18.0.3:8080"
            ]
        );
        // Seed 000's pipeline: `awk 'NR>1{print $NF}'` gives the real servers.
        let last: Vec<&str> = lines[2..]
            .iter()
            .map(|l| l.split_whitespace().last().unwrap())
            .collect();
        assert_eq!(last, ["198.18.0.2:8080", "198.18.0.3:8080"]);
        assert!(!text.contains("more sessions"));
        let cut = ConnectionsReport {
            truncated: true,
            ..report
        };
        assert!(
            render_connections(&cut).ends_with("(more sessions exist than this listing holds)\n")
        );
        let json = serde_json::to_value(&cut.connections[1]).unwrap();
        assert_eq!(json["virtual"], "198.18.1.1:80");
        assert_eq!(json["local"], "198.18.0.50:1031");
    }

    #[test]
    fn laddrs_render_one_per_line_under_the_service() {
        let report = LaddrReport {
            service: ServiceKey::new(
                crate::model::Protocol::Tcp,
                Ipv4Addr::new(198, 18, 1, 1),
                80,
            ),
            local_addresses: vec![Ipv4Addr::new(198, 18, 0, 50), Ipv4Addr::new(198, 18, 0, 51)],
            pools: Vec::new(),
        };
        let expected: String = [
            "VIP:VPORT            TOTAL    LIP",
            "198.18.1.1:80        2",
            "                              198.18.0.50",
            "                              198.18.0.51",
        ]
        .iter()
        .map(|line| format!("{line}\n"))
        .collect();
        assert_eq!(render_laddrs(&report), expected);
        let text = render_laddrs(&report);
        let lips: Vec<&str> = text
            .lines()
            .skip(2)
            .map(|l| l.split_whitespace().last().unwrap())
            .collect();
        assert_eq!(lips, ["198.18.0.50", "198.18.0.51"]);
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "service": {"proto": "tcp", "vip": "198.18.1.1", "port": 80},
                "local_addresses": ["198.18.0.50", "198.18.0.51"],
                "pools": []
            })
        );
        let empty = LaddrReport {
            local_addresses: Vec::new(),
            ..report
        };
        assert_eq!(
            render_laddrs(&empty),
            "VIP:VPORT            TOTAL    LIP\n198.18.1.1:80        0\n"
        );
    }

    #[test]
    fn stats_sum_real_servers_into_the_service_line() {
        let text = render_services(&report(), true);
        let service = text.lines().find(|l| l.starts_with("TCP")).unwrap();
        let fields: Vec<&str> = service.split_whitespace().collect();
        assert_eq!(fields, ["TCP", "198.18.1.1:80", "3", "15", "0", "900", "0"]);
    }
}

/// Whole-text golden outputs for the ipvsadm listings. The expected text follows
/// ipvsadm's printf layouts (`%-33s` service names, `  -> %-28s` real servers, numbers
/// as `%9llu` in exact mode, `%-7s %-6d %-10u %-10u` for the -Ln columns), so a script
/// that slices ipvsadm's columns by position reads Sluice's the same way.
#[cfg(test)]
mod ipvsadm_golden {
    use super::*;

    fn rs(ip: &str, port: u16, mode: &str, weight: u32) -> RealServerStatus {
        RealServerStatus {
            ip: ip.into(),
            port,
            mode: mode.into(),
            weight,
            ..Default::default()
        }
    }

    fn report() -> ServicesReport {
        let mut a = rs("198.18.0.11", 8080, "nat", 3);
        (a.active, a.inactive) = (120, 7);
        (a.connections, a.in_packets, a.out_packets) = (127, 4400, 4100);
        (a.in_bytes, a.out_bytes) = (290_000, 123_456_000);
        (a.cps, a.in_pps, a.out_pps, a.in_bps, a.out_bps) = (12, 340, 320, 21_760, 2_048_000);
        let mut b = rs("198.18.0.12", 8080, "nat", 0);
        (b.connections, b.in_packets, b.out_packets) = (3, 100, 100);
        (b.in_bytes, b.out_bytes) = (10_000, 789);
        let mut c = rs("198.18.0.21", 53, "dr", 1);
        (c.active, c.inactive) = (5, 12);
        (c.connections, c.in_packets, c.out_packets) = (17, 34, 34);
        (c.in_bytes, c.out_bytes) = (2040, 2040);
        ServicesReport {
            services: vec![
                ServiceStatus {
                    proto: "tcp".into(),
                    vip: "198.18.1.1".into(),
                    port: 80,
                    scheduler: "wrr".into(),
                    available: true,
                    real_servers: vec![a, b],
                    ..Default::default()
                },
                ServiceStatus {
                    proto: "udp".into(),
                    vip: "198.18.1.2".into(),
                    port: 53,
                    scheduler: "sh".into(),
                    persistence_s: Some(300),
                    persistence_netmask: Some("255.255.255.0".into()),
                    available: true,
                    real_servers: vec![c],
                    ..Default::default()
                },
            ],
        }
    }

    #[test]
    fn list_numeric() {
        assert_eq!(
            render_services(&report(), false),
            "IP Virtual Server version 1.2.1 (size=4096)\n\
             Prot LocalAddress:Port Scheduler Flags\n  \
             -> RemoteAddress:Port           Forward Weight ActiveConn InActConn\n\
             TCP  198.18.1.1:80 wrr\n  \
             -> 198.18.0.11:8080             Masq    3      120        7         \n  \
             -> 198.18.0.12:8080             Masq    0      0          0         \n\
             UDP  198.18.1.2:53 sh persistent 300 mask 255.255.255.0\n  \
             -> 198.18.0.21:53               Route   1      5          12        \n"
        );
    }

    #[test]
    fn list_stats() {
        // The service line sums its real servers; a 9-digit count widens its column
        // by one, as `ipvsadm --exact` does.
        assert_eq!(
            render_services(&report(), true),
            "IP Virtual Server version 1.2.1 (size=4096)\n\
             Prot LocalAddress:Port               Conns   InPkts  OutPkts  InBytes OutBytes\n  \
             -> RemoteAddress:Port\n\
             TCP  198.18.1.1:80                     130     4500     4200   300000 123456789\n  \
             -> 198.18.0.11:8080                  127     4400     4100   290000 123456000\n  \
             -> 198.18.0.12:8080                    3      100      100    10000      789\n\
             UDP  198.18.1.2:53                      17       34       34     2040     2040\n  \
             -> 198.18.0.21:53                     17       34       34     2040     2040\n"
        );
    }

    #[test]
    fn list_rate() {
        assert_eq!(
            render_rates(&report()),
            "IP Virtual Server version 1.2.1 (size=4096)\n\
             Prot LocalAddress:Port                 CPS    InPPS   OutPPS    InBPS   OutBPS\n  \
             -> RemoteAddress:Port\n\
             TCP  198.18.1.1:80                      12      340      320    21760  2048000\n  \
             -> 198.18.0.11:8080                   12      340      320    21760  2048000\n  \
             -> 198.18.0.12:8080                    0        0        0        0        0\n\
             UDP  198.18.1.2:53                       0        0        0        0        0\n  \
             -> 198.18.0.21:53                      0        0        0        0        0\n"
        );
    }

    #[test]
    fn timeouts() {
        let t = TimeoutsReport {
            tcp: 900,
            tcpfin: 120,
            udp: 300,
        };
        assert_eq!(
            render_timeouts(&t),
            "Timeout (tcp tcpfin udp): 900 120 300\n"
        );
    }

    #[test]
    fn save() {
        assert_eq!(
            render_save(&report()),
            "-A -t 198.18.1.1:80 -s wrr\n\
             -a -t 198.18.1.1:80 -r 198.18.0.11:8080 -m -w 3\n\
             -a -t 198.18.1.1:80 -r 198.18.0.12:8080 -m -w 0\n\
             -A -u 198.18.1.2:53 -s sh -p 300 -M 255.255.255.0\n\
             -a -u 198.18.1.2:53 -r 198.18.0.21:53 -g -w 1\n"
        );
    }

    /// `-Lnc` keeps ipvsadm's header words and order, with DPVS's additions (the
    /// worker as `[w]` before the protocol, the FullNAT local address before the
    /// destination) and 21-character address columns, wide enough for any
    /// `a.b.c.d:port` so the columns never run together (ipvsadm's 18 do).
    #[test]
    fn connections() {
        let conn = |worker, state: &str, client: &str, local: Option<&str>| ConnectionStatus {
            worker,
            proto: "tcp".into(),
            expires_s: 65,
            state: state.into(),
            client: client.into(),
            virtual_service: "198.18.1.1:80".into(),
            local: local.map(str::to_string),
            destination: "198.18.0.11:8080".into(),
        };
        let report = ConnectionsReport {
            connections: vec![
                conn(Some(0), "ESTABLISHED", "198.18.100.200:40000", None),
                conn(
                    Some(1),
                    "TIME_WAIT",
                    "198.18.0.9:1025",
                    Some("198.18.0.50:1031"),
                ),
                conn(None, "NONE", "198.18.0.0:0", None),
            ],
            truncated: true,
        };
        assert_eq!(
            render_connections(&report),
            "IPVS connection entries\n\
             pro expire state       source                virtual               local                 destination\n\
             [0]TCP 01:05  ESTABLISHED 198.18.100.200:40000  198.18.1.1:80         -                     198.18.0.11:8080\n\
             [1]TCP 01:05  TIME_WAIT   198.18.0.9:1025       198.18.1.1:80         198.18.0.50:1031      198.18.0.11:8080\n\
             [-]TCP 01:05  NONE        198.18.0.0:0          198.18.1.1:80         -                     198.18.0.11:8080\n\
             (more sessions exist than this listing holds)\n"
        );
    }
}

#[cfg(test)]
mod sync_text {
    use super::render_sync;
    use crate::ha::sync::peers::ResyncState;
    use crate::ha::sync::report::{PeerReport, ResyncReport, SyncReport, SyncStats};

    pub(super) fn report() -> SyncReport {
        SyncReport {
            listen: "198.19.0.2:8848".into(),
            transport: "kernel socket".into(),
            multicast: None,
            peers: vec!["198.19.0.1:8848".into()],
            authenticated: true,
            epoch: 1,
            stats: SyncStats {
                messages_sent: 3,
                bytes_sent: 300,
                events_sent: 9,
                datagrams_received: 52,
                resync_requests_sent: 1,
                dump_chunks_received: 7,
                ..SyncStats::default()
            },
            events_pushed: 9,
            events_dropped: 0,
            accepted_messages: 50,
            accepted_records: 1200,
            rejected: [("bad_hmac".to_string(), 2), ("unknown_peer".to_string(), 0)].into(),
            peer_status: vec![PeerReport {
                addr: "198.19.0.1".parse().unwrap(),
                messages: 50,
                records: 1200,
                lost: 2,
                out_of_window: 0,
                reordered: 0,
                restarts: 0,
                replayed: 17,
                too_old: 0,
                old_epoch: 1,
                unconfirmed_epoch: 0,
                resync_rate_limited: 19,
                epoch: Some(1_700_000_000_000_001),
                resync: ResyncReport {
                    state: ResyncState::Complete,
                    dump_id: 4,
                    attempts: 1,
                    chunks: 7,
                    records: 273,
                    took_ms: Some(12),
                },
                last_heard_ms_ago: Some(4),
            }],
        }
    }

    #[test]
    fn the_sync_summary_names_rejections_and_each_peers_lag_and_resync() {
        let report = report();
        let text = render_sync(&report);
        assert!(text.starts_with("sync on 198.19.0.2:8848, peers 198.19.0.1:8848, HMAC on\n"));
        assert!(text.contains("\nrejected: bad_hmac 2\n"), "{text}");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[lines.len() - 2],
            "198.19.0.1       0.004s ago        50      2         0        0  \
             complete: 7 chunk(s), 273 records in 12 ms (attempt 1)"
        );
        assert_eq!(
            lines[lines.len() - 1],
            "198.19.0.1       epoch 1700000000000001; refused: replayed 17, too old 0, old epoch 1, \
             unconfirmed epoch 0; out of window 0; resync requests rate-limited 19"
        );
        let open = render_sync(&SyncReport {
            authenticated: false,
            ..report
        });
        assert!(open.lines().next().unwrap().ends_with(", UNAUTHENTICATED (unauthenticated = true: no key; forged messages from a peer's address are believed)"), "{open}");
    }

    #[test]
    fn a_sync_report_reads_back_from_its_json() {
        let json = serde_json::to_value(report()).unwrap();
        assert_eq!(json["peer_status"][0]["resync"]["state"], "complete");
        assert_eq!(json["peer_status"][0]["addr"], "198.19.0.1");
        assert!(json.get("multicast").is_none(), "{json}");
        assert_eq!(
            serde_json::from_value::<SyncReport>(json).unwrap(),
            report()
        );
    }
}

#[cfg(test)]
mod ha_text {
    use super::{render_health, render_vrrp};
    use crate::ha::vrrp::node::{VrrpReport, VrrpStats};
    use crate::health::spec::CheckKind;
    use crate::health::{HealthReport, MonitorStats, TargetReport};

    pub(super) fn vrrp() -> VrrpReport {
        VrrpReport {
            vrid: 51,
            state: "BACKUP".into(),
            priority: 100,
            advert_interval_ms: 1000,
            preempt: true,
            primary: "198.18.0.2".into(),
            master: Some("198.18.0.1".into()),
            master_priority: Some(200),
            since_change_ms: 12_345,
            stats: VrrpStats {
                adverts_sent: 1,
                adverts_received: 40,
                adverts_rejected: 2,
                gratuitous_arps_sent: 3,
                transitions: 4,
            },
        }
    }

    #[test]
    fn vrrp_shows_state_master_heard_and_counters() {
        let mut r = vrrp();
        assert_eq!(
            render_vrrp(&r),
            "VRRP vrid 51 BACKUP (priority 100, advert 1000 ms, preempt true) from 198.18.0.2 for 12.3s\n\
             master heard: 198.18.0.1 (priority 200)\n\
             adverts sent 1 received 40 rejected 2; gratuitous ARP 3; transitions 4\n"
        );
        r.master = None;
        r.master_priority = None;
        assert!(
            render_vrrp(&r).contains("\nmaster heard: - (priority null)\n"),
            "{}",
            render_vrrp(&r)
        );
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(serde_json::from_value::<VrrpReport>(json).unwrap(), r);
    }

    pub(super) fn health() -> HealthReport {
        HealthReport {
            source: "198.18.0.254".into(),
            targets: vec![TargetReport {
                service: "tcp/198.18.0.10:80".into(),
                ip: "198.18.0.11".into(),
                port: 80,
                check: CheckKind::Http,
                probe_port: 80,
                interval_ms: 1000,
                timeout_ms: 500,
                fall: 2,
                rise: 3,
                retry_ms: 0,
                passive: true,
                evicted: true,
                evictions: 1,
                restores: 0,
                last_reason: "2fail".into(),
                last_outcome: Some("timeout".into()),
                since_change_ms: 1500,
            }],
            stats: MonitorStats {
                probes_sent: 10,
                probes_ok: 7,
                probes_failed: 3,
                probes_timed_out: 2,
                probes_skipped: 1,
                replies: 8,
                stray_replies: 1,
            },
        }
    }

    #[test]
    fn health_shows_one_line_per_real_server_then_the_probe_counters() {
        let report = health();
        let text = render_health(&report);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>(),
            [
                "tcp/198.18.0.10:80",
                "198.18.0.11:80",
                "http+p",
                "EVICTED",
                "1",
                "2/3",
                "timeout",
                "1.5s"
            ]
        );
        assert_eq!(
            lines[2],
            "probes from 198.18.0.254: sent 10 ok 7 failed 3 (timed out 2) skipped 1; replies 8 stray 1"
        );
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(
            serde_json::from_value::<HealthReport>(json).unwrap(),
            report
        );
    }
}
