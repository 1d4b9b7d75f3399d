//! The conversations of the emulated clients and real servers, as pure functions over
//! parsed segments (no I/O, no clock), so every step is unit-tested.
//!
//! A TCP connection is: SYN; SYN-ACK; ACK; a [`MSG_LEN`]-byte request (PSH, ACK); a
//! [`MSG_LEN`]-byte response (PSH, ACK); FIN from the client; FIN-ACK from the server;
//! the client's last ACK. A UDP exchange is one request datagram and one response.
//!
//! The client keeps a [`Conn`] per exchange and checks every reply against what it sent:
//! flags, sequence and acknowledgement numbers, the request token echoed back. The real
//! server keeps no state at all: its initial sequence number is a hash of the client's
//! address, port and initial sequence number ([`server_isn`]), so it can answer (and
//! check) any segment, a retransmission included, from the segment alone.
use super::frames::{tcp_flags::*, Segment};
use std::net::Ipv4Addr;

/// Length of a request and of a response.
pub const MSG_LEN: usize = 32;
/// Slots of the client connection table. A connection's slot is its client port modulo
/// this, so a reply finds its connection without a search.
pub const TABLE_SIZE: usize = 1024;
/// Client ports are 32768..=65535 (32 times [`TABLE_SIZE`]), handed out in turn: a port
/// comes back after 32768 exchanges.
pub const FIRST_PORT: u16 = 32768;

const REQUEST_TAG: &[u8; 4] = b"SLQ1";
const RESPONSE_TAG: &[u8; 4] = b"SLR1";
const REQUEST_FILL: u8 = 0x5a;
const RESPONSE_FILL: u8 = 0xc3;

/// A request: tag, token, the client's address and port (which NAT must not change),
/// then a fill pattern.
pub fn request(token: u32, client: Ipv4Addr, port: u16) -> [u8; MSG_LEN] {
    message(REQUEST_TAG, REQUEST_FILL, token, client, port)
}

/// A response: tag, the request's token, the address and port the server received the
/// request on (its real-server identity), then a fill pattern.
pub fn response(token: u32, server: Ipv4Addr, port: u16) -> [u8; MSG_LEN] {
    message(RESPONSE_TAG, RESPONSE_FILL, token, server, port)
}

fn message(tag: &[u8; 4], fill: u8, token: u32, ip: Ipv4Addr, port: u16) -> [u8; MSG_LEN] {
    let mut m = [fill; MSG_LEN];
    m[0..4].copy_from_slice(tag);
    m[4..8].copy_from_slice(&token.to_be_bytes());
    m[8..12].copy_from_slice(&ip.octets());
    m[12..14].copy_from_slice(&port.to_be_bytes());
    m
}

fn read_message(m: &[u8], tag: &[u8; 4], fill: u8) -> Option<(u32, Ipv4Addr, u16)> {
    if m.len() != MSG_LEN || &m[0..4] != tag || m[14..].iter().any(|&b| b != fill) {
        return None;
    }
    Some((
        u32::from_be_bytes(m[4..8].try_into().unwrap()),
        Ipv4Addr::new(m[8], m[9], m[10], m[11]),
        u16::from_be_bytes([m[12], m[13]]),
    ))
}

/// (token, client address, client port) of a well-formed request.
pub fn read_request(m: &[u8]) -> Option<(u32, Ipv4Addr, u16)> {
    read_message(m, REQUEST_TAG, REQUEST_FILL)
}

/// (token, server address, server port) of a well-formed response.
pub fn read_response(m: &[u8]) -> Option<(u32, Ipv4Addr, u16)> {
    read_message(m, RESPONSE_TAG, RESPONSE_FILL)
}

/// The server's initial sequence number for the connection the client opened from
/// `client:port` with initial sequence number `client_isn`.
pub fn server_isn(client: Ipv4Addr, port: u16, client_isn: u32) -> u32 {
    // splitmix64's finaliser over the three values.
    let mut z = (u64::from(u32::from(client)) << 32 | u64::from(port) << 16)
        ^ u64::from(client_isn).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)) as u32
}

/// A segment the server sends back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Answer {
    pub seq: u32,
    pub ack: u32,
    pub flags: u8,
    /// The response, when this answers the request.
    pub response: Option<[u8; MSG_LEN]>,
}

/// The real server's answer to a TCP segment it received as `me` (its own address; the
/// port is the segment's destination port): `Ok(None)` for the ACKs that need no answer,
/// `Err` saying what is wrong with a segment no correct path can have delivered.
/// `sees_client`: the real server sees the client's own address (NAT, DR, TUN), so a
/// request naming another sender is a wrong rewrite; false for FullNAT, where it sees
/// a local address of the appliance instead.
pub fn serve_tcp(
    s: &Segment,
    me: Ipv4Addr,
    sees_client: bool,
) -> Result<Option<Answer>, &'static str> {
    let (client, port) = (s.e.src, s.e.sport);
    let isn = |client_isn: u32| server_isn(client, port, client_isn);
    let f = s.flags;
    if f & RST != 0 {
        return Err("a real server received a RST");
    }
    if f == SYN {
        if !s.payload.is_empty() {
            return Err("a real server received a SYN carrying data");
        }
        return Ok(Some(Answer {
            seq: isn(s.seq),
            ack: s.seq.wrapping_add(1),
            flags: SYN | ACK,
            response: None,
        }));
    }
    if f & (SYN | ACK) != ACK {
        return Err("a real server received a segment without ACK or with SYN and ACK");
    }
    if !s.payload.is_empty() {
        let Some((token, from, from_port)) = read_request(s.payload) else {
            return Err("a real server received a corrupted request");
        };
        if sees_client && (from, from_port) != (client, port) {
            return Err("a real server received a request from another address or port than its client's (source NAT?)");
        }
        let y = isn(s.seq.wrapping_sub(1));
        if s.ack != y.wrapping_add(1) || f & FIN != 0 {
            return Err("a real server received a request acknowledging the wrong sequence number");
        }
        return Ok(Some(Answer {
            seq: y.wrapping_add(1),
            ack: s.seq.wrapping_add(MSG_LEN as u32),
            flags: PSH | ACK,
            response: Some(response(token, me, s.e.dport)),
        }));
    }
    let len = MSG_LEN as u32;
    if f & FIN != 0 {
        let y = isn(s.seq.wrapping_sub(1 + len));
        if s.ack != y.wrapping_add(1 + len) {
            return Err("a real server received a FIN acknowledging the wrong sequence number");
        }
        return Ok(Some(Answer {
            seq: y.wrapping_add(1 + len),
            ack: s.seq.wrapping_add(1),
            flags: FIN | ACK,
            response: None,
        }));
    }
    // A pure ACK: the handshake's third segment or the last one.
    let handshake = s.ack == isn(s.seq.wrapping_sub(1)).wrapping_add(1);
    let last = s.ack == isn(s.seq.wrapping_sub(2 + len)).wrapping_add(2 + len);
    if handshake || last {
        Ok(None)
    } else {
        Err("a real server received an ACK that fits no step of the exchange")
    }
}

/// The status line and headers an emulated real server answers an HTTP health probe
/// with: every emulated server is healthy.
pub const PROBE_RESPONSE: &[u8] = b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n";

/// A real server's answer to a segment of the appliance's health probe (from the
/// appliance's own address), as a kernel with the port open answers it: the SYN gets a
/// SYN-ACK, an HTTP request gets [`PROBE_RESPONSE`] and a FIN, and the probe's RST (it
/// closes every probe with one) and bare ACKs need nothing. `None`: nothing to send.
pub fn serve_probe(s: &Segment) -> Option<Answer> {
    let f = s.flags;
    if f & RST != 0 {
        return None;
    }
    if f & (SYN | ACK) == SYN {
        return Some(Answer {
            seq: server_isn(s.e.src, s.e.sport, s.seq),
            ack: s.seq.wrapping_add(1),
            flags: SYN | ACK,
            response: None,
        });
    }
    if f & (SYN | ACK) == ACK && s.payload.starts_with(b"GET ") {
        let isn = server_isn(s.e.src, s.e.sport, s.seq.wrapping_sub(1));
        return Some(Answer {
            seq: isn.wrapping_add(1),
            ack: s.seq.wrapping_add(s.payload.len() as u32),
            flags: PSH | ACK | FIN,
            response: None,
        });
    }
    None
}

/// The real server's response to a UDP request received as `me`.
pub fn serve_udp(
    s: &Segment,
    me: Ipv4Addr,
    sees_client: bool,
) -> Result<[u8; MSG_LEN], &'static str> {
    match read_request(s.payload) {
        Some((token, from, from_port))
            if !sees_client || (from, from_port) == (s.e.src, s.e.sport) =>
        {
            Ok(response(token, me, s.e.dport))
        }
        Some(_) => Err("a real server received a datagram from another address or port than its client's (source NAT?)"),
        None => Err("a real server received a corrupted request datagram"),
    }
}

/// Where a client's exchange stands.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Stage {
    /// The slot is free.
    #[default]
    Free,
    /// Waiting for the VIP's MAC (ARP); nothing sent yet.
    Resolving,
    SynSent,
    /// ACK and request sent, waiting for the response.
    RequestSent,
    /// Response received, FIN sent, waiting for the server's FIN-ACK.
    FinSent,
    /// UDP: request sent, waiting for the response.
    UdpSent,
}

/// One segment (or, for UDP, the datagram) the client sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Out {
    pub seq: u32,
    pub ack: u32,
    pub flags: u8,
    /// Carries the request.
    pub request: bool,
}

/// What a reply made the client do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Send these and wait for the next reply.
    Send([Option<Out>; 2]),
    /// The exchange is complete (after sending `last`, if any); `server` is the real
    /// server the response named.
    Done {
        last: Option<Out>,
        server: (Ipv4Addr, u16),
    },
    /// A copy of a reply already acted on (it answered a retransmission): ignored.
    Duplicate,
}

/// One client exchange (a TCP connection or a UDP request), in a fixed-size table.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Conn {
    pub stage: Stage,
    pub udp: bool,
    /// Index of the client host.
    pub client: u16,
    /// Index of the service.
    pub service: u16,
    /// The queue pair it uses (replies come back on the same one).
    pub queue: u16,
    pub port: u16,
    /// Echoed in the response.
    pub token: u32,
    /// The client's initial sequence number.
    pub iss: u32,
    /// The server's, from its SYN-ACK.
    pub irs: u32,
    /// TSC when opened, and when last (re)sent.
    pub opened_tsc: u64,
    pub sent_tsc: u64,
    /// The real server the response named (address as u32, port), once received.
    pub server: (u32, u16),
}

impl Conn {
    /// What to (re)send in the current stage: the stage's segment, or nothing while
    /// resolving or free.
    pub fn pending(&self) -> Option<Out> {
        let len = MSG_LEN as u32;
        let (seq, ack, flags, request) = match self.stage {
            Stage::Free | Stage::Resolving => return None,
            Stage::SynSent => (self.iss, 0, SYN, false),
            Stage::RequestSent => (
                self.iss.wrapping_add(1),
                self.irs.wrapping_add(1),
                PSH | ACK,
                true,
            ),
            Stage::FinSent => (
                self.iss.wrapping_add(1 + len),
                self.irs.wrapping_add(1 + len),
                FIN | ACK,
                false,
            ),
            Stage::UdpSent => (0, 0, 0, true),
        };
        Some(Out {
            seq,
            ack,
            flags,
            request,
        })
    }

    /// Leaves `Resolving`: the first segment (SYN or request datagram) is due.
    pub fn start(&mut self) -> Option<Out> {
        self.stage = if self.udp {
            Stage::UdpSent
        } else {
            Stage::SynSent
        };
        self.pending()
    }

    /// Checks a reply already known to come from the service's VIP and port to this
    /// connection's client port, and moves the exchange on. `Err` names what is wrong.
    pub fn on_reply(&mut self, s: &Segment) -> Result<Step, &'static str> {
        let len = MSG_LEN as u32;
        if self.stage == Stage::UdpSent {
            return self
                .response(s)
                .map(|server| Step::Done { last: None, server });
        }
        if s.flags & RST != 0 {
            return Err("connection reset");
        }
        let (iss, irs) = (self.iss, self.irs);
        let dup_syn_ack = s.flags == SYN | ACK && s.seq == irs && s.ack == iss.wrapping_add(1);
        let dup_response = s.flags == PSH | ACK
            && s.seq == irs.wrapping_add(1)
            && s.ack == iss.wrapping_add(1 + len);
        match self.stage {
            Stage::SynSent => {
                if s.flags != SYN | ACK {
                    return Err("expected a SYN-ACK");
                }
                if s.ack != iss.wrapping_add(1) {
                    return Err("SYN-ACK acknowledges the wrong sequence number");
                }
                if !s.payload.is_empty() {
                    return Err("SYN-ACK carries data");
                }
                self.irs = s.seq;
                self.stage = Stage::RequestSent;
                let ack = Out {
                    seq: iss.wrapping_add(1),
                    ack: s.seq.wrapping_add(1),
                    flags: ACK,
                    request: false,
                };
                Ok(Step::Send([Some(ack), self.pending()]))
            }
            Stage::RequestSent if dup_syn_ack => Ok(Step::Duplicate),
            Stage::RequestSent => {
                if s.flags != PSH | ACK {
                    return Err("expected the response (PSH, ACK)");
                }
                if s.seq != irs.wrapping_add(1) {
                    return Err("response has the wrong sequence number");
                }
                if s.ack != iss.wrapping_add(1 + len) {
                    return Err("response acknowledges the wrong sequence number");
                }
                let (ip, port) = self.response(s)?;
                self.server = (u32::from(ip), port);
                self.stage = Stage::FinSent;
                Ok(Step::Send([self.pending(), None]))
            }
            Stage::FinSent if dup_syn_ack || dup_response => Ok(Step::Duplicate),
            Stage::FinSent => {
                if s.flags != FIN | ACK {
                    return Err("expected a FIN-ACK");
                }
                if s.seq != irs.wrapping_add(1 + len) {
                    return Err("FIN-ACK has the wrong sequence number");
                }
                if s.ack != iss.wrapping_add(2 + len) {
                    return Err("FIN-ACK acknowledges the wrong sequence number");
                }
                if !s.payload.is_empty() {
                    return Err("FIN-ACK carries data");
                }
                let last = Out {
                    seq: iss.wrapping_add(2 + len),
                    ack: irs.wrapping_add(2 + len),
                    flags: ACK,
                    request: false,
                };
                Ok(Step::Done {
                    last: Some(last),
                    server: (Ipv4Addr::from(self.server.0), self.server.1),
                })
            }
            Stage::Free | Stage::Resolving | Stage::UdpSent => {
                Err("a reply before anything was sent")
            }
        }
    }

    /// The real server a response names, once its payload checks out.
    fn response(&self, s: &Segment) -> Result<(Ipv4Addr, u16), &'static str> {
        match read_response(s.payload) {
            Some((token, ip, port)) if token == self.token => Ok((ip, port)),
            Some(_) => Err("response answers another request (token differs)"),
            None => Err("response payload corrupted or of the wrong length"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::emulator::frames::Endpoints;

    const CLIENT: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 6);
    const RS: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
    const VIP: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 1);

    /// Client to real server, as the server sees it after DNAT.
    fn to_server() -> Endpoints {
        Endpoints {
            src_mac: [2, 0x53, 0x4c, 0, 0, 1],
            dst_mac: [2, 0x50, 0x45, 0x45, 0x52, 1],
            src: CLIENT,
            dst: RS,
            sport: 40000,
            dport: 8080,
        }
    }

    /// Server to client, as the client sees it after SNAT.
    fn to_client() -> Endpoints {
        Endpoints {
            src_mac: [2, 0x53, 0x4c, 0, 0, 1],
            dst_mac: [2, 0x43, 0x4c, 0, 0, 1],
            src: VIP,
            dst: CLIENT,
            sport: 80,
            dport: 40000,
        }
    }

    fn seg(e: Endpoints, seq: u32, ack: u32, flags: u8, payload: &[u8]) -> Segment<'_> {
        Segment {
            e,
            seq,
            ack,
            flags,
            payload,
        }
    }

    fn new_conn(udp: bool) -> Conn {
        Conn {
            stage: Stage::Resolving,
            udp,
            port: 40000,
            token: 0xdead_beef,
            // Wraps during the exchange.
            iss: u32::MAX - 20,
            ..Conn::default()
        }
    }

    /// Runs `out` from the client through the stateless server; the server's answer as
    /// the client receives it.
    fn through_server(c: &Conn, out: Out) -> Option<(Answer, [u8; MSG_LEN])> {
        let req = request(c.token, CLIENT, c.port);
        let payload: &[u8] = if out.request { &req } else { &[] };
        let a = serve_tcp(
            &seg(to_server(), out.seq, out.ack, out.flags, payload),
            RS,
            true,
        )
        .expect("server accepts every client segment");
        a.map(|a| (a, a.response.unwrap_or([0; MSG_LEN])))
    }

    fn reply(c: &mut Conn, a: &Answer, body: &[u8; MSG_LEN]) -> Result<Step, &'static str> {
        let payload: &[u8] = if a.response.is_some() { body } else { &[] };
        c.on_reply(&seg(to_client(), a.seq, a.ack, a.flags, payload))
    }

    #[test]
    fn a_whole_tcp_exchange_between_client_and_stateless_server() {
        let mut c = new_conn(false);
        let syn = c.start().unwrap();
        assert_eq!((syn.seq, syn.flags, c.stage), (c.iss, SYN, Stage::SynSent));
        let (syn_ack, body) = through_server(&c, syn).unwrap();
        assert_eq!(syn_ack.flags, SYN | ACK);
        assert_eq!(syn_ack.ack, c.iss.wrapping_add(1));
        assert_eq!(syn_ack.seq, server_isn(CLIENT, 40000, c.iss));

        let Step::Send([Some(ack), Some(req)]) = reply(&mut c, &syn_ack, &body).unwrap() else {
            panic!("expected ACK and request")
        };
        assert_eq!((ack.flags, ack.request), (ACK, false));
        assert_eq!((req.flags, req.request), (PSH | ACK, true));
        assert_eq!(
            through_server(&c, ack),
            None,
            "the handshake ACK needs no answer"
        );
        let (resp, body) = through_server(&c, req).unwrap();
        assert_eq!(resp.flags, PSH | ACK);
        assert_eq!(read_response(&body), Some((0xdead_beef, RS, 8080)));

        let Step::Send([Some(fin), None]) = reply(&mut c, &resp, &body).unwrap() else {
            panic!("expected FIN")
        };
        assert_eq!(fin.flags, FIN | ACK);
        let (fin_ack, body) = through_server(&c, fin).unwrap();
        assert_eq!(fin_ack.flags, FIN | ACK);
        let Step::Done {
            last: Some(last),
            server,
        } = reply(&mut c, &fin_ack, &body).unwrap()
        else {
            panic!("expected completion")
        };
        assert_eq!(server, (RS, 8080));
        assert_eq!(last.flags, ACK);
        assert_eq!(last.seq, c.iss.wrapping_add(2 + MSG_LEN as u32));
        assert_eq!(
            through_server(&c, last),
            None,
            "the last ACK needs no answer"
        );
    }

    #[test]
    fn retransmissions_get_the_same_answer_and_late_copies_are_duplicates() {
        let mut c = new_conn(false);
        let syn = c.start().unwrap();
        let first = through_server(&c, syn).unwrap();
        assert_eq!(through_server(&c, c.pending().unwrap()), Some(first));
        reply(&mut c, &first.0, &first.1).unwrap();
        assert_eq!(reply(&mut c, &first.0, &first.1), Ok(Step::Duplicate));
        let resp = through_server(&c, c.pending().unwrap()).unwrap();
        assert_eq!(through_server(&c, c.pending().unwrap()), Some(resp));
        reply(&mut c, &resp.0, &resp.1).unwrap();
        assert_eq!(c.stage, Stage::FinSent);
        assert_eq!(reply(&mut c, &resp.0, &resp.1), Ok(Step::Duplicate));
        assert_eq!(reply(&mut c, &first.0, &first.1), Ok(Step::Duplicate));
    }

    #[test]
    fn wrong_replies_are_named() {
        let mut c = new_conn(false);
        let syn = c.start().unwrap();
        let (mut a, body) = through_server(&c, syn).unwrap();
        a.ack = a.ack.wrapping_add(1);
        assert_eq!(
            reply(&mut c.clone(), &a, &body),
            Err("SYN-ACK acknowledges the wrong sequence number")
        );
        a.ack = a.ack.wrapping_sub(1);
        a.flags = ACK;
        assert_eq!(reply(&mut c.clone(), &a, &body), Err("expected a SYN-ACK"));
        a.flags = SYN | ACK | RST;
        assert_eq!(reply(&mut c.clone(), &a, &body), Err("connection reset"));
        a.flags = SYN | ACK;
        reply(&mut c, &a, &body).unwrap();

        let (resp, body) = through_server(&c, c.pending().unwrap()).unwrap();
        let other = response(1, RS, 8080);
        assert_eq!(
            reply(&mut c.clone(), &resp, &other),
            Err("response answers another request (token differs)")
        );
        let mut corrupt = body;
        corrupt[31] ^= 1;
        assert_eq!(
            reply(&mut c.clone(), &resp, &corrupt),
            Err("response payload corrupted or of the wrong length")
        );
        let mut moved = resp;
        moved.seq = moved.seq.wrapping_add(5);
        assert_eq!(
            reply(&mut c.clone(), &moved, &body),
            Err("response has the wrong sequence number")
        );
    }

    #[test]
    fn the_server_rejects_what_no_correct_path_delivers() {
        let c = new_conn(false);
        let req = request(c.token, CLIENT, c.port);
        let y = server_isn(CLIENT, 40000, c.iss);
        let good = seg(
            to_server(),
            c.iss.wrapping_add(1),
            y.wrapping_add(1),
            PSH | ACK,
            &req,
        );
        assert!(serve_tcp(&good, RS, true).unwrap().is_some());
        let mut wrong_ack = good;
        wrong_ack.ack ^= 0x100;
        assert_eq!(
            serve_tcp(&wrong_ack, RS, true),
            Err("a real server received a request acknowledging the wrong sequence number")
        );
        // The client's source changed on the way (a NAT that should not be there).
        let mut natted = good;
        natted.e.src = Ipv4Addr::new(198, 18, 0, 1);
        assert!(serve_tcp(&natted, RS, true).is_err());
        let mut stray_ack = good;
        stray_ack.payload = &[];
        stray_ack.flags = ACK;
        stray_ack.ack = 12345;
        assert_eq!(
            serve_tcp(&stray_ack, RS, true),
            Err("a real server received an ACK that fits no step of the exchange")
        );
        let mut rst = good;
        rst.flags = RST;
        assert_eq!(
            serve_tcp(&rst, RS, true),
            Err("a real server received a RST")
        );
    }

    #[test]
    fn a_udp_exchange() {
        let mut c = new_conn(true);
        let out = c.start().unwrap();
        assert_eq!((c.stage, out.request), (Stage::UdpSent, true));
        let req = request(c.token, CLIENT, c.port);
        let mut e = to_server();
        e.dport = 5353;
        let resp = serve_udp(&seg(e, 0, 0, 0, &req), RS, true).unwrap();
        assert_eq!(
            c.on_reply(&seg(to_client(), 0, 0, 0, &resp)),
            Ok(Step::Done {
                last: None,
                server: (RS, 5353)
            })
        );
        assert!(
            serve_udp(&seg(e, 0, 0, 0, &resp), RS, true).is_err(),
            "a response is no request"
        );
    }

    #[test]
    fn messages_round_trip_and_reject_corruption() {
        let m = request(42, CLIENT, 40000);
        assert_eq!(&m[0..4], b"SLQ1");
        assert_eq!(read_request(&m), Some((42, CLIENT, 40000)));
        assert_eq!(read_response(&m), None);
        assert_eq!(read_request(&m[..31]), None);
        let mut bad = m;
        bad[20] = 0;
        assert_eq!(read_request(&bad), None);
        let r = response(42, RS, 8080);
        assert_eq!(read_response(&r), Some((42, RS, 8080)));
        assert_ne!(server_isn(CLIENT, 40000, 1), server_isn(CLIENT, 40001, 1));
        assert_ne!(server_isn(CLIENT, 40000, 1), server_isn(CLIENT, 40000, 2));
    }
}
