//! Maglev hashing (`mh`), after IPVS's `ip_vs_mh` and the Maglev paper (Eisenbud et
//! al., NSDI 2016, section 3.4): consistent hashing through a lookup table of M slots
//! (M prime), each naming a real server. A client hashes to a slot; the table is built
//! so that every server owns an almost equal share of slots (proportional to weight)
//! and a change to the server list moves few slots besides those of the servers that
//! came or went.
//!
//! **Population** (`ip_vs_mh_permutate` + `ip_vs_mh_populate`). Each server with
//! weight > 0 gets a preference list of all slots, `offset, offset + skip,
//! offset + 2 skip, ... (mod M)`, where `offset = h1(id) mod M` and
//! `skip = h2(id) mod (M - 1) + 1` come from two differently keyed hashes of its
//! identity `id` = (address, port); M prime makes every list a permutation. Servers
//! then take turns, each claiming the next still-free slot of its list, until all M
//! slots are owned. Weighted as the kernel does: in each round a server takes
//! `turns = (weight / g) >> shift` slots in a row (at least 1), where g is the gcd of
//! the weights and `shift` brings the largest `weight / g` under `2^b`, with
//! `b = ceil(log2 M) / 2` (the kernel's `IP_VS_MH_TAB_BITS`; 8 for M = 65537). Weight
//! ratios up to 255:1 are therefore exact at the default size; larger ones are
//! compressed (1:1000 becomes 1:250). A server with weight 0 takes no slot.
//!
//! **Determinism.** The servers take their turns in the order of their identities
//! (address, then port), not list order, and slots store list indices mapped back
//! from that order, so two instances built from the same servers in any order own
//! the same slots. The kernel walks its list order instead.
//!
//! **Hash.** SipHash-1-3 (Aumasson and Bernstein; the kernel's `hsiphash` on 64-bit)
//! with the kernel's fixed keys, `k0 = k1 = 2654435761` for h1 (also the client hash)
//! and `k0 = k1 = 2654446892` for h2, truncated to 32 bits as `hsiphash` returns. The
//! message differs from the kernel's, which hashes the 32-bit sum `address + port`
//! (so 10.0.0.1:81 and 10.0.0.2:80 get the same preference list there): Sluice hashes
//! the 64-bit word `address << 16 | port`, one distinct input per identity. A client
//! is hashed the same way, with port 0 unless `mh-port` is set; its slot is
//! `h1 mod M`. So a pick is one SipHash, one multiply-based modulo and one load.
//!
//! **mh-fallback** (`ip_vs_mh_get_fallback`): if the slot's server is unavailable,
//! rehash with increasing offsets (the kernel's loop: the client word plus
//! `(offset + slot) mod M`, for offset 0..M) and take the first available server.
//! Because a server with weight 0 owns no slot and a worker rebuilds its schedulers
//! when it adopts a new snapshot, after a rebuild every slot's server is available and
//! the flag changes nothing. It only matters for a table used with a server list whose
//! weights changed since it was built (between a drain and the rebuild): without it,
//! the clients of the drained server's slots get None, with it they move to another
//! server. (The kernel keeps a draining server's slots, from its `last_weight`, so that
//! draining does not reshuffle the table; Sluice rebuilds, and Maglev's minimal
//! disruption keeps the reshuffle small.)
//!
//! The table is built in [`Maglev::new`], off the packet path: about a millisecond for
//! 1000 servers at M = 65537 (see `perf/results/sched.md`). A table holds M `u32`
//! (256 KiB at the default size).
use crate::model::siphash::sip_round;
use crate::model::{RealServer, MH_DEFAULT_TABLE_SIZE};
use crate::model::{SchedFlags, SchedulerKind};
use crate::sched::{available, fold_address, PickContext, Scheduler};
use std::net::Ipv4Addr;

/// Largest table size accepted (2^24 slots, 64 MiB per table).
pub const MAX_TABLE_SIZE: u32 = 1 << 24;

/// SipHash key halves (k0 = k1) of h1, the offset and client hash: `ip_vs_mh`'s.
const H1_KEY: u64 = 2_654_435_761;
/// SipHash key halves of h2, the skip hash: `ip_vs_mh`'s.
const H2_KEY: u64 = 2_654_446_892;

/// An unowned slot (only when no server has weight > 0).
const EMPTY: u32 = u32::MAX;

/// Whether `n` is prime (trial division; n < 2^32 needs divisors up to 65536).
pub fn is_prime(n: u32) -> bool {
    if n < 4 {
        return n >= 2;
    }
    if n.is_multiple_of(2) || n.is_multiple_of(3) {
        return false;
    }
    let n = u64::from(n);
    let mut d = 5u64;
    while d * d <= n {
        if n.is_multiple_of(d) || n.is_multiple_of(d + 2) {
            return false;
        }
        d += 6;
    }
    true
}

/// An error unless `size` is a prime in `2..=`[`MAX_TABLE_SIZE`].
pub fn check_table_size(size: u32) -> Result<(), String> {
    if size > MAX_TABLE_SIZE {
        return Err(format!(
            "Maglev table size {size} is too large (at most {MAX_TABLE_SIZE})"
        ));
    }
    if !is_prime(size) {
        return Err(format!(
            "Maglev table size {size} is not prime (the default is {MH_DEFAULT_TABLE_SIZE})"
        ));
    }
    Ok(())
}

/// SipHash-c-d of one 8-byte message (`message.to_le_bytes()`) under key (k0, k1).
#[inline(always)]
fn siphash_word<const C: usize, const D: usize>(k0: u64, k1: u64, message: u64) -> u64 {
    let mut v = [
        k0 ^ 0x736f_6d65_7073_6575,
        k1 ^ 0x646f_7261_6e64_6f6d,
        k0 ^ 0x6c79_6765_6e65_7261,
        k1 ^ 0x7465_6462_7974_6573,
    ];
    // The message block.
    v[3] ^= message;
    for _ in 0..C {
        sip_round(&mut v);
    }
    v[0] ^= message;
    // The final block: no bytes left, the length (8) in the top byte.
    let last = 8u64 << 56;
    v[3] ^= last;
    for _ in 0..C {
        sip_round(&mut v);
    }
    v[0] ^= last;
    v[2] ^= 0xff;
    for _ in 0..D {
        sip_round(&mut v);
    }
    v[0] ^ v[1] ^ v[2] ^ v[3]
}

/// SipHash-1-3 of one 64-bit word with key halves `k0 = k1 = key`.
#[inline]
pub fn siphash13(key: u64, message: u64) -> u64 {
    siphash_word::<1, 3>(key, key, message)
}

/// A server's place in the build order: its address (IPv4 as its 32-bit value, below
/// every IPv6 one) and port.
fn identity(server: &RealServer) -> (u128, u16) {
    let address = match server.ip {
        std::net::IpAddr::V4(a) => u128::from(u32::from(a)),
        std::net::IpAddr::V6(a) => u128::from(a),
    };
    (address, server.port)
}

/// The hashed word of an address and port: `address << 16 | port`.
#[inline]
fn word(address: Ipv4Addr, port: u16) -> u64 {
    (u64::from(u32::from(address)) << 16) | u64::from(port)
}

/// `a mod d` for 32-bit `a` and `d` >= 2 without a division (Lemire, Kaser and Kurz,
/// "Faster remainder by direct computation", 2019): exact for every 32-bit a and d.
#[derive(Clone, Copy, Debug)]
struct FastMod {
    d: u32,
    c: u64,
}

impl FastMod {
    fn new(d: u32) -> Self {
        debug_assert!(d >= 2);
        FastMod {
            d,
            c: u64::MAX / u64::from(d) + 1,
        }
    }

    #[inline]
    fn rem(self, a: u32) -> u32 {
        let low = self.c.wrapping_mul(u64::from(a));
        ((u128::from(low) * u128::from(self.d)) >> 64) as u32
    }
}

fn gcd(mut a: u32, mut b: u32) -> u32 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// `x mod m` for 64-bit `x` without a division (Barrett): `q = x * floor(2^64 / m)
/// >> 64` is `x / m` or one less, so one correction step suffices.
#[derive(Clone, Copy, Debug)]
struct Barrett {
    m: u64,
    c: u64,
}

impl Barrett {
    fn new(m: u32) -> Self {
        Barrett {
            m: u64::from(m),
            c: u64::MAX / u64::from(m),
        }
    }

    #[inline]
    fn rem(self, x: u64) -> u32 {
        let q = ((u128::from(x) * u128::from(self.c)) >> 64) as u64;
        let r = x - q * self.m;
        (if r >= self.m { r - self.m } else { r }) as u32
    }
}

/// `a^-1 mod m` for `a` in `1..m`, `m` prime (extended Euclid).
fn inverse_mod(a: u32, m: u32) -> u32 {
    let (mut r0, mut r1) = (i64::from(m), i64::from(a));
    let (mut t0, mut t1) = (0i64, 1i64);
    while r1 != 0 {
        let q = r0 / r1;
        (r0, r1) = (r1, r0 - q * r1);
        (t0, t1) = (t1, t0 - q * t1);
    }
    t0.rem_euclid(i64::from(m)) as u32
}

/// One server's place in the population: its preference list (`offset + j * skip mod
/// M` for j = 0, 1, ...), where it stands in it and how many slots it takes per round.
struct Preference {
    index: u32,
    offset: u32,
    skip: u32,
    /// `skip^-1 mod M`: the position of slot s in the list is `(s - offset) / skip`.
    skip_inverse: u32,
    /// The slot the walk resumes from (taken by this server or still to be tested).
    next: u32,
    turns: u32,
}

impl Preference {
    /// Position of `slot` in this server's preference list.
    #[inline]
    fn position(&self, slot: u32, m: u32, modulo: Barrett) -> u32 {
        let from_offset = if slot >= self.offset {
            slot - self.offset
        } else {
            slot + m - self.offset
        };
        modulo.rem(u64::from(from_offset) * u64::from(self.skip_inverse))
    }
}

/// When this few slots are left free, find each claim directly (see [`populate`]):
/// about `sqrt(M / 2)`, where k modular products cost as much as walking M / k steps.
fn direct_threshold(m: u32) -> u32 {
    ((f64::from(m) / 2.0).sqrt() as u32).max(1)
}

/// Fills `table` (M slots, all EMPTY) from `servers` as described in the module doc.
///
/// Each claim walks the server's preference list from where it stopped to the first
/// free slot. Near the end that walk is long (about M / k steps with k slots left, so
/// the last round costs most of the build); once at most `direct_below` slots are
/// free, the claim is computed instead: the free slot whose position in the list is
/// the nearest at or after the walk's current position, the same slot the walk would
/// reach (positions wrap at M, and every slot passed before is taken for good).
fn populate(servers: &[RealServer], table: &mut [u32], direct_below: u32) {
    let m = table.len() as u32;
    let mut order: Vec<((u128, u16), u32)> = servers
        .iter()
        .enumerate()
        .filter(|(_, s)| s.accepts_new())
        .map(|(i, s)| (identity(s), i as u32))
        .collect();
    if order.is_empty() {
        return;
    }
    order.sort_unstable();
    let weight = |i: u32| servers[i as usize].weight;
    let g = order.iter().fold(0, |g, &(_, i)| gcd(weight(i), g));
    let largest = order.iter().map(|&(_, i)| weight(i) / g).max().unwrap_or(1);
    let bits = (32 - (m - 1).leading_zeros()) / 2; // ceil(log2 M) / 2
    let shift = (32 - largest.leading_zeros()).saturating_sub(bits);
    let mut preferences: Vec<Preference> = order
        .iter()
        .map(|&(_, index)| {
            let server = &servers[index as usize];
            let id = word(fold_address(server.ip), server.port);
            let offset = siphash13(H1_KEY, id) as u32 % m;
            let skip = siphash13(H2_KEY, id) as u32 % (m - 1).max(1) + 1;
            Preference {
                index,
                offset,
                skip,
                skip_inverse: if m > 1 { inverse_mod(skip % m, m) } else { 0 },
                next: offset,
                turns: ((weight(index) / g) >> shift).max(1),
            }
        })
        .collect();

    // Slot occupancy, one bit per slot (M / 8 bytes: stays in L1 while probing).
    let mut taken = vec![0u64; table.len().div_ceil(64)];
    let is_taken = |taken: &[u64], slot: u32| taken[(slot / 64) as usize] & (1 << (slot % 64)) != 0;
    // Whose claim it is: server `server` in the sorted order, its `turn`-th this round.
    let (mut server, mut turn) = (0usize, 0u32);
    let mut filled = 0u32;
    // The free slots, listed when the direct phase starts.
    let mut free: Vec<u32> = Vec::new();
    let modulo = Barrett::new(m);
    while filled < m {
        let p = &mut preferences[server];
        let slot = if m - filled > direct_below {
            walk(p, &taken, m)
        } else {
            if free.is_empty() {
                free = (0..m).filter(|&slot| !is_taken(&taken, slot)).collect();
            }
            free.swap_remove(nearest_free(p, &free, m, modulo))
        };
        p.next = slot;
        taken[(slot / 64) as usize] |= 1 << (slot % 64);
        table[slot as usize] = p.index;
        filled += 1;
        turn += 1;
        if turn >= p.turns {
            turn = 0;
            server = if server + 1 == preferences.len() {
                0
            } else {
                server + 1
            };
        }
    }
}

/// The first free slot on `p`'s walk, walking. (Testing several candidates per
/// branch was measured slower: the walk is bound by the slot arithmetic, not by
/// mispredicted loop exits alone.)
#[inline]
fn walk(p: &Preference, taken: &[u64], m: u32) -> u32 {
    let mut slot = p.next;
    while (taken[(slot / 64) as usize] >> (slot % 64)) & 1 != 0 {
        slot += p.skip;
        if slot >= m {
            slot -= m;
        }
    }
    slot
}

/// Index in `free` of the first free slot on `p`'s walk, computed from the positions
/// of the free slots rather than by walking (for when few are left).
fn nearest_free(p: &Preference, free: &[u32], m: u32, modulo: Barrett) -> usize {
    let current = p.position(p.next, m, modulo);
    let mut best = (u32::MAX, 0usize);
    for (i, &slot) in free.iter().enumerate() {
        let position = p.position(slot, m, modulo);
        let ahead = if position >= current {
            position - current
        } else {
            position + m - current
        };
        if ahead < best.0 {
            best = (ahead, i);
        }
    }
    best.1
}

/// Maglev state: the lookup table and the flags.
#[derive(Clone, Debug)]
pub struct Maglev {
    /// Slot → index into the servers slice (EMPTY without servers).
    table: Vec<u32>,
    modulo: FastMod,
    port: bool,
    fallback: bool,
}

impl Maglev {
    /// The table of `table_size` slots (a prime, [`check_table_size`]) for `servers`;
    /// `flags.mh_port` and `flags.mh_fallback` apply.
    pub fn new(servers: &[RealServer], table_size: u32, flags: SchedFlags) -> Result<Self, String> {
        check_table_size(table_size)?;
        let mut table = vec![EMPTY; table_size as usize];
        populate(servers, &mut table, direct_threshold(table_size));
        Ok(Maglev {
            table,
            modulo: FastMod::new(table_size),
            port: flags.mh_port,
            fallback: flags.mh_fallback,
        })
    }

    /// The bytes a table of `table_size` slots allocates (its slot array; the rest is
    /// a few words).
    pub fn bytes_for(table_size: u32) -> usize {
        table_size as usize * std::mem::size_of::<u32>()
    }

    /// Slot → server index (`u32::MAX` for an unowned slot), for tests and diagnostics.
    pub fn table(&self) -> &[u32] {
        &self.table
    }

    /// M.
    pub fn table_size(&self) -> u32 {
        self.table.len() as u32
    }

    /// The slot a connection hashes to.
    #[inline]
    pub fn slot_of(&self, ctx: &PickContext) -> usize {
        let port = if self.port { ctx.client_port } else { 0 };
        self.slot_of_word(word(ctx.client, port))
    }

    #[inline]
    fn slot_of_word(&self, word: u64) -> usize {
        self.modulo.rem(siphash13(H1_KEY, word) as u32) as usize
    }

    /// The kernel's fallback walk from `slot`, for a stale table.
    #[cold]
    fn fallback(&self, servers: &[RealServer], ctx: &PickContext, slot: usize) -> Option<usize> {
        if !servers.iter().any(RealServer::accepts_new) {
            return None;
        }
        let port = if self.port { ctx.client_port } else { 0 };
        let client = word(ctx.client, port);
        let m = self.table.len();
        for offset in 0..m {
            let rehash = ((offset + slot) % m) as u64;
            let index = self.table[self.slot_of_word(client.wrapping_add(rehash))];
            if index == EMPTY {
                return None;
            }
            if available(servers, index as usize) {
                return Some(index as usize);
            }
        }
        None
    }
}

impl Scheduler for Maglev {
    fn kind(&self) -> SchedulerKind {
        SchedulerKind::Mh
    }

    fn pick(&mut self, servers: &[RealServer], ctx: &PickContext) -> Option<usize> {
        self.choose(servers, ctx)
    }
}

/// A table shared with the service snapshot it was built for: every worker picks from
/// the snapshot's one copy. A Maglev table has no per-worker state (a pick only
/// reads it), and copying it would cost each worker a copy of every `mh` service's
/// table (256 KiB at the default size) on every snapshot it adopts.
impl Scheduler for std::sync::Arc<Maglev> {
    fn kind(&self) -> SchedulerKind {
        SchedulerKind::Mh
    }

    fn pick(&mut self, servers: &[RealServer], ctx: &PickContext) -> Option<usize> {
        self.choose(servers, ctx)
    }
}

impl Maglev {
    /// The server for a new connection: its slot's owner, or with `mh-fallback` the
    /// kernel's walk past an unavailable one.
    pub fn choose(&self, servers: &[RealServer], ctx: &PickContext) -> Option<usize> {
        let slot = self.slot_of(ctx);
        let index = self.table[slot];
        if index == EMPTY {
            return None;
        }
        if available(servers, index as usize) {
            return Some(index as usize);
        }
        if self.fallback {
            self.fallback(servers, ctx, slot)
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::rng::Rng;
    use crate::sched::test_support::*;

    /// `n` servers 10.h.l.1:80 with `weight`.
    fn many(n: usize, weight: u32) -> Vec<RealServer> {
        (0..n)
            .map(|i| server([10, (i >> 8) as u8, i as u8, 1], 80, weight))
            .collect()
    }

    fn maglev(servers: &[RealServer], size: u32, flags: &str) -> Maglev {
        Maglev::new(servers, size, flags.parse().unwrap()).unwrap()
    }

    fn slot_counts(table: &Maglev, n: usize) -> Vec<usize> {
        let mut counts = vec![0; n];
        for &s in table.table() {
            counts[s as usize] += 1;
        }
        counts
    }

    /// Slot → owner identity (address, port).
    fn owners(table: &Maglev, servers: &[RealServer]) -> Vec<(Ipv4Addr, u16)> {
        table
            .table()
            .iter()
            .map(|&i| (servers[i as usize].ipv4(), servers[i as usize].port))
            .collect()
    }

    #[test]
    fn table_size_must_be_prime() {
        for bad in [0, 1, 4, 9, 65535, 65536, 4_294_967_291] {
            assert!(
                Maglev::new(&many(2, 1), bad, SchedFlags::default()).is_err(),
                "{bad}"
            );
        }
        let err = check_table_size(65536).unwrap_err();
        assert!(err.contains("not prime"), "{err}");
        for good in [2, 3, 251, 4093, 65521, 65537, 131071] {
            assert_eq!(check_table_size(good), Ok(()), "{good}");
        }
        let primes: Vec<u32> = (0..30).filter(|&n| is_prime(n)).collect();
        assert_eq!(primes, vec![2, 3, 5, 7, 11, 13, 17, 19, 23, 29]);
        assert!(is_prime(4_294_967_291) && !is_prime(4_294_967_295));
    }

    #[test]
    fn siphash_matches_std_siphash_2_4_and_1_3_differs() {
        // std's SipHasher is SipHash-2-4: same rounds, same finalisation.
        #[allow(deprecated)]
        fn reference(k0: u64, k1: u64, message: u64) -> u64 {
            use std::hash::Hasher;
            let mut hasher = std::hash::SipHasher::new_with_keys(k0, k1);
            hasher.write(&message.to_le_bytes());
            hasher.finish()
        }
        let mut rng = Rng::new(1);
        for _ in 0..1000 {
            let (k0, k1, m) = (rng.next_u64(), rng.next_u64(), rng.next_u64());
            assert_eq!(siphash_word::<2, 4>(k0, k1, m), reference(k0, k1, m));
            assert_ne!(siphash_word::<1, 3>(k0, k1, m), reference(k0, k1, m));
        }
        assert_eq!(
            siphash13(H1_KEY, 42),
            siphash_word::<1, 3>(H1_KEY, H1_KEY, 42)
        );
    }

    #[test]
    fn fast_modulo_is_exact() {
        let mut rng = Rng::new(2);
        for d in [2, 3, 251, 65537, 65536, 1 << 24, u32::MAX] {
            let fast = FastMod::new(d);
            for a in [0, 1, d - 1, d, d.wrapping_add(1), u32::MAX] {
                assert_eq!(fast.rem(a), a % d, "{a} mod {d}");
            }
            for _ in 0..10_000 {
                let a = rng.next_u64() as u32;
                assert_eq!(fast.rem(a), a % d, "{a} mod {d}");
            }
        }
    }

    #[test]
    fn barrett_and_inverse_are_exact() {
        let mut rng = Rng::new(3);
        for m in [2, 3, 7, 4093, 65537, 16_777_213] {
            let barrett = Barrett::new(m);
            for _ in 0..10_000 {
                let x = rng.next_u64() >> (rng.below(64) as u32);
                assert_eq!(u64::from(barrett.rem(x)), x % u64::from(m), "{x} mod {m}");
            }
            assert_eq!(u64::from(barrett.rem(u64::MAX)), u64::MAX % u64::from(m));
            for a in [1, 2, m - 1, (m / 3).max(1)].into_iter().filter(|&a| a < m) {
                let inv = inverse_mod(a, m);
                assert_eq!(
                    u64::from(a) * u64::from(inv) % u64::from(m),
                    1 % u64::from(m)
                );
            }
        }
    }

    #[test]
    fn the_direct_end_phase_builds_the_same_table_as_walking() {
        let cases: Vec<(Vec<RealServer>, u32)> = vec![
            (many(1000, 1), 65537),
            (many(100, 1), 65537),
            (servers(&[1, 2, 3, 4]), 4093),
            (servers(&[5, 0, 3, 1000, 7]), 65537),
            (many(5, 1), 7),
            (many(1, 3), 251),
        ];
        for (servers, m) in cases {
            let mut walked = vec![EMPTY; m as usize];
            populate(&servers, &mut walked, 0);
            // Up to a whole small table in the direct phase (quadratic: not for 65537).
            for threshold in [direct_threshold(m), 1, 2000.min(m)] {
                let mut direct = vec![EMPTY; m as usize];
                populate(&servers, &mut direct, threshold);
                assert!(
                    walked == direct,
                    "{} servers, M = {m}, {threshold}",
                    servers.len()
                );
            }
        }
    }

    #[test]
    fn equal_weights_get_slot_counts_within_1_percent_of_fair() {
        for n in [100, 1000] {
            let servers = many(n, 1);
            let table = maglev(&servers, 65537, "");
            let fair = 65537.0 / n as f64;
            let counts = slot_counts(&table, n);
            for (i, &c) in counts.iter().enumerate() {
                assert!(
                    (c as f64 - fair).abs() / fair < 0.01,
                    "n={n} server {i}: {c} slots, fair {fair}"
                );
            }
        }
    }

    #[test]
    fn removing_one_of_100_moves_only_its_slots_and_under_1_percent_of_the_rest() {
        let servers = many(100, 1);
        let before = maglev(&servers, 65537, "");
        let removed = 37;
        let mut fewer = servers.clone();
        fewer.remove(removed);
        let after = maglev(&fewer, 65537, "");
        let (old, new) = (owners(&before, &servers), owners(&after, &fewer));
        let gone = (servers[removed].ipv4(), servers[removed].port);
        let others = old.iter().filter(|&&o| o != gone).count();
        let moved = old
            .iter()
            .zip(&new)
            .filter(|(o, n)| **o != gone && o != n)
            .count();
        assert!(!new.contains(&gone));
        assert!(
            (moved as f64) < 0.01 * others as f64,
            "{moved} of {others} other slots moved"
        );
    }

    #[test]
    fn the_table_does_not_depend_on_insertion_order() {
        let servers: Vec<RealServer> = (0..300)
            .map(|i| {
                // Addresses and ports in no particular order, weights 1..=4.
                let x = (i as u32).wrapping_mul(2_654_435_761);
                server(
                    [10, (x >> 24) as u8, (x >> 16) as u8, i as u8],
                    8000 + (i % 7) as u16,
                    1 + (i % 4) as u32,
                )
            })
            .collect();
        let reference = maglev(&servers, 65537, "");
        let expected = owners(&reference, &servers);
        let mut rng = Rng::new(5);
        for _ in 0..3 {
            let mut shuffled = servers.clone();
            for i in (1..shuffled.len()).rev() {
                let j = rng.below(i as u64 + 1) as usize;
                shuffled.swap(i, j);
            }
            assert_ne!(shuffled, servers);
            let table = maglev(&shuffled, 65537, "");
            assert_eq!(owners(&table, &shuffled), expected);
        }
    }

    #[test]
    fn weighted_servers_get_slots_in_proportion() {
        let weights = [1, 2, 3, 4];
        let servers = servers(&weights);
        let table = maglev(&servers, 65537, "");
        let counts = slot_counts(&table, 4);
        assert!(
            worst_relative_error(&counts, &weights) < 0.001,
            "{counts:?}"
        );
        // Only the ratios matter: weights 10:20:30:40 give the same table.
        let scaled = servers_with(&servers, &[10, 20, 30, 40]);
        assert_eq!(maglev(&scaled, 65537, "").table(), table.table());
    }

    fn servers_with(servers: &[RealServer], weights: &[u32]) -> Vec<RealServer> {
        servers
            .iter()
            .zip(weights)
            .map(|(s, &w)| RealServer {
                weight: w,
                ..s.clone()
            })
            .collect()
    }

    #[test]
    fn weight_ratios_beyond_255_are_compressed_as_in_ipvs() {
        // 1:1000 -> largest weight/gcd = 1000 needs 10 bits, 8 allowed at M = 65537:
        // shift 2, turns 1 and 250.
        let servers = servers(&[1, 1000]);
        let counts = slot_counts(&maglev(&servers, 65537, ""), 2);
        let ratio = counts[1] as f64 / counts[0] as f64;
        assert!((ratio - 250.0).abs() < 1.0, "{counts:?}");
    }

    #[test]
    fn draining_servers_get_no_slots() {
        let servers = servers(&[1, 0, 1, 0]);
        let counts = slot_counts(&maglev(&servers, 65537, ""), 4);
        assert_eq!((counts[1], counts[3]), (0, 0));
        assert_eq!(counts[0] + counts[2], 65537);
    }

    #[test]
    fn one_million_distinct_tuples_match_the_weights_within_1_percent() {
        let weights = [1, 2, 3, 4];
        let servers = servers(&weights);
        let mut mh = maglev(&servers, 65537, "mh-port");
        let mut hits = vec![0usize; 4];
        for i in 0..1_000_000 {
            let (addr, port) = client(i);
            hits[mh.pick(&servers, &ctx_from(addr, port)).unwrap()] += 1;
        }
        let err = worst_relative_error(&hits, &weights);
        assert!(err < 0.01, "{hits:?} {err}");
    }

    #[test]
    fn same_client_same_server_across_picks_and_rebuilds() {
        let servers = many(50, 1);
        let mut a = maglev(&servers, 65537, "");
        let mut b = maglev(&servers, 65537, "");
        for i in 0..5000 {
            let (addr, port) = client(i);
            let pick = a.pick(&servers, &ctx_from(addr, port));
            assert!(pick.is_some());
            // Without mh-port the port does not matter.
            assert_eq!(a.pick(&servers, &ctx_from(addr, port ^ 0x5555)), pick);
            assert_eq!(b.pick(&servers, &ctx_from(addr, port)), pick);
        }
    }

    #[test]
    fn mh_port_spreads_one_address_over_servers() {
        let servers = many(8, 1);
        let mut mh = maglev(&servers, 65537, "mh-port");
        let addr = Ipv4Addr::new(203, 0, 113, 9);
        let mut seen = vec![false; 8];
        for port in 1024..1424 {
            let pick = mh.pick(&servers, &ctx_from(addr, port)).unwrap();
            assert_eq!(mh.pick(&servers, &ctx_from(addr, port)), Some(pick));
            seen[pick] = true;
        }
        assert!(seen.iter().all(|&s| s), "{seen:?}");
    }

    #[test]
    fn mh_fallback_only_acts_on_a_stale_table() {
        let mut servers = many(5, 1);
        let mut plain = maglev(&servers, 4093, "");
        let mut fallback = maglev(&servers, 4093, "mh-fallback");
        // Drained without a rebuild: the tables still give server 2 its slots.
        servers[2].weight = 0;
        let mut refused = 0;
        for i in 0..20_000 {
            let (addr, port) = client(i);
            let ctx = ctx_from(addr, port);
            let with = fallback.pick(&servers, &ctx);
            assert!(with.is_some() && with != Some(2));
            match plain.pick(&servers, &ctx) {
                None => refused += 1,
                // Clients of the other servers stay where they were.
                Some(kept) => assert_eq!(with, Some(kept)),
            }
        }
        assert!((3_500..4_500).contains(&refused), "{refused}");
        // After the rebuild server 2 has no slots: no refusals, flag or not.
        let mut rebuilt = maglev(&servers, 4093, "");
        for i in 0..20_000 {
            let (addr, port) = client(i);
            let pick = rebuilt.pick(&servers, &ctx_from(addr, port));
            assert!(pick.is_some() && pick != Some(2));
        }
    }

    #[test]
    fn small_and_odd_tables() {
        // M = 2 and more servers than slots: every slot owned, no panic.
        let servers = many(5, 1);
        let mut tiny = maglev(&servers, 2, "");
        assert!(tiny.table().iter().all(|&s| s < 5));
        assert!(tiny.pick(&servers, &ctx()).is_some());
        let mut small = maglev(&servers, 7, "");
        assert_eq!(slot_counts(&small, 5).iter().sum::<usize>(), 7);
        assert!(small.pick(&servers, &ctx()).is_some());
    }

    #[test]
    fn none_when_empty_or_all_draining() {
        for flags in ["", "mh-fallback"] {
            let mut mh = maglev(&[], 65537, flags);
            assert_eq!(mh.pick(&[], &ctx()), None);
            let drained = servers(&[0, 0]);
            let mut mh = maglev(&drained, 65537, flags);
            assert!(mh.table().iter().all(|&s| s == EMPTY));
            assert_eq!(mh.pick(&drained, &ctx()), None);
        }
    }
}
