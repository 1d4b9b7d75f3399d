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

use std::sync::mpsc::{self, Receiver, TryRecvError};

/// The reloads asked for: at most one being read, and those asked for since.
pub(super) struct Reloads<T, W> {
    reading: Option<Reading<T, W>>,
    /// Asked for while a read was under way, to be answered by the next read.
    next: Option<Vec<W>>,
}

struct Reading<T, W> {
    result: Receiver<T>,
    /// Who waits for this read's outcome (a SIGHUP waits for nothing).
    waiting: Vec<W>,
}

/// The read ended without a result: its thread panicked or could not be started.
#[derive(Debug, PartialEq)]
pub(super) struct ReadLost;

impl<T: Send + 'static, W> Reloads<T, W> {
    pub fn new() -> Reloads<T, W> {
        Reloads {
            reading: None,
            next: None,
        }
    }

    /// Asks for a reload, answered to `waiter` if there is one. Returns true when a read
    /// starts now (running `read` on a thread of its own), false when it waits for the
    /// one under way.
    pub fn ask(&mut self, waiter: Option<W>, read: impl FnOnce() -> T + Send + 'static) -> bool {
        if self.reading.is_some() {
            self.next.get_or_insert_with(Vec::new).extend(waiter);
            return false;
        }
        self.reading = Some(Reading {
            result: spawn(read),
            waiting: waiter.into_iter().collect(),
        });
        true
    }

    /// The read under way, if it is done: its result and who waits for it.
    pub fn done(&mut self) -> Option<(Result<T, ReadLost>, Vec<W>)> {
        let reading = self.reading.as_ref()?;
        let result = match reading.result.try_recv() {
            Ok(read) => Ok(read),
            Err(TryRecvError::Empty) => return None,
            Err(TryRecvError::Disconnected) => Err(ReadLost),
        };
        let waiting = self.reading.take().map(|r| r.waiting).unwrap_or_default();
        Some((result, waiting))
    }

    /// Starts the read asked for while the last one was under way, if any. Returns
    /// true when one starts.
    pub fn start_next(&mut self, read: impl FnOnce() -> T + Send + 'static) -> bool {
        if self.reading.is_some() {
            return false;
        }
        let Some(waiting) = self.next.take() else {
            return false;
        };
        self.reading = Some(Reading {
            result: spawn(read),
            waiting,
        });
        true
    }
}

/// Runs `read` on a thread of its own. When no thread can be started the sender is
/// dropped with the closure, and the read is reported lost (the reload refused, the
/// reason in the log) rather than run on the loop.
fn spawn<T: Send + 'static>(read: impl FnOnce() -> T + Send + 'static) -> Receiver<T> {
    let (tx, rx) = mpsc::channel();
    let started = std::thread::Builder::new()
        .name("sluice-reload".into())
        .spawn(move || {
            // The loop may have stopped meanwhile: nobody to tell.
            let _ = tx.send(read());
        });
    if let Err(e) = started {
        log::error!("cannot start a thread to read the config: {e}");
    }
    rx
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Barrier};
    use std::time::{Duration, Instant};

    /// Waits (bounded) for the read under way to be done.
    fn wait_done<T: Send + 'static, W>(r: &mut Reloads<T, W>) -> (Result<T, ReadLost>, Vec<W>) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(done) = r.done() {
                return done;
            }
            assert!(Instant::now() < deadline, "the read never finished");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    #[test]
    fn a_read_runs_beside_the_caller_and_answers_who_asked() {
        let mut r: Reloads<u32, &str> = Reloads::new();
        assert!(r.done().is_none(), "nothing asked, nothing done");
        let gate = Arc::new(Barrier::new(2));
        let held = Arc::clone(&gate);
        assert!(r.ask(Some("first"), move || {
            held.wait();
            7
        }));
        // The read waits on the gate: if it ran on this thread, `ask` would not return.
        assert!(r.done().is_none(), "done before the read could finish");
        gate.wait();
        assert_eq!(wait_done(&mut r), (Ok(7), vec!["first"]));
        assert!(r.done().is_none(), "a read is answered once");
        assert!(!r.start_next(|| 8), "nothing was asked for meanwhile");
    }

    #[test]
    fn reloads_asked_for_during_a_read_share_the_next_read_not_this_one() {
        let mut r: Reloads<u32, &str> = Reloads::new();
        let gate = Arc::new(Barrier::new(2));
        let held = Arc::clone(&gate);
        assert!(r.ask(Some("a"), move || {
            held.wait();
            1
        }));
        assert!(!r.ask(Some("b"), || panic!("a second read while one is under way")));
        assert!(!r.ask(None, || panic!("a second read while one is under way")));
        assert!(!r.ask(Some("c"), || panic!("a second read while one is under way")));
        assert!(!r.start_next(|| panic!("the next read before this one is done")));
        gate.wait();
        assert_eq!(wait_done(&mut r), (Ok(1), vec!["a"]));
        assert!(r.start_next(|| 2));
        assert_eq!(wait_done(&mut r), (Ok(2), vec!["b", "c"]));
        assert!(
            !r.start_next(|| 3),
            "the queue was emptied by the second read"
        );
    }

    #[test]
    fn a_read_that_panics_is_reported_lost_and_the_next_one_still_runs() {
        let mut r: Reloads<u32, &str> = Reloads::new();
        assert!(r.ask(Some("a"), || panic!("the reader fails")));
        assert!(!r.ask(Some("b"), || 0));
        assert_eq!(wait_done(&mut r), (Err(ReadLost), vec!["a"]));
        assert!(r.start_next(|| 5));
        assert_eq!(wait_done(&mut r), (Ok(5), vec!["b"]));
    }
}
