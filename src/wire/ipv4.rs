//! IPv4 headers (RFC 791).
//!
//! Addresses are `std::net::Ipv4Addr`: `Copy`, four bytes, and the type configuration
//! and the CLI already use, so no conversion happens between control and data plane.

use std::net::Ipv4Addr;

use super::checksum;
use super::{read_u16, write_u16, IpProtocol, WireError};

mod field {
    use core::ops::Range;

    pub const VER_IHL: usize = 0;
    pub const DSCP_ECN: usize = 1;
    pub const TOTAL_LEN: usize = 2;
    pub const IDENT: usize = 4;
    pub const FLAGS_FRAG: usize = 6;
    pub const TTL: usize = 8;
    pub const PROTOCOL: usize = 9;
    pub const CHECKSUM: usize = 10;
    pub const SRC: Range<usize> = 12..16;
    pub const DST: Range<usize> = 16..20;
}

/// Length of a header without options.
pub const MIN_HEADER_LEN: usize = 20;
/// Default TTL of packets Sluice originates (Linux's default too).
pub const DEFAULT_TTL: u8 = 64;

/// Whether `frame` is an untagged Ethernet frame carrying IPv4 protocol `protocol`
/// (nothing else checked): how frames handed up to the management core are told
/// apart without parsing them again.
pub fn carries(frame: &[u8], protocol: IpProtocol) -> bool {
    frame.len() > 23 && frame[12..14] == [0x08, 0x00] && frame[23] == protocol.0
}

/// Whether no single host sends from `addr` (RFC 1812 section 5.3.7, as Linux's input
/// route check): "this network" 0.0.0.0/8, loopback 127.0.0.0/8, multicast, or the
/// limited broadcast. A packet from one is forged or misrouted; answering or
/// forwarding it would reach a group, the sender's loopback, or no one.
pub fn is_martian_source(addr: Ipv4Addr) -> bool {
    let first = addr.octets()[0];
    first == 0 || first == 127 || addr.is_multicast() || addr.is_broadcast()
}

const FLAG_DONT_FRAG: u16 = 0x4000;
const FLAG_MORE_FRAGS: u16 = 0x2000;
const FRAG_OFFSET_MASK: u16 = 0x1fff;

/// A view of an IPv4 packet: header, options, payload. Bytes after `total_len`
/// (Ethernet padding) belong to the buffer but not to the packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps `buffer` without checks; accessors may panic on a short or inconsistent
    /// buffer.
    #[inline]
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps `buffer` after checking the header is complete and consistent, so that
    /// `header_len() <= total_len() <= buffer.len()` and no accessor can panic.
    ///
    /// Errors: `Truncated` when the buffer is shorter than 20 bytes, than the header
    /// length, or than `total_len`; `Malformed` when the version is not 4, the IHL is
    /// below 5, or `total_len` is smaller than the header.
    #[inline(always)]
    pub fn new_checked(buffer: T) -> Result<Packet<T>, WireError> {
        let packet = Self::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    #[inline(always)]
    pub fn check_len(&self) -> Result<(), WireError> {
        let len = self.buffer.as_ref().len();
        if len < MIN_HEADER_LEN {
            return Err(WireError::Truncated);
        }
        if self.version() != 4 {
            return Err(WireError::Malformed);
        }
        let header_len = self.header_len();
        if header_len < MIN_HEADER_LEN {
            return Err(WireError::Malformed);
        }
        if len < header_len {
            return Err(WireError::Truncated);
        }
        let total_len = self.total_len() as usize;
        if total_len < header_len {
            return Err(WireError::Malformed);
        }
        if total_len > len {
            return Err(WireError::Truncated);
        }
        Ok(())
    }

    #[inline(always)]
    pub fn into_inner(self) -> T {
        self.buffer
    }

    #[inline(always)]
    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VER_IHL] >> 4
    }

    /// Header length in bytes (IHL * 4), options included.
    #[inline(always)]
    pub fn header_len(&self) -> usize {
        ((self.buffer.as_ref()[field::VER_IHL] & 0x0f) as usize) * 4
    }

    /// The header carries options (IHL above 5).
    #[inline(always)]
    pub fn has_options(&self) -> bool {
        self.header_len() > MIN_HEADER_LEN
    }

    #[inline(always)]
    pub fn dscp(&self) -> u8 {
        self.buffer.as_ref()[field::DSCP_ECN] >> 2
    }

    #[inline(always)]
    pub fn ecn(&self) -> u8 {
        self.buffer.as_ref()[field::DSCP_ECN] & 0x03
    }

    #[inline(always)]
    pub fn total_len(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::TOTAL_LEN)
    }

    #[inline(always)]
    pub fn ident(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::IDENT)
    }

    #[inline(always)]
    pub fn dont_frag(&self) -> bool {
        read_u16(self.buffer.as_ref(), field::FLAGS_FRAG) & FLAG_DONT_FRAG != 0
    }

    #[inline(always)]
    pub fn more_frags(&self) -> bool {
        read_u16(self.buffer.as_ref(), field::FLAGS_FRAG) & FLAG_MORE_FRAGS != 0
    }

    /// Fragment offset in bytes (the field counts 8-byte units).
    #[inline(always)]
    pub fn frag_offset(&self) -> u16 {
        (read_u16(self.buffer.as_ref(), field::FLAGS_FRAG) & FRAG_OFFSET_MASK) << 3
    }

    /// Part of a fragmented datagram: more fragments follow, or this is not the first.
    #[inline(always)]
    pub fn is_fragment(&self) -> bool {
        read_u16(self.buffer.as_ref(), field::FLAGS_FRAG) & (FLAG_MORE_FRAGS | FRAG_OFFSET_MASK)
            != 0
    }

    #[inline(always)]
    pub fn ttl(&self) -> u8 {
        self.buffer.as_ref()[field::TTL]
    }

    #[inline(always)]
    pub fn protocol(&self) -> IpProtocol {
        IpProtocol(self.buffer.as_ref()[field::PROTOCOL])
    }

    #[inline(always)]
    pub fn checksum(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::CHECKSUM)
    }

    #[inline(always)]
    pub fn src_addr(&self) -> Ipv4Addr {
        let d = &self.buffer.as_ref()[field::SRC];
        Ipv4Addr::new(d[0], d[1], d[2], d[3])
    }

    #[inline(always)]
    pub fn dst_addr(&self) -> Ipv4Addr {
        let d = &self.buffer.as_ref()[field::DST];
        Ipv4Addr::new(d[0], d[1], d[2], d[3])
    }

    /// The header, options included.
    #[inline(always)]
    pub fn header(&self) -> &[u8] {
        &self.buffer.as_ref()[..self.header_len()]
    }

    /// The options bytes (empty without options).
    #[inline(always)]
    pub fn options(&self) -> &[u8] {
        &self.buffer.as_ref()[MIN_HEADER_LEN..self.header_len()]
    }

    /// The header checksum is correct.
    #[inline(always)]
    pub fn verify_checksum(&self) -> bool {
        let header = self.header();
        let sum = match <&[u8; MIN_HEADER_LEN]>::try_from(header) {
            Ok(plain) => checksum::sum20(plain),
            Err(_) => checksum::sum(header),
        };
        checksum::fold(sum) == 0xffff
    }

    /// The payload up to `total_len`, without Ethernet padding.
    #[inline(always)]
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..self.total_len() as usize]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets version 4 and the header length in bytes (a multiple of 4, 20..=60).
    #[inline(always)]
    pub fn set_version_and_header_len(&mut self, header_len: usize) {
        self.buffer.as_mut()[field::VER_IHL] = 0x40 | ((header_len / 4) as u8 & 0x0f);
    }

    #[inline(always)]
    pub fn set_dscp_ecn(&mut self, dscp: u8, ecn: u8) {
        self.buffer.as_mut()[field::DSCP_ECN] = (dscp << 2) | (ecn & 0x03);
    }

    #[inline(always)]
    pub fn set_total_len(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::TOTAL_LEN, value);
    }

    #[inline(always)]
    pub fn set_ident(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::IDENT, value);
    }

    /// Sets the flags and fragment offset (in bytes, a multiple of 8) at once.
    #[inline(always)]
    pub fn set_fragmentation(&mut self, dont_frag: bool, more_frags: bool, offset: u16) {
        let mut value = (offset >> 3) & FRAG_OFFSET_MASK;
        if dont_frag {
            value |= FLAG_DONT_FRAG;
        }
        if more_frags {
            value |= FLAG_MORE_FRAGS;
        }
        write_u16(self.buffer.as_mut(), field::FLAGS_FRAG, value);
    }

    #[inline(always)]
    pub fn set_ttl(&mut self, value: u8) {
        self.buffer.as_mut()[field::TTL] = value;
    }

    #[inline(always)]
    pub fn set_protocol(&mut self, value: IpProtocol) {
        self.buffer.as_mut()[field::PROTOCOL] = value.0;
    }

    #[inline(always)]
    pub fn set_checksum(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::CHECKSUM, value);
    }

    #[inline(always)]
    pub fn set_src_addr(&mut self, addr: Ipv4Addr) {
        self.buffer.as_mut()[field::SRC].copy_from_slice(&addr.octets());
    }

    #[inline(always)]
    pub fn set_dst_addr(&mut self, addr: Ipv4Addr) {
        self.buffer.as_mut()[field::DST].copy_from_slice(&addr.octets());
    }

    /// Recomputes the header checksum over the header and its options.
    #[inline(always)]
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let value = checksum::finish(checksum::sum(self.header()));
        self.set_checksum(value);
    }

    #[inline(always)]
    pub fn options_mut(&mut self) -> &mut [u8] {
        let end = self.header_len();
        &mut self.buffer.as_mut()[MIN_HEADER_LEN..end]
    }

    /// The payload up to `total_len`, without Ethernet padding.
    #[inline(always)]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let range = self.header_len()..self.total_len() as usize;
        &mut self.buffer.as_mut()[range]
    }
}

/// The fields of an IPv4 header without options, for building packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    pub src_addr: Ipv4Addr,
    pub dst_addr: Ipv4Addr,
    pub protocol: IpProtocol,
    pub payload_len: usize,
    pub ttl: u8,
}

impl Repr {
    /// Reads the fields of a checked packet. Options are skipped and the checksum is
    /// not verified here: callers that must check it call `verify_checksum`, so a NIC
    /// that already validated it saves the work.
    #[inline(always)]
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr, WireError> {
        packet.check_len()?;
        Ok(Repr {
            src_addr: packet.src_addr(),
            dst_addr: packet.dst_addr(),
            protocol: packet.protocol(),
            payload_len: packet.payload().len(),
            ttl: packet.ttl(),
        })
    }

    #[inline]
    pub const fn buffer_len(&self) -> usize {
        MIN_HEADER_LEN
    }

    /// Writes a 20-byte header (no options, DSCP 0, ident 0, don't-fragment) with its
    /// checksum. The buffer must hold at least 20 bytes; the payload is not touched.
    #[inline(always)]
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_version_and_header_len(MIN_HEADER_LEN);
        packet.set_dscp_ecn(0, 0);
        packet.set_total_len((MIN_HEADER_LEN + self.payload_len) as u16);
        packet.set_ident(0);
        packet.set_fragmentation(true, false, 0);
        packet.set_ttl(self.ttl);
        packet.set_protocol(self.protocol);
        packet.set_src_addr(self.src_addr);
        packet.set_dst_addr(self.dst_addr);
        packet.fill_checksum();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // ICMP echo request 10.0.0.1 -> 10.0.0.2, 20-byte header, 56-byte ICMP message.
    static ECHO_PACKET: [u8; 76] = [
        0x45, 0x00, 0x00, 0x4c, 0x1c, 0x46, 0x40, 0x00, 0x40, 0x01, 0x0a, 0x69, 0x0a, 0x00, 0x00,
        0x01, 0x0a, 0x00, 0x00, 0x02, 0x08, 0x00, 0x94, 0x3d, 0x0b, 0x1e, 0x00, 0x01, 0x5e, 0x6a,
        0x3b, 0x66, 0x00, 0x00, 0x00, 0x00, 0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18,
        0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f, 0x20, 0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27,
        0x28, 0x29, 0x2a, 0x2b, 0x2c, 0x2d, 0x2e, 0x2f, 0x30, 0x31, 0x32, 0x33, 0x34, 0x35, 0x36,
        0x37,
    ];

    // A UDP/IPv4 header with a record-route option (IHL 6): 24 bytes of header,
    // 8 bytes of UDP, then 4 bytes of Ethernet padding; fragment 1 of 2, ECN CE.
    static WITH_OPTIONS: [u8; 36] = [
        0x46, 0xbb, 0x00, 0x20, 0x12, 0x34, 0x20, 0x00, 0x01, 0x11, 0x00, 0x00, 0xc0, 0x00, 0x02,
        0x01, 0xc6, 0x33, 0x64, 0x02, 0x07, 0x03, 0x04, 0x00, 0x04, 0xd2, 0x00, 0x35, 0x00, 0x08,
        0x00, 0x00, 0xee, 0xee, 0xee, 0xee,
    ];

    #[test]
    fn echo_packet_fields() {
        let packet = Packet::new_checked(&ECHO_PACKET[..]).unwrap();
        assert_eq!(packet.version(), 4);
        assert_eq!(packet.header_len(), 20);
        assert!(!packet.has_options());
        assert_eq!((packet.dscp(), packet.ecn()), (0, 0));
        assert_eq!(packet.total_len(), 76);
        assert_eq!(packet.ident(), 0x1c46);
        assert!(packet.dont_frag() && !packet.more_frags());
        assert_eq!(packet.frag_offset(), 0);
        assert!(!packet.is_fragment());
        assert_eq!(packet.ttl(), 64);
        assert_eq!(packet.protocol(), IpProtocol::ICMP);
        assert_eq!(packet.checksum(), 0x0a69);
        assert_eq!(packet.src_addr(), Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!(packet.dst_addr(), Ipv4Addr::new(10, 0, 0, 2));
        assert!(packet.verify_checksum());
        assert_eq!(packet.payload(), &ECHO_PACKET[20..]);
    }

    #[test]
    fn options_padding_and_fragments() {
        let mut buf = WITH_OPTIONS;
        let mut packet = Packet::new_checked(&mut buf[..]).unwrap();
        assert!(packet.has_options());
        assert_eq!(packet.header_len(), 24);
        assert_eq!(packet.options(), &[0x07, 0x03, 0x04, 0x00]);
        assert_eq!((packet.dscp(), packet.ecn()), (46, 3));
        assert!(packet.more_frags() && packet.is_fragment());
        assert_eq!(packet.protocol(), IpProtocol::UDP);
        assert_eq!(packet.payload().len(), 8, "padding excluded");
        assert!(!packet.verify_checksum());
        packet.fill_checksum();
        assert!(packet.verify_checksum());
        packet.payload_mut()[0] = 0xff;
        assert_eq!(buf[24], 0xff);
    }

    #[test]
    fn non_first_fragment() {
        let mut buf = ECHO_PACKET;
        let mut packet = Packet::new_unchecked(&mut buf[..]);
        packet.set_fragmentation(false, false, 1480);
        assert_eq!(packet.frag_offset(), 1480);
        assert!(packet.is_fragment() && !packet.dont_frag() && !packet.more_frags());
    }

    #[test]
    fn header_errors() {
        let check = |buf: &[u8]| Packet::new_checked(buf).err();
        for len in 0..ECHO_PACKET.len() {
            assert_eq!(
                check(&ECHO_PACKET[..len]),
                Some(WireError::Truncated),
                "len {len}"
            );
        }
        let mut version6 = ECHO_PACKET;
        version6[0] = 0x65;
        assert_eq!(check(&version6), Some(WireError::Malformed));
        let mut ihl4 = ECHO_PACKET;
        ihl4[0] = 0x44;
        assert_eq!(check(&ihl4), Some(WireError::Malformed));
        let mut ihl15 = ECHO_PACKET;
        ihl15[0] = 0x4f;
        ihl15[3] = 60;
        assert_eq!(
            check(&ihl15[..40]),
            Some(WireError::Truncated),
            "options cut"
        );
        assert_eq!(check(&ihl15), None);
        let mut total_below_header = ECHO_PACKET;
        total_below_header[3] = 19;
        assert_eq!(check(&total_below_header), Some(WireError::Malformed));
        let mut total_above_buffer = ECHO_PACKET;
        total_above_buffer[3] = 77;
        assert_eq!(check(&total_above_buffer), Some(WireError::Truncated));
    }

    #[test]
    fn setters_and_checksum() {
        let mut buf = ECHO_PACKET;
        let mut packet = Packet::new_checked(&mut buf[..]).unwrap();
        packet.set_src_addr(Ipv4Addr::new(10, 0, 0, 2));
        packet.set_dst_addr(Ipv4Addr::new(10, 0, 0, 1));
        packet.set_ttl(63);
        assert!(!packet.verify_checksum());
        packet.fill_checksum();
        assert!(packet.verify_checksum());
        assert_eq!(packet.ttl(), 63);
        assert_eq!(packet.src_addr(), Ipv4Addr::new(10, 0, 0, 2));
    }

    #[test]
    fn repr_round_trip() {
        let packet = Packet::new_checked(&ECHO_PACKET[..]).unwrap();
        let repr = Repr::parse(&packet).unwrap();
        assert_eq!(
            repr,
            Repr {
                src_addr: Ipv4Addr::new(10, 0, 0, 1),
                dst_addr: Ipv4Addr::new(10, 0, 0, 2),
                protocol: IpProtocol::ICMP,
                payload_len: 56,
                ttl: 64,
            }
        );
        let mut buf = [0u8; 76];
        buf[20..].copy_from_slice(&ECHO_PACKET[20..]);
        let mut out = Packet::new_unchecked(&mut buf[..]);
        repr.emit(&mut out);
        out.set_ident(0x1c46);
        out.fill_checksum();
        assert_eq!(buf, ECHO_PACKET);
    }

    #[test]
    fn martian_sources_are_the_ones_no_single_host_sends_from() {
        for martian in [
            "0.0.0.0",
            "0.1.2.3",
            "127.0.0.1",
            "127.255.0.9",
            "224.0.0.1",
            "239.255.255.250",
            "255.255.255.255",
        ] {
            assert!(is_martian_source(martian.parse().unwrap()), "{martian}");
        }
        for host in [
            "1.0.0.1",
            "126.255.255.255",
            "128.0.0.1",
            "198.18.0.10",
            "223.255.255.254",
        ] {
            assert!(!is_martian_source(host.parse().unwrap()), "{host}");
        }
    }
}
