//! Tier 3, several workers on a device that does not hash as Sluice's Toeplitz view:
//! net_af_packet with `qpairs=2`, whose queues the kernel's packet-fanout hash (seeded,
//! symmetric, not Toeplitz, no redirection table) chooses. Two workers share CPU 1, as
//! a user in a VM without a DPDK NIC would run them. Real kernel TCP clients and
//! servers in namespaces (scripts/testbed.sh), real servers running
//! `tests/tools/e2e_apps.py serve`.
//!
//! For NAT (client on its own subnet, real servers routed through Sluice) and FullNAT
//! (two local addresses, real servers answering them on-link):
//! - `sluicectl status` says the port is steered in software, and why;
//! - 300 new connections (curl, 4 at a time, each bounded to 5 s) all succeed;
//! - 20 keep-alive connections exchange a line every 200 ms for 5 s, none fails, each
//!   stays on its real server;
//! - the workers redirected packets to each other (the fanout put some on the other
//!   worker's queue; with 300 connections the chance that none did is 2^-600) and
//!   dropped none as `not_local` or `tcp_no_session`, the drops that lost
//!   connections when the workers trusted their Toeplitz view of this device.
//!
//! Run: `cargo test --release --test integration e2e_multi_worker::` (as root).

use crate::common::*;
use std::time::Duration;

const WORKERS: u32 = 2;
const CONNECTIONS: u64 = 300;
const PARALLEL: u32 = 4;
const HTTP_PORT: u16 = 8080;
const ECHO_PORT: u16 = 7000;
const LONG: u32 = 20;

fn real_servers(
    lab: &AppLab,
    port: u16,
    mode: &'static str,
) -> Vec<(String, u16, u32, &'static str)> {
    (1..=3)
        .map(|i| (lab.bed.rs_ip(i).to_string(), port, 1, mode))
        .collect()
}

fn services(lab: &AppLab, vip: &str, mode: &'static str, extra: &[String]) -> String {
    let http = real_servers(lab, HTTP_PORT, mode);
    let echo = real_servers(lab, ECHO_PORT, mode);
    fn as_refs<'a>(v: &'a [(String, u16, u32, &'static str)]) -> Vec<(&'a str, u16, u32, &'a str)> {
        v.iter()
            .map(|(a, p, w, m)| (a.as_str(), *p, *w, *m))
            .collect()
    }
    [
        service_section("tcp", vip, 80, "rr", extra, &as_refs(&http)),
        service_section("tcp", vip, ECHO_PORT, "rr", extra, &as_refs(&echo)),
    ]
    .join("\n")
}

/// 300 new connections, then 20 keep-alive connections for 5 s, then the counters.
fn run_checks(lab: &AppLab, daemon: &Daemon, vip: &str) {
    let status = daemon.status();
    let lan = port(&status, "lan0");
    assert_eq!(lan["ownership"], "steered", "{lan:#}");
    assert!(
        lan["ownership_detail"]
            .as_str()
            .is_some_and(|d| d.contains("no Toeplitz RSS")),
        "{lan:#}"
    );

    let batch = lab.curl(&format!("http://{vip}/"), CONNECTIONS, PARALLEL, &[]);
    assert_eq!(
        batch["ok"].as_u64(),
        Some(CONNECTIONS),
        "not every connection succeeded: {batch:#}\nstatus: {:#}\n{}\n{}",
        daemon.status(),
        daemon.dump(),
        lab.diagnostics()
    );

    let out = lab.dir.path().join("stream.json");
    let (out_s, long_s) = (out.to_string_lossy().into_owned(), LONG.to_string());
    let stream = lab.bed.exec(
        lab.bed.client_ns(),
        &[
            PYTHON,
            &AppLab::apps(),
            "stream",
            vip,
            &ECHO_PORT.to_string(),
            "--long",
            &long_s,
            "--interval-ms",
            "200",
            "--new-per-s",
            "0",
            "--duration",
            "5",
            "--timeout",
            "5",
            "--out",
            &out_s,
        ],
        Duration::from_secs(40),
    );
    let v: serde_json::Value = serde_json::from_str(stream.stdout.trim())
        .unwrap_or_else(|e| panic!("stream printed no JSON ({e}): {}", stream.describe()));
    let longs = v["long"].as_array().expect("long connections");
    assert_eq!(longs.len(), LONG as usize);
    for (i, l) in longs.iter().enumerate() {
        assert!(
            l["failures"].as_array().is_some_and(|f| f.is_empty()) && !l["server"].is_null(),
            "keep-alive connection {i} failed: {l}\nstatus: {:#}\n{}",
            daemon.status(),
            daemon.dump()
        );
        // One line every 200 ms for 5 s: at least 20 answers each.
        assert!(
            l["ok"].as_u64().unwrap_or(0) >= 20,
            "keep-alive connection {i} answered only {} lines: {l}",
            l["ok"]
        );
    }

    let status = daemon.status();
    eprintln!(
        "redirected_out {} redirected_in {}",
        event_count(&status, "redirected_out"),
        event_count(&status, "redirected_in")
    );
    assert!(
        event_count(&status, "redirected_out") > 0,
        "no packet landed off its owner: the test did not exercise steering: {status:#}"
    );
    assert_eq!(
        event_count(&status, "redirected_out"),
        event_count(&status, "redirected_in"),
        "every steered packet is received by its owner: {status:#}"
    );
    for reason in ["not_local", "tcp_no_session", "redirect_ring_full"] {
        assert_eq!(drop_count(&status, reason), 0, "{reason}: {status:#}");
    }
    lab.assert_no_checksum_errors();
}

#[test]
fn nat_with_two_workers_on_af_packet_fanout_loses_no_connection() {
    require_root();
    let mut lab = AppLab::new(3);
    lab.bed
        .configure("client-addr", &["198.18.2.100/24", "198.18.2.1"]);
    lab.bed.configure("rs-gateway", &[AppLab::APPLIANCE]);
    lab.start_servers_listening(&[
        ("--http", &format!("0.0.0.0:{HTTP_PORT}")),
        ("--echo", &format!("0.0.0.0:{ECHO_PORT}")),
    ]);
    let vip = "198.18.1.1";
    let daemon = lab.daemon_with_workers(
        &[&format!("{}/24", AppLab::APPLIANCE), "198.18.2.1/24"],
        services(&lab, vip, "nat", &[]),
        WORKERS,
    );
    lab.prewarm(&daemon, "198.18.2.1");
    run_checks(&lab, &daemon, vip);
}

#[test]
fn fullnat_with_two_workers_on_af_packet_fanout_loses_no_connection() {
    require_root();
    let mut lab = AppLab::new(3);
    lab.start_servers_listening(&[
        ("--http", &format!("0.0.0.0:{HTTP_PORT}")),
        ("--echo", &format!("0.0.0.0:{ECHO_PORT}")),
    ]);
    let vip = "198.18.0.240";
    let lips = vec!["local_addresses = [\"198.18.0.50\", \"198.18.0.51\"]".to_string()];
    let daemon = lab.daemon_with_workers(
        &[&format!("{}/24", AppLab::APPLIANCE)],
        services(&lab, vip, "fullnat", &lips),
        WORKERS,
    );
    lab.prewarm(&daemon, vip);
    run_checks(&lab, &daemon, vip);
}
