//! The config file's layout: which sections and keys exist, their defaults, and the
//! rules that involve more than one field (uniqueness across ports, the loopback
//! section, lcore overlap, duplicate services and real servers, VIPs that are the
//! appliance's own addresses, ports that only NAT can change, FullNAT local addresses
//! that must be present and must not be a VIP, a real server or a port address).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::fields;
use super::reader::{Check, Field, Location, Table};
use super::source::Source;
use super::tree::Node;
use super::{
    Config, ConfigText, ControlConfig, EalConfig, ExceptionConfig, ExceptionKind, Ipv4Cidr,
    Ipv6Cidr, LcoreConfig, LoopbackConfig, PortConfig, PortDevice, RealServerConfig, ServiceConfig,
    SessionsConfig, SorryServerConfig, StaticNeighbour, SyncSettings, TimeoutsConfig, VrrpSettings,
};
use crate::dataplane::exception;
use crate::health::spec::{
    AllDown, CheckKind, CheckOverride, CheckSpec, HealthConfig, MAX_PATH_LEN,
};
use crate::model::Protocol;
use crate::model::{ForwardMode, Persistence, RealServerSpec, ServiceKey, MAX_LOCAL_ADDRESSES};
use crate::model::{SchedFlags, SchedulerKind};
use crate::model::{
    SynProxy, SynProxyMode, DEFAULT_SYNPROXY_AUTO_SYN_RATE, DEFAULT_SYNPROXY_SYN_RETRIES,
    MAX_SYNPROXY_SYN_RETRIES,
};
use crate::service::{AclAction, Prefix, RateLimit};

const ROOT_KEYS: &[&str] = &[
    "eal", "lcores", "control", "ports", "loopback", "timeouts", "sessions", "health", "vrrp",
    "sync", "bgp", "services",
];
const EAL_KEYS: &[&str] = &["hugepages", "memory_mb", "file_prefix", "extra_args"];
const LCORE_KEYS: &[&str] = &["management", "workers", "cpus", "idle_sleep_us"];
const CONTROL_KEYS: &[&str] = &["socket", "metrics", "group"];
const PORT_KEYS: &[&str] = &[
    "name",
    "pci",
    "vdev",
    "loopback",
    "mac",
    "addresses",
    "rx_desc",
    "tx_desc",
    "rss_key",
    "mtu",
    "exception",
    "static_neighbours",
];

const STATIC_NEIGHBOUR_KEYS: &[&str] = &["address", "mac"];

/// Static neighbours one port may have: they take slots of every worker's neighbour
/// tables for good, and the config check keeps them within an eighth of those.
const MAX_STATIC_NEIGHBOURS: usize = 1024;
/// `[ports.exception]`: the kernel interface paired with a port.
const EXCEPTION_KEYS: &[&str] = &["kind", "interface", "rate", "ring_size"];
const LOOPBACK_KEYS: &[&str] = &[
    "peers",
    "ping_interval_ms",
    "garbage_every",
    "stats_interval_ms",
];

const TIMEOUT_KEYS: &[&str] = &[
    "tcp",
    "tcpfin",
    "udp",
    "syn_recv",
    "syn_sent",
    "time_wait",
    "close",
    "close_wait",
    "last_ack",
];
const SESSION_KEYS: &[&str] = &[
    "capacity",
    "tick_ms",
    "local_port_first",
    "local_port_last",
    "server_time_wait",
    "rewrite_timestamps",
    "icmp_error_rate",
    "icmp_error_burst",
    "neighbours",
    "persistence_templates",
];
const SERVICE_KEYS: &[&str] = &[
    "proto",
    "vip",
    "port",
    "scheduler",
    "persistence_timeout",
    "persistence_netmask",
    "local_addresses",
    "toa",
    "sloppy_tcp",
    "synproxy",
    "synproxy_auto_syn_rate",
    "synproxy_syn_retries",
    "scheduler_flags",
    "mh_table_size",
    "health",
    "real_servers",
    "acl_allow",
    "acl_deny",
    "acl_file",
    "rate_limit",
    "rate_limit_burst",
    "rate_limit_prefix",
    "sorry_server",
];
const SORRY_SERVER_KEYS: &[&str] = &["ip", "port", "mode", "inhibit"];
const REAL_SERVER_KEYS: &[&str] = &["ip", "port", "weight", "mode", "upper", "lower", "health"];
/// The keys of a check, in `[health]` (defaults), a service's and a real server's
/// `health` table.
const CHECK_KEYS: &[&str] = &[
    "check",
    "interval_ms",
    "timeout_ms",
    "fall",
    "rise",
    "retry_ms",
    "port",
    "path",
    "expect",
    "passive",
    "passive_fall",
];
const SYNC_KEYS: &[&str] = &[
    "listen",
    "port",
    "peers",
    "multicast",
    "key",
    "key_file",
    "unauthenticated",
    "threshold",
    "period_ms",
    "mtu",
    "dump_records_per_turn",
];
const VRRP_KEYS: &[&str] = &[
    "vrid",
    "priority",
    "advert_interval_ms",
    "preempt",
    "source",
    "addresses",
    "peers",
    "any_peer",
    "unicast",
    "key",
    "key_file",
    "unauthenticated",
    "max_clock_skew_ms",
    "accept_unsealed",
];
const BGP_KEYS: &[&str] = &[
    "include",
    "socket",
    "birdc",
    "protocol",
    "communities",
    "timeout_ms",
    "retry_ms",
    "poll_ms",
    "shutdown_grace_ms",
];
/// `[health]` alone: where probes come from and appliance-wide behaviour.
const HEALTH_ONLY_KEYS: &[&str] = &[
    "source",
    "source6",
    "source_port_first",
    "source_port_last",
    "passive_syn_ms",
    "all_down",
];

const DEFAULT_SOCKET: &str = "/run/sluice/sluice.sock";
const DEFAULT_DESC: u16 = 1024;
/// `[sync] dump_records_per_turn` unless set: above what the 32 dump chunks of a
/// turn carry at any MTU, so the chunk budget and the listing time bound a turn.
const DEFAULT_DUMP_RECORDS_PER_TURN: u32 = 65_536;
/// Without hugepages DPDK still needs room for its own heap and one mempool.
const MIN_NO_HUGE_MB: u32 = 64;
const MAX_WORKERS: usize = 64;
const MAX_ADDRESSES: usize = 16;
/// `-g`, ipvsadm's default.
const DEFAULT_MODE: ForwardMode = ForwardMode::Dr;
const DEFAULT_WEIGHT: u32 = 1;
/// `-M` when `-p` is given alone: every client address is its own group.
const DEFAULT_PERSISTENCE_NETMASK: Ipv4Addr = Ipv4Addr::BROADCAST;

/// Reads and validates a parsed document.
pub(super) fn read_config(root: &Node, source: &Source) -> Check<Config> {
    let root = Table::root(root, ROOT_KEYS)?;
    let eal = read_eal(&root)?;
    let lcores = read_lcores(&root)?;
    let control = read_control(&root)?;
    let ports = read_ports(&root, source)?;
    let loopback = read_loopback(&root, &ports)?;
    let timeouts = read_timeouts(&root)?;
    let sessions = read_sessions(&root)?;
    check_static_neighbours(&ports, &sessions)?;
    let health = read_health(&root, &ports)?;
    let vrrp = read_vrrp(&root, &ports, source)?;
    let sync = read_sync(&root, &ports, source)?;
    let bgp = read_bgp(&root)?;
    let services = read_services(&root, &ports, source, &health)?;
    Ok(Config {
        path: source.path.to_path_buf(),
        text: ConfigText(source.text.into()),
        eal,
        lcores,
        control,
        ports: ports.into_iter().map(|p| p.config).collect(),
        loopback,
        timeouts,
        sessions,
        health,
        vrrp,
        sync,
        bgp,
        services,
    })
}

/// `[sync]`: optional; its presence turns session sync on.
fn read_sync(root: &Table, ports: &[PortRead], source: &Source) -> Check<Option<SyncSettings>> {
    let Some(t) = root.table("sync", SYNC_KEYS)? else {
        return Ok(None);
    };
    let address = |f: &Field| {
        f.str()?
            .parse::<std::net::SocketAddrV4>()
            .map_err(|_| f.invalid("expected IPv4:PORT, for example \"198.19.0.1:8848\""))
    };
    let listen_field = t.require("listen")?;
    let listen = address(&listen_field)?;
    // Every message names its sender by this address, and the peers accept a message
    // only from the address it names: it must be the one this node sends from.
    if listen.ip().is_unspecified() || listen.ip().is_multicast() || listen.ip().is_broadcast() {
        return Err(listen_field.invalid(format!(
            "{} is not one of this node's addresses: the peers list this node by the \
             address it sends from, which its messages carry",
            listen.ip()
        )));
    }
    let peers_field = t.require("peers")?;
    let peer_fields = peers_field.array()?;
    let mut peers = Vec::with_capacity(peer_fields.len());
    for f in &peer_fields {
        let peer = address(f)?;
        // A node that lists itself (one file for every node, say) takes its own
        // batches back: a session it retires and a new one on the same tuple, and the
        // retirement coming back removes the new connection.
        if peer == listen {
            return Err(f.invalid(format!(
                "{peer} is this node's own `listen` address: list the other nodes"
            )));
        }
        // Peers are told apart by address alone (the address a datagram comes from).
        if peers
            .iter()
            .any(|p: &std::net::SocketAddrV4| p.ip() == peer.ip())
        {
            return Err(f.invalid(format!("{} is listed twice", peer.ip())));
        }
        peers.push(peer);
    }
    if peers.is_empty() {
        return Err(peers_field.invalid("at least one peer is needed"));
    }
    // Batches to a group instead of to each peer; resync stays unicast (docs/SYNC.md).
    let multicast = t.optional("multicast", |f| {
        let group = f.str()?.parse::<std::net::SocketAddrV4>().map_err(|_| {
            f.invalid("expected GROUP:PORT, for example \"224.0.0.81:8848\"")
        })?;
        if !group.ip().is_multicast() {
            return Err(f.invalid(format!(
                "{} is not an IPv4 multicast address (224.0.0.0/4), for example \"224.0.0.81:8848\"",
                group.ip()
            )));
        }
        if group.port() == 0 {
            return Err(f.invalid("port 0: the peers must know the group's port"));
        }
        Ok(group)
    })?;
    // Without a key anyone who can send from a peer's address rewrites the session
    // table: only an explicit opt-out runs so (docs/SYNC.md, Authentication).
    let (key, key_file) = read_shared_key(
        &t,
        source,
        "sync needs a shared key (hex, at least 16 bytes, e.g. from `openssl rand -hex 32`): \
         without one, anyone who can send from a peer's address installs, changes and \
         removes sessions; to run without authentication anyway, say \
         `unauthenticated = true`",
    )?;
    let mtu: u16 = t.or("mtu", 1500, |f| f.int(576..=9000))?;
    let port = match t.get("port") {
        Some(f) => {
            let at = SyncPortFields {
                port: &f,
                listen: &listen_field,
                peers: &peer_fields,
                mtu: t.get("mtu"),
            };
            Some(read_sync_port(&at, ports, listen, &peers, mtu)?)
        }
        None => None,
    };
    Ok(Some(SyncSettings {
        listen,
        port,
        peers,
        multicast,
        key,
        key_file,
        threshold: t.or("threshold", 3, |f| f.int(0..=1_000_000))?,
        period_ms: t.or("period_ms", 10_000, |f| f.int(100..=3_600_000))?,
        mtu,
        dump_records_per_turn: t.or(
            "dump_records_per_turn",
            DEFAULT_DUMP_RECORDS_PER_TURN,
            |f| f.int(1..=1_000_000),
        )?,
    }))
}

/// A section's `key` or `key_file` (hex, at least 16 bytes), or its explicit
/// `unauthenticated = true`: exactly one of the three. `missing` says why a key is
/// needed, when none of them is there.
fn read_shared_key(
    t: &Table,
    source: &Source,
    missing: &str,
) -> Check<(Option<super::SecretHex>, Option<std::path::PathBuf>)> {
    let key = t.optional("key", |f| {
        let hex = f.str()?;
        crate::ha::auth::SharedKey::from_hex(hex).map_err(|e| f.invalid(e.to_string()))?;
        Ok(super::SecretHex::new(hex))
    })?;
    let (key, key_file) = match (key, t.get("key_file")) {
        (Some(_), Some(f)) => {
            return Err(f.invalid("`key_file` with a `key`: remove one of them"));
        }
        (None, Some(f)) => {
            let (key, path) = read_key_file(&f, source)?;
            (Some(key), Some(path))
        }
        (key, None) => (key, None),
    };
    let unauthenticated = t.or("unauthenticated", false, |f| f.bool())?;
    match (&key, unauthenticated) {
        (None, false) => return Err(t.missing("key", missing)),
        (Some(_), true) => {
            let with = match t.get("key_file") {
                Some(_) => "`key_file`",
                None => "a `key`",
            };
            return Err(t
                .get("unauthenticated")
                .expect("read above")
                .invalid(format!(
                    "`unauthenticated = true` with {with}: remove one of them"
                )));
        }
        _ => {}
    }
    Ok((key, key_file))
}

/// A `key_file` (`[sync]`, `[vrrp]`): the key's hex in a file of its own (relative to
/// the config file's directory), surrounding whitespace ignored, so the config itself
/// can be readable by others and kept in version control. The file must not be: a
/// group or other user that can read it can forge sync messages, which install, change
/// and remove sessions, or VRRP adverts, which decide who is master, and one that owns
/// it can change the key (as ssh refuses a private key others can read or own). Opened once, not through a symbolic link, and judged
/// by what was opened (no window between the check and the read); a regular file
/// only (a FIFO would hang the load, and a reload on the management loop with it),
/// refused past [`KEY_FILE_MAX`] bytes.
fn read_key_file(f: &Field, source: &Source) -> Check<(super::SecretHex, std::path::PathBuf)> {
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let path = beside_config(source, f.str()?);
    let shown = path.display();
    let cannot = |e: std::io::Error| f.invalid(format!("cannot read {shown}: {e}"));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(&path)
        .map_err(cannot)?;
    let meta = file.metadata().map_err(cannot)?;
    if !meta.file_type().is_file() {
        return Err(f.invalid(format!("{shown} is not a regular file")));
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    if meta.uid() != me && meta.uid() != 0 {
        return Err(f.invalid(format!(
            "{shown} is owned by uid {}: only root or this process's user ({me}) may own \
             the key (run `chown {me} {shown}`)",
            meta.uid()
        )));
    }
    let mode = meta.mode();
    if mode & 0o077 != 0 {
        return Err(f.invalid(format!(
            "{shown} has mode {:04o}: users besides its owner could read or change the key \
             (run `chmod 600 {shown}`)",
            mode & 0o7777
        )));
    }
    let Some(text) = read_at_most(file, KEY_FILE_MAX).map_err(cannot)? else {
        return Err(f.invalid(format!(
            "{shown} is longer than {KEY_FILE_MAX} bytes: no key"
        )));
    };
    let hex = text.trim();
    crate::ha::auth::SharedKey::from_hex(hex).map_err(|e| f.invalid(format!("{shown}: {e}")))?;
    Ok((super::SecretHex::new(hex), path))
}

/// The most of a `key_file` read: a key of a few hundred hex digits at most, and
/// anything longer is no key.
const KEY_FILE_MAX: u64 = 4096;

/// A file the config names: `name` as written if absolute, else from the config
/// file's directory.
fn beside_config(source: &Source, name: &str) -> std::path::PathBuf {
    match source.path.parent() {
        Some(dir) if std::path::Path::new(name).is_relative() => dir.join(name),
        _ => std::path::PathBuf::from(name),
    }
}

/// The text of an `acl_file`: a regular file (a FIFO would hang the load, which a
/// reload runs on a thread of its own that would never end; `/dev/zero` would never
/// end either), opened without waiting for a writer, refused past [`ACL_FILE_MAX`].
fn read_acl_file(f: &Field, source: &Source) -> Check<(std::path::PathBuf, String)> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = beside_config(source, f.str()?);
    let shown = path.display();
    let cannot = |e: std::io::Error| f.invalid(format!("cannot read {shown}: {e}"));
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&path)
        .map_err(cannot)?;
    if !file.metadata().map_err(cannot)?.file_type().is_file() {
        return Err(f.invalid(format!("{shown} is not a regular file")));
    }
    let Some(text) = read_at_most(file, ACL_FILE_MAX).map_err(cannot)? else {
        return Err(f.invalid(format!(
            "{shown} is longer than {ACL_FILE_MAX} bytes (a service holds at most {} rules)",
            crate::service::acl::MAX_ACL_RULES
        )));
    };
    Ok((path, text))
}

/// The whole text of `file`, or `None` if it is longer than `max` bytes (read no
/// further than one byte past them, so an endless file ends the read too).
fn read_at_most(file: std::fs::File, max: u64) -> std::io::Result<Option<String>> {
    use std::io::Read;
    let mut text = String::new();
    file.take(max + 1).read_to_string(&mut text)?;
    Ok((text.len() as u64 <= max).then_some(text))
}

/// The most of an `acl_file` read: room for a service's most rules
/// ([`crate::service::acl::MAX_ACL_RULES`], about 30 bytes a line) with comments.
const ACL_FILE_MAX: u64 = 128 << 20;

/// The `[sync]` fields that sync over a DPDK port constrains, for their locations.
struct SyncPortFields<'a> {
    port: &'a Field<'a>,
    listen: &'a Field<'a>,
    peers: &'a [Field<'a>],
    mtu: Option<Field<'a>>,
}

/// `[sync] port = "NAME"`: sync through the data plane of that port. It must be the
/// first port (Sluice sends its own frames from the first port only), `listen` one of
/// its addresses, each peer on one of its subnets (frames go to a peer directly, no
/// gateway), and a datagram of `mtu` must fit the port's MTU and one mbuf.
fn read_sync_port(
    at: &SyncPortFields,
    ports: &[PortRead],
    listen: std::net::SocketAddrV4,
    peers: &[std::net::SocketAddrV4],
    mtu: u16,
) -> Check<String> {
    let name = at.port.str()?;
    let names = || {
        ports
            .iter()
            .map(|p| format!("{:?}", p.config.name))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let Some(index) = ports.iter().position(|p| p.config.name == name) else {
        return Err(at.port.invalid(format!(
            "no [[ports]] named {name:?} (the ports are {})",
            names()
        )));
    };
    if index != 0 {
        return Err(at.port.invalid(format!(
            "sync over a DPDK port needs the first port ({:?}): Sluice sends its own frames from the first port only",
            ports[0].config.name
        )));
    }
    let port = &ports[index].config;
    let cidrs = || {
        port.addresses
            .iter()
            .map(|a| a.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    if !port.addresses.iter().any(|a| a.addr == *listen.ip()) {
        return Err(at.listen.invalid(format!(
            "{} is not an address of port {name:?} ({}): with `port`, sync sends and receives as one of the port's addresses",
            listen.ip(),
            cidrs()
        )));
    }
    if listen.port() == 0 {
        return Err(at
            .listen
            .invalid("port 0: with `port`, the peers must know the listen port"));
    }
    for (peer, field) in peers.iter().zip(at.peers) {
        if !port.addresses.iter().any(|a| a.contains(*peer.ip())) {
            return Err(field.invalid(format!(
                "{} is not on a subnet of port {name:?} ({}): sync frames go to a peer directly, without a gateway",
                peer.ip(),
                cidrs()
            )));
        }
    }
    let port_mtu = port.mtu.unwrap_or(1500);
    let room = crate::dpdk::MBUF_DATA_ROOM as usize - crate::wire::ethernet::HEADER_LEN;
    let mtu_at = at.mtu.as_ref().unwrap_or(at.port);
    if mtu > port_mtu {
        let which = if at.mtu.is_some() {
            ""
        } else {
            " (the default)"
        };
        return Err(mtu_at.invalid(format!(
            "sync.mtu {mtu}{which} is above port {name:?}'s MTU {port_mtu}: set sync.mtu to at most {port_mtu}"
        )));
    }
    if usize::from(mtu) > room {
        return Err(mtu_at.invalid(format!(
            "sync.mtu {mtu}: a sync frame must fit one mbuf, so at most {room} with `port`"
        )));
    }
    Ok(name.to_string())
}

/// `[bgp]`: optional; its presence turns the BGP announcements through BIRD on.
fn read_bgp(root: &Table) -> Check<Option<crate::ha::bgp::BgpSettings>> {
    let Some(t) = root.table("bgp", BGP_KEYS)? else {
        return Ok(None);
    };
    let absolute = |f: &Field, example: &str| {
        let s = f.str()?;
        if !s.starts_with('/') || s.ends_with('/') || s.chars().any(char::is_control) {
            return Err(f.invalid(format!(
                "expected an absolute file path, for example \"{example}\""
            )));
        }
        Ok(std::path::PathBuf::from(s))
    };
    let include = absolute(&t.require("include")?, "/run/sluice/bird-vips.conf")?;
    if include.to_string_lossy().contains('"') {
        return Err(t
            .get("include")
            .expect("read above")
            .invalid("a path with '\"' cannot be named in BIRD's `include \"...\";`"));
    }
    let protocol = t.or("protocol", "sluice".to_string(), |f| {
        let s = f.str()?;
        let ok = s.len() <= 32
            && s.starts_with(|c: char| c.is_ascii_alphabetic())
            && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !ok {
            return Err(f.invalid(
                "expected a BIRD symbol: a letter, then letters, digits or '_', at most 32 (Sluice appends 4 and 6)",
            ));
        }
        Ok(s.to_string())
    })?;
    let communities = t.or("communities", Vec::new(), |f| {
        f.array()?
            .iter()
            .map(|c| {
                let s = c.str()?;
                let parsed = s.split_once(':').and_then(|(a, v)| {
                    Some((a.trim().parse::<u16>().ok()?, v.trim().parse::<u16>().ok()?))
                });
                parsed.ok_or_else(|| {
                    c.invalid(format!(
                        "{s:?} is not a BGP community: expected \"ASN:VALUE\", both 0..=65535, for example \"65000:100\""
                    ))
                })
            })
            .collect()
    })?;
    Ok(Some(crate::ha::bgp::BgpSettings {
        birdc: t.or("birdc", "birdc".into(), |f| {
            let s = f.str()?;
            if s.is_empty() || s.chars().any(char::is_control) {
                return Err(
                    f.invalid("expected a program name or path, for example \"/usr/sbin/birdc\"")
                );
            }
            Ok(std::path::PathBuf::from(s))
        })?,
        socket: t.or("socket", "/run/bird/bird.ctl".into(), |f| {
            absolute(f, "/run/bird/bird.ctl")
        })?,
        include,
        protocol,
        communities,
        timeout_ms: t.or("timeout_ms", 5000, |f| f.int(100..=60_000))?,
        retry_ms: t.or("retry_ms", 2000, |f| f.int(100..=600_000))?,
        poll_ms: t.or("poll_ms", 1000, |f| f.int(100..=60_000))?,
        shutdown_grace_ms: t.or("shutdown_grace_ms", 2000, |f| f.int(0..=600_000))?,
    }))
}

/// `[vrrp]`: optional; its presence turns VRRP on. VRRP advertises on the first
/// port, so `source` is one of its addresses and every peer is on one of its subnets
/// (adverts go out with TTL 255 and are taken only with it: a peer is on the link).
fn read_vrrp(root: &Table, ports: &[PortRead], config: &Source) -> Check<Option<VrrpSettings>> {
    let Some(t) = root.table("vrrp", VRRP_KEYS)? else {
        return Ok(None);
    };
    let vrid = t.require("vrid")?.int(1..=255)?;
    let priority = t.or("priority", 100, |f| f.int(1..=255))?;
    let advert_interval_ms = t.or("advert_interval_ms", 1000, |f| {
        let ms: u32 = f.int(10..=40_950)?;
        if !ms.is_multiple_of(10) {
            return Err(f.invalid(format!(
                "{ms} is not a multiple of 10: VRRPv3 advertises the interval in centiseconds"
            )));
        }
        Ok(ms)
    })?;
    let preempt = t.or("preempt", true, Field::bool)?;
    let ipv4 = |f: &Field, example: &str| {
        f.str()?.parse::<Ipv4Addr>().map_err(|_| {
            f.invalid(format!(
                "expected an IPv4 address, for example \"{example}\""
            ))
        })
    };
    let first = ports.first().map(|p| &p.config);
    let cidrs = || {
        first.map_or_else(String::new, |p| {
            p.addresses
                .iter()
                .map(|a| a.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        })
    };
    let source = t.optional("source", |f| {
        let ip = ipv4(f, "198.18.0.1")?;
        match first {
            Some(p) if !p.addresses.iter().any(|a| a.addr == ip) => Err(f.invalid(format!(
                "{ip} is not an address of port {:?} ({}): VRRP advertises from the first port",
                p.name,
                cidrs()
            ))),
            _ => Ok(ip),
        }
    })?;
    let primary = source.or_else(|| first?.addresses.first().map(|a| a.addr));
    /// The routers of a VRRP group besides this one: a handful in practice.
    const MAX_VRRP_PEERS: usize = 32;
    let peers: Vec<Ipv4Addr> = t.or("peers", Vec::new(), |f| {
        let mut peers = Vec::new();
        for (i, a) in f.array()?.into_iter().enumerate() {
            if i == MAX_VRRP_PEERS {
                return Err(a.invalid(format!(
                    "more than {MAX_VRRP_PEERS} peers: with `unicast` every advert goes to \
                     each of them, through the same ring as the health probes"
                )));
            }
            let ip = ipv4(&a, "198.18.0.2")?;
            let own = first.is_some_and(|p| p.addresses.iter().any(|c| c.addr == ip));
            if Some(ip) == primary || own {
                return Err(a.invalid(format!(
                    "{ip} is one of this node's own addresses: list the other routers"
                )));
            }
            if let Some(p) = first {
                if !p.addresses.iter().any(|c| c.contains(ip)) || ip.is_broadcast() {
                    return Err(a.invalid(format!(
                        "{ip} is not on a subnet of port {:?} ({}): VRRP peers share the first port's link",
                        p.name,
                        cidrs()
                    )));
                }
            }
            if peers.contains(&ip) {
                return Err(a.invalid(format!("{ip} is listed twice")));
            }
            peers.push(ip);
        }
        Ok(peers)
    })?;
    // Without a list, any host on the link forges the master's adverts (VRRPv3 has no
    // authentication): only an explicit opt-out runs so (docs/CONFIG.md, `[vrrp]`).
    let any_peer = t.or("any_peer", false, Field::bool)?;
    match (peers.is_empty(), any_peer) {
        (true, false) => {
            return Err(match t.get("peers") {
                Some(f) => f.invalid(
                    "at least one peer is needed (or `any_peer = true` to take adverts from any sender on the link)",
                ),
                None => t.missing(
                    "peers",
                    "VRRP needs the other routers' addresses (`peers = [\"198.18.0.2\"]`): \
                     VRRPv3 has no authentication, so without the list any host on the link \
                     can make this node master or backup; to take adverts from any sender \
                     anyway, say `any_peer = true`",
                ),
            })
        }
        (false, true) => {
            return Err(t
                .get("any_peer")
                .expect("read above")
                .invalid("`any_peer = true` with `peers`: remove one of them"))
        }
        _ => {}
    }
    // keepalived's `unicast_peer`: adverts to each peer instead of the group, which a
    // keepalived in that mode does not join.
    let unicast = t.or("unicast", false, Field::bool)?;
    if unicast && any_peer {
        return Err(t
            .get("unicast")
            .expect("read above")
            .invalid("`unicast = true` sends to `peers`, and `any_peer = true` lists none"));
    }
    // VRRPv3 has no authentication of its own: without Sluice's, a host that forges a
    // peer's address or replays its adverts decides who is master (docs/CONFIG.md).
    let (key, key_file) = read_shared_key(
        &t,
        config,
        "VRRP between Sluice nodes needs a shared key (hex, at least 16 bytes, e.g. from \
         `openssl rand -hex 32`): without one, a host on the link that forges a peer's \
         address or sends its adverts again makes this node master or backup; keepalived \
         cannot authenticate VRRPv3, so with keepalived peers say `unauthenticated = true`",
    )?;
    let max_clock_skew_ms = t.or("max_clock_skew_ms", 60_000, |f| f.int(1000..=86_400_000))?;
    // While a running group switches to a key: sealed adverts out, unsealed ones taken
    // too (docs/CONFIG.md, `[vrrp]`, switching a group to a key).
    let accept_unsealed = t.or("accept_unsealed", false, Field::bool)?;
    if key.is_none() {
        if let Some(f) = t.get("max_clock_skew_ms") {
            return Err(f.invalid("only adverts sealed with a `key` carry a clock to judge"));
        }
        if let Some(f) = t.get("accept_unsealed") {
            return Err(
                f.invalid("only with a `key`: without one, unsealed adverts are all there is")
            );
        }
    }
    Ok(Some(VrrpSettings {
        vrid,
        priority,
        advert_interval_ms,
        preempt,
        source,
        addresses: t.or("addresses", Vec::new(), |f| {
            f.array()?.iter().map(|a| ipv4(a, "198.18.0.254")).collect()
        })?,
        peers,
        any_peer,
        unicast,
        key,
        key_file,
        max_clock_skew_ms,
        accept_unsealed,
    }))
}

/// `[health]`: the default check of every real server plus the probe source.
fn read_health(root: &Table, ports: &[PortRead]) -> Check<HealthConfig> {
    let d = HealthConfig::default();
    let keys: Vec<&str> = CHECK_KEYS.iter().chain(HEALTH_ONLY_KEYS).copied().collect();
    let Some(t) = root.table("health", &keys)? else {
        return Ok(d);
    };
    let defaults = read_check_fields(&t)?.apply(&d.defaults);
    check_spec(&t, &defaults)?;
    let first = t.or(
        "source_port_first",
        *d.source_ports.start(),
        fields::local_port,
    )?;
    let last = t.or(
        "source_port_last",
        *d.source_ports.end(),
        fields::local_port,
    )?;
    if first > last {
        let f = t
            .get("source_port_last")
            .or_else(|| t.get("source_port_first"));
        if let Some(f) = f {
            return Err(f.invalid(format!(
                "source_port_first {first} is above source_port_last {last}"
            )));
        }
    }
    Ok(HealthConfig {
        source: t.optional("source", |f| {
            let addr = f.str()?.parse::<Ipv4Addr>().map_err(|_| {
                f.invalid("expected an IPv4 address, for example \"198.18.0.1\"")
            })?;
            // A probe from an address nobody answers for fails on every server: a
            // typo here would evict them all.
            let Some(port) = ports.first().map(|p| &p.config) else {
                return Ok(addr);
            };
            if !port.addresses.iter().any(|a| a.addr == addr) {
                let cidrs: Vec<String> = port.addresses.iter().map(|a| a.to_string()).collect();
                return Err(f.invalid(format!(
                    "{addr} is not an IPv4 address of the first port {:?} ({}): probes leave through it, and the answers must come back to one of its addresses",
                    port.name,
                    cidrs.join(", ")
                )));
            }
            Ok(addr)
        })?,
        source6: t.optional("source6", |f| {
            let addr = f.str()?.parse::<Ipv6Addr>().map_err(|_| {
                f.invalid("expected an IPv6 address, for example \"2001:db8:1a::1\"")
            })?;
            let first = ports.first().map(|p| &p.config.addresses6[..]).unwrap_or(&[]);
            if !first.iter().any(|a| a.addr == addr) {
                return Err(f.invalid(format!(
                    "{addr} is not an IPv6 address of the first port (probes leave through it, and the answers must come back to one of its addresses)"
                )));
            }
            Ok(addr)
        })?,
        source_ports: first..=last,
        defaults,
        all_down: t.or("all_down", d.all_down, read_all_down)?,
        passive_syn_ms: t.or("passive_syn_ms", d.passive_syn_ms, |f| f.int(1..=60_000))?,
    })
}

fn read_all_down(f: &Field) -> Check<AllDown> {
    AllDown::parse(f.str()?).ok_or_else(|| {
        f.invalid("expected \"drop\" (new connections are dropped) or \"rst\" (new TCP connections get an RST)")
    })
}

/// The check keys of a `health` table, each validated on its own.
fn read_check_fields(t: &Table) -> Check<CheckOverride> {
    Ok(CheckOverride {
        kind: t.optional("check", |f| {
            CheckKind::parse(f.str()?)
                .ok_or_else(|| f.invalid("expected \"none\", \"tcp\" or \"http\""))
        })?,
        interval_ms: t.optional("interval_ms", |f| f.int(10..=3_600_000))?,
        timeout_ms: t.optional("timeout_ms", |f| f.int(1..=3_600_000))?,
        fall: t.optional("fall", |f| f.int(1..=1000))?,
        rise: t.optional("rise", |f| f.int(1..=1000))?,
        retry_ms: t.optional("retry_ms", |f| f.int(10..=86_400_000))?,
        port: t.optional("port", fields::l4_port)?,
        path: t.optional("path", |f| {
            let path = f.str()?;
            if !path.starts_with('/')
                || path.len() > MAX_PATH_LEN
                || path.chars().any(|c| c.is_whitespace() || c.is_control())
            {
                return Err(f.invalid(format!(
                    "expected an HTTP path starting with '/', without spaces, at most {MAX_PATH_LEN} bytes"
                )));
            }
            Ok(path.to_string())
        })?,
        expect: t.optional("expect", |f| f.int(100..=599))?,
        passive: t.optional("passive", Field::bool)?,
        passive_fall: t.optional("passive_fall", |f| f.int(1..=1000))?,
    })
}

/// The rules across a check's fields, pointed at the field that breaks them.
fn check_spec(t: &Table, spec: &CheckSpec) -> Check<()> {
    if let Err((field, why)) = spec.validate() {
        return Err(match t.get(field).or_else(|| t.get("interval_ms")) {
            Some(f) => f.invalid(why),
            None => t.missing(field, &why),
        });
    }
    Ok(())
}

/// A service's or real server's `health` table: its overrides, checked against the
/// checks they produce from `base`.
fn read_check_override<'a>(
    t: &Table<'a>,
    key: &str,
    base: &CheckSpec,
    extra: &[&str],
) -> Check<(CheckOverride, Option<Table<'a>>)> {
    let keys: Vec<&str> = CHECK_KEYS.iter().chain(extra).copied().collect();
    let Some(h) = t.table(key, &keys)? else {
        return Ok((CheckOverride::default(), None));
    };
    let o = read_check_fields(&h)?;
    check_spec(&h, &o.apply(base))?;
    Ok((o, Some(h)))
}

fn read_eal(root: &Table) -> Check<EalConfig> {
    let Some(t) = root.table("eal", EAL_KEYS)? else {
        return Ok(EalConfig::default());
    };
    let defaults = EalConfig::default();
    let eal = EalConfig {
        hugepages: t.or("hugepages", defaults.hugepages, Field::bool)?,
        memory_mb: t.or("memory_mb", defaults.memory_mb, |f| {
            f.int(1..=i64::from(u32::MAX))
        })?,
        file_prefix: t.or("file_prefix", defaults.file_prefix, fields::file_prefix)?,
        extra_args: t.or("extra_args", defaults.extra_args, Field::strings)?,
    };
    if let Some(f) = t.get("extra_args") {
        // Sluice always passes -m (eal.memory_mb); the EAL refuses --socket-mem
        // beside it, and a second -m, only once the EAL starts, after every check.
        let memory = |a: &str| {
            a == "-m"
                || (a.starts_with("-m") && a[2..].bytes().all(|b| b.is_ascii_digit()))
                || a == "--socket-mem"
                || a.starts_with("--socket-mem=")
        };
        if let Some(arg) = eal.extra_args.iter().find(|a| memory(a)) {
            return Err(f.invalid(format!(
                "{arg}: Sluice passes -m itself (eal.memory_mb), and the EAL refuses \
                 --socket-mem or another -m beside it: size the memory with eal.memory_mb"
            )));
        }
    }
    if !eal.hugepages && eal.memory_mb < MIN_NO_HUGE_MB {
        // Only reachable with memory_mb written out: the default is large enough.
        let at = t
            .get("memory_mb")
            .map_or_else(|| t.location(), |f| f.location());
        return Err(at.invalid(format!(
            "{} MB is too small without hugepages (at least {MIN_NO_HUGE_MB})",
            eal.memory_mb
        )));
    }
    Ok(eal)
}

fn read_lcores(root: &Table) -> Check<LcoreConfig> {
    let t = root
        .table("lcores", LCORE_KEYS)?
        .ok_or_else(|| root.missing("lcores", "an [lcores] section is required"))?;
    let management = fields::lcore_id(&t.require("management")?)?;
    let workers_field = t.require("workers")?;
    let workers = read_workers(&workers_field, management)?;
    let cpus = t.optional("cpus", |f| {
        let items = f.array()?;
        if items.len() != workers.len() {
            return Err(f.invalid(format!(
                "{} CPU(s) for {} worker(s): give one CPU per worker, in the same order",
                items.len(),
                workers.len()
            )));
        }
        items.iter().map(fields::lcore_id).collect()
    })?;
    let idle_sleep_us = t.optional("idle_sleep_us", fields::idle_sleep_us)?;
    Ok(LcoreConfig {
        management,
        workers,
        cpus,
        idle_sleep_us: idle_sleep_us.unwrap_or(0),
    })
}

/// Worker lcores: each owns one queue per port, so they must be distinct from each
/// other and from the management lcore (two loops on one core would starve).
fn read_workers(f: &Field, management: u32) -> Check<Vec<u32>> {
    let items = f.array()?;
    if items.is_empty() {
        return Err(f.invalid("at least one worker lcore is required"));
    }
    if items.len() > MAX_WORKERS {
        return Err(f.invalid(format!(
            "{} workers; at most {MAX_WORKERS} are supported",
            items.len()
        )));
    }
    let mut workers = Vec::with_capacity(items.len());
    for item in &items {
        let id = fields::lcore_id(item)?;
        if id == management {
            return Err(item.invalid(format!(
                "lcore {id} is the management lcore; workers need lcores of their own"
            )));
        }
        if workers.contains(&id) {
            return Err(item.invalid(format!("lcore {id} is listed twice")));
        }
        workers.push(id);
    }
    Ok(workers)
}

fn read_control(root: &Table) -> Check<ControlConfig> {
    let (socket, metrics, group) = match root.table("control", CONTROL_KEYS)? {
        Some(t) => (
            t.optional("socket", fields::socket_path)?,
            t.optional("metrics", |f| {
                f.str()?
                    .parse::<std::net::SocketAddr>()
                    .map_err(|_| f.invalid("expected ADDRESS:PORT, for example \"127.0.0.1:9101\""))
            })?,
            t.optional("group", fields::group)?,
        ),
        None => (None, None, None),
    };
    Ok(ControlConfig {
        socket: socket.unwrap_or_else(|| DEFAULT_SOCKET.into()),
        metrics,
        group,
    })
}

/// A port as read, with the places the cross-port checks need to point at.
struct PortRead {
    config: PortConfig,
    name_at: Location,
    /// The `pci`, `vdev` or `loopback` key.
    device_at: Location,
    address_at: Vec<Location>,
    address6_at: Vec<Location>,
    /// `[ports.exception]`'s table.
    exception_at: Option<Location>,
    /// Each of `static_neighbours`' `address`.
    static_neighbours_at: Vec<Location>,
}

impl PortRead {
    fn is_loopback(&self) -> bool {
        matches!(self.config.device, PortDevice::Loopback)
    }
}

fn read_ports(root: &Table, source: &Source) -> Check<Vec<PortRead>> {
    let list = root
        .get("ports")
        .ok_or_else(|| root.missing("ports", "at least one [[ports]] table is required"))?;
    let items = table_array(&list, "port", "[[ports]]")?;
    if items.is_empty() {
        return Err(list.invalid("at least one port is required"));
    }
    let mut unique = Uniqueness::default();
    let mut ports = Vec::with_capacity(items.len());
    for item in &items {
        let port = read_port(item, source)?;
        unique.check(&port)?;
        ports.push(port);
    }
    Ok(ports)
}

/// The elements of an array of tables (`[[header]]`); a single `[header]` table is
/// the usual mistake, so the message says how to write it.
fn table_array<'a>(f: &Field<'a>, what: &str, header: &str) -> Check<Vec<Field<'a>>> {
    f.array().map_err(|_| {
        f.invalid(format!(
            "expected an array of tables: write each {what} as a {header} table"
        ))
    })
}

fn read_port(f: &Field, source: &Source) -> Check<PortRead> {
    let t = f.table(PORT_KEYS)?;
    let name_field = t.require("name")?;
    let name = fields::port_name(&name_field)?;
    let (device, device_at) = read_device(&t)?;
    let mac = t.optional("mac", fields::mac_address)?;
    let address_field = t.require("addresses")?;
    let read = read_addresses(&address_field)?;
    let exception = read_exception(&t, &name, source)?;
    let (static_neighbours, static_neighbours_at) = match t.get("static_neighbours") {
        Some(f) => read_static_neighbours(&f, &read)?,
        None => (Vec::new(), Vec::new()),
    };
    let mtu = t.optional("mtu", fields::mtu)?;
    if let (Some(small), Some(at)) = (mtu.filter(|m| *m < 1280), t.get("mtu")) {
        if !read.v6.is_empty() {
            // RFC 8200: every IPv6 link carries 1280; a Packet Too Big below it
            // would be ignored (RFC 8201), and the clients' packets lost.
            return Err(at.invalid(format!(
                "{small} is below IPv6's minimum link MTU of 1280, and the port has IPv6 addresses"
            )));
        }
    }
    Ok(PortRead {
        config: PortConfig {
            name,
            device,
            mac,
            addresses: read.v4,
            addresses6: read.v6,
            rx_desc: t.or("rx_desc", DEFAULT_DESC, fields::desc_count)?,
            tx_desc: t.or("tx_desc", DEFAULT_DESC, fields::desc_count)?,
            rss_key: t.optional("rss_key", fields::rss_key)?,
            mtu,
            exception,
            static_neighbours,
        },
        name_at: name_field.location(),
        static_neighbours_at,
        device_at,
        address_at: read.v4_at,
        address6_at: read.v6_at,
        exception_at: t.get("exception").map(|f| f.location()),
    })
}

/// Across ports: no static neighbour twice (the workers' tables are keyed by address
/// alone), and each family's within an eighth of `sessions.neighbours`, so that real
/// servers (three quarters) and learned neighbours keep their room.
fn check_static_neighbours(ports: &[PortRead], sessions: &SessionsConfig) -> Check<()> {
    let mut seen: HashMap<IpAddr, String> = HashMap::new();
    let (mut v4, mut v6) = (0usize, 0usize);
    let room = (sessions.neighbours / 8) as usize;
    for (p, port) in ports.iter().enumerate() {
        for (i, (n, at)) in port
            .config
            .static_neighbours
            .iter()
            .zip(&port.static_neighbours_at)
            .enumerate()
        {
            let here = format!("ports[{p}].static_neighbours[{i}].address");
            if let Some(first) = seen.insert(n.address, here) {
                return Err(at.invalid(format!(
                    "{} is a static neighbour of another port too ({first})",
                    n.address
                )));
            }
            let count = if n.address.is_ipv4() {
                &mut v4
            } else {
                &mut v6
            };
            *count += 1;
            if *count > room {
                return Err(at.invalid(format!(
                    "more than {room} static neighbours of one address family: they would \
                     take more than an eighth of the workers' neighbour tables \
                     (sessions.neighbours = {}); raise sessions.neighbours",
                    sessions.neighbours
                )));
            }
        }
    }
    Ok(())
}

/// `static_neighbours = [{ address = "...", mac = "..." }, ...]`: each address on one
/// of the port's own subnets (an IPv6 one, or link-local) and not its own, each MAC
/// unicast and not zero, no address twice.
fn read_static_neighbours(
    f: &Field,
    port: &PortAddresses,
) -> Check<(Vec<StaticNeighbour>, Vec<Location>)> {
    let items = f.array()?;
    if items.len() > MAX_STATIC_NEIGHBOURS {
        return Err(f.invalid(format!(
            "{} static neighbours; a port may have at most {MAX_STATIC_NEIGHBOURS}",
            items.len()
        )));
    }
    let (mut read, mut at) = (Vec::new(), Vec::new());
    for item in &items {
        let t = item.table(STATIC_NEIGHBOUR_KEYS)?;
        let address_field = t.require("address")?;
        let text = address_field.str()?;
        let address: IpAddr = text.parse().map_err(|_| {
            address_field.invalid(format!("{text:?} is not an IPv4 or IPv6 address"))
        })?;
        let on_link = match address {
            IpAddr::V4(ip) => port
                .v4
                .iter()
                // A /31 or /32 (RFC 3021) has no network or broadcast address to skip.
                .any(|c| {
                    c.contains(ip)
                        && (c.prefix_len > 30 || (ip != c.network() && ip != c.broadcast()))
                }),
            IpAddr::V6(ip) => {
                port.v6.iter().any(|c| c.contains(ip))
                    || (ip.segments()[0] & 0xffc0 == 0xfe80 && !ip.is_multicast())
            }
        };
        if !on_link {
            return Err(address_field.invalid(format!(
                "{address} is on none of this port's subnets (a neighbour is a host on the \
                 port's link: a real server, a gateway, a peer)"
            )));
        }
        let ours = match address {
            IpAddr::V4(ip) => port.v4.iter().any(|c| c.addr == ip),
            IpAddr::V6(ip) => port.v6.iter().any(|c| c.addr == ip),
        };
        if ours {
            return Err(
                address_field.invalid(format!("{address} is one of this port's own addresses"))
            );
        }
        if let Some(first) = read
            .iter()
            .position(|n: &StaticNeighbour| n.address == address)
        {
            return Err(address_field.invalid(format!(
                "{address} is given twice (first at static_neighbours[{first}])"
            )));
        }
        let mac = t.require("mac").and_then(|m| fields::neighbour_mac(&m))?;
        read.push(StaticNeighbour { address, mac });
        at.push(address_field.location());
    }
    Ok((read, at))
}

/// `[ports.exception]`: `kind` ("tap" or "virtio-user") is required; the interface
/// is named after the port unless `interface` says otherwise.
fn read_exception(t: &Table, port: &str, source: &Source) -> Check<Option<ExceptionConfig>> {
    let Some(e) = t.table("exception", EXCEPTION_KEYS)? else {
        return Ok(None);
    };
    let kind_field = e.require("kind")?;
    let kind = match kind_field.str()? {
        "tap" => ExceptionKind::Tap,
        "virtio-user" => ExceptionKind::VirtioUser,
        other => {
            return Err(kind_field.invalid(format!(
                "{other:?} is not a kind of kernel interface (expected \"tap\" or \"virtio-user\")"
            )))
        }
    };
    let interface = match e.get("interface") {
        Some(f) => fields::interface_name(&f)?,
        None => format!("sx-{port}").chars().take(15).collect(),
    };
    let ring_size = e.or("ring_size", ExceptionConfig::DEFAULT_RING_SIZE, |f| {
        let n: u32 = f.int(64..=16_384)?;
        if !n.is_power_of_two() {
            return Err(f.invalid(format!("{n} is not a power of two (64..=16384)")));
        }
        Ok(n)
    })?;
    Ok(Some(ExceptionConfig {
        kind,
        interface,
        rate: e.or("rate", ExceptionConfig::DEFAULT_RATE, |f| {
            let max = exception::MAX_RATE;
            let n: i64 = f.int(i64::MIN..=i64::MAX)?;
            if n < 1 {
                return Err(f.invalid(format!("{n} is out of range (1..={max})")));
            }
            if n > i64::from(max) {
                return Err(f.invalid(format!(
                    "{n} frames/s is more than the management core writes to the kernel \
                     interface: at most {max} ({} frames per 5 ms tick, {}/s, less the \
                     {}/s of the control budget for BGP, BFD and ARP)",
                    exception::FRAMES_PER_TICK,
                    exception::FRAMES_PER_TICK * exception::TICKS_PER_SECOND,
                    exception::CONTROL_RATE
                )));
            }
            Ok(n as u32)
        })?,
        ring_size,
        kind_line: source.line(kind_field.node.start()),
    }))
}

/// Exactly one of `pci`, `vdev`, `loopback = true`. (`loopback = false` is allowed
/// and means "not a loopback port", so the flag can be switched off in place.)
fn read_device(t: &Table) -> Check<(PortDevice, Location)> {
    let mut kinds: Vec<(PortDevice, Field)> = Vec::new();
    if let Some(f) = t.get("pci") {
        kinds.push((PortDevice::Pci(fields::pci_address(&f)?), f));
    }
    if let Some(f) = t.get("vdev") {
        kinds.push((PortDevice::Vdev(fields::vdev_spec(&f)?), f));
    }
    if let Some(f) = t.get("loopback") {
        if f.bool()? {
            kinds.push((PortDevice::Loopback, f));
        }
    }
    match kinds.len() {
        0 => Err(t
            .location()
            .invalid("no device: set exactly one of `pci`, `vdev` or `loopback = true`")),
        1 => {
            let (device, f) = kinds.remove(0);
            Ok((device, f.location()))
        }
        _ => Err(kinds[1].1.invalid(format!(
            "conflicts with `{}`: set exactly one of `pci`, `vdev` or `loopback = true`",
            last_segment(&kinds[0].1.path)
        ))),
    }
}

fn last_segment(path: &str) -> &str {
    path.rsplit('.').next().unwrap_or(path)
}

/// A port's `addresses`, IPv4 and IPv6 apart, each with where it was written.
struct PortAddresses {
    v4: Vec<Ipv4Cidr>,
    v4_at: Vec<Location>,
    v6: Vec<Ipv6Cidr>,
    v6_at: Vec<Location>,
}

/// `addresses`: 1..=16 IPv4 addresses and 0..=16 IPv6 ones (those with a colon), in
/// any order. The first IPv4 address is the source of Sluice's own IPv4 packets.
fn read_addresses(f: &Field) -> Check<PortAddresses> {
    let items = f.array()?;
    let mut read = PortAddresses {
        v4: Vec::new(),
        v4_at: Vec::new(),
        v6: Vec::new(),
        v6_at: Vec::new(),
    };
    for item in &items {
        if item.str()?.contains(':') {
            read.v6.push(fields::port_address6(item)?);
            read.v6_at.push(item.location());
        } else {
            read.v4.push(fields::port_address(item)?);
            read.v4_at.push(item.location());
        }
    }
    if read.v4.is_empty() || read.v4.len() > MAX_ADDRESSES {
        return Err(f.invalid(format!(
            "{} IPv4 addresses; a port needs 1..={MAX_ADDRESSES} (IPv6 addresses come besides them)",
            read.v4.len()
        )));
    }
    if read.v6.len() > MAX_ADDRESSES {
        return Err(f.invalid(format!(
            "{} IPv6 addresses; a port may have at most {MAX_ADDRESSES}",
            read.v6.len()
        )));
    }
    Ok(read)
}

/// Things that must be unique across all ports, and where each was first seen.
#[derive(Default)]
struct Uniqueness {
    names: HashMap<String, String>,
    /// "PCI device 0000:03:00.0" or "vdev net_af_packet0".
    devices: HashMap<String, String>,
    addresses: HashMap<Ipv4Addr, String>,
    addresses6: HashMap<Ipv6Addr, String>,
    loopback: Option<String>,
    /// Kernel interfaces of `[ports.exception]`.
    interfaces: HashMap<String, String>,
}

impl Uniqueness {
    fn check(&mut self, port: &PortRead) -> Check<()> {
        let p = &port.config;
        let what = format!("port name {:?}", p.name);
        claim(&mut self.names, p.name.clone(), &port.name_at, &what)?;
        match &p.device {
            PortDevice::Pci(addr) => {
                let what = format!("PCI device {addr}");
                claim(&mut self.devices, what.clone(), &port.device_at, &what)?
            }
            PortDevice::Vdev(spec) => {
                let what = format!("vdev {}", fields::vdev_name(spec));
                claim(&mut self.devices, what.clone(), &port.device_at, &what)?
            }
            PortDevice::Loopback => self.claim_loopback(&port.device_at)?,
        }
        for (cidr, at) in p.addresses.iter().zip(&port.address_at) {
            let what = format!("address {}", cidr.addr);
            claim(&mut self.addresses, cidr.addr, at, &what)?;
        }
        for (cidr, at) in p.addresses6.iter().zip(&port.address6_at) {
            let what = format!("address {}", cidr.addr);
            claim(&mut self.addresses6, cidr.addr, at, &what)?;
        }
        if let (Some(e), Some(at)) = (&p.exception, &port.exception_at) {
            if p.device == PortDevice::Loopback {
                return Err(at.invalid(
                    "a loopback port has no kernel side to pair: remove [ports.exception]",
                ));
            }
            let what = format!("kernel interface {:?}", e.interface);
            claim(&mut self.interfaces, e.interface.clone(), at, &what)?;
        }
        Ok(())
    }

    /// One emulator serves one port: a second loopback port would have no far side.
    fn claim_loopback(&mut self, at: &Location) -> Check<()> {
        if let Some(first) = &self.loopback {
            return Err(at.invalid(format!(
                "only one port may be a loopback port, and {first} already is"
            )));
        }
        self.loopback = Some(at.field.clone());
        Ok(())
    }
}

/// Records `key` as used at `at`, or reports where it was used before.
fn claim<K: std::hash::Hash + Eq>(
    seen: &mut HashMap<K, String>,
    key: K,
    at: &Location,
    what: &str,
) -> Check<()> {
    claim_with(seen, key, at, |first| {
        format!("{what} is already used by {first}")
    })
}

/// `claim` with its own message; `taken` gets the field path of the first use.
fn claim_with<K: std::hash::Hash + Eq>(
    seen: &mut HashMap<K, String>,
    key: K,
    at: &Location,
    taken: impl FnOnce(&str) -> String,
) -> Check<()> {
    if let Some(first) = seen.get(&key) {
        return Err(at.invalid(taken(first)));
    }
    seen.insert(key, at.field.clone());
    Ok(())
}

/// `[loopback]`: needed by a loopback port, validated even when unused so a file
/// that is switched to loopback later does not suddenly fail.
fn read_loopback(root: &Table, ports: &[PortRead]) -> Check<LoopbackConfig> {
    let section = root.table("loopback", LOOPBACK_KEYS)?;
    let loopback_port = ports.iter().find(|p| p.is_loopback());
    let Some(t) = section else {
        return match loopback_port {
            Some(port) => Err(port.device_at.invalid(
                "a loopback port needs a [loopback] section (the peer emulator's settings)",
            )),
            None => Ok(LoopbackConfig::default()),
        };
    };
    let d = LoopbackConfig::default();
    let cfg = LoopbackConfig {
        peers: t.or("peers", d.peers, |f| f.int(1..=250))?,
        ping_interval_ms: t.or("ping_interval_ms", d.ping_interval_ms, |f| {
            f.int(1..=i64::MAX)
        })?,
        garbage_every: t.or("garbage_every", d.garbage_every, |f| {
            f.int(0..=i64::from(u32::MAX))
        })?,
        stats_interval_ms: t.or("stats_interval_ms", d.stats_interval_ms, |f| {
            f.int(100..=i64::MAX)
        })?,
    };
    if let Some(port) = loopback_port {
        let at = t
            .get("peers")
            .map_or_else(|| t.location(), |f| f.location());
        check_peers_fit(&port.config, cfg.peers).map_err(|why| at.invalid(why))?;
    }
    Ok(cfg)
}

/// The emulated peers live at the port's first address +1, +2, ...: each must be a
/// usable host of that subnet and must not be one of the port's own addresses.
fn check_peers_fit(port: &PortConfig, peers: u16) -> Result<(), String> {
    let Some(first) = port.addresses.first() else {
        return Ok(());
    };
    for k in 1..=u32::from(peers) {
        let peer = u32::from(first.addr)
            .checked_add(k)
            .map(Ipv4Addr::from)
            .filter(|&ip| first.contains(ip) && (first.prefix_len > 30 || ip != first.broadcast()));
        let Some(peer) = peer else {
            return Err(format!(
                "{peers} peers do not fit in {first}: peer {k} would be outside the subnet or its broadcast address"
            ));
        };
        if port.addresses.iter().any(|a| a.addr == peer) {
            return Err(format!(
                "peer {k} would be {peer}, which is one of port {:?}'s own addresses",
                port.name
            ));
        }
    }
    Ok(())
}

/// `[timeouts]`: every key optional, each defaulting to IPVS's value.
fn read_timeouts(root: &Table) -> Check<TimeoutsConfig> {
    let d = TimeoutsConfig::default();
    let Some(t) = root.table("timeouts", TIMEOUT_KEYS)? else {
        return Ok(d);
    };
    let get = |key: &str, default: u32| t.or(key, default, fields::timeout_s);
    Ok(TimeoutsConfig {
        tcp_s: get("tcp", d.tcp_s)?,
        tcpfin_s: get("tcpfin", d.tcpfin_s)?,
        udp_s: get("udp", d.udp_s)?,
        syn_recv_s: get("syn_recv", d.syn_recv_s)?,
        syn_sent_s: get("syn_sent", d.syn_sent_s)?,
        time_wait_s: get("time_wait", d.time_wait_s)?,
        close_s: get("close", d.close_s)?,
        close_wait_s: get("close_wait", d.close_wait_s)?,
        last_ack_s: get("last_ack", d.last_ack_s)?,
    })
}

fn read_sessions(root: &Table) -> Check<SessionsConfig> {
    let d = SessionsConfig::default();
    let Some(t) = root.table("sessions", SESSION_KEYS)? else {
        return Ok(d);
    };
    let first = t.or("local_port_first", d.local_port_first, fields::local_port)?;
    let last = t.or("local_port_last", d.local_port_last, fields::local_port)?;
    if first > last {
        let at = t
            .get("local_port_last")
            .or_else(|| t.get("local_port_first"));
        if let Some(f) = at {
            return Err(f.invalid(format!(
                "local_port_first {first} is above local_port_last {last}"
            )));
        }
    }
    Ok(SessionsConfig {
        capacity: t.or("capacity", d.capacity, fields::session_capacity)?,
        tick_ms: t.or("tick_ms", d.tick_ms, fields::tick_ms)?,
        local_port_first: first,
        local_port_last: last,
        server_time_wait_s: t.or(
            "server_time_wait",
            d.server_time_wait_s,
            fields::server_time_wait_s,
        )?,
        rewrite_timestamps: t.or("rewrite_timestamps", d.rewrite_timestamps, Field::bool)?,
        icmp_error_limit: read_icmp_error_limit(&t, d.icmp_error_limit)?,
        neighbours: t.or("neighbours", d.neighbours, fields::neighbour_capacity)?,
        persistence_templates: t.or(
            "persistence_templates",
            d.persistence_templates,
            fields::persistence_templates,
        )?,
    })
}

/// `icmp_error_rate` (errors per second, 1 to `MAX_RATE`) and `icmp_error_burst` (1
/// to 10 times the rate; by default the default burst, or 10 times a lower rate).
fn read_icmp_error_limit(t: &Table, d: RateLimit) -> Check<RateLimit> {
    let max = i64::from(crate::service::admission::MAX_RATE);
    let rate: u32 = t.or("icmp_error_rate", d.rate, |f| f.int(1..=max))?;
    let burst: u32 = t.or(
        "icmp_error_burst",
        d.burst.min(rate.saturating_mul(10)),
        |f| f.int(1..=i64::from(u32::MAX)),
    )?;
    RateLimit::new(rate, burst, 32).map_err(|e| {
        let at = t
            .get("icmp_error_burst")
            .or_else(|| t.get("icmp_error_rate"));
        match at {
            Some(f) => f.invalid(e),
            None => unreachable!("the defaults are a valid limit"),
        }
    })
}

/// A service as read, with the places the cross-service checks need to point at.
struct ServiceRead {
    config: ServiceConfig,
    /// `services[i]`.
    path: String,
    local_address_at: Vec<Location>,
}

/// `[[services]]`: zero or more, each (protocol, VIP, port) at most once.
fn read_services(
    root: &Table,
    ports: &[PortRead],
    source: &Source,
    health: &HealthConfig,
) -> Check<Vec<ServiceConfig>> {
    let Some(list) = root.get("services") else {
        return Ok(Vec::new());
    };
    let items = table_array(&list, "service", "[[services]]")?;
    let mut seen: HashMap<ServiceKey, String> = HashMap::new();
    let mut services = Vec::with_capacity(items.len());
    for item in &items {
        let service = read_service(item, ports, source, &health.defaults)?;
        check_ipv6_neighbour_source(item, &service.config, ports, health)?;
        let key = service.config.key;
        claim_with(&mut seen, key, &item.location(), |first| {
            format!("service {key} is defined twice: {first} has the same protocol, VIP and port")
        })?;
        services.push(service);
    }
    check_local_address_roles(&services)?;
    Ok(services.into_iter().map(|s| s.config).collect())
}

fn read_service(
    f: &Field,
    ports: &[PortRead],
    source: &Source,
    checks: &CheckSpec,
) -> Check<ServiceRead> {
    let t = f.table(SERVICE_KEYS)?;
    let proto = fields::protocol(&t.require("proto")?)?;
    let vip_field = t.require("vip")?;
    let vip = fields::vip(&vip_field)?;
    if let Some(own) = own_address(ports, vip) {
        return Err(vip_field.invalid(format!(
            "VIP {vip} is one of the appliance's own addresses ({own}); a VIP needs an address of its own"
        )));
    }
    let port = fields::l4_port(&t.require("port")?)?;
    let scheduler = t.or("scheduler", SchedulerKind::DEFAULT, fields::scheduler)?;
    let sched_flags = t.or("scheduler_flags", SchedFlags::default(), |f| {
        let flags: SchedFlags = f.str()?.parse().map_err(|e: String| f.invalid(e))?;
        flags
            .check_compatible(scheduler)
            .map_err(|e| f.invalid(e))?;
        Ok(flags)
    })?;
    let mh_table_size = t.optional("mh_table_size", |f| {
        let size: u32 = f.int(1..=u32::MAX as i64)?;
        crate::sched::mh::check_table_size(size).map_err(|e| f.invalid(e))?;
        Ok(size)
    })?;
    let persistence = read_persistence(&t, vip.is_ipv6())?;
    let (local_addresses, local_address_at) = read_local_addresses(&t, ports)?;
    let toa = t.or("toa", false, |f| {
        let toa = f.bool()?;
        if toa && proto != Protocol::Tcp {
            return Err(f.invalid(
                "TOA is a TCP option: only a tcp service can carry it (UDP has no options to put it in)",
            ));
        }
        Ok(toa)
    })?;
    let (health, health_table) = read_check_override(&t, "health", checks, &["all_down"])?;
    let all_down = match &health_table {
        Some(h) => h.optional("all_down", read_all_down)?,
        None => None,
    };
    if vip.is_ipv6() {
        // The service table refuses them too; here the error names the field.
        for (field, what) in [
            ("acl_allow", "an access list"),
            ("acl_deny", "an access list"),
            ("acl_file", "an access list"),
            ("rate_limit", "a per-source rate limit"),
        ] {
            if let Some(at) = t.get(field) {
                return Err(at.invalid(format!(
                    "{what} is not supported on IPv6 services yet: its rules match IPv4 clients only"
                )));
            }
        }
    }
    let acl = read_acl(&t, source)?;
    let rate_limit = read_rate_limit(&t)?;
    let key = ServiceKey { proto, vip, port };
    let real_servers = read_real_servers(&t, key, ports, &health.apply(checks))?;
    let sorry_server = t.optional("sorry_server", |f| {
        read_sorry_server(f, key, ports, &real_servers)
    })?;
    check_fullnat_has_local_address(&t, &real_servers, sorry_server.as_ref(), &local_addresses)?;
    let synproxy = read_synproxy(&t, proto, &real_servers)?;
    let sloppy_tcp = read_sloppy_tcp(&t, proto, &real_servers, sorry_server.as_ref(), &synproxy)?;
    if let (Some(sorry), Some(at)) = (&sorry_server, t.get("sorry_server")) {
        if synproxy.mode != SynProxyMode::Off && !sorry.mode.rewrites_replies() {
            return Err(at.invalid(format!(
                "the SYN proxy needs nat or fullnat, but the sorry server uses mode {}, whose replies bypass Sluice",
                sorry.mode
            )));
        }
    }
    // The rules `sluicectl -A/-E` meets, so the file and the CLI accept the same.
    crate::service::validate_service(&key, persistence.as_ref())
        .map_err(|e| f.invalid(e.to_string()))?;
    Ok(ServiceRead {
        config: ServiceConfig {
            key: ServiceKey { proto, vip, port },
            scheduler,
            persistence,
            real_servers,
            local_addresses,
            toa,
            sloppy_tcp,
            synproxy,
            sched_flags,
            mh_table_size,
            health,
            all_down,
            acl,
            rate_limit,
            sorry_server,
            line: source.line(f.node.start()),
        },
        path: f.path.clone(),
        local_address_at,
    })
}

/// `acl_allow`, `acl_deny` (lists of prefixes) and `acl_file` (a list file, one
/// `allow|deny PREFIX` a line; relative to the config file's directory): one list,
/// each prefix once across the three.
fn read_acl(t: &Table, source: &Source) -> Check<Vec<(AclAction, Prefix)>> {
    let mut rules: Vec<(AclAction, Prefix)> = Vec::new();
    let mut seen: HashMap<Prefix, String> = HashMap::new();
    for (key, action) in [
        ("acl_allow", AclAction::Allow),
        ("acl_deny", AclAction::Deny),
    ] {
        let Some(f) = t.get(key) else {
            continue;
        };
        for item in f.array()? {
            let prefix: Prefix = item.str()?.parse().map_err(|e: String| item.invalid(e))?;
            if let Some(first) = seen.insert(prefix, item.path.clone()) {
                return Err(item.invalid(format!("{prefix} is already listed in {first}")));
            }
            rules.push((action, prefix));
        }
    }
    if let Some(f) = t.get("acl_file") {
        let (path, text) = read_acl_file(&f, source)?;
        let from_file = crate::service::acl::parse_rules(&text)
            .map_err(|(line, e)| f.invalid(format!("{}:{line}: {e}", path.display())))?;
        for (action, prefix) in from_file {
            if let Some(first) = seen.insert(prefix, f.path.clone()) {
                return Err(f.invalid(format!(
                    "{}: {prefix} is already listed in {first}",
                    path.display()
                )));
            }
            rules.push((action, prefix));
        }
    }
    if rules.len() > crate::service::acl::MAX_ACL_RULES {
        return Err(t.location().invalid(format!(
            "{} access-list rules; a service holds at most {}",
            rules.len(),
            crate::service::acl::MAX_ACL_RULES
        )));
    }
    Ok(rules)
}

/// `rate_limit` (new connections per second per source), `rate_limit_burst`
/// (default: the rate) and `rate_limit_prefix` (sources sharing a network of this
/// length share a bucket; default 32).
fn read_rate_limit(t: &Table) -> Check<Option<RateLimit>> {
    let Some(f) = t.get("rate_limit") else {
        for key in ["rate_limit_burst", "rate_limit_prefix"] {
            if let Some(other) = t.get(key) {
                return Err(other.invalid("needs rate_limit"));
            }
        }
        return Ok(None);
    };
    let rate: u32 = f.int(1..=i64::from(crate::service::admission::MAX_RATE))?;
    let burst: u32 = t.or("rate_limit_burst", rate, |b| b.int(1..=i64::from(u32::MAX)))?;
    let prefix: u8 = t.or("rate_limit_prefix", 32, |p| p.int(8..=32))?;
    RateLimit::new(rate, burst, prefix)
        .map(Some)
        .map_err(|e| f.invalid(e))
}

/// `local_addresses`: FullNAT source addresses (DPVS's `--add-laddr`), at most
/// [`MAX_LOCAL_ADDRESSES`], each once per service (several services may share one),
/// none of them a port's own address. Returned with their places.
fn read_local_addresses(t: &Table, ports: &[PortRead]) -> Check<(Vec<IpAddr>, Vec<Location>)> {
    let Some(f) = t.get("local_addresses") else {
        return Ok((Vec::new(), Vec::new()));
    };
    let items = f.array()?;
    if items.len() > MAX_LOCAL_ADDRESSES {
        return Err(f.invalid(format!(
            "{} local addresses; a service may have at most {MAX_LOCAL_ADDRESSES}",
            items.len()
        )));
    }
    let mut seen: HashMap<IpAddr, String> = HashMap::new();
    let mut addresses = Vec::with_capacity(items.len());
    for item in &items {
        let ip = fields::local_address(item)?;
        if let Some(own) = own_address(ports, ip) {
            return Err(item.invalid(format!(
                "local address {ip} is one of the appliance's own addresses ({own}); a local address needs an address of its own"
            )));
        }
        claim_with(&mut seen, ip, &item.location(), |first| {
            format!("local address {ip} is listed twice in this service ({first})")
        })?;
        addresses.push(ip);
    }
    Ok((addresses, items.iter().map(Field::location).collect()))
}

/// `sloppy_tcp`: the rules of [`crate::service::ServiceTable::set_sloppy_tcp`], named
/// at the key.
fn read_sloppy_tcp(
    t: &Table,
    proto: Protocol,
    servers: &[RealServerConfig],
    sorry: Option<&crate::model::SorryServerSpec>,
    synproxy: &SynProxy,
) -> Check<bool> {
    t.or("sloppy_tcp", false, |f| {
        let on = f.bool()?;
        if on && synproxy.mode != SynProxyMode::Off {
            return Err(f.invalid(
                "sloppy_tcp and synproxy exclude each other: the SYN proxy opens connections only from a cookie ACK",
            ));
        }
        if on && proto != Protocol::Tcp {
            return Err(f.invalid(
                "sloppy_tcp opens sessions from TCP segments that are not SYNs: only a tcp service can use it",
            ));
        }
        if on {
            let fullnat = servers
                .iter()
                .enumerate()
                .find(|(_, rs)| rs.mode == ForwardMode::FullNat)
                .map(|(i, rs)| format!("{}:{} ({}.real_servers[{i}])", rs.ip, rs.port, t.location().field))
                .or_else(|| {
                    sorry
                        .filter(|s| s.mode == ForwardMode::FullNat)
                        .map(|s| format!("{}:{} (its sorry_server)", s.ip, s.port))
                });
            if let Some(which) = fullnat {
                return Err(f.invalid(format!(
                    "sloppy_tcp cannot serve fullnat real server {which}: a session opened mid-connection would reach it from a new local port, a connection it never saw"
                )));
            }
        }
        Ok(on)
    })
}

/// `synproxy = "off" | "on" | "auto"`, `synproxy_auto_syn_rate` (SYNs per second
/// without a session, per worker, 1..=100 000 000) and `synproxy_syn_retries` (times
/// the SYN to the real server goes again, 0..=5). On and auto need a tcp service
/// whose real servers all use nat or fullnat: DR and TUN replies bypass Sluice, which
/// then could not translate them.
fn read_synproxy(t: &Table, proto: Protocol, servers: &[RealServerConfig]) -> Check<SynProxy> {
    let mode = t.or("synproxy", SynProxyMode::Off, |f| {
        let mode = SynProxyMode::parse(f.str()?)
            .ok_or_else(|| f.invalid("expected \"off\", \"on\" or \"auto\""))?;
        if mode != SynProxyMode::Off && proto != Protocol::Tcp {
            return Err(f.invalid(
                "the SYN proxy answers TCP handshakes: only a tcp service can use it",
            ));
        }
        if mode != SynProxyMode::Off {
            if let Some((i, rs)) = servers
                .iter()
                .enumerate()
                .find(|(_, rs)| !rs.mode.rewrites_replies())
            {
                return Err(f.invalid(format!(
                    "the SYN proxy needs nat or fullnat real servers, but {}:{} ({}.real_servers[{i}]) uses mode {}, whose replies bypass Sluice",
                    rs.ip,
                    rs.port,
                    t.location().field,
                    rs.mode.name()
                )));
            }
        }
        Ok(mode)
    })?;
    let auto_syn_rate = t.or(
        "synproxy_auto_syn_rate",
        DEFAULT_SYNPROXY_AUTO_SYN_RATE,
        |f| f.int(1..=100_000_000),
    )?;
    let syn_retries = t.or("synproxy_syn_retries", DEFAULT_SYNPROXY_SYN_RETRIES, |f| {
        f.int(0..=i64::from(MAX_SYNPROXY_SYN_RETRIES))
    })?;
    Ok(SynProxy {
        mode,
        auto_syn_rate,
        syn_retries,
    })
}

/// Sluice resolves an IPv6 real server (Neighbor Discovery) and probes it from the
/// first port's IPv6 addresses only: a service with an IPv6 real server or sorry
/// server on a first port with none would load, and every packet to that server would
/// wait for a neighbour entry nothing asks for and be dropped (`neighbour_unresolved`).
fn check_ipv6_neighbour_source(
    f: &Field,
    service: &ServiceConfig,
    ports: &[PortRead],
    health: &HealthConfig,
) -> Check<()> {
    if ports
        .first()
        .is_some_and(|p| !p.config.addresses6.is_empty())
    {
        return Ok(());
    }
    let mut overrides = crate::health::Overrides::default();
    overrides
        .services
        .insert(service.key, (service.health.clone(), service.all_down));
    for rs in &service.real_servers {
        overrides
            .servers
            .insert((service.key, rs.ip, rs.port), rs.health.clone());
    }
    let monitor =
        crate::health::HealthMonitor::new(health.clone(), Ipv4Addr::UNSPECIFIED, overrides, 0);
    let servers = service
        .real_servers
        .iter()
        .enumerate()
        .map(|(i, rs)| (rs.ip, rs.port, format!("real_servers[{i}]")))
        .chain(
            service
                .sorry_server
                .iter()
                .map(|s| (s.ip, s.port, "sorry_server".to_string())),
        );
    for (ip, port, what) in servers {
        if !ip.is_ipv6() {
            continue;
        }
        let kind = monitor.spec_for(service.key, ip, port).kind;
        let probed = if kind != crate::health::spec::CheckKind::None {
            format!(" (and probes its {} check from one)", kind.name())
        } else {
            String::new()
        };
        return Err(f.invalid(format!(
            "{} ({what}) is IPv6, but the first port has no IPv6 address: Sluice finds \
             its MAC by Neighbor Discovery from that port's IPv6 address{probed}; add an \
             IPv6 address to the first port's addresses",
            std::net::SocketAddr::new(ip, port),
        )));
    }
    Ok(())
}

/// FullNAT rewrites the client's address to one of the service's local addresses, so
/// a service with a fullnat real server, or a fullnat sorry server, needs at least
/// one.
fn check_fullnat_has_local_address(
    t: &Table,
    servers: &[RealServerConfig],
    sorry: Option<&crate::model::SorryServerSpec>,
    local_addresses: &[IpAddr],
) -> Check<()> {
    if !local_addresses.is_empty() {
        return Ok(());
    }
    let which = servers
        .iter()
        .enumerate()
        .find(|(_, rs)| rs.mode == ForwardMode::FullNat)
        .map(|(i, rs)| {
            format!(
                "real server {}:{} ({}.real_servers[{i}])",
                rs.ip,
                rs.port,
                t.location().field
            )
        })
        .or_else(|| {
            sorry.filter(|s| s.mode == ForwardMode::FullNat).map(|s| {
                format!(
                    "sorry server {}:{} ({}.sorry_server)",
                    s.ip,
                    s.port,
                    t.location().field
                )
            })
        });
    let Some(which) = which else {
        return Ok(());
    };
    let why = format!(
        "{which} uses mode fullnat, which needs at least one local address to use as the source towards the real servers"
    );
    match t.get("local_addresses") {
        Some(f) => Err(f.invalid(format!("no local addresses, but {why}"))),
        None => Err(t.missing("local_addresses", &why)),
    }
}

/// Sluice answers ARP for its local addresses and sends FullNAT traffic from them, so
/// none may also be a VIP or a real server, of this service or any other.
fn check_local_address_roles(services: &[ServiceRead]) -> Check<()> {
    if services.iter().all(|s| s.config.local_addresses.is_empty()) {
        return Ok(());
    }
    let mut roles: HashMap<IpAddr, String> = HashMap::new();
    for s in services {
        let key = s.config.key;
        roles
            .entry(key.vip)
            .or_insert_with(|| format!("the VIP of {key} ({}.vip)", s.path));
        for (i, rs) in s.config.real_servers.iter().enumerate() {
            roles.entry(rs.ip).or_insert_with(|| {
                format!("a real server of {key} ({}.real_servers[{i}])", s.path)
            });
        }
        if let Some(sorry) = &s.config.sorry_server {
            roles
                .entry(sorry.ip)
                .or_insert_with(|| format!("the sorry server of {key} ({}.sorry_server)", s.path));
        }
    }
    for s in services {
        for (ip, at) in s.config.local_addresses.iter().zip(&s.local_address_at) {
            if let Some(role) = roles.get(ip) {
                return Err(at.invalid(format!(
                    "local address {ip} is {role}; a local address needs an address of its own"
                )));
            }
        }
    }
    Ok(())
}

/// The field path of the port address equal to `ip`, if any.
fn own_address(ports: &[PortRead], ip: IpAddr) -> Option<&str> {
    ports.iter().find_map(|p| match ip {
        IpAddr::V4(ip) => p
            .config
            .addresses
            .iter()
            .zip(&p.address_at)
            .find(|(cidr, _)| cidr.addr == ip)
            .map(|(_, at)| at.field.as_str()),
        IpAddr::V6(ip) => p
            .config
            .addresses6
            .iter()
            .zip(&p.address6_at)
            .find(|(cidr, _)| cidr.addr == ip)
            .map(|(_, at)| at.field.as_str()),
    })
}

/// `persistence_timeout` (`-p`) with an optional `persistence_netmask` (`-M`): a
/// dotted netmask for an IPv4 service, a prefix length (an integer, 1..=128) for an
/// IPv6 one, as ipvsadm's `-M` takes after an IPv6 `-t`. The netmask means nothing
/// without the timeout.
fn read_persistence(t: &Table, ipv6: bool) -> Check<Option<Persistence>> {
    let timeout = t.optional("persistence_timeout", fields::persistence_timeout)?;
    let netmask_field = t.get("persistence_netmask");
    let (netmask, prefix6) = match &netmask_field {
        Some(f) if ipv6 => (None, Some(fields::prefix6(f)?)),
        Some(f) => (Some(fields::netmask(f)?), None),
        None => (None, None),
    };
    match (timeout, netmask_field) {
        (Some(timeout_s), _) => Ok(Some(Persistence {
            netmask: netmask.unwrap_or(DEFAULT_PERSISTENCE_NETMASK),
            prefix6: prefix6.unwrap_or(Persistence::FULL_PREFIX6),
            ..Persistence::new(timeout_s)
        })),
        (None, Some(f)) => Err(f.invalid(
            "only applies to a persistent service: set `persistence_timeout` too (ipvsadm -M needs -p)",
        )),
        (None, None) => Ok(None),
    }
}

/// `[[services.real_servers]]`: zero or more, each (address, port) at most once.
fn read_real_servers(
    t: &Table,
    service: ServiceKey,
    ports: &[PortRead],
    checks: &CheckSpec,
) -> Check<Vec<RealServerConfig>> {
    let Some(list) = t.get("real_servers") else {
        return Ok(Vec::new());
    };
    let items = table_array(&list, "real server", "[[services.real_servers]]")?;
    let mut seen: HashMap<(IpAddr, u16), String> = HashMap::new();
    let mut servers = Vec::with_capacity(items.len());
    for item in &items {
        let rs = read_real_server(item, service, ports, checks)?;
        claim_with(&mut seen, (rs.ip, rs.port), &item.location(), |first| {
            format!(
                "real server {} is already in this service ({first})",
                std::net::SocketAddr::new(rs.ip, rs.port)
            )
        })?;
        servers.push(rs);
    }
    Ok(servers)
}

/// `sorry_server = { ip, port, mode, inhibit }`: the rules of a real server of the
/// service, and not one of them.
fn read_sorry_server(
    f: &Field,
    service: ServiceKey,
    ports: &[PortRead],
    real_servers: &[RealServerConfig],
) -> Check<SorryServerConfig> {
    let t = f.table(SORRY_SERVER_KEYS)?;
    let ip_field = t.require("ip")?;
    let ip = fields::real_server_ip(&ip_field)?;
    if let Some(own) = own_address(ports, ip) {
        return Err(ip_field.invalid(format!(
            "sorry server {ip} is one of the appliance's own addresses ({own})"
        )));
    }
    let mode = t.or("mode", DEFAULT_MODE, fields::forward_mode)?;
    let port = t.or("port", service.port, fields::l4_port)?;
    let inhibit = t.or("inhibit", false, |f| f.bool())?;
    if real_servers.iter().any(|r| (r.ip, r.port) == (ip, port)) {
        return Err(f.invalid(format!(
            "{} is also a real server of this service: a sorry server is another server",
            std::net::SocketAddr::new(ip, port)
        )));
    }
    let spec = RealServerSpec::new(ip, port, 1, mode);
    crate::service::validate_server(&service, &spec).map_err(|e| f.invalid(e.to_string()))?;
    Ok(SorryServerConfig {
        ip,
        port,
        mode,
        inhibit,
    })
}

fn read_real_server(
    f: &Field,
    service: ServiceKey,
    ports: &[PortRead],
    checks: &CheckSpec,
) -> Check<RealServerConfig> {
    let service_port = service.port;
    let t = f.table(REAL_SERVER_KEYS)?;
    let ip_field = t.require("ip")?;
    let ip = fields::real_server_ip(&ip_field)?;
    if let Some(own) = own_address(ports, ip) {
        return Err(ip_field.invalid(format!(
            "real server {ip} is one of the appliance's own addresses ({own})"
        )));
    }
    let mode = t.or("mode", DEFAULT_MODE, fields::forward_mode)?;
    let port = t.or("port", service_port, |f| {
        let port = fields::l4_port(f)?;
        if port != service_port && !matches!(mode, ForwardMode::Nat | ForwardMode::FullNat) {
            let default = if t.get("mode").is_none() { " (the default)" } else { "" };
            return Err(f.invalid(format!(
                "port {port} differs from the service port {service_port}, but mode {mode}{default} keeps the destination port: only nat and fullnat can change it (as in ipvsadm)"
            )));
        }
        Ok(port)
    })?;
    let weight = t.or("weight", DEFAULT_WEIGHT, fields::weight)?;
    let upper = t.or("upper", 0, fields::conn_threshold)?;
    let lower = t.or("lower", 0, |f| {
        let lower = fields::conn_threshold(f)?;
        // As IPVS (and so `ipvsadm -a/-e`), even without an upper threshold.
        if lower > upper {
            return Err(f.invalid(format!(
                "{lower} is above the upper threshold {upper}: an overloaded server would count as recovered at once (set `upper` too, or leave `lower` out)"
            )));
        }
        Ok(lower)
    })?;
    // The rules `sluicectl -a/-e` meets: anything the fields above let through and the
    // table would refuse is refused here, at the real server's place in the file.
    let spec = RealServerSpec::new(ip, port, weight, mode).with_thresholds(upper, lower);
    crate::service::validate_server(&service, &spec).map_err(|e| f.invalid(e.to_string()))?;
    let (health, _) = read_check_override(&t, "health", checks, &[])?;
    Ok(RealServerConfig {
        ip,
        port,
        weight,
        mode,
        health,
        upper,
        lower,
    })
}
