//! The daemon's life cycle: clean exit on SIGTERM and SIGINT (exit 0, no DPDK runtime
//! directory, no control socket left), and at the end of `--duration` with stdout a
//! pipe nobody reads, exit 1 with `file:line:col` on a bad config,
//! exit 1 with a one-line message and no leftovers on a start-up failure, exit 2 on
//! bad usage, and a test bed that leaves no namespace behind after `down`.
//!
//! Run: `cargo test --release --test integration daemon_lifecycle::` (as root).

use crate::common::*;
use std::process::Command;
use std::time::{Duration, Instant};

const OUR_MAC: &str = "02:53:4c:00:00:01";

/// A loopback-mode daemon: one in-process port with the built-in peer emulator (two
/// peers that ARP and ping the appliance).
fn loopback_config() -> DaemonConfig {
    let mut cfg = DaemonConfig::new(vec![PortSpec::loopback(
        "lan0",
        OUR_MAC,
        &["198.18.0.1/24"],
    )]);
    // Pings every 20 ms; ARP refreshes every 16th round (320 ms), so both counters
    // move within a second.
    cfg.loopback = vec!["peers = 2".into(), "ping_interval_ms = 20".into()];
    cfg
}

/// Starts a loopback daemon, checks it really answers (ARP and echo replies grow over
/// at least a second), stops it with `sig` and checks it cleaned up after itself.
fn runs_then_stops_cleanly_on(sig: libc::c_int) {
    require_root();
    let mut daemon = Daemon::start(loopback_config());
    let prefix = daemon.config.file_prefix.clone();
    assert!(
        daemon.socket().exists(),
        "control socket missing while running"
    );
    // The runtime directory exists while DPDK runs, so its absence later means
    // something (and the path checked is the right one).
    assert!(
        !dpdk_runtime_dirs(&prefix).is_empty(),
        "no DPDK runtime directory /var/run/dpdk/{prefix} while running"
    );

    let first = daemon.status();
    let (arp0, icmp0) = (
        event_count(&first, "arp_replied"),
        event_count(&first, "icmp_echo_replied"),
    );
    let started = Instant::now();
    let grown = wait_for(Duration::from_secs(5), Duration::from_millis(100), || {
        let s = daemon.status();
        let grew = event_count(&s, "arp_replied") > arp0 && event_count(&s, "icmp_echo_replied") > icmp0;
        (grew && started.elapsed() >= Duration::from_secs(1)).then_some(s)
    })
    .unwrap_or_else(|| {
        panic!(
            "arp_replied / icmp_echo_replied did not grow from {arp0} / {icmp0} within 5 s: {:#}\n{}",
            daemon.status(),
            daemon.dump()
        )
    });
    assert!(port_counter(&grown, "lan0", "rx_packets") > 0, "{grown:#}");
    assert!(port_counter(&grown, "lan0", "tx_packets") > 0, "{grown:#}");

    let t = Instant::now();
    let status = daemon.stop_with(sig);
    assert!(
        status.success(),
        "sluice exited with {status} after signal {sig} (expected 0)\n{}",
        daemon.dump()
    );
    assert!(t.elapsed() <= EXIT_TIMEOUT, "exit took {:?}", t.elapsed());
    let left = dpdk_runtime_dirs(&prefix);
    assert!(
        left.is_empty(),
        "DPDK runtime directory left behind: {left:?}"
    );
    assert!(
        !daemon.socket().exists(),
        "control socket {} left behind",
        daemon.socket().display()
    );
}

#[test]
fn sigterm_exits_zero_and_cleans_up() {
    runs_then_stops_cleanly_on(libc::SIGTERM);
}

#[test]
fn sigint_exits_zero_and_cleans_up() {
    runs_then_stops_cleanly_on(libc::SIGINT);
}

/// Statistics printed to a pipe whose reader is gone (`sluice ... | head`): the
/// printing stops with a warning, the daemon goes on to its `--duration` and exits 0,
/// and leaves no lock, socket or DPDK runtime directory behind.
#[test]
fn a_closed_stdout_stops_the_statistics_not_the_daemon() {
    require_root();
    let mut cfg = loopback_config();
    cfg.args = ["--duration", "3", "--stats-interval", "50"]
        .map(String::from)
        .to_vec();
    let mut daemon = Daemon::spawn_with_stdout_closed(cfg);
    let prefix = daemon.config.file_prefix.clone();
    let mut lock = daemon.socket().as_os_str().to_owned();
    lock.push(".lock");
    let status = daemon
        .wait_exit(Duration::from_secs(3) + READY_TIMEOUT + EXIT_TIMEOUT)
        .unwrap_or_else(|| panic!("sluice did not exit by itself\n{}", daemon.dump()));
    let stderr = daemon.stderr_text();
    assert!(
        status.success(),
        "sluice exited with {status}\n{}",
        daemon.dump()
    );
    assert!(!stderr.contains("panicked"), "{}", daemon.dump());
    assert!(
        stderr.contains("statistics are no longer printed"),
        "{}",
        daemon.dump()
    );
    assert!(stderr.contains("duration elapsed"), "{}", daemon.dump());
    assert!(
        !std::path::Path::new(&lock).exists(),
        "lock file left behind"
    );
    assert!(!daemon.socket().exists(), "control socket left behind");
    let left = dpdk_runtime_dirs(&prefix);
    assert!(
        left.is_empty(),
        "DPDK runtime directory left behind: {left:?}"
    );
}

#[test]
fn testbed_down_leaves_no_namespace() {
    require_root();
    let mut bed = Testbed::up(1);
    let name = bed.name.clone();
    let all = bed.namespaces_left();
    assert_eq!(all.len(), 4, "sw, lb, c, rs1 expected: {all:?}");

    // e2e style: Sluice in the appliance namespace, answering the client.
    let cfg = DaemonConfig::new(vec![PortSpec::vdev(
        "lan0",
        &format!("net_af_packet0,iface={}", bed.lb_if()),
        &["198.18.0.1/24"],
    )])
    .in_netns(bed.lb_ns());
    let mut daemon = Daemon::start(cfg);
    let client = bed.client_ns().to_string();
    let ping = bed.exec(
        &client,
        &[
            "ping",
            "-n",
            "-c",
            "2",
            "-W",
            "1",
            "-i",
            "0.2",
            "198.18.0.1",
        ],
        Duration::from_secs(20),
    );
    assert!(
        ping.success(),
        "ping: {}\n{}",
        ping.describe(),
        daemon.dump()
    );
    let status = daemon.terminate();
    assert!(
        status.success(),
        "sluice exited with {status}\n{}",
        daemon.dump()
    );

    let down = bed.down();
    assert!(down.success(), "testbed down: {}", down.describe());
    let left = namespaces_named(&name);
    assert!(left.is_empty(), "namespaces left after down: {left:?}");
    let links = run_bounded(
        Command::new("ip").args(["-o", "link", "show"]),
        Duration::from_secs(10),
    )
    .expect_success("ip link show");
    assert!(
        !links.stdout.contains(&format!("{name}-")),
        "interfaces of {name} in the root namespace:\n{}",
        links.stdout
    );
    // A second down of the same name is harmless.
    assert!(bed.down().success());
}

#[test]
fn testbed_down_stops_a_daemon_left_running_and_removes_everything() {
    require_root();
    let mut bed = Testbed::up(0);
    let name = bed.name.clone();
    let cfg = DaemonConfig::new(vec![PortSpec::vdev(
        "lan0",
        &format!("net_af_packet0,iface={}", bed.lb_if()),
        &["198.18.0.1/24"],
    )])
    .in_netns(bed.lb_ns());
    let mut daemon = Daemon::start(cfg);
    // As after a crashed test: the daemon is still running when the bed goes down.
    let down = bed.down();
    assert!(down.success(), "testbed down: {}", down.describe());
    assert!(
        namespaces_named(&name).is_empty(),
        "namespaces left: {:?}",
        namespaces_named(&name)
    );
    let exit = daemon.wait_exit(EXIT_TIMEOUT);
    assert!(
        exit.is_some(),
        "sluice still running after testbed down\n{}",
        daemon.dump()
    );
    // `down` sends SIGTERM first, so the daemon shut down cleanly.
    assert!(
        exit.unwrap().success(),
        "sluice exited with {exit:?}\n{}",
        daemon.dump()
    );
}

#[test]
fn bad_config_exits_one_with_file_line_col() {
    require_root();
    let cfg = loopback_config();
    let path = cfg.write();
    // Replace `memory_mb = 256` (line 3 of the generated file) by a string.
    let text = std::fs::read_to_string(&path).unwrap();
    let line = text
        .lines()
        .position(|l| l.starts_with("memory_mb"))
        .unwrap()
        + 1;
    std::fs::write(
        &path,
        text.replace("memory_mb = 256", "memory_mb = \"lots\""),
    )
    .unwrap();

    let out = run_bounded(
        Command::new(SLUICE).arg("--config").arg(&path),
        Duration::from_secs(20),
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "expected exit 1: {}",
        out.describe()
    );
    let want = format!("sluice: {}:{line}:", path.display());
    let msg = out
        .stderr
        .lines()
        .find(|l| l.starts_with(&want))
        .unwrap_or_else(|| {
            panic!(
                "no line starting with {want:?} in stderr: {}",
                out.describe()
            )
        });
    // `<file>:<line>:<col>: <field>: <message>`
    let rest = &msg[want.len()..];
    let (col, rest) = rest.split_once(": ").unwrap_or(("", ""));
    assert!(
        col.parse::<u32>().is_ok_and(|c| c >= 1),
        "no column in {msg:?}"
    );
    assert!(
        rest.contains("memory_mb"),
        "the field is not named in {msg:?}"
    );
    assert!(
        dpdk_runtime_dirs(&cfg.file_prefix).is_empty(),
        "DPDK runtime dir left behind"
    );
    assert!(!cfg.socket.exists(), "control socket left behind");
}

#[test]
fn startup_failure_exits_one_without_leftovers() {
    require_root();
    // A valid config whose device cannot be opened: the failure comes after (or
    // during) EAL initialisation, so the error path has to clean up.
    let cfg = DaemonConfig::new(vec![PortSpec::vdev(
        "lan0",
        "net_af_packet0,iface=sl-nosuchif0",
        &["198.18.0.1/24"],
    )]);
    let path = cfg.write();
    let out = run_bounded(
        Command::new(SLUICE).arg("--config").arg(&path),
        Duration::from_secs(30),
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "expected exit 1: {}",
        out.describe()
    );
    let errors: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.starts_with("sluice: "))
        .collect();
    assert_eq!(
        errors.len(),
        1,
        "expected one `sluice: ...` error line: {}",
        out.describe()
    );
    let left = dpdk_runtime_dirs(&cfg.file_prefix);
    assert!(
        left.is_empty(),
        "DPDK runtime directory left behind: {left:?}\n{}",
        out.describe()
    );
    assert!(!cfg.socket.exists(), "control socket left behind");
}

/// The limits a device reports once the EAL has probed it, met before the port is
/// configured: more workers than an af_packet device has queue pairs is refused
/// naming the field, with nothing left behind.
#[test]
fn a_device_limit_is_refused_naming_the_field() {
    require_root();
    let mut bed = Testbed::up(0);
    let mut cfg = DaemonConfig::new(vec![PortSpec::vdev(
        "lan0",
        &format!("net_af_packet0,iface={},qpairs=1", bed.lb_if()),
        &["198.18.0.1/24"],
    )]);
    cfg.workers = vec![1, 2];
    cfg.cpus = Some(vec![1, 1]);
    // Started in the bed's namespace: exit 1, nothing left behind; the config's path
    // and the run's output for the message.
    let refused = |cfg: &DaemonConfig| {
        let path = cfg.write();
        let out = run_bounded(
            Command::new("ip")
                .args(["netns", "exec", bed.lb_ns(), SLUICE, "--config"])
                .arg(&path),
            Duration::from_secs(30),
        );
        assert_eq!(out.status.code(), Some(1), "{}", out.describe());
        assert!(
            dpdk_runtime_dirs(&cfg.file_prefix).is_empty(),
            "DPDK runtime dir left behind"
        );
        (path, out)
    };
    let (path, out) = refused(&cfg);
    let want = format!(
        "{}: lcores.workers: 2 workers need 2 RX and TX queues on port \"lan0\", whose \
         device (net_af_packet) has at most 1 RX and 1 TX queues",
        written_at(&path, "workers")
    );
    assert!(
        out.stderr.contains(&want),
        "{}\nwanted {want}",
        out.describe()
    );

    // An MTU beyond the device's largest frame (net_af_packet: 1518 bytes), which
    // `rte_eth_dev_set_mtu` would refuse with EINVAL at start.
    let mut cfg = DaemonConfig::new(vec![PortSpec::vdev(
        "lan0",
        &format!("net_af_packet0,iface={}", bed.lb_if()),
        &["198.18.0.1/24"],
    )]);
    cfg.ports[0].settings.push("mtu = 9000".into());
    let (path, out) = refused(&cfg);
    let want = format!(
        "{}: ports[0].mtu: 9000 is outside what the device of port \"lan0\" \
         (net_af_packet) takes,",
        written_at(&path, "mtu")
    );
    assert!(
        out.stderr.contains(&want) && out.stderr.contains(" to 1500"),
        "{}\nwanted {want} ... to 1500",
        out.describe()
    );
    assert!(bed.down().success());
}

#[test]
fn bad_usage_exits_two() {
    for args in [
        &["--bogus"][..],
        &[][..],
        &["--config"][..],
        &["--config", "/x", "--duration", "-1"][..],
    ] {
        let out = run_bounded(Command::new(SLUICE).args(args), Duration::from_secs(10));
        assert_eq!(
            out.status.code(),
            Some(2),
            "sluice {args:?}: {}",
            out.describe()
        );
        assert!(
            out.stderr.contains("usage"),
            "sluice {args:?}: no usage on stderr: {}",
            out.describe()
        );
    }
}

/// Each thread of process `pid`: (name, `Cpus_allowed_list` from its status file).
fn thread_cpus(pid: i32) -> Vec<(String, String)> {
    let mut threads = Vec::new();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let dir = task.unwrap().path();
        let (Ok(name), Ok(status)) = (
            std::fs::read_to_string(dir.join("comm")),
            std::fs::read_to_string(dir.join("status")),
        ) else {
            continue; // a thread that ended meanwhile
        };
        let cpus = status
            .lines()
            .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
            .unwrap_or_else(|| panic!("no Cpus_allowed_list in {}", dir.display()));
        threads.push((name.trim().to_string(), cpus.trim().to_string()));
    }
    threads
}

/// The CPUs of a `Cpus_allowed_list` (`0-3,6`).
fn cpu_set(list: &str) -> Vec<u32> {
    let mut cpus = Vec::new();
    for part in list.split(',').filter(|p| !p.is_empty()) {
        let (first, last) = part.split_once('-').unwrap_or((part, part));
        cpus.extend(first.parse::<u32>().unwrap()..=last.parse::<u32>().unwrap());
    }
    cpus
}

/// Sluice's helper threads (control socket acceptor and executors, metrics endpoint,
/// peer emulator) go where DPDK puts its own control thread `eal-intr-thread`: on the
/// CPUs no lcore uses, or on the management lcore's when there is none. The judge is
/// DPDK's own placement, and the rule worked out here from this process's CPUs (the
/// daemon inherits them).
#[test]
fn helper_threads_run_where_dpdk_runs_its_control_threads() {
    require_root();
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let ours = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .map(|l| cpu_set(l.trim()))
        .unwrap();
    assert!(
        ours.contains(&0) && ours.contains(&1),
        "this test needs CPUs 0 and 1; it may use {ours:?}"
    );
    // Worker CPUs: lcore 1 mapped onto CPU 0 (CPU 1 left over), then on CPU 1.
    for (cpus, lcore_cpus) in [(Some(vec![0]), vec![0]), (None, vec![0, 1])] {
        let spare: Vec<u32> = ours
            .iter()
            .copied()
            .filter(|c| !lcore_cpus.contains(c))
            .collect();
        let want = if spare.is_empty() { vec![0] } else { spare };
        let mut cfg = loopback_config();
        cfg.cpus = cpus.clone();
        let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        cfg.metrics = Some(free.local_addr().unwrap().to_string());
        drop(free);
        let daemon = Daemon::start(cfg);
        let threads = thread_cpus(daemon.pid());
        let of = |name: &str| -> Vec<&str> {
            threads
                .iter()
                .filter(|(n, _)| n == name)
                .map(|(_, c)| c.as_str())
                .collect()
        };
        let context = format!("worker cpus {cpus:?}; threads {threads:?}");
        let [dpdk] = of("eal-intr-thread")[..] else {
            panic!("one eal-intr-thread expected; {context}")
        };
        let [main] = of("sluice")[..] else {
            panic!("one main thread expected; {context}")
        };
        assert_eq!(main, "0", "the management lcore is 0; {context}");
        assert_eq!(cpu_set(dpdk), want, "DPDK's own placement; {context}");
        // comm holds 15 bytes: "sluice-control-exec" reads "sluice-control-".
        for name in [
            "sluice-control",
            "sluice-control-",
            "sluice-metrics",
            "sluice-peers",
        ] {
            let found = of(name);
            assert!(!found.is_empty(), "no thread {name}; {context}");
            for cpus in found {
                assert_eq!(
                    cpus, dpdk,
                    "{name} is not where DPDK's control thread is; {context}"
                );
            }
        }
        daemon.stop_clean();
    }
}

/// Passive detection alone on a DR real server is warned of at start: it cannot see
/// the server's answers and never evicts it (a NAT server beside it is not named).
#[test]
fn passive_detection_alone_on_a_dr_real_server_is_warned_of() {
    require_root();
    let mut cfg = loopback_config();
    cfg.extra_toml = vec![
        "[health]\npassive = true\n".into(),
        service_section(
            "tcp",
            "198.18.1.1",
            80,
            "rr",
            &[],
            &[("198.18.0.2", 80, 1, "dr"), ("198.18.0.3", 8080, 1, "nat")],
        ),
    ];
    let daemon = Daemon::start(cfg);
    let warning = "is watched by passive detection alone, which cannot see a DR or TUN real \
                   server's answers";
    let seen = wait_for(Duration::from_secs(5), Duration::from_millis(50), || {
        daemon.stderr_text().contains(warning).then_some(())
    });
    let stderr = daemon.stderr_text();
    assert!(seen.is_some(), "{}", daemon.dump());
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains(warning)).collect();
    assert!(
        lines.len() == 1 && lines[0].contains("198.18.0.2:80 of "),
        "{lines:?}"
    );
    daemon.stop_clean();
}

/// Clients that pipeline changes from more connections than the control server has
/// executors keep its queue of requests from ever emptying, when each change takes
/// the loop longer than an executor takes to hand it the next (here a table of
/// 20,000 services, which each change copies and publishes). The management loop
/// must go on turning all the same (a turn answers requests for its budget, then runs
/// health checks, VRRP and sync), and answer them.
#[test]
fn pipelined_control_requests_leave_the_management_loop_turning() {
    require_root();
    let daemon = Daemon::start(loopback_config());
    let table: String = (0..20_000u32)
        .map(|i| format!("-A -t 198.19.{}.{}:80 -s rr\n", i / 250, i % 250))
        .collect();
    let restored = daemon.restore(&table);
    assert!(restored.success(), "{restored:?}");
    let flood = ControlFlood::start(
        daemon.socket(),
        6,
        std::net::Ipv4Addr::new(198, 18, 1, 10),
        80,
    );
    let management = |s: &serde_json::Value, field: &str| {
        s["management"][field]
            .as_u64()
            .unwrap_or_else(|| panic!("no management.{field} in {s:#}"))
    };
    std::thread::sleep(Duration::from_millis(300));
    let (first, t0) = (daemon.status(), Instant::now());
    std::thread::sleep(Duration::from_secs(2));
    let (last, t1) = (daemon.status(), Instant::now());
    let answered = flood.stop();
    let turns = management(&last, "turns") - management(&first, "turns");
    let requests = management(&last, "control_requests") - management(&first, "control_requests");
    let due = (t1 - t0).as_millis() as u64 / 5;
    eprintln!(
        "{turns} turns of {due} due, {requests} requests answered meanwhile ({answered} \
         to the clients in all), {} turns cut, longest turn {} us",
        management(&last, "control_turns_cut"),
        management(&last, "longest_turn_us")
    );
    // A turn at least every 100 ms: one per request answered is the bound's pace
    // (each takes about 12 ms here), none at all without it.
    assert!(
        turns >= 20,
        "{turns} management turns in {:?}, where {due} were due",
        t1 - t0
    );
    // The flood ran, and its requests held the queue: turns were cut short.
    assert!(requests >= 50, "{requests} requests answered");
    assert!(management(&last, "control_turns_cut") > 0, "{last:#}");
    daemon.stop_clean();
}
