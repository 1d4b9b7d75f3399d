//! Per-worker counters. Each worker writes only its own cache-padded block; the
//! management core reads them all and sums. Relaxed atomics compile to plain loads and
//! stores on x86, so counting costs the same as a plain integer without data races.
use crate::model::DropReason;
use std::sync::atomic::{
    AtomicU64,
    Ordering::{Acquire, Relaxed, Release},
};

/// What the data plane did with a frame, besides dropping it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Event {
    ArpReplied,
    IcmpEchoReplied,
    NeighbourLearned,
    NeighbourTableFull,
    /// An ARP request for us from a sender on none of the port's subnets and no real
    /// server, while the neighbour table is at least half full: answered, not
    /// learned, so made-up senders cannot fill it.
    NeighbourOffLink,
    /// FullNAT: the client address was written into a segment as TOA.
    ToaInserted,
    /// FullNAT: the segment had no room for TOA (it went on without).
    ToaNoRoom,
    /// FullNAT: a client's segment towards the real server carried a TOA option of
    /// its own (kind 254), which a TOA module would have believed; made NOPs.
    ToaForgedRemoved,
    /// NAT: a real server's reply arrived on this worker but its session lives on
    /// another; it was handed to the owner's redirect ring.
    RedirectedOut,
    /// A packet another worker redirected here was taken from this worker's ring.
    RedirectedIn,
    /// A neighbour this worker learned was offered to the other workers.
    NeighbourShared,
    /// A neighbour update could not be offered to another worker (its inbox was
    /// full); that worker learns it from the next ARP instead.
    NeighbourShareLost,
    /// Persistence: a new connection went where its client network's template said.
    PersistFollowed,
    /// Persistence: a live template was evicted to make room (its bucket was full);
    /// that network's next connection may be scheduled afresh. Under a flood of
    /// spoofed SYNs these are mostly the spoofed templates evicting each other
    /// (`persist_no_room` and the confirmations tell the cases apart: CONFIG.md).
    PersistEvicted,
    /// Persistence: another worker was writing the template's slot: the connection
    /// was scheduled but its template not recorded, or not raised (the next one
    /// does it).
    PersistBusy,
    /// Persistence: a new connection's template found its bucket full of templates
    /// that stand higher, which it never evicts (`session::persist::Trust`): none
    /// recorded (a NAT or FullNAT connection records it when it confirms it). A flood
    /// of spoofed SYNs into a full bucket shows here, and so does a table too small
    /// for its real clients (`sessions.persistence_templates`). Once per connection.
    PersistNoRoom,
    /// Persistence: a NAT or FullNAT client acknowledged its real server's SYN-ACK
    /// and so confirmed its template (once per template while it lives).
    PersistConfirmed,
    /// Persistence: a DR or TUN client completed its handshake and raised its
    /// template to unverified (which a spoofed SYN followed by an ACK also does).
    PersistUnverified,
    /// A new TCP connection to a service with no available real server was answered
    /// with an RST (`all_down = "rst"`).
    AllDownReset,
    /// A health probe frame from the management core was transmitted (worker 0).
    HealthProbeSent,
    /// A real server's answer to a health probe was handed to the management core.
    HealthReplyUp,
    /// A session sync datagram from a peer (`[sync] port`) was handed to the
    /// management core.
    SyncFrameUp,
    /// A VRRP advert from a peer was handed to the management core.
    VrrpAdvertUp,
    /// Session sync (standby): a session from the peer installed or updated.
    SyncInstalled,
    /// Session sync (standby): a synced session removed.
    SyncRemoved,
    /// Session sync (standby): a record whose service or real server this node does
    /// not have, or no room in the session table.
    SyncInstallFailed,
    /// A rewritten frame waited for its next hop's MAC (an ARP request asked for it).
    NeighbourHeld,
    /// A held frame was sent once its next hop resolved (a held frame that times out
    /// or finds no room is dropped as `neighbour_unresolved`).
    NeighbourHeldSent,
    /// A sync datagram from the management core was transmitted as a frame (worker 0,
    /// `[sync] port`); one whose peer was unresolved became an ARP request instead
    /// (dropped as `neighbour_unresolved`).
    SyncFrameSent,
    /// The session table was nearly full: a half-open TCP session (the oldest) was
    /// removed to make room for a new one.
    HalfOpenReclaimed,
    /// A finished TCP session (TIME_WAIT, CLOSE) was removed to make room for a new
    /// one while the table was nearly full (as `HalfOpenReclaimed`, whose scan finds
    /// both).
    FinishedReclaimed,
    /// FullNAT: a new session found no free local port towards its real server, so
    /// a TCP session holding one towards it, half-open for over 3 s or idle in
    /// TIME_WAIT, was removed and its port taken.
    LocalPortReclaimed,
    /// SYN proxy: a SYN without a session was answered with a cookie SYN-ACK.
    SynproxyCookieSent,
    /// SYN proxy: an ACK without a session carried a valid cookie; the session opened.
    SynproxyCookieValid,
    /// SYN proxy: an ACK without a session carried no cookie of Sluice's (dropped).
    SynproxyCookieInvalid,
    /// SYN proxy: an ACK without a session carried a cookie too old (dropped).
    SynproxyCookieExpired,
    /// SYN proxy: the real server's SYN-ACK came; the connection is spliced.
    SynproxyConnection,
    /// SYN proxy: the client sent again before the real server answered; the SYN to
    /// the real server went out again instead of the segment.
    SynproxySynResent,
    /// SYN proxy: the client reset the connection before the real server answered;
    /// the server was sent the reset, and nothing more of the connection passes.
    SynproxyClientReset,
    /// SYN proxy: a client segment with data came before the real server answered; it
    /// waits for the server's handshake (a frame that waits too long is dropped as
    /// `synproxy_server_unanswered`).
    SynproxyDataHeld,
    /// SYN proxy: a held client segment went on to the real server after its
    /// handshake.
    SynproxyDataSent,
    /// SYN proxy: while its SYN waited for an answer, the real server sent an ACK that
    /// is not a SYN-ACK (it still holds an older connection on the tuple, in TIME_WAIT
    /// say); the server was sent a reset at that ACK's number and the ACK dropped.
    SynproxyStaleReset,
    /// SYN proxy: a valid cookie ACK whose connection could not be placed (no real
    /// server available, no local port, no room in the session table) was answered
    /// with a reset to the client.
    SynproxyRefused,
    /// SYN proxy: the real server had not answered the SYN within its retransmission
    /// timeout (1 s, doubling), or had just been sent a `SynproxyStaleReset`: the
    /// worker's timer sent the SYN again.
    SynproxySynRetried,
    /// SYN proxy: the real server answered none of the SYN's retries: the client was
    /// sent a reset at the number it expects, the server a bare reset, and the
    /// session closed.
    SynproxyGaveUp,
    /// SYN proxy: a proxied connection opened while the worker's SYN timer list was
    /// full: its SYN goes again only on the client's next segment.
    SynproxyRetryFull,
    /// A Neighbor Solicitation for one of the port's IPv6 addresses was answered.
    NdAnswered,
    /// A duplicate address probe (a solicitation from the unspecified address) for
    /// one of the port's IPv6 addresses was answered to all nodes: another host tried
    /// to take the address.
    NdDadDefended,
    IcmpV6EchoReplied,
    /// An IPv6 neighbour entered the IPv6 neighbour table.
    Neighbour6Learned,
    /// An IPv6 neighbour was not learned: the IPv6 neighbour table is full.
    Neighbour6TableFull,
    /// An ICMP error Sluice writes itself (Packet Too Big, frag-needed) was not sent:
    /// the worker's share of `[sessions] icmp_error_rate` was used up (the packet is
    /// dropped as `too_big` all the same).
    IcmpErrorSuppressed,
    /// A frame went up the exception path: its port's ring to the kernel
    /// interface took it.
    ExceptionPunted,
    /// A frame the kernel wrote to a port's kernel interface was sent out of the port.
    ExceptionInjected,
    /// Of the frames `ExceptionPunted` counts, one taken on the port's control budget
    /// (BGP/BFD with TTL 255, ARP, neighbour discovery: `dataplane::exception::Punt`).
    ExceptionPuntedControl,
    /// A neighbour entered a full share of the neighbour table in the slot of one
    /// neither a real server nor a configured peer, not heard from for a while (IPv4),
    /// or, for a real server, of any such entry (`NeighbourTable::learn_making_room`).
    NeighbourReclaimed,
    /// The same for the IPv6 neighbour table (real servers only).
    Neighbour6Reclaimed,
    /// A client's RST or FIN on a session lay further than
    /// `session::CLIENT_SEQ_WINDOW` from the client's sequence as last seen: forwarded,
    /// but the session's state did not move (a blind sender's, or a client with more
    /// than that in flight).
    TcpCloseOutOfWindow,
}

impl Event {
    pub const COUNT: usize = 58;
    pub const ALL: [Event; Self::COUNT] = [
        Event::ArpReplied,
        Event::IcmpEchoReplied,
        Event::NeighbourLearned,
        Event::NeighbourTableFull,
        Event::NeighbourOffLink,
        Event::ToaInserted,
        Event::ToaNoRoom,
        Event::ToaForgedRemoved,
        Event::RedirectedOut,
        Event::RedirectedIn,
        Event::NeighbourShared,
        Event::NeighbourShareLost,
        Event::PersistFollowed,
        Event::PersistEvicted,
        Event::PersistBusy,
        Event::PersistNoRoom,
        Event::PersistConfirmed,
        Event::PersistUnverified,
        Event::AllDownReset,
        Event::HealthProbeSent,
        Event::HealthReplyUp,
        Event::SyncFrameUp,
        Event::VrrpAdvertUp,
        Event::SyncInstalled,
        Event::SyncRemoved,
        Event::SyncInstallFailed,
        Event::NeighbourHeld,
        Event::NeighbourHeldSent,
        Event::SyncFrameSent,
        Event::HalfOpenReclaimed,
        Event::FinishedReclaimed,
        Event::LocalPortReclaimed,
        Event::SynproxyCookieSent,
        Event::SynproxyCookieValid,
        Event::SynproxyCookieInvalid,
        Event::SynproxyCookieExpired,
        Event::SynproxyConnection,
        Event::SynproxySynResent,
        Event::SynproxyClientReset,
        Event::SynproxyDataHeld,
        Event::SynproxyDataSent,
        Event::SynproxyStaleReset,
        Event::SynproxyRefused,
        Event::SynproxySynRetried,
        Event::SynproxyGaveUp,
        Event::SynproxyRetryFull,
        Event::NdAnswered,
        Event::NdDadDefended,
        Event::IcmpV6EchoReplied,
        Event::Neighbour6Learned,
        Event::Neighbour6TableFull,
        Event::IcmpErrorSuppressed,
        Event::ExceptionPunted,
        Event::ExceptionInjected,
        Event::ExceptionPuntedControl,
        Event::NeighbourReclaimed,
        Event::Neighbour6Reclaimed,
        Event::TcpCloseOutOfWindow,
    ];
    pub fn name(self) -> &'static str {
        match self {
            Event::ArpReplied => "arp_replied",
            Event::IcmpEchoReplied => "icmp_echo_replied",
            Event::NeighbourLearned => "neighbour_learned",
            Event::NeighbourTableFull => "neighbour_table_full",
            Event::NeighbourOffLink => "neighbour_off_link",
            Event::ToaInserted => "toa_inserted",
            Event::ToaNoRoom => "toa_no_room",
            Event::ToaForgedRemoved => "toa_forged_removed",
            Event::RedirectedOut => "redirected_out",
            Event::RedirectedIn => "redirected_in",
            Event::NeighbourShared => "neighbour_shared",
            Event::NeighbourShareLost => "neighbour_share_lost",
            Event::PersistFollowed => "persist_followed",
            Event::PersistEvicted => "persist_evicted",
            Event::PersistBusy => "persist_busy",
            Event::PersistNoRoom => "persist_no_room",
            Event::PersistConfirmed => "persist_confirmed",
            Event::PersistUnverified => "persist_unverified",
            Event::AllDownReset => "all_down_reset",
            Event::HealthProbeSent => "health_probe_sent",
            Event::HealthReplyUp => "health_reply_up",
            Event::SyncFrameUp => "sync_frame_up",
            Event::VrrpAdvertUp => "vrrp_advert_up",
            Event::SyncInstalled => "sync_installed",
            Event::SyncRemoved => "sync_removed",
            Event::SyncInstallFailed => "sync_install_failed",
            Event::NeighbourHeld => "neighbour_held",
            Event::NeighbourHeldSent => "neighbour_held_sent",
            Event::SyncFrameSent => "sync_frame_sent",
            Event::HalfOpenReclaimed => "half_open_reclaimed",
            Event::FinishedReclaimed => "finished_reclaimed",
            Event::LocalPortReclaimed => "local_port_reclaimed",
            Event::SynproxyCookieSent => "synproxy_cookies_sent",
            Event::SynproxyCookieValid => "synproxy_cookies_valid",
            Event::SynproxyCookieInvalid => "synproxy_cookies_invalid",
            Event::SynproxyCookieExpired => "synproxy_cookies_expired",
            Event::SynproxyConnection => "synproxy_connections",
            Event::SynproxySynResent => "synproxy_syn_resent",
            Event::SynproxyClientReset => "synproxy_client_reset",
            Event::SynproxyDataHeld => "synproxy_data_held",
            Event::SynproxyDataSent => "synproxy_data_sent",
            Event::SynproxyStaleReset => "synproxy_stale_reset",
            Event::SynproxyRefused => "synproxy_refused",
            Event::SynproxySynRetried => "synproxy_syn_retried",
            Event::SynproxyGaveUp => "synproxy_gave_up",
            Event::SynproxyRetryFull => "synproxy_retry_full",
            Event::NdAnswered => "nd_answered",
            Event::NdDadDefended => "nd_dad_defended",
            Event::IcmpV6EchoReplied => "icmpv6_echo_replied",
            Event::Neighbour6Learned => "neighbour6_learned",
            Event::Neighbour6TableFull => "neighbour6_table_full",
            Event::IcmpErrorSuppressed => "icmp_errors_suppressed",
            Event::ExceptionPunted => "exception_punted",
            Event::ExceptionInjected => "exception_injected",
            Event::ExceptionPuntedControl => "exception_punted_control",
            Event::NeighbourReclaimed => "neighbour_reclaimed",
            Event::Neighbour6Reclaimed => "neighbour6_reclaimed",
            Event::TcpCloseOutOfWindow => "tcp_close_out_of_window",
        }
    }
}

/// One worker's counters, alone on its cache lines so workers never share a line.
#[repr(C, align(128))]
#[derive(Default)]
pub struct WorkerCounters {
    pub rx_packets: AtomicU64,
    pub rx_bytes: AtomicU64,
    pub tx_packets: AtomicU64,
    pub tx_bytes: AtomicU64,
    /// TSC cycles spent in iterations that received at least one packet.
    pub busy_cycles: AtomicU64,
    /// TSC cycles in all iterations, busy or idle.
    pub total_cycles: AtomicU64,
    /// Loop iterations (polls), busy or idle.
    pub polls: AtomicU64,
    /// Entries in this worker's neighbour table (a gauge, not a count).
    pub neighbour_entries: AtomicU64,
    /// Live sessions in this worker's table (a gauge).
    pub sessions: AtomicU64,
    /// Bytes allocated for the session table (set once at start).
    pub session_table_bytes: AtomicU64,
    /// Sessions created and expired (counts).
    pub sessions_created: AtomicU64,
    pub sessions_expired: AtomicU64,
    pub drops: Row<{ DropReason::COUNT }>,
    pub events: Row<{ Event::COUNT }>,
    /// Generation of the service snapshot this worker uses, stored when it adopts one,
    /// and the TSC at that moment: the management core times publish -> every worker
    /// adopted with them. Not zeroed.
    pub snapshot_generation: AtomicU64,
    pub snapshot_adopted_tsc: AtomicU64,
    /// Set by the management core (`sluicectl zero`), cleared by the worker once done.
    pub zero_requested: std::sync::atomic::AtomicBool,
}

/// A row of counters, one per drop reason or event, all zero at first (an array
/// this long has no derived `Default`).
pub struct Row<const N: usize>(pub [AtomicU64; N]);

impl<const N: usize> Default for Row<N> {
    fn default() -> Self {
        Row(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

impl<const N: usize> std::ops::Deref for Row<N> {
    type Target = [AtomicU64; N];
    fn deref(&self) -> &[AtomicU64; N] {
        &self.0
    }
}

/// Adds to a counter owned by a single writer. A load and a store instead of an atomic
/// read-modify-write: only this core writes, others only read.
#[inline(always)]
pub fn bump(counter: &AtomicU64, by: u64) {
    counter.store(counter.load(Relaxed).wrapping_add(by), Relaxed);
}

impl WorkerCounters {
    #[inline(always)]
    pub fn drop(&self, reason: DropReason) {
        bump(&self.drops[reason as usize], 1);
    }
    /// Counts `n` packets dropped for one reason (what a full ring or queue refused).
    #[inline(always)]
    pub fn drop_n(&self, reason: DropReason, n: u64) {
        if n > 0 {
            bump(&self.drops[reason as usize], n);
        }
    }
    #[inline(always)]
    pub fn event(&self, event: Event) {
        bump(&self.events[event as usize], 1);
    }
    #[inline(always)]
    pub fn event_n(&self, event: Event, n: u64) {
        if n > 0 {
            bump(&self.events[event as usize], n);
        }
    }
    pub fn drops_snapshot(&self) -> [u64; DropReason::COUNT] {
        std::array::from_fn(|i| self.drops[i].load(Relaxed))
    }
    pub fn events_snapshot(&self) -> [u64; Event::COUNT] {
        std::array::from_fn(|i| self.events[i].load(Relaxed))
    }
    /// Asks the owning worker to zero its counters at its next poll. The worker is
    /// their only writer and updates them with a plain load and store, so a zero
    /// written by another thread would be overwritten by the next update.
    pub fn request_zero(&self) {
        self.zero_requested.store(true, Release);
    }

    /// Worker: zeroes the counters if the management core asked. One load when not.
    #[inline]
    pub fn zero_if_requested(&self) {
        if self.zero_requested.load(Relaxed) && self.zero_requested.swap(false, Acquire) {
            self.zero();
        }
    }

    /// Whether a requested zero is still pending.
    pub fn zero_pending(&self) -> bool {
        self.zero_requested.load(Acquire)
    }

    /// Resets every counter to zero: by the worker that writes them (see
    /// [`WorkerCounters::request_zero`]), or by anyone when no worker runs.
    pub fn zero(&self) {
        for c in [
            &self.rx_packets,
            &self.rx_bytes,
            &self.tx_packets,
            &self.tx_bytes,
            &self.busy_cycles,
            &self.total_cycles,
            &self.polls,
            &self.sessions_created,
            &self.sessions_expired,
        ] {
            c.store(0, Relaxed);
        }
        self.drops.iter().for_each(|c| c.store(0, Relaxed));
        self.events.iter().for_each(|c| c.store(0, Relaxed));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reason_table_matches_discriminants() {
        for (i, r) in DropReason::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i, "{r:?} out of order in ALL");
        }
        for (i, e) in Event::ALL.iter().enumerate() {
            assert_eq!(*e as usize, i, "{e:?} out of order in ALL");
        }
        let mut names: Vec<_> = DropReason::ALL.iter().map(|r| r.name()).collect();
        names.sort();
        names.dedup();
        assert_eq!(
            names.len(),
            DropReason::COUNT,
            "drop reason names must be unique"
        );
    }

    #[test]
    fn a_requested_zero_is_done_by_the_writer() {
        let c = WorkerCounters::default();
        bump(&c.polls, 7);
        c.request_zero();
        assert!(c.zero_pending());
        assert_eq!(
            c.polls.load(Relaxed),
            7,
            "nothing zeroed behind the writer's back"
        );
        c.zero_if_requested();
        assert!(!c.zero_pending());
        assert_eq!(c.polls.load(Relaxed), 0);
        bump(&c.polls, 1);
        c.zero_if_requested();
        assert_eq!(c.polls.load(Relaxed), 1, "no zero without a request");
    }

    #[test]
    fn counters_sit_on_their_own_cache_lines() {
        assert_eq!(std::mem::align_of::<WorkerCounters>(), 128);
        let c = WorkerCounters::default();
        c.drop(DropReason::Truncated);
        c.drop(DropReason::Truncated);
        c.event(Event::ArpReplied);
        assert_eq!(c.drops_snapshot()[DropReason::Truncated as usize], 2);
        assert_eq!(c.events_snapshot()[Event::ArpReplied as usize], 1);
        c.zero();
        assert_eq!(c.drops_snapshot().iter().sum::<u64>(), 0);
    }
}
