//! The configuration a test runs `sluice` with: [`DaemonConfig`] writes the TOML file
//! into a temp dir of its own, [`PortSpec`] is one `[[ports]]` entry and
//! [`service_section`] one `[[services]]` entry.

use super::process::unique_tag;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// One `[[ports]]` entry.
#[derive(Clone, Debug)]
pub struct PortSpec {
    pub name: String,
    /// `Some(vdev)` for an EAL virtual device, `None` for `loopback = true`.
    pub vdev: Option<String>,
    pub mac: Option<String>,
    pub addresses: Vec<String>,
    /// `[ports.exception]` lines (e.g. `kind = "tap"`); written when non-empty.
    pub exception: Vec<String>,
    /// More lines of the entry (e.g. `rx_desc = 4096`).
    pub settings: Vec<String>,
}

impl PortSpec {
    pub fn vdev(name: &str, vdev: &str, addresses: &[&str]) -> PortSpec {
        PortSpec {
            name: name.into(),
            vdev: Some(vdev.into()),
            mac: None,
            addresses: addresses.iter().map(|a| a.to_string()).collect(),
            exception: Vec::new(),
            settings: Vec::new(),
        }
    }

    pub fn loopback(name: &str, mac: &str, addresses: &[&str]) -> PortSpec {
        PortSpec {
            name: name.into(),
            vdev: None,
            mac: Some(mac.into()),
            addresses: addresses.iter().map(|a| a.to_string()).collect(),
            exception: Vec::new(),
            settings: Vec::new(),
        }
    }

    pub fn with_mac(mut self, mac: &str) -> PortSpec {
        self.mac = Some(mac.into());
        self
    }
}

/// A Sluice configuration plus how to run it. Create with [`DaemonConfig::new`], which
/// also makes the temp dir holding the config file and the control socket.
pub struct DaemonConfig {
    pub dir: tempfile::TempDir,
    pub tag: String,
    pub file_prefix: String,
    pub socket: PathBuf,
    pub workers: Vec<u32>,
    /// `[lcores] cpus`: the CPU of each worker lcore (several may share one).
    pub cpus: Option<Vec<u32>>,
    /// `[lcores] idle_sleep_us`: 20 by default here. Test daemons, their peers and
    /// the tests share two CPUs; workers that poll without pause would take one whole
    /// CPU each and starve the kernel TCP stacks the tests talk through.
    pub idle_sleep_us: u32,
    pub ports: Vec<PortSpec>,
    /// `[loopback]` section lines (e.g. `peers = 2`); written when non-empty.
    pub loopback: Vec<String>,
    /// Run inside this network namespace (`ip netns exec`).
    pub netns: Option<String>,
    /// Extra command-line arguments for `sluice`.
    pub args: Vec<String>,
    /// `[control] metrics` (the Prometheus endpoint's ADDRESS:PORT), when set.
    pub metrics: Option<String>,
    /// Raw TOML appended after everything else (e.g. `[timeouts]`, `[sessions]`,
    /// `[[services]]` sections), verbatim.
    pub extra_toml: Vec<String>,
    /// `Some(mb)`: run on hugepages with `memory_mb = mb` (default: ordinary memory).
    pub hugepages_mb: Option<u32>,
    /// `memory_mb` without hugepages (default 256).
    pub memory_mb: u32,
    /// A command that execs `sluice` with its arguments appended (empty: none).
    pub wrapper: Vec<String>,
}

impl DaemonConfig {
    pub fn new(ports: Vec<PortSpec>) -> DaemonConfig {
        let tag = unique_tag();
        let dir = tempfile::Builder::new()
            .prefix(&format!("sluice-test-{tag}-"))
            .tempdir()
            .expect("creating a temp dir");
        let socket = dir.path().join("ctl.sock");
        assert!(
            socket.as_os_str().len() < 108,
            "socket path too long: {}",
            socket.display()
        );
        DaemonConfig {
            file_prefix: format!("sl-{tag}"),
            tag,
            dir,
            socket,
            workers: vec![1],
            cpus: None,
            idle_sleep_us: 20,
            metrics: None,
            ports,
            loopback: Vec::new(),
            netns: None,
            args: Vec::new(),
            extra_toml: Vec::new(),
            hugepages_mb: None,
            memory_mb: 256,
            wrapper: Vec::new(),
        }
    }

    /// Runs the daemon as the packaged systemd unit (packaging/sluice.service) would
    /// confine it, as far as a test can without systemd: only the capabilities of
    /// the unit's `CapabilityBoundingSet` (read from the unit, so the test follows
    /// it), `NoNewPrivileges`, and `ProtectSystem=strict`'s read-only file system
    /// with the unit's writable paths (`/run/sluice`, `/run/dpdk`) plus the test's
    /// directory in /tmp (where its config, socket and capture files live; the unit
    /// gives the daemon a private /tmp instead).
    pub fn in_unit_sandbox(mut self) -> DaemonConfig {
        let unit = std::fs::read_to_string(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/sluice.service"),
        )
        .unwrap();
        let caps: Vec<String> = unit
            .lines()
            .find_map(|l| l.strip_prefix("CapabilityBoundingSet="))
            .expect("the unit has a CapabilityBoundingSet")
            .split_whitespace()
            .map(|c| format!("+{}", c.trim_start_matches("CAP_").to_lowercase()))
            .collect();
        assert!(
            unit.contains("\nNoNewPrivileges=yes\n") && unit.contains("\nProtectSystem=strict\n")
        );
        let script = "set -e; mkdir -p /run/sluice /run/dpdk; \
            for d in /tmp /run/sluice /run/dpdk; do mount --bind $d $d; done; \
            mount -o remount,bind,ro /; exec \"$@\"";
        self.wrapper = [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            "sh",
            "setpriv",
            &format!("--bounding-set=-all,{}", caps.join(",")),
            "--inh-caps=-all",
            "--no-new-privs",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        self
    }

    pub fn in_netns(mut self, ns: &str) -> DaemonConfig {
        self.netns = Some(ns.into());
        self
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    pub fn toml(&self) -> String {
        let mut t = String::new();
        let q = |s: &str| format!("{s:?}");
        let (hugepages, memory_mb) = match self.hugepages_mb {
            Some(mb) => (true, mb),
            None => (false, self.memory_mb),
        };
        writeln!(
            t,
            "[eal]\nhugepages = {hugepages}\nmemory_mb = {memory_mb}\nfile_prefix = {}\n",
            q(&self.file_prefix)
        )
        .unwrap();
        let workers: Vec<String> = self.workers.iter().map(|w| w.to_string()).collect();
        writeln!(
            t,
            "[lcores]\nmanagement = 0\nworkers = [{}]\nidle_sleep_us = {}",
            workers.join(", "),
            self.idle_sleep_us
        )
        .unwrap();
        if let Some(cpus) = &self.cpus {
            let cpus: Vec<String> = cpus.iter().map(|c| c.to_string()).collect();
            writeln!(t, "cpus = [{}]", cpus.join(", ")).unwrap();
        }
        t.push('\n');
        writeln!(
            t,
            "[control]\nsocket = {}",
            q(&self.socket.to_string_lossy())
        )
        .unwrap();
        if let Some(m) = &self.metrics {
            writeln!(t, "metrics = {}", q(m)).unwrap();
        }
        t.push('\n');
        for p in &self.ports {
            writeln!(t, "[[ports]]\nname = {}", q(&p.name)).unwrap();
            match &p.vdev {
                Some(v) => writeln!(t, "vdev = {}", q(v)).unwrap(),
                None => writeln!(t, "loopback = true").unwrap(),
            }
            if let Some(mac) = &p.mac {
                writeln!(t, "mac = {}", q(mac)).unwrap();
            }
            for line in &p.settings {
                writeln!(t, "{line}").unwrap();
            }
            let addrs: Vec<String> = p.addresses.iter().map(|a| q(a)).collect();
            writeln!(t, "addresses = [{}]\n", addrs.join(", ")).unwrap();
            if !p.exception.is_empty() {
                writeln!(t, "[ports.exception]\n{}\n", p.exception.join("\n")).unwrap();
            }
        }
        if !self.loopback.is_empty() {
            writeln!(t, "[loopback]\n{}", self.loopback.join("\n")).unwrap();
        }
        for extra in &self.extra_toml {
            writeln!(t, "\n{extra}").unwrap();
        }
        t
    }

    /// Writes the config file and returns its path.
    pub fn write(&self) -> PathBuf {
        let path = self.path("sluice.toml");
        std::fs::write(&path, self.toml()).expect("writing the config");
        path
    }
}

/// `[[services]]` TOML: one service, `extra` lines after its header (e.g.
/// `local_addresses = [...]`), then `real_servers` as (ip, port, weight, mode).
pub fn service_section(
    proto: &str,
    vip: &str,
    port: u16,
    scheduler: &str,
    extra: &[String],
    real_servers: &[(&str, u16, u32, &str)],
) -> String {
    let mut t = format!(
        "[[services]]\nproto = \"{proto}\"\nvip = \"{vip}\"\nport = {port}\nscheduler = \"{scheduler}\"\n"
    );
    for line in extra {
        t.push_str(line);
        t.push('\n');
    }
    for (ip, rport, weight, mode) in real_servers {
        t.push_str(&format!(
            "\n  [[services.real_servers]]\n  ip = \"{ip}\"\n  port = {rport}\n  weight = {weight}\n  mode = \"{mode}\"\n"
        ));
    }
    t
}

/// Where `key = ...` is first written in the TOML at `path`, found by reading the text
/// line by line (not with Sluice's parser): `PATH:LINE:COLUMN` of its value, the form
/// in which a refusal made after loading names the line. Panics when no line has it.
pub fn written_at(path: &Path, key: &str) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    for (i, line) in text.lines().enumerate() {
        let Some((name, value)) = line.split_once('=') else {
            continue;
        };
        if name.trim() == key {
            let column = line.len() - value.trim_start().len() + 1;
            return format!("{}:{}:{column}", path.display(), i + 1);
        }
    }
    panic!("no `{key} =` line in {}:\n{text}", path.display())
}
