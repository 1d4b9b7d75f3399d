//! The Prometheus endpoint, scraped and parsed by prometheus_client's reference text
//! parser (tests/tools/prom_scrape.py), against `sluicectl --json`. The daemon runs in
//! a network namespace of the test's own, so the scrape stays inside it.
//!
//! Run: `cargo test --release --test integration metrics::` (as root).

use crate::common::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

fn scrape(ns: &Netns, url: &str) -> Value {
    let script = repo_root().join("tests/tools/prom_scrape.py");
    let out = run_bounded(
        Command::new("ip").args([
            "netns",
            "exec",
            &ns.0,
            PYTHON,
            &script.to_string_lossy(),
            url,
        ]),
        Duration::from_secs(20),
    );
    assert!(out.success(), "{}", out.describe());
    serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {}", out.stdout))
}

/// (name, sorted labels) -> value.
fn samples(scraped: &Value) -> BTreeMap<(String, String), f64> {
    scraped["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let labels: BTreeMap<String, String> = serde_json::from_value(s[1].clone()).unwrap();
            let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            (
                (s[0].as_str().unwrap().to_string(), labels.join(",")),
                s[2].as_f64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn metrics_parse_with_the_reference_parser_and_match_sluicectl() {
    require_root();
    let ns = Netns::new("slm");
    let mut cfg = DaemonConfig::new(vec![PortSpec::loopback(
        "lan0",
        "02:53:4c:00:00:01",
        &["198.18.0.1/24"],
    )])
    .in_netns(&ns.0);
    cfg.metrics = Some("127.0.0.1:9101".into());
    cfg.loopback = vec!["peers = 2".into(), "ping_interval_ms = 50".into()];
    cfg.extra_toml = vec![service_section(
        "tcp",
        "198.18.1.1",
        80,
        "rr",
        &["local_addresses = [\"198.18.0.50\"]".into()],
        &[
            ("198.18.0.2", 8080, 2, "fullnat"),
            ("198.18.0.3", 8080, 1, "fullnat"),
        ],
    )];
    let daemon = Daemon::start(cfg);
    std::thread::sleep(Duration::from_secs(2));

    let got = samples(&scrape(&ns, "http://127.0.0.1:9101/metrics"));
    let status = daemon.status();
    let listed: Value = serde_json::from_str(&daemon.ctl(&["-L", "-n", "--json"]).stdout).unwrap();
    let value = |name: &str, labels: &str| -> f64 {
        *got.get(&(name.to_string(), labels.to_string()))
            .unwrap_or_else(|| {
                panic!(
                    "no sample {name}{{{labels}}}: {:?}",
                    got.keys().collect::<Vec<_>>()
                )
            })
    };
    assert_eq!(value("sluice_up", ""), 1.0);
    // Every drop reason and event of `status` is a sample; counters read after the
    // scrape are at least as large, and not by much (traffic flows meanwhile).
    for (reason, n) in status["drops"].as_object().unwrap() {
        let m = value("sluice_drops_total", &format!("reason={reason}"));
        assert!(
            m <= n.as_f64().unwrap(),
            "{reason}: metrics {m} > status {n}"
        );
    }
    assert_eq!(
        got.keys()
            .filter(|(n, _)| n == "sluice_drops_total")
            .count(),
        status["drops"].as_object().unwrap().len()
    );
    let service = "TCP 198.18.1.1:80";
    for (ip, weight) in [("198.18.0.2", 2.0), ("198.18.0.3", 1.0)] {
        let labels = format!("rs={ip}:8080,service={service}");
        assert_eq!(value("sluice_rs_weight", &labels), weight);
        let rs = real_server(&listed, "tcp", "198.18.1.1", 80, ip);
        let (m, j) = (
            value("sluice_rs_connections_total", &labels),
            rs_counter(rs, "connections") as f64,
        );
        assert!(
            m > 0.0 && m <= j && j - m <= 100.0,
            "{ip}: metrics {m}, json {j}"
        );
    }
    assert_eq!(
        value("sluice_service_available", &format!("service={service}")),
        1.0
    );
    let used = value("sluice_laddr_ports_used", "lip=198.18.0.50,worker=0");
    assert!(used >= 0.0);
    let workers = got
        .keys()
        .filter(|(n, _)| n == "sluice_worker_sessions_created_total")
        .count();
    assert_eq!(workers, 1);
    // Another path is a 404.
    assert_eq!(scrape(&ns, "http://127.0.0.1:9101/other")["status"], 404);
    daemon.stop_clean();
}
