//! VRRP version 3 advertisements for IPv4 (RFC 5798 section 5), as keepalived sends
//! them: IP protocol 112 to 224.0.0.18 with TTL 255.
//!
//! ```text
//!  0                   1                   2                   3
//!  0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 1
//! |Version| Type  | Virtual Rtr ID|   Priority    |Count IPvX Addr|
//! |(rsvd) |     Max Adver Int     |          Checksum             |
//! |                       IPvX Address(es)                        |
//! ```
//!
//! The checksum (section 5.2.8) covers the VRRP message and, unlike VRRPv2's, an
//! IPv4 pseudo-header (source, destination, zero, protocol 112, VRRP length), as for
//! UDP; the sums are those of [`super::checksum`].

use std::net::Ipv4Addr;

use super::checksum;
use super::ethernet::MacAddr;
use super::{read_u16, write_u16, IpProtocol, WireError};

/// The IP protocol number of VRRP.
pub const PROTOCOL: IpProtocol = IpProtocol(112);
/// The IPv4 multicast group VRRP advertisements go to.
pub const MULTICAST_GROUP: Ipv4Addr = Ipv4Addr::new(224, 0, 0, 18);
/// The Ethernet address of that group (RFC 1112 section 6.4).
pub const MULTICAST_MAC: MacAddr = MacAddr::ipv4_multicast(MULTICAST_GROUP);
/// Advertisements are sent, and must be received, with this TTL (section 5.1.1.3).
pub const TTL: u8 = 255;
/// The version this module speaks.
pub const VERSION: u8 = 3;
/// The one packet type: ADVERTISEMENT.
pub const TYPE_ADVERTISEMENT: u8 = 1;
/// The advertisement interval field is 12 bits of centiseconds.
pub const MAX_ADVERT_INTERVAL_CS: u16 = 0x0fff;

mod field {
    pub const VERSION_TYPE: usize = 0;
    pub const VRID: usize = 1;
    pub const PRIORITY: usize = 2;
    pub const COUNT: usize = 3;
    pub const INTERVAL: usize = 4;
    pub const CHECKSUM: usize = 6;
    pub const ADDRESSES: usize = 8;
}

pub const HEADER_LEN: usize = field::ADDRESSES;

/// Whether `frame` is an untagged Ethernet frame carrying IPv4 protocol VRRP (its
/// advertisement unchecked): how frames handed up to the management core are told
/// apart without parsing them again.
pub fn carries_vrrp(frame: &[u8]) -> bool {
    super::ipv4::carries(frame, PROTOCOL)
}

/// A view of a VRRPv3 IPv4 advertisement: the header and `count` addresses. Bytes
/// after the addresses are not part of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps `buffer` without checks; accessors may panic on a short buffer.
    pub const fn new_unchecked(buffer: T) -> Packet<T> {
        Packet { buffer }
    }

    /// Wraps `buffer` after checking it holds the header and the addresses it counts.
    ///
    /// Errors: `Truncated` below 8 bytes or below the address list; `Unsupported` for
    /// another version (VRRPv2 is not spoken); `Malformed` for a type other than
    /// advertisement.
    pub fn new_checked(buffer: T) -> Result<Packet<T>, WireError> {
        let packet = Self::new_unchecked(buffer);
        packet.check_len()?;
        Ok(packet)
    }

    pub fn check_len(&self) -> Result<(), WireError> {
        let data = self.buffer.as_ref();
        if data.len() < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        if self.version() != VERSION {
            return Err(WireError::Unsupported);
        }
        if self.packet_type() != TYPE_ADVERTISEMENT {
            return Err(WireError::Malformed);
        }
        if data.len() < self.message_len() {
            return Err(WireError::Truncated);
        }
        Ok(())
    }

    pub fn into_inner(self) -> T {
        self.buffer
    }

    pub fn version(&self) -> u8 {
        self.buffer.as_ref()[field::VERSION_TYPE] >> 4
    }

    pub fn packet_type(&self) -> u8 {
        self.buffer.as_ref()[field::VERSION_TYPE] & 0x0f
    }

    pub fn vrid(&self) -> u8 {
        self.buffer.as_ref()[field::VRID]
    }

    pub fn priority(&self) -> u8 {
        self.buffer.as_ref()[field::PRIORITY]
    }

    pub fn address_count(&self) -> u8 {
        self.buffer.as_ref()[field::COUNT]
    }

    /// The 4 reserved bits before the interval (sent as zero, ignored on receipt).
    pub fn reserved(&self) -> u8 {
        self.buffer.as_ref()[field::INTERVAL] >> 4
    }

    /// Max Adver Int, in centiseconds (12 bits).
    pub fn max_advert_interval(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::INTERVAL) & MAX_ADVERT_INTERVAL_CS
    }

    pub fn checksum(&self) -> u16 {
        read_u16(self.buffer.as_ref(), field::CHECKSUM)
    }

    /// Header plus addresses.
    pub fn message_len(&self) -> usize {
        HEADER_LEN + 4 * self.address_count() as usize
    }

    /// Address `index` (below the count).
    pub fn address(&self, index: usize) -> Ipv4Addr {
        let at = field::ADDRESSES + 4 * index;
        let b = &self.buffer.as_ref()[at..at + 4];
        Ipv4Addr::new(b[0], b[1], b[2], b[3])
    }

    pub fn addresses(&self) -> impl Iterator<Item = Ipv4Addr> + '_ {
        (0..self.address_count() as usize).map(|i| self.address(i))
    }

    /// The checksum over the pseudo-header of `src -> dst` and the message is right.
    pub fn verify_checksum(&self, src: Ipv4Addr, dst: Ipv4Addr) -> bool {
        checksum::fold(self.sum_with_pseudo_header(src, dst)) == 0xffff
    }

    fn sum_with_pseudo_header(&self, src: Ipv4Addr, dst: Ipv4Addr) -> u32 {
        sum_with_pseudo_header(&self.buffer.as_ref()[..self.message_len()], src, dst)
    }
}

fn sum_with_pseudo_header(payload: &[u8], src: Ipv4Addr, dst: Ipv4Addr) -> u32 {
    let pseudo = checksum::pseudo_header_sum(src, dst, PROTOCOL.0, payload.len() as u16);
    pseudo + checksum::sum(payload)
}

/// Whether the checksum of a whole IP payload (an advertisement and whatever follows
/// its addresses, as an authenticated one's trailer) is right for `src -> dst`: what
/// a receiver that does not know the trailer (tshark, scapy) checks.
pub fn verify_payload_checksum(payload: &[u8], src: Ipv4Addr, dst: Ipv4Addr) -> bool {
    payload.len() >= HEADER_LEN
        && checksum::fold(sum_with_pseudo_header(payload, src, dst)) == 0xffff
}

/// Writes the checksum of a whole IP payload that starts with an advertisement (see
/// [`verify_payload_checksum`]); `payload` must hold at least the header.
pub fn fill_payload_checksum(payload: &mut [u8], src: Ipv4Addr, dst: Ipv4Addr) {
    write_u16(payload, field::CHECKSUM, 0);
    let value = checksum::finish(sum_with_pseudo_header(payload, src, dst));
    write_u16(payload, field::CHECKSUM, value);
}

/// Sluice's authentication trailer, which follows the addresses of an advertisement
/// between Sluice nodes that share a key (`[vrrp] key`, docs/CONFIG.md). RFC 5798 has
/// no authentication, so this is Sluice's own; keepalived does not send it and would
/// not take an advertisement that carries it. The advertisement's checksum covers the
/// trailer too, as it covers the whole IP payload.
///
/// ```text
/// | magic "SLVA" (4) | counter (8, big-endian) | tag (32) |
/// ```
///
/// The counter is the sender's wall clock in microseconds when it sent the advert,
/// raised past the last one it sent if needed, so it grows across the sender's restarts
/// (what the receiver's replay check needs). The tag is the HMAC-SHA256 under the
/// shared key of [`auth::signed_bytes`]: the magic, the IP addresses, and the payload
/// up to the tag with the checksum as zero.
pub mod auth {
    use super::{field, Ipv4Addr};

    pub const MAGIC: [u8; 4] = *b"SLVA";
    pub const COUNTER_LEN: usize = 8;
    pub const TAG_LEN: usize = 32;
    pub const TRAILER_LEN: usize = MAGIC.len() + COUNTER_LEN + TAG_LEN;

    /// The counter and tag of `trailer`, all the bytes after an advertisement's
    /// addresses; `None` when they are not one trailer (length or magic).
    pub fn parse(trailer: &[u8]) -> Option<(u64, &[u8])> {
        if trailer.len() != TRAILER_LEN || trailer[..MAGIC.len()] != MAGIC {
            return None;
        }
        let counter = trailer[MAGIC.len()..MAGIC.len() + COUNTER_LEN]
            .try_into()
            .map(u64::from_be_bytes)
            .ok()?;
        Some((counter, &trailer[MAGIC.len() + COUNTER_LEN..]))
    }

    /// Writes the magic and `counter` at the start of `trailer` ([`TRAILER_LEN`]
    /// bytes), the tag left for [`set_tag`].
    pub fn write_head(trailer: &mut [u8], counter: u64) {
        trailer[..MAGIC.len()].copy_from_slice(&MAGIC);
        trailer[MAGIC.len()..MAGIC.len() + COUNTER_LEN].copy_from_slice(&counter.to_be_bytes());
    }

    /// Writes the tag at the end of `payload` (an advertisement and its trailer).
    pub fn set_tag(payload: &mut [u8], tag: &[u8; TAG_LEN]) {
        let at = payload.len() - TAG_LEN;
        payload[at..].copy_from_slice(tag);
    }

    /// What the tag covers: [`MAGIC`] (so no tag made for another of Sluice's
    /// protocols under the same key can pass for an advert's), the IP source and
    /// destination (so an advert cannot be sent again from another peer's address),
    /// then the payload up to the tag with its checksum as zero (the checksum is written
    /// last, over the tag). `payload` is the advertisement and its trailer.
    pub fn signed_bytes(payload: &[u8], src: Ipv4Addr, dst: Ipv4Addr) -> Vec<u8> {
        const HEAD: usize = MAGIC.len() + 8;
        let signed = &payload[..payload.len().saturating_sub(TAG_LEN)];
        let mut bytes = Vec::with_capacity(HEAD + signed.len());
        bytes.extend_from_slice(&MAGIC);
        bytes.extend_from_slice(&src.octets());
        bytes.extend_from_slice(&dst.octets());
        bytes.extend_from_slice(signed);
        if let Some(sum) = bytes.get_mut(HEAD + field::CHECKSUM..HEAD + field::CHECKSUM + 2) {
            sum.fill(0);
        }
        bytes
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    pub fn set_version_and_type(&mut self, version: u8, packet_type: u8) {
        self.buffer.as_mut()[field::VERSION_TYPE] = version << 4 | (packet_type & 0x0f);
    }

    pub fn set_vrid(&mut self, value: u8) {
        self.buffer.as_mut()[field::VRID] = value;
    }

    pub fn set_priority(&mut self, value: u8) {
        self.buffer.as_mut()[field::PRIORITY] = value;
    }

    pub fn set_address_count(&mut self, value: u8) {
        self.buffer.as_mut()[field::COUNT] = value;
    }

    /// Sets the interval (its top 4 bits are dropped) and zeroes the reserved bits.
    pub fn set_max_advert_interval(&mut self, centiseconds: u16) {
        write_u16(
            self.buffer.as_mut(),
            field::INTERVAL,
            centiseconds & MAX_ADVERT_INTERVAL_CS,
        );
    }

    pub fn set_checksum(&mut self, value: u16) {
        write_u16(self.buffer.as_mut(), field::CHECKSUM, value);
    }

    pub fn set_address(&mut self, index: usize, addr: Ipv4Addr) {
        let at = field::ADDRESSES + 4 * index;
        self.buffer.as_mut()[at..at + 4].copy_from_slice(&addr.octets());
    }

    /// Computes the checksum for a packet sent from `src` to `dst`.
    pub fn fill_checksum(&mut self, src: Ipv4Addr, dst: Ipv4Addr) {
        self.set_checksum(0);
        let value = checksum::finish(self.sum_with_pseudo_header(src, dst));
        self.set_checksum(value);
    }
}

/// An advertisement's fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Repr {
    pub vrid: u8,
    pub priority: u8,
    /// Centiseconds, at most [`MAX_ADVERT_INTERVAL_CS`] (40.95 s).
    pub max_advert_interval: u16,
    /// The virtual addresses, at most 255.
    pub addresses: Vec<Ipv4Addr>,
}

impl Repr {
    /// Parses a checked advertisement; the checksum is verified here, since the
    /// caller has the IP addresses. A wrong checksum is `Malformed`.
    pub fn parse<T: AsRef<[u8]>>(
        packet: &Packet<T>,
        src: Ipv4Addr,
        dst: Ipv4Addr,
    ) -> Result<Repr, WireError> {
        packet.check_len()?;
        if !packet.verify_checksum(src, dst) {
            return Err(WireError::Malformed);
        }
        Ok(Repr {
            vrid: packet.vrid(),
            priority: packet.priority(),
            max_advert_interval: packet.max_advert_interval(),
            addresses: packet.addresses().collect(),
        })
    }

    pub fn buffer_len(&self) -> usize {
        HEADER_LEN + 4 * self.addresses.len().min(255)
    }

    /// Writes the advertisement and its checksum for `src -> dst`; the buffer must
    /// hold [`Self::buffer_len`] bytes. Addresses past 255 are left out.
    pub fn emit<T: AsRef<[u8]> + AsMut<[u8]>>(
        &self,
        packet: &mut Packet<T>,
        src: Ipv4Addr,
        dst: Ipv4Addr,
    ) {
        let count = self.addresses.len().min(255);
        packet.set_version_and_type(VERSION, TYPE_ADVERTISEMENT);
        packet.set_vrid(self.vrid);
        packet.set_priority(self.priority);
        packet.set_address_count(count as u8);
        packet.set_max_advert_interval(self.max_advert_interval);
        for (i, addr) in self.addresses.iter().take(count).enumerate() {
            packet.set_address(i, *addr);
        }
        packet.fill_checksum(src, dst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SENDER: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);

    /// A VRRPv3 advertisement from scapy 2.5 (the IP payload):
    ///
    /// ```python
    /// from scapy.all import IP, raw
    /// from scapy.layers.vrrp import VRRPv3
    /// p = IP(src="192.0.2.1", dst="224.0.0.18", ttl=255)/VRRPv3(vrid=51,
    ///     priority=150, adv=100, addrlist=["203.0.113.10", "203.0.113.11"])
    /// print(raw(p)[20:].hex())   # 3133960200641dbacb00710acb00710b
    /// ```
    static SCAPY_ADVERT: [u8; 16] = [
        0x31, 0x33, 0x96, 0x02, 0x00, 0x64, 0x1d, 0xba, 0xcb, 0x00, 0x71, 0x0a, 0xcb, 0x00, 0x71,
        0x0b,
    ];

    fn scapy_repr() -> Repr {
        Repr {
            vrid: 51,
            priority: 150,
            max_advert_interval: 100,
            addresses: vec![
                Ipv4Addr::new(203, 0, 113, 10),
                Ipv4Addr::new(203, 0, 113, 11),
            ],
        }
    }

    #[test]
    fn decodes_scapys_advertisement() {
        let packet = Packet::new_checked(&SCAPY_ADVERT[..]).unwrap();
        assert_eq!((packet.version(), packet.packet_type()), (3, 1));
        assert_eq!(packet.address_count(), 2);
        assert_eq!(packet.checksum(), 0x1dba);
        assert!(packet.verify_checksum(SENDER, MULTICAST_GROUP));
        // The pseudo-header counts: another source gives another checksum.
        assert!(!packet.verify_checksum(Ipv4Addr::new(192, 0, 2, 2), MULTICAST_GROUP));
        assert_eq!(
            Repr::parse(&packet, SENDER, MULTICAST_GROUP).unwrap(),
            scapy_repr()
        );
    }

    #[test]
    fn emits_scapys_bytes() {
        let mut buf = [0xffu8; 16];
        scapy_repr().emit(
            &mut Packet::new_unchecked(&mut buf[..]),
            SENDER,
            MULTICAST_GROUP,
        );
        assert_eq!(buf, SCAPY_ADVERT);
        assert_eq!(scapy_repr().buffer_len(), 16);
    }

    #[test]
    fn length_version_type_and_checksum_errors() {
        for len in 0..SCAPY_ADVERT.len() {
            assert_eq!(
                Packet::new_checked(&SCAPY_ADVERT[..len]),
                Err(WireError::Truncated),
                "len {len}"
            );
        }
        let mut v2 = SCAPY_ADVERT;
        v2[0] = 0x21;
        assert_eq!(Packet::new_checked(&v2[..]), Err(WireError::Unsupported));
        let mut not_advert = SCAPY_ADVERT;
        not_advert[0] = 0x32;
        assert_eq!(
            Packet::new_checked(&not_advert[..]),
            Err(WireError::Malformed)
        );
        let mut damaged = SCAPY_ADVERT;
        damaged[2] = 151;
        let packet = Packet::new_checked(&damaged[..]).unwrap();
        assert_eq!(
            Repr::parse(&packet, SENDER, MULTICAST_GROUP),
            Err(WireError::Malformed)
        );
        // Trailing bytes are not part of the message, and reserved bits are ignored.
        let mut longer = SCAPY_ADVERT.to_vec();
        longer.extend_from_slice(&[0xaa; 6]);
        longer[4] |= 0xf0;
        let packet = Packet::new_checked(&longer[..]).unwrap();
        assert_eq!(packet.reserved(), 0xf);
        assert_eq!(packet.max_advert_interval(), 100);
        assert_eq!(packet.message_len(), 16);
    }

    #[test]
    fn interval_is_twelve_bits_and_zero_addresses_work() {
        let repr = Repr {
            vrid: 1,
            priority: 255,
            max_advert_interval: 0xffff,
            addresses: Vec::new(),
        };
        let mut buf = [0u8; 8];
        let mut packet = Packet::new_unchecked(&mut buf[..]);
        repr.emit(&mut packet, SENDER, MULTICAST_GROUP);
        assert_eq!(packet.max_advert_interval(), MAX_ADVERT_INTERVAL_CS);
        assert_eq!(packet.reserved(), 0);
        let parsed = Repr::parse(&packet, SENDER, MULTICAST_GROUP).unwrap();
        assert_eq!(parsed.max_advert_interval, 4095);
        assert!(parsed.addresses.is_empty());
    }

    /// scapy decodes what we emit and agrees with our checksum.
    #[test]
    fn scapy_decodes_our_advertisement() {
        let repr = Repr {
            vrid: 7,
            priority: 254,
            max_advert_interval: 35,
            addresses: (1..=5).map(|i| Ipv4Addr::new(198, 18, 1, i)).collect(),
        };
        let src = Ipv4Addr::new(10, 20, 30, 40);
        let mut buf = vec![0u8; repr.buffer_len()];
        repr.emit(
            &mut Packet::new_unchecked(&mut buf[..]),
            src,
            MULTICAST_GROUP,
        );
        let hex: String = buf.iter().map(|b| format!("{b:02x}")).collect();
        let script = format!(
            r#"
from scapy.all import IP, Raw, raw
from scapy.layers.vrrp import VRRPv3
sent = IP(src="{src}", dst="224.0.0.18", ttl=255, proto=112)/Raw(bytes.fromhex("{hex}"))
p = IP(raw(sent))
v = p[VRRPv3]
theirs = v.chksum
v.chksum = None
recomputed = IP(raw(p))[VRRPv3].chksum
print(v.version, v.type, v.vrid, v.priority, v.ipcount, v.adv, ",".join(v.addrlist), theirs == recomputed)
"#
        );
        let output = crate::wire::test_util::run_scapy(&script);
        let addresses: Vec<String> = repr.addresses.iter().map(|a| a.to_string()).collect();
        assert_eq!(
            output.trim(),
            format!("3 1 7 254 5 35 {} True", addresses.join(","))
        );
    }

    /// An advertisement with Sluice's trailer: scapy reads the message as VRRPv3 and
    /// the trailer as what follows it; tshark agrees with the checksum over both.
    #[test]
    fn tshark_agrees_with_the_checksum_over_a_trailer() {
        let repr = scapy_repr();
        let mut payload = vec![0u8; repr.buffer_len() + auth::TRAILER_LEN];
        repr.emit(
            &mut Packet::new_unchecked(&mut payload[..repr.buffer_len()]),
            SENDER,
            MULTICAST_GROUP,
        );
        auth::write_head(&mut payload[repr.buffer_len()..], 0x0102_0304_0506_0708);
        auth::set_tag(&mut payload, &[0xa5; auth::TAG_LEN]);
        fill_payload_checksum(&mut payload, SENDER, MULTICAST_GROUP);
        assert!(verify_payload_checksum(&payload, SENDER, MULTICAST_GROUP));
        // The message's own checksum no longer holds: it was summed over the trailer.
        let packet = Packet::new_checked(&payload[..]).unwrap();
        assert!(!packet.verify_checksum(SENDER, MULTICAST_GROUP));
        let (counter, tag) = auth::parse(&payload[repr.buffer_len()..]).unwrap();
        assert_eq!(
            (counter, tag),
            (0x0102_0304_0506_0708, &[0xa5; auth::TAG_LEN][..])
        );
        assert_eq!(auth::parse(&payload[repr.buffer_len() + 1..]), None);
        let mut wrong_magic = payload[repr.buffer_len()..].to_vec();
        wrong_magic[0] = b'X';
        assert_eq!(auth::parse(&wrong_magic), None);
        // The tag covers a label, the addresses and all but the checksum and the tag.
        let signed = auth::signed_bytes(&payload, SENDER, MULTICAST_GROUP);
        assert_eq!(signed.len(), 12 + payload.len() - auth::TAG_LEN);
        assert_eq!(signed[..4], *b"SLVA");
        assert_eq!(signed[4..8], SENDER.octets());
        assert_eq!(signed[8..12], MULTICAST_GROUP.octets());
        assert_eq!(signed[12 + 6..12 + 8], [0, 0]);
        assert_eq!(signed[12..12 + 6], payload[..6]);
        assert_eq!(signed[12 + 8..], payload[8..payload.len() - auth::TAG_LEN]);
        // tshark (Wireshark's dissector, as keepalived) sums the whole IP payload and
        // finds it good. (scapy's VRRPv3 layer sums the counted message only, so it
        // disagrees about a sealed advert; RFC 5798 receivers follow the former.)
        let hex: String = payload.iter().map(|b| format!("{b:02x}")).collect();
        let pcap =
            std::env::temp_dir().join(format!("sluice-vrrp-trailer-{}.pcap", std::process::id()));
        let script = format!(
            r#"
import subprocess
from scapy.all import Ether, IP, Raw, raw, wrpcap
from scapy.layers.vrrp import VRRPv3
frame = Ether(dst="01:00:5e:00:00:12")/IP(src="{SENDER}", dst="224.0.0.18", ttl=255, proto=112)/Raw(bytes.fromhex("{hex}"))
wrpcap("{pcap}", [frame])
out = subprocess.run(["tshark", "-r", "{pcap}", "-T", "fields", "-e", "vrrp.virt_rtr_id", "-e", "vrrp.addr_count", "-e", "vrrp.checksum.status"], capture_output=True, text=True).stdout.split()
v = IP(raw(frame[IP]))[VRRPv3]
print(" ".join(out), v.vrid, v.ipcount, len(bytes(v.payload)), bytes(v.payload)[:4])
"#,
            pcap = pcap.display()
        );
        let output = crate::wire::test_util::run_scapy(&script);
        let _ = std::fs::remove_file(&pcap);
        // tshark: VRID 51, 2 addresses, checksum status 1 (good).
        assert_eq!(output.trim(), "51 2 1 51 2 44 b'SLVA'");
    }
}
