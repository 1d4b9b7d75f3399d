//! Tier 2, golden packets for the SYN proxy (`synproxy = "on"`, docs/SYNPROXY.md): a
//! NAT and a FullNAT TCP service, one real server each. Four connections go through
//! the proxied handshake: a Linux client (MSS, SACK-permitted, timestamps, window
//! scale 7) to a Linux server, with data and SACK blocks both ways and a close; a
//! client without timestamps (MSS 1380 only); a FullNAT connection whose server scales
//! by 5 and whose sequence numbers wrap; a server that offers no window scale. A fifth
//! SYN is answered and then three forged ACKs (a hash bit of the cookie flipped,
//! another ISN, another client port) are dropped as invalid.
//!
//! The cookie is a keyed hash under a secret Sluice draws per process, and the client's
//! ACK must carry it, so the input cannot be written in advance (and no test-only
//! fixed secret exists): `tests/tools/golden_synproxy.py run` plays client and real
//! servers live, frame by frame, on the test bed's client veth while Sluice receives on
//! the appliance veth (`net_pcap`, `rx_iface_in=`) and writes what it sends to
//! `out.pcap` (`tx_pcap=`). The tool reads each cookie (and FullNAT's LIP:lport) from
//! Sluice's output and builds the session's later frames with it. `check` rebuilds the
//! input from the script and those bindings, checks what it can recompute of each
//! cookie (MSS index, time slot of the cookie TSval, the client's options in the TSval,
//! the TSval on the wall clock) and runs golden_forwarding.py's checker on the output
//! (scapy and tshark, every field and checksum, order, nothing extra but Sluice's ARP
//! requests for real servers). Counters (drops, events including every `synproxy_*`,
//! sessions, per real server) are compared exactly.
//!
//! Run: `cargo test --release --test golden_synproxy` (as root).
mod common;

use common::*;
use serde_json::Value;
use std::process::Command;
use std::time::Duration;

const OUR_MAC: &str = "02:53:4c:00:00:01";
const OUR_ADDR: &str = "198.18.0.1/24";
const FULLNAT_VIP: &str = "198.18.0.242";
const LIP: &str = "198.18.0.61";

fn golden_tool() -> std::path::PathBuf {
    tool("golden_synproxy.py")
}

/// The checker must accept the expected frames and reject broken outputs and broken
/// cookies (see `golden_synproxy.py selftest`). Needs scapy and tshark, not root.
#[test]
fn golden_synproxy_checker_rejects_broken_output() {
    let dir = tempfile::Builder::new()
        .prefix(&format!("sluice-gsp-selftest-{}-", unique_tag()))
        .tempdir()
        .expect("temp dir");
    let out = run_bounded(
        Command::new(PYTHON)
            .arg(golden_tool())
            .arg("selftest")
            .arg(dir.path()),
        Duration::from_secs(600),
    );
    assert!(
        out.success(),
        "checker self-test failed: {}",
        out.describe()
    );
    assert!(
        out.stdout.contains("selftest OK") && out.stdout.matches("as it must").count() >= 30,
        "self-test output: {}",
        out.stdout
    );
}

#[test]
fn golden_synproxy_handshake_translation_and_counters() {
    require_root();
    // The tool plays the real servers: only the client's and the appliance's veths.
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
    .expect_success("golden_synproxy.py config");
    let vdev = format!(
        "net_pcap0,rx_iface_in={},tx_pcap={}",
        bed.lb_if(),
        out_pcap.display()
    );
    cfg.ports = vec![PortSpec::vdev("lan0", &vdev, &[OUR_ADDR]).with_mac(OUR_MAC)];
    cfg.extra_toml.push(services.stdout);
    let cfg = cfg.in_netns(bed.lb_ns());
    let mut daemon = Daemon::start(cfg);
    assert_eq!(
        port_counter(&daemon.status(), "lan0", "rx_packets"),
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
        "golden_synproxy.py run failed: {}\n{}",
        run.describe(),
        daemon.dump()
    );

    // 2. Counters once the input has ended (settle, then they must stand still).
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

    // 3. SIGTERM closes the port (out.pcap is complete).
    let exit = daemon.terminate();
    assert!(
        exit.success(),
        "sluice exited with {exit}\n{}",
        daemon.dump()
    );

    // 4. The output, frame by frame, and the cookies.
    let check = run_bounded(
        Command::new(PYTHON)
            .arg(golden_tool())
            .arg("check")
            .arg(&in_pcap)
            .arg(&out_pcap)
            .arg(&run_json)
            .arg(&expect_json)
            .arg(&summary_json),
        Duration::from_secs(300),
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
        input_frames >= 50 && outputs >= 45,
        "suspiciously small script: {input_frames} frames, {outputs} outputs"
    );

    // 5. Counters: port, drops, events (the SYN proxy's among them), sessions, real
    // servers, the FullNAT service's LIP.
    let mut problems = golden_counter_mismatches(&status, &list, &expect);
    for event in [
        "synproxy_cookies_sent",
        "synproxy_cookies_valid",
        "synproxy_cookies_invalid",
        "synproxy_cookies_expired",
        "synproxy_connections",
        "synproxy_syn_resent",
    ] {
        if expect["events"][event].as_u64().is_none() {
            problems.fail(format!("the expectations do not name events.{event}"));
        }
    }
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
    let service = find_service(&list, "tcp", FULLNAT_VIP, 80)
        .unwrap_or_else(|| panic!("no service tcp {FULLNAT_VIP}:80: {list:#}"));
    if service["local_addresses"] != serde_json::json!([LIP]) {
        problems.fail(format!(
            "tcp {FULLNAT_VIP}:80: local_addresses {}, expected [{LIP}]",
            service["local_addresses"]
        ));
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
