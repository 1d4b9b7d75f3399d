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
//! Run: `cargo test --release --test e2e_synproxy` (as root).
mod common;

use common::*;
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
    let mut lab = AppLab::new(2);
    lab.bed.configure("client-addr", &[NAT_CLIENT, NAT_GATEWAY]);
    lab.bed.configure("rs-gateway", &[APPLIANCE]);
    lab.start_servers(&[format!("0.0.0.0:{HTTP_PORT}")], &[]);
    let rips: Vec<String> = (1..=2).map(|i| lab.bed.rs_ip(i).to_string()).collect();
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
    let toml = [
        service_section("tcp", NAT_VIP, 80, "rr", &on, &servers("nat")),
        service_section("tcp", FULLNAT_VIP, 80, "rr", &fullnat, &servers("fullnat")),
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
    eprintln!(
        "{connections} connections: cookies sent {sent}, valid {valid}, spliced {spliced}, \
         invalid {}, expired {}, SYN resent {}",
        event_count(&status, "synproxy_cookies_invalid"),
        event_count(&status, "synproxy_cookies_expired"),
        event_count(&status, "synproxy_syn_resent"),
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
    let mut daemon = daemon;
    daemon.terminate();
}
