//! Session sync of IPv6 sessions, both halves on the worker: after a packet, the event
//! for the standby when the sync policy says so (the same policy as IPv4); on the
//! standby, the peer's IPv6 records installed into, refreshed in or removed from the
//! worker's IPv6 session table.
use super::ipv6::{forget_v6, release_nat64_port};
use super::Forwarder;
use crate::dataplane::counters::Event;
use crate::dataplane::realserver_stats::RealServerCounters;
use crate::dataplane::sync_events::{EventKind, SessionEvent};
use crate::dpdk::Packet;
use crate::model::{ForwardMode, ServiceKey};
use crate::session::is_active;
use crate::session::replication::{RecordKind, RecordOp, RecordRepr};
use crate::session::table6::Session6;
use crate::session::Transition;
use std::net::{IpAddr, SocketAddrV4};

impl Forwarder {
    /// Session sync, after a packet moved IPv6 session `id` (`s`, as it is now) by
    /// `t`: an event for the management core when the policy says the standby should
    /// hear of it.
    #[inline]
    pub(super) fn sync_after_packet_v6(&mut self, id: u32, s: &Session6, t: Transition) {
        let since = s.ticks_since_sync(self.now_tick);
        let Some((kind, timeout_ms)) = self.sync_verdict(s.proto, s.state(), t, s.packets(), since)
        else {
            return;
        };
        let Some(link) = &self.sync else {
            return;
        };
        link.rings[link.index].push(SessionEvent::new6(kind, s, timeout_ms));
        let now = self.now_tick;
        if let Some(live) = self.sessions6.get_mut(id) {
            live.mark_synced(now);
        }
    }

    /// Session sync: IPv6 session `s` was retired before its time; a standby that
    /// heard of it drops its copy, as for IPv4 (`Forwarder::retire`), so the new
    /// connection on the same client key is not taken there for the old one.
    pub(super) fn sync_retired_v6(&self, s: &Session6) {
        let Some(link) = &self.sync else {
            return;
        };
        let synced = s.ticks_since_sync(self.now_tick).is_some();
        if let Some(kind) = link.policy.on_end(EventKind::Deleted, synced) {
            link.rings[link.index].push(SessionEvent::new6(kind, s, 0));
        }
    }

    /// Replies of a NAT, FullNAT or NAT64 session go to the MAC the client's packets
    /// last came from: a session a peer's record installed learns it from the client's
    /// first packet here, and one whose client side moved to another router follows it.
    #[inline]
    pub(super) fn learn_client_hop_v6(&mut self, id: u32, pkt: &Packet) {
        if let Some(s) = self.sessions6.get_mut(id) {
            if matches!(s.mode, ForwardMode::Nat | ForwardMode::FullNat) {
                if let Some(mac) = pkt.bytes().get(6..12) {
                    if s.peer_mac != mac {
                        s.peer_mac.copy_from_slice(mac);
                    }
                }
            }
        }
    }

    /// Session sync (standby): installs, refreshes or removes the peer's IPv6 session
    /// `r`. Returns the event to count, or `None` when the record cannot be installed
    /// (no such service or real server here, another mode, a local end that is not
    /// this worker's to use, or no room). A FullNAT session's local address and port
    /// are the active's choice: an IPv6 pair is taken by the session's reply key in
    /// the table itself (no other session can hold it), a NAT64 session's IPv4 pair is
    /// reserved in the service's pool, as an IPv4 FullNAT session's.
    pub(super) fn install_v6(&mut self, r: &RecordRepr) -> Option<Event> {
        if r.kind != RecordKind::Connection {
            return None;
        }
        let key = r.in_key6()?;
        let found = self.sessions6.lookup(&key, self.now_tick).map(|(id, _)| id);
        if r.op == RecordOp::Remove {
            if let Some(s) = found.and_then(|id| self.sessions6.remove(id)) {
                forget_v6(&self.real_servers, &s);
                release_nat64_port(&mut self.pool, &s, self.ts_clock.now_ms());
                self.load_changed(s.real);
            }
            return Some(Event::SyncRemoved);
        }
        let timeout_ticks = r.timeout_ms.div_ceil(self.tick_ms.max(1)).max(1);
        let no_output = r
            .flags
            .contains(crate::session::replication::RecordFlags::NO_OUTPUT);
        if let Some(id) = found {
            let live = self.sessions6.get_mut(id)?;
            let was_active = is_active(live.state());
            *live = live.synced(r.state, no_output);
            let now_active = is_active(live.state());
            let real = live.real;
            if was_active != now_active {
                let c = &self.real_servers[real as usize];
                RealServerCounters::gauge_add(&c.active, if now_active { 1 } else { -1 });
                RealServerCounters::gauge_add(&c.inactive, if now_active { -1 } else { 1 });
                self.load_changed(real);
            }
            self.sessions6.touch(id, self.now_tick, timeout_ticks);
            return Some(Event::SyncInstalled);
        }
        let snap = self.snapshot.current_arc();
        let vs = r.virtual_service;
        let service = snap.find(&ServiceKey::new(r.proto, vs.ip(), vs.port()))?;
        let rs = service
            .real_servers
            .iter()
            .find(|x| x.ip == r.real_server.ip() && x.port == r.real_server.port())?;
        if rs.mode != r.mode {
            return None;
        }
        // The client-side next hop of a NAT or FullNAT session is learned from the
        // client's first packet after a takeover; a DR real server's from the
        // neighbour table.
        let mut session = r.to_session6(service.id, rs.id)?;
        session.created = self.now_tick;
        if let Some(local) = r.local {
            let fits = match local.ip() {
                // NAT64: the active took this IPv4 port from its pool; this worker's
                // pool must not hand it out again.
                IpAddr::V4(lip) => {
                    service.local_addresses4().any(|a| a == lip)
                        && self.pool.as_mut().is_some_and(|pool| {
                            let real = SocketAddrV4::new(rs.ipv4(), rs.port);
                            pool.reserve(lip, local.port(), real)
                        })
                }
                IpAddr::V6(lip) => service.local_addresses6().any(|a| a == lip),
            };
            if !fits {
                return None;
            }
        }
        let now_ms = self.ts_clock.now_ms();
        let (real_servers, load_view, schedulers, overload, pool) = (
            &self.real_servers[..],
            &self.load_view,
            &mut self.schedulers,
            &mut self.overload,
            &mut self.pool,
        );
        let inserted = self
            .sessions6
            .insert(session, self.now_tick, timeout_ticks, |old| {
                forget_v6(real_servers, old);
                release_nat64_port(pool, old, now_ms);
                super::tell_load(load_view, schedulers, overload, real_servers, old.real);
            });
        let id = match inserted {
            Ok(id) => id,
            Err(_) => {
                // No room, or a key taken: the port reserved above goes back.
                release_nat64_port(&mut self.pool, &session, now_ms);
                return None;
            }
        };
        if let (Some(proofs), true) = (self.proofs.as_mut(), session.persistent) {
            // An entry the slot's last session left means nothing to this one.
            proofs.forget(super::confirm::PersistentSession::proof_key_v6(id));
        }
        let c = &self.real_servers[rs.id as usize];
        let gauge = if is_active(r.state) {
            &c.active
        } else {
            &c.inactive
        };
        RealServerCounters::gauge_add(gauge, 1);
        self.load_changed(rs.id);
        Some(Event::SyncInstalled)
    }
}
