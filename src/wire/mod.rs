//! Zero-copy views over packet headers.
//!
//! Each protocol module offers a `Packet`/`Frame` view over any `T: AsRef<[u8]>`:
//! `new_unchecked` wraps a buffer as is, `new_checked` validates every length the view
//! relies on, so that afterwards no accessor can panic. Setters exist when
//! `T: AsMut<[u8]>`, so a frame can be rewritten in place inside its mbuf. Where it helps,
//! a `Repr` holds the parsed, owned fields and can `emit` them back into a buffer.
//!
//! Addresses: MAC addresses are [`ethernet::MacAddr`]; IPv4 addresses are
//! `std::net::Ipv4Addr`, which is `Copy`, four bytes wide, and what the rest of the
//! program (config, CLI) already speaks.

use core::fmt;

pub mod arp;
pub mod checksum;
pub mod ethernet;
pub mod icmp;
pub mod icmpv6;
pub mod ipv4;
pub mod ipv6;
pub mod tcp;
pub mod udp;
pub mod vrrp;

pub use ethernet::{EtherType, L2Header, MacAddr};

/// Why a buffer could not be viewed as a given header.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WireError {
    /// The buffer ends before the header, or before a length the header declares.
    Truncated,
    /// A field holds a value the format forbids (IPv4 version or IHL, a length field
    /// smaller than the header, a TCP option running past its header).
    Malformed,
    /// Well formed but outside what Sluice parses (ARP for other than Ethernet/IPv4).
    Unsupported,
}

impl fmt::Display for WireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WireError::Truncated => "truncated",
            WireError::Malformed => "malformed",
            WireError::Unsupported => "unsupported",
        })
    }
}

impl std::error::Error for WireError {}

/// IP protocol numbers (IPv4 `protocol`, IPv6 `next header`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct IpProtocol(pub u8);

impl IpProtocol {
    pub const ICMP: IpProtocol = IpProtocol(1);
    /// IP-in-IP, used by the TUN forwarding mode.
    pub const IPIP: IpProtocol = IpProtocol(4);
    pub const TCP: IpProtocol = IpProtocol(6);
    pub const UDP: IpProtocol = IpProtocol(17);
    pub const IPV6: IpProtocol = IpProtocol(41);
    pub const ICMPV6: IpProtocol = IpProtocol(58);
}

impl fmt::Display for IpProtocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            IpProtocol::ICMP => f.write_str("icmp"),
            IpProtocol::IPIP => f.write_str("ipip"),
            IpProtocol::TCP => f.write_str("tcp"),
            IpProtocol::UDP => f.write_str("udp"),
            IpProtocol::IPV6 => f.write_str("ipv6"),
            IpProtocol::ICMPV6 => f.write_str("icmpv6"),
            IpProtocol(other) => write!(f, "{other}"),
        }
    }
}

/// Reads a big-endian u16 at `at`. Callers have validated the length beforehand.
#[inline(always)]
pub(crate) fn read_u16(data: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([data[at], data[at + 1]])
}

/// Reads a big-endian u32 at `at`. Callers have validated the length beforehand.
#[inline(always)]
pub(crate) fn read_u32(data: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([data[at], data[at + 1], data[at + 2], data[at + 3]])
}

#[inline(always)]
pub(crate) fn write_u16(data: &mut [u8], at: usize, value: u16) {
    data[at..at + 2].copy_from_slice(&value.to_be_bytes());
}

#[inline(always)]
pub(crate) fn write_u32(data: &mut [u8], at: usize, value: u32) {
    data[at..at + 4].copy_from_slice(&value.to_be_bytes());
}

#[cfg(test)]
pub(crate) mod test_util {
    /// Bytes from a string of hex digits (as scapy's `raw(p).hex()` prints them).
    pub fn unhex(hex: &str) -> Vec<u8> {
        (0..hex.len() / 2)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).expect("hex digits"))
            .collect()
    }

    /// Deterministic xorshift64 generator for fuzz-style tests (no extra crates).
    pub struct XorShift(pub u64);

    impl XorShift {
        pub fn next_u64(&mut self) -> u64 {
            let mut x = self.0;
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            self.0 = x;
            x
        }

        pub fn below(&mut self, bound: usize) -> usize {
            (self.next_u64() % bound as u64) as usize
        }

        pub fn fill(&mut self, buf: &mut [u8]) {
            for b in buf {
                *b = self.next_u64() as u8;
            }
        }

        /// A random IPv4 address a host may send from (`classify` drops the others).
        pub fn host_v4(&mut self) -> std::net::Ipv4Addr {
            loop {
                let addr = std::net::Ipv4Addr::from(self.next_u64() as u32);
                if !super::ipv4::is_martian_source(addr) {
                    return addr;
                }
            }
        }
    }

    /// Runs a Python script with scapy and returns what it printed, for tests that
    /// let scapy judge the bytes Sluice writes. scripts/setup.sh installs Debian's
    /// python3-scapy, so its absence fails the test instead of skipping the check.
    pub fn run_scapy(script: &str) -> String {
        let output = ["/usr/bin/python3", "python3"]
            .iter()
            .find_map(|python| {
                let out = std::process::Command::new(python)
                    .args(["-c", script])
                    .output()
                    .ok()?;
                out.status.success().then_some(out.stdout)
            })
            .expect("no python3 with scapy: run scripts/setup.sh");
        String::from_utf8(output).expect("scapy printed UTF-8")
    }
}
