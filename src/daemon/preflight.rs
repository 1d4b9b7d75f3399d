//! Checks made before the EAL starts, so that a config this machine cannot run is
//! refused at once, naming the field, with nothing left behind (no DPDK runtime
//! directory, no control socket):
//!
//! - every lcore runs on a CPU this process may use (`sched_getaffinity`);
//! - the memory the tables will take fits in what the kernel has available;
//! - the mbuf pool and what the EAL takes besides fit in `eal.memory_mb`;
//! - the open-file limit leaves room for the EAL's and the ports' descriptors;
//! - no other Sluice holds the control socket or an attached interface (an exclusive
//!   `flock` on a lock file per socket and per interface, held until exit);
//! - the metrics endpoint and session sync can bind their addresses ([`Listeners`]).
use crate::config::{Config, PortDevice};
use crate::dataplane::forwarder::Forwarder;
use crate::dataplane::mesh::{HEALTH_RING_SIZE, REDIRECT_RING_SIZE, SYNC_PORT_RING_SIZE};
use crate::dataplane::realserver_stats::{RealServerCounters, MAX_REAL_SERVER_IDS};
use crate::dpdk::{cpu_list, thread_cpus, DeviceLimits, PoolFootprint, MBUF_DATA_ROOM};
use crate::forward::laddr::PortPool;
use crate::session::persist::PersistTable;
use crate::session::DEFAULT_WHEEL_SLOTS;
use std::fs::File;
use std::io::{Read, Seek, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// Where the per-interface locks live.
pub const LOCK_DIR: &str = "/run/sluice";

/// Largest redirection table a port pool is sized for before the device reports its
/// own (ice: 2048 entries; i40e 512; the emulator 128).
const RETA_SIZE_BOUND: usize = 2048;

/// Runs every check; the locks returned must be kept until the process ends.
pub fn check(cfg: &Config) -> Result<InstanceLocks, String> {
    check_resources(cfg)?;
    if let Some(warning) = readable_shared_keys(cfg) {
        log::warn!("{warning}");
    }
    if let Some(warning) = shared_socket_directory(cfg) {
        log::warn!("{warning}");
    }
    if let Some(warning) = exposed_metrics(cfg) {
        log::warn!("{warning}");
    }
    InstanceLocks::take(cfg, Path::new(LOCK_DIR))
}

/// A warning when the config file itself holds `[sync] key` or `[vrrp] key` and every
/// user may read it (the package installs the file 0640; an edited or copied one may be
/// 0644): whoever reads a sync key can forge sync messages, which install, change and
/// remove sessions, and whoever reads a VRRP key decides who is master. A warning, not a
/// refusal: `key_file` is the way out, named in it.
pub fn readable_shared_keys(cfg: &Config) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let inline = |key: bool, file: bool| key && !file;
    let mut sections = Vec::new();
    if cfg
        .sync
        .as_ref()
        .is_some_and(|s| inline(s.key.is_some(), s.key_file.is_some()))
    {
        sections.push("[sync] key");
    }
    if cfg
        .vrrp
        .as_ref()
        .is_some_and(|v| inline(v.key.is_some(), v.key_file.is_some()))
    {
        sections.push("[vrrp] key");
    }
    if sections.is_empty() {
        return None;
    }
    let mode = std::fs::metadata(&cfg.path).ok()?.mode();
    (mode & 0o004 != 0).then(|| {
        format!(
            "{}: {} {} readable by every user (mode {:04o}); move it to a file only \
             its owner may read (`key_file`, docs/CONFIG.md) or run `chmod 640 {}`",
            cfg.path.display(),
            sections.join(" and "),
            if sections.len() == 1 { "is" } else { "are" },
            mode & 0o7777,
            cfg.path.display()
        )
    })
}

/// A warning when the control socket's directory may be written by users other than
/// its owner: without the sticky bit they can rename the socket away and put their own
/// in its place, so root's `sluicectl` would send its commands to them; with it (as
/// `/tmp`) they can still take the names beside it (the lock, the staging directory)
/// and keep the daemon from starting. A warning, not a refusal: a test bed may want it.
pub fn shared_socket_directory(cfg: &Config) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let socket = &cfg.control.socket;
    let dir = socket.parent().filter(|p| !p.as_os_str().is_empty())?;
    let meta = std::fs::metadata(dir).ok()?;
    let mode = meta.mode();
    // SAFETY: geteuid only reads the process's credentials.
    let euid = unsafe { libc::geteuid() };
    if meta.uid() != euid && meta.uid() != 0 {
        return Some(format!(
            "{}: control.socket: its directory {} belongs to uid {}, not to this daemon's \
             user: its owner can replace the socket with their own, which then gets root's \
             sluicectl commands; put the socket in a directory only root may write, such as \
             /run/sluice",
            cfg.path.display(),
            dir.display(),
            meta.uid()
        ));
    }
    if mode & 0o022 == 0 {
        return None;
    }
    let risk = match mode & 0o1000 != 0 {
        true => "they can take the names beside the socket and keep the daemon from starting",
        false => {
            "they can replace the socket with their own, which then gets root's sluicectl commands"
        }
    };
    Some(format!(
        "{}: control.socket: its directory {} is writable by other users (mode {:04o}): \
         {risk}; put the socket in a directory only root may write, such as /run/sluice",
        cfg.path.display(),
        dir.display(),
        mode & 0o7777
    ))
}

/// A warning when the metrics endpoint listens where a port's exception path makes it
/// reachable from the port's networks: on every address (`0.0.0.0`, `::`) or on a
/// port's own address, with that port's `[ports.exception]`. The kernel then gets TCP
/// to the port's addresses from anyone who can reach them (the exception path's
/// rate, not an access list, is all that stands between), and the exposition names
/// every service, real server and counter. A warning, not a refusal: an operator may
/// mean it and filter the exception interface.
pub fn exposed_metrics(cfg: &Config) -> Option<String> {
    let listen = cfg.control.metrics?;
    let port = cfg.ports.iter().find(|p| {
        p.exception.is_some()
            && (listen.ip().is_unspecified()
                || p.addresses
                    .iter()
                    .any(|a| std::net::IpAddr::V4(a.addr) == listen.ip())
                || p.addresses6
                    .iter()
                    .any(|a| std::net::IpAddr::V6(a.addr) == listen.ip()))
    })?;
    Some(format!(
        "{}: control.metrics: {listen} is reachable through port {}'s exception path by \
         anyone who can reach the port's addresses, and the metrics name every service \
         and real server: listen on a management address, or filter the exception \
         interface (docs/EXCEPTION_PATH.md)",
        cfg.path.display(),
        port.name
    ))
}

/// The checks of this machine's resources: lcores against the CPUs this process may
/// use, the tables' memory against what is available, the EAL's hugepages against the
/// free ones, the mbuf pool against `eal.memory_mb`, each PCI port's device present in
/// sysfs, each exception interface's kernel device, and the open-file limit.
pub fn check_resources(cfg: &Config) -> Result<(), String> {
    check_lcores(cfg, &allowed_cpus()?)?;
    check_memory(cfg, &MemoryNeed::of(cfg), &Available::read())?;
    check_eal_memory(cfg, &EalMemory::of(cfg, eal_page_size(cfg)))?;
    check_pci_devices(cfg, Path::new(PCI_DEVICES))?;
    check_exception_devices(cfg, Path::new("/dev"))?;
    check_open_files(cfg, &FileNeed::of(cfg, hugepage_size()), open_file_limit())
}

/// A port's own limits, known only once the EAL has probed its device: the queues
/// the workers need (one RX and one TX queue each) and the port's `mtu`. Checked
/// before the port is configured, so the refusal names the field, not the DPDK call
/// that would have failed.
pub fn check_device(
    cfg: &Config,
    index: usize,
    driver: &str,
    limits: &DeviceLimits,
) -> Result<(), String> {
    let port = &cfg.ports[index];
    let workers = cfg.lcores.workers.len();
    let most = usize::from(limits.max_rx_queues.min(limits.max_tx_queues));
    if workers > most {
        return Err(format!(
            "{}: lcores.workers: {workers} workers need {workers} RX and TX queues on port \
             {:?}, whose device ({driver}) has at most {} RX and {} TX queues; use at most \
             {most} worker(s), or give the device more queues",
            cfg.place("lcores.workers"),
            port.name,
            limits.max_rx_queues,
            limits.max_tx_queues,
        ));
    }
    if let Some(mtu) = port.mtu {
        // A driver that leaves the maximum unset reports 0: nothing to check against.
        if mtu < limits.min_mtu || (limits.max_mtu != 0 && mtu > limits.max_mtu) {
            return Err(format!(
                "{}: ports[{index}].mtu: {mtu} is outside what the device of port {:?} \
                 ({driver}) takes, {} to {}",
                cfg.place(&format!("ports[{index}].mtu")),
                port.name,
                limits.min_mtu,
                limits.max_mtu,
            ));
        }
    }
    Ok(())
}

/// Every `[ports.exception]` has the kernel device its kind needs: /dev/net/tun for
/// a tap, /dev/vhost-net for virtio-user (the vhost-net module, often missing in
/// containers and VMs). Refused at the `kind` line, before the EAL would fail with
/// a PMD's message.
fn check_exception_devices(cfg: &Config, dev: &Path) -> Result<(), String> {
    use crate::config::ExceptionKind;
    for (i, port) in cfg.ports.iter().enumerate() {
        let Some(exception) = &port.exception else {
            continue;
        };
        let (needed, hint) = match exception.kind {
            ExceptionKind::Tap => (
                "net/tun",
                "load the tun module, or give the container /dev/net/tun",
            ),
            ExceptionKind::VirtioUser => (
                "vhost-net",
                "load the vhost_net module, or use kind = \"tap\"",
            ),
        };
        let path = dev.join(needed);
        if !path.exists() {
            return Err(format!(
                "{}:{}: ports[{i}].exception.kind: port {}: kind = \"{}\" needs {}, \
                 which this machine does not have ({hint})",
                cfg.path.display(),
                exception.kind_line,
                port.name,
                exception.kind.as_str(),
                path.display(),
            ));
        }
    }
    Ok(())
}

/// Where the kernel lists PCI devices.
const PCI_DEVICES: &str = "/sys/bus/pci/devices";

/// Every `pci = "..."` port names a device this machine has: the EAL would otherwise
/// start, probe nothing and fail later with a less direct message.
fn check_pci_devices(cfg: &Config, sysfs: &Path) -> Result<(), String> {
    for (i, port) in cfg.ports.iter().enumerate() {
        if let PortDevice::Pci(addr) = &port.device {
            if !sysfs.join(addr).exists() {
                return Err(format!(
                    "{}: ports[{i}].pci: port {}: no PCI device {addr} on this machine \
                     (no {})",
                    cfg.place(&format!("ports[{i}].pci")),
                    port.name,
                    sysfs.join(addr).display()
                ));
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------
// lcores

/// The CPUs this process may run on (read before the EAL pins the main thread).
fn allowed_cpus() -> Result<Vec<u32>, String> {
    thread_cpus().map_err(|e| format!("sched_getaffinity: {e}"))
}

/// Every lcore runs on an allowed CPU: the management lcore on the CPU of its id, each
/// worker on `cpus[i]` when given, else on the CPU of its id (EAL `-l`/`--lcores`).
fn check_lcores(cfg: &Config, allowed: &[u32]) -> Result<(), String> {
    let l = &cfg.lcores;
    let refuse = |field: String, what: String| {
        Err(format!(
            "{}: lcores.{field}: {what}, but this process may run only on CPU(s) {} \
             (of {} CPUs online; sched_getaffinity)",
            cfg.place(&format!("lcores.{field}")),
            cpu_list(allowed),
            std::thread::available_parallelism().map_or(1, |n| n.get()),
        ))
    };
    if !allowed.contains(&l.management) {
        return refuse(
            "management".into(),
            format!("lcore {} runs on CPU {}", l.management, l.management),
        );
    }
    for (i, &worker) in l.workers.iter().enumerate() {
        match &l.cpus {
            Some(cpus) if !allowed.contains(&cpus[i]) => {
                return refuse(
                    format!("cpus[{i}]"),
                    format!("worker lcore {worker} is mapped to CPU {}", cpus[i]),
                );
            }
            None if !allowed.contains(&worker) => {
                return refuse(
                    format!("workers[{i}]"),
                    format!("worker lcore {worker} runs on CPU {worker}"),
                );
            }
            _ => {}
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------
// memory

/// What the config will allocate, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryNeed {
    pub workers: usize,
    /// One worker's session table (the figures the allocator uses), its SYN proxy
    /// side array and SYN timer ([`Forwarder::session_bytes_for`]).
    pub sessions_per_worker: usize,
    /// Everything else in ordinary memory: per-worker real-server counters, neighbour
    /// tables, FullNAT port pools and sync rings, the persistence table, the `mh`
    /// services' Maglev tables, and the EAL's memory when it runs without hugepages.
    pub other: usize,
    /// The EAL's memory from hugepages (`eal.memory_mb` with `hugepages = true`).
    pub hugepages: usize,
}

impl MemoryNeed {
    pub fn of(cfg: &Config) -> MemoryNeed {
        let workers = cfg.lcores.workers.len();
        let sessions_per_worker =
            Forwarder::session_bytes_for(cfg.sessions.capacity as usize, DEFAULT_WHEEL_SLOTS);
        let ports = usize::from(cfg.sessions.local_port_last)
            .saturating_sub(usize::from(cfg.sessions.local_port_first))
            + 1;
        // One pool per worker, over the distinct IPv4 local addresses: services that
        // share an address share its ports (IPv6 local addresses have no pool).
        let mut lips: Vec<std::net::Ipv4Addr> = cfg
            .services
            .iter()
            .flat_map(|s| s.local_addresses.iter())
            .filter_map(|a| match a {
                std::net::IpAddr::V4(a) => Some(*a),
                std::net::IpAddr::V6(_) => None,
            })
            .collect();
        lips.sort_unstable();
        lips.dedup();
        let pools = match lips.len() {
            0 => 0,
            n => PortPool::bytes_for(n, ports, RETA_SIZE_BOUND),
        };
        let counters = MAX_REAL_SERVER_IDS * std::mem::size_of::<RealServerCounters>();
        let neighbours = cfg.sessions.neighbours as usize;
        let neighbours =
            crate::dataplane::neighbour::NeighbourTable::<std::net::Ipv4Addr>::bytes_for(
                neighbours,
            ) + crate::dataplane::neighbour::Neighbour6Table::bytes_for(neighbours);
        // crossbeam's ArrayQueue: a stamp word beside each event.
        let sync_ring = match cfg.sync {
            Some(_) => {
                super::SYNC_RING_EVENTS
                    * (std::mem::size_of::<crate::dataplane::sync_events::SessionEvent>()
                        + std::mem::size_of::<usize>())
            }
            None => 0,
        };
        // One Maglev table per mh service, shared by the workers; twice, as a change
        // builds the new table while the workers still use the old one.
        let maglev: usize = (cfg.services.iter())
            .filter(|s| s.scheduler == crate::model::SchedulerKind::Mh)
            .map(|s| {
                let size = s
                    .mh_table_size
                    .unwrap_or(crate::model::MH_DEFAULT_TABLE_SIZE);
                2 * crate::sched::Maglev::bytes_for(size)
            })
            .sum();
        let eal = (cfg.eal.memory_mb as usize) << 20;
        let (eal_ordinary, hugepages) = match cfg.eal.hugepages {
            true => (0, eal),
            false => (eal, 0),
        };
        MemoryNeed {
            workers,
            sessions_per_worker,
            other: workers * (counters + neighbours + pools + sync_ring)
                + PersistTable::bytes_for(cfg.sessions.persistence_templates as usize)
                + maglev
                + eal_ordinary,
            hugepages,
        }
    }

    pub fn ordinary(&self) -> usize {
        self.workers
            .saturating_mul(self.sessions_per_worker)
            .saturating_add(self.other)
    }
}

/// What the kernel reports free, in bytes (`None`: not known, not checked).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Available {
    /// `MemAvailable` in /proc/meminfo.
    pub mem_available: Option<u64>,
    /// Room left under this process's memory cgroup limit, when it has one, and the
    /// file that sets it (`memory.max` on cgroup v2, `memory.limit_in_bytes` on v1).
    pub cgroup_room: Option<(u64, &'static str)>,
    /// Free hugepages of every size (/sys/kernel/mm/hugepages).
    pub hugepages_free: Option<u64>,
}

impl Available {
    pub fn read() -> Available {
        Available {
            mem_available: std::fs::read_to_string("/proc/meminfo")
                .ok()
                .and_then(|t| meminfo_bytes(&t, "MemAvailable")),
            cgroup_room: cgroup_room(),
            hugepages_free: hugepages_free(),
        }
    }
}

/// A `Key:  1234 kB` line of /proc/meminfo, in bytes.
fn meminfo_bytes(meminfo: &str, key: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.split(':').next() == Some(key))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// The room under this process's memory cgroup: the v2 one, the v1 memory
/// controller's, or the smaller of the two when a hybrid setup has both. Only the
/// process's own cgroup is read, not its ancestors'.
fn cgroup_room() -> Option<(u64, &'static str)> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let v2 = cgroup_v2_room(&own).map(|room| (room, "memory.max"));
    let v1 = cgroup_v1_room(&own).map(|room| (room, "memory.limit_in_bytes"));
    match (v2, v1) {
        (Some(a), Some(b)) => Some(if b.0 < a.0 { b } else { a }),
        (a, b) => a.or(b),
    }
}

fn cgroup_v2_room(own: &str) -> Option<u64> {
    let path = own.lines().find_map(|l| l.strip_prefix("0::"))?;
    let dir = Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/'));
    let max: u64 = read_number(&dir.join("memory.max"))?; // "max": no limit
    let current = read_number(&dir.join("memory.current"))?;
    Some(max.saturating_sub(current))
}

fn cgroup_v1_room(own: &str) -> Option<u64> {
    let path = v1_memory_cgroup(own)?;
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    let (root, mount_point) = v1_memory_mount(&mountinfo)?;
    let dir = v1_cgroup_dir(path, &root, &mount_point);
    let limit = v1_limit(&std::fs::read_to_string(dir.join("memory.limit_in_bytes")).ok()?)?;
    let usage = read_number(&dir.join("memory.usage_in_bytes"))?;
    Some(limit.saturating_sub(usage))
}

fn read_number(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The cgroup path of the v1 memory controller in /proc/self/cgroup
/// (`N:memory:/path`, or `N:cpu,memory:/path` when it is mounted with others).
fn v1_memory_cgroup(own: &str) -> Option<&str> {
    own.lines().find_map(|line| {
        let mut fields = line.splitn(3, ':');
        let (id, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        (id != "0" && controllers.split(',').any(|c| c == "memory")).then_some(path)
    })
}

/// The v1 memory controller's mount in /proc/self/mountinfo: the cgroup path its root
/// is (not `/` inside a container that sees only its own cgroup) and where it is
/// mounted. Fields: `id parent major:minor root mount-point options [optional...] -
/// fstype source super-options`, paths with `\ooo` octal escapes.
fn v1_memory_mount(mountinfo: &str) -> Option<(PathBuf, PathBuf)> {
    mountinfo.lines().find_map(|line| {
        let (mount, fs) = line.split_once(" - ")?;
        let mut fs = fs.split(' ');
        let (fstype, _source, options) = (fs.next()?, fs.next()?, fs.next()?);
        if fstype != "cgroup" || !options.split(',').any(|o| o == "memory") {
            return None;
        }
        let mut fields = mount.split(' ').skip(3);
        let (root, mount_point) = (fields.next()?, fields.next()?);
        Some((unescape(root).into(), unescape(mount_point).into()))
    })
}

/// A mountinfo path with its `\ooo` escapes (space, tab, newline, backslash) decoded.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match octal {
            Some(d) => {
                out.push(d.iter().fold(0u8, |n, b| n.wrapping_mul(8) + (b - b'0')));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Where the cgroup at `path` is under a v1 mount of cgroup `root` at `mount_point`.
fn v1_cgroup_dir(path: &str, root: &Path, mount_point: &Path) -> PathBuf {
    let path = Path::new(path);
    let relative = path.strip_prefix(root).unwrap_or(path);
    mount_point.join(relative.strip_prefix("/").unwrap_or(relative))
}

/// `memory.limit_in_bytes`, or `None` for no limit: v1 writes "unlimited" as the
/// largest page-aligned count a signed 64-bit counter holds (9223372036854771712 with
/// 4 KiB pages), so anything from 2^62 up is taken as that.
fn v1_limit(text: &str) -> Option<u64> {
    text.trim()
        .parse()
        .ok()
        .filter(|&limit: &u64| limit < 1 << 62)
}

fn hugepages_free() -> Option<u64> {
    let mut total = 0u64;
    for entry in std::fs::read_dir("/sys/kernel/mm/hugepages")
        .ok()?
        .flatten()
    {
        // hugepages-2048kB
        let name = entry.file_name();
        let Some(kb) = name.to_str().and_then(|n| {
            n.strip_prefix("hugepages-")?
                .strip_suffix("kB")?
                .parse::<u64>()
                .ok()
        }) else {
            continue;
        };
        let free: u64 = std::fs::read_to_string(entry.path().join("free_hugepages"))
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0);
        total += free * kb * 1024;
    }
    Some(total)
}

fn mib(bytes: u64) -> String {
    format!("{} MiB", bytes.div_ceil(1 << 20))
}

/// Refuses a config whose tables do not fit in the memory available.
fn check_memory(cfg: &Config, need: &MemoryNeed, avail: &Available) -> Result<(), String> {
    let ordinary = need.ordinary() as u64;
    let under_cgroup = |(room, file)| (room, format!("left under this cgroup's {file}"));
    let room = match (avail.mem_available, avail.cgroup_room) {
        (Some(m), Some(c)) if c.0 < m => Some(under_cgroup(c)),
        (Some(m), _) => Some((m, "MemAvailable in /proc/meminfo".to_string())),
        (None, Some(c)) => Some(under_cgroup(c)),
        (None, None) => None,
    };
    if let Some((room, source)) = room {
        if ordinary > room {
            let fits = sessions_that_fit(room.saturating_sub(need.other as u64), need.workers);
            return Err(format!(
                "{}: sessions.capacity = {} needs {} of session tables ({} worker(s) x {}) \
                 and {} besides (counters, pools, persistence{}), {} in all, but only {} is \
                 available ({source}); lower sessions.capacity ({} at most here) or free \
                 memory",
                cfg.place("sessions.capacity"),
                cfg.sessions.capacity,
                mib(need.workers as u64 * need.sessions_per_worker as u64),
                need.workers,
                mib(need.sessions_per_worker as u64),
                mib(need.other as u64),
                if cfg.eal.hugepages {
                    ""
                } else {
                    ", eal.memory_mb without hugepages"
                },
                mib(ordinary),
                mib(room),
                fits,
            ));
        }
    }
    if let Some(free) = avail.hugepages_free {
        if need.hugepages as u64 > free {
            return Err(format!(
                "{}: eal.memory_mb = {} needs {} of hugepages but {} is free \
                 (/sys/kernel/mm/hugepages/*/free_hugepages); reserve more hugepages, lower \
                 eal.memory_mb, or set eal.hugepages = false",
                cfg.place("eal.memory_mb"),
                cfg.eal.memory_mb,
                mib(need.hugepages as u64),
                mib(free)
            ));
        }
    }
    Ok(())
}

/// The largest session capacity whose tables for `workers` workers fit in `room`.
fn sessions_that_fit(room: u64, workers: usize) -> usize {
    let fits = |c: usize| {
        Forwarder::session_bytes_for(c, DEFAULT_WHEEL_SLOTS) as u64 * workers as u64 <= room
    };
    let (mut lo, mut hi) = (0usize, crate::session::MAX_CAPACITY);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo
}

// ---------------------------------------------------------------------------------
// the EAL's memory

/// Each lcore's cache of the mbuf pool.
pub const MBUF_CACHE: u32 = 256;

/// What the EAL, the rings and the ports take from `eal.memory_mb` besides the mbuf
/// pool. Measured with `rte_malloc_get_socket_stats` on loopback and af_packet
/// daemons (docs/CONFIG.md): 152 KiB after EAL init, 0.41 MiB in all with one worker,
/// 0.49 MiB with four; the allowance is 2 MiB, and below for what grows.
const EAL_OWN: usize = 2 << 20;
/// Each worker's queue on each port and its rings (measured: 34 KiB a worker).
const EAL_PER_QUEUE: usize = 64 << 10;
/// Each `[ports.exception]` kernel interface (measured: 1.3 MiB for a tap).
const EAL_PER_EXCEPTION: usize = 2 << 20;
/// Each queue pair of a PCI port: the driver's descriptor rings, which common PMDs
/// reserve at their largest size (ice: 8160 descriptors of 32 bytes for RX, of 16 for
/// TX, and their software rings, about 0.4 MiB). Not measured: no NIC here.
const EAL_PER_PCI_QUEUE: usize = 1 << 20;

/// How many mbufs the daemon's pool holds. Room for every descriptor (each port's RX
/// and TX rings for every worker, twice: a loopback port's far side has as many),
/// every worker's bursts in flight and the emulator (and the default health rings and
/// the 64-slot VRRP ring: an allowance of 8192, not a measurement), each kernel
/// interface's two queues and its ring, every worker's redirect ring; sync over a port
/// adds what its larger inject and probe rings hold beyond those, and its own punt
/// ring (without it that ring stays empty). A power of two minus one, as rte_mempool
/// prefers.
pub fn mbuf_count(cfg: &Config) -> u32 {
    let queues = cfg.lcores.workers.len() as u32;
    let descriptors: u32 = cfg
        .ports
        .iter()
        .map(|p| (u32::from(p.rx_desc) + u32::from(p.tx_desc)) * queues * 2)
        .sum();
    let (health_ring, sync_ring) = match cfg.sync.as_ref().and_then(|s| s.port.as_ref()) {
        Some(_) => (SYNC_PORT_RING_SIZE, SYNC_PORT_RING_SIZE),
        None => (HEALTH_RING_SIZE, 0),
    };
    let exception: u32 = (cfg.ports.iter())
        .filter_map(|p| p.exception.as_ref())
        .map(|e| 2 * u32::from(super::exception::INTERFACE_DESC) + e.ring_size)
        .sum();
    let wanted = descriptors
        + exception
        + queues * REDIRECT_RING_SIZE
        + 8192
        + 2 * (health_ring - HEALTH_RING_SIZE)
        + sync_ring;
    wanted.next_power_of_two() - 1
}

/// What a received frame and its rewrite take in one mbuf beyond the L3 MTU: the
/// Ethernet header and two VLAN tags (22 bytes), and room for what a rewrite adds (an
/// IPv6 TUN header is 40 bytes, a TOA option 8) with some to spare (64).
const FRAME_OVERHEAD: usize = 22 + 64;

/// The data room of the daemon's mbufs. Every frame is received whole into one mbuf
/// (the forwarding path reads one segment; a NIC given smaller buffers than its
/// frames chains them, or drops what does not fit), so the room follows the largest
/// port `mtu`: [`MBUF_DATA_ROOM`] (2048) up to an MTU of 1962, beyond it the MTU and
/// [`FRAME_OVERHEAD`] rounded up to 1 KiB (9216 for 9000).
pub fn mbuf_data_room(cfg: &Config) -> u16 {
    let mtu = (cfg.ports.iter())
        .map(|p| usize::from(p.mtu.unwrap_or(1500)))
        .max()
        .unwrap_or(1500);
    let frame = (mtu + FRAME_OVERHEAD).next_multiple_of(1024);
    // `ports[].mtu` is at most 9000 (`config::fields::mtu`): 9216 bytes.
    u16::try_from(frame).map_or(u16::MAX, |f| f.max(MBUF_DATA_ROOM))
}

/// What the config takes of the EAL's memory (`eal.memory_mb`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EalMemory {
    pub mbufs: u32,
    /// The mbuf pool as rte_mempool sizes it.
    pub pool: PoolFootprint,
    /// What the EAL, the rings and the ports take besides.
    pub own: usize,
    /// The EAL's page size: 4 KiB without hugepages.
    pub page: usize,
}

impl EalMemory {
    pub fn of(cfg: &Config, page: usize) -> EalMemory {
        let mbufs = mbuf_count(cfg);
        let channels = eal_option(cfg, "-n").unwrap_or(4) * eal_option(cfg, "-r").unwrap_or(1);
        let workers = cfg.lcores.workers.len();
        let pci_ports = (cfg.ports.iter())
            .filter(|p| matches!(p.device, PortDevice::Pci(_)))
            .count();
        let exceptions = cfg.ports.iter().filter(|p| p.exception.is_some()).count();
        EalMemory {
            mbufs,
            pool: PoolFootprint::pktmbuf(mbufs, MBUF_CACHE, mbuf_data_room(cfg), page, channels),
            own: EAL_OWN
                + workers * cfg.ports.len() * EAL_PER_QUEUE
                + workers * pci_ports * EAL_PER_PCI_QUEUE
                + exceptions * EAL_PER_EXCEPTION,
            page,
        }
    }

    pub fn total(&self) -> usize {
        self.pool.total() + self.own
    }

    /// The smallest `eal.memory_mb` that holds it.
    pub fn memory_mb(&self) -> u64 {
        (self.total() as u64).div_ceil(1 << 20)
    }
}

/// A numeric EAL option of `eal.extra_args` (`-n 4` or `-n4`).
fn eal_option(cfg: &Config, flag: &str) -> Option<u32> {
    let args = &cfg.eal.extra_args;
    args.iter().enumerate().find_map(|(i, a)| {
        let value = match a.strip_prefix(flag)? {
            "" => args.get(i + 1)?.as_str(),
            rest => rest,
        };
        value.parse().ok().filter(|&n| n > 0)
    })
}

/// The page the EAL's memory comes in: the base page without hugepages (whatever
/// the pool needs beyond it is rounded to), the default hugepage size with them.
fn eal_page_size(cfg: &Config) -> usize {
    match cfg.eal.hugepages {
        true => hugepage_size() as usize,
        // SAFETY: sysconf only reads.
        false => (unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).max(4096) as usize,
    }
}

/// The default hugepage size (`Hugepagesize` in /proc/meminfo), 2 MiB if unknown.
fn hugepage_size() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| meminfo_bytes(&t, "Hugepagesize"))
        .unwrap_or(2 << 20)
}

/// Refuses a config whose mbuf pool, with what the EAL takes besides, does not fit in
/// `eal.memory_mb`: `rte_pktmbuf_pool_create` would fail after the EAL started, with
/// "Cannot allocate memory" and no field named.
fn check_eal_memory(cfg: &Config, need: &EalMemory) -> Result<(), String> {
    let have = u64::from(cfg.eal.memory_mb) << 20;
    if need.total() as u64 <= have {
        return Ok(());
    }
    let pages = match cfg.eal.hugepages {
        true => format!("{} KiB hugepages", need.page >> 10),
        false => format!("{} KiB pages without hugepages", need.page >> 10),
    };
    Err(format!(
        "{}: eal.memory_mb = {} cannot hold the mbuf pool: {} mbufs (the RX and TX \
         descriptors of {} port(s) for {} worker(s), and the rings) of {} bytes each take \
         {} in {pages}, and DPDK itself, its rings and the ports {} besides, {} in all; set \
         eal.memory_mb = {} or more, or lower ports[].rx_desc and tx_desc (or ports[].mtu: \
         an mbuf holds a whole frame, {} bytes of data)",
        cfg.place("eal.memory_mb"),
        cfg.eal.memory_mb,
        need.mbufs,
        cfg.ports.len(),
        cfg.lcores.workers.len(),
        need.pool.object,
        mib(need.pool.total() as u64),
        mib(need.own as u64),
        mib(need.total() as u64),
        need.memory_mb(),
        mbuf_data_room(cfg),
    ))
}

// ---------------------------------------------------------------------------------
// open files

/// Descriptors of a started daemon that do not depend on the config: standard
/// streams, the log, the control socket and its lock, the EAL's interrupt thread
/// (epoll, timerfd, pipes) and its memory (a memfd without hugepages). Measured with
/// /proc/PID/fd on a loopback daemon: 19 with one worker, 4 of them the worker's.
const FILES_BASE: u64 = 15;
/// Each worker lcore: the EAL's two pipes to it (measured: 4 a worker).
const FILES_PER_WORKER: u64 = 4;
/// Each port that is not a loopback one: its lock file and the PMD's own (af_packet:
/// a socket; tap: the tun device, a keep-alive and a netlink socket; vfio-pci: the
/// group, the device, interrupt eventfds). Measured for af_packet: 2.
const FILES_PER_PORT: u64 = 4;
/// Each queue of such a port (af_packet: a socket a queue pair, tap: a queue fd,
/// vfio-pci: an interrupt eventfd). Measured for af_packet: 1.
const FILES_PER_QUEUE: u64 = 2;
/// Each `[ports.exception]` interface (measured for a tap: 6).
const FILES_PER_EXCEPTION: u64 = 8;
/// With hugepages, the runtime directory's files: its config, an fbarray for each
/// memory segment list and for the memzones, the multi-process socket (measured: 7).
const FILES_RUNTIME_DIR: u64 = 8;
/// Room for what a running daemon opens: control connections (at least
/// [`FILES_RUNNING`] - [`FILES_RESERVED`] of them), and the rest.
const FILES_RUNNING: u64 = 64;
/// Of [`FILES_RUNNING`], what the daemon itself opens while it runs and control
/// connections must never take: the metrics connections (8 at most), session sync's sockets,
/// BIRD's control socket, a capture file, the config on reload, a log file rotated.
const FILES_RESERVED: u64 = 32;
/// The control socket's own bound on connections open at once, where the open-file
/// limit leaves room for more.
pub const CONTROL_CONNECTIONS_MAX: usize = 2048;

/// The descriptors a config will hold, by what holds them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileNeed {
    /// One a hugepage the EAL maps (it keeps each segment's file open), or a few with
    /// `--single-file-segments`, and the runtime directory's files.
    pub hugepages: u64,
    pub workers: u64,
    /// The ports, their queues and exception interfaces.
    pub ports: u64,
}

impl FileNeed {
    pub fn of(cfg: &Config, hugepage: u64) -> FileNeed {
        let workers = cfg.lcores.workers.len() as u64;
        let single_file = (cfg.eal.extra_args.iter()).any(|a| a == "--single-file-segments");
        let hugepages = match (cfg.eal.hugepages, single_file) {
            (false, _) => 0,
            // One file per memory segment list: a few per page size and NUMA node.
            (true, true) => 16 + FILES_RUNTIME_DIR,
            (true, false) => {
                (u64::from(cfg.eal.memory_mb) << 20).div_ceil(hugepage.max(1)) + FILES_RUNTIME_DIR
            }
        };
        let ports = (cfg.ports.iter())
            .map(|p| {
                let device = match p.device {
                    PortDevice::Loopback => 0,
                    _ => FILES_PER_PORT + workers * FILES_PER_QUEUE,
                };
                device + p.exception.as_ref().map_or(0, |_| FILES_PER_EXCEPTION)
            })
            .sum();
        FileNeed {
            hugepages,
            workers: workers * FILES_PER_WORKER,
            ports,
        }
    }

    pub fn total(&self) -> u64 {
        FILES_BASE + self.hugepages + self.workers + self.ports + FILES_RUNNING
    }
}

/// How many control connections may be open at once: what the hard open-file limit
/// leaves after everything else the config holds and [`FILES_RESERVED`], at most
/// [`CONTROL_CONNECTIONS_MAX`]. Connections beyond it are refused with an error line;
/// without this bound they would take the descriptors a capture, a reload or a sync
/// socket needs, and those would fail with EMFILE instead. At least
/// [`FILES_RUNNING`] - [`FILES_RESERVED`], as [`check_resources`] refuses a limit
/// below the need.
pub fn control_connection_limit(cfg: &Config) -> usize {
    connection_limit(&FileNeed::of(cfg, hugepage_size()), open_file_limit())
}

fn connection_limit(need: &FileNeed, hard: Option<u64>) -> usize {
    let Some(hard) = hard else {
        return CONTROL_CONNECTIONS_MAX;
    };
    let others = need.total() - FILES_RUNNING + FILES_RESERVED;
    let room = hard
        .saturating_sub(others)
        .max(FILES_RUNNING - FILES_RESERVED);
    usize::try_from(room).map_or(CONTROL_CONNECTIONS_MAX, |r| r.min(CONTROL_CONNECTIONS_MAX))
}

/// This process's hard limit on open files (`None`: unknown or unlimited).
fn open_file_limit() -> Option<u64> {
    let (_, hard) = crate::control::server::open_file_limits()?;
    (hard != libc::RLIM_INFINITY).then_some(hard)
}

/// Raises the soft limit on open files to the hard one, as the EAL opens a file per
/// hugepage and the soft limit is often 1024; says so when it changes.
pub fn raise_open_file_limit() {
    let Some((soft, hard)) = crate::control::server::open_file_limits() else {
        return;
    };
    if soft >= hard {
        return;
    }
    if crate::control::server::set_open_file_soft_limit(hard) {
        log::info!("open-file limit raised from {soft} to {hard} (the hard limit)");
    } else {
        log::warn!(
            "open-file limit: cannot raise {soft} to the hard limit {hard}: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Refuses a config whose descriptors do not fit under the hard open-file limit: the
/// EAL would abort when it cannot open one.
fn check_open_files(cfg: &Config, need: &FileNeed, hard: Option<u64>) -> Result<(), String> {
    let total = need.total();
    let Some(hard) = hard.filter(|&h| h < total) else {
        return Ok(());
    };
    let hugepages = match need.hugepages {
        0 => String::new(),
        n => format!(
            "{n} for the hugepages of eal.memory_mb = {} and DPDK's runtime files, ",
            cfg.eal.memory_mb
        ),
    };
    Err(format!(
        "{}: the open-file limit (RLIMIT_NOFILE) is {hard}, but this config needs about \
         {total} descriptors ({hugepages}{} for {} worker lcore(s), {} for the ports, \
         {FILES_BASE} for DPDK and the daemon, {FILES_RUNNING} for connections and \
         files while it runs); raise the hard limit: LimitNOFILE={total} or more in the \
         systemd unit (systemctl edit sluice), or ulimit -n {total} in the shell that \
         starts sluice",
        cfg.path.display(),
        need.workers,
        cfg.lcores.workers.len(),
        need.ports,
    ))
}

// ---------------------------------------------------------------------------------
// listeners

/// The sockets the daemon listens on besides its control socket: the metrics
/// endpoint's and session sync's (through a kernel socket). Bound before the EAL
/// starts, so that an address in use or not of this host is refused then, naming its
/// field, and handed on to their servers once the appliance is up.
pub struct Listeners {
    pub metrics: Option<std::net::TcpListener>,
    pub sync: Option<super::sync::SyncSockets>,
}

impl Listeners {
    pub fn bind(cfg: &Config) -> Result<Listeners, String> {
        let file = cfg.path.display();
        let metrics = match cfg.control.metrics {
            Some(addr) => Some(std::net::TcpListener::bind(addr).map_err(|e| {
                format!(
                    "{}: control.metrics: cannot listen on {addr}: {e}{}",
                    cfg.place("control.metrics"),
                    bind_hint(&e)
                )
            })?),
            None => None,
        };
        let sync = match &cfg.sync {
            Some(settings) if settings.port.is_none() => {
                Some(super::sync::SyncSockets::bind(settings).map_err(|e| format!("{file}: {e}"))?)
            }
            _ => None,
        };
        Ok(Listeners { metrics, sync })
    }
}

/// What to do about a failed bind.
pub fn bind_hint(e: &std::io::Error) -> &'static str {
    match e.kind() {
        std::io::ErrorKind::AddrInUse => " (another process listens there)",
        std::io::ErrorKind::AddrNotAvailable => " (not an address of this host)",
        _ => "",
    }
}

// ---------------------------------------------------------------------------------
// instance locks

/// One exclusive `flock` on a lock file, released (and the file removed) on drop.
struct LockFile {
    path: PathBuf,
    _file: File,
}

impl LockFile {
    /// Takes the lock at `path` without waiting; `Err(Some(holder))` names who holds it
    /// (what the holder wrote into the file), `Err(None)` when it could not be read.
    fn take(path: &Path, holder: &str) -> Result<LockFile, Result<Option<String>, String>> {
        // The holder removes the file when it ends; a file removed between our open
        // and our flock is not the lock any more: open again.
        for _ in 0..8 {
            let mut file = std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o644)
                // A symlink put there would make root truncate and write its target.
                .custom_flags(libc::O_NOFOLLOW)
                .open(path)
                .map_err(|e| Err(format!("{}: {e}", path.display())))?;
            // SAFETY: flock on a descriptor we own.
            let rc = unsafe {
                libc::flock(
                    std::os::fd::AsRawFd::as_raw_fd(&file),
                    libc::LOCK_EX | libc::LOCK_NB,
                )
            };
            if rc != 0 {
                let err = std::io::Error::last_os_error();
                if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
                    return Err(Err(format!("flock {}: {err}", path.display())));
                }
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                let text = text.trim().to_string();
                return Err(Ok((!text.is_empty()).then_some(text)));
            }
            let same = match (file.metadata(), std::fs::metadata(path)) {
                (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
                _ => false,
            };
            if !same {
                continue;
            }
            let written = file
                .set_len(0)
                .and_then(|_| file.rewind())
                .and_then(|_| file.write_all(holder.as_bytes()));
            if let Err(e) = written {
                return Err(Err(format!("{}: {e}", path.display())));
            }
            return Ok(LockFile {
                path: path.to_path_buf(),
                _file: file,
            });
        }
        Err(Err(format!(
            "{}: removed and recreated while taking the lock, again and again",
            path.display()
        )))
    }
}

impl Drop for LockFile {
    fn drop(&mut self) {
        // Removed while still locked, so that whoever opens it next makes a new one.
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The locks of a running instance: its control socket and its attached interfaces.
pub struct InstanceLocks {
    _locks: Vec<LockFile>,
}

impl InstanceLocks {
    /// Takes every lock or none (the ones taken are released on error).
    pub fn take(cfg: &Config, lock_dir: &Path) -> Result<InstanceLocks, String> {
        let file = cfg.path.display();
        let holder = format!(
            "pid {}, config {}\n",
            std::process::id(),
            cfg.path.display()
        );
        let held_by = |who: Option<String>| match who {
            Some(w) => format!("held by another Sluice ({w})"),
            None => "held by another Sluice".to_string(),
        };
        let mut locks = Vec::new();
        let socket = &cfg.control.socket;
        let at = cfg.place("control.socket");
        // The lock sits beside the socket: its directory is made here, as the control
        // server would make it, not only when the server starts (/run/sluice is gone
        // after a reboot).
        crate::control::server::create_parent_dir(socket)
            .map_err(|e| format!("{at}: control.socket {}: {e}", socket.display()))?;
        let mut lock_path = socket.clone().into_os_string();
        lock_path.push(".lock");
        let lock_path = PathBuf::from(lock_path);
        locks.push(LockFile::take(&lock_path, &holder).map_err(|e| match e {
            Ok(who) => format!(
                "{at}: control.socket {} is {} (lock {})",
                socket.display(),
                held_by(who),
                lock_path.display()
            ),
            Err(e) => format!("{at}: control.socket {}: lock: {e}", socket.display()),
        })?);
        let attached = attached_devices(cfg);
        if !attached.is_empty() {
            std::fs::create_dir_all(lock_dir)
                .map_err(|e| format!("creating {}: {e}", lock_dir.display()))?;
        }
        let netns = network_namespace();
        for (port, device) in attached {
            let name = match &device {
                Attached::Interface(iface) => format!("iface-{netns}-{}.lock", escape(iface)),
                Attached::Pci(addr) => format!("pci-{}.lock", escape(addr)),
            };
            let path = lock_dir.join(name);
            locks.push(LockFile::take(&path, &holder).map_err(|e| match e {
                Ok(who) => format!(
                    "{file}: port {port}: {device} is {} (lock {})",
                    held_by(who),
                    path.display()
                ),
                Err(e) => format!("{file}: port {port}: {device}: lock: {e}"),
            })?);
        }
        Ok(InstanceLocks { _locks: locks })
    }
}

/// A device a port attaches to that two processes must not share.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Attached {
    /// A kernel interface (af_packet, pcap, tap, af_xdp).
    Interface(String),
    Pci(String),
}

impl std::fmt::Display for Attached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Attached::Interface(i) => write!(f, "interface {i}"),
            Attached::Pci(a) => write!(f, "PCI device {a}"),
        }
    }
}

/// The devices of every port, by port name, without repeats.
fn attached_devices(cfg: &Config) -> Vec<(String, Attached)> {
    let mut out: Vec<(String, Attached)> = Vec::new();
    for port in &cfg.ports {
        let mut found = match &port.device {
            PortDevice::Pci(addr) => vec![Attached::Pci(addr.clone())],
            PortDevice::Vdev(spec) => vdev_interfaces(spec)
                .into_iter()
                .map(Attached::Interface)
                .collect(),
            PortDevice::Loopback => Vec::new(),
        };
        // The exception path's kernel interface is as much this instance's.
        if let Some(e) = &port.exception {
            found.push(Attached::Interface(e.interface.clone()));
        }
        for device in found {
            if !out.iter().any(|(_, d)| *d == device) {
                out.push((port.name.clone(), device));
            }
        }
    }
    out
}

/// The kernel interfaces a vdev string names (`net_af_packet0,iface=eth0`,
/// `net_pcap0,rx_iface=a,tx_iface=b`, `net_tap0,iface=dtap0`).
fn vdev_interfaces(spec: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for arg in spec.split(',').skip(1) {
        if let Some((key, value)) = arg.split_once('=') {
            let key = key.trim();
            let value = value.trim();
            let names_interface = matches!(key, "iface" | "rx_iface" | "rx_iface_in" | "tx_iface");
            if names_interface && !value.is_empty() && !out.iter().any(|v| v == value) {
                out.push(value.to_string());
            }
        }
    }
    out
}

/// This process's network namespace (the inode of /proc/self/ns/net): interface names
/// are per namespace.
fn network_namespace() -> String {
    std::fs::metadata("/proc/self/ns/net")
        .map(|m| m.ino().to_string())
        .unwrap_or_else(|_| "0".into())
}

/// A name safe in a file name: anything but `[A-Za-z0-9._:-]` as `%XX`.
fn escape(name: &str) -> String {
    name.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'.' | b'_' | b':' | b'-' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(extra: &str) -> Config {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sluice.toml");
        let text = format!(
            "[eal]\nhugepages = false\nmemory_mb = 256\n\n[lcores]\nmanagement = 0\n\
             workers = [1]\n\n[control]\nsocket = {:?}\n\n{extra}",
            dir.path().join("ctl.sock").display().to_string()
        );
        std::fs::write(&path, text).unwrap();
        let cfg = Config::load(&path).unwrap_or_else(|e| panic!("{e}"));
        // The socket's directory must outlive the test's use of it.
        std::mem::forget(dir);
        cfg
    }

    const PORT: &str = "[[ports]]\nname = \"p0\"\nvdev = \"net_af_packet0,iface=veth9\"\n\
                        addresses = [\"198.18.0.1/24\"]\n";

    /// The device's own maximum, as a NIC with 2 KiB buffers reports it: a port `mtu`
    /// above it names the field and its place; one within passes.
    #[test]
    fn an_mtu_beyond_the_device_is_refused_naming_the_field() {
        let limits = DeviceLimits {
            max_rx_queues: 4,
            max_tx_queues: 4,
            min_mtu: 68,
            max_mtu: 2026,
        };
        let cfg = config(&format!("{PORT}mtu = 9000\n"));
        let e = check_device(&cfg, 0, "net_x", &limits).unwrap_err();
        assert!(
            e.contains("sluice.toml:16:7: ports[0].mtu: 9000 is outside what the device of port \"p0\" (net_x) takes, 68 to 2026"),
            "{e}"
        );
        let cfg = config(&format!("{PORT}mtu = 1500\n"));
        assert_eq!(check_device(&cfg, 0, "net_x", &limits), Ok(()));
        // A driver that reports no maximum.
        let cfg = config(&format!("{PORT}mtu = 9000\n"));
        let unset = DeviceLimits {
            max_mtu: 0,
            ..limits
        };
        assert_eq!(check_device(&cfg, 0, "net_x", &unset), Ok(()));
    }

    #[test]
    fn lcores_outside_the_affinity_are_refused_naming_the_field() {
        let cfg = config(PORT);
        assert!(check_lcores(&cfg, &[0, 1]).is_ok());
        let e = check_lcores(&cfg, &[0]).unwrap_err();
        // Line 7 of `config`'s text: `workers = [1]`, the value at column 12.
        assert!(
            e.contains("sluice.toml:7:12: lcores.workers[0]: worker lcore 1 runs on CPU 1"),
            "{e}"
        );
        assert!(e.contains("CPU(s) 0 "), "{e}");
        let e = check_lcores(&cfg, &[1, 2, 3]).unwrap_err();
        assert!(e.contains("sluice.toml:6:14: lcores.management: "), "{e}");
        assert!(e.contains("CPU(s) 1-3 "), "{e}");
    }

    #[test]
    fn a_cpus_mapping_is_checked_instead_of_the_worker_ids() {
        let mut cfg = config(PORT);
        cfg.lcores.workers = vec![5, 6];
        cfg.lcores.cpus = Some(vec![1, 1]);
        assert!(check_lcores(&cfg, &[0, 1]).is_ok());
        cfg.lcores.cpus = Some(vec![1, 3]);
        let e = check_lcores(&cfg, &[0, 1]).unwrap_err();
        // Set here, not in the file: no line to name.
        assert!(
            e.contains("sluice.toml: lcores.cpus[1]: worker lcore 6 is mapped to CPU 3"),
            "{e}"
        );
    }

    #[test]
    fn an_exception_interface_needs_its_kernel_device() {
        let dev = tempfile::tempdir().unwrap();
        let with = |kind: &str| config(&format!("{PORT}[ports.exception]\nkind = \"{kind}\"\n"));
        let (tap, virtio) = (with("tap"), with("virtio-user"));
        assert!(check_exception_devices(&config(PORT), dev.path()).is_ok());
        // An empty /dev: neither works, each refused at its `kind` line.
        let e = check_exception_devices(&virtio, dev.path()).unwrap_err();
        assert!(
            e.contains(
                "sluice.toml:17: ports[0].exception.kind: port p0: kind = \"virtio-user\" needs"
            ),
            "{e}"
        );
        assert!(
            e.contains("vhost-net, which this machine does not have"),
            "{e}"
        );
        let e = check_exception_devices(&tap, dev.path()).unwrap_err();
        assert!(
            e.contains("net/tun, which this machine does not have"),
            "{e}"
        );
        // With the device node each needs, each passes.
        std::fs::create_dir(dev.path().join("net")).unwrap();
        std::fs::write(dev.path().join("net/tun"), "").unwrap();
        assert!(check_exception_devices(&tap, dev.path()).is_ok());
        assert!(check_exception_devices(&virtio, dev.path()).is_err());
        std::fs::write(dev.path().join("vhost-net"), "").unwrap();
        assert!(check_exception_devices(&virtio, dev.path()).is_ok());
    }

    #[test]
    fn memory_need_uses_the_allocators_figures() {
        let cfg = config(&format!("{PORT}\n[sessions]\ncapacity = 1048576\n"));
        let need = MemoryNeed::of(&cfg);
        assert_eq!(need.workers, 1);
        // The session tables as allocated (IPv4, and IPv6 at an eighth, 2^17), and
        // the SYN proxy's 20 bytes a slot (side entry and timer ticket) and its timer.
        use crate::dataplane::synproxy_retry::{SynTimer, CAPACITY};
        let v6 = crate::session::table6::SessionTable6::with_capacity(1 << 17).memory_bytes();
        let timer = SynTimer::<crate::session::SessionId>::bytes_for(CAPACITY);
        let expected = crate::session::SessionTable::with_capacity(1 << 20).memory_bytes()
            + (20 << 20)
            + timer
            + v6;
        assert_eq!(need.sessions_per_worker, expected);
        // Without hugepages the EAL's 256 MB is ordinary memory.
        assert!(need.other >= 256 << 20);
        assert_eq!(need.hugepages, 0);
    }

    /// Each worker's two neighbour tables, as allocated, grow with `[sessions]
    /// neighbours`.
    #[test]
    fn memory_need_counts_the_neighbour_tables() {
        let at = |n: u32| {
            let cfg = config(&format!("{PORT}\n[sessions]\nneighbours = {n}\n"));
            MemoryNeed::of(&cfg).other
        };
        use crate::dataplane::neighbour::{Neighbour6Table, NeighbourTable};
        // `bytes_for` is what a table allocates (the neighbour module's test).
        let tables =
            |n| NeighbourTable::<std::net::Ipv4Addr>::bytes_for(n) + Neighbour6Table::bytes_for(n);
        assert_eq!(at(65536) - at(4096), tables(65536) - tables(4096));
        assert_eq!(tables(65536) - tables(4096), (131072 - 8192) * (40 + 48));
    }

    /// Each `mh` service's Maglev table counts twice (the one in use and the one a
    /// change builds), at its own size.
    #[test]
    fn memory_need_counts_the_maglev_tables() {
        let service = |scheduler: &str, size: Option<u32>| {
            format!(
                "[[services]]\nproto = \"tcp\"\nvip = \"198.18.1.1\"\nport = 80\n\
                 scheduler = \"{scheduler}\"\n{}",
                size.map(|s| format!("mh_table_size = {s}\n"))
                    .unwrap_or_default()
            )
        };
        let other = |services: &str| MemoryNeed::of(&config(&format!("{PORT}\n{services}"))).other;
        let base = other(&service("rr", None));
        assert_eq!(other(&service("mh", None)) - base, 2 * 65537 * 4);
        assert_eq!(
            other(&service("mh", Some(1_000_003))) - base,
            2 * 1_000_003 * 4
        );
        // What a table of that size holds.
        let table = crate::sched::Maglev::new(&[], 251, Default::default()).unwrap();
        assert_eq!(
            crate::sched::Maglev::bytes_for(251),
            std::mem::size_of_val(table.table())
        );
    }

    #[test]
    fn an_oversized_capacity_is_refused_with_the_figures() {
        let cfg = config(&format!("{PORT}\n[sessions]\ncapacity = 67108864\n"));
        let need = MemoryNeed::of(&cfg);
        let avail = Available {
            mem_available: Some(4 << 30),
            cgroup_room: None,
            hugepages_free: None,
        };
        let e = check_memory(&cfg, &need, &avail).unwrap_err();
        assert!(
            e.contains("sluice.toml:18:12: sessions.capacity = 67108864 needs"),
            "{e}"
        );
        assert!(
            e.contains("but only 4096 MiB is available (MemAvailable"),
            "{e}"
        );
        // The capacity it suggests fits, one more session does not.
        let at_most: usize = e
            .split(" at most here")
            .next()
            .and_then(|s| s.rsplit('(').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no suggestion in {e}"));
        let table = |c| Forwarder::session_bytes_for(c, DEFAULT_WHEEL_SLOTS);
        let room = (4u64 << 30) - need.other as u64;
        assert!(table(at_most) as u64 <= room && table(at_most + 1) as u64 > room);
        // A tighter cgroup limit is the one that counts.
        let small = config(&format!("{PORT}\n[sessions]\ncapacity = 1048576\n"));
        let need = MemoryNeed::of(&small);
        assert!(check_memory(&small, &need, &avail).is_ok());
        let capped = Available {
            cgroup_room: Some((64 << 20, "memory.limit_in_bytes")),
            ..avail
        };
        let e = check_memory(&small, &need, &capped).unwrap_err();
        assert!(
            e.contains("64 MiB is available (left under this cgroup's memory.limit_in_bytes)"),
            "{e}"
        );
    }

    #[test]
    fn hugepages_are_checked_against_the_free_ones() {
        let mut cfg = config(PORT);
        cfg.eal.hugepages = true;
        let need = MemoryNeed::of(&cfg);
        assert_eq!(need.hugepages, 256 << 20);
        let avail = Available {
            mem_available: Some(8 << 30),
            cgroup_room: None,
            hugepages_free: Some(128 << 20),
        };
        let e = check_memory(&cfg, &need, &avail).unwrap_err();
        assert!(
            e.contains("eal.memory_mb = 256 needs 256 MiB of hugepages but 128 MiB"),
            "{e}"
        );
    }

    #[test]
    fn meminfo_lines_are_read_in_bytes() {
        let text = "MemTotal:       24684000 kB\nMemAvailable:   23900000 kB\n";
        assert_eq!(meminfo_bytes(text, "MemAvailable"), Some(23_900_000 * 1024));
        assert_eq!(meminfo_bytes(text, "Hugetlb"), None);
    }

    #[test]
    fn vdev_strings_name_their_interfaces() {
        assert_eq!(
            vdev_interfaces("net_af_packet0,iface=veth0,qpairs=2"),
            ["veth0"]
        );
        assert_eq!(
            vdev_interfaces("net_pcap0,rx_iface=a,tx_iface=b"),
            ["a".to_string(), "b".to_string()]
        );
        assert_eq!(vdev_interfaces("net_pcap0,rx_iface=a,tx_iface=a"), ["a"]);
        assert!(vdev_interfaces("net_pcap0,rx_pcap=/tmp/in.pcap,tx_pcap=/tmp/o").is_empty());
        assert_eq!(escape("eth0.10"), "eth0.10");
        assert_eq!(escape("a/b c"), "a%2Fb%20c");
    }

    #[test]
    fn a_second_instance_is_refused_naming_the_holder_and_the_lock_is_released() {
        let cfg = config(PORT);
        let dir = tempfile::tempdir().unwrap();
        let first = InstanceLocks::take(&cfg, dir.path()).unwrap();
        let socket_lock = format!("{}.lock", cfg.control.socket.display());
        assert!(Path::new(&socket_lock).exists());
        let e = InstanceLocks::take(&cfg, dir.path()).err().unwrap();
        let me = format!("pid {}, config {}", std::process::id(), cfg.path.display());
        assert!(e.contains("control.socket"), "{e}");
        assert!(e.contains(&me), "{e}");
        // Another socket, the same interface.
        let mut other = cfg.clone();
        other.control.socket = cfg.control.socket.with_file_name("other.sock");
        let e = InstanceLocks::take(&other, dir.path()).err().unwrap();
        assert!(
            e.contains("port p0: interface veth9 is held by another Sluice"),
            "{e}"
        );
        assert!(e.contains(&me), "{e}");
        // The refused attempt released the socket lock it had taken.
        assert!(!other.control.socket.with_extension("sock.lock").exists());
        drop(first);
        assert!(!Path::new(&socket_lock).exists());
        let again = InstanceLocks::take(&other, dir.path());
        assert!(again.is_ok(), "{:?}", again.err());
    }

    #[test]
    fn the_v1_memory_cgroup_is_found_from_proc_self_cgroup_and_mountinfo() {
        // cgroup v1 (with the v2 hierarchy unused), memory co-mounted with nothing.
        let own = "12:pids:/system.slice/sluice.service\n\
                   4:memory:/system.slice/sluice.service\n\
                   2:cpu,cpuacct:/system.slice/sluice.service\n\
                   1:name=systemd:/system.slice/sluice.service\n\
                   0::/system.slice/sluice.service\n";
        assert_eq!(v1_memory_cgroup(own), Some("/system.slice/sluice.service"));
        // Co-mounted: "cpu,memory"; "memory_x" or "name=memory" are not it.
        assert_eq!(v1_memory_cgroup("3:cpu,memory:/a\n"), Some("/a"));
        assert_eq!(v1_memory_cgroup("3:memory_x:/a\n5:name=memory:/b\n"), None);
        assert_eq!(v1_memory_cgroup("0::/a\n"), None, "v2 only");
        let mountinfo = "25 30 0:23 / /sys/fs/cgroup ro,nosuid shared:9 - tmpfs tmpfs ro,mode=755\n\
                         26 25 0:24 / /sys/fs/cgroup/unified rw shared:10 - cgroup2 cgroup2 rw\n\
                         33 25 0:29 / /sys/fs/cgroup/cpu,cpuacct rw shared:15 - cgroup cgroup rw,cpu,cpuacct\n\
                         35 25 0:31 / /sys/fs/cgroup/memory rw,nosuid shared:17 - cgroup cgroup rw,memory\n";
        let (root, mount) = v1_memory_mount(mountinfo).unwrap();
        assert_eq!(
            (root.as_path(), mount.as_path()),
            (Path::new("/"), Path::new("/sys/fs/cgroup/memory"))
        );
        assert_eq!(
            v1_cgroup_dir("/system.slice/sluice.service", &root, &mount),
            Path::new("/sys/fs/cgroup/memory/system.slice/sluice.service")
        );
        // Inside a container: the mount's root is the container's cgroup, its path in
        // /proc/self/cgroup starts with it; an escaped space in the mount point.
        let container = "1094 1085 0:31 /docker/abc /sys/fs/cgroup/mem\\040ory ro,nosuid master:17 - cgroup cgroup rw,memory\n";
        let (root, mount) = v1_memory_mount(container).unwrap();
        assert_eq!(mount, Path::new("/sys/fs/cgroup/mem ory"));
        assert_eq!(
            v1_cgroup_dir("/docker/abc/inner", &root, &mount),
            Path::new("/sys/fs/cgroup/mem ory/inner")
        );
        assert_eq!(v1_cgroup_dir("/docker/abc", &root, &mount), mount);
        assert_eq!(
            v1_memory_mount(&mountinfo[..mountinfo.find("35 25").unwrap()]),
            None
        );
    }

    #[test]
    fn a_v1_limit_of_unlimited_is_no_limit() {
        assert_eq!(v1_limit("1073741824\n"), Some(1 << 30));
        // "Unlimited" with 4 KiB and with 64 KiB pages.
        assert_eq!(v1_limit("9223372036854771712\n"), None);
        assert_eq!(v1_limit("9223372036854710272\n"), None);
        assert_eq!(v1_limit("-1"), None);
    }

    #[test]
    fn a_missing_socket_directory_is_made_before_the_lock() {
        use std::os::unix::fs::PermissionsExt;
        let mut cfg = config(PORT);
        let dir = tempfile::tempdir().unwrap();
        let parent = dir.path().join("nodir/sub");
        cfg.control.socket = parent.join("ctl.sock");
        let locks = InstanceLocks::take(&cfg, dir.path()).unwrap_or_else(|e| panic!("{e}"));
        assert!(parent.join("ctl.sock.lock").exists());
        let mode = std::fs::metadata(&parent).unwrap().permissions().mode() & 0o7777;
        assert_eq!(mode, crate::control::server::SOCKET_DIR_MODE);
        drop(locks);
        assert!(!parent.join("ctl.sock.lock").exists());
    }

    /// A symlink at the lock's path (someone who may write the socket's directory
    /// put it there) is refused: root would otherwise truncate and write its target.
    #[test]
    fn a_symlink_in_place_of_the_lock_is_not_followed() {
        let mut cfg = config(PORT);
        let dir = tempfile::tempdir().unwrap();
        cfg.control.socket = dir.path().join("ctl.sock");
        let target = dir.path().join("precious");
        std::fs::write(&target, "keep me\n").unwrap();
        std::os::unix::fs::symlink(&target, dir.path().join("ctl.sock.lock")).unwrap();
        let e = InstanceLocks::take(&cfg, dir.path()).err().unwrap();
        assert!(e.contains("ctl.sock.lock"), "{e}");
        assert_eq!(std::fs::read_to_string(&target).unwrap(), "keep me\n");
    }

    #[test]
    fn a_socket_directory_others_may_write_is_warned_of() {
        use std::os::unix::fs::PermissionsExt;
        let mut cfg = config(PORT);
        let dir = tempfile::tempdir().unwrap();
        cfg.control.socket = dir.path().join("ctl.sock");
        let chmod = |mode| {
            std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(mode)).unwrap()
        };
        for quiet in [0o700, 0o755, 0o750] {
            chmod(quiet);
            assert_eq!(shared_socket_directory(&cfg), None, "{quiet:o}");
        }
        chmod(0o777);
        let w = shared_socket_directory(&cfg).unwrap();
        assert!(
            w.contains(&format!(
                "control.socket: its directory {} is writable by other users (mode 0777): \
                 they can replace the socket with their own",
                dir.path().display()
            )),
            "{w}"
        );
        chmod(0o1777);
        let w = shared_socket_directory(&cfg).unwrap();
        assert!(
            w.contains("(mode 1777): they can take the names beside the socket"),
            "{w}"
        );
        chmod(0o770);
        assert!(shared_socket_directory(&cfg).is_some());
        chmod(0o700);
        // Owner-only, but another user's: its owner can replace the socket.
        std::os::unix::fs::chown(dir.path(), Some(65534), None).unwrap();
        let w = shared_socket_directory(&cfg).unwrap();
        assert!(
            w.contains("belongs to uid 65534, not to this daemon's user"),
            "{w}"
        );
        std::os::unix::fs::chown(dir.path(), Some(0), None).unwrap();
        assert_eq!(shared_socket_directory(&cfg), None);
    }

    /// Metrics on every address, or on a port's own, with that port's exception path:
    /// warned of; on a management address, or with no exception path, not.
    #[test]
    fn metrics_the_exception_path_exposes_are_warned_of() {
        let mut cfg = config(PORT);
        let listen = |s: &str| Some(s.parse::<std::net::SocketAddr>().unwrap());
        cfg.control.metrics = listen("0.0.0.0:9101");
        assert_eq!(exposed_metrics(&cfg), None, "no exception path");
        cfg.ports[0].exception = Some(crate::config::ExceptionConfig {
            kind: crate::config::ExceptionKind::Tap,
            interface: "sx-lan0".into(),
            rate: 1000,
            ring_size: 1024,
            kind_line: 1,
        });
        let port_address = format!("{}:9101", cfg.ports[0].addresses[0].addr);
        for exposed in ["0.0.0.0:9101", "[::]:9101", port_address.as_str()] {
            cfg.control.metrics = listen(exposed);
            let w = exposed_metrics(&cfg).unwrap_or_else(|| panic!("{exposed}"));
            assert!(
                w.contains(&format!(
                    "control.metrics: {exposed} is reachable through port p0's exception path \
                     by anyone who can reach the port's addresses, and the metrics name every \
                     service and real server: listen on a management address"
                )),
                "{w}"
            );
        }
        for quiet in ["127.0.0.1:9101", "192.0.2.77:9101"] {
            cfg.control.metrics = listen(quiet);
            assert_eq!(exposed_metrics(&cfg), None, "{quiet}");
        }
    }

    /// A config whose pool outgrows its memory: two workers, 4096 RX and TX descriptors, 256 MB.
    fn large_rings(memory_mb: u32) -> Config {
        let mut cfg =
            config(&PORT.replace("addresses", "rx_desc = 4096\ntx_desc = 4096\naddresses"));
        cfg.lcores.workers = vec![1, 2];
        cfg.eal.memory_mb = memory_mb;
        cfg
    }

    #[test]
    fn the_mbuf_pool_is_counted_per_descriptor_worker_and_ring() {
        // One worker, 1024 + 1024 descriptors (twice), its redirect ring, 8192: 14336.
        assert_eq!(mbuf_count(&config(PORT)), 16_383);
        // Two workers, 4096 + 4096: 32768 + 4096 + 8192.
        assert_eq!(mbuf_count(&large_rings(256)), 65_535);
        // A tap exception interface adds its queues and ring: 14336 + 1024 + 4096.
        let tap = config(&format!(
            "{PORT}[ports.exception]\nkind = \"tap\"\nring_size = 4096\n"
        ));
        assert_eq!(mbuf_count(&tap), 32_767);
    }

    #[test]
    fn a_pool_larger_than_eal_memory_mb_is_refused_with_the_smallest_that_fits() {
        let page = 4096;
        let need = EalMemory::of(&large_rings(256), page);
        assert_eq!(need.mbufs, 65_535);
        // One mbuf a page without hugepages: 256 MiB of objects, less a page.
        assert!(need.pool.objects > (256 << 20) - 4096, "{need:?}");
        assert!(need.pool.total() > 256 << 20, "{need:?}");
        assert!(need.own >= EAL_OWN + 2 * EAL_PER_QUEUE, "{need:?}");
        let e = check_eal_memory(&large_rings(256), &need).unwrap_err();
        assert!(
            e.contains(
                "sluice.toml:3:13: eal.memory_mb = 256 cannot hold the mbuf pool: 65535 mbufs \
                 (the RX and TX descriptors of 1 port(s) for 2 worker(s), and the rings) \
                 of 2368 bytes each take 258 MiB in 4 KiB pages without hugepages"
            ),
            "{e}"
        );
        let smallest = need.memory_mb();
        assert!(
            e.contains(&format!("; set eal.memory_mb = {smallest} or more")),
            "{e}"
        );
        // The figure it names fits; one MB less does not.
        assert!(check_eal_memory(&large_rings(smallest as u32), &need).is_ok());
        let e = check_eal_memory(&large_rings(smallest as u32 - 1), &need).unwrap_err();
        assert!(e.contains("cannot hold the mbuf pool"), "{e}");
        // The default rings fit in 256 MB with room to spare.
        let default = EalMemory::of(&config(PORT), page);
        assert!(check_eal_memory(&config(PORT), &default).is_ok());
        assert!(default.memory_mb() < 128, "{default:?}");
        // With hugepages an mbuf takes its own size, not a page.
        let mut huge = large_rings(256);
        huge.eal.hugepages = true;
        let need = EalMemory::of(&huge, 2 << 20);
        assert!(need.pool.objects < 160 << 20, "{need:?}");
        assert!(check_eal_memory(&huge, &need).is_ok());
    }

    /// A frame is received whole into one mbuf: the data room follows the largest
    /// port MTU, and the pool's memory with it, checked before start.
    #[test]
    fn the_mbuf_data_room_holds_the_largest_ports_frames() {
        let with_mtu = |mtu: &str| config(&format!("{PORT}{mtu}"));
        let room = |mtu: &str| mbuf_data_room(&with_mtu(mtu));
        assert_eq!(room(""), 2048);
        assert_eq!(room("mtu = 1500\n"), 2048);
        assert_eq!(room("mtu = 1962\n"), 2048);
        assert_eq!(room("mtu = 1963\n"), 3072);
        assert_eq!(room("mtu = 9000\n"), 9216);
        let second = "[[ports]]\nname = \"p1\"\nvdev = \"net_af_packet1,iface=veth8\"\n\
                      addresses = [\"198.18.1.1/24\"]\nmtu = 4000\n";
        assert_eq!(mbuf_data_room(&config(&format!("{PORT}{second}"))), 4096);
        let page = 4096;
        let (mut small, mut jumbo) = (with_mtu(""), with_mtu("mtu = 9000\n"));
        let (small_need, jumbo_need) = (EalMemory::of(&small, page), EalMemory::of(&jumbo, page));
        // Memory for the 1500-byte frames' pool: the jumbo one is refused before start.
        small.eal.memory_mb = small_need.memory_mb() as u32;
        jumbo.eal.memory_mb = small.eal.memory_mb;
        assert!(check_eal_memory(&small, &small_need).is_ok());
        assert_eq!(small_need.mbufs, jumbo_need.mbufs);
        assert!(
            jumbo_need.pool.object >= small_need.pool.object + 9216 - 2048,
            "{small_need:?} {jumbo_need:?}"
        );
        let e = check_eal_memory(&jumbo, &jumbo_need).unwrap_err();
        assert!(
            e.contains("cannot hold the mbuf pool") && e.contains("9216 bytes of data"),
            "{e}"
        );
    }

    #[test]
    fn eal_channels_come_from_extra_args() {
        let mut cfg = config(PORT);
        assert_eq!(eal_option(&cfg, "-n"), None);
        cfg.eal.extra_args = vec!["-n".into(), "6".into(), "-r2".into()];
        assert_eq!(eal_option(&cfg, "-n"), Some(6));
        assert_eq!(eal_option(&cfg, "-r"), Some(2));
        cfg.eal.extra_args = vec!["--no-telemetry".into()];
        assert_eq!(eal_option(&cfg, "-n"), None);
    }

    /// Every config the repository ships fits its own `eal.memory_mb` and the packaged
    /// unit's `LimitNOFILE`.
    #[test]
    fn the_example_configs_fit_their_eal_memory_and_the_units_file_limit() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let unit = std::fs::read_to_string(root.join("packaging/sluice.service")).unwrap();
        let limit: u64 = unit
            .lines()
            .find_map(|l| l.strip_prefix("LimitNOFILE="))
            .and_then(|v| v.trim().parse().ok())
            .expect("the unit sets LimitNOFILE");
        let mut files: Vec<PathBuf> = std::fs::read_dir(root.join("config"))
            .unwrap()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "toml"))
            .collect();
        files.push(root.join("packaging/sluice.toml"));
        assert!(files.len() > 2, "{files:?}");
        for file in files {
            let cfg = Config::load(&file).unwrap_or_else(|e| panic!("{e}"));
            let page = if cfg.eal.hugepages { 2 << 20 } else { 4096 };
            let need = EalMemory::of(&cfg, page);
            if let Err(e) = check_eal_memory(&cfg, &need) {
                panic!("{e}");
            }
            let files = FileNeed::of(&cfg, 2 << 20);
            if let Err(e) = check_open_files(&cfg, &files, Some(limit)) {
                panic!("{e}");
            }
        }
    }

    #[test]
    fn open_files_are_counted_per_worker_port_and_hugepage() {
        // An af_packet port, one worker, no hugepages.
        let cfg = config(PORT);
        let need = FileNeed::of(&cfg, 2 << 20);
        assert_eq!(
            need,
            FileNeed {
                hugepages: 0,
                workers: 4,
                ports: 6
            }
        );
        assert_eq!(need.total(), 15 + 4 + 6 + 64);
        // Two workers and a tap exception interface.
        let mut tap = config(&format!("{PORT}[ports.exception]\nkind = \"tap\"\n"));
        tap.lcores.workers = vec![1, 2];
        let need = FileNeed::of(&tap, 2 << 20);
        assert_eq!((need.workers, need.ports), (8, 4 + 2 * 2 + 8));
        // A file kept open for each 2 MiB hugepage of 2 GB, or a few per segment list.
        let mut huge = config(PORT);
        (huge.eal.hugepages, huge.eal.memory_mb) = (true, 2048);
        assert_eq!(FileNeed::of(&huge, 2 << 20).hugepages, 1024 + 8);
        assert_eq!(FileNeed::of(&huge, 1 << 30).hugepages, 2 + 8);
        huge.eal.extra_args = vec!["--single-file-segments".into()];
        assert_eq!(FileNeed::of(&huge, 2 << 20).hugepages, 16 + 8);
    }

    #[test]
    fn control_connections_get_what_the_open_file_limit_leaves() {
        let cfg = config(PORT);
        // 15 + 4 + 6 for DPDK, the worker and the port, 32 kept for the daemon.
        let need = FileNeed::of(&cfg, 2 << 20);
        assert_eq!(connection_limit(&need, None), CONTROL_CONNECTIONS_MAX);
        assert_eq!(
            connection_limit(&need, Some(1 << 20)),
            CONTROL_CONNECTIONS_MAX
        );
        assert_eq!(connection_limit(&need, Some(1024)), 1024 - 25 - 32);
        assert_eq!(connection_limit(&need, Some(89)), 32);
        // Below the need (refused by the preflight): never zero.
        assert_eq!(connection_limit(&need, Some(10)), 32);
        // 2 GB of 2 MiB hugepages hold 1032 descriptors.
        let mut huge = config(PORT);
        (huge.eal.hugepages, huge.eal.memory_mb) = (true, 2048);
        let need = FileNeed::of(&huge, 2 << 20);
        assert_eq!(connection_limit(&need, Some(2048)), 2048 - 1057 - 32);
    }

    #[test]
    fn a_hard_open_file_limit_below_the_need_is_refused_saying_how_to_raise_it() {
        let cfg = config(PORT);
        let need = FileNeed::of(&cfg, 2 << 20);
        assert!(check_open_files(&cfg, &need, Some(89)).is_ok());
        assert!(check_open_files(&cfg, &need, None).is_ok());
        let e = check_open_files(&cfg, &need, Some(64)).unwrap_err();
        assert!(
            e.contains(
                "sluice.toml: the open-file limit (RLIMIT_NOFILE) is 64, but this config \
                 needs about 89 descriptors (4 for 1 worker lcore(s), 6 for the ports"
            ),
            "{e}"
        );
        assert!(
            e.contains("LimitNOFILE=89 or more in the systemd unit"),
            "{e}"
        );
        assert!(e.contains("ulimit -n 89 in the shell"), "{e}");
        let mut huge = config(PORT);
        (huge.eal.hugepages, huge.eal.memory_mb) = (true, 2048);
        let need = FileNeed::of(&huge, 2 << 20);
        let e = check_open_files(&huge, &need, Some(1024)).unwrap_err();
        assert!(
            e.contains(
                "about 1121 descriptors (1032 for the hugepages of eal.memory_mb = 2048 and \
                 DPDK's runtime files, "
            ),
            "{e}"
        );
    }

    #[test]
    fn listen_addresses_in_use_or_not_of_this_host_are_refused_naming_the_field() {
        let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = held.local_addr().unwrap();
        let mut cfg = config(PORT);
        cfg.control.metrics = Some(addr);
        let e = Listeners::bind(&cfg).err().unwrap();
        assert!(
            e.contains(&format!(
                "sluice.toml: control.metrics: cannot listen on {addr}: "
            )),
            "{e}"
        );
        assert!(e.contains("(another process listens there)"), "{e}");
        drop(held);
        let bound = Listeners::bind(&cfg).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(bound.metrics.unwrap().local_addr().unwrap(), addr);
        // 192.0.2.1 (TEST-NET-1) is no address of this host.
        let sync = |listen: &str, peer: &str, extra: &str| {
            config(&format!(
                "{PORT}\n[sync]\nlisten = \"{listen}\"\npeers = [\"{peer}\"]\n\
                 unauthenticated = true\n{extra}"
            ))
        };
        let e = Listeners::bind(&sync("192.0.2.1:8848", "192.0.2.2:8848", ""))
            .err()
            .unwrap();
        assert!(
            e.contains("sluice.toml: sync.listen: cannot bind 192.0.2.1:8848: "),
            "{e}"
        );
        assert!(e.contains("(not an address of this host)"), "{e}");
        // Sync through a DPDK port binds no kernel socket.
        let port = sync("198.18.0.1:8848", "198.18.0.2:8848", "port = \"p0\"\n");
        assert!(Listeners::bind(&port).unwrap().sync.is_none());
    }
}
