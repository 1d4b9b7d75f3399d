//! The performance harness's generator in validation mode, as a correctness test (CI;
//! root). `sluice-gen bench --validate` runs Sluice between the generator's clients
//! and real servers over net_memif for a few seconds per scenario and checks every
//! packet that comes back: addresses and ports after the DUT's rewrite, flags,
//! sequence numbers, payload, IPv4 and TCP checksums, and that each flow keeps its
//! real server (and FullNAT local address and port). The second test proves the
//! check can fail: the generator expects NAT while Sluice does DR. Another floods a
//! second service with spoofed SYNs, with the SYN proxy on (cookies, no session, no
//! SYN at a real server) and off (sessions, SYNs at the real servers). The last runs
//! testpmd 5tswap around the Sluice scenarios, as the benchmark does, and checks the
//! run order and that each Sluice row carries its comparison with those rows.
//!
//! This measures nothing (benchmarks are not run in CI; see perf/README.md). Every
//! wait is bounded: the orchestrator bounds each phase, kills what it started on any
//! failure (its children also get SIGKILL if it dies), and `run_bounded` kills the
//! orchestrator itself if it overruns.
mod common;

use common::{require_root, run_bounded, unique_tag};
use serde_json::Value;
use std::process::Command;
use std::sync::Mutex;
use std::time::Duration;

const GEN: &str = env!("CARGO_BIN_EXE_sluice-gen");
const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");

/// Each run pins the generator to CPU 0 and the DUT's worker to CPU 1: two runs at
/// once would starve each other, so the tests of this file take turns.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Runs `sluice-gen bench ARGS --json FILE` and returns its output and its rows.
fn bench(args: &[&str], timeout: Duration) -> (common::CmdOutput, Vec<Value>) {
    let dir = tempfile::Builder::new()
        .prefix(&format!("sluice-perf-{}-", unique_tag()))
        .tempdir()
        .expect("temp dir");
    let json = dir.path().join("rows.json");
    let out = run_bounded(
        Command::new(GEN)
            .arg("bench")
            // Correctness only: a run disturbed by other processes is not repeated.
            .args(["--attempts", "1"])
            .args(args)
            .arg("--sluice")
            .arg(SLUICE)
            .arg("--json")
            .arg(&json),
        timeout,
    );
    let text = std::fs::read_to_string(&json)
        .unwrap_or_else(|e| panic!("no JSON results ({e}): {}", out.describe()));
    let rows: Vec<Value> = serde_json::from_str(&text).expect("results JSON");
    (out, rows)
}

fn u(row: &Value, key: &str) -> u64 {
    row[key]
        .as_u64()
        .unwrap_or_else(|| panic!("{key} missing in {row}"))
}

#[test]
fn validation_mode_passes_for_nat_fullnat_and_dr() {
    require_root();
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let scenarios = [
        "nat-1k-established",
        "fullnat-1k-mixed",
        "dr-1k-connections",
    ];
    let (out, rows) = bench(
        &[
            "--validate",
            "--scenarios",
            &scenarios.join(","),
            "--duration",
            "2",
            // Correctness only: no testpmd reference runs.
            "--no-brackets",
        ],
        Duration::from_secs(150),
    );
    assert!(out.success(), "{}", out.describe());
    assert_eq!(rows.len(), scenarios.len(), "{}", out.describe());
    for (row, name) in rows.iter().zip(scenarios) {
        assert_eq!(row["name"], name);
        assert_eq!(row["ok"], true, "{name}: {row}\n{}", out.describe());
        assert_eq!(
            row["validation_failures"].as_object().map(|m| m.len()),
            Some(0),
            "{name}: {row}"
        );
        assert_eq!(u(row, "established"), 1000, "{name}: {row}");
        assert!(u(row, "gen_packets") > 1000, "{name}: {row}");
        assert!(u(row, "dut_rx_packets") > 1000, "{name}: {row}");
        assert!(u(row, "requests") > 100, "{name}: {row}");
        if name != "nat-1k-established" {
            // Full TCP connections through Sluice: handshake, request, response, FIN.
            assert!(u(row, "connections") > 10, "{name}: {row}");
            assert!(row["new_sessions_per_s_per_worker"].as_f64().unwrap() > 0.0);
        }
        assert!(row["cycles_per_packet"].as_f64().unwrap() > 0.0, "{name}");
    }
    // Full validation means every packet's checksums were verified.
    assert!(
        out.stdout.contains("full (every packet's checksums)"),
        "{}",
        out.stdout
    );
}

#[test]
fn a_syn_flood_gets_cookies_with_the_proxy_and_sessions_without() {
    require_root();
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let scenarios = ["nat-1k-synflood", "nat-1k-synflood-noproxy"];
    let (out, rows) = bench(
        &[
            "--validate",
            "--scenarios",
            &scenarios.join(","),
            "--duration",
            "2",
            "--no-brackets",
        ],
        Duration::from_secs(150),
    );
    assert!(out.success(), "{}", out.describe());
    assert_eq!(rows.len(), 2, "{}", out.describe());
    for (row, name) in rows.iter().zip(scenarios) {
        assert_eq!(row["name"], name);
        assert_eq!(row["ok"], true, "{name}: {row}\n{}", out.describe());
        assert_eq!(
            row["validation_failures"].as_object().map(|m| m.len()),
            Some(0),
            "{name}: {row}"
        );
        assert_eq!(u(row, "established"), 1000, "{name}: {row}");
        assert!(u(row, "flood_syn_acks") > 1000, "{name}: {row}");
        assert!(u(row, "flood_syns") >= u(row, "flood_syn_acks"), "{name}");
    }
    let (on, off) = (&rows[0], &rows[1]);
    // Proxy on: Sluice answered every SYN-ACK the generator counted (and no more than
    // the SYNs sent), no flood SYN reached a real server, and the table holds the
    // established sessions only: none for a spoofed source.
    assert!(u(on, "cookies_sent") >= u(on, "flood_syn_acks"), "{on}");
    assert!(u(on, "cookies_sent") <= u(on, "flood_syns"), "{on}");
    assert_eq!(u(on, "flood_syns_at_rs"), 0, "{on}");
    assert_eq!(u(on, "sessions_created"), 0, "{on}");
    assert_eq!(u(on, "live_sessions"), 1000, "{on}");
    // Proxy off: each SYN went to a real server through a session of its own, and the
    // half-open sessions stay in the table.
    assert_eq!(u(off, "cookies_sent"), 0, "{off}");
    assert!(
        u(off, "flood_syns_at_rs") >= u(off, "flood_syn_acks"),
        "{off}"
    );
    assert!(
        u(off, "sessions_created") >= u(off, "flood_syns_at_rs"),
        "{off}"
    );
    assert!(u(off, "live_sessions") > 1000 + 1000, "{off}");
    assert!(out.stdout.contains("## SYN flood"), "{}", out.stdout);
}

#[test]
fn a_wrong_expectation_fails_the_run() {
    require_root();
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    // Sluice forwards in DR mode (only the destination MAC changes) while the
    // generator's real servers expect NAT (their own address and port 8080).
    let (out, rows) = bench(
        &[
            "--validate",
            "--scenarios",
            "dr-1k-established",
            "--duration",
            "1",
            "--gen-mode",
            "nat",
            "--no-brackets",
        ],
        Duration::from_secs(90),
    );
    assert!(
        !out.success(),
        "a wrong rewrite must fail the run: {}",
        out.describe()
    );
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0]["ok"], false, "{}", rows[0]);
    assert!(
        u(&rows[0]["validation_failures"], "rs_dst") > 0,
        "{}",
        rows[0]
    );
    assert!(
        out.stdout
            .contains("validation failure rs_dst: first offending packet"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("**FAIL**"), "{}", out.stdout);
}

#[test]
fn testpmd_runs_before_and_after_every_sluice_scenario() {
    require_root();
    let testpmd = "/usr/bin/dpdk-testpmd";
    assert!(
        std::path::Path::new(testpmd).exists(),
        "{testpmd} missing (Debian's dpdk-dev package; scripts/setup.sh installs it)"
    );
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (out, rows) = bench(
        &[
            "--scenarios",
            "nat-1k-established,dr-1k-established",
            "--duration",
            "1",
            "--testpmd",
            testpmd,
        ],
        Duration::from_secs(150),
    );
    assert!(out.success(), "{}", out.describe());
    let names: Vec<&str> = rows.iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "testpmd-5tswap",
            "nat-1k-established",
            "testpmd-5tswap",
            "dr-1k-established",
            "testpmd-5tswap"
        ],
        "{}",
        out.describe()
    );
    let cycles = |r: &Value| {
        r["cycles_per_packet"]
            .as_f64()
            .unwrap_or_else(|| panic!("no cycles_per_packet: {r}"))
    };
    let f = |r: &Value, k: &str| {
        r[k].as_f64()
            .unwrap_or_else(|| panic!("{k} missing in {r}"))
    };
    let mut testpmd_cycles: Vec<f64> = [0, 2, 4].iter().map(|&i| cycles(&rows[i])).collect();
    testpmd_cycles.sort_by(f64::total_cmp);
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs().max(1.0);
    for i in [1, 3] {
        let r = &rows[i];
        let c = cycles(r);
        assert_eq!(u(r, "testpmd_runs"), 3, "{r}");
        assert_eq!(f(r, "testpmd_median_cycles"), testpmd_cycles[1], "{r}");
        assert_eq!(f(r, "testpmd_min_cycles"), testpmd_cycles[0], "{r}");
        assert_eq!(f(r, "testpmd_max_cycles"), testpmd_cycles[2], "{r}");
        assert!(
            close(f(r, "ratio_to_testpmd"), c / testpmd_cycles[1]),
            "{r}"
        );
        assert!(
            close(f(r, "ratio_to_testpmd_min"), c / testpmd_cycles[2]),
            "{r}"
        );
        assert!(
            close(f(r, "ratio_to_testpmd_max"), c / testpmd_cycles[0]),
            "{r}"
        );
        let (before, after) = (cycles(&rows[i - 1]), cycles(&rows[i + 1]));
        assert_eq!(f(r, "bracket_before_cycles"), before, "{r}");
        assert_eq!(f(r, "bracket_after_cycles"), after, "{r}");
        assert!(
            close(f(r, "ratio_to_brackets"), 2.0 * c / (before + after)),
            "{r}"
        );
    }
    assert!(
        out.stdout.contains("Reference: testpmd-5tswap ran 3 times"),
        "{}",
        out.stdout
    );
}
