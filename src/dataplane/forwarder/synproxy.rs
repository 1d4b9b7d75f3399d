//! The SYN proxy stage ([`crate::forward::synproxy`] does the packet work): for a TCP
//! service with the proxy on, a SYN without a session is answered with a cookie
//! SYN-ACK and opens nothing; an ACK without a session that carries a valid cookie
//! opens the session and becomes the SYN to the real server; the real server's SYN-ACK
//! is absorbed and becomes the ACK that completes its handshake; from then on egress
//! translates every segment of the session.
//!
//! Per session, the proxy needs what the cookie handshake left (while the real server
//! has not answered) or the translation (after). Neither fits in the 64-byte session:
//! they live in a per-worker side array indexed by the session's slot, 16 bytes per
//! slot, allocated zeroed (so the kernel maps a page only once a session in it was
//! proxied) and read only for sessions flagged [`SessionFlags::SYNPROXY`]. A slot's
//! entry is written when a proxied session opens, so a reused slot never reads a
//! previous session's entry.
//!
//! The client's segments with data that come before the real server has answered
//! wait in [`Awaiting`] (the worker moves the frames there on
//! [`Action::AwaitServer`]) and go through the forwarder again once the session no
//! longer waits: the client need not retransmit its request.
//!
//! The SYN to the real server is timed ([`SynTimer`]): while the server does not
//! answer, the worker's housekeeping rebuilds the client's cookie ACK from the side
//! entry and sends it through the forwarder, which makes the SYN of it as of a client
//! retransmitting its ACK; after the service's `syn_retries` the connection is given
//! up the way a client's reset ends it, and the client gets the reset a refused
//! connection gets. The timer's ticket for a session is kept by its slot, beside the
//! side array, so that whatever ends the wait (the server's SYN-ACK or reset, the
//! client's reset, the session's end, its slot reused) frees the timer's entry at
//! once, and a stale reset to the server finds it to kick.
use super::{Action, Context, Forwarder, Matched, SegmentSeq};
use crate::dataplane::awaiting::{AwaitServer, Awaiting, Released, Wait};
use crate::dataplane::counters::Event;
use crate::dataplane::synproxy_retry::{Due, Status, SynTimer, Ticket, Timed, CAPACITY};
use crate::dpdk::{Burst, Mempool, Packet};
use crate::flow::parse::{classify, Parsed};
use crate::forward::synproxy::{self, AckCheck, Handshake, SipKey, Translation, MSS_TABLE};
use crate::forward::timestamps;
use crate::model::{DropReason, Protocol, SynProxyMode};
use crate::session::replication::SynproxyDelta;
use crate::session::{Direction, Session, SessionFlags, SessionId};
use crate::wire::ethernet::MacAddr;
use crate::wire::tcp::TcpFlags;
use std::net::Ipv4Addr;

/// Meta word: the entry holds a handshake waiting for the real server.
const PENDING: u32 = 1 << 31;
/// Meta word, with PENDING: the client reset the connection before the real server
/// answered, and the server was sent the reset. Nothing more passes either way: a
/// SYN-ACK already on its way must not be completed into a connection nobody uses.
const ABORTED: u32 = 1 << 28;
/// "No window scale" in a 4-bit field.
const NO_SCALE: u32 = 0xf;

/// How long a client segment may wait for its real server's handshake: past the
/// server's first SYN-ACK retransmission (1 s on Linux), which answers a lost
/// SYN-ACK; a server silent that long has its segments dropped.
const AWAIT_SERVER_MS: u64 = 3000;

/// The SYN to a real server is sent again after this long without its SYN-ACK, then
/// after twice as long each time: a kernel's initial retransmission timeout (RFC 6298).
pub const SYN_TIMEOUT_MS: u32 = 1000;

/// The proxy's per-worker state.
pub(super) struct ProxyState {
    /// Per session slot: pending `[cookie, cookie TSval, client ISN, meta]` (meta:
    /// PENDING, MSS index bits 0-2, window scale 4-7, SACK 8, timestamps 9, window
    /// 12-27, ABORTED) or established `[seq delta, TS delta, 0, meta]` (meta: the server's
    /// window scale 0-3 and the client's 4-7 when only it scales).
    entries: Vec<[u32; 4]>,
    /// Per service (snapshot index): the `auto` mode's SYN rate meter.
    auto: Vec<AutoRate>,
    secret: &'static SipKey,
    /// TSC cycles a second: the `auto` meters' clock.
    tsc_hz: u64,
    /// Client segments waiting for their real server's handshake.
    awaiting: Awaiting,
    /// The sessions whose SYN waits for its real server's SYN-ACK.
    timer: SynTimer<SessionId>,
    /// Per session slot, the bits of its [`Ticket`] in `timer` (0: none), kept until
    /// the wait ends. Apart from `entries`, which has no room for it: only the timer's
    /// arming and the end of a wait touch it, never an established segment.
    tickets: Vec<u32>,
    /// The frames going through the forwarder are the timer's (its rebuilt cookie
    /// ACKs and resets), not the client's: counted as such.
    timer_frames: bool,
}

/// SYNs without a session in the current one-second window, and until when the proxy
/// stays on. Times are TSC cycles, which do not wrap in the life of a host: a meter
/// that never fired, or fired long ago, reads off whatever the clock says.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct AutoRate {
    /// The service's id (stable across snapshots).
    service: u32,
    window_start: u64,
    syns: u32,
    on_until: u64,
}

impl AutoRate {
    /// Counts a SYN at `now` (`second` cycles a second) and says whether the proxy is
    /// on: once a one-second window has seen more than `rate`, and until a whole
    /// window after that stays at or below it.
    fn count(&mut self, now: u64, second: u64, rate: u32) -> bool {
        if now.saturating_sub(self.window_start) >= second {
            self.window_start = now;
            self.syns = 0;
        }
        self.syns = self.syns.saturating_add(1);
        if self.syns > rate {
            self.on_until = now.saturating_add(2 * second);
        }
        now < self.on_until
    }
}

impl ProxyState {
    /// The state for a table of `capacity` slots, its SYN timer's first wait
    /// `syn_timeout_ms`.
    pub(super) fn new(capacity: usize, tsc_hz: u64, syn_timeout_ms: u32) -> ProxyState {
        let ms = tsc_hz / 1000;
        ProxyState {
            // Zeroed: the allocator takes it from fresh (lazily mapped) pages.
            entries: vec![[0u32; 4]; capacity],
            auto: Vec::new(),
            secret: SipKey::process(),
            tsc_hz,
            awaiting: Awaiting::new(ms * AWAIT_SERVER_MS),
            timer: SynTimer::new(ms * u64::from(syn_timeout_ms), ms),
            // Zeroed too, and mapped only as proxied sessions use its pages.
            tickets: vec![0u32; capacity],
            timer_frames: false,
        }
    }

    /// A new snapshot: one meter per service, in the snapshot's order (`ids`). A
    /// service it had keeps its meter: every publish (a health eviction, an edit, a
    /// reload, a VRRP change) would otherwise switch `auto` off in the middle of a
    /// flood, and let `auto_syn_rate` more SYNs a second open real sessions before
    /// cookies came back. Once per publish, not per packet.
    pub(super) fn reset_services(&mut self, ids: impl Iterator<Item = u32>) {
        let mut old = std::mem::take(&mut self.auto);
        old.sort_unstable_by_key(|m| m.service);
        self.auto = ids
            .map(|id| match old.binary_search_by_key(&id, |m| m.service) {
                Ok(at) => old[at],
                Err(_) => AutoRate {
                    service: id,
                    ..AutoRate::default()
                },
            })
            .collect();
    }

    fn pending(&self, id: SessionId) -> Option<(Handshake, u32)> {
        decode_pending(*self.entries.get(id.index() as usize)?)
    }

    fn set_pending(&mut self, id: SessionId, hs: &Handshake) {
        // The slot's previous connection, if it still had an entry, waits no more.
        self.forget_timer(id);
        let index = synproxy::mss_index(Some(hs.mss)) as u32;
        let mut meta = PENDING | index | (hs.wscale.map_or(NO_SCALE, u32::from) << 4);
        if hs.sack {
            meta |= 1 << 8;
        }
        if hs.cookie_tsval.is_some() {
            meta |= 1 << 9;
        }
        meta |= u32::from(hs.window) << 12;
        if let Some(e) = self.entries.get_mut(id.index() as usize) {
            *e = [hs.cookie, hs.cookie_tsval.unwrap_or(0), hs.client_isn, meta];
        }
    }

    /// The real server of pending session `id` was sent a reset ending an older
    /// connection: the timer sends the SYN again at its next scan.
    fn kick(&mut self, id: SessionId) {
        let ticket = self
            .tickets
            .get(id.index() as usize)
            .and_then(|&bits| Ticket::from_bits(bits));
        if let Some(ticket) = ticket {
            self.timer.kick(ticket, id);
        }
    }

    /// Session `id`'s SYN was timed with `ticket`.
    fn timed(&mut self, id: SessionId, ticket: Ticket) {
        self.forget_timer(id);
        if let Some(bits) = self.tickets.get_mut(id.index() as usize) {
            *bits = ticket.bits();
        }
    }

    /// Session `id` (or the slot's connection before it) waits for its real server no
    /// more: its timer entry, if it still has one, is freed. Writes only a ticket that
    /// is there: a slot whose SYN was never timed (a standby's synced sessions) keeps
    /// its page unbacked.
    pub(super) fn forget_timer(&mut self, id: SessionId) {
        let Some(bits) = self.tickets.get_mut(id.index() as usize) else {
            return;
        };
        if let Some(ticket) = Ticket::from_bits(*bits) {
            *bits = 0;
            self.timer.forget(ticket, id);
        }
    }

    /// Session `id`, `s`, was removed from the table: if its SYN was timed, the entry
    /// goes with it.
    #[inline]
    pub(super) fn ended(&mut self, id: SessionId, s: &Session) {
        if s.flags().contains(SessionFlags::SYNPROXY) {
            self.forget_timer(id);
        }
    }

    /// The client of pending session `id` reset it.
    fn set_aborted(&mut self, id: SessionId) {
        if let Some(e) = self.entries.get_mut(id.index() as usize) {
            if e[3] & PENDING != 0 {
                e[3] |= ABORTED;
            }
        }
        self.forget_timer(id);
    }

    fn set_established(&mut self, id: SessionId, t: &Translation) {
        self.forget_timer(id);
        let scale = |s: Option<u8>| s.map_or(NO_SCALE, u32::from);
        let meta = scale(t.server_wscale) | (scale(t.client_wscale) << 4);
        if let Some(e) = self.entries.get_mut(id.index() as usize) {
            *e = [t.seq_delta, t.ts_delta, 0, meta];
        }
    }

    fn translation(&self, id: SessionId) -> Option<Translation> {
        self.translation_at(id.index())
    }

    fn translation_at(&self, index: u32) -> Option<Translation> {
        let [seq_delta, ts_delta, _, meta] = *self.entries.get(index as usize)?;
        if meta & PENDING != 0 {
            return None;
        }
        let scale = |s: u32| (s != NO_SCALE).then_some(s as u8);
        Some(Translation {
            seq_delta,
            ts_delta,
            server_wscale: scale(meta & 0xf),
            client_wscale: scale((meta >> 4) & 0xf),
        })
    }

    /// Bytes a slot: its side entry and its timer ticket.
    const SLOT_BYTES: usize = std::mem::size_of::<[u32; 4]>() + std::mem::size_of::<u32>();

    /// Bytes of the side array, the tickets and the SYN timer for a table of
    /// `capacity` slots.
    pub(super) fn bytes_for(capacity: usize) -> usize {
        capacity
            .saturating_mul(Self::SLOT_BYTES)
            .saturating_add(SynTimer::<SessionId>::bytes_for(CAPACITY))
    }

    /// Bytes of the side array, the tickets and the SYN timer (for the docs' cost line
    /// and the tests).
    pub(super) fn bytes(&self) -> usize {
        self.entries.len() * Self::SLOT_BYTES
            + SynTimer::<SessionId>::bytes_for(self.timer.capacity())
    }
}

/// What the proxy makes of a TCP segment without a session to service it covers.
pub(super) enum Miss {
    /// Not the proxy's: placement as usual.
    NotProxied,
    /// Answered (the cookie SYN-ACK) or dropped.
    Done(Action),
    /// A valid cookie: the segment is now the SYN to the real server (`Parsed` of the
    /// rewritten frame); open the session.
    Open(Handshake, Parsed),
    /// A valid cookie on an ACK that carries data (sequence number `u32`): open the
    /// session from the segment as it is, which then waits for the real server
    /// ([`AwaitServer::needs_syn`]: the SYN is made from a copy of it).
    OpenHeld(Handshake, u32),
}

/// What the proxy makes of a segment of a session still waiting for the real
/// server's SYN-ACK.
pub(super) enum Pending {
    /// Handled here (the server's SYN-ACK, turned into its ACK) or dropped.
    Done(Action),
    /// The client's segment is now another (`Parsed` of the rewritten frame, and its
    /// flags): the SYN again, or the reset the server can take. On to egress as that.
    Resend(Parsed, TcpFlags),
    /// Not a pending session (established, or not proxied): the usual path.
    No,
}

/// A segment that may answer a cookie SYN-ACK: ACK without SYN or RST. It may carry
/// data and a FIN (a client that sends its request and closes at once), as Linux's
/// syncookies take it.
#[inline]
pub(super) fn may_carry_cookie(flags: TcpFlags) -> bool {
    flags.contains(TcpFlags::ACK) && !flags.intersects(TcpFlags::SYN | TcpFlags::RST)
}

impl Forwarder {
    /// Whether service `index` may see cookie ACKs (the proxy on or auto).
    #[inline]
    pub(super) fn proxies(&self, index: usize) -> bool {
        self.snapshot
            .current()
            .services()
            .get(index)
            .is_some_and(|s| s.key.proto == Protocol::Tcp && s.synproxy.mode != SynProxyMode::Off)
    }

    /// The miss stage's hook, for a TCP segment admitted to service `index`.
    pub(super) fn synproxy_miss(
        &mut self,
        index: usize,
        pkt: &mut Packet,
        parsed: &Parsed,
        flags: TcpFlags,
        cx: &Context,
    ) -> Miss {
        let Some(sp) = self
            .snapshot
            .current()
            .services()
            .get(index)
            .map(|s| s.synproxy)
        else {
            return Miss::NotProxied;
        };
        if sp.mode == SynProxyMode::Off {
            return Miss::NotProxied;
        }
        let now_ms = self.ts_clock.now_ms();
        if flags.contains(TcpFlags::SYN) {
            if sp.mode == SynProxyMode::Auto && !self.auto_on(index, sp.auto_syn_rate, cx.now_tsc) {
                return Miss::NotProxied;
            }
            let secret = self.synproxy.secret;
            return match synproxy::answer_syn(
                pkt.with_tailroom_mut(),
                parsed,
                cx.port.mac,
                secret,
                now_ms,
            ) {
                Ok(len) if pkt.set_len(len as u16) => {
                    cx.counters.event(Event::SynproxyCookieSent);
                    Miss::Done(Action::Transmit)
                }
                Ok(_) => Miss::Done(Action::Drop(DropReason::Truncated)),
                Err(reason) => Miss::Done(Action::Drop(reason)),
            };
        }
        let hs = match synproxy::check_ack(pkt.bytes(), parsed, self.synproxy.secret, now_ms) {
            AckCheck::Valid(hs) => hs,
            AckCheck::Expired => {
                cx.counters.event(Event::SynproxyCookieExpired);
                return Miss::Done(Action::Drop(DropReason::TcpNoSession));
            }
            AckCheck::Invalid => {
                cx.counters.event(Event::SynproxyCookieInvalid);
                return Miss::Done(Action::Drop(DropReason::TcpNoSession));
            }
        };
        cx.counters.event(Event::SynproxyCookieValid);
        if let Some(seq) = data_seq(pkt.bytes(), parsed) {
            if self.synproxy.awaiting.has_room() {
                return Miss::OpenHeld(hs, seq);
            }
        }
        match rewrite_into_syn(pkt, parsed, &hs, hs.client_tsval) {
            Ok(parsed) => Miss::Open(hs, parsed),
            Err(reason) => Miss::Done(Action::Drop(reason)),
        }
    }

    /// A valid cookie ACK whose connection placement could not open (`reason`): the
    /// client holds an established connection already, so a drop would leave it
    /// waiting (resending its data until the cookie expires, minutes, or, if it
    /// waits for the server to speak first, for good). It is answered with a reset
    /// at the number it expects (the cookie ACK's acknowledgement number), whatever
    /// the reason and whatever `all_down` says: the client can only retry with a new
    /// connection. `pkt` is the cookie ACK, or the SYN to the real server made of it.
    pub(super) fn synproxy_refuse(
        &self,
        reason: DropReason,
        service: usize,
        hs: &Handshake,
        pkt: &mut Packet,
        parsed: &Parsed,
        cx: &Context,
    ) -> Action {
        let seq = hs.cookie.wrapping_add(1);
        match crate::forward::reset::reset_sender_at(pkt.bytes_mut(), parsed, cx.port.mac, seq) {
            Ok(len) if pkt.set_len(len as u16) => {
                cx.counters.event(Event::SynproxyRefused);
                if reason == DropReason::NoRealServer
                    && self.snapshot.current().resets_when_down(service)
                {
                    cx.counters.event(Event::AllDownReset);
                }
                Action::TransmitInstead(reason)
            }
            _ => Action::Drop(reason),
        }
    }

    /// `auto`: counts a SYN without a session for service `index` at `now_tsc` and
    /// says whether the proxy is on for it ([`AutoRate::count`]).
    fn auto_on(&mut self, index: usize, rate: u32, now_tsc: u64) -> bool {
        let second = self.synproxy.tsc_hz;
        self.synproxy
            .auto
            .get_mut(index)
            .is_some_and(|meter| meter.count(now_tsc, second, rate))
    }

    /// A proxied session was opened by placement: flag it and keep its handshake.
    pub(super) fn synproxy_opened(&mut self, m: &mut Matched, hs: &Handshake) {
        if let Some(live) = self.sessions.get_mut(m.id) {
            let mut flags = live.flags();
            flags.insert(SessionFlags::SYNPROXY);
            live.set_flags(flags);
            m.session = *live;
        }
        self.synproxy.set_pending(m.id, hs);
    }

    /// The first SYN of proxied session `id` (handshake `hs`, with `tsval`) is on its
    /// way, made of `frame` (L2 up to `l3` as the client's cookie ACK came): time it,
    /// unless its service says no retries.
    pub(super) fn synproxy_arm(
        &mut self,
        id: SessionId,
        hs: &Handshake,
        tsval: Option<u32>,
        frame: &[u8],
        l3: usize,
        cx: &Context,
    ) {
        let retries = self
            .sessions
            .get(id)
            .and_then(|s| self.snapshot.current().by_id(s.service))
            .map_or(0, |s| s.synproxy.syn_retries);
        if retries == 0 {
            return;
        }
        let l2 = frame.get(..l3).unwrap_or_default();
        let timed =
            (self.synproxy.timer).arm(id, hs.cookie, tsval, cx.port.index, retries, l2, cx.now_tsc);
        match timed {
            Some(ticket) => self.synproxy.timed(id, ticket),
            None => cx.counters.event(Event::SynproxyRetryFull),
        }
    }

    /// The hit stage's hook for a proxied session still waiting for the real server.
    pub(super) fn synproxy_pending(
        &mut self,
        id: SessionId,
        dir: Direction,
        pkt: &mut Packet,
        parsed: &Parsed,
        flags: TcpFlags,
        cx: &Context,
    ) -> Pending {
        if !self
            .sessions
            .get(id)
            .is_some_and(|s| s.flags().contains(SessionFlags::SYNPROXY))
        {
            return Pending::No;
        }
        let Some((hs, meta)) = self.synproxy.pending(id) else {
            return Pending::No;
        };
        if meta & ABORTED != 0 {
            return Pending::Done(Action::Drop(DropReason::ClientReset));
        }
        if dir == Direction::Inbound {
            // The client gave up: so must the server, or it holds the half-open
            // connection through its SYN-ACK retries. The reset goes in place of the
            // SYN a client segment would otherwise become, if the client can have
            // sent it: a sequence number within what the cookie SYN-ACK let it send
            // (65,535 bytes: a SYN-ACK's window is never scaled), acknowledging the
            // cookie if anything. Any other is an off-path guess, and is dropped.
            if flags.contains(TcpFlags::RST) {
                let Some((seq, ack)) = seq_and_ack(pkt.bytes(), parsed) else {
                    return Pending::Done(Action::Drop(DropReason::BadTcpHeader));
                };
                let sent = seq.wrapping_sub(hs.client_isn.wrapping_add(1));
                let acks_cookie =
                    !flags.contains(TcpFlags::ACK) || ack == hs.cookie.wrapping_add(1);
                if sent > u32::from(u16::MAX) || !acks_cookie {
                    return Pending::Done(Action::Drop(DropReason::ResetOutOfWindow));
                }
                let len = match synproxy::write_server_rst(pkt.bytes_mut(), parsed) {
                    Ok(len) => len,
                    Err(reason) => return Pending::Done(Action::Drop(reason)),
                };
                if !pkt.set_len(len as u16) {
                    return Pending::Done(Action::Drop(DropReason::Truncated));
                }
                let Ok(parsed) = classify(pkt.bytes()) else {
                    return Pending::Done(Action::Drop(DropReason::Truncated));
                };
                self.synproxy.set_aborted(id);
                cx.counters.event(if self.synproxy.timer_frames {
                    // The timer's: the server never answered the SYN's retries.
                    Event::SynproxyGaveUp
                } else {
                    Event::SynproxyClientReset
                });
                // Closed, not left in SYN_RECV as a client's reset leaves a session
                // (IPVS's table): the connection is over, its slot comes back after
                // the close timeout, and a SYN on its tuple opens a new one.
                if let Some(live) = self.sessions.get_mut(id) {
                    live.set_state(crate::session::TcpState::Close);
                }
                return Pending::Resend(parsed, TcpFlags::RST);
            }
            // Data (or a FIN) not held yet waits for the server's handshake.
            let data = data_seq(pkt.bytes(), parsed);
            if let Some(seq) = data {
                if self.synproxy.awaiting.may_hold(id.index(), seq) {
                    return Pending::Done(Action::AwaitServer(AwaitServer {
                        session: id.index(),
                        seq,
                        needs_syn: false,
                    }));
                }
            }
            // The client sent again (its ACK, or data held already or finding no room)
            // before the real server answered: the SYN may have been lost, so it goes
            // again in this segment's place. Or this is the copy of a held cookie ACK
            // with data, which becomes the first SYN the same way; or the timer's
            // rebuilt cookie ACK, the SYN sent again.
            let first =
                data.is_some_and(|seq| self.synproxy.awaiting.take_syn_copy(id.index(), seq));
            let tsval = timestamps::tsval(pkt.bytes(), parsed);
            return match rewrite_into_syn(pkt, parsed, &hs, tsval) {
                Ok(parsed) => {
                    if first {
                        let tsval = tsval.filter(|_| hs.cookie_tsval.is_some());
                        self.synproxy_arm(id, &hs, tsval, pkt.bytes(), parsed.l3, cx);
                    } else if self.synproxy.timer_frames {
                        cx.counters.event(Event::SynproxySynRetried);
                    } else {
                        cx.counters.event(Event::SynproxySynResent);
                    }
                    Pending::Resend(parsed, TcpFlags::SYN)
                }
                Err(reason) => Pending::Done(Action::Drop(reason)),
            };
        }
        let Some(server) = synproxy::read_server_synack(pkt.bytes(), parsed) else {
            return self.synproxy_not_synack(id, &hs, pkt, parsed, flags, cx);
        };
        if server.ack != hs.client_isn.wrapping_add(1) {
            // A SYN-ACK for another SYN than ours: a client in SYN-SENT resets it
            // (RFC 9293 3.10.7.3) and goes on waiting for its own.
            self.synproxy.kick(id);
            return reset_stale(pkt, parsed, cx);
        }
        let t = Translation::new(&hs, &server);
        self.synproxy.set_established(id, &t);
        cx.counters.event(Event::SynproxyConnection);
        // The server saw the client's window scale only if it agreed to scaling.
        let window = match t.client_wscale {
            Some(shift) => (u32::from(hs.window) << shift).min(65535) as u16,
            None => hs.window,
        };
        // The server echoes the TSval of the SYN (already in its own view): the ACK
        // carries it back with the server's TSval echoed.
        let ts = match (server.tsval, hs.cookie_tsval) {
            (Some(server_tsval), Some(_)) => {
                synproxy_echo(pkt.bytes(), parsed).map(|echo| (echo, server_tsval))
            }
            _ => None,
        };
        let frame = pkt.bytes_mut();
        let len = match synproxy::write_server_ack(frame, parsed, &server, window, ts) {
            Ok(len) => len,
            Err(reason) => return Pending::Done(Action::Drop(reason)),
        };
        if !pkt.set_len(len as u16) {
            return Pending::Done(Action::Drop(DropReason::Truncated));
        }
        // The session moves as if the SYN-ACK and the ACK had both passed.
        let bytes = u64::from(pkt.len());
        let counters = cx.counters;
        let answered = self.hit(
            id,
            Direction::Outbound,
            server_synack(),
            SegmentSeq::None,
            pkt,
            None,
            counters,
        );
        self.account_packet(&answered, bytes);
        let m = self.hit(
            id,
            Direction::Inbound,
            TcpFlags::ACK,
            SegmentSeq::None,
            pkt,
            None,
            counters,
        );
        // The ACK establishes the session: the real server's gauges move with it.
        self.account_transition(&m);
        // FullNAT TOA: this ACK completes the server's handshake, and it is the
        // segment TOA modules read the client's address from (when the socket is
        // made), so it carries the option.
        if m.session.flags().contains(SessionFlags::TOA_PENDING) {
            if let Ok(parsed) = classify(pkt.bytes()) {
                self.toa(pkt, &parsed, &m, TcpFlags::ACK, cx.port, cx.counters);
            }
        }
        let rs_ip = Ipv4Addr::from(m.session.real_addr);
        let rs_mac = self.next_hop(&m.session, cx.neighbours);
        Pending::Done(super::egress::address(
            pkt.bytes_mut(),
            rs_mac,
            rs_ip,
            cx.port,
        ))
    }

    /// The real server sent something else than the SYN-ACK its SYN waits for: what
    /// a client in SYN-SENT would make of it (RFC 9293 3.10.7.3), since the server sees
    /// one there.
    fn synproxy_not_synack(
        &mut self,
        id: SessionId,
        hs: &Handshake,
        pkt: &mut Packet,
        parsed: &Parsed,
        flags: TcpFlags,
        cx: &Context,
    ) -> Pending {
        let Some((seq, ack)) = seq_and_ack(pkt.bytes(), parsed) else {
            return Pending::Done(Action::Drop(DropReason::BadTcpHeader));
        };
        let acks_syn = flags.contains(TcpFlags::ACK) && ack == hs.client_isn.wrapping_add(1);
        if flags.contains(TcpFlags::RST) {
            // The server refuses the SYN. Only a reset acknowledging it does: any other
            // is not about this connection, and the translation below would land it
            // exactly where the client accepts it.
            if !acks_syn {
                return Pending::Done(Action::Drop(DropReason::ResetOutOfWindow));
            }
            // The client expects the server's numbers to start after the cookie.
            let t = Translation {
                seq_delta: hs.cookie.wrapping_add(1).wrapping_sub(seq),
                ..Translation::default()
            };
            self.synproxy.set_established(id, &t);
            return Pending::No;
        }
        if !flags.contains(TcpFlags::ACK) || acks_syn {
            // Neither a reset nor a SYN-ACK, and nothing to answer (no ACK, or one
            // that acknowledges the SYN): dropped, as SYN-SENT does.
            return Pending::Done(Action::Drop(DropReason::TcpNoSession));
        }
        // An ACK that is not the SYN-ACK: the server still holds an older connection
        // on this tuple (its TIME_WAIT ACK, or a challenge ACK). Splicing on it would
        // fix a translation from the old connection's numbers for good. A reset at
        // its acknowledgement number ends the old connection, and the SYN, sent again
        // by the timer at once (or on the client's next segment), then opens the new
        // one.
        self.synproxy.kick(id);
        reset_stale(pkt, parsed, cx)
    }

    /// Egress of an established proxied session: sequence numbers, SACK blocks,
    /// window and timestamps into the other side's view.
    pub(super) fn synproxy_translate(
        &self,
        pkt: &mut Packet,
        parsed: &Parsed,
        m: &Matched,
    ) -> Result<(), DropReason> {
        let Some(t) = self.synproxy.translation(m.id) else {
            return Ok(());
        };
        let frame = pkt.bytes_mut();
        match m.dir {
            Direction::Outbound => {
                synproxy::to_client(frame, parsed, &t)?;
                if t.ts_delta != 0 {
                    timestamps::shift(frame, parsed, t.ts_delta, 0)?;
                }
            }
            _ => {
                synproxy::to_server(frame, parsed, &t)?;
                if t.ts_delta != 0 {
                    timestamps::shift(frame, parsed, 0, t.ts_delta)?;
                }
            }
        }
        Ok(())
    }

    /// The translation of session `s` (in slot `index`) for a sync record: `None`
    /// unless the proxy spliced it. One still waiting for its real server has none to
    /// give; a standby taking it over would forward it untranslated.
    pub(super) fn synproxy_delta(&self, index: u32, s: &Session) -> Option<SynproxyDelta> {
        if !s.flags().contains(SessionFlags::SYNPROXY) {
            return None;
        }
        self.synproxy.translation_at(index).map(|t| SynproxyDelta {
            seq_delta: t.seq_delta,
            ts_delta: t.ts_delta,
            server_wscale: t.server_wscale,
            client_wscale: t.client_wscale,
        })
    }

    /// What the client's view of the server's sequence numbers is ahead of the
    /// server's own, for session `s` (`id`): 0 unless the proxy spliced it.
    pub(super) fn synproxy_seq_delta(&self, id: SessionId, s: &Session) -> u32 {
        self.synproxy_delta(id.index(), s)
            .map_or(0, |d| d.seq_delta)
    }

    /// Session sync (standby): session `id` was spliced by the peer's proxy, with
    /// `delta`: this node translates it the same way.
    pub(super) fn synproxy_install(&mut self, id: SessionId, delta: &SynproxyDelta) {
        if let Some(live) = self.sessions.get_mut(id) {
            let mut flags = live.flags();
            flags.insert(SessionFlags::SYNPROXY);
            live.set_flags(flags);
        }
        let t = Translation {
            seq_delta: delta.seq_delta,
            ts_delta: delta.ts_delta,
            server_wscale: delta.server_wscale,
            client_wscale: delta.client_wscale,
        };
        self.synproxy.set_established(id, &t);
    }

    /// Bytes of the proxy's side array.
    pub fn synproxy_bytes(&self) -> usize {
        self.synproxy.bytes()
    }

    /// Takes packet `i` of `from` (in from `port`), which `handle` answered with
    /// [`Action::AwaitServer`], to wait for its real server. False, and the packet
    /// stays in `from`, when there is no room.
    pub fn await_server(
        &mut self,
        from: &mut Burst,
        i: usize,
        what: AwaitServer,
        port: u16,
        now_tsc: u64,
    ) -> bool {
        self.synproxy.awaiting.hold(from, i, what, port, now_tsc)
    }

    /// Whether client segments wait for their real servers (then the worker calls
    /// [`Forwarder::release_awaiting`] after each poll).
    pub fn has_awaiting(&self) -> bool {
        !self.synproxy.awaiting.is_empty()
    }

    /// Whether the SYN timer's scan is due at `now_tsc` (then the worker calls
    /// [`Forwarder::synproxy_retry`] for each port). Starts its next period.
    pub fn synproxy_timer_due(&mut self, now_tsc: u64) -> bool {
        self.synproxy.timer.scan_due(now_tsc)
    }

    /// The SYN timer's frames for `port` (its MAC `port_mac`) at `now_tsc`, from
    /// `pool`: into `forward`, for `handle` (with [`Forwarder::synproxy_timer_frames`]
    /// on), the rebuilt cookie ACKs of the sessions whose SYN is due again (the
    /// forwarder makes the SYN of each, as of a client's retransmitted ACK) and, for
    /// those given up, the client's reset (which the forwarder sends the server as a
    /// bare reset, closing the session); into `to_client`, ready to send, their resets
    /// to the client, at the number it expects as for a refused connection. What finds
    /// no room waits for the next scan.
    pub fn synproxy_retry(
        &mut self,
        port: u16,
        port_mac: MacAddr,
        now_tsc: u64,
        pool: &Mempool,
        forward: &mut Burst,
        to_client: &mut Burst,
    ) {
        struct Cx<'a> {
            entries: &'a [[u32; 4]],
            sessions: &'a crate::session::SessionTable,
            pool: &'a Mempool,
            forward: &'a mut Burst,
            to_client: &'a mut Burst,
        }
        let ProxyState { entries, timer, .. } = &mut self.synproxy;
        let mut cx = Cx {
            entries,
            sessions: &self.sessions,
            pool,
            forward,
            to_client,
        };
        // Whatever ends a wait frees the entry then; this is for what would end one
        // without a word to the timer.
        let status = |cx: &Cx, t: &Timed<SessionId>| {
            let proxied = cx
                .sessions
                .get(t.session)
                .is_some_and(|s| s.flags().contains(SessionFlags::SYNPROXY));
            match cx.entries.get(t.session.index() as usize) {
                Some(&[cookie, _, _, meta])
                    if proxied
                        && cookie == t.cookie
                        && meta & PENDING != 0
                        && meta & ABORTED == 0 =>
                {
                    Status::Waiting
                }
                _ => Status::Gone,
            }
        };
        timer.scan(port, now_tsc, &mut cx, status, |cx, t, due| {
            let (Some(s), Some(entry)) = (
                cx.sessions.get(t.session),
                cx.entries.get(t.session.index() as usize),
            ) else {
                return false;
            };
            let Some((hs, _)) = decode_pending(*entry) else {
                return false;
            };
            let mut ack = [0u8; 128];
            let Ok(len) = synproxy::write_client_ack(&mut ack, t.l2(), &s.in_key(), &hs, t.tsval())
            else {
                return false;
            };
            // From the MAC the client's packets last came from, not the one it had when
            // the timer was set: going through the forwarder as a client's segment, the
            // frame would move the session's way back to the client to its source.
            if s.peer_mac != [0; 6] {
                ack[6..12].copy_from_slice(&s.peer_mac);
            }
            match due {
                Due::Resend => !cx.forward.is_full() && cx.forward.push_copy(cx.pool, &ack[..len]),
                Due::GiveUp => {
                    if cx.forward.is_full() || cx.to_client.is_full() {
                        return false;
                    }
                    let mut rst = ack;
                    let Ok(parsed) = classify(&ack[..len]) else {
                        return false;
                    };
                    let seq = hs.cookie.wrapping_add(1);
                    let (Ok(to_server), Ok(to_client)) = (
                        synproxy::write_server_rst(&mut rst, &parsed),
                        crate::forward::reset::reset_sender_at(
                            &mut ack[..len],
                            &parsed,
                            port_mac,
                            seq,
                        ),
                    ) else {
                        return false;
                    };
                    if !cx.forward.push_copy(cx.pool, &rst[..to_server]) {
                        return false;
                    }
                    // Without an mbuf for it the client is not told; the server's
                    // reset still ends the connection.
                    cx.to_client.push_copy(cx.pool, &ack[..to_client]);
                    true
                }
            }
        });
    }

    /// Whether the frames `handle` gets are the SYN timer's
    /// ([`Forwarder::synproxy_retry`]'s `forward`), counted as such.
    pub fn synproxy_timer_frames(&mut self, on: bool) {
        self.synproxy.timer_frames = on;
    }

    /// The waiting segments of `port` that may go on now, into `out` (empty) for
    /// `handle`: copies that become SYNs to real servers, then the segments of
    /// sessions whose server has answered. Those waiting past the hold time are
    /// freed.
    pub fn release_awaiting(
        &mut self,
        port: u16,
        now_tsc: u64,
        pool: &Mempool,
        out: &mut Burst,
    ) -> Released {
        let ProxyState {
            entries, awaiting, ..
        } = &mut self.synproxy;
        // A removed session's entry stays until its slot opens another proxied
        // session: what waits for it then waits until its deadline and is dropped.
        let session = |index: u32| match entries.get(index as usize).map(|e| e[3]) {
            Some(meta) if meta & ABORTED != 0 => Wait::Reset,
            Some(meta) if meta & PENDING != 0 => Wait::Waiting,
            _ => Wait::Answered,
        };
        awaiting.release(port, now_tsc, pool, session, out)
    }
}

/// The handshake a side entry holds while its session waits for the real server, and
/// its meta word; `None` for any other entry.
fn decode_pending(entry: [u32; 4]) -> Option<(Handshake, u32)> {
    let [cookie, cookie_tsval, client_isn, meta] = entry;
    if meta & PENDING == 0 {
        return None;
    }
    let wscale = (meta >> 4) & 0xf;
    let timestamps = meta & (1 << 9) != 0;
    Some((
        Handshake {
            client_isn,
            cookie,
            mss: MSS_TABLE[(meta & 7) as usize],
            wscale: (wscale != NO_SCALE).then_some(wscale as u8),
            sack: meta & (1 << 8) != 0,
            client_tsval: None,
            cookie_tsval: timestamps.then_some(cookie_tsval),
            window: (meta >> 12) as u16,
        },
        meta,
    ))
}

/// The sequence and acknowledgement numbers of a TCP segment.
fn seq_and_ack(frame: &[u8], parsed: &Parsed) -> Option<(u32, u32)> {
    let seg = crate::forward::tcp_segment(frame, parsed).ok()?;
    Some((
        crate::wire::read_u32(frame, seg.l4 + 4),
        crate::wire::read_u32(frame, seg.l4 + 8),
    ))
}

/// The sequence number of a TCP segment that carries data or a FIN (what the real
/// server has to get), else `None`.
fn data_seq(frame: &[u8], parsed: &Parsed) -> Option<u32> {
    let seg = crate::forward::tcp_segment(frame, parsed).ok()?;
    let flags = TcpFlags(*frame.get(seg.l4 + 13)?);
    let data = seg.ip_end.saturating_sub(seg.l4 + seg.header_len);
    (data > 0 || flags.contains(TcpFlags::FIN)).then(|| crate::wire::read_u32(frame, seg.l4 + 4))
}

fn server_synack() -> TcpFlags {
    TcpFlags(TcpFlags::SYN.0 | TcpFlags::ACK.0)
}

/// A real server's segment that acknowledges another SYN than the proxy's pending one
/// (an older connection's ACK, a SYN-ACK for another SYN): answered with a reset at
/// its acknowledgement number, as the client in SYN-SENT the server sees would.
fn reset_stale(pkt: &mut Packet, parsed: &Parsed, cx: &Context) -> Pending {
    match crate::forward::reset::answer_with_rst(pkt.bytes_mut(), parsed, cx.port.mac) {
        Ok(len) if pkt.set_len(len as u16) => {
            cx.counters.event(Event::SynproxyStaleReset);
            Pending::Done(Action::Transmit)
        }
        Ok(_) => Pending::Done(Action::Drop(DropReason::Truncated)),
        Err(reason) => Pending::Done(Action::Drop(reason)),
    }
}

/// The TSecr of the server's SYN-ACK: the TSval of the SYN it answers.
fn synproxy_echo(frame: &[u8], parsed: &Parsed) -> Option<u32> {
    let seg = crate::forward::tcp_segment(frame, parsed).ok()?;
    let options = frame.get(seg.l4 + 20..seg.l4 + seg.header_len)?;
    let at = timestamps::tsval_offset(options)?;
    Some(crate::wire::read_u32(options, at + 4))
}

/// Rewrites the client's segment in `pkt` into the SYN of handshake `hs` (with
/// `tsval`) and classifies the result.
fn rewrite_into_syn(
    pkt: &mut Packet,
    parsed: &Parsed,
    hs: &Handshake,
    tsval: Option<u32>,
) -> Result<Parsed, DropReason> {
    let tsval = tsval.filter(|_| hs.cookie_tsval.is_some());
    let len = synproxy::write_server_syn(pkt.with_tailroom_mut(), parsed, hs, tsval)?;
    if !pkt.set_len(len as u16) {
        return Err(DropReason::Truncated);
    }
    classify(pkt.bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_new_snapshot_keeps_the_meters_of_the_services_it_keeps() {
        let mut state = ProxyState::new(8, 1_000_000, SYN_TIMEOUT_MS);
        state.reset_services([10, 20, 30].into_iter());
        // Service 20 is under a flood: cookies until tick 500.
        state.auto[1].syns = 5000;
        state.auto[1].on_until = 500;
        let flooded = state.auto[1];
        // A publish drops service 10 and adds 15, which sorts before 20.
        state.reset_services([15, 20, 30].into_iter());
        assert_eq!(
            state.auto[1], flooded,
            "the flooded service keeps its meter"
        );
        assert_eq!(
            state.auto[0],
            AutoRate {
                service: 15,
                ..AutoRate::default()
            },
            "a new service starts afresh"
        );
        assert_eq!(state.auto.len(), 3);
        assert_eq!(state.auto[2].service, 30);
    }

    #[test]
    fn whatever_ends_a_wait_frees_its_synproxy_timer_entry_at_once() {
        use crate::flow::FlowKey4;
        use crate::model::ForwardMode;
        use crate::session::SessionTable;
        let mut table = SessionTable::with_capacity(8);
        let mut open = |sport: u16| {
            let key = FlowKey4::new(
                Protocol::Tcp,
                Ipv4Addr::new(192, 0, 2, 1),
                sport,
                Ipv4Addr::new(198, 51, 100, 1),
                80,
            );
            let mut s = Session::new(&key, ForwardMode::Nat, 0, 0, Ipv4Addr::LOCALHOST, 80);
            s.set_flags(SessionFlags::SYNPROXY);
            let id = table.insert(s, 0, 1000).unwrap();
            (id, s)
        };
        let hs = |cookie| Handshake {
            client_isn: 1,
            cookie,
            mss: 1460,
            wscale: None,
            sack: false,
            client_tsval: None,
            cookie_tsval: None,
            window: 1000,
        };
        let mut state = ProxyState::new(8, 1_000_000, SYN_TIMEOUT_MS);
        let arm = |state: &mut ProxyState, id: SessionId, cookie: u32| {
            state.set_pending(id, &hs(cookie));
            let ticket = state.timer.arm(id, cookie, None, 0, 3, &[], 0).unwrap();
            state.timed(id, ticket);
            ticket
        };
        let waiting = |state: &mut ProxyState, now| {
            let mut seen = Vec::new();
            state.timer.scan(
                0,
                now,
                &mut seen,
                |_, _| Status::Waiting,
                |seen, t, _| {
                    seen.push(t.cookie);
                    true
                },
            );
            seen
        };
        let (a, sa) = open(1);
        let (b, _) = open(2);
        let (c, _) = open(3);
        let (d, sd) = open(4);
        // The server's SYN-ACK (or its reset acknowledging the SYN).
        arm(&mut state, a, 10);
        state.set_established(a, &Translation::default());
        assert!(state.timer.is_empty(), "answered: forgotten at once");
        // The client's reset.
        arm(&mut state, b, 20);
        state.set_aborted(b);
        assert!(state.timer.is_empty(), "reset: forgotten at once");
        // A stale reset to the server: the SYN goes at the next scan, not in 1 s.
        arm(&mut state, c, 30);
        state.kick(c);
        assert_eq!(waiting(&mut state, 1), [30]);
        // The slot taken by another connection: the old one's entry goes.
        state.set_pending(c, &hs(31));
        assert!(state.timer.is_empty(), "slot reused: forgotten at once");
        // The session removed (expired, reclaimed).
        arm(&mut state, d, 40);
        state.ended(d, &sd);
        assert!(state.timer.is_empty(), "session ended: forgotten at once");
        // A slot's ticket that outlived its entry (given up by the timer) frees
        // nothing when its session ends, not another connection's entry in the
        // same slab entry.
        let old = arm(&mut state, a, 11);
        state
            .timer
            .scan(0, u64::MAX, &mut (), |_, _| Status::Gone, |_, _, _| true);
        assert!(state.timer.is_empty());
        let other = arm(&mut state, b, 21);
        assert_eq!(
            old.bits() & 0xffff,
            other.bits() & 0xffff,
            "the same slab entry"
        );
        state.kick(a);
        state.ended(a, &sa);
        assert_eq!(state.timer.len(), 1, "the other connection's entry stays");
        assert_eq!(waiting(&mut state, 1), [] as [u32; 0], "and is not kicked");
    }

    #[test]
    fn auto_is_off_until_the_rate_is_passed_whatever_the_clock_reads() {
        let second = 100;
        // Any clock reading: from start, and past 2^31 and 2^32 (a tick counter of
        // 10 ms from host boot passes 2^31 after 248 days).
        for start in [0, 1, 5, (1 << 31) + 5, (1 << 32) + 5, u64::from(u32::MAX)] {
            let mut meter = AutoRate::default();
            for i in 0..10 {
                assert!(
                    !meter.count(start + i, second, 10),
                    "SYN {i} at {start}: a meter that never fired reads off"
                );
            }
            assert!(meter.count(start + 10, second, 10), "past the rate: on");
            // Two seconds later, with the rate kept below, off again; and still off
            // long after.
            let later = start + 10 + 2 * second;
            assert!(!meter.count(later, second, 10), "{start}: off after 2 s");
            assert!(!meter.count(later + (1 << 31) + 3, second, 10));
            assert!(!meter.count(later + (1 << 32) + 3, second, 10));
        }
    }
}
