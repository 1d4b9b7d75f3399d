//! Sync datagrams as Ethernet/IPv4/UDP frames, for session sync over a DPDK port
//! (`[sync] port`): the management core builds the frames it sends (worker 0 transmits
//! them) and checks the frames the workers hand it, since no kernel stack does either.
//!
//! A frame built here has an untagged Ethernet header with a zero source MAC (worker 0
//! writes the port's) and, to a unicast peer, a zero destination MAC too (worker 0
//! resolves the peer in its neighbour table, or sends an ARP request for it instead);
//! to a multicast group, the group's MAC (01:00:5e and the group's low 23 bits, RFC
//! 1112). IPv4 without options, don't-fragment, TTL 1 to a group (the peers share a
//! link, as with the kernel socket's `IP_MULTICAST_TTL`) and 64 otherwise, both
//! checksums filled.
//!
//! A frame parsed here must be untagged IPv4 without fragmentation, carry UDP, have a
//! correct IPv4 header checksum, a UDP length equal to the IP payload and a correct
//! UDP checksum (or none, 0, which IPv4 allows: `wire::udp`). Anything else is an error,
//! never a panic.
use crate::wire::ethernet::{self, EtherType, MacAddr};
use crate::wire::{ipv4, udp, IpProtocol, WireError};
use std::net::SocketAddrV4;

/// Ethernet, IPv4 (no options) and UDP headers: what a frame adds to its datagram.
pub const HEADERS_LEN: usize = ethernet::HEADER_LEN + ipv4::MIN_HEADER_LEN + udp::HEADER_LEN;
/// TTL of a frame to a multicast group: one hop.
pub const MULTICAST_TTL: u8 = 1;

/// Writes the frame carrying `payload` from `from` to `to` into `buf`; returns its
/// length, or `None` when `buf` is too small or the datagram too long for IPv4.
pub fn write(
    buf: &mut [u8],
    from: SocketAddrV4,
    to: SocketAddrV4,
    payload: &[u8],
) -> Option<usize> {
    let len = HEADERS_LEN + payload.len();
    if len > buf.len() || len - ethernet::HEADER_LEN > usize::from(u16::MAX) {
        return None;
    }
    let frame = &mut buf[..len];
    let multicast = to.ip().is_multicast();
    ethernet::Repr {
        src_addr: MacAddr::ZERO,
        dst_addr: if multicast {
            MacAddr::ipv4_multicast(*to.ip())
        } else {
            MacAddr::ZERO
        },
        ethertype: EtherType::IPV4,
    }
    .emit(&mut ethernet::Frame::new_unchecked(&mut *frame));
    let ip_start = ethernet::HEADER_LEN;
    let udp_start = ip_start + ipv4::MIN_HEADER_LEN;
    frame[udp_start + udp::HEADER_LEN..].copy_from_slice(payload);
    udp::Repr {
        src_port: from.port(),
        dst_port: to.port(),
        payload_len: payload.len(),
    }
    .emit(
        &mut udp::Packet::new_unchecked(&mut frame[udp_start..]),
        *from.ip(),
        *to.ip(),
    );
    ipv4::Repr {
        src_addr: *from.ip(),
        dst_addr: *to.ip(),
        protocol: IpProtocol::UDP,
        payload_len: udp::HEADER_LEN + payload.len(),
        ttl: if multicast {
            MULTICAST_TTL
        } else {
            ipv4::DEFAULT_TTL
        },
    }
    .emit(&mut ipv4::Packet::new_unchecked(&mut frame[ip_start..]));
    Some(len)
}

/// A datagram found in a frame.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Datagram<'a> {
    pub from: SocketAddrV4,
    pub to: SocketAddrV4,
    pub payload: &'a [u8],
}

/// Why a frame is not a sync datagram.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FrameError {
    /// Shorter than a header or a length a header declares.
    Truncated,
    /// Not untagged IPv4.
    NotIpv4,
    /// IPv4 version or header length wrong, or a total length below the header.
    BadIpv4Header,
    BadIpv4Checksum,
    /// A fragment (more-fragments set or an offset).
    Fragment,
    NotUdp,
    /// The UDP length is below its header or differs from the IP payload.
    BadUdpLength,
    BadUdpChecksum,
}

/// The datagram in `frame`, every length and both checksums checked.
pub fn parse(frame: &[u8]) -> Result<Datagram<'_>, FrameError> {
    let eth = ethernet::Frame::new_checked(frame).map_err(|_| FrameError::Truncated)?;
    if eth.ethertype() != EtherType::IPV4 {
        return Err(FrameError::NotIpv4);
    }
    let ip = ipv4::Packet::new_checked(&frame[ethernet::HEADER_LEN..]).map_err(|e| match e {
        WireError::Truncated => FrameError::Truncated,
        _ => FrameError::BadIpv4Header,
    })?;
    if !ip.verify_checksum() {
        return Err(FrameError::BadIpv4Checksum);
    }
    if ip.is_fragment() {
        return Err(FrameError::Fragment);
    }
    if ip.protocol() != IpProtocol::UDP {
        return Err(FrameError::NotUdp);
    }
    let (src, dst) = (ip.src_addr(), ip.dst_addr());
    // The UDP datagram: the IP payload, padding excluded (checked bounds).
    let start = ethernet::HEADER_LEN + ip.header_len();
    let datagram = &frame[start..ethernet::HEADER_LEN + usize::from(ip.total_len())];
    let udp = udp::Packet::new_checked(datagram).map_err(|e| match e {
        WireError::Truncated if datagram.len() < udp::HEADER_LEN => FrameError::Truncated,
        _ => FrameError::BadUdpLength,
    })?;
    if usize::from(udp.len()) != datagram.len() {
        return Err(FrameError::BadUdpLength);
    }
    if !udp.verify_checksum(src, dst) {
        return Err(FrameError::BadUdpChecksum);
    }
    Ok(Datagram {
        from: SocketAddrV4::new(src, udp.src_port()),
        to: SocketAddrV4::new(dst, udp.dst_port()),
        payload: &datagram[udp::HEADER_LEN..],
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::checksum;
    use std::net::Ipv4Addr;

    const FROM: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 1), 8848);
    const TO: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 2), 8849);
    const GROUP: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(224, 0, 0, 81), 8848);

    fn build(from: SocketAddrV4, to: SocketAddrV4, payload: &[u8]) -> Vec<u8> {
        let mut buf = vec![0u8; HEADERS_LEN + payload.len()];
        let len = write(&mut buf, from, to, payload).expect("room for the frame");
        assert_eq!(len, buf.len());
        buf
    }

    /// Fills the IPv4 header checksum again after a test changed the header.
    fn refill_ip_checksum(frame: &mut [u8]) {
        ipv4::Packet::new_unchecked(&mut frame[14..]).fill_checksum();
    }

    #[test]
    fn a_unicast_frame_is_laid_out_byte_by_byte() {
        let payload = b"SLSYsync";
        let f = build(FROM, TO, payload);
        assert_eq!(f.len(), 14 + 20 + 8 + payload.len());
        assert_eq!(&f[0..6], &[0; 6], "destination: resolved by worker 0");
        assert_eq!(
            &f[6..12],
            &[0; 6],
            "source: the port's, written by worker 0"
        );
        assert_eq!(&f[12..14], &[0x08, 0x00]);
        // IPv4: version 4, IHL 5, total length, DF, TTL 64, UDP, addresses.
        assert_eq!(f[14], 0x45);
        assert_eq!(u16::from_be_bytes([f[16], f[17]]), 20 + 8 + 8);
        assert_eq!(&f[20..22], &[0x40, 0x00]);
        assert_eq!(f[22], 64);
        assert_eq!(f[23], 17);
        assert_eq!(&f[26..30], &[198, 18, 0, 1]);
        assert_eq!(&f[30..34], &[198, 18, 0, 2]);
        // The header checksum sums to 0xffff with the header.
        assert_eq!(checksum::fold(checksum::sum(&f[14..34])), 0xffff);
        let ip = ipv4::Packet::new_checked(&f[14..]).unwrap();
        assert!(ip.verify_checksum());
        // UDP: ports, length, checksum over the pseudo-header.
        assert_eq!(u16::from_be_bytes([f[34], f[35]]), 8848);
        assert_eq!(u16::from_be_bytes([f[36], f[37]]), 8849);
        assert_eq!(u16::from_be_bytes([f[38], f[39]]), 8 + 8);
        assert_ne!(
            u16::from_be_bytes([f[40], f[41]]),
            0,
            "a checksum is computed"
        );
        let pseudo = checksum::pseudo_header_sum(*FROM.ip(), *TO.ip(), 17, 16);
        assert_eq!(checksum::fold(pseudo + checksum::sum(&f[34..])), 0xffff);
        let seg = udp::Packet::new_checked(&f[34..]).unwrap();
        assert!(seg.verify_checksum(*FROM.ip(), *TO.ip()));
        assert_eq!(&f[42..], payload);
    }

    #[test]
    fn a_frame_to_the_group_has_its_mac_and_ttl_1() {
        assert_eq!(
            MacAddr::ipv4_multicast(Ipv4Addr::new(224, 0, 0, 81)),
            MacAddr([0x01, 0x00, 0x5e, 0x00, 0x00, 0x51])
        );
        // Only the low 23 bits: 239.255.1.2 and 224.127.1.2 share 01:00:5e:7f:01:02.
        assert_eq!(
            MacAddr::ipv4_multicast(Ipv4Addr::new(239, 255, 1, 2)),
            MacAddr([0x01, 0x00, 0x5e, 0x7f, 0x01, 0x02])
        );
        assert_eq!(
            MacAddr::ipv4_multicast(Ipv4Addr::new(224, 0, 0, 18)),
            crate::wire::vrrp::MULTICAST_MAC
        );
        let f = build(FROM, GROUP, b"batch");
        assert_eq!(&f[0..6], &[0x01, 0x00, 0x5e, 0x00, 0x00, 0x51]);
        assert_eq!(f[22], MULTICAST_TTL);
        assert!(ipv4::Packet::new_checked(&f[14..])
            .unwrap()
            .verify_checksum());
        let d = parse(&f).unwrap();
        assert_eq!((d.from, d.to, d.payload), (FROM, GROUP, &b"batch"[..]));
    }

    #[test]
    fn a_built_frame_parses_back() {
        for len in [0usize, 1, 2, 27, 1458] {
            let payload: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
            let f = build(FROM, TO, &payload);
            let d = parse(&f).unwrap_or_else(|e| panic!("{len} bytes: {e:?}"));
            assert_eq!(d.from, FROM);
            assert_eq!(d.to, TO);
            assert_eq!(d.payload, &payload[..]);
            // Ethernet padding after the IP packet is not part of the datagram.
            let mut padded = f.clone();
            padded.resize(f.len().max(60) + 4, 0xee);
            assert_eq!(parse(&padded).unwrap().payload, &payload[..]);
        }
    }

    #[test]
    fn no_room_or_an_oversized_datagram_writes_nothing() {
        let mut small = [0u8; HEADERS_LEN + 3];
        assert_eq!(write(&mut small, FROM, TO, b"four"), None);
        assert_eq!(small, [0u8; HEADERS_LEN + 3]);
        let huge = vec![0u8; 65_536];
        let mut buf = vec![0u8; HEADERS_LEN + huge.len()];
        assert_eq!(write(&mut buf, FROM, TO, &huge), None);
    }

    #[test]
    fn every_truncation_is_rejected() {
        let f = build(FROM, TO, b"0123456789abcdef");
        for cut in 0..f.len() {
            assert!(parse(&f[..cut]).is_err(), "{cut} bytes accepted");
        }
        assert_eq!(parse(&f[..13]), Err(FrameError::Truncated));
        assert_eq!(parse(&f[..33]), Err(FrameError::Truncated));
        assert_eq!(parse(&f[..f.len() - 1]), Err(FrameError::Truncated));
    }

    #[test]
    fn bad_checksums_are_rejected() {
        let f = build(FROM, TO, b"0123456789abcdef");
        // A flipped bit anywhere in the IPv4 header fails its checksum (or its checks).
        for byte in 14..34 {
            let mut bad = f.clone();
            bad[byte] ^= 0x10;
            assert!(parse(&bad).is_err(), "IPv4 byte {byte} flipped, accepted");
        }
        let mut bad = f.clone();
        bad[24] ^= 0x01;
        assert_eq!(parse(&bad), Err(FrameError::BadIpv4Checksum));
        // Anywhere in the UDP header or payload: the UDP checksum.
        for byte in 34..f.len() {
            if (38..40).contains(&byte) {
                continue; // the length: below
            }
            let mut bad = f.clone();
            bad[byte] ^= 0x01;
            assert_eq!(
                parse(&bad),
                Err(FrameError::BadUdpChecksum),
                "UDP byte {byte} flipped"
            );
        }
        // A changed source address (in the pseudo-header) with a fixed IP checksum.
        let mut bad = f.clone();
        bad[29] = 9;
        refill_ip_checksum(&mut bad);
        assert_eq!(parse(&bad), Err(FrameError::BadUdpChecksum));
        // No checksum (0) is allowed in IPv4.
        let mut none = f.clone();
        none[40..42].copy_from_slice(&[0, 0]);
        assert_eq!(parse(&none).unwrap().payload, b"0123456789abcdef");
    }

    #[test]
    fn wrong_lengths_and_other_packets_are_rejected() {
        let f = build(FROM, TO, b"0123456789abcdef");
        // UDP length shorter or longer than the IP payload, or below its header.
        for udp_len in [8u16, 23, 25, 7, 0] {
            let mut bad = f.clone();
            // (The length is checked before the checksum, which is left as it was.)
            bad[38..40].copy_from_slice(&udp_len.to_be_bytes());
            assert!(
                matches!(
                    parse(&bad),
                    Err(FrameError::BadUdpLength | FrameError::Truncated)
                ),
                "UDP length {udp_len}: {:?}",
                parse(&bad)
            );
        }
        // IPv4 total length past the frame.
        let mut bad = f.clone();
        bad[16..18].copy_from_slice(&100u16.to_be_bytes());
        refill_ip_checksum(&mut bad);
        assert_eq!(parse(&bad), Err(FrameError::Truncated));
        // IHL below 5, version 6.
        for first in [0x44u8, 0x65] {
            let mut bad = f.clone();
            bad[14] = first;
            assert_eq!(parse(&bad), Err(FrameError::BadIpv4Header));
        }
        // A fragment, TCP, ARP, VLAN-tagged.
        let mut frag = f.clone();
        frag[20..22].copy_from_slice(&[0x20, 0x00]);
        refill_ip_checksum(&mut frag);
        assert_eq!(parse(&frag), Err(FrameError::Fragment));
        let mut tcp = f.clone();
        tcp[23] = 6;
        refill_ip_checksum(&mut tcp);
        assert_eq!(parse(&tcp), Err(FrameError::NotUdp));
        for ethertype in [[0x08, 0x06], [0x81, 0x00], [0x86, 0xdd]] {
            let mut other = f.clone();
            other[12..14].copy_from_slice(&ethertype);
            assert_eq!(parse(&other), Err(FrameError::NotIpv4));
        }
    }
}
