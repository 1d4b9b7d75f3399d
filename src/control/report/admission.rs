//! `--acl-list`: one service's access list with each rule's hits, what becomes of
//! sources no rule names, its per-source rate limit and its admission counts.
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
