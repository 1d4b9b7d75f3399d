//! `sluice --config FILE`: the appliance daemon.
use sluice::daemon::{self, Options};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

const USAGE: &str = "usage: sluice --config FILE [--duration SECS] [--stats-interval MS]
       sluice simulate WORKLOAD [OPTIONS]   (what-if scheduler simulation, no DPDK;
                                             see sluice simulate --help, docs/SIMULATE.md)

  --config FILE          TOML configuration (see docs/CONFIG.md; examples in config/)
  --duration SECS        stop by itself after SECS seconds (demos, tests)
  --stats-interval MS    print testpmd-style statistics every MS milliseconds
                         (loopback configs default to [loopback].stats_interval_ms)
  -h, --help             this text
  -V, --version          version

Logging: RUST_LOG=debug|info|warn (default info), to stderr.";

fn parse_args(args: &[String]) -> Result<Option<Options>, String> {
    let mut opts = Options::default();
    let mut config = None;
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match a.as_str() {
            "-h" | "--help" => return Ok(None),
            "-V" | "--version" => {
                println!("sluice {}", env!("CARGO_PKG_VERSION"));
                std::process::exit(0);
            }
            "-c" | "--config" => config = Some(PathBuf::from(value(a)?)),
            "--duration" => {
                let v = value(a)?;
                let secs: f64 = v
                    .parse()
                    .ok()
                    .filter(|s: &f64| s.is_finite() && *s > 0.0)
                    .ok_or_else(|| {
                        format!("--duration: {v:?} is not a positive number of seconds")
                    })?;
                opts.duration = Some(Duration::from_secs_f64(secs));
            }
            "--stats-interval" => {
                let v = value(a)?;
                let ms: u64 = v.parse().ok().filter(|m| *m >= 10).ok_or_else(|| {
                    format!("--stats-interval: {v:?} is not a number of milliseconds >= 10")
                })?;
                opts.stats_interval = Some(Duration::from_millis(ms));
            }
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    opts.config = config.ok_or("--config FILE is required")?;
    Ok(Some(opts))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("simulate") {
        return sluice::simulate::cli::main(&args[1..]);
    }
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .format_timestamp_millis()
        .init();
    let opts = match parse_args(&args) {
        Ok(Some(o)) => o,
        Ok(None) => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("sluice: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match daemon::run(&opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sluice: {e}");
            ExitCode::FAILURE
        }
    }
}
