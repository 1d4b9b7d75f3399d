//! Start-up checks made before the EAL (src/daemon/preflight.rs): a config this
//! machine cannot run (an mbuf pool beyond `eal.memory_mb`, an open-file limit below
//! its needs, a metrics or sync address it cannot bind), or a second instance on the
//! same socket or interface, is refused at once with exit 1, a message naming the
//! field, no DPDK output and nothing left behind; and what a started appliance
//! announces (gratuitous ARP) and leaves (no hugepage files).
//!
//! Run: `cargo test --release --test integration preflight::` (as root).

use crate::common::*;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const OUR_MAC: &str = "02:53:4c:00:00:01";

fn loopback_config() -> DaemonConfig {
    let mut cfg = DaemonConfig::new(vec![PortSpec::loopback(
        "lan0",
        OUR_MAC,
        &["198.18.0.1/24"],
    )]);
    cfg.loopback = vec!["peers = 1".into()];
    cfg
}

fn lock_of(socket: &Path) -> PathBuf {
    let mut p = socket.as_os_str().to_owned();
    p.push(".lock");
    PathBuf::from(p)
}

/// Spawns the daemon and expects a refusal: exit 1 within 5 s, the message's parts in
/// stderr, nothing from DPDK, and no runtime directory, socket or lock file left.
/// Returns stderr.
fn expect_refusal(config: DaemonConfig, parts: &[&str]) -> String {
    let started = Instant::now();
    let mut daemon = Daemon::spawn(config);
    let status = daemon.wait_exit(Duration::from_secs(5));
    let took = started.elapsed();
    let err = daemon.stderr_text();
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(1),
        "expected exit 1 within 5 s, got {status:?}\n{}",
        daemon.dump()
    );
    for part in parts {
        assert!(err.contains(part), "stderr lacks {part:?}:\n{err}");
    }
    assert!(
        !err.contains("EAL"),
        "DPDK started before the refusal:\n{err}"
    );
    let left = dpdk_runtime_dirs(&daemon.config.file_prefix);
    assert!(left.is_empty(), "DPDK runtime directory left: {left:?}");
    eprintln!("refused in {took:?}: {}", err.trim());
    err
}

#[test]
fn an_oversized_session_capacity_exits_1_naming_the_field_and_leaves_nothing() {
    require_root();
    // 5.4 GiB of tables per worker at the largest capacity: enough workers (sharing
    // CPU 1) that they cannot fit in what this machine has available.
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let available_kb: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemAvailable:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("MemAvailable in /proc/meminfo");
    let workers = (available_kb / (5 << 20) + 1).min(64) as u32;
    assert!(
        u64::from(workers) * (5 << 20) > available_kb,
        "this machine has too much memory for the test: {available_kb} kB"
    );
    let mut cfg = loopback_config();
    cfg.workers = (1..=workers).collect();
    cfg.cpus = Some(vec![1; workers as usize]);
    cfg.extra_toml = vec!["[sessions]\ncapacity = 67108864".into()];
    let socket = cfg.socket.clone();
    let at = written_at(&cfg.write(), "capacity");
    let err = expect_refusal(
        cfg,
        &[
            &format!("of session tables ({workers} worker(s) x "),
            "is available (MemAvailable in /proc/meminfo); lower sessions.capacity",
        ],
    );
    assert!(
        err.contains(&format!("{at}: sessions.capacity = 67108864 needs")),
        "{err}"
    );
    assert!(!socket.exists(), "control socket left");
    assert!(!lock_of(&socket).exists(), "socket lock left");
}

#[test]
fn a_worker_lcore_outside_the_machine_exits_1_naming_lcores_workers() {
    require_root();
    let cpus = std::thread::available_parallelism().unwrap().get() as u32;
    let mut cfg = loopback_config();
    cfg.workers = vec![cpus]; // one past the last CPU
    let socket = cfg.socket.clone();
    // `workers = [N]`: the value's first element is one past the `[`.
    let at = written_at(&cfg.write(), "workers");
    let err = expect_refusal(
        cfg,
        &[
            &format!("lcores.workers[0]: worker lcore {cpus} runs on CPU {cpus}"),
            "this process may run only on CPU(s) ",
        ],
    );
    let (file_line, column) = at.rsplit_once(':').unwrap();
    let element = format!("{file_line}:{}", column.parse::<usize>().unwrap() + 1);
    assert!(
        err.contains(&format!("{element}: lcores.workers[0]: ")),
        "{err}"
    );
    assert!(!socket.exists(), "control socket left");
}

#[test]
fn a_second_instance_on_the_same_socket_is_refused_before_the_eal() {
    require_root();
    let first = Daemon::start(loopback_config());
    let mut second = loopback_config();
    second.socket = first.socket().to_path_buf();
    let err = expect_refusal(
        second,
        &[
            &format!(
                "control.socket {} is held by another Sluice",
                first.socket().display()
            ),
            &format!(
                "pid {}, config {}",
                first.pid(),
                first.config_path.display()
            ),
        ],
    );
    assert!(err.contains(".lock)"), "{err}");
    // The first one is untouched.
    assert!(first.ctl(&["status"]).success(), "{}", first.dump());
    assert!(lock_of(first.socket()).exists());
}

#[test]
fn a_second_instance_on_the_same_interface_is_refused_before_the_eal() {
    require_root();
    let bed = Testbed::up(0);
    let port = || {
        PortSpec::vdev(
            "lan0",
            &format!("net_af_packet0,iface={}", bed.lb_if()),
            &[&format!("{}/24", bed.appliance_ip())],
        )
    };
    let mut first = Daemon::start(DaemonConfig::new(vec![port()]).in_netns(bed.lb_ns()));
    // Another socket and file prefix: only the interface is shared.
    let second = DaemonConfig::new(vec![port()]).in_netns(bed.lb_ns());
    expect_refusal(
        second,
        &[
            &format!(
                "port lan0: interface {} is held by another Sluice",
                bed.lb_if()
            ),
            &format!("pid {}", first.pid()),
        ],
    );
    let status = first.terminate();
    assert!(status.success(), "{}", first.dump());
    // Released at exit: a new instance attaches.
    let mut third = Daemon::start(DaemonConfig::new(vec![port()]).in_netns(bed.lb_ns()));
    assert!(third.terminate().success(), "{}", third.dump());
}

/// The client's neighbour entry for `ip`: its MAC, lower case, if it has one.
fn client_neighbour(bed: &Testbed, ip: &str) -> Option<String> {
    let out = bed
        .exec(
            bed.client_ns(),
            &["ip", "neigh", "show", ip, "dev", bed.client_if()],
            Duration::from_secs(10),
        )
        .expect_success("ip neigh show");
    let words: Vec<&str> = out.stdout.split_whitespace().collect();
    let at = words.iter().position(|w| *w == "lladdr")?;
    words.get(at + 1).map(|m| m.to_ascii_lowercase())
}

#[test]
fn at_start_gratuitous_arp_replaces_a_clients_stale_entries() {
    require_root();
    let bed = Testbed::up(1);
    let appliance_ip = bed.appliance_ip().to_string();
    let vip = "198.18.0.200";
    let stale = "02:de:ad:00:00:01";
    // Stale entries, as left by an earlier appliance with another MAC.
    for ip in [appliance_ip.as_str(), vip] {
        bed.exec(
            bed.client_ns(),
            &[
                "ip",
                "neigh",
                "replace",
                ip,
                "lladdr",
                stale,
                "dev",
                bed.client_if(),
                "nud",
                "stale",
            ],
            Duration::from_secs(10),
        )
        .expect_success("ip neigh replace");
        assert_eq!(client_neighbour(&bed, ip).as_deref(), Some(stale));
    }
    let mut cfg = DaemonConfig::new(vec![PortSpec::vdev(
        "lan0",
        &format!("net_af_packet0,iface={}", bed.lb_if()),
        &[&format!("{appliance_ip}/24")],
    )])
    .in_netns(bed.lb_ns());
    cfg.extra_toml = vec![format!(
        "[[services]]\nproto = \"tcp\"\nvip = \"{vip}\"\nport = 80\n\n\
         [[services.real_servers]]\nip = \"{}\"",
        bed.fact("RS1_IP")
    )];
    let daemon = Daemon::start(cfg);
    let ours = bed.lb_mac().to_ascii_lowercase();
    // Nothing from the client asks for these addresses. The appliance's own address
    // also appears as the sender of Sluice's ARP requests for the real server; the
    // VIP's only in an announcement.
    let learned = wait_for(Duration::from_secs(5), Duration::from_millis(100), || {
        let now = [appliance_ip.as_str(), vip].map(|ip| client_neighbour(&bed, ip));
        now.iter()
            .all(|m| m.as_deref() == Some(ours.as_str()))
            .then_some(now)
    });
    assert!(
        learned.is_some(),
        "client entries: {} -> {:?}, {vip} -> {:?} (ours {ours})\n{}",
        appliance_ip,
        client_neighbour(&bed, &appliance_ip),
        client_neighbour(&bed, vip),
        daemon.dump()
    );
    assert!(
        daemon
            .stderr_text()
            .contains("lan0: gratuitous ARP for 2 of 2 address(es)"),
        "{}",
        daemon.dump()
    );
}

/// Free 2 MiB hugepages and a hugetlbfs mount, when this machine has both.
fn hugepages_ready(pages: u64) -> bool {
    let free: u64 =
        std::fs::read_to_string("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
            .ok()
            .and_then(|t| t.trim().parse().ok())
            .unwrap_or(0);
    let mounted = std::fs::read_to_string("/proc/mounts")
        .map(|m| {
            m.lines()
                .any(|l| l.split_whitespace().nth(2) == Some("hugetlbfs"))
        })
        .unwrap_or(false);
    free >= pages && mounted
}

/// Hugepage files named after `prefix` in every hugetlbfs mount.
fn hugepage_files(prefix: &str) -> Vec<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    mounts
        .lines()
        .filter(|l| l.split_whitespace().nth(2) == Some("hugetlbfs"))
        .filter_map(|l| l.split_whitespace().nth(1))
        .flat_map(|dir| std::fs::read_dir(dir).into_iter().flatten().flatten())
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(prefix))
        })
        .collect()
}

#[test]
fn with_hugepages_no_hugepage_file_outlives_the_process() {
    require_root();
    if !hugepages_ready(32) {
        eprintln!(
            "no 32 free 2 MiB hugepages or no hugetlbfs mount: not run here \
             (the EAL arguments are checked by config::tests::example_baremetal)"
        );
        return;
    }
    let mut cfg = loopback_config();
    cfg.hugepages_mb = Some(64);
    let prefix = cfg.file_prefix.clone();
    let mut daemon = Daemon::start(cfg);
    assert!(
        daemon.stderr_text().contains("-m 64 --huge-unlink=always"),
        "{}",
        daemon.dump()
    );
    let running = hugepage_files(&prefix);
    assert!(
        running.is_empty(),
        "hugepage files while running: {running:?}"
    );
    assert!(daemon.terminate().success(), "{}", daemon.dump());
    let left = hugepage_files(&prefix);
    assert!(left.is_empty(), "hugepage files left: {left:?}");
}

/// A config whose pool outgrows its memory: two workers, 4096 RX and TX descriptors, without
/// hugepages.
fn large_rings_config(memory_mb: u32) -> DaemonConfig {
    let mut cfg = loopback_config();
    cfg.ports[0].settings = vec!["rx_desc = 4096".into(), "tx_desc = 4096".into()];
    cfg.workers = vec![1, 2];
    cfg.cpus = Some(vec![1, 1]);
    cfg.memory_mb = memory_mb;
    cfg
}

#[test]
fn an_mbuf_pool_beyond_eal_memory_mb_is_refused_and_the_figure_it_names_starts() {
    require_root();
    let cfg = large_rings_config(256);
    let file = written_at(&cfg.write(), "memory_mb");
    let err = expect_refusal(
        cfg,
        &[
            &format!("{file}: eal.memory_mb = 256 cannot hold the mbuf pool: 65535 mbufs"),
            "of 2368 bytes each take 258 MiB in 4 KiB pages without hugepages",
            "; set eal.memory_mb = ",
        ],
    );
    let smallest: u32 = err
        .split("set eal.memory_mb = ")
        .nth(1)
        .and_then(|rest| rest.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no figure in {err}"));
    assert!((258..=264).contains(&smallest), "{err}");
    // At the figure it names, rte_pktmbuf_pool_create finds the room: the daemon
    // starts and stops cleanly.
    let mut daemon = Daemon::start(large_rings_config(smallest));
    assert!(daemon.terminate().success(), "{}", daemon.dump());
}

/// `prlimit --nofile=SOFT:HARD` before sluice.
fn nofile(cfg: &mut DaemonConfig, soft: u32, hard: u32) {
    cfg.wrapper = vec![
        "prlimit".into(),
        format!("--nofile={soft}:{hard}"),
        "--".into(),
    ];
}

#[test]
fn an_open_file_limit_below_the_need_is_refused_and_a_low_soft_one_is_raised() {
    require_root();
    // The loopback config with one worker: 15 + 4 for its lcore + 64 while running.
    let mut cfg = loopback_config();
    nofile(&mut cfg, 82, 82);
    let file = cfg.path("sluice.toml").display().to_string();
    expect_refusal(
        cfg,
        &[
            &format!(
                "{file}: the open-file limit (RLIMIT_NOFILE) is 82, but this config needs \
                 about 83 descriptors"
            ),
            "LimitNOFILE=83 or more in the systemd unit (systemctl edit sluice)",
            "or ulimit -n 83 in the shell that starts sluice",
        ],
    );
    // A hard limit that is enough: the soft one is raised to it, and said so.
    let mut cfg = loopback_config();
    nofile(&mut cfg, 20, 83);
    let mut daemon = Daemon::start(cfg);
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", daemon.pid())).unwrap();
    let open_files = limits.lines().find(|l| l.starts_with("Max open files"));
    assert_eq!(
        open_files.map(|l| l.split_whitespace().skip(3).take(2).collect::<Vec<_>>()),
        Some(vec!["83", "83"]),
        "{limits}"
    );
    assert!(
        daemon
            .stderr_text()
            .contains("open-file limit raised from 20 to 83 (the hard limit)"),
        "{}",
        daemon.dump()
    );
    // At that limit control connections get 83 - 19 - 32 = 32 descriptors: a 33rd
    // connection is refused with an error line, not left to fail on EMFILE in the
    // backlog (nor to take a descriptor the daemon's own files need).
    assert!(
        daemon
            .stderr_text()
            .contains("control socket: at most 32 connections at once"),
        "{}",
        daemon.dump()
    );
    let held: Vec<std::os::unix::net::UnixStream> = (0..40)
        .map(|_| std::os::unix::net::UnixStream::connect(daemon.socket()).unwrap())
        .collect();
    let mut refused = 0;
    for mut stream in held.iter().skip(32) {
        stream
            .set_read_timeout(Some(Duration::from_secs(1)))
            .unwrap();
        let mut answer = String::new();
        let _ = std::io::Read::read_to_string(&mut stream, &mut answer);
        refused += usize::from(answer.contains("too many control connections (limit 32)"));
    }
    assert_eq!(refused, 8, "{}", daemon.dump());
    drop(held);
    assert!(daemon.terminate().success(), "{}", daemon.dump());
}

#[test]
fn a_metrics_port_in_use_is_refused_before_the_eal_naming_control_metrics() {
    require_root();
    let held = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = held.local_addr().unwrap();
    let mut cfg = loopback_config();
    cfg.metrics = Some(addr.to_string());
    let socket = cfg.socket.clone();
    let file = written_at(&cfg.write(), "metrics");
    let err = expect_refusal(
        cfg,
        &[&format!(
            "{file}: control.metrics: cannot listen on {addr}: Address already in use \
             (os error 98) (another process listens there)"
        )],
    );
    assert!(!err.contains("sluice up"), "{err}");
    assert!(!socket.exists(), "control socket left");
    assert!(!lock_of(&socket).exists(), "socket lock left");
    drop(held);
}

#[test]
fn a_sync_address_not_of_this_host_or_in_use_is_refused_naming_sync_listen() {
    require_root();
    let sync = |listen: &str| {
        let mut cfg = loopback_config();
        cfg.extra_toml = vec![format!(
            "[sync]\nlisten = \"{listen}\"\npeers = [\"192.0.2.2:8848\"]\nunauthenticated = true"
        )];
        cfg
    };
    // 192.0.2.1 (TEST-NET-1) is no address of this host.
    let cfg = sync("192.0.2.1:8848");
    let file = cfg.path("sluice.toml").display().to_string();
    expect_refusal(
        cfg,
        &[&format!(
            "{file}: sync.listen: cannot bind 192.0.2.1:8848: Cannot assign requested \
             address (os error 99) (not an address of this host)"
        )],
    );
    let held = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = held.local_addr().unwrap();
    let cfg = sync(&addr.to_string());
    let file = cfg.path("sluice.toml").display().to_string();
    expect_refusal(
        cfg,
        &[&format!(
            "{file}: sync.listen: cannot bind {addr}: Address already in use (os error 98)"
        )],
    );
}
