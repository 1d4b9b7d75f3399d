//! Tier 3, health checking end to end with real kernels: a NAT test bed
//! (client on its own subnet, real servers running `e2e_apps.py serve --http`), Sluice
//! probing the real servers from its own address (198.18.0.1, source ports
//! 61000-61999) with test-shortened timings, and curl from the client.
//!
//! 1. A dead server (process killed: its kernel refuses) is evicted within `fall *
//!    interval + timeout` (+ tolerance), gets no new connection while evicted, and is
//!    restored within `retry + rise * interval` (+ tolerance) of coming back.
//! 2. A server alive but unhealthy (its HTTP health path answers 500, its port open)
//!    is evicted by an HTTP check, while a TCP check of the same server (second
//!    service) keeps it: a TCP check cannot see it. Healthy again: restored.
//! 3. Passive detection alone: a server whose address is gone (SYNs unanswered) is
//!    evicted after `passive_fall` failed connections, the ones after go elsewhere,
//!    and it comes back after the back-off.
//! 4. Every server down: one `lb=alert ... reason=no-available-rs` per service, a fast
//!    RST from Sluice with `all_down = "rst"` (curl exit 7), silence with "drop"
//!    (curl exit 28); `lb=alert-clear` when one comes back.
//! 5. Healthy servers under load for 25 s with 100 ms probes (TCP and HTTP, fall 3):
//!    no eviction; every failed probe a timeout, at most 5 % of them.
//! 6. A sorry server (not probed): new connections reach it only while the service's
//!    only real server is evicted, and go back to the real server once it is
//!    restored, though the service is persistent (the one client's template changes
//!    sides with them); `-Ln` lists it only while in use (about 4 s).
//!
//! Timing tolerance: [`TOLERANCE`] on top of each bound covers the management loop's
//! tick (5 ms), the probes' jitter (at most interval / 20 each), the 20 ms polling of
//! `sluicectl health` and the `sluicectl` round trips on a shared 2-core machine.
//!
//! Run: `cargo test --release --test integration e2e_health:: -- --nocapture --test-threads 1` (as
//! root).

use crate::common::*;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const APPLIANCE: &str = "198.18.0.1";
const CLIENT: &str = "198.18.2.100/24";
const GATEWAY: &str = "198.18.2.1";
const VIP: &str = "198.18.1.1";
const HTTP_PORT: u16 = 8080;
/// Test-shortened check timings (milliseconds, counts).
const INTERVAL: u64 = 300;
const TIMEOUT: u64 = 200;
const FALL: u64 = 2;
const RISE: u64 = 2;
const RETRY: u64 = 1000;
/// Slack on every measured bound (see the module's doc).
const TOLERANCE: Duration = Duration::from_millis(250);
/// How often `sluicectl health --json` is polled while waiting for a change.
const POLL: Duration = Duration::from_millis(20);

fn svc(port: u16) -> String {
    format!("{VIP}:{port}/tcp")
}

/// The `[health]` section with the shortened timings and `extra` lines.
fn health_section(extra: &[&str]) -> String {
    let mut t = format!(
        "[health]\ninterval_ms = {INTERVAL}\ntimeout_ms = {TIMEOUT}\nfall = {FALL}\nrise = {RISE}\nretry_ms = {RETRY}\n"
    );
    for l in extra {
        t.push_str(l);
        t.push('\n');
    }
    t
}

/// A NAT lab with `n` real servers serving HTTP on [`HTTP_PORT`], with `extra(i)`
/// arguments for server `i`.
fn lab_with(n: u32, extra: impl Fn(u32) -> Vec<String>) -> AppLab {
    let mut lab = AppLab::new(n);
    lab.bed.configure("client-addr", &[CLIENT, GATEWAY]);
    lab.bed.configure("rs-gateway", &[APPLIANCE]);
    let http = format!("0.0.0.0:{HTTP_PORT}");
    lab.start_servers_with(&[("--http", &http)], extra);
    lab
}

fn daemon_for(lab: &AppLab, toml: String) -> Daemon {
    let daemon = lab.daemon(
        &[&format!("{APPLIANCE}/24"), &format!("{GATEWAY}/24")],
        toml,
    );
    lab.prewarm(&daemon, GATEWAY);
    daemon
}

/// The real servers of a lab as `service_section` wants them (weight 1, NAT).
fn rs_list(lab: &AppLab) -> Vec<(String, u16, u32, String)> {
    (1..=lab.bed.rs_count())
        .map(|i| {
            (
                lab.bed.rs_ip(i).to_string(),
                HTTP_PORT,
                1,
                "nat".to_string(),
            )
        })
        .collect()
}

fn service(port: u16, extra: &[String], rs: &[(String, u16, u32, String)]) -> String {
    let rs: Vec<(&str, u16, u32, &str)> = rs
        .iter()
        .map(|(ip, p, w, m)| (ip.as_str(), *p, *w, m.as_str()))
        .collect();
    service_section("tcp", VIP, port, "rr", extra, &rs)
}

/// Polls `sluicectl health --json` every [`POLL`] until `pred` holds, for at most
/// `timeout`; the time it took and the report that satisfied it.
fn wait_health(
    daemon: &Daemon,
    timeout: Duration,
    pred: impl Fn(&serde_json::Value) -> bool,
) -> Option<(Duration, serde_json::Value)> {
    let start = Instant::now();
    wait_for(timeout, POLL, || {
        let h = daemon.health();
        pred(&h).then(|| (start.elapsed(), h))
    })
}

fn evicted(h: &serde_json::Value, service: &str, ip: &str) -> bool {
    health_target(h, service, ip)["evicted"] == true
}

/// Every target probed at least once with the outcome "ok" and none evicted.
fn all_ok(h: &serde_json::Value) -> bool {
    let t = h["targets"].as_array().cloned().unwrap_or_default();
    !t.is_empty()
        && t.iter()
            .all(|t| t["last_outcome"] == "ok" && t["evicted"] == false)
}

/// Waits until every target is up and has been probed successfully.
fn wait_all_ok(daemon: &Daemon, targets: usize) -> serde_json::Value {
    let (took, h) = wait_health(daemon, Duration::from_secs(10), |h| {
        all_ok(h) && h["targets"].as_array().map(Vec::len) == Some(targets)
    })
    .unwrap_or_else(|| {
        panic!(
            "not every one of {targets} targets probed ok within 10 s: {:#}\n{}",
            daemon.health(),
            daemon.dump()
        )
    });
    eprintln!("all {targets} targets probed ok after {took:?}");
    h
}

/// One curl from the client, on a new connection: (exit code, body, time taken).
fn curl_once(lab: &AppLab, url: &str, max_time_s: u64) -> (i32, String, Duration) {
    let start = Instant::now();
    let mt = max_time_s.to_string();
    let out = lab.bed.exec(
        lab.bed.client_ns(),
        &[
            "curl",
            "-sS",
            "--noproxy",
            "*",
            "--max-time",
            &mt,
            "-o",
            "-",
            url,
        ],
        Duration::from_secs(max_time_s + 10),
    );
    (
        out.status.code().unwrap_or(-1),
        out.stdout.trim().to_string(),
        start.elapsed(),
    )
}

/// The event lines about real server `rs` (`IP:PORT`) that are evictions or
/// restorations.
fn rs_events(daemon: &Daemon, rs: &str) -> Vec<String> {
    daemon
        .event_lines()
        .into_iter()
        .filter(|l| l.starts_with("lb=evict ") || l.starts_with("lb=restore "))
        .filter(|l| l.contains(&format!(" rs={rs} ")))
        .collect()
}

fn answers_of(batch: &serde_json::Value) -> BTreeMap<String, u64> {
    AppLab::answers(batch)
}

/// A batch of `count` curls to `url` that must all succeed; its answers per server.
fn curl_all_ok(
    lab: &AppLab,
    daemon: &Daemon,
    url: &str,
    count: u64,
    parallel: u32,
) -> BTreeMap<String, u64> {
    let batch = lab.curl(url, count, parallel, &[]);
    assert_eq!(
        batch["ok"].as_u64(),
        Some(count),
        "not every request to {url} succeeded: {batch}\n{:#}\n{}",
        daemon.health(),
        daemon.dump()
    );
    answers_of(&batch)
}

/// `connections` of real server `ip` in service VIP:`port` (`sluicectl -L`).
fn rs_connections(daemon: &Daemon, port: u16, ip: &str) -> u64 {
    rs_counter(
        real_server(&daemon.list_services(), "tcp", VIP, port, ip),
        "connections",
    )
}

// ---------------------------------------------------------------------------------

#[test]
fn a_dead_server_is_evicted_in_bounded_time_gets_nothing_and_is_restored() {
    require_root();
    let mut lab = lab_with(3, |_| Vec::new());
    let toml = format!(
        "{}\n{}",
        health_section(&["check = \"tcp\""]),
        service(80, &[], &rs_list(&lab))
    );
    let daemon = daemon_for(&lab, toml);
    let h = wait_all_ok(&daemon, 3);
    let (rs2, s) = (lab.bed.rs_ip(2).to_string(), svc(80));
    let t = health_target(&h, &s, &rs2);
    assert_eq!(t["check"], "tcp", "{t}");
    assert_eq!(t["port"], HTTP_PORT, "{t}");
    assert_eq!(t["probe_port"], HTTP_PORT, "{t}");
    for (k, v) in [
        ("interval_ms", INTERVAL),
        ("timeout_ms", TIMEOUT),
        ("fall", FALL),
        ("rise", RISE),
        ("retry_ms", RETRY),
        ("evictions", 0),
    ] {
        assert_eq!(t[k].as_u64(), Some(v), "{k}: {t}");
    }
    let text = daemon.ctl(&["health"]).expect_success("sluicectl health");
    assert!(text.stdout.contains(&rs2), "{}", text.stdout);
    let url = format!("http://{VIP}/");
    let before = curl_all_ok(&lab, &daemon, &url, 30, 3);
    assert_eq!(before.len(), 3, "every server answers first: {before:?}");

    // Kill rs2: its kernel refuses the probes from now on.
    lab.kill_server(2);
    let bound = Duration::from_millis(FALL * INTERVAL + TIMEOUT) + TOLERANCE;
    let (took, h) = wait_health(&daemon, bound + Duration::from_secs(5), |h| {
        evicted(h, &s, &rs2)
    })
    .unwrap_or_else(|| {
        panic!(
            "rs2 never evicted: {:#}\n{}",
            daemon.health(),
            daemon.dump()
        )
    });
    eprintln!("dead rs2 evicted {took:?} after the kill (bound {bound:?})");
    let t = health_target(&h, &s, &rs2);
    assert!(took <= bound, "eviction took {took:?} > {bound:?}: {t}");
    assert_eq!(t["last_reason"], format!("{FALL}fail"), "{t}");
    assert_eq!(t["last_outcome"], "refused", "{t}");
    assert_eq!(t["evictions"], 1, "{t}");
    let list = daemon.list_services();
    let listed = real_server(&list, "tcp", VIP, 80, &rs2);
    assert_eq!(listed["evicted"], true, "{listed}");
    assert_eq!(listed["evictions"], 1, "{listed}");
    assert_eq!(
        listed["weight"], 1,
        "eviction never changes the weight: {listed}"
    );
    // ipvsadm's table keeps the weight and has no column for it: a note on stderr
    // names the evicted server, stdout stays ipvsadm's.
    let table = daemon.ctl(&["-L", "-n"]).expect_success("sluicectl -L -n");
    let note = format!("TCP {VIP}:80 -> {rs2}:{HTTP_PORT}");
    assert!(
        table
            .stderr
            .contains("note: 1 real server(s) evicted by health checking")
            && table.stderr.contains(&note)
            && table.stderr.lines().count() == 1,
        "{}",
        table.describe()
    );
    assert!(
        table.stdout.starts_with("IP Virtual Server version") && !table.stdout.contains("note"),
        "{}",
        table.describe()
    );

    // 300 new connections: every one answered, none sent to rs2.
    let conns_before = rs_connections(&daemon, 80, &rs2);
    let during = curl_all_ok(&lab, &daemon, &url, 300, 4);
    assert!(!during.contains_key("rs2"), "{during:?}");
    assert_eq!(
        rs_connections(&daemon, 80, &rs2),
        conns_before,
        "Sluice sent new connections to evicted rs2"
    );

    // rs2 back: restored after RISE successes, then it gets new connections again.
    let http = format!("0.0.0.0:{HTTP_PORT}");
    lab.restart_server(2, &[("--http", &http)], &[]);
    let bound = Duration::from_millis(RETRY + RISE * INTERVAL) + TOLERANCE;
    let (took, h) = wait_health(&daemon, bound + Duration::from_secs(5), |h| {
        !evicted(h, &s, &rs2)
    })
    .unwrap_or_else(|| {
        panic!(
            "rs2 never restored: {:#}\n{}",
            daemon.health(),
            daemon.dump()
        )
    });
    eprintln!("rs2 restored {took:?} after its restart (bound {bound:?})");
    let t = health_target(&h, &s, &rs2);
    assert!(took <= bound, "restoration took {took:?} > {bound:?}: {t}");
    assert_eq!(t["last_reason"], format!("{RISE}ok"), "{t}");
    assert_eq!(
        (t["evictions"].as_u64(), t["restores"].as_u64()),
        (Some(1), Some(1)),
        "{t}"
    );
    let after = curl_all_ok(&lab, &daemon, &url, 60, 3);
    assert!(after.get("rs2").copied().unwrap_or(0) >= 15, "{after:?}");

    let rs2_port = format!("{rs2}:{HTTP_PORT}");
    assert_eq!(
        rs_events(&daemon, &rs2_port),
        vec![
            format!("lb=evict svc={s} rs={rs2_port} reason={FALL}fail"),
            format!("lb=restore svc={s} rs={rs2_port} reason={RISE}ok"),
        ]
    );
    let lines = daemon.event_lines();
    assert!(
        !lines.iter().any(|l| l.starts_with("lb=alert")),
        "no alert while two servers were up: {lines:#?}"
    );
    let h = daemon.health();
    for i in [1, 3] {
        let t = health_target(&h, &s, lab.bed.rs_ip(i));
        assert_eq!(t["evictions"], 0, "{t}");
    }
    daemon.stop_clean();
}

#[test]
fn an_http_check_evicts_a_server_alive_but_unhealthy_that_a_tcp_check_keeps() {
    require_root();
    let dir = tempfile::tempdir().expect("temp dir");
    let status = dir.path().join("rs2.status");
    std::fs::write(&status, "200\n").unwrap();
    let status_s = status.to_string_lossy().into_owned();
    let lab = lab_with(3, |i| {
        let mut a = vec!["--health-path".to_string(), "/health".to_string()];
        if i == 2 {
            a.extend(["--health-status-file".to_string(), status_s.clone()]);
        }
        a
    });
    let rs = rs_list(&lab);
    let toml = format!(
        "{}\n{}\n{}",
        health_section(&[]),
        service(
            80,
            &[
                "[services.health]".into(),
                "check = \"http\"".into(),
                "path = \"/health\"".into()
            ],
            &rs
        ),
        service(
            81,
            &["[services.health]".into(), "check = \"tcp\"".into()],
            &rs
        )
    );
    let daemon = daemon_for(&lab, toml);
    let h = wait_all_ok(&daemon, 6);
    let rs2 = lab.bed.rs_ip(2).to_string();
    let (http_svc, tcp_svc) = (svc(80), svc(81));
    assert_eq!(health_target(&h, &http_svc, &rs2)["check"], "http");
    assert_eq!(health_target(&h, &tcp_svc, &rs2)["check"], "tcp");
    // The HTTP probes come from the appliance's address and its probe ports.
    let probes = lab.log_lines(1, "health");
    assert!(!probes.is_empty(), "rs1 saw no health request");
    for l in &probes {
        let w: Vec<&str> = l.split_whitespace().collect();
        let port: u16 = w[2].parse().unwrap();
        assert_eq!(w[1], APPLIANCE, "{l}");
        assert!((61000..=61999).contains(&port), "{l}");
    }

    // rs2 answers 500 on /health, its port stays open.
    std::fs::write(&status, "500\n").unwrap();
    let bound = Duration::from_millis(FALL * INTERVAL + TIMEOUT) + TOLERANCE;
    let (took, h) = wait_health(&daemon, bound + Duration::from_secs(5), |h| {
        evicted(h, &http_svc, &rs2)
    })
    .unwrap_or_else(|| {
        panic!(
            "rs2 never evicted: {:#}\n{}",
            daemon.health(),
            daemon.dump()
        )
    });
    eprintln!("rs2 answering 500 evicted by the HTTP check after {took:?} (bound {bound:?})");
    let t = health_target(&h, &http_svc, &rs2);
    assert!(took <= bound, "{took:?} > {bound:?}: {t}");
    assert_eq!(t["last_outcome"], "status 500", "{t}");
    assert_eq!(t["last_reason"], format!("{FALL}fail"), "{t}");
    // The TCP check keeps probing it ok over several more intervals.
    let sent = h["stats"]["probes_sent"].as_u64().unwrap();
    std::thread::sleep(Duration::from_millis(4 * INTERVAL));
    let h = daemon.health();
    assert!(
        h["stats"]["probes_sent"].as_u64().unwrap() >= sent + 6,
        "{h:#}"
    );
    let t = health_target(&h, &tcp_svc, &rs2);
    assert_eq!(
        (&t["evicted"], &t["evictions"], &t["last_outcome"]),
        (
            &serde_json::json!(false),
            &serde_json::json!(0),
            &serde_json::json!("ok")
        ),
        "the TCP check sees an open port: {t}"
    );
    let via_http = curl_all_ok(&lab, &daemon, &format!("http://{VIP}/"), 60, 3);
    assert!(!via_http.contains_key("rs2"), "{via_http:?}");
    let via_tcp = curl_all_ok(&lab, &daemon, &format!("http://{VIP}:81/"), 60, 3);
    assert!(
        via_tcp.get("rs2").copied().unwrap_or(0) >= 15,
        "{via_tcp:?}"
    );

    // Healthy again.
    std::fs::write(&status, "200\n").unwrap();
    let bound = Duration::from_millis(RETRY + RISE * INTERVAL) + TOLERANCE;
    let (took, h) = wait_health(&daemon, bound + Duration::from_secs(5), |h| {
        !evicted(h, &http_svc, &rs2)
    })
    .unwrap_or_else(|| {
        panic!(
            "rs2 never restored: {:#}\n{}",
            daemon.health(),
            daemon.dump()
        )
    });
    eprintln!("rs2 restored {took:?} after answering 200 again (bound {bound:?})");
    assert!(took <= bound, "{took:?} > {bound:?}");
    assert_eq!(
        health_target(&h, &http_svc, &rs2)["last_reason"],
        format!("{RISE}ok")
    );
    let via_http = curl_all_ok(&lab, &daemon, &format!("http://{VIP}/"), 60, 3);
    assert!(
        via_http.get("rs2").copied().unwrap_or(0) >= 15,
        "{via_http:?}"
    );
    let rs2_port = format!("{rs2}:{HTTP_PORT}");
    assert_eq!(
        rs_events(&daemon, &rs2_port),
        vec![
            format!("lb=evict svc={http_svc} rs={rs2_port} reason={FALL}fail"),
            format!("lb=restore svc={http_svc} rs={rs2_port} reason={RISE}ok"),
        ]
    );
    daemon.stop_clean();
}

#[test]
fn passive_detection_evicts_a_silent_server_after_passive_fall_connections() {
    require_root();
    const PASSIVE_FALL: u64 = 2;
    const BACKOFF_MS: u64 = 10_000;
    let lab = lab_with(3, |_| Vec::new());
    let toml = format!(
        "[health]\npassive = true\npassive_fall = {PASSIVE_FALL}\npassive_syn_ms = 800\nretry_ms = {BACKOFF_MS}\n\n{}",
        service(80, &[], &rs_list(&lab))
    );
    let daemon = daemon_for(&lab, toml);
    let (rs2, s) = (lab.bed.rs_ip(2).to_string(), svc(80));
    let h = daemon.health();
    let t = health_target(&h, &s, &rs2);
    assert_eq!(
        (&t["check"], &t["passive"]),
        (&serde_json::json!("none"), &serde_json::json!(true)),
        "{t}"
    );
    let url = format!("http://{VIP}/");
    let before = curl_all_ok(&lab, &daemon, &url, 30, 3);
    assert_eq!(before.len(), 3, "{before:?}");
    let sent_before = daemon.health()["stats"]["probes_sent"].as_u64();
    assert_eq!(sent_before, Some(0), "no active check: no probe");

    // rs2 loses its address: SYNs sent to it are neither answered nor refused.
    lab.rs_addr_del(2);
    let gone = Instant::now();
    // New connections one at a time (curl gives up after 2 s: one SYN resent after
    // 1 s, which passive detection counts) until rs2 is evicted.
    let (mut failed, mut tried) = (0u64, 0u64);
    let mut evicted_after = None;
    while tried < 30 {
        let (code, body, took) = curl_once(&lab, &url, 2);
        tried += 1;
        if code != 0 {
            failed += 1;
            eprintln!("connection {tried} failed (exit {code}) after {took:?}");
        } else {
            assert_ne!(body, "rs2", "rs2 without an address answered?");
        }
        if evicted(&daemon.health(), &s, &rs2) {
            evicted_after = Some(gone.elapsed());
            break;
        }
    }
    let Some(evicted_after) = evicted_after else {
        panic!(
            "rs2 not evicted after {tried} connections ({failed} failed): {:#}\n{}",
            daemon.health(),
            daemon.dump()
        );
    };
    eprintln!(
        "passive: rs2 evicted {evicted_after:?} after losing its address, \
         {failed} of {tried} new connections failed first (passive_fall {PASSIVE_FALL})"
    );
    // Sequential connections: each failure is counted (at its SYN's resend) before the
    // next connection starts, so the count is exact; 1 of slack for a resend that
    // reaches Sluice as curl gives up.
    assert!(
        (PASSIVE_FALL..=PASSIVE_FALL + 1).contains(&failed),
        "{failed} connections failed before the eviction"
    );
    let h = daemon.health();
    let t = health_target(&h, &s, &rs2);
    let reason = t["last_reason"].as_str().unwrap();
    let n: u64 = reason
        .strip_prefix("passive-")
        .and_then(|r| r.strip_suffix("fail"))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("reason {reason}"));
    assert!(n >= PASSIVE_FALL, "{t}");

    // From now on new connections go elsewhere and all succeed (the back-off is far).
    let after = curl_all_ok(&lab, &daemon, &url, 50, 4);
    assert!(!after.contains_key("rs2"), "{after:?}");

    // Its address back: restored when the back-off ends, and it answers again.
    lab.rs_addr_add(2, APPLIANCE);
    let since = Duration::from_millis(
        health_target(&daemon.health(), &s, &rs2)["since_change_ms"]
            .as_u64()
            .unwrap(),
    );
    let (took, h) = wait_health(&daemon, Duration::from_millis(BACKOFF_MS + 5000), |h| {
        !evicted(h, &s, &rs2)
    })
    .unwrap_or_else(|| {
        panic!(
            "rs2 never restored: {:#}\n{}",
            daemon.health(),
            daemon.dump()
        )
    });
    let backoff = since + took;
    eprintln!("passive: rs2 restored {backoff:?} after its eviction (back-off {BACKOFF_MS} ms)");
    assert!(
        backoff >= Duration::from_millis(BACKOFF_MS) - TOLERANCE
            && backoff <= Duration::from_millis(BACKOFF_MS) + TOLERANCE,
        "{backoff:?}"
    );
    assert_eq!(
        health_target(&h, &s, &rs2)["last_reason"],
        format!("backoff-{BACKOFF_MS}ms")
    );
    let back = curl_all_ok(&lab, &daemon, &url, 30, 3);
    assert!(back.get("rs2").copied().unwrap_or(0) >= 5, "{back:?}");
    let rs2_port = format!("{rs2}:{HTTP_PORT}");
    assert_eq!(
        rs_events(&daemon, &rs2_port),
        vec![
            format!("lb=evict svc={s} rs={rs2_port} reason={reason}"),
            format!("lb=restore svc={s} rs={rs2_port} reason=backoff-{BACKOFF_MS}ms"),
        ]
    );
    daemon.stop_clean();
}

#[test]
fn all_servers_down_alerts_once_and_answers_rst_or_drops_as_configured() {
    require_root();
    let lab = lab_with(2, |_| Vec::new());
    let rs = rs_list(&lab);
    // Port 80 resets (its own setting), port 81 drops (the [health] default).
    let toml = format!(
        "{}\n{}\n{}",
        health_section(&["check = \"tcp\"", "all_down = \"drop\""]),
        service(
            80,
            &["[services.health]".into(), "all_down = \"rst\"".into()],
            &rs
        ),
        service(81, &[], &rs)
    );
    let daemon = daemon_for(&lab, toml);
    wait_all_ok(&daemon, 4);
    for port in [80, 81] {
        let (code, body, _) = curl_once(&lab, &format!("http://{VIP}:{port}/"), 5);
        assert_eq!(code, 0, "port {port}: {body}");
    }

    // Both real servers lose their addresses: nothing answers them, not even an RST,
    // so an RST the client sees can only come from Sluice.
    lab.rs_addr_del(1);
    lab.rs_addr_del(2);
    let ips: Vec<String> = (1..=2).map(|i| lab.bed.rs_ip(i).to_string()).collect();
    let (took, h) = wait_health(&daemon, Duration::from_secs(10), |h| {
        [80, 81]
            .iter()
            .all(|&p| ips.iter().all(|ip| evicted(h, &svc(p), ip)))
    })
    .unwrap_or_else(|| panic!("not all evicted: {:#}\n{}", daemon.health(), daemon.dump()));
    eprintln!("all down: every server of both services evicted after {took:?}");
    for p in [80, 81] {
        for ip in &ips {
            assert_eq!(health_target(&h, &svc(p), ip)["last_outcome"], "timeout");
        }
    }
    // Let the failed retries go on for a while: still one alert per service.
    std::thread::sleep(Duration::from_millis(3 * RETRY));
    // `lb=alert svc=S reason=no-available-rs ...` and `lb=alert-clear svc=S ...` lines.
    let alerts = |lines: &[String], kind: &str, port: u16| -> usize {
        let prefix = format!("lb={kind} svc={} ", svc(port));
        lines
            .iter()
            .filter(|l| l.starts_with(&prefix))
            .filter(|l| kind != "alert" || l[prefix.len()..].starts_with("reason=no-available-rs"))
            .count()
    };
    let lines = daemon.event_lines();
    for p in [80, 81] {
        assert_eq!(alerts(&lines, "alert", p), 1, "port {p}: {lines:#?}");
        assert_eq!(alerts(&lines, "alert-clear", p), 0, "port {p}: {lines:#?}");
    }
    let conns: Vec<u64> = [80, 81]
        .iter()
        .flat_map(|&p| ips.iter().map(move |ip| (p, ip)))
        .map(|(p, ip)| rs_connections(&daemon, p, ip))
        .collect();

    // all_down = "rst": refused at once, five times.
    for _ in 0..5 {
        let (code, body, took) = curl_once(&lab, &format!("http://{VIP}:80/"), 3);
        eprintln!("all down, rst: curl exit {code} after {took:?}");
        assert_eq!(code, 7, "expected connection refused: {body}");
        assert!(took < Duration::from_secs(1), "{took:?}");
    }
    // all_down = "drop": the client's SYNs go unanswered until curl gives up.
    let (code, body, took) = curl_once(&lab, &format!("http://{VIP}:81/"), 2);
    eprintln!("all down, drop: curl exit {code} after {took:?}");
    assert_eq!(code, 28, "expected a timeout: {body}");
    assert!(took >= Duration::from_secs(2), "{took:?}");
    let conns_after: Vec<u64> = [80, 81]
        .iter()
        .flat_map(|&p| ips.iter().map(move |ip| (p, ip)))
        .map(|(p, ip)| rs_connections(&daemon, p, ip))
        .collect();
    assert_eq!(
        conns, conns_after,
        "Sluice forwarded connections to evicted servers"
    );
    let list = daemon.list_services();
    for p in [80, 81] {
        for ip in &ips {
            assert_eq!(real_server(&list, "tcp", VIP, p, ip)["weight"], 1);
        }
    }

    // rs1 back: restored in both services, one alert-clear each, traffic flows.
    lab.rs_addr_add(1, APPLIANCE);
    let bound = Duration::from_millis(RETRY + RISE * INTERVAL) + TOLERANCE;
    let (took, _) = wait_health(&daemon, bound + Duration::from_secs(5), |h| {
        [80, 81].iter().all(|&p| !evicted(h, &svc(p), &ips[0]))
    })
    .unwrap_or_else(|| {
        panic!(
            "rs1 never restored: {:#}\n{}",
            daemon.health(),
            daemon.dump()
        )
    });
    eprintln!("all down: rs1 restored in both services {took:?} after its address came back");
    assert!(took <= bound, "{took:?} > {bound:?}");
    // The alert clears with the snapshot that restores the server: at once, or (the
    // two services' restorations within OVERLAY_SPACING_MS, 100 ms) with the next
    // one, that much later; a second is that with room for a loaded machine.
    let lines = wait_for(Duration::from_secs(1), POLL, || {
        let lines = daemon.event_lines();
        [80, 81]
            .iter()
            .all(|&p| alerts(&lines, "alert-clear", p) == 1)
            .then_some(lines)
    })
    .unwrap_or_else(|| daemon.event_lines());
    for p in [80, 81] {
        assert_eq!(alerts(&lines, "alert", p), 1, "port {p}: {lines:#?}");
        assert_eq!(alerts(&lines, "alert-clear", p), 1, "port {p}: {lines:#?}");
        let (code, body, _) = curl_once(&lab, &format!("http://{VIP}:{p}/"), 5);
        assert_eq!((code, body.as_str()), (0, "rs1"), "port {p}");
    }
    daemon.stop_clean();
}

#[test]
fn healthy_servers_under_load_are_never_evicted() {
    require_root();
    const FAST: u64 = 100;
    const RUN: Duration = Duration::from_secs(25);
    let lab = lab_with(3, |_| vec!["--health-path".into(), "/health".into()]);
    let rs = rs_list(&lab);
    let toml = format!(
        "[health]\ncheck = \"tcp\"\ninterval_ms = {FAST}\ntimeout_ms = {FAST}\nfall = 3\nrise = 2\nretry_ms = {RETRY}\n\n{}\n{}",
        service(80, &[], &rs),
        service(
            81,
            &["[services.health]".into(), "check = \"http\"".into(), "path = \"/health\"".into()],
            &rs
        )
    );
    let daemon = daemon_for(&lab, toml);
    wait_all_ok(&daemon, 6);
    let start_stats = daemon.health()["stats"].clone();
    let started = Instant::now();
    let mut requests = 0u64;
    let mut batch = 0u32;
    // Meanwhile a watcher notes every failed outcome it sees (for the diagnosis of a
    // failure: which check, which server, when).
    let done = std::sync::atomic::AtomicBool::new(false);
    let socket = daemon.socket().to_path_buf();
    let seen_failures = std::thread::scope(|scope| {
        let watcher = scope.spawn(|| {
            let mut seen: Vec<String> = Vec::new();
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                let out = run_bounded(
                    std::process::Command::new(SLUICECTL)
                        .arg("--socket")
                        .arg(&socket)
                        .args(["health", "--json"]),
                    Duration::from_secs(15),
                );
                let h: serde_json::Value =
                    serde_json::from_str(&out.stdout).unwrap_or(serde_json::Value::Null);
                for t in h["targets"].as_array().into_iter().flatten() {
                    if t["last_outcome"] != "ok" {
                        let note = format!(
                            "{:>6} ms {} {} {}: {}",
                            started.elapsed().as_millis(),
                            t["service"],
                            t["ip"],
                            t["check"],
                            t["last_outcome"]
                        );
                        seen.push(note);
                    }
                }
                std::thread::sleep(Duration::from_millis(25));
            }
            seen
        });
        while started.elapsed() < RUN {
            let port = if batch.is_multiple_of(2) { 80 } else { 81 };
            let url = format!("http://{VIP}:{port}/");
            let b = lab.curl(&url, 100, 4, &[]);
            requests += 100;
            batch += 1;
            if b["ok"].as_u64() != Some(100) {
                done.store(true, std::sync::atomic::Ordering::Relaxed);
                let seen = watcher.join().expect("watcher");
                panic!(
                    "not every request to {url} succeeded: {b}\nfailed outcomes seen:\n{}\nevents: {:#?}\ndrops: {}\n{:#}",
                    seen.join("\n"),
                    daemon.event_lines(),
                    daemon.status()["drops"],
                    daemon.health()
                );
            }
        }
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        watcher.join().expect("watcher")
    });
    let ran = started.elapsed();
    eprintln!(
        "failed outcomes seen while polling every 25 ms ({}):\n{}",
        seen_failures.len(),
        seen_failures.join("\n")
    );
    let h = daemon.health();
    let stat = |k: &str| h["stats"][k].as_u64().unwrap() - start_stats[k].as_u64().unwrap();
    let (sent, ok) = (stat("probes_sent"), stat("probes_ok"));
    eprintln!(
        "no false evictions: {ran:?}, {requests} requests, 6 targets at {FAST} ms: \
         {sent} probes sent, {ok} ok, {} failed, {} timed out, {} skipped; stats {}",
        stat("probes_failed"),
        stat("probes_timed_out"),
        stat("probes_skipped"),
        h["stats"]
    );
    for t in h["targets"].as_array().unwrap() {
        assert_eq!(
            (&t["evicted"], &t["evictions"]),
            (&serde_json::json!(false), &serde_json::json!(0)),
            "{t}"
        );
    }
    // Each target is probed about every 100 ms (+ up to 5 % jitter): at least 200 a
    // target over 25 s.
    let per_target_min = 6 * (ran.as_millis() as u64 / (FAST + FAST / 20 + 1)) * 9 / 10;
    assert!(
        sent >= per_target_min.max(6 * 200),
        "{sent} probes in {ran:?}"
    );
    // Every failed probe is a timeout (no refusal, no wrong status from a healthy
    // server), and those are few (at most 5 %; 0 to 2.7 % seen): on this shared
    // 2-core machine (load ~6, Sluice busy-polling) a user-space HTTP server sometimes
    // misses a 100 ms timeout, all three at the same instant (a machine-wide stall);
    // fall = 3 makes an eviction need three in a row.
    assert_eq!(stat("probes_failed"), stat("probes_timed_out"), "{h:#}");
    assert!(
        stat("probes_timed_out") * 20 <= sent,
        "more than 5 % timed out: {h:#}"
    );
    assert_eq!(stat("probes_skipped"), 0, "{h:#}");
    // At most one probe per target in flight at either end of the window.
    let failed = stat("probes_failed");
    assert!(
        ok + failed + 6 >= sent && sent + 6 >= ok + failed,
        "{sent} sent, {ok} ok"
    );
    let lines = daemon.event_lines();
    assert!(
        !lines
            .iter()
            .any(|l| l.starts_with("lb=evict") || l.starts_with("lb=alert")),
        "{lines:#?}"
    );
    daemon.stop_clean();
}

#[test]
fn the_sorry_server_serves_while_the_only_real_server_is_down() {
    require_root();
    let mut lab = lab_with(2, |_| Vec::new());
    let (rs1, rs2) = (lab.bed.rs_ip(1).to_string(), lab.bed.rs_ip(2).to_string());
    let sorry = format!("sorry_server = {{ ip = \"{rs2}\", port = {HTTP_PORT}, mode = \"nat\" }}");
    let toml = format!(
        "{}\n{}",
        health_section(&["check = \"tcp\""]),
        service(
            80,
            &[sorry, "persistence_timeout = 60".into()],
            &rs_list(&lab)[..1]
        )
    );
    let daemon = daemon_for(&lab, toml);
    // One target: the sorry server is not probed (as keepalived).
    wait_all_ok(&daemon, 1);
    let (s, url) = (svc(80), format!("http://{VIP}/"));
    let listing = |daemon: &Daemon| daemon.ctl(&["-L", "-n"]).expect_success("-Ln").stdout;
    let rs2_line = format!(
        "  -> {:<28} {:<7} {:<6}",
        format!("{rs2}:{HTTP_PORT}"),
        "Masq",
        1
    );
    assert!(!listing(&daemon).contains(&rs2), "{}", listing(&daemon));
    let up = curl_all_ok(&lab, &daemon, &url, 10, 2);
    assert_eq!(up.keys().collect::<Vec<_>>(), ["rs1"], "{up:?}");

    lab.kill_server(1);
    wait_health(&daemon, Duration::from_secs(5), |h| evicted(h, &s, &rs1))
        .unwrap_or_else(|| panic!("rs1 never evicted: {:#}", daemon.health()));
    let down = curl_all_ok(&lab, &daemon, &url, 10, 2);
    assert_eq!(down.keys().collect::<Vec<_>>(), ["rs2"], "{down:?}");
    let list = daemon.list_services();
    assert_eq!(list["services"][0]["sorry_in_use"], true, "{list}");
    assert!(listing(&daemon).contains(&rs2_line), "{}", listing(&daemon));

    let http = format!("0.0.0.0:{HTTP_PORT}");
    lab.restart_server(1, &[("--http", &http)], &[]);
    wait_health(&daemon, Duration::from_secs(5), |h| !evicted(h, &s, &rs1))
        .unwrap_or_else(|| panic!("rs1 never restored: {:#}", daemon.health()));
    let back = curl_all_ok(&lab, &daemon, &url, 10, 2);
    assert_eq!(back.keys().collect::<Vec<_>>(), ["rs1"], "{back:?}");
    let list = daemon.list_services();
    let sorry = &list["services"][0]["sorry_server"];
    assert_eq!(
        (&sorry["weight"], &sorry["connections"]),
        (&0.into(), &10.into()),
        "{list}"
    );
    assert!(!listing(&daemon).contains(&rs2), "{}", listing(&daemon));
    daemon.stop_clean();
}
