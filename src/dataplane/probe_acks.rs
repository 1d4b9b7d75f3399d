//! What the answer to a health probe acknowledges, per probe source port: the workers'
//! check that TCP to the probes' ports answers the probe sent from that port before it
//! takes room on the ring the probes' answers share.
//!
//! The workers already keep TCP to the probe ports from anyone but a real server off
//! that ring (`not_a_peer`). A sender that forges a real server's address got past that
//! check, and a flood of such segments could fill the ring and crowd out the real
//! answers: every probe would time out and health checking would evict every real
//! server. The probe's initial sequence number is a keyed hash nobody outside can work
//! out (`health`), and a real answer acknowledges it (plus at most the probe's
//! request), so the management core writes each probe's ISN here before its SYN goes
//! out, and a worker hands a segment up only if it acknowledges a number in that span.
//! A forger then has to guess one of [`ProbeAcks::SPAN`] numbers out of 2^32 with
//! each segment, and the ring stays free for the answers.
//!
//! What this costs an answer that is real: a segment without ACK is never one a probe
//! can use (a SYN-ACK and the reset that refuses a SYN both carry it), and a reset sent
//! without ACK, to a segment of a connection the server forgot, is dropped here; its
//! probe times out instead, the same failure, later. A late answer to an earlier probe
//! from the same port is dropped here too, where the management core would have
//! counted it as stray.
//!
//! One atomic word per port, written by the management core and read by any worker:
//! the store happens before the SYN is handed to a worker, so before any answer can
//! exist.
use std::ops::RangeInclusive;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::wire::tcp::TcpFlags;

/// Each probe source port's last ISN: bit 32 set once a probe went out from it.
#[derive(Debug)]
pub struct ProbeAcks {
    first: u16,
    isns: Box<[AtomicU64]>,
}

const SENT: u64 = 1 << 32;

impl ProbeAcks {
    /// How far past its ISN an answer may acknowledge: the SYN, then a request of at
    /// most this many bytes less one (a probe's frames are at most 512 bytes,
    /// `health::probe::MAX_FRAME_LEN`, checked where it is defined).
    pub const SPAN: u32 = 512;

    /// No probe sent yet from any of `ports`.
    pub fn new(ports: RangeInclusive<u16>) -> ProbeAcks {
        let count = ports.clone().count();
        ProbeAcks {
            first: *ports.start(),
            isns: (0..count).map(|_| AtomicU64::new(0)).collect(),
        }
    }

    /// The probe source ports.
    pub fn ports(&self) -> RangeInclusive<u16> {
        let last = usize::from(self.first) + self.isns.len().max(1) - 1;
        self.first..=last as u16
    }

    pub fn contains(&self, port: u16) -> bool {
        self.slot(port).is_some()
    }

    fn slot(&self, port: u16) -> Option<&AtomicU64> {
        self.isns.get(usize::from(port.checked_sub(self.first)?))
    }

    /// A probe with initial sequence number `isn` goes out from `port` (ports outside
    /// the range are ignored: no answer to them is handed up anyway).
    pub fn sent(&self, port: u16, isn: u32) {
        if let Some(slot) = self.slot(port) {
            slot.store(SENT | u64::from(isn), Ordering::Release);
        }
    }

    /// Whether a segment to `port` with `flags` and acknowledgement number `ack` can
    /// be an answer to the last probe sent from that port.
    pub fn answers(&self, port: u16, flags: TcpFlags, ack: u32) -> bool {
        let Some(slot) = self.slot(port) else {
            return false;
        };
        let word = slot.load(Ordering::Acquire);
        let isn = word as u32;
        word & SENT != 0
            && flags.contains(TcpFlags::ACK)
            && ack.wrapping_sub(isn).wrapping_sub(1) < Self::SPAN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_what_the_last_probe_from_the_port_can_be_answered_by_passes() {
        let acks = ProbeAcks::new(61000..=61009);
        assert_eq!(acks.ports(), 61000..=61009);
        let ack = TcpFlags::ACK;
        let syn_ack = TcpFlags::SYN | TcpFlags::ACK;
        assert!(!acks.answers(61000, syn_ack, 1), "no probe sent yet");
        // An ISN near the top: the span wraps.
        let isn = u32::MAX - 10;
        acks.sent(61000, isn);
        assert!(acks.answers(61000, syn_ack, isn.wrapping_add(1)));
        assert!(acks.answers(61000, TcpFlags::RST | ack, isn.wrapping_add(1)));
        assert!(acks.answers(61000, ack, isn.wrapping_add(ProbeAcks::SPAN)));
        for wrong in [
            isn,
            isn.wrapping_add(ProbeAcks::SPAN + 1),
            isn ^ 0x8000_0000,
        ] {
            assert!(!acks.answers(61000, syn_ack, wrong), "ack {wrong}");
        }
        assert!(
            !acks.answers(61000, TcpFlags::RST, isn.wrapping_add(1)),
            "no ACK"
        );
        assert!(
            !acks.answers(61001, syn_ack, isn.wrapping_add(1)),
            "another port"
        );
        assert!(
            !acks.answers(60999, syn_ack, isn.wrapping_add(1)),
            "below the range"
        );
        assert!(
            !acks.answers(61010, syn_ack, isn.wrapping_add(1)),
            "above the range"
        );
        // The next probe from the port: the last one's answers no longer pass.
        acks.sent(61000, 5);
        assert!(!acks.answers(61000, syn_ack, isn.wrapping_add(1)));
        assert!(acks.answers(61000, syn_ack, 6));
        // Outside the range: ignored.
        acks.sent(7, 1);
        assert!(!acks.contains(7));
    }

    #[test]
    fn the_whole_port_range_fits() {
        let acks = ProbeAcks::new(0..=65535);
        assert_eq!(acks.ports(), 0..=65535);
        acks.sent(65535, 0);
        assert!(acks.answers(65535, TcpFlags::ACK, 1));
    }
}
