//! `sluice simulate ...`: argument parsing, running, printing. Exit status: 0 done,
//! 1 the workload file could not be read or is invalid, 2 bad usage (unknown option,
//! bad value, unknown scheduler).
use crate::model::Persistence;
use crate::model::SchedulerKind;
use serde::Serialize;
use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::ExitCode;

use super::workloads::{Common, FewClients, Hetero, ScaleOut};
use super::{custom, report};

pub const USAGE: &str = "usage: sluice simulate WORKLOAD [OPTIONS]
       sluice simulate --workload FILE [--schedulers LIST] [--seed N] [--json]

Replays a connection workload through Sluice's own schedulers (no DPDK, no root) and
prints what each scheduler does with it. See docs/SIMULATE.md.

Workloads:
  scale-out     10 servers x 100 long-lived connections, 2 servers added at t=0,
                C% of connections reconnect per minute: how soon do the new servers
                get their share? (seed 002)
      --churn LIST         percent per minute, one run each (default 2,5,20)
      --old N --new N      servers before / added at t=0 (default 10, 2)
      --per-server N       long-lived connections per old server (default 100)
      --clients N          client hosts holding them (default 100)
  few-clients   a few clients with long-lived connections over 8 servers: per-server
                counts and skew, WARN above 300% (seed 000)
      --connections N|LIST per client (default 20,20,19,19: 78 as in the seed)
      --clients N          number of clients (default 4; cycles the list)
      --servers N          (default 8)
      --churn PCT          percent per minute reconnecting (default 5)
  hetero        servers of different speeds under short connections: who gets what
                share (seed 001)
      --speeds LIST        relative speed per server (default 2,1,1,1)
      --weights LIST       weight per server (default 1 each)
      --rate N             new connections per second (default 200)
      --lifetime SECS      mean lifetime at speed 1 (default 1)
      --sources N          client addresses (default 1000)
  --workload FILE  a TOML workload (examples in config/simulate/)

Common options:
  -s, --schedulers LIST    comma-separated names, or `all` (defaults: scale-out
                           rr,lc,wlc; others all)
      --minutes N          simulated minutes (default 60; hetero 10)
      --seed N             random seed (default 1): same seed, same numbers
      --step SECS          time step, divides 60 (default 1)
      --workers N          data-plane workers, each with its own scheduler (default 1)
  -p, --persistent SECS    persistence timeout, as ipvsadm -p
  -M, --netmask MASK       persistence netmask, as ipvsadm -M (default 255.255.255.255)
      --linger SECS        closed connections count as inactive this long (default 0)
      --json               machine-readable output
  -h, --help               this text

Exit status: 0 done, 1 unreadable or invalid workload file, 2 bad usage.";

const COMMON: &[&str] = &[
    "schedulers",
    "minutes",
    "seed",
    "step",
    "workers",
    "persistent",
    "netmask",
    "linger",
    "json",
];

/// What went wrong, and the exit status for it.
#[derive(Debug)]
enum Failure {
    Usage(String),
    Workload(String),
}

/// Runs `sluice simulate` with `args` (the words after `simulate`).
pub fn main(args: &[String]) -> ExitCode {
    match run(args) {
        Ok(output) => {
            print!("{output}");
            ExitCode::SUCCESS
        }
        Err(Failure::Usage(e)) => {
            eprintln!("sluice simulate: {e}\n(see sluice simulate --help)");
            ExitCode::from(2)
        }
        Err(Failure::Workload(e)) => {
            eprintln!("sluice simulate: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Parses, runs and renders; the text to print on success.
fn run(args: &[String]) -> Result<String, Failure> {
    let parsed = parse_args(args).map_err(Failure::Usage)?;
    let Some(Parsed { workload, options }) = parsed else {
        return Ok(format!("{USAGE}\n"));
    };
    let json = options.contains_key("json");
    let usage = Failure::Usage;
    match workload.as_str() {
        "scale-out" => {
            allow(
                &workload,
                &options,
                &["churn", "old", "new", "per-server", "clients"],
            )?;
            let mut w = ScaleOut::default();
            apply_common(&mut w.common, &options).map_err(usage)?;
            if let Some(v) = options.get("churn") {
                w.churn = float_list("--churn", v, |c| (0.0..=100.0).contains(&c), "0..=100")
                    .map_err(usage)?;
            }
            set_u32(&mut w.old_servers, &options, "old", 1..=1000)?;
            set_u32(&mut w.new_servers, &options, "new", 1..=1000)?;
            set_u32(&mut w.per_server, &options, "per-server", 0..=100_000)?;
            set_u32(&mut w.clients, &options, "clients", 1..=1_000_000)?;
            let r = w.run().map_err(usage)?;
            render(json, &r, report::scale_out)
        }
        "few-clients" => {
            allow(
                &workload,
                &options,
                &["churn", "clients", "connections", "servers"],
            )?;
            let mut w = FewClients::default();
            apply_common(&mut w.common, &options).map_err(usage)?;
            if let Some(v) = options.get("churn") {
                w.churn = float("--churn", v, |c| (0.0..=100.0).contains(&c), "0..=100")
                    .map_err(usage)?;
            }
            set_u32(&mut w.servers, &options, "servers", 1..=1000)?;
            let pattern = match options.get("connections") {
                Some(v) => uint_list("--connections", v, 0..=1_000_000).map_err(usage)?,
                None => w.connections.clone(),
            };
            let clients = match options.get("clients") {
                Some(v) => {
                    let n = uint("--clients", v, 1..=10_000).map_err(usage)?;
                    if pattern.len() > 1
                        && options.contains_key("connections")
                        && pattern.len() != n as usize
                    {
                        return Err(usage(format!(
                            "--clients {n} but --connections lists {} clients",
                            pattern.len()
                        )));
                    }
                    n as usize
                }
                None if pattern.len() == 1 => 4,
                None => pattern.len(),
            };
            w.connections = (0..clients).map(|i| pattern[i % pattern.len()]).collect();
            let r = w.run().map_err(usage)?;
            render(json, &r, report::few_clients)
        }
        "hetero" => {
            allow(
                &workload,
                &options,
                &["speeds", "weights", "rate", "lifetime", "sources"],
            )?;
            let mut w = Hetero::default();
            apply_common(&mut w.common, &options).map_err(usage)?;
            if let Some(v) = options.get("speeds") {
                w.speeds =
                    float_list("--speeds", v, |s| s > 0.0 && s <= 1e6, "> 0").map_err(usage)?;
                w.weights = vec![1; w.speeds.len()];
            }
            if let Some(v) = options.get("weights") {
                w.weights = uint_list("--weights", v, 0..=65535).map_err(usage)?;
                if w.weights.len() != w.speeds.len() {
                    return Err(usage(format!(
                        "--weights lists {} servers, --speeds {}",
                        w.weights.len(),
                        w.speeds.len()
                    )));
                }
            }
            if let Some(v) = options.get("rate") {
                w.rate = float("--rate", v, |r| r > 0.0 && r <= 1e6, "a rate 0..=1000000")
                    .map_err(usage)?;
            }
            if let Some(v) = options.get("lifetime") {
                w.lifetime_s =
                    float("--lifetime", v, |l| l > 0.0 && l <= 1e7, "> 0").map_err(usage)?;
            }
            set_u32(&mut w.sources, &options, "sources", 1..=16_777_216)?;
            let r = w.run().map_err(usage)?;
            render(json, &r, report::hetero)
        }
        "custom" => {
            if let Some(extra) = options
                .keys()
                .find(|k| !["workload", "schedulers", "seed", "json"].contains(k))
            {
                return Err(usage(format!(
                    "--{extra} does not apply to --workload (the file sets it); only --schedulers, --seed and --json do"
                )));
            }
            let path = PathBuf::from(&options["workload"]);
            let mut w = custom::load(&path).map_err(|e| Failure::Workload(e.to_string()))?;
            if let Some(v) = options.get("schedulers") {
                w.schedulers = schedulers(v).map_err(usage)?;
            }
            if let Some(v) = options.get("seed") {
                w.scenario.seed = uint64("--seed", v).map_err(usage)?;
            }
            let r = w.run().map_err(Failure::Workload)?;
            render(json, &r, report::custom)
        }
        other => Err(usage(format!(
            "unknown workload {other:?} (known: scale-out, few-clients, hetero, or --workload FILE)"
        ))),
    }
}

fn render<T: Serialize>(json: bool, report: &T, text: fn(&T) -> String) -> Result<String, Failure> {
    if json {
        let mut s = serde_json::to_string_pretty(report)
            .map_err(|e| Failure::Workload(format!("cannot encode the report as JSON: {e}")))?;
        s.push('\n');
        Ok(s)
    } else {
        Ok(text(report))
    }
}

struct Parsed {
    /// "scale-out", "few-clients", "hetero", or "custom" for `--workload FILE`.
    workload: String,
    /// Canonical option name (no dashes) to its value ("" for flags).
    options: BTreeMap<&'static str, String>,
}

/// Canonical name of an option and whether it takes a value.
fn option(name: &str) -> Option<(&'static str, bool)> {
    Some(match name {
        "-s" | "--schedulers" => ("schedulers", true),
        "--minutes" => ("minutes", true),
        "--seed" => ("seed", true),
        "--step" => ("step", true),
        "--workers" => ("workers", true),
        "-p" | "--persistent" => ("persistent", true),
        "-M" | "--netmask" => ("netmask", true),
        "--linger" => ("linger", true),
        "--json" => ("json", false),
        "--churn" => ("churn", true),
        "--old" => ("old", true),
        "--new" => ("new", true),
        "--per-server" => ("per-server", true),
        "--clients" => ("clients", true),
        "--connections" => ("connections", true),
        "--servers" => ("servers", true),
        "--speeds" => ("speeds", true),
        "--weights" => ("weights", true),
        "--rate" => ("rate", true),
        "--lifetime" => ("lifetime", true),
        "--sources" => ("sources", true),
        "--workload" => ("workload", true),
        _ => return None,
    })
}

/// None for `--help`.
fn parse_args(args: &[String]) -> Result<Option<Parsed>, String> {
    if args.iter().any(|a| a == "-h" || a == "--help") {
        return Ok(None);
    }
    let mut workload: Option<String> = None;
    let mut options = BTreeMap::new();
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        if !arg.starts_with('-') || arg == "-" {
            if let Some(first) = &workload {
                return Err(format!(
                    "unexpected argument {arg:?} after workload {first:?}"
                ));
            }
            workload = Some(arg.clone());
            continue;
        }
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
            _ => (arg.as_str(), None),
        };
        let Some((key, takes_value)) = option(name) else {
            return Err(format!("unknown option {name:?}"));
        };
        let value = match (takes_value, inline) {
            (true, Some(v)) => v,
            (true, None) => it.next().cloned().ok_or(format!("{name} needs a value"))?,
            (false, None) => String::new(),
            (false, Some(_)) => return Err(format!("{name} takes no value")),
        };
        if options.insert(key, value).is_some() {
            return Err(format!("{name} given twice"));
        }
    }
    let workload =
        match (workload, options.contains_key("workload")) {
            (Some(w), false) => w,
            (None, true) => "custom".to_string(),
            (Some(w), true) => return Err(format!("both workload {w:?} and --workload given")),
            (None, false) => return Err(
                "no workload: name one (scale-out, few-clients, hetero) or give --workload FILE"
                    .into(),
            ),
        };
    Ok(Some(Parsed { workload, options }))
}

/// Rejects options that `workload` does not take.
fn allow(
    workload: &str,
    options: &BTreeMap<&'static str, String>,
    own: &[&str],
) -> Result<(), Failure> {
    match options
        .keys()
        .find(|k| !own.contains(k) && !COMMON.contains(k))
    {
        Some(k) => Err(Failure::Usage(format!(
            "--{k} does not apply to {workload}"
        ))),
        None => Ok(()),
    }
}

fn apply_common(c: &mut Common, options: &BTreeMap<&'static str, String>) -> Result<(), String> {
    if let Some(v) = options.get("schedulers") {
        c.schedulers = schedulers(v)?;
    }
    if let Some(v) = options.get("minutes") {
        c.minutes = uint("--minutes", v, 1..=super::engine::MAX_MINUTES)?;
    }
    if let Some(v) = options.get("seed") {
        c.seed = uint64("--seed", v)?;
    }
    if let Some(v) = options.get("step") {
        c.step_s = uint("--step", v, 1..=60)?;
        if 60 % c.step_s != 0 {
            return Err(format!("--step: {} does not divide 60", c.step_s));
        }
    }
    if let Some(v) = options.get("workers") {
        c.workers = uint("--workers", v, 1..=256)?;
    }
    if let Some(v) = options.get("linger") {
        c.linger_s = uint("--linger", v, 0..=86_400)?;
    }
    c.persistence = match (options.get("persistent"), options.get("netmask")) {
        (None, None) => None,
        (None, Some(_)) => return Err("-M/--netmask needs -p/--persistent (as in ipvsadm)".into()),
        (Some(t), mask) => {
            let mut p = Persistence::new(uint("--persistent", t, 1..=2_678_400)?);
            if let Some(m) = mask {
                p.netmask = m
                    .parse::<Ipv4Addr>()
                    .map_err(|_| format!("--netmask: {m:?} is not a netmask a.b.c.d"))?;
                if !p.netmask_is_contiguous() {
                    return Err(format!("--netmask: {m} is not a contiguous netmask"));
                }
            }
            Some(p)
        }
    };
    Ok(())
}

/// `rr,wlc` or `all`; unknown names give `SchedulerKind::from_str`'s error.
fn schedulers(v: &str) -> Result<Vec<SchedulerKind>, String> {
    if v == "all" {
        return Ok(SchedulerKind::ALL.to_vec());
    }
    let kinds = v
        .split(',')
        .map(|n| n.trim().parse::<SchedulerKind>())
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("--schedulers: {e}"))?;
    if kinds.is_empty() {
        return Err("--schedulers: empty list".into());
    }
    Ok(kinds)
}

fn uint(name: &str, v: &str, range: std::ops::RangeInclusive<u32>) -> Result<u32, String> {
    v.parse::<u32>()
        .ok()
        .filter(|n| range.contains(n))
        .ok_or_else(|| {
            format!(
                "{name}: {v:?} is not a whole number {}..={}",
                range.start(),
                range.end()
            )
        })
}

fn uint64(name: &str, v: &str) -> Result<u64, String> {
    v.parse::<u64>()
        .map_err(|_| format!("{name}: {v:?} is not a whole number >= 0"))
}

fn set_u32(
    field: &mut u32,
    options: &BTreeMap<&'static str, String>,
    key: &str,
    range: std::ops::RangeInclusive<u32>,
) -> Result<(), Failure> {
    if let Some(v) = options.get(key) {
        *field = uint(&format!("--{key}"), v, range).map_err(Failure::Usage)?;
    }
    Ok(())
}

fn float(name: &str, v: &str, ok: impl Fn(f64) -> bool, rule: &str) -> Result<f64, String> {
    v.trim()
        .parse::<f64>()
        .ok()
        .filter(|x| x.is_finite() && ok(*x))
        .ok_or_else(|| format!("{name}: {v:?} is not a number {rule}"))
}

fn float_list(
    name: &str,
    v: &str,
    ok: impl Fn(f64) -> bool + Copy,
    rule: &str,
) -> Result<Vec<f64>, String> {
    v.split(',').map(|x| float(name, x, ok, rule)).collect()
}

fn uint_list(
    name: &str,
    v: &str,
    range: std::ops::RangeInclusive<u32>,
) -> Result<Vec<u32>, String> {
    v.split(',')
        .map(|x| uint(name, x.trim(), range.clone()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(line: &str) -> Vec<String> {
        line.split_whitespace().map(String::from).collect()
    }

    fn usage_error(line: &str) -> String {
        match run(&args(line)) {
            Err(Failure::Usage(e)) => e,
            other => panic!("{line}: expected a usage error, got {other:?}"),
        }
    }

    #[test]
    fn help_and_usage_errors() {
        assert!(run(&args("--help"))
            .unwrap()
            .starts_with("usage: sluice simulate"));
        assert!(run(&args("scale-out -h")).unwrap().contains("Workloads:"));
        assert!(usage_error("").contains("no workload"));
        assert!(usage_error("scale-up").contains("unknown workload \"scale-up\""));
        assert!(usage_error("scale-out --bogus 1").contains("unknown option \"--bogus\""));
        assert!(usage_error("scale-out --minutes").contains("--minutes needs a value"));
        assert!(usage_error("scale-out --minutes 0").contains("is not a whole number 1..="));
        assert!(
            usage_error("scale-out --speeds 1,2").contains("--speeds does not apply to scale-out")
        );
        assert!(usage_error("hetero --churn 5").contains("--churn does not apply to hetero"));
        assert!(usage_error("scale-out --step 7").contains("does not divide 60"));
        assert!(usage_error("few-clients -M 255.255.255.0").contains("needs -p"));
        assert!(
            usage_error("few-clients --clients 3 --connections 1,2").contains("lists 2 clients")
        );
        assert!(
            usage_error("--workload x.toml --minutes 5").contains("does not apply to --workload")
        );
        assert!(usage_error("scale-out --seed 1 --seed=2").contains("given twice"));
    }

    #[test]
    fn unknown_scheduler_uses_the_scheduler_error() {
        let e = usage_error("scale-out --schedulers rr,fastest");
        let expected = "fastest".parse::<SchedulerKind>().unwrap_err();
        assert_eq!(e, format!("--schedulers: {expected}"));
    }

    #[test]
    fn options_reach_the_workload() {
        let out = run(&args(
            "few-clients --schedulers rr --clients 2 --connections 3 --servers 4 --minutes 2 --json",
        ))
        .unwrap();
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["workload"], "few-clients");
        assert_eq!(v["params"]["connections"], serde_json::json!([3, 3]));
        assert_eq!(v["rows"][0]["counts"].as_array().unwrap().len(), 4);
        assert_eq!(v["rows"][0]["scheduler"], "rr");

        let out = run(&args(
            "hetero --speeds 3,1 --rate=50 --minutes 1 -s wrr --json",
        ))
        .unwrap();
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(v["params"]["weights"], serde_json::json!([1, 1]));
        assert_eq!(v["params"]["rate"], 50.0);
        assert_eq!(v["rows"].as_array().unwrap().len(), 1);
    }

    #[test]
    fn a_bad_workload_file_is_exit_1_material() {
        match run(&args("--workload /nonexistent/w.toml")) {
            Err(Failure::Workload(e)) => assert!(e.contains("/nonexistent/w.toml"), "{e}"),
            other => panic!("{other:?}"),
        }
    }
}
