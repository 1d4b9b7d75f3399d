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
use crate::wire::tcp::{self, TcpFlags};
use crate::wire::{ethernet, ipv4};
use std::net::{Ipv4Addr, SocketAddrV4};

impl Forwarder {
    /// What the lookup `found`, unless the packet is a SYN on the client key of a
    /// connection that is over, or of one whose real server has been evicted or
    /// removed: then the client opens a new connection (from a reused port, or by
    /// resending a SYN the dead server never answered), so the old session is retired
    /// and the packet is a miss, scheduled afresh, as IPVS does (conn_reuse_mode,
    /// expire_nodest_conn).
    #[inline]
    pub(super) fn unless_reopened(
        &mut self,
        found: Option<(SessionId, Direction)>,
        flags: TcpFlags,
        counters: &WorkerCounters,
    ) -> Option<(SessionId, Direction)> {
        if let Some((id, Direction::Inbound | Direction::InputOnly)) = found {
            if opens_connection(flags)
                && self.sessions.get(id).is_some_and(|s| {
                    reusable_for_new_connection(s)
                        || !self.snapshot.current().keeps_real_server(s.real())
                })
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
        frame: &[u8],
        parsed: &Parsed,
        port: &PortContext,
    ) -> Result<usize, Action> {
        let vip = key.dst_addr();
        let snap = self.snapshot.current();
        let Some(index) = snap.find_index(&ServiceKey::new(key.proto, vip, key.dport)) else {
            if let Some((source, acks)) = &self.health_source {
                // Only a real server's, and only one that answers the probe in flight
                // on its port: anyone else's would take the punt ring's room from the
                // probes' answers.
                if key.proto == Protocol::Tcp && vip == *source && acks.contains(key.dport) {
                    return Err(if !snap.is_real_server(key.src_addr().into()) {
                        Action::Drop(DropReason::NotAPeer)
                    } else if !tcp_ack(frame, parsed)
                        .is_some_and(|a| acks.answers(key.dport, flags, a))
                    {
                        Action::Drop(DropReason::NotAProbeAnswer)
                    } else {
                        Action::Punt
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
        // A TCP segment opens a session when it is a SYN, the SYN proxy's cookie ACK
        // (with or without data and FIN), or anything but an RST with sloppy_tcp.
        let opens = opens_connection(flags)
            || (super::synproxy::may_carry_cookie(flags) && self.proxies(index))
            || self.sloppy_opens(index, flags);
        if key.proto == Protocol::Tcp && !opens {
            return Err(Action::Drop(DropReason::TcpNoSession));
        }
        if !may_be_client(key.src_addr(), snap, port.responder) {
            return Err(Action::Drop(DropReason::MartianSource));
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

/// The acknowledgement number of the TCP segment at `parsed.l4` (IPv4 or IPv6).
pub(super) fn tcp_ack(frame: &[u8], parsed: &Parsed) -> Option<u32> {
    let segment = tcp::Packet::new_checked(frame.get(parsed.l4..)?).ok()?;
    Some(segment.ack_number())
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
/// ([`ipv4::is_martian_source`], which `classify` has dropped already) and not an
/// address of this appliance (a port's, a VIP, a FullNAT local address). A session
/// for one of ours would send the real server's answers to ourselves, as the VIP's
/// own in NAT.
fn may_be_client(
    client: Ipv4Addr,
    snap: &crate::service::Snapshot,
    responder: &LocalResponder,
) -> bool {
    !(ipv4::is_martian_source(client)
        || responder.is_local(client)
        || snap.is_vip(client)
        || snap.is_local_address(client))
}

/// A TCP segment that opens a connection: SYN without ACK or RST.
#[inline]
pub(super) fn opens_connection(flags: TcpFlags) -> bool {
    flags.contains(TcpFlags::SYN) && !flags.intersects(TcpFlags::ACK | TcpFlags::RST)
}

/// A TCP session whose connection is over, so a new SYN on its tuple starts a new
/// connection: TIME_WAIT or CLOSE, or FIN_WAIT where Sluice only sees the client side
/// (DR/TUN), as IPVS's `is_new_conn_expected`.
#[inline]
pub(super) fn reusable_for_new_connection(s: &Session) -> bool {
    use crate::session::SessionFlags;
    connection_over(
        s.proto,
        s.state(),
        s.flags().contains(SessionFlags::NO_OUTPUT),
    )
}

/// [`reusable_for_new_connection`] from a session's protocol, state and whether
/// Sluice sees only the client side (`no_output`), for either family's sessions.
#[inline]
pub(super) fn connection_over(
    proto: Protocol,
    state: crate::session::TcpState,
    no_output: bool,
) -> bool {
    use crate::session::TcpState;
    proto == Protocol::Tcp
        && match state {
            TcpState::TimeWait | TcpState::Close => true,
            TcpState::FinWait => no_output,
            _ => false,
        }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::ForwardMode;
    use crate::session::persist::Trust;

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

    /// A NAT service VIP:80 over two real servers (rr, optionally persistent), and
    /// a worker reading it; the table and the servers' ids.
    fn two_server_worker(
        persistence: Option<crate::model::Persistence>,
    ) -> (
        crate::service::ServiceTable,
        crate::service::SnapshotPublisher,
        Forwarder,
        [u32; 2],
    ) {
        use crate::model::{RealServerSpec, SchedulerKind};
        use crate::service::{ServiceTable, Snapshot, SnapshotPublisher};
        let mut table = ServiceTable::new();
        let svc = ServiceKey::new(Protocol::Tcp, VIP, 80);
        table
            .add_service(svc, SchedulerKind::Rr, persistence)
            .unwrap();
        let ids = [RS[0], RS[1]].map(|ip| {
            table
                .add_server(svc, RealServerSpec::new(ip, 8080, 1, ForwardMode::Nat))
                .unwrap()
        });
        let publisher = SnapshotPublisher::new(Snapshot::build(1, &table));
        let hz = 1_000_000_000;
        let config = super::super::ForwarderConfig {
            persistence: Some(std::sync::Arc::new(
                crate::session::persist::PersistTable::with_capacity(64),
            )),
            ..super::super::ForwarderConfig::new(
                64,
                publisher.reader(),
                crate::session::Timeouts::default().in_ticks(100),
                hz / 10,
                hz,
                std::sync::Arc::new(crate::dataplane::realserver_stats::new_table()),
                RssView::default_spread(1, 0),
            )
        };
        (table, publisher, Forwarder::new(config), ids)
    }

    const VIP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 100);
    const RS: [Ipv4Addr; 2] = [Ipv4Addr::new(198, 18, 0, 11), Ipv4Addr::new(198, 18, 0, 12)];

    /// Publishes `table` with `evicted` evicted and lets the worker adopt it.
    fn publish(
        publisher: &crate::service::SnapshotPublisher,
        f: &mut Forwarder,
        table: &crate::service::ServiceTable,
        evicted: &[u32],
    ) {
        use crate::service::{HealthOverlay, Snapshot};
        let health = HealthOverlay {
            evicted: evicted.iter().copied().collect(),
            ..HealthOverlay::default()
        };
        let generation = publisher.next_generation();
        publisher
            .publish(Snapshot::build_with(generation, table, &health, &[]))
            .unwrap();
        f.poll(0, &WorkerCounters::default());
    }

    #[test]
    fn a_syn_on_a_session_of_an_evicted_or_removed_server_opens_a_new_connection() {
        let (mut table, publisher, mut f, ids) = two_server_worker(None);
        let counters = WorkerCounters::default();
        let service = f.snapshot.current().services()[0].id;
        // The client's half-open connection to the second server, as its first SYN
        // left it.
        let key = FlowKey4::new(Protocol::Tcp, Ipv4Addr::new(198, 18, 1, 7), 40000, VIP, 80);
        let open = |f: &mut Forwarder| {
            let s = Session::new(&key, ForwardMode::Nat, service, ids[1], RS[1], 8080);
            f.sessions.insert(s, 0, 100).unwrap();
            f.sessions.lookup(&key)
        };
        let found = open(&mut f);
        assert!(found.is_some());
        // The server is there: its resent SYN stays with it.
        assert_eq!(f.unless_reopened(found, TcpFlags::SYN, &counters), found);
        // Evicted: every other segment still goes to it, a SYN opens anew.
        publish(&publisher, &mut f, &table, &[ids[1]]);
        assert_eq!(f.unless_reopened(found, TcpFlags::ACK, &counters), found);
        assert_eq!(
            f.unless_reopened(found, TcpFlags::SYN | TcpFlags::ACK, &counters),
            found
        );
        assert_eq!(f.unless_reopened(found, TcpFlags::SYN, &counters), None);
        assert_eq!(f.sessions.lookup(&key), None, "the old session is retired");
        // Restored, then removed from the table: the same.
        publish(&publisher, &mut f, &table, &[]);
        let found = open(&mut f);
        assert_eq!(f.unless_reopened(found, TcpFlags::SYN, &counters), found);
        table
            .delete_server(ServiceKey::new(Protocol::Tcp, VIP, 80), RS[1].into(), 8080)
            .unwrap();
        publish(&publisher, &mut f, &table, &[]);
        assert_eq!(f.unless_reopened(found, TcpFlags::SYN, &counters), None);
        assert_eq!(f.sessions.lookup(&key), None);
    }

    #[test]
    fn a_persistence_template_of_an_evicted_server_is_not_followed() {
        let persistence = crate::model::Persistence::new(300);
        let (table, publisher, mut f, ids) = two_server_worker(Some(persistence));
        let counters = WorkerCounters::default();
        let client = Ipv4Addr::new(198, 18, 1, 7);
        let key = |port: u16| FlowKey4::new(Protocol::Tcp, client, port, VIP, 80);
        let first = f
            .place(0, &key(40000), Trust::Confirmed, 0, &counters)
            .unwrap();
        let pinned = first.real;
        assert!(first.persistent());
        // The template holds while its server is up.
        for port in 40001..40005 {
            assert_eq!(
                f.place(0, &key(port), Trust::Confirmed, 0, &counters)
                    .unwrap()
                    .real,
                pinned
            );
        }
        // Evicted: the client goes to the other server, which becomes its template.
        publish(&publisher, &mut f, &table, &[ids[pinned]]);
        for port in 40005..40009 {
            assert_eq!(
                f.place(0, &key(port), Trust::Confirmed, 0, &counters)
                    .unwrap()
                    .real,
                1 - pinned
            );
        }
        // Restored: the new template holds.
        publish(&publisher, &mut f, &table, &[]);
        assert_eq!(
            f.place(0, &key(40010), Trust::Confirmed, 0, &counters)
                .unwrap()
                .real,
            1 - pinned
        );
    }

    #[test]
    fn a_one_second_template_is_live_at_its_first_renewal() {
        use crate::session::persist::TemplateKey;
        let (_table, _publisher, mut f, _ids) =
            two_server_worker(Some(crate::model::Persistence::new(1)));
        let counters = WorkerCounters::default();
        let client = Ipv4Addr::new(198, 18, 1, 7);
        let key = FlowKey4::new(Protocol::Tcp, client, 40000, VIP, 80);
        assert!(f
            .place(0, &key, Trust::Confirmed, 0, &counters)
            .unwrap()
            .persistent());
        let renewal = super::super::TemplateRenewal::of(1, f.ticks_per_second);
        let template = TemplateKey {
            service: f.snapshot.current().services()[0].id,
            network: u32::from(client),
        };
        let table = f.persist.as_ref().unwrap();
        // The wheel renews it then: it must still be there to renew.
        let first_renewal = f.now_tick.wrapping_add(renewal.every);
        assert!(table.lookup(template, first_renewal).is_some());
    }
}
