//! IPv6 NAT: the source or destination address and port of a TCP segment or UDP
//! datagram in an IPv6 packet, rewritten in place. IPv6 has no header checksum, so
//! only the L4 checksum changes, incrementally: its pseudo-header covers both
//! addresses (RFC 8200 section 8.1) and the header covers the ports.
//!
//! | packet                          | result                          |
//! |---------------------------------|---------------------------------|
//! | IPv6 TCP / UDP, checksum set    | rewritten, checksum updated     |
//! | not TCP/UDP per `parsed`        | `UnsupportedProtocol`           |
//! | UDP with checksum 0 (invalid in IPv6, RFC 8200) | `BadUdpHeader`  |
//! | offsets past the frame          | `Truncated` / `BadTcpHeader`    |
//!
//! Extension headers stay as they are: `parsed.l4` is past them.
use crate::flow::parse::{Ipv6Payload, PacketKind, Parsed};
use crate::model::DropReason;
use crate::wire::checksum;
use crate::wire::ipv6;
use crate::wire::{tcp, udp};
use std::net::Ipv6Addr;

/// Rewrites the source (`src`) and/or destination (`dst`) address and port.
pub fn rewrite(
    frame: &mut [u8],
    parsed: &Parsed,
    src: Option<(Ipv6Addr, u16)>,
    dst: Option<(Ipv6Addr, u16)>,
) -> Result<(), DropReason> {
    let is_tcp = match parsed.kind {
        PacketKind::Ipv6(Ipv6Payload::Tcp { .. }) => true,
        PacketKind::Ipv6(Ipv6Payload::Udp { .. }) => false,
        _ => return Err(DropReason::UnsupportedProtocol),
    };
    let end = parsed.l3 + parsed.ip_total_len as usize;
    if parsed.l4 < parsed.l3 + ipv6::HEADER_LEN || end > frame.len() || parsed.l4 > end {
        return Err(DropReason::Truncated);
    }
    let (header, rest) = frame[parsed.l3..end].split_at_mut(parsed.l4 - parsed.l3);
    let mut ip = ipv6::Packet::new_unchecked(header);
    let (old_src, old_dst) = (ip.src_addr(), ip.dst_addr());
    // The L4 checks pass before anything is written.
    macro_rules! rewrite_l4 {
        ($segment:expr) => {{
            let mut segment = $segment;
            let mut sum = segment.checksum();
            if let Some((addr, port)) = src {
                sum = checksum::update128(sum, old_src, addr);
                sum = checksum::update16(sum, segment.src_port(), port);
                segment.set_src_port(port);
            }
            if let Some((addr, port)) = dst {
                sum = checksum::update128(sum, old_dst, addr);
                sum = checksum::update16(sum, segment.dst_port(), port);
                segment.set_dst_port(port);
            }
            // A UDP checksum computing to 0 is sent as 0xffff: 0 means "none", which
            // IPv6 forbids (RFC 8200 section 8.1; Linux drops such datagrams).
            segment.set_checksum(if !is_tcp && sum == 0 { 0xffff } else { sum });
        }};
    }
    if is_tcp {
        rewrite_l4!(tcp::Packet::new_checked(rest).map_err(|_| DropReason::BadTcpHeader)?);
    } else {
        let segment = udp::Packet::new_checked(rest).map_err(|_| DropReason::BadUdpHeader)?;
        if segment.checksum() == 0 {
            return Err(DropReason::BadUdpHeader);
        }
        rewrite_l4!(segment);
    }
    if let Some((addr, _)) = src {
        ip.set_src_addr(addr);
    }
    if let Some((addr, _)) = dst {
        ip.set_dst_addr(addr);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::parse::classify;

    /// Ethernet + IPv6 + a hop-by-hop header (8 bytes, PadN) + TCP (20 bytes, SYN)
    /// or UDP (8 bytes) with 4 payload bytes, checksum computed from scratch.
    fn frame(tcp: bool, hop_by_hop: bool) -> Vec<u8> {
        let src: Ipv6Addr = "2001:db8:2::9".parse().unwrap();
        let dst: Ipv6Addr = "2001:db8::1".parse().unwrap();
        let mut f = vec![0u8; 14];
        f[..6].copy_from_slice(&[0x02, 0, 0, 0, 0, 1]);
        f[6..12].copy_from_slice(&[0x02, 0, 0, 0, 0, 2]);
        f[12..14].copy_from_slice(&[0x86, 0xdd]);
        let proto = if tcp { 6u8 } else { 17 };
        let l4_len = if tcp { 24 } else { 12 };
        let ext = if hop_by_hop { 8 } else { 0 };
        let mut ip = vec![0x60, 0, 0, 0];
        ip.extend_from_slice(&((l4_len + ext) as u16).to_be_bytes());
        ip.push(if hop_by_hop { 0 } else { proto });
        ip.push(64);
        ip.extend_from_slice(&src.octets());
        ip.extend_from_slice(&dst.octets());
        if hop_by_hop {
            ip.extend_from_slice(&[proto, 0, 1, 4, 0, 0, 0, 0]);
        }
        let mut l4 = Vec::new();
        l4.extend_from_slice(&40000u16.to_be_bytes());
        l4.extend_from_slice(&80u16.to_be_bytes());
        if tcp {
            l4.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x02, 0x20, 0, 0, 0, 0, 0]);
        } else {
            l4.extend_from_slice(&12u16.to_be_bytes());
            l4.extend_from_slice(&[0, 0]);
        }
        l4.extend_from_slice(b"ping");
        f.extend_from_slice(&ip);
        let at = f.len();
        f.extend_from_slice(&l4);
        fix_checksum(&mut f, at, tcp);
        f
    }

    /// The L4 checksum of the segment at `at`, computed from scratch.
    fn scratch_checksum(f: &[u8], at: usize, tcp: bool) -> u16 {
        let src = Ipv6Addr::from(<[u8; 16]>::try_from(&f[22..38]).unwrap());
        let dst = Ipv6Addr::from(<[u8; 16]>::try_from(&f[38..54]).unwrap());
        let mut seg = f[at..].to_vec();
        let field = if tcp { 16 } else { 6 };
        seg[field..field + 2].copy_from_slice(&[0, 0]);
        let proto = if tcp { 6 } else { 17 };
        let sum =
            checksum::pseudo_header_sum_v6(src, dst, proto, seg.len() as u32) + checksum::sum(&seg);
        checksum::finish(sum)
    }

    fn fix_checksum(f: &mut [u8], at: usize, tcp: bool) {
        let value = scratch_checksum(f, at, tcp);
        let field = at + if tcp { 16 } else { 6 };
        f[field..field + 2].copy_from_slice(&value.to_be_bytes());
    }

    #[test]
    fn dnat_and_snat_keep_the_checksum_right_through_extension_headers() {
        let rs: Ipv6Addr = "2001:db8:1::2".parse().unwrap();
        let vip: Ipv6Addr = "2001:db8::1".parse().unwrap();
        for (tcp, hbh) in [(true, false), (true, true), (false, false), (false, true)] {
            let mut f = frame(tcp, hbh);
            let parsed = classify(&f).unwrap();
            rewrite(&mut f, &parsed, None, Some((rs, 8080))).unwrap();
            let at = parsed.l4;
            let field = at + if tcp { 16 } else { 6 };
            let got = u16::from_be_bytes([f[field], f[field + 1]]);
            assert_eq!(got, scratch_checksum(&f, at, tcp), "tcp={tcp} hbh={hbh}");
            assert_eq!(&f[38..54], &rs.octets());
            assert_eq!(&f[at + 2..at + 4], &8080u16.to_be_bytes());
            // And back, as the reply would be: the frame is what it was.
            let back = frame(tcp, hbh);
            rewrite(&mut f, &parsed, None, Some((vip, 80))).unwrap();
            assert_eq!(f, back, "tcp={tcp} hbh={hbh}");
            rewrite(&mut f, &parsed, Some((rs, 1234)), None).unwrap();
            let got = u16::from_be_bytes([f[field], f[field + 1]]);
            assert_eq!(got, scratch_checksum(&f, at, tcp));
            assert_eq!(&f[22..38], &rs.octets());
        }
    }

    /// A datagram whose checksum after the rewrite computes to 0 carries 0xffff: 0
    /// would mean "no checksum", which IPv6 forbids and Linux drops.
    #[test]
    fn a_udp_checksum_computing_to_zero_is_sent_as_all_ones() {
        let rs: Ipv6Addr = "2001:db8:1::2".parse().unwrap();
        let (at, field) = (54, 54 + 6);
        let found = (0..=u16::MAX).find_map(|v| {
            let mut f = frame(false, false);
            f[at + 10..at + 12].copy_from_slice(&v.to_be_bytes());
            fix_checksum(&mut f, at, false);
            let parsed = classify(&f).unwrap();
            rewrite(&mut f, &parsed, None, Some((rs, 8080))).unwrap();
            (scratch_checksum(&f, at, false) == 0).then_some(f)
        });
        let f = found.expect("some payload makes the checksum 0");
        assert_eq!(u16::from_be_bytes([f[field], f[field + 1]]), 0xffff);
        // It verifies: the sum over pseudo-header and datagram is all ones.
        let src = Ipv6Addr::from(<[u8; 16]>::try_from(&f[22..38]).unwrap());
        let dst = Ipv6Addr::from(<[u8; 16]>::try_from(&f[38..54]).unwrap());
        let len = (f.len() - at) as u32;
        let sum = checksum::pseudo_header_sum_v6(src, dst, 17, len) + checksum::sum(&f[at..]);
        assert_eq!(checksum::fold(sum), 0xffff);
    }

    #[test]
    fn refuses_what_it_cannot_rewrite_and_changes_nothing() {
        let rs: Ipv6Addr = "2001:db8:1::2".parse().unwrap();
        let mut f = frame(false, false);
        let at = 54;
        f[at + 6..at + 8].copy_from_slice(&[0, 0]);
        let parsed = classify(&f).unwrap();
        let before = f.clone();
        assert_eq!(
            rewrite(&mut f, &parsed, None, Some((rs, 1))),
            Err(DropReason::BadUdpHeader)
        );
        assert_eq!(f, before);
        let mut short = frame(true, false);
        let parsed = classify(&short).unwrap();
        short.truncate(60);
        assert_eq!(
            rewrite(&mut short, &parsed, None, Some((rs, 1))),
            Err(DropReason::Truncated)
        );
        let mut g = frame(true, false);
        let mut arp = classify(&g).unwrap();
        arp.kind = PacketKind::Arp;
        assert_eq!(
            rewrite(&mut g, &arp, None, Some((rs, 1))),
            Err(DropReason::UnsupportedProtocol)
        );
    }
}
