//! The session sync message format, version 6: what the active node sends its standby
//! in UDP datagrams. Layout, versioning rule and semantics are in `docs/SYNC.md`.
//!
//! As in `crate::wire`: [`Packet`] is a zero-copy view over any `T: AsRef<[u8]>`,
//! `new_checked` validates every length the accessors rely on, and
//! [`MessageRepr`]/[`RecordRepr`] parse and emit the fields. Records are fixed-size and
//! parsed one at a time from the datagram, so reading a message allocates nothing.
//!
//! Learned from IPVS sync v1 (`ip_vs_sync.c`): one record per connection with the
//! protocol, the client, virtual and real addresses and ports (plus, as DPVS adds for
//! FullNAT, the local address and port), the state, the flags and the remaining
//! timeout; persistence templates travel as records of their own kind. Unlike IPVS v1
//! the forwarding mode has a field of its own (numbered with IPVS's `IP_VS_CONN_F_*`
//! forwarding codes, FullNAT as in DPVS), and the timeout is in milliseconds. As IPVS
//! v1 sends IPv6 connections in records of their own, larger type, an IPv6 connection
//! is a record of its own kind and size ([`RECORD6_LEN`]), in the same messages; an
//! IPv6 persistence template too (kind 4, the IPv6 connection's layout).
use core::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

use crate::flow::{FlowKey4, FlowKey6};
use crate::model::ForwardMode;
use crate::model::Protocol;
use crate::session::table6::Session6;
use crate::session::{Session, SessionFlags, TcpState, MAX_TIMEOUT_SECS};
use crate::wire::{read_u16, read_u32, write_u16, write_u32};

fn read_u64(data: &[u8], at: usize) -> u64 {
    (u64::from(read_u32(data, at)) << 32) | u64::from(read_u32(data, at + 4))
}

fn write_u64(data: &mut [u8], at: usize, value: u64) {
    write_u32(data, at, (value >> 32) as u32);
    write_u32(data, at + 4, value as u32);
}

/// "SLSY": the first four bytes of every sync message, of every version.
pub const MAGIC: u32 = 0x534c_5359;
/// The version this module reads and writes. Any change to the header or record layout
/// takes a new number; a receiver rejects every version but its own.
pub const VERSION: u8 = 6;

mod field {
    pub const MAGIC: usize = 0;
    pub const VERSION: usize = 4;
    pub const TYPE: usize = 5;
    pub const FLAGS: usize = 6;
    pub const LENGTH: usize = 8;
    pub const COUNT: usize = 10;
    pub const SENDER: usize = 12;
    pub const RECIPIENT: usize = 16;
    pub const DUMP_ID: usize = 20;
    pub const CHUNK: usize = 24;
    pub const EPOCH: usize = 28;
    pub const SEQUENCE: usize = 36;
    pub const RECORDS: usize = 44;

    // Record fields, relative to the record.
    pub const KIND: usize = 0;
    pub const OP: usize = 1;
    pub const PROTOCOL: usize = 2;
    pub const MODE: usize = 3;
    pub const STATE: usize = 4;
    pub const PREFIX_LEN: usize = 5;
    pub const RECORD_FLAGS: usize = 6;
    pub const CLIENT_ADDR: usize = 8;
    pub const VIRTUAL_ADDR: usize = 12;
    pub const REAL_ADDR: usize = 16;
    pub const LOCAL_ADDR: usize = 20;
    pub const CLIENT_PORT: usize = 24;
    pub const VIRTUAL_PORT: usize = 26;
    pub const REAL_PORT: usize = 28;
    pub const LOCAL_PORT: usize = 30;
    pub const TIMEOUT_MS: usize = 32;
    pub const TIMESTAMP_OFFSET: usize = 36;
    pub const SYNPROXY_SEQ_DELTA: usize = 40;
    pub const SYNPROXY_TS_DELTA: usize = 44;
    pub const SYNPROXY_SERVER_WSCALE: usize = 48;
    pub const SYNPROXY_CLIENT_WSCALE: usize = 49;
    pub const RESERVED: usize = 50;
    pub const RECORD_END: usize = 52;
}

/// The fields of an IPv6 connection record (kind 3), relative to the record: the
/// IPv4 record's first eight bytes, then the four addresses at 16 bytes each, then
/// the IPv4 record's fields from the ports on.
mod field6 {
    pub const CLIENT_ADDR: usize = 8;
    pub const VIRTUAL_ADDR: usize = 24;
    pub const REAL_ADDR: usize = 40;
    pub const LOCAL_ADDR: usize = 56;
    /// Where the IPv4 record's client port (its byte 24) and what follows it sit.
    pub const PORTS: usize = 72;
    pub const RECORD_END: usize = 100;
}

/// Bytes before the first record.
pub const HEADER_LEN: usize = field::RECORDS;
/// Bytes per IPv4 record (kinds 1 and 2).
pub const RECORD_LEN: usize = field::RECORD_END;
/// Bytes per IPv6 record (kinds 3 and 4).
pub const RECORD6_LEN: usize = field6::RECORD_END;

/// Record kind byte of an IPv6 connection.
const KIND_CONNECTION6: u8 = 3;
/// Record kind byte of an IPv6 persistence template.
const KIND_TEMPLATE6: u8 = 4;

/// Bytes of a record whose kind byte is `kind`, if the kind is one this version has.
pub const fn record_len(kind: u8) -> Option<usize> {
    match kind {
        1 | 2 => Some(RECORD_LEN),
        KIND_CONNECTION6 | KIND_TEMPLATE6 => Some(RECORD6_LEN),
        _ => None,
    }
}
/// Bytes of the HMAC-SHA256 trailer of an authenticated message.
pub const HMAC_LEN: usize = 32;
/// IPv4 header (no options) plus UDP header: what the MTU must also hold.
pub const IPV4_UDP_OVERHEAD: usize = 20 + 8;
/// Largest timeout a record may carry: the session table's limit.
pub const MAX_TIMEOUT_MS: u32 = MAX_TIMEOUT_SECS * 1000;

/// Why a datagram is not a well-formed sync message of this version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SyncWireError {
    /// Shorter than the header, than its `length`, or than `length` plus the trailer.
    Truncated,
    /// The first four bytes are not [`MAGIC`]: not a sync message at all.
    BadMagic,
    /// A version this node does not speak.
    WrongVersion(u8),
    /// `length` below the header, not header plus `count` records, bytes after the
    /// message, or records in a message type that carries none.
    BadLength,
    /// A message type this version does not define.
    UnknownType(u8),
    /// Flag bits this version does not define, or a flag the message type forbids.
    UnknownFlags(u16),
    /// Record `index` (from 0) holds a value the format forbids.
    BadRecord { index: u16, fault: RecordFault },
}

impl fmt::Display for SyncWireError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SyncWireError::Truncated => f.write_str("truncated sync message"),
            SyncWireError::BadMagic => f.write_str("not a sync message (bad magic)"),
            SyncWireError::WrongVersion(v) => {
                write!(f, "sync version {v} (this node speaks {VERSION})")
            }
            SyncWireError::BadLength => f.write_str("inconsistent sync message length"),
            SyncWireError::UnknownType(t) => write!(f, "unknown sync message type {t}"),
            SyncWireError::UnknownFlags(bits) => write!(f, "unknown sync flags {bits:#06x}"),
            SyncWireError::BadRecord { index, fault } => {
                write!(f, "sync record {index}: bad {fault:?}")
            }
        }
    }
}

impl std::error::Error for SyncWireError {}

/// Which field of a record is wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RecordFault {
    Kind,
    Op,
    Protocol,
    Mode,
    /// Not an IPVS TCP state, or not NONE where only NONE fits (UDP, templates).
    State,
    /// Not 32 for a connection (128 for an IPv6 one); above 32 (128 for an IPv6
    /// template), or host bits set, for a template.
    PrefixLen,
    /// An IPv6 record whose client or virtual address is an IPv4-mapped one (an IPv4
    /// connection travels in an IPv4 record).
    Address,
    /// Unknown bits, or any bit on a template.
    Flags,
    /// FullNAT without a local address and port, or another mode (or a template) with one.
    Local,
    /// A template with a client port.
    TemplatePort,
    /// Above [`MAX_TIMEOUT_MS`].
    Timeout,
    /// A timestamp offset on anything but a TCP connection.
    TimestampOffset,
    /// SYN proxy fields without the SYNPROXY flag, or with it: a window scale above
    /// 14 (and not "none"), reserved bytes set, or a record that is not a NAT or
    /// FullNAT TCP connection.
    Synproxy,
}

/// The message types of version 1.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum MessageType {
    /// Session and template changes, sent as they happen.
    SessionBatch = 1,
    /// Sent by a standby that starts or reconnects: "send me your whole table". No
    /// records; `dump_id` names the dump it wants.
    ResyncRequest = 2,
    /// One part of a full dump answering a request: `dump_id` echoes the request's,
    /// `chunk` counts from 0, and the last chunk has [`MessageFlags::LAST_CHUNK`].
    DumpChunk = 3,
}

impl MessageType {
    pub const fn from_u8(value: u8) -> Option<MessageType> {
        match value {
            1 => Some(MessageType::SessionBatch),
            2 => Some(MessageType::ResyncRequest),
            3 => Some(MessageType::DumpChunk),
            _ => None,
        }
    }
}

/// Header flag bits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct MessageFlags(u16);

impl MessageFlags {
    /// An HMAC-SHA256 trailer of [`HMAC_LEN`] bytes follows the message.
    pub const AUTHENTICATED: MessageFlags = MessageFlags(1 << 0);
    /// The last chunk of a dump (dump chunks only).
    pub const LAST_CHUNK: MessageFlags = MessageFlags(1 << 1);
    const KNOWN: u16 = Self::AUTHENTICATED.0 | Self::LAST_CHUNK.0;

    pub const fn empty() -> MessageFlags {
        MessageFlags(0)
    }

    pub const fn bits(self) -> u16 {
        self.0
    }

    pub const fn contains(self, other: MessageFlags) -> bool {
        self.0 & other.0 == other.0
    }

    pub fn set(&mut self, other: MessageFlags, on: bool) {
        if on {
            self.0 |= other.0;
        } else {
            self.0 &= !other.0;
        }
    }
}

/// Length of a message of `count` IPv4 records: header, records, and the trailer if
/// any.
pub const fn message_len(count: usize, authenticated: bool) -> usize {
    HEADER_LEN + count * RECORD_LEN + if authenticated { HMAC_LEN } else { 0 }
}

/// Most IPv4 records one message may carry so that its IPv4/UDP datagram fits in `mtu`
/// bytes; 0 when not even one fits (IPv6 records take [`RECORD6_LEN`] bytes each).
pub const fn max_records(mtu: u16, authenticated: bool) -> usize {
    let fixed = message_len(0, authenticated) + IPV4_UDP_OVERHEAD;
    (mtu as usize).saturating_sub(fixed) / RECORD_LEN
}

/// A view of a sync message: header, `count` records, and the trailer when the
/// [`MessageFlags::AUTHENTICATED`] flag is set. The buffer must be exactly the message
/// (a UDP payload has no padding), so extra bytes are an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps `buffer` without checks; accessors may panic on a short buffer.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps `buffer` after [`Packet::check_len`].
    pub fn new_checked(buffer: T) -> Result<Packet<T>, SyncWireError> {
        let packet = Self::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    /// Checks, in this order: magic and version (the first five bytes, the same in
    /// every version, so a message of another version is always recognised as such),
    /// the header, the buffer against `length` plus the trailer, and `length` against
    /// the header and the `count` records (each as long as its kind says; a kind this
    /// version lacks gives no length: that record is bad). After it no accessor
    /// panics.
    pub fn check_len(&self) -> Result<(), SyncWireError> {
        let data = self.buffer.as_ref();
        if data.len() < field::VERSION + 1 {
            return Err(SyncWireError::Truncated);
        }
        if read_u32(data, field::MAGIC) != MAGIC {
            return Err(SyncWireError::BadMagic);
        }
        if data[field::VERSION] != VERSION {
            return Err(SyncWireError::WrongVersion(data[field::VERSION]));
        }
        if data.len() < HEADER_LEN {
            return Err(SyncWireError::Truncated);
        }
        let length = self.len() as usize;
        if length < HEADER_LEN {
            return Err(SyncWireError::BadLength);
        }
        let total = length + self.trailer_len();
        if data.len() < total {
            return Err(SyncWireError::Truncated);
        }
        if data.len() > total {
            return Err(SyncWireError::BadLength);
        }
        let mut at = HEADER_LEN;
        for index in 0..self.count() {
            if at >= length {
                return Err(SyncWireError::BadLength);
            }
            let size = record_len(data[at]).ok_or(SyncWireError::BadRecord {
                index,
                fault: RecordFault::Kind,
            })?;
            at += size;
        }
        if at != length {
            return Err(SyncWireError::BadLength);
        }
        Ok(())
    }

    /// Where record `index` starts and how long it is (the records before it walked
    /// by their kinds); the message must have passed [`Packet::check_len`].
    fn record_span(&self, index: usize) -> (usize, usize) {
        let data = self.buffer.as_ref();
        let mut at = HEADER_LEN;
        for _ in 0..index {
            at += record_len(data[at]).unwrap_or(RECORD_LEN);
        }
        (at, record_len(data[at]).unwrap_or(RECORD_LEN))
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    pub fn magic(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::MAGIC)
    }

    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VERSION]
    }

    pub fn message_type(&self) -> u8 {
        self.buffer.as_ref()[field::TYPE]
    }

    pub fn flags(&self) -> MessageFlags {
        MessageFlags(read_u16(self.buffer.as_ref(), field::FLAGS))
    }

    /// Header plus records; the trailer is not counted.
    #[allow(clippy::len_without_is_empty)]
    pub fn len(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::LENGTH)
    }

    pub fn count(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::COUNT)
    }

    pub fn sender(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::SENDER)
    }

    pub fn recipient(&self) -> Ipv4Addr {
        Ipv4Addr::from(read_u32(self.buffer.as_ref(), field::RECIPIENT))
    }

    pub fn epoch(&self) -> u64 {
        read_u64(self.buffer.as_ref(), field::EPOCH)
    }

    pub fn sequence(&self) -> u64 {
        read_u64(self.buffer.as_ref(), field::SEQUENCE)
    }

    pub fn dump_id(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::DUMP_ID)
    }

    pub fn chunk(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::CHUNK)
    }

    fn trailer_len(&self) -> usize {
        if self.flags().contains(MessageFlags::AUTHENTICATED) {
            HMAC_LEN
        } else {
            0
        }
    }

    /// The bytes the HMAC covers: header and records.
    pub fn authenticated_bytes(&self) -> &[u8] {
        &self.buffer.as_ref()[..self.len() as usize]
    }

    /// The HMAC trailer, when the message has one.
    pub fn trailer(&self) -> Option<&[u8]> {
        let start = self.len() as usize;
        self.flags()
            .contains(MessageFlags::AUTHENTICATED)
            .then(|| &self.buffer.as_ref()[start..start + HMAC_LEN])
    }

    /// Record `index` (below `count`).
    pub fn record(&self, index: usize) -> Record<&[u8]> {
        let (start, len) = self.record_span(index);
        Record::new_unchecked(&self.buffer.as_ref()[start..start + len])
    }

    /// The records, in order.
    pub fn records(&self) -> impl Iterator<Item = Record<&[u8]>> + '_ {
        let data = self.buffer.as_ref();
        let mut at = HEADER_LEN;
        (0..self.count() as usize).map(move |_| {
            let len = record_len(data[at]).unwrap_or(RECORD_LEN);
            let record = Record::new_unchecked(&data[at..at + len]);
            at += len;
            record
        })
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_magic(&mut self, value: u32) {
        write_u32(self.buffer.as_mut(), field::MAGIC, value);
    }

    pub fn set_version(&mut self, value: u8) {
        self.buffer.as_mut()[field::VERSION] = value;
    }

    pub fn set_message_type(&mut self, value: u8) {
        self.buffer.as_mut()[field::TYPE] = value;
    }

    pub fn set_flags(&mut self, value: MessageFlags) {
        write_u16(self.buffer.as_mut(), field::FLAGS, value.0);
    }

    pub fn set_len(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::LENGTH, value);
    }

    pub fn set_count(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::COUNT, value);
    }

    pub fn set_sender(&mut self, value: u32) {
        write_u32(self.buffer.as_mut(), field::SENDER, value);
    }

    pub fn set_recipient(&mut self, value: Ipv4Addr) {
        write_u32(self.buffer.as_mut(), field::RECIPIENT, u32::from(value));
    }

    pub fn set_epoch(&mut self, value: u64) {
        write_u64(self.buffer.as_mut(), field::EPOCH, value);
    }

    pub fn set_sequence(&mut self, value: u64) {
        write_u64(self.buffer.as_mut(), field::SEQUENCE, value);
    }

    pub fn set_dump_id(&mut self, value: u32) {
        write_u32(self.buffer.as_mut(), field::DUMP_ID, value);
    }

    pub fn set_chunk(&mut self, value: u32) {
        write_u32(self.buffer.as_mut(), field::CHUNK, value);
    }

    /// Record `index`, writable, as long as the kind byte already there says (an
    /// IPv4 record's length where none is written yet); the buffer must hold it.
    pub fn record_mut(&mut self, index: usize) -> Record<&mut [u8]> {
        let (start, len) = self.record_span(index);
        Record::new_unchecked(&mut self.buffer.as_mut()[start..start + len])
    }

    /// The trailer room after `length`; the buffer must hold it.
    pub fn trailer_mut(&mut self) -> &mut [u8] {
        let start = self.len() as usize;
        &mut self.buffer.as_mut()[start..start + HMAC_LEN]
    }
}

/// The header of a sync message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MessageRepr {
    pub message_type: MessageType,
    pub flags: MessageFlags,
    /// The sender's node id (its listen address), for logs.
    pub sender: u32,
    /// Resync request and dump chunks: the one peer (its listen address) the message
    /// is for, so a copy sent to one peer is refused by another. 0.0.0.0 in a batch,
    /// which every peer receives.
    pub recipient: Ipv4Addr,
    /// The sender's life: chosen at its start, larger than any earlier life's (its
    /// start time in microseconds since the Unix epoch). A receiver refuses an earlier
    /// life's messages.
    pub epoch: u64,
    /// Per sender life, one more per message sent, from 0 (64 bits: never wraps):
    /// lets a receiver see losses and refuse a message it already had.
    pub sequence: u64,
    /// Resync request and dump chunks: which dump. 0 in a session batch.
    pub dump_id: u32,
    /// Dump chunks: the chunk's number from 0. 0 otherwise.
    pub chunk: u32,
    pub count: u16,
}

impl MessageRepr {
    /// Parses the header of a checked message and checks what depends on its type;
    /// the records are checked by [`RecordRepr::parse`] (see [`parse_records`]).
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<MessageRepr, SyncWireError> {
        packet.check_len()?;
        let message_type = MessageType::from_u8(packet.message_type())
            .ok_or(SyncWireError::UnknownType(packet.message_type()))?;
        let flags = packet.flags();
        if flags.0 & !MessageFlags::KNOWN != 0 {
            return Err(SyncWireError::UnknownFlags(flags.0));
        }
        if flags.contains(MessageFlags::LAST_CHUNK) && message_type != MessageType::DumpChunk {
            return Err(SyncWireError::UnknownFlags(flags.0));
        }
        if message_type == MessageType::ResyncRequest && packet.count() != 0 {
            return Err(SyncWireError::BadLength);
        }
        Ok(MessageRepr {
            message_type,
            flags,
            sender: packet.sender(),
            recipient: packet.recipient(),
            epoch: packet.epoch(),
            sequence: packet.sequence(),
            dump_id: packet.dump_id(),
            chunk: packet.chunk(),
            count: packet.count(),
        })
    }

    /// Header plus records plus the trailer, if [`MessageFlags::AUTHENTICATED`].
    pub const fn buffer_len(&self) -> usize {
        message_len(
            self.count as usize,
            self.flags.contains(MessageFlags::AUTHENTICATED),
        )
    }

    /// Writes the header, with `length` computed from `count` IPv4 records (a
    /// [`MessageBuilder`] writes the records' own). Records and the trailer are written
    /// separately; the buffer must hold [`Self::buffer_len`].
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_magic(MAGIC);
        packet.set_version(VERSION);
        packet.set_message_type(self.message_type as u8);
        packet.set_flags(self.flags);
        packet.set_len(message_len(self.count as usize, false) as u16);
        packet.set_count(self.count);
        packet.set_sender(self.sender);
        packet.set_recipient(self.recipient);
        packet.set_epoch(self.epoch);
        packet.set_sequence(self.sequence);
        packet.set_dump_id(self.dump_id);
        packet.set_chunk(self.chunk);
    }
}

/// Parses every record of a checked message, stopping at the first bad one.
/// `each` sees them in order; nothing is allocated.
pub fn parse_records<T: AsRef<[u8]>>(
    packet: &Packet<T>,
    mut each: impl FnMut(RecordRepr),
) -> Result<(), SyncWireError> {
    for (index, record) in packet.records().enumerate() {
        let repr = RecordRepr::parse(&record).map_err(|fault| SyncWireError::BadRecord {
            index: index as u16,
            fault,
        })?;
        each(repr);
    }
    Ok(())
}

/// A view of one record: exactly [`RECORD_LEN`] bytes (an IPv4 record) or
/// [`RECORD6_LEN`] (an IPv6 one), as [`Packet::record`] hands them out. The accessors
/// read the IPv4 layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Record<T> {
    /// Wraps `buffer` without checks; accessors panic below [`RECORD_LEN`] bytes.
    pub const fn new_unchecked(buffer: T) -> Record<T> {
        Record { buffer }
    }

    fn byte(&self, at: usize) -> u8 {
        self.buffer.as_ref()[at]
    }

    fn addr(&self, at: usize) -> Ipv4Addr {
        Ipv4Addr::from(read_u32(self.buffer.as_ref(), at))
    }

    fn port(&self, at: usize) -> u16 {
        read_u16(self.buffer.as_ref(), at)
    }

    pub fn kind(&self) -> u8 {
        self.byte(field::KIND)
    }
    pub fn op(&self) -> u8 {
        self.byte(field::OP)
    }
    pub fn protocol(&self) -> u8 {
        self.byte(field::PROTOCOL)
    }
    pub fn mode(&self) -> u8 {
        self.byte(field::MODE)
    }
    pub fn state(&self) -> u8 {
        self.byte(field::STATE)
    }
    pub fn prefix_len(&self) -> u8 {
        self.byte(field::PREFIX_LEN)
    }
    pub fn flags(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::RECORD_FLAGS)
    }
    pub fn client_addr(&self) -> Ipv4Addr {
        self.addr(field::CLIENT_ADDR)
    }
    pub fn virtual_addr(&self) -> Ipv4Addr {
        self.addr(field::VIRTUAL_ADDR)
    }
    pub fn real_addr(&self) -> Ipv4Addr {
        self.addr(field::REAL_ADDR)
    }
    pub fn local_addr(&self) -> Ipv4Addr {
        self.addr(field::LOCAL_ADDR)
    }
    pub fn client_port(&self) -> u16 {
        self.port(field::CLIENT_PORT)
    }
    pub fn virtual_port(&self) -> u16 {
        self.port(field::VIRTUAL_PORT)
    }
    pub fn real_port(&self) -> u16 {
        self.port(field::REAL_PORT)
    }
    pub fn local_port(&self) -> u16 {
        self.port(field::LOCAL_PORT)
    }
    pub fn timeout_ms(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::TIMEOUT_MS)
    }
    pub fn timestamp_offset(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::TIMESTAMP_OFFSET)
    }

    /// The SYN proxy fields, validated: `Some` when `flagged`, all zero otherwise.
    fn synproxy(&self, flagged: bool) -> Result<Option<SynproxyDelta>, RecordFault> {
        let buf = self.buffer.as_ref();
        if read_u16(buf, field::RESERVED) != 0 {
            return Err(RecordFault::Synproxy);
        }
        if !flagged {
            return match buf[field::SYNPROXY_SEQ_DELTA..field::RESERVED]
                .iter()
                .all(|&b| b == 0)
            {
                true => Ok(None),
                false => Err(RecordFault::Synproxy),
            };
        }
        let scale = |at: usize| match buf[at] {
            NO_WSCALE => Ok(None),
            s if s <= MAX_WSCALE => Ok(Some(s)),
            _ => Err(RecordFault::Synproxy),
        };
        Ok(Some(SynproxyDelta {
            seq_delta: read_u32(buf, field::SYNPROXY_SEQ_DELTA),
            ts_delta: read_u32(buf, field::SYNPROXY_TS_DELTA),
            server_wscale: scale(field::SYNPROXY_SERVER_WSCALE)?,
            client_wscale: scale(field::SYNPROXY_CLIENT_WSCALE)?,
        }))
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Record<T> {
    fn set_byte(&mut self, at: usize, value: u8) {
        self.buffer.as_mut()[at] = value;
    }

    fn set_addr(&mut self, at: usize, value: Ipv4Addr) {
        write_u32(self.buffer.as_mut(), at, u32::from(value));
    }

    fn set_port(&mut self, at: usize, value: u16) {
        write_u16(self.buffer.as_mut(), at, value);
    }

    /// Zeroes the record (reserved bits and absent fields).
    pub fn clear(&mut self) {
        self.buffer.as_mut().fill(0);
    }
}

/// What a record describes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RecordKind {
    /// One connection (a session of a worker's table).
    Connection = 1,
    /// A persistence template: client network to real server, for one service.
    Template = 2,
}

/// What the receiver does with a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RecordOp {
    /// Install, or update the state, flags and timeout of, the described entry.
    Update = 1,
    /// Remove the described entry (deleted on the sender before its timeout).
    Remove = 2,
}

/// Per-record flag bits; the same meaning as the session's [`SessionFlags`] they come
/// from, so a standby's copy behaves as the original.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RecordFlags(u16);

impl RecordFlags {
    /// No reply seen yet (DR/TUN: client packets use the INPUT-ONLY transitions).
    pub const NO_OUTPUT: RecordFlags = RecordFlags(1 << 0);
    /// FullNAT with TOA: the client address still goes into the next segment.
    pub const TOA_PENDING: RecordFlags = RecordFlags(1 << 1);
    /// Created under a persistence template.
    pub const PERSISTENT: RecordFlags = RecordFlags(1 << 2);
    /// Spliced by the SYN proxy: the record carries its translation
    /// ([`RecordRepr::synproxy`]). Set with that field, not from the session's flags.
    pub const SYNPROXY: RecordFlags = RecordFlags(1 << 3);
    const KNOWN: u16 =
        Self::NO_OUTPUT.0 | Self::TOA_PENDING.0 | Self::PERSISTENT.0 | Self::SYNPROXY.0;

    pub const fn empty() -> RecordFlags {
        RecordFlags(0)
    }

    pub const fn bits(self) -> u16 {
        self.0
    }

    pub const fn contains(self, other: RecordFlags) -> bool {
        self.0 & other.0 == other.0
    }

    /// The record flags of a session's flags.
    pub fn from_session(flags: SessionFlags) -> RecordFlags {
        let mut bits = 0;
        for (session, record) in Self::PAIRS {
            if flags.contains(session) {
                bits |= record.0;
            }
        }
        RecordFlags(bits)
    }

    /// The session flags these record flags stand for.
    pub fn to_session(self) -> SessionFlags {
        let mut flags = SessionFlags::empty();
        for (session, record) in Self::PAIRS {
            if self.contains(record) {
                flags.insert(session);
            }
        }
        flags
    }

    const PAIRS: [(SessionFlags, RecordFlags); 3] = [
        (SessionFlags::NO_OUTPUT, RecordFlags::NO_OUTPUT),
        (SessionFlags::TOA_PENDING, RecordFlags::TOA_PENDING),
        (SessionFlags::PERSISTENT, RecordFlags::PERSISTENT),
    ];
}

impl core::ops::BitOr for RecordFlags {
    type Output = RecordFlags;
    fn bitor(self, other: RecordFlags) -> RecordFlags {
        RecordFlags(self.0 | other.0)
    }
}

/// IPVS's forwarding-method codes (`IP_VS_CONN_F_MASQ` = 0, `_TUNNEL` = 2,
/// `_DROUTE` = 3) and DPVS's `IP_VS_CONN_F_FULLNAT` = 5.
pub const fn mode_code(mode: ForwardMode) -> u8 {
    match mode {
        ForwardMode::Nat => 0,
        ForwardMode::Tun => 2,
        ForwardMode::Dr => 3,
        ForwardMode::FullNat => 5,
    }
}

/// The mode of an IPVS/DPVS forwarding code, if Sluice has it.
pub const fn mode_from_code(code: u8) -> Option<ForwardMode> {
    match code {
        0 => Some(ForwardMode::Nat),
        2 => Some(ForwardMode::Tun),
        3 => Some(ForwardMode::Dr),
        5 => Some(ForwardMode::FullNat),
        _ => None,
    }
}

/// One record's fields.
///
/// A template record uses the connection fields this way: `client` is the client
/// network (port 0) and `client_prefix_len` its netmask length; `virtual_service`
/// the service; `real_server` where the template sends the network; no local address.
///
/// An IPv6 connection has IPv6 client and virtual addresses (and prefix length 128);
/// it travels as an IPv6 record ([`RECORD6_LEN`]). Its real server and local address
/// are IPv6 too, or IPv4 (NAT64), written IPv4-mapped. An IPv6 service's template
/// (an IPv6 client network, its prefix length up to 128) travels as an IPv6 record
/// too, of kind 4.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RecordRepr {
    pub kind: RecordKind,
    pub op: RecordOp,
    pub proto: Protocol,
    pub mode: ForwardMode,
    /// IPVS TCP state; NONE for UDP and templates.
    pub state: TcpState,
    /// 32 for a connection (one client address), 128 for an IPv6 one; the netmask
    /// length of a template.
    pub client_prefix_len: u8,
    pub flags: RecordFlags,
    pub client: SocketAddr,
    pub virtual_service: SocketAddr,
    pub real_server: SocketAddr,
    /// FullNAT's local address and port; `None` in every other mode.
    pub local: Option<SocketAddr>,
    /// Time left before the entry expires on the sender.
    pub timeout_ms: u32,
    /// A TCP connection's timestamp offset (`Session::timestamp_offset`; FullNAT
    /// sessions whose client sent timestamps); 0 otherwise. The standby must go on
    /// moving the timestamps the same way, or the real server would see the client's
    /// clock jump and drop its segments.
    pub timestamp_offset: u32,
    /// A connection the SYN proxy spliced: how its segments are translated. Without
    /// it the standby would forward the client's acknowledgements of the cookie's
    /// numbers to a server that never sent them.
    pub synproxy: Option<SynproxyDelta>,
}

/// The SYN proxy's translation of one connection, as a record carries it (the
/// dataplane's own form lives with the proxy).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct SynproxyDelta {
    /// Cookie minus the real server's ISN.
    pub seq_delta: u32,
    /// The cookie SYN-ACK's TSval minus the real server's.
    pub ts_delta: u32,
    /// The real server's window scale, when it scales.
    pub server_wscale: Option<u8>,
    /// The client's window scale, when only it scales.
    pub client_wscale: Option<u8>,
}

/// What a record is about: the connection or template a receiver files it under
/// (its client, or client network, and virtual service). Two records with the same
/// subject describe the same entry, the later one newer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RecordSubject {
    pub kind: RecordKind,
    pub proto: Protocol,
    pub client: SocketAddr,
    pub client_prefix_len: u8,
    pub virtual_service: SocketAddr,
}

/// "No window scale" in a record's window-scale byte.
const NO_WSCALE: u8 = 0xff;
/// Largest window scale TCP allows (RFC 7323).
const MAX_WSCALE: u8 = 14;

impl RecordRepr {
    /// The record of a session, which has `timeout_ms` left to live.
    pub fn connection(session: &Session, op: RecordOp, timeout_ms: u32) -> RecordRepr {
        let addr = |ip: u32, port: u16| SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::from(ip), port));
        RecordRepr {
            kind: RecordKind::Connection,
            op,
            proto: session.proto,
            mode: session.mode,
            state: session.state(),
            client_prefix_len: 32,
            flags: RecordFlags::from_session(session.flags()),
            client: addr(session.client_addr, session.client_port),
            virtual_service: addr(session.vip, session.vport),
            real_server: addr(session.real_addr, session.real_port),
            local: (session.mode == ForwardMode::FullNat)
                .then(|| addr(session.local_addr, session.local_port)),
            timeout_ms: timeout_ms.min(MAX_TIMEOUT_MS),
            timestamp_offset: session.timestamp_offset(),
            synproxy: None,
        }
    }

    /// The record of an IPv6 session, which has `timeout_ms` left to live.
    pub fn connection6(session: &Session6, op: RecordOp, timeout_ms: u32) -> RecordRepr {
        let addr = |ip: Ipv6Addr, port: u16| SocketAddr::V6(SocketAddrV6::new(ip, port, 0, 0));
        // NAT64's IPv4 ends, which the session keeps IPv4-mapped, as IPv4 addresses
        // (as a parsed record has them).
        let end = |ip: Ipv6Addr, port: u16| {
            SocketAddr::new(ip.to_ipv4_mapped().map_or(IpAddr::V6(ip), IpAddr::V4), port)
        };
        let mut flags = RecordFlags::empty();
        if session.no_output() {
            flags = flags | RecordFlags::NO_OUTPUT;
        }
        if session.persistent {
            flags = flags | RecordFlags::PERSISTENT;
        }
        RecordRepr {
            kind: RecordKind::Connection,
            op,
            proto: session.proto,
            mode: session.mode,
            state: session.state(),
            client_prefix_len: 128,
            flags,
            client: addr(session.client, session.client_port),
            virtual_service: addr(session.vip, session.vport),
            real_server: end(session.real_addr, session.real_port),
            // FullNAT's and NAT64's local end (an IPv4 one for NAT64).
            local: (session.mode == ForwardMode::FullNat)
                .then(|| end(session.local_addr, session.local_port)),
            timeout_ms: timeout_ms.min(MAX_TIMEOUT_MS),
            timestamp_offset: 0,
            synproxy: None,
        }
    }

    /// Whether this is an IPv6 record (its client is an IPv6 address).
    pub fn is_ipv6(&self) -> bool {
        self.client.is_ipv6()
    }

    /// Bytes the record takes in a message.
    pub fn wire_len(&self) -> usize {
        if self.is_ipv6() {
            RECORD6_LEN
        } else {
            RECORD_LEN
        }
    }

    /// The record of a persistence template: `network/prefix_len` of service
    /// `proto virtual_service` goes to `real_server` (in `mode`) for `timeout_ms` more.
    #[allow(clippy::too_many_arguments)]
    pub fn template(
        op: RecordOp,
        proto: Protocol,
        virtual_service: SocketAddrV4,
        network: Ipv4Addr,
        prefix_len: u8,
        real_server: SocketAddrV4,
        mode: ForwardMode,
        timeout_ms: u32,
    ) -> RecordRepr {
        RecordRepr {
            kind: RecordKind::Template,
            op,
            proto,
            mode,
            state: TcpState::None,
            client_prefix_len: prefix_len,
            flags: RecordFlags::empty(),
            client: SocketAddr::V4(SocketAddrV4::new(network, 0)),
            virtual_service: SocketAddr::V4(virtual_service),
            real_server: SocketAddr::V4(real_server),
            local: None,
            timeout_ms: timeout_ms.min(MAX_TIMEOUT_MS),
            timestamp_offset: 0,
            synproxy: None,
        }
    }

    /// The record of an IPv6 service's persistence template: `network/prefix_len` of
    /// service `proto virtual_service` goes to `real_server` (IPv6, or IPv4 behind
    /// NAT64) in `mode` for `timeout_ms` more. Travels as an IPv6 record (kind 4).
    #[allow(clippy::too_many_arguments)]
    pub fn template6(
        op: RecordOp,
        proto: Protocol,
        virtual_service: SocketAddrV6,
        network: Ipv6Addr,
        prefix_len: u8,
        real_server: SocketAddr,
        mode: ForwardMode,
        timeout_ms: u32,
    ) -> RecordRepr {
        RecordRepr {
            kind: RecordKind::Template,
            op,
            proto,
            mode,
            state: TcpState::None,
            client_prefix_len: prefix_len,
            flags: RecordFlags::empty(),
            client: SocketAddr::V6(SocketAddrV6::new(network, 0, 0, 0)),
            virtual_service: SocketAddr::V6(virtual_service),
            real_server,
            local: None,
            timeout_ms: timeout_ms.min(MAX_TIMEOUT_MS),
            timestamp_offset: 0,
            synproxy: None,
        }
    }

    /// The entry this record describes.
    pub fn subject(&self) -> RecordSubject {
        RecordSubject {
            kind: self.kind,
            proto: self.proto,
            client: self.client,
            client_prefix_len: self.client_prefix_len,
            virtual_service: self.virtual_service,
        }
    }

    /// The client-side key (client -> VIP:port) of an IPv4 record; `None` for an
    /// IPv6 one.
    pub fn in_key(&self) -> Option<FlowKey4> {
        match (self.client, self.virtual_service) {
            (SocketAddr::V4(c), SocketAddr::V4(v)) => Some(FlowKey4::new(
                self.proto,
                *c.ip(),
                c.port(),
                *v.ip(),
                v.port(),
            )),
            _ => None,
        }
    }

    /// The client-side key (client -> VIP:port) of an IPv6 record; `None` for an
    /// IPv4 one.
    pub fn in_key6(&self) -> Option<FlowKey6> {
        match (self.client, self.virtual_service) {
            (SocketAddr::V6(c), SocketAddr::V6(v)) => Some(FlowKey6 {
                src: *c.ip(),
                dst: *v.ip(),
                sport: c.port(),
                dport: v.port(),
                proto: self.proto,
            }),
            _ => None,
        }
    }

    /// The session an IPv4 connection record describes, under the receiver's own
    /// service and real-server numbering; `None` for a template or an IPv6 record.
    pub fn to_session(&self, service: u32, real: u32) -> Option<Session> {
        if self.kind != RecordKind::Connection {
            return None;
        }
        let SocketAddr::V4(rs) = self.real_server else {
            return None;
        };
        let mut session = Session::new(
            &self.in_key()?,
            self.mode,
            service,
            real,
            *rs.ip(),
            rs.port(),
        );
        match self.local {
            Some(SocketAddr::V4(local)) => {
                session = session.with_local(*local.ip(), local.port());
            }
            Some(SocketAddr::V6(_)) => return None,
            None => {}
        }
        session.set_state(self.state);
        // Session::new sets NO_OUTPUT for DR/TUN; the record says whether it still holds.
        session.clear_flags(SessionFlags::NO_OUTPUT);
        session.set_flags(self.flags.to_session());
        Some(session)
    }

    /// The IPv6 session an IPv6 connection record describes, under the receiver's own
    /// numbering: DR, TUN or NAT to an IPv6 real server, FullNAT with an IPv6 local
    /// address and port to one, or NAT64 (FullNAT with an IPv4 local address and port
    /// to an IPv4 real server, kept IPv4-mapped as the data plane keeps them). `None`
    /// for anything else (a template, an IPv4 record, mixed families).
    pub fn to_session6(&self, service: u32, real: u32) -> Option<Session6> {
        if self.kind != RecordKind::Connection {
            return None;
        }
        let v6 = |a: IpAddr| match a {
            IpAddr::V6(a) => a,
            IpAddr::V4(a) => a.to_ipv6_mapped(),
        };
        let (real_addr, local) = match (self.mode, self.real_server, self.local) {
            (ForwardMode::FullNat, SocketAddr::V6(_), Some(SocketAddr::V6(_)))
            | (ForwardMode::FullNat, SocketAddr::V4(_), Some(SocketAddr::V4(_))) => {
                (v6(self.real_server.ip()), self.local)
            }
            (ForwardMode::FullNat, _, _) => return None,
            (_, SocketAddr::V6(rs), None) => (*rs.ip(), None),
            _ => return None,
        };
        let mut session = Session6::new(
            &self.in_key6()?,
            self.mode,
            service,
            real,
            real_addr,
            self.real_server.port(),
        );
        if let Some(local) = local {
            (session.local_addr, session.local_port) = (v6(local.ip()), local.port());
        }
        session.persistent = self.flags.contains(RecordFlags::PERSISTENT);
        Some(session.synced(self.state, self.flags.contains(RecordFlags::NO_OUTPUT)))
    }

    /// Parses and validates one record; the fault names the first bad field.
    pub fn parse<T: AsRef<[u8]>>(record: &Record<T>) -> Result<RecordRepr, RecordFault> {
        if matches!(record.kind(), KIND_CONNECTION6 | KIND_TEMPLATE6) {
            return Self::parse6(record.buffer.as_ref());
        }
        if record.buffer.as_ref().len() < RECORD_LEN {
            return Err(RecordFault::Kind);
        }
        let kind = match record.kind() {
            1 => RecordKind::Connection,
            2 => RecordKind::Template,
            _ => return Err(RecordFault::Kind),
        };
        let op = match record.op() {
            1 => RecordOp::Update,
            2 => RecordOp::Remove,
            _ => return Err(RecordFault::Op),
        };
        let proto = Protocol::from_ip_protocol(record.protocol()).ok_or(RecordFault::Protocol)?;
        let mode = mode_from_code(record.mode()).ok_or(RecordFault::Mode)?;
        let state = TcpState::from_u8(record.state()).ok_or(RecordFault::State)?;
        let stateless = proto == Protocol::Udp || kind == RecordKind::Template;
        if stateless && state != TcpState::None {
            return Err(RecordFault::State);
        }
        let prefix_len = record.prefix_len();
        match kind {
            RecordKind::Connection if prefix_len != 32 => return Err(RecordFault::PrefixLen),
            RecordKind::Template => {
                let host_bits = u32::MAX.checked_shr(prefix_len as u32).unwrap_or(0);
                if prefix_len > 32 || u32::from(record.client_addr()) & host_bits != 0 {
                    return Err(RecordFault::PrefixLen);
                }
            }
            _ => {}
        }
        let flags = record.flags();
        if flags & !RecordFlags::KNOWN != 0 || (kind == RecordKind::Template && flags != 0) {
            return Err(RecordFault::Flags);
        }
        let has_local = u32::from(record.local_addr()) != 0 || record.local_port() != 0;
        let wants_local = kind == RecordKind::Connection && mode == ForwardMode::FullNat;
        let local_complete = u32::from(record.local_addr()) != 0 && record.local_port() != 0;
        if (wants_local && !local_complete) || (!wants_local && has_local) {
            return Err(RecordFault::Local);
        }
        if kind == RecordKind::Template && record.client_port() != 0 {
            return Err(RecordFault::TemplatePort);
        }
        if record.timeout_ms() > MAX_TIMEOUT_MS {
            return Err(RecordFault::Timeout);
        }
        let tcp_connection = kind == RecordKind::Connection && proto == Protocol::Tcp;
        if record.timestamp_offset() != 0 && !tcp_connection {
            return Err(RecordFault::TimestampOffset);
        }
        let synproxy = record.synproxy(flags & RecordFlags::SYNPROXY.0 != 0)?;
        if synproxy.is_some()
            && !(tcp_connection && matches!(mode, ForwardMode::Nat | ForwardMode::FullNat))
        {
            return Err(RecordFault::Synproxy);
        }
        Ok(RecordRepr {
            kind,
            op,
            proto,
            mode,
            state,
            client_prefix_len: prefix_len,
            // SYNPROXY stands for `synproxy`, which `emit` writes it from.
            flags: RecordFlags(flags & !RecordFlags::SYNPROXY.0),
            client: SocketAddrV4::new(record.client_addr(), record.client_port()).into(),
            virtual_service: SocketAddrV4::new(record.virtual_addr(), record.virtual_port()).into(),
            real_server: SocketAddrV4::new(record.real_addr(), record.real_port()).into(),
            local: wants_local
                .then(|| SocketAddrV4::new(record.local_addr(), record.local_port()).into()),
            timeout_ms: record.timeout_ms(),
            timestamp_offset: record.timestamp_offset(),
            synproxy,
        })
    }

    pub fn buffer_len(&self) -> usize {
        self.wire_len()
    }

    /// Parses and validates an IPv6 record: a connection (kind 3) or a persistence
    /// template (kind 4). Its fields other than the addresses are those of an IPv4
    /// record, with the same rules; a connection's prefix length is 128, a template's
    /// at most 128 with no host bits set in its network, and the client and virtual
    /// addresses are not IPv4-mapped.
    fn parse6(b: &[u8]) -> Result<RecordRepr, RecordFault> {
        if b.len() < RECORD6_LEN {
            return Err(RecordFault::Kind);
        }
        let kind = match b[field::KIND] {
            KIND_CONNECTION6 => RecordKind::Connection,
            KIND_TEMPLATE6 => RecordKind::Template,
            _ => return Err(RecordFault::Kind),
        };
        let template = kind == RecordKind::Template;
        // The fields but the addresses, where an IPv4 record has them.
        let mut rest = [0u8; RECORD_LEN];
        rest[..field::CLIENT_ADDR].copy_from_slice(&b[..field6::CLIENT_ADDR]);
        rest[field::CLIENT_PORT..].copy_from_slice(&b[field6::PORTS..RECORD6_LEN]);
        let r = Record::new_unchecked(&rest[..]);
        let op = match r.op() {
            1 => RecordOp::Update,
            2 => RecordOp::Remove,
            _ => return Err(RecordFault::Op),
        };
        let proto = Protocol::from_ip_protocol(r.protocol()).ok_or(RecordFault::Protocol)?;
        let mode = mode_from_code(r.mode()).ok_or(RecordFault::Mode)?;
        let state = TcpState::from_u8(r.state()).ok_or(RecordFault::State)?;
        if (proto == Protocol::Udp || template) && state != TcpState::None {
            return Err(RecordFault::State);
        }
        let addr = |at: usize| {
            let mut octets = [0u8; 16];
            octets.copy_from_slice(&b[at..at + 16]);
            Ipv6Addr::from(octets)
        };
        let (client, vip) = (addr(field6::CLIENT_ADDR), addr(field6::VIRTUAL_ADDR));
        let prefix_len = r.prefix_len();
        let host_bits = u128::MAX.checked_shr(u32::from(prefix_len)).unwrap_or(0);
        let prefix_ok = match kind {
            RecordKind::Connection => prefix_len == 128,
            RecordKind::Template => prefix_len <= 128 && u128::from(client) & host_bits == 0,
        };
        if !prefix_ok {
            return Err(RecordFault::PrefixLen);
        }
        let flags = r.flags();
        if flags & !RecordFlags::KNOWN != 0 || (template && flags != 0) {
            return Err(RecordFault::Flags);
        }
        // An IPv4-mapped template network is as wrong as a mapped client: an IPv4
        // client's template travels in an IPv4 record.
        if client.to_ipv4_mapped().is_some() || vip.to_ipv4_mapped().is_some() {
            return Err(RecordFault::Address);
        }
        // A translated connection's IPv4 real server or local address, IPv4-mapped.
        let ip = |a: Ipv6Addr| a.to_ipv4_mapped().map_or(IpAddr::V6(a), IpAddr::V4);
        let local = addr(field6::LOCAL_ADDR);
        let has_local = !local.is_unspecified() || r.local_port() != 0;
        let wants_local = !template && mode == ForwardMode::FullNat;
        let local_complete = !local.is_unspecified() && r.local_port() != 0;
        if (wants_local && !local_complete) || (!wants_local && has_local) {
            return Err(RecordFault::Local);
        }
        if template && r.client_port() != 0 {
            return Err(RecordFault::TemplatePort);
        }
        if r.timeout_ms() > MAX_TIMEOUT_MS {
            return Err(RecordFault::Timeout);
        }
        let tcp = !template && proto == Protocol::Tcp;
        if r.timestamp_offset() != 0 && !tcp {
            return Err(RecordFault::TimestampOffset);
        }
        let synproxy = r.synproxy(flags & RecordFlags::SYNPROXY.0 != 0)?;
        if synproxy.is_some() && !(tcp && matches!(mode, ForwardMode::Nat | ForwardMode::FullNat)) {
            return Err(RecordFault::Synproxy);
        }
        Ok(RecordRepr {
            kind,
            op,
            proto,
            mode,
            state,
            client_prefix_len: prefix_len,
            flags: RecordFlags(flags & !RecordFlags::SYNPROXY.0),
            client: SocketAddr::V6(SocketAddrV6::new(client, r.client_port(), 0, 0)),
            virtual_service: SocketAddr::V6(SocketAddrV6::new(vip, r.virtual_port(), 0, 0)),
            real_server: SocketAddr::new(ip(addr(field6::REAL_ADDR)), r.real_port()),
            local: wants_local.then(|| SocketAddr::new(ip(local), r.local_port())),
            timeout_ms: r.timeout_ms(),
            timestamp_offset: r.timestamp_offset(),
            synproxy,
        })
    }

    /// Writes the IPv6 record into `b` ([`RECORD6_LEN`] bytes): the fields but the
    /// addresses as an IPv4 record has them, the addresses 16 bytes each (an IPv4
    /// one IPv4-mapped).
    fn emit6(&self, b: &mut [u8]) {
        let port_only =
            |a: SocketAddr| SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, a.port()));
        let shape = RecordRepr {
            client: port_only(self.client),
            virtual_service: port_only(self.virtual_service),
            real_server: port_only(self.real_server),
            local: self.local.map(port_only),
            ..*self
        };
        let mut rest = [0u8; RECORD_LEN];
        shape.emit(&mut Record::new_unchecked(&mut rest[..]));
        let b = &mut b[..RECORD6_LEN];
        b.fill(0);
        b[..field6::CLIENT_ADDR].copy_from_slice(&rest[..field::CLIENT_ADDR]);
        b[field6::PORTS..].copy_from_slice(&rest[field::CLIENT_PORT..]);
        b[field::KIND] = match self.kind {
            RecordKind::Connection => KIND_CONNECTION6,
            RecordKind::Template => KIND_TEMPLATE6,
        };
        let v6 = |a: IpAddr| match a {
            IpAddr::V6(a) => a,
            IpAddr::V4(a) => a.to_ipv6_mapped(),
        };
        let addresses = [
            (field6::CLIENT_ADDR, Some(self.client)),
            (field6::VIRTUAL_ADDR, Some(self.virtual_service)),
            (field6::REAL_ADDR, Some(self.real_server)),
            (field6::LOCAL_ADDR, self.local),
        ];
        for (at, a) in addresses.into_iter().filter_map(|(at, a)| Some((at, a?))) {
            b[at..at + 16].copy_from_slice(&v6(a.ip()).octets());
        }
    }

    /// Writes the whole record (absent fields as zero): an IPv4 record, or an IPv6 one
    /// when the client is IPv6 (the record's buffer must be [`Self::wire_len`] long).
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, record: &mut Record<T>) {
        if self.is_ipv6() {
            return self.emit6(record.buffer.as_mut());
        }
        let v4 = |a: SocketAddr| match a {
            SocketAddr::V4(a) => a,
            // Not an IPv4 connection's address: the IPv4 layout has no room for it.
            SocketAddr::V6(a) => SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, a.port()),
        };
        record.clear();
        record.set_byte(field::KIND, self.kind as u8);
        record.set_byte(field::OP, self.op as u8);
        record.set_byte(field::PROTOCOL, self.proto as u8);
        record.set_byte(field::MODE, mode_code(self.mode));
        record.set_byte(field::STATE, self.state as u8);
        record.set_byte(field::PREFIX_LEN, self.client_prefix_len);
        let mut flags = self.flags.0 & !RecordFlags::SYNPROXY.0;
        if self.synproxy.is_some() {
            flags |= RecordFlags::SYNPROXY.0;
        }
        write_u16(record.buffer.as_mut(), field::RECORD_FLAGS, flags);
        let (client, vs, rs) = (
            v4(self.client),
            v4(self.virtual_service),
            v4(self.real_server),
        );
        record.set_addr(field::CLIENT_ADDR, *client.ip());
        record.set_port(field::CLIENT_PORT, client.port());
        record.set_addr(field::VIRTUAL_ADDR, *vs.ip());
        record.set_port(field::VIRTUAL_PORT, vs.port());
        record.set_addr(field::REAL_ADDR, *rs.ip());
        record.set_port(field::REAL_PORT, rs.port());
        if let Some(local) = self.local.map(v4) {
            record.set_addr(field::LOCAL_ADDR, *local.ip());
            record.set_port(field::LOCAL_PORT, local.port());
        }
        write_u32(record.buffer.as_mut(), field::TIMEOUT_MS, self.timeout_ms);
        write_u32(
            record.buffer.as_mut(),
            field::TIMESTAMP_OFFSET,
            self.timestamp_offset,
        );
        if let Some(d) = self.synproxy {
            let buf = record.buffer.as_mut();
            write_u32(buf, field::SYNPROXY_SEQ_DELTA, d.seq_delta);
            write_u32(buf, field::SYNPROXY_TS_DELTA, d.ts_delta);
            buf[field::SYNPROXY_SERVER_WSCALE] = d.server_wscale.unwrap_or(NO_WSCALE);
            buf[field::SYNPROXY_CLIENT_WSCALE] = d.client_wscale.unwrap_or(NO_WSCALE);
        }
    }
}

/// The room ran out: the record does not fit in what the MTU leaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MessageFull;

/// Fills one message in a caller's buffer, record by record, up to what the MTU
/// allows; [`MessageBuilder::finish`] writes the header (and, with a key, the trailer).
pub struct MessageBuilder<'a> {
    buffer: &'a mut [u8],
    header: MessageRepr,
    /// Bytes of records the message may hold.
    room: usize,
    /// Bytes of records written.
    used: usize,
}

impl<'a> MessageBuilder<'a> {
    /// A message of `header`'s type and ids (its `count` and the AUTHENTICATED flag
    /// are set by `finish`), holding as many records as fit in `mtu` and in `buffer`.
    pub fn new(buffer: &'a mut [u8], header: MessageRepr, mtu: u16, authenticated: bool) -> Self {
        let fixed = message_len(0, authenticated);
        let room = if header.message_type == MessageType::ResyncRequest {
            0
        } else {
            (mtu as usize)
                .saturating_sub(fixed + IPV4_UDP_OVERHEAD)
                .min(buffer.len().saturating_sub(fixed))
        };
        let mut header = header;
        header.count = 0;
        header.flags.set(MessageFlags::AUTHENTICATED, authenticated);
        MessageBuilder {
            buffer,
            header,
            room,
            used: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.header.count as usize
    }

    pub fn is_empty(&self) -> bool {
        self.header.count == 0
    }

    /// Whether not even an IPv4 record fits any more.
    pub fn is_full(&self) -> bool {
        self.room - self.used < RECORD_LEN
    }

    /// IPv4 records an empty message of this builder holds (fewer IPv6 ones fit).
    pub fn capacity(&self) -> usize {
        self.room / RECORD_LEN
    }

    /// Marks the message the last chunk of its dump.
    pub fn set_last_chunk(&mut self) {
        self.header.flags.set(MessageFlags::LAST_CHUNK, true);
    }

    /// Appends a record, or says it does not fit.
    pub fn push(&mut self, record: &RecordRepr) -> Result<(), MessageFull> {
        let len = record.wire_len();
        if self.room - self.used < len {
            return Err(MessageFull);
        }
        let at = HEADER_LEN + self.used;
        record.emit(&mut Record::new_unchecked(&mut self.buffer[at..at + len]));
        self.used += len;
        self.header.count += 1;
        Ok(())
    }

    /// Writes the header and returns the message (header, records, and the room for
    /// the trailer when authenticated: see `sync::auth::seal`).
    pub fn finish(self) -> &'a mut [u8] {
        let trailer = if self.header.flags.contains(MessageFlags::AUTHENTICATED) {
            HMAC_LEN
        } else {
            0
        };
        let len = HEADER_LEN + self.used + trailer;
        let mut packet = Packet::new_unchecked(&mut *self.buffer);
        self.header.emit(&mut packet);
        // The records' own lengths (IPv6 ones are longer), not `count` IPv4 ones.
        packet.set_len((HEADER_LEN + self.used) as u16);
        &mut self.buffer[..len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::test_util::XorShift;

    const CLIENT: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 7);
    const VIP: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 10);
    const RS: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 21);
    const LIP: Ipv4Addr = Ipv4Addr::new(10, 1, 255, 1);

    /// A batch from node 0x0a0b0c0d, epoch 0x0006_2a1b_0000_0001, sequence 7, with one
    /// FullNAT TCP connection, ESTABLISHED, TOA pending, spliced by the SYN proxy,
    /// 899.5 s left. Written out by hand from the layout table in docs/SYNC.md.
    #[rustfmt::skip]
    static FULLNAT_BATCH: [u8; 96] = [
        // magic "SLSY", version 6, type 1 (batch), flags 0
        0x53, 0x4c, 0x53, 0x59, 0x06, 0x01, 0x00, 0x00,
        // length 96, count 1, sender 0x0a0b0c0d
        0x00, 0x60, 0x00, 0x01, 0x0a, 0x0b, 0x0c, 0x0d,
        // recipient 0.0.0.0 (every peer), dump id 0
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        // chunk 0, epoch (high half)
        0x00, 0x00, 0x00, 0x00, 0x00, 0x06, 0x2a, 0x1b,
        // epoch (low half), sequence (high half)
        0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00,
        // sequence (low half): 7
        0x00, 0x00, 0x00, 0x07,
        // record: connection, update, TCP, FullNAT (5), ESTABLISHED, /32,
        // flags TOA_PENDING | SYNPROXY
        0x01, 0x01, 0x06, 0x05, 0x01, 0x20, 0x00, 0x0a,
        // client 198.51.100.7, VIP 203.0.113.10
        0xc6, 0x33, 0x64, 0x07, 0xcb, 0x00, 0x71, 0x0a,
        // real 10.1.0.21, local 10.1.255.1
        0x0a, 0x01, 0x00, 0x15, 0x0a, 0x01, 0xff, 0x01,
        // cport 40000, vport 443, rport 8443, lport 5000
        0x9c, 0x40, 0x01, 0xbb, 0x20, 0xfb, 0x13, 0x88,
        // timeout 899 500 ms
        0x00, 0x0d, 0xb9, 0xac,
        // timestamp offset 0x80001234
        0x80, 0x00, 0x12, 0x34,
        // SYN proxy: sequence delta 0x11223344, timestamp delta 0x55667788
        0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88,
        // server window scale 7, client window scale none, reserved
        0x07, 0xff, 0x00, 0x00,
    ];

    /// A batch from the same node, sequence 8, with one IPv6 DR TCP connection,
    /// ESTABLISHED, its real server not heard yet (NO_OUTPUT), 899.5 s left: client
    /// [2001:db8:2::9]:40000, VIP [2001:db8::1]:80, real server [2001:db8:1::2]:80.
    /// Written out by hand from the IPv6 record's table in docs/SYNC.md.
    #[rustfmt::skip]
    static IPV6_BATCH: [u8; 144] = [
        // magic "SLSY", version 6, type 1 (batch), flags 0
        0x53, 0x4c, 0x53, 0x59, 0x06, 0x01, 0x00, 0x00,
        // length 144, count 1, sender 0x0a0b0c0d
        0x00, 0x90, 0x00, 0x01, 0x0a, 0x0b, 0x0c, 0x0d,
        // recipient 0.0.0.0 (every peer), dump id 0
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        // chunk 0, epoch (high half)
        0x00, 0x00, 0x00, 0x00, 0x00, 0x06, 0x2a, 0x1b,
        // epoch (low half), sequence (high half)
        0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00,
        // sequence (low half): 8
        0x00, 0x00, 0x00, 0x08,
        // record: IPv6 connection (3), update, TCP, DR (3), ESTABLISHED, /128,
        // flags NO_OUTPUT
        0x03, 0x01, 0x06, 0x03, 0x01, 0x80, 0x00, 0x01,
        // client 2001:db8:2::9
        0x20, 0x01, 0x0d, 0xb8, 0x00, 0x02, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x09,
        // VIP 2001:db8::1
        0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01,
        // real server 2001:db8:1::2
        0x20, 0x01, 0x0d, 0xb8, 0x00, 0x01, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02,
        // local address: none
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        // cport 40000, vport 80, rport 80, lport 0
        0x9c, 0x40, 0x00, 0x50, 0x00, 0x50, 0x00, 0x00,
        // timeout 899 500 ms, timestamp offset 0
        0x00, 0x0d, 0xb9, 0xac, 0x00, 0x00, 0x00, 0x00,
        // SYN proxy: none; window scales, reserved
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
    ];

    fn ipv6_record() -> RecordRepr {
        let v6 = |a: &str, port| SocketAddr::new(a.parse().unwrap(), port);
        RecordRepr {
            kind: RecordKind::Connection,
            op: RecordOp::Update,
            proto: Protocol::Tcp,
            mode: ForwardMode::Dr,
            state: TcpState::Established,
            client_prefix_len: 128,
            flags: RecordFlags::NO_OUTPUT,
            client: v6("2001:db8:2::9", 40000),
            virtual_service: v6("2001:db8::1", 80),
            real_server: v6("2001:db8:1::2", 80),
            local: None,
            timeout_ms: 899_500,
            timestamp_offset: 0,
            synproxy: None,
        }
    }

    #[test]
    fn ipv6_batch_parses_and_emits_byte_for_byte() {
        let header = MessageRepr {
            sequence: 8,
            ..batch_header()
        };
        let packet = Packet::new_checked(&IPV6_BATCH[..]).unwrap();
        assert_eq!(MessageRepr::parse(&packet).unwrap(), header);
        assert_eq!(records_of(&IPV6_BATCH).unwrap(), [ipv6_record()]);
        let mut buf = [0u8; 1500];
        let mut builder = MessageBuilder::new(&mut buf, header, 1500, false);
        builder.push(&ipv6_record()).unwrap();
        assert_eq!(builder.finish(), &IPV6_BATCH[..]);

        // The session it stands for, and back.
        let key = ipv6_record().in_key6().unwrap();
        let real = "2001:db8:1::2".parse().unwrap();
        let session = Session6::new(&key, ForwardMode::Dr, 3, 4, real, 80)
            .synced(TcpState::Established, true);
        assert_eq!(ipv6_record().to_session6(3, 4), Some(session));
        assert_eq!(ipv6_record().to_session(3, 4), None, "not an IPv4 session");
        assert_eq!(ipv6_record().in_key(), None);
        let again = RecordRepr::connection6(&session, RecordOp::Update, 899_500);
        assert_eq!(again, ipv6_record());
    }

    /// IPv4 and IPv6 records in one message: each as long as its kind says. A kind
    /// byte changed between them cannot make one read as the other: the lengths no
    /// longer add up.
    #[test]
    fn ipv4_and_ipv6_records_share_a_message() {
        let mut buf = [0u8; 1500];
        let mut builder = MessageBuilder::new(&mut buf, batch_header(), 1500, false);
        for r in [fullnat_record(), ipv6_record(), fullnat_record()] {
            builder.push(&r).unwrap();
        }
        let message = builder.finish().to_vec();
        assert_eq!(message.len(), HEADER_LEN + 2 * RECORD_LEN + RECORD6_LEN);
        assert_eq!(
            records_of(&message).unwrap(),
            [fullnat_record(), ipv6_record(), fullnat_record()]
        );
        let packet = Packet::new_checked(&message[..]).unwrap();
        assert_eq!(packet.record(1).kind(), 3);
        assert_eq!(packet.record(2).local_port(), 5000);
        // The IPv6 record's kind made IPv4, or the first IPv4 one's made IPv6: the
        // next record then starts inside another, at a zero byte, no kind.
        for (at, kind, error) in [
            (
                HEADER_LEN + RECORD_LEN,
                1u8,
                SyncWireError::BadRecord {
                    index: 2,
                    fault: RecordFault::Kind,
                },
            ),
            (
                HEADER_LEN,
                3,
                SyncWireError::BadRecord {
                    index: 1,
                    fault: RecordFault::Kind,
                },
            ),
        ] {
            let mut bad = message.clone();
            bad[at] = kind;
            assert_eq!(records_of(&bad), Err(error), "{at}");
        }
        // An IPv6 record's fields checked: its prefix, a mapped client, a local
        // address outside FullNAT.
        let at = HEADER_LEN;
        for (offset, value, fault) in [
            (at + 5, 32u8, RecordFault::PrefixLen),
            (at + 18, 0xff, RecordFault::Address),
            (at + 71, 1, RecordFault::Local),
            (at + 1, 9, RecordFault::Op),
            (at + 80, 0xff, RecordFault::Timeout),
        ] {
            let mut bad = IPV6_BATCH;
            if fault == RecordFault::Address {
                // ::ffff:0.0.0.9, an IPv4-mapped client.
                bad[at + 8..at + 18].fill(0);
                bad[at + 19] = 0xff;
            }
            bad[offset] = value;
            assert_eq!(
                records_of(&bad),
                Err(SyncWireError::BadRecord { index: 0, fault }),
                "byte {offset} = {value:#x}"
            );
        }
        // Too little room in the message for an IPv6 record: refused by the builder.
        let mut small = [0u8; HEADER_LEN + RECORD6_LEN - 1];
        let mut builder = MessageBuilder::new(&mut small, batch_header(), 1500, false);
        assert_eq!(builder.push(&ipv6_record()), Err(MessageFull));
        builder.push(&fullnat_record()).unwrap();
    }

    /// A batch from the same node, sequence 9, with one IPv6 persistence template:
    /// TCP service [2001:db8::1]:80, client network 2001:db8:2::/64 to NAT real
    /// server [2001:db8:1::2]:8080, 300 s left. Written out by hand from the IPv6
    /// record's table in docs/SYNC.md (kind 4).
    #[rustfmt::skip]
    static IPV6_TEMPLATE_BATCH: [u8; 144] = [
        // magic "SLSY", version 6, type 1 (batch), flags 0
        0x53, 0x4c, 0x53, 0x59, 0x06, 0x01, 0x00, 0x00,
        // length 144, count 1, sender 0x0a0b0c0d
        0x00, 0x90, 0x00, 0x01, 0x0a, 0x0b, 0x0c, 0x0d,
        // recipient 0.0.0.0 (every peer), dump id 0
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        // chunk 0, epoch (high half)
        0x00, 0x00, 0x00, 0x00, 0x00, 0x06, 0x2a, 0x1b,
        // epoch (low half), sequence (high half)
        0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00,
        // sequence (low half): 9
        0x00, 0x00, 0x00, 0x09,
        // record: IPv6 template (4), update, TCP, NAT (0), state NONE, /64, no flags
        0x04, 0x01, 0x06, 0x00, 0x00, 0x40, 0x00, 0x00,
        // client network 2001:db8:2::
        0x20, 0x01, 0x0d, 0xb8, 0x00, 0x02, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        // VIP 2001:db8::1
        0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01,
        // real server 2001:db8:1::2
        0x20, 0x01, 0x0d, 0xb8, 0x00, 0x01, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02,
        // local address: none
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        // cport 0, vport 80, rport 8080, lport 0
        0x00, 0x00, 0x00, 0x50, 0x1f, 0x90, 0x00, 0x00,
        // timeout 300 000 ms, timestamp offset 0
        0x00, 0x04, 0x93, 0xe0, 0x00, 0x00, 0x00, 0x00,
        // SYN proxy: none; window scales, reserved
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
    ];

    fn ipv6_template() -> RecordRepr {
        RecordRepr::template6(
            RecordOp::Update,
            Protocol::Tcp,
            "[2001:db8::1]:80".parse().unwrap(),
            "2001:db8:2::".parse().unwrap(),
            64,
            "[2001:db8:1::2]:8080".parse().unwrap(),
            ForwardMode::Nat,
            300_000,
        )
    }

    #[test]
    fn ipv6_template_parses_and_emits_byte_for_byte() {
        let header = MessageRepr {
            sequence: 9,
            ..batch_header()
        };
        let packet = Packet::new_checked(&IPV6_TEMPLATE_BATCH[..]).unwrap();
        assert_eq!(MessageRepr::parse(&packet).unwrap(), header);
        assert_eq!(packet.record(0).kind(), 4);
        assert_eq!(records_of(&IPV6_TEMPLATE_BATCH).unwrap(), [ipv6_template()]);
        let mut buf = [0u8; 1500];
        let mut builder = MessageBuilder::new(&mut buf, header, 1500, false);
        builder.push(&ipv6_template()).unwrap();
        assert_eq!(builder.finish(), &IPV6_TEMPLATE_BATCH[..]);
        assert_eq!(ipv6_template().to_session6(1, 2), None, "not a session");
        // NAT64: an IPv4 real server, IPv4-mapped on the wire.
        let mut nat64 = ipv6_template();
        nat64.mode = ForwardMode::FullNat;
        nat64.real_server = "10.1.0.21:8080".parse().unwrap();
        let mut buf = [0u8; 1500];
        let mut builder = MessageBuilder::new(&mut buf, header, 1500, false);
        builder.push(&nat64).unwrap();
        let message = builder.finish().to_vec();
        let at = HEADER_LEN + 40;
        assert_eq!(
            message[at..at + 16],
            Ipv4Addr::new(10, 1, 0, 21).to_ipv6_mapped().octets()
        );
        assert_eq!(records_of(&message).unwrap(), [nat64]);
    }

    /// Every field of an IPv6 template a receiver refuses, by the fault it names; a
    /// truncated one is refused as a whole message; an IPv6 template in a
    /// version 5 message is another version's.
    #[test]
    fn bad_ipv6_templates_are_refused() {
        let at = HEADER_LEN;
        let bad = |offset: usize, value: u8| {
            let mut b = IPV6_TEMPLATE_BATCH;
            b[offset] = value;
            records_of(&b)
        };
        for (offset, value, fault) in [
            (at + 1, 0u8, RecordFault::Op),
            (at + 2, 1, RecordFault::Protocol),
            (at + 3, 9, RecordFault::Mode),
            (at + 4, 1, RecordFault::State),
            (at + 5, 129, RecordFault::PrefixLen),
            // A host bit past /64.
            (at + 8 + 15, 1, RecordFault::PrefixLen),
            (at + 7, 1, RecordFault::Flags),
            (at + 6, 0x80, RecordFault::Flags),
            (at + 56, 0x20, RecordFault::Local),
            (at + 79, 1, RecordFault::Local),
            (at + 72, 1, RecordFault::TemplatePort),
            (at + 80, 0xff, RecordFault::Timeout),
            (at + 87, 1, RecordFault::TimestampOffset),
            (at + 88, 1, RecordFault::Synproxy),
        ] {
            assert_eq!(
                bad(offset, value),
                Err(SyncWireError::BadRecord { index: 0, fault }),
                "byte {offset} = {value:#x}"
            );
        }
        // An IPv4-mapped network (::ffff:0.0.0.0/96): an IPv4 client's template
        // travels in an IPv4 record.
        let mut mapped = IPV6_TEMPLATE_BATCH;
        mapped[at + 5] = 96;
        mapped[at + 8..at + 24].fill(0);
        mapped[at + 18..at + 20].fill(0xff);
        assert_eq!(
            records_of(&mapped),
            Err(SyncWireError::BadRecord {
                index: 0,
                fault: RecordFault::Address
            })
        );
        // /0 with no network bits is fine, as for IPv4.
        let mut everyone = IPV6_TEMPLATE_BATCH;
        everyone[at + 5] = 0;
        everyone[at + 8..at + 24].fill(0);
        assert_eq!(records_of(&everyone).unwrap()[0].client_prefix_len, 0);
        // Cut short anywhere: the whole message is refused.
        for len in 0..IPV6_TEMPLATE_BATCH.len() {
            assert!(
                Packet::new_checked(&IPV6_TEMPLATE_BATCH[..len]).is_err(),
                "{len} bytes"
            );
        }
        // An IPv6 template record's length said with an IPv4 record's: the kind's
        // length no longer adds up.
        let mut short = IPV6_TEMPLATE_BATCH[..HEADER_LEN + RECORD_LEN].to_vec();
        short[9] = (HEADER_LEN + RECORD_LEN) as u8;
        assert_eq!(
            Packet::new_checked(&short[..]).err(),
            Some(SyncWireError::BadLength)
        );
        let mut old = IPV6_TEMPLATE_BATCH;
        old[4] = 5;
        assert_eq!(
            Packet::new_checked(&old[..]).err(),
            Some(SyncWireError::WrongVersion(5))
        );
    }

    /// An IPv6 FullNAT connection and a NAT64 one (IPv4 real server and local end)
    /// become the sessions the data plane keeps (the IPv4 ends IPv4-mapped), and a
    /// session's record is the record again.
    #[test]
    fn ipv6_fullnat_and_nat64_records_are_sessions() {
        let key = ipv6_record().in_key6().unwrap();
        let rs6: Ipv6Addr = "2001:db8:1::2".parse().unwrap();
        let lip6: Ipv6Addr = "2001:db8:ff::1".parse().unwrap();
        let mut full = Session6::new(&key, ForwardMode::FullNat, 3, 4, rs6, 8080)
            .synced(TcpState::Established, false);
        (full.local_addr, full.local_port) = (lip6, 5000);
        full.persistent = true;
        let record = RecordRepr::connection6(&full, RecordOp::Update, 1000);
        assert_eq!(record.local, Some(SocketAddr::new(lip6.into(), 5000)));
        assert!(record.flags.contains(RecordFlags::PERSISTENT));
        assert_eq!(record.to_session6(3, 4), Some(full));

        let (rs4, lip4) = (Ipv4Addr::new(10, 1, 0, 21), Ipv4Addr::new(10, 1, 255, 1));
        let mut nat64 = Session6::new(&key, ForwardMode::FullNat, 3, 4, rs4.to_ipv6_mapped(), 8080)
            .synced(TcpState::SynRecv, false);
        (nat64.local_addr, nat64.local_port) = (lip4.to_ipv6_mapped(), 5001);
        let record = RecordRepr::connection6(&nat64, RecordOp::Update, 1000);
        assert_eq!(record.real_server, SocketAddr::new(rs4.into(), 8080));
        assert_eq!(record.local, Some(SocketAddr::new(lip4.into(), 5001)));
        let mut buf = [0u8; 1500];
        let mut builder = MessageBuilder::new(&mut buf, batch_header(), 1500, false);
        builder.push(&record).unwrap();
        let parsed = records_of(builder.finish()).unwrap()[0];
        assert_eq!(parsed, record);
        assert_eq!(parsed.to_session6(3, 4), Some(nat64));
        // Mixed families (an IPv6 real server behind an IPv4 local end) are no
        // session the data plane makes.
        let mut mixed = record;
        mixed.real_server = SocketAddr::new(rs6.into(), 8080);
        assert_eq!(mixed.to_session6(3, 4), None);
    }

    fn fullnat_record() -> RecordRepr {
        RecordRepr {
            kind: RecordKind::Connection,
            op: RecordOp::Update,
            proto: Protocol::Tcp,
            mode: ForwardMode::FullNat,
            state: TcpState::Established,
            client_prefix_len: 32,
            flags: RecordFlags::TOA_PENDING,
            client: SocketAddrV4::new(CLIENT, 40000).into(),
            virtual_service: SocketAddrV4::new(VIP, 443).into(),
            real_server: SocketAddrV4::new(RS, 8443).into(),
            local: Some(SocketAddrV4::new(LIP, 5000).into()),
            timeout_ms: 899_500,
            timestamp_offset: 0x8000_1234,
            synproxy: Some(SynproxyDelta {
                seq_delta: 0x1122_3344,
                ts_delta: 0x5566_7788,
                server_wscale: Some(7),
                client_wscale: None,
            }),
        }
    }

    fn batch_header() -> MessageRepr {
        MessageRepr {
            message_type: MessageType::SessionBatch,
            flags: MessageFlags::empty(),
            sender: 0x0a0b_0c0d,
            recipient: Ipv4Addr::UNSPECIFIED,
            epoch: 0x0006_2a1b_0000_0001,
            sequence: 7,
            dump_id: 0,
            chunk: 0,
            count: 1,
        }
    }

    fn records_of(bytes: &[u8]) -> Result<Vec<RecordRepr>, SyncWireError> {
        let packet = Packet::new_checked(bytes)?;
        MessageRepr::parse(&packet)?;
        let mut out = Vec::new();
        parse_records(&packet, |r| out.push(r))?;
        Ok(out)
    }

    #[test]
    fn fullnat_batch_fields() {
        let packet = Packet::new_checked(&FULLNAT_BATCH[..]).unwrap();
        assert_eq!(packet.magic(), MAGIC);
        assert_eq!(packet.version(), 6);
        assert_eq!(packet.len(), 96);
        assert_eq!(packet.trailer(), None);
        assert_eq!(MessageRepr::parse(&packet).unwrap(), batch_header());
        let record = packet.record(0);
        assert_eq!(record.client_addr(), CLIENT);
        assert_eq!(record.local_port(), 5000);
        assert_eq!(record.timeout_ms(), 899_500);
        assert_eq!(records_of(&FULLNAT_BATCH).unwrap(), [fullnat_record()]);
    }

    #[test]
    fn synproxy_fields_are_checked() {
        let at = HEADER_LEN;
        let fault = |patch: &dyn Fn(&mut [u8; 96])| {
            let mut bad = FULLNAT_BATCH;
            patch(&mut bad);
            match records_of(&bad) {
                Err(SyncWireError::BadRecord { fault, .. }) => fault,
                other => panic!("{other:?}"),
            }
        };
        // A window scale above 14 (0xff is "none"), reserved bytes, a UDP or DR
        // connection with the proxy's fields.
        assert_eq!(fault(&|b| b[at + 48] = 15), RecordFault::Synproxy);
        assert_eq!(fault(&|b| b[at + 49] = 20), RecordFault::Synproxy);
        assert_eq!(fault(&|b| b[at + 50] = 1), RecordFault::Synproxy);
        let udp = |b: &mut [u8; 96]| {
            b[at + 2] = 17;
            b[at + 4] = 0;
            b[at + 36..at + 40].fill(0);
        };
        assert_eq!(fault(&udp), RecordFault::Synproxy);
        let dr = |b: &mut [u8; 96]| {
            b[at + 3] = 3;
            b[at + 20..at + 24].fill(0);
            b[at + 30..at + 32].fill(0);
        };
        assert_eq!(fault(&dr), RecordFault::Synproxy);
        // Window scale 14 and "none" both pass.
        let mut ok = FULLNAT_BATCH;
        ok[at + 48] = 14;
        ok[at + 49] = 0xff;
        let r = records_of(&ok).unwrap()[0];
        assert_eq!(
            r.synproxy.map(|d| (d.server_wscale, d.client_wscale)),
            Some((Some(14), None))
        );
    }

    #[test]
    fn fullnat_batch_emit_matches_bytes() {
        let mut buf = [0xeeu8; 96];
        let mut packet = Packet::new_unchecked(&mut buf[..]);
        batch_header().emit(&mut packet);
        fullnat_record().emit(&mut packet.record_mut(0));
        assert_eq!(buf, FULLNAT_BATCH);

        let mut buf = [0u8; 1500];
        let mut builder = MessageBuilder::new(&mut buf, batch_header(), 1500, false);
        builder.push(&fullnat_record()).unwrap();
        assert_eq!(builder.finish(), &FULLNAT_BATCH[..]);
    }

    #[test]
    fn magic_and_version_come_first() {
        assert_eq!(records_of(&[]), Err(SyncWireError::Truncated));
        assert_eq!(
            records_of(&FULLNAT_BATCH[..4]),
            Err(SyncWireError::Truncated)
        );
        let mut bad = FULLNAT_BATCH;
        bad[0] = b'X';
        assert_eq!(records_of(&bad), Err(SyncWireError::BadMagic));
        // A version-1 message (28-byte header, no epoch) is recognised as such even
        // when its length would not fit this version's layout: the version is checked
        // before any length. So are version 2 (records without the timestamp offset),
        // version 3 (without the SYN proxy's fields), version 4 (no IPv6 records),
        // version 5 (no IPv6 templates) and a later version.
        for other in [1u8, 2, 3, 4, 5, 7] {
            let mut old = FULLNAT_BATCH;
            old[4] = other;
            assert_eq!(records_of(&old), Err(SyncWireError::WrongVersion(other)));
            assert_eq!(
                records_of(&old[..5]),
                Err(SyncWireError::WrongVersion(other))
            );
            assert_eq!(
                records_of(&old[..64]),
                Err(SyncWireError::WrongVersion(other))
            );
        }
        assert_eq!(
            records_of(&[0x53, 0x4c, 0x53, 0x59, 0x00]),
            Err(SyncWireError::WrongVersion(0))
        );
    }

    #[test]
    fn every_truncation_is_an_error() {
        for len in 0..FULLNAT_BATCH.len() {
            let err = records_of(&FULLNAT_BATCH[..len]).unwrap_err();
            assert!(err == SyncWireError::Truncated, "cut at {len}: {err:?}");
        }
    }

    #[test]
    fn length_and_count_must_agree() {
        let mut short = FULLNAT_BATCH;
        short[9] = 43; // length below the header
        assert_eq!(records_of(&short), Err(SyncWireError::BadLength));
        let mut two = FULLNAT_BATCH;
        two[11] = 2; // count 2 in an 80-byte message
        assert_eq!(records_of(&two), Err(SyncWireError::BadLength));
        let mut extra = FULLNAT_BATCH.to_vec();
        extra.push(0);
        assert_eq!(records_of(&extra), Err(SyncWireError::BadLength));
        // A resync request carries no record.
        let mut request = FULLNAT_BATCH;
        request[5] = MessageType::ResyncRequest as u8;
        assert_eq!(records_of(&request), Err(SyncWireError::BadLength));
    }

    #[test]
    fn unknown_type_and_flags() {
        for t in [0u8, 4, 0xff] {
            let mut bad = FULLNAT_BATCH;
            bad[5] = t;
            assert_eq!(records_of(&bad), Err(SyncWireError::UnknownType(t)));
        }
        let mut bad = FULLNAT_BATCH;
        bad[6] = 0x80;
        assert_eq!(records_of(&bad), Err(SyncWireError::UnknownFlags(0x8000)));
        // LAST_CHUNK belongs to dump chunks only.
        let mut bad = FULLNAT_BATCH;
        bad[7] = 0x02;
        assert_eq!(records_of(&bad), Err(SyncWireError::UnknownFlags(0x0002)));
        bad[5] = MessageType::DumpChunk as u8;
        assert_eq!(records_of(&bad).unwrap().len(), 1);
        // AUTHENTICATED without the trailer's 32 bytes.
        let mut bad = FULLNAT_BATCH;
        bad[7] = 0x01;
        assert_eq!(records_of(&bad), Err(SyncWireError::Truncated));
    }

    /// Each record byte set to a forbidden value gives the fault of its field.
    #[test]
    fn every_bad_record_field_is_named() {
        let at = HEADER_LEN;
        let cases: &[(usize, u8, RecordFault)] = &[
            (at, 0, RecordFault::Kind),
            (at, 5, RecordFault::Kind),
            (at, 0xff, RecordFault::Kind),
            (at + 1, 0, RecordFault::Op),
            (at + 1, 3, RecordFault::Op),
            (at + 2, 1, RecordFault::Protocol),
            (at + 3, 1, RecordFault::Mode),
            (at + 3, 4, RecordFault::Mode),
            (at + 4, 11, RecordFault::State),
            (at + 5, 24, RecordFault::PrefixLen),
            (at + 6, 0x80, RecordFault::Flags),
            (at + 7, 0x10, RecordFault::Flags),
            // FullNAT without a local address, or without a local port.
            (at + 20, 0, RecordFault::Local),
            (at + 30, 0, RecordFault::Local),
            // Timeout above the limit.
            (at + 32, 0xff, RecordFault::Timeout),
        ];
        for &(offset, value, fault) in cases {
            let mut bad = FULLNAT_BATCH;
            bad[offset] = value;
            if offset == at + 20 {
                bad[at + 20..at + 24].fill(0);
            }
            if offset == at + 30 {
                bad[at + 30..at + 32].fill(0);
            }
            assert_eq!(
                records_of(&bad),
                Err(SyncWireError::BadRecord { index: 0, fault }),
                "byte {offset} = {value:#x}"
            );
        }
        // NAT with a local address; UDP with a TCP state.
        let mut nat = FULLNAT_BATCH;
        nat[at + 3] = 0;
        assert_eq!(
            records_of(&nat),
            Err(SyncWireError::BadRecord {
                index: 0,
                fault: RecordFault::Local
            })
        );
        let mut udp = FULLNAT_BATCH;
        udp[at + 2] = 17;
        assert_eq!(
            records_of(&udp),
            Err(SyncWireError::BadRecord {
                index: 0,
                fault: RecordFault::State
            })
        );
        // UDP has no timestamps to move.
        udp[at + 4] = 0;
        assert_eq!(
            records_of(&udp),
            Err(SyncWireError::BadRecord {
                index: 0,
                fault: RecordFault::TimestampOffset
            })
        );
        udp[at + 36..at + 40].fill(0);
        // Nor a SYN proxy.
        assert_eq!(
            records_of(&udp),
            Err(SyncWireError::BadRecord {
                index: 0,
                fault: RecordFault::Synproxy
            })
        );
        udp[at + 7] &= !0x08;
        udp[at + 40..at + 52].fill(0);
        assert_eq!(records_of(&udp).unwrap()[0].proto, Protocol::Udp);
    }

    #[test]
    fn template_rules() {
        let template = RecordRepr::template(
            RecordOp::Update,
            Protocol::Tcp,
            SocketAddrV4::new(VIP, 443),
            Ipv4Addr::new(198, 51, 100, 0),
            24,
            SocketAddrV4::new(RS, 8443),
            ForwardMode::Nat,
            300_000,
        );
        let mut buf = [0u8; 96];
        let mut packet = Packet::new_unchecked(&mut buf[..]);
        batch_header().emit(&mut packet);
        template.emit(&mut packet.record_mut(0));
        assert_eq!(records_of(&buf).unwrap(), [template]);
        assert_eq!(template.to_session(1, 2), None);

        let at = HEADER_LEN;
        let fault = |patch: &dyn Fn(&mut [u8; 96])| {
            let mut bad = buf;
            patch(&mut bad);
            match records_of(&bad) {
                Err(SyncWireError::BadRecord { fault, .. }) => fault,
                other => panic!("{other:?}"),
            }
        };
        // Host bits outside /24, a prefix above 32, a client port, flags, a state.
        assert_eq!(fault(&|b| b[at + 11] = 1), RecordFault::PrefixLen);
        assert_eq!(fault(&|b| b[at + 5] = 33), RecordFault::PrefixLen);
        assert_eq!(fault(&|b| b[at + 25] = 1), RecordFault::TemplatePort);
        assert_eq!(fault(&|b| b[at + 7] = 4), RecordFault::Flags);
        assert_eq!(fault(&|b| b[at + 4] = 1), RecordFault::State);
        assert_eq!(fault(&|b| b[at + 39] = 1), RecordFault::TimestampOffset);
        // SYN proxy fields without the flag, reserved bytes, the flag on a template.
        assert_eq!(fault(&|b| b[at + 43] = 1), RecordFault::Synproxy);
        assert_eq!(fault(&|b| b[at + 48] = 0xff), RecordFault::Synproxy);
        assert_eq!(fault(&|b| b[at + 51] = 1), RecordFault::Synproxy);
        assert_eq!(fault(&|b| b[at + 7] = 8), RecordFault::Flags);
        // /0 covers every client: network 0.0.0.0 only.
        let mut all = buf;
        all[at + 5] = 0;
        all[at + 8..at + 12].fill(0);
        assert_eq!(records_of(&all).unwrap()[0].client_prefix_len, 0);
    }

    #[test]
    fn session_to_record_and_back() {
        let key = FlowKey4::new(Protocol::Tcp, CLIENT, 40000, VIP, 443);
        let mut session =
            Session::new(&key, ForwardMode::FullNat, 4, 9, RS, 8443).with_local(LIP, 5000);
        session.set_state(TcpState::Established);
        session.set_flags(SessionFlags::TOA_PENDING);
        session.set_flags(SessionFlags::PERSISTENT);
        let record = RecordRepr::connection(&session, RecordOp::Update, 899_500);
        assert_eq!(
            record.flags,
            RecordFlags::TOA_PENDING | RecordFlags::PERSISTENT
        );
        assert_eq!(record.local, Some(SocketAddrV4::new(LIP, 5000).into()));
        let back = record.to_session(4, 9).unwrap();
        assert_eq!(back, session);

        // DR: NO_OUTPUT travels; once cleared on the sender it stays cleared.
        let mut dr = Session::new(&key, ForwardMode::Dr, 1, 1, RS, 443);
        assert!(RecordRepr::connection(&dr, RecordOp::Update, 1)
            .to_session(1, 1)
            .unwrap()
            .flags()
            .contains(SessionFlags::NO_OUTPUT));
        dr.clear_flags(SessionFlags::NO_OUTPUT);
        let copy = RecordRepr::connection(&dr, RecordOp::Update, 1)
            .to_session(1, 1)
            .unwrap();
        assert_eq!(copy.flags(), SessionFlags::empty());
        assert_eq!(copy.local_addr, 0);
    }

    #[test]
    fn mtu_bounds_the_record_count() {
        assert_eq!(max_records(1500, false), 27);
        assert_eq!(max_records(1500, true), 26);
        assert_eq!(max_records(9000, false), 171);
        assert_eq!(max_records(60, false), 0);
        for mtu in [576u16, 1280, 1500, 9000] {
            for auth in [false, true] {
                let n = max_records(mtu, auth);
                assert!(message_len(n, auth) + IPV4_UDP_OVERHEAD <= mtu as usize);
                assert!(message_len(n + 1, auth) + IPV4_UDP_OVERHEAD > mtu as usize);
            }
        }
        // The builder stops exactly there, and the full message parses.
        let mut buf = [0u8; 2048];
        let mut builder = MessageBuilder::new(&mut buf, batch_header(), 1500, false);
        let mut pushed = 0;
        while builder.push(&fullnat_record()).is_ok() {
            pushed += 1;
        }
        assert_eq!(pushed, 27);
        assert!(builder.is_full());
        let message = builder.finish();
        assert_eq!(
            message.len(),
            1404 + 44,
            "1404 bytes of records + 44 of header"
        );
        assert_eq!(records_of(message).unwrap().len(), 27);
        // A buffer smaller than the MTU bounds it too.
        let mut small = [0u8; HEADER_LEN + 2 * RECORD_LEN + 5];
        let builder = MessageBuilder::new(&mut small, batch_header(), 1500, false);
        assert_eq!(builder.capacity(), 2);
        // A resync request never takes records.
        let request = MessageRepr {
            message_type: MessageType::ResyncRequest,
            ..batch_header()
        };
        let mut builder = MessageBuilder::new(&mut buf, request, 1500, false);
        assert_eq!(builder.push(&fullnat_record()), Err(MessageFull));
        assert_eq!(builder.finish().len(), HEADER_LEN);
    }

    fn random_addr(rng: &mut XorShift) -> Ipv4Addr {
        Ipv4Addr::from(rng.next_u64() as u32)
    }

    fn random_record(rng: &mut XorShift) -> RecordRepr {
        let proto = if rng.next_u64() & 1 == 0 {
            Protocol::Tcp
        } else {
            Protocol::Udp
        };
        let op = if rng.below(4) == 0 {
            RecordOp::Remove
        } else {
            RecordOp::Update
        };
        let mode = ForwardMode::ALL[rng.below(4)];
        let timeout_ms = rng.next_u64() as u32 % (MAX_TIMEOUT_MS + 1);
        let port = |rng: &mut XorShift| rng.next_u64() as u16;
        if rng.below(10) == 0 {
            let prefix_len = rng.below(129) as u8;
            let top = 0x2001_0db8u128 << 96 | u128::from(rng.next_u64()) << 32;
            let network = Ipv6Addr::from(top & crate::session::persist::prefix_mask6(prefix_len));
            let vip = Ipv6Addr::from(top | 1);
            let real = match rng.below(3) {
                0 => SocketAddr::new(IpAddr::V4(random_addr(rng)), port(rng)),
                _ => SocketAddr::new(IpAddr::V6(Ipv6Addr::from(top | 2)), port(rng)),
            };
            return RecordRepr::template6(
                op,
                proto,
                SocketAddrV6::new(vip, port(rng), 0, 0),
                network,
                prefix_len,
                real,
                mode,
                timeout_ms,
            );
        }
        if rng.below(5) == 0 {
            let prefix_len = rng.below(33) as u8;
            let mask = u32::MAX.checked_shl(32 - prefix_len as u32).unwrap_or(0);
            let network = Ipv4Addr::from(u32::from(random_addr(rng)) & mask);
            return RecordRepr::template(
                op,
                proto,
                SocketAddrV4::new(random_addr(rng), port(rng)),
                network,
                prefix_len,
                SocketAddrV4::new(random_addr(rng), port(rng)),
                mode,
                timeout_ms,
            );
        }
        let state = match proto {
            Protocol::Tcp => TcpState::ALL[rng.below(TcpState::COUNT)],
            Protocol::Udp => TcpState::None,
        };
        if rng.below(3) == 0 {
            return random_record6(rng, op, proto, mode, state, timeout_ms);
        }
        let local = (mode == ForwardMode::FullNat).then(|| {
            SocketAddrV4::new(
                Ipv4Addr::from((rng.next_u64() as u32).max(1)),
                port(rng).max(1),
            )
        });
        RecordRepr {
            kind: RecordKind::Connection,
            op,
            proto,
            mode,
            state,
            client_prefix_len: 32,
            flags: RecordFlags(
                rng.next_u64() as u16 & RecordFlags::KNOWN & !RecordFlags::SYNPROXY.0,
            ),
            client: SocketAddrV4::new(random_addr(rng), port(rng)).into(),
            virtual_service: SocketAddrV4::new(random_addr(rng), port(rng)).into(),
            real_server: SocketAddrV4::new(random_addr(rng), port(rng)).into(),
            local: local.map(SocketAddr::V4),
            timeout_ms,
            timestamp_offset: match proto {
                Protocol::Tcp => rng.next_u64() as u32,
                Protocol::Udp => 0,
            },
            synproxy: (proto == Protocol::Tcp
                && matches!(mode, ForwardMode::Nat | ForwardMode::FullNat)
                && rng.next_u64().is_multiple_of(2))
            .then(|| {
                let scale = |r: u64| (r % 16 < 15).then_some((r % 15) as u8);
                SynproxyDelta {
                    seq_delta: rng.next_u64() as u32,
                    ts_delta: rng.next_u64() as u32,
                    server_wscale: scale(rng.next_u64()),
                    client_wscale: scale(rng.next_u64()),
                }
            }),
        }
    }

    /// An IPv6 connection record: IPv6 client and VIP; the real server and local
    /// address IPv6, or now and then IPv4 (a translated connection).
    fn random_record6(
        rng: &mut XorShift,
        op: RecordOp,
        proto: Protocol,
        mode: ForwardMode,
        state: TcpState,
        timeout_ms: u32,
    ) -> RecordRepr {
        let v6 = |rng: &mut XorShift| {
            // Never IPv4-mapped: the top word is 2001:db8 or random non-zero.
            let hi = ((rng.next_u64() as u128) << 64) | 0x2001_0db8u128 << 96;
            Ipv6Addr::from(hi | u128::from(rng.next_u64()))
        };
        let ip = |rng: &mut XorShift| -> IpAddr {
            if rng.below(4) == 0 {
                IpAddr::V4(random_addr(rng))
            } else {
                IpAddr::V6(v6(rng))
            }
        };
        let port = |rng: &mut XorShift| rng.next_u64() as u16;
        let local = (mode == ForwardMode::FullNat).then(|| {
            let a = match ip(rng) {
                IpAddr::V4(a) => IpAddr::V4(Ipv4Addr::from(u32::from(a).max(1))),
                a => a,
            };
            SocketAddr::new(a, port(rng).max(1))
        });
        RecordRepr {
            kind: RecordKind::Connection,
            op,
            proto,
            mode,
            state,
            client_prefix_len: 128,
            flags: RecordFlags(
                rng.next_u64() as u16 & RecordFlags::KNOWN & !RecordFlags::SYNPROXY.0,
            ),
            client: SocketAddr::new(IpAddr::V6(v6(rng)), port(rng)),
            virtual_service: SocketAddr::new(IpAddr::V6(v6(rng)), port(rng)),
            real_server: SocketAddr::new(ip(rng), port(rng)),
            local,
            timeout_ms,
            timestamp_offset: match proto {
                Protocol::Tcp => rng.next_u64() as u32,
                Protocol::Udp => 0,
            },
            synproxy: None,
        }
    }

    /// `header` and `records` written again with a builder (their lengths walked as a
    /// receiver walks them), the trailer room left as it is.
    fn reemit(header: MessageRepr, records: &[RecordRepr], out: &mut [u8]) {
        let authenticated = header.flags.contains(MessageFlags::AUTHENTICATED);
        let mut builder = MessageBuilder::new(out, header, 9000, authenticated);
        for r in records {
            builder.push(r).unwrap();
        }
        builder.finish();
    }

    #[test]
    fn random_messages_round_trip() {
        let mut rng = XorShift(0x51c5_e0fa_1100_5eed);
        let mut buf = [0u8; 9000];
        let mut records = Vec::new();
        for round in 0..2000 {
            let mtu = [576u16, 1500, 9000][rng.below(3)];
            let header = MessageRepr {
                message_type: if round % 3 == 0 {
                    MessageType::DumpChunk
                } else {
                    MessageType::SessionBatch
                },
                flags: MessageFlags::empty(),
                sender: rng.next_u64() as u32,
                recipient: Ipv4Addr::from(rng.next_u64() as u32),
                epoch: rng.next_u64(),
                sequence: rng.next_u64(),
                dump_id: rng.next_u64() as u32,
                chunk: rng.next_u64() as u32,
                count: 0,
            };
            let mut builder = MessageBuilder::new(&mut buf, header, mtu, false);
            let mut want = rng.below(builder.capacity() + 1);
            records.clear();
            for i in 0..want {
                let record = random_record(&mut rng);
                if builder.push(&record).is_err() {
                    // IPv6 records are longer: the message is full before `want`.
                    assert!(records.iter().any(|r: &RecordRepr| r.is_ipv6()) || record.is_ipv6());
                    want = i;
                    break;
                }
                records.push(record);
            }
            let message = builder.finish();
            let packet = Packet::new_checked(&*message).unwrap();
            let parsed = MessageRepr::parse(&packet).unwrap();
            assert_eq!(parsed.count as usize, want);
            assert_eq!(
                (
                    parsed.sender,
                    parsed.recipient,
                    parsed.epoch,
                    parsed.sequence
                ),
                (
                    header.sender,
                    header.recipient,
                    header.epoch,
                    header.sequence
                )
            );
            let mut index = 0;
            parse_records(&packet, |r| {
                assert_eq!(r, records[index], "round {round} record {index}");
                index += 1;
            })
            .unwrap();
            assert_eq!(index, want);
            // Emitting the parsed records again gives the same bytes.
            let mut again = vec![0u8; message.len()];
            reemit(parsed, &records, &mut again);
            assert_eq!(&again[..], &message[..]);
        }
    }

    /// Random garbage and random corruptions of valid messages: never a panic, and a
    /// message that parses re-emits to the same bytes (nothing is silently dropped).
    #[test]
    fn fuzz_never_panics() {
        let mut rng = XorShift(0xdead_beef_cafe_f00d);
        let mut buf = [0u8; 1500];
        for round in 0..20_000 {
            let base: &[u8] = if round % 2 == 0 {
                &FULLNAT_BATCH
            } else {
                &IPV6_BATCH
            };
            let len = rng.below(200);
            let mut data = base.to_vec();
            data.resize(len.max(base.len()), 0);
            if rng.below(2) == 0 {
                rng.fill(&mut data[..len]);
                data.truncate(len);
            } else {
                for _ in 0..1 + rng.below(3) {
                    let at = rng.below(data.len());
                    data[at] = rng.next_u64() as u8;
                }
                data.truncate(base.len());
            }
            if let Ok(records) = records_of(&data) {
                let packet = Packet::new_checked(&data[..]).unwrap();
                if data.len() > buf.len() {
                    continue;
                }
                let header = MessageRepr::parse(&packet).unwrap();
                let out = &mut buf[..data.len()];
                reemit(header, &records, out);
                let mut copy = Packet::new_unchecked(&mut *out);
                if let Some(trailer) = packet.trailer() {
                    copy.trailer_mut().copy_from_slice(trailer);
                }
                assert_eq!(&*out, &data[..]);
            }
        }
    }
}
