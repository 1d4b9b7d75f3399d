//! One worker's IPv6 sessions, beside (not inside) the IPv4 [`SessionTable`]: an
//! IPv4 entry stays one 64-byte line, and an IPv6 entry, whose three addresses alone
//! take 48 bytes, does not share its layout.
//!
//! Shape and cost. A slab of [`Session6`] entries (116 bytes each, the FullNAT
//! local address and port, the client's sequence and the sync bookkeeping included)
//! and the IPv4 table's [`SessionIndex`] over the slab: each key (client key and, for
//! NAT and FullNAT, reply key) a 16-bit tag and the slot's index in a 64-byte bucket,
//! the key itself checked against the entry, which holds both tuples. 140 bytes per
//! session (the 116-byte slot, 4 of creation order, two index slots of 8 bytes at
//! 80% load), allocated once at construction for the table's capacity;
//! nothing allocates afterwards (the index never holds more than `2 x capacity`
//! keys, the most it was built for). A key is hashed once per packet
//! ([`HashedKey6`]): the burst's prefetch pass starts loading its bucket and the
//! entry the bucket names, and the lookup uses the same hash.
//! Expiry is lazy: a lookup treats a session past its deadline as gone, and
//! [`SessionTable6::sweep`] removes expired entries a bounded number of slots at a
//! time (the management of an IPv4 table's timer wheel is not repeated here: IPv6
//! tables are an order of magnitude smaller by default). TCP sessions are also
//! kept in the order they were made (4 bytes per slot, [`super::reclaim`]), so a
//! table under a SYN flood gives up its oldest half-open sessions first
//! ([`SessionTable6::oldest_reclaimable`]), as an IPv4 table does.
//!
//! [`SessionTable`]: super::SessionTable
use super::hugemem::HugePageAlloc;
use super::index::{KeyHash, SessionIndex};
use super::reclaim::CreationOrder;
use super::state::{self, Direction, TcpState, Transition};
use super::table::{
    index_value as value, process_hasher, split_value as split, ClientSegment, OutOfWindow,
    TableAllocError,
};
use super::timeouts::TickTimeouts;
use super::InsertError;
use crate::flow::FlowKey6;
use crate::model::{ForwardMode, Protocol};
use crate::wire::tcp::TcpFlags;
use allocator_api2::vec::Vec as HugeVec;
use std::net::Ipv6Addr;

/// An IPv6 session: a client's connection to an IPv6 VIP, forwarded to an IPv6 real
/// server in DR, NAT, TUN or FullNAT mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Session6 {
    pub client: Ipv6Addr,
    pub vip: Ipv6Addr,
    pub real_addr: Ipv6Addr,
    pub client_port: u16,
    pub vport: u16,
    pub real_port: u16,
    /// FullNAT: the local address and port the connection leaves from towards the
    /// real server (unspecified and 0 in the other modes).
    pub local_addr: Ipv6Addr,
    pub local_port: u16,
    /// NAT and FullNAT: the MAC the client's packets last came from (the way back); DR: the real
    /// server's, once known (all zero before).
    pub peer_mac: [u8; 6],
    pub proto: Protocol,
    pub mode: ForwardMode,
    /// The virtual service and real server, as numbered by the service snapshot.
    pub service: u32,
    pub real: u32,
    state: TcpState,
    /// DR: no packet from the real server seen (its replies bypass Sluice), so the
    /// client's segments move the state by the input-only table, as for IPv4.
    input_only: bool,
    /// A persistence template placed it: its end extends the template (as IPv4's
    /// `SessionFlags::PERSISTENT`).
    pub persistent: bool,
    /// Tick at which the table took the session in.
    pub created: u32,
    /// Tick from which the session's persistence template is due for renewal (the
    /// table's sweep shows the caller live sessions far more often than that; the
    /// caller renews and sets the next one). The tick of insertion at first.
    pub template_due: u32,
    deadline: u32,
    /// Packets seen (a UDP flow is synced from the sync threshold on).
    packets: u32,
    /// Tick of the session's last sync to the standby, if `synced` (a tick and a flag
    /// rather than an `Option<u32>`: three bytes less, which keep the entry at 116).
    synced_at: u32,
    /// TCP: the client's next sequence number as last seen, 0 not known
    /// ([`SessionTable6::on_client_segment`]).
    client_next: u32,
    synced: bool,
}

impl Session6 {
    /// A new session for the client key `in_key` (client -> VIP:port), forwarded to
    /// `real_addr:real_port` in `mode`.
    pub fn new(
        in_key: &FlowKey6,
        mode: ForwardMode,
        service: u32,
        real: u32,
        real_addr: Ipv6Addr,
        real_port: u16,
    ) -> Session6 {
        Session6 {
            client: in_key.src,
            vip: in_key.dst,
            real_addr,
            client_port: in_key.sport,
            vport: in_key.dport,
            real_port,
            local_addr: Ipv6Addr::UNSPECIFIED,
            local_port: 0,
            peer_mac: [0; 6],
            proto: in_key.proto,
            mode,
            service,
            real,
            state: TcpState::None,
            input_only: matches!(mode, ForwardMode::Dr | ForwardMode::Tun),
            persistent: false,
            created: 0,
            template_due: 0,
            deadline: 0,
            packets: 0,
            synced_at: 0,
            client_next: 0,
            synced: false,
        }
    }

    /// The same session in `state`, as a peer's sync record has it: `no_output` says
    /// the real server was not heard yet (DR: the client's segments move the state by
    /// the input-only table).
    pub fn synced(mut self, state: TcpState, no_output: bool) -> Session6 {
        self.state = state;
        self.input_only = no_output;
        self
    }

    /// DR: no packet from the real server seen yet.
    pub fn no_output(&self) -> bool {
        self.input_only
    }

    /// Packets seen on the session.
    pub fn packets(&self) -> u32 {
        self.packets
    }

    /// Ticks since the session's last sync at `now_tick`; `None` if never synced.
    pub fn ticks_since_sync(&self, now_tick: u32) -> Option<u32> {
        self.synced.then(|| now_tick.wrapping_sub(self.synced_at))
    }

    /// Records a sync at `now_tick`.
    pub fn mark_synced(&mut self, now_tick: u32) {
        (self.synced_at, self.synced) = (now_tick, true);
    }

    /// The client-side key: client -> VIP:port.
    pub fn in_key(&self) -> FlowKey6 {
        FlowKey6 {
            src: self.client,
            dst: self.vip,
            sport: self.client_port,
            dport: self.vport,
            proto: self.proto,
        }
    }

    /// The key of the real server's replies, for the modes whose replies come back
    /// through Sluice: real server -> client (NAT), real server -> local address and
    /// port (FullNAT).
    pub fn reply_key(&self) -> Option<FlowKey6> {
        let (dst, dport) = match self.mode {
            ForwardMode::Nat => (self.client, self.client_port),
            ForwardMode::FullNat => (self.local_addr, self.local_port),
            ForwardMode::Dr | ForwardMode::Tun => return None,
        };
        Some(FlowKey6 {
            src: self.real_addr,
            dst,
            sport: self.real_port,
            dport,
            proto: self.proto,
        })
    }

    pub fn state(&self) -> TcpState {
        self.state
    }

    /// The state column of `ipvsadm -Lnc`, as for an IPv4 session.
    pub fn state_name(&self) -> &'static str {
        match self.proto {
            Protocol::Tcp => self.state.name(),
            Protocol::Udp => state::UDP_STATE_NAME,
        }
    }

    /// A TCP connection not yet established (as [`super::Session::is_half_open`]).
    pub fn is_half_open(&self) -> bool {
        self.proto == Protocol::Tcp && state::is_half_open(self.state)
    }

    /// Over (TIME_WAIT, CLOSE), as the IPv4 [`super::Session::is_finished`].
    pub fn is_finished(&self) -> bool {
        self.proto == Protocol::Tcp && state::is_finished(self.state)
    }

    /// The tick the session expires at, unless a packet comes first.
    pub fn deadline(&self) -> u32 {
        self.deadline
    }

    /// Whether the deadline has come by `now_tick` (ticks wrap: compared as a
    /// signed distance, as the timer wheel does).
    fn expired(&self, now_tick: u32) -> bool {
        (now_tick.wrapping_sub(self.deadline) as i32) >= 0
    }
}

/// An IPv6 key with its hash, computed once per packet and used for the index
/// prefetch and the lookup, as [`super::HashedKey`] is for IPv4. Only
/// [`HashedKey6::new`] makes one, so the hash always belongs to the key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HashedKey6 {
    key: FlowKey6,
    hash: KeyHash,
}

impl HashedKey6 {
    /// `key` hashed with the process's seeded hasher: five words, two at a time,
    /// three rounds of two folded multiplies.
    #[inline]
    pub fn new(key: FlowKey6) -> HashedKey6 {
        let (src, dst) = (u128::from(key.src), u128::from(key.dst));
        let ports = u64::from(key.sport) << 32 | u64::from(key.dport) << 16 | key.proto as u64;
        let words = [
            (src >> 64) as u64,
            src as u64,
            (dst >> 64) as u64,
            dst as u64,
            ports,
        ];
        HashedKey6 {
            key,
            hash: process_hasher().hash_key(&words),
        }
    }

    #[inline]
    pub fn key(&self) -> &FlowKey6 {
        &self.key
    }

    #[inline]
    pub fn hash(&self) -> KeyHash {
        self.hash
    }
}

/// Whether `session` is filed under `key` in direction `dir`.
#[inline]
fn files_under(session: &Session6, dir: Direction, key: &FlowKey6) -> bool {
    match dir {
        Direction::Outbound => session.reply_key().as_ref() == Some(key),
        _ => session.in_key() == *key,
    }
}

/// A slab slot: a session, or the next vacant slot.
#[derive(Clone, Copy, Debug)]
enum Slot {
    Used(Session6),
    Vacant { next: u32 },
}

const NIL: u32 = u32::MAX;

/// One worker's IPv6 sessions (see the module doc).
pub struct SessionTable6 {
    /// Both in transparent huge pages, as the IPv4 table's ([`HugePageAlloc`]): at a
    /// million sessions in 4 KiB pages nearly every lookup also misses the TLB.
    slab: HugeVec<Slot, HugePageAlloc>,
    index: SessionIndex,
    free_head: u32,
    len: usize,
    /// Where the next [`SessionTable6::sweep`] starts.
    cursor: usize,
    /// TCP sessions in the order they were made, for reclaiming half-open ones.
    created: CreationOrder,
}

impl SessionTable6 {
    /// A table for `capacity` sessions (at most 2^31), all its memory taken now.
    /// Panics when the memory cannot be had; [`try_with_capacity`] reports it instead.
    ///
    /// [`try_with_capacity`]: Self::try_with_capacity
    pub fn with_capacity(capacity: usize) -> SessionTable6 {
        Self::try_with_capacity(capacity).unwrap_or_else(|e| panic!("{e}"))
    }

    /// As [`with_capacity`](Self::with_capacity), but a refused allocation (the
    /// kernel has not the memory, or an address-space limit) is an error, not an
    /// abort. The memory is written here, so it is placed on the NUMA node of the
    /// calling thread: build a worker's table on the worker's own lcore.
    pub fn try_with_capacity(capacity: usize) -> Result<SessionTable6, TableAllocError> {
        let capacity = capacity.min(1 << 31);
        let refused = || TableAllocError {
            capacity,
            bytes: Self::bytes_for(capacity),
        };
        let mut slab = HugeVec::new_in(HugePageAlloc);
        slab.try_reserve_exact(capacity).map_err(|_| refused())?;
        slab.extend((0..capacity).map(|i| Slot::Vacant {
            next: if i + 1 < capacity { i as u32 + 1 } else { NIL },
        }));
        let index = SessionIndex::try_new(capacity.saturating_mul(2)).map_err(|_| refused())?;
        let created = CreationOrder::try_new(capacity).ok_or_else(refused)?;
        Ok(SessionTable6 {
            slab,
            index,
            free_head: if capacity > 0 { 0 } else { NIL },
            len: 0,
            cursor: 0,
            created,
        })
    }

    /// Bytes a table for `capacity` sessions allocates, slab, index and creation
    /// order, known before making it.
    pub fn bytes_for(capacity: usize) -> usize {
        capacity
            .saturating_mul(std::mem::size_of::<Slot>())
            .saturating_add(SessionIndex::bytes_for(capacity.saturating_mul(2)))
            .saturating_add(CreationOrder::bytes_for(capacity))
    }

    /// The index buckets a lookup of a filed key reads, on average
    /// ([`SessionIndex::buckets_per_lookup`]). Reads the whole index.
    pub fn index_buckets_per_lookup(&self) -> f64 {
        self.index.buckets_per_lookup()
    }

    /// Bytes this table allocated, as the allocator was asked for them: the slab,
    /// the index's buckets and the creation order.
    pub fn memory_bytes(&self) -> usize {
        self.slab.capacity() * std::mem::size_of::<Slot>()
            + self.index.memory().1
            + self.created.memory().1
    }

    /// Free slots.
    pub fn free(&self) -> usize {
        self.capacity() - self.len
    }

    /// The oldest half-open TCP session the table still has, looking at most
    /// `max_scan` entries of its creation order (each one looked at is used up), as
    /// the IPv4 table's [`super::SessionTable::oldest_reclaimable`]. The caller
    /// removes it.
    pub fn oldest_reclaimable(&mut self, max_scan: usize) -> Option<u32> {
        for _ in 0..max_scan {
            let (slot, tick) = self.created.pop()?;
            let Some(s) = self.get(slot) else {
                continue;
            };
            if self.created.tick_bits(s.created) == tick && (s.is_half_open() || s.is_finished()) {
                return Some(slot);
            }
        }
        None
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn capacity(&self) -> usize {
        self.slab.len()
    }

    /// The live session filed under `key`, and which of its keys that is. A session
    /// past its deadline is not found (the sweep removes it).
    pub fn lookup(&self, key: &FlowKey6, now_tick: u32) -> Option<(u32, Direction)> {
        self.lookup_hashed(&HashedKey6::new(*key), now_tick)
    }

    /// [`SessionTable6::lookup`] with the hash the burst's prefetch pass computed.
    #[inline]
    pub fn lookup_hashed(&self, key: &HashedKey6, now_tick: u32) -> Option<(u32, Direction)> {
        let (at, dir) = self.filed(key)?;
        match &self.slab[at as usize] {
            Slot::Used(s) if !s.expired(now_tick) => Some((at, dir)),
            _ => None,
        }
    }

    /// The slot filed under `key`, expired or not, and which of its keys it is.
    #[inline]
    fn filed(&self, key: &HashedKey6) -> Option<(u32, Direction)> {
        let found = self.index.find(key.hash, |v| {
            let (at, dir) = split(v);
            matches!(self.slab.get(at as usize), Some(Slot::Used(s)) if files_under(s, dir, &key.key))
        })?;
        Some(split(found))
    }

    /// First step of a burst's prefetch: starts loading `key`'s index bucket.
    #[inline]
    pub fn prefetch_bucket(&self, key: &HashedKey6) {
        self.index.prefetch(key.hash);
    }

    /// Second step, once the bucket has had time to arrive: starts loading the
    /// entry the bucket's first matching tag names (a guess the lookup checks), every
    /// line of it (an entry spans two or three). As the IPv4 table's
    /// ([`SessionTable::prefetch_entry`](super::SessionTable::prefetch_entry)), returns
    /// true, having started loading the next bucket, where the key may lie past its
    /// home bucket.
    #[inline]
    #[must_use = "a key past its home bucket needs the third step"]
    pub fn prefetch_entry(&self, key: &HashedKey6) -> bool {
        self.index
            .prefetch_candidate(key.hash, |value| self.prefetch_slot(value))
    }

    /// Third step, for a key [`SessionTable6::prefetch_entry`] found past its home
    /// bucket, once the next bucket has had time to arrive: starts loading the entry
    /// that bucket's first matching tag names.
    #[inline]
    pub fn prefetch_entry_past_home(&self, key: &HashedKey6) {
        self.index
            .prefetch_candidate_past_home(key.hash, |value| self.prefetch_slot(value));
    }

    /// Starts loading every line of the entry index value `value` names.
    #[inline]
    fn prefetch_slot(&self, value: u32) {
        if let Some(slot) = self.slab.get(split(value).0 as usize) {
            super::prefetch_lines(slot);
        }
    }

    /// The session in slot `id`, if one is there.
    pub fn get(&self, id: u32) -> Option<&Session6> {
        match self.slab.get(id as usize)? {
            Slot::Used(s) => Some(s),
            Slot::Vacant { .. } => None,
        }
    }

    /// The session in slot `id`, to change what is not a key: its keys' fields (the
    /// addresses, ports, protocol and mode) must stay as it was filed under them, or
    /// its index entries would name a session that no longer has their keys.
    pub fn get_mut(&mut self, id: u32) -> Option<&mut Session6> {
        match self.slab.get_mut(id as usize)? {
            Slot::Used(s) => Some(s),
            Slot::Vacant { .. } => None,
        }
    }

    /// Files `session` under its client key (and its reply key, for NAT and
    /// FullNAT), expiring
    /// `timeout` ticks after `now_tick`. A key still held by an expired session is
    /// taken over (that session is removed first, and handed to `on_expired`).
    pub fn insert(
        &mut self,
        mut session: Session6,
        now_tick: u32,
        timeout: u32,
        mut on_expired: impl FnMut(&Session6),
    ) -> Result<u32, InsertError> {
        let keys = [
            (Some(session.in_key()), Direction::Inbound),
            (session.reply_key(), Direction::Outbound),
        ];
        // A session whose replies would carry its client's own tuple (a real server
        // as the client, the local end its VIP and port) could not tell its two
        // directions apart: refused, as the IPv4 table refuses it.
        if keys[1].0 == keys[0].0 {
            return Err(InsertError::KeyExists(Direction::Outbound));
        }
        let keys = keys.map(|(key, dir)| (key.map(HashedKey6::new), dir));
        for (key, dir) in keys {
            let Some(key) = key else { continue };
            if let Some((at, _)) = self.filed(&key) {
                match self.get(at) {
                    Some(old) if old.expired(now_tick) => {
                        let old = *old;
                        self.remove(at);
                        on_expired(&old);
                    }
                    _ => return Err(InsertError::KeyExists(dir)),
                }
            }
        }
        if self.free_head == NIL {
            return Err(InsertError::TableFull);
        }
        let at = self.free_head;
        let Slot::Vacant { next } = self.slab[at as usize] else {
            return Err(InsertError::TableFull);
        };
        let filing = keys
            .iter()
            .filter_map(|&(key, dir)| Some((key?.hash, value(at, dir))));
        for (filed, (hash, v)) in filing.clone().enumerate() {
            if !self.index.insert(hash, v) {
                // Not expected: the index holds two keys for every slot. Undone, so
                // that no key names a slot that stays vacant.
                for (hash, v) in filing.take(filed) {
                    self.index.remove(hash, v);
                }
                return Err(InsertError::TableFull);
            }
        }
        self.free_head = next;
        session.created = now_tick;
        session.template_due = now_tick;
        session.deadline = now_tick.wrapping_add(timeout);
        self.slab[at as usize] = Slot::Used(session);
        self.len += 1;
        if session.proto == Protocol::Tcp {
            self.created.push(at, now_tick);
        }
        Ok(at)
    }

    /// A packet of session `id` seen in `dir`: its TCP state moves on `flags` (UDP
    /// keeps its one state), and its deadline is re-armed with the timeout of the
    /// state it is in now.
    pub fn on_packet(
        &mut self,
        id: u32,
        dir: Direction,
        flags: TcpFlags,
        now_tick: u32,
        timeouts: &TickTimeouts,
    ) -> Option<Transition> {
        let s = self.get_mut(id)?;
        s.packets = s.packets.saturating_add(1);
        let transition = match s.proto {
            Protocol::Tcp => {
                let table = match dir {
                    Direction::Outbound => {
                        s.input_only = false;
                        Direction::Outbound
                    }
                    Direction::Inbound if s.input_only => Direction::InputOnly,
                    other => other,
                };
                // FullNAT (NAT64 included) or the client's sequence not known
                // (installed by sync): `state::transition_never_back_to_handshake`.
                let t = if s.client_next != 0 && s.mode != ForwardMode::FullNat {
                    state::transition(s.state, table, flags)
                } else {
                    state::transition_never_back_to_handshake(s.state, table, flags)
                };
                s.state = t.to;
                t
            }
            Protocol::Udp => Transition {
                from: s.state,
                to: s.state,
            },
        };
        s.deadline = now_tick.wrapping_add(timeouts.session(s.proto, s.state));
        Some(transition)
    }

    /// As [`SessionTable6::on_packet`], for a client's TCP segment whose sequence
    /// numbers are known, with the IPv4 table's check
    /// ([`super::SessionTable::on_client_segment`]): a RST or FIN further than
    /// [`super::CLIENT_SEQ_WINDOW`] from the client's sequence as last seen moves
    /// nothing, and `Err` says so.
    #[inline]
    pub fn on_client_segment(
        &mut self,
        id: u32,
        flags: TcpFlags,
        seg: ClientSegment,
        now_tick: u32,
        timeouts: &TickTimeouts,
    ) -> Option<Result<Transition, OutOfWindow>> {
        let s = self.get_mut(id)?;
        if s.proto == Protocol::Tcp {
            let known = (s.client_next != 0).then_some(s.client_next);
            if !seg.within_window_of(known) {
                if flags.intersects(TcpFlags::RST | TcpFlags::FIN) {
                    return Some(Err(OutOfWindow));
                }
            } else if !flags.contains(TcpFlags::RST) {
                s.client_next = seg.moved_on(s.client_next);
            }
        }
        self.on_packet(id, Direction::Inbound, flags, now_tick, timeouts)
            .map(Ok)
    }

    /// As [`SessionTable6::on_packet`], for a real server's TCP segment with ACK and
    /// without RST: its acknowledgment number starts the client's sequence as last seen
    /// where it is not known, moves it forward where it is behind, and restarts it on
    /// a SYN-ACK, as the IPv4 table's
    /// [`super::SessionTable::on_server_segment`].
    #[inline]
    pub fn on_server_segment(
        &mut self,
        id: u32,
        flags: TcpFlags,
        ack: u32,
        now_tick: u32,
        timeouts: &TickTimeouts,
    ) -> Option<Transition> {
        let s = self.get_mut(id)?;
        // 0 stands for "not known": an acknowledgment of 0 starts nothing.
        let known = (s.client_next != 0).then_some(s.client_next);
        if s.proto == Protocol::Tcp && ack != 0 && super::table::server_ack_moves(known, ack, flags)
        {
            s.client_next = ack;
        }
        self.on_packet(id, Direction::Outbound, flags, now_tick, timeouts)
    }

    /// Starts the client's sequence as last seen for session `id` at the end of the
    /// segment that opened it (as the IPv4 [`super::Session::with_client_next_seq`]).
    pub fn start_client_seq(&mut self, id: u32, seg: &ClientSegment) {
        if let Some(s) = self.get_mut(id) {
            if s.proto == Protocol::Tcp {
                s.client_next = seg.next;
            }
        }
    }

    /// Session `id` expires `timeout` ticks after `now_tick` (a sync record's refresh).
    pub fn touch(&mut self, id: u32, now_tick: u32, timeout: u32) {
        if let Some(s) = self.get_mut(id) {
            s.deadline = now_tick.wrapping_add(timeout);
        }
    }

    /// Removes session `id` and its keys. Returns it.
    pub fn remove(&mut self, id: u32) -> Option<Session6> {
        let session = *self.get(id)?;
        let keys = [
            (Some(session.in_key()), Direction::Inbound),
            (session.reply_key(), Direction::Outbound),
        ];
        for (key, dir) in keys {
            if let Some(key) = key {
                let removed = self.index.remove(HashedKey6::new(key).hash, value(id, dir));
                debug_assert!(removed, "slot {id}'s {dir:?} key was not in the index");
            }
        }
        self.slab[id as usize] = Slot::Vacant {
            next: self.free_head,
        };
        self.free_head = id;
        self.len -= 1;
        Some(session)
    }

    /// Looks at the next `budget` slots (round robin over the slab) and removes the
    /// sessions whose deadline has come, handing each to `on_expired` first.
    pub fn sweep(&mut self, now_tick: u32, budget: usize, on_expired: impl FnMut(&Session6)) {
        self.sweep_visiting(now_tick, budget, on_expired, |_| {});
    }

    /// [`SessionTable6::sweep`], also handing `on_live` each live session it looks at.
    pub fn sweep_visiting(
        &mut self,
        now_tick: u32,
        budget: usize,
        mut on_expired: impl FnMut(&Session6),
        mut on_live: impl FnMut(&mut Session6),
    ) {
        let n = self.slab.len();
        if n == 0 || self.len == 0 {
            return;
        }
        for _ in 0..budget.min(n) {
            let at = self.cursor;
            self.cursor = (self.cursor + 1) % n;
            if let Slot::Used(s) = &mut self.slab[at] {
                if s.expired(now_tick) {
                    let s = *s;
                    self.remove(at as u32);
                    on_expired(&s);
                } else {
                    on_live(s);
                }
            }
        }
    }

    /// Live sessions in the slab slots `slots` (cut to the slab), in slab order, with
    /// their indices: a resumable scan for listings read in chunks, which reads only
    /// those slots however few of them are in use.
    pub fn iter_slots(
        &self,
        slots: std::ops::Range<usize>,
    ) -> impl Iterator<Item = (usize, &Session6)> + '_ {
        let end = slots.end.min(self.slab.len());
        let start = slots.start.min(end);
        self.slab[start..end]
            .iter()
            .enumerate()
            .filter_map(move |(i, s)| match s {
                Slot::Used(s) => Some((start + i, s)),
                Slot::Vacant { .. } => None,
            })
    }

    /// Every live session (expired ones not yet swept included), in slab order.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &Session6)> + '_ {
        self.slab.iter().enumerate().filter_map(|(i, s)| match s {
            Slot::Used(s) => Some((i as u32, s)),
            Slot::Vacant { .. } => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::Timeouts;

    fn key(client: &str, cport: u16) -> FlowKey6 {
        FlowKey6 {
            src: client.parse().unwrap(),
            dst: "2001:db8::1".parse().unwrap(),
            sport: cport,
            dport: 80,
            proto: Protocol::Tcp,
        }
    }

    fn timeouts() -> TickTimeouts {
        Timeouts::default().in_ticks(1000)
    }

    #[test]
    fn nat_sessions_are_found_by_both_keys_and_removed_with_them() {
        let mut t = SessionTable6::with_capacity(4);
        let rs: Ipv6Addr = "2001:db8:1::2".parse().unwrap();
        let k = key("2001:db8:2::9", 40000);
        let s = Session6::new(&k, ForwardMode::Nat, 1, 7, rs, 8080);
        let id = t.insert(s, 10, 5, |_| panic!()).unwrap();
        assert_eq!(t.lookup(&k, 10), Some((id, Direction::Inbound)));
        let reply = s.reply_key().unwrap();
        assert_eq!((reply.src, reply.sport, reply.dport), (rs, 8080, 40000));
        assert_eq!(t.lookup(&reply, 14), Some((id, Direction::Outbound)));
        // The same key again is refused while the first session lives.
        assert_eq!(
            t.insert(s, 11, 5, |_| panic!()),
            Err(InsertError::KeyExists(Direction::Inbound))
        );
        assert_eq!(t.remove(id).unwrap(), t_session(s, 10, 15));
        assert!(t.lookup(&k, 10).is_none() && t.lookup(&reply, 10).is_none());
        assert!(t.is_empty());
    }

    #[test]
    fn fullnat_replies_are_keyed_by_the_local_address_and_port() {
        let mut t = SessionTable6::with_capacity(4);
        let rs: Ipv6Addr = "2001:db8:1::2".parse().unwrap();
        let lip: Ipv6Addr = "2001:db8:1::50".parse().unwrap();
        let k = key("2001:db8:2::9", 40000);
        let mut s = Session6::new(&k, ForwardMode::FullNat, 1, 7, rs, 8080);
        (s.local_addr, s.local_port) = (lip, 1025);
        let id = t.insert(s, 10, 5, |_| panic!()).unwrap();
        let reply = s.reply_key().unwrap();
        assert_eq!(
            (reply.src, reply.dst, reply.sport, reply.dport),
            (rs, lip, 8080, 1025)
        );
        assert_eq!(t.lookup(&reply, 10), Some((id, Direction::Outbound)));
        // Another client on the same local port towards the same server: refused.
        let mut other = Session6::new(
            &key("2001:db8:2::8", 1),
            ForwardMode::FullNat,
            1,
            7,
            rs,
            8080,
        );
        (other.local_addr, other.local_port) = (lip, 1025);
        assert_eq!(
            t.insert(other, 11, 5, |_| panic!()),
            Err(InsertError::KeyExists(Direction::Outbound))
        );
        other.local_port = 1026;
        t.insert(other, 11, 5, |_| panic!()).unwrap();
        t.remove(id);
        assert!(t.lookup(&reply, 10).is_none());
        assert!(t.lookup(&other.reply_key().unwrap(), 12).is_some());
        assert_eq!(
            std::mem::size_of::<Session6>(),
            116,
            "as the module doc says"
        );
    }

    #[test]
    fn the_oldest_reclaimable_session_goes_first_established_ones_never() {
        let mut t = SessionTable6::with_capacity(8);
        let rs: Ipv6Addr = "2001:db8:1::2".parse().unwrap();
        let tt = timeouts();
        let mut ids = Vec::new();
        for (tick, port) in (1..=4).zip(40000u16..) {
            let s = Session6::new(&key("2001:db8:2::9", port), ForwardMode::Nat, 1, 7, rs, 80);
            let id = t.insert(s, tick, 1000, |_| panic!()).unwrap();
            t.on_packet(id, Direction::Inbound, TcpFlags::SYN, tick, &tt);
            ids.push(id);
        }
        // The first is established (the server's SYN-ACK, the client's ACK).
        t.on_packet(
            ids[0],
            Direction::Outbound,
            TcpFlags::SYN | TcpFlags::ACK,
            5,
            &tt,
        );
        t.on_packet(ids[0], Direction::Inbound, TcpFlags::ACK, 5, &tt);
        assert!(!t.get(ids[0]).unwrap().is_half_open());
        // The second ends; its slot goes to a later half-open session.
        t.remove(ids[1]).unwrap();
        let s = Session6::new(&key("2001:db8:2::9", 50000), ForwardMode::Nat, 1, 7, rs, 80);
        let reused = t.insert(s, 6, 1000, |_| panic!()).unwrap();
        assert_eq!(reused, ids[1]);
        // UDP is never a candidate.
        let mut udp = key("2001:db8:2::9", 53);
        udp.proto = Protocol::Udp;
        t.insert(
            Session6::new(&udp, ForwardMode::Nat, 1, 7, rs, 53),
            7,
            1000,
            |_| panic!(),
        )
        .unwrap();
        assert_eq!(t.free(), 3);
        let order: Vec<u32> = std::iter::from_fn(|| t.oldest_reclaimable(64)).collect();
        assert_eq!(order, [ids[2], ids[3], reused]);
        assert_eq!(t.oldest_reclaimable(64), None, "each found once");
    }

    fn t_session(mut s: Session6, created: u32, deadline: u32) -> Session6 {
        s.created = created;
        s.template_due = created;
        s.deadline = deadline;
        s
    }

    #[test]
    fn expired_sessions_are_not_found_swept_and_give_way_to_a_new_one() {
        let mut t = SessionTable6::with_capacity(2);
        let rs: Ipv6Addr = "2001:db8:1::2".parse().unwrap();
        let (a, b) = (key("2001:db8:2::9", 1), key("2001:db8:2::9", 2));
        let sa = Session6::new(&a, ForwardMode::Dr, 1, 7, rs, 80);
        let sb = Session6::new(&b, ForwardMode::Dr, 1, 7, rs, 80);
        t.insert(sa, 0, 10, |_| panic!()).unwrap();
        t.insert(sb, 0, 100, |_| panic!()).unwrap();
        assert_eq!(
            t.insert(
                Session6::new(&key("::9", 3), ForwardMode::Dr, 1, 7, rs, 80),
                0,
                1,
                |_| {}
            ),
            Err(InsertError::TableFull)
        );
        assert!(t.lookup(&a, 9).is_some());
        assert!(t.lookup(&a, 10).is_none());
        // The same key, expired: taken over, and the old one reported.
        let mut gone = Vec::new();
        t.insert(sa, 20, 10, |s| gone.push(s.client_port)).unwrap();
        assert_eq!(gone, [1]);
        let mut swept = Vec::new();
        t.sweep(200, 8, |s| swept.push(s.client_port));
        swept.sort();
        assert_eq!(swept, [1, 2]);
        assert!(t.is_empty());
        // Ticks wrap: a deadline past u32::MAX still lies ahead.
        t.insert(sa, u32::MAX - 1, 10, |_| panic!()).unwrap();
        assert!(t.lookup(&a, 3).is_some() && t.lookup(&a, 8).is_none());
    }

    #[test]
    fn bytes_for_is_what_a_table_allocates() {
        for capacity in [0, 1, 256, 1000, 4096, 100_000] {
            let t = SessionTable6::with_capacity(capacity);
            let (known, got) = (SessionTable6::bytes_for(capacity), t.memory_bytes());
            assert_eq!(known, got, "capacity {capacity}");
        }
    }

    #[test]
    fn an_allocation_the_kernel_refuses_is_an_error() {
        // 2^31 slots of over 100 bytes: a slab above 200 GiB, more than any test
        // machine has, so the kernel's overcommit check refuses the mapping. With
        // overcommit unlimited (mode 1) it would be granted and then faulted in.
        let mode = std::fs::read_to_string("/proc/sys/vm/overcommit_memory").unwrap();
        if mode.trim() == "1" {
            eprintln!("vm.overcommit_memory = 1: a refused mapping cannot be provoked");
            return;
        }
        // Above the cap: clamped to it, and the error names the clamped capacity.
        let e = SessionTable6::try_with_capacity(usize::MAX)
            .err()
            .expect("a 200 GiB slab was granted");
        assert_eq!(e.capacity, 1 << 31);
        assert_eq!(e.bytes, SessionTable6::bytes_for(1 << 31));
        assert!(e.bytes > 200 << 30, "{e:?}");
        assert!(e.to_string().contains("refused"), "{e}");
    }

    #[test]
    fn dr_tcp_moves_by_the_input_only_table_until_the_server_is_heard() {
        let mut t = SessionTable6::with_capacity(1);
        let k = key("2001:db8:2::9", 1);
        let s = Session6::new(
            &k,
            ForwardMode::Dr,
            1,
            7,
            "2001:db8:1::2".parse().unwrap(),
            80,
        );
        let id = t.insert(s, 0, 10, |_| panic!()).unwrap();
        let tt = timeouts();
        let syn = t
            .on_packet(id, Direction::Inbound, TcpFlags::SYN, 0, &tt)
            .unwrap();
        assert_eq!(syn.to, TcpState::SynRecv);
        let ack = t
            .on_packet(id, Direction::Inbound, TcpFlags::ACK, 0, &tt)
            .unwrap();
        assert_eq!(ack.to, TcpState::Established);
        assert_eq!(
            t.get(id).unwrap().deadline(),
            tt.session(Protocol::Tcp, TcpState::Established)
        );
    }

    /// A real server's acknowledgment starts the client's sequence of a session
    /// installed by sync, as in the IPv4 table: then a blind RST far from it moves
    /// nothing, and one at the acknowledged byte closes it. A later acknowledgment
    /// moves it forward, an earlier one never back; a SYN-ACK restarts it.
    #[test]
    fn a_server_acknowledgment_starts_an_unknown_client_sequence() {
        let tt = timeouts();
        let rs: Ipv6Addr = "2001:db8:1::2".parse().unwrap();
        let mut t = SessionTable6::with_capacity(4);
        let mut s = Session6::new(
            &key("2001:db8:2::9", 40000),
            ForwardMode::FullNat,
            1,
            7,
            rs,
            80,
        )
        .synced(TcpState::Established, false);
        (s.local_addr, s.local_port) = ("2001:db8:1::50".parse().unwrap(), 1025);
        let id = t.insert(s, 0, 5, |_| panic!()).unwrap();
        let seg = |seq: u32| ClientSegment { seq, next: seq };
        let rst = TcpFlags::RST | TcpFlags::ACK;
        let acked = 0x4000_0000u32;
        for ack in [acked - (4 << 20), acked, acked - (2 << 20)] {
            t.on_server_segment(id, TcpFlags::ACK, ack, 0, &tt).unwrap();
        }
        assert_eq!(t.get(id).unwrap().client_next, acked);
        let far = acked.wrapping_add(1 << 31);
        let moved = t.on_client_segment(id, rst, seg(far), 0, &tt).unwrap();
        assert_eq!(moved, Err(OutOfWindow));
        t.on_server_segment(id, TcpFlags::SYN | TcpFlags::ACK, far, 0, &tt)
            .unwrap();
        let moved = t.on_client_segment(id, rst, seg(acked), 0, &tt).unwrap();
        assert_eq!(moved, Err(OutOfWindow), "restarted by the SYN-ACK");
        let moved = t.on_client_segment(id, rst, seg(far), 0, &tt).unwrap();
        assert_eq!(moved.unwrap().to, TcpState::Close);
    }

    /// A FullNAT session (its sequence known or not) and one whose client sequence is
    /// not known: a SYN on a closing session leaves it closing, where IPVS's table
    /// takes it back to SYN_RECV (a blind FIN and SYN would otherwise make a live
    /// FullNAT connection look like a stale handshake, whose pair may be taken). A
    /// NAT session whose sequence is known keeps IPVS's table.
    #[test]
    fn a_syn_takes_a_fullnat_or_unsequenced_session_nowhere_back() {
        let tt = timeouts();
        let rs: Ipv6Addr = "2001:db8:1::2".parse().unwrap();
        let cases = [
            (40000, ForwardMode::FullNat, true, TcpState::CloseWait),
            (40001, ForwardMode::Nat, false, TcpState::CloseWait),
            (40002, ForwardMode::Nat, true, TcpState::SynRecv),
        ];
        for (cport, mode, sequenced, after) in cases {
            let mut t = SessionTable6::with_capacity(4);
            let mut s = Session6::new(&key("2001:db8:2::9", cport), mode, 1, 7, rs, 8080)
                .synced(TcpState::CloseWait, false);
            (s.local_addr, s.local_port) = ("2001:db8:1::50".parse().unwrap(), 1025);
            let id = t.insert(s, 0, 5, |_| panic!()).unwrap();
            if sequenced {
                t.start_client_seq(id, &ClientSegment { seq: 99, next: 100 });
            }
            let seg = ClientSegment { seq: 7, next: 8 };
            let moved = t.on_client_segment(id, TcpFlags::SYN, seg, 0, &tt).unwrap();
            assert_eq!(
                moved.unwrap().to,
                after,
                "{mode:?}, sequence known: {sequenced}"
            );
        }
    }

    /// The IPv4 table's sequence check, on IPv6 sessions of every mode: a client RST
    /// far from the client's sequence as last seen moves nothing; near it, it closes;
    /// a session whose sequence was never started takes any.
    #[test]
    fn a_client_rst_far_from_the_clients_sequence_moves_nothing() {
        let tt = crate::session::Timeouts::default().in_ticks(1000);
        let rs: Ipv6Addr = "2001:db8:1::2".parse().unwrap();
        let window = super::super::CLIENT_SEQ_WINDOW;
        for (cport, mode) in [(40000, ForwardMode::Nat), (40001, ForwardMode::FullNat)] {
            let mut t = SessionTable6::with_capacity(4);
            let mut s = Session6::new(&key("2001:db8:2::9", cport), mode, 1, 7, rs, 8080);
            (s.local_addr, s.local_port) = ("2001:db8:1::50".parse().unwrap(), 1025);
            let id = t.insert(s, 0, 5, |_| panic!()).unwrap();
            let seg = |seq: u32| ClientSegment { seq, next: seq };
            let isn = 5_000u32;
            t.start_client_seq(
                id,
                &ClientSegment {
                    seq: isn,
                    next: isn + 1,
                },
            );
            let on = |t: &mut SessionTable6, flags, seq| {
                t.on_client_segment(id, flags, seg(seq), 0, &tt).unwrap()
            };
            on(&mut t, TcpFlags::SYN, isn).unwrap();
            t.on_packet(
                id,
                Direction::Outbound,
                TcpFlags::SYN | TcpFlags::ACK,
                0,
                &tt,
            );
            on(&mut t, TcpFlags::ACK, isn + 1).unwrap();
            assert_eq!(t.get(id).unwrap().state(), TcpState::Established);
            let far = isn + 1 + window + 1;
            assert_eq!(on(&mut t, TcpFlags::RST, far), Err(OutOfWindow), "{mode:?}");
            assert_eq!(
                on(&mut t, TcpFlags::FIN | TcpFlags::ACK, far),
                Err(OutOfWindow)
            );
            assert_eq!(t.get(id).unwrap().state(), TcpState::Established);
            let closed = on(&mut t, TcpFlags::RST, isn + 1).unwrap();
            assert_eq!(closed.to, TcpState::Close, "{mode:?}");
        }
        // Never started (a synced session): as IPVS.
        let mut t = SessionTable6::with_capacity(4);
        let s = Session6::new(
            &key("2001:db8:2::9", 40002),
            ForwardMode::Nat,
            1,
            7,
            rs,
            8080,
        );
        let id = t.insert(s, 0, 5, |_| panic!()).unwrap();
        let forged = ClientSegment {
            seq: 1 << 31,
            next: 1 << 31,
        };
        t.on_client_segment(id, TcpFlags::ACK, forged, 0, &tt)
            .unwrap()
            .unwrap();
        let rst = ClientSegment { seq: 7, next: 7 };
        let t2 = t
            .on_client_segment(id, TcpFlags::RST, rst, 0, &tt)
            .unwrap()
            .unwrap();
        assert_eq!(t2.to, TcpState::Close);
    }

    /// Random inserts (NAT, FullNAT and DR sessions over a few clients, ports and
    /// real servers, so keys repeat and are refused; some clients are a real server
    /// or the VIP and some local ends the VIP's port 80, so a client key can be
    /// another session's reply key), removals, expiries taken over and lookups of
    /// keys filed and not, in a table small enough to fill and to overflow its
    /// index's buckets, against a reference map: no key lost, none found that was
    /// not filed, a refusal only for a key the map holds or a table with no free
    /// slot, only expired sessions taken over, the index consistent with the slab.
    #[test]
    fn the_index_agrees_with_a_reference_map() {
        use std::collections::HashMap;
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = move |below: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % below
        };
        let mut t = SessionTable6::with_capacity(48);
        // A fixed hasher: the removals pick keys by their place in the map, and the
        // run must be the same every time.
        type Fixed = std::hash::BuildHasherDefault<std::collections::hash_map::DefaultHasher>;
        let mut filed: HashMap<FlowKey6, (u32, Direction), Fixed> = HashMap::default();
        let (mut refused, mut removed, mut full) = (0, 0, 0);
        let vip: Ipv6Addr = "2001:db8::1".parse().unwrap();
        let real_server = |n: u64| Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 2 + n as u16);
        let client = |n: u64| match n {
            6 => real_server(0),
            7 => vip,
            _ => Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, n as u16),
        };
        for round in 0..20_000u32 {
            let now = round / 8;
            match next(10) {
                0..=5 => {
                    let k = FlowKey6 {
                        src: client(next(8)),
                        dst: vip,
                        sport: [40000 + next(12) as u16, 8080, 80][next(3) as usize],
                        dport: 80,
                        proto: Protocol::Tcp,
                    };
                    let mode =
                        [ForwardMode::Nat, ForwardMode::FullNat, ForwardMode::Dr][next(3) as usize];
                    let rs = real_server(next(2));
                    let mut s = Session6::new(&k, mode, 1, 7, rs, 8080);
                    if mode == ForwardMode::FullNat {
                        s.local_addr = [vip, "2001:db8:1::100".parse().unwrap()][next(2) as usize];
                        s.local_port = [1024 + next(16) as u16, 80][next(2) as usize];
                    }
                    let mut gone = Vec::new();
                    let result = t.insert(s, now, 1 + next(40) as u32, |old| {
                        assert!(old.expired(now), "round {round}: a live session taken over");
                        gone.push(*old)
                    });
                    // An expired session that held one of the keys is removed first,
                    // whether or not the insert then succeeds.
                    for old in &gone {
                        filed.retain(|k, _| *k != old.in_key() && Some(*k) != old.reply_key());
                    }
                    match result {
                        Ok(at) => {
                            filed.insert(s.in_key(), (at, Direction::Inbound));
                            if let Some(reply) = s.reply_key() {
                                filed.insert(reply, (at, Direction::Outbound));
                            }
                        }
                        Err(InsertError::TableFull) => {
                            assert_eq!(t.free(), 0, "round {round}: full with free slots");
                            full += 1
                        }
                        Err(InsertError::KeyExists(dir)) => {
                            let key = match dir {
                                Direction::Outbound => s.reply_key().unwrap(),
                                _ => s.in_key(),
                            };
                            let own = dir == Direction::Outbound && key == s.in_key();
                            assert!(
                                own || filed.contains_key(&key),
                                "round {round}: {key:?} refused"
                            );
                            refused += 1
                        }
                    }
                }
                6 | 7 => {
                    let Some((&k, &(at, _))) =
                        filed.iter().nth(next(filed.len() as u64 + 1) as usize)
                    else {
                        continue;
                    };
                    let s = t.remove(at).expect("a filed session is in its slot");
                    assert!(k == s.in_key() || Some(k) == s.reply_key());
                    filed.retain(|_, (slot, _)| *slot != at);
                    removed += 1;
                }
                _ => {}
            }
            // Every filed key is found where the map says (expired ones too, by the
            // index; the lookup hides those), and a key nobody filed is not.
            for (k, &want) in &filed {
                assert_eq!(
                    t.filed(&HashedKey6::new(*k)),
                    Some(want),
                    "round {round}: {k:?}"
                );
            }
            let stranger = FlowKey6 {
                src: Ipv6Addr::new(0x2001, 0xdb8, 3, 0, 0, 0, 0, 1),
                dst: vip,
                sport: 40000,
                dport: 80,
                proto: Protocol::Tcp,
            };
            assert_eq!(t.filed(&HashedKey6::new(stranger)), None);
            assert_eq!(t.index.len(), filed.len(), "round {round}");
            if round % 64 == 0 {
                let home = |v: u32| {
                    let (at, dir) = split(v);
                    let s = t.get(at)?;
                    let key = match dir {
                        Direction::Outbound => s.reply_key()?,
                        _ => s.in_key(),
                    };
                    Some(HashedKey6::new(key).hash())
                };
                t.index.check_consistency(home).unwrap();
            }
        }
        assert!(
            refused > 100 && removed > 100 && full > 20,
            "{refused} {removed} {full}"
        );
    }
}
