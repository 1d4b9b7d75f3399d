//! `sluice --check-config FILE`: exit 0 on every example config of the repository
//! (config/*.toml, which scripts/demo.sh and the docs run, and the commented
//! /etc/sluice/sluice.toml the package installs), exit 1 naming the file, line and
//! field on every config the config tests reject (tests/fixtures/broken-configs.json,
//! recorded from src/config/tests.rs), and exit 1 naming the field when this machine
//! cannot run a valid config (the daemon's own preflight checks), all without
//! starting DPDK. And `sluice --prepare` reserving the hugepages a config lacks.
//!
//! Run: `cargo test --release --test integration check_config::` (as root; about 5 s, most of it the
//! 231 refused files).

use crate::common::*;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn check(args: &[&str], file: &Path) -> CmdOutput {
    run_bounded(
        Command::new(SLUICE)
            .arg("--check-config")
            .arg(file)
            .args(args),
        Duration::from_secs(10),
    )
}

fn loopback_config() -> DaemonConfig {
    let mut cfg = DaemonConfig::new(vec![PortSpec::loopback(
        "lan0",
        "02:53:4c:00:00:01",
        &["198.18.0.1/24"],
    )]);
    cfg.loopback = vec!["peers = 1".into()];
    cfg
}

/// Nothing of DPDK ran: no EAL line, and (for a file naming a prefix) no runtime dir.
fn assert_no_dpdk(out: &CmdOutput) {
    assert!(
        !out.stderr.contains("EAL") && !out.stdout.contains("EAL"),
        "DPDK started: {}",
        out.describe()
    );
}

/// The example configs the repository ships and documents.
fn examples() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo().join("config"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    files.push(repo().join("packaging/sluice.toml"));
    files.sort();
    files
}

#[test]
fn every_example_config_is_valid() {
    require_root();
    // The examples' control sockets live in /run/sluice, which the unit's
    // RuntimeDirectory makes; the start-up's socket lock needs it.
    std::fs::create_dir_all("/run/sluice").unwrap();
    let mut checked = Vec::new();
    for file in examples() {
        // Machine checks are for the machine a file is written for: the bare-metal
        // example names a NIC and cores this one may not have.
        let bare_metal =
            file.ends_with("baremetal.toml") || file.ends_with("packaging/sluice.toml");
        let args: &[&str] = if bare_metal { &["--file-only"] } else { &[] };
        let out = check(args, &file);
        assert!(
            out.success(),
            "{} refused: {}",
            file.display(),
            out.describe()
        );
        assert!(
            out.stdout.contains("configuration valid"),
            "{}",
            out.describe()
        );
        assert_no_dpdk(&out);
        checked.push(file.file_name().unwrap().to_string_lossy().into_owned());
    }
    // scripts/demo.sh runs config/loopback.toml; the package installs sluice.toml.
    for must in [
        "loopback.toml",
        "netns.toml",
        "baremetal.toml",
        "sluice.toml",
    ] {
        assert!(
            checked.iter().any(|c| c == must),
            "{must} not checked: {checked:?}"
        );
    }
    let demo = std::fs::read_to_string(repo().join("scripts/demo.sh")).unwrap();
    assert!(
        demo.contains("config/loopback.toml"),
        "demo.sh runs another config"
    );
}

/// Every config the config tests reject, as a file: exit 1 and one
/// `sluice: FILE:LINE:COL: FIELD: ...` line with the line and field they expect.
#[test]
fn every_config_the_config_tests_reject_is_refused_with_file_line_and_field() {
    let cases: Vec<serde_json::Value> = serde_json::from_str(
        &std::fs::read_to_string(repo().join("tests/fixtures/broken-configs.json")).unwrap(),
    )
    .unwrap();
    assert!(cases.len() > 100, "only {} recorded cases", cases.len());
    let dir = tempfile::tempdir().unwrap();
    let mut failures = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let file = dir.path().join(format!("broken-{i}.toml"));
        std::fs::write(&file, case["text"].as_str().unwrap()).unwrap();
        let (line, field) = (
            case["line"].as_u64().unwrap(),
            case["field"].as_str().unwrap(),
        );
        let out = check(&["--file-only"], &file);
        let want = format!("sluice: {}:{line}:", file.display());
        let first = out.stderr.lines().next().unwrap_or("");
        let named = first.starts_with(&want)
            && (field.is_empty() || first.contains(&format!(": {field}: ")));
        if out.status.code() != Some(1) || !named || !out.stdout.is_empty() {
            failures.push(format!(
                "{} ({}): expected exit 1 and {want}..{field}: {}",
                case["test"],
                file.display(),
                out.describe()
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    eprintln!("{} broken configs refused", cases.len());
}

/// The machine checks are the daemon's preflight: a worker on a CPU this process may
/// not use, and a session table larger than memory, are refused naming the field; the
/// same file passes with --file-only.
#[test]
fn a_config_this_machine_cannot_run_is_refused_naming_the_field() {
    require_root();
    let mut cfg = loopback_config();
    let cpus = std::thread::available_parallelism().unwrap().get() as u32;
    cfg.workers = vec![cpus]; // one past the last CPU
    let path = cfg.write();
    let out = check(&[], &path);
    assert_eq!(out.status.code(), Some(1), "{}", out.describe());
    assert!(
        out.stderr.contains(&format!(
            "lcores.workers[0]: worker lcore {cpus} runs on CPU {cpus}"
        )),
        "{}",
        out.describe()
    );
    assert_no_dpdk(&out);
    assert!(check(&["--file-only"], &path).success());

    // 5.4 GiB of tables per worker at the largest capacity: enough workers (sharing
    // CPU 1) that they cannot fit in what this machine has available.
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let available_kb: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("MemAvailable in /proc/meminfo");
    let workers = (available_kb / (5 << 20) + 1).min(64) as u32;
    let mut cfg = loopback_config();
    cfg.workers = (1..=workers).collect();
    cfg.cpus = Some(vec![1; workers as usize]);
    cfg.extra_toml = vec!["[sessions]\ncapacity = 67108864".into()];
    let path = cfg.write();
    let out = check(&[], &path);
    assert_eq!(out.status.code(), Some(1), "{}", out.describe());
    assert!(
        out.stderr.contains(&format!(
            "{}: sessions.capacity = 67108864 needs",
            written_at(&path, "capacity")
        )),
        "{}",
        out.describe()
    );
    assert!(!cfg.socket.exists(), "a check left a control socket");
    let mut lock = cfg.socket.as_os_str().to_owned();
    lock.push(".lock");
    assert!(!Path::new(&lock).exists(), "a check left its lock file");
}

/// The preflight's checks of the EAL's memory, the open-file limit and the listen
/// addresses: each refused naming its field (without DPDK), while the default
/// loopback config passes; a listen address is let go after the check.
#[test]
fn each_resource_check_refuses_naming_its_field_and_the_loopback_config_passes() {
    require_root();
    let out = check(&[], &loopback_config().write());
    assert!(out.success(), "{}", out.describe());
    let said = format!("{}{}", out.stdout, out.stderr);
    assert!(
        said.contains("eal.memory_mb, PCI devices, open files, listen addresses"),
        "{}",
        out.describe()
    );

    // Two workers with 4096 RX and TX descriptors do not fit in 256 MB.
    let mut cfg = loopback_config();
    cfg.ports[0].settings = vec!["rx_desc = 4096".into(), "tx_desc = 4096".into()];
    cfg.workers = vec![1, 2];
    cfg.cpus = Some(vec![1, 1]);
    let path = cfg.write();
    let out = check(&[], &path);
    assert_eq!(out.status.code(), Some(1), "{}", out.describe());
    assert!(
        out.stderr.contains(&format!(
            "{}: eal.memory_mb = 256 cannot hold the mbuf pool: 65535 mbufs",
            written_at(&path, "memory_mb")
        )),
        "{}",
        out.describe()
    );
    assert_no_dpdk(&out);
    assert!(check(&["--file-only"], &path).success());

    // A hard open-file limit below the 83 the loopback config needs.
    let cfg = loopback_config();
    let path = cfg.write();
    let out = run_bounded(
        Command::new("prlimit")
            .args(["--nofile=64:64", "--", SLUICE, "--check-config"])
            .arg(&path),
        Duration::from_secs(10),
    );
    assert_eq!(out.status.code(), Some(1), "{}", out.describe());
    assert!(
        out.stderr.contains(
            "the open-file limit (RLIMIT_NOFILE) is 64, but this config needs about 83 \
             descriptors"
        ),
        "{}",
        out.describe()
    );

    // A metrics address in use; once free, the check passes.
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = held.local_addr().unwrap();
    let mut cfg = loopback_config();
    cfg.metrics = Some(addr.to_string());
    let path = cfg.write();
    let out = check(&[], &path);
    assert_eq!(out.status.code(), Some(1), "{}", out.describe());
    assert!(
        out.stderr.contains(&format!(
            "{}: control.metrics: cannot listen on {addr}: Address already in use",
            written_at(&path, "metrics")
        )),
        "{}",
        out.describe()
    );
    drop(held);
    let out = check(&[], &path);
    assert!(out.success(), "{}", out.describe());
}

/// `[sync] key_file`: the key in a file of its own, which only its owner may read
/// (refused naming the field and the fix otherwise); a key written in a config every
/// user may read (`[sync]`'s or `[vrrp]`'s) is accepted with a warning naming
/// `key_file`.
#[test]
fn a_sync_key_file_others_can_read_is_refused_and_a_readable_inline_key_is_warned_of() {
    use std::os::unix::fs::PermissionsExt;
    const HEX: &str = "000102030405060708090a0b0c0d0e0f";
    let sync = |key: &str| {
        let mut cfg = loopback_config();
        cfg.extra_toml.push(format!(
            "[sync]\nlisten = \"198.18.0.1:8848\"\npeers = [\"198.18.0.2:8848\"]\n{key}\n"
        ));
        cfg
    };
    let mode = |path: &Path, mode: u32| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    // Relative to the config's directory.
    let cfg = sync("key_file = \"sync.key\"");
    let key = cfg.path("sync.key");
    std::fs::write(&key, format!("{HEX}\n")).unwrap();
    let path = cfg.write();
    mode(&path, 0o644);
    for (key_mode, refused) in [(0o644, true), (0o640, true), (0o600, false), (0o400, false)] {
        mode(&key, key_mode);
        let out = check(&["--file-only"], &path);
        if refused {
            assert_eq!(
                out.status.code(),
                Some(1),
                "{key_mode:o}: {}",
                out.describe()
            );
            let want = format!(
                "{}: sync.key_file: {} has mode {key_mode:04o}: users besides its owner could \
                 read or change the key (run `chmod 600 {}`)",
                written_at(&path, "key_file"),
                key.display(),
                key.display()
            );
            assert!(out.stderr.contains(&want), "{want}\n{}", out.describe());
        } else {
            assert!(out.success(), "{key_mode:o}: {}", out.describe());
            assert!(!out.stdout.contains("warning"), "{}", out.describe());
        }
    }
    // Owned by another user (who could change it), even at 0600.
    std::os::unix::fs::chown(&key, Some(65534), None).unwrap();
    let out = check(&["--file-only"], &path);
    assert!(
        out.stderr.contains("sync.key_file")
            && out
                .stderr
                .contains("is owned by uid 65534: only root or this process's user"),
        "{}",
        out.describe()
    );
    std::os::unix::fs::chown(&key, Some(0), None).unwrap();
    std::fs::write(&key, "not hex\n").unwrap();
    let out = check(&["--file-only"], &path);
    assert!(
        out.stderr.contains("sync.key_file") && out.stderr.contains("hex"),
        "{}",
        out.describe()
    );
    std::fs::remove_file(&key).unwrap();
    let out = check(&["--file-only"], &path);
    assert!(
        out.stderr.contains("sync.key_file") && out.stderr.contains("cannot read"),
        "{}",
        out.describe()
    );

    // The key in the config itself: fine while only its owner and group may read it.
    let cfg = sync(&format!("key = \"{HEX}\""));
    let path = cfg.write();
    mode(&path, 0o640);
    let out = check(&["--file-only"], &path);
    assert!(
        out.success() && !out.stdout.contains("warning"),
        "{}",
        out.describe()
    );
    mode(&path, 0o644);
    let out = check(&["--file-only"], &path);
    assert!(out.success(), "{}", out.describe());
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert!(
        lines.len() == 2
            && lines[0].ends_with("; machine resources not checked")
            && lines[1].starts_with(&format!(
                "sluice: warning: {}: [sync] key is readable by every user (mode 0644)",
                path.display()
            ))
            && lines[1].contains("`key_file`"),
        "{}",
        out.describe()
    );
    // A VRRP key written in the config too: both named in the one warning.
    let mut cfg = sync(&format!("key = \"{HEX}\""));
    cfg.extra_toml.push(format!(
        "[vrrp]\nvrid = 51\npeers = [\"198.18.0.2\"]\nkey = \"{HEX}\"\n"
    ));
    let path = cfg.write();
    mode(&path, 0o644);
    let out = check(&["--file-only"], &path);
    assert!(
        out.success()
            && out.stdout.contains(&format!(
                "sluice: warning: {}: [sync] key and [vrrp] key are readable by every user (mode 0644)",
                path.display()
            )),
        "{}",
        out.describe()
    );
}

/// A control socket in a directory other users may write is warned of (they could
/// replace the socket, or with the sticky bit take the lock's name); an owner-only
/// directory is not.
#[test]
fn a_control_socket_directory_others_may_write_is_warned_of() {
    use std::os::unix::fs::PermissionsExt;
    let cfg = loopback_config();
    let path = cfg.write();
    let dir = cfg.socket.parent().unwrap().to_path_buf();
    let chmod =
        |mode: u32| std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode)).unwrap();
    chmod(0o700);
    let out = check(&["--file-only"], &path);
    assert!(
        out.success() && !out.stdout.contains("warning"),
        "{}",
        out.describe()
    );
    chmod(0o1777);
    let out = check(&["--file-only"], &path);
    chmod(0o700);
    assert!(
        out.success()
            && out.stdout.contains(&format!(
                "sluice: warning: {}: control.socket: its directory {} is writable by other \
                 users (mode 1777): they can take the names beside the socket",
                path.display(),
                dir.display()
            )),
        "{}",
        out.describe()
    );
}

/// TCP 198.18.1.1:80, rr, with `servers` (address, port, weight, mode).
fn one_rr_service(servers: &[(&str, u16, u32, &str)]) -> String {
    service_section("tcp", "198.18.1.1", 80, "rr", &[], servers)
}

/// The workers count real servers in 65,535 slots: a config with one more is refused
/// at the real server that does not fit, by file, line and field.
#[test]
fn a_config_with_more_real_servers_than_ids_is_refused_at_the_one_too_many() {
    let mut cfg = loopback_config();
    // Two addresses (NAT, ports 1 to 32768 each): the neighbour tables have room.
    let servers: Vec<(&str, u16, u32, &str)> = ["10.0.0.1", "10.0.0.2"]
        .iter()
        .flat_map(|a| (1..=32_768).map(move |port| (*a, port, 1, "nat")))
        .collect();
    cfg.extra_toml = vec![one_rr_service(&servers)];
    let path = cfg.write();
    let out = check(&["--file-only"], &path);
    assert_eq!(out.status.code(), Some(1), "{}", out.describe());
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let line = 1
        + (0..lines.len())
            .rev()
            .find(|&i| lines[i].trim() == "ip = \"10.0.0.2\"")
            .expect("the last real server's line");
    let want = format!(
        "sluice: {}:{line}:8: services[0].real_servers[65535].ip: too many real servers: at most \
         65535 real and sorry servers at once",
        path.display()
    );
    assert!(
        out.stderr.lines().next().unwrap_or("").starts_with(&want),
        "want {want}\n{}",
        out.describe()
    );
    assert_no_dpdk(&out);
}

/// Every worker keeps a neighbour entry for each distinct real-server address:
/// 3073 addresses do not fit the default tables (4096 entries, three quarters for
/// real servers) and are refused at the one too many, naming the key; with
/// `[sessions] neighbours = 8192` the same file passes.
#[test]
fn more_real_server_addresses_than_the_neighbour_tables_hold_are_refused() {
    let addresses: Vec<String> = (0..3073u32)
        .map(|i| std::net::Ipv4Addr::from(0x0a00_0001 + i).to_string())
        .collect();
    let servers: Vec<(&str, u16, u32, &str)> = addresses
        .iter()
        .map(|a| (a.as_str(), 80, 1, "dr"))
        .collect();
    let config = |extra: Option<&str>| {
        let mut cfg = loopback_config();
        cfg.extra_toml = extra.map(String::from).into_iter().collect();
        cfg.extra_toml.push(one_rr_service(&servers));
        // The directory goes with the config: keep both.
        let path = cfg.write();
        (cfg, path)
    };
    let (_cfg, path) = config(None);
    let out = check(&["--file-only"], &path);
    assert_eq!(out.status.code(), Some(1), "{}", out.describe());
    let first = out.stderr.lines().next().unwrap_or("").to_string();
    let text = std::fs::read_to_string(&path).unwrap();
    let line = 1 + text
        .lines()
        .position(|l| l.trim() == "ip = \"10.0.12.1\"")
        .expect("the 3073rd real server's line");
    let want = format!(
        "sluice: {}:{line}:8: services[0].real_servers[3072].ip: real server address \
         10.0.12.1: the workers' neighbour tables are sized for 3072 distinct IPv4 real and \
         sorry server addresses, all in use (three quarters of [sessions] neighbours; raise \
         it, a restart)",
        path.display()
    );
    assert_eq!(first, want, "{}", out.describe());
    let (_raised, path) = config(Some("[sessions]\nneighbours = 8192\n"));
    let out = check(&["--file-only"], &path);
    assert!(out.success(), "{}", out.describe());
}

/// An `mh` service with more real servers than its Maglev table has slots is refused
/// by file, line and field (its `mh_table_size`): past the last slot a server would
/// never get a connection.
#[test]
fn an_mh_service_with_more_real_servers_than_slots_is_refused() {
    let servers = [
        ("10.0.0.1", 80, 1, "dr"),
        ("10.0.0.2", 80, 1, "dr"),
        ("10.0.0.3", 80, 1, "dr"),
        ("10.0.0.4", 80, 1, "dr"),
    ];
    let config = |slots: u32| {
        let mut cfg = loopback_config();
        cfg.extra_toml = vec![service_section(
            "tcp",
            "198.18.1.1",
            80,
            "mh",
            &[format!("mh_table_size = {slots}")],
            &servers,
        )];
        let path = cfg.write();
        (cfg, path)
    };
    let (_cfg, path) = config(3);
    let out = check(&["--file-only"], &path);
    assert_eq!(out.status.code(), Some(1), "{}", out.describe());
    let text = std::fs::read_to_string(&path).unwrap();
    // The size is set once the service has its real servers: the key to change.
    let line = 1 + text
        .lines()
        .position(|l| l.trim() == "mh_table_size = 3")
        .expect("the mh_table_size line");
    let want = format!(
        "sluice: {}:{line}:17: services[0].mh_table_size: TCP 198.18.1.1:80: an mh table \
         of 3 slots cannot hold 4 real servers (each needs a slot; mh_table_size is a prime, \
         65537 by default, and spreads weights finely only when it is many times the number \
         of real servers)",
        path.display()
    );
    let first = out.stderr.lines().next().unwrap_or("");
    assert_eq!(first, want, "{}", out.describe());
    let (_cfg, path) = config(5);
    let out = check(&["--file-only"], &path);
    assert!(out.success(), "{}", out.describe());
}

#[test]
fn a_missing_file_and_bad_usage_are_refused() {
    let out = check(&[], Path::new("/nonexistent/sluice.toml"));
    assert_eq!(out.status.code(), Some(1), "{}", out.describe());
    assert!(
        out.stderr
            .starts_with("sluice: /nonexistent/sluice.toml: cannot read"),
        "{}",
        out.describe()
    );
    for args in [
        &["--check-config"][..],
        &["--file-only", "--config", "x.toml"][..],
        &["--check-config", "x.toml", "--config", "y.toml"][..],
    ] {
        let out = run_bounded(Command::new(SLUICE).args(args), Duration::from_secs(10));
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", out.describe());
    }
}

/// The 2 MiB `nr_hugepages` file, restored to what it held on drop.
struct HugepagesRestored {
    file: PathBuf,
    was: String,
}

impl Drop for HugepagesRestored {
    fn drop(&mut self) {
        let _ = std::fs::write(&self.file, &self.was);
    }
}

/// `sluice --prepare` (the unit's ExecStartPre) makes a hugepage config that the check
/// refuses into one it accepts: it reserves the pages eal.memory_mb needs beyond those
/// free and mounts hugetlbfs (in a private mount namespace here, so that the mount
/// ends with the test; the pages are given back on drop). A second run finds nothing
/// to do.
#[test]
fn prepare_reserves_the_hugepages_the_check_wanted() {
    require_root();
    let dir = Path::new("/sys/kernel/mm/hugepages/hugepages-2048kB");
    let number = |f: &str| -> u64 {
        std::fs::read_to_string(dir.join(f))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    let _restore = HugepagesRestored {
        file: dir.join("nr_hugepages"),
        was: std::fs::read_to_string(dir.join("nr_hugepages")).unwrap(),
    };
    // 4 MiB more than is free now, and at least the 64 MiB that hold the loopback
    // config's mbuf pool on hugepages (the check refuses less).
    let memory_mb = (number("free_hugepages") * 2).max(60) + 4;
    let mut cfg = loopback_config();
    cfg.hugepages_mb = Some(memory_mb as u32);
    let path = cfg.write();
    let before = check(&["--file-only"], &path);
    assert!(before.success(), "{}", before.describe());
    let before = check(&[], &path);
    assert_eq!(before.status.code(), Some(1), "{}", before.describe());
    assert!(
        before.stderr.contains("eal.memory_mb"),
        "{}",
        before.describe()
    );

    let script = format!(
        "{SLUICE} --prepare {p} && grep -c hugetlbfs /proc/mounts && \
         {SLUICE} --check-config {p} && {SLUICE} --prepare {p}",
        p = path.display()
    );
    let out = run_bounded(
        Command::new("unshare").args(["--mount", "--propagation", "private", "sh", "-c", &script]),
        Duration::from_secs(30),
    );
    assert!(out.success(), "{}", out.describe());
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert!(lines[0].contains("nr_hugepages now "), "{}", out.describe());
    assert!(
        out.stdout.contains("configuration valid"),
        "{}",
        out.describe()
    );
    assert!(
        lines.last().unwrap().contains("needs no more"),
        "{}",
        out.describe()
    );
    assert!(number("free_hugepages") * 2 >= memory_mb);
}
