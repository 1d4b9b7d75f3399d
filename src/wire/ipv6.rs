//! IPv6 headers (RFC 8200) and the walk over extension headers to the upper layer.
//!
//! Addresses are `std::net::Ipv6Addr`, as `ipv4` uses `Ipv4Addr`.
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! |Version| Traffic Class |           Flow Label                  |
//! |         Payload Length        |  Next Header  |   Hop Limit   |
//! |                     Source Address (16 bytes)                 |
//! |                  Destination Address (16 bytes)               |
//! ```

use core::fmt;
use std::net::Ipv6Addr;

use super::{read_u16, read_u32, write_u16, write_u32, IpProtocol, WireError};

mod field {
    use core::ops::Range;

    /// Version (4 bits), traffic class (8), flow label (20).
    pub const VER_TC_FLOW: usize = 0;
    pub const PAYLOAD_LEN: usize = 4;
    pub const NEXT_HEADER: usize = 6;
    pub const HOP_LIMIT: usize = 7;
    pub const SRC: Range<usize> = 8..24;
    pub const DST: Range<usize> = 24..40;
}

/// Length of the fixed header.
pub const HEADER_LEN: usize = 40;
/// Default hop limit of packets Sluice originates (Linux's default too).
pub const DEFAULT_HOP_LIMIT: u8 = 64;
/// The smallest MTU every IPv6 link has (RFC 8200 section 5); ICMPv6 errors are cut
/// to fit in it.
pub const MIN_MTU: usize = 1280;

const FLOW_LABEL_MASK: u32 = 0x000f_ffff;

/// The solicited-node multicast address of `addr` (RFC 4291 section 2.7.1):
/// ff02::1:ff00:0/104 and the low 24 bits of `addr`. Neighbor Solicitations for `addr`
/// go there.
pub const fn solicited_node(addr: Ipv6Addr) -> Ipv6Addr {
    let o = addr.octets();
    Ipv6Addr::new(
        0xff02,
        0,
        0,
        0,
        0,
        1,
        0xff00 | o[13] as u16,
        ((o[14] as u16) << 8) | o[15] as u16,
    )
}

/// Whether no single host sends from `addr` (RFC 4291 section 2.5.2 and 2.7, as
/// Linux's input check): the unspecified address, loopback, or multicast. A packet
/// from one is forged or misrouted.
pub fn is_martian_source(addr: Ipv6Addr) -> bool {
    addr.is_unspecified() || addr.is_loopback() || addr.is_multicast()
}

/// The link-scope all-nodes multicast address, ff02::1.
pub const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);

/// A view of an IPv6 packet: the fixed header and `payload_len` bytes of payload
/// (extension headers included). Bytes after the payload (Ethernet padding) belong to
/// the buffer but not to the packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps `buffer` without checks; accessors may panic on a short buffer.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps `buffer` after checking that the header is complete and the payload it
    /// declares is there, so that no accessor can panic.
    ///
    /// Errors: `Truncated` when the buffer is shorter than 40 bytes or than 40 plus
    /// `payload_len`; `Malformed` when the version is not 6. A payload length of zero
    /// is taken as it reads: jumbograms (RFC 2675) are not supported, and their
    /// hop-by-hop option stops [`walk_extension_headers`].
    pub fn new_checked(buffer: T) -> Result<Packet<T>, WireError> {
        let packet = Self::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    pub fn check_len(&self) -> Result<(), WireError> {
        let len = self.buffer.as_ref().len();
        if len < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        if self.version() != 6 {
            return Err(WireError::Malformed);
        }
        if HEADER_LEN + self.payload_len() as usize > len {
            return Err(WireError::Truncated);
        }
        Ok(())
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VER_TC_FLOW] >> 4
    }

    /// The 8-bit traffic class: DSCP (6 bits) and ECN (2 bits).
    pub fn traffic_class(&self) -> u8 {
        (read_u16(self.buffer.as_ref(), field::VER_TC_FLOW) >> 4) as u8
    }

    pub fn dscp(&self) -> u8 {
        self.traffic_class() >> 2
    }

    pub fn ecn(&self) -> u8 {
        self.traffic_class() & 0x03
    }

    /// The 20-bit flow label.
    pub fn flow_label(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::VER_TC_FLOW) & FLOW_LABEL_MASK
    }

    /// Length of everything after the fixed header, extension headers included.
    pub fn payload_len(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::PAYLOAD_LEN)
    }

    /// The header after the fixed one: an extension header or the upper layer.
    pub fn next_header(&self) -> IpProtocol {
        IpProtocol(self.buffer.as_ref()[field::NEXT_HEADER])
    }

    pub fn hop_limit(&self) -> u8 {
        self.buffer.as_ref()[field::HOP_LIMIT]
    }

    pub fn src_addr(&self) -> Ipv6Addr {
        addr_at(self.buffer.as_ref(), field::SRC.start)
    }

    pub fn dst_addr(&self) -> Ipv6Addr {
        addr_at(self.buffer.as_ref(), field::DST.start)
    }

    /// The payload up to `payload_len`, without Ethernet padding.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..HEADER_LEN + self.payload_len() as usize]
    }

    /// Walks the extension headers of a checked packet to the upper layer; the offset
    /// returned counts from the start of the IPv6 header. See
    /// [`walk_extension_headers`] for the bound and the errors.
    pub fn upper_layer(&self) -> Result<UpperLayer, ExtHeaderError> {
        let mut upper = walk_extension_headers(self.next_header(), self.payload())?;
        upper.offset += HEADER_LEN;
        Ok(upper)
    }
}

/// Reads an IPv6 address at `at`. Callers have validated the length beforehand.
pub(crate) fn addr_at(data: &[u8], at: usize) -> Ipv6Addr {
    let mut octets = [0u8; 16];
    octets.copy_from_slice(&data[at..at + 16]);
    Ipv6Addr::from(octets)
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets version 6, the traffic class and the flow label (low 20 bits) at once.
    pub fn set_version_class_flow(&mut self, traffic_class: u8, flow_label: u32) {
        let value = (6 << 28) | ((traffic_class as u32) << 20) | (flow_label & FLOW_LABEL_MASK);
        write_u32(self.buffer.as_mut(), field::VER_TC_FLOW, value);
    }

    /// Sets the traffic class, keeping version and flow label.
    pub fn set_traffic_class(&mut self, value: u8) {
        let flow = self.flow_label();
        self.set_version_class_flow(value, flow);
    }

    /// Sets the flow label (low 20 bits), keeping version and traffic class.
    pub fn set_flow_label(&mut self, value: u32) {
        let class = self.traffic_class();
        self.set_version_class_flow(class, value);
    }

    pub fn set_payload_len(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::PAYLOAD_LEN, value);
    }

    pub fn set_next_header(&mut self, value: IpProtocol) {
        self.buffer.as_mut()[field::NEXT_HEADER] = value.0;
    }

    pub fn set_hop_limit(&mut self, value: u8) {
        self.buffer.as_mut()[field::HOP_LIMIT] = value;
    }

    pub fn set_src_addr(&mut self, addr: Ipv6Addr) {
        self.buffer.as_mut()[field::SRC].copy_from_slice(&addr.octets());
    }

    pub fn set_dst_addr(&mut self, addr: Ipv6Addr) {
        self.buffer.as_mut()[field::DST].copy_from_slice(&addr.octets());
    }

    /// The payload up to `payload_len`, without Ethernet padding.
    pub fn payload_mut(&mut self) -> &mut [u8] {
        let end = HEADER_LEN + self.payload_len() as usize;
        &mut self.buffer.as_mut()[HEADER_LEN..end]
    }
}

/// The fields of an IPv6 header, for building packets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Repr {
    pub src_addr: Ipv6Addr,
    pub dst_addr: Ipv6Addr,
    pub next_header: IpProtocol,
    pub payload_len: usize,
    pub hop_limit: u8,
}

impl Repr {
    /// Reads the fields of a checked packet; traffic class and flow label are left
    /// to the view.
    pub fn parse<T: AsRef<[u8]>>(packet: &Packet<T>) -> Result<Repr, WireError> {
        packet.check_len()?;
        Ok(Repr {
            src_addr: packet.src_addr(),
            dst_addr: packet.dst_addr(),
            next_header: packet.next_header(),
            payload_len: packet.payload_len() as usize,
            hop_limit: packet.hop_limit(),
        })
    }

    pub const fn buffer_len(&self) -> usize {
        HEADER_LEN
    }

    /// Writes the 40-byte header with traffic class and flow label zero. The buffer
    /// must hold at least 40 bytes; the payload is not touched.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(&self, packet: &mut Packet<T>) {
        packet.set_version_class_flow(0, 0);
        packet.set_payload_len(self.payload_len as u16);
        packet.set_next_header(self.next_header);
        packet.set_hop_limit(self.hop_limit);
        packet.set_src_addr(self.src_addr);
        packet.set_dst_addr(self.dst_addr);
    }
}

/// Extension-header and related next-header values (IANA "IPv6 Extension Header
/// Types", RFC 8200 section 4).
pub mod ext {
    use crate::wire::IpProtocol;

    pub const HOP_BY_HOP: IpProtocol = IpProtocol(0);
    pub const ROUTING: IpProtocol = IpProtocol(43);
    pub const FRAGMENT: IpProtocol = IpProtocol(44);
    /// Encapsulating Security Payload (RFC 4303): encrypted, nothing after it is
    /// readable.
    pub const ESP: IpProtocol = IpProtocol(50);
    /// Authentication Header (RFC 4302): its length counts 4-byte units, less 2.
    pub const AUTH: IpProtocol = IpProtocol(51);
    /// Nothing follows (RFC 8200 section 4.7).
    pub const NO_NEXT_HEADER: IpProtocol = IpProtocol(59);
    pub const DEST_OPTIONS: IpProtocol = IpProtocol(60);
}

/// Most extension headers [`walk_extension_headers`] crosses before it gives up. The
/// order RFC 8200 section 4.1 recommends holds at most five headers that the walk
/// crosses (hop-by-hop, destination options, routing, fragment, destination options)
/// and one authentication header; a longer chain serves no purpose but to make a
/// parser work (RFC 9098), so it is refused.
pub const MAX_EXTENSION_HEADERS: usize = 6;

/// The fragment header of a first fragment the walk crossed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fragment {
    pub ident: u32,
    /// More fragments follow. Without it the packet is an atomic fragment (RFC 6946),
    /// whole in itself.
    pub more_frags: bool,
}

/// Where the upper-layer header of an IPv6 packet starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpperLayer {
    /// The upper-layer protocol. ESP and No Next Header end the walk and are
    /// returned here, since nothing after them can be read; so is any next-header
    /// value that is not one of the extension headers walked.
    pub protocol: IpProtocol,
    /// Offset of the upper-layer header: from the start of the bytes given to
    /// [`walk_extension_headers`], from the start of the IPv6 header for
    /// [`Packet::upper_layer`]. It may equal the end of the packet (nothing follows).
    pub offset: usize,
    /// Extension headers crossed, at most [`MAX_EXTENSION_HEADERS`].
    pub ext_headers: u8,
    /// A fragment header with offset zero was crossed: the upper-layer header is
    /// here, but the rest of the datagram may be in other packets.
    pub fragment: Option<Fragment>,
}

/// Why the walk over extension headers stopped short of the upper layer. Each is one
/// reason a parser can count a drop under.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ExtHeaderError {
    /// More than [`MAX_EXTENSION_HEADERS`] extension headers.
    TooManyHeaders,
    /// An extension header runs past the end of the payload.
    Truncated,
    /// A hop-by-hop options header anywhere but right after the IPv6 header
    /// (RFC 8200 section 4.3).
    HopByHopNotFirst,
    /// An option whose type says an unrecognising node must discard the packet (its
    /// two high bits are not 00, RFC 8200 section 4.2); the jumbo payload option is
    /// one, since jumbograms are not supported.
    UnrecognizedOption,
    /// An option runs past the end of its options header.
    MalformedOption,
    /// A routing header with segments left: the destination address is a waypoint,
    /// not the packet's final destination, so it is not for a service here (RFC 8200
    /// section 4.4; type 0 is deprecated, RFC 5095).
    RoutingSegmentsLeft,
    /// A fragment with a non-zero offset: it holds no upper-layer header.
    NonFirstFragment,
}

impl fmt::Display for ExtHeaderError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ExtHeaderError::TooManyHeaders => "too many extension headers",
            ExtHeaderError::Truncated => "truncated extension header",
            ExtHeaderError::HopByHopNotFirst => "hop-by-hop options header not first",
            ExtHeaderError::UnrecognizedOption => "unrecognized option that discards",
            ExtHeaderError::MalformedOption => "malformed option",
            ExtHeaderError::RoutingSegmentsLeft => "routing header with segments left",
            ExtHeaderError::NonFirstFragment => "non-first fragment",
        })
    }
}

impl std::error::Error for ExtHeaderError {}

/// Length of the fragment header (fixed).
pub const FRAGMENT_HEADER_LEN: usize = 8;

/// Walks the extension headers that start `data` (the IPv6 payload, or what an ICMPv6
/// error quotes of one), the first being `first` (the IPv6 next header), up to the
/// upper-layer header. No more than [`MAX_EXTENSION_HEADERS`] are crossed, so the cost
/// is bounded whatever the packet. Hop-by-hop and destination options are checked
/// option by option: Pad1, PadN and options whose type says "skip" are skipped.
///
/// Errors, each distinct ([`ExtHeaderError`]): too many headers, a header cut short,
/// hop-by-hop not first, an option that requires a discard, an option running past its
/// header, a routing header with segments left, a non-first fragment.
pub fn walk_extension_headers(
    first: IpProtocol,
    data: &[u8],
) -> Result<UpperLayer, ExtHeaderError> {
    let mut next = first;
    let mut offset = 0usize;
    let mut crossed = 0usize;
    let mut fragment = None;
    loop {
        if !matches!(
            next,
            ext::HOP_BY_HOP | ext::ROUTING | ext::FRAGMENT | ext::AUTH | ext::DEST_OPTIONS
        ) {
            return Ok(UpperLayer {
                protocol: next,
                offset,
                ext_headers: crossed as u8,
                fragment,
            });
        }
        if next == ext::HOP_BY_HOP && crossed != 0 {
            return Err(ExtHeaderError::HopByHopNotFirst);
        }
        if crossed == MAX_EXTENSION_HEADERS {
            return Err(ExtHeaderError::TooManyHeaders);
        }
        // Every extension header walked starts with next header and a length byte.
        let Some(&[following, len_field]) = data.get(offset..offset + 2) else {
            return Err(ExtHeaderError::Truncated);
        };
        let len = match next {
            ext::FRAGMENT => FRAGMENT_HEADER_LEN,
            ext::AUTH => (len_field as usize + 2) * 4,
            _ => (len_field as usize + 1) * 8,
        };
        let Some(header) = data.get(offset..offset + len) else {
            return Err(ExtHeaderError::Truncated);
        };
        match next {
            ext::HOP_BY_HOP | ext::DEST_OPTIONS => check_options(&header[2..])?,
            // Segments left is the fourth byte of every routing header type.
            ext::ROUTING if header[3] != 0 => return Err(ExtHeaderError::RoutingSegmentsLeft),
            ext::FRAGMENT => {
                let offset_flags = read_u16(header, 2);
                if offset_flags & 0xfff8 != 0 {
                    return Err(ExtHeaderError::NonFirstFragment);
                }
                fragment = Some(Fragment {
                    ident: read_u32(header, 4),
                    more_frags: offset_flags & 0x0001 != 0,
                });
            }
            _ => {}
        }
        next = IpProtocol(following);
        offset += len;
        crossed += 1;
    }
}

/// Option types with a meaning here (RFC 8200 section 4.2); every other option is
/// handled by the action its two high bits code.
const OPTION_PAD1: u8 = 0;
const OPTION_PADN: u8 = 1;

/// Checks the type-length-value options of a hop-by-hop or destination options
/// header (the bytes after its first two).
fn check_options(mut options: &[u8]) -> Result<(), ExtHeaderError> {
    while let Some(&kind) = options.first() {
        if kind == OPTION_PAD1 {
            options = &options[1..];
            continue;
        }
        let Some(&len) = options.get(1) else {
            return Err(ExtHeaderError::MalformedOption);
        };
        let end = 2 + len as usize;
        if end > options.len() {
            return Err(ExtHeaderError::MalformedOption);
        }
        // 00: skip the option; 01, 10, 11: discard the packet (with or without an
        // ICMPv6 Parameter Problem, which this walk leaves to its caller).
        if kind != OPTION_PADN && kind >> 6 != 0 {
            return Err(ExtHeaderError::UnrecognizedOption);
        }
        options = &options[end..];
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::checksum;

    fn a(text: &str) -> Ipv6Addr {
        text.parse().unwrap()
    }

    // Reference packets built with scapy 2.5.0 (`from scapy.all import *`, with
    // A="2001:db8::1", B="2001:db8::2"), printed with `bytes(...)`.

    // IPv6(src=A,dst=B,tc=0xb8,fl=0x12345,hlim=64)/IPv6ExtHdrHopByHop(options=[RouterAlert()])/IPv6ExtHdrDestOpt(options=[PadN(optdata=b"\x00\x00\x00\x00")])/IPv6ExtHdrRouting(addresses=[],segleft=0)/TCP(sport=40000,dport=80,flags="S",seq=1000,window=64800)
    static TCP_SYN_EXT: [u8; 84] = [
        0x6b, 0x81, 0x23, 0x45, 0x00, 0x2c, 0x00, 0x40, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x3c, 0x00, 0x05, 0x02, 0x00,
        0x00, 0x01, 0x00, 0x2b, 0x00, 0x01, 0x04, 0x00, 0x00, 0x00, 0x00, 0x06, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x9c, 0x40, 0x00, 0x50, 0x00, 0x00, 0x03, 0xe8, 0x00, 0x00, 0x00,
        0x00, 0x50, 0x02, 0xfd, 0x20, 0xb6, 0xd4, 0x00, 0x00,
    ];
    // IPv6(src=A,dst=B)/IPv6ExtHdrFragment(id=0xdeadbeef,m=1,offset=0)/UDP(sport=5353,dport=53)/Raw(b"x"*16)
    static UDP_FIRST_FRAGMENT: [u8; 72] = [
        0x60, 0x00, 0x00, 0x00, 0x00, 0x20, 0x2c, 0x40, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x11, 0x00, 0x00, 0x01, 0xde,
        0xad, 0xbe, 0xef, 0x14, 0xe9, 0x00, 0x35, 0x00, 0x18, 0xcb, 0x67, 0x78, 0x78, 0x78, 0x78,
        0x78, 0x78, 0x78, 0x78, 0x78, 0x78, 0x78, 0x78, 0x78, 0x78, 0x78, 0x78,
    ];
    // IPv6(src=A,dst=B)/AH(nh=6,payloadlen=4,spi=0x100,seq=1,icv=b"\x11"*12)/TCP(sport=40000,dport=80,flags="S")
    static TCP_AH: [u8; 84] = [
        0x60, 0x00, 0x00, 0x00, 0x00, 0x2c, 0x33, 0x40, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x06, 0x04, 0x00, 0x00, 0x00,
        0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x01, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x11,
        0x11, 0x11, 0x11, 0x11, 0x9c, 0x40, 0x00, 0x50, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x50, 0x02, 0x20, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];
    // IPv6(src=A,dst=B)/UDP(sport=1234,dport=53)/Raw(b"hello sluice")
    static UDP: [u8; 60] = [
        0x60, 0x00, 0x00, 0x00, 0x00, 0x14, 0x11, 0x40, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x04, 0xd2, 0x00, 0x35, 0x00,
        0x14, 0x0f, 0x1d, 0x68, 0x65, 0x6c, 0x6c, 0x6f, 0x20, 0x73, 0x6c, 0x75, 0x69, 0x63, 0x65,
    ];

    /// The IPv6 payload of a vector: what the walk gets.
    fn payload_of(packet: &[u8]) -> &[u8] {
        let len = Packet::new_checked(packet).unwrap().payload_len() as usize;
        &packet[HEADER_LEN..HEADER_LEN + len]
    }

    #[test]
    fn header_fields() {
        let packet = Packet::new_checked(&TCP_SYN_EXT[..]).unwrap();
        assert_eq!(packet.version(), 6);
        assert_eq!(packet.traffic_class(), 0xb8);
        assert_eq!((packet.dscp(), packet.ecn()), (46, 0));
        assert_eq!(packet.flow_label(), 0x12345);
        assert_eq!(packet.payload_len(), 44);
        assert_eq!(packet.next_header(), ext::HOP_BY_HOP);
        assert_eq!(packet.hop_limit(), 64);
        assert_eq!(packet.src_addr(), a("2001:db8::1"));
        assert_eq!(packet.dst_addr(), a("2001:db8::2"));
        assert_eq!(packet.payload(), &TCP_SYN_EXT[40..]);
    }

    #[test]
    fn walk_crosses_hop_by_hop_destination_and_routing() {
        let packet = Packet::new_checked(&TCP_SYN_EXT[..]).unwrap();
        let upper = packet.upper_layer().unwrap();
        assert_eq!(
            upper,
            UpperLayer {
                protocol: IpProtocol::TCP,
                offset: 64,
                ext_headers: 3,
                fragment: None,
            }
        );
        // Source port 40000 where the walk says TCP starts, and the segment verifies
        // with the pseudo-header scapy used.
        assert_eq!(&TCP_SYN_EXT[64..66], &40000u16.to_be_bytes());
        let segment = &TCP_SYN_EXT[upper.offset..];
        let pseudo = checksum::pseudo_header_sum_v6(
            packet.src_addr(),
            packet.dst_addr(),
            6,
            segment.len() as u32,
        );
        assert_eq!(checksum::fold(pseudo + checksum::sum(segment)), 0xffff);
    }

    #[test]
    fn tcp_checksum_over_ipv6_matches_scapy() {
        use crate::wire::tcp;
        let mut buf = TCP_SYN_EXT;
        let mut segment = tcp::Packet::new_checked(&mut buf[64..]).unwrap();
        let (src, dst) = (a("2001:db8::1"), a("2001:db8::2"));
        assert!(segment.verify_checksum_v6(src, dst));
        assert!(!segment.verify_checksum_v6(src, a("2001:db8::3")));
        segment.set_checksum(0);
        segment.fill_checksum_v6(src, dst);
        assert_eq!(segment.checksum(), 0xb6d4, "scapy's value");
        // A rewritten destination: the incremental update equals a full recompute.
        let new_dst = a("2001:db8:ffff::10");
        segment.update_checksum128(dst, new_dst);
        let incremental = segment.checksum();
        assert!(segment.verify_checksum_v6(src, new_dst));
        segment.fill_checksum_v6(src, new_dst);
        assert_eq!(segment.checksum(), incremental);
    }

    #[test]
    fn udp_checksum_over_ipv6_matches_scapy() {
        use crate::wire::udp;
        let mut buf = UDP;
        let mut datagram = udp::Packet::new_checked(&mut buf[40..]).unwrap();
        let (src, dst) = (a("2001:db8::1"), a("2001:db8::2"));
        assert!(datagram.verify_checksum_v6(src, dst));
        datagram.set_checksum(0);
        assert!(
            !datagram.verify_checksum_v6(src, dst),
            "zero is not allowed"
        );
        datagram.fill_checksum_v6(src, dst);
        assert_eq!(datagram.checksum(), 0x0f1d, "scapy's value");
        let new_src = a("64:ff9b::c612:1");
        datagram.update_checksum128(src, new_src);
        let incremental = datagram.checksum();
        datagram.fill_checksum_v6(new_src, dst);
        assert_eq!(datagram.checksum(), incremental);
        assert!(datagram.verify_checksum_v6(new_src, dst));
    }

    #[test]
    fn plain_packet_has_no_extension_headers() {
        let packet = Packet::new_checked(&UDP[..]).unwrap();
        assert_eq!(
            packet.upper_layer().unwrap(),
            UpperLayer {
                protocol: IpProtocol::UDP,
                offset: HEADER_LEN,
                ext_headers: 0,
                fragment: None,
            }
        );
    }

    #[test]
    fn first_fragment_is_walked_and_reported() {
        let packet = Packet::new_checked(&UDP_FIRST_FRAGMENT[..]).unwrap();
        let upper = packet.upper_layer().unwrap();
        assert_eq!((upper.protocol, upper.offset), (IpProtocol::UDP, 48));
        assert_eq!(
            upper.fragment,
            Some(Fragment {
                ident: 0xdead_beef,
                more_frags: true,
            })
        );
        // The last fragment, and a middle one: offset 1 (8 bytes), with and without M.
        for flags in [[0x00, 0x08], [0x00, 0x09], [0xff, 0xf8]] {
            let mut later = UDP_FIRST_FRAGMENT;
            later[42..44].copy_from_slice(&flags);
            assert_eq!(
                Packet::new_checked(&later[..]).unwrap().upper_layer(),
                Err(ExtHeaderError::NonFirstFragment),
                "{flags:?}"
            );
        }
        // An atomic fragment (offset 0, no M) is whole, and says so.
        let mut atomic = UDP_FIRST_FRAGMENT;
        atomic[43] = 0;
        let upper = Packet::new_checked(&atomic[..])
            .unwrap()
            .upper_layer()
            .unwrap();
        assert_eq!(
            upper.fragment,
            Some(Fragment {
                ident: 0xdead_beef,
                more_frags: false,
            })
        );
    }

    #[test]
    fn authentication_header_is_crossed_by_its_own_length_unit() {
        let packet = Packet::new_checked(&TCP_AH[..]).unwrap();
        let upper = packet.upper_layer().unwrap();
        assert_eq!(
            (upper.protocol, upper.offset, upper.ext_headers),
            (IpProtocol::TCP, 64, 1)
        );
        assert_eq!(&TCP_AH[64..66], &40000u16.to_be_bytes());
    }

    #[test]
    fn esp_and_no_next_header_end_the_walk() {
        for (value, name) in [(ext::ESP, "esp"), (ext::NO_NEXT_HEADER, "none")] {
            let mut packet = TCP_SYN_EXT;
            packet[56] = value.0; // the routing header's next header
            let upper = Packet::new_checked(&packet[..])
                .unwrap()
                .upper_layer()
                .unwrap();
            assert_eq!((upper.protocol, upper.offset), (value, 64), "{name}");
        }
    }

    #[test]
    fn every_cut_of_the_chain_is_truncated() {
        let payload = payload_of(&TCP_SYN_EXT);
        for len in 0..24 {
            assert_eq!(
                walk_extension_headers(ext::HOP_BY_HOP, &payload[..len]),
                Err(ExtHeaderError::Truncated),
                "len {len}"
            );
        }
        // The chain is complete at 24 bytes even if the upper layer is not there.
        let upper = walk_extension_headers(ext::HOP_BY_HOP, &payload[..24]).unwrap();
        assert_eq!((upper.protocol, upper.offset), (IpProtocol::TCP, 24));
        let payload = payload_of(&UDP_FIRST_FRAGMENT);
        for len in 0..8 {
            assert_eq!(
                walk_extension_headers(ext::FRAGMENT, &payload[..len]),
                Err(ExtHeaderError::Truncated),
                "fragment header cut at {len}"
            );
        }
        let payload = payload_of(&TCP_AH);
        for len in 0..24 {
            assert_eq!(
                walk_extension_headers(ext::AUTH, &payload[..len]),
                Err(ExtHeaderError::Truncated),
                "authentication header cut at {len}"
            );
        }
    }

    /// A chain of `count` 8-byte destination options headers (one 4-byte PadN each)
    /// followed by an 8-byte UDP header.
    fn destination_options_chain(count: usize) -> Vec<u8> {
        let mut chain = Vec::new();
        for i in 0..count {
            let next = if i + 1 == count {
                17
            } else {
                ext::DEST_OPTIONS.0
            };
            chain.extend_from_slice(&[next, 0, OPTION_PADN, 4, 0, 0, 0, 0]);
        }
        chain.extend_from_slice(&[0x04, 0xd2, 0x00, 0x35, 0x00, 0x08, 0x00, 0x00]);
        chain
    }

    #[test]
    fn the_bound_on_extension_headers() {
        let chain = destination_options_chain(MAX_EXTENSION_HEADERS);
        let upper = walk_extension_headers(ext::DEST_OPTIONS, &chain).unwrap();
        assert_eq!(upper.protocol, IpProtocol::UDP);
        assert_eq!(upper.offset, 8 * MAX_EXTENSION_HEADERS);
        assert_eq!(upper.ext_headers as usize, MAX_EXTENSION_HEADERS);
        let chain = destination_options_chain(MAX_EXTENSION_HEADERS + 1);
        assert_eq!(
            walk_extension_headers(ext::DEST_OPTIONS, &chain),
            Err(ExtHeaderError::TooManyHeaders)
        );
    }

    #[test]
    fn hop_by_hop_only_first() {
        let mut packet = TCP_SYN_EXT;
        packet[40] = ext::HOP_BY_HOP.0; // hop-by-hop's next header: hop-by-hop again
        assert_eq!(
            Packet::new_checked(&packet[..]).unwrap().upper_layer(),
            Err(ExtHeaderError::HopByHopNotFirst)
        );
    }

    #[test]
    fn options_by_their_action_bits() {
        // Byte 42 is the router alert option's type (0x05, action 00: skip).
        for (kind, expect) in [
            (0x05, Ok(IpProtocol::TCP)),
            (0x1e, Ok(IpProtocol::TCP)), // unknown, action 00: skipped
            (0x45, Err(ExtHeaderError::UnrecognizedOption)), // 01: discard
            (0x85, Err(ExtHeaderError::UnrecognizedOption)), // 10: discard, ICMP
            (0xc2, Err(ExtHeaderError::UnrecognizedOption)), // jumbo payload
        ] {
            let mut packet = TCP_SYN_EXT;
            packet[42] = kind;
            let got = Packet::new_checked(&packet[..])
                .unwrap()
                .upper_layer()
                .map(|u| u.protocol);
            assert_eq!(got, expect, "option type {kind:#04x}");
        }
        // The destination options' PadN claims one byte more than its header holds.
        let mut packet = TCP_SYN_EXT;
        packet[51] = 5;
        assert_eq!(
            Packet::new_checked(&packet[..]).unwrap().upper_layer(),
            Err(ExtHeaderError::MalformedOption)
        );
        // An option type in the last byte, without its length.
        let mut packet = TCP_SYN_EXT;
        packet[46..48].copy_from_slice(&[0x00, 0x01]); // Pad1, then a bare PadN type
        assert_eq!(
            Packet::new_checked(&packet[..]).unwrap().upper_layer(),
            Err(ExtHeaderError::MalformedOption)
        );
        // Pad1 throughout is fine.
        let mut packet = TCP_SYN_EXT;
        packet[50..56].fill(OPTION_PAD1);
        assert!(Packet::new_checked(&packet[..])
            .unwrap()
            .upper_layer()
            .is_ok());
    }

    #[test]
    fn routing_header_with_segments_left() {
        let mut packet = TCP_SYN_EXT;
        packet[59] = 1;
        assert_eq!(
            Packet::new_checked(&packet[..]).unwrap().upper_layer(),
            Err(ExtHeaderError::RoutingSegmentsLeft)
        );
    }

    #[test]
    fn walk_never_panics_and_stays_inside() {
        let mut rng = crate::wire::test_util::XorShift(0x5eed_1234_abcd_0001);
        let firsts = [0u8, 43, 44, 50, 51, 59, 60, 6, 17, 58];
        let mut buf = [0u8; 96];
        let mut ok = 0;
        for _ in 0..50_000 {
            let len = rng.below(buf.len() + 1);
            rng.fill(&mut buf[..len]);
            // Bias next-header bytes toward extension headers so chains get long.
            for at in (0..len).step_by(8) {
                if rng.next_u64() & 1 == 0 {
                    buf[at] = firsts[rng.below(firsts.len())];
                    if at + 1 < len {
                        buf[at + 1] &= 0x01;
                    }
                }
            }
            let first = IpProtocol(firsts[rng.below(firsts.len())]);
            if let Ok(upper) = walk_extension_headers(first, &buf[..len]) {
                assert!(upper.offset <= len);
                assert!(upper.ext_headers as usize <= MAX_EXTENSION_HEADERS);
                ok += 1;
            }
        }
        assert!(ok > 0, "some random chains walk to the end");
    }

    #[test]
    fn header_errors() {
        let check = |buf: &[u8]| Packet::new_checked(buf).err();
        for len in 0..UDP.len() {
            assert_eq!(check(&UDP[..len]), Some(WireError::Truncated), "len {len}");
        }
        let mut version4 = UDP;
        version4[0] = 0x45;
        assert_eq!(check(&version4), Some(WireError::Malformed));
        // Ethernet padding after the payload is outside the packet.
        let mut padded = [0xeeu8; 70];
        padded[..60].copy_from_slice(&UDP);
        let packet = Packet::new_checked(&padded[..]).unwrap();
        assert_eq!(packet.payload(), &UDP[40..]);
    }

    #[test]
    fn setters_keep_their_neighbours() {
        let mut buf = TCP_SYN_EXT;
        let mut packet = Packet::new_checked(&mut buf[..]).unwrap();
        packet.set_traffic_class(0x03);
        assert_eq!((packet.version(), packet.flow_label()), (6, 0x12345));
        packet.set_flow_label(0xfffff);
        assert_eq!((packet.version(), packet.traffic_class()), (6, 0x03));
        packet.set_flow_label(0x1_00001); // only 20 bits are kept
        assert_eq!(packet.flow_label(), 1);
        packet.set_hop_limit(1);
        packet.set_src_addr(a("2001:db8::2"));
        packet.set_dst_addr(a("2001:db8::1"));
        packet.set_next_header(IpProtocol::TCP);
        packet.set_payload_len(20);
        packet.payload_mut()[0] = 0xaa;
        assert_eq!(buf[..8], [0x60, 0x30, 0x00, 0x01, 0x00, 0x14, 0x06, 0x01]);
        assert_eq!(buf[8..24], a("2001:db8::2").octets());
        assert_eq!(buf[24..40], a("2001:db8::1").octets());
        assert_eq!(buf[40], 0xaa);
    }

    #[test]
    fn repr_round_trip_matches_scapy() {
        let packet = Packet::new_checked(&UDP[..]).unwrap();
        let repr = Repr::parse(&packet).unwrap();
        assert_eq!(
            repr,
            Repr {
                src_addr: a("2001:db8::1"),
                dst_addr: a("2001:db8::2"),
                next_header: IpProtocol::UDP,
                payload_len: 20,
                hop_limit: DEFAULT_HOP_LIMIT,
            }
        );
        let mut buf = [0xffu8; 60];
        buf[40..].copy_from_slice(&UDP[40..]);
        repr.emit(&mut Packet::new_unchecked(&mut buf[..]));
        assert_eq!(buf, UDP);
        assert_eq!(repr.buffer_len(), HEADER_LEN);
    }

    #[test]
    fn solicited_node_address() {
        // scapy: in6_getnsma(inet_pton(AF_INET6, "2001:db8::1:2345:6789"))
        // -> ff02::1:ff45:6789
        assert_eq!(
            solicited_node(a("2001:db8::1:2345:6789")),
            a("ff02::1:ff45:6789")
        );
        assert_eq!(solicited_node(a("2001:db8::2")), a("ff02::1:ff00:2"));
        assert!(solicited_node(a("fe80::ffff:ffff")).is_multicast());
    }

    #[test]
    fn martian_sources_are_the_ones_no_single_host_sends_from() {
        for martian in ["::", "::1", "ff02::1", "ff0e::1:2"] {
            assert!(is_martian_source(a(martian)), "{martian}");
        }
        for host in ["2001:db8::1", "fe80::1", "::ffff:198.18.0.1", "fc00::1"] {
            assert!(!is_martian_source(a(host)), "{host}");
        }
    }
}
