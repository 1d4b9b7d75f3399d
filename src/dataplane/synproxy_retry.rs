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
//! Few connections wait at once: one for each new connection during its server's
//! round trip. The list is fixed (no allocation after start-up) and scanned once a
//! millisecond while it holds anything; what no longer waits (the server answered, the
//! client reset it, the session is gone or its slot taken by another) is forgotten at
//! the next scan, so the list holds about a millisecond and a round trip's worth of
//! new connections. A connection that opens while the list is full is not timed (the
//! caller counts it), and its SYN goes again only on its client's next segment.
//!
//! What the SYN is rebuilt from (the handshake) stays in the proxy's side array; an
//! entry keeps only what is not there: the client's TSval on the SYN, the L2 header
//! and the port of the client's cookie ACK, and how many times it was sent again.
/// Connections one worker times at once: a millisecond's worth at a million new
/// proxied connections a second, 48 KiB.
pub const CAPACITY: usize = 1024;

/// The longest L2 header an entry keeps: Ethernet and two VLAN tags (what
/// [`crate::wire::ethernet::parse_l2`] walks).
pub const L2_MAX: usize = 22;

/// One connection whose SYN waits for its real server's SYN-ACK; `K` names its
/// session.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timed<K> {
    pub session: K,
    /// The handshake's cookie: the session's side entry still holds it unless its slot
    /// went to another proxied connection.
    pub cookie: u32,
    /// The TSval the first SYN carried (the client's, on its cookie ACK), if
    /// `has_tsval`: an `Option` would make the entry 56 bytes.
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

/// What the caller says of a timed connection at a scan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Status {
    /// No longer waiting for the server (answered, reset, gone): forgotten.
    Gone,
    /// Still waiting.
    Waiting,
    /// Still waiting, and the server was just sent a reset ending an older connection
    /// on the tuple: the SYN should go again now rather than at its time.
    Kicked,
}

/// What is due for a timed connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Due {
    /// The SYN again.
    Resend,
    /// It was sent `retries` times again and the last wait ran out: give up.
    GiveUp,
}

pub struct SynTimer<K> {
    /// Never grows past [`CAPACITY`], its capacity from the start.
    list: Vec<Timed<K>>,
    /// The first wait, in TSC cycles; each retry waits twice as long as the one before.
    first_tsc: u64,
    scan_tsc: u64,
    next_scan_tsc: u64,
}

impl<K: Copy> SynTimer<K> {
    /// A timer whose first wait is `first_tsc` cycles, scanned every `scan_tsc`.
    pub fn new(first_tsc: u64, scan_tsc: u64) -> SynTimer<K> {
        SynTimer {
            list: Vec::with_capacity(CAPACITY),
            first_tsc: first_tsc.max(1),
            scan_tsc,
            next_scan_tsc: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Times the SYN of `session` just sent at `now_tsc` (its handshake's `cookie`,
    /// with `tsval`, out `port`; the cookie ACK's L2 header `l2`), to be sent again
    /// up to `retries` times. False, and nothing kept, when the list is full or `l2`
    /// is longer than an entry holds.
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
    ) -> bool {
        if self.list.len() >= CAPACITY || l2.len() > L2_MAX {
            return false;
        }
        let mut copy = [0u8; L2_MAX];
        copy[..l2.len()].copy_from_slice(l2);
        self.list.push(Timed {
            session,
            cookie,
            tsval: tsval.unwrap_or(0),
            has_tsval: tsval.is_some(),
            port,
            sent: 0,
            retries,
            l2_len: l2.len() as u8,
            l2: copy,
            due_tsc: now_tsc.saturating_add(self.first_tsc),
        });
        true
    }

    /// Whether a scan is due at `now_tsc`: once every scan period, while anything is
    /// timed. Starts the next period.
    pub fn scan_due(&mut self, now_tsc: u64) -> bool {
        if self.list.is_empty() || now_tsc < self.next_scan_tsc {
            return false;
        }
        self.next_scan_tsc = now_tsc.saturating_add(self.scan_tsc);
        true
    }

    /// The connections of `port`: `status` says where each stands (in `cx`, the
    /// caller's state); those no longer waiting are forgotten; for those due (their
    /// time came, or kicked with retries left) `act` makes what is due and says
    /// whether it could (false: no room now; the entry stays as it was for the next
    /// scan). After a resend the next wait is twice the last; after a give-up the
    /// entry is forgotten.
    pub fn scan<C>(
        &mut self,
        port: u16,
        now_tsc: u64,
        cx: &mut C,
        status: impl Fn(&C, &Timed<K>) -> Status,
        mut act: impl FnMut(&mut C, &Timed<K>, Due) -> bool,
    ) {
        let mut i = 0;
        while i < self.list.len() {
            let t = self.list[i];
            if t.port != port {
                i += 1;
                continue;
            }
            let state = status(cx, &t);
            if state == Status::Gone {
                self.list.swap_remove(i);
                continue;
            }
            let due = now_tsc >= t.due_tsc;
            if (due || state == Status::Kicked) && t.sent < t.retries {
                if act(cx, &t, Due::Resend) {
                    let e = &mut self.list[i];
                    e.sent += 1;
                    let wait = self.first_tsc.saturating_mul(1 << e.sent.min(16));
                    e.due_tsc = now_tsc.saturating_add(wait);
                }
            } else if due && act(cx, &t, Due::GiveUp) {
                self.list.swap_remove(i);
                continue;
            }
            i += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const L2: [u8; 14] = [2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2, 8, 0];

    /// Scans at `now` with every connection in `status`, `room` deciding whether each
    /// act succeeds; returns what was acted on.
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
        acted
    }

    #[test]
    fn the_synproxy_syn_goes_again_after_1_2_and_4_then_gives_up_after_8() {
        let mut timer = SynTimer::new(1000, 1);
        assert!(timer.arm(7, 99, Some(5), 0, 3, &L2, 0));
        assert_eq!(timer.list[0].l2(), &L2);
        assert_eq!(timer.list[0].tsval(), Some(5));
        assert_eq!(
            std::mem::size_of::<Timed<crate::session::SessionId>>(),
            48,
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
    }

    #[test]
    fn the_synproxy_timer_forgets_what_no_longer_waits_and_waits_when_there_is_no_room() {
        let mut timer = SynTimer::new(1000, 1);
        assert!(timer.arm(1, 1, None, 0, 1, &L2, 0));
        // Another port's connection is not this scan's.
        assert!(timer.arm(2, 2, None, 1, 1, &L2, 0));
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
        // Then the server answers.
        assert!(scan(&mut timer, 5000, Status::Gone, true).is_empty());
        assert_eq!(timer.len(), 1);
        assert_eq!(timer.list[0].port, 1);
    }

    #[test]
    fn a_kicked_synproxy_syn_goes_at_once_within_its_retries() {
        let mut timer = SynTimer::new(1000, 1);
        assert!(timer.arm(3, 3, None, 0, 1, &L2, 0));
        assert_eq!(
            scan(&mut timer, 10, Status::Kicked, true),
            [(3, 0, Due::Resend)]
        );
        // No retry left: a kick waits for the give-up, 2000 after the resend.
        assert!(scan(&mut timer, 20, Status::Kicked, true).is_empty());
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
            assert!(timer.arm(i, i, None, 0, 3, &L2, 0));
        }
        assert!(!timer.arm(0, 0, None, 0, 3, &L2, 0), "full");
        assert!(!timer.arm(0, 0, None, 0, 3, &[0; L2_MAX + 1], 0));
        assert_eq!(timer.list.capacity(), CAPACITY, "never grown");
        assert!(timer.scan_due(5));
        assert!(!timer.scan_due(104));
        assert!(timer.scan_due(105));
    }
}
