//! One real server's health: probe results and passive observations in, eviction and
//! restoration out. Pure (time is milliseconds given by the caller), so every rule is
//! tested without a network.
//!
//! Active checks: `fall` failures in a row evict; an evicted server is probed again
//! after `retry_ms`, then every `interval_ms` while it succeeds, and `rise` successes
//! in a row restore it (a failure waits `retry_ms` again). Passive detection: new
//! connections the server left unanswered or refused, `passive_fall` in a row with no
//! answered one between, evict; without an active check the server is tried again
//! after a back-off that doubles on every passive eviction that follows a passive
//! restore too soon (up to [`MAX_BACKOFF_FACTOR`] times `retry_ms`), and one answered
//! connection ends the probation.
use super::spec::{CheckKind, CheckSpec};

/// Back-off cap, as a multiple of `retry_ms`.
pub const MAX_BACKOFF_FACTOR: u32 = 16;

/// What changed after an input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Change {
    Evicted { reason: String },
    Restored { reason: String },
}

/// Counts from the workers since the last look (new TCP connections of this server).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PassiveDelta {
    pub answered: u32,
    pub unanswered: u32,
    pub refused: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Verdict {
    pub evicted: bool,
    /// Active failures in a row (while up).
    pub fails: u32,
    /// Active successes in a row (while evicted).
    pub oks: u32,
    /// Passive failures in a row.
    pub passive_fails: u32,
    /// Evicted by passive detection (restored by back-off or by an active check).
    pub passive_evicted: bool,
    /// Restored after a passive back-off, not yet seen answering.
    pub probation: bool,
    /// Current passive back-off.
    pub backoff_ms: u64,
    /// When an evicted server without an active check is tried again (ms).
    pub retry_at_ms: u64,
    pub evictions: u64,
    pub restores: u64,
    pub last_reason: String,
    /// When the last eviction or restoration happened (ms).
    pub changed_at_ms: u64,
}

/// Which setting spaces a server's next probe from the moment it is planned from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pace {
    /// `interval_ms`: an up or recovering server.
    Interval,
    /// `retry_ms`: an evicted server whose last probe failed, or one just evicted by
    /// passive detection.
    Retry,
}

impl Pace {
    pub fn ms(self, spec: &CheckSpec) -> u64 {
        u64::from(match self {
            Pace::Interval => spec.interval_ms,
            Pace::Retry => spec.retry_ms,
        })
    }
}

impl Verdict {
    /// What spaces the next probe after a result: `None` when the server needs no
    /// probe (no active check).
    pub fn next_pace(&self, spec: &CheckSpec, last_ok: bool) -> Option<Pace> {
        if spec.kind == CheckKind::None {
            return None;
        }
        Some(if self.evicted && !last_ok {
            Pace::Retry
        } else {
            Pace::Interval
        })
    }

    /// The delay until the next probe after a result: `None` when the server needs no
    /// probe (no active check).
    #[cfg(test)]
    pub fn next_probe_in(&self, spec: &CheckSpec, last_ok: bool) -> Option<u64> {
        self.next_pace(spec, last_ok).map(|p| p.ms(spec))
    }

    /// The server's active check is now `none` (a reload): an eviction that check
    /// decided ends, since nothing else would ever end it (no probe runs, and passive
    /// detection neither watches an evicted server nor restores what it did not
    /// evict). A passive eviction keeps its back-off ([`Verdict::on_time`]).
    pub fn on_check_off(&mut self, spec: &CheckSpec, now_ms: u64) -> Option<Change> {
        if spec.kind != CheckKind::None {
            return None;
        }
        // Counts of a check that is off: one failure after it comes back must not
        // complete an old streak.
        self.fails = 0;
        self.oks = 0;
        if !self.evicted || self.passive_evicted {
            return None;
        }
        Some(self.restore("check-off".into(), now_ms))
    }

    /// One active probe's result.
    pub fn on_probe(&mut self, spec: &CheckSpec, ok: bool, now_ms: u64) -> Option<Change> {
        if !self.evicted {
            if ok {
                self.fails = 0;
                return None;
            }
            self.fails += 1;
            if self.fails >= spec.fall {
                let reason = format!("{}fail", self.fails);
                return Some(self.evict(reason, false, now_ms));
            }
            return None;
        }
        if !ok {
            self.oks = 0;
            return None;
        }
        self.oks += 1;
        if self.oks >= spec.rise {
            let reason = format!("{}ok", self.oks);
            self.passive_evicted = false;
            self.probation = false;
            return Some(self.restore(reason, now_ms));
        }
        None
    }

    /// The workers' passive counts since the last call.
    pub fn on_passive(&mut self, spec: &CheckSpec, d: PassiveDelta, now_ms: u64) -> Option<Change> {
        if !spec.passive || self.evicted {
            return None;
        }
        if d.answered > 0 {
            self.passive_fails = 0;
            if self.probation {
                self.probation = false;
                self.backoff_ms = 0;
            }
            return None;
        }
        self.passive_fails += d.unanswered + d.refused;
        if self.passive_fails < spec.passive_fall {
            return None;
        }
        let retry = u64::from(spec.retry_ms);
        self.backoff_ms = if self.probation && self.backoff_ms > 0 {
            (self.backoff_ms * 2).min(retry * u64::from(MAX_BACKOFF_FACTOR))
        } else {
            retry
        };
        self.retry_at_ms = now_ms + self.backoff_ms;
        let reason = format!("passive-{}fail", self.passive_fails);
        Some(self.evict(reason, true, now_ms))
    }

    /// Time passing: restores a passively evicted server whose back-off is over when
    /// no active check decides instead.
    pub fn on_time(&mut self, spec: &CheckSpec, now_ms: u64) -> Option<Change> {
        if !self.evicted || !self.passive_evicted || spec.kind != CheckKind::None {
            return None;
        }
        if now_ms < self.retry_at_ms {
            return None;
        }
        self.passive_evicted = false;
        self.probation = true;
        let reason = format!("backoff-{}ms", self.backoff_ms);
        Some(self.restore(reason, now_ms))
    }

    fn evict(&mut self, reason: String, passive: bool, now_ms: u64) -> Change {
        self.evicted = true;
        self.passive_evicted = passive;
        self.fails = 0;
        self.oks = 0;
        self.passive_fails = 0;
        self.evictions += 1;
        self.last_reason = reason.clone();
        self.changed_at_ms = now_ms;
        Change::Evicted { reason }
    }

    fn restore(&mut self, reason: String, now_ms: u64) -> Change {
        self.evicted = false;
        self.fails = 0;
        self.oks = 0;
        self.passive_fails = 0;
        self.restores += 1;
        self.last_reason = reason.clone();
        self.changed_at_ms = now_ms;
        Change::Restored { reason }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp() -> CheckSpec {
        CheckSpec {
            kind: CheckKind::Tcp,
            ..Default::default()
        }
    }

    #[test]
    fn fall_failures_in_a_row_evict_and_a_success_between_resets() {
        let spec = tcp();
        let mut v = Verdict::default();
        assert_eq!(v.on_probe(&spec, false, 0), None);
        assert_eq!(v.on_probe(&spec, true, 5000), None);
        assert_eq!(v.on_probe(&spec, false, 10_000), None);
        assert_eq!(
            v.on_probe(&spec, false, 15_000),
            Some(Change::Evicted {
                reason: "2fail".into()
            })
        );
        assert!(v.evicted);
        assert_eq!(v.evictions, 1);
        // Evicted and failing: the next probe waits retry_ms (seed 004's 30 s).
        assert_eq!(v.next_probe_in(&spec, false), Some(30_000));
    }

    #[test]
    fn rise_successes_in_a_row_restore() {
        let spec = CheckSpec { rise: 3, ..tcp() };
        let mut v = Verdict::default();
        v.on_probe(&spec, false, 0);
        v.on_probe(&spec, false, 1);
        assert!(v.evicted);
        assert_eq!(v.on_probe(&spec, true, 2), None);
        assert_eq!(v.next_probe_in(&spec, true), Some(5000));
        assert_eq!(v.on_probe(&spec, true, 3), None);
        assert_eq!(
            v.on_probe(&spec, false, 4),
            None,
            "a failure restarts the count"
        );
        assert_eq!(v.on_probe(&spec, true, 5), None);
        assert_eq!(v.on_probe(&spec, true, 6), None);
        assert_eq!(
            v.on_probe(&spec, true, 7),
            Some(Change::Restored {
                reason: "3ok".into()
            })
        );
        assert!(!v.evicted);
        assert_eq!((v.evictions, v.restores), (1, 1));
    }

    #[test]
    fn passive_failures_evict_then_back_off_doubles_while_it_keeps_failing() {
        let spec = CheckSpec {
            passive: true,
            passive_fall: 3,
            retry_ms: 1000,
            ..Default::default()
        };
        let mut v = Verdict::default();
        let fail = PassiveDelta {
            unanswered: 1,
            ..Default::default()
        };
        assert_eq!(v.on_passive(&spec, fail, 0), None);
        assert_eq!(v.on_passive(&spec, fail, 10), None);
        let ev = v.on_passive(&spec, fail, 20);
        assert_eq!(
            ev,
            Some(Change::Evicted {
                reason: "passive-3fail".into()
            })
        );
        assert_eq!(v.on_time(&spec, 1019), None);
        assert!(matches!(
            v.on_time(&spec, 1020),
            Some(Change::Restored { .. })
        ));
        assert!(v.probation);
        // Fails again on probation: evicted for twice as long.
        let three = PassiveDelta {
            refused: 3,
            ..Default::default()
        };
        assert!(v.on_passive(&spec, three, 1100).is_some());
        assert_eq!(v.backoff_ms, 2000);
        assert_eq!(v.on_time(&spec, 3099), None);
        assert!(v.on_time(&spec, 3100).is_some());
        // This time it answers: probation over, back-off reset.
        let ok = PassiveDelta {
            answered: 1,
            ..Default::default()
        };
        assert_eq!(v.on_passive(&spec, ok, 3200), None);
        assert!(!v.probation);
        assert!(v.on_passive(&spec, three, 4000).is_some());
        assert_eq!(v.backoff_ms, 1000, "a fresh eviction starts from retry_ms");
    }

    #[test]
    fn back_off_is_capped() {
        let spec = CheckSpec {
            passive: true,
            passive_fall: 1,
            retry_ms: 100,
            ..Default::default()
        };
        let mut v = Verdict::default();
        let fail = PassiveDelta {
            unanswered: 1,
            ..Default::default()
        };
        let mut now = 0;
        for _ in 0..10 {
            assert!(v.on_passive(&spec, fail, now).is_some());
            now = v.retry_at_ms;
            assert!(v.on_time(&spec, now).is_some());
        }
        assert_eq!(v.backoff_ms, 100 * u64::from(MAX_BACKOFF_FACTOR));
    }

    #[test]
    fn answered_connections_keep_a_server_in() {
        let spec = CheckSpec {
            passive: true,
            passive_fall: 2,
            ..Default::default()
        };
        let mut v = Verdict::default();
        for t in 0..100 {
            let d = PassiveDelta {
                answered: 5,
                unanswered: 1,
                refused: 0,
            };
            assert_eq!(v.on_passive(&spec, d, t), None);
        }
        assert!(!v.evicted);
    }

    #[test]
    fn passive_off_ignores_failures_and_an_active_check_restores_a_passive_eviction() {
        let mut v = Verdict::default();
        let fail = PassiveDelta {
            unanswered: 100,
            ..Default::default()
        };
        assert_eq!(v.on_passive(&tcp(), fail, 0), None);
        let spec = CheckSpec {
            passive: true,
            ..tcp()
        };
        assert!(v.on_passive(&spec, fail, 0).is_some());
        // An active check decides: time alone does not restore.
        assert_eq!(v.on_time(&spec, u64::MAX), None);
        assert!(v.on_probe(&spec, true, 10).is_some());
        assert!(!v.evicted);
    }
}
