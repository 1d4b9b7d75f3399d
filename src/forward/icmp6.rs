//! ICMPv6 errors about IPv6 sessions, and ICMP errors across NAT64: what an error
//! quotes is read ([`parse_error_v6`]), then translated so each party sees its own
//! addressing, as [`super::icmp`] does for IPv4.
//!
//! - NAT and FullNAT v6 ([`nat_translate_error_v6`]): the outer addresses, the quoted
//!   packet's addresses and ports, its TCP/UDP checksum when the quote holds it (UDP
//!   always, TCP from 18 quoted bytes; a UDP checksum of 0 stays 0), and the ICMPv6
//!   checksum over the new pseudo-header. The quoted checksum is updated as Linux's
//!   netfilter NAT updates an embedded header, not left as IPVS leaves it: the receiver
//!   then sees a quote consistent with the packet it sent.
//! - NAT64 from the real server's side ([`icmp4_to_icmp6`], RFC 7915 sections 4.2
//!   and 4.3): an ICMPv4 error about a translated packet becomes an ICMPv6 error to
//!   the client about the packet it sent, both IP headers translated.
//! - NAT64 from the client's side ([`icmp6_to_icmp4`], RFC 7915 sections 5.2 and
//!   5.3): an ICMPv6 error about a reply becomes an ICMPv4 error to the real server.
//!
//! Types and codes that RFC 7915 does not map are refused (`IcmpUntranslatable`).
//! Extension headers of the quoted packet are walked within the same bound as any
//! packet's ([`ipv6::walk_extension_headers`]); a translation to IPv4 drops them.
//! Every function checks the frame against what it was given and never panics.

use core::ops::Range;
use std::net::{Ipv4Addr, Ipv6Addr};

use super::icmp::IcmpErrorQuote;
use crate::flow::parse::{ext_header_drop, Ipv6Payload, PacketKind, Parsed};
use crate::flow::FlowKey6;
use crate::model::{DropReason, Protocol};
use crate::wire::{checksum, icmp, icmpv6, ipv4, ipv6, tcp, udp, EtherType, IpProtocol};

/// An ICMPv4 error translated into ICMPv6 grows by this much: both IPv4 headers
/// become IPv6 ones (the headroom [`icmp4_to_icmp6`] needs).
pub const NAT64_ERROR_GROWTH: usize = 2 * (ipv6::HEADER_LEN - ipv4::MIN_HEADER_LEN);
/// Bytes of the quoted L4 header and data an ICMPv6 error carries at most: the whole
/// error within the IPv6 minimum MTU (RFC 4443 2.4(c)).
const MAX_QUOTED_L4: usize = icmpv6::MAX_QUOTED_LEN - ipv6::HEADER_LEN;
/// Above this many bytes a translated IPv4 header has DF set (RFC 7915 5.1).
const DF_ABOVE: usize = ipv6::MIN_MTU - (ipv6::HEADER_LEN - ipv4::MIN_HEADER_LEN);
/// RFC 1191's MTU plateaus, for a frag-needed without a next-hop MTU (RFC 7915 4.2).
const PLATEAUS: [u16; 10] = [32000, 17914, 8166, 4352, 2002, 1492, 1006, 508, 296, 68];

/// Where an ICMPv6 error's quoted packet lies in the frame, and its 5-tuple.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Icmp6ErrorQuote {
    /// The quoted packet's 5-tuple as it was sent.
    pub key: FlowKey6,
    pub icmp_type: icmpv6::Message,
    pub code: u8,
    /// Offset of the quoted IPv6 header in the frame.
    pub ip: usize,
    /// Offset of the quoted TCP/UDP header, past its extension headers (at least 8
    /// bytes of it are present).
    pub l4: usize,
    /// End of the ICMPv6 message (and of the outer packet) in the frame.
    pub end: usize,
}

/// Reads an ICMPv6 error (destination unreachable, packet too big, time exceeded,
/// parameter problem) quoting a TCP or UDP packet with at least 8 bytes of its L4
/// header, past at most [`ipv6::MAX_EXTENSION_HEADERS`] extension headers. The
/// ICMPv6 checksum is not checked here.
///
/// Errors: `IcmpErrorNoSession` for what no session can be about (another message
/// type, another quoted protocol); `Truncated` for a message or quote cut short (or
/// a `parsed` that is not `frame`'s); `BadIpv6Header` for a quote that is not IPv6;
/// the extension-header reasons of [`classify`](crate::flow::parse::classify) for a
/// quoted chain that is too long, cut short or malformed.
pub fn parse_error_v6(frame: &[u8], parsed: &Parsed) -> Result<Icmp6ErrorQuote, DropReason> {
    if !matches!(parsed.kind, PacketKind::Ipv6(Ipv6Payload::Icmp { .. })) {
        return Err(DropReason::UnsupportedProtocol);
    }
    let end = parsed.ip_end();
    if parsed.l4 < parsed.l3 + ipv6::HEADER_LEN {
        return Err(DropReason::Truncated);
    }
    let message = frame.get(parsed.l4..end).ok_or(DropReason::Truncated)?;
    let message = icmpv6::Packet::new_checked(message).map_err(|_| DropReason::Truncated)?;
    let icmp_type = message.msg_type();
    if !matches!(
        icmp_type,
        icmpv6::Message::DEST_UNREACHABLE
            | icmpv6::Message::PACKET_TOO_BIG
            | icmpv6::Message::TIME_EXCEEDED
            | icmpv6::Message::PARAMETER_PROBLEM
    ) {
        return Err(DropReason::IcmpErrorNoSession);
    }
    // The quoted payload length describes the original packet, not the quote.
    let quoted = message.data();
    if quoted.len() < ipv6::HEADER_LEN {
        return Err(DropReason::Truncated);
    }
    let inner = ipv6::Packet::new_unchecked(quoted);
    if inner.version() != 6 {
        return Err(DropReason::BadIpv6Header);
    }
    let upper = ipv6::walk_extension_headers(inner.next_header(), &quoted[ipv6::HEADER_LEN..])
        .map_err(ext_header_drop)?;
    let proto =
        Protocol::from_ip_protocol(upper.protocol.0).ok_or(DropReason::IcmpErrorNoSession)?;
    let l4_at = ipv6::HEADER_LEN + upper.offset;
    let ports = quoted.get(l4_at..l4_at + 8).ok_or(DropReason::Truncated)?;
    let port = |at: usize| u16::from_be_bytes([ports[at], ports[at + 1]]);
    let ip = parsed.l4 + icmpv6::HEADER_LEN;
    Ok(Icmp6ErrorQuote {
        key: FlowKey6 {
            src: inner.src_addr(),
            dst: inner.dst_addr(),
            sport: port(0),
            dport: port(2),
            proto,
        },
        icmp_type,
        code: message.msg_code(),
        ip,
        l4: ip + l4_at,
        end,
    })
}

/// What [`nat_translate_error_v6`] changes; `None` leaves a field alone. Outer fields
/// are the ICMPv6 packet's own addresses; inner ones the quoted packet's address and
/// port.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuoteRewrite6 {
    pub outer_src: Option<Ipv6Addr>,
    pub outer_dst: Option<Ipv6Addr>,
    pub inner_src: Option<(Ipv6Addr, u16)>,
    pub inner_dst: Option<(Ipv6Addr, u16)>,
}

/// The ICMPv6 message of `parsed` verifies over the pseudo-header of its outer
/// addresses.
fn verify_icmpv6(frame: &[u8], parsed: &Parsed, end: usize) -> Result<(), DropReason> {
    let ip = ipv6::Packet::new_unchecked(&frame[parsed.l3..parsed.l3 + ipv6::HEADER_LEN]);
    let message = icmpv6::Packet::new_unchecked(&frame[parsed.l4..end]);
    if message.verify_checksum(ip.src_addr(), ip.dst_addr()) {
        Ok(())
    } else {
        Err(DropReason::BadIcmpv6Checksum)
    }
}

/// Translates an ICMPv6 error for IPv6 NAT or FullNAT in place (see the module doc).
/// MACs are the caller's. The ICMPv6 checksum is verified first, so a corrupt error
/// is dropped rather than laundered by the recompute.
///
/// Errors, with the frame unmodified: `BadIcmpv6Checksum`; `Truncated` when `parsed`
/// and `quote` do not describe `frame`.
pub fn nat_translate_error_v6(
    frame: &mut [u8],
    parsed: &Parsed,
    quote: &Icmp6ErrorQuote,
    rewrite: &QuoteRewrite6,
) -> Result<(), DropReason> {
    if parse_error_v6(frame, parsed).as_ref() != Ok(quote) {
        return Err(DropReason::Truncated);
    }
    // parse_error_v6 checked: l3 + 40 <= l4, l4 + 8 + 40 <= quote.l4,
    // quote.l4 + 8 <= quote.end == the outer packet's end <= frame.len().
    verify_icmpv6(frame, parsed, quote.end)?;
    let mut outer = ipv6::Packet::new_unchecked(&mut frame[parsed.l3..parsed.l4]);
    if let Some(addr) = rewrite.outer_src {
        outer.set_src_addr(addr);
    }
    if let Some(addr) = rewrite.outer_dst {
        outer.set_dst_addr(addr);
    }
    let (src, dst) = (outer.src_addr(), outer.dst_addr());
    let mut inner = ipv6::Packet::new_unchecked(&mut frame[quote.ip..quote.l4]);
    if let Some((addr, _)) = rewrite.inner_src {
        inner.set_src_addr(addr);
    }
    if let Some((addr, _)) = rewrite.inner_dst {
        inner.set_dst_addr(addr);
    }
    let (old_src, old_dst) = (quote.key.src, quote.key.dst);
    let segment = &mut frame[quote.l4..quote.end];
    macro_rules! rewrite_l4 {
        ($segment:expr, $has_checksum:expr) => {{
            let mut segment = $segment;
            let has_checksum = $has_checksum;
            if let Some((addr, port)) = rewrite.inner_src {
                if has_checksum {
                    segment.update_checksum128(old_src, addr);
                    segment.update_checksum16(segment.src_port(), port);
                }
                segment.set_src_port(port);
            }
            if let Some((addr, port)) = rewrite.inner_dst {
                if has_checksum {
                    segment.update_checksum128(old_dst, addr);
                    segment.update_checksum16(segment.dst_port(), port);
                }
                segment.set_dst_port(port);
            }
        }};
    }
    match quote.key.proto {
        Protocol::Udp => {
            // Within the 8 quoted bytes; 0 (invalid in IPv6) is left as it came.
            let has_checksum = udp::Packet::new_unchecked(&*segment).checksum() != 0;
            rewrite_l4!(udp::Packet::new_unchecked(segment), has_checksum)
        }
        Protocol::Tcp => {
            // Bytes 16..18: a quote of the first 8 bytes leaves it out.
            let has_checksum = segment.len() >= 18;
            rewrite_l4!(tcp::Packet::new_unchecked(segment), has_checksum)
        }
    }
    icmpv6::Packet::new_unchecked(&mut frame[parsed.l4..quote.end]).fill_checksum(src, dst);
    Ok(())
}

/// The addresses and ports of a NAT64 error's translation: the outer source and
/// destination, the quoted packet's source and destination.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Nat64Ends<A> {
    pub outer_src: A,
    pub outer_dst: A,
    pub inner_src: (A, u16),
    pub inner_dst: (A, u16),
}

/// ICMPv4 type, code and second header word as ICMPv6 ones (RFC 7915 4.2); `None`
/// for what the RFC drops. `quoted_len` is the quoted header's total length (for
/// a frag-needed without MTU), `link_mtu` the IPv6 next hop's MTU.
fn map_v4_to_v6(
    icmp_type: icmp::Message,
    code: u8,
    rest: [u8; 4],
    quoted_len: u16,
    link_mtu: u16,
) -> Option<(icmpv6::Message, u8, u32)> {
    use icmpv6::unreachable as u6;
    use icmpv6::Message as M6;
    let unreachable = |code| Some((M6::DEST_UNREACHABLE, code, 0));
    match (icmp_type, code) {
        (icmp::Message::DEST_UNREACHABLE, 0 | 1 | 5..=8 | 11 | 12) => unreachable(u6::NO_ROUTE),
        (icmp::Message::DEST_UNREACHABLE, 9 | 10 | 13 | 15) => {
            unreachable(u6::ADMIN_PROHIBITED)
        }
        (icmp::Message::DEST_UNREACHABLE, 3) => unreachable(u6::PORT),
        // Protocol unreachable: an unrecognized next header, pointing at it.
        (icmp::Message::DEST_UNREACHABLE, 2) => Some((M6::PARAMETER_PROBLEM, 1, 6)),
        (icmp::Message::DEST_UNREACHABLE, icmp::CODE_FRAG_NEEDED) => {
            let mut mtu = u16::from_be_bytes([rest[2], rest[3]]);
            if mtu == 0 {
                // A router before RFC 1191: the greatest plateau below the length.
                mtu = PLATEAUS.into_iter().find(|&p| p < quoted_len).unwrap_or(68);
            }
            let mtu = (u32::from(mtu) + 20).min(u32::from(link_mtu));
            Some((M6::PACKET_TOO_BIG, 0, mtu))
        }
        (icmp::Message::TIME_EXCEEDED, _) => Some((M6::TIME_EXCEEDED, code, 0)),
        (icmp::Message::PARAMETER_PROBLEM, 0 | 2) => {
            let pointer = match rest[0] {
                0 => 0,
                1 => 1,
                2 | 3 => 4,
                8 => 7,
                9 => 6,
                12..=15 => 8,
                16..=19 => 24,
                _ => return None,
            };
            Some((M6::PARAMETER_PROBLEM, 0, pointer))
        }
        _ => None,
    }
}

/// ICMPv6 type, code and second header word as ICMPv4 ones (RFC 7915 5.2); `None`
/// for what the RFC drops. `link_mtu` is the IPv4 next hop's MTU.
fn map_v6_to_v4(
    icmp_type: icmpv6::Message,
    code: u8,
    param: u32,
    link_mtu: u16,
) -> Option<(icmp::Message, u8, [u8; 4])> {
    use icmp::Message as M4;
    let unreachable = |code| Some((M4::DEST_UNREACHABLE, code, [0; 4]));
    match (icmp_type, code) {
        (icmpv6::Message::DEST_UNREACHABLE, 0 | 2 | 3) => unreachable(1),
        (icmpv6::Message::DEST_UNREACHABLE, 1) => unreachable(10),
        (icmpv6::Message::DEST_UNREACHABLE, 4) => unreachable(3),
        (icmpv6::Message::PACKET_TOO_BIG, _) => {
            let mtu = param.saturating_sub(20).min(u32::from(link_mtu)) as u16;
            let [hi, lo] = mtu.to_be_bytes();
            Some((M4::DEST_UNREACHABLE, icmp::CODE_FRAG_NEEDED, [0, 0, hi, lo]))
        }
        (icmpv6::Message::TIME_EXCEEDED, _) => Some((M4::TIME_EXCEEDED, code, [0; 4])),
        (icmpv6::Message::PARAMETER_PROBLEM, 0) => {
            let pointer = match param {
                0 => 0,
                1 => 1,
                4 | 5 => 2,
                6 => 9,
                7 => 8,
                8..=23 => 12,
                24..=39 => 16,
                _ => return None,
            };
            Some((M4::PARAMETER_PROBLEM, 0, [pointer, 0, 0, 0]))
        }
        // Unrecognized next header: protocol unreachable.
        (icmpv6::Message::PARAMETER_PROBLEM, 1) => unreachable(2),
        _ => None,
    }
}

/// The folded sum of some address bytes: their share of a pseudo-header sum.
fn words(bytes: &[u8]) -> u16 {
    checksum::fold(checksum::sum(bytes))
}

/// Updates the quoted L4 header `segment` of protocol `proto` for new pseudo-header
/// addresses (`old` and `new` their folded sums) and ports, when the quote holds the
/// checksum (UDP's unless 0, TCP's from 18 bytes). The pseudo-headers of IPv4 and
/// IPv6 carry the same protocol and length, so only the addresses differ.
fn requote(segment: &mut [u8], proto: Protocol, old: u16, new: u16, ports: (u16, u16)) {
    let at = match proto {
        Protocol::Udp => 6,
        Protocol::Tcp => 16,
    };
    let sum = segment
        .get(at..at + 2)
        .map(|b| u16::from_be_bytes([b[0], b[1]]));
    let sum = sum.filter(|&s| proto == Protocol::Tcp || s != 0);
    let mut sum = sum.map(|s| checksum::update16(s, old, new));
    for (at, port) in [(0, ports.0), (2, ports.1)] {
        let was = u16::from_be_bytes([segment[at], segment[at + 1]]);
        sum = sum.map(|s| checksum::update16(s, was, port));
        segment[at..at + 2].copy_from_slice(&port.to_be_bytes());
    }
    if let Some(mut s) = sum {
        if proto == Protocol::Udp && s == 0 {
            s = 0xffff;
        }
        segment[at..at + 2].copy_from_slice(&s.to_be_bytes());
    }
}

/// NAT64, an ICMPv4 error from the real server's side about a packet Sluice
/// translated (LIP:lport -> RS:rport): translated in place into the ICMPv6 error the
/// client's kernel expects (RFC 7915 4.2 and 4.3), from `ends.outer_src` to
/// `ends.outer_dst`, quoting an IPv6 packet from `ends.inner_src` to
/// `ends.inner_dst`. `buf` holds [`NAT64_ERROR_GROWTH`] bytes of headroom, then the
/// received frame `parsed` and `quote` describe; the L2 header moves to the front
/// (EtherType IPv6). IP options, outer or quoted, are dropped; hop limits are the
/// TTLs as they came; the quote is cut to keep the error within 1280 bytes. A
/// frag-needed becomes a Packet Too Big announcing its MTU plus 20, at most
/// `link_mtu`. Returns the new frame length.
///
/// Errors, with `buf` unmodified: `BadIcmpChecksum`; `IcmpUntranslatable` for a type
/// or code RFC 7915 drops; `Truncated` for short headroom or a `parsed` or `quote`
/// that do not describe the frame.
pub fn icmp4_to_icmp6(
    buf: &mut [u8],
    parsed: &Parsed,
    quote: &IcmpErrorQuote,
    ends: &Nat64Ends<Ipv6Addr>,
    link_mtu: u16,
) -> Result<usize, DropReason> {
    let growth = NAT64_ERROR_GROWTH;
    let frame = buf.get(growth..).ok_or(DropReason::Truncated)?;
    let (l3, l4) = (parsed.l3, parsed.l4);
    if super::parse_error(frame, parsed).as_ref() != Some(quote) || l3 < 14 {
        return Err(DropReason::Truncated);
    }
    // parse_error checked: l3 + 20 <= l4, l4 + 8 <= quote.ip, quote.ip + 20 <=
    // quote.l4, quote.l4 + 8 <= quote.end <= frame.len().
    if checksum::fold(checksum::sum(&frame[l4..quote.end])) != 0xffff {
        return Err(DropReason::BadIcmpChecksum);
    }
    let outer = ipv4::Packet::new_unchecked(&frame[l3..l4]);
    let (outer_class, outer_hops) = ((outer.dscp() << 2) | outer.ecn(), outer.ttl());
    let inner = ipv4::Packet::new_unchecked(&frame[quote.ip..quote.l4]);
    let (class, hops, total) = ((inner.dscp() << 2) | inner.ecn(), inner.ttl(), inner.total_len());
    let inner_payload = usize::from(total).saturating_sub(inner.header_len());
    let rest: [u8; 4] = frame[l4 + 4..l4 + 8].try_into().expect("4 bytes");
    let (t6, c6, param) = map_v4_to_v6(quote.icmp_type, quote.code, rest, total, link_mtu)
        .ok_or(DropReason::IcmpUntranslatable)?;
    let old = words(&frame[quote.ip + 12..quote.ip + 20]);
    let quote_len = (quote.end - quote.l4).min(MAX_QUOTED_L4);

    // New layout from l3 in buf: IPv6 (40), ICMPv6 (8), quoted IPv6 (40), L4 quote.
    // The quote's L4 bytes sit at growth + quote.l4 >= l3 + 88, so they move back or
    // stay, and the headers are written over what was read above.
    let (icmp_at, inner_at, l4_at) = (l3 + 40, l3 + 48, l3 + 88);
    let from = growth + quote.l4;
    buf.copy_within(from..from + quote_len, l4_at);
    buf.copy_within(growth..growth + l3, 0);
    buf[l3 - 2..l3].copy_from_slice(&EtherType::IPV6.0.to_be_bytes());
    let end = l4_at + quote_len;

    let mut packet = ipv6::Packet::new_unchecked(&mut buf[l3..icmp_at]);
    ipv6::Repr {
        src_addr: ends.outer_src,
        dst_addr: ends.outer_dst,
        next_header: IpProtocol::ICMPV6,
        payload_len: end - icmp_at,
        hop_limit: outer_hops,
    }
    .emit(&mut packet);
    packet.set_traffic_class(outer_class);
    let mut packet = ipv6::Packet::new_unchecked(&mut buf[inner_at..l4_at]);
    ipv6::Repr {
        src_addr: ends.inner_src.0,
        dst_addr: ends.inner_dst.0,
        next_header: IpProtocol(quote.key.proto as u8),
        payload_len: inner_payload,
        hop_limit: hops,
    }
    .emit(&mut packet);
    packet.set_traffic_class(class);
    let new = words(&buf[inner_at + 8..l4_at]);
    let ports = (ends.inner_src.1, ends.inner_dst.1);
    requote(&mut buf[l4_at..end], quote.key.proto, old, new, ports);

    let mut message = icmpv6::Packet::new_unchecked(&mut buf[icmp_at..end]);
    message.set_msg_type(t6);
    message.set_msg_code(c6);
    message.set_param(param);
    message.fill_checksum(ends.outer_src, ends.outer_dst);
    Ok(end)
}

/// NAT64, an ICMPv6 error from the client's side about a reply Sluice translated
/// (VIP:vport -> client:cport): translated in place into the ICMPv4 error the real
/// server's kernel expects (RFC 7915 5.2 and 5.3), from `ends.outer_src` to
/// `ends.outer_dst` (identification `ident`), quoting an IPv4 packet from
/// `ends.inner_src` to `ends.inner_dst`. The IPv4 headers are written just before
/// the quoted L4 header, extension headers dropped, and the L2 header (EtherType
/// IPv4) moves up to meet them. A Packet Too Big becomes a frag-needed announcing
/// its MTU minus 20, at most `link_mtu`. Returns where the new frame lies in `frame`.
///
/// Errors, with the frame unmodified: `BadIcmpv6Checksum`; `IcmpUntranslatable` for
/// a type or code RFC 7915 drops; `Truncated` for a `parsed` or `quote` that do not
/// describe the frame.
pub fn icmp6_to_icmp4(
    frame: &mut [u8],
    parsed: &Parsed,
    quote: &Icmp6ErrorQuote,
    ends: &Nat64Ends<Ipv4Addr>,
    link_mtu: u16,
    ident: u16,
) -> Result<Range<usize>, DropReason> {
    let (l3, l4) = (parsed.l3, parsed.l4);
    if parse_error_v6(frame, parsed).as_ref() != Ok(quote) || l3 < 14 {
        return Err(DropReason::Truncated);
    }
    verify_icmpv6(frame, parsed, quote.end)?;
    let outer = ipv6::Packet::new_unchecked(&frame[l3..l3 + ipv6::HEADER_LEN]);
    let (outer_class, outer_hops) = (outer.traffic_class(), outer.hop_limit());
    let inner = ipv6::Packet::new_unchecked(&frame[quote.ip..quote.ip + ipv6::HEADER_LEN]);
    let (class, hops) = (inner.traffic_class(), inner.hop_limit());
    // The original's upper-layer length: its payload less the extension headers.
    let ext_len = quote.l4 - quote.ip - ipv6::HEADER_LEN;
    let inner_payload = usize::from(inner.payload_len()).saturating_sub(ext_len);
    let message = icmpv6::Packet::new_unchecked(&frame[l4..quote.end]);
    let (t4, c4, rest) = map_v6_to_v4(quote.icmp_type, quote.code, message.mtu(), link_mtu)
        .ok_or(DropReason::IcmpUntranslatable)?;
    let old = words(&frame[quote.ip + 8..quote.ip + 40]);

    // New layout, ending where the L4 quote ends: IPv4 (20), ICMP (8), quoted IPv4
    // (20), then the L4 quote where it is; parse_error_v6 put that at l3 + 88 or
    // later, so the L2 header moves forward.
    let inner_at = quote.l4 - ipv4::MIN_HEADER_LEN;
    let icmp_at = inner_at - icmp::HEADER_LEN;
    let new_l3 = icmp_at - ipv4::MIN_HEADER_LEN;
    let start = new_l3 - l3;
    let mut new_addrs = [0u8; 8];
    new_addrs[..4].copy_from_slice(&ends.inner_src.0.octets());
    new_addrs[4..].copy_from_slice(&ends.inner_dst.0.octets());
    let ports = (ends.inner_src.1, ends.inner_dst.1);
    requote(&mut frame[quote.l4..quote.end], quote.key.proto, old, words(&new_addrs), ports);

    let total = ipv4::MIN_HEADER_LEN + inner_payload;
    let mut packet = ipv4::Packet::new_unchecked(&mut frame[inner_at..quote.l4]);
    ipv4::Repr {
        src_addr: ends.inner_src.0,
        dst_addr: ends.inner_dst.0,
        protocol: IpProtocol(quote.key.proto as u8),
        payload_len: inner_payload,
        ttl: hops,
    }
    .emit(&mut packet);
    packet.set_dscp_ecn(class >> 2, class & 3);
    packet.set_fragmentation(total > DF_ABOVE, false, 0);
    packet.fill_checksum();

    frame[icmp_at] = t4.0;
    frame[icmp_at + 1] = c4;
    frame[icmp_at + 4..icmp_at + 8].copy_from_slice(&rest);
    icmp::Packet::new_unchecked(&mut frame[icmp_at..quote.end]).fill_checksum();

    let mut packet = ipv4::Packet::new_unchecked(&mut frame[new_l3..icmp_at]);
    ipv4::Repr {
        src_addr: ends.outer_src,
        dst_addr: ends.outer_dst,
        protocol: IpProtocol::ICMP,
        payload_len: quote.end - icmp_at,
        ttl: outer_hops,
    }
    .emit(&mut packet);
    packet.set_dscp_ecn(outer_class >> 2, outer_class & 3);
    packet.set_ident(ident);
    packet.set_fragmentation(false, false, 0);
    packet.fill_checksum();

    frame.copy_within(0..l3, start);
    frame[new_l3 - 2..new_l3].copy_from_slice(&EtherType::IPV4.0.to_be_bytes());
    Ok(start..quote.end)
}
