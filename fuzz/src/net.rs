//! The Internet checksum (RFC 1071), written here rather than taken from the crate:
//! the targets check the crate's rewrites against it.
use std::net::Ipv4Addr;

/// The 32-bit one's-complement accumulation of `data` as big-endian 16-bit words (an
/// odd last byte padded with zero).
pub fn sum(data: &[u8]) -> u64 {
    let mut total = 0u64;
    let mut words = data.chunks_exact(2);
    for w in &mut words {
        total += u64::from(u16::from_be_bytes([w[0], w[1]]));
    }
    if let [last] = words.remainder() {
        total += u64::from(*last) << 8;
    }
    total
}

/// Folds a sum into 16 bits and complements it: the value a checksum field holds.
pub fn finish(mut total: u64) -> u16 {
    while total > 0xffff {
        total = (total & 0xffff) + (total >> 16);
    }
    !(total as u16)
}

/// Whether `data`, checksum field included, sums to all ones.
pub fn verifies(total: u64) -> bool {
    finish(total) == 0
}

/// The TCP/UDP pseudo-header's contribution.
pub fn pseudo(src: Ipv4Addr, dst: Ipv4Addr, protocol: u8, len: usize) -> u64 {
    sum(&src.octets()) + sum(&dst.octets()) + u64::from(protocol) + len as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rfc1071_example_and_an_ipv4_header() {
        // RFC 1071 section 3: 00 01 f2 03 f4 f5 f6 f7 sums to ddf2.
        assert_eq!(
            finish(sum(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7])),
            !0xddf2
        );
        // A real IPv4 header (checksum b1e6) verifies; one flipped bit does not.
        let mut h = [
            0x45, 0x00, 0x00, 0x3c, 0x1c, 0x46, 0x40, 0x00, 0x40, 0x06, 0xb1, 0xe6, 0xac, 0x10,
            0x0a, 0x63, 0xac, 0x10, 0x0a, 0x0c,
        ];
        assert!(verifies(sum(&h)));
        h[5] ^= 1;
        assert!(!verifies(sum(&h)));
    }
}
