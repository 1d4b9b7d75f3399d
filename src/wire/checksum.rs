//! The Internet checksum (RFC 1071) and its incremental update (RFC 1624).
//!
//! A *partial sum* is a `u32` holding a one's-complement sum already folded to 16 bits,
//! so partial sums of several slices (pseudo-header, header, payload) can be added with
//! plain `+` and folded again; a `u32` holds 65 536 of them without overflow. Each slice
//! is summed as if it started at an even offset of the message, so only the last slice
//! of a message may have odd length.

use std::net::{Ipv4Addr, Ipv6Addr};

/// One's-complement sum of `data` as big-endian 16-bit words, folded to 16 bits.
/// An odd trailing byte is padded with a zero byte, as RFC 1071 prescribes.
#[inline]
pub fn sum(data: &[u8]) -> u32 {
    // Wide words with end-around carry: eight bytes per addition instead of two. The
    // 16-bit lanes stay aligned because every word starts at an even offset, and
    // 2^16 = 1 (mod 2^16 - 1) makes folding wide lanes equal to summing narrow ones.
    let mut acc: u64 = 0;
    let mut words = data.chunks_exact(8);
    for word in &mut words {
        let word = u64::from_be_bytes([
            word[0], word[1], word[2], word[3], word[4], word[5], word[6], word[7],
        ]);
        let (added, carry) = acc.overflowing_add(word);
        acc = added + carry as u64;
    }
    let mut rest = words.remainder();
    // The remainder is under 8 bytes, so adding its pieces to a u64 cannot overflow
    // after folding `acc` to 32 bits first.
    let mut acc = fold_u64_to_u32(acc) as u64;
    if rest.len() >= 4 {
        acc += u32::from_be_bytes([rest[0], rest[1], rest[2], rest[3]]) as u64;
        rest = &rest[4..];
    }
    if rest.len() >= 2 {
        acc += u16::from_be_bytes([rest[0], rest[1]]) as u64;
        rest = &rest[2..];
    }
    if let Some(&last) = rest.first() {
        acc += (last as u64) << 8;
    }
    fold(fold_u64_to_u32(acc)) as u32
}

#[inline(always)]
fn fold_u64_to_u32(acc: u64) -> u32 {
    let (folded, carry) = (acc as u32).overflowing_add((acc >> 32) as u32);
    folded + carry as u32
}

/// Folds carries into the low 16 bits (end-around carry).
#[inline(always)]
pub fn fold(mut sum: u32) -> u16 {
    sum = (sum & 0xffff) + (sum >> 16);
    sum = (sum & 0xffff) + (sum >> 16);
    sum as u16
}

/// The checksum field value for a message whose partial sums add up to `sum`.
#[inline(always)]
pub fn finish(sum: u32) -> u16 {
    !fold(sum)
}

/// Partial sum of the IPv4 pseudo-header used by TCP and UDP checksums (RFC 793/768):
/// source, destination, zero, protocol, and the L4 length (header plus data).
#[inline]
pub fn pseudo_header_sum(src: Ipv4Addr, dst: Ipv4Addr, protocol: u8, l4_len: u16) -> u32 {
    let [s0, s1, s2, s3] = src.octets();
    let [d0, d1, d2, d3] = dst.octets();
    let words = [
        u16::from_be_bytes([s0, s1]),
        u16::from_be_bytes([s2, s3]),
        u16::from_be_bytes([d0, d1]),
        u16::from_be_bytes([d2, d3]),
        protocol as u16,
        l4_len,
    ];
    fold(words.iter().map(|&w| w as u32).sum()) as u32
}

/// Partial sum of the IPv6 pseudo-header (RFC 8200 section 8.1) used by TCP, UDP and
/// ICMPv6: source, destination, the 32-bit upper-layer length, three zero bytes and
/// the next header. `src` and `dst` are those the upper layer sees: with a routing
/// header, `dst` is the final destination.
#[inline]
pub fn pseudo_header_sum_v6(src: Ipv6Addr, dst: Ipv6Addr, next_header: u8, l4_len: u32) -> u32 {
    let mut acc = address_sum_v6(src) + address_sum_v6(dst);
    acc += l4_len >> 16;
    acc += l4_len & 0xffff;
    acc += next_header as u32;
    fold(acc) as u32
}

/// Sum of the eight 16-bit words of an IPv6 address, not folded (at most 8 * 0xffff).
#[inline(always)]
fn address_sum_v6(addr: Ipv6Addr) -> u32 {
    addr.segments().iter().map(|&w| w as u32).sum()
}

/// New checksum after a 16-bit word of the message changed from `old` to `new`,
/// RFC 1624 equation 3: `HC' = ~(~HC + ~m + m')`.
#[inline(always)]
pub fn update16(checksum: u16, old: u16, new: u16) -> u16 {
    !fold(!checksum as u32 + !old as u32 + new as u32)
}

/// New checksum after an aligned 32-bit field (an IPv4 address, a TCP sequence number)
/// changed from `old` to `new`: the same equation applied to both halves at once.
#[inline(always)]
pub fn update32(checksum: u16, old: u32, new: u32) -> u16 {
    let sum = !checksum as u32 + (!old >> 16) + (!old & 0xffff) + (new >> 16) + (new & 0xffff);
    !fold(sum)
}

/// Several fields' changes to one checksum, summed first and folded once (RFC 1624
/// equation 3 over all of them): a NAT rewrite changes an address and a port under
/// the same L4 checksum. The result is the one the updates one by one give, but for
/// the same representation of zero they may each choose.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Delta(u64);

impl Delta {
    /// A 16-bit field (a port) changed from `old` to `new`.
    #[inline(always)]
    pub fn field16(self, old: u16, new: u16) -> Delta {
        Delta(self.0 + u64::from(!old) + u64::from(new))
    }

    /// An aligned 32-bit field (an IPv4 address) changed from `old` to `new`.
    #[inline(always)]
    pub fn field32(self, old: u32, new: u32) -> Delta {
        let old = !old;
        Delta(
            self.0
                + u64::from(old >> 16)
                + u64::from(old & 0xffff)
                + u64::from(new >> 16)
                + u64::from(new & 0xffff),
        )
    }

    /// `checksum` with every change added.
    #[inline(always)]
    pub fn apply(self, checksum: u16) -> u16 {
        !fold(fold_u64_to_u32(self.0 + u64::from(!checksum)))
    }
}

/// [`sum`] of a 20-byte header (IPv4 without options, TCP without options) as five
/// 32-bit words: the common case of the checksum checked on every packet.
#[inline(always)]
pub fn sum20(data: &[u8; 20]) -> u32 {
    let word = |at: usize| {
        u64::from(u32::from_be_bytes([
            data[at],
            data[at + 1],
            data[at + 2],
            data[at + 3],
        ]))
    };
    let acc = word(0) + word(4) + word(8) + word(12) + word(16);
    fold(fold_u64_to_u32(acc)) as u32
}

/// New checksum after an IPv6 address (in the pseudo-header, or quoted in an ICMPv6
/// error) changed from `old` to `new`: RFC 1624 equation 3 over its eight words at
/// once. Like the 16- and 32-bit updates it may yield 0x0000 where a full recompute
/// gives 0xffff (a message summing to +0); TCP and ICMPv6 verify either way, and UDP
/// writers map 0 to 0xffff.
#[inline(always)]
pub fn update128(checksum: u16, old: Ipv6Addr, new: Ipv6Addr) -> u16 {
    let old_sum = fold(address_sum_v6(old));
    !fold(!checksum as u32 + !old_sum as u32 + address_sum_v6(new))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::test_util::XorShift;

    #[test]
    fn a_delta_of_several_fields_equals_the_updates_one_by_one_and_a_recompute() {
        let mut rng = XorShift(0x5eed_c0de);
        for _ in 0..2000 {
            let mut header = [0u8; 20];
            rng.fill(&mut header);
            header[10..12].copy_from_slice(&[0, 0]);
            let before = finish(sum(&header));
            let (old_addr, old_port) = (
                u32::from_be_bytes(header[12..16].try_into().unwrap()),
                u16::from_be_bytes([header[16], header[17]]),
            );
            let (new_addr, new_port) = (rng.next_u64() as u32, rng.next_u64() as u16);
            header[12..16].copy_from_slice(&new_addr.to_be_bytes());
            header[16..18].copy_from_slice(&new_port.to_be_bytes());
            let recomputed = finish(sum(&header));
            let delta = Delta::default()
                .field32(old_addr, new_addr)
                .field16(old_port, new_port)
                .apply(before);
            let one_by_one = update16(update32(before, old_addr, new_addr), old_port, new_port);
            // Zero has two representations; a recompute gives 0xffff only for +0.
            let same = |a: u16, b: u16| a == b || (a | b == 0xffff && (a == 0 || b == 0));
            assert!(same(delta, recomputed), "{delta:#x} vs {recomputed:#x}");
            assert!(same(delta, one_by_one), "{delta:#x} vs {one_by_one:#x}");
        }
    }

    #[test]
    fn sum20_equals_sum() {
        let mut rng = XorShift(20);
        for _ in 0..1000 {
            let mut header = [0u8; 20];
            rng.fill(&mut header);
            assert_eq!(sum20(&header), sum(&header));
        }
        assert_eq!(sum20(&[0xff; 20]), sum(&[0xff; 20]));
    }

    /// Straightforward two-bytes-at-a-time reference from RFC 1071 section 4.1.
    fn reference_sum(data: &[u8]) -> u16 {
        let mut acc: u32 = 0;
        let mut pairs = data.chunks_exact(2);
        for pair in &mut pairs {
            acc += u16::from_be_bytes([pair[0], pair[1]]) as u32;
        }
        if let Some(&last) = pairs.remainder().first() {
            acc += (last as u32) << 8;
        }
        while acc >> 16 != 0 {
            acc = (acc & 0xffff) + (acc >> 16);
        }
        acc as u16
    }

    #[test]
    fn rfc1071_example() {
        // RFC 1071 section 3: the words 0001 f203 f4f5 f6f7 sum to ddf2 (checksum 220d).
        let data = [0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7];
        assert_eq!(fold(sum(&data)), 0xddf2);
        assert_eq!(finish(sum(&data)), 0x220d);
    }

    #[test]
    fn ipv4_header_vector() {
        // A classic header whose checksum is b861 (Wikipedia's worked example).
        let mut header = [
            0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0x00, 0x00, 0xc0, 0xa8,
            0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7,
        ];
        assert_eq!(finish(sum(&header)), 0xb861);
        header[10] = 0xb8;
        header[11] = 0x61;
        assert_eq!(
            fold(sum(&header)),
            0xffff,
            "a valid header sums to all ones"
        );
    }

    #[test]
    fn odd_lengths_and_empty() {
        assert_eq!(sum(&[]), 0);
        assert_eq!(sum(&[0xab]), 0xab00);
        assert_eq!(sum(&[0x12, 0x34, 0x56]), 0x1234 + 0x5600);
        assert_eq!(sum(&[0xff; 7]), reference_sum(&[0xff; 7]) as u32);
    }

    #[test]
    fn wide_sum_matches_reference_for_random_slices() {
        let mut rng = XorShift(0x2545_f491_4f6c_dd1d);
        let mut buf = [0u8; 1600];
        for _ in 0..2000 {
            let len = rng.below(buf.len() + 1);
            rng.fill(&mut buf[..len]);
            assert_eq!(
                fold(sum(&buf[..len])),
                reference_sum(&buf[..len]),
                "len {len}"
            );
        }
        // All ones exercises every carry path.
        assert_eq!(fold(sum(&[0xff; 1500])), reference_sum(&[0xff; 1500]));
    }

    #[test]
    fn partial_sums_concatenate_at_even_offsets() {
        let data: Vec<u8> = (0..=255u8).cycle().take(1001).collect();
        let whole = finish(sum(&data));
        let split = finish(sum(&data[..300]) + sum(&data[300..]));
        assert_eq!(whole, split);
    }

    #[test]
    fn pseudo_header_matches_byte_layout() {
        let src = Ipv4Addr::new(10, 0, 0, 1);
        let dst = Ipv4Addr::new(192, 168, 255, 254);
        let bytes = [10, 0, 0, 1, 192, 168, 255, 254, 0, 6, 0x05, 0xdc];
        assert_eq!(pseudo_header_sum(src, dst, 6, 1500), sum(&bytes));
    }

    #[test]
    fn ipv6_pseudo_header_matches_byte_layout() {
        let src: Ipv6Addr = "2001:db8::1".parse().unwrap();
        let dst: Ipv6Addr = "fe80::ffff:ffff:ffff:fffe".parse().unwrap();
        let mut bytes = [0u8; 40];
        bytes[..16].copy_from_slice(&src.octets());
        bytes[16..32].copy_from_slice(&dst.octets());
        // A length above 64 KiB exercises the upper half of the 32-bit length field.
        bytes[32..36].copy_from_slice(&0x0001_05dcu32.to_be_bytes());
        bytes[39] = 58;
        assert_eq!(pseudo_header_sum_v6(src, dst, 58, 0x0001_05dc), sum(&bytes));
        let all_ones = Ipv6Addr::from([0xff; 16]);
        let mut ones = [0xffu8; 40];
        ones[32..].copy_from_slice(&[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0xff]);
        assert_eq!(
            pseudo_header_sum_v6(all_ones, all_ones, 0xff, u32::MAX),
            sum(&ones)
        );
    }

    #[test]
    fn ipv6_address_update_equals_full_recompute() {
        let mut rng = XorShift(0x1234_5678_9abc_def1);
        // Checksum at 10..12 as in `fill`; an IPv6 address at 16..32 stands for the
        // pseudo-header's (or a quoted packet's) address.
        let mut msg = [0u8; 48];
        for _ in 0..20_000 {
            rng.fill(&mut msg);
            msg[0] |= 1;
            let before = fill(&mut msg);
            let old = Ipv6Addr::from(<[u8; 16]>::try_from(&msg[16..32]).unwrap());
            let mut new = [0u8; 16];
            rng.fill(&mut new);
            if rng.next_u64() & 1 == 0 {
                // Prefix-only change, as when NAT64 or a v6 rewrite keeps the suffix.
                new[8..].copy_from_slice(&old.octets()[8..]);
            }
            let new = Ipv6Addr::from(new);
            msg[16..32].copy_from_slice(&new.octets());
            assert_eq!(update128(before, old, new), fill(&mut msg));
        }
    }

    /// Writes a checksum over `msg` into bytes 10..12 (an IPv4-header-like layout).
    fn fill(msg: &mut [u8]) -> u16 {
        msg[10] = 0;
        msg[11] = 0;
        let c = finish(sum(msg));
        msg[10..12].copy_from_slice(&c.to_be_bytes());
        c
    }

    #[test]
    fn incremental_update_equals_full_recompute() {
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
        let mut msg = [0u8; 40];
        for _ in 0..20_000 {
            rng.fill(&mut msg);
            msg[0] |= 1; // never all zeros: that one message has a distinct 0xffff form
            let before = fill(&mut msg);

            if rng.next_u64() & 1 == 0 {
                // A 16-bit word anywhere but the checksum itself.
                let at = 12 + 2 * rng.below(14);
                let old = u16::from_be_bytes([msg[at], msg[at + 1]]);
                let new = rng.next_u64() as u16;
                msg[at..at + 2].copy_from_slice(&new.to_be_bytes());
                assert_eq!(update16(before, old, new), fill(&mut msg));
            } else {
                let at = 12 + 4 * rng.below(7);
                let old = u32::from_be_bytes([msg[at], msg[at + 1], msg[at + 2], msg[at + 3]]);
                let new = rng.next_u64() as u32;
                msg[at..at + 4].copy_from_slice(&new.to_be_bytes());
                assert_eq!(update32(before, old, new), fill(&mut msg));
            }
        }
    }

    #[test]
    fn incremental_update_rfc1624_corner() {
        // RFC 1624 section 3: with eqn 3 a header whose sum becomes -0 must still yield
        // checksum 0x0000, not 0xffff, matching what a full recompute produces.
        let mut msg = [0u8; 12];
        msg[0] = 0xff;
        msg[1] = 0xfe; // words sum to 0xfffe -> checksum 0x0001
        let before = fill(&mut msg);
        assert_eq!(before, 0x0001);
        // Changing 0x0000 at offset 2 to 0x0001 makes the sum 0xffff.
        msg[3] = 1;
        let full = fill(&mut msg);
        assert_eq!(full, 0x0000);
        assert_eq!(update16(before, 0x0000, 0x0001), full);
    }
}
