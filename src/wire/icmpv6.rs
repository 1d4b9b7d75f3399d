//! ICMPv6 (RFC 4443) and the Neighbor Discovery messages Sluice speaks (RFC 4861):
//! views, the checks RFC 4861 asks of a received Neighbor Solicitation,
//! Advertisement or Router Advertisement, and writers for the frames Sluice sends.
//!
//! The view covers the whole message, since the checksum spans it all (with the
//! IPv6 pseudo-header, RFC 4443 section 2.3): the buffer must end where the IPv6
//! payload ends.

use core::fmt;
use std::net::Ipv6Addr;

use super::checksum;
use super::ethernet::{self, EtherType, MacAddr};
use super::ipv6::{self, addr_at};
use super::{read_u16, read_u32, write_u16, write_u32, IpProtocol, WireError};

/// ICMPv6 message types Sluice names; others pass through as numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Message(pub u8);

impl Message {
    pub const DEST_UNREACHABLE: Message = Message(1);
    pub const PACKET_TOO_BIG: Message = Message(2);
    pub const TIME_EXCEEDED: Message = Message(3);
    pub const PARAMETER_PROBLEM: Message = Message(4);
    pub const ECHO_REQUEST: Message = Message(128);
    pub const ECHO_REPLY: Message = Message(129);
    pub const ROUTER_SOLICIT: Message = Message(133);
    pub const ROUTER_ADVERT: Message = Message(134);
    pub const NEIGHBOR_SOLICIT: Message = Message(135);
    pub const NEIGHBOR_ADVERT: Message = Message(136);
    pub const REDIRECT: Message = Message(137);

    /// An error message, which quotes the packet that caused it (types 0 to 127,
    /// RFC 4443 section 2.1). Never sent in answer to another error.
    pub const fn is_error(self) -> bool {
        self.0 < 128
    }

    /// A Neighbor Discovery message (RFC 4861 section 4): router solicitation and
    /// advertisement, neighbor solicitation and advertisement, redirect.
    pub const fn is_ndisc(self) -> bool {
        matches!(self.0, 133..=137)
    }
}

/// Destination-unreachable codes (RFC 4443 section 3.1).
pub mod unreachable {
    pub const NO_ROUTE: u8 = 0;
    pub const ADMIN_PROHIBITED: u8 = 1;
    pub const ADDRESS: u8 = 3;
    pub const PORT: u8 = 4;
}

/// Time-exceeded code: hop limit exceeded in transit (RFC 4443 section 3.3).
pub const CODE_HOP_LIMIT_EXCEEDED: u8 = 0;

mod field {
    use core::ops::Range;

    pub const TYPE: usize = 0;
    pub const CODE: usize = 1;
    pub const CHECKSUM: usize = 2;
    /// The second header word: echo identifier and sequence number, the MTU of a
    /// packet-too-big, the pointer of a parameter problem, unused otherwise.
    pub const ECHO_IDENT: usize = 4;
    pub const ECHO_SEQ_NO: usize = 6;
    pub const PARAM: usize = 4;
    pub const DATA: usize = 8;
    /// Neighbor advertisement flags (R, S, O), then 29 reserved bits.
    pub const NA_FLAGS: usize = 4;
    /// Neighbor solicitation and advertisement: target address, then options.
    pub const TARGET: Range<usize> = 8..24;
    pub const NS_NA_OPTIONS: usize = 24;
    /// Router advertisement: current hop limit, M/O flags, router lifetime, reachable
    /// time, retransmit timer, then options.
    pub const RA_CUR_HOP_LIMIT: usize = 4;
    pub const RA_ROUTER_LIFETIME: usize = 6;
    pub const RA_OPTIONS: usize = 16;
}

/// Length of the ICMPv6 header: type, code, checksum and the 4-byte second word
/// every message Sluice handles has.
pub const HEADER_LEN: usize = field::DATA;
/// Length of a neighbor solicitation or advertisement without options.
pub const NS_NA_LEN: usize = field::NS_NA_OPTIONS;
/// Length of a router advertisement without options.
pub const RA_LEN: usize = field::RA_OPTIONS;
/// Neighbor Discovery messages are sent, and must be received, with this hop limit,
/// which proves they come from the link (RFC 4861 section 7.1).
pub const NDISC_HOP_LIMIT: u8 = 255;
/// Most bytes of the invoking packet an error quotes: the error must fit in the
/// minimum MTU (RFC 4443 section 2.4 (c)).
pub const MAX_QUOTED_LEN: usize = ipv6::MIN_MTU - ipv6::HEADER_LEN - HEADER_LEN;

/// Neighbor advertisement flags (RFC 4861 section 4.4).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct NaFlags(pub u8);

impl NaFlags {
    /// The sender is a router.
    pub const ROUTER: NaFlags = NaFlags(0x80);
    /// Sent in answer to a solicitation.
    pub const SOLICITED: NaFlags = NaFlags(0x40);
    /// Replace a cached link-layer address.
    pub const OVERRIDE: NaFlags = NaFlags(0x20);

    pub const fn empty() -> NaFlags {
        NaFlags(0)
    }

    /// Every flag in `other` is set.
    pub const fn contains(self, other: NaFlags) -> bool {
        self.0 & other.0 == other.0
    }

    pub const fn union(self, other: NaFlags) -> NaFlags {
        NaFlags(self.0 | other.0)
    }
}

/// Neighbor Discovery option types (RFC 4861 section 4.6).
pub mod option {
    pub const SOURCE_LLADDR: u8 = 1;
    pub const TARGET_LLADDR: u8 = 2;
    pub const PREFIX_INFO: u8 = 3;
    pub const REDIRECTED_HEADER: u8 = 4;
    pub const MTU: u8 = 5;
    /// A link-layer address option for Ethernet: type, length 1 (8 bytes), MAC.
    pub const LLADDR_LEN: usize = 8;
}

/// A view of an ICMPv6 message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps `buffer` without checks; accessors panic if it is shorter than what they
    /// read (8 bytes, 24 for the target address).
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps `buffer` after checking it holds the 8-byte header. The target address
    /// of a neighbor message needs 24 bytes: [`NdiscRepr::parse`] checks that.
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

    /// The MTU of a packet-too-big message.
    pub fn mtu(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::PARAM)
    }

    /// The pointer of a parameter-problem message: the offset in the invoking packet
    /// of the field at fault.
    pub fn pointer(&self) -> u32 {
        read_u32(self.buffer.as_ref(), field::PARAM)
    }

    /// Everything after the 8-byte header.
    pub fn data(&self) -> &[u8] {
        &self.buffer.as_ref()[field::DATA..]
    }

    /// What an error message quotes of the packet that caused it, starting with its
    /// IPv6 header and usually cut short (view it with `ipv6::Packet::new_unchecked`
    /// and walk it with `ipv6::walk_extension_headers`, since its payload length
    /// counts bytes that are not there). `None` for informational messages.
    pub fn invoking_packet(&self) -> Option<&[u8]> {
        self.msg_type().is_error().then(|| self.data())
    }

    /// The target address of a neighbor solicitation or advertisement (or redirect).
    pub fn target_addr(&self) -> Ipv6Addr {
        addr_at(self.buffer.as_ref(), field::TARGET.start)
    }

    /// The flags of a neighbor advertisement.
    pub fn na_flags(&self) -> NaFlags {
        NaFlags(self.buffer.as_ref()[field::NA_FLAGS] & 0xe0)
    }

    /// The checksum over pseudo-header and message is correct, for a message from
    /// `src` to `dst`.
    pub fn verify_checksum(&self, src: Ipv6Addr, dst: Ipv6Addr) -> bool {
        let data = self.buffer.as_ref();
        let pseudo =
            checksum::pseudo_header_sum_v6(src, dst, IpProtocol::ICMPV6.0, data.len() as u32);
        checksum::fold(pseudo + checksum::sum(data)) == 0xffff
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

    /// Writes the second header word: the MTU of a packet-too-big, the pointer of a
    /// parameter problem, zero for the other errors.
    pub fn set_param(&mut self, value: u32) {
        write_u32(self.buffer.as_mut(), field::PARAM, value);
    }

    pub fn set_target_addr(&mut self, addr: Ipv6Addr) {
        self.buffer.as_mut()[field::TARGET].copy_from_slice(&addr.octets());
    }

    /// Writes the neighbor advertisement flags and clears the reserved bits.
    pub fn set_na_flags(&mut self, flags: NaFlags) {
        write_u32(
            self.buffer.as_mut(),
            field::NA_FLAGS,
            (flags.0 as u32) << 24,
        );
    }

    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.buffer.as_mut()[field::DATA..]
    }

    /// Recomputes the checksum over pseudo-header and the whole message.
    pub fn fill_checksum(&mut self, src: Ipv6Addr, dst: Ipv6Addr) {
        self.set_checksum(0);
        let data = self.buffer.as_ref();
        let pseudo =
            checksum::pseudo_header_sum_v6(src, dst, IpProtocol::ICMPV6.0, data.len() as u32);
        let value = checksum::finish(pseudo + checksum::sum(data));
        self.set_checksum(value);
    }

    /// Turns an echo request into its reply in place: type 129, same identifier,
    /// sequence and data. The checksum is adjusted incrementally (RFC 1624): only the
    /// type changes, and swapping source and destination leaves the pseudo-header sum
    /// as it was. (The pseudo-header is never all zeros, so the sum is never +0 and
    /// the update always agrees with a full recompute.)
    pub fn echo_request_to_reply(&mut self) {
        let old_word = read_u16(self.buffer.as_ref(), field::TYPE);
        self.set_msg_type(Message::ECHO_REPLY);
        let new_word = read_u16(self.buffer.as_ref(), field::TYPE);
        let value = checksum::update16(self.checksum(), old_word, new_word);
        self.set_checksum(value);
    }
}

/// Why a Neighbor Discovery message is not acted on. Each is one reason a parser can
/// count a drop under.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NdiscError {
    /// A hop limit other than 255: the message may come from off the link (RFC 4861
    /// section 7.1.1), so it is ignored.
    HopLimit,
    /// Shorter than the fixed part of its message type.
    Truncated,
    /// The ICMPv6 checksum does not verify.
    BadChecksum,
    /// Breaks a rule of RFC 4861 sections 6.1 and 7.1: a non-zero code, an option of
    /// length zero or running past the message, a link-layer address option not 8
    /// bytes long, a multicast target, a solicitation from the unspecified address
    /// that is not sent to a solicited-node address or carries a source link-layer
    /// address, a solicited advertisement sent to a multicast address, a router
    /// advertisement from other than a link-local address.
    Malformed,
    /// Router solicitations and redirects, which Sluice neither answers nor follows.
    Unsupported,
}

impl fmt::Display for NdiscError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NdiscError::HopLimit => "neighbor discovery hop limit not 255",
            NdiscError::Truncated => "truncated neighbor discovery message",
            NdiscError::BadChecksum => "bad ICMPv6 checksum",
            NdiscError::Malformed => "malformed neighbor discovery message",
            NdiscError::Unsupported => "unsupported neighbor discovery message",
        })
    }
}

impl std::error::Error for NdiscError {}

/// A checked Neighbor Discovery message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NdiscRepr {
    NeighborSolicit {
        target: Ipv6Addr,
        /// The solicitor's MAC; never present in duplicate address detection (from
        /// the unspecified address).
        source_lladdr: Option<MacAddr>,
    },
    NeighborAdvert {
        flags: NaFlags,
        target: Ipv6Addr,
        target_lladdr: Option<MacAddr>,
    },
    /// Parsed only so far as to check it and pass it by: Sluice takes no
    /// configuration from routers.
    RouterAdvert {
        cur_hop_limit: u8,
        router_lifetime_secs: u16,
        source_lladdr: Option<MacAddr>,
    },
}

impl NdiscRepr {
    /// Checks and parses a neighbor solicitation, neighbor advertisement or router
    /// advertisement that arrived from `src` to `dst` with `hop_limit`, following
    /// RFC 4861 sections 6.1.2, 7.1.1 and 7.1.2. Options other than the link-layer
    /// addresses are checked for their length and otherwise skipped; the first
    /// link-layer address option of the right kind counts.
    pub fn parse<T: AsRef<[u8]>>(
        packet: &Packet<T>,
        src: Ipv6Addr,
        dst: Ipv6Addr,
        hop_limit: u8,
    ) -> Result<NdiscRepr, NdiscError> {
        let data = packet.buffer.as_ref();
        let msg_type = Message(*data.first().ok_or(NdiscError::Truncated)?);
        let fixed_len = match msg_type {
            Message::NEIGHBOR_SOLICIT | Message::NEIGHBOR_ADVERT => NS_NA_LEN,
            Message::ROUTER_ADVERT => RA_LEN,
            _ => return Err(NdiscError::Unsupported),
        };
        if hop_limit != NDISC_HOP_LIMIT {
            return Err(NdiscError::HopLimit);
        }
        if data.len() < fixed_len {
            return Err(NdiscError::Truncated);
        }
        if !packet.verify_checksum(src, dst) {
            return Err(NdiscError::BadChecksum);
        }
        if packet.msg_code() != 0 {
            return Err(NdiscError::Malformed);
        }
        let options = &data[fixed_len..];
        match msg_type {
            Message::NEIGHBOR_SOLICIT => {
                let target = packet.target_addr();
                let source_lladdr = lladdr_option(options, option::SOURCE_LLADDR)?;
                let dad = src.is_unspecified();
                if target.is_multicast()
                    || (dad && (dst != ipv6::solicited_node(target) || source_lladdr.is_some()))
                {
                    return Err(NdiscError::Malformed);
                }
                Ok(NdiscRepr::NeighborSolicit {
                    target,
                    source_lladdr,
                })
            }
            Message::NEIGHBOR_ADVERT => {
                let flags = packet.na_flags();
                let target = packet.target_addr();
                let target_lladdr = lladdr_option(options, option::TARGET_LLADDR)?;
                if target.is_multicast()
                    || (dst.is_multicast() && flags.contains(NaFlags::SOLICITED))
                {
                    return Err(NdiscError::Malformed);
                }
                Ok(NdiscRepr::NeighborAdvert {
                    flags,
                    target,
                    target_lladdr,
                })
            }
            _ => {
                let source_lladdr = lladdr_option(options, option::SOURCE_LLADDR)?;
                if !is_link_local(src) {
                    return Err(NdiscError::Malformed);
                }
                Ok(NdiscRepr::RouterAdvert {
                    cur_hop_limit: data[field::RA_CUR_HOP_LIMIT],
                    router_lifetime_secs: read_u16(data, field::RA_ROUTER_LIFETIME),
                    source_lladdr,
                })
            }
        }
    }
}

/// fe80::/10 (`Ipv6Addr::is_unicast_link_local` is not stable on this toolchain).
fn is_link_local(addr: Ipv6Addr) -> bool {
    addr.segments()[0] & 0xffc0 == 0xfe80
}

/// Checks every option's length and returns the first Ethernet link-layer address
/// option of type `kind`.
fn lladdr_option(mut options: &[u8], kind: u8) -> Result<Option<MacAddr>, NdiscError> {
    let mut found = None;
    while !options.is_empty() {
        let Some(&[opt_kind, units]) = options.get(..2) else {
            return Err(NdiscError::Malformed);
        };
        let len = units as usize * 8;
        if len == 0 || len > options.len() {
            return Err(NdiscError::Malformed);
        }
        if opt_kind == option::SOURCE_LLADDR || opt_kind == option::TARGET_LLADDR {
            if len != option::LLADDR_LEN {
                return Err(NdiscError::Malformed);
            }
            if opt_kind == kind && found.is_none() {
                found = Some(MacAddr::from_bytes(&options[2..8]));
            }
        }
        options = &options[len..];
    }
    Ok(found)
}

/// Length of a neighbor solicitation or advertisement frame Sluice writes, from the
/// IPv6 header: the message with one link-layer address option.
pub const NDISC_PACKET_LEN: usize = ipv6::HEADER_LEN + NS_NA_LEN + option::LLADDR_LEN;

/// The frame-level fields of a neighbor message Sluice writes.
struct NdiscFrame {
    eth_src: MacAddr,
    eth_dst: MacAddr,
    ip_src: Ipv6Addr,
    ip_dst: Ipv6Addr,
    msg_type: Message,
    flags: NaFlags,
    target: Ipv6Addr,
    /// Source link-layer address option for a solicitation, target for an
    /// advertisement, carrying `eth_src`.
    option_kind: u8,
}

/// Writes the Ethernet addresses and the innermost EtherType, keeping any VLAN tags
/// before `l3`.
fn write_l2(frame: &mut [u8], l3: usize, src: MacAddr, dst: MacAddr) {
    let mut eth = ethernet::Frame::new_unchecked(&mut frame[..]);
    eth.set_dst_addr(dst);
    eth.set_src_addr(src);
    frame[l3 - 2..l3].copy_from_slice(&EtherType::IPV6.0.to_be_bytes());
}

impl NdiscFrame {
    fn write(&self, frame: &mut [u8], l3: usize) -> Option<usize> {
        let end = l3 + NDISC_PACKET_LEN;
        if frame.len() < end || l3 < ethernet::HEADER_LEN {
            return None;
        }
        write_l2(frame, l3, self.eth_src, self.eth_dst);
        let (ip, message) = frame[l3..end].split_at_mut(ipv6::HEADER_LEN);
        ipv6::Repr {
            src_addr: self.ip_src,
            dst_addr: self.ip_dst,
            next_header: IpProtocol::ICMPV6,
            payload_len: message.len(),
            hop_limit: NDISC_HOP_LIMIT,
        }
        .emit(&mut ipv6::Packet::new_unchecked(ip));
        let mut packet = Packet::new_unchecked(message);
        packet.set_msg_type(self.msg_type);
        packet.set_msg_code(0);
        packet.set_na_flags(self.flags);
        packet.set_target_addr(self.target);
        let opt = &mut packet.data_mut()[NS_NA_LEN - HEADER_LEN..];
        opt[0] = self.option_kind;
        opt[1] = 1;
        opt[2..8].copy_from_slice(&self.eth_src.0);
        packet.fill_checksum(self.ip_src, self.ip_dst);
        Some(end)
    }
}

/// Rewrites `frame` into the neighbor advertisement that answers a solicitation for
/// `target` (one of ours) from `solicitor` at `solicitor_mac`, keeping any VLAN tags
/// before `l3`: override set, our MAC `mac` as target link-layer address, `router`
/// when Sluice routes for the solicitor. A solicitation from the unspecified address
/// (duplicate address detection) is answered to all nodes without the solicited flag
/// (RFC 4861 section 7.2.4); any other is answered to the solicitor, solicited.
/// Returns the new frame length, or None when the buffer is too short.
pub fn write_solicited_advert(
    frame: &mut [u8],
    l3: usize,
    mac: MacAddr,
    target: Ipv6Addr,
    solicitor: Ipv6Addr,
    solicitor_mac: MacAddr,
    router: bool,
) -> Option<usize> {
    let mut flags = NaFlags::OVERRIDE;
    if router {
        flags = flags.union(NaFlags::ROUTER);
    }
    let (ip_dst, eth_dst) = if solicitor.is_unspecified() {
        (ipv6::ALL_NODES, MacAddr::ipv6_multicast(ipv6::ALL_NODES))
    } else {
        flags = flags.union(NaFlags::SOLICITED);
        (solicitor, solicitor_mac)
    };
    NdiscFrame {
        eth_src: mac,
        eth_dst,
        ip_src: target,
        ip_dst,
        msg_type: Message::NEIGHBOR_ADVERT,
        flags,
        target,
        option_kind: option::TARGET_LLADDR,
    }
    .write(frame, l3)
}

/// Rewrites `frame` into an unsolicited neighbor advertisement of `target` at `mac`
/// to all nodes, override set (RFC 4861 section 7.2.6), as sent when Sluice takes
/// over an address. Returns the new frame length, or None when the buffer is too
/// short.
pub fn write_unsolicited_advert(
    frame: &mut [u8],
    l3: usize,
    mac: MacAddr,
    target: Ipv6Addr,
    router: bool,
) -> Option<usize> {
    let mut flags = NaFlags::OVERRIDE;
    if router {
        flags = flags.union(NaFlags::ROUTER);
    }
    NdiscFrame {
        eth_src: mac,
        eth_dst: MacAddr::ipv6_multicast(ipv6::ALL_NODES),
        ip_src: target,
        ip_dst: ipv6::ALL_NODES,
        msg_type: Message::NEIGHBOR_ADVERT,
        flags,
        target,
        option_kind: option::TARGET_LLADDR,
    }
    .write(frame, l3)
}

/// Rewrites `frame` into a neighbor solicitation for `target` from (`mac`, `src`)
/// with our source link-layer address. Address resolution (`known_mac` None) sends it
/// to the target's solicited-node group and its 33:33:ff:xx:xx:xx MAC; reachability
/// confirmation (`known_mac` the cached MAC) sends it to the target itself (RFC 4861
/// section 7.2.2). Returns the new frame length, or None when the buffer is too
/// short.
pub fn write_solicit(
    frame: &mut [u8],
    l3: usize,
    mac: MacAddr,
    src: Ipv6Addr,
    target: Ipv6Addr,
    known_mac: Option<MacAddr>,
) -> Option<usize> {
    let (ip_dst, eth_dst) = match known_mac {
        Some(known) => (target, known),
        None => {
            let group = ipv6::solicited_node(target);
            (group, MacAddr::ipv6_multicast(group))
        }
    };
    NdiscFrame {
        eth_src: mac,
        eth_dst,
        ip_src: src,
        ip_dst,
        msg_type: Message::NEIGHBOR_SOLICIT,
        flags: NaFlags::empty(),
        target,
        option_kind: option::SOURCE_LLADDR,
    }
    .write(frame, l3)
}

/// Rewrites a frame holding an ICMPv6 echo request into its reply from `mac`, in
/// place: Ethernet addresses swapped (VLAN tags kept), IPv6 addresses swapped, hop
/// limit 64, type 129. `l3` is where the IPv6 header starts and `icmp` where the
/// echo request starts (after any extension headers, which the reply drops: the
/// message moves up to follow the fixed header). Returns the new frame length, or
/// None when the frame is not a checked IPv6 packet holding an echo request at
/// `icmp`. Checking that the request is for us and its checksum is the caller's.
pub fn write_echo_reply(frame: &mut [u8], l3: usize, icmp: usize, mac: MacAddr) -> Option<usize> {
    if l3 < ethernet::HEADER_LEN || icmp < l3 + ipv6::HEADER_LEN || frame.len() < icmp {
        return None;
    }
    let packet = ipv6::Packet::new_checked(&frame[l3..]).ok()?;
    let end = l3 + ipv6::HEADER_LEN + packet.payload_len() as usize;
    let (peer, ours) = (packet.src_addr(), packet.dst_addr());
    if icmp + HEADER_LEN > end || !Packet::new_unchecked(&frame[icmp..end]).is_echo_request() {
        return None;
    }
    let peer_mac = ethernet::Frame::new_unchecked(&frame[..]).src_addr();
    let message_len = end - icmp;
    let start = l3 + ipv6::HEADER_LEN;
    frame.copy_within(icmp..end, start);
    write_l2(frame, l3, mac, peer_mac);
    ipv6::Repr {
        src_addr: ours,
        dst_addr: peer,
        next_header: IpProtocol::ICMPV6,
        payload_len: message_len,
        hop_limit: ipv6::DEFAULT_HOP_LIMIT,
    }
    .emit(&mut ipv6::Packet::new_unchecked(&mut frame[l3..start]));
    Packet::new_unchecked(&mut frame[start..start + message_len]).echo_request_to_reply();
    Some(start + message_len)
}

/// Rewrites a frame holding an IPv6 packet (at `l3`) into the ICMPv6 error `msg`
/// (`code`, second word `param`) that answers it from (`mac`, `src`), in place: the
/// packet moves back to be quoted after the new headers, cut so that the error fits
/// both the minimum MTU and `frame` (the buffer's whole room, not just the received
/// frame), and goes back to the sender's MAC. Returns the new frame length.
///
/// None, and nothing written, when the buffer cannot hold the headers and the
/// quoted IPv6 header, the packet is not a checked IPv6 packet, or RFC 4443 section
/// 2.4 (e) forbids the error: the invoking packet is itself an ICMPv6 error, its
/// source is not one unicast node, or it went to a multicast group or a multicast
/// or broadcast MAC (except for
/// packet-too-big and a parameter problem with an unrecognised option, code 2).
pub fn write_error(
    frame: &mut [u8],
    l3: usize,
    mac: MacAddr,
    src: Ipv6Addr,
    msg: Message,
    code: u8,
    param: u32,
) -> Option<usize> {
    const HEADERS: usize = ipv6::HEADER_LEN + HEADER_LEN;
    if l3 < ethernet::HEADER_LEN || frame.len() < l3 + HEADERS + ipv6::HEADER_LEN {
        return None;
    }
    let invoking = ipv6::Packet::new_checked(&frame[l3..]).ok()?;
    let (peer, dst) = (invoking.src_addr(), invoking.dst_addr());
    if peer.is_unspecified() || peer.is_multicast() || peer.is_loopback() {
        return None;
    }
    let multicast_allowed = msg == Message::PACKET_TOO_BIG
        || (msg == Message::PARAMETER_PROBLEM && code == PARAM_PROBLEM_UNRECOGNIZED_OPTION);
    let to_group = ethernet::Frame::new_unchecked(&frame[..])
        .dst_addr()
        .is_multicast();
    if (dst.is_multicast() || to_group) && !multicast_allowed {
        return None;
    }
    if let Ok(upper) = invoking.upper_layer() {
        let quoted_type = invoking.payload().get(upper.offset - ipv6::HEADER_LEN);
        if upper.protocol == IpProtocol::ICMPV6 && quoted_type.is_some_and(|&t| t < 128) {
            return None;
        }
    }
    let invoking_len = ipv6::HEADER_LEN + invoking.payload_len() as usize;
    let quoted = invoking_len
        .min(MAX_QUOTED_LEN)
        .min(frame.len() - l3 - HEADERS);
    let peer_mac = ethernet::Frame::new_unchecked(&frame[..]).src_addr();
    let start = l3 + HEADERS;
    frame.copy_within(l3..l3 + quoted, start);
    write_l2(frame, l3, mac, peer_mac);
    let end = start + quoted;
    let (ip, message) = frame[l3..end].split_at_mut(ipv6::HEADER_LEN);
    ipv6::Repr {
        src_addr: src,
        dst_addr: peer,
        next_header: IpProtocol::ICMPV6,
        payload_len: message.len(),
        hop_limit: ipv6::DEFAULT_HOP_LIMIT,
    }
    .emit(&mut ipv6::Packet::new_unchecked(ip));
    let mut packet = Packet::new_unchecked(message);
    packet.set_msg_type(msg);
    packet.set_msg_code(code);
    packet.set_param(param);
    packet.fill_checksum(src, peer);
    Some(end)
}

/// Parameter-problem code "unrecognized IPv6 option encountered" (RFC 4443 section
/// 3.4), the one parameter problem that may answer a multicast packet.
pub const PARAM_PROBLEM_UNRECOGNIZED_OPTION: u8 = 2;

/// Rewrites a frame holding an IPv6 packet into the packet-too-big error that
/// answers it, with the `mtu` of the next link; see [`write_error`].
pub fn write_packet_too_big(
    frame: &mut [u8],
    l3: usize,
    mac: MacAddr,
    src: Ipv6Addr,
    mtu: u32,
) -> Option<usize> {
    write_error(frame, l3, mac, src, Message::PACKET_TOO_BIG, 0, mtu)
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1);
    const B: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2);
    const CMAC: MacAddr = MacAddr([0x52, 0x54, 0x00, 0x12, 0x34, 0x56]);
    const OMAC: MacAddr = MacAddr([0x02, 0x53, 0x4c, 0x00, 0x00, 0x01]);

    // Reference packets and frames built with scapy 2.5.0 (`from scapy.all import *`,
    // A="2001:db8::1", B="2001:db8::2", CMAC="52:54:00:12:34:56",
    // OMAC="02:53:4c:00:00:01"), printed with `bytes(...)`; scapy computed every
    // checksum and length.

    // IPv6(src=A,dst=B)/ICMPv6EchoRequest(id=0x1234,seq=7,data=b"abcdefgh")
    static ECHO_REQUEST: [u8; 56] = [
        0x60, 0x00, 0x00, 0x00, 0x00, 0x10, 0x3a, 0x40, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x80, 0x00, 0x80, 0x6f, 0x12,
        0x34, 0x00, 0x07, 0x61, 0x62, 0x63, 0x64, 0x65, 0x66, 0x67, 0x68,
    ];
    // IPv6(src=B,dst=A)/ICMPv6EchoReply(id=0x1234,seq=7,data=b"abcdefgh")
    static ECHO_REPLY: [u8; 56] = [
        0x60, 0x00, 0x00, 0x00, 0x00, 0x10, 0x3a, 0x40, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x81, 0x00, 0x7f, 0x6f, 0x12,
        0x34, 0x00, 0x07, 0x61, 0x62, 0x63, 0x64, 0x65, 0x66, 0x67, 0x68,
    ];
    // Ether(src=CMAC,dst="33:33:ff:00:00:02")/IPv6(src=A,dst="ff02::1:ff00:2",hlim=255)/ICMPv6ND_NS(tgt=B)/ICMPv6NDOptSrcLLAddr(lladdr=CMAC)
    static NS_FRAME: [u8; 86] = [
        0x33, 0x33, 0xff, 0x00, 0x00, 0x02, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x86, 0xdd, 0x60,
        0x00, 0x00, 0x00, 0x00, 0x20, 0x3a, 0xff, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0xff, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x01, 0xff, 0x00, 0x00, 0x02, 0x87, 0x00, 0x97, 0x6b, 0x00, 0x00,
        0x00, 0x00, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x02, 0x01, 0x01, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56,
    ];
    // Ether(src=OMAC,dst=CMAC)/IPv6(src=B,dst=A,hlim=255)/ICMPv6ND_NS(tgt=A)/ICMPv6NDOptSrcLLAddr(lladdr=OMAC)
    static NUD_NS_FRAME: [u8; 86] = [
        0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x02, 0x53, 0x4c, 0x00, 0x00, 0x01, 0x86, 0xdd, 0x60,
        0x00, 0x00, 0x00, 0x00, 0x20, 0x3a, 0xff, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x87, 0x00, 0xa0, 0x20, 0x00, 0x00,
        0x00, 0x00, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x01, 0x01, 0x01, 0x02, 0x53, 0x4c, 0x00, 0x00, 0x01,
    ];
    // Ether(src=OMAC,dst=CMAC)/IPv6(src=B,dst=A,hlim=255)/ICMPv6ND_NA(R=0,S=1,O=1,tgt=B)/ICMPv6NDOptDstLLAddr(lladdr=OMAC)
    static NA_REPLY_FRAME: [u8; 86] = [
        0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x02, 0x53, 0x4c, 0x00, 0x00, 0x01, 0x86, 0xdd, 0x60,
        0x00, 0x00, 0x00, 0x00, 0x20, 0x3a, 0xff, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x88, 0x00, 0x3e, 0x1f, 0x60, 0x00,
        0x00, 0x00, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x02, 0x02, 0x01, 0x02, 0x53, 0x4c, 0x00, 0x00, 0x01,
    ];
    // Ether(src=OMAC,dst="33:33:00:00:00:01")/IPv6(src=B,dst="ff02::1",hlim=255)/ICMPv6ND_NA(R=0,S=0,O=1,tgt=B)/ICMPv6NDOptDstLLAddr(lladdr=OMAC)
    static NA_UNSOLICITED_FRAME: [u8; 86] = [
        0x33, 0x33, 0x00, 0x00, 0x00, 0x01, 0x02, 0x53, 0x4c, 0x00, 0x00, 0x01, 0x86, 0xdd, 0x60,
        0x00, 0x00, 0x00, 0x00, 0x20, 0x3a, 0xff, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0xff, 0x02, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x88, 0x00, 0xac, 0xd5, 0x20, 0x00,
        0x00, 0x00, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x02, 0x02, 0x01, 0x02, 0x53, 0x4c, 0x00, 0x00, 0x01,
    ];
    // IPv6(src="::",dst="ff02::1:ff00:2",hlim=255)/ICMPv6ND_NS(tgt=B)
    static DAD_NS: [u8; 64] = [
        0x60, 0x00, 0x00, 0x00, 0x00, 0x18, 0x3a, 0xff, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xff, 0x02, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0xff, 0x00, 0x00, 0x02, 0x87, 0x00, 0x4c, 0xeb, 0x00,
        0x00, 0x00, 0x00, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x02,
    ];
    // IPv6(src=A,dst=B)/TCP(sport=40000,dport=80,flags="PA",seq=1,ack=1)/Raw(b"\xab"*20)
    static INVOKING: [u8; 80] = [
        0x60, 0x00, 0x00, 0x00, 0x00, 0x28, 0x06, 0x40, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x9c, 0x40, 0x00, 0x50, 0x00,
        0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x50, 0x18, 0x20, 0x00, 0xe2, 0xfc, 0x00, 0x00,
        0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab,
        0xab, 0xab, 0xab, 0xab, 0xab,
    ];
    // Ether(src=OMAC,dst=CMAC)/IPv6(src=B,dst=A,hlim=64)/ICMPv6PacketTooBig(mtu=1400)/Raw(bytes(IPv6(src=A,dst=B)/TCP(sport=40000,dport=80,flags="PA",seq=1,ack=1)/Raw(b"\xab"*20)))
    static PTB_FRAME: [u8; 142] = [
        0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x02, 0x53, 0x4c, 0x00, 0x00, 0x01, 0x86, 0xdd, 0x60,
        0x00, 0x00, 0x00, 0x00, 0x58, 0x3a, 0x40, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x02, 0x00, 0x36, 0x46, 0x00, 0x00,
        0x05, 0x78, 0x60, 0x00, 0x00, 0x00, 0x00, 0x28, 0x06, 0x40, 0x20, 0x01, 0x0d, 0xb8, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x20, 0x01, 0x0d, 0xb8,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x9c, 0x40, 0x00,
        0x50, 0x00, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x01, 0x50, 0x18, 0x20, 0x00, 0xe2, 0xfc,
        0x00, 0x00, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab,
        0xab, 0xab, 0xab, 0xab, 0xab, 0xab, 0xab,
    ];
    // IPv6(src=B,dst=A)/ICMPv6DestUnreach(code=4)/Raw(bytes(IPv6(src=A,dst=B)/UDP(sport=1234,dport=53)))
    static PORT_UNREACHABLE: [u8; 96] = [
        0x60, 0x00, 0x00, 0x00, 0x00, 0x38, 0x3a, 0x40, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x01, 0x04, 0x31, 0xe5, 0x00,
        0x00, 0x00, 0x00, 0x60, 0x00, 0x00, 0x00, 0x00, 0x08, 0x11, 0x40, 0x20, 0x01, 0x0d, 0xb8,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x20, 0x01, 0x0d,
        0xb8, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x04, 0xd2,
        0x00, 0x35, 0x00, 0x08, 0x9f, 0x62,
    ];
    // IPv6(src=B,dst=A)/ICMPv6TimeExceeded(code=0)/Raw(bytes(IPv6(src=A,dst=B,hlim=1)/UDP(sport=1234,dport=53)))
    static TIME_EXCEEDED: [u8; 96] = [
        0x60, 0x00, 0x00, 0x00, 0x00, 0x38, 0x3a, 0x40, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x03, 0x00, 0x30, 0x28, 0x00,
        0x00, 0x00, 0x00, 0x60, 0x00, 0x00, 0x00, 0x00, 0x08, 0x11, 0x01, 0x20, 0x01, 0x0d, 0xb8,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x20, 0x01, 0x0d,
        0xb8, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x04, 0xd2,
        0x00, 0x35, 0x00, 0x08, 0x9f, 0x62,
    ];
    // IPv6(src=B,dst=A)/ICMPv6ParamProblem(code=1,ptr=40)/Raw(bytes(IPv6(src=A,dst=B,nh=99)/Raw(b"\x00"*8)))
    static PARAM_PROBLEM: [u8; 96] = [
        0x60, 0x00, 0x00, 0x00, 0x00, 0x38, 0x3a, 0x40, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x04, 0x01, 0x81, 0x31, 0x00,
        0x00, 0x00, 0x28, 0x60, 0x00, 0x00, 0x00, 0x00, 0x08, 0x63, 0x40, 0x20, 0x01, 0x0d, 0xb8,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x20, 0x01, 0x0d,
        0xb8, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];
    // IPv6(src="fe80::1",dst="ff02::1",hlim=255)/ICMPv6ND_RA(chlim=64,routerlifetime=1800)/ICMPv6NDOptSrcLLAddr(lladdr="52:54:00:ab:cd:ef")/ICMPv6NDOptMTU(mtu=1500)/ICMPv6NDOptPrefixInfo(prefix="2001:db8::",prefixlen=64)
    static ROUTER_ADVERT: [u8; 104] = [
        0x60, 0x00, 0x00, 0x00, 0x00, 0x40, 0x3a, 0xff, 0xfe, 0x80, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0xff, 0x02, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x86, 0x00, 0x96, 0xa4, 0x40,
        0x08, 0x07, 0x08, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x01, 0x52, 0x54,
        0x00, 0xab, 0xcd, 0xef, 0x05, 0x01, 0x00, 0x00, 0x00, 0x00, 0x05, 0xdc, 0x03, 0x04, 0x40,
        0xc0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x00, 0x00, 0x00, 0x00, 0x20, 0x01,
        0x0d, 0xb8, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];

    /// The IPv6 view of an IPv6 packet, and the ICMPv6 message it carries (no
    /// extension headers in these vectors).
    fn split(packet: &[u8]) -> (ipv6::Packet<&[u8]>, Packet<&[u8]>) {
        let ip = ipv6::Packet::new_checked(packet).unwrap();
        assert_eq!(ip.next_header(), IpProtocol::ICMPV6);
        let message = Packet::new_checked(&packet[ipv6::HEADER_LEN..]).unwrap();
        (ip, message)
    }

    /// An Ethernet frame from `src` to `dst` around an IPv6 packet, in a buffer of
    /// `room` bytes filled with 0xee after it.
    fn framed(src: MacAddr, dst: MacAddr, packet: &[u8], room: usize) -> Vec<u8> {
        let mut frame = vec![0xee; room];
        frame[0..6].copy_from_slice(&dst.0);
        frame[6..12].copy_from_slice(&src.0);
        frame[12..14].copy_from_slice(&[0x86, 0xdd]);
        frame[14..14 + packet.len()].copy_from_slice(packet);
        frame
    }

    /// A named change to a packet that breaks one rule, and the packet it applies to.
    type Edit = (&'static str, &'static [u8], fn(&mut Vec<u8>));

    /// Parses the neighbor message of `packet` after `edit` changed it and its
    /// checksum was refilled, so the checks after the checksum are what is tested.
    fn parse_edited(
        packet: &[u8],
        edit: impl FnOnce(&mut Vec<u8>),
    ) -> Result<NdiscRepr, NdiscError> {
        let mut packet = packet.to_vec();
        edit(&mut packet);
        let (src, dst, hop_limit) = {
            let ip = ipv6::Packet::new_unchecked(&packet[..]);
            (ip.src_addr(), ip.dst_addr(), ip.hop_limit())
        };
        let len = ipv6::HEADER_LEN + read_u16(&packet, 4) as usize;
        let mut message = Packet::new_unchecked(&mut packet[ipv6::HEADER_LEN..len]);
        message.fill_checksum(src, dst);
        NdiscRepr::parse(&message, src, dst, hop_limit)
    }

    #[test]
    fn message_classes() {
        for t in [1, 2, 3, 4, 100, 127] {
            assert!(Message(t).is_error(), "{t}");
        }
        for t in [128, 129, 133, 135, 255] {
            assert!(!Message(t).is_error(), "{t}");
        }
        for t in 133..=137 {
            assert!(Message(t).is_ndisc(), "{t}");
        }
        assert!(!Message(128).is_ndisc() && !Message(138).is_ndisc());
    }

    #[test]
    fn echo_request_fields_and_checksum() {
        let (ip, message) = split(&ECHO_REQUEST);
        assert!(message.is_echo_request());
        assert_eq!(message.msg_code(), 0);
        assert_eq!(message.checksum(), 0x806f);
        assert_eq!((message.echo_ident(), message.echo_seq_no()), (0x1234, 7));
        assert_eq!(message.data(), b"abcdefgh");
        assert_eq!(message.invoking_packet(), None);
        assert!(message.verify_checksum(ip.src_addr(), ip.dst_addr()));
        // The pseudo-header counts: the wrong addresses, or a flipped bit, fail.
        assert!(!message.verify_checksum(ip.src_addr(), A));
        let mut corrupt = ECHO_REQUEST;
        corrupt[50] ^= 0x40;
        let (ip, message) = split(&corrupt);
        assert!(!message.verify_checksum(ip.src_addr(), ip.dst_addr()));
    }

    #[test]
    fn echo_reply_in_place_matches_scapy() {
        let mut buf = ECHO_REQUEST;
        let mut message = Packet::new_checked(&mut buf[40..]).unwrap();
        message.echo_request_to_reply();
        assert_eq!(buf[40..], ECHO_REPLY[40..], "message and checksum");
        let mut message = Packet::new_checked(&mut buf[40..]).unwrap();
        let incremental = message.checksum();
        message.fill_checksum(B, A);
        assert_eq!(message.checksum(), incremental);
    }

    #[test]
    fn echo_reply_frame_matches_scapy() {
        let mut frame = framed(CMAC, OMAC, &ECHO_REQUEST, 70);
        assert_eq!(write_echo_reply(&mut frame, 14, 54, OMAC), Some(70));
        assert_eq!(&frame[0..6], &CMAC.0);
        assert_eq!(&frame[6..12], &OMAC.0);
        assert_eq!(&frame[12..14], &[0x86, 0xdd]);
        assert_eq!(frame[14..], ECHO_REPLY);
    }

    #[test]
    fn echo_reply_drops_the_request_extension_headers() {
        // The request with an 8-byte hop-by-hop header (one 4-byte PadN): the
        // ICMPv6 checksum is unchanged, its pseudo-header length being the
        // message's.
        let mut request = Vec::from(&ECHO_REQUEST[..40]);
        request[5] += 8;
        request[6] = 0;
        request.extend_from_slice(&[58, 0, 1, 4, 0, 0, 0, 0]);
        request.extend_from_slice(&ECHO_REQUEST[40..]);
        let mut frame = framed(CMAC, OMAC, &request, 78);
        assert_eq!(write_echo_reply(&mut frame, 14, 62, OMAC), Some(70));
        assert_eq!(frame[14..70], ECHO_REPLY);
    }

    #[test]
    fn echo_reply_refuses_what_is_not_an_echo_request() {
        let mut frame = framed(CMAC, OMAC, &ECHO_REPLY, 70);
        assert_eq!(write_echo_reply(&mut frame, 14, 54, OMAC), None);
        let mut frame = framed(CMAC, OMAC, &ECHO_REQUEST, 70);
        assert_eq!(write_echo_reply(&mut frame[..60], 14, 54, OMAC), None);
        assert_eq!(write_echo_reply(&mut frame, 14, 50, OMAC), None);
        assert_eq!(write_echo_reply(&mut frame, 14, 66, OMAC), None);
        assert_eq!(frame, framed(CMAC, OMAC, &ECHO_REQUEST, 70), "untouched");
    }

    #[test]
    fn error_messages_quote_the_invoking_packet() {
        let (ip, message) = split(&PORT_UNREACHABLE);
        assert_eq!(message.msg_type(), Message::DEST_UNREACHABLE);
        assert_eq!(message.msg_code(), unreachable::PORT);
        assert!(message.verify_checksum(ip.src_addr(), ip.dst_addr()));
        let quoted = message.invoking_packet().unwrap();
        let inner = ipv6::Packet::new_checked(quoted).unwrap();
        assert_eq!((inner.src_addr(), inner.dst_addr()), (A, B));
        let upper = inner.upper_layer().unwrap();
        assert_eq!((upper.protocol, upper.offset), (IpProtocol::UDP, 40));
        assert_eq!(&quoted[40..44], &[0x04, 0xd2, 0x00, 0x35]);

        let (ip, message) = split(&TIME_EXCEEDED);
        assert_eq!(message.msg_type(), Message::TIME_EXCEEDED);
        assert_eq!(message.msg_code(), CODE_HOP_LIMIT_EXCEEDED);
        assert!(message.verify_checksum(ip.src_addr(), ip.dst_addr()));
        let quoted = message.invoking_packet().unwrap();
        assert_eq!(ipv6::Packet::new_checked(quoted).unwrap().hop_limit(), 1);

        let (ip, message) = split(&PARAM_PROBLEM);
        assert_eq!(message.msg_type(), Message::PARAMETER_PROBLEM);
        assert_eq!((message.msg_code(), message.pointer()), (1, 40));
        assert!(message.verify_checksum(ip.src_addr(), ip.dst_addr()));
        let quoted = message.invoking_packet().unwrap();
        let inner = ipv6::Packet::new_checked(quoted).unwrap();
        assert_eq!(inner.next_header(), IpProtocol(99));

        let (ip, message) = split(&PTB_FRAME[14..]);
        assert_eq!(message.msg_type(), Message::PACKET_TOO_BIG);
        assert_eq!((message.msg_code(), message.mtu()), (0, 1400));
        assert!(message.verify_checksum(ip.src_addr(), ip.dst_addr()));
        assert_eq!(message.invoking_packet().unwrap(), INVOKING);
    }

    #[test]
    fn packet_too_big_frame_matches_scapy() {
        let mut frame = framed(CMAC, OMAC, &INVOKING, 200);
        let len = write_packet_too_big(&mut frame, 14, OMAC, B, 1400).unwrap();
        assert_eq!(len, PTB_FRAME.len());
        assert_eq!(frame[..len], PTB_FRAME);
    }

    #[test]
    fn errors_fit_the_minimum_mtu_and_the_buffer() {
        // A 1500-byte packet: the error quotes its first 1232 bytes.
        let mut big = vec![0xab; 1500];
        big[..60].copy_from_slice(&INVOKING[..60]);
        big[4..6].copy_from_slice(&1460u16.to_be_bytes());
        let mut frame = framed(CMAC, OMAC, &big, 14 + 1500);
        let len = write_error(
            &mut frame,
            14,
            OMAC,
            B,
            Message::TIME_EXCEEDED,
            CODE_HOP_LIMIT_EXCEEDED,
            0,
        )
        .unwrap();
        assert_eq!(len, 14 + ipv6::MIN_MTU);
        let (ip, message) = split(&frame[14..len]);
        assert_eq!(ip.payload_len() as usize, ipv6::MIN_MTU - 40);
        assert_eq!((ip.src_addr(), ip.dst_addr()), (B, A));
        assert!(message.verify_checksum(B, A));
        assert_eq!(message.invoking_packet().unwrap(), &big[..MAX_QUOTED_LEN]);

        // Room for the headers and 60 bytes only: the quote is cut to 60.
        let mut frame = framed(CMAC, OMAC, &INVOKING, 14 + 48 + 60);
        let len = write_packet_too_big(&mut frame, 14, OMAC, B, 1280).unwrap();
        assert_eq!(len, 14 + 48 + 60);
        let (_, message) = split(&frame[14..len]);
        assert!(message.verify_checksum(B, A));
        assert_eq!(message.invoking_packet().unwrap(), &INVOKING[..60]);

        // No room for the quoted IPv6 header: nothing is written.
        let mut frame = framed(CMAC, OMAC, &INVOKING, 14 + 48 + 39);
        let before = frame.clone();
        assert_eq!(write_packet_too_big(&mut frame, 14, OMAC, B, 1280), None);
        assert_eq!(frame, before);
    }

    #[test]
    fn errors_are_never_sent_where_rfc_4443_forbids() {
        let unreachable =
            |frame: &mut [u8]| write_error(frame, 14, OMAC, B, Message::DEST_UNREACHABLE, 4, 0);
        // In answer to an ICMPv6 error.
        let mut frame = framed(CMAC, OMAC, &PORT_UNREACHABLE, 200);
        assert_eq!(unreachable(&mut frame), None);
        // ... but an informational message may be answered.
        let mut frame = framed(CMAC, OMAC, &ECHO_REQUEST, 200);
        assert!(unreachable(&mut frame).is_some());
        // From the unspecified or a multicast source.
        for source in [Ipv6Addr::UNSPECIFIED, ipv6::ALL_NODES, Ipv6Addr::LOCALHOST] {
            let mut packet = INVOKING;
            packet[8..24].copy_from_slice(&source.octets());
            let mut frame = framed(CMAC, OMAC, &packet, 200);
            assert_eq!(unreachable(&mut frame), None, "{source}");
            assert_eq!(
                write_packet_too_big(&mut frame, 14, OMAC, B, 1280),
                None,
                "{source}"
            );
        }
        // To a multicast group or MAC: only packet too big, and a parameter problem
        // for an unrecognised option.
        let mut to_group = INVOKING;
        to_group[24..40].copy_from_slice(&ipv6::ALL_NODES.octets());
        let group_mac = MacAddr::ipv6_multicast(ipv6::ALL_NODES);
        for frame in [
            framed(CMAC, OMAC, &to_group, 200),
            framed(CMAC, group_mac, &INVOKING, 200),
        ] {
            assert_eq!(unreachable(&mut frame.clone()), None);
            assert!(write_packet_too_big(&mut frame.clone(), 14, OMAC, B, 1280).is_some());
            let problem = |code| {
                write_error(
                    &mut frame.clone(),
                    14,
                    OMAC,
                    B,
                    Message::PARAMETER_PROBLEM,
                    code,
                    40,
                )
            };
            assert!(problem(PARAM_PROBLEM_UNRECOGNIZED_OPTION).is_some());
            assert_eq!(problem(0), None);
        }
    }

    #[test]
    fn neighbor_solicitation_parsed() {
        let (ip, message) = split(&NS_FRAME[14..]);
        assert_eq!(message.msg_type(), Message::NEIGHBOR_SOLICIT);
        assert_eq!(message.target_addr(), B);
        assert_eq!(
            NdiscRepr::parse(&message, ip.src_addr(), ip.dst_addr(), ip.hop_limit()),
            Ok(NdiscRepr::NeighborSolicit {
                target: B,
                source_lladdr: Some(CMAC),
            })
        );
        let (ip, message) = split(&DAD_NS);
        assert_eq!(
            NdiscRepr::parse(&message, ip.src_addr(), ip.dst_addr(), ip.hop_limit()),
            Ok(NdiscRepr::NeighborSolicit {
                target: B,
                source_lladdr: None,
            })
        );
    }

    #[test]
    fn neighbor_advertisement_parsed() {
        let (ip, message) = split(&NA_REPLY_FRAME[14..]);
        let flags = NaFlags::SOLICITED.union(NaFlags::OVERRIDE);
        assert_eq!(message.na_flags(), flags);
        assert!(!message.na_flags().contains(NaFlags::ROUTER));
        assert_eq!(
            NdiscRepr::parse(&message, ip.src_addr(), ip.dst_addr(), ip.hop_limit()),
            Ok(NdiscRepr::NeighborAdvert {
                flags,
                target: B,
                target_lladdr: Some(OMAC),
            })
        );
    }

    #[test]
    fn router_advertisement_parsed_enough_to_pass_by() {
        let (ip, message) = split(&ROUTER_ADVERT);
        assert_eq!(
            NdiscRepr::parse(&message, ip.src_addr(), ip.dst_addr(), ip.hop_limit()),
            Ok(NdiscRepr::RouterAdvert {
                cur_hop_limit: 64,
                router_lifetime_secs: 1800,
                source_lladdr: Some(MacAddr([0x52, 0x54, 0x00, 0xab, 0xcd, 0xef])),
            })
        );
        // Only from a link-local router address.
        assert_eq!(
            parse_edited(&ROUTER_ADVERT, |p| p[8..24].copy_from_slice(&A.octets())),
            Err(NdiscError::Malformed)
        );
    }

    #[test]
    fn neighbor_discovery_refusals() {
        let ns = &NS_FRAME[14..];
        let (ip, message) = split(ns);
        let (src, dst) = (ip.src_addr(), ip.dst_addr());
        assert_eq!(
            NdiscRepr::parse(&message, src, dst, 254),
            Err(NdiscError::HopLimit)
        );
        assert_eq!(
            NdiscRepr::parse(&message, src, A, 255),
            Err(NdiscError::BadChecksum)
        );
        let cut = Packet::new_checked(&ns[40..63]).unwrap();
        assert_eq!(
            NdiscRepr::parse(&cut, src, dst, 255),
            Err(NdiscError::Truncated)
        );
        let echo = split(&ECHO_REQUEST).1;
        assert_eq!(
            NdiscRepr::parse(&echo, A, B, 255),
            Err(NdiscError::Unsupported)
        );
        // Each edit breaks one rule of RFC 4861 section 7.1; offsets are in the
        // IPv6 packet (the message starts at 40, its options at 64).
        let edits: [Edit; 10] = [
            ("router solicitation", ns, |p| p[40] = 133),
            ("code", ns, |p| p[41] = 1),
            ("zero-length option", ns, |p| p[65] = 0),
            ("option past the end", ns, |p| p[65] = 2),
            ("lladdr option of 16 bytes", ns, |p| {
                p[5] += 8;
                p.extend_from_slice(&[0; 8]);
                p[65] = 2;
            }),
            ("multicast target", ns, |p| {
                p[48..64].copy_from_slice(&ipv6::ALL_NODES.octets())
            }),
            ("dad with a source lladdr", ns, |p| p[8..24].fill(0)),
            ("dad not to the solicited node", &DAD_NS, |p| {
                p[24..40].copy_from_slice(&ipv6::ALL_NODES.octets())
            }),
            ("solicited advert to a group", &NA_REPLY_FRAME[14..], |p| {
                p[24..40].copy_from_slice(&ipv6::ALL_NODES.octets())
            }),
            ("multicast advert target", &NA_REPLY_FRAME[14..], |p| {
                p[48..64].copy_from_slice(&ipv6::ALL_NODES.octets())
            }),
        ];
        for (name, packet, edit) in edits {
            let expect = if name == "router solicitation" {
                NdiscError::Unsupported
            } else {
                NdiscError::Malformed
            };
            assert_eq!(parse_edited(packet, edit), Err(expect), "{name}");
        }
        // Unknown options are skipped, and the first lladdr option counts.
        let extra = parse_edited(ns, |p| {
            p[5] += 16;
            p.extend_from_slice(&[200, 1, 0, 0, 0, 0, 0, 0]);
            p.extend_from_slice(&[1, 1, 9, 9, 9, 9, 9, 9]);
        });
        assert_eq!(
            extra,
            Ok(NdiscRepr::NeighborSolicit {
                target: B,
                source_lladdr: Some(CMAC),
            })
        );
    }

    #[test]
    fn solicit_for_resolution_matches_scapy() {
        let mut frame = vec![0xaa; 100];
        assert_eq!(write_solicit(&mut frame, 14, CMAC, A, B, None), Some(86));
        assert_eq!(frame[..86], NS_FRAME);
        // The MAC is the solicited-node group's, as scapy's in6_getnsmac gives it
        // (33:33:ff:00:00:02 for 2001:db8::2).
        assert_eq!(&frame[..6], &[0x33, 0x33, 0xff, 0x00, 0x00, 0x02]);
    }

    #[test]
    fn solicit_for_reachability_matches_scapy() {
        let mut frame = vec![0xaa; 86];
        assert_eq!(
            write_solicit(&mut frame, 14, OMAC, B, A, Some(CMAC)),
            Some(86)
        );
        assert_eq!(frame, NUD_NS_FRAME);
    }

    #[test]
    fn advert_answering_a_solicitation_matches_scapy() {
        let mut frame = NS_FRAME.to_vec();
        let len = write_solicited_advert(&mut frame, 14, OMAC, B, A, CMAC, false);
        assert_eq!(len, Some(86));
        assert_eq!(frame, NA_REPLY_FRAME);
        // With the router flag: only the flags and the checksum differ.
        let mut routed = NS_FRAME.to_vec();
        write_solicited_advert(&mut routed, 14, OMAC, B, A, CMAC, true).unwrap();
        let (ip, message) = split(&routed[14..]);
        assert_eq!(message.na_flags().0, 0xe0);
        assert!(message.verify_checksum(ip.src_addr(), ip.dst_addr()));
    }

    #[test]
    fn advert_answering_duplicate_address_detection_goes_to_all_nodes() {
        let mut frame = framed(CMAC, OMAC, &DAD_NS, 86);
        let solicitor = Ipv6Addr::UNSPECIFIED;
        let len = write_solicited_advert(&mut frame, 14, OMAC, B, solicitor, CMAC, false);
        assert_eq!(len, Some(86));
        assert_eq!(frame, NA_UNSOLICITED_FRAME);
    }

    #[test]
    fn unsolicited_advert_matches_scapy() {
        let mut frame = vec![0u8; 86];
        assert_eq!(
            write_unsolicited_advert(&mut frame, 14, OMAC, B, false),
            Some(86)
        );
        assert_eq!(frame, NA_UNSOLICITED_FRAME);
        let (ip, message) = split(&frame[14..]);
        assert_eq!(
            NdiscRepr::parse(&message, ip.src_addr(), ip.dst_addr(), ip.hop_limit()),
            Ok(NdiscRepr::NeighborAdvert {
                flags: NaFlags::OVERRIDE,
                target: B,
                target_lladdr: Some(OMAC),
            })
        );
    }

    #[test]
    fn writers_keep_vlan_tags_and_refuse_short_buffers() {
        let mut tagged = vec![0u8; 90];
        tagged[12..16].copy_from_slice(&[0x81, 0x00, 0x00, 0x64]);
        assert_eq!(
            write_unsolicited_advert(&mut tagged, 18, OMAC, B, false),
            Some(90)
        );
        assert_eq!(&tagged[12..18], &[0x81, 0x00, 0x00, 0x64, 0x86, 0xdd]);
        assert_eq!(tagged[18..], NA_UNSOLICITED_FRAME[14..]);
        let mut short = vec![0u8; 85];
        assert_eq!(
            write_unsolicited_advert(&mut short, 14, OMAC, B, false),
            None
        );
        assert_eq!(write_solicit(&mut short, 14, OMAC, A, B, None), None);
        assert_eq!(
            write_solicited_advert(&mut short, 14, OMAC, B, A, CMAC, false),
            None
        );
        assert!(short.iter().all(|&b| b == 0), "nothing written");
        assert_eq!(write_solicit(&mut [0u8; 100], 10, OMAC, A, B, None), None);
    }

    #[test]
    fn multicast_macs() {
        // scapy: in6_getnsmac(in6_getnsma(inet_pton(AF_INET6, "2001:db8::1:2345:6789")))
        // -> 33:33:ff:45:67:89
        let group = ipv6::solicited_node("2001:db8::1:2345:6789".parse().unwrap());
        assert_eq!(
            MacAddr::ipv6_multicast(group),
            MacAddr([0x33, 0x33, 0xff, 0x45, 0x67, 0x89])
        );
        assert_eq!(
            MacAddr::ipv6_multicast(ipv6::ALL_NODES),
            MacAddr([0x33, 0x33, 0, 0, 0, 1])
        );
    }

    #[test]
    fn truncated_header() {
        for len in 0..HEADER_LEN {
            assert_eq!(
                Packet::new_checked(&ECHO_REQUEST[40..40 + len]),
                Err(WireError::Truncated)
            );
        }
    }
}
