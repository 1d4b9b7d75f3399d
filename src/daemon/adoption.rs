//! How long a published service snapshot takes to reach every worker: the management
//! core publishes, then waits (bounded) until each worker's `snapshot_generation`
//! counter shows the new generation. A worker adopts at the top of each poll, so the
//! bound is one poll loop (a burst, microseconds); a new session started after that
//! uses the new configuration.
use crate::control::status::AdoptionReport;
use crate::dataplane::counters::WorkerCounters;
use std::collections::VecDeque;
use std::sync::atomic::Ordering::Acquire;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Past this a publish counts as late and the management loop stops waiting.
pub const ADOPTION_TIMEOUT: Duration = Duration::from_millis(50);
/// Latencies kept for the percentiles (the most recent ones).
const RECENT: usize = 1024;
/// Spin this long before yielding the CPU between checks: adoption normally takes
/// microseconds, and the management core may share its CPU with other threads.
const SPIN: Duration = Duration::from_micros(200);

/// Publish -> all-workers-adopted latencies, kept by the management loop.
#[derive(Debug, Default)]
pub struct Adoption {
    generation: u64,
    measured: u64,
    late: u64,
    last_ns: Option<u64>,
    max_ns: u64,
    sum_ns: u64,
    recent: VecDeque<u64>,
}

impl Adoption {
    /// Waits until every worker reports `generation` (or newer), at most `timeout`
    /// after `published_at`, and records the latency, or a late publish.
    pub fn measure(
        &mut self,
        generation: u64,
        published_at: Instant,
        counters: &[Arc<WorkerCounters>],
        timeout: Duration,
    ) {
        let adopted = || {
            counters
                .iter()
                .all(|c| c.snapshot_generation.load(Acquire) >= generation)
        };
        let at = loop {
            if adopted() {
                break Some(Instant::now());
            }
            let waited = published_at.elapsed();
            if waited >= timeout {
                break None;
            }
            if waited < SPIN {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        };
        self.generation = generation;
        self.measured += 1;
        let Some(at) = at else {
            self.late += 1;
            self.last_ns = None;
            return;
        };
        let ns = at.saturating_duration_since(published_at).as_nanos() as u64;
        self.last_ns = Some(ns);
        self.max_ns = self.max_ns.max(ns);
        self.sum_ns = self.sum_ns.saturating_add(ns);
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
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering::Release;

    fn workers(n: usize, generation: u64) -> Vec<Arc<WorkerCounters>> {
        (0..n)
            .map(|_| {
                let c = Arc::new(WorkerCounters::default());
                c.snapshot_generation.store(generation, Release);
                c
            })
            .collect()
    }

    #[test]
    fn waits_for_the_slowest_worker() {
        let counters = workers(2, 4);
        counters[0].snapshot_generation.store(5, Release);
        let slow = counters[1].clone();
        let published = Instant::now();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(3));
            slow.snapshot_generation.store(5, Release);
        });
        let mut a = Adoption::default();
        a.measure(5, published, &counters, Duration::from_secs(5));
        t.join().unwrap();
        let r = a.report();
        assert_eq!((r.generation, r.publishes, r.late, r.recent), (5, 1, 0, 1));
        let ns = r.last_ns.expect("adopted in time");
        assert!(ns >= 3_000_000, "{ns} ns: returned before the slow worker");
        assert_eq!(r.max_ns, ns);
        assert_eq!((r.p50_ns, r.p99_ns), (Some(ns), Some(ns)));
    }

    #[test]
    fn a_newer_generation_counts_as_adopted_and_a_missing_one_as_late() {
        let counters = workers(3, 9);
        let mut a = Adoption::default();
        a.measure(8, Instant::now(), &counters, Duration::from_millis(10));
        assert_eq!(a.report().late, 0);
        let started = Instant::now();
        a.measure(10, started, &counters, Duration::from_millis(10));
        assert!(started.elapsed() >= Duration::from_millis(10));
        let r = a.report();
        assert_eq!((r.publishes, r.late, r.last_ns, r.recent), (2, 1, None, 1));
    }

    #[test]
    fn percentiles_come_from_the_recent_latencies() {
        let mut a = Adoption::default();
        let counters = workers(1, 100);
        let now = Instant::now();
        // Published 1..=100 us "ago": each measure sees adoption at once.
        for us in 1..=100u64 {
            a.measure(
                1,
                now - Duration::from_micros(us),
                &counters,
                ADOPTION_TIMEOUT,
            );
        }
        let r = a.report();
        assert_eq!(r.recent, 100);
        let p50 = r.p50_ns.unwrap();
        let p99 = r.p99_ns.unwrap();
        assert!((50_000..60_000).contains(&p50), "p50 {p50}");
        assert!(
            p99 >= 99_000 && p99 <= r.max_ns,
            "p99 {p99} max {}",
            r.max_ns
        );
        assert!(r.sum_ns >= (1..=100u64).sum::<u64>() * 1000);
    }
}
