//! `sluice simulate` as a user runs it: the built binary, no DPDK set-up, no root.
//! Exit status (0 / 1 bad workload file / 2 bad usage), the table headers, JSON that
//! parses and carries the seed-002 numbers, and positioned errors for a bad file.
//!
//! Run: `cargo test --release --test integration simulate_cli::`.
use std::path::Path;
use std::process::{Command, Output};

fn sluice(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("simulate")
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run sluice")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Exit code `code`, with both streams in the message if not.
fn assert_exit(o: &Output, code: i32) {
    assert_eq!(
        o.status.code(),
        Some(code),
        "stdout:\n{}\nstderr:\n{}",
        stdout(o),
        stderr(o)
    );
}

#[test]
fn help_exits_0_and_lists_the_workloads() {
    let o = sluice(&["--help"]);
    assert_exit(&o, 0);
    let text = stdout(&o);
    for needle in [
        "usage: sluice simulate",
        "scale-out",
        "few-clients",
        "hetero",
        "--workload FILE",
    ] {
        assert!(text.contains(needle), "{needle}: {text}");
    }
    // The daemon's own help mentions the subcommand.
    let o = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("--help")
        .output()
        .unwrap();
    assert!(stdout(&o).contains("sluice simulate"), "{}", stdout(&o));
}

#[test]
fn scale_out_prints_the_table() {
    let o = sluice(&[
        "scale-out",
        "--schedulers",
        "rr,lc",
        "--churn",
        "5",
        "--minutes",
        "30",
    ]);
    assert_exit(&o, 0);
    let text = stdout(&o);
    assert!(
        text.contains("scheduler      churn     t=5    t=10    t=30    fair  half-share"),
        "{text}"
    );
    assert!(
        text.contains("fair share 16.7% (2 of 12 by weight)"),
        "{text}"
    );
    assert_eq!(
        text.lines().filter(|l| l.starts_with("rr ")).count(),
        1,
        "{text}"
    );
    assert_eq!(
        text.lines().filter(|l| l.starts_with("lc ")).count(),
        1,
        "{text}"
    );
}

/// The seed-002 result end to end, read from `--json`: at 2 %/min churn round robin
/// needs half an hour or so to give the new servers half their share, least
/// connections a few minutes.
#[test]
fn scale_out_json_carries_the_seed_002_result() {
    let o = sluice(&["scale-out", "--json", "--churn", "2", "-s", "rr,lc"]);
    assert_exit(&o, 0);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("JSON");
    let rows = v["rows"].as_array().unwrap();
    let half = |name: &str| {
        rows.iter()
            .find(|r| r["scheduler"] == name)
            .and_then(|r| r["half_share_minute"].as_u64())
            .unwrap_or_else(|| panic!("{name}: {v}"))
    };
    assert!((15..=60).contains(&half("rr")), "rr {}", half("rr"));
    assert!(half("lc") < 8, "lc {}", half("lc"));
    assert!((v["fair_share"].as_f64().unwrap() - 1.0 / 6.0).abs() < 1e-9);
}

#[test]
fn same_seed_same_output() {
    let args = [
        "few-clients",
        "--minutes",
        "20",
        "--churn",
        "20",
        "--seed",
        "42",
    ];
    let a = sluice(&args);
    let b = sluice(&args);
    assert_exit(&a, 0);
    assert_eq!(stdout(&a), stdout(&b));
    let c = sluice(&[
        "few-clients",
        "--minutes",
        "20",
        "--churn",
        "20",
        "--seed",
        "43",
    ]);
    assert_ne!(stdout(&a), stdout(&c), "another seed, other counts");
}

#[test]
fn few_clients_and_hetero_print_their_headers() {
    let o = sluice(&["few-clients", "--minutes", "5"]);
    assert_exit(&o, 0);
    let text = stdout(&o);
    assert!(text.contains("  skew   peak  idle"), "{text}");
    assert!(text.contains("78 long-lived connections"), "{text}");
    // Every scheduler this build has gets a line.
    let o = sluice(&["hetero", "--minutes", "1", "--rate", "50"]);
    assert_exit(&o, 0);
    let text = stdout(&o);
    assert!(
        text.contains("scheduler  server           speed weight   share mean active   peak"),
        "{text}"
    );
    assert!(text.lines().any(|l| l.starts_with("wlc ")), "{text}");
}

#[test]
fn unknown_scheduler_is_exit_2_with_the_known_list() {
    let o = sluice(&["scale-out", "--schedulers", "rr,fastest"]);
    assert_exit(&o, 2);
    let err = stderr(&o);
    assert!(
        err.contains("unknown scheduler \"fastest\" (known: rr, wrr"),
        "{err}"
    );
    assert!(stdout(&o).is_empty());
}

#[test]
fn bad_usage_is_exit_2() {
    for args in [
        &["scale-up"][..],
        &[][..],
        &["scale-out", "--minutes", "zero"][..],
        &["hetero", "--churn", "5"][..],
    ] {
        let o = sluice(args);
        assert_exit(&o, 2);
        assert!(
            stderr(&o).starts_with("sluice simulate: "),
            "{}",
            stderr(&o)
        );
    }
}

#[test]
fn the_example_workloads_run() {
    for file in [
        "config/simulate/scale-out-drain.toml",
        "config/simulate/sticky-office.toml",
    ] {
        assert!(Path::new(env!("CARGO_MANIFEST_DIR")).join(file).exists());
        let o = sluice(&["--workload", file, "--schedulers", "rr"]);
        assert_exit(&o, 0);
        let text = stdout(&o);
        assert!(text.starts_with(&format!("workload {file}")), "{text}");
        assert!(
            text.contains("server          weight speed new conns"),
            "{text}"
        );
    }
}

#[test]
fn a_bad_workload_file_is_exit_1_with_file_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(
        &path,
        "minutes = 10\n\n[[servers]]\nip = \"10.0.0.1\"\n\n[[servers]]\nip = \"10.0.0.2\"\nweight = -1\n\n[[clients]]\nconnections = 4\n",
    )
    .unwrap();
    let o = sluice(&["--workload", path.to_str().unwrap()]);
    assert_exit(&o, 1);
    let err = stderr(&o);
    let expected = format!(
        "{}:8:10: servers[1].weight: -1 is not 0..=65535",
        path.display()
    );
    assert!(err.contains(&expected), "{err}");

    let o = sluice(&["--workload", "/nonexistent/w.toml"]);
    assert_exit(&o, 1);
    assert!(
        stderr(&o).contains("/nonexistent/w.toml: cannot read workload file"),
        "{}",
        stderr(&o)
    );
}
