//! Sluice's integration tests (tiers 2 and 3 of docs/TESTING.md) as one test binary:
//! each `tests/<name>.rs` below is a module, and `tests/common/` the fixtures they share.
//!
//! One binary rather than one per file: each binary links the whole library and
//! compiles the fixtures again, which cost minutes of every CI run. The tests of all
//! modules share libtest's threads (`--test-threads`): a test may run beside one from
//! another file, so each uses its own names, namespaces, file prefixes and sockets
//! (`common::unique_tag`), and the daemons' workers sleep when idle
//! (`DaemonConfig::idle_sleep_us`) instead of taking a whole CPU.
//!
//! Apart, as their own binaries (`[[test]]` in Cargo.toml): `eal_*`, which start the
//! DPDK EAL inside the test process (once per process), and `perf_validation`, whose
//! runs pin a generator and a worker to the two CPUs and must not share them.
//!
//! Run one file's tests: `cargo test --release --test integration e2e_vrrp::`.

mod common;

mod check_config;
mod cli_ipvsadm;
mod control_socket;
mod daemon_lifecycle;
mod e2e_admission;
mod e2e_bgp;
mod e2e_capture;
mod e2e_ecmp;
mod e2e_exception;
mod e2e_failover;
mod e2e_forwarding;
mod e2e_fullnat;
mod e2e_fullnat_reuse;
mod e2e_health;
mod e2e_hot_change;
mod e2e_ipv6_local;
mod e2e_ipv6_multi_worker;
mod e2e_multi_worker;
mod e2e_netns;
mod e2e_schedulers;
mod e2e_synproxy;
mod e2e_table_pressure;
mod e2e_vrrp;
mod golden_forwarding;
mod golden_fullnat;
mod golden_ipv6;
mod golden_pcap;
mod golden_synproxy;
mod ipvsadm_fidelity;
mod keepalived_import;
mod layering;
mod loopback_demo;
mod metrics;
mod multi_worker;
mod packaging;
mod preflight;
mod prometheus;
mod simulate_cli;
mod sync_standby;
mod systemd_notify;
mod toeplitz_softrss;

/// Every `tests/*.rs` is a module above or a test binary of its own in Cargo.toml
/// (`autotests = false`: Cargo no longer finds them by itself), so none is silently
/// left out of `cargo test`.
#[test]
fn every_test_file_is_built() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let here = std::fs::read_to_string(dir.join("tests/integration.rs")).unwrap();
    let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap();
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(dir.join("tests")).unwrap() {
        let name = entry.unwrap().file_name().into_string().unwrap();
        let Some(stem) = name.strip_suffix(".rs") else {
            continue;
        };
        let module = format!("\nmod {stem};\n");
        let binary = format!("path = \"tests/{name}\"");
        if stem != "integration" && !here.contains(&module) && !manifest.contains(&binary) {
            missing.push(name);
        }
    }
    assert!(missing.is_empty(), "not built by cargo test: {missing:?}");
}
