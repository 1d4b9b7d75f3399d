//! The config file's layout: which sections and keys exist, their defaults, and the
//! rules that involve more than one field (uniqueness across ports, the loopback
//! section, lcore overlap).

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::path::Path;

use super::fields;
use super::reader::{Check, Field, Location, Table};
use super::tree::Node;
use super::{
    Config, ControlConfig, EalConfig, Ipv4Cidr, LcoreConfig, LoopbackConfig, PortConfig, PortDevice,
};

const ROOT_KEYS: &[&str] = &["eal", "lcores", "control", "ports", "loopback"];
const EAL_KEYS: &[&str] = &["hugepages", "memory_mb", "file_prefix", "extra_args"];
const LCORE_KEYS: &[&str] = &["management", "workers"];
const CONTROL_KEYS: &[&str] = &["socket"];
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
];
const LOOPBACK_KEYS: &[&str] = &[
    "peers",
    "ping_interval_ms",
    "garbage_every",
    "stats_interval_ms",
];

const DEFAULT_SOCKET: &str = "/run/sluice/sluice.sock";
const DEFAULT_DESC: u16 = 1024;
/// Without hugepages DPDK still needs room for its own heap and one mempool.
const MIN_NO_HUGE_MB: u32 = 64;
const MAX_WORKERS: usize = 64;
const MAX_ADDRESSES: usize = 16;

/// Reads and validates a parsed document.
pub(super) fn read_config(root: Node, path: &Path) -> Check<Config> {
    let root = Table::root(root, ROOT_KEYS)?;
    let eal = read_eal(&root)?;
    let lcores = read_lcores(&root)?;
    let control = read_control(&root)?;
    let ports = read_ports(&root)?;
    let loopback = read_loopback(&root, &ports)?;
    Ok(Config {
        path: path.to_path_buf(),
        eal,
        lcores,
        control,
        ports: ports.into_iter().map(|p| p.config).collect(),
        loopback,
    })
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
    Ok(LcoreConfig {
        management,
        workers,
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
    let socket = match root.table("control", CONTROL_KEYS)? {
        Some(t) => t.optional("socket", fields::socket_path)?,
        None => None,
    };
    Ok(ControlConfig {
        socket: socket.unwrap_or_else(|| DEFAULT_SOCKET.into()),
    })
}

/// A port as read, with the places the cross-port checks need to point at.
struct PortRead {
    config: PortConfig,
    name_at: Location,
    /// The `pci`, `vdev` or `loopback` key.
    device_at: Location,
    address_at: Vec<Location>,
}

impl PortRead {
    fn is_loopback(&self) -> bool {
        matches!(self.config.device, PortDevice::Loopback)
    }
}

fn read_ports(root: &Table) -> Check<Vec<PortRead>> {
    let list = root
        .get("ports")
        .ok_or_else(|| root.missing("ports", "at least one [[ports]] table is required"))?;
    let items = list.array().map_err(|_| {
        list.invalid("expected an array of tables: write each port as a [[ports]] table")
    })?;
    if items.is_empty() {
        return Err(list.invalid("at least one port is required"));
    }
    let mut unique = Uniqueness::default();
    let mut ports = Vec::with_capacity(items.len());
    for item in &items {
        let port = read_port(item)?;
        unique.check(&port)?;
        ports.push(port);
    }
    Ok(ports)
}

fn read_port(f: &Field) -> Check<PortRead> {
    let t = f.table(PORT_KEYS)?;
    let name_field = t.require("name")?;
    let name = fields::port_name(&name_field)?;
    let (device, device_at) = read_device(&t)?;
    let mac = t.optional("mac", fields::mac_address)?;
    let address_field = t.require("addresses")?;
    let addresses = read_addresses(&address_field)?;
    Ok(PortRead {
        config: PortConfig {
            name,
            device,
            mac,
            addresses,
            rx_desc: t.or("rx_desc", DEFAULT_DESC, fields::desc_count)?,
            tx_desc: t.or("tx_desc", DEFAULT_DESC, fields::desc_count)?,
            rss_key: t.optional("rss_key", fields::rss_key)?,
            mtu: t.optional("mtu", fields::mtu)?,
        },
        name_at: name_field.location(),
        device_at,
        address_at: address_field.array()?.iter().map(Field::location).collect(),
    })
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

fn read_addresses(f: &Field) -> Check<Vec<Ipv4Cidr>> {
    let items = f.array()?;
    if items.is_empty() || items.len() > MAX_ADDRESSES {
        return Err(f.invalid(format!(
            "{} addresses; a port needs 1..={MAX_ADDRESSES}",
            items.len()
        )));
    }
    items.iter().map(fields::port_address).collect()
}

/// Things that must be unique across all ports, and where each was first seen.
#[derive(Default)]
struct Uniqueness {
    names: HashMap<String, String>,
    /// "PCI device 0000:03:00.0" or "vdev net_af_packet0".
    devices: HashMap<String, String>,
    addresses: HashMap<Ipv4Addr, String>,
    loopback: Option<String>,
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
    if let Some(first) = seen.get(&key) {
        return Err(at.invalid(format!("{what} is already used by {first}")));
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
