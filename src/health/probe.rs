//! One active probe as a minimal TCP client: the frames it sends and how it reads the
//! real server's answers. There is no kernel stack on a DPDK port, so the probe speaks
//! just enough TCP itself: a SYN; for a TCP check, a SYN-ACK means up (answered with an
//! RST, so the server keeps no half-open connection); for an HTTP check, the ACK that
//! completes the handshake carries `GET path`, and the status line of the answer
//! decides, then an RST closes. No retransmission: a lost segment is a timeout, and a
//! single failure never evicts (`fall`).
//!
//! Frames are built with zero MAC addresses: the worker that transmits them fills in
//! its port's MAC and the real server's from its neighbour table.
use crate::wire::ethernet::{self, EtherType, MacAddr};
use crate::wire::tcp::{self, TcpFlags};
use crate::wire::{ipv4, IpProtocol};
use std::net::{Ipv4Addr, SocketAddrV4};

/// Bytes of a probe frame at most: headers plus the HTTP request.
pub const MAX_FRAME_LEN: usize = 512;
/// MSS advertised in the SYN (the status line is all a probe reads).
const PROBE_MSS: u16 = 1460;
const PROBE_WINDOW: u16 = 8192;
/// The status line is read from at most this many bytes.
const STATUS_BYTES: usize = 64;

/// The four addresses of a probe connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Endpoints {
    pub local: SocketAddrV4,
    pub remote: SocketAddrV4,
}

/// A TCP segment from a real server, as far as a probe cares.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Segment<'a> {
    pub from: SocketAddrV4,
    pub to: SocketAddrV4,
    pub seq: u32,
    pub ack: u32,
    pub flags: TcpFlags,
    pub payload: &'a [u8],
}

/// Reads an Ethernet/IPv4/TCP frame with valid checksums; `None` for anything else.
pub fn parse_segment(frame: &[u8]) -> Option<Segment<'_>> {
    let eth = ethernet::Frame::new_checked(frame).ok()?;
    if eth.ethertype() != EtherType::IPV4 {
        return None;
    }
    let ip = ipv4::Packet::new_checked(&frame[ethernet::HEADER_LEN..]).ok()?;
    if ip.protocol() != IpProtocol::TCP || ip.is_fragment() || !ip.verify_checksum() {
        return None;
    }
    let (src, dst) = (ip.src_addr(), ip.dst_addr());
    let start = ethernet::HEADER_LEN + ip.header_len();
    let end = ethernet::HEADER_LEN + ip.total_len() as usize;
    let seg = tcp::Packet::new_checked(frame.get(start..end)?).ok()?;
    if !seg.verify_checksum(src, dst) {
        return None;
    }
    let payload_at = start + seg.header_len();
    Some(Segment {
        from: SocketAddrV4::new(src, seg.src_port()),
        to: SocketAddrV4::new(dst, seg.dst_port()),
        seq: seg.seq_number(),
        ack: seg.ack_number(),
        flags: seg.flags(),
        payload: &frame[payload_at..end],
    })
}

/// Writes an Ethernet/IPv4/TCP frame into `buf` and returns its length.
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
    let ip_len = ipv4::MIN_HEADER_LEN + tcp_header + payload.len();
    let len = ethernet::HEADER_LEN + ip_len;
    assert!(
        len <= MAX_FRAME_LEN,
        "probe frames are bounded by the path length"
    );
    buf[..len].fill(0);
    ethernet::Repr {
        src_addr: MacAddr::ZERO,
        dst_addr: MacAddr::ZERO,
        ethertype: EtherType::IPV4,
    }
    .emit(&mut ethernet::Frame::new_unchecked(&mut buf[..len]));
    let (src, dst) = (*ends.local.ip(), *ends.remote.ip());
    ipv4::Repr {
        src_addr: src,
        dst_addr: dst,
        protocol: IpProtocol::TCP,
        payload_len: tcp_header + payload.len(),
        ttl: ipv4::DEFAULT_TTL,
    }
    .emit(&mut ipv4::Packet::new_unchecked(
        &mut buf[ethernet::HEADER_LEN..len],
    ));
    let mut seg =
        tcp::Packet::new_unchecked(&mut buf[ethernet::HEADER_LEN + ipv4::MIN_HEADER_LEN..len]);
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
    seg.fill_checksum(src, dst);
    len
}

/// What a probe checks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Check {
    Tcp,
    Http { request: Vec<u8>, expect: u16 },
}

impl Check {
    /// An HTTP/1.0 GET for `path` with the expected status.
    pub fn http(path: &str, host: Ipv4Addr, expect: u16) -> Check {
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
                if seg.flags.contains(TcpFlags::RST) {
                    return Some(Err("reset before a status line".into()));
                }
                // In order only: a segment out of order is ignored (the server resends).
                if seg.seq == *theirs && !seg.payload.is_empty() {
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
                } else if seg.flags.contains(TcpFlags::FIN) {
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

    fn ends() -> Endpoints {
        Endpoints {
            local: SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 1), 61000),
            remote: SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 11), 8080),
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

    fn http_exchange(answer: &[&[u8]]) -> (Option<Outcome>, Vec<Vec<u8>>) {
        let mut out = Vec::new();
        let mut send = |f: &[u8]| out.push(f.to_vec());
        let check = Check::http("/health", Ipv4Addr::new(198, 18, 0, 11), 200);
        let mut p = Probe::start(ends(), check, 100, &mut send);
        let synack = reply(9000, 101, TcpFlags::SYN | TcpFlags::ACK, &[]);
        assert_eq!(
            p.on_segment(&parse_segment(&synack).unwrap(), &mut send),
            None
        );
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
}
