//! ICMP errors about a session: a destination-unreachable, time-exceeded or
//! frag-needed quoting one of the worker's sessions' packets goes where that
//! session's traffic goes (translated back for NAT and FullNAT), or to the worker
//! that owns the session.
use super::miss::nat_reply_queue;
use super::{done, Action, Context, Forwarder};
use crate::dpdk::Packet;
use crate::flow::parse::Parsed;
use crate::flow::{FlowKey, FlowKey4};
use crate::forward::{self, QuoteRewrite};
use crate::model::{DropReason, ForwardMode};
use crate::session::{Direction, HashedKey};
use std::net::Ipv4Addr;

impl Forwarder {
    /// An ICMP error quoting one of our sessions' packets goes where that session's
    /// traffic goes, translated for NAT.
    pub(super) fn icmp_error(&mut self, pkt: &mut Packet, parsed: &Parsed, cx: &Context) -> Action {
        let port = cx.port;
        let Some(quote) = forward::parse_error(pkt.bytes(), parsed) else {
            return Action::Drop(DropReason::IcmpErrorNoSession);
        };
        // Every sender addresses an error to the source of the packet it quotes.
        // Forged otherwise, it would be sent on to an address of its sender's choice.
        if parsed.ip_addrs().map(|(_, dst)| dst) != Some(quote.key.src_addr()) {
            return Action::Drop(DropReason::IcmpErrorMisaddressed);
        }
        let quoted = HashedKey::new(quote.key.reversed());
        let found = self.sessions.lookup_hashed(&quoted);
        if self.parking && !self.parked.is_empty() && self.waits_on_parked(&quoted, found) {
            // It quotes a packet of a session parked in this burst: after it.
            return self.park(super::burst::Parked::Behind(pkt.index()));
        }
        let Some((id, dir)) = found else {
            // NAT64: an error about a translated packet, its session in the IPv6 table.
            if !self.sessions6.is_empty() {
                if let Some(action) = self.nat64_icmp_error(pkt, parsed, &quote, cx) {
                    return action;
                }
            }
            // ICMP is hashed by addresses only, so an error about another worker's
            // session lands anywhere: its quote names the session's tuple.
            if let Some(owner) = self.icmp_error_owner(&quote.key.reversed(), port.redirected) {
                return Action::Redirect(owner);
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
                // As the replies go: a synced session with no client packet yet knows
                // no MAC of its own.
                let client = Ipv4Addr::from(s.client_addr);
                let next_hop = super::egress::client_next_hop(&s, cx.neighbours);
                super::egress::address(frame, next_hop, client, port)
            }
            // A frag-needed from the client's side about a UDP reply would make the
            // real server fragment its larger replies (to this client in NAT, to
            // every client behind the local address in FullNAT), and Sluice
            // forwards no fragment.
            (ForwardMode::Nat | ForwardMode::FullNat, _) if quote.too_big_about_udp() => {
                Action::Drop(DropReason::IcmpTooBigAboutUdp)
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
                    // The real server knows the client as LIP:lport, and so every
                    // other client using the local address.
                    let local = (Ipv4Addr::from(s.local_addr), s.local_port);
                    rewrite.outer_src = Some(local.0);
                    rewrite.inner_dst = Some(local);
                    rewrite.min_next_hop_mtu = forward::SHARED_PATH_MIN_MTU;
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

impl Forwarder {
    /// The other worker an ICMP error about none of this worker's sessions belongs
    /// to, `key` being the quoted packet's tuple reversed (a tuple the session is
    /// filed under). From the real server's side, `key` is the reply tuple: a
    /// FullNAT or NAT64 one (to a local address) belongs to the view's owner of the
    /// reply tuple itself (its local port was chosen so), even when the same real
    /// server and port serve a NAT service too; a NAT real server's to the worker of
    /// its request tuple (client -> VIP, the VIP from the snapshot). From the
    /// client's side, `key` is the request tuple, the view's owner's. `None` when
    /// that is this worker, or the error was redirected once already.
    fn icmp_error_owner(&self, key: &FlowKey4, redirected: bool) -> Option<u16> {
        if redirected {
            return None;
        }
        let snap = self.snapshot.current();
        let owner = (!snap.is_local_address(key.dst_addr()))
            .then(|| nat_reply_queue(snap, &self.rss, key))
            .flatten()
            .unwrap_or_else(|| self.rss.owner_of(key));
        (owner != self.rss.queue).then_some(owner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::forwarder::{ForwarderConfig, RssView};
    use crate::model::{Protocol, RealServerSpec, SchedulerKind, ServiceKey};
    use crate::service::{ServiceTable, Snapshot, SnapshotPublisher};
    use std::net::SocketAddrV4;
    use std::sync::Arc;

    const VIP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 100);
    const REAL: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 21);
    const LIP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 50);

    /// Worker `queue` of two: a FullNAT service VIP:80 and a NAT one VIP:81, both to
    /// REAL:8080.
    fn worker(queue: u16) -> (SnapshotPublisher, Forwarder) {
        let mut table = ServiceTable::new();
        let full = ServiceKey::new(Protocol::Tcp, VIP, 80);
        table.add_service(full, SchedulerKind::Rr, None).unwrap();
        let rs = RealServerSpec::new(REAL, 8080, 1, ForwardMode::FullNat);
        table.add_server(full, rs).unwrap();
        table.add_laddr(full, LIP.into()).unwrap();
        let nat = ServiceKey::new(Protocol::Tcp, VIP, 81);
        table.add_service(nat, SchedulerKind::Rr, None).unwrap();
        let rs = RealServerSpec::new(REAL, 8080, 1, ForwardMode::Nat);
        table.add_server(nat, rs).unwrap();
        let publisher = SnapshotPublisher::new(Snapshot::build(1, &table));
        let hz = 1_000_000_000;
        let config = ForwarderConfig::new(
            64,
            publisher.reader(),
            crate::session::Timeouts::default().in_ticks(100),
            hz / 10,
            hz,
            Arc::new(crate::dataplane::realserver_stats::new_table()),
            RssView::default_spread(2, queue),
        );
        (publisher, Forwarder::new(config))
    }

    #[test]
    fn an_icmp_error_goes_to_the_worker_of_the_session_it_quotes_once() {
        let workers = [worker(0), worker(1)];
        let owner_at = |at: usize, key: &FlowKey4| workers[at].1.icmp_error_owner(key, false);
        let rss = &workers[0].1.rss;
        let queue_of = |client: Ipv4Addr, cport: u16, vport: u16| {
            let hash = rss
                .toeplitz
                .hash_tuple(rss.fields, client, VIP, cport, vport);
            rss.reta.queue(hash)
        };
        let mut seen = [0usize; 2];
        for n in 0..200u16 {
            let client = Ipv4Addr::new(198, 18, 1, n as u8);
            let cport = 30000 + n;
            // From the client's side, about a reply (VIP:80 -> client): the quote
            // reversed is the request tuple, its owner the hash of that tuple.
            let request = FlowKey4::new(Protocol::Tcp, client, cport, VIP, 80);
            let owner = queue_of(client, cport, 80);
            seen[usize::from(owner)] += 1;
            // From the NAT real server's side, about the client's packet readdressed
            // to it (client -> REAL:8080): the reply tuple, owned as its request (to
            // VIP:81).
            let nat_reply = FlowKey4::new(Protocol::Tcp, REAL, 8080, client, cport);
            let nat_owner = queue_of(client, cport, 81);
            for at in 0..2u16 {
                let other = |owner: u16| (owner != at).then_some(owner);
                let f = &workers[usize::from(at)].1;
                assert_eq!(
                    owner_at(usize::from(at), &request),
                    other(owner),
                    "{client}"
                );
                assert_eq!(owner_at(usize::from(at), &nat_reply), other(nat_owner));
                assert_eq!(f.icmp_error_owner(&request, true), None, "never twice");
                assert_eq!(f.icmp_error_owner(&nat_reply, true), None);
            }
        }
        assert!(seen.iter().all(|&n| n > 50), "{seen:?}");
        // From the FullNAT real server's side, about LIP:lport -> REAL:8080: the
        // worker whose pool chose that local port, whichever worker the error
        // reached, though REAL:8080 serves the NAT service too.
        for (chooser, (_, f)) in [worker(0), worker(1)].iter_mut().enumerate() {
            let pool = f.pool.as_mut().expect("the FullNAT pool");
            let set = f
                .laddr_sets
                .iter_mut()
                .map(|(_, set)| set)
                .find(|set| !set.is_empty())
                .expect("the FullNAT service's local addresses");
            for _ in 0..100 {
                let local = pool
                    .allocate(set, SocketAddrV4::new(REAL, 8080), 0)
                    .unwrap();
                let reply = FlowKey4::new(Protocol::Tcp, REAL, 8080, local.lip, local.port);
                assert_eq!(owner_at(chooser, &reply), None);
                assert_eq!(
                    owner_at(1 - chooser, &reply),
                    Some(chooser as u16),
                    "{}:{}",
                    local.lip,
                    local.port
                );
            }
        }
    }
}
