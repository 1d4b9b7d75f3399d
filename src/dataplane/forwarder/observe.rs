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
        let c = &self.real_servers[m.session.real() as usize];
        match m.dir {
            Direction::Outbound => c.count_out(bytes),
            _ => c.count_in(bytes),
        }
    }

    /// Moves the real server's active/inactive gauges when `m` moved the session across
    /// that line, without counting a packet (the SYN proxy's own ACK to the server).
    #[inline]
    pub(super) fn account_transition(&mut self, m: &Matched) {
        let c = &self.real_servers[m.session.real() as usize];
        if let Some(t) = m.transition {
            if account(c, t) {
                self.load_changed(m.session.real());
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
    /// management core when the policy says the standby should hear of it. The
    /// verdict reads the live entry field by field; only an event copies it whole
    /// (see `Forwarder::hit` on copies of an entry a packet has just moved).
    #[inline]
    pub(super) fn sync_after_packet(&mut self, id: SessionId, t: Transition) {
        let Some(live) = self.sessions.get(id) else {
            return;
        };
        let since = live.ticks_since_sync(self.now_tick);
        let (proto, state, packets) = (live.proto, live.state(), live.udp_packets());
        let Some((kind, timeout_ms)) = self.sync_verdict(proto, state, t, packets, since) else {
            return;
        };
        let Some(s) = self.sessions.get(id).copied() else {
            return;
        };
        let Some(link) = &self.sync else {
            return;
        };
        let mut event = SessionEvent::new(kind, &s, timeout_ms);
        event.record.synproxy = self.synproxy_delta(id.index(), &s);
        link.rings[link.index].push(event);
        let now = self.now_tick;
        if let Some(live) = self.sessions.get_mut(id) {
            live.mark_synced(now);
        }
    }

    /// Passive health detection, for a TCP session its real server has not answered
    /// yet: the first segment from the server (an RST to the SYN is a refusal,
    /// anything else an answer), or in DR/TUN the client's handshake-completing ACK,
    /// counts as answered; in NAT and FullNAT, a client SYN resent after the passive
    /// window, unanswered. Not in DR and TUN: there the server's answer bypasses
    /// Sluice, so a resent SYN is only the client's word, and any client (or a SYN
    /// flood with a fixed source port) could resend SYNs at will and evict every
    /// server.
    pub(super) fn observe_new_connection(
        &mut self,
        id: SessionId,
        s: &Session,
        dir: Direction,
        flags: TcpFlags,
        from: TcpState,
    ) {
        let c = &self.real_servers[s.real() as usize];
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
                && matches!(s.mode, ForwardMode::Nat | ForwardMode::FullNat)
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
            self.load_changed(s.real());
            bump(&counters.sessions_expired, 1);
        }
    }
}

/// A TCP session that ends without its real server ever answering (NAT and FullNAT:
/// Sluice sees the answers; not DR and TUN, where it does not, and an expired
/// half-open session may be a spoofed SYN).
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::probe_acks::ProbeAcks;
    use crate::dataplane::realserver_stats::RealServerTotals;
    use crate::flow::FlowKey4;
    use std::net::Ipv4Addr;
    use std::sync::Arc;

    /// A client SYN resent after the passive window counts against the real server
    /// only where Sluice would have seen its answer (NAT, FullNAT); in DR and TUN it is
    /// the client's word alone, and anyone can resend SYNs. The handshake-completing
    /// ACK counts as answered in every mode.
    #[test]
    fn a_resent_syn_counts_as_unanswered_only_where_the_answer_passes_through() {
        for (mode, counted) in [
            (ForwardMode::Nat, 1),
            (ForwardMode::FullNat, 1),
            (ForwardMode::Dr, 0),
            (ForwardMode::Tun, 0),
        ] {
            let (_publisher, mut config) =
                super::super::test_config(&crate::service::ServiceTable::new(), 16);
            config.health = Some(super::super::HealthTap {
                source: Ipv4Addr::new(198, 18, 0, 1),
                sources6: Vec::new(),
                acks: Arc::new(ProbeAcks::new(61000..=61999)),
                passive_syn_ms: 800,
            });
            let mut f = Forwarder::new(config);
            let real = 7;
            let key = FlowKey4::new(
                Protocol::Tcp,
                Ipv4Addr::new(198, 18, 1, 7),
                40000,
                Ipv4Addr::new(198, 18, 0, 100),
                80,
            );
            let rs = Ipv4Addr::new(198, 18, 0, 11);
            let session = Session::new(&key, mode, 0, real, rs, 8080);
            let id = f.sessions.insert(session, 0, 100).unwrap();
            f.now_tick = f.passive_syn_ticks;
            let s = *f.sessions.get(id).unwrap();
            f.observe_new_connection(id, &s, Direction::Inbound, TcpFlags::SYN, TcpState::SynRecv);
            let totals = RealServerTotals::sum(&[Arc::clone(&f.real_servers)], real).passive;
            assert_eq!(
                (totals.unanswered, totals.answered),
                (counted, 0),
                "{mode:?}"
            );
            let s = *f.sessions.get(id).unwrap();
            f.observe_new_connection(id, &s, Direction::Inbound, TcpFlags::ACK, TcpState::SynRecv);
            let totals = RealServerTotals::sum(&[Arc::clone(&f.real_servers)], real).passive;
            assert_eq!(
                (totals.unanswered, totals.answered),
                (counted, 1),
                "{mode:?}"
            );
        }
    }
}
