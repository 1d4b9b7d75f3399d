//! `sluice-gen bench`: the orchestrator. For each scenario it writes a Sluice config
//! into a private temp dir, starts the generator (`sluice-gen run`, memif server) and
//! the device under test (Sluice or dpdk-testpmd, memif client) as child processes
//! with unique EAL file prefixes and socket names, steps them through the phases,
//! reads the DUT's counters and the generator's figures, and stops everything, also
//! on failure: every wait is bounded and a guard kills what is left.
use crate::engine::{self, FlowOrder, Mode, Workload, MAX_LIPS};

/// Sluice accepts at most this many local addresses per service.
const LIPS_PER_SERVICE: u16 = 64;
use serde::Serialize;
use sluice::control::client;
use sluice::control::protocol::Request;
use sluice::control::report::StatusReport;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

/// FullNAT local ports per local address (Sluice's default range 1024..=65535).
const PORTS_PER_LIP: u64 = 65535 - 1024 + 1;
const REAL_SERVERS: u8 = 4;
/// Extra session-table room for connection churn: closed connections stay in the
/// table until their (1 s) FIN/TIME_WAIT timeouts expire.
const CHURN_SESSIONS: u64 = 1 << 20;
/// Session-table room for a SYN flood without the proxy: small enough that a flood
/// fills it within a few seconds of the window (each half-open session stays for the
/// 60 s SYN_RECV timeout), so the table's behaviour when full is measured too.
const FLOOD_ROOM: u64 = 1 << 18;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Set {
    Quick,
    Full,
}

pub struct Opts {
    set: Set,
    scenarios: Option<Vec<String>>,
    duration: Option<f64>,
    out: Option<PathBuf>,
    json: Option<PathBuf>,
    validate: bool,
    window: usize,
    /// The order the generator's requests visit the established flows in.
    order: FlowOrder,
    frame_size: usize,
    gen_mode: Option<Mode>,
    sluice: PathBuf,
    testpmd: PathBuf,
    verbose: bool,
    command_line: String,
    /// Runs per scenario at most, while its polling threads lose more than
    /// `max_stolen` percent of the window to other processes.
    attempts: u32,
    max_stolen: f64,
    /// Service changes (`sluicectl -e`, weight flips) issued during each Sluice
    /// scenario's window, to measure how fast they reach the workers under load.
    hot_changes: u32,
    /// Session sync on (`[sync]` towards a peer on 127.0.0.1 that only receives):
    /// measures sync's traffic and its cost in the workers' cycles.
    sync: bool,
    sluicectl: PathBuf,
    /// Run testpmd 5tswap before and after every Sluice scenario (see [`with_brackets`]).
    brackets: bool,
}

pub fn parse(args: &[String]) -> Result<Opts, String> {
    let exe = std::env::current_exe().map_err(|e| format!("own path: {e}"))?;
    let mut o = Opts {
        set: Set::Quick,
        scenarios: None,
        duration: None,
        out: None,
        json: None,
        validate: false,
        window: 1024,
        order: FlowOrder::Scrambled,
        frame_size: 64,
        gen_mode: None,
        sluice: exe.with_file_name("sluice"),
        testpmd: PathBuf::from("/usr/bin/dpdk-testpmd"),
        verbose: false,
        attempts: 2,
        max_stolen: 5.0,
        hot_changes: 0,
        sync: false,
        sluicectl: exe.with_file_name("sluicectl"),
        brackets: true,
        command_line: std::iter::once("sluice-gen bench".to_string())
            .chain(args.iter().cloned())
            .collect::<Vec<_>>()
            .join(" "),
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"))
        };
        match flag.as_str() {
            "--quick" => o.set = Set::Quick,
            "--full" => o.set = Set::Full,
            "--validate" => o.validate = true,
            "--verbose" => o.verbose = true,
            "--scenarios" => {
                let v = value()?;
                let names: Vec<String> = v
                    .split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(String::from)
                    .collect();
                for n in &names {
                    Scenario::parse(n)?;
                }
                o.scenarios = Some(names);
            }
            "--duration" => {
                let v = value()?;
                o.duration = Some(
                    v.parse()
                        .ok()
                        .filter(|d: &f64| *d > 0.0 && d.is_finite())
                        .ok_or_else(|| format!("--duration {v:?}"))?,
                );
            }
            "--out" => o.out = Some(PathBuf::from(value()?)),
            "--json" => o.json = Some(PathBuf::from(value()?)),
            "--window" => {
                let v = value()?;
                o.window = v
                    .parse()
                    .ok()
                    .filter(|w| (1..=engine::MAX_WINDOW).contains(w))
                    .ok_or_else(|| format!("--window {v:?}"))?;
            }
            "--order" => {
                let v = value()?;
                o.order = FlowOrder::parse(&v)
                    .ok_or_else(|| format!("--order {v:?}: scrambled or creation"))?;
            }
            "--frame-size" => {
                let v = value()?;
                o.frame_size = v
                    .parse()
                    .ok()
                    .filter(|f| (engine::MIN_FRAME..=engine::MAX_FRAME).contains(f))
                    .ok_or_else(|| format!("--frame-size {v:?}"))?;
            }
            "--gen-mode" => {
                let v = value()?;
                o.gen_mode = Some(
                    Mode::parse(&v)
                        .filter(|m| !m.is_swap())
                        .ok_or_else(|| format!("--gen-mode {v:?}: dr, nat or fullnat"))?,
                );
            }
            "--attempts" => {
                let v = value()?;
                o.attempts = v
                    .parse()
                    .ok()
                    .filter(|a| (1..=10).contains(a))
                    .ok_or_else(|| format!("--attempts {v:?}: 1..=10"))?;
            }
            "--max-stolen" => {
                let v = value()?;
                o.max_stolen = v
                    .parse()
                    .ok()
                    .filter(|p: &f64| (0.0..=100.0).contains(p))
                    .ok_or_else(|| format!("--max-stolen {v:?}: a percentage"))?;
            }
            "--hot-changes" => {
                let v = value()?;
                o.hot_changes = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=1000).contains(n))
                    .ok_or_else(|| format!("--hot-changes {v:?}: 1..=1000"))?;
            }
            "--sync" => o.sync = true,
            "--no-brackets" => o.brackets = false,
            "--sluicectl" => o.sluicectl = PathBuf::from(value()?),
            "--sluice" => o.sluice = PathBuf::from(value()?),
            "--testpmd" => o.testpmd = PathBuf::from(value()?),
            other => return Err(format!("unknown option {other:?}")),
        }
    }
    Ok(o)
}

#[derive(Clone, Debug, PartialEq)]
enum Dut {
    Sluice { mode: Mode, workers: u16 },
    Testpmd { fwd: &'static str },
}

#[derive(Clone, Debug, PartialEq)]
struct Scenario {
    name: String,
    dut: Dut,
    sessions: u32,
    workload: Workload,
    /// `synflood`: the flood service runs the SYN proxy (`-noproxy`: it does not).
    synproxy: bool,
}

/// Flows testpmd is driven with (it keeps no state; they only vary the headers).
const TESTPMD_FLOWS: u32 = 1000;

impl Scenario {
    /// `testpmd-5tswap`, `testpmd-macswap`, or
    /// `{dr|nat|fullnat}-{1k|1m|10m|N}-{established|connections|mixed}[-2w]`, or
    /// `nat-{1k|1m|10m|N}-synflood[-noproxy]`.
    fn parse(name: &str) -> Result<Scenario, String> {
        let bad = || {
            format!(
                "scenario {name:?}: expected testpmd-5tswap, testpmd-macswap, \
                 MODE-SIZE-WORKLOAD[-2w] (MODE dr|nat|fullnat, SIZE 1k|1m|10m|<n>, \
                 WORKLOAD established|connections|mixed) or nat-SIZE-synflood[-noproxy]"
            )
        };
        match name {
            "testpmd-5tswap" | "testpmd-macswap" => {
                return Ok(Scenario {
                    name: name.into(),
                    dut: Dut::Testpmd {
                        fwd: if name.ends_with("5tswap") {
                            "5tswap"
                        } else {
                            "macswap"
                        },
                    },
                    sessions: TESTPMD_FLOWS,
                    workload: Workload::Established,
                    synproxy: false,
                })
            }
            _ => {}
        }
        let parts: Vec<&str> = name.split('-').collect();
        let (parts, workers, synproxy) = match parts.as_slice() {
            [a, b, "synflood", "noproxy"] => ([*a, *b, "synflood"], 1, false),
            [a, b, "synflood"] => ([*a, *b, "synflood"], 1, true),
            [a, b, c, "2w"] if *c != "synflood" => ([*a, *b, *c], 2, false),
            [a, b, c] => ([*a, *b, *c], 1, false),
            _ => return Err(bad()),
        };
        let mode = Mode::parse(parts[0])
            .filter(|m| !m.is_swap())
            .ok_or_else(bad)?;
        let sessions = match parts[1] {
            "1k" => 1_000,
            "1m" => 1_000_000,
            "10m" => 10_000_000,
            n => n
                .parse()
                .ok()
                .filter(|n| *n >= 1 && *n <= 20_000_000)
                .ok_or_else(bad)?,
        };
        let workload = Workload::parse(parts[2]).ok_or_else(bad)?;
        // The flood service is a NAT service (FullNAT would need its own local
        // addresses besides the established flows' service).
        if workload == Workload::SynFlood && mode != Mode::Nat {
            return Err(bad());
        }
        Ok(Scenario {
            name: name.into(),
            dut: Dut::Sluice { mode, workers },
            sessions,
            workload,
            synproxy,
        })
    }

    fn workers(&self) -> u16 {
        match self.dut {
            Dut::Sluice { workers, .. } => workers,
            Dut::Testpmd { .. } => 1,
        }
    }

    fn is_sluice(&self) -> bool {
        matches!(self.dut, Dut::Sluice { .. })
    }
}

/// The reference every Sluice row is compared with.
const REFERENCE: &str = "testpmd-5tswap";

/// The run order: `scenarios` with testpmd 5tswap inserted so that a testpmd 5tswap
/// run comes right before and right after every Sluice scenario. Neighbouring Sluice
/// scenarios share the run between them (N Sluice scenarios in a row cost N + 1
/// testpmd runs), and a testpmd 5tswap already in the list at such a place is used
/// as it is. testpmd's own figure moves by up to 2x between minutes on this VM, so the
/// reference is sampled throughout the run, not only at its ends.
fn with_brackets(scenarios: Vec<Scenario>) -> Vec<Scenario> {
    let reference = Scenario::parse(REFERENCE).expect("the reference's name parses");
    let mut out: Vec<Scenario> = Vec::with_capacity(2 * scenarios.len() + 1);
    for sc in scenarios {
        let after_sluice = out.last().is_some_and(Scenario::is_sluice);
        let after_reference = out.last().is_some_and(|l| l.name == REFERENCE);
        if (sc.is_sluice() || after_sluice) && sc.name != REFERENCE && !after_reference {
            out.push(reference.clone());
        }
        out.push(sc);
    }
    if out.last().is_some_and(Scenario::is_sluice) {
        out.push(reference);
    }
    out
}

/// The quick set's scenarios; [`with_brackets`] puts testpmd 5tswap around each
/// Sluice one.
fn quick_set() -> Vec<&'static str> {
    vec![
        "testpmd-macswap",
        "nat-1k-established",
        "fullnat-1k-established",
        "dr-1k-established",
        "nat-1m-established",
        "fullnat-1m-established",
        "nat-1k-connections",
        "fullnat-1k-mixed",
    ]
}

fn full_set() -> Vec<String> {
    let mut v = vec!["testpmd-macswap".to_string()];
    for mode in ["dr", "nat", "fullnat"] {
        for size in ["1k", "1m", "10m"] {
            for w in ["established", "connections", "mixed"] {
                v.push(format!("{mode}-{size}-{w}"));
            }
        }
    }
    for mode in ["dr", "nat", "fullnat"] {
        for w in ["established", "connections"] {
            v.push(format!("{mode}-1m-{w}-2w"));
        }
    }
    v.push("nat-1k-synflood".into());
    v.push("nat-1k-synflood-noproxy".into());
    v
}

pub fn list() {
    println!("quick set: {}", quick_set().join(","));
    println!("full set:  {}", full_set().join(","));
    println!("(unless --no-brackets, testpmd-5tswap runs before and after every Sluice scenario)");
    println!(
        "any name:  testpmd-5tswap | testpmd-macswap | MODE-SIZE-WORKLOAD[-2w]\n           \
         MODE dr|nat|fullnat, SIZE 1k|1m|10m|<n>, WORKLOAD established|connections|mixed\n           \
         nat-SIZE-synflood[-noproxy]: spoofed SYNs to a second NAT service with (without) the SYN proxy"
    );
}

/// One scenario's figures (a table row, and the JSON the tests read).
#[derive(Clone, Debug, Default, Serialize)]
pub struct Row {
    pub name: String,
    pub dut: String,
    pub mode: String,
    pub sessions: u32,
    pub workload: String,
    pub workers: u16,
    pub oversubscribed: bool,
    pub ok: bool,
    pub error: Option<String>,
    /// DUT busy TSC cycles per received packet (Sluice: worker busy_cycles /
    /// rx_packets; testpmd: its --record-core-cycles figure).
    pub cycles_per_packet: Option<f64>,
    /// Sluice rows: cycles_per_packet over the median of the cycles/packet of every
    /// testpmd 5tswap row of the run (`testpmd_median_cycles`), and its range over
    /// those rows: over the slowest (`ratio_to_testpmd_min`) and over the fastest
    /// (`ratio_to_testpmd_max`).
    pub ratio_to_testpmd: Option<f64>,
    pub ratio_to_testpmd_min: Option<f64>,
    pub ratio_to_testpmd_max: Option<f64>,
    /// The run's testpmd 5tswap rows that succeeded: how many, and the median, lowest
    /// and highest of their cycles/packet (the same on every Sluice row of a run).
    pub testpmd_runs: usize,
    pub testpmd_median_cycles: Option<f64>,
    pub testpmd_min_cycles: Option<f64>,
    pub testpmd_max_cycles: Option<f64>,
    /// The testpmd 5tswap runs right before and right after this Sluice row (its
    /// brackets), and cycles_per_packet over their mean (over the one there is, when
    /// the other failed or is missing).
    pub bracket_before_cycles: Option<f64>,
    pub bracket_after_cycles: Option<f64>,
    pub ratio_to_brackets: Option<f64>,
    pub dut_rx_packets: Option<u64>,
    pub dut_mpps: Option<f64>,
    pub gen_mpps: f64,
    /// Share of the generator loop's time spent on iterations that received packets.
    pub gen_busy_percent: f64,
    /// The DUT's busy cycles over the window's cycles, per worker: Sluice's workers'
    /// busy_cycles / (window x TSC rate); testpmd: its cycles/packet x packets per
    /// second / TSC rate. (Not Sluice's `busy_percent`: see `absorb_status`.)
    pub dut_busy_percent: Option<f64>,
    pub tsc_hz: u64,
    /// Time the DUT's and the generator's polling threads spent runnable but waiting
    /// for their CPU during the window (another process had it), as a share of the
    /// window: the machine's noise, measured (`/proc/PID/task/TID/schedstat`).
    pub dut_stolen_percent: Option<f64>,
    /// CPU 0 <-> CPU 1 cache-line round trip measured just before the scenario (ns).
    pub core_to_core_ns: Option<f64>,
    pub gen_stolen_percent: Option<f64>,
    pub new_sessions_per_s_per_worker: Option<f64>,
    pub gen_connections_per_s: f64,
    pub gen_requests_per_s: f64,
    pub bytes_per_session: Option<f64>,
    pub table_bytes: Option<u64>,
    pub capacity_per_worker: Option<u64>,
    pub live_sessions: Option<u64>,
    pub latency_p50_ns: Option<u64>,
    pub latency_p99_ns: Option<u64>,
    pub probe_p50_ns: Option<u64>,
    pub probe_p99_ns: Option<u64>,
    /// Passes through the DUT per round trip (2 for NAT/FullNAT, 1 for DR, testpmd).
    pub dut_passes: u64,
    /// Latency one pass through Sluice adds over one through testpmd 5tswap, from the
    /// one-in-flight probes: probe / passes - the median of the testpmd 5tswap rows'.
    pub added_p50_ns: Option<i64>,
    pub added_p99_ns: Option<i64>,
    pub dut_drops: Option<u64>,
    pub dut_drop_reasons: BTreeMap<String, u64>,
    /// SYN flood (`synflood` scenarios): whether the flood service ran the SYN proxy;
    /// SYNs the generator sent from spoofed sources in the window, SYN-ACKs that came
    /// back for them (per second: the SYN rate the worker absorbed), flood SYNs the
    /// real servers received, and the SYN-ACKs of each 100 ms of the window.
    pub synproxy: bool,
    pub flood_syns: u64,
    pub flood_syn_acks: u64,
    pub flood_syn_acks_per_s: f64,
    pub flood_syns_at_rs: u64,
    pub flood_syn_acks_per_100ms: Vec<u64>,
    /// Seconds into the window of the first 100 ms that answered fewer than a tenth
    /// of the best 100 ms (the table full, say); `None` when no 100 ms fell that low.
    pub flood_collapse_s: Option<f64>,
    /// SYN-ACKs per second before the collapse (the whole window without one).
    pub flood_syn_acks_per_s_before_collapse: Option<f64>,
    /// Sluice's `synproxy_cookies_sent` and `half_open_reclaimed` (half-open sessions
    /// it evicted, oldest first, to make room in a full table) over the window.
    pub cookies_sent: Option<u64>,
    pub half_open_reclaimed: Option<u64>,
    /// Sessions Sluice created in the window (all workers).
    pub sessions_created: Option<u64>,
    pub established: u64,
    pub connections: u64,
    pub requests: u64,
    pub lost: u64,
    pub gen_packets: u64,
    pub validation_failures: BTreeMap<String, u64>,
    pub establish_s: f64,
    pub measure_s: f64,
    pub local_addresses: u16,
    pub vips: u32,
    /// Which run of the scenario this is, and how many were made (noisy runs are
    /// repeated; the least disturbed one is kept).
    pub attempt: u32,
    pub attempts: u32,
    /// `--hot-changes`: changes issued with `sluicectl -e` during the window, and
    /// Sluice's own measure of publish -> every worker adopted for them (from
    /// `status`), plus how long each `sluicectl` command took end to end.
    pub hot_changes: u32,
    pub adoption_publishes: Option<u64>,
    pub adoption_late: Option<u64>,
    pub adoption_within_1ms: Option<u64>,
    pub adoption_p50_ns: Option<u64>,
    pub adoption_p99_ns: Option<u64>,
    pub adoption_max_ns: Option<u64>,
    pub sluicectl_p50_ns: Option<u64>,
    pub sluicectl_max_ns: Option<u64>,
    /// `--sync`: what the sync sender sent during the window (from `sluicectl sync`).
    pub sync_events: Option<u64>,
    pub sync_messages: Option<u64>,
    pub sync_bytes: Option<u64>,
    pub sync_events_dropped: Option<u64>,
}

impl Row {
    /// The larger of the two stolen shares (0 when unknown).
    fn stolen(&self) -> f64 {
        self.dut_stolen_percent
            .unwrap_or(0.0)
            .max(self.gen_stolen_percent.unwrap_or(0.0))
    }
}

pub fn main(o: Opts) -> i32 {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("sluice-gen bench: run as root (DPDK needs it)");
        return 2;
    }
    let names: Vec<String> = match &o.scenarios {
        Some(n) => n.clone(),
        None if o.set == Set::Quick => quick_set().iter().map(|s| s.to_string()).collect(),
        None => full_set(),
    };
    let mut scenarios: Vec<Scenario> = names
        .iter()
        .map(|n| Scenario::parse(n).expect("checked while parsing"))
        .collect();
    if o.brackets {
        scenarios = with_brackets(scenarios);
    }
    if !o.sluice.exists() && scenarios.iter().any(Scenario::is_sluice) {
        eprintln!(
            "sluice-gen bench: no sluice binary at {} (cargo build --release --bins, or --sluice PATH)",
            o.sluice.display()
        );
        return 2;
    }
    if !o.testpmd.exists() && scenarios.iter().any(|s| !s.is_sluice()) {
        eprintln!(
            "sluice-gen bench: no dpdk-testpmd at {} (the reference; Debian's dpdk-dev \
             package, --testpmd PATH, or --no-brackets to run only the listed scenarios)",
            o.testpmd.display()
        );
        return 2;
    }
    let duration = o
        .duration
        .unwrap_or(if o.set == Set::Full { 10.0 } else { 5.0 });
    let load_before = loadavg();
    let started = Instant::now();
    let mut rows = Vec::new();
    for (i, sc) in scenarios.iter().enumerate() {
        println!(
            "== [{}/{}] {} ({:.0} s elapsed)",
            i + 1,
            scenarios.len(),
            sc.name,
            started.elapsed().as_secs_f64()
        );
        let mut row = run_scenario(&o, sc, duration, i);
        row.attempt = 1;
        for attempt in 2..=o.attempts {
            if !row.ok || row.stolen() <= o.max_stolen {
                break;
            }
            println!(
                "   noisy: the polling threads lost {:.1} % of the window to other processes; again ({attempt}/{})",
                row.stolen(),
                o.attempts
            );
            let mut again = run_scenario(&o, sc, duration, i);
            again.attempt = attempt;
            if !again.ok || again.stolen() < row.stolen() {
                row = again;
            }
        }
        row.attempts = o.attempts;
        match &row.error {
            None => println!(
                "   ok: {} cycles/packet, {:.3} Mpps (DUT), {:.3} Mpps (gen), {} lost",
                fmt_opt(row.cycles_per_packet, 1),
                row.dut_mpps.unwrap_or(row.gen_mpps),
                row.gen_mpps,
                row.lost
            ),
            Some(e) => println!("   FAILED: {e}"),
        }
        rows.push(row);
    }
    compare_with_reference(&mut rows);
    let md = markdown(&o, &rows, duration, &load_before, started.elapsed());
    println!("\n{md}");
    if let Some(path) = &o.out {
        if let Err(e) = std::fs::write(path, &md) {
            eprintln!("sluice-gen bench: writing {}: {e}", path.display());
        } else {
            println!("results written to {}", path.display());
        }
    }
    if let Some(path) = &o.json {
        let text = serde_json::to_string_pretty(&rows).expect("rows serialise");
        if let Err(e) = std::fs::write(path, text) {
            eprintln!("sluice-gen bench: writing {}: {e}", path.display());
        }
    }
    if rows.iter().all(|r| r.ok) {
        0
    } else {
        1
    }
}

/// The median of `values` (the mean of the two middle ones for an even count).
fn median(values: &[f64]) -> Option<f64> {
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let n = v.len();
    match n {
        0 => None,
        _ if n % 2 == 1 => Some(v[n / 2]),
        _ => Some((v[n / 2 - 1] + v[n / 2]) / 2.0),
    }
}

/// Median and range of a set of figures.
#[derive(Clone, Copy, Debug, PartialEq)]
struct Spread {
    count: usize,
    median: f64,
    min: f64,
    max: f64,
}

impl Spread {
    fn of(values: &[f64]) -> Option<Spread> {
        Some(Spread {
            count: values.len(),
            median: median(values)?,
            min: values.iter().copied().fold(f64::INFINITY, f64::min),
            max: values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
        })
    }
}

/// A testpmd 5tswap row that can serve as the reference.
fn is_reference(r: &Row) -> bool {
    r.name == REFERENCE && r.ok && r.cycles_per_packet.is_some()
}

/// Fills in each Sluice row's comparison with testpmd 5tswap (`rows` in run order):
/// the ratio to the median of all the run's testpmd 5tswap rows with its range over
/// them, the ratio to the testpmd runs right before and after it (its brackets), and
/// the latency added per pass over the median testpmd round trip. No testpmd row is
/// picked by any other figure of its own (c2c, lowest or highest): on this VM every
/// figure moves by up to 2x from minute to minute, and any choice would flatter or
/// punish Sluice at random.
fn compare_with_reference(rows: &mut [Row]) {
    let refs: Vec<&Row> = rows.iter().filter(|r| is_reference(r)).collect();
    let cycles: Vec<f64> = refs.iter().filter_map(|r| r.cycles_per_packet).collect();
    let spread = Spread::of(&cycles);
    let probe = |f: fn(&Row) -> Option<u64>| {
        let v: Vec<f64> = refs.iter().filter_map(|r| f(r)).map(|n| n as f64).collect();
        median(&v).map(|m| m.round() as i64)
    };
    let probe_p50 = probe(|r| r.probe_p50_ns);
    let probe_p99 = probe(|r| r.probe_p99_ns);
    let bracket = |r: Option<&Row>| r.filter(|r| is_reference(r))?.cycles_per_packet;
    for i in 0..rows.len() {
        if rows[i].dut != "sluice" {
            continue;
        }
        let before = bracket(i.checked_sub(1).and_then(|b| rows.get(b)));
        let after = bracket(rows.get(i + 1));
        let r = &mut rows[i];
        r.bracket_before_cycles = before;
        r.bracket_after_cycles = after;
        let brackets: Vec<f64> = before.into_iter().chain(after).collect();
        if let Some(s) = spread {
            r.testpmd_runs = s.count;
            r.testpmd_median_cycles = Some(s.median);
            r.testpmd_min_cycles = Some(s.min);
            r.testpmd_max_cycles = Some(s.max);
        }
        if let Some(c) = r.cycles_per_packet {
            if let Some(s) = spread {
                r.ratio_to_testpmd = Some(c / s.median);
                r.ratio_to_testpmd_min = Some(c / s.max);
                r.ratio_to_testpmd_max = Some(c / s.min);
            }
            r.ratio_to_brackets = median(&brackets).map(|b| c / b);
        }
        let passes = r.dut_passes.max(1);
        let added =
            |mine: Option<u64>, theirs: Option<i64>| Some((mine? / passes) as i64 - theirs?);
        r.added_p50_ns = added(r.probe_p50_ns, probe_p50);
        r.added_p99_ns = added(r.probe_p99_ns, probe_p99);
    }
}

fn fmt_opt(v: Option<f64>, prec: usize) -> String {
    v.map(|v| format!("{v:.prec$}"))
        .unwrap_or_else(|| "-".into())
}

// ---------------------------------------------------------------------------------
// Child processes

/// A child process that is killed (after SIGTERM and a bounded wait, for the DUT) and
/// reaped when dropped, whatever happened.
struct Proc {
    name: String,
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Option<Receiver<String>>,
    log: PathBuf,
    graceful: bool,
    exited: Option<std::process::ExitStatus>,
    /// A `@RESULT` line that arrived while waiting for something else.
    early_result: Option<String>,
    /// The thread copying stdout into the log (finishes at EOF).
    reader: Option<std::thread::JoinHandle<()>>,
}

impl Proc {
    /// Starts `cmd`; stdout lines are logged to `log` (and forwarded on a channel when
    /// `lines`), stderr goes to `log`.err.
    fn spawn(
        name: &str,
        cmd: &mut Command,
        log: PathBuf,
        lines: bool,
        graceful: bool,
        echo: bool,
    ) -> Result<Proc, String> {
        let err = std::fs::File::create(log.with_extension("err"))
            .map_err(|e| format!("creating {}: {e}", log.display()))?;
        // SAFETY: the closure runs in the forked child before exec and only calls
        // prctl(2), which is async-signal-safe. It ties the child's life to this
        // process: should the orchestrator be killed (a test's timeout), no generator
        // or DUT keeps polling a CPU.
        unsafe {
            cmd.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(err))
            .spawn()
            .map_err(|e| format!("cannot start {name} ({:?}): {e}", cmd.get_program()))?;
        let stdout = child.stdout.take().expect("piped");
        let (tx, rx) = mpsc::channel();
        let mut file =
            std::fs::File::create(&log).map_err(|e| format!("creating {}: {e}", log.display()))?;
        let tag = name.to_string();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let _ = writeln!(file, "{line}");
                if echo || line.contains("validation failure") {
                    println!("   [{tag}] {line}");
                }
                if lines && tx.send(line).is_err() {
                    // Nobody listens any more; keep draining into the log.
                }
            }
        });
        Ok(Proc {
            name: name.into(),
            stdin: child.stdin.take(),
            child,
            lines: Some(rx),
            log,
            graceful,
            exited: None,
            early_result: None,
            reader: Some(reader),
        })
    }

    fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    fn try_exit(&mut self) -> Option<std::process::ExitStatus> {
        if self.exited.is_none() {
            if let Ok(Some(s)) = self.child.try_wait() {
                self.exited = Some(s);
            }
        }
        self.exited
    }

    fn send(&mut self, line: &str) -> Result<(), String> {
        let stdin = self
            .stdin
            .as_mut()
            .ok_or_else(|| format!("{}: stdin closed", self.name))?;
        stdin
            .write_all(line.as_bytes())
            .and_then(|_| stdin.flush())
            .map_err(|e| format!("{}: writing to stdin: {e}", self.name))
    }

    fn close_stdin(&mut self) {
        self.stdin = None;
    }

    /// Waits (bounded) until everything the process wrote to stdout is in its log.
    fn flush_log(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        if let Some(r) = self.reader.take() {
            while !r.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(10));
            }
            if r.is_finished() {
                let _ = r.join();
            }
        }
    }

    /// Waits for a stdout line starting with `prefix` (returns the rest of it), while
    /// `watch` stays alive.
    fn wait_line(
        &mut self,
        prefix: &str,
        timeout: Duration,
        mut watch: Option<&mut Proc>,
    ) -> Result<String, String> {
        let deadline = Instant::now() + timeout;
        let rx = self.lines.as_ref().expect("line channel");
        loop {
            match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(line) => {
                    if let Some(rest) = line.strip_prefix(prefix) {
                        return Ok(rest.trim().to_string());
                    }
                    if let Some(rest) = line.strip_prefix("@RESULT ") {
                        // The generator gave up early: its result says why.
                        let why = serde_json::from_str::<serde_json::Value>(rest)
                            .ok()
                            .and_then(|v| v["error"].as_str().map(String::from))
                            .unwrap_or_else(|| "unknown".into());
                        self.early_result = Some(rest.to_string());
                        return Err(format!("{} ended before {prefix}: {why}", self.name));
                    }
                }
                Err(RecvTimeoutError::Disconnected) => {
                    let status = wait_bounded(&mut self.child, Duration::from_secs(5));
                    return Err(format!(
                        "{} exited ({status}) before printing {prefix}",
                        self.name
                    ));
                }
                Err(RecvTimeoutError::Timeout) => {}
            }
            if let Some(w) = watch.as_deref_mut() {
                if let Some(status) = w.try_exit() {
                    return Err(format!(
                        "{} exited ({status}) while waiting for {} {prefix}",
                        w.name, self.name
                    ));
                }
            }
            if Instant::now() >= deadline {
                return Err(format!(
                    "{} did not print {prefix} within {:.0} s",
                    self.name,
                    timeout.as_secs_f64()
                ));
            }
        }
    }

    /// SIGTERM (when graceful), a bounded wait, then SIGKILL; reaps the child.
    fn stop(&mut self, grace: Duration) -> String {
        if let Some(s) = self.try_exit() {
            return s.to_string();
        }
        self.close_stdin();
        if self.graceful {
            // SAFETY: kill(2) on our own unreaped child: the pid cannot have been reused.
            unsafe { libc::kill(self.pid(), libc::SIGTERM) };
            if let Some(s) = wait_deadline(&mut self.child, grace) {
                self.exited = Some(s);
                return s.to_string();
            }
        } else if let Some(s) = wait_deadline(&mut self.child, grace) {
            self.exited = Some(s);
            return s.to_string();
        }
        let _ = self.child.kill();
        let s = self.child.wait().map(|s| s.to_string());
        self.exited = self.child.try_wait().ok().flatten();
        format!("killed ({})", s.unwrap_or_else(|e| e.to_string()))
    }

    fn log_tail(&self, n: usize) -> String {
        let mut out = String::new();
        for path in [self.log.clone(), self.log.with_extension("err")] {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let from = lines.len().saturating_sub(n);
            if from < lines.len() {
                let _ = writeln!(out, "   --- {} (last {} lines) ---", path.display(), n);
                for l in &lines[from..] {
                    let _ = writeln!(out, "   | {l}");
                }
            }
        }
        out
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.try_exit().is_none() {
            self.stop(Duration::from_secs(5));
        }
    }
}

fn wait_deadline(child: &mut Child, timeout: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(s)) => return Some(s),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => return None,
        }
    }
}

fn wait_bounded(child: &mut Child, timeout: Duration) -> String {
    match wait_deadline(child, timeout) {
        Some(s) => s.to_string(),
        None => "still running".into(),
    }
}

/// A private directory for one scenario's files, removed when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new(index: usize) -> Result<TempDir, String> {
        let p = std::env::temp_dir().join(format!("sluice-bench-{}-{index}", std::process::id()));
        std::fs::create_dir_all(&p).map_err(|e| format!("creating {}: {e}", p.display()))?;
        Ok(TempDir(p))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Removes the DPDK runtime directory a killed process may leave behind.
fn remove_runtime_dir(prefix: &str) {
    for base in ["/var/run/dpdk", "/run/dpdk"] {
        let p = Path::new(base).join(prefix);
        if p.exists() {
            let _ = std::fs::remove_dir_all(p);
        }
    }
}

// ---------------------------------------------------------------------------------
// Scenarios

/// FullNAT local addresses needed so that no session is refused for want of a local
/// port. Sluice's pools (`src/forward/laddr.rs`) mark a port in use on its LIP
/// whatever the real server, so a worker holds at most 64 512 sessions per LIP, and
/// its sessions (N / workers) need N / workers / 64 512 LIPs in the best case; the RSS
/// split of each LIP's ports between workers (per real server) makes N / 64 512 the
/// safe figure for any worker count. A quarter is added for the uneven spread.
fn lips_needed(sc: &Scenario) -> u16 {
    let churn = if sc.workload == Workload::Established {
        0
    } else {
        CHURN_SESSIONS
    };
    let sessions = (sc.sessions as u64 + churn) * 5 / 4;
    (sessions.div_ceil(PORTS_PER_LIP).max(1) as u16).min(MAX_LIPS)
}

/// Services (VIPs) needed to hold `lips` local addresses, at most 64 each.
fn vips_needed(lips: u16) -> u32 {
    lips.div_ceil(LIPS_PER_SERVICE).max(1) as u32
}

/// Session-table capacity per worker: the established sessions with a quarter to
/// spare (RSS spreads them unevenly over workers), plus room for connection churn
/// or a SYN flood's half-open sessions.
fn capacity_per_worker(sc: &Scenario) -> u64 {
    let churn = match sc.workload {
        Workload::Established => 0,
        Workload::SynFlood => FLOOD_ROOM,
        Workload::Connections | Workload::Mixed => CHURN_SESSIONS,
    };
    let n = sc.sessions as u64 * 5 / 4 / sc.workers() as u64 + 4096 + churn;
    n.min(67_108_864)
}

#[allow(clippy::too_many_arguments)]
fn sluice_toml(
    sc: &Scenario,
    mode: Mode,
    prefix: &str,
    ctl: &Path,
    memif: &str,
    lips: u16,
    vips: u32,
    sync: bool,
) -> String {
    let workers = sc.workers();
    let mut t = String::new();
    if sync {
        // The peer only receives (nothing listens: the datagrams are counted sent and
        // dropped by the kernel), on this host's loopback; no key, so that
        // perf/resync_probe.py can ask for a dump without one.
        let port = 20_000 + (std::process::id() % 20_000) as u16;
        let _ = writeln!(
            t,
            "[sync]\nlisten = \"127.0.0.1:{port}\"\npeers = [\"127.0.0.1:{}\"]\nunauthenticated = true\n",
            port + 1
        );
    }
    let cap = capacity_per_worker(sc);
    // The EAL heap holds the mbufs and memif's rings; the session tables are ordinary
    // (transparent huge page) memory outside it.
    let _ = writeln!(
        t,
        "[eal]\nhugepages = false\nmemory_mb = 512\nfile_prefix = {prefix:?}\n"
    );
    if workers == 1 {
        let _ = writeln!(t, "[lcores]\nmanagement = 0\nworkers = [1]\n");
    } else {
        // Oversubscribed on a 2-CPU machine: every worker on CPU 1.
        let ws: Vec<String> = (1..=workers).map(|w| w.to_string()).collect();
        let cpus: Vec<&str> = (0..workers).map(|_| "1").collect();
        let _ = writeln!(
            t,
            "[lcores]\nmanagement = 0\nworkers = [{}]\ncpus = [{}]\n",
            ws.join(", "),
            cpus.join(", ")
        );
    }
    let _ = writeln!(t, "[control]\nsocket = {:?}\n", ctl.to_string_lossy());
    let _ = writeln!(
        t,
        "[[ports]]\nname = \"lan0\"\nvdev = \"net_memif0,role=client,socket={memif},socket-abstract=no\"\n\
         mac = \"02:53:4c:00:00:01\"\naddresses = [\"198.18.0.1/15\"]\n"
    );
    // Closed connections leave the table a second after their FIN exchange, so
    // connection-heavy runs hold about one second of churn; established sessions keep
    // the 900 s default.
    let _ = writeln!(
        t,
        "[timeouts]\ntcpfin = 1\ntime_wait = 1\nclose = 1\nclose_wait = 1\nlast_ack = 1\n"
    );
    let _ = writeln!(t, "[sessions]\ncapacity = {cap}\ntick_ms = 100\n");
    // One service per VIP, each with its own share of the local addresses and the
    // same real servers.
    let per = lips.div_ceil(vips as u16);
    for v in 0..vips {
        let _ = writeln!(
            t,
            "[[services]]\nproto = \"tcp\"\nvip = \"{}\"\nport = 80\nscheduler = \"rr\"",
            engine::ipv4(engine::VIP + v)
        );
        if mode == Mode::FullNat {
            let first = v as u16 * per;
            let l: Vec<String> = (first..(first + per).min(lips))
                .map(|i| format!("{:?}", engine::ipv4(engine::lip(i)).to_string()))
                .collect();
            let _ = writeln!(t, "local_addresses = [{}]", l.join(", "));
        }
        for k in 0..REAL_SERVERS {
            let _ = writeln!(
                t,
                "\n  [[services.real_servers]]\n  ip = \"{}\"\n  port = {}\n  mode = \"{}\"",
                engine::ipv4(engine::rs_ip(k)),
                mode.rs_port(),
                mode.name()
            );
        }
        t.push('\n');
    }
    if sc.workload == Workload::SynFlood {
        // The flooded service: the same real servers, with or without the proxy. Its
        // half-open sessions (proxy off) keep the default SYN_RECV timeout.
        let _ = writeln!(
            t,
            "[[services]]\nproto = \"tcp\"\nvip = \"{}\"\nport = 80\nscheduler = \"rr\"\nsynproxy = \"{}\"",
            engine::ipv4(engine::FLOOD_VIP),
            if sc.synproxy { "on" } else { "off" }
        );
        for k in 0..REAL_SERVERS {
            let _ = writeln!(
                t,
                "\n  [[services.real_servers]]\n  ip = \"{}\"\n  port = {}\n  mode = \"nat\"",
                engine::ipv4(engine::rs_ip(k)),
                mode.rs_port(),
            );
        }
        t.push('\n');
    }
    t
}

struct Paths {
    dir: TempDir,
    tag: String,
}

impl Paths {
    fn file(&self, name: &str) -> PathBuf {
        self.dir.0.join(name)
    }
    fn prefix(&self, what: &str) -> String {
        format!("{what}-{}", self.tag)
    }
}

#[allow(clippy::too_many_arguments)]
fn gen_command(
    o: &Opts,
    sc: &Scenario,
    p: &Paths,
    memif: &str,
    mode: Mode,
    lips: u16,
    vips: u32,
    duration: f64,
) -> Command {
    let exe = std::env::current_exe().expect("own path");
    let mut c = Command::new(exe);
    c.arg("run")
        .args(["--socket", memif])
        .args(["--file-prefix", &p.prefix("sg")])
        .args(["--lcore", "0"])
        .args(["--queues", &sc.workers().to_string()])
        .args(["--mode", mode.name()])
        .args(["--workload", sc.workload.name()])
        .args(["--sessions", &sc.sessions.to_string()])
        .args(["--window", &o.window.to_string()])
        .args(["--order", o.order.name()])
        .args(["--frame-size", &o.frame_size.to_string()])
        .args(["--validate", if o.validate { "full" } else { "sample" }])
        .args(["--real-servers", &REAL_SERVERS.to_string()])
        .args(["--lips", &lips.to_string()])
        .args(["--vips", &vips.to_string()])
        .args(["--duration", &duration.to_string()]);
    if sc.workers() > 1 {
        // Oversubscribed workers stall each other for milliseconds.
        c.args(["--loss-timeout-ms", "1000"]);
    }
    if sc.workload == Workload::SynFlood {
        c.args(["--synproxy", if sc.synproxy { "on" } else { "off" }]);
    }
    c
}

/// Runs one scenario to completion (or failure); never panics, never leaves a
/// process behind.
fn run_scenario(o: &Opts, sc: &Scenario, duration: f64, index: usize) -> Row {
    let mut row = Row {
        name: sc.name.clone(),
        sessions: sc.sessions,
        workload: sc.workload.name().into(),
        workers: sc.workers(),
        oversubscribed: sc.workers() > 1,
        synproxy: sc.synproxy,
        ..Default::default()
    };
    row.core_to_core_ns = core_to_core_median_ns();
    let result = (|| -> Result<(), String> {
        let dir = TempDir::new(index)?;
        let tag = format!("{}{index}", std::process::id());
        let p = Paths { dir, tag };
        // A socket file in the scenario's own directory (memif with socket-abstract=no).
        let memif = p.file("memif.sock").to_string_lossy().into_owned();
        let result = match sc.dut {
            Dut::Sluice { mode, .. } => run_sluice(o, sc, mode, duration, &p, &memif, &mut row),
            Dut::Testpmd { fwd } => run_testpmd(o, sc, fwd, duration, &p, &memif, &mut row),
        };
        remove_runtime_dir(&p.prefix("sg"));
        remove_runtime_dir(&p.prefix("sd"));
        remove_runtime_dir(&p.prefix("tp"));
        result
    })();
    if let Err(e) = result {
        row.ok = false;
        row.error = Some(e);
    } else if !row.validation_failures.is_empty() {
        row.ok = false;
        row.error = Some(format!(
            "validation failures: {:?}",
            row.validation_failures
        ));
    } else {
        row.ok = true;
    }
    row
}

/// Reads the generator's final JSON into the row.
fn absorb_gen(row: &mut Row, v: &serde_json::Value) {
    let u = |k: &str| v[k].as_u64().unwrap_or(0);
    let f = |k: &str| v[k].as_f64().unwrap_or(0.0);
    row.gen_mpps = f("mpps_rx");
    row.gen_busy_percent = f("gen_busy_percent");
    row.tsc_hz = u("tsc_hz");
    row.gen_connections_per_s = f("connections_per_s");
    row.gen_requests_per_s = f("requests_per_s");
    row.latency_p50_ns = v["latency_p50_ns"].as_u64();
    row.latency_p99_ns = v["latency_p99_ns"].as_u64();
    row.probe_p50_ns = v["probe_p50_ns"].as_u64();
    row.probe_p99_ns = v["probe_p99_ns"].as_u64();
    row.dut_passes = u("dut_passes_per_round_trip").max(1);
    row.established = u("established");
    row.connections = u("connections");
    row.requests = u("requests");
    row.lost = u("lost");
    row.gen_packets = u("rx_packets");
    row.establish_s = f("establish_s");
    row.measure_s = f("measure_s");
    row.flood_syns = u("flood_syns");
    row.flood_syn_acks = u("flood_syn_acks");
    row.flood_syn_acks_per_s = f("flood_syn_acks_per_s");
    row.flood_syns_at_rs = u("flood_syns_at_rs");
    row.flood_syn_acks_per_100ms = v["flood_syn_acks_per_100ms"]
        .as_array()
        .map(|a| a.iter().filter_map(|x| x.as_u64()).collect())
        .unwrap_or_default();
    row.flood_collapse_s = collapse_s(&row.flood_syn_acks_per_100ms);
    row.flood_syn_acks_per_s_before_collapse = match row.flood_collapse_s {
        Some(at) if at > 0.0 => {
            let slots = (at * 10.0).round() as usize;
            Some(row.flood_syn_acks_per_100ms[..slots].iter().sum::<u64>() as f64 / at)
        }
        Some(_) => None,
        None => Some(row.flood_syn_acks_per_s),
    };
    if let Some(m) = v["validation_failures"].as_object() {
        for (k, n) in m {
            row.validation_failures
                .insert(k.clone(), n.as_u64().unwrap_or(0));
        }
    }
}

/// Seconds into the window from which every 100 ms slot to its end (two at least)
/// answered fewer than a tenth of the best slot's SYN-ACKs: where a flood stops being
/// answered for good. A slot or two lost to a preempted CPU do not count.
fn collapse_s(per_100ms: &[u64]) -> Option<f64> {
    let best = *per_100ms.iter().max()?;
    let low = per_100ms
        .iter()
        .rev()
        .take_while(|&&n| n * 10 < best)
        .count();
    (low >= 2).then(|| (per_100ms.len() - low) as f64 * 0.1)
}

fn parse_result(line: &str) -> Result<serde_json::Value, String> {
    serde_json::from_str(line).map_err(|e| format!("generator result is not JSON ({e}): {line}"))
}

fn run_sluice(
    o: &Opts,
    sc: &Scenario,
    mode: Mode,
    duration: f64,
    p: &Paths,
    memif: &str,
    row: &mut Row,
) -> Result<(), String> {
    row.dut = "sluice".into();
    row.mode = mode.name().into();
    let lips = if mode == Mode::FullNat {
        lips_needed(sc)
    } else {
        1
    };
    row.local_addresses = if mode == Mode::FullNat { lips } else { 0 };
    let vips = if mode == Mode::FullNat {
        vips_needed(lips)
    } else {
        1
    };
    row.vips = vips;
    let gen_mode = o.gen_mode.unwrap_or(mode);
    let mut gen = Proc::spawn(
        "gen",
        &mut gen_command(o, sc, p, memif, gen_mode, lips, vips, duration),
        p.file("gen.log"),
        true,
        false,
        o.verbose,
    )?;
    let outcome = (|| -> Result<(), String> {
        gen.wait_line("@LISTENING", Duration::from_secs(30), None)?;
        let ctl = p.file("ctl.sock");
        let config = p.file("sluice.toml");
        std::fs::write(
            &config,
            sluice_toml(sc, mode, &p.prefix("sd"), &ctl, memif, lips, vips, o.sync),
        )
        .map_err(|e| format!("writing {}: {e}", config.display()))?;
        let mut dut = Proc::spawn(
            "sluice",
            Command::new(&o.sluice).arg("--config").arg(&config),
            p.file("sluice.log"),
            false,
            true,
            false,
        )?;
        let r = (|| -> Result<(), String> {
            wait_sluice(&mut dut, &ctl, Duration::from_secs(30))?;
            let establish_timeout = Duration::from_secs(60 + sc.sessions as u64 / 20_000);
            gen.wait_line("@READY", establish_timeout, Some(&mut dut))?;
            ctl_call(&ctl, &Request::ZeroCounters)?;
            let sync_before = if o.sync {
                Some(ctl_call(&ctl, &Request::Sync)?)
            } else {
                None
            };
            gen.send("measure\n")?;
            let stolen = stolen_start(&dut, &gen);
            if o.hot_changes > 0 {
                hot_changes(o, mode, &ctl, duration, row)?;
            }
            gen.wait_line(
                "@MEASURED",
                Duration::from_secs_f64(duration + 30.0),
                Some(&mut dut),
            )?;
            stolen_end(&stolen, &dut, &gen, row);
            if let Some(before) = &sync_before {
                let after = ctl_call(&ctl, &Request::Sync)?;
                let delta = |path: &[&str]| {
                    let get = |v: &serde_json::Value| {
                        path.iter().fold(v, |v, k| &v[*k]).as_u64().unwrap_or(0)
                    };
                    Some(get(&after).saturating_sub(get(before)))
                };
                row.sync_events = delta(&["stats", "events_sent"]);
                row.sync_messages = delta(&["stats", "messages_sent"]);
                row.sync_bytes = delta(&["stats", "bytes_sent"]);
                row.sync_events_dropped = delta(&["events_dropped"]);
            }
            let status: StatusReport = serde_json::from_value(ctl_call(&ctl, &Request::Status)?)
                .map_err(|e| format!("status JSON: {e}"))?;
            if o.hot_changes > 0 {
                let a = &status.snapshot_adoption;
                row.adoption_publishes = Some(a.publishes);
                row.adoption_late = Some(a.late);
                row.adoption_within_1ms = Some(a.within_1ms);
                row.adoption_p50_ns = a.p50_ns;
                row.adoption_p99_ns = a.p99_ns;
                row.adoption_max_ns = (a.publishes > a.late).then_some(a.max_ns);
                if a.publishes < o.hot_changes as u64 {
                    return Err(format!(
                        "{} changes issued but Sluice measured {} publishes",
                        o.hot_changes, a.publishes
                    ));
                }
            }
            let result = gen.wait_line("@RESULT", Duration::from_secs(30), Some(&mut dut))?;
            let v = parse_result(&result)?;
            absorb_gen(row, &v);
            absorb_status(row, &status, sc);
            if let Some(e) = v["error"].as_str() {
                return Err(format!("generator: {e}"));
            }
            Ok(())
        })();
        // The DUT first (the generator has stopped polling and waits for its stdin to
        // close), then the generator: memif peers must not disconnect under a poller.
        let how = dut.stop(Duration::from_secs(15));
        gen.close_stdin();
        let gen_status = wait_bounded(&mut gen.child, Duration::from_secs(15));
        let r = r.and_then(|()| match gen.try_exit() {
            Some(s) if s.success() => Ok(()),
            Some(s) if s.code() == Some(crate::run::EXIT_VALIDATION) => {
                Err("validation failures (the generator exited with status 3)".into())
            }
            _ => Err(format!("generator did not exit cleanly: {gen_status}")),
        });
        match r {
            Err(e) => Err(format!(
                "{e}\n   sluice: {how}\n{}{}",
                dut.log_tail(15),
                gen.log_tail(15)
            )),
            Ok(()) if !how.contains("exit status: 0") => Err(format!(
                "sluice did not exit cleanly: {how}\n{}",
                dut.log_tail(15)
            )),
            Ok(()) => Ok(()),
        }
    })();
    gen.stop(Duration::from_secs(5));
    if let Some(v) = gen
        .early_result
        .as_deref()
        .and_then(|r| parse_result(r).ok())
    {
        absorb_gen(row, &v);
    }
    outcome
}

fn absorb_status(row: &mut Row, s: &StatusReport, sc: &Scenario) {
    let workers: Vec<_> = s.lcores.iter().filter(|l| l.role == "worker").collect();
    let busy: u64 = workers.iter().map(|l| l.busy_cycles).sum();
    let rx: u64 = workers.iter().map(|l| l.rx_packets).sum();
    let created: u64 = workers.iter().map(|l| l.sessions_created).sum();
    let table: u64 = workers.iter().map(|l| l.session_table_bytes).sum();
    let secs = row.measure_s.max(1e-9);
    let cap = capacity_per_worker(sc);
    row.cycles_per_packet = (rx > 0).then(|| busy as f64 / rx as f64);
    // Sluice's own busy_percent divides by total_cycles, which the worker bumps on
    // every poll with a plain load+store, so `zero_counters` from the management
    // thread is usually lost for it; busy_cycles only moves while packets flow, and
    // the window starts idle, so its zeroing holds.
    row.dut_busy_percent = (row.tsc_hz > 0)
        .then(|| 100.0 * busy as f64 / workers.len().max(1) as f64 / (secs * row.tsc_hz as f64));
    row.dut_rx_packets = Some(rx);
    row.dut_mpps = Some(rx as f64 / secs / 1e6);
    row.new_sessions_per_s_per_worker = Some(created as f64 / secs / workers.len().max(1) as f64);
    row.table_bytes = Some(table);
    row.capacity_per_worker = Some(cap);
    row.bytes_per_session = Some(table as f64 / (cap * workers.len().max(1) as u64) as f64);
    row.live_sessions = Some(s.sessions);
    row.sessions_created = Some(created);
    row.cookies_sent = s.events.get("synproxy_cookies_sent").copied();
    row.half_open_reclaimed = s.events.get("half_open_reclaimed").copied();
    row.dut_drops = Some(s.drops.values().sum());
    row.dut_drop_reasons = s
        .drops
        .iter()
        .filter(|(_, &n)| n > 0)
        .map(|(k, &n)| (k.clone(), n))
        .collect();
}

/// `--hot-changes N`: N weight changes (real server 1 flips between weights 1 and 2)
/// spread over the first 90 % of the window, each through the `sluicectl` binary as
/// an operator would run it; records how long each command took. Sluice itself
/// measures publish -> every worker adopted (read from `status` after the window).
fn hot_changes(
    o: &Opts,
    mode: Mode,
    ctl: &Path,
    duration: f64,
    row: &mut Row,
) -> Result<(), String> {
    let n = o.hot_changes;
    let every = Duration::from_secs_f64(duration * 0.9 / n as f64);
    let vip = format!("{}:80", engine::ipv4(engine::VIP));
    let rs = format!("{}:{}", engine::ipv4(engine::rs_ip(0)), mode.rs_port());
    let flag = match mode {
        Mode::Dr => "-g",
        Mode::Nat => "-m",
        _ => "-b",
    };
    // sluicectl runs on CPU 0 (the generator's and Sluice's management CPU), as an
    // operator's shell would on a real appliance, never on the DUT worker's CPU.
    // SAFETY: cpu_set_t is plain data; CPU_ZERO/CPU_SET only write into it.
    let cpu0 = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_ZERO(&mut set);
        libc::CPU_SET(0, &mut set);
        set
    };
    let start = Instant::now();
    let mut took = Vec::with_capacity(n as usize);
    for i in 0..n {
        let at = start + every * i;
        if let Some(wait) = at.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let weight = if i % 2 == 0 { "2" } else { "1" };
        let t = Instant::now();
        let mut cmd = Command::new(&o.sluicectl);
        // SAFETY: runs in the forked child before exec and only calls
        // sched_setaffinity(2), a plain system call, on a set built before the fork.
        unsafe {
            cmd.pre_exec(move || {
                if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &cpu0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let out = cmd
            .arg("-S")
            .arg(ctl)
            .args(["-e", "-t", &vip, "-r", &rs, flag, "-w", weight])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("running {}: {e}", o.sluicectl.display()))?;
        took.push(t.elapsed().as_nanos() as u64);
        if !out.status.success() {
            return Err(format!(
                "sluicectl -e (change {}) failed: {}",
                i + 1,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
    }
    took.sort_unstable();
    row.hot_changes = n;
    row.sluicectl_p50_ns = took.get(took.len() / 2).copied();
    row.sluicectl_max_ns = took.last().copied();
    Ok(())
}

fn ctl_call(ctl: &Path, req: &Request) -> Result<serde_json::Value, String> {
    client::request(ctl, req, Duration::from_secs(10))
        .map_err(|e| format!("sluice control socket: {e}"))
}

fn wait_sluice(dut: &mut Proc, ctl: &Path, timeout: Duration) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(s) = dut.try_exit() {
            return Err(format!("sluice exited ({s}) during start-up"));
        }
        if ctl.exists() && client::request(ctl, &Request::Status, Duration::from_secs(1)).is_ok() {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "sluice did not answer on {} within {:.0} s",
                ctl.display(),
                timeout.as_secs_f64()
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn run_testpmd(
    o: &Opts,
    sc: &Scenario,
    fwd: &str,
    duration: f64,
    p: &Paths,
    memif: &str,
    row: &mut Row,
) -> Result<(), String> {
    row.dut = "testpmd".into();
    row.mode = fwd.into();
    let mode = if fwd == "5tswap" {
        Mode::Swap5t
    } else {
        Mode::MacSwap
    };
    let mut gen = Proc::spawn(
        "gen",
        &mut gen_command(o, sc, p, memif, mode, 1, 1, duration),
        p.file("gen.log"),
        true,
        false,
        o.verbose,
    )?;
    let outcome = (|| -> Result<(), String> {
        gen.wait_line("@LISTENING", Duration::from_secs(30), None)?;
        let mut tp = Proc::spawn(
            "testpmd",
            Command::new(&o.testpmd)
                .args(["-l", "0,1", "--main-lcore", "0", "-m", "1024", "--no-huge"])
                .args(["--no-pci", "--file-prefix", &p.prefix("tp")])
                .arg("--vdev")
                .arg(format!(
                    "net_memif0,role=client,socket={memif},socket-abstract=no"
                ))
                .arg("--")
                .args([
                    "--total-num-mbufs=16384",
                    "--nb-cores=1",
                    "--rxq=1",
                    "--txq=1",
                ])
                .arg(format!("--forward-mode={fwd}"))
                .args(["--record-core-cycles", "--auto-start"]),
            p.file("testpmd.log"),
            false,
            false,
            false,
        )?;
        let r = (|| -> Result<(), String> {
            gen.wait_line("@READY", Duration::from_secs(60), Some(&mut tp))?;
            gen.send("measure\n")?;
            let stolen = stolen_start(&tp, &gen);
            gen.wait_line(
                "@MEASURED",
                Duration::from_secs_f64(duration + 30.0),
                Some(&mut tp),
            )?;
            stolen_end(&stolen, &tp, &gen, row);
            let result = gen.wait_line("@RESULT", Duration::from_secs(30), Some(&mut tp))?;
            let v = parse_result(&result)?;
            absorb_gen(row, &v);
            // The generator no longer polls. testpmd forwards until its stdin reaches
            // EOF, then prints its statistics and disconnects.
            tp.close_stdin();
            let status = wait_bounded(&mut tp.child, Duration::from_secs(20));
            gen.close_stdin();
            tp.flush_log(Duration::from_secs(5));
            let text = std::fs::read_to_string(&tp.log).unwrap_or_default();
            let cpp = text
                .split("CPU cycles/packet=")
                .nth(1)
                .and_then(|rest| rest.split_whitespace().next())
                .and_then(|n| n.parse::<f64>().ok())
                .ok_or_else(|| {
                    format!("testpmd ({status}) printed no \"CPU cycles/packet=\" line")
                })?;
            row.cycles_per_packet = Some(cpp);
            if row.tsc_hz > 0 {
                row.dut_busy_percent = Some(100.0 * cpp * row.gen_mpps * 1e6 / row.tsc_hz as f64);
            }
            let gen_status = wait_bounded(&mut gen.child, Duration::from_secs(15));
            match gen.try_exit() {
                Some(s) if s.success() => {}
                Some(s) if s.code() == Some(crate::run::EXIT_VALIDATION) => {
                    return Err("validation failures (the generator exited with status 3)".into())
                }
                _ => return Err(format!("generator did not exit cleanly: {gen_status}")),
            }
            if let Some(e) = v["error"].as_str() {
                return Err(format!("generator: {e}"));
            }
            Ok(())
        })();
        let how = tp.stop(Duration::from_secs(10));
        r.map_err(|e| {
            format!(
                "{e}\n   testpmd: {how}\n{}{}",
                tp.log_tail(15),
                gen.log_tail(15)
            )
        })
    })();
    gen.stop(Duration::from_secs(5));
    if let Some(v) = gen
        .early_result
        .as_deref()
        .and_then(|r| parse_result(r).ok())
    {
        absorb_gen(row, &v);
    }
    outcome
}

// ---------------------------------------------------------------------------------
// The report

/// Per thread of `pid`: (time on a CPU, time runnable but waiting for one), in ns,
/// from `/proc/PID/task/TID/schedstat`.
fn thread_times(pid: i32) -> BTreeMap<String, (u64, u64)> {
    let mut out = BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in tasks.flatten() {
        let text = std::fs::read_to_string(t.path().join("schedstat")).unwrap_or_default();
        let mut f = text
            .split_whitespace()
            .map(|v| v.parse::<u64>().unwrap_or(0));
        if let (Some(run), Some(wait)) = (f.next(), f.next()) {
            out.insert(t.file_name().to_string_lossy().into_owned(), (run, wait));
        }
    }
    out
}

/// Run-queue wait of each process's busiest thread (its polling lcore) over a window.
struct Stolen {
    at: Instant,
    dut: BTreeMap<String, (u64, u64)>,
    gen: BTreeMap<String, (u64, u64)>,
}

fn stolen_start(dut: &Proc, gen: &Proc) -> Stolen {
    Stolen {
        at: Instant::now(),
        dut: thread_times(dut.pid()),
        gen: thread_times(gen.pid()),
    }
}

/// The share of the window the busiest thread (most CPU time in the window) of `pid`
/// spent waiting for its CPU. Only that thread: the others mostly sleep, and Sluice's
/// management thread shares CPU 0 with the generator by design.
fn stolen_share(before: &BTreeMap<String, (u64, u64)>, pid: i32, window: f64) -> Option<f64> {
    let now = thread_times(pid);
    now.iter()
        .filter_map(|(tid, &(run, wait))| {
            let &(run0, wait0) = before.get(tid)?;
            Some((run.saturating_sub(run0), wait.saturating_sub(wait0)))
        })
        .max_by_key(|&(run, _)| run)
        .map(|(_, wait)| 100.0 * wait as f64 / window)
}

fn stolen_end(s: &Stolen, dut: &Proc, gen: &Proc, row: &mut Row) {
    let window = s.at.elapsed().as_nanos().max(1) as f64;
    row.dut_stolen_percent = stolen_share(&s.dut, dut.pid(), window);
    row.gen_stolen_percent = stolen_share(&s.gen, gen.pid(), window);
}

/// Round trip of a cache line between CPU 0 and CPU 1, in ns: two threads pinned to
/// the two CPUs bounce a counter through one atomic. memif moves every packet's ring
/// slots and buffers between the generator's CPU and the DUT's, so this is the
/// machine's (or the hypervisor's vCPU placement's) price per transfer; on this VM it
/// changes from run to run, and the figures with it.
pub fn core_to_core_ns() -> Option<f64> {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;
    const ROUNDS: u64 = 20_000;
    let ids = core_affinity::get_core_ids()?;
    let (c0, c1) = (*ids.first()?, *ids.get(1)?);
    let line = Arc::new(AtomicU64::new(0));
    let peer = line.clone();
    let deadline = Instant::now() + Duration::from_secs(2);
    let echo = std::thread::spawn(move || {
        if !core_affinity::set_for_current(c1) {
            return;
        }
        let mut expect = 1;
        while expect < 2 * ROUNDS {
            if peer.load(Ordering::Acquire) == expect {
                peer.store(expect + 1, Ordering::Release);
                expect += 2;
            } else if Instant::now() > deadline {
                return;
            } else {
                std::hint::spin_loop();
            }
        }
    });
    let result = std::thread::scope(|_| {
        // Measured on a helper thread pinned to CPU 0, so the caller keeps its affinity.
        let line = line.clone();
        std::thread::spawn(move || {
            if !core_affinity::set_for_current(c0) {
                return None;
            }
            let start = Instant::now();
            let mut next = 1;
            while next < 2 * ROUNDS {
                line.store(next, Ordering::Release);
                while line.load(Ordering::Acquire) != next + 1 {
                    if Instant::now() > deadline {
                        return None;
                    }
                    std::hint::spin_loop();
                }
                next += 2;
            }
            Some(start.elapsed().as_nanos() as f64 / ROUNDS as f64)
        })
        .join()
        .ok()
        .flatten()
    });
    let _ = echo.join();
    result
}

/// The median of five [`core_to_core_ns`] measurements.
fn core_to_core_median_ns() -> Option<f64> {
    let mut v: Vec<f64> = (0..5).filter_map(|_| core_to_core_ns()).collect();
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied()
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

fn command_output(cmd: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(cmd).args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

fn us(ns: Option<u64>) -> String {
    ns.map(|n| format!("{:.1}", n as f64 / 1000.0))
        .unwrap_or_else(|| "-".into())
}

fn signed_us(ns: Option<i64>) -> String {
    ns.map(|n| format!("{:+.1}", n as f64 / 1000.0))
        .unwrap_or_else(|| "-".into())
}

/// The paragraph above the table: what every Sluice row is compared with.
fn reference_summary(rows: &[Row], bracketed: bool) -> String {
    let cycles: Vec<f64> = rows
        .iter()
        .filter(|r| is_reference(r))
        .filter_map(|r| r.cycles_per_packet)
        .collect();
    let Some(s) = Spread::of(&cycles) else {
        return format!("Reference: no {REFERENCE} row succeeded in this run, so no ratios.");
    };
    let list: Vec<String> = cycles.iter().map(|c| format!("{c:.1}")).collect();
    format!(
        "Reference: {REFERENCE} ran {} times{} (in run order: {} cycles/packet): median {:.1}, range {:.1}-{:.1} (the slowest {:.2}x \
         the fastest). *x testpmd 5tswap* divides each Sluice row by that median; its range \
         divides by the slowest and by the fastest.",
        s.count,
        if bracketed {
            ", before and after every Sluice scenario"
        } else {
            " (--no-brackets: where the scenario list put it)"
        },
        list.join(", "),
        s.median,
        s.min,
        s.max,
        s.max / s.min
    )
}

/// The `synflood` rows: what the worker answered, and what the flood did to the table.
fn flood_section(t: &mut String, rows: &[Row]) {
    let flood: Vec<&Row> = rows.iter().filter(|r| r.workload == "synflood").collect();
    if flood.is_empty() {
        return;
    }
    let testpmd: Vec<f64> = rows
        .iter()
        .filter(|r| r.ok && is_reference(r))
        .map(|r| r.gen_mpps * 1e6)
        .collect();
    let _ = writeln!(
        t,
        "\n## SYN flood\n\n\
         `nat-SIZE-synflood[-noproxy]`: the generator's window of SYNs, each from a new \
         spoofed source (198.18.128.0/17, ports 1024-65535, none repeated), to a second NAT \
         service (198.18.1.200:80, the same four real servers) with `synproxy = \"on\"` (or \
         `\"off\"`, `-noproxy`); each SYN-ACK that comes back is counted and becomes the next \
         SYN, and no handshake is ever completed. Proxy on: Sluice answers every SYN itself \
         (one pass through the DUT), and no flood SYN may reach a real server. Proxy off: \
         each SYN opens a session and goes to a real server, whose SYN-ACK comes back \
         through Sluice (two passes); the half-open sessions keep the default SYN_RECV \
         timeout (60 s) and the table has room for 2^18 of them besides the established \
         sessions. *SYN-ACKs/s*: the SYN rate the worker absorbed over the window; \
         *before collapse*: over the 100 ms slots before the collapse. *testpmd pkts/s*: \
         the median over this run's testpmd 5tswap rows of the packets they reflected per \
         second ({}), each a 64-byte frame in and out as a proxied SYN is. *collapse*: \
         from where to the window's end (200 ms at least) every 100 ms answered fewer than \
         a tenth of the best 100 ms.\n\n\
         | scenario | SYNs sent/s | SYN-ACKs/s | SYN-ACKs/s before collapse | DUT cycles/pkt | x testpmd 5tswap median (range) | busy % DUT | cookies sent | flood SYNs at real servers | sessions created | live sessions at end / capacity | half-open reclaimed | collapse | DUT drops | lost | CPU stolen % DUT/gen | result |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|",
        median(&testpmd).map_or("-".into(), |m| format!("{m:.0}"))
    );
    for r in flood {
        let secs = r.measure_s.max(1e-9);
        let _ = writeln!(
            t,
            "| {} | {:.0} | {:.0} | {} | {} | {} | {} | {} | {} | {} | {} / {} | {} | {} | {} | {} | {}/{} | {} |",
            r.name,
            r.flood_syns as f64 / secs,
            r.flood_syn_acks_per_s,
            fmt_opt(r.flood_syn_acks_per_s_before_collapse, 0),
            fmt_opt(r.cycles_per_packet, 1),
            match (r.ratio_to_testpmd, r.ratio_to_testpmd_min, r.ratio_to_testpmd_max) {
                (Some(m), Some(lo), Some(hi)) => format!("{m:.2} ({lo:.2}-{hi:.2})"),
                _ => "-".into(),
            },
            fmt_opt(r.dut_busy_percent, 0),
            r.cookies_sent.map_or("-".into(), |n| n.to_string()),
            r.flood_syns_at_rs,
            r.sessions_created.map_or("-".into(), |n| n.to_string()),
            r.live_sessions.map_or("-".into(), |n| n.to_string()),
            r.capacity_per_worker.map_or("-".into(), |n| n.to_string()),
            r.half_open_reclaimed.map_or("-".into(), |n| n.to_string()),
            r.flood_collapse_s
                .map_or("none".into(), |s| format!("at {s:.1} s")),
            if r.dut_drop_reasons.is_empty() {
                "0".to_string()
            } else {
                format!("{:?}", r.dut_drop_reasons).replace('"', "")
            },
            r.lost,
            fmt_opt(r.dut_stolen_percent, 1),
            fmt_opt(r.gen_stolen_percent, 1),
            if r.ok { "ok" } else { "**FAIL**" },
        );
    }
}

fn markdown(o: &Opts, rows: &[Row], duration: f64, load_before: &str, took: Duration) -> String {
    let mut t = String::new();
    let date = command_output("date", &["-u", "+%Y-%m-%d %H:%M UTC"]).unwrap_or_default();
    let dpdk = command_output("pkg-config", &["--modversion", "libdpdk"])
        .unwrap_or_else(|| "unknown".into());
    let kernel = command_output("uname", &["-r"]).unwrap_or_default();
    let cpus = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(0);
    let _ = writeln!(t, "# Sluice performance harness: results\n");
    let _ = writeln!(t, "Command: `{}`  ", o.command_line);
    let _ = writeln!(
        t,
        "Date: {date}; CPU: {} ({cpus} CPUs); DPDK {dpdk}; kernel {kernel}  ",
        cpu_model()
    );
    let _ = writeln!(
        t,
        "Wiring: generator (`sluice-gen run`, memif server, polling on CPU 0) <-> net_memif \
         <-> DUT (memif client; its worker or forwarding lcore on CPU 1). Frame {} bytes, \
         {} packets in flight, established flows visited in {} order, {duration} s measured \
         per scenario, {} validation. \
         Load average before: {load_before}, after: {}; the whole run took {:.0} s.\n",
        o.frame_size,
        o.window,
        o.order.name(),
        if o.validate {
            "full (every packet's checksums)"
        } else {
            "sampled (every packet's addresses, flags, sequence numbers and payload; every 64th packet's checksums)"
        },
        loadavg(),
        took.as_secs_f64()
    );
    let _ = writeln!(
        t,
        "Caveat: a noisy 2-CPU VM. The generator shares no CPU with the DUT's worker, but it \
         shares CPU 0 with the DUT's management lcore (Sluice) or main lcore (testpmd), and \
         memif copies every packet on both sides, so the figures are for comparison within \
         this run (cycles and ratios), not absolute capacity. 2-worker rows (`-2w`) put both \
         workers on CPU 1: they are oversubscribed functional runs, kept for larger machines.\n"
    );
    let _ = writeln!(t, "{}\n", reference_summary(rows, o.brackets));
    let _ = writeln!(
        t,
        "| scenario | DUT cycles/pkt | x testpmd 5tswap median (range) | x brackets | DUT Mpps | gen Mpps | busy % DUT/gen | new sess/s per worker | conns/s (gen) | bytes/session | RTT p50/p99 us (loaded) | RTT p50/p99 us (1 in flight) | added per pass p50/p99 us | CPU stolen % DUT/gen | c2c ns | DUT drops | lost | result |"
    );
    let _ = writeln!(
        t,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
    );
    for r in rows {
        let result = if r.ok && r.stolen() > o.max_stolen {
            format!("ok, noisy (attempt {} of {})", r.attempt, r.attempts)
        } else if r.ok {
            "ok".to_string()
        } else {
            let e = r.error.as_deref().unwrap_or("failed");
            format!(
                "**FAIL**: {}",
                e.lines().next().unwrap_or(e).replace('|', "/")
            )
        };
        let _ = writeln!(
            t,
            "| {}{} | {} | {} | {} | {} | {:.3} | {}/{:.0} | {} | {:.0} | {} | {}/{} | {}/{} | {}/{} | {}/{} | {} | {} | {} | {} |",
            r.name,
            if r.oversubscribed {
                " (oversubscribed)"
            } else {
                ""
            },
            fmt_opt(r.cycles_per_packet, 1),
            match (r.ratio_to_testpmd, r.ratio_to_testpmd_min, r.ratio_to_testpmd_max) {
                (Some(m), Some(lo), Some(hi)) => format!("{m:.2} ({lo:.2}-{hi:.2})"),
                _ => "-".into(),
            },
            fmt_opt(r.ratio_to_brackets, 2),
            fmt_opt(r.dut_mpps, 3),
            r.gen_mpps,
            fmt_opt(r.dut_busy_percent, 0),
            r.gen_busy_percent,
            fmt_opt(r.new_sessions_per_s_per_worker, 0),
            r.gen_connections_per_s,
            fmt_opt(r.bytes_per_session, 1),
            us(r.latency_p50_ns),
            us(r.latency_p99_ns),
            us(r.probe_p50_ns),
            us(r.probe_p99_ns),
            signed_us(r.added_p50_ns),
            signed_us(r.added_p99_ns),
            fmt_opt(r.dut_stolen_percent, 1),
            fmt_opt(r.gen_stolen_percent, 1),
            fmt_opt(r.core_to_core_ns, 0),
            r.dut_drops.map(|d| d.to_string()).unwrap_or("-".into()),
            r.lost,
            result
        );
    }
    let _ = writeln!(
        t,
        "\nColumns (perf/README.md has the details):\n\n\
         - *DUT cycles/pkt*: Sluice: the workers' busy TSC cycles (polls that received \
         packets, so empty polls are excluded) over the packets they received, with the \
         counters zeroed at the start of the measure window; includes memif RX/TX. \
         testpmd: its `--record-core-cycles` figure (CPU cycles/packet) over its whole run.\n\
         - *x testpmd 5tswap median (range)*: the Sluice row's cycles/packet over the median \
         of every testpmd 5tswap row of this run (same generator, frame size and wiring); in \
         brackets the same over the slowest and over the fastest testpmd 5tswap row: how far \
         the ratio moves with the choice of reference.\n\
         - *x brackets*: the Sluice row's cycles/packet over the mean of the testpmd 5tswap \
         runs right before and right after it.\n\
         - *DUT Mpps*: packets the DUT's workers received per second of the window; *gen Mpps*: \
         packets the generator received back.\n\
         - *busy % DUT/gen*: the DUT's busy cycles over the window's TSC cycles (Sluice: \
         workers' busy_cycles; testpmd: cycles/packet x packet rate), 100 = saturated; and \
         the share of the generator loop's time in iterations that received packets. A \
         generator near 100 with the DUT below it means the generator set the pace.\n\
         - *new sess/s per worker*: sessions the DUT created per second per worker; *conns/s*: \
         full TCP connections (handshake, request, response, FIN exchange) the generator \
         completed through the DUT.\n\
         - *bytes/session*: the session tables' memory over the configured capacity \
         (`[sessions] capacity` x workers).\n\
         - *RTT*: generator TSC stamp in the request to the response's arrival: two passes \
         through the DUT for NAT/FullNAT, one for DR (the real server answers the client \
         directly) and testpmd; includes memif both ways and the generator's turnaround. \
         *loaded*: with the window in flight (mostly queueing); *1 in flight*: a separate \
         probe with one packet in flight.\n\
         - *added per pass*: the 1-in-flight round trip divided by the passes through the \
         DUT, minus the median 1-in-flight round trip of the testpmd 5tswap rows: the \
         latency one pass through Sluice adds over one through testpmd on the same \
         wiring.\n\
         - *CPU stolen %*: time the DUT's and the generator's polling threads were runnable \
         but waited for their CPU (another process ran there) during the window, as a share \
         of the window (`/proc/PID/task/TID/schedstat`). Above a few percent the row's cycles \
         (a preempted poll counts as busy), rates and tails are not to be trusted.\n\
         - *c2c ns*: a cache line's round trip between CPU 0 and CPU 1, measured just \
         before the scenario (median of five). memif moves every packet's ring slots and \
         buffers between the two CPUs; on this VM the figure moves between about 70 and \
         several hundred ns from minute to minute (the hypervisor's vCPU placement), and \
         cycles per packet and round trips move with it. Informative only: no reference is \
         chosen by it.\n\
         - *DUT drops*: Sluice's drop counters summed over the window; *lost*: generator \
         tokens that got no answer within the loss timeout (their packet was dropped \
         somewhere) and were replaced."
    );
    let hot: Vec<&Row> = rows.iter().filter(|r| r.hot_changes > 0).collect();
    if !hot.is_empty() {
        let _ = writeln!(
            t,
            "\n## Hot changes under load\n\n\
             `--hot-changes N`: N `sluicectl -e` weight changes spread over the window while \
             the traffic runs. *adopted*: Sluice's own measure, from publishing the new \
             snapshot to every worker reporting it adopted (the management loop waits for \
             that before answering, at most 50 ms: *late*); a new session after that uses the \
             change. *sluicectl*: the whole command (process start, request, wait, reply) as \
             the orchestrator timed it.\n\n\
             | scenario | changes | publishes measured | adopted within 1 ms | adopted p50/p99/max us | late | sluicectl p50/max ms | DUT Mpps | gen Mpps | CPU stolen % DUT/gen | result |\n\
             |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"
        );
        let ms = |ns: Option<u64>| ns.map_or("-".into(), |ns| format!("{:.2}", ns as f64 / 1e6));
        for r in hot {
            let _ = writeln!(
                t,
                "| {} | {} | {} | {} | {}/{}/{} | {} | {}/{} | {} | {:.3} | {}/{} | {} |",
                r.name,
                r.hot_changes,
                r.adoption_publishes.map_or("-".into(), |n| n.to_string()),
                match (r.adoption_within_1ms, r.adoption_publishes) {
                    (Some(w), Some(n)) if n > 0 =>
                        format!("{w} ({:.1} %)", 100.0 * w as f64 / n as f64),
                    _ => "-".into(),
                },
                us(r.adoption_p50_ns),
                us(r.adoption_p99_ns),
                us(r.adoption_max_ns),
                r.adoption_late.map_or("-".into(), |n| n.to_string()),
                ms(r.sluicectl_p50_ns),
                ms(r.sluicectl_max_ns),
                fmt_opt(r.dut_mpps, 3),
                r.gen_mpps,
                fmt_opt(r.dut_stolen_percent, 1),
                fmt_opt(r.gen_stolen_percent, 1),
                if r.ok { "ok" } else { "**FAIL**" },
            );
        }
    }
    let synced: Vec<&Row> = rows.iter().filter(|r| r.sync_events.is_some()).collect();
    if !synced.is_empty() {
        let _ = writeln!(
            t,
            "\n## Session sync\n\n\
             `--sync`: Sluice syncs its sessions to a peer on 127.0.0.1 (UDP; the peer only \
             receives). Per second of the window: sync events sent (TCP sessions are synced \
             when established, on each state change and every 10 s while busy), datagrams \
             and bytes (UDP payload), events lost to full worker rings; compare *cycles/pkt* \
             with a run without `--sync`.\n\n\
             | scenario | new sessions/s | sync events/s | datagrams/s | payload MB/s | events dropped | cycles/pkt | result |\n\
             |---|---:|---:|---:|---:|---:|---:|---|"
        );
        for r in synced {
            let per_s = |n: Option<u64>| n.map_or(0.0, |n| n as f64 / r.measure_s.max(1e-9));
            let _ = writeln!(
                t,
                "| {} | {:.0} | {:.0} | {:.0} | {:.2} | {} | {} | {} |",
                r.name,
                r.gen_connections_per_s,
                per_s(r.sync_events),
                per_s(r.sync_messages),
                per_s(r.sync_bytes) / 1e6,
                r.sync_events_dropped.unwrap_or(0),
                fmt_opt(r.cycles_per_packet, 1),
                if r.ok { "ok" } else { "**FAIL**" },
            );
        }
    }
    flood_section(&mut t, rows);
    let mut details = String::new();
    for r in rows {
        if !r.dut_drop_reasons.is_empty() {
            let _ = writeln!(details, "- {}: DUT drops {:?}", r.name, r.dut_drop_reasons);
        }
        if r.dut == "sluice" && r.ok {
            let _ = writeln!(
                details,
                "- {}: {} established sessions ({:.1} s to establish), {} live at the end, \
                 capacity {} per worker, {} requests and {} connections measured{}{}",
                r.name,
                r.established,
                r.establish_s,
                r.live_sessions.unwrap_or(0),
                r.capacity_per_worker.unwrap_or(0),
                r.requests,
                r.connections,
                if r.local_addresses > 0 {
                    format!(
                        ", {} FullNAT local addresses over {} VIP(s)",
                        r.local_addresses, r.vips
                    )
                } else {
                    String::new()
                },
                match (r.bracket_before_cycles, r.bracket_after_cycles) {
                    (None, None) => String::new(),
                    (b, a) => format!(
                        "; testpmd 5tswap right before / after it {} / {} cycles/packet",
                        fmt_opt(b, 1),
                        fmt_opt(a, 1)
                    ),
                }
            );
        }
        if let Some(e) = &r.error {
            let _ = writeln!(
                details,
                "- {}: failed:\n\n```\n{}\n```",
                r.name,
                e.trim_end()
            );
        }
    }
    if !details.is_empty() {
        let _ = writeln!(t, "\nPer scenario:\n\n{details}");
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scenario_names_parse() {
        let s = Scenario::parse("fullnat-1m-mixed-2w").unwrap();
        assert_eq!(
            s.dut,
            Dut::Sluice {
                mode: Mode::FullNat,
                workers: 2
            }
        );
        assert_eq!(s.sessions, 1_000_000);
        assert_eq!(s.workload, Workload::Mixed);
        assert_eq!(
            Scenario::parse("nat-5000-established").unwrap().sessions,
            5000
        );
        assert!(Scenario::parse("testpmd-5tswap").is_ok());
        let s = Scenario::parse("nat-1k-synflood").unwrap();
        assert_eq!((s.workload, s.synproxy), (Workload::SynFlood, true));
        let s = Scenario::parse("nat-1m-synflood-noproxy").unwrap();
        assert_eq!((s.workload, s.synproxy), (Workload::SynFlood, false));
        assert_eq!(s.sessions, 1_000_000);
        assert!(!Scenario::parse("nat-1k-connections").unwrap().synproxy);
        for bad in [
            "nat",
            "nat-1k",
            "tun-1k-established",
            "nat-1k-idle",
            "nat-1k-mixed-3w",
            "nat-1k-mixed-noproxy",
            "nat-1k-synflood-2w",
            "fullnat-1k-synflood",
            "dr-1k-synflood-noproxy",
        ] {
            assert!(Scenario::parse(bad).is_err(), "{bad}");
        }
        for n in quick_set() {
            Scenario::parse(n).unwrap();
        }
        for n in full_set() {
            Scenario::parse(&n).unwrap();
        }
    }

    #[test]
    fn local_addresses_cover_the_sessions_and_fit_the_limit() {
        for n in full_set() {
            let s = Scenario::parse(&n).unwrap();
            let l = lips_needed(&s);
            assert!(l <= MAX_LIPS, "{n}: {l}");
            assert!(vips_needed(l) <= engine::MAX_VIPS, "{n}");
            let churn = if s.workload == Workload::Established {
                0
            } else {
                CHURN_SESSIONS
            };
            assert!(l as u64 * PORTS_PER_LIP >= s.sessions as u64 + churn, "{n}");
        }
    }

    #[test]
    fn generated_config_loads() {
        let dir = std::env::temp_dir().join(format!("sluice-bench-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for name in [
            "fullnat-1m-connections-2w",
            "dr-1k-established",
            "nat-10m-mixed",
            "fullnat-10m-connections",
            "nat-1k-synflood",
            "nat-1k-synflood-noproxy",
        ] {
            let sc = Scenario::parse(name).unwrap();
            let Dut::Sluice { mode, .. } = sc.dut else {
                unreachable!()
            };
            let path = dir.join("x.toml");
            let lips = lips_needed(&sc);
            let text = sluice_toml(
                &sc,
                mode,
                "p",
                &dir.join("c.sock"),
                "/m",
                lips,
                vips_needed(lips),
                true,
            );
            std::fs::write(&path, &text).unwrap();
            let config = sluice::config::Config::load(&path)
                .unwrap_or_else(|e| panic!("{name}: {e}\n{text}"));
            if sc.workload == Workload::SynFlood {
                use sluice::model::service::SynProxyMode;
                let want = if sc.synproxy {
                    SynProxyMode::On
                } else {
                    SynProxyMode::Off
                };
                assert_eq!(config.services.len(), 2, "{name}");
                assert_eq!(config.services[0].synproxy.mode, SynProxyMode::Off);
                assert_eq!(config.services[1].synproxy.mode, want, "{name}");
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn names(scenarios: &[Scenario]) -> Vec<&str> {
        scenarios.iter().map(|s| s.name.as_str()).collect()
    }

    fn bracketed(list: &[&str]) -> Vec<String> {
        let scenarios = list.iter().map(|n| Scenario::parse(n).unwrap()).collect();
        with_brackets(scenarios)
            .into_iter()
            .map(|s| s.name)
            .collect()
    }

    #[test]
    fn testpmd_runs_right_before_and_after_every_sluice_scenario() {
        let quick = bracketed(&quick_set());
        assert_eq!(
            quick,
            [
                "testpmd-macswap",
                "testpmd-5tswap",
                "nat-1k-established",
                "testpmd-5tswap",
                "fullnat-1k-established",
                "testpmd-5tswap",
                "dr-1k-established",
                "testpmd-5tswap",
                "nat-1m-established",
                "testpmd-5tswap",
                "fullnat-1m-established",
                "testpmd-5tswap",
                "nat-1k-connections",
                "testpmd-5tswap",
                "fullnat-1k-mixed",
                "testpmd-5tswap",
            ]
        );
        // Every set: each Sluice scenario between two references, N + 1 of them, and
        // the scenarios themselves in their order.
        let full: Vec<Scenario> = full_set()
            .iter()
            .map(|n| Scenario::parse(n).unwrap())
            .collect();
        let sluice = full.iter().filter(|s| s.is_sluice()).count();
        let run = with_brackets(full.clone());
        for (i, sc) in run.iter().enumerate().filter(|(_, s)| s.is_sluice()) {
            assert_eq!(run[i - 1].name, REFERENCE, "before {}", sc.name);
            assert_eq!(run[i + 1].name, REFERENCE, "after {}", sc.name);
        }
        let references = run.iter().filter(|s| s.name == REFERENCE).count();
        assert_eq!(references, sluice + 1);
        let rest: Vec<&str> = names(&run)
            .into_iter()
            .filter(|n| *n != REFERENCE)
            .collect();
        assert_eq!(rest, names(&full));
        // A reference already in the list is used where it stands.
        assert_eq!(
            bracketed(&[
                "testpmd-5tswap",
                "nat-1k-established",
                "testpmd-5tswap",
                "dr-1k-established"
            ]),
            [
                "testpmd-5tswap",
                "nat-1k-established",
                "testpmd-5tswap",
                "dr-1k-established",
                "testpmd-5tswap"
            ]
        );
        // Another testpmd run between two Sluice scenarios is not a bracket.
        assert_eq!(
            bracketed(&["nat-1k-established", "testpmd-macswap", "dr-1k-established"]),
            [
                "testpmd-5tswap",
                "nat-1k-established",
                "testpmd-5tswap",
                "testpmd-macswap",
                "testpmd-5tswap",
                "dr-1k-established",
                "testpmd-5tswap"
            ]
        );
        // Nothing to compare: nothing added.
        assert_eq!(bracketed(&["testpmd-macswap"]), ["testpmd-macswap"]);
        assert!(bracketed(&[]).is_empty());
    }

    #[test]
    fn a_flood_collapses_where_the_answers_stop_for_good() {
        assert_eq!(collapse_s(&[]), None);
        assert_eq!(collapse_s(&[100, 100, 100]), None);
        // A stall in the middle is not a collapse; nor is one low slot at the end.
        assert_eq!(collapse_s(&[100, 5, 100, 100]), None);
        assert_eq!(collapse_s(&[100, 100, 100, 5]), None);
        assert_eq!(collapse_s(&[90, 100, 5, 100, 3, 9, 0]), Some(0.4));
        assert_eq!(collapse_s(&[0, 0, 0]), None);
    }

    #[test]
    fn median_and_spread() {
        assert_eq!(median(&[]), None);
        assert_eq!(median(&[7.0]), Some(7.0));
        assert_eq!(median(&[3.0, 1.0, 2.0]), Some(2.0));
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), Some(2.5));
        assert_eq!(Spread::of(&[]), None);
        assert_eq!(
            Spread::of(&[281.1, 245.7, 250.0]),
            Some(Spread {
                count: 3,
                median: 250.0,
                min: 245.7,
                max: 281.1
            })
        );
    }

    fn row(name: &str, cycles: f64, probe_p50: u64, probe_p99: u64) -> Row {
        let sc = Scenario::parse(name).unwrap();
        Row {
            name: name.into(),
            dut: if sc.is_sluice() { "sluice" } else { "testpmd" }.into(),
            ok: true,
            cycles_per_packet: Some(cycles),
            probe_p50_ns: Some(probe_p50),
            probe_p99_ns: Some(probe_p99),
            dut_passes: match sc.dut {
                Dut::Sluice {
                    mode: Mode::Nat | Mode::FullNat,
                    ..
                } => 2,
                _ => 1,
            },
            ..Default::default()
        }
    }

    /// A run in order: testpmd 200, NAT 500, testpmd 300, DR 450, testpmd that
    /// failed, macswap, testpmd 260. The c2c figures would have paired NAT with the
    /// 200-cycle row under the former closest-c2c rule; they change nothing now.
    fn a_run() -> Vec<Row> {
        let mut failed = row("testpmd-5tswap", 10.0, 1, 1);
        failed.ok = false;
        let mut rows = vec![
            row("testpmd-5tswap", 200.0, 1000, 1500),
            row("nat-1k-established", 500.0, 3000, 4000),
            row("testpmd-5tswap", 300.0, 2000, 2500),
            row("dr-1k-established", 450.0, 1600, 2000),
            failed,
            row("testpmd-macswap", 100.0, 500, 500),
            row("testpmd-5tswap", 260.0, 1200, 1400),
        ];
        for (r, c2c) in rows
            .iter_mut()
            .zip([70.0, 70.0, 300.0, 300.0, 90.0, 90.0, 200.0])
        {
            r.core_to_core_ns = Some(c2c);
        }
        rows
    }

    #[test]
    fn each_sluice_row_is_compared_with_the_median_of_every_testpmd_row() {
        let mut rows = a_run();
        compare_with_reference(&mut rows);
        let close = |a: Option<f64>, b: f64| a.is_some_and(|a| (a - b).abs() < 1e-9);
        let (nat, dr) = (&rows[1], &rows[3]);
        for r in [nat, dr] {
            // The failed testpmd row and macswap are not references.
            assert_eq!(r.testpmd_runs, 3, "{}", r.name);
            assert_eq!(r.testpmd_median_cycles, Some(260.0));
            assert_eq!(r.testpmd_min_cycles, Some(200.0));
            assert_eq!(r.testpmd_max_cycles, Some(300.0));
        }
        assert!(close(nat.ratio_to_testpmd, 500.0 / 260.0));
        assert!(close(nat.ratio_to_testpmd_min, 500.0 / 300.0));
        assert!(close(nat.ratio_to_testpmd_max, 500.0 / 200.0));
        assert_eq!(
            (nat.bracket_before_cycles, nat.bracket_after_cycles),
            (Some(200.0), Some(300.0))
        );
        assert!(close(nat.ratio_to_brackets, 2.0));
        assert!(close(dr.ratio_to_testpmd, 450.0 / 260.0));
        assert!(close(dr.ratio_to_testpmd_min, 1.5));
        assert!(close(dr.ratio_to_testpmd_max, 2.25));
        // Its second bracket failed: the one before it alone.
        assert_eq!(
            (dr.bracket_before_cycles, dr.bracket_after_cycles),
            (Some(300.0), None)
        );
        assert!(close(dr.ratio_to_brackets, 1.5));
        // Added per pass: probe / passes minus the median testpmd probe (1200 / 1500).
        assert_eq!((nat.added_p50_ns, nat.added_p99_ns), (Some(300), Some(500)));
        assert_eq!((dr.added_p50_ns, dr.added_p99_ns), (Some(400), Some(500)));
        for r in rows.iter().filter(|r| r.dut != "sluice") {
            assert_eq!(r.ratio_to_testpmd, None, "{}", r.name);
            assert_eq!(r.ratio_to_brackets, None, "{}", r.name);
        }
    }

    #[test]
    fn without_a_testpmd_row_there_is_no_ratio() {
        let mut rows = vec![
            row("nat-1k-established", 500.0, 3000, 4000),
            row("testpmd-macswap", 100.0, 500, 500),
        ];
        compare_with_reference(&mut rows);
        let nat = &rows[0];
        assert_eq!(nat.testpmd_runs, 0);
        assert_eq!(
            (
                nat.ratio_to_testpmd,
                nat.ratio_to_brackets,
                nat.added_p50_ns
            ),
            (None, None, None)
        );
        assert!(reference_summary(&rows, true).contains("so no ratios"));
    }

    #[test]
    fn the_table_and_the_json_carry_the_reference() {
        let mut rows = a_run();
        compare_with_reference(&mut rows);
        let summary = reference_summary(&rows, true);
        assert!(
            summary.contains(
                "ran 3 times, before and after every Sluice scenario (in run order: \
                 200.0, 300.0, 260.0 cycles/packet): median 260.0, range 200.0-300.0 \
                 (the slowest 1.50x the fastest)"
            ),
            "{summary}"
        );
        let md = markdown(&parse(&[]).unwrap(), &rows, 5.0, "0 0 0", Duration::ZERO);
        assert!(md.contains(&summary), "{md}");
        assert!(
            md.contains("| nat-1k-established | 500.0 | 1.92 (1.67-2.50) | 2.00 |"),
            "{md}"
        );
        assert!(
            md.contains("| dr-1k-established | 450.0 | 1.73 (1.50-2.25) | 1.50 |"),
            "{md}"
        );
        assert!(md.contains("| testpmd-5tswap | 200.0 | - | - |"), "{md}");
        assert!(
            md.contains("testpmd 5tswap right before / after it 300.0 / - cycles/packet"),
            "{md}"
        );
        let json = serde_json::to_value(&rows).unwrap();
        assert_eq!(json[1]["testpmd_median_cycles"], 260.0);
        assert_eq!(json[1]["testpmd_runs"], 3);
        assert_eq!(json[1]["bracket_before_cycles"], 200.0);
        assert_eq!(json[3]["bracket_after_cycles"], serde_json::Value::Null);
        assert_eq!(json[1]["ratio_to_brackets"], 2.0);
    }
}
