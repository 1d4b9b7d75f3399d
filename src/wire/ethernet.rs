//! Ethernet II frames, MAC addresses, and 802.1Q / 802.1ad VLAN tags.

use core::fmt;

use super::{read_u16, write_u16, WireError};

/// A 48-bit IEEE 802 MAC address.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MacAddr(pub [u8; 6]);

impl MacAddr {
    pub const BROADCAST: MacAddr = MacAddr([0xff; 6]);
    pub const ZERO: MacAddr = MacAddr([0; 6]);

    /// The Ethernet address of IPv4 multicast group `group` (RFC 1112 section 6.4):
    /// 01:00:5e and the group's low 23 bits.
    #[inline]
    pub const fn ipv4_multicast(group: std::net::Ipv4Addr) -> MacAddr {
        let [_, b, c, d] = group.octets();
        MacAddr([0x01, 0x00, 0x5e, b & 0x7f, c, d])
    }

    /// The Ethernet address of IPv6 multicast group `group` (RFC 2464 section 7):
    /// 33:33 and the group's low 32 bits.
    #[inline]
    pub const fn ipv6_multicast(group: std::net::Ipv6Addr) -> MacAddr {
        let o = group.octets();
        MacAddr([0x33, 0x33, o[12], o[13], o[14], o[15]])
    }

    /// Reads a MAC address from the first six bytes of `bytes`.
    ///
    /// # Panics
    /// If `bytes` is shorter than six bytes.
    #[inline]
    pub fn from_bytes(bytes: &[u8]) -> MacAddr {
        let mut mac = [0; 6];
        mac.copy_from_slice(&bytes[..6]);
        MacAddr(mac)
    }

    #[inline]
    pub const fn octets(&self) -> [u8; 6] {
        self.0
    }

    #[inline]
    pub fn is_broadcast(&self) -> bool {
        *self == Self::BROADCAST
    }

    /// Group address (I/G bit set); broadcast is a multicast address too.
    #[inline]
    pub const fn is_multicast(&self) -> bool {
        self.0[0] & 0x01 != 0
    }

    /// One of the 33:33:xx:xx:xx:xx MACs IPv6 multicast groups map to (RFC 2464).
    #[inline]
    pub const fn is_ipv6_multicast(&self) -> bool {
        self.0[0] == 0x33 && self.0[1] == 0x33
    }

    #[inline]
    pub const fn is_unicast(&self) -> bool {
        !self.is_multicast()
    }

    /// Locally administered (U/L bit set), as in virtual NICs and containers.
    #[inline]
    pub const fn is_local(&self) -> bool {
        self.0[0] & 0x02 != 0
    }
}

impl From<[u8; 6]> for MacAddr {
    fn from(octets: [u8; 6]) -> Self {
        MacAddr(octets)
    }
}

impl fmt::Display for MacAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let [a, b, c, d, e, g] = self.0;
        write!(f, "{a:02x}:{b:02x}:{c:02x}:{d:02x}:{e:02x}:{g:02x}")
    }
}

/// An EtherType. Plain consts rather than an enum so unknown values round-trip and
/// `match` still works on the named ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EtherType(pub u16);

impl EtherType {
    pub const IPV4: EtherType = EtherType(0x0800);
    pub const ARP: EtherType = EtherType(0x0806);
    /// 802.1Q customer VLAN tag.
    pub const VLAN: EtherType = EtherType(0x8100);
    pub const IPV6: EtherType = EtherType(0x86dd);
    /// 802.1ad service VLAN tag (the outer tag of QinQ).
    pub const QINQ: EtherType = EtherType(0x88a8);

    /// A tag protocol identifier that introduces a VLAN tag.
    #[inline]
    pub const fn is_vlan_tag(self) -> bool {
        self.0 == Self::VLAN.0 || self.0 == Self::QINQ.0
    }
}

impl fmt::Display for EtherType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "0x{:04x}", self.0)
    }
}

mod field {
    use core::ops::Range;

    pub const DESTINATION: Range<usize> = 0..6;
    pub const SOURCE: Range<usize> = 6..12;
    pub const ETHERTYPE: usize = 12;
    pub const PAYLOAD: usize = 14;
    /// A VLAN tag: TCI (priority, DEI, VLAN id) then the next EtherType.
    pub const VLAN_TAG_LEN: usize = 4;
    pub const VLAN_TCI: usize = 0;
    pub const VLAN_NEXT_ETHERTYPE: usize = 2;
}

/// Length of the untagged Ethernet II header.
pub const HEADER_LEN: usize = field::PAYLOAD;
/// Length of one VLAN tag.
pub const VLAN_TAG_LEN: usize = field::VLAN_TAG_LEN;
/// Most VLAN tags [`parse_l2`] walks through (QinQ: a service tag, then a customer tag).
pub const MAX_VLAN_TAGS: u8 = 2;

/// A view of an Ethernet II frame (without FCS).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Frame<T> {
    /// Wraps `buffer` without checks; accessors panic if it is shorter than 14 bytes.
    #[inline]
    pub const fn new_unchecked(buffer: T) -> Frame<T> {
        Frame { buffer }
    }

    /// Wraps `buffer` after checking it holds the 14-byte header.
    #[inline]
    pub fn new_checked(buffer: T) -> Result<Frame<T>, WireError> {
        let frame = Self::new_unchecked(buffer);
        frame.check_len()?;
        Ok(frame)
    }

    #[inline]
    pub fn check_len(&self) -> Result<(), WireError> {
        if self.buffer.as_ref().len() < HEADER_LEN {
            Err(WireError::Truncated)
        } else {
            Ok(())
        }
    }

    #[inline]
    pub fn into_inner(self) -> T {
        self.buffer
    }

    #[inline]
    pub fn dst_addr(&self) -> MacAddr {
        MacAddr::from_bytes(&self.buffer.as_ref()[field::DESTINATION])
    }

    #[inline]
    pub fn src_addr(&self) -> MacAddr {
        MacAddr::from_bytes(&self.buffer.as_ref()[field::SOURCE])
    }

    /// The outer EtherType, which may be a VLAN tag protocol id; see [`parse_l2`].
    #[inline]
    pub fn ethertype(&self) -> EtherType {
        EtherType(read_u16(self.buffer.as_ref(), field::ETHERTYPE))
    }

    /// Everything after the 14-byte header, VLAN tags included.
    #[inline]
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[field::PAYLOAD..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Frame<T> {
    #[inline]
    pub fn set_dst_addr(&mut self, addr: MacAddr) {
        self.buffer.as_mut()[field::DESTINATION].copy_from_slice(&addr.0);
    }

    #[inline]
    pub fn set_src_addr(&mut self, addr: MacAddr) {
        self.buffer.as_mut()[field::SOURCE].copy_from_slice(&addr.0);
    }

    #[inline]
    pub fn set_ethertype(&mut self, ethertype: EtherType) {
        write_u16(self.buffer.as_mut(), field::ETHERTYPE, ethertype.0);
    }

    #[inline]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::PAYLOAD..]
    }
}

/// The L2 layout of a frame once its VLAN tags are walked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct L2Header {
    /// Number of VLAN tags between the source MAC and the inner EtherType (0..=2).
    pub vlan_tags: u8,
    /// The innermost VLAN id (12 bits), if the frame is tagged.
    pub vlan_id: Option<u16>,
    /// The EtherType of the L3 payload. After two tags it is returned as found, even
    /// if it is a third tag: Sluice does not look deeper.
    pub ethertype: EtherType,
    /// Offset of the L3 header from the start of the frame.
    pub l3_offset: usize,
}

/// Walks the Ethernet header and up to [`MAX_VLAN_TAGS`] VLAN tags (0x8100 or 0x88a8,
/// in either position, since switches in the wild use both).
#[inline(always)]
pub fn parse_l2(frame: &[u8]) -> Result<L2Header, WireError> {
    if frame.len() < HEADER_LEN {
        return Err(WireError::Truncated);
    }
    let mut ethertype = EtherType(read_u16(frame, field::ETHERTYPE));
    let mut offset = HEADER_LEN;
    let mut vlan_tags = 0;
    let mut vlan_id = None;
    while ethertype.is_vlan_tag() && vlan_tags < MAX_VLAN_TAGS {
        if frame.len() < offset + VLAN_TAG_LEN {
            return Err(WireError::Truncated);
        }
        vlan_id = Some(read_u16(frame, offset + field::VLAN_TCI) & 0x0fff);
        ethertype = EtherType(read_u16(frame, offset + field::VLAN_NEXT_ETHERTYPE));
        offset += VLAN_TAG_LEN;
        vlan_tags += 1;
    }
    Ok(L2Header {
        vlan_tags,
        vlan_id,
        ethertype,
        l3_offset: offset,
    })
}

/// Owned Ethernet header fields, for building frames.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    pub src_addr: MacAddr,
    pub dst_addr: MacAddr,
    pub ethertype: EtherType,
}

impl Repr {
    #[inline]
    pub fn parse<T: AsRef<[u8]>>(frame: &Frame<T>) -> Result<Repr, WireError> {
        frame.check_len()?;
        Ok(Repr {
            src_addr: frame.src_addr(),
            dst_addr: frame.dst_addr(),
            ethertype: frame.ethertype(),
        })
    }

    #[inline]
    pub const fn header_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header into `frame`, whose buffer must hold at least 14 bytes.
    #[inline]
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, frame: &mut Frame<T>) {
        frame.set_src_addr(self.src_addr);
        frame.set_dst_addr(self.dst_addr);
        frame.set_ethertype(self.ethertype);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // An ARP request as captured from a Linux host: broadcast, 42 bytes (no padding).
    static ARP_FRAME: [u8; 42] = [
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x08, 0x06, 0x00,
        0x01, 0x08, 0x00, 0x06, 0x04, 0x00, 0x01, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x0a, 0x00,
        0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0a, 0x00, 0x00, 0x02,
    ];

    // QinQ: service tag 0x88a8 vid 100, customer tag 0x8100 prio 5 vid 200, then IPv4.
    static QINQ_HEADER: [u8; 22] = [
        0x02, 0x00, 0x00, 0x00, 0x00, 0x01, 0x02, 0x00, 0x00, 0x00, 0x00, 0x02, 0x88, 0xa8, 0x00,
        0x64, 0x81, 0x00, 0xa0, 0xc8, 0x08, 0x00,
    ];

    #[test]
    fn frame_fields() {
        let frame = Frame::new_checked(&ARP_FRAME[..]).unwrap();
        assert!(frame.dst_addr().is_broadcast());
        assert_eq!(
            frame.src_addr(),
            MacAddr([0x52, 0x54, 0x00, 0x12, 0x34, 0x56])
        );
        assert_eq!(frame.ethertype(), EtherType::ARP);
        assert_eq!(frame.payload().len(), 28);
        assert_eq!(frame.payload()[..2], [0x00, 0x01]);
    }

    #[test]
    fn frame_setters_round_trip() {
        let mut buf = ARP_FRAME;
        let mut frame = Frame::new_checked(&mut buf[..]).unwrap();
        let repr = Repr {
            src_addr: MacAddr([2, 0, 0, 0, 0, 9]),
            dst_addr: MacAddr([2, 0, 0, 0, 0, 8]),
            ethertype: EtherType::IPV4,
        };
        repr.emit(&mut frame);
        assert_eq!(Repr::parse(&frame).unwrap(), repr);
        assert_eq!(buf[..14], [2, 0, 0, 0, 0, 8, 2, 0, 0, 0, 0, 9, 0x08, 0x00]);
        assert_eq!(buf[14..], ARP_FRAME[14..], "payload untouched");
    }

    #[test]
    fn truncated_frame_rejected() {
        for len in 0..HEADER_LEN {
            assert_eq!(
                Frame::new_checked(&ARP_FRAME[..len]),
                Err(WireError::Truncated)
            );
            assert_eq!(parse_l2(&ARP_FRAME[..len]), Err(WireError::Truncated));
        }
    }

    #[test]
    fn untagged_l2() {
        let l2 = parse_l2(&ARP_FRAME).unwrap();
        assert_eq!(
            l2,
            L2Header {
                vlan_tags: 0,
                vlan_id: None,
                ethertype: EtherType::ARP,
                l3_offset: 14
            }
        );
    }

    #[test]
    fn qinq_l2() {
        let l2 = parse_l2(&QINQ_HEADER).unwrap();
        assert_eq!(l2.vlan_tags, 2);
        assert_eq!(l2.vlan_id, Some(200));
        assert_eq!(l2.ethertype, EtherType::IPV4);
        assert_eq!(l2.l3_offset, 22);
        // Every cut inside the tags is truncated.
        for len in 14..22 {
            assert_eq!(
                parse_l2(&QINQ_HEADER[..len]),
                Err(WireError::Truncated),
                "{len}"
            );
        }
    }

    #[test]
    fn single_tag_l2() {
        let mut buf = [0u8; 18];
        buf[12..18].copy_from_slice(&[0x81, 0x00, 0x00, 0x0a, 0x08, 0x06]);
        let l2 = parse_l2(&buf).unwrap();
        assert_eq!((l2.vlan_tags, l2.vlan_id), (1, Some(10)));
        assert_eq!((l2.ethertype, l2.l3_offset), (EtherType::ARP, 18));
    }

    #[test]
    fn third_tag_is_returned_not_walked() {
        let mut buf = [0u8; 26];
        buf[12..26].copy_from_slice(&[
            0x88, 0xa8, 0, 1, 0x81, 0x00, 0, 2, 0x81, 0x00, 0, 3, 0x08, 0x00,
        ]);
        let l2 = parse_l2(&buf).unwrap();
        assert_eq!(l2.vlan_tags, 2);
        assert_eq!(l2.ethertype, EtherType::VLAN);
        assert_eq!(l2.l3_offset, 22);
    }

    #[test]
    fn mac_classes_and_display() {
        let unicast = MacAddr([0x52, 0x54, 0x00, 0xab, 0xcd, 0xef]);
        assert!(unicast.is_unicast() && !unicast.is_multicast() && !unicast.is_broadcast());
        assert!(
            unicast.is_local(),
            "QEMU's 52:54:00 prefix is locally administered"
        );
        assert!(!MacAddr([0x00, 0x1b, 0x21, 1, 2, 3]).is_local());
        let ipv4_multicast = MacAddr([0x01, 0x00, 0x5e, 0x00, 0x00, 0x01]);
        assert!(ipv4_multicast.is_multicast() && !ipv4_multicast.is_broadcast());
        assert!(MacAddr::BROADCAST.is_multicast() && MacAddr::BROADCAST.is_broadcast());
        assert!(MacAddr([0x02, 0, 0, 0, 0, 1]).is_local());
        assert_eq!(unicast.to_string(), "52:54:00:ab:cd:ef");
        assert_eq!(
            MacAddr::from([1, 2, 3, 4, 5, 6]).octets(),
            [1, 2, 3, 4, 5, 6]
        );
        assert_eq!(EtherType::IPV6.to_string(), "0x86dd");
    }
}
