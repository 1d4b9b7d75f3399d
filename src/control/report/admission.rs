//! `--acl-list`: one service's access list with each rule's hits, what becomes of
//! sources no rule names, its per-source rate limit and its admission counts; and the
//! same without the hits for every service, in the services listing
//! ([`ServiceAdmission`]).
use crate::model::ServiceKey;
use crate::service::{AclAction, AdmissionTotals, Prefix, RateLimit};
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AdmissionReport {
    pub service: ServiceKey,
    /// Rules in the list (the listing may show fewer).
    pub rules_total: usize,
    /// What the list does with a source no rule contains: deny when it has an allow
    /// rule, allow otherwise.
    pub unmatched: AclAction,
    /// The rules, by (network, length), with the new connections each decided.
    pub rules: Vec<AclRuleStatus>,
    pub rate_limit: Option<RateLimit>,
    /// Workers the rate is divided among (each enforces rate / workers).
    pub workers: usize,
    pub totals: AdmissionTotals,
}

impl AdmissionReport {
    /// A service with no list and no limit.
    pub fn empty(service: ServiceKey) -> Self {
        AdmissionReport {
            service,
            rules_total: 0,
            unmatched: AclAction::Allow,
            rules: Vec::new(),
            rate_limit: None,
            workers: 1,
            totals: AdmissionTotals::default(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AclRuleStatus {
    pub prefix: Prefix,
    pub action: AclAction,
    pub hits: u64,
}

/// A service's admission rules in the services listing (`list_services`, read by
/// `-L --json` and `--acl-list` without a service): how many rules, what becomes of
/// unmatched sources, the rate limit and the counts. The rules themselves are only in
/// `save_services`'s reply (what `-S` prints).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServiceAdmission {
    pub allow_rules: usize,
    pub deny_rules: usize,
    /// Deny when the list has an allow rule, allow otherwise.
    pub unmatched: AclAction,
    pub rate_limit: Option<RateLimit>,
    /// Workers the rate is divided among.
    pub workers: usize,
    /// New connections refused since the last `-Z`, summed over workers.
    pub totals: AdmissionTotals,
    /// The allow rules, by (network, length); only in `save_services`'s reply.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<Prefix>,
    /// The deny rules, likewise.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deny: Vec<Prefix>,
}
