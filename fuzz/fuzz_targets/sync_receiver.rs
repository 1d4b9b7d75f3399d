//! Session sync from the network: `Receiver::receive` (peer check, HMAC, header and
//! record parsing) and the standby's installer `Forwarder::install`, on the services
//! of `bed.rs`, IPv4 and IPv6 records mixed. Each input is a sequence of datagrams, records (tag, length, bytes):
//! tag bit 0 picks a receiver with a key (every input uses one receiver: the first
//! record's bit decides), bit 1 a structured message (header and records from the
//! bytes, mostly valid, sealed with the right key when bit 2 is set, then one byte
//! damaged when bit 3 is set) instead of raw bytes, bit 4 an unknown source address.
//!
//! Properties: with a key, nothing is accepted that was not sealed with it and left
//! intact; without one, no message carrying a trailer is; every datagram is counted
//! once (accepted or one reject reason); an accepted record survives emit -> parse;
//! after installing, the session table, local-port pools and gauges agree, and once
//! every session expired every local port is back in its pool.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use hmac::{Hmac, Mac};
use libfuzzer_sys::fuzz_target;
use sha2::Sha256;
use sluice::dataplane::counters::WorkerCounters;
use sluice::ha::auth::SharedKey;
use sluice::ha::sync::auth::seal;
use sluice::ha::sync::receiver::{Receiver, ReceiverConfig};
use sluice::model::Protocol;
use sluice::model::ServiceKey;
use sluice::session::replication::{
    Packet, Record, RecordRepr, HEADER_LEN, HMAC_LEN, MAGIC, RECORD6_LEN, RECORD_LEN, VERSION,
};
use sluice_fuzz::bed;
use sluice_fuzz::frames::{Addr, Port};
use std::net::{Ipv4Addr, Ipv6Addr};

const PEER: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 2);
/// This node's sync address: the recipient the peer's requests and dump chunks name.
const LOCAL: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const KEY: &[u8] = b"sluice fuzz sync key, 32 bytes.";

#[derive(Arbitrary, Debug)]
struct Message {
    message_type: u8,
    flags: u8,
    version_ok: bool,
    sender: u32,
    /// Names this node (the recipient of requests and dump chunks) when set.
    to_us: bool,
    recipient: u32,
    dump_id: u32,
    chunk: u32,
    epoch: u64,
    sequence: u64,
    records: Vec<RecordSpec>,
    /// The `count` field off by this much (usually 0).
    count_skew: i8,
    damage_at: u16,
    damage: u8,
}

#[derive(Arbitrary, Debug)]
struct RecordSpec {
    /// Below 192: one of the bed's IPv4 (service, real server) pairs; 192 to 223 one
    /// of its IPv6 pairs (an IPv6 record); else fields apart.
    flow: u8,
    /// Mostly a connection update; sometimes a removal or a template.
    kind_op: u8,
    /// Mostly the flow's mode; sometimes another (the record says, not the config).
    mode: u8,
    state: u8,
    prefix_len: u8,
    flags: u8,
    client: u8,
    client_port: u8,
    lip: u8,
    lport: u8,
    timeout_ms: u32,
    apart: Option<(Addr, Addr, Addr, Port, Port, u16)>,
}

/// (TCP, VIP, port, real server, port, mode code) of the bed's services.
const FLOWS: &[(bool, [u8; 4], u16, [u8; 4], u16, u8)] = &[
    (true, [198, 18, 0, 210], 80, [198, 18, 0, 11], 80, 3),
    (false, [198, 18, 0, 210], 3333, [198, 18, 0, 11], 3333, 3),
    (true, [198, 18, 0, 220], 80, [198, 18, 0, 12], 8080, 0),
    (false, [198, 18, 0, 220], 3333, [198, 18, 0, 12], 4444, 0),
    (true, [198, 18, 0, 230], 80, [198, 18, 0, 13], 80, 2),
    (true, [198, 18, 0, 221], 80, [198, 18, 0, 14], 8080, 0),
    (true, [198, 18, 0, 222], 80, [198, 18, 0, 12], 8080, 0),
    (true, [198, 18, 0, 240], 80, [198, 18, 0, 21], 8080, 5),
    (true, [198, 18, 0, 240], 80, [198, 18, 0, 22], 8080, 5),
    (false, [198, 18, 0, 240], 3333, [198, 18, 0, 21], 4444, 5),
    (false, [198, 18, 0, 240], 3333, [198, 18, 0, 22], 4444, 5),
];

/// (TCP, VIP, port, real server, port, mode code) of the bed's IPv6 services.
const FLOWS6: &[(bool, &str, u16, &str, u16, u8)] = &[
    (true, "2001:db8:18::100", 80, "2001:db8:18::21", 8080, 0),
    (true, "2001:db8:18::100", 80, "2001:db8:18::22", 8080, 0),
    (false, "2001:db8:18::100", 53, "2001:db8:18::21", 53, 3),
];

/// Whether a record's tag asks for a structured message.
fn tag_bit_structured(tag: u8) -> bool {
    tag & 2 != 0
}

fn addr(a: Addr) -> Ipv4Addr {
    match a {
        Addr::Known(i) => bed::ADDRS[i as usize % bed::ADDRS.len()],
        Addr::Raw(x) => Ipv4Addr::from(x),
    }
}

fn port(p: Port) -> u16 {
    match p {
        Port::Known(i) => bed::PORTS[i as usize % bed::PORTS.len()],
        Port::Raw(x) => x,
    }
}

/// An IPv6 record (kind 3, `RECORD6_LEN` bytes) for one of the bed's IPv6 pairs: the
/// fields but the addresses where an IPv4 record has them, the addresses 16 bytes each.
fn record6_bytes(r: &RecordSpec, out: &mut Vec<u8>) {
    let mut v4 = Vec::new();
    record4_bytes(r, &mut v4);
    let (tcp, vip, vport, rip, rport, mode) = FLOWS6[r.flow as usize % FLOWS6.len()];
    let at = out.len();
    out.resize(at + RECORD6_LEN, 0);
    let b = &mut out[at..];
    b[..8].copy_from_slice(&v4[..8]);
    b[72..100].copy_from_slice(&v4[24..52]);
    // IPv6 connection (3) or template (4) in place of the IPv4 kinds.
    b[0] = match v4[0] {
        1 => 3,
        2 => 4,
        k => k,
    };
    b[2] = if tcp { 6 } else { 17 };
    if r.mode < 232 {
        b[3] = mode;
    }
    if !tcp {
        b[4] = 0;
    }
    if r.prefix_len < 240 {
        b[5] = 128;
    }
    let client: Ipv6Addr = [
        "2001:db8:18::2",
        "2001:db8:18::3",
        "2001:db8:2::9",
        "::ffff:1.2.3.4",
    ][r.client as usize % 4]
        .parse()
        .unwrap();
    b[8..24].copy_from_slice(&client.octets());
    b[24..40].copy_from_slice(&vip.parse::<Ipv6Addr>().unwrap().octets());
    b[40..56].copy_from_slice(&rip.parse::<Ipv6Addr>().unwrap().octets());
    b[76..78].copy_from_slice(&rport.to_be_bytes());
    b[74..76].copy_from_slice(&vport.to_be_bytes());
    // No local address (no IPv6 FullNAT service), unless the spec asks for a wrong one.
    b[56..72].fill(0);
    b[78..80].fill(0);
    if r.lip >= 240 {
        b[71] = r.lip;
        b[78] = r.lport;
    }
}

fn record_bytes(r: &RecordSpec, out: &mut Vec<u8>) {
    if (192..=223).contains(&r.flow) {
        record6_bytes(r, out);
    } else {
        record4_bytes(r, out);
    }
}

/// An IPv4 record (kind 1 or 2 mostly, `RECORD_LEN` bytes).
fn record4_bytes(r: &RecordSpec, out: &mut Vec<u8>) {
    let at = out.len();
    out.resize(at + RECORD_LEN, 0);
    let b = &mut out[at..];
    let (tcp, vip, vport, rip, rport, mode) = match (r.flow, &r.apart) {
        (0..=191, _) | (_, None) => {
            let (tcp, vip, vport, rip, rport, mode) = FLOWS[r.flow as usize % FLOWS.len()];
            (
                tcp,
                Ipv4Addr::from(vip),
                vport,
                Ipv4Addr::from(rip),
                rport,
                mode,
            )
        }
        (_, Some((v, rs, _, vp, rp, _))) => (
            r.flow & 1 == 0,
            addr(*v),
            port(*vp),
            addr(*rs),
            port(*rp),
            r.mode % 6,
        ),
    };
    let mode = if r.mode < 232 {
        mode
    } else {
        [0, 2, 3, 5, 1][r.mode as usize % 5]
    };
    let (kind, op) = match r.kind_op {
        0..=199 => (1, 1),
        200..=239 => (1, 2),
        240..=247 => (2, 1),
        k => (k % 4, k / 4 % 4),
    };
    b[0] = kind;
    b[1] = op;
    b[2] = if tcp { 6 } else { 17 };
    b[3] = mode;
    b[4] = if !tcp {
        0
    } else if r.state < 240 {
        1 + r.state % 10
    } else {
        r.state % 16
    };
    b[5] = if r.prefix_len < 240 {
        32
    } else {
        r.prefix_len % 40
    };
    b[6..8]
        .copy_from_slice(&u16::from(if r.flags < 224 { 0 } else { r.flags & 0x0f }).to_be_bytes());
    let client = [
        Ipv4Addr::new(198, 18, 0, 100),
        Ipv4Addr::new(198, 18, 0, 101),
        Ipv4Addr::new(198, 51, 100, 7),
        Ipv4Addr::new(198, 18, 0, 50),
    ][r.client as usize % 4];
    b[8..12].copy_from_slice(&client.octets());
    b[12..16].copy_from_slice(&vip.octets());
    b[16..20].copy_from_slice(&rip.octets());
    let with_local = (mode == 5) != (r.lip >= 240);
    if with_local {
        let lip =
            [Ipv4Addr::new(198, 18, 0, 50), Ipv4Addr::new(198, 18, 0, 51)][r.lip as usize % 2];
        b[20..24].copy_from_slice(&lip.octets());
        let lport = if r.lport < 240 {
            bed::LOCAL_PORTS.start() + u16::from(r.lport) % 40
        } else {
            u16::from(r.lport) << 8
        };
        b[30..32].copy_from_slice(&lport.to_be_bytes());
    }
    let cport = [33000, 33001, 40001, 1024][r.client_port as usize % 4];
    b[24..26].copy_from_slice(&u16::to_be_bytes(cport));
    b[26..28].copy_from_slice(&vport.to_be_bytes());
    b[28..30].copy_from_slice(&rport.to_be_bytes());
    b[32..36].copy_from_slice(&(r.timeout_ms % 120_000).to_be_bytes());
}

/// The datagram and whether it was sealed with the key and left intact.
fn build(m: &Message, sealed: bool, damaged: bool, key: &SharedKey) -> (Vec<u8>, bool) {
    let count = m.records.len().min(40);
    let mut records = vec![0u8; HEADER_LEN];
    for r in m.records.iter().take(count) {
        record_bytes(r, &mut records);
    }
    let mut d = Vec::with_capacity(records.len() + HMAC_LEN);
    d.extend_from_slice(&MAGIC.to_be_bytes());
    d.push(if m.version_ok { VERSION } else { VERSION - 1 });
    d.push(1 + m.message_type % 4);
    let flags = u16::from(m.flags & 0x02) | u16::from(sealed);
    d.extend_from_slice(&flags.to_be_bytes());
    d.extend_from_slice(&(records.len() as u16).to_be_bytes());
    d.extend_from_slice(
        &((count as u16).wrapping_add_signed(i16::from(m.count_skew))).to_be_bytes(),
    );
    let recipient = if m.to_us {
        u32::from(LOCAL)
    } else {
        m.recipient
    };
    for v in [m.sender, recipient, m.dump_id, m.chunk] {
        d.extend_from_slice(&v.to_be_bytes());
    }
    for v in [m.epoch, m.sequence] {
        d.extend_from_slice(&v.to_be_bytes());
    }
    d.extend_from_slice(&records[HEADER_LEN..]);
    if sealed {
        d.resize(d.len() + HMAC_LEN, 0);
        seal(&mut d, key);
    }
    let mut intact = sealed;
    if damaged && m.damage != 0 && !d.is_empty() {
        let at = m.damage_at as usize % d.len();
        d[at] ^= m.damage;
        intact = false;
    }
    (d, intact)
}

fuzz_target!(|data: &[u8]| {
    let key = SharedKey::new(KEY).unwrap();
    let keyed = data.first().is_some_and(|t| t & 1 != 0);
    bed::with_bed(|bed| run(bed, data, keyed, &key));
});

fn run(bed: &mut bed::Bed, data: &[u8], keyed: bool, key: &SharedKey) {
    let mut receiver = Receiver::new(ReceiverConfig {
        local: LOCAL,
        peers: vec![PEER],
        key: keyed.then(|| key.clone()),
    });
    let bed::Bed { fwd, now, .. } = bed;
    let counters = WorkerCounters::default();
    fwd.poll(*now, &counters);
    let mut received = 0u64;
    for (n, (tag, body)) in sluice_fuzz::records(data).enumerate() {
        if n >= 16 {
            break;
        }
        let tag_byte = tag;
        let (datagram, intact) = if tag & 2 != 0 {
            let Ok(m) = Message::arbitrary(&mut Unstructured::new(body)) else {
                continue;
            };
            build(&m, tag & 4 != 0, tag & 8 != 0, key)
        } else {
            (body.to_vec(), false)
        };
        let source = if tag & 0x10 != 0 {
            Ipv4Addr::new(198, 18, 0, 3)
        } else {
            PEER
        };
        let snapshot = bed::shared().publisher.reader();
        let exists = |proto: Protocol, vs: std::net::SocketAddr| {
            snapshot
                .current()
                .find(&ServiceKey::new(proto, vs.ip(), vs.port()))
                .is_some()
        };
        received += 1;
        let result = receiver.receive(&datagram, source);
        let c = receiver.counters();
        assert_eq!(c.accepted_messages + c.rejected_total(), received);
        let Ok(accepted) = result else {
            continue;
        };
        assert_eq!(source, PEER, "accepted from an unknown peer");
        let trailer = Packet::new_checked(&datagram[..])
            .unwrap()
            .trailer()
            .is_some();
        if keyed {
            // HMAC-SHA256 over header and records, computed here with the key.
            let len = usize::from(u16::from_be_bytes([datagram[8], datagram[9]]));
            let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(KEY).unwrap();
            mac.update(&datagram[..len]);
            let tag = mac.finalize().into_bytes();
            assert_eq!(
                datagram.get(len..len + HMAC_LEN),
                Some(&tag[..]),
                "accepted with a key but not sealed with it: {datagram:02x?}"
            );
            if tag_bit_structured(tag_byte) {
                assert!(intact, "a damaged message was accepted");
            }
        } else {
            assert!(!trailer, "accepted a trailer with no key configured");
        }
        let records: Vec<RecordRepr> = accepted.records().collect();
        assert_eq!(records.len(), usize::from(accepted.header.count));
        for r in &records {
            let mut buf = vec![0u8; r.wire_len()];
            r.emit(&mut Record::new_unchecked(&mut buf[..]));
            let back = RecordRepr::parse(&Record::new_unchecked(&buf[..]));
            assert_eq!(back, Ok(*r), "a record changed through emit -> parse");
            // The daemon skips a record of a service this node lacks, and so here.
            if !exists(r.proto, r.virtual_service) {
                continue;
            }
            fwd.install(r);
            if let Err(e) = bed::check_books(&fwd) {
                panic!("after installing {r:?}: {e}");
            }
        }
    }
    if let Err(e) = bed::drain(fwd, now, &counters) {
        panic!("draining: {e}");
    }
}
