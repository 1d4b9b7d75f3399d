//! Frames the emulated hosts send and receive, written and read at fixed offsets:
//! ARP, ICMP echo and errors, TCP segments, UDP datagrams and (read only) IP-in-IP.
//! Deliberately independent of `crate::wire` (only the checksum sums are shared) so
//! the emulator cross-checks the appliance instead of agreeing with it.
use crate::wire::checksum;
use std::net::Ipv4Addr;

/// Largest frame the emulator writes.
pub const MAX_FRAME: usize = 128;
/// The Ethernet minimum (without FCS): shorter frames are zero-padded, as a NIC does.
pub const MIN_FRAME: usize = 60;
/// Largest TCP or UDP payload the builders take (so a frame fits [`MAX_FRAME`]).
pub const MAX_PAYLOAD: usize = MAX_FRAME - 14 - 20 - 20;

/// TCP flag bits (byte 13 of the header).
pub mod tcp_flags {
    pub const FIN: u8 = 0x01;
    pub const SYN: u8 = 0x02;
    pub const RST: u8 = 0x04;
    pub const PSH: u8 = 0x08;
    pub const ACK: u8 = 0x10;
}
/// ICMP echo payload: an 8-byte TSC stamp plus a recognisable pattern.
const ECHO_DATA: usize = 56;
const PATTERN: u8 = 0xa5;

fn put_eth(buf: &mut [u8], dst: [u8; 6], src: [u8; 6], ethertype: u16) {
    buf[0..6].copy_from_slice(&dst);
    buf[6..12].copy_from_slice(&src);
    buf[12..14].copy_from_slice(&ethertype.to_be_bytes());
}

/// An ARP who-has `target` from (`mac`, `ip`), broadcast. Returns the frame length.
pub fn arp_request(buf: &mut [u8], mac: [u8; 6], ip: Ipv4Addr, target: Ipv4Addr) -> usize {
    put_arp(buf, [0xff; 6], 1, mac, ip, [0; 6], target)
}

/// The ARP reply of (`mac`, `ip`) to the who-has of (`to_mac`, `to_ip`), unicast to the
/// asker. Returns the frame length.
pub fn arp_reply(
    buf: &mut [u8],
    mac: [u8; 6],
    ip: Ipv4Addr,
    to_mac: [u8; 6],
    to_ip: Ipv4Addr,
) -> usize {
    put_arp(buf, to_mac, 2, mac, ip, to_mac, to_ip)
}

fn put_arp(
    buf: &mut [u8],
    eth_dst: [u8; 6],
    operation: u16,
    sender_mac: [u8; 6],
    sender_ip: Ipv4Addr,
    target_mac: [u8; 6],
    target_ip: Ipv4Addr,
) -> usize {
    put_eth(buf, eth_dst, sender_mac, 0x0806);
    let arp = &mut buf[14..42];
    arp[0..2].copy_from_slice(&1u16.to_be_bytes());
    arp[2..4].copy_from_slice(&0x0800u16.to_be_bytes());
    arp[4] = 6;
    arp[5] = 4;
    arp[6..8].copy_from_slice(&operation.to_be_bytes());
    arp[8..14].copy_from_slice(&sender_mac);
    arp[14..18].copy_from_slice(&sender_ip.octets());
    arp[18..24].copy_from_slice(&target_mac);
    arp[24..28].copy_from_slice(&target_ip.octets());
    pad(buf, 42)
}

/// Zero-pads a frame of `len` bytes to the Ethernet minimum; returns the new length.
fn pad(buf: &mut [u8], len: usize) -> usize {
    if len < MIN_FRAME {
        buf[len..MIN_FRAME].fill(0);
        MIN_FRAME
    } else {
        len
    }
}

fn put_ipv4(buf: &mut [u8], total_len: u16, protocol: u8, src: Ipv4Addr, dst: Ipv4Addr) {
    let ip = &mut buf[14..34];
    ip[0] = 0x45;
    ip[1] = 0;
    ip[2..4].copy_from_slice(&total_len.to_be_bytes());
    ip[4..6].copy_from_slice(&0x1234u16.to_be_bytes());
    ip[6..8].copy_from_slice(&0x4000u16.to_be_bytes()); // DF
    ip[8] = 64;
    ip[9] = protocol;
    ip[10..12].fill(0);
    ip[12..16].copy_from_slice(&src.octets());
    ip[16..20].copy_from_slice(&dst.octets());
    let c = checksum::finish(checksum::sum(ip));
    ip[10..12].copy_from_slice(&c.to_be_bytes());
}

/// An ICMP echo request carrying `stamp` (TSC at send). Returns the frame length.
#[allow(clippy::too_many_arguments)]
pub fn echo_request(
    buf: &mut [u8],
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    src: Ipv4Addr,
    dst: Ipv4Addr,
    id: u16,
    seq: u16,
    stamp: u64,
) -> usize {
    let icmp_len = 8 + ECHO_DATA;
    put_eth(buf, dst_mac, src_mac, 0x0800);
    put_ipv4(buf, (20 + icmp_len) as u16, 1, src, dst);
    let icmp = &mut buf[34..34 + icmp_len];
    icmp[0] = 8;
    icmp[1] = 0;
    icmp[2..4].fill(0);
    icmp[4..6].copy_from_slice(&id.to_be_bytes());
    icmp[6..8].copy_from_slice(&seq.to_be_bytes());
    icmp[8..16].copy_from_slice(&stamp.to_be_bytes());
    icmp[16..].fill(PATTERN);
    let c = checksum::finish(checksum::sum(icmp));
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    14 + 20 + icmp_len
}

/// An ICMP error (`icmp_type`, `code`: destination unreachable is 3) from `src` to
/// `dst` quoting `quote` (the offending packet's IPv4 header and first bytes). Returns
/// the frame length.
#[allow(clippy::too_many_arguments)]
pub fn icmp_error(
    buf: &mut [u8],
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    src: Ipv4Addr,
    dst: Ipv4Addr,
    icmp_type: u8,
    code: u8,
    quote: &[u8],
) -> usize {
    let icmp_len = 8 + quote.len();
    put_eth(buf, dst_mac, src_mac, 0x0800);
    put_ipv4(buf, (20 + icmp_len) as u16, 1, src, dst);
    let icmp = &mut buf[34..34 + icmp_len];
    icmp[..8].copy_from_slice(&[icmp_type, code, 0, 0, 0, 0, 0, 0]);
    icmp[8..].copy_from_slice(quote);
    let c = checksum::finish(checksum::sum(icmp));
    icmp[2..4].copy_from_slice(&c.to_be_bytes());
    pad(buf, 14 + 20 + icmp_len)
}

/// Kinds of malformed or unwanted frames the emulator mixes in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Garbage {
    /// 10 bytes: shorter than an Ethernet header.
    Runt,
    /// IPv4 header with a wrong checksum.
    BadIpChecksum,
    /// An IPv6 UDP datagram to an address that is not the appliance's (Sluice has no
    /// IPv6 services yet).
    Ipv6,
    /// EtherType 0x88b5 (local experimental).
    UnknownEthertype,
    /// ICMP echo with a wrong ICMP checksum.
    BadIcmpChecksum,
    /// IPv4 header claiming more bytes than the frame has.
    IpLengthTooLong,
}

impl Garbage {
    pub const ALL: [Garbage; 6] = [
        Garbage::Runt,
        Garbage::BadIpChecksum,
        Garbage::Ipv6,
        Garbage::UnknownEthertype,
        Garbage::BadIcmpChecksum,
        Garbage::IpLengthTooLong,
    ];
}

/// Writes one malformed frame of `kind`. Returns the frame length.
pub fn garbage(
    buf: &mut [u8],
    kind: Garbage,
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    src: Ipv4Addr,
    dst: Ipv4Addr,
) -> usize {
    match kind {
        Garbage::Runt => {
            buf[..10].copy_from_slice(&[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 2, 0, 0, 0]);
            10
        }
        Garbage::BadIpChecksum => {
            let len = echo_request(buf, src_mac, dst_mac, src, dst, 0xbad, 0, 0);
            buf[24] ^= 0x5a;
            len
        }
        Garbage::Ipv6 => {
            // From the peer's IPv4 host byte inside 2001:db8::/64, to 2001:db8:ffff::1.
            let from =
                std::net::Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, src.octets()[3].into());
            let to = std::net::Ipv6Addr::new(0x2001, 0xdb8, 0xffff, 0, 0, 0, 0, 1);
            const UDP_LEN: usize = 8 + 4;
            put_eth(buf, dst_mac, src_mac, 0x86dd);
            let ip = &mut buf[14..54];
            ip.fill(0);
            ip[0] = 0x60;
            ip[4..6].copy_from_slice(&(UDP_LEN as u16).to_be_bytes());
            ip[6] = 17;
            ip[7] = 64;
            ip[8..24].copy_from_slice(&from.octets());
            ip[24..40].copy_from_slice(&to.octets());
            let udp = &mut buf[54..54 + UDP_LEN];
            udp[0..2].copy_from_slice(&5353u16.to_be_bytes());
            udp[2..4].copy_from_slice(&53u16.to_be_bytes());
            udp[4..6].copy_from_slice(&(UDP_LEN as u16).to_be_bytes());
            udp[6..8].fill(0);
            udp[8..].copy_from_slice(b"v6?!");
            let pseudo = checksum::pseudo_header_sum_v6(from, to, 17, UDP_LEN as u32);
            // UDP over IPv6 must carry a checksum: a computed 0 is sent as 0xffff.
            let c = match checksum::finish(pseudo + checksum::sum(udp)) {
                0 => 0xffff,
                c => c,
            };
            udp[6..8].copy_from_slice(&c.to_be_bytes());
            54 + UDP_LEN
        }
        Garbage::UnknownEthertype => {
            put_eth(buf, dst_mac, src_mac, 0x88b5);
            buf[14..60].fill(0x11);
            60
        }
        Garbage::BadIcmpChecksum => {
            let len = echo_request(buf, src_mac, dst_mac, src, dst, 0xbad, 0, 0);
            buf[36] ^= 0x5a;
            len
        }
        Garbage::IpLengthTooLong => {
            let len = echo_request(buf, src_mac, dst_mac, src, dst, 0xbad, 0, 0);
            buf[16..18].copy_from_slice(&1400u16.to_be_bytes());
            buf[24..26].fill(0);
            let c = checksum::finish(checksum::sum(&buf[14..34]));
            buf[24..26].copy_from_slice(&c.to_be_bytes());
            len
        }
    }
}

/// The addresses of a TCP or UDP packet, from the Ethernet header to the ports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Endpoints {
    pub src_mac: [u8; 6],
    pub dst_mac: [u8; 6],
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub sport: u16,
    pub dport: u16,
}

/// A TCP segment with `flags` and `payload` (at most [`MAX_PAYLOAD`] bytes), no options,
/// valid IPv4 and TCP checksums, padded to [`MIN_FRAME`]. Returns the frame length.
pub fn tcp_segment(
    buf: &mut [u8],
    e: &Endpoints,
    seq: u32,
    ack: u32,
    flags: u8,
    payload: &[u8],
) -> usize {
    assert!(payload.len() <= MAX_PAYLOAD, "TCP payload too long");
    let tcp_len = 20 + payload.len();
    put_eth(buf, e.dst_mac, e.src_mac, 0x0800);
    put_ipv4(buf, (20 + tcp_len) as u16, 6, e.src, e.dst);
    let t = &mut buf[34..34 + tcp_len];
    t[0..2].copy_from_slice(&e.sport.to_be_bytes());
    t[2..4].copy_from_slice(&e.dport.to_be_bytes());
    t[4..8].copy_from_slice(&seq.to_be_bytes());
    t[8..12].copy_from_slice(&ack.to_be_bytes());
    t[12] = 5 << 4;
    t[13] = flags;
    t[14..16].copy_from_slice(&WINDOW.to_be_bytes());
    t[16..20].fill(0); // checksum, urgent pointer
    t[20..].copy_from_slice(payload);
    let c = checksum::finish(
        checksum::pseudo_header_sum(e.src, e.dst, 6, tcp_len as u16) + checksum::sum(t),
    );
    t[16..18].copy_from_slice(&c.to_be_bytes());
    pad(buf, 34 + tcp_len)
}

/// The receive window the emulated hosts advertise.
const WINDOW: u16 = 64240;

/// A UDP datagram carrying `payload` (at most [`MAX_PAYLOAD`] bytes) with valid IPv4
/// and UDP checksums, padded to [`MIN_FRAME`]. Returns the frame length.
pub fn udp_datagram(buf: &mut [u8], e: &Endpoints, payload: &[u8]) -> usize {
    assert!(payload.len() <= MAX_PAYLOAD, "UDP payload too long");
    let udp_len = 8 + payload.len();
    put_eth(buf, e.dst_mac, e.src_mac, 0x0800);
    put_ipv4(buf, (20 + udp_len) as u16, 17, e.src, e.dst);
    let u = &mut buf[34..34 + udp_len];
    u[0..2].copy_from_slice(&e.sport.to_be_bytes());
    u[2..4].copy_from_slice(&e.dport.to_be_bytes());
    u[4..6].copy_from_slice(&(udp_len as u16).to_be_bytes());
    u[6..8].fill(0);
    u[8..].copy_from_slice(payload);
    let c = checksum::finish(
        checksum::pseudo_header_sum(e.src, e.dst, 17, udp_len as u16) + checksum::sum(u),
    );
    // 0 means "no checksum" in UDP: a computed 0 is sent as its other form (RFC 768).
    let c = if c == 0 { 0xffff } else { c };
    u[6..8].copy_from_slice(&c.to_be_bytes());
    pad(buf, 34 + udp_len)
}

/// An ARP packet (request or reply), fields as received.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Arp {
    pub eth_dst: [u8; 6],
    pub eth_src: [u8; 6],
    /// 1 request, 2 reply (nothing else is accepted).
    pub operation: u16,
    pub sender_mac: [u8; 6],
    pub sender_ip: Ipv4Addr,
    pub target_mac: [u8; 6],
    pub target_ip: Ipv4Addr,
}

/// A TCP segment or UDP datagram whose checksums were verified.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment<'a> {
    pub e: Endpoints,
    /// Zero for UDP.
    pub seq: u32,
    /// Zero for UDP.
    pub ack: u32,
    /// Zero for UDP.
    pub flags: u8,
    /// The data after the TCP or UDP header (Ethernet padding excluded).
    pub payload: &'a [u8],
}

/// What a received frame turned out to be. Every variant but `Bad` and `Other` passed
/// the checks of its layers: lengths, IPv4 header checksum, TCP/UDP/ICMP checksums.
#[derive(Debug, PartialEq, Eq)]
pub enum Frame<'a> {
    Arp(Arp),
    /// A well-formed ICMP echo reply to one of [`echo_request`]'s requests.
    Echo {
        dst_mac: [u8; 6],
        src: Ipv4Addr,
        dst_ip: Ipv4Addr,
        id: u16,
        stamp: u64,
    },
    Tcp(Segment<'a>),
    Udp(Segment<'a>),
    /// IP-in-IP (protocol 4): `inner` is the encapsulated IPv4 packet, unchecked; read
    /// it with [`parse_ipv4`].
    Ipip {
        dst_mac: [u8; 6],
        src_mac: [u8; 6],
        outer_src: Ipv4Addr,
        outer_dst: Ipv4Addr,
        inner: &'a [u8],
    },
    /// Malformed; says what.
    Bad(&'static str),
    /// Well-formed as far as read, but nothing the emulator speaks (another EtherType
    /// or IP protocol).
    Other,
}

fn mac_at(b: &[u8]) -> [u8; 6] {
    b[..6].try_into().expect("six bytes")
}

fn ip_at(b: &[u8]) -> Ipv4Addr {
    Ipv4Addr::new(b[0], b[1], b[2], b[3])
}

fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes([b[0], b[1]])
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// Reads and checks a whole frame.
pub fn parse(f: &[u8]) -> Frame<'_> {
    if f.len() < 14 {
        return Frame::Bad("frame shorter than an Ethernet header");
    }
    let (dst_mac, src_mac) = (mac_at(&f[0..6]), mac_at(&f[6..12]));
    match be16(&f[12..14]) {
        0x0806 => parse_arp(f, dst_mac, src_mac),
        0x0800 => parse_ipv4(dst_mac, src_mac, &f[14..]),
        _ => Frame::Other,
    }
}

fn parse_arp(f: &[u8], eth_dst: [u8; 6], eth_src: [u8; 6]) -> Frame<'_> {
    if f.len() < 42 {
        return Frame::Bad("ARP truncated");
    }
    let a = &f[14..42];
    if a[0..6] != [0, 1, 8, 0, 6, 4] {
        return Frame::Bad("ARP with wrong hardware/protocol type or lengths");
    }
    let operation = be16(&a[6..8]);
    if operation != 1 && operation != 2 {
        return Frame::Bad("ARP operation is neither request nor reply");
    }
    Frame::Arp(Arp {
        eth_dst,
        eth_src,
        operation,
        sender_mac: mac_at(&a[8..14]),
        sender_ip: ip_at(&a[14..18]),
        target_mac: mac_at(&a[18..24]),
        target_ip: ip_at(&a[24..28]),
    })
}

/// Reads and checks an IPv4 packet starting at `p` (anything after its total length is
/// ignored), as carried in a frame from `src_mac` to `dst_mac`.
pub fn parse_ipv4(dst_mac: [u8; 6], src_mac: [u8; 6], p: &[u8]) -> Frame<'_> {
    if p.len() < 20 {
        return Frame::Bad("IPv4 header truncated");
    }
    if p[0] != 0x45 {
        return Frame::Bad("IPv4 header: wrong version/IHL (or options)");
    }
    if checksum::fold(checksum::sum(&p[..20])) != 0xffff {
        return Frame::Bad("IPv4 header checksum wrong");
    }
    let total = be16(&p[2..4]) as usize;
    if total < 20 || total > p.len() {
        return Frame::Bad("IPv4 total length below the header or past the frame");
    }
    if be16(&p[6..8]) & 0x3fff != 0 {
        return Frame::Bad("IPv4 fragment");
    }
    let (src, dst) = (ip_at(&p[12..16]), ip_at(&p[16..20]));
    let body = &p[20..total];
    match p[9] {
        1 => parse_echo_reply(dst_mac, src, dst, body),
        4 => Frame::Ipip {
            dst_mac,
            src_mac,
            outer_src: src,
            outer_dst: dst,
            inner: body,
        },
        6 => parse_tcp(dst_mac, src_mac, src, dst, body),
        17 => parse_udp(dst_mac, src_mac, src, dst, body),
        _ => Frame::Other,
    }
}

fn parse_echo_reply(dst_mac: [u8; 6], src: Ipv4Addr, dst_ip: Ipv4Addr, icmp: &[u8]) -> Frame<'_> {
    if icmp.len() < 8 {
        return Frame::Bad("ICMP message truncated");
    }
    if icmp[0] != 0 || icmp[1] != 0 {
        return Frame::Bad("ICMP message that is not an echo reply (type/code)");
    }
    if icmp.len() != 8 + ECHO_DATA {
        return Frame::Bad("echo reply length differs from the request");
    }
    if checksum::fold(checksum::sum(icmp)) != 0xffff {
        return Frame::Bad("echo reply ICMP checksum wrong");
    }
    if icmp[16..].iter().any(|&b| b != PATTERN) {
        return Frame::Bad("echo reply payload differs from the request");
    }
    Frame::Echo {
        dst_mac,
        src,
        dst_ip,
        id: be16(&icmp[4..6]),
        stamp: u64::from_be_bytes(icmp[8..16].try_into().unwrap()),
    }
}

fn parse_tcp(
    dst_mac: [u8; 6],
    src_mac: [u8; 6],
    src: Ipv4Addr,
    dst: Ipv4Addr,
    t: &[u8],
) -> Frame<'_> {
    if t.len() < 20 {
        return Frame::Bad("TCP header truncated");
    }
    let offset = (t[12] >> 4) as usize * 4;
    if offset < 20 || offset > t.len() {
        return Frame::Bad("TCP data offset below 20 or past the segment");
    }
    let sum = checksum::pseudo_header_sum(src, dst, 6, t.len() as u16) + checksum::sum(t);
    if checksum::fold(sum) != 0xffff {
        return Frame::Bad("TCP checksum wrong");
    }
    Frame::Tcp(Segment {
        e: Endpoints {
            src_mac,
            dst_mac,
            src,
            dst,
            sport: be16(&t[0..2]),
            dport: be16(&t[2..4]),
        },
        seq: be32(&t[4..8]),
        ack: be32(&t[8..12]),
        flags: t[13],
        payload: &t[offset..],
    })
}

fn parse_udp(
    dst_mac: [u8; 6],
    src_mac: [u8; 6],
    src: Ipv4Addr,
    dst: Ipv4Addr,
    u: &[u8],
) -> Frame<'_> {
    if u.len() < 8 {
        return Frame::Bad("UDP header truncated");
    }
    if be16(&u[4..6]) as usize != u.len() {
        return Frame::Bad("UDP length disagrees with the IPv4 total length");
    }
    let sum = checksum::pseudo_header_sum(src, dst, 17, u.len() as u16) + checksum::sum(u);
    if be16(&u[6..8]) != 0 && checksum::fold(sum) != 0xffff {
        return Frame::Bad("UDP checksum wrong");
    }
    Frame::Udp(Segment {
        e: Endpoints {
            src_mac,
            dst_mac,
            src,
            dst,
            sport: be16(&u[0..2]),
            dport: be16(&u[2..4]),
        },
        seq: 0,
        ack: 0,
        flags: 0,
        payload: &u[8..],
    })
}

/// A frame as a peer that only ARPs for and pings the appliance sees it (tests that
/// play such a peer themselves use this).
#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    /// A well-formed ARP reply from the appliance to this peer.
    Arp {
        target_mac: [u8; 6],
        target_ip: Ipv4Addr,
    },
    /// A well-formed echo reply from the appliance.
    Echo {
        dst_mac: [u8; 6],
        dst_ip: Ipv4Addr,
        id: u16,
        stamp: u64,
    },
    /// From the appliance but wrong; says what.
    Bad(&'static str),
    /// Not from the appliance, or nothing such a peer understands.
    Unexpected,
}

/// Checks a frame against what a correct appliance sends a pinging peer.
pub fn parse_reply(f: &[u8], appliance_mac: [u8; 6], appliance_ip: Ipv4Addr) -> Reply {
    if f.len() < 14 || f[6..12] != appliance_mac {
        return Reply::Unexpected;
    }
    match parse(f) {
        Frame::Arp(a) => {
            if a.operation != 2 {
                Reply::Bad("ARP from the appliance is not a reply")
            } else if a.sender_mac != appliance_mac || a.sender_ip != appliance_ip {
                Reply::Bad("ARP reply sender is not the appliance")
            } else if a.eth_dst != a.target_mac {
                Reply::Bad("ARP reply not sent to the requester's MAC")
            } else {
                Reply::Arp {
                    target_mac: a.target_mac,
                    target_ip: a.target_ip,
                }
            }
        }
        Frame::Echo {
            dst_mac,
            src,
            dst_ip,
            id,
            stamp,
        } => {
            if src != appliance_ip {
                Reply::Bad("echo reply not from the appliance's address")
            } else {
                Reply::Echo {
                    dst_mac,
                    dst_ip,
                    id,
                    stamp,
                }
            }
        }
        Frame::Bad(why) => Reply::Bad(why),
        Frame::Tcp(_) | Frame::Udp(_) | Frame::Ipip { .. } => {
            Reply::Bad("neither an ARP reply nor an echo reply")
        }
        Frame::Other => Reply::Unexpected,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PEER_MAC: [u8; 6] = [2, 0x50, 0x45, 0x45, 0x52, 1];
    const LB_MAC: [u8; 6] = [2, 0x53, 0x4c, 0, 0, 1];
    const CLIENT: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 6);
    const VIP: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 1);

    fn endpoints() -> Endpoints {
        Endpoints {
            src_mac: PEER_MAC,
            dst_mac: LB_MAC,
            src: CLIENT,
            dst: VIP,
            sport: 40000,
            dport: 80,
        }
    }

    /// RFC 1071 verification of an L4 message with its pseudo-header.
    fn l4_sums_to_ones(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, l4: &[u8]) -> bool {
        let sum = checksum::pseudo_header_sum(src, dst, proto, l4.len() as u16) + checksum::sum(l4);
        checksum::fold(sum) == 0xffff
    }

    #[test]
    fn frames_carry_valid_checksums() {
        let mut buf = [0u8; MAX_FRAME];
        let len = echo_request(
            &mut buf,
            PEER_MAC,
            LB_MAC,
            [198, 18, 0, 2].into(),
            [198, 18, 0, 1].into(),
            1,
            7,
            99,
        );
        assert_eq!(len, 98);
        assert_eq!(checksum::fold(checksum::sum(&buf[14..34])), 0xffff);
        assert_eq!(checksum::fold(checksum::sum(&buf[34..len])), 0xffff);
        let len = garbage(
            &mut buf,
            Garbage::BadIcmpChecksum,
            PEER_MAC,
            LB_MAC,
            [198, 18, 0, 2].into(),
            [198, 18, 0, 1].into(),
        );
        assert_ne!(checksum::fold(checksum::sum(&buf[34..len])), 0xffff);
    }

    #[test]
    fn the_ipv6_frame_is_well_formed_udp_to_no_service() {
        let mut buf = [0u8; MAX_FRAME];
        let len = garbage(
            &mut buf,
            Garbage::Ipv6,
            PEER_MAC,
            LB_MAC,
            [198, 18, 0, 2].into(),
            [198, 18, 0, 1].into(),
        );
        let parsed = crate::flow::parse::classify(&buf[..len]).unwrap();
        assert!(matches!(
            parsed.kind,
            crate::flow::parse::PacketKind::Ipv6(crate::flow::parse::Ipv6Payload::Udp {
                sport: 5353,
                dport: 53
            })
        ));
        let ip = crate::wire::ipv6::Packet::new_checked(&buf[14..len]).unwrap();
        let udp = crate::wire::udp::Packet::new_checked(ip.payload()).unwrap();
        assert!(udp.verify_checksum_v6(ip.src_addr(), ip.dst_addr()));
    }

    #[test]
    fn a_correct_echo_reply_is_accepted_and_a_corrupt_one_named() {
        let mut buf = [0u8; MAX_FRAME];
        let peer: Ipv4Addr = [198, 18, 0, 2].into();
        let lb: Ipv4Addr = [198, 18, 0, 1].into();
        // Build the reply by hand as the appliance should: swapped addresses, type 0.
        let len = echo_request(&mut buf, LB_MAC, PEER_MAC, lb, peer, 1, 7, 99);
        buf[34] = 0;
        buf[36..38].fill(0);
        let c = checksum::finish(checksum::sum(&buf[34..len]));
        buf[36..38].copy_from_slice(&c.to_be_bytes());
        assert_eq!(
            parse(&buf[..len]),
            Frame::Echo {
                dst_mac: PEER_MAC,
                src: lb,
                dst_ip: peer,
                id: 1,
                stamp: 99
            }
        );
        assert_eq!(
            parse_reply(&buf[..len], LB_MAC, lb),
            Reply::Echo {
                dst_mac: PEER_MAC,
                dst_ip: peer,
                id: 1,
                stamp: 99
            }
        );
        assert_eq!(parse_reply(&buf[..len], PEER_MAC, lb), Reply::Unexpected);
        assert_eq!(
            parse_reply(&buf[..len], LB_MAC, peer),
            Reply::Bad("echo reply not from the appliance's address")
        );
        buf[len - 1] ^= 1;
        assert_eq!(
            parse(&buf[..len]),
            Frame::Bad("echo reply ICMP checksum wrong")
        );
        assert_eq!(
            parse_reply(&buf[..len], LB_MAC, lb),
            Reply::Bad("echo reply ICMP checksum wrong")
        );
    }

    #[test]
    fn tcp_segment_layout_byte_by_byte() {
        let mut buf = [0u8; MAX_FRAME];
        let flags = tcp_flags::PSH | tcp_flags::ACK;
        let len = tcp_segment(
            &mut buf,
            &endpoints(),
            0x0102_0304,
            0xa0b0_c0d0,
            flags,
            b"sluice demo",
        );
        assert_eq!(len, 14 + 20 + 20 + 11);
        assert_eq!(&buf[0..6], &LB_MAC);
        assert_eq!(&buf[6..12], &PEER_MAC);
        assert_eq!(&buf[12..14], &[0x08, 0x00]);
        // IPv4: version/IHL, total length, DF, TTL, protocol, addresses.
        assert_eq!(buf[14], 0x45);
        assert_eq!(&buf[16..18], &51u16.to_be_bytes());
        assert_eq!(&buf[20..22], &[0x40, 0x00]);
        assert_eq!((buf[22], buf[23]), (64, 6));
        assert_eq!(&buf[26..30], &CLIENT.octets());
        assert_eq!(&buf[30..34], &VIP.octets());
        assert_eq!(checksum::fold(checksum::sum(&buf[14..34])), 0xffff);
        // TCP: ports, seq, ack, data offset 5, flags, window, urgent 0, payload.
        assert_eq!(&buf[34..36], &40000u16.to_be_bytes());
        assert_eq!(&buf[36..38], &80u16.to_be_bytes());
        assert_eq!(&buf[38..42], &[1, 2, 3, 4]);
        assert_eq!(&buf[42..46], &[0xa0, 0xb0, 0xc0, 0xd0]);
        assert_eq!(buf[46], 0x50);
        assert_eq!(buf[47], 0x18);
        assert_eq!(&buf[48..50], &WINDOW.to_be_bytes());
        assert_eq!(&buf[52..54], &[0, 0]);
        assert_eq!(&buf[54..65], b"sluice demo");
        assert!(l4_sums_to_ones(CLIENT, VIP, 6, &buf[34..len]));
    }

    #[test]
    fn short_frames_are_padded_and_padding_is_not_payload() {
        let mut buf = [0xeeu8; MAX_FRAME];
        let len = tcp_segment(&mut buf, &endpoints(), 7, 0, tcp_flags::SYN, &[]);
        assert_eq!(len, MIN_FRAME);
        assert!(buf[54..60].iter().all(|&b| b == 0));
        assert!(l4_sums_to_ones(CLIENT, VIP, 6, &buf[34..54]));
        match parse(&buf[..len]) {
            Frame::Tcp(s) => {
                assert_eq!(s.e, endpoints());
                assert_eq!((s.seq, s.ack, s.flags), (7, 0, tcp_flags::SYN));
                assert!(s.payload.is_empty());
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn tcp_round_trip_and_every_corruption_is_named() {
        let mut buf = [0u8; MAX_FRAME];
        let len = tcp_segment(&mut buf, &endpoints(), 1, 2, tcp_flags::ACK, &[0x5a; 32]);
        let Frame::Tcp(s) = parse(&buf[..len]) else {
            panic!("not TCP")
        };
        assert_eq!(
            (s.seq, s.ack, s.flags, s.payload),
            (1, 2, tcp_flags::ACK, &[0x5a; 32][..])
        );

        let mut bad = buf;
        bad[len - 1] ^= 0x80;
        assert_eq!(parse(&bad[..len]), Frame::Bad("TCP checksum wrong"));
        let mut bad = buf;
        bad[26] ^= 1; // source address: the IPv4 checksum notices first
        assert_eq!(parse(&bad[..len]), Frame::Bad("IPv4 header checksum wrong"));
        let mut bad = buf;
        bad[46] = 0x40; // data offset 4
        assert_eq!(
            parse(&bad[..len]),
            Frame::Bad("TCP data offset below 20 or past the segment")
        );
        assert_eq!(
            parse(&buf[..40]),
            Frame::Bad("IPv4 total length below the header or past the frame")
        );
        assert_eq!(
            parse(&buf[..10]),
            Frame::Bad("frame shorter than an Ethernet header")
        );
    }

    #[test]
    fn udp_datagram_layout_and_checksum() {
        let mut buf = [0u8; MAX_FRAME];
        let mut e = endpoints();
        e.dport = 53;
        let len = udp_datagram(&mut buf, &e, b"query");
        assert_eq!(len, MIN_FRAME); // 14 + 20 + 8 + 5 = 47, padded
        assert_eq!(buf[23], 17);
        assert_eq!(&buf[16..18], &33u16.to_be_bytes());
        assert_eq!(&buf[34..36], &40000u16.to_be_bytes());
        assert_eq!(&buf[36..38], &53u16.to_be_bytes());
        assert_eq!(&buf[38..40], &13u16.to_be_bytes());
        assert_ne!(&buf[40..42], &[0, 0]);
        assert_eq!(&buf[42..47], b"query");
        assert!(l4_sums_to_ones(CLIENT, VIP, 17, &buf[34..47]));
        let Frame::Udp(s) = parse(&buf[..len]) else {
            panic!("not UDP")
        };
        assert_eq!((s.e, s.payload), (e, &b"query"[..]));
        let mut bad = buf;
        bad[44] ^= 1;
        assert_eq!(parse(&bad[..len]), Frame::Bad("UDP checksum wrong"));
        // Checksum 0: not computed, accepted as such.
        let mut none = buf;
        none[40..42].fill(0);
        assert!(matches!(parse(&none[..len]), Frame::Udp(_)));
    }

    #[test]
    fn arp_request_and_reply_layouts() {
        let mut buf = [0u8; MAX_FRAME];
        let rs: Ipv4Addr = [198, 18, 0, 2].into();
        let lb: Ipv4Addr = [198, 18, 0, 1].into();
        let len = arp_reply(&mut buf, PEER_MAC, rs, LB_MAC, lb);
        assert_eq!(len, MIN_FRAME);
        assert_eq!(&buf[0..6], &LB_MAC);
        assert_eq!(&buf[6..12], &PEER_MAC);
        assert_eq!(&buf[12..14], &[0x08, 0x06]);
        assert_eq!(&buf[14..22], &[0, 1, 8, 0, 6, 4, 0, 2]);
        assert_eq!(&buf[22..28], &PEER_MAC);
        assert_eq!(&buf[28..32], &rs.octets());
        assert_eq!(&buf[32..38], &LB_MAC);
        assert_eq!(&buf[38..42], &lb.octets());
        assert_eq!(
            parse(&buf[..len]),
            Frame::Arp(Arp {
                eth_dst: LB_MAC,
                eth_src: PEER_MAC,
                operation: 2,
                sender_mac: PEER_MAC,
                sender_ip: rs,
                target_mac: LB_MAC,
                target_ip: lb,
            })
        );
        let len = arp_request(&mut buf, PEER_MAC, rs, lb);
        let Frame::Arp(a) = parse(&buf[..len]) else {
            panic!("not ARP")
        };
        assert_eq!(
            (a.eth_dst, a.operation, a.target_mac),
            ([0xff; 6], 1, [0; 6])
        );
        buf[21] = 3;
        assert_eq!(
            parse(&buf[..len]),
            Frame::Bad("ARP operation is neither request nor reply")
        );
    }

    #[test]
    fn ip_in_ip_is_recognised_and_its_inner_packet_parsed() {
        // What Sluice's TUN mode sends: the client's packet behind an outer header.
        let mut inner = [0u8; MAX_FRAME];
        let len = tcp_segment(&mut inner, &endpoints(), 5, 0, tcp_flags::SYN, &[]);
        let inner_ip = &inner[14..54];
        let mut buf = [0u8; MAX_FRAME];
        put_eth(&mut buf, PEER_MAC, LB_MAC, 0x0800);
        let lb: Ipv4Addr = [198, 18, 0, 1].into();
        let rs: Ipv4Addr = [198, 18, 0, 2].into();
        put_ipv4(&mut buf, 20 + inner_ip.len() as u16, 4, lb, rs);
        buf[34..34 + inner_ip.len()].copy_from_slice(inner_ip);
        let total = 34 + inner_ip.len();
        assert!(len > inner_ip.len());
        let Frame::Ipip {
            dst_mac,
            outer_src,
            outer_dst,
            inner: packet,
            ..
        } = parse(&buf[..total])
        else {
            panic!("not IP-in-IP")
        };
        assert_eq!((dst_mac, outer_src, outer_dst), (PEER_MAC, lb, rs));
        let Frame::Tcp(s) = parse_ipv4(dst_mac, LB_MAC, packet) else {
            panic!("inner not TCP")
        };
        assert_eq!((s.e.src, s.e.dst, s.e.dport, s.seq), (CLIENT, VIP, 80, 5));
    }
}
