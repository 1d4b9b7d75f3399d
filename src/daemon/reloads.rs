//! `sluicectl reload` and SIGHUP: the config file is read, checked and turned into the
//! table it describes on a thread of its own, and the management loop applies the
//! result (the difference to the running table, health, VRRP) when it is ready.
//!
//! Why a thread: reading a file of 50,000 real servers takes about half a second of a
//! core. On the management loop that half second would hold up everything else the
//! loop does: VRRP advertisements (a backup with a 100 ms interval declares the master
//! dead after about 300 ms and takes over), health probes and their timeouts, session
//! sync, BGP, the systemd watchdog and every other `sluicectl` command. The read needs
//! nothing the loop owns (the file and the path), so it can run beside it; applying
//! changes the running state and stays on the loop, where the table has one owner.
//!
//! What it costs: a reload answers once the loop has applied it, as before; the
//! commands that arrive while the file is read are applied first, and the file's
//! difference is taken against the table as they left it (the file wins, as it would
//! have if they had come just before the reload). A reload asked for while another is
//! being read does not share that read (the file may have been saved in between): it
//! is read again once the first is applied, and every reload asked for meanwhile gets
//! that second answer.

use crate::dpdk::spawn_helper;
use std::sync::mpsc::{self, Receiver, TryRecvError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a read may take before the reload is given up: a file on a hung network
/// mount, say. The reloads waiting are refused. A thread blocked in a read cannot be
/// cancelled: while it is still stuck, every reload asked for is refused at once
/// (a new reader would most likely hang on the same file system, and each would hold
/// a thread for good); once it ends, finding nobody to tell, reloads read again.
pub(super) const READ_LIMIT: Duration = Duration::from_secs(30);

/// The reloads asked for: at most one being read, and those asked for since.
pub(super) struct Reloads<T, W> {
    reading: Option<Reading<T, W>>,
    /// Asked for while a read was under way, to be answered by the next read. Only
    /// ever set while `reading` is.
    next: Option<Vec<W>>,
    /// The thread of the last read given up, until it ends, and when it started. Its
    /// result channel is dropped with the give-up, so a late result is freed on that
    /// thread, not kept for the loop.
    given_up: Option<(JoinHandle<()>, Instant)>,
}

/// What became of a reload asked for.
#[derive(Debug, PartialEq)]
pub(super) enum Asked<W> {
    /// Its read starts now.
    Started,
    /// It waits for the read under way, and is answered by the next.
    Queued,
    /// Refused: the thread of a read given up earlier is still stuck, and has been
    /// for this long since it started. Who asked, to be told.
    Stuck(Duration, Vec<W>),
}

struct Reading<T, W> {
    result: Receiver<T>,
    /// Its thread (none when it could not be started).
    thread: Option<JoinHandle<()>>,
    started: Instant,
    /// Who waits for this read's outcome (a SIGHUP waits for nothing).
    waiting: Vec<W>,
}

/// Why a read gave no result.
#[derive(Debug, PartialEq)]
pub(super) enum ReadLost {
    /// Its thread panicked or could not be started.
    Stopped,
    /// It took longer than [`READ_LIMIT`].
    TooSlow,
}

impl<T: Send + 'static, W> Reloads<T, W> {
    pub fn new() -> Reloads<T, W> {
        Reloads {
            reading: None,
            next: None,
            given_up: None,
        }
    }

    /// Asks for a reload, answered to `waiter` if there is one: its read starts now
    /// (running `read` on a thread of its own), waits for the one under way, or is
    /// refused while a read given up is still stuck.
    pub fn ask(
        &mut self,
        waiter: Option<W>,
        read: impl FnOnce() -> T + Send + 'static,
    ) -> Asked<W> {
        if self.reading.is_some() {
            self.next.get_or_insert_with(Vec::new).extend(waiter);
            return Asked::Queued;
        }
        debug_assert!(self.next.is_none(), "a reload queued behind no read");
        self.start(waiter.into_iter().collect(), read)
    }

    /// A read for `waiting`, unless the thread of a read given up is still stuck.
    fn start(&mut self, waiting: Vec<W>, read: impl FnOnce() -> T + Send + 'static) -> Asked<W> {
        if let Some((thread, started)) = &self.given_up {
            if !thread.is_finished() {
                return Asked::Stuck(started.elapsed(), waiting);
            }
            self.given_up = None;
        }
        let (result, thread) = spawn(read);
        self.reading = Some(Reading {
            result,
            thread,
            started: Instant::now(),
            waiting,
        });
        Asked::Started
    }

    /// The read under way, if it is done (or lost, or past [`READ_LIMIT`] at `now`):
    /// its result and who waits for it.
    pub fn done(&mut self, now: Instant) -> Option<(Result<T, ReadLost>, Vec<W>)> {
        let reading = self.reading.take()?;
        let result = match reading.result.try_recv() {
            Ok(read) => Ok(read),
            Err(TryRecvError::Disconnected) => Err(ReadLost::Stopped),
            Err(TryRecvError::Empty) if now >= reading.started + READ_LIMIT => {
                self.given_up = reading.thread.map(|thread| (thread, reading.started));
                Err(ReadLost::TooSlow)
            }
            Err(TryRecvError::Empty) => {
                self.reading = Some(reading);
                return None;
            }
        };
        Some((result, reading.waiting))
    }

    /// Starts the read asked for while the last one was under way, if any (`None`
    /// when there is none, or a read is still under way).
    pub fn start_next(&mut self, read: impl FnOnce() -> T + Send + 'static) -> Option<Asked<W>> {
        if self.reading.is_some() {
            return None;
        }
        let waiting = self.next.take()?;
        Some(self.start(waiting, read))
    }

    /// Gives up every reload asked for (the daemon stops): who waits for them, to be
    /// told. A read under way finds nobody to tell.
    pub fn abandon(&mut self) -> Vec<W> {
        let mut waiting = self.reading.take().map(|r| r.waiting).unwrap_or_default();
        waiting.extend(self.next.take().into_iter().flatten());
        waiting
    }
}

/// Runs `read` on a helper thread of its own ([`spawn_helper`]: a CPU no lcore uses,
/// else the management loop's). Sharing the loop's CPU, it costs the loop little: the
/// loop sleeps between its turns, which start 5 ms apart (0.5 ms at least after a
/// turn's work), and the scheduler runs it as soon as it wakes,
/// ahead of a thread that has been running (measured: a `status` sent 100 ms into a
/// 50,000-server reload answered in 7-20 ms; with the reader at nice 10, in 9-37 ms,
/// so its priority is left alone).
/// When no thread can be started the sender is dropped with the closure, and the read
/// is reported lost (the reload refused, the reason in the log) rather than run on the
/// loop.
fn spawn<T: Send + 'static>(
    read: impl FnOnce() -> T + Send + 'static,
) -> (Receiver<T>, Option<JoinHandle<()>>) {
    let (tx, rx) = mpsc::channel();
    let started = spawn_helper(
        std::thread::Builder::new().name("sluice-reload".into()),
        move || {
            // The loop may have stopped meanwhile, or given the read up: nobody to
            // tell, and the result is freed here.
            let _ = tx.send(read());
        },
    );
    match started {
        Ok(thread) => (rx, Some(thread)),
        Err(e) => {
            log::error!("cannot start a thread to read the config: {e}");
            (rx, None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Waits (bounded) for the read under way to be done.
    fn wait_done<T: Send + 'static, W>(r: &mut Reloads<T, W>) -> (Result<T, ReadLost>, Vec<W>) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(done) = r.done(Instant::now()) {
                return done;
            }
            assert!(Instant::now() < deadline, "the read never finished");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// A read that finishes once `release` is sent to (or after 5 s, so that a read
    /// run on the asking thread fails the test instead of hanging it).
    fn held_read(
        value: u32,
    ) -> (
        mpsc::Sender<()>,
        impl FnOnce() -> Result<u32, String> + Send,
    ) {
        let (release, held) = mpsc::channel::<()>();
        let read = move || {
            held.recv_timeout(Duration::from_secs(5))
                .map(|()| value)
                .map_err(|_| "never released".to_string())
        };
        (release, read)
    }

    #[test]
    fn a_read_runs_beside_the_caller_and_answers_who_asked() {
        let mut r: Reloads<Result<u32, String>, &str> = Reloads::new();
        assert!(
            r.done(Instant::now()).is_none(),
            "nothing asked, nothing done"
        );
        let (release, read) = held_read(7);
        let asked = Instant::now();
        assert_eq!(r.ask(Some("first"), read), Asked::Started);
        assert!(
            asked.elapsed() < Duration::from_secs(4),
            "ask waited for the read"
        );
        assert!(
            r.done(Instant::now()).is_none(),
            "done before the read could finish"
        );
        release.send(()).unwrap();
        assert_eq!(wait_done(&mut r), (Ok(Ok(7)), vec!["first"]));
        assert!(r.done(Instant::now()).is_none(), "a read is answered once");
        assert!(
            r.start_next(|| Ok(8)).is_none(),
            "nothing was asked for meanwhile"
        );
    }

    #[test]
    fn reloads_asked_for_during_a_read_share_the_next_read_not_this_one() {
        let mut r: Reloads<Result<u32, String>, &str> = Reloads::new();
        let (release, read) = held_read(1);
        assert_eq!(r.ask(Some("a"), read), Asked::Started);
        let second = || panic!("a second read while one is under way");
        assert_eq!(r.ask(Some("b"), second), Asked::Queued);
        assert_eq!(r.ask(None, second), Asked::Queued);
        assert_eq!(r.ask(Some("c"), second), Asked::Queued);
        assert!(r
            .start_next(|| panic!("the next read before this one is done"))
            .is_none());
        release.send(()).unwrap();
        assert_eq!(wait_done(&mut r), (Ok(Ok(1)), vec!["a"]));
        assert_eq!(r.start_next(|| Ok(2)), Some(Asked::Started));
        assert_eq!(wait_done(&mut r), (Ok(Ok(2)), vec!["b", "c"]));
        assert!(
            r.start_next(|| Ok(3)).is_none(),
            "the queue was emptied by the second read"
        );
    }

    #[test]
    fn a_read_that_panics_is_reported_lost_and_the_next_one_still_runs() {
        let mut r: Reloads<u32, &str> = Reloads::new();
        assert_eq!(
            r.ask(Some("a"), || panic!("the reader fails")),
            Asked::Started
        );
        assert_eq!(r.ask(Some("b"), || 0), Asked::Queued);
        assert_eq!(wait_done(&mut r), (Err(ReadLost::Stopped), vec!["a"]));
        assert_eq!(r.start_next(|| 5), Some(Asked::Started));
        assert_eq!(wait_done(&mut r), (Ok(5), vec!["b"]));
    }

    #[test]
    fn a_read_past_its_limit_is_given_up_and_none_starts_while_its_thread_is_stuck() {
        let mut r: Reloads<Result<u32, String>, &str> = Reloads::new();
        let (release, read) = held_read(1);
        assert_eq!(r.ask(Some("a"), read), Asked::Started);
        assert_eq!(r.ask(Some("b"), || Ok(2)), Asked::Queued);
        let now = Instant::now();
        assert!(r.done(now + READ_LIMIT / 2).is_none(), "given up early");
        assert_eq!(
            r.done(now + READ_LIMIT + Duration::from_millis(1)),
            Some((Err(ReadLost::TooSlow), vec!["a"]))
        );
        // The given-up thread still hangs: those queued behind it and those asking
        // now are refused, and no second reader starts.
        let stuck = || panic!("a second reader while the first is stuck");
        assert!(matches!(r.start_next(stuck), Some(Asked::Stuck(_, w)) if w == vec!["b"]));
        assert!(matches!(r.ask(Some("c"), stuck), Asked::Stuck(_, w) if w == vec!["c"]));
        assert!(matches!(r.ask(None, stuck), Asked::Stuck(_, w) if w.is_empty()));
        assert!(r.done(Instant::now()).is_none(), "nothing is being read");
        // Once it ends (its result is dropped: nobody waits for it), reloads read again.
        release.send(()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            match r.ask(Some("d"), || Ok(4)) {
                Asked::Started => break,
                Asked::Stuck(..) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(1))
                }
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(wait_done(&mut r), (Ok(Ok(4)), vec!["d"]));
    }

    #[test]
    fn abandoning_gives_back_every_waiter_once() {
        let mut r: Reloads<Result<u32, String>, &str> = Reloads::new();
        let (_release, read) = held_read(1);
        assert_eq!(r.ask(Some("a"), read), Asked::Started);
        assert_eq!(r.ask(Some("b"), || Ok(2)), Asked::Queued);
        assert_eq!(r.ask(None, || Ok(2)), Asked::Queued);
        assert_eq!(r.abandon(), vec!["a", "b"]);
        assert!(r.abandon().is_empty());
        assert!(r.done(Instant::now()).is_none(), "nothing is read any more");
        assert!(
            r.start_next(|| Ok(3)).is_none(),
            "nothing is queued any more"
        );
    }
}
