//! `sluicectl --acl-list`: a service's access list as a table, one rule a line; without
//! a service, every service's list and limit in three lines, without the rules.
use crate::control::report::{AdmissionReport, ServicesReport};
use crate::service::{AclAction, AdmissionTotals, RateLimit};
use std::fmt::Write;

pub fn render_admission(report: &AdmissionReport) -> String {
    let mut out = String::new();
    let s = &report.service;
    write_summary(
        &mut out,
        &format!(
            "{} {}",
            s.proto.name(),
            crate::control::render::endpoint(s.vip, s.port)
        ),
        report.rules_total,
        report.unmatched,
        report.rate_limit.as_ref(),
        report.workers,
        &report.totals,
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

/// `--acl-list` without a service: for every service that has (or had) an access list
/// or a rate limit, its summary as `--acl-list -t` starts (rules, unmatched sources,
/// rate limit, counts since the last `-Z`), a blank line between services.
pub fn render_admission_all(report: &ServicesReport) -> String {
    let mut out = String::new();
    for s in &report.services {
        let Some(a) = &s.admission else { continue };
        if !out.is_empty() {
            out.push('\n');
        }
        write_summary(
            &mut out,
            &format!(
                "{} {}",
                s.proto.to_uppercase(),
                crate::control::render::endpoint(&s.vip, s.port)
            ),
            a.allow_rules + a.deny_rules,
            a.unmatched,
            a.rate_limit.as_ref(),
            a.workers,
            &a.totals,
        );
    }
    out
}

/// The three lines that sum a service's admission up.
fn write_summary(
    out: &mut String,
    service: &str,
    rules: usize,
    unmatched: AclAction,
    rate_limit: Option<&RateLimit>,
    workers: usize,
    totals: &AdmissionTotals,
) {
    let _ = writeln!(
        out,
        "{service}  rules {rules}  unmatched sources: {}",
        unmatched.name()
    );
    match rate_limit {
        Some(l) => {
            let _ = writeln!(
                out,
                "rate limit: {}/s burst {} per /{} source ({} workers, each {:.1}/s)",
                l.rate,
                l.burst,
                l.prefix_len,
                workers,
                f64::from(l.rate) / workers.max(1) as f64
            );
        }
        None => out.push_str("rate limit: none\n"),
    }
    let _ = writeln!(
        out,
        "denied by the list {}  over the rate {}  buckets taken over {}",
        totals.acl_denied, totals.rate_limited, totals.rate_evicted_live
    );
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
            "198.18.1.1".parse::<std::net::Ipv4Addr>().unwrap(),
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

    #[test]
    fn every_service_in_brief_skips_services_without_rules_or_limits() {
        use crate::control::report::{ServiceAdmission, ServiceStatus, ServicesReport};
        let service = |vip: &str, admission| ServiceStatus {
            proto: "tcp".into(),
            vip: vip.into(),
            port: 80,
            admission,
            ..Default::default()
        };
        let report = ServicesReport {
            services: vec![
                service(
                    "198.18.1.1",
                    Some(ServiceAdmission {
                        allow_rules: 2,
                        deny_rules: 1,
                        unmatched: AclAction::Deny,
                        rate_limit: None,
                        workers: 2,
                        totals: AdmissionTotals {
                            acl_denied: 7,
                            rate_limited: 0,
                            rate_evicted_live: 0,
                        },
                        allow: Vec::new(),
                        deny: Vec::new(),
                    }),
                ),
                service("198.18.1.2", None),
                service(
                    "198.18.1.3",
                    Some(ServiceAdmission {
                        allow_rules: 0,
                        deny_rules: 0,
                        unmatched: AclAction::Allow,
                        rate_limit: Some(RateLimit::new(10, 10, 24).unwrap()),
                        workers: 2,
                        totals: AdmissionTotals {
                            acl_denied: 0,
                            rate_limited: 12,
                            rate_evicted_live: 1,
                        },
                        allow: Vec::new(),
                        deny: Vec::new(),
                    }),
                ),
            ],
        };
        assert_eq!(
            render_admission_all(&report),
            "TCP 198.18.1.1:80  rules 3  unmatched sources: deny\n\
             rate limit: none\n\
             denied by the list 7  over the rate 0  buckets taken over 0\n\
             \n\
             TCP 198.18.1.3:80  rules 0  unmatched sources: allow\n\
             rate limit: 10/s burst 10 per /24 source (2 workers, each 5.0/s)\n\
             denied by the list 0  over the rate 12  buckets taken over 1\n"
        );
        assert_eq!(render_admission_all(&ServicesReport::default()), "");
    }
}
