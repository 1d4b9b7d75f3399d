//! The SYN proxy: Sluice answers a client's SYN itself with a SYN-ACK whose sequence
//! number is a cookie (in the style of Linux syncookies), keeps no state for it, and
//! opens the connection to the real server only once the client's ACK proves that the
//! client's address is real. From then on the two halves of the connection disagree
//! on the server's initial sequence number (the client got the cookie, the server
//! chose its own) and on the server's timestamp clock, so every segment of the
//! session is translated.
//!
//! Pure functions on frame bytes, as the rest of [`crate::forward`]: in place, no
//! allocation, never a panic; a frame they cannot use is an error and stays as it was.
//!
//! # The cookie
//!
//! `cookie = hash(secret, client, client port, VIP, port, client ISN, counter, MSS
//! index)[31:5] |
//! (counter mod 4) << 3 | MSS index`, where
//! - `hash` is SipHash-2-4 under a 128-bit secret drawn once per process from the
//!   kernel ([`SipKey::process`]): every worker checks every other's cookies, and
//!   nobody outside can compute one;
//! - `counter` is Sluice's timestamp clock (wall-clock milliseconds, the same on every
//!   worker; [`crate::forward::timestamps::Clock`]) in slots of 2^16 ms (65.5 s): a
//!   cookie is accepted in its own slot and the next one (65.5 to 131 s), is
//!   *expired* two or three slots later, and is invalid otherwise. The two counter bits
//!   carried in the cookie pick the slot, so checking one costs one hash;
//! - the MSS index picks the largest entry of [`MSS_TABLE`] not above the client's MSS
//!   (536, RFC 9293's default, when it sent none or less).
//!
//! 27 bits of keyed hash remain: a forged ACK passes with a chance of 2^-27 per try
//! per tuple, against 2^-24 for Linux's cookies.
//!
//! Window scale, SACK-permitted and ECN cannot fit in 32 bits beside them; as Linux
//! (`cookie_init_timestamp`) does, they travel in the low 6 bits of the TSval of the
//! SYN-ACK, which the client echoes in the TSecr of its ACK: bits 0-3 the client's
//! window scale (15: none), bit 4 SACK-permitted, bit 5 ECN (never set: Sluice does
//! not negotiate ECN for the server). A client that sends no timestamps gets a SYN-ACK
//! with the MSS only, so neither side scales windows or SACKs, as with Linux.
//!
//! # Decisions
//!
//! | segment | what Sluice does |
//! |---|---|
//! | client SYN | [`answer_syn`]: rewritten in place into the cookie SYN-ACK, out the port it came from; no state |
//! | client ACK without a session | [`check_ack`]: `ack - 1` must be a cookie of this tuple and `seq - 1` (the client ISN) within its slot |
//! | valid ACK | [`write_server_syn`]: the same frame becomes the SYN to the real server: client ISN, MSS from the cookie, the client's window scale, SACK-permitted and TSval. An ACK with data or a FIN waits for the server's handshake (the data plane holds it) and a copy of it becomes the SYN; only when there is no room to hold it does the frame itself become the SYN, its payload dropped (the client sends it again) |
//! | server SYN-ACK | [`read_server_synack`] learns the server's ISN, window scale and TSval; [`write_server_ack`] turns the frame into the ACK that completes the server's handshake |
//! | server -> client | [`to_client`]: `seq + delta`, window rescaled to the scale the client was promised; TSval moved by the timestamp delta (with [`crate::forward::timestamps::shift`]) |
//! | client -> server | [`to_server`]: `ack - delta`, every SACK edge `- delta`; TSecr moved back by the timestamp delta |
//!
//! `delta = cookie - server ISN`; the timestamp delta is `cookie TSval - server TSval`.
//! Both are fixed for the session's life. Sluice advertises window scale
//! [`PROXY_WINDOW_SCALE`] (Linux's default for its default buffers), so with a Linux
//! server the window needs no change; another scale costs a shift per segment, and a
//! window that does not fit 16 bits after it is clamped (a smaller window than the
//! server offered, never a larger one).
//!
//! Every checksum is updated incrementally (RFC 1624) where a segment keeps its size;
//! the segments Sluice writes anew (SYN-ACK, SYN, ACK) get their checksums computed.
use crate::flow::parse::Parsed;
use crate::flow::FlowKey4;
use crate::model::siphash::sip_round;
use crate::model::DropReason;
use crate::wire::ethernet::{self, MacAddr};
use crate::wire::tcp::{self, Options, TcpFlags, TcpOption};
use crate::wire::{ipv4, read_u32, write_u32, IpProtocol};
use std::net::Ipv4Addr;

/// MSS values a cookie can carry (3 bits): the common ones on Ethernet paths, IPv4
/// with and without timestamps, tunnels and PPPoE.
pub const MSS_TABLE: [u16; 8] = [536, 1200, 1300, 1360, 1400, 1440, 1452, 1460];

/// The window scale Sluice offers the client in the cookie SYN-ACK.
pub const PROXY_WINDOW_SCALE: u8 = 7;

/// Bits of the timestamp clock per counter slot (2^16 ms = 65.5 s).
pub const COUNTER_SHIFT: u32 = 16;

/// The low TSval bits that carry the client's options.
const TS_OPTION_BITS: u32 = 6;
const TS_OPTION_MASK: u32 = (1 << TS_OPTION_BITS) - 1;
const TS_NO_WSCALE: u32 = 0xf;
const TS_SACK: u32 = 1 << 4;

/// Window Sluice announces in the cookie SYN-ACK (unscaled, as in every SYN).
const SYNACK_WINDOW: u16 = 65535;

/// A 128-bit SipHash-2-4 key drawn from the kernel: the secret of the SYN proxy's
/// cookies, and of the health probes' sequence numbers (each with a key of its own).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SipKey {
    k0: u64,
    k1: u64,
}

impl SipKey {
    pub const fn new(k0: u64, k1: u64) -> SipKey {
        SipKey { k0, k1 }
    }

    /// A key from the kernel's randomness (`/dev/urandom`), or, should that fail,
    /// from the standard library's randomly seeded hasher.
    pub fn random() -> SipKey {
        use std::io::Read;
        let mut bytes = [0u8; 16];
        if std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut bytes))
            .is_ok()
        {
            let (a, b) = bytes.split_at(8);
            return SipKey::new(
                u64::from_ne_bytes(a.try_into().unwrap_or_default()),
                u64::from_ne_bytes(b.try_into().unwrap_or_default()),
            );
        }
        use std::hash::BuildHasher;
        let state = std::collections::hash_map::RandomState::new();
        SipKey::new(state.hash_one(1u64), state.hash_one(2u64))
    }

    /// The key every worker of this process uses, drawn at first use (at start).
    pub fn process() -> &'static SipKey {
        static KEY: std::sync::OnceLock<SipKey> = std::sync::OnceLock::new();
        KEY.get_or_init(SipKey::random)
    }

    /// SipHash-2-4 of the words' little-endian bytes (`8 * N` bytes). Other secrets
    /// that must be unguessable from outside use it too, under keys of their own (the
    /// health probes' initial sequence numbers, `crate::health`).
    pub fn hash<const N: usize>(&self, words: [u64; N]) -> u64 {
        let mut v = [
            self.k0 ^ 0x736f_6d65_7073_6575,
            self.k1 ^ 0x646f_7261_6e64_6f6d,
            self.k0 ^ 0x6c79_6765_6e65_7261,
            self.k1 ^ 0x7465_6462_7974_6573,
        ];
        let last = ((8 * N) as u64 & 0xff) << 56;
        for m in words.into_iter().chain(std::iter::once(last)) {
            v[3] ^= m;
            sip_round(&mut v);
            sip_round(&mut v);
            v[0] ^= m;
        }
        v[2] ^= 0xff;
        for _ in 0..4 {
            sip_round(&mut v);
        }
        v[0] ^ v[1] ^ v[2] ^ v[3]
    }

    /// The cookie for the client's SYN on `key` (client -> VIP) with ISN `isn`, in
    /// counter slot `counter`, carrying MSS index `mss_index` (< 8).
    pub fn cookie(&self, key: &FlowKey4, isn: u32, counter: u32, mss_index: usize) -> u32 {
        let words = [
            (u64::from(key.src) << 32) | u64::from(key.dst),
            (u64::from(key.sport) << 48) | (u64::from(key.dport) << 32) | u64::from(isn),
            (u64::from(counter) << 8) | (mss_index as u64 & 7),
        ];
        let hash = self.hash(words) as u32;
        (hash & !0x1f) | ((counter & 3) << 3) | (mss_index as u32 & 7)
    }

    /// What `cookie` is for the SYN with ISN `isn` on `key`, at counter `now_counter`.
    pub fn check(&self, key: &FlowKey4, isn: u32, cookie: u32, now_counter: u32) -> CookieCheck {
        let age = now_counter.wrapping_sub(cookie >> 3) & 3;
        // The clock is 32 bits of milliseconds, so the counter has 16 and wraps there.
        let counter = now_counter.wrapping_sub(age) & (u32::MAX >> COUNTER_SHIFT);
        let mss_index = (cookie & 7) as usize;
        if self.cookie(key, isn, counter, mss_index) != cookie {
            return CookieCheck::Invalid;
        }
        if age > 1 {
            return CookieCheck::Expired;
        }
        CookieCheck::Valid {
            mss: MSS_TABLE[mss_index],
        }
    }
}

/// The counter slot of timestamp clock reading `now_ms`.
#[inline]
pub fn counter(now_ms: u32) -> u32 {
    now_ms >> COUNTER_SHIFT
}

/// What a cookie check found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CookieCheck {
    /// Sluice made it in this slot or the previous one, for this tuple and ISN.
    Valid { mss: u16 },
    /// Sluice made it two or three slots ago.
    Expired,
    /// Not a cookie of this tuple and ISN.
    Invalid,
}

/// The options of a client's SYN that the connection to the real server must carry.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SynOptions {
    pub mss: Option<u16>,
    /// Window scale shift (capped at 14, RFC 7323).
    pub wscale: Option<u8>,
    pub sack: bool,
    /// The TSval, when the segment carries timestamps.
    pub tsval: Option<u32>,
    /// The TSecr, when the segment carries timestamps.
    pub tsecr: Option<u32>,
}

impl SynOptions {
    /// The options of a TCP options area. A malformed area yields what came before
    /// the damage.
    pub fn parse(options: &[u8]) -> SynOptions {
        let mut found = SynOptions::default();
        for option in Options::new(options) {
            match option {
                Ok(TcpOption::MaxSegmentSize(mss)) => found.mss = Some(mss),
                Ok(TcpOption::WindowScale(shift)) => found.wscale = Some(shift.min(14)),
                Ok(TcpOption::SackPermitted) => found.sack = true,
                Ok(TcpOption::Timestamps { tsval, tsecr }) => {
                    found.tsval = Some(tsval);
                    found.tsecr = Some(tsecr);
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        found
    }
}

/// The index of the largest [`MSS_TABLE`] entry not above `mss` (0 for none or less).
pub fn mss_index(mss: Option<u16>) -> usize {
    let mss = mss.unwrap_or(MSS_TABLE[0]);
    MSS_TABLE.iter().rposition(|&m| m <= mss).unwrap_or(0)
}

/// The TSval of the cookie SYN-ACK: the clock with its low 6 bits replaced by the
/// client's window scale and SACK-permitted, never ahead of the clock.
pub fn cookie_tsval(now_ms: u32, wscale: Option<u8>, sack: bool) -> u32 {
    let mut bits = wscale.map_or(TS_NO_WSCALE, |s| u32::from(s.min(14)));
    if sack {
        bits |= TS_SACK;
    }
    let ts = (now_ms & !TS_OPTION_MASK) | bits;
    if ts > now_ms {
        ts.wrapping_sub(1 << TS_OPTION_BITS)
    } else {
        ts
    }
}

/// The window scale and SACK-permitted a cookie TSval (the client's TSecr) carries.
pub fn decode_tsval(tsecr: u32) -> (Option<u8>, bool) {
    let shift = tsecr & 0xf;
    let wscale = (shift <= 14).then_some(shift as u8);
    (wscale, tsecr & TS_SACK != 0)
}

/// The TCP segment's bounds and header fields, re-checked against the frame.
fn segment_of(frame: &[u8], parsed: &Parsed) -> Result<(usize, usize, usize), DropReason> {
    let s = super::tcp_segment(frame, parsed)?;
    Ok((s.l4, s.ip_end, s.header_len))
}

/// Writes, at `at`, the options of a handshake segment in Linux's order: MSS;
/// SACK-permitted and timestamps (NOP, NOP, timestamps without SACK; SACK-permitted
/// alone without timestamps); NOP and window scale. Returns the length (a multiple
/// of 4).
fn write_handshake_options(
    buf: &mut [u8],
    mss: Option<u16>,
    sack: bool,
    ts: Option<(u32, u32)>,
    wscale: Option<u8>,
) -> usize {
    let mut at = 0;
    if let Some(mss) = mss {
        at += TcpOption::MaxSegmentSize(mss)
            .emit(&mut buf[at..])
            .unwrap_or(0);
    }
    match (sack, ts) {
        (true, Some((tsval, tsecr))) => {
            at += TcpOption::SackPermitted.emit(&mut buf[at..]).unwrap_or(0);
            at += TcpOption::Timestamps { tsval, tsecr }
                .emit(&mut buf[at..])
                .unwrap_or(0);
        }
        (false, Some((tsval, tsecr))) => {
            buf[at..at + 2].copy_from_slice(&[1, 1]);
            at += 2;
            at += TcpOption::Timestamps { tsval, tsecr }
                .emit(&mut buf[at..])
                .unwrap_or(0);
        }
        (true, None) => {
            buf[at..at + 2].copy_from_slice(&[1, 1]);
            at += 2;
            at += TcpOption::SackPermitted.emit(&mut buf[at..]).unwrap_or(0);
        }
        (false, None) => {}
    }
    if let Some(shift) = wscale {
        buf[at] = 1;
        at += 1;
        at += TcpOption::WindowScale(shift)
            .emit(&mut buf[at..])
            .unwrap_or(0);
    }
    at
}

/// The longest options area [`write_handshake_options`] writes.
const MAX_HANDSHAKE_OPTIONS: usize = 20;

/// The fields of a segment Sluice writes anew over a received one.
struct NewSegment {
    src: (Ipv4Addr, u16),
    dst: (Ipv4Addr, u16),
    seq: u32,
    ack: u32,
    flags: TcpFlags,
    window: u16,
}

/// Writes `seg` (a fresh 20-byte IPv4 header, then TCP with the options `options`
/// writes) over the frame from `l3`, keeping L2. `buf` may be longer than the
/// frame (the mbuf's tailroom). Returns the new frame length.
fn write_segment(
    buf: &mut [u8],
    l3: usize,
    seg: &NewSegment,
    options: impl FnOnce(&mut [u8]) -> usize,
) -> Result<usize, DropReason> {
    let l4 = l3 + ipv4::MIN_HEADER_LEN;
    let mut scratch = [0u8; MAX_HANDSHAKE_OPTIONS];
    let options_len = options(&mut scratch);
    let header_len = tcp::MIN_HEADER_LEN + options_len;
    let end = l4 + header_len;
    if end > buf.len() {
        return Err(DropReason::Truncated);
    }
    ipv4::Repr {
        src_addr: seg.src.0,
        dst_addr: seg.dst.0,
        protocol: IpProtocol::TCP,
        payload_len: header_len,
        ttl: ipv4::DEFAULT_TTL,
    }
    .emit(&mut ipv4::Packet::new_unchecked(&mut buf[l3..l4]));
    buf[l4 + tcp::MIN_HEADER_LEN..end].copy_from_slice(&scratch[..options_len]);
    let mut out = tcp::Packet::new_unchecked(&mut buf[l4..end]);
    out.set_src_port(seg.src.1);
    out.set_dst_port(seg.dst.1);
    out.set_seq_number(seg.seq);
    out.set_ack_number(seg.ack);
    out.set_header_len(header_len);
    out.set_flags(seg.flags);
    out.set_window_len(seg.window);
    out.set_urgent_at(0);
    out.fill_checksum(seg.src.0, seg.dst.0);
    Ok(end)
}

/// Turns the client's SYN in `buf` (the frame, possibly followed by tailroom) into
/// the cookie SYN-ACK back to it from `port_mac`, VLAN tags kept. Returns the new
/// frame length. `now_ms` is the timestamp clock.
pub fn answer_syn(
    buf: &mut [u8],
    parsed: &Parsed,
    port_mac: MacAddr,
    secret: &SipKey,
    now_ms: u32,
) -> Result<usize, DropReason> {
    let (l4, _, header_len) = segment_of(buf, parsed)?;
    let key = parsed.flow_key().ok_or(DropReason::UnsupportedProtocol)?;
    let seg = tcp::Packet::new_unchecked(&buf[l4..l4 + header_len]);
    let isn = seg.seq_number();
    let syn = SynOptions::parse(seg.options());
    let index = mss_index(syn.mss);
    let cookie = secret.cookie(&key, isn, counter(now_ms), index);
    let client_mac = ethernet::Frame::new_unchecked(&*buf).src_addr();
    let ts = syn
        .tsval
        .map(|tsval| (cookie_tsval(now_ms, syn.wscale, syn.sack), tsval));
    // Without timestamps nothing can remember window scale or SACK: offer neither.
    let (sack, wscale) = match ts {
        Some(_) => (syn.sack, syn.wscale.map(|_| PROXY_WINDOW_SCALE)),
        None => (false, None),
    };
    let answer = NewSegment {
        src: (key.dst_addr(), key.dport),
        dst: (key.src_addr(), key.sport),
        seq: cookie,
        ack: isn.wrapping_add(1),
        flags: TcpFlags(TcpFlags::SYN.0 | TcpFlags::ACK.0),
        window: SYNACK_WINDOW,
    };
    let len = write_segment(buf, parsed.l3, &answer, |o| {
        write_handshake_options(o, Some(MSS_TABLE[index]), sack, ts, wscale)
    })?;
    crate::forward::dr::forward(buf, client_mac, port_mac)?;
    Ok(len)
}

/// A client handshake proven by its ACK: what the SYN to the real server carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Handshake {
    pub client_isn: u32,
    pub cookie: u32,
    pub mss: u16,
    pub wscale: Option<u8>,
    pub sack: bool,
    /// The client's TSval on the ACK, when it sends timestamps.
    pub client_tsval: Option<u32>,
    /// The TSval Sluice sent in the cookie SYN-ACK (the ACK's TSecr).
    pub cookie_tsval: Option<u32>,
    /// The client's window on the ACK (scaled by `wscale`).
    pub window: u16,
}

/// What [`check_ack`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AckCheck {
    Valid(Handshake),
    Expired,
    Invalid,
}

/// Whether the client's segment `parsed` (an ACK without SYN or RST, no session; it
/// may carry data and a FIN, as with Linux's syncookies) answers a cookie SYN-ACK of
/// Sluice's: `ack - 1` a cookie of its tuple and `seq - 1`, still within its time.
pub fn check_ack(frame: &[u8], parsed: &Parsed, secret: &SipKey, now_ms: u32) -> AckCheck {
    let Ok((l4, _, header_len)) = segment_of(frame, parsed) else {
        return AckCheck::Invalid;
    };
    let Some(key) = parsed.flow_key() else {
        return AckCheck::Invalid;
    };
    let seg = tcp::Packet::new_unchecked(&frame[l4..l4 + header_len]);
    let flags = seg.flags();
    if !flags.contains(TcpFlags::ACK) || flags.intersects(TcpFlags::SYN | TcpFlags::RST) {
        return AckCheck::Invalid;
    }
    let client_isn = seg.seq_number().wrapping_sub(1);
    let cookie = seg.ack_number().wrapping_sub(1);
    let mss = match secret.check(&key, client_isn, cookie, counter(now_ms)) {
        CookieCheck::Valid { mss } => mss,
        CookieCheck::Expired => return AckCheck::Expired,
        CookieCheck::Invalid => return AckCheck::Invalid,
    };
    let options = SynOptions::parse(seg.options());
    let (wscale, sack) = match options.tsecr {
        Some(tsecr) => decode_tsval(tsecr),
        None => (None, false),
    };
    AckCheck::Valid(Handshake {
        client_isn,
        cookie,
        mss,
        wscale,
        sack,
        client_tsval: options.tsval,
        cookie_tsval: options.tsecr,
        window: seg.window_len(),
    })
}

/// Turns the client's segment in `buf` (its ACK, or any later segment of a pending
/// handshake, still client -> VIP) into the SYN the client would have sent: ISN,
/// MSS, window scale, SACK-permitted and its TSval (`tsval`, when it uses
/// timestamps). The payload is dropped. The session's rewrite to the real server
/// follows as for any client segment. Returns the new frame length.
pub fn write_server_syn(
    buf: &mut [u8],
    parsed: &Parsed,
    handshake: &Handshake,
    tsval: Option<u32>,
) -> Result<usize, DropReason> {
    segment_of(buf, parsed)?;
    let key = parsed.flow_key().ok_or(DropReason::UnsupportedProtocol)?;
    // A SYN's window is never scaled.
    let window = (u32::from(handshake.window) << handshake.wscale.unwrap_or(0)).min(65535) as u16;
    let syn = NewSegment {
        src: (key.src_addr(), key.sport),
        dst: (key.dst_addr(), key.dport),
        seq: handshake.client_isn,
        ack: 0,
        flags: TcpFlags::SYN,
        window,
    };
    write_segment(buf, parsed.l3, &syn, |o| {
        write_handshake_options(
            o,
            Some(handshake.mss),
            handshake.sack,
            tsval.map(|v| (v, 0)),
            handshake.wscale,
        )
    })
}

/// Writes into `buf`, after `l2` (the Ethernet header and VLAN tags of the client's
/// cookie ACK, as they came), the bare ACK of handshake `hs` on connection `key`
/// (client -> VIP) that the client sent: `seq = ISN + 1`, `ack = cookie + 1`, its
/// window, and timestamps (`tsval`, echoing the cookie TSval) when the SYN made of
/// the ACK carried them. [`write_server_syn`] makes the same SYN of it as of the
/// client's own, so the data plane's timer sends the SYN again down the path a
/// client's retransmitted ACK takes. Returns the frame length.
pub fn write_client_ack(
    buf: &mut [u8],
    l2: &[u8],
    key: &FlowKey4,
    hs: &Handshake,
    tsval: Option<u32>,
) -> Result<usize, DropReason> {
    buf.get_mut(..l2.len())
        .ok_or(DropReason::Truncated)?
        .copy_from_slice(l2);
    let ack = NewSegment {
        src: (key.src_addr(), key.sport),
        dst: (key.dst_addr(), key.dport),
        seq: hs.client_isn.wrapping_add(1),
        ack: hs.cookie.wrapping_add(1),
        flags: TcpFlags::ACK,
        window: hs.window,
    };
    let ts = tsval.zip(hs.cookie_tsval);
    write_segment(buf, l2.len(), &ack, |o| {
        write_handshake_options(o, None, false, ts, None)
    })
}

/// Turns the client's RST in `buf`, for a session whose real server has not answered
/// yet, into the RST the server can take: the client's own sequence number (the
/// proxy does not move the client's numbers), no ACK, no options and no data. The
/// client's ACK field acknowledges the cookie, a number the server never sent, and
/// Linux ignores a reset to a half-open connection whose ACK is not its own
/// (`tcp_check_req`). Returns the new frame length.
pub fn write_server_rst(buf: &mut [u8], parsed: &Parsed) -> Result<usize, DropReason> {
    let (l4, _, _) = segment_of(buf, parsed)?;
    let key = parsed.flow_key().ok_or(DropReason::UnsupportedProtocol)?;
    let rst = NewSegment {
        src: (key.src_addr(), key.sport),
        dst: (key.dst_addr(), key.dport),
        seq: read_u32(buf, l4 + 4),
        ack: 0,
        flags: TcpFlags::RST,
        window: 0,
    };
    write_segment(buf, parsed.l3, &rst, |_| 0)
}

/// What the real server's SYN-ACK says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerHandshake {
    pub isn: u32,
    /// The number it acknowledges (the client ISN + 1 when it answers our SYN).
    pub ack: u32,
    pub wscale: Option<u8>,
    pub tsval: Option<u32>,
}

/// The real server's SYN-ACK in `frame`, or `None` when the segment is not one.
pub fn read_server_synack(frame: &[u8], parsed: &Parsed) -> Option<ServerHandshake> {
    let (l4, _, header_len) = segment_of(frame, parsed).ok()?;
    let seg = tcp::Packet::new_unchecked(&frame[l4..l4 + header_len]);
    let flags = seg.flags();
    if !flags.contains(TcpFlags(TcpFlags::SYN.0 | TcpFlags::ACK.0))
        || flags.intersects(TcpFlags::RST)
    {
        return None;
    }
    let options = SynOptions::parse(seg.options());
    Some(ServerHandshake {
        isn: seg.seq_number(),
        ack: seg.ack_number(),
        wscale: options.wscale,
        tsval: options.tsval,
    })
}

/// Turns the real server's SYN-ACK in `frame` into the ACK that completes its
/// handshake, sent back to it from the address it answered (the client, or the
/// FullNAT local address): `seq = client ISN + 1`, acknowledging the server's ISN,
/// window `window` (already in the server's view of the client's scale), timestamps
/// `(tsval, tsecr)` when the connection uses them. Returns the new frame length.
pub fn write_server_ack(
    frame: &mut [u8],
    parsed: &Parsed,
    server: &ServerHandshake,
    window: u16,
    ts: Option<(u32, u32)>,
) -> Result<usize, DropReason> {
    segment_of(frame, parsed)?;
    let key = parsed.flow_key().ok_or(DropReason::UnsupportedProtocol)?;
    let ack = NewSegment {
        src: (key.dst_addr(), key.dport),
        dst: (key.src_addr(), key.sport),
        seq: server.ack,
        ack: server.isn.wrapping_add(1),
        flags: TcpFlags::ACK,
        window,
    };
    let (mac_src, mac_dst) = {
        let eth = ethernet::Frame::new_unchecked(&*frame);
        (eth.src_addr(), eth.dst_addr())
    };
    let len = write_segment(frame, parsed.l3, &ack, |o| match ts {
        Some((tsval, tsecr)) => {
            o[..2].copy_from_slice(&[1, 1]);
            2 + TcpOption::Timestamps { tsval, tsecr }
                .emit(&mut o[2..])
                .unwrap_or(0)
        }
        None => 0,
    })?;
    crate::forward::dr::forward(frame, mac_src, mac_dst)?;
    Ok(len)
}

/// A proxied session's translation, fixed once the server's SYN-ACK is in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Translation {
    /// `cookie - server ISN`: added to the server's sequence numbers.
    pub seq_delta: u32,
    /// `cookie TSval - server TSval`: added to the server's TSvals.
    pub ts_delta: u32,
    /// The server's window scale (0 when it offered none), when the client scales
    /// windows.
    pub server_wscale: Option<u8>,
    /// The client's window scale, when the server did not agree to scaling: the
    /// client's windows are then shifted up for the server (clamped to 16 bits).
    pub client_wscale: Option<u8>,
}

impl Translation {
    /// The translation for a handshake and the server's answer to it.
    pub fn new(client: &Handshake, server: &ServerHandshake) -> Translation {
        let ts_delta = match (client.cookie_tsval, server.tsval) {
            (Some(ours), Some(theirs)) => ours.wrapping_sub(theirs),
            _ => 0,
        };
        Translation {
            seq_delta: client.cookie.wrapping_sub(server.isn),
            ts_delta,
            server_wscale: client.wscale.and(Some(server.wscale.unwrap_or(0))),
            client_wscale: client.wscale.filter(|_| server.wscale.is_none()),
        }
    }
}

/// Writes `value` as the u32 at `at` of the TCP `segment` with its checksum updated.
fn set_u32(segment: &mut [u8], at: usize, value: u32) {
    if at.is_multiple_of(2) {
        let old = read_u32(segment, at);
        write_u32(segment, at, value);
        tcp::Packet::new_unchecked(segment).update_checksum32(old, value);
    } else {
        super::replace_tcp_bytes(segment, at, &value.to_be_bytes());
    }
}

/// A server -> client segment of a proxied session: `seq + delta`, the window
/// rescaled from the server's scale to [`PROXY_WINDOW_SCALE`]. Timestamps are the
/// caller's ([`crate::forward::timestamps::shift`] with `ts_delta`).
pub fn to_client(frame: &mut [u8], parsed: &Parsed, t: &Translation) -> Result<(), DropReason> {
    let (l4, ip_end, _) = segment_of(frame, parsed)?;
    let segment = &mut frame[l4..ip_end];
    let seq = read_u32(segment, 4);
    set_u32(segment, 4, seq.wrapping_add(t.seq_delta));
    if let Some(shift) = t.server_wscale {
        if shift != PROXY_WINDOW_SCALE {
            let mut tcp = tcp::Packet::new_unchecked(segment);
            let old = tcp.window_len();
            let bytes = u64::from(old) << shift;
            let mut new = (bytes >> PROXY_WINDOW_SCALE).min(65535) as u16;
            if new == 0 && old != 0 {
                new = 1;
            }
            tcp.set_window_len(new);
            tcp.update_checksum16(old, new);
        }
    }
    Ok(())
}

/// A client -> server segment of a proxied session: `ack - delta` (when it carries
/// ACK) and every SACK block edge `- delta`. Timestamps are the caller's.
pub fn to_server(frame: &mut [u8], parsed: &Parsed, t: &Translation) -> Result<(), DropReason> {
    let (l4, ip_end, header_len) = segment_of(frame, parsed)?;
    let segment = &mut frame[l4..ip_end];
    if segment[13] & TcpFlags::ACK.0 != 0 {
        let ack = read_u32(segment, 8);
        set_u32(segment, 8, ack.wrapping_sub(t.seq_delta));
    }
    if let Some(shift) = t.client_wscale {
        let mut tcp = tcp::Packet::new_unchecked(&mut *segment);
        let old = tcp.window_len();
        let new = (u32::from(old) << shift).min(65535) as u16;
        tcp.set_window_len(new);
        tcp.update_checksum16(old, new);
    }
    let mut at = tcp::MIN_HEADER_LEN;
    while at < header_len {
        match segment[at] {
            0 => break,
            1 => at += 1,
            kind => {
                let Some(&len) = segment.get(at + 1) else {
                    break;
                };
                let len = len as usize;
                if len < 2 || at + len > header_len {
                    break;
                }
                if kind == tcp::option_kind::SACK && (len - 2).is_multiple_of(8) {
                    let mut edge = at + 2;
                    while edge < at + len {
                        let value = read_u32(segment, edge);
                        set_u32(segment, edge, value.wrapping_sub(t.seq_delta));
                        edge += 4;
                    }
                }
                at += len;
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::parse::classify;
    use crate::forward::test_util::frame;
    use crate::model::Protocol;
    use crate::wire::test_util::XorShift;

    const CLIENT: Ipv4Addr = Ipv4Addr::new(198, 51, 100, 7);
    const VIP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 220);
    const RIP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 11);
    const OUR_MAC: MacAddr = MacAddr([0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c]);
    const CLIENT_MAC: [u8; 6] = [0x52, 0x54, 0x00, 0x12, 0x34, 0x56];
    const SECRET: SipKey = SipKey::new(0x0706_0504_0302_0100, 0x0f0e_0d0c_0b0a_0908);
    // 2026-12-02 03:00 UTC in ms, modulo 2^32.
    const NOW: u32 = 1_796_180_400_000u64 as u32;

    // Linux's SYN options: MSS 1460, SACK permitted, timestamps (TSval 0x8c1a2b3c,
    // TSecr 0), NOP, window scale 7.
    const LINUX_SYN: [u8; 20] = [
        0x02, 0x04, 0x05, 0xb4, 0x04, 0x02, 0x08, 0x0a, 0x8c, 0x1a, 0x2b, 0x3c, 0x00, 0x00, 0x00,
        0x00, 0x01, 0x03, 0x03, 0x07,
    ];

    fn segment(
        sport: u16,
        dport: u16,
        seq: u32,
        ack: u32,
        flags: u8,
        options: &[u8],
        payload: &[u8],
    ) -> Vec<u8> {
        assert_eq!(options.len() % 4, 0);
        let mut l4 = vec![0u8; 20];
        l4[0..2].copy_from_slice(&sport.to_be_bytes());
        l4[2..4].copy_from_slice(&dport.to_be_bytes());
        l4[4..8].copy_from_slice(&seq.to_be_bytes());
        l4[8..12].copy_from_slice(&ack.to_be_bytes());
        l4[12] = (((20 + options.len()) / 4) as u8) << 4;
        l4[13] = flags;
        l4[14..16].copy_from_slice(&502u16.to_be_bytes());
        l4.extend_from_slice(options);
        l4.extend_from_slice(payload);
        l4
    }

    fn client_frame(seq: u32, ack: u32, flags: u8, options: &[u8], payload: &[u8]) -> Vec<u8> {
        frame(
            IpProtocol::TCP,
            CLIENT,
            VIP,
            &segment(40000, 80, seq, ack, flags, options, payload),
            true,
        )
    }

    fn key() -> FlowKey4 {
        FlowKey4::new(Protocol::Tcp, CLIENT, 40000, VIP, 80)
    }

    fn tcp_ok(buf: &[u8]) -> bool {
        let parsed = classify(buf).unwrap();
        let ip = ipv4::Packet::new_checked(&buf[parsed.l3..parsed.ip_end()]).unwrap();
        ip.verify_checksum()
            && tcp::Packet::new_checked(ip.payload())
                .unwrap()
                .verify_checksum(ip.src_addr(), ip.dst_addr())
    }

    /// The frame with its TCP checksum computed from scratch.
    fn recomputed(buf: &[u8]) -> Vec<u8> {
        let mut copy = buf.to_vec();
        let parsed = classify(buf).unwrap();
        let ip = ipv4::Packet::new_checked(&buf[parsed.l3..]).unwrap();
        let (src, dst) = (ip.src_addr(), ip.dst_addr());
        let end = parsed.ip_end();
        tcp::Packet::new_unchecked(&mut copy[parsed.l4..end]).fill_checksum(src, dst);
        copy
    }

    #[test]
    fn siphash_matches_the_reference_vector() {
        // Key 00..0f, message 00..17 (24 bytes), against the standard library's
        // SipHash-2-4.
        let words = [
            0x0706_0504_0302_0100,
            0x0f0e_0d0c_0b0a_0908,
            0x1716_1514_1312_1110,
        ];
        assert_eq!(SECRET.hash(words), std_siphash(&words));
        // Other lengths (the health probes' ISNs hash six words).
        let six = [1, 2, 3, u64::MAX, 5, 0x8000_0000_0000_0001];
        assert_eq!(SECRET.hash(six), std_siphash(&six));
        assert_eq!(SECRET.hash([42]), std_siphash(&[42]));
        assert_eq!(SECRET.hash([]), std_siphash(&[]));
    }

    /// The standard library's SipHash-2-4 under `SECRET` of the words' LE bytes.
    #[allow(deprecated)]
    fn std_siphash(words: &[u64]) -> u64 {
        use std::hash::Hasher;
        let mut h = std::hash::SipHasher::new_with_keys(SECRET.k0, SECRET.k1);
        let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
        h.write(&bytes);
        h.finish()
    }

    #[test]
    fn cookies_check_in_their_slot_and_the_next_then_expire() {
        let k = key();
        let now = counter(NOW);
        let cookie = SECRET.cookie(&k, 1000, now, 7);
        assert_eq!(cookie & 7, 7);
        assert_eq!(
            SECRET.check(&k, 1000, cookie, now),
            CookieCheck::Valid { mss: 1460 }
        );
        assert_eq!(
            SECRET.check(&k, 1000, cookie, now + 1),
            CookieCheck::Valid { mss: 1460 }
        );
        assert_eq!(
            SECRET.check(&k, 1000, cookie, now + 2),
            CookieCheck::Expired
        );
        assert_eq!(
            SECRET.check(&k, 1000, cookie, now + 3),
            CookieCheck::Expired
        );
        // Four slots later the counter bits match again but the hash does not.
        assert_eq!(
            SECRET.check(&k, 1000, cookie, now + 4),
            CookieCheck::Invalid
        );
        // Another ISN, port, address, key or MSS index: invalid.
        assert_eq!(SECRET.check(&k, 1001, cookie, now), CookieCheck::Invalid);
        let other = FlowKey4::new(Protocol::Tcp, CLIENT, 40001, VIP, 80);
        assert_eq!(
            SECRET.check(&other, 1000, cookie, now),
            CookieCheck::Invalid
        );
        let other = FlowKey4::new(
            Protocol::Tcp,
            Ipv4Addr::new(198, 51, 100, 8),
            40000,
            VIP,
            80,
        );
        assert_eq!(
            SECRET.check(&other, 1000, cookie, now),
            CookieCheck::Invalid
        );
        assert_eq!(
            SipKey::new(1, 2).check(&k, 1000, cookie, now),
            CookieCheck::Invalid
        );
        assert_eq!(
            SECRET.check(&k, 1000, cookie ^ 1, now),
            CookieCheck::Invalid
        );
        // Counter wrap: slot 0xffff and the next, 0.
        let wrapped = SECRET.cookie(&k, 5, 0xffff, 3);
        assert_eq!(
            SECRET.check(&k, 5, wrapped, 0),
            CookieCheck::Valid { mss: 1360 }
        );
    }

    #[test]
    fn random_guesses_almost_never_pass() {
        let mut rng = XorShift(0x5eed_c00c);
        let k = key();
        let mut passed = 0;
        for _ in 0..1_000_000 {
            let guess = rng.next_u64() as u32;
            if matches!(SECRET.check(&k, 77, guess, 100), CookieCheck::Valid { .. }) {
                passed += 1;
            }
        }
        // Expected 1e6 * 2 slots / 2^29 = 0.004.
        assert!(passed <= 1, "{passed} random cookies passed");
    }

    #[test]
    fn mss_index_picks_the_largest_entry_not_above() {
        assert_eq!(mss_index(None), 0);
        assert_eq!(mss_index(Some(100)), 0);
        assert_eq!(mss_index(Some(1460)), 7);
        assert_eq!(mss_index(Some(9000)), 7);
        assert_eq!(mss_index(Some(1459)), 6);
        assert_eq!(mss_index(Some(1448)), 5);
        assert_eq!(MSS_TABLE[mss_index(Some(1300))], 1300);
    }

    #[test]
    fn timestamp_carries_window_scale_and_sack_and_never_runs_ahead() {
        for now in [NOW, 0, 63, 64, 0x3f, u32::MAX] {
            for ws in [None, Some(0), Some(7), Some(14), Some(200)] {
                for sack in [false, true] {
                    let ts = cookie_tsval(now, ws, sack);
                    assert!(now.wrapping_sub(ts) < 128, "{now} {ts}");
                    assert_eq!(decode_tsval(ts), (ws.map(|s| s.min(14)), sack));
                }
            }
        }
    }

    #[test]
    fn a_linux_syn_gets_the_cookie_synack_linux_would_send() {
        let mut buf = client_frame(0x1a2b_3c4d, 0, 0x02, &LINUX_SYN, &[]);
        let parsed = classify(&buf).unwrap();
        buf.resize(buf.len() + 64, 0);
        let len = answer_syn(&mut buf, &parsed, OUR_MAC, &SECRET, NOW).unwrap();
        buf.truncate(len);
        assert_eq!(len, 14 + 20 + 40);
        assert_eq!(buf[0..6], CLIENT_MAC, "back to the client's MAC");
        assert_eq!(buf[6..12], OUR_MAC.0);
        assert!(tcp_ok(&buf));
        let out = classify(&buf).unwrap();
        let k = out.flow_key().unwrap();
        assert_eq!(
            (k.src_addr(), k.sport, k.dst_addr(), k.dport),
            (VIP, 80, CLIENT, 40000)
        );
        let seg = tcp::Packet::new_checked(&buf[34..]).unwrap();
        assert_eq!(seg.flags(), TcpFlags(0x12));
        assert_eq!(seg.ack_number(), 0x1a2b_3c4e);
        assert_eq!(seg.window_len(), 65535);
        let cookie = seg.seq_number();
        assert_eq!(
            SECRET.check(&key(), 0x1a2b_3c4d, cookie, counter(NOW)),
            CookieCheck::Valid { mss: 1460 }
        );
        let tsval = cookie_tsval(NOW, Some(7), true);
        let mut expected = vec![0x02, 0x04, 0x05, 0xb4, 0x04, 0x02, 0x08, 0x0a];
        expected.extend_from_slice(&tsval.to_be_bytes());
        expected.extend_from_slice(&0x8c1a_2b3cu32.to_be_bytes());
        expected.extend_from_slice(&[0x01, 0x03, 0x03, PROXY_WINDOW_SCALE]);
        assert_eq!(seg.options(), &expected[..]);
    }

    #[test]
    fn without_timestamps_the_synack_offers_mss_only() {
        // MSS 1400, SACK-permitted, window scale, no timestamps.
        let options = [
            0x02, 0x04, 0x05, 0x78, 0x01, 0x01, 0x04, 0x02, 0x01, 0x03, 0x03, 0x08,
        ];
        let mut buf = client_frame(5, 0, 0x02, &options, &[]);
        let parsed = classify(&buf).unwrap();
        let len = answer_syn(&mut buf, &parsed, OUR_MAC, &SECRET, NOW).unwrap();
        buf.truncate(len);
        assert!(tcp_ok(&buf));
        let seg = tcp::Packet::new_checked(&buf[34..]).unwrap();
        assert_eq!(seg.options(), &[0x02, 0x04, 0x05, 0x78]);
    }

    /// The whole handshake on frames: SYN, cookie SYN-ACK, the client's ACK (checked),
    /// the SYN to the server, the server's SYN-ACK turned into its ACK, then data both
    /// ways translated.
    #[test]
    fn the_handshake_end_to_end_on_frames() {
        let mut syn = client_frame(0x1a2b_3c4d, 0, 0x02, &LINUX_SYN, &[]);
        let parsed = classify(&syn).unwrap();
        let len = answer_syn(&mut syn, &parsed, OUR_MAC, &SECRET, NOW).unwrap();
        let synack = tcp::Packet::new_checked(&syn[34..len]).unwrap();
        let cookie = synack.seq_number();
        let cookie_ts = cookie_tsval(NOW, Some(7), true);

        // The client's ACK: NOP NOP TS(its clock, our cookie TSval), carrying data.
        let mut ts = vec![0x01, 0x01, 0x08, 0x0a];
        ts.extend_from_slice(&0x8c1a_2b40u32.to_be_bytes());
        ts.extend_from_slice(&cookie_ts.to_be_bytes());
        let mut ack = client_frame(0x1a2b_3c4e, cookie.wrapping_add(1), 0x10, &ts, b"GET /");
        let parsed = classify(&ack).unwrap();
        let AckCheck::Valid(hs) = check_ack(&ack, &parsed, &SECRET, NOW + 1000) else {
            panic!("cookie refused");
        };
        assert_eq!(
            hs,
            Handshake {
                client_isn: 0x1a2b_3c4d,
                cookie,
                mss: 1460,
                wscale: Some(7),
                sack: true,
                client_tsval: Some(0x8c1a_2b40),
                cookie_tsval: Some(cookie_ts),
                window: 502,
            }
        );
        // 130 s later: expired. A changed ack: invalid.
        assert_eq!(
            check_ack(&ack, &parsed, &SECRET, NOW + 140_000),
            AckCheck::Expired
        );
        let mut forged = ack.clone();
        forged[34 + 11] ^= 0x40;
        let fp = classify(&forged).unwrap();
        assert_eq!(check_ack(&forged, &fp, &SECRET, NOW), AckCheck::Invalid);

        ack.resize(ack.len() + 64, 0);
        let len = write_server_syn(&mut ack, &parsed, &hs, hs.client_tsval).unwrap();
        ack.truncate(len);
        assert!(tcp_ok(&ack));
        let seg = tcp::Packet::new_checked(&ack[34..]).unwrap();
        assert_eq!(seg.flags(), TcpFlags::SYN);
        assert_eq!(seg.seq_number(), 0x1a2b_3c4d);
        assert_eq!(seg.payload(), b"");
        assert_eq!(seg.window_len(), 502 << 7, "the ACK's window, unscaled");
        let mut expected = LINUX_SYN;
        expected[8..12].copy_from_slice(&0x8c1a_2b40u32.to_be_bytes());
        assert_eq!(seg.options(), &expected[..]);

        // The server (after NAT: RIP:8080 -> client) answers with ISN 0x77 and its TS.
        let mut options = vec![0x02, 0x04, 0x05, 0xb4, 0x04, 0x02, 0x08, 0x0a];
        options.extend_from_slice(&0x0001_0000u32.to_be_bytes());
        options.extend_from_slice(&0x8c1a_2b40u32.to_be_bytes());
        options.extend_from_slice(&[0x01, 0x03, 0x03, 0x09]);
        let server_synack = segment(8080, 40000, 0x77, 0x1a2b_3c4e, 0x12, &options, &[]);
        let mut sa = frame(IpProtocol::TCP, RIP, CLIENT, &server_synack, true);
        let parsed = classify(&sa).unwrap();
        let server = read_server_synack(&sa, &parsed).unwrap();
        assert_eq!(
            server,
            ServerHandshake {
                isn: 0x77,
                ack: 0x1a2b_3c4e,
                wscale: Some(9),
                tsval: Some(0x10000)
            }
        );
        let t = Translation::new(&hs, &server);
        assert_eq!(t.seq_delta, cookie.wrapping_sub(0x77));
        assert_eq!(t.ts_delta, cookie_ts.wrapping_sub(0x10000));
        assert_eq!(t.server_wscale, Some(9));
        let len =
            write_server_ack(&mut sa, &parsed, &server, 502, Some((0x8c1a_2b40, 0x10000))).unwrap();
        sa.truncate(len);
        assert!(tcp_ok(&sa));
        let out = classify(&sa).unwrap();
        let k = out.flow_key().unwrap();
        assert_eq!(
            (k.src_addr(), k.sport, k.dst_addr(), k.dport),
            (CLIENT, 40000, RIP, 8080)
        );
        let seg = tcp::Packet::new_checked(&sa[34..]).unwrap();
        assert_eq!(
            (seg.seq_number(), seg.ack_number(), seg.flags()),
            (0x1a2b_3c4e, 0x78, TcpFlags::ACK)
        );

        // Server data: seq 0x78 becomes cookie + 1; window 100 << 9 >> 7 = 400.
        let reply = segment(8080, 40000, 0x78, 0x1a2b_3c53, 0x18, &[], b"HTTP/1.1 200");
        let mut reply = frame(IpProtocol::TCP, RIP, CLIENT, &reply, true);
        reply[34 + 14..34 + 16].copy_from_slice(&100u16.to_be_bytes());
        let reply = recomputed(&reply);
        let mut out = reply.clone();
        let parsed = classify(&out).unwrap();
        to_client(&mut out, &parsed, &t).unwrap();
        let seg = tcp::Packet::new_checked(&out[34..]).unwrap();
        assert_eq!(seg.seq_number(), cookie.wrapping_add(1));
        assert_eq!(seg.window_len(), 400);
        assert_eq!(out, recomputed(&out));

        // Client ack of it, with a SACK block: both back to the server's space.
        let mut sack = vec![0x01, 0x01, 0x05, 0x0a];
        sack.extend_from_slice(&cookie.wrapping_add(100).to_be_bytes());
        sack.extend_from_slice(&cookie.wrapping_add(200).to_be_bytes());
        let mut data = client_frame(0x1a2b_3c53, cookie.wrapping_add(13), 0x10, &sack, &[]);
        let parsed = classify(&data).unwrap();
        to_server(&mut data, &parsed, &t).unwrap();
        let seg = tcp::Packet::new_checked(&data[34..]).unwrap();
        assert_eq!(seg.ack_number(), 0x78 + 12);
        assert_eq!(read_u32(seg.options(), 4), 0x77 + 100);
        assert_eq!(read_u32(seg.options(), 8), 0x77 + 200);
        assert_eq!(data, recomputed(&data));
    }

    #[test]
    fn a_client_reset_becomes_a_bare_reset_at_the_clients_sequence_number() {
        // RST|ACK with timestamps and a payload (which RFC 5961 allows to carry a
        // reason): the server gets RST alone, the client's seq, no ACK, no options.
        let ts = [1, 1, 8, 10, 0, 0, 0, 9, 0, 0, 0, 7];
        let mut buf = client_frame(5001, 0xdead_0001, 0x14, &ts, b"bye");
        let parsed = classify(&buf).unwrap();
        let len = write_server_rst(&mut buf, &parsed).unwrap();
        let out = &buf[..len];
        assert_eq!(len, parsed.l3 + 40);
        assert!(tcp_ok(out));
        let parsed = classify(out).unwrap();
        let ip = ipv4::Packet::new_checked(&out[parsed.l3..]).unwrap();
        assert_eq!((ip.src_addr(), ip.dst_addr()), (CLIENT, VIP));
        let seg = tcp::Packet::new_checked(ip.payload()).unwrap();
        assert_eq!((seg.src_port(), seg.dst_port()), (40000, 80));
        assert_eq!(seg.seq_number(), 5001);
        assert_eq!(seg.ack_number(), 0);
        assert_eq!(seg.flags(), TcpFlags::RST);
        assert_eq!(seg.header_len(), 20);
        assert_eq!(seg.window_len(), 0);
    }

    #[test]
    fn a_server_without_window_scaling_gets_its_window_shifted_down() {
        let t = Translation {
            seq_delta: 0,
            ts_delta: 0,
            server_wscale: Some(0),
            client_wscale: None,
        };
        let reply = segment(8080, 40000, 1, 1, 0x10, &[], &[]);
        let mut buf = frame(IpProtocol::TCP, RIP, CLIENT, &reply, true);
        buf[34 + 14..34 + 16].copy_from_slice(&29200u16.to_be_bytes());
        let mut buf = recomputed(&buf);
        let parsed = classify(&buf).unwrap();
        to_client(&mut buf, &parsed, &t).unwrap();
        assert_eq!(
            tcp::Packet::new_checked(&buf[34..]).unwrap().window_len(),
            29200 >> 7
        );
        assert_eq!(buf, recomputed(&buf));
        // No scaling negotiated with the client: the window is left alone.
        let t = Translation {
            seq_delta: 0,
            ts_delta: 0,
            server_wscale: None,
            client_wscale: None,
        };
        let before = buf.clone();
        to_client(&mut buf, &parsed, &t).unwrap();
        assert_eq!(buf, before);
    }

    /// Random option layouts with SACK blocks anywhere (odd offsets too), payloads of
    /// odd lengths, random deltas: the incremental checksum equals a full recompute,
    /// and the inverse translation restores the frame.
    #[test]
    fn property_translation_equals_recompute_and_reverses() {
        let mut rng = XorShift(0x5ac4_f00d);
        for _ in 0..3000 {
            let mut options = Vec::new();
            for _ in 0..rng.below(3) {
                match rng.below(3) {
                    0 => options.push(1),
                    1 => options.extend_from_slice(&[3, 3, rng.below(15) as u8]),
                    _ => options.extend_from_slice(&[4, 2]),
                }
            }
            let blocks = 1 + rng.below(3);
            options.extend_from_slice(&[5, (2 + 8 * blocks) as u8]);
            let sack_at = options.len();
            for _ in 0..blocks * 8 {
                options.push(rng.below(256) as u8);
            }
            while options.len() % 4 != 0 {
                options.push(1);
            }
            let payload: Vec<u8> = (0..rng.below(40)).map(|_| rng.below(256) as u8).collect();
            let flags = if rng.below(4) == 0 {
                0x18 & !0x10
            } else {
                0x18
            };
            let seq = rng.next_u64() as u32;
            let ack = rng.next_u64() as u32;
            let original = client_frame(seq, ack, flags, &options, &payload);
            let parsed = classify(&original).unwrap();
            let t = Translation {
                seq_delta: rng.next_u64() as u32,
                ts_delta: 0,
                server_wscale: [None, Some(7), Some(rng.below(15) as u8)][rng.below(3)],
                client_wscale: None,
            };
            let mut buf = original.clone();
            to_server(&mut buf, &parsed, &t).unwrap();
            assert_eq!(buf, recomputed(&buf), "options {options:02x?}");
            let edge = 34 + 20 + sack_at;
            assert_eq!(
                read_u32(&buf, edge),
                read_u32(&original, edge).wrapping_sub(t.seq_delta)
            );
            if flags & 0x10 != 0 {
                assert_eq!(read_u32(&buf, 34 + 8), ack.wrapping_sub(t.seq_delta));
            } else {
                assert_eq!(read_u32(&buf, 34 + 8), ack);
            }
            let back = Translation {
                seq_delta: t.seq_delta.wrapping_neg(),
                ..t
            };
            to_server(&mut buf, &parsed, &back).unwrap();
            assert_eq!(buf, original);

            let mut buf = original.clone();
            to_client(&mut buf, &parsed, &t).unwrap();
            assert_eq!(buf, recomputed(&buf));
            assert_eq!(read_u32(&buf, 34 + 4), seq.wrapping_add(t.seq_delta));
        }
    }

    /// Garbage frames and `Parsed` values that disagree with them: never a panic, and
    /// an error leaves the frame as it was.
    #[test]
    fn fuzz_never_panics() {
        let mut rng = XorShift(0x5a_f022_0bad_5eed);
        let fixture = client_frame(1, 2, 0x02, &LINUX_SYN, &[]);
        let mut buf = [0u8; 160];
        for round in 0..100_000 {
            let len = rng.below(128 + 1);
            if rng.below(3) == 0 {
                rng.fill(&mut buf[..len]);
            } else {
                let n = fixture.len().min(len);
                buf[..n].copy_from_slice(&fixture[..n]);
                if len > 0 && rng.below(2) == 0 {
                    buf[rng.below(len)] ^= rng.next_u64() as u8;
                }
            }
            let parsed = if round % 2 == 0 {
                match classify(&buf[..len]) {
                    Ok(parsed) => parsed,
                    Err(_) => continue,
                }
            } else {
                crate::forward::test_util::random_parsed(&mut rng, len)
            };
            let before = buf;
            let t = Translation {
                seq_delta: 9,
                ts_delta: 0,
                server_wscale: Some(3),
                client_wscale: Some(2),
            };
            let _ = check_ack(&buf[..len], &parsed, &SECRET, NOW);
            let _ = read_server_synack(&buf[..len], &parsed);
            if to_server(&mut buf[..len], &parsed, &t).is_err() {
                assert_eq!(buf, before, "round {round}");
            }
            if to_client(&mut buf[..len], &parsed, &t).is_err() {
                assert_eq!(buf, before, "round {round}");
            }
            let tail = rng.below(40);
            let end = (len + tail).min(buf.len());
            match rng.below(2) {
                0 => {
                    if answer_syn(&mut buf[..end], &parsed, OUR_MAC, &SECRET, NOW).is_err() {
                        assert_eq!(buf, before, "round {round}");
                    }
                }
                _ => {
                    let hs = Handshake {
                        client_isn: 1,
                        cookie: 2,
                        mss: 1460,
                        wscale: Some(7),
                        sack: true,
                        client_tsval: Some(3),
                        cookie_tsval: Some(4),
                        window: 5,
                    };
                    if write_server_syn(&mut buf[..end], &parsed, &hs, Some(3)).is_err() {
                        assert_eq!(buf, before, "round {round}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_cookie_ack_may_carry_a_fin_not_a_syn_or_a_reset() {
        let mut syn = client_frame(5000, 0, 0x02, &[], &[]);
        let parsed = classify(&syn).unwrap();
        syn.resize(syn.len() + 64, 0);
        let len = answer_syn(&mut syn, &parsed, OUR_MAC, &SECRET, NOW).unwrap();
        let cookie = tcp::Packet::new_checked(&syn[34..len])
            .unwrap()
            .seq_number();
        let ack = |flags: u8, payload: &[u8]| {
            let f = client_frame(5001, cookie.wrapping_add(1), flags, &[], payload);
            let parsed = classify(&f).unwrap();
            check_ack(&f, &parsed, &SECRET, NOW)
        };
        // ACK|FIN, ACK|PSH|FIN with the request: the connection opens.
        for (flags, payload) in [(0x11, &b""[..]), (0x19, b"GET / HTTP/1.0\r\n\r\n")] {
            assert!(
                matches!(ack(flags, payload), AckCheck::Valid(hs) if hs.cookie == cookie),
                "flags {flags:#x}"
            );
        }
        for flags in [0x12, 0x14, 0x15] {
            assert_eq!(ack(flags, b""), AckCheck::Invalid, "flags {flags:#x}");
        }
    }

    #[test]
    fn the_rebuilt_cookie_ack_makes_the_same_syn_as_the_clients() {
        let mut syn = client_frame(0x1a2b_3c4d, 0, 0x02, &LINUX_SYN, &[]);
        let parsed = classify(&syn).unwrap();
        let len = answer_syn(&mut syn, &parsed, OUR_MAC, &SECRET, NOW).unwrap();
        let cookie = tcp::Packet::new_checked(&syn[34..len])
            .unwrap()
            .seq_number();
        let cookie_ts = cookie_tsval(NOW, Some(7), true);
        let mut ts = vec![0x01, 0x01, 0x08, 0x0a];
        ts.extend_from_slice(&0x8c1a_2b40u32.to_be_bytes());
        ts.extend_from_slice(&cookie_ts.to_be_bytes());
        // With timestamps (and with them SACK and window scale), and without.
        for options in [ts, vec![]] {
            let ack = client_frame(0x1a2b_3c4e, cookie.wrapping_add(1), 0x10, &options, &[]);
            let parsed = classify(&ack).unwrap();
            let AckCheck::Valid(hs) = check_ack(&ack, &parsed, &SECRET, NOW) else {
                panic!("cookie refused");
            };
            let mut first = ack.clone();
            first.resize(ack.len() + 64, 0);
            let len = write_server_syn(&mut first, &parsed, &hs, hs.client_tsval).unwrap();
            first.truncate(len);

            let mut rebuilt = vec![0u8; 128];
            let len =
                write_client_ack(&mut rebuilt, &ack[..14], &key(), &hs, hs.client_tsval).unwrap();
            rebuilt.truncate(len);
            assert!(tcp_ok(&rebuilt));
            let rp = classify(&rebuilt).unwrap();
            assert_eq!(
                check_ack(&rebuilt, &rp, &SECRET, NOW),
                AckCheck::Valid(hs),
                "the rebuilt ACK carries the client's handshake"
            );
            let tsval = crate::forward::timestamps::tsval(&rebuilt, &rp);
            assert_eq!(tsval, hs.client_tsval);
            rebuilt.resize(128, 0);
            let len = write_server_syn(&mut rebuilt, &rp, &hs, tsval).unwrap();
            rebuilt.truncate(len);
            assert_eq!(rebuilt, first, "the same SYN, byte for byte");
        }
        // The L2 header as it came, VLAN tag included; no room: an error.
        let mut tagged = [0u8; 18];
        tagged[..12].copy_from_slice(&client_frame(1, 1, 0x10, &[], &[])[..12]);
        tagged[12..].copy_from_slice(&[0x81, 0x00, 0x00, 0x64, 0x08, 0x00]);
        let hs = Handshake {
            client_isn: 7,
            cookie,
            mss: 1460,
            wscale: None,
            sack: false,
            client_tsval: None,
            cookie_tsval: None,
            window: 502,
        };
        let mut buf = vec![0u8; 128];
        let len = write_client_ack(&mut buf, &tagged, &key(), &hs, None).unwrap();
        let parsed = classify(&buf[..len]).unwrap();
        assert_eq!(parsed.l2.vlan_id, Some(100));
        assert_eq!(parsed.flow_key(), Some(key()));
        assert_eq!(
            write_client_ack(&mut buf[..50], &tagged, &key(), &hs, None),
            Err(DropReason::Truncated)
        );
    }
}
