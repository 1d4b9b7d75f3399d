//! Packet capture (`sluicectl capture`): the workers copy the frames a filter selects
//! into per-worker rings of preallocated slots, and the management core drains them
//! into a pcapng file (`daemon::capture`).
//!
//! Each worker has two bounded lock-free queues of boxed slots: `free` (empty slots)
//! and `full` (copies for the management core). A worker pops a free slot, copies,
//! pushes it to `full`; the management core pops it, writes it, and hands it back to
//! `free`. No allocation on a worker (the slots are allocated by the management core
//! when a capture starts) and no lock. When no free slot is left the copy is dropped
//! and counted. While no capture runs a worker pays one relaxed load and one
//! predictable branch per burst ([`CaptureTap::tap`]).
//!
//! The filter is kept in atomics, written by the management core before it publishes
//! the capture's generation with release ordering; a worker that loaded that
//! generation with acquire ordering reads the filter that goes with it. Copies carry
//! the generation they were made under, so copies made for an earlier capture are
//! told apart and discarded.
use crate::dpdk::Burst;
use crate::wire::{ethernet, ipv6};
use crossbeam::queue::ArrayQueue;
use serde::{Deserialize, Serialize};
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

/// The most bytes of a frame a capture keeps (the snap length's upper bound).
pub const MAX_SNAPLEN: u16 = 2048;
/// Slots per worker: at the management core's 5 ms drain period, 200,000 copies a
/// second per worker before copies are dropped.
pub const RING_SLOTS: usize = 1024;
/// Address filters a capture can combine.
pub const MAX_ENDPOINTS: usize = 4;

/// Which way a frame went through the port.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    Rx,
    Tx,
}

/// An address, and optionally a TCP/UDP port on the same side: a VIP, a real server
/// or any host. A packet matches when its source is it or its destination is it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Endpoint {
    pub ip: IpAddr,
    #[serde(default)]
    pub port: Option<u16>,
}

/// What a capture keeps. Empty fields select everything; set fields must all match;
/// the endpoints are alternatives (any one may match).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CaptureFilter {
    /// DPDK port indexes (empty: every port).
    #[serde(default)]
    pub ports: Vec<u16>,
    /// Direction (none: both).
    #[serde(default)]
    pub direction: Option<Direction>,
    /// IP protocol number: IPv4's protocol, or the upper-layer protocol after an
    /// IPv6 packet's extension headers (6 TCP, 17 UDP, 1 ICMP, 58 ICMPv6).
    #[serde(default)]
    pub proto: Option<u8>,
    /// TCP/UDP source or destination port.
    #[serde(default)]
    pub l4_port: Option<u16>,
    /// At most [`MAX_ENDPOINTS`].
    #[serde(default)]
    pub endpoints: Vec<Endpoint>,
}

impl CaptureFilter {
    /// Checks the limits; the error names the field.
    pub fn validate(&self) -> Result<(), String> {
        if self.endpoints.len() > MAX_ENDPOINTS {
            return Err(format!(
                "endpoints: {} given, at most {MAX_ENDPOINTS} (--vip, --rs and --host together)",
                self.endpoints.len()
            ));
        }
        if let Some(p) = self.ports.iter().find(|p| **p >= 64) {
            return Err(format!("ports: port index {p} out of range 0-63"));
        }
        Ok(())
    }

    /// The tcpdump (BPF) expression that selects the same IPv4 and IPv6 frames, for
    /// comparing with tcpdump on a wire (direction and port are not part of it).
    pub fn bpf(&self) -> String {
        let mut terms = Vec::new();
        match self.proto {
            Some(6) => terms.push("tcp".to_string()),
            Some(17) => terms.push("udp".to_string()),
            Some(1) => terms.push("icmp".to_string()),
            Some(58) => terms.push("icmp6".to_string()),
            Some(p) => terms.push(format!("(ip proto {p} or ip6 proto {p})")),
            None if self.l4_port.is_some() || !self.endpoints.is_empty() => {
                terms.push("(ip or ip6)".to_string())
            }
            None => {}
        }
        if let Some(p) = self.l4_port {
            terms.push(format!("port {p}"));
        }
        if !self.endpoints.is_empty() {
            let ends: Vec<String> = self
                .endpoints
                .iter()
                .map(|e| match e.port {
                    Some(p) => format!(
                        "(src host {0} and src port {p}) or (dst host {0} and dst port {p})",
                        e.ip
                    ),
                    None => format!("host {}", e.ip),
                })
                .collect();
            terms.push(format!("({})", ends.join(" or ")));
        }
        terms.join(" and ")
    }
}

/// One copied frame.
pub struct Copied {
    pub generation: u32,
    pub port: u16,
    pub direction: Direction,
    /// The worker's TSC when its poll started.
    pub tsc: u64,
    /// The frame's whole length; `len` bytes of it are in `data`.
    pub original_len: u32,
    pub len: u16,
    pub data: [u8; MAX_SNAPLEN as usize],
}

impl Copied {
    pub fn empty() -> Box<Copied> {
        Box::new(Copied {
            generation: 0,
            port: 0,
            direction: Direction::Rx,
            tsc: 0,
            original_len: 0,
            len: 0,
            data: [0; MAX_SNAPLEN as usize],
        })
    }

    pub fn bytes(&self) -> &[u8] {
        &self.data[..usize::from(self.len)]
    }
}

/// One worker's rings and counts.
pub struct WorkerRing {
    pub free: ArrayQueue<Box<Copied>>,
    pub full: ArrayQueue<Box<Copied>>,
    /// Frames the filter selected and this worker copied, and those it could not copy
    /// for want of a free slot (both since the daemon started).
    pub copied: AtomicU64,
    pub dropped: AtomicU64,
}

/// What the management core and every worker share.
pub struct Capture {
    /// Generation << 1 | running.
    state: AtomicU64,
    ports: AtomicU64,
    /// 0 both, 1 rx, 2 tx.
    direction: AtomicU8,
    /// 0x100 | protocol, or 0.
    proto: AtomicU16,
    /// 0x1_0000 | port, or 0.
    l4_port: AtomicU32,
    endpoint_count: AtomicU8,
    /// The address as 128 bits (an IPv4 one mapped, `::ffff:a.b.c.d`), high and low
    /// halves, and has_port << 16 | port.
    endpoints: [(AtomicU64, AtomicU64, AtomicU32); MAX_ENDPOINTS],
    snaplen: AtomicU16,
    pub rings: Box<[WorkerRing]>,
    /// Whether any slots were allocated (on the first start).
    filled: AtomicBool,
}

impl Capture {
    pub fn new(workers: usize) -> Capture {
        Capture {
            state: AtomicU64::new(0),
            ports: AtomicU64::new(0),
            direction: AtomicU8::new(0),
            proto: AtomicU16::new(0),
            l4_port: AtomicU32::new(0),
            endpoint_count: AtomicU8::new(0),
            endpoints: Default::default(),
            snaplen: AtomicU16::new(MAX_SNAPLEN),
            rings: (0..workers)
                .map(|_| WorkerRing {
                    free: ArrayQueue::new(RING_SLOTS),
                    full: ArrayQueue::new(RING_SLOTS),
                    copied: AtomicU64::new(0),
                    dropped: AtomicU64::new(0),
                })
                .collect(),
            filled: AtomicBool::new(false),
        }
    }

    /// Starts a capture (management core): sets the filter, then publishes the next
    /// generation. Returns that generation. The first start allocates the slots.
    pub fn start(&self, filter: &CaptureFilter, snaplen: u16) -> u32 {
        self.stop();
        if !self.filled.swap(true, Ordering::Relaxed) {
            for ring in self.rings.iter() {
                while ring.free.push(Copied::empty()).is_ok() {}
            }
        }
        let ports = filter.ports.iter().fold(0u64, |m, p| m | 1 << (p & 63));
        self.ports.store(ports, Ordering::Relaxed);
        self.direction.store(
            match filter.direction {
                None => 0,
                Some(Direction::Rx) => 1,
                Some(Direction::Tx) => 2,
            },
            Ordering::Relaxed,
        );
        self.proto.store(
            filter.proto.map_or(0, |p| 0x100 | u16::from(p)),
            Ordering::Relaxed,
        );
        self.l4_port.store(
            filter.l4_port.map_or(0, |p| 0x1_0000 | u32::from(p)),
            Ordering::Relaxed,
        );
        let n = filter.endpoints.len().min(MAX_ENDPOINTS);
        for ((hi, lo, port), e) in self.endpoints.iter().zip(&filter.endpoints) {
            let ip = address_bits(e.ip);
            hi.store((ip >> 64) as u64, Ordering::Relaxed);
            lo.store(ip as u64, Ordering::Relaxed);
            port.store(
                e.port.map_or(0, |p| 1 << 16 | u32::from(p)),
                Ordering::Relaxed,
            );
        }
        self.endpoint_count.store(n as u8, Ordering::Relaxed);
        self.snaplen
            .store(snaplen.clamp(1, MAX_SNAPLEN), Ordering::Relaxed);
        let generation = ((self.state.load(Ordering::Relaxed) >> 1) as u32).wrapping_add(1);
        self.state
            .store(u64::from(generation) << 1 | 1, Ordering::Release);
        generation
    }

    /// Stops the running capture, if any (workers see it at their next burst).
    pub fn stop(&self) {
        let s = self.state.load(Ordering::Relaxed);
        self.state.store(s & !1, Ordering::Release);
    }

    /// The generation of the running capture.
    pub fn running(&self) -> Option<u32> {
        let s = self.state.load(Ordering::Acquire);
        (s & 1 == 1).then_some((s >> 1) as u32)
    }

    /// The filter as the workers read it, when a capture runs.
    fn armed(&self) -> Option<Armed> {
        let s = self.state.load(Ordering::Acquire);
        if s & 1 == 0 {
            return None;
        }
        let mut endpoints = [(0u128, 0u32); MAX_ENDPOINTS];
        let n = usize::from(self.endpoint_count.load(Ordering::Relaxed)).min(MAX_ENDPOINTS);
        for (out, (hi, lo, port)) in endpoints.iter_mut().zip(&self.endpoints[..n]) {
            let ip = u128::from(hi.load(Ordering::Relaxed)) << 64
                | u128::from(lo.load(Ordering::Relaxed));
            *out = (ip, port.load(Ordering::Relaxed));
        }
        Some(Armed {
            generation: (s >> 1) as u32,
            ports: self.ports.load(Ordering::Relaxed),
            direction: self.direction.load(Ordering::Relaxed),
            proto: self.proto.load(Ordering::Relaxed),
            l4_port: self.l4_port.load(Ordering::Relaxed),
            endpoints,
            endpoint_count: n,
            snaplen: self.snaplen.load(Ordering::Relaxed),
        })
    }
}

/// A running capture's filter, read once per burst.
struct Armed {
    generation: u32,
    ports: u64,
    direction: u8,
    proto: u16,
    l4_port: u32,
    endpoints: [(u128, u32); MAX_ENDPOINTS],
    endpoint_count: usize,
    snaplen: u16,
}

impl Armed {
    fn wants_burst(&self, port: u16, direction: Direction) -> bool {
        let dir_ok = match self.direction {
            1 => direction == Direction::Rx,
            2 => direction == Direction::Tx,
            _ => true,
        };
        dir_ok && (self.ports == 0 || self.ports & (1 << (port & 63)) != 0)
    }

    /// Whether the frame passes the address, protocol and port filters.
    fn wants(&self, frame: &[u8]) -> bool {
        if self.proto == 0 && self.l4_port == 0 && self.endpoint_count == 0 {
            return true;
        }
        let Some(h) = ip_headers(frame) else {
            return false;
        };
        if self.proto != 0 && h.proto.map(u16::from) != Some(self.proto & 0xff) {
            return false;
        }
        if self.l4_port != 0 {
            let p = (self.l4_port & 0xffff) as u16;
            match h.ports {
                Some((src, dst)) if src == p || dst == p => {}
                _ => return false,
            }
        }
        if self.endpoint_count == 0 {
            return true;
        }
        self.endpoints[..self.endpoint_count]
            .iter()
            .any(|&(ip, port)| {
                let side = |addr: u128, l4: Option<u16>| {
                    addr == ip && (port & 0x1_0000 == 0 || l4 == Some((port & 0xffff) as u16))
                };
                side(h.src, h.ports.map(|p| p.0)) || side(h.dst, h.ports.map(|p| p.1))
            })
    }
}

/// An address as the filter compares it: IPv6 as is, IPv4 mapped (`::ffff:a.b.c.d`),
/// so one comparison serves both families (a mapped address is not a source or
/// destination IPv6 packets carry on a wire, RFC 4291 2.5.5.2).
fn address_bits(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(v4) => u128::from(v4.to_ipv6_mapped()),
        IpAddr::V6(v6) => u128::from(v6),
    }
}

/// What the filter reads of an IPv4 or IPv6 frame.
struct Headers {
    /// `None`: an IPv6 extension-header chain that could not be walked.
    proto: Option<u8>,
    src: u128,
    dst: u128,
    /// TCP/UDP (source, destination) ports of a first (or only) fragment.
    ports: Option<(u16, u16)>,
}

/// Reads the IP header behind an Ethernet header (no VLAN), and the TCP/UDP ports.
fn ip_headers(frame: &[u8]) -> Option<Headers> {
    match frame.get(12..14)? {
        [0x08, 0x00] => ipv4_headers(frame),
        [0x86, 0xdd] => ipv6_headers(frame),
        _ => None,
    }
}

/// The TCP/UDP ports at `l4`, when the protocol has them and they are in the frame.
fn l4_ports(frame: &[u8], proto: u8, l4: usize) -> Option<(u16, u16)> {
    let p = frame.get(l4..l4 + 4)?;
    (proto == 6 || proto == 17).then(|| {
        (
            u16::from_be_bytes([p[0], p[1]]),
            u16::from_be_bytes([p[2], p[3]]),
        )
    })
}

/// An IPv6 header, its extension headers walked to the upper layer (bounded by
/// [`ipv6::MAX_EXTENSION_HEADERS`]): the upper-layer protocol, and the ports of an
/// unfragmented packet or of a first fragment. A chain that cannot be walked
/// matches only filters without a protocol or a port.
fn ipv6_headers(frame: &[u8]) -> Option<Headers> {
    let ip = ipv6::Packet::new_checked(frame.get(ethernet::HEADER_LEN..)?).ok()?;
    if ip.version() != 6 {
        return None;
    }
    let (src, dst) = (u128::from(ip.src_addr()), u128::from(ip.dst_addr()));
    // A later fragment has no ports, but its fragment header names the protocol, as
    // an IPv4 fragment's header does; read when the fragment header comes first, the
    // layout libpcap's `tcp`/`udp` recognise too. Any other walk that fails leaves
    // the protocol unknown.
    let (proto, ports) = match ip.upper_layer() {
        Ok(upper) => {
            let proto = upper.protocol.0;
            let l4 = ethernet::HEADER_LEN + upper.offset;
            (Some(proto), l4_ports(frame, proto, l4))
        }
        Err(ipv6::ExtHeaderError::NonFirstFragment) if ip.next_header() == ipv6::ext::FRAGMENT => {
            (ip.payload().first().copied(), None)
        }
        Err(_) => (None, None),
    };
    Some(Headers {
        proto,
        src,
        dst,
        ports,
    })
}

/// Reads an IPv4 header and the TCP/UDP ports of a first (or only) fragment.
fn ipv4_headers(frame: &[u8]) -> Option<Headers> {
    let l3 = ethernet::HEADER_LEN;
    if frame.len() < l3 + 20 || frame[l3] >> 4 != 4 {
        return None;
    }
    let ihl = usize::from(frame[l3] & 0x0f) * 4;
    let proto = frame[l3 + 9];
    let word =
        |at: usize| u32::from_be_bytes([frame[at], frame[at + 1], frame[at + 2], frame[at + 3]]);
    let mapped = |w: u32| u128::from(std::net::Ipv4Addr::from(w).to_ipv6_mapped());
    let (src, dst) = (mapped(word(l3 + 12)), mapped(word(l3 + 16)));
    let offset = u16::from_be_bytes([frame[l3 + 6], frame[l3 + 7]]) & 0x1fff;
    let l4 = l3 + ihl;
    let ports = (offset == 0 && ihl >= 20)
        .then(|| l4_ports(frame, proto, l4))
        .flatten();
    Some(Headers {
        proto: Some(proto),
        src,
        dst,
        ports,
    })
}

/// A worker's end: the shared capture and its own ring.
#[derive(Clone)]
pub struct CaptureTap {
    shared: Arc<Capture>,
    worker: usize,
}

impl CaptureTap {
    pub fn new(shared: Arc<Capture>, worker: usize) -> CaptureTap {
        assert!(
            worker < shared.rings.len(),
            "capture: no ring for worker {worker}"
        );
        CaptureTap { shared, worker }
    }

    /// Copies the frames of `burst` the running capture selects, if one runs: one
    /// relaxed-cost acquire load and one branch otherwise.
    #[inline]
    pub fn tap(&self, burst: &Burst, port: u16, direction: Direction, now: u64) {
        if self.shared.state.load(Ordering::Acquire) & 1 == 0 || burst.is_empty() {
            return;
        }
        self.copy(burst, port, direction, now);
    }

    #[cold]
    #[inline(never)]
    fn copy(&self, burst: &Burst, port: u16, direction: Direction, now: u64) {
        let Some(armed) = self.shared.armed() else {
            return;
        };
        if !armed.wants_burst(port, direction) {
            return;
        }
        let ring = &self.shared.rings[self.worker];
        for i in 0..burst.len() {
            let frame = burst.packet(i);
            if !armed.wants(frame) {
                continue;
            }
            let Some(mut slot) = ring.free.pop() else {
                ring.dropped
                    .store(ring.dropped.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
                continue;
            };
            let len = frame.len().min(usize::from(armed.snaplen));
            slot.data[..len].copy_from_slice(&frame[..len]);
            slot.len = len as u16;
            slot.original_len = burst.packet_len(i);
            slot.generation = armed.generation;
            slot.port = port;
            slot.direction = direction;
            slot.tsc = now;
            // `full` has as many places as there are slots: never refused.
            let _ = ring.full.push(slot);
            ring.copied
                .store(ring.copied.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(proto: u8, src: [u8; 4], sport: u16, dst: [u8; 4], dport: u16) -> Vec<u8> {
        let mut f = vec![0u8; 14 + 20 + 8];
        f[12] = 0x08;
        f[14] = 0x45;
        f[14 + 9] = proto;
        f[14 + 12..14 + 16].copy_from_slice(&src);
        f[14 + 16..14 + 20].copy_from_slice(&dst);
        f[34..36].copy_from_slice(&sport.to_be_bytes());
        f[36..38].copy_from_slice(&dport.to_be_bytes());
        f
    }

    fn armed(filter: &CaptureFilter) -> Armed {
        let c = Capture::new(1);
        c.start(filter, 128);
        c.armed().unwrap()
    }

    #[test]
    fn filters_match_as_their_bpf_expressions_say() {
        let client = frame(6, [198, 18, 0, 6], 40000, [198, 18, 1, 1], 80);
        let reply = frame(6, [198, 18, 0, 2], 8080, [198, 18, 0, 6], 40000);
        let udp = frame(17, [198, 18, 0, 6], 5353, [198, 18, 1, 1], 53);
        let mut arp = client.clone();
        arp[12..14].copy_from_slice(&[0x08, 0x06]);

        let all = armed(&CaptureFilter::default());
        assert!([&client, &reply, &udp, &arp].iter().all(|f| all.wants(f)));

        let tcp = armed(&CaptureFilter {
            proto: Some(6),
            ..Default::default()
        });
        assert!(tcp.wants(&client) && tcp.wants(&reply) && !tcp.wants(&udp) && !tcp.wants(&arp));

        let vip = CaptureFilter {
            endpoints: vec![Endpoint {
                ip: "198.18.1.1".parse().unwrap(),
                port: Some(80),
            }],
            ..Default::default()
        };
        assert_eq!(
            vip.bpf(),
            "(ip or ip6) and ((src host 198.18.1.1 and src port 80) or (dst host 198.18.1.1 and dst port 80))"
        );
        let a = armed(&vip);
        assert!(a.wants(&client) && !a.wants(&reply) && !a.wants(&udp) && !a.wants(&arp));

        let rs_or_vip = CaptureFilter {
            endpoints: vec![
                Endpoint {
                    ip: "198.18.1.1".parse().unwrap(),
                    port: Some(80),
                },
                Endpoint {
                    ip: "198.18.0.2".parse().unwrap(),
                    port: None,
                },
            ],
            ..Default::default()
        };
        let a = armed(&rs_or_vip);
        assert!(a.wants(&client) && a.wants(&reply) && !a.wants(&udp));

        let port = armed(&CaptureFilter {
            l4_port: Some(40000),
            ..Default::default()
        });
        assert!(port.wants(&client) && port.wants(&reply) && !port.wants(&udp));
        let port53 = armed(&CaptureFilter {
            l4_port: Some(53),
            proto: Some(17),
            ..Default::default()
        });
        assert!(port53.wants(&udp) && !port53.wants(&client));

        let rx_only = armed(&CaptureFilter {
            direction: Some(Direction::Rx),
            ports: vec![1],
            ..Default::default()
        });
        assert!(rx_only.wants_burst(1, Direction::Rx));
        assert!(!rx_only.wants_burst(1, Direction::Tx) && !rx_only.wants_burst(0, Direction::Rx));
    }

    /// An IPv6 frame: `ext` extension headers of 8 bytes each (hop-by-hop first, then
    /// destination options), then `proto` with its ports; `fragment_offset` adds a
    /// fragment header with that offset (in 8-byte units) after them.
    fn frame6(
        proto: u8,
        src: &str,
        sport: u16,
        dst: &str,
        dport: u16,
        ext: usize,
        fragment_offset: Option<u16>,
    ) -> Vec<u8> {
        let mut f = vec![0u8; 14];
        f[12..14].copy_from_slice(&[0x86, 0xdd]);
        let mut chain: Vec<(u8, Vec<u8>)> = (0..ext)
            .map(|i| (if i == 0 { 0 } else { 60 }, vec![0u8; 8]))
            .collect();
        if let Some(offset) = fragment_offset {
            let mut h = vec![0u8; 8];
            h[2..4].copy_from_slice(&(offset << 3 | 1).to_be_bytes());
            chain.push((44, h));
        }
        let mut payload = Vec::new();
        let first = chain.first().map_or(proto, |(kind, _)| *kind);
        for (i, (_, header)) in chain.iter().enumerate() {
            let mut h = header.clone();
            h[0] = chain.get(i + 1).map_or(proto, |(kind, _)| *kind);
            payload.extend(h);
        }
        payload.extend(sport.to_be_bytes());
        payload.extend(dport.to_be_bytes());
        payload.extend([0u8; 16]);
        let mut ip = vec![0u8; 40];
        ip[0] = 0x60;
        ip[4..6].copy_from_slice(&(payload.len() as u16).to_be_bytes());
        ip[6] = first;
        ip[7] = 64;
        ip[8..24].copy_from_slice(&src.parse::<std::net::Ipv6Addr>().unwrap().octets());
        ip[24..40].copy_from_slice(&dst.parse::<std::net::Ipv6Addr>().unwrap().octets());
        f.extend(ip);
        f.extend(payload);
        f
    }

    #[test]
    fn ipv6_frames_match_by_address_upper_layer_protocol_and_port() {
        let (client, vip, rs) = ("2001:db8:2::6", "2001:db8:18::100", "2001:db8:1a::11");
        let syn = frame6(6, client, 40000, vip, 80, 0, None);
        let syn_ext = frame6(6, client, 40000, vip, 80, 2, None);
        let reply = frame6(6, rs, 8080, client, 40000, 0, None);
        let udp = frame6(17, client, 5353, vip, 53, 1, None);
        let first_fragment = frame6(17, client, 5353, vip, 53, 0, Some(0));
        let later_fragment = frame6(17, client, 5353, vip, 53, 0, Some(185));
        let v4 = frame(6, [198, 18, 0, 6], 40000, [198, 18, 1, 1], 80);

        let vip80 = CaptureFilter {
            proto: Some(6),
            endpoints: vec![Endpoint {
                ip: vip.parse().unwrap(),
                port: Some(80),
            }],
            ..Default::default()
        };
        assert_eq!(
            vip80.bpf(),
            "tcp and ((src host 2001:db8:18::100 and src port 80) or \
             (dst host 2001:db8:18::100 and dst port 80))"
        );
        let a = armed(&vip80);
        assert!(
            a.wants(&syn) && a.wants(&syn_ext),
            "through extension headers"
        );
        assert!(!a.wants(&reply) && !a.wants(&udp) && !a.wants(&v4));

        let a = armed(&CaptureFilter {
            proto: Some(17),
            l4_port: Some(53),
            ..Default::default()
        });
        assert!(a.wants(&udp) && a.wants(&first_fragment));
        assert!(!a.wants(&later_fragment), "no ports in a later fragment");
        assert!(!a.wants(&syn));

        // By address alone: a later fragment matches too; IPv4 and IPv6 endpoints mix.
        let a = armed(&CaptureFilter {
            endpoints: vec![
                Endpoint {
                    ip: rs.parse().unwrap(),
                    port: None,
                },
                Endpoint {
                    ip: "198.18.1.1".parse().unwrap(),
                    port: None,
                },
                Endpoint {
                    ip: vip.parse().unwrap(),
                    port: None,
                },
            ],
            ..Default::default()
        });
        assert!([&reply, &later_fragment, &v4, &syn]
            .iter()
            .all(|f| a.wants(f)));
        let a = armed(&CaptureFilter {
            endpoints: vec![Endpoint {
                ip: rs.parse().unwrap(),
                port: None,
            }],
            ..Default::default()
        });
        assert!(a.wants(&reply) && !a.wants(&syn) && !a.wants(&v4));
        // The IPv4-mapped form of an IPv4 endpoint is not an IPv6 frame's address.
        let a = armed(&CaptureFilter {
            endpoints: vec![Endpoint {
                ip: "198.18.1.1".parse().unwrap(),
                port: None,
            }],
            ..Default::default()
        });
        assert!(!a.wants(&frame6(6, client, 1, "::ffff:198.18.1.2", 80, 0, None)));
        let a = armed(&CaptureFilter {
            proto: Some(58),
            ..Default::default()
        });
        assert!(a.wants(&frame6(58, client, 0x8000, vip, 0, 0, None)) && !a.wants(&syn));
        // Truncated or garbled: no match, no panic.
        for cut in 0..syn_ext.len() {
            assert!(!a.wants(&syn_ext[..cut]));
        }
    }

    /// Each filter's own matching agrees with libpcap's, run by tcpdump over the same
    /// frames with the filter's [`CaptureFilter::bpf`] expression: the frames go to a
    /// pcap file (frame `i` stamped `i` seconds), and the seconds tcpdump prints are
    /// the frames it matched. The IPv6 frames with extension headers are fragments
    /// with the fragment header first, which libpcap's `tcp`/`udp` see through; its
    /// `port` does not read past the fragment header, so for filters with a port the
    /// first fragment (which carries the ports, and which Sluice matches by them) is
    /// left out of the comparison (`ipv6_frames_match_by_address_upper_layer_protocol_and_port`
    /// covers it).
    #[test]
    fn filters_match_the_frames_tcpdump_matches_with_their_bpf_expressions() {
        let (client6, vip6, rs6) = ("2001:db8:2::6", "2001:db8:18::100", "2001:db8:1a::11");
        let mut later_fragment = frame(6, [198, 18, 0, 6], 40000, [198, 18, 1, 1], 80);
        later_fragment[14 + 6..14 + 8].copy_from_slice(&[0x00, 0x10]);
        let mut arp = frame(6, [198, 18, 0, 6], 40000, [198, 18, 1, 1], 80);
        arp[12..14].copy_from_slice(&[0x08, 0x06]);
        let frames = [
            frame(6, [198, 18, 0, 6], 40000, [198, 18, 1, 1], 80),
            frame(6, [198, 18, 0, 2], 8080, [198, 18, 0, 6], 40000),
            frame(17, [198, 18, 0, 6], 5353, [198, 18, 1, 1], 53),
            frame(17, [198, 18, 1, 1], 53, [198, 18, 0, 6], 5353),
            frame(1, [198, 18, 0, 6], 0x0800, [198, 18, 1, 1], 0),
            frame(47, [198, 18, 0, 9], 80, [198, 18, 1, 1], 80),
            later_fragment,
            arp,
            frame6(6, client6, 40000, vip6, 80, 0, None),
            frame6(6, rs6, 8080, client6, 40000, 0, None),
            frame6(17, client6, 5353, vip6, 53, 0, None),
            frame6(58, client6, 0x8000, vip6, 0, 0, None),
            frame6(6, client6, 40001, rs6, 8080, 0, Some(0)),
            frame6(6, client6, 40001, rs6, 8080, 0, Some(3)),
        ];
        const FIRST_FRAGMENT_V6: usize = 12;
        let endpoint = |ip: &str, port: Option<u16>| Endpoint {
            ip: ip.parse().unwrap(),
            port,
        };
        let filters = [
            CaptureFilter {
                proto: Some(6),
                ..Default::default()
            },
            CaptureFilter {
                proto: Some(17),
                ..Default::default()
            },
            CaptureFilter {
                proto: Some(1),
                ..Default::default()
            },
            CaptureFilter {
                proto: Some(58),
                ..Default::default()
            },
            CaptureFilter {
                proto: Some(47),
                ..Default::default()
            },
            CaptureFilter {
                l4_port: Some(80),
                ..Default::default()
            },
            CaptureFilter {
                l4_port: Some(40000),
                ..Default::default()
            },
            CaptureFilter {
                endpoints: vec![endpoint("198.18.0.6", None)],
                ..Default::default()
            },
            CaptureFilter {
                endpoints: vec![endpoint(client6, None)],
                ..Default::default()
            },
            CaptureFilter {
                endpoints: vec![endpoint("198.18.1.1", Some(80))],
                ..Default::default()
            },
            CaptureFilter {
                endpoints: vec![endpoint(vip6, Some(80)), endpoint(rs6, Some(8080))],
                ..Default::default()
            },
            CaptureFilter {
                proto: Some(6),
                l4_port: Some(40000),
                endpoints: vec![endpoint("198.18.0.2", None), endpoint(rs6, None)],
                ..Default::default()
            },
            CaptureFilter {
                proto: Some(17),
                endpoints: vec![endpoint("198.18.1.1", Some(53))],
                ..Default::default()
            },
        ];
        let dir = tempfile::tempdir().unwrap();
        let pcap = dir.path().join("frames.pcap");
        {
            use pcap_file::pcap::{PcapHeader, PcapPacket, PcapWriter};
            let file = std::fs::File::create(&pcap).unwrap();
            let mut writer = PcapWriter::with_header(file, PcapHeader::default()).unwrap();
            for (i, f) in frames.iter().enumerate() {
                let at = std::time::Duration::from_secs(i as u64 + 1);
                writer
                    .write_packet(&PcapPacket::new(at, f.len() as u32, f))
                    .unwrap();
            }
        }
        for filter in &filters {
            let expression = filter.bpf();
            let out = std::process::Command::new("tcpdump")
                .args(["-r"])
                .arg(&pcap)
                .args(["-nn", "-tt", "-Z", "root", &expression])
                .output()
                .expect("tcpdump (scripts/setup.sh installs it)");
            assert!(
                out.status.success(),
                "tcpdump refused {expression:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let theirs: Vec<usize> = String::from_utf8(out.stdout)
                .unwrap()
                .lines()
                .map(|l| l.split('.').next().unwrap().parse::<usize>().unwrap() - 1)
                .collect();
            let a = armed(filter);
            let with_port =
                filter.l4_port.is_some() || filter.endpoints.iter().any(|e| e.port.is_some());
            let compared = |i: &usize| !(with_port && *i == FIRST_FRAGMENT_V6);
            let theirs: Vec<usize> = theirs.into_iter().filter(compared).collect();
            let ours: Vec<usize> = (0..frames.len())
                .filter(compared)
                .filter(|&i| a.wants(&frames[i]))
                .collect();
            assert_eq!(ours, theirs, "{expression}");
            assert!(
                !ours.is_empty() && ours.len() < frames.len(),
                "{expression}"
            );
        }
    }

    #[test]
    fn a_new_capture_has_a_new_generation_and_limits_are_checked() {
        let c = Capture::new(2);
        assert_eq!(c.running(), None);
        let g1 = c.start(&CaptureFilter::default(), 64);
        assert_eq!(c.running(), Some(g1));
        c.stop();
        assert_eq!(c.running(), None);
        let g2 = c.start(&CaptureFilter::default(), 64);
        assert_ne!(g1, g2);
        assert_eq!(c.rings[1].free.len(), RING_SLOTS);
        let too_many = CaptureFilter {
            endpoints: vec![
                Endpoint {
                    ip: std::net::Ipv4Addr::LOCALHOST.into(),
                    port: None
                };
                5
            ],
            ..Default::default()
        };
        assert!(too_many.validate().unwrap_err().contains("endpoints"));
    }
}
