//! A fixed-size log-linear latency histogram: 32 sub-buckets per power of two, so a
//! percentile is reported within about 3 %. Recording is a few integer operations and
//! one array increment; nothing allocates after construction.

const SUB_BITS: u32 = 5;
const SUB: u64 = 1 << SUB_BITS;
/// Values up to 2^48 cycles (more than a day at 3 GHz) fit.
const OCTAVES: usize = 48;
const BUCKETS: usize = (OCTAVES + 1) * SUB as usize;

pub struct Histogram {
    counts: Box<[u64; BUCKETS]>,
    total: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

impl Histogram {
    pub fn new() -> Histogram {
        Histogram {
            counts: Box::new([0; BUCKETS]),
            total: 0,
        }
    }

    #[inline]
    fn index(v: u64) -> usize {
        if v < SUB {
            return v as usize;
        }
        let msb = 63 - v.leading_zeros();
        let shift = msb - SUB_BITS;
        let octave = (shift + 1) as usize;
        let sub = ((v >> shift) & (SUB - 1)) as usize;
        (octave * SUB as usize + sub).min(BUCKETS - 1)
    }

    /// The middle of bucket `i`'s value range.
    fn value_of(i: usize) -> u64 {
        let octave = i / SUB as usize;
        let sub = (i % SUB as usize) as u64;
        if octave == 0 {
            return sub;
        }
        let shift = octave as u32 - 1;
        let low = (SUB + sub) << shift;
        low + ((1u64 << shift) >> 1)
    }

    #[inline]
    pub fn record(&mut self, v: u64) {
        self.counts[Self::index(v)] += 1;
        self.total += 1;
    }

    pub fn count(&self) -> u64 {
        self.total
    }

    /// The value at quantile `q` (0..=1), or `None` when empty.
    pub fn quantile(&self, q: f64) -> Option<u64> {
        if self.total == 0 {
            return None;
        }
        let rank = ((q.clamp(0.0, 1.0) * self.total as f64).ceil() as u64).max(1);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Some(Self::value_of(i));
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_are_within_a_few_percent() {
        let mut h = Histogram::new();
        for v in 1..=100_000u64 {
            h.record(v * 10);
        }
        let p50 = h.quantile(0.5).unwrap() as f64;
        let p99 = h.quantile(0.99).unwrap() as f64;
        assert!((p50 / 500_000.0 - 1.0).abs() < 0.04, "p50 {p50}");
        assert!((p99 / 990_000.0 - 1.0).abs() < 0.04, "p99 {p99}");
        assert_eq!(h.count(), 100_000);
    }

    #[test]
    fn small_values_are_exact_and_empty_is_none() {
        let mut h = Histogram::new();
        assert_eq!(h.quantile(0.5), None);
        h.record(7);
        assert_eq!(h.quantile(0.5), Some(7));
        h.record(u64::MAX);
        assert!(h.quantile(1.0).unwrap() > 1 << 47);
    }
}
