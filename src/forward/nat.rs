//! NAT rewrites (`ipvsadm -m`, and both halves of FullNAT): change an endpoint's IPv4
//! address and TCP/UDP port in place, with every checksum updated incrementally
//! (RFC 1624), never recomputed over the payload.
//!
//! - IPv4 header checksum: the changed address.
//! - TCP/UDP checksum: the changed address through the pseudo-header, and the port.
//!   A UDP checksum of 0 ("none", RFC 768) stays 0; a UDP result of 0 is sent as
//!   0xffff. A wrong checksum stays wrong by exactly as much, so the receiver still
//!   drops the segment (nothing verifies here; see [`crate::flow::parse`]).
//!
//! TTL is not decremented (see [`crate::forward`]). MACs are the caller's next step
//! ([`super::dr::forward`]). After a rewrite the `Parsed` still describes the frame's
//! layout, but its flow key is the pre-rewrite one.

use std::net::Ipv4Addr;

use crate::flow::parse::{PacketKind, Parsed};
use crate::model::DropReason;
use crate::wire::{checksum, tcp, udp, IpProtocol};

/// DNAT, client → real server: destination becomes `new_dst:new_dport`.
#[inline]
pub fn dnat(
    frame: &mut [u8],
    parsed: &Parsed,
    new_dst: Ipv4Addr,
    new_dport: u16,
) -> Result<(), DropReason> {
    rewrite(frame, parsed, None, Some((new_dst, new_dport)))
}

/// SNAT, real server → client (the reverse of [`dnat`], e.g. RIP:rport → VIP:vport)
/// or a FullNAT source: source becomes `new_src:new_sport`.
#[inline]
pub fn snat(
    frame: &mut [u8],
    parsed: &Parsed,
    new_src: Ipv4Addr,
    new_sport: u16,
) -> Result<(), DropReason> {
    rewrite(frame, parsed, Some((new_src, new_sport)), None)
}

/// Rewrites the source and/or destination `(address, port)` of a TCP or UDP packet;
/// `None` leaves that end alone. FullNAT passes both.
///
/// Errors, with the frame left unmodified: `UnsupportedProtocol` when `parsed` is not
/// TCP or UDP (or disagrees with the IPv4 protocol field); `Truncated` when `parsed`'s
/// offsets do not fit `frame`; `BadTcpHeader`/`BadUdpHeader` when the L4 header does
/// not. With a `Parsed` from [`classify`](crate::flow::parse::classify) of this frame
/// none of them happens.
#[inline]
pub fn rewrite(
    frame: &mut [u8],
    parsed: &Parsed,
    src: Option<(Ipv4Addr, u16)>,
    dst: Option<(Ipv4Addr, u16)>,
) -> Result<(), DropReason> {
    let protocol = match parsed.kind {
        PacketKind::Tcp { .. } => IpProtocol::TCP,
        PacketKind::Udp { .. } => IpProtocol::UDP,
        _ => return Err(DropReason::UnsupportedProtocol),
    };
    let mut ip = super::ip_packet_mut(frame, parsed).ok_or(DropReason::Truncated)?;
    if ip.protocol() != protocol {
        return Err(DropReason::UnsupportedProtocol);
    }
    let (old_src, old_dst) = (u32::from(ip.src_addr()), u32::from(ip.dst_addr()));
    // One checksum delta per header, folded once: the L4 one covers the pseudo-header
    // addresses and the ports, the IPv4 one the addresses.
    let mut l3_delta = checksum::Delta::default();
    if let Some((addr, _)) = src {
        l3_delta = l3_delta.field32(old_src, u32::from(addr));
    }
    if let Some((addr, _)) = dst {
        l3_delta = l3_delta.field32(old_dst, u32::from(addr));
    }

    // L4 first: its checks must pass before anything is written.
    macro_rules! rewrite_l4 {
        ($segment:expr) => {{
            let mut segment = $segment;
            let mut delta = l3_delta;
            if let Some((_, port)) = src {
                delta = delta.field16(segment.src_port(), port);
                segment.set_src_port(port);
            }
            if let Some((_, port)) = dst {
                delta = delta.field16(segment.dst_port(), port);
                segment.set_dst_port(port);
            }
            segment.apply_checksum_delta(delta);
        }};
    }
    if protocol == IpProtocol::TCP {
        rewrite_l4!(
            tcp::Packet::new_checked(ip.payload_mut()).map_err(|_| DropReason::BadTcpHeader)?
        );
    } else {
        rewrite_l4!(
            udp::Packet::new_checked(ip.payload_mut()).map_err(|_| DropReason::BadUdpHeader)?
        );
    }

    if let Some((addr, _)) = src {
        ip.set_src_addr(addr);
    }
    if let Some((addr, _)) = dst {
        ip.set_dst_addr(addr);
    }
    let value = l3_delta.apply(ip.checksum());
    ip.set_checksum(value);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::parse::classify;
    use crate::flow::parse::fixtures::*;
    use crate::forward::test_util::{frame, ip_checksum_ok, random_parsed};
    use crate::wire::ipv4;
    use crate::wire::test_util::XorShift;

    // TCP_SYN after DNAT to 10.0.0.11:8080, checksums recomputed by scapy.
    static TCP_SYN_DNAT: [u8; 74] = [
        0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x08, 0x00, 0x45,
        0x00, 0x00, 0x3c, 0x1c, 0x46, 0x40, 0x00, 0x3d, 0x06, 0xed, 0x2d, 0xc6, 0x33, 0x64, 0x0a,
        0x0a, 0x00, 0x00, 0x0b, 0x9c, 0x40, 0x1f, 0x90, 0x01, 0x02, 0x03, 0x04, 0x00, 0x00, 0x00,
        0x00, 0xa0, 0x02, 0xfa, 0xf0, 0x58, 0xef, 0x00, 0x00, 0x02, 0x04, 0x05, 0xb4, 0x04, 0x02,
        0x08, 0x0a, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x01, 0x03, 0x03, 0x07,
    ];
    // TCP_DATA_VLAN after SNAT to 10.0.0.1:61000, checksums recomputed by scapy.
    static TCP_DATA_VLAN_SNAT: [u8; 87] = [
        0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x81, 0x00, 0x00,
        0x64, 0x08, 0x00, 0x45, 0x00, 0x00, 0x45, 0x00, 0x07, 0x40, 0x00, 0x3d, 0x06, 0xf7, 0xa0,
        0x0a, 0x00, 0x00, 0x01, 0xcb, 0x00, 0x71, 0x0a, 0xee, 0x48, 0x00, 0x50, 0x00, 0x00, 0x03,
        0xe8, 0x00, 0x00, 0x07, 0xd0, 0x50, 0x18, 0x01, 0xf6, 0xab, 0x3e, 0x00, 0x00, 0x47, 0x45,
        0x54, 0x20, 0x2f, 0x20, 0x48, 0x54, 0x54, 0x50, 0x2f, 0x31, 0x2e, 0x31, 0x0d, 0x0a, 0x48,
        0x6f, 0x73, 0x74, 0x3a, 0x20, 0x76, 0x69, 0x70, 0x0d, 0x0a, 0x0d, 0x0a,
    ];
    // UDP_DNS after DNAT to 10.0.0.11:5300, checksums recomputed by scapy.
    static UDP_DNS_DNAT: [u8; 71] = [
        0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x08, 0x00, 0x45,
        0x00, 0x00, 0x39, 0x42, 0x42, 0x00, 0x00, 0x40, 0x11, 0x04, 0x2a, 0xc6, 0x33, 0x64, 0x0a,
        0x0a, 0x00, 0x00, 0x0b, 0x14, 0xe9, 0x14, 0xb4, 0x00, 0x25, 0x26, 0x83, 0xab, 0xcd, 0x01,
        0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x07, 0x65, 0x78, 0x61, 0x6d, 0x70,
        0x6c, 0x65, 0x03, 0x63, 0x6f, 0x6d, 0x00, 0x00, 0x01, 0x00, 0x01,
    ];

    fn l4_checksum(frame: &[u8], parsed: &Parsed) -> u16 {
        let at = parsed.l4
            + if parsed.flow_key().unwrap().proto == crate::model::Protocol::Tcp {
                16
            } else {
                6
            };
        u16::from_be_bytes([frame[at], frame[at + 1]])
    }

    /// Recomputes the L4 checksum from scratch and the IP checksum too, on a copy.
    fn recomputed(frame: &[u8], parsed: &Parsed) -> Vec<u8> {
        let mut copy = frame.to_vec();
        let end = parsed.ip_end();
        let mut ip = ipv4::Packet::new_checked(&mut copy[parsed.l3..end]).unwrap();
        ip.fill_checksum();
        let (src, dst) = (ip.src_addr(), ip.dst_addr());
        let segment = ip.payload_mut();
        match parsed.kind {
            PacketKind::Tcp { .. } => tcp::Packet::new_unchecked(segment).fill_checksum(src, dst),
            _ => {
                let mut udp = udp::Packet::new_unchecked(segment);
                if udp.checksum() != 0 {
                    udp.fill_checksum(src, dst);
                }
            }
        }
        copy
    }

    #[test]
    fn dnat_tcp_matches_scapy() {
        let parsed = classify(&TCP_SYN).unwrap();
        let mut buf = TCP_SYN;
        dnat(&mut buf, &parsed, RIP, 8080).unwrap();
        assert_eq!(buf, TCP_SYN_DNAT);
        let after = classify(&buf).unwrap();
        assert_eq!(after.flow_key().unwrap().dst_addr(), RIP);
        assert_eq!(after.flow_key().unwrap().dport, 8080);
        assert_eq!(buf[22], TCP_SYN[22], "TTL untouched");
    }

    #[test]
    fn snat_tcp_with_vlan_and_odd_payload_matches_scapy() {
        let parsed = classify(&TCP_DATA_VLAN).unwrap();
        let mut buf = TCP_DATA_VLAN;
        snat(&mut buf, &parsed, LIP, 61000).unwrap();
        assert_eq!(buf, TCP_DATA_VLAN_SNAT);
    }

    #[test]
    fn dnat_udp_matches_scapy_and_reverses() {
        let parsed = classify(&UDP_DNS).unwrap();
        let mut buf = UDP_DNS;
        dnat(&mut buf, &parsed, RIP, 5300).unwrap();
        assert_eq!(buf, UDP_DNS_DNAT);
        // The reply direction undoes it exactly: swap and SNAT back.
        let parsed = classify(&buf).unwrap();
        dnat(&mut buf, &parsed, VIP, 53).unwrap();
        assert_eq!(buf, UDP_DNS);
    }

    #[test]
    fn udp_without_checksum_stays_without() {
        let parsed = classify(&UDP_NO_CHECKSUM).unwrap();
        let mut buf = UDP_NO_CHECKSUM;
        dnat(&mut buf, &parsed, RIP, 5300).unwrap();
        snat(&mut buf, &parsed, LIP, 40001).unwrap();
        assert_eq!(buf[40..42], [0, 0], "checksum still absent");
        assert!(ip_checksum_ok(&buf, 14));
        let after = classify(&buf).unwrap().flow_key().unwrap();
        assert_eq!((after.src_addr(), after.sport), (LIP, 40001));
        assert_eq!((after.dst_addr(), after.dport), (RIP, 5300));
        assert_eq!(
            buf[42..],
            UDP_NO_CHECKSUM[42..],
            "payload and padding untouched"
        );
    }

    #[test]
    fn udp_result_zero_is_sent_as_ffff() {
        // A datagram whose checksum after DNAT computes to 0: pick the new port so
        // the one's-complement sum of everything else is its complement.
        let payload = *b"zero!";
        let mut l4 = [0u8; 13];
        l4[..4].copy_from_slice(&[0x13, 0x88, 0x00, 0x35]);
        l4[8..].copy_from_slice(&payload);
        let original = frame(IpProtocol::UDP, CLIENT, VIP, &l4, true);
        let parsed = classify(&original).unwrap();
        let mut probe = original.clone();
        dnat(&mut probe, &parsed, RIP, 0).unwrap();
        let mut zeroed = probe.clone();
        zeroed[40..42].copy_from_slice(&[0, 0]);
        let pseudo = checksum::pseudo_header_sum(CLIENT, RIP, 17, 13);
        let rest = checksum::fold(pseudo + checksum::sum(&zeroed[34..47]));
        let port = !rest; // rest + port = 0xffff in one's complement
        let mut buf = original.clone();
        dnat(&mut buf, &parsed, RIP, port).unwrap();
        assert_eq!(buf[40..42], [0xff, 0xff]);
        let udp = udp::Packet::new_checked(&buf[34..47]).unwrap();
        assert!(udp.verify_checksum(CLIENT, RIP));
        assert_eq!(recomputed(&buf, &parsed), buf);
    }

    /// Random TCP segments or UDP datagrams, random rewrites of either or both ends:
    /// the incremental checksums must equal a full recompute, and rewriting back must
    /// restore the original bytes.
    fn property(protocol: IpProtocol, udp_checksum: bool, seed: u64) {
        let mut rng = XorShift(seed);
        let mut l4 = vec![0u8; 1480];
        for round in 0..3000 {
            let header_len = if protocol == IpProtocol::TCP {
                20 + 4 * rng.below(11)
            } else {
                8
            };
            let len = header_len + rng.below(1400);
            rng.fill(&mut l4[..len]);
            if protocol == IpProtocol::TCP {
                l4[12] = ((header_len / 4) as u8) << 4 | (l4[12] & 0x0f);
            }
            let src = rng.host_v4();
            let dst = Ipv4Addr::from(rng.next_u64() as u32);
            let original = frame(protocol, src, dst, &l4[..len], udp_checksum);
            let parsed = classify(&original).unwrap();
            let key = parsed.flow_key().unwrap();

            let new_src = Ipv4Addr::from(rng.next_u64() as u32);
            let new_dst = Ipv4Addr::from(rng.next_u64() as u32);
            let (sport, dport) = (rng.next_u64() as u16, rng.next_u64() as u16);
            let mut buf = original.clone();
            match round % 3 {
                0 => dnat(&mut buf, &parsed, new_dst, dport).unwrap(),
                1 => snat(&mut buf, &parsed, new_src, sport).unwrap(),
                _ => rewrite(
                    &mut buf,
                    &parsed,
                    Some((new_src, sport)),
                    Some((new_dst, dport)),
                )
                .unwrap(),
            }
            assert_eq!(recomputed(&buf, &parsed), buf, "round {round}");
            assert!(ip_checksum_ok(&buf, 14));
            if !udp_checksum {
                assert_eq!(l4_checksum(&buf, &parsed), 0);
            }
            // And back.
            let back = (key.src_addr(), key.sport);
            let forth = (key.dst_addr(), key.dport);
            rewrite(&mut buf, &parsed, Some(back), Some(forth)).unwrap();
            assert_eq!(buf, original, "round {round}");
        }
    }

    #[test]
    fn property_tcp_incremental_equals_recompute() {
        property(IpProtocol::TCP, true, 0x1234_5678_9abc_def1);
    }

    #[test]
    fn property_udp_incremental_equals_recompute() {
        property(IpProtocol::UDP, true, 0x0fed_cba9_8765_4321);
    }

    #[test]
    fn property_udp_zero_checksum_stays_zero() {
        property(IpProtocol::UDP, false, 0x1111_2222_3333_4444);
    }

    #[test]
    fn bad_checksum_stays_bad_by_the_same_amount() {
        let parsed = classify(&TCP_SYN).unwrap();
        let mut bad = TCP_SYN;
        bad[50] ^= 0x01; // checksum off by one bit
        dnat(&mut bad, &parsed, RIP, 8080).unwrap();
        assert_eq!(bad[50] ^ 0x01, TCP_SYN_DNAT[50]);
        assert_eq!(bad[51], TCP_SYN_DNAT[51]);
    }

    #[test]
    fn errors_leave_the_frame_alone() {
        let icmp = classify(&ICMP_ECHO).unwrap();
        let mut buf = ICMP_ECHO;
        assert_eq!(
            dnat(&mut buf, &icmp, RIP, 1),
            Err(DropReason::UnsupportedProtocol)
        );
        assert_eq!(buf, ICMP_ECHO);

        let tcp = classify(&TCP_SYN).unwrap();
        let mut short = TCP_SYN;
        assert_eq!(
            dnat(&mut short[..60], &tcp, RIP, 1),
            Err(DropReason::Truncated)
        );
        // A TCP Parsed over a UDP frame of the same layout.
        let mut udp = UDP_DNS;
        let mut mismatched = classify(&UDP_DNS).unwrap();
        mismatched.kind = tcp.kind;
        assert_eq!(
            snat(&mut udp, &mismatched, LIP, 1),
            Err(DropReason::UnsupportedProtocol)
        );
        assert_eq!(udp, UDP_DNS);
        // A Parsed whose L4 offset disagrees with the IHL.
        let mut shifted = tcp;
        shifted.l4 += 4;
        let mut buf = TCP_SYN;
        assert_eq!(dnat(&mut buf, &shifted, RIP, 1), Err(DropReason::Truncated));
        assert_eq!(buf, TCP_SYN);
        // A TCP data offset corrupted after classification.
        let mut buf = TCP_SYN;
        buf[46] = 0xf0;
        assert_eq!(dnat(&mut buf, &tcp, RIP, 1), Err(DropReason::BadTcpHeader));
    }

    #[test]
    fn fuzz_never_panics() {
        let mut rng = XorShift(0xabad_1dea_f00d_cafe);
        let fixtures: [&[u8]; 4] = [&TCP_SYN, &TCP_DATA_VLAN, &UDP_DNS, &UDP_NO_CHECKSUM];
        let mut buf = [0u8; 128];
        let mut rewritten = 0;
        for round in 0..100_000 {
            let fixture = fixtures[rng.below(fixtures.len())];
            let parsed = if round % 2 == 0 {
                classify(fixture).unwrap()
            } else {
                random_parsed(&mut rng, buf.len())
            };
            let len = rng.below(buf.len() + 1);
            if rng.below(2) == 0 {
                rng.fill(&mut buf[..len]);
            } else {
                let n = fixture.len().min(len);
                buf[..n].copy_from_slice(&fixture[..n]);
                buf[rng.below(len.max(1)).min(len.saturating_sub(1))] ^= rng.next_u64() as u8;
            }
            let a = (Ipv4Addr::from(rng.next_u64() as u32), rng.next_u64() as u16);
            let result = match rng.below(3) {
                0 => dnat(&mut buf[..len], &parsed, a.0, a.1),
                1 => snat(&mut buf[..len], &parsed, a.0, a.1),
                _ => rewrite(&mut buf[..len], &parsed, Some(a), Some(a)),
            };
            rewritten += result.is_ok() as usize;
        }
        assert!(
            rewritten > 1000,
            "the fuzz reaches the rewrite: {rewritten}"
        );
    }
}
