//! Tier 2, golden packets for the forwarding core: scapy writes an input pcap in which
//! a client talks to a DR, a NAT and a TUN virtual service (TCP handshake, data and
//! FIN; UDP request and, for NAT, reply; ICMP errors of each session; every malformed
//! class in between; an oversize DF packet for TUN), a NAT rr service over two real
//! servers (a SYN reusing the port of a connection in TIME_WAIT goes to the next real
//! server, one on an ESTABLISHED connection stays), a second NAT VIP sharing the NAT real
//! server (same client port to both: `nat_tuple_in_use`), and five real servers answer
//! Sluice's ARP and, for NAT, the client. Sluice reads it through net_pcap, and the
//! output is checked frame by frame by scapy and tshark (IPv4/TCP/UDP/ICMP checksum
//! validation on), the drop counters, the session counts and the real-server
//! statistics exactly.
//!
//! Run: `cargo test --release --test integration golden_forwarding::` (as root).

use crate::common::*;
use serde_json::Value;
use std::process::Command;
use std::time::Duration;

const OUR_MAC: &str = "02:53:4c:00:00:01";
const OUR_ADDR: &str = "198.18.0.1/24";

fn golden_tool() -> std::path::PathBuf {
    tool("golden_forwarding.py")
}

/// The checker itself: it must accept the expected frames and reject a set of broken
/// variants (flipped payload byte, TTL changed, wrong port, missing, extra and swapped
/// frames, an ARP request for a stranger, a reused-port SYN sent to the old real
/// server). Needs scapy and tshark, not root.
#[test]
fn golden_forwarding_checker_rejects_broken_output() {
    let dir = tempfile::Builder::new()
        .prefix(&format!("sluice-gf-selftest-{}-", unique_tag()))
        .tempdir()
        .expect("temp dir");
    let out = run_bounded(
        Command::new(PYTHON)
            .arg(golden_tool())
            .arg("selftest")
            .arg(dir.path()),
        Duration::from_secs(300),
    );
    assert!(
        out.success(),
        "checker self-test failed: {}",
        out.describe()
    );
    assert!(
        out.stdout.contains("selftest OK"),
        "self-test output: {}",
        out.stdout
    );
}

/// DR, NAT and TUN with TCP and UDP, ICMP errors, frag-needed, every malformed class,
/// port reuse after a finished connection and the NAT tuple conflict, in one run.
#[test]
fn golden_dr_nat_tun_forwarding_and_malformed_drops() {
    require_root();
    let cfg = DaemonConfig::new(Vec::new());
    let in_pcap = cfg.path("in.pcap");
    let out_pcap = cfg.path("out.pcap");
    let expect_json = cfg.path("expect.json");
    let summary_json = cfg.path("summary.json");

    // 1. Input frames, expectations and the services config.
    run_bounded(
        Command::new(PYTHON)
            .arg(golden_tool())
            .arg("make")
            .arg(&in_pcap)
            .arg(&expect_json),
        Duration::from_secs(120),
    )
    .expect_success("golden_forwarding.py make");
    let expect: Value = serde_json::from_str(&std::fs::read_to_string(&expect_json).unwrap())
        .expect("expectations JSON");
    let input_frames = expect["input_frames"].as_u64().unwrap();
    let outputs = expect["outputs"].as_array().unwrap().len() as u64;
    assert!(
        input_frames >= 50 && outputs >= 30,
        "suspiciously small fixture"
    );

    // 2. Sluice on net_pcap with the services.
    let mut cfg = cfg;
    let vdev = format!(
        "net_pcap0,rx_pcap={},tx_pcap={}",
        in_pcap.display(),
        out_pcap.display()
    );
    cfg.ports = vec![PortSpec::vdev("lan0", &vdev, &[OUR_ADDR]).with_mac(OUR_MAC)];
    cfg.extra_toml
        .push(expect["services_toml"].as_str().unwrap().to_string());
    let mut daemon = Daemon::start(cfg);

    // Every input frame received by the port and the worker; then (bounded) every
    // expected output sent. If outputs are missing, go on: the checker says which.
    let worker_rx = |s: &Value| -> u64 {
        s["lcores"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|l| l["rx_packets"].as_u64())
            .sum()
    };
    let received = wait_for(Duration::from_secs(20), Duration::from_millis(100), || {
        let s = daemon.status();
        (port_counter(&s, "lan0", "rx_packets") >= input_frames && worker_rx(&s) >= input_frames)
            .then_some(())
    });
    assert!(
        received.is_some(),
        "sluice did not receive all {input_frames} input frames within 20 s; last status: {}\n{}",
        daemon.status(),
        daemon.dump()
    );
    let _ = wait_for(Duration::from_secs(5), Duration::from_millis(100), || {
        (port_counter(&daemon.status(), "lan0", "tx_packets") >= outputs).then_some(())
    });
    // Nothing more can arrive (the pcap PMD reads its file once); settle, re-read.
    // (Sluice's own ARP requests for real servers it does not know may still go out.)
    std::thread::sleep(Duration::from_millis(300));
    let before = daemon.status();
    std::thread::sleep(Duration::from_millis(300));
    let status = daemon.status();
    assert_eq!(
        (
            before["drops"].clone(),
            port_counter(&before, "lan0", "rx_packets")
        ),
        (
            status["drops"].clone(),
            port_counter(&status, "lan0", "rx_packets")
        ),
        "counters still moving after the input ended"
    );
    let list = daemon.list_services();

    // 3. SIGTERM closes the port, which flushes out.pcap.
    let exit = daemon.terminate();
    assert!(
        exit.success(),
        "sluice exited with {exit}\n{}",
        daemon.dump()
    );

    // 4. The output, frame by frame.
    let check = run_bounded(
        Command::new(PYTHON)
            .arg(golden_tool())
            .arg("check")
            .arg(&in_pcap)
            .arg(&out_pcap)
            .arg(&expect_json)
            .arg(&summary_json),
        Duration::from_secs(180),
    );
    eprintln!("{}", check.stdout);
    let summary: Value = std::fs::read_to_string(&summary_json)
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or(Value::Null);
    let arp_requests = summary["arp_requests"].as_u64().unwrap_or(0);

    // 5. Counters: port and lcore packet counts, every drop reason exactly, events,
    // sessions, and the real servers' statistics.
    // Sluice may ARP for the real servers on its own (at start, before their replies
    // in the input are read).
    let mut problems = Mismatches::default();
    problems.port_lan0(&status, input_frames, outputs, arp_requests);
    // Each real server's ARP reply comes first in the input, so no packet ever waits
    // for a neighbour: neighbour_unresolved is 0 even when Sluice ARPs on its own.
    // Every drop reason exactly, events, neighbours, and the live, created and expired
    // sessions: nothing times out during the run, so the expired ones are exactly those
    // a SYN retired by reusing a finished connection's tuple. Real servers (ipvsadm -Ln
    // --stats), per VIP: exact connections, active (the connections still ESTABLISHED)
    // and inactive (the others, less those retired); packet counts between the TCP/UDP
    // frames forwarded and those plus the ICMP errors and too-big packets of their
    // sessions.
    problems
        .0
        .extend(golden_counter_mismatches(&status, &list, &expect).0);

    assert!(
        check.success(),
        "golden check failed:\n{}\ncounters:\n  {}\n{}",
        check.describe(),
        problems.0.join("\n  "),
        daemon.dump()
    );
    assert!(
        problems.0.is_empty(),
        "status counters differ from the expectations:\n  {}\nstatus: {status:#}\nservices: {list:#}",
        problems.0.join("\n  ")
    );
    assert!(
        dpdk_runtime_dirs(&daemon.config.file_prefix).is_empty(),
        "DPDK runtime dir left behind"
    );
}
