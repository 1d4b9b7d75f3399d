//! `Ipv4Cidr` and `Ipv6Cidr`: an interface address with its prefix length
//! ("198.18.0.1/24", "2001:db8::1/64").

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

/// An IPv4 address and prefix length, as assigned to an interface: `addr` keeps its
/// host bits (it is the appliance's own address, not just the network).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv4Cidr {
    pub addr: Ipv4Addr,
    pub prefix_len: u8,
}

impl Ipv4Cidr {
    /// The netmask, e.g. 255.255.255.0 for /24.
    pub fn netmask(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.mask())
    }

    /// The network address (host bits cleared).
    pub fn network(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.addr) & self.mask())
    }

    /// The subnet's broadcast address (host bits set).
    pub fn broadcast(&self) -> Ipv4Addr {
        Ipv4Addr::from(u32::from(self.addr) | !self.mask())
    }

    /// Whether `ip` is in this subnet (on-link).
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        u32::from(ip) & self.mask() == u32::from(self.addr) & self.mask()
    }

    fn mask(&self) -> u32 {
        // checked_shl: a /0 would shift by 32, which u32 does not allow.
        u32::MAX
            .checked_shl(32 - u32::from(self.prefix_len.min(32)))
            .unwrap_or(0)
    }
}

impl fmt::Display for Ipv4Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}

/// Why a string is not an `Ipv4Cidr`; the message quotes the input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ParseCidrError {
    /// Not of the form a.b.c.d/n.
    Syntax(String),
    /// The prefix length is a number but above 32.
    PrefixRange(String),
}

impl fmt::Display for ParseCidrError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ParseCidrError::Syntax(s) => write!(
                f,
                "{s:?} is not an IPv4 address with prefix (expected a.b.c.d/n)"
            ),
            ParseCidrError::PrefixRange(s) => {
                write!(f, "{s:?}: prefix length is out of range (0..=32)")
            }
        }
    }
}

impl std::error::Error for ParseCidrError {}

impl FromStr for Ipv4Cidr {
    type Err = ParseCidrError;

    /// Accepts exactly "a.b.c.d/n": the prefix is required (an interface address
    /// without one would leave the on-link subnet to guesswork).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let syntax = || ParseCidrError::Syntax(s.to_string());
        let (addr, prefix) = s.split_once('/').ok_or_else(syntax)?;
        let addr: Ipv4Addr = addr.parse().map_err(|_| syntax())?;
        // Digits only: u8::from_str would also take "+24".
        if prefix.is_empty() || prefix.len() > 3 || !prefix.bytes().all(|b| b.is_ascii_digit()) {
            return Err(syntax());
        }
        let prefix_len: u8 = prefix.parse().map_err(|_| syntax())?;
        if prefix_len > 32 {
            return Err(ParseCidrError::PrefixRange(s.to_string()));
        }
        Ok(Ipv4Cidr { addr, prefix_len })
    }
}

/// An IPv6 address and prefix length, as assigned to an interface: `addr` keeps its
/// interface identifier.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Ipv6Cidr {
    pub addr: Ipv6Addr,
    pub prefix_len: u8,
}

impl Ipv6Cidr {
    /// The prefix (interface identifier cleared), the subnet-router anycast address
    /// of the subnet (RFC 4291 section 2.6.1).
    pub fn network(&self) -> Ipv6Addr {
        Ipv6Addr::from(u128::from(self.addr) & self.mask())
    }

    /// Whether `ip` is in this subnet (on-link).
    pub fn contains(&self, ip: Ipv6Addr) -> bool {
        u128::from(ip) & self.mask() == u128::from(self.addr) & self.mask()
    }

    fn mask(&self) -> u128 {
        u128::MAX
            .checked_shl(128 - u32::from(self.prefix_len.min(128)))
            .unwrap_or(0)
    }
}

impl fmt::Display for Ipv6Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix_len)
    }
}

impl FromStr for Ipv6Cidr {
    type Err = String;

    /// Accepts exactly "address/n" with n in 0..=128, the prefix required as for IPv4.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let syntax = || {
            format!(
                "{s:?} is not an IPv6 address with prefix (expected addr/n, e.g. 2001:db8::1/64)"
            )
        };
        let (addr, prefix) = s.split_once('/').ok_or_else(syntax)?;
        let addr: Ipv6Addr = addr.parse().map_err(|_| syntax())?;
        if prefix.is_empty() || prefix.len() > 3 || !prefix.bytes().all(|b| b.is_ascii_digit()) {
            return Err(syntax());
        }
        let prefix_len: u8 = prefix.parse().map_err(|_| syntax())?;
        if prefix_len > 128 {
            return Err(format!("{s:?}: prefix length is out of range (0..=128)"));
        }
        Ok(Ipv6Cidr { addr, prefix_len })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(s: &str) -> Ipv4Cidr {
        s.parse().unwrap()
    }

    #[test]
    fn parses_and_displays() {
        let c = cidr("198.18.0.1/24");
        assert_eq!(c.addr, Ipv4Addr::new(198, 18, 0, 1));
        assert_eq!(c.prefix_len, 24);
        assert_eq!(c.to_string(), "198.18.0.1/24");
    }

    #[test]
    fn rejects_malformed() {
        for bad in [
            "198.18.0.1",
            "198.18.0.300/24",
            "198.18.0.1/",
            "1.2.3.4/+8",
            "x/8",
        ] {
            assert!(
                matches!(bad.parse::<Ipv4Cidr>(), Err(ParseCidrError::Syntax(_))),
                "{bad}"
            );
        }
        assert!(matches!(
            "1.2.3.4/33".parse::<Ipv4Cidr>(),
            Err(ParseCidrError::PrefixRange(_))
        ));
    }

    #[test]
    fn subnet_arithmetic() {
        let c = cidr("198.18.0.77/24");
        assert_eq!(c.netmask(), Ipv4Addr::new(255, 255, 255, 0));
        assert_eq!(c.network(), Ipv4Addr::new(198, 18, 0, 0));
        assert_eq!(c.broadcast(), Ipv4Addr::new(198, 18, 0, 255));
        assert!(c.contains(Ipv4Addr::new(198, 18, 0, 1)));
        assert!(!c.contains(Ipv4Addr::new(198, 18, 1, 1)));
        assert!(cidr("10.0.0.1/0").contains(Ipv4Addr::new(8, 8, 8, 8)));
        assert!(cidr("10.0.0.1/32").contains(Ipv4Addr::new(10, 0, 0, 1)));
        assert!(!cidr("10.0.0.1/32").contains(Ipv4Addr::new(10, 0, 0, 2)));
    }

    #[test]
    fn ipv6_parses_and_checks() {
        let c: Ipv6Cidr = "2001:db8::1/64".parse().unwrap();
        assert_eq!(c.addr, "2001:db8::1".parse::<Ipv6Addr>().unwrap());
        assert_eq!(c.prefix_len, 64);
        assert_eq!(c.to_string(), "2001:db8::1/64");
        assert_eq!(c.network(), "2001:db8::".parse::<Ipv6Addr>().unwrap());
        assert!(c.contains("2001:db8::ffff:1".parse().unwrap()));
        assert!(!c.contains("2001:db8:0:1::1".parse().unwrap()));
        let host: Ipv6Cidr = "2001:db8::1/128".parse().unwrap();
        assert!(!host.contains("2001:db8::2".parse().unwrap()));
        let all: Ipv6Cidr = "2001:db8::1/0".parse().unwrap();
        assert!(all.contains("fe80::1".parse().unwrap()));
        for bad in [
            "2001:db8::1",
            "2001:db8::1/",
            "2001:db8::1/+64",
            "198.18.0.1/24",
            "x/64",
        ] {
            let err = bad.parse::<Ipv6Cidr>().unwrap_err();
            assert!(err.contains("not an IPv6 address"), "{bad}: {err}");
        }
        let err = "2001:db8::1/129".parse::<Ipv6Cidr>().unwrap_err();
        assert!(err.contains("out of range"), "{err}");
    }
}
