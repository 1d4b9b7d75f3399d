//! Rates per real server (connections, packets and bytes per second each way), from the
//! workers' counters sampled by the management core once a second, over a window the
//! caller chooses (`-L --rate` uses IPVS's 2 s; `sluicectl skew --window`).
use crate::dataplane::realserver_stats::{RealServerCounters, RealServerTotals};
use crate::service::ServiceTable;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Samples kept per real server: windows up to a minute.
pub const MAX_WINDOW_S: u32 = 60;
/// `-L --rate`'s window, as IPVS's estimator (2 s).
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(2);

/// Per-second rates of one real server.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Rate {
    pub cps: f64,
    pub in_pps: f64,
    pub out_pps: f64,
    pub in_bps: f64,
    pub out_bps: f64,
}

/// (when, [connections, in packets, out packets, in bytes, out bytes])
type Sample = (Instant, [u64; 5]);

#[derive(Default)]
pub struct Rates {
    history: HashMap<u32, VecDeque<Sample>>,
    /// The same for each service's own counters, by service id: IPVS estimates a
    /// service's rates from its own counters, which go on counting real servers
    /// removed from it, not from the listed real servers' rates.
    services: HashMap<u32, VecDeque<Sample>>,
}

/// Appends a sample to `h`, which keeps a minute of them; counters that went
/// backwards (`-Z`) start it again, as the old samples no longer compare.
fn push(h: &mut VecDeque<Sample>, now: Instant, values: [u64; 5]) {
    if h.back()
        .is_some_and(|(_, last)| values.iter().zip(last).any(|(v, l)| v < l))
    {
        h.clear();
    }
    h.push_back((now, values));
    while h.len() > MAX_WINDOW_S as usize + 1 {
        h.pop_front();
    }
}

/// The rates over (about) the last `window` of `h`: between its newest sample and the
/// newest one at least `window` older (or the oldest kept).
fn rate_of(h: Option<&VecDeque<Sample>>, window: Duration) -> Rate {
    let Some(h) = h else {
        return Rate::default();
    };
    let Some(&(newest_at, newest)) = h.back() else {
        return Rate::default();
    };
    let base = h
        .iter()
        .rev()
        .find(|(at, _)| newest_at.duration_since(*at) >= window)
        .or_else(|| h.front())
        .copied();
    let Some((base_at, base)) = base else {
        return Rate::default();
    };
    let secs = newest_at.duration_since(base_at).as_secs_f64();
    if secs <= 0.0 {
        return Rate::default();
    }
    let per_s = |i: usize| newest[i].saturating_sub(base[i]) as f64 / secs;
    Rate {
        cps: per_s(0),
        in_pps: per_s(1),
        out_pps: per_s(2),
        in_bps: per_s(3),
        out_bps: per_s(4),
    }
}

impl Rates {
    /// Takes one sample of every real server of `table`; forgets removed ones.
    pub fn sample(
        &mut self,
        table: &ServiceTable,
        counters: &[Arc<Box<[RealServerCounters]>>],
        now: Instant,
    ) {
        let mut seen = Vec::new();
        let ids = table.services().flat_map(|s| {
            let sorry = s.sorry_server.map(|s| s.id);
            s.real_servers.iter().map(|r| r.id).chain(sorry)
        });
        for id in ids {
            seen.push(id);
            let t = RealServerTotals::sum(counters, id);
            let values = [
                t.connections,
                t.in_packets,
                t.out_packets,
                t.in_bytes,
                t.out_bytes,
            ];
            push(self.history.entry(id).or_default(), now, values);
        }
        // Sorted for the lookups: a linear search per entry was quadratic in the
        // real servers, once a second on the management core.
        seen.sort_unstable();
        self.history.retain(|id, _| seen.binary_search(id).is_ok());
    }

    /// Takes one sample of each service's own counters, `(service id, [connections,
    /// in packets, out packets, in bytes, out bytes])`; forgets services not given.
    pub fn sample_services(
        &mut self,
        services: impl Iterator<Item = (u32, [u64; 5])>,
        now: Instant,
    ) {
        let mut seen = Vec::new();
        for (id, values) in services {
            seen.push(id);
            push(self.services.entry(id).or_default(), now, values);
        }
        seen.sort_unstable();
        self.services.retain(|id, _| seen.binary_search(id).is_ok());
    }

    /// Real server `id`'s rates over (about) the last `window`: between its newest
    /// sample and the newest one at least `window` older (or the oldest kept).
    pub fn rate(&self, id: u32, window: Duration) -> Rate {
        rate_of(self.history.get(&id), window)
    }

    /// Service `id`'s own rates over (about) the last `window`, as [`Rates::rate`].
    pub fn service_rate(&self, id: u32, window: Duration) -> Rate {
        rate_of(self.services.get(&id), window)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::realserver_stats;
    use crate::model::Protocol;
    use crate::model::SchedulerKind;
    use crate::model::{ForwardMode, RealServerSpec, ServiceKey};
    use std::net::Ipv4Addr;
    use std::sync::atomic::Ordering::Relaxed;

    #[test]
    fn rates_follow_the_counters_over_the_window_and_survive_a_zeroing() {
        let mut table = ServiceTable::new();
        let key = ServiceKey::new(Protocol::Tcp, Ipv4Addr::new(198, 18, 1, 1), 80);
        table.add_service(key, SchedulerKind::Rr, None).unwrap();
        let spec = RealServerSpec::new(Ipv4Addr::new(10, 0, 0, 2), 80, 1, ForwardMode::Nat);
        let id = table.add_server(key, spec).unwrap();
        let counters = vec![Arc::new(realserver_stats::new_table())];
        let c = &counters[0][id as usize];
        let mut rates = Rates::default();
        let t0 = Instant::now();
        for s in 0..=4u64 {
            // 10 connections and 1000 packets per second.
            c.connections.store(10 * s, Relaxed);
            c.in_packets.store(1000 * s, Relaxed);
            rates.sample(&table, &counters, t0 + Duration::from_secs(s));
        }
        let r = rates.rate(id, DEFAULT_WINDOW);
        assert_eq!((r.cps, r.in_pps), (10.0, 1000.0));
        let r = rates.rate(id, Duration::from_secs(60));
        assert_eq!(
            r.cps, 10.0,
            "a window longer than the history uses all of it"
        );
        // -Z: counters drop to zero; the history restarts instead of going negative.
        c.connections.store(0, Relaxed);
        c.in_packets.store(0, Relaxed);
        rates.sample(&table, &counters, t0 + Duration::from_secs(5));
        assert_eq!(rates.rate(id, DEFAULT_WINDOW), Rate::default());
        c.connections.store(5, Relaxed);
        rates.sample(&table, &counters, t0 + Duration::from_secs(6));
        assert_eq!(rates.rate(id, DEFAULT_WINDOW).cps, 5.0);
        // A removed real server is forgotten.
        table.delete_server(key, spec.ip, spec.port).unwrap();
        rates.sample(&table, &counters, t0 + Duration::from_secs(7));
        assert_eq!(rates.rate(id, DEFAULT_WINDOW), Rate::default());
    }
}
