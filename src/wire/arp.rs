//! ARP (RFC 826) for Ethernet hardware and IPv4 protocol addresses, the only kind
//! Sluice speaks.

use std::net::Ipv4Addr;

use super::ethernet::{EtherType, MacAddr};
use super::{read_u16, write_u16, WireError};

/// ARP hardware type for Ethernet.
pub const HARDWARE_ETHERNET: u16 = 1;

/// ARP operation codes; unknown values are kept, not lost.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operation {
    Request,
    Reply,
    Unknown(u16),
}

impl From<u16> for Operation {
    fn from(value: u16) -> Self {
        match value {
            1 => Operation::Request,
            2 => Operation::Reply,
            other => Operation::Unknown(other),
        }
    }
}

impl From<Operation> for u16 {
    fn from(op: Operation) -> u16 {
        match op {
            Operation::Request => 1,
            Operation::Reply => 2,
            Operation::Unknown(other) => other,
        }
    }
}

mod field {
    use core::ops::Range;

    pub const HTYPE: usize = 0;
    pub const PTYPE: usize = 2;
    pub const HLEN: usize = 4;
    pub const PLEN: usize = 5;
    pub const OPER: usize = 6;
    /// End of the fixed part, which says how long the addresses are.
    pub const FIXED_END: usize = 8;
    // Address fields for hlen 6 / plen 4, the only layout a checked packet has.
    pub const SHA: Range<usize> = 8..14;
    pub const SPA: Range<usize> = 14..18;
    pub const THA: Range<usize> = 18..24;
    pub const TPA: Range<usize> = 24..28;
}

/// Length of an Ethernet/IPv4 ARP packet.
pub const PACKET_LEN: usize = field::TPA.end;

/// A view of an Ethernet/IPv4 ARP packet. Bytes after the 28-byte packet (Ethernet
/// padding) are ignored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps `buffer` without checks; accessors panic if it is shorter than 28 bytes.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps `buffer` after checking it is an Ethernet/IPv4 ARP packet, complete.
    ///
    /// Errors: `Truncated` if the fixed part or the addresses are cut short;
    /// `Unsupported` for a hardware type other than Ethernet or a protocol other than
    /// IPv4; `Malformed` for Ethernet/IPv4 with address lengths other than 6 and 4.
    pub fn new_checked(buffer: T) -> Result<Packet<T>, WireError> {
        let packet = Self::new_unchecked(buffer);
        packet.check()?;
        Ok(packet)
    }

    fn check(&self) -> Result<(), WireError> {
        let data = self.buffer.as_ref();
        if data.len() < field::FIXED_END {
            return Err(WireError::Truncated);
        }
        if read_u16(data, field::HTYPE) != HARDWARE_ETHERNET
            || read_u16(data, field::PTYPE) != EtherType::IPV4.0
        {
            return Err(WireError::Unsupported);
        }
        if data[field::HLEN] != 6 || data[field::PLEN] != 4 {
            return Err(WireError::Malformed);
        }
        if data.len() < PACKET_LEN {
            return Err(WireError::Truncated);
        }
        Ok(())
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    pub fn hardware_type(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::HTYPE)
    }

    pub fn protocol_type(&self) -> EtherType {
        EtherType(read_u16(self.buffer.as_ref(), field::PTYPE))
    }

    pub fn hardware_len(&self) -> u8 {
        self.buffer.as_ref()[field::HLEN]
    }

    pub fn protocol_len(&self) -> u8 {
        self.buffer.as_ref()[field::PLEN]
    }

    pub fn operation(&self) -> Operation {
        read_u16(self.buffer.as_ref(), field::OPER).into()
    }

    pub fn sender_hardware_addr(&self) -> MacAddr {
        MacAddr::from_bytes(&self.buffer.as_ref()[field::SHA])
    }

    pub fn sender_protocol_addr(&self) -> Ipv4Addr {
        ipv4_at(self.buffer.as_ref(), field::SPA.start)
    }

    pub fn target_hardware_addr(&self) -> MacAddr {
        MacAddr::from_bytes(&self.buffer.as_ref()[field::THA])
    }

    pub fn target_protocol_addr(&self) -> Ipv4Addr {
        ipv4_at(self.buffer.as_ref(), field::TPA.start)
    }
}

fn ipv4_at(data: &[u8], at: usize) -> Ipv4Addr {
    Ipv4Addr::new(data[at], data[at + 1], data[at + 2], data[at + 3])
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_hardware_type(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::HTYPE, value);
    }

    pub fn set_protocol_type(&mut self, value: EtherType) {
        write_u16(self.buffer.as_mut(), field::PTYPE, value.0);
    }

    pub fn set_hardware_len(&mut self, value: u8) {
        self.buffer.as_mut()[field::HLEN] = value;
    }

    pub fn set_protocol_len(&mut self, value: u8) {
        self.buffer.as_mut()[field::PLEN] = value;
    }

    pub fn set_operation(&mut self, op: Operation) {
        write_u16(self.buffer.as_mut(), field::OPER, op.into());
    }

    pub fn set_sender_hardware_addr(&mut self, addr: MacAddr) {
        self.buffer.as_mut()[field::SHA].copy_from_slice(&addr.0);
    }

    pub fn set_sender_protocol_addr(&mut self, addr: Ipv4Addr) {
        self.buffer.as_mut()[field::SPA].copy_from_slice(&addr.octets());
    }

    pub fn set_target_hardware_addr(&mut self, addr: MacAddr) {
        self.buffer.as_mut()[field::THA].copy_from_slice(&addr.0);
    }

    pub fn set_target_protocol_addr(&mut self, addr: Ipv4Addr) {
        self.buffer.as_mut()[field::TPA].copy_from_slice(&addr.octets());
    }
}

/// A parsed Ethernet/IPv4 ARP request or reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    pub operation: Operation,
    pub sender_hardware_addr: MacAddr,
    pub sender_protocol_addr: Ipv4Addr,
    pub target_hardware_addr: MacAddr,
    pub target_protocol_addr: Ipv4Addr,
}

impl Repr {
    /// Parses a checked packet; an operation other than request or reply is
    /// `Malformed`.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr, WireError> {
        packet.check()?;
        let operation = packet.operation();
        if let Operation::Unknown(_) = operation {
            return Err(WireError::Malformed);
        }
        Ok(Repr {
            operation,
            sender_hardware_addr: packet.sender_hardware_addr(),
            sender_protocol_addr: packet.sender_protocol_addr(),
            target_hardware_addr: packet.target_hardware_addr(),
            target_protocol_addr: packet.target_protocol_addr(),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        PACKET_LEN
    }

    /// Writes the whole packet; the buffer must hold at least 28 bytes.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_hardware_type(HARDWARE_ETHERNET);
        packet.set_protocol_type(EtherType::IPV4);
        packet.set_hardware_len(6);
        packet.set_protocol_len(4);
        packet.set_operation(self.operation);
        packet.set_sender_hardware_addr(self.sender_hardware_addr);
        packet.set_sender_protocol_addr(self.sender_protocol_addr);
        packet.set_target_hardware_addr(self.target_hardware_addr);
        packet.set_target_protocol_addr(self.target_protocol_addr);
    }
}

/// Rewrites `frame` into a broadcast ARP who-has `target` from (`mac`, `ip`), keeping
/// any VLAN tags before `l3`. Returns the new length (at least the 60-byte minimum),
/// or None when the buffer is too short.
pub fn write_request(
    frame: &mut [u8],
    l3: usize,
    mac: MacAddr,
    ip: Ipv4Addr,
    target: Ipv4Addr,
) -> Option<usize> {
    let end = l3 + PACKET_LEN;
    let len = end.max(60);
    if frame.len() < len || l3 < super::ethernet::HEADER_LEN {
        return None;
    }
    {
        let mut eth = super::ethernet::Frame::new_unchecked(&mut frame[..]);
        eth.set_dst_addr(MacAddr::BROADCAST);
        eth.set_src_addr(mac);
    }
    // The innermost EtherType sits just before L3 (after any VLAN tags).
    frame[l3 - 2..l3].copy_from_slice(&EtherType::ARP.0.to_be_bytes());
    let repr = Repr {
        operation: Operation::Request,
        sender_hardware_addr: mac,
        sender_protocol_addr: ip,
        target_hardware_addr: MacAddr::ZERO,
        target_protocol_addr: target,
    };
    repr.emit(&mut Packet::new_unchecked(&mut frame[l3..end]));
    frame[end..len].fill(0);
    Some(len)
}

#[cfg(test)]
mod tests {
    use super::*;

    // "Who has 10.0.0.2? Tell 10.0.0.1" from 52:54:00:12:34:56, as on the wire after
    // the Ethernet header, followed by the 18 bytes of padding a 60-byte frame carries.
    static REQUEST: [u8; 46] = [
        0x00, 0x01, 0x08, 0x00, 0x06, 0x04, 0x00, 0x01, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x0a,
        0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0a, 0x00, 0x00, 0x02, 0, 0, 0, 0,
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ];

    // "10.0.0.2 is at 02:00:00:00:00:02" back to the requester.
    static REPLY: [u8; 28] = [
        0x00, 0x01, 0x08, 0x00, 0x06, 0x04, 0x00, 0x02, 0x02, 0x00, 0x00, 0x00, 0x00, 0x02, 0x0a,
        0x00, 0x00, 0x02, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x0a, 0x00, 0x00, 0x01,
    ];

    fn request_repr() -> Repr {
        Repr {
            operation: Operation::Request,
            sender_hardware_addr: MacAddr([0x52, 0x54, 0x00, 0x12, 0x34, 0x56]),
            sender_protocol_addr: Ipv4Addr::new(10, 0, 0, 1),
            target_hardware_addr: MacAddr::ZERO,
            target_protocol_addr: Ipv4Addr::new(10, 0, 0, 2),
        }
    }

    #[test]
    fn parse_request_with_padding() {
        let packet = Packet::new_checked(&REQUEST[..]).unwrap();
        assert_eq!(packet.hardware_type(), HARDWARE_ETHERNET);
        assert_eq!(packet.protocol_type(), EtherType::IPV4);
        assert_eq!((packet.hardware_len(), packet.protocol_len()), (6, 4));
        assert_eq!(Repr::parse(&packet).unwrap(), request_repr());
    }

    #[test]
    fn emit_reply() {
        let repr = Repr {
            operation: Operation::Reply,
            sender_hardware_addr: MacAddr([2, 0, 0, 0, 0, 2]),
            sender_protocol_addr: Ipv4Addr::new(10, 0, 0, 2),
            target_hardware_addr: MacAddr([0x52, 0x54, 0x00, 0x12, 0x34, 0x56]),
            target_protocol_addr: Ipv4Addr::new(10, 0, 0, 1),
        };
        let mut buf = [0xaa; 28];
        repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, REPLY);
        assert_eq!(repr.buffer_len(), 28);
        let parsed = Repr::parse(&Packet::new_checked(&buf[..]).unwrap()).unwrap();
        assert_eq!(parsed, repr);
    }

    #[test]
    fn every_truncation_is_truncated() {
        for len in 0..PACKET_LEN {
            assert_eq!(
                Packet::new_checked(&REQUEST[..len]).err(),
                Some(WireError::Truncated),
                "len {len}"
            );
        }
    }

    #[test]
    fn non_ethernet_ipv4_is_unsupported() {
        let mut ieee802 = REQUEST;
        ieee802[1] = 6; // hardware type IEEE 802
        assert_eq!(
            Packet::new_checked(&ieee802[..]).err(),
            Some(WireError::Unsupported)
        );
        let mut ipv6 = REQUEST;
        ipv6[2..4].copy_from_slice(&[0x86, 0xdd]);
        assert_eq!(
            Packet::new_checked(&ipv6[..]).err(),
            Some(WireError::Unsupported)
        );
    }

    #[test]
    fn wrong_address_lengths_are_malformed() {
        let mut hlen = REQUEST;
        hlen[4] = 8;
        assert_eq!(
            Packet::new_checked(&hlen[..]).err(),
            Some(WireError::Malformed)
        );
        let mut plen = REQUEST;
        plen[5] = 16;
        assert_eq!(
            Packet::new_checked(&plen[..]).err(),
            Some(WireError::Malformed)
        );
    }

    #[test]
    fn unknown_operation_is_kept_by_view_and_refused_by_repr() {
        let mut rarp = REQUEST;
        rarp[7] = 3; // RARP request
        let packet = Packet::new_checked(&rarp[..]).unwrap();
        assert_eq!(packet.operation(), Operation::Unknown(3));
        assert_eq!(u16::from(packet.operation()), 3);
        assert_eq!(Repr::parse(&packet), Err(WireError::Malformed));
    }

    #[test]
    fn arp_request_written_over_a_tcp_frame() {
        let mut frame = [0xaau8; 74];
        let mac = MacAddr([2, 0x53, 0x4c, 0, 0, 1]);
        let len = write_request(
            &mut frame,
            14,
            mac,
            [198, 18, 0, 1].into(),
            [198, 18, 0, 11].into(),
        )
        .unwrap();
        assert_eq!(len, 60);
        assert_eq!(&frame[0..6], &[0xff; 6]);
        assert_eq!(&frame[6..12], &mac.0);
        assert_eq!(&frame[12..14], &[0x08, 0x06]);
        let p = Packet::new_checked(&frame[14..42]).unwrap();
        let r = Repr::parse(&p).unwrap();
        assert_eq!(r.operation, Operation::Request);
        assert_eq!(r.sender_protocol_addr, Ipv4Addr::new(198, 18, 0, 1));
        assert_eq!(r.target_protocol_addr, Ipv4Addr::new(198, 18, 0, 11));
        assert!(frame[42..60].iter().all(|&b| b == 0), "padding zeroed");
        assert_eq!(
            write_request(
                &mut [0u8; 40],
                14,
                mac,
                Ipv4Addr::UNSPECIFIED,
                Ipv4Addr::UNSPECIFIED
            ),
            None
        );
    }
}
