//! The IPv6 packet path, for services on IPv6 VIPs with IPv6 real servers in DR and
//! NAT modes. The same stages as IPv4, in one place: look the 5-tuple up in the
//! worker's IPv6 session table; hit: the state moves; miss: a new connection to a
//! service is placed by the same placement as IPv4 (the hashing schedulers see the
//! addresses folded to 32 bits, as IPVS folds them); account on the real server;
//! egress: DR readdresses the frame, NAT rewrites the destination (or, for a reply,
//! the source) with the L4 checksum updated incrementally.
//!
//! Session sync hears of each packet's session (`sync6.rs`). Not yet on this path
//! (the service table refuses them for IPv6 services): TUN, FullNAT and NAT64,
//! persistence, the SYN proxy, TOA. A NAT reply
//! must reach the worker that owns its session: with several workers, the IPv6
//! replies that RSS puts on another worker's queue find no session there and are
//! dropped (`ipv6_no_service`), so IPv6 NAT services need one worker for now.
use super::observe::account;
use super::{Action, Context, Forwarder};
use crate::dataplane::counters::bump;
use crate::dataplane::realserver_stats::RealServerCounters;
use crate::dpdk::Packet;
use crate::flow::parse::{Ipv6Payload, PacketKind, Parsed};
use crate::flow::{FlowKey4, FlowKey6};
use crate::forward;
use crate::model::{DropReason, ForwardMode, Protocol, ServiceKey};
use crate::sched::fold_ipv6;
use crate::session::is_active;
use crate::session::table6::Session6;
use crate::session::{Direction, InsertError, TcpState};
use crate::wire::ethernet::MacAddr;
use crate::wire::ipv6;
use crate::wire::tcp::TcpFlags;
use std::net::Ipv6Addr;

/// Slots of the IPv6 session table the housekeeping sweep looks at per poll.
pub(super) const SWEEP_BUDGET: usize = 64;

impl Forwarder {
    /// A TCP segment or UDP datagram in an IPv6 packet addressed to our MAC. `None`
    /// when it is neither for an IPv6 service nor of an IPv6 session: the local
    /// responder then decides (its own addresses, or `ipv6_no_service`).
    pub(super) fn l4_v6(
        &mut self,
        pkt: &mut Packet,
        parsed: &Parsed,
        cx: &Context,
    ) -> Option<Action> {
        let (proto, sport, dport, flags) = match parsed.kind {
            PacketKind::Ipv6(Ipv6Payload::Tcp {
                sport,
                dport,
                flags,
                ..
            }) => (Protocol::Tcp, sport, dport, flags),
            PacketKind::Ipv6(Ipv6Payload::Udp { sport, dport }) => {
                (Protocol::Udp, sport, dport, TcpFlags::empty())
            }
            _ => return None,
        };
        let ip = ipv6::Packet::new_checked(pkt.bytes().get(parsed.l3..)?).ok()?;
        let key = FlowKey6 {
            src: ip.src_addr(),
            dst: ip.dst_addr(),
            sport,
            dport,
            proto,
        };
        let found = self.sessions6.lookup(&key, self.now_tick);
        let (id, dir) = match found {
            Some(hit) => hit,
            None => {
                if !self.snapshot.current().is_vip6(key.dst) {
                    return None;
                }
                match self.open_v6(&key, flags, pkt, cx) {
                    Ok(id) => (id, Direction::Inbound),
                    Err(reason) => return Some(Action::Drop(reason)),
                }
            }
        };
        let transition = self
            .sessions6
            .on_packet(id, dir, flags, self.now_tick, &self.timeouts)?;
        if dir == Direction::Inbound {
            self.learn_client_hop_v6(id, pkt);
        }
        let s = *self.sessions6.get(id)?;
        self.sync_after_packet_v6(id, &s, transition);
        let c = &self.real_servers[s.real as usize];
        let bytes = u64::from(pkt.len());
        match dir {
            Direction::Outbound => c.count_out(bytes),
            _ => c.count_in(bytes),
        }
        if account(c, transition) {
            self.load_changed(s.real);
        }
        Some(self.egress_v6(pkt, parsed, id, &s, dir, cx))
    }

    /// A new connection to an IPv6 VIP: the service on its port, a real server from
    /// placement, and a session filed under its keys. A TCP segment other than a SYN
    /// opens nothing (`tcp_no_session`).
    fn open_v6(
        &mut self,
        key: &FlowKey6,
        flags: TcpFlags,
        pkt: &Packet,
        cx: &Context,
    ) -> Result<u32, DropReason> {
        if key.proto == Protocol::Tcp && !flags.contains(TcpFlags::SYN) {
            return Err(DropReason::TcpNoSession);
        }
        if key.src.is_loopback() || key.src.is_unspecified() || cx.port.responder.is_local6(key.src)
        {
            return Err(DropReason::BadIpv6Header);
        }
        let snap = self.snapshot.current_arc();
        let index = snap
            .find_index(&ServiceKey::new(key.proto, key.dst, key.dport))
            .ok_or(DropReason::NoService)?;
        // Placement reads the client, its port and the destination as IPv4 words;
        // IPv6 ones are folded, as the hashing schedulers of IPVS fold them.
        let folded = FlowKey4::new(
            key.proto,
            fold_ipv6(key.src),
            key.sport,
            fold_ipv6(key.dst),
            key.dport,
        );
        let placement = self.place(index, &folded, cx.now_tsc, cx.counters)?;
        let service = &snap.services()[placement.service];
        let rs = &service.real_servers[placement.real];
        let std::net::IpAddr::V6(real_addr) = rs.ip else {
            return Err(DropReason::NoRealServer);
        };
        let mut session = Session6::new(key, rs.mode, service.id, rs.id, real_addr, rs.port);
        session.peer_mac = match rs.mode {
            ForwardMode::Nat => pkt.bytes()[6..12]
                .try_into()
                .expect("checked Ethernet header"),
            _ => self.neighbours6.lookup(real_addr).map_or([0; 6], |m| m.0),
        };
        let timeout = self.timeouts.session(key.proto, TcpState::None);
        let (real_servers, load_view, schedulers, overload) = (
            &self.real_servers[..],
            &self.load_view,
            &mut self.schedulers,
            &mut self.overload,
        );
        let id = self
            .sessions6
            .insert(session, self.now_tick, timeout, |old| {
                forget_v6(real_servers, old);
                super::tell_load(load_view, schedulers, overload, real_servers, old.real);
            })
            .map_err(|e| match e {
                InsertError::TableFull => DropReason::SessionTableFull,
                InsertError::KeyExists(_) => DropReason::NatTupleInUse,
            })?;
        bump(&cx.counters.sessions_created, 1);
        let c = &self.real_servers[rs.id as usize];
        bump(&c.connections, 1);
        RealServerCounters::gauge_add(&c.inactive, 1);
        self.load_changed(rs.id);
        Ok(id)
    }

    /// Rewrites and addresses the packet of session `s` going `dir`: DR to the real
    /// server's MAC as it is; NAT to the real server with its address and port, and
    /// its replies back to the client from the VIP.
    fn egress_v6(
        &mut self,
        pkt: &mut Packet,
        parsed: &Parsed,
        id: u32,
        s: &Session6,
        dir: Direction,
        cx: &Context,
    ) -> Action {
        let frame = pkt.bytes_mut();
        match (s.mode, dir) {
            (ForwardMode::Nat, Direction::Outbound) => {
                if let Err(r) = forward::nat6::rewrite(frame, parsed, Some((s.vip, s.vport)), None)
                {
                    return Action::Drop(r);
                }
                readdress(frame, Some(MacAddr(s.peer_mac)), cx)
            }
            (_, Direction::Outbound) => Action::Drop(DropReason::NotLocal),
            (mode, _) => {
                let known = (mode == ForwardMode::Dr && s.peer_mac != [0; 6])
                    .then_some(MacAddr(s.peer_mac));
                let next_hop = known.or_else(|| self.neighbours6.lookup(s.real_addr));
                if next_hop.is_none() {
                    self.request_resolution_v6();
                    return Action::Drop(DropReason::NeighbourUnresolved);
                }
                if mode == ForwardMode::Nat {
                    let to = Some((s.real_addr, s.real_port));
                    if let Err(r) = forward::nat6::rewrite(frame, parsed, None, to) {
                        return Action::Drop(r);
                    }
                } else if let (Some(mac), None) = (next_hop, known) {
                    if let Some(live) = self.sessions6.get_mut(id) {
                        live.peer_mac = mac.0;
                    }
                }
                readdress(frame, next_hop, cx)
            }
        }
    }

    /// Asks for `target`'s MAC at the next housekeeping: the worker solicits the real
    /// servers it does not know (at most ten times a second each).
    fn request_resolution_v6(&mut self) {
        self.resolve_wanted = true;
    }

    /// Calls `send` for each IPv6 real server of the current snapshot whose MAC is
    /// not known yet, at most ten times a second per address.
    pub fn resolve_real_servers_v6(&mut self, now_tsc: u64, mut send: impl FnMut(Ipv6Addr)) {
        let snap = self.snapshot.current();
        let servers = snap.services().iter().flat_map(|s| s.real_servers.iter());
        for ip in servers.filter_map(|rs| match rs.ip {
            std::net::IpAddr::V6(ip) => Some(ip),
            std::net::IpAddr::V4(_) => None,
        }) {
            if self.neighbours6.lookup(ip).is_some() {
                continue;
            }
            let folded = fold_ipv6(ip);
            let slot = &mut self.arp_sent[super::limiter_slot(folded)];
            let tag = u32::from(folded) ^ 0x8000_0000;
            if slot.0 == tag && now_tsc.wrapping_sub(slot.1) < self.arp_interval_tsc {
                continue;
            }
            *slot = (tag, now_tsc);
            send(ip);
        }
    }

    /// Removes the IPv6 sessions whose time has come, a bounded number of slots per
    /// call, and gives their real servers their counts back.
    pub(super) fn sweep_v6(&mut self) {
        let Forwarder {
            sessions6,
            real_servers,
            load_view,
            schedulers,
            overload,
            now_tick,
            ..
        } = self;
        let real_servers = &real_servers[..];
        sessions6.sweep(*now_tick, SWEEP_BUDGET, |s| {
            forget_v6(real_servers, s);
            super::tell_load(load_view, schedulers, overload, real_servers, s.real);
        });
    }

    /// This worker's IPv6 sessions (for listings and checks, not per packet).
    pub fn sessions6(&self) -> &crate::session::table6::SessionTable6 {
        &self.sessions6
    }
}

/// Addresses a rewritten frame to `next_hop` from the port.
fn readdress(frame: &mut [u8], next_hop: Option<MacAddr>, cx: &Context) -> Action {
    match next_hop {
        Some(mac) => match forward::dr::forward(frame, mac, cx.port.mac) {
            Ok(()) => Action::Transmit,
            Err(r) => Action::Drop(r),
        },
        None => Action::Drop(DropReason::NeighbourUnresolved),
    }
}

/// A session's end on its real server's gauges.
pub(super) fn forget_v6(real_servers: &[RealServerCounters], s: &Session6) {
    let c = &real_servers[s.real as usize];
    if is_active(s.state()) {
        RealServerCounters::gauge_add(&c.active, -1);
    } else {
        RealServerCounters::gauge_add(&c.inactive, -1);
    }
}
