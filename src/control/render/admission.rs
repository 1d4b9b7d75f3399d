//! `sluicectl --acl-list`: a service's access list as a table, one rule a line.
use crate::control::report::AdmissionReport;
use std::fmt::Write;

pub fn render_admission(report: &AdmissionReport) -> String {
    let mut out = String::new();
    let s = &report.service;
    let _ = writeln!(
        out,
        "{} {}:{}  rules {}  unmatched sources: {}",
        s.proto.name(),
        s.vip,
        s.port,
        report.rules_total,
        report.unmatched.name()
    );
    match &report.rate_limit {
        Some(l) => {
            let _ = writeln!(
                out,
                "rate limit: {}/s burst {} per /{} source ({} workers, each {:.1}/s)",
                l.rate,
                l.burst,
                l.prefix_len,
                report.workers,
                f64::from(l.rate) / report.workers.max(1) as f64
            );
        }
        None => out.push_str("rate limit: none\n"),
    }
    let t = &report.totals;
    let _ = writeln!(
        out,
        "denied by the list {}  over the rate {}  buckets taken over {}",
        t.acl_denied, t.rate_limited, t.rate_evicted_live
    );
    if !report.rules.is_empty() {
        let _ = writeln!(out, "{:<6} {:<20} {:>12}", "ACTION", "PREFIX", "HITS");
        for r in &report.rules {
            let _ = writeln!(
                out,
                "{:<6} {:<20} {:>12}",
                r.action.name(),
                r.prefix.to_string(),
                r.hits
            );
        }
        if report.rules.len() < report.rules_total {
            let _ = writeln!(
                out,
                "... {} more rules",
                report.rules_total - report.rules.len()
            );
        }
    }
    out
}
