//! Tier 2, golden IPv6 packets: scapy writes an input pcap in which a client and five
//! real servers talk to IPv6 services in every mode (DR, NAT, TUN as IPv6-in-IPv6,
//! FullNAT v6 -> v6, and NAT64: FullNAT to an IPv4 real server from an IPv4 local
//! address), both directions, with ICMPv6 errors about sessions (NAT's and FullNAT's
//! port unreachable and FullNAT's Packet Too Big translated back to the client, NAT64's
//! ICMPv4 port unreachable translated to ICMPv6 as RFC 7915 says, and the client's
//! port unreachable about each UDP answer back to the real server), a Neighbor
//! Solicitation for the appliance's IPv6 address and echo requests to it and to the
//! VIP. Sluice reads it through net_pcap and writes what it sends to an output pcap,
//! which `tests/tools/golden_ipv6.py check` compares with frames scapy builds from the
//! tool's constants: byte for byte, with every checksum recomputed by scapy, and
//! decoded by tshark with checksum validation on (addresses, ports, hop limits, ICMPv6
//! types, the NA's flags, every checksum good).
//!
//! The local ports of FullNAT and NAT64 sessions are Sluice's choice, and the real
//! servers' frames must be addressed to them, so the run has two phases: the client's
//! frames alone first (the tool learns each session's local address and port from the
//! output, checking the address is the service's and the port in range), then a fresh
//! daemon with the same frames followed by the real servers' answers to those ports.
//! One worker takes the same ports for the same input: the second phase's output is
//! checked against the learned ports, so a different choice fails it.
//!
//! Run: `cargo test --release --test integration golden_ipv6::` (as root; about 14 s,
//! the checker self-test about 20 s).

use crate::common::*;
use serde_json::Value;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const OUR_MAC: &str = "02:53:4c:00:00:01";
/// The appliance's addresses (`golden_ipv6.py`'s OUR_IP4 and OUR_IP6).
const OUR_ADDRS: [&str; 2] = ["198.18.0.1/24", "2001:db8:18::1/64"];
/// Sessions of the second phase: DR, NAT TCP and UDP, TUN, FullNAT TCP and UDP,
/// NAT64 TCP and UDP.
const SESSIONS: u64 = 8;

fn golden_tool() -> std::path::PathBuf {
    tool("golden_ipv6.py")
}

fn python(args: &[&std::ffi::OsStr], what: &str) -> CmdOutput {
    let out = run_bounded(
        Command::new(PYTHON).arg(golden_tool()).args(args),
        Duration::from_secs(120),
    );
    eprintln!("{}", out.stdout);
    assert!(out.success(), "{what} failed: {}", out.describe());
    out
}

/// What a phase leaves: the counters once the input was processed, the services.
struct Phase {
    status: Value,
    list: Value,
}

/// Sluice on net_pcap reading `in_pcap` once and writing `out_pcap`; returns once
/// every input frame was received and processed, the counters stood still, and the
/// daemon exited cleanly (closing `out_pcap`).
fn run_phase(in_pcap: &Path, out_pcap: &Path, input_frames: u64, outputs: u64) -> Phase {
    let services = run_bounded(
        Command::new(PYTHON).arg(golden_tool()).arg("config"),
        Duration::from_secs(60),
    )
    .expect_success("golden_ipv6.py config");
    let mut cfg = DaemonConfig::new(Vec::new());
    let vdev = format!(
        "net_pcap0,rx_pcap={},tx_pcap={}",
        in_pcap.display(),
        out_pcap.display()
    );
    cfg.ports = vec![PortSpec::vdev("lan0", &vdev, &OUR_ADDRS).with_mac(OUR_MAC)];
    cfg.extra_toml.push(services.stdout);
    let mut daemon = Daemon::start(cfg);
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
    // If outputs are missing, go on after 5 s: the checker says which.
    let _ = wait_for(Duration::from_secs(5), Duration::from_millis(100), || {
        (port_counter(&daemon.status(), "lan0", "tx_packets") >= outputs).then_some(())
    });
    std::thread::sleep(Duration::from_millis(300));
    let before = daemon.status();
    std::thread::sleep(Duration::from_millis(300));
    let status = daemon.status();
    assert_eq!(
        (&before["drops"], &before["events"]),
        (&status["drops"], &status["events"]),
        "counters still moving after the input ended"
    );
    let list = daemon.list_services();
    let exit = daemon.terminate();
    assert!(
        exit.success(),
        "sluice exited with {exit}\n{}",
        daemon.dump()
    );
    assert!(
        dpdk_runtime_dirs(&daemon.config.file_prefix).is_empty(),
        "DPDK runtime dir left behind"
    );
    Phase { status, list }
}

fn expectations(path: &Path) -> (Value, u64, u64) {
    let expect: Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).expect("expectations JSON");
    let frames = expect["input_frames"].as_u64().unwrap();
    let outputs = expect["outputs"].as_array().unwrap().len() as u64;
    (expect, frames, outputs)
}

/// The checker must accept the expected frames and reject broken ones (a checksum, a
/// port, an address, the NA's flag, the NAT64 MSS, the quotes, a hop limit, the
/// tunnel's flow label, the echo data, a missing, an extra and two swapped frames;
/// see `golden_ipv6.py selftest`). Needs scapy and tshark, not root.
#[test]
fn golden_ipv6_checker_rejects_broken_output() {
    assert_checker_selftest("golden_ipv6.py", 15);
}

#[test]
fn golden_ipv6_every_mode_nat64_icmpv6_nd_and_echo() {
    require_root();
    let dir = tempfile::Builder::new()
        .prefix(&format!("sluice-golden6-{}-", unique_tag()))
        .tempdir()
        .expect("temp dir");
    let p = |name: &str| dir.path().join(name);

    // Phase 1: the client's frames; learn the local ends Sluice picked.
    python(
        &[
            "make".as_ref(),
            p("in1.pcap").as_os_str(),
            p("expect1.json").as_os_str(),
        ],
        "golden_ipv6.py make (phase 1)",
    );
    let (_, frames1, outputs1) = expectations(&p("expect1.json"));
    run_phase(&p("in1.pcap"), &p("out1.pcap"), frames1, outputs1);
    python(
        &[
            "learn".as_ref(),
            p("out1.pcap").as_os_str(),
            p("lports.json").as_os_str(),
        ],
        "golden_ipv6.py learn",
    );

    // Phase 2: the same frames, then the real servers' answers to those ports.
    python(
        &[
            "make".as_ref(),
            p("in2.pcap").as_os_str(),
            p("expect2.json").as_os_str(),
            "--lports".as_ref(),
            p("lports.json").as_os_str(),
        ],
        "golden_ipv6.py make (phase 2)",
    );
    let (expect, input_frames, outputs) = expectations(&p("expect2.json"));
    assert!(
        input_frames >= 25 && outputs >= 20,
        "suspiciously small fixture: {input_frames} frames, {outputs} outputs"
    );
    let Phase { status, list } = run_phase(&p("in2.pcap"), &p("out2.pcap"), input_frames, outputs);
    let check = run_bounded(
        Command::new(PYTHON)
            .arg(golden_tool())
            .arg("check")
            .arg(p("out2.pcap"))
            .arg(p("expect2.json")),
        Duration::from_secs(120),
    );
    eprintln!("{}", check.stdout);
    assert!(
        check.success(),
        "golden IPv6 check failed:\n{}",
        check.describe()
    );

    // Counters: every frame received, every drop reason exactly (the real servers'
    // advertisements and ARP reply, learned then dropped), the sessions, the port.
    let summary: Value = std::fs::read_to_string(p("expect2.json.summary"))
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or(Value::Null);
    let chatter = summary["chatter"].as_u64().unwrap_or(0);
    let mut problems = Mismatches::default();
    problems.port_lan0(&status, input_frames, outputs, chatter);
    let want_drops = expect["drops"].as_object().unwrap();
    let got_drops = status["drops"].as_object().expect("status.drops");
    let mut reasons: Vec<&String> = want_drops.keys().chain(got_drops.keys()).collect();
    reasons.sort();
    reasons.dedup();
    for reason in reasons {
        let want = want_drops.get(reason).and_then(Value::as_u64).unwrap_or(0);
        problems.eq(format!("drops.{reason}"), drop_count(&status, reason), want);
    }
    for field in ["sessions", "sessions_created"] {
        problems.eq(
            field.into(),
            status[field].as_u64().unwrap_or(u64::MAX),
            SESSIONS,
        );
    }
    // One connection per service, each on its configured real server and mode.
    for (proto, port, rip, mode) in [
        ("tcp", 81, "2001:db8:18::11", "dr"),
        ("tcp", 80, "2001:db8:18::12", "nat"),
        ("udp", 53, "2001:db8:18::12", "nat"),
        ("tcp", 82, "2001:db8:18::13", "tun"),
        ("tcp", 83, "2001:db8:18::14", "fullnat"),
        ("udp", 54, "2001:db8:18::14", "fullnat"),
        ("tcp", 84, "198.18.0.15", "fullnat"),
        ("udp", 55, "198.18.0.15", "fullnat"),
    ] {
        let rs = real_server(&list, proto, "2001:db8:18::100", port, rip);
        if rs["mode"] != mode {
            problems.fail(format!("{proto} {port} -> {rip}: mode {}", rs["mode"]));
        }
        problems.eq(
            format!("{proto} {port} -> {rip} connections"),
            rs_counter(rs, "connections"),
            1,
        );
    }
    assert!(
        problems.is_empty(),
        "status counters differ from the expectations:\n  {}\nstatus: {status:#}\nservices: {list:#}",
        problems.report()
    );
}
