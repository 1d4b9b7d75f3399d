//! Questions the management core asks a worker about state only that worker may touch:
//! its session tables, IPv4 and IPv6 (`sluicectl -Lnc`), its FullNAT port pools
//! (`--get-laddr`) and its neighbour tables (`sluicectl neigh`).
//!
//! The management core allocates the answer's room and posts the query in the
//! worker's [`Mailbox`]; the worker, between two polls, fills at most that room (no
//! allocation, a bounded stall) and posts it back. A long listing is read in chunks
//! with a cursor, so a worker with a million sessions never stops for the whole scan.
use crate::forward::laddr::LaddrCounters;
use crate::model::Protocol;
use crossbeam::queue::ArrayQueue;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Sessions a worker lists per chunk: a few hundred microseconds of its time.
pub const CONNECTIONS_PER_CHUNK: usize = 4096;

/// Table slots a worker reads for one chunk, used or not (4 MiB of IPv4 slots). A
/// chunk ends at whichever bound comes first, so a million-slot table with a few
/// sessions is read in 16 short chunks rather than one long stall.
pub const SLOTS_PER_ANSWER: usize = 65_536;

/// One session as `-Lnc` shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionEntry {
    pub worker: u16,
    pub proto: Protocol,
    /// IPVS state name (`ESTABLISHED`, `FIN_WAIT`, ..., `UDP`).
    pub state: &'static str,
    /// Ticks until the session expires unless a packet refreshes it.
    pub expires_ticks: u32,
    pub client: SocketAddr,
    pub virtual_service: SocketAddr,
    /// FullNAT: the local address and port the real server sees.
    pub local: Option<SocketAddr>,
    pub real_server: SocketAddr,
    /// The whole entry, for a bulk resync's records.
    pub session: ListedSession,
    /// A connection the SYN proxy spliced: its translation (for the same records).
    pub synproxy: Option<crate::session::replication::SynproxyDelta>,
}

/// A listed session as its table holds it: from the IPv4 table or the IPv6 one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ListedSession {
    V4(crate::session::Session),
    V6(crate::session::table6::Session6),
}

/// Local addresses a worker lists per chunk of a [`Query::Pools`].
pub const POOLS_PER_CHUNK: usize = 4096;

/// One local address's pool on one worker (shared by every service that uses the
/// address: the management core maps addresses to services).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolEntry {
    pub worker: u16,
    pub counters: LaddrCounters,
}

/// Neighbour-table slots a worker reads for one answer, used or not: the two tables
/// (IPv4, then IPv6) are read in a few short steps rather than one long stall.
pub const NEIGHBOUR_SLOTS_PER_ANSWER: usize = 4096;

/// Why a worker keeps a neighbour entry, as its table sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NeighbourRole {
    /// The address of a real server in the current services: never given up.
    RealServer,
    /// A configured peer's (`[vrrp] peers`, `[sync] peers`): never given up.
    Peer,
    /// A `static_neighbours` entry: fixed by the operator, never changed or given up.
    Static,
    /// Anything else (a client, a router, a removed real server): gives its slot up
    /// once stale and its share of the table is full.
    Other,
}

/// One entry of a worker's neighbour table (IPv4 or IPv6).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NeighbourEntry {
    pub worker: u16,
    pub ip: std::net::IpAddr,
    pub mac: crate::wire::MacAddr,
    /// Milliseconds since the entry was last learned or confirmed on this worker.
    pub age_ms: u64,
    pub role: NeighbourRole,
}

/// How full one worker's neighbour tables are.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NeighbourTables {
    pub ipv4: usize,
    pub ipv6: usize,
    /// Entries the IPv4 table holds at most, and the IPv6 one.
    pub capacity: usize,
    pub capacity6: usize,
}

#[derive(Debug)]
pub enum Query {
    /// Sessions from position `from` on, at most `out`'s capacity; `next` says where
    /// to continue (None: the scan reached the end). Positions below the IPv4 table's
    /// capacity are its slab slots; the IPv6 table's slots follow them.
    Connections {
        from: usize,
        out: Vec<ConnectionEntry>,
        next: Option<usize>,
    },
    /// The worker's local-address pools from position `from` on, each once whichever
    /// services use it, at most `out`'s capacity; `next` says where to continue
    /// (None: the end).
    Pools {
        from: usize,
        out: Vec<PoolEntry>,
        next: Option<usize>,
    },
    /// The worker's neighbour entries in the slots from position `from` on, at most
    /// [`NEIGHBOUR_SLOTS_PER_ANSWER`] slots (`out` has room for them all); `next`
    /// says where to continue (None: the end). Positions below the IPv4 table's slot
    /// count are its slots; the IPv6 table's follow. `tables`: how full both are.
    Neighbours {
        from: usize,
        out: Vec<NeighbourEntry>,
        next: Option<usize>,
        tables: NeighbourTables,
    },
}

/// One worker's mailbox: one question at a time. Each question carries a number,
/// and its answer the same: a worker that took a question and answered it after the
/// asker gave up must not have that answer taken for the next question's (a listing
/// would then go on from the wrong position and end with a hole).
#[derive(Debug)]
pub struct Mailbox {
    asked: ArrayQueue<(u64, Query)>,
    answered: ArrayQueue<(u64, Query)>,
    /// The last question's number (management core only).
    numbered: std::sync::atomic::AtomicU64,
}

impl Default for Mailbox {
    fn default() -> Self {
        Mailbox {
            asked: ArrayQueue::new(1),
            // Room for a late answer beside the current one: a question still in the
            // worker's hands when its asker gave up is the only one that can be (a
            // question not taken by then is withdrawn), so one late answer at most.
            answered: ArrayQueue::new(2),
            numbered: std::sync::atomic::AtomicU64::new(0),
        }
    }
}

impl Mailbox {
    /// Management core: posts `query` and waits at most `timeout` for the answer.
    /// Err when the worker did not answer in time (it may be stopped); a late answer
    /// is discarded by the next call.
    pub fn ask(&self, query: Query, timeout: Duration) -> Result<Query, String> {
        use std::sync::atomic::Ordering::Relaxed;
        while self.answered.pop().is_some() {}
        let number = self.numbered.fetch_add(1, Relaxed) + 1;
        if self.asked.push((number, query)).is_err() {
            // A question left by a call that timed out: replace it.
            let _ = self.asked.pop();
            return Err("the worker has not taken the previous question yet".into());
        }
        let deadline = Instant::now() + timeout;
        loop {
            match self.answered.pop() {
                Some((answered, answer)) if answered == number => return Ok(answer),
                // A late answer to a question given up on: dropped.
                Some(_) => continue,
                None => {}
            }
            if Instant::now() >= deadline {
                let _ = self.asked.pop();
                return Err(format!("no answer within {} ms", timeout.as_millis()));
            }
            std::thread::sleep(Duration::from_micros(100));
        }
    }

    /// Worker: answers a pending question with `answer`, if there is one. One atomic
    /// load when there is none.
    #[inline]
    pub fn serve(&self, answer: impl FnOnce(&mut Query)) {
        if let Some((number, mut query)) = self.asked.pop() {
            answer(&mut query);
            let _ = self.answered.push((number, query));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_question_is_answered_by_the_serving_thread() {
        let mailbox = Arc::new(Mailbox::default());
        let worker = {
            let mailbox = mailbox.clone();
            std::thread::spawn(move || {
                let deadline = Instant::now() + Duration::from_secs(5);
                let mut served = false;
                while !served && Instant::now() < deadline {
                    mailbox.serve(|q| {
                        if let Query::Connections { next, .. } = q {
                            *next = Some(7);
                        }
                        served = true;
                    });
                }
            })
        };
        let answer = mailbox
            .ask(
                Query::Connections {
                    from: 0,
                    out: Vec::with_capacity(4),
                    next: None,
                },
                Duration::from_secs(5),
            )
            .unwrap();
        worker.join().unwrap();
        assert!(matches!(answer, Query::Connections { next: Some(7), .. }));
    }

    /// A worker takes the first question and answers it only after the asker gave up
    /// and posted the next; the next question must get its own answer, not that late
    /// one. Every wait is bounded: a thread scheduled too late fails the test, never
    /// hangs it.
    #[test]
    fn a_late_answer_is_not_taken_for_the_next_questions() {
        let mailbox = Arc::new(Mailbox::default());
        let q = |from| Query::Connections {
            from,
            out: Vec::new(),
            next: None,
        };
        let (took_tx, took_rx) = std::sync::mpsc::channel();
        let worker = {
            let mailbox = mailbox.clone();
            std::thread::spawn(move || {
                let deadline = Instant::now() + Duration::from_secs(5);
                let until = |done: &dyn Fn() -> bool| {
                    while !done() {
                        assert!(Instant::now() < deadline, "waited 5 s");
                        std::thread::yield_now();
                    }
                };
                // The first question, taken and held.
                let held = std::cell::Cell::new(None);
                until(&|| {
                    let taken = mailbox.asked.pop();
                    let got = taken.is_some();
                    if got {
                        held.set(taken);
                    }
                    got
                });
                took_tx.send(()).unwrap();
                // Answered once the asker gave up and posted the next question.
                until(&|| !mailbox.asked.is_empty());
                let (number, late) = held.take().unwrap();
                assert!(mailbox.answered.push((number, late)).is_ok());
                until(&|| {
                    mailbox.serve(|q| {
                        if let Query::Connections { from, next, .. } = q {
                            *next = Some(*from + 1);
                        }
                    });
                    mailbox.asked.is_empty()
                });
            })
        };
        let first = mailbox.ask(q(10), Duration::from_millis(500));
        assert!(first.is_err(), "{first:?}");
        took_rx
            .recv_timeout(Duration::from_secs(5))
            .expect("the worker took the first question");
        let second = mailbox.ask(q(20), Duration::from_secs(5)).unwrap();
        worker.join().unwrap();
        assert!(
            matches!(
                second,
                Query::Connections {
                    from: 20,
                    next: Some(21),
                    ..
                }
            ),
            "{second:?}"
        );
    }

    #[test]
    fn nobody_serving_times_out_and_leaves_the_mailbox_usable() {
        let mailbox = Mailbox::default();
        let q = || Query::Pools {
            from: 0,
            out: Vec::new(),
            next: None,
        };
        let err = mailbox.ask(q(), Duration::from_millis(20)).unwrap_err();
        assert!(err.contains("no answer"), "{err}");
        mailbox.serve(|_| panic!("the timed-out question was withdrawn"));
        assert!(mailbox.ask(q(), Duration::from_millis(5)).is_err());
    }
}
