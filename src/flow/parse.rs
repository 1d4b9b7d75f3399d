//! Classification of a received frame for the forwarding path: L2 (VLAN tags walked),
//! IPv4 validated, the TCP/UDP 5-tuple extracted, all without copying or allocating.
//! IPv6 is validated up to its upper-layer header (extension headers walked, at most
//! six) and handed on as [`PacketKind::Ipv6`]: to the IPv6 services (TCP, UDP, ICMPv6
//! errors) and to the local responder (Neighbor Discovery, echo).
//!
//! Checks run in a fixed order and a rejected frame gets exactly one [`DropReason`]:
//!
//! | check                                                        | reason               |
//! |--------------------------------------------------------------|----------------------|
//! | Ethernet or VLAN header cut, IPv4 header under 20 bytes      | `Truncated`          |
//! | EtherType anything but IPv4, ARP and IPv6                    | `UnknownEthertype`   |
//! | version not 4, IHL below 5 or past the total length, total length below the header or past the frame | `BadIpv4Header` |
//! | header checksum                                              | `BadIpv4Checksum`    |
//! | a source no single host sends from: 0/8, 127/8, multicast, 255.255.255.255 | `MartianSource` |
//! | more-fragments set or fragment offset not 0                  | `Ipv4Fragment`       |
//! | IPv4 options (IHL above 5) on TCP or UDP                     | `Ipv4Options`        |
//! | TCP segment under 20 bytes, data offset below 5 or past the end | `BadTcpHeader`    |
//! | UDP under 8 bytes, length field below 8 (0 included) or past the IP payload | `BadUdpHeader` |
//! | ICMP message under its 8-byte header                         | `Truncated`          |
//!
//! IPv6, after the L2 checks:
//!
//! | check                                                        | reason               |
//! |--------------------------------------------------------------|----------------------|
//! | IPv6 header under 40 bytes                                   | `Truncated`          |
//! | version not 6, payload length past the frame                 | `BadIpv6Header`      |
//! | multicast or loopback source address (RFC 4291)              | `MartianSource`      |
//! | more than six extension headers                              | `Ipv6TooManyExtHeaders` |
//! | an extension header past the end of the payload              | `Ipv6ExtHeaderTruncated` |
//! | hop-by-hop options not first                                 | `Ipv6HopByHopNotFirst` |
//! | an option that says "discard if unrecognised" (jumbo too)    | `Ipv6UnrecognizedOption` |
//! | an option past the end of its header                         | `Ipv6MalformedOption` |
//! | a routing header with segments left                          | `Ipv6RoutingHeader`  |
//! | a non-first fragment, or a first one with more to come       | `Ipv6Fragment`       |
//! | TCP, UDP: as for IPv4, within the payload length             | `BadTcpHeader` / `BadUdpHeader` |
//! | ICMPv6 message under its 8-byte header                       | `Truncated`          |
//!
//! An atomic fragment (offset 0, no more fragments, RFC 6946) is a whole packet and
//! goes on. For IPv6, `ip_total_len` is the fixed header plus the payload length, and
//! `l4` is where the upper-layer header starts after the extension headers.
//!
//! L4 bounds are the IPv4 total length, never the frame: Ethernet padding after the IP
//! packet is not part of any header or payload.
//!
//! **L4 checksums are not verified here.** The rewrites in `forward` update TCP and
//! UDP checksums incrementally (RFC 1624), and an incremental update carries a wrong
//! checksum over as wrong: the receiving host drops the segment as it would have without
//! Sluice. Verifying would cost a pass over every payload byte per packet for no change
//! in outcome (IPVS, Katran and DPVS do not verify on the forwarding path either, and
//! NICs that validate on receive flag the mbuf instead). ARP frames are only recognised;
//! the local responder validates them. ICMP checksums are verified where ICMP is
//! consumed or rewritten (the responder, `forward::icmp::nat_translate_error`).
//!
//! IPv4 options are accepted on ICMP (and other protocols): they are handed to the local
//! responder, or translated with their header length honoured.

use std::net::Ipv4Addr;

use crate::flow::{FlowKey4, FlowKey6};
use crate::model::DropReason;
use crate::model::Protocol;
use crate::wire::ethernet::{self, EtherType, L2Header};
use crate::wire::ipv6::{self, ExtHeaderError};
use crate::wire::tcp::{self, TcpFlags};
use crate::wire::{icmp, icmpv6, ipv4, udp, IpProtocol};

/// What a classified frame carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PacketKind {
    /// A TCP segment: its 5-tuple as seen on the wire, its flags, and the number of
    /// data bytes after the TCP header (bounded by the IP total length).
    Tcp {
        key: FlowKey4,
        flags: TcpFlags,
        payload_len: u16,
    },
    /// A UDP datagram: its 5-tuple as seen on the wire.
    Udp { key: FlowKey4 },
    /// An ICMP message (at least its 8-byte header is present; checksum not verified).
    Icmp {
        src: Ipv4Addr,
        dst: Ipv4Addr,
        icmp_type: icmp::Message,
        code: u8,
    },
    /// An ARP frame, not validated further (`l4 == l3`, `ip_total_len == 0`).
    Arp,
    /// An IPv4 packet of another protocol (IP-in-IP, GRE, ...), not parsed further.
    OtherIpv4 {
        src: Ipv4Addr,
        dst: Ipv4Addr,
        protocol: IpProtocol,
    },
    /// An IPv6 packet; its addresses are read from the header at `l3` by whoever
    /// takes it (they would double the size of every `Parsed`).
    Ipv6(Ipv6Payload),
}

/// What an IPv6 packet carries after its extension headers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ipv6Payload {
    /// A TCP segment (header checked as for IPv4), for the IPv6 services.
    Tcp {
        sport: u16,
        dport: u16,
        flags: TcpFlags,
        payload_len: u16,
    },
    /// A UDP datagram (header checked as for IPv4), for the IPv6 services.
    Udp { sport: u16, dport: u16 },
    /// An ICMPv6 message (at least its 8-byte header; checksum not verified).
    Icmp {
        icmp_type: icmpv6::Message,
        code: u8,
    },
    /// Another upper-layer protocol (or ESP, or no next header), not parsed further.
    Other { protocol: IpProtocol },
}

/// A frame that passed [`classify`]: where its headers are, and what it carries.
///
/// The offsets are from the start of the frame. For IPv4, `l3 + ip_total_len` is where
/// the IP packet ends (padding may follow) and `l4 = l3 + IHL * 4`. The `forward`
/// functions take a `Parsed` together with its frame; they re-check every offset they
/// use, so a `Parsed` that belongs to another frame yields an error, never a panic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Parsed {
    pub l2: L2Header,
    /// Offset of the IPv4 (or ARP) header.
    pub l3: usize,
    /// Offset of the L4 header (TCP, UDP, ICMP, ...).
    pub l4: usize,
    /// The IPv4 total length (header plus payload, padding excluded).
    pub ip_total_len: u16,
    pub kind: PacketKind,
}

impl Parsed {
    /// A value for [`classify_into`] to write over: an ARP frame with no VLAN tag.
    pub const PLACEHOLDER: Parsed = Parsed {
        l2: L2Header {
            vlan_tags: 0,
            vlan_id: None,
            ethertype: EtherType::ARP,
            l3_offset: ethernet::HEADER_LEN,
        },
        l3: ethernet::HEADER_LEN,
        l4: ethernet::HEADER_LEN,
        ip_total_len: 0,
        kind: PacketKind::Arp,
    };

    /// Offset one past the IPv4 packet's last byte (start of any Ethernet padding).
    pub fn ip_end(&self) -> usize {
        self.l3.saturating_add(self.ip_total_len as usize)
    }

    /// Length of the L4 part: the IP payload.
    pub fn l4_len(&self) -> usize {
        self.ip_end().saturating_sub(self.l4)
    }

    /// The 5-tuple of a TCP or UDP packet.
    pub fn flow_key(&self) -> Option<FlowKey4> {
        match self.kind {
            PacketKind::Tcp { key, .. } | PacketKind::Udp { key } => Some(key),
            _ => None,
        }
    }

    /// The IPv4 source and destination, for any IPv4 packet.
    pub fn ip_addrs(&self) -> Option<(Ipv4Addr, Ipv4Addr)> {
        match self.kind {
            PacketKind::Tcp { key, .. } | PacketKind::Udp { key } => {
                Some((key.src_addr(), key.dst_addr()))
            }
            PacketKind::Icmp { src, dst, .. } | PacketKind::OtherIpv4 { src, dst, .. } => {
                Some((src, dst))
            }
            PacketKind::Arp | PacketKind::Ipv6(_) => None,
        }
    }
}

/// The 5-tuple [`classify`] will most likely find in `frame`, read without
/// validating anything: untagged Ethernet, IPv4 (any header length), TCP or UDP ports.
/// A speculative read for the burst's prefetch pass, which only warms the cache: it
/// may be wrong (a bad checksum, a fragment, a frame `classify` refuses) and nothing
/// may be decided on it. `None` where there is no such tuple to read.
#[inline]
pub fn peek_key(frame: &[u8]) -> Option<FlowKey4> {
    let eth = ethernet::Frame::new_checked(frame).ok()?;
    if eth.ethertype() != EtherType::IPV4 {
        return None;
    }
    let ip = ipv4::Packet::new_checked(eth.payload()).ok()?;
    let proto = Protocol::from_ip_protocol(ip.protocol().0)?;
    let ports = ip.payload().get(..4)?;
    Some(FlowKey4 {
        src: u32::from(ip.src_addr()),
        dst: u32::from(ip.dst_addr()),
        sport: u16::from_be_bytes([ports[0], ports[1]]),
        dport: u16::from_be_bytes([ports[2], ports[3]]),
        proto,
    })
}

/// [`peek_key`] for IPv6: untagged Ethernet, an IPv6 header whose next header is TCP
/// or UDP (no extension header), its ports. As speculative: nothing may be decided
/// on it.
#[inline]
pub fn peek_key6(frame: &[u8]) -> Option<FlowKey6> {
    let eth = ethernet::Frame::new_checked(frame).ok()?;
    if eth.ethertype() != EtherType::IPV6 {
        return None;
    }
    let ip = ipv6::Packet::new_checked(eth.payload()).ok()?;
    let proto = Protocol::from_ip_protocol(ip.next_header().0)?;
    let ports = eth.payload().get(ipv6::HEADER_LEN..ipv6::HEADER_LEN + 4)?;
    Some(FlowKey6 {
        src: ip.src_addr(),
        dst: ip.dst_addr(),
        sport: u16::from_be_bytes([ports[0], ports[1]]),
        dport: u16::from_be_bytes([ports[2], ports[3]]),
        proto,
    })
}

/// Classifies a received frame for forwarding; see the module doc for the order of
/// checks. Never panics, never allocates, whatever the bytes.
#[inline(always)]
pub fn classify(frame: &[u8]) -> Result<Parsed, DropReason> {
    let mut parsed = Parsed::PLACEHOLDER;
    classify_into(frame, &mut parsed).map(|()| parsed)
}

/// [`classify`], writing the frame's [`Parsed`] into `out` field by field; on an
/// error `out` holds whatever was written before it (a valid but meaningless value).
///
/// Why it exists: a `Parsed` returned by value is built in a scratch slot, one narrow
/// store a field, then copied into its place with 16-byte moves; each such load spans
/// several of those stores, so it cannot take its bytes from the store buffer and
/// waits for them to reach the cache (12-19 cycles an established packet,
/// perf/results/nat_rewrite.md). The burst's classify pass writes straight into the
/// slot its frames are handled from.
#[inline(always)]
pub fn classify_into(frame: &[u8], out: &mut Parsed) -> Result<(), DropReason> {
    let l2 = ethernet::parse_l2(frame).map_err(|_| DropReason::Truncated)?;
    let l3 = l2.l3_offset;
    out.l2 = l2;
    out.l3 = l3;
    match l2.ethertype {
        EtherType::IPV4 => {}
        EtherType::ARP => {
            out.l4 = l3;
            out.ip_total_len = 0;
            out.kind = PacketKind::Arp;
            return Ok(());
        }
        EtherType::IPV6 => return classify_ipv6(frame, l3, out),
        _ => return Err(DropReason::UnknownEthertype),
    }

    let bytes = frame.get(l3..).ok_or(DropReason::Truncated)?;
    if bytes.len() < ipv4::MIN_HEADER_LEN {
        return Err(DropReason::Truncated);
    }
    // Past 20 bytes every inconsistency is the header's fault: an IHL or a total length
    // that points past the frame is a lie, not a short read.
    let packet = ipv4::Packet::new_checked(bytes).map_err(|_| DropReason::BadIpv4Header)?;
    if !packet.verify_checksum() {
        return Err(DropReason::BadIpv4Checksum);
    }
    // Linux drops these at input (`martian_source`; it takes 0.0.0.0 to the limited
    // broadcast, DHCP, which comes in broadcast frames Sluice forwards nothing from):
    // forwarded or answered, they would reach a group, the sender's own loopback, or
    // no one.
    if ipv4::is_martian_source(packet.src_addr()) {
        return Err(DropReason::MartianSource);
    }
    if packet.is_fragment() {
        return Err(DropReason::Ipv4Fragment);
    }
    let (src, dst) = (packet.src_addr(), packet.dst_addr());
    out.l4 = l3 + packet.header_len();
    out.ip_total_len = packet.total_len();
    let segment = packet.payload();
    // Each arm stores its own variant: a `kind` chosen by a `match` and stored once
    // after it would be built in a scratch slot and copied, as above.
    match packet.protocol() {
        IpProtocol::TCP => {
            if packet.has_options() {
                return Err(DropReason::Ipv4Options);
            }
            let tcp = tcp::Packet::new_checked(segment).map_err(|_| DropReason::BadTcpHeader)?;
            out.kind = PacketKind::Tcp {
                key: FlowKey4::new(Protocol::Tcp, src, tcp.src_port(), dst, tcp.dst_port()),
                flags: tcp.flags(),
                // A segment inside an IPv4 packet is under 64 KiB.
                payload_len: tcp.payload().len() as u16,
            };
        }
        IpProtocol::UDP => {
            if packet.has_options() {
                return Err(DropReason::Ipv4Options);
            }
            let udp = udp::Packet::new_checked(segment).map_err(|_| DropReason::BadUdpHeader)?;
            out.kind = PacketKind::Udp {
                key: FlowKey4::new(Protocol::Udp, src, udp.src_port(), dst, udp.dst_port()),
            };
        }
        IpProtocol::ICMP => {
            let message = icmp::Packet::new_checked(segment).map_err(|_| DropReason::Truncated)?;
            out.kind = PacketKind::Icmp {
                src,
                dst,
                icmp_type: message.msg_type(),
                code: message.msg_code(),
            };
        }
        protocol => out.kind = PacketKind::OtherIpv4 { src, dst, protocol },
    }
    Ok(())
}

/// The IPv6 part of [`classify`], from the IPv6 header on; see the module doc.
#[inline(never)]
fn classify_ipv6(frame: &[u8], l3: usize, out: &mut Parsed) -> Result<(), DropReason> {
    let bytes = frame.get(l3..).ok_or(DropReason::Truncated)?;
    if bytes.len() < ipv6::HEADER_LEN {
        return Err(DropReason::Truncated);
    }
    let packet = ipv6::Packet::new_checked(bytes).map_err(|_| DropReason::BadIpv6Header)?;
    let ip_total_len = u16::try_from(ipv6::HEADER_LEN + packet.payload_len() as usize)
        .map_err(|_| DropReason::BadIpv6Header)?;
    // The unspecified source goes on: a duplicate address probe comes from it.
    let src = packet.src_addr();
    if src.is_multicast() || src.is_loopback() {
        return Err(DropReason::MartianSource);
    }
    let upper = packet.upper_layer().map_err(ext_header_drop)?;
    if upper.fragment.is_some_and(|f| f.more_frags) {
        return Err(DropReason::Ipv6Fragment);
    }
    let l4 = l3 + upper.offset;
    let segment = bytes
        .get(upper.offset..ip_total_len as usize)
        .ok_or(DropReason::Ipv6ExtHeaderTruncated)?;
    let payload = match upper.protocol {
        IpProtocol::TCP => {
            let tcp = tcp::Packet::new_checked(segment).map_err(|_| DropReason::BadTcpHeader)?;
            Ipv6Payload::Tcp {
                sport: tcp.src_port(),
                dport: tcp.dst_port(),
                flags: tcp.flags(),
                payload_len: tcp.payload().len() as u16,
            }
        }
        IpProtocol::UDP => {
            let udp = udp::Packet::new_checked(segment).map_err(|_| DropReason::BadUdpHeader)?;
            Ipv6Payload::Udp {
                sport: udp.src_port(),
                dport: udp.dst_port(),
            }
        }
        IpProtocol::ICMPV6 => {
            let message =
                icmpv6::Packet::new_checked(segment).map_err(|_| DropReason::Truncated)?;
            Ipv6Payload::Icmp {
                icmp_type: message.msg_type(),
                code: message.msg_code(),
            }
        }
        protocol => Ipv6Payload::Other { protocol },
    };
    out.l4 = l4;
    out.ip_total_len = ip_total_len;
    out.kind = PacketKind::Ipv6(payload);
    Ok(())
}

/// The drop reason for each way the extension-header walk can fail (of a packet, or
/// of the packet an ICMPv6 error quotes).
pub fn ext_header_drop(err: ExtHeaderError) -> DropReason {
    match err {
        ExtHeaderError::TooManyHeaders => DropReason::Ipv6TooManyExtHeaders,
        ExtHeaderError::Truncated => DropReason::Ipv6ExtHeaderTruncated,
        ExtHeaderError::HopByHopNotFirst => DropReason::Ipv6HopByHopNotFirst,
        ExtHeaderError::UnrecognizedOption => DropReason::Ipv6UnrecognizedOption,
        ExtHeaderError::MalformedOption => DropReason::Ipv6MalformedOption,
        ExtHeaderError::RoutingSegmentsLeft => DropReason::Ipv6RoutingHeader,
        ExtHeaderError::NonFirstFragment => DropReason::Ipv6Fragment,
    }
}

#[cfg(test)]
pub(crate) mod fixtures {
    //! Frames shared by the classification and forwarding tests.
    use std::net::Ipv4Addr;

    use crate::wire::MacAddr;

    pub const CLIENT: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 10);
    pub const VIP: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 10);
    /// The real server.
    pub const RIP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 11);
    /// Sluice's own (local) address on the real-server side.
    pub const LIP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
    pub const ROUTER: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
    pub const CLIENT_MAC: MacAddr = MacAddr([0x52, 0x54, 0x00, 0x12, 0x34, 0x56]);
    pub const OUR_MAC: MacAddr = MacAddr([0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c]);
    pub const RS_MAC: MacAddr = MacAddr([0x52, 0x54, 0x00, 0x00, 0x00, 0x0b]);

    // Fixtures built with scapy 2.5 (independent of the wire module), no FCS, short
    // frames padded to 60 bytes.

    // TCP SYN 198.51.100.10:40000 -> 203.0.113.10:80 with MSS/SACK/TS/WS options.
    pub static TCP_SYN: [u8; 74] = [
        0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x08, 0x00, 0x45,
        0x00, 0x00, 0x3c, 0x1c, 0x46, 0x40, 0x00, 0x3d, 0x06, 0xbb, 0x2d, 0xc6, 0x33, 0x64, 0x0a,
        0xcb, 0x00, 0x71, 0x0a, 0x9c, 0x40, 0x00, 0x50, 0x01, 0x02, 0x03, 0x04, 0x00, 0x00, 0x00,
        0x00, 0xa0, 0x02, 0xfa, 0xf0, 0x46, 0x2f, 0x00, 0x00, 0x02, 0x04, 0x05, 0xb4, 0x04, 0x02,
        0x08, 0x0a, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x01, 0x03, 0x03, 0x07,
    ];
    // 802.1Q VLAN 100: TCP PSH|ACK with a 29-byte HTTP request (odd length), client -> VIP:80.
    pub static TCP_DATA_VLAN: [u8; 87] = [
        0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x81, 0x00, 0x00,
        0x64, 0x08, 0x00, 0x45, 0x00, 0x00, 0x45, 0x00, 0x07, 0x40, 0x00, 0x3d, 0x06, 0xd7, 0x63,
        0xc6, 0x33, 0x64, 0x0a, 0xcb, 0x00, 0x71, 0x0a, 0x9c, 0x40, 0x00, 0x50, 0x00, 0x00, 0x03,
        0xe8, 0x00, 0x00, 0x07, 0xd0, 0x50, 0x18, 0x01, 0xf6, 0xdd, 0x09, 0x00, 0x00, 0x47, 0x45,
        0x54, 0x20, 0x2f, 0x20, 0x48, 0x54, 0x54, 0x50, 0x2f, 0x31, 0x2e, 0x31, 0x0d, 0x0a, 0x48,
        0x6f, 0x73, 0x74, 0x3a, 0x20, 0x76, 0x69, 0x70, 0x0d, 0x0a, 0x0d, 0x0a,
    ];
    // UDP DNS query 198.51.100.10:5353 -> 203.0.113.10:53, 29-byte payload, checksum set.
    pub static UDP_DNS: [u8; 71] = [
        0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x08, 0x00, 0x45,
        0x00, 0x00, 0x39, 0x42, 0x42, 0x00, 0x00, 0x40, 0x11, 0xd2, 0x29, 0xc6, 0x33, 0x64, 0x0a,
        0xcb, 0x00, 0x71, 0x0a, 0x14, 0xe9, 0x00, 0x35, 0x00, 0x25, 0x09, 0x02, 0xab, 0xcd, 0x01,
        0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x07, 0x65, 0x78, 0x61, 0x6d, 0x70,
        0x6c, 0x65, 0x03, 0x63, 0x6f, 0x6d, 0x00, 0x00, 0x01, 0x00, 0x01,
    ];
    // UDP 198.51.100.10:6000 -> 203.0.113.10:53 with checksum 0 (none), padded to 60.
    pub static UDP_NO_CHECKSUM: [u8; 60] = [
        0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x08, 0x00, 0x45,
        0x00, 0x00, 0x28, 0x42, 0x43, 0x00, 0x00, 0x40, 0x11, 0xd2, 0x39, 0xc6, 0x33, 0x64, 0x0a,
        0xcb, 0x00, 0x71, 0x0a, 0x17, 0x70, 0x00, 0x35, 0x00, 0x14, 0x00, 0x00, 0x6e, 0x6f, 0x20,
        0x63, 0x68, 0x65, 0x63, 0x6b, 0x73, 0x75, 0x6d, 0x21, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];
    // ICMP echo request client -> VIP, ident 0x0b1e seq 1, 8 bytes of data.
    pub static ICMP_ECHO: [u8; 60] = [
        0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x08, 0x00, 0x45,
        0x00, 0x00, 0x24, 0x00, 0x09, 0x40, 0x00, 0x40, 0x01, 0xd4, 0x87, 0xc6, 0x33, 0x64, 0x0a,
        0xcb, 0x00, 0x71, 0x0a, 0x08, 0x00, 0x35, 0x4d, 0x0b, 0x1e, 0x00, 0x01, 0x70, 0x69, 0x6e,
        0x67, 0x64, 0x61, 0x74, 0x61, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];
    // Broadcast ARP who-has 203.0.113.10 tell 198.51.100.10.
    pub static ARP_REQUEST: [u8; 60] = [
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x08, 0x06, 0x00,
        0x01, 0x08, 0x00, 0x06, 0x04, 0x00, 0x01, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0xc6, 0x33,
        0x64, 0x0a, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xcb, 0x00, 0x71, 0x0a, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];
    // IPv6/UDP frame.
    pub static IPV6_UDP: [u8; 62] = [
        0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x86, 0xdd, 0x60,
        0x00, 0x00, 0x00, 0x00, 0x08, 0x11, 0x40, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x01, 0x00, 0x02, 0x00, 0x08,
        0xa4, 0x66,
    ];
    // IPv6 TCP SYN 2001:db8::a:40000 -> 2001:db8::99:80 behind hop-by-hop (PadN), destination options (PadN) and a routing header with no segments left.
    pub static IPV6_TCP_EXT: [u8; 98] = [
        0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x86, 0xdd, 0x60,
        0x00, 0x00, 0x00, 0x00, 0x2c, 0x00, 0x40, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0a, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x99, 0x3c, 0x00, 0x01, 0x04, 0x00, 0x00,
        0x00, 0x00, 0x2b, 0x00, 0x01, 0x04, 0x00, 0x00, 0x00, 0x00, 0x06, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x9c, 0x40, 0x00, 0x50, 0x00, 0x00, 0x03, 0xe8, 0x00, 0x00, 0x00, 0x00,
        0x50, 0x02, 0x20, 0x00, 0x93, 0x55, 0x00, 0x00,
    ];
    // The same SYN as the first fragment of two (more fragments set), fragment header only.
    pub static IPV6_TCP_FRAG: [u8; 82] = [
        0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x86, 0xdd, 0x60,
        0x00, 0x00, 0x00, 0x00, 0x1c, 0x2c, 0x40, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0a, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x99, 0x06, 0x00, 0x00, 0x01, 0x00, 0x00,
        0x00, 0x07, 0x9c, 0x40, 0x00, 0x50, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x50,
        0x02, 0x20, 0x00, 0x97, 0x3d, 0x00, 0x00,
    ];
    // ICMPv6 echo request 2001:db8::a -> 2001:db8::99, 4 bytes of data.
    pub static IPV6_ECHO: [u8; 66] = [
        0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x86, 0xdd, 0x60,
        0x00, 0x00, 0x00, 0x00, 0x0c, 0x3a, 0x40, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0a, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x99, 0x80, 0x00, 0x44, 0xd1, 0x00, 0x01,
        0x00, 0x01, 0x70, 0x69, 0x6e, 0x67,
    ];
    // TCP SYN whose IPv4 header carries 4 NOP options (IHL 6), checksum valid.
    pub static TCP_IP_OPTIONS: [u8; 60] = [
        0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x08, 0x00, 0x46,
        0x00, 0x00, 0x2c, 0x00, 0x03, 0x00, 0x00, 0x40, 0x06, 0x11, 0x7f, 0xc6, 0x33, 0x64, 0x0a,
        0xcb, 0x00, 0x71, 0x0a, 0x01, 0x01, 0x01, 0x01, 0x9c, 0x40, 0x00, 0x50, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x50, 0x02, 0x20, 0x00, 0x8d, 0x09, 0x00, 0x00, 0x00, 0x00,
    ];
    // ICMP echo whose IPv4 header carries 4 NOP options (IHL 6), checksum valid.
    pub static ICMP_IP_OPTIONS: [u8; 60] = [
        0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x08, 0x00, 0x46,
        0x00, 0x00, 0x20, 0x00, 0x03, 0x00, 0x00, 0x40, 0x01, 0x11, 0x90, 0xc6, 0x33, 0x64, 0x0a,
        0xcb, 0x00, 0x71, 0x0a, 0x01, 0x01, 0x01, 0x01, 0x08, 0x00, 0xf7, 0xfd, 0x00, 0x01, 0x00,
        0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];
    // First fragment (MF set, offset 0) of a UDP datagram, header checksum valid.
    pub static UDP_FIRST_FRAGMENT: [u8; 60] = [
        0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x08, 0x00, 0x45,
        0x00, 0x00, 0x24, 0x00, 0x99, 0x20, 0x00, 0x40, 0x11, 0xf3, 0xe7, 0xc6, 0x33, 0x64, 0x0a,
        0xcb, 0x00, 0x71, 0x0a, 0x13, 0x89, 0x00, 0x35, 0x00, 0x20, 0x00, 0x00, 0x01, 0x02, 0x03,
        0x04, 0x05, 0x06, 0x07, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];
    // IPv4 protocol 47 (GRE), not parsed further.
    pub static GRE_PACKET: [u8; 60] = [
        0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x08, 0x00, 0x45,
        0x00, 0x00, 0x18, 0x00, 0x05, 0x00, 0x00, 0x40, 0x2f, 0x14, 0x6a, 0xc6, 0x33, 0x64, 0x0a,
        0xcb, 0x00, 0x71, 0x0a, 0x00, 0x00, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];
    // TCP ACK with 17 bytes of data, DSCP EF, DF, client -> VIP (to be tunnelled).
    pub static TUN_INNER: [u8; 71] = [
        0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x08, 0x00, 0x45,
        0xb8, 0x00, 0x39, 0x1c, 0x46, 0x40, 0x00, 0x3d, 0x06, 0xba, 0x78, 0xc6, 0x33, 0x64, 0x0a,
        0xcb, 0x00, 0x71, 0x0a, 0x9c, 0x40, 0x00, 0x50, 0x00, 0x00, 0x00, 0x05, 0x00, 0x00, 0x00,
        0x06, 0x50, 0x10, 0x00, 0x64, 0xd6, 0x75, 0x00, 0x00, 0x74, 0x75, 0x6e, 0x6e, 0x65, 0x6c,
        0x6c, 0x65, 0x64, 0x20, 0x70, 0x61, 0x79, 0x6c, 0x6f, 0x61, 0x64,
    ];
    // QinQ (S 10, C 20): small UDP without DF, padded to 60.
    pub static TUN_INNER_QINQ: [u8; 60] = [
        0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x88, 0xa8, 0x00,
        0x0a, 0x81, 0x00, 0x00, 0x14, 0x08, 0x00, 0x45, 0x00, 0x00, 0x1e, 0x00, 0x77, 0x00, 0x00,
        0x3c, 0x11, 0x18, 0x10, 0xc6, 0x33, 0x64, 0x0a, 0xcb, 0x00, 0x71, 0x0a, 0x14, 0xe9, 0x00,
        0x35, 0x00, 0x0a, 0x1c, 0x0a, 0x68, 0x69, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];
}

#[cfg(test)]
mod tests {
    use super::fixtures::*;
    use super::*;
    use crate::wire::test_util::XorShift;

    fn expect_err(frame: &[u8], reason: DropReason) {
        assert_eq!(classify(frame), Err(reason), "{frame:02x?}");
    }

    /// Copies `frame`, applies `edit` to its IPv4 header at `l3`, and refreshes the
    /// header checksum so that only the edited field is wrong.
    fn edited(frame: &[u8], l3: usize, edit: impl FnOnce(&mut [u8])) -> Vec<u8> {
        let mut buf = frame.to_vec();
        edit(&mut buf);
        // Over the header as far as the frame holds it: an IHL past the end still
        // gets a checksum, so the IHL is what the test exercises.
        let header_len = ((buf[l3] & 0x0f) as usize * 4).clamp(20, buf.len() - l3);
        buf[l3 + 10..l3 + 12].fill(0);
        let value =
            crate::wire::checksum::finish(crate::wire::checksum::sum(&buf[l3..l3 + header_len]));
        buf[l3 + 10..l3 + 12].copy_from_slice(&value.to_be_bytes());
        buf
    }

    #[test]
    fn tcp_syn() {
        let parsed = classify(&TCP_SYN).unwrap();
        assert_eq!((parsed.l2.vlan_tags, parsed.l3, parsed.l4), (0, 14, 34));
        assert_eq!(parsed.ip_total_len, 60);
        assert_eq!(parsed.ip_end(), 74);
        assert_eq!(parsed.l4_len(), 40);
        let key = FlowKey4::new(Protocol::Tcp, CLIENT, 40000, VIP, 80);
        assert_eq!(
            parsed.kind,
            PacketKind::Tcp {
                key,
                flags: TcpFlags::SYN,
                payload_len: 0
            }
        );
        assert_eq!(parsed.flow_key(), Some(key));
        assert_eq!(parsed.ip_addrs(), Some((CLIENT, VIP)));
        assert_eq!(peek_key(&TCP_SYN), Some(key));
        // The peek reads untagged frames only, and never past the frame.
        assert_eq!(peek_key(&TCP_DATA_VLAN), None);
        assert_eq!(peek_key(&TCP_SYN[..36]), None);
        assert_eq!(peek_key(&ARP_REQUEST), None);
    }

    #[test]
    fn tcp_with_vlan_and_data() {
        let parsed = classify(&TCP_DATA_VLAN).unwrap();
        assert_eq!(parsed.l2.vlan_id, Some(100));
        assert_eq!((parsed.l3, parsed.l4, parsed.ip_total_len), (18, 38, 69));
        let PacketKind::Tcp {
            key,
            flags,
            payload_len,
        } = parsed.kind
        else {
            panic!("{parsed:?}");
        };
        assert_eq!(key, FlowKey4::new(Protocol::Tcp, CLIENT, 40000, VIP, 80));
        assert_eq!(flags, TcpFlags::PSH | TcpFlags::ACK);
        assert_eq!(payload_len, 29);
    }

    #[test]
    fn udp_with_and_without_checksum() {
        let parsed = classify(&UDP_DNS).unwrap();
        assert_eq!(
            parsed.kind,
            PacketKind::Udp {
                key: FlowKey4::new(Protocol::Udp, CLIENT, 5353, VIP, 53)
            }
        );
        assert_eq!((parsed.l4, parsed.ip_total_len), (34, 20 + 8 + 29));
        // Padding after a short datagram is not part of it.
        let parsed = classify(&UDP_NO_CHECKSUM).unwrap();
        assert_eq!(parsed.ip_end(), 14 + 40);
        assert_eq!(parsed.flow_key().unwrap().sport, 6000);
    }

    #[test]
    fn icmp_arp_other_ipv6() {
        let parsed = classify(&ICMP_ECHO).unwrap();
        assert_eq!(
            parsed.kind,
            PacketKind::Icmp {
                src: CLIENT,
                dst: VIP,
                icmp_type: icmp::Message::ECHO_REQUEST,
                code: 0
            }
        );
        assert_eq!(parsed.flow_key(), None);

        let parsed = classify(&ARP_REQUEST).unwrap();
        assert_eq!(parsed.kind, PacketKind::Arp);
        assert_eq!((parsed.l3, parsed.l4, parsed.ip_total_len), (14, 14, 0));
        assert_eq!(parsed.ip_addrs(), None);

        let parsed = classify(&GRE_PACKET).unwrap();
        assert_eq!(
            parsed.kind,
            PacketKind::OtherIpv4 {
                src: CLIENT,
                dst: VIP,
                protocol: IpProtocol(47)
            }
        );

        let parsed = classify(&IPV6_UDP).unwrap();
        assert_eq!(
            parsed.kind,
            PacketKind::Ipv6(Ipv6Payload::Udp { sport: 1, dport: 2 })
        );
        assert_eq!((parsed.l3, parsed.l4, parsed.ip_end()), (14, 54, 62));
        assert_eq!((parsed.flow_key(), parsed.ip_addrs()), (None, None));
        let mut lldp = ARP_REQUEST;
        lldp[12..14].copy_from_slice(&[0x88, 0xcc]);
        expect_err(&lldp, DropReason::UnknownEthertype);
    }

    #[test]
    fn ipv6_upper_layers() {
        let parsed = classify(&IPV6_TCP_EXT).unwrap();
        assert_eq!(
            parsed.kind,
            PacketKind::Ipv6(Ipv6Payload::Tcp {
                sport: 40000,
                dport: 80,
                flags: TcpFlags::SYN,
                payload_len: 0
            })
        );
        assert_eq!((parsed.l3, parsed.l4, parsed.ip_end()), (14, 78, 98));
        let parsed = classify(&IPV6_ECHO).unwrap();
        assert_eq!(
            parsed.kind,
            PacketKind::Ipv6(Ipv6Payload::Icmp {
                icmp_type: icmpv6::Message::ECHO_REQUEST,
                code: 0
            })
        );
        assert_eq!(parsed.l4_len(), 12);
        // An atomic fragment is whole: the TCP header after it is found.
        let atomic = edited(&IPV6_TCP_FRAG, 14, |b| b[57] = 0);
        let parsed = classify(&atomic).unwrap();
        assert!(matches!(
            parsed.kind,
            PacketKind::Ipv6(Ipv6Payload::Tcp { .. })
        ));
        assert_eq!(parsed.l4, 62);
        // Six extension headers are crossed; what follows the last is the upper layer.
        let chain = |count: usize| {
            let mut frame = IPV6_TCP_EXT[..54].to_vec();
            frame[20] = 60;
            frame[18..20].copy_from_slice(&(8 * count as u16).to_be_bytes());
            for i in 0..count {
                let next = if i + 1 == count { 59 } else { 60 };
                frame.extend_from_slice(&[next, 0, 1, 4, 0, 0, 0, 0]);
            }
            frame
        };
        let parsed = classify(&chain(6)).unwrap();
        assert_eq!(
            parsed.kind,
            PacketKind::Ipv6(Ipv6Payload::Other {
                protocol: IpProtocol(59)
            })
        );
        expect_err(&chain(7), DropReason::Ipv6TooManyExtHeaders);
    }

    #[test]
    fn ipv6_drop_reasons() {
        use DropReason::*;
        for len in 14..54 {
            expect_err(&IPV6_ECHO[..len], Truncated);
        }
        expect_err(&edited(&IPV6_ECHO, 14, |b| b[14] = 0x40), BadIpv6Header);
        expect_err(&edited(&IPV6_ECHO, 14, |b| b[19] += 1), BadIpv6Header);
        expect_err(&IPV6_ECHO[..65], BadIpv6Header);
        expect_err(&edited(&IPV6_ECHO, 14, |b| b[22] = 0xff), MartianSource);
        // (`edited` would write an IPv4 checksum into the source address.)
        let mut loopback_source = IPV6_ECHO;
        loopback_source[22..38].copy_from_slice(&std::net::Ipv6Addr::LOCALHOST.octets());
        expect_err(&loopback_source, MartianSource);
        // A duplicate address probe comes from the unspecified address: it goes on.
        let mut unspecified_source = IPV6_ECHO;
        unspecified_source[22..38].fill(0);
        assert!(classify(&unspecified_source).is_ok());
        // The extension-header walk: one reason per way it fails.
        expect_err(&edited(&IPV6_TCP_EXT, 14, |b| b[73] = 1), Ipv6RoutingHeader);
        expect_err(
            &edited(&IPV6_TCP_EXT, 14, |b| b[62] = 0),
            Ipv6HopByHopNotFirst,
        );
        expect_err(
            &edited(&IPV6_TCP_EXT, 14, |b| b[56] = 0xc2),
            Ipv6UnrecognizedOption,
        );
        expect_err(
            &edited(&IPV6_TCP_EXT, 14, |b| b[57] = 5),
            Ipv6MalformedOption,
        );
        let cut_chain = edited(&IPV6_TCP_EXT, 14, |b| b[18..20].copy_from_slice(&[0, 10]));
        expect_err(&cut_chain, Ipv6ExtHeaderTruncated);
        expect_err(&IPV6_TCP_FRAG, Ipv6Fragment);
        let later = edited(&IPV6_TCP_FRAG, 14, |b| b[56..58].copy_from_slice(&[0, 8]));
        expect_err(&later, Ipv6Fragment);
        let last = edited(&IPV6_TCP_FRAG, 14, |b| {
            b[56..58].copy_from_slice(&[0, 0x10])
        });
        expect_err(&last, Ipv6Fragment);
        // Upper-layer headers, bounded by the payload length.
        let short_tcp = edited(&IPV6_TCP_FRAG, 14, |b| {
            b[57] = 0;
            b[18..20].copy_from_slice(&[0, 8 + 12]);
        });
        expect_err(&short_tcp, BadTcpHeader);
        let long_udp = edited(&IPV6_UDP, 14, |b| b[59] = 9);
        expect_err(&long_udp, BadUdpHeader);
        let short_icmp = edited(&IPV6_ECHO, 14, |b| b[18..20].copy_from_slice(&[0, 4]));
        expect_err(&short_icmp, Truncated);
    }

    #[test]
    fn truncated() {
        // Every cut inside the Ethernet or IPv4 header, untagged and tagged.
        for len in 0..34 {
            expect_err(&TCP_SYN[..len], DropReason::Truncated);
        }
        for len in 0..38 {
            expect_err(&TCP_DATA_VLAN[..len], DropReason::Truncated);
        }
        // An ICMP message cut inside its header (total length adjusted to the cut).
        let short_icmp = edited(&ICMP_ECHO[..14 + 20 + 4], 14, |b| b[17] = 24);
        expect_err(&short_icmp, DropReason::Truncated);
    }

    #[test]
    fn bad_ipv4_header() {
        let version6 = edited(&TCP_SYN, 14, |b| b[14] = 0x65);
        expect_err(&version6, DropReason::BadIpv4Header);
        let ihl4 = edited(&TCP_SYN, 14, |b| b[14] = 0x44);
        expect_err(&ihl4, DropReason::BadIpv4Header);
        // IHL 15 (60 bytes) over a 60-byte packet is consistent but leaves no TCP
        // header; IHL 15 over a 40-byte total length is not.
        let ihl_past_total = edited(&UDP_DNS, 14, |b| {
            b[14] = 0x4f;
            b[17] = 40;
        });
        expect_err(&ihl_past_total, DropReason::BadIpv4Header);
        // A total length larger than the frame: the frame lies, it is not merely cut.
        let total_past_frame = edited(&TCP_SYN, 14, |b| b[17] = 61);
        expect_err(&total_past_frame, DropReason::BadIpv4Header);
        let total_below_header = edited(&TCP_SYN, 14, |b| b[17] = 19);
        expect_err(&total_below_header, DropReason::BadIpv4Header);
        // The same frame cut short after the IPv4 header: total length past the end.
        expect_err(&TCP_SYN[..40], DropReason::BadIpv4Header);
    }

    #[test]
    fn bad_ipv4_checksum() {
        let mut corrupt = TCP_SYN;
        corrupt[22] -= 1; // TTL, checksum left as is
        expect_err(&corrupt, DropReason::BadIpv4Checksum);
    }

    #[test]
    fn martian_sources() {
        for frame in [&TCP_SYN[..], &UDP_DNS[..], &ICMP_ECHO[..]] {
            for source in [[0, 1, 2, 3], [127, 0, 0, 1], [224, 0, 0, 5], [255; 4]] {
                let martian = edited(frame, 14, |b| b[26..30].copy_from_slice(&source));
                expect_err(&martian, DropReason::MartianSource);
            }
            for source in [[1, 0, 0, 1], [126, 255, 255, 255], [223, 255, 255, 254]] {
                let host = edited(frame, 14, |b| b[26..30].copy_from_slice(&source));
                assert!(classify(&host).is_ok(), "{source:?}");
            }
        }
    }

    #[test]
    fn fragments() {
        expect_err(&UDP_FIRST_FRAGMENT, DropReason::Ipv4Fragment);
        // A non-first fragment, no MF (the last one), and a middle one.
        let last = edited(&UDP_DNS, 14, |b| b[20..22].copy_from_slice(&[0x00, 0xb9]));
        expect_err(&last, DropReason::Ipv4Fragment);
        let middle = edited(&ICMP_ECHO, 14, |b| b[20..22].copy_from_slice(&[0x20, 0x01]));
        expect_err(&middle, DropReason::Ipv4Fragment);
        // DF alone is not a fragment.
        assert!(classify(&TCP_SYN).is_ok());
    }

    #[test]
    fn ip_options() {
        expect_err(&TCP_IP_OPTIONS, DropReason::Ipv4Options);
        let udp = edited(&TCP_IP_OPTIONS, 14, |b| b[23] = 17);
        expect_err(&udp, DropReason::Ipv4Options);
        // ICMP with options is accepted: the header length is honoured.
        let parsed = classify(&ICMP_IP_OPTIONS).unwrap();
        assert_eq!((parsed.l3, parsed.l4), (14, 38));
        assert!(matches!(parsed.kind, PacketKind::Icmp { .. }));
    }

    #[test]
    fn bad_tcp_header() {
        // Data offset 15 (60 bytes) in a 40-byte segment: past the end.
        let mut past_end = TCP_SYN;
        past_end[46] = 0xf0;
        expect_err(&past_end, DropReason::BadTcpHeader);
        // Data offset below 5.
        let mut below_min = TCP_SYN;
        below_min[46] = 0x40;
        expect_err(&below_min, DropReason::BadTcpHeader);
        // A segment of 12 bytes (total length 32), the frame still 74 bytes long.
        let short = edited(&TCP_SYN, 14, |b| b[17] = 32);
        expect_err(&short, DropReason::BadTcpHeader);
        // A data offset inside the segment but past the IP total length, in padding.
        let padded = edited(&TCP_SYN, 14, |b| b[17] = 50);
        expect_err(&padded, DropReason::BadTcpHeader);
    }

    #[test]
    fn bad_udp_header() {
        let mut zero_len = UDP_DNS;
        zero_len[38..40].copy_from_slice(&[0, 0]);
        expect_err(&zero_len, DropReason::BadUdpHeader);
        let mut below_header = UDP_DNS;
        below_header[38..40].copy_from_slice(&[0, 7]);
        expect_err(&below_header, DropReason::BadUdpHeader);
        // One byte past the IP payload (there is padding after it in the frame).
        let mut past_payload = UDP_NO_CHECKSUM;
        past_payload[38..40].copy_from_slice(&[0, 21]);
        expect_err(&past_payload, DropReason::BadUdpHeader);
        // An IP payload of 4 bytes cannot hold a UDP header.
        let short = edited(&UDP_DNS, 14, |b| b[17] = 24);
        expect_err(&short, DropReason::BadUdpHeader);
        // A length below the IP payload is accepted (trailing bytes ignored).
        let mut shorter = UDP_DNS;
        shorter[38..40].copy_from_slice(&[0, 8]);
        assert!(classify(&shorter).is_ok());
    }

    #[test]
    fn l4_checksum_not_verified() {
        let mut bad = TCP_SYN;
        bad[50] ^= 0xff;
        assert!(classify(&bad).is_ok());
        let mut bad = UDP_DNS;
        bad[40] ^= 0xff;
        assert!(classify(&bad).is_ok());
    }

    #[test]
    fn fuzz_never_panics_and_offsets_hold() {
        let mut rng = XorShift(0x5151_a0a0_7e7e_0101);
        let fixtures: [&[u8]; 13] = [
            &IPV6_UDP,
            &IPV6_TCP_EXT,
            &IPV6_TCP_FRAG,
            &IPV6_ECHO,
            &TCP_SYN,
            &TCP_DATA_VLAN,
            &UDP_DNS,
            &UDP_NO_CHECKSUM,
            &ICMP_ECHO,
            &ARP_REQUEST,
            &TCP_IP_OPTIONS,
            &ICMP_IP_OPTIONS,
            &GRE_PACKET,
        ];
        let mut buf = [0u8; 256];
        let mut ipv6_peeks = 0;
        for round in 0..200_000 {
            let len = if round % 2 == 0 {
                // Pure noise, with an IPv4 or IPv6 EtherType half of the time.
                let len = rng.below(buf.len() + 1);
                rng.fill(&mut buf[..len]);
                if len >= 14 && rng.below(2) == 0 {
                    let v6 = rng.below(2) == 0;
                    buf[12..14].copy_from_slice(if v6 { &[0x86, 0xdd] } else { &[0x08, 0x00] });
                    if len > 14 {
                        buf[14] = if v6 { 0x60 } else { 0x45 };
                    }
                }
                len
            } else {
                // A valid frame with a few bytes flipped and a random cut.
                let fixture = fixtures[rng.below(fixtures.len())];
                buf[..fixture.len()].copy_from_slice(fixture);
                for _ in 0..rng.below(4) {
                    buf[rng.below(fixture.len())] = rng.next_u64() as u8;
                }
                fixture.len() - rng.below(8).min(fixture.len())
            };
            let peeked = peek_key(&buf[..len]);
            let peeked6 = peek_key6(&buf[..len]);
            if let Ok(parsed) = classify(&buf[..len]) {
                // The speculative peek agrees wherever classify finds an untagged tuple.
                if parsed.l2.vlan_tags == 0 && parsed.flow_key().is_some() {
                    assert_eq!(peeked, parsed.flow_key(), "{:02x?}", &buf[..len]);
                }
                // And the IPv6 one, where no extension header comes first (the key
                // the IPv6 path looks up: the header's addresses, the ports).
                let ports = match parsed.kind {
                    PacketKind::Ipv6(Ipv6Payload::Tcp { sport, dport, .. }) => {
                        Some((Protocol::Tcp, sport, dport))
                    }
                    PacketKind::Ipv6(Ipv6Payload::Udp { sport, dport }) => {
                        Some((Protocol::Udp, sport, dport))
                    }
                    _ => None,
                };
                if let Some((proto, sport, dport)) = ports {
                    if parsed.l2.vlan_tags == 0 && parsed.l4 == parsed.l3 + ipv6::HEADER_LEN {
                        let ip = ipv6::Packet::new_checked(&buf[parsed.l3..len]).unwrap();
                        let key = FlowKey6 {
                            src: ip.src_addr(),
                            dst: ip.dst_addr(),
                            sport,
                            dport,
                            proto,
                        };
                        assert_eq!(peeked6, Some(key), "{:02x?}", &buf[..len]);
                        ipv6_peeks += 1;
                    }
                }
                assert!(parsed.l3 <= parsed.l4 && parsed.ip_end() <= len);
                assert!(parsed.l4 <= parsed.ip_end());
                match parsed.kind {
                    PacketKind::Tcp { .. } => assert!(parsed.l4_len() >= 20),
                    PacketKind::Udp { .. } | PacketKind::Icmp { .. } => {
                        assert!(parsed.l4_len() >= 8)
                    }
                    PacketKind::Ipv6(Ipv6Payload::Tcp { .. }) => assert!(parsed.l4_len() >= 20),
                    PacketKind::Ipv6(Ipv6Payload::Udp { .. } | Ipv6Payload::Icmp { .. }) => {
                        assert!(parsed.l4_len() >= 8)
                    }
                    _ => {}
                }
            }
        }
        assert!(ipv6_peeks > 500, "only {ipv6_peeks} IPv6 peeks compared");
    }

    #[test]
    fn classify_into_overwrites_every_field_of_the_slot() {
        // What a slot holds must not show through: a slot that held another frame's
        // result must come out as a fresh one would. A field some path forgets to
        // write keeps the other frame's value, and one of the pairs below tells them
        // apart.
        let frames: [&[u8]; 11] = [
            &TCP_SYN,
            &TCP_DATA_VLAN,
            &UDP_DNS,
            &ICMP_ECHO,
            &ARP_REQUEST,
            &IPV6_UDP,
            &IPV6_TCP_EXT,
            &IPV6_ECHO,
            &ICMP_IP_OPTIONS,
            &GRE_PACKET,
            &TUN_INNER_QINQ,
        ];
        for before in frames {
            let held = classify(before).expect("a valid fixture");
            for frame in frames {
                let mut slot = held;
                let fresh = classify(frame).expect("a valid fixture");
                assert_eq!(classify_into(frame, &mut slot), Ok(()));
                assert_eq!(slot, fresh, "{frame:02x?} over {before:02x?}");
            }
        }
    }
}
