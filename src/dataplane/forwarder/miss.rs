//! Miss: no session of this worker takes the packet. Decides whether it opens a new
//! connection to a virtual service (then placement picks where it goes), or what
//! else becomes of it: a health probe's answer or a sync datagram for the management
//! core, a packet another worker owns, an RST when every real server is down, or a
//! drop for its reason. Also where a SYN reusing a finished connection's port turns
//! a hit into a miss.
use super::{Action, Forwarder, PortContext, RssView};
use crate::dataplane::counters::{Event, WorkerCounters};
use crate::dataplane::local::LocalResponder;
use crate::dpdk::Packet;
use crate::flow::parse::Parsed;
use crate::flow::FlowKey4;
use crate::forward;
use crate::model::{DropReason, Protocol, ServiceKey};
use crate::session::{Direction, Session, SessionId};
use crate::wire::ethernet;
use crate::wire::tcp::TcpFlags;
use std::net::{Ipv4Addr, SocketAddrV4};

impl Forwarder {
    /// What the lookup `found`, unless the packet is a SYN on the client key of a
    /// connection that is over: then the client reuses its port for a new connection,
    /// so the old session is retired and the packet is a miss, scheduled afresh, as
    /// IPVS does (conn_reuse_mode).
    #[inline]
    pub(super) fn unless_reopened(
        &mut self,
        found: Option<(SessionId, Direction)>,
        flags: TcpFlags,
        counters: &WorkerCounters,
    ) -> Option<(SessionId, Direction)> {
        if let Some((id, Direction::Inbound | Direction::InputOnly)) = found {
            if opens_connection(flags)
                && self
                    .sessions
                    .get(id)
                    .is_some_and(reusable_for_new_connection)
            {
                self.retire(id, counters);
                return None;
            }
        }
        found
    }

    /// The no-session decisions. A packet to a virtual service that may open a
    /// connection there gets the service's snapshot index. Otherwise: TCP to the
    /// health checker's source ports and a peer's sync datagram go to the management
    /// core; a packet the RSS view or a NAT real server's reply ties to another worker
    /// goes there; everything else is dropped, for the most precise reason (not for
    /// us, no such service, a late reply to a local address, a TCP segment that opens
    /// nothing, a client address that cannot be one).
    pub(super) fn admit(
        &self,
        key: &FlowKey4,
        flags: TcpFlags,
        parsed: &Parsed,
        port: &PortContext,
    ) -> Result<usize, Action> {
        let vip = key.dst_addr();
        let snap = self.snapshot.current();
        let Some(index) = snap.find_index(&ServiceKey::new(key.proto, vip, key.dport)) else {
            if let Some((source, ports)) = &self.health_source {
                // Only a real server's: anyone else's would take the punt ring's room
                // from the probes' answers and the VRRP adverts.
                if key.proto == Protocol::Tcp && vip == *source && ports.contains(&key.dport) {
                    return Err(if snap.is_real_server(key.src_addr().into()) {
                        Action::Punt
                    } else {
                        Action::Drop(DropReason::NotAPeer)
                    });
                }
            }
            if self.sync_listen == Some(SocketAddrV4::new(vip, key.dport))
                && key.proto == Protocol::Udp
                && parsed.l3 == ethernet::HEADER_LEN
            {
                // A peer's sync datagram (`[sync] port`): the management core checks it.
                return Err(if self.is_sync_peer(key.src_addr()) {
                    Action::Punt
                } else {
                    Action::Drop(DropReason::NotAPeer)
                });
            }
            let reason = if port.responder.is_local(vip) {
                DropReason::UnsupportedProtocol
            } else if snap.is_vip(vip) {
                DropReason::NoService
            } else if snap.is_local_address(vip) {
                if let Some(owner) = self.rss.steer_to(key, port.redirected) {
                    return Err(Action::Redirect(owner));
                }
                // To a FullNAT local address but no session: a late or stray reply.
                if key.proto == Protocol::Tcp {
                    DropReason::TcpNoSession
                } else {
                    DropReason::NoService
                }
            } else if let Some(owner) = nat_reply_owner(snap, &self.rss, key, port.redirected) {
                return Err(Action::Redirect(owner));
            } else {
                DropReason::NotLocal
            };
            return Err(Action::Drop(reason));
        };
        if let Some(owner) = self.rss.steer_to(key, port.redirected) {
            // A new connection (or a packet of one) the device put on another queue
            // than the view: it is opened, or lives, on the view's owner.
            return Err(Action::Redirect(owner));
        }
        // A TCP segment opens a session when it is a SYN, the SYN proxy's bare ACK, or
        // anything but an RST with sloppy_tcp.
        let opens = opens_connection(flags)
            || (super::synproxy::is_bare_ack(flags) && self.proxies(index))
            || self.sloppy_opens(index, flags);
        if key.proto == Protocol::Tcp && !opens {
            return Err(Action::Drop(DropReason::TcpNoSession));
        }
        if !may_be_client(key.src_addr(), snap, port.responder) {
            return Err(Action::Drop(DropReason::BadIpv4Header));
        }
        Ok(index)
    }

    /// A new connection placement could not place (`reason`): when no real server can
    /// take it and the service says so (`resets_when_down`), a TCP SYN is answered
    /// with an RST in place; otherwise it is dropped.
    pub(super) fn refuse(
        &self,
        reason: DropReason,
        service: usize,
        proto: Protocol,
        pkt: &mut Packet,
        parsed: &Parsed,
        cx: &super::Context,
    ) -> Action {
        if reason == DropReason::NoRealServer
            && proto == Protocol::Tcp
            && self.snapshot.current().resets_when_down(service)
        {
            if let Ok(len) = forward::reset::answer_with_rst(pkt.bytes_mut(), parsed, cx.port.mac) {
                if pkt.set_len(len as u16) {
                    cx.counters.event(Event::AllDownReset);
                    return Action::TransmitInstead(DropReason::NoRealServer);
                }
            }
        }
        Action::Drop(reason)
    }
}

impl Forwarder {
    /// Whether service `index` (a snapshot index) opens sessions from TCP segments
    /// that are not SYNs (`sloppy_tcp`): a connection that started on another node, or
    /// before this one restarted, carries on where the scheduler sends it. Any segment
    /// but an RST then opens one.
    pub(super) fn sloppy_opens(&self, index: usize, flags: TcpFlags) -> bool {
        !flags.contains(TcpFlags::RST)
            && self
                .snapshot
                .current()
                .services()
                .get(index)
                .is_some_and(|s| s.sloppy_tcp)
    }
}

/// For a packet no session of this worker matches: if it is a reply from a NAT real
/// server, the queue (= worker) the client's packets of that connection hash to, when
/// that is another worker. In one-arm NAT the reply tuple (RIP:rport -> CIP:cport)
/// shares no address with the request tuple (CIP:cport -> VIP:vport), so the NIC's hash
/// puts it on an arbitrary queue; the owner is found by hashing the request tuple,
/// whose VIP the snapshot gives (the first service using that real server in NAT mode
/// when several do). Redirected packets are never redirected again.
pub(crate) fn nat_reply_owner(
    snap: &crate::service::Snapshot,
    rss: &RssView,
    key: &FlowKey4,
    redirected: bool,
) -> Option<u16> {
    if redirected {
        return None;
    }
    let owner = nat_reply_queue(snap, rss, key)?;
    (owner != rss.queue).then_some(owner)
}

/// The queue the request tuple of a NAT real server's reply hashes to, when `key` is
/// such a reply (see [`nat_reply_owner`]).
pub(super) fn nat_reply_queue(
    snap: &crate::service::Snapshot,
    rss: &RssView,
    key: &FlowKey4,
) -> Option<u16> {
    let &(std::net::IpAddr::V4(vip), vport) = snap
        .nat_reply_services(key.proto, key.src_addr(), key.sport)
        .first()?
    else {
        return None;
    };
    let hash = rss
        .toeplitz
        .hash_tuple(rss.fields, key.dst_addr(), vip, key.dport, vport);
    Some(rss.reta.queue(hash))
}

/// Whether a new connection may come from `client`: not an RFC 1812 martian
/// (unspecified, broadcast, multicast, loopback) and not an address of this appliance
/// (a port's, a VIP, a FullNAT local address). A session for one of ours would send
/// the real server's answers to ourselves, as the VIP's own in NAT.
fn may_be_client(
    client: Ipv4Addr,
    snap: &crate::service::Snapshot,
    responder: &LocalResponder,
) -> bool {
    !(client.is_unspecified()
        || client.is_broadcast()
        || client.is_multicast()
        || client.is_loopback()
        || responder.is_local(client)
        || snap.is_vip(client)
        || snap.is_local_address(client))
}

/// A TCP segment that opens a connection: SYN without ACK or RST.
#[inline]
fn opens_connection(flags: TcpFlags) -> bool {
    flags.contains(TcpFlags::SYN) && !flags.intersects(TcpFlags::ACK | TcpFlags::RST)
}

/// A TCP session whose connection is over, so a new SYN on its tuple starts a new
/// connection: TIME_WAIT or CLOSE, or FIN_WAIT where Sluice only sees the client side
/// (DR/TUN), as IPVS's `is_new_conn_expected`.
#[inline]
pub(super) fn reusable_for_new_connection(s: &Session) -> bool {
    use crate::session::{SessionFlags, TcpState};
    s.proto == Protocol::Tcp
        && match s.state() {
            TcpState::TimeWait | TcpState::Close => true,
            TcpState::FinWait => s.flags().contains(SessionFlags::NO_OUTPUT),
            _ => false,
        }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ForwardMode;

    /// Fuzzing found a SYN from the VIP to itself (src = dst = 198.18.0.220:80)
    /// scheduled like a client's: the NAT session sent the real server a packet from
    /// the VIP, whose answer would come back to the VIP. No new connection comes from
    /// an address of ours or a martian.
    #[test]
    fn new_connections_from_our_own_or_martian_addresses_are_refused() {
        use crate::model::{RealServerSpec, ServiceKey};
        use crate::service::{ServiceTable, Snapshot};
        let vip = Ipv4Addr::new(198, 18, 0, 220);
        let lip = Ipv4Addr::new(198, 18, 0, 50);
        let port_addr = Ipv4Addr::new(198, 18, 0, 1);
        let mut table = ServiceTable::new();
        let nat = ServiceKey::new(Protocol::Tcp, vip, 80);
        table
            .add_service(nat, crate::model::SchedulerKind::Rr, None)
            .unwrap();
        let rs = RealServerSpec::new(Ipv4Addr::new(198, 18, 0, 12), 8080, 1, ForwardMode::Nat);
        table.add_server(nat, rs).unwrap();
        let full = ServiceKey::new(Protocol::Tcp, Ipv4Addr::new(198, 18, 0, 240), 80);
        table
            .add_service(full, crate::model::SchedulerKind::Rr, None)
            .unwrap();
        table.add_laddr(full, lip.into()).unwrap();
        let snap = Snapshot::build(1, &table);
        let responder = LocalResponder::new([2, 0x53, 0x4c, 0, 0, 1], &[(port_addr, 24)]);
        for ours in [vip, lip, port_addr, Ipv4Addr::new(198, 18, 0, 240)] {
            assert!(!may_be_client(ours, &snap, &responder), "{ours}");
        }
        for martian in [
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::BROADCAST,
            Ipv4Addr::new(224, 0, 0, 1),
            Ipv4Addr::new(127, 0, 0, 1),
        ] {
            assert!(!may_be_client(martian, &snap, &responder), "{martian}");
        }
        assert!(may_be_client(
            Ipv4Addr::new(198, 18, 0, 100),
            &snap,
            &responder
        ));
        assert!(may_be_client(
            Ipv4Addr::new(198, 18, 0, 12),
            &snap,
            &responder
        ));
    }
}
