//! Flow identity: the 5-tuple key sessions are found by. The session index stores no
//! keys (tags and slab indices only), so IPv6 adds a key type and an entry slab beside
//! the IPv4 one, not a new index.
use crate::model::Protocol;
use std::hash::Hash;
use std::net::{Ipv4Addr, Ipv6Addr};

pub mod ownership;
pub mod parse;
pub mod rss;

/// What a session table needs of a key: cheap to copy, hash and compare.
pub trait FlowKey: Copy + Eq + Hash + std::fmt::Debug + Send + 'static {
    /// The same flow seen from the other end (source and destination swapped).
    fn reversed(&self) -> Self;
}

/// An IPv4 5-tuple as it appears on the wire of one direction. 16 bytes with padding;
/// addresses kept as host-order `u32` so hashing and comparing are integer operations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FlowKey4 {
    pub src: u32,
    pub dst: u32,
    pub sport: u16,
    pub dport: u16,
    pub proto: Protocol,
}

impl FlowKey4 {
    pub fn new(proto: Protocol, src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16) -> Self {
        FlowKey4 {
            src: u32::from(src),
            dst: u32::from(dst),
            sport,
            dport,
            proto,
        }
    }
    pub fn src_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.src)
    }
    pub fn dst_addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.dst)
    }
}

impl FlowKey for FlowKey4 {
    #[inline]
    fn reversed(&self) -> Self {
        FlowKey4 {
            src: self.dst,
            dst: self.src,
            sport: self.dport,
            dport: self.sport,
            proto: self.proto,
        }
    }
}

/// An IPv6 5-tuple as it appears on the wire of one direction (40 bytes).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FlowKey6 {
    pub src: Ipv6Addr,
    pub dst: Ipv6Addr,
    pub sport: u16,
    pub dport: u16,
    pub proto: Protocol,
}

impl FlowKey for FlowKey6 {
    #[inline]
    fn reversed(&self) -> Self {
        FlowKey6 {
            src: self.dst,
            dst: self.src,
            sport: self.dport,
            dport: self.sport,
            proto: self.proto,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_is_compact_and_reverses() {
        assert_eq!(std::mem::size_of::<FlowKey4>(), 16);
        let k = FlowKey4::new(
            Protocol::Tcp,
            [198, 18, 0, 100].into(),
            40000,
            [198, 18, 1, 1].into(),
            80,
        );
        let r = k.reversed();
        assert_eq!(
            (r.src_addr(), r.sport, r.dst_addr(), r.dport),
            (k.dst_addr(), 80, k.src_addr(), 40000)
        );
        assert_eq!(r.reversed(), k);
    }
}
