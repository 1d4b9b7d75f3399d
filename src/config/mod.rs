//! The daemon's TOML configuration: EAL settings, lcores, control socket, ports, the
//! loopback peer emulator, session timeouts and table sizes, and the virtual services
//! with their real servers. `docs/CONFIG.md` is the reference for the file format;
//! `config/*.toml` are commented examples.
//!
//! Loading is strict: unknown keys are rejected by name, and every error carries the
//! file, line, column and field path of the offending value, e.g.
//! `config/x.toml:14:13: ports[0].addresses[1]: "198.18.0.300/24" is not an IPv4
//! address with prefix (expected a.b.c.d/n)`.
//!
//! How: `tree` parses the text into values that remember their byte offsets,
//! `reader` gives typed, path-aware access to them, `fields` validates each kind of
//! field, and `schema` knows the layout, the defaults and the cross-field rules.

mod cidr;
mod fields;
pub mod keepalived;
mod reader;
mod schema;
mod source;
mod tree;

#[cfg(test)]
mod tests;

use std::fmt;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

pub use cidr::{Ipv4Cidr, Ipv6Cidr, ParseCidrError};

use crate::model::SchedulerKind;
use crate::model::{ForwardMode, ServiceKey};

use source::Source;

/// A loaded, validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The file it was loaded from (for messages and reloads).
    pub path: PathBuf,
    /// The text it was read from, kept so that a check made after loading (the
    /// daemon's preflight) names the line of the field it refuses ([`Config::place`]).
    pub text: ConfigText,
    pub eal: EalConfig,
    pub lcores: LcoreConfig,
    pub control: ControlConfig,
    pub ports: Vec<PortConfig>,
    /// The peer emulator; defaults when the file has no `[loopback]` section.
    pub loopback: LoopbackConfig,
    /// Session idle timeouts; ipvsadm's defaults when there is no `[timeouts]`.
    pub timeouts: TimeoutsConfig,
    /// Session table sizing; defaults when there is no `[sessions]`.
    pub sessions: SessionsConfig,
    /// Health checking's defaults and probe source; defaults when there is no
    /// `[health]` (no active check, no passive detection).
    pub health: crate::health::spec::HealthConfig,
    /// VRRPv3 failover (`[vrrp]`); without it this node always serves its VIPs.
    pub vrrp: Option<VrrpSettings>,
    /// Session sync to peers (`[sync]`); off without it.
    pub sync: Option<SyncSettings>,
    /// BGP announcements of the VIPs through BIRD (`[bgp]`, docs/CLUSTER.md); off
    /// without it.
    pub bgp: Option<crate::ha::bgp::BgpSettings>,
    /// The virtual services, in file order (none when there is no `[[services]]`).
    pub services: Vec<ServiceConfig>,
}

/// `[eal]`: how DPDK's environment is initialised.
#[derive(Debug, Clone, PartialEq)]
pub struct EalConfig {
    /// false: run on ordinary memory (`--no-huge --no-shconf`), for tests and demos.
    pub hugepages: bool,
    /// Memory to reserve at startup, in MB (`-m`).
    pub memory_mb: u32,
    /// `--file-prefix`: separates the runtime files of DPDK processes on one host.
    pub file_prefix: String,
    /// Appended verbatim to the EAL argv.
    pub extra_args: Vec<String>,
}

impl Default for EalConfig {
    fn default() -> Self {
        EalConfig {
            hugepages: true,
            memory_mb: 256,
            file_prefix: "sluice".to_string(),
            extra_args: Vec::new(),
        }
    }
}

/// `[lcores]`: which CPU cores (DPDK lcore ids) do what.
#[derive(Debug, Clone, PartialEq)]
pub struct LcoreConfig {
    /// The main lcore: control socket, stats, health checks, sync.
    pub management: u32,
    /// Worker i polls RX queue i and transmits on TX queue i of every port.
    pub workers: Vec<u32>,
    /// The CPU each worker lcore runs on, when not its own id (EAL `--lcores
    /// lcore@cpu`): lets several workers share a CPU for functional tests of the
    /// multi-worker data plane on a small machine (oversubscribed: not for speed).
    pub cpus: Option<Vec<u32>>,
    /// Microseconds an idle worker sleeps between polls once it found nothing for a
    /// while; 0 (the default) polls without pause, as a dedicated core should.
    pub idle_sleep_us: u32,
}

/// `[control]`: the management interface.
#[derive(Debug, Clone, PartialEq)]
pub struct ControlConfig {
    /// The Unix socket sluicectl connects to (absolute, < 108 bytes).
    pub socket: PathBuf,
    /// Where the Prometheus endpoint listens (`GET /metrics`); none by default.
    pub metrics: Option<std::net::SocketAddr>,
    /// The group the socket is given (mode 0660 then, else 0600 for root only).
    pub group: Option<ControlGroup>,
}

/// `control.group`, resolved when the config is read (a missing group is a config
/// error, not a start-up surprise).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControlGroup {
    pub name: String,
    pub gid: u32,
}

/// One `[[ports]]` table: a NIC or virtual device and the appliance's addresses on it.
#[derive(Debug, Clone, PartialEq)]
pub struct PortConfig {
    pub name: String,
    pub device: PortDevice,
    /// Overrides the device's own MAC address.
    pub mac: Option<[u8; 6]>,
    /// The appliance's own IPv4 addresses on this port (1..=16); ARP and ICMP are
    /// answered for these.
    pub addresses: Vec<Ipv4Cidr>,
    /// Its IPv6 addresses (0..=16), given in the same `addresses` list; Neighbor
    /// Solicitations and ICMPv6 echo are answered for these.
    pub addresses6: Vec<Ipv6Cidr>,
    pub rx_desc: u16,
    pub tx_desc: u16,
    /// Toeplitz key (40 or 52 bytes); `None` keeps the driver's default.
    pub rss_key: Option<Vec<u8>>,
    pub mtu: Option<u16>,
    /// `[ports.exception]`: the kernel interface paired with this port.
    pub exception: Option<ExceptionConfig>,
    /// Neighbours whose MAC the operator fixes: ARP and Neighbor Discovery never
    /// change them (a host on the link that forges their address gets nothing).
    pub static_neighbours: Vec<StaticNeighbour>,
}

/// One of `ports[].static_neighbours`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StaticNeighbour {
    pub address: std::net::IpAddr,
    pub mac: [u8; 6],
}

/// `[ports.exception]`: a kernel interface paired with the port. Frames for the
/// port's own addresses that Sluice does not handle itself go up to it, and what the
/// kernel writes to it leaves through the port (docs/EXCEPTION_PATH.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExceptionConfig {
    pub kind: ExceptionKind,
    /// The kernel interface's name.
    pub interface: String,
    /// Frames handed to the kernel per second at most, over all workers.
    pub rate: u32,
    /// Slots of each ring between the workers and the kernel interface (a power of two).
    pub ring_size: u32,
    /// The line of `kind`, for the preflight check's error.
    pub kind_line: usize,
}

/// What the kernel interface is made of.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExceptionKind {
    /// DPDK's TAP PMD (`net_tap`, /dev/net/tun).
    Tap,
    /// DPDK's virtio-user PMD with the vhost-net backend (/dev/vhost-net).
    VirtioUser,
}

impl ExceptionKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ExceptionKind::Tap => "tap",
            ExceptionKind::VirtioUser => "virtio-user",
        }
    }
}

impl ExceptionConfig {
    /// Frames per second handed up when `rate` is not set: a few BGP/BFD sessions
    /// and an SSH login need far less; a flood gets no more.
    pub const DEFAULT_RATE: u32 = 10_000;
    /// Ring slots when `ring_size` is not set: 1024 frames wait at most one 5 ms
    /// management tick, i.e. up to ~200k frames/s would pass.
    pub const DEFAULT_RING_SIZE: u32 = 1024;

    /// The vdev name and EAL `--vdev` spec of port `index`'s kernel interface.
    pub fn vdev(&self, index: usize) -> (String, String) {
        match self.kind {
            ExceptionKind::Tap => {
                let name = format!("net_tap_sx{index}");
                let spec = format!("{name},iface={}", self.interface);
                (name, spec)
            }
            ExceptionKind::VirtioUser => {
                let name = format!("virtio_user_sx{index}");
                let spec = format!(
                    "{name},path=/dev/vhost-net,iface={},queue_size={}",
                    self.interface,
                    self.ring_size.min(1024)
                );
                (name, spec)
            }
        }
    }
}

/// Where a port's packets come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PortDevice {
    /// A PCI NIC bound to a DPDK driver, in full form "0000:03:00.0" (EAL `-a`).
    Pci(String),
    /// A virtual device spec, e.g. "net_af_packet0,iface=veth0" (EAL `--vdev`).
    Vdev(String),
    /// An in-process net_ring pair; the built-in peer emulator drives the far side.
    Loopback,
}

/// `[loopback]`: the built-in peer emulator behind a `loopback = true` port.
#[derive(Debug, Clone, PartialEq)]
pub struct LoopbackConfig {
    /// Emulated neighbours, at the port's first address +1, +2, ...
    pub peers: u16,
    /// Each peer sends ARP, then ICMP echo, at this interval.
    pub ping_interval_ms: u64,
    /// Every Nth emulated frame is malformed (0 = never).
    pub garbage_every: u32,
    /// How often the daemon prints testpmd-style stats.
    pub stats_interval_ms: u64,
}

impl Default for LoopbackConfig {
    fn default() -> Self {
        LoopbackConfig {
            peers: 4,
            ping_interval_ms: 100,
            garbage_every: 10,
            stats_interval_ms: 1000,
        }
    }
}

/// `[timeouts]`: how long an idle session is kept, per TCP state and for UDP, in
/// seconds. The defaults are those of IPVS (`ipvsadm --set 900 120 300` and the
/// kernel's per-state table).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TimeoutsConfig {
    /// ESTABLISHED (`ipvsadm --set` tcp).
    pub tcp_s: u32,
    /// FIN_WAIT (`ipvsadm --set` tcpfin).
    pub tcpfin_s: u32,
    /// Any UDP session (`ipvsadm --set` udp).
    pub udp_s: u32,
    pub syn_recv_s: u32,
    pub syn_sent_s: u32,
    pub time_wait_s: u32,
    pub close_s: u32,
    pub close_wait_s: u32,
    pub last_ack_s: u32,
}

impl Default for TimeoutsConfig {
    fn default() -> Self {
        TimeoutsConfig {
            tcp_s: 900,
            tcpfin_s: 120,
            udp_s: 300,
            syn_recv_s: 60,
            syn_sent_s: 120,
            time_wait_s: 120,
            close_s: 10,
            close_wait_s: 60,
            last_ack_s: 30,
        }
    }
}

/// `[sessions]`: the per-worker session tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionsConfig {
    /// Sessions each worker can hold (not necessarily a power of two).
    pub capacity: u32,
    /// Timer-wheel tick in milliseconds: timeouts are accurate to about one tick.
    pub tick_ms: u32,
    /// FullNAT local ports handed out, per local address and worker (inclusive).
    pub local_port_first: u16,
    pub local_port_last: u16,
    /// How long the real servers keep a closed connection in TIME-WAIT, in seconds
    /// (Linux: 60): FullNAT local ports reused sooner towards the same server are
    /// counted and warned about.
    pub server_time_wait_s: u32,
    /// FullNAT TCP sessions carry their timestamps on Sluice's clock, so that real
    /// servers accept a local port reused within their TIME-WAIT.
    pub rewrite_timestamps: bool,
    /// `icmp_error_rate` and `icmp_error_burst`: the ICMP errors Sluice writes
    /// itself (Packet Too Big, frag-needed) per second and in a burst, for the whole
    /// appliance (RFC 4443 section 2.4(f)); the prefix length is unused.
    pub icmp_error_limit: crate::service::RateLimit,
    /// Entries each worker's IPv4 and IPv6 neighbour tables hold. Real and sorry
    /// servers' distinct addresses may fill three quarters of it
    /// ([`SessionsConfig::server_addresses`]).
    pub neighbours: u32,
    /// Persistence templates (client network, service -> real server) the appliance
    /// keeps, shared by every worker, for IPv4 services; IPv6 ones have an eighth as
    /// many (`session::persist`).
    pub persistence_templates: u32,
}

impl SessionsConfig {
    /// Distinct real and sorry server addresses of one family the service table
    /// takes: every worker keeps a neighbour entry for each, and a quarter of the
    /// table stays for the rest (gateways, VRRP and sync peers, clients on the link).
    pub fn server_addresses(&self) -> u32 {
        self.neighbours - self.neighbours / 4
    }
}

impl Default for SessionsConfig {
    fn default() -> Self {
        SessionsConfig {
            capacity: 1 << 20,
            tick_ms: 100,
            local_port_first: 1024,
            local_port_last: 65535,
            server_time_wait_s: 60,
            rewrite_timestamps: true,
            icmp_error_limit: crate::service::admission::DEFAULT_ICMP_ERROR_LIMIT,
            neighbours: crate::dataplane::worker::NEIGHBOUR_CAPACITY as u32,
            persistence_templates: 1 << 18,
        }
    }
}

/// One `[[services]]` table: a virtual service (`ipvsadm -A`) and its real servers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceConfig {
    /// Protocol, VIP and port; unique across services.
    pub key: ServiceKey,
    pub scheduler: SchedulerKind,
    /// `ipvsadm -p [timeout] -M netmask` (a prefix length for an IPv6 service).
    pub persistence: Option<crate::model::Persistence>,
    /// In file order (`ipvsadm -a`); may be empty.
    pub real_servers: Vec<RealServerConfig>,
    /// FullNAT local addresses (`ipvsadm --add-laddr`, as in DPVS), in file order:
    /// at most 64, no duplicates, none a VIP, a real server or a port's own address.
    /// Required (at least one) when a real server uses `mode = "fullnat"`.
    pub local_addresses: Vec<std::net::IpAddr>,
    /// TOA: the client address as a TCP option in FullNAT sessions (tcp only).
    pub toa: bool,
    /// `sloppy_tcp`: sessions open from any TCP segment but an RST (tcp only, no
    /// fullnat real server or sorry server).
    pub sloppy_tcp: bool,
    /// `synproxy`, `synproxy_auto_syn_rate` and `synproxy_syn_retries`: the SYN proxy
    /// (tcp, nat and fullnat real servers only).
    pub synproxy: crate::model::SynProxy,
    /// `ipvsadm -b`: scheduler flags (only the scheduler's own).
    pub sched_flags: crate::model::SchedFlags,
    /// Maglev table size (mh), a prime; the default 65537 when `None`.
    pub mh_table_size: Option<u32>,
    /// The service's `health` table: what it changes in `[health]`'s check.
    pub health: crate::health::spec::CheckOverride,
    /// What new connections get when no real server can take them; `[health]`'s
    /// `all_down` when `None`.
    pub all_down: Option<crate::health::spec::AllDown>,
    /// Access list (`acl_allow`, `acl_deny`, `acl_file`): each prefix once; the
    /// longest matching prefix decides a new connection.
    pub acl: Vec<(crate::service::AclAction, crate::service::Prefix)>,
    /// `rate_limit`, `rate_limit_burst`, `rate_limit_prefix`: new connections per
    /// second per source.
    pub rate_limit: Option<crate::service::RateLimit>,
    /// `sorry_server`: the fallback real server, given new connections only while no
    /// real server can take them.
    pub sorry_server: Option<SorryServerConfig>,
    /// The line of the service's `[[services]]` header (or inline table), so later
    /// errors about the service (e.g. from the data plane) can point at it.
    pub line: usize,
}

/// `[vrrp]`: one virtual router whose addresses are every VIP and local address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VrrpSettings {
    /// 1..=255, the same on every peer.
    pub vrid: u8,
    /// 1..=255 (255: the address owner); default 100.
    pub priority: u8,
    /// 10..=40950, a multiple of 10 (VRRPv3 counts centiseconds); default 1000.
    pub advert_interval_ms: u32,
    /// A higher-priority backup takes over from a lower-priority master; default true.
    pub preempt: bool,
    /// Source of advertisements and tie breaker; the first port's first address when
    /// `None`.
    pub source: Option<Ipv4Addr>,
    /// Virtual addresses besides the VIPs and local addresses, e.g. the NAT real
    /// servers' gateway, which must move with the master.
    pub addresses: Vec<Ipv4Addr>,
    /// The other routers' addresses: the only senders whose advertisements count.
    /// Empty only with the explicit `any_peer = true`.
    pub peers: Vec<Ipv4Addr>,
    /// `any_peer = true`: adverts from any sender on the link count (`peers` empty).
    pub any_peer: bool,
    /// `unicast = true`: adverts go to each of `peers` instead of 224.0.0.18.
    pub unicast: bool,
    /// Shared by the Sluice nodes of the group: adverts are sealed with it and only
    /// sealed ones count. `None` only with the explicit `unauthenticated = true`.
    pub key: Option<SecretHex>,
    /// The file the key was read from (`key_file`), or `None` when it is written in
    /// the config (or absent).
    pub key_file: Option<std::path::PathBuf>,
    /// How far a sender's clock may be from this node's for its first advert after
    /// this node's start to count (the replay bound then), and how far ahead any
    /// advert's may be; default 60 s.
    pub max_clock_skew_ms: u32,
    /// With `key`: adverts without a trailer count too (switching a running group to
    /// a key); default false.
    pub accept_unsealed: bool,
}

/// Key material as written in the config (hex): compared and cloned as a string, never
/// shown by `Debug`, so no debug print of the settings can log it.
#[derive(Clone, PartialEq, Eq)]
pub struct SecretHex(String);

impl SecretHex {
    pub fn new(hex: &str) -> SecretHex {
        SecretHex(hex.to_string())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for SecretHex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SecretHex(..)")
    }
}

/// `[sync]`: sessions sent to and received from peers over UDP, on a kernel interface
/// of the management side or, with `port`, through the data plane (docs/SYNC.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncSettings {
    /// Local UDP address messages are sent from and received on.
    pub listen: std::net::SocketAddrV4,
    /// `port = "NAME"`: sync travels as Ethernet/IPv4/UDP frames through this DPDK
    /// port (the first one; `listen` is one of its addresses) instead of a kernel
    /// socket.
    pub port: Option<String>,
    /// Where messages go; their addresses are the only accepted sources.
    pub peers: Vec<std::net::SocketAddrV4>,
    /// IPv4 multicast group (224.0.0.0/4) and port: session batches are sent once to
    /// it instead of once per peer, and received from it (joined on the interface that
    /// holds `listen`). Resync requests and dumps stay unicast. `peers` still lists
    /// the only accepted senders.
    pub multicast: Option<std::net::SocketAddrV4>,
    /// HMAC-SHA256 key (hex, at least 16 bytes): every message sealed and checked.
    /// `None` only with the explicit `unauthenticated = true`.
    pub key: Option<SecretHex>,
    /// The file the key was read from (`key_file`), or `None` when it is written in
    /// the config itself (or there is none).
    pub key_file: Option<std::path::PathBuf>,
    /// UDP flows are first synced at this many packets (IPVS sync_threshold).
    pub threshold: u32,
    /// Busy sessions are synced again at least this often (ms).
    pub period_ms: u32,
    /// Largest datagram.
    pub mtu: u16,
    /// Records a bulk resync dump lists per management turn at most, over all dumps
    /// under way (besides the turn's chunk budget and a 2 ms listing time): a lower
    /// value spreads a dump over more turns.
    pub dump_records_per_turn: u32,
}

/// One `[[services.real_servers]]` table (`ipvsadm -a`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RealServerConfig {
    pub ip: std::net::IpAddr,
    /// Defaults to the service port; may differ only for nat and fullnat.
    pub port: u16,
    /// `-w`: 0..=65535; 0 takes no new sessions (drain).
    pub weight: u32,
    pub mode: ForwardMode,
    /// The real server's `health` table: what it changes in its service's check.
    pub health: crate::health::spec::CheckOverride,
    /// `-x`: stop sending new sessions at this many active ones (0 = no limit).
    pub upper: u32,
    /// `-y`: resume below this many (0 = IPVS's default of 3/4 of `upper`).
    pub lower: u32,
}

/// A service's `sorry_server` table (keepalived's `sorry_server`,
/// `sorry_server_inhibit`, `sorry_server_lvs_method`): `port` defaults to the
/// service's, `mode` to dr (as a real server's), `inhibit` to false.
pub type SorryServerConfig = crate::model::SorryServerSpec;

/// Why a config file was rejected, and where.
///
/// Displays as `{file}:{line}:{column}: {field}: {message}`, the form editors and
/// terminals recognise. `line` and `column` are 1-based and point at the offending
/// value, or at the table header when a key is missing (1:1 for the top level).
/// `line == 0` means the file could not be read at all; it displays as
/// `{file}: {message}`.
#[derive(Debug, Clone, PartialEq)]
pub struct ConfigError {
    pub file: PathBuf,
    pub line: usize,
    pub column: usize,
    /// Field path such as `ports[0].addresses[1]`; empty if not about one field.
    pub field: String,
    pub message: String,
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let file = self.file.display();
        if self.line == 0 {
            return write!(f, "{file}: {}", self.message);
        }
        write!(f, "{file}:{}:{}: ", self.line, self.column)?;
        if !self.field.is_empty() {
            write!(f, "{}: ", self.field)?;
        }
        f.write_str(&self.message)
    }
}

impl std::error::Error for ConfigError {}

impl Config {
    /// Reads and validates `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: path.to_path_buf(),
            line: 0,
            column: 0,
            field: String::new(),
            message: format!("cannot read config file: {e}"),
        })?;
        Config::parse(&text, path)
    }

    /// Validates `text`; `path` is kept in `Config::path`, named in errors, and the
    /// directory files the config names (`acl_file`, `[sync] key_file`) are found from.
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let source = Source::new(text, path);
        let root = tree::parse(text).map_err(|e| source.syntax_error(&e))?;
        schema::read_config(&root, &source).map_err(|e| source.error(e))
    }

    /// The EAL argv (argv[0] = "sluice"):
    /// `-l <mgmt,workers...> --main-lcore <mgmt> --file-prefix <p>`, then
    /// `--no-huge -m <mb> --no-shconf` without hugepages or `-m <mb>
    /// --huge-unlink=always` with them,
    /// then `--no-pci` or `-a <pci>` per PCI port, `--vdev <spec>` per vdev port,
    /// and finally `extra_args`. Loopback ports are not in the argv: the daemon
    /// creates them after EAL init with `rte_eth_from_rings`.
    pub fn eal_args(&self) -> Vec<String> {
        let mut args: Vec<String> = vec!["sluice".into()];
        let lcores = &self.lcores;
        match &lcores.cpus {
            None => {
                let ids: Vec<String> = std::iter::once(lcores.management)
                    .chain(lcores.workers.iter().copied())
                    .map(|id| id.to_string())
                    .collect();
                args.extend(["-l".into(), ids.join(",")]);
            }
            Some(cpus) => {
                let map: Vec<String> = std::iter::once((lcores.management, lcores.management))
                    .chain(lcores.workers.iter().copied().zip(cpus.iter().copied()))
                    .map(|(lcore, cpu)| format!("{lcore}@{cpu}"))
                    .collect();
                args.extend(["--lcores".into(), map.join(",")]);
            }
        }
        args.extend(["--main-lcore".into(), self.lcores.management.to_string()]);
        args.extend(["--file-prefix".into(), self.eal.file_prefix.clone()]);
        let memory = self.eal.memory_mb.to_string();
        if self.eal.hugepages {
            args.extend(["-m".into(), memory]);
            // The hugepage files go as soon as they are mapped, so none outlives the
            // process (the EAL otherwise leaves most of them behind, even after a
            // clean exit). Not with options that exclude it: `--in-memory` makes no
            // files, `--single-file-segments` refuses it, or an explicit choice.
            let excluded = self.eal.extra_args.iter().any(|a| {
                a.starts_with("--huge-unlink")
                    || a == "--single-file-segments"
                    || a == "--in-memory"
            });
            if !excluded {
                args.push("--huge-unlink=always".into());
            }
        } else {
            // No shared config either: nothing in hugetlbfs to share, and two test
            // processes must not collide on /var/run/dpdk.
            args.extend([
                "--no-huge".into(),
                "-m".into(),
                memory,
                "--no-shconf".into(),
            ]);
        }
        let pci: Vec<&String> = self.ports.iter().filter_map(|p| p.pci()).collect();
        if pci.is_empty() {
            // Otherwise the EAL probes every bound NIC on the host.
            args.push("--no-pci".into());
        }
        for addr in pci {
            args.extend(["-a".into(), addr.clone()]);
        }
        for port in &self.ports {
            if let PortDevice::Vdev(spec) = &port.device {
                args.extend(["--vdev".into(), spec.clone()]);
            }
        }
        for (i, port) in self.ports.iter().enumerate() {
            if let Some(exception) = &port.exception {
                args.extend(["--vdev".into(), exception.vdev(i).1]);
            }
        }
        args.extend(self.eal.extra_args.iter().cloned());
        args
    }

    /// The index of the port called `name` in `ports`.
    pub fn port_index(&self, name: &str) -> Option<usize> {
        self.ports.iter().position(|p| p.name == name)
    }

    /// The service with this protocol, VIP and port.
    pub fn service(&self, key: &ServiceKey) -> Option<&ServiceConfig> {
        self.services.iter().find(|s| s.key == *key)
    }
}

impl PortConfig {
    fn pci(&self) -> Option<&String> {
        match &self.device {
            PortDevice::Pci(addr) => Some(addr),
            _ => None,
        }
    }
}

/// A config's text (shared: configs are cloned); its `Debug` is its size only.
#[derive(Clone, Default)]
pub struct ConfigText(std::sync::Arc<str>);

impl fmt::Debug for ConfigText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ConfigText({} bytes)", self.0.len())
    }
}

impl Config {
    /// Where `field` is written: the 1-based line and column of its value, for a path
    /// in [`ConfigError::field`]'s form (`eal.memory_mb`, `ports[1].pci`,
    /// `lcores.cpus[2]`); `None` for a field left to its default.
    pub fn locate(&self, field: &str) -> Option<(usize, usize)> {
        let root = tree::parse(&self.text.0).ok()?;
        let mut node = &root;
        for segment in field.split('.') {
            let (name, indices) = segment.split_once('[').unwrap_or((segment, ""));
            let tree::Value::Table(entries) = &node.value else {
                return None;
            };
            node = &entries.iter().find(|e| e.key == name)?.value;
            for index in indices.split('[') {
                let Some(index) = index.strip_suffix(']') else {
                    continue;
                };
                let tree::Value::Array(items) = &node.value else {
                    return None;
                };
                node = items.get(index.parse::<usize>().ok()?)?;
            }
        }
        let span = node.span.as_ref()?;
        Some(source::line_column(&self.text.0, span.start))
    }

    /// How a refusal made after loading names where `field` is: `FILE:LINE:COLUMN`
    /// as a [`ConfigError`] does, or `FILE` alone for a field left to its default.
    pub fn place(&self, field: &str) -> String {
        match self.locate(field) {
            Some((line, column)) => format!("{}:{line}:{column}", self.path.display()),
            None => self.path.display().to_string(),
        }
    }
}

impl Config {
    /// The settings that differ between `self`, the config the daemon started with,
    /// and `reloaded`, among those a reload cannot apply (the workers, ports, tables
    /// and sockets were made from them at start): their names, for the operator to
    /// learn that they wait for a restart.
    pub fn restart_only_changes(&self, reloaded: &Config) -> Vec<&'static str> {
        let vrrp_fixed = |c: &Config| {
            c.vrrp.as_ref().map(|v| {
                (
                    v.vrid,
                    v.source,
                    v.addresses.clone(),
                    v.peers.clone(),
                    v.any_peer,
                    v.unicast,
                    v.key.clone(),
                    v.max_clock_skew_ms,
                    v.accept_unsealed,
                )
            })
        };
        let probes_from = |c: &Config| {
            (
                c.health.source,
                c.health.source6,
                c.health.source_ports.clone(),
            )
        };
        [
            ("eal", self.eal != reloaded.eal),
            ("lcores", self.lcores != reloaded.lcores),
            ("control", self.control != reloaded.control),
            ("ports", self.ports != reloaded.ports),
            ("loopback", self.loopback != reloaded.loopback),
            ("sessions", self.sessions != reloaded.sessions),
            ("sync", self.sync != reloaded.sync),
            ("bgp", self.bgp != reloaded.bgp),
            (
                "vrrp (on or off, vrid, source, addresses, peers, key, max_clock_skew_ms, accept_unsealed)",
                vrrp_fixed(self) != vrrp_fixed(reloaded),
            ),
            (
                "health (source, source6, source_ports)",
                probes_from(self) != probes_from(reloaded),
            ),
        ]
        .into_iter()
        .filter_map(|(name, changed)| changed.then_some(name))
        .collect()
    }

    /// The services' and real servers' `health` tables, for the health monitor.
    pub fn health_overrides(&self) -> crate::health::Overrides {
        let mut o = crate::health::Overrides::default();
        for s in &self.services {
            o.services.insert(s.key, (s.health.clone(), s.all_down));
            for rs in &s.real_servers {
                o.servers.insert((s.key, rs.ip, rs.port), rs.health.clone());
            }
        }
        o
    }

    /// The health probes' source address: `[health] source`, else the first port's
    /// first address.
    pub fn health_source(&self) -> Option<Ipv4Addr> {
        self.health
            .source
            .or_else(|| self.ports.first()?.addresses.first().map(|a| a.addr))
    }

    /// The addresses IPv6 probes may come from: `[health] source6`, else the first
    /// port's IPv6 addresses (each real server is probed from the one sharing the
    /// longest prefix with it). Empty: IPv6 real servers are not probed.
    pub fn health_sources6(&self) -> Vec<std::net::Ipv6Addr> {
        match self.health.source6 {
            Some(a) => vec![a],
            None => self
                .ports
                .first()
                .map(|p| p.addresses6.iter().map(|a| a.addr).collect())
                .unwrap_or_default(),
        }
    }
}
