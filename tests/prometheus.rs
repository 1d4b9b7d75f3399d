//! Sluice's metrics against Prometheus's own tools (Debian's `prometheus` package,
//! installed by scripts/setup.sh): `promtool check metrics` lints the exposition a
//! loopback daemon serves while its emulated clients carry traffic; a real Prometheus
//! server, run with the scrape job of contrib/prometheus/prometheus.yml at a 1 s
//! interval, scrapes it; PromQL over Prometheus's HTTP API then checks the rates per
//! service and real server against each other, against other counters and against the
//! schedulers' weights, and every query of contrib/grafana/sluice-dashboard.json must
//! run and return data.
//!
//! Daemon and Prometheus run in a network namespace of the test's own: its loopback
//! is private, so the fixed ports below are free, and no scrape leaves it.
//!
//! Run: `cargo test --release --test integration prometheus::` (as root; about 15 s).

use crate::common::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Sluice's `[control] metrics`: the target of the shipped scrape config.
const METRICS: &str = "127.0.0.1:9101";
/// The test Prometheus's web address (inside the test's namespace).
const PROMETHEUS: &str = "127.0.0.1:9090";
/// Rate windows: six scrapes at 1 s.
const WINDOW: &str = "6s";
/// What Grafana puts for `$__rate_interval` with a 1 s scrape interval on the data
/// source: max(4 x scrape interval, `$__interval` + scrape interval).
const GRAFANA_RATE_INTERVAL: &str = "4s";

/// The three services the emulated clients open connections to: rr over two NAT
/// servers of equal weight, wrr over two FullNAT servers weighted 1:3, and UDP.
const RR: &str = "TCP 198.18.1.1:80";
const WRR: &str = "TCP 198.18.1.2:80";
const UDP: &str = "UDP 198.18.1.1:53";

fn curl(ns: &Netns, args: &[&str]) -> CmdOutput {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &ns.0, "curl", "-sS", "--max-time", "5"])
        .args(args);
    run_bounded(&mut cmd, Duration::from_secs(10))
}

/// One sample of an instant vector: its labels and value.
type Sample = (BTreeMap<String, String>, f64);

/// A Prometheus server in `ns`, scraping Sluice; its data in a temp dir of its own.
/// Killed (SIGTERM, then SIGKILL) on drop, before the temp dir goes.
struct Prometheus<'a> {
    _process: BackgroundProcess,
    ns: &'a Netns,
    _dir: tempfile::TempDir,
}

impl<'a> Prometheus<'a> {
    /// Starts Prometheus with `config` (YAML) and waits until it is ready.
    fn start(ns: &'a Netns, config: &str) -> Prometheus<'a> {
        let dir = tempfile::Builder::new()
            .prefix("sluice-prometheus-")
            .tempdir()
            .expect("a temp dir");
        let config_path = dir.path().join("prometheus.yml");
        std::fs::write(&config_path, config).unwrap();
        let check = run_bounded(
            Command::new("promtool").args(["check", "config", &config_path.to_string_lossy()]),
            Duration::from_secs(10),
        );
        assert!(check.success(), "{}", check.describe());
        let mut process = BackgroundProcess::spawn(
            Some(&ns.0),
            &[
                "prometheus",
                &format!("--config.file={}", config_path.display()),
                &format!("--storage.tsdb.path={}", dir.path().join("data").display()),
                &format!("--web.listen-address={PROMETHEUS}"),
                "--log.level=warn",
            ],
        );
        let ready = format!("http://{PROMETHEUS}/-/ready");
        process.wait_until(Duration::from_secs(20), "ready", || {
            curl(ns, &["-o", "/dev/null", "-w", "%{http_code}", &ready]).stdout == "200"
        });
        Prometheus {
            _process: process,
            ns,
            _dir: dir,
        }
    }

    /// An instant query at `time` (Unix seconds): its result vector as (labels, value),
    /// or Prometheus's error.
    fn query(&self, expr: &str, time: f64) -> Result<Vec<Sample>, String> {
        let out = curl(
            self.ns,
            &[
                "-G",
                &format!("http://{PROMETHEUS}/api/v1/query"),
                "--data-urlencode",
                &format!("query={expr}"),
                "--data-urlencode",
                &format!("time={time:.3}"),
            ],
        );
        assert!(out.success(), "{}", out.describe());
        let answer: Value = serde_json::from_str(&out.stdout)
            .unwrap_or_else(|e| panic!("{expr}: not JSON ({e}): {}", out.stdout));
        if answer["status"] != "success" {
            return Err(format!("{}: {}", answer["errorType"], answer["error"]));
        }
        let data = &answer["data"];
        if data["resultType"] != "vector" {
            return Err(format!(
                "result type {} (expected vector)",
                data["resultType"]
            ));
        }
        Ok(data["result"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                let labels = serde_json::from_value(s["metric"].clone()).unwrap();
                let value: f64 = s["value"][1].as_str().unwrap().parse().unwrap();
                (labels, value)
            })
            .collect())
    }

    /// The query's samples keyed by the value of `label`; panics on an error.
    fn by(&self, expr: &str, label: &str, time: f64) -> BTreeMap<String, f64> {
        self.query(expr, time)
            .unwrap_or_else(|e| panic!("{expr}: {e}"))
            .into_iter()
            .map(|(labels, v)| (labels.get(label).cloned().unwrap_or_default(), v))
            .collect()
    }

    /// The query's only sample; panics unless there is exactly one.
    fn one(&self, expr: &str, time: f64) -> f64 {
        let got = self
            .query(expr, time)
            .unwrap_or_else(|e| panic!("{expr}: {e}"));
        assert_eq!(got.len(), 1, "{expr}: {got:?}");
        got[0].1
    }
}

/// The shipped scrape config, its intervals cut to 1 s for the test.
fn test_config() -> String {
    let shipped = std::fs::read_to_string(repo_root().join("contrib/prometheus/prometheus.yml"))
        .expect("contrib/prometheus/prometheus.yml");
    assert!(
        shipped.contains("scrape_interval: 5s")
            && shipped.contains("evaluation_interval: 5s")
            && shipped.contains(METRICS),
        "contrib/prometheus/prometheus.yml changed: adapt test_config()"
    );
    shipped
        .replace("scrape_interval: 5s", "scrape_interval: 1s")
        .replace("evaluation_interval: 5s", "evaluation_interval: 1s")
}

/// Every PromQL expression of a Grafana dashboard: each panel target's `expr` (rows'
/// panels included) and each query variable's `label_values(METRIC, LABEL)` as the
/// series selector METRIC. Grafana's variables are replaced as Grafana would with
/// "All" selected on a 1 s data source.
fn dashboard_queries(path: &Path) -> Vec<(String, String)> {
    let dashboard: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let grafana = |expr: &str| {
        expr.replace("$__rate_interval", GRAFANA_RATE_INTERVAL)
            .replace("$instance", ".*")
    };
    let mut out = Vec::new();
    let mut panels: Vec<&Value> = dashboard["panels"].as_array().unwrap().iter().collect();
    while let Some(p) = panels.pop() {
        if let Some(inner) = p["panels"].as_array() {
            panels.extend(inner);
        }
        for t in p["targets"].as_array().into_iter().flatten() {
            let expr = t["expr"].as_str().expect("a target without expr");
            let title = format!("{} ({})", p["title"], t["refId"]);
            out.push((title, grafana(expr)));
        }
    }
    for v in dashboard["templating"]["list"].as_array().unwrap() {
        let q = v["query"]["query"].as_str().unwrap();
        let metric = q
            .strip_prefix("label_values(")
            .and_then(|r| r.split(',').next())
            .unwrap_or_else(|| panic!("variable {}: not label_values(): {q}", v["name"]));
        out.push((format!("variable {}", v["name"]), grafana(metric)));
    }
    assert!(
        out.len() >= 10,
        "{}: {} queries only",
        path.display(),
        out.len()
    );
    out
}

fn close(a: f64, b: f64, slack: f64, rel: f64) -> bool {
    (a - b).abs() <= slack + rel * a.abs().max(b.abs())
}

#[test]
fn promtool_and_a_real_prometheus_scrape_with_promql_and_the_dashboards_queries() {
    require_root();
    let began = Instant::now();
    let ns = Netns::new("slp");
    let mut cfg = DaemonConfig::new(vec![PortSpec::loopback(
        "lan0",
        "02:53:4c:00:00:01",
        &["198.18.0.1/24"],
    )])
    .in_netns(&ns.0);
    cfg.metrics = Some(METRICS.into());
    cfg.loopback = vec!["peers = 2".into(), "ping_interval_ms = 50".into()];
    cfg.extra_toml = vec![
        service_section(
            "tcp",
            "198.18.1.1",
            80,
            "rr",
            &[],
            &[
                ("198.18.0.2", 8080, 1, "nat"),
                ("198.18.0.3", 8080, 1, "nat"),
            ],
        ),
        service_section(
            "tcp",
            "198.18.1.2",
            80,
            "wrr",
            &["local_addresses = [\"198.18.0.50\"]".into()],
            &[
                ("198.18.0.2", 8081, 1, "fullnat"),
                ("198.18.0.3", 8081, 3, "fullnat"),
            ],
        ),
        service_section(
            "udp",
            "198.18.1.1",
            53,
            "rr",
            &[],
            &[("198.18.0.2", 53, 1, "nat")],
        ),
    ];
    let daemon = Daemon::start(cfg);

    // promtool lints the exposition as served, while traffic flows, once it has
    // every family: the persistence templates' come with their first whole count, a
    // few seconds after start.
    let text = wait_for(Duration::from_secs(15), Duration::from_millis(500), || {
        let text = curl(&ns, &[&format!("http://{METRICS}/metrics")]).expect_success("scrape");
        (text.stdout)
            .contains("# TYPE sluice_persistence_templates gauge")
            .then_some(text)
    })
    .unwrap_or_else(|| panic!("no template count in the metrics\n{}", daemon.dump()));
    let exposition = daemon.config.path("metrics.txt");
    std::fs::write(&exposition, &text.stdout).unwrap();
    let lint = run_bounded(
        Command::new("sh").args([
            "-c",
            &format!("promtool check metrics < {}", exposition.display()),
        ]),
        Duration::from_secs(10),
    );
    assert!(
        lint.success() && lint.stdout.trim().is_empty() && lint.stderr.trim().is_empty(),
        "promtool check metrics: {}\n--- exposition ---\n{}",
        lint.describe(),
        text.stdout
    );
    for family in [
        "sluice_rs_connections_total",
        "sluice_worker_cycles_total",
        "sluice_worker_capture_dropped_total",
        "sluice_drops_total",
    ] {
        assert!(
            text.stdout.contains(&format!("# TYPE {family} counter")),
            "{family}"
        );
    }
    // No service has persistence: every standing of both tables counts 0.
    for family in ["ipv4", "ipv6"] {
        for standing in ["unconfirmed", "unverified", "confirmed"] {
            let sample = format!(
                "sluice_persistence_templates{{family=\"{family}\",standing=\"{standing}\"}} 0\n"
            );
            assert!(text.stdout.contains(&sample), "{sample}{}", text.stdout);
        }
    }

    let prometheus = Prometheus::start(&ns, &test_config());
    // Eight scrapes of the target, so that every window below holds six or more.
    let t = wait_for(Duration::from_secs(20), Duration::from_millis(250), || {
        let now = wall_now();
        let got = prometheus.query("count_over_time(sluice_up{job=\"sluice\"}[20s])", now);
        match got {
            Ok(v) if v.len() == 1 && v[0].1 >= 8.0 => Some(now),
            _ => None,
        }
    })
    .unwrap_or_else(|| panic!("Prometheus never scraped Sluice 8 times\n{}", daemon.dump()));
    // Every query below reads the same scrapes: those up to the last one.
    let t = prometheus.one("timestamp(sluice_up)", t);
    let up = prometheus.one("up{job=\"sluice\"}", t);
    assert_eq!(up, 1.0, "the scrape target is down");

    // Connections per service and per real server.
    let per_service = prometheus.by(
        &format!("sum by (service) (rate(sluice_rs_connections_total[{WINDOW}]))"),
        "service",
        t,
    );
    let per_rs = prometheus
        .query(&format!("rate(sluice_rs_connections_total[{WINDOW}])"), t)
        .unwrap();
    assert_eq!(per_rs.len(), 5, "{per_rs:?}");
    for service in [RR, WRR, UDP] {
        let rate = per_service.get(service).copied().unwrap_or(0.0);
        // 2 clients, one connection each per service every 50 ms: 40/s offered; the
        // emulator shares its core, so much less is still a pass, none is not; more
        // cannot be.
        assert!(
            (4.0..=44.0).contains(&rate),
            "{service}: {rate} connections/s: {per_service:?}"
        );
        let servers: Vec<f64> = per_rs
            .iter()
            .filter(|(l, _)| l["service"] == service)
            .map(|(_, v)| *v)
            .collect();
        assert!(servers.iter().all(|&v| v > 0.0), "{service}: {per_rs:?}");
        // Prometheus sums the real servers' rates exactly as the per-service query.
        assert!(close(servers.iter().sum(), rate, 1e-9, 1e-9), "{service}");
    }
    let rs_rate = |service: &str, rs: &str| {
        prometheus.one(
            &format!(
                "rate(sluice_rs_connections_total{{service=\"{service}\",rs=\"{rs}\"}}[{WINDOW}])"
            ),
            t,
        )
    };
    // rr: the two servers' counts never differ by more than one connection.
    let (a, b) = (
        rs_rate(RR, "198.18.0.2:8080"),
        rs_rate(RR, "198.18.0.3:8080"),
    );
    assert!(close(a, b, 0.5, 0.1), "rr split {a} vs {b}");
    // wrr 1:3 on one worker: three of every four connections go to the heavier one.
    let (light, heavy) = (
        rs_rate(WRR, "198.18.0.2:8081"),
        rs_rate(WRR, "198.18.0.3:8081"),
    );
    assert!(
        (2.4..=3.6).contains(&(heavy / light)),
        "wrr 1:3 split {light} vs {heavy}"
    );
    // Every session a worker creates counts on exactly one real server; the two
    // counters are read one after the other in a scrape, so they differ by the few
    // connections opened in between.
    let created = prometheus.one(
        &format!("sum(rate(sluice_worker_sessions_created_total[{WINDOW}]))"),
        t,
    );
    let total: f64 = per_service.values().sum();
    assert!(
        close(created, total, 2.0, 0.05),
        "sessions created {created}/s vs connections {total}/s"
    );

    // Packets: every connection starts with a client packet, every forwarded packet
    // was received by the worker, and the port counts (the driver's) what the worker
    // counts (one worker).
    let in_pps = prometheus.by(
        &format!("sum by (service) (rate(sluice_rs_in_packets_total[{WINDOW}]))"),
        "service",
        t,
    );
    for service in [RR, WRR, UDP] {
        assert!(
            in_pps[service] >= per_service[service] * 0.95,
            "{service}: {} packets/s in, {} connections/s",
            in_pps[service],
            per_service[service]
        );
    }
    let tcp_in = in_pps[RR];
    assert!(
        tcp_in >= 3.0 * per_service[RR] * 0.9,
        "rr: {tcp_in} packets/s in for {} connections/s (SYN, request, FIN, ACK each)",
        per_service[RR]
    );
    let forwarded = prometheus.one(
        &format!(
            "sum(rate(sluice_rs_in_packets_total[{WINDOW}])) + sum(rate(sluice_rs_out_packets_total[{WINDOW}]))"
        ),
        t,
    );
    let worker_rx = prometheus.one(
        &format!("sum(rate(sluice_worker_rx_packets_total[{WINDOW}]))"),
        t,
    );
    let port_rx = prometheus.one(
        &format!("sum(rate(sluice_port_rx_packets_total[{WINDOW}]))"),
        t,
    );
    assert!(
        forwarded > 0.0 && forwarded <= worker_rx * 1.05,
        "forwarded {forwarded}/s, received {worker_rx}/s"
    );
    assert!(
        close(worker_rx, port_rx, 5.0, 0.05),
        "worker rx {worker_rx}/s vs port rx {port_rx}/s"
    );

    // Every query of the shipped dashboard parses and returns data.
    let mut failures = Vec::new();
    let queries = dashboard_queries(&repo_root().join("contrib/grafana/sluice-dashboard.json"));
    for (what, expr) in &queries {
        match prometheus.query(expr, t) {
            Err(e) => failures.push(format!("{what}: {expr}: {e}")),
            Ok(v) if v.is_empty() => failures.push(format!("{what}: {expr}: no data")),
            Ok(v) if v.iter().any(|(_, x)| !x.is_finite()) => {
                failures.push(format!("{what}: {expr}: {v:?}"))
            }
            Ok(_) => {}
        }
    }
    assert!(
        failures.is_empty(),
        "dashboard queries:\n{}",
        failures.join("\n")
    );
    // Two of its panels read as the weights ask: per unit of weight, no skew.
    let skew = prometheus.by(
        &queries
            .iter()
            .find(|(w, _)| w.contains("skew per unit of weight"))
            .unwrap()
            .1,
        "service",
        t,
    );
    for service in [RR, WRR] {
        assert!(
            close(skew[service], 1.0, 0.0, 0.25),
            "{service}: skew per unit of weight {}",
            skew[service]
        );
    }
    let busy = prometheus.by(
        &queries
            .iter()
            .find(|(w, _)| w.contains("Worker busy"))
            .unwrap()
            .1,
        "worker",
        t,
    );
    assert!(
        busy["0"] > 0.0 && busy["0"] <= 100.0,
        "worker busy {busy:?}"
    );
    eprintln!(
        "connections/s per service {per_service:?}; rr {a:.1}/{b:.1}, wrr {light:.1}/{heavy:.1}; \
         sessions created {created:.1}/s; packets/s in per service {in_pps:?}, forwarded \
         {forwarded:.1}, worker rx {worker_rx:.1}, port rx {port_rx:.1}; skew per weight \
         {skew:?}; worker busy {busy:?} %; {} dashboard queries",
        queries.len()
    );
    drop(prometheus);
    daemon.stop_clean();
    eprintln!("prometheus test: {:.1} s", began.elapsed().as_secs_f64());
}
