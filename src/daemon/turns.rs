//! The management loop's turns: how many there were, how long the longest one's work
//! took lately, and the control requests they answered within a budget each.
//!
//! One thread runs the loop, and everything that keeps the node in its cluster waits
//! for its next turn: VRRP adverts (a backup takes over after about three missed),
//! health checks, sync, the exception path, the systemd watchdog. Control requests
//! come from up to [`EXECUTORS`](crate::control::server::EXECUTORS) threads at once,
//! each sending its next as soon as the last is answered, so clients that pipeline
//! costly requests (a change at 50,000 real servers takes about 17 ms,
//! perf/results/config_scale.md) can keep the queue from ever emptying: a turn that
//! answered until none was left would never end. So a turn answers requests for
//! [`CONTROL_BUDGET`] at most (one at least, whatever it costs), and the rest wait for
//! the next turn, after the ticks of this one.
use crate::control::report::ManagementReport;
use crossbeam::channel::Receiver;
use std::time::{Duration, Instant};

/// How long a turn answers control requests once it has answered one: under half of
/// the 5 ms between turns, so a turn that also writes a flood's exception frames
/// (about 1.5 ms) still ends before the next one is due.
pub const CONTROL_BUDGET: Duration = Duration::from_millis(2);

/// How long the longest turn is remembered: the report shows the longest of the
/// current window and the one before, so the last 30 to 60 seconds.
const LONGEST_WINDOW: Duration = Duration::from_secs(30);

/// Answers `calls` with `answer` until the queue is empty or, once one is answered,
/// `budget` has passed since the first: what was answered, and whether requests were
/// left waiting for the next turn.
pub fn answer_calls<T>(
    calls: &Receiver<T>,
    budget: Duration,
    mut answer: impl FnMut(T),
) -> (u64, bool) {
    let started = Instant::now();
    let mut answered = 0;
    while answered == 0 || started.elapsed() < budget {
        let Ok(call) = calls.try_recv() else {
            return (answered, false);
        };
        answer(call);
        answered += 1;
    }
    (answered, !calls.is_empty())
}

/// The loop's counts since start, and its longest turns.
#[derive(Debug)]
pub struct Turns {
    turns: u64,
    control_requests: u64,
    control_cut: u64,
    window_start: Instant,
    longest_now: Duration,
    longest_before: Duration,
}

impl Turns {
    pub fn new(now: Instant) -> Turns {
        Turns {
            turns: 0,
            control_requests: 0,
            control_cut: 0,
            window_start: now,
            longest_now: Duration::ZERO,
            longest_before: Duration::ZERO,
        }
    }

    /// `answered` control requests this turn; `left` some for the next one.
    pub fn answered(&mut self, answered: u64, left: bool) {
        self.control_requests += answered;
        self.control_cut += u64::from(left);
    }

    /// A turn whose work (its sleep excluded) took `work`, ending at `now`.
    pub fn done(&mut self, work: Duration, now: Instant) {
        self.turns += 1;
        self.roll(now);
        self.longest_now = self.longest_now.max(work);
    }

    fn roll(&mut self, now: Instant) {
        let since = now.saturating_duration_since(self.window_start);
        if since >= LONGEST_WINDOW {
            // A window with no turn at all (the loop stalled for all of it) keeps the
            // stall it ends with: `done` records it into the new window.
            self.longest_before = match since >= 2 * LONGEST_WINDOW {
                true => Duration::ZERO,
                false => self.longest_now,
            };
            self.longest_now = Duration::ZERO;
            self.window_start = now;
        }
    }

    pub fn report(&self) -> ManagementReport {
        ManagementReport {
            turns: self.turns,
            longest_turn_us: self.longest_now.max(self.longest_before).as_micros() as u64,
            control_requests: self.control_requests,
            control_turns_cut: self.control_cut,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crossbeam::channel;

    /// A queue of requests that take 1 ms each: a turn answers at least one, stops
    /// once the budget has passed (so at most three with a 3 ms budget), says some
    /// are left, and the next turns answer the rest; an empty queue answers none.
    #[test]
    fn a_turn_answers_requests_for_its_budget_and_leaves_the_rest() {
        let (tx, rx) = channel::unbounded();
        for i in 0..10 {
            tx.send(i).unwrap();
        }
        let seen = std::cell::RefCell::new(Vec::new());
        let slow = |i| {
            std::thread::sleep(Duration::from_millis(1));
            seen.borrow_mut().push(i);
        };
        let (first, left) = answer_calls(&rx, Duration::from_millis(3), slow);
        assert!((1..=3).contains(&first), "{first} answered");
        assert!(left);
        let mut turns = 1;
        let mut total = first;
        while total < 10 {
            let (n, _) = answer_calls(&rx, Duration::from_millis(3), slow);
            assert!((1..=3).contains(&n), "{n} answered");
            total += n;
            turns += 1;
        }
        assert!(turns >= 4, "{turns} turns for 10 requests of 1 ms");
        assert_eq!(
            *seen.borrow(),
            (0..10).collect::<Vec<_>>(),
            "in order, each once"
        );
        assert_eq!(answer_calls(&rx, Duration::ZERO, slow), (0, false));
        // A zero budget still answers one a turn.
        tx.send(10).unwrap();
        tx.send(11).unwrap();
        assert_eq!(answer_calls(&rx, Duration::ZERO, slow), (1, true));
        assert_eq!(answer_calls(&rx, Duration::ZERO, slow), (1, false));
    }

    /// The longest turn is that of the current window or the one before; older ones
    /// are forgotten.
    #[test]
    fn the_longest_turn_is_of_the_last_one_or_two_windows() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut turns = Turns::new(t0);
        turns.done(ms(40), t0 + ms(10));
        turns.done(ms(3), t0 + ms(20));
        assert_eq!(turns.report().longest_turn_us, 40_000);
        turns.done(ms(2), t0 + LONGEST_WINDOW + ms(30));
        assert_eq!(turns.report().longest_turn_us, 40_000, "the window before");
        turns.done(ms(1), t0 + 2 * LONGEST_WINDOW + ms(40));
        assert_eq!(turns.report().longest_turn_us, 2_000);
        // A stall across two whole windows is itself the longest.
        turns.done(ms(70_000), t0 + 5 * LONGEST_WINDOW);
        assert_eq!(turns.report().longest_turn_us, 70_000_000);
        turns.answered(4, true);
        turns.answered(1, false);
        let r = turns.report();
        assert_eq!(
            (r.turns, r.control_requests, r.control_turns_cut),
            (5, 5, 1)
        );
    }
}
