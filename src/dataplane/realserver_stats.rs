//! Per-worker, per-real-server counters: connections, packets and bytes each way, and
//! the active/inactive gauges `ipvsadm -Ln` shows. Indexed by the real server's stable
//! id; written only by the owning worker, summed by the management core on request.
use crate::dataplane::counters::bump;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Workers' passive counts for one real server, summed over workers (wrapping
/// counters; the monitor looks at differences).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PassiveTotals {
    pub answered: u32,
    pub unanswered: u32,
    pub refused: u32,
}

/// Passive counters wrap at this many bits per field (they share one word per real
/// server in the workers' tables).
pub const PASSIVE_FIELD_BITS: u32 = 21;
pub const PASSIVE_FIELD_MASK: u32 = (1 << PASSIVE_FIELD_BITS) - 1;

/// The bit of [`RealServerCounters::passive`] above the three passive fields: this
/// worker holds the server overloaded (`crate::dataplane::overload`).
const OVERLOADED_BIT: u64 = 1 << 63;

/// Slots per worker, one per real-server id (id 0 is never handed out): a removed
/// server's id is handed out again only once no session is counted on it
/// (`daemon::services::Retiring`). 64 bytes each per worker: 4 MiB per worker.
pub use crate::model::MAX_REAL_SERVER_IDS;

#[repr(C, align(64))]
#[derive(Default, Debug)]
pub struct RealServerCounters {
    /// Sessions created towards this real server.
    pub connections: AtomicU64,
    /// Client -> real server.
    pub in_packets: AtomicU64,
    pub in_bytes: AtomicU64,
    /// Real server -> client (NAT only: DR and TUN replies bypass Sluice).
    pub out_packets: AtomicU64,
    pub out_bytes: AtomicU64,
    /// Live sessions in ESTABLISHED (a gauge, wrapping arithmetic).
    pub active: AtomicU64,
    /// Live sessions in any other state, UDP included (a gauge).
    pub inactive: AtomicU64,
    /// Passive health detection, three wrapping 21-bit counts of new TCP connections
    /// in one word (so the entry stays one cache line): answered, unanswered, refused
    /// by the real server. See [`Passive`]. The top bit says whether this worker
    /// holds the server overloaded by its connection thresholds
    /// ([`RealServerCounters::overloaded`]).
    pub passive: AtomicU64,
}

/// The fields of [`RealServerCounters::passive`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Passive {
    Answered = 0,
    Unanswered = 1,
    Refused = 2,
}

impl Passive {
    const fn shift(self) -> u32 {
        self as u32 * PASSIVE_FIELD_BITS
    }

    /// This field of a `passive` word.
    pub const fn of(self, word: u64) -> u32 {
        (word >> self.shift()) as u32 & PASSIVE_FIELD_MASK
    }
}

impl RealServerCounters {
    #[inline]
    pub fn gauge_add(gauge: &AtomicU64, delta: i64) {
        gauge.store(gauge.load(Relaxed).wrapping_add(delta as u64), Relaxed);
    }

    #[inline]
    pub fn count_in(&self, bytes: u64) {
        bump(&self.in_packets, 1);
        bump(&self.in_bytes, bytes);
    }

    #[inline]
    pub fn count_out(&self, bytes: u64) {
        bump(&self.out_packets, 1);
        bump(&self.out_bytes, bytes);
    }

    /// One more new connection in passive field `which` (one writer: this worker).
    #[inline]
    pub fn count_passive(&self, which: Passive) {
        let word = self.passive.load(Relaxed);
        let mask = u64::from(PASSIVE_FIELD_MASK) << which.shift();
        let bumped = (word & !mask) | (word.wrapping_add(1 << which.shift()) & mask);
        self.passive.store(bumped, Relaxed);
    }

    /// Marks the server overloaded by its connection thresholds, or not (one writer:
    /// this worker; the passive fields are kept).
    #[inline]
    pub fn set_overloaded(&self, overloaded: bool) {
        let word = self.passive.load(Relaxed);
        let marked = if overloaded {
            word | OVERLOADED_BIT
        } else {
            word & !OVERLOADED_BIT
        };
        self.passive.store(marked, Relaxed);
    }

    /// Whether this worker holds the server overloaded.
    #[inline]
    pub fn overloaded(&self) -> bool {
        self.passive.load(Relaxed) & OVERLOADED_BIT != 0
    }
}

/// One worker's table of real-server counters.
pub fn new_table() -> Box<[RealServerCounters]> {
    (0..MAX_REAL_SERVER_IDS)
        .map(|_| RealServerCounters::default())
        .collect()
}

/// The sums over workers for one real server.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RealServerTotals {
    /// Passive health counts summed over workers (each field wraps at 21 bits).
    pub passive: PassiveTotals,
    pub connections: u64,
    pub in_packets: u64,
    pub in_bytes: u64,
    pub out_packets: u64,
    pub out_bytes: u64,
    pub active: u64,
    pub inactive: u64,
    /// Some worker holds the server overloaded by its connection thresholds.
    pub overloaded: bool,
}

impl RealServerTotals {
    /// Sums real server `id` over the workers' tables.
    pub fn sum(tables: &[std::sync::Arc<Box<[RealServerCounters]>>], id: u32) -> Self {
        let mut t = RealServerTotals::default();
        let (mut active, mut inactive) = (0u64, 0u64);
        for table in tables {
            let Some(c) = table.get(id as usize) else {
                continue;
            };
            t.connections += c.connections.load(Relaxed);
            t.in_packets += c.in_packets.load(Relaxed);
            t.in_bytes += c.in_bytes.load(Relaxed);
            t.out_packets += c.out_packets.load(Relaxed);
            t.out_bytes += c.out_bytes.load(Relaxed);
            let word = c.passive.load(Relaxed);
            t.overloaded |= word & OVERLOADED_BIT != 0;
            let mask = PASSIVE_FIELD_MASK;
            let p = &mut t.passive;
            p.answered = p.answered.wrapping_add(Passive::Answered.of(word)) & mask;
            p.unanswered = p.unanswered.wrapping_add(Passive::Unanswered.of(word)) & mask;
            p.refused = p.refused.wrapping_add(Passive::Refused.of(word)) & mask;
            active = active.wrapping_add(c.active.load(Relaxed));
            inactive = inactive.wrapping_add(c.inactive.load(Relaxed));
        }
        // A worker's gauge may be read between its increment and decrement on another
        // worker's session; the sum over workers is never negative in a quiet state.
        t.active = if (active as i64) < 0 { 0 } else { active };
        t.inactive = if (inactive as i64) < 0 { 0 } else { inactive };
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passive_fields_count_apart_and_wrap_without_carrying() {
        let c = RealServerCounters::default();
        assert_eq!(
            std::mem::size_of::<RealServerCounters>(),
            64,
            "one cache line"
        );
        c.count_passive(Passive::Refused);
        c.count_passive(Passive::Answered);
        c.count_passive(Passive::Answered);
        let w = c.passive.load(Relaxed);
        assert_eq!(
            (
                Passive::Answered.of(w),
                Passive::Unanswered.of(w),
                Passive::Refused.of(w)
            ),
            (2, 0, 1)
        );
        let max = u64::from(PASSIVE_FIELD_MASK);
        c.passive.store(max << Passive::Unanswered.shift(), Relaxed);
        c.count_passive(Passive::Unanswered);
        let w = c.passive.load(Relaxed);
        assert_eq!(
            (
                Passive::Answered.of(w),
                Passive::Unanswered.of(w),
                Passive::Refused.of(w)
            ),
            (0, 0, 0),
            "wraps to 0 without touching its neighbour"
        );
        let tables = vec![
            std::sync::Arc::new(new_table()),
            std::sync::Arc::new(new_table()),
        ];
        tables[0][5].count_passive(Passive::Unanswered);
        tables[1][5].count_passive(Passive::Unanswered);
        assert_eq!(RealServerTotals::sum(&tables, 5).passive.unanswered, 2);
    }

    #[test]
    fn the_overloaded_mark_shares_the_passive_word_without_touching_it() {
        let tables = vec![
            std::sync::Arc::new(new_table()),
            std::sync::Arc::new(new_table()),
        ];
        let max = u64::from(PASSIVE_FIELD_MASK);
        tables[1][3]
            .passive
            .store(max << Passive::Refused.shift(), Relaxed);
        tables[1][3].set_overloaded(true);
        tables[1][3].count_passive(Passive::Refused); // wraps to 0: no carry into the mark
        tables[1][3].count_passive(Passive::Answered);
        assert!(tables[1][3].overloaded());
        let t = RealServerTotals::sum(&tables, 3);
        assert!(t.overloaded, "one worker's mark is enough");
        assert_eq!((t.passive.answered, t.passive.refused), (1, 0));
        tables[1][3].set_overloaded(false);
        assert!(!RealServerTotals::sum(&tables, 3).overloaded);
        assert_eq!(Passive::Answered.of(tables[1][3].passive.load(Relaxed)), 1);
    }
}
