//! Frames the emulated peers send and the replies they expect, written and read at
//! fixed offsets. Deliberately independent of `crate::wire` (only the checksum sum is
//! shared) so the emulator cross-checks the responder instead of agreeing with it.
use crate::wire::checksum;
use std::net::Ipv4Addr;

/// Largest frame the emulator writes.
pub const MAX_FRAME: usize = 128;
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
    put_eth(buf, [0xff; 6], mac, 0x0806);
    let arp = &mut buf[14..42];
    arp[0..2].copy_from_slice(&1u16.to_be_bytes());
    arp[2..4].copy_from_slice(&0x0800u16.to_be_bytes());
    arp[4] = 6;
    arp[5] = 4;
    arp[6..8].copy_from_slice(&1u16.to_be_bytes());
    arp[8..14].copy_from_slice(&mac);
    arp[14..18].copy_from_slice(&ip.octets());
    arp[18..24].fill(0);
    arp[24..28].copy_from_slice(&target.octets());
    // Pad to the Ethernet minimum, as a NIC would.
    buf[42..60].fill(0);
    60
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

/// Kinds of malformed or unwanted frames the emulator mixes in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Garbage {
    /// 10 bytes: shorter than an Ethernet header.
    Runt,
    /// IPv4 header with a wrong checksum.
    BadIpChecksum,
    /// An IPv6 frame.
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
            put_eth(buf, dst_mac, src_mac, 0x86dd);
            buf[14..74].fill(0);
            buf[14] = 0x60;
            74
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

/// What a received frame turned out to be.
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
    /// Not from the appliance, or not a reply at all.
    Unexpected,
}

/// Checks a frame against what a correct appliance sends.
pub fn parse_reply(f: &[u8], appliance_mac: [u8; 6], appliance_ip: Ipv4Addr) -> Reply {
    if f.len() < 14 || f[6..12] != appliance_mac {
        return Reply::Unexpected;
    }
    match u16::from_be_bytes([f[12], f[13]]) {
        0x0806 => parse_arp_reply(f, appliance_mac, appliance_ip),
        0x0800 => parse_echo_reply(f, appliance_ip),
        _ => Reply::Unexpected,
    }
}

fn parse_arp_reply(f: &[u8], appliance_mac: [u8; 6], appliance_ip: Ipv4Addr) -> Reply {
    if f.len() < 42 {
        return Reply::Bad("ARP reply truncated");
    }
    let a = &f[14..42];
    if a[0..6] != [0, 1, 8, 0, 6, 4] {
        return Reply::Bad("ARP reply with wrong hardware/protocol type or lengths");
    }
    if a[6..8] != [0, 2] {
        return Reply::Bad("ARP from the appliance is not a reply");
    }
    if a[8..14] != appliance_mac || a[14..18] != appliance_ip.octets() {
        return Reply::Bad("ARP reply sender is not the appliance");
    }
    let target_mac: [u8; 6] = a[18..24].try_into().unwrap();
    if f[0..6] != target_mac {
        return Reply::Bad("ARP reply not sent to the requester's MAC");
    }
    let target_ip = Ipv4Addr::new(a[24], a[25], a[26], a[27]);
    Reply::Arp {
        target_mac,
        target_ip,
    }
}

fn parse_echo_reply(f: &[u8], appliance_ip: Ipv4Addr) -> Reply {
    if f.len() < 34 + 8 + ECHO_DATA {
        return Reply::Bad("echo reply truncated");
    }
    let ip = &f[14..34];
    if ip[0] != 0x45 || ip[9] != 1 {
        return Reply::Bad("echo reply IP header: wrong version/IHL or protocol");
    }
    if checksum::fold(checksum::sum(ip)) != 0xffff {
        return Reply::Bad("echo reply IP header checksum wrong");
    }
    if ip[12..16] != appliance_ip.octets() {
        return Reply::Bad("echo reply not from the appliance's address");
    }
    let total = u16::from_be_bytes([ip[2], ip[3]]) as usize;
    if total != 20 + 8 + ECHO_DATA {
        return Reply::Bad("echo reply length differs from the request");
    }
    let icmp = &f[34..34 + 8 + ECHO_DATA];
    if icmp[0] != 0 || icmp[1] != 0 {
        return Reply::Bad("not an echo reply (type/code)");
    }
    if checksum::fold(checksum::sum(icmp)) != 0xffff {
        return Reply::Bad("echo reply ICMP checksum wrong");
    }
    if icmp[16..].iter().any(|&b| b != PATTERN) {
        return Reply::Bad("echo reply payload differs from the request");
    }
    Reply::Echo {
        dst_mac: f[0..6].try_into().unwrap(),
        dst_ip: Ipv4Addr::new(ip[16], ip[17], ip[18], ip[19]),
        id: u16::from_be_bytes([icmp[4], icmp[5]]),
        stamp: u64::from_be_bytes(icmp[8..16].try_into().unwrap()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PEER_MAC: [u8; 6] = [2, 0x50, 0x45, 0x45, 0x52, 1];
    const LB_MAC: [u8; 6] = [2, 0x53, 0x4c, 0, 0, 1];

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
            parse_reply(&buf[..len], LB_MAC, lb),
            Reply::Echo {
                dst_mac: PEER_MAC,
                dst_ip: peer,
                id: 1,
                stamp: 99
            }
        );
        buf[len - 1] ^= 1;
        assert_eq!(
            parse_reply(&buf[..len], LB_MAC, lb),
            Reply::Bad("echo reply ICMP checksum wrong")
        );
    }
}
