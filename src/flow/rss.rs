//! Receive-side scaling in software: the Toeplitz hash NICs compute over a packet's
//! tuple, and the redirection table (RETA) that maps the hash to an RX queue.
//!
//! Sluice needs the NIC's decision *before* a packet exists: FullNAT picks a local port
//! whose reply will hash to the worker that owns the session
//! ([`crate::forward::laddr`]), and the loopback port layer spreads packets over
//! queues as a NIC would. Both must compute exactly what the hardware computes, so this
//! module is verified against the Microsoft RSS verification vectors and, in
//! `tests/toeplitz_softrss.rs`, against DPDK's own `rte_softrss`.
//!
//! # The hash
//!
//! The input is the tuple in network byte order, fields in this order (Microsoft's
//! specification, followed by every NIC and by `rte_softrss`):
//!
//! | input | bytes |
//! |-------|-------|
//! | IPv4 ([`HashFields::L3`], `RTE_ETH_RSS_IPV4`) | source address, destination address (8) |
//! | IPv4 + TCP/UDP ([`HashFields::L3L4`], `RTE_ETH_RSS_NONFRAG_IPV4_TCP/UDP`) | source address, destination address, source port, destination port (12) |
//! | IPv6 ([`HashFields::L3`], `RTE_ETH_RSS_IPV6`) | source address, destination address (32) |
//! | IPv6 + TCP/UDP ([`HashFields::L3L4`], `RTE_ETH_RSS_NONFRAG_IPV6_TCP/UDP`) | source address, destination address, source port, destination port (36) |
//!
//! For every input bit set, counting from the most significant bit of the first byte,
//! the 32 key bits starting at the same bit position are XORed into the result. The
//! hash is therefore *linear*: `hash(a ^ b) == hash(a) ^ hash(b)`, and the contribution
//! of each input byte is independent of the others. [`Toeplitz`] precomputes, for
//! every input byte position and every byte value, that byte's contribution, so a
//! hash is one table load and XOR per input byte (12 for IPv4 with ports), no bit
//! loop. The tables cover 36 input bytes (IPv6 with ports, the longest standard
//! tuple): 36 KiB per key.
//!
//! # Keys
//!
//! - [`DEFAULT_RSS_KEY`]: the 40-byte key of the Microsoft specification, the default
//!   of many drivers (ixgbe, i40e, ...), and the key of the published verification
//!   vectors.
//! - [`SYMMETRIC_RSS_KEY`]: `0x6d5a` repeated. Its 32-bit windows repeat every 16
//!   bits, so swapping the two addresses (a 32-bit shift of their bits) and the two
//!   ports (a 16-bit shift) does not change the hash: `hash(a, b, p, q) ==
//!   hash(b, a, q, p)`. Both directions of a connection land on one queue (Woo and
//!   Park, "Scalable TCP Session Monitoring with Symmetric Receive-side Scaling").
//!
//! A key of 40 or 52 bytes (i40e, ice) is accepted; inputs never exceed 36 bytes.
//!
//! # The redirection table
//!
//! [`Reta`] maps a hash to a queue the way NICs do: the low bits of the hash index a
//! table of queue numbers (`hash & (size - 1)`; every NIC's table size is a power of
//! two: 64, 128, 512, 2048). For other sizes, which no NIC uses, the index is
//! `hash % size`.

use core::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

use crate::flow::{FlowKey4, FlowKey6};

/// The Microsoft RSS verification key, the default key of most NIC drivers.
pub const DEFAULT_RSS_KEY: [u8; 40] = [
    0x6d, 0x5a, 0x56, 0xda, 0x25, 0x5b, 0x0e, 0xc2, 0x41, 0x67, 0x25, 0x3d, 0x43, 0xa3, 0x8f, 0xb0,
    0xd0, 0xca, 0x2b, 0xcb, 0xae, 0x7b, 0x30, 0xb4, 0x77, 0xcb, 0x2d, 0xa3, 0x80, 0x30, 0xf2, 0x0c,
    0x6a, 0x42, 0xb7, 0x3b, 0xbe, 0xac, 0x01, 0xfa,
];

/// A symmetric key: `0x6d5a` repeated, so that `hash(a, b, p, q) == hash(b, a, q, p)`
/// and both directions of a flow hash alike (see the module doc).
pub const SYMMETRIC_RSS_KEY: [u8; 40] = {
    let mut key = [0u8; 40];
    let mut i = 0;
    while i < 40 {
        key[i] = if i % 2 == 0 { 0x6d } else { 0x5a };
        i += 1;
    }
    key
};

/// Longest input the tables cover: IPv6 source and destination plus two ports.
pub const MAX_INPUT_LEN: usize = 36;
/// Key lengths NICs use: 40 bytes (most), 52 bytes (Intel i40e and ice).
pub const KEY_LENGTHS: [usize; 2] = [40, 52];
/// Longest key accepted.
pub const MAX_KEY_LEN: usize = 52;

/// Which tuple fields the NIC feeds to the hash for a packet type. Sluice configures
/// IPv4 TCP and UDP with [`HashFields::L3L4`]; a NIC that cannot hash ports hashes
/// with [`HashFields::L3`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HashFields {
    /// Source and destination address (`RTE_ETH_RSS_IPV4`).
    L3,
    /// Addresses, then source and destination port (`RTE_ETH_RSS_NONFRAG_IPV4_TCP`,
    /// `RTE_ETH_RSS_NONFRAG_IPV4_UDP`).
    L3L4,
}

/// Why an RSS key or table was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RssError {
    /// The key is not 40 or 52 bytes long.
    KeyLength(usize),
    /// The table has no entry.
    EmptyTable,
    /// The table is longer than 65 536 entries (no NIC has one).
    TableTooLarge(usize),
    /// Zero queues to spread over.
    NoQueues,
}

impl fmt::Display for RssError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RssError::KeyLength(len) => write!(f, "RSS key of {len} bytes (expected 40 or 52)"),
            RssError::EmptyTable => f.write_str("empty RSS redirection table"),
            RssError::TableTooLarge(len) => {
                write!(f, "RSS redirection table of {len} entries (at most 65536)")
            }
            RssError::NoQueues => f.write_str("RSS over zero queues"),
        }
    }
}

impl std::error::Error for RssError {}

/// Per input byte position, per byte value: that byte's contribution to the hash.
type ByteTables = [[u32; 256]; MAX_INPUT_LEN];

/// A Toeplitz hasher for one key, with its lookup tables precomputed.
#[derive(Clone)]
pub struct Toeplitz {
    key: [u8; MAX_KEY_LEN],
    key_len: usize,
    tables: Box<ByteTables>,
}

impl fmt::Debug for Toeplitz {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Toeplitz")
            .field("key", &self.key())
            .finish_non_exhaustive()
    }
}

impl Toeplitz {
    /// Builds the tables for `key` (40 or 52 bytes).
    pub fn new(key: &[u8]) -> Result<Toeplitz, RssError> {
        if !KEY_LENGTHS.contains(&key.len()) {
            return Err(RssError::KeyLength(key.len()));
        }
        let mut padded = [0u8; MAX_KEY_LEN];
        padded[..key.len()].copy_from_slice(key);

        // The 32 key bits starting at bit `bit` (bit 0 = MSB of key byte 0). Bits past
        // the key read as 0; with a 40-byte key and 36 input bytes none is needed.
        let window = |bit: usize| -> u32 {
            let byte = bit / 8;
            let mut wide = [0u8; 8];
            for (i, slot) in wide.iter_mut().enumerate() {
                *slot = padded.get(byte + i).copied().unwrap_or(0);
            }
            ((u64::from_be_bytes(wide) << (bit % 8)) >> 32) as u32
        };

        let mut tables: Box<ByteTables> = Box::new([[0u32; 256]; MAX_INPUT_LEN]);
        for (position, table) in tables.iter_mut().enumerate() {
            // The contribution of each single bit of this byte, MSB first.
            let bits: [u32; 8] = core::array::from_fn(|b| window(position * 8 + b));
            for (value, entry) in table.iter_mut().enumerate() {
                *entry = (0..8)
                    .filter(|b| value & (0x80 >> b) != 0)
                    .fold(0, |acc, b| acc ^ bits[b]);
            }
        }
        Ok(Toeplitz {
            key: padded,
            key_len: key.len(),
            tables,
        })
    }

    /// The key, as programmed into the NIC.
    pub fn key(&self) -> &[u8] {
        &self.key[..self.key_len]
    }

    /// Hash of an arbitrary input (network byte order), or `None` past
    /// [`MAX_INPUT_LEN`] bytes.
    #[inline]
    pub fn hash_bytes(&self, input: &[u8]) -> Option<u32> {
        if input.len() > MAX_INPUT_LEN {
            return None;
        }
        Some(
            input
                .iter()
                .zip(self.tables.iter())
                .fold(0, |acc, (&byte, table)| acc ^ table[byte as usize]),
        )
    }

    /// Hash of a fixed-size input; `N <= MAX_INPUT_LEN` is checked at compile time.
    #[inline(always)]
    fn hash_array<const N: usize>(&self, input: [u8; N]) -> u32 {
        const { assert!(N <= MAX_INPUT_LEN) };
        let mut hash = 0;
        for (position, byte) in input.into_iter().enumerate() {
            hash ^= self.tables[position][byte as usize];
        }
        hash
    }

    /// The IPv4 hash without ports ([`HashFields::L3`]).
    #[inline]
    pub fn hash_ipv4(&self, src: Ipv4Addr, dst: Ipv4Addr) -> u32 {
        let ([s0, s1, s2, s3], [d0, d1, d2, d3]) = (src.octets(), dst.octets());
        self.hash_array([s0, s1, s2, s3, d0, d1, d2, d3])
    }

    /// The IPv4 hash with ports ([`HashFields::L3L4`]).
    #[inline]
    pub fn hash_ipv4_ports(&self, src: Ipv4Addr, dst: Ipv4Addr, sport: u16, dport: u16) -> u32 {
        let ([s0, s1, s2, s3], [d0, d1, d2, d3]) = (src.octets(), dst.octets());
        let ([p0, p1], [q0, q1]) = (sport.to_be_bytes(), dport.to_be_bytes());
        self.hash_array([s0, s1, s2, s3, d0, d1, d2, d3, p0, p1, q0, q1])
    }

    /// The hash of `src:sport -> dst:dport` over `fields`.
    #[inline]
    pub fn hash_tuple(
        &self,
        fields: HashFields,
        src: Ipv4Addr,
        dst: Ipv4Addr,
        sport: u16,
        dport: u16,
    ) -> u32 {
        match fields {
            HashFields::L3 => self.hash_ipv4(src, dst),
            HashFields::L3L4 => self.hash_ipv4_ports(src, dst, sport, dport),
        }
    }

    /// The IPv6 hash without ports ([`HashFields::L3`]).
    #[inline]
    pub fn hash_ipv6(&self, src: Ipv6Addr, dst: Ipv6Addr) -> u32 {
        let mut input = [0u8; 32];
        input[..16].copy_from_slice(&src.octets());
        input[16..].copy_from_slice(&dst.octets());
        self.hash_array(input)
    }

    /// The IPv6 hash with ports ([`HashFields::L3L4`]): 36 input bytes.
    #[inline]
    pub fn hash_ipv6_ports(&self, src: Ipv6Addr, dst: Ipv6Addr, sport: u16, dport: u16) -> u32 {
        let mut input = [0u8; MAX_INPUT_LEN];
        input[..16].copy_from_slice(&src.octets());
        input[16..32].copy_from_slice(&dst.octets());
        input[32..34].copy_from_slice(&sport.to_be_bytes());
        input[34..].copy_from_slice(&dport.to_be_bytes());
        self.hash_array(input)
    }

    /// The hash of IPv6 `src:sport -> dst:dport` over `fields`.
    #[inline]
    pub fn hash_tuple6(
        &self,
        fields: HashFields,
        src: Ipv6Addr,
        dst: Ipv6Addr,
        sport: u16,
        dport: u16,
    ) -> u32 {
        match fields {
            HashFields::L3 => self.hash_ipv6(src, dst),
            HashFields::L3L4 => self.hash_ipv6_ports(src, dst, sport, dport),
        }
    }

    /// The hash of an IPv6 flow key over `fields`.
    #[inline]
    pub fn hash_key6(&self, fields: HashFields, key: &FlowKey6) -> u32 {
        self.hash_tuple6(fields, key.src, key.dst, key.sport, key.dport)
    }

    /// The hash of a flow key, with its ports ([`HashFields::L3L4`]).
    #[inline]
    pub fn hash_key(&self, key: &FlowKey4) -> u32 {
        self.hash_ipv4_ports(key.src_addr(), key.dst_addr(), key.sport, key.dport)
    }

    /// Contribution of input byte `position` holding `value`; by linearity the hash is
    /// the XOR of its bytes' contributions. `None` past [`MAX_INPUT_LEN`].
    #[inline]
    pub fn byte_contribution(&self, position: usize, value: u8) -> Option<u32> {
        Some(self.tables.get(position)?[value as usize])
    }
}

/// An RSS redirection table: entry `i` is the RX queue of hashes whose index is `i`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reta {
    entries: Vec<u16>,
    /// `size - 1` when the size is a power of two (index by mask), else `None`.
    mask: Option<u32>,
}

impl Reta {
    /// The drivers' default table: entry `i` is queue `i % queues`.
    pub fn new_round_robin(size: usize, queues: u16) -> Result<Reta, RssError> {
        if queues == 0 {
            return Err(RssError::NoQueues);
        }
        Reta::from_entries((0..size).map(|i| (i % queues as usize) as u16).collect())
    }

    /// A table with these entries (as read back from the NIC, or weighted).
    pub fn from_entries(entries: Vec<u16>) -> Result<Reta, RssError> {
        if entries.is_empty() {
            return Err(RssError::EmptyTable);
        }
        if entries.len() > 1 << 16 {
            return Err(RssError::TableTooLarge(entries.len()));
        }
        let mask = entries
            .len()
            .is_power_of_two()
            .then(|| entries.len() as u32 - 1);
        Ok(Reta { entries, mask })
    }

    pub fn size(&self) -> usize {
        self.entries.len()
    }

    pub fn entries(&self) -> &[u16] {
        &self.entries
    }

    /// Index into the table for `hash`: its low bits, as the NIC takes them.
    #[inline]
    pub fn index(&self, hash: u32) -> usize {
        match self.mask {
            Some(mask) => (hash & mask) as usize,
            None => (hash % self.entries.len() as u32) as usize,
        }
    }

    /// The queue a packet with this hash is received on.
    #[inline]
    pub fn queue(&self, hash: u32) -> u16 {
        // `index` is below the length by construction; `get` keeps the path panic-free.
        self.entries.get(self.index(hash)).copied().unwrap_or(0)
    }

    /// Whether any entry sends packets to `queue`.
    pub fn serves(&self, queue: u16) -> bool {
        self.entries.contains(&queue)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::FlowKey;
    use crate::model::Protocol;
    use crate::wire::test_util::XorShift;

    /// One IPv4 verification vector: the tuple, then the hash over the addresses and
    /// over addresses and ports.
    type Vector = ([u8; 4], u16, [u8; 4], u16, u32, u32);

    /// The IPv4 verification vectors of Microsoft's RSS specification ("Verifying the
    /// RSS Hash Calculation"): source, source port, destination, destination port,
    /// hash over addresses, hash over addresses and ports.
    const MICROSOFT_IPV4: [Vector; 5] = [
        (
            [66, 9, 149, 187],
            2794,
            [161, 142, 100, 80],
            1766,
            0x323e8fc2,
            0x51ccc178,
        ),
        (
            [199, 92, 111, 2],
            14230,
            [65, 69, 140, 83],
            4739,
            0xd718262a,
            0xc626b0ea,
        ),
        (
            [24, 19, 198, 95],
            12898,
            [12, 22, 207, 184],
            38024,
            0xd2d0a5de,
            0x5c2b394a,
        ),
        (
            [38, 27, 205, 30],
            48228,
            [209, 142, 163, 6],
            2217,
            0x82989176,
            0xafc7327f,
        ),
        (
            [153, 39, 163, 191],
            44251,
            [202, 188, 127, 2],
            1303,
            0x5d1809c5,
            0x10e828a2,
        ),
    ];

    /// One IPv6 verification vector: source, source port, destination, destination
    /// port, hash over the addresses, hash over addresses and ports.
    type Vector6 = (&'static str, u16, &'static str, u16, u32, u32);

    /// The IPv6 verification vectors of the same specification.
    const MICROSOFT_IPV6: [Vector6; 3] = [
        (
            "3ffe:2501:200:1fff::7",
            2794,
            "3ffe:2501:200:3::1",
            1766,
            0x2cc18cd5,
            0x40207d3d,
        ),
        (
            "3ffe:501:8::260:97ff:fe40:efab",
            14230,
            "ff02::1",
            4739,
            0x0f0c461c,
            0xdde51bbf,
        ),
        (
            "3ffe:1900:4545:3:200:f8ff:fe21:67cf",
            44251,
            "fe80::200:f8ff:fe21:67cf",
            38024,
            0x4b61e985,
            0x02d1feef,
        ),
    ];

    /// Bit-by-bit reference, straight from the specification's pseudo-code.
    fn reference(key: &[u8], input: &[u8]) -> u32 {
        let key_bit = |i: usize| -> u32 {
            key.get(i / 8)
                .map_or(0, |byte| ((byte >> (7 - i % 8)) & 1) as u32)
        };
        let mut result = 0;
        for i in 0..input.len() * 8 {
            if (input[i / 8] >> (7 - i % 8)) & 1 == 1 {
                result ^= (0..32).fold(0u32, |w, b| (w << 1) | key_bit(i + b));
            }
        }
        result
    }

    #[test]
    fn microsoft_ipv4_vectors() {
        let toeplitz = Toeplitz::new(&DEFAULT_RSS_KEY).unwrap();
        for (src, sport, dst, dport, l3, l3l4) in MICROSOFT_IPV4 {
            let (src, dst) = (Ipv4Addr::from(src), Ipv4Addr::from(dst));
            assert_eq!(toeplitz.hash_ipv4(src, dst), l3, "{src} -> {dst}");
            assert_eq!(
                toeplitz.hash_ipv4_ports(src, dst, sport, dport),
                l3l4,
                "{src}:{sport} -> {dst}:{dport}"
            );
            let key = FlowKey4::new(Protocol::Tcp, src, sport, dst, dport);
            assert_eq!(toeplitz.hash_key(&key), l3l4);
            assert_eq!(
                toeplitz.hash_tuple(HashFields::L3, src, dst, sport, dport),
                l3
            );
            assert_eq!(
                toeplitz.hash_tuple(HashFields::L3L4, src, dst, sport, dport),
                l3l4
            );
            let mut bytes = [0u8; 12];
            bytes[..4].copy_from_slice(&src.octets());
            bytes[4..8].copy_from_slice(&dst.octets());
            bytes[8..10].copy_from_slice(&sport.to_be_bytes());
            bytes[10..].copy_from_slice(&dport.to_be_bytes());
            assert_eq!(toeplitz.hash_bytes(&bytes[..8]), Some(l3));
            assert_eq!(toeplitz.hash_bytes(&bytes), Some(l3l4));
            assert_eq!(reference(&DEFAULT_RSS_KEY, &bytes), l3l4);
        }
    }

    #[test]
    fn microsoft_ipv6_vectors() {
        let toeplitz = Toeplitz::new(&DEFAULT_RSS_KEY).unwrap();
        for (src, sport, dst, dport, l3, l3l4) in MICROSOFT_IPV6 {
            let (src, dst): (Ipv6Addr, Ipv6Addr) = (src.parse().unwrap(), dst.parse().unwrap());
            assert_eq!(toeplitz.hash_ipv6(src, dst), l3, "{src} -> {dst}");
            assert_eq!(
                toeplitz.hash_ipv6_ports(src, dst, sport, dport),
                l3l4,
                "[{src}]:{sport} -> [{dst}]:{dport}"
            );
            let key = FlowKey6 {
                src,
                dst,
                sport,
                dport,
                proto: Protocol::Tcp,
            };
            assert_eq!(toeplitz.hash_key6(HashFields::L3L4, &key), l3l4);
            assert_eq!(toeplitz.hash_key6(HashFields::L3, &key), l3);
            let mut bytes = [0u8; 36];
            bytes[..16].copy_from_slice(&src.octets());
            bytes[16..32].copy_from_slice(&dst.octets());
            bytes[32..34].copy_from_slice(&sport.to_be_bytes());
            bytes[34..].copy_from_slice(&dport.to_be_bytes());
            assert_eq!(reference(&DEFAULT_RSS_KEY, &bytes), l3l4);
            // The local port's share of the hash stands apart (forward::laddr's split).
            let split = toeplitz.hash_ipv6_ports(src, dst, sport, 0)
                ^ toeplitz.byte_contribution(34, bytes[34]).unwrap()
                ^ toeplitz.byte_contribution(35, bytes[35]).unwrap();
            assert_eq!(split, l3l4);
        }
    }

    #[test]
    fn tables_match_the_bitwise_reference() {
        let mut rng = XorShift(0x5eed_0f7e_0b11_7200);
        let mut long_key = [0u8; 52];
        rng.fill(&mut long_key);
        for key in [&DEFAULT_RSS_KEY[..], &SYMMETRIC_RSS_KEY[..], &long_key[..]] {
            let toeplitz = Toeplitz::new(key).unwrap();
            assert_eq!(toeplitz.key(), key);
            let mut input = [0u8; MAX_INPUT_LEN];
            for _ in 0..2000 {
                let len = rng.below(MAX_INPUT_LEN + 1);
                rng.fill(&mut input[..len]);
                assert_eq!(
                    toeplitz.hash_bytes(&input[..len]),
                    Some(reference(key, &input[..len]))
                );
            }
        }
    }

    #[test]
    fn hash_is_linear_per_byte() {
        // What forward::laddr relies on: the hash of a tuple is the XOR of its bytes'
        // contributions, so the local port's part can be computed on its own.
        let toeplitz = Toeplitz::new(&DEFAULT_RSS_KEY).unwrap();
        let mut rng = XorShift(99);
        for _ in 0..1000 {
            let (a, b) = (rng.next_u64() as u32, rng.next_u64() as u32);
            let (p, q) = (rng.next_u64() as u16, rng.next_u64() as u16);
            let whole = toeplitz.hash_ipv4_ports(a.into(), b.into(), p, q);
            let parts = toeplitz.hash_ipv4_ports(a.into(), b.into(), p, 0)
                ^ toeplitz.hash_ipv4_ports(0.into(), 0.into(), 0, q);
            assert_eq!(whole, parts);
            let by_byte = q
                .to_be_bytes()
                .iter()
                .enumerate()
                .map(|(i, &v)| toeplitz.byte_contribution(10 + i, v).unwrap())
                .fold(
                    toeplitz.hash_ipv4_ports(a.into(), b.into(), p, 0),
                    |h, c| h ^ c,
                );
            assert_eq!(whole, by_byte);
        }
        assert_eq!(toeplitz.byte_contribution(MAX_INPUT_LEN, 1), None);
    }

    #[test]
    fn symmetric_key_hashes_both_directions_alike() {
        let toeplitz = Toeplitz::new(&SYMMETRIC_RSS_KEY).unwrap();
        assert_eq!(&SYMMETRIC_RSS_KEY[..4], &[0x6d, 0x5a, 0x6d, 0x5a]);
        let mut rng = XorShift(0x1234);
        for _ in 0..10_000 {
            let a = Ipv4Addr::from(rng.next_u64() as u32);
            let b = Ipv4Addr::from(rng.next_u64() as u32);
            let (p, q) = (rng.next_u64() as u16, rng.next_u64() as u16);
            assert_eq!(
                toeplitz.hash_ipv4_ports(a, b, p, q),
                toeplitz.hash_ipv4_ports(b, a, q, p)
            );
            assert_eq!(toeplitz.hash_ipv4(a, b), toeplitz.hash_ipv4(b, a));
            let key = FlowKey4::new(Protocol::Udp, a, p, b, q);
            assert_eq!(toeplitz.hash_key(&key), toeplitz.hash_key(&key.reversed()));
        }
        // The default key is not symmetric (first vector, reversed).
        let default = Toeplitz::new(&DEFAULT_RSS_KEY).unwrap();
        let (a, b) = (
            Ipv4Addr::new(66, 9, 149, 187),
            Ipv4Addr::new(161, 142, 100, 80),
        );
        assert_ne!(
            default.hash_ipv4_ports(a, b, 2794, 1766),
            default.hash_ipv4_ports(b, a, 1766, 2794)
        );
    }

    #[test]
    fn key_lengths() {
        assert!(Toeplitz::new(&[0u8; 52]).is_ok());
        for len in [0, 4, 39, 41, 51, 53, 64] {
            assert_eq!(
                Toeplitz::new(&vec![0u8; len]).unwrap_err(),
                RssError::KeyLength(len)
            );
        }
        let toeplitz = Toeplitz::new(&DEFAULT_RSS_KEY).unwrap();
        assert_eq!(toeplitz.hash_bytes(&[1u8; MAX_INPUT_LEN + 1]), None);
        assert_eq!(toeplitz.hash_bytes(&[]), Some(0));
        assert!(format!("{toeplitz:?}").contains("109, 90"));
    }

    #[test]
    fn reta_round_robin_and_indexing() {
        let reta = Reta::new_round_robin(128, 3).unwrap();
        assert_eq!(reta.size(), 128);
        assert_eq!(&reta.entries()[..7], &[0, 1, 2, 0, 1, 2, 0]);
        // Power of two: the low 7 bits of the hash.
        assert_eq!(reta.index(0xffff_ff85), 5);
        assert_eq!(reta.queue(0xffff_ff85), 2);
        assert_eq!(reta.queue(128 + 4), 1);
        assert!(reta.serves(2) && !reta.serves(3));
        // Other sizes: modulo.
        let odd = Reta::new_round_robin(12, 4).unwrap();
        assert_eq!(odd.index(25), 1);
        assert_eq!(odd.queue(27), 3);
        // The queue of every hash is one of the table's.
        let mut rng = XorShift(5);
        let mut seen = [0usize; 3];
        for _ in 0..30_000 {
            seen[reta.queue(rng.next_u64() as u32) as usize] += 1;
        }
        assert!(seen.iter().all(|&n| n > 9000), "{seen:?}");
    }

    #[test]
    fn reta_errors() {
        assert_eq!(Reta::new_round_robin(128, 0), Err(RssError::NoQueues));
        assert_eq!(Reta::new_round_robin(0, 4), Err(RssError::EmptyTable));
        assert_eq!(
            Reta::from_entries(vec![0; (1 << 16) + 1]),
            Err(RssError::TableTooLarge((1 << 16) + 1))
        );
        assert!(Reta::from_entries(vec![7]).is_ok());
        assert!(RssError::KeyLength(3).to_string().contains("40 or 52"));
    }

    #[test]
    fn fuzz_never_panics() {
        let toeplitz = Toeplitz::new(&DEFAULT_RSS_KEY).unwrap();
        let retas = [
            Reta::new_round_robin(128, 4).unwrap(),
            Reta::new_round_robin(7, 3).unwrap(),
            Reta::from_entries(vec![9]).unwrap(),
        ];
        let mut rng = XorShift(0xfeed);
        let mut input = [0u8; 64];
        for _ in 0..20_000 {
            let len = rng.below(input.len() + 1);
            rng.fill(&mut input[..len]);
            let hash = toeplitz
                .hash_bytes(&input[..len])
                .unwrap_or(rng.next_u64() as u32);
            for reta in &retas {
                let queue = reta.queue(hash);
                assert!(reta.entries().contains(&queue));
            }
        }
    }
}
