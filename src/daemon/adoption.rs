//! How long a published service snapshot takes to reach every worker: the management
//! core publishes, then waits (bounded) until each worker's `snapshot_generation`
//! counter shows the new generation, and takes the latency from the TSC the slowest
//! worker stored when it adopted. A worker adopts at the top of each poll, so the bound
//! is one poll loop (a burst, microseconds) while it has its CPU; a new session started
//! after that uses the new configuration.
use crate::control::report::AdoptionReport;
use crate::dataplane::counters::WorkerCounters;
use std::collections::VecDeque;
use std::sync::atomic::Ordering::{Acquire, Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Past this a publish counts as late and the management loop stops waiting.
pub const ADOPTION_TIMEOUT: Duration = Duration::from_millis(50);
/// Latencies kept for the percentiles (the most recent ones).
const RECENT: usize = 1024;
/// Spin this long before yielding the CPU between checks: adoption normally takes
/// microseconds, and the management core may share its CPU with other threads.
const SPIN: Duration = Duration::from_micros(200);

/// One publish, as the management loop saw it.
pub struct Published {
    pub generation: u64,
    /// When it was published: the wait is bounded from here.
    pub at: Instant,
    /// The TSC then, to compare with the workers' adoption TSCs, and its rate.
    pub tsc: u64,
    pub tsc_hz: u64,
}

/// Publish -> all-workers-adopted latencies, kept by the management loop.
#[derive(Debug, Default)]
pub struct Adoption {
    generation: u64,
    measured: u64,
    late: u64,
    last_ns: Option<u64>,
    max_ns: u64,
    sum_ns: u64,
    within_1ms: u64,
    recent: VecDeque<u64>,
}

impl Adoption {
    /// Waits until every worker reports the published generation (or newer), at most
    /// `timeout` after the publish, and records the latency: from the publish to the
    /// last worker's adoption, both as TSC readings, so time this thread spends
    /// descheduled while waiting does not count; or records a late publish.
    pub fn measure(
        &mut self,
        published: &Published,
        counters: &[Arc<WorkerCounters>],
        timeout: Duration,
    ) {
        let adopted = || {
            counters
                .iter()
                .all(|c| c.snapshot_generation.load(Acquire) >= published.generation)
        };
        let in_time = loop {
            if adopted() {
                break true;
            }
            let waited = published.at.elapsed();
            if waited >= timeout {
                break false;
            }
            if waited < SPIN {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        };
        self.generation = published.generation;
        self.measured += 1;
        if !in_time {
            self.late += 1;
            self.last_ns = None;
            return;
        }
        // Each worker stored its TSC before the generation (Release), read after it
        // (Acquire): these are the adoption times of this generation.
        let last = counters
            .iter()
            .map(|c| c.snapshot_adopted_tsc.load(Relaxed))
            .max()
            .unwrap_or(published.tsc);
        let ticks = last.saturating_sub(published.tsc) as u128;
        let ns = (ticks * 1_000_000_000 / published.tsc_hz.max(1) as u128) as u64;
        self.last_ns = Some(ns);
        self.max_ns = self.max_ns.max(ns);
        self.sum_ns = self.sum_ns.saturating_add(ns);
        self.within_1ms += u64::from(ns <= 1_000_000);
        if self.recent.len() == RECENT {
            self.recent.pop_front();
        }
        self.recent.push_back(ns);
    }

    pub fn report(&self) -> AdoptionReport {
        let mut sorted: Vec<u64> = self.recent.iter().copied().collect();
        sorted.sort_unstable();
        let quantile = |q: f64| {
            (!sorted.is_empty()).then(|| sorted[((sorted.len() - 1) as f64 * q).round() as usize])
        };
        AdoptionReport {
            generation: self.generation,
            publishes: self.measured,
            late: self.late,
            last_ns: self.last_ns,
            max_ns: self.max_ns,
            sum_ns: self.sum_ns,
            recent: sorted.len() as u64,
            p50_ns: quantile(0.5),
            p99_ns: quantile(0.99),
            timeout_ms: ADOPTION_TIMEOUT.as_millis() as u64,
            within_1ms: self.within_1ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::Release;

    /// A 1 GHz TSC, so ticks read as nanoseconds.
    const HZ: u64 = 1_000_000_000;

    fn workers(n: usize, generation: u64) -> Vec<Arc<WorkerCounters>> {
        (0..n)
            .map(|_| {
                let c = Arc::new(WorkerCounters::default());
                c.snapshot_generation.store(generation, Release);
                c
            })
            .collect()
    }

    fn adopt(c: &WorkerCounters, generation: u64, tsc: u64) {
        c.snapshot_adopted_tsc.store(tsc, Relaxed);
        c.snapshot_generation.store(generation, Release);
    }

    fn published(generation: u64, tsc: u64) -> Published {
        Published {
            generation,
            at: Instant::now(),
            tsc,
            tsc_hz: HZ,
        }
    }

    #[test]
    fn waits_for_the_slowest_worker_and_times_its_adoption() {
        let counters = workers(2, 4);
        adopt(&counters[0], 5, 1_000_500);
        let slow = counters[1].clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(3));
            adopt(&slow, 5, 1_007_000);
        });
        let started = Instant::now();
        let mut a = Adoption::default();
        a.measure(&published(5, 1_000_000), &counters, Duration::from_secs(5));
        assert!(
            started.elapsed() >= Duration::from_millis(3),
            "returned before the slow worker adopted"
        );
        t.join().unwrap();
        let r = a.report();
        assert_eq!((r.generation, r.publishes, r.late, r.recent), (5, 1, 0, 1));
        assert_eq!(r.last_ns, Some(7_000), "the slowest worker's adoption");
        assert_eq!((r.max_ns, r.sum_ns), (7_000, 7_000));
        assert_eq!((r.p50_ns, r.p99_ns), (Some(7_000), Some(7_000)));
    }

    #[test]
    fn a_newer_generation_counts_as_adopted_and_a_missing_one_as_late() {
        let counters = workers(3, 9);
        let mut a = Adoption::default();
        a.measure(&published(8, 0), &counters, Duration::from_millis(10));
        assert_eq!(a.report().late, 0);
        let started = Instant::now();
        a.measure(&published(10, 0), &counters, Duration::from_millis(10));
        assert!(started.elapsed() >= Duration::from_millis(10));
        let r = a.report();
        assert_eq!((r.publishes, r.late, r.last_ns, r.recent), (2, 1, None, 1));
    }

    #[test]
    fn percentiles_come_from_the_recent_latencies() {
        let mut a = Adoption::default();
        let counters = workers(1, 0);
        for us in 1..=100u64 {
            adopt(&counters[0], us, 5_000_000 + us * 1000);
            a.measure(&published(us, 5_000_000), &counters, ADOPTION_TIMEOUT);
        }
        let r = a.report();
        assert_eq!((r.recent, r.publishes, r.late), (100, 100, 0));
        assert_eq!(r.p50_ns, Some(51_000));
        assert_eq!(r.p99_ns, Some(99_000));
        assert_eq!(r.max_ns, 100_000);
        assert_eq!(r.sum_ns, 5_050_000);
        assert_eq!(r.within_1ms, 100);
        adopt(&counters[0], 101, 5_000_000 + 1_000_001);
        a.measure(&published(101, 5_000_000), &counters, ADOPTION_TIMEOUT);
        assert_eq!(a.report().within_1ms, 100, "1 ms and 1 ns is over");
        assert_eq!(r.generation, 100);
    }

    #[test]
    fn a_worker_clock_behind_the_publisher_counts_as_zero() {
        let counters = workers(1, 0);
        adopt(&counters[0], 1, 900);
        let mut a = Adoption::default();
        a.measure(&published(1, 1_000), &counters, ADOPTION_TIMEOUT);
        assert_eq!(a.report().last_ns, Some(0));
    }
}
