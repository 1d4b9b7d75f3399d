//! ICMPv6 errors about IPv6 sessions, and ICMP errors across NAT64: an error quoting
//! one of the worker's IPv6 sessions' packets goes where that session's traffic goes,
//! translated back for NAT and FullNAT (`forward::icmp6`), as `icmp_error.rs` does
//! for IPv4. NAT64 errors change family: an ICMPv4 error from the real server's side
//! (handed over by `icmp_error` when no IPv4 session takes it) becomes an ICMPv6
//! error to the client, and an ICMPv6 error from the client's side an ICMPv4 error to
//! the real server. Forwarded errors are not rate-limited: Sluice writes none of
//! them, it passes on what a host or router wrote.
use super::ipv6::{nat64_real, readdress};
use super::{Action, Context, Forwarder};
use crate::dpdk::Packet;
use crate::flow::parse::Parsed;
use crate::flow::{FlowKey, FlowKey4, FlowKey6};
use crate::forward::icmp6::{self, Nat64Ends, QuoteRewrite6};
use crate::forward::IcmpErrorQuote;
use crate::model::{DropReason, ForwardMode};
use crate::session::table6::Session6;
use crate::session::Direction;

impl Forwarder {
    /// An ICMPv6 error to our MAC: translated and sent on if it quotes a packet of
    /// one of the worker's IPv6 sessions, else dropped for why not.
    pub(super) fn icmp6_error(
        &mut self,
        pkt: &mut Packet,
        parsed: &Parsed,
        cx: &Context,
    ) -> Action {
        let quote = match icmp6::parse_error_v6(pkt.bytes(), parsed) {
            Ok(quote) => quote,
            Err(reason) => return Action::Drop(reason),
        };
        let key = quote.key.reversed();
        // IPv4-mapped addresses name NAT64's IPv4 ends in the table; quoted from the
        // wire they are no one's (as for TCP and UDP, `l4_v6`).
        if key.src.to_ipv4_mapped().is_some() || key.dst.to_ipv4_mapped().is_some() {
            return Action::Drop(DropReason::BadIpv6Header);
        }
        let Some((id, dir)) = self.sessions6.lookup(&key, self.now_tick) else {
            return match self.icmp6_error_owner(&key, cx.port.redirected) {
                Some(owner) => Action::Redirect(owner),
                None => Action::Drop(DropReason::IcmpErrorNoSession),
            };
        };
        let Some(s) = self.sessions6.get(id).copied() else {
            return Action::Drop(DropReason::IcmpErrorNoSession);
        };
        let fullnat = s.mode == ForwardMode::FullNat;
        match (s.mode, dir) {
            // From the client's side about a UDP reply: as `icmp_error`, the real
            // server (IPv6, or NAT64's IPv4 one) would fragment its larger replies,
            // and Sluice forwards no fragment.
            (
                ForwardMode::Nat | ForwardMode::FullNat,
                Direction::Inbound | Direction::InputOnly,
            ) if quote.too_big_about_udp() => Action::Drop(DropReason::IcmpTooBigAboutUdp),
            (ForwardMode::FullNat, Direction::Inbound) if nat64_real(&s).is_some() => {
                self.nat64_error_to_server(pkt, parsed, &quote, &s, cx)
            }
            // From the real server's side (the server or a router behind it), about a
            // packet Sluice sent it: to the client from the VIP, about the packet the
            // client sent. As IPVS, the outer source is the VIP whoever wrote it.
            (ForwardMode::Nat | ForwardMode::FullNat, Direction::Outbound) => {
                let rewrite = QuoteRewrite6 {
                    outer_src: Some(s.vip),
                    outer_dst: fullnat.then_some(s.client),
                    inner_src: fullnat.then_some((s.client, s.client_port)),
                    inner_dst: Some((s.vip, s.vport)),
                };
                let frame = pkt.bytes_mut();
                match icmp6::nat_translate_error_v6(frame, parsed, &quote, &rewrite) {
                    Ok(()) => readdress(frame, self.client_hop_v6(&s), cx),
                    Err(reason) => Action::Drop(reason),
                }
            }
            // From the client's side, about a reply: to the real server about the
            // packet it sent (FullNAT: from and to the local address it knows).
            (ForwardMode::Nat | ForwardMode::FullNat, _) => {
                let next_hop = self.neighbours6.lookup(s.real_addr);
                let rewrite = QuoteRewrite6 {
                    outer_src: fullnat.then_some(s.local_addr),
                    outer_dst: Some(s.real_addr),
                    inner_src: Some((s.real_addr, s.real_port)),
                    inner_dst: fullnat.then_some((s.local_addr, s.local_port)),
                };
                let frame = pkt.bytes_mut();
                match icmp6::nat_translate_error_v6(frame, parsed, &quote, &rewrite) {
                    Ok(()) => self.address_v6(frame, next_hop, s.real_addr, cx),
                    Err(reason) => Action::Drop(reason),
                }
            }
            // DR and TUN: the real server's replies bypass Sluice, so an error about
            // one comes from the client's side to the VIP; it goes on as any packet
            // of the session does (readdressed, or encapsulated).
            (ForwardMode::Dr | ForwardMode::Tun, Direction::Inbound | Direction::InputOnly) => {
                self.egress_v6(pkt, parsed, id, &s, Direction::Inbound, cx)
            }
            _ => Action::Drop(DropReason::IcmpErrorNoSession),
        }
    }

    /// The other worker an ICMPv6 error about none of this worker's sessions belongs
    /// to, `key` being the quoted packet's tuple reversed (a tuple the session is
    /// filed under). ICMPv6 is hashed by addresses only, so the error lands on any
    /// worker, as ICMP errors do for IPv4 (`icmp_error`). From the real server's
    /// side, `key` is the reply tuple: a FullNAT one (to a local address) belongs to
    /// the view's owner of the reply tuple itself (its local port was chosen so),
    /// even when the same real server and port serve a NAT service too; a NAT real
    /// server's to the worker of its request tuple (client -> VIP, the VIP from the
    /// snapshot). From the client's side, `key` is the request tuple, the view's
    /// owner's. `None` when that is this worker, or the error was redirected once
    /// already.
    pub(super) fn icmp6_error_owner(&self, key: &FlowKey6, redirected: bool) -> Option<u16> {
        if redirected {
            return None;
        }
        let to_local_address = self.snapshot.current().is_local_address6(key.dst);
        let owner = (!to_local_address)
            .then(|| self.nat_reply_queue_v6(key))
            .flatten()
            .unwrap_or_else(|| self.rss.owner_of6(key));
        (owner != self.rss.queue).then_some(owner)
    }

    /// NAT64, an ICMPv6 error from the client's side about a reply (VIP:vport ->
    /// client:cport): an ICMPv4 error from the local address to the real server,
    /// about the packet it sent (RS:rport -> LIP:lport), addressed as any IPv4 packet
    /// to it (held while its MAC resolves).
    fn nat64_error_to_server(
        &mut self,
        pkt: &mut Packet,
        parsed: &Parsed,
        quote: &icmp6::Icmp6ErrorQuote,
        s: &Session6,
        cx: &Context,
    ) -> Action {
        let (Some(lip), Some(real)) = (s.local_addr.to_ipv4_mapped(), nat64_real(s)) else {
            return Action::Drop(DropReason::IcmpErrorNoSession);
        };
        let ends = Nat64Ends {
            outer_src: lip,
            outer_dst: real,
            inner_src: (real, s.real_port),
            inner_dst: (lip, s.local_port),
        };
        self.ip_ident = self.ip_ident.wrapping_add(1);
        let frame = pkt.bytes_mut();
        let range =
            match icmp6::icmp6_to_icmp4(frame, parsed, quote, &ends, cx.port.mtu, self.ip_ident) {
                Ok(range) => range,
                Err(reason) => return Action::Drop(reason),
            };
        let (start, len) = (range.start as u16, (range.end - range.start) as u16);
        if !pkt.adj(start) || !pkt.set_len(len) {
            return Action::Drop(DropReason::Truncated);
        }
        let next_hop = cx.neighbours.lookup(real);
        super::egress::address(pkt.bytes_mut(), next_hop, real, cx.port)
    }

    /// NAT64, a real server's reply (`key`) that would not fit the port's MTU once
    /// translated to IPv6: with DF set, a frag-needed to the real server from the
    /// local address announcing the MTU less 20, within the worker's ICMP error
    /// bucket (Sluice writes it, as TUN's); without DF, or over the rate, nothing.
    /// The reply is dropped (`too_big`) either way: Sluice does not fragment.
    pub(super) fn nat64_too_big(
        &mut self,
        pkt: &mut Packet,
        parsed: &Parsed,
        key: &FlowKey4,
        cx: &Context,
    ) -> Action {
        let df = crate::forward::ip_packet(pkt.bytes(), parsed).is_some_and(|ip| ip.dont_frag());
        let mtu = cx
            .port
            .mtu
            .saturating_sub(crate::forward::nat64::HEADER_GROWTH as u16);
        if !df {
            return Action::Drop(DropReason::TooBig);
        }
        let frame = pkt.bytes_mut();
        match crate::forward::frag_needed(frame, parsed, mtu, key.dst_addr(), cx.port.mac) {
            Some(len) => self.send_icmp_error(pkt, len, cx),
            None => Action::Drop(DropReason::TooBig),
        }
    }

    /// NAT64, an ICMPv4 error no IPv4 session took: if it quotes a packet Sluice
    /// translated for a NAT64 session (LIP:lport -> RS:rport), the ICMPv6 error for
    /// the client from the VIP, about the packet the client sent. `None` when it
    /// quotes no NAT64 session's packet.
    pub(super) fn nat64_icmp_error(
        &mut self,
        pkt: &mut Packet,
        parsed: &Parsed,
        quote: &IcmpErrorQuote,
        cx: &Context,
    ) -> Option<Action> {
        let key = quote.key.reversed();
        let mapped = FlowKey6 {
            src: key.src_addr().to_ipv6_mapped(),
            dst: key.dst_addr().to_ipv6_mapped(),
            sport: key.sport,
            dport: key.dport,
            proto: key.proto,
        };
        let (id, dir) = self.sessions6.lookup(&mapped, self.now_tick)?;
        let s = *self.sessions6.get(id)?;
        if dir != Direction::Outbound || nat64_real(&s).is_none() {
            return None;
        }
        let ends = Nat64Ends {
            outer_src: s.vip,
            outer_dst: s.client,
            inner_src: (s.client, s.client_port),
            inner_dst: (s.vip, s.vport),
        };
        if !pkt.prepend(icmp6::NAT64_ERROR_GROWTH as u16) {
            return Some(Action::Drop(DropReason::TooBig));
        }
        let buf = pkt.bytes_mut();
        Some(
            match icmp6::icmp4_to_icmp6(buf, parsed, quote, &ends, cx.port.mtu) {
                Ok(len) if pkt.set_len(len as u16) => {
                    readdress(pkt.bytes_mut(), self.client_hop_v6(&s), cx)
                }
                Ok(_) => Action::Drop(DropReason::Truncated),
                Err(reason) => Action::Drop(reason),
            },
        )
    }
}
