//! `sluicectl status` and `xstats` as text.
use crate::control::report::{
    AdoptionReport, ManagementReport, StatusReport, TemplateTableReport, TemplatesReport,
    XstatsReport,
};
use std::collections::BTreeMap;
use std::fmt::Write as _;

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
    let ids = &report.real_server_ids;
    if ids.limit > 0 {
        let _ = writeln!(
            out,
            "real-server ids {} in use, {} waiting for their sessions to end, {} at most",
            ids.in_use, ids.waiting, ids.limit
        );
    }
    if let Some(t) = &report.persistence_templates {
        out.push_str(&render_templates(t));
    }
    if let Some(m) = &report.management {
        out.push_str(&render_management(m));
    }

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
        // The workers count exception frames for the appliance, not per port: on one
        // port's line only when that port is the only one with an exception path.
        let exception_ports: Vec<_> = (report.ports.iter())
            .filter_map(|p| p.exception.as_ref().map(|e| (p, e)))
            .collect();
        let event = |name: &str| report.events.get(name).copied().unwrap_or(0);
        let drop = |name: &str| report.drops.get(name).copied().unwrap_or(0);
        let punted = format!(
            "punted {} (control {})",
            event("exception_punted"),
            event("exception_punted_control")
        );
        let injected = format!("injected {}", event("exception_injected"));
        let dropped = format!(
            "dropped: rate limit {}, ring full {}, control ring full {}, foreign source {}",
            drop("exception_rate_limited"),
            drop("exception_ring_full"),
            drop("exception_control_ring_full"),
            drop("exception_foreign_source"),
        );
        for (port, e) in &exception_ports {
            let kernel_side = format!(
                "to kernel {} (lost {}), from kernel {} (lost {})",
                e.counts.to_kernel,
                e.counts.to_kernel_lost,
                e.counts.from_kernel,
                e.counts.from_kernel_lost,
            );
            let head = format!(
                "  port {} exception: {} interface {}, {} frames/s at most;",
                port.name, e.kind, e.interface, e.rate
            );
            let _ = match exception_ports.len() {
                1 => writeln!(out, "{head} {punted}, {kernel_side}, {injected}; {dropped}"),
                _ => writeln!(out, "{head} {kernel_side}"),
            };
        }
        if exception_ports.len() > 1 {
            let _ = writeln!(
                out,
                "  exception, all ports: {punted}, {injected}; {dropped}"
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

/// The persistence templates' line: live ones per table by standing, and when they
/// were counted.
fn render_templates(t: &TemplatesReport) -> String {
    let table = |name: &str, r: &TemplateTableReport| {
        format!(
            "{name} {} of {} slots (confirmed {}, unverified {}, unconfirmed {})",
            r.live(),
            r.slots,
            r.confirmed,
            r.unverified,
            r.unconfirmed
        )
    };
    format!(
        "persistence templates {}; {} (counted {:.1} s ago, every {:.1} s)\n",
        table("IPv4", &t.ipv4),
        table("IPv6", &t.ipv6),
        t.counted_ms_ago as f64 / 1000.0,
        t.pass_ms as f64 / 1000.0,
    )
}

/// The management loop's line: its turns, the longest lately, and the control
/// requests (with the turns that left some for the next, their budget spent).
fn render_management(m: &ManagementReport) -> String {
    format!(
        "management {} turns, longest {:.1} ms in the last minute; control requests {} \
         ({} turns left some for the next)\n",
        m.turns,
        m.longest_turn_us as f64 / 1000.0,
        m.control_requests,
        m.control_turns_cut
    )
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
    use crate::control::report::{LcoreStatus, PortStatus, RealServerIdsReport};

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
                exception: None,
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
                    total_cycles: 0,
                    session_table_bytes: 0,
                    snapshot_generation: 7,
                    ..Default::default()
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
            real_server_ids: RealServerIdsReport {
                in_use: 12,
                waiting: 3,
                limit: 65535,
            },
            persistence_templates: Some(TemplatesReport {
                ipv4: TemplateTableReport {
                    slots: 262_144,
                    unconfirmed: 200,
                    unverified: 3,
                    confirmed: 41,
                },
                ipv6: TemplateTableReport {
                    slots: 32_768,
                    confirmed: 2,
                    ..Default::default()
                },
                counted_ms_ago: 2_100,
                pass_ms: 5_000,
            }),
            management: Some(ManagementReport {
                turns: 120_000,
                longest_turn_us: 17_300,
                control_requests: 42,
                control_turns_cut: 3,
            }),
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
    fn status_shows_the_management_loop_turns() {
        let text = render_status(&sample());
        assert_eq!(
            line_with(&text, "management 1"),
            "management 120000 turns, longest 17.3 ms in the last minute; control requests \
             42 (3 turns left some for the next)"
        );
        let mut outside = sample();
        outside.management = None;
        let text = render_status(&outside);
        assert!(
            !text.lines().any(|l| l.starts_with("management ")),
            "{text}"
        );
    }

    #[test]
    fn status_counts_the_persistence_templates_by_standing() {
        let text = render_status(&sample());
        assert_eq!(
            line_with(&text, "persistence templates"),
            "persistence templates IPv4 244 of 262144 slots (confirmed 41, unverified 3, \
             unconfirmed 200); IPv6 2 of 32768 slots (confirmed 2, unverified 0, unconfirmed 0) \
             (counted 2.1 s ago, every 5.0 s)"
        );
        let mut before_a_count = sample();
        before_a_count.persistence_templates = None;
        let text = render_status(&before_a_count);
        assert!(!text.contains("persistence templates"), "{text}");
    }

    #[test]
    fn status_says_how_many_real_server_ids_are_held() {
        let text = render_status(&sample());
        assert_eq!(
            line_with(&text, "real-server ids"),
            "real-server ids 12 in use, 3 waiting for their sessions to end, 65535 at most"
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
            words(line_with(&text, " management ")),
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

    /// The workers' exception counts are the appliance's: on the port's line when
    /// one port has an exception path, on a line of their own when several do.
    #[test]
    fn exception_counts_are_shown_per_port_only_where_they_are_one_ports() {
        use crate::control::report::status::{ExceptionCounts, ExceptionStatus};
        let with_exception = |name: &str, interface: &str, to_kernel: u64| {
            let mut port = sample().ports.remove(0);
            port.name = name.into();
            port.exception = Some(ExceptionStatus {
                port: name.into(),
                interface: interface.into(),
                kind: "tap".into(),
                rate: 200,
                ring_size: 256,
                counts: ExceptionCounts {
                    to_kernel,
                    ..Default::default()
                },
            });
            port
        };
        let mut report = sample();
        report.events.insert("exception_punted".into(), 9);
        report.events.insert("exception_punted_control".into(), 4);
        report.events.insert("exception_injected".into(), 11);
        for (reason, n) in [
            ("exception_rate_limited", 5),
            ("exception_ring_full", 3),
            ("exception_control_ring_full", 2),
            ("exception_foreign_source", 1),
        ] {
            report.drops.insert(reason.into(), n);
        }
        report.ports = vec![with_exception("lan0", "sx-lan0", 9)];
        let text = render_status(&report);
        assert_eq!(
            line_with(&text, "exception:"),
            "  port lan0 exception: tap interface sx-lan0, 200 frames/s at most; punted 9 \
             (control 4), to kernel 9 (lost 0), from kernel 0 (lost 0), injected 11; \
             dropped: rate limit 5, ring full 3, control ring full 2, foreign source 1"
        );
        report.ports.push(with_exception("lan1", "sx-lan1", 0));
        let text = render_status(&report);
        assert_eq!(
            line_with(&text, "port lan1 exception:"),
            "  port lan1 exception: tap interface sx-lan1, 200 frames/s at most; to kernel 0 \
             (lost 0), from kernel 0 (lost 0)"
        );
        assert!(!line_with(&text, "port lan0 exception:").contains("punted"));
        assert_eq!(
            line_with(&text, "exception, all ports:"),
            "  exception, all ports: punted 9 (control 4), injected 11; dropped: rate \
             limit 5, ring full 3, control ring full 2, foreign source 1"
        );
    }
}
