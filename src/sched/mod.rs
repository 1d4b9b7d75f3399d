//! Schedulers: which real server gets a new connection. One trait, one file each.
use std::fmt;
use std::str::FromStr;

/// The scheduling algorithms, by their ipvsadm names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SchedulerKind {
    /// Round robin over real servers with weight > 0.
    Rr,
    /// Smooth weighted round robin (nginx semantics).
    Wrr,
}

impl SchedulerKind {
    pub const ALL: &'static [SchedulerKind] = &[SchedulerKind::Rr, SchedulerKind::Wrr];

    pub fn name(self) -> &'static str {
        match self {
            SchedulerKind::Rr => "rr",
            SchedulerKind::Wrr => "wrr",
        }
    }
}

impl fmt::Display for SchedulerKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for SchedulerKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        SchedulerKind::ALL
            .iter()
            .copied()
            .find(|k| k.name() == s)
            .ok_or_else(|| {
                let known: Vec<_> = SchedulerKind::ALL.iter().map(|k| k.name()).collect();
                format!("unknown scheduler {s:?} (known: {})", known.join(", "))
            })
    }
}
