//! The scheduling algorithms and their flags, by their ipvsadm names: what a service
//! asks for. The algorithms themselves are in `crate::sched`.
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// The Maglev lookup table size when a service names none, a prime (the kernel's
/// largest choice is 131071, its default 4093; 65537 = 2^16 + 1 gives 655 slots per
/// server at 100 servers).
pub const MH_DEFAULT_TABLE_SIZE: u32 = 65537;

/// The scheduling algorithms, by their ipvsadm names.
///
/// Every scheduler skips a server of weight 0 (draining). A server that its upper
/// connection threshold (`ipvsadm -x`) holds overloaded is skipped too, as in IPVS:
/// the worker hands the scheduler that server at weight 0
/// (`crate::dataplane::overload`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SchedulerKind {
    /// Round robin over real servers with weight > 0.
    Rr,
    /// Smooth weighted round robin (nginx semantics).
    Wrr,
    /// Least connection: smallest `active * 256 + inactive` (IPVS `ip_vs_lc`).
    Lc,
    /// Weighted least connection: smallest `(active * 256 + inactive) / weight`
    /// (IPVS `ip_vs_wlc`). The default scheduler, as in ipvsadm.
    Wlc,
    /// Shortest expected delay: smallest `(active + 1) * 256 / weight` (`ip_vs_sed`).
    Sed,
    /// Never queue: an idle server (no active connection) first, else sed (`ip_vs_nq`).
    Nq,
    /// Destination hashing over a 256-bucket table (`ip_vs_dh`).
    Dh,
    /// Source hashing over a 256-bucket table (`ip_vs_sh`), flags sh-port and
    /// sh-fallback.
    Sh,
    /// Locality-based least connection (`ip_vs_lblc`).
    Lblc,
    /// Locality-based least connection with replication (`ip_vs_lblcr`).
    Lblcr,
    /// Maglev hashing (`ip_vs_mh`), flags mh-port and mh-fallback.
    Mh,
    /// Weighted random.
    Wrandom,
    /// Power of two choices on active connections.
    P2c,
    /// Weighted failover: the available server with the highest weight (`ip_vs_fo`).
    Fo,
}

impl SchedulerKind {
    pub const ALL: &'static [SchedulerKind] = &[
        SchedulerKind::Rr,
        SchedulerKind::Wrr,
        SchedulerKind::Lc,
        SchedulerKind::Wlc,
        SchedulerKind::Sed,
        SchedulerKind::Nq,
        SchedulerKind::Dh,
        SchedulerKind::Sh,
        SchedulerKind::Lblc,
        SchedulerKind::Lblcr,
        SchedulerKind::Mh,
        SchedulerKind::Wrandom,
        SchedulerKind::P2c,
        SchedulerKind::Fo,
    ];

    /// ipvsadm's default when `-s` is not given.
    pub const DEFAULT: SchedulerKind = SchedulerKind::Wlc;

    pub fn name(self) -> &'static str {
        match self {
            SchedulerKind::Rr => "rr",
            SchedulerKind::Wrr => "wrr",
            SchedulerKind::Lc => "lc",
            SchedulerKind::Wlc => "wlc",
            SchedulerKind::Sed => "sed",
            SchedulerKind::Nq => "nq",
            SchedulerKind::Dh => "dh",
            SchedulerKind::Sh => "sh",
            SchedulerKind::Lblc => "lblc",
            SchedulerKind::Lblcr => "lblcr",
            SchedulerKind::Mh => "mh",
            SchedulerKind::Wrandom => "wrandom",
            SchedulerKind::P2c => "p2c",
            SchedulerKind::Fo => "fo",
        }
    }

    /// Whether `pick` reads [`PickContext::loads`]: the data plane gathers the
    /// per-server connection counts only for these.
    pub fn uses_loads(self) -> bool {
        matches!(
            self,
            SchedulerKind::Lc
                | SchedulerKind::Wlc
                | SchedulerKind::Sed
                | SchedulerKind::Nq
                | SchedulerKind::Lblc
                | SchedulerKind::Lblcr
                | SchedulerKind::P2c
        )
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

impl Serialize for SchedulerKind {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for SchedulerKind {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

/// Scheduler flags, as ipvsadm's `-b`/`--sched-flags` names them. Each only affects
/// its scheduler (`sh-*` for sh, `mh-*` for mh).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SchedFlags {
    /// `sh-fallback`: when the hashed bucket's server is unavailable (weight 0), sh
    /// walks the table for an available one instead of refusing the connection.
    pub sh_fallback: bool,
    /// `sh-port`: sh hashes the client's source port together with its address.
    pub sh_port: bool,
    /// `mh-fallback`: as sh-fallback, for mh (see [`mh`] for when it matters).
    pub mh_fallback: bool,
    /// `mh-port`: mh hashes the client's source port together with its address.
    pub mh_port: bool,
}

impl SchedFlags {
    /// The flag names, in the order [`fmt::Display`] writes them.
    pub const NAMES: [&'static str; 4] = ["sh-fallback", "sh-port", "mh-fallback", "mh-port"];

    fn flag_mut(&mut self, name: &str) -> Option<&mut bool> {
        match name {
            "sh-fallback" => Some(&mut self.sh_fallback),
            "sh-port" => Some(&mut self.sh_port),
            "mh-fallback" => Some(&mut self.mh_fallback),
            "mh-port" => Some(&mut self.mh_port),
            _ => None,
        }
    }

    fn values(&self) -> [bool; 4] {
        [
            self.sh_fallback,
            self.sh_port,
            self.mh_fallback,
            self.mh_port,
        ]
    }

    /// Whether no flag is set.
    pub fn is_empty(&self) -> bool {
        self.values().iter().all(|&set| !set)
    }

    /// An error naming the first flag set that `kind` does not use, as ipvsadm refuses
    /// `-s rr -b sh-port` ("incompatible scheduler flag").
    pub fn check_compatible(&self, kind: SchedulerKind) -> Result<(), String> {
        let prefix = match kind {
            SchedulerKind::Sh => "sh-",
            SchedulerKind::Mh => "mh-",
            _ => "",
        };
        match Self::NAMES
            .iter()
            .zip(self.values())
            .find(|(name, set)| *set && (prefix.is_empty() || !name.starts_with(prefix)))
        {
            Some((name, _)) => Err(format!(
                "scheduler flag {name:?} does not apply to scheduler {kind}"
            )),
            None => Ok(()),
        }
    }
}

impl FromStr for SchedFlags {
    type Err = String;
    /// ipvsadm's `-b` value: comma-separated flag names (`sh-fallback,sh-port`); the
    /// empty string is no flag. Spaces around names are ignored.
    fn from_str(s: &str) -> Result<Self, String> {
        let mut flags = SchedFlags::default();
        if s.trim().is_empty() {
            return Ok(flags);
        }
        for name in s.split(',').map(str::trim) {
            match flags.flag_mut(name) {
                Some(flag) => *flag = true,
                None => {
                    return Err(format!(
                        "unknown scheduler flag {name:?} (known: {})",
                        Self::NAMES.join(", ")
                    ))
                }
            }
        }
        Ok(flags)
    }
}

impl fmt::Display for SchedFlags {
    /// Comma-separated, as ipvsadm takes them; empty when none is set.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        for (name, set) in Self::NAMES.iter().zip(self.values()) {
            if set {
                if !first {
                    f.write_str(",")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        Ok(())
    }
}

impl Serialize for SchedFlags {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for SchedFlags {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}
