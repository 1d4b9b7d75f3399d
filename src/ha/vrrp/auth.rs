//! Authenticated advertisements between Sluice nodes that share a key (`[vrrp] key`):
//! the trailer of `crate::wire::vrrp::auth` sealed on the way out and checked on the
//! way in, and the replay check.
//!
//! RFC 5798 gives VRRPv3 no authentication, so without this any host on the link that
//! forges a peer's source address, or sends a captured advert again, makes this node
//! master (split brain) or backup (the virtual addresses go nowhere). keepalived does
//! not speak this; a group with keepalived in it runs with `unauthenticated = true`.
//!
//! **Replays.** Each advert carries its sender's counter: the sender's wall clock in
//! microseconds at sending, raised past the last one it sent, under the tag. The
//! receiver keeps the highest counter it accepted from each sender and takes only a
//! higher one, so a captured advert is refused once a later one was heard. Since the
//! counter is a clock, it also grows across the sender's restarts: a restart needs no
//! handshake, provided the sender's clock does not go back across it (as the session
//! sync's epoch, docs/SYNC.md).
//!
//! **After this node's own start** it has heard nobody, and any captured advert would
//! be higher than nothing. So the first advert of a sender is taken only if its counter
//! is within `max_clock_skew` of this node's own clock: a recording is good for that
//! long at most. With the peer dead, a replayer could otherwise hold a restarted node
//! in backup for as long as the recording lasts. No counter further ahead than that is
//! ever taken either, so a sender whose clock ran ahead for a while cannot leave a
//! counter behind that its corrected clock takes long to pass. The price is that the
//! nodes' clocks
//! must agree within that bound (NTP); a peer refused for it is logged with the skew
//! measured, and counted.

use std::net::Ipv4Addr;

use crate::ha::auth::{SharedKey, TAG_LEN};
use crate::wire::vrrp::{self, auth as trailer};

// The trailer holds one whole tag.
const _: () = assert!(trailer::TAG_LEN == TAG_LEN);

/// Why an advert with a valid checksum was not believed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// With a key: no trailer, or a tag that is not the advert's under the key.
    /// Without one: a trailer (the peers' configs disagree).
    BadAuth,
    /// With `accept_unsealed`: no trailer, from a sender whose sealed advert was
    /// believed this many microseconds ago, less than the hold: a sender that seals
    /// does not stop within one master-down interval, someone forging its address does.
    UnsealedFromSealer(u64),
    /// Authenticated, but its counter is this many microseconds behind the highest
    /// accepted from the same sender (0: the same): sent before, or its sender's clock
    /// went back across a restart.
    Replayed(u64),
    /// Authenticated, and its counter this many microseconds from this node's clock
    /// (positive: ahead), more than the bound: ahead, always; behind, for the first
    /// advert of a sender.
    ClockSkew(i64),
}

/// The most senders whose counters are kept. Only holders of the key get here, so
/// this bounds memory against a key holder cycling source addresses, not a real group.
const MAX_SENDERS: usize = 256;

/// The key, this node's own counter and the highest counter heard from each sender.
pub struct AdvertAuth {
    key: SharedKey,
    /// `accept_unsealed = true`: while a group switches to a key, an advert without a
    /// trailer is taken too (one with a trailer must still be right).
    accept_unsealed: bool,
    max_skew_us: u64,
    last_sent: u64,
    /// Per sender: the highest counter believed, and this node's wall clock then.
    heard: Vec<Heard>,
}

#[derive(Clone, Copy, Debug)]
struct Heard {
    sender: Ipv4Addr,
    counter: u64,
    at_us: u64,
}

impl AdvertAuth {
    pub fn new(key: SharedKey, max_clock_skew_ms: u32) -> AdvertAuth {
        AdvertAuth {
            key,
            accept_unsealed: false,
            max_skew_us: u64::from(max_clock_skew_ms) * 1000,
            last_sent: 0,
            heard: Vec::new(),
        }
    }

    /// The same, also taking adverts without a trailer when `accept` (`[vrrp]
    /// accept_unsealed`, for switching a running group to a key without a moment with
    /// two masters).
    pub fn accepting_unsealed(mut self, accept: bool) -> AdvertAuth {
        self.accept_unsealed = accept;
        self
    }

    /// Whether adverts without a trailer are taken.
    pub fn accepts_unsealed(&self) -> bool {
        self.accept_unsealed
    }

    /// The counter of an advert sent at wall-clock `now_us`: that, or one more than
    /// the last, so it never repeats or goes back while this node runs. Except when
    /// the last is more than twice the skew bound ahead of the clock (the clock ran
    /// ahead and was set back): no receiver believed a counter that far ahead of its
    /// own clock (nor one more than the bound from it, give or take the clocks'
    /// difference), so the counter falls back to the clock, which they take, instead
    /// of staying ahead where they refuse it until the clock catches up.
    pub fn next_counter(&mut self, now_us: u64) -> u64 {
        let far_ahead = now_us.saturating_add(self.max_skew_us.saturating_mul(2));
        self.last_sent = match self.last_sent > far_ahead {
            true => now_us,
            false => now_us.max(self.last_sent.saturating_add(1)),
        };
        self.last_sent
    }

    /// Seals `payload`: an advertisement already emitted (header and addresses)
    /// followed by [`trailer::TRAILER_LEN`] bytes of room, sent `src -> dst` with
    /// `counter`. Writes the trailer, then the checksum over the whole payload.
    pub fn seal(&self, payload: &mut [u8], src: Ipv4Addr, dst: Ipv4Addr, counter: u64) {
        let at = payload.len() - trailer::TRAILER_LEN;
        trailer::write_head(&mut payload[at..], counter);
        let tag = self.key.tag(&trailer::signed_bytes(payload, src, dst));
        trailer::set_tag(payload, &tag);
        vrrp::fill_payload_checksum(payload, src, dst);
    }

    /// Checks the trailer of `payload` (an advertisement of `message_len` bytes and
    /// what follows it, its checksum over the whole already verified) from `src` to
    /// `dst`, then whether it is fresh at wall-clock `now_us`; an accepted advert
    /// raises its sender's counter.
    pub fn admit(
        &mut self,
        payload: &[u8],
        message_len: usize,
        src: Ipv4Addr,
        dst: Ipv4Addr,
        now_us: u64,
    ) -> Result<(), Refusal> {
        let (counter, tag) = payload
            .get(message_len..)
            .and_then(trailer::parse)
            .ok_or(Refusal::BadAuth)?;
        if !self
            .key
            .verify(&trailer::signed_bytes(payload, src, dst), tag)
        {
            return Err(Refusal::BadAuth);
        }
        let skew = counter as i128 - now_us as i128;
        let skewed = || Refusal::ClockSkew(skew.clamp(i64::MIN.into(), i64::MAX.into()) as i64);
        if skew > i128::from(self.max_skew_us) {
            return Err(skewed());
        }
        match self.heard.iter_mut().find(|h| h.sender == src) {
            Some(h) if counter > h.counter => {
                h.counter = counter;
                h.at_us = now_us;
            }
            Some(h) => return Err(Refusal::Replayed(h.counter - counter)),
            None => {
                if skew.unsigned_abs() > u128::from(self.max_skew_us) {
                    return Err(skewed());
                }
                if self.heard.len() == MAX_SENDERS {
                    // The sender heard least recently by its own clock gives way.
                    let oldest = (0..self.heard.len()).min_by_key(|&i| self.heard[i].counter);
                    self.heard.swap_remove(oldest.expect("full, so not empty"));
                }
                self.heard.push(Heard {
                    sender: src,
                    counter,
                    at_us: now_us,
                });
            }
        }
        Ok(())
    }

    /// With `accept_unsealed`, whether an advert without a trailer from `src` may count
    /// at wall-clock `now_us`: not if a sealed advert of `src` was believed less than
    /// `hold_us` ago (the caller's master-down interval). The switch to a key never
    /// takes a node from sealing back to not sealing, so within that time such an
    /// advert is someone else's, forging the address of a peer that has the key; a
    /// peer put back to `unauthenticated = true` counts again once its sealed adverts
    /// have stopped for that long. A wall clock set back since ends the hold at once:
    /// refusing a reverted peer for as long as the step would leave two masters.
    pub fn admit_unsealed(&self, src: Ipv4Addr, now_us: u64, hold_us: u64) -> Result<(), Refusal> {
        if !self.accept_unsealed {
            return Err(Refusal::BadAuth);
        }
        match self.heard.iter().find(|h| h.sender == src) {
            Some(h) if now_us >= h.at_us && now_us - h.at_us < hold_us => {
                Err(Refusal::UnsealedFromSealer(now_us - h.at_us))
            }
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
    const B: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
    const NOW: u64 = 1_800_000_000_000_000;

    fn key() -> SharedKey {
        SharedKey::new(b"a shared key of 32 bytes, really").unwrap()
    }

    fn sealed(auth: &mut AdvertAuth, src: Ipv4Addr, dst: Ipv4Addr, now_us: u64) -> Vec<u8> {
        let repr = vrrp::Repr {
            vrid: 51,
            priority: 150,
            max_advert_interval: 100,
            addresses: vec![Ipv4Addr::new(198, 18, 1, 1)],
        };
        let mut payload = vec![0u8; repr.buffer_len() + trailer::TRAILER_LEN];
        repr.emit(
            &mut vrrp::Packet::new_unchecked(&mut payload[..repr.buffer_len()]),
            src,
            dst,
        );
        let counter = auth.next_counter(now_us);
        auth.seal(&mut payload, src, dst, counter);
        payload
    }

    const MESSAGE: usize = vrrp::HEADER_LEN + 4;

    #[test]
    fn a_sealed_advert_is_admitted_once_and_every_changed_byte_is_refused() {
        let mut sender = AdvertAuth::new(key(), 60_000);
        let payload = sealed(&mut sender, A, vrrp::MULTICAST_GROUP, NOW);
        assert_eq!(payload.len(), MESSAGE + trailer::TRAILER_LEN);
        assert!(vrrp::verify_payload_checksum(
            &payload,
            A,
            vrrp::MULTICAST_GROUP
        ));
        let mut receiver = AdvertAuth::new(key(), 60_000);
        let admit = |r: &mut AdvertAuth, p: &[u8], src, dst| r.admit(p, MESSAGE, src, dst, NOW);
        assert_eq!(
            admit(&mut receiver, &payload, A, vrrp::MULTICAST_GROUP),
            Ok(())
        );
        assert_eq!(
            admit(&mut receiver, &payload, A, vrrp::MULTICAST_GROUP),
            Err(Refusal::Replayed(0))
        );
        // Every byte but the checksum's (which the caller verifies) is under the tag.
        for at in (0..payload.len()).filter(|&i| !(6..8).contains(&i)) {
            let mut changed = payload.clone();
            changed[at] ^= 0x01;
            let mut fresh = AdvertAuth::new(key(), 60_000);
            assert_eq!(
                admit(&mut fresh, &changed, A, vrrp::MULTICAST_GROUP),
                Err(Refusal::BadAuth),
                "byte {at} changed"
            );
        }
        // From another address, to another destination, under another key, cut short.
        let mut fresh = AdvertAuth::new(key(), 60_000);
        assert_eq!(
            admit(&mut fresh, &payload, B, vrrp::MULTICAST_GROUP),
            Err(Refusal::BadAuth)
        );
        assert_eq!(admit(&mut fresh, &payload, A, B), Err(Refusal::BadAuth));
        let mut other = AdvertAuth::new(
            SharedKey::new(b"another key, also 32 bytes long!").unwrap(),
            60_000,
        );
        assert_eq!(
            admit(&mut other, &payload, A, vrrp::MULTICAST_GROUP),
            Err(Refusal::BadAuth)
        );
        assert_eq!(
            fresh.admit(
                &payload[..payload.len() - 1],
                MESSAGE,
                A,
                vrrp::MULTICAST_GROUP,
                NOW
            ),
            Err(Refusal::BadAuth)
        );
        assert_eq!(
            fresh.admit(&payload[..MESSAGE], MESSAGE, A, vrrp::MULTICAST_GROUP, NOW),
            Err(Refusal::BadAuth)
        );
        assert_eq!(
            admit(&mut fresh, &payload, A, vrrp::MULTICAST_GROUP),
            Ok(())
        );
    }

    #[test]
    fn only_a_higher_counter_than_the_senders_last_is_admitted() {
        let mut a = AdvertAuth::new(key(), 60_000);
        let mut b = AdvertAuth::new(key(), 60_000);
        let g = vrrp::MULTICAST_GROUP;
        // A's clock stands still and then goes back: its counter still grows.
        let adverts: Vec<Vec<u8>> = [NOW, NOW, NOW - 5_000_000, NOW + 1_000_000]
            .into_iter()
            .map(|t| sealed(&mut a, A, g, t))
            .collect();
        let from_b = sealed(&mut b, B, g, NOW);
        let mut r = AdvertAuth::new(key(), 60_000);
        for (i, p) in adverts.iter().enumerate().take(3) {
            assert_eq!(r.admit(p, MESSAGE, A, g, NOW), Ok(()), "advert {i}");
        }
        // Each sender has its own counter.
        assert_eq!(r.admit(&from_b, MESSAGE, B, g, NOW), Ok(()));
        // Refused, with how far behind the last one believed each is.
        for (p, behind) in adverts[..3].iter().zip([2, 1, 0]) {
            assert_eq!(
                r.admit(p, MESSAGE, A, g, NOW),
                Err(Refusal::Replayed(behind))
            );
        }
        assert_eq!(r.admit(&adverts[3], MESSAGE, A, g, NOW), Ok(()));
        assert_eq!(
            r.admit(&adverts[1], MESSAGE, A, g, NOW),
            Err(Refusal::Replayed(999_999))
        );
        assert_eq!(
            r.admit(&from_b, MESSAGE, B, g, NOW),
            Err(Refusal::Replayed(0))
        );
        // A restarted sender starts from its clock, later than before: admitted.
        let mut restarted = AdvertAuth::new(key(), 60_000);
        let after = sealed(&mut restarted, A, g, NOW + 2_000_000);
        assert_eq!(r.admit(&after, MESSAGE, A, g, NOW + 2_000_000), Ok(()));
    }

    #[test]
    fn a_senders_first_advert_must_be_within_the_clock_skew() {
        let mut a = AdvertAuth::new(key(), 60_000);
        let g = vrrp::MULTICAST_GROUP;
        let recorded = sealed(&mut a, A, g, NOW);
        let mut r = AdvertAuth::new(key(), 60_000);
        // A recording replayed to a node that just started, 61 s later: refused.
        assert_eq!(
            r.admit(&recorded, MESSAGE, A, g, NOW + 61_000_000),
            Err(Refusal::ClockSkew(-61_000_000))
        );
        // A sender whose clock is 61 s ahead: refused, the skew said.
        assert_eq!(
            r.admit(&recorded, MESSAGE, A, g, NOW - 61_000_000),
            Err(Refusal::ClockSkew(61_000_000))
        );
        // Within 60 s either way: admitted, and then only its counter matters.
        assert_eq!(r.admit(&recorded, MESSAGE, A, g, NOW - 60_000_000), Ok(()));
        let later = sealed(&mut a, A, g, NOW + 1);
        assert_eq!(r.admit(&later, MESSAGE, A, g, NOW + 3_600_000_000), Ok(()));
    }

    #[test]
    fn the_senders_kept_are_bounded() {
        let g = vrrp::MULTICAST_GROUP;
        let mut r = AdvertAuth::new(key(), 60_000);
        let mut s = AdvertAuth::new(key(), 60_000);
        for i in 0..(MAX_SENDERS as u32 + 10) {
            let src = Ipv4Addr::from(0xc612_0000 + i);
            let p = sealed(&mut s, src, g, NOW + u64::from(i));
            assert_eq!(r.admit(&p, MESSAGE, src, g, NOW), Ok(()));
            assert!(r.heard.len() <= MAX_SENDERS);
        }
        // The newest are kept: the last sender's advert is still a replay.
        let last = Ipv4Addr::from(0xc612_0000 + MAX_SENDERS as u32 + 9);
        assert!(r.heard.iter().any(|h| h.sender == last));
    }

    #[test]
    fn no_counter_further_ahead_than_the_skew_is_taken() {
        let g = vrrp::MULTICAST_GROUP;
        let mut a = AdvertAuth::new(key(), 60_000);
        let mut r = AdvertAuth::new(key(), 60_000);
        assert_eq!(
            r.admit(&sealed(&mut a, A, g, NOW), MESSAGE, A, g, NOW),
            Ok(())
        );
        // A's clock jumps 2 h ahead: refused, although above its last counter, so the
        // receiver never holds a counter A's corrected clock takes 2 h to pass.
        let ahead = sealed(&mut a, A, g, NOW + 7_200_000_000);
        assert_eq!(
            r.admit(&ahead, MESSAGE, A, g, NOW + 1_000_000),
            Err(Refusal::ClockSkew(7_199_000_000))
        );
        // Restarted with its clock corrected, A is believed at once.
        let mut corrected = AdvertAuth::new(key(), 60_000);
        let back = sealed(&mut corrected, A, g, NOW + 2_000_000);
        assert_eq!(r.admit(&back, MESSAGE, A, g, NOW + 2_000_000), Ok(()));
        // Within the bound ahead: taken.
        let near = sealed(&mut corrected, A, g, NOW + 50_000_000);
        assert_eq!(r.admit(&near, MESSAGE, A, g, NOW + 2_000_000), Ok(()));
    }

    #[test]
    fn a_running_sender_whose_clock_was_set_back_is_believed_again_soon() {
        let g = vrrp::MULTICAST_GROUP;
        let mut a = AdvertAuth::new(key(), 60_000);
        let mut r = AdvertAuth::new(key(), 60_000);
        assert_eq!(
            r.admit(&sealed(&mut a, A, g, NOW), MESSAGE, A, g, NOW),
            Ok(())
        );
        // A's clock runs 2 h ahead (refused), then NTP sets it back while A runs.
        let ahead = sealed(&mut a, A, g, NOW + 7_200_000_000);
        assert!(matches!(
            r.admit(&ahead, MESSAGE, A, g, NOW + 1_000_000),
            Err(Refusal::ClockSkew(_))
        ));
        // Its next counter is its clock again, not 2 h ahead: believed.
        let back = sealed(&mut a, A, g, NOW + 2_000_000);
        assert_eq!(r.admit(&back, MESSAGE, A, g, NOW + 2_000_000), Ok(()));
        // A step back within twice the bound keeps the counter growing.
        let near = sealed(&mut a, A, g, NOW + 100_000_000);
        let after = sealed(&mut a, A, g, NOW + 3_000_000);
        assert!(
            u64::from_be_bytes(after[MESSAGE + 4..MESSAGE + 12].try_into().unwrap())
                > NOW + 100_000_000
        );
        assert!(matches!(
            r.admit(&near, MESSAGE, A, g, NOW + 3_000_000),
            Err(Refusal::ClockSkew(_))
        ));
    }

    /// The hold on a sealing peer's unsealed adverts ends when the wall clock went back
    /// since its last sealed one: held for the step, a reverted peer would be refused
    /// and the group left with two masters.
    #[test]
    fn a_clock_set_back_ends_the_hold_on_unsealed_adverts() {
        let g = vrrp::MULTICAST_GROUP;
        let mut a = AdvertAuth::new(key(), 60_000);
        let mut r = AdvertAuth::new(key(), 60_000).accepting_unsealed(true);
        assert_eq!(
            r.admit(&sealed(&mut a, A, g, NOW), MESSAGE, A, g, NOW),
            Ok(())
        );
        let hold = 3_600_000;
        assert_eq!(
            r.admit_unsealed(A, NOW + 1_000_000, hold),
            Err(Refusal::UnsealedFromSealer(1_000_000))
        );
        assert_eq!(r.admit_unsealed(A, NOW + hold, hold), Ok(()));
        assert_eq!(r.admit_unsealed(A, NOW - 600_000_000, hold), Ok(()));
        assert_eq!(r.admit_unsealed(B, NOW, hold), Ok(()), "never heard sealed");
    }
}
