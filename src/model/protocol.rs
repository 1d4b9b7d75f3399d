//! The transport protocols a service balances.

/// IP protocol numbers Sluice forwards.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Protocol {
    Tcp = 6,
    Udp = 17,
}

impl Protocol {
    pub fn from_ip_protocol(p: u8) -> Option<Protocol> {
        match p {
            6 => Some(Protocol::Tcp),
            17 => Some(Protocol::Udp),
            _ => None,
        }
    }
    pub fn name(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
        }
    }
}
