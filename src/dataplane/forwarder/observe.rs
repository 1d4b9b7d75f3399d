//! Observers: what the packet path tells others about sessions without deciding
//! anything about the packet. Per-real-server accounting (packets, bytes,
//! active/inactive), passive health (did the real server answer?), session sync
//! (events for the standby), and the books of a session retired early.
use super::{extend_template, forget, Forwarder, Matched};
use crate::dataplane::counters::{bump, WorkerCounters};
use crate::dataplane::realserver_stats::{Passive, RealServerCounters};
use crate::dataplane::sync_events::{EventKind, PacketFacts, SessionEvent};
use crate::model::{ForwardMode, Protocol};
use crate::session::{Direction, Session, SessionFlags, SessionId, TcpState, Transition};
use crate::wire::tcp::TcpFlags;

impl Forwarder {
    /// Counts the packet (`bytes` long as it arrived) on its session's real server, in
    /// or out by direction, and moves the server's active/inactive gauges when the
    /// packet moved the session across that line.
    #[inline]
    pub(super) fn account_packet(&mut self, m: &Matched, bytes: u64) {
        self.account_transition(m);
        let c = &self.real_servers[m.session.real as usize];
        match m.dir {
            Direction::Outbound => c.count_out(bytes),
            _ => c.count_in(bytes),
        }
    }

    /// Moves the real server's active/inactive gauges when `m` moved the session across
    /// that line, without counting a packet (the SYN proxy's own ACK to the server).
    #[inline]
    pub(super) fn account_transition(&mut self, m: &Matched) {
        let c = &self.real_servers[m.session.real as usize];
        if let Some(t) = m.transition {
            if account(c, t) {
                self.load_changed(m.session.real);
            }
        }
    }

    /// What the sync policy says after a packet moved a session (IPv4 or IPv6) by
    /// `t`: the event for the standby and the session's timeout in ms, or `None`
    /// (no sync, or a busy synced session whose state did not move and whose refresh
    /// is not due, the common case, decided before the policy is asked).
    #[inline]
    pub(super) fn sync_verdict(
        &self,
        proto: Protocol,
        state: TcpState,
        t: Transition,
        packets: u32,
        ticks_since_sync: Option<u32>,
    ) -> Option<(EventKind, u32)> {
        let link = self.sync.as_ref()?;
        let timeout_ticks = self.timeouts.session(proto, state);
        if !t.changed() {
            if let Some(since) = ticks_since_sync {
                let period_ticks = link.policy.period_ms / self.tick_ms.max(1);
                if since < period_ticks.min(timeout_ticks / 2) {
                    return None;
                }
            }
        }
        let tick_ms = u64::from(self.tick_ms);
        let now_ms = u64::from(self.now_tick) * tick_ms;
        let timeout_ms = timeout_ticks.saturating_mul(self.tick_ms);
        let facts = PacketFacts {
            proto,
            transition: t,
            packets,
            timeout_ms,
            last_synced_ms: ticks_since_sync
                .map(|ticks| now_ms.saturating_sub(u64::from(ticks) * tick_ms)),
            now_ms,
        };
        link.policy.on_packet(&facts).map(|kind| (kind, timeout_ms))
    }

    /// Session sync, after a packet moved session `id` by `t`: an event for the
    /// management core when the policy says the standby should hear of it.
    #[inline]
    pub(super) fn sync_after_packet(&mut self, id: SessionId, s: &Session, t: Transition) {
        let since = s.ticks_since_sync(self.now_tick);
        let Some((kind, timeout_ms)) =
            self.sync_verdict(s.proto, s.state(), t, s.udp_packets(), since)
        else {
            return;
        };
        let Some(link) = &self.sync else {
            return;
        };
        let mut event = SessionEvent::new(kind, s, timeout_ms);
        event.record.synproxy = self.synproxy_delta(id.index(), s);
        link.rings[link.index].push(event);
        let now = self.now_tick;
        if let Some(live) = self.sessions.get_mut(id) {
            live.mark_synced(now);
        }
    }

    /// Passive health detection, for a TCP session its real server has not answered
    /// yet: the first segment from the server (an RST to the SYN is a refusal,
    /// anything else an answer), or in DR/TUN the client's handshake-completing ACK,
    /// counts as answered; a client SYN resent after the passive window, unanswered.
    pub(super) fn observe_new_connection(
        &mut self,
        id: SessionId,
        s: &Session,
        dir: Direction,
        flags: TcpFlags,
        from: TcpState,
    ) {
        let c = &self.real_servers[s.real as usize];
        let counted = match dir {
            Direction::Outbound => {
                let refused = flags.contains(TcpFlags::RST) && from == TcpState::SynRecv;
                c.count_passive(if refused {
                    Passive::Refused
                } else {
                    Passive::Answered
                });
                SessionFlags::ANSWERED
            }
            _ if flags.contains(TcpFlags::ACK) && !flags.contains(TcpFlags::SYN) => {
                c.count_passive(Passive::Answered);
                SessionFlags::ANSWERED
            }
            _ if flags == TcpFlags::SYN
                && !s.flags().contains(SessionFlags::PASSIVE_COUNTED)
                && self.now_tick.wrapping_sub(s.created) >= self.passive_syn_ticks =>
            {
                c.count_passive(Passive::Unanswered);
                SessionFlags::PASSIVE_COUNTED
            }
            _ => return,
        };
        if let Some(live) = self.sessions.get_mut(id) {
            live.set_flags(counted);
        }
    }

    /// Removes a session before its timeout (its tuple is wanted by a new connection),
    /// with the books of a session that ended: the standby hears it was deleted (when
    /// the policy says so), its persistence template is extended, its local port goes
    /// back and its real server's gauges drop.
    pub(super) fn retire(&mut self, id: SessionId, counters: &WorkerCounters) {
        if let Some(s) = self.sessions.remove(id) {
            self.synproxy.ended(id, &s);
            if let Some(link) = &self.sync {
                let synced = s.flags().contains(SessionFlags::SYNCED);
                if let Some(kind) = link.policy.on_end(EventKind::Deleted, synced) {
                    link.rings[link.index].push(SessionEvent::new(kind, &s, 0));
                }
            }
            extend_template(
                &self.persist,
                self.snapshot.current(),
                &s,
                self.now_tick,
                self.ticks_per_second,
            );
            forget(
                &mut self.pool,
                &self.real_servers,
                &s,
                self.ts_clock.now_ms(),
            );
            self.load_changed(s.real);
            bump(&counters.sessions_expired, 1);
        }
    }
}

/// A TCP session that ends without its real server ever answering (NAT and FullNAT:
/// Sluice sees the answers; DR and TUN rely on resent SYNs instead, since an expired
/// half-open session there may be a spoofed SYN).
#[inline]
pub(super) fn expired_unanswered(s: &Session) -> bool {
    s.proto == Protocol::Tcp
        && matches!(s.mode, ForwardMode::Nat | ForwardMode::FullNat)
        && !s.flags().contains(SessionFlags::ANSWERED)
        && !s.flags().contains(SessionFlags::PASSIVE_COUNTED)
}

/// Applies a session transition to the real server's active/inactive gauges; whether
/// they moved.
#[inline]
pub(super) fn account(c: &RealServerCounters, t: Transition) -> bool {
    use crate::session::ActivityChange;
    match t.activity_change() {
        Some(ActivityChange::BecameActive) => {
            RealServerCounters::gauge_add(&c.inactive, -1);
            RealServerCounters::gauge_add(&c.active, 1);
            true
        }
        Some(ActivityChange::BecameInactive) => {
            RealServerCounters::gauge_add(&c.active, -1);
            RealServerCounters::gauge_add(&c.inactive, 1);
            true
        }
        None => false,
    }
}
