//! The IPv6 packet path, for services on IPv6 VIPs with IPv6 real servers in DR, NAT
//! and TUN modes. The same stages as IPv4, in one place: look the 5-tuple up in the
//! worker's IPv6 session table; hit: the state moves; miss: a new connection to a
//! service is placed by the same placement as IPv4 (the hashing schedulers see the
//! addresses folded to 32 bits, as IPVS folds them); account on the real server;
//! egress: DR readdresses the frame, NAT rewrites the destination (or, for a reply,
//! the source) with the L4 checksum updated incrementally, TUN encapsulates it in
//! IPv6 (or answers Packet Too Big).
//!
//! FullNAT takes a local address and port of the service's IPv6 local addresses
//! (`local_port_v6`) and rewrites both ends, the reply coming back to that address
//! and port. NAT64 (FullNAT to an IPv4 real server) takes an IPv4 local port from
//! the service's pool, keeps its IPv4 ends as IPv4-mapped addresses, translates the
//! client's packets to IPv4 (`nat64_to_server`) and the real server's IPv4 replies,
//! which the IPv4 path hands over when no IPv4 session takes them, back to IPv6
//! (`nat64_reply`). Session sync hears of each packet's session (`sync6.rs`).
//!
//! Persistence templates key on the client's address cut to the service's prefix
//! length (`place_v6`). With several workers, as for IPv4: FullNAT takes local ports
//! whose reply tuple the RSS view gives to the choosing worker, and a NAT real
//! server's reply another worker owns is redirected to it once (`reply_owner_v6`);
//! where the device does not hash IPv6 as the view says, packets are steered to the
//! view's owner.
//!
//! Not yet on this path (the service table refuses them for IPv6 services): the SYN
//! proxy, TOA.
use super::confirm::PersistentSession;
use super::observe::account;
use super::{Action, Context, Forwarder};
use crate::dataplane::counters::{bump, Event, WorkerCounters};
use crate::dataplane::neighbour::Learn;
use crate::dataplane::probe_acks::ProbeAcks;
use crate::dataplane::realserver_stats::RealServerCounters;
use crate::dpdk::Packet;
use crate::flow::parse::{Ipv6Payload, PacketKind, Parsed};
use crate::flow::{FlowKey4, FlowKey6};
use crate::forward;
use crate::model::{DropReason, ForwardMode, Protocol, ServiceKey};
use crate::sched::fold_ipv6;
use crate::session::is_active;
use crate::session::persist::Trust;
use crate::session::table6::Session6;
use crate::session::{Direction, InsertError, OutOfWindow, TcpState, Transition};
use crate::wire::ethernet::MacAddr;
use crate::wire::ipv6;
use crate::wire::tcp::TcpFlags;
use std::net::Ipv6Addr;

/// Slots of the IPv6 session table the housekeeping sweep looks at per poll.
pub(super) const SWEEP_BUDGET: usize = 64;
/// Local address and port pairs a new IPv6 FullNAT connection tries before it is
/// refused: enough to step over the pairs still in use after a wrap of the range.
const LOCAL_PORT_TRIES: usize = 16;
/// Pairs looked at for those tries, most of them hashing to other workers (with n
/// workers, n - 1 in n do): a bound on the work a SYN can cost.
const LOCAL_PORT_CANDIDATES: usize = 1024;
/// Local addresses whose share of the reply hash is computed once per choice.
const CACHED_BASES: usize = 8;

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
        // IPv4-mapped addresses name NAT64's IPv4 ends in the table; on the wire they
        // are no one's (RFC 4291 2.5.5.2).
        if key.src.to_ipv4_mapped().is_some() || key.dst.to_ipv4_mapped().is_some() {
            return Some(Action::Drop(DropReason::BadIpv6Header));
        }
        let hashed = self.hashed6(pkt.index(), key);
        let found = self.sessions6.lookup_hashed(&hashed, self.now_tick);
        let found = self.unless_reopened_v6(found, flags, cx.counters);
        let seg = super::client_segment(pkt.bytes(), parsed, Direction::Inbound);
        let (id, dir) = match found {
            Some((id, dir)) => (id, dir),
            None => {
                if !self.snapshot.current().is_vip6(key.dst) {
                    if let Some(acks) = self.probe_port_v6(&key) {
                        // Only a real server's answer to the probe in flight: see `admit`.
                        let answers = super::miss::tcp_ack(pkt.bytes(), parsed)
                            .is_some_and(|ack| acks.answers(key.dport, flags, ack));
                        return Some(if !self.snapshot.current().is_real_server(key.src.into()) {
                            Action::Drop(DropReason::NotAPeer)
                        } else if !answers {
                            Action::Drop(DropReason::NotAProbeAnswer)
                        } else {
                            Action::Punt
                        });
                    }
                    return self.reply_owner_v6(&key, cx.port.redirected);
                }
                if let Some(owner) = self.rss.steer_to6(&key, cx.port.redirected) {
                    // Steered: the connection opens, or lives, on the view's owner.
                    return Some(Action::Redirect(owner));
                }
                match self.open_v6(&key, flags, pkt, cx) {
                    Ok(id) => {
                        if let Some(seg) = &seg {
                            self.sessions6.start_client_seq(id, seg);
                        }
                        (id, Direction::Inbound)
                    }
                    Err(reason) => return Some(Action::Drop(reason)),
                }
            }
        };
        let transition = match (dir, seg) {
            (Direction::Inbound, Some(seg)) => {
                let moved = self.sessions6.on_client_segment(
                    id,
                    flags,
                    seg,
                    self.now_tick,
                    &self.timeouts,
                )?;
                match moved {
                    Ok(t) => t,
                    Err(OutOfWindow) => {
                        cx.counters.event(Event::TcpCloseOutOfWindow);
                        let state = self.sessions6.get(id)?.state();
                        Transition {
                            from: state,
                            to: state,
                        }
                    }
                }
            }
            (Direction::Outbound, _) => self.server_segment_v6(id, pkt, parsed, flags)?,
            _ => self
                .sessions6
                .on_packet(id, dir, flags, self.now_tick, &self.timeouts)?,
        };
        if dir == Direction::Inbound {
            self.learn_client_hop_v6(id, pkt);
        }
        let s = *self.sessions6.get(id)?;
        let synack = dir == Direction::Outbound && flags.contains(TcpFlags::SYN);
        if s.persistent && (transition.changed() || synack) {
            let session = PersistentSession::of_v6(id, &s);
            let moved = (dir, flags, transition);
            self.confirm_on(session, moved, pkt.bytes(), parsed, cx.counters);
        }
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
    /// opens nothing (`tcp_no_session`), unless the service is `sloppy_tcp` and the
    /// segment no RST. Nor does one from an address of ours or a martian
    /// (`martian_source`, [`may_be_client6`]).
    fn open_v6(
        &mut self,
        key: &FlowKey6,
        flags: TcpFlags,
        pkt: &Packet,
        cx: &Context,
    ) -> Result<u32, DropReason> {
        let snap = self.snapshot.current_arc();
        let index = snap.find_index(&ServiceKey::new(key.proto, key.dst, key.dport));
        if key.proto == Protocol::Tcp
            && !flags.contains(TcpFlags::SYN)
            && !index.is_some_and(|i| self.sloppy_opens(i, flags))
        {
            return Err(DropReason::TcpNoSession);
        }
        if !may_be_client6(key.src, &snap, cx.port.responder) {
            return Err(DropReason::MartianSource);
        }
        let index = index.ok_or(DropReason::NoService)?;
        // Placement reads the client, its port and the destination as IPv4 words;
        // IPv6 ones are folded, as the hashing schedulers of IPVS fold them.
        let folded = FlowKey4::new(
            key.proto,
            fold_ipv6(key.src),
            key.sport,
            fold_ipv6(key.dst),
            key.dport,
        );
        // UDP cannot prove its client is there (and IPv6 has no SYN proxy).
        let trust = match key.proto {
            Protocol::Tcp => Trust::Unconfirmed,
            _ => Trust::Unverified,
        };
        let placement = self.place_v6(index, &folded, key.src, trust, cx.now_tsc, cx.counters)?;
        let service = &snap.services()[placement.service];
        let rs = &service.real_servers[placement.real];
        // NAT64: an IPv4 real server, and the IPv4 local address and port placement
        // took from the service's pool, kept as IPv4-mapped addresses.
        let (real_addr, local4) = match (rs.ip, placement.local) {
            (std::net::IpAddr::V6(a), _) => (a, None),
            (std::net::IpAddr::V4(a), Some(local)) if rs.mode == ForwardMode::FullNat => {
                (a.to_ipv6_mapped(), Some(local))
            }
            _ => return Err(DropReason::NoRealServer),
        };
        let mut session = Session6::new(key, rs.mode, service.id, rs.id, real_addr, rs.port);
        session.persistent = placement.persistent();
        if let Some(local) = local4 {
            (session.local_addr, session.local_port) = (local.lip.to_ipv6_mapped(), local.port);
        } else if rs.mode == ForwardMode::FullNat {
            (session.local_addr, session.local_port) =
                self.local_port_v6(service, real_addr, rs.port, key.proto, cx.counters)?;
        }
        session.peer_mac = match rs.mode {
            ForwardMode::Nat | ForwardMode::FullNat => pkt.bytes()[6..12]
                .try_into()
                .expect("checked Ethernet header"),
            _ => self.neighbours6.lookup(real_addr).map_or([0; 6], |m| m.0),
        };
        // Placed: only a connection that will be filed makes room.
        self.relieve_pressure_v6(cx.counters);
        let timeout = self.timeouts.session(key.proto, TcpState::None);
        let now_ms = self.ts_clock.now_ms();
        let (real_servers, load_view, schedulers, overload, pool) = (
            &self.real_servers[..],
            &self.load_view,
            &mut self.schedulers,
            &mut self.overload,
            &mut self.pool,
        );
        let (persist, now, per_second) = (&self.persist, self.now_tick, self.ticks_per_second);
        let inserted = self
            .sessions6
            .insert(session, self.now_tick, timeout, |old| {
                super::extend_template6(persist, &snap, old, now, per_second);
                forget_v6(real_servers, old);
                release_nat64_port(pool, old, now_ms);
                super::tell_load(load_view, schedulers, overload, real_servers, old.real);
            })
            .map_err(|e| match e {
                InsertError::TableFull => DropReason::SessionTableFull,
                InsertError::KeyExists(_) => DropReason::NatTupleInUse,
            });
        let id = match inserted {
            Ok(id) => id,
            Err(reason) => {
                release_nat64_port(&mut self.pool, &session, now_ms);
                return Err(reason);
            }
        };
        bump(&cx.counters.sessions_created, 1);
        let c = &self.real_servers[rs.id as usize];
        bump(&c.connections, 1);
        RealServerCounters::gauge_add(&c.inactive, 1);
        self.load_changed(rs.id);
        if let (Some(proofs), true) = (self.proofs.as_mut(), session.persistent) {
            proofs.forget(PersistentSession::proof_key_v6(id));
        }
        Ok(id)
    }

    /// A packet of no session of this worker and to no IPv6 VIP: when it is a reply
    /// another worker owns, that worker. A reply to a FullNAT local address is the
    /// view's owner's (its port was chosen so), which only steering needs; a NAT real
    /// server's reply belongs to the worker its request tuple (client -> VIP, the VIP
    /// from the snapshot) hashes to, as [`super::miss::nat_reply_owner`] finds it for
    /// IPv4. Never for a packet redirected once already.
    fn reply_owner_v6(&self, key: &FlowKey6, redirected: bool) -> Option<Action> {
        if redirected {
            return None;
        }
        if self.snapshot.current().is_local_address6(key.dst) {
            return self.rss.steer_to6(key, redirected).map(Action::Redirect);
        }
        let owner = self.nat_reply_queue_v6(key)?;
        (owner != self.rss.queue).then_some(Action::Redirect(owner))
    }

    /// The queue the request tuple of a NAT real server's reply hashes to, when `key`
    /// is such a reply (client -> VIP, the VIP of the first service using that real
    /// server in NAT mode), as [`super::miss::nat_reply_queue`] for IPv4.
    pub(super) fn nat_reply_queue_v6(&self, key: &FlowKey6) -> Option<u16> {
        let &(std::net::IpAddr::V6(vip), vport) = self
            .snapshot
            .current()
            .nat_reply_services(key.proto, key.src, key.sport)
            .first()?
        else {
            return None;
        };
        let request = FlowKey6 {
            src: key.dst,
            dst: vip,
            sport: key.dport,
            dport: vport,
            proto: key.proto,
        };
        Some(self.rss.owner_of6(&request))
    }

    /// FullNAT: a local address of `service` and a port of the worker's range that no
    /// live session uses towards `real:rport`, and whose reply tuple (real server ->
    /// local address and port) the RSS view gives to this worker, so that the reply
    /// lands here and no two workers pick the same pair (each takes the ports that
    /// hash to itself). A cursor walks every address and port in turn (the addresses
    /// alternating), so a pair is reused as late as the range allows, as the IPv4
    /// pools reuse theirs first in, first out; the session table itself says which
    /// are taken, so there are no books to keep. The Toeplitz hash being linear, the
    /// port's share of it is two table loads on top of the address part, computed
    /// once per address (as `forward::laddr` splits it for IPv4). At most
    /// `LOCAL_PORT_TRIES` pairs of this worker are tried, among at most
    /// `LOCAL_PORT_CANDIDATES`. When all those tried are taken, the oldest of their
    /// TCP sessions that may give up its pair (`placement::PortGiveUp`: half-open
    /// for over 3 s, or idle in TIME_WAIT) ends and gives it, as with the IPv4 pools
    /// (counted as `local_port_reclaimed`); else `LaddrExhausted` (as when the service
    /// has no IPv6 local address).
    fn local_port_v6(
        &mut self,
        service: &crate::model::Service,
        real: Ipv6Addr,
        rport: u16,
        proto: Protocol,
        counters: &WorkerCounters,
    ) -> Result<(Ipv6Addr, u16), DropReason> {
        let lips = service.local_addresses6();
        let count = lips.clone().count() as u64;
        let (first, last) = (*self.local_ports.start(), *self.local_ports.end());
        if count == 0 || first > last {
            return Err(DropReason::LaddrExhausted);
        }
        let span = u64::from(last - first) + 1;
        let rss = &self.rss;
        // The reply tuple's hash without its destination port, per local address
        // (the first few kept; a service rarely has more).
        let base = |lip: Ipv6Addr| rss.toeplitz.hash_tuple6(rss.fields6, real, lip, rport, 0);
        let mut bases = [0u32; CACHED_BASES];
        for (slot, lip) in bases.iter_mut().zip(lips.clone()) {
            *slot = base(lip);
        }
        let mut tries = 0;
        // The oldest reclaimable session of the pairs tried: (age, id, pair).
        let mut oldest: Option<(u32, u32, Ipv6Addr, u16)> = None;
        let give_up = self.port_give_up();
        for _ in 0..LOCAL_PORT_CANDIDATES {
            let at = self.laddr6_cursor;
            self.laddr6_cursor = at.wrapping_add(1);
            let index = (at % count) as usize;
            let Some(lip) = lips.clone().nth(index) else {
                break;
            };
            let port = first + ((at / count) % span) as u16;
            let mut hash = bases.get(index).copied().unwrap_or_else(|| base(lip));
            if rss.fields6 == crate::flow::rss::HashFields::L3L4 {
                let [hi, lo] = port.to_be_bytes();
                let share = |at, byte| rss.toeplitz.byte_contribution(at, byte).unwrap_or(0);
                hash ^= share(34, hi) ^ share(35, lo);
            }
            if rss.reta.queue(hash) != rss.queue {
                continue;
            }
            let reply = FlowKey6 {
                src: real,
                dst: lip,
                sport: rport,
                dport: port,
                proto,
            };
            let Some((id, dir)) = self.sessions6.lookup(&reply, self.now_tick) else {
                return Ok((lip, port));
            };
            if let Some(s) = self
                .sessions6
                .get(id)
                .filter(|_| dir == Direction::Outbound)
            {
                let age = self.now_tick.wrapping_sub(s.created);
                if give_up.session6(s) && oldest.is_none_or(|(a, ..)| age > a) {
                    oldest = Some((age, id, lip, port));
                }
            }
            tries += 1;
            if tries == LOCAL_PORT_TRIES {
                break;
            }
        }
        let (_, id, lip, port) = oldest.ok_or(DropReason::LaddrExhausted)?;
        self.retire_v6(id, counters);
        counters.event(Event::LocalPortReclaimed);
        Ok((lip, port))
    }

    /// Rewrites and addresses the packet of session `s` going `dir`: DR to the real
    /// server's MAC as it is; NAT to the real server with its address and port, and
    /// its replies back to the client from the VIP; FullNAT the same with the local
    /// address and port as the source towards the real server.
    pub(super) fn egress_v6(
        &mut self,
        pkt: &mut Packet,
        parsed: &Parsed,
        id: u32,
        s: &Session6,
        dir: Direction,
        cx: &Context,
    ) -> Action {
        if (s.mode, dir) == (ForwardMode::Tun, Direction::Inbound) {
            return self.tunnel_v6(pkt, parsed, id, s, cx);
        }
        if let (Some(real), Direction::Inbound) = (nat64_real(s), dir) {
            return self.nat64_to_server(pkt, parsed, s, real, cx);
        }
        let frame = pkt.bytes_mut();
        match (s.mode, dir) {
            (ForwardMode::Nat, Direction::Outbound) => {
                if let Err(r) = forward::nat6::rewrite(frame, parsed, Some((s.vip, s.vport)), None)
                {
                    return Action::Drop(r);
                }
                readdress(frame, self.client_hop_v6(s), cx)
            }
            (ForwardMode::FullNat, Direction::Outbound) => {
                let (src, dst) = ((s.vip, s.vport), (s.client, s.client_port));
                if let Err(r) = forward::nat6::rewrite(frame, parsed, Some(src), Some(dst)) {
                    return Action::Drop(r);
                }
                readdress(frame, self.client_hop_v6(s), cx)
            }
            (_, Direction::Outbound) => Action::Drop(DropReason::NotLocal),
            (mode, _) => {
                // As for IPv4 (`next_hop`): the table's entry first, so a DR session
                // follows its real server's new MAC; the one it last sent to else.
                let known = (mode == ForwardMode::Dr && s.peer_mac != [0; 6])
                    .then_some(MacAddr(s.peer_mac));
                let next_hop = self.neighbours6.lookup(s.real_addr).or(known);
                if mode == ForwardMode::Nat {
                    let to = Some((s.real_addr, s.real_port));
                    if let Err(r) = forward::nat6::rewrite(frame, parsed, None, to) {
                        return Action::Drop(r);
                    }
                } else if mode == ForwardMode::FullNat {
                    let from = Some((s.local_addr, s.local_port));
                    let to = Some((s.real_addr, s.real_port));
                    if let Err(r) = forward::nat6::rewrite(frame, parsed, from, to) {
                        return Action::Drop(r);
                    }
                    // A client's own TOA would be believed by a module there.
                    if let PacketKind::Ipv6(Ipv6Payload::Tcp { .. }) = parsed.kind {
                        let removed = forward::toa::remove_forged_classified(frame, parsed);
                        if removed != 0 {
                            cx.counters.event_n(Event::ToaForgedRemoved, removed as u64);
                        }
                    }
                } else if let Some(mac) = next_hop.filter(|&mac| Some(mac) != known) {
                    if let Some(live) = self.sessions6.get_mut(id) {
                        live.peer_mac = mac.0;
                    }
                }
                self.address_v6(frame, next_hop, s.real_addr, cx)
            }
        }
    }

    /// TUN: the client's packet inside an outer IPv6 header to the real server (next
    /// header 41), from the port's address on the real server's link; or, when that
    /// would exceed the port's MTU, a Packet Too Big to the client instead.
    fn tunnel_v6(
        &mut self,
        pkt: &mut Packet,
        parsed: &Parsed,
        id: u32,
        s: &Session6,
        cx: &Context,
    ) -> Action {
        if let Some(mtu) = forward::tun6::check_mtu(parsed, cx.port.mtu) {
            let frame = pkt.with_tailroom_mut();
            return match forward::tun6::packet_too_big(frame, parsed, mtu, cx.port.mac) {
                Some(len) => self.send_icmp_error(pkt, len, cx),
                None => Action::Drop(DropReason::TooBig),
            };
        }
        let known = (s.peer_mac != [0; 6]).then_some(MacAddr(s.peer_mac));
        let next_hop = self.neighbours6.lookup(s.real_addr).or(known);
        // No address to send from is no address to solicit from either.
        let Some(source) = forward::tun6::source_for(cx.port.responder.addrs6(), s.real_addr)
        else {
            return Action::Drop(DropReason::NeighbourUnresolved);
        };
        if !pkt.prepend(forward::tun6::OUTER_HEADER_LEN as u16) {
            return Action::Drop(DropReason::TooBig);
        }
        let frame = pkt.bytes_mut();
        // Unresolved: encapsulated for now, addressed once the MAC is known (`Held`).
        let mac = next_hop.unwrap_or(MacAddr::ZERO);
        match forward::tun6::encapsulate(frame, parsed.l3, source, s.real_addr, mac, cx.port.mac) {
            Ok(len) if pkt.set_len(len as u16) => {
                if next_hop.is_none() {
                    self.request_resolution_v6();
                    return Action::Hold(s.real_addr.into());
                }
                if Some(mac) != known {
                    if let Some(live) = self.sessions6.get_mut(id) {
                        live.peer_mac = mac.0;
                    }
                }
                Action::Transmit
            }
            Ok(_) => Action::Drop(DropReason::TooBig),
            Err(r) => Action::Drop(r),
        }
    }

    /// NAT64, a client's packet: translated to IPv4 from the local address and port
    /// to the real server (`forward::nat64`), the mbuf trimmed to the shorter header,
    /// then addressed as any IPv4 packet (held while the server's MAC resolves).
    fn nat64_to_server(
        &mut self,
        pkt: &mut Packet,
        parsed: &Parsed,
        s: &Session6,
        real: std::net::Ipv4Addr,
        cx: &Context,
    ) -> Action {
        let Some(lip) = s.local_addr.to_ipv4_mapped() else {
            return Action::Drop(DropReason::LaddrExhausted);
        };
        self.ip_ident = self.ip_ident.wrapping_add(1);
        let (src, dst) = ((lip, s.local_port), (real, s.real_port));
        let range = match forward::nat64::to_v4(pkt.bytes_mut(), parsed, src, dst, self.ip_ident) {
            Ok(range) => range,
            Err(r) => return Action::Drop(r),
        };
        let (start, len) = (range.start as u16, (range.end - range.start) as u16);
        if !pkt.adj(start) || !pkt.set_len(len) {
            return Action::Drop(DropReason::Truncated);
        }
        // A client's own TOA would be believed by a module on the IPv4 real server.
        if let PacketKind::Ipv6(Ipv6Payload::Tcp { .. }) = parsed.kind {
            if let Ok(v4) = crate::flow::parse::classify(pkt.bytes()) {
                let removed = forward::toa::remove_forged(pkt.bytes_mut(), &v4).unwrap_or(0);
                if removed != 0 {
                    cx.counters.event_n(Event::ToaForgedRemoved, removed as u64);
                }
            }
        }
        let next_hop = cx.neighbours.lookup(real);
        super::egress::address(pkt.bytes_mut(), next_hop, real, cx.port)
    }

    /// NAT64, an IPv4 packet no IPv4 session took: a real server's reply to a NAT64
    /// session's local address and port (its reply key is filed with IPv4-mapped
    /// addresses), translated to IPv6 from the VIP to the client. A SYN-ACK's MSS is
    /// lowered by 20 first, the IPv6 header being that much longer. `None` when it is
    /// no such reply.
    pub(super) fn nat64_reply(
        &mut self,
        pkt: &mut Packet,
        parsed: &Parsed,
        key: &FlowKey4,
        flags: TcpFlags,
        cx: &Context,
    ) -> Option<Action> {
        let mapped = FlowKey6 {
            src: key.src_addr().to_ipv6_mapped(),
            dst: key.dst_addr().to_ipv6_mapped(),
            sport: key.sport,
            dport: key.dport,
            proto: key.proto,
        };
        let (id, dir) = self.sessions6.lookup(&mapped, self.now_tick)?;
        if dir != Direction::Outbound {
            return None;
        }
        let transition = self.server_segment_v6(id, pkt, parsed, flags)?;
        let s = *self.sessions6.get(id)?;
        if s.persistent && flags.contains(TcpFlags::SYN) {
            let session = PersistentSession::of_v6(id, &s);
            let moved = (dir, flags, transition);
            self.confirm_on(session, moved, pkt.bytes(), parsed, cx.counters);
        }
        let c = &self.real_servers[s.real as usize];
        c.count_out(u64::from(pkt.len()));
        if account(c, transition) {
            self.load_changed(s.real);
        }
        let growth = forward::nat64::HEADER_GROWTH;
        if parsed.ip_total_len as usize + growth > cx.port.mtu as usize {
            return Some(self.nat64_too_big(pkt, parsed, key, cx));
        }
        if flags.contains(TcpFlags::SYN) && flags.contains(TcpFlags::ACK) {
            let _ = forward::toa::clamp_mss(pkt.bytes_mut(), parsed, growth as u16);
        }
        if !pkt.prepend(growth as u16) {
            return Some(Action::Drop(DropReason::TooBig));
        }
        let (src, dst) = ((s.vip, s.vport), (s.client, s.client_port));
        Some(
            match forward::nat64::to_v6(pkt.bytes_mut(), parsed, src, dst) {
                Ok(len) if pkt.set_len(len as u16) => {
                    readdress(pkt.bytes_mut(), self.client_hop_v6(&s), cx)
                }
                Ok(_) => Action::Drop(DropReason::TooBig),
                Err(r) => Action::Drop(r),
            },
        )
    }

    /// Where a reply to the client of NAT, FullNAT or NAT64 session `s` goes: the MAC
    /// its packets came from, or, for a session that session sync installed and that has seen
    /// no client packet here yet, the client's neighbour entry (none: dropped as
    /// unresolved, as the client's next packet teaches it).
    pub(super) fn client_hop_v6(&self, s: &Session6) -> Option<MacAddr> {
        if s.peer_mac != [0; 6] {
            return Some(MacAddr(s.peer_mac));
        }
        self.neighbours6.lookup(s.client)
    }

    /// TCP to a health probe's IPv6 source address and ports: an answer to a probe, if
    /// it comes from a real server and acknowledges the probe in flight on its port
    /// (the ports' record of that is returned).
    fn probe_port_v6(&self, key: &FlowKey6) -> Option<&ProbeAcks> {
        let (_, acks) = self.health_source.as_ref()?;
        (key.proto == Protocol::Tcp
            && acks.contains(key.dport)
            && self.health_sources6.contains(&key.dst))
        .then_some(&**acks)
    }

    /// The MAC of IPv6 neighbour `ip`, if this worker has learned it (worker 0 uses
    /// it to address the health probes the management core hands it).
    pub fn neighbour6(&self, ip: Ipv6Addr) -> Option<MacAddr> {
        self.neighbours6.lookup(ip)
    }

    /// An IPv6 neighbour another worker learned (`dataplane::mesh`); not shared again.
    /// A new one that is no real server goes only into the unreserved part of the
    /// table (`NeighbourTable::unreserved`), as it would have here; a real server's
    /// into the whole table, in the slot of one that is no real server when it is full.
    pub fn learn_shared_neighbour6(&mut self, ip: Ipv6Addr, mac: MacAddr, now_tsc: u64) -> Learn {
        let snapshot = self.snapshot.current();
        let keep = |other: Ipv6Addr| snapshot.real_servers_v6().binary_search(&other).is_ok();
        let table = &mut self.neighbours6;
        if keep(ip) {
            table.learn_shared_making_room(ip, mac, now_tsc, table.capacity(), 0, keep)
        } else {
            table.learn_shared_keeping_reserve(ip, mac, now_tsc, false)
        }
    }

    /// Whether `ip` is a real server of some service (in the current snapshot).
    pub fn is_real_server(&self, ip: std::net::IpAddr) -> bool {
        self.snapshot.current().is_real_server(ip)
    }

    /// Calls `each` for the IPv6 neighbours learned or changed since the last call,
    /// for the other workers; returns how many changes did not fit in between.
    pub fn take_neighbour6_changes(&mut self, each: impl FnMut(Ipv6Addr, MacAddr)) -> usize {
        self.neighbours6.take_changes(each)
    }

    /// Asks for `target`'s MAC at the next housekeeping: the worker solicits the real
    /// servers it does not know (at most ten times a second each).
    pub(crate) fn request_resolution_v6(&mut self) {
        self.resolve_wanted = true;
    }

    /// Addresses a rewritten frame to the IPv6 real server `target` at `next_hop`,
    /// or, while its MAC is unknown, holds it (`Held`, as IPv4 frames wait for ARP)
    /// and asks for it by Neighbor Solicitation.
    pub(super) fn address_v6(
        &mut self,
        frame: &mut [u8],
        next_hop: Option<MacAddr>,
        target: Ipv6Addr,
        cx: &Context,
    ) -> Action {
        if next_hop.is_none() {
            self.request_resolution_v6();
            return Action::Hold(target.into());
        }
        readdress(frame, next_hop, cx)
    }

    /// How many IPv6 neighbour entries were inserted or changed so far (held frames
    /// wait for it to move).
    pub fn neighbour6_learned_total(&self) -> u64 {
        self.neighbours6.learned_total()
    }

    /// Calls `send` for each IPv6 real server of the current snapshot whose MAC is
    /// not known yet, at most ten times a second per address; with `recheck`, also for
    /// each whose entry was not confirmed for `NEIGHBOUR_RECHECK_S`; stops at the first
    /// `send` that finds no room (as the IPv4 ones).
    pub fn resolve_real_servers_v6(
        &mut self,
        now_tsc: u64,
        recheck: bool,
        mut send: impl FnMut(Ipv6Addr) -> bool,
    ) {
        let snap = self.snapshot.current();
        let servers = snap.real_servers_v6();
        // As for IPv4: a round that runs out of room is resumed where it stopped.
        let start = self.resolve_cursor.1 % servers.len().max(1);
        for k in 0..servers.len() {
            let at = (start + k) % servers.len();
            let ip = servers[at];
            self.resolve_cursor.1 = at;
            if self.neighbours6.lookup(ip).is_some() {
                let age = self.neighbour_recheck_tsc;
                if recheck && self.neighbours6.recheck_due(ip, now_tsc, age) {
                    if !send(ip) {
                        return;
                    }
                    self.neighbours6.mark_rechecked(ip, now_tsc);
                }
                continue;
            }
            let folded = fold_ipv6(ip);
            let slot = &mut self.arp_sent[super::limiter_slot(folded)];
            let tag = u32::from(folded) ^ 0x8000_0000;
            if slot.0 == tag && now_tsc.wrapping_sub(slot.1) < self.arp_interval_tsc {
                continue;
            }
            if !send(ip) {
                return;
            }
            *slot = (tag, now_tsc);
        }
    }

    /// Removes the IPv6 sessions whose time has come, a bounded number of slots per
    /// call, and gives their real servers their counts back; returns how many went.
    pub(super) fn sweep_v6(&mut self) -> u64 {
        let now_ms = self.ts_clock.now_ms();
        let Forwarder {
            sessions6,
            real_servers,
            load_view,
            schedulers,
            overload,
            now_tick,
            pool,
            persist,
            snapshot,
            ticks_per_second,
            ..
        } = self;
        let real_servers = &real_servers[..];
        let mut expired = 0;
        let snap = snapshot.current();
        let now = *now_tick;
        sessions6.sweep_visiting(
            now,
            SWEEP_BUDGET,
            |s| {
                expired += 1;
                super::extend_template6(persist, snap, s, now, *ticks_per_second);
                forget_v6(real_servers, s);
                release_nat64_port(pool, s, now_ms);
                super::tell_load(load_view, schedulers, overload, real_servers, s.real);
            },
            // A live connection keeps its persistence template. The sweep comes by
            // far more often than a renewal is due: the session's tick rate-limits it.
            |s| {
                if !s.persistent || (now.wrapping_sub(s.template_due) as i32) < 0 {
                    return;
                }
                s.template_due = super::keep_client_template(
                    persist,
                    snap,
                    s.service,
                    s.client.into(),
                    s.persistent,
                    now,
                    *ticks_per_second,
                )
                .unwrap_or(now.wrapping_add(*ticks_per_second));
            },
        );
        expired
    }

    /// A real server's segment moves IPv6 session `id` (IPv6, or IPv4 for NAT64): its
    /// acknowledgment, when it has one, may start the client's sequence
    /// ([`SessionTable6::on_server_segment`]).
    fn server_segment_v6(
        &mut self,
        id: u32,
        pkt: &Packet,
        parsed: &Parsed,
        flags: TcpFlags,
    ) -> Option<Transition> {
        let dir = Direction::Outbound;
        match super::segment_seq(pkt.bytes(), parsed, dir, flags) {
            super::SegmentSeq::ServerAck(ack) => {
                self.sessions6
                    .on_server_segment(id, flags, ack, self.now_tick, &self.timeouts)
            }
            _ => self
                .sessions6
                .on_packet(id, dir, flags, self.now_tick, &self.timeouts),
        }
    }

    /// What the lookup `found`, unless the packet is a SYN on the client key of a
    /// connection that is over, or of one whose real server has been evicted or
    /// removed: the session is retired and the packet is a miss, scheduled afresh, as
    /// for IPv4 (`unless_reopened`).
    #[inline]
    fn unless_reopened_v6(
        &mut self,
        found: Option<(u32, Direction)>,
        flags: TcpFlags,
        counters: &WorkerCounters,
    ) -> Option<(u32, Direction)> {
        if let Some((id, Direction::Inbound | Direction::InputOnly)) = found {
            if super::miss::opens_connection(flags)
                && self.sessions6.get(id).is_some_and(|s| {
                    super::miss::connection_over(s.proto, s.state(), s.no_output())
                        || !self.snapshot.current().keeps_real_server(s.real)
                })
            {
                self.retire_v6(id, counters);
                return None;
            }
        }
        found
    }

    /// Table pressure, as for IPv4 (`relieve_pressure`): when at most 1/64 of the
    /// IPv6 table's slots are free, up to two half-open TCP sessions go, oldest
    /// first, so a flood of SYNs that never complete cannot lock new IPv6
    /// connections out until they time out (and, for NAT64, give back the local
    /// ports they hold), and finished ones (TIME_WAIT, CLOSE) with them. Established
    /// sessions are never reclaimed. Counted as `half_open_reclaimed` or
    /// `finished_reclaimed`.
    fn relieve_pressure_v6(&mut self, counters: &WorkerCounters) {
        use super::placement::{PRESSURE_FREE_SHARE, RECLAIM_PER_NEW, RECLAIM_SCAN};
        let reserve = (self.sessions6.capacity() / PRESSURE_FREE_SHARE).max(1);
        if self.sessions6.free() > reserve {
            return;
        }
        for _ in 0..RECLAIM_PER_NEW {
            let Some(id) = self.sessions6.oldest_reclaimable(RECLAIM_SCAN) else {
                return;
            };
            let finished = self.sessions6.get(id).is_some_and(|s| s.is_finished());
            self.retire_v6(id, counters);
            counters.event(if finished {
                Event::FinishedReclaimed
            } else {
                Event::HalfOpenReclaimed
            });
        }
    }

    /// Removes IPv6 session `id` before its time, with an expired one's bookkeeping,
    /// and tells the standby (`retire` for IPv4).
    pub(super) fn retire_v6(&mut self, id: u32, counters: &WorkerCounters) {
        let Some(s) = self.sessions6.remove(id) else {
            return;
        };
        self.sync_retired_v6(&s);
        let now_ms = self.ts_clock.now_ms();
        super::extend_template6(
            &self.persist,
            self.snapshot.current(),
            &s,
            self.now_tick,
            self.ticks_per_second,
        );
        forget_v6(&self.real_servers, &s);
        release_nat64_port(&mut self.pool, &s, now_ms);
        self.load_changed(s.real);
        bump(&counters.sessions_expired, 1);
    }

    /// This worker's IPv6 sessions (for listings and checks, not per packet).
    pub fn sessions6(&self) -> &crate::session::table6::SessionTable6 {
        &self.sessions6
    }
}

/// Addresses a rewritten frame to `next_hop` from the port.
pub(super) fn readdress(frame: &mut [u8], next_hop: Option<MacAddr>, cx: &Context) -> Action {
    match next_hop {
        Some(mac) => match forward::dr::forward(frame, mac, cx.port.mac) {
            Ok(()) => Action::Transmit,
            Err(r) => Action::Drop(r),
        },
        None => Action::Drop(DropReason::NeighbourUnresolved),
    }
}

/// A NAT64 session's end: its IPv4 local port goes back to its local address's pool.
pub(super) fn release_nat64_port(
    pool: &mut Option<crate::forward::laddr::PortPool>,
    s: &Session6,
    now_ms: u32,
) {
    let (Some(lip), Some(real)) = (s.local_addr.to_ipv4_mapped(), nat64_real(s)) else {
        return;
    };
    if let Some(pool) = pool {
        let _ = pool.release(lip, s.local_port, real, now_ms);
    }
}

/// The IPv4 real server of a NAT64 session (FullNAT to an IPv4-mapped address).
pub(super) fn nat64_real(s: &Session6) -> Option<std::net::Ipv4Addr> {
    (s.mode == ForwardMode::FullNat)
        .then(|| s.real_addr.to_ipv4_mapped())
        .flatten()
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

/// Whether a new connection may come from `client`: not a martian
/// ([`ipv6::is_martian_source`]: unspecified, multicast or loopback), and not an
/// address of this appliance (the port's, an IPv6 VIP, an IPv6
/// FullNAT local address). A session for one of ours would send the real server's
/// answers to ourselves, as the VIP's own in NAT (IPv4's `miss::may_be_client`).
fn may_be_client6(
    client: Ipv6Addr,
    snap: &crate::service::Snapshot,
    responder: &crate::dataplane::local::LocalResponder,
) -> bool {
    !(ipv6::is_martian_source(client)
        || responder.is_local6(client)
        || snap.is_vip6(client)
        || snap.is_local_address6(client))
}

#[cfg(test)]
mod tests {
    use super::super::{ForwarderConfig, RssView};
    use super::*;
    use crate::model::{RealServerSpec, SchedulerKind};
    use crate::service::{ServiceTable, Snapshot, SnapshotPublisher};
    use std::collections::HashSet;
    use std::sync::Arc;

    const VIP: &str = "2001:db8:18::100";
    const REAL: &str = "2001:db8:1a::11";
    const LIPS: [&str; 2] = ["2001:db8:1a::50", "2001:db8:1a::51"];

    /// Worker `queue` of two behind the default key and a round-robin RETA, with one
    /// IPv6 FullNAT service over two local addresses and the publisher it follows.
    fn worker(queue: u16) -> (SnapshotPublisher, Forwarder) {
        worker_with(queue, |_| {})
    }

    /// [`worker`], with `more` done to the service table first.
    fn worker_with(
        queue: u16,
        more: impl FnOnce(&mut ServiceTable),
    ) -> (SnapshotPublisher, Forwarder) {
        let mut table = ServiceTable::new();
        let key = ServiceKey::new(Protocol::Tcp, VIP.parse::<Ipv6Addr>().unwrap(), 80);
        table.add_service(key, SchedulerKind::Rr, None).unwrap();
        let real: Ipv6Addr = REAL.parse().unwrap();
        table
            .add_server(
                key,
                RealServerSpec::new(real, 8080, 1, ForwardMode::FullNat),
            )
            .unwrap();
        for lip in LIPS {
            table
                .add_laddr(key, lip.parse::<Ipv6Addr>().unwrap().into())
                .unwrap();
        }
        let nat = ServiceKey::new(Protocol::Tcp, VIP.parse::<Ipv6Addr>().unwrap(), 81);
        table.add_service(nat, SchedulerKind::Rr, None).unwrap();
        table
            .add_server(nat, RealServerSpec::new(real, 9090, 1, ForwardMode::Nat))
            .unwrap();
        more(&mut table);
        let publisher = SnapshotPublisher::new(Snapshot::build(1, &table));
        let hz = 1_000_000_000;
        let config = ForwarderConfig::new(
            1024,
            publisher.reader(),
            crate::session::Timeouts::default().in_ticks(100),
            hz / 10,
            hz,
            Arc::new(crate::dataplane::realserver_stats::new_table()),
            RssView::default_spread(2, queue),
        );
        (publisher, Forwarder::new(config))
    }

    /// As for IPv4: a SYN on the session of an evicted or removed real server, or on
    /// one whose connection is over, retires it and is a miss; every other segment
    /// stays with the session.
    #[test]
    fn a_syn_on_a_session_of_an_evicted_server_or_an_ended_one_opens_anew() {
        let mut kept = None;
        let (publisher, mut f) = worker_with(0, |t| kept = Some(t.clone()));
        let mut table = kept.unwrap();
        let vip: Ipv6Addr = VIP.parse().unwrap();
        let nat = ServiceKey::new(Protocol::Tcp, vip, 81);
        let real = table.get(nat).unwrap().real_servers[0].id;
        let service = f.snapshot.current().find_index(&nat).unwrap() as u32;
        let key = FlowKey6 {
            src: "2001:db8:2::7".parse().unwrap(),
            dst: vip,
            sport: 40000,
            dport: 81,
            proto: Protocol::Tcp,
        };
        let session = || {
            Session6::new(
                &key,
                ForwardMode::Nat,
                service,
                real,
                REAL.parse().unwrap(),
                9090,
            )
        };
        // Each session the standby heard of.
        let open = |f: &mut Forwarder, state: TcpState| {
            let mut s = session().synced(state, false);
            s.mark_synced(0);
            f.sessions6.insert(s, 0, 100, |_| {}).unwrap();
            f.sessions6.lookup(&key, 0)
        };
        let publish = |f: &mut Forwarder, table: &ServiceTable, evicted: &[u32]| {
            let health = crate::service::HealthOverlay {
                evicted: evicted.iter().copied().collect(),
                ..Default::default()
            };
            let generation = publisher.next_generation();
            publisher
                .publish(Snapshot::build_with(generation, table, &health, &[]))
                .unwrap();
            f.poll(0, &crate::dataplane::counters::WorkerCounters::default());
        };
        let counters = crate::dataplane::counters::WorkerCounters::default();
        let events = Arc::new(vec![
            crate::dataplane::sync_events::EventRing::with_capacity(16),
        ]);
        f.sync = Some(super::super::SyncLink {
            rings: events.clone(),
            index: 0,
            policy: crate::dataplane::sync_events::SyncPolicy::default(),
        });
        let deleted = || {
            let mut kinds = Vec::new();
            events[0].drain(16, |e| kinds.push(e.kind));
            kinds
        };
        let found = open(&mut f, TcpState::SynRecv);
        assert!(found.is_some());
        assert_eq!(f.unless_reopened_v6(found, TcpFlags::SYN, &counters), found);
        publish(&mut f, &table, &[real]);
        assert_eq!(f.unless_reopened_v6(found, TcpFlags::ACK, &counters), found);
        assert_eq!(
            f.unless_reopened_v6(found, TcpFlags::SYN | TcpFlags::ACK, &counters),
            found
        );
        assert_eq!(f.unless_reopened_v6(found, TcpFlags::SYN, &counters), None);
        assert_eq!(
            f.sessions6.lookup(&key, 0),
            None,
            "the old session is retired"
        );
        // The standby is told, so the new connection is not taken there for it.
        assert_eq!(
            deleted(),
            [crate::dataplane::sync_events::EventKind::Deleted]
        );
        assert_eq!(
            counters
                .sessions_expired
                .load(std::sync::atomic::Ordering::Relaxed),
            1
        );
        // Restored: a SYN on an ended connection (TIME_WAIT) opens anew too.
        publish(&mut f, &table, &[]);
        let found = open(&mut f, TcpState::Established);
        assert_eq!(f.unless_reopened_v6(found, TcpFlags::SYN, &counters), found);
        f.sessions6.remove(found.unwrap().0);
        let found = open(&mut f, TcpState::TimeWait);
        assert_eq!(f.unless_reopened_v6(found, TcpFlags::SYN, &counters), None);
        // Removed from the table: the same.
        let found = open(&mut f, TcpState::SynRecv);
        table
            .delete_server(nat, REAL.parse::<Ipv6Addr>().unwrap().into(), 9090)
            .unwrap();
        publish(&mut f, &table, &[]);
        assert_eq!(f.unless_reopened_v6(found, TcpFlags::SYN, &counters), None);
        assert_eq!(f.sessions6.lookup(&key, 0), None);
        // One that expires counts as expired too.
        let expired = |c: &crate::dataplane::counters::WorkerCounters| {
            c.sessions_expired
                .load(std::sync::atomic::Ordering::Relaxed)
        };
        let before = expired(&counters);
        f.sessions6.insert(session(), 0, 1, |_| {}).unwrap();
        // 10 s of TSC at 1 GHz, 100 ms ticks: long past its one tick.
        for _ in 0..64 {
            f.poll(10_000_000_000, &counters);
        }
        assert_eq!(f.sessions6.len(), 0);
        assert_eq!(expired(&counters), before + 1);
    }

    /// [`Forwarder::local_port_v6`] towards `real`:8080, TCP, counted nowhere.
    fn local_port(
        f: &mut Forwarder,
        service: &crate::model::Service,
        real: Ipv6Addr,
    ) -> Result<(Ipv6Addr, u16), DropReason> {
        f.local_port_v6(
            service,
            real,
            8080,
            Protocol::Tcp,
            &WorkerCounters::default(),
        )
    }

    #[test]
    fn fullnat_local_ports_are_those_whose_reply_hashes_to_the_choosing_worker() {
        let real: Ipv6Addr = REAL.parse().unwrap();
        let mut chosen: [HashSet<(Ipv6Addr, u16)>; 2] = Default::default();
        for queue in 0..2u16 {
            let (_publisher, mut f) = worker(queue);
            let service = f.snapshot.current_arc().services()[0].clone();
            for _ in 0..2000 {
                let (lip, port) = local_port(&mut f, &service, real).unwrap();
                // The whole tuple hashed afresh (not the split the choice uses).
                let hash = f.rss.toeplitz.hash_ipv6_ports(real, lip, 8080, port);
                assert_eq!(f.rss.reta.queue(hash), queue, "[{lip}]:{port}");
                assert!(chosen[usize::from(queue)].insert((lip, port)));
            }
            // Both addresses used, about half of the pairs walked kept.
            let lips: HashSet<_> = chosen[usize::from(queue)].iter().map(|p| p.0).collect();
            assert_eq!(lips.len(), 2);
            assert!(f.laddr6_cursor < 6000, "{} pairs walked", f.laddr6_cursor);
        }
        assert!(
            chosen[0].is_disjoint(&chosen[1]),
            "two workers never take the same pair towards one real server"
        );
    }

    #[test]
    fn a_nat_reply_goes_to_the_worker_of_its_request_tuple_once() {
        let (real, vip): (Ipv6Addr, Ipv6Addr) = (REAL.parse().unwrap(), VIP.parse().unwrap());
        let mut seen = [0usize; 2];
        for queue in 0..2u16 {
            let (_publisher, f) = worker(queue);
            for n in 0..200u16 {
                let client =
                    Ipv6Addr::from(0x2001_0db8_0018_0000_0000_0000_0000_1000 + u128::from(n));
                let reply = FlowKey6 {
                    src: real,
                    dst: client,
                    sport: 9090,
                    dport: 40000 + n,
                    proto: Protocol::Tcp,
                };
                let request = f.rss.toeplitz.hash_ipv6_ports(client, vip, 40000 + n, 81);
                let owner = f.rss.reta.queue(request);
                let expected = (owner != queue).then_some(Action::Redirect(owner));
                assert_eq!(f.reply_owner_v6(&reply, false), expected, "{client}");
                assert_eq!(f.reply_owner_v6(&reply, true), None, "never twice");
                seen[usize::from(owner)] += 1;
                // Not a NAT real server's port: no one's reply.
                let stray = FlowKey6 {
                    sport: 9091,
                    ..reply
                };
                assert_eq!(f.reply_owner_v6(&stray, false), None);
            }
        }
        assert!(seen.iter().all(|&n| n > 100), "{seen:?}");
    }

    #[test]
    fn an_icmpv6_error_goes_to_the_worker_of_the_session_it_quotes_once() {
        let (real, vip): (Ipv6Addr, Ipv6Addr) = (REAL.parse().unwrap(), VIP.parse().unwrap());
        let workers = [worker(0), worker(1)];
        let owner_at = |at: usize, key: &FlowKey6| workers[at].1.icmp6_error_owner(key, false);
        let mut seen = [0usize; 2];
        for n in 0..200u16 {
            let client = Ipv6Addr::from(0x2001_0db8_0018_0000_0000_0000_0000_2000 + u128::from(n));
            let cport = 30000 + n;
            // From the client's side, about a reply (VIP:80 -> client): the quote
            // reversed is the request tuple, its owner the hash of that tuple.
            let request = FlowKey6 {
                src: client,
                dst: vip,
                sport: cport,
                dport: 80,
                proto: Protocol::Tcp,
            };
            let hash = workers[0]
                .1
                .rss
                .toeplitz
                .hash_ipv6_ports(client, vip, cport, 80);
            let owner = workers[0].1.rss.reta.queue(hash);
            seen[usize::from(owner)] += 1;
            // From a NAT real server's side, about the client's packet readdressed to
            // it (client -> RS:9090): the reply tuple, owned as its request (to :81).
            let nat_reply = FlowKey6 {
                src: real,
                dst: client,
                sport: 9090,
                dport: cport,
                proto: Protocol::Tcp,
            };
            let hash = workers[0]
                .1
                .rss
                .toeplitz
                .hash_ipv6_ports(client, vip, cport, 81);
            let nat_owner = workers[0].1.rss.reta.queue(hash);
            for at in 0..2u16 {
                let other = |owner: u16| (owner != at).then_some(owner);
                assert_eq!(
                    owner_at(usize::from(at), &request),
                    other(owner),
                    "{client}"
                );
                assert_eq!(owner_at(usize::from(at), &nat_reply), other(nat_owner));
                let f = &workers[usize::from(at)].1;
                assert_eq!(f.icmp6_error_owner(&request, true), None, "never twice");
                assert_eq!(f.icmp6_error_owner(&nat_reply, true), None);
            }
        }
        assert!(seen.iter().all(|&n| n > 50), "{seen:?}");
        // From a FullNAT real server's side, about LIP:lport -> RS:8080: the worker
        // that chose that local port, whichever worker the error reached; also when
        // RS:8080 serves a NAT service as well (its replies to clients are owned by
        // their request tuples, not this one).
        let nat_too = |table: &mut ServiceTable| {
            let key = ServiceKey::new(Protocol::Tcp, vip, 84);
            table.add_service(key, SchedulerKind::Rr, None).unwrap();
            let spec = RealServerSpec::new(real, 8080, 1, ForwardMode::Nat);
            table.add_server(key, spec).unwrap();
        };
        let workers = [worker_with(0, nat_too), worker_with(1, nat_too)];
        let owner_at = |at: usize, key: &FlowKey6| workers[at].1.icmp6_error_owner(key, false);
        for (chooser, (_, f)) in [worker(0), worker(1)].iter_mut().enumerate() {
            let service = f.snapshot.current_arc().services()[0].clone();
            for _ in 0..100 {
                let (lip, lport) = local_port(f, &service, real).unwrap();
                let reply = FlowKey6 {
                    src: real,
                    dst: lip,
                    sport: 8080,
                    dport: lport,
                    proto: Protocol::Tcp,
                };
                let chooser = chooser as u16;
                assert_eq!(owner_at(usize::from(chooser), &reply), None);
                assert_eq!(
                    owner_at(usize::from(1 - chooser), &reply),
                    Some(chooser),
                    "[{lip}]:{lport}"
                );
            }
        }
    }

    /// Every pair of this worker towards the real server held: until the half-open
    /// sessions holding them are over 3 s old, a new connection is refused; after,
    /// each takes the pair of one of them (gone from the table, counted), never one
    /// established.
    #[test]
    fn with_every_pair_held_a_new_connection_takes_an_old_half_open_sessions_pair() {
        let (real, vip): (Ipv6Addr, Ipv6Addr) = (REAL.parse().unwrap(), VIP.parse().unwrap());
        let (_publisher, mut f) = worker(0);
        f.local_ports = 40000..=40063;
        let counters = WorkerCounters::default();
        let snap = f.snapshot.current_arc();
        let index = snap
            .find_index(&ServiceKey::new(Protocol::Tcp, vip, 80))
            .unwrap();
        let service = snap.services()[index].clone();
        let rs_id = service.real_servers[0].id;
        let take =
            |f: &mut Forwarder| f.local_port_v6(&service, real, 8080, Protocol::Tcp, &counters);
        let mut client_port = 10_000u16;
        let mut hold = |f: &mut Forwarder, (lip, port): (Ipv6Addr, u16), state: TcpState| {
            client_port += 1;
            let key = FlowKey6 {
                src: "2001:db8:2::7".parse().unwrap(),
                dst: vip,
                sport: client_port,
                dport: 80,
                proto: Protocol::Tcp,
            };
            let mut s = Session6::new(&key, ForwardMode::FullNat, index as u32, rs_id, real, 8080)
                .synced(state, false);
            (s.local_addr, s.local_port) = (lip, port);
            let now = f.now_tick;
            f.sessions6.insert(s, now, 1_000_000, |_| {}).unwrap();
            key
        };
        let mut established = Vec::new();
        let mut half_open = std::collections::HashMap::new();
        while let Ok(pair) = take(&mut f) {
            if established.len() < 8 {
                established.push(hold(&mut f, pair, TcpState::Established));
            } else {
                half_open.insert(pair, hold(&mut f, pair, TcpState::SynRecv));
            }
        }
        assert!(half_open.len() > 20, "{} pairs", half_open.len());
        let reclaimed = || counters.events_snapshot()[Event::LocalPortReclaimed as usize];
        assert_eq!(reclaimed(), 0, "none 3 s old yet");
        f.now_tick += super::super::placement::half_open_min_age(f.tick_ms);
        assert!(take(&mut f).is_err(), "3 s old is not over 3 s");
        f.now_tick += 1;
        for n in 1..=20 {
            let pair = take(&mut f).unwrap_or_else(|e| panic!("connection {n}: {e:?}"));
            let old = half_open
                .remove(&pair)
                .expect("the pair of a half-open session");
            assert_eq!(f.sessions6.lookup(&old, f.now_tick), None);
            assert_eq!(reclaimed(), n);
            hold(&mut f, pair, TcpState::SynRecv);
        }
        for key in &established {
            assert!(f.sessions6.lookup(key, f.now_tick).is_some());
        }
    }

    #[test]
    fn a_worker_that_no_reply_can_reach_refuses_rather_than_searching_on() {
        let real: Ipv6Addr = REAL.parse().unwrap();
        let (_publisher, mut f) = worker(1);
        // Every hash on queue 0: no pair is this worker's.
        f.rss.reta = crate::flow::rss::Reta::from_entries(vec![0; 128]).unwrap();
        let service = f.snapshot.current_arc().services()[0].clone();
        assert_eq!(
            local_port(&mut f, &service, real),
            Err(DropReason::LaddrExhausted)
        );
        assert_eq!(f.laddr6_cursor, LOCAL_PORT_CANDIDATES as u64);
    }

    #[test]
    fn new_connections_from_our_own_or_martian_addresses_are_refused() {
        let (_publisher, f) = worker(0);
        let port6: Ipv6Addr = "2001:db8:18::1".parse().unwrap();
        let responder = crate::dataplane::local::LocalResponder::new(
            [2, 0x53, 0x4c, 0, 0, 1],
            &[(std::net::Ipv4Addr::new(198, 18, 0, 1), 24)],
        )
        .with_ipv6(&[port6]);
        let snap = f.snapshot.current();
        let ours = [VIP, LIPS[0], LIPS[1]].map(|a| a.parse::<Ipv6Addr>().unwrap());
        for addr in ours.into_iter().chain([port6]) {
            assert!(!may_be_client6(addr, snap, &responder), "{addr}");
        }
        for martian in [
            Ipv6Addr::UNSPECIFIED,
            Ipv6Addr::LOCALHOST,
            "ff02::1".parse().unwrap(),
            "ff0e::1:2".parse().unwrap(),
        ] {
            assert!(!may_be_client6(martian, snap, &responder), "{martian}");
        }
        for client in ["2001:db8:18::99", REAL, "fe80::1"] {
            let client: Ipv6Addr = client.parse().unwrap();
            assert!(may_be_client6(client, snap, &responder), "{client}");
        }
    }
}
