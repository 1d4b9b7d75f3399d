//! The SYN proxy's SYN timer: the connections whose SYN to the real server waits for
//! its SYN-ACK, each with when to send the SYN again.
//!
//! A kernel in SYN-SENT retransmits its SYN after 1 s, then after twice as long each
//! time, and gives up after `tcp_syn_retries`; with the proxy the client's kernel is
//! past that (its handshake ended at Sluice), so Sluice does it for the server's half,
//! as LVS's synproxy does (`synproxy_syn_retry`). Without it a lost SYN goes again
//! only on the client's next segment, and a client that waits for the server to speak
//! first sends none.
//!
//! The entries live in a slab fixed at start-up ([`CAPACITY`], no allocation after).
//! Every wait depends only on how many times the SYN went again (the first wait, then
//! twice as long each time), so the connections sent again equally often wait equally
//! long and fall due in the order they were put in line: one FIFO per port and retry
//! count, appended at its tail, due from its head. A scan walks each FIFO from its
//! head while its entries are due and stops at the first that is not, so it costs the
//! entries due, not the entries waiting. Scans are per port because the worker
//! transmits per port. An entry whose frame found no room stays where it is, still
//! due, for the next scan.
//!
//! A connection that stops waiting leaves at once rather than at a scan: [`SynTimer::arm`]
//! returns a [`Ticket`] (the entry's index and generation), which the caller keeps by
//! the session and hands to [`SynTimer::forget`] when the server answers, the client
//! resets, or the session ends. The generation and the session must both match, so a
//! ticket kept past its entry's end frees nothing: the slab entry may hold another
//! connection by then. A kick ([`SynTimer::kick`]: the server was just sent a reset
//! ending an older connection on the tuple) moves the entry to its port's kicked FIFO,
//! all of which is due at the next scan. Each entry due is still asked about
//! (`status`), for a connection that ended without its ticket coming back.
//!
//! What the SYN is rebuilt from (the handshake) stays in the proxy's side array; an
//! entry keeps only what is not there: the client's TSval on the SYN, the L2 header
//! and the port of the client's cookie ACK, and how many times it was sent again.
use crate::model::MAX_SYNPROXY_SYN_RETRIES;

/// Connections one worker times at once, 56 bytes each (896 KiB). A connection holds
/// its entry for about a round trip when its server answers, but until it is given up
/// when its server is silent: 15 s with 3 retries, 63 s with 5. So silent servers fill
/// it at about 1 100 new connections a second (16 384 / 15 s; 260 with 5 retries),
/// and later ones get no timer until entries free. A scan's cost does not grow with
/// it: only the entries due are looked at.
pub const CAPACITY: usize = 16_384;

/// The longest L2 header an entry keeps: Ethernet and two VLAN tags (what
/// [`crate::wire::ethernet::parse_l2`] walks).
pub const L2_MAX: usize = 22;

/// The worker's ports whose connections can be timed: every port DPDK can have.
pub const PORTS: usize = dpdk_sys::RTE_MAX_ETHPORTS as usize;

/// The FIFOs of one port: one per count of SYNs sent again (0 up to the most retries),
/// then the kicked ones.
const LEVELS: usize = MAX_SYNPROXY_SYN_RETRIES as usize + 1;
const KICKED: usize = LEVELS;
const QUEUES: usize = LEVELS + 1;

/// No entry: the end of a FIFO or of the free list.
const NIL: u16 = u16::MAX;
/// The queue of an entry in the free list.
const FREE: u8 = u8::MAX;

/// One connection whose SYN waits for its real server's SYN-ACK; `K` names its
/// session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timed<K> {
    pub session: K,
    /// The handshake's cookie: the session's side entry still holds it unless its slot
    /// went to another proxied connection.
    pub cookie: u32,
    /// The TSval the first SYN carried (the client's, on its cookie ACK), if
    /// `has_tsval`: an `Option` would make it 56 bytes, and the slab's entry 64.
    tsval: u32,
    has_tsval: bool,
    /// The worker's port the cookie ACK came in on, where the SYN went out.
    pub port: u16,
    /// SYNs sent again so far.
    pub sent: u8,
    /// How many times it may be sent again before the connection is given up.
    pub retries: u8,
    l2_len: u8,
    l2: [u8; L2_MAX],
    due_tsc: u64,
}

impl<K> Timed<K> {
    /// The TSval the first SYN carried.
    pub fn tsval(&self) -> Option<u32> {
        self.has_tsval.then_some(self.tsval)
    }

    /// The cookie ACK's L2 header (Ethernet and any VLAN tags).
    pub fn l2(&self) -> &[u8] {
        &self.l2[..usize::from(self.l2_len)]
    }
}

/// What the caller says of a timed connection whose time came.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// No longer waiting for the server (answered, reset, gone): forgotten.
    Gone,
    /// Still waiting.
    Waiting,
}

/// What is due for a timed connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Due {
    /// The SYN again.
    Resend,
    /// It was sent `retries` times again and the last wait ran out: give up.
    GiveUp,
}

/// A timed connection's entry, as [`SynTimer::arm`] gave it: its index in the slab and
/// the entry's generation then (never 0, so the bits of a ticket are never 0 and 0
/// can mean none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket(u32);

impl Ticket {
    /// The ticket whose [`Ticket::bits`] are `bits`; `None` for 0.
    pub fn from_bits(bits: u32) -> Option<Ticket> {
        (bits != 0).then_some(Ticket(bits))
    }

    pub fn bits(self) -> u32 {
        self.0
    }

    fn new(index: u16, generation: u16) -> Ticket {
        Ticket(u32::from(generation) << 16 | u32::from(index))
    }

    fn index(self) -> usize {
        (self.0 & 0xffff) as usize
    }

    fn generation(self) -> u16 {
        (self.0 >> 16) as u16
    }
}

/// A slab entry: a connection (`None` while free) and its links in the FIFO it is in
/// (`queue`), or in the free list (`next`).
#[derive(Clone, Copy, Debug)]
struct Slot<K> {
    timed: Option<Timed<K>>,
    prev: u16,
    next: u16,
    /// Bumped each time the entry is freed: a ticket of an earlier use no longer
    /// matches.
    generation: u16,
    /// Its retry count's FIFO, [`KICKED`], or [`FREE`].
    queue: u8,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Fifo {
    head: u16,
    tail: u16,
}

const EMPTY: Fifo = Fifo {
    head: NIL,
    tail: NIL,
};

pub struct SynTimer<K> {
    /// Allocated whole at the start, never grown.
    slots: Vec<Slot<K>>,
    /// The first free entry, linked on by `next`.
    free: u16,
    len: usize,
    /// Per port ([`PORTS`]), its FIFOs.
    queues: Vec<[Fifo; QUEUES]>,
    /// The first wait, in TSC cycles; each retry waits twice as long as the one before.
    first_tsc: u64,
    scan_tsc: u64,
    next_scan_tsc: u64,
}

impl<K: Copy + PartialEq> SynTimer<K> {
    /// A timer of [`CAPACITY`] entries whose first wait is `first_tsc` cycles, scanned
    /// every `scan_tsc`.
    pub fn new(first_tsc: u64, scan_tsc: u64) -> SynTimer<K> {
        SynTimer::with_capacity(CAPACITY, first_tsc, scan_tsc)
    }

    /// A timer of `capacity` entries (fewer than 65 535: indices are 16 bits).
    pub fn with_capacity(capacity: usize, first_tsc: u64, scan_tsc: u64) -> SynTimer<K> {
        assert!(
            capacity < usize::from(NIL),
            "SYN timer of {capacity} entries"
        );
        let slots = (0..capacity)
            .map(|i| Slot {
                timed: None,
                prev: NIL,
                next: if i + 1 < capacity { i as u16 + 1 } else { NIL },
                generation: 1,
                queue: FREE,
            })
            .collect();
        SynTimer {
            slots,
            free: if capacity > 0 { 0 } else { NIL },
            len: 0,
            queues: vec![[EMPTY; QUEUES]; PORTS],
            first_tsc: first_tsc.max(1),
            scan_tsc,
            next_scan_tsc: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.slots.len()
    }

    /// Bytes of a timer of `capacity` entries.
    pub fn bytes_for(capacity: usize) -> usize {
        capacity * std::mem::size_of::<Slot<K>>() + PORTS * std::mem::size_of::<[Fifo; QUEUES]>()
    }

    /// Times the SYN of `session` just sent at `now_tsc` (its handshake's `cookie`,
    /// with `tsval`, out `port`; the cookie ACK's L2 header `l2`), to be sent again
    /// up to `retries` times (at most [`MAX_SYNPROXY_SYN_RETRIES`]). Its ticket, or
    /// `None`, and nothing kept, when the timer is full, `l2` is longer than an entry
    /// holds or `port` is past [`PORTS`].
    #[allow(clippy::too_many_arguments)]
    pub fn arm(
        &mut self,
        session: K,
        cookie: u32,
        tsval: Option<u32>,
        port: u16,
        retries: u8,
        l2: &[u8],
        now_tsc: u64,
    ) -> Option<Ticket> {
        if self.free == NIL || l2.len() > L2_MAX || usize::from(port) >= self.queues.len() {
            return None;
        }
        let at = self.free;
        let mut copy = [0u8; L2_MAX];
        copy[..l2.len()].copy_from_slice(l2);
        let slot = &mut self.slots[usize::from(at)];
        self.free = slot.next;
        slot.timed = Some(Timed {
            session,
            cookie,
            tsval: tsval.unwrap_or(0),
            has_tsval: tsval.is_some(),
            port,
            sent: 0,
            retries: retries.min(MAX_SYNPROXY_SYN_RETRIES),
            l2_len: l2.len() as u8,
            l2: copy,
            due_tsc: now_tsc.saturating_add(self.first_tsc),
        });
        let ticket = Ticket::new(at, slot.generation);
        self.len += 1;
        self.link(at, 0);
        Some(ticket)
    }

    /// Forgets the connection of `ticket`, `session`'s: its server answered, its client
    /// reset it, or its session ended. False when the ticket's entry is no longer
    /// that connection's (given up, or forgotten already): then nothing changes.
    pub fn forget(&mut self, ticket: Ticket, session: K) -> bool {
        let Some(at) = self.live(ticket, session) else {
            return false;
        };
        self.release(at);
        true
    }

    /// The real server of the connection of `ticket` (`session`'s) was just sent a
    /// reset ending an older connection on the tuple: its SYN goes again at the next
    /// scan of its port rather than at its time, if it has a retry left. Whether it
    /// does.
    pub fn kick(&mut self, ticket: Ticket, session: K) -> bool {
        let Some(at) = self.live(ticket, session) else {
            return false;
        };
        let slot = self.slots[at];
        let Some(t) = slot.timed else {
            return false;
        };
        if usize::from(slot.queue) == KICKED {
            return true;
        }
        if t.sent >= t.retries {
            // Its last wait runs on to the give-up: a kick spends a retry, and none is
            // left.
            return false;
        }
        self.unlink(at as u16);
        self.link(at as u16, KICKED);
        true
    }

    /// Whether a scan is due at `now_tsc`: once every scan period, while anything is
    /// timed. Starts the next period.
    pub fn scan_due(&mut self, now_tsc: u64) -> bool {
        if self.is_empty() || now_tsc < self.next_scan_tsc {
            return false;
        }
        self.next_scan_tsc = now_tsc.saturating_add(self.scan_tsc);
        true
    }

    /// The connections of `port` due at `now_tsc` (their time came, or kicked): `status`
    /// says where each stands (in `cx`, the caller's state), and one no longer waiting
    /// is forgotten; for the others `act` makes what is due and says whether it could
    /// (false: no room now; the entry stays as it was, due at the next scan). After a
    /// resend the next wait is twice the last; after a give-up the entry is forgotten.
    /// Entries not due are not looked at.
    pub fn scan<C>(
        &mut self,
        port: u16,
        now_tsc: u64,
        cx: &mut C,
        status: impl Fn(&C, &Timed<K>) -> Status,
        mut act: impl FnMut(&mut C, &Timed<K>, Due) -> bool,
    ) {
        let port = usize::from(port);
        if port >= self.queues.len() {
            return;
        }
        // The highest retry count first: a resend moves an entry one count up, into a
        // FIFO this scan has walked already, so no entry is acted on twice. The
        // kicked last, for the same reason.
        for queue in (0..LEVELS).rev().chain([KICKED]) {
            let mut at = self.queues[port][queue].head;
            while at != NIL {
                let slot = &self.slots[usize::from(at)];
                let next = slot.next;
                let Some(t) = slot.timed else {
                    break;
                };
                let due = now_tsc >= t.due_tsc;
                if !due && queue != KICKED {
                    // In due order: the rest of this FIFO is later still.
                    break;
                }
                if status(cx, &t) == Status::Gone {
                    self.release(usize::from(at));
                } else if t.sent < t.retries {
                    if act(cx, &t, Due::Resend) {
                        self.resent(at, now_tsc);
                    }
                } else if due && act(cx, &t, Due::GiveUp) {
                    self.release(usize::from(at));
                }
                at = next;
            }
        }
    }

    /// The SYN of entry `at` went again at `now_tsc`: it waits twice as long as it
    /// last did, in the FIFO of its new count.
    fn resent(&mut self, at: u16, now_tsc: u64) {
        self.unlink(at);
        let first = self.first_tsc;
        let Some(t) = &mut self.slots[usize::from(at)].timed else {
            return;
        };
        t.sent += 1;
        t.due_tsc = now_tsc.saturating_add(first.saturating_mul(1 << t.sent.min(16)));
        let sent = usize::from(t.sent);
        self.link(at, sent);
    }

    /// The slab index of the live entry of `ticket` if it still holds `session`.
    fn live(&self, ticket: Ticket, session: K) -> Option<usize> {
        let at = ticket.index();
        let slot = self.slots.get(at)?;
        let t = slot.timed.as_ref()?;
        (slot.generation == ticket.generation() && t.session == session).then_some(at)
    }

    /// Appends live entry `at` to FIFO `queue` of its port. A FIFO of a retry count
    /// stays in due order: an entry due before the tail (only with a clock that went
    /// back) is made due with it.
    fn link(&mut self, at: u16, queue: usize) {
        let Some(t) = self.slots[usize::from(at)].timed else {
            return;
        };
        let fifo = &mut self.queues[usize::from(t.port)][queue];
        let tail = fifo.tail;
        fifo.tail = at;
        let mut tail_due = 0;
        if tail == NIL {
            fifo.head = at;
        } else {
            let before = &mut self.slots[usize::from(tail)];
            before.next = at;
            if queue != KICKED {
                tail_due = before.timed.map_or(0, |b| b.due_tsc);
            }
        }
        let slot = &mut self.slots[usize::from(at)];
        slot.prev = tail;
        slot.next = NIL;
        slot.queue = queue as u8;
        if let Some(t) = &mut slot.timed {
            t.due_tsc = t.due_tsc.max(tail_due);
        }
    }

    /// Takes live entry `at` out of its FIFO.
    fn unlink(&mut self, at: u16) {
        let slot = self.slots[usize::from(at)];
        let Some(t) = slot.timed else {
            return;
        };
        let fifo = &mut self.queues[usize::from(t.port)][usize::from(slot.queue)];
        if slot.prev == NIL {
            fifo.head = slot.next;
        } else {
            self.slots[usize::from(slot.prev)].next = slot.next;
        }
        if slot.next == NIL {
            fifo.tail = slot.prev;
        } else {
            self.slots[usize::from(slot.next)].prev = slot.prev;
        }
    }

    /// Frees live entry `at`: out of its FIFO, a new generation, into the free list.
    fn release(&mut self, at: usize) {
        self.unlink(at as u16);
        let slot = &mut self.slots[at];
        slot.timed = None;
        slot.generation = slot.generation.wrapping_add(1).max(1);
        slot.queue = FREE;
        slot.prev = NIL;
        slot.next = self.free;
        self.free = at as u16;
        self.len -= 1;
    }
}

#[cfg(test)]
impl<K: Copy + PartialEq> SynTimer<K> {
    /// The live entry of `ticket`, whoever's it is.
    fn entry(&self, ticket: Ticket) -> Option<Timed<K>> {
        let slot = self.slots.get(ticket.index())?;
        slot.timed
            .filter(|_| slot.generation == ticket.generation())
    }

    /// Every FIFO well linked and in order, every live entry in one of them, every
    /// other entry in the free list.
    fn check(&self) {
        let mut linked = 0;
        for (port, queues) in self.queues.iter().enumerate() {
            for (queue, fifo) in queues.iter().enumerate() {
                let (mut at, mut prev, mut due) = (fifo.head, NIL, 0);
                while at != NIL {
                    let slot = &self.slots[usize::from(at)];
                    let t = slot.timed.expect("a linked entry is live");
                    assert_eq!((slot.prev, usize::from(slot.queue)), (prev, queue));
                    assert_eq!(usize::from(t.port), port);
                    if queue == KICKED {
                        assert!(t.sent < t.retries, "kicked without a retry left");
                    } else {
                        assert_eq!(usize::from(t.sent), queue, "in its count's FIFO");
                        assert!(t.due_tsc >= due, "FIFO {port}/{queue} out of due order");
                        due = t.due_tsc;
                    }
                    linked += 1;
                    (prev, at) = (at, slot.next);
                }
                assert_eq!(fifo.tail, prev);
            }
        }
        assert_eq!(linked, self.len);
        let (mut free, mut at) = (0, self.free);
        while at != NIL {
            let slot = &self.slots[usize::from(at)];
            assert!(slot.timed.is_none() && slot.queue == FREE);
            free += 1;
            at = slot.next;
        }
        assert_eq!(free + self.len, self.slots.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    const L2: [u8; 14] = [2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 8, 0];

    /// Scans port 0 at `now` with every connection in `status`, `room` deciding
    /// whether each act succeeds; returns what was acted on.
    fn scan(
        timer: &mut SynTimer<u32>,
        now: u64,
        status: Status,
        room: bool,
    ) -> Vec<(u32, u8, Due)> {
        let mut acted = Vec::new();
        timer.scan(
            0,
            now,
            &mut acted,
            |_, _| status,
            |acted, t, due| {
                acted.push((t.session, t.sent, due));
                room
            },
        );
        timer.check();
        acted
    }

    #[test]
    fn the_synproxy_syn_goes_again_after_1_2_and_4_then_gives_up_after_8() {
        let mut timer = SynTimer::new(1000, 1);
        let ticket = timer.arm(7, 99, Some(5), 0, 3, &L2, 0).unwrap();
        let entry = timer.entry(ticket).unwrap();
        assert_eq!(entry.l2(), &L2);
        assert_eq!(entry.tsval(), Some(5));
        assert_eq!(
            std::mem::size_of::<Slot<crate::session::SessionId>>(),
            56,
            "the entry docs/SYNPROXY.md counts"
        );
        let mut log = Vec::new();
        for now in 0..20_000 {
            for (session, sent, due) in scan(&mut timer, now, Status::Waiting, true) {
                log.push((now, session, sent, due));
            }
        }
        assert_eq!(
            log,
            [
                (1000, 7, 0, Due::Resend),
                (3000, 7, 1, Due::Resend),
                (7000, 7, 2, Due::Resend),
                (15_000, 7, 3, Due::GiveUp),
            ]
        );
        assert!(timer.is_empty(), "given up: forgotten");
        assert!(
            !timer.forget(ticket, 7),
            "given up: its ticket frees nothing"
        );
    }

    #[test]
    fn the_synproxy_timer_forgets_what_no_longer_waits_and_waits_when_there_is_no_room() {
        let mut timer = SynTimer::new(1000, 1);
        assert!(timer.arm(1, 1, None, 0, 1, &L2, 0).is_some());
        // Another port's connection is not this scan's.
        let other = timer.arm(2, 2, None, 1, 1, &L2, 0).unwrap();
        assert!(scan(&mut timer, 999, Status::Waiting, true).is_empty());
        // No room at its time: tried again at the next scan, still the first retry.
        assert_eq!(
            scan(&mut timer, 1000, Status::Waiting, false),
            [(1, 0, Due::Resend)]
        );
        assert_eq!(
            scan(&mut timer, 1001, Status::Waiting, true),
            [(1, 0, Due::Resend)]
        );
        // Then the session ends without a word to the timer: at its time it is asked,
        // and forgotten.
        assert!(scan(&mut timer, 3000, Status::Gone, true).is_empty());
        assert_eq!(timer.len(), 2, "not due yet: not asked");
        assert!(scan(&mut timer, 3001, Status::Gone, true).is_empty());
        assert_eq!(timer.len(), 1);
        assert_eq!(timer.entry(other).map(|t| t.port), Some(1));
        // The server of the other answers: forgotten at once.
        assert!(timer.forget(other, 2));
        assert!(timer.is_empty());
        timer.check();
    }

    #[test]
    fn a_kicked_synproxy_syn_goes_at_once_within_its_retries() {
        let mut timer = SynTimer::new(1000, 1);
        let ticket = timer.arm(3, 3, None, 0, 1, &L2, 0).unwrap();
        assert!(timer.kick(ticket, 3));
        assert!(timer.kick(ticket, 3), "kicked twice: once");
        // No room: still kicked at the next scan.
        assert_eq!(
            scan(&mut timer, 9, Status::Waiting, false),
            [(3, 0, Due::Resend)]
        );
        assert_eq!(
            scan(&mut timer, 10, Status::Waiting, true),
            [(3, 0, Due::Resend)]
        );
        // No retry left: a kick waits for the give-up, 2000 after the resend.
        assert!(!timer.kick(ticket, 3));
        assert!(scan(&mut timer, 20, Status::Waiting, true).is_empty());
        assert!(scan(&mut timer, 2009, Status::Waiting, true).is_empty());
        assert_eq!(
            scan(&mut timer, 2010, Status::Waiting, true),
            [(3, 1, Due::GiveUp)]
        );
    }

    #[test]
    fn the_synproxy_timer_is_bounded_and_scans_once_a_period() {
        let mut timer = SynTimer::new(1000, 100);
        assert!(!timer.scan_due(0), "nothing timed: no scan");
        for i in 0..CAPACITY as u32 {
            assert!(timer.arm(i, i, None, 0, 3, &L2, 0).is_some());
        }
        assert!(timer.arm(0, 0, None, 0, 3, &L2, 0).is_none(), "full");
        assert_eq!(timer.slots.capacity(), CAPACITY, "never grown");
        let mut timer = SynTimer::new(1000, 100);
        assert!(timer.arm(0, 0, None, 0, 3, &[0; L2_MAX + 1], 0).is_none());
        assert!(timer.arm(0, 0, None, PORTS as u16, 3, &L2, 0).is_none());
        assert!(timer.arm(0, 0, None, PORTS as u16 - 1, 3, &L2, 0).is_some());
        assert!(timer.scan_due(5));
        assert!(!timer.scan_due(104));
        assert!(timer.scan_due(105));
    }

    #[test]
    fn a_stale_synproxy_timer_ticket_frees_nothing() {
        let mut timer = SynTimer::with_capacity(2, 1000, 1);
        let a = timer.arm(1, 10, None, 0, 3, &L2, 0).unwrap();
        let b = timer.arm(2, 20, None, 0, 3, &L2, 0).unwrap();
        assert!(timer.arm(3, 30, None, 0, 3, &L2, 0).is_none(), "full");
        assert!(!timer.forget(a, 2), "another session's ticket");
        assert!(timer.forget(a, 1), "answered: freed at once");
        assert!(!timer.forget(a, 1), "once");
        // The freed entry goes to the next connection, of the same session slot even.
        let c = timer.arm(1, 11, None, 0, 3, &L2, 5).unwrap();
        assert_eq!(a.index(), c.index());
        assert!(!timer.forget(a, 1) && !timer.kick(a, 1), "the old ticket");
        assert_eq!(timer.entry(c).map(|t| t.cookie), Some(11));
        assert_eq!(timer.len(), 2);
        assert!(timer.kick(c, 1));
        assert!(timer.forget(c, 1), "kicked, and still freed by its ticket");
        assert!(timer.forget(b, 2));
        assert!(timer.is_empty());
        timer.check();
    }

    #[test]
    fn a_synproxy_timer_scan_looks_only_at_what_is_due() {
        let mut timer = SynTimer::with_capacity(2000, 10_000, 1);
        let mut tickets = Vec::new();
        for i in 0..1000u32 {
            tickets.push(timer.arm(i, i, None, 0, 3, &L2, u64::from(i)).unwrap());
            // Another port's, all due: never this port's scan's.
            assert!(timer.arm(i, i, None, 1, 3, &L2, 0).is_some());
        }
        let looked = Cell::new(0);
        let scan_at = |timer: &mut SynTimer<u32>, now| {
            looked.set(0);
            let mut acted = 0;
            timer.scan(
                0,
                now,
                &mut acted,
                |_, _| {
                    looked.set(looked.get() + 1);
                    Status::Waiting
                },
                |acted, _, _| {
                    *acted += 1;
                    true
                },
            );
            timer.check();
            (looked.get(), acted)
        };
        assert_eq!(
            scan_at(&mut timer, 9_999),
            (0, 0),
            "none due: none looked at"
        );
        assert_eq!(scan_at(&mut timer, 10_004), (5, 5), "the five due");
        timer.kick(tickets[500], 500);
        assert_eq!(
            scan_at(&mut timer, 10_005),
            (2, 2),
            "the next due, the kicked"
        );
        assert_eq!(scan_at(&mut timer, 10_005), (0, 0));
        assert_eq!(timer.len(), 2000);
    }

    /// The timer as it was: a list, every entry of the port asked where it stands at
    /// every scan. The reference the FIFOs must match (a connection that stops
    /// waiting leaves it at once here too, as the FIFOs do it).
    struct Reference {
        list: Vec<Timed<u32>>,
        capacity: usize,
        first: u64,
    }

    #[derive(Clone, Copy, PartialEq)]
    enum Was {
        Gone,
        Waiting,
        Kicked,
    }

    impl Reference {
        fn arm(&mut self, session: u32, cookie: u32, port: u16, retries: u8, now: u64) -> bool {
            if self.list.len() >= self.capacity {
                return false;
            }
            self.list.push(Timed {
                session,
                cookie,
                tsval: 0,
                has_tsval: false,
                port,
                sent: 0,
                retries,
                l2_len: 0,
                l2: [0; L2_MAX],
                due_tsc: now + self.first,
            });
            true
        }

        fn forget(&mut self, cookie: u32) -> bool {
            let before = self.list.len();
            self.list.retain(|t| t.cookie != cookie);
            self.list.len() < before
        }

        fn scan(
            &mut self,
            port: u16,
            now: u64,
            status: impl Fn(&Timed<u32>) -> Was,
            mut act: impl FnMut(&Timed<u32>, Due) -> bool,
        ) {
            let mut i = 0;
            while i < self.list.len() {
                let t = self.list[i];
                if t.port != port {
                    i += 1;
                    continue;
                }
                let state = status(&t);
                if state == Was::Gone {
                    self.list.swap_remove(i);
                    continue;
                }
                let due = now >= t.due_tsc;
                if (due || state == Was::Kicked) && t.sent < t.retries {
                    if act(&t, Due::Resend) {
                        let e = &mut self.list[i];
                        e.sent += 1;
                        e.due_tsc = now + (self.first << e.sent);
                    }
                } else if due && act(&t, Due::GiveUp) {
                    self.list.swap_remove(i);
                    continue;
                }
                i += 1;
            }
        }
    }

    struct Conn {
        session: u32,
        port: u16,
        retries: u8,
        ticket: Option<Ticket>,
        /// In the timer: armed, not forgotten, not given up.
        timed: bool,
        /// The server was sent a stale reset and the SYN has not gone again since
        /// (the side entry's flag the old scan read).
        kicked: bool,
        sent: u8,
        given_up: bool,
    }

    /// xorshift64*: the same sequence on every run.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    /// What both timers did at one scan: (cookie, sent before, what, done), sorted.
    type Acts = Vec<(u32, u8, Due, bool)>;

    #[test]
    fn the_synproxy_timer_fifos_do_what_the_scanned_list_did() {
        const CAP: usize = 12;
        const SESSIONS: u64 = 20;
        const FIRST: u64 = 8;
        for seed in 1..=300u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
            let mut timer = SynTimer::with_capacity(CAP, FIRST, 1);
            let mut reference = Reference {
                list: Vec::new(),
                capacity: CAP,
                first: FIRST,
            };
            // By cookie (the index): every connection ever opened.
            let mut conns: Vec<Conn> = Vec::new();
            // Per session slot, its live connection's cookie.
            let mut live: Vec<Option<u32>> = vec![None; SESSIONS as usize];
            let mut now = 0u64;
            let mut resends = 0;
            let mut step = |rng: &mut Rng,
                            timer: &mut SynTimer<u32>,
                            reference: &mut Reference,
                            conns: &mut Vec<Conn>,
                            live: &mut Vec<Option<u32>>,
                            now: &mut u64,
                            op: u64,
                            room_share: u64| {
                match op {
                    // A connection opens on a session slot (its old one, if any, ended:
                    // its slot is taken, its ticket comes back).
                    0..=29 => {
                        let session = rng.below(SESSIONS) as u32;
                        if let Some(old) = live[session as usize].take() {
                            let c = &mut conns[old as usize];
                            if let Some(ticket) = c.ticket {
                                assert_eq!(timer.forget(ticket, session), c.timed);
                            }
                            assert_eq!(reference.forget(old), c.timed);
                            c.timed = false;
                        }
                        let cookie = conns.len() as u32;
                        let (port, retries) = (rng.below(2) as u16, rng.below(6) as u8);
                        let ticket = timer.arm(session, cookie, None, port, retries, &L2, *now);
                        let armed = reference.arm(session, cookie, port, retries, *now);
                        assert_eq!(ticket.is_some(), armed, "full at the same time");
                        conns.push(Conn {
                            session,
                            port,
                            retries,
                            ticket,
                            timed: armed,
                            kicked: false,
                            sent: 0,
                            given_up: false,
                        });
                        live[session as usize] = Some(cookie);
                    }
                    // The server answers, or the client resets, or the session ends.
                    30..=49 => {
                        let session = rng.below(SESSIONS) as usize;
                        if let Some(cookie) = live[session].take() {
                            let c = &mut conns[cookie as usize];
                            if let Some(ticket) = c.ticket {
                                assert_eq!(timer.forget(ticket, c.session), c.timed);
                            }
                            assert_eq!(reference.forget(cookie), c.timed);
                            c.timed = false;
                        }
                    }
                    // A stale reset to the server.
                    50..=64 => {
                        let session = rng.below(SESSIONS) as usize;
                        if let Some(cookie) = live[session] {
                            let c = &mut conns[cookie as usize];
                            if let Some(ticket) = c.ticket {
                                let kicked = timer.kick(ticket, c.session);
                                assert_eq!(kicked, c.timed && c.sent < c.retries);
                            }
                            c.kicked = true;
                        }
                    }
                    // Old tickets, and live ones with the wrong session.
                    65..=74 => {
                        let Some(c) = conns.get(rng.below(conns.len() as u64 + 1) as usize) else {
                            return;
                        };
                        let Some(ticket) = c.ticket else {
                            return;
                        };
                        let session = if c.timed { c.session + 1 } else { c.session };
                        assert!(!timer.kick(ticket, session));
                        assert!(!timer.forget(ticket, session));
                    }
                    // Time goes on; each port is scanned.
                    _ => {
                        *now += rng.below(4);
                        for port in 0..2 {
                            let room = |cookie: u32, sent: u8| {
                                let h = (u64::from(cookie) << 32 | *now << 4 | u64::from(sent))
                                    .wrapping_mul(0x9e37_79b9_7f4a_7c15);
                                (h >> 40) % 100 < room_share
                            };
                            let mut ours: Acts = Vec::new();
                            timer.scan(
                                port,
                                *now,
                                &mut ours,
                                |_, t| {
                                    let c = &conns[t.cookie as usize];
                                    assert!(c.timed && c.session == t.session, "phantom");
                                    Status::Waiting
                                },
                                |ours, t, due| {
                                    let done = room(t.cookie, t.sent);
                                    ours.push((t.cookie, t.sent, due, done));
                                    done
                                },
                            );
                            let mut theirs: Acts = Vec::new();
                            reference.scan(
                                port,
                                *now,
                                |t| match &conns[t.cookie as usize] {
                                    c if !c.timed => Was::Gone,
                                    c if c.kicked => Was::Kicked,
                                    _ => Was::Waiting,
                                },
                                |t, due| {
                                    let done = room(t.cookie, t.sent);
                                    theirs.push((t.cookie, t.sent, due, done));
                                    done
                                },
                            );
                            ours.sort_by_key(|a| (a.0, a.1));
                            theirs.sort_by_key(|a| (a.0, a.1));
                            assert_eq!(ours, theirs, "seed {seed}, port {port} at {now}");
                            for (cookie, sent, due, done) in ours {
                                let c = &mut conns[cookie as usize];
                                assert_eq!((c.port, c.sent), (port, sent));
                                match (due, done) {
                                    (Due::Resend, true) => {
                                        c.sent += 1;
                                        c.kicked = false;
                                        resends += 1;
                                    }
                                    (Due::GiveUp, true) => {
                                        assert!(!c.given_up);
                                        c.given_up = true;
                                        c.timed = false;
                                    }
                                    _ => {}
                                }
                            }
                        }
                    }
                }
                timer.check();
                assert_eq!(timer.len(), reference.list.len(), "seed {seed}");
                assert!(timer.len() <= CAP);
            };
            for _ in 0..2000 {
                let op = rng.below(100);
                step(
                    &mut rng,
                    &mut timer,
                    &mut reference,
                    &mut conns,
                    &mut live,
                    &mut now,
                    op,
                    80,
                );
            }
            // Time runs on with room for all: whatever still waits is given up.
            let end = now + (FIRST << 7);
            while now < end {
                step(
                    &mut rng,
                    &mut timer,
                    &mut reference,
                    &mut conns,
                    &mut live,
                    &mut now,
                    99,
                    100,
                );
            }
            assert!(timer.is_empty() && reference.list.is_empty());
            for c in &conns {
                assert!(!c.timed, "seed {seed}: lost");
                assert!(!c.given_up || c.sent == c.retries, "given up early");
            }
            assert!(resends > 0 && conns.iter().any(|c| c.given_up));
        }
    }
}
