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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::report::AclRuleStatus;
    use crate::model::{Protocol, ServiceKey};
    use crate::service::{AclAction, AdmissionTotals, RateLimit};

    #[test]
    fn the_listing_shows_the_default_the_limit_the_counts_and_each_rules_hits() {
        let mut report = AdmissionReport::empty(ServiceKey::new(
            Protocol::Tcp,
            "198.18.1.1".parse().unwrap(),
            80,
        ));
        report.rules_total = 3;
        report.unmatched = AclAction::Deny;
        report.rules = vec![
            AclRuleStatus {
                prefix: "10.0.0.0/8".parse().unwrap(),
                action: AclAction::Allow,
                hits: 1200,
            },
            AclRuleStatus {
                prefix: "10.1.0.0/16".parse().unwrap(),
                action: AclAction::Deny,
                hits: 20,
            },
        ];
        report.rate_limit = Some(RateLimit::new(20, 40, 32).unwrap());
        report.workers = 2;
        report.totals = AdmissionTotals {
            acl_denied: 31,
            rate_limited: 160,
            rate_evicted_live: 0,
        };
        assert_eq!(
            render_admission(&report),
            "TCP 198.18.1.1:80  rules 3  unmatched sources: deny\n\
             rate limit: 20/s burst 40 per /32 source (2 workers, each 10.0/s)\n\
             denied by the list 31  over the rate 160  buckets taken over 0\n\
             ACTION PREFIX                       HITS\n\
             allow  10.0.0.0/8                   1200\n\
             deny   10.1.0.0/16                    20\n\
             ... 1 more rules\n"
        );
    }
}
