//! FullNAT TCP timestamps moved onto Sluice's clock, so that a real server accepts a
//! local port that comes round again while it still holds the previous connection on
//! it in TIME-WAIT.
//!
//! # The problem
//!
//! Towards a real server, a FullNAT session is `LIP:lport -> RIP:rport`. The server
//! closes first (HTTP with `Connection: close`, for instance) and keeps that tuple in
//! TIME-WAIT for 60 s (Linux). A worker with one local address reuses each port after
//! `ports / rate` seconds (64 512 ports at 20 000 new connections per second: about
//! 3 s), so the next session on the port usually finds the tuple in TIME-WAIT. Linux
//! then accepts the new SYN only if it is provably newer than the old connection
//! (RFC 6191; `tcp_timewait_state_process`): with timestamps on (the default), when
//! its TSval is greater than the last one the server saw on the tuple. But the two
//! connections came from different clients, or from one client whose clock the server
//! never saw on this tuple: their TSvals are unrelated, and about half of the reuses
//! are dropped as stale duplicates (`TcpExtPAWSTimewait`); the client waits a second
//! for its SYN retransmission, and connection rates collapse.
//!
//! # The fix: one clock per tuple that only moves forward
//!
//! Each FullNAT TCP session whose SYN carries timestamps gets an offset, chosen on the
//! SYN: `offset = clock_ms - client_tsval`, where `clock_ms` is Sluice's timestamp
//! clock (wall-clock milliseconds, advanced by the TSC; the same on every worker and,
//! with NTP, on the standby). Client-to-server segments then carry `TSval + offset`,
//! and server-to-client segments `TSecr - offset`, so the client sees its own values
//! echoed and the server sees a clock that started at `clock_ms` on the SYN and
//! advances at the client's rate. RFC 7323 bounds that rate at one tick per
//! millisecond, so a session's last TSval is at most `clock_ms` at its end. The next
//! session on the port opens later, with a TSval of `clock_ms` then: newer, whichever
//! client it comes from, so the server accepts it. Sequence numbers are untouched.
//!
//! What it does not cover, said in docs/CONFIG.md: clients that send no timestamps
//! (the server then compares sequence numbers, which Sluice does not rewrite, and a
//! reuse within TIME-WAIT succeeds about half the time; [`crate::forward::laddr`]
//! counts such reuses), and clients whose timestamp clock runs faster than 1 kHz
//! (outside RFC 7323; Linux's optional microsecond timestamps).
//!
//! # Decisions
//!
//! | segment | what changes |
//! |---|---|
//! | no timestamps option, or a malformed options area | nothing ([`ShiftOutcome::NoTimestamps`]) |
//! | client -> real server | `TSval + offset` |
//! | real server -> client | `TSecr - offset` |
//! | offset 0 (no timestamps on the SYN, or rewriting off) | nothing: the caller skips the call |
//!
//! The TCP checksum is updated incrementally (RFC 1624), so a wrong checksum stays
//! wrong by the same amount.
use crate::flow::parse::Parsed;
use crate::model::DropReason;
use crate::wire::tcp::{self, Options, TcpOption};
use crate::wire::{read_u32, write_u32};

/// Offset of the TSval in a TCP options area, if the area holds a timestamps option
/// (the first one; its TSecr follows at +4). Segments after the SYN almost always
/// start with the RFC 7323 appendix A layout (NOP, NOP, kind 8, length 10), checked
/// first; anything else is walked. A malformed area has none.
#[inline]
pub fn tsval_offset(options: &[u8]) -> Option<usize> {
    if options.len() >= 12 && options[..4] == [1, 1, 8, 10] {
        return Some(4);
    }
    let mut at = 0;
    for option in Options::new(options) {
        match option {
            Ok(TcpOption::Timestamps { .. }) => return Some(at + 2),
            Ok(option) => at += option.buffer_len(),
            Err(_) => return None,
        }
    }
    None
}

/// Sluice's timestamp clock: milliseconds of wall-clock time (so that the standby's
/// clock agrees with the active's, within NTP's accuracy), truncated to 32 bits and
/// advanced from the TSC, so reading it costs no system call.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    tsc_per_ms: u64,
    /// Wall-clock milliseconds at TSC 0.
    base_ms: u64,
    now_ms: u32,
}

impl Clock {
    /// A clock reading `wall_ms` (milliseconds since the Unix epoch) at `now_tsc`, for
    /// a TSC running at `tsc_hz`.
    pub fn new(tsc_hz: u64, now_tsc: u64, wall_ms: u64) -> Clock {
        let tsc_per_ms = (tsc_hz / 1000).max(1);
        let base_ms = wall_ms.wrapping_sub(now_tsc / tsc_per_ms);
        Clock {
            tsc_per_ms,
            base_ms,
            now_ms: base_ms.wrapping_add(now_tsc / tsc_per_ms) as u32,
        }
    }

    /// Moves the clock to `now_tsc` (once per poll).
    #[inline]
    pub fn advance(&mut self, now_tsc: u64) {
        self.now_ms = self.base_ms.wrapping_add(now_tsc / self.tsc_per_ms) as u32;
    }

    /// Milliseconds, modulo 2^32.
    #[inline]
    pub fn now_ms(&self) -> u32 {
        self.now_ms
    }
}

/// What [`shift`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ShiftOutcome {
    /// No timestamps option (or a malformed options area): the segment is unchanged.
    NoTimestamps,
    /// The option's values as they came, before the shift.
    Shifted { tsval: u32, tsecr: u32 },
}

/// The TSval of the TCP segment `parsed` describes, if it carries timestamps.
pub fn tsval(frame: &[u8], parsed: &Parsed) -> Option<u32> {
    let segment = super::tcp_segment(frame, parsed).ok()?;
    let options = frame.get(segment.l4 + tcp::MIN_HEADER_LEN..segment.l4 + segment.header_len)?;
    tsval_offset(options).map(|at| read_u32(options, at))
}

/// Adds `tsval_add` to the segment's TSval and subtracts `tsecr_sub` from its TSecr
/// (both modulo 2^32), in place, with the TCP checksum updated. Errors, with the frame
/// unchanged, as [`crate::forward::toa::insert`]'s.
#[inline]
pub fn shift(
    frame: &mut [u8],
    parsed: &Parsed,
    tsval_add: u32,
    tsecr_sub: u32,
) -> Result<ShiftOutcome, DropReason> {
    let super::TcpSegment {
        l4,
        ip_end,
        header_len,
    } = super::tcp_segment(frame, parsed)?;
    let segment = &mut frame[l4..ip_end];
    let Some(at) = tsval_offset(&segment[tcp::MIN_HEADER_LEN..header_len]) else {
        return Ok(ShiftOutcome::NoTimestamps);
    };
    let at = tcp::MIN_HEADER_LEN + at;
    let (tsval, tsecr) = (read_u32(segment, at), read_u32(segment, at + 4));
    let (new_tsval, new_tsecr) = (tsval.wrapping_add(tsval_add), tsecr.wrapping_sub(tsecr_sub));
    if at.is_multiple_of(2) {
        // The common layouts: both values are whole 16-bit words of the checksum.
        write_u32(segment, at, new_tsval);
        write_u32(segment, at + 4, new_tsecr);
        let mut tcp = tcp::Packet::new_unchecked(segment);
        tcp.update_checksum32(tsval, new_tsval);
        tcp.update_checksum32(tsecr, new_tsecr);
    } else {
        let mut new = [0u8; 8];
        write_u32(&mut new, 0, new_tsval);
        write_u32(&mut new, 4, new_tsecr);
        super::replace_tcp_bytes(segment, at, &new);
    }
    Ok(ShiftOutcome::Shifted { tsval, tsecr })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::parse::classify;
    use crate::forward::test_util::frame;
    use crate::wire::test_util::XorShift;
    use crate::wire::IpProtocol;
    use std::net::Ipv4Addr;

    const CLIENT: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 7);
    const SERVER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 11);

    /// A TCP header (seq, ack, flags) with `options` (a multiple of 4 bytes) and
    /// `payload`, checksum left for `frame`.
    fn segment(options: &[u8], flags: u8, payload: &[u8]) -> Vec<u8> {
        assert_eq!(options.len() % 4, 0);
        let mut l4 = vec![0u8; 20];
        l4[0..2].copy_from_slice(&40000u16.to_be_bytes());
        l4[2..4].copy_from_slice(&80u16.to_be_bytes());
        l4[4..8].copy_from_slice(&0x1a2b_3c4du32.to_be_bytes());
        l4[8..12].copy_from_slice(&0x0102_0304u32.to_be_bytes());
        l4[12] = (((20 + options.len()) / 4) as u8) << 4;
        l4[13] = flags;
        l4[14..16].copy_from_slice(&502u16.to_be_bytes());
        l4.extend_from_slice(options);
        l4.extend_from_slice(payload);
        l4
    }

    /// The frame with its TCP checksum computed from scratch.
    fn recomputed(buf: &[u8]) -> Vec<u8> {
        let mut copy = buf.to_vec();
        let mut tcp = tcp::Packet::new_unchecked(&mut copy[34..]);
        tcp.fill_checksum(CLIENT, SERVER);
        copy
    }

    // Linux's SYN options: MSS 1460, SACK permitted, timestamps (TSval 0x8c1a2b3c,
    // TSecr 0), NOP, window scale 7. The timestamps option is not first.
    const SYN_OPTIONS: [u8; 20] = [
        0x02, 0x04, 0x05, 0xb4, 0x04, 0x02, 0x08, 0x0a, 0x8c, 0x1a, 0x2b, 0x3c, 0x00, 0x00, 0x00,
        0x00, 0x01, 0x03, 0x03, 0x07,
    ];
    // Every later Linux segment: NOP, NOP, timestamps (TSval 0x8c1a2b40, TSecr
    // 0x00c0ffee).
    const ACK_OPTIONS: [u8; 12] = [
        0x01, 0x01, 0x08, 0x0a, 0x8c, 0x1a, 0x2b, 0x40, 0x00, 0xc0, 0xff, 0xee,
    ];

    #[test]
    fn the_clock_reads_wall_milliseconds_advanced_by_the_tsc() {
        let hz = 2_450_000_000;
        let mut clock = Clock::new(hz, 10 * hz, 1_764_633_600_000);
        assert_eq!(clock.now_ms(), 1_764_633_600_000u64 as u32);
        clock.advance(10 * hz + hz / 1000 * 1500);
        assert_eq!(clock.now_ms(), 1_764_633_601_500u64 as u32);
        // A second clock made later agrees with the first (another worker).
        let other = Clock::new(hz, 11 * hz, 1_764_633_601_000);
        let mut first = clock;
        first.advance(11 * hz);
        assert_eq!(first.now_ms(), other.now_ms());
    }

    #[test]
    fn finds_the_timestamps_in_both_linux_layouts() {
        assert_eq!(tsval_offset(&SYN_OPTIONS), Some(8));
        assert_eq!(tsval_offset(&ACK_OPTIONS), Some(4));
        assert_eq!(tsval_offset(&[0x02, 0x04, 0x05, 0xb4]), None);
        assert_eq!(tsval_offset(&[]), None);
        // A length byte running past the area: malformed, nothing found.
        assert_eq!(tsval_offset(&[0x01, 0x01, 0x05, 0x30]), None);
        // After an End of Option List nothing counts.
        let mut after_end = [0u8; 12];
        after_end[1..11].copy_from_slice(&[0x08, 0x0a, 1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(tsval_offset(&after_end), None);
    }

    #[test]
    fn shifting_a_syn_moves_its_tsval_and_keeps_the_checksum_right() {
        let mut buf = frame(
            IpProtocol::TCP,
            CLIENT,
            SERVER,
            &segment(&SYN_OPTIONS, 0x02, &[]),
            true,
        );
        let parsed = classify(&buf).unwrap();
        assert_eq!(tsval(&buf, &parsed), Some(0x8c1a_2b3c));
        let offset = 0x1000_0000u32.wrapping_sub(0x8c1a_2b3c);
        let outcome = shift(&mut buf, &parsed, offset, 0).unwrap();
        assert_eq!(
            outcome,
            ShiftOutcome::Shifted {
                tsval: 0x8c1a_2b3c,
                tsecr: 0
            }
        );
        // TSval at TCP offset 20 + 8 (an odd-word position: after MSS and SACK-perm).
        assert_eq!(buf[34 + 28..34 + 32], 0x1000_0000u32.to_be_bytes());
        assert_eq!(buf[34 + 32..34 + 36], [0, 0, 0, 0]);
        assert_eq!(buf, recomputed(&buf));
        let tcp = tcp::Packet::new_checked(&buf[34..]).unwrap();
        assert!(tcp.verify_checksum(CLIENT, SERVER));
    }

    #[test]
    fn a_reply_gets_its_tsecr_moved_back() {
        let mut buf = frame(
            IpProtocol::TCP,
            CLIENT,
            SERVER,
            &segment(&ACK_OPTIONS, 0x18, b"HTTP/1.1 200 OK\r\n\r\n"),
            true,
        );
        let parsed = classify(&buf).unwrap();
        shift(&mut buf, &parsed, 0, 0x00c0_0000).unwrap();
        assert_eq!(
            buf[34 + 24..34 + 28],
            0x8c1a_2b40u32.to_be_bytes(),
            "TSval kept"
        );
        assert_eq!(buf[34 + 28..34 + 32], 0x0000_ffeeu32.to_be_bytes());
        assert_eq!(buf, recomputed(&buf));
    }

    #[test]
    fn segments_without_timestamps_and_other_protocols_are_left_alone() {
        let mss_only = [0x02, 0x04, 0x05, 0xb4];
        let mut buf = frame(
            IpProtocol::TCP,
            CLIENT,
            SERVER,
            &segment(&mss_only, 0x02, &[]),
            true,
        );
        let before = buf.clone();
        let parsed = classify(&buf).unwrap();
        assert_eq!(
            shift(&mut buf, &parsed, 7, 7),
            Ok(ShiftOutcome::NoTimestamps)
        );
        assert_eq!(tsval(&buf, &parsed), None);
        assert_eq!(buf, before);

        let mut udp = frame(IpProtocol::UDP, CLIENT, SERVER, &[0u8; 12], true);
        let before = udp.clone();
        let parsed = classify(&udp).unwrap();
        assert_eq!(
            shift(&mut udp, &parsed, 7, 7),
            Err(DropReason::UnsupportedProtocol)
        );
        assert_eq!(udp, before);
    }

    /// Random option layouts (timestamps anywhere, at odd positions too), random
    /// offsets, payloads of odd length: the incremental checksum equals a full
    /// recompute, and shifting back restores the original bytes.
    #[test]
    fn property_shift_equals_recompute_and_reverses() {
        let mut rng = XorShift(0x7157_a3b5);
        for _ in 0..2000 {
            let mut options = Vec::new();
            let before_ts = rng.below(4);
            for _ in 0..before_ts {
                match rng.below(3) {
                    0 => options.push(1),
                    1 => options.extend_from_slice(&[3, 3, rng.below(15) as u8]),
                    _ => options.extend_from_slice(&[4, 2]),
                }
            }
            options.extend_from_slice(&[8, 10]);
            for _ in 0..8 {
                options.push(rng.below(256) as u8);
            }
            while options.len() % 4 != 0 {
                options.push(1);
            }
            let payload: Vec<u8> = (0..rng.below(40)).map(|_| rng.below(256) as u8).collect();
            let original = frame(
                IpProtocol::TCP,
                CLIENT,
                SERVER,
                &segment(&options, 0x10, &payload),
                true,
            );
            let parsed = classify(&original).unwrap();
            let (add, sub) = (rng.next_u64() as u32, rng.next_u64() as u32);
            let mut buf = original.clone();
            let ShiftOutcome::Shifted { tsval, tsecr } =
                shift(&mut buf, &parsed, add, sub).unwrap()
            else {
                panic!("no timestamps found in {options:02x?}");
            };
            assert_eq!(buf, recomputed(&buf), "options {options:02x?}");
            let at = 34 + 20 + tsval_offset(&options).unwrap();
            assert_eq!(read_u32(&buf, at), tsval.wrapping_add(add));
            assert_eq!(read_u32(&buf, at + 4), tsecr.wrapping_sub(sub));
            shift(&mut buf, &parsed, add.wrapping_neg(), sub.wrapping_neg()).unwrap();
            assert_eq!(recomputed(&buf), recomputed(&original));
            assert_eq!(buf[..at + 8], original[..at + 8]);
        }
    }

    /// Garbage frames and `Parsed` values that disagree with them: never a panic,
    /// and an error or `NoTimestamps` leaves the frame as it was.
    #[test]
    fn fuzz_never_panics() {
        let mut rng = XorShift(0x7157_f022_0bad_5eed);
        let fixture = frame(
            IpProtocol::TCP,
            CLIENT,
            SERVER,
            &segment(&SYN_OPTIONS, 0x02, &[]),
            true,
        );
        let mut buf = [0u8; 128];
        let mut shifted = 0;
        for round in 0..100_000 {
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
            let parsed = if round % 2 == 0 {
                match classify(&buf[..len]) {
                    Ok(parsed) => parsed,
                    Err(_) => continue,
                }
            } else {
                crate::forward::test_util::random_parsed(&mut rng, len)
            };
            let before = buf;
            let _ = tsval(&buf[..len], &parsed);
            match shift(&mut buf[..len], &parsed, rng.next_u64() as u32, 7) {
                Ok(ShiftOutcome::Shifted { .. }) => shifted += 1,
                _ => assert_eq!(buf, before, "round {round}"),
            }
        }
        assert!(shifted > 1000, "only {shifted} frames reached the rewrite");
    }
}
