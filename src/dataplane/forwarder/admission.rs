//! Admission: whether a new connection to a service may open at all, before
//! placement spends a scheduler pick, a local port and a session on it. The
//! service's access list decides first (`service::acl`: longest prefix), then its
//! per-source rate limit (this worker's [`RateTable`]). Established sessions never
//! come here: they hit their session before the miss path.
//!
//! **Rate limits per worker.** Each worker keeps its own buckets; nothing is shared
//! between workers, and RSS on the 4-tuple spreads one source's connections over
//! all of them. So each worker enforces rate / workers per second with a burst of
//! burst / workers (rounded up, at least 1) per source: a source whose connections
//! spread evenly gets about the configured rate in all; one whose connections land
//! on fewer workers gets less (one worker: rate / workers).
//!
//! **The table.** GCRA (the virtual-scheduling form of a token bucket): a source's
//! state is one timestamp, when its next connection is due at the steady rate; a
//! connection is admitted while that time is at most `burst - 1` intervals ahead of
//! now, and moves it one interval on. Entries live in a fixed table of [`RATE_SETS`]
//! sets of [`RATE_WAYS`] 16-byte entries (one 64-byte line per set; 1 MiB per
//! worker), allocated when the worker starts: a check hashes (service id, source
//! network) with a per-worker random key to a set, compares four keys and updates
//! one entry. O(1), no allocation.
//!
//! **Collisions.** A source with no entry takes the entry of its set whose due time
//! is earliest: the fullest bucket. An entry due now or earlier is full, so taking
//! it loses nothing (a new source starts full). Only when all four entries of a set
//! are partly drained does a new source take live state: the least drained, which
//! then starts full again, granting that source at most its burst once more; these
//! takeovers are counted (`rate_evicted_live`). A greedy source is the most drained
//! in its set and is taken last, so evicting it takes four other drained sources in
//! the same set; the set of a source depends on a key drawn per worker at start, so
//! an attacker cannot aim at one without trying many sources.
use super::Forwarder;
use crate::flow::FlowKey4;
use crate::model::DropReason;
use crate::service::admission::WorkerLimit;
use crate::service::{AdmissionEvent, RateLimit};

/// Sets of the per-worker rate table (a power of two).
pub const RATE_SETS: usize = 16_384;
/// Entries per set: one cache line.
pub const RATE_WAYS: usize = 4;

/// One source's bucket: its key (service id << 32 | source network; 0: free) and
/// the TSC its next connection is due at.
#[derive(Clone, Copy, Debug, Default)]
struct RateEntry {
    key: u64,
    due: u64,
}

#[derive(Clone, Copy, Debug, Default)]
#[repr(align(64))]
struct RateSet([RateEntry; RATE_WAYS]);

/// What a check decided.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateVerdict {
    pub admitted: bool,
    /// The source took over an entry that still held another source's state.
    pub evicted_live: bool,
}

/// A worker's per-source rate-limit buckets (see the module doc).
pub struct RateTable {
    sets: Box<[RateSet]>,
    seed: u64,
    /// The last limit turned into this worker's share (a 128-bit division), with
    /// what it was computed from: consecutive new connections to one service reuse it.
    share: Option<(RateLimit, usize, WorkerLimit)>,
}

impl RateTable {
    /// The table of [`RATE_SETS`] sets, keyed by `seed` (draw it at random).
    pub fn new(seed: u64) -> Self {
        RateTable {
            sets: vec![RateSet::default(); RATE_SETS].into_boxed_slice(),
            seed,
            share: None,
        }
    }

    /// This worker's share of `limit` among `workers` at `tsc_hz`, remembered for
    /// the next connection under the same limit.
    #[inline]
    pub fn share(&mut self, limit: RateLimit, workers: usize, tsc_hz: u64) -> WorkerLimit {
        match self.share {
            Some((l, w, share)) if l == limit && w == workers => share,
            _ => {
                let share = limit.per_worker(workers, tsc_hz);
                self.share = Some((limit, workers, share));
                share
            }
        }
    }

    /// Bytes the table holds.
    pub fn heap_bytes(&self) -> usize {
        std::mem::size_of_val(&*self.sets)
    }

    /// Whether a new connection from the source `key` (service id << 32 | source
    /// network, never 0) may open at `now` (TSC) under `limit`.
    #[inline]
    pub fn check(&mut self, key: u64, now: u64, limit: &WorkerLimit) -> RateVerdict {
        let hash = crate::model::rng::mix(key ^ self.seed);
        let set = &mut self.sets[(hash as usize) & (RATE_SETS - 1)].0;
        let mut victim = 0;
        for (i, entry) in set.iter().enumerate() {
            if entry.key == key {
                return RateVerdict {
                    admitted: take(&mut set[i].due, now, limit),
                    evicted_live: false,
                };
            }
            if entry.due < set[victim].due {
                victim = i;
            }
        }
        let entry = &mut set[victim];
        let evicted_live = entry.key != 0 && entry.due > now;
        entry.key = key;
        entry.due = now;
        RateVerdict {
            admitted: take(&mut entry.due, now, limit),
            evicted_live,
        }
    }
}

/// A key for [`RateTable::new`] from the kernel's random source (once per worker,
/// at start), or the TSC if that fails.
pub fn random_seed() -> u64 {
    let mut seed = [0u8; 8];
    // SAFETY: getrandom writes at most `seed.len()` bytes into the buffer it is
    // given, which lives across the call.
    let got = unsafe { libc::getrandom(seed.as_mut_ptr().cast(), seed.len(), 0) };
    if got == seed.len() as isize {
        u64::from_ne_bytes(seed)
    } else {
        crate::model::rng::mix(crate::dpdk::tsc())
    }
}

/// The ICMP errors a worker writes itself (Packet Too Big for TUN over the MTU,
/// IPv4 frag-needed), limited as RFC 4443 section 2.4(f) asks: a token bucket of the
/// worker's own (GCRA, as the per-source limit), read against the worker's own TSC,
/// so no lock, no allocation and no shared line on the packet path.
pub struct ErrorLimiter {
    due: u64,
    limit: WorkerLimit,
}

impl ErrorLimiter {
    pub fn new(limit: WorkerLimit) -> Self {
        ErrorLimiter { due: 0, limit }
    }

    /// Whether an error may be sent at `now` (TSC); one that may takes a token.
    #[inline]
    pub fn allow(&mut self, now: u64) -> bool {
        take(&mut self.due, now, &self.limit)
    }
}

/// GCRA: admitted while the due time is at most the tolerance ahead of now; an
/// admitted connection moves it one interval on.
#[inline]
fn take(due: &mut u64, now: u64, limit: &WorkerLimit) -> bool {
    let at = (*due).max(now);
    if at - now > limit.tolerance {
        return false;
    }
    *due = at + limit.interval;
    true
}

impl Forwarder {
    /// The service's access list, then its rate limit, for a new connection from
    /// `key`'s source; the drop reason when either refuses it. Counted per rule and
    /// per service in the service's admission counters.
    #[inline]
    pub(super) fn check_admission(
        &mut self,
        service: usize,
        key: &FlowKey4,
        now_tsc: u64,
    ) -> Result<(), DropReason> {
        let snap = self.snapshot.current();
        let Some(admission) = snap.admission(service) else {
            return Ok(());
        };
        let worker = usize::from(self.rss.queue);
        let source = key.src_addr();
        if let Some(acl) = &admission.acl {
            let verdict = acl.decide(source);
            if let Some(rule) = verdict.rule {
                acl.count(worker, rule);
            }
            if !verdict.allowed {
                admission.counters.count(worker, AdmissionEvent::AclDenied);
                return Err(DropReason::AclDenied);
            }
        }
        if let Some(limit) = admission.rate_limit {
            let limit = self.rate_table.share(limit, admission.workers, self.tsc_hz);
            let bucket =
                u64::from(admission.service_id) << 32 | u64::from(u32::from(source) & limit.mask);
            let verdict = self.rate_table.check(bucket, now_tsc, &limit);
            if verdict.evicted_live {
                admission
                    .counters
                    .count(worker, AdmissionEvent::RateEvictedLive);
            }
            if !verdict.admitted {
                admission
                    .counters
                    .count(worker, AdmissionEvent::RateLimited);
                return Err(DropReason::RateLimited);
            }
        }
        Ok(())
    }

    /// Whether the service's access list refuses `key`'s source now, for a segment
    /// whose SYN it admitted already (a cookie's ACK). Only a refusal is counted (on
    /// its rule and as `acl_denied`): the admission was counted on the SYN.
    #[inline]
    pub(super) fn acl_refuses(&self, service: usize, key: &FlowKey4) -> bool {
        let snap = self.snapshot.current();
        let Some(acl) = snap
            .admission(service)
            .and_then(|a| a.acl.as_ref().map(|l| (a, l)))
        else {
            return false;
        };
        let (admission, acl) = acl;
        let verdict = acl.decide(key.src_addr());
        if verdict.allowed {
            return false;
        }
        let worker = usize::from(self.rss.queue);
        if let Some(rule) = verdict.rule {
            acl.count(worker, rule);
        }
        admission.counters.count(worker, AdmissionEvent::AclDenied);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HZ: u64 = 1_000_000_000;

    #[test]
    fn a_bucket_admits_its_burst_then_the_rate() {
        let mut table = RateTable::new(7);
        let limit = RateLimit::new(10, 5, 32).unwrap().per_worker(1, HZ);
        let key = 1 << 32 | 0xc612_0001;
        let admitted = (0..20)
            .filter(|_| table.check(key, 1_000 * HZ, &limit).admitted)
            .count();
        assert_eq!(admitted, 5, "the burst at one instant");
        // 100 ms later one more interval has passed: one more.
        let later = 1_000 * HZ + HZ / 10;
        assert!(table.check(key, later, &limit).admitted);
        assert!(!table.check(key, later, &limit).admitted);
        // Idle for a second: full again (5), not more.
        let idle = later + HZ;
        let refilled = (0..20)
            .filter(|_| table.check(key, idle, &limit).admitted)
            .count();
        assert_eq!(refilled, 5);
        // Over 10 s at a steady 100/s offered: about 10/s pass, after the burst.
        let start = idle + 10 * HZ;
        let passed = (0..1000u64)
            .filter(|i| table.check(key, start + i * HZ / 100, &limit).admitted)
            .count();
        assert!((100..=106).contains(&passed), "{passed}");
    }

    #[test]
    fn a_workers_share_is_recomputed_only_when_the_limit_changes() {
        let mut table = RateTable::new(3);
        let ten = RateLimit::new(10, 10, 32).unwrap();
        let share = table.share(ten, 2, HZ);
        assert_eq!(share, ten.per_worker(2, HZ));
        assert_eq!(table.share(ten, 2, HZ), share);
        let twenty = RateLimit::new(20, 10, 32).unwrap();
        assert_eq!(table.share(twenty, 2, HZ).interval, share.interval / 2);
        assert_eq!(table.share(ten, 1, HZ), ten.per_worker(1, HZ));
    }

    #[test]
    fn sources_and_services_have_their_own_buckets() {
        let mut table = RateTable::new(1);
        let limit = RateLimit::new(1, 1, 32).unwrap().per_worker(1, HZ);
        let now = 5 * HZ;
        assert!(table.check(1 << 32 | 1, now, &limit).admitted);
        assert!(!table.check(1 << 32 | 1, now, &limit).admitted);
        assert!(table.check(1 << 32 | 2, now, &limit).admitted);
        assert!(table.check(2 << 32 | 1, now, &limit).admitted);
    }

    /// The table never grows, and a flood of new sources does not take a drained
    /// greedy source's entry while fuller entries are there to take.
    #[test]
    fn eviction_is_bounded_and_takes_the_fullest_bucket_first() {
        let mut table = RateTable::new(99);
        let bytes = table.heap_bytes();
        assert_eq!(bytes, RATE_SETS * 64);
        let limit = RateLimit::new(10, 10, 32).unwrap().per_worker(1, HZ);
        let now = 100 * HZ;
        let greedy = 1 << 32 | 0x0a00_0001;
        while table.check(greedy, now, &limit).admitted {}
        // Each new source opens one connection (one token of ten): its entry is
        // fuller than the greedy one's, so it is the one taken when sets fill.
        let mut live = 0;
        for i in 0..(RATE_SETS * RATE_WAYS * 4) as u64 {
            let v = table.check(2 << 32 | i, now, &limit);
            assert!(v.admitted);
            live += u64::from(v.evicted_live);
        }
        assert!(live > 0, "the flood outgrew the table");
        assert!(
            !table.check(greedy, now, &limit).admitted,
            "the greedy source kept its drained bucket"
        );
        assert_eq!(table.heap_bytes(), bytes);
    }

    /// The ICMP error bucket: the burst at one instant, then the rate; over a flood of
    /// `t` seconds at most burst + rate * t errors, whatever the offered load; idle, it
    /// refills to the burst and no further.
    #[test]
    fn icmp_errors_get_the_burst_then_the_rate() {
        let limit = RateLimit::new(100, 10, 32).unwrap();
        let mut bucket = ErrorLimiter::new(limit.per_worker(1, HZ));
        let start = 50 * HZ;
        let at_once = (0..1000).filter(|_| bucket.allow(start)).count();
        assert_eq!(at_once, 10, "the burst");
        // A flood of 100,000 packets a second for 3 s, offered every 10 us.
        let mut sent = 0;
        let mut now = start;
        while now < start + 3 * HZ {
            sent += usize::from(bucket.allow(now));
            now += HZ / 100_000;
        }
        assert!(
            (299..=300).contains(&sent),
            "3 s at 100/s after the burst: {sent}"
        );
        // Idle 10 s: the burst again, not 1000.
        let idle = now + 10 * HZ;
        assert_eq!((0..1000).filter(|_| bucket.allow(idle)).count(), 10);
        // Two workers share the appliance's rate and burst.
        let mut half = ErrorLimiter::new(limit.per_worker(2, HZ));
        assert_eq!((0..1000).filter(|_| half.allow(start)).count(), 5);
        let mut flooded = 0;
        let mut now = start;
        while now < start + HZ {
            flooded += usize::from(half.allow(now));
            now += HZ / 100_000;
        }
        assert!((49..=50).contains(&flooded), "1 s at 50/s: {flooded}");
    }
}
