//! The SYN proxy's queue of client segments waiting for their real server
//! (`dataplane::awaiting`), on real mbufs: what it takes (room, at most `PER_SESSION`
//! frames a session, never the same sequence number twice), what it lets go (copies for the
//! SYN first, then, oldest first, the frames of sessions no longer waiting on the
//! port asked), what it drops (past the hold time), and that every mbuf returns to
//! the pool.
//! One test function only: the EAL initialises once per process.
mod common;

use common::eal::eal_args;
use sluice::dataplane::awaiting::{AwaitServer, Awaiting, Released, Wait, PER_SESSION};
use sluice::dpdk::{Burst, Eal, Mempool, BURST_SIZE};

/// A frame whose bytes say which session and sequence number it is.
fn frame(session: u32, seq: u32) -> Vec<u8> {
    let mut f = vec![0u8; 64];
    f[..4].copy_from_slice(&session.to_be_bytes());
    f[4..8].copy_from_slice(&seq.to_be_bytes());
    f
}

fn ids(b: &Burst) -> Vec<(u32, u32)> {
    (0..b.len())
        .map(|i| {
            let p = b.packet(i);
            (
                u32::from_be_bytes(p[..4].try_into().unwrap()),
                u32::from_be_bytes(p[4..8].try_into().unwrap()),
            )
        })
        .collect()
}

#[test]
fn awaiting_holds_releases_and_expires_segments_without_leaking_mbufs() {
    let _eal = Eal::init(&eal_args("eal_awaiting"))
        .expect("EAL init (run scripts/setup.sh; tests need root)");
    let pool = Mempool::new("await_pool", 1023, 0, 2048).unwrap();
    let mut q = Awaiting::new(1000);
    let hold = |q: &mut Awaiting, session: u32, seq: u32, port: u16, now: u64, needs_syn| {
        let mut b = Burst::new();
        assert!(b.push_copy(&pool, &frame(session, seq)));
        let what = AwaitServer {
            session,
            seq,
            needs_syn,
        };
        let taken = q.hold(&mut b, 0, what, port, now);
        b.compact_moved();
        assert_eq!(
            b.len(),
            usize::from(!taken),
            "a refused frame stays with the caller"
        );
        taken
    };

    // Room, the per-session cap, duplicates.
    assert!(q.may_hold(1, 100));
    assert!(hold(&mut q, 1, 100, 0, 0, false));
    assert!(
        !q.may_hold(1, 100),
        "the same segment again is a retransmission"
    );
    for seq in 1..PER_SESSION as u32 {
        assert!(q.may_hold(1, 100 + seq));
        assert!(hold(&mut q, 1, 100 + seq, 0, 0, false));
    }
    assert!(
        !q.may_hold(1, 999),
        "a session may have {PER_SESSION} frames waiting"
    );
    assert!(q.may_hold(2, 999));
    assert!(hold(&mut q, 2, 200, 0, 10, true));
    assert!(hold(&mut q, 3, 300, 1, 10, false));
    assert_eq!(q.len(), PER_SESSION + 2);

    // Port 0 while every session waits: only the copy for session 2's SYN comes out.
    let mut out = Burst::new();
    let done = q.release(0, 500, &pool, |_| Wait::Waiting, &mut out);
    assert_eq!(
        done,
        Released {
            frames: 0,
            syns: 1,
            expired: 0,
            reset: 0,
        }
    );
    assert_eq!(ids(&out), vec![(2, 200)]);
    assert_eq!(
        q.len(),
        PER_SESSION + 2,
        "the copy leaves the original waiting"
    );
    out.free_all();
    // The copy is the first SYN (once); the session's other segments, and the
    // copy seen again, are the client sending again.
    assert!(!q.take_syn_copy(1, 100), "no copy was made for session 1");
    assert!(!q.take_syn_copy(2, 201));
    assert!(
        q.take_syn_copy(2, 200),
        "the copy of session 2's cookie ACK"
    );
    assert!(!q.take_syn_copy(2, 200), "a retransmission after the copy");
    // Its SYN made, session 2's frame waits like the others.
    let done = q.release(0, 500, &pool, |_| Wait::Waiting, &mut out);
    assert_eq!(done, Released::default());

    // Session 1's server answered: its frames leave in order, session 2's stay, and
    // port 1's frame (session 3) is not touched when port 0 is asked.
    let done = q.release(
        0,
        500,
        &pool,
        |s| {
            if s == 1 {
                Wait::Answered
            } else {
                Wait::Waiting
            }
        },
        &mut out,
    );
    assert_eq!(done.frames, PER_SESSION);
    assert_eq!(
        ids(&out),
        (0..PER_SESSION as u32)
            .map(|k| (1, 100 + k))
            .collect::<Vec<_>>()
    );
    out.free_all();
    assert_eq!(q.len(), 2);
    assert!(
        q.may_hold(1, 100),
        "a released segment is no longer a duplicate"
    );

    // Past the hold time (deadline 10 + 1000): session 2 is dropped on port 0;
    // session 3 on port 1 too when port 1 is asked.
    let done = q.release(0, 1009, &pool, |_| Wait::Waiting, &mut out);
    assert_eq!(done, Released::default(), "not yet");
    let done = q.release(0, 1010, &pool, |_| Wait::Waiting, &mut out);
    assert_eq!(done.expired, 1);
    assert!(out.is_empty());
    let done = q.release(1, 1010, &pool, |_| Wait::Waiting, &mut out);
    assert_eq!(done.expired, 1);
    assert!(q.is_empty());

    // Full: one burst of frames, then no room for anyone.
    for s in 0..BURST_SIZE as u32 {
        assert!(hold(&mut q, 100 + s, 0, 0, 0, false));
    }
    assert!(!q.has_room() && !q.may_hold(9999, 0));
    assert!(!hold(&mut q, 9999, 0, 0, 0, false));
    // `out` holds at most a burst: what does not fit stays for the next call.
    let mut partial = Burst::new();
    assert!(partial.push_copy(&pool, &frame(0, 0)));
    let done = q.release(0, 0, &pool, |_| Wait::Answered, &mut partial);
    assert_eq!(done.frames, BURST_SIZE - 1);
    assert_eq!(q.len(), 1);
    partial.free_all();
    let done = q.release(0, 0, &pool, |_| Wait::Answered, &mut out);
    assert_eq!(done.frames, 1);
    out.free_all();
    assert!(q.is_empty());

    // A session whose client reset it: its frames are freed at once, before their
    // deadline, and the one still owed a SYN gets no copy.
    assert!(hold(&mut q, 7, 700, 0, 0, true));
    assert!(hold(&mut q, 7, 701, 0, 0, false));
    assert!(hold(&mut q, 8, 800, 0, 0, false));
    let done = q.release(
        0,
        1,
        &pool,
        |s| if s == 7 { Wait::Reset } else { Wait::Waiting },
        &mut out,
    );
    assert_eq!(
        done,
        Released {
            frames: 0,
            syns: 0,
            expired: 0,
            reset: 2,
        }
    );
    assert!(out.is_empty());
    assert_eq!(q.len(), 1, "session 8 still waits");
    let done = q.release(0, 1, &pool, |_| Wait::Answered, &mut out);
    assert_eq!(done.frames, 1);
    out.free_all();
    assert_eq!(pool.in_use(), 0, "an mbuf leaked");
}
