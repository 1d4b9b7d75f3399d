//! The forwarder under test: the golden tests' appliance (02:53:4c:00:00:01,
//! 198.18.0.1/24) with their services (DR, NAT, TUN, FullNAT with two local addresses)
//! plus TOA, persistence, a load-aware scheduler and a service whose real servers
//! all weigh 0 (answered with RST), read through the crate's own config reader; and
//! IPv6 services: NAT and DR, FullNAT v6 -> v6 with two IPv6 local addresses, and
//! NAT64 (IPv6 VIP, an IPv4 local address and IPv4 real servers).
use sluice::config::Config;
use sluice::daemon::Services;
use sluice::dataplane::counters::WorkerCounters;
use sluice::dataplane::forwarder::{
    Forwarder, ForwarderConfig, HealthTap, RssView, SyncLink, VrrpSenders,
};
use sluice::dataplane::neighbour::NeighbourTable;
use sluice::dataplane::probe_acks::ProbeAcks;
use sluice::dataplane::query::Query;
use sluice::dataplane::realserver_stats::{self, RealServerCounters};
use sluice::model::ForwardMode;
use sluice::service::{HealthOverlay, Snapshot, SnapshotPublisher};
use sluice::session::persist::PersistTable;
use sluice::session::replication::{RecordOp, RecordRepr};
use sluice::session::table6::Session6;
use sluice::session::{Session, TickTimeouts};
use sluice::wire::ethernet::MacAddr;
use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddrV4};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, OnceLock};

pub const LB_MAC: [u8; 6] = [0x02, 0x53, 0x4c, 0, 0, 1];
pub const LB_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
/// TSC ticks per second of the made-up clock, and per session tick (100 ms).
pub const HZ: u64 = 1_000_000_000;
pub const TSC_PER_TICK: u64 = HZ / 10;
pub const SESSIONS: usize = 64;
/// FullNAT local ports: few, so the pools run out.
pub const LOCAL_PORTS: std::ops::RangeInclusive<u16> = 40000..=40031;

pub const CONFIG: &str = r#"
[eal]
hugepages = false
memory_mb = 256
file_prefix = "fuzz"

[lcores]
management = 0
workers = [1]

[control]
socket = "/run/sluice/fuzz.sock"

[[ports]]
name = "lan0"
loopback = true
mac = "02:53:4c:00:00:01"
addresses = ["198.18.0.1/24", "2001:db8:18::1/64"]

[loopback]
peers = 4

[timeouts]
tcp = 30
tcpfin = 5
udp = 10
syn_recv = 3
syn_sent = 3
time_wait = 2
close = 1
close_wait = 5
last_ack = 5

[[services]]
proto = "tcp"
vip = "198.18.0.210"
port = 80
scheduler = "rr"
  [[services.real_servers]]
  ip = "198.18.0.11"
  port = 80
  mode = "dr"

[[services]]
proto = "udp"
vip = "198.18.0.210"
port = 3333
scheduler = "rr"
  [[services.real_servers]]
  ip = "198.18.0.11"
  port = 3333
  mode = "dr"

[[services]]
proto = "tcp"
vip = "198.18.0.220"
port = 80
scheduler = "rr"
  [[services.real_servers]]
  ip = "198.18.0.12"
  port = 8080
  mode = "nat"

[[services]]
proto = "udp"
vip = "198.18.0.220"
port = 3333
scheduler = "rr"
  [[services.real_servers]]
  ip = "198.18.0.12"
  port = 4444
  mode = "nat"

[[services]]
proto = "tcp"
vip = "198.18.0.230"
port = 80
scheduler = "rr"
  [[services.real_servers]]
  ip = "198.18.0.13"
  port = 80
  mode = "tun"

[[services]]
proto = "udp"
vip = "198.18.0.230"
port = 3333
scheduler = "rr"
  [[services.real_servers]]
  ip = "198.18.0.13"
  port = 3333
  mode = "tun"

[[services]]
proto = "tcp"
vip = "198.18.0.221"
port = 80
scheduler = "wlc"
persistence_timeout = 5
  [[services.real_servers]]
  ip = "198.18.0.14"
  port = 8080
  mode = "nat"
  [[services.real_servers]]
  ip = "198.18.0.15"
  port = 8080
  mode = "nat"

[[services]]
proto = "tcp"
vip = "198.18.0.222"
port = 80
scheduler = "rr"
  [[services.real_servers]]
  ip = "198.18.0.12"
  port = 8080
  mode = "nat"

[[services]]
proto = "tcp"
vip = "2001:db8:18::100"
port = 80
scheduler = "sh"
  [[services.real_servers]]
  ip = "2001:db8:18::21"
  port = 8080
  mode = "nat"
  [[services.real_servers]]
  ip = "2001:db8:18::22"
  port = 8080
  mode = "nat"

[[services]]
proto = "udp"
vip = "2001:db8:18::100"
port = 53
scheduler = "mh"
  [[services.real_servers]]
  ip = "2001:db8:18::21"
  port = 53
  mode = "dr"

[[services]]
proto = "tcp"
vip = "2001:db8:18::200"
port = 80
scheduler = "rr"
local_addresses = ["2001:db8:18::50", "2001:db8:18::51"]
  [[services.real_servers]]
  ip = "2001:db8:18::31"
  port = 8080
  mode = "fullnat"
  [[services.real_servers]]
  ip = "2001:db8:18::32"
  port = 8080
  mode = "fullnat"

[[services]]
proto = "udp"
vip = "2001:db8:18::200"
port = 53
scheduler = "rr"
local_addresses = ["2001:db8:18::50", "2001:db8:18::51"]
  [[services.real_servers]]
  ip = "2001:db8:18::31"
  port = 53
  mode = "fullnat"

[[services]]
proto = "tcp"
vip = "2001:db8:18::201"
port = 80
scheduler = "rr"
local_addresses = ["198.18.0.52"]
  [[services.real_servers]]
  ip = "198.18.0.23"
  port = 8080
  mode = "fullnat"
  [[services.real_servers]]
  ip = "198.18.0.24"
  port = 8080
  mode = "fullnat"

[[services]]
proto = "udp"
vip = "2001:db8:18::201"
port = 53
scheduler = "rr"
local_addresses = ["198.18.0.52"]
  [[services.real_servers]]
  ip = "198.18.0.23"
  port = 53
  mode = "fullnat"

[[services]]
proto = "tcp"
vip = "198.18.0.240"
port = 80
scheduler = "rr"
local_addresses = ["198.18.0.50", "198.18.0.51"]
toa = true
  [[services.real_servers]]
  ip = "198.18.0.21"
  port = 8080
  mode = "fullnat"
  [[services.real_servers]]
  ip = "198.18.0.22"
  port = 8080
  mode = "fullnat"

[[services]]
proto = "udp"
vip = "198.18.0.240"
port = 3333
scheduler = "mh"
local_addresses = ["198.18.0.50", "198.18.0.51"]
  [[services.real_servers]]
  ip = "198.18.0.21"
  port = 4444
  mode = "fullnat"
  [[services.real_servers]]
  ip = "198.18.0.22"
  port = 4444
  mode = "fullnat"

[[services]]
proto = "tcp"
vip = "198.18.0.250"
port = 443
scheduler = "rr"
  [[services.real_servers]]
  ip = "198.18.0.16"
  port = 443
  weight = 0
  mode = "nat"
"#;

/// Addresses frames are mostly made of: clients, the appliance, VIPs, real servers,
/// local addresses, VRRP's group, broadcast.
pub const ADDRS: &[Ipv4Addr] = &[
    Ipv4Addr::new(198, 18, 0, 100),
    Ipv4Addr::new(198, 18, 0, 101),
    Ipv4Addr::new(198, 51, 100, 7),
    LB_IP,
    Ipv4Addr::new(198, 18, 0, 210),
    Ipv4Addr::new(198, 18, 0, 220),
    Ipv4Addr::new(198, 18, 0, 221),
    Ipv4Addr::new(198, 18, 0, 222),
    Ipv4Addr::new(198, 18, 0, 230),
    Ipv4Addr::new(198, 18, 0, 240),
    Ipv4Addr::new(198, 18, 0, 250),
    Ipv4Addr::new(198, 18, 0, 11),
    Ipv4Addr::new(198, 18, 0, 12),
    Ipv4Addr::new(198, 18, 0, 13),
    Ipv4Addr::new(198, 18, 0, 14),
    Ipv4Addr::new(198, 18, 0, 15),
    Ipv4Addr::new(198, 18, 0, 16),
    Ipv4Addr::new(198, 18, 0, 21),
    Ipv4Addr::new(198, 18, 0, 22),
    Ipv4Addr::new(198, 18, 0, 50),
    Ipv4Addr::new(198, 18, 0, 51),
    Ipv4Addr::new(198, 18, 0, 52),
    Ipv4Addr::new(198, 18, 0, 23),
    Ipv4Addr::new(198, 18, 0, 24),
    Ipv4Addr::new(224, 0, 0, 18),
    Ipv4Addr::new(224, 0, 0, 81),
    Ipv4Addr::BROADCAST,
];

/// Ports: the services', the real servers', a few client ports, the local-port pool's
/// first ones, the sync and health-probe ports.
pub const PORTS: &[u16] = &[
    80, 3333, 8080, 4444, 443, 1024, 1025, 33000, 40000, 40001, 40002, 40003, 40016, 40017, 8848,
    50000,
];

/// TCP/UDP endpoints frames are mostly made of: clients, services, the appliance's
/// sync and probe ports, real servers, and local addresses with ports of their pools.
pub const ENDPOINTS: &[(Ipv4Addr, u16)] = &{
    const fn a(last: u8) -> Ipv4Addr {
        Ipv4Addr::new(198, 18, 0, last)
    }
    const FIXED: [(Ipv4Addr, u16); 33] = [
        (a(100), 33000),
        (a(100), 33001),
        (a(101), 1024),
        (Ipv4Addr::new(198, 51, 100, 7), 40000),
        (a(210), 80),
        (a(210), 3333),
        (a(220), 80),
        (a(220), 3333),
        (a(221), 80),
        (a(222), 80),
        (a(230), 80),
        (a(230), 3333),
        (a(240), 80),
        (a(240), 3333),
        (a(250), 443),
        (LB_IP, 8848),
        (LB_IP, 50000),
        (LB_IP, 80),
        (a(11), 80),
        (a(11), 3333),
        (a(12), 8080),
        (a(12), 4444),
        (a(13), 80),
        (a(14), 8080),
        (a(15), 8080),
        (a(16), 443),
        (a(21), 8080),
        (a(22), 8080),
        (a(21), 4444),
        (a(22), 4444),
        // NAT64's IPv4 real servers.
        (a(23), 8080),
        (a(24), 8080),
        (a(23), 53),
    ];
    // Local addresses .50, .51 (FullNAT) and .52 (NAT64), 16 ports of each pool.
    let mut all = [(LB_IP, 0); 81];
    let mut i = 0;
    while i < 33 {
        all[i] = FIXED[i];
        i += 1;
    }
    while i < 81 {
        let k = (i - 33) as u16;
        all[i] = (a(50 + (k / 16) as u8), 40000 + k % 16);
        i += 1;
    }
    all
};

const fn v6(last: u16) -> Ipv6Addr {
    Ipv6Addr::new(0x2001, 0xdb8, 0x18, 0, 0, 0, 0, last)
}

/// The port's IPv6 address (the config above).
pub const LB_IP6: Ipv6Addr = v6(1);

/// IPv6 addresses frames are mostly made of: clients, the appliance's address and
/// link-local address, the VIPs, real servers, local addresses, all-nodes, the
/// solicited-node groups of the appliance's address and of a VIP, and an
/// IPv4-mapped address (dropped on the wire).
pub const ADDRS6: &[Ipv6Addr] = &[
    v6(9),
    v6(0xa),
    Ipv6Addr::new(0x2001, 0xdb8, 0x99, 0, 0, 0, 0, 7),
    LB_IP6,
    Ipv6Addr::new(0xfe80, 0, 0, 0, 0x53, 0x4cff, 0xfe00, 1),
    v6(0x100),
    v6(0x200),
    v6(0x201),
    v6(0x21),
    v6(0x22),
    v6(0x31),
    v6(0x32),
    v6(0x50),
    v6(0x51),
    Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1),
    Ipv6Addr::new(0xff02, 0, 0, 0, 0, 1, 0xff00, 1),
    Ipv6Addr::new(0xff02, 0, 0, 0, 0, 1, 0xff00, 0x100),
    Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 0x21),
    Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0xc612, 0x0017),
    Ipv6Addr::UNSPECIFIED,
];

/// IPv6 TCP/UDP endpoints: clients, the services, the probe source, real servers,
/// and the IPv6 local addresses with ports of their pools.
pub const ENDPOINTS6: &[(Ipv6Addr, u16)] = &{
    const FIXED: [(Ipv6Addr, u16); 16] = [
        (v6(9), 33000),
        (v6(9), 33001),
        (v6(0xa), 1024),
        (v6(0x100), 80),
        (v6(0x100), 53),
        (v6(0x200), 80),
        (v6(0x200), 53),
        (v6(0x201), 80),
        (v6(0x201), 53),
        (LB_IP6, 50000),
        (v6(0x21), 8080),
        (v6(0x22), 8080),
        (v6(0x21), 53),
        (v6(0x31), 8080),
        (v6(0x32), 8080),
        (v6(0x31), 53),
    ];
    let mut all = [(LB_IP6, 0); 48];
    let mut i = 0;
    while i < 16 {
        all[i] = FIXED[i];
        i += 1;
    }
    while i < 48 {
        let k = (i - 16) as u16;
        all[i] = (v6(0x50 + k / 16), 40000 + k % 16);
        i += 1;
    }
    all
};

pub const MACS: &[[u8; 6]] = &[
    [2, 0, 0, 0, 1, 0],
    [2, 0, 0, 0, 0, 0x11],
    [2, 0, 0, 0, 0, 0x12],
    [2, 0, 0, 0, 0, 0x21],
    [0x01, 0x00, 0x5e, 0x00, 0x00, 0x12],
    [0x01, 0x00, 0x5e, 0x00, 0x00, 0x51],
];

pub struct Shared {
    pub publisher: SnapshotPublisher,
    pub timeouts: TickTimeouts,
    pub real_servers: Arc<Box<[RealServerCounters]>>,
    /// VIPs of NAT services and of FullNAT services, and the local addresses.
    pub nat_vips: HashSet<Ipv4Addr>,
    pub fullnat_vips: HashSet<Ipv4Addr>,
    pub lips: HashSet<Ipv4Addr>,
    /// IPv6 VIPs of FullNAT services with IPv6 local addresses, of NAT64 services
    /// (IPv4 local addresses), and the IPv6 local addresses.
    pub fullnat6_vips: HashSet<Ipv6Addr>,
    pub nat64_vips: HashSet<Ipv6Addr>,
    pub lips6: HashSet<Ipv6Addr>,
    /// Every real-server id of the snapshot.
    pub real_ids: Vec<u32>,
    /// Real servers with a known MAC (the one left out makes frames wait for ARP).
    pub resolved: Vec<Ipv4Addr>,
}

static SHARED: OnceLock<Shared> = OnceLock::new();

pub fn shared() -> &'static Shared {
    SHARED.get_or_init(|| {
        let cfg = Config::parse(CONFIG, std::path::Path::new("fuzz.toml")).expect("bed config");
        let services = Services::from_config(&cfg).expect("bed services");
        let mut overlay = HealthOverlay::default();
        let mut nat_vips = HashSet::new();
        let mut fullnat_vips = HashSet::new();
        let mut lips = HashSet::new();
        let mut fullnat6_vips = HashSet::new();
        let mut nat64_vips = HashSet::new();
        let mut lips6 = HashSet::new();
        let mut real_ids = Vec::new();
        let mut resolved = Vec::new();
        for s in services.table.services() {
            if s.real_servers.iter().all(|r| r.weight == 0) {
                overlay.reset_when_down.insert(s.key);
            }
            for r in &s.real_servers {
                real_ids.push(r.id);
                match r.mode {
                    ForwardMode::Nat => {
                        nat_vips.extend(s.key.vip4());
                    }
                    ForwardMode::FullNat => {
                        fullnat_vips.extend(s.key.vip4());
                        if let IpAddr::V6(vip) = s.key.vip {
                            if r.ip.is_ipv4() {
                                nat64_vips.insert(vip);
                            } else {
                                fullnat6_vips.insert(vip);
                            }
                        }
                    }
                    _ => {}
                }
                if r.ip.is_ipv4() && r.ipv4() != Ipv4Addr::new(198, 18, 0, 22) {
                    resolved.push(r.ipv4());
                }
            }
            lips.extend(s.local_addresses4());
            lips6.extend(s.local_addresses.iter().filter_map(|a| match a {
                IpAddr::V6(a) => Some(*a),
                IpAddr::V4(_) => None,
            }));
        }
        let snapshot = Snapshot::build_with(1, &services.table, &overlay, &[])
            .with_timeouts(services.timeouts);
        Shared {
            publisher: SnapshotPublisher::new(snapshot),
            timeouts: services.timeouts.in_ticks(100),
            real_servers: Arc::new(realserver_stats::new_table()),
            nat_vips,
            fullnat_vips,
            lips,
            fullnat6_vips,
            nat64_vips,
            lips6,
            real_ids,
            resolved,
        }
    })
}

/// The forwarder of this process (worker 0 of 2, so some NAT replies belong to the
/// other) with sync, persistence, health probes, VRRP and sync over the port turned
/// on, and its clock. Every input gets a fresh forwarder (with fresh persistence and
/// sync state) after checking that the previous input ended with every session expired;
/// the clock only moves on (the old sessions' ticks are long past).
pub struct Bed {
    pub fwd: Forwarder,
    pub now: u64,
    pub rings: Arc<Vec<sluice::dataplane::sync_events::EventRing>>,
}

thread_local! {
    static BED: std::cell::RefCell<Option<Bed>> = const { std::cell::RefCell::new(None) };
}

/// Runs `f` on the process's forwarder, reset for a new input.
pub fn with_bed<R>(f: impl FnOnce(&mut Bed) -> R) -> R {
    BED.with(|cell| {
        let mut slot = cell.borrow_mut();
        let bed = slot.get_or_insert_with(|| {
            let rings = sync_rings();
            Bed {
                fwd: new_forwarder(rings.clone()),
                now: HZ,
                rings,
            }
        });
        bed.begin();
        f(bed)
    })
}

impl Bed {
    fn begin(&mut self) {
        assert!(
            self.fwd.sessions().is_empty(),
            "the previous input left sessions"
        );
        // A minute on: whatever the last input left in time-based state is stale.
        self.now += 60 * HZ;
        self.rings = sync_rings();
        self.fwd = new_forwarder(self.rings.clone());
    }
}

fn sync_rings() -> Arc<Vec<sluice::dataplane::sync_events::EventRing>> {
    Arc::new(vec![
        sluice::dataplane::sync_events::EventRing::with_capacity(256),
    ])
}

/// The probe ports, each with a probe sent with ISN 0 (its answers acknowledge 1 to
/// 512), so that the fuzzer can reach both the answers handed up and those dropped.
fn probe_acks() -> Arc<ProbeAcks> {
    let acks = Arc::new(ProbeAcks::new(50000..=50003));
    for port in 50000..=50003 {
        acks.sent(port, 0);
    }
    acks
}

fn new_forwarder(rings: Arc<Vec<sluice::dataplane::sync_events::EventRing>>) -> Forwarder {
    let s = shared();
    let mut f = Forwarder::new(ForwarderConfig {
        local_ports: LOCAL_PORTS,
        persistence: Some(Arc::new(PersistTable::with_capacity(64))),
        health: Some(HealthTap {
            source: LB_IP,
            // The port's IPv6 address (the config above): probe answers to it are punted.
            sources6: vec!["2001:db8:18::1".parse().unwrap()],
            acks: probe_acks(),
            passive_syn_ms: 2000,
        }),
        // One of ADDRS, as for sync: its adverts are punted, the others' dropped.
        vrrp: VrrpSenders::Peers(vec![Ipv4Addr::new(198, 18, 0, 100)]),
        sync: Some(SyncLink {
            rings,
            index: 0,
            policy: sluice::dataplane::sync_events::SyncPolicy::default(),
        }),
        sync_port: Some((
            SocketAddrV4::new(LB_IP, 8848),
            Some(SocketAddrV4::new(Ipv4Addr::new(224, 0, 0, 81), 8848)),
        )),
        // One of ADDRS: datagrams from it reach the punt path, the others' are dropped.
        sync_peers: vec![Ipv4Addr::new(198, 18, 0, 100)],
        // The table is small: parking forced, so the burst's finishing is fuzzed too.
        park_new_sessions: Some(true),
        ..ForwarderConfig::new(
            SESSIONS,
            s.publisher.reader(),
            s.timeouts,
            TSC_PER_TICK,
            HZ,
            s.real_servers.clone(),
            RssView::default_spread(2, 0),
        )
    });
    // One IPv6 real server of each service known; the others wait for an NA.
    for (i, ip) in [v6(0x21), v6(0x31)].into_iter().enumerate() {
        f.learn_shared_neighbour6(ip, MacAddr([2, 0, 0, 0, 6, i as u8]), 0);
    }
    f
}

pub fn neighbours() -> NeighbourTable {
    let mut n = NeighbourTable::with_capacity(64);
    for (i, ip) in shared().resolved.iter().enumerate() {
        n.learn(*ip, MacAddr([2, 0, 0, 0, 0, 0x40 + i as u8]), 0);
    }
    n
}

/// Ports in use in each pool of the forwarder, summed.
pub fn pool_ports_in_use(f: &Forwarder) -> u64 {
    let (mut from, mut used) = (Some(0), 0);
    while let Some(at) = from {
        let mut q = Query::Pools {
            from: at,
            out: Vec::with_capacity(64),
            next: None,
        };
        f.answer(&mut q, 0, &NeighbourTable::with_capacity(1), 0);
        let Query::Pools { out, next, .. } = q else {
            unreachable!()
        };
        used += out.iter().map(|e| u64::from(e.counters.used)).sum::<u64>();
        from = next;
    }
    used
}

/// The forwarder's books agree: the session table with itself; FullNAT sessions
/// (IPv4 and NAT64) hold distinct local ports, whichever service they belong to (the
/// services that share a local address share its ports), exactly the pools' ports in use (those
/// inside the pools' range and addresses); each real server's active and inactive
/// gauges count its live sessions, IPv6 ones included.
pub fn check_books(f: &Forwarder) -> Result<(), String> {
    let s = shared();
    f.sessions().check_consistency()?;
    let mut held = HashSet::new();
    let mut per_real: HashMap<u32, (u64, u64)> = HashMap::new();
    for (_, session) in f.sessions().iter() {
        if session.mode == ForwardMode::FullNat && session.local_port != 0 {
            let lip = Ipv4Addr::from(session.local_addr);
            if s.lips.contains(&lip)
                && LOCAL_PORTS.contains(&session.local_port)
                && !held.insert((IpAddr::V4(lip), session.local_port))
            {
                return Err(format!("two sessions hold {lip}:{}", session.local_port));
            }
        }
        let e = per_real.entry(session.real()).or_default();
        if session.is_active() {
            e.0 += 1;
        } else {
            e.1 += 1;
        }
    }
    for (_, session) in f.sessions6().iter() {
        // NAT64 sessions hold a port of the service's IPv4 pool (their local address
        // IPv4-mapped); IPv6 FullNAT ones hold none (the table says which are taken).
        let lip = session.local_addr.to_ipv4_mapped();
        if let Some(lip) =
            lip.filter(|l| session.mode == ForwardMode::FullNat && s.lips.contains(l))
        {
            if LOCAL_PORTS.contains(&session.local_port)
                && !held.insert((IpAddr::V4(lip), session.local_port))
            {
                return Err(format!("two sessions hold {lip}:{}", session.local_port));
            }
        }
        let e = per_real.entry(session.real).or_default();
        if sluice::session::is_active(session.state()) {
            e.0 += 1;
        } else {
            e.1 += 1;
        }
    }
    let used = pool_ports_in_use(f);
    if used != held.len() as u64 {
        return Err(format!(
            "pools have {used} ports in use, sessions hold {}",
            held.len()
        ));
    }
    for id in &s.real_ids {
        let c = &s.real_servers[*id as usize];
        let got = (c.active.load(Relaxed), c.inactive.load(Relaxed));
        let want = per_real.get(id).copied().unwrap_or_default();
        if got != want {
            return Err(format!(
                "real server {id}: gauges (active, inactive) {got:?}, live sessions {want:?}"
            ));
        }
    }
    Ok(())
}

/// Lets every session expire (or, if it lives longer than the bed's timeouts, be
/// removed as the peer's removal record does), then checks that the table is empty,
/// every local port is back in its pool and the gauges are at zero.
pub fn drain(f: &mut Forwarder, now: &mut u64, counters: &WorkerCounters) -> Result<(), String> {
    // Ten minutes on, past every timeout of the bed's config: those sessions expire
    // (the wheel catches up a bounded number of entries per poll).
    *now += 600 * HZ;
    for _ in 0..1000 {
        if f.sessions().is_empty() && f.sessions6().is_empty() {
            break;
        }
        f.poll(*now, counters);
    }
    // Sessions installed by sync may live up to MAX_TIMEOUT_SECS (24.8 days): the
    // peer's removal records clear them instead. One whose deadline passed and is
    // still here is a timer bug.
    let tick = (*now / TSC_PER_TICK) as u32;
    let overdue: Vec<String> = f
        .sessions6()
        .iter()
        // Ticks wrap (10 minutes an input: a long run passes u32::MAX ticks of
        // 100 ms): compared as a signed distance, as the wheel does.
        .filter(|(_, s)| (tick.wrapping_sub(s.deadline()) as i32) >= 0)
        .map(|(id, s)| format!("{id} deadline {} {s:?}", s.deadline()))
        .collect();
    if !overdue.is_empty() {
        return Err(format!(
            "{} IPv6 sessions past their deadline never expired (clock at tick {tick}): {overdue:?}",
            overdue.len()
        ));
    }
    let left6: Vec<Session6> = f.sessions6().iter().map(|(_, s)| *s).collect();
    for s in &left6 {
        f.install(&RecordRepr::connection6(s, RecordOp::Remove, 0));
    }
    if !f.sessions6().is_empty() {
        return Err(format!(
            "{} IPv6 sessions left after their removal records",
            f.sessions6().len()
        ));
    }
    let left: Vec<Session> = f.sessions().iter().map(|(_, s)| *s).collect();
    for s in &left {
        f.install(&RecordRepr::connection(s, RecordOp::Remove, 0));
    }
    if !f.sessions().is_empty() {
        let left: Vec<String> = f
            .sessions()
            .iter()
            .map(|(id, s)| format!("{id:?} deadline {} {s:?}", s.deadline()))
            .collect();
        return Err(format!(
            "{} sessions never expired (clock at tick {}, wheel at {}): {left:?}",
            f.sessions().len(),
            *now / TSC_PER_TICK,
            f.sessions().wheel_tick()
        ));
    }
    check_books(f)?;
    let used = pool_ports_in_use(f);
    if used != 0 {
        return Err(format!("{used} local ports still in use with no session"));
    }
    Ok(())
}
