//! The random source of the random schedulers (wrandom, p2c): wyrand, a 64-bit PRNG
//! by Wang Yi (public domain, from wyhash): a Weyl sequence (state += constant) mixed
//! by one 64×64→128-bit multiply. One state word per scheduler instance, no locks, no
//! allocation; statistically good (it passes BigCrush and PractRand per its author),
//! not cryptographic, which a scheduler does not need.
//!
//! Seeded by the caller, so tests are reproducible and each worker can draw its own
//! sequence ([`SchedulerParams::seed`](super::SchedulerParams::seed)).

/// wyrand state.
#[derive(Clone, Debug)]
pub struct WyRand {
    state: u64,
}

impl WyRand {
    const INCREMENT: u64 = 0xa076_1d64_78bd_642f;
    const MIX: u64 = 0xe703_7ed1_a0b4_28db;

    /// A generator starting from `seed` (any value, 0 included).
    pub const fn new(seed: u64) -> Self {
        WyRand { state: seed }
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_sequence_other_seed_other_sequence() {
        let mut a = WyRand::new(7);
        let mut b = WyRand::new(7);
        let mut c = WyRand::new(8);
        let xs: Vec<u64> = (0..100).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..100).map(|_| b.next_u64()).collect();
        let zs: Vec<u64> = (0..100).map(|_| c.next_u64()).collect();
        assert_eq!(xs, ys);
        assert_ne!(xs, zs);
    }

    #[test]
    fn below_stays_in_range_and_is_roughly_uniform() {
        let mut rng = WyRand::new(0);
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
        let mut rng = WyRand::new(12345);
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
}
