//! Tier 3, every scheduler end to end with real kernels: a NAT test bed (client on its
//! own subnet, three real servers running `e2e_apps.py` with weights 3:2:1), one VIP
//! whose scheduler is switched with `sluicectl -E` (a hot change) before each batch of
//! 60 curl requests on new connections, 4 at a time. Each batch must succeed entirely
//! and its spread must match the scheduler's contract, stated per scheduler below.
//!
//! Run: `cargo test --release --test integration e2e_schedulers::` (as root).

use crate::common::*;
use std::collections::BTreeMap;
use std::time::Duration;

const APPLIANCE: &str = "198.18.0.1";
const CLIENT: &str = "198.18.2.100/24";
const GATEWAY: &str = "198.18.2.1";
const VIP: &str = "198.18.1.1";
const HTTP_PORT: u16 = 8080;
const REQUESTS: u64 = 60;

const PARALLEL: u32 = 4;

/// What a batch's spread (rs1, rs2, rs3 with weights 3, 2, 1) must look like.
fn check(scheduler: &str, n: [u64; 3]) -> Result<(), String> {
    let [a, b, c] = n;
    let total = a + b + c;
    let max = *n.iter().max().unwrap();
    let near = |got: u64, want: u64, slack: u64| got.abs_diff(want) <= slack;
    let ok = match scheduler {
        // Strict turns over the servers, weights ignored.
        "rr" => n.iter().all(|&x| near(x, total / 3, 2)),
        // Smooth weighted round robin: exactly 3:2:1 per 6 picks.
        "wrr" => near(a, total / 2, 3) && near(b, total / 3, 3) && near(c, total / 6, 3),
        // Fewest connections, weights ignored; finished connections linger as
        // inactive sessions and count too: near-even.
        "lc" => n.iter().all(|&x| near(x, total / 3, 6)),
        // (active*256 + inactive) / weight: the lingering inactive sessions make the
        // spread follow the weights.
        "wlc" => near(a, total / 2, 6) && near(b, total / 3, 6) && near(c, total / 6, 6),
        // (active+1)*256/weight with at most 4 connections at once: the light server
        // only gets one when the others hold 3 and 2; the heavy one gets most.
        "sed" => a > b && c * 10 <= total,
        // An idle server first (list order), else sed: the first one takes most.
        "nq" => a == max && a * 2 >= total,
        // One destination (the VIP), one client: hashing sends everything to one
        // server; locality stays put while that server is not overloaded.
        "dh" | "sh" | "mh" => max == total,
        "lblc" | "lblcr" => max * 10 >= total * 7,
        // Weighted random: every server gets some, the heaviest more than the lightest.
        "wrandom" => n.iter().all(|&x| x > 0) && a > c,
        // Power of two choices: the less loaded of two candidates (finished
        // connections linger as inactive and count): near-even.
        "p2c" => n.iter().all(|&x| near(x, total / 3, 8)),
        // Weighted failover: the heaviest available server takes everything.
        "fo" => a == total,
        other => return Err(format!("no contract for {other}")),
    };
    if ok {
        Ok(())
    } else {
        Err(format!("{scheduler}: spread {n:?} breaks its contract"))
    }
}

#[test]
fn every_scheduler_meets_its_contract_with_real_connections() {
    require_root();
    let mut lab = AppLab::new(3);
    lab.bed.configure("client-addr", &[CLIENT, GATEWAY]);
    lab.bed.configure("rs-gateway", &[APPLIANCE]);
    lab.start_servers(&[format!("0.0.0.0:{HTTP_PORT}")], &[]);
    let rips: Vec<String> = (1..=3).map(|i| lab.bed.rs_ip(i).to_string()).collect();
    let servers: Vec<(&str, u16, u32, &str)> = rips
        .iter()
        .zip([3, 2, 1])
        .map(|(r, w)| (r.as_str(), HTTP_PORT, w, "nat"))
        .collect();
    let toml = service_section("tcp", VIP, 80, "rr", &[], &servers);
    let daemon = lab.daemon(
        &[&format!("{APPLIANCE}/24"), &format!("{GATEWAY}/24")],
        toml,
    );
    lab.prewarm(&daemon, GATEWAY);

    let mut failures = Vec::new();
    let mut results: BTreeMap<String, [u64; 3]> = BTreeMap::new();
    for scheduler in [
        "rr", "wrr", "lc", "wlc", "sed", "nq", "dh", "sh", "lblc", "lblcr", "mh", "wrandom", "p2c",
        "fo",
    ] {
        // A fresh service per scheduler (delete, add, add its real servers as one
        // batch): new real-server ids, so no counts linger from the previous batch.
        // The old sessions finish on their own.
        let mut commands = format!("-D -t {VIP}:80\n-A -t {VIP}:80 -s {scheduler}\n");
        for (ip, port, weight, _) in &servers {
            commands += &format!("-a -t {VIP}:80 -r {ip}:{port} -m -w {weight}\n");
        }
        let restore = daemon.restore(&commands);
        assert!(restore.success(), "{}", restore.describe());
        let batch = lab.curl(&format!("http://{VIP}/"), REQUESTS, PARALLEL, &[]);
        let answers = AppLab::answers(&batch);
        let n = [
            answers.get("rs1").copied().unwrap_or(0),
            answers.get("rs2").copied().unwrap_or(0),
            answers.get("rs3").copied().unwrap_or(0),
        ];
        if batch["ok"].as_u64() != Some(REQUESTS) {
            failures.push(format!(
                "{scheduler}: {} of {REQUESTS} requests ok: {batch}",
                batch["ok"]
            ));
        }
        if let Err(e) = check(scheduler, n) {
            failures.push(e);
        }
        results.insert(scheduler.to_string(), n);
    }
    eprintln!("spread per scheduler (rs1:rs2:rs3 = weights 3:2:1): {results:?}");
    assert!(
        failures.is_empty(),
        "{}\nall: {results:?}\n{}",
        failures.join("\n"),
        daemon.dump()
    );
    lab.assert_no_checksum_errors();
    daemon.stop_clean();
}

#[test]
fn the_contracts_can_fail() {
    // The checks above are not vacuous: a spread that breaks each contract is caught.
    assert!(check("rr", [30, 20, 10]).is_err());
    assert!(check("wrr", [20, 20, 20]).is_err());
    assert!(check("wlc", [20, 20, 20]).is_err());
    assert!(check("fo", [59, 1, 0]).is_err());
    assert!(check("mh", [30, 30, 0]).is_err());
    assert!(check("sed", [20, 20, 20]).is_err());
    assert!(check("wrandom", [40, 20, 0]).is_err());
    assert!(check("p2c", [40, 15, 5]).is_err());
    assert!(check("rr", [20, 20, 20]).is_ok());
}

/// Draining (weight 0), end to end with UDP sessions: an established session (the same
/// client address and port) keeps going to its real server after that server's weight
/// drops to 0, and no new session lands there. Weight back up: it takes new ones again.
#[test]
fn weight_zero_drains_new_sessions_and_keeps_established_ones() {
    require_root();
    let mut lab = AppLab::new(3);
    lab.bed.configure("client-addr", &[CLIENT, GATEWAY]);
    lab.bed.configure("rs-gateway", &[APPLIANCE]);
    lab.start_servers(&[], &["0.0.0.0:4444".to_string()]);
    let rips: Vec<String> = (1..=3).map(|i| lab.bed.rs_ip(i).to_string()).collect();
    let servers: Vec<(&str, u16, u32, &str)> =
        rips.iter().map(|r| (r.as_str(), 4444, 1, "nat")).collect();
    let toml = service_section("udp", VIP, 3333, "rr", &[], &servers);
    let daemon = lab.daemon(
        &[&format!("{APPLIANCE}/24"), &format!("{GATEWAY}/24")],
        toml,
    );
    lab.prewarm(&daemon, GATEWAY);
    let server_of = |reply: &serde_json::Value| -> String {
        reply
            .as_str()
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .to_string()
    };
    // An established session from port 45000.
    let (out, v) = lab.udp(VIP, 3333, 1, 45000);
    assert!(out.success(), "{}", out.describe());
    let pinned = server_of(&v["replies"][0]);
    let index: usize = pinned.trim_start_matches("rs").parse().unwrap();
    let drained = &rips[index - 1];
    let set_weight = |weight: &str| {
        let rs = format!("{drained}:4444");
        let edit = daemon.ctl(&[
            "-e",
            "-u",
            &format!("{VIP}:3333"),
            "-r",
            &rs,
            "-m",
            "-w",
            weight,
        ]);
        assert!(edit.success(), "{}", edit.describe());
    };
    set_weight("0");

    // The established session still reaches its server...
    let (out, v) = lab.udp(VIP, 3333, 1, 45000);
    assert!(out.success(), "{}", out.describe());
    assert_eq!(server_of(&v["replies"][0]), pinned, "{v}");
    // ...and 30 new sessions all go elsewhere.
    let (out, v) = lab.udp(VIP, 3333, 30, 46000);
    assert!(out.success(), "{}", out.describe());
    let landed: Vec<String> = v["replies"]
        .as_array()
        .unwrap()
        .iter()
        .map(server_of)
        .collect();
    assert_eq!(landed.len(), 30);
    assert!(
        !landed.contains(&pinned),
        "a new session reached drained {pinned}: {landed:?}"
    );
    let listed = daemon.ctl(&["-L", "-n", "--json"]);
    let json: serde_json::Value = serde_json::from_str(&listed.stdout).unwrap();
    let rs = real_server(&json, "udp", VIP, 3333, drained);
    assert_eq!(rs_counter(rs, "weight"), 0, "{rs}");
    assert_eq!(
        rs_counter(rs, "connections"),
        1,
        "only the first session: {rs}"
    );

    // Weight back: new sessions reach it again.
    set_weight("1");
    let (out, v) = lab.udp(VIP, 3333, 30, 47000);
    assert!(out.success(), "{}", out.describe());
    let landed: Vec<String> = v["replies"]
        .as_array()
        .unwrap()
        .iter()
        .map(server_of)
        .collect();
    assert!(
        landed.contains(&pinned),
        "{pinned} not back in rotation: {landed:?}"
    );
    daemon.stop_clean();
}

/// Connection thresholds with fo, end to end: the heavier server has `-x 5`; 20
/// long-lived connections open at once. fo alone would send all 20 to it; with the
/// threshold it takes 5 and the other server the rest, and `-Ln --thresholds` marks
/// it overloaded while they last.
#[test]
fn an_upper_threshold_caps_a_server_and_fo_moves_on() {
    require_root();
    const ECHO_PORT: u16 = 7000;
    const LONG: usize = 20;
    let mut lab = AppLab::new(2);
    lab.bed.configure("client-addr", &[CLIENT, GATEWAY]);
    lab.bed.configure("rs-gateway", &[APPLIANCE]);
    let echo = format!("0.0.0.0:{ECHO_PORT}");
    lab.start_servers_listening(&[("--echo", &echo)]);
    let rips: Vec<String> = (1..=2).map(|i| lab.bed.rs_ip(i).to_string()).collect();
    let servers: Vec<(&str, u16, u32, &str)> = vec![
        (rips[0].as_str(), ECHO_PORT, 2, "nat"),
        (rips[1].as_str(), ECHO_PORT, 1, "nat"),
    ];
    let toml = service_section("tcp", VIP, 80, "fo", &[], &servers);
    let daemon = lab.daemon(
        &[&format!("{APPLIANCE}/24"), &format!("{GATEWAY}/24")],
        toml,
    );
    lab.prewarm(&daemon, GATEWAY);
    let capped = format!("{}:{ECHO_PORT}", rips[0]);
    let edit = daemon.ctl(&[
        "-e",
        "-t",
        &format!("{VIP}:80"),
        "-r",
        &capped,
        "-m",
        "-w",
        "2",
        "-x",
        "5",
    ]);
    assert!(edit.success(), "{}", edit.describe());

    let long_s = LONG.to_string();
    let options = [
        "--long",
        &long_s,
        "--interval-ms",
        "200",
        "--new-per-s",
        "0",
        "--duration",
        "20",
        "--timeout",
        "5",
    ];
    let client = lab.stream("capped", VIP, 80, &options);
    let listing = daemon.ctl(&["-L", "-n", "--thresholds"]);
    let json: serde_json::Value =
        serde_json::from_str(&daemon.ctl(&["-L", "-n", "--json"]).stdout).unwrap();
    let report = client.stop_and_report();
    let mut per_server: BTreeMap<String, usize> = BTreeMap::new();
    for long in report["long"].as_array().unwrap() {
        assert!(long["failures"].as_array().unwrap().is_empty(), "{long}");
        *per_server
            .entry(long["server"].as_str().unwrap_or("none").to_string())
            .or_default() += 1;
    }
    eprintln!(
        "20 long connections with -x 5 on rs1 (fo, weights 2:1): {per_server:?}\n{listing:?}"
    );
    let on = |name: &str| per_server.get(name).copied().unwrap_or(0);
    assert!(
        (1..=5).contains(&on("rs1")) && on("rs1") + on("rs2") == LONG,
        "rs1 must take at most 5 and rs2 the rest: {per_server:?}"
    );
    let capped_line = listing
        .stdout
        .lines()
        .find(|l| l.contains(&capped))
        .unwrap_or_default()
        .to_string();
    assert_eq!(
        capped_line.split_whitespace().collect::<Vec<_>>(),
        [
            "->",
            capped.as_str(),
            "5",
            "0",
            &on("rs1").to_string(),
            "0",
            "overloaded"
        ],
        "{}",
        listing.stdout
    );
    let rs = real_server(&json, "tcp", VIP, 80, &rips[0]);
    assert_eq!(rs["overloaded"], serde_json::Value::Bool(true), "{rs}");
    let other = real_server(&json, "tcp", VIP, 80, &rips[1]);
    assert_eq!(
        other["overloaded"],
        serde_json::Value::Bool(false),
        "{other}"
    );
    daemon.stop_clean();
}

/// Persistence with a connection longer than the timeout, as IPVS keeps it: a template
/// lives while a connection it placed is open, not only the timeout after the last one
/// began. `rr` over two NAT echo servers, `persistence_timeout = 2`, one worker
/// (`check_template_kept_while_open`). About 15 s.
#[test]
fn a_persistence_template_lives_while_its_connection_is_open() {
    require_root();
    let mut lab = AppLab::new(2);
    lab.bed.configure("client-addr", &[CLIENT, GATEWAY]);
    lab.bed.configure("rs-gateway", &[APPLIANCE]);
    lab.start_servers_listening(&[("--echo", "0.0.0.0:7000")]);
    let rips: Vec<String> = (1..=2).map(|i| lab.bed.rs_ip(i).to_string()).collect();
    let servers: Vec<(&str, u16, u32, &str)> =
        rips.iter().map(|r| (r.as_str(), 7000, 1, "nat")).collect();
    let toml = service_section(
        "tcp",
        VIP,
        7000,
        "rr",
        &["persistence_timeout = 2".to_string()],
        &servers,
    );
    let daemon = lab.daemon(
        &[&format!("{APPLIANCE}/24"), &format!("{GATEWAY}/24")],
        toml,
    );
    lab.prewarm(&daemon, GATEWAY);
    let client_ip = CLIENT.split('/').next().unwrap();
    check_template_kept_while_open(&lab, &daemon, VIP, 7000, &format!("{client_ip}:0"), &|i| {
        format!("{}:7000", rips[i - 1])
    });
    daemon.stop_clean();
}

/// With a persistent (2 s) rr service over two real servers on `vip:port`, the client
/// holds one connection open (a request every 500 ms) for 11 s and opens a new one
/// every 5 s beside it. Each new one must reach the long connection's server (rr,
/// asked afresh once the template was gone, would give the other), and `-Lnc` must
/// list the client's template (`template_client`, as `-Lnc --json` writes it), naming
/// that server (`destination(i)` for server `rsi`), 7 s in: 5 s past the timeout.
/// Then the long connection closes; 5 s later (its session closing, in TIME_WAIT, a
/// connection the template still controls, as in IPVS) new connections still reach
/// that server.
pub(crate) fn check_template_kept_while_open(
    lab: &AppLab,
    daemon: &Daemon,
    vip: &str,
    port: u16,
    template_client: &str,
    destination: &dyn Fn(usize) -> String,
) {
    let client = lab.stream(
        "persist",
        vip,
        port,
        &[
            "--long",
            "1",
            "--interval-ms",
            "500",
            "--new-per-s",
            "0.2",
            "--duration",
            "30",
        ],
    );
    std::thread::sleep(Duration::from_secs(7));
    let listed = daemon.ctl(&["-L", "-n", "-c", "--json"]);
    assert!(listed.success(), "{}", listed.describe());
    std::thread::sleep(Duration::from_secs(4));
    let report = client.stop_and_report();
    std::thread::sleep(Duration::from_secs(5));
    let later = lab.stream(
        "persist-later",
        vip,
        port,
        &["--long", "0", "--new-per-s", "1", "--duration", "30"],
    );
    std::thread::sleep(Duration::from_millis(2500));
    let later = later.stop_and_report();
    let v: serde_json::Value = serde_json::from_str(&listed.stdout).unwrap();
    let templates: Vec<&serde_json::Value> = v["connections"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["state"] == "NONE" && c["client"] == template_client)
        .collect();

    let long = &report["long"][0];
    assert!(
        long["failures"].as_array().unwrap().is_empty(),
        "the long connection failed: {report}\n{}",
        daemon.dump()
    );
    let pinned = long["server"].as_str().unwrap();
    // The server of each new connection of a stream report.
    let servers = |report: &serde_json::Value| -> Vec<String> {
        report["new"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["server"].as_str().unwrap_or("none").to_string())
            .collect()
    };
    let new = servers(&report);
    assert!(
        new.len() >= 3,
        "a new connection at 0, 5 and 10 s: {report}"
    );
    assert!(
        new.iter().all(|s| *s == pinned),
        "every new connection with the long one's server {pinned}: {new:?}\n{}",
        daemon.dump()
    );
    let closed = servers(&later);
    assert!(
        !closed.is_empty() && closed.iter().all(|s| *s == pinned),
        "after the long connection closed, new ones with its server {pinned}: {closed:?}\n{}",
        daemon.dump()
    );
    let index: usize = pinned.trim_start_matches("rs").parse().unwrap();
    assert_eq!(
        templates.len(),
        1,
        "the client's template listed 5 s past its timeout: {}",
        listed.stdout
    );
    assert_eq!(
        templates[0]["destination"],
        destination(index).as_str(),
        "{}",
        listed.stdout
    );
}
