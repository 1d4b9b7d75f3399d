//! One active probe as a minimal TCP client: the frames it sends and how it reads the
//! real server's answers. There is no kernel stack on a DPDK port, so the probe speaks
//! just enough TCP itself: a SYN; for a TCP check, a SYN-ACK means up (answered with an
//! RST, so the server keeps no half-open connection); for an HTTP check, the ACK that
//! completes the handshake carries `GET path`, and the status line of the answer
//! decides, then an RST closes. No retransmission: a lost segment is a timeout, and a
//! single failure never evicts (`fall`).
//!
//! Probes speak IPv4 to IPv4 real servers and IPv6 to IPv6 ones, the same TCP either
//! way: only the network header (and the checksum's pseudo-header) differs.
//!
//! Frames are built with zero MAC addresses: the worker that transmits them fills in
//! its port's MAC and the real server's from its neighbour table.
use crate::wire::ethernet::{self, EtherType, MacAddr};
use crate::wire::tcp::{self, TcpFlags};
use crate::wire::{ipv4, ipv6, IpProtocol};
use std::net::{IpAddr, SocketAddr};

/// Bytes of a probe frame at most: headers plus the HTTP request.
pub const MAX_FRAME_LEN: usize = 512;
// An answer acknowledges at most the SYN and the request, which fits a frame: the
// workers' filter (`ProbeAcks::SPAN`) must let every such number through.
const _: () = assert!(MAX_FRAME_LEN as u32 <= crate::dataplane::probe_acks::ProbeAcks::SPAN);
/// MSS advertised in the SYN (the status line is all a probe reads).
const PROBE_MSS: u16 = 1460;
const PROBE_WINDOW: u16 = 8192;
/// The status line is read from at most this many bytes.
const STATUS_BYTES: usize = 64;

/// The four addresses of a probe connection, both ends of one family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Endpoints {
    pub local: SocketAddr,
    pub remote: SocketAddr,
}

/// A TCP segment from a real server, as far as a probe cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment<'a> {
    pub from: SocketAddr,
    pub to: SocketAddr,
    pub seq: u32,
    pub ack: u32,
    pub flags: TcpFlags,
    pub payload: &'a [u8],
}

/// Reads an Ethernet/IPv4/TCP or Ethernet/IPv6/TCP frame with valid checksums (the
/// IPv6 one past at most the extension headers `wire::ipv6` walks); `None` for
/// anything else.
pub fn parse_segment(frame: &[u8]) -> Option<Segment<'_>> {
    let eth = ethernet::Frame::new_checked(frame).ok()?;
    let l3 = &frame[ethernet::HEADER_LEN..];
    let (src, dst, start, end) = match eth.ethertype() {
        EtherType::IPV4 => {
            let ip = ipv4::Packet::new_checked(l3).ok()?;
            if ip.protocol() != IpProtocol::TCP || ip.is_fragment() || !ip.verify_checksum() {
                return None;
            }
            let (src, dst) = (IpAddr::V4(ip.src_addr()), IpAddr::V4(ip.dst_addr()));
            (src, dst, ip.header_len(), ip.total_len() as usize)
        }
        EtherType::IPV6 => {
            let ip = ipv6::Packet::new_checked(l3).ok()?;
            let upper = ip.upper_layer().ok()?;
            if upper.protocol != IpProtocol::TCP {
                return None;
            }
            let (src, dst) = (IpAddr::V6(ip.src_addr()), IpAddr::V6(ip.dst_addr()));
            let end = ipv6::HEADER_LEN + ip.payload_len() as usize;
            (src, dst, upper.offset, end)
        }
        _ => return None,
    };
    let (start, end) = (ethernet::HEADER_LEN + start, ethernet::HEADER_LEN + end);
    let seg = tcp::Packet::new_checked(frame.get(start..end)?).ok()?;
    let valid = match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => seg.verify_checksum(s, d),
        (IpAddr::V6(s), IpAddr::V6(d)) => seg.verify_checksum_v6(s, d),
        _ => false,
    };
    if !valid {
        return None;
    }
    let payload_at = start + seg.header_len();
    Some(Segment {
        from: SocketAddr::new(src, seg.src_port()),
        to: SocketAddr::new(dst, seg.dst_port()),
        seq: seg.seq_number(),
        ack: seg.ack_number(),
        flags: seg.flags(),
        payload: &frame[payload_at..end],
    })
}

/// Writes an Ethernet/IPv4/TCP frame, or Ethernet/IPv6/TCP when the ends are IPv6,
/// into `buf` and returns its length.
#[allow(clippy::too_many_arguments)]
pub fn write_segment(
    buf: &mut [u8; MAX_FRAME_LEN],
    ends: &Endpoints,
    seq: u32,
    ack: u32,
    flags: TcpFlags,
    mss: Option<u16>,
    payload: &[u8],
) -> usize {
    let tcp_header = tcp::MIN_HEADER_LEN + if mss.is_some() { 4 } else { 0 };
    let (ethertype, ip_header) = match ends.local {
        SocketAddr::V4(_) => (EtherType::IPV4, ipv4::MIN_HEADER_LEN),
        SocketAddr::V6(_) => (EtherType::IPV6, ipv6::HEADER_LEN),
    };
    let l4 = ethernet::HEADER_LEN + ip_header;
    let len = l4 + tcp_header + payload.len();
    assert!(
        len <= MAX_FRAME_LEN,
        "probe frames are bounded by the path length"
    );
    buf[..len].fill(0);
    ethernet::Repr {
        src_addr: MacAddr::ZERO,
        dst_addr: MacAddr::ZERO,
        ethertype,
    }
    .emit(&mut ethernet::Frame::new_unchecked(&mut buf[..len]));
    let ip = &mut buf[ethernet::HEADER_LEN..len];
    match (ends.local.ip(), ends.remote.ip()) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => ipv4::Repr {
            src_addr: src,
            dst_addr: dst,
            protocol: IpProtocol::TCP,
            payload_len: tcp_header + payload.len(),
            ttl: ipv4::DEFAULT_TTL,
        }
        .emit(&mut ipv4::Packet::new_unchecked(ip)),
        (IpAddr::V6(src), IpAddr::V6(dst)) => ipv6::Repr {
            src_addr: src,
            dst_addr: dst,
            next_header: IpProtocol::TCP,
            payload_len: tcp_header + payload.len(),
            hop_limit: ipv6::DEFAULT_HOP_LIMIT,
        }
        .emit(&mut ipv6::Packet::new_unchecked(ip)),
        _ => unreachable!("the monitor pairs a source of the real server's family"),
    }
    let mut seg = tcp::Packet::new_unchecked(&mut buf[l4..len]);
    seg.set_src_port(ends.local.port());
    seg.set_dst_port(ends.remote.port());
    seg.set_seq_number(seq);
    seg.set_ack_number(ack);
    seg.set_header_len(tcp_header);
    seg.set_flags(flags);
    seg.set_window_len(PROBE_WINDOW);
    seg.set_urgent_at(0);
    if let Some(mss) = mss {
        tcp::TcpOption::MaxSegmentSize(mss).emit(seg.options_mut());
    }
    seg.payload_mut()[..payload.len()].copy_from_slice(payload);
    match (ends.local.ip(), ends.remote.ip()) {
        (IpAddr::V4(src), IpAddr::V4(dst)) => seg.fill_checksum(src, dst),
        (IpAddr::V6(src), IpAddr::V6(dst)) => seg.fill_checksum_v6(src, dst),
        _ => unreachable!("checked above"),
    }
    len
}

/// What a probe checks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Check {
    Tcp,
    Http { request: Vec<u8>, expect: u16 },
}

impl Check {
    /// An HTTP/1.0 GET for `path` with the expected status; an IPv6 host is
    /// bracketed in the Host header (RFC 3986 IP-literal).
    pub fn http(path: &str, host: IpAddr, expect: u16) -> Check {
        let host = match host {
            IpAddr::V4(a) => a.to_string(),
            IpAddr::V6(a) => format!("[{a}]"),
        };
        let request = format!(
            "GET {path} HTTP/1.0\r\nHost: {host}\r\nUser-Agent: sluice-health\r\nConnection: close\r\n\r\n"
        );
        Check::Http {
            request: request.into_bytes(),
            expect,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Phase {
    SynSent,
    /// Handshake done, request sent: reading the status line.
    Reading {
        /// Our next sequence number (after the request).
        ours: u32,
        /// The next byte of the server's we expect.
        theirs: u32,
        status: Vec<u8>,
    },
}

/// One probe in flight.
#[derive(Clone, Debug)]
pub struct Probe {
    pub ends: Endpoints,
    check: Check,
    isn: u32,
    phase: Phase,
}

/// How a probe ended.
pub type Outcome = Result<(), String>;

impl Probe {
    /// Sends the SYN (through `send`) and returns the probe.
    pub fn start(ends: Endpoints, check: Check, isn: u32, send: &mut impl FnMut(&[u8])) -> Probe {
        let mut buf = [0u8; MAX_FRAME_LEN];
        let n = write_segment(&mut buf, &ends, isn, 0, TcpFlags::SYN, Some(PROBE_MSS), &[]);
        send(&buf[..n]);
        Probe {
            ends,
            check,
            isn,
            phase: Phase::SynSent,
        }
    }

    /// A segment of this probe's connection: `Some` once the probe has its verdict.
    pub fn on_segment(&mut self, seg: &Segment, send: &mut impl FnMut(&[u8])) -> Option<Outcome> {
        let mut buf = [0u8; MAX_FRAME_LEN];
        let ours = self.isn.wrapping_add(1);
        match &mut self.phase {
            Phase::SynSent => {
                if seg.ack != ours || !seg.flags.contains(TcpFlags::ACK) {
                    return None; // Not an answer to this SYN (an old connection's).
                }
                if seg.flags.contains(TcpFlags::RST) {
                    return Some(Err("refused".into()));
                }
                if !seg.flags.contains(TcpFlags::SYN) {
                    return None;
                }
                let theirs = seg.seq.wrapping_add(1);
                match &self.check {
                    Check::Tcp => {
                        let n =
                            write_segment(&mut buf, &self.ends, ours, 0, TcpFlags::RST, None, &[]);
                        send(&buf[..n]);
                        Some(Ok(()))
                    }
                    Check::Http { request, .. } => {
                        let flags = TcpFlags::ACK | TcpFlags::PSH;
                        let n =
                            write_segment(&mut buf, &self.ends, ours, theirs, flags, None, request);
                        send(&buf[..n]);
                        self.phase = Phase::Reading {
                            ours: ours.wrapping_add(request.len() as u32),
                            theirs,
                            status: Vec::with_capacity(STATUS_BYTES),
                        };
                        None
                    }
                }
            }
            Phase::Reading {
                ours,
                theirs,
                status,
            } => {
                // In order only: a segment out of order is ignored (the server resends).
                // That holds for RST and FIN too (RFC 5961's exact match): the probe's
                // ports are predictable, and a reset or close anywhere in the window
                // would let a blind sender that forges the server's address fail it.
                let in_order = seg.seq == *theirs;
                if seg.flags.contains(TcpFlags::RST) {
                    return in_order.then(|| Err("reset before a status line".into()));
                }
                if in_order && !seg.payload.is_empty() {
                    let room = STATUS_BYTES - status.len();
                    status.extend_from_slice(&seg.payload[..seg.payload.len().min(room)]);
                    *theirs = theirs.wrapping_add(seg.payload.len() as u32);
                }
                let Check::Http { expect, .. } = self.check else {
                    return None;
                };
                let line_done =
                    status.windows(2).any(|w| w == b"\r\n") || status.len() >= STATUS_BYTES;
                let verdict = if line_done || (status.len() >= 12 && status.starts_with(b"HTTP/")) {
                    Some(read_status(status, expect))
                } else if in_order && seg.flags.contains(TcpFlags::FIN) {
                    Some(Err("closed before a status line".into()))
                } else {
                    None
                };
                if verdict.is_some() {
                    let (o, t) = (*ours, *theirs);
                    let n = write_segment(
                        &mut buf,
                        &self.ends,
                        o,
                        t,
                        TcpFlags::RST | TcpFlags::ACK,
                        None,
                        &[],
                    );
                    send(&buf[..n]);
                }
                verdict
            }
        }
    }

    /// The probe timed out: closes a half-done HTTP exchange with an RST.
    pub fn abort(&self, send: &mut impl FnMut(&[u8])) {
        if let Phase::Reading { ours, theirs, .. } = self.phase {
            let mut buf = [0u8; MAX_FRAME_LEN];
            let n = write_segment(
                &mut buf,
                &self.ends,
                ours,
                theirs,
                TcpFlags::RST | TcpFlags::ACK,
                None,
                &[],
            );
            send(&buf[..n]);
        }
    }
}

/// `HTTP/1.x NNN ...` against the expected status.
fn read_status(line: &[u8], expect: u16) -> Outcome {
    let text = String::from_utf8_lossy(line);
    let mut words = text.split_whitespace();
    let version = words.next().unwrap_or("");
    if !version.starts_with("HTTP/") {
        return Err("no HTTP status line".into());
    }
    match words.next().and_then(|w| w.parse::<u16>().ok()) {
        Some(code) if code == expect => Ok(()),
        Some(code) => Err(format!("status {code}")),
        None => Err("no HTTP status code".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    fn ends() -> Endpoints {
        Endpoints {
            local: SocketAddr::new(Ipv4Addr::new(198, 18, 0, 1).into(), 61000),
            remote: SocketAddr::new(Ipv4Addr::new(198, 18, 0, 11).into(), 8080),
        }
    }

    /// A segment from the server, as bytes (so parse_segment is exercised too).
    fn reply(seq: u32, ack: u32, flags: TcpFlags, payload: &[u8]) -> Vec<u8> {
        let e = ends();
        let back = Endpoints {
            local: e.remote,
            remote: e.local,
        };
        let mut buf = [0u8; MAX_FRAME_LEN];
        let n = write_segment(&mut buf, &back, seq, ack, flags, None, payload);
        buf[..n].to_vec()
    }

    fn sent_frames(probe_start: impl FnOnce(&mut dyn FnMut(&[u8]))) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        probe_start(&mut |f: &[u8]| out.push(f.to_vec()));
        out
    }

    #[test]
    fn the_syn_is_a_valid_segment_with_an_mss() {
        let frames = sent_frames(|send| {
            Probe::start(ends(), Check::Tcp, 1000, &mut |f| send(f));
        });
        assert_eq!(frames.len(), 1);
        let seg = parse_segment(&frames[0]).expect("valid checksums");
        assert_eq!(seg.flags, TcpFlags::SYN);
        assert_eq!(seg.seq, 1000);
        assert_eq!(seg.from, ends().local);
        assert_eq!(seg.to, ends().remote);
        let ip = ipv4::Packet::new_checked(&frames[0][14..]).unwrap();
        let tcp = tcp::Packet::new_checked(ip.payload()).unwrap();
        assert_eq!(tcp.max_segment_size(), Some(PROBE_MSS));
    }

    #[test]
    fn tcp_check_syn_ack_is_up_and_gets_an_rst() {
        let mut out = Vec::new();
        let mut send = |f: &[u8]| out.push(f.to_vec());
        let mut p = Probe::start(ends(), Check::Tcp, 1000, &mut send);
        // A SYN-ACK for another sequence number is not ours.
        let stale = reply(5000, 77, TcpFlags::SYN | TcpFlags::ACK, &[]);
        assert_eq!(
            p.on_segment(&parse_segment(&stale).unwrap(), &mut send),
            None
        );
        let synack = reply(5000, 1001, TcpFlags::SYN | TcpFlags::ACK, &[]);
        assert_eq!(
            p.on_segment(&parse_segment(&synack).unwrap(), &mut send),
            Some(Ok(()))
        );
        let rst = parse_segment(&out[1]).unwrap();
        assert_eq!(rst.flags, TcpFlags::RST);
        assert_eq!(rst.seq, 1001);
    }

    #[test]
    fn an_rst_answer_is_refused() {
        let mut send = |_: &[u8]| {};
        let mut p = Probe::start(ends(), Check::Tcp, 7, &mut send);
        let rst = reply(0, 8, TcpFlags::RST | TcpFlags::ACK, &[]);
        assert_eq!(
            p.on_segment(&parse_segment(&rst).unwrap(), &mut send),
            Some(Err("refused".into()))
        );
    }

    /// An HTTP probe (ISN 100) past the server's SYN-ACK (ISN 9000): it reads the
    /// status line from sequence number 9001.
    fn http_probe_reading(send: &mut impl FnMut(&[u8])) -> Probe {
        let check = Check::http("/health", Ipv4Addr::new(198, 18, 0, 11).into(), 200);
        let mut p = Probe::start(ends(), check, 100, &mut *send);
        let synack = reply(9000, 101, TcpFlags::SYN | TcpFlags::ACK, &[]);
        assert_eq!(p.on_segment(&parse_segment(&synack).unwrap(), send), None);
        p
    }

    fn http_exchange(answer: &[&[u8]]) -> (Option<Outcome>, Vec<Vec<u8>>) {
        let mut out = Vec::new();
        let mut send = |f: &[u8]| out.push(f.to_vec());
        let mut p = http_probe_reading(&mut send);
        let mut seq = 9001;
        let mut verdict = None;
        for part in answer {
            let seg = reply(seq, 0, TcpFlags::ACK | TcpFlags::PSH, part);
            seq += part.len() as u32;
            verdict = p.on_segment(&parse_segment(&seg).unwrap(), &mut send);
            if verdict.is_some() {
                break;
            }
        }
        (verdict, out)
    }

    #[test]
    fn http_check_sends_the_request_and_reads_the_status() {
        let (v, out) = http_exchange(&[b"HTTP/1.0 200 OK\r\nServer: x\r\n\r\nrs1\n"]);
        assert_eq!(v, Some(Ok(())));
        let req = parse_segment(&out[1]).unwrap();
        assert_eq!(req.flags, TcpFlags::ACK | TcpFlags::PSH);
        assert_eq!((req.seq, req.ack), (101, 9001));
        assert!(req
            .payload
            .starts_with(b"GET /health HTTP/1.0\r\nHost: 198.18.0.11\r\n"));
        let rst = parse_segment(&out[2]).unwrap();
        assert!(rst.flags.contains(TcpFlags::RST));
        assert_eq!(rst.seq, 101 + req.payload.len() as u32);
    }

    /// While the status line is read, a reset or a close counts only at the next
    /// byte expected: one elsewhere in the window (a blind forger's) is ignored.
    #[test]
    fn a_reset_or_close_counts_only_in_order() {
        let mut send = |_: &[u8]| {};
        let mut p = http_probe_reading(&mut send);
        let mut at = |seq: u32, flags: TcpFlags| {
            let seg = reply(seq, 0, flags, &[]);
            p.on_segment(&parse_segment(&seg).unwrap(), &mut send)
        };
        for seq in [9000, 9002, 9001 + 20_000, 9001u32.wrapping_sub(5)] {
            assert_eq!(at(seq, TcpFlags::RST), None, "RST at {seq}");
            assert_eq!(at(seq, TcpFlags::FIN | TcpFlags::ACK), None, "FIN at {seq}");
        }
        assert_eq!(
            at(9001, TcpFlags::FIN | TcpFlags::ACK),
            Some(Err("closed before a status line".into()))
        );
        let mut p = http_probe_reading(&mut send);
        let rst = reply(9001, 0, TcpFlags::RST, &[]);
        assert_eq!(
            p.on_segment(&parse_segment(&rst).unwrap(), &mut send),
            Some(Err("reset before a status line".into()))
        );
    }

    #[test]
    fn http_status_500_fails_and_a_split_status_line_is_joined() {
        let (v, _) = http_exchange(&[b"HTTP/1.0 500 Internal Server Error\r\n"]);
        assert_eq!(v, Some(Err("status 500".into())));
        let (v, _) = http_exchange(&[b"HTTP/1.", b"1 20", b"0 OK\r\n"]);
        assert_eq!(v, Some(Ok(())));
        let (v, _) = http_exchange(&[b"garbage that is not http at all\r\n"]);
        assert_eq!(v, Some(Err("no HTTP status line".into())));
    }

    #[test]
    fn a_corrupted_reply_is_not_a_segment() {
        let mut f = reply(1, 2, TcpFlags::ACK, b"hello");
        let last = f.len() - 1;
        f[last] ^= 0xff;
        assert_eq!(parse_segment(&f), None);
        assert_eq!(parse_segment(&f[..20]), None);
    }

    fn ends6() -> Endpoints {
        Endpoints {
            local: SocketAddr::new("2001:db8:1a::1".parse::<Ipv6Addr>().unwrap().into(), 61000),
            remote: SocketAddr::new("2001:db8:1a::11".parse::<Ipv6Addr>().unwrap().into(), 8080),
        }
    }

    fn hex(s: &str) -> Vec<u8> {
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// The IPv6 SYN byte for byte as scapy 2.5 builds it (checksum 0x0aae computed by
    /// scapy over the IPv6 pseudo-header):
    /// `Ether(src=0, dst=0)/IPv6(src="2001:db8:1a::1", dst="2001:db8:1a::11",
    /// hlim=64)/TCP(sport=61000, dport=8080, seq=1000, flags="S", window=8192,
    /// options=[("MSS", 1460)])`.
    #[test]
    fn the_ipv6_syn_is_the_segment_scapy_builds() {
        let frames = sent_frames(|send| {
            Probe::start(ends6(), Check::Tcp, 1000, &mut |f| send(f));
        });
        let scapy = hex(concat!(
            "00000000000000000000000086dd",
            "600000000018064020010db8001a0000000000000000000120010db8001a000000000000",
            "00000011",
            "ee481f90000003e800000000600220000aae0000020405b4"
        ));
        assert_eq!(frames[0], scapy);
        let seg = parse_segment(&frames[0]).expect("valid checksum");
        assert_eq!((seg.from, seg.to), (ends6().local, ends6().remote));
        assert_eq!((seg.flags, seg.seq), (TcpFlags::SYN, 1000));
    }

    /// A SYN-ACK from an IPv6 server as scapy builds it, behind a destination options
    /// header (`IPv6(...)/IPv6ExtHdrDestOpt()/TCP(sport=8080, dport=61000, seq=5000,
    /// ack=1001, flags="SA", window=65535)`, checksum 0x2ed1 by scapy), is read past
    /// the extension header; one flipped payload bit, or a wrong pseudo-header
    /// address, and it is not.
    #[test]
    fn an_ipv6_answer_behind_an_extension_header_is_read_and_checked() {
        let frame = hex(concat!(
            "ffffffffffff02fc0000000186dd",
            "60000000001c3c4020010db8001a0000000000000000001120010db8001a000000000000",
            "00000001",
            "06000104000000001f90ee4800001388000003e95012ffff2ed10000"
        ));
        let seg = parse_segment(&frame).expect("scapy's checksum verifies");
        assert_eq!(seg.from, ends6().remote);
        assert_eq!(seg.to, ends6().local);
        assert_eq!((seg.seq, seg.ack), (5000, 1001));
        assert_eq!(seg.flags, TcpFlags::SYN | TcpFlags::ACK);
        let mut p = Probe::start(ends6(), Check::Tcp, 1000, &mut |_| {});
        let mut out = Vec::new();
        assert_eq!(
            p.on_segment(&seg, &mut |f: &[u8]| out.push(f.to_vec())),
            Some(Ok(()))
        );
        let rst = parse_segment(&out[0]).expect("our RST verifies");
        assert_eq!(
            (rst.flags, rst.seq, rst.to),
            (TcpFlags::RST, 1001, ends6().remote)
        );
        let mut bad = frame.clone();
        bad[14 + 40 + 8 + 4] ^= 0x01; // the sequence number
        assert_eq!(parse_segment(&bad), None);
        let mut elsewhere = frame.clone();
        elsewhere[14 + 39] ^= 0x01; // the destination address
        assert_eq!(parse_segment(&elsewhere), None);
        assert_eq!(parse_segment(&frame[..frame.len() - 1]), None);
    }

    #[test]
    fn an_ipv6_http_check_brackets_the_host() {
        let host = "2001:db8:1a::11".parse::<Ipv6Addr>().unwrap();
        let Check::Http { request, .. } = Check::http("/h", host.into(), 200) else {
            panic!("an http check")
        };
        assert!(request.starts_with(b"GET /h HTTP/1.0\r\nHost: [2001:db8:1a::11]\r\n"));
        let mut out = Vec::new();
        let check = Check::http("/h", host.into(), 200);
        let mut p = Probe::start(ends6(), check, 100, &mut |f: &[u8]| out.push(f.to_vec()));
        let back = Endpoints {
            local: ends6().remote,
            remote: ends6().local,
        };
        let mut buf = [0u8; MAX_FRAME_LEN];
        let n = write_segment(
            &mut buf,
            &back,
            9000,
            101,
            TcpFlags::SYN | TcpFlags::ACK,
            None,
            &[],
        );
        let mut send = |f: &[u8]| out.push(f.to_vec());
        assert_eq!(
            p.on_segment(&parse_segment(&buf[..n]).unwrap(), &mut send),
            None
        );
        let flags = TcpFlags::ACK | TcpFlags::PSH;
        let n = write_segment(
            &mut buf,
            &back,
            9001,
            0,
            flags,
            None,
            b"HTTP/1.0 200 OK\r\n",
        );
        assert_eq!(
            p.on_segment(&parse_segment(&buf[..n]).unwrap(), &mut send),
            Some(Ok(()))
        );
        let req = parse_segment(&out[1]).unwrap();
        assert_eq!(req.payload, &request[..]);
    }
}
