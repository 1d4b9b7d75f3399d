//! TCP segments (RFC 9293): header fields, options, and the IPv4 pseudo-header
//! checksum. The view's buffer is the whole segment, header and data, as bounded by
//! the IP payload, since the checksum covers all of it.

use core::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};

use super::checksum;
use super::{read_u16, read_u32, write_u16, write_u32, IpProtocol, WireError};

mod field {
    pub const SRC_PORT: usize = 0;
    pub const DST_PORT: usize = 2;
    pub const SEQ_NUM: usize = 4;
    pub const ACK_NUM: usize = 8;
    /// Data offset in the high nibble; the low bits of the next byte are the flags.
    pub const DATA_OFFSET: usize = 12;
    pub const FLAGS: usize = 13;
    pub const WINDOW: usize = 14;
    pub const CHECKSUM: usize = 16;
    pub const URGENT: usize = 18;
    pub const OPTIONS: usize = 20;
}

/// Length of a header without options.
pub const MIN_HEADER_LEN: usize = field::OPTIONS;
/// Longest header: data offset 15.
pub const MAX_HEADER_LEN: usize = 60;

/// The eight TCP flag bits, as a set.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct TcpFlags(pub u8);

impl TcpFlags {
    pub const FIN: TcpFlags = TcpFlags(0x01);
    pub const SYN: TcpFlags = TcpFlags(0x02);
    pub const RST: TcpFlags = TcpFlags(0x04);
    pub const PSH: TcpFlags = TcpFlags(0x08);
    pub const ACK: TcpFlags = TcpFlags(0x10);
    pub const URG: TcpFlags = TcpFlags(0x20);
    pub const ECE: TcpFlags = TcpFlags(0x40);
    pub const CWR: TcpFlags = TcpFlags(0x80);

    #[inline]
    pub const fn empty() -> TcpFlags {
        TcpFlags(0)
    }

    /// Every flag in `other` is set.
    #[inline]
    pub const fn contains(self, other: TcpFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// At least one flag of `other` is set.
    #[inline]
    pub const fn intersects(self, other: TcpFlags) -> bool {
        self.0 & other.0 != 0
    }
}

impl core::ops::BitOr for TcpFlags {
    type Output = TcpFlags;
    fn bitor(self, rhs: TcpFlags) -> TcpFlags {
        TcpFlags(self.0 | rhs.0)
    }
}

impl fmt::Debug for TcpFlags {
    /// Like tcpdump: `[S.]` for SYN+ACK.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const NAMES: [(TcpFlags, char); 8] = [
            (TcpFlags::SYN, 'S'),
            (TcpFlags::FIN, 'F'),
            (TcpFlags::RST, 'R'),
            (TcpFlags::PSH, 'P'),
            (TcpFlags::URG, 'U'),
            (TcpFlags::ECE, 'E'),
            (TcpFlags::CWR, 'W'),
            (TcpFlags::ACK, '.'),
        ];
        f.write_str("[")?;
        for (flag, name) in NAMES {
            if self.contains(flag) {
                write!(f, "{name}")?;
            }
        }
        f.write_str("]")
    }
}

/// A view of a TCP segment.
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

    /// Wraps `buffer` after checking the header, options included, fits in it.
    ///
    /// Errors: `Truncated` below 20 bytes or the declared header length;
    /// `Malformed` for a data offset below 5.
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
        let header_len = self.header_len();
        if header_len < MIN_HEADER_LEN {
            return Err(WireError::Malformed);
        }
        if header_len > len {
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

    #[inline(always)]
    pub fn seq_number(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::SEQ_NUM)
    }

    #[inline(always)]
    pub fn ack_number(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::ACK_NUM)
    }

    /// Header length in bytes (data offset * 4), options included.
    #[inline(always)]
    pub fn header_len(&self) -> usize {
        ((self.buffer.as_ref()[field::DATA_OFFSET] >> 4) as usize) * 4
    }

    #[inline(always)]
    pub fn flags(&self) -> TcpFlags {
        TcpFlags(self.buffer.as_ref()[field::FLAGS])
    }

    #[inline(always)]
    pub fn syn(&self) -> bool {
        self.flags().contains(TcpFlags::SYN)
    }

    #[inline(always)]
    pub fn ack(&self) -> bool {
        self.flags().contains(TcpFlags::ACK)
    }

    #[inline(always)]
    pub fn fin(&self) -> bool {
        self.flags().contains(TcpFlags::FIN)
    }

    #[inline(always)]
    pub fn rst(&self) -> bool {
        self.flags().contains(TcpFlags::RST)
    }

    #[inline(always)]
    pub fn window_len(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::WINDOW)
    }

    #[inline(always)]
    pub fn checksum(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::CHECKSUM)
    }

    #[inline(always)]
    pub fn urgent_at(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::URGENT)
    }

    /// The raw options bytes.
    #[inline(always)]
    pub fn options(&self) -> &[u8] {
        &self.buffer.as_ref()[field::OPTIONS..self.header_len()]
    }

    /// Iterates over the options; see [`Options`].
    #[inline(always)]
    pub fn option_iter(&self) -> Options<'_> {
        Options::new(self.options())
    }

    /// The MSS option of a SYN, if present and well formed.
    #[inline(always)]
    pub fn max_segment_size(&self) -> Option<u16> {
        self.option_iter().find_map(|option| match option {
            Ok(TcpOption::MaxSegmentSize(mss)) => Some(mss),
            _ => None,
        })
    }

    #[inline(always)]
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[self.header_len()..]
    }

    /// Segment length in the pseudo-header. IPv4 cannot carry more than 64 KiB, so a
    /// longer buffer can never verify.
    fn segment_len(&self) -> Option<u16> {
        u16::try_from(self.buffer.as_ref().len()).ok()
    }

    /// The checksum over pseudo-header, header and data is correct.
    #[inline(always)]
    pub fn verify_checksum(&self, src: Ipv4Addr, dst: Ipv4Addr) -> bool {
        let Some(len) = self.segment_len() else {
            return false;
        };
        let pseudo = checksum::pseudo_header_sum(src, dst, IpProtocol::TCP.0, len);
        checksum::fold(pseudo + checksum::sum(self.buffer.as_ref())) == 0xffff
    }

    /// The checksum over the IPv6 pseudo-header, header and data is correct.
    #[inline(always)]
    pub fn verify_checksum_v6(&self, src: Ipv6Addr, dst: Ipv6Addr) -> bool {
        let data = self.buffer.as_ref();
        let len = data.len() as u32;
        let pseudo = checksum::pseudo_header_sum_v6(src, dst, IpProtocol::TCP.0, len);
        checksum::fold(pseudo + checksum::sum(data)) == 0xffff
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
    pub fn set_seq_number(&mut self, value: u32) {
        write_u32(self.buffer.as_mut(), field::SEQ_NUM, value);
    }

    #[inline(always)]
    pub fn set_ack_number(&mut self, value: u32) {
        write_u32(self.buffer.as_mut(), field::ACK_NUM, value);
    }

    /// Sets the header length in bytes (a multiple of 4, 20..=60); clears the
    /// reserved bits that share the byte.
    #[inline(always)]
    pub fn set_header_len(&mut self, header_len: usize) {
        self.buffer.as_mut()[field::DATA_OFFSET] = ((header_len / 4) as u8) << 4;
    }

    #[inline(always)]
    pub fn set_flags(&mut self, flags: TcpFlags) {
        self.buffer.as_mut()[field::FLAGS] = flags.0;
    }

    #[inline(always)]
    pub fn set_window_len(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::WINDOW, value);
    }

    #[inline(always)]
    pub fn set_checksum(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::CHECKSUM, value);
    }

    #[inline(always)]
    pub fn set_urgent_at(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::URGENT, value);
    }

    #[inline(always)]
    pub fn options_mut(&mut self) -> &mut [u8] {
        let end = self.header_len();
        &mut self.buffer.as_mut()[field::OPTIONS..end]
    }

    #[inline(always)]
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let start = self.header_len();
        &mut self.buffer.as_mut()[start..]
    }

    /// Recomputes the checksum over pseudo-header, header and data.
    #[inline(always)]
    pub fn fill_checksum(&mut self, src: Ipv4Addr, dst: Ipv4Addr) {
        self.set_checksum(0);
        // Over 64 KiB the length wraps; such a segment cannot be sent over IPv4 anyway.
        let len = self.buffer.as_ref().len() as u16;
        let pseudo = checksum::pseudo_header_sum(src, dst, IpProtocol::TCP.0, len);
        let value = checksum::finish(pseudo + checksum::sum(self.buffer.as_ref()));
        self.set_checksum(value);
    }

    /// Recomputes the checksum over the IPv6 pseudo-header, header and data.
    #[inline(always)]
    pub fn fill_checksum_v6(&mut self, src: Ipv6Addr, dst: Ipv6Addr) {
        self.set_checksum(0);
        let data = self.buffer.as_ref();
        let len = data.len() as u32;
        let pseudo = checksum::pseudo_header_sum_v6(src, dst, IpProtocol::TCP.0, len);
        let value = checksum::finish(pseudo + checksum::sum(data));
        self.set_checksum(value);
    }

    /// Adjusts the checksum for an IPv6 address of the pseudo-header that changed
    /// from `old` to `new` (RFC 1624).
    #[inline(always)]
    pub fn update_checksum128(&mut self, old: Ipv6Addr, new: Ipv6Addr) {
        let value = checksum::update128(self.checksum(), old, new);
        self.set_checksum(value);
    }

    /// Adjusts the checksum for a 16-bit field (a port) that changed from `old` to
    /// `new`, in the segment or its pseudo-header (RFC 1624).
    #[inline(always)]
    pub fn update_checksum16(&mut self, old: u16, new: u16) {
        let value = checksum::update16(self.checksum(), old, new);
        self.set_checksum(value);
    }

    /// Adjusts the checksum for the changes summed in `delta` (RFC 1624).
    #[inline(always)]
    pub fn apply_checksum_delta(&mut self, delta: checksum::Delta) {
        let value = delta.apply(self.checksum());
        self.set_checksum(value);
    }

    /// Adjusts the checksum for a 32-bit field (an address in the pseudo-header, a
    /// sequence number) that changed from `old` to `new` (RFC 1624).
    #[inline(always)]
    pub fn update_checksum32(&mut self, old: u32, new: u32) {
        let value = checksum::update32(self.checksum(), old, new);
        self.set_checksum(value);
    }
}

/// Option kinds (IANA "TCP Option Kind Numbers").
pub mod option_kind {
    pub const END_OF_LIST: u8 = 0;
    pub const NO_OPERATION: u8 = 1;
    pub const MAX_SEGMENT_SIZE: u8 = 2;
    pub const WINDOW_SCALE: u8 = 3;
    pub const SACK_PERMITTED: u8 = 4;
    pub const SACK: u8 = 5;
    pub const TIMESTAMPS: u8 = 8;
}

/// One TCP option.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TcpOption<'a> {
    EndOfList,
    NoOperation,
    MaxSegmentSize(u16),
    WindowScale(u8),
    SackPermitted,
    /// SACK blocks: 1 to 4 pairs of big-endian (left edge, right edge) u32s.
    Sack(&'a [u8]),
    Timestamps {
        tsval: u32,
        tsecr: u32,
    },
    Unknown {
        kind: u8,
        data: &'a [u8],
    },
}

impl TcpOption<'_> {
    /// Bytes the option takes on the wire.
    #[inline(always)]
    pub fn buffer_len(&self) -> usize {
        match self {
            TcpOption::EndOfList | TcpOption::NoOperation => 1,
            TcpOption::MaxSegmentSize(_) => 4,
            TcpOption::WindowScale(_) => 3,
            TcpOption::SackPermitted => 2,
            TcpOption::Sack(blocks) => 2 + blocks.len(),
            TcpOption::Timestamps { .. } => 10,
            TcpOption::Unknown { data, .. } => 2 + data.len(),
        }
    }

    /// Writes the option at the start of `buffer` and returns its length, or `None`
    /// (writing nothing) if it does not fit or its data is too long to encode.
    #[inline(always)]
    pub fn emit(&self, buffer: &mut [u8]) -> Option<usize> {
        let len = self.buffer_len();
        if len > buffer.len() || len > u8::MAX as usize {
            return None;
        }
        let (kind, body) = match *self {
            TcpOption::EndOfList => {
                buffer[0] = option_kind::END_OF_LIST;
                return Some(1);
            }
            TcpOption::NoOperation => {
                buffer[0] = option_kind::NO_OPERATION;
                return Some(1);
            }
            TcpOption::MaxSegmentSize(mss) => {
                write_u16(buffer, 2, mss);
                (option_kind::MAX_SEGMENT_SIZE, None)
            }
            TcpOption::WindowScale(shift) => {
                buffer[2] = shift;
                (option_kind::WINDOW_SCALE, None)
            }
            TcpOption::SackPermitted => (option_kind::SACK_PERMITTED, None),
            TcpOption::Sack(blocks) => (option_kind::SACK, Some(blocks)),
            TcpOption::Timestamps { tsval, tsecr } => {
                write_u32(buffer, 2, tsval);
                write_u32(buffer, 6, tsecr);
                (option_kind::TIMESTAMPS, None)
            }
            TcpOption::Unknown { kind, data } => (kind, Some(data)),
        };
        buffer[0] = kind;
        buffer[1] = len as u8;
        if let Some(body) = body {
            buffer[2..len].copy_from_slice(body);
        }
        Some(len)
    }
}

/// Iterator over the options area. Yields `Err(Malformed)` once, then stops, when an
/// option's length byte is missing, below 2, runs past the header, or does not fit its
/// kind; stops after `EndOfList`.
#[derive(Clone, Debug)]
pub struct Options<'a> {
    rest: &'a [u8],
}

impl<'a> Options<'a> {
    #[inline(always)]
    pub fn new(options: &'a [u8]) -> Options<'a> {
        Options { rest: options }
    }

    fn parse_one(&mut self) -> Result<TcpOption<'a>, WireError> {
        let rest = self.rest;
        let kind = rest[0];
        match kind {
            option_kind::END_OF_LIST => {
                self.rest = &[];
                return Ok(TcpOption::EndOfList);
            }
            option_kind::NO_OPERATION => {
                self.rest = &rest[1..];
                return Ok(TcpOption::NoOperation);
            }
            _ => {}
        }
        let len = *rest.get(1).ok_or(WireError::Malformed)? as usize;
        if len < 2 || len > rest.len() {
            return Err(WireError::Malformed);
        }
        let data = &rest[2..len];
        self.rest = &rest[len..];
        let option = match (kind, data.len()) {
            (option_kind::MAX_SEGMENT_SIZE, 2) => TcpOption::MaxSegmentSize(read_u16(data, 0)),
            (option_kind::WINDOW_SCALE, 1) => TcpOption::WindowScale(data[0]),
            (option_kind::SACK_PERMITTED, 0) => TcpOption::SackPermitted,
            (option_kind::SACK, n) if n > 0 && n % 8 == 0 => TcpOption::Sack(data),
            (option_kind::TIMESTAMPS, 8) => TcpOption::Timestamps {
                tsval: read_u32(data, 0),
                tsecr: read_u32(data, 4),
            },
            (
                option_kind::MAX_SEGMENT_SIZE
                | option_kind::WINDOW_SCALE
                | option_kind::SACK_PERMITTED
                | option_kind::SACK
                | option_kind::TIMESTAMPS,
                _,
            ) => return Err(WireError::Malformed),
            _ => TcpOption::Unknown { kind, data },
        };
        Ok(option)
    }
}

impl<'a> Iterator for Options<'a> {
    type Item = Result<TcpOption<'a>, WireError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let parsed = self.parse_one();
        if parsed.is_err() {
            self.rest = &[];
        }
        Some(parsed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
    const SERVER: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

    // A Linux SYN 10.0.0.1:54321 -> 10.0.0.2:80: MSS 1460, SACK permitted,
    // timestamps, NOP, window scale 7.
    static SYN: [u8; 40] = [
        0xd4, 0x31, 0x00, 0x50, 0x1a, 0x2b, 0x3c, 0x4d, 0x00, 0x00, 0x00, 0x00, 0xa0, 0x02, 0xfa,
        0xf0, 0x56, 0xbc, 0x00, 0x00, 0x02, 0x04, 0x05, 0xb4, 0x04, 0x02, 0x08, 0x0a, 0x8c, 0x1a,
        0x2b, 0x3c, 0x00, 0x00, 0x00, 0x00, 0x01, 0x03, 0x03, 0x07,
    ];

    // The first data segment on that connection: PSH+ACK, "GET / HTTP/1.0\r\n\r\n".
    static DATA: [u8; 38] = [
        0xd4, 0x31, 0x00, 0x50, 0x1a, 0x2b, 0x3c, 0x4e, 0x5e, 0x6f, 0x70, 0x81, 0x50, 0x18, 0x01,
        0xf6, 0xc1, 0x36, 0x00, 0x00, 0x47, 0x45, 0x54, 0x20, 0x2f, 0x20, 0x48, 0x54, 0x54, 0x50,
        0x2f, 0x31, 0x2e, 0x30, 0x0d, 0x0a, 0x0d, 0x0a,
    ];

    #[test]
    fn syn_fields_and_options() {
        let packet = Packet::new_checked(&SYN[..]).unwrap();
        assert_eq!((packet.src_port(), packet.dst_port()), (54321, 80));
        assert_eq!(packet.seq_number(), 0x1a2b_3c4d);
        assert_eq!(packet.ack_number(), 0);
        assert_eq!(packet.header_len(), 40);
        assert_eq!(packet.flags(), TcpFlags::SYN);
        assert!(packet.syn() && !packet.ack() && !packet.fin() && !packet.rst());
        assert_eq!(packet.window_len(), 64240);
        assert_eq!(packet.checksum(), 0x56bc);
        assert_eq!(packet.urgent_at(), 0);
        assert!(packet.payload().is_empty());
        assert!(packet.verify_checksum(CLIENT, SERVER));
        assert!(!packet.verify_checksum(CLIENT, Ipv4Addr::new(10, 0, 0, 3)));
        assert_eq!(packet.max_segment_size(), Some(1460));
        let options: Vec<_> = packet.option_iter().collect();
        assert_eq!(
            options,
            [
                Ok(TcpOption::MaxSegmentSize(1460)),
                Ok(TcpOption::SackPermitted),
                Ok(TcpOption::Timestamps {
                    tsval: 0x8c1a_2b3c,
                    tsecr: 0
                }),
                Ok(TcpOption::NoOperation),
                Ok(TcpOption::WindowScale(7)),
            ]
        );
    }

    #[test]
    fn data_segment() {
        let packet = Packet::new_checked(&DATA[..]).unwrap();
        assert_eq!(packet.flags(), TcpFlags::PSH | TcpFlags::ACK);
        assert!(packet.flags().intersects(TcpFlags::ACK | TcpFlags::RST));
        assert!(!packet.flags().contains(TcpFlags::ACK | TcpFlags::FIN));
        assert_eq!(format!("{:?}", packet.flags()), "[P.]");
        assert_eq!(packet.ack_number(), 0x5e6f_7081);
        assert_eq!(packet.payload(), b"GET / HTTP/1.0\r\n\r\n");
        assert_eq!(packet.option_iter().count(), 0);
        assert_eq!(packet.max_segment_size(), None);
        assert!(packet.verify_checksum(CLIENT, SERVER));
    }

    #[test]
    fn length_errors() {
        for len in 0..MIN_HEADER_LEN {
            assert_eq!(Packet::new_checked(&SYN[..len]), Err(WireError::Truncated));
        }
        for len in MIN_HEADER_LEN..40 {
            assert_eq!(
                Packet::new_checked(&SYN[..len]),
                Err(WireError::Truncated),
                "options cut"
            );
        }
        let mut offset4 = DATA;
        offset4[12] = 0x40;
        assert_eq!(Packet::new_checked(&offset4[..]), Err(WireError::Malformed));
    }

    #[test]
    fn fill_and_incremental_checksum() {
        let mut buf = DATA;
        let mut packet = Packet::new_checked(&mut buf[..]).unwrap();
        packet.set_checksum(0xdead);
        packet.fill_checksum(CLIENT, SERVER);
        assert_eq!(packet.checksum(), 0xc136);

        // NAT: destination 10.0.0.2:80 -> 10.0.1.5:8080, adjusted incrementally.
        let real_server = Ipv4Addr::new(10, 0, 1, 5);
        packet.set_dst_port(8080);
        packet.update_checksum16(80, 8080);
        packet.update_checksum32(u32::from(SERVER), u32::from(real_server));
        assert!(packet.verify_checksum(CLIENT, real_server));
        let incremental = packet.checksum();
        packet.fill_checksum(CLIENT, real_server);
        assert_eq!(incremental, packet.checksum());
    }

    #[test]
    fn setters() {
        let mut buf = [0u8; 24];
        let mut packet = Packet::new_unchecked(&mut buf[..]);
        packet.set_src_port(1);
        packet.set_dst_port(2);
        packet.set_seq_number(3);
        packet.set_ack_number(4);
        packet.set_header_len(24);
        packet.set_flags(TcpFlags::SYN | TcpFlags::ACK);
        packet.set_window_len(5);
        packet.set_urgent_at(6);
        assert_eq!(
            TcpOption::MaxSegmentSize(1400).emit(packet.options_mut()),
            Some(4)
        );
        let packet = Packet::new_checked(&buf[..]).unwrap();
        assert_eq!((packet.src_port(), packet.dst_port()), (1, 2));
        assert_eq!((packet.seq_number(), packet.ack_number()), (3, 4));
        assert_eq!(format!("{:?}", packet.flags()), "[S.]");
        assert_eq!((packet.window_len(), packet.urgent_at()), (5, 6));
        assert_eq!(packet.max_segment_size(), Some(1400));
    }

    #[test]
    fn options_emit_round_trip() {
        let sack = [0, 0, 0, 1, 0, 0, 0, 2];
        let options = [
            TcpOption::MaxSegmentSize(9000),
            TcpOption::NoOperation,
            TcpOption::WindowScale(14),
            TcpOption::SackPermitted,
            TcpOption::Sack(&sack),
            TcpOption::Timestamps { tsval: 1, tsecr: 2 },
            TcpOption::Unknown {
                kind: 30,
                data: &[1, 2],
            },
            TcpOption::EndOfList,
        ];
        let mut buf = [0u8; 40];
        let mut at = 0;
        for option in &options {
            at += option.emit(&mut buf[at..]).unwrap();
        }
        assert_eq!(at, options.iter().map(|o| o.buffer_len()).sum::<usize>());
        let parsed: Vec<_> = Options::new(&buf[..at]).map(Result::unwrap).collect();
        assert_eq!(parsed, options);
        assert_eq!(
            TcpOption::Timestamps { tsval: 0, tsecr: 0 }.emit(&mut [0; 9]),
            None
        );
    }

    #[test]
    fn malformed_options_stop_the_iterator() {
        let cases: [&[u8]; 6] = [
            &[2],                   // kind without length
            &[2, 1, 0, 0],          // length below 2
            &[2, 6, 5, 0],          // runs past the options area
            &[2, 3, 5],             // MSS of the wrong size
            &[5, 6, 0, 0, 0, 0],    // SACK not a multiple of 8
            &[8, 4, 0, 0, 1, 1, 1], // timestamps of the wrong size
        ];
        for case in cases {
            let items: Vec<_> = Options::new(case).collect();
            assert_eq!(items.last(), Some(&Err(WireError::Malformed)), "{case:?}");
            assert_eq!(items.iter().filter(|i| i.is_err()).count(), 1);
        }
        // Everything after the end of the list is ignored.
        let items: Vec<_> = Options::new(&[1, 0, 2, 2, 0xff]).collect();
        assert_eq!(
            items,
            [Ok(TcpOption::NoOperation), Ok(TcpOption::EndOfList)]
        );
    }

    #[test]
    fn options_never_panic_on_noise() {
        let mut rng = crate::wire::test_util::XorShift(77);
        let mut buf = [0u8; 40];
        for _ in 0..5000 {
            let len = rng.below(41);
            rng.fill(&mut buf[..len]);
            // Bias toward known kinds so their length checks get exercised.
            if len > 0 {
                buf[0] %= 10;
            }
            assert!(Options::new(&buf[..len]).count() <= len);
        }
    }
}
