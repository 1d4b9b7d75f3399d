//! The one pseudo-random generator: wyrand, a 64-bit PRNG by Wang Yi (public domain,
//! from wyhash): a Weyl sequence (state += constant) mixed by one 64x64->128-bit
//! multiply. One state word, no locks, no allocation; statistically good (it passes
//! BigCrush and PractRand per its author), not cryptographic, which none of its users
//! needs: the random schedulers (wrandom, p2c), the spread of health probes, the
//! loopback emulator's sequence numbers and `sluice simulate`'s workloads.
//!
//! Seeded by the caller, so tests and simulations are reproducible and each worker
//! draws its own sequence.

/// wyrand state.
#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
}

impl Rng {
    const INCREMENT: u64 = 0xa076_1d64_78bd_642f;
    const MIX: u64 = 0xe703_7ed1_a0b4_28db;

    /// A generator starting from `seed` (any value, 0 included).
    pub const fn new(seed: u64) -> Self {
        Rng { state: seed }
    }

    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(Self::INCREMENT);
        let t = u128::from(self.state) * u128::from(self.state ^ Self::MIX);
        ((t >> 64) as u64) ^ (t as u64)
    }

    /// Uniform in `0..bound` (`bound` > 0) by Lemire's multiply-shift: the top 64 bits
    /// of `random × bound`. The bias is below `bound / 2^64`, far under anything a
    /// scheduler could notice; no division, no rejection loop.
    #[inline]
    pub fn below(&mut self, bound: u64) -> u64 {
        ((u128::from(self.next_u64()) * u128::from(bound)) >> 64) as u64
    }

    /// A generator for an independent stream derived from this seed and `stream`.
    pub fn derive(seed: u64, stream: u64) -> Self {
        let mut base = Rng::new(seed ^ stream.wrapping_mul(0xD6E8_FEB8_6659_FD93));
        Rng::new(base.next_u64())
    }

    /// Uniform in [0, 1), 53 bits.
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// True with probability `p`.
    pub fn chance(&mut self, p: f64) -> bool {
        self.unit() < p
    }

    /// Exponentially distributed with mean 1.
    pub fn exp1(&mut self) -> f64 {
        // 1 - unit() is in (0, 1], so the logarithm is finite.
        -(1.0 - self.unit()).ln()
    }

    /// Poisson-distributed count with mean `lambda` (Knuth's product method, in
    /// chunks of at most 30 so e^-lambda never underflows).
    pub fn poisson(&mut self, lambda: f64) -> u64 {
        let mut remaining = lambda.max(0.0);
        let mut count = 0;
        while remaining > 0.0 {
            let chunk = remaining.min(30.0);
            remaining -= chunk;
            let limit = (-chunk).exp();
            let mut product = self.unit();
            while product > limit {
                count += 1;
                product *= self.unit();
            }
        }
        count
    }
}

/// SplitMix64's finaliser; also a good 64-bit hash for small keys.
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_sequence_other_seed_other_sequence() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        let mut c = Rng::new(8);
        let xs: Vec<u64> = (0..100).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..100).map(|_| b.next_u64()).collect();
        let zs: Vec<u64> = (0..100).map(|_| c.next_u64()).collect();
        assert_eq!(xs, ys);
        assert_ne!(xs, zs);
    }

    #[test]
    fn below_stays_in_range_and_is_roughly_uniform() {
        let mut rng = Rng::new(0);
        let mut hits = [0u32; 10];
        for _ in 0..100_000 {
            let x = rng.below(10);
            hits[x as usize] += 1;
        }
        // 10 000 expected each; 5 sigma is 475.
        assert!(
            hits.iter().all(|&h| (9_500..=10_500).contains(&h)),
            "{hits:?}"
        );
        assert_eq!(rng.below(1), 0);
        for _ in 0..1000 {
            assert!(rng.below(3) < 3);
        }
    }

    #[test]
    fn bits_are_balanced() {
        let mut rng = Rng::new(12345);
        let mut ones = [0u32; 64];
        for _ in 0..20_000 {
            let x = rng.next_u64();
            for (bit, count) in ones.iter_mut().enumerate() {
                *count += ((x >> bit) & 1) as u32;
            }
        }
        // 10 000 expected per bit; 5 sigma is about 354.
        assert!(
            ones.iter().all(|&c| (9_600..=10_400).contains(&c)),
            "{ones:?}"
        );
    }

    #[test]
    fn distributions_have_the_right_means() {
        let mut r = Rng::new(7);
        let n = 200_000;
        let mean_unit = (0..n).map(|_| r.unit()).sum::<f64>() / n as f64;
        assert!((mean_unit - 0.5).abs() < 0.01, "{mean_unit}");
        let mean_exp = (0..n).map(|_| r.exp1()).sum::<f64>() / n as f64;
        assert!((mean_exp - 1.0).abs() < 0.02, "{mean_exp}");
        for lambda in [0.3, 4.0, 75.0] {
            let m = (0..20_000).map(|_| r.poisson(lambda)).sum::<u64>() as f64 / 20_000.0;
            assert!((m - lambda).abs() < 0.05 * lambda + 0.02, "{lambda}: {m}");
        }
        let mut hits = [0u32; 6];
        for _ in 0..60_000 {
            hits[r.below(6) as usize] += 1;
        }
        assert!(
            hits.iter().all(|&h| (9_400..10_600).contains(&h)),
            "{hits:?}"
        );
    }
}
