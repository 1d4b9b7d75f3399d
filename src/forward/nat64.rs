//! NAT64 header translation for FullNAT (RFC 7915, stateful as RFC 6146 uses it): an
//! IPv6 client's TCP segment or UDP datagram becomes an IPv4 one from a local address
//! to an IPv4 real server ([`to_v4`]), and the real server's reply becomes IPv6 again
//! from the VIP to the client ([`to_v6`]). Pure functions on the frame bytes, as the
//! rest of `forward`; `dataplane/forwarder/ipv6.rs` calls them (docs/IPV6.md).
//!
//! What is translated (RFC 7915 sections 4.1 and 5.1):
//!
//! | IPv6 -> IPv4 | IPv4 -> IPv6 |
//! |---|---|
//! | traffic class -> TOS | TOS -> traffic class, flow label 0 |
//! | hop limit -> TTL (not decremented, as no mode decrements it) | TTL -> hop limit |
//! | payload minus extension headers -> total length | total length - 20 -> payload length |
//! | DF set above 1260 bytes, identification from the caller | options refused (`Ipv4Options`) |
//! | extension headers dropped | - |
//!
//! The TCP/UDP checksum is updated incrementally: the two pseudo-headers carry the
//! same protocol and length, so only the address words (and the ports) change. An
//! IPv4 UDP datagram without checksum (0) gets one computed over the whole datagram,
//! as IPv6 requires one. The MSS of a real server's SYN-ACK is the caller's to lower
//! by 20 before [`to_v6`] ([`super::toa::clamp_mss`]): the IPv6 header is 20 bytes
//! longer, so segments sized for the IPv4 path would not fit the client's. The
//! client's SYN needs no clamp: its MSS is sized for IPv6, 20 bytes less than IPv4
//! carries. ICMP errors are translated by [`super::icmp6`].

use core::ops::Range;
use std::net::{Ipv4Addr, Ipv6Addr};

use crate::flow::parse::{Ipv6Payload, PacketKind, Parsed};
use crate::model::DropReason;
use crate::wire::{checksum, ipv4, ipv6, tcp, udp, EtherType, IpProtocol};

/// The IPv6 header is this much longer than the IPv4 header the translation writes:
/// the headroom [`to_v6`] needs, and what a SYN-ACK's MSS is lowered by.
pub const HEADER_GROWTH: usize = ipv6::HEADER_LEN - ipv4::MIN_HEADER_LEN;
/// Above this many bytes a translated IPv4 packet has DF set (RFC 7915 5.1: the
/// IPv6 minimum MTU less the 20 bytes it grows by on the way back).
const DF_ABOVE: usize = ipv6::MIN_MTU - HEADER_GROWTH;

/// Where the L4 checksum lies in the segment, and whether it is UDP.
fn l4_checksum_at(kind: IpProtocol) -> Option<(usize, bool)> {
    match kind {
        IpProtocol::TCP => Some((16, false)),
        IpProtocol::UDP => Some((6, true)),
        _ => None,
    }
}

/// The sum of an address's 16-bit words, folded (its share of a pseudo-header sum).
fn words(bytes: &[u8]) -> u16 {
    checksum::fold(checksum::sum(bytes))
}

/// `sum` (an L4 checksum) with the pseudo-header's addresses `old` replaced by `new`
/// and the ports at the start of `segment` set to `ports`: RFC 1624 equation 3.
fn rechecksum(sum: u16, old: u16, new: u16, segment: &mut [u8], ports: (u16, u16)) -> u16 {
    let mut sum = checksum::update16(sum, old, new);
    for (at, port) in [(0, ports.0), (2, ports.1)] {
        let was = u16::from_be_bytes([segment[at], segment[at + 1]]);
        sum = checksum::update16(sum, was, port);
        segment[at..at + 2].copy_from_slice(&port.to_be_bytes());
    }
    sum
}

/// Translates the IPv6 TCP/UDP packet of `parsed` into IPv4 in place, from `src` to
/// `dst` (address and port). The IPv4 header is written just before the L4 header,
/// over the end of the IPv6 header and its extension headers, and the L2 header
/// (VLAN tags kept, EtherType now IPv4) moves up to meet it. Returns where the new
/// frame lies in `frame` (the caller trims the mbuf's front to its start).
///
/// Errors, with the frame unmodified: `UnsupportedProtocol` when `parsed` is not
/// IPv6 TCP or UDP; `Truncated` when its offsets do not fit `frame`; `BadTcpHeader`,
/// `BadUdpHeader` for an L4 header that does not fit, or IPv6 UDP without checksum.
pub fn to_v4(
    frame: &mut [u8],
    parsed: &Parsed,
    src: (Ipv4Addr, u16),
    dst: (Ipv4Addr, u16),
    ident: u16,
) -> Result<Range<usize>, DropReason> {
    let protocol = match parsed.kind {
        PacketKind::Ipv6(Ipv6Payload::Tcp { .. }) => IpProtocol::TCP,
        PacketKind::Ipv6(Ipv6Payload::Udp { .. }) => IpProtocol::UDP,
        _ => return Err(DropReason::UnsupportedProtocol),
    };
    let (l2_len, l3, l4) = (parsed.l3, parsed.l3, parsed.l4);
    let end = l3.checked_add(parsed.ip_total_len as usize);
    let end = end.filter(|&e| e <= frame.len() && l4 <= e && l3 >= 14 && l4 >= l3 + 40);
    let end = end.ok_or(DropReason::Truncated)?;
    let (at, udp) = l4_checksum_at(protocol).ok_or(DropReason::UnsupportedProtocol)?;
    let segment_len = end - l4;
    if udp {
        let u = udp::Packet::new_checked(&frame[l4..end]).map_err(|_| DropReason::BadUdpHeader)?;
        if u.checksum() == 0 {
            return Err(DropReason::BadUdpHeader);
        }
    } else {
        tcp::Packet::new_checked(&frame[l4..end]).map_err(|_| DropReason::BadTcpHeader)?;
    }
    let ip = ipv6::Packet::new_unchecked(&frame[l3..l3 + ipv6::HEADER_LEN]);
    let (class, hops) = (ip.traffic_class(), ip.hop_limit());
    let old = words(&frame[l3 + 8..l3 + 40]);
    let mut new_addrs = [0u8; 8];
    new_addrs[..4].copy_from_slice(&src.0.octets());
    new_addrs[4..].copy_from_slice(&dst.0.octets());
    let new = words(&new_addrs);

    let segment = &mut frame[l4..end];
    let sum = u16::from_be_bytes([segment[at], segment[at + 1]]);
    let mut sum = rechecksum(sum, old, new, segment, (src.1, dst.1));
    if udp && sum == 0 {
        sum = 0xffff;
    }
    segment[at..at + 2].copy_from_slice(&sum.to_be_bytes());

    let new_l3 = l4 - ipv4::MIN_HEADER_LEN;
    let start = new_l3 - l2_len;
    frame.copy_within(0..l2_len, start);
    frame[new_l3 - 2..new_l3].copy_from_slice(&EtherType::IPV4.0.to_be_bytes());
    let total = ipv4::MIN_HEADER_LEN + segment_len;
    let mut packet = ipv4::Packet::new_unchecked(&mut frame[new_l3..l4]);
    ipv4::Repr {
        src_addr: src.0,
        dst_addr: dst.0,
        protocol,
        payload_len: segment_len,
        ttl: hops,
    }
    .emit(&mut packet);
    packet.set_dscp_ecn(class >> 2, class & 3);
    packet.set_ident(ident);
    packet.set_fragmentation(total > DF_ABOVE, false, 0);
    packet.fill_checksum();
    Ok(start..end)
}

/// Translates the IPv4 TCP/UDP packet of `parsed` into IPv6, from `src` to `dst`.
/// `buf` holds [`HEADER_GROWTH`] bytes of headroom, then the received frame (which
/// `parsed` describes, offsets from the frame's start). The L2 header moves to the
/// front (EtherType now IPv6) and the IPv6 header takes the place of the IPv4 one
/// and the 20 bytes before it. Returns the new frame length.
///
/// Errors, with `buf` unmodified: `UnsupportedProtocol` when `parsed` is not IPv4
/// TCP or UDP; `Truncated` when the headroom, the frame or the offsets are short;
/// `Ipv4Options` for a header with options; `BadTcpHeader`, `BadUdpHeader` for an L4
/// header that does not fit.
pub fn to_v6(
    buf: &mut [u8],
    parsed: &Parsed,
    src: (Ipv6Addr, u16),
    dst: (Ipv6Addr, u16),
) -> Result<usize, DropReason> {
    let protocol = match parsed.kind {
        PacketKind::Tcp { .. } => IpProtocol::TCP,
        PacketKind::Udp { .. } => IpProtocol::UDP,
        _ => return Err(DropReason::UnsupportedProtocol),
    };
    let (at, udp) = l4_checksum_at(protocol).ok_or(DropReason::UnsupportedProtocol)?;
    let frame = buf.get_mut(HEADER_GROWTH..).ok_or(DropReason::Truncated)?;
    let (l3, l4) = (parsed.l3, parsed.l4);
    let ip = super::ip_packet(frame, parsed).ok_or(DropReason::Truncated)?;
    if l3 < 14 {
        return Err(DropReason::Truncated);
    }
    if ip.header_len() != ipv4::MIN_HEADER_LEN {
        return Err(DropReason::Ipv4Options);
    }
    let (tos, ttl) = ((ip.dscp() << 2) | ip.ecn(), ip.ttl());
    let old = words(&frame[l3 + 12..l3 + 20]);
    let end = l3 + ip.total_len() as usize;
    let segment_len = end - l4;
    if udp {
        udp::Packet::new_checked(&frame[l4..end]).map_err(|_| DropReason::BadUdpHeader)?;
    } else {
        tcp::Packet::new_checked(&frame[l4..end]).map_err(|_| DropReason::BadTcpHeader)?;
    }
    let mut new_addrs = [0u8; 32];
    new_addrs[..16].copy_from_slice(&src.0.octets());
    new_addrs[16..].copy_from_slice(&dst.0.octets());
    let new = words(&new_addrs);

    let segment = &mut frame[l4..end];
    let sum = u16::from_be_bytes([segment[at], segment[at + 1]]);
    let mut sum = if udp && sum == 0 {
        // No checksum in IPv4; IPv6 needs one: computed whole, ports first.
        segment[..2].copy_from_slice(&src.1.to_be_bytes());
        segment[2..4].copy_from_slice(&dst.1.to_be_bytes());
        let pseudo = checksum::pseudo_header_sum_v6(src.0, dst.0, protocol.0, segment_len as u32);
        checksum::finish(pseudo + checksum::sum(segment))
    } else {
        rechecksum(sum, old, new, segment, (src.1, dst.1))
    };
    if udp && sum == 0 {
        sum = 0xffff;
    }
    segment[at..at + 2].copy_from_slice(&sum.to_be_bytes());

    // The L2 header to the front; the IPv6 header ends where the IPv4 one did.
    buf.copy_within(HEADER_GROWTH..HEADER_GROWTH + l3, 0);
    buf[l3 - 2..l3].copy_from_slice(&EtherType::IPV6.0.to_be_bytes());
    let mut packet = ipv6::Packet::new_unchecked(&mut buf[l3..l3 + ipv6::HEADER_LEN]);
    ipv6::Repr {
        src_addr: src.0,
        dst_addr: dst.0,
        next_header: protocol,
        payload_len: segment_len,
        hop_limit: ttl,
    }
    .emit(&mut packet);
    packet.set_traffic_class(tos);
    Ok(HEADER_GROWTH + end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::parse::classify;

    const CLIENT: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x18, 0, 0, 0, 0, 2);
    const VIP: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x18, 0, 0, 0, 0, 0x100);
    const LIP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 50);
    const RS: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 11);

    /// Ethernet (with an 802.1Q tag or not) + IPv6 (hop-by-hop header or not) + TCP
    /// or UDP with `data` bytes, traffic class 0xb8, hop limit 61, checksum valid.
    fn v6_frame(tcp: bool, vlan: bool, hbh: bool, data: usize) -> Vec<u8> {
        let mut f = vec![0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2];
        if vlan {
            f.extend_from_slice(&[0x81, 0x00, 0x00, 0x14]);
        }
        f.extend_from_slice(&[0x86, 0xdd]);
        let l4_len = if tcp { 20 } else { 8 } + data;
        let ext = if hbh { 8 } else { 0 };
        let proto = if tcp { 6 } else { 17 };
        f.extend_from_slice(&[0x6b, 0x80, 0, 0]);
        f.extend_from_slice(&((l4_len + ext) as u16).to_be_bytes());
        f.extend_from_slice(&[if hbh { 0 } else { proto }, 61]);
        f.extend_from_slice(&CLIENT.octets());
        f.extend_from_slice(&VIP.octets());
        if hbh {
            f.extend_from_slice(&[proto, 0, 1, 4, 0, 0, 0, 0]);
        }
        let l4 = f.len();
        f.extend_from_slice(&[0x9c, 0x40, 0, 80]);
        if tcp {
            f.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x02, 0x20, 0, 0, 0, 0, 0]);
        } else {
            f.extend_from_slice(&(l4_len as u16).to_be_bytes());
            f.extend_from_slice(&[0, 0]);
        }
        f.extend((0..data).map(|i| (i * 7) as u8));
        let at = l4 + if tcp { 16 } else { 6 };
        let sum = checksum::pseudo_header_sum_v6(CLIENT, VIP, proto, l4_len as u32)
            + checksum::sum(&f[l4..]);
        f[at..at + 2].copy_from_slice(&checksum::finish(sum).to_be_bytes());
        f
    }

    /// The L4 checksum of an IPv4 packet at `l3` verifies.
    fn v4_l4_ok(f: &[u8], l3: usize) -> bool {
        let ip = ipv4::Packet::new_checked(&f[l3..]).unwrap();
        let seg = ip.payload();
        let sum = checksum::pseudo_header_sum(
            ip.src_addr(),
            ip.dst_addr(),
            ip.protocol().0,
            seg.len() as u16,
        ) + checksum::sum(seg);
        checksum::fold(sum) == 0xffff
    }

    #[test]
    fn v6_to_v4_and_back_as_rfc_7915_says() {
        for (tcp, vlan, hbh, data) in [
            (true, false, false, 10),
            (true, true, true, 1300),
            (false, false, true, 3),
            (false, true, false, 100),
        ] {
            let original = v6_frame(tcp, vlan, hbh, data);
            let mut f = original.clone();
            let parsed = classify(&f).unwrap();
            let range = to_v4(&mut f, &parsed, (LIP, 1025), (RS, 8080), 0x1234).unwrap();
            let out = f[range].to_vec();
            let p4 = classify(&out).unwrap();
            let l2 = if vlan { 18 } else { 14 };
            assert_eq!(p4.l3, l2);
            assert_eq!(out[..l2 - 2], original[..l2 - 2], "MACs and tags kept");
            let ip = ipv4::Packet::new_checked(&out[l2..]).unwrap();
            assert!(ip.verify_checksum());
            assert_eq!((ip.src_addr(), ip.dst_addr()), (LIP, RS));
            assert_eq!((ip.dscp() << 2) | ip.ecn(), 0xb8, "traffic class kept");
            assert_eq!(ip.ttl(), 61);
            assert_eq!(ip.ident(), 0x1234);
            let segment = (if tcp { 20 } else { 8 }) + data;
            assert_eq!(ip.total_len() as usize, 20 + segment);
            assert_eq!(ip.dont_frag(), 20 + segment > 1260);
            assert!(v4_l4_ok(&out, l2), "tcp={tcp} hbh={hbh}");
            match p4.kind {
                PacketKind::Tcp { key, .. } | PacketKind::Udp { key } => {
                    assert_eq!((key.sport, key.dport), (1025, 8080))
                }
                other => panic!("{other:?}"),
            }
            // And back, as the reply would be: the original without its extension
            // header.
            let mut buf = vec![0u8; HEADER_GROWTH];
            buf.extend_from_slice(&out);
            let len = to_v6(&mut buf, &p4, (CLIENT, 40000), (VIP, 80)).unwrap();
            let expected = if hbh {
                let strip = v6_frame(tcp, vlan, false, data);
                assert_eq!(strip.len() + 8, original.len());
                strip
            } else {
                original.clone()
            };
            assert_eq!(buf[..len], expected[..], "tcp={tcp} vlan={vlan} hbh={hbh}");
        }
    }

    #[test]
    fn ipv4_udp_without_checksum_gets_one() {
        let mut f = v6_frame(false, false, false, 5);
        let parsed = classify(&f).unwrap();
        let range = to_v4(&mut f, &parsed, (LIP, 1025), (RS, 53), 1).unwrap();
        let mut out = f[range].to_vec();
        out[34 + 6..34 + 8].copy_from_slice(&[0, 0]);
        let p4 = classify(&out).unwrap();
        let mut buf = vec![0u8; HEADER_GROWTH];
        buf.extend_from_slice(&out);
        let len = to_v6(&mut buf, &p4, (CLIENT, 40000), (VIP, 80)).unwrap();
        assert_eq!(buf[..len], v6_frame(false, false, false, 5)[..]);
    }

    #[test]
    fn refuses_what_it_cannot_translate_and_changes_nothing() {
        let mut f = v6_frame(false, false, false, 5);
        let at = 14 + 40 + 6;
        f[at..at + 2].copy_from_slice(&[0, 0]);
        let parsed = classify(&f).unwrap();
        let before = f.clone();
        let r = to_v4(&mut f, &parsed, (LIP, 1), (RS, 2), 0);
        assert_eq!(r, Err(DropReason::BadUdpHeader));
        assert_eq!(f, before);
        let mut short = v6_frame(true, false, false, 10);
        let parsed = classify(&short).unwrap();
        short.truncate(60);
        let r = to_v4(&mut short, &parsed, (LIP, 1), (RS, 2), 0);
        assert_eq!(r, Err(DropReason::Truncated));
        // IPv4 with options, and no headroom.
        let mut f = v6_frame(true, false, false, 10);
        let parsed = classify(&f).unwrap();
        let range = to_v4(&mut f, &parsed, (LIP, 1025), (RS, 80), 0).unwrap();
        let out = f[range].to_vec();
        let mut p4 = classify(&out).unwrap();
        let mut buf = out.clone();
        assert_eq!(
            to_v6(&mut buf[..10], &p4, (CLIENT, 1), (VIP, 2)),
            Err(DropReason::Truncated)
        );
        p4.l4 += 4;
        let mut buf = vec![0u8; HEADER_GROWTH];
        buf.extend_from_slice(&out);
        let before = buf.clone();
        assert!(to_v6(&mut buf, &p4, (CLIENT, 1), (VIP, 2)).is_err());
        assert_eq!(buf, before);
    }

    #[test]
    fn fuzz_never_panics() {
        use crate::forward::test_util::random_parsed;
        use crate::wire::test_util::XorShift;
        let mut rng = XorShift(0x6464_0000_4444_0001);
        let mut buf = [0u8; 1600];
        let fixtures = [
            v6_frame(true, true, true, 40),
            v6_frame(false, false, false, 9),
        ];
        let mut translated = 0;
        for _ in 0..50_000 {
            let len = rng.below(buf.len() + 1);
            let fixture = &fixtures[rng.below(fixtures.len())];
            let n = fixture.len().min(len);
            buf[..n].copy_from_slice(&fixture[..n]);
            if rng.below(2) == 0 {
                buf[rng.below(buf.len())] = rng.next_u64() as u8;
            }
            let parsed = match classify(&buf[..len]) {
                Ok(p) if rng.below(4) != 0 => p,
                _ => random_parsed(&mut rng, len),
            };
            if let Ok(r) = to_v4(&mut buf[..len], &parsed, (LIP, 1), (RS, 2), 0) {
                assert!(r.end <= len);
                translated += 1;
            }
            let parsed = random_parsed(&mut rng, len);
            if let Ok(n) = to_v6(&mut buf[..len], &parsed, (CLIENT, 1), (VIP, 2)) {
                assert!(n <= len);
            }
        }
        assert!(
            translated > 1000,
            "the fuzz reaches translation: {translated}"
        );
    }
}
