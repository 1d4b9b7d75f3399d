//! `sluice-gen`: the performance harness of issue 7.
//!
//! * `sluice-gen run ...` is the traffic generator: a DPDK process that plays clients
//!   and real servers through the device under test over net_memif (see `run.rs` and
//!   `engine.rs`).
//! * `sluice-gen bench ...` is the orchestrator: per scenario it starts the generator
//!   and the DUT (Sluice, or dpdk-testpmd in its place), steps them through the
//!   phases, collects the figures and writes a markdown table (see `bench.rs`).
//!
//! See perf/README.md.
#![recursion_limit = "256"]

mod bench;
mod engine;
mod hist;
mod run;

use engine::{FlowOrder, Mode, Validate, Workload};
use std::process::ExitCode;

const USAGE: &str = "usage:
  sluice-gen bench [--quick | --full] [--scenarios LIST] [--duration SECS]
                   [--out FILE] [--json FILE] [--validate] [--window K]
                   [--frame-size BYTES] [--gen-mode MODE] [--no-brackets] [--verbose]
  sluice-gen run --socket NAME --mode MODE [options]
  sluice-gen list                  (the scenario names and sets)
  sluice-gen c2c                   (CPU 0 <-> CPU 1 cache-line round trip, 5 times)

bench (the orchestrator; needs root, the release binaries and dpdk-testpmd):
  --quick              the quick set (default; under 5 minutes here)
  --full               every scenario: dr/nat/fullnat x 1k/1m/10m x established/
                       connections/mixed, testpmd, and the 2-worker variants
  --scenarios LIST     comma-separated scenario names (see `sluice-gen list`)
                       testpmd-5tswap (the reference) runs right before and right
                       after every Sluice scenario (N Sluice scenarios: N + 1 runs);
                       each Sluice row is reported over the median of all of them,
                       with the range over them and the ratio to its two brackets
  --no-brackets        run the scenarios as listed, no testpmd-5tswap added
  --duration SECS      measure window per scenario, testpmd's included
                       (default 5 quick, 10 full)
  --out FILE           write the markdown results there (default: print only)
  --json FILE          write the per-scenario figures as JSON there
  --validate           full validation: every packet's checksums, not every 64th
  --window K           packets in flight (default 1024)
  --order O            the generator's --order for established flows (default
                       scrambled; creation for figures comparable with runs that
                       visited the flows in the order they were opened)
  --frame-size BYTES   frame length without FCS (default 64; at least 62)
  --attempts N         run a scenario up to N times (default 2) while its polling
                       threads lose more than --max-stolen percent (default 5) of
                       the window to other processes; the least disturbed run is kept
  --gen-mode MODE      make the generator expect MODE whatever the scenario's DUT
                       does (dr, nat, fullnat): a deliberately wrong expectation,
                       to check that validation fails
  --hot-changes N      during each Sluice window, N `sluicectl -e` weight changes
                       (1..=1000); reports Sluice's publish -> all workers adopted
                       latency (p50/p99/max, late) and each command's duration
  --sync               Sluice syncs its sessions to a receive-only peer on 127.0.0.1:
                       reports sync events, datagrams and bytes per second
  --sluicectl PATH     the sluicectl binary (default: next to this one)
  --sluice PATH        the sluice binary (default: next to this one)
  --testpmd PATH       default /usr/bin/dpdk-testpmd
  --verbose            echo the generator's progress lines

run (the generator; usually started by bench):
  --socket NAME        memif socket (abstract namespace) the DUT connects to
  --mode MODE          dr | nat | fullnat | 5tswap | macswap
  --workload W         established | connections | mixed | synflood (default
                       established)
  --synproxy on|off    synflood: whether the flood service (198.18.1.200:80) runs the
                       SYN proxy, i.e. whether SYN-ACKs must be cookies (default off)
  --sessions N         established flows (default 1000)
  --window K           packets in flight (default 1024)
  --frame-size BYTES   default 64
  --duration SECS      measure window (default 5)
  --probe-ms MS        latency probe with one packet in flight (default 500)
  --validate MODE      sample | full (default sample)
  --real-servers R     default 4 (198.18.2.1..)
  --lips L             FullNAT local addresses 198.18.3.1.. in use, over all VIPs
                       (default 1)
  --new-percent P      mixed: share of requests on new connections (default 10)
  --order O            scrambled | creation: the order requests visit the established
                       flows in, each once a round (default scrambled: flows opened
                       far apart interleave, as many clients' requests do, so the
                       DUT reads its sessions at random; creation: in the order
                       they were opened, so it reads them one after the other)
  --vip ADDR           the (first) VIP the clients use (default 198.18.1.1)
  --vips V             VIPs in use: flow f goes to VIP + f % V (default 1)
  --queues Q           queue pairs, one per DUT worker (default 1)
  --lcore N            the polling lcore (default 0)
  --file-prefix P      EAL file prefix (default sluice-gen-<pid>)
  --memory-mb MB       EAL memory (default 512)
  --no-wait            measure right after the probe (no \"measure\" on stdin)
  --link-timeout S     default 60;  --stall-timeout S  default 20
  --loss-timeout-ms MS default 200";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let code = match args.first().map(String::as_str) {
        Some("run") => match parse_run(&args[1..]) {
            Ok(a) => run::run(a),
            Err(e) => {
                eprintln!("sluice-gen run: {e}\n\n{USAGE}");
                2
            }
        },
        Some("bench") => match bench::parse(&args[1..]) {
            Ok(opts) => bench::main(opts),
            Err(e) => {
                eprintln!("sluice-gen bench: {e}\n\n{USAGE}");
                2
            }
        },
        Some("c2c") => {
            for _ in 0..5 {
                match bench::core_to_core_ns() {
                    Some(ns) => println!("CPU 0 <-> CPU 1 cache-line round trip: {ns:.0} ns"),
                    None => println!("core-to-core measurement failed"),
                }
            }
            0
        }
        Some("list") => {
            bench::list();
            0
        }
        Some("-h" | "--help" | "help") => {
            println!("{USAGE}");
            0
        }
        _ => {
            eprintln!("{USAGE}");
            2
        }
    };
    ExitCode::from(code as u8)
}

fn num<T: std::str::FromStr>(name: &str, v: &str) -> Result<T, String> {
    v.parse()
        .map_err(|_| format!("{name}: {v:?} is not a valid number"))
}

fn parse_run(args: &[String]) -> Result<run::RunArgs, String> {
    let mut a = run::RunArgs {
        socket: String::new(),
        file_prefix: format!("sluice-gen-{}", std::process::id()),
        lcore: 0,
        queues: 1,
        memory_mb: 512,
        mode: Mode::Nat,
        workload: Workload::Established,
        sessions: 1000,
        window: 1024,
        frame_len: 64,
        duration_s: 5.0,
        probe_ms: 500,
        validate: Validate::Sample,
        real_servers: 4,
        lips: 1,
        new_percent: 10,
        order: FlowOrder::Scrambled,
        vip: engine::VIP,
        vips: 1,
        wait_measure: true,
        link_timeout_s: 60.0,
        stall_timeout_s: 20.0,
        loss_timeout_ms: 200,
        synproxy: false,
    };
    let mut mode = None;
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        if flag == "--no-wait" {
            a.wait_measure = false;
            continue;
        }
        let v = it
            .next()
            .ok_or_else(|| format!("{flag} needs a value"))?
            .as_str();
        match flag.as_str() {
            "--socket" => a.socket = v.to_string(),
            "--file-prefix" => a.file_prefix = v.to_string(),
            "--lcore" => a.lcore = num(flag, v)?,
            "--queues" => a.queues = num(flag, v)?,
            "--memory-mb" => a.memory_mb = num(flag, v)?,
            "--mode" => mode = Some(Mode::parse(v).ok_or_else(|| format!("--mode {v:?}"))?),
            "--workload" => {
                a.workload = Workload::parse(v).ok_or_else(|| format!("--workload {v:?}"))?
            }
            "--sessions" => a.sessions = num(flag, v)?,
            "--window" => a.window = num(flag, v)?,
            "--frame-size" => a.frame_len = num(flag, v)?,
            "--duration" => a.duration_s = num(flag, v)?,
            "--probe-ms" => a.probe_ms = num(flag, v)?,
            "--validate" => {
                a.validate = match v {
                    "sample" => Validate::Sample,
                    "full" => Validate::Full,
                    _ => return Err(format!("--validate {v:?}: sample or full")),
                }
            }
            "--real-servers" => a.real_servers = num(flag, v)?,
            "--lips" => a.lips = num(flag, v)?,
            "--new-percent" => a.new_percent = num(flag, v)?,
            "--order" => {
                a.order = FlowOrder::parse(v)
                    .ok_or_else(|| format!("--order {v:?}: scrambled or creation"))?
            }
            "--vip" => a.vip = u32::from(num::<std::net::Ipv4Addr>(flag, v)?),
            "--vips" => a.vips = num(flag, v)?,
            "--link-timeout" => a.link_timeout_s = num(flag, v)?,
            "--stall-timeout" => a.stall_timeout_s = num(flag, v)?,
            "--loss-timeout-ms" => a.loss_timeout_ms = num(flag, v)?,
            "--synproxy" => {
                a.synproxy = match v {
                    "on" => true,
                    "off" => false,
                    _ => return Err(format!("--synproxy {v:?}: on or off")),
                }
            }
            other => return Err(format!("unknown option {other:?}")),
        }
    }
    a.mode = mode.ok_or("--mode is required")?;
    if a.workload == Workload::SynFlood && !matches!(a.mode, Mode::Nat | Mode::FullNat) {
        return Err("--workload synflood: --mode nat or fullnat (the SYN proxy's modes)".into());
    }
    if a.socket.is_empty() {
        return Err("--socket is required".into());
    }
    if !(engine::MIN_FRAME..=engine::MAX_FRAME).contains(&a.frame_len) {
        return Err(format!(
            "--frame-size {}: {}..={}",
            a.frame_len,
            engine::MIN_FRAME,
            engine::MAX_FRAME
        ));
    }
    if a.window == 0 || a.window > engine::MAX_WINDOW {
        return Err(format!("--window: 1..={}", engine::MAX_WINDOW));
    }
    if a.sessions == 0 || a.sessions > engine::MAX_SESSIONS {
        return Err(format!("--sessions: 1..={}", engine::MAX_SESSIONS));
    }
    if a.real_servers == 0 || a.real_servers > engine::MAX_REAL_SERVERS {
        return Err(format!("--real-servers: 1..={}", engine::MAX_REAL_SERVERS));
    }
    if a.lips == 0 || a.lips > engine::MAX_LIPS {
        return Err(format!("--lips: 1..={}", engine::MAX_LIPS));
    }
    if a.vips == 0 || a.vips > engine::MAX_VIPS {
        return Err(format!("--vips: 1..={}", engine::MAX_VIPS));
    }
    if a.queues == 0 || a.new_percent > 100 || a.duration_s.is_nan() || a.duration_s <= 0.0 {
        return Err("--queues >= 1, --new-percent <= 100, --duration > 0".into());
    }
    Ok(a)
}
