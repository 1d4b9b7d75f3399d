//! `sluicectl health` as text.
use crate::control::report::HealthReport;
use std::fmt::Write as _;

/// `sluicectl health`: one line per watched real server, then the probe counters.
pub fn render_health(report: &HealthReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<24} {:<21} {:<5} {:<8} {:>9} {:>9} {:<22} {:>10}",
        "Service",
        "RealServer",
        "Check",
        "State",
        "Evictions",
        "Fall/Rise",
        "LastProbe",
        "SinceChange"
    );
    for t in &report.targets {
        let rs = crate::control::render::endpoint(&t.ip, t.port);
        let state = if t.evicted { "EVICTED" } else { "up" };
        let check = t.check.name();
        let check = if t.passive {
            format!("{check}+p")
        } else {
            check.to_string()
        };
        let _ = writeln!(
            out,
            "{:<24} {:<21} {:<5} {:<8} {:>9} {:>9} {:<22} {:>9.1}s",
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
        "probes from {}{}: sent {} ok {} failed {} (timed out {}) skipped {}; replies {} stray {}",
        report.source,
        report
            .sources6
            .iter()
            .map(|a| format!(", {a}"))
            .collect::<String>(),
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

#[cfg(test)]
mod tests {
    use super::render_health;
    use crate::control::report::{HealthReport, MonitorStats, TargetReport};
    use crate::health::spec::CheckKind;

    fn health() -> HealthReport {
        HealthReport {
            source: "198.18.0.254".into(),
            sources6: vec!["2001:db8:1a::1".into()],
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
            lines[0].split_whitespace().collect::<Vec<_>>(),
            [
                "Service",
                "RealServer",
                "Check",
                "State",
                "Evictions",
                "Fall/Rise",
                "LastProbe",
                "SinceChange"
            ]
        );
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
            "probes from 198.18.0.254, 2001:db8:1a::1: sent 10 ok 7 failed 3 (timed out 2) skipped 1; replies 8 stray 1"
        );
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(
            serde_json::from_value::<HealthReport>(json).unwrap(),
            report
        );
    }
}
