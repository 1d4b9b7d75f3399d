//! The generator's packet logic, on plain byte slices (no DPDK here, so it is unit
//! tested with a software stand-in for the device under test).
//!
//! The generator plays both ends of every connection through the DUT:
//!
//! * **clients** (one MAC, addresses from two prefixes: established flows from
//!   198.19.0.0/16, new connections from 198.18.128.0/17) that open TCP connections to
//!   the VIP with a real handshake, send requests, read responses and close with FIN;
//! * **real servers** (one MAC and address each) that answer what the DUT forwards to
//!   them: SYN -> SYN-ACK, request -> response (payload copied, so the client's TSC
//!   stamp survives), FIN -> FIN-ACK. For NAT and FullNAT the answer goes back through
//!   the DUT; for DR it would bypass it, so it is handed to the client logic directly.
//!
//! The load is a closed loop of `window` tokens. A token is one packet in flight; the
//! packet carries its token number in the IPv4 identification field and the token's
//! generation in the TCP urgent pointer (URG is never set, so the field has no meaning
//! on the wire; the DUT must carry both unchanged, as NAT does). Each received packet is
//! rewritten in place into the token's next packet. A token silent for longer than the
//! loss timeout is declared lost (the DUT dropped its packet), its generation bumped so
//! a late copy is recognised as stale, and a fresh token takes its place.
//!
//! Every packet the generator receives is validated (see [`Fail`] for what can go
//! wrong): addresses and ports against what the token's flow and the forwarding mode
//! say they must be after the DUT's rewrite, TCP flags, sequence and acknowledgement
//! numbers (which prove that a reply reached the connection it belongs to), the payload
//! stamp, and the IPv4 and TCP checksums (every packet in full validation, every 64th
//! otherwise). FullNAT flows are also checked for a stable local address and port, and
//! every flow for a stable real server, across the whole run.
use crate::hist::Histogram;
use sluice::flow::rss::{HashFields, Reta, Toeplitz};
use sluice::wire::checksum;
use std::net::Ipv4Addr;

pub const IP_OFF: usize = 14;
pub const TCP_OFF: usize = 34;
pub const PAYLOAD_OFF: usize = 54;
pub const STAMP_LEN: usize = 8;
/// The shortest frame a data packet fits in: headers and the 8-byte TSC stamp.
pub const MIN_FRAME: usize = PAYLOAD_OFF + STAMP_LEN;
pub const MAX_FRAME: usize = 1514;
pub const MAX_WINDOW: usize = 16384;
pub const MAX_REAL_SERVERS: u8 = 16;
/// Local addresses 198.18.3.1 ..= 198.18.3.254.
pub const MAX_LIPS: u16 = 254;
/// VIPs 198.18.1.1 ..= 198.18.1.16.
pub const MAX_VIPS: u32 = 16;

pub const DUT_MAC: [u8; 6] = [0x02, 0x53, 0x4c, 0x00, 0x00, 0x01];
pub const CLIENT_MAC: [u8; 6] = [0x02, 0xc1, 0x1e, 0x00, 0x00, 0x01];
/// Real server `k` (0-based) has MAC `02:52:53:00:00:<k+1>` and address 198.18.2.<k+1>.
pub const RS_MAC_PREFIX: [u8; 5] = [0x02, 0x52, 0x53, 0x00, 0x00];

const fn ip(a: u8, b: u8, c: u8, d: u8) -> u32 {
    u32::from_be_bytes([a, b, c, d])
}
pub const DUT_IP: u32 = ip(198, 18, 0, 1);
pub const VIP: u32 = ip(198, 18, 1, 1);
pub const VPORT: u16 = 80;
pub const RS_BASE: u32 = ip(198, 18, 2, 1);
pub const RS_NAT_PORT: u16 = 8080;
pub const LIP_BASE: u32 = ip(198, 18, 3, 1);
/// Established flow `f`: client 198.19.0.1 + f / 50000, port 10000 + f % 50000.
pub const EST_CLIENT_BASE: u32 = ip(198, 19, 0, 1);
/// New connection `c`: client 198.18.128.1 + (c / 50000) % 32000, port 10000 + c % 50000.
pub const CONN_CLIENT_BASE: u32 = ip(198, 18, 128, 1);
const CONN_CLIENT_HOSTS: u64 = 32_000;
const PORTS_PER_HOST: u64 = 50_000;
const CLIENT_PORT_BASE: u16 = 10_000;
/// The service the SYN flood targets (`synflood` workloads): its own VIP, so the N
/// established sessions stay on a service without the proxy.
pub const FLOOD_VIP: u32 = ip(198, 18, 1, 200);
/// Spoofed flood sources: 198.18.128.0/17, ports 1024..=65535, each (address, port)
/// used once in the first 2 113 929 216 SYNs (see [`flood_source`]).
const FLOOD_SRC_BASE: u32 = ip(198, 18, 128, 0);
const FLOOD_PORTS: u64 = 65_536 - 1024;
const FLOOD_SPACE: u64 = (1 << 15) * FLOOD_PORTS;
/// Established flows that fit the 198.19.0.0/16 prefix.
pub const MAX_SESSIONS: u32 = 65_000 * PORTS_PER_HOST as u32;
/// FullNAT local ports start here (Sluice's default range 1024..=65535).
const LOCAL_PORT_MIN: u16 = 1024;

const FIN: u8 = 0x01;
const SYN: u8 = 0x02;
const PSH: u8 = 0x08;
const ACK: u8 = 0x10;

pub fn rs_ip(k: u8) -> u32 {
    RS_BASE + k as u32
}

pub fn rs_mac(k: u8) -> [u8; 6] {
    let mut m = [0; 6];
    m[..5].copy_from_slice(&RS_MAC_PREFIX);
    m[5] = k + 1;
    m
}

pub fn lip(i: u16) -> u32 {
    LIP_BASE + i as u32
}

pub fn ipv4(v: u32) -> Ipv4Addr {
    Ipv4Addr::from(v)
}

/// What sits in the DUT's place, and so what the generator expects to get back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Dr,
    Nat,
    FullNat,
    /// testpmd `--forward-mode=5tswap`: MACs, addresses and ports swapped.
    Swap5t,
    /// testpmd `--forward-mode=macswap`: only the MACs swapped.
    MacSwap,
}

impl Mode {
    pub fn parse(s: &str) -> Option<Mode> {
        Some(match s {
            "dr" => Mode::Dr,
            "nat" => Mode::Nat,
            "fullnat" => Mode::FullNat,
            "5tswap" => Mode::Swap5t,
            "macswap" => Mode::MacSwap,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Mode::Dr => "dr",
            Mode::Nat => "nat",
            Mode::FullNat => "fullnat",
            Mode::Swap5t => "5tswap",
            Mode::MacSwap => "macswap",
        }
    }

    /// testpmd reflects packets; there is no real server, handshake or session.
    pub fn is_swap(self) -> bool {
        matches!(self, Mode::Swap5t | Mode::MacSwap)
    }

    /// The real server's port as the DUT sends to it.
    pub fn rs_port(self) -> u16 {
        match self {
            Mode::Dr => VPORT,
            _ => RS_NAT_PORT,
        }
    }
}

/// The order in which requests visit the established flows: each flow once per round
/// either way.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FlowOrder {
    /// Flow 0, 1, 2, ...: the order the flows were opened in, so the DUT reads its
    /// session entries one after the other, in the order it filed them.
    Creation,
    /// A fixed permutation that puts flows opened far apart next to each other, as
    /// many clients' requests interleave: the DUT reads its session entries at random.
    Scrambled,
}

impl FlowOrder {
    /// A prime above `u32::MAX`: coprime with every flow count, so multiplying by it
    /// modulo the count permutes the flows.
    const STRIDE: u128 = 4_294_967_311;

    pub fn parse(s: &str) -> Option<FlowOrder> {
        Some(match s {
            "creation" => FlowOrder::Creation,
            "scrambled" => FlowOrder::Scrambled,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            FlowOrder::Creation => "creation",
            FlowOrder::Scrambled => "scrambled",
        }
    }

    /// The flow the `n`-th request of a round of `flows` requests goes to.
    pub fn flow(self, n: u32, flows: u32) -> u32 {
        match self {
            FlowOrder::Creation => n,
            FlowOrder::Scrambled => {
                (u128::from(n) * Self::STRIDE % u128::from(flows.max(1))) as u32
            }
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Workload {
    /// Requests on the established flows only, in rotation so all N are touched.
    Established,
    /// Every request on a new connection: handshake, request, response, FIN exchange.
    Connections,
    /// `new_percent` of the requests on new connections, the rest on established flows.
    Mixed,
    /// SYNs from spoofed sources to [`FLOOD_VIP`] that never complete: each SYN-ACK
    /// that comes back (the proxy's cookie, or the real server's through the DUT) is
    /// counted and turned into the next SYN from a new source.
    SynFlood,
}

impl Workload {
    pub fn parse(s: &str) -> Option<Workload> {
        Some(match s {
            "established" => Workload::Established,
            "connections" => Workload::Connections,
            "mixed" => Workload::Mixed,
            "synflood" => Workload::SynFlood,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Workload::Established => "established",
            Workload::Connections => "connections",
            Workload::Mixed => "mixed",
            Workload::SynFlood => "synflood",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Validate {
    /// Addresses, flags, sequence numbers and payload of every packet; checksums of
    /// every 64th.
    Sample,
    /// Everything on every packet.
    Full,
}

/// What a received packet can get wrong. Each is counted; the first packet of each
/// kind is kept for a hex dump; any of them fails the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Fail {
    /// Shorter than the headers, or not the configured frame size.
    FrameLength,
    /// Not IPv4/TCP or ARP, or addressed to a MAC the generator does not own.
    UnexpectedFrame,
    /// Source MAC is not the DUT's.
    SrcMac,
    /// IPv4 version/IHL, protocol, length or fragment fields wrong; TCP header length.
    IpHeader,
    IpChecksum,
    TcpChecksum,
    /// The token number is out of range.
    Token,
    /// At a client: not from VIP:port, or not to the token's client address and port.
    ClientAddr,
    /// At a real server: not to the address and port the mode requires (NAT/FullNAT:
    /// the real server's own; DR: the VIP), or the MAC and address disagree.
    RsDst,
    /// At a real server: the source is not the token's client (NAT, DR) or not one of
    /// the local addresses and ports (FullNAT).
    RsSrc,
    /// A flow's packets reached two real servers, or (FullNAT) came from two local
    /// address/port pairs.
    RsInconsistent,
    /// TCP flags or payload length do not fit the connection's state.
    Flags,
    /// Sequence or acknowledgement number wrong: the packet belongs to another
    /// connection, or was mangled.
    SeqAck,
    /// The payload (the TSC stamp) changed.
    Payload,
    /// SYN flood: with the proxy on, a flood SYN reached a real server or a SYN-ACK
    /// came without the proxy's MSS option; with it off, a SYN-ACK carried options
    /// (the generator's real servers send none) or a sequence number no real server
    /// chose.
    Synproxy,
}

pub const FAIL_KINDS: usize = 15;
pub const FAIL_NAMES: [&str; FAIL_KINDS] = [
    "frame_length",
    "unexpected_frame",
    "src_mac",
    "ip_header",
    "ip_checksum",
    "tcp_checksum",
    "token",
    "client_addr",
    "rs_dst",
    "rs_src",
    "rs_inconsistent",
    "flags",
    "seq_ack",
    "payload",
    "synproxy",
];
const DUMP_LEN: usize = 128;

pub struct Failures {
    pub counts: [u64; FAIL_KINDS],
    first: [[u8; DUMP_LEN]; FAIL_KINDS],
    first_len: [usize; FAIL_KINDS],
}

impl Failures {
    fn new() -> Failures {
        Failures {
            counts: [0; FAIL_KINDS],
            first: [[0; DUMP_LEN]; FAIL_KINDS],
            first_len: [0; FAIL_KINDS],
        }
    }

    #[cold]
    fn record(&mut self, kind: Fail, frame: &[u8]) {
        let k = kind as usize;
        self.counts[k] += 1;
        if self.counts[k] == 1 {
            let n = frame.len().min(DUMP_LEN);
            self.first[k][..n].copy_from_slice(&frame[..n]);
            self.first_len[k] = n;
            // Once per kind per run: printing here is not on the steady-state path.
            println!(
                "gen: validation failure {}: first offending packet ({} bytes): {}",
                FAIL_NAMES[k],
                frame.len(),
                self.dump(k)
            );
        }
    }

    pub fn total(&self) -> u64 {
        self.counts.iter().sum()
    }

    /// Hex of the first offending packet of kind `k` (up to 128 bytes).
    pub fn dump(&self, k: usize) -> String {
        self.first[k][..self.first_len[k]]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect()
    }
}

/// Counters of everything the engine saw and did.
#[derive(Clone, Copy, Debug, Default)]
pub struct Stats {
    /// Frames received from the DUT (all kinds).
    pub rx: u64,
    /// Frames handed to the DUT (counted by the I/O loop after a successful burst).
    pub tx: u64,
    pub rx_client: u64,
    pub rx_rs: u64,
    /// Responses received by clients (one per request).
    pub requests: u64,
    /// Connections completed (final ACK of the FIN exchange seen by the real server).
    pub connections: u64,
    /// Flows whose handshake completed in the establish phase.
    pub established: u64,
    /// Tokens declared lost (no answer within the loss timeout).
    pub lost: u64,
    /// Packets of a token that was already declared lost or retired.
    pub stale: u64,
    pub arp_answered: u64,
    pub arp_other: u64,
    /// Packets with their checksums verified.
    pub checksummed: u64,
    /// Packets the I/O loop could not hand to the DUT (its ring was full).
    pub tx_dropped: u64,
    /// SYN flood: SYNs sent from spoofed sources, and SYN-ACKs received for them.
    pub flood_syns: u64,
    pub flood_syn_acks: u64,
    /// SYN flood with the proxy off: flood SYNs the real servers received.
    pub flood_syns_at_rs: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Open the N flows (SYN, SYN-ACK, ACK); the DUT then holds N established sessions.
    Establish,
    /// One token: round trips without queueing, for the latency figure.
    Probe,
    /// No traffic (waiting for the orchestrator).
    Idle,
    /// `window` tokens running the workload.
    Measure,
    /// No new tokens; the ones in flight finish or time out.
    Drain,
}

/// Where a handled frame goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Out {
    /// Transmit to the DUT on this queue.
    Tx(u16),
    /// Free it.
    Drop,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Task {
    Idle,
    Establish,
    Data,
    Conn,
    /// One spoofed SYN, waiting for its SYN-ACK.
    Flood,
}

/// What the token's last packet was (and so what answer it waits for).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(clippy::enum_variant_names)]
enum Stage {
    SynSent,
    /// The handshake's final ACK (establish phase) is on its way to the real server.
    AckSent,
    DataSent,
    FinSent,
    FinalAckSent,
}

#[derive(Clone, Copy, Debug)]
struct Slot {
    gen: u16,
    task: Task,
    stage: Stage,
    /// Real server index + 1 seen for this connection (0: none yet).
    rs: u8,
    /// Established flow index, or new-connection number.
    flow: u64,
    /// TSC of the token's last transmission.
    sent: u64,
    /// The stamp in the outstanding request's payload.
    stamp: u64,
    /// FullNAT: `lip << 16 | lport` seen by the real server for this connection.
    local: u64,
}

const EMPTY_SLOT: Slot = Slot {
    gen: 0,
    task: Task::Idle,
    stage: Stage::SynSent,
    rs: 0,
    flow: 0,
    sent: 0,
    stamp: 0,
    local: 0,
};

pub struct EngineConfig {
    pub mode: Mode,
    pub workload: Workload,
    pub sessions: u32,
    pub window: usize,
    pub frame_len: usize,
    pub validate: Validate,
    pub real_servers: u8,
    pub lips: u16,
    pub new_percent: u32,
    /// The order requests visit the established flows in.
    pub order: FlowOrder,
    /// The first VIP the clients connect to (and expect answers from); flow `f` uses
    /// `vip + f % vips` (several services when one cannot hold enough FullNAT local
    /// addresses).
    pub vip: u32,
    pub vips: u32,
    /// TSC cycles after which a silent token is lost.
    pub loss_timeout: u64,
    /// Several DUT queues: spread packets as the NIC's RSS would (Sluice's view of a
    /// device without RSS: its default key and a round-robin table).
    pub rss: Option<(Toeplitz, Reta)>,
    /// `synflood`: the DUT's flood service runs the SYN proxy, so SYN-ACKs must be
    /// the proxy's cookies and no flood SYN may reach a real server.
    pub synproxy: bool,
}

pub struct Engine {
    cfg: EngineConfig,
    /// Payload length of data packets (frame length minus headers).
    plen: usize,
    slots: Vec<Slot>,
    free: Vec<u16>,
    /// Establish-phase flows whose token was lost: opened again first.
    retry: Vec<u32>,
    active: usize,
    target: usize,
    phase: Phase,
    est_cursor: u32,
    data_cursor: u32,
    conn_next: u64,
    flood_next: u64,
    mix_acc: u32,
    /// Real server index + 1 of each established flow (0: not seen).
    flow_rs: Vec<u8>,
    /// FullNAT: `lip << 16 | lport` of each established flow.
    flow_local: Vec<u64>,
    sample: u32,
    pub stats: Stats,
    pub failures: Failures,
    /// Round trips (TSC cycles) of the measure phase and of the probe phase.
    pub hist_measure: Histogram,
    pub hist_probe: Histogram,
}

#[inline(always)]
fn rd16(f: &[u8], o: usize) -> u16 {
    u16::from_be_bytes([f[o], f[o + 1]])
}

#[inline(always)]
fn rd32(f: &[u8], o: usize) -> u32 {
    u32::from_be_bytes([f[o], f[o + 1], f[o + 2], f[o + 3]])
}

#[inline(always)]
fn mix(x: u64) -> u32 {
    let x = (x ^ (x >> 31)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    (x ^ (x >> 29)) as u32
}

/// A client's initial sequence number for flow (or connection) `flow`.
#[inline(always)]
fn client_isn(task: Task, flow: u64) -> u32 {
    mix(flow ^ if task == Task::Conn { 1 << 63 } else { 0 })
}

/// A real server's initial sequence number for a peer (the client, or the FullNAT
/// local address and port it sees): stateless, so the server keeps no table.
#[inline(always)]
fn server_isn(peer: u32, port: u16) -> u32 {
    mix(((peer as u64) << 16 | port as u64) ^ 0x5e4f_e400_0000_0000)
}

/// A flood SYN's sequence number: its token and generation, which every SYN-ACK
/// acknowledges (`ack - 1`), the proxy's included (its SYN-ACK keeps neither the
/// IPv4 identification nor the urgent pointer).
#[inline(always)]
fn flood_isn(id: u16, gen: u16) -> u32 {
    (gen as u32) << 16 | id as u32
}

/// A bijection of [0, 2^31): xor-shifts and multiplications by odd numbers.
#[inline(always)]
fn scramble31(mut x: u64) -> u64 {
    const MASK: u64 = (1 << 31) - 1;
    x ^= x >> 16;
    x = x.wrapping_mul(0x045d_9f3b) & MASK;
    x ^= x >> 15;
    x = x.wrapping_mul(0x2c1b_3c6d) & MASK;
    x ^ (x >> 16)
}

/// Spoofed source of flood SYN `n`: a bijection of `n` over the 2^15 addresses x
/// 64 512 ports ([`scramble31`], walked until it lands inside that space, which is
/// 98 % of 2^31), so sources look random and none repeats within the space.
#[inline(always)]
pub fn flood_source(n: u64) -> (u32, u16) {
    let mut x = scramble31(n % FLOOD_SPACE);
    while x >= FLOOD_SPACE {
        x = scramble31(x);
    }
    (
        FLOOD_SRC_BASE + (x / FLOOD_PORTS) as u32,
        1024 + (x % FLOOD_PORTS) as u16,
    )
}

#[inline(always)]
fn client_of(task: Task, flow: u64) -> (u32, u16) {
    let port = CLIENT_PORT_BASE + (flow % PORTS_PER_HOST) as u16;
    match task {
        Task::Flood => flood_source(flow),
        Task::Conn => (
            CONN_CLIENT_BASE + ((flow / PORTS_PER_HOST) % CONN_CLIENT_HOSTS) as u32,
            port,
        ),
        _ => (EST_CLIENT_BASE + (flow / PORTS_PER_HOST) as u32, port),
    }
}

/// Everything written into a frame's headers.
struct Hdr {
    src_mac: [u8; 6],
    dst_mac: [u8; 6],
    src: u32,
    sport: u16,
    dst: u32,
    dport: u16,
    seq: u32,
    ack: u32,
    flags: u8,
    token: u16,
    gen: u16,
}

/// Writes Ethernet, IPv4 and TCP headers (the payload bytes are left as they are) and
/// computes both checksums in full. `plen` payload bytes follow the TCP header; the
/// rest of the frame is Ethernet padding.
#[inline]
fn write_headers(f: &mut [u8], h: &Hdr, plen: usize) {
    f[0..6].copy_from_slice(&h.dst_mac);
    f[6..12].copy_from_slice(&h.src_mac);
    f[12] = 0x08;
    f[13] = 0x00;
    let total = (40 + plen) as u16;
    let ip = &mut f[IP_OFF..TCP_OFF];
    ip[0] = 0x45;
    ip[1] = 0;
    ip[2..4].copy_from_slice(&total.to_be_bytes());
    ip[4..6].copy_from_slice(&h.token.to_be_bytes());
    ip[6] = 0x40; // DF
    ip[7] = 0;
    ip[8] = 64;
    ip[9] = 6;
    ip[10] = 0;
    ip[11] = 0;
    ip[12..16].copy_from_slice(&h.src.to_be_bytes());
    ip[16..20].copy_from_slice(&h.dst.to_be_bytes());
    let c = checksum::finish(checksum::sum(ip));
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    let tcp = &mut f[TCP_OFF..PAYLOAD_OFF];
    tcp[0..2].copy_from_slice(&h.sport.to_be_bytes());
    tcp[2..4].copy_from_slice(&h.dport.to_be_bytes());
    tcp[4..8].copy_from_slice(&h.seq.to_be_bytes());
    tcp[8..12].copy_from_slice(&h.ack.to_be_bytes());
    tcp[12] = 5 << 4;
    tcp[13] = h.flags;
    tcp[14..16].copy_from_slice(&0xffffu16.to_be_bytes());
    tcp[16] = 0;
    tcp[17] = 0;
    tcp[18..20].copy_from_slice(&h.gen.to_be_bytes());
    let sum = checksum::pseudo_header_sum(ipv4(h.src), ipv4(h.dst), 6, (20 + plen) as u16)
        + checksum::sum(&f[TCP_OFF..PAYLOAD_OFF + plen]);
    let c = checksum::finish(sum);
    f[TCP_OFF + 16..TCP_OFF + 18].copy_from_slice(&c.to_be_bytes());
}

impl Engine {
    pub fn new(cfg: EngineConfig) -> Engine {
        assert!(cfg.window >= 1 && cfg.window <= MAX_WINDOW);
        assert!(cfg.frame_len >= MIN_FRAME && cfg.frame_len <= MAX_FRAME);
        assert!(cfg.sessions >= 1 && cfg.sessions <= MAX_SESSIONS);
        assert!(cfg.real_servers >= 1 && cfg.real_servers <= MAX_REAL_SERVERS);
        assert!(cfg.vips >= 1 && cfg.vips <= MAX_VIPS);
        let n = cfg.sessions as usize;
        let tracked = !cfg.mode.is_swap();
        Engine {
            plen: cfg.frame_len - PAYLOAD_OFF,
            slots: vec![EMPTY_SLOT; cfg.window],
            free: (0..cfg.window as u16).rev().collect(),
            retry: Vec::with_capacity(cfg.window),
            active: 0,
            target: 0,
            phase: Phase::Idle,
            est_cursor: 0,
            data_cursor: 0,
            conn_next: 0,
            flood_next: 0,
            mix_acc: 0,
            flow_rs: if tracked { vec![0; n] } else { Vec::new() },
            flow_local: if cfg.mode == Mode::FullNat {
                vec![0; n]
            } else {
                Vec::new()
            },
            sample: 0,
            stats: Stats::default(),
            failures: Failures::new(),
            hist_measure: Histogram::new(),
            hist_probe: Histogram::new(),
            cfg,
        }
    }

    /// Tokens in flight.
    pub fn active(&self) -> usize {
        self.active
    }

    pub fn set_phase(&mut self, phase: Phase) {
        self.phase = phase;
        self.target = match phase {
            Phase::Establish | Phase::Measure => self.cfg.window,
            Phase::Probe => 1,
            Phase::Idle | Phase::Drain => 0,
        };
    }

    /// Every flow opened and no token left in flight.
    pub fn establish_done(&self) -> bool {
        self.est_cursor == self.cfg.sessions && self.retry.is_empty() && self.active == 0
    }

    /// How many new tokens `launch` would start now.
    #[inline]
    pub fn deficit(&self) -> usize {
        if self.phase == Phase::Establish
            && self.est_cursor == self.cfg.sessions
            && self.retry.is_empty()
        {
            return 0;
        }
        self.target.saturating_sub(self.active)
    }

    /// Starts a new token in `f` (a zeroed frame of the configured length): its first
    /// packet. `None` when no token is wanted.
    pub fn launch(&mut self, f: &mut [u8], now: u64) -> Option<Out> {
        if self.active >= self.target {
            return None;
        }
        let id = self.free.pop()?;
        if !self.assign(id) {
            self.free.push(id);
            return None;
        }
        self.active += 1;
        Some(self.emit_first(id, f, now))
    }

    /// Declares tokens silent for longer than the loss timeout lost.
    pub fn expire(&mut self, now: u64) {
        for id in 0..self.slots.len() {
            let s = self.slots[id];
            if s.task != Task::Idle && now.wrapping_sub(s.sent) > self.cfg.loss_timeout {
                if s.task == Task::Establish {
                    self.retry.push(s.flow as u32);
                }
                self.stats.lost += 1;
                self.retire(id as u16);
            }
        }
    }

    /// Writes a gratuitous-style ARP request from real server `k` asking for the DUT's
    /// address (the DUT learns the server's MAC from it). Returns the frame length.
    pub fn write_arp_announce(f: &mut [u8], k: u8) -> usize {
        let mac = rs_mac(k);
        f[0..6].fill(0xff);
        f[6..12].copy_from_slice(&mac);
        f[12..14].copy_from_slice(&[0x08, 0x06]);
        f[14..22].copy_from_slice(&[0, 1, 0x08, 0, 6, 4, 0, 1]);
        f[22..28].copy_from_slice(&mac);
        f[28..32].copy_from_slice(&rs_ip(k).to_be_bytes());
        f[32..38].fill(0);
        f[38..42].copy_from_slice(&DUT_IP.to_be_bytes());
        f[42..60].fill(0);
        60
    }

    fn retire(&mut self, id: u16) {
        let s = &mut self.slots[id as usize];
        s.task = Task::Idle;
        s.gen = s.gen.wrapping_add(1);
        self.free.push(id);
        self.active -= 1;
    }

    /// Gives slot `id` its next task; false when there is none.
    fn assign(&mut self, id: u16) -> bool {
        let (task, flow) = match self.phase {
            Phase::Establish => {
                if let Some(f) = self.retry.pop() {
                    (Task::Establish, f as u64)
                } else if self.est_cursor < self.cfg.sessions {
                    self.est_cursor += 1;
                    (Task::Establish, (self.est_cursor - 1) as u64)
                } else {
                    return false;
                }
            }
            Phase::Measure if self.cfg.workload == Workload::SynFlood => {
                self.flood_next += 1;
                (Task::Flood, self.flood_next - 1)
            }
            Phase::Probe | Phase::Measure => {
                let conn = !self.cfg.mode.is_swap()
                    && match self.cfg.workload {
                        // The probe of a flood scenario times established flows.
                        Workload::Established | Workload::SynFlood => false,
                        Workload::Connections => true,
                        Workload::Mixed => {
                            self.mix_acc += self.cfg.new_percent;
                            if self.mix_acc >= 100 {
                                self.mix_acc -= 100;
                                true
                            } else {
                                false
                            }
                        }
                    };
                if conn {
                    self.conn_next += 1;
                    (Task::Conn, self.conn_next - 1)
                } else {
                    let f = self.cfg.order.flow(self.data_cursor, self.cfg.sessions);
                    self.data_cursor += 1;
                    if self.data_cursor == self.cfg.sessions {
                        self.data_cursor = 0;
                    }
                    (Task::Data, f as u64)
                }
            }
            Phase::Idle | Phase::Drain => return false,
        };
        let s = &mut self.slots[id as usize];
        s.task = task;
        s.flow = flow;
        s.rs = 0;
        s.local = 0;
        true
    }

    /// Writes the first packet of slot `id`'s task into `f`.
    fn emit_first(&mut self, id: u16, f: &mut [u8], now: u64) -> Out {
        let s = self.slots[id as usize];
        let isn = client_isn(s.task, s.flow);
        match s.task {
            Task::Establish | Task::Conn => {
                self.slots[id as usize].stage = Stage::SynSent;
                self.send_client(id, f, now, isn, 0, SYN, false)
            }
            Task::Flood => {
                self.slots[id as usize].stage = Stage::SynSent;
                self.stats.flood_syns += 1;
                self.send_client(id, f, now, flood_isn(id, s.gen), 0, SYN, false)
            }
            _ => {
                self.slots[id as usize].stage = Stage::DataSent;
                self.send_client(id, f, now, isn.wrapping_add(1), 1, PSH | ACK, true)
            }
        }
    }

    /// The token's next task after it completed one, or retirement.
    fn next(&mut self, id: u16, f: &mut [u8], now: u64) -> Out {
        if self.active > self.target || !self.assign(id) {
            self.retire(id);
            return Out::Drop;
        }
        self.emit_first(id, f, now)
    }

    /// Writes a client -> VIP packet for slot `id` and records its transmission.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    fn send_client(
        &mut self,
        id: u16,
        f: &mut [u8],
        now: u64,
        seq: u32,
        ack: u32,
        flags: u8,
        data: bool,
    ) -> Out {
        let s = &mut self.slots[id as usize];
        let (cip, cport) = client_of(s.task, s.flow);
        let vip = if s.task == Task::Flood {
            FLOOD_VIP
        } else {
            self.cfg.vip + (s.flow % self.cfg.vips as u64) as u32
        };
        let plen = if data {
            s.stamp = now;
            f[PAYLOAD_OFF..PAYLOAD_OFF + STAMP_LEN].copy_from_slice(&now.to_le_bytes());
            self.plen
        } else {
            0
        };
        s.sent = now;
        let gen = s.gen;
        let h = Hdr {
            src_mac: CLIENT_MAC,
            dst_mac: DUT_MAC,
            src: cip,
            sport: cport,
            dst: vip,
            dport: VPORT,
            seq,
            ack,
            flags,
            token: id,
            gen,
        };
        write_headers(f, &h, plen);
        Out::Tx(self.queue_for(cip, vip, cport, VPORT))
    }

    #[inline]
    fn queue_for(&self, src: u32, dst: u32, sport: u16, dport: u16) -> u16 {
        match &self.cfg.rss {
            None => 0,
            Some((t, reta)) => {
                reta.queue(t.hash_tuple(HashFields::L3L4, ipv4(src), ipv4(dst), sport, dport))
            }
        }
    }

    #[cold]
    fn fail(&mut self, kind: Fail, f: &[u8]) -> Out {
        self.failures.record(kind, f);
        Out::Drop
    }

    /// Checks the IPv4/TCP framing (and checksums when `sums`); returns the TCP payload
    /// length.
    #[inline]
    fn parse(&mut self, f: &[u8], sums: bool) -> Result<usize, Fail> {
        if f.len() != self.cfg.frame_len {
            return Err(Fail::FrameLength);
        }
        if f[12] != 0x08 || f[13] != 0x00 {
            return Err(Fail::UnexpectedFrame);
        }
        if f[IP_OFF] != 0x45 || f[IP_OFF + 9] != 6 || rd16(f, IP_OFF + 6) & 0x3fff != 0 {
            return Err(Fail::IpHeader);
        }
        let total = rd16(f, IP_OFF + 2) as usize;
        if total < 40 || IP_OFF + total > f.len() || f[TCP_OFF + 12] >> 4 != 5 {
            return Err(Fail::IpHeader);
        }
        let plen = total - 40;
        if sums {
            self.stats.checksummed += 1;
            if checksum::fold(checksum::sum(&f[IP_OFF..TCP_OFF])) != 0xffff {
                return Err(Fail::IpChecksum);
            }
            let src = ipv4(rd32(f, IP_OFF + 12));
            let dst = ipv4(rd32(f, IP_OFF + 16));
            let sum = checksum::pseudo_header_sum(src, dst, 6, (20 + plen) as u16)
                + checksum::sum(&f[TCP_OFF..PAYLOAD_OFF + plen]);
            if checksum::fold(sum) != 0xffff {
                return Err(Fail::TcpChecksum);
            }
        }
        Ok(plen)
    }

    #[inline]
    fn sample_sums(&mut self) -> bool {
        self.sample = self.sample.wrapping_add(1);
        self.cfg.validate == Validate::Full || self.sample & 63 == 0
    }

    /// The token a packet belongs to, or why it belongs to none (`Err(true)`: stale).
    #[inline]
    fn token(&mut self, f: &[u8]) -> Result<u16, bool> {
        let id = rd16(f, IP_OFF + 4);
        let gen = rd16(f, TCP_OFF + 18);
        let Some(s) = self.slots.get(id as usize) else {
            return Err(false);
        };
        if s.task == Task::Idle || s.gen != gen {
            self.stats.stale += 1;
            return Err(true);
        }
        Ok(id)
    }

    /// Handles one frame received from the DUT, rewriting it in place into whatever
    /// the generator sends next.
    #[inline]
    pub fn handle(&mut self, f: &mut [u8], now: u64) -> Out {
        self.stats.rx += 1;
        if f.len() < PAYLOAD_OFF {
            return self.fail(Fail::FrameLength, f);
        }
        if f[12] == 0x08 && f[13] == 0x06 {
            return self.arp(f);
        }
        if f[0..6] == CLIENT_MAC {
            return self.client(f, now, true);
        }
        if f[0..5] == RS_MAC_PREFIX && f[5] >= 1 && f[5] <= self.cfg.real_servers {
            return self.rs(f, now, f[5] - 1);
        }
        self.fail(Fail::UnexpectedFrame, f)
    }

    /// Answers the DUT's ARP requests for the real servers; counts everything else.
    fn arp(&mut self, f: &mut [u8]) -> Out {
        if f.len() < 42 || f[14..22] != [0, 1, 0x08, 0, 6, 4, 0, 1] || self.cfg.mode.is_swap() {
            // Replies (to the announcements) and anything else ARP.
            self.stats.arp_other += 1;
            return Out::Drop;
        }
        let target = rd32(f, 38);
        let k = target.wrapping_sub(RS_BASE);
        if k >= self.cfg.real_servers as u32 {
            self.stats.arp_other += 1;
            return Out::Drop;
        }
        let mac = rs_mac(k as u8);
        let mut asker = [0u8; 10];
        asker.copy_from_slice(&f[22..32]);
        f[0..6].copy_from_slice(&asker[0..6]);
        f[6..12].copy_from_slice(&mac);
        f[21] = 2;
        f[22..28].copy_from_slice(&mac);
        f[28..32].copy_from_slice(&target.to_be_bytes());
        f[32..42].copy_from_slice(&asker);
        self.stats.arp_answered += 1;
        Out::Tx(0)
    }

    /// A frame for a client: from the DUT (`via_dut`), or a DR real server's answer
    /// handed over directly.
    fn client(&mut self, f: &mut [u8], now: u64, via_dut: bool) -> Out {
        if self.cfg.workload == Workload::SynFlood
            && f.len() >= TCP_OFF
            && rd32(f, IP_OFF + 12) == FLOOD_VIP
        {
            return self.flood_syn_ack(f, now);
        }
        let sums = if via_dut {
            self.stats.rx_client += 1;
            if f[6..12] != DUT_MAC {
                return self.fail(Fail::SrcMac, f);
            }
            self.sample_sums()
        } else {
            false
        };
        let plen = match self.parse(f, sums) {
            Ok(p) => p,
            Err(k) => return self.fail(k, f),
        };
        let id = match self.token(f) {
            Ok(id) => id,
            Err(true) => return Out::Drop,
            Err(false) => return self.fail(Fail::Token, f),
        };
        let s = self.slots[id as usize];
        let (cip, cport) = client_of(s.task, s.flow);
        let (src, dst) = (rd32(f, IP_OFF + 12), rd32(f, IP_OFF + 16));
        let (sport, dport) = (rd16(f, TCP_OFF), rd16(f, TCP_OFF + 2));
        let vip = (self.cfg.vip + (s.flow % self.cfg.vips as u64) as u32, VPORT);
        let client = (cip, cport);
        let ok = if self.cfg.mode == Mode::MacSwap {
            (src, sport) == client && (dst, dport) == vip
        } else {
            (src, sport) == vip && (dst, dport) == client
        };
        if !ok {
            return self.fail(Fail::ClientAddr, f);
        }
        let flags = f[TCP_OFF + 13];
        let (seq, ack) = (rd32(f, TCP_OFF + 4), rd32(f, TCP_OFF + 8));
        let isn = client_isn(s.task, s.flow);
        let p = self.plen as u32;
        match (s.task, s.stage) {
            (Task::Establish | Task::Conn, Stage::SynSent) => {
                if flags != SYN | ACK || plen != 0 {
                    return self.fail(Fail::Flags, f);
                }
                if ack != isn.wrapping_add(1) {
                    return self.fail(Fail::SeqAck, f);
                }
                let (seq1, ack1) = (isn.wrapping_add(1), seq.wrapping_add(1));
                if s.task == Task::Establish {
                    self.slots[id as usize].stage = Stage::AckSent;
                    self.send_client(id, f, now, seq1, ack1, ACK, false)
                } else {
                    self.slots[id as usize].stage = Stage::DataSent;
                    self.send_client(id, f, now, seq1, ack1, PSH | ACK, true)
                }
            }
            (Task::Data | Task::Conn, Stage::DataSent) => {
                if flags != PSH | ACK || plen != self.plen {
                    return self.fail(Fail::Flags, f);
                }
                let seq_ok = if self.cfg.mode.is_swap() {
                    // Reflected unchanged: our own sequence number comes back.
                    seq == isn.wrapping_add(1)
                } else {
                    ack == isn.wrapping_add(1).wrapping_add(p)
                };
                if !seq_ok {
                    return self.fail(Fail::SeqAck, f);
                }
                let stamp = u64::from_le_bytes(
                    f[PAYLOAD_OFF..PAYLOAD_OFF + STAMP_LEN]
                        .try_into()
                        .expect("8 bytes"),
                );
                if stamp != s.stamp {
                    return self.fail(Fail::Payload, f);
                }
                let rtt = now.wrapping_sub(stamp);
                match self.phase {
                    Phase::Measure => self.hist_measure.record(rtt),
                    Phase::Probe => self.hist_probe.record(rtt),
                    _ => {}
                }
                self.stats.requests += 1;
                if s.task == Task::Conn {
                    self.slots[id as usize].stage = Stage::FinSent;
                    let (seq1, ack1) = (isn.wrapping_add(1).wrapping_add(p), seq.wrapping_add(p));
                    self.send_client(id, f, now, seq1, ack1, FIN | ACK, false)
                } else {
                    self.next(id, f, now)
                }
            }
            (Task::Conn, Stage::FinSent) => {
                if flags != FIN | ACK || plen != 0 {
                    return self.fail(Fail::Flags, f);
                }
                if ack != isn.wrapping_add(2).wrapping_add(p) {
                    return self.fail(Fail::SeqAck, f);
                }
                self.slots[id as usize].stage = Stage::FinalAckSent;
                let (seq1, ack1) = (isn.wrapping_add(2).wrapping_add(p), seq.wrapping_add(1));
                self.send_client(id, f, now, seq1, ack1, ACK, false)
            }
            _ => self.fail(Fail::Flags, f),
        }
    }

    /// A SYN-ACK from the flood service for a spoofed client: checked, counted, and
    /// turned into the next flood SYN. The proxy's SYN-ACK carries TCP options (its MSS
    /// at least) and can be shorter than the configured frame; the I/O loop has grown
    /// the buffer to the frame length, so the IPv4 total length says where it ends.
    fn flood_syn_ack(&mut self, f: &mut [u8], now: u64) -> Out {
        self.stats.rx_client += 1;
        if f[6..12] != DUT_MAC {
            return self.fail(Fail::SrcMac, f);
        }
        if f.len() != self.cfg.frame_len || f.len() < PAYLOAD_OFF {
            return self.fail(Fail::FrameLength, f);
        }
        if f[12] != 0x08 || f[13] != 0x00 {
            return self.fail(Fail::UnexpectedFrame, f);
        }
        if f[IP_OFF] != 0x45 || f[IP_OFF + 9] != 6 || rd16(f, IP_OFF + 6) & 0x3fff != 0 {
            return self.fail(Fail::IpHeader, f);
        }
        let total = rd16(f, IP_OFF + 2) as usize;
        let tcp_len = (f[TCP_OFF + 12] >> 4) as usize * 4;
        // A SYN-ACK carries no data: the TCP header (with options) ends the datagram.
        if tcp_len < 20 || total != 20 + tcp_len || IP_OFF + total > f.len() {
            return self.fail(Fail::IpHeader, f);
        }
        if self.sample_sums() {
            self.stats.checksummed += 1;
            if checksum::fold(checksum::sum(&f[IP_OFF..TCP_OFF])) != 0xffff {
                return self.fail(Fail::IpChecksum, f);
            }
            let sum = checksum::pseudo_header_sum(
                ipv4(rd32(f, IP_OFF + 12)),
                ipv4(rd32(f, IP_OFF + 16)),
                6,
                tcp_len as u16,
            ) + checksum::sum(&f[TCP_OFF..TCP_OFF + tcp_len]);
            if checksum::fold(sum) != 0xffff {
                return self.fail(Fail::TcpChecksum, f);
            }
        }
        if f[TCP_OFF + 13] != SYN | ACK {
            return self.fail(Fail::Flags, f);
        }
        // The token and generation come back in the acknowledgement number.
        let acked = rd32(f, TCP_OFF + 8).wrapping_sub(1);
        let (id, gen) = (acked as u16, (acked >> 16) as u16);
        let Some(&s) = self.slots.get(id as usize) else {
            return self.fail(Fail::Token, f);
        };
        if s.task != Task::Flood || s.gen != gen {
            // A SYN-ACK for a token already declared lost (or the ack was mangled, which
            // the address check below cannot tell apart): counted stale, as elsewhere.
            self.stats.stale += 1;
            return Out::Drop;
        }
        let dst = (rd32(f, IP_OFF + 16), rd16(f, TCP_OFF + 2));
        if rd16(f, TCP_OFF) != VPORT || dst != flood_source(s.flow) {
            return self.fail(Fail::ClientAddr, f);
        }
        let cookie_like = tcp_len >= 24 && f[PAYLOAD_OFF] == 2 && f[PAYLOAD_OFF + 1] == 4;
        let from_server = tcp_len == 20
            && s.rs != 0
            && rd32(f, TCP_OFF + 4) == server_isn((s.local >> 16) as u32, s.local as u16);
        if (self.cfg.synproxy && !cookie_like) || (!self.cfg.synproxy && !from_server) {
            return self.fail(Fail::Synproxy, f);
        }
        self.stats.flood_syn_acks += 1;
        if self.phase == Phase::Measure {
            self.hist_measure.record(now.wrapping_sub(s.sent));
        }
        self.next(id, f, now)
    }

    /// A frame the DUT forwarded to real server `k`.
    fn rs(&mut self, f: &mut [u8], now: u64, k: u8) -> Out {
        self.stats.rx_rs += 1;
        if self.cfg.mode.is_swap() {
            return self.fail(Fail::UnexpectedFrame, f);
        }
        if f[6..12] != DUT_MAC {
            return self.fail(Fail::SrcMac, f);
        }
        let sums = self.sample_sums();
        let plen = match self.parse(f, sums) {
            Ok(p) => p,
            Err(kind) => return self.fail(kind, f),
        };
        let id = match self.token(f) {
            Ok(id) => id,
            Err(true) => return Out::Drop,
            Err(false) => return self.fail(Fail::Token, f),
        };
        let s = self.slots[id as usize];
        if s.task == Task::Flood && self.cfg.synproxy {
            return self.fail(Fail::Synproxy, f);
        }
        let mode = self.cfg.mode;
        let (src, dst) = (rd32(f, IP_OFF + 12), rd32(f, IP_OFF + 16));
        let (sport, dport) = (rd16(f, TCP_OFF), rd16(f, TCP_OFF + 2));
        let want_dst = match mode {
            Mode::Dr => (self.cfg.vip + (s.flow % self.cfg.vips as u64) as u32, VPORT),
            _ => (rs_ip(k), RS_NAT_PORT),
        };
        if (dst, dport) != want_dst {
            return self.fail(Fail::RsDst, f);
        }
        let local = (src as u64) << 16 | sport as u64;
        if mode == Mode::FullNat {
            let l = src.wrapping_sub(LIP_BASE);
            if l >= self.cfg.lips as u32 || sport < LOCAL_PORT_MIN {
                return self.fail(Fail::RsSrc, f);
            }
        } else if (src, sport) != client_of(s.task, s.flow) {
            return self.fail(Fail::RsSrc, f);
        }
        let flags = f[TCP_OFF + 13];
        let (seq, ack) = (rd32(f, TCP_OFF + 4), rd32(f, TCP_OFF + 8));
        // The same real server (and FullNAT local address/port) for the whole flow.
        let first = s.stage == Stage::SynSent;
        let fl = s.flow as usize;
        let consistent = match s.task {
            Task::Establish | Task::Conn | Task::Flood if first => {
                self.slots[id as usize].rs = k + 1;
                self.slots[id as usize].local = local;
                if s.task == Task::Establish {
                    self.flow_rs[fl] = k + 1;
                    if mode == Mode::FullNat {
                        self.flow_local[fl] = local;
                    }
                }
                true
            }
            Task::Establish | Task::Conn | Task::Flood => {
                s.rs == k + 1 && (mode != Mode::FullNat || s.local == local)
            }
            _ => {
                self.flow_rs[fl] == k + 1 && (mode != Mode::FullNat || self.flow_local[fl] == local)
            }
        };
        if !consistent {
            return self.fail(Fail::RsInconsistent, f);
        }
        let isn = if s.task == Task::Flood {
            flood_isn(id, s.gen)
        } else {
            client_isn(s.task, s.flow)
        };
        let p = self.plen as u32;
        let s_isn = server_isn(src, sport);
        let (rseq, rack, rflags, rplen) = match (s.task, s.stage) {
            (Task::Establish | Task::Conn | Task::Flood, Stage::SynSent) => {
                if flags != SYN || plen != 0 {
                    return self.fail(Fail::Flags, f);
                }
                if seq != isn {
                    return self.fail(Fail::SeqAck, f);
                }
                if s.task == Task::Flood {
                    self.stats.flood_syns_at_rs += 1;
                }
                (s_isn, seq.wrapping_add(1), SYN | ACK, 0)
            }
            (Task::Establish, Stage::AckSent) => {
                if flags != ACK || plen != 0 {
                    return self.fail(Fail::Flags, f);
                }
                if seq != isn.wrapping_add(1) || ack != s_isn.wrapping_add(1) {
                    return self.fail(Fail::SeqAck, f);
                }
                self.stats.established += 1;
                return self.next(id, f, now);
            }
            (Task::Data | Task::Conn, Stage::DataSent) => {
                if flags != PSH | ACK || plen != self.plen {
                    return self.fail(Fail::Flags, f);
                }
                if seq != isn.wrapping_add(1)
                    || (s.task == Task::Conn && ack != s_isn.wrapping_add(1))
                {
                    return self.fail(Fail::SeqAck, f);
                }
                (ack, seq.wrapping_add(p), PSH | ACK, self.plen)
            }
            (Task::Conn, Stage::FinSent) => {
                if flags != FIN | ACK || plen != 0 {
                    return self.fail(Fail::Flags, f);
                }
                if seq != isn.wrapping_add(1).wrapping_add(p) {
                    return self.fail(Fail::SeqAck, f);
                }
                (ack, seq.wrapping_add(1), FIN | ACK, 0)
            }
            (Task::Conn, Stage::FinalAckSent) => {
                if flags != ACK || plen != 0 {
                    return self.fail(Fail::Flags, f);
                }
                if seq != isn.wrapping_add(2).wrapping_add(p)
                    || ack != s_isn.wrapping_add(2).wrapping_add(p)
                {
                    return self.fail(Fail::SeqAck, f);
                }
                self.stats.connections += 1;
                return self.next(id, f, now);
            }
            _ => return self.fail(Fail::Flags, f),
        };
        self.slots[id as usize].sent = now;
        let gen = s.gen;
        if mode == Mode::Dr {
            // The real server answers the client directly, from the VIP it holds on lo:
            // the answer never crosses the DUT, so hand it to the client logic now.
            let h = Hdr {
                src_mac: rs_mac(k),
                dst_mac: CLIENT_MAC,
                src: dst,
                sport: dport,
                dst: src,
                dport: sport,
                seq: rseq,
                ack: rack,
                flags: rflags,
                token: id,
                gen,
            };
            write_headers(f, &h, rplen);
            return self.client(f, now, false);
        }
        let h = Hdr {
            src_mac: rs_mac(k),
            dst_mac: DUT_MAC,
            src: dst,
            sport: dport,
            dst: src,
            dport: sport,
            seq: rseq,
            ack: rack,
            flags: rflags,
            token: id,
            gen,
        };
        write_headers(f, &h, rplen);
        Out::Tx(self.queue_for(dst, src, dport, sport))
    }
}

#[cfg(test)]
mod tests {
    //! The engine against software stand-ins for the DUT: a NAT, FullNAT and DR load
    //! balancer written naively here (full checksum recompute, a hash map of
    //! sessions), and testpmd's 5tswap/macswap. Then the same with deliberate bugs,
    //! each of which must be caught.
    use super::*;
    use std::collections::HashMap;

    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Bug {
        None,
        /// Forget to fix the TCP checksum after rewriting.
        TcpChecksum,
        /// Send a reply to the wrong client port.
        WrongClientPort,
        /// Round-robin every packet instead of keeping the session's real server.
        NoStickiness,
    }

    struct FakeLb {
        mode: Mode,
        rs: u8,
        next_rs: u8,
        next_lport: u16,
        bug: Bug,
        /// SYNs to [`FLOOD_VIP`] are answered with a cookie SYN-ACK, as Sluice's proxy
        /// does: no session, options, a shorter frame.
        synproxy: bool,
        /// client (ip, port) -> (rs index, lip, lport)
        fwd: HashMap<(u32, u16), (u8, u32, u16)>,
        /// (rs index, lip or client ip, port) -> (client ip, port, VIP)
        rev: HashMap<(u8, u32, u16), (u32, u16, u32)>,
    }

    /// Both checksums, over the TCP segment the IPv4 total length covers (options too).
    fn fix_sums(f: &mut [u8]) {
        f[24] = 0;
        f[25] = 0;
        let c = checksum::finish(checksum::sum(&f[14..34]));
        f[24..26].copy_from_slice(&c.to_be_bytes());
        let tcp_len = rd16(f, 16) as usize - 20;
        f[50] = 0;
        f[51] = 0;
        let sum =
            checksum::pseudo_header_sum(ipv4(rd32(f, 26)), ipv4(rd32(f, 30)), 6, tcp_len as u16)
                + checksum::sum(&f[34..34 + tcp_len]);
        let c = checksum::finish(sum);
        f[50..52].copy_from_slice(&c.to_be_bytes());
    }

    fn set_addr(f: &mut [u8], src: Option<(u32, u16)>, dst: Option<(u32, u16)>) {
        if let Some((a, p)) = src {
            f[26..30].copy_from_slice(&a.to_be_bytes());
            f[34..36].copy_from_slice(&p.to_be_bytes());
        }
        if let Some((a, p)) = dst {
            f[30..34].copy_from_slice(&a.to_be_bytes());
            f[36..38].copy_from_slice(&p.to_be_bytes());
        }
    }

    impl FakeLb {
        fn new(mode: Mode, rs: u8, bug: Bug) -> FakeLb {
            FakeLb {
                mode,
                rs,
                next_rs: 0,
                next_lport: 1024,
                bug,
                synproxy: false,
                fwd: HashMap::new(),
                rev: HashMap::new(),
            }
        }

        /// Processes one frame from the generator; returns whether it is sent back.
        fn process(&mut self, f: &mut Vec<u8>) -> bool {
            if f[12..14] == [0x08, 0x06] {
                return false; // ARP: the fake knows every MAC already.
            }
            match self.mode {
                Mode::Swap5t => {
                    let (s, d) = ((rd32(f, 26), rd16(f, 34)), (rd32(f, 30), rd16(f, 36)));
                    set_addr(f, Some(d), Some(s));
                    let (a, b) = (f[0..6].to_vec(), f[6..12].to_vec());
                    f[0..6].copy_from_slice(&b);
                    f[6..12].copy_from_slice(&a);
                    return true;
                }
                Mode::MacSwap => {
                    let (a, b) = (f[0..6].to_vec(), f[6..12].to_vec());
                    f[0..6].copy_from_slice(&b);
                    f[6..12].copy_from_slice(&a);
                    return true;
                }
                _ => {}
            }
            let (src, sport, dst, dport) = (rd32(f, 26), rd16(f, 34), rd32(f, 30), rd16(f, 36));
            if self.synproxy && dst == FLOOD_VIP && f[47] == SYN {
                // The cookie SYN-ACK: fresh headers (identification and urgent pointer
                // zero), an MSS option, 58 bytes.
                let isn = rd32(f, 38);
                let h = Hdr {
                    src_mac: DUT_MAC,
                    dst_mac: CLIENT_MAC,
                    src: dst,
                    sport: dport,
                    dst: src,
                    dport: sport,
                    seq: mix(isn as u64 ^ src as u64),
                    ack: isn.wrapping_add(1),
                    flags: SYN | ACK,
                    token: 0,
                    gen: 0,
                };
                write_headers(f, &h, 0);
                f[TCP_OFF + 12] = 6 << 4;
                f[PAYLOAD_OFF..PAYLOAD_OFF + 4].copy_from_slice(&[2, 4, 0x05, 0xb4]);
                f[16..18].copy_from_slice(&44u16.to_be_bytes());
                fix_sums(f);
                f.truncate(58);
                return true;
            }
            if (dst == VIP || dst == FLOOD_VIP) && dport == VPORT {
                let key = (src, sport);
                let entry = match self.fwd.get(&key) {
                    Some(e) if self.bug != Bug::NoStickiness => *e,
                    _ => {
                        let k = self.next_rs;
                        self.next_rs = (self.next_rs + 1) % self.rs;
                        let (lip_, lport) = if self.mode == Mode::FullNat {
                            self.next_lport = self.next_lport.wrapping_add(1).max(1024);
                            (lip(self.next_lport % 3), self.next_lport)
                        } else {
                            (src, sport)
                        };
                        self.fwd.insert(key, (k, lip_, lport));
                        self.rev.insert((k, lip_, lport), (key.0, key.1, dst));
                        (k, lip_, lport)
                    }
                };
                let (k, l, lp) = entry;
                f[0..6].copy_from_slice(&rs_mac(k));
                f[6..12].copy_from_slice(&DUT_MAC);
                match self.mode {
                    Mode::Dr => {}
                    Mode::Nat => set_addr(f, None, Some((rs_ip(k), RS_NAT_PORT))),
                    _ => set_addr(f, Some((l, lp)), Some((rs_ip(k), RS_NAT_PORT))),
                }
            } else {
                let k = (src - RS_BASE) as u8;
                let Some(&(cip, cport, vip)) = self.rev.get(&(k, dst, dport)) else {
                    return false;
                };
                let cport = if self.bug == Bug::WrongClientPort {
                    cport ^ 1
                } else {
                    cport
                };
                f[0..6].copy_from_slice(&CLIENT_MAC);
                f[6..12].copy_from_slice(&DUT_MAC);
                set_addr(f, Some((vip, VPORT)), Some((cip, cport)));
            }
            if self.bug != Bug::TcpChecksum {
                fix_sums(f);
            } else {
                // Only the IP header checksum is fixed.
                f[24] = 0;
                f[25] = 0;
                let c = checksum::finish(checksum::sum(&f[14..34]));
                f[24..26].copy_from_slice(&c.to_be_bytes());
            }
            true
        }
    }

    fn engine(mode: Mode, workload: Workload, sessions: u32, window: usize) -> Engine {
        Engine::new(EngineConfig {
            mode,
            workload,
            sessions,
            window,
            frame_len: 64,
            validate: Validate::Full,
            real_servers: 4,
            lips: 3,
            new_percent: 10,
            order: FlowOrder::Creation,
            vip: VIP,
            vips: 1,
            loss_timeout: 1_000_000,
            rss: None,
            synproxy: false,
        })
    }

    /// Runs the closed loop: launches tokens, passes every packet through the fake
    /// DUT and back into the engine, for `rounds` packet handlings.
    fn pump(e: &mut Engine, lb: &mut FakeLb, rounds: usize, now: &mut u64) {
        let mut queue: Vec<Vec<u8>> = Vec::new();
        for _ in 0..rounds {
            while e.deficit() > 0 {
                let mut f = vec![0u8; 64];
                match e.launch(&mut f, *now) {
                    Some(Out::Tx(_)) => queue.push(f),
                    _ => break,
                }
            }
            let Some(mut f) = queue.pop() else { break };
            *now += 10;
            if !lb.process(&mut f) {
                continue;
            }
            // As the I/O loop does for a flood: a short SYN-ACK's buffer grows back.
            if e.cfg.workload == Workload::SynFlood && f.len() < 64 {
                f.resize(64, 0);
            }
            if e.handle(&mut f, *now) != Out::Drop {
                queue.push(f);
            }
        }
    }

    fn establish(e: &mut Engine, lb: &mut FakeLb, now: &mut u64) {
        e.set_phase(Phase::Establish);
        pump(e, lb, 1_000_000, now);
    }

    fn run(mode: Mode, workload: Workload, bug: Bug) -> Engine {
        let mut e = engine(mode, workload, 200, 16);
        let mut lb = FakeLb::new(mode, 4, bug);
        let mut now = 1;
        if !mode.is_swap() {
            establish(&mut e, &mut lb, &mut now);
            if bug == Bug::None {
                assert!(e.establish_done(), "stats {:?}", e.stats);
                assert_eq!(e.stats.established, 200);
            }
        }
        e.set_phase(Phase::Measure);
        pump(&mut e, &mut lb, 20_000, &mut now);
        e
    }

    #[test]
    fn every_mode_and_workload_runs_clean() {
        for mode in [Mode::Nat, Mode::FullNat, Mode::Dr] {
            for w in [
                Workload::Established,
                Workload::Connections,
                Workload::Mixed,
            ] {
                let e = run(mode, w, Bug::None);
                assert_eq!(e.failures.total(), 0, "{mode:?} {w:?}");
                assert!(e.stats.requests > 1000, "{mode:?} {w:?}: {:?}", e.stats);
                assert_eq!(e.stats.stale, 0);
                if w != Workload::Established {
                    assert!(e.stats.connections > 10, "{mode:?} {w:?}: {:?}", e.stats);
                }
                assert!(e.hist_measure.count() > 1000);
            }
        }
        for mode in [Mode::Swap5t, Mode::MacSwap] {
            let e = run(mode, Workload::Established, Bug::None);
            assert_eq!(e.failures.total(), 0, "{mode:?}");
            assert!(e.stats.requests > 10_000);
        }
    }

    #[test]
    fn a_scrambled_round_visits_every_flow_once_and_neighbours_apart() {
        for flows in [1u32, 2, 3, 200, 1000, 1024, 999_983, 1_000_000] {
            let mut seen = vec![false; flows as usize];
            let mut adjacent = 0;
            let mut last = None;
            for n in 0..flows {
                let f = FlowOrder::Scrambled.flow(n, flows);
                assert!(
                    !std::mem::replace(&mut seen[f as usize], true),
                    "{flows}: {f} twice"
                );
                if last.is_some_and(|l: u32| l.abs_diff(f) == 1) {
                    adjacent += 1;
                }
                last = Some(f);
            }
            if flows > 3 {
                assert_eq!(adjacent, 0, "{flows} flows");
            }
            assert_eq!(FlowOrder::Creation.flow(flows - 1, flows), flows - 1);
        }
        // Established traffic in that order validates as in creation order.
        let mut e = engine(Mode::Nat, Workload::Established, 200, 16);
        e.cfg.order = FlowOrder::Scrambled;
        let mut lb = FakeLb::new(Mode::Nat, 4, Bug::None);
        let mut now = 1;
        establish(&mut e, &mut lb, &mut now);
        e.set_phase(Phase::Measure);
        pump(&mut e, &mut lb, 20_000, &mut now);
        assert_eq!(e.failures.total(), 0);
        assert!(e.stats.requests > 1000, "{:?}", e.stats);
    }

    #[test]
    fn mixed_opens_the_configured_share_of_new_connections() {
        let e = run(Mode::Nat, Workload::Mixed, Bug::None);
        let share = e.stats.connections as f64 / e.stats.requests as f64;
        assert!((share - 0.10).abs() < 0.02, "{share} {:?}", e.stats);
    }

    #[test]
    fn bugs_in_the_dut_are_caught() {
        let e = run(Mode::Nat, Workload::Established, Bug::TcpChecksum);
        assert!(e.failures.counts[Fail::TcpChecksum as usize] > 0);
        let e = run(Mode::FullNat, Workload::Mixed, Bug::WrongClientPort);
        assert!(e.failures.counts[Fail::ClientAddr as usize] > 0);
        let e = run(Mode::Nat, Workload::Established, Bug::NoStickiness);
        assert!(e.failures.counts[Fail::RsInconsistent as usize] > 0);
    }

    #[test]
    fn a_dut_in_another_mode_is_caught() {
        // The generator expects NAT; the DUT does DR: the real server sees the VIP.
        let mut e = engine(Mode::Nat, Workload::Established, 10, 4);
        let mut lb = FakeLb::new(Mode::Dr, 4, Bug::None);
        let mut now = 1;
        e.set_phase(Phase::Establish);
        pump(&mut e, &mut lb, 100, &mut now);
        assert!(e.failures.counts[Fail::RsDst as usize] > 0);
    }

    #[test]
    fn lost_tokens_are_replaced_and_their_flows_retried() {
        let mut e = engine(Mode::Nat, Workload::Established, 50, 8);
        let mut lb = FakeLb::new(Mode::Nat, 4, Bug::None);
        let mut now = 1;
        e.set_phase(Phase::Establish);
        // Drop the first 8 SYNs on the floor.
        for _ in 0..8 {
            let mut f = vec![0u8; 64];
            assert!(e.launch(&mut f, now).is_some());
        }
        assert_eq!(e.deficit(), 0);
        now += 2_000_000;
        e.expire(now);
        assert_eq!(e.stats.lost, 8);
        pump(&mut e, &mut lb, 100_000, &mut now);
        assert!(e.establish_done());
        assert_eq!(e.stats.established, 50);
        assert_eq!(e.failures.total(), 0);
    }

    fn flood(expect_proxy: bool, dut_proxies: bool) -> (Engine, FakeLb) {
        let mut e = engine(Mode::Nat, Workload::SynFlood, 100, 16);
        e.cfg.synproxy = expect_proxy;
        let mut lb = FakeLb::new(Mode::Nat, 4, Bug::None);
        lb.synproxy = dut_proxies;
        let mut now = 1;
        establish(&mut e, &mut lb, &mut now);
        assert!(e.establish_done(), "stats {:?}", e.stats);
        e.set_phase(Phase::Measure);
        pump(&mut e, &mut lb, 20_000, &mut now);
        (e, lb)
    }

    #[test]
    fn a_syn_flood_through_the_proxy_is_answered_without_sessions() {
        let (e, lb) = flood(true, true);
        assert_eq!(e.failures.total(), 0, "{:?}", e.stats);
        assert!(e.stats.flood_syn_acks > 10_000, "{:?}", e.stats);
        // Every SYN-ACK answered a SYN; at most a window's worth are still in flight.
        assert!(e.stats.flood_syns >= e.stats.flood_syn_acks);
        assert!(e.stats.flood_syns - e.stats.flood_syn_acks <= 16);
        assert_eq!(e.stats.flood_syns_at_rs, 0);
        // Only the 100 established flows hold sessions in the stand-in.
        assert_eq!(lb.fwd.len(), 100);
        assert_eq!(e.stats.requests, 0);
    }

    #[test]
    fn a_syn_flood_without_the_proxy_reaches_the_real_servers() {
        let (e, lb) = flood(false, false);
        assert_eq!(e.failures.total(), 0, "{:?}", e.stats);
        assert!(e.stats.flood_syn_acks > 5_000, "{:?}", e.stats);
        assert!(e.stats.flood_syns_at_rs >= e.stats.flood_syn_acks);
        // Each flood SYN opened a session of its own in the stand-in.
        assert_eq!(lb.fwd.len() as u64, 100 + e.stats.flood_syns_at_rs);
    }

    #[test]
    fn a_dut_that_proxies_or_not_against_the_expectation_is_caught() {
        let (e, _) = flood(true, false);
        assert!(
            e.failures.counts[Fail::Synproxy as usize] > 0,
            "{:?}",
            e.stats
        );
        let (e, _) = flood(false, true);
        assert!(
            e.failures.counts[Fail::Synproxy as usize] > 0,
            "{:?}",
            e.stats
        );
        assert_eq!(e.stats.flood_syn_acks, 0);
    }

    #[test]
    fn flood_sources_do_not_repeat_and_stay_in_their_prefix() {
        let mut seen = std::collections::HashSet::new();
        for n in 0..1_000_000u64 {
            let (a, p) = flood_source(n);
            assert_eq!(a >> 15, FLOOD_SRC_BASE >> 15, "{n}");
            assert!(p >= 1024, "{n}");
            assert!(seen.insert((a, p)), "source of SYN {n} repeats");
        }
        // Spread over the prefix, not one address after another.
        let hosts: std::collections::HashSet<u32> = seen.iter().map(|s| s.0).collect();
        assert!(hosts.len() > 30_000, "{}", hosts.len());
    }

    #[test]
    fn arp_requests_for_real_servers_are_answered() {
        let mut e = engine(Mode::Nat, Workload::Established, 10, 4);
        let mut f = vec![0u8; 60];
        // The DUT asks who has 198.18.2.2.
        f[0..6].fill(0xff);
        f[6..12].copy_from_slice(&DUT_MAC);
        f[12..14].copy_from_slice(&[0x08, 0x06]);
        f[14..22].copy_from_slice(&[0, 1, 0x08, 0, 6, 4, 0, 1]);
        f[22..28].copy_from_slice(&DUT_MAC);
        f[28..32].copy_from_slice(&DUT_IP.to_be_bytes());
        f[38..42].copy_from_slice(&rs_ip(1).to_be_bytes());
        assert_eq!(e.handle(&mut f, 1), Out::Tx(0));
        assert_eq!(f[0..6], DUT_MAC);
        assert_eq!(f[6..12], rs_mac(1));
        assert_eq!(f[21], 2);
        assert_eq!(f[22..28], rs_mac(1));
        assert_eq!(rd32(&f, 28), rs_ip(1));
        assert_eq!(f[32..38], DUT_MAC);
        assert_eq!(rd32(&f, 38), DUT_IP);
        // Not one of ours: ignored.
        f[38..42].copy_from_slice(&rs_ip(9).to_be_bytes());
        f[21] = 1;
        assert_eq!(e.handle(&mut f, 1), Out::Drop);
    }
}
