//! ICMP for the forwarding path: frag-needed for tunnelled packets that no longer fit,
//! and ICMP errors that quote a packet of a NAT session, translated so each party sees
//! its own addressing.
//!
//! Echo to a VIP is not here: the local responder (`dataplane::local`) answers echo
//! for every local address.

use std::net::Ipv4Addr;

use crate::flow::parse::{PacketKind, Parsed};
use crate::flow::FlowKey4;
use crate::model::DropReason;
use crate::model::Protocol;
use crate::wire::ethernet::{self, MacAddr};
use crate::wire::{checksum, icmp, ipv4, tcp, udp, IpProtocol};

/// Bytes of the offending datagram's payload an error quotes after its IP header
/// (RFC 792; RFC 1812 allows more, Sluice sends the minimum).
pub const QUOTED_PAYLOAD_LEN: usize = 8;
/// DSCP of the errors Sluice originates: CS6, internetwork control, as Linux sends.
const ERROR_DSCP: u8 = 48;

/// A source an ICMP error may be sent to: one real host (RFC 1122 3.2.2).
fn is_unicast_host(addr: Ipv4Addr) -> bool {
    !(addr.is_unspecified() || addr.is_broadcast() || addr.is_multicast() || addr.is_loopback())
}

/// Rewrites the frame in place into an ICMP destination unreachable / fragmentation
/// needed (type 3 code 4, RFC 792/1191) with `next_hop_mtu`, sent from `our_ip` and
/// `our_mac` back to the packet's source address and source MAC, VLAN tags kept. It
/// quotes the original IP header (options included) and the first 8 bytes of its
/// payload; TTL 64, DF, DSCP CS6, valid IPv4 and ICMP checksums. Returns the new frame
/// length: `l3 + 36 + IHL * 4` at most, shorter than any packet that exceeded an MTU.
///
/// `None`, with the frame unmodified, when no error may be sent (RFC 1122 3.2.2: the
/// source is not a unicast host, the destination is broadcast or multicast, the packet
/// is a non-first fragment or itself an ICMP error, the source MAC is a group address)
/// or when `frame` cannot hold the reply (a tiny packet with no tailroom) or does not
/// match `parsed`. The caller drops the original (`TooBig`) either way.
pub fn frag_needed(
    frame: &mut [u8],
    parsed: &Parsed,
    next_hop_mtu: u16,
    our_ip: Ipv4Addr,
    our_mac: MacAddr,
) -> Option<usize> {
    let l3 = parsed.l3;
    if l3 < ethernet::HEADER_LEN {
        return None;
    }
    let peer_mac = ethernet::Frame::new_checked(&*frame).ok()?.src_addr();
    let ip = super::ip_packet(frame, parsed)?;
    let (peer_ip, dst) = (ip.src_addr(), ip.dst_addr());
    if !peer_mac.is_unicast()
        || !is_unicast_host(peer_ip)
        || dst.is_broadcast()
        || dst.is_multicast()
        || ip.frag_offset() != 0
    {
        return None;
    }
    if ip.protocol() == IpProtocol::ICMP && icmp::Message(*ip.payload().first()?).is_error() {
        return None;
    }
    let quote_len = ip.header_len() + ip.payload().len().min(QUOTED_PAYLOAD_LEN);
    let ip_len = ipv4::MIN_HEADER_LEN + icmp::HEADER_LEN + quote_len;
    if l3 + ip_len > frame.len() {
        return None;
    }

    // The quote moves back behind the new headers; the regions may overlap.
    let quote_at = l3 + ipv4::MIN_HEADER_LEN + icmp::HEADER_LEN;
    frame.copy_within(l3..l3 + quote_len, quote_at);
    let (l2_header, rest) = frame.split_at_mut(l3);
    let (header, message) = rest[..ip_len].split_at_mut(ipv4::MIN_HEADER_LEN);

    let mut reply = icmp::Packet::new_unchecked(message);
    reply.set_msg_type(icmp::Message::DEST_UNREACHABLE);
    reply.set_msg_code(icmp::CODE_FRAG_NEEDED);
    reply.set_next_hop_mtu(next_hop_mtu);
    reply.fill_checksum();

    let mut packet = ipv4::Packet::new_unchecked(header);
    let repr = ipv4::Repr {
        src_addr: our_ip,
        dst_addr: peer_ip,
        protocol: IpProtocol::ICMP,
        payload_len: icmp::HEADER_LEN + quote_len,
        ttl: ipv4::DEFAULT_TTL,
    };
    repr.emit(&mut packet);
    packet.set_dscp_ecn(ERROR_DSCP, 0);
    packet.fill_checksum();

    let mut eth = ethernet::Frame::new_unchecked(l2_header);
    eth.set_dst_addr(peer_mac);
    eth.set_src_addr(our_mac);
    Some(l3 + ip_len)
}

/// Where an ICMP error's quoted packet lies in the frame, and its 5-tuple.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IcmpErrorQuote {
    /// The quoted packet's 5-tuple as it was sent: its own source and destination.
    /// An error about a packet we sent to the client (VIP → client) reverses to the
    /// session key (client → VIP); see [`crate::flow::FlowKey::reversed`].
    pub key: FlowKey4,
    pub icmp_type: icmp::Message,
    pub code: u8,
    /// Offset of the quoted IPv4 header in the frame.
    pub ip: usize,
    /// Offset of the quoted TCP/UDP header (at least 8 bytes of it are present).
    pub l4: usize,
    /// End of the ICMP message (and of the outer IPv4 packet) in the frame.
    pub end: usize,
}

impl IcmpErrorQuote {
    /// A frag-needed about a UDP datagram: its sender's kernel lowers its path MTU to
    /// the quoted datagram's destination on it, whoever wrote it (UDP has no sequence
    /// number for the kernel to check, as it checks a TCP error's), and then sends
    /// larger datagrams to that destination in fragments.
    pub fn too_big_about_udp(&self) -> bool {
        self.key.proto == Protocol::Udp
            && self.icmp_type == icmp::Message::DEST_UNREACHABLE
            && self.code == icmp::CODE_FRAG_NEEDED
    }

    /// Bytes of the quoted L4 header and data present in the frame (8 or more).
    pub fn quoted_l4_len(&self) -> usize {
        self.end.saturating_sub(self.l4)
    }
}

/// Reads an ICMP error (destination unreachable incl. frag-needed, time exceeded,
/// parameter problem) that quotes a TCP or UDP packet with at least 8 bytes of its L4
/// header (RFC 792's minimum). `None` for anything else: other ICMP types, a quote
/// that is cut short, not IPv4, a non-first fragment or another protocol, or a
/// `parsed` that does not describe `frame`. The ICMP checksum is not checked here.
pub fn parse_error(frame: &[u8], parsed: &Parsed) -> Option<IcmpErrorQuote> {
    if !matches!(parsed.kind, PacketKind::Icmp { .. }) {
        return None;
    }
    let ip = super::ip_packet(frame, parsed)?;
    if ip.protocol() != IpProtocol::ICMP {
        return None;
    }
    let message = icmp::Packet::new_checked(ip.payload()).ok()?;
    let icmp_type = message.msg_type();
    if !matches!(
        icmp_type,
        icmp::Message::DEST_UNREACHABLE
            | icmp::Message::TIME_EXCEEDED
            | icmp::Message::PARAMETER_PROBLEM
    ) {
        return None;
    }
    // The quoted header's total length describes the original datagram, not the
    // quote, so the checked constructor does not apply: check what is read here.
    let quoted = message.data();
    if quoted.len() < ipv4::MIN_HEADER_LEN {
        return None;
    }
    let inner = ipv4::Packet::new_unchecked(quoted);
    let header_len = inner.header_len();
    if inner.version() != 4
        || header_len < ipv4::MIN_HEADER_LEN
        || quoted.len() < header_len + QUOTED_PAYLOAD_LEN
        || inner.frag_offset() != 0
    {
        return None;
    }
    let proto = Protocol::from_ip_protocol(inner.protocol().0)?;
    let l4 = &quoted[header_len..];
    let (sport, dport) = match proto {
        Protocol::Tcp => {
            let segment = tcp::Packet::new_unchecked(l4);
            (segment.src_port(), segment.dst_port())
        }
        Protocol::Udp => {
            let datagram = udp::Packet::new_unchecked(l4);
            (datagram.src_port(), datagram.dst_port())
        }
    };
    let quote_ip = parsed.l4 + icmp::HEADER_LEN;
    Some(IcmpErrorQuote {
        key: FlowKey4::new(proto, inner.src_addr(), sport, inner.dst_addr(), dport),
        icmp_type,
        code: message.msg_code(),
        ip: quote_ip,
        l4: quote_ip + header_len,
        end: parsed.ip_end(),
    })
}

/// What [`nat_translate_error`] changes; `None` leaves a field alone. Outer fields are
/// the ICMP packet's own IPv4 addresses; inner ones the quoted packet's address and
/// port.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QuoteRewrite {
    pub outer_src: Option<Ipv4Addr>,
    pub outer_dst: Option<Ipv4Addr>,
    pub inner_src: Option<(Ipv4Addr, u16)>,
    pub inner_dst: Option<(Ipv4Addr, u16)>,
    /// Subtracted from a quoted TCP segment's sequence number: a connection the SYN
    /// proxy spliced, whose client saw the server's bytes numbered from the cookie
    /// (the real server checks that an error quotes a sequence number it sent).
    pub inner_seq_delta: u32,
    /// A frag-needed announcing a smaller next-hop MTU announces this one instead (0:
    /// none). For an error to a real server that keeps one path MTU for many clients
    /// (FullNAT, NAT64: it knows them all as the local address), see
    /// [`SHARED_PATH_MIN_MTU`].
    pub min_next_hop_mtu: u16,
}

/// The least next-hop MTU a frag-needed from a client's side announces to a real
/// server that sees every client as the local address (FullNAT, NAT64). The server
/// keeps one path MTU per destination, so one client's error lowers it for all of
/// them: a forged "MTU 68" would make Linux clamp it to 552 for ten minutes, and send
/// every UDP reply above that in fragments, which Sluice does not forward. 1280 (the
/// IPv6 minimum, which almost every IPv4 path carries too) bounds the harm; a client
/// whose path is narrower than that is not served large packets.
pub const SHARED_PATH_MIN_MTU: u16 = 1280;

impl QuoteRewrite {
    /// NAT, an error arriving from the client side about a reply the real server sent
    /// (after SNAT it was VIP:vport → client): deliver it to the real server as about
    /// its own packet, RIP:rport → client. As IPVS's `ip_vs_nat_icmp` inbound.
    pub const fn towards_real_server(rs_addr: Ipv4Addr, rs_port: u16) -> QuoteRewrite {
        QuoteRewrite {
            outer_src: None,
            outer_dst: Some(rs_addr),
            inner_src: Some((rs_addr, rs_port)),
            inner_dst: None,
            inner_seq_delta: 0,
            min_next_hop_mtu: 0,
        }
    }

    /// NAT, an error from the real-server side (the RS or a router behind it) about a
    /// packet Sluice DNATed (client → RIP:rport): deliver it to the client from the VIP,
    /// about the packet it sent, client → VIP:vport. As IPVS's outbound case, the outer
    /// source becomes the VIP whoever generated the error, so the RIP never shows.
    pub const fn towards_client(vip: Ipv4Addr, vport: u16) -> QuoteRewrite {
        QuoteRewrite {
            outer_src: Some(vip),
            outer_dst: None,
            inner_src: None,
            inner_dst: Some((vip, vport)),
            inner_seq_delta: 0,
            min_next_hop_mtu: 0,
        }
    }
}

/// Translates an ICMP error for NAT in place: the outer addresses (IPv4 checksum
/// updated incrementally), the quoted packet's addresses and ports, its IPv4 header
/// checksum (incrementally), its TCP/UDP checksum when the quote contains it (UDP
/// always, bytes 6..8; TCP when 18 or more bytes are quoted; UDP 0 stays 0), and
/// finally the ICMP checksum recomputed over the whole message. MACs are the caller's
/// ([`super::dr::forward`]).
///
/// The ICMP checksum is verified first, so a corrupt error is dropped rather than
/// laundered by the recompute. Errors, with the frame unmodified: `BadIcmpChecksum`;
/// `Truncated` when `parsed` and `quote` do not describe `frame` (they come from
/// [`classify`](crate::flow::parse::classify) and [`parse_error`] on it).
pub fn nat_translate_error(
    frame: &mut [u8],
    parsed: &Parsed,
    quote: &IcmpErrorQuote,
    rewrite: &QuoteRewrite,
) -> Result<(), DropReason> {
    if parse_error(frame, parsed).as_ref() != Some(quote) {
        return Err(DropReason::Truncated);
    }
    // parse_error checked: l4 + 8 <= quote.ip, quote.ip + 20 <= quote.l4,
    // quote.l4 + 8 <= quote.end == the outer packet's end <= frame.len().
    let message = parsed.l4..quote.end;
    if checksum::fold(checksum::sum(&frame[message.clone()])) != 0xffff {
        return Err(DropReason::BadIcmpChecksum);
    }

    let mut outer = super::ip_packet_mut(frame, parsed).ok_or(DropReason::Truncated)?;
    if let Some(addr) = rewrite.outer_src {
        let old = outer.src_addr();
        outer.set_src_addr(addr);
        let value = checksum::update32(outer.checksum(), u32::from(old), u32::from(addr));
        outer.set_checksum(value);
    }
    if let Some(addr) = rewrite.outer_dst {
        let old = outer.dst_addr();
        outer.set_dst_addr(addr);
        let value = checksum::update32(outer.checksum(), u32::from(old), u32::from(addr));
        outer.set_checksum(value);
    }

    let (old_src, old_dst) = (quote.key.src_addr(), quote.key.dst_addr());
    let mut inner = ipv4::Packet::new_unchecked(&mut frame[quote.ip..quote.l4]);
    if let Some((addr, _)) = rewrite.inner_src {
        inner.set_src_addr(addr);
        let value = checksum::update32(inner.checksum(), u32::from(old_src), u32::from(addr));
        inner.set_checksum(value);
    }
    if let Some((addr, _)) = rewrite.inner_dst {
        inner.set_dst_addr(addr);
        let value = checksum::update32(inner.checksum(), u32::from(old_dst), u32::from(addr));
        inner.set_checksum(value);
    }

    let segment = &mut frame[quote.l4..quote.end];
    match quote.key.proto {
        Protocol::Udp => {
            // The checksum sits within the 8 quoted bytes; 0 ("none") stays 0.
            let mut datagram = udp::Packet::new_unchecked(segment);
            if let Some((addr, port)) = rewrite.inner_src {
                datagram.update_checksum32(u32::from(old_src), u32::from(addr));
                datagram.update_checksum16(datagram.src_port(), port);
                datagram.set_src_port(port);
            }
            if let Some((addr, port)) = rewrite.inner_dst {
                datagram.update_checksum32(u32::from(old_dst), u32::from(addr));
                datagram.update_checksum16(datagram.dst_port(), port);
                datagram.set_dst_port(port);
            }
        }
        Protocol::Tcp => {
            // Bytes 16..18; routers quoting only 8 bytes leave it out.
            let has_checksum = segment.len() >= 18;
            let mut tcp = tcp::Packet::new_unchecked(segment);
            if let Some((addr, port)) = rewrite.inner_src {
                if has_checksum {
                    tcp.update_checksum32(u32::from(old_src), u32::from(addr));
                    tcp.update_checksum16(tcp.src_port(), port);
                }
                tcp.set_src_port(port);
            }
            if let Some((addr, port)) = rewrite.inner_dst {
                if has_checksum {
                    tcp.update_checksum32(u32::from(old_dst), u32::from(addr));
                    tcp.update_checksum16(tcp.dst_port(), port);
                }
                tcp.set_dst_port(port);
            }
            if rewrite.inner_seq_delta != 0 {
                // Bytes 4..8, always within the 8 quoted bytes.
                let old = tcp.seq_number();
                let new = old.wrapping_sub(rewrite.inner_seq_delta);
                if has_checksum {
                    tcp.update_checksum32(old, new);
                }
                tcp.set_seq_number(new);
            }
        }
    }

    if rewrite.min_next_hop_mtu > 0
        && quote.icmp_type == icmp::Message::DEST_UNREACHABLE
        && quote.code == icmp::CODE_FRAG_NEEDED
    {
        // Bytes 6..8 of the message (parse_error checked: l4 + 8 <= quote.ip).
        let field = &mut frame[parsed.l4 + 6..parsed.l4 + 8];
        if u16::from_be_bytes([field[0], field[1]]) < rewrite.min_next_hop_mtu {
            field.copy_from_slice(&rewrite.min_next_hop_mtu.to_be_bytes());
        }
    }

    icmp::Packet::new_unchecked(&mut frame[message]).fill_checksum();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::parse::classify;
    use crate::flow::parse::fixtures::*;
    use crate::forward::test_util::{random_parsed, sums_to_ones};
    use crate::wire::test_util::XorShift;

    // ICMP frag-needed (MTU 1480) from 10.0.0.1 back to the client, quoting TUN_INNER's IP header + 8 bytes (scapy).
    static FRAG_NEEDED: [u8; 70] = [
        0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x08, 0x00, 0x45,
        0xc0, 0x00, 0x38, 0x00, 0x00, 0x40, 0x00, 0x40, 0x01, 0x05, 0xc7, 0x0a, 0x00, 0x00, 0x01,
        0xc6, 0x33, 0x64, 0x0a, 0x03, 0x04, 0x5a, 0x9e, 0x00, 0x00, 0x05, 0xc8, 0x45, 0xb8, 0x00,
        0x39, 0x1c, 0x46, 0x40, 0x00, 0x3d, 0x06, 0xba, 0x78, 0xc6, 0x33, 0x64, 0x0a, 0xcb, 0x00,
        0x71, 0x0a, 0x9c, 0x40, 0x00, 0x50, 0x00, 0x00, 0x00, 0x05,
    ];
    // frag-needed (MTU 20) for TUN_INNER_QINQ, same tags (scapy).
    static FRAG_NEEDED_QINQ: [u8; 78] = [
        0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x88, 0xa8, 0x00,
        0x0a, 0x81, 0x00, 0x00, 0x14, 0x08, 0x00, 0x45, 0xc0, 0x00, 0x38, 0x00, 0x00, 0x40, 0x00,
        0x40, 0x01, 0x05, 0xc7, 0x0a, 0x00, 0x00, 0x01, 0xc6, 0x33, 0x64, 0x0a, 0x03, 0x04, 0xcb,
        0xb5, 0x00, 0x00, 0x00, 0x14, 0x45, 0x00, 0x00, 0x1e, 0x00, 0x77, 0x00, 0x00, 0x3c, 0x11,
        0x18, 0x10, 0xc6, 0x33, 0x64, 0x0a, 0xcb, 0x00, 0x71, 0x0a, 0x14, 0xe9, 0x00, 0x35, 0x00,
        0x0a, 0x1c, 0x0a,
    ];
    // frag-needed from router 192.0.2.1 to the VIP quoting 28 bytes of VIP:80 -> client:40000 (RS reply after SNAT).
    static ICMP_ERR_IN_SHORT: [u8; 70] = [
        0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x08, 0x00, 0x45,
        0x00, 0x00, 0x38, 0x0d, 0x0d, 0x00, 0x00, 0xfa, 0x01, 0xb5, 0xab, 0xc0, 0x00, 0x02, 0x01,
        0xcb, 0x00, 0x71, 0x0a, 0x03, 0x04, 0x19, 0xb2, 0x00, 0x00, 0x05, 0x78, 0x45, 0x00, 0x00,
        0x39, 0x51, 0x51, 0x40, 0x00, 0x40, 0x06, 0x83, 0x25, 0xcb, 0x00, 0x71, 0x0a, 0xc6, 0x33,
        0x64, 0x0a, 0x00, 0x50, 0x9c, 0x40, 0xa0, 0xa0, 0xa0, 0xa0,
    ];
    // ICMP_ERR_IN_SHORT translated for the RS: outer dst 10.0.0.11, quote 10.0.0.11:8080 -> client as the RS sent it (scapy).
    static ICMP_ERR_IN_SHORT_XLATED: [u8; 70] = [
        0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x08, 0x00, 0x45,
        0x00, 0x00, 0x38, 0x0d, 0x0d, 0x00, 0x00, 0xfa, 0x01, 0xe7, 0xab, 0xc0, 0x00, 0x02, 0x01,
        0x0a, 0x00, 0x00, 0x0b, 0x03, 0x04, 0xfa, 0x71, 0x00, 0x00, 0x05, 0x78, 0x45, 0x00, 0x00,
        0x39, 0x51, 0x51, 0x40, 0x00, 0x40, 0x06, 0xb5, 0x25, 0x0a, 0x00, 0x00, 0x0b, 0xc6, 0x33,
        0x64, 0x0a, 0x1f, 0x90, 0x9c, 0x40, 0xa0, 0xa0, 0xa0, 0xa0,
    ];
    // frag-needed from router 192.0.2.1 to the VIP quoting 57 bytes of VIP:80 -> client:40000 (RS reply after SNAT).
    static ICMP_ERR_IN_FULL: [u8; 99] = [
        0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x08, 0x00, 0x45,
        0x00, 0x00, 0x55, 0x0d, 0x0d, 0x00, 0x00, 0xfa, 0x01, 0xb5, 0x8e, 0xc0, 0x00, 0x02, 0x01,
        0xcb, 0x00, 0x71, 0x0a, 0x03, 0x04, 0x5d, 0xf8, 0x00, 0x00, 0x05, 0x78, 0x45, 0x00, 0x00,
        0x39, 0x51, 0x51, 0x40, 0x00, 0x40, 0x06, 0x83, 0x25, 0xcb, 0x00, 0x71, 0x0a, 0xc6, 0x33,
        0x64, 0x0a, 0x00, 0x50, 0x9c, 0x40, 0xa0, 0xa0, 0xa0, 0xa0, 0x01, 0x02, 0x03, 0x05, 0x50,
        0x18, 0x01, 0xfd, 0xa5, 0xd7, 0x00, 0x00, 0x48, 0x54, 0x54, 0x50, 0x2f, 0x31, 0x2e, 0x31,
        0x20, 0x32, 0x30, 0x30, 0x20, 0x4f, 0x4b, 0x0d, 0x0a,
    ];
    // ICMP_ERR_IN_FULL translated for the RS: outer dst 10.0.0.11, quote 10.0.0.11:8080 -> client as the RS sent it (scapy).
    static ICMP_ERR_IN_FULL_XLATED: [u8; 99] = [
        0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x08, 0x00, 0x45,
        0x00, 0x00, 0x55, 0x0d, 0x0d, 0x00, 0x00, 0xfa, 0x01, 0xe7, 0x8e, 0xc0, 0x00, 0x02, 0x01,
        0x0a, 0x00, 0x00, 0x0b, 0x03, 0x04, 0x2b, 0xf8, 0x00, 0x00, 0x05, 0x78, 0x45, 0x00, 0x00,
        0x39, 0x51, 0x51, 0x40, 0x00, 0x40, 0x06, 0xb5, 0x25, 0x0a, 0x00, 0x00, 0x0b, 0xc6, 0x33,
        0x64, 0x0a, 0x1f, 0x90, 0x9c, 0x40, 0xa0, 0xa0, 0xa0, 0xa0, 0x01, 0x02, 0x03, 0x05, 0x50,
        0x18, 0x01, 0xfd, 0xb8, 0x97, 0x00, 0x00, 0x48, 0x54, 0x54, 0x50, 0x2f, 0x31, 0x2e, 0x31,
        0x20, 0x32, 0x30, 0x30, 0x20, 0x4f, 0x4b, 0x0d, 0x0a,
    ];
    // Port unreachable from the RS to the client quoting client:5353 -> 10.0.0.11:5300 (after DNAT).
    static ICMP_ERR_OUT: [u8; 75] = [
        0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x52, 0x54, 0x00, 0x00, 0x00, 0x0b, 0x08, 0x00, 0x45,
        0x00, 0x00, 0x3d, 0x0e, 0x0e, 0x00, 0x00, 0x40, 0x01, 0x38, 0x6a, 0x0a, 0x00, 0x00, 0x0b,
        0xc6, 0x33, 0x64, 0x0a, 0x03, 0x03, 0x31, 0x64, 0x00, 0x00, 0x00, 0x00, 0x45, 0x00, 0x00,
        0x21, 0x42, 0x42, 0x00, 0x00, 0x3f, 0x11, 0x05, 0x42, 0xc6, 0x33, 0x64, 0x0a, 0x0a, 0x00,
        0x00, 0x0b, 0x14, 0xe9, 0x14, 0xb4, 0x00, 0x0d, 0x52, 0x06, 0x71, 0x75, 0x65, 0x72, 0x79,
    ];
    // ICMP_ERR_OUT translated for the client: outer src VIP, quote client -> VIP:53 as the client sent it (scapy).
    static ICMP_ERR_OUT_XLATED: [u8; 75] = [
        0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x52, 0x54, 0x00, 0x00, 0x00, 0x0b, 0x08, 0x00, 0x45,
        0x00, 0x00, 0x3d, 0x0e, 0x0e, 0x00, 0x00, 0x40, 0x01, 0x06, 0x6a, 0xcb, 0x00, 0x71, 0x0a,
        0xc6, 0x33, 0x64, 0x0a, 0x03, 0x03, 0x63, 0x64, 0x00, 0x00, 0x00, 0x00, 0x45, 0x00, 0x00,
        0x21, 0x42, 0x42, 0x00, 0x00, 0x3f, 0x11, 0xd3, 0x41, 0xc6, 0x33, 0x64, 0x0a, 0xcb, 0x00,
        0x71, 0x0a, 0x14, 0xe9, 0x00, 0x35, 0x00, 0x0d, 0x34, 0x85, 0x71, 0x75, 0x65, 0x72, 0x79,
    ];

    fn tun_inner() -> Vec<u8> {
        TUN_INNER.to_vec()
    }

    /// Independent checks of an ICMP error at `l3`: IPv4 header and ICMP message sum
    /// to all ones.
    fn checksums_valid(frame: &[u8], l3: usize) -> bool {
        let ip = ipv4::Packet::new_checked(&frame[l3..]).unwrap();
        let end = l3 + ip.total_len() as usize;
        sums_to_ones(&frame[l3..l3 + ip.header_len()])
            && sums_to_ones(&frame[l3 + ip.header_len()..end])
    }

    #[test]
    fn frag_needed_matches_scapy() {
        let mut buf = tun_inner();
        let parsed = classify(&buf).unwrap();
        let len = frag_needed(&mut buf, &parsed, 1480, LIP, OUR_MAC).unwrap();
        assert!(len < TUN_INNER.len());
        assert_eq!(buf[..len], FRAG_NEEDED);
        assert_eq!(buf[..6], CLIENT_MAC.0, "back to the sender's MAC");
        assert!(checksums_valid(&buf, 14));
        let reply = classify(&buf[..len]).unwrap();
        assert_eq!(
            reply.kind,
            PacketKind::Icmp {
                src: LIP,
                dst: CLIENT,
                icmp_type: icmp::Message::DEST_UNREACHABLE,
                code: 4
            }
        );
        // The quote is the original header plus 8 bytes.
        assert_eq!(buf[42..len], TUN_INNER[14..14 + 28]);
    }

    #[test]
    fn frag_needed_keeps_vlan_tags_and_needs_room() {
        // A 60-byte QinQ frame cannot hold the 78-byte reply...
        let mut exact = TUN_INNER_QINQ;
        let parsed = classify(&exact).unwrap();
        assert_eq!(frag_needed(&mut exact, &parsed, 20, LIP, OUR_MAC), None);
        assert_eq!(exact, TUN_INNER_QINQ);
        // ...but the same frame with tailroom can.
        let mut roomy = TUN_INNER_QINQ.to_vec();
        roomy.resize(100, 0);
        let len = frag_needed(&mut roomy, &parsed, 20, LIP, OUR_MAC).unwrap();
        assert_eq!(roomy[..len], FRAG_NEEDED_QINQ);
        assert!(checksums_valid(&roomy, 22));
    }

    #[test]
    fn frag_needed_refusals() {
        let original = tun_inner();
        let parsed = classify(&original).unwrap();
        let refuse = |edit: &dyn Fn(&mut Vec<u8>)| {
            let mut buf = original.clone();
            edit(&mut buf);
            ipv4::Packet::new_unchecked(&mut buf[14..]).fill_checksum();
            let before = buf.clone();
            assert_eq!(frag_needed(&mut buf, &parsed, 1480, LIP, OUR_MAC), None);
            assert_eq!(buf, before, "unmodified");
        };
        refuse(&|b| b[26..30].copy_from_slice(&[0, 0, 0, 0])); // source 0.0.0.0
        refuse(&|b| b[26..30].copy_from_slice(&[127, 0, 0, 1]));
        refuse(&|b| b[26..30].copy_from_slice(&[224, 0, 0, 5]));
        refuse(&|b| b[26..30].copy_from_slice(&[255, 255, 255, 255]));
        refuse(&|b| b[30..34].copy_from_slice(&[255, 255, 255, 255])); // to broadcast
        refuse(&|b| b[30..34].copy_from_slice(&[239, 1, 2, 3]));
        refuse(&|b| b[20..22].copy_from_slice(&[0x00, 0x10])); // non-first fragment
        refuse(&|b| b[6] |= 0x01); // group source MAC
                                   // About an ICMP error: never. About an echo: yes.
        let err = ICMP_ERR_OUT;
        let parsed_err = classify(&err).unwrap();
        assert_eq!(
            frag_needed(&mut err.clone(), &parsed_err, 100, LIP, OUR_MAC),
            None
        );
        let mut echo = ICMP_ECHO;
        let parsed_echo = classify(&echo).unwrap();
        assert!(frag_needed(&mut echo, &parsed_echo, 100, LIP, OUR_MAC).is_none()); // no room
        let mut echo = ICMP_ECHO.to_vec();
        echo.resize(100, 0);
        assert!(frag_needed(&mut echo, &parsed_echo, 100, LIP, OUR_MAC).is_some());
        // A Parsed that is not this frame's.
        let mut wrong = parsed;
        wrong.l3 = 4;
        wrong.l4 = 24;
        assert_eq!(
            frag_needed(&mut tun_inner(), &wrong, 1480, LIP, OUR_MAC),
            None
        );
    }

    #[test]
    fn parse_error_reads_quotes() {
        let parsed = classify(&ICMP_ERR_IN_SHORT).unwrap();
        let quote = parse_error(&ICMP_ERR_IN_SHORT, &parsed).unwrap();
        assert_eq!(
            quote.key,
            FlowKey4::new(Protocol::Tcp, VIP, 80, CLIENT, 40000)
        );
        assert_eq!(
            (quote.icmp_type, quote.code),
            (icmp::Message::DEST_UNREACHABLE, 4)
        );
        assert_eq!((quote.ip, quote.l4, quote.end), (42, 62, 70));
        assert_eq!(quote.quoted_l4_len(), 8);

        let parsed = classify(&ICMP_ERR_OUT).unwrap();
        let quote = parse_error(&ICMP_ERR_OUT, &parsed).unwrap();
        assert_eq!(
            quote.key,
            FlowKey4::new(Protocol::Udp, CLIENT, 5353, RIP, 5300)
        );
        assert_eq!(quote.code, 3);
        assert_eq!(quote.quoted_l4_len(), 13);

        // Time exceeded and parameter problem too.
        for t in [11u8, 12] {
            let mut buf = ICMP_ERR_OUT;
            buf[34] = t;
            let parsed = classify(&buf).unwrap();
            assert_eq!(
                parse_error(&buf, &parsed).unwrap().icmp_type,
                icmp::Message(t)
            );
        }
    }

    #[test]
    fn parse_error_rejects() {
        let none = |frame: &[u8]| {
            let parsed = classify(frame).unwrap();
            assert_eq!(parse_error(frame, &parsed), None, "{frame:02x?}");
        };
        none(&ICMP_ECHO);
        none(&TCP_SYN);
        let mut redirect = ICMP_ERR_OUT;
        redirect[34] = 5;
        none(&redirect);
        // Quote of 7 L4 bytes: cut the outer total length by one... at the end.
        let mut short = ICMP_ERR_IN_SHORT.to_vec();
        short.pop();
        short[17] -= 1;
        ipv4::Packet::new_unchecked(&mut short[14..]).fill_checksum();
        none(&short);
        // Quoted packet of another protocol, a quoted non-first fragment, IPv6.
        for (at, value) in [(42 + 9, 1u8), (42 + 7, 0x10), (42, 0x65), (42, 0x44)] {
            let mut buf = ICMP_ERR_IN_SHORT;
            buf[at] = value;
            none(&buf);
        }
        // Quoted IHL 6 with only 8 bytes after 20: the L4 header is not all there.
        let mut buf = ICMP_ERR_IN_SHORT;
        buf[42] = 0x46;
        none(&buf);
    }

    fn translated(frame: &[u8], rewrite: QuoteRewrite) -> Result<Vec<u8>, DropReason> {
        let mut buf = frame.to_vec();
        let parsed = classify(&buf).unwrap();
        let quote = parse_error(&buf, &parsed).unwrap();
        nat_translate_error(&mut buf, &parsed, &quote, &rewrite).map(|()| buf)
    }

    #[test]
    fn inbound_error_translated_for_the_real_server() {
        let rewrite = QuoteRewrite::towards_real_server(RIP, 8080);
        // An 8-byte quote: the TCP checksum is not in it.
        let out = translated(&ICMP_ERR_IN_SHORT, rewrite).unwrap();
        assert_eq!(out, ICMP_ERR_IN_SHORT_XLATED);
        let outer = classify(&out).unwrap();
        assert_eq!(
            outer.ip_addrs(),
            Some((ROUTER, RIP)),
            "the router stays the source"
        );
        assert!(checksums_valid(&out, 14));
        // A full quote: the quoted TCP checksum is what the RS originally sent.
        let out = translated(&ICMP_ERR_IN_FULL, rewrite).unwrap();
        assert_eq!(out, ICMP_ERR_IN_FULL_XLATED);
        assert!(checksums_valid(&out, 14));
        assert!(sums_to_ones(&out[42..62]), "quoted IPv4 header checksum");
        let quoted = tcp::Packet::new_checked(&out[62..]).unwrap();
        assert!(quoted.verify_checksum(RIP, CLIENT));
    }

    #[test]
    fn outbound_error_translated_for_the_client() {
        let out = translated(&ICMP_ERR_OUT, QuoteRewrite::towards_client(VIP, 53)).unwrap();
        assert_eq!(out, ICMP_ERR_OUT_XLATED);
        assert!(checksums_valid(&out, 14));
        let quoted = udp::Packet::new_checked(&out[62..]).unwrap();
        assert!(quoted.verify_checksum(CLIENT, VIP));
        // And back again.
        let back = QuoteRewrite {
            outer_src: Some(RIP),
            inner_dst: Some((RIP, 5300)),
            ..QuoteRewrite::default()
        };
        assert_eq!(translated(&out, back).unwrap(), ICMP_ERR_OUT);
    }

    #[test]
    fn fullnat_style_rewrite_of_every_field() {
        let rewrite = QuoteRewrite {
            outer_src: Some(Ipv4Addr::new(192, 0, 2, 99)),
            outer_dst: Some(Ipv4Addr::new(10, 9, 8, 7)),
            inner_src: Some((Ipv4Addr::new(10, 9, 8, 7), 1234)),
            inner_dst: Some((Ipv4Addr::new(172, 16, 0, 1), 4321)),
            inner_seq_delta: 0x8000_0001,
            min_next_hop_mtu: 0,
        };
        let seq_before = tcp::Packet::new_checked(&ICMP_ERR_IN_FULL[62..])
            .unwrap()
            .seq_number();
        let out = translated(&ICMP_ERR_IN_FULL, rewrite).unwrap();
        assert!(checksums_valid(&out, 14));
        assert!(sums_to_ones(&out[42..62]));
        let parsed = classify(&out).unwrap();
        let quote = parse_error(&out, &parsed).unwrap();
        assert_eq!(
            quote.key,
            FlowKey4::new(
                Protocol::Tcp,
                Ipv4Addr::new(10, 9, 8, 7),
                1234,
                Ipv4Addr::new(172, 16, 0, 1),
                4321
            )
        );
        let quoted = tcp::Packet::new_checked(&out[62..]).unwrap();
        assert!(quoted.verify_checksum(Ipv4Addr::new(10, 9, 8, 7), Ipv4Addr::new(172, 16, 0, 1)));
        assert_eq!(quoted.seq_number(), seq_before.wrapping_sub(0x8000_0001));
        // An 8-byte quote carries the sequence number but not the checksum.
        let short = translated(&ICMP_ERR_IN_SHORT, rewrite).unwrap();
        assert!(checksums_valid(&short, 14));
        let seq = |f: &[u8]| u32::from_be_bytes(f[66..70].try_into().unwrap());
        assert_eq!(
            seq(&short),
            seq(&ICMP_ERR_IN_SHORT).wrapping_sub(0x8000_0001)
        );
        assert_eq!(
            parsed.ip_addrs(),
            Some((Ipv4Addr::new(192, 0, 2, 99), Ipv4Addr::new(10, 9, 8, 7)))
        );
    }

    #[test]
    fn quoted_udp_without_checksum_stays_without() {
        let mut buf = ICMP_ERR_OUT;
        buf[68..70].copy_from_slice(&[0, 0]);
        icmp::Packet::new_unchecked(&mut buf[34..]).fill_checksum();
        let out = translated(&buf, QuoteRewrite::towards_client(VIP, 53)).unwrap();
        assert_eq!(out[68..70], [0, 0]);
        assert_eq!(out[64..66], [0, 53]);
        assert!(checksums_valid(&out, 14));
    }

    #[test]
    fn translation_errors_leave_the_frame_alone() {
        let mut buf = ICMP_ERR_OUT;
        let parsed = classify(&buf).unwrap();
        let quote = parse_error(&buf, &parsed).unwrap();
        buf[72] ^= 0x40; // payload byte of the quote: ICMP checksum now wrong
        let before = buf;
        let rewrite = QuoteRewrite::towards_client(VIP, 53);
        assert_eq!(
            nat_translate_error(&mut buf, &parsed, &quote, &rewrite),
            Err(DropReason::BadIcmpChecksum)
        );
        assert_eq!(buf, before);
        // A quote from another frame.
        let mut buf = ICMP_ERR_OUT;
        let mut stale = quote;
        stale.l4 += 4;
        assert_eq!(
            nat_translate_error(&mut buf, &parsed, &stale, &rewrite),
            Err(DropReason::Truncated)
        );
        let other = classify(&ICMP_ERR_IN_SHORT).unwrap();
        assert_eq!(
            nat_translate_error(&mut buf, &other, &quote, &rewrite),
            Err(DropReason::Truncated)
        );
        assert_eq!(buf, ICMP_ERR_OUT);
    }

    #[test]
    fn fuzz_never_panics() {
        let mut rng = XorShift(0x0c0c_5a5a_1f1f_e0e0);
        let fixtures: [&[u8]; 6] = [
            &ICMP_ERR_IN_SHORT,
            &ICMP_ERR_IN_FULL,
            &ICMP_ERR_OUT,
            &TUN_INNER,
            &TUN_INNER_QINQ,
            &ICMP_ECHO,
        ];
        let mut buf = [0u8; 200];
        let (mut translated, mut answered) = (0, 0);
        for round in 0..100_000 {
            let fixture = fixtures[rng.below(fixtures.len())];
            let len = rng.below(buf.len() + 1);
            if rng.below(3) == 0 {
                rng.fill(&mut buf[..len]);
            } else {
                let n = fixture.len().min(len);
                buf[..n].copy_from_slice(&fixture[..n]);
                for _ in 0..rng.below(3) {
                    buf[rng.below(buf.len())] = rng.next_u64() as u8;
                }
            }
            let parsed = match classify(&buf[..len]) {
                Ok(parsed) if round % 2 == 0 => parsed,
                _ => random_parsed(&mut rng, len),
            };
            let quote = parse_error(&buf[..len], &parsed);
            if let Some(quote) = quote {
                assert!(quote.ip < quote.l4 && quote.l4 + 8 <= quote.end && quote.end <= len);
                let rewrite = QuoteRewrite {
                    outer_src: Some(Ipv4Addr::from(rng.next_u64() as u32)),
                    outer_dst: None,
                    inner_src: Some((Ipv4Addr::from(rng.next_u64() as u32), 9)),
                    inner_dst: Some((Ipv4Addr::from(rng.next_u64() as u32), 10)),
                    inner_seq_delta: rng.next_u64() as u32,
                    min_next_hop_mtu: rng.next_u64() as u16,
                };
                if nat_translate_error(&mut buf[..len], &parsed, &quote, &rewrite).is_ok() {
                    let message = &buf[parsed.l4..quote.end];
                    assert!(sums_to_ones(message));
                    translated += 1;
                }
            }
            let garbage = IcmpErrorQuote {
                key: FlowKey4::new(
                    Protocol::Udp,
                    Ipv4Addr::LOCALHOST,
                    1,
                    Ipv4Addr::LOCALHOST,
                    2,
                ),
                icmp_type: icmp::Message(3),
                code: 0,
                ip: rng.below(len + 4),
                l4: rng.below(len + 4),
                end: rng.below(len + 4),
            };
            let _ =
                nat_translate_error(&mut buf[..len], &parsed, &garbage, &QuoteRewrite::default());
            if let Some(n) = frag_needed(&mut buf[..len], &parsed, 1400, LIP, OUR_MAC) {
                assert!(n <= len);
                let reply = classify(&buf[..n]).unwrap();
                assert!(checksums_valid(&buf[..n], reply.l3));
                answered += 1;
            }
        }
        assert!(
            translated > 1000,
            "the fuzz reaches translation: {translated}"
        );
        assert!(answered > 1000, "the fuzz reaches frag-needed: {answered}");
    }
}
