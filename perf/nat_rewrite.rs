//! Micro-benchmark: cycles per packet of the worker's real forwarding path
//! (`Forwarder::handle_burst`, as the worker calls it: the burst's prefetch pass, then
//! per packet classify, session lookup, state update, NAT rewrite with incremental
//! checksums, MAC rewrite, new sessions filed at the burst's end) for established
//! flows with N sessions in the table, plus cycles per new session and, for IPv4, per
//! expired session (every client sends a FIN in a scrambled order, so the timer
//! wheel's lists run through the slab at random; then the clock jumps an hour and
//! `Forwarder::poll` runs until the table is empty). Runs the EAL
//! without hugepages (mbufs are real DPDK mbufs); only the time inside
//! `handle_burst` is counted, not refilling the burst.
//!
//! Run: `cargo bench --bench nat_rewrite -- [SESSIONS] [PACKETS]
//! [nat|fullnat|nat6|fullnat6|nat64] [--sync] [--timestamps] [--exception] [--park]
//! [--persist=SECONDS] [--replies] [--foreign]`
//!
//! `nat6`, `fullnat6` and `nat64` are the same phases over IPv6 clients and an IPv6
//! VIP, through the same `handle`: IPv6 real servers in NAT, IPv6 local addresses and
//! real servers in FullNAT, IPv4 local addresses and real servers behind the IPv6 VIP
//! for NAT64. The IPv6 table is sized for SESSIONS exactly and the IPv4 table kept at
//! 4096 (the daemon sizes the IPv6 table an eighth of the IPv4 one), and the sync ring
//! is sized only with `--sync`, so the resident memory that grows with SESSIONS is the
//! IPv6 table's (`perf/rss_peak.sh BIN SESSIONS PACKETS nat6`).
//!
//! `--timestamps` gives every segment a TCP timestamps option (NOP, NOP, TSval, TSecr,
//! as Linux sends after the SYN): with `fullnat`, every packet then has its TSval moved
//! onto Sluice's clock (`forward::timestamps`), the default for FullNAT TCP; compare
//! with and without it for that cost.
//!
//! `--sync` turns session sync on (as a `[sync]` section does): each session's
//! establishing ACK then pushes a sync event onto the worker's ring, and every packet
//! asks the sync policy. Compare the "establishing ACK" and "established" rows with
//! and without it for the workers' cost of sync (the management core's batching and
//! sending are not in these figures).
//! `--synproxy` turns the SYN proxy on for the service (nat or fullnat): the phases are
//! then the SYN answered with a cookie, the client's ACK (cookie checked, session
//! opened, SYN to the real server), the real server's SYN-ACK (absorbed, ACK to the
//! server) and established client ACKs with sequence (and SACK-free) translation.
//! Compare its established row with a run without it for the translation's cost.
//!
//! `--park` parks new sessions to the end of their burst whatever the table's size
//! (by default only from a 4 MiB index, `PARK_INDEX_BYTES`): compare a small table
//! with and without it for what parking costs where the reply bucket is cached.
//!
//! `--persist=SECONDS` gives the service persistence (`-p SECONDS`, netmask
//! 255.255.255.255) and every session a client of its own (IPv4: from 100.64.0.0/10):
//! each new session also makes its client's template, and, over
//! IPv4, every live session renews its template from the worker's housekeeping (every
//! half timeout, at least every second). The "housekeeping" row (IPv4) measures that:
//! after the established phase, four seconds of the worker's `poll` at one call per
//! 10 us (the worker's `HOUSEKEEPING_PERIOD_US`) of a clock moved by hand, cycles per
//! session per second, and how many templates are live at the end (all of them, if
//! renewal kept up). Compare with a run without `--persist` (the wheel's own walk,
//! the polls' own cost) for what renewal costs.
//!
//! `--replies` (IPv4, nat or fullnat) adds a phase after the established one: the
//! real servers' ACKs to their clients, as many packets and in a scrambled order too,
//! each addressed to where its session's SYN went (RIP:rport to the client's address
//! and port in NAT, to the local address and port in FullNAT): the reply direction's
//! cycles per packet, mean and median burst.
//!
//! `--foreign` adds two phases after the established one, as many frames each, all
//! of them dropped on their Ethernet header: the same segments from a multicast
//! source MAC, then sent to another host's MAC (as a promiscuous port sees a
//! flooding switch's frames): cycles per frame, median burst.
//!
//! `--exception` runs as on a port with an exception path (`[ports.exception]`):
//! compare with a run without it, and with a binary of the code before the exception
//! path, for the check's cost on forwarded packets (it sits on the drop path only).
//!
//! (defaults 1000000, 20000000, nat). Needs root (DPDK). Prints a markdown table.
//! FullNAT adds the local-port allocation to each new session and rewrites both ends.
use sluice::dataplane::counters::WorkerCounters;
use sluice::dataplane::forwarder::{Action, Forwarder, ForwarderConfig, PortContext, RssView};
use sluice::dataplane::local::LocalResponder;
use sluice::dataplane::neighbour::NeighbourTable;
use sluice::dataplane::realserver_stats;
use sluice::dpdk::{tsc, tsc_hz, Burst, Eal, Mempool, BURST_SIZE};
use sluice::model::Protocol;
use sluice::model::SchedulerKind;
use sluice::model::{ForwardMode, RealServerSpec, ServiceKey};
use sluice::service::{ServiceTable, Snapshot, SnapshotPublisher};
use sluice::session::Timeouts;
use sluice::wire::checksum;
use sluice::wire::ethernet::MacAddr;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;

const LB_MAC: [u8; 6] = [0x02, 0x53, 0x4c, 0, 0, 1];
const CLIENT_MAC: [u8; 6] = [0x02, 0xc1, 0, 0, 0, 1];
/// Bytes of the TCP timestamps option as Linux lays it out after the SYN.
const TS_OPTION_LEN: usize = 12;

/// Writes an Ethernet/IPv4/TCP frame (no payload) with valid checksums, with a
/// timestamps option when `timestamps`; returns its length.
fn tcp_frame(
    buf: &mut [u8],
    src: Ipv4Addr,
    sport: u16,
    dst: Ipv4Addr,
    dport: u16,
    flags: u8,
    timestamps: bool,
) -> usize {
    let options = if timestamps { TS_OPTION_LEN } else { 0 };
    let tcp_len = 20 + options;
    buf[0..6].copy_from_slice(&LB_MAC);
    buf[6..12].copy_from_slice(&CLIENT_MAC);
    buf[12..14].copy_from_slice(&[0x08, 0x00]);
    let ip = &mut buf[14..34];
    ip.copy_from_slice(&[
        0x45, 0, 0, 40, 0, 1, 0x40, 0, 64, 6, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    ]);
    ip[2..4].copy_from_slice(&((20 + tcp_len) as u16).to_be_bytes());
    ip[12..16].copy_from_slice(&src.octets());
    ip[16..20].copy_from_slice(&dst.octets());
    let c = checksum::finish(checksum::sum(ip));
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    let tcp = &mut buf[34..34 + tcp_len];
    tcp.fill(0);
    tcp[0..2].copy_from_slice(&sport.to_be_bytes());
    tcp[2..4].copy_from_slice(&dport.to_be_bytes());
    tcp[4..8].copy_from_slice(&1000u32.to_be_bytes());
    tcp[12] = ((tcp_len / 4) as u8) << 4;
    tcp[13] = flags;
    tcp[14..16].copy_from_slice(&65535u16.to_be_bytes());
    if timestamps {
        tcp[20..24].copy_from_slice(&[1, 1, 8, 10]);
        tcp[24..28].copy_from_slice(&0x8c1a_2b3cu32.to_be_bytes());
        tcp[28..32].copy_from_slice(&0x00c0_ffeeu32.to_be_bytes());
    }
    let sum = checksum::pseudo_header_sum(src, dst, 6, tcp_len as u16) + checksum::sum(tcp);
    let c = checksum::finish(sum);
    tcp[16..18].copy_from_slice(&c.to_be_bytes());
    34 + tcp_len
}

/// The next of a xorshift sequence kept in `x`: the scrambled order the established
/// phases visit the sessions in, so that lookups miss the cache as real traffic's do.
fn scramble(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// Client address and port of flow `i` (distinct 5-tuples).
fn flow(i: u32) -> (Ipv4Addr, u16) {
    if ONE_CLIENT_PER_SESSION.load(std::sync::atomic::Ordering::Relaxed) {
        // 100.64.0.0/10: room for four million clients (never put on a wire).
        let host = Ipv4Addr::from(u32::from(Ipv4Addr::new(100, 64, 0, 0)) + i);
        return (host, 1024 + (i & 0x3fff) as u16);
    }
    let host = Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 128, 0)) + (i >> 14));
    (host, 1024 + (i & 0x3fff) as u16)
}

/// With `--persist`: every session from a client of its own, so each has a template of
/// its own (16384 sessions a client would share 62 templates among a million).
static ONE_CLIENT_PER_SESSION: std::sync::atomic::AtomicBool =
    std::sync::atomic::AtomicBool::new(false);

/// Writes an Ethernet/IPv6/TCP frame (no payload) with a valid checksum, with a
/// timestamps option when `timestamps`; returns its length.
fn tcp_frame6(
    buf: &mut [u8],
    src: Ipv6Addr,
    sport: u16,
    dst: Ipv6Addr,
    dport: u16,
    flags: u8,
    timestamps: bool,
) -> usize {
    let options = if timestamps { TS_OPTION_LEN } else { 0 };
    let tcp_len = 20 + options;
    buf[0..6].copy_from_slice(&LB_MAC);
    buf[6..12].copy_from_slice(&CLIENT_MAC);
    buf[12..14].copy_from_slice(&[0x86, 0xdd]);
    let ip = &mut buf[14..54];
    ip[0..4].copy_from_slice(&[0x60, 0, 0, 0]);
    ip[4..6].copy_from_slice(&(tcp_len as u16).to_be_bytes());
    ip[6] = 6;
    ip[7] = 64;
    ip[8..24].copy_from_slice(&src.octets());
    ip[24..40].copy_from_slice(&dst.octets());
    let tcp = &mut buf[54..54 + tcp_len];
    tcp.fill(0);
    tcp[0..2].copy_from_slice(&sport.to_be_bytes());
    tcp[2..4].copy_from_slice(&dport.to_be_bytes());
    tcp[4..8].copy_from_slice(&1000u32.to_be_bytes());
    tcp[12] = ((tcp_len / 4) as u8) << 4;
    tcp[13] = flags;
    tcp[14..16].copy_from_slice(&65535u16.to_be_bytes());
    if timestamps {
        tcp[20..24].copy_from_slice(&[1, 1, 8, 10]);
        tcp[24..28].copy_from_slice(&0x8c1a_2b3cu32.to_be_bytes());
        tcp[28..32].copy_from_slice(&0x00c0_ffeeu32.to_be_bytes());
    }
    let sum = checksum::pseudo_header_sum_v6(src, dst, 6, tcp_len as u32) + checksum::sum(tcp);
    let c = checksum::finish(sum);
    tcp[16..18].copy_from_slice(&c.to_be_bytes());
    54 + tcp_len
}

/// Greatest common divisor: a step coprime with N visits every index below N once.
fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Client address and port of IPv6 flow `i` (distinct 5-tuples, 2001:db8:8000::/48).
fn flow6(i: u32) -> (Ipv6Addr, u16) {
    let host = Ipv6Addr::new(0x2001, 0xdb8, 0x8000, 0, 0, 0, 0, 0x100 + (i >> 14) as u16);
    (host, 1024 + (i & 0x3fff) as u16)
}

/// The client side of the benchmark: IPv4 (`nat`, `fullnat`) or IPv6 (`nat6`,
/// `fullnat6`, `nat64`: NAT64 has IPv6 clients and VIP, IPv4 local addresses and
/// real servers).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Family {
    V4,
    V6,
    Nat64,
}

const VIP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 1);
const LB_IP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1);

/// Frame of flow `i` from its client to the VIP, in the family's addresses.
fn client_frame(family: Family, buf: &mut [u8], i: u32, flags: u8, timestamps: bool) -> usize {
    match family {
        Family::V4 => {
            let (c, p) = flow(i);
            tcp_frame(
                buf,
                c,
                p,
                Ipv4Addr::new(198, 18, 1, 1),
                80,
                flags,
                timestamps,
            )
        }
        Family::V6 | Family::Nat64 => {
            let (c, p) = flow6(i);
            tcp_frame6(buf, c, p, VIP6, 80, flags, timestamps)
        }
    }
}

fn main() {
    let sync = std::env::args().any(|a| a == "--sync");
    let timestamps = std::env::args().any(|a| a == "--timestamps");
    let synproxy = std::env::args().any(|a| a == "--synproxy");
    let exception = std::env::args().any(|a| a == "--exception");
    let park = std::env::args().any(|a| a == "--park");
    let replies = std::env::args().any(|a| a == "--replies");
    let foreign = std::env::args().any(|a| a == "--foreign");
    let persist: Option<u32> = std::env::args().find_map(|a| {
        a.strip_prefix("--persist=")
            .map(|s| s.parse().expect("--persist=SECONDS"))
    });
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let sessions: u32 = args
        .first()
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let packets: u64 = args
        .get(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(20_000_000);
    let (mode, family) = match args.get(2).map(String::as_str) {
        None | Some("nat") => (ForwardMode::Nat, Family::V4),
        Some("fullnat") => (ForwardMode::FullNat, Family::V4),
        Some("nat6") => (ForwardMode::Nat, Family::V6),
        Some("fullnat6") => (ForwardMode::FullNat, Family::V6),
        Some("nat64") => (ForwardMode::FullNat, Family::Nat64),
        Some(other) => panic!("mode {other:?}: expected nat, fullnat, nat6, fullnat6 or nat64"),
    };
    if persist.is_some() {
        assert!(
            sessions <= 1 << 22,
            "--persist: at most 4194304 sessions (clients)"
        );
        ONE_CLIENT_PER_SESSION.store(true, std::sync::atomic::Ordering::Relaxed);
    }
    if family != Family::V4 && (synproxy || replies) {
        panic!("--synproxy and --replies are measured over IPv4 only");
    }
    // The SYN proxy answers the SYN itself: its output is no real server's side.
    assert!(
        !(synproxy && replies),
        "--replies is measured without --synproxy"
    );
    let prefix = format!("sl-bench-{}", std::process::id());
    let eal_args: Vec<String> = [
        "nat_rewrite",
        "-l",
        "0",
        "--no-huge",
        "-m",
        "256",
        "--no-shconf",
        "--no-pci",
        "--file-prefix",
        &prefix,
        "--log-level",
        "lib.eal:error",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let eal = Eal::init(&eal_args).expect("EAL init (root needed)");
    let pool = Mempool::new("bench_pool", 1023, 64, 2048).expect("mempool");

    let vip = Ipv4Addr::new(198, 18, 1, 1);
    let lb_ip = Ipv4Addr::new(198, 18, 0, 1);
    let mut table = ServiceTable::new();
    let vip_addr: IpAddr = match family {
        Family::V4 => vip.into(),
        Family::V6 | Family::Nat64 => VIP6.into(),
    };
    let key = ServiceKey::new(Protocol::Tcp, vip_addr, 80);
    let persistence = persist.map(|timeout_s| sluice::model::Persistence {
        timeout_s,
        netmask: Ipv4Addr::BROADCAST,
        prefix6: sluice::model::Persistence::FULL_PREFIX6,
    });
    table
        .add_service(key, SchedulerKind::Rr, persistence)
        .unwrap();
    if mode == ForwardMode::FullNat {
        // Enough local addresses: each gives a worker 64 512 ports.
        let lips = (sessions as usize).div_ceil(60_000).max(1);
        for l in 0..lips as u8 {
            let lip: IpAddr = match family {
                Family::V4 | Family::Nat64 => Ipv4Addr::new(198, 18, 2, 1 + l).into(),
                Family::V6 => Ipv6Addr::new(0x2001, 0xdb8, 3, 0, 0, 0, 0, 1 + l as u16).into(),
            };
            table.add_laddr(key, lip).unwrap();
        }
    }
    let mut neighbours = NeighbourTable::with_capacity(4096);
    let mut neighbours6 = Vec::new();
    for r in 0..4u8 {
        let mac = MacAddr([0x02, 0x52, 0x53, 0, 0, r]);
        let ip: IpAddr = match family {
            Family::V4 | Family::Nat64 => {
                let ip = Ipv4Addr::new(198, 18, 0, 11 + r);
                neighbours.learn(ip, mac, 0);
                ip.into()
            }
            Family::V6 => {
                let ip = Ipv6Addr::new(0x2001, 0xdb8, 2, 0, 0, 0, 0, 0x11 + r as u16);
                neighbours6.push((ip, mac));
                ip.into()
            }
        };
        table
            .add_server(key, RealServerSpec::new(ip, 8080, 1, mode))
            .unwrap();
    }
    if synproxy {
        let on = sluice::model::SynProxy {
            mode: sluice::model::SynProxyMode::On,
            ..Default::default()
        };
        table.set_synproxy(key, on).unwrap();
    }
    let publisher = SnapshotPublisher::new(Snapshot::build(1, &table));
    // A template per client, in a table with room for twice as many (it is bucketed:
    // a full bucket evicts), as the daemon's shared one.
    let templates = persist.map(|_| {
        Arc::new(sluice::session::persist::PersistTable::with_capacity(
            2 * sessions as usize,
        ))
    });
    let hz = tsc_hz();
    // IPv6: the sync ring only when used, so that what grows with SESSIONS is the table.
    let ring_slots = if sync || family == Family::V4 {
        sessions as usize + 1
    } else {
        1
    };
    let rings = Arc::new(vec![
        sluice::dataplane::sync_events::EventRing::with_capacity(ring_slots),
    ]);
    // Headroom above the 1/64 of free slots under which each new session reclaims
    // half-open ones (a SYN flood's defence, in either family's table): all SESSIONS
    // must stay.
    let with_headroom = sessions as usize + sessions as usize / 32 + 64;
    let (capacity, capacity6) = match family {
        Family::V4 => (
            with_headroom,
            sluice::dataplane::forwarder::ipv6_capacity(with_headroom),
        ),
        Family::V6 | Family::Nat64 => (4096, with_headroom),
    };
    let config = ForwarderConfig {
        capacity6,
        // By default the table's size decides (`PARK_INDEX_BYTES`).
        park_new_sessions: park.then_some(true),
        persistence: templates.clone(),
        sync: sync.then(|| sluice::dataplane::forwarder::SyncLink {
            rings: rings.clone(),
            index: 0,
            policy: sluice::dataplane::sync_events::SyncPolicy::default(),
        }),
        ..ForwarderConfig::new(
            capacity,
            publisher.reader(),
            Timeouts::default().in_ticks(100),
            hz / 10,
            hz,
            Arc::new(realserver_stats::new_table()),
            RssView::default_spread(1, 0),
        )
    };
    let mut fwd = Forwarder::new(config);
    for (ip, mac) in neighbours6 {
        fwd.learn_shared_neighbour6(ip, mac, 0);
    }
    let counters = WorkerCounters::default();
    let responder = LocalResponder::new(LB_MAC, &[(lb_ip, 24)]).with_ipv6(&[LB_IP6]);
    let port = PortContext {
        redirected: false,
        responder: &responder,
        index: 0,
        mac: MacAddr(LB_MAC),
        addr: lb_ip,
        mtu: 1500,
        exception,
    };

    // Phase 1: open every session with a SYN.
    let mut bench = Bench {
        fwd: &mut fwd,
        pool: &pool,
        port: &port,
        neighbours: &mut neighbours,
        counters: &counters,
        burst_cycles: Vec::new(),
    };
    if synproxy {
        synproxy_phases(&mut bench, sessions, packets, vip, timestamps);
        return;
    }
    let live = |f: &Forwarder| match family {
        Family::V4 => f.sessions().len(),
        Family::V6 | Family::Nat64 => f.sessions6().len(),
    };
    // With `--replies` (IPv4): where each session's SYN went, the real server's side
    // of its connection (RIP:rport, and the client or local address and port it sees).
    let mut server_side: Vec<(Ipv4Addr, u16, Ipv4Addr, u16)> = Vec::new();
    if replies {
        server_side.resize(
            sessions as usize,
            (Ipv4Addr::UNSPECIFIED, 0, Ipv4Addr::UNSPECIFIED, 0),
        );
    }
    let (syn_cycles, created) = bench.run(
        sessions as u64,
        &mut |i, buf| client_frame(family, buf, i as u32, 0x02, timestamps),
        &mut |i, frame| {
            if let Some(side) = server_side.get_mut(i as usize) {
                let ip = |at: usize| {
                    Ipv4Addr::new(frame[at], frame[at + 1], frame[at + 2], frame[at + 3])
                };
                let port = |at: usize| u16::from_be_bytes([frame[at], frame[at + 1]]);
                *side = (ip(30), port(36), ip(26), port(34));
            }
        },
    );
    assert_eq!(
        created, sessions as u64,
        "every SYN must create a session and be forwarded"
    );
    assert_eq!(live(bench.fwd), sessions as usize);

    // Phase 1b: each session's first ACK establishes it (and, with sync, is synced).
    let (est_cycles, established) = bench.run(
        sessions as u64,
        &mut |i, buf| client_frame(family, buf, i as u32, 0x10, timestamps),
        &mut |_, _| {},
    );
    assert_eq!(established, sessions as u64);
    if sync {
        assert_eq!(
            rings[0].stats().pushed,
            sessions as u64,
            "one sync event per established session"
        );
    }

    // Phase 2: established traffic (ACKs) over the sessions in a scrambled order, so
    // lookups miss the cache as they would with real traffic.
    let mut x: u64 = 0x9e3779b97f4a7c15;
    let (ack_cycles, forwarded) = bench.run(
        packets,
        &mut |_, buf| {
            let i = scramble(&mut x) % sessions as u64;
            client_frame(family, buf, i as u32, 0x10, timestamps)
        },
        &mut |_, _| {},
    );
    assert_eq!(
        forwarded, packets,
        "every established packet must be forwarded"
    );
    let ack_median_burst = bench.median_burst_per_packet();
    // How far the filed keys (client and reply keys alike) lie from their home
    // buckets: a key past its home costs its lookup a bucket more for each bucket it
    // passed (the prefetch's third step loads the first of them).
    let buckets_per_lookup = match family {
        Family::V4 => bench.fwd.sessions().index_buckets_per_lookup(),
        Family::V6 | Family::Nat64 => bench.fwd.sessions6().index_buckets_per_lookup(),
    };

    // Phase 2f (`--foreign`): frames every node drops on their Ethernet header alone,
    // as an attacker on the link can send them: the same established segments from a
    // multicast source MAC, then to another host's MAC (which a promiscuous port
    // sees). What each costs, read against an established packet's cost.
    let foreign_phase = foreign.then(|| {
        let mut median = |edit: fn(&mut [u8])| {
            let mut x: u64 = 0x9e3779b97f4a7c15;
            let (_, forwarded) = bench.run(
                packets,
                &mut |_, buf| {
                    let i = scramble(&mut x) % sessions as u64;
                    let len = client_frame(family, buf, i as u32, 0x10, timestamps);
                    edit(buf);
                    len
                },
                &mut |_, _| {},
            );
            assert_eq!(forwarded, 0, "no such frame may be forwarded");
            bench.median_burst_per_packet()
        };
        let multicast_source = median(|buf| buf[6] |= 1);
        let other_host = median(|buf| buf[0..6].copy_from_slice(&[0x02, 0x99, 0, 0, 0, 9]));
        (multicast_source, other_host)
    });

    // Phase 2r (`--replies`, IPv4): the real servers' established ACKs to their
    // clients, in a scrambled order too: the reply direction (lookup by the reply key,
    // the server's acknowledgment read, SNAT or FullNAT's rewrite back, the client's
    // next hop).
    let reply_phase = replies.then(|| {
        let mut x: u64 = 0x2545f4914f6cdd1d;
        let (cycles, forwarded) = bench.run(
            packets,
            &mut |_, buf| {
                let i = scramble(&mut x) % sessions as u64;
                let (rip, rport, to, to_port) = server_side[i as usize];
                let len = tcp_frame(buf, rip, rport, to, to_port, 0x10, timestamps);
                set_seq_ack(buf, 5000, 1000);
                len
            },
            &mut |_, _| {},
        );
        assert_eq!(forwarded, packets, "every reply must be forwarded");
        (
            cycles as f64 / packets as f64,
            bench.median_burst_per_packet(),
        )
    });

    // Phase 2a (IPv4): the worker's housekeeping while every session lives, as its
    // loop calls `poll` (every 10 us), over four seconds of a clock moved by hand: the
    // wheel's walk, and with `--persist` every session's template renewed by its
    // visits.
    let housekeeping = (family == Family::V4).then(|| {
        const POLLS_PER_S: u64 = 100_000;
        const SECONDS: u64 = 4;
        let from = tsc();
        let start = tsc();
        for p in 1..=POLLS_PER_S * SECONDS {
            bench.fwd.poll(from + hz * p / POLLS_PER_S, &counters);
        }
        let spent = tsc() - start;
        assert_eq!(live(bench.fwd), sessions as usize, "nothing expires");
        // The forwarder's clock: ticks of 100 ms (`Timeouts::in_ticks(100)` above).
        let now_tick = ((from + hz * SECONDS) / (hz / 10)) as u32;
        let live_templates = templates.as_ref().map(|t| t.live(now_tick).count());
        (
            spent as f64 / (sessions as f64 * SECONDS as f64),
            live_templates,
        )
    });

    // Phase 2b (IPv4, for the expiry phase): every client closes, each session once, in
    // a scrambled order. A FIN shortens its session's deadline, which files the
    // session at once at the head of its new slot's list; the wheel's lists then run
    // through the slab in random order, as they do in a table whose slots have been
    // recycled, not in the order the sessions were made.
    if family == Family::V4 {
        let n = u64::from(sessions);
        let step = (n * 5 / 8..)
            .find(|&s| s > 0 && gcd(s, n) == 1)
            .unwrap_or(1);
        let (_, closed) = bench.run(
            n,
            &mut |i, buf| client_frame(family, buf, (i * step % n) as u32, 0x11, timestamps),
            &mut |_, _| {},
        );
        assert_eq!(closed, n, "every FIN must be forwarded");
    }

    // IPv4, measured: the pages of the slab and the index the kernel has resident now.
    // IPv6: the allocator's figure for the table (slab, index and creation order);
    // the measured one is the process's resident memory, `perf/rss_peak.sh` at two
    // sizes.
    let (bytes, bytes_how) = match family {
        Family::V4 => {
            let resident = fwd
                .sessions()
                .resident_bytes()
                .expect("mincore over the session table");
            let bytes = resident as f64 / fwd.sessions().capacity() as f64;
            (bytes, "resident (slab + index, mincore)")
        }
        Family::V6 | Family::Nat64 => {
            let t = fwd.sessions6();
            let bytes = t.memory_bytes() as f64 / t.capacity() as f64;
            (
                bytes,
                "allocated (IPv6 slab + index; measure with rss_peak.sh)",
            )
        }
    };
    // Phase 3 (IPv4): an hour on, every session's deadline has passed; the worker's
    // polls expire them, a budget at a time, as its housekeeping does, walking the
    // lists phase 2b scrambled.
    let expiry_cycles = (family == Family::V4).then(|| {
        let later = tsc() + hz * 3600;
        let start = tsc();
        let mut polls = 0u64;
        while live(&fwd) > 0 {
            fwd.poll(later, &counters);
            polls += 1;
            assert!(polls <= sessions as u64 + 100_000, "expiry never finished");
        }
        (tsc() - start) as f64 / sessions as f64
    });
    let ghz = hz as f64 / 1e9;
    println!("| figure | value |");
    println!("|---|---|");
    println!("| sessions in table | {sessions} |");
    println!(
        "| mode | {}{} |",
        mode.name(),
        match family {
            Family::V4 => "",
            Family::V6 => " (IPv6)",
            Family::Nat64 => " (NAT64: IPv6 client and VIP, IPv4 real servers)",
        }
    );
    println!("| session sync | {} |", if sync { "on" } else { "off" });
    println!("| established packets measured | {packets} |");
    println!(
        "| cycles/packet, established (classify+lookup+state+rewrite) | {:.1} |",
        ack_cycles as f64 / packets as f64
    );
    println!(
        "| cycles/packet, established, median burst | {:.1} |",
        ack_median_burst
    );
    if let Some((multicast_source, other_host)) = foreign_phase {
        println!("| cycles/frame, multicast source MAC (dropped), median burst | {multicast_source:.1} |");
        println!("| cycles/frame, another host's MAC (dropped), median burst | {other_host:.1} |");
    }
    if let Some((mean, median)) = reply_phase {
        println!("| cycles/packet, real servers' established ACKs (reply direction) | {mean:.1} |");
        println!("| cycles/packet, real servers' established ACKs, median burst | {median:.1} |");
    }
    println!(
        "| cycles/new session (SYN: schedule+insert+rewrite, FullNAT: +port) | {:.1} |",
        syn_cycles as f64 / sessions as f64
    );
    println!(
        "| cycles/establishing ACK (state change{}) | {:.1} |",
        if sync { " + sync event" } else { "" },
        est_cycles as f64 / sessions as f64
    );
    if let Some((c, live_templates)) = housekeeping {
        println!(
            "| cycles/session/second of housekeeping (poll every 10 us: wheel walk{}) | {c:.1} |",
            match persist {
                Some(s) => format!(", templates renewed, -p {s}"),
                None => String::new(),
            }
        );
        if let Some(n) = live_templates {
            println!("| templates live after 4 s of housekeeping | {n} |");
        }
    }
    if let Some(c) = expiry_cycles {
        println!("| cycles/expired session (polls until empty: wheel walk, accounting, keys out, slot freed) | {c:.1} |");
    }
    println!("| sync events pushed | {} |", rings[0].stats().pushed);
    println!("| table bytes per session, {bytes_how} | {bytes:.1} |");
    println!("| index buckets per lookup of a filed key, mean | {buckets_per_lookup:.3} |");
    println!("| TSC | {ghz:.2} GHz |");
    drop(fwd);
    drop(pool);
    drop(eal);
}

struct Bench<'a> {
    fwd: &'a mut Forwarder,
    pool: &'a Mempool,
    port: &'a PortContext<'a>,
    neighbours: &'a mut NeighbourTable,
    counters: &'a WorkerCounters,
    /// Cycles of each full burst of the last `run`: their median is robust to the
    /// bench thread losing its core now and then, which the total is not.
    burst_cycles: Vec<u64>,
}

impl Bench<'_> {
    /// The median full burst of the last `run`, per packet.
    fn median_burst_per_packet(&mut self) -> f64 {
        self.burst_cycles.sort_unstable();
        match self.burst_cycles.get(self.burst_cycles.len() / 2) {
            Some(&c) => c as f64 / BURST_SIZE as f64,
            None => f64::NAN,
        }
    }

    /// Runs `count` frames built by `build(i)` through `handle_burst`, a burst at a time,
    /// showing each transmitted frame `i` to `sent` (outside the measured time).
    /// Returns (cycles spent inside `handle_burst` only, frames forwarded).
    fn run(
        &mut self,
        count: u64,
        build: &mut dyn FnMut(u64, &mut [u8]) -> usize,
        sent: &mut dyn FnMut(u64, &[u8]),
    ) -> (u64, u64) {
        let mut cycles = 0u64;
        let mut forwarded = 0u64;
        let mut burst = Burst::new();
        let mut done = 0u64;
        self.burst_cycles.clear();
        self.burst_cycles.reserve(count as usize / BURST_SIZE + 1);
        while done < count {
            let n = (count - done).min(BURST_SIZE as u64) as usize;
            assert!(burst.alloc_from(self.pool, n), "mempool exhausted");
            for i in 0..n {
                // Room first (the mbuf's data length bounds the view), then the frame.
                burst.set_packet_len(i, 128);
                let len = build(done + i as u64, burst.packet_mut(i));
                burst.set_packet_len(i, len as u16);
            }
            let now = tsc();
            self.fwd.poll(now, self.counters);
            let start = tsc();
            let mut transmitted = [false; BURST_SIZE];
            // As the worker does: the whole burst through `handle_burst`.
            self.fwd.handle_burst(
                &mut burst,
                self.port,
                self.neighbours,
                now,
                self.counters,
                |_, _, i, action| {
                    if action == Action::Transmit {
                        forwarded += 1;
                        transmitted[i] = true;
                    }
                },
            );
            let spent = tsc() - start;
            cycles += spent;
            if n == BURST_SIZE {
                self.burst_cycles.push(spent);
            }
            for (i, _) in transmitted.iter().enumerate().take(n).filter(|(_, t)| **t) {
                sent(done + i as u64, burst.packet(i));
            }
            burst.free_all();
            done += n as u64;
        }
        (cycles, forwarded)
    }
}

/// Sets a TCP frame's sequence and acknowledgement numbers, checksum updated.
fn set_seq_ack(buf: &mut [u8], seq: u32, ack: u32) {
    let tcp = &mut buf[34..];
    let mut c = u16::from_be_bytes([tcp[16], tcp[17]]);
    for (at, new) in [(4, seq), (8, ack)] {
        let old = u32::from_be_bytes(tcp[at..at + 4].try_into().unwrap());
        tcp[at..at + 4].copy_from_slice(&new.to_be_bytes());
        c = checksum::update32(c, old, new);
    }
    tcp[16..18].copy_from_slice(&c.to_be_bytes());
}

/// The SYN proxy's phases over `sessions` connections, then `packets` established
/// client ACKs; prints the table.
fn synproxy_phases(b: &mut Bench, sessions: u32, packets: u64, vip: Ipv4Addr, timestamps: bool) {
    const ISN: u32 = 1000;
    let n = sessions as usize;
    let mut cookies = vec![0u32; n];
    let mut servers = vec![Ipv4Addr::UNSPECIFIED; n];
    // Where the real server answers: the client (NAT) or the local address (FullNAT).
    let mut sources = vec![(Ipv4Addr::UNSPECIFIED, 0u16); n];
    let rd = |f: &[u8], at: usize| u32::from_be_bytes(f[at..at + 4].try_into().unwrap());
    // 1. SYNs: each answered with a cookie SYN-ACK, no session.
    let (syn_cycles, answered) = b.run(
        sessions as u64,
        &mut |i, buf| {
            let (c, p) = flow(i as u32);
            tcp_frame(buf, c, p, vip, 80, 0x02, timestamps)
        },
        &mut |i, f| cookies[i as usize] = rd(f, 34 + 4),
    );
    assert_eq!(
        answered, sessions as u64,
        "every SYN answered with a cookie"
    );
    assert_eq!(b.fwd.sessions().len(), 0, "no session for a SYN");
    // 2. The clients' ACKs: cookie checked, session opened, SYN to the real server.
    let (ack_cycles, opened) = b.run(
        sessions as u64,
        &mut |i, buf| {
            let (c, p) = flow(i as u32);
            let len = tcp_frame(buf, c, p, vip, 80, 0x10, timestamps);
            set_seq_ack(buf, ISN + 1, cookies[i as usize].wrapping_add(1));
            len
        },
        &mut |i, f| {
            assert_eq!(f[34 + 13], 0x02, "the ACK became a SYN");
            servers[i as usize] = Ipv4Addr::from(rd(f, 30));
            sources[i as usize] = (
                Ipv4Addr::from(rd(f, 26)),
                u16::from_be_bytes([f[34], f[35]]),
            );
        },
    );
    assert_eq!(
        opened, sessions as u64,
        "every valid cookie opens a session"
    );
    assert_eq!(b.fwd.sessions().len(), n);
    // 3. The real servers' SYN-ACKs: absorbed, each becomes the ACK to its server.
    let (synack_cycles, spliced) = b.run(
        sessions as u64,
        &mut |i, buf| {
            let (c, p) = sources[i as usize];
            let len = tcp_frame(buf, servers[i as usize], 8080, c, p, 0x12, timestamps);
            set_seq_ack(buf, 5000, ISN + 1);
            len
        },
        &mut |_, f| assert_eq!(f[34 + 13], 0x10, "the SYN-ACK became an ACK"),
    );
    assert_eq!(spliced, sessions as u64);
    // 4. Established client ACKs in a scrambled order, translated to the server.
    let mut x: u64 = 0x9e3779b97f4a7c15;
    let (est_cycles, forwarded) = b.run(
        packets,
        &mut |_, buf| {
            let i = (scramble(&mut x) % sessions as u64) as usize;
            let (c, p) = flow(i as u32);
            let len = tcp_frame(buf, c, p, vip, 80, 0x10, timestamps);
            set_seq_ack(buf, ISN + 1, cookies[i].wrapping_add(1));
            len
        },
        &mut |_, f| assert_eq!(rd(f, 34 + 8), 5001, "ack in the server's space"),
    );
    assert_eq!(forwarded, packets);
    let per = |c: u64, k: u64| c as f64 / k as f64;
    println!("| figure | value |");
    println!("|---|---|");
    println!("| sessions | {sessions} |");
    println!("| SYN proxy | on |");
    println!("| timestamps | {timestamps} |");
    println!(
        "| cycles/SYN answered with a cookie | {:.1} |",
        per(syn_cycles, sessions as u64)
    );
    println!(
        "| cycles/cookie ACK (check + session + SYN to server) | {:.1} |",
        per(ack_cycles, sessions as u64)
    );
    println!(
        "| cycles/server SYN-ACK absorbed (ACK to server) | {:.1} |",
        per(synack_cycles, sessions as u64)
    );
    println!(
        "| cycles/proxied set-up (the three above) | {:.1} |",
        per(syn_cycles + ack_cycles + synack_cycles, sessions as u64)
    );
    println!(
        "| cycles/packet, established with translation | {:.1} |",
        per(est_cycles, packets)
    );
    println!("| TSC | {:.2} GHz |", tsc_hz() as f64 / 1e9);
}
