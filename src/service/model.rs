//! Plain data shared by config, control and data plane.
use crate::flow::Protocol;
use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;

/// How packets reach a real server, per real server as in ipvsadm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ForwardMode {
    /// Direct routing (`-g`): only the destination MAC changes.
    Dr,
    /// Masquerading (`-m`): DNAT in, SNAT back; the real server routes via Sluice.
    Nat,
    /// IP-in-IP tunnelling (`-i`).
    Tun,
    /// DNAT + SNAT to a local address (`-b`, as in DPVS).
    FullNat,
}

impl ForwardMode {
    pub const ALL: [ForwardMode; 4] = [ForwardMode::Dr, ForwardMode::Nat, ForwardMode::Tun, ForwardMode::FullNat];

    /// The config/JSON name.
    pub fn name(self) -> &'static str {
        match self {
            ForwardMode::Dr => "dr",
            ForwardMode::Nat => "nat",
            ForwardMode::Tun => "tun",
            ForwardMode::FullNat => "fullnat",
        }
    }

    /// The `Forward` column of `ipvsadm -Ln`.
    pub fn ipvsadm_name(self) -> &'static str {
        match self {
            ForwardMode::Dr => "Route",
            ForwardMode::Nat => "Masq",
            ForwardMode::Tun => "Tunnel",
            ForwardMode::FullNat => "FullNat",
        }
    }
}

impl fmt::Display for ForwardMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ForwardMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        ForwardMode::ALL
            .iter()
            .copied()
            .find(|m| m.name() == s)
            .ok_or_else(|| format!("unknown forwarding mode {s:?} (known: dr, nat, tun, fullnat)"))
    }
}

/// What identifies a virtual service: protocol, VIP and port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceKey {
    pub proto: Protocol,
    pub vip: Ipv4Addr,
    pub port: u16,
}

impl fmt::Display for ServiceKey {
    /// As ipvsadm prints it: `TCP  198.18.1.1:80`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}:{}", self.proto.name(), self.vip, self.port)
    }
}
