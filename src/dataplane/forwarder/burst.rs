//! The burst: every packet of an RX burst handled in order, with one exception that
//! keeps a new session's cold line off the critical path. A new NAT or FullNAT
//! session's reply key depends on the real server (and local port) placement picks,
//! so the burst's prefetch pass cannot load its index bucket; filed at once, the
//! insert waits a whole memory latency for it. Within [`Forwarder::handle_burst`], the
//! session is made when its packet comes (`prepare_open`: placement has run, the
//! reply bucket starts loading) and counted in its real server's load (the next pick
//! sees it), then filed, counted as a connection, rewritten and sent at the end of
//! the burst (`file_open`), after the rest of the burst has been handled. A later packet of the same connection in
//! the same burst (either key) waits behind it and is handled after it, in order.
//!
//! What it changes, seen from outside: a burst's new sessions leave after its other
//! packets. Every decision is taken when its packet comes, in arrival order, as
//! `handle` alone takes it: admission, placement, the session in its real server's
//! load (so the next pick sees it; its connection is counted once filed), table
//! pressure's reclaim (counting the parked sessions as filed). A packet that would
//! see a parked session (one of its keys, or the reply key of the session it found,
//! which a parked session may take over) first has everything parked finished. What
//! moves is the insert and what follows it, and with it these, all within one burst:
//! - a refusal (full table, reply key held by a live connection) is known only when
//!   the session is filed: until then its load stays counted, so a pick between sees
//!   it, and a connection threshold it crossed keeps its server marked overloaded
//!   until the load falls back under the threshold's lower mark;
//! - a session opened without parking (DR, TUN, the SYN proxy's) is filed before
//!   sessions parked earlier in the burst: of two that want the same reply key or the
//!   last free slot, the other one may win;
//! - the parked session's egress sees the neighbour table as of the burst's end (an
//!   ARP answer later in the burst addresses it instead of holding it).
//!
//! An ICMP error quoting a packet of a parked session (only a forged one can: the
//! session's first packet has not left yet) waits for it like any other packet.
//!
//! Cost: each packet after the first parked session checks its key's hash against
//! the parked ones (at most 64 compares), and an inbound packet that hits a NAT or
//! FullNAT session hashes that session's reply key once more.
use super::placement::Opening;
use super::{Action, Context, Forwarder, PortContext};
use crate::dataplane::counters::WorkerCounters;
use crate::dataplane::neighbour::NeighbourTable;
use crate::dpdk::BURST_SIZE;
use crate::dpdk::{Burst, Packet};
use crate::flow::parse::{classify_into, Parsed};
use crate::model::DropReason;
use crate::session::{Direction, HashedKey, SessionId};
use crate::wire::ethernet::MacAddr;

/// A packet of the burst that waits for its end.
pub(super) enum Parked {
    /// Packet `index` opens this session, made but not filed; `parsed` is its frame's
    /// and `to` its destination MAC as it came (egress rewrites it).
    Open {
        index: usize,
        opening: Opening,
        parsed: Parsed,
        to: MacAddr,
    },
    /// Packet `index` belongs to a connection parked before it: handled afresh once
    /// that is filed.
    Behind(usize),
}

impl Parked {
    fn index(&self) -> usize {
        match *self {
            Parked::Open { index, .. } | Parked::Behind(index) => index,
        }
    }
}

impl Forwarder {
    /// Handles every packet of `burst`, as [`Forwarder::handle`] would one by one,
    /// and gives each packet's action to `dispatch` (with the forwarder and the burst,
    /// to act on it): first the packets handled at once, in order, then the parked
    /// ones (see the module's documentation), in order. Never hands on
    /// [`Action::Parked`].
    pub fn handle_burst(
        &mut self,
        burst: &mut Burst,
        port: &PortContext,
        neighbours: &mut NeighbourTable,
        now_tsc: u64,
        counters: &WorkerCounters,
        mut dispatch: impl FnMut(&mut Forwarder, &mut Burst, usize, Action),
    ) {
        // A frame `handle` decides on its Ethernet header alone (`EthernetVerdict`)
        // is neither peeked at nor classified: a flood of them costs their drop,
        // not a parse and two cache lines each (to another host's MAC, 1M sessions:
        // 102 -> 26 cycles a frame, perf/results/nat_rewrite.md).
        let prefetched = self.prefetch_parsed(burst, Some(port.mac));
        let parses = prefetched.parses;
        // Every frame `handle` parses is classified before any is handled: the
        // fields a frame's `Parsed` is built of are stored one by one, and handling
        // reads some at once (the tuple, a 16-byte move), a wider load than any of
        // those stores, which waits for them to reach the cache. Handled after the
        // rest of the pass, they are there (a burst of one frame gains nothing). The
        // pass also gives the prefetches more time, and has read every such frame (no
        // frame is prefetched ahead of its handling any more). (1M sessions,
        // established NAT, median burst: 268 -> 259 cycles,
        // perf/results/nat_rewrite.md.) For the same reason each `Parsed` is written
        // in its slot (`classify_into`), not returned and copied there.
        let n = burst.len().min(BURST_SIZE);
        let mut parsed = [Parsed::PLACEHOLDER; BURST_SIZE];
        let mut classified: [Option<Result<(), DropReason>>; BURST_SIZE] = [None; BURST_SIZE];
        for (i, (c, p)) in classified[..n].iter_mut().zip(&mut parsed).enumerate() {
            if parses[i] {
                *c = Some(classify_into(burst.packet(i), p));
            }
        }
        // The keys that may lie past their home bucket: their next bucket has loaded
        // during the classify pass, so their entries can start loading now.
        self.prefetch_past_home(prefetched.past_home);
        self.parked.clear();
        self.parked_hashes.clear();
        let mut cx = Context {
            port,
            neighbours,
            now_tsc,
            counters,
        };
        // Frame `i`'s outcome of the pass (`None`: not classified there).
        let classified_at = |i: usize| {
            let outcome = classified.get(i).copied().flatten()?;
            Some(outcome.map(|()| &parsed[i]))
        };
        for i in 0..burst.len() {
            self.parking = self.park_new_sessions;
            let action = self.handle_classified(
                burst.packet_at(i),
                classified_at(i),
                port,
                cx.neighbours,
                now_tsc,
                counters,
            );
            self.parking = false;
            if action != Action::Parked {
                dispatch(self, burst, i, action);
            } else if matches!(self.parked.last(), Some(Parked::Behind(_))) {
                // The packet needs a parked session: everything parked goes now, so
                // that it, and every packet after it, sees the table and the loads
                // as one-by-one handling would.
                self.finish_parked(burst, &mut cx, &mut dispatch);
            }
        }
        self.finish_parked(burst, &mut cx, &mut dispatch);
    }

    /// Finishes every parked packet, in order, and hands on its action.
    fn finish_parked(
        &mut self,
        burst: &mut Burst,
        cx: &mut Context,
        dispatch: &mut impl FnMut(&mut Forwarder, &mut Burst, usize, Action),
    ) {
        // Taken out (keeping its capacity) so that finishing may borrow `self`.
        let mut parked = std::mem::take(&mut self.parked);
        self.parked_hashes.clear();
        for p in parked.drain(..) {
            let i = p.index();
            let action = self.finish(p, burst.packet_at(i), cx);
            dispatch(self, burst, i, action);
        }
        self.parked = parked;
    }

    /// Parks `p`: its packet's action comes from `handle_burst` at the burst's end.
    #[inline(never)]
    pub(super) fn park(&mut self, p: Parked) -> Action {
        // A burst parks each packet at most once, and `parked` holds a whole burst
        // (`parked_hashes` two keys a packet): neither ever grows.
        debug_assert!(self.parked.len() < self.parked.capacity());
        if let Parked::Open { opening, .. } = &p {
            self.parked_hashes.extend(opening.keys().map(|k| k.hash()));
        }
        self.parked.push(p);
        Action::Parked
    }

    /// Whether the packet keyed `key`, which found `found`, must wait for a session
    /// parked in this burst: that session will be filed under `key`, or under the
    /// reply key of `found` (which gives it way if its connection is over by then,
    /// and keeps it otherwise: either way the packet must see the outcome). Hashes
    /// first: a packet of another connection costs a compare per parked key, and one
    /// hash more when it found a session with a reply key.
    #[inline(never)]
    pub(super) fn waits_on_parked(
        &self,
        key: &HashedKey,
        found: Option<(SessionId, Direction)>,
    ) -> bool {
        let wanted = |k: &HashedKey| {
            self.parked_hashes.contains(&k.hash())
                && self.parked.iter().any(|p| match p {
                    Parked::Open { opening, .. } => opening.files(k),
                    Parked::Behind(_) => false,
                })
        };
        if wanted(key) {
            return true;
        }
        // Found by its reply key, the session's other key is its client key, which
        // no new session can want: only the reply key of one found inbound can be.
        match found {
            Some((id, Direction::Inbound)) => self
                .sessions
                .get(id)
                .and_then(|s| s.reply_key())
                .is_some_and(|reply| wanted(&HashedKey::new(reply))),
            _ => false,
        }
    }

    /// How many sessions are parked, made but not filed.
    pub(super) fn parked_openings(&self) -> usize {
        self.parked
            .iter()
            .filter(|p| matches!(p, Parked::Open { .. }))
            .count()
    }

    /// The end of a parked packet: its session filed, then accounted and sent as
    /// `l4` would have; or, behind one, handled afresh.
    fn finish(&mut self, p: Parked, mut pkt: Packet<'_>, cx: &mut Context) -> Action {
        let (opening, parsed, to) = match p {
            Parked::Behind(_) => {
                return self.handle(pkt, cx.port, cx.neighbours, cx.now_tsc, cx.counters)
            }
            Parked::Open {
                opening,
                parsed,
                to,
                ..
            } => (opening, parsed, to),
        };
        let action = match self.file_open(&opening, cx.counters) {
            Ok(matched) => {
                self.account_packet(&matched, u64::from(pkt.len()));
                self.egress(&mut pkt, &parsed, &matched, opening.flags(), cx)
            }
            Err(reason) => Action::Drop(reason),
        };
        let frame = pkt.bytes();
        self.unless_for_kernel(action, to, frame, &parsed, cx.port)
    }
}
