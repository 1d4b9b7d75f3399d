//! Tier 2, golden packets: scapy writes an input pcap (ARP and ICMP echo for the
//! appliance, plus one frame for every drop reason), Sluice reads it through DPDK's
//! net_pcap driver and writes its replies to an output pcap, and an independent
//! decoder pair (scapy and tshark, checksum validation on) checks every reply byte
//! for byte and field by field. The drop and event counters in `sluicectl status`
//! must match the expectations exactly.
//!
//! Run: `cargo test --release --test integration golden_pcap::` (as root).

use crate::common::*;
use std::process::Command;
use std::time::Duration;

const OUR_MAC: &str = "02:53:4c:00:00:01";
const OUR_ADDR: &str = "198.18.0.1/24";

/// Every reply kind and every drop reason (see FRAMES in the tool).
#[test]
fn golden_arp_and_icmp_replies_and_drop_counters() {
    run_golden("main");
}

/// One's-complement corner cases of the echo reply's ICMP checksum: a reply whose
/// checksum is 0x0000, a request carrying 0xffff for 0x0000, and an all-zero reply
/// message (id 0, seq 0, no data: scapy's default `ICMP()`) whose only valid
/// checksum is 0xffff.
#[test]
fn golden_icmp_checksum_corner_cases() {
    run_golden("checksum-corners");
}

/// A port at MTU 9000: echo requests in 1500-byte to 9000-byte packets (one of them
/// VLAN-tagged) are each received whole and answered in full.
#[test]
fn golden_jumbo_frames_are_answered_whole() {
    run_golden_with("jumbo", &["mtu = 9000"]);
}

/// make -> sluice on net_pcap -> check, then the status counters against the
/// expectations.
fn run_golden(set: &str) {
    run_golden_with(set, &[]);
}

/// [`run_golden`] with more lines for the port's entry (`port_settings`).
fn run_golden_with(set: &str, port_settings: &[&str]) {
    require_root();
    let cfg = DaemonConfig::new(Vec::new());
    let in_pcap = cfg.path("in.pcap");
    let out_pcap = cfg.path("out.pcap");
    let expect_json = cfg.path("expect.json");
    let tool = tool("golden_arp_icmp.py");

    // 1. Input frames and expectations.
    run_bounded(
        Command::new(PYTHON)
            .arg(&tool)
            .arg("make")
            .args(["--set", set])
            .arg(&in_pcap)
            .arg(&expect_json),
        Duration::from_secs(120),
    )
    .expect_success("golden_arp_icmp.py make");
    let expect: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&expect_json).unwrap())
            .expect("expectations JSON");
    let input_frames = expect["input_frames"].as_u64().unwrap();
    let replies = expect["replies"].as_array().unwrap().len() as u64;
    assert!(
        input_frames >= 4 && replies >= 3,
        "suspiciously small fixture: {expect}"
    );

    // 2. Sluice on net_pcap: reads in.pcap once, writes replies to out.pcap.
    let mut cfg = cfg;
    let vdev = format!(
        "net_pcap0,rx_pcap={},tx_pcap={}",
        in_pcap.display(),
        out_pcap.display()
    );
    let mut port = PortSpec::vdev("lan0", &vdev, &[OUR_ADDR]).with_mac(OUR_MAC);
    port.settings = port_settings.iter().map(|s| s.to_string()).collect();
    cfg.ports = vec![port];
    let mut daemon = Daemon::start(cfg);

    // Everything read, processed by the worker, and the replies handed to the PMD.
    let status = wait_for(Duration::from_secs(20), Duration::from_millis(100), || {
        let s = daemon.status();
        let port_rx = port_counter(&s, "lan0", "rx_packets");
        let port_tx = port_counter(&s, "lan0", "tx_packets");
        let worker_rx: u64 = s["lcores"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|l| l["rx_packets"].as_u64())
            .sum();
        (port_rx >= input_frames && worker_rx >= input_frames && port_tx >= replies).then_some(s)
    })
    .unwrap_or_else(|| {
        panic!(
            "sluice did not process all {input_frames} input frames within 20 s; last status: {}\n{}",
            daemon.status(),
            daemon.dump()
        )
    });
    // Nothing more can arrive (the pcap PMD reads its file once); settle, re-read.
    std::thread::sleep(Duration::from_millis(300));
    let status_after = daemon.status();
    assert_eq!(
        status["drops"], status_after["drops"],
        "counters still moving after input end"
    );
    let status = status_after;

    // 3. SIGTERM: the port is stopped and closed, which flushes out.pcap.
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

    // 4. The replies, checked by scapy and tshark.
    let check = run_bounded(
        Command::new(PYTHON)
            .arg(&tool)
            .arg("check")
            .arg(&in_pcap)
            .arg(&out_pcap)
            .arg(&expect_json),
        Duration::from_secs(120),
    );
    assert!(
        check.success(),
        "golden check failed:\n{}\n{}",
        check.describe(),
        daemon.dump()
    );
    eprintln!("{}", check.stdout);

    // 5. Counters: port and lcore packet counts, every drop reason, every event.
    let mut problems = Vec::new();
    let mut expect_eq = |what: String, got: u64, want: u64| {
        if got != want {
            problems.push(format!("{what}: got {got}, expected {want}"));
        }
    };
    expect_eq(
        "ports[lan0].rx_packets".into(),
        port_counter(&status, "lan0", "rx_packets"),
        input_frames,
    );
    expect_eq(
        "ports[lan0].tx_packets".into(),
        port_counter(&status, "lan0", "tx_packets"),
        replies,
    );
    for field in ["rx_missed", "rx_errors", "tx_errors", "rx_nombuf"] {
        expect_eq(
            format!("ports[lan0].{field}"),
            port_counter(&status, "lan0", field),
            0,
        );
    }
    let lcore_sum = |field: &str| -> u64 {
        status["lcores"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|l| l[field].as_u64())
            .sum()
    };
    expect_eq(
        "sum(lcores.rx_packets)".into(),
        lcore_sum("rx_packets"),
        input_frames,
    );
    expect_eq(
        "sum(lcores.tx_packets)".into(),
        lcore_sum("tx_packets"),
        replies,
    );

    let want_drops = expect["drops"].as_object().unwrap();
    let got_drops = status["drops"]
        .as_object()
        .expect("status.drops is an object");
    let mut reasons: Vec<&String> = want_drops.keys().chain(got_drops.keys()).collect();
    reasons.sort();
    reasons.dedup();
    for reason in reasons {
        let want = want_drops.get(reason).and_then(|v| v.as_u64()).unwrap_or(0);
        expect_eq(format!("drops.{reason}"), drop_count(&status, reason), want);
    }
    let total_drops: u64 = want_drops.values().filter_map(|v| v.as_u64()).sum();
    expect_eq(
        "input frames - replies - drops".into(),
        input_frames - replies - total_drops,
        0,
    );
    for (event, want) in expect["events"].as_object().unwrap() {
        expect_eq(
            format!("events.{event}"),
            event_count(&status, event),
            want.as_u64().unwrap(),
        );
    }
    expect_eq(
        "neighbours".into(),
        status["neighbours"].as_u64().unwrap_or(u64::MAX),
        expect["events"]["neighbour_learned"].as_u64().unwrap(),
    );
    assert!(
        problems.is_empty(),
        "status counters differ from the expectations:\n  {}\nstatus: {status:#}\nframes: {:#}",
        problems.join("\n  "),
        expect["frames"]
    );
}
