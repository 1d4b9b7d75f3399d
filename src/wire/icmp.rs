//! ICMPv4 (RFC 792). The view covers the whole message: the checksum spans it all,
//! so the buffer must end where the IPv4 payload ends (use `ipv4::Packet::payload`).

use super::checksum;
use super::{read_u16, write_u16, WireError};

/// ICMPv4 message types Sluice names; others pass through as numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Message(pub u8);

impl Message {
    pub const ECHO_REPLY: Message = Message(0);
    pub const DEST_UNREACHABLE: Message = Message(3);
    pub const ECHO_REQUEST: Message = Message(8);
    pub const TIME_EXCEEDED: Message = Message(11);
    pub const PARAMETER_PROBLEM: Message = Message(12);

    /// An error message that quotes the offending datagram (RFC 792, RFC 1122 3.2.2):
    /// destination unreachable, source quench, redirect, time exceeded, parameter
    /// problem. Never sent in response to another error.
    pub const fn is_error(self) -> bool {
        matches!(self.0, 3 | 4 | 5 | 11 | 12)
    }
}

/// Destination-unreachable code "fragmentation needed and DF set" (RFC 792), whose
/// second header word carries the next-hop MTU (RFC 1191).
pub const CODE_FRAG_NEEDED: u8 = 4;

mod field {
    pub const TYPE: usize = 0;
    pub const CODE: usize = 1;
    pub const CHECKSUM: usize = 2;
    /// The second header word; for echo messages the identifier and sequence number.
    pub const ECHO_IDENT: usize = 4;
    pub const ECHO_SEQ_NO: usize = 6;
    /// Destination unreachable / fragmentation needed: 16 unused bits, then the MTU.
    pub const UNUSED: usize = 4;
    pub const NEXT_HOP_MTU: usize = 6;
    pub const DATA: usize = 8;
}

/// Length of the ICMPv4 header: type, code, checksum, and the 4-byte rest-of-header
/// every message type has.
pub const HEADER_LEN: usize = field::DATA;

/// A view of an ICMPv4 message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps `buffer` without checks; accessors panic if it is shorter than 8 bytes.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps `buffer` after checking it holds the 8-byte header.
    pub fn new_checked(buffer: T) -> Result<Packet<T>, WireError> {
        let packet = Self::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    pub fn check_len(&self) -> Result<(), WireError> {
        if self.buffer.as_ref().len() < HEADER_LEN {
            Err(WireError::Truncated)
        } else {
            Ok(())
        }
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    pub fn msg_type(&self) -> Message {
        Message(self.buffer.as_ref()[field::TYPE])
    }

    pub fn msg_code(&self) -> u8 {
        self.buffer.as_ref()[field::CODE]
    }

    pub fn checksum(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::CHECKSUM)
    }

    /// Echo identifier (meaningful for echo request and reply only).
    pub fn echo_ident(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::ECHO_IDENT)
    }

    /// Echo sequence number (meaningful for echo request and reply only).
    pub fn echo_seq_no(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::ECHO_SEQ_NO)
    }

    /// Next-hop MTU of a fragmentation-needed message (RFC 1191).
    pub fn next_hop_mtu(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::NEXT_HOP_MTU)
    }

    /// Everything after the 8-byte header.
    pub fn data(&self) -> &[u8] {
        &self.buffer.as_ref()[field::DATA..]
    }

    /// The checksum over the whole message is correct.
    pub fn verify_checksum(&self) -> bool {
        checksum::fold(checksum::sum(self.buffer.as_ref())) == 0xffff
    }

    pub fn is_echo_request(&self) -> bool {
        self.msg_type() == Message::ECHO_REQUEST && self.msg_code() == 0
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_msg_type(&mut self, value: Message) {
        self.buffer.as_mut()[field::TYPE] = value.0;
    }

    pub fn set_msg_code(&mut self, value: u8) {
        self.buffer.as_mut()[field::CODE] = value;
    }

    pub fn set_checksum(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::CHECKSUM, value);
    }

    pub fn set_echo_ident(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::ECHO_IDENT, value);
    }

    pub fn set_echo_seq_no(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::ECHO_SEQ_NO, value);
    }

    /// Writes the second header word of a fragmentation-needed message: the unused
    /// half zeroed, then the next-hop MTU (RFC 1191).
    pub fn set_next_hop_mtu(&mut self, mtu: u16) {
        write_u16(self.buffer.as_mut(), field::UNUSED, 0);
        write_u16(self.buffer.as_mut(), field::NEXT_HOP_MTU, mtu);
    }

    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::DATA..]
    }

    /// Recomputes the checksum over the whole message.
    pub fn fill_checksum(&mut self) {
        self.set_checksum(0);
        let value = checksum::finish(checksum::sum(self.buffer.as_ref()));
        self.set_checksum(value);
    }

    /// Turns an echo request into its reply in place: type 0, same identifier, sequence
    /// and data. The checksum is adjusted incrementally (RFC 1624), because only the
    /// type/code word changes and the data may be long.
    pub fn echo_request_to_reply(&mut self) {
        let old_word = read_u16(self.buffer.as_ref(), field::TYPE);
        self.set_msg_type(Message::ECHO_REPLY);
        let new_word = read_u16(self.buffer.as_ref(), field::TYPE);
        let value = checksum::update16(self.checksum(), old_word, new_word);
        if value == 0 {
            // RFC 1624's update cannot tell the two one's-complement zeros apart: for a
            // message that sums to +0 (an all-zero echo reply) it yields 0x0000 where
            // only 0xffff verifies. Rare, so settle it with a full recompute.
            self.fill_checksum();
        } else {
            self.set_checksum(value);
        }
    }
}

/// A parsed echo request or reply; other message types are left to the view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Repr<'a> {
    EchoRequest {
        ident: u16,
        seq_no: u16,
        data: &'a [u8],
    },
    EchoReply {
        ident: u16,
        seq_no: u16,
        data: &'a [u8],
    },
}

impl<'a> Repr<'a> {
    /// Parses an echo message with a valid checksum. Errors: `Truncated` below 8 bytes,
    /// `Malformed` for a bad checksum, `Unsupported` for other message types or codes.
    pub fn parse<T: AsRef<[u8]> + ?Sized>(packet: &Packet<&'a T>) -> Result<Repr<'a>, WireError> {
        packet.check_len()?;
        if !packet.verify_checksum() {
            return Err(WireError::Malformed);
        }
        let whole: &'a T = packet.buffer;
        let data = &whole.as_ref()[field::DATA..];
        let (ident, seq_no) = (packet.echo_ident(), packet.echo_seq_no());
        match (packet.msg_type(), packet.msg_code()) {
            (Message::ECHO_REQUEST, 0) => Ok(Repr::EchoRequest {
                ident,
                seq_no,
                data,
            }),
            (Message::ECHO_REPLY, 0) => Ok(Repr::EchoReply {
                ident,
                seq_no,
                data,
            }),
            _ => Err(WireError::Unsupported),
        }
    }

    pub fn buffer_len(&self) -> usize {
        match self {
            Repr::EchoRequest { data, .. } | Repr::EchoReply { data, .. } => {
                HEADER_LEN + data.len()
            }
        }
    }

    /// Writes the message and its checksum; the buffer must be exactly `buffer_len()`
    /// long, since the checksum covers all of it.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        let (msg_type, ident, seq_no, data) = match *self {
            Repr::EchoRequest {
                ident,
                seq_no,
                data,
            } => (Message::ECHO_REQUEST, ident, seq_no, data),
            Repr::EchoReply {
                ident,
                seq_no,
                data,
            } => (Message::ECHO_REPLY, ident, seq_no, data),
        };
        packet.set_msg_type(msg_type);
        packet.set_msg_code(0);
        packet.set_echo_ident(ident);
        packet.set_echo_seq_no(seq_no);
        packet.data_mut()[..data.len()].copy_from_slice(data);
        packet.fill_checksum();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Echo request, ident 0x0b1e, seq 1, 48 bytes of data (timestamp, then 0x10..0x37).
    static ECHO_REQUEST: [u8; 56] = [
        0x08, 0x00, 0x94, 0x3d, 0x0b, 0x1e, 0x00, 0x01, 0x5e, 0x6a, 0x3b, 0x66, 0x00, 0x00, 0x00,
        0x00, 0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d,
        0x1e, 0x1f, 0x20, 0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27, 0x28, 0x29, 0x2a, 0x2b, 0x2c,
        0x2d, 0x2e, 0x2f, 0x30, 0x31, 0x32, 0x33, 0x34, 0x35, 0x36, 0x37,
    ];

    #[test]
    fn all_zero_echo_reply_gets_the_checksum_that_verifies() {
        // id 0, seq 0, no data: the request's checksum is 0xf7ff and the reply message
        // is all zeros, whose only verifying checksum is 0xffff (not 0x0000).
        let mut bytes = [0x08, 0x00, 0xf7, 0xff, 0x00, 0x00, 0x00, 0x00];
        let mut packet = Packet::new_checked(&mut bytes[..]).unwrap();
        assert!(packet.verify_checksum());
        packet.echo_request_to_reply();
        assert_eq!(packet.checksum(), 0xffff);
        assert!(packet.verify_checksum());
    }

    // Port unreachable quoting an IPv4/UDP header (type 3 code 3), checksum valid.
    static PORT_UNREACHABLE: [u8; 36] = [
        0x03, 0x03, 0xf7, 0xed, 0x00, 0x00, 0x00, 0x00, 0x45, 0x00, 0x00, 0x1c, 0x00, 0x00, 0x40,
        0x00, 0x40, 0x11, 0x26, 0xcf, 0x0a, 0x00, 0x00, 0x01, 0x0a, 0x00, 0x00, 0x02, 0x04, 0xd2,
        0x00, 0x35, 0x00, 0x08, 0x00, 0x00,
    ];

    #[test]
    fn echo_request_fields() {
        let packet = Packet::new_checked(&ECHO_REQUEST[..]).unwrap();
        assert_eq!(packet.msg_type(), Message::ECHO_REQUEST);
        assert_eq!(packet.msg_code(), 0);
        assert!(packet.is_echo_request());
        assert_eq!(packet.checksum(), 0x943d);
        assert_eq!(packet.echo_ident(), 0x0b1e);
        assert_eq!(packet.echo_seq_no(), 1);
        assert_eq!(packet.data().len(), 48);
        assert!(packet.verify_checksum());
    }

    #[test]
    fn other_message_types() {
        let packet = Packet::new_checked(&PORT_UNREACHABLE[..]).unwrap();
        assert_eq!(packet.msg_type(), Message::DEST_UNREACHABLE);
        assert_eq!(packet.msg_code(), 3);
        assert!(packet.verify_checksum());
        assert!(!packet.is_echo_request());
        assert_eq!(Repr::parse(&packet), Err(WireError::Unsupported));
    }

    #[test]
    fn error_types_and_next_hop_mtu() {
        for t in [3, 4, 5, 11, 12] {
            assert!(Message(t).is_error(), "{t}");
        }
        for t in [0, 8, 13, 14, 255] {
            assert!(!Message(t).is_error(), "{t}");
        }
        let mut buf = PORT_UNREACHABLE;
        buf[4..8].copy_from_slice(&[0xde, 0xad, 0xbe, 0xef]);
        let mut packet = Packet::new_checked(&mut buf[..]).unwrap();
        packet.set_msg_code(CODE_FRAG_NEEDED);
        packet.set_next_hop_mtu(1480);
        assert_eq!(packet.next_hop_mtu(), 1480);
        packet.fill_checksum();
        assert!(packet.verify_checksum());
        assert_eq!(
            buf[..8],
            [0x03, 0x04, buf[2], buf[3], 0x00, 0x00, 0x05, 0xc8]
        );
    }

    #[test]
    fn truncated_and_bad_checksum() {
        for len in 0..HEADER_LEN {
            assert_eq!(
                Packet::new_checked(&ECHO_REQUEST[..len]),
                Err(WireError::Truncated)
            );
        }
        let mut corrupt = ECHO_REQUEST;
        corrupt[40] ^= 0x01;
        let packet = Packet::new_checked(&corrupt[..]).unwrap();
        assert!(!packet.verify_checksum());
        assert_eq!(Repr::parse(&packet), Err(WireError::Malformed));
        // A cut message no longer matches its checksum either.
        assert!(!Packet::new_checked(&ECHO_REQUEST[..50])
            .unwrap()
            .verify_checksum());
    }

    #[test]
    fn reply_in_place_matches_full_recompute() {
        let mut buf = ECHO_REQUEST;
        let mut packet = Packet::new_checked(&mut buf[..]).unwrap();
        packet.echo_request_to_reply();
        let incremental = packet.checksum();
        packet.fill_checksum();
        assert_eq!(incremental, packet.checksum());
        assert_eq!(incremental, 0x9c3d);
        assert_eq!(buf[0], 0);
        assert_eq!(buf[4..], ECHO_REQUEST[4..]);
    }

    #[test]
    fn repr_round_trip() {
        let packet = Packet::new_checked(&ECHO_REQUEST[..]).unwrap();
        let repr = Repr::parse(&packet).unwrap();
        let Repr::EchoRequest {
            ident,
            seq_no,
            data,
        } = repr
        else {
            panic!("expected an echo request, got {repr:?}");
        };
        assert_eq!((ident, seq_no, data), (0x0b1e, 1, &ECHO_REQUEST[8..]));
        let mut buf = [0u8; 56];
        assert_eq!(repr.buffer_len(), buf.len());
        repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, ECHO_REQUEST);

        let reply = Repr::EchoReply {
            ident,
            seq_no,
            data,
        };
        reply.emit(&mut Packet::new_unchecked(&mut buf[..]));
        let parsed = Repr::parse(&Packet::new_checked(&buf[..]).unwrap()).unwrap();
        assert_eq!(parsed, reply);
    }
}
