//! FullNAT local addresses (LIPs) and ports: per-worker pools that only hand out a
//! local port whose reply comes back, through the NIC's own RSS, to the worker that
//! allocated it. No flow-director rule, no redirect ring: plain Toeplitz RSS is enough.
//!
//! # The problem
//!
//! A FullNAT session sends client traffic to the real server as `LIP:lport ->
//! RIP:rport`. The real server answers `RIP:rport -> LIP:lport`, and the NIC picks the
//! RX queue of that reply as `RETA[toeplitz(RIP, LIP, rport, lport) & (S - 1)]` (`S`
//! the table size). The worker that created the session must be the one that receives
//! the reply, so it may only use local ports whose reply hash lands on its queue. The
//! reply tuple contains the real server, so "which worker owns `LIP:lport`" has no
//! answer on its own: it depends on `RIP:rport`.
//!
//! # The scheme: the hash is linear
//!
//! The Toeplitz hash XORs one key window per input bit set (see
//! [`crate::flow::rss`]), so it splits along the input bytes:
//!
//! ```text
//! toeplitz(RIP, LIP, rport, lport) = toeplitz(RIP, LIP, rport, 0) ^ toeplitz(0, 0, 0, lport)
//! RETA index                       = context(RIP, rport, LIP)     ^ class(lport)      (low log2 S bits)
//! ```
//!
//! - `class(lport)` depends on the key only. It is computed for every port once, when
//!   the pool is built, and each worker keeps its free ports of a LIP in one FIFO list
//!   per class: `S` lists (128 on ixgbe, 512 on i40e).
//! - `context` is computed per new session from six table loads (the real server's
//!   address and port bytes; each LIP's part is precomputed). The reply of `lport` lands on worker `q` iff
//!   `RETA[context ^ class(lport)] == q`, i.e. iff `class(lport)` is in
//!   `context ^ {j : RETA[j] == q}`. [`PortPool::allocate`] finds a non-empty free
//!   list among those classes with bitmaps (the non-empty classes, permuted by
//!   `context`, ANDed with the worker's RETA entries): at most `S / 64` word
//!   operations (2 on ixgbe, 8 on i40e), no loop over ports, then pops the list's
//!   head.
//!
//! The result is exact for any key, any RETA (weighted, any number of queues), any
//! real server, and also when the NIC hashes addresses only ([`HashFields::L3`]:
//! every port is then in class 0, and a worker can use a LIP towards a real server only
//! when `RETA[context]` is its own queue; more LIPs spread that). The tests check every
//! handed-out port through the full hash and RETA for random real servers.
//!
//! # What follows from it
//!
//! - **Every worker's pool holds every port of every LIP.** The same `LIP:lport` can be
//!   in use on two workers at once, but then towards two different `RIP:rport`: for one
//!   destination the hash partitions the ports among the workers, so two workers never
//!   hand out the same reply 4-tuple. This needs (a) all workers' pools built with the
//!   key, RETA and [`HashFields`] the NIC port receiving the replies uses, and (b) one
//!   pool state per LIP per worker, whatever the number of services that use the LIP
//!   (as DPVS: the ports belong to the local address). Two pools of one LIP on a
//!   worker would start alike and hand out the same ports in lockstep, so one
//!   service's session would get the reply tuple another service's session holds.
//!   A [`PortPool`] is therefore the worker's, over every LIP of every service; a
//!   service allocates through its [`LaddrSet`] (which of the pool's LIPs are its, and
//!   its round robin over them), and a port is released to its LIP whichever service
//!   held it. TCP and UDP services share a LIP's pool (conservative: their reply
//!   tuples differ by protocol).
//! - **Edits.** [`PortPool::set_addresses`] keeps the state of every LIP that stays
//!   (ports in use, free-list order, counters) when services gain, lose or reorder
//!   local addresses, and keeps a LIP no service lists while its sessions hold
//!   ports, so their releases never free a port a newer session holds, and for the
//!   real servers' TIME-WAIT after its last release, so that listed again it still
//!   counts a port's early reuse.
//! - **Capacity.** A worker can have every port of a LIP in use (towards different real
//!   servers). Towards one `RIP:rport` it can use the ports whose class it owns for that
//!   context: `ports * owned entries / S`, i.e. `ports / N` with a round-robin RETA over
//!   N workers. All workers together can use every port towards each real server.
//! - **Changes.** A new RETA changes only which classes a worker owns:
//!   [`PortPool::set_reta`] rewrites the ownership bitmap, no port is recomputed (replies
//!   of sessions opened before the change may then arrive elsewhere: the caller moves or
//!   redirects them). A new key or hash fields change the classes: build new pools.
//! - **Port reuse.** Released ports go to the tail of their class list, and successive
//!   allocations rotate over the classes, so a port is reused as late as possible: a real
//!   server may still hold the previous connection on it in TIME_WAIT.
//!
//! # Alternatives rejected
//!
//! - *Hash the replies on `LIP:lport` only* (`RTE_ETH_RSS_L3_DST_ONLY |
//!   RTE_ETH_RSS_L4_DST_ONLY`), making the owner of a port independent of the real
//!   server: igb, ixgbe, virtio, vmxnet3 and others cannot select fields, which is the
//!   very set of NICs this design is for; and on a one-arm set-up the same field choice
//!   would hash every client connection to a VIP:port on one queue.
//! - *Pools per (LIP, real server), built lazily*: memory and build time grow with the
//!   number of real servers, and the first session towards a new real server would build
//!   a pool on the packet path.
//!
//! # Cost
//!
//! No allocation outside [`PortPool::new`] and [`PortPool::set_addresses`] (a new
//! snapshot). [`PortPool::allocate`]: six table loads, the bitmap scan above on the
//! service's round-robin LIP, and only when that LIP has no suitable port for this
//! destination, the same on the service's next LIPs (at most its number of LIPs).
//! [`PortPool::release`]: finds the LIP by binary search over the worker's LIPs
//! (sorted, 8 bytes each: a few cache lines for hundreds), then O(1).
//! [`PortPool::find_held`] (only once an allocation has failed): a bounded walk over
//! the in-use bitmap.
//!
//! Memory per worker (the sizes of its arrays, summed by the
//! `memory_for_a_realistic_config` test): 4 LIPs, ports 1024..=65535 (64 512 each),
//! RETA of 128 entries: **3 137 960 bytes (3.0 MiB)**; with a 512-entry RETA:
//! **3 144 344 bytes**. Per LIP: two bytes of list link, one bit of in-use flag, eight
//! bytes of last use (when, towards which real server address: the early-reuse count
//! below) and two of the real server port served (which sessions
//! [`PortPool::find_held`] offers) per port, four bytes per RETA entry for list heads
//! and tails; per worker, 6 KiB of hash tables. Four workers: 12.6 MB. The LIPs
//! counted are the distinct ones: a LIP several services share costs this once per
//! worker, and a LIP no service lists any more until its sessions have ended and a
//! TIME-WAIT has passed (8 more bytes per LIP for when it last released a port).
//!
//! # Reuse within the real servers' TIME-WAIT
//!
//! A real server keeps a connection it closed first in TIME-WAIT (Linux: 60 s), and
//! the next SYN on the same `LIP:lport -> RIP:rport` must prove itself newer or be
//! dropped. FIFO reuse makes the distance as long as the pool allows (`ports / rate`
//! per LIP), which at high rates is far below 60 s; what makes such a reuse safe is
//! the timestamp rewrite ([`crate::forward::timestamps`]). The pool measures it: each
//! port remembers when it was released and towards which real server address, and an
//! allocation towards that same address within [`PortPool::set_server_time_wait`]
//! counts an early reuse ([`LaddrCounters::early_reuses`]; the caller adds those whose
//! SYN had no timestamps to rewrite, [`LaddrCounters::unprotected_reuses`]). The rule
//! for enough local addresses that no reuse is early: `rate x TIME-WAIT / ports per
//! address`.

use core::fmt;
use core::ops::RangeInclusive;
use std::net::{Ipv4Addr, SocketAddrV4};

use crate::flow::rss::{HashFields, Reta, Toeplitz};

/// Linux's TIME-WAIT (`TCP_TIMEWAIT_LEN`), the real servers' default.
pub const DEFAULT_SERVER_TIME_WAIT_MS: u32 = 60_000;
/// End of a free list. Port 0 is never pooled, so offsets stay below 65 535.
const NIL: u16 = u16::MAX;
/// Reply tuple bytes: RIP 0..4, LIP 4..8, rport 8..10, lport 10..12.
const REPLY_TUPLE_LEN: usize = 12;
const LIP_AT: usize = 4;
const RPORT_AT: usize = 8;
const LPORT_AT: usize = 10;

/// Why a pool could not be built or retargeted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PoolError {
    /// No local address given.
    NoLocalAddress,
    /// A local address given twice.
    DuplicateLocalAddress(Ipv4Addr),
    /// An empty port range, or one that includes port 0.
    PortRange { first: u16, last: u16 },
    /// The RETA size is not a power of two (no NIC has such a table, and the XOR of
    /// hash parts only predicts the NIC's index when it is a bit mask).
    RetaSize(usize),
    /// A service's local address the pool was not given.
    UnknownLocalAddress(Ipv4Addr),
    /// `set_reta` with a table of another size than the pool was built for.
    RetaSizeChanged { built: usize, given: usize },
    /// No RETA entry sends packets to the worker's queue: it could never get a reply.
    QueueNotInReta(u16),
}

impl fmt::Display for PoolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoolError::NoLocalAddress => f.write_str("no local address"),
            PoolError::DuplicateLocalAddress(lip) => write!(f, "local address {lip} given twice"),
            PoolError::UnknownLocalAddress(lip) => write!(f, "local address {lip} not pooled"),
            PoolError::PortRange { first, last } => {
                write!(
                    f,
                    "bad local port range {first}..={last} (non-empty, from 1)"
                )
            }
            PoolError::RetaSize(size) => {
                write!(
                    f,
                    "RSS redirection table of {size} entries (power of two needed)"
                )
            }
            PoolError::RetaSizeChanged { built, given } => {
                write!(
                    f,
                    "redirection table of {given} entries for a pool built for {built}"
                )
            }
            PoolError::QueueNotInReta(queue) => {
                write!(f, "queue {queue} is in no entry of the redirection table")
            }
        }
    }
}

impl std::error::Error for PoolError {}

/// Why a release was refused (the pool is unchanged).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseError {
    /// The address is not one of the pool's.
    UnknownAddress,
    /// The port is outside the pool's range.
    PortOutOfRange,
    /// The port is not in use (released twice, or never allocated).
    NotInUse,
}

/// One LIP's state in one worker's pool, as `dpip addr show -s` shows it per lcore.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaddrCounters {
    pub lip: Ipv4Addr,
    /// Ports in use by this worker.
    pub used: u32,
    /// Ports not in use by this worker (towards one real server only the share its
    /// RETA entries own is usable; see the module doc).
    pub free: u32,
    /// Allocation attempts on this LIP that found no suitable free port.
    pub misses: u64,
    /// Ports handed out again towards the real server they last served, less than
    /// the pool's server TIME-WAIT after their previous session ended: the real server
    /// may still hold that tuple in TIME-WAIT (see [`PortPool::set_server_time_wait`]).
    pub early_reuses: u64,
    /// Of the early reuses, those whose new session cannot prove itself newer to the
    /// real server (no TCP timestamps to rewrite, see
    /// [`crate::forward::timestamps`]): each may cost the client a SYN retransmission.
    pub unprotected_reuses: u64,
}

/// A local address and port handed out by [`PortPool::allocate`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalPort {
    pub lip: Ipv4Addr,
    pub port: u16,
    /// The port last served the same real server address less than the server
    /// TIME-WAIT ago (counted in [`LaddrCounters::early_reuses`]).
    pub early_reuse: bool,
}

/// One LIP: free ports in FIFO lists per class, and which ports are in use.
#[derive(Debug)]
struct LaddrPool {
    lip: Ipv4Addr,
    /// A service lists it (else it is kept only for the ports its sessions hold).
    listed: bool,
    /// The LIP's part of the reply hash, masked to the RETA index bits.
    lip_part: u16,
    /// Per class: first and last free port offset, or `NIL`.
    head: Box<[u16]>,
    tail: Box<[u16]>,
    /// Per port offset: the next free port of its class, or `NIL`.
    next: Box<[u16]>,
    /// Per port offset, one bit: allocated.
    in_use: Box<[u64]>,
    /// Per port offset: when its last session ended (the pool's millisecond clock),
    /// and towards which real server address: while the port is in use, the one it
    /// serves now (0: never taken).
    released_at: Box<[u32]>,
    released_to: Box<[u32]>,
    /// Per port offset, while it is in use: the real server port it serves.
    serving_port: Box<[u16]>,
    /// When a port was last released (the pool's millisecond clock), if ever: an
    /// address no service lists is kept while a real server may still hold one of its
    /// tuples in TIME-WAIT, so that, listed again, it does not hand the port out as
    /// new.
    last_release: Option<u32>,
    /// Per class, one bit: its free list is not empty.
    nonempty: Box<[u64]>,
    /// RETA index to start the next search at, so allocations rotate over classes.
    rotor: usize,
    /// Port offset [`PortPool::find_held`] looks at next, so that successive
    /// searches go round every port in use.
    held_rotor: u32,
    used: u32,
    misses: u64,
    early_reuses: u64,
    unprotected_reuses: u64,
}

impl LaddrPool {
    fn push_tail(&mut self, class: usize, offset: u16) {
        self.next[offset as usize] = NIL;
        match self.tail[class] {
            NIL => {
                self.head[class] = offset;
                self.nonempty[class / 64] |= 1 << (class % 64);
            }
            last => self.next[last as usize] = offset,
        }
        self.tail[class] = offset;
    }

    fn pop_head(&mut self, class: usize) -> Option<u16> {
        let offset = *self.head.get(class)?;
        if offset == NIL {
            return None;
        }
        let next = self.next[offset as usize];
        self.head[class] = next;
        if next == NIL {
            self.tail[class] = NIL;
            self.nonempty[class / 64] &= !(1 << (class % 64));
        }
        self.next[offset as usize] = NIL;
        Some(offset)
    }

    /// Records that the port at `offset`, just taken at `now_ms`, serves `rs`, and
    /// counts it as an early reuse if it last served the same server address less
    /// than `time_wait_ms` ago.
    #[inline]
    fn serve(&mut self, offset: u16, rs: SocketAddrV4, now_ms: u32, time_wait_ms: u32) -> bool {
        let i = offset as usize;
        let early = self.released_to[i] == u32::from(*rs.ip())
            && now_ms.wrapping_sub(self.released_at[i]) < time_wait_ms;
        self.early_reuses += u64::from(early);
        self.released_to[i] = u32::from(*rs.ip());
        self.serving_port[i] = rs.port();
        early
    }

    fn in_use(&self, offset: u16) -> bool {
        self.in_use[offset as usize / 64] & (1 << (offset % 64)) != 0
    }

    /// Takes a free port whose class `c` satisfies `owned[c ^ context]`, starting the
    /// search at the rotor. `owned` and `nonempty` have the same number of words, a
    /// power of two; `context` and every index are below the RETA size.
    fn take(&mut self, context: u16, owned: &[u64], class_mask: u16) -> Option<u16> {
        let words = owned.len();
        let word_mask = words - 1;
        let (context_word, context_bit) = (context as usize >> 6, context as u32 & 63);
        let (start_word, start_bit) = ((self.rotor >> 6) & word_mask, self.rotor & 63);
        // Word `w` of the answer covers RETA indices j = 64w..64w+63; the class of
        // index j is j ^ context, found in word w ^ context_word, bit permuted by the
        // low six bits of the context. Visit the start word's upper part first and its
        // lower part last, so the search wraps around the rotor.
        for step in 0..=words {
            let w = (start_word + step) & word_mask;
            let classes = self.nonempty.get(w ^ context_word).copied().unwrap_or(0);
            let mut candidates = xor_permute(classes, context_bit) & owned[w];
            if step == 0 {
                candidates &= u64::MAX << start_bit;
            } else if step == words {
                candidates &= !(u64::MAX << start_bit);
            }
            if candidates != 0 {
                let index = (w << 6) | candidates.trailing_zeros() as usize;
                let offset = self.pop_head(index ^ context as usize)?;
                self.in_use[offset as usize / 64] |= 1 << (offset % 64);
                self.used += 1;
                self.rotor = (index + 1) & class_mask as usize;
                return Some(offset);
            }
        }
        None
    }
}

/// `x` with bit `i` moved to bit `i ^ m` (`m < 64`): one swap of bit blocks per bit
/// of `m`, six steps at most, no loop over bits.
#[inline(always)]
fn xor_permute(mut x: u64, m: u32) -> u64 {
    const LOW_HALVES: [u64; 6] = [
        0x5555_5555_5555_5555,
        0x3333_3333_3333_3333,
        0x0f0f_0f0f_0f0f_0f0f,
        0x00ff_00ff_00ff_00ff,
        0x0000_ffff_0000_ffff,
        0x0000_0000_ffff_ffff,
    ];
    for (t, mask) in LOW_HALVES.into_iter().enumerate() {
        if m & (1 << t) != 0 {
            let shift = 1 << t;
            x = ((x & mask) << shift) | ((x >> shift) & mask);
        }
    }
    x
}

/// One worker's FullNAT local ports, one [`LaddrPool`] per LIP whichever services use
/// it; see the module doc.
#[derive(Debug)]
pub struct PortPool {
    owner_queue: u16,
    fields: HashFields,
    first_port: u16,
    port_count: u32,
    /// RETA size - 1: the hash bits the NIC uses.
    class_mask: u16,
    /// Per RETA index, one bit: the entry is `owner_queue`.
    owned: Box<[u64]>,
    /// Per reply-tuple byte position and value: its part of the hash, masked.
    tables: Box<[[u16; 256]; REPLY_TUPLE_LEN]>,
    /// The LIPs' pools by slot. A slot keeps its LIP, and so its ports in use, while
    /// a service lists the LIP or a session still holds one of its ports; a
    /// [`LaddrSet`] names LIPs by slot.
    laddrs: Vec<Option<LaddrPool>>,
    /// (LIP, slot), sorted by LIP: releases find a port's LIP by binary search.
    index: Vec<(u32, u32)>,
    /// How long the real servers keep a closed connection's tuple in TIME-WAIT, in
    /// milliseconds: a reuse sooner than this is counted as early.
    server_time_wait_ms: u32,
}

/// One service's local addresses in a worker's [`PortPool`], in the service's order,
/// and where its round robin over them stands. Made by [`PortPool::set_of`]; valid
/// until the pool's next [`PortPool::set_addresses`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LaddrSet {
    slots: Box<[u32]>,
    /// The LIP the next allocation tries first (round robin, as DPVS).
    next: usize,
    /// Allocations refused because no LIP had a suitable port.
    exhausted: u64,
    /// The LIP [`PortPool::find_held`] searches first next time.
    held_next: usize,
}

impl LaddrSet {
    /// Allocations refused because none of the set's LIPs had a suitable port.
    pub fn exhausted(&self) -> u64 {
        self.exhausted
    }

    /// Takes over `old`'s round-robin position and refusal count: the same service in
    /// a new snapshot goes on where it was.
    pub fn continue_from(&mut self, old: &LaddrSet) {
        self.next = match self.slots.len() {
            0 => 0,
            n => old.next % n,
        };
        self.exhausted = old.exhausted;
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }
}

impl PortPool {
    /// The pool of the worker receiving replies on `owner_queue`, for the local ports
    /// in `ports` (not including 0), given the key, RETA and hash fields of the NIC
    /// port the replies arrive on; no LIP yet ([`PortPool::set_addresses`]).
    pub fn new(
        ports: RangeInclusive<u16>,
        toeplitz: &Toeplitz,
        reta: &Reta,
        fields: HashFields,
        owner_queue: u16,
    ) -> Result<PortPool, PoolError> {
        let (first, last) = (*ports.start(), *ports.end());
        if first == 0 || first > last {
            return Err(PoolError::PortRange { first, last });
        }
        let size = reta.size();
        if !size.is_power_of_two() {
            return Err(PoolError::RetaSize(size));
        }
        // Reta guarantees size <= 65 536, so the mask fits 16 bits.
        let class_mask = (size - 1) as u16;

        let mut tables = Box::new([[0u16; 256]; REPLY_TUPLE_LEN]);
        for (position, table) in tables.iter_mut().enumerate() {
            if fields == HashFields::L3 && position >= RPORT_AT {
                continue; // ports are not hashed: they contribute nothing
            }
            for (value, entry) in table.iter_mut().enumerate() {
                let part = toeplitz
                    .byte_contribution(position, value as u8)
                    .unwrap_or(0);
                *entry = (part & class_mask as u32) as u16;
            }
        }

        let mut pool = PortPool {
            owner_queue,
            fields,
            first_port: first,
            port_count: (last - first) as u32 + 1,
            class_mask,
            owned: vec![0u64; size.div_ceil(64)].into_boxed_slice(),
            tables,
            laddrs: Vec::new(),
            index: Vec::new(),
            server_time_wait_ms: DEFAULT_SERVER_TIME_WAIT_MS,
        };
        pool.set_reta(reta)?;
        Ok(pool)
    }

    /// [`PortPool::new`] with the LIPs `lips`, and the set of all of them in that
    /// order. Every port of every LIP starts free.
    pub fn build(
        lips: &[Ipv4Addr],
        ports: RangeInclusive<u16>,
        toeplitz: &Toeplitz,
        reta: &Reta,
        fields: HashFields,
        owner_queue: u16,
    ) -> Result<(PortPool, LaddrSet), PoolError> {
        let mut pool = PortPool::new(ports, toeplitz, reta, fields, owner_queue)?;
        // Refused before anything is built: no LIP, or one twice.
        pool.check_list(lips)?;
        pool.laddrs.reserve_exact(lips.len());
        pool.index.reserve_exact(lips.len());
        pool.set_addresses(lips.iter().copied(), 0);
        let set = pool.set_of(lips)?;
        Ok((pool, set))
    }

    fn check_list(&self, lips: &[Ipv4Addr]) -> Result<(), PoolError> {
        if lips.is_empty() {
            return Err(PoolError::NoLocalAddress);
        }
        for (i, &lip) in lips.iter().enumerate() {
            if lips[..i].contains(&lip) {
                return Err(PoolError::DuplicateLocalAddress(lip));
            }
        }
        Ok(())
    }

    /// A new LIP's pool: every port free, in ascending order within its class.
    fn new_laddr(&self, lip: Ipv4Addr) -> LaddrPool {
        let size = self.class_mask as usize + 1;
        let count = self.port_count as usize;
        let mut laddr = LaddrPool {
            lip,
            lip_part: self.lip_part(lip),
            listed: true,
            head: vec![NIL; size].into_boxed_slice(),
            tail: vec![NIL; size].into_boxed_slice(),
            next: vec![NIL; count].into_boxed_slice(),
            in_use: vec![0u64; count.div_ceil(64)].into_boxed_slice(),
            released_at: vec![0u32; count].into_boxed_slice(),
            released_to: vec![0u32; count].into_boxed_slice(),
            serving_port: vec![0u16; count].into_boxed_slice(),
            last_release: None,
            nonempty: vec![0u64; self.owned.len()].into_boxed_slice(),
            rotor: 0,
            held_rotor: 0,
            used: 0,
            misses: 0,
            early_reuses: 0,
            unprotected_reuses: 0,
        };
        for offset in 0..count as u16 {
            let class = self.port_class(self.first_port + offset) as usize;
            laddr.push_tail(class, offset);
        }
        laddr
    }

    /// Makes the pool's LIPs those of `lips` (the local addresses of every service,
    /// in any order, repeats allowed): a LIP already here keeps its state (ports in
    /// use, free-list order, counters), whichever services list it now; a new one
    /// starts with every port free. A LIP no longer listed stays while its sessions
    /// hold ports (their releases come back to it; nothing allocates from it) and
    /// for the real servers' TIME-WAIT after its last release
    /// ([`set_server_time_wait`](Self::set_server_time_wait)), so that listed again
    /// soon it still knows which ports a real server may hold; it goes at the first
    /// call at `now_ms` (the pool's millisecond clock) after both. Allocates
    /// (management-paced: on a new snapshot, never per packet); [`LaddrSet`]s made
    /// before are void.
    pub fn set_addresses(&mut self, lips: impl IntoIterator<Item = Ipv4Addr>, now_ms: u32) {
        let mut wanted: Vec<u32> = lips.into_iter().map(u32::from).collect();
        wanted.sort_unstable();
        wanted.dedup();
        let time_wait = self.server_time_wait_ms;
        for slot in &mut self.laddrs {
            if let Some(laddr) = slot {
                laddr.listed = wanted.binary_search(&u32::from(laddr.lip)).is_ok();
                let waited = laddr
                    .last_release
                    .is_none_or(|at| now_ms.wrapping_sub(at) >= time_wait);
                if !laddr.listed && laddr.used == 0 && waited {
                    *slot = None;
                }
            }
        }
        while matches!(self.laddrs.last(), Some(None)) {
            self.laddrs.pop();
        }
        self.rebuild_index();
        let mut free = 0;
        for &lip in &wanted {
            let lip = Ipv4Addr::from(lip);
            if self.slot_of(lip).is_some() {
                continue;
            }
            let laddr = self.new_laddr(lip);
            while free < self.laddrs.len() && self.laddrs[free].is_some() {
                free += 1;
            }
            match self.laddrs.get_mut(free) {
                Some(slot) => *slot = Some(laddr),
                None => self.laddrs.push(Some(laddr)),
            }
        }
        self.rebuild_index();
    }

    fn rebuild_index(&mut self) {
        self.index.clear();
        self.index.extend(
            self.laddrs
                .iter()
                .enumerate()
                .filter_map(|(slot, l)| l.as_ref().map(|l| (u32::from(l.lip), slot as u32))),
        );
        self.index.sort_unstable();
    }

    /// The slot of `lip`, if the pool has it.
    #[inline]
    fn slot_of(&self, lip: Ipv4Addr) -> Option<usize> {
        let lip = u32::from(lip);
        self.index
            .binary_search_by_key(&lip, |&(addr, _)| addr)
            .ok()
            .map(|i| self.index[i].1 as usize)
    }

    #[inline]
    fn laddr_mut(&mut self, lip: Ipv4Addr) -> Option<&mut LaddrPool> {
        let slot = self.slot_of(lip)?;
        self.laddrs[slot].as_mut()
    }

    /// The set of one service's LIPs `lips`, in its order, each already given to
    /// [`PortPool::set_addresses`].
    pub fn set_of(&self, lips: &[Ipv4Addr]) -> Result<LaddrSet, PoolError> {
        self.check_list(lips)?;
        let slots = lips
            .iter()
            .map(|&lip| {
                self.slot_of(lip)
                    .map(|slot| slot as u32)
                    .ok_or(PoolError::UnknownLocalAddress(lip))
            })
            .collect::<Result<Box<[u32]>, PoolError>>()?;
        Ok(LaddrSet {
            slots,
            next: 0,
            exhausted: 0,
            held_next: 0,
        })
    }

    /// Takes the new RETA (same size, e.g. after rebalancing queues): only the worker's
    /// owned entries change, free lists stay. No allocation.
    pub fn set_reta(&mut self, reta: &Reta) -> Result<(), PoolError> {
        let built = self.class_mask as usize + 1;
        if reta.size() != built {
            return Err(PoolError::RetaSizeChanged {
                built,
                given: reta.size(),
            });
        }
        if !reta.serves(self.owner_queue) {
            return Err(PoolError::QueueNotInReta(self.owner_queue));
        }
        self.owned.fill(0);
        for (index, &queue) in reta.entries().iter().enumerate() {
            if queue == self.owner_queue {
                self.owned[index / 64] |= 1 << (index % 64);
            }
        }
        Ok(())
    }

    fn lip_part(&self, lip: Ipv4Addr) -> u16 {
        lip.octets()
            .iter()
            .enumerate()
            .fold(0, |acc, (i, &b)| acc ^ self.tables[LIP_AT + i][b as usize])
    }

    /// The class of a local port: its part of the reply hash, masked.
    #[inline]
    fn port_class(&self, lport: u16) -> u16 {
        let [high, low] = lport.to_be_bytes();
        self.tables[LPORT_AT][high as usize] ^ self.tables[LPORT_AT + 1][low as usize]
    }

    /// The real server's part of the reply hash (without the LIP's), masked.
    #[inline]
    fn server_part(&self, rs: SocketAddrV4) -> u16 {
        let [a, b, c, d] = rs.ip().octets();
        let [p, q] = rs.port().to_be_bytes();
        let t = &self.tables;
        t[0][a as usize]
            ^ t[1][b as usize]
            ^ t[2][c as usize]
            ^ t[3][d as usize]
            ^ t[RPORT_AT][p as usize]
            ^ t[RPORT_AT + 1][q as usize]
    }

    /// A local address of `set` and a port for a new session towards the real server
    /// `rs` (`RIP:rport`), whose replies `rs -> LIP:lport` the NIC delivers to this
    /// worker's queue, at `now_ms` on the pool's clock. The set's LIPs are tried round
    /// robin; a LIP with no suitable free port counts a miss and the next is tried.
    /// `None` when no LIP can serve: the session is refused (counted in
    /// [`LaddrSet::exhausted`]). A port that served `rs`'s address less than the server
    /// TIME-WAIT ago counts an early reuse. A port taken here is in use for every
    /// service sharing its LIP.
    #[inline]
    pub fn allocate(
        &mut self,
        set: &mut LaddrSet,
        rs: SocketAddrV4,
        now_ms: u32,
    ) -> Option<LocalPort> {
        let server_part = self.server_part(rs);
        let count = set.slots.len();
        let mut index = set.next;
        for _ in 0..count {
            let slot = set.slots[index] as usize;
            index = if index + 1 == count { 0 } else { index + 1 };
            let Some(laddr) = self.laddrs.get_mut(slot).and_then(Option::as_mut) else {
                continue;
            };
            let context = server_part ^ laddr.lip_part;
            if let Some(offset) = laddr.take(context, &self.owned, self.class_mask) {
                set.next = index;
                let early_reuse = laddr.serve(offset, rs, now_ms, self.server_time_wait_ms);
                return Some(LocalPort {
                    lip: laddr.lip,
                    port: self.first_port + offset,
                    early_reuse,
                });
            }
            laddr.misses += 1;
        }
        set.exhausted += 1;
        None
    }

    /// Goes through the ports of `set`'s LIPs this worker holds towards `rs` (its
    /// sessions to that real server address and port, synced ones included) whose
    /// replies from `rs` the NIC gives back to it, offering each to `take` until
    /// it takes one, which is returned. Offers at most `max_offers` ports, and looks
    /// at no more than `max_scan` ports in use in all (ports held towards other real
    /// servers included). Each search starts at the set's next LIP, and each LIP's
    /// search goes on right after the last port it looked at, so successive searches
    /// go round every port in use of every LIP. For when an allocation towards `rs`
    /// has just failed (`take` then ends the port's session if it may go, and the
    /// port, whose reply from `rs` comes back to this worker, is free for `rs`);
    /// never on an established packet's path.
    pub fn find_held(
        &mut self,
        set: &mut LaddrSet,
        rs: SocketAddrV4,
        max_offers: usize,
        max_scan: usize,
        mut take: impl FnMut(Ipv4Addr, u16) -> bool,
    ) -> Option<(Ipv4Addr, u16)> {
        let (rip, rport) = (u32::from(*rs.ip()), rs.port());
        let server_part = self.server_part(rs);
        let (mut offers, mut scanned) = (0, 0);
        let count = set.slots.len();
        let first = set.held_next % count.max(1);
        set.held_next = first + 1;
        for i in 0..count {
            let slot = set.slots[(first + i) % count] as usize;
            let Some(laddr) = self.laddrs.get(slot).and_then(Option::as_ref) else {
                continue;
            };
            let context = server_part ^ laddr.lip_part;
            let mut at = laddr.held_rotor % self.port_count;
            let mut remaining = self.port_count;
            let mut taken = None;
            while remaining > 0 && scanned < max_scan && offers < max_offers {
                // The rest of `at`'s bitmap word, not past the end of the range.
                let word = laddr.in_use[at as usize / 64] >> (at % 64);
                let span = (64 - at % 64).min(self.port_count - at).min(remaining);
                let bits = if span == 64 {
                    word
                } else {
                    word & ((1 << span) - 1)
                };
                if bits == 0 {
                    remaining -= span;
                    at = (at + span) % self.port_count;
                    continue;
                }
                let offset = at + bits.trailing_zeros();
                remaining -= bits.trailing_zeros() + 1;
                at = (offset + 1) % self.port_count;
                scanned += 1;
                let i = offset as usize;
                let port = self.first_port + offset as u16;
                // Reserved for a synced session, a port serving `rs` may reply to
                // another worker (an RSS view other than the active's).
                let class = (self.port_class(port) ^ context) as usize;
                let ours = self.owned[class / 64] & (1 << (class % 64)) != 0;
                if laddr.released_to[i] == rip && laddr.serving_port[i] == rport && ours {
                    offers += 1;
                    if take(laddr.lip, port) {
                        taken = Some((laddr.lip, port));
                        break;
                    }
                }
            }
            if let Some(laddr) = self.laddrs.get_mut(slot).and_then(Option::as_mut) {
                laddr.held_rotor = at;
            }
            if taken.is_some() || scanned >= max_scan || offers >= max_offers {
                return taken;
            }
        }
        None
    }

    /// Counts an early reuse on `lip` whose session cannot prove itself newer to the
    /// real server (its client sent no TCP timestamps, or rewriting them is off).
    pub fn count_unprotected_reuse(&mut self, lip: Ipv4Addr) {
        if let Some(laddr) = self.laddr_mut(lip) {
            laddr.unprotected_reuses += 1;
        }
    }

    /// How long the real servers keep a closed connection in TIME-WAIT (Linux: 60 s,
    /// the default): reuses sooner than this towards the same server count as early.
    pub fn set_server_time_wait(&mut self, ms: u32) {
        self.server_time_wait_ms = ms;
    }

    /// Like [`PortPool::allocate`] on one given LIP only (`None` also when `lip` is not
    /// the pool's; a miss is counted only for a LIP of the pool).
    #[inline]
    pub fn allocate_on(&mut self, lip: Ipv4Addr, rs: SocketAddrV4, now_ms: u32) -> Option<u16> {
        let server_part = self.server_part(rs);
        let time_wait = self.server_time_wait_ms;
        let slot = self.slot_of(lip)?;
        let laddr = self.laddrs[slot].as_mut()?;
        let context = server_part ^ laddr.lip_part;
        match laddr.take(context, &self.owned, self.class_mask) {
            Some(offset) => {
                laddr.serve(offset, rs, now_ms, time_wait);
                Some(self.first_port + offset)
            }
            None => {
                laddr.misses += 1;
                None
            }
        }
    }

    /// Returns a port to its LIP's pool when its session towards the real server
    /// address `rs` ends, at `now_ms`, whichever service the session was of. The port
    /// goes to the tail of its list (reused last).
    #[inline]
    pub fn release(
        &mut self,
        lip: Ipv4Addr,
        lport: u16,
        rs: Ipv4Addr,
        now_ms: u32,
    ) -> Result<(), ReleaseError> {
        let offset = self.offset(lport).ok_or(ReleaseError::PortOutOfRange)?;
        let class = self.port_class(lport) as usize;
        let laddr = self.laddr_mut(lip).ok_or(ReleaseError::UnknownAddress)?;
        if !laddr.in_use(offset) {
            return Err(ReleaseError::NotInUse);
        }
        laddr.in_use[offset as usize / 64] &= !(1 << (offset % 64));
        laddr.used -= 1;
        laddr.released_at[offset as usize] = now_ms;
        laddr.released_to[offset as usize] = u32::from(rs);
        laddr.serving_port[offset as usize] = 0;
        laddr.last_release = Some(now_ms);
        laddr.push_tail(class, offset);
        Ok(())
    }

    /// The offset of `lport` in the pool's range.
    #[inline]
    fn offset(&self, lport: u16) -> Option<u16> {
        lport
            .checked_sub(self.first_port)
            .filter(|&offset| (offset as u32) < self.port_count)
    }

    /// Marks `lport` on `lip` as in use towards the real server `rs` without
    /// allocating it: a session synced from the active node brings its own local
    /// port, which this worker must not hand out again (to any service sharing the
    /// LIP). False when the port is not the pool's or already in use. Walks the
    /// port's free list (management-paced, never on the per-packet path).
    pub fn reserve(&mut self, lip: Ipv4Addr, lport: u16, rs: SocketAddrV4) -> bool {
        let Some(offset) = self.offset(lport) else {
            return false;
        };
        let class = self.port_class(lport) as usize;
        let Some(laddr) = self.laddr_mut(lip) else {
            return false;
        };
        if laddr.in_use(offset) {
            return false;
        }
        // Unlink `offset` from its class's free list.
        let mut prev = NIL;
        let mut at = laddr.head[class];
        while at != NIL && at != offset {
            prev = at;
            at = laddr.next[at as usize];
        }
        if at == NIL {
            return false;
        }
        let next = laddr.next[offset as usize];
        if prev == NIL {
            laddr.head[class] = next;
        } else {
            laddr.next[prev as usize] = next;
        }
        if laddr.tail[class] == offset {
            laddr.tail[class] = prev;
        }
        if laddr.head[class] == NIL {
            laddr.nonempty[class / 64] &= !(1 << (class % 64));
        }
        laddr.next[offset as usize] = NIL;
        laddr.in_use[offset as usize / 64] |= 1 << (offset % 64);
        laddr.released_to[offset as usize] = u32::from(*rs.ip());
        laddr.serving_port[offset as usize] = rs.port();
        laddr.used += 1;
        true
    }

    /// Whether `lport` on `lip` is allocated on this worker.
    pub fn is_in_use(&self, lip: Ipv4Addr, lport: u16) -> bool {
        let Some(offset) = self.offset(lport) else {
            return false;
        };
        self.slot_of(lip)
            .and_then(|slot| self.laddrs[slot].as_ref())
            .is_some_and(|laddr| laddr.in_use(offset))
    }

    fn counters_of(&self, laddr: &LaddrPool) -> LaddrCounters {
        LaddrCounters {
            lip: laddr.lip,
            used: laddr.used,
            free: self.port_count - laddr.used,
            misses: laddr.misses,
            early_reuses: laddr.early_reuses,
            unprotected_reuses: laddr.unprotected_reuses,
        }
    }

    /// Per-LIP state, by slot (for a pool from [`PortPool::build`], in the order the
    /// LIPs were given). A LIP no service lists any more is among them while its
    /// sessions hold ports.
    pub fn counters(&self) -> impl Iterator<Item = LaddrCounters> + '_ {
        self.counters_from(0).map(|(_, counters)| counters)
    }

    /// [`PortPool::counters`] from slot `from` on, each with its slot: a listing in
    /// chunks goes on from the slot after the last one it got.
    pub fn counters_from(&self, from: usize) -> impl Iterator<Item = (usize, LaddrCounters)> + '_ {
        self.laddrs
            .iter()
            .enumerate()
            .skip(from)
            .filter_map(|(slot, l)| l.as_ref().map(|l| (slot, self.counters_of(l))))
    }

    /// The per-LIP state of the LIPs of `set`, in its order.
    pub fn counters_of_set<'a>(
        &'a self,
        set: &'a LaddrSet,
    ) -> impl Iterator<Item = LaddrCounters> + 'a {
        set.slots
            .iter()
            .filter_map(|&slot| self.laddrs.get(slot as usize)?.as_ref())
            .map(|l| self.counters_of(l))
    }

    /// The pool's LIPs, by slot; those no service lists any more (kept while their
    /// sessions hold ports) included.
    pub fn lips(&self) -> impl Iterator<Item = Ipv4Addr> + '_ {
        self.laddrs.iter().flatten().map(|laddr| laddr.lip)
    }

    /// Whether `lip` is one of the addresses of the last
    /// [`PortPool::set_addresses`] (false for one kept only for its sessions).
    pub fn is_listed(&self, lip: Ipv4Addr) -> bool {
        self.slot_of(lip)
            .and_then(|slot| self.laddrs[slot].as_ref())
            .is_some_and(|laddr| laddr.listed)
    }

    pub fn port_range(&self) -> RangeInclusive<u16> {
        self.first_port..=(self.first_port as u32 + self.port_count - 1) as u16
    }

    pub fn owner_queue(&self) -> u16 {
        self.owner_queue
    }

    pub fn fields(&self) -> HashFields {
        self.fields
    }

    /// Bytes the pool occupies, its heap parts included.
    pub fn memory_bytes(&self) -> usize {
        let words = |slice: &[u64]| core::mem::size_of_val(slice);
        let halves = |slice: &[u16]| core::mem::size_of_val(slice);
        core::mem::size_of::<Self>()
            + core::mem::size_of_val(&*self.tables)
            + words(&self.owned)
            + self.laddrs.capacity() * core::mem::size_of::<Option<LaddrPool>>()
            + self.index.capacity() * core::mem::size_of::<(u32, u32)>()
            + self
                .laddrs
                .iter()
                .flatten()
                .map(|laddr| {
                    halves(&laddr.head)
                        + halves(&laddr.tail)
                        + halves(&laddr.next)
                        + words(&laddr.in_use)
                        + words(&laddr.nonempty)
                        + core::mem::size_of_val(&*laddr.released_at)
                        + core::mem::size_of_val(&*laddr.released_to)
                        + core::mem::size_of_val(&*laddr.serving_port)
                })
                .sum::<usize>()
    }

    /// [`memory_bytes`](Self::memory_bytes) of a worker's pool of `lips` distinct
    /// local addresses (over all services: a LIP shared by several services counts
    /// once) with `ports` ports each, built for a redirection table of `reta_size`
    /// entries: known before the pool is built (start-up checks it against the memory
    /// available).
    pub fn bytes_for(lips: usize, ports: usize, reta_size: usize) -> usize {
        let words = reta_size.div_ceil(64) * 8;
        let per_lip = 2 * reta_size * 2 // head, tail
            + ports * 2 // next
            + ports.div_ceil(64) * 8 // in_use
            + ports * 10 // released_at, released_to, serving_port
            + words; // nonempty
        core::mem::size_of::<Self>()
            + REPLY_TUPLE_LEN * 256 * 2
            + words
            + lips
                * (core::mem::size_of::<Option<LaddrPool>>()
                    + core::mem::size_of::<(u32, u32)>()
                    + per_lip)
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::rss::{DEFAULT_RSS_KEY, SYMMETRIC_RSS_KEY};
    use crate::wire::test_util::XorShift;
    use std::collections::HashSet;

    /// A pool of one service's LIPs, and that service's set.
    struct One {
        pool: PortPool,
        set: LaddrSet,
    }

    impl One {
        fn allocate(&mut self, rs: SocketAddrV4, now_ms: u32) -> Option<LocalPort> {
            self.pool.allocate(&mut self.set, rs, now_ms)
        }

        fn exhausted(&self) -> u64 {
            self.set.exhausted()
        }
    }

    impl core::ops::Deref for One {
        type Target = PortPool;
        fn deref(&self) -> &PortPool {
            &self.pool
        }
    }

    impl core::ops::DerefMut for One {
        fn deref_mut(&mut self) -> &mut PortPool {
            &mut self.pool
        }
    }

    fn build(
        lips: &[Ipv4Addr],
        ports: RangeInclusive<u16>,
        toeplitz: &Toeplitz,
        reta: &Reta,
        fields: HashFields,
        owner_queue: u16,
    ) -> Result<One, PoolError> {
        let (pool, set) = PortPool::build(lips, ports, toeplitz, reta, fields, owner_queue)?;
        Ok(One { pool, set })
    }

    /// [`PortPool::allocate`] at time 0, as a pair.
    fn take(pool: &mut One, rs: SocketAddrV4) -> Option<(Ipv4Addr, u16)> {
        pool.allocate(rs, 0).map(|p| (p.lip, p.port))
    }

    const LIPS: [Ipv4Addr; 4] = [
        Ipv4Addr::new(10, 0, 0, 1),
        Ipv4Addr::new(10, 0, 0, 2),
        Ipv4Addr::new(10, 0, 0, 3),
        Ipv4Addr::new(10, 0, 0, 4),
    ];

    fn random_rs(rng: &mut XorShift) -> SocketAddrV4 {
        SocketAddrV4::new(Ipv4Addr::from(rng.next_u64() as u32), rng.next_u64() as u16)
    }

    /// The queue the NIC delivers the reply `rs -> lip:lport` to: the full hash, the
    /// real table, nothing from the pool.
    fn reply_queue(
        toeplitz: &Toeplitz,
        reta: &Reta,
        fields: HashFields,
        rs: SocketAddrV4,
        lip: Ipv4Addr,
        lport: u16,
    ) -> u16 {
        reta.queue(toeplitz.hash_tuple(fields, *rs.ip(), lip, rs.port(), lport))
    }

    fn pools(
        toeplitz: &Toeplitz,
        reta: &Reta,
        fields: HashFields,
        lips: &[Ipv4Addr],
        ports: RangeInclusive<u16>,
        workers: u16,
    ) -> Vec<One> {
        (0..workers)
            .map(|q| build(lips, ports.clone(), toeplitz, reta, fields, q).unwrap())
            .collect()
    }

    #[test]
    fn xor_permute_moves_every_bit() {
        let mut rng = XorShift(3);
        for _ in 0..200 {
            let x = rng.next_u64();
            let m = rng.below(64) as u32;
            let permuted = xor_permute(x, m);
            for i in 0..64 {
                assert_eq!((permuted >> i) & 1, (x >> (i ^ m as usize)) & 1);
            }
        }
    }

    /// Every port a worker gets, for random real servers, has its reply delivered to
    /// that worker by the full Toeplitz hash and the RETA: for several keys, table
    /// sizes (under and over 64), queue counts (3 is not a power of two), a weighted
    /// table, and address-only hashing.
    #[test]
    fn every_port_handed_out_hashes_to_its_worker() {
        let mut rng = XorShift(0x0dd_ba11);
        let weighted = Reta::from_entries((0..64).map(|i| [0, 0, 0, 1, 2][i % 5]).collect());
        let cases = [
            (
                DEFAULT_RSS_KEY,
                Reta::new_round_robin(128, 4).unwrap(),
                HashFields::L3L4,
            ),
            (
                DEFAULT_RSS_KEY,
                Reta::new_round_robin(512, 3).unwrap(),
                HashFields::L3L4,
            ),
            (
                SYMMETRIC_RSS_KEY,
                Reta::new_round_robin(16, 2).unwrap(),
                HashFields::L3L4,
            ),
            (DEFAULT_RSS_KEY, weighted.unwrap(), HashFields::L3L4),
            (
                DEFAULT_RSS_KEY,
                Reta::new_round_robin(128, 4).unwrap(),
                HashFields::L3,
            ),
        ];
        for (key, reta, fields) in cases {
            let toeplitz = Toeplitz::new(&key).unwrap();
            let workers = reta.entries().iter().max().unwrap() + 1;
            let mut pools = pools(&toeplitz, &reta, fields, &LIPS, 1024..=65535, workers);
            let mut handed = 0;
            for _ in 0..20_000 {
                let rs = random_rs(&mut rng);
                let q = rng.below(workers as usize);
                if let Some((lip, lport)) = take(&mut pools[q], rs) {
                    assert_eq!(
                        reply_queue(&toeplitz, &reta, fields, rs, lip, lport),
                        q as u16,
                        "{fields:?} worker {q}: {rs} -> {lip}:{lport}"
                    );
                    handed += 1;
                }
                if let Some(lport) = pools[q].allocate_on(LIPS[3], rs, 0) {
                    let queue = reply_queue(&toeplitz, &reta, fields, rs, LIPS[3], lport);
                    assert_eq!(queue, q as u16);
                }
            }
            // With ports hashed a worker always finds one; with addresses only, some
            // (RS, LIP) pairs belong to other workers and all four LIPs may fail.
            match fields {
                HashFields::L3L4 => assert_eq!(handed, 20_000),
                HashFields::L3 => assert!(handed > 10_000, "{handed}"),
            }
        }
    }

    /// Towards one real server the workers' ports partition the range: no port is
    /// handed out twice, and all workers together use every port.
    #[test]
    fn one_real_server_partitions_the_ports_among_workers() {
        let toeplitz = Toeplitz::new(&DEFAULT_RSS_KEY).unwrap();
        let reta = Reta::new_round_robin(128, 4).unwrap();
        let lips = [LIPS[0]];
        let ports = 20_000..=29_999u16;
        let mut pools = pools(&toeplitz, &reta, HashFields::L3L4, &lips, ports.clone(), 4);
        let rs = SocketAddrV4::new(Ipv4Addr::new(10, 0, 1, 11), 8080);
        let mut seen = HashSet::new();
        for (q, pool) in pools.iter_mut().enumerate() {
            let mut mine = 0;
            while let Some((lip, lport)) = take(pool, rs) {
                assert!(seen.insert(lport), "port {lport} handed out twice");
                assert_eq!(
                    reply_queue(&toeplitz, &reta, HashFields::L3L4, rs, lip, lport),
                    q as u16
                );
                mine += 1;
            }
            // About a quarter each: the port classes are spread evenly by the key.
            assert!((2000..3000).contains(&mine), "worker {q}: {mine}");
            assert_eq!(pool.exhausted(), 1);
            let counters = pool.counters().next().unwrap();
            assert_eq!((counters.used, counters.misses), (mine, 1));
            assert_eq!(counters.free, 10_000 - mine);
        }
        assert_eq!(seen.len(), 10_000);
        assert_eq!(seen, ports.collect::<HashSet<_>>());
    }

    #[test]
    fn a_reserved_port_is_never_handed_out_and_is_released_like_any_other() {
        let toeplitz = Toeplitz::new(&DEFAULT_RSS_KEY).unwrap();
        let reta = Reta::new_round_robin(128, 2).unwrap();
        let mut pool = build(
            &LIPS[..1],
            5000..=5999,
            &toeplitz,
            &reta,
            HashFields::L3L4,
            1,
        )
        .unwrap();
        let rs = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 9), 8080);
        let (lip, port) = take(&mut pool, rs).unwrap();
        pool.release(lip, port, Ipv4Addr::UNSPECIFIED, 0).unwrap();
        assert!(pool.reserve(lip, port, rs));
        assert!(!pool.reserve(lip, port, rs), "reserved twice");
        assert!(!pool.reserve(lip, 4000, rs), "not the pool's port");
        assert!(pool.is_in_use(lip, port));
        let mut handed = 0;
        while let Some(got) = take(&mut pool, rs) {
            assert_ne!(got, (lip, port));
            handed += 1;
        }
        assert!(handed > 0);
        // Held for a synced session towards `rs`, it is offered as the ports taken.
        let mut offered = HashSet::new();
        pool.pool
            .find_held(&mut pool.set, rs, usize::MAX, usize::MAX, |l, p| {
                offered.insert((l, p));
                false
            });
        assert_eq!(offered.len(), handed + 1);
        assert!(offered.contains(&(lip, port)));
        pool.release(lip, port, Ipv4Addr::UNSPECIFIED, 0).unwrap();
        assert_eq!(take(&mut pool, rs), Some((lip, port)), "free again");
    }

    #[test]
    fn reuse_towards_the_same_server_within_its_time_wait_is_counted() {
        let toeplitz = Toeplitz::new(&DEFAULT_RSS_KEY).unwrap();
        // One queue: every port suits every server, and a single port comes back.
        let reta = Reta::new_round_robin(128, 1).unwrap();
        let mut pool = build(
            &LIPS[..1],
            7000..=7000,
            &toeplitz,
            &reta,
            HashFields::L3L4,
            0,
        )
        .unwrap();
        pool.set_server_time_wait(60_000);
        let rs = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 9), 80);
        let other = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 10), 80);
        let first = pool.allocate(rs, 1_000).unwrap();
        assert!(!first.early_reuse, "never used before");
        assert_eq!(pool.allocate(rs, 1_000), None, "the only port is in use");
        pool.release(first.lip, first.port, *rs.ip(), 2_000)
            .unwrap();
        // 59.999 s after the release, towards the same server: early.
        let again = pool.allocate(rs, 61_999).unwrap();
        assert_eq!(
            (again.lip, again.port, again.early_reuse),
            (first.lip, 7000, true)
        );
        pool.count_unprotected_reuse(again.lip);
        pool.release(again.lip, again.port, *rs.ip(), 62_000)
            .unwrap();
        // Towards another server: another tuple, not early.
        assert!(!pool.allocate(other, 62_001).unwrap().early_reuse);
        pool.release(first.lip, 7000, *other.ip(), 62_002).unwrap();
        // Back to the first server a full TIME-WAIT after it last served it... but it
        // last served `other`, so that is what counts; and 60 s after: not early.
        assert!(!pool.allocate(rs, 62_003).unwrap().early_reuse);
        pool.release(first.lip, 7000, *rs.ip(), 70_000).unwrap();
        assert!(!pool.allocate(rs, 130_000).unwrap().early_reuse);
        pool.release(first.lip, 7000, *rs.ip(), u32::MAX - 5)
            .unwrap();
        // The clock wraps: 10 ms later is still early.
        assert!(pool.allocate(rs, 4).unwrap().early_reuse);
        let c: Vec<LaddrCounters> = pool.counters().collect();
        assert_eq!((c[0].early_reuses, c[0].unprotected_reuses), (2, 1));
    }

    #[test]
    fn no_port_twice_and_release_returns_it() {
        let toeplitz = Toeplitz::new(&DEFAULT_RSS_KEY).unwrap();
        let reta = Reta::new_round_robin(128, 2).unwrap();
        let mut pool = build(
            &LIPS[..2],
            5000..=5999,
            &toeplitz,
            &reta,
            HashFields::L3L4,
            1,
        )
        .unwrap();
        let mut rng = XorShift(17);
        let mut in_use = HashSet::new();
        // Many real servers: a worker can fill both LIPs completely. Near the end a
        // random real server may find none of the last ports usable: retry.
        for _ in 0..1_000_000 {
            if let Some(pair) = take(&mut pool, random_rs(&mut rng)) {
                assert!(in_use.insert(pair), "{pair:?} handed out twice");
                assert!(pool.is_in_use(pair.0, pair.1));
            }
            if in_use.len() == 2000 {
                break;
            }
        }
        assert_eq!(in_use.len(), 2000);
        assert!(pool.counters().all(|c| c.used == 1000 && c.free == 0));

        let (lip, lport) = *in_use.iter().next().unwrap();
        assert_eq!(pool.release(lip, lport, Ipv4Addr::UNSPECIFIED, 0), Ok(()));
        assert!(!pool.is_in_use(lip, lport));
        assert_eq!(
            pool.release(lip, lport, Ipv4Addr::UNSPECIFIED, 0),
            Err(ReleaseError::NotInUse)
        );
        assert_eq!(
            pool.release(Ipv4Addr::new(1, 2, 3, 4), lport, Ipv4Addr::UNSPECIFIED, 0),
            Err(ReleaseError::UnknownAddress)
        );
        assert_eq!(
            pool.release(lip, 4999, Ipv4Addr::UNSPECIFIED, 0),
            Err(ReleaseError::PortOutOfRange)
        );
        assert_eq!(
            pool.release(lip, 6000, Ipv4Addr::UNSPECIFIED, 0),
            Err(ReleaseError::PortOutOfRange)
        );
        // The one free port comes back, for a real server whose reply it serves.
        let again = loop {
            if let Some(pair) = take(&mut pool, random_rs(&mut rng)) {
                break pair;
            }
        };
        assert_eq!(again, (lip, lport));
    }

    #[test]
    fn released_ports_are_reused_last() {
        let toeplitz = Toeplitz::new(&DEFAULT_RSS_KEY).unwrap();
        let reta = Reta::new_round_robin(64, 1).unwrap();
        let mut pool = build(&LIPS[..1], 1..=4096, &toeplitz, &reta, HashFields::L3L4, 0).unwrap();
        let rs = SocketAddrV4::new(Ipv4Addr::new(192, 0, 2, 7), 443);
        let (lip, first) = take(&mut pool, rs).unwrap();
        pool.release(lip, first, Ipv4Addr::UNSPECIFIED, 0).unwrap();
        // Every other port goes out before the released one comes back.
        let mut order = Vec::new();
        while let Some((_, lport)) = take(&mut pool, rs) {
            order.push(lport);
        }
        assert_eq!(order.len(), 4096);
        // Its class's list is FIFO and allocations rotate over the 64 classes: it comes
        // back in the last round, after every class has given all its other ports.
        let position = order.iter().position(|&p| p == first).unwrap();
        assert!(position >= 4096 - 64, "reused at {position}");
        // Consecutive allocations rotate over the classes.
        let classes: HashSet<_> = order[..64].iter().map(|&p| pool.port_class(p)).collect();
        assert!(classes.len() >= 60, "{}", classes.len());
    }

    /// Once a worker has every port it may use towards a real server, the search for
    /// held ports offers exactly those (checked through the full hash and RETA), over
    /// two LIPs, in bounded steps that go on right after the last port looked at and
    /// wrap around; ports held towards another server (another address, or the same
    /// address on another port) are not offered; the port taken is returned, and
    /// releasing it makes the next allocation succeed.
    #[test]
    fn held_ports_offered_are_the_ones_serving_the_real_server() {
        let toeplitz = Toeplitz::new(&DEFAULT_RSS_KEY).unwrap();
        let reta = Reta::new_round_robin(128, 2).unwrap();
        let lips = [LIPS[0], LIPS[1]];
        let mut pool = build(&lips, 30000..=30299, &toeplitz, &reta, HashFields::L3L4, 1).unwrap();
        let rs = SocketAddrV4::new(Ipv4Addr::new(10, 0, 1, 11), 8080);
        let others = [
            SocketAddrV4::new(Ipv4Addr::new(10, 0, 1, 12), 9090),
            SocketAddrV4::new(*rs.ip(), 9090),
        ];
        let elsewhere: HashSet<_> = others
            .iter()
            .flat_map(|&other| {
                (0..50)
                    .filter_map(|_| take(&mut pool, other))
                    .collect::<Vec<_>>()
            })
            .collect();
        let mut mine = HashSet::new();
        while let Some(taken) = take(&mut pool, rs) {
            mine.insert(taken);
        }
        assert!(
            mine.len() > 50 && elsewhere.len() == 100,
            "{} {}",
            mine.len(),
            elsewhere.len()
        );
        for &(lip, port) in &mine {
            assert_eq!(
                reply_queue(&toeplitz, &reta, HashFields::L3L4, rs, lip, port),
                1
            );
        }
        let mut offered = Vec::new();
        for _ in 0..100 {
            let mut n = 0;
            let found = pool.pool.find_held(&mut pool.set, rs, 7, 64, |lip, port| {
                offered.push((lip, port));
                n += 1;
                false
            });
            assert_eq!(found, None);
            assert!(n <= 7, "{n}");
        }
        assert_eq!(offered.iter().copied().collect::<HashSet<_>>(), mine);
        // Each LIP's search goes on after the port it looked at last: one pass over a
        // LIP's held ports offers each once.
        let first_lip = offered[0].0;
        let on_first: Vec<_> = offered.iter().filter(|p| p.0 == first_lip).collect();
        let once = mine.iter().filter(|p| p.0 == first_lip).count();
        let pass: HashSet<_> = on_first[..once].iter().collect();
        assert_eq!(pass.len(), once, "a pass offers each port once");
        // The port taken is returned; freed, it is the one the pool hands out, and no
        // longer offered.
        let (lip, port) = *mine.iter().next().unwrap();
        let found = pool
            .pool
            .find_held(&mut pool.set, rs, usize::MAX, usize::MAX, |l, p| {
                (l, p) == (lip, port)
            });
        assert_eq!(found, Some((lip, port)));
        assert_eq!(take(&mut pool, rs), None);
        pool.release(lip, port, *rs.ip(), 0).unwrap();
        let mut after = HashSet::new();
        pool.pool
            .find_held(&mut pool.set, rs, usize::MAX, usize::MAX, |l, p| {
                after.insert((l, p));
                false
            });
        assert_eq!(after.len(), mine.len() - 1);
        assert!(!after.contains(&(lip, port)));
        assert_eq!(take(&mut pool, rs), Some((lip, port)));
        // Nothing held: nothing offered, whatever the budget.
        let mut empty = build(&lips, 30000..=30299, &toeplitz, &reta, HashFields::L3L4, 1).unwrap();
        let none = empty
            .pool
            .find_held(&mut empty.set, rs, usize::MAX, usize::MAX, |_, _| true);
        assert_eq!(none, None);
    }

    /// Exhaustion: 8 ports, 20 concurrent sessions; the sessions past the eighth are
    /// refused and counted, and ports released are handed out again.
    #[test]
    fn exhaustion_counts_misses_and_recovers() {
        let toeplitz = Toeplitz::new(&DEFAULT_RSS_KEY).unwrap();
        let reta = Reta::new_round_robin(128, 1).unwrap();
        let lip = LIPS[0];
        let mut pool = build(&[lip], 40000..=40007, &toeplitz, &reta, HashFields::L3L4, 0).unwrap();
        let rs = SocketAddrV4::new(Ipv4Addr::new(10, 0, 1, 11), 80);
        let results: Vec<_> = (0..20).map(|_| take(&mut pool, rs)).collect();
        let granted: Vec<_> = results.iter().flatten().copied().collect();
        assert_eq!(granted.len(), 8);
        assert!(results[8..].iter().all(Option::is_none));
        assert_eq!(
            pool.counters().next(),
            Some(LaddrCounters {
                lip,
                used: 8,
                free: 0,
                misses: 12,
                early_reuses: 0,
                unprotected_reuses: 0,
            })
        );
        assert_eq!(pool.exhausted(), 12);
        // Sessions expire: their ports come back and new sessions succeed.
        for &(lip, lport) in &granted[..3] {
            pool.release(lip, lport, Ipv4Addr::UNSPECIFIED, 0).unwrap();
        }
        for _ in 0..3 {
            assert!(take(&mut pool, rs).is_some());
        }
        assert_eq!(take(&mut pool, rs), None);
        let counters = pool.counters().next().unwrap();
        assert_eq!((counters.used, counters.free, counters.misses), (8, 0, 13));
    }

    #[test]
    fn set_reta_moves_ownership_without_rebuilding() {
        let toeplitz = Toeplitz::new(&DEFAULT_RSS_KEY).unwrap();
        let before = Reta::new_round_robin(128, 4).unwrap();
        let mut pool = build(&LIPS, 1024..=65535, &toeplitz, &before, HashFields::L3L4, 2).unwrap();
        // Queue 2 now owns every other entry.
        let after =
            Reta::from_entries((0..128).map(|i| if i % 2 == 0 { 2 } else { 0 }).collect()).unwrap();
        pool.set_reta(&after).unwrap();
        let mut rng = XorShift(8);
        for _ in 0..5000 {
            let rs = random_rs(&mut rng);
            let (lip, lport) = take(&mut pool, rs).unwrap();
            assert_eq!(
                reply_queue(&toeplitz, &after, HashFields::L3L4, rs, lip, lport),
                2
            );
        }
        assert_eq!(
            pool.set_reta(&Reta::new_round_robin(64, 4).unwrap()),
            Err(PoolError::RetaSizeChanged {
                built: 128,
                given: 64
            })
        );
        assert_eq!(
            pool.set_reta(&Reta::new_round_robin(128, 2).unwrap()),
            Err(PoolError::QueueNotInReta(2))
        );
    }

    #[test]
    fn build_errors() {
        let toeplitz = Toeplitz::new(&DEFAULT_RSS_KEY).unwrap();
        let reta = Reta::new_round_robin(128, 4).unwrap();
        let try_build = |lips: &[Ipv4Addr], ports, reta: &Reta, q| {
            build(lips, ports, &toeplitz, reta, HashFields::L3L4, q).map(|_| ())
        };
        assert_eq!(
            try_build(&[], 1..=2, &reta, 0),
            Err(PoolError::NoLocalAddress)
        );
        assert_eq!(
            try_build(&[LIPS[0], LIPS[1], LIPS[0]], 1..=2, &reta, 0),
            Err(PoolError::DuplicateLocalAddress(LIPS[0]))
        );
        assert_eq!(
            try_build(&LIPS, 0..=10, &reta, 0),
            Err(PoolError::PortRange { first: 0, last: 10 })
        );
        #[allow(clippy::reversed_empty_ranges)]
        let empty = 10..=9;
        assert_eq!(
            try_build(&LIPS, empty, &reta, 0),
            Err(PoolError::PortRange { first: 10, last: 9 })
        );
        let odd = Reta::new_round_robin(100, 4).unwrap();
        assert_eq!(
            try_build(&LIPS, 1..=2, &odd, 0),
            Err(PoolError::RetaSize(100))
        );
        assert_eq!(
            try_build(&LIPS, 1..=2, &reta, 4),
            Err(PoolError::QueueNotInReta(4))
        );
        assert!(PoolError::QueueNotInReta(4).to_string().contains("queue 4"));
        // The widest range: every port but 0.
        let toeplitz = Toeplitz::new(&DEFAULT_RSS_KEY).unwrap();
        let pool = build(&LIPS[..1], 1..=65535, &toeplitz, &reta, HashFields::L3L4, 3).unwrap();
        assert_eq!(pool.port_range(), 1..=65535);
        assert_eq!(pool.counters().next().unwrap().free, 65535);
        assert_eq!(pool.owner_queue(), 3);
        assert_eq!(pool.fields(), HashFields::L3L4);
        assert_eq!(pool.lips().collect::<Vec<_>>(), [LIPS[0]]);
    }

    #[test]
    fn memory_for_a_realistic_config() {
        let toeplitz = Toeplitz::new(&DEFAULT_RSS_KEY).unwrap();
        for reta_size in [128, 512] {
            let reta = Reta::new_round_robin(reta_size, 4).unwrap();
            let pools = pools(&toeplitz, &reta, HashFields::L3L4, &LIPS, 1024..=65535, 4);
            let per_worker = pools[0].memory_bytes();
            println!(
                "port pool, 4 LIPs x ports 1024..=65535, RETA {reta_size}: {per_worker} bytes \
                 per worker ({} KiB), {} bytes for 4 workers",
                per_worker / 1024,
                per_worker * 4
            );
            assert!(pools.iter().all(|p| p.memory_bytes() == per_worker));
            assert_eq!(
                PortPool::bytes_for(LIPS.len(), 65535 - 1024 + 1, reta_size),
                per_worker
            );
            // Two bytes of link, a bit, eight bytes of last use and two of the real
            // server port served per port, four bytes per class, per LIP.
            let floor = 4 * (64_512 * (2 + 8 + 2) + 64_512 / 8 + reta_size * 4);
            assert!(per_worker >= floor && per_worker < floor + 16 * 1024);
            let expected = match reta_size {
                128 => 3_137_960,
                _ => 3_144_344,
            };
            assert_eq!(per_worker, expected, "update the module doc");
        }
    }

    /// Random allocations and releases, valid and bogus, with random real servers on
    /// several table sizes: nothing panics and the counters stay consistent with an
    /// independent model.
    #[test]
    fn fuzz_never_panics_and_counts_stay_consistent() {
        let toeplitz = Toeplitz::new(&DEFAULT_RSS_KEY).unwrap();
        let mut rng = XorShift(0xc0ff_ee00_1234_5678);
        for (size, queues, ports) in [
            (128, 4, 1..=300u16),
            (8, 3, 65000..=65535),
            (1024, 2, 7..=7),
        ] {
            let reta = Reta::new_round_robin(size, queues).unwrap();
            let q = rng.below(queues as usize) as u16;
            let mut pool = build(
                &LIPS[..3],
                ports.clone(),
                &toeplitz,
                &reta,
                HashFields::L3L4,
                q,
            )
            .unwrap();
            let mut model: HashSet<(Ipv4Addr, u16)> = HashSet::new();
            for _ in 0..50_000 {
                match rng.below(4) {
                    0 | 1 => {
                        let rs = random_rs(&mut rng);
                        if let Some(pair) = take(&mut pool, rs) {
                            assert!(model.insert(pair));
                            assert!(ports.contains(&pair.1));
                            let queue =
                                reply_queue(&toeplitz, &reta, HashFields::L3L4, rs, pair.0, pair.1);
                            assert_eq!(queue, q);
                        }
                    }
                    2 => {
                        if let Some(&pair) = model.iter().next() {
                            assert_eq!(
                                pool.release(pair.0, pair.1, Ipv4Addr::UNSPECIFIED, 0),
                                Ok(())
                            );
                            model.remove(&pair);
                        }
                    }
                    _ => {
                        let lip = if rng.below(2) == 0 {
                            LIPS[rng.below(4)]
                        } else {
                            Ipv4Addr::from(rng.next_u64() as u32)
                        };
                        let lport = rng.next_u64() as u16;
                        let expected = model.remove(&(lip, lport));
                        assert_eq!(
                            pool.release(lip, lport, Ipv4Addr::UNSPECIFIED, 0).is_ok(),
                            expected
                        );
                    }
                }
            }
            let used: u32 = pool.counters().map(|c| c.used).sum();
            assert_eq!(used as usize, model.len());
            let count = ports.len() as u32;
            assert!(pool.counters().all(|c| c.used + c.free == count));
        }
    }

    /// A local address a reload drops from every service while a real server may still
    /// hold one of its tuples in TIME-WAIT is kept: added back, its port towards that
    /// server counts as an early reuse, as if it had stayed. A full TIME-WAIT after
    /// its last release (and no port in use), it goes.
    #[test]
    fn an_address_dropped_and_added_back_within_time_wait_keeps_its_history() {
        let toeplitz = Toeplitz::new(&DEFAULT_RSS_KEY).unwrap();
        let reta = Reta::new_round_robin(128, 1).unwrap();
        let mut one = build(
            &LIPS[..2],
            7000..=7000,
            &toeplitz,
            &reta,
            HashFields::L3L4,
            0,
        )
        .unwrap();
        let pool = &mut one.pool;
        pool.set_server_time_wait(60_000);
        let (kept, lip) = (LIPS[0], LIPS[1]);
        let rs = SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 9), 80);
        let port = pool.allocate_on(lip, rs, 1_000).unwrap();
        pool.release(lip, port, *rs.ip(), 2_000).unwrap();
        pool.set_addresses([kept], 3_000);
        pool.set_addresses([kept, lip], 4_000);
        assert_eq!(pool.allocate_on(lip, rs, 5_000), Some(port));
        let row = |pool: &PortPool| pool.counters().find(|c| c.lip == lip);
        assert_eq!(row(pool).map(|c| c.early_reuses), Some(1));
        pool.release(lip, port, *rs.ip(), 6_000).unwrap();
        pool.set_addresses([kept], 65_999);
        assert!(row(pool).is_some(), "within TIME-WAIT of the last release");
        pool.set_addresses([kept], 66_000);
        assert!(row(pool).is_none(), "a full TIME-WAIT after: gone");
    }
}
