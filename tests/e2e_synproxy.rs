//! Tier 3, the SYN proxy end to end with real kernels: the NAT layout of
//! `e2e_forwarding` (the client on 198.18.2.0/24 behind Sluice's second address, two
//! real servers whose default route is Sluice) running `tests/tools/e2e_apps.py
//! serve` (HTTP on 8080), Sluice on net_af_packet with two TCP services, both with
//! `synproxy = "on"`: NAT 198.18.1.1:80 and FullNAT 198.18.0.240:80 (local address
//! 198.18.0.50), rr over both real servers.
//!
//! For each service, with the client's timestamps, SACK and window scaling on (Linux's
//! defaults) and then all three off (sysctls in the client's namespace):
//! - 10 curl requests on new connections all succeed;
//! - a 1 MB download (`GET /bytes/1048576`) arrives intact (SHA-256 of the body
//!   against the pattern's);
//! - a 1 MB upload (POST) reaches the real server whole (it answers the byte count).
//!
//! Then: every connection was answered by a cookie and opened by a valid one
//! (`synproxy_cookies_sent`, `synproxy_cookies_valid`, `synproxy_connections` as many
//! as the connections made, no invalid or expired cookie), and no kernel counted a
//! checksum error.
//!
//! With every other SYN-ACK of the real servers lost, every request still succeeds.
//! With every SYN-ACK lost on the switch, a client's reset of a connection its cookie
//! opened must remove the real server's half-open connection within 3 s.
//!
//! Then a spoofed SYN flood, twice: 200 000 SYNs from 198.18.64.0/18 sent through a
//! raw socket from a third namespace (`e2e_apps.py synflood`, paced over 3 s) to an
//! echo service, while the client keeps 20 long-lived keep-alive connections (a line
//! every 100 ms) and opens 20 new ones a second (`e2e_apps.py stream`). The session
//! table holds 4096 sessions. With the proxy on: every long connection survives with
//! no gap over 1 s, at least 99% of the new connections succeed, and no session exists
//! for a spoofed source (`sluicectl -L -n -c --json` right after the flood). The same
//! flood to a twin service with the proxy off must leave spoofed sessions behind (so
//! the flood did reach Sluice); both runs are printed side by side.
//!
//! Run: `cargo test --release --test integration e2e_synproxy::` (as root).

use crate::common::*;
use std::time::Duration;

const APPLIANCE: &str = "198.18.0.1";
const NAT_CLIENT: &str = "198.18.2.100/24";
const NAT_GATEWAY: &str = "198.18.2.1";
const NAT_VIP: &str = "198.18.1.1";
const FULLNAT_VIP: &str = "198.18.0.240";
const LIP: &str = "198.18.0.50";
const HTTP_PORT: u16 = 8080;
const MB: usize = 1 << 20;

/// SHA-256 (hex) of `n` bytes of `e2e_apps.py`'s pattern, as Python computes it.
fn pattern_sha256(lab: &AppLab, n: usize) -> String {
    let code = format!(
        "import hashlib; print(hashlib.sha256(bytes((i * 7) & 0xFF for i in range({n}))).hexdigest())"
    );
    let out = lab.bed.exec(
        lab.bed.client_ns(),
        &[PYTHON, "-c", &code],
        Duration::from_secs(30),
    );
    out.stdout.trim().to_string()
}

/// Sets the client's TCP timestamps, SACK and window scaling sysctls to `on`.
fn client_tcp_options(lab: &AppLab, on: bool) {
    let v = if on { "1" } else { "0" };
    for key in ["tcp_timestamps", "tcp_sack", "tcp_window_scaling"] {
        lab.bed
            .exec(
                lab.bed.client_ns(),
                &["sysctl", "-q", "-w", &format!("net.ipv4.{key}={v}")],
                Duration::from_secs(10),
            )
            .expect_success("sysctl");
    }
}

/// 10 requests, a 1 MB download checked by digest and a 1 MB upload to `vip`.
/// Returns the connections made (12).
fn exercise(lab: &AppLab, daemon: &Daemon, vip: &str, digest: &str, what: &str) -> u64 {
    let batch = lab.curl(&format!("http://{vip}/"), 10, 2, &[]);
    assert_eq!(
        batch["ok"].as_u64(),
        Some(10),
        "{what}: not every request through the SYN proxy succeeded: {batch:#}\nstatus: {:#}\n{}\n{}",
        daemon.status(),
        daemon.dump(),
        lab.diagnostics()
    );
    let script = format!(
        "curl -sS --noproxy '*' --max-time 20 http://{vip}/bytes/{MB} | sha256sum | cut -d' ' -f1"
    );
    let out = lab.bed.exec(
        lab.bed.client_ns(),
        &["sh", "-c", &script],
        Duration::from_secs(30),
    );
    assert_eq!(
        out.stdout.trim(),
        digest,
        "{what}: the 1 MB download through {vip} is not intact: {}\nstatus: {:#}",
        out.describe(),
        daemon.status()
    );
    let upload = lab.curl(
        &format!("http://{vip}/"),
        1,
        1,
        &["--post-bytes", &MB.to_string(), "--max-time", "20"],
    );
    let bodies = upload["bodies"].as_object().cloned().unwrap_or_default();
    assert!(
        upload["ok"].as_u64() == Some(1)
            && bodies
                .keys()
                .all(|b| b.ends_with(&format!(" {MB}")) && b.starts_with("rs")),
        "{what}: the 1 MB upload through {vip} did not arrive whole: {upload:#}\nstatus: {:#}",
        daemon.status()
    );
    12
}

#[test]
fn synproxy_nat_and_fullnat_carry_transfers_with_and_without_tcp_options() {
    require_root();
    // rs3 serves nothing of the services: it is the attacker's namespace.
    let mut lab = AppLab::new(3);
    lab.bed.configure("client-addr", &[NAT_CLIENT, NAT_GATEWAY]);
    lab.bed.configure("rs-gateway", &[APPLIANCE]);
    let (http, echo) = (
        format!("0.0.0.0:{HTTP_PORT}"),
        format!("0.0.0.0:{ECHO_PORT}"),
    );
    lab.start_servers_listening(&[("--http", &http), ("--echo", &echo)]);
    let rips: Vec<String> = (1..=2).map(|i| lab.bed.rs_ip(i).to_string()).collect();
    let rips = &rips;
    let servers = |mode: &'static str| -> Vec<(&str, u16, u32, &str)> {
        rips.iter()
            .map(|r| (r.as_str(), HTTP_PORT, 1, mode))
            .collect()
    };
    let on = vec!["synproxy = \"on\"".to_string()];
    let fullnat = vec![
        "synproxy = \"on\"".to_string(),
        format!("local_addresses = [\"{LIP}\"]"),
    ];
    let echo_servers: Vec<(&str, u16, u32, &str)> = rips
        .iter()
        .map(|r| (r.as_str(), ECHO_PORT, 1, "nat"))
        .collect();
    let off = vec!["synproxy = \"off\"".to_string()];
    let toml = [
        format!("[sessions]\ncapacity = {CAPACITY}\n"),
        service_section("tcp", NAT_VIP, 80, "rr", &on, &servers("nat")),
        service_section("tcp", FULLNAT_VIP, 80, "rr", &fullnat, &servers("fullnat")),
        service_section("tcp", NAT_VIP, ECHO_VPORT, "rr", &on, &echo_servers),
        service_section("tcp", UNPROXIED_VIP, ECHO_VPORT, "rr", &off, &echo_servers),
    ]
    .join("\n");
    let daemon = lab.daemon(
        &[&format!("{APPLIANCE}/24"), &format!("{NAT_GATEWAY}/24")],
        toml,
    );
    lab.prewarm(&daemon, NAT_GATEWAY);
    let digest = pattern_sha256(&lab, MB);
    assert_eq!(digest.len(), 64, "no digest: {digest:?}");

    let mut connections = 0;
    for options in [true, false] {
        client_tcp_options(&lab, options);
        let what = if options {
            "timestamps, SACK, window scaling on"
        } else {
            "timestamps, SACK, window scaling off"
        };
        for vip in [NAT_VIP, FULLNAT_VIP] {
            connections += exercise(&lab, &daemon, vip, &digest, &format!("{vip}, {what}"));
        }
    }
    client_tcp_options(&lab, true);

    let status = daemon.status();
    let sent = event_count(&status, "synproxy_cookies_sent");
    let valid = event_count(&status, "synproxy_cookies_valid");
    let spliced = event_count(&status, "synproxy_connections");
    let (held, held_sent) = (
        event_count(&status, "synproxy_data_held"),
        event_count(&status, "synproxy_data_sent"),
    );
    eprintln!(
        "{connections} connections: cookies sent {sent}, valid {valid}, spliced {spliced}, \
         invalid {}, expired {}, SYN resent {}, data held {held}, held data sent {held_sent}",
        event_count(&status, "synproxy_cookies_invalid"),
        event_count(&status, "synproxy_cookies_expired"),
        event_count(&status, "synproxy_syn_resent"),
    );
    // curl sends its request right after the handshake's ACK, often before the real
    // server answered Sluice's SYN: those requests wait and go on. So does an upload's
    // whole first flight (its initial window, ten segments). Without the wait, every
    // such segment would go to the server as the SYN again. A client may still send
    // again before a real server slowed by a busy machine answers (a tail loss probe
    // comes after about 10 ms), and that is a SYN resent too: at most one for every
    // two segments held.
    assert_eq!(held, held_sent, "held data not all delivered: {status:#}");
    assert_eq!(drop_count(&status, "server_unanswered"), 0, "{status:#}");
    let resent = event_count(&status, "synproxy_syn_resent");
    assert!(
        resent * 2 <= held,
        "{resent} SYNs resent for {held} segments held: early data went to the server \
         as the SYN instead of waiting: {status:#}"
    );
    // A client may retransmit a SYN (a cookie each time), never fewer.
    assert!(
        sent >= connections,
        "{sent} cookies for {connections}: {status:#}"
    );
    assert_eq!(valid, connections, "{status:#}");
    assert_eq!(spliced, connections, "{status:#}");
    assert_eq!(
        event_count(&status, "synproxy_cookies_invalid"),
        0,
        "{status:#}"
    );
    assert_eq!(
        event_count(&status, "synproxy_cookies_expired"),
        0,
        "{status:#}"
    );
    lab.assert_no_checksum_errors();

    lost_server_synacks(&lab, &daemon, &digest);
    client_reset_before_the_server_answers(&lab, &daemon);

    // The flood, proxy on, then proxy off (which fills the table: last).
    let on = flood(&lab, &daemon, NAT_VIP);
    let off = flood(&lab, &daemon, UNPROXIED_VIP);
    eprintln!("spoofed SYN flood of {FLOOD} (20 long connections, 20 new a second):");
    eprintln!("  proxy on:  {on}");
    eprintln!("  proxy off: {off}");
    assert!(
        on.failed_long.is_empty() && on.long == 20,
        "long connections lost under the flood with the proxy on: {:?}",
        on.failed_long
    );
    assert!(
        on.max_gap_s <= 1.0,
        "a long connection waited {:.2} s with the proxy on",
        on.max_gap_s
    );
    assert!(
        on.new_total >= 20 && on.new_ok * 100 >= on.new_total * 99,
        "only {} of {} new connections succeeded with the proxy on",
        on.new_ok,
        on.new_total
    );
    assert_eq!(
        on.spoofed_sessions, 0,
        "sessions exist for spoofed sources with the proxy on"
    );
    assert!(
        on.cookies >= on.reached / 2,
        "the flood got {} cookies for {} SYNs that reached Sluice",
        on.cookies,
        on.reached
    );
    assert!(
        off.spoofed_sessions > 0,
        "the flood left no session with the proxy off: did it reach Sluice? {off}"
    );
    let mut daemon = daemon;
    daemon.terminate();
}

/// Every other SYN-ACK of the real servers is lost (nft in their namespaces): the
/// client, already connected to Sluice, retransmits its request, which Sluice sends
/// as the SYN again, and the real server answers that (or its own retransmission
/// does). Every request must still succeed, the downloads intact, and every held
/// segment reach its server.
fn lost_server_synacks(lab: &AppLab, daemon: &Daemon, digest: &str) {
    let before = daemon.status();
    for i in 1..=2 {
        let ns = lab.bed.rs_ns(i);
        for command in [
            "add table ip sluice_lose".to_string(),
            "add chain ip sluice_lose out { type filter hook output priority 0; }".to_string(),
            format!(
                "add rule ip sluice_lose out tcp sport {HTTP_PORT} \
                 tcp flags & (syn | ack) == (syn | ack) numgen inc mod 2 == 0 counter drop"
            ),
        ] {
            lab.bed
                .exec(ns, &["nft", &command], Duration::from_secs(10))
                .expect_success("nft add");
        }
    }
    let batch = lab.curl(&format!("http://{NAT_VIP}/"), 10, 2, &["--max-time", "10"]);
    let script = format!(
        "curl -sS --noproxy '*' --max-time 20 http://{FULLNAT_VIP}/bytes/{MB} | sha256sum | cut -d' ' -f1"
    );
    let download = lab.bed.exec(
        lab.bed.client_ns(),
        &["sh", "-c", &script],
        Duration::from_secs(30),
    );
    let mut dropped = 0;
    for i in 1..=2 {
        let ns = lab.bed.rs_ns(i);
        let listed = lab.bed.exec(
            ns,
            &["nft", "list", "table", "ip", "sluice_lose"],
            Duration::from_secs(10),
        );
        // "... counter packets N bytes M drop"
        dropped += listed
            .stdout
            .split("packets ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no loss counter in {}", listed.describe()));
        lab.bed
            .exec(
                ns,
                &["nft", "delete", "table", "ip", "sluice_lose"],
                Duration::from_secs(10),
            )
            .expect_success("nft delete");
    }
    assert!(
        dropped > 0,
        "no server SYN-ACK was lost: the loss rules did not act"
    );
    let after = daemon.status();
    let delta = |name: &str| event_count(&after, name) - event_count(&before, name);
    eprintln!(
        "every other server SYN-ACK lost ({dropped} lost): {} of 10 requests ok, SYN resent {}, \
         data held {}, held data sent {}, spliced {}",
        batch["ok"],
        delta("synproxy_syn_resent"),
        delta("synproxy_data_held"),
        delta("synproxy_data_sent"),
        delta("synproxy_connections"),
    );
    assert_eq!(
        batch["ok"].as_u64(),
        Some(10),
        "requests lost with server SYN-ACKs lost: {batch:#}\nstatus: {after:#}"
    );
    assert_eq!(
        download.stdout.trim(),
        digest,
        "the 1 MB download with a server SYN-ACK lost is not intact: {}",
        download.describe()
    );
    assert_eq!(delta("synproxy_connections"), 11, "{after:#}");
    assert_eq!(
        delta("synproxy_data_held"),
        delta("synproxy_data_sent"),
        "{after:#}"
    );
    assert_eq!(drop_count(&after, "server_unanswered"), 0, "{after:#}");
}

/// Every SYN-ACK of the real servers is lost on the switch (nft on their bridge ports;
/// the servers' own sends succeed, as with a loss on the wire), so each holds a
/// half-open connection for a client that Sluice's cookie handshake has connected.
/// The client resets its connection (SO_LINGER 0): Sluice must pass the reset on, in
/// a form the server takes, and the server's half-open connection must go within 3 s
/// (it would live through its SYN-ACK retries, about a minute, if the reset became
/// a SYN or were dropped). Then the client connects again from the same port (a
/// client reusing its port must not find the reset connection in its way) and resets
/// that one too. For the NAT service, then the FullNAT one.
fn client_reset_before_the_server_answers(lab: &AppLab, daemon: &Daemon) {
    let before = daemon.status();
    let namespaces = [lab.bed.rs_ns(1), lab.bed.rs_ns(2)];
    let switch = lab.bed.fact("SW_NS");
    let nft = |command: &str| {
        lab.bed
            .exec(switch, &["nft", command], Duration::from_secs(10))
            .expect_success("nft")
    };
    nft("add table netdev sluice_mute");
    for i in 1..=2 {
        nft(&format!(
            "add chain netdev sluice_mute in{i} {{ type filter hook ingress device \"{}-pr{i}\" priority 0; }}",
            lab.bed.name
        ));
        nft(&format!(
            "add rule netdev sluice_mute in{i} meta l4proto tcp tcp sport {HTTP_PORT} \
             tcp flags & (syn | ack) == (syn | ack) counter drop"
        ));
    }
    let apps = AppLab::apps();
    let mut runs = Vec::new();
    for vip in [NAT_VIP, FULLNAT_VIP] {
        let port = HTTP_PORT.to_string();
        let mut args = vec![PYTHON, apps.as_str(), "abort", vip, "80"];
        for ns in namespaces {
            args.extend(["--watch", ns]);
        }
        args.extend(["--watch-port", &port, "--timeout", "3", "--again"]);
        let out = lab
            .bed
            .exec(lab.bed.client_ns(), &args, Duration::from_secs(20));
        runs.push((vip, out));
    }
    let listed = nft("list table netdev sluice_mute");
    nft("delete table netdev sluice_mute");
    // "... counter packets N bytes M drop", one per bridge port.
    let lost: u64 = listed
        .stdout
        .split("packets ")
        .skip(1)
        .filter_map(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
        .sum();
    assert!(
        lost > 0,
        "no real server's SYN-ACK was lost on its way: {}",
        listed.describe()
    );
    let after = daemon.status();
    for (vip, out) in &runs {
        eprintln!(
            "client reset before the server answered, {vip}: {}",
            out.stdout.trim()
        );
        assert!(
            out.success(),
            "{vip}: the real server's half-open connection outlived the client's reset, or \
             the client could not connect again from the same port (each run: connected, \
             half_open_before 1, half_open_after 0): {}\nstatus: {after:#}",
            out.describe()
        );
    }
    let delta = |name: &str| event_count(&after, name) - event_count(&before, name);
    assert_eq!(delta("synproxy_client_reset"), 4, "{after:#}");
    assert_eq!(delta("synproxy_syn_resent"), 0, "{after:#}");
}

const ECHO_PORT: u16 = 7777;
const ECHO_VPORT: u16 = 7;
const UNPROXIED_VIP: &str = "198.18.1.2";
const CAPACITY: u32 = 4096;
const FLOOD: u64 = 200_000;
const SPOOFED_NET: &str = "198.18.64.0/18";

/// What one flood run did.
struct FloodRun {
    long: usize,
    failed_long: Vec<String>,
    max_gap_s: f64,
    new_ok: u64,
    new_total: u64,
    /// Sessions listed right after the flood whose client is in SPOOFED_NET.
    spoofed_sessions: usize,
    /// SYNs Sluice received during the run (rx packets), and the cookies it sent.
    reached: u64,
    cookies: u64,
    table_full: u64,
    sent: u64,
}

impl std::fmt::Display for FloodRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} SYNs sent, {} packets reached Sluice, {} cookies; long connections {}/{} \
             (max gap {:.2} s); new connections {}/{} ok; spoofed sessions {}; \
             session_table_full drops {}",
            self.sent,
            self.reached,
            self.cookies,
            self.long - self.failed_long.len(),
            self.long,
            self.max_gap_s,
            self.new_ok,
            self.new_total,
            self.spoofed_sessions,
            self.table_full
        )
    }
}

/// Runs the stream client against `vip`:7 and, once its long connections are open,
/// the flood from rs3's namespace; lists the sessions right after the flood.
fn flood(lab: &AppLab, daemon: &Daemon, vip: &str) -> FloodRun {
    let tag = vip.replace('.', "_");
    let (apps, port_s) = (AppLab::apps(), ECHO_VPORT.to_string());
    let client = lab.stream(
        &tag,
        vip,
        ECHO_VPORT,
        &[
            "--long",
            "20",
            "--interval-ms",
            "100",
            "--new-per-s",
            "20",
            "--duration",
            "6",
            "--timeout",
            "5",
        ],
    );
    let before = daemon.status();
    let rx = |s: &serde_json::Value| port_counter(s, "lan0", "rx_packets");
    let count = FLOOD.to_string();
    let sent = lab.bed.exec(
        lab.bed.rs_ns(3),
        &[
            PYTHON,
            &apps,
            "synflood",
            vip,
            &port_s,
            "--count",
            &count,
            "--net",
            SPOOFED_NET,
            "--seconds",
            "3",
        ],
        Duration::from_secs(40),
    );
    assert!(sent.success(), "synflood: {}", sent.describe());
    let sent: serde_json::Value = serde_json::from_str(sent.stdout.trim()).expect("flood JSON");
    let listed = daemon.ctl(&["-L", "-n", "-c", "--json"]);
    assert!(listed.success(), "{}", listed.describe());
    let listed: serde_json::Value = serde_json::from_str(&listed.stdout).expect("-Lnc JSON");
    let spoofed_sessions = listed["connections"]
        .as_array()
        .expect("connections")
        .iter()
        .filter(|c| {
            let client = c["client"].as_str().unwrap_or("");
            let ip: std::net::Ipv4Addr = client
                .split(':')
                .next()
                .and_then(|a| a.parse().ok())
                .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED);
            u32::from(ip) >> 14 == u32::from(std::net::Ipv4Addr::new(198, 18, 64, 0)) >> 14
        })
        .count();
    let after = daemon.status();
    let report = client.stop_and_report();
    let long = report["long"].as_array().expect("long").clone();
    let failed_long = long
        .iter()
        .enumerate()
        .filter(|(_, r)| {
            !r["failures"].as_array().is_none_or(|f| f.is_empty()) || r["server"].is_null()
        })
        .map(|(i, r)| format!("L{i}: {}", r["failures"]))
        .collect();
    let max_gap_s = long
        .iter()
        .map(|r| r["max_gap_s"].as_f64().unwrap_or(f64::INFINITY))
        .fold(0.0, f64::max);
    let new = report["new"].as_array().expect("new");
    let new_ok = new.iter().filter(|r| r["error"].is_null()).count() as u64;
    let diff = |name: &str| event_count(&after, name) - event_count(&before, name);
    FloodRun {
        long: long.len(),
        failed_long,
        max_gap_s,
        new_ok,
        new_total: new.len() as u64,
        spoofed_sessions,
        reached: rx(&after) - rx(&before),
        cookies: diff("synproxy_cookies_sent"),
        table_full: drop_count(&after, "session_table_full")
            - drop_count(&before, "session_table_full"),
        sent: sent["sent"].as_u64().unwrap_or(0),
    }
}
