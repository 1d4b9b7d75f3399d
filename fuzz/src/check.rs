//! Reads an output frame with [`crate::net`]'s checksum: where its IPv4 packet is,
//! whether its header and L4 checksums verify, what a tunnel carries inside.
use crate::net::{finish, pseudo, sum, verifies};
use std::net::Ipv4Addr;

/// An IPv4 packet as found in a frame.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ipv4 {
    pub src: Ipv4Addr,
    pub dst: Ipv4Addr,
    pub protocol: u8,
    /// Offset of the header in the frame.
    pub l3: usize,
    pub header_len: usize,
    pub total_len: usize,
    pub header_ok: bool,
    /// TCP/UDP/ICMP checksum verifies; `None` when there is nothing to check (a
    /// fragment, a segment too short for its header, another protocol, UDP with no
    /// checksum).
    pub l4_ok: Option<bool>,
    /// UDP with checksum field 0 ("none").
    pub udp_no_checksum: bool,
    /// TCP/UDP ports, when the header is there.
    pub ports: Option<(u16, u16)>,
    /// IP-in-IP: the inner packet.
    pub inner: Option<Box<Ipv4>>,
}

/// What a frame carries.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Frame {
    Ipv4(Ipv4),
    /// TCP or UDP right after the IPv6 header: its protocol and whether its checksum
    /// verifies (other IPv6 packets are `Other`).
    Ipv6 {
        protocol: u8,
        l4_ok: bool,
    },
    Arp {
        op: u16,
    },
    Other,
}

/// Offset and EtherType after the Ethernet header and any VLAN tags.
pub fn l2(frame: &[u8]) -> Option<(usize, u16)> {
    let mut at = 12;
    loop {
        let t = u16::from_be_bytes([*frame.get(at)?, *frame.get(at + 1)?]);
        if t == 0x8100 || t == 0x88a8 {
            at += 4;
            continue;
        }
        return Some((at + 2, t));
    }
}

/// The frame's IPv4 packet (or ARP), or why it cannot be read.
pub fn inspect(frame: &[u8]) -> Result<Frame, String> {
    let (l3, ethertype) = l2(frame).ok_or("Ethernet header cut")?;
    match ethertype {
        0x0800 => ipv4(&frame[l3..], l3).map(Frame::Ipv4),
        0x86dd => Ok(ipv6(&frame[l3..]).unwrap_or(Frame::Other)),
        0x0806 => {
            let arp = frame.get(l3..l3 + 28).ok_or("ARP cut")?;
            Ok(Frame::Arp {
                op: u16::from_be_bytes([arp[6], arp[7]]),
            })
        }
        _ => Ok(Frame::Other),
    }
}

/// A TCP or UDP packet in IPv6 without extension headers, and whether its checksum
/// (over the IPv6 pseudo-header, RFC 8200 section 8.1) verifies; `None` otherwise.
pub fn ipv6(p: &[u8]) -> Option<Frame> {
    let payload_len = usize::from(u16::from_be_bytes([*p.get(4)?, *p.get(5)?]));
    let protocol = *p.get(6)?;
    let l4 = p.get(40..40 + payload_len)?;
    if (protocol != 6 && protocol != 17) || p[0] >> 4 != 6 {
        return None;
    }
    let mut sum: u32 = 0;
    let mut add = |bytes: &[u8]| {
        for pair in bytes.chunks(2) {
            sum += u32::from(u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]));
        }
    };
    add(&p[8..40]);
    add(&(payload_len as u32).to_be_bytes());
    add(&[0, 0, 0, protocol]);
    add(l4);
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    // A UDP checksum field of 0 is "none", which IPv6 forbids (RFC 8200 8.1), even
    // where the sum would verify.
    let udp_without = protocol == 17 && l4.get(6..8) == Some(&[0, 0][..]);
    Some(Frame::Ipv6 {
        protocol,
        l4_ok: sum == 0xffff && !udp_without,
    })
}

/// Reads the IPv4 packet at the start of `p` (at offset `l3` of its frame).
pub fn ipv4(p: &[u8], l3: usize) -> Result<Ipv4, String> {
    if p.len() < 20 {
        return Err(format!("IPv4 header cut: {} bytes", p.len()));
    }
    if p[0] >> 4 != 4 {
        return Err(format!("IP version {}", p[0] >> 4));
    }
    let header_len = usize::from(p[0] & 0x0f) * 4;
    let total_len = usize::from(u16::from_be_bytes([p[2], p[3]]));
    if header_len < 20 || header_len > total_len || total_len > p.len() {
        return Err(format!(
            "IPv4 lengths: header {header_len}, total {total_len}, {} bytes there",
            p.len()
        ));
    }
    let header_ok = verifies(sum(&p[..header_len]));
    let fragment = u16::from_be_bytes([p[6], p[7]]) & 0x3fff != 0;
    let src = Ipv4Addr::new(p[12], p[13], p[14], p[15]);
    let dst = Ipv4Addr::new(p[16], p[17], p[18], p[19]);
    let protocol = p[9];
    let l4 = &p[header_len..total_len];
    let mut out = Ipv4 {
        src,
        dst,
        protocol,
        l3,
        header_len,
        total_len,
        header_ok,
        l4_ok: None,
        udp_no_checksum: false,
        ports: None,
        inner: None,
    };
    if fragment {
        return Ok(out);
    }
    let l4_sum = || pseudo(src, dst, protocol, l4.len()) + sum(l4);
    match protocol {
        6 if l4.len() >= 20 => {
            out.ports = Some(ports(l4));
            out.l4_ok = Some(verifies(l4_sum()));
        }
        17 if l4.len() >= 8 => {
            out.ports = Some(ports(l4));
            if l4[6..8] == [0, 0] {
                out.udp_no_checksum = true;
            } else {
                // A UDP sum of zero is sent as ffff (RFC 768): both verify the same way.
                out.l4_ok = Some(verifies(l4_sum()));
            }
        }
        1 if l4.len() >= 4 => out.l4_ok = Some(finish(sum(l4)) == 0),
        4 => out.inner = ipv4(l4, l3 + header_len).ok().map(Box::new),
        _ => {}
    }
    Ok(out)
}

fn ports(l4: &[u8]) -> (u16, u16) {
    (
        u16::from_be_bytes([l4[0], l4[1]]),
        u16::from_be_bytes([l4[2], l4[3]]),
    )
}

/// Checks a frame the code under test rewrote (`output`) against the frame it was
/// given (`input`): the output must be readable; its IPv4 header checksum must verify;
/// its L4 checksum must verify when the input's did (a rewrite may carry a wrong
/// checksum over as wrong, never break a right one), and when Sluice wrote the L4
/// message itself (ICMP made from a TCP/UDP packet); UDP may lose its checksum only if
/// it came without one; a tunnel's inner packet is the input's.
pub fn rewritten(input: &[u8], output: &[u8]) -> Result<Frame, String> {
    let before = inspect(input)?;
    let after = inspect(output)?;
    if let (
        Frame::Ipv6 {
            protocol: pb,
            l4_ok: true,
        },
        Frame::Ipv6 {
            protocol: pa,
            l4_ok,
        },
    ) = (&before, &after)
    {
        if pb == pa && !l4_ok {
            return Err(format!(
                "IPv6 L4 checksum broken by the rewrite: {before:?} -> {after:?}"
            ));
        }
        return Ok(after);
    }
    let (Frame::Ipv4(b), Frame::Ipv4(a)) = (&before, &after) else {
        if let Frame::Arp { op } = after {
            if op != 1 && op != 2 {
                return Err(format!("ARP op {op} sent"));
            }
        }
        return Ok(after);
    };
    if !a.header_ok {
        return Err(format!("IPv4 header checksum wrong in {a:?}"));
    }
    if let Some(inner) = &a.inner {
        if b.protocol != 4 {
            // Sluice encapsulated (TUN): the inner packet is the input's, intact.
            if !inner.header_ok {
                return Err(format!("inner IPv4 header checksum wrong: {inner:?}"));
            }
            if inner.l4_ok != b.l4_ok || inner.src != b.src || inner.dst != b.dst {
                return Err(format!(
                    "tunnel changed the inner packet: {b:?} -> {inner:?}"
                ));
            }
            return Ok(after);
        }
    }
    let made_here = a.protocol == 1 && b.protocol != 1;
    let must_verify = made_here || (a.protocol == b.protocol && b.l4_ok == Some(true));
    if must_verify && a.l4_ok != Some(true) {
        if a.protocol == 17 && a.udp_no_checksum && b.udp_no_checksum {
            return Ok(after);
        }
        return Err(format!("L4 checksum broken by the rewrite: {b:?} -> {a:?}"));
    }
    if a.protocol == 17 && b.protocol == 17 && a.udp_no_checksum && !b.udp_no_checksum {
        return Err(format!("UDP checksum became 0 (none): {b:?} -> {a:?}"));
    }
    Ok(after)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wrong_l4_checksum_after_a_right_one_is_caught() {
        let mut f =
            crate::frames::tcp_frame([2; 6], [3; 6], [10, 0, 0, 1], [10, 0, 0, 2], 1, 2, 0x02);
        let good = f.clone();
        rewritten(&good, &f).unwrap();
        f[14 + 20 + 16] ^= 1;
        assert!(rewritten(&good, &f).unwrap_err().contains("L4 checksum"));
        f[14 + 20 + 16] ^= 1;
        f[14 + 10] ^= 1;
        assert!(rewritten(&good, &f)
            .unwrap_err()
            .contains("header checksum"));
    }
}
