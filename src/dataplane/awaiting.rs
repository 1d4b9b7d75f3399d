//! Client segments that reach a proxied session before its real server has answered.
//!
//! With the SYN proxy, the client's handshake ends at Sluice: the client sends its
//! request at once, while Sluice's SYN is still on its way to the real server. The
//! real server cannot take data before its own handshake ends, so these segments wait
//! here (the frames themselves, no copy), and go through the forwarder again once the
//! session no longer waits for the server: then they are translated and sent as any
//! segment of the session, after the ACK that completed the server's handshake. A
//! client need not retransmit them (its retransmission timeout is at least 200 ms;
//! the real server usually answers within a round trip on the LAN).
//!
//! Fixed size (one burst per worker, a few frames per session), no allocation. What
//! finds no room, or is already held (a retransmission: the SYN to the real server
//! may have been lost), goes the old way: it is sent as the SYN again, and the client
//! retransmits its data later. A frame held longer than the hold time (the real
//! server never answered) is dropped and counted.
use crate::dpdk::{Burst, Mempool, BURST_SIZE};

/// Frames one session may have waiting: a whole initial window. Before anything it
/// sent is acknowledged a client sends at most that many segments (10 on Linux and
/// most stacks, RFC 6928), so even an upload's first flight waits whole instead of
/// each segment past the limit going to the server as the SYN again. More than that
/// is a client with a larger window, and goes the old way.
pub const PER_SESSION: usize = 10;

/// What a held frame waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Waiting {
    /// The session's slot in the worker's table.
    session: u32,
    /// The segment's sequence number: a second frame of the session with the same
    /// one is the client's retransmission.
    seq: u32,
    /// The port it came in on (and leaves on).
    port: u16,
    deadline_tsc: u64,
    /// The frame is the ACK that carried the cookie: the SYN to the real server is
    /// still to be made (from a copy of it).
    needs_syn: bool,
    /// The copy that becomes the SYN is on its way through the forwarder: it is the
    /// first SYN, not one sent again ([`Awaiting::take_syn_copy`]).
    syn_copy: bool,
}

/// A segment the forwarder asks the worker to hold (`Action::AwaitServer`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AwaitServer {
    /// The session's slot in the worker's table (`SessionId::index`).
    pub session: u32,
    pub seq: u32,
    /// See [`Waiting::needs_syn`].
    pub needs_syn: bool,
}

/// What [`Awaiting::release`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Released {
    /// Frames moved out to go through the forwarder again.
    pub frames: usize,
    /// Copies made to become the SYN to the real server.
    pub syns: usize,
    /// Frames freed: held past their deadline.
    pub expired: usize,
    /// Frames freed: their client reset the connection.
    pub reset: usize,
}

/// Where the session a frame waits for stands (the caller's answer to
/// [`Awaiting::release`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wait {
    /// Still waiting for its real server.
    Waiting,
    /// The server answered (or the session is gone): the frame goes on.
    Answered,
    /// Its client reset it: the frame is freed.
    Reset,
}

pub struct Awaiting {
    frames: Burst,
    /// `waiting[i]` describes `frames` packet `i`.
    waiting: [Waiting; BURST_SIZE],
    hold_tsc: u64,
}

impl Awaiting {
    pub fn new(hold_tsc: u64) -> Awaiting {
        Awaiting {
            frames: Burst::new(),
            waiting: [Waiting {
                session: 0,
                seq: 0,
                port: 0,
                deadline_tsc: 0,
                needs_syn: false,
                syn_copy: false,
            }; BURST_SIZE],
            hold_tsc,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.frames.is_empty()
    }

    pub fn len(&self) -> usize {
        self.frames.len()
    }

    /// Whether one more frame fits.
    pub fn has_room(&self) -> bool {
        !self.frames.is_full()
    }

    /// Whether a segment `seq` of `session` would be held: there is room, the
    /// session has fewer than [`PER_SESSION`] frames waiting, and none with `seq`.
    pub fn may_hold(&self, session: u32, seq: u32) -> bool {
        if self.frames.is_full() {
            return false;
        }
        let mut mine = 0;
        for w in &self.waiting[..self.frames.len()] {
            if w.session == session {
                if w.seq == seq {
                    return false;
                }
                mine += 1;
            }
        }
        mine < PER_SESSION
    }

    /// Takes packet `i` of `from` (which came in on `port`) to wait as `what` says.
    /// False, and the packet stays in `from`, when there is no room.
    pub fn hold(
        &mut self,
        from: &mut Burst,
        i: usize,
        what: AwaitServer,
        port: u16,
        now_tsc: u64,
    ) -> bool {
        let slot = self.frames.len();
        if !from.move_to(i, &mut self.frames) {
            return false;
        }
        let deadline_tsc = now_tsc.saturating_add(self.hold_tsc);
        self.waiting[slot] = Waiting {
            session: what.session,
            seq: what.seq,
            port,
            deadline_tsc,
            needs_syn: what.needs_syn,
            syn_copy: false,
        };
        true
    }

    /// Whether a segment `seq` of `session` is the copy [`Awaiting::release`] made of
    /// a held cookie ACK to become the SYN to the real server (once: the flag is
    /// cleared). The forwarder sees it as the client sending a held segment again.
    pub fn take_syn_copy(&mut self, session: u32, seq: u32) -> bool {
        let total = self.frames.len();
        match self.waiting[..total]
            .iter_mut()
            .find(|w| w.syn_copy && w.session == session && w.seq == seq)
        {
            Some(w) => {
                w.syn_copy = false;
                true
            }
            None => false,
        }
    }

    /// For the frames of `port`, oldest first: a copy of each that still needs its
    /// SYN goes to `out` (it becomes that SYN in the forwarder; when `pool` is out of
    /// mbufs the client's retransmission does it later); those whose session no
    /// longer waits (`session` says) move to `out` after the copies, or are freed if
    /// its client reset it; those past their deadline are freed. `out` must be empty;
    /// what does not fit stays for the next call.
    pub fn release(
        &mut self,
        port: u16,
        now_tsc: u64,
        pool: &Mempool,
        session: impl Fn(u32) -> Wait,
        out: &mut Burst,
    ) -> Released {
        let mut done = Released::default();
        let total = self.frames.len();
        for i in 0..total {
            let w = &mut self.waiting[i];
            if w.port != port || !w.needs_syn || out.is_full() || session(w.session) == Wait::Reset
            {
                continue;
            }
            if out.push_copy(pool, self.frames.packet(i)) {
                w.needs_syn = false;
                w.syn_copy = true;
                done.syns += 1;
            }
        }
        let mut expired = Burst::new();
        let mut moved = [false; BURST_SIZE];
        for (i, (w, moved)) in self.waiting[..total].iter().zip(&mut moved).enumerate() {
            if w.port != port {
                continue;
            }
            let state = session(w.session);
            if state == Wait::Reset {
                *moved = self.frames.move_to(i, &mut expired);
                done.reset += usize::from(*moved);
            } else if !w.needs_syn && state == Wait::Answered {
                if out.is_full() {
                    continue;
                }
                *moved = self.frames.move_to(i, out);
                done.frames += usize::from(*moved);
            } else if now_tsc >= w.deadline_tsc {
                *moved = self.frames.move_to(i, &mut expired);
                done.expired += usize::from(*moved);
            }
        }
        if done.frames + done.expired + done.reset > 0 {
            self.frames.compact_moved();
            let mut kept = 0;
            for i in (0..total).filter(|&i| !moved[i]) {
                self.waiting[kept] = self.waiting[i];
                kept += 1;
            }
            debug_assert_eq!(kept, self.frames.len());
        }
        expired.free_all();
        done
    }
}
