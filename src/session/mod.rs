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
//! **One map, both directions.** NAT and FullNAT replies must find the session from
//! the real server's side, so a session can have two keys: the client's 5-tuple and
//! the reply 5-tuple. Both go into the same hashbrown map, whose value is the slab
//! index shifted left by one with the key's direction in bit 0. One probe then answers
//! both "which session" and "which way is this packet going" (which decides the
//! rewrite and the transition table), one map is preallocated instead of two, and a DR
//! or TUN session, which has no reply key, costs one map entry instead of two.
//!
//! **One cache line per session.** Entries are `#[repr(C, align(64))]`, 64 bytes,
//! preallocated in a slab and recycled through a free list threaded through their
//! timer links. The keys a session is filed under are kept in a separate, cold array:
//! they are read only to remove the session, so they do not dilute the hot line.
//! Entries are IPv4-only today; see [`Session`] for how IPv6 fits.
//!
//! **Expiry without scanning, with lazy re-arming.** Each worker drives a timer wheel
//! with its own tick. Every packet pushes its session's deadline back, so the update
//! must be cheap: it only writes the new deadline into the entry. The entry stays in
//! the slot it was filed in, which the wheel reaches no later than the old deadline;
//! the wheel then either expires it or files it again under its current deadline. An
//! idle established session is therefore looked at once per revolution instead of a
//! list being edited on every packet. Shortening a deadline (FIN, RST) refiles at once.
//! Expiry work is bounded per call ([`SessionTable::expire`]'s budget) so a burst of
//! timeouts never stalls the packet loop.
//!
//! # Memory per session
//!
//! At `SessionTable::with_capacity(1_000_000)` with IPv4 keys: 64 bytes of entry, 32
//! of keys (client key and optional reply key), and the map: room for two keys per
//! session with the buckets at most half full, i.e. 4 Mi buckets of 21 bytes (a 20-byte
//! `(FlowKey4, u32)` and a control byte), 88 bytes per session. About 184 bytes per
//! session in all, allocated once; [`SessionTable::memory_bytes`] computes it.
//!
//! hashbrown marks some removed buckets as tombstones, and cleans them up in place
//! (no allocation, but one pass over the map) when they have used up its spare room.
//! With the buckets at most half full that is rare, and the map could only grow if,
//! at that very moment, more live keys than 1.75 per session of capacity were in it:
//! a nearly full table of mostly NAT sessions.
pub mod hugemem;
pub mod index;
pub mod persist;
pub mod replication;
pub mod state;
pub mod table;
pub mod timeouts;
pub mod timer;

pub use index::KeyHash;
pub use state::{is_active, ActivityChange, Direction, TcpEvent, TcpState, Transition};
pub use table::{
    HashedKey, InsertError, Session, SessionFlags, SessionId, SessionTable, TableAllocError,
    DEFAULT_WHEEL_SLOTS, MAX_CAPACITY,
};
pub use timeouts::{TickTimeouts, Timeouts, MAX_TIMEOUT_SECS};
pub use timer::{Advance, TimerWheel};

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
