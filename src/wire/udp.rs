//! UDP datagrams (RFC 768) over IPv4, with the pseudo-header checksum and its
//! zero rule: a transmitted checksum of 0 means "none computed", so a computed 0 is
//! sent as 0xffff, and a received 0 is accepted without verification.

use std::net::{Ipv4Addr, Ipv6Addr};

use super::checksum;
use super::{read_u16, write_u16, IpProtocol, WireError};

mod field {
    pub const SRC_PORT: usize = 0;
    pub const DST_PORT: usize = 2;
    pub const LENGTH: usize = 4;
    pub const CHECKSUM: usize = 6;
    pub const PAYLOAD: usize = 8;
}

pub const HEADER_LEN: usize = field::PAYLOAD;

/// The checksum field value meaning "no checksum" (IPv4 only).
pub const NO_CHECKSUM: u16 = 0;

/// A view of a UDP datagram. The `length` field bounds it: bytes after it (padding)
/// are outside the datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps `buffer` without checks; accessors may panic on a short buffer.
    #[inline]
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps `buffer` after checking `8 <= length <= buffer.len()`.
    ///
    /// Errors: `Truncated` below 8 bytes or below `length`; `Malformed` when `length`
    /// is smaller than the header.
    #[inline(always)]
    pub fn new_checked(buffer: T) -> Result<Packet<T>, WireError> {
        let packet = Self::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    #[inline(always)]
    pub fn check_len(&self) -> Result<(), WireError> {
        let buffer_len = self.buffer.as_ref().len();
        if buffer_len < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        let length = self.len() as usize;
        if length < HEADER_LEN {
            return Err(WireError::Malformed);
        }
        if length > buffer_len {
            return Err(WireError::Truncated);
        }
        Ok(())
    }

    #[inline(always)]
    pub fn into_inner(self) -> T {
        self.buffer
    }

    #[inline(always)]
    pub fn src_port(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::SRC_PORT)
    }

    #[inline(always)]
    pub fn dst_port(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::DST_PORT)
    }

    /// The length field: header plus payload.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::LENGTH)
    }

    #[inline(always)]
    pub fn checksum(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::CHECKSUM)
    }

    /// The payload up to `length`.
    #[inline(always)]
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[field::PAYLOAD..self.len() as usize]
    }

    fn datagram(&self) -> &[u8] {
        &self.buffer.as_ref()[..self.len() as usize]
    }

    /// The checksum is correct, or absent (zero), which IPv4 allows.
    #[inline(always)]
    pub fn verify_checksum(&self, src: Ipv4Addr, dst: Ipv4Addr) -> bool {
        if self.checksum() == NO_CHECKSUM {
            return true;
        }
        let pseudo = checksum::pseudo_header_sum(src, dst, IpProtocol::UDP.0, self.len());
        checksum::fold(pseudo + checksum::sum(self.datagram())) == 0xffff
    }

    /// The checksum over the IPv6 pseudo-header and datagram is correct. Over IPv6 a
    /// checksum is mandatory (RFC 8200 section 8.1): zero never verifies.
    #[inline(always)]
    pub fn verify_checksum_v6(&self, src: Ipv6Addr, dst: Ipv6Addr) -> bool {
        if self.checksum() == NO_CHECKSUM {
            return false;
        }
        let len = self.len() as u32;
        let pseudo = checksum::pseudo_header_sum_v6(src, dst, IpProtocol::UDP.0, len);
        checksum::fold(pseudo + checksum::sum(self.datagram())) == 0xffff
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    #[inline(always)]
    pub fn set_src_port(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::SRC_PORT, value);
    }

    #[inline(always)]
    pub fn set_dst_port(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::DST_PORT, value);
    }

    #[inline(always)]
    pub fn set_len(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::LENGTH, value);
    }

    #[inline(always)]
    pub fn set_checksum(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::CHECKSUM, value);
    }

    #[inline(always)]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let end = self.len() as usize;
        &mut self.buffer.as_mut()[field::PAYLOAD..end]
    }

    /// Computes the checksum over pseudo-header and datagram (up to `length`); a
    /// computed zero is written as 0xffff so it does not read as "no checksum".
    #[inline(always)]
    pub fn fill_checksum(&mut self, src: Ipv4Addr, dst: Ipv4Addr) {
        self.set_checksum(0);
        let pseudo = checksum::pseudo_header_sum(src, dst, IpProtocol::UDP.0, self.len());
        let value = checksum::finish(pseudo + checksum::sum(self.datagram()));
        self.set_checksum(if value == 0 { 0xffff } else { value });
    }

    /// Computes the checksum over the IPv6 pseudo-header and datagram; a computed
    /// zero is written as 0xffff, as over IPv4.
    #[inline(always)]
    pub fn fill_checksum_v6(&mut self, src: Ipv6Addr, dst: Ipv6Addr) {
        self.set_checksum(0);
        let len = self.len() as u32;
        let pseudo = checksum::pseudo_header_sum_v6(src, dst, IpProtocol::UDP.0, len);
        let value = checksum::finish(pseudo + checksum::sum(self.datagram()));
        self.set_checksum(if value == 0 { 0xffff } else { value });
    }

    /// Adjusts the checksum for an IPv6 address of the pseudo-header changed from
    /// `old` to `new`, with the zero rule of the other updates (a zero checksum,
    /// which IPv6 forbids, stays zero and keeps failing `verify_checksum_v6`).
    #[inline(always)]
    pub fn update_checksum128(&mut self, old: Ipv6Addr, new: Ipv6Addr) {
        self.update_checksum_with(|current| checksum::update128(current, old, new));
    }

    /// Adjusts the checksum for a 16-bit field (a port) changed from `old` to `new`
    /// (RFC 1624). An absent checksum stays absent; a result of 0 becomes 0xffff.
    #[inline(always)]
    pub fn update_checksum16(&mut self, old: u16, new: u16) {
        self.update_checksum_with(|current| checksum::update16(current, old, new));
    }

    /// Adjusts the checksum for a 32-bit field (a pseudo-header address) changed from
    /// `old` to `new`, with the same zero rule.
    #[inline(always)]
    pub fn update_checksum32(&mut self, old: u32, new: u32) {
        self.update_checksum_with(|current| checksum::update32(current, old, new));
    }

    /// Adjusts the checksum for the changes summed in `delta`, with the same zero
    /// rule.
    #[inline(always)]
    pub fn apply_checksum_delta(&mut self, delta: checksum::Delta) {
        self.update_checksum_with(|current| delta.apply(current));
    }

    #[inline]
    fn update_checksum_with(&mut self, update: impl FnOnce(u16) -> u16) {
        let current = self.checksum();
        if current == NO_CHECKSUM {
            return;
        }
        let value = update(current);
        self.set_checksum(if value == 0 { 0xffff } else { value });
    }
}

/// UDP header fields, for building datagrams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    pub src_port: u16,
    pub dst_port: u16,
    pub payload_len: usize,
}

impl Repr {
    /// Reads the header of a checked datagram; the checksum is the caller's to verify,
    /// since it needs the IP addresses.
    #[inline(always)]
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr, WireError> {
        packet.check_len()?;
        Ok(Repr {
            src_port: packet.src_port(),
            dst_port: packet.dst_port(),
            payload_len: packet.payload().len(),
        })
    }

    #[inline]
    pub const fn header_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the header and the checksum. The payload must already be in place after
    /// the header, and the buffer at least `8 + payload_len` long.
    #[inline(always)]
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        packet: &mut Packet<T>,
        src: Ipv4Addr,
        dst: Ipv4Addr,
    ) {
        packet.set_src_port(self.src_port);
        packet.set_dst_port(self.dst_port);
        packet.set_len((HEADER_LEN + self.payload_len) as u16);
        packet.fill_checksum(src, dst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
    const RESOLVER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 53);

    // DNS query "example.com A" from 10.0.0.1:40000 to 10.0.0.53:53.
    static DNS_QUERY: [u8; 37] = [
        0x9c, 0x40, 0x00, 0x35, 0x00, 0x25, 0xd3, 0xbd, 0xab, 0xcd, 0x01, 0x00, 0x00, 0x01, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x07, 0x65, 0x78, 0x61, 0x6d, 0x70, 0x6c, 0x65, 0x03, 0x63,
        0x6f, 0x6d, 0x00, 0x00, 0x01, 0x00, 0x01,
    ];

    #[test]
    fn dns_query_fields() {
        let packet = Packet::new_checked(&DNS_QUERY[..]).unwrap();
        assert_eq!((packet.src_port(), packet.dst_port()), (40000, 53));
        assert_eq!(packet.len(), 37);
        assert_eq!(packet.checksum(), 0xd3bd);
        assert_eq!(packet.payload(), &DNS_QUERY[8..]);
        assert!(packet.verify_checksum(CLIENT, RESOLVER));
        assert!(!packet.verify_checksum(CLIENT, Ipv4Addr::new(10, 0, 0, 54)));
    }

    #[test]
    fn zero_checksum_means_none() {
        let mut buf = DNS_QUERY;
        buf[6] = 0;
        buf[7] = 0;
        let mut packet = Packet::new_checked(&mut buf[..]).unwrap();
        assert!(packet.verify_checksum(CLIENT, Ipv4Addr::new(1, 2, 3, 4)));
        packet.update_checksum16(53, 5353);
        assert_eq!(packet.checksum(), NO_CHECKSUM, "stays absent through NAT");
    }

    #[test]
    fn computed_zero_is_sent_as_all_ones() {
        // Choose the last payload word so the datagram sums to 0xffff: the checksum
        // field then computes to 0 and must be sent as 0xffff.
        let mut buf = [0u8; 10];
        buf[4..6].copy_from_slice(&10u16.to_be_bytes());
        let src = Ipv4Addr::new(0, 0, 0, 0);
        let dst = Ipv4Addr::new(0, 0, 0, 0);
        let partial = checksum::pseudo_header_sum(src, dst, 17, 10) + checksum::sum(&buf);
        let filler = !checksum::fold(partial);
        buf[8..10].copy_from_slice(&filler.to_be_bytes());
        let mut packet = Packet::new_checked(&mut buf[..]).unwrap();
        packet.fill_checksum(src, dst);
        assert_eq!(packet.checksum(), 0xffff);
        assert!(packet.verify_checksum(src, dst));
    }

    #[test]
    fn padding_excluded_and_length_errors() {
        let mut padded = [0u8; 45];
        padded[..37].copy_from_slice(&DNS_QUERY);
        padded[37..].fill(0xee);
        let packet = Packet::new_checked(&padded[..]).unwrap();
        assert_eq!(packet.payload().len(), 29);
        assert!(
            packet.verify_checksum(CLIENT, RESOLVER),
            "padding not summed"
        );

        for len in 0..DNS_QUERY.len() {
            assert_eq!(
                Packet::new_checked(&DNS_QUERY[..len]),
                Err(WireError::Truncated)
            );
        }
        let mut short_length = DNS_QUERY;
        short_length[5] = 7;
        assert_eq!(
            Packet::new_checked(&short_length[..]),
            Err(WireError::Malformed)
        );
    }

    #[test]
    fn nat_rewrite_incremental_equals_full() {
        let mut buf = DNS_QUERY;
        let mut packet = Packet::new_checked(&mut buf[..]).unwrap();
        let backend = Ipv4Addr::new(10, 0, 1, 7);
        packet.set_dst_port(5353);
        packet.update_checksum16(53, 5353);
        packet.update_checksum32(u32::from(RESOLVER), u32::from(backend));
        assert!(packet.verify_checksum(CLIENT, backend));
        let incremental = packet.checksum();
        packet.fill_checksum(CLIENT, backend);
        assert_eq!(incremental, packet.checksum());
    }

    #[test]
    fn repr_round_trip() {
        let repr = Repr::parse(&Packet::new_checked(&DNS_QUERY[..]).unwrap()).unwrap();
        assert_eq!(
            repr,
            Repr {
                src_port: 40000,
                dst_port: 53,
                payload_len: 29
            }
        );
        let mut buf = [0u8; 37];
        buf[8..].copy_from_slice(&DNS_QUERY[8..]);
        repr.emit(&mut Packet::new_unchecked(&mut buf[..]), CLIENT, RESOLVER);
        assert_eq!(buf, DNS_QUERY);
        assert_eq!(repr.header_len(), 8);
    }
}
