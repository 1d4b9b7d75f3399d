//! Packet rewrites of the forwarding modes, as pure functions on the frame bytes.
//!
//! Every function here works in place on `&mut [u8]` (the mbuf's data), allocates
//! nothing and never panics: a frame or a [`Parsed`] that does not hold what the
//! function needs yields an error (or `None`) and leaves the decision to drop to the
//! caller, which counts the [`DropReason`]. Frames come from
//! [`classify`](crate::flow::parse::classify); the rewrites re-check the offsets they
//! use, so a stale `Parsed` cannot make them index out of bounds.
//!
//! # What each mode rewrites
//!
//! | mode | `ipvsadm` | rewrite | real server set-up |
//! |------|-----------|---------|--------------------|
//! | DR   | `-g` | [`dr::forward`]: Ethernet destination (the RS's MAC) and source (ours). IP and L4 untouched. | VIP on `lo` (`ip addr add VIP/32 dev lo`), `arp_ignore=1`, `arp_announce=2` so it never answers ARP for the VIP; same L2 segment as Sluice; replies go straight to the client. |
//! | NAT  | `-m` | [`nat::dnat`] client→VIP:vport becomes client→RIP:rport; replies RIP:rport→client get [`nat::snat`] back to VIP:vport. IPv4 and TCP/UDP checksums updated incrementally; then the MACs as in DR. | Default route (or a route to the clients) via Sluice, so replies return through it. Nothing else. |
//! | TUN  | `-i` | [`tun::encapsulate`]: an outer IPv4 header (protocol 4) from our address to the RIP, MACs as in DR; the inner packet untouched. Over-MTU packets with DF get [`icmp::frag_needed`] instead. IPv6: [`tun6::encapsulate`], an outer IPv6 header (next header 41); over-MTU packets get [`tun6::packet_too_big`]. | An `ipip` tunnel device that accepts the VIP (`ip link set tunl0 up; ip addr add VIP/32 dev tunl0`), `rp_filter` 0 on it, ARP settings as DR; MTU/MSS sized for the 20-byte overhead; replies go straight to the client. |
//! | FullNAT | `-b` | [`nat::rewrite`] with both ends: client:cport→VIP:vport becomes LIP:lport→RIP:rport and back. IPv6: [`nat6::rewrite`]; NAT64 (IPv6 client, IPv4 LIP and RIP): [`nat64::to_v4`] and [`nat64::to_v6`]. | Nothing: it replies to LIP:lport, which routes to Sluice. It no longer sees the client address. |
//!
//! FullNAT's local ports come from [`laddr::PortPool`], per worker, chosen so that the
//! NIC's RSS brings each reply back to the worker owning the session; [`toa`] carries
//! the client address to the real server in a TCP option and clamps the MSS for it.
//!
//! # Decisions
//!
//! - **TTL is not decremented**, in any mode. Sluice is a load balancer in front of
//!   the service, not a router hop: IPVS (its NAT/DR/TUN transmitters run from
//!   `LOCAL_IN`), Katran and DPVS all leave the TTL as it arrived, and traceroute
//!   through a VIP then shows the real path. A looping packet cannot arise: rewritten
//!   packets go to a real server, never back to a VIP.
//! - **L4 checksums are updated, not verified** (RFC 1624 incremental updates): a
//!   wrong checksum stays wrong and the receiver drops the segment, as it would have
//!   without Sluice; see [`crate::flow::parse`].
//! - **UDP checksum 0** ("none computed", IPv4 only) stays 0 through every rewrite; a
//!   rewritten checksum that comes out as 0 is sent as 0xffff (RFC 768).
//! - **ICMP errors** quoting a NAT session's packet are translated by
//!   [`icmp::nat_translate_error`]: outer and quoted addresses and ports, every
//!   checksum. For DR and TUN they are forwarded like any packet of the session.
//!   ICMPv6 errors about IPv6 sessions likewise ([`icmp6::nat_translate_error_v6`]),
//!   and NAT64's between ICMPv4 and ICMPv6 ([`icmp6::icmp4_to_icmp6`],
//!   [`icmp6::icmp6_to_icmp4`], RFC 7915).
//! - **No fragmentation and no reassembly.** Fragments are dropped at classification;
//!   TUN answers DF packets that no longer fit with frag-needed and drops the others.
//!
//! [`DropReason`]: crate::model::DropReason
//! [`Parsed`]: crate::flow::parse::Parsed

use crate::flow::parse::{PacketKind, Parsed};
use crate::model::DropReason;
use crate::wire::{checksum, ipv4, tcp, IpProtocol};

pub mod dr;
pub mod icmp;
pub mod icmp6;
pub mod laddr;
pub mod nat;
pub mod nat6;
pub mod nat64;
pub mod reset;
pub mod synproxy;
pub mod timestamps;
pub mod toa;
pub mod tun;
pub mod tun6;

pub use icmp::{
    frag_needed, nat_translate_error, parse_error, IcmpErrorQuote, QuoteRewrite,
    SHARED_PATH_MIN_MTU,
};
pub use nat::{dnat, snat};
pub use tun::{check_mtu, encapsulate, encapsulated_len, MtuCheck};

/// The IPv4 packet `parsed` describes (padding excluded), checked again so that
/// `header_len <= total_len == view length` and the L4 offset matches the header.
pub(crate) fn ip_packet<'a>(frame: &'a [u8], parsed: &Parsed) -> Option<ipv4::Packet<&'a [u8]>> {
    let end = parsed.l3.checked_add(parsed.ip_total_len as usize)?;
    let packet = ipv4::Packet::new_checked(frame.get(parsed.l3..end)?).ok()?;
    (parsed.l3 + packet.header_len() == parsed.l4).then_some(packet)
}

/// Where the TCP segment of `parsed` lies in a frame, checked against the frame.
pub(crate) struct TcpSegment {
    /// Offset of the TCP header.
    pub l4: usize,
    /// One past the IPv4 packet's last byte.
    pub ip_end: usize,
    /// The TCP header's length, options included (within the packet).
    pub header_len: usize,
}

/// The TCP segment of `parsed` in `frame`, re-checked: `UnsupportedProtocol` when
/// `parsed` is not TCP or disagrees with the IPv4 protocol, `Truncated` when its
/// offsets do not fit `frame`, `BadTcpHeader` when the TCP header does not fit the
/// packet.
#[inline]
pub(crate) fn tcp_segment(frame: &[u8], parsed: &Parsed) -> Result<TcpSegment, DropReason> {
    if !matches!(parsed.kind, PacketKind::Tcp { .. }) {
        return Err(DropReason::UnsupportedProtocol);
    }
    let ip = ip_packet(frame, parsed).ok_or(DropReason::Truncated)?;
    if ip.protocol() != IpProtocol::TCP {
        return Err(DropReason::UnsupportedProtocol);
    }
    let segment = tcp::Packet::new_checked(ip.payload()).map_err(|_| DropReason::BadTcpHeader)?;
    Ok(TcpSegment {
        l4: parsed.l4,
        ip_end: parsed.l3 + ip.total_len() as usize,
        header_len: segment.header_len(),
    })
}

/// Overwrites the TCP `segment[at..at + new.len()]` (an even length, inside the segment) with
/// `new` and updates the TCP checksum for it.
pub(crate) fn replace_tcp_bytes(segment: &mut [u8], at: usize, new: &[u8]) {
    let Some(old) = segment.get(at..at + new.len()) else {
        return;
    };
    let (mut old_sum, mut new_sum) = (
        checksum::fold(checksum::sum(old)),
        checksum::fold(checksum::sum(new)),
    );
    if at % 2 == 1 {
        // Bytes at odd offsets are the low halves of the words they fall in.
        old_sum = old_sum.swap_bytes();
        new_sum = new_sum.swap_bytes();
    }
    segment[at..at + new.len()].copy_from_slice(new);
    let mut tcp = tcp::Packet::new_unchecked(segment);
    tcp.update_checksum16(old_sum, new_sum);
}

/// Mutable twin of [`ip_packet`].
pub(crate) fn ip_packet_mut<'a>(
    frame: &'a mut [u8],
    parsed: &Parsed,
) -> Option<ipv4::Packet<&'a mut [u8]>> {
    let end = parsed.l3.checked_add(parsed.ip_total_len as usize)?;
    let packet = ipv4::Packet::new_checked(frame.get_mut(parsed.l3..end)?).ok()?;
    (parsed.l3 + packet.header_len() == parsed.l4).then_some(packet)
}

#[cfg(test)]
pub(crate) mod test_util {
    //! Frame builders and checks shared by the forwarding tests.
    use std::net::Ipv4Addr;

    use crate::flow::parse::{PacketKind, Parsed};
    use crate::wire::ethernet::L2Header;
    use crate::wire::test_util::XorShift;
    use crate::wire::{checksum, icmp, ipv4, tcp, udp, EtherType, IpProtocol};

    /// Builds an untagged Ethernet/IPv4 frame around `protocol`'s `l4` bytes (which
    /// must already hold a complete L4 header), filling the IPv4 header and the L4
    /// checksum. `udp_checksum = false` leaves a UDP checksum at 0 ("none").
    pub fn frame(
        protocol: IpProtocol,
        src: Ipv4Addr,
        dst: Ipv4Addr,
        l4: &[u8],
        udp_checksum: bool,
    ) -> Vec<u8> {
        let mut buf = vec![0u8; 14 + 20 + l4.len()];
        buf[0..6].copy_from_slice(&[0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c]);
        buf[6..12].copy_from_slice(&[0x52, 0x54, 0x00, 0x12, 0x34, 0x56]);
        buf[12..14].copy_from_slice(&EtherType::IPV4.0.to_be_bytes());
        buf[34..].copy_from_slice(l4);
        let repr = ipv4::Repr {
            src_addr: src,
            dst_addr: dst,
            protocol,
            payload_len: l4.len(),
            ttl: 61,
        };
        repr.emit(&mut ipv4::Packet::new_unchecked(&mut buf[14..]));
        match protocol {
            IpProtocol::TCP => tcp::Packet::new_unchecked(&mut buf[34..]).fill_checksum(src, dst),
            IpProtocol::UDP => {
                let mut udp = udp::Packet::new_unchecked(&mut buf[34..]);
                udp.set_len(l4.len() as u16);
                if udp_checksum {
                    udp.fill_checksum(src, dst);
                } else {
                    udp.set_checksum(0);
                }
            }
            IpProtocol::ICMP => icmp::Packet::new_unchecked(&mut buf[34..]).fill_checksum(),
            _ => {}
        }
        buf
    }

    /// The IPv4 header checksum of the packet at `l3` is valid.
    pub fn ip_checksum_ok(frame: &[u8], l3: usize) -> bool {
        ipv4::Packet::new_checked(&frame[l3..])
            .map(|p| p.verify_checksum())
            .unwrap_or(false)
    }

    /// A one's-complement sum over `bytes` folds to all ones (a valid checksum).
    pub fn sums_to_ones(bytes: &[u8]) -> bool {
        checksum::fold(checksum::sum(bytes)) == 0xffff
    }

    /// A `Parsed` with random offsets and kind, to feed rewrites garbage.
    pub fn random_parsed(rng: &mut XorShift, max: usize) -> Parsed {
        let mut offset = || match rng.below(4) {
            0 => usize::MAX - rng.below(4),
            _ => rng.below(max + 8),
        };
        let (l3, l4) = (offset(), offset());
        let key = crate::flow::FlowKey4::new(
            crate::model::Protocol::Tcp,
            Ipv4Addr::from(rng.next_u64() as u32),
            rng.next_u64() as u16,
            Ipv4Addr::from(rng.next_u64() as u32),
            rng.next_u64() as u16,
        );
        let kind = match rng.below(5) {
            0 => PacketKind::Tcp {
                key,
                flags: tcp::TcpFlags(rng.next_u64() as u8),
                payload_len: rng.next_u64() as u16,
            },
            1 => PacketKind::Udp { key },
            2 => PacketKind::Icmp {
                src: key.src_addr(),
                dst: key.dst_addr(),
                icmp_type: icmp::Message([3, 11, 12, 8][rng.below(4)]),
                code: rng.next_u64() as u8,
            },
            3 => PacketKind::Arp,
            _ => PacketKind::OtherIpv4 {
                src: key.src_addr(),
                dst: key.dst_addr(),
                protocol: IpProtocol(rng.next_u64() as u8),
            },
        };
        Parsed {
            l2: L2Header {
                vlan_tags: 0,
                vlan_id: None,
                ethertype: EtherType::IPV4,
                l3_offset: l3,
            },
            l3,
            l4,
            ip_total_len: rng.next_u64() as u16,
            kind,
        }
    }
}
