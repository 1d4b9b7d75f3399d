//! ICMP errors about a session: a destination-unreachable, time-exceeded or
//! frag-needed quoting one of the worker's sessions' packets goes where that
//! session's traffic goes (translated back for NAT and FullNAT), or to the worker
//! that owns the session.
use super::miss::nat_reply_queue;
use super::{done, Action, Context, Forwarder};
use crate::dpdk::Packet;
use crate::flow::parse::Parsed;
use crate::flow::FlowKey;
use crate::forward::{self, QuoteRewrite};
use crate::model::{DropReason, ForwardMode};
use crate::session::Direction;
use crate::wire::ethernet::MacAddr;
use std::net::Ipv4Addr;

impl Forwarder {
    /// An ICMP error quoting one of our sessions' packets goes where that session's
    /// traffic goes, translated for NAT.
    pub(super) fn icmp_error(&mut self, pkt: &mut Packet, parsed: &Parsed, cx: &Context) -> Action {
        let port = cx.port;
        let Some(quote) = forward::parse_error(pkt.bytes(), parsed) else {
            return Action::Drop(DropReason::IcmpErrorNoSession);
        };
        let Some((id, dir)) = self.sessions.lookup(&quote.key.reversed()) else {
            // NAT64: an error about a translated packet, its session in the IPv6 table.
            if !self.sessions6.is_empty() {
                if let Some(action) = self.nat64_icmp_error(pkt, parsed, &quote, cx) {
                    return action;
                }
            }
            // ICMP is hashed by addresses only, so an error about another worker's
            // session lands anywhere: its quote names the session's tuple.
            if !port.redirected {
                let key = quote.key.reversed();
                let snap = self.snapshot.current();
                let owner = nat_reply_queue(snap, &self.rss, &key)
                    .unwrap_or_else(|| self.rss.owner_of(&key));
                if owner != self.rss.queue {
                    return Action::Redirect(owner);
                }
            }
            return Action::Drop(DropReason::IcmpErrorNoSession);
        };
        let s = *self.sessions.get(id).expect("looked up just now");
        match (s.mode, dir) {
            (ForwardMode::Nat | ForwardMode::FullNat, Direction::Outbound) => {
                let frame = pkt.bytes_mut();
                let mut rewrite = QuoteRewrite::towards_client(Ipv4Addr::from(s.vip), s.vport);
                if s.mode == ForwardMode::FullNat {
                    // The error was addressed to LIP:lport about LIP:lport -> RS.
                    let client = (Ipv4Addr::from(s.client_addr), s.client_port);
                    rewrite.outer_dst = Some(client.0);
                    rewrite.inner_src = Some(client);
                }
                if let Err(r) = forward::nat_translate_error(frame, parsed, &quote, &rewrite) {
                    return Action::Drop(r);
                }
                done(forward::dr::forward(frame, MacAddr(s.peer_mac), port.mac))
            }
            (ForwardMode::Nat | ForwardMode::FullNat, _) => {
                let rs_ip = Ipv4Addr::from(s.real_addr);
                let Some(rs_mac) = cx.neighbours.lookup(rs_ip) else {
                    return self.request_resolution(pkt, parsed, rs_ip, port, cx.now_tsc);
                };
                let frame = pkt.bytes_mut();
                let mut rewrite = QuoteRewrite::towards_real_server(rs_ip, s.real_port);
                // The quote is of a segment the client got, numbered from the cookie.
                rewrite.inner_seq_delta = self.synproxy_seq_delta(id, &s);
                if s.mode == ForwardMode::FullNat {
                    // The real server knows the client as LIP:lport.
                    let local = (Ipv4Addr::from(s.local_addr), s.local_port);
                    rewrite.outer_src = Some(local.0);
                    rewrite.inner_dst = Some(local);
                }
                if let Err(r) = forward::nat_translate_error(frame, parsed, &quote, &rewrite) {
                    return Action::Drop(r);
                }
                done(forward::dr::forward(frame, rs_mac, port.mac))
            }
            (ForwardMode::Dr | ForwardMode::Tun, Direction::Inbound | Direction::InputOnly) => {
                self.forward(pkt, parsed, &s, Direction::Inbound, cx)
            }
            _ => Action::Drop(DropReason::IcmpErrorNoSession),
        }
    }
}
