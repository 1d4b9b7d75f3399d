//! TOA ("TCP Option Address"): the client's address and port carried to a FullNAT real
//! server in a TCP option, in DPVS's wire format, so that a server that sees only
//! `LIP:lport` can still learn who the client is.
//!
//! ```text
//!  0        1        2        3        4        5        6        7
//! +--------+--------+--------+--------+--------+--------+--------+--------+
//! |  254   |   8    |  client port    |        client IPv4 address        |
//! +--------+--------+--------+--------+--------+--------+--------+--------+
//!  kind     length   network order     network order
//! ```
//!
//! Kind 254 is the RFC 4727 experimental kind that IPVS FullNAT, DPVS and the Linux
//! `toa` module agreed on (without the RFC 6994 experiment identifier, as they do).
//!
//! # Where the option goes
//!
//! [`insert`] puts it **first**, right after the 20-byte fixed header, and shifts the
//! other options and the data by 8 bytes. First, because parsers stop at an End of
//! Option List, which an option appended at the end could follow, and because readers
//! (the `toa` module included) take the first kind-254 option they meet. A segment that
//! already carries a kind-254 option of length 8 (a client trying to choose the
//! address the server will believe) has that option overwritten in place with the real
//! client ([`InsertOutcome::Replaced`]), whether or not there is room for another, and
//! any other kind-254 option made NOPs; with no room and no such option to reuse, the
//! client's kind-254 options still become NOPs, and the first eight NOPs in a row
//! (where a longer one was, say) take ours. Options are found as the module walks
//! them, which steps over options malformed for their kind. The client's later
//! segments lose theirs too ([`remove_forged`]): the module reads the ACK that
//! completes the server's handshake, which may come after the one given TOA.
//! Sequence numbers are untouched: options are not sequence space. The caller inserts
//! into the client's first ACK (the one that completes the handshake: the segment the
//! `toa` module reads, below) when the service has TOA on, and counts
//! [`InsertOutcome::NoRoom`].
//!
//! Room means: the TCP header stays within 60 bytes (a handshake ACK carries at most
//! timestamps, 32 bytes), the IPv4 packet within 65 535 bytes, and the buffer holds 8
//! more bytes after the IPv4 packet (`max_frame_len`: the caller's mbuf data plus
//! tailroom, and no more than the L2 header plus the MTU towards the real server).
//!
//! # The MSS
//!
//! Eight more bytes on a full-sized segment would exceed the path MTU. The segments that
//! grow travel client -> real server, and their size is bounded by the MSS the **real
//! server** announces in its SYN-ACK (an MSS option states what its sender can
//! receive; RFC 9293 section 3.7.1). So with TOA on, the caller passes the real
//! server's SYN-ACK through [`clamp_mss`] with `reduce_by` = [`TOA_LEN`] before it goes
//! to the client: the client then leaves room for the option in every segment. Clamping
//! the client's SYN instead would only shrink what the real server sends back, which
//! never carries TOA. A SYN-ACK without an MSS option implies 536 (RFC 9293), whose
//! 576-byte packets plus 8 fit every IPv4 path that matters.
//!
//! # How a real server reads TOA
//!
//! The option is in the packets, not in any socket API, so the real server needs help:
//!
//! - **The `toa` kernel module** (from Alibaba's LVS FullNAT, shipped with DPVS as
//!   `kmod/toa`). Loaded on the real server, it wraps the IPv4 TCP hook that creates
//!   the child socket of a passive connection (`syn_recv_sock`, run on the ACK that
//!   completes the handshake): it looks for a kind-254, length-8 option in that ACK and
//!   keeps the address with the socket. It also wraps the TCP sockets' `getname`
//!   operation, so `getpeername()` (and the address `accept()` returns) give the
//!   client's `IP:port` instead of `LIP:lport` when the socket has one. Applications
//!   (nginx's `$remote_addr`, access logs, rate limits) need no change. Consequence for
//!   Sluice: the option must be in the handshake's ACK; later segments are not read.
//! - **Without the module**: Linux offers no socket call that returns received TCP
//!   options. A program can read them from the packets, with a raw or `AF_PACKET`
//!   socket (as `tests/tools/toa_reader.py` does with scapy), and match the connection
//!   by its `LIP:lport` 4-tuple; or attach a `sock_ops` eBPF program that searches the
//!   received header for kind 254 with `bpf_load_hdr_opt` (Linux 5.10 and later) and
//!   stores the address in socket-local storage for the application to look up.
//!
//! # Checksums
//!
//! Both are updated incrementally (RFC 1624), never recomputed over the payload: the
//! IPv4 header for its total length; TCP for the pseudo-header length, the data offset
//! word, and the option's bytes. The shifted bytes move by 8, an even distance, so
//! their 16-bit words, and their sum, are unchanged. A byte range at an odd offset (an
//! MSS or a replaced option after a single NOP) is summed byte-swapped, which is what
//! it contributes to the 16-bit words it straddles. The tests compare every result
//! with a full recompute and with frames built by scapy.

use std::net::Ipv4Addr;

use crate::flow::parse::Parsed;
use crate::model::DropReason;
use crate::wire::tcp::{self, Options, TcpFlags, TcpOption};
use crate::wire::{checksum, ipv4};

/// The TCP option kind of TOA.
pub const TOA_KIND: u8 = 254;
/// Bytes of the option: kind, length, port, address.
pub const TOA_LEN: usize = 8;
/// Linux's smallest MSS (`TCP_MIN_MSS`): [`clamp_mss`] does not go below it.
pub const MIN_MSS: u16 = 88;

/// What [`insert`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InsertOutcome {
    /// The option was inserted; the frame is now `new_len` bytes long (the IPv4 packet
    /// grew by 8; Ethernet padding the frame had is gone).
    Inserted { new_len: usize },
    /// The option was written over the client's own: a kind-254 option of length 8,
    /// or, with no room for one more, at least 8 bytes of NOPs (a longer kind-254
    /// option made NOPs, say); the frame length is unchanged.
    Replaced,
    /// No room in the TCP header or the buffer, and no 8 NOPs in a row to write over:
    /// the frame is unchanged but for any kind-254 option of the client's, now NOPs
    /// (the caller counts it and forwards the segment).
    NoRoom,
}

/// What [`clamp_mss`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MssOutcome {
    /// The MSS option now reads `to` (equal to `from` when already at the floor).
    Clamped { from: u16, to: u16 },
    /// A SYN without an MSS option (unchanged).
    NoMssOption,
    /// Not a SYN (unchanged).
    NotSyn,
}

/// The option's eight bytes for `client`.
pub fn encode(client: (Ipv4Addr, u16)) -> [u8; TOA_LEN] {
    let (addr, port) = client;
    let [p0, p1] = port.to_be_bytes();
    let [a0, a1, a2, a3] = addr.octets();
    [TOA_KIND, TOA_LEN as u8, p0, p1, a0, a1, a2, a3]
}

/// The client in the first TOA option of a TCP options area, as the `toa` module reads
/// it ([`kind_254_options`]): the first option of kind 254 and length 8.
pub fn find(options: &[u8]) -> Option<(Ipv4Addr, u16)> {
    let (at, _) = kind_254_options(options).find(|&(_, len)| len == TOA_LEN)?;
    let data = options.get(at + 2..at + TOA_LEN)?;
    let port = u16::from_be_bytes([data[0], data[1]]);
    Some((Ipv4Addr::new(data[2], data[3], data[4], data[5]), port))
}

/// Most options an options area of 40 bytes holds (two bytes each at least).
const MAX_OPTIONS: usize = 20;

/// The (offset, length) of every kind-254 option in `options`, in order, walked as the
/// `toa` module walks them: End of Option List stops, a NOP is one byte, and any other
/// option is stepped over by its length byte, whatever its kind, while that length is
/// at least 2 and fits (else the walk stops). Lenient on purpose: an option malformed
/// for its kind (an MSS of length 3) stops Sluice's own parser but not the module, so
/// a kind-254 option behind it would be read by the module and missed here. The
/// module takes length 8 (IPv4) and, in DPVS's version, 20 (IPv6).
/// (At most [`MAX_OPTIONS`] of them: all an options area of 40 bytes can hold.)
fn kind_254_options(options: &[u8]) -> impl Iterator<Item = (usize, usize)> {
    let mut found = [None::<(u8, u8)>; MAX_OPTIONS];
    let (mut at, mut n) = (0, 0);
    while let Some(&kind) = options.get(at) {
        match kind {
            0 => break,
            1 => at += 1,
            _ => {
                let len = usize::from(options.get(at + 1).copied().unwrap_or(0));
                if len < 2 || at + len > options.len() {
                    break;
                }
                if kind == TOA_KIND {
                    match (found.get_mut(n), u8::try_from(at)) {
                        (Some(slot), Ok(at)) => *slot = Some((at, len as u8)),
                        _ => break,
                    }
                    n += 1;
                }
                at += len;
            }
        }
    }
    found
        .into_iter()
        .flatten()
        .map(|(at, len)| (usize::from(at), usize::from(len)))
}

/// The offset of the first `want` NOPs in a row in `options`, walked as
/// [`kind_254_options`] walks them (so the run starts where the `toa` module reads an
/// option).
fn nop_run(options: &[u8], want: usize) -> Option<usize> {
    let (mut at, mut run_start, mut run) = (0, 0, 0);
    while let Some(&kind) = options.get(at) {
        match kind {
            0 => return None,
            1 => {
                if run == 0 {
                    run_start = at;
                }
                run += 1;
                if run == want {
                    return Some(run_start);
                }
                at += 1;
            }
            _ => {
                let len = usize::from(options.get(at + 1).copied().unwrap_or(0));
                if len < 2 || at + len > options.len() {
                    return None;
                }
                run = 0;
                at += len;
            }
        }
    }
    None
}

/// Every kind-254 option of the TCP options at `segment[options_at..]` made NOPs
/// (checksum updated), but the one at `keep`; how many.
fn nop_kind_254(segment: &mut [u8], options_at: usize, header_len: usize, keep: usize) -> usize {
    const NOPS: [u8; 40] = [1; 40];
    let found = kind_254_options(&segment[options_at..header_len]);
    let mut removed = 0;
    for (at, len) in found.filter(|&(at, _)| at != keep) {
        super::replace_tcp_bytes(segment, options_at + at, &NOPS[..len]);
        removed += 1;
    }
    removed
}

/// Makes NOPs of every kind-254 option of the TCP segment `parsed` describes, as the
/// `toa` module would read it ([`kind_254_options`]), with the TCP checksum updated;
/// returns how many. For a FullNAT segment towards a real server that carries no TOA
/// of Sluice's: the module reads the option from whichever ACK completes the server's
/// handshake, which need not be the one Sluice wrote TOA into (that one may be lost
/// or refused by the server), so a client's own option there would be believed.
/// Errors as [`insert`]'s, with the frame unchanged.
pub fn remove_forged(frame: &mut [u8], parsed: &Parsed) -> Result<usize, DropReason> {
    let super::TcpSegment { l4, ip_end, .. } = super::tcp_segment(frame, parsed)?;
    Ok(remove_forged_from_segment(&mut frame[l4..ip_end]))
}

/// [`remove_forged`] for a frame `classify` found TCP in (IPv4 or IPv6), without
/// reading the IP header again: the segment runs from `parsed.l4` to the end of the
/// IP packet. A frame shorter than that is left alone.
#[inline]
pub fn remove_forged_classified(frame: &mut [u8], parsed: &Parsed) -> usize {
    match frame.get_mut(parsed.l4..parsed.ip_end()) {
        Some(segment) => remove_forged_from_segment(segment),
        None => 0,
    }
}

/// [`remove_forged`] on a TCP segment of either family, from its first header byte
/// to its end (the checksum is updated incrementally, so the pseudo-header does not
/// matter): for IPv6 FullNAT and NAT64 too. A SYN is left alone: the module reads
/// ACKs only, and SYNs carry RFC 6994 experiments in kind 254 (TCP Fast Open's
/// experimental cookie). A segment too short for its header is left alone.
#[inline]
pub fn remove_forged_from_segment(segment: &mut [u8]) -> usize {
    let Some(&[offset, flags]) = segment.get(12..14) else {
        return 0;
    };
    let header_len = usize::from(offset >> 4) * 4;
    if TcpFlags(flags).contains(TcpFlags::SYN) || header_len <= tcp::MIN_HEADER_LEN {
        return 0;
    }
    let Some(options) = segment.get(tcp::MIN_HEADER_LEN..header_len) else {
        return 0;
    };
    // Most segments carry timestamps at most: the walk steps over their data in three
    // steps (NOP, NOP, timestamps), cheaper than a scan of every byte.
    if !has_kind_254(options) {
        return 0;
    }
    nop_kind_254(segment, tcp::MIN_HEADER_LEN, header_len, usize::MAX)
}

/// Whether the `toa` module's walk ([`kind_254_options`]) meets a kind-254 option.
#[inline]
fn has_kind_254(options: &[u8]) -> bool {
    let mut at = 0;
    while let Some(&kind) = options.get(at) {
        match kind {
            0 => return false,
            1 => at += 1,
            TOA_KIND => return true,
            _ => match options.get(at + 1) {
                Some(&len) if len >= 2 => at += usize::from(len),
                _ => return false,
            },
        }
    }
    false
}

/// Offset in `options` of the MSS option's value, and the value.
fn mss_offset(options: &[u8]) -> Option<(usize, u16)> {
    let mut at = 0;
    for option in Options::new(options) {
        match option {
            Ok(TcpOption::MaxSegmentSize(mss)) => return Some((at + 2, mss)),
            Ok(option) => at += option.buffer_len(),
            Err(_) => return None,
        }
    }
    None
}

/// Inserts the TOA option carrying `client` into the TCP segment `parsed` describes,
/// in place; see the module doc. `frame` is the buffer from the frame's first byte,
/// possibly longer than the frame; `max_frame_len` bounds the frame's new length too.
///
/// Errors, with the frame unchanged: `UnsupportedProtocol` when `parsed` is not TCP or
/// disagrees with the IPv4 protocol; `Truncated` when its offsets do not fit `frame`;
/// `BadTcpHeader` when the TCP header does not fit the packet.
pub fn insert(
    frame: &mut [u8],
    parsed: &Parsed,
    client: (Ipv4Addr, u16),
    max_frame_len: usize,
) -> Result<InsertOutcome, DropReason> {
    let super::TcpSegment {
        l4,
        ip_end,
        header_len,
    } = super::tcp_segment(frame, parsed)?;
    let option = encode(client);
    let options_at = l4 + tcp::MIN_HEADER_LEN;

    // A client's own kind-254 options: the first of length 8 holds the client now,
    // the others go (the module could read one of them first).
    let options = &frame[options_at..l4 + header_len];
    let first_8 = kind_254_options(options).find(|&(_, len)| len == TOA_LEN);
    let segment = &mut frame[l4..ip_end];
    if let Some((at, _)) = first_8 {
        nop_kind_254(segment, tcp::MIN_HEADER_LEN, header_len, at);
        super::replace_tcp_bytes(segment, tcp::MIN_HEADER_LEN + at, &option);
        return Ok(InsertOutcome::Replaced);
    }
    // Those left go even with no room for ours: better no client than a forged one.
    nop_kind_254(segment, tcp::MIN_HEADER_LEN, header_len, usize::MAX);

    let new_end = ip_end + TOA_LEN;
    let old_total = (ip_end - parsed.l3) as u16;
    let no_room = match u16::try_from(ip_end - parsed.l3 + TOA_LEN) {
        Ok(_) => {
            header_len + TOA_LEN > tcp::MAX_HEADER_LEN || new_end > frame.len().min(max_frame_len)
        }
        Err(_) => true,
    };
    if no_room {
        // Eight NOPs in a row (where a longer kind-254 option was, say) hold ours
        // as well as new room would: the server gets the client rather than none.
        let segment = &mut frame[l4..ip_end];
        let options = &segment[tcp::MIN_HEADER_LEN..header_len];
        return Ok(match nop_run(options, TOA_LEN) {
            Some(at) => {
                super::replace_tcp_bytes(segment, tcp::MIN_HEADER_LEN + at, &option);
                InsertOutcome::Replaced
            }
            None => InsertOutcome::NoRoom,
        });
    }
    let new_total = (ip_end - parsed.l3 + TOA_LEN) as u16;

    frame.copy_within(options_at..ip_end, options_at + TOA_LEN);
    frame[options_at..options_at + TOA_LEN].copy_from_slice(&option);

    // The data offset shares its 16-bit word with the flags; the low nibble (reserved
    // bits and AE) is kept as it came.
    let offset_byte = frame[l4 + 12];
    let old_word = u16::from_be_bytes([offset_byte, frame[l4 + 13]]);
    frame[l4 + 12] = (((header_len + TOA_LEN) / 4) as u8) << 4 | (offset_byte & 0x0f);
    let new_word = u16::from_be_bytes([frame[l4 + 12], frame[l4 + 13]]);
    let (old_segment_len, new_segment_len) = (
        old_total - (l4 - parsed.l3) as u16,
        new_total - (l4 - parsed.l3) as u16,
    );
    let mut segment = tcp::Packet::new_unchecked(&mut frame[l4..new_end]);
    segment.update_checksum16(old_word, new_word);
    segment.update_checksum16(old_segment_len, new_segment_len);
    let added = checksum::sum(&option);
    segment.set_checksum(!checksum::fold(!segment.checksum() as u32 + added));

    let mut ip = ipv4::Packet::new_unchecked(&mut frame[parsed.l3..new_end]);
    ip.set_total_len(new_total);
    ip.set_checksum(checksum::update16(ip.checksum(), old_total, new_total));
    Ok(InsertOutcome::Inserted { new_len: new_end })
}

/// Lowers the MSS option of a SYN (in practice the real server's SYN-ACK, see the
/// module doc) by `reduce_by`, not below [`MIN_MSS`] (nor raising one already below),
/// with the TCP checksum updated incrementally. Other segments and SYNs without MSS
/// are left alone. Errors as [`insert`]'s.
pub fn clamp_mss(
    frame: &mut [u8],
    parsed: &Parsed,
    reduce_by: u16,
) -> Result<MssOutcome, DropReason> {
    let super::TcpSegment {
        l4,
        ip_end,
        header_len,
    } = super::tcp_segment(frame, parsed)?;
    let segment = &mut frame[l4..ip_end];
    if !tcp::Packet::new_unchecked(&*segment)
        .flags()
        .contains(TcpFlags::SYN)
    {
        return Ok(MssOutcome::NotSyn);
    }
    let Some((at, from)) = mss_offset(&segment[tcp::MIN_HEADER_LEN..header_len]) else {
        return Ok(MssOutcome::NoMssOption);
    };
    let to = from.saturating_sub(reduce_by).max(MIN_MSS.min(from));
    if to != from {
        super::replace_tcp_bytes(segment, tcp::MIN_HEADER_LEN + at, &to.to_be_bytes());
    }
    Ok(MssOutcome::Clamped { from, to })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::parse::classify;
    use crate::flow::parse::fixtures::{TCP_DATA_VLAN, TCP_SYN, UDP_DNS};
    use crate::forward::test_util::{frame, ip_checksum_ok, random_parsed};
    use crate::wire::test_util::XorShift;
    use crate::wire::IpProtocol;

    const CLIENT: (Ipv4Addr, u16) = (Ipv4Addr::new(198, 51, 100, 10), 40000);

    // Built with scapy 2.5 (tests/tools is not needed to run these): FullNAT'ed
    // segments 10.0.0.1:61000 -> 10.0.0.11:8080, and each with the TOA option for
    // 198.51.100.10:40000 added first in its options (scapy's own checksums). The SYN-ACKs
    // go the other way; TCP_SYN_1452 is the parse fixture TCP_SYN with MSS 1452.
    // 66 bytes
    static ACK_TS: [u8; 66] = [
        0x52, 0x54, 0x00, 0x00, 0x00, 0x0b, 0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x08, 0x00, 0x45,
        0x00, 0x00, 0x34, 0x00, 0x07, 0x40, 0x00, 0x40, 0x06, 0x26, 0xb2, 0x0a, 0x00, 0x00, 0x01,
        0x0a, 0x00, 0x00, 0x0b, 0xee, 0x48, 0x1f, 0x90, 0x00, 0x00, 0x03, 0xe8, 0x00, 0x00, 0x07,
        0xd0, 0x80, 0x10, 0x01, 0xf6, 0x68, 0xee, 0x00, 0x00, 0x01, 0x01, 0x08, 0x0a, 0x00, 0x01,
        0xe2, 0x40, 0x00, 0x09, 0xfb, 0xf1,
    ];
    // 74 bytes
    static ACK_TS_TOA: [u8; 74] = [
        0x52, 0x54, 0x00, 0x00, 0x00, 0x0b, 0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x08, 0x00, 0x45,
        0x00, 0x00, 0x3c, 0x00, 0x07, 0x40, 0x00, 0x40, 0x06, 0x26, 0xaa, 0x0a, 0x00, 0x00, 0x01,
        0x0a, 0x00, 0x00, 0x0b, 0xee, 0x48, 0x1f, 0x90, 0x00, 0x00, 0x03, 0xe8, 0x00, 0x00, 0x07,
        0xd0, 0xa0, 0x10, 0x01, 0xf6, 0x84, 0x5e, 0x00, 0x00, 0xfe, 0x08, 0x9c, 0x40, 0xc6, 0x33,
        0x64, 0x0a, 0x01, 0x01, 0x08, 0x0a, 0x00, 0x01, 0xe2, 0x40, 0x00, 0x09, 0xfb, 0xf1,
    ];
    // 60 bytes
    static ACK_PLAIN: [u8; 60] = [
        0x52, 0x54, 0x00, 0x00, 0x00, 0x0b, 0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x08, 0x00, 0x45,
        0x00, 0x00, 0x28, 0x00, 0x07, 0x40, 0x00, 0x40, 0x06, 0x26, 0xbe, 0x0a, 0x00, 0x00, 0x01,
        0x0a, 0x00, 0x00, 0x0b, 0xee, 0x48, 0x1f, 0x90, 0x00, 0x00, 0x03, 0xe8, 0x00, 0x00, 0x07,
        0xd0, 0x51, 0x10, 0x01, 0xf6, 0x7f, 0x42, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];
    // 62 bytes
    static ACK_PLAIN_TOA: [u8; 62] = [
        0x52, 0x54, 0x00, 0x00, 0x00, 0x0b, 0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x08, 0x00, 0x45,
        0x00, 0x00, 0x30, 0x00, 0x07, 0x40, 0x00, 0x40, 0x06, 0x26, 0xb6, 0x0a, 0x00, 0x00, 0x01,
        0x0a, 0x00, 0x00, 0x0b, 0xee, 0x48, 0x1f, 0x90, 0x00, 0x00, 0x03, 0xe8, 0x00, 0x00, 0x07,
        0xd0, 0x71, 0x10, 0x01, 0xf6, 0x9a, 0xb2, 0x00, 0x00, 0xfe, 0x08, 0x9c, 0x40, 0xc6, 0x33,
        0x64, 0x0a,
    ];
    // 99 bytes
    static DATA_VLAN: [u8; 99] = [
        0x52, 0x54, 0x00, 0x00, 0x00, 0x0b, 0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x81, 0x00, 0x00,
        0x64, 0x08, 0x00, 0x45, 0x00, 0x00, 0x51, 0x00, 0x07, 0x40, 0x00, 0x40, 0x06, 0x26, 0x95,
        0x0a, 0x00, 0x00, 0x01, 0x0a, 0x00, 0x00, 0x0b, 0xee, 0x48, 0x1f, 0x90, 0x00, 0x00, 0x03,
        0xe8, 0x00, 0x00, 0x07, 0xd0, 0x80, 0x18, 0x01, 0xf6, 0xa6, 0xaa, 0x00, 0x00, 0x01, 0x01,
        0x08, 0x0a, 0x00, 0x01, 0xe2, 0x40, 0x00, 0x09, 0xfb, 0xf1, 0x47, 0x45, 0x54, 0x20, 0x2f,
        0x20, 0x48, 0x54, 0x54, 0x50, 0x2f, 0x31, 0x2e, 0x31, 0x0d, 0x0a, 0x48, 0x6f, 0x73, 0x74,
        0x3a, 0x20, 0x76, 0x69, 0x70, 0x0d, 0x0a, 0x0d, 0x0a,
    ];
    // 107 bytes
    static DATA_VLAN_TOA: [u8; 107] = [
        0x52, 0x54, 0x00, 0x00, 0x00, 0x0b, 0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x81, 0x00, 0x00,
        0x64, 0x08, 0x00, 0x45, 0x00, 0x00, 0x59, 0x00, 0x07, 0x40, 0x00, 0x40, 0x06, 0x26, 0x8d,
        0x0a, 0x00, 0x00, 0x01, 0x0a, 0x00, 0x00, 0x0b, 0xee, 0x48, 0x1f, 0x90, 0x00, 0x00, 0x03,
        0xe8, 0x00, 0x00, 0x07, 0xd0, 0xa0, 0x18, 0x01, 0xf6, 0xc2, 0x1a, 0x00, 0x00, 0xfe, 0x08,
        0x9c, 0x40, 0xc6, 0x33, 0x64, 0x0a, 0x01, 0x01, 0x08, 0x0a, 0x00, 0x01, 0xe2, 0x40, 0x00,
        0x09, 0xfb, 0xf1, 0x47, 0x45, 0x54, 0x20, 0x2f, 0x20, 0x48, 0x54, 0x54, 0x50, 0x2f, 0x31,
        0x2e, 0x31, 0x0d, 0x0a, 0x48, 0x6f, 0x73, 0x74, 0x3a, 0x20, 0x76, 0x69, 0x70, 0x0d, 0x0a,
        0x0d, 0x0a,
    ];
    // 91 bytes
    static FULL_52: [u8; 91] = [
        0x52, 0x54, 0x00, 0x00, 0x00, 0x0b, 0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x08, 0x00, 0x45,
        0x00, 0x00, 0x4d, 0x00, 0x07, 0x40, 0x00, 0x40, 0x06, 0x26, 0x99, 0x0a, 0x00, 0x00, 0x01,
        0x0a, 0x00, 0x00, 0x0b, 0xee, 0x48, 0x1f, 0x90, 0x00, 0x00, 0x03, 0xe8, 0x00, 0x00, 0x07,
        0xd0, 0xd0, 0x10, 0x01, 0xf6, 0xcf, 0xe6, 0x00, 0x00, 0x01, 0x01, 0x08, 0x0a, 0x00, 0x01,
        0xe2, 0x40, 0x00, 0x09, 0xfb, 0xf1, 0x05, 0x12, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00,
        0x02, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x68, 0x65, 0x6c, 0x6c,
        0x6f,
    ];
    // 99 bytes
    static FULL_52_TOA: [u8; 99] = [
        0x52, 0x54, 0x00, 0x00, 0x00, 0x0b, 0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x08, 0x00, 0x45,
        0x00, 0x00, 0x55, 0x00, 0x07, 0x40, 0x00, 0x40, 0x06, 0x26, 0x91, 0x0a, 0x00, 0x00, 0x01,
        0x0a, 0x00, 0x00, 0x0b, 0xee, 0x48, 0x1f, 0x90, 0x00, 0x00, 0x03, 0xe8, 0x00, 0x00, 0x07,
        0xd0, 0xf0, 0x10, 0x01, 0xf6, 0xeb, 0x56, 0x00, 0x00, 0xfe, 0x08, 0x9c, 0x40, 0xc6, 0x33,
        0x64, 0x0a, 0x01, 0x01, 0x08, 0x0a, 0x00, 0x01, 0xe2, 0x40, 0x00, 0x09, 0xfb, 0xf1, 0x05,
        0x12, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00,
        0x00, 0x04, 0x00, 0x00, 0x68, 0x65, 0x6c, 0x6c, 0x6f,
    ];
    // 90 bytes
    static FULL_56: [u8; 90] = [
        0x52, 0x54, 0x00, 0x00, 0x00, 0x0b, 0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x08, 0x00, 0x45,
        0x00, 0x00, 0x4c, 0x00, 0x07, 0x40, 0x00, 0x40, 0x06, 0x26, 0x9a, 0x0a, 0x00, 0x00, 0x01,
        0x0a, 0x00, 0x00, 0x0b, 0xee, 0x48, 0x1f, 0x90, 0x00, 0x00, 0x03, 0xe8, 0x00, 0x00, 0x07,
        0xd0, 0xe0, 0x10, 0x01, 0xf6, 0xe2, 0xe1, 0x00, 0x00, 0x08, 0x0a, 0x00, 0x00, 0x00, 0x01,
        0x00, 0x00, 0x00, 0x02, 0x05, 0x1a, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x02, 0x00,
        0x00, 0x00, 0x03, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x05, 0x00, 0x00, 0x00, 0x06,
    ];
    // 67 bytes
    static FORGED: [u8; 67] = [
        0x52, 0x54, 0x00, 0x00, 0x00, 0x0b, 0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x08, 0x00, 0x45,
        0x00, 0x00, 0x35, 0x00, 0x07, 0x40, 0x00, 0x40, 0x06, 0x26, 0xb1, 0x0a, 0x00, 0x00, 0x01,
        0x0a, 0x00, 0x00, 0x0b, 0xee, 0x48, 0x1f, 0x90, 0x00, 0x00, 0x03, 0xe8, 0x00, 0x00, 0x07,
        0xd0, 0x80, 0x10, 0x01, 0xf6, 0xc6, 0x30, 0x00, 0x00, 0x01, 0xfe, 0x08, 0x00, 0x01, 0x01,
        0x02, 0x03, 0x04, 0x01, 0x01, 0x01, 0x78,
    ];
    // 67 bytes
    static FORGED_FIXED: [u8; 67] = [
        0x52, 0x54, 0x00, 0x00, 0x00, 0x0b, 0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x08, 0x00, 0x45,
        0x00, 0x00, 0x35, 0x00, 0x07, 0x40, 0x00, 0x40, 0x06, 0x26, 0xb1, 0x0a, 0x00, 0x00, 0x01,
        0x0a, 0x00, 0x00, 0x0b, 0xee, 0x48, 0x1f, 0x90, 0x00, 0x00, 0x03, 0xe8, 0x00, 0x00, 0x07,
        0xd0, 0x80, 0x10, 0x01, 0xf6, 0x4e, 0x6e, 0x00, 0x00, 0x01, 0xfe, 0x08, 0x9c, 0x40, 0xc6,
        0x33, 0x64, 0x0a, 0x01, 0x01, 0x01, 0x78,
    ];
    // 66 bytes
    static SYN_ACK_ODD_MSS: [u8; 66] = [
        0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x52, 0x54, 0x00, 0x00, 0x00, 0x0b, 0x08, 0x00, 0x45,
        0x00, 0x00, 0x34, 0x00, 0x00, 0x40, 0x00, 0x40, 0x06, 0x26, 0xb9, 0x0a, 0x00, 0x00, 0x0b,
        0x0a, 0x00, 0x00, 0x01, 0x1f, 0x90, 0xee, 0x48, 0x00, 0x00, 0x13, 0x88, 0x00, 0x00, 0x03,
        0xe9, 0x80, 0x12, 0xfe, 0x88, 0x82, 0xd8, 0x00, 0x00, 0x01, 0x02, 0x04, 0x05, 0xb4, 0x01,
        0x03, 0x03, 0x07, 0x04, 0x02, 0x00,
    ];
    // 66 bytes
    static SYN_ACK_ODD_MSS_1452: [u8; 66] = [
        0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x52, 0x54, 0x00, 0x00, 0x00, 0x0b, 0x08, 0x00, 0x45,
        0x00, 0x00, 0x34, 0x00, 0x00, 0x40, 0x00, 0x40, 0x06, 0x26, 0xb9, 0x0a, 0x00, 0x00, 0x0b,
        0x0a, 0x00, 0x00, 0x01, 0x1f, 0x90, 0xee, 0x48, 0x00, 0x00, 0x13, 0x88, 0x00, 0x00, 0x03,
        0xe9, 0x80, 0x12, 0xfe, 0x88, 0x8a, 0xd8, 0x00, 0x00, 0x01, 0x02, 0x04, 0x05, 0xac, 0x01,
        0x03, 0x03, 0x07, 0x04, 0x02, 0x00,
    ];
    // 74 bytes
    static TCP_SYN_1452: [u8; 74] = [
        0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x08, 0x00, 0x45,
        0x00, 0x00, 0x3c, 0x1c, 0x46, 0x40, 0x00, 0x3d, 0x06, 0xbb, 0x2d, 0xc6, 0x33, 0x64, 0x0a,
        0xcb, 0x00, 0x71, 0x0a, 0x9c, 0x40, 0x00, 0x50, 0x01, 0x02, 0x03, 0x04, 0x00, 0x00, 0x00,
        0x00, 0xa0, 0x02, 0xfa, 0xf0, 0x46, 0x37, 0x00, 0x00, 0x02, 0x04, 0x05, 0xac, 0x04, 0x02,
        0x08, 0x0a, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x01, 0x03, 0x03, 0x07,
    ];

    /// Copies `input` into a buffer with room to spare and inserts.
    fn insert_into(input: &[u8], spare: usize) -> (Vec<u8>, Result<InsertOutcome, DropReason>) {
        let parsed = classify(input).unwrap();
        let mut buf = input.to_vec();
        buf.resize(input.len() + spare, 0xee);
        let max = buf.len();
        let outcome = insert(&mut buf, &parsed, CLIENT, max);
        (buf, outcome)
    }

    fn tcp_options(frame: &[u8]) -> Vec<u8> {
        let parsed = classify(frame).unwrap();
        let segment = tcp::Packet::new_checked(&frame[parsed.l4..parsed.ip_end()]).unwrap();
        segment.options().to_vec()
    }

    /// Both checksums recomputed from scratch, on a copy.
    fn recomputed(frame: &[u8]) -> Vec<u8> {
        let parsed = classify(frame).unwrap();
        let mut copy = frame.to_vec();
        let mut ip = ipv4::Packet::new_checked(&mut copy[parsed.l3..parsed.ip_end()]).unwrap();
        ip.fill_checksum();
        let (src, dst) = (ip.src_addr(), ip.dst_addr());
        tcp::Packet::new_unchecked(ip.payload_mut()).fill_checksum(src, dst);
        copy
    }

    #[test]
    fn insert_matches_scapy() {
        let cases: [(&[u8], &[u8]); 4] = [
            (&ACK_TS, &ACK_TS_TOA),
            (&ACK_PLAIN, &ACK_PLAIN_TOA),
            (&DATA_VLAN, &DATA_VLAN_TOA),
            (&FULL_52, &FULL_52_TOA),
        ];
        for (input, expected) in cases {
            let (buf, outcome) = insert_into(input, 8);
            assert_eq!(
                outcome,
                Ok(InsertOutcome::Inserted {
                    new_len: expected.len()
                })
            );
            assert_eq!(&buf[..expected.len()], expected);
            assert_eq!(find(&tcp_options(&buf[..expected.len()])), Some(CLIENT));
        }
        // The reserved bits and AE (ACK_PLAIN has AE set) survive the new data offset.
        assert_eq!(ACK_PLAIN[46] & 0x0f, 0x01);
        assert_eq!(ACK_PLAIN_TOA[46], 0x71);
        // The options area is full at 60 bytes.
        assert_eq!(tcp_options(&FULL_52_TOA).len(), 40);
    }

    #[test]
    fn no_room_leaves_the_frame_alone() {
        // A 56-byte TCP header has no 8 bytes left.
        let (buf, outcome) = insert_into(&FULL_56, 64);
        assert_eq!(outcome, Ok(InsertOutcome::NoRoom));
        assert_eq!(&buf[..FULL_56.len()], &FULL_56);
        // Not enough buffer: the slice itself, or the limit the caller passes.
        let parsed = classify(&ACK_TS).unwrap();
        let mut buf = ACK_TS;
        assert_eq!(
            insert(&mut buf, &parsed, CLIENT, usize::MAX),
            Ok(InsertOutcome::NoRoom)
        );
        assert_eq!(buf, ACK_TS);
        let mut buf = [0u8; 80];
        buf[..ACK_TS.len()].copy_from_slice(&ACK_TS);
        let limit = ACK_TS.len() + TOA_LEN;
        assert_eq!(
            insert(&mut buf, &parsed, CLIENT, limit - 1),
            Ok(InsertOutcome::NoRoom)
        );
        assert_eq!(&buf[..ACK_TS.len()], &ACK_TS);
        assert_eq!(
            insert(&mut buf, &parsed, CLIENT, limit),
            Ok(InsertOutcome::Inserted { new_len: limit })
        );
        assert_eq!(&buf[..limit], &ACK_TS_TOA);
        // Ethernet padding is not part of the packet: a padded 60-byte frame of 54
        // bytes needs 62, not 68.
        let (buf, outcome) = insert_into(&ACK_PLAIN, 2);
        assert_eq!(outcome, Ok(InsertOutcome::Inserted { new_len: 62 }));
        assert_eq!(&buf[..62], &ACK_PLAIN_TOA);
    }

    #[test]
    fn a_forged_option_is_replaced_in_place() {
        // The client's own kind-254 option sits after a NOP: an odd offset.
        assert_eq!(
            find(&tcp_options(&FORGED)),
            Some((Ipv4Addr::new(1, 2, 3, 4), 1))
        );
        let (buf, outcome) = insert_into(&FORGED, 8);
        assert_eq!(outcome, Ok(InsertOutcome::Replaced));
        assert_eq!(&buf[..FORGED.len()], &FORGED_FIXED);
        assert_eq!(find(&tcp_options(&FORGED_FIXED)), Some(CLIENT));
        // Even with no room for another option.
        let parsed = classify(&FORGED).unwrap();
        let mut buf = FORGED;
        assert_eq!(
            insert(&mut buf, &parsed, CLIENT, FORGED.len()),
            Ok(InsertOutcome::Replaced)
        );
        assert_eq!(buf, FORGED_FIXED);
    }

    #[test]
    fn clamp_mss_matches_scapy() {
        let parsed = classify(&SYN_ACK_ODD_MSS).unwrap();
        let mut buf = SYN_ACK_ODD_MSS;
        assert_eq!(
            clamp_mss(&mut buf, &parsed, TOA_LEN as u16),
            Ok(MssOutcome::Clamped {
                from: 1460,
                to: 1452
            })
        );
        assert_eq!(buf, SYN_ACK_ODD_MSS_1452);

        let parsed = classify(&TCP_SYN).unwrap();
        let mut buf = TCP_SYN;
        assert_eq!(
            clamp_mss(&mut buf, &parsed, 8),
            Ok(MssOutcome::Clamped {
                from: 1460,
                to: 1452
            })
        );
        assert_eq!(buf, TCP_SYN_1452);
    }

    #[test]
    fn clamp_mss_floor_and_other_segments() {
        let parsed = classify(&TCP_SYN).unwrap();
        let mut buf = TCP_SYN;
        assert_eq!(
            clamp_mss(&mut buf, &parsed, 5000),
            Ok(MssOutcome::Clamped {
                from: 1460,
                to: MIN_MSS
            })
        );
        assert_eq!(recomputed(&buf), buf);
        // Already under the floor: left as it is.
        let mut syn = [0u8; 24];
        syn[12] = 0x60;
        syn[13] = TcpFlags::SYN.0;
        syn[20..].copy_from_slice(&[2, 4, 0, 60]);
        let original = frame(IpProtocol::TCP, CLIENT.0, CLIENT.0, &syn, true);
        let parsed = classify(&original).unwrap();
        let mut buf = original.clone();
        assert_eq!(
            clamp_mss(&mut buf, &parsed, 8),
            Ok(MssOutcome::Clamped { from: 60, to: 60 })
        );
        assert_eq!(buf, original);
        // A SYN without MSS, and a segment that is no SYN.
        syn[20..].copy_from_slice(&[1, 1, 1, 0]);
        let mut buf = frame(IpProtocol::TCP, CLIENT.0, CLIENT.0, &syn, true);
        let parsed = classify(&buf).unwrap();
        assert_eq!(clamp_mss(&mut buf, &parsed, 8), Ok(MssOutcome::NoMssOption));
        let parsed = classify(&ACK_TS).unwrap();
        let mut buf = ACK_TS;
        assert_eq!(clamp_mss(&mut buf, &parsed, 8), Ok(MssOutcome::NotSyn));
        assert_eq!(buf, ACK_TS);
    }

    #[test]
    fn encode_and_find() {
        let option = encode(CLIENT);
        assert_eq!(option, [254, 8, 0x9c, 0x40, 198, 51, 100, 10]);
        assert_eq!(find(&option), Some(CLIENT));
        // Kind 254 of another length (an RFC 6994 experiment) is not TOA.
        assert_eq!(find(&[254, 4, 0xab, 0xcd, 1, 1, 1, 1]), None);
        assert_eq!(
            find(&[254, 4, 0xab, 0xcd, 254, 8, 0, 1, 10, 0, 0, 1]),
            Some((Ipv4Addr::new(10, 0, 0, 1), 1))
        );
        // Nothing after End of Option List, nothing after a malformed option.
        let mut after_eol = vec![0u8, 0, 0, 0];
        after_eol.extend_from_slice(&option);
        assert_eq!(find(&after_eol), None);
        assert_eq!(find(&[2, 9, 0, 0, 254, 8, 0, 1, 10, 0, 0, 1]), None);
        assert_eq!(find(&[]), None);
    }

    #[test]
    fn errors_leave_the_frame_alone() {
        let parsed = classify(&UDP_DNS).unwrap();
        let mut buf = [0u8; 100];
        buf[..UDP_DNS.len()].copy_from_slice(&UDP_DNS);
        assert_eq!(
            insert(&mut buf, &parsed, CLIENT, 100),
            Err(DropReason::UnsupportedProtocol)
        );
        assert_eq!(
            clamp_mss(&mut buf, &parsed, 8),
            Err(DropReason::UnsupportedProtocol)
        );
        assert_eq!(&buf[..UDP_DNS.len()], &UDP_DNS);
        // A TCP Parsed over a UDP frame.
        let mut mismatched = parsed;
        mismatched.kind = classify(&TCP_SYN).unwrap().kind;
        assert_eq!(
            insert(&mut buf, &mismatched, CLIENT, 100),
            Err(DropReason::UnsupportedProtocol)
        );
        let parsed = classify(&TCP_DATA_VLAN).unwrap();
        let mut short = TCP_DATA_VLAN;
        assert_eq!(
            insert(&mut short[..60], &parsed, CLIENT, 100),
            Err(DropReason::Truncated)
        );
        let mut bad = TCP_DATA_VLAN;
        bad[parsed.l4 + 12] = 0xf0; // data offset past the segment
        assert_eq!(
            insert(&mut bad, &parsed, CLIENT, 100),
            Err(DropReason::BadTcpHeader)
        );
        assert_eq!(
            clamp_mss(&mut bad, &parsed, 8),
            Err(DropReason::BadTcpHeader)
        );
    }

    /// Random segments (header 20..=60 bytes of random options, random payload of odd
    /// and even lengths): the incremental checksums equal a full recompute, the option
    /// is found first, and every other byte is where it should be.
    #[test]
    fn property_insert_equals_recompute() {
        let mut rng = XorShift(0x70a0_70a0_1357_9bdf);
        let mut l4 = vec![0u8; 1460];
        let (mut inserted, mut replaced, mut no_room) = (0, 0, 0);
        for round in 0..5000 {
            let header_len = 20 + 4 * rng.below(11);
            let len = header_len + rng.below(1400);
            rng.fill(&mut l4[..len]);
            l4[12] = ((header_len / 4) as u8) << 4 | (l4[12] & 0x0f);
            match rng.below(3) {
                0 => {}                          // random bytes, often malformed options
                1 => l4[20..header_len].fill(1), // NOPs: well formed
                _ if header_len >= 28 => {
                    // A forged TOA somewhere among NOPs.
                    l4[20..header_len].fill(1);
                    let at = 20 + rng.below(header_len - 27);
                    l4[at..at + 2].copy_from_slice(&[TOA_KIND, TOA_LEN as u8]);
                }
                _ => {}
            }
            let src = rng.host_v4();
            let dst = Ipv4Addr::from(rng.next_u64() as u32);
            let client = (Ipv4Addr::from(rng.next_u64() as u32), rng.next_u64() as u16);
            let original = frame(IpProtocol::TCP, src, dst, &l4[..len], true);
            let parsed = classify(&original).unwrap();
            let mut buf = original.clone();
            buf.resize(original.len() + 8, 0);
            let max = buf.len();
            match insert(&mut buf, &parsed, client, max).unwrap() {
                InsertOutcome::Inserted { new_len } => {
                    inserted += 1;
                    assert_eq!(new_len, original.len() + 8);
                    let buf = &buf[..new_len];
                    assert_eq!(recomputed(buf), buf, "round {round}");
                    assert!(ip_checksum_ok(buf, 14));
                    assert_eq!(&buf[54..62], &encode(client));
                    assert_eq!(find(&tcp_options(buf)), Some(client));
                    // Only the IPv4 length and checksum, the data offset and the TCP
                    // checksum change in the headers; the rest moves by 8, with any
                    // kind-254 option of the client's made NOPs.
                    let mut cleaned = original.clone();
                    remove_forged_from_segment(&mut cleaned[34..]);
                    assert_eq!(buf[..16], original[..16]);
                    assert_eq!(buf[18..24], original[18..24]);
                    assert_eq!(buf[26..46], original[26..46]);
                    assert_eq!(buf[46] >> 4, (original[46] >> 4) + 2);
                    assert_eq!(buf[46] & 0x0f, original[46] & 0x0f);
                    assert_eq!(buf[47..50], original[47..50]);
                    assert_eq!(buf[52..54], original[52..54]);
                    assert_eq!(buf[62..], cleaned[54..]);
                }
                InsertOutcome::Replaced => {
                    replaced += 1;
                    let buf = &buf[..original.len()];
                    assert_eq!(recomputed(buf), buf, "round {round}");
                    assert_eq!(find(&tcp_options(buf)), Some(client));
                }
                InsertOutcome::NoRoom => {
                    no_room += 1;
                    assert!(header_len > 52);
                    assert_eq!(&buf[..original.len()], &original[..]);
                }
            }
        }
        assert!(
            inserted > 2000 && replaced > 500 && no_room > 0,
            "{inserted} {replaced} {no_room}"
        );
    }

    /// SYNs with the MSS at every alignment: incremental equals recompute.
    #[test]
    fn property_clamp_equals_recompute() {
        let mut rng = XorShift(0x55aa_1234_dead_beef);
        for round in 0..5000 {
            let header_len = 24 + 4 * rng.below(10);
            let mut l4 = vec![0u8; header_len + rng.below(64)];
            rng.fill(&mut l4);
            l4[12] = ((header_len / 4) as u8) << 4;
            l4[13] |= TcpFlags::SYN.0;
            l4[20..header_len].fill(1);
            let at = 20 + rng.below(header_len - 23);
            let mss = rng.next_u64() as u16;
            l4[at..at + 4].copy_from_slice(&[2, 4, (mss >> 8) as u8, mss as u8]);
            let original = frame(IpProtocol::TCP, CLIENT.0, CLIENT.0, &l4, true);
            let parsed = classify(&original).unwrap();
            let mut buf = original.clone();
            let reduce_by = rng.below(2000) as u16;
            let expected = mss.saturating_sub(reduce_by).max(MIN_MSS.min(mss));
            assert_eq!(
                clamp_mss(&mut buf, &parsed, reduce_by),
                Ok(MssOutcome::Clamped {
                    from: mss,
                    to: expected
                })
            );
            assert_eq!(recomputed(&buf), buf, "round {round}, MSS at {at}");
            let segment = tcp::Packet::new_checked(&buf[34..]).unwrap();
            assert_eq!(segment.max_segment_size(), Some(expected));
        }
    }

    #[test]
    fn fuzz_never_panics() {
        let mut rng = XorShift(0x1dea_5eed_0bad_c0de);
        let fixtures: [&[u8]; 7] = [
            &ACK_TS,
            &ACK_PLAIN,
            &DATA_VLAN,
            &FULL_56,
            &FORGED,
            &SYN_ACK_ODD_MSS,
            &TCP_SYN,
        ];
        let mut buf = [0u8; 160];
        let mut reached = 0;
        for round in 0..100_000 {
            let fixture = fixtures[rng.below(fixtures.len())];
            let parsed = if round % 2 == 0 {
                classify(fixture).unwrap()
            } else {
                random_parsed(&mut rng, buf.len())
            };
            let len = rng.below(buf.len() + 1);
            if rng.below(3) == 0 {
                rng.fill(&mut buf[..len]);
            } else {
                let n = fixture.len().min(len);
                buf[..n].copy_from_slice(&fixture[..n]);
                if len > 0 && rng.below(2) == 0 {
                    buf[rng.below(len)] ^= rng.next_u64() as u8;
                }
            }
            let max = match rng.below(3) {
                0 => usize::MAX,
                1 => rng.below(buf.len() + 16),
                _ => len,
            };
            let client = (Ipv4Addr::from(rng.next_u64() as u32), rng.next_u64() as u16);
            if rng.below(2) == 0 {
                if let Ok(InsertOutcome::Inserted { new_len }) =
                    insert(&mut buf[..len], &parsed, client, max)
                {
                    assert!(new_len <= len.min(max));
                    reached += 1;
                }
            } else if clamp_mss(&mut buf[..len], &parsed, rng.next_u64() as u16).is_ok() {
                reached += 1;
            }
        }
        assert!(reached > 5000, "the fuzz reaches the rewrites: {reached}");
    }

    /// ACK_PLAIN with `options` (a multiple of 4 bytes) and both checksums made.
    fn ack_with_options(options: &[u8]) -> Vec<u8> {
        assert_eq!(options.len() % 4, 0);
        let mut frame = ACK_PLAIN[..54].to_vec();
        frame.extend_from_slice(options);
        frame[16..18].copy_from_slice(&((40 + options.len()) as u16).to_be_bytes());
        frame[46] = (((20 + options.len()) / 4) as u8) << 4;
        let mut ip = ipv4::Packet::new_unchecked(&mut frame[14..]);
        ip.fill_checksum();
        let (src, dst) = (ip.src_addr(), ip.dst_addr());
        tcp::Packet::new_unchecked(ip.payload_mut()).fill_checksum(src, dst);
        frame
    }

    /// A forged option behind one malformed for its kind (an MSS of length 3, which
    /// Linux ignores on an ACK) in a full options area: Sluice's parser stops at the
    /// MSS, the module steps over it and would read the forgery. It holds the client
    /// now, with the checksum right.
    #[test]
    fn a_forged_option_behind_a_malformed_one_is_replaced() {
        let mut options = vec![2, 3, 0, TOA_KIND, 8, 0x9c, 0x40, 1, 2, 3, 4];
        options.resize(40, 1);
        let frame = ack_with_options(&options);
        assert_eq!(
            find(&tcp_options(&frame)),
            Some((Ipv4Addr::new(1, 2, 3, 4), 40000))
        );
        let (buf, outcome) = insert_into(&frame, 64);
        assert_eq!(outcome, Ok(InsertOutcome::Replaced));
        let out = &buf[..frame.len()];
        assert_eq!(find(&tcp_options(out)), Some(CLIENT));
        assert_eq!(out, &recomputed(out)[..]);
    }

    /// Kind-254 options of other lengths (DPVS's module takes 20, an IPv6 client)
    /// become NOPs: with room, ours goes first; without, ours goes where eight of
    /// those NOPs are, and where there are not eight in a row, none is left.
    #[test]
    fn other_kind_254_options_become_nops() {
        let mut options = vec![TOA_KIND, 20];
        options.extend_from_slice(&[0xab; 18]);
        options.extend_from_slice(&[1, 1, 1, 1]);
        let frame = ack_with_options(&options);
        let (buf, outcome) = insert_into(&frame, 64);
        let Ok(InsertOutcome::Inserted { new_len }) = outcome else {
            panic!("{outcome:?}");
        };
        let out = &buf[..new_len];
        let read = tcp_options(out);
        assert_eq!(read[..TOA_LEN], encode(CLIENT));
        assert_eq!(read[TOA_LEN..], [1; 24]);
        assert_eq!(out, &recomputed(out)[..]);
        // No room: ours where the 20-byte one was, the rest NOPs.
        let mut full = options.clone();
        full.resize(40, 1);
        full[24..].copy_from_slice(&[TOA_KIND, 16, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        let frame = ack_with_options(&full);
        let (buf, outcome) = insert_into(&frame, 64);
        assert_eq!(outcome, Ok(InsertOutcome::Replaced));
        let out = &buf[..frame.len()];
        let mut want = encode(CLIENT).to_vec();
        want.resize(40, 1);
        assert_eq!(tcp_options(out), want);
        assert_eq!(find(&tcp_options(out)), Some(CLIENT));
        assert_eq!(out, &recomputed(out)[..]);
        // No room and never eight NOPs in a row (two 4-byte options with timestamps
        // between): none left.
        let mut split = vec![TOA_KIND, 4, 0, 0, 8, 10];
        split.extend_from_slice(&[0; 8]);
        split.extend_from_slice(&[TOA_KIND, 4, 0, 0]);
        split.resize(40, 0x22);
        split[18..].copy_from_slice(&[
            0x22, 22, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
        ]);
        let frame = ack_with_options(&split);
        let (buf, outcome) = insert_into(&frame, 64);
        assert_eq!(outcome, Ok(InsertOutcome::NoRoom));
        let out = &buf[..frame.len()];
        let read = tcp_options(out);
        assert_eq!(read[..4], [1; 4]);
        assert_eq!(read[14..18], [1; 4]);
        assert_eq!(find(&read), None);
        assert_eq!(out, &recomputed(out)[..]);
    }

    #[test]
    fn a_run_of_nops_is_found_where_the_module_walks() {
        assert_eq!(nop_run(&[1; 8], 8), Some(0));
        // Timestamps whose value bytes are all 1 (not NOPs: inside an option), then 8 NOPs.
        let mut opts = vec![1, 1, 1, 8, 10];
        opts.extend_from_slice(&[1; 16]);
        assert_eq!(nop_run(&opts, 8), Some(13));
        // A NOP byte inside another option's data is not an option.
        let mut opts = vec![2, 12];
        opts.extend_from_slice(&[1; 10]);
        opts.extend_from_slice(&[1; 7]);
        assert_eq!(nop_run(&opts, 8), None);
        // End of Option List ends the walk; a bad length too.
        assert_eq!(nop_run(&[1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1], 8), None);
        assert_eq!(nop_run(&[1, 5, 1, 1, 1, 1, 1, 1, 1, 1], 8), None);
    }

    /// A later segment's forged option is removed (at an odd offset too), and a
    /// segment without one is left alone.
    #[test]
    fn remove_forged_leaves_only_nops_where_a_forgery_was() {
        let options = [1, TOA_KIND, 8, 0x9c, 0x40, 1, 2, 3, 4, 1, 1, 1];
        let frame = ack_with_options(&options);
        let mut out = frame.clone();
        let parsed = classify(&frame).unwrap();
        assert_eq!(remove_forged(&mut out, &parsed), Ok(1));
        assert_eq!(tcp_options(&out), vec![1; 12]);
        assert_eq!(out, recomputed(&out));
        assert_eq!(remove_forged(&mut out, &parsed), Ok(0));
        let mut plain = ACK_TS;
        let parsed = classify(&plain).unwrap();
        assert_eq!(remove_forged(&mut plain, &parsed), Ok(0));
        assert_eq!(plain, ACK_TS);
        // A SYN keeps its kind-254 options (RFC 6994 experiments): the module reads
        // ACKs only.
        let mut syn = frame.clone();
        syn[47] = 0x02;
        let mut out = syn.clone();
        assert_eq!(remove_forged(&mut out, &classify(&syn).unwrap()), Ok(0));
        assert_eq!(out, syn);
    }

    /// The quick test says yes whenever the full walk finds a kind-254 option.
    #[test]
    fn the_quick_test_never_misses_what_the_walk_finds() {
        let mut rng = XorShift(0x2545_f491_4f6c_dd1d);
        let mut next = || rng.next_u64();
        let mut found = 0;
        for _ in 0..200_000 {
            let len = (next() % 41) as usize;
            // Bytes drawn mostly from the kinds and lengths that matter.
            let options: Vec<u8> = (0..len)
                .map(|_| match next() % 6 {
                    0 => 0,
                    1 => 1,
                    2 => TOA_KIND,
                    3 => (next() % 12) as u8,
                    _ => next() as u8,
                })
                .collect();
            if kind_254_options(&options).next().is_some() {
                found += 1;
                assert!(has_kind_254(&options), "{options:?}");
            }
        }
        assert!(found > 1000, "{found}");
    }
}
