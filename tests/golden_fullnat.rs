//! Tier 2, golden packets for FullNAT (`mode = "fullnat"`, DPVS's `-b`): a TCP and a
//! UDP service on one VIP, rr over two real servers, two local addresses (LIPs). A
//! client opens three TCP connections (one complete: handshake, data both ways, FIN
//! both ways; two left established, one of them to the same real server on the same
//! LIP as the first) and three UDP flows (a reply, a port unreachable from the real
//! server, a port unreachable from the client about a reply, a datagram without
//! checksum); the real servers resolve the LIPs (ARP) and ping one; a few frames are
//! dropped on purpose (no session, no service, an ARP for an address that is not
//! Sluice's, an ICMP error quoting no session).
//!
//! The local port of a session is Sluice's choice, and the real server must reply to
//! it, so the input cannot be written in advance: `tests/tools/golden_fullnat.py run`
//! plays client and real servers live, frame by frame, on the test bed's client veth
//! while Sluice receives on the appliance veth (`net_pcap`, `rx_iface_in=`) and writes
//! what it sends to `out.pcap` (`tx_pcap=`). The tool learns each session's LIP:lport
//! from its first output and addresses the real server's frames to it. Then `check`
//! rebuilds the input from the script and those bindings, checks the bindings (LIP of
//! the service, round robin; lport in 1024..=65535, distinct per concurrent session
//! towards one real server) and runs golden_forwarding.py's checker on the output
//! (scapy and tshark, every field and checksum, order, nothing extra but Sluice's own
//! ARP requests for real servers). Counters (drops, events, sessions, per real
//! server) are compared with the expectations here.
//!
//! Run: `cargo test --release --test golden_fullnat` (as root).
mod common;

use common::*;
use serde_json::Value;
use std::process::Command;
use std::time::Duration;

const OUR_MAC: &str = "02:53:4c:00:00:01";
const OUR_ADDR: &str = "198.18.0.1/24";
const VIP: &str = "198.18.0.240";
const LIPS: [&str; 2] = ["198.18.0.50", "198.18.0.51"];

fn golden_tool() -> std::path::PathBuf {
    tool("golden_fullnat.py")
}

/// The checker must accept the expected frames and reject broken outputs and broken
/// bindings (see `golden_fullnat.py selftest`). Needs scapy and tshark, not root.
#[test]
fn golden_fullnat_checker_rejects_broken_output() {
    let dir = tempfile::Builder::new()
        .prefix(&format!("sluice-gfn-selftest-{}-", unique_tag()))
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
        out.stdout.contains("selftest OK") && out.stdout.matches("as it must").count() >= 20,
        "self-test output: {}",
        out.stdout
    );
}

#[test]
fn golden_fullnat_both_directions_icmp_arp_and_counters() {
    require_root();
    // Only the client and the appliance's veths are used: no real-server namespaces
    // (the tool plays the real servers).
    let bed = Testbed::up(0);
    let mut cfg = DaemonConfig::new(Vec::new());
    let in_pcap = cfg.path("in.pcap");
    let out_pcap = cfg.path("out.pcap");
    let run_json = cfg.path("run.json");
    let expect_json = cfg.path("expect.json");
    let summary_json = cfg.path("summary.json");

    let services = run_bounded(
        Command::new(PYTHON).arg(golden_tool()).arg("config"),
        Duration::from_secs(60),
    )
    .expect_success("golden_fullnat.py config");
    let vdev = format!(
        "net_pcap0,rx_iface_in={},tx_pcap={}",
        bed.lb_if(),
        out_pcap.display()
    );
    cfg.ports = vec![PortSpec::vdev("lan0", &vdev, &[OUR_ADDR]).with_mac(OUR_MAC)];
    cfg.extra_toml.push(services.stdout);
    let cfg = cfg.in_netns(bed.lb_ns());
    let mut daemon = Daemon::start(cfg);
    let rx_before = port_counter(&daemon.status(), "lan0", "rx_packets");
    assert_eq!(
        rx_before,
        0,
        "frames reached the appliance before the run: {:#}",
        daemon.status()
    );

    // 1. Play the script live from the client's namespace (bounded: each frame waits
    // at most 3 s for its outputs).
    let socket = daemon.socket().to_string_lossy().into_owned();
    let run = bed.exec(
        bed.client_ns(),
        &[
            PYTHON,
            &golden_tool().to_string_lossy(),
            "run",
            bed.client_if(),
            &in_pcap.to_string_lossy(),
            &out_pcap.to_string_lossy(),
            &run_json.to_string_lossy(),
            "--sluicectl",
            SLUICECTL,
            "--socket",
            &socket,
        ],
        Duration::from_secs(300),
    );
    eprintln!("{}", run.stdout);
    assert!(
        run.success(),
        "golden_fullnat.py run failed: {}\n{}",
        run.describe(),
        daemon.dump()
    );

    // 2. Counters once the input has ended (settle, then they must stand still).
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

    // 3. SIGTERM closes the port (out.pcap is complete).
    let exit = daemon.terminate();
    assert!(
        exit.success(),
        "sluice exited with {exit}\n{}",
        daemon.dump()
    );

    // 4. The output, frame by frame, and the bindings.
    let check = run_bounded(
        Command::new(PYTHON)
            .arg(golden_tool())
            .arg("check")
            .arg(&in_pcap)
            .arg(&out_pcap)
            .arg(&run_json)
            .arg(&expect_json)
            .arg(&summary_json),
        Duration::from_secs(180),
    );
    eprintln!("{}", check.stdout);
    let expect: Value = std::fs::read_to_string(&expect_json)
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or_else(|| panic!("check wrote no expectations: {}", check.describe()));
    let summary: Value = std::fs::read_to_string(&summary_json)
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or(Value::Null);
    let input_frames = expect["input_frames"].as_u64().unwrap();
    let outputs = expect["outputs"].as_array().unwrap().len() as u64;
    assert!(
        input_frames >= 35 && outputs >= 30,
        "suspiciously small script: {input_frames} frames, {outputs} outputs"
    );

    // 5. Counters: port, drops, events, sessions, real servers, the services' LIPs.
    let mut problems = golden_counter_mismatches(&status, &list, &expect);
    problems.eq(
        "ports[lan0].rx_packets".into(),
        port_counter(&status, "lan0", "rx_packets"),
        input_frames,
    );
    let arp_requests = summary["arp_requests"].as_u64().unwrap_or(0);
    let tx = port_counter(&status, "lan0", "tx_packets");
    if !(outputs..=outputs + arp_requests).contains(&tx) {
        problems.fail(format!(
            "ports[lan0].tx_packets: got {tx}, expected the {outputs} outputs plus at most \
             the {arp_requests} ARP requests from Sluice"
        ));
    }
    for field in ["rx_missed", "rx_errors", "tx_errors", "rx_nombuf"] {
        problems.eq(
            format!("ports[lan0].{field}"),
            port_counter(&status, "lan0", field),
            0,
        );
    }
    for (proto, port) in [("tcp", 80), ("udp", 3333)] {
        let service = find_service(&list, proto, VIP, port)
            .unwrap_or_else(|| panic!("no service {proto} {VIP}:{port}: {list:#}"));
        if service["local_addresses"] != serde_json::json!(LIPS) {
            problems.fail(format!(
                "{proto} {VIP}:{port}: local_addresses {}, expected {LIPS:?}",
                service["local_addresses"]
            ));
        }
    }

    assert!(
        check.success(),
        "golden check failed:\n{}\ncounters:\n  {}\n{}",
        check.describe(),
        problems.report(),
        daemon.dump()
    );
    assert!(
        problems.is_empty(),
        "status counters differ from the expectations:\n  {}\nstatus: {status:#}\nservices: {list:#}",
        problems.report()
    );
    assert!(
        dpdk_runtime_dirs(&daemon.config.file_prefix).is_empty(),
        "DPDK runtime dir left behind"
    );
}
