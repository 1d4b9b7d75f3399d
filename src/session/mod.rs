//! Sessions: one table per worker, holding every connection the worker forwards.
//!
//! The packet path asks three things of it, for millions of connections and without
//! allocating or locking: which session does this packet belong to, how does it move
//! the connection's state, and when does an idle session go away.
//!
//! - [`state`]: the TCP state machine of Linux IPVS (three transition tables: from the
//!   client, from the real server, and client-only for DR and TUN) and the
//!   active/inactive classification behind `ipvsadm -Ln`'s ActiveConn/InActConn.
//! - [`timeouts`]: per-state timeouts with the IPVS defaults and `ipvsadm --set`.
//! - [`timer`]: a hashed timer wheel whose links live inside the entries.
//! - [`table`]: the slab of entries, the key map, and the wheel, put together.
//!
//! # Design
//!
//! **One index, both directions, no keys in it.** NAT and FullNAT replies must find the
//! session from the real server's side, so a session can have two keys: the client's
//! 5-tuple and the reply 5-tuple. Both go into one index ([`index`]), whose value is
//! the slab index shifted left by one with the key's direction in bit 0. One probe then
//! answers both "which session" and "which way is this packet going" (which decides the
//! rewrite and the transition table), and a DR or TUN session, which has no reply key,
//! costs one index slot instead of two. The index stores a 16-bit tag of the key's
//! hash beside each value, never the key: the entry holds both tuples already
//! ([`Session::in_key`], [`Session::reply_key`]), so the lookup checks the candidate
//! entry it has to read anyway, and the table derives both keys from the session it
//! inserts or removes (no key array to keep in step).
//!
//! **Hashed once, prefetched in stages.** A packet's key is hashed once
//! ([`HashedKey`]); the burst's first pass loads every bucket, the second every entry a
//! bucket names, and the lookup and a miss's insert reuse the hash.
//!
//! **One cache line per session.** Entries are `#[repr(C, align(64))]`, 64 bytes,
//! preallocated in a slab and recycled through a free list threaded through their
//! timer links; an insert starts loading the next free entry for the next insert.
//! Entries are IPv4-only today; see [`Session`] for how IPv6 fits (the index is
//! key-agnostic and serves an IPv6 slab as it is).
//!
//! **Expiry without scanning, with lazy re-arming.** Each worker drives a timer wheel
//! with its own tick. Every packet pushes its session's deadline back, so the update
//! must be cheap: it only writes the new deadline into the entry. The entry stays in
//! the slot it was filed in, which the wheel reaches no later than the old deadline;
//! the wheel then either expires it or files it again under its current deadline. An
//! idle established session is therefore looked at once per revolution instead of a
//! list being edited on every packet. Shortening a deadline (FIN, RST) refiles at once.
//! Expiry work is bounded per call ([`SessionTable::expire`]'s budget) so a burst of
//! timeouts never stalls the packet loop. Each expired session's keys sit in random
//! buckets: the table prefetches them and takes the keys out a few sessions later.
//!
//! # Memory per session
//!
//! At `SessionTable::with_capacity(1_000_000)`: 64 bytes of entry, the index (room
//! for two keys per session at 80 % of its slots, 2.5 M slots in 312,500 buckets of 64
//! bytes, 20 bytes per session), and 4 bytes of creation order ([`reclaim`]). 88 bytes
//! per session in all, allocated and written
//! once, by the thread that makes the table (so on its NUMA node: workers make their
//! own). [`SessionTable::memory_bytes`] sums the sizes;
//! [`SessionTable::resident_bytes`] measures the pages the kernel has resident, and a
//! test holds it to 96 bytes per session with a full table of NAT sessions.
//!
//! The index never needs cleaning: removals leave no tombstones (see [`index`]), and it
//! refuses keys past its sizing, so a full table costs no more to search than the
//! sizing allows.
pub mod hugemem;
pub mod index;
pub mod persist;
pub mod reclaim;
pub mod replication;
pub mod state;
pub mod table;
pub mod table6;
pub mod timeouts;
pub mod timer;

pub use index::KeyHash;
pub use state::{is_active, ActivityChange, Direction, TcpEvent, TcpState, Transition};
pub use table::{
    ClientSegment, HashedKey, InsertError, OutOfWindow, SeqMark, Session, SessionFlags, SessionId,
    SessionTable, TableAllocError, CLIENT_SEQ_WINDOW, DEFAULT_WHEEL_SLOTS, MAX_CAPACITY,
    SEQ_MARK_GRAIN,
};
pub use timeouts::{TickTimeouts, Timeouts, MAX_TIMEOUT_SECS};
pub use timer::{Advance, TimerWheel};

/// Starts loading every cache line `value` spans (an entry wider than a line, or one
/// that straddles two).
#[inline(always)]
pub fn prefetch_lines<T>(value: &T) {
    let start = value as *const T as usize;
    let end = start + std::mem::size_of::<T>();
    let mut line = start & !63;
    while line < end {
        // SAFETY: a prefetch reads nothing architecturally visible and cannot fault,
        // whatever the address; these lines hold `value`.
        unsafe {
            core::arch::x86_64::_mm_prefetch(line as *const i8, core::arch::x86_64::_MM_HINT_T0)
        };
        line += 64;
    }
}

/// Starts loading the cache line of `value` (a hint: it cannot fault or change state).
#[inline(always)]
pub fn prefetch_line<T>(value: &T) {
    // SAFETY: a prefetch of a valid reference's address reads nothing architecturally
    // visible and cannot fault.
    unsafe {
        core::arch::x86_64::_mm_prefetch(
            value as *const T as *const i8,
            core::arch::x86_64::_MM_HINT_T0,
        )
    };
}
