//! Hit: the packet belongs to a session of this worker. The session's state moves
//! on the packet, the observers hear of the move, and a NAT or FullNAT session follows
//! its client side's next hop (learns it, when installed by sync).
use super::{Forwarder, Matched, SegmentSeq};
use crate::dataplane::counters::{Event, WorkerCounters};
use crate::dpdk::Packet;
use crate::flow::parse::Parsed;
use crate::model::{ForwardMode, Protocol};
use crate::session::{Direction, OutOfWindow, SessionFlags, SessionId};
use crate::wire::tcp::TcpFlags;

impl Forwarder {
    /// The established path: the packet moves session `id` (its packet count, its TCP
    /// state on `flags`, its deadline), and when that changed the state, passive health
    /// (TCP not yet answered) and session sync see the move. A client's TCP segment
    /// with its sequence numbers (`seq`) is checked against the client's sequence as
    /// last seen: a RST or FIN too far from it moves nothing, and is counted
    /// (`SessionTable::on_client_segment`); a real server's acknowledgment starts that
    /// sequence where it is not known, moves it forward where it is behind, and a
    /// SYN-ACK restarts it (`SessionTable::on_server_segment`). A persistent
    /// connection's handshake may confirm its template (`confirm`; `parsed`: the
    /// segment's headers, None for one the SYN proxy made up). Returns the session as
    /// the packet found it (see [`Matched`]), for accounting and egress.
    #[inline]
    #[allow(clippy::too_many_arguments)]
    pub(super) fn hit(
        &mut self,
        id: SessionId,
        dir: Direction,
        flags: TcpFlags,
        seq: SegmentSeq,
        pkt: &Packet,
        parsed: Option<&Parsed>,
        counters: &WorkerCounters,
    ) -> Matched {
        // The entry as the packet finds it, copied before the update below moves it.
        // Copied after, its 16-byte moves would read fields the update has just
        // stored one by one, still on their way to the cache: such a load cannot
        // take its bytes from the stores and waits for them (17 cycles an
        // established packet, perf/results/nat_rewrite.md). What the packet moves (state, client sequence,
        // timer, UDP count) is read from the live entry by whoever needs it.
        let s = *self.sessions.get(id).expect("looked up just now");
        let transition = match (dir, seq) {
            (Direction::Outbound, SegmentSeq::ServerAck(ack)) => {
                self.sessions
                    .on_server_segment(id, flags, ack, self.now_tick, &self.timeouts)
            }
            (Direction::Inbound, SegmentSeq::Client(seg)) => {
                let moved =
                    self.sessions
                        .on_client_segment(id, flags, seg, self.now_tick, &self.timeouts);
                match moved {
                    Some(Err(OutOfWindow)) => {
                        counters.event(Event::TcpCloseOutOfWindow);
                        None
                    }
                    Some(Ok(t)) => Some(t),
                    None => None,
                }
            }
            _ => self
                .sessions
                .on_packet(id, dir, flags, self.now_tick, &self.timeouts),
        };
        if let Some(t) = transition {
            if s.proto == Protocol::Tcp && !s.flags().contains(SessionFlags::ANSWERED) {
                self.observe_new_connection(id, &s, dir, flags, t.from);
            }
            if self.sync.is_some() {
                self.sync_after_packet(id, t);
            }
            // A persistent connection may raise its template's trust on a state
            // change, or on the real server's SYN-ACK (which changes no state).
            if s.flags().contains(SessionFlags::PERSISTENT)
                && (t.changed() || (dir == Direction::Outbound && flags.contains(TcpFlags::SYN)))
            {
                if let Some(parsed) = parsed {
                    let session = super::confirm::PersistentSession::of(id, &s);
                    self.confirm_on(session, (dir, flags, t), pkt.bytes(), parsed, counters);
                }
                if t.changed() {
                    // A FIN may have moved its deadline, and with it its next visit.
                    self.schedule_template_renewal(id, s.service);
                }
            }
        }
        if dir == Direction::Inbound && matches!(s.mode, ForwardMode::Nat | ForwardMode::FullNat) {
            // Replies go to the MAC the client's packets last came from: a session
            // installed by sync learns it here, and one whose client side moved to
            // another router (an upstream failover or ECMP change without a shared
            // MAC) follows it instead of sending to the old one for its lifetime.
            let from: [u8; 6] = pkt.bytes()[6..12]
                .try_into()
                .expect("checked Ethernet header");
            if s.peer_mac != from {
                if let Some(live) = self.sessions.get_mut(id) {
                    live.peer_mac = from;
                }
            }
        }
        Matched {
            id,
            dir,
            session: s,
            transition,
        }
    }
}
