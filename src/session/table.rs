//! The per-worker session table: a preallocated slab of one-cache-line entries, one
//! hash map from either direction's 5-tuple to a slab index, and a timer wheel
//! threaded through the entries. See the module docs of [`crate::session`].
use core::fmt;
use std::net::Ipv4Addr;

use allocator_api2::vec::Vec as HugeVec;

use super::hugemem::HugePageAlloc;
use super::index::{Hasher, KeyHash, SessionIndex};
use super::reclaim::CreationOrder;

use super::state::{self, Direction, TcpState, Transition, UDP_STATE_NAME};
use super::timeouts::TickTimeouts;
use super::timer::{Advance, Timed, TimerLink, TimerWheel, MAX_DELAY_TICKS, MAX_INDEX, NIL};
use crate::flow::FlowKey4;
use crate::model::Protocol;
use crate::model::{ForwardMode, MAX_REAL_SERVER_IDS};
use crate::wire::tcp::TcpFlags;

/// Timer wheel size when none is given: 4096 slots, 41 s per revolution at 10 ms ticks.
pub const DEFAULT_WHEEL_SLOTS: usize = 4096;

/// Largest table: slab indices must fit in 31 bits (the map stores `index << 1 | dir`).
pub const MAX_CAPACITY: usize = MAX_INDEX as usize;

/// A session's index in its worker's table. Valid until the session is removed or
/// expires; the slot is then reused, so ids must not be kept across packets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SessionId(u32);

impl SessionId {
    #[inline]
    pub fn index(self) -> u32 {
        self.0
    }
}

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.0)
    }
}

/// Per-session flag bits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SessionFlags(u8);

impl SessionFlags {
    /// No packet from the real server seen (yet): client packets use the INPUT-ONLY
    /// transitions. Set for DR and TUN at creation, cleared by the first reply seen,
    /// as IPVS's `IP_VS_CONN_F_NOOUTPUT`.
    pub const NO_OUTPUT: SessionFlags = SessionFlags(1 << 0);
    /// FullNAT with TOA: the client address still has to be inserted into the first
    /// ACK/data segment towards the real server.
    pub const TOA_PENDING: SessionFlags = SessionFlags(1 << 1);
    /// Created under a persistence template: its end extends the template.
    pub const PERSISTENT: SessionFlags = SessionFlags(1 << 2);
    /// Passive health detection: the real server answered this connection (or, in DR
    /// and TUN, the client completed the handshake), so it counts no more.
    pub const ANSWERED: SessionFlags = SessionFlags(1 << 3);
    /// Passive health detection: already counted as unanswered.
    pub const PASSIVE_COUNTED: SessionFlags = SessionFlags(1 << 4);
    /// Session sync: told to the standby at least once (when: [`Session::synced_tick`]).
    pub const SYNCED: SessionFlags = SessionFlags(1 << 5);
    /// Opened by the SYN proxy: its sequence numbers are translated, by the worker's
    /// side array (`dataplane::forwarder::synproxy`).
    pub const SYNPROXY: SessionFlags = SessionFlags(1 << 6);
    /// The slot holds a live session (managed by the table).
    const IN_USE: SessionFlags = SessionFlags(1 << 7);

    pub const fn empty() -> SessionFlags {
        SessionFlags(0)
    }

    pub const fn bits(self) -> u8 {
        self.0
    }

    #[inline]
    pub const fn contains(self, other: SessionFlags) -> bool {
        self.0 & other.0 == other.0
    }

    #[inline]
    pub fn insert(&mut self, other: SessionFlags) {
        self.0 |= other.0;
    }

    #[inline]
    pub fn remove(&mut self, other: SessionFlags) {
        self.0 &= !other.0;
    }
}

/// How far (either way, in sequence space) a client's RST or FIN may lie from the
/// client's next sequence number as the session last saw it, and still end the
/// connection's state; and how far any segment may lie from it and move it on.
///
/// IPVS moves a session on flags alone, so anyone who knows or guesses a connection's
/// four addresses and ports (the client's port is one of some 28,000 on Linux) can
/// send one RST or FIN in the client's name: the session drops to CLOSE (10 s) or
/// CLOSE_WAIT (60 s), and a connection idle for longer than that (a keep-alive, a
/// websocket, an SSH session) finds no session when it speaks again. The endpoints
/// themselves refuse such a RST unless it is at the exact next byte (RFC 5961). With
/// this window a blind sender must also hit one of 2 x 2^20 of the 2^32 sequence
/// numbers: some 2,000 times the packets for each connection (an IPv4 session keeps
/// the sequence to [`SEQ_MARK_GRAIN`], which widens its window to 2 x 2^20 + 2^17:
/// some 1,900 times).
///
/// What it costs a real connection: a client with more than 1 MiB sent but not yet
/// past Sluice when it resets or closes (a fast long path) has its RST or FIN
/// forwarded without moving the state, so its session stays until its ESTABLISHED
/// timeout instead of ending in seconds; no connection is broken. A forged segment
/// outside the window is forwarded as well (the endpoint judges it); counted as the
/// worker event `tcp_close_out_of_window` when it is a RST or FIN.
pub const CLIENT_SEQ_WINDOW: u32 = 1 << 20;

/// A client's TCP segment, as far as its session's sequence check cares: its first
/// sequence number, and the one after it (`seq` + data length + 1 for a SYN, 1 for a
/// FIN).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClientSegment {
    pub seq: u32,
    pub next: u32,
}

impl ClientSegment {
    /// Whether the segment starts within [`CLIENT_SEQ_WINDOW`] of `next`, the
    /// client's next sequence number as last seen (or that is not known).
    #[inline]
    pub fn within_window_of(&self, next: Option<u32>) -> bool {
        next.is_none_or(|next| self.within_window_of_range(next, 1))
    }

    /// Whether the segment starts within [`CLIENT_SEQ_WINDOW`] of some sequence number
    /// in `floor..floor + grain` (where the client's next one is known to lie).
    #[inline]
    fn within_window_of_range(&self, floor: u32, grain: u32) -> bool {
        self.seq.wrapping_sub(floor).wrapping_add(CLIENT_SEQ_WINDOW)
            <= 2 * CLIENT_SEQ_WINDOW + (grain - 1)
    }

    /// The client's next sequence number as last seen, `recorded`, after this segment
    /// within the window: its end when that is later, else as it was (a retransmission
    /// does not move it back). Not known (0) stays not known: only the segment that
    /// opened the session starts it ([`Session::with_client_next_seq`]), of the
    /// client's segments, so that a blind sender's segment cannot set it for a session
    /// that has none (one installed by sync) and then hold the window where its RST
    /// will be (a real server's acknowledgment does start it:
    /// [`SessionTable::on_server_segment`]).
    #[inline]
    pub fn moved_on(&self, recorded: u32) -> u32 {
        if recorded != 0 && seq_after(self.next, recorded) {
            self.next
        } else {
            recorded
        }
    }

    /// [`ClientSegment::moved_on`] for a [`SeqMark`] (a segment ending in the marked
    /// grain leaves the mark as it was).
    #[inline]
    fn mark_moved_on(&self, recorded: SeqMark) -> SeqMark {
        match recorded.floor() {
            Some(floor) if seq_after(self.next, floor) => SeqMark::at(self.next),
            _ => recorded,
        }
    }
}

/// Whether sequence number `a` comes after `b` (serial number arithmetic, RFC 1982:
/// less than 2^31 ahead).
#[inline]
fn seq_after(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) > 0
}

/// The client's next sequence number as last seen, in two bytes: to
/// [`SEQ_MARK_GRAIN`] (128 KiB), which is all the [`CLIENT_SEQ_WINDOW`] check needs,
/// so that every TCP session keeps it in its 64-byte entry (a FullNAT session's other
/// per-protocol word holds its timestamp offset). Bit 0 says whether it is known;
/// bits 1-15 are the sequence number's top 15 bits.
///
/// What the grain costs: the window a RST or FIN must hit is 2 x 2^20 + 2^17 of the
/// 2^32 sequence numbers instead of 2 x 2^20, 6% wider.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeqMark(u16);

/// Sequence numbers per step of a [`SeqMark`].
pub const SEQ_MARK_GRAIN: u32 = 1 << SEQ_MARK_SHIFT;
const SEQ_MARK_SHIFT: u32 = 17;

impl SeqMark {
    /// Not known: every segment is taken as within the window.
    pub const UNKNOWN: SeqMark = SeqMark(0);

    /// The mark of sequence number `next`.
    #[inline]
    pub fn at(next: u32) -> SeqMark {
        SeqMark(((next >> SEQ_MARK_SHIFT) as u16) << 1 | 1)
    }

    /// The first sequence number the mark stands for (the next one lies in the
    /// [`SEQ_MARK_GRAIN`] from there), or `None` when not known.
    #[inline]
    pub fn floor(self) -> Option<u32> {
        (self.0 & 1 == 1).then(|| u32::from(self.0 >> 1) << SEQ_MARK_SHIFT)
    }

    /// Whether `seg` starts within [`CLIENT_SEQ_WINDOW`] of the sequence number marked
    /// (anywhere in its grain), or the mark is not known.
    #[inline]
    pub fn admits(self, seg: &ClientSegment) -> bool {
        self.floor()
            .is_none_or(|floor| seg.within_window_of_range(floor, SEQ_MARK_GRAIN))
    }
}

/// Whether a real server's acknowledgment `ack` (on a segment with `flags`, ACK and
/// no RST) moves the client's sequence as last seen, `known` (`None`: not known): it
/// starts one not known, moves one forward that is behind it (the server never
/// acknowledges more than the client sent), and a SYN-ACK restarts it (the server took
/// a new SYN of the client's, from a new ISN). For both session tables
/// ([`SessionTable::on_server_segment`]).
#[inline]
pub(super) fn server_ack_moves(known: Option<u32>, ack: u32, flags: TcpFlags) -> bool {
    flags.contains(TcpFlags::SYN) || known.is_none_or(|k| seq_after(ack, k))
}

/// A client's RST or FIN outside [`CLIENT_SEQ_WINDOW`]: it moved nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OutOfWindow;

/// One connection through the load balancer: exactly one 64-byte cache line, so the
/// per-packet path touches one line of the slab.
///
/// Addresses are IPv4 in host order (as in [`FlowKey4`]). IPv6 would not grow this
/// entry: either a second entry type (two lines, in its own table, as IPv6 keys are
/// their own `FlowKey` type anyway), or the four addresses replaced by one `u32` index
/// into a per-worker side table of IPv6 address sets.
///
/// Layout (bytes): addresses 0..16, ports 16..24, MAC 24..30, protocol, mode, service
/// id 32..36, real server id 36..38, client sequence mark 38..40, state, flags, last
/// sync tick, creation tick, per-protocol word 48..52, timer link 52..64.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C, align(64))]
pub struct Session {
    pub client_addr: u32,
    pub vip: u32,
    pub real_addr: u32,
    /// FullNAT local address (the source towards the real server); 0 otherwise.
    pub local_addr: u32,
    pub client_port: u16,
    pub vport: u16,
    pub real_port: u16,
    /// FullNAT local port; 0 otherwise.
    pub local_port: u16,
    /// DR/TUN: the real server's MAC the session last sent to (all zero before the
    /// first), used only when the neighbour table has no entry for the server (its
    /// packets follow the table's). NAT/FullNAT: the MAC the client's packets last
    /// came from, i.e. the next hop back towards the client, which no table holds.
    pub peer_mac: [u8; 6],
    pub proto: Protocol,
    pub mode: ForwardMode,
    /// The virtual service, as numbered by the service snapshot.
    pub service: u32,
    /// The real server, as numbered by the service snapshot ([`Session::real`]): real
    /// server ids are below [`MAX_REAL_SERVER_IDS`].
    real: u16,
    /// TCP: the client's next sequence number as last seen ([`SeqMark`]).
    client_seq: SeqMark,
    state: TcpState,
    flags: SessionFlags,
    /// Session sync: the low 16 bits of the tick of the last sync (with `SYNCED`).
    synced_tick: u16,
    /// Tick at which the table took the session in.
    pub created: u32,
    /// Per protocol and mode, so that none makes the entry bigger: a UDP session's
    /// packets, both directions (wraps; [`Session::udp_packets`]); a FullNAT TCP
    /// session's timestamp offset ([`Session::timestamp_offset`]); 0 otherwise.
    per_proto: u32,
    timer: TimerLink,
}

impl Session {
    /// A new session for the client-side key `in_key` (client -> VIP:port), to be
    /// forwarded to `real_addr:real_port` in `mode`. TCP starts in NONE, waiting for
    /// its first segment to be classified; DR and TUN start with
    /// [`SessionFlags::NO_OUTPUT`]. `real` is a real-server id, below
    /// [`MAX_REAL_SERVER_IDS`] as the service table hands them out; one that is not
    /// becomes 0, the id no real server has.
    pub fn new(
        in_key: &FlowKey4,
        mode: ForwardMode,
        service: u32,
        real: u32,
        real_addr: Ipv4Addr,
        real_port: u16,
    ) -> Session {
        let flags = match mode {
            ForwardMode::Dr | ForwardMode::Tun => SessionFlags::NO_OUTPUT,
            ForwardMode::Nat | ForwardMode::FullNat => SessionFlags::empty(),
        };
        Session {
            client_addr: in_key.src,
            vip: in_key.dst,
            real_addr: u32::from(real_addr),
            local_addr: 0,
            client_port: in_key.sport,
            vport: in_key.dport,
            real_port,
            local_port: 0,
            peer_mac: [0; 6],
            proto: in_key.proto,
            mode,
            service,
            real: real_server_id(real),
            client_seq: SeqMark::UNKNOWN,
            state: TcpState::None,
            flags,
            synced_tick: 0,
            created: 0,
            per_proto: 0,
            timer: TimerLink::new(),
        }
    }

    /// Sets the FullNAT local address and port.
    /// A session in `state`, as a sync record describes it (the standby's copy).
    pub fn with_state(mut self, state: TcpState) -> Session {
        self.state = state;
        self
    }

    /// Ticks since the last sync (wrapping at 2^16 ticks), if ever synced.
    pub fn ticks_since_sync(&self, now_tick: u32) -> Option<u32> {
        self.flags
            .contains(SessionFlags::SYNCED)
            .then(|| u32::from((now_tick as u16).wrapping_sub(self.synced_tick)))
    }

    /// Records a sync at `now_tick`.
    pub fn mark_synced(&mut self, now_tick: u32) {
        self.flags.insert(SessionFlags::SYNCED);
        self.synced_tick = now_tick as u16;
    }

    /// UDP: packets seen, both directions (wraps). 0 for TCP, which does not count them.
    #[inline]
    pub fn udp_packets(&self) -> u32 {
        match self.proto {
            Protocol::Udp => self.per_proto,
            Protocol::Tcp => 0,
        }
    }

    /// TCP: what client-to-server segments add to their TSval, and server-to-client
    /// segments take from their TSecr (see [`crate::forward::timestamps`]); 0 when
    /// nothing is rewritten, and always 0 for UDP and for the modes other than
    /// FullNAT (which rewrite no timestamps).
    #[inline]
    pub fn timestamp_offset(&self) -> u32 {
        match (self.proto, self.mode) {
            (Protocol::Tcp, ForwardMode::FullNat) => self.per_proto,
            _ => 0,
        }
    }

    /// The real server, as numbered by the service snapshot.
    #[inline]
    pub fn real(&self) -> u32 {
        u32::from(self.real)
    }

    /// The client's next sequence number as last seen ([`ClientSegment`]), to
    /// [`SEQ_MARK_GRAIN`]: the first sequence number of the grain it lies in. `None`
    /// when not known (a session installed by sync, until a real server's
    /// acknowledgment passes: its client's RST and FIN are taken as IPVS takes them),
    /// and for UDP sessions.
    pub fn client_next_seq(&self) -> Option<u32> {
        self.client_seq.floor()
    }

    /// Whether the client's segment `seg` lies within [`CLIENT_SEQ_WINDOW`] of the
    /// client's sequence as last seen (or that is not known).
    #[inline]
    fn in_client_window(&self, seg: &ClientSegment) -> bool {
        self.client_seq.admits(seg)
    }

    /// A client segment within the window moves the client's sequence as last seen
    /// forward to its end (never back: a retransmission leaves it).
    #[inline]
    fn note_client_segment(&mut self, seg: &ClientSegment) {
        self.client_seq = seg.mark_moved_on(self.client_seq);
    }

    /// Starts the client's sequence as last seen at `next`, the end of the segment
    /// that opened the session (its SYN, or the ACK a sloppy or proxied session opens
    /// on); ignored for UDP.
    pub fn with_client_next_seq(mut self, next: u32) -> Session {
        if self.proto == Protocol::Tcp {
            self.client_seq = SeqMark::at(next);
        }
        self
    }

    /// Sets the TCP timestamp offset; ignored for UDP and the modes but FullNAT.
    pub fn with_timestamp_offset(mut self, offset: u32) -> Session {
        if self.proto == Protocol::Tcp && self.mode == ForwardMode::FullNat {
            self.per_proto = offset;
        }
        self
    }

    pub fn with_local(mut self, addr: Ipv4Addr, port: u16) -> Session {
        self.local_addr = u32::from(addr);
        self.local_port = port;
        self
    }

    /// The key of client packets: client -> VIP:port.
    pub fn in_key(&self) -> FlowKey4 {
        FlowKey4 {
            src: self.client_addr,
            dst: self.vip,
            sport: self.client_port,
            dport: self.vport,
            proto: self.proto,
        }
    }

    /// The key of real-server packets when they come back through Sluice: towards the
    /// client for NAT, towards the local address for FullNAT; `None` for DR and TUN.
    pub fn reply_key(&self) -> Option<FlowKey4> {
        let (dst, dport) = match self.mode {
            ForwardMode::Nat => (self.client_addr, self.client_port),
            ForwardMode::FullNat => (self.local_addr, self.local_port),
            ForwardMode::Dr | ForwardMode::Tun => return None,
        };
        Some(FlowKey4 {
            src: self.real_addr,
            dst,
            sport: self.real_port,
            dport,
            proto: self.proto,
        })
    }

    #[inline]
    pub fn state(&self) -> TcpState {
        self.state
    }

    /// The state column of `ipvsadm -Lnc`.
    pub fn state_name(&self) -> &'static str {
        match self.proto {
            Protocol::Tcp => self.state.name(),
            Protocol::Udp => UDP_STATE_NAME,
        }
    }

    /// A TCP connection not yet established: no state yet, SYN_RECV (the client's SYN
    /// seen, its ACK not) or SYN_SENT. Under table pressure these go first
    /// ([`SessionTable::oldest_reclaimable`]).
    #[inline]
    pub fn is_half_open(&self) -> bool {
        self.proto == Protocol::Tcp && state::is_half_open(self.state)
    }

    /// A TCP connection that is over (TIME_WAIT, CLOSE): under table pressure these go
    /// too, with the half-open ones, oldest made first ([`SessionTable::oldest_reclaimable`]:
    /// one scan in creation order, which passes over, for good, what it finds in
    /// another state; so only sessions that finished before the scan reached them).
    #[inline]
    pub fn is_finished(&self) -> bool {
        self.proto == Protocol::Tcp && state::is_finished(self.state)
    }

    /// Counts in the real server's ActiveConn (else InActConn).
    #[inline]
    pub fn is_active(&self) -> bool {
        self.proto == Protocol::Tcp && state::is_active(self.state)
    }

    #[inline]
    pub fn flags(&self) -> SessionFlags {
        let mut flags = self.flags;
        flags.remove(SessionFlags::IN_USE);
        flags
    }

    /// Sets the data-plane flags in `flags` (`NO_OUTPUT`, `TOA_PENDING`).
    pub fn set_flags(&mut self, flags: SessionFlags) {
        let mut f = flags;
        f.remove(SessionFlags::IN_USE);
        self.flags.insert(f);
    }

    /// Clears the data-plane flags in `flags`.
    pub fn clear_flags(&mut self, flags: SessionFlags) {
        let mut f = flags;
        f.remove(SessionFlags::IN_USE);
        self.flags.remove(f);
    }

    /// Moves the TCP state on a segment with `flags` seen in `dir` (as returned by
    /// [`SessionTable::lookup`]). While [`SessionFlags::NO_OUTPUT`] is set, client
    /// segments use the INPUT-ONLY table; a segment from the real server clears it.
    /// For FullNAT, and where the client's sequence is not known, a SYN never takes
    /// the session back from past its handshake
    /// ([`state::transition_never_back_to_handshake`]).
    pub fn on_tcp_segment(&mut self, dir: Direction, flags: TcpFlags) -> Transition {
        debug_assert_eq!(self.proto, Protocol::Tcp);
        let table = match dir {
            Direction::Outbound => {
                self.flags.remove(SessionFlags::NO_OUTPUT);
                Direction::Outbound
            }
            Direction::Inbound if self.flags.contains(SessionFlags::NO_OUTPUT) => {
                Direction::InputOnly
            }
            other => other,
        };
        let transition = if self.client_next_seq().is_some() && self.mode != ForwardMode::FullNat {
            state::transition(self.state, table, flags)
        } else {
            state::transition_never_back_to_handshake(self.state, table, flags)
        };
        self.state = transition.to;
        transition
    }

    /// Sets the state directly (a session synced from a peer, a LISTEN template).
    pub fn set_state(&mut self, to: TcpState) -> Transition {
        let transition = Transition {
            from: self.state,
            to,
        };
        self.state = to;
        transition
    }

    /// The tick the session expires at, unless touched again.
    #[inline]
    pub fn deadline(&self) -> u32 {
        self.timer.deadline()
    }

    #[inline]
    fn in_use(&self) -> bool {
        self.flags.contains(SessionFlags::IN_USE)
    }

    fn vacant() -> Session {
        let any_key = FlowKey4::new(
            Protocol::Tcp,
            Ipv4Addr::UNSPECIFIED,
            0,
            Ipv4Addr::UNSPECIFIED,
            0,
        );
        let mut session = Session::new(&any_key, ForwardMode::Dr, 0, 0, Ipv4Addr::UNSPECIFIED, 0);
        session.flags = SessionFlags::empty();
        session
    }
}

/// `real` as a session entry keeps it ([`Session::new`]).
#[inline]
fn real_server_id(real: u32) -> u16 {
    debug_assert!(
        (real as usize) < MAX_REAL_SERVER_IDS,
        "real-server id {real}"
    );
    u16::try_from(real).unwrap_or(0)
}

impl Timed for Session {
    #[inline]
    fn timer(&self) -> &TimerLink {
        &self.timer
    }
    #[inline]
    fn timer_mut(&mut self) -> &mut TimerLink {
        &mut self.timer
    }
}

/// Why [`SessionTable::insert`] refused a session. Nothing was changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum InsertError {
    /// Every slot is in use.
    TableFull,
    /// A session already owns this key: the client key for `Inbound`, the reply key
    /// for `Outbound`. The reply key is checked first.
    KeyExists(Direction),
}

impl fmt::Display for InsertError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            InsertError::TableFull => f.write_str("session table full"),
            InsertError::KeyExists(Direction::Outbound) => {
                f.write_str("a session already owns the reply key")
            }
            InsertError::KeyExists(_) => f.write_str("a session already owns the client key"),
        }
    }
}

impl std::error::Error for InsertError {}

/// The index value: slab index and the direction of the key.
#[inline]
pub(super) fn index_value(index: u32, dir: Direction) -> u32 {
    index << 1 | (dir == Direction::Outbound) as u32
}

/// The slab index and key direction an index value names.
#[inline]
pub(super) fn split_value(value: u32) -> (u32, Direction) {
    let dir = if value & 1 == 0 {
        Direction::Inbound
    } else {
        Direction::Outbound
    };
    (value >> 1, dir)
}

/// The hasher every session table of this process uses, seeded once from the
/// operating system's randomness: keys hash the same in every table, so a
/// [`HashedKey`] made on one worker's burst is valid for any table, and a remote
/// sender cannot predict which bucket its 5-tuples land in. Inline: every packet
/// asks, and the seeded case is one load and one compare.
#[inline]
pub(super) fn process_hasher() -> &'static Hasher {
    static HASHER: std::sync::OnceLock<Hasher> = std::sync::OnceLock::new();
    HASHER.get_or_init(Hasher::random)
}

/// A key with its hash, computed once per packet and used for the index prefetch,
/// the lookup and the insert. Only [`HashedKey::new`] makes one, so the hash always
/// belongs to the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HashedKey {
    key: FlowKey4,
    hash: KeyHash,
}

impl HashedKey {
    #[inline]
    pub fn new(key: FlowKey4) -> HashedKey {
        let a = u64::from(key.src) << 32 | u64::from(key.dst);
        let b = u64::from(key.sport) << 32 | u64::from(key.dport) << 16 | key.proto as u64;
        HashedKey {
            key,
            hash: process_hasher().hash(a, b),
        }
    }

    #[inline]
    pub fn key(&self) -> &FlowKey4 {
        &self.key
    }

    #[inline]
    pub fn hash(&self) -> KeyHash {
        self.hash
    }
}

/// Whether `session` (in use) is filed under `key` in direction `dir`.
#[inline]
fn files_under(session: &Session, dir: Direction, key: &FlowKey4) -> bool {
    session.in_use()
        && match dir {
            Direction::Outbound => session.reply_key().as_ref() == Some(key),
            _ => session.in_key() == *key,
        }
}

/// One worker's sessions. Every operation is O(1) and, after construction, none
/// allocates.
pub struct SessionTable {
    slab: HugeVec<Session, HugePageAlloc>,
    index: SessionIndex,
    wheel: TimerWheel,
    /// First vacant slot; vacant slots are chained through their timer link's `next`.
    free_head: u32,
    len: u32,
    /// TCP sessions in the order they were made, for reclaiming half-open ones.
    created: CreationOrder,
}

/// Index keys per session at most: the client key and the reply key.
const KEYS_PER_SESSION: usize = 2;

impl SessionTable {
    /// A table for `capacity` sessions with a [`DEFAULT_WHEEL_SLOTS`] wheel at tick 0.
    pub fn with_capacity(capacity: usize) -> Self {
        Self::with_wheel(capacity, DEFAULT_WHEEL_SLOTS, 0)
    }

    /// A table for `capacity` sessions, with a timer wheel of `wheel_slots` slots (a
    /// power of two) whose clock starts at `now_tick`. Panics when the memory cannot
    /// be had; [`try_with_wheel`](Self::try_with_wheel) reports it instead.
    pub fn with_wheel(capacity: usize, wheel_slots: usize, now_tick: u32) -> Self {
        Self::try_with_wheel(capacity, wheel_slots, now_tick).unwrap_or_else(|e| panic!("{e}"))
    }

    /// As [`with_wheel`](Self::with_wheel), but a refused allocation (the kernel has
    /// not the memory, or an address-space limit) is an error, not an abort. The
    /// memory is written here, so it is placed on the NUMA node of the calling
    /// thread: build a worker's table on the worker's own lcore.
    pub fn try_with_wheel(
        capacity: usize,
        wheel_slots: usize,
        now_tick: u32,
    ) -> Result<Self, TableAllocError> {
        assert!(
            capacity <= MAX_CAPACITY,
            "session table capacity {capacity} above {MAX_CAPACITY}"
        );
        let refused = || TableAllocError {
            capacity,
            bytes: Self::bytes_for(capacity, wheel_slots),
        };
        let mut slab = HugeVec::new_in(HugePageAlloc);
        slab.try_reserve_exact(capacity).map_err(|_| refused())?;
        slab.resize(capacity, Session::vacant());
        for (index, session) in slab.iter_mut().enumerate() {
            session.timer.next = if index + 1 < capacity {
                index as u32 + 1
            } else {
                NIL
            };
        }
        let index = SessionIndex::try_new(capacity.saturating_mul(KEYS_PER_SESSION))
            .map_err(|_| refused())?;
        let created = CreationOrder::try_new(capacity).ok_or_else(refused)?;
        Ok(SessionTable {
            slab,
            index,
            wheel: TimerWheel::new(wheel_slots, now_tick),
            free_head: if capacity > 0 { 0 } else { NIL },
            len: 0,
            created,
        })
    }

    /// Bytes a table for `capacity` sessions with a `wheel_slots`-slot wheel
    /// allocates: [`memory_bytes`](Self::memory_bytes) of that table, known before
    /// making it (start-up checks it against the memory available).
    pub fn bytes_for(capacity: usize, wheel_slots: usize) -> usize {
        let slab = capacity.saturating_mul(std::mem::size_of::<Session>());
        let index = SessionIndex::bytes_for(capacity.saturating_mul(KEYS_PER_SESSION));
        std::mem::size_of::<Self>()
            .saturating_add(slab)
            .saturating_add(index)
            .saturating_add(CreationOrder::bytes_for(capacity))
            .saturating_add(TimerWheel::bytes_for(wheel_slots))
    }

    /// Sessions in the table.
    #[inline]
    pub fn len(&self) -> usize {
        self.len as usize
    }

    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Sessions the table can hold.
    #[inline]
    pub fn capacity(&self) -> usize {
        self.slab.len()
    }

    /// The session filed under `key`, and which of its keys that is.
    #[inline]
    pub fn lookup(&self, key: &FlowKey4) -> Option<(SessionId, Direction)> {
        self.lookup_hashed(&HashedKey::new(*key))
    }

    /// [`lookup`](Self::lookup) with the hash already computed.
    #[inline]
    pub fn lookup_hashed(&self, key: &HashedKey) -> Option<(SessionId, Direction)> {
        let slab = &self.slab;
        self.index
            .find(key.hash, |value| {
                let (index, dir) = split_value(value);
                slab.get(index as usize)
                    .is_some_and(|s| files_under(s, dir, &key.key))
            })
            .map(|value| {
                let (index, dir) = split_value(value);
                (SessionId(index), dir)
            })
    }

    /// First step of a burst's prefetch: starts loading `key`'s index bucket.
    #[inline]
    pub fn prefetch_bucket(&self, key: &HashedKey) {
        self.index.prefetch(key.hash);
    }

    /// Second step, once the bucket has had time to arrive: starts loading the session
    /// entry the bucket's first matching tag names (a guess the lookup checks). Where
    /// no tag matches but keys passed the bucket, the key may lie in the next one: it
    /// starts loading that bucket instead and returns true, and
    /// [`SessionTable::prefetch_entry_past_home`] takes the third step once it is there.
    /// (A key not filed, such as a new connection's, whose home bucket keys passed
    /// costs that bucket's load for nothing.)
    #[inline]
    #[must_use = "a key past its home bucket needs the third step"]
    pub fn prefetch_entry(&self, key: &HashedKey) -> bool {
        self.index
            .prefetch_candidate(key.hash, |value| self.prefetch_slot(value))
    }

    /// Third step, for a key [`SessionTable::prefetch_entry`] found past its home
    /// bucket, once the next bucket has had time to arrive: starts loading the entry
    /// that bucket's first matching tag names. (A key two or more buckets past its
    /// home is looked up unprefetched.)
    #[inline]
    pub fn prefetch_entry_past_home(&self, key: &HashedKey) {
        self.index
            .prefetch_candidate_past_home(key.hash, |value| self.prefetch_slot(value));
    }

    /// Starts loading the entry index value `value` names.
    #[inline]
    fn prefetch_slot(&self, value: u32) {
        if let Some(session) = self.slab.get(split_value(value).0 as usize) {
            super::prefetch_line(session);
        }
    }

    /// Adds `session`, filed under its client key and, when replies come through
    /// Sluice (NAT, FullNAT), its reply key; it expires `timeout_ticks` after
    /// `now_tick` unless touched. Refuses, changing nothing, when the table is full or
    /// a key is taken.
    pub fn insert(
        &mut self,
        session: Session,
        now_tick: u32,
        timeout_ticks: u32,
    ) -> Result<SessionId, InsertError> {
        self.insert_hashed(
            &HashedKey::new(session.in_key()),
            session,
            now_tick,
            timeout_ticks,
        )
    }

    /// [`insert`](Self::insert) with the client key's hash already computed (by the
    /// lookup that missed). A `in_key` that is not the session's client key is
    /// ignored and the right one hashed.
    pub fn insert_hashed(
        &mut self,
        in_key: &HashedKey,
        session: Session,
        now_tick: u32,
        timeout_ticks: u32,
    ) -> Result<SessionId, InsertError> {
        let reply = session.reply_key().map(HashedKey::new);
        self.insert_with_keys(in_key, reply.as_ref(), session, now_tick, timeout_ticks)
    }

    /// [`insert_hashed`](Self::insert_hashed) with the reply key's hash also already
    /// computed (by the caller that prefetched its bucket). Keys that are not the
    /// session's own are ignored and the right ones hashed, so a caller's mistake can
    /// cost time but never file a session under a key it does not have.
    pub fn insert_with_keys(
        &mut self,
        in_key: &HashedKey,
        reply_key: Option<&HashedKey>,
        mut session: Session,
        now_tick: u32,
        timeout_ticks: u32,
    ) -> Result<SessionId, InsertError> {
        let own;
        let in_key = if in_key.key == session.in_key() {
            in_key
        } else {
            own = HashedKey::new(session.in_key());
            &own
        };
        let reply = match (session.reply_key(), reply_key) {
            (Some(wanted), Some(given)) if given.key == wanted => Some(*given),
            (wanted, _) => wanted.map(HashedKey::new),
        };
        if let Some(reply) = &reply {
            if reply.key == in_key.key || self.lookup_hashed(reply).is_some() {
                return Err(InsertError::KeyExists(Direction::Outbound));
            }
        }
        if self.lookup_hashed(in_key).is_some() {
            return Err(InsertError::KeyExists(Direction::Inbound));
        }
        let index = self.free_head;
        if index == NIL {
            return Err(InsertError::TableFull);
        }
        // The index is made for every slot's two keys, so it has room while a slot
        // is free; refusing here keeps the index whole should that ever not hold.
        if !self
            .index
            .insert(in_key.hash, index_value(index, Direction::Inbound))
        {
            return Err(InsertError::TableFull);
        }
        if let Some(reply) = &reply {
            if !self
                .index
                .insert(reply.hash, index_value(index, Direction::Outbound))
            {
                self.index
                    .remove(in_key.hash, index_value(index, Direction::Inbound));
                return Err(InsertError::TableFull);
            }
        }
        let slot = index as usize;
        self.free_head = self.slab[slot].timer.next;
        // The next insert writes the next free entry: start loading it now.
        if let Some(next) = self.slab.get(self.free_head as usize) {
            super::prefetch_line(next);
        }
        session.flags.insert(SessionFlags::IN_USE);
        session.created = now_tick;
        session.timer = TimerLink::new();
        if session.proto == Protocol::Tcp {
            self.created.push(index, now_tick);
        }
        self.slab[slot] = session;
        self.len += 1;
        let deadline = now_tick.wrapping_add(timeout_ticks.min(MAX_DELAY_TICKS));
        self.wheel
            .schedule(&mut self.slab[..], index, now_tick, deadline);
        Ok(SessionId(index))
    }

    #[inline]
    pub fn get(&self, id: SessionId) -> Option<&Session> {
        self.slab.get(id.0 as usize).filter(|s| s.in_use())
    }

    /// The session, to update its fields. Its keys and timer stay under the table's
    /// control.
    #[inline]
    pub fn get_mut(&mut self, id: SessionId) -> Option<&mut Session> {
        self.slab.get_mut(id.0 as usize).filter(|s| s.in_use())
    }

    /// Makes the session expire `timeout_ticks` after `now_tick`. O(1); a later
    /// deadline is only written into the entry (see the timer's lazy re-arming).
    /// Returns false if there is no such session.
    #[inline]
    pub fn touch(&mut self, id: SessionId, now_tick: u32, timeout_ticks: u32) -> bool {
        if self.get(id).is_none() {
            return false;
        }
        let deadline = now_tick.wrapping_add(timeout_ticks.min(MAX_DELAY_TICKS));
        self.wheel
            .schedule(&mut self.slab[..], id.0, now_tick, deadline);
        true
    }

    /// The per-packet update, as IPVS does it: counts the packet, moves a TCP session's
    /// state on the segment's `flags` (ignored for UDP), and re-arms the session with
    /// the timeout of its (new) state. `dir` is the direction [`Self::lookup`] gave.
    pub fn on_packet(
        &mut self,
        id: SessionId,
        dir: Direction,
        flags: TcpFlags,
        now_tick: u32,
        timeouts: &TickTimeouts,
    ) -> Option<Transition> {
        let session = self.get_mut(id)?;
        let transition = match session.proto {
            Protocol::Tcp => session.on_tcp_segment(dir, flags),
            Protocol::Udp => {
                session.per_proto = session.per_proto.wrapping_add(1);
                Transition {
                    from: session.state,
                    to: session.state,
                }
            }
        };
        let timeout = timeouts.session(session.proto, session.state);
        self.touch(id, now_tick, timeout);
        Some(transition)
    }

    /// As [`SessionTable::on_packet`], for a client's TCP segment whose sequence
    /// numbers are known: a RST or FIN further than [`CLIENT_SEQ_WINDOW`] from the
    /// client's sequence as last seen moves nothing (its state and deadline stay), and
    /// `Err` says so; any other segment within the window moves that sequence to its
    /// end. Sessions that do not know the client's sequence (installed by sync, until
    /// [`SessionTable::on_server_segment`] starts it) take every segment as
    /// `on_packet` does.
    #[inline]
    pub fn on_client_segment(
        &mut self,
        id: SessionId,
        flags: TcpFlags,
        seg: ClientSegment,
        now_tick: u32,
        timeouts: &TickTimeouts,
    ) -> Option<Result<Transition, OutOfWindow>> {
        let session = self.get_mut(id)?;
        if session.proto != Protocol::Tcp {
            return self
                .on_packet(id, Direction::Inbound, flags, now_tick, timeouts)
                .map(Ok);
        }
        if !session.in_client_window(&seg) {
            if flags.intersects(TcpFlags::RST | TcpFlags::FIN) {
                return Some(Err(OutOfWindow));
            }
        } else if !flags.contains(TcpFlags::RST) {
            session.note_client_segment(&seg);
        }
        let transition = session.on_tcp_segment(Direction::Inbound, flags);
        let timeout = timeouts.session(Protocol::Tcp, session.state);
        let deadline = now_tick.wrapping_add(timeout.min(MAX_DELAY_TICKS));
        self.wheel
            .schedule(&mut self.slab[..], id.0, now_tick, deadline);
        Some(Ok(transition))
    }

    /// As [`SessionTable::on_packet`], for a real server's TCP segment with ACK and
    /// without RST, whose acknowledgment number `ack` is the client's next sequence
    /// number as the server has it. That starts the client's sequence as last seen
    /// where it is not known (a session installed by sync: from then on its client's
    /// RST and FIN are checked), moves it forward where it is behind (the server never
    /// acknowledges more than the client sent: a sequence started from an
    /// acknowledgment while over 1 MiB was in flight, which the client's own segments
    /// no longer reach, catches up), and restarts it on a SYN-ACK (the server took a
    /// new SYN of the client's, from a new ISN, on a session not over yet, whose later
    /// segments would otherwise all lie outside the window). A blind sender on the
    /// client's side cannot send this: it needs the real server's address and port as
    /// its source, and one who can already ends the session with a RST from there.
    #[inline]
    pub fn on_server_segment(
        &mut self,
        id: SessionId,
        flags: TcpFlags,
        ack: u32,
        now_tick: u32,
        timeouts: &TickTimeouts,
    ) -> Option<Transition> {
        let session = self.get_mut(id)?;
        if session.proto == Protocol::Tcp
            && server_ack_moves(session.client_seq.floor(), ack, flags)
        {
            session.client_seq = SeqMark::at(ack);
        }
        self.on_packet(id, Direction::Outbound, flags, now_tick, timeouts)
    }

    /// Removes the session: its keys, its timer and its slot. Returns it.
    pub fn remove(&mut self, id: SessionId) -> Option<Session> {
        let session = *self.get(id)?;
        self.wheel.cancel(&mut self.slab[..], id.0);
        release(
            id.0,
            &mut self.slab[id.0 as usize],
            &mut self.index,
            &mut self.free_head,
            &mut self.len,
        );
        Some(session)
    }

    /// Removes the sessions whose deadline has come by `now_tick`, examining at most
    /// `budget` entries. `on_expire` sees each one just before it is removed, to update
    /// per-real-server counts or free a FullNAT port. Call again while
    /// [`Advance::caught_up`] is false.
    ///
    /// Each expired session has one or two keys in random buckets of the index.
    /// Removed at once, every key would wait for its bucket; so the slot is freed at
    /// once, and its keys wait in a queue of [`EXPIRY_PIPELINE`] while their buckets
    /// load (prefetched when the session expires) and are removed when the queue moves
    /// on or the call ends. Nothing looks the table up in between (`on_expire` sees
    /// one session, not the table): by the time this returns the index holds exactly
    /// the live sessions' keys. Costs a queue of eight entries on the stack.
    pub fn expire(
        &mut self,
        now_tick: u32,
        budget: usize,
        on_expire: impl FnMut(SessionId, &Session),
    ) -> Advance {
        self.expire_visiting(now_tick, budget, on_expire, |_, _| None)
    }

    /// [`SessionTable::expire`], also showing `on_visit` each live session the wheel
    /// meets on its way ([`TimerWheel::advance_visiting`]): at least once a
    /// revolution of the wheel, or by the tick `on_visit` asks to meet it again.
    pub fn expire_visiting(
        &mut self,
        now_tick: u32,
        budget: usize,
        mut on_expire: impl FnMut(SessionId, &Session),
        mut on_visit: impl FnMut(SessionId, &Session) -> Option<u32>,
    ) -> Advance {
        let SessionTable {
            slab,
            index,
            wheel,
            free_head,
            len,
            ..
        } = self;
        let mut waiting = [None::<IndexEntries>; EXPIRY_PIPELINE];
        let mut next = 0;
        let advance = wheel.advance_visiting(
            &mut slab[..],
            now_tick,
            budget,
            |at, session| {
                on_expire(SessionId(at), session);
                let keys = IndexEntries::of(at, session);
                keys.prefetch(index);
                if let Some(earlier) = waiting[next].replace(keys) {
                    earlier.remove_from(index);
                }
                next = (next + 1) % EXPIRY_PIPELINE;
                recycle_slot(at, session, free_head, len);
            },
            |at, session| on_visit(SessionId(at), session),
        );
        for keys in waiting.into_iter().flatten() {
            keys.remove_from(index);
        }
        advance
    }

    /// Makes sure [`SessionTable::expire_visiting`] shows session `id` to its
    /// `on_visit` by tick `visit` (before its deadline, that is).
    pub fn visit_by(&mut self, id: SessionId, visit: u32) {
        if self.get(id).is_some() {
            self.wheel.visit_by(&mut self.slab[..], id.0, visit);
        }
    }

    /// Every live session, in slab order (a full scan: for listings, not per packet).
    pub fn iter(&self) -> impl Iterator<Item = (SessionId, &Session)> + '_ {
        self.slab
            .iter()
            .enumerate()
            .filter(|(_, s)| s.in_use())
            .map(|(index, s)| (SessionId(index as u32), s))
    }

    /// Live sessions in the slab slots `slots` (cut to the slab), in slab order, with
    /// their indices: a resumable scan for listings read in chunks, which reads only
    /// those slots however few of them are in use.
    pub fn iter_slots(
        &self,
        slots: std::ops::Range<usize>,
    ) -> impl Iterator<Item = (usize, &Session)> + '_ {
        let end = slots.end.min(self.slab.len());
        let start = slots.start.min(end);
        self.slab[start..end]
            .iter()
            .enumerate()
            .map(move |(i, s)| (start + i, s))
            .filter(|(_, s)| s.in_use())
    }

    /// The tick the timer wheel has processed up to.
    pub fn wheel_tick(&self) -> u32 {
        self.wheel.now()
    }

    /// Keys in the index (one per DR/TUN session, two per NAT/FullNAT session).
    pub fn index_keys(&self) -> usize {
        self.index.len()
    }

    /// Bytes allocated for the table at its capacity: slab, index, creation order and
    /// timer wheel. Constant after construction.
    /// [`resident_bytes`](Self::resident_bytes) measures what the kernel actually maps
    /// for them.
    pub fn memory_bytes(&self) -> usize {
        let slab = std::mem::size_of_val::<[Session]>(&self.slab);
        std::mem::size_of::<Self>()
            + slab
            + self.index.memory().1
            + self.created.memory().1
            + self.wheel.memory_bytes()
    }

    /// The index buckets a lookup of a filed key reads, on average
    /// ([`SessionIndex::buckets_per_lookup`]). Reads the whole index.
    pub fn index_buckets_per_lookup(&self) -> f64 {
        self.index.buckets_per_lookup()
    }

    /// Bytes of the hash index alone (its buckets), constant after construction.
    pub fn index_bytes(&self) -> usize {
        self.index.memory().1
    }

    /// Free slots.
    #[inline]
    pub fn free(&self) -> usize {
        self.capacity() - self.len()
    }

    /// The oldest half-open TCP session ([`Session::is_half_open`]) the table still
    /// has, looking at most `max_scan` entries of its creation order (each one looked
    /// at is used up: sessions made since are found later). For making room when the
    /// table is nearly full; the caller removes it. See [`super::reclaim`].
    pub fn oldest_reclaimable(&mut self, max_scan: usize) -> Option<SessionId> {
        for _ in 0..max_scan {
            let (slot, tick) = self.created.pop()?;
            let Some(s) = self.slab.get(slot as usize) else {
                continue;
            };
            if s.in_use()
                && s.proto == Protocol::Tcp
                && self.created.tick_bits(s.created) == tick
                && (s.is_half_open() || s.is_finished())
            {
                return Some(SessionId(slot));
            }
        }
        None
    }

    /// Bytes of the slab and the index resident in memory now, as the kernel reports
    /// them page by page (`mincore`): a measurement, not [`memory_bytes`]'s sum of
    /// sizes. The wheel and the struct itself are not included (a few KiB).
    ///
    /// [`memory_bytes`]: Self::memory_bytes
    pub fn resident_bytes(&self) -> std::io::Result<usize> {
        let slab = super::hugemem::resident_bytes(
            self.slab.as_ptr() as *const u8,
            std::mem::size_of_val::<[Session]>(&self.slab),
        )?;
        let (at, len) = self.index.memory();
        let (order_at, order_len) = self.created.memory();
        Ok(slab
            + super::hugemem::resident_bytes(at, len)?
            + super::hugemem::resident_bytes(order_at, order_len)?)
    }

    /// Checks that the table's parts agree: `len` counts the slots in use; each such
    /// slot has an armed timer and its keys in the index, pointing at it with their
    /// direction, each vacant slot neither; the index holds exactly the live sessions'
    /// keys and its overflow counts match where they sit; the free list walks every
    /// vacant slot once. O(capacity): for tests and fuzzing, never the packet path.
    /// The first disagreement found, described.
    pub fn check_consistency(&self) -> Result<(), String> {
        let mut live = 0usize;
        let mut keys_expected = 0usize;
        for (index, session) in self.slab.iter().enumerate() {
            if session.in_use() {
                live += 1;
                if !session.timer.is_armed() {
                    return Err(format!("session {index} in use but its timer is not armed"));
                }
                let mut check = |key: FlowKey4, dir: Direction| {
                    keys_expected += 1;
                    match self.lookup(&key) {
                        Some((id, d)) if id.0 == index as u32 && d == dir => Ok(()),
                        other => Err(format!(
                            "session {index}: its {dir:?} key maps to {other:?}"
                        )),
                    }
                };
                check(session.in_key(), Direction::Inbound)?;
                if let Some(reply) = session.reply_key() {
                    check(reply, Direction::Outbound)?;
                }
            } else if session.timer.is_armed() {
                return Err(format!("vacant slot {index} has an armed timer"));
            }
        }
        if live != self.len as usize {
            return Err(format!("len {} but {live} slots in use", self.len));
        }
        if self.index.len() != keys_expected {
            return Err(format!(
                "index holds {} keys, live sessions have {keys_expected}",
                self.index.len()
            ));
        }
        let slab = &self.slab;
        self.index.check_consistency(|value| {
            let (at, dir) = split_value(value);
            let session = slab.get(at as usize).filter(|s| s.in_use())?;
            let key = match dir {
                Direction::Outbound => session.reply_key()?,
                _ => session.in_key(),
            };
            Some(HashedKey::new(key).hash)
        })?;
        let mut seen = vec![false; self.slab.len()];
        let mut at = self.free_head;
        let mut free = 0usize;
        while at != NIL {
            let slot = at as usize;
            match (self.slab.get(slot), seen.get(slot)) {
                (Some(s), Some(false)) if !s.in_use() => {}
                _ => {
                    return Err(format!(
                        "free list reaches slot {at}: out of range, in use or seen twice"
                    ))
                }
            }
            seen[slot] = true;
            free += 1;
            at = self.slab[slot].timer.next;
        }
        if free + live != self.slab.len() {
            return Err(format!(
                "{free} free + {live} live slots, capacity {}",
                self.slab.len()
            ));
        }
        Ok(())
    }
}

/// Expired sessions whose index keys wait for their buckets ([`SessionTable::expire`]):
/// enough to cover a memory latency with the work of the sessions after them.
const EXPIRY_PIPELINE: usize = 8;

/// Where the session in slot `at` is filed in the index (its keys' hashes): what
/// removing it from the index needs once the slot itself may be reused.
#[derive(Clone, Copy)]
struct IndexEntries {
    at: u32,
    inbound: KeyHash,
    reply: Option<KeyHash>,
}

impl IndexEntries {
    fn of(at: u32, session: &Session) -> IndexEntries {
        IndexEntries {
            at,
            inbound: HashedKey::new(session.in_key()).hash,
            reply: session.reply_key().map(|k| HashedKey::new(k).hash),
        }
    }

    /// Starts loading the keys' buckets.
    fn prefetch(&self, index: &SessionIndex) {
        index.prefetch(self.inbound);
        if let Some(reply) = self.reply {
            index.prefetch(reply);
        }
    }

    fn remove_from(self, index: &mut SessionIndex) {
        let removed = index.remove(self.inbound, index_value(self.at, Direction::Inbound));
        debug_assert!(removed, "slot {}: its inbound key was not filed", self.at);
        if let Some(reply) = self.reply {
            let removed = index.remove(reply, index_value(self.at, Direction::Outbound));
            debug_assert!(removed, "slot {}: its reply key was not filed", self.at);
        }
    }
}

/// Returns a session's slot to the free list and its keys out of the index. The timer
/// must already be disarmed.
fn release(
    at: u32,
    session: &mut Session,
    index: &mut SessionIndex,
    free_head: &mut u32,
    len: &mut u32,
) {
    IndexEntries::of(at, session).remove_from(index);
    recycle_slot(at, session, free_head, len);
}

/// Returns a session's slot to the free list; its keys must be out of the index, or
/// taken out before anything looks the index up. The timer must already be disarmed.
fn recycle_slot(at: u32, session: &mut Session, free_head: &mut u32, len: &mut u32) {
    debug_assert!(!session.timer.is_armed());
    session.flags = SessionFlags::empty();
    session.timer.next = *free_head;
    *free_head = at;
    *len -= 1;
}

/// A session table's memory was refused.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TableAllocError {
    pub capacity: usize,
    pub bytes: usize,
}

impl fmt::Display for TableAllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "a session table for {} sessions needs {} MiB; the allocation was refused",
            self.capacity,
            self.bytes.div_ceil(1 << 20)
        )
    }
}

impl std::error::Error for TableAllocError {}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::FlowKey;
    use crate::session::timeouts::Timeouts;
    use std::collections::{HashMap as StdHashMap, HashSet};

    fn ip(n: u32) -> Ipv4Addr {
        Ipv4Addr::from(n)
    }

    fn client_key(client: u32, cport: u16) -> FlowKey4 {
        FlowKey4::new(
            Protocol::Tcp,
            ip(0x0a00_0000 + client),
            cport,
            ip(0xc612_0101),
            80,
        )
    }

    fn nat(client: u32, cport: u16, rs: u32) -> (FlowKey4, Option<FlowKey4>, Session) {
        let key = client_key(client, cport);
        let s = Session::new(&key, ForwardMode::Nat, 1, rs, ip(0xc0a8_0000 + rs), 8080);
        (key, s.reply_key(), s)
    }

    fn dr(client: u32, cport: u16, rs: u32) -> (FlowKey4, Option<FlowKey4>, Session) {
        let key = client_key(client, cport);
        let s = Session::new(&key, ForwardMode::Dr, 1, rs, ip(0xc0a8_0000 + rs), 80);
        (key, s.reply_key(), s)
    }

    /// Expires everything due at `now`, returning the expired ids sorted.
    fn expire_all(table: &mut SessionTable, now: u32) -> Vec<SessionId> {
        let mut expired = Vec::new();
        while !table
            .expire(now, usize::MAX, |id, _| expired.push(id))
            .caught_up
        {}
        expired.sort();
        expired
    }

    #[test]
    fn session_is_one_cache_line() {
        assert_eq!(std::mem::size_of::<Session>(), 64);
        assert_eq!(std::mem::align_of::<Session>(), 64);
        assert_eq!(std::mem::size_of::<TimerLink>(), 12);
    }

    #[test]
    fn nat_session_found_from_both_directions() {
        let mut table = SessionTable::with_capacity(16);
        let (key, reply, s) = nat(1, 40000, 2);
        let reply = reply.unwrap();
        assert_eq!(
            (reply.src_addr(), reply.sport, reply.dst_addr(), reply.dport),
            (ip(0xc0a8_0002), 8080, ip(0x0a00_0001), 40000)
        );
        let id = table.insert(s, 0, 100).unwrap();
        assert_eq!(table.lookup(&key), Some((id, Direction::Inbound)));
        assert_eq!(table.lookup(&reply), Some((id, Direction::Outbound)));
        assert_eq!(table.lookup(&key.reversed()), None);
        assert_eq!(table.len(), 1);
        let got = table.get(id).unwrap();
        assert_eq!(got.in_key(), key);
        assert_eq!(got.state(), TcpState::None);
        assert_eq!(got.deadline(), 100);
        assert!(!got.flags().contains(SessionFlags::NO_OUTPUT));
    }

    #[test]
    fn keys_given_with_a_session_that_are_not_its_own_are_not_filed() {
        let mut table = SessionTable::with_capacity(16);
        let (key, reply, s) = nat(1, 40000, 2);
        let (wrong_key, wrong_reply, _) = nat(7, 40007, 3);
        let wrong_key = HashedKey::new(wrong_key);
        let wrong_reply = HashedKey::new(wrong_reply.unwrap());
        let id = table
            .insert_with_keys(&wrong_key, Some(&wrong_reply), s, 0, 100)
            .unwrap();
        assert_eq!(table.lookup(&key), Some((id, Direction::Inbound)));
        assert_eq!(
            table.lookup(&reply.unwrap()),
            Some((id, Direction::Outbound))
        );
        assert_eq!(table.lookup(wrong_key.key()), None);
        assert_eq!(table.lookup(wrong_reply.key()), None);
        assert_eq!(table.index_keys(), 2);
        // A reply key given for a session that has none (DR) is ignored too.
        let (dr_key, _, dr) = dr(2, 40002, 2);
        let id = table
            .insert_with_keys(&HashedKey::new(dr_key), Some(&wrong_reply), dr, 0, 100)
            .unwrap();
        assert_eq!(table.lookup(&dr_key), Some((id, Direction::Inbound)));
        assert_eq!(table.lookup(wrong_reply.key()), None);
        assert_eq!(table.index_keys(), 3);
        table.check_consistency().unwrap();
    }

    #[test]
    fn fullnat_reply_key_goes_to_the_local_address() {
        let key = client_key(1, 40000);
        let s = Session::new(&key, ForwardMode::FullNat, 1, 2, ip(0xc0a8_0002), 8080)
            .with_local(ip(0xc0a8_00fe), 5001);
        let reply = s.reply_key().unwrap();
        assert_eq!((reply.dst_addr(), reply.dport), (ip(0xc0a8_00fe), 5001));
        let mut table = SessionTable::with_capacity(4);
        let id = table.insert(s, 0, 10).unwrap();
        assert_eq!(table.lookup(&reply), Some((id, Direction::Outbound)));
    }

    #[test]
    fn dr_session_has_only_the_client_key() {
        let mut table = SessionTable::with_capacity(16);
        let (key, reply, s) = dr(1, 40000, 2);
        assert_eq!(reply, None);
        let id = table.insert(s, 0, 100).unwrap();
        assert_eq!(table.lookup(&key), Some((id, Direction::Inbound)));
        let session = table.get(id).unwrap();
        assert!(session.flags().contains(SessionFlags::NO_OUTPUT));
        let rs_to_client =
            FlowKey4::new(Protocol::Tcp, ip(0xc0a8_0002), 80, ip(0x0a00_0001), 40000);
        assert_eq!(table.lookup(&rs_to_client), None);
        assert_eq!(table.index_keys(), 1);
    }

    #[test]
    fn duplicate_keys_are_refused_without_change() {
        let mut table = SessionTable::with_capacity(16);
        let (key, reply, s) = nat(1, 40000, 2);
        let id = table.insert(s, 0, 100).unwrap();
        // Same client key, different reply key.
        let (_, other_reply, s2) = nat(1, 40000, 3);
        assert_eq!(
            table.insert(s2, 0, 100),
            Err(InsertError::KeyExists(Direction::Inbound))
        );
        assert_eq!(table.lookup(&other_reply.unwrap()), None);
        // Different client key, same reply key (same client and port on another VIP).
        let other_key = FlowKey4 {
            dst: key.dst + 1,
            ..key
        };
        let s3 = Session::new(&other_key, ForwardMode::Nat, 1, 2, ip(0xc0a8_0002), 8080);
        assert_eq!(s3.reply_key(), reply);
        assert_eq!(
            table.insert(s3, 0, 100),
            Err(InsertError::KeyExists(Direction::Outbound))
        );
        assert_eq!(table.lookup(&other_key), None);
        // A reply key equal to the client key: a client that is the VIP, on the
        // service port, sent to itself as the real server.
        let selfish = FlowKey4::new(Protocol::Tcp, ip(0xc612_0101), 80, ip(0xc612_0101), 80);
        let s4 = Session::new(&selfish, ForwardMode::Nat, 1, 2, ip(0xc612_0101), 80);
        assert_eq!(s4.reply_key(), Some(selfish));
        assert_eq!(
            table.insert(s4, 0, 100),
            Err(InsertError::KeyExists(Direction::Outbound))
        );
        assert_eq!(table.len(), 1);
        assert_eq!(table.index_keys(), 2);
        assert_eq!(table.lookup(&key), Some((id, Direction::Inbound)));
        assert_eq!(table.wheel.armed(), 1);
    }

    #[test]
    fn full_table_is_refused_cleanly() {
        let mut table = SessionTable::with_capacity(3);
        for port in 0..3 {
            let (_, _, s) = nat(1, port, 2);
            table.insert(s, 0, 100).unwrap();
        }
        let (key, reply, s) = nat(1, 99, 2);
        assert_eq!(table.insert(s, 0, 100), Err(InsertError::TableFull));
        assert_eq!(table.lookup(&key), None);
        assert_eq!(table.lookup(&reply.unwrap()), None);
        assert_eq!(
            (table.len(), table.index_keys(), table.wheel.armed()),
            (3, 6, 3)
        );
        // An existing key is still reported as such when full.
        let (_, _, s0) = nat(1, 0, 2);
        assert_eq!(
            table.insert(s0, 0, 100),
            Err(InsertError::KeyExists(Direction::Outbound))
        );
        // Zero capacity: always full.
        let mut empty = SessionTable::with_capacity(0);
        assert_eq!(empty.insert(s, 0, 1), Err(InsertError::TableFull));
    }

    #[test]
    fn remove_frees_keys_slot_and_timer() {
        let mut table = SessionTable::with_capacity(1);
        let (key, reply, s) = nat(1, 40000, 2);
        let id = table.insert(s, 0, 100).unwrap();
        let removed = table.remove(id).unwrap();
        assert_eq!(removed.in_key(), key);
        assert_eq!(table.remove(id), None);
        assert_eq!(table.get(id), None);
        assert!(!table.touch(id, 1, 10));
        assert_eq!(table.lookup(&key), None);
        assert_eq!(table.lookup(&reply.unwrap()), None);
        assert_eq!(
            (table.len(), table.index_keys(), table.wheel.armed()),
            (0, 0, 0)
        );
        // The single slot is reusable, with the same keys.
        let id2 = table.insert(s, 5, 100).unwrap();
        assert_eq!(id2, id);
        assert_eq!(table.get(id2).unwrap().created, 5);
        assert_eq!(expire_all(&mut table, 104), []);
        assert_eq!(expire_all(&mut table, 105), [id2]);
    }

    #[test]
    fn expiry_calls_back_once_per_session_and_frees_keys() {
        let mut table = SessionTable::with_wheel(64, 16, 0);
        let mut ids = Vec::new();
        for port in 0..40u16 {
            let (key, reply, s) = if port % 2 == 0 {
                nat(1, port, 2)
            } else {
                dr(1, port, 2)
            };
            ids.push((
                table.insert(s, 0, 10 + u32::from(port)).unwrap(),
                key,
                reply,
            ));
        }
        let mut seen = Vec::new();
        while !table
            .expire(29, 3, |id, session| {
                assert_eq!(session.real, 2);
                seen.push((id, session.in_key()));
            })
            .caught_up
        {}
        assert_eq!(seen.len(), 20);
        let unique: HashSet<SessionId> = seen.iter().map(|(id, _)| *id).collect();
        assert_eq!(unique.len(), 20);
        for (id, key, reply) in &ids[..20] {
            assert!(seen.contains(&(*id, *key)));
            assert_eq!(table.lookup(key), None);
            if let Some(reply) = reply {
                assert_eq!(table.lookup(reply), None);
            }
        }
        for (id, key, _) in &ids[20..] {
            assert_eq!(table.lookup(key), Some((*id, Direction::Inbound)));
        }
        assert_eq!(table.len(), 20);
        assert_eq!(expire_all(&mut table, 1000).len(), 20);
        assert!(table.is_empty());
        assert_eq!(table.index_keys(), 0);
    }

    #[test]
    fn one_expiry_call_past_its_key_queue_leaves_exactly_the_live_keys() {
        // More sessions expire in one call than wait in the key queue, among live
        // ones: every expired key must be gone and every live one found, before and
        // after the freed slots are taken again.
        let mut table = SessionTable::with_wheel(256, 64, 0);
        let count = 5 * EXPIRY_PIPELINE as u16 + 3;
        let mut sessions = Vec::new();
        for port in 0..count {
            let (key, reply, s) = if port % 3 == 0 {
                dr(1, port, 2)
            } else {
                nat(1, port, 2)
            };
            let deadline = if port % 4 == 0 { 500 } else { 10 };
            sessions.push((table.insert(s, 0, deadline).unwrap(), key, reply, deadline));
        }
        let advance = table.expire(20, usize::MAX, |_, _| {});
        assert!(advance.caught_up);
        assert!(advance.expired > EXPIRY_PIPELINE);
        table.check_consistency().unwrap();
        for (id, key, reply, deadline) in &sessions {
            let live = *deadline == 500;
            assert_eq!(table.lookup(key).is_some(), live, "{key:?}");
            if let Some(reply) = reply {
                assert_eq!(
                    table.lookup(reply),
                    live.then_some((*id, Direction::Outbound))
                );
            }
        }
        for port in 0..count {
            let (key, reply, s) = nat(9, port, 3);
            let id = table.insert(s, 20, 100).unwrap();
            assert_eq!(table.lookup(&key), Some((id, Direction::Inbound)));
            assert_eq!(
                table.lookup(&reply.unwrap()),
                Some((id, Direction::Outbound))
            );
        }
        table.check_consistency().unwrap();
    }

    #[test]
    fn touch_postpones_expiry() {
        let mut table = SessionTable::with_wheel(8, 16, 0);
        let (_, _, s) = nat(1, 40000, 2);
        let id = table.insert(s, 0, 10).unwrap();
        assert_eq!(expire_all(&mut table, 9), []);
        assert!(table.touch(id, 9, 100));
        assert_eq!(table.get(id).unwrap().deadline(), 109);
        assert_eq!(expire_all(&mut table, 108), []);
        assert_eq!(expire_all(&mut table, 109), [id]);
    }

    #[test]
    fn on_packet_moves_state_and_timeout() {
        let mut t = Timeouts::default();
        t.set_tcp_tcpfin_udp(900, 120, 300).unwrap();
        let ticks = t.in_ticks(1000); // one-second ticks keep the numbers readable
        let mut table = SessionTable::with_capacity(8);
        let (_, _, s) = dr(1, 40000, 2);
        let id = table.insert(s, 0, ticks.tcp(TcpState::None)).unwrap();
        let syn = table.on_packet(id, Direction::Inbound, TcpFlags::SYN, 0, &ticks);
        assert_eq!(syn.unwrap().to, TcpState::SynRecv);
        assert_eq!(table.get(id).unwrap().deadline(), 60);
        let ack = table
            .on_packet(id, Direction::Inbound, TcpFlags::ACK, 1, &ticks)
            .unwrap();
        assert_eq!(
            ack.activity_change(),
            Some(state::ActivityChange::BecameActive)
        );
        assert!(table.get(id).unwrap().is_active());
        assert_eq!(table.get(id).unwrap().deadline(), 901);
        // DR: a client FIN means FIN_WAIT (INPUT-ONLY table), and the shorter timeout
        // takes effect at once.
        let fin = table
            .on_packet(
                id,
                Direction::Inbound,
                TcpFlags::FIN | TcpFlags::ACK,
                2,
                &ticks,
            )
            .unwrap();
        assert_eq!(fin.to, TcpState::FinWait);
        assert_eq!(
            fin.activity_change(),
            Some(state::ActivityChange::BecameInactive)
        );
        assert_eq!(table.get(id).unwrap().state_name(), "FIN_WAIT");
        // TCP keeps its timestamp offset where UDP counts packets.
        assert_eq!(table.get(id).unwrap().udp_packets(), 0);
        assert_eq!(table.get(id).unwrap().timestamp_offset(), 0);
        assert_eq!(expire_all(&mut table, 121), []);
        assert_eq!(expire_all(&mut table, 122), [id]);
    }

    #[test]
    fn udp_counts_packets_where_tcp_keeps_its_timestamp_offset() {
        let mut table = SessionTable::with_capacity(8);
        let ticks = Timeouts::default().in_ticks(1000);
        let tcp_key = FlowKey4::new(
            Protocol::Tcp,
            Ipv4Addr::new(198, 51, 100, 1),
            40000,
            Ipv4Addr::new(203, 0, 113, 1),
            80,
        );
        let udp_key = FlowKey4 {
            proto: Protocol::Udp,
            ..tcp_key
        };
        let mut ids = Vec::new();
        for key in [tcp_key, udp_key] {
            let s = Session::new(
                &key,
                ForwardMode::FullNat,
                0,
                0,
                Ipv4Addr::new(10, 0, 0, 1),
                80,
            )
            .with_local(Ipv4Addr::new(10, 0, 0, 100), 2000)
            .with_timestamp_offset(0xdead_beef);
            ids.push(table.insert(s, 0, 10).unwrap());
        }
        for _ in 0..3 {
            for &id in &ids {
                table.on_packet(id, Direction::Inbound, TcpFlags::SYN, 0, &ticks);
            }
        }
        let (tcp, udp) = (table.get(ids[0]).unwrap(), table.get(ids[1]).unwrap());
        assert_eq!(
            (tcp.timestamp_offset(), tcp.udp_packets()),
            (0xdead_beef, 0)
        );
        assert_eq!((udp.timestamp_offset(), udp.udp_packets()), (0, 3));
    }

    #[test]
    fn reply_clears_no_output() {
        let mut s = dr(1, 40000, 2).2;
        s.on_tcp_segment(Direction::Inbound, TcpFlags::SYN);
        s.on_tcp_segment(Direction::Inbound, TcpFlags::ACK);
        // INPUT-ONLY: client FIN -> FIN_WAIT.
        let mut input_only = s;
        assert_eq!(
            input_only
                .on_tcp_segment(Direction::Inbound, TcpFlags::FIN)
                .to,
            TcpState::FinWait
        );
        // Once the server was seen, the INPUT table applies: client FIN -> CLOSE_WAIT.
        s.on_tcp_segment(Direction::Outbound, TcpFlags::ACK);
        assert!(!s.flags().contains(SessionFlags::NO_OUTPUT));
        assert_eq!(
            s.on_tcp_segment(Direction::Inbound, TcpFlags::FIN).to,
            TcpState::CloseWait
        );
    }

    #[test]
    fn udp_sessions_show_as_udp_and_are_inactive() {
        let key = FlowKey4::new(Protocol::Udp, ip(1), 5000, ip(2), 53);
        let s = Session::new(&key, ForwardMode::Nat, 1, 1, ip(3), 53);
        let ticks = Timeouts::default().in_ticks(1000);
        let mut table = SessionTable::with_capacity(2);
        let id = table.insert(s, 0, ticks.udp()).unwrap();
        let t = table
            .on_packet(id, Direction::Outbound, TcpFlags::empty(), 10, &ticks)
            .unwrap();
        assert!(!t.changed());
        let s = table.get(id).unwrap();
        assert_eq!(
            (s.state_name(), s.is_active(), s.deadline()),
            ("UDP", false, 310)
        );
    }

    #[test]
    fn iter_lists_live_sessions() {
        let mut table = SessionTable::with_capacity(8);
        let mut ids = Vec::new();
        for port in 0..5 {
            let (_, _, s) = nat(1, port, 2);
            ids.push(table.insert(s, 0, 10).unwrap());
        }
        table.remove(ids[1]);
        table.remove(ids[3]);
        let listed: Vec<SessionId> = table.iter().map(|(id, _)| id).collect();
        assert_eq!(listed, [ids[0], ids[2], ids[4]]);
    }

    #[test]
    fn the_oldest_half_open_session_goes_first_established_ones_never() {
        let mut table = SessionTable::with_capacity(8);
        let mut ids = Vec::new();
        let syn = TcpFlags::SYN;
        let t = Timeouts::default().in_ticks(10);
        for (tick, port) in (1..=6).zip(0u16..) {
            let (_, _, s) = nat(1, port, 2);
            let id = table.insert(s, tick, 1000).unwrap();
            table.on_packet(id, Direction::Inbound, syn, tick, &t);
            ids.push(id);
        }
        // The first becomes established: the client's ACK after the server's SYN-ACK.
        table.on_packet(ids[0], Direction::Outbound, syn | TcpFlags::ACK, 7, &t);
        table.on_packet(ids[0], Direction::Inbound, TcpFlags::ACK, 7, &t);
        assert!(!table.get(ids[0]).unwrap().is_half_open());
        // The second ends; its slot goes to a new half-open session (made later).
        table.remove(ids[1]).unwrap();
        let (_, _, s) = nat(1, 100, 2);
        let reused = table.insert(s, 8, 1000).unwrap();
        table.on_packet(reused, Direction::Inbound, syn, 8, &t);
        assert_eq!(reused, ids[1], "the free list hands the slot back");
        // UDP sessions are never candidates.
        let udp_key = FlowKey4::new(Protocol::Udp, ip(5), 53, ip(0xc612_0101), 53);
        let udp = Session::new(&udp_key, ForwardMode::Nat, 1, 2, ip(0xc0a8_0002), 53);
        table.insert(udp, 9, 1000).unwrap();

        // Oldest first: ids[2] (the established one and the ended one are skipped), ...
        let order: Vec<SessionId> = std::iter::from_fn(|| table.oldest_reclaimable(64)).collect();
        assert_eq!(order, [ids[2], ids[3], ids[4], ids[5], reused]);
        // ... each found once: the caller removes it.
        assert_eq!(table.oldest_reclaimable(64), None);
        // The scan is bounded: with more stale entries than it may look at, none found.
        let mut table = SessionTable::with_capacity(8);
        for port in 0..4 {
            let (_, _, s) = nat(1, port, 2);
            let id = table.insert(s, 1, 1000).unwrap();
            table.remove(id).unwrap();
        }
        let (_, _, s) = nat(1, 50, 2);
        let last = table.insert(s, 2, 1000).unwrap();
        assert_eq!(table.oldest_reclaimable(4), None, "4 stale entries");
        assert_eq!(table.oldest_reclaimable(4), Some(last));
    }

    /// A session moved to TIME_WAIT or CLOSE by its client's segments alone (a SYN,
    /// then a FIN or a RST: what spoofed senders can do without the server's answer)
    /// can be reclaimed as a half-open one can; ESTABLISHED, FIN_WAIT and CLOSE_WAIT
    /// ones cannot.
    #[test]
    fn finished_sessions_are_reclaimable_as_half_open_ones_are() {
        let mut table = SessionTable::with_capacity(16);
        let t = Timeouts::default().in_ticks(10);
        let (syn, ack, fin, rst) = (TcpFlags::SYN, TcpFlags::ACK, TcpFlags::FIN, TcpFlags::RST);
        let mut ids = Vec::new();
        // (client segments after the SYN, server's answer first?)
        let cases: [(&[TcpFlags], bool, TcpState); 5] = [
            (&[fin], false, TcpState::TimeWait),
            (&[ack, rst], true, TcpState::Close),
            (&[ack], true, TcpState::Established),
            (&[ack, fin], true, TcpState::CloseWait),
            (&[], false, TcpState::SynRecv),
        ];
        for (port, (after, answered, state)) in (0u16..).zip(cases) {
            let (_, _, s) = nat(1, port, 2);
            let id = table.insert(s, 1, 1000).unwrap();
            table.on_packet(id, Direction::Inbound, syn, 1, &t);
            if answered {
                table.on_packet(id, Direction::Outbound, syn | ack, 1, &t);
            }
            for &flags in after {
                table.on_packet(id, Direction::Inbound, flags, 1, &t);
            }
            assert_eq!(table.get(id).unwrap().state(), state);
            ids.push(id);
        }
        let order: Vec<SessionId> = std::iter::from_fn(|| table.oldest_reclaimable(64)).collect();
        assert_eq!(order, [ids[0], ids[1], ids[4]]);
    }

    #[test]
    fn memory_per_session_measured_from_the_mapped_pages() {
        // The budget: 96 bytes a session, read from what the kernel has mapped for the
        // slab and the index, at one million sessions and filled with NAT sessions
        // (two index keys each, the most a session has).
        const BUDGET: f64 = 96.0;
        let mut table = SessionTable::with_capacity(1_000_000);
        for n in 0..1_000_000u32 {
            let key = client_key(n >> 14, (n & 0x3fff) as u16);
            let s = Session::new(
                &key,
                ForwardMode::Nat,
                1,
                n % 7,
                ip(0xc0a8_0000 + n % 7),
                8080,
            );
            table.insert(s, 0, 100).unwrap();
        }
        let resident = table.resident_bytes().unwrap();
        let per_session = resident as f64 / table.capacity() as f64;
        println!(
            "capacity {}: {resident} bytes resident, {per_session:.1} bytes per session",
            table.capacity()
        );
        assert!(per_session <= BUDGET, "{per_session} bytes per session");
        // The measurement sees the whole table: it cannot be below the entries.
        assert!(per_session >= 64.0, "{per_session}");
        assert_eq!(table.index_keys(), 2_000_000);
    }

    #[test]
    fn bytes_for_is_what_the_table_allocates() {
        for capacity in [1024, 1500, 100_000, 1 << 20] {
            let table = SessionTable::with_capacity(capacity);
            assert_eq!(
                SessionTable::bytes_for(capacity, DEFAULT_WHEEL_SLOTS),
                table.memory_bytes(),
                "capacity {capacity}"
            );
        }
    }

    #[test]
    fn an_allocation_the_kernel_refuses_is_an_error() {
        // 64 bytes x 2^31 sessions of slab alone: 128 GiB, more than any test machine
        // has, so the kernel's overcommit check refuses the mapping. With overcommit
        // unlimited (mode 1) it would be granted and then faulted in: not tried there.
        let mode = std::fs::read_to_string("/proc/sys/vm/overcommit_memory").unwrap();
        if mode.trim() == "1" {
            eprintln!("vm.overcommit_memory = 1: a refused mapping cannot be provoked");
            return;
        }
        let capacity = MAX_CAPACITY;
        let e = SessionTable::try_with_wheel(capacity, DEFAULT_WHEEL_SLOTS, 0)
            .err()
            .expect("a 128 GiB slab was granted");
        assert_eq!(e.capacity, capacity);
        assert!(e.bytes > 128 << 30, "{e:?}");
        assert!(e.to_string().contains("refused"), "{e}");
    }

    /// Small xorshift64* generator: deterministic, no dependency.
    struct XorShift(u64);

    impl XorShift {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn below(&mut self, n: u64) -> u64 {
            self.next() % n
        }
    }

    struct Model {
        in_key: FlowKey4,
        reply: Option<FlowKey4>,
        deadline: u32,
    }

    #[test]
    fn randomized_against_a_model() {
        const CAPACITY: usize = 200;
        let mut rng = XorShift(0x9e37_79b9_7f4a_7c15);
        let mut table = SessionTable::with_wheel(CAPACITY, 16, 0);
        let memory = table.memory_bytes();
        let mut model: StdHashMap<SessionId, Model> = StdHashMap::new();
        let mut keys: StdHashMap<FlowKey4, (SessionId, Direction)> = StdHashMap::new();
        let mut live: Vec<SessionId> = Vec::new();
        let mut now: u32 = 0;
        let mut counts = [0usize; 6];

        for _ in 0..100_000 {
            match rng.below(100) {
                0..=39 => {
                    // Insert: small key spaces so that collisions happen.
                    let client = rng.below(16) as u32;
                    let port = rng.below(16) as u16;
                    let rs = rng.below(4) as u32;
                    let mut key = client_key(client, port);
                    key.dst += rng.below(2) as u32;
                    let mode = [ForwardMode::Nat, ForwardMode::Dr][rng.below(2) as usize];
                    let s = Session::new(&key, mode, 7, rs, ip(0xc0a8_0000 + rs), 8080);
                    let reply = s.reply_key();
                    let timeout = rng.below(100) as u32;
                    let want = if reply.is_some_and(|r| keys.contains_key(&r)) {
                        Err(InsertError::KeyExists(Direction::Outbound))
                    } else if keys.contains_key(&key) {
                        Err(InsertError::KeyExists(Direction::Inbound))
                    } else if model.len() == CAPACITY {
                        Err(InsertError::TableFull)
                    } else {
                        Ok(())
                    };
                    let got = table.insert(s, now, timeout);
                    assert_eq!(got.map(|_| ()), want);
                    if let Ok(id) = got {
                        assert!(!model.contains_key(&id));
                        keys.insert(key, (id, Direction::Inbound));
                        if let Some(r) = reply {
                            keys.insert(r, (id, Direction::Outbound));
                        }
                        model.insert(
                            id,
                            Model {
                                in_key: key,
                                reply,
                                deadline: now + timeout,
                            },
                        );
                        live.push(id);
                        counts[0] += 1;
                    }
                }
                40..=59 => {
                    // Lookup of a random key, live or not, either direction.
                    let mut key = client_key(rng.below(16) as u32, rng.below(16) as u16);
                    if rng.below(2) == 0 {
                        key = FlowKey4 {
                            src: 0xc0a8_0000 + rng.below(4) as u32,
                            sport: 8080,
                            ..key.reversed()
                        };
                    }
                    assert_eq!(table.lookup(&key), keys.get(&key).copied());
                    counts[1] += 1;
                }
                60..=69 if !live.is_empty() => {
                    let id = live.swap_remove(rng.below(live.len() as u64) as usize);
                    let m = model.remove(&id).unwrap();
                    keys.remove(&m.in_key);
                    if let Some(r) = m.reply {
                        keys.remove(&r);
                    }
                    assert_eq!(table.remove(id).unwrap().in_key(), m.in_key);
                    counts[2] += 1;
                }
                70..=84 if !live.is_empty() => {
                    let id = live[rng.below(live.len() as u64) as usize];
                    let timeout = rng.below(200) as u32;
                    assert!(table.touch(id, now, timeout));
                    model.get_mut(&id).unwrap().deadline = now + timeout;
                    counts[3] += 1;
                }
                _ => {
                    // Time passes; expire, sometimes with a tiny budget.
                    now += rng.below(20) as u32;
                    let budget = if rng.below(4) == 0 {
                        1 + rng.below(3) as usize
                    } else {
                        usize::MAX
                    };
                    let mut expired = Vec::new();
                    let step = table.expire(now, budget, |id, s| {
                        assert_eq!(s.in_key(), model[&id].in_key);
                        expired.push(id);
                    });
                    assert!(step.examined <= budget);
                    for id in &expired {
                        let m = model.remove(id).unwrap();
                        assert!(m.deadline <= now, "expired early");
                        keys.remove(&m.in_key);
                        if let Some(r) = m.reply {
                            keys.remove(&r);
                        }
                        live.retain(|l| l != id);
                    }
                    if step.caught_up {
                        // Nothing due may remain.
                        assert!(model.values().all(|m| m.deadline > now), "expired late");
                        counts[4] += 1;
                    }
                    counts[5] += expired.len();
                }
            }
            assert_eq!(table.len(), model.len());
        }
        // Every kind of operation happened, many times.
        assert!(counts.iter().all(|&c| c > 1000), "{counts:?}");
        for (id, m) in &model {
            assert_eq!(table.get(*id).unwrap().in_key(), m.in_key);
        }
        assert_eq!(table.index_keys(), keys.len());
        assert_eq!(table.iter().count(), model.len());
        table.check_consistency().unwrap();
        // Nothing was reallocated.
        assert_eq!(table.memory_bytes(), memory);
    }

    #[test]
    fn consistency_check_passes_on_a_used_table_and_names_each_kind_of_damage() {
        let timeouts = Timeouts::default().in_ticks(100);
        let mut table = SessionTable::with_capacity(8);
        table.check_consistency().unwrap();
        let mut ids = Vec::new();
        for c in 0..5 {
            let (_, _, s) = nat(c, 1000 + c as u16, 1);
            ids.push(table.insert(s, 0, 10).unwrap());
        }
        table.remove(ids[1]).unwrap();
        table.on_packet(ids[2], Direction::Inbound, TcpFlags::SYN, 1, &timeouts);
        table.expire(20, 64, |_, _| {});
        table.check_consistency().unwrap();
        let (_, reply, s) = nat(9, 9, 1);
        let id = table.insert(s, 20, 10).unwrap();
        table.check_consistency().unwrap();

        table.len += 1;
        assert!(table.check_consistency().unwrap_err().contains("len"));
        table.len -= 1;
        let reply = HashedKey::new(reply.unwrap());
        let value = index_value(id.0, Direction::Outbound);
        assert!(table.index.remove(reply.hash, value));
        assert!(table.check_consistency().unwrap_err().contains("Outbound"));
        assert!(table.index.insert(reply.hash, value));
        table.check_consistency().unwrap();
        // A stray key in the index: a value naming a vacant slot.
        assert!(table
            .index
            .insert(reply.hash, index_value(7, Direction::Inbound)));
        assert!(table
            .check_consistency()
            .unwrap_err()
            .contains("index holds"));
        assert!(table
            .index
            .remove(reply.hash, index_value(7, Direction::Inbound)));
        table.check_consistency().unwrap();
        let head = table.free_head;
        table.slab[head as usize].timer.next = head;
        assert!(table.check_consistency().unwrap_err().contains("free list"));
    }

    /// A client's RST or FIN far from the client's sequence as last seen moves
    /// nothing; near it, it ends the connection as IPVS does, in every mode (FullNAT
    /// keeping its timestamp offset beside it). The window's edges are exact: the
    /// sequence is kept to its 128 KiB grain, and the window reaches
    /// [`CLIENT_SEQ_WINDOW`] beyond either end of the grain. Out-of-window segments
    /// of any other kind do not move that sequence, so a blind sender cannot first
    /// move the window to where its RST will be; retransmissions do not move it back.
    #[test]
    fn a_client_rst_or_fin_far_from_the_clients_sequence_moves_nothing() {
        let ticks = Timeouts::default().in_ticks(1000);
        let seg = |seq: u32, len: u32| ClientSegment {
            seq,
            next: seq.wrapping_add(len),
        };
        let (syn, ack, rst, fin) = (
            TcpFlags::SYN,
            TcpFlags::ACK,
            TcpFlags::RST | TcpFlags::ACK,
            TcpFlags::FIN | TcpFlags::ACK,
        );
        // The ISN near the top of the sequence space (the window wraps), and one in
        // the middle of a grain.
        for (mode, isn) in [
            (ForwardMode::Nat, u32::MAX - 100),
            (ForwardMode::Dr, u32::MAX - 100),
            (ForwardMode::FullNat, u32::MAX - 100),
            (ForwardMode::Nat, 0x1234_5678),
            (ForwardMode::FullNat, 0x8765_4321),
        ] {
            let mut table = SessionTable::with_capacity(8);
            let s = Session::new(&client_key(1, 40000), mode, 1, 3, ip(0xc0a8_0003), 80)
                .with_local(Ipv4Addr::new(10, 0, 0, 100), 2000)
                .with_timestamp_offset(77);
            // The SYN that opens the session starts the client's sequence (as
            // `prepare_open`).
            let s = s.with_client_next_seq(isn.wrapping_add(1));
            let id = table.insert(s, 0, ticks.tcp(TcpState::None)).unwrap();
            let on = |t: &mut SessionTable, flags, sg, now| {
                t.on_client_segment(id, flags, sg, now, &ticks).unwrap()
            };
            on(&mut table, syn, seg(isn, 1), 0).unwrap();
            if mode != ForwardMode::Dr {
                table.on_packet(id, Direction::Outbound, syn | ack, 0, &ticks);
            }
            on(&mut table, ack, seg(isn.wrapping_add(1), 0), 1).unwrap();
            on(&mut table, ack, seg(isn.wrapping_add(1), 1000), 2).unwrap();
            let next = isn.wrapping_add(1001);
            let floor = next & !(SEQ_MARK_GRAIN - 1);
            assert_eq!(
                table.get(id).unwrap().client_next_seq(),
                Some(floor),
                "{mode:?}"
            );
            // A retransmission leaves it.
            on(&mut table, ack, seg(isn.wrapping_add(1), 1000), 3).unwrap();
            assert_eq!(table.get(id).unwrap().client_next_seq(), Some(floor));
            let deadline = table.get(id).unwrap().deadline();
            let far = floor.wrapping_add(SEQ_MARK_GRAIN + CLIENT_SEQ_WINDOW);
            for (flags, at) in [
                (rst, far),
                (fin, far),
                (TcpFlags::RST, floor.wrapping_sub(CLIENT_SEQ_WINDOW + 1)),
            ] {
                assert_eq!(
                    on(&mut table, flags, seg(at, 0), 4),
                    Err(OutOfWindow),
                    "{mode:?} {flags:?}"
                );
                let s = table.get(id).unwrap();
                assert_eq!((s.state(), s.deadline()), (TcpState::Established, deadline));
            }
            // A forged ACK far away does not take the window with it.
            on(&mut table, ack, seg(far, 500), 5).unwrap();
            assert_eq!(table.get(id).unwrap().client_next_seq(), Some(floor));
            assert_eq!(
                on(&mut table, rst, seg(far.wrapping_add(500), 0), 6),
                Err(OutOfWindow)
            );
            // The window's edges: in at either, out one beyond.
            let s = *table.get(id).unwrap();
            let low = floor.wrapping_sub(CLIENT_SEQ_WINDOW);
            for (at, within) in [
                (low, true),
                (low.wrapping_sub(1), false),
                (far.wrapping_sub(1), true),
                (far, false),
            ] {
                assert_eq!(s.in_client_window(&seg(at, 0)), within, "{mode:?} {at:#x}");
            }
            let offset = if mode == ForwardMode::FullNat { 77 } else { 0 };
            assert_eq!(s.timestamp_offset(), offset, "{mode:?}");
            // The client's own RST, at the far edge, ends it.
            let t = on(&mut table, rst, seg(far.wrapping_sub(1), 0), 7).unwrap();
            assert_eq!(t.to, TcpState::Close, "{mode:?}");
        }
    }

    /// A session whose client's sequence is not known (installed by sync) takes its
    /// client's RST as IPVS does, and no client segment starts the sequence for it: a blind
    /// sender's ACK cannot set it where its later RST will be and leave the client's
    /// own segments outside.
    #[test]
    fn an_unknown_client_sequence_is_not_started_by_any_client_segment() {
        let ticks = Timeouts::default().in_ticks(1000);
        let mut table = SessionTable::with_capacity(8);
        let (_, _, s) = nat(1, 40000, 3);
        let id = table
            .insert(s.with_state(TcpState::Established), 0, 900)
            .unwrap();
        let seg = |seq: u32| ClientSegment {
            seq,
            next: seq + 10,
        };
        let on = |t: &mut SessionTable, flags, seq| {
            t.on_client_segment(id, flags, seg(seq), 0, &ticks).unwrap()
        };
        on(&mut table, TcpFlags::ACK, 7_000_000).unwrap();
        assert_eq!(table.get(id).unwrap().client_next_seq(), None);
        on(&mut table, TcpFlags::ACK, 1_000).unwrap();
        assert_eq!(table.get(id).unwrap().client_next_seq(), None);
        let t = on(&mut table, TcpFlags::RST, 7_000_010).unwrap();
        assert_eq!(t.to, TcpState::Close);
    }

    /// A real server's acknowledgment starts the client's sequence of a session that
    /// does not know it (installed by sync, FullNAT here): from then on a blind RST
    /// far from it moves nothing, and one at the acknowledged byte still ends it. A
    /// later acknowledgment moves it forward (the client had over 1 MiB in flight when
    /// the first one passed), an earlier one never back. A SYN-ACK restarts it (the
    /// server took a client's new SYN, from a new ISN). A server RST gives none
    /// (`SegmentSeq` carries no acknowledgment for it).
    #[test]
    fn a_server_acknowledgment_starts_an_unknown_client_sequence() {
        let ticks = Timeouts::default().in_ticks(1000);
        let mut table = SessionTable::with_capacity(8);
        let s = Session::new(&client_key(1, 40000), ForwardMode::FullNat, 1, 3, ip(3), 80)
            .with_local(Ipv4Addr::new(10, 0, 0, 100), 2000)
            .with_state(TcpState::Established);
        let id = table.insert(s, 0, 900).unwrap();
        let seg = |seq: u32| ClientSegment { seq, next: seq };
        let (ack, rst) = (TcpFlags::ACK, TcpFlags::RST | TcpFlags::ACK);
        let acked = 0x4000_0000;
        table.on_server_segment(id, ack, acked, 1, &ticks).unwrap();
        let floor = acked & !(SEQ_MARK_GRAIN - 1);
        assert_eq!(table.get(id).unwrap().client_next_seq(), Some(floor));
        // Behind the client by 4 MiB: its FIN there is out of the window, until the
        // server acknowledges up to it; an earlier acknowledgment then moves nothing.
        let acked = acked + (4 << 20);
        let on = |t: &mut SessionTable, flags, seq| {
            t.on_client_segment(id, flags, seg(seq), 3, &ticks).unwrap()
        };
        let fin = TcpFlags::FIN | TcpFlags::ACK;
        assert_eq!(on(&mut table, fin, acked), Err(OutOfWindow));
        table.on_server_segment(id, ack, acked, 2, &ticks).unwrap();
        table
            .on_server_segment(id, ack, acked - (2 << 20), 2, &ticks)
            .unwrap();
        let floor = acked & !(SEQ_MARK_GRAIN - 1);
        assert_eq!(table.get(id).unwrap().client_next_seq(), Some(floor));
        let far = acked.wrapping_add(1 << 31);
        assert_eq!(on(&mut table, rst, far), Err(OutOfWindow));
        assert_eq!(table.get(id).unwrap().state(), TcpState::Established);
        // A SYN-ACK for a new ISN restarts it: the old connection's byte is now far.
        let new_isn = acked.wrapping_add(1 << 31);
        table
            .on_server_segment(id, TcpFlags::SYN | ack, new_isn + 1, 4, &ticks)
            .unwrap();
        assert_eq!(
            table.get(id).unwrap().client_next_seq(),
            Some((new_isn + 1) & !(SEQ_MARK_GRAIN - 1))
        );
        assert_eq!(on(&mut table, rst, acked), Err(OutOfWindow));
        assert_eq!(
            on(&mut table, rst, new_isn + 1).unwrap().to,
            TcpState::Close
        );
        // UDP keeps no sequence.
        let udp_key = FlowKey4::new(Protocol::Udp, ip(1), 5000, ip(0x0a00_0001), 53);
        let udp = Session::new(&udp_key, ForwardMode::Nat, 1, 3, ip(3), 53);
        let id = table.insert(udp, 0, 900).unwrap();
        table.on_server_segment(id, ack, acked, 5, &ticks).unwrap();
        assert_eq!(table.get(id).unwrap().client_next_seq(), None);
    }

    /// Only FullNAT rewrites timestamps: an offset given to another mode's session is
    /// not kept.
    #[test]
    fn only_fullnat_keeps_a_timestamp_offset() {
        let (_, _, nat) = nat(2, 40001, 3);
        assert_eq!(nat.with_timestamp_offset(77).timestamp_offset(), 0);
    }

    /// On a FullNAT session (its client sequence known or not), and where the client's
    /// sequence is not known, a FIN moves an established session as IPVS does, but a
    /// SYN after it does not take it back to SYN_RECV, nor a server SYN to SYN_SENT: a
    /// live connection never looks like a handshake that never completed. A fresh
    /// session still goes to SYN_RECV on its SYN; and a session of another mode whose
    /// client sequence is known keeps IPVS's table.
    #[test]
    fn a_syn_takes_no_unsequenced_session_back_to_the_handshake() {
        let key = client_key(1, 40000);
        let fullnat = Session::new(&key, ForwardMode::FullNat, 1, 3, ip(0xc0a8_0003), 80)
            .with_local(Ipv4Addr::new(10, 0, 0, 100), 2000);
        let mut s = fullnat;
        assert_eq!(
            s.on_tcp_segment(Direction::Inbound, TcpFlags::SYN).to,
            TcpState::SynRecv
        );
        let (_, _, unknown) = nat(3, 40002, 3);
        let sequenced = fullnat.with_client_next_seq(1000);
        assert!(sequenced.client_next_seq().is_some());
        for session in [fullnat, sequenced, unknown] {
            for from in [
                TcpState::Established,
                TcpState::FinWait,
                TcpState::CloseWait,
                TcpState::LastAck,
            ] {
                for dir in [Direction::Inbound, Direction::Outbound] {
                    let mut s = session.with_state(from);
                    let to = s.on_tcp_segment(dir, TcpFlags::SYN).to;
                    assert_eq!(to, from, "{:?} {dir:?}", session.mode);
                }
            }
        }
        let mut s = fullnat.with_state(TcpState::Established);
        let fin = TcpFlags::FIN | TcpFlags::ACK;
        assert_eq!(
            s.on_tcp_segment(Direction::Inbound, fin).to,
            TcpState::CloseWait
        );
        assert_eq!(
            s.on_tcp_segment(Direction::Inbound, TcpFlags::SYN).to,
            TcpState::CloseWait
        );
        assert!(!s.is_half_open());
        let (_, _, nat) = nat(2, 40001, 3);
        let mut known = nat
            .with_client_next_seq(1000)
            .with_state(TcpState::CloseWait);
        assert_eq!(
            known.on_tcp_segment(Direction::Inbound, TcpFlags::SYN).to,
            TcpState::SynRecv
        );
    }
}
