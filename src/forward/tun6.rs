//! IPv6-in-IPv6 tunnelling (`ipvsadm -i` on an IPv6 service, RFC 2473, next header
//! 41): the client's IPv6 packet travels unchanged inside an outer IPv6 header from
//! Sluice to the real server, which decapsulates it (an `ip6tnl` device in `ip6ip6`
//! mode, or anything that reads next header 41) onto an interface holding the VIP and
//! replies to the client directly.
//!
//! The outer header is 40 bytes without extension headers: hop limit 64; the traffic
//! class (DSCP and ECN) copied from the inner header (RFC 2473 section 6.7 lets the
//! entry point choose; RFC 6040 normal mode copies); the flow label copied, so that
//! ECMP paths between Sluice and the real server keep a flow on one path (RFC 6438);
//! no tunnel encapsulation limit option. IPv6 routers do not fragment: a packet that
//! no longer fits the MTU is dropped, and the client learns a smaller path MTU from an
//! ICMPv6 Packet Too Big ([`check_mtu`], then [`packet_too_big`]).
//!
//! Packet Too Big comes from the packet's destination (the VIP), as Katran sends it:
//! the client reached the VIP, so the VIP is an address its filters let through, and
//! the kernel matches the error to the socket by the quoted packet.

use core::ops::Range;
use std::net::Ipv6Addr;

use crate::flow::parse::{Ipv6Payload, PacketKind, Parsed};
use crate::model::DropReason;
use crate::wire::ethernet::{self, EtherType, MacAddr};
use crate::wire::{icmpv6, ipv6, IpProtocol, WireError};

/// Bytes the outer header adds, and the headroom [`encapsulate`] expects in front.
pub const OUTER_HEADER_LEN: usize = ipv6::HEADER_LEN;
/// Hop limit of the outer header.
pub const OUTER_HOP_LIMIT: u8 = ipv6::DEFAULT_HOP_LIMIT;

/// Length of the outer IPv6 packet carrying an inner packet of `inner_ip_len` bytes.
pub const fn encapsulated_len(inner_ip_len: usize) -> usize {
    inner_ip_len + OUTER_HEADER_LEN
}

/// `None` when `parsed`'s packet still fits `mtu` (the largest IPv6 packet the link
/// towards the real server carries) once encapsulated; else the MTU to announce in a
/// Packet Too Big: `mtu - 40`, the largest inner packet that fits.
pub fn check_mtu(parsed: &Parsed, mtu: u16) -> Option<u32> {
    if encapsulated_len(parsed.ip_total_len as usize) <= mtu as usize {
        return None;
    }
    Some(u32::from(mtu.saturating_sub(OUTER_HEADER_LEN as u16)))
}

/// Encapsulates in place. `buf` holds [`OUTER_HEADER_LEN`] bytes of headroom (the data
/// plane prepends them to the mbuf), then the received frame whose L2 header (VLAN
/// tags included) is `l2_len` bytes long. The L2 header moves to the front, the outer
/// IPv6 header follows it, the inner packet stays where it is, and the MACs become
/// `dst_mac` and `src_mac`. Returns the new frame length: `l2_len + 40 + inner
/// length`, Ethernet padding of the received frame excluded.
///
/// Errors, with `buf` unmodified: `Truncated` when the headroom or the frame is short,
/// the inner payload length runs past the frame, or `l2_len` is not where the L2
/// header ends; `UnknownEthertype` when the frame is not IPv6; `BadIpv6Header` when
/// the inner header is not version 6; `TooBig` when the outer payload would exceed
/// 65 535 bytes. The caller checks the MTU first ([`check_mtu`]).
pub fn encapsulate(
    buf: &mut [u8],
    l2_len: usize,
    outer_src: Ipv6Addr,
    outer_dst: Ipv6Addr,
    dst_mac: MacAddr,
    src_mac: MacAddr,
) -> Result<usize, DropReason> {
    let frame = buf.get(OUTER_HEADER_LEN..).ok_or(DropReason::Truncated)?;
    let l2 = ethernet::parse_l2(frame).map_err(|_| DropReason::Truncated)?;
    if l2.ethertype != EtherType::IPV6 {
        return Err(DropReason::UnknownEthertype);
    }
    if l2.l3_offset != l2_len {
        return Err(DropReason::Truncated);
    }
    let inner = ipv6::Packet::new_checked(&frame[l2_len..]).map_err(v6_header_error)?;
    let (class, flow) = (inner.traffic_class(), inner.flow_label());
    let inner_len = ipv6::HEADER_LEN + inner.payload_len() as usize;
    let outer_payload = u16::try_from(inner_len).map_err(|_| DropReason::TooBig)?;

    buf.copy_within(OUTER_HEADER_LEN..OUTER_HEADER_LEN + l2_len, 0);
    let (l2_header, rest) = buf.split_at_mut(l2_len);
    let mut outer = ipv6::Packet::new_unchecked(&mut rest[..OUTER_HEADER_LEN]);
    outer.set_version_class_flow(class, flow);
    outer.set_payload_len(outer_payload);
    outer.set_next_header(IpProtocol::IPV6);
    outer.set_hop_limit(OUTER_HOP_LIMIT);
    outer.set_src_addr(outer_src);
    outer.set_dst_addr(outer_dst);
    let mut eth = ethernet::Frame::new_unchecked(l2_header);
    eth.set_dst_addr(dst_mac);
    eth.set_src_addr(src_mac);
    Ok(l2_len + OUTER_HEADER_LEN + inner_len)
}

/// The reverse of [`encapsulate`], for a user-space real server or a test: checks the
/// outer header (IPv6, next header 41 directly, a complete inner header), then moves
/// the L2 header forward over it. Returns where the decapsulated frame now lies in
/// `frame`: the same L2 header, then the inner packet, padding excluded.
///
/// Errors: `Truncated`, `UnknownEthertype`, `BadIpv6Header` for the outer header;
/// `UnsupportedProtocol` when it is not IPv6-in-IPv6; `BadIpv6Header` for an inner
/// packet that does not fit. `frame` is unmodified then.
pub fn decapsulate(frame: &mut [u8]) -> Result<Range<usize>, DropReason> {
    let l2 = ethernet::parse_l2(frame).map_err(|_| DropReason::Truncated)?;
    if l2.ethertype != EtherType::IPV6 {
        return Err(DropReason::UnknownEthertype);
    }
    let l3 = l2.l3_offset;
    let outer = ipv6::Packet::new_checked(&frame[l3..]).map_err(v6_header_error)?;
    if outer.next_header() != IpProtocol::IPV6 {
        return Err(DropReason::UnsupportedProtocol);
    }
    let inner =
        ipv6::Packet::new_checked(outer.payload()).map_err(|_| DropReason::BadIpv6Header)?;
    let inner_len = ipv6::HEADER_LEN + inner.payload_len() as usize;
    frame.copy_within(0..l3, OUTER_HEADER_LEN);
    Ok(OUTER_HEADER_LEN..OUTER_HEADER_LEN + l3 + inner_len)
}

/// An IPv6 header that does not check: too short for its payload length, or not
/// version 6.
fn v6_header_error(err: WireError) -> DropReason {
    match err {
        WireError::Truncated => DropReason::Truncated,
        _ => DropReason::BadIpv6Header,
    }
}

/// A source an ICMPv6 error may be sent to (RFC 4443 section 2.4 (e)): not
/// unspecified, loopback or multicast.
fn may_answer(addr: Ipv6Addr) -> bool {
    !(addr.is_unspecified() || addr.is_loopback() || addr.is_multicast())
}

/// Rewrites the frame in place into an ICMPv6 Packet Too Big (type 2, RFC 4443
/// section 3.2) announcing `mtu`, from the packet's destination and `our_mac` back to
/// its source address and source MAC, VLAN tags kept. It quotes as much of the packet
/// as fits the IPv6 minimum MTU (1 232 bytes); hop limit 255 as Linux sends errors,
/// valid checksum. Returns the new frame length: `l3 + 48 + quote`.
///
/// `None`, with the frame unmodified, when no error may be sent (RFC 4443 2.4: the
/// source is unspecified, loopback or multicast, the source MAC a group address, or
/// the packet is itself an ICMPv6 error; a packet to a multicast destination does get
/// a Packet Too Big, as 2.4 (e.2) allows, but Sluice never tunnels one) or when
/// `frame` does not match `parsed`. The caller drops the original (`TooBig`) either
/// way.
pub fn packet_too_big(
    frame: &mut [u8],
    parsed: &Parsed,
    mtu: u32,
    our_mac: MacAddr,
) -> Option<usize> {
    let l3 = parsed.l3;
    if l3 < ethernet::HEADER_LEN {
        return None;
    }
    let peer_mac = ethernet::Frame::new_checked(&*frame).ok()?.src_addr();
    let end = l3.checked_add(parsed.ip_total_len as usize)?;
    let ip = ipv6::Packet::new_checked(frame.get(l3..end)?).ok()?;
    let (peer, ours) = (ip.src_addr(), ip.dst_addr());
    if !peer_mac.is_unicast() || !may_answer(peer) || ours.is_multicast() {
        return None;
    }
    if let PacketKind::Ipv6(Ipv6Payload::Icmp { icmp_type, .. }) = parsed.kind {
        if icmp_type.is_error() {
            return None;
        }
    }
    let quote_len = (end - l3).min(icmpv6::MAX_QUOTED_LEN);
    let message_len = icmpv6::HEADER_LEN + quote_len;
    let ip_len = ipv6::HEADER_LEN + message_len;
    if l3 + ip_len > frame.len() {
        return None;
    }
    // The quote moves back behind the new headers; the regions may overlap.
    frame.copy_within(
        l3..l3 + quote_len,
        l3 + ipv6::HEADER_LEN + icmpv6::HEADER_LEN,
    );
    let (l2_header, rest) = frame.split_at_mut(l3);
    let (header, message) = rest[..ip_len].split_at_mut(ipv6::HEADER_LEN);
    let mut error = icmpv6::Packet::new_unchecked(message);
    error.set_msg_type(icmpv6::Message::PACKET_TOO_BIG);
    error.set_msg_code(0);
    error.set_param(mtu);
    error.fill_checksum(ours, peer);
    let repr = ipv6::Repr {
        src_addr: ours,
        dst_addr: peer,
        next_header: IpProtocol::ICMPV6,
        payload_len: message_len,
        hop_limit: 255,
    };
    repr.emit(&mut ipv6::Packet::new_unchecked(header));
    let mut eth = ethernet::Frame::new_unchecked(l2_header);
    eth.set_dst_addr(peer_mac);
    eth.set_src_addr(our_mac);
    Some(l3 + ip_len)
}

/// Of `candidates` (the port's IPv6 addresses), the one sharing the longest prefix
/// with `target`: the outer source towards a real server, as the worker solicits it
/// from (the address on its link). `None` when there is none.
pub fn source_for(candidates: &[Ipv6Addr], target: Ipv6Addr) -> Option<Ipv6Addr> {
    let common = |a: &Ipv6Addr| (u128::from(*a) ^ u128::from(target)).leading_zeros();
    candidates.iter().copied().max_by_key(common)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::parse::classify;
    use crate::wire::checksum;

    const CLIENT: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x18, 0, 0, 0, 0, 2);
    const VIP: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x18, 0, 0, 0, 0, 0x100);
    const LOCAL: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x1a, 0, 0, 0, 0, 1);
    const RS: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x1a, 0, 0, 0, 0, 0x11);
    const OUR_MAC: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0xaa]);
    const RS_MAC: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x11]);
    const CLIENT_MAC: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 0x22]);

    /// An Ethernet (with `vlan` 802.1Q tag or not) + IPv6 + TCP frame with `data`
    /// bytes of payload, traffic class 0xb8 and flow label 0x12345, checksum valid,
    /// and `padding` bytes after the packet.
    fn client_frame(vlan: bool, data: usize, padding: usize) -> Vec<u8> {
        let mut f = Vec::new();
        f.extend_from_slice(&OUR_MAC.0);
        f.extend_from_slice(&CLIENT_MAC.0);
        if vlan {
            f.extend_from_slice(&[0x81, 0x00, 0x00, 0x14]);
        }
        f.extend_from_slice(&[0x86, 0xdd]);
        let l3 = f.len();
        f.extend_from_slice(&[0x6b, 0x81, 0x23, 0x45]);
        f.extend_from_slice(&((20 + data) as u16).to_be_bytes());
        f.extend_from_slice(&[6, 61]);
        f.extend_from_slice(&CLIENT.octets());
        f.extend_from_slice(&VIP.octets());
        let l4 = f.len();
        f.extend_from_slice(&[
            0x9c, 0x40, 0, 80, 0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x18, 0x20, 0,
        ]);
        f.extend_from_slice(&[0, 0, 0, 0]);
        f.extend((0..data).map(|i| i as u8));
        let sum = checksum::pseudo_header_sum_v6(CLIENT, VIP, 6, (20 + data) as u32)
            + checksum::sum(&f[l4..]);
        let value = checksum::finish(sum);
        f[l4 + 16..l4 + 18].copy_from_slice(&value.to_be_bytes());
        assert_eq!(f.len() - l3, 60 + data);
        f.extend(std::iter::repeat_n(0u8, padding));
        f
    }

    fn with_headroom(frame: &[u8]) -> Vec<u8> {
        let mut buf = vec![0xa5; OUTER_HEADER_LEN];
        buf.extend_from_slice(frame);
        buf
    }

    #[test]
    fn encapsulates_with_an_outer_header_rfc_2473_describes() {
        for (vlan, l2_len) in [(false, 14), (true, 18)] {
            let inner = client_frame(vlan, 100, 6);
            let mut buf = with_headroom(&inner);
            let len = encapsulate(&mut buf, l2_len, LOCAL, RS, RS_MAC, OUR_MAC).unwrap();
            assert_eq!(len, l2_len + 40 + 160, "padding dropped");
            let out = &buf[..len];
            assert_eq!(out[..6], RS_MAC.0);
            assert_eq!(out[6..12], OUR_MAC.0);
            assert_eq!(
                out[12..l2_len],
                inner[12..l2_len],
                "tags and EtherType kept"
            );
            let outer = ipv6::Packet::new_checked(&out[l2_len..]).unwrap();
            assert_eq!(outer.version(), 6);
            assert_eq!(outer.traffic_class(), 0xb8, "DSCP and ECN copied");
            assert_eq!(outer.flow_label(), 0x12345, "flow label copied");
            assert_eq!(outer.payload_len(), 160);
            assert_eq!(outer.next_header(), IpProtocol::IPV6);
            assert_eq!(outer.hop_limit(), 64);
            assert_eq!((outer.src_addr(), outer.dst_addr()), (LOCAL, RS));
            assert_eq!(
                out[l2_len + 40..],
                inner[l2_len..l2_len + 160],
                "inner untouched"
            );
            let parsed = classify(out).unwrap();
            assert_eq!(
                parsed.kind,
                PacketKind::Ipv6(Ipv6Payload::Other {
                    protocol: IpProtocol::IPV6
                })
            );
            // And back.
            let mut copy = out.to_vec();
            let range = decapsulate(&mut copy).unwrap();
            assert_eq!(copy[range.clone()][12..], inner[12..l2_len + 160]);
            assert_eq!(copy[range][..12], [RS_MAC.0, OUR_MAC.0].concat()[..]);
        }
    }

    #[test]
    fn encapsulate_errors_leave_buf_alone() {
        let good = client_frame(false, 10, 0);
        let mut wrong_version = good.clone();
        wrong_version[14] = 0x4b;
        let mut past_frame = good.clone();
        past_frame[18..20].copy_from_slice(&500u16.to_be_bytes());
        let mut ipv4 = good.clone();
        ipv4[12..14].copy_from_slice(&[0x08, 0x00]);
        let cases: [(&[u8], usize, DropReason); 6] = [
            (&good[..10], 14, DropReason::Truncated),
            (&good[..40], 14, DropReason::Truncated),
            (&good, 18, DropReason::Truncated),
            (&past_frame, 14, DropReason::Truncated),
            (&wrong_version, 14, DropReason::BadIpv6Header),
            (&ipv4, 14, DropReason::UnknownEthertype),
        ];
        for (frame, l2_len, reason) in cases {
            let mut buf = with_headroom(frame);
            let before = buf.clone();
            assert_eq!(
                encapsulate(&mut buf, l2_len, LOCAL, RS, RS_MAC, OUR_MAC),
                Err(reason)
            );
            assert_eq!(buf, before);
        }
        let mut tiny = [0u8; 39];
        assert_eq!(
            encapsulate(&mut tiny, 14, LOCAL, RS, RS_MAC, OUR_MAC),
            Err(DropReason::Truncated)
        );
        // An inner packet of 65 535 + 40 bytes cannot be carried in an outer payload.
        let mut huge = vec![0u8; OUTER_HEADER_LEN + 14 + 40 + 65_535];
        huge[OUTER_HEADER_LEN..][..good.len()].copy_from_slice(&good);
        huge[OUTER_HEADER_LEN + 18..][..2].copy_from_slice(&[0xff, 0xff]);
        assert_eq!(
            encapsulate(&mut huge, 14, LOCAL, RS, RS_MAC, OUR_MAC),
            Err(DropReason::TooBig)
        );
    }

    #[test]
    fn mtu_check_announces_the_mtu_less_the_outer_header() {
        let small = client_frame(false, 100, 0); // 160-byte packet
        let parsed = classify(&small).unwrap();
        assert_eq!(check_mtu(&parsed, 1500), None);
        assert_eq!(check_mtu(&parsed, 200), None);
        assert_eq!(check_mtu(&parsed, 199), Some(159));
        let full = client_frame(false, 1440, 0); // 1500-byte packet
        let parsed = classify(&full).unwrap();
        assert_eq!(check_mtu(&parsed, 1500), Some(1460));
        assert_eq!(check_mtu(&parsed, 1540), None);
        assert_eq!(check_mtu(&parsed, 10), Some(0));
    }

    #[test]
    fn packet_too_big_quotes_what_fits_the_minimum_mtu() {
        for (vlan, data) in [(false, 1440), (true, 1440), (false, 500)] {
            let mut f = client_frame(vlan, data, 0);
            let original = f.clone();
            let parsed = classify(&f).unwrap();
            let l3 = parsed.l3;
            // The mbuf's tailroom, which a short packet's error grows into.
            f.extend_from_slice(&[0; 48]);
            let len = packet_too_big(&mut f, &parsed, 1460, OUR_MAC).unwrap();
            let quote = (60 + data).min(1232);
            assert_eq!(len, l3 + 48 + quote);
            let out = &f[..len];
            assert_eq!(out[..6], CLIENT_MAC.0);
            assert_eq!(out[6..12], OUR_MAC.0);
            assert_eq!(out[12..l3], original[12..l3]);
            let ip = ipv6::Packet::new_checked(&out[l3..]).unwrap();
            assert_eq!((ip.src_addr(), ip.dst_addr()), (VIP, CLIENT));
            assert_eq!(ip.next_header(), IpProtocol::ICMPV6);
            assert_eq!(ip.payload_len() as usize, 8 + quote);
            let icmp = icmpv6::Packet::new_checked(ip.payload()).unwrap();
            assert_eq!(icmp.msg_type(), icmpv6::Message::PACKET_TOO_BIG);
            assert_eq!(icmp.mtu(), 1460);
            assert!(icmp.verify_checksum(VIP, CLIENT));
            assert_eq!(icmp.invoking_packet().unwrap(), &original[l3..l3 + quote]);
            // classify sees a well-formed ICMPv6 error.
            let back = classify(out).unwrap();
            assert!(matches!(
                back.kind,
                PacketKind::Ipv6(Ipv6Payload::Icmp { icmp_type, .. })
                    if icmp_type == icmpv6::Message::PACKET_TOO_BIG
            ));
        }
    }

    #[test]
    fn packet_too_big_is_not_sent_where_rfc_4443_forbids() {
        // From a multicast source address.
        let mut f = client_frame(false, 100, 0);
        f[22] = 0xff;
        let parsed = classify(&f).unwrap_or_else(|_| {
            let mut p = classify(&client_frame(false, 100, 0)).unwrap();
            p.kind = PacketKind::Ipv6(Ipv6Payload::Udp { sport: 1, dport: 2 });
            p
        });
        let before = f.clone();
        assert_eq!(packet_too_big(&mut f, &parsed, 1280, OUR_MAC), None);
        assert_eq!(f, before);
        // From a group MAC.
        let mut f = client_frame(false, 100, 0);
        f[6] = 0x01;
        let parsed = classify(&client_frame(false, 100, 0)).unwrap();
        assert_eq!(packet_too_big(&mut f, &parsed, 1280, OUR_MAC), None);
        // About an ICMPv6 error.
        let mut f = client_frame(false, 100, 0);
        let mut parsed = classify(&f).unwrap();
        parsed.kind = PacketKind::Ipv6(Ipv6Payload::Icmp {
            icmp_type: icmpv6::Message::DEST_UNREACHABLE,
            code: 0,
        });
        assert_eq!(packet_too_big(&mut f, &parsed, 1280, OUR_MAC), None);
        // A parsed of another frame.
        let mut short = client_frame(false, 10, 0);
        let parsed = classify(&client_frame(false, 100, 0)).unwrap();
        let before = short.clone();
        assert_eq!(packet_too_big(&mut short, &parsed, 1280, OUR_MAC), None);
        assert_eq!(short, before);
    }

    #[test]
    fn source_is_the_address_on_the_real_servers_link() {
        let ours = [
            "2001:db8:18::1".parse().unwrap(),
            LOCAL,
            "fe80::1".parse().unwrap(),
        ];
        assert_eq!(source_for(&ours, RS), Some(LOCAL));
        assert_eq!(source_for(&ours, CLIENT), Some(ours[0]));
        assert_eq!(source_for(&[], RS), None);
    }

    #[test]
    fn fuzz_never_panics() {
        use crate::forward::test_util::random_parsed;
        use crate::wire::test_util::XorShift;
        let mut rng = XorShift(0x6666_0000_eeee_4141);
        let fixtures = [client_frame(false, 30, 0), client_frame(true, 1300, 4), {
            let mut b = with_headroom(&client_frame(false, 20, 0));
            let n = encapsulate(&mut b, 14, LOCAL, RS, RS_MAC, OUR_MAC).unwrap();
            b.truncate(n);
            b
        }];
        let mut buf = [0u8; 1500];
        let mut encapsulated = 0;
        for _ in 0..50_000 {
            let len = rng.below(buf.len() + 1);
            let fixture = &fixtures[rng.below(fixtures.len())];
            if rng.below(2) == 0 {
                rng.fill(&mut buf[..len]);
            } else {
                let n = fixture.len().min(len.saturating_sub(OUTER_HEADER_LEN));
                buf[OUTER_HEADER_LEN..][..n].copy_from_slice(&fixture[..n]);
                buf[rng.below(buf.len())] = rng.next_u64() as u8;
            }
            let l2_len = [14, 18, rng.below(200)][rng.below(3)];
            if let Ok(n) = encapsulate(&mut buf[..len], l2_len, LOCAL, RS, RS_MAC, OUR_MAC) {
                assert!(n <= len);
                assert!(decapsulate(&mut buf[..n]).is_ok());
                encapsulated += 1;
            }
            let _ = decapsulate(&mut buf[..len]);
            let mut parsed = random_parsed(&mut rng, len);
            if let Ok(p) = classify(&buf[..len]) {
                if rng.below(2) == 0 {
                    parsed = p;
                }
            }
            let _ = check_mtu(&parsed, rng.next_u64() as u16);
            if let Some(n) = packet_too_big(&mut buf[..len], &parsed, 1280, OUR_MAC) {
                assert!(n <= len);
            }
        }
        assert!(
            encapsulated > 500,
            "the fuzz reaches encapsulation: {encapsulated}"
        );
    }
}
