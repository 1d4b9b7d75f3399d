//! The session index: from a key's hash to the slab entries that may hold the key.
//!
//! Open addressing over buckets of one 64-byte cache line. A bucket has eight slots,
//! each a 16-bit tag (bits of the key's hash, never zero while the slot is in use) and
//! a 32-bit value (the caller's: the session table stores its slab index and the key's
//! direction). The eight tags are one 128-bit word, compared with the wanted tag in one
//! SSE2 instruction. The index never stores keys: the caller checks a candidate against
//! the entry the value names, which it reads anyway to forward the packet (a tag
//! matching another key, 1 in 32,768 per occupied slot, costs one more entry read). Six
//! bytes per key, eight with the bucket's overhead, instead of a general-purpose map's
//! key, value and control byte (21 bytes for an IPv4 5-tuple in hashbrown), and the
//! index does not know the key type: an IPv6 table uses the same index over its own
//! entries.
//!
//! A key's hash picks its home bucket (multiply-shift on the high half, so any bucket
//! count works and the index is sized to its load, not to a power of two) and its tag
//! (the low half). A key lives in the first bucket, from its home on, that had a free
//! slot when it was inserted. Each bucket counts the keys that passed it because it
//! was full (its overflow count, as in folly's F14): a lookup stops at the first bucket
//! whose count is zero, and removing a key walks back over the buckets it passed and
//! decrements them. There are no tombstones, so removals never leave the index slower
//! than the keys in it make it, and nothing ever needs a rehash.
//!
//! Sizing: the table asks for room for its most keys at a load of at most
//! [`MAX_LOAD_PERCENT`] of the slots. Near that load up to one key in eight lies past
//! its home bucket (`nat_rewrite` with 1M sessions in a table sized to them: 1.12
//! buckets a lookup, [`SessionIndex::buckets_per_lookup`]), so most lookups read one
//! index line and one entry line, and the burst's prefetch loads the next bucket of a
//! key it finds past home (`Speculation::Further`). Inserting more keys
//! than the index was made for is refused ([`SessionIndex::insert`] returns false), so
//! a full table can neither corrupt the index nor push its load, and with it the
//! lookup cost, past the sizing.
//!
//! Costs: one multiply-fold hash per key, computed once per packet and carried from
//! the burst's prefetch pass to the lookup and the insert ([`KeyHash`]).
use allocator_api2::vec::Vec as HugeVec;

use super::hugemem::HugePageAlloc;

/// Slots per bucket: eight 16-bit tags, eight values and the overflow count fit a
/// cache line.
pub const SLOTS: usize = 8;

/// The highest load the index is sized for, in percent of its slots.
pub const MAX_LOAD_PERCENT: usize = 80;

/// A key's hash, computed once ([`Hasher::hash`]) and used for the prefetch, the
/// lookup and the insert.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyHash(u64);

impl KeyHash {
    /// The slot tag: the low 16 bits, never zero (zero marks a free slot).
    #[inline]
    fn tag(self) -> u16 {
        self.0 as u16 | 1
    }

    /// The home bucket among `buckets`: multiply-shift of the high half.
    #[inline]
    fn home(self, buckets: usize) -> usize {
        (((self.0 >> 32) * buckets as u64) >> 32) as usize
    }
}

/// A keyed hash of words, seeded per table from the operating system's randomness so
/// that an attacker who picks client addresses and ports cannot aim them at one bucket.
#[derive(Clone, Copy, Debug)]
pub struct Hasher {
    seeds: [u64; 3],
}

impl Hasher {
    /// A hasher with fresh random seeds.
    pub fn random() -> Hasher {
        use std::hash::BuildHasher;
        let state = std::collections::hash_map::RandomState::new();
        Hasher {
            seeds: [
                state.hash_one(1u64),
                state.hash_one(2u64),
                state.hash_one(3u64),
            ],
        }
    }

    /// Hashes two words (a key packed by its type): two folded multiplies.
    #[inline]
    pub fn hash(&self, a: u64, b: u64) -> KeyHash {
        let h = folded_multiply(a ^ self.seeds[0], b ^ self.seeds[1]);
        KeyHash(folded_multiply(h, self.seeds[2]))
    }

    /// Hashes a key wider than two words (an IPv6 tuple), two words at a time.
    #[inline]
    pub fn hash_key(&self, words: &[u64]) -> KeyHash {
        KeyHash(self.hash_words(words))
    }

    /// Hashes any number of words, two at a time, into 64 bits for a table of another
    /// kind (persistence templates) that needs the same protection; its bucket is
    /// [`KeyHash::home`]'s multiply-shift of the high half.
    #[inline]
    pub fn hash_words(&self, words: &[u64]) -> u64 {
        words.chunks(2).fold(0, |h, pair| {
            self.hash(h ^ pair[0], pair.get(1).copied().unwrap_or(0)).0
        })
    }
}

#[inline]
fn folded_multiply(x: u64, y: u64) -> u64 {
    let full = u128::from(x) * u128::from(y);
    (full as u64) ^ ((full >> 64) as u64)
}

/// One cache line of the index.
#[derive(Clone, Copy, Debug)]
#[repr(C, align(64))]
struct Bucket {
    tags: [u16; SLOTS],
    values: [u32; SLOTS],
    /// Keys stored beyond this bucket that passed it because it was full.
    overflow: u32,
    _spare: [u32; 3],
}

impl Bucket {
    const EMPTY: Bucket = Bucket {
        tags: [0; SLOTS],
        values: [0; SLOTS],
        overflow: 0,
        _spare: [0; 3],
    };

    /// Bit `s` set where slot `s`'s tag is `tag`: all eight compared at once.
    #[inline]
    fn matching(&self, tag: u16) -> u32 {
        use core::arch::x86_64::{
            __m128i, _mm_cmpeq_epi16, _mm_loadu_si128, _mm_movemask_epi8, _mm_packs_epi16,
            _mm_set1_epi16, _mm_setzero_si128,
        };
        // SAFETY: SSE2 is part of x86_64; the load reads the 16 bytes of `tags`, which
        // `_mm_loadu_si128` allows at any alignment.
        unsafe {
            let tags = _mm_loadu_si128(self.tags.as_ptr() as *const __m128i);
            let equal = _mm_cmpeq_epi16(tags, _mm_set1_epi16(tag as i16));
            // Each 16-bit lane (all ones or zero) narrowed to a byte, one bit per slot.
            _mm_movemask_epi8(_mm_packs_epi16(equal, _mm_setzero_si128())) as u32
        }
    }

    #[inline]
    fn free_slot(&self) -> Option<usize> {
        let free = self.matching(0);
        (free != 0).then(|| free.trailing_zeros() as usize)
    }
}

/// What a bucket read ahead of a lookup says of a key ([`SessionIndex::speculate`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Speculation {
    /// The value of the bucket's first slot whose tag matches: most likely the key's.
    Value(u32),
    /// No tag matches, and keys passed the bucket because it was full: the key, if
    /// filed, lies further on, most often in the next bucket.
    Further,
    /// No tag matches and no key passed: the key is not filed.
    Absent,
}

/// An index of at most [`max_keys`](Self::max_keys) keys, allocated once.
pub struct SessionIndex {
    buckets: HugeVec<Bucket, HugePageAlloc>,
    keys: usize,
    max_keys: usize,
}

/// Why the index's memory could not be had.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexAllocError;

impl SessionIndex {
    /// Buckets an index for `max_keys` keys has: the keys at [`MAX_LOAD_PERCENT`] of
    /// the slots, and at least one bucket.
    pub fn buckets_for(max_keys: usize) -> usize {
        let slots = max_keys.saturating_mul(100).div_ceil(MAX_LOAD_PERCENT);
        slots.div_ceil(SLOTS).max(1)
    }

    /// Bytes an index for `max_keys` keys allocates.
    pub fn bytes_for(max_keys: usize) -> usize {
        Self::buckets_for(max_keys).saturating_mul(std::mem::size_of::<Bucket>())
    }

    /// An empty index with room for `max_keys` keys, in huge-page-backed memory
    /// touched (and so placed) by the calling thread.
    pub fn try_new(max_keys: usize) -> Result<SessionIndex, IndexAllocError> {
        let count = Self::buckets_for(max_keys);
        let mut buckets = HugeVec::new_in(HugePageAlloc);
        buckets
            .try_reserve_exact(count)
            .map_err(|_| IndexAllocError)?;
        buckets.resize(count, Bucket::EMPTY);
        Ok(SessionIndex {
            buckets,
            keys: 0,
            max_keys,
        })
    }

    /// Keys in the index.
    #[inline]
    pub fn len(&self) -> usize {
        self.keys
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.keys == 0
    }

    /// The buckets a lookup of a filed key reads, on average over the keys now filed:
    /// its home, and one more for every full bucket it was filed past (the buckets'
    /// overflow counts add up to those). 1.0 when every key is at home, 0.0 when none
    /// is filed. Reads every bucket: for benchmarks and tests, not the packet path.
    pub fn buckets_per_lookup(&self) -> f64 {
        if self.keys == 0 {
            return 0.0;
        }
        let passed: u64 = self.buckets.iter().map(|b| u64::from(b.overflow)).sum();
        (self.keys as u64 + passed) as f64 / self.keys as f64
    }

    /// The index's memory: where it starts and how many bytes it spans.
    pub fn memory(&self) -> (*const u8, usize) {
        (
            self.buckets.as_ptr() as *const u8,
            std::mem::size_of_val::<[Bucket]>(&self.buckets),
        )
    }

    #[inline]
    fn next(&self, bucket: usize) -> usize {
        if bucket + 1 == self.buckets.len() {
            0
        } else {
            bucket + 1
        }
    }

    /// Starts loading the home bucket of `hash` into the cache.
    #[inline]
    pub fn prefetch(&self, hash: KeyHash) {
        let home = hash.home(self.buckets.len());
        if let Some(bucket) = self.buckets.get(home) {
            crate::session::prefetch_line(bucket);
        }
    }

    /// What `hash`'s home bucket says of the key, without checking the key: the entry
    /// to prefetch while the rest of the burst is hashed, or whether the key may lie
    /// past the bucket. A value may name another key's entry (a tag collision); the
    /// lookup sorts that out.
    #[inline]
    fn speculate(&self, hash: KeyHash) -> Speculation {
        self.speculate_in(hash.home(self.buckets.len()), hash.tag())
    }

    /// Starts loading the bucket after `hash`'s home: where a key whose home was full
    /// when it was filed most often lies ([`Speculation::Further`]).
    #[inline]
    fn prefetch_next_bucket(&self, hash: KeyHash) {
        let next = self.next(hash.home(self.buckets.len()));
        if let Some(bucket) = self.buckets.get(next) {
            crate::session::prefetch_line(bucket);
        }
    }

    /// [`SessionIndex::speculate`] for the bucket after `hash`'s home.
    #[inline]
    fn speculate_next_bucket(&self, hash: KeyHash) -> Speculation {
        self.speculate_in(self.next(hash.home(self.buckets.len())), hash.tag())
    }

    /// The prefetch's second step for `hash`, the bucket having had time to arrive:
    /// hands the value of its home bucket's first matching tag to `prefetch` (which
    /// starts loading the entry it names). With no tag there but keys passed the
    /// bucket, starts loading the next bucket instead and returns true: the third
    /// step, [`SessionIndex::prefetch_candidate_past_home`], is then due.
    #[inline]
    pub fn prefetch_candidate(&self, hash: KeyHash, prefetch: impl FnOnce(u32)) -> bool {
        match self.speculate(hash) {
            Speculation::Value(value) => {
                prefetch(value);
                false
            }
            Speculation::Further => {
                self.prefetch_next_bucket(hash);
                true
            }
            Speculation::Absent => false,
        }
    }

    /// The third step, once the next bucket has had time to arrive: hands the value
    /// of its first matching tag to `prefetch`.
    #[inline]
    pub fn prefetch_candidate_past_home(&self, hash: KeyHash, prefetch: impl FnOnce(u32)) {
        if let Speculation::Value(value) = self.speculate_next_bucket(hash) {
            prefetch(value);
        }
    }

    #[inline]
    fn speculate_in(&self, at: usize, tag: u16) -> Speculation {
        let Some(bucket) = self.buckets.get(at) else {
            return Speculation::Absent;
        };
        let matching = bucket.matching(tag);
        if matching != 0 {
            Speculation::Value(bucket.values[matching.trailing_zeros() as usize])
        } else if bucket.overflow != 0 {
            Speculation::Further
        } else {
            Speculation::Absent
        }
    }

    /// The value stored for the key hashed to `hash`: the first whose tag matches and
    /// that `is_key` accepts (the caller compares its entry's key).
    #[inline]
    pub fn find(&self, hash: KeyHash, mut is_key: impl FnMut(u32) -> bool) -> Option<u32> {
        let tag = hash.tag();
        let mut at = hash.home(self.buckets.len());
        for _ in 0..self.buckets.len() {
            let bucket = &self.buckets[at];
            let mut matching = bucket.matching(tag);
            while matching != 0 {
                let value = bucket.values[matching.trailing_zeros() as usize];
                if is_key(value) {
                    return Some(value);
                }
                matching &= matching - 1;
            }
            if bucket.overflow == 0 {
                return None;
            }
            at = self.next(at);
        }
        None
    }

    /// Stores `value` for a key hashed to `hash`, which the caller has found absent.
    /// Returns false, changing nothing, when the index holds its most keys already.
    pub fn insert(&mut self, hash: KeyHash, value: u32) -> bool {
        if self.keys >= self.max_keys {
            return false;
        }
        let len = self.buckets.len();
        let mut at = hash.home(len);
        // The load bound leaves free slots, so the walk ends well before wrapping.
        let mut found = None;
        for _ in 0..len {
            if let Some(slot) = self.buckets[at].free_slot() {
                found = Some(slot);
                break;
            }
            at = self.next(at);
        }
        let Some(slot) = found else {
            return false;
        };
        let mut passed = hash.home(len);
        while passed != at {
            self.buckets[passed].overflow += 1;
            passed = self.next(passed);
        }
        let bucket = &mut self.buckets[at];
        bucket.tags[slot] = hash.tag();
        bucket.values[slot] = value;
        self.keys += 1;
        true
    }

    /// Removes the slot holding `value` for a key hashed to `hash` (values are unique
    /// in the session table's use: slab index and direction). Returns whether it was
    /// there.
    pub fn remove(&mut self, hash: KeyHash, value: u32) -> bool {
        let len = self.buckets.len();
        let tag = hash.tag();
        let home = hash.home(len);
        let mut at = home;
        for _ in 0..len {
            let bucket = &mut self.buckets[at];
            if let Some(slot) =
                (0..SLOTS).find(|&s| bucket.tags[s] == tag && bucket.values[s] == value)
            {
                bucket.tags[slot] = 0;
                bucket.values[slot] = 0;
                let mut passed = home;
                while passed != at {
                    self.buckets[passed].overflow -= 1;
                    passed = self.next(passed);
                }
                self.keys -= 1;
                return true;
            }
            if bucket.overflow == 0 {
                return false;
            }
            at = self.next(at);
        }
        false
    }

    /// Every stored (tag, value), and a check of the overflow counts against the
    /// stored keys' positions: for tests and fuzzing, O(index).
    pub fn check_consistency(
        &self,
        mut home_of: impl FnMut(u32) -> Option<KeyHash>,
    ) -> Result<(), String> {
        let len = self.buckets.len();
        let mut overflow = vec![0u32; len];
        let mut keys = 0usize;
        for (at, bucket) in self.buckets.iter().enumerate() {
            for s in 0..SLOTS {
                if bucket.tags[s] == 0 {
                    continue;
                }
                keys += 1;
                let Some(hash) = home_of(bucket.values[s]) else {
                    return Err(format!(
                        "bucket {at} slot {s}: value {} names no key",
                        bucket.values[s]
                    ));
                };
                if hash.tag() != bucket.tags[s] {
                    return Err(format!("bucket {at} slot {s}: tag does not match its key"));
                }
                let mut passed = hash.home(len);
                while passed != at {
                    overflow[passed] += 1;
                    passed = self.next(passed);
                }
            }
        }
        if keys != self.keys {
            return Err(format!("index counts {} keys, holds {keys}", self.keys));
        }
        for (at, (bucket, want)) in self.buckets.iter().zip(&overflow).enumerate() {
            if bucket.overflow != *want {
                return Err(format!(
                    "bucket {at}: overflow count {} but {want} keys passed it",
                    bucket.overflow
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_is_one_cache_line() {
        assert_eq!(std::mem::size_of::<Bucket>(), 64);
        assert_eq!(std::mem::align_of::<Bucket>(), 64);
    }

    #[test]
    fn sized_for_its_load() {
        // Two million keys at 80 %: 2.5 M slots, 312,500 buckets of 64 bytes.
        assert_eq!(SessionIndex::buckets_for(2_000_000), 312_500);
        assert_eq!(SessionIndex::bytes_for(2_000_000), 312_500 * 64);
        assert_eq!(SessionIndex::buckets_for(0), 1);
    }

    #[test]
    fn keys_that_share_a_bucket_overflow_and_come_back() {
        // Every key's high half is zero: all go home to bucket 0.
        let mut index = SessionIndex::try_new(40).unwrap();
        let hash = |k: u32| KeyHash(u64::from(k));
        for k in 1..=20 {
            assert!(index.insert(hash(k), k));
        }
        for k in 1..=20 {
            assert_eq!(index.find(hash(k), |v| v == k), Some(k));
        }
        let home_of = |v: u32| Some(hash(v));
        index.check_consistency(home_of).unwrap();
        // Remove from the home bucket: the overflowed keys stay reachable.
        for k in 1..=7 {
            assert!(index.remove(hash(k), k));
            index.check_consistency(home_of).unwrap();
        }
        for k in 8..=20 {
            assert_eq!(index.find(hash(k), |v| v == k), Some(k));
        }
        assert_eq!(index.find(hash(3), |v| v == 3), None);
        assert!(!index.remove(hash(3), 3));
    }

    #[test]
    fn the_speculation_leads_to_keys_at_home_and_one_bucket_past_it() {
        // Seven buckets. Every key's high half is zero (home: bucket 0) and its tag its
        // own (2k + 1): bucket 0 takes keys 1-8, bucket 1 keys 9-16, bucket 2 the rest.
        let mut index = SessionIndex::try_new(40).unwrap();
        assert_eq!(index.buckets.len(), 7);
        let hash = |k: u32| KeyHash(u64::from(k) << 1);
        assert_eq!(index.buckets_per_lookup(), 0.0);
        for k in 1..=20 {
            assert!(index.insert(hash(k), k));
        }
        // 8 keys at home, 8 one bucket on, 4 two on: 20 + 8 + 8 buckets over 20 keys.
        assert_eq!(index.buckets_per_lookup(), 36.0 / 20.0);
        for k in 1..=8 {
            assert_eq!(index.speculate(hash(k)), Speculation::Value(k));
        }
        for k in 9..=16 {
            assert_eq!(index.speculate(hash(k)), Speculation::Further);
            assert_eq!(index.speculate_next_bucket(hash(k)), Speculation::Value(k));
        }
        for k in 17..=20 {
            assert_eq!(index.speculate(hash(k)), Speculation::Further);
            assert_eq!(index.speculate_next_bucket(hash(k)), Speculation::Further);
        }
        // A key not filed: where keys passed its home, it may be further on.
        assert_eq!(index.speculate(hash(21)), Speculation::Further);
        // Its home emptied, the keys that passed it still say so.
        for k in 1..=8 {
            assert!(index.remove(hash(k), k));
        }
        assert_eq!(index.speculate(hash(9)), Speculation::Further);
        // Twelve keys left: 9-16 one bucket past home, 17-20 two.
        assert_eq!(index.buckets_per_lookup(), 28.0 / 12.0);
        assert_eq!(index.speculate_next_bucket(hash(9)), Speculation::Value(9));
        // Once none has passed it, the home says the key is absent.
        for k in 9..=20 {
            assert!(index.remove(hash(k), k));
        }
        assert_eq!(index.speculate(hash(9)), Speculation::Absent);
        // The last bucket's next is the first: a key filed past home 6 lies in bucket 0.
        let last = |k: u32| KeyHash(0xffff_ffff << 32 | u64::from(k) << 1);
        assert_eq!(last(1).home(7), 6);
        for k in 1..=9 {
            assert!(index.insert(last(k), k));
        }
        assert_eq!(index.speculate(last(9)), Speculation::Further);
        assert_eq!(index.speculate_next_bucket(last(9)), Speculation::Value(9));
        // Nine keys, one of them one bucket past home.
        assert_eq!(index.buckets_per_lookup(), 10.0 / 9.0);
        // The wrap passed bucket 6 only: bucket 0 says nothing passed it.
        assert_eq!(index.speculate(hash(3)), Speculation::Absent);
    }

    #[test]
    fn a_full_index_refuses_and_stays_whole() {
        let mut index = SessionIndex::try_new(5).unwrap();
        let hash = |k: u32| KeyHash(u64::from(k) << 40 | u64::from(k));
        for k in 1..=5 {
            assert!(index.insert(hash(k), k));
        }
        assert!(!index.insert(hash(6), 6));
        assert_eq!(index.len(), 5);
        index.check_consistency(|v| Some(hash(v))).unwrap();
    }

    #[test]
    fn randomized_against_a_reference_set_with_colliding_keys() {
        use crate::model::rng::Rng;
        use std::collections::HashSet;
        const MAX: usize = 100;
        // Homes in four of the 16 buckets, and tags shared by pairs of keys: long
        // overflow chains, and tag matches the caller's key check must reject.
        let hash = |k: u32| KeyHash(u64::from(k % 4) << 62 | u64::from(k / 2));
        for seed in 0..8 {
            let mut rng = Rng::derive(seed, 0);
            let mut index = SessionIndex::try_new(MAX).unwrap();
            let mut reference = HashSet::new();
            let (mut refused, mut removed_while_full) = (0, 0);
            for step in 0..20_000 {
                let k = rng.below(300) as u32;
                match rng.below(10) {
                    0..=5 if !reference.contains(&k) => {
                        let took = index.insert(hash(k), k);
                        assert_eq!(took, reference.len() < MAX, "insert {k} at {step}");
                        if took {
                            reference.insert(k);
                        } else {
                            refused += 1;
                        }
                    }
                    0..=7 => {
                        if reference.len() == MAX {
                            removed_while_full += 1;
                        }
                        assert_eq!(index.remove(hash(k), k), reference.remove(&k));
                    }
                    _ => {}
                }
                let probe = rng.below(300) as u32;
                let found = index.find(hash(probe), |v| v == probe);
                assert_eq!(found, reference.contains(&probe).then_some(probe));
                assert_eq!(index.len(), reference.len());
                if step % 97 == 0 {
                    index.check_consistency(|v| Some(hash(v))).unwrap();
                }
            }
            index.check_consistency(|v| Some(hash(v))).unwrap();
            for k in 0..300 {
                assert_eq!(
                    index.find(hash(k), |v| v == k).is_some(),
                    reference.contains(&k)
                );
            }
            assert!(
                refused > 0 && removed_while_full > 0,
                "seed {seed}: {refused} {removed_while_full}"
            );
        }
    }
}
