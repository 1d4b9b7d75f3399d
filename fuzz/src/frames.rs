//! Mostly-valid frames built from fuzzer bytes: Ethernet (with an optional VLAN tag),
//! ARP, IPv4 with TCP, UDP, ICMP (echo, or an error quoting a flow) or another
//! protocol, IPv6 (with extension headers now and then) with TCP, UDP, ICMPv6 (echo,
//! an error quoting a flow, Neighbor Discovery) or another next header, their
//! addresses and ports drawn mostly from a small universe (the VIPs, real servers,
//! local addresses and clients of the target), checksums right unless the input asks
//! for one to be damaged.
use crate::net::{finish, pseudo, sum};
use arbitrary::{Arbitrary, Unstructured};
use std::net::{Ipv4Addr, Ipv6Addr};

/// The addresses, ports and MACs a target's frames are mostly made of.
pub struct Universe<'a> {
    pub our_mac: [u8; 6],
    pub macs: &'a [[u8; 6]],
    pub addrs: &'a [Ipv4Addr],
    pub ports: &'a [u16],
    /// Clients, services, real servers, local addresses with their ports.
    pub endpoints: &'a [(Ipv4Addr, u16)],
    /// The same for IPv6.
    pub addrs6: &'a [Ipv6Addr],
    pub endpoints6: &'a [(Ipv6Addr, u16)],
}

/// An address: mostly one of the universe's (byte below 224), else any.
#[derive(Debug, Clone, Copy)]
pub enum Addr {
    Known(u8),
    Raw(u32),
}

impl<'a> Arbitrary<'a> for Addr {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let b = u8::arbitrary(u)?;
        Ok(if b < 224 {
            Addr::Known(b)
        } else {
            Addr::Raw(u32::arbitrary(u)?)
        })
    }
}

/// A port: mostly one of the universe's, else any.
#[derive(Debug, Clone, Copy)]
pub enum Port {
    Known(u8),
    Raw(u16),
}

impl<'a> Arbitrary<'a> for Port {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let b = u8::arbitrary(u)?;
        Ok(if b < 224 {
            Port::Known(b)
        } else {
            Port::Raw(u16::arbitrary(u)?)
        })
    }
}

/// A TCP/UDP endpoint: mostly one of the universe's (a client, a service, a real
/// server, a local address with a port of its pool), else address and port apart.
#[derive(Debug, Clone, Copy)]
pub enum Endpoint {
    Known(u8),
    Apart(Addr, Port),
}

impl<'a> Arbitrary<'a> for Endpoint {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let b = u8::arbitrary(u)?;
        Ok(if b < 200 {
            Endpoint::Known(b)
        } else {
            Endpoint::Apart(Addr::arbitrary(u)?, Port::arbitrary(u)?)
        })
    }
}

/// A MAC: mostly ours, else one of the universe's, broadcast or any.
#[derive(Debug, Clone, Copy)]
pub enum Mac {
    Ours,
    Known(u8),
    Broadcast,
    Raw([u8; 6]),
}

impl<'a> Arbitrary<'a> for Mac {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let b = u8::arbitrary(u)?;
        Ok(match b {
            0..=159 => Mac::Ours,
            160..=215 => Mac::Known(b),
            216..=235 => Mac::Broadcast,
            _ => Mac::Raw(<[u8; 6]>::arbitrary(u)?),
        })
    }
}

/// A source MAC: mostly one of the universe's (index from the byte), else any.
#[derive(Debug, Clone, Copy)]
pub struct SourceMac(pub Mac);

impl<'a> Arbitrary<'a> for SourceMac {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let b = u8::arbitrary(u)?;
        Ok(SourceMac(match b {
            0..=239 => Mac::Known(b),
            240..=247 => Mac::Ours,
            _ => Mac::Raw(<[u8; 6]>::arbitrary(u)?),
        }))
    }
}

#[derive(Arbitrary, Debug)]
pub struct FrameSpec {
    pub dst_mac: Mac,
    pub src_mac: SourceMac,
    pub vlan: Rare<u16>,
    pub body: Body,
}

/// A value present one time in eight.
#[derive(Debug, Clone, Copy)]
pub struct Rare<T>(pub Option<T>);

impl<'a, T: Arbitrary<'a>> Arbitrary<'a> for Rare<T> {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(Rare(if u8::arbitrary(u)? < 32 {
            Some(T::arbitrary(u)?)
        } else {
            None
        }))
    }
}

#[derive(Debug)]
pub enum Body {
    Arp {
        op: u8,
        sender_mac: Mac,
        sender: Addr,
        target_mac: Mac,
        target: Addr,
        /// Replaces hardware/protocol type and lengths (8 bytes) when set.
        header: Option<[u8; 6]>,
    },
    Ipv4(Ipv4Spec),
    Ipv6(Ipv6Spec),
    Raw(Vec<u8>),
}

impl<'a> Arbitrary<'a> for Body {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(match u8::arbitrary(u)? {
            0..=29 => Body::Arp {
                op: u8::arbitrary(u)?,
                sender_mac: SourceMac::arbitrary(u)?.0,
                sender: Addr::arbitrary(u)?,
                target_mac: Mac::arbitrary(u)?,
                target: Addr::arbitrary(u)?,
                header: Rare::arbitrary(u)?.0,
            },
            30..=169 => Body::Ipv4(Ipv4Spec::arbitrary(u)?),
            170..=243 => Body::Ipv6(Ipv6Spec::arbitrary(u)?),
            _ => Body::Raw(Vec::arbitrary(u)?),
        })
    }
}

#[derive(Arbitrary, Debug)]
pub struct Ipv4Spec {
    pub src: Addr,
    pub dst: Addr,
    pub tos: u8,
    pub ident: u16,
    pub frag: Frag,
    pub ttl: u8,
    /// IPv4 options (cut to 40 bytes, padded to a multiple of 4).
    pub options: Rare<Vec<u8>>,
    pub l4: L4,
    pub damage: Damage,
    /// Ethernet padding after the IP packet.
    pub padding: u8,
}

#[derive(Debug, Clone, Copy)]
pub enum Frag {
    None,
    DontFragment,
    MoreFragments,
    Offset(u16),
}

impl<'a> Arbitrary<'a> for Frag {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(match u8::arbitrary(u)? {
            0..=119 => Frag::None,
            120..=239 => Frag::DontFragment,
            240..=247 => Frag::MoreFragments,
            _ => Frag::Offset(u16::arbitrary(u)?),
        })
    }
}

#[derive(Debug, Clone, Copy)]
pub enum Damage {
    None,
    IpChecksum,
    L4Checksum,
    TotalLen(i8),
    Cut(u8),
    IpHeaderByte(u8, u8),
}

impl<'a> Arbitrary<'a> for Damage {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(match u8::arbitrary(u)? {
            0..=223 => Damage::None,
            224..=229 => Damage::IpChecksum,
            230..=237 => Damage::L4Checksum,
            238..=243 => Damage::TotalLen(i8::arbitrary(u)?),
            244..=249 => Damage::Cut(u8::arbitrary(u)?),
            _ => Damage::IpHeaderByte(u8::arbitrary(u)?, u8::arbitrary(u)?),
        })
    }
}

/// TCP flags: mostly a combination a real stack sends.
#[derive(Debug, Clone, Copy)]
pub struct Flags(pub u8);

impl<'a> Arbitrary<'a> for Flags {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        const COMMON: [u8; 8] = [0x02, 0x12, 0x10, 0x18, 0x11, 0x04, 0x14, 0x19];
        let b = u8::arbitrary(u)?;
        Ok(Flags(if b < 224 {
            COMMON[b as usize % COMMON.len()]
        } else {
            u8::arbitrary(u)?
        }))
    }
}

#[derive(Debug)]
pub enum L4 {
    Tcp {
        src: Endpoint,
        dst: Endpoint,
        seq: u32,
        ack: u32,
        flags: Flags,
        window: u16,
        options: Vec<TcpOption>,
        payload: Vec<u8>,
    },
    Udp {
        src: Endpoint,
        dst: Endpoint,
        payload: Vec<u8>,
        no_checksum: bool,
    },
    Icmp {
        icmp_type: u8,
        code: u8,
        rest: u32,
        body: IcmpBody,
    },
    Other {
        protocol: u8,
        payload: Vec<u8>,
    },
}

impl<'a> Arbitrary<'a> for L4 {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(match u8::arbitrary(u)? {
            0..=119 => L4::Tcp {
                src: Endpoint::arbitrary(u)?,
                dst: Endpoint::arbitrary(u)?,
                seq: u32::arbitrary(u)?,
                ack: u32::arbitrary(u)?,
                flags: Flags::arbitrary(u)?,
                window: u16::arbitrary(u)?,
                options: Vec::arbitrary(u)?,
                payload: Vec::arbitrary(u)?,
            },
            120..=189 => L4::Udp {
                src: Endpoint::arbitrary(u)?,
                dst: Endpoint::arbitrary(u)?,
                payload: Vec::arbitrary(u)?,
                no_checksum: u8::arbitrary(u)? < 32,
            },
            190..=239 => L4::Icmp {
                icmp_type: u8::arbitrary(u)?,
                code: u8::arbitrary(u)?,
                rest: u32::arbitrary(u)?,
                body: IcmpBody::arbitrary(u)?,
            },
            _ => L4::Other {
                protocol: u8::arbitrary(u)?,
                payload: Vec::arbitrary(u)?,
            },
        })
    }
}

#[derive(Arbitrary, Debug)]
pub enum IcmpBody {
    Data(Vec<u8>),
    /// The start of an IPv4 packet, as an ICMP error quotes it.
    Quote {
        src: Endpoint,
        dst: Endpoint,
        tcp: bool,
        /// Bytes of the quoted L4 header kept (8 is what RFC 792 asks).
        keep: u8,
        quoted_checksum_ok: bool,
    },
}

#[derive(Arbitrary, Debug)]
pub enum TcpOption {
    Mss(u16),
    /// TCP option 254, 8 bytes (TOA).
    Toa([u8; 6]),
    Nop,
    End,
    WindowScale(u8),
    SackPermitted,
    Timestamps(u32, u32),
    Raw(u8, Vec<u8>),
}

/// An IPv6 address: mostly one of the universe's, else any.
#[derive(Debug, Clone, Copy)]
pub enum Addr6 {
    Known(u8),
    Raw([u8; 16]),
}

impl<'a> Arbitrary<'a> for Addr6 {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let b = u8::arbitrary(u)?;
        Ok(if b < 224 {
            Addr6::Known(b)
        } else {
            Addr6::Raw(<[u8; 16]>::arbitrary(u)?)
        })
    }
}

/// An IPv6 TCP/UDP endpoint: mostly one of the universe's, else address and port apart.
#[derive(Debug, Clone, Copy)]
pub enum Endpoint6 {
    Known(u8),
    Apart(Addr6, Port),
}

impl<'a> Arbitrary<'a> for Endpoint6 {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let b = u8::arbitrary(u)?;
        Ok(if b < 200 {
            Endpoint6::Known(b)
        } else {
            Endpoint6::Apart(Addr6::arbitrary(u)?, Port::arbitrary(u)?)
        })
    }
}

#[derive(Arbitrary, Debug)]
pub struct Ipv6Spec {
    pub traffic_class: u8,
    pub hop_limit: HopLimit,
    /// Extension headers before the upper layer (a few, now and then).
    pub ext: Rare<Vec<ExtHeader>>,
    pub l4: L4v6,
    pub damage: Damage6,
    /// Ethernet padding after the IP packet.
    pub padding: u8,
}

/// A hop limit: mostly 64 or 255 (Neighbor Discovery's), else any (0 and 1 included).
#[derive(Debug, Clone, Copy)]
pub struct HopLimit(pub u8);

impl<'a> Arbitrary<'a> for HopLimit {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(HopLimit(match u8::arbitrary(u)? {
            0..=99 => 64,
            100..=219 => 255,
            _ => u8::arbitrary(u)?,
        }))
    }
}

#[derive(Arbitrary, Debug)]
pub enum ExtHeader {
    HopByHop(Vec<u8>),
    DestinationOptions(Vec<u8>),
    Routing {
        routing_type: u8,
        segments_left: u8,
        data: Vec<u8>,
    },
    Fragment {
        offset: u16,
        more: bool,
        ident: u32,
    },
    /// Any next header value with an options-shaped body.
    Raw(u8, Vec<u8>),
}

#[derive(Debug, Clone, Copy)]
pub enum Damage6 {
    None,
    L4Checksum,
    PayloadLen(i8),
    Cut(u8),
    HeaderByte(u8, u8),
}

impl<'a> Arbitrary<'a> for Damage6 {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(match u8::arbitrary(u)? {
            0..=223 => Damage6::None,
            224..=233 => Damage6::L4Checksum,
            234..=241 => Damage6::PayloadLen(i8::arbitrary(u)?),
            242..=249 => Damage6::Cut(u8::arbitrary(u)?),
            _ => Damage6::HeaderByte(u8::arbitrary(u)?, u8::arbitrary(u)?),
        })
    }
}

#[derive(Debug)]
pub enum L4v6 {
    Tcp {
        src: Endpoint6,
        dst: Endpoint6,
        seq: u32,
        ack: u32,
        flags: Flags,
        window: u16,
        options: Vec<TcpOption>,
        payload: Vec<u8>,
    },
    Udp {
        src: Endpoint6,
        dst: Endpoint6,
        payload: Vec<u8>,
        /// Zero is not allowed for UDP over IPv6 (RFC 8200 8.1): sent now and then.
        no_checksum: bool,
    },
    /// Echo request (128) or reply (129).
    Echo {
        request: bool,
        src: Addr6,
        dst: Addr6,
        ident: u16,
        seq: u16,
        data: Vec<u8>,
    },
    /// Destination unreachable (1), Packet Too Big (2), time exceeded (3), parameter
    /// problem (4) (or another type) quoting a TCP/UDP packet between two endpoints.
    Error {
        icmp_type: ErrorType,
        code: u8,
        /// MTU (Packet Too Big) or pointer (parameter problem).
        rest: u32,
        src: Addr6,
        dst: Addr6,
        quote_src: Endpoint6,
        quote_dst: Endpoint6,
        tcp: bool,
        /// Bytes of the quoted L4 header kept.
        keep: u8,
        quoted_checksum_ok: bool,
    },
    /// Neighbor Discovery: RS (133), RA (134), NS (135), NA (136), redirect (137).
    Nd {
        kind: u8,
        src: Addr6,
        dst: Addr6,
        target: Addr6,
        /// NA: router, solicited, override.
        flags: u8,
        /// Source (NS) or target (NA) link-layer address option.
        lladdr: Option<Mac>,
        /// More option bytes (possibly malformed).
        extra: Rare<Vec<u8>>,
    },
    Other {
        next_header: u8,
        src: Addr6,
        dst: Addr6,
        payload: Vec<u8>,
    },
}

/// An ICMPv6 error type: mostly one of the four RFC 4443 defines.
#[derive(Debug, Clone, Copy)]
pub struct ErrorType(pub u8);

impl<'a> Arbitrary<'a> for ErrorType {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        let b = u8::arbitrary(u)?;
        Ok(ErrorType(if b < 240 { 1 + b % 4 } else { b }))
    }
}

impl<'a> Arbitrary<'a> for L4v6 {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(match u8::arbitrary(u)? {
            0..=99 => L4v6::Tcp {
                src: Endpoint6::arbitrary(u)?,
                dst: Endpoint6::arbitrary(u)?,
                seq: u32::arbitrary(u)?,
                ack: u32::arbitrary(u)?,
                flags: Flags::arbitrary(u)?,
                window: u16::arbitrary(u)?,
                options: Vec::arbitrary(u)?,
                payload: Vec::arbitrary(u)?,
            },
            100..=149 => L4v6::Udp {
                src: Endpoint6::arbitrary(u)?,
                dst: Endpoint6::arbitrary(u)?,
                payload: Vec::arbitrary(u)?,
                no_checksum: u8::arbitrary(u)? < 16,
            },
            150..=169 => L4v6::Echo {
                request: bool::arbitrary(u)?,
                src: Addr6::arbitrary(u)?,
                dst: Addr6::arbitrary(u)?,
                ident: u16::arbitrary(u)?,
                seq: u16::arbitrary(u)?,
                data: Vec::arbitrary(u)?,
            },
            170..=209 => L4v6::Error {
                icmp_type: ErrorType::arbitrary(u)?,
                code: u8::arbitrary(u)? % 8,
                rest: u32::arbitrary(u)?,
                src: Addr6::arbitrary(u)?,
                dst: Addr6::arbitrary(u)?,
                quote_src: Endpoint6::arbitrary(u)?,
                quote_dst: Endpoint6::arbitrary(u)?,
                tcp: bool::arbitrary(u)?,
                keep: u8::arbitrary(u)?,
                quoted_checksum_ok: u8::arbitrary(u)? < 224,
            },
            210..=245 => L4v6::Nd {
                kind: 133 + u8::arbitrary(u)? % 5,
                src: Addr6::arbitrary(u)?,
                dst: Addr6::arbitrary(u)?,
                target: Addr6::arbitrary(u)?,
                flags: u8::arbitrary(u)?,
                lladdr: Option::arbitrary(u)?,
                extra: Rare::arbitrary(u)?,
            },
            _ => L4v6::Other {
                next_header: u8::arbitrary(u)?,
                src: Addr6::arbitrary(u)?,
                dst: Addr6::arbitrary(u)?,
                payload: Vec::arbitrary(u)?,
            },
        })
    }
}

const MAX_PAYLOAD: usize = 1480;

impl Universe<'_> {
    fn addr(&self, a: Addr) -> Ipv4Addr {
        match a {
            Addr::Known(i) if !self.addrs.is_empty() => self.addrs[i as usize % self.addrs.len()],
            Addr::Known(i) => Ipv4Addr::from(u32::from(i)),
            Addr::Raw(x) => Ipv4Addr::from(x),
        }
    }

    fn port(&self, p: Port) -> u16 {
        match p {
            Port::Known(i) if !self.ports.is_empty() => self.ports[i as usize % self.ports.len()],
            Port::Known(i) => u16::from(i),
            Port::Raw(x) => x,
        }
    }

    fn endpoint(&self, e: Endpoint) -> (Ipv4Addr, u16) {
        match e {
            Endpoint::Known(i) if !self.endpoints.is_empty() => {
                self.endpoints[i as usize % self.endpoints.len()]
            }
            Endpoint::Known(i) => (Ipv4Addr::from(u32::from(i)), u16::from(i)),
            Endpoint::Apart(a, p) => (self.addr(a), self.port(p)),
        }
    }

    fn addr6(&self, a: Addr6) -> Ipv6Addr {
        match a {
            Addr6::Known(i) if !self.addrs6.is_empty() => {
                self.addrs6[i as usize % self.addrs6.len()]
            }
            Addr6::Known(i) => Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, u16::from(i)),
            Addr6::Raw(x) => Ipv6Addr::from(x),
        }
    }

    fn endpoint6(&self, e: Endpoint6) -> (Ipv6Addr, u16) {
        match e {
            Endpoint6::Known(i) if !self.endpoints6.is_empty() => {
                self.endpoints6[i as usize % self.endpoints6.len()]
            }
            Endpoint6::Known(i) => (self.addr6(Addr6::Known(i)), u16::from(i)),
            Endpoint6::Apart(a, p) => (self.addr6(a), self.port(p)),
        }
    }

    fn mac(&self, m: Mac) -> [u8; 6] {
        match m {
            Mac::Ours => self.our_mac,
            Mac::Known(i) if !self.macs.is_empty() => self.macs[i as usize % self.macs.len()],
            Mac::Known(i) => [2, 0, 0, 0, 0, i],
            Mac::Broadcast => [0xff; 6],
            Mac::Raw(m) => m,
        }
    }

    /// The frame `spec` describes.
    pub fn build(&self, spec: &FrameSpec) -> Vec<u8> {
        let mut f = Vec::with_capacity(128);
        f.extend_from_slice(&self.mac(spec.dst_mac));
        f.extend_from_slice(&self.mac(spec.src_mac.0));
        if let Some(tci) = spec.vlan.0 {
            f.extend_from_slice(&[0x81, 0x00]);
            f.extend_from_slice(&tci.to_be_bytes());
        }
        match &spec.body {
            Body::Arp {
                op,
                sender_mac,
                sender,
                target_mac,
                target,
                header,
            } => {
                f.extend_from_slice(&[0x08, 0x06]);
                match header {
                    Some(h) => f.extend_from_slice(h),
                    None => f.extend_from_slice(&[0, 1, 0x08, 0x00, 6, 4]),
                }
                f.extend_from_slice(&[0, *op % 4]);
                f.extend_from_slice(&self.mac(*sender_mac));
                f.extend_from_slice(&self.addr(*sender).octets());
                f.extend_from_slice(&self.mac(*target_mac));
                f.extend_from_slice(&self.addr(*target).octets());
                f.resize(f.len().max(60), 0);
            }
            Body::Ipv4(ip) => {
                f.extend_from_slice(&[0x08, 0x00]);
                let l3 = f.len();
                self.ipv4(&mut f, ip);
                match ip.damage {
                    Damage::None | Damage::L4Checksum => {}
                    Damage::IpChecksum => f[l3 + 10] ^= 0x01,
                    Damage::TotalLen(d) => {
                        let t = u16::from_be_bytes([f[l3 + 2], f[l3 + 3]]);
                        let t = t.wrapping_add_signed(i16::from(d));
                        f[l3 + 2..l3 + 4].copy_from_slice(&t.to_be_bytes());
                        fix_ip_checksum(&mut f[l3..]);
                    }
                    Damage::Cut(n) => {
                        let keep = f.len().saturating_sub(usize::from(n));
                        f.truncate(keep);
                    }
                    Damage::IpHeaderByte(at, x) => {
                        if let Some(b) = f.get_mut(l3 + usize::from(at % 20)) {
                            *b ^= x;
                        }
                        fix_ip_checksum(&mut f[l3..]);
                    }
                }
                f.extend(std::iter::repeat_n(0, usize::from(ip.padding % 64)));
            }
            Body::Ipv6(ip) => {
                f.extend_from_slice(&[0x86, 0xdd]);
                let l3 = f.len();
                self.ipv6(&mut f, ip);
                match ip.damage {
                    Damage6::None | Damage6::L4Checksum => {}
                    Damage6::PayloadLen(d) => {
                        let t = u16::from_be_bytes([f[l3 + 4], f[l3 + 5]]);
                        let t = t.wrapping_add_signed(i16::from(d));
                        f[l3 + 4..l3 + 6].copy_from_slice(&t.to_be_bytes());
                    }
                    Damage6::Cut(n) => {
                        let keep = f.len().saturating_sub(usize::from(n));
                        f.truncate(keep);
                    }
                    Damage6::HeaderByte(at, x) => {
                        if let Some(b) = f.get_mut(l3 + usize::from(at % 40)) {
                            *b ^= x;
                        }
                    }
                }
                f.extend(std::iter::repeat_n(0, usize::from(ip.padding % 64)));
            }
            Body::Raw(bytes) => {
                f.truncate(12);
                f.extend_from_slice(&bytes[..bytes.len().min(MAX_PAYLOAD + 60)]);
            }
        }
        f
    }

    fn ipv4(&self, f: &mut Vec<u8>, ip: &Ipv4Spec) {
        let l3 = f.len();
        let mut options: Vec<u8> = ip.options.0.clone().unwrap_or_default();
        options.truncate(40);
        while !options.len().is_multiple_of(4) {
            options.push(0);
        }
        let header_len = 20 + options.len();
        // TCP and UDP take their addresses from their endpoints.
        let (src, dst, sport, dport) = match &ip.l4 {
            L4::Tcp { src, dst, .. } | L4::Udp { src, dst, .. } => {
                let (s, sp) = self.endpoint(*src);
                let (d, dp) = self.endpoint(*dst);
                (s, d, sp, dp)
            }
            _ => (self.addr(ip.src), self.addr(ip.dst), 0, 0),
        };
        let (frag_word, protocol) = (
            match ip.frag {
                Frag::None => 0,
                Frag::DontFragment => 0x4000,
                Frag::MoreFragments => 0x2000,
                Frag::Offset(o) => o & 0x3fff,
            },
            match &ip.l4 {
                L4::Tcp { .. } => 6,
                L4::Udp { .. } => 17,
                L4::Icmp { .. } => 1,
                L4::Other { protocol, .. } => *protocol,
            },
        );
        f.extend_from_slice(&[(0x40 | (header_len / 4)) as u8, ip.tos, 0, 0]);
        f.extend_from_slice(&ip.ident.to_be_bytes());
        f.extend_from_slice(&frag_word.to_be_bytes());
        f.extend_from_slice(&[ip.ttl, protocol, 0, 0]);
        f.extend_from_slice(&src.octets());
        f.extend_from_slice(&dst.octets());
        f.extend_from_slice(&options);
        let l4 = f.len();
        match &ip.l4 {
            L4::Tcp {
                seq,
                ack,
                flags,
                window,
                options,
                payload,
                ..
            } => {
                let opts = tcp_options(options);
                f.extend_from_slice(&sport.to_be_bytes());
                f.extend_from_slice(&dport.to_be_bytes());
                f.extend_from_slice(&seq.to_be_bytes());
                f.extend_from_slice(&ack.to_be_bytes());
                f.extend_from_slice(&[(((20 + opts.len()) / 4) << 4) as u8, flags.0]);
                f.extend_from_slice(&window.to_be_bytes());
                f.extend_from_slice(&[0, 0, 0, 0]);
                f.extend_from_slice(&opts);
                f.extend_from_slice(&payload[..payload.len().min(MAX_PAYLOAD)]);
            }
            L4::Udp { payload, .. } => {
                let payload = &payload[..payload.len().min(MAX_PAYLOAD)];
                f.extend_from_slice(&sport.to_be_bytes());
                f.extend_from_slice(&dport.to_be_bytes());
                f.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
                f.extend_from_slice(&[0, 0]);
                f.extend_from_slice(payload);
            }
            L4::Icmp {
                icmp_type,
                code,
                rest,
                body,
            } => {
                f.extend_from_slice(&[*icmp_type, *code, 0, 0]);
                f.extend_from_slice(&rest.to_be_bytes());
                match body {
                    IcmpBody::Data(d) => f.extend_from_slice(&d[..d.len().min(MAX_PAYLOAD)]),
                    IcmpBody::Quote {
                        src,
                        dst,
                        tcp,
                        keep,
                        quoted_checksum_ok,
                    } => {
                        let (qs, sp) = self.endpoint(*src);
                        let (qd, dp) = self.endpoint(*dst);
                        let inner = if *tcp {
                            let mut t =
                                tcp_frame([0; 6], [0; 6], qs.octets(), qd.octets(), sp, dp, 0x02);
                            if !quoted_checksum_ok {
                                t[14 + 20 + 16] ^= 0x55;
                            }
                            t
                        } else {
                            let mut u = udp_frame(qs.octets(), qd.octets(), sp, dp, b"quoted");
                            if !quoted_checksum_ok {
                                u[14 + 20 + 6] ^= 0x55;
                            }
                            u
                        };
                        let keep = 20 + usize::from(*keep).min(inner.len() - 34);
                        f.extend_from_slice(&inner[14..14 + keep]);
                    }
                }
            }
            L4::Other { payload, .. } => {
                f.extend_from_slice(&payload[..payload.len().min(MAX_PAYLOAD)]);
            }
        }
        let total = f.len() - l3;
        f[l3 + 2..l3 + 4].copy_from_slice(&(total as u16).to_be_bytes());
        fix_ip_checksum(&mut f[l3..]);
        let seg = l4 - l3;
        let csum_at = match (&ip.l4, protocol) {
            (L4::Tcp { .. }, _) => Some(16),
            (L4::Udp { no_checksum, .. }, _) => (!no_checksum).then_some(6),
            (L4::Icmp { .. }, _) => Some(2),
            _ => None,
        };
        if let Some(at) = csum_at {
            let body = &f[l4..];
            let mut total_sum = sum(body);
            if protocol != 1 {
                total_sum += pseudo(src, dst, protocol, body.len());
            }
            let mut c = finish(total_sum);
            if protocol == 17 && c == 0 {
                c = 0xffff;
            }
            if matches!(ip.damage, Damage::L4Checksum) {
                c ^= 0x0101;
            }
            if f.len() >= l4 + at + 2 {
                f[l4 + at..l4 + at + 2].copy_from_slice(&c.to_be_bytes());
            }
        }
        let _ = seg;
    }
}

impl Universe<'_> {
    fn ipv6(&self, f: &mut Vec<u8>, ip: &Ipv6Spec) {
        let l3 = f.len();
        let (src, dst, upper, body, csum_at) = self.upper6(&ip.l4);
        let mut exts = Vec::new();
        let mut kinds = Vec::new();
        for e in ip.ext.0.iter().flatten().take(8) {
            // The fragment header has a fixed 8 bytes; the others a length byte.
            let (kind, mut bytes, fixed) = match e {
                ExtHeader::HopByHop(d) => (0u8, options_body(d), false),
                ExtHeader::DestinationOptions(d) => (60, options_body(d), false),
                ExtHeader::Routing {
                    routing_type,
                    segments_left,
                    data,
                } => {
                    let mut b = vec![*routing_type, *segments_left];
                    b.extend_from_slice(&data[..data.len().min(36)]);
                    (43, b, false)
                }
                ExtHeader::Fragment {
                    offset,
                    more,
                    ident,
                } => {
                    // Next header (chained below), reserved, offset and M flag, ident.
                    let word = (offset << 3) | u16::from(*more);
                    let mut b = vec![0, 0];
                    b.extend_from_slice(&word.to_be_bytes());
                    b.extend_from_slice(&ident.to_be_bytes());
                    (44, b, true)
                }
                ExtHeader::Raw(kind, d) => (*kind, options_body(d), false),
            };
            if !fixed {
                // Next header (chained below), length in 8-byte units after the first 8.
                while (bytes.len() + 2) % 8 != 0 {
                    bytes.push(0);
                }
                let mut h = vec![0, ((bytes.len() + 2) / 8 - 1) as u8];
                h.extend_from_slice(&bytes);
                bytes = h;
            }
            kinds.push(kind);
            exts.push(bytes);
        }
        // Chain the next-header fields: the IPv6 header's names the first extension.
        let first = kinds.first().copied().unwrap_or(upper);
        for (i, e) in exts.iter_mut().enumerate() {
            e[0] = kinds.get(i + 1).copied().unwrap_or(upper);
        }
        let ext_len: usize = exts.iter().map(Vec::len).sum();
        let payload_len = ext_len + body.len();
        f.extend_from_slice(&[0x60 | (ip.traffic_class >> 4), ip.traffic_class << 4, 0, 0]);
        f.extend_from_slice(&(payload_len.min(0xffff) as u16).to_be_bytes());
        f.extend_from_slice(&[first, ip.hop_limit.0]);
        f.extend_from_slice(&src.octets());
        f.extend_from_slice(&dst.octets());
        for e in &exts {
            f.extend_from_slice(e);
        }
        let l4 = f.len();
        f.extend_from_slice(&body);
        if let Some(at) = csum_at {
            let seg = &f[l4..];
            let mut c = finish(sum(seg) + pseudo6(src, dst, upper, seg.len()));
            if upper == 17 && c == 0 {
                c = 0xffff;
            }
            if matches!(
                ip.l4,
                L4v6::Udp {
                    no_checksum: true,
                    ..
                }
            ) {
                c = 0;
            } else if matches!(ip.damage, Damage6::L4Checksum) {
                c ^= 0x0101;
            }
            if f.len() >= l4 + at + 2 {
                f[l4 + at..l4 + at + 2].copy_from_slice(&c.to_be_bytes());
            }
        }
        let _ = l3;
    }

    /// Source, destination, next header, the upper-layer bytes (checksum zero) and
    /// where their checksum goes.
    fn upper6(&self, l4: &L4v6) -> (Ipv6Addr, Ipv6Addr, u8, Vec<u8>, Option<usize>) {
        let mut b = Vec::new();
        match l4 {
            L4v6::Tcp {
                src,
                dst,
                seq,
                ack,
                flags,
                window,
                options,
                payload,
            } => {
                let (s, sp) = self.endpoint6(*src);
                let (d, dp) = self.endpoint6(*dst);
                let opts = tcp_options(options);
                b.extend_from_slice(&sp.to_be_bytes());
                b.extend_from_slice(&dp.to_be_bytes());
                b.extend_from_slice(&seq.to_be_bytes());
                b.extend_from_slice(&ack.to_be_bytes());
                b.extend_from_slice(&[(((20 + opts.len()) / 4) << 4) as u8, flags.0]);
                b.extend_from_slice(&window.to_be_bytes());
                b.extend_from_slice(&[0, 0, 0, 0]);
                b.extend_from_slice(&opts);
                b.extend_from_slice(&payload[..payload.len().min(MAX_PAYLOAD)]);
                (s, d, 6, b, Some(16))
            }
            L4v6::Udp {
                src, dst, payload, ..
            } => {
                let (s, sp) = self.endpoint6(*src);
                let (d, dp) = self.endpoint6(*dst);
                let payload = &payload[..payload.len().min(MAX_PAYLOAD)];
                b.extend_from_slice(&sp.to_be_bytes());
                b.extend_from_slice(&dp.to_be_bytes());
                b.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
                b.extend_from_slice(&[0, 0]);
                b.extend_from_slice(payload);
                (s, d, 17, b, Some(6))
            }
            L4v6::Echo {
                request,
                src,
                dst,
                ident,
                seq,
                data,
            } => {
                b.extend_from_slice(&[if *request { 128 } else { 129 }, 0, 0, 0]);
                b.extend_from_slice(&ident.to_be_bytes());
                b.extend_from_slice(&seq.to_be_bytes());
                b.extend_from_slice(&data[..data.len().min(MAX_PAYLOAD)]);
                (self.addr6(*src), self.addr6(*dst), 58, b, Some(2))
            }
            L4v6::Error {
                icmp_type,
                code,
                rest,
                src,
                dst,
                quote_src,
                quote_dst,
                tcp,
                keep,
                quoted_checksum_ok,
            } => {
                b.extend_from_slice(&[icmp_type.0, *code, 0, 0]);
                b.extend_from_slice(&rest.to_be_bytes());
                let (qs, sp) = self.endpoint6(*quote_src);
                let (qd, dp) = self.endpoint6(*quote_dst);
                let mut inner = packet6(qs, qd, sp, dp, *tcp);
                if !quoted_checksum_ok {
                    inner[40 + if *tcp { 16 } else { 6 }] ^= 0x55;
                }
                let keep = 40 + usize::from(*keep).min(inner.len() - 40);
                b.extend_from_slice(&inner[..keep]);
                (self.addr6(*src), self.addr6(*dst), 58, b, Some(2))
            }
            L4v6::Nd {
                kind,
                src,
                dst,
                target,
                flags,
                lladdr,
                extra,
            } => {
                b.extend_from_slice(&[*kind, 0, 0, 0]);
                match kind {
                    136 => b.extend_from_slice(&[flags & 0xe0, 0, 0, 0]),
                    134 => b.extend_from_slice(&[64, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]),
                    _ => b.extend_from_slice(&[0, 0, 0, 0]),
                }
                if matches!(kind, 135..=137) {
                    b.extend_from_slice(&self.addr6(*target).octets());
                }
                if *kind == 137 {
                    b.extend_from_slice(&self.addr6(*src).octets());
                }
                if let Some(m) = lladdr {
                    // Source link-layer address (1), target's for an NA (2).
                    b.extend_from_slice(&[if *kind == 136 { 2 } else { 1 }, 1]);
                    b.extend_from_slice(&self.mac(*m));
                }
                if let Some(x) = &extra.0 {
                    b.extend_from_slice(&x[..x.len().min(64)]);
                }
                (self.addr6(*src), self.addr6(*dst), 58, b, Some(2))
            }
            L4v6::Other {
                next_header,
                src,
                dst,
                payload,
            } => {
                b.extend_from_slice(&payload[..payload.len().min(MAX_PAYLOAD)]);
                (self.addr6(*src), self.addr6(*dst), *next_header, b, None)
            }
        }
    }
}

/// Options-header body bytes (cut to 38 so the header stays within 40).
fn options_body(d: &[u8]) -> Vec<u8> {
    d[..d.len().min(38)].to_vec()
}

/// IPv6 pseudo-header sum (RFC 8200 section 8.1), written here, not the crate's.
fn pseudo6(src: Ipv6Addr, dst: Ipv6Addr, next_header: u8, len: usize) -> u64 {
    let mut b = Vec::with_capacity(40);
    b.extend_from_slice(&src.octets());
    b.extend_from_slice(&dst.octets());
    b.extend_from_slice(&(len as u32).to_be_bytes());
    b.extend_from_slice(&[0, 0, 0, next_header]);
    sum(&b)
}

/// An IPv6 TCP SYN or UDP datagram (no Ethernet), checksum right: what an ICMPv6
/// error quotes.
pub fn packet6(src: Ipv6Addr, dst: Ipv6Addr, sport: u16, dport: u16, tcp: bool) -> Vec<u8> {
    let mut l4 = Vec::new();
    l4.extend_from_slice(&sport.to_be_bytes());
    l4.extend_from_slice(&dport.to_be_bytes());
    let next = if tcp {
        l4.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x50, 0x02, 0xff, 0xff, 0, 0, 0, 0]);
        6
    } else {
        l4.extend_from_slice(&[0, 14, 0, 0]);
        l4.extend_from_slice(b"quoted");
        17
    };
    let c = finish(sum(&l4) + pseudo6(src, dst, next, l4.len()));
    let at = if tcp { 16 } else { 6 };
    l4[at..at + 2].copy_from_slice(&c.to_be_bytes());
    let mut p = vec![0x60, 0, 0, 0];
    p.extend_from_slice(&(l4.len() as u16).to_be_bytes());
    p.extend_from_slice(&[next, 64]);
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&dst.octets());
    p.extend_from_slice(&l4);
    p
}

/// TCP options as a stack writes them, padded with NOPs to a multiple of 4.
fn tcp_options(options: &[TcpOption]) -> Vec<u8> {
    let mut opts = Vec::new();
    for o in options {
        match o {
            TcpOption::Mss(m) => {
                opts.extend_from_slice(&[2, 4]);
                opts.extend_from_slice(&m.to_be_bytes());
            }
            TcpOption::Toa(b) => {
                opts.extend_from_slice(&[254, 8]);
                opts.extend_from_slice(b);
            }
            TcpOption::Nop => opts.push(1),
            TcpOption::End => opts.push(0),
            TcpOption::WindowScale(s) => opts.extend_from_slice(&[3, 3, *s]),
            TcpOption::SackPermitted => opts.extend_from_slice(&[4, 2]),
            TcpOption::Timestamps(a, b) => {
                opts.extend_from_slice(&[8, 10]);
                opts.extend_from_slice(&a.to_be_bytes());
                opts.extend_from_slice(&b.to_be_bytes());
            }
            TcpOption::Raw(kind, bytes) => {
                opts.push(*kind);
                opts.extend_from_slice(&bytes[..bytes.len().min(10)]);
            }
        }
    }
    opts.truncate(40);
    while opts.len() % 4 != 0 {
        opts.push(1);
    }
    opts
}

/// Recomputes the IPv4 header checksum of the packet at the start of `p`.
pub fn fix_ip_checksum(p: &mut [u8]) {
    let header_len = (usize::from(p[0] & 0x0f) * 4).clamp(20, p.len().min(60));
    p[10] = 0;
    p[11] = 0;
    let c = finish(sum(&p[..header_len]));
    p[10..12].copy_from_slice(&c.to_be_bytes());
}

/// An Ethernet/IPv4/TCP frame with no options or payload, checksums right.
pub fn tcp_frame(
    dst_mac: [u8; 6],
    src_mac: [u8; 6],
    src: [u8; 4],
    dst: [u8; 4],
    sport: u16,
    dport: u16,
    flags: u8,
) -> Vec<u8> {
    let mut f = Vec::with_capacity(54);
    f.extend_from_slice(&dst_mac);
    f.extend_from_slice(&src_mac);
    f.extend_from_slice(&[0x08, 0x00, 0x45, 0, 0, 40, 0, 1, 0x40, 0, 64, 6, 0, 0]);
    f.extend_from_slice(&src);
    f.extend_from_slice(&dst);
    fix_ip_checksum(&mut f[14..]);
    f.extend_from_slice(&sport.to_be_bytes());
    f.extend_from_slice(&dport.to_be_bytes());
    f.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x50, flags, 0xff, 0xff, 0, 0, 0, 0]);
    let c = finish(pseudo(src.into(), dst.into(), 6, 20) + sum(&f[34..]));
    f[50..52].copy_from_slice(&c.to_be_bytes());
    f
}

/// An Ethernet/IPv4/UDP frame (MACs zero), checksums right.
pub fn udp_frame(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; 12];
    let total = 28 + payload.len();
    f.extend_from_slice(&[0x08, 0x00, 0x45, 0]);
    f.extend_from_slice(&(total as u16).to_be_bytes());
    f.extend_from_slice(&[0, 1, 0x40, 0, 64, 17, 0, 0]);
    f.extend_from_slice(&src);
    f.extend_from_slice(&dst);
    fix_ip_checksum(&mut f[14..]);
    f.extend_from_slice(&sport.to_be_bytes());
    f.extend_from_slice(&dport.to_be_bytes());
    f.extend_from_slice(&((8 + payload.len()) as u16).to_be_bytes());
    f.extend_from_slice(&[0, 0]);
    f.extend_from_slice(payload);
    let mut c = finish(pseudo(src.into(), dst.into(), 17, 8 + payload.len()) + sum(&f[34..]));
    if c == 0 {
        c = 0xffff;
    }
    f[40..42].copy_from_slice(&c.to_be_bytes());
    f
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::{self, Frame};

    const C: [u8; 6] = [2, 0, 0, 0, 1, 0];
    const L: [u8; 6] = [2, 0x53, 0x4c, 0, 0, 1];

    fn universe() -> Universe<'static> {
        Universe {
            our_mac: L,
            macs: &[],
            addrs: &[],
            ports: &[],
            endpoints: &[],
            addrs6: &[],
            endpoints6: &[],
        }
    }

    fn raw6(a: &str) -> Addr6 {
        Addr6::Raw(a.parse::<Ipv6Addr>().unwrap().octets())
    }

    fn v6(l4: L4v6, ext: Option<Vec<ExtHeader>>, damage: Damage6) -> FrameSpec {
        FrameSpec {
            dst_mac: Mac::Ours,
            src_mac: SourceMac(Mac::Raw(C)),
            vlan: Rare(None),
            body: Body::Ipv6(Ipv6Spec {
                traffic_class: 0,
                hop_limit: HopLimit(if matches!(l4, L4v6::Nd { .. }) {
                    255
                } else {
                    64
                }),
                ext: Rare(ext),
                l4,
                damage,
                padding: 0,
            }),
        }
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// The builder's IPv6 frames are byte for byte what scapy 2.5 writes for the same
    /// packets (`bytes(Ether(...)/IPv6(...)/...)`, hex below), checksums included.
    #[test]
    fn ipv6_frames_match_scapy() {
        // Ether/IPv6(src=2001:db8:18::9, dst=ff02::1:ff00:1, hlim=255)/
        // ICMPv6ND_NS(tgt=2001:db8:18::1)/ICMPv6NDOptSrcLLAddr(lladdr=02:00:00:00:01:00)
        let ns = v6(
            L4v6::Nd {
                kind: 135,
                src: raw6("2001:db8:18::9"),
                dst: raw6("ff02::1:ff00:1"),
                target: raw6("2001:db8:18::1"),
                flags: 0,
                lladdr: Some(Mac::Raw(C)),
                extra: Rare(None),
            },
            None,
            Damage6::None,
        );
        assert_eq!(
            universe().build(&ns),
            hex("02534c00000102000000010086dd6000000000203aff20010db8001800000000000000000009ff0200000000000000000001ff00000187001af20000000020010db80018000000000000000000010101020000000100")
        );
        // Ether/IPv6(src=2001:db8:18::9, dst=2001:db8:18::200)/IPv6ExtHdrHopByHop()/
        // UDP(sport=33000, dport=53)/Raw(b"abc"): scapy pads the empty header with PadN.
        let udp = |damage| {
            v6(
                L4v6::Udp {
                    src: Endpoint6::Apart(raw6("2001:db8:18::9"), Port::Raw(33000)),
                    dst: Endpoint6::Apart(raw6("2001:db8:18::200"), Port::Raw(53)),
                    payload: b"abc".to_vec(),
                    no_checksum: false,
                },
                Some(vec![ExtHeader::HopByHop(vec![1, 4, 0, 0, 0, 0])]),
                damage,
            )
        };
        let good = universe().build(&udp(Damage6::None));
        assert_eq!(
            good,
            hex("02534c00000102000000010086dd600000000013004020010db800180000000000000000000920010db8001800000000000000000200110001040000000080e80035000b5cad616263")
        );
        // A damaged checksum is damaged (the checker reads packets without extension
        // headers, so look at the bytes).
        let bad = universe().build(&udp(Damage6::L4Checksum));
        assert_ne!(good[68..70], bad[68..70]);
    }

    /// An IPv6 TCP frame's checksum verifies by the fuzz crate's checker, and a
    /// damaged one does not.
    #[test]
    fn ipv6_tcp_checksums_verify_unless_damaged() {
        let tcp = |damage| {
            v6(
                L4v6::Tcp {
                    src: Endpoint6::Apart(raw6("2001:db8:18::9"), Port::Raw(33000)),
                    dst: Endpoint6::Apart(raw6("2001:db8:18::100"), Port::Raw(80)),
                    seq: 1000,
                    ack: 0,
                    flags: Flags(0x02),
                    window: 65535,
                    options: vec![TcpOption::Mss(1440)],
                    payload: vec![],
                },
                None,
                damage,
            )
        };
        let ok = check::inspect(&universe().build(&tcp(Damage6::None))).unwrap();
        assert_eq!(
            ok,
            Frame::Ipv6 {
                protocol: 6,
                l4_ok: true
            }
        );
        let bad = check::inspect(&universe().build(&tcp(Damage6::L4Checksum))).unwrap();
        assert_eq!(
            bad,
            Frame::Ipv6 {
                protocol: 6,
                l4_ok: false
            }
        );
    }

    /// Any extension header, whatever its kind byte (a raw 44, the fragment header's
    /// number, included), builds: the fuzzer found the builder indexing an empty one.
    #[test]
    fn every_extension_header_builds() {
        for ext in [
            ExtHeader::Raw(44, vec![]),
            ExtHeader::Raw(0, vec![]),
            ExtHeader::Fragment {
                offset: 1,
                more: true,
                ident: 7,
            },
            ExtHeader::Routing {
                routing_type: 0,
                segments_left: 1,
                data: vec![0; 80],
            },
            ExtHeader::DestinationOptions(vec![0xff; 100]),
        ] {
            let spec = v6(
                L4v6::Other {
                    next_header: 59,
                    src: raw6("2001:db8:18::9"),
                    dst: raw6("2001:db8:18::1"),
                    payload: vec![],
                },
                Some(vec![ext]),
                Damage6::None,
            );
            let f = universe().build(&spec);
            assert_eq!((f.len() - 54) % 8, 0, "{f:02x?}");
        }
    }
}
