//! IP-in-IP tunnelling (`ipvsadm -i`, RFC 2003, IPv4 protocol 4): the client's packet
//! travels unchanged inside an outer IPv4 header from Sluice to the real server, which
//! decapsulates it on an `ipip` device holding the VIP and replies to the client
//! directly.
//!
//! The outer header is 20 bytes without options: TTL 64; the TOS byte (DSCP and ECN)
//! copied from the inner header (RFC 2003 section 3.1, RFC 6040 normal mode); DF set
//! when the inner header has it (RFC 2003: "MUST"); the identification chosen by the
//! caller (any per-worker counter). No fragmentation: a packet that no longer fits the
//! MTU is dropped, and if it has DF the client learns a smaller path MTU from an ICMP
//! frag-needed ([`check_mtu`], then [`super::icmp::frag_needed`]).

use core::ops::Range;
use std::net::Ipv4Addr;

use crate::flow::parse::Parsed;
use crate::model::DropReason;
use crate::wire::ethernet::{self, EtherType, MacAddr};
use crate::wire::{ipv4, IpProtocol, WireError};

/// Bytes the outer header adds, and the headroom [`encapsulate`] expects in front.
pub const OUTER_HEADER_LEN: usize = ipv4::MIN_HEADER_LEN;
/// TTL of the outer header.
pub const OUTER_TTL: u8 = ipv4::DEFAULT_TTL;

/// Length of the outer IPv4 packet carrying an inner packet of `inner_ip_len` bytes.
pub const fn encapsulated_len(inner_ip_len: usize) -> usize {
    inner_ip_len + OUTER_HEADER_LEN
}

/// Whether a packet still fits once encapsulated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MtuCheck {
    /// Encapsulate and send.
    Fits,
    /// Too big and DF set: drop it (`TooBig`) and answer the client with
    /// [`super::icmp::frag_needed`] quoting `next_hop_mtu`, the largest inner packet
    /// that fits.
    FragNeeded { next_hop_mtu: u16 },
    /// Too big without DF: Sluice does not fragment, so drop it (`TooBig`).
    TooBig,
}

/// Checks `parsed`'s packet against `mtu`, the largest IPv4 packet the link towards
/// the real server carries (1500 on plain Ethernet). A `Parsed` whose IPv4 header
/// cannot be read counts as without DF.
pub fn check_mtu(frame: &[u8], parsed: &Parsed, mtu: u16) -> MtuCheck {
    if encapsulated_len(parsed.ip_total_len as usize) <= mtu as usize {
        return MtuCheck::Fits;
    }
    if super::ip_packet(frame, parsed).is_some_and(|ip| ip.dont_frag()) {
        MtuCheck::FragNeeded {
            next_hop_mtu: mtu.saturating_sub(OUTER_HEADER_LEN as u16),
        }
    } else {
        MtuCheck::TooBig
    }
}

/// Encapsulates in place. `buf` holds [`OUTER_HEADER_LEN`] bytes of headroom (the data
/// plane prepends them to the mbuf), then the received frame whose L2 header (VLAN
/// tags included) is `l2_len` bytes long. The L2 header moves to the front, the outer
/// IPv4 header follows it, the inner packet stays where it is, and the MACs become
/// `dst_mac` (the real server or next hop) and `src_mac` (ours). Returns the new frame
/// length: `l2_len + 20 + inner total length`, Ethernet padding of the received frame
/// excluded.
///
/// Errors, with `buf` unmodified: `Truncated` when the headroom or the frame is short
/// or `l2_len` is not where the L2 header ends; `UnknownEthertype` when the frame is
/// not IPv4; `BadIpv4Header` for an inconsistent inner header; `TooBig` when the outer
/// packet would exceed 65 535 bytes. The caller checks the MTU first ([`check_mtu`]).
pub fn encapsulate(
    buf: &mut [u8],
    l2_len: usize,
    outer_src: Ipv4Addr,
    outer_dst: Ipv4Addr,
    dst_mac: MacAddr,
    src_mac: MacAddr,
    ident: u16,
) -> Result<usize, DropReason> {
    let frame = buf.get(OUTER_HEADER_LEN..).ok_or(DropReason::Truncated)?;
    let l2 = ethernet::parse_l2(frame).map_err(|_| DropReason::Truncated)?;
    if l2.ethertype != EtherType::IPV4 {
        return Err(DropReason::UnknownEthertype);
    }
    if l2.l3_offset != l2_len {
        return Err(DropReason::Truncated);
    }
    let inner = ipv4::Packet::new_checked(&frame[l2_len..]).map_err(|err| match err {
        WireError::Truncated if frame.len() - l2_len < ipv4::MIN_HEADER_LEN => {
            DropReason::Truncated
        }
        _ => DropReason::BadIpv4Header,
    })?;
    let (dscp, ecn, dont_frag) = (inner.dscp(), inner.ecn(), inner.dont_frag());
    let outer_len = encapsulated_len(inner.total_len() as usize);
    let outer_total = u16::try_from(outer_len).map_err(|_| DropReason::TooBig)?;

    buf.copy_within(OUTER_HEADER_LEN..OUTER_HEADER_LEN + l2_len, 0);
    let (l2_header, rest) = buf.split_at_mut(l2_len);
    let mut outer = ipv4::Packet::new_unchecked(&mut rest[..OUTER_HEADER_LEN]);
    outer.set_version_and_header_len(OUTER_HEADER_LEN);
    outer.set_dscp_ecn(dscp, ecn);
    outer.set_total_len(outer_total);
    outer.set_ident(ident);
    outer.set_fragmentation(dont_frag, false, 0);
    outer.set_ttl(OUTER_TTL);
    outer.set_protocol(IpProtocol::IPIP);
    outer.set_src_addr(outer_src);
    outer.set_dst_addr(outer_dst);
    outer.fill_checksum();
    let mut eth = ethernet::Frame::new_unchecked(l2_header);
    eth.set_dst_addr(dst_mac);
    eth.set_src_addr(src_mac);
    Ok(l2_len + outer_len)
}

/// The reverse of [`encapsulate`], for a user-space real server or a test: checks the
/// outer header (IPv4, checksum, not a fragment, protocol 4, a complete inner header),
/// then moves the L2 header forward over it. Returns where the decapsulated frame now
/// lies in `frame`: the same L2 header (MACs as received), then the inner packet,
/// padding excluded.
///
/// Errors: `Truncated`, `UnknownEthertype`, `BadIpv4Header`, `BadIpv4Checksum`,
/// `Ipv4Fragment` for the outer header; `UnsupportedProtocol` when it is not IP-in-IP;
/// `BadIpv4Header` for an inner header that does not fit. `frame` is unmodified then.
pub fn decapsulate(frame: &mut [u8]) -> Result<Range<usize>, DropReason> {
    let l2 = ethernet::parse_l2(frame).map_err(|_| DropReason::Truncated)?;
    if l2.ethertype != EtherType::IPV4 {
        return Err(DropReason::UnknownEthertype);
    }
    let l3 = l2.l3_offset;
    let bytes = &frame[l3..];
    if bytes.len() < ipv4::MIN_HEADER_LEN {
        return Err(DropReason::Truncated);
    }
    let outer = ipv4::Packet::new_checked(bytes).map_err(|_| DropReason::BadIpv4Header)?;
    if !outer.verify_checksum() {
        return Err(DropReason::BadIpv4Checksum);
    }
    if outer.is_fragment() {
        return Err(DropReason::Ipv4Fragment);
    }
    if outer.protocol() != IpProtocol::IPIP {
        return Err(DropReason::UnsupportedProtocol);
    }
    let inner =
        ipv4::Packet::new_checked(outer.payload()).map_err(|_| DropReason::BadIpv4Header)?;
    let (outer_header_len, inner_len) = (outer.header_len(), inner.total_len() as usize);
    frame.copy_within(0..l3, outer_header_len);
    Ok(outer_header_len..outer_header_len + l3 + inner_len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::parse::classify;
    use crate::flow::parse::fixtures::*;
    use crate::forward::test_util::random_parsed;
    use crate::wire::test_util::XorShift;

    // TUN_INNER encapsulated: 10.0.0.1 -> 10.0.0.11 proto 4, ident 0x1234, TTL 64, TOS and DF copied (scapy).
    static TUN_OUTER: [u8; 91] = [
        0x52, 0x54, 0x00, 0x00, 0x00, 0x0b, 0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x08, 0x00, 0x45,
        0xb8, 0x00, 0x4d, 0x12, 0x34, 0x40, 0x00, 0x40, 0x04, 0x13, 0xb6, 0x0a, 0x00, 0x00, 0x01,
        0x0a, 0x00, 0x00, 0x0b, 0x45, 0xb8, 0x00, 0x39, 0x1c, 0x46, 0x40, 0x00, 0x3d, 0x06, 0xba,
        0x78, 0xc6, 0x33, 0x64, 0x0a, 0xcb, 0x00, 0x71, 0x0a, 0x9c, 0x40, 0x00, 0x50, 0x00, 0x00,
        0x00, 0x05, 0x00, 0x00, 0x00, 0x06, 0x50, 0x10, 0x00, 0x64, 0xd6, 0x75, 0x00, 0x00, 0x74,
        0x75, 0x6e, 0x6e, 0x65, 0x6c, 0x6c, 0x65, 0x64, 0x20, 0x70, 0x61, 0x79, 0x6c, 0x6f, 0x61,
        0x64,
    ];
    // TUN_INNER_QINQ encapsulated with ident 0xbeef, no DF, tags kept, padding dropped (scapy).
    static TUN_OUTER_QINQ: [u8; 72] = [
        0x52, 0x54, 0x00, 0x00, 0x00, 0x0b, 0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x88, 0xa8, 0x00,
        0x0a, 0x81, 0x00, 0x00, 0x14, 0x08, 0x00, 0x45, 0x00, 0x00, 0x32, 0xbe, 0xef, 0x00, 0x00,
        0x40, 0x04, 0xa7, 0xcd, 0x0a, 0x00, 0x00, 0x01, 0x0a, 0x00, 0x00, 0x0b, 0x45, 0x00, 0x00,
        0x1e, 0x00, 0x77, 0x00, 0x00, 0x3c, 0x11, 0x18, 0x10, 0xc6, 0x33, 0x64, 0x0a, 0xcb, 0x00,
        0x71, 0x0a, 0x14, 0xe9, 0x00, 0x35, 0x00, 0x0a, 0x1c, 0x0a, 0x68, 0x69,
    ];

    /// The fixture behind 20 bytes of headroom, as the data plane hands it over.
    fn with_headroom(frame: &[u8]) -> Vec<u8> {
        let mut buf = vec![0xa5; OUTER_HEADER_LEN];
        buf.extend_from_slice(frame);
        buf
    }

    #[test]
    fn encapsulate_matches_scapy() {
        let mut buf = with_headroom(&TUN_INNER);
        let len = encapsulate(&mut buf, 14, LIP, RIP, RS_MAC, OUR_MAC, 0x1234).unwrap();
        assert_eq!(len, TUN_OUTER.len());
        assert_eq!(buf[..len], TUN_OUTER);
        let parsed = classify(&buf[..len]).unwrap();
        assert_eq!(parsed.ip_addrs(), Some((LIP, RIP)));
        assert_eq!(parsed.ip_total_len as usize, encapsulated_len(57));
    }

    #[test]
    fn encapsulate_keeps_qinq_tags_and_drops_padding() {
        let mut buf = with_headroom(&TUN_INNER_QINQ);
        let len = encapsulate(&mut buf, 22, LIP, RIP, RS_MAC, OUR_MAC, 0xbeef).unwrap();
        assert_eq!(buf[..len], TUN_OUTER_QINQ);
        assert!(
            len < TUN_INNER_QINQ.len() + OUTER_HEADER_LEN,
            "padding dropped"
        );
    }

    #[test]
    fn decapsulate_gives_the_original_back() {
        for (inner, l2_len) in [(&TUN_INNER[..], 14), (&TUN_INNER_QINQ[..], 22)] {
            let ip_end = classify(inner).unwrap().ip_end();
            let mut buf = with_headroom(inner);
            let len = encapsulate(&mut buf, l2_len, LIP, RIP, RS_MAC, OUR_MAC, 7).unwrap();
            // Stripping the outer header by hand: L2 header, then what follows it.
            let mut stripped = buf[..l2_len].to_vec();
            stripped.extend_from_slice(&buf[l2_len + OUTER_HEADER_LEN..len]);
            assert_eq!(stripped[12..], inner[12..ip_end]);
            // And with the function.
            let range = decapsulate(&mut buf[..len]).unwrap();
            assert_eq!(buf[range.clone()], stripped[..]);
            assert_eq!(buf[range][..12], [RS_MAC.0, OUR_MAC.0].concat()[..]);
        }
    }

    #[test]
    fn decapsulate_rejects() {
        assert_eq!(
            decapsulate(&mut TUN_INNER.clone()),
            Err(DropReason::UnsupportedProtocol)
        );
        let mut bad = TUN_OUTER;
        bad[22] -= 1; // outer TTL, checksum stale
        assert_eq!(decapsulate(&mut bad), Err(DropReason::BadIpv4Checksum));
        let mut cut = TUN_OUTER;
        assert_eq!(decapsulate(&mut cut[..50]), Err(DropReason::BadIpv4Header));
        assert_eq!(decapsulate(&mut cut[..30]), Err(DropReason::Truncated));
        assert_eq!(cut, TUN_OUTER);
    }

    #[test]
    fn mtu_check() {
        assert_eq!(encapsulated_len(1480), 1500);
        let parsed = classify(&TUN_INNER).unwrap(); // 57 bytes, DF
        assert_eq!(check_mtu(&TUN_INNER, &parsed, 1500), MtuCheck::Fits);
        assert_eq!(check_mtu(&TUN_INNER, &parsed, 77), MtuCheck::Fits);
        assert_eq!(
            check_mtu(&TUN_INNER, &parsed, 76),
            MtuCheck::FragNeeded { next_hop_mtu: 56 }
        );
        assert_eq!(
            check_mtu(&TUN_INNER, &parsed, 10),
            MtuCheck::FragNeeded { next_hop_mtu: 0 }
        );
        let parsed = classify(&TUN_INNER_QINQ).unwrap(); // 30 bytes, no DF
        assert_eq!(check_mtu(&TUN_INNER_QINQ, &parsed, 50), MtuCheck::Fits);
        assert_eq!(check_mtu(&TUN_INNER_QINQ, &parsed, 49), MtuCheck::TooBig);
    }

    #[test]
    fn encapsulate_errors_leave_buf_alone() {
        let cases: [(&[u8], usize, DropReason); 5] = [
            (&TUN_INNER[..10], 14, DropReason::Truncated),
            (&TUN_INNER, 18, DropReason::Truncated),
            (&TUN_INNER[..30], 14, DropReason::Truncated),
            (&TUN_INNER[..50], 14, DropReason::BadIpv4Header),
            (&ARP_REQUEST, 14, DropReason::UnknownEthertype),
        ];
        for (frame, l2_len, reason) in cases {
            let mut buf = with_headroom(frame);
            let before = buf.clone();
            assert_eq!(
                encapsulate(&mut buf, l2_len, LIP, RIP, RS_MAC, OUR_MAC, 1),
                Err(reason)
            );
            assert_eq!(buf, before);
        }
        // No headroom at all.
        let mut tiny = [0u8; 19];
        assert_eq!(
            encapsulate(&mut tiny, 14, LIP, RIP, RS_MAC, OUR_MAC, 1),
            Err(DropReason::Truncated)
        );
        // An inner packet of 65 520 bytes cannot grow by 20.
        let mut huge = vec![0u8; OUTER_HEADER_LEN + 14 + 65_520];
        huge[OUTER_HEADER_LEN..][..TUN_INNER.len()].copy_from_slice(&TUN_INNER);
        let mut ip = ipv4::Packet::new_unchecked(&mut huge[OUTER_HEADER_LEN + 14..]);
        ip.set_total_len(65_520);
        ip.fill_checksum();
        assert_eq!(
            encapsulate(&mut huge, 14, LIP, RIP, RS_MAC, OUR_MAC, 1),
            Err(DropReason::TooBig)
        );
    }

    #[test]
    fn fuzz_never_panics() {
        let mut rng = XorShift(0x7777_0000_eeee_1234);
        let mut buf = [0u8; 160];
        let fixtures: [&[u8]; 3] = [&TUN_INNER, &TUN_INNER_QINQ, &TUN_OUTER];
        let mut encapsulated = 0;
        for _ in 0..100_000 {
            let len = rng.below(buf.len() + 1);
            let fixture = fixtures[rng.below(fixtures.len())];
            if rng.below(2) == 0 {
                rng.fill(&mut buf[..len]);
            } else {
                let n = fixture.len().min(len.saturating_sub(OUTER_HEADER_LEN));
                buf[OUTER_HEADER_LEN..][..n].copy_from_slice(&fixture[..n]);
                buf[rng.below(buf.len())] = rng.next_u64() as u8;
            }
            let l2_len = [14, 18, 22, rng.below(200)][rng.below(4)];
            if let Ok(n) = encapsulate(&mut buf[..len], l2_len, LIP, RIP, RS_MAC, OUR_MAC, 3) {
                assert!(n <= len);
                assert!(classify(&buf[..n]).is_ok());
                let range = decapsulate(&mut buf[..n]).unwrap();
                assert!(range.end <= n);
                encapsulated += 1;
            }
            let _ = decapsulate(&mut buf[..len]);
            let parsed = random_parsed(&mut rng, len);
            let _ = check_mtu(&buf[..len], &parsed, rng.next_u64() as u16);
        }
        assert!(
            encapsulated > 1000,
            "the fuzz reaches encapsulation: {encapsulated}"
        );
    }
}
