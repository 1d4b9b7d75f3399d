//! Golden-packet runs: comparing the daemon's counters with the expectations a golden
//! tool writes (`tests/tools/golden_forwarding.py`'s format, also written by
//! `golden_fullnat.py` and `golden_synproxy.py`), the checker self-test, and the live
//! run those two tools share.

use super::config::{DaemonConfig, PortSpec};
use super::daemon::{
    dpdk_runtime_dirs, drop_count, event_count, port_counter, real_server, rs_counter, Daemon,
    SLUICECTL,
};
use super::process::{run_bounded, tool, unique_tag, CmdOutput, PYTHON};
use super::testbed::Testbed;
use serde_json::Value;
use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

/// Counter mismatches, collected so that one run reports all of them.
#[derive(Default, Debug)]
pub struct Mismatches(pub Vec<String>);

impl Mismatches {
    pub fn eq(&mut self, what: String, got: u64, want: u64) {
        if got != want {
            self.0.push(format!("{what}: got {got}, expected {want}"));
        }
    }

    pub fn fail(&mut self, what: String) {
        self.0.push(what);
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn report(&self) -> String {
        self.0.join("\n  ")
    }

    /// Port `lan0` of a golden run: received exactly the `input_frames`, sent the
    /// `outputs` plus at most the `arp_requests` Sluice sent on its own (out.pcap holds
    /// every such request, the status only those sent before it was read), no error.
    pub fn port_lan0(
        &mut self,
        status: &serde_json::Value,
        input_frames: u64,
        outputs: u64,
        arp_requests: u64,
    ) {
        self.eq(
            "ports[lan0].rx_packets".into(),
            port_counter(status, "lan0", "rx_packets"),
            input_frames,
        );
        let tx = port_counter(status, "lan0", "tx_packets");
        if !(outputs..=outputs + arp_requests).contains(&tx) {
            self.fail(format!(
                "ports[lan0].tx_packets: got {tx}, expected the {outputs} outputs plus at most \
                 the {arp_requests} ARP requests from Sluice"
            ));
        }
        for field in ["rx_missed", "rx_errors", "tx_errors", "rx_nombuf"] {
            self.eq(
                format!("ports[lan0].{field}"),
                port_counter(status, "lan0", field),
                0,
            );
        }
    }
}

/// Compares `sluicectl status --json` (`status`) and `sluicectl -L -n --stats --json`
/// (`list`) with a golden tool's expectations (`expect`): every drop reason exactly
/// (those the tool does not name must be 0, and every one it names must be reported),
/// `events`, `neighbours` (= `events.neighbour_learned`), `sessions`,
/// `sessions_created` and `sessions_expired`, and per entry of `real_servers` ({rip,
/// vip, mode, services: [[proto, port]...], connections, active, inactive, in_min,
/// in_max, out_min, out_max}, summed over its services): exact connections, active and
/// inactive, packets within bounds, at least 40 bytes a packet, and the mode.
pub fn golden_counter_mismatches(
    status: &serde_json::Value,
    list: &serde_json::Value,
    expect: &serde_json::Value,
) -> Mismatches {
    let mut m = Mismatches::default();
    let want_drops: BTreeMap<String, u64> = expect["drops"]
        .as_object()
        .expect("expectations have `drops`")
        .iter()
        .map(|(k, v)| (k.clone(), v.as_u64().unwrap()))
        .collect();
    let got_drops = status["drops"]
        .as_object()
        .expect("status.drops is an object");
    for reason in want_drops.keys() {
        if !got_drops.contains_key(reason) {
            m.fail(format!("drops.{reason}: not reported by sluicectl status"));
        }
    }
    let mut reasons: Vec<&String> = want_drops.keys().chain(got_drops.keys()).collect();
    reasons.sort();
    reasons.dedup();
    for reason in reasons {
        let want = want_drops.get(reason).copied().unwrap_or(0);
        m.eq(format!("drops.{reason}"), drop_count(status, reason), want);
    }
    for (event, want) in expect["events"]
        .as_object()
        .expect("expectations have `events`")
    {
        m.eq(
            format!("events.{event}"),
            event_count(status, event),
            want.as_u64().unwrap(),
        );
    }
    m.eq(
        "neighbours".into(),
        status["neighbours"].as_u64().unwrap_or(u64::MAX),
        expect["events"]["neighbour_learned"].as_u64().unwrap(),
    );
    for field in ["sessions", "sessions_created", "sessions_expired"] {
        m.eq(
            field.into(),
            status[field].as_u64().unwrap_or(u64::MAX),
            expect[field].as_u64().unwrap(),
        );
    }
    for want in expect["real_servers"].as_array().expect("`real_servers`") {
        let rip = want["rip"].as_str().unwrap();
        let vip = want["vip"].as_str().unwrap();
        let mode = want["mode"].as_str().unwrap();
        let services: Vec<(String, u16)> = want["services"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| (s[0].as_str().unwrap().into(), s[1].as_u64().unwrap() as u16))
            .collect();
        let mut sum = |field: &str| -> u64 {
            services
                .iter()
                .map(|(proto, port)| {
                    let rs = real_server(list, proto, vip, *port, rip);
                    if rs["mode"] != mode {
                        m.fail(format!(
                            "{proto} {vip}:{port} -> {rip}: mode {}",
                            rs["mode"]
                        ));
                    }
                    rs_counter(rs, field)
                })
                .sum()
        };
        let (conns, active, inactive) = (sum("connections"), sum("active"), sum("inactive"));
        let (inp, outp) = (sum("in_packets"), sum("out_packets"));
        let (in_bytes, out_bytes) = (sum("in_bytes"), sum("out_bytes"));
        let n = |k: &str| want[k].as_u64().unwrap();
        let what = format!("real server {rip} of {vip} {services:?} ({mode})");
        m.eq(format!("{what} connections"), conns, n("connections"));
        m.eq(format!("{what} active"), active, n("active"));
        m.eq(format!("{what} inactive"), inactive, n("inactive"));
        for (field, got, lo, hi) in [
            ("in_packets", inp, n("in_min"), n("in_max")),
            ("out_packets", outp, n("out_min"), n("out_max")),
        ] {
            if !(lo..=hi).contains(&got) {
                m.fail(format!("{what} {field}: {got}, expected {lo}..={hi}"));
            }
        }
        for (field, bytes, packets) in [("in_bytes", in_bytes, inp), ("out_bytes", out_bytes, outp)]
        {
            if bytes < 40 * packets || (packets == 0) != (bytes == 0) {
                m.fail(format!("{what} {field}: {bytes} for {packets} packets"));
            }
        }
    }
    m
}

/// Runs `TOOL selftest DIR`: the tool's checker must accept the expected output and
/// reject every broken variant, at least `min_verdicts` of them reported "as it must".
/// Needs scapy and tshark, not root.
pub fn assert_checker_selftest(tool_name: &str, min_verdicts: usize) {
    let dir = tempfile::Builder::new()
        .prefix(&format!("sluice-selftest-{}-", unique_tag()))
        .tempdir()
        .expect("temp dir");
    let out = run_bounded(
        Command::new(PYTHON)
            .arg(tool(tool_name))
            .arg("selftest")
            .arg(dir.path()),
        Duration::from_secs(600),
    );
    assert!(
        out.success(),
        "{tool_name} self-test failed: {}",
        out.describe()
    );
    assert!(
        out.stdout.contains("selftest OK")
            && out.stdout.matches("as it must").count() >= min_verdicts,
        "{tool_name} self-test output: {}",
        out.stdout
    );
}

/// What a live golden run leaves: the daemon (stopped), its counters once the input
/// ended, the checker's verdict and expectations, and the counter mismatches found so
/// far (drops, events, sessions, real servers, port counters).
pub struct LiveGolden {
    pub daemon: Daemon,
    pub status: Value,
    pub list: Value,
    pub check: CmdOutput,
    pub expect: Value,
    pub problems: Mismatches,
}

/// A golden run whose input depends on what Sluice chose (FullNAT local ports, SYN
/// cookies): the tool (`golden_fullnat.py`, `golden_synproxy.py`) prints the services
/// config (`config`), plays client and real servers live on a test bed's client veth
/// while Sluice reads the appliance veth and writes `out.pcap` (`run`), then checks
/// the output against the script and what it learned (`check`). Asserts that the run
/// completed and that the script has at least `min_frames` frames and `min_outputs`
/// outputs; the checker's verdict and the counters are for the caller
/// ([`LiveGolden::assert_passed`]).
pub fn run_live_golden(tool_name: &str, min_frames: u64, min_outputs: u64) -> LiveGolden {
    let golden_tool = tool(tool_name);
    // Only the client's and the appliance's veths: the tool plays the real servers.
    let bed = Testbed::up(0);
    let mut cfg = DaemonConfig::new(Vec::new());
    let in_pcap = cfg.path("in.pcap");
    let out_pcap = cfg.path("out.pcap");
    let run_json = cfg.path("run.json");
    let expect_json = cfg.path("expect.json");
    let summary_json = cfg.path("summary.json");

    let services = run_bounded(
        Command::new(PYTHON).arg(&golden_tool).arg("config"),
        Duration::from_secs(60),
    )
    .expect_success(&format!("{tool_name} config"));
    let vdev = format!(
        "net_pcap0,rx_iface_in={},tx_pcap={}",
        bed.lb_if(),
        out_pcap.display()
    );
    cfg.ports = vec![PortSpec::vdev("lan0", &vdev, &[APPLIANCE_ADDR]).with_mac(APPLIANCE_MAC)];
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
            &golden_tool.to_string_lossy(),
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
        "{tool_name} run failed: {}\n{}",
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
            &before["drops"],
            &before["events"],
            port_counter(&before, "lan0", "rx_packets")
        ),
        (
            &status["drops"],
            &status["events"],
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

    // 4. The output, frame by frame.
    let check = run_bounded(
        Command::new(PYTHON)
            .arg(&golden_tool)
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
        input_frames >= min_frames && outputs >= min_outputs,
        "suspiciously small script: {input_frames} frames, {outputs} outputs"
    );

    // 5. Counters: drops, events, sessions, real servers, the port.
    let mut problems = golden_counter_mismatches(&status, &list, &expect);
    let arp_requests = summary["arp_requests"].as_u64().unwrap_or(0);
    problems.port_lan0(&status, input_frames, outputs, arp_requests);
    LiveGolden {
        daemon,
        status,
        list,
        check,
        expect,
        problems,
    }
}

impl LiveGolden {
    /// The checker accepted the output, no counter differs, and DPDK left nothing.
    pub fn assert_passed(&self) {
        assert!(
            self.check.success(),
            "golden check failed:\n{}\ncounters:\n  {}\n{}",
            self.check.describe(),
            self.problems.report(),
            self.daemon.dump()
        );
        assert!(
            self.problems.is_empty(),
            "status counters differ from the expectations:\n  {}\nstatus: {:#}\nservices: {:#}",
            self.problems.report(),
            self.status,
            self.list
        );
        assert!(
            dpdk_runtime_dirs(&self.daemon.config.file_prefix).is_empty(),
            "DPDK runtime dir left behind"
        );
    }
}

/// The appliance of the golden tools (`golden_arp_icmp.py`'s OUR_MAC / OUR_IP).
const APPLIANCE_MAC: &str = "02:53:4c:00:00:01";
const APPLIANCE_ADDR: &str = "198.18.0.1/24";
