//! `sluice --config FILE`: the appliance daemon.
use sluice::daemon::{self, CheckDepth, Options};
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

const USAGE: &str = "usage: sluice --config FILE [--duration SECS] [--stats-interval MS]
       sluice --check-config FILE [--file-only]
       sluice --prepare FILE
       sluice simulate WORKLOAD [OPTIONS]   (what-if scheduler simulation, no DPDK;
                                             see sluice simulate --help, docs/SIMULATE.md)

  -c, --config FILE      TOML configuration (see docs/CONFIG.md; examples in config/)
  --check-config FILE    check FILE as the daemon would before starting, without
                         starting DPDK: syntax, fields, services, then this machine's
                         lcores, memory, hugepages, the mbuf pool in eal.memory_mb,
                         PCI devices, open-file limit and listen addresses; exit 0
                         when the daemon would start, 1 with the file, line and field
                         otherwise
  --file-only            with --check-config: skip this machine's resources (a file
                         written for another machine)
  --prepare FILE         make this host ready for FILE (as root, before each start:
                         the systemd unit's ExecStartPre): reserve the hugepages
                         eal.memory_mb needs and mount hugetlbfs if none is, bind each
                         pci port to vfio-pci ($SLUICE_PCI_DRIVER to choose another);
                         a NIC already on a DPDK driver, or an mlx5 NIC, is left as it
                         is, an interface that is up is refused
  --duration SECS        stop by itself after SECS seconds (demos, tests)
  --stats-interval MS    print testpmd-style statistics every MS milliseconds
                         (loopback configs default to [loopback].stats_interval_ms),
                         to stdout, until a write to it fails (no reader any more)
  -h, --help             this text
  -V, --version          version

Signals: SIGTERM/SIGINT stop, SIGHUP reloads the config file (as sluicectl reload).
systemd: with NOTIFY_SOCKET set, sends READY=1 once serving, RELOADING=1/READY=1
around a reload, STOPPING=1, and WATCHDOG=1 pings when WATCHDOG_USEC is set.

Logging: RUST_LOG=debug|info|warn (default info), to stderr; with priority prefixes
(<3> error .. <7> debug) when stderr is the journal (JOURNAL_STREAM).";

/// `println!` and `eprintln!` without their panic when the reader went away (`sluice
/// ... | head`): the line is lost, the exit status is the one the work earned.
macro_rules! out_line {
    ($($arg:tt)*) => {{
        let _ = writeln!(std::io::stdout().lock(), $($arg)*);
    }};
}

macro_rules! err_line {
    ($($arg:tt)*) => {{
        let _ = writeln!(std::io::stderr().lock(), $($arg)*);
    }};
}

/// What the command line asks for.
enum Mode {
    Run(Options),
    Check(PathBuf, CheckDepth),
    Prepare(PathBuf),
}

fn parse_args(args: &[String]) -> Result<Option<Mode>, String> {
    let mut opts = Options::default();
    let mut config = None;
    let mut check = None;
    let mut file_only = false;
    let mut prepare = None;
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
                out_line!("sluice {}", env!("CARGO_PKG_VERSION"));
                std::process::exit(0);
            }
            "-c" | "--config" => config = Some(PathBuf::from(value(a)?)),
            "--check-config" => check = Some(PathBuf::from(value(a)?)),
            "--file-only" => file_only = true,
            "--prepare" => prepare = Some(PathBuf::from(value(a)?)),
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
    if let Some(file) = prepare {
        if config.is_some() || check.is_some() || file_only || opts.duration.is_some() {
            return Err("--prepare takes no other option".into());
        }
        return Ok(Some(Mode::Prepare(file)));
    }
    if let Some(file) = check {
        if config.is_some() || opts.duration.is_some() || opts.stats_interval.is_some() {
            return Err("--check-config takes no --config, --duration or --stats-interval".into());
        }
        let depth = match file_only {
            true => CheckDepth::File,
            false => CheckDepth::Machine,
        };
        return Ok(Some(Mode::Check(file, depth)));
    }
    if file_only {
        return Err("--file-only goes with --check-config".into());
    }
    opts.config = config.ok_or("--config FILE is required")?;
    Ok(Some(Mode::Run(opts)))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("simulate") {
        return sluice::simulate::cli::main(&args[1..]);
    }
    let journal = daemon::stderr_is_journal();
    let mut logger =
        env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"));
    if journal {
        // The journal stamps each line and reads its priority from the prefix.
        logger.format(|buf, record| {
            let prefix = daemon::journal_prefix(record.level());
            writeln!(buf, "{prefix}{}: {}", record.target(), record.args())
        });
    } else {
        logger.format_timestamp_millis();
    }
    logger.init();
    let error_prefix = if journal { "<3>" } else { "" };
    let opts = match parse_args(&args) {
        Ok(Some(Mode::Run(o))) => o,
        Ok(Some(Mode::Prepare(file))) => {
            let driver = std::env::var("SLUICE_PCI_DRIVER").ok();
            return match daemon::prepare_host(&file, driver.as_deref()) {
                Ok(done) => {
                    for line in done {
                        out_line!("sluice: {}: {line}", file.display());
                    }
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    err_line!("{error_prefix}sluice: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        Ok(Some(Mode::Check(file, depth))) => {
            return match daemon::check_config(&file, depth) {
                Ok(summary) => {
                    out_line!("sluice: {summary}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    err_line!("{error_prefix}sluice: {e}");
                    ExitCode::FAILURE
                }
            };
        }
        Ok(None) => {
            out_line!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            err_line!("{error_prefix}sluice: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    match daemon::run(&opts) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            err_line!("{error_prefix}sluice: {e}");
            ExitCode::FAILURE
        }
    }
}
