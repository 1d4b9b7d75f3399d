//! Admission of new connections per service: the access list ([`Acl`]) and the
//! per-source new-connection rate limit ([`RateLimit`]), as the management core keeps
//! them ([`AdmissionRules`], in the service table) and as the workers read them
//! ([`Admission`], one `Arc` per service in the snapshot).
//!
//! Only new connections are checked (a packet that found no session and may open
//! one, before placement): an established session keeps flowing whatever the rules
//! become. The compiled [`Admission`] is built once per change of that service's
//! rules, when the next snapshot is published; a snapshot published for another
//! reason reuses the same `Arc`, so a 100k-prefix list is not rebuilt for a weight
//! change elsewhere.
use super::acl::{Acl, AclAction, Prefix};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};

/// The most new connections per second per source a limit may name.
pub const MAX_RATE: u32 = 10_000_000;

/// How many ICMP errors (Packet Too Big, frag-needed) Sluice writes itself, by
/// default (`[sessions] icmp_error_rate` and `icmp_error_burst`): Linux's
/// appliance-wide defaults (`net.ipv4.icmp_msgs_per_sec` 1000,
/// `icmp_msgs_burst` 50), shared among the workers as a per-source limit is.
pub const DEFAULT_ICMP_ERROR_LIMIT: RateLimit = RateLimit {
    rate: 1000,
    burst: 50,
    prefix_len: 32,
};

/// A per-source new-connection rate limit: `rate` per second with bursts of up to
/// `burst`, per source address, or per network of `prefix_len` bits (24: every
/// source of a /24 shares one bucket).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RateLimit {
    pub rate: u32,
    pub burst: u32,
    #[serde(default = "full_prefix")]
    pub prefix_len: u8,
}

fn full_prefix() -> u8 {
    32
}

impl RateLimit {
    /// A limit, checked: rate 1 to [`MAX_RATE`], burst 1 to 10x the rate (at least
    /// 1), prefix length 8 to 32.
    pub fn new(rate: u32, burst: u32, prefix_len: u8) -> Result<RateLimit, String> {
        if rate == 0 || rate > MAX_RATE {
            return Err(format!("rate {rate}: 1 to {MAX_RATE} per second"));
        }
        let max_burst = rate.saturating_mul(10).max(1);
        if burst == 0 || burst > max_burst {
            return Err(format!(
                "burst {burst}: 1 to {max_burst} (10 times the rate)"
            ));
        }
        if !(8..=32).contains(&prefix_len) {
            return Err(format!("prefix length {prefix_len}: 8 to 32"));
        }
        Ok(RateLimit {
            rate,
            burst,
            prefix_len,
        })
    }

    pub fn check(&self) -> Result<(), String> {
        RateLimit::new(self.rate, self.burst, self.prefix_len).map(drop)
    }

    /// What one of `workers` workers enforces, in TSC ticks at `tsc_hz`: the interval
    /// between two connections (rate / workers per second) and the tolerance (the
    /// burst divided among the workers, rounded up, at least 1, less the one
    /// connection the interval itself pays for).
    pub fn per_worker(&self, workers: usize, tsc_hz: u64) -> WorkerLimit {
        let workers = workers.max(1) as u64;
        let interval = (u128::from(tsc_hz) * u128::from(workers) / u128::from(self.rate))
            .clamp(1, u128::from(u64::MAX / 4)) as u64;
        let burst = u64::from(self.burst).div_ceil(workers).max(1);
        WorkerLimit {
            interval,
            tolerance: interval.saturating_mul(burst - 1),
            mask: super::acl::mask(self.prefix_len),
        }
    }
}

/// A rate limit as one worker's table applies it (GCRA: the bucket of a source is
/// the time its next connection is due, see `dataplane::forwarder::admission`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkerLimit {
    /// TSC ticks a connection costs.
    pub interval: u64,
    /// How far ahead of now a source's due time may run: burst - 1 intervals.
    pub tolerance: u64,
    /// Applied to the source address: sources sharing the network share a bucket.
    pub mask: u32,
}

/// One service's admission counts, one row per worker (each written only by its
/// worker), kept for the service's life across rule changes. Zeroing (`-Z`) records
/// the sums at that moment, which later totals subtract, so the rows keep their one
/// writer.
#[derive(Debug)]
pub struct AdmissionCounters {
    rows: Box<[CounterRow]>,
    /// The row sums at the last zeroing (management core only).
    zeroed_at: [AtomicU64; 3],
}

/// A worker's counts for one service, on its own cache line.
#[derive(Debug, Default)]
#[repr(align(64))]
struct CounterRow {
    acl_denied: AtomicU64,
    rate_limited: AtomicU64,
    /// A source's bucket was taken over by another source while it still held
    /// state (was not full): see the rate table's eviction.
    rate_evicted_live: AtomicU64,
}

/// Summed [`AdmissionCounters`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AdmissionTotals {
    pub acl_denied: u64,
    pub rate_limited: u64,
    pub rate_evicted_live: u64,
}

/// What a worker counts for a service.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdmissionEvent {
    AclDenied,
    RateLimited,
    RateEvictedLive,
}

impl AdmissionCounters {
    pub fn new(workers: usize) -> Self {
        AdmissionCounters {
            rows: (0..workers.max(1)).map(|_| CounterRow::default()).collect(),
            zeroed_at: Default::default(),
        }
    }

    #[inline]
    pub fn count(&self, worker: usize, event: AdmissionEvent) {
        if let Some(row) = self.rows.get(worker) {
            let cell = match event {
                AdmissionEvent::AclDenied => &row.acl_denied,
                AdmissionEvent::RateLimited => &row.rate_limited,
                AdmissionEvent::RateEvictedLive => &row.rate_evicted_live,
            };
            cell.store(cell.load(Relaxed) + 1, Relaxed);
        }
    }

    /// The counts since the last [`AdmissionCounters::zero`], summed over workers.
    pub fn totals(&self) -> AdmissionTotals {
        let [acl_denied, rate_limited, rate_evicted_live] = self.row_sums();
        let [z_denied, z_limited, z_evicted] = self.zeroed_at.each_ref().map(|z| z.load(Relaxed));
        AdmissionTotals {
            acl_denied: acl_denied.wrapping_sub(z_denied),
            rate_limited: rate_limited.wrapping_sub(z_limited),
            rate_evicted_live: rate_evicted_live.wrapping_sub(z_evicted),
        }
    }

    /// The workers' rows summed, in [`AdmissionTotals`] field order.
    fn row_sums(&self) -> [u64; 3] {
        let mut sums = [0u64; 3];
        for row in self.rows.iter() {
            let cells = [&row.acl_denied, &row.rate_limited, &row.rate_evicted_live];
            for (sum, cell) in sums.iter_mut().zip(cells) {
                *sum = sum.wrapping_add(cell.load(Relaxed));
            }
        }
        sums
    }

    /// Zeroes the totals (`-Z`).
    pub fn zero(&self) {
        for (at, sum) in self.zeroed_at.iter().zip(self.row_sums()) {
            at.store(sum, Relaxed);
        }
    }
}

/// A service's admission rules as the workers read them: immutable, shared.
#[derive(Debug)]
pub struct Admission {
    /// `None` when the service has no rule.
    pub acl: Option<Acl>,
    pub rate_limit: Option<RateLimit>,
    /// Workers the rate is divided among.
    pub workers: usize,
    /// The service's id: rate-limit buckets of different services never mix.
    pub service_id: u32,
    pub counters: Arc<AdmissionCounters>,
}

/// A service's admission rules as the management core edits them.
#[derive(Clone, Debug)]
pub struct AdmissionRules {
    acl: BTreeMap<Prefix, AclAction>,
    rate_limit: Option<RateLimit>,
    workers: usize,
    counters: Arc<AdmissionCounters>,
    /// Built on first use after a change (publish, listing), then shared.
    compiled: OnceLock<Arc<Admission>>,
    /// The last compiled form before the change, whose rule counts the next one
    /// carries over.
    previous: Option<Arc<Admission>>,
}

impl AdmissionRules {
    pub fn new(workers: usize) -> Self {
        AdmissionRules {
            acl: BTreeMap::new(),
            rate_limit: None,
            workers: workers.max(1),
            counters: Arc::new(AdmissionCounters::new(workers)),
            compiled: OnceLock::new(),
            previous: None,
        }
    }

    /// Whether there is nothing to check (no rule, no limit).
    pub fn is_empty(&self) -> bool {
        self.acl.is_empty() && self.rate_limit.is_none()
    }

    pub fn acl(&self) -> &BTreeMap<Prefix, AclAction> {
        &self.acl
    }

    pub fn rate_limit(&self) -> Option<RateLimit> {
        self.rate_limit
    }

    /// Workers the counts are kept for and the rate is divided among.
    pub fn workers(&self) -> usize {
        self.workers
    }

    fn changed(&mut self) {
        if let Some(old) = self.compiled.take() {
            if self.previous.is_none() {
                self.previous = Some(old);
            }
        }
    }

    /// Adds rules (a prefix already listed takes the new action). Nothing changes
    /// when the list would grow past [`super::acl::MAX_ACL_RULES`].
    pub fn add(&mut self, action: AclAction, prefixes: &[Prefix]) -> Result<(), String> {
        let new = prefixes
            .iter()
            .filter(|p| !self.acl.contains_key(p))
            .count();
        if self.acl.len() + new > super::acl::MAX_ACL_RULES {
            return Err(format!(
                "the list would hold {} rules; at most {}",
                self.acl.len() + new,
                super::acl::MAX_ACL_RULES
            ));
        }
        for p in prefixes {
            self.acl.insert(*p, action);
        }
        self.changed();
        Ok(())
    }

    /// Removes rules; every prefix must be listed (nothing changes otherwise).
    pub fn remove(&mut self, prefixes: &[Prefix]) -> Result<(), String> {
        if let Some(missing) = prefixes.iter().find(|p| !self.acl.contains_key(p)) {
            return Err(format!("{missing} is not in the list"));
        }
        for p in prefixes {
            self.acl.remove(p);
        }
        self.changed();
        Ok(())
    }

    pub fn clear_acl(&mut self) {
        self.acl.clear();
        self.changed();
    }

    pub fn set_rate_limit(&mut self, limit: Option<RateLimit>) -> Result<(), String> {
        if let Some(l) = &limit {
            l.check()?;
        }
        self.rate_limit = limit;
        self.changed();
        Ok(())
    }

    /// The compiled form, built now if the rules changed since the last call.
    pub fn compiled(&self, service_id: u32) -> Arc<Admission> {
        Arc::clone(self.compiled.get_or_init(|| {
            let acl = (!self.acl.is_empty()).then(|| {
                let mut acl = Acl::build(self.acl.iter().map(|(p, a)| (*p, *a)), self.workers)
                    .expect("rules are unique and bounded when added");
                if let Some(old) = self.previous.as_ref().and_then(|p| p.acl.as_ref()) {
                    acl.carry_counts_from(old);
                }
                acl
            });
            Arc::new(Admission {
                acl,
                rate_limit: self.rate_limit,
                workers: self.workers,
                service_id,
                counters: Arc::clone(&self.counters),
            })
        }))
    }

    /// After publishing: the form the last compile replaced, for the caller to keep
    /// until no worker's snapshot holds it.
    pub fn take_replaced(&mut self) -> Option<Arc<Admission>> {
        if self.compiled.get().is_some() {
            self.previous.take()
        } else {
            None
        }
    }

    /// The compiled forms this service's rules still hold (when the service goes).
    pub fn into_compiled(mut self) -> impl Iterator<Item = Arc<Admission>> {
        self.compiled.take().into_iter().chain(self.previous)
    }

    pub fn totals(&self) -> AdmissionTotals {
        self.counters.totals()
    }

    /// `-Z`: zeroes the service's admission counts and its rules' hits (in the
    /// compiled lists the workers count in, and the one the next list carries
    /// counts from).
    pub fn zero_counts(&self) {
        self.counters.zero();
        let lists = self.compiled.get().into_iter().chain(&self.previous);
        for acl in lists.filter_map(|a| a.acl.as_ref()) {
            acl.zero_hits();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_out_of_range_are_refused() {
        assert!(RateLimit::new(0, 1, 32).is_err());
        assert!(RateLimit::new(10, 0, 32).is_err());
        assert!(RateLimit::new(10, 101, 32).is_err());
        assert!(RateLimit::new(10, 20, 7).is_err());
        assert!(RateLimit::new(10, 20, 33).is_err());
        assert!(RateLimit::new(10, 20, 24).is_ok());
    }

    #[test]
    fn the_rate_and_burst_are_divided_among_workers() {
        let l = RateLimit::new(100, 20, 32).unwrap();
        let one = l.per_worker(1, 1_000_000_000);
        assert_eq!(one.interval, 10_000_000);
        assert_eq!(one.tolerance, 19 * 10_000_000);
        let four = l.per_worker(4, 1_000_000_000);
        assert_eq!(four.interval, 40_000_000);
        assert_eq!(four.tolerance, 4 * 40_000_000);
        assert_eq!(
            RateLimit::new(100, 20, 24).unwrap().per_worker(1, 1).mask,
            0xffff_ff00
        );
    }

    #[test]
    fn an_unchanged_service_keeps_its_compiled_rules_and_a_change_rebuilds_them() {
        let mut rules = AdmissionRules::new(2);
        let p: Prefix = "198.18.5.0/24".parse().unwrap();
        rules.add(AclAction::Deny, &[p]).unwrap();
        let first = rules.compiled(1);
        assert!(Arc::ptr_eq(&first, &rules.compiled(1)));
        first.acl.as_ref().unwrap().count(1, 0);
        rules
            .set_rate_limit(Some(RateLimit::new(5, 5, 32).unwrap()))
            .unwrap();
        let second = rules.compiled(1);
        assert!(!Arc::ptr_eq(&first, &second));
        assert_eq!(second.acl.as_ref().unwrap().hits(0), 1);
        assert!(rules.remove(&["10.0.0.0/8".parse().unwrap()]).is_err());
        rules.remove(&[p]).unwrap();
        assert!(rules.compiled(1).acl.is_none());
    }

    #[test]
    fn zeroing_clears_the_service_counts_and_the_rule_hits_and_counting_goes_on() {
        let mut rules = AdmissionRules::new(2);
        let p: Prefix = "198.18.5.0/24".parse().unwrap();
        rules.add(AclAction::Deny, &[p]).unwrap();
        let compiled = rules.compiled(1);
        let counters = &compiled.counters;
        counters.count(0, AdmissionEvent::AclDenied);
        counters.count(1, AdmissionEvent::AclDenied);
        counters.count(1, AdmissionEvent::RateLimited);
        counters.count(0, AdmissionEvent::RateEvictedLive);
        compiled.acl.as_ref().unwrap().count(0, 0);
        assert_eq!(
            rules.totals(),
            AdmissionTotals {
                acl_denied: 2,
                rate_limited: 1,
                rate_evicted_live: 1
            }
        );
        rules.zero_counts();
        assert_eq!(rules.totals(), AdmissionTotals::default());
        assert_eq!(compiled.acl.as_ref().unwrap().hits(0), 0);
        counters.count(1, AdmissionEvent::RateLimited);
        assert_eq!(
            rules.totals(),
            AdmissionTotals {
                acl_denied: 0,
                rate_limited: 1,
                rate_evicted_live: 0
            }
        );
    }
}
