//! What workers tell the management core about their sessions, and when.
//!
//! Each worker owns one [`EventRing`]: a bounded lock-free queue it pushes
//! [`SessionEvent`]s into and the management core drains to build sync messages. A
//! push never blocks: when the ring is full the event is dropped and counted, as the
//! packet path must never wait for the management core. A lost event costs at most one
//! sync period for that session (see [`SyncPolicy`]).
//!
//! The events carry a full [`RecordRepr`], not a session id: by the time the
//! management core drains the ring, the session may be gone or its slot reused.
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crossbeam::queue::ArrayQueue;

use crate::dataplane::counters::bump;
use crate::model::Protocol;
use crate::session::replication::{RecordOp, RecordRepr};
use crate::session::table6::Session6;
use crate::session::{Session, TcpState, Transition};

/// Why a session is synced.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// First sync of the session: it became ESTABLISHED (TCP) or reached the packet
    /// threshold (UDP).
    Created,
    /// A TCP state change after the first sync.
    StateChanged,
    /// A long-lived session synced again so the standby's copy does not time out.
    Refreshed,
    /// Removed before its timeout (flush, real server deleted).
    Deleted,
    /// Timed out.
    Expired,
}

impl EventKind {
    /// What the standby does with the record.
    pub const fn op(self) -> RecordOp {
        match self {
            EventKind::Deleted | EventKind::Expired => RecordOp::Remove,
            _ => RecordOp::Update,
        }
    }
}

/// One session event, as the management core receives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SessionEvent {
    pub kind: EventKind,
    pub record: RecordRepr,
}

impl SessionEvent {
    /// The event `kind` for `session`, which has `timeout_ms` left to live.
    pub fn new(kind: EventKind, session: &Session, timeout_ms: u32) -> SessionEvent {
        SessionEvent {
            kind,
            record: RecordRepr::connection(session, kind.op(), timeout_ms),
        }
    }

    /// The event `kind` for the IPv6 `session`, which has `timeout_ms` left to live.
    pub fn new6(kind: EventKind, session: &Session6, timeout_ms: u32) -> SessionEvent {
        SessionEvent {
            kind,
            record: RecordRepr::connection6(session, kind.op(), timeout_ms),
        }
    }
}

/// Milliseconds from `now_tick` to `deadline_tick` on the session clock (0 when due).
pub fn remaining_ms(deadline_tick: u32, now_tick: u32, tick_ms: u32) -> u32 {
    // Ticks wrap: the deadline is ahead when the wrapped difference is positive.
    let ticks = (deadline_tick.wrapping_sub(now_tick) as i32).max(0) as u32;
    ticks.saturating_mul(tick_ms)
}

/// Counts of one ring, read by the management core.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingStats {
    pub pushed: u64,
    /// Events lost because the ring was full.
    pub dropped: u64,
    /// Events waiting now.
    pub queued: usize,
}

/// One worker's event ring: that worker pushes, the management core pops.
pub struct EventRing {
    queue: ArrayQueue<SessionEvent>,
    // Written only by the producing worker (relaxed load+store, as WorkerCounters).
    pushed: AtomicU64,
    dropped: AtomicU64,
}

impl EventRing {
    /// A ring of `capacity` events (at least one), allocated here once.
    pub fn with_capacity(capacity: usize) -> EventRing {
        EventRing {
            queue: ArrayQueue::new(capacity.max(1)),
            pushed: AtomicU64::new(0),
            dropped: AtomicU64::new(0),
        }
    }

    pub fn capacity(&self) -> usize {
        self.queue.capacity()
    }

    /// Queues `event`; never blocks. Returns false, and counts a drop, when full.
    /// Only the ring's worker may push (the counters have a single writer).
    #[inline]
    pub fn push(&self, event: SessionEvent) -> bool {
        match self.queue.push(event) {
            Ok(()) => {
                bump(&self.pushed, 1);
                true
            }
            Err(_) => {
                bump(&self.dropped, 1);
                false
            }
        }
    }

    /// Pops up to `max` events in order into `each`; returns how many.
    pub fn drain(&self, max: usize, mut each: impl FnMut(SessionEvent)) -> usize {
        let mut taken = 0;
        while taken < max {
            let Some(event) = self.queue.pop() else {
                break;
            };
            each(event);
            taken += 1;
        }
        taken
    }

    pub fn stats(&self) -> RingStats {
        RingStats {
            pushed: self.pushed.load(Relaxed),
            dropped: self.dropped.load(Relaxed),
            queued: self.queue.len(),
        }
    }
}

/// When a session is worth telling the standby about; IPVS's rules
/// (`ip_vs_sync_conn_needed`), with the refresh period in time rather than packets.
///
/// - **TCP** is synced only in the states a standby can take over: ESTABLISHED,
///   FIN_WAIT, CLOSE_WAIT, TIME_WAIT, CLOSE (IPVS's set). A half-open connection is not
///   synced: after a failover the client's retransmitted SYN is scheduled afresh. The
///   first sync happens when the connection first enters one of these states (usually
///   ESTABLISHED), then on every state change.
/// - **UDP** has no states: a flow is first synced when its packet count reaches
///   `threshold` (IPVS `sync_threshold`, default 3), which keeps one-packet flows
///   (a DNS query) off the sync link.
/// - **Refresh.** A synced session that still sees packets is synced again once
///   `min(period_ms, timeout / 2)` has passed since its last sync (IPVS
///   `sync_refresh_period`, bounded by half the timeout as IPVS does). The standby's
///   copy expires `timeout` after the last sync it got, so a session whose packets keep
///   it alive on the active is never older than that on the standby; losing a sync
///   message delays its refresh by one period at most.
/// - **Ends.** A session deleted before its timeout is synced as a removal. An
///   expiry is not: the standby's copy expired no later than the original, because its
///   deadline is the original's deadline as of the last sync and deadlines only move
///   later between syncs (a state change, which can shorten one, is itself synced).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SyncPolicy {
    /// Packets before a UDP flow's first sync (0 or 1: on its first packet).
    pub threshold: u32,
    /// Longest time between two syncs of a session that stays busy, in ms.
    pub period_ms: u32,
}

impl Default for SyncPolicy {
    fn default() -> Self {
        SyncPolicy {
            threshold: 3,
            period_ms: 10_000,
        }
    }
}

/// What the worker knows about a session after handling one of its packets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PacketFacts {
    pub proto: Protocol,
    /// The packet's transition (from == to when the state did not move; always NONE
    /// to NONE for UDP).
    pub transition: Transition,
    /// Packets seen on the session, this one included.
    pub packets: u32,
    /// The session's timeout in its current state, in ms.
    pub timeout_ms: u32,
    /// When the session was last synced (ms, any monotonic clock), `None` if never.
    pub last_synced_ms: Option<u64>,
    pub now_ms: u64,
}

/// IPVS syncs TCP connections in these states only.
const fn tcp_state_synced(state: TcpState) -> bool {
    matches!(
        state,
        TcpState::Established
            | TcpState::FinWait
            | TcpState::CloseWait
            | TcpState::TimeWait
            | TcpState::Close
    )
}

impl SyncPolicy {
    /// Whether this packet makes the session due for a sync, and why.
    pub fn on_packet(&self, facts: &PacketFacts) -> Option<EventKind> {
        match facts.proto {
            Protocol::Tcp => {
                if !tcp_state_synced(facts.transition.to) {
                    return None;
                }
                if facts.last_synced_ms.is_none() {
                    return Some(EventKind::Created);
                }
                if facts.transition.changed() {
                    return Some(EventKind::StateChanged);
                }
            }
            Protocol::Udp => {
                if facts.last_synced_ms.is_none() {
                    return (facts.packets >= self.threshold).then_some(EventKind::Created);
                }
            }
        }
        let last = facts.last_synced_ms?;
        let refresh = u64::from(self.period_ms.min(facts.timeout_ms / 2));
        (facts.now_ms.saturating_sub(last) >= refresh).then_some(EventKind::Refreshed)
    }

    /// Whether the end of a session is synced: a deletion of a synced session is, an
    /// expiry never is (see the type's docs).
    pub fn on_end(&self, kind: EventKind, was_synced: bool) -> Option<EventKind> {
        (kind == EventKind::Deleted && was_synced).then_some(EventKind::Deleted)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::FlowKey4;
    use crate::model::ForwardMode;
    use std::net::Ipv4Addr;
    use std::sync::Arc;

    fn session(n: u16) -> Session {
        let key = FlowKey4::new(
            Protocol::Tcp,
            Ipv4Addr::new(198, 51, 100, 1),
            n,
            Ipv4Addr::new(203, 0, 113, 1),
            80,
        );
        Session::new(&key, ForwardMode::Nat, 0, 0, Ipv4Addr::new(10, 0, 0, 2), 80)
    }

    #[test]
    fn full_ring_drops_and_counts_without_blocking() {
        let ring = EventRing::with_capacity(4);
        for n in 0..10u16 {
            let accepted = ring.push(SessionEvent::new(EventKind::Created, &session(n), 1000));
            assert_eq!(accepted, n < 4, "push {n}");
        }
        assert_eq!(
            ring.stats(),
            RingStats {
                pushed: 4,
                dropped: 6,
                queued: 4
            }
        );
        let mut ports = Vec::new();
        assert_eq!(ring.drain(3, |e| ports.push(e.record.client.port())), 3);
        assert_eq!(ports, [0, 1, 2], "in order");
        assert!(ring.push(SessionEvent::new(EventKind::Deleted, &session(99), 0)));
        let mut rest = Vec::new();
        assert_eq!(ring.drain(100, |e| rest.push(e)), 2);
        assert_eq!(rest[1].kind, EventKind::Deleted);
        assert_eq!(rest[1].record.op, RecordOp::Remove);
        assert_eq!(ring.stats().queued, 0);
    }

    #[test]
    fn one_producer_one_consumer_lose_nothing_but_the_counted() {
        let ring = Arc::new(EventRing::with_capacity(64));
        let producer = {
            let ring = ring.clone();
            std::thread::spawn(move || {
                for n in 0..20_000u32 {
                    ring.push(SessionEvent::new(
                        EventKind::Refreshed,
                        &session(n as u16),
                        n,
                    ));
                }
            })
        };
        let mut received = 0u64;
        let mut last = None;
        while !producer.is_finished() || ring.stats().queued > 0 {
            ring.drain(16, |e| {
                // Order is kept: timeouts (the sequence numbers here) only increase.
                assert!(last < Some(e.record.timeout_ms));
                last = Some(e.record.timeout_ms);
                received += 1;
            });
        }
        producer.join().unwrap();
        ring.drain(usize::MAX, |_| received += 1);
        let stats = ring.stats();
        assert_eq!(stats.pushed + stats.dropped, 20_000);
        assert_eq!(received, stats.pushed);
    }

    #[test]
    fn remaining_ms_wraps_and_floors_at_zero() {
        assert_eq!(remaining_ms(150, 100, 10), 500);
        assert_eq!(remaining_ms(100, 150, 10), 0, "overdue");
        assert_eq!(remaining_ms(5, u32::MAX - 4, 10), 100, "across the wrap");
        assert_eq!(remaining_ms(u32::MAX / 2, 0, 10), u32::MAX, "saturates");
    }

    fn tcp(from: TcpState, to: TcpState, last: Option<u64>, now: u64) -> PacketFacts {
        PacketFacts {
            proto: Protocol::Tcp,
            transition: Transition { from, to },
            packets: 10,
            timeout_ms: 900_000,
            last_synced_ms: last,
            now_ms: now,
        }
    }

    #[test]
    fn tcp_synced_once_established_then_on_changes_and_periodically() {
        use TcpState::*;
        let policy = SyncPolicy::default();
        // The handshake is not synced.
        assert_eq!(
            policy.on_packet(&tcp(None, SynRecv, Option::None, 0)),
            Option::None
        );
        assert_eq!(
            policy.on_packet(&tcp(SynRecv, SynRecv, Option::None, 5)),
            Option::None
        );
        // Established: the first sync.
        assert_eq!(
            policy.on_packet(&tcp(SynRecv, Established, Option::None, 10)),
            Some(EventKind::Created)
        );
        // Busy but synced recently: nothing until the period is up.
        assert_eq!(
            policy.on_packet(&tcp(Established, Established, Some(10), 9_999)),
            Option::None
        );
        assert_eq!(
            policy.on_packet(&tcp(Established, Established, Some(10), 10_010)),
            Some(EventKind::Refreshed)
        );
        // Every state change of a synced session, however recent the last sync.
        for (from, to) in [
            (Established, CloseWait),
            (CloseWait, TimeWait),
            (Established, FinWait),
            (FinWait, Close),
        ] {
            assert_eq!(
                policy.on_packet(&tcp(from, to, Some(10), 11)),
                Some(EventKind::StateChanged),
                "{from} -> {to}"
            );
        }
        // Into a state a standby cannot use (LAST_ACK, SYN_RECV): not synced.
        assert_eq!(
            policy.on_packet(&tcp(CloseWait, LastAck, Some(10), 11)),
            Option::None
        );
        // A connection first seen closing is synced on that first synced state.
        assert_eq!(
            policy.on_packet(&tcp(SynRecv, Close, Option::None, 0)),
            Some(EventKind::Created)
        );
    }

    #[test]
    fn refresh_is_bounded_by_half_the_timeout() {
        let policy = SyncPolicy {
            threshold: 3,
            period_ms: 60_000,
        };
        // With a 10 s timeout the refresh comes every 5 s, not every 60 s.
        let mut facts = tcp(TcpState::Established, TcpState::Established, Some(0), 4_999);
        facts.timeout_ms = 10_000;
        assert_eq!(policy.on_packet(&facts), Option::None);
        facts.now_ms = 5_000;
        assert_eq!(policy.on_packet(&facts), Some(EventKind::Refreshed));
        facts.timeout_ms = 900_000;
        facts.now_ms = 59_999;
        assert_eq!(policy.on_packet(&facts), Option::None);
        facts.now_ms = 60_000;
        assert_eq!(policy.on_packet(&facts), Some(EventKind::Refreshed));
    }

    #[test]
    fn udp_waits_for_the_threshold() {
        let policy = SyncPolicy::default();
        let udp = |packets, last, now| PacketFacts {
            proto: Protocol::Udp,
            transition: Transition {
                from: TcpState::None,
                to: TcpState::None,
            },
            packets,
            timeout_ms: 300_000,
            last_synced_ms: last,
            now_ms: now,
        };
        assert_eq!(policy.on_packet(&udp(1, None, 0)), None);
        assert_eq!(policy.on_packet(&udp(2, None, 0)), None);
        assert_eq!(policy.on_packet(&udp(3, None, 0)), Some(EventKind::Created));
        // Synced at 0: a later packet refreshes after the period only.
        assert_eq!(policy.on_packet(&udp(4, Some(0), 1)), None);
        assert_eq!(
            policy.on_packet(&udp(500, Some(0), 10_000)),
            Some(EventKind::Refreshed)
        );
        // A threshold of 0 or 1 syncs the first packet.
        let eager = SyncPolicy {
            threshold: 1,
            ..policy
        };
        assert_eq!(eager.on_packet(&udp(1, None, 0)), Some(EventKind::Created));
    }

    #[test]
    fn ends_sync_deletions_of_synced_sessions_only() {
        let policy = SyncPolicy::default();
        assert_eq!(
            policy.on_end(EventKind::Deleted, true),
            Some(EventKind::Deleted)
        );
        assert_eq!(policy.on_end(EventKind::Deleted, false), None);
        assert_eq!(policy.on_end(EventKind::Expired, true), None);
        assert_eq!(EventKind::Expired.op(), RecordOp::Remove);
        assert_eq!(EventKind::Refreshed.op(), RecordOp::Update);
    }
}
