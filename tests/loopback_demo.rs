//! The README's demo, checked end to end: `sluice --config config/loopback.toml
//! --duration 3` (the file as shipped, with its own DPDK file prefix and control socket)
//! load-balances the emulated clients' connections over both emulated real servers,
//! and the emulator, which checks every frame it gets, saw nothing wrong. A second run
//! adds UDP, DR and TUN services to the same file to cover the emulator's other paths.
//!
//! A third run reloads an edited file under the demo's traffic, as `systemctl reload`
//! does.
//!
//! Run: `cargo test --release --test integration loopback_demo::` (as root).

use crate::common::*;
use std::time::{Duration, Instant};

/// How long each demo runs.
const DURATION_S: u64 = 3;

/// `config/loopback.toml` as a fixture config: the fixture writes `[eal]`, `[lcores]`
/// and `[control]` itself (with a unique file prefix and socket), so those sections are
/// checked to say what the fixture writes and dropped; everything else is kept verbatim,
/// followed by `extra`.
fn demo_config(extra: &str) -> DaemonConfig {
    let path = repo_root().join("config/loopback.toml");
    let text = std::fs::read_to_string(&path).expect("reading config/loopback.toml");
    for line in [
        "hugepages = false",
        "memory_mb = 256",
        "management = 0",
        "workers = [1]",
    ] {
        assert!(
            text.lines().any(|l| l.trim() == line),
            "config/loopback.toml no longer says `{line}`: update this test's fixture"
        );
    }
    let mut kept = String::new();
    let mut skipping = false;
    for line in text.lines() {
        let t = line.trim_start();
        if t.starts_with('[') {
            skipping = matches!(t, "[eal]" | "[lcores]" | "[control]");
        }
        if !skipping {
            kept.push_str(line);
            kept.push('\n');
        }
    }
    let mut cfg = DaemonConfig::new(Vec::new());
    cfg.extra_toml = vec![kept, extra.to_string()];
    cfg.args = vec!["--duration".into(), DURATION_S.to_string()];
    cfg
}

/// Starts the demo, polls `sluicectl -L -n --json` until the daemon exits by itself,
/// and returns the last listing and the daemon (exited, output complete).
fn run_demo(cfg: DaemonConfig) -> (serde_json::Value, Daemon) {
    let mut daemon = Daemon::start(cfg);
    let deadline = Instant::now() + Duration::from_secs(DURATION_S) + EXIT_TIMEOUT;
    let mut last = None;
    while daemon.try_exit().is_none() {
        assert!(
            Instant::now() < deadline,
            "sluice --duration {DURATION_S} still running\n{}",
            daemon.dump()
        );
        let out = daemon.ctl(&["--timeout", "1", "-L", "-n", "--json"]);
        if out.success() {
            let list: serde_json::Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| {
                panic!("-L -n --json printed invalid JSON ({e}): {}", out.stdout)
            });
            last = Some(list);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let status = daemon.wait_exit(EXIT_TIMEOUT).expect("exited");
    assert!(
        status.success(),
        "sluice exited with {status}\n{}",
        daemon.dump()
    );
    let list = last
        .unwrap_or_else(|| panic!("`sluicectl -L -n --json` never answered\n{}", daemon.dump()));
    (list, daemon)
}

/// The emulator's final summary: printed on its own after shutdown, from the line
/// starting `arp ` to the next blank line.
fn final_summary(stdout: &str) -> String {
    let lines: Vec<&str> = stdout.lines().collect();
    let start = lines
        .iter()
        .rposition(|l| l.starts_with("arp "))
        .unwrap_or_else(|| panic!("no final emulator summary in stdout:\n{stdout}"));
    lines[start..]
        .iter()
        .take_while(|l| !l.trim().is_empty())
        .map(|l| l.trim())
        .collect::<Vec<_>>()
        .join("\n")
}

/// The emulator's completed exchanges per real server of `service` (as in `TCP
/// 198.18.1.1:80`), from its summary line `TCP 198.18.1.1:80 -> a:p N, b:q M`.
fn served(summary: &str, service: &str) -> Vec<(String, u64)> {
    let prefix = format!("{service} -> ");
    let line = summary
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no line for {service} in:\n{summary}"));
    line[prefix.len()..]
        .split(", ")
        .map(|item| {
            let (server, count) = item.rsplit_once(' ').expect("`server count`");
            (server.to_string(), count.parse().expect("a count"))
        })
        .collect()
}

fn assert_near_equal(what: &str, counts: &[u64], context: &str) {
    let (min, max) = (*counts.iter().min().unwrap(), *counts.iter().max().unwrap());
    let total: u64 = counts.iter().sum();
    assert!(
        min > 0,
        "{what}: a real server got nothing: {counts:?}\n{context}"
    );
    // rr alternates exactly per worker; exchanges in flight at the reading or at stop
    // may leave one or two apart.
    assert!(
        max - min <= 2 + total / 20,
        "{what}: split not near-equal: {counts:?}\n{context}"
    );
}

#[test]
fn the_demo_balances_tcp_connections_over_both_real_servers() {
    require_root();
    let (list, daemon) = run_demo(demo_config(""));
    let context = format!("{list:#}\n{}", daemon.dump());

    // Sluice's view: sessions created per real server, and traffic both ways.
    let mut connections = Vec::new();
    for rip in ["198.18.0.2", "198.18.0.3"] {
        let rs = real_server(&list, "tcp", "198.18.1.1", 80, rip);
        let conns = rs_counter(rs, "connections");
        let (active, inactive) = (rs_counter(rs, "active"), rs_counter(rs, "inactive"));
        let (pin, pout) = (rs_counter(rs, "in_packets"), rs_counter(rs, "out_packets"));
        assert!(
            active + inactive <= conns,
            "{rip}: gauges above connections\n{context}"
        );
        assert!(
            pout > 0,
            "{rip}: no packets back from the real server\n{context}"
        );
        // NAT, per connection: SYN, ACK, request, FIN, ACK in; SYN-ACK, response, FIN-ACK out.
        assert!(pin >= pout, "{rip}: {pin} in, {pout} out\n{context}");
        connections.push(conns);
    }
    assert!(
        connections.iter().sum::<u64>() >= 20,
        "too few connections in {DURATION_S} s: {connections:?}\n{context}"
    );
    assert_near_equal("sluicectl connections", &connections, &context);

    // The emulator's view: nothing wrong, connections completed, the same spread.
    let summary = final_summary(&daemon.stdout_text());
    assert_eq!(number_after(&summary, "bad "), 0, "bad frames:\n{context}");
    let completed = number_after(&summary, "completed ");
    assert!(completed > 0, "no connection completed:\n{summary}");
    let spread = served(&summary, "TCP 198.18.1.1:80");
    let servers: Vec<&str> = spread.iter().map(|(s, _)| s.as_str()).collect();
    assert_eq!(servers, ["198.18.0.2:8080", "198.18.0.3:8080"]);
    let counts: Vec<u64> = spread.iter().map(|&(_, n)| n).collect();
    assert_eq!(counts.iter().sum::<u64>(), completed, "{summary}");
    assert_near_equal("emulator completions", &counts, &summary);
}

/// UDP through NAT, TCP through DR, TCP and UDP through TUN (one real server of its own,
/// not a peer), next to the demo's TCP NAT service.
const MORE_SERVICES: &str = r#"
[[services]]
proto = "udp"
vip = "198.18.1.1"
port = 53
scheduler = "rr"
  [[services.real_servers]]
  ip = "198.18.0.2"
  port = 5353
  mode = "nat"
  [[services.real_servers]]
  ip = "198.18.0.3"
  port = 5353
  mode = "nat"

[[services]]
proto = "tcp"
vip = "198.18.1.2"
port = 80
scheduler = "rr"
  [[services.real_servers]]
  ip = "198.18.0.4"
  port = 80
  mode = "dr"
  [[services.real_servers]]
  ip = "198.18.0.5"
  port = 80
  mode = "dr"

[[services]]
proto = "tcp"
vip = "198.18.1.3"
port = 80
scheduler = "rr"
  [[services.real_servers]]
  ip = "198.18.0.4"
  port = 80
  mode = "tun"
  [[services.real_servers]]
  ip = "198.18.0.20"
  port = 80
  mode = "tun"

[[services]]
proto = "udp"
vip = "198.18.1.3"
port = 80
scheduler = "rr"
  [[services.real_servers]]
  ip = "198.18.0.4"
  port = 80
  mode = "tun"
  [[services.real_servers]]
  ip = "198.18.0.20"
  port = 80
  mode = "tun"
"#;

#[test]
fn udp_dr_and_tun_services_are_served_too() {
    require_root();
    let (list, daemon) = run_demo(demo_config(MORE_SERVICES));
    let summary = final_summary(&daemon.stdout_text());
    let context = format!("{summary}\n{list:#}\n{}", daemon.dump());
    assert_eq!(number_after(&summary, "bad "), 0, "bad frames:\n{context}");
    assert!(number_after(&summary, "udp round trips ") > 0, "{context}");
    for service in [
        "TCP 198.18.1.1:80",
        "UDP 198.18.1.1:53",
        "TCP 198.18.1.2:80",
        "TCP 198.18.1.3:80",
        "UDP 198.18.1.3:80",
    ] {
        let counts: Vec<u64> = served(&summary, service).iter().map(|&(_, n)| n).collect();
        assert_eq!(counts.len(), 2, "{service}: {context}");
        assert_near_equal(service, &counts, &context);
    }
    // DR and TUN replies bypass Sluice: it sees the clients' packets only.
    for (vip, rip) in [("198.18.1.2", "198.18.0.4"), ("198.18.1.3", "198.18.0.20")] {
        let rs = real_server(&list, "tcp", vip, 80, rip);
        assert!(
            rs_counter(rs, "in_packets") > 0,
            "{vip} -> {rip}\n{context}"
        );
        assert_eq!(
            rs_counter(rs, "out_packets"),
            0,
            "{vip} -> {rip}\n{context}"
        );
    }
}

/// Every emulated real server answers health probes as a server with its port open
/// would (HTTP 200 on the real server's own port): with HTTP checks every 200 ms and
/// one failure evicting, no server of any mode is evicted and every service keeps both
/// servers. The UDP service on port 53 has no TCP listener behind it, so it is not
/// checked.
#[test]
fn health_checks_find_every_emulated_real_server_up() {
    require_root();
    let services = MORE_SERVICES.replacen(
        "port = 53\nscheduler = \"rr\"\n",
        "port = 53\nscheduler = \"rr\"\n  [services.health]\n  check = \"none\"\n",
        1,
    );
    assert_ne!(
        services, MORE_SERVICES,
        "MORE_SERVICES no longer has its UDP service on 53"
    );
    let health = "[health]\ncheck = \"http\"\ninterval_ms = 200\ntimeout_ms = 150\nfall = 1\n";
    let (list, daemon) = run_demo(demo_config(&format!("{services}\n{health}")));
    let summary = final_summary(&daemon.stdout_text());
    let context = format!("{summary}\n{list:#}\n{}", daemon.dump());
    assert_eq!(number_after(&summary, "bad "), 0, "bad frames:\n{context}");
    assert_eq!(
        number_after(&summary, "failed "),
        0,
        "failed exchanges:\n{context}"
    );
    // Six servers (two per TCP service) over about 3 s at 5 probes a second, each
    // answered twice (SYN-ACK, HTTP response): far more than 6 answers.
    assert!(
        number_after(&summary, "health probes answered ") >= 30,
        "too few probes answered:\n{context}"
    );
    let log = format!("{}{}", daemon.stdout_text(), daemon.stderr_text());
    assert!(
        !log.contains("lb=evict"),
        "a real server was evicted:\n{context}"
    );
    for service in [
        "TCP 198.18.1.1:80",
        "TCP 198.18.1.2:80",
        "TCP 198.18.1.3:80",
    ] {
        let counts: Vec<u64> = served(&summary, service).iter().map(|&(_, n)| n).collect();
        assert_eq!(counts.len(), 2, "{service}: {context}");
        assert_near_equal(service, &counts, &context);
    }
}

/// The connections Sluice has given `rip` of the demo's TCP service so far.
fn connections_to(daemon: &Daemon, rip: &str) -> u64 {
    rs_counter(
        real_server(&daemon.list_services(), "tcp", "198.18.1.1", 80, rip),
        "connections",
    )
}

/// Polls (at most 2 s) until the count of connections to `rip` stops growing for
/// 300 ms; returns the last count.
fn settled_connections_to(daemon: &Daemon, rip: &str) -> u64 {
    let mut last = connections_to(daemon, rip);
    let mut since = Instant::now();
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline && since.elapsed() < Duration::from_millis(300) {
        std::thread::sleep(Duration::from_millis(50));
        let now = connections_to(daemon, rip);
        if now != last {
            (last, since) = (now, Instant::now());
        }
    }
    last
}

/// What `systemctl reload sluice` does (the unit's ExecReload is `sluicectl reload`;
/// SIGHUP does the same), under the demo's traffic: the edited file drains a real
/// server (weight 0) then brings it back. Each change is visible at once (-L -n, and
/// no new connection to the drained server), and no session is lost: the emulator's
/// clients see no failed connection and no bad frame over the whole run.
#[test]
fn a_reload_under_traffic_applies_the_edited_file_and_loses_no_session() {
    require_root();
    let mut cfg = demo_config("");
    cfg.args = vec!["--duration".into(), "5".into()];
    let mut daemon = Daemon::start(cfg);
    let path = daemon.config_path.clone();
    let text = std::fs::read_to_string(&path).unwrap();
    let weight = "  weight = 2\n";
    assert_eq!(
        text.matches(weight).count(),
        1,
        "the demo's file changed:\n{text}"
    );
    std::thread::sleep(Duration::from_millis(700));
    assert!(
        connections_to(&daemon, "198.18.0.3") > 0,
        "{}",
        daemon.dump()
    );

    // Drain 198.18.0.3 through `sluicectl reload`.
    std::fs::write(&path, text.replace(weight, "  weight = 0\n")).unwrap();
    let out = daemon.ctl(&["reload"]);
    assert!(
        out.success() && out.stdout.starts_with("reloaded: 1 change(s)"),
        "{}\n{}",
        out.describe(),
        daemon.dump()
    );
    let rs = real_server(
        &daemon.list_services(),
        "tcp",
        "198.18.1.1",
        80,
        "198.18.0.3",
    )
    .clone();
    assert_eq!(rs_counter(&rs, "weight"), 0, "{rs}");
    // Connections already scheduled may still be counted; then nothing new.
    let drained = settled_connections_to(&daemon, "198.18.0.3");
    let to_other = connections_to(&daemon, "198.18.0.2");
    std::thread::sleep(Duration::from_millis(700));
    assert_eq!(
        connections_to(&daemon, "198.18.0.3"),
        drained,
        "new connections went to the drained server\n{}",
        daemon.dump()
    );
    assert!(
        connections_to(&daemon, "198.18.0.2") > to_other,
        "traffic stopped"
    );

    // Back to weight 2 through SIGHUP.
    std::fs::write(&path, &text).unwrap();
    daemon.signal(libc::SIGHUP);
    let back = wait_for(Duration::from_secs(3), Duration::from_millis(50), || {
        (connections_to(&daemon, "198.18.0.3") > drained).then_some(())
    });
    assert!(
        back.is_some(),
        "SIGHUP reload not applied\n{}",
        daemon.dump()
    );

    let status = daemon
        .wait_exit(Duration::from_secs(5) + EXIT_TIMEOUT)
        .expect("exited");
    assert!(status.success(), "{}", daemon.dump());
    let summary = final_summary(&daemon.stdout_text());
    assert_eq!(number_after(&summary, "bad "), 0, "bad frames:\n{summary}");
    assert!(number_after(&summary, "completed ") > 0, "{summary}");
    assert_eq!(
        number_after(&summary, " failed "),
        0,
        "connections lost across the reloads:\n{summary}\n{}",
        daemon.dump()
    );
}
