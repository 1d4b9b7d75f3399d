//! The software Toeplitz hash (`sluice::flow::rss`) against DPDK's own `rte_softrss`
//! over 10 000 random IPv4 tuples and 10 000 random IPv6 tuples, with and without
//! ports. `rte_softrss` is a pure function (no EAL needed).
//!
//! Its contract (`rte_thash.h`): the tuple is an array of host-order `u32` words
//! (source address, destination address, then `sport << 16 | dport`, as
//! `struct rte_ipv4_tuple` holds them after the caller's byte swaps), `input_len`
//! counts words, and the key is read as 32-bit words, one past the last input word, so
//! it must be 4-byte aligned and at least `4 * (input_len + 1)` bytes long. An IPv6
//! tuple (`struct rte_ipv6_tuple`, as `rte_thash_load_v6_addrs` fills it) is each
//! address as four host-order words, then the ports' word: 9 words, 8 without ports.
use std::net::{Ipv4Addr, Ipv6Addr};

use sluice::flow::rss::{Toeplitz, DEFAULT_RSS_KEY, SYMMETRIC_RSS_KEY};

/// The key as `rte_softrss` reads it: through a `const uint32_t *`.
#[repr(C, align(4))]
struct AlignedKey([u8; 40]);

/// xorshift64: deterministic tuples without a random-number crate.
struct XorShift(u64);

impl XorShift {
    fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.0 = x;
        x
    }
}

fn softrss(words: &mut [u32], key: &AlignedKey) -> u32 {
    // SAFETY: `words` is valid for `words.len()` u32s; the key is 40 aligned bytes,
    // the 4 * (9 + 1) the longest input (IPv6 with ports) reads. rte_softrss only
    // reads.
    unsafe { dpdk_sys::rte_softrss(words.as_mut_ptr(), words.len() as u32, key.0.as_ptr()) }
}

fn compare(key_bytes: [u8; 40], seed: u64) {
    let key = AlignedKey(key_bytes);
    let toeplitz = Toeplitz::new(&key.0).unwrap();
    let mut rng = XorShift(seed);
    for i in 0..10_000 {
        let (src, dst) = (rng.next_u64() as u32, rng.next_u64() as u32);
        let (sport, dport) = (rng.next_u64() as u16, rng.next_u64() as u16);
        let (src_ip, dst_ip) = (Ipv4Addr::from(src), Ipv4Addr::from(dst));

        let mut with_ports = [src, dst, (sport as u32) << 16 | dport as u32];
        assert_eq!(
            toeplitz.hash_ipv4_ports(src_ip, dst_ip, sport, dport),
            softrss(&mut with_ports, &key),
            "tuple {i}: {src_ip}:{sport} -> {dst_ip}:{dport}"
        );
        let mut addresses = [src, dst];
        assert_eq!(
            toeplitz.hash_ipv4(src_ip, dst_ip),
            softrss(&mut addresses, &key),
            "tuple {i}: {src_ip} -> {dst_ip}"
        );
    }
}

/// An IPv6 address as `rte_thash_load_v6_addrs` loads it: four host-order words.
fn v6_words(a: Ipv6Addr) -> [u32; 4] {
    let o = a.octets();
    core::array::from_fn(|i| {
        u32::from_be_bytes([o[4 * i], o[4 * i + 1], o[4 * i + 2], o[4 * i + 3]])
    })
}

fn compare_v6(key_bytes: [u8; 40], seed: u64) {
    let key = AlignedKey(key_bytes);
    let toeplitz = Toeplitz::new(&key.0).unwrap();
    let mut rng = XorShift(seed);
    for i in 0..10_000 {
        let src = Ipv6Addr::from(u128::from(rng.next_u64()) << 64 | u128::from(rng.next_u64()));
        let dst = Ipv6Addr::from(u128::from(rng.next_u64()) << 64 | u128::from(rng.next_u64()));
        let (sport, dport) = (rng.next_u64() as u16, rng.next_u64() as u16);
        let mut words = [0u32; 9];
        words[..4].copy_from_slice(&v6_words(src));
        words[4..8].copy_from_slice(&v6_words(dst));
        words[8] = (sport as u32) << 16 | dport as u32;
        assert_eq!(
            toeplitz.hash_ipv6_ports(src, dst, sport, dport),
            softrss(&mut words, &key),
            "tuple {i}: [{src}]:{sport} -> [{dst}]:{dport}"
        );
        assert_eq!(
            toeplitz.hash_ipv6(src, dst),
            softrss(&mut words[..8], &key),
            "tuple {i}: {src} -> {dst}"
        );
    }
}

#[test]
fn default_key_equals_rte_softrss_over_ipv6() {
    compare_v6(DEFAULT_RSS_KEY, 0x853c_49e6_748f_ea9b);
}

#[test]
fn symmetric_key_equals_rte_softrss_over_ipv6() {
    compare_v6(SYMMETRIC_RSS_KEY, 0xda3e_39cb_94b9_5bdb);
}

#[test]
fn rte_softrss_reproduces_the_first_microsoft_ipv6_vector() {
    // 3ffe:2501:200:1fff::7 port 2794 -> 3ffe:2501:200:3::1 port 1766.
    let key = AlignedKey(DEFAULT_RSS_KEY);
    let src: Ipv6Addr = "3ffe:2501:200:1fff::7".parse().unwrap();
    let dst: Ipv6Addr = "3ffe:2501:200:3::1".parse().unwrap();
    let mut words = [0u32; 9];
    words[..4].copy_from_slice(&v6_words(src));
    words[4..8].copy_from_slice(&v6_words(dst));
    words[8] = 2794 << 16 | 1766;
    assert_eq!(softrss(&mut words, &key), 0x40207d3d);
    assert_eq!(softrss(&mut words[..8], &key), 0x2cc18cd5);
}

#[test]
fn default_key_equals_rte_softrss() {
    compare(DEFAULT_RSS_KEY, 0x9e37_79b9_7f4a_7c15);
}

#[test]
fn symmetric_key_equals_rte_softrss() {
    compare(SYMMETRIC_RSS_KEY, 0x2545_f491_4f6c_dd1d);
}

#[test]
fn rte_softrss_reproduces_the_first_microsoft_vector() {
    // Proves the word layout above: 66.9.149.187:2794 -> 161.142.100.80:1766.
    let key = AlignedKey(DEFAULT_RSS_KEY);
    let src = u32::from(Ipv4Addr::new(66, 9, 149, 187));
    let dst = u32::from(Ipv4Addr::new(161, 142, 100, 80));
    assert_eq!(
        softrss(&mut [src, dst, 2794 << 16 | 1766], &key),
        0x51ccc178
    );
    assert_eq!(softrss(&mut [src, dst], &key), 0x323e8fc2);
}
