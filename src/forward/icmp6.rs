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

impl Icmp6ErrorQuote {
    /// A Packet Too Big about a UDP datagram: as [`crate::forward::IcmpErrorQuote::too_big_about_udp`]
    /// (an IPv6 sender fragments what its path MTU no longer carries).
    pub fn too_big_about_udp(&self) -> bool {
        self.key.proto == Protocol::Udp && self.icmp_type == icmpv6::Message::PACKET_TOO_BIG
    }
}

/// Reads an ICMPv6 error (destination unreachable, packet too big, time exceeded,
/// parameter problem) quoting a TCP or UDP packet with at least 8 bytes of its L4
/// header, past at most [`ipv6::MAX_EXTENSION_HEADERS`] extension headers. The
/// ICMPv6 checksum is not checked here.
///
/// Errors: `IcmpErrorNoSession` for what no session can be about (another message
/// type, another quoted protocol); `IcmpErrorMisaddressed` for an error not addressed
/// to the quoted packet's source; `Truncated` for a message or quote cut short (or
/// a `parsed` that is not `frame`'s); `BadIpv6Header` for a quote that is not IPv6;
/// the extension-header reasons of [`classify`](crate::flow::parse::classify) for a
/// quoted chain that is too long, cut short or malformed.
pub fn parse_error_v6(frame: &[u8], parsed: &Parsed) -> Result<Icmp6ErrorQuote, DropReason> {
    if !matches!(parsed.kind, PacketKind::Ipv6(Ipv6Payload::Icmp { .. })) {
        return Err(DropReason::UnsupportedProtocol);
    }
    let end = parsed.ip_end();
    if parsed
        .l3
        .checked_add(ipv6::HEADER_LEN)
        .is_none_or(|at| parsed.l4 < at)
    {
        return Err(DropReason::Truncated);
    }
    let message = frame.get(parsed.l4..end).ok_or(DropReason::Truncated)?;
    let message = icmpv6::Packet::new_checked(message).map_err(|_| DropReason::Truncated)?;
    // An error comes from the one node that wrote it (RFC 4443 section 2.2); the
    // outer header lies whole before `l4` (checked above). `classify` has dropped
    // multicast and loopback sources; the unspecified one it lets on, for probes.
    if ipv6::is_martian_source(ipv6::Packet::new_unchecked(&frame[parsed.l3..]).src_addr()) {
        return Err(DropReason::MartianSource);
    }
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
    // Every sender addresses an error to the source of the packet it quotes (checked
    // above: the outer header lies whole before `l4`).
    if ipv6::Packet::new_unchecked(&frame[parsed.l3..]).dst_addr() != inner.src_addr() {
        return Err(DropReason::IcmpErrorMisaddressed);
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
        (icmp::Message::DEST_UNREACHABLE, 9 | 10 | 13 | 15) => unreachable(u6::ADMIN_PROHIBITED),
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
            // No IPv6 link is narrower than 1280 (RFC 8201 section 4: a smaller MTU
            // is read as 1280), and the IPv4 real server keeps one path MTU for
            // every client behind the local address (`SHARED_PATH_MIN_MTU`).
            let param = param.max(ipv6::MIN_MTU as u32);
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
    let (class, hops, total) = (
        (inner.dscp() << 2) | inner.ecn(),
        inner.ttl(),
        inner.total_len(),
    );
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
    // The original's upper-layer length: its payload less the extension headers,
    // capped where an IPv4 total length ends (an IPv6 payload of up to 65535 bytes
    // plus a 20-byte IPv4 header would otherwise wrap).
    let ext_len = quote.l4 - quote.ip - ipv6::HEADER_LEN;
    let inner_payload = usize::from(inner.payload_len())
        .saturating_sub(ext_len)
        .min(usize::from(u16::MAX) - ipv4::MIN_HEADER_LEN);
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
    requote(
        &mut frame[quote.l4..quote.end],
        quote.key.proto,
        old,
        words(&new_addrs),
        ports,
    );

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::parse::classify;
    use crate::forward::parse_error;
    use crate::forward::test_util::{random_parsed, sums_to_ones};
    use crate::wire::test_util::{run_scapy, unhex, XorShift};
    use std::collections::HashMap;
    use std::sync::OnceLock;

    const CLIENT: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x18, 0, 0, 0, 0, 2);
    const VIP: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x18, 0, 0, 0, 0, 0x100);
    const RS: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x1a, 0, 0, 0, 0, 0x11);
    const LIP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0x1a, 0, 0, 0, 0, 0x50);
    const RS4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 11);
    const LIP4: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 50);

    /// The frames, each error as it arrives and (for those translated) the frame
    /// scapy builds for what the receiver should get, by name. Built once per run by
    /// scapy 2.5 (every length and checksum scapy's).
    const FIXTURES: &str = r#"from scapy.all import Ether, IP, ICMP, TCP, UDP, Raw, raw
from scapy.layers.inet6 import IPv6, IPv6ExtHdrHopByHop, ICMPv6DestUnreach, ICMPv6PacketTooBig, ICMPv6TimeExceeded, ICMPv6ParamProblem, ICMPv6EchoRequest, IPv6ExtHdrDestOpt
CLIENT, VIP, RS, LIP6, ROUTER6 = "2001:db8:18::2", "2001:db8:18::100", "2001:db8:1a::11", "2001:db8:1a::50", "2001:db8:1a::fe"
RS4, LIP4, ROUTER4 = "198.18.0.11", "198.18.0.50", "198.18.0.254"
E = Ether(dst="02:00:00:00:00:01", src="02:00:00:00:00:02")
def v6(src, dst, icmp, quote, hlim=60):
    return raw(E/IPv6(src=src, dst=dst, hlim=hlim)/icmp/Raw(quote)).hex()
def v4(src, dst, icmp, quote, ttl=62, tos=0xc0, id=7, flags=0):
    return raw(E/IP(src=src, dst=dst, ttl=ttl, tos=tos, id=id, flags=flags)/icmp/Raw(quote)).hex()
data = b"HTTP/1.1 200 OK\r\n" * 3
out = {}
# NAT, the real server's port unreachable about client:5353 -> RS:5300 (after DNAT).
q = raw(IPv6(src=CLIENT, dst=RS, hlim=63)/UDP(sport=5353, dport=5300)/b"query")
e = raw(IPv6(src=CLIENT, dst=VIP, hlim=63)/UDP(sport=5353, dport=53)/b"query")
out["nat_out"] = (v6(RS, CLIENT, ICMPv6DestUnreach(code=4), q), v6(VIP, CLIENT, ICMPv6DestUnreach(code=4), e))
# FullNAT, a router's Packet Too Big to LIP about LIP:1025 -> RS:8080, hop-by-hop inside.
seg = TCP(sport=1025, dport=8080, flags="PA", seq=1000, ack=2000)/data
q = raw(IPv6(src=LIP6, dst=RS)/IPv6ExtHdrHopByHop()/seg)
seg = TCP(sport=40000, dport=80, flags="PA", seq=1000, ack=2000)/data
e = raw(IPv6(src=CLIENT, dst=VIP)/IPv6ExtHdrHopByHop()/seg)
out["fullnat_out"] = (v6(ROUTER6, LIP6, ICMPv6PacketTooBig(mtu=1400), q), v6(VIP, CLIENT, ICMPv6PacketTooBig(mtu=1400), e))
# NAT, a router on the client's side: time exceeded about VIP:80 -> client:40000, 8 bytes of TCP.
q = raw(IPv6(src=VIP, dst=CLIENT)/TCP(sport=80, dport=40000, seq=77)/data)[:48]
e = raw(IPv6(src=RS, dst=CLIENT)/TCP(sport=8080, dport=40000, seq=77)/data)[:48]
out["nat_in"] = (v6("2001:db8:18::fe", VIP, ICMPv6TimeExceeded(), q), v6("2001:db8:18::fe", RS, ICMPv6TimeExceeded(), e))
# FullNAT, the client's port unreachable about VIP:53 -> client:5353.
q = raw(IPv6(src=VIP, dst=CLIENT)/UDP(sport=53, dport=5353)/b"answer")
e = raw(IPv6(src=RS, dst=LIP6)/UDP(sport=5300, dport=1025)/b"answer")
out["fullnat_in"] = (v6(CLIENT, VIP, ICMPv6DestUnreach(code=4), q), v6(LIP6, RS, ICMPv6DestUnreach(code=4), e))
# NAT64, the real server's port unreachable about LIP4:1030 -> RS4:5353.
q = raw(IP(src=LIP4, dst=RS4, ttl=63, tos=0x10, id=99)/UDP(sport=1030, dport=5353)/b"hello")
e = raw(IPv6(src=CLIENT, dst=VIP, hlim=63, tc=0x10)/UDP(sport=40001, dport=5353)/b"hello")
out["nat64_unreach"] = (v4(RS4, LIP4, ICMP(type=3, code=3), q), raw(E/IPv6(src=VIP, dst=CLIENT, hlim=62, tc=0xc0)/ICMPv6DestUnreach(code=4)/Raw(e)).hex())
# NAT64, a router's frag-needed (MTU 1400) about LIP4:1030 -> RS4:8080, DF.
seg = TCP(sport=1030, dport=8080, flags="PA", seq=5, ack=6)/data
q = raw(IP(src=LIP4, dst=RS4, flags="DF", id=3)/seg)
seg = TCP(sport=40002, dport=8080, flags="PA", seq=5, ack=6)/data
e = raw(IPv6(src=CLIENT, dst=VIP)/seg)
out["nat64_frag_needed"] = (v4(ROUTER4, LIP4, ICMP(type=3, code=4, nexthopmtu=1400), q), raw(E/IPv6(src=VIP, dst=CLIENT, hlim=62, tc=0xc0)/ICMPv6PacketTooBig(mtu=1420)/Raw(e)).hex())
# NAT64, the client's side: Packet Too Big (1280) about VIP:8080 -> client:40002.
seg = TCP(sport=8080, dport=40002, flags="A", seq=9, ack=10)/data
q = raw(IPv6(src=VIP, dst=CLIENT, hlim=61)/seg)
seg = TCP(sport=8080, dport=1030, flags="A", seq=9, ack=10)/data
e = raw(IP(src=RS4, dst=LIP4, ttl=61, id=0)/seg)
out["nat64_to_server"] = (v6("2001:db8:18::fe", VIP, ICMPv6PacketTooBig(mtu=1280), q, hlim=58), raw(E/IP(src=LIP4, dst=RS4, ttl=58, id=0x1234)/ICMP(type=3, code=4, nexthopmtu=1260)/Raw(e)).hex())
# NAT64, the client's parameter problem pointing at the hop limit (7 -> TTL, 8).
q = raw(IPv6(src=VIP, dst=CLIENT)/UDP(sport=5353, dport=40003)/b"x")
e = raw(IP(src=RS4, dst=LIP4, ttl=64, id=0)/UDP(sport=5353, dport=1031)/b"x")
out["nat64_param"] = (v6(CLIENT, VIP, ICMPv6ParamProblem(code=0, ptr=7), q), raw(E/IP(src=LIP4, dst=RS4, ttl=60, id=0x1234)/ICMP(type=12, code=0, ptr=8)/Raw(e)).hex())
# Malformed quotes (inputs only).
bad = {}
q = raw(IPv6(src=CLIENT, dst=RS, nh=60)/(IPv6ExtHdrDestOpt(nh=60)/IPv6ExtHdrDestOpt(nh=60)/IPv6ExtHdrDestOpt(nh=60)/IPv6ExtHdrDestOpt(nh=60)/IPv6ExtHdrDestOpt(nh=60)/IPv6ExtHdrDestOpt(nh=60)/IPv6ExtHdrDestOpt(nh=17))/UDP(sport=1, dport=2))
bad["too_many"] = v6(RS, CLIENT, ICMPv6DestUnreach(code=4), q)
q = raw(IPv6(src=CLIENT, dst=RS)/IPv6ExtHdrDestOpt()/UDP(sport=1, dport=2))
bad["ext_cut"] = v6(RS, CLIENT, ICMPv6DestUnreach(code=4), q[:44])
bad["ports_cut"] = v6(RS, CLIENT, ICMPv6DestUnreach(code=4), raw(IPv6(src=CLIENT, dst=RS)/UDP(sport=1, dport=2))[:46])
bad["header_cut"] = v6(RS, CLIENT, ICMPv6DestUnreach(code=4), raw(IPv6(src=CLIENT, dst=RS))[:39])
bad["not_v6"] = v6(RS, CLIENT, ICMPv6DestUnreach(code=4), raw(IP(src=RS4, dst=LIP4)/UDP(sport=1, dport=2)) + bytes(40))
bad["echo_quoted"] = v6(RS, CLIENT, ICMPv6DestUnreach(code=4), raw(IPv6(src=CLIENT, dst=RS)/ICMPv6EchoRequest()))
for k, (a, b) in out.items():
    print(k, a, b)
for k, a in bad.items():
    print(k, a, "-")"#;

    /// Each fixture's input frame and expected output (empty when none), by name.
    type Fixtures = HashMap<String, (Vec<u8>, Vec<u8>)>;

    fn fixtures() -> &'static Fixtures {
        static CELL: OnceLock<Fixtures> = OnceLock::new();
        CELL.get_or_init(|| {
            run_scapy(FIXTURES)
                .lines()
                .map(|line| {
                    let mut fields = line.split(' ');
                    let name = fields.next().unwrap().to_string();
                    let input = unhex(fields.next().unwrap());
                    let expected = unhex(fields.next().unwrap_or(""));
                    (name, (input, expected))
                })
                .collect()
        })
    }

    fn fixture(name: &str) -> (Vec<u8>, Vec<u8>) {
        fixtures()[name].clone()
    }

    fn nat(name: &str, rewrite: QuoteRewrite6) -> Result<Vec<u8>, DropReason> {
        let (mut buf, _) = fixture(name);
        let parsed = classify(&buf).unwrap();
        let quote = parse_error_v6(&buf, &parsed)?;
        let before = buf.clone();
        let result = nat_translate_error_v6(&mut buf, &parsed, &quote, &rewrite);
        if result.is_err() {
            assert_eq!(buf, before, "{name}: unmodified when refused");
        }
        result.map(|()| buf)
    }

    fn to_v6(input: &[u8], ends: &Nat64Ends<Ipv6Addr>, mtu: u16) -> Result<Vec<u8>, DropReason> {
        let parsed = classify(input).unwrap();
        let quote = parse_error(input, &parsed).unwrap();
        let mut buf = vec![0u8; NAT64_ERROR_GROWTH];
        buf.extend_from_slice(input);
        let before = buf.clone();
        let result = icmp4_to_icmp6(&mut buf, &parsed, &quote, ends, mtu);
        if result.is_err() {
            assert_eq!(buf, before, "unmodified when refused");
        }
        result.map(|len| buf[..len].to_vec())
    }

    fn to_v4(input: &[u8], ends: &Nat64Ends<Ipv4Addr>, mtu: u16) -> Result<Vec<u8>, DropReason> {
        let mut buf = input.to_vec();
        let parsed = classify(&buf).unwrap();
        let quote = parse_error_v6(&buf, &parsed)?;
        let result = icmp6_to_icmp4(&mut buf, &parsed, &quote, ends, mtu, 0x1234);
        if result.is_err() {
            assert_eq!(buf, input, "unmodified when refused");
        }
        result.map(|range| buf[range].to_vec())
    }

    const TO_CLIENT: Nat64Ends<Ipv6Addr> = Nat64Ends {
        outer_src: VIP,
        outer_dst: CLIENT,
        inner_src: (CLIENT, 40001),
        inner_dst: (VIP, 5353),
    };

    fn to_server(cport: u16) -> Nat64Ends<Ipv4Addr> {
        Nat64Ends {
            outer_src: LIP4,
            outer_dst: RS4,
            inner_src: (RS4, if cport == 40002 { 8080 } else { 5353 }),
            inner_dst: (LIP4, if cport == 40002 { 1030 } else { 1031 }),
        }
    }

    #[test]
    fn parse_reads_the_quoted_tuple_past_extension_headers() {
        let (buf, _) = fixture("fullnat_out");
        let parsed = classify(&buf).unwrap();
        let quote = parse_error_v6(&buf, &parsed).unwrap();
        assert_eq!(
            quote.key,
            FlowKey6 {
                src: LIP6,
                dst: RS,
                sport: 1025,
                dport: 8080,
                proto: Protocol::Tcp
            }
        );
        assert_eq!(quote.icmp_type, icmpv6::Message::PACKET_TOO_BIG);
        // Ethernet 14 + IPv6 40 + ICMPv6 8; the quote's hop-by-hop header is 8.
        assert_eq!((quote.ip, quote.l4, quote.end), (62, 110, buf.len()));
    }

    #[test]
    fn malformed_quotes_are_dropped_each_for_its_reason() {
        for (name, reason) in [
            ("too_many", DropReason::Ipv6TooManyExtHeaders),
            ("ext_cut", DropReason::Ipv6ExtHeaderTruncated),
            ("ports_cut", DropReason::Truncated),
            ("header_cut", DropReason::Truncated),
            ("not_v6", DropReason::BadIpv6Header),
            ("echo_quoted", DropReason::IcmpErrorNoSession),
        ] {
            let (buf, _) = fixture(name);
            let parsed = classify(&buf).unwrap();
            assert_eq!(parse_error_v6(&buf, &parsed), Err(reason), "{name}");
        }
        // Addressed to another host than the quoted packet's source.
        let (mut buf, _) = fixture("nat_out");
        let parsed = classify(&buf).unwrap();
        assert!(parse_error_v6(&buf, &parsed).is_ok());
        buf[14 + 24 + 15] ^= 1;
        let parsed = classify(&buf).unwrap();
        assert_eq!(
            parse_error_v6(&buf, &parsed),
            Err(DropReason::IcmpErrorMisaddressed)
        );
        // From the unspecified address: no node wrote it.
        let (mut buf, _) = fixture("nat_out");
        buf[14 + 8..14 + 24].fill(0);
        let parsed = classify(&buf).unwrap();
        assert_eq!(
            parse_error_v6(&buf, &parsed),
            Err(DropReason::MartianSource)
        );
        // Not an error: an echo request, a redirect.
        let (mut buf, _) = fixture("nat_out");
        for t in [128u8, 137] {
            buf[54] = t;
            let parsed = classify(&buf).unwrap();
            assert_eq!(
                parse_error_v6(&buf, &parsed),
                Err(DropReason::IcmpErrorNoSession)
            );
        }
    }

    /// Each NAT and FullNAT case gives, byte for byte, the frame scapy builds for
    /// what the receiver should get: addresses and ports, the quoted TCP or UDP
    /// checksum (whole quotes) and the ICMPv6 checksum over the new pseudo-header.
    #[test]
    fn nat_and_fullnat_errors_become_the_frames_scapy_builds() {
        let cases = [
            (
                "nat_out",
                QuoteRewrite6 {
                    outer_src: Some(VIP),
                    inner_dst: Some((VIP, 53)),
                    ..QuoteRewrite6::default()
                },
            ),
            (
                "fullnat_out",
                QuoteRewrite6 {
                    outer_src: Some(VIP),
                    outer_dst: Some(CLIENT),
                    inner_src: Some((CLIENT, 40000)),
                    inner_dst: Some((VIP, 80)),
                },
            ),
            (
                "nat_in",
                QuoteRewrite6 {
                    outer_dst: Some(RS),
                    inner_src: Some((RS, 8080)),
                    ..QuoteRewrite6::default()
                },
            ),
            (
                "fullnat_in",
                QuoteRewrite6 {
                    outer_src: Some(LIP6),
                    outer_dst: Some(RS),
                    inner_src: Some((RS, 5300)),
                    inner_dst: Some((LIP6, 1025)),
                },
            ),
        ];
        for (name, rewrite) in cases {
            let out = nat(name, rewrite).unwrap();
            assert_eq!(hex(&out), hex(&fixture(name).1), "{name}");
        }
    }

    /// RFC 7915 4.2 and 4.3: an ICMPv4 port unreachable and frag-needed from the
    /// IPv4 side become the ICMPv6 port unreachable and Packet Too Big (MTU + 20)
    /// scapy builds, quoting the client's IPv6 packet; 5.2 and 5.3 the other way: a
    /// Packet Too Big (MTU - 20) and a parameter problem (the hop limit's pointer 7
    /// becomes the TTL's, 8) become ICMPv4 errors to the real server.
    #[test]
    fn nat64_errors_become_the_frames_scapy_builds() {
        let (input, expected) = fixture("nat64_unreach");
        assert_eq!(
            hex(&to_v6(&input, &TO_CLIENT, 1500).unwrap()),
            hex(&expected)
        );
        let (input, expected) = fixture("nat64_frag_needed");
        let ends = Nat64Ends {
            inner_src: (CLIENT, 40002),
            inner_dst: (VIP, 8080),
            ..TO_CLIENT
        };
        assert_eq!(hex(&to_v6(&input, &ends, 1500).unwrap()), hex(&expected));
        // The IPv6 link's MTU caps what is announced.
        let capped = to_v6(&input, &ends, 1410).unwrap();
        assert_eq!(icmpv6::Packet::new_unchecked(&capped[54..]).mtu(), 1410);
        let (input, expected) = fixture("nat64_to_server");
        assert_eq!(
            hex(&to_v4(&input, &to_server(40002), 1500).unwrap()),
            hex(&expected)
        );
        let (input, expected) = fixture("nat64_param");
        assert_eq!(
            hex(&to_v4(&input, &to_server(40003), 1500).unwrap()),
            hex(&expected)
        );
    }

    #[test]
    fn a_quoted_ipv6_length_past_what_ipv4_can_say_is_capped() {
        // The quoted packet's IPv6 payload length (bytes 4-5 of the quoted header,
        // at 62 in the frame) set past 65515: as an IPv4 total length it is 65535.
        let (input, _) = fixture("nat64_to_server");
        let router: Ipv6Addr = "2001:db8:18::fe".parse().unwrap();
        for (payload, total) in [(65515u16, 65535u16), (65516, 65535), (65535, 65535)] {
            let mut buf = input.clone();
            buf[66..68].copy_from_slice(&payload.to_be_bytes());
            icmpv6::Packet::new_unchecked(&mut buf[54..]).fill_checksum(router, VIP);
            let out = to_v4(&buf, &to_server(40002), 1500).unwrap();
            let quoted = ipv4::Packet::new_unchecked(&out[42..62]);
            assert_eq!(quoted.total_len(), total, "payload {payload}");
            assert!(quoted.verify_checksum(), "payload {payload}");
        }
    }

    #[test]
    fn untranslatable_and_corrupt_errors_are_refused_unchanged() {
        // ICMPv4 codes RFC 7915 drops: host precedence violation (14), and codes
        // past 15; a parameter problem pointing at the identification (4) or
        // missing a required option (code 1).
        let (input, _) = fixture("nat64_unreach");
        let with = |at: usize, value: u8| {
            let mut buf = input.clone();
            buf[at] = value;
            crate::wire::icmp::Packet::new_unchecked(&mut buf[34..]).fill_checksum();
            buf
        };
        for buf in [with(35, 14), with(35, 16), with(34, 4)] {
            let parsed = classify(&buf).unwrap();
            if parse_error(&buf, &parsed).is_none() {
                continue; // source quench is not read as an error about a session
            }
            assert_eq!(
                to_v6(&buf, &TO_CLIENT, 1500),
                Err(DropReason::IcmpUntranslatable)
            );
        }
        let mut param = with(34, 12);
        param[38] = 4;
        crate::wire::icmp::Packet::new_unchecked(&mut param[34..]).fill_checksum();
        assert_eq!(
            to_v6(&param, &TO_CLIENT, 1500),
            Err(DropReason::IcmpUntranslatable)
        );
        let mut missing = with(34, 12);
        missing[35] = 1;
        missing[38] = 0;
        crate::wire::icmp::Packet::new_unchecked(&mut missing[34..]).fill_checksum();
        assert_eq!(
            to_v6(&missing, &TO_CLIENT, 1500),
            Err(DropReason::IcmpUntranslatable)
        );
        // A corrupt ICMPv4 checksum.
        let mut corrupt = input.clone();
        *corrupt.last_mut().unwrap() ^= 1;
        assert_eq!(
            to_v6(&corrupt, &TO_CLIENT, 1500),
            Err(DropReason::BadIcmpChecksum)
        );

        // ICMPv6: unrecognized option (parameter problem code 2), a pointer past
        // the IPv6 header, destination unreachable code 5.
        let (input, _) = fixture("nat64_param");
        let icmp6_with = |edit: &dyn Fn(&mut Vec<u8>)| {
            let mut buf = input.clone();
            edit(&mut buf);
            icmpv6::Packet::new_unchecked(&mut buf[54..]).fill_checksum(CLIENT, VIP);
            buf
        };
        for buf in [
            icmp6_with(&|b| b[55] = 2),
            icmp6_with(&|b| b[61] = 40),
            icmp6_with(&|b| b[61] = 2),
            icmp6_with(&|b| (b[54], b[55]) = (1, 5)),
        ] {
            assert_eq!(
                to_v4(&buf, &to_server(40003), 1500),
                Err(DropReason::IcmpUntranslatable)
            );
        }
        let mut corrupt = input.clone();
        *corrupt.last_mut().unwrap() ^= 1;
        assert_eq!(
            to_v4(&corrupt, &to_server(40003), 1500),
            Err(DropReason::BadIcmpv6Checksum)
        );
        let rewrite = QuoteRewrite6 {
            outer_src: Some(VIP),
            ..QuoteRewrite6::default()
        };
        let (mut buf, _) = fixture("nat_out");
        *buf.last_mut().unwrap() ^= 1;
        let parsed = classify(&buf).unwrap();
        let quote = parse_error_v6(&buf, &parsed).unwrap();
        let before = buf.clone();
        assert_eq!(
            nat_translate_error_v6(&mut buf, &parsed, &quote, &rewrite),
            Err(DropReason::BadIcmpv6Checksum)
        );
        assert_eq!(buf, before);
        // A quote from another frame.
        let mut stale = quote;
        stale.l4 += 2;
        assert_eq!(
            nat_translate_error_v6(&mut buf, &parsed, &stale, &rewrite),
            Err(DropReason::Truncated)
        );
    }

    #[test]
    fn mtus_follow_rfc_7915() {
        use icmpv6::Message as M6;
        let frag = |mtu: u16, total: u16, link: u16| {
            let [hi, lo] = mtu.to_be_bytes();
            map_v4_to_v6(
                icmp::Message::DEST_UNREACHABLE,
                4,
                [0, 0, hi, lo],
                total,
                link,
            )
        };
        assert_eq!(frag(1400, 1500, 1500), Some((M6::PACKET_TOO_BIG, 0, 1420)));
        assert_eq!(frag(1490, 1500, 1500), Some((M6::PACKET_TOO_BIG, 0, 1500)));
        // No MTU (a router before RFC 1191): the plateau below the quoted length.
        assert_eq!(frag(0, 1500, 9000), Some((M6::PACKET_TOO_BIG, 0, 1512)));
        assert_eq!(frag(0, 1006, 9000), Some((M6::PACKET_TOO_BIG, 0, 528)));
        let ptb = |mtu: u32, link: u16| map_v6_to_v4(M6::PACKET_TOO_BIG, 0, mtu, link);
        let frag_needed = |mtu: u16| {
            let [hi, lo] = mtu.to_be_bytes();
            Some((icmp::Message::DEST_UNREACHABLE, 4, [0, 0, hi, lo]))
        };
        assert_eq!(ptb(1280, 1500), frag_needed(1260));
        assert_eq!(ptb(9000, 1500), frag_needed(1500));
        // Below the IPv6 minimum: read as 1280.
        assert_eq!(ptb(10, 1500), frag_needed(1260));
        assert_eq!(ptb(1279, 1500), frag_needed(1260));
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn fuzz_never_panics() {
        let mut rng = XorShift(0x6c6c_1c1c_9e9e_0101);
        let inputs: Vec<Vec<u8>> = fixtures().values().map(|(i, _)| i.clone()).collect();
        let mut buf = [0u8; 400];
        let (mut translated, mut families) = (0, 0);
        for round in 0..60_000 {
            let input = &inputs[rng.below(inputs.len())];
            let len = rng.below(buf.len() - NAT64_ERROR_GROWTH + 1);
            let frame = &mut buf[NAT64_ERROR_GROWTH..];
            let n = input.len().min(len);
            frame[..n].copy_from_slice(&input[..n]);
            for _ in 0..rng.below(3) {
                frame[rng.below(n.max(1))] = rng.next_u64() as u8;
            }
            let parsed = match classify(&frame[..len]) {
                Ok(parsed) if round % 4 != 0 => parsed,
                _ => random_parsed(&mut rng, len),
            };
            if let Ok(quote) = parse_error_v6(&frame[..len], &parsed) {
                assert!(quote.ip + 40 <= quote.l4 && quote.l4 + 8 <= quote.end && quote.end <= len);
                let rewrite = QuoteRewrite6 {
                    outer_src: Some(Ipv6Addr::from(u128::from(rng.next_u64()))),
                    outer_dst: None,
                    inner_src: Some((Ipv6Addr::from(u128::from(rng.next_u64())), 7)),
                    inner_dst: Some((Ipv6Addr::from(u128::from(rng.next_u64())), 9)),
                };
                let mut copy = frame[..len].to_vec();
                if nat_translate_error_v6(&mut copy, &parsed, &quote, &rewrite).is_ok() {
                    let ip = ipv6::Packet::new_unchecked(&copy[parsed.l3..]);
                    let message = icmpv6::Packet::new_unchecked(&copy[parsed.l4..quote.end]);
                    assert!(message.verify_checksum(ip.src_addr(), ip.dst_addr()));
                    translated += 1;
                }
                let ends = Nat64Ends {
                    outer_src: Ipv4Addr::from(rng.next_u64() as u32),
                    outer_dst: RS4,
                    inner_src: (RS4, 1),
                    inner_dst: (LIP4, 2),
                };
                let mut copy = frame[..len].to_vec();
                if let Ok(range) = icmp6_to_icmp4(&mut copy, &parsed, &quote, &ends, 1500, 1) {
                    // The layout `parsed` gave (a made-up one may not be the frame's).
                    let icmp_at = range.start + parsed.l3 + ipv4::MIN_HEADER_LEN;
                    assert!(sums_to_ones(&copy[icmp_at..range.end]));
                    families += 1;
                }
            }
            if let Some(quote) = parse_error(&frame[..len], &parsed) {
                let ends = Nat64Ends {
                    outer_src: Ipv6Addr::from(u128::from(rng.next_u64())),
                    outer_dst: CLIENT,
                    inner_src: (CLIENT, 1),
                    inner_dst: (VIP, 2),
                };
                if let Ok(n) = icmp4_to_icmp6(
                    &mut buf[..NAT64_ERROR_GROWTH + len],
                    &parsed,
                    &quote,
                    &ends,
                    1500,
                ) {
                    let ip = ipv6::Packet::new_unchecked(&buf[parsed.l3..]);
                    let message = icmpv6::Packet::new_unchecked(&buf[parsed.l3 + 40..n]);
                    assert!(message.verify_checksum(ip.src_addr(), ip.dst_addr()));
                    assert!(n <= 14 + ipv6::MIN_MTU);
                    families += 1;
                }
            }
        }
        assert!(
            translated > 1000,
            "the fuzz reaches translation: {translated}"
        );
        assert!(families > 1000, "the fuzz reaches NAT64: {families}");
    }
}
