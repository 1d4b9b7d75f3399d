//! Egress: the packet leaves for its session's mode. DR readdresses the frame, NAT
//! rewrites one end (`forward::dnat`/`snat`), FullNAT both (`forward::nat`), TUN
//! encapsulates (`forward::tun`, or answers frag-needed); then the frame is addressed
//! to its next hop, or held until that resolves. FullNAT TOA (`forward::toa`) follows
//! the rewrite.
use super::{done, Action, Context, Forwarder, Matched, PortContext};
use crate::dataplane::counters::{Event, WorkerCounters};
use crate::dataplane::neighbour::NeighbourTable;
use crate::dpdk::Packet;
use crate::flow::parse::{PacketKind, Parsed};
use crate::forward::{self, MtuCheck};
use crate::model::{DropReason, ForwardMode};
use crate::session::{Direction, Session, SessionFlags};
use crate::wire::arp;
use crate::wire::ethernet::MacAddr;
use crate::wire::tcp::TcpFlags;
use std::net::Ipv4Addr;

impl Forwarder {
    /// Egress of a TCP/UDP packet of session `m`: rewritten and addressed for the
    /// session's mode ([`Forwarder::forward`]). A DR or TUN session keeps the MAC its
    /// packet went to, for when the neighbour table no longer has its real server
    /// ([`Forwarder::next_hop`]); a FullNAT session with TOA pending gets the TOA work
    /// done on this packet (see [`Forwarder::toa`]). Inlined into both callers (`l4`
    /// and the burst's parked sessions): out of line it costs the established path
    /// a call and its spills, about 40 instructions a packet (callgrind).
    #[inline(always)]
    pub(super) fn egress(
        &mut self,
        pkt: &mut Packet,
        parsed: &Parsed,
        m: &Matched,
        flags: TcpFlags,
        cx: &Context,
    ) -> Action {
        let s = &m.session;
        let action = self.forward(pkt, parsed, s, m.dir, cx);
        if let (Action::Transmit, ForwardMode::Dr | ForwardMode::Tun) = (action, s.mode) {
            // Keep the MAC the frame went to (its destination, just written) as the
            // session's fallback: written only when it changed.
            let sent_to = pkt.bytes().get(..6);
            if sent_to.is_some_and(|mac| mac != s.peer_mac) {
                if let (Some(mac), Some(live)) = (sent_to, self.sessions.get_mut(m.id)) {
                    live.peer_mac.copy_from_slice(mac);
                }
            }
        }
        if matches!(action, Action::Transmit | Action::Hold(_))
            && s.flags().contains(SessionFlags::SYNPROXY)
        {
            if let Err(reason) = self.synproxy_translate(pkt, parsed, m) {
                return Action::Drop(reason);
            }
        }
        if matches!(action, Action::Transmit | Action::Hold(_))
            && s.flags().contains(SessionFlags::TOA_PENDING)
        {
            self.toa(pkt, parsed, m, flags, cx.port, cx.counters);
        }
        action
    }

    /// Rewrites the packet of session `s` going `dir` for the session's mode, then
    /// addresses it: replies (NAT, FullNAT) to the client's next hop, everything else
    /// to the real server's. Rewrite first, then address the frame: a frame whose next
    /// hop is not resolved yet is complete but for its MACs, and waits
    /// (`Action::Hold`). A reply of a DR or TUN session cannot come through here.
    pub(super) fn forward(
        &mut self,
        pkt: &mut Packet,
        parsed: &Parsed,
        s: &Session,
        dir: Direction,
        cx: &Context,
    ) -> Action {
        let (port, neighbours) = (cx.port, &*cx.neighbours);
        let rs_ip = Ipv4Addr::from(s.real_addr);
        let client = Ipv4Addr::from(s.client_addr);
        match (s.mode, dir) {
            (ForwardMode::Nat, Direction::Outbound) => {
                let frame = pkt.bytes_mut();
                if let Err(r) = forward::snat(frame, parsed, Ipv4Addr::from(s.vip), s.vport) {
                    return Action::Drop(r);
                }
                address(frame, client_next_hop(s, neighbours), client, port)
            }
            (ForwardMode::FullNat, Direction::Outbound) => {
                // RS -> LIP:lport becomes VIP:vport -> client:cport.
                let frame = pkt.bytes_mut();
                let src = (Ipv4Addr::from(s.vip), s.vport);
                let dst = (client, s.client_port);
                if let Err(r) = forward::nat::rewrite(frame, parsed, Some(src), Some(dst)) {
                    return Action::Drop(r);
                }
                // The real server echoes Sluice's clock: the client gets its own back.
                let offset = s.timestamp_offset();
                if offset != 0 {
                    if let Err(r) = forward::timestamps::shift(frame, parsed, 0, offset) {
                        return Action::Drop(r);
                    }
                }
                address(frame, client_next_hop(s, neighbours), client, port)
            }
            (_, Direction::Outbound) => Action::Drop(DropReason::NotLocal),
            (mode, _) => {
                let rs_mac = self.next_hop(s, neighbours);
                match mode {
                    ForwardMode::Dr => address(pkt.bytes_mut(), rs_mac, rs_ip, port),
                    ForwardMode::Nat => {
                        let frame = pkt.bytes_mut();
                        if let Err(r) = forward::dnat(frame, parsed, rs_ip, s.real_port) {
                            return Action::Drop(r);
                        }
                        address(frame, rs_mac, rs_ip, port)
                    }
                    ForwardMode::Tun => match self.tunnel(pkt, parsed, rs_ip, cx) {
                        Action::Transmit => address(pkt.bytes_mut(), rs_mac, rs_ip, port),
                        other => other,
                    },
                    ForwardMode::FullNat => {
                        // client:cport -> VIP:vport becomes LIP:lport -> RIP:rport.
                        let frame = pkt.bytes_mut();
                        let src = (Ipv4Addr::from(s.local_addr), s.local_port);
                        let dst = (rs_ip, s.real_port);
                        if let Err(r) = forward::nat::rewrite(frame, parsed, Some(src), Some(dst)) {
                            return Action::Drop(r);
                        }
                        let offset = s.timestamp_offset();
                        if offset != 0 {
                            if let Err(r) = forward::timestamps::shift(frame, parsed, offset, 0) {
                                return Action::Drop(r);
                            }
                        }
                        // A TOA option of the client's own would be believed by a TOA
                        // module on the real server (TOA on or off here); the segment
                        // still to get Sluice's has them replaced there (`toa`).
                        if matches!(parsed.kind, PacketKind::Tcp { .. })
                            && !s.flags().contains(SessionFlags::TOA_PENDING)
                        {
                            let removed = forward::toa::remove_forged_classified(frame, parsed);
                            if removed != 0 {
                                cx.counters.event_n(Event::ToaForgedRemoved, removed as u64);
                            }
                        }
                        address(frame, rs_mac, rs_ip, port)
                    }
                }
            }
        }
    }

    /// The real server's MAC: the neighbour table's, so a session follows a real
    /// server whose MAC changed (a NIC swapped, a VM moved, an address taken over by
    /// its pair) as soon as the table learns it; else, for DR and TUN, the one the
    /// session last sent to. That fallback keeps the connections of a real server no
    /// longer configured, whose entry may have given its slot to another, and of one a
    /// session sync record installed before this node resolved it.
    pub(super) fn next_hop(&self, s: &Session, neighbours: &NeighbourTable) -> Option<MacAddr> {
        neighbours.lookup(Ipv4Addr::from(s.real_addr)).or_else(|| {
            (s.peer_mac != [0; 6] && matches!(s.mode, ForwardMode::Dr | ForwardMode::Tun))
                .then_some(MacAddr(s.peer_mac))
        })
    }

    /// Encapsulates the frame for `rs_ip` (IPIP); the outer Ethernet addresses are
    /// left for `address`. Too big with DF: a frag-needed instead, within the worker's
    /// ICMP error rate.
    fn tunnel(
        &mut self,
        pkt: &mut Packet,
        parsed: &Parsed,
        rs_ip: Ipv4Addr,
        cx: &Context,
    ) -> Action {
        let port = cx.port;
        match forward::check_mtu(pkt.bytes(), parsed, port.mtu) {
            MtuCheck::Fits => {}
            MtuCheck::FragNeeded { next_hop_mtu } => {
                // From the VIP the packet was sent to, as IPVS's host stack answers a
                // packet to a local address: the client's filters expect the VIP,
                // and a port address may be private.
                let Some((_, vip)) = parsed.ip_addrs() else {
                    return Action::Drop(DropReason::TooBig);
                };
                let frame = pkt.bytes_mut();
                let Some(len) = forward::frag_needed(frame, parsed, next_hop_mtu, vip, port.mac)
                else {
                    return Action::Drop(DropReason::TooBig);
                };
                return self.send_icmp_error(pkt, len, cx);
            }
            MtuCheck::TooBig => return Action::Drop(DropReason::TooBig),
        }
        if !pkt.prepend(forward::tun::OUTER_HEADER_LEN as u16) {
            return Action::Drop(DropReason::TooBig);
        }
        self.ip_ident = self.ip_ident.wrapping_add(1);
        let l2_len = parsed.l3;
        match forward::encapsulate(
            pkt.bytes_mut(),
            l2_len,
            port.addr,
            rs_ip,
            MacAddr::ZERO,
            port.mac,
            self.ip_ident,
        ) {
            Ok(len) if pkt.set_len(len as u16) => Action::Transmit,
            Ok(_) => Action::Drop(DropReason::TooBig),
            Err(r) => Action::Drop(r),
        }
    }

    /// A packet too big for its tunnel, rewritten into an ICMP error of `len` bytes
    /// (frag-needed, Packet Too Big): sent while the worker's ICMP error rate allows,
    /// else dropped and counted as suppressed. Either way the packet counts as
    /// `too_big`.
    pub(super) fn send_icmp_error(&mut self, pkt: &mut Packet, len: usize, cx: &Context) -> Action {
        if !self.icmp_errors.allow(cx.now_tsc) {
            cx.counters.event(Event::IcmpErrorSuppressed);
            return Action::Drop(DropReason::TooBig);
        }
        if pkt.set_len(len as u16) {
            Action::TransmitInstead(DropReason::TooBig)
        } else {
            Action::Drop(DropReason::TooBig)
        }
    }

    /// FullNAT TOA, after the segment was rewritten: the real server's SYN-ACK gets its
    /// MSS lowered by the option's 8 bytes (so segments carrying TOA still fit the
    /// path), and the client's first ACK or data segment gets the client address as
    /// TCP option 254. Once that segment has passed, the session stops asking.
    pub(super) fn toa(
        &mut self,
        pkt: &mut Packet,
        parsed: &Parsed,
        m: &Matched,
        flags: TcpFlags,
        port: &PortContext,
        counters: &WorkerCounters,
    ) {
        let s = &m.session;
        let syn = flags.contains(TcpFlags::SYN);
        match m.dir {
            Direction::Outbound if syn && flags.contains(TcpFlags::ACK) => {
                let _ =
                    forward::toa::clamp_mss(pkt.bytes_mut(), parsed, forward::toa::TOA_LEN as u16);
            }
            Direction::Inbound if !syn && flags.contains(TcpFlags::ACK) => {
                let client = (Ipv4Addr::from(s.client_addr), s.client_port);
                let buf = pkt.with_tailroom_mut();
                let max = buf.len().min(parsed.l3 + port.mtu as usize);
                match forward::toa::insert(buf, parsed, client, max) {
                    Ok(forward::toa::InsertOutcome::Inserted { new_len })
                        if pkt.set_len(new_len as u16) =>
                    {
                        counters.event(Event::ToaInserted)
                    }
                    Ok(forward::toa::InsertOutcome::Replaced) => counters.event(Event::ToaInserted),
                    _ => counters.event(Event::ToaNoRoom),
                }
                if let Some(live) = self.sessions.get_mut(m.id) {
                    live.clear_flags(SessionFlags::TOA_PENDING);
                }
            }
            _ => {}
        }
    }

    /// The next hop is unknown: turn this packet into an ARP request for it (rate
    /// limited per address) and drop the original; the sender's retransmission finds
    /// the neighbour resolved.
    pub(super) fn request_resolution(
        &mut self,
        pkt: &mut Packet,
        parsed: &Parsed,
        target: Ipv4Addr,
        port: &PortContext,
        now_tsc: u64,
    ) -> Action {
        if !self.arp_due(target, now_tsc) {
            return Action::Drop(DropReason::NeighbourUnresolved);
        }
        let frame = pkt.bytes_mut();
        match arp::write_request(frame, parsed.l2.l3_offset, port.mac, port.addr, target) {
            Some(len) if pkt.set_len(len as u16) => {
                Action::TransmitInstead(DropReason::NeighbourUnresolved)
            }
            _ => Action::Drop(DropReason::NeighbourUnresolved),
        }
    }
}

/// Addresses a rewritten frame from the port to `next_hop`, or holds it until
/// `target` (whose MAC that is) resolves.
#[inline]
pub(super) fn address(
    frame: &mut [u8],
    next_hop: Option<MacAddr>,
    target: Ipv4Addr,
    port: &PortContext,
) -> Action {
    match next_hop {
        Some(mac) => done(forward::dr::forward(frame, mac, port.mac)),
        None => Action::Hold(target.into()),
    }
}

/// Where a NAT or FullNAT reply goes: the MAC the client's packets came from, or, for
/// a session installed by sync that has seen no client packet yet, the client's entry
/// in the neighbour table.
#[inline]
pub(super) fn client_next_hop(s: &Session, neighbours: &NeighbourTable) -> Option<MacAddr> {
    if s.peer_mac != [0; 6] {
        return Some(MacAddr(s.peer_mac));
    }
    neighbours.lookup(Ipv4Addr::from(s.client_addr))
}
