//! Tier 3, admission end to end with real kernels: a test bed with the client on its
//! own subnet (three addresses), one NAT real server running `e2e_apps.py serve
//! --echo`, and Sluice on net_af_packet in front (one worker). The client runs
//! `e2e_apps.py stream` (each connect bounded by 0.5 s, under the kernel's first SYN
//! retransmission, so one refused attempt is one SYN).
//!
//! - Access list, hot: with one long-lived connection exchanging a line every 100 ms
//!   and 10 new connections a second, `sluicectl --acl-add --deny CLIENT/32` stops
//!   every new connection that starts after it returned, while the established one
//!   keeps answering without a gap over 1 s; `--acl-list` counts the denies on the
//!   rule; `--acl-del` restores new connections.
//! - Rate limit, hot: `--rate-limit 20 --burst 20`; a greedy source offering about
//!   200 new connections in 1 s gets about the burst plus 20 a second of its span
//!   through, the rest refused and counted; a polite source (4 a second, from another
//!   address, at the same time) gets every one through.
//!
//! Run: `cargo test --release --test integration e2e_admission:: -- --nocapture` (as root).

use crate::common::*;
use serde_json::Value;
use std::time::Duration;

const APPLIANCE: &str = "198.18.0.1";
const CLIENT: &str = "198.18.2.100";
const GREEDY: &str = "198.18.2.101";
const POLITE: &str = "198.18.2.102";
const GATEWAY: &str = "198.18.2.1";
const VIP: &str = "198.18.1.1";
const VPORT: u16 = 80;
const ECHO_PORT: u16 = 7000;
const RATE: u64 = 20;
const BURST: u64 = 20;

/// `sluicectl --json ARGS`'s result.
fn ctl_json(daemon: &Daemon, args: &[&str]) -> Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    let out = daemon.ctl(&all);
    assert!(out.success(), "{}\n{}", out.describe(), daemon.dump());
    serde_json::from_str(&out.stdout).expect("sluicectl --json prints JSON")
}

/// The `stream` client's arguments for new connections at `per_s` from `source`.
fn stream_args(
    out: &str,
    source: &str,
    long: u32,
    per_s: u32,
    duration_s: f64,
    extra: &[&str],
) -> Vec<String> {
    let mut args: Vec<String> = [
        PYTHON,
        &AppLab::apps(),
        "stream",
        VIP,
        &VPORT.to_string(),
        "--long",
        &long.to_string(),
        "--interval-ms",
        "100",
        "--new-per-s",
        &per_s.to_string(),
        "--duration",
        &duration_s.to_string(),
        "--timeout",
        "0.5",
        "--source",
        source,
        "--out",
        out,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

fn report(path: &std::path::Path, stderr: &str) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("no client report at {} ({e}): {stderr}", path.display()));
    serde_json::from_str(&text).expect("the client report is JSON")
}

/// New connections of a report: (t_start, t_end, connected).
fn new_connections(report: &Value) -> Vec<(f64, f64, bool)> {
    report["new"]
        .as_array()
        .expect("new connections")
        .iter()
        .map(|c| {
            (
                c["t_start"].as_f64().unwrap(),
                c["t_end"].as_f64().unwrap(),
                c["server"].is_string(),
            )
        })
        .collect()
}

#[test]
fn a_hot_deny_stops_new_connections_only_and_a_rate_limit_caps_the_greedy_source() {
    require_root();
    let mut lab = AppLab::new(1);
    lab.bed
        .configure("client-addr", &[&format!("{CLIENT}/24"), GATEWAY]);
    for extra in [GREEDY, POLITE] {
        lab.bed
            .exec(
                lab.bed.client_ns(),
                &[
                    "ip",
                    "addr",
                    "add",
                    &format!("{extra}/24"),
                    "dev",
                    lab.bed.client_if(),
                ],
                Duration::from_secs(10),
            )
            .expect_success("ip addr add");
    }
    lab.bed.configure("rs-gateway", &[APPLIANCE]);
    let echo = format!("0.0.0.0:{ECHO_PORT}");
    lab.start_servers_listening(&[("--echo", &echo)]);
    let rip = lab.bed.rs_ip(1).to_string();
    let toml = service_section(
        "tcp",
        VIP,
        VPORT,
        "rr",
        &[],
        &[(rip.as_str(), ECHO_PORT, 1, "nat")],
    );
    let daemon = lab.daemon(
        &[&format!("{APPLIANCE}/24"), &format!("{GATEWAY}/24")],
        toml,
    );
    lab.prewarm(&daemon, GATEWAY);
    let service = format!("{VIP}:{VPORT}");

    // --- Access list: a deny added and removed under traffic. ---
    let dir = lab.dir.path().to_path_buf();
    let (out, ready, stop) = (
        dir.join("acl.json"),
        dir.join("acl.ready"),
        dir.join("acl.stop"),
    );
    let (ready_s, stop_s) = (
        ready.to_string_lossy().into_owned(),
        stop.to_string_lossy().into_owned(),
    );
    let args = stream_args(
        &out.to_string_lossy(),
        CLIENT,
        1,
        10,
        30.0,
        &["--ready", &ready_s, "--stop", &stop_s],
    );
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut client = BackgroundProcess::spawn(Some(lab.bed.client_ns()), &argv);
    client.wait_until(Duration::from_secs(10), "long connection open", || {
        ready.exists()
    });
    std::thread::sleep(Duration::from_millis(1500));
    let deny = format!("{CLIENT}/32");
    let (_, denied_from) = daemon.ctl_timed(&["--acl-add", "-t", &service, "--deny", &deny]);
    std::thread::sleep(Duration::from_millis(2500));
    let listed = ctl_json(&daemon, &["--acl-list", "-t", &service]);
    let (allowed_from, _) = daemon.ctl_timed(&["--acl-del", "-t", &service, "--deny", &deny]);
    let allowed_again = wall_now();
    std::thread::sleep(Duration::from_millis(1500));
    std::fs::write(&stop, b"").expect("writing the stop file");
    assert!(
        client.wait_exit(Duration::from_secs(10)).is_some(),
        "the stream client did not stop: {}",
        client.stderr_text()
    );
    let acl = report(&out, &client.stderr_text());
    let status = daemon.status();

    let long = &acl["long"][0];
    let gap = long["max_gap_s"].as_f64().unwrap();
    let last = long["last_answer"].as_f64().unwrap_or(0.0);
    eprintln!(
        "established connection: {} answers, largest gap {gap:.3} s, failures {}",
        long["ok"], long["failures"]
    );
    assert!(
        long["failures"].as_array().unwrap().is_empty() && gap < 1.0 && last > allowed_from,
        "the established connection suffered from the deny: {long}\n{}",
        daemon.dump()
    );
    let conns = new_connections(&acl);
    let before: Vec<_> = conns.iter().filter(|c| c.1 < denied_from - 0.6).collect();
    let during: Vec<_> = conns
        .iter()
        .filter(|c| c.0 > denied_from && c.1 < allowed_from)
        .collect();
    let after: Vec<_> = conns.iter().filter(|c| c.0 > allowed_again).collect();
    let ok = |set: &[&(f64, f64, bool)]| set.iter().filter(|c| c.2).count();
    eprintln!(
        "new connections: before the deny {}/{} ok, during {}/{} ok, after {}/{} ok",
        ok(&before),
        before.len(),
        ok(&during),
        during.len(),
        ok(&after),
        after.len()
    );
    assert!(before.len() >= 5 && ok(&before) == before.len(), "{acl}");
    assert!(during.len() >= 10, "too few attempts while denied: {acl}");
    assert_eq!(ok(&during), 0, "a denied source connected: {acl}");
    assert!(after.len() >= 5 && ok(&after) == after.len(), "{acl}");
    let rule = &listed["rules"][0];
    assert_eq!(rule["prefix"], deny.as_str(), "{listed}");
    assert_eq!(rule["action"], "deny", "{listed}");
    let hits = rule["hits"].as_u64().unwrap();
    let denied = drop_count(&status, "acl_denied");
    assert!(
        hits >= during.len() as u64 && denied >= hits,
        "rule hits {hits}, acl_denied drops {denied}, refused attempts {}: {listed}",
        during.len()
    );

    // --- Rate limit: a greedy and a polite source at once. ---
    daemon.ctl_timed(&[
        "--rate-limit",
        &RATE.to_string(),
        "--burst",
        &BURST.to_string(),
        "-t",
        &service,
    ]);
    let (greedy_out, polite_out) = (dir.join("greedy.json"), dir.join("polite.json"));
    let args = stream_args(&polite_out.to_string_lossy(), POLITE, 0, 4, 2.0, &[]);
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut polite = BackgroundProcess::spawn(Some(lab.bed.client_ns()), &argv);
    let args = stream_args(
        &greedy_out.to_string_lossy(),
        GREEDY,
        0,
        200,
        1.0,
        &["--pool", "128"],
    );
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let greedy_run = lab
        .bed
        .exec(lab.bed.client_ns(), &argv, Duration::from_secs(20));
    assert!(
        polite.wait_exit(Duration::from_secs(10)).is_some(),
        "the polite client did not stop: {}",
        polite.stderr_text()
    );
    let greedy = new_connections(&report(&greedy_out, &greedy_run.describe()));
    let polite = new_connections(&report(&polite_out, &polite.stderr_text()));
    let span = greedy.last().unwrap().0 - greedy[0].0;
    let passed = greedy.iter().filter(|c| c.2).count() as u64;
    let refused = greedy.len() as u64 - passed;
    let allowed = BURST as f64 + RATE as f64 * span;
    let listed = ctl_json(&daemon, &["--acl-list", "-t", &service]);
    let limited = listed["totals"]["rate_limited"].as_u64().unwrap();
    eprintln!(
        "greedy: {} attempts over {span:.2} s, {passed} through (burst + rate x span = {allowed:.1}), \
         {refused} refused; polite: {}/{} through; rate_limited {limited}",
        greedy.len(),
        polite.iter().filter(|c| c.2).count(),
        polite.len()
    );
    assert!(greedy.len() >= 150, "the greedy client offered too little");
    assert!(
        passed as f64 <= allowed + 2.0 && passed as f64 >= allowed * 0.7,
        "{passed} greedy connections through; burst + rate x span is {allowed:.1}"
    );
    assert!(
        limited >= refused,
        "{refused} refused attempts but rate_limited counts {limited}: {listed}"
    );
    assert!(
        polite.len() >= 6 && polite.iter().all(|c| c.2),
        "the polite source was limited: {polite:?}"
    );
    let status = daemon.status();
    assert_eq!(drop_count(&status, "rate_limited"), limited, "{status}");
    daemon.stop_clean();
}
