//! Frames waiting for their next hop's MAC, as the kernel's unresolved-neighbour queue
//! (`unres_qlen`): a frame the forwarder rewrote but could not address (`Action::Hold`)
//! waits here while an ARP request (or, for an IPv6 next hop, a Neighbor
//! Solicitation) asks for its next hop, and leaves as soon as the answer is learned.
//! So the first packet towards a neighbour not resolved yet (a SYN to a new real
//! server, a real server's reply to a client right after a takeover) is not lost to
//! its sender's retransmission timeout. Fixed size, no allocation: one burst in all,
//! at most [`PER_TARGET`] of them for one next hop (so a host that never answers
//! cannot take the room of the others); a frame that finds no room, or waits longer
//! than the hold time, is dropped as `neighbour_unresolved`, as it was before this
//! queue existed.
use crate::dpdk::{Burst, BURST_SIZE};
use crate::wire::MacAddr;
use std::net::{IpAddr, Ipv4Addr};

/// Frames held at most for one next hop (the kernel's `unres_qlen` is per neighbour
/// too).
pub const PER_TARGET: usize = 8;

/// Why a frame waits and until when.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Waiting {
    /// The address whose MAC the frame needs.
    target: IpAddr,
    /// The port it leaves on (the one it came from).
    port: u16,
    deadline_tsc: u64,
}

pub struct Held {
    frames: Burst,
    /// `waiting[i]` describes `frames` packet `i`.
    waiting: [Waiting; BURST_SIZE],
    /// Resolutions to ask for: (target, port).
    asks: [(IpAddr, u16); BURST_SIZE],
    asks_len: usize,
    hold_tsc: u64,
    /// The neighbour table's `learned_total` at the last look: nothing can leave
    /// before it moves (or a deadline passes).
    seen_learned: u64,
    /// The earliest deadline of the frames held.
    next_deadline_tsc: u64,
}

impl Held {
    pub fn new(hold_tsc: u64) -> Held {
        Held {
            frames: Burst::new(),
            waiting: [Waiting {
                target: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                port: 0,
                deadline_tsc: 0,
            }; BURST_SIZE],
            asks: [(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0); BURST_SIZE],
            asks_len: 0,
            hold_tsc,
            seen_learned: 0,
            next_deadline_tsc: u64::MAX,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.frames.is_empty() && self.asks_len == 0
    }

    /// Takes packet `i` of `from` to wait for `target` on `port`; `ask` says a
    /// resolution should be asked for (an ARP request the forwarder's rate limiter
    /// agreed to; for IPv6, the worker's solicitations, limited per address). False,
    /// and the packet stays in `from`, when the queue is full or holds
    /// [`PER_TARGET`] frames for `target` already.
    pub fn hold(
        &mut self,
        from: &mut Burst,
        i: usize,
        target: IpAddr,
        port: u16,
        now_tsc: u64,
        ask: bool,
    ) -> bool {
        let slot = self.frames.len();
        if !room_for(&self.waiting[..slot], target) || !from.move_to(i, &mut self.frames) {
            return false;
        }
        let deadline_tsc = now_tsc + self.hold_tsc;
        self.waiting[slot] = Waiting {
            target,
            port,
            deadline_tsc,
        };
        self.next_deadline_tsc = self.next_deadline_tsc.min(deadline_tsc);
        if ask && self.asks_len < BURST_SIZE {
            self.asks[self.asks_len] = (target, port);
            self.asks_len += 1;
        }
        true
    }

    /// Hands every pending resolution request to `ask` (target, port) and forgets
    /// them.
    pub fn take_asks(&mut self, mut ask: impl FnMut(IpAddr, u16)) {
        for &(target, port) in &self.asks[..self.asks_len] {
            ask(target, port);
        }
        self.asks_len = 0;
    }

    /// Whether `release` could let anything go: a neighbour was learned since the last
    /// look (`learned_total` counts both families' tables), or a deadline passed. One
    /// comparison each while nothing changes.
    pub fn due(&self, learned_total: u64, now_tsc: u64) -> bool {
        !self.frames.is_empty()
            && (learned_total != self.seen_learned || now_tsc >= self.next_deadline_tsc)
    }

    /// For the frames leaving on `port`: those whose next hop `lookup` now knows are
    /// addressed (their MAC, `src` as source) and moved to `out`; those past their
    /// deadline are freed. Returns (sent to `out`, expired).
    pub fn release(
        &mut self,
        port: u16,
        src: MacAddr,
        now_tsc: u64,
        lookup: impl Fn(IpAddr) -> Option<MacAddr>,
        out: &mut Burst,
    ) -> (usize, usize) {
        let mut expired = Burst::new();
        let mut moved = [false; BURST_SIZE];
        let (mut sent, mut dropped) = (0, 0);
        // `move_to` leaves gaps; the length counts them until `compact_moved`.
        let total = self.frames.len();
        for (i, w) in self.waiting[..total].iter().enumerate() {
            if w.port != port {
                continue;
            }
            if let Some(mac) = lookup(w.target) {
                if out.is_full() {
                    continue; // the next look sends it
                }
                // Cannot fail: the forwarder parsed this Ethernet header.
                let _ = crate::forward::dr::forward(self.frames.packet_mut(i), mac, src);
                moved[i] = self.frames.move_to(i, out);
                sent += usize::from(moved[i]);
            } else if now_tsc >= w.deadline_tsc {
                moved[i] = self.frames.move_to(i, &mut expired);
                dropped += usize::from(moved[i]);
            }
        }
        if sent + dropped > 0 {
            self.frames.compact_moved();
            let mut kept = 0;
            for i in (0..total).filter(|&i| !moved[i]) {
                self.waiting[kept] = self.waiting[i];
                kept += 1;
            }
            debug_assert_eq!(kept, self.frames.len());
        }
        self.next_deadline_tsc = self.waiting[..self.frames.len()]
            .iter()
            .map(|w| w.deadline_tsc)
            .min()
            .unwrap_or(u64::MAX);
        expired.free_all();
        (sent, dropped)
    }

    /// Records that the frames were looked at with the table at `learned_total`.
    pub fn looked(&mut self, learned_total: u64) {
        self.seen_learned = learned_total;
    }
}

/// Whether one more frame may wait for `target` beside those `waiting`.
fn room_for(waiting: &[Waiting], target: IpAddr) -> bool {
    waiting.len() < BURST_SIZE && waiting.iter().filter(|w| w.target == target).count() < PER_TARGET
}

#[cfg(test)]
mod tests {
    use super::*;

    fn waiting_for(targets: &[IpAddr]) -> Vec<Waiting> {
        targets
            .iter()
            .map(|&target| Waiting {
                target,
                port: 0,
                deadline_tsc: 0,
            })
            .collect()
    }

    #[test]
    fn each_next_hop_holds_a_bounded_share_of_the_queue() {
        let v6: IpAddr = "2001:db8:1a::11".parse().unwrap();
        let other6: IpAddr = "2001:db8:1a::12".parse().unwrap();
        let v4: IpAddr = "198.18.0.11".parse().unwrap();
        let mut held = Vec::new();
        for n in 0..PER_TARGET {
            assert!(room_for(&waiting_for(&held), v6), "frame {n}");
            held.push(v6);
        }
        assert!(!room_for(&waiting_for(&held), v6), "one past the share");
        // Others still find room, of either family.
        assert!(room_for(&waiting_for(&held), other6));
        assert!(room_for(&waiting_for(&held), v4));
        // The whole queue full of different next hops: no room for anyone.
        let full: Vec<IpAddr> = (0..BURST_SIZE as u32)
            .map(|n| IpAddr::V4(Ipv4Addr::from(0xc612_0100 + n)))
            .collect();
        assert!(!room_for(&waiting_for(&full), other6));
    }
}
