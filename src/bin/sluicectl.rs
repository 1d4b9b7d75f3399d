//! `sluicectl`: the command-line client of the sluice daemon's control socket.
//!
//! Exit status: 0 on success, 1 when the request fails (no daemon, timeout, daemon
//! error), 2 on bad usage. Errors are one line on stderr: `sluicectl: <what is wrong>`.
use serde_json::value::RawValue;
use sluice::control::client;
use sluice::control::protocol::{ConnectionsCursor, Request};
use sluice::control::render::{
    connection_line, connections_title, render_admission, render_admission_all, render_cluster,
    render_connections, render_events, render_health, render_laddrs, render_neighbours,
    render_persistent_conns, render_rates, render_save, render_services, render_skew,
    render_status, render_sync, render_thresholds, render_timeouts, render_vrrp, render_xstats,
    DEFAULT_SKEW_THRESHOLD_PCT,
};
use sluice::control::report::{ConnectionsReport, ServiceStatus, ServicesReport};
use sluice::control::{ipvsadm, ipvsadm_usage};
use sluice::control::{DEFAULT_SOCKET_PATH, MAX_REQUEST_BYTES};
use sluice::model::SchedulerKind;
use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

const USAGE: &str = "\
Usage: sluicectl [-S|--socket PATH] [--timeout SECS] [--json] <command>

Queries and controls a running sluice daemon through its control socket.

Commands:
  status          ports, lcores, drop and event counters, sessions
  xstats PORT_ID  the NIC's extended statistics for one port
  zero            reset every port, lcore, drop and event counter to zero
  events          recent config changes and alerts (lb=... lines, UTC)
  reload          re-read the config file; apply its services' differences as one
                  all-or-nothing change (ports, lcores and sessions need a restart)
  sync            session sync: messages/records sent and received, rejected by reason
  vrrp            VRRP state (MASTER/BACKUP), priority, the master heard, counters
  neigh           the workers' neighbour tables (ARP, Neighbor Discovery): each
                  address's MAC, role, age and the workers holding it; the real
                  servers some worker has not resolved
  cluster         BGP through BIRD ([bgp]): BIRD's BGP and BFD sessions, the VIPs
                  announced and, for each withdrawn one, why (docs/CLUSTER.md)
  drain           withdraw every VIP from BGP for maintenance (connections keep
                  being forwarded)
  undrain         announce the VIPs again after a drain
  health          health checks: each watched real server's check, state (up or
                  EVICTED), evictions and last probe result; probe counters
  skew [-t|-u VIP:port] [--window SECS] [--threshold PCT]
                  connection/rate skew per real server (seed 000): largest share
                  over the share its weight gives (100% = as scheduled),
                  WARN above PCT (default 300), advisory on long-lived traffic
  import-keepalived FILE
                  print keepalived.conf FILE's virtual_server, real_server (with
                  their checks) and first vrrp_instance as Sluice TOML ([[services]],
                  [vrrp]); what cannot be translated is listed on stderr by line
                  (no daemon needed)
  capture -w FILE [-c COUNT] [--duration SECS] [-s SNAPLEN] [-i PORT]... [--dir rx|tx]
          [--proto tcp|udp|icmp|icmp6] [--port N] [--vip IP[:PORT]]... [--rs IP[:PORT]]...
          [--host IP]...    (IPv6: ADDR, or [ADDR]:PORT)
                  copy the frames the workers receive (rx) and send (tx) into a pcapng
                  file (tshark/Wireshark/tcpdump read it) until COUNT packets, SECS
                  seconds or Ctrl-C; set filters must all match, --vip/--rs/--host are
                  alternatives (source or destination; with :PORT, on the same side)
  capture --status | --stop
                  the running (or last) capture's figures; end the running one

ipvsadm 1.31 syntax (no command at all lists the table; called as ipvsadm, through
the link `scripts/setup.sh --ipvsadm-link` makes, exit statuses and words are ipvsadm's):
  -A|-E -t|-u VIP:port [-s scheduler] [-p [timeout] [-M netmask]] add/edit a service;
                  scheduler: {SCHEDULERS} (default {DEFAULT_SCHEDULER})
  -D -t|-u VIP:port                                              delete a service
  -a|-e -t|-u VIP:port -r RIP[:port] [-g|-m|-i] [-w weight] [-x upper] [-y lower]
  -d -t|-u VIP:port -r RIP[:port]                                delete a real server
  -C                                                             clear all services
  -L|-l [-n] [-t|-u VIP:port] [--stats|--rate|--thresholds|--persistent-conn] [-X] [--nosort]
                                                                 list services (sorted by family,
                                                                 protocol, address and port, real
                                                                 servers by address and port, unless
                                                                 --nosort;
                                                                 counters from 100M on in K/M/G/T
                                                                 unless -X/--exact)
  -L|-l [-n] --timeout                                           session timeouts (tcp tcpfin udp)
  --set TCP TCPFIN UDP                                           set them (seconds, 0 keeps one)
  -Z [-t|-u VIP:port]                                            zero all counters, or one service's
  -S [-n]                                                        print the services as ipvsadm-save
                                                                 (and their SYN proxy, access lists and
                                                                 rate limits, in sluicectl's options)
  -R [--atomic|--replace]                                        apply ipvsadm-save lines from stdin line
                                                                 by line, naming lines not applied; with
                                                                 --atomic all or nothing, as one change;
                                                                 with --replace they are the whole table
                                                                 (save/restore: -S > f && -R --replace < f)
  -L|-l [-n] -c                                                  list connections in ipvsadm's layout
                                                                 (--json adds worker and local address)
  -P|--add-laddr -t|-u VIP:port -z LIP [-F ifname]               add a FullNAT local address
  -Q|--del-laddr -t|-u VIP:port -z LIP [-F ifname]               delete a local address
  -G|--get-laddr -t|-u VIP:port                                  list a service's local addresses

Admission of new connections (established sessions are never affected):
  --acl-add -t|-u VIP:port --allow|--deny PREFIX[,PREFIX...]      add access-list rules (the longest
                                                                 matching prefix decides; with any
                                                                 allow rule, unlisted sources are denied)
  --acl-del -t|-u VIP:port --allow|--deny PREFIX[,PREFIX...]      remove rules
  --acl-list [-t|-u VIP:port]                                    the rules with their hits, the rate limit;
                                                                 without -t|-u, every service's in brief
  --acl-load -t|-u VIP:port FILE                                 replace the list with FILE's rules, one
                                                                 `allow|deny PREFIX` a line (# comments),
                                                                 in one change
  --rate-limit N -t|-u VIP:port [--burst B] [--per-prefix LEN]   at most N new connections per second per
                                                                 source (or per /LEN network), bursts of
                                                                 B (default N); 0 removes the limit

Options:
  -S, --socket PATH   control socket (default: $SLUICE_SOCKET, else /run/sluice/sluice.sock);
                      -S without a path is ipvsadm's save
      --timeout SECS  give up after SECS seconds (default 5; fractions allowed); without
                      a number it is ipvsadm's -L --timeout
      --json          print the daemon's result as JSON instead of text
  -h, --help          print this help
  -v, --version       print the version

Exit status: 0 success, 1 request failed, 2 bad usage.
";

/// The help text, with the schedulers listed from [`SchedulerKind::ALL`] so that it
/// names every one the daemon takes.
fn usage() -> String {
    let schedulers: Vec<&str> = SchedulerKind::ALL.iter().map(|k| k.name()).collect();
    USAGE
        .replace("{SCHEDULERS}", &schedulers.join("|"))
        .replace("{DEFAULT_SCHEDULER}", SchedulerKind::DEFAULT.name())
}

/// Environment variable naming the control socket when `--socket` is not given.
const SOCKET_ENV: &str = "SLUICE_SOCKET";
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(5);
/// Longest accepted `--timeout`; anything larger is almost certainly a typo.
const MAX_TIMEOUT_SECS: f64 = 3600.0;

/// A sluicectl command, parsed from the positional arguments.
#[derive(Clone, Debug, PartialEq)]
enum Command {
    Status,
    Xstats {
        port: u16,
    },
    Zero,
    /// Recent config changes and alerts.
    Events,
    /// Health checks: state and verdict of every watched real server.
    Health,
    /// VRRP state.
    Vrrp,
    /// Session sync counters.
    Sync,
    /// The workers' neighbour tables.
    Neighbours,
    /// BGP through BIRD: sessions, VIPs, reasons.
    Cluster,
    /// `drain` (true) / `undrain` (false).
    Drain(bool),
    /// Apply the config file's services as a diff.
    Reload,
    /// `skew [-t|-u VIP:port] [--window S] [--threshold PCT]`.
    Skew {
        service: Option<String>,
        window_s: Option<u32>,
        threshold_pct: u32,
    },
    /// `capture ...`: a `capture_start` (then its status until it ends), or
    /// `capture_status` / `capture_stop`.
    Capture(Box<Request>),
    /// An ipvsadm-syntax command (`-A`, `-a`, `-L`, ...).
    Ipvsadm(ipvsadm::Command),
}

impl Command {
    /// Parses `<name> [args...]`. New commands add one arm here and one in `request`.
    fn parse(name: &str, args: &[String]) -> Result<Command, UsageError> {
        let command = match name {
            "status" => Command::Status,
            "xstats" => {
                let [port] = args else {
                    return Err(UsageError::new("xstats takes exactly one PORT_ID"));
                };
                let port = port.parse::<u16>().map_err(|_| {
                    UsageError::new(format!("xstats: PORT_ID must be 0-65535, not \"{port}\""))
                })?;
                return Ok(Command::Xstats { port });
            }
            "zero" => Command::Zero,
            "events" => Command::Events,
            "health" => Command::Health,
            "vrrp" => Command::Vrrp,
            "sync" => Command::Sync,
            "neigh" => Command::Neighbours,
            "cluster" => Command::Cluster,
            "drain" => Command::Drain(true),
            "undrain" => Command::Drain(false),
            "reload" => Command::Reload,
            "skew" => return Command::parse_skew(args),
            "capture" => return Command::parse_capture(args),
            other => return Err(UsageError::new(format!("unknown command \"{other}\""))),
        };
        match args.first() {
            Some(extra) => Err(UsageError::new(format!(
                "{name} takes no arguments (got \"{extra}\")"
            ))),
            None => Ok(command),
        }
    }

    fn parse_skew(args: &[String]) -> Result<Command, UsageError> {
        let (mut service, mut window_s, mut threshold_pct) =
            (None, None, DEFAULT_SKEW_THRESHOLD_PCT);
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let Some(v) = it.next() else {
                return Err(UsageError::new(format!("skew: {a} needs a value")));
            };
            let number = |what: &str, max: u32| {
                v.parse::<u32>()
                    .ok()
                    .filter(|n| (1..=max).contains(n))
                    .ok_or_else(|| {
                        UsageError::new(format!("skew: {what} must be 1-{max}, not \"{v}\""))
                    })
            };
            match a.as_str() {
                "-t" | "-u" => {
                    v.parse::<std::net::SocketAddrV4>()
                        .map_err(|_| UsageError::new(format!("skew: \"{v}\" is not VIP:port")))?;
                    service = Some(v.clone());
                }
                "--window" => window_s = Some(number("--window (seconds)", 60)?),
                "--threshold" => threshold_pct = number("--threshold (percent)", 100_000)?,
                other => {
                    return Err(UsageError::new(format!(
                        "skew: unknown argument \"{other}\""
                    )))
                }
            }
        }
        Ok(Command::Skew {
            service,
            window_s,
            threshold_pct,
        })
    }

    fn parse_capture(args: &[String]) -> Result<Command, UsageError> {
        use sluice::dataplane::capture::{CaptureFilter, Direction, Endpoint, MAX_SNAPLEN};
        let usage = |m: String| UsageError::new(format!("capture: {m}"));
        let mut filter = CaptureFilter::default();
        let (mut path, mut count, mut duration_ms, mut snaplen) = (None, None, None, None);
        let mut interfaces = Vec::new();
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            let (name, inline) = match arg.split_once('=') {
                Some((n, v)) if n.starts_with("--") => (n, Some(v.to_string())),
                _ => (arg.as_str(), None),
            };
            match name {
                "--status" | "--stop" if args.len() == 1 => {
                    return Ok(Command::Capture(Box::new(if name == "--stop" {
                        Request::CaptureStop
                    } else {
                        Request::CaptureStatus
                    })))
                }
                "--status" | "--stop" => {
                    return Err(usage(format!("{name} takes no other argument")))
                }
                _ => {}
            }
            let Some(v) = inline.or_else(|| it.next().cloned()) else {
                return Err(usage(format!("{name} needs a value")));
            };
            let endpoint = |v: &str| -> Result<Endpoint, UsageError> {
                if let Ok(sa) = v.parse::<std::net::SocketAddr>() {
                    return Ok(Endpoint {
                        ip: sa.ip(),
                        port: Some(sa.port()),
                    });
                }
                v.parse()
                    .map(|ip| Endpoint { ip, port: None })
                    .map_err(|_| {
                        usage(format!(
                            "{name}: \"{v}\" is not IP, IP:PORT, IPV6 or [IPV6]:PORT"
                        ))
                    })
            };
            let number = |max: u64| {
                v.parse::<u64>()
                    .ok()
                    .filter(|n| (1..=max).contains(n))
                    .ok_or_else(|| usage(format!("{name} must be 1-{max}, not \"{v}\"")))
            };
            match name {
                "-w" => path = Some(PathBuf::from(&v)),
                "-c" | "--count" => count = Some(number(u64::MAX)?),
                "--duration" => {
                    let secs = v
                        .parse::<f64>()
                        .ok()
                        .filter(|s| *s > 0.0 && *s <= 86_400.0)
                        .ok_or_else(|| {
                            usage(format!("--duration must be 0-86400 seconds, not \"{v}\""))
                        })?;
                    duration_ms = Some((secs * 1000.0).ceil() as u64);
                }
                "-s" | "--snaplen" => snaplen = Some(number(u64::from(MAX_SNAPLEN))? as u16),
                "-i" | "--interface" => interfaces.push(v),
                "--dir" => {
                    filter.direction = Some(match v.as_str() {
                        "rx" | "in" => Direction::Rx,
                        "tx" | "out" => Direction::Tx,
                        _ => return Err(usage(format!("--dir must be rx or tx, not \"{v}\""))),
                    })
                }
                "--proto" => {
                    filter.proto = Some(match v.as_str() {
                        "tcp" => 6,
                        "udp" => 17,
                        "icmp" => 1,
                        "icmp6" | "ipv6-icmp" => 58,
                        _ => v.parse::<u8>().map_err(|_| {
                            usage(format!(
                                "--proto must be tcp, udp, icmp, icmp6 or 0-255, not \"{v}\""
                            ))
                        })?,
                    })
                }
                "--port" => {
                    filter.l4_port = Some(
                        v.parse::<u16>()
                            .map_err(|_| usage(format!("--port must be 0-65535, not \"{v}\"")))?,
                    )
                }
                "--vip" | "--rs" | "--host" => {
                    let e = endpoint(&v)?;
                    if name == "--host" && e.port.is_some() {
                        return Err(usage(format!(
                            "--host takes an address, not \"{v}\" (--port, or --rs IP:PORT)"
                        )));
                    }
                    filter.endpoints.push(e);
                }
                other => return Err(usage(format!("unknown argument \"{other}\""))),
            }
        }
        filter.validate().map_err(usage)?;
        let Some(path) = path else {
            return Err(usage(
                "-w FILE is required (the pcapng file the daemon writes)".into(),
            ));
        };
        // The daemon writes the file: it needs the path as seen from anywhere.
        let path = if path.is_absolute() {
            path
        } else {
            std::env::current_dir()
                .map_err(|e| usage(format!("the current directory: {e}")))?
                .join(path)
        };
        Ok(Command::Capture(Box::new(Request::CaptureStart {
            path,
            requester: None,
            filter: Box::new(filter),
            interfaces,
            count,
            duration_ms,
            snaplen,
        })))
    }

    fn request(&self) -> Request {
        match self {
            Command::Capture(request) => (**request).clone(),
            Command::Events => Request::Events,
            Command::Health => Request::Health,
            Command::Vrrp => Request::Vrrp,
            Command::Sync => Request::Sync,
            Command::Neighbours => Request::Neighbours,
            Command::Cluster => Request::Cluster,
            Command::Drain(on) => Request::Drain { on: *on },
            Command::Reload => Request::Reload,
            Command::Skew { window_s, .. } => Request::ServiceRates {
                window_s: *window_s,
            },
            Command::Status => Request::Status,
            Command::Xstats { port } => Request::Xstats { port: *port },
            Command::Zero => Request::ZeroCounters,
            Command::Ipvsadm(c) => c.request.clone(),
        }
    }

    /// Turns the daemon's result into the text shown without `--json`: the result is
    /// read into its report type first, so a reply of another shape (a daemon of
    /// another version) is an error, not a report of blanks.
    fn render(&self, result: &RawValue) -> Result<String, Failure> {
        match self {
            Command::Status => Ok(render_status(&parse(result)?)),
            Command::Xstats { .. } => Ok(render_xstats(&parse(result)?)),
            Command::Zero => Ok("counters zeroed\n".to_string()),
            Command::Events => Ok(render_events(&parse(result)?)),
            Command::Health => Ok(render_health(&parse(result)?)),
            Command::Vrrp => Ok(render_vrrp(&parse(result)?)),
            Command::Sync => Ok(render_sync(&parse(result)?)),
            Command::Neighbours => Ok(render_neighbours(&parse(result)?)),
            Command::Cluster | Command::Drain(_) => Ok(render_cluster(&parse(result)?)),
            Command::Reload => {
                let result: serde_json::Value = parse(result)?;
                let mut text = format!(
                    "reloaded: {} change(s) applied\n",
                    result["applied"].as_u64().unwrap_or(0)
                );
                if let Some(names) = result["needs_restart"].as_array() {
                    let names: Vec<&str> = names.iter().filter_map(|n| n.as_str()).collect();
                    text += &format!("not applied, needs a restart: {}\n", names.join(", "));
                }
                Ok(text)
            }
            Command::Skew {
                service,
                threshold_pct,
                ..
            } => Ok(render_skew(
                &parse(result)?,
                service.as_deref(),
                *threshold_pct,
            )),
            Command::Capture(_) => Ok(render_capture(&parse(result)?)),
            Command::Ipvsadm(c) => match &c.output {
                ipvsadm::Output::List { .. }
                | ipvsadm::Output::Rates
                | ipvsadm::Output::Thresholds
                | ipvsadm::Output::Save => render_listing(c, parse(result)?),
                ipvsadm::Output::Timeouts => Ok(render_timeouts(&parse(result)?)),
                // `persistent_conns` renders it, with the templates it counts.
                ipvsadm::Output::PersistentConns => {
                    Err("--persistent-conn needs the connection listing too"
                        .to_string()
                        .into())
                }
                ipvsadm::Output::Connections { persistent } => {
                    Ok(render_connections(&parse(result)?, *persistent))
                }
                ipvsadm::Output::Quiet | ipvsadm::Output::Restore { .. } => Ok(String::new()),
                ipvsadm::Output::Laddrs => Ok(render_laddrs(&parse(result)?)),
                ipvsadm::Output::Admission => Ok(render_admission(&parse(result)?)),
                ipvsadm::Output::AdmissionAll => Ok(render_admission_all(&parse(result)?)),
                ipvsadm::Output::AclLoad { .. } => Ok(format!(
                    "access list replaced in one change (generation {})\n",
                    parse::<serde_json::Value>(result)?["generation"]
                        .as_u64()
                        .unwrap_or(0)
                )),
            },
        }
    }
}

/// A services listing as ipvsadm prints it: real servers sorted by address and port
/// (ipvsadm's `ipvs_sort_dests`) unless `--nosort`; with `-t|-u VIP:port` only that
/// service, without the version line (ipvsadm's `list_service` prints the title and
/// the one entry), and ipvsadm's "No such service" when there is none.
/// Where a real server's address sorts in a listing, as ipvsadm's `ipvs_cmp_dests`
/// orders them: by address as a number (an IPv6 one word by word, high first), then
/// by port; IPv4 before IPv6 (AF_INET is the smaller family).
fn address_order(ip: &str) -> (u8, u128) {
    match ip.parse::<std::net::IpAddr>() {
        Ok(std::net::IpAddr::V4(a)) => (0, u128::from(u32::from(a))),
        Ok(std::net::IpAddr::V6(a)) => (1, u128::from(a)),
        Err(_) => (2, 0),
    }
}

/// Where a service sorts in a listing, as ipvsadm's `ipvs_cmp_services` orders them:
/// by family (IPv4 first), protocol (TCP, 6, before UDP, 17), address, then port.
fn service_order(s: &ServiceStatus) -> ((u8, bool, u128), u16) {
    let (family, address) = address_order(&s.vip);
    ((family, s.proto != "tcp", address), s.port)
}

/// Whether `output` is a services listing that [`render_listing`] writes.
fn lists_services(output: &ipvsadm::Output) -> bool {
    matches!(
        output,
        ipvsadm::Output::List { .. }
            | ipvsadm::Output::Rates
            | ipvsadm::Output::Thresholds
            | ipvsadm::Output::Save
    )
}

/// The text of a services listing (`-L` with or without `--stats`, `--rate`,
/// `--thresholds`, `-S`).
fn render_listing(c: &ipvsadm::Command, report: ServicesReport) -> Result<String, Failure> {
    let exact = c.listing.exact;
    match c.output {
        ipvsadm::Output::List { stats } => {
            listed(&c.listing, report, |r| render_services(r, stats, exact))
        }
        ipvsadm::Output::Rates => listed(&c.listing, report, |r| render_rates(r, exact)),
        ipvsadm::Output::Thresholds => listed(&c.listing, report, render_thresholds),
        ipvsadm::Output::Save => listed(&c.listing, report, render_save),
        _ => Err("not a services listing".to_string().into()),
    }
}

fn listed(
    listing: &ipvsadm::Listing,
    mut report: ServicesReport,
    render: impl Fn(&ServicesReport) -> String,
) -> Result<String, Failure> {
    if !listing.nosort {
        // Each key read once: an address parsed per comparison was a tenth of a
        // 50,000-server listing.
        report.services.sort_by_cached_key(service_order);
        for s in &mut report.services {
            s.real_servers
                .sort_by_cached_key(|r| (address_order(&r.ip), r.port));
        }
    }
    let Some(only) = listing.only else {
        return Ok(render(&report));
    };
    report
        .services
        .retain(|s| is_listed(&only, &s.proto, &s.vip, s.port));
    if report.services.is_empty() {
        return Err(Failure::listing(NO_SUCH_SERVICE));
    }
    let text = render(&report);
    Ok(match text.split_once('\n') {
        Some((version, rest)) if version.starts_with("IP Virtual Server version") => {
            rest.to_string()
        }
        _ => text,
    })
}

/// Whether the service of `proto` ("tcp"), `vip` and `port` is the one `-t`/`-u`
/// names.
fn is_listed(only: &sluice::model::ServiceKey, proto: &str, vip: &str, port: u16) -> bool {
    proto == only.proto.name().to_lowercase() && vip == only.vip.to_string() && port == only.port
}

/// A listing's JSON as `-t`/`-u`/`-f` narrows it, as [`listed`] narrows the text:
/// only that service, or "No such service" (exit 1) when there is none.
fn narrowed(
    listing: &ipvsadm::Listing,
    mut result: serde_json::Value,
) -> Result<serde_json::Value, Failure> {
    let (Some(only), Some(services)) = (
        listing.only,
        result.get_mut("services").and_then(|s| s.as_array_mut()),
    ) else {
        return Ok(result);
    };
    services.retain(|s| {
        let text = |field: &str| s[field].as_str().unwrap_or_default().to_string();
        let port = s["port"].as_u64().and_then(|p| u16::try_from(p).ok());
        port.is_some_and(|port| is_listed(&only, &text("proto"), &text("vip"), port))
    });
    if services.is_empty() {
        return Err(Failure::listing(NO_SUCH_SERVICE));
    }
    Ok(result)
}

/// ipvsadm's words (libipvs `ipvs_strerror`) for the daemon's refusals.
const NO_SUCH_SERVICE: &str = "No such service";

/// The daemon's result read into the report type `T`, straight from its JSON text.
/// The error names what is wrong, not where: the text is one line of the daemon's.
fn parse<T: serde::de::DeserializeOwned>(result: &RawValue) -> Result<T, String> {
    serde_json::from_str(result.get()).map_err(|error| {
        let text = error.to_string();
        let at = format!(" at line {} column {}", error.line(), error.column());
        let what = text.strip_suffix(&at).unwrap_or(&text);
        format!("unexpected reply from daemon: {what}")
    })
}

/// Everything needed to run one command.
#[derive(Clone, Debug, PartialEq)]
struct Options {
    socket: PathBuf,
    timeout: Duration,
    json: bool,
    command: Command,
}

/// What the command line asks for.
#[derive(Clone, Debug, PartialEq)]
enum Invocation {
    Help,
    Version,
    Run(Options),
    /// `import-keepalived FILE`: no daemon involved.
    ImportKeepalived(PathBuf),
}

/// A command line that cannot be understood (exit status 2), or, called as ipvsadm,
/// one ipvsadm 1.31 refuses, with its words and exit status.
#[derive(Clone, Debug, PartialEq)]
struct UsageError(String, Option<ipvsadm_usage::Refusal>);

impl UsageError {
    fn new(message: impl Into<String>) -> UsageError {
        UsageError(message.into(), None)
    }

    fn ipvsadm(refusal: ipvsadm_usage::Refusal) -> UsageError {
        UsageError(refusal.message.trim_end().to_string(), Some(refusal))
    }
}

/// Parses the arguments after the program name. Options may appear before or after the
/// command; `--` ends option parsing. `env_socket` is `$SLUICE_SOCKET`.
#[cfg(test)]
fn parse_args(args: &[String], env_socket: Option<String>) -> Result<Invocation, UsageError> {
    parse_args_as(None, args, env_socket)
}

/// [`parse_args`]; called as ipvsadm (`ipvsadm` is the program name it was called
/// by), an ipvsadm command line is first judged as ipvsadm 1.31 judges it
/// ([`ipvsadm_usage::check_command`]), so that its refusals keep ipvsadm's words and
/// statuses. Called as sluicectl, the line is judged by ipvsadm's checks too, after
/// Sluice's own parser, and refused as bad usage (2).
fn parse_args_as(
    ipvsadm: Option<&str>,
    args: &[String],
    env_socket: Option<String>,
) -> Result<Invocation, UsageError> {
    let mut socket: Option<PathBuf> = None;
    let mut timeout = DEFAULT_TIMEOUT;
    let mut json = false;
    let mut positional: Vec<String> = Vec::new();
    // ipvsadm syntax: everything from the first ipvsadm command option on, except the
    // options above that sluicectl itself takes.
    let mut ipvsadm_args: Vec<String> = Vec::new();

    let mut args = args.iter().peekable();
    while let Some(arg) = args.next() {
        // `--name=value` is accepted for options that take a value.
        let (name, inline_value) = match arg.split_once('=') {
            Some((name, value)) if name.starts_with("--") => (name, Some(value.to_string())),
            _ => (arg.as_str(), None),
        };
        // ipvsadm's `-S` (save) takes no value; sluicectl's `-S PATH` always does, and a
        // path never starts with '-'. `--timeout` likewise: with a number it is the
        // request timeout, without one ipvsadm's `-L --timeout`; called as ipvsadm,
        // always ipvsadm's (which refuses `-A ... --timeout 5`, as ipvsadm does).
        let next_is_value = args.peek().is_some_and(|next| !next.starts_with('-'));
        let next_is_number = args.peek().is_some_and(|next| next.parse::<f64>().is_ok());
        let ipvsadm_mode = !ipvsadm_args.is_empty() || positional.is_empty();
        let ipvsadm_save = name == "-S" && inline_value.is_none() && !next_is_value;
        let ipvsadm_timeout = name == "--timeout"
            && (ipvsadm.is_some() || (inline_value.is_none() && !next_is_number));
        if ipvsadm_mode && (ipvsadm_save || ipvsadm_timeout) {
            ipvsadm_args.push(arg.clone());
            continue;
        }
        let mut value = |option: &str| -> Result<String, UsageError> {
            inline_value
                .clone()
                .or_else(|| args.next().cloned())
                .ok_or_else(|| UsageError::new(format!("{option} needs a value")))
        };
        match name {
            "-h" | "--help" => return Ok(Invocation::Help),
            "-v" | "--version" => return Ok(Invocation::Version),
            "-S" | "--socket" => {
                let path = value(name)?;
                if path.is_empty() {
                    return Err(UsageError::new(format!("{name} needs a non-empty path")));
                }
                socket = Some(PathBuf::from(path));
            }
            "--timeout" => timeout = parse_timeout(&value(name)?)?,
            "--json" if inline_value.is_none() => json = true,
            "--" => {
                positional.extend(args.by_ref().cloned());
            }
            _ if !ipvsadm_args.is_empty()
                || (positional.is_empty() && ipvsadm::is_command(name)) =>
            {
                ipvsadm_args.push(arg.clone());
            }
            // `skew` and `capture` take options of their own.
            _ if positional
                .first()
                .is_some_and(|c| c == "skew" || c == "capture") =>
            {
                positional.push(arg.clone())
            }
            _ if name.starts_with('-') && name.len() > 1 => {
                return Err(match ipvsadm {
                    Some(program) if positional.is_empty() => {
                        UsageError::ipvsadm(ipvsadm_usage::tryhelp(program))
                    }
                    _ => UsageError::new(format!("unknown option \"{arg}\"")),
                })
            }
            _ => positional.push(arg.clone()),
        }
    }

    let command = if ipvsadm_args.is_empty() {
        // As a bare ipvsadm: no command lists the table.
        let Some((name, command_args)) = positional.split_first() else {
            let list = ipvsadm::parse(&["-L".to_string()]).map_err(UsageError::new)?;
            return Ok(Invocation::Run(Options {
                socket: socket_from(socket, env_socket),
                timeout,
                json,
                command: Command::Ipvsadm(list),
            }));
        };
        if name == "import-keepalived" {
            let [path] = command_args else {
                return Err(UsageError::new("import-keepalived takes exactly one FILE"));
            };
            return Ok(Invocation::ImportKeepalived(PathBuf::from(path)));
        }
        Command::parse(name, command_args)?
    } else {
        if let Some(program) = ipvsadm {
            ipvsadm_usage::check_command(program, &ipvsadm_args).map_err(UsageError::ipvsadm)?;
        }
        let line = ipvsadm::read_words(ipvsadm_args.clone()).map_err(UsageError::new)?;
        // What ipvsadm refuses never acts, whatever the name: Sluice's parser is not
        // ipvsadm's, and one rule missed there must not let a line act. After it,
        // so its words, which name the limits, come first where both refuse.
        if ipvsadm.is_none() {
            ipvsadm_usage::check("sluicectl", &ipvsadm_args)
                .map_err(|refusal| UsageError::new(refusal.message.trim_end()))?;
        }
        match line {
            ipvsadm::RestoreLine::Apply(command) => Command::Ipvsadm(command),
            ipvsadm::RestoreLine::Unsupported(what) => {
                return Err(UsageError::new(format!("Sluice cannot honour {what}")))
            }
            ipvsadm::RestoreLine::Nothing => unreachable!("a command option was given"),
        }
    };
    Ok(Invocation::Run(Options {
        socket: socket_from(socket, env_socket),
        timeout,
        json,
        command,
    }))
}

/// `--socket`, else `$SLUICE_SOCKET`, else the default path.
fn socket_from(flag: Option<PathBuf>, env_socket: Option<String>) -> PathBuf {
    flag.or_else(|| {
        env_socket
            .filter(|path| !path.is_empty())
            .map(PathBuf::from)
    })
    .unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET_PATH))
}

fn parse_timeout(text: &str) -> Result<Duration, UsageError> {
    match text.parse::<f64>() {
        Ok(seconds) if seconds > 0.0 && seconds <= MAX_TIMEOUT_SECS => {
            Ok(Duration::from_secs_f64(seconds))
        }
        _ => Err(UsageError::new(format!(
            "--timeout must be a number of seconds above 0 and at most {MAX_TIMEOUT_SECS}, not \"{text}\""
        ))),
    }
}

/// `-R --atomic` (and `--replace`): the ipvsadm-save lines on stdin as one batch;
/// blank lines and `#` comments are skipped, every line must be a change. A line that
/// cannot be parsed or honoured ([`ipvsadm::restore_line`]) names its number and sends
/// nothing.
fn restore_batch(input: impl io::BufRead, replace: bool) -> Result<Request, String> {
    let mut requests = Vec::new();
    for (n, line) in input.lines().enumerate() {
        let line = line.map_err(|e| format!("reading stdin: {e}"))?;
        let text = line.trim();
        // What ipvsadm refuses is refused here too, however Sluice's parser reads it.
        let words = ipvsadm::restore_words(text);
        if !words.is_empty() {
            if let Err(refusal) = ipvsadm_usage::check("sluicectl", &words) {
                let why = refusal.message.trim_end();
                return Err(format!("line {}: {why}; nothing was changed", n + 1));
            }
        }
        let command =
            match ipvsadm::restore_line(text).map_err(|e| format!("line {}: {e}", n + 1))? {
                ipvsadm::RestoreLine::Nothing => continue,
                ipvsadm::RestoreLine::Apply(command) => command,
                ipvsadm::RestoreLine::Unsupported(what) => {
                    return Err(format!(
                        "line {}: Sluice cannot honour {what}; nothing was changed",
                        n + 1
                    ))
                }
            };
        let is_change = command.output == ipvsadm::Output::Quiet
            && !matches!(
                command.request,
                Request::Batch { .. } | Request::ZeroServices | Request::SetTimeouts { .. }
            );
        if !is_change {
            return Err(format!(
                "line {}: only service and real-server changes can be restored: {text}",
                n + 1
            ));
        }
        requests.push(command.request);
    }
    // An empty file (say, from a `-S` that failed) would otherwise empty the table.
    if replace && requests.is_empty() {
        return Err(
            "refusing to replace the table with nothing: the input has no commands (-C clears the table)"
                .to_string(),
        );
    }
    Ok(Request::Batch { requests, replace })
}

/// Prefixes per `acl_add` request of an `--acl-load` (a few tens of KiB of JSON).
const ACL_LOAD_CHUNK: usize = 1000;

/// `--acl-load`: `clear` (the service's list emptied) then the file's rules, one
/// `allow|deny PREFIX` a line (blank lines and `#` comments skipped), as one batch.
fn acl_load_batch(clear: Request, mut input: impl io::Read) -> Result<Request, String> {
    use sluice::service::{AclAction, Prefix};
    let Request::AclClear { service } = clear else {
        unreachable!("--acl-load parses to acl_clear");
    };
    let mut text = String::new();
    io::Read::read_to_string(&mut input, &mut text).map_err(|e| format!("reading: {e}"))?;
    let rules = sluice::service::acl::parse_rules(&text)
        .map_err(|(line, e)| format!("line {line}: {e}"))?;
    let mut requests = vec![Request::AclClear { service }];
    for action in [AclAction::Allow, AclAction::Deny] {
        let prefixes: Vec<Prefix> = rules
            .iter()
            .filter(|(a, _)| *a == action)
            .map(|(_, p)| *p)
            .collect();
        for chunk in prefixes.chunks(ACL_LOAD_CHUNK) {
            requests.push(Request::AclAdd {
                service,
                action,
                prefixes: chunk.to_vec(),
            });
        }
    }
    Ok(Request::Batch {
        requests,
        replace: false,
    })
}

/// The bytes of one `batch_part` line a restore fills before starting the next: well
/// under the daemon's request line limit.
const BATCH_PART_BYTES: usize = MAX_REQUEST_BYTES / 2;

/// How long the daemon may take to apply a whole restore (100k services: about a
/// second); the request timeout still bounds every other step.
const COMMIT_TIMEOUT: Duration = Duration::from_secs(60);

/// Sends a batch of any size on one connection: `batch_begin`, as many `batch_part`
/// lines as it takes, then `batch_commit`, which the daemon applies as one change.
/// Nothing changes unless the commit succeeds.
fn send_batch(options: &Options, batch: Request) -> Result<serde_json::Value, String> {
    let Request::Batch { requests, replace } = batch else {
        unreachable!("restore_batch builds a batch");
    };
    let text = |error: client::ClientError| error.to_string();
    let mut connection =
        client::Connection::open(&options.socket, options.timeout).map_err(text)?;
    connection
        .call(&Request::BatchBegin { replace })
        .map_err(text)?;
    let mut part: Vec<Request> = Vec::new();
    let mut part_bytes = 0;
    for request in requests {
        let size = serde_json::to_string(&request).map_or(0, |line| line.len() + 1);
        if !part.is_empty() && part_bytes + size > BATCH_PART_BYTES {
            let requests = std::mem::take(&mut part);
            connection
                .call(&Request::BatchPart { requests })
                .map_err(text)?;
            part_bytes = 0;
        }
        part_bytes += size;
        part.push(request);
    }
    if !part.is_empty() {
        connection
            .call(&Request::BatchPart { requests: part })
            .map_err(text)?;
    }
    connection.set_timeout(options.timeout.max(COMMIT_TIMEOUT));
    connection.call(&Request::BatchCommit).map_err(text)
}

/// Why a command failed, and so which exit status it gets.
#[derive(Debug, PartialEq)]
struct Failure {
    message: String,
    kind: FailureKind,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FailureKind {
    /// No daemon to talk to (ipvsadm: "Can't initialize ipvs", exit 2).
    Unreachable,
    /// The daemon refused the change (ipvsadm: the kernel refused it, exit 255).
    Refused,
    /// `-L -t` of a service that does not exist (ipvsadm's `list_service`, exit 1).
    Listing,
    /// A restore line that does not parse: ipvsadm's exit status for it (2, or 255
    /// for a line whose first word is not a command).
    Usage(u8),
    /// Anything else (a reply of the wrong shape, a file that cannot be read).
    Other,
}

impl Failure {
    fn listing(message: &str) -> Failure {
        Failure {
            message: message.to_string(),
            kind: FailureKind::Listing,
        }
    }

    /// The exit status: sluicectl's (1 for every failed request) or, called as
    /// ipvsadm, ipvsadm 1.31's (`fail(2, ...)` for what it cannot parse or reach,
    /// `return -1` from `main` when the kernel refuses, `exit(1)` from `list_service`).
    fn status(&self, ipvsadm_mode: bool) -> u8 {
        match (ipvsadm_mode, self.kind) {
            (_, FailureKind::Usage(status)) => status,
            (false, _) | (true, FailureKind::Listing | FailureKind::Other) => 1,
            (true, FailureKind::Unreachable) => 2,
            (true, FailureKind::Refused) => 255,
        }
    }
}

impl From<client::ClientError> for Failure {
    fn from(error: client::ClientError) -> Failure {
        let kind = match error {
            client::ClientError::Daemon(_) => FailureKind::Refused,
            _ => FailureKind::Unreachable,
        };
        Failure {
            message: error.to_string(),
            kind,
        }
    }
}

impl From<String> for Failure {
    fn from(message: String) -> Failure {
        Failure {
            message,
            kind: FailureKind::Other,
        }
    }
}

/// ipvsadm's words (libipvs `ipvs_strerror`) for the daemon's refusal of `request`,
/// when the refusal is one ipvsadm has words for; other refusals keep Sluice's
/// message, which says what Sluice cannot do.
fn ipvsadm_words(request: &Request, message: &str) -> String {
    use sluice::service::ServiceError;
    let no_such_service = |service| message == ServiceError::NoSuchService(service).to_string();
    let words = match *request {
        Request::AddService { service, .. }
            if message == ServiceError::ServiceExists(service).to_string() =>
        {
            "Service already exists"
        }
        Request::EditService { service, .. }
        | Request::DeleteService { service }
        | Request::ZeroService { service }
            if no_such_service(service) =>
        {
            NO_SUCH_SERVICE
        }
        Request::AddServer { service, .. }
        | Request::EditServer { service, .. }
        | Request::DeleteServer { service, .. }
            if no_such_service(service) =>
        {
            "Service not defined"
        }
        Request::AddServer { service, server }
            if message
                == (ServiceError::DestinationExists {
                    service,
                    ip: server.ip,
                    port: server.port,
                })
                .to_string() =>
        {
            "Destination already exists"
        }
        Request::EditServer { service, server }
            if message
                == (ServiceError::NoSuchDestination {
                    service,
                    ip: server.ip,
                    port: server.port,
                })
                .to_string() =>
        {
            "No such destination"
        }
        Request::DeleteServer { service, ip, port }
            if message == (ServiceError::NoSuchDestination { service, ip, port }).to_string() =>
        {
            "No such destination"
        }
        _ => return message.to_string(),
    };
    words.to_string()
}

/// Pages of `-Lnc`: sessions asked for at a time, each page one bounded reply.
const CONNECTIONS_PAGE: u32 = 50_000;

/// `-Lnc`: the sessions page by page, each page written out as it arrives, so a
/// listing of any size needs neither a cap nor memory for all of it. With `--json`
/// the same object a single reply gives (`{"connections":[...],"truncated":false}`),
/// written as it comes.
fn list_connections(
    options: &Options,
    persistent: bool,
    out: &mut impl Write,
) -> Result<(), Failure> {
    let mut connection = client::Connection::open(&options.socket, options.timeout)?;
    let mut page = Some(ConnectionsCursor::default());
    let mut first = true;
    let write_error = |e: io::Error| Failure::from(format!("cannot write output: {e}"));
    if options.json {
        out.write_all(b"{\"connections\":[").map_err(write_error)?;
    } else {
        out.write_all(connections_title(persistent).as_bytes())
            .map_err(write_error)?;
    }
    while let Some(cursor) = page {
        let result = connection.call_raw(&Request::ListConnections {
            max: Some(CONNECTIONS_PAGE),
            page: Some(cursor),
        })?;
        let report: ConnectionsReport = parse(&result)?;
        let mut text = String::new();
        for c in &report.connections {
            if options.json {
                if !first {
                    text.push(',');
                }
                text += &serde_json::to_string(c).map_err(|e| e.to_string())?;
            } else {
                text += &connection_line(c);
            }
            first = false;
        }
        out.write_all(text.as_bytes()).map_err(write_error)?;
        page = report.next;
    }
    if options.json {
        out.write_all(b"],\"truncated\":false}\n")
            .map_err(write_error)?;
    }
    Ok(())
}

/// What a line-by-line `-R` did.
#[derive(Debug, Default, PartialEq)]
struct Restored {
    applied: usize,
    /// What was said of every line not applied.
    refused: Vec<String>,
    /// Whether the last line that was a command was not applied: ipvsadm's `-R`
    /// exits with that line's status alone.
    last_refused: bool,
}

/// Consecutive restore lines sent as one [`Request::ApplyEach`]: each line stands or
/// falls on its own as ipvsadm applies it, and the daemon publishes one snapshot for
/// them all. At most this many lines and [`BATCH_PART_BYTES`] of requests, so the
/// request fits a request line and each answer comes well within its time.
const RESTORE_CHUNK: usize = 1000;

/// What an [`Request::ApplyEach`] answer says of each of its `count` commands: `None`
/// applied, `Some(words)` refused with the daemon's words.
fn each_answer(answer: &serde_json::Value, count: usize) -> Result<Vec<Option<String>>, Failure> {
    let malformed = || {
        Failure::from(format!(
            "the daemon's answer to a restore is malformed: {answer}"
        ))
    };
    let mut each = vec![None; count];
    let refused = answer
        .get("refused")
        .and_then(serde_json::Value::as_array)
        .ok_or_else(malformed)?;
    for refusal in refused {
        let command = refusal.get("command").and_then(serde_json::Value::as_u64);
        let error = refusal.get("error").and_then(serde_json::Value::as_str);
        match (command, error) {
            (Some(i), Some(error)) if (1..=count as u64).contains(&i) => {
                each[i as usize - 1] = Some(error.to_string());
            }
            _ => return Err(malformed()),
        }
    }
    Ok(each)
}

/// `-R` as ipvsadm does it: line by line, in order, carrying on past a line the
/// daemon refuses or that names what Sluice cannot do. A line ipvsadm cannot parse
/// either ends the restore there, as ipvsadm's `fail(2, ...)` does, after the lines
/// before it were applied; so does a `-R` line. A listing (`-L`, `-S`) is printed in
/// its place.
///
/// `ipvsadm_program` is the name ipvsadm mode was called by (its `argv[0]`): then
/// a line the daemon refuses is reported in ipvsadm's words alone, as ipvsadm's
/// `process_options` prints them, without Sluice's line number.
fn restore_lines(
    options: &Options,
    input: impl io::BufRead,
    ipvsadm_program: Option<&str>,
    report: &mut dyn FnMut(&str),
) -> Result<Restored, Failure> {
    let ipvsadm_mode = ipvsadm_program.is_some();
    // ipvsadm's words come without Sluice's line number.
    let numbered = |n: usize, message: String| match ipvsadm_program {
        Some(_) => message,
        None => format!("line {n}: {message}"),
    };
    let mut connection = client::Connection::open(&options.socket, options.timeout)?;
    // A chunk of a large table can take the daemon seconds (it has 60 s for it).
    connection.set_timeout(options.timeout.max(COMMIT_TIMEOUT));
    let mut done = Restored::default();
    let mut pending: Vec<(usize, Request)> = Vec::new();
    let mut flush = |pending: &mut Vec<(usize, Request)>,
                     done: &mut Restored,
                     report: &mut dyn FnMut(&str)|
     -> Result<(), Failure> {
        if pending.is_empty() {
            return Ok(());
        }
        let lines = std::mem::take(pending);
        let each = match connection.call(&Request::ApplyEach {
            requests: lines.iter().map(|(_, r)| r.clone()).collect(),
        }) {
            Ok(answer) => each_answer(&answer, lines.len())?,
            // A daemon older than `apply_each`: one request (and snapshot) per line.
            Err(client::ClientError::Daemon(message))
                if message.starts_with("unknown command \"apply_each\"") =>
            {
                let mut each = Vec::with_capacity(lines.len());
                for (_, request) in &lines {
                    each.push(match connection.call(request) {
                        Ok(_) => None,
                        Err(client::ClientError::Daemon(message)) => Some(message),
                        Err(other) => return Err(other.into()),
                    });
                }
                each
            }
            Err(other) => return Err(other.into()),
        };
        for ((n, request), refusal) in lines.iter().zip(each) {
            match refusal {
                None => {
                    done.applied += 1;
                    done.last_refused = false;
                }
                Some(message) => {
                    let line = if ipvsadm_mode {
                        ipvsadm_words(request, &message)
                    } else {
                        format!("line {n}: {message}")
                    };
                    report(&line);
                    done.refused.push(line);
                    done.last_refused = true;
                }
            }
        }
        Ok(())
    };
    let mut pending_bytes = 0;
    for (i, line) in input.lines().enumerate() {
        let n = i + 1;
        if pending.is_empty() {
            pending_bytes = 0;
        }
        let line = line.map_err(|e| format!("reading stdin: {e}"))?;
        // ipvsadm reads each line with its own option parser and stops at the first
        // it refuses, with that parser's words and no line number, after applying
        // the lines before. As sluicectl too (a line ipvsadm refuses must never act,
        // however Sluice's own parser would read it), with the line's number.
        let words = ipvsadm::restore_words(&line);
        if !words.is_empty() {
            let program = ipvsadm_program.unwrap_or("sluicectl");
            if let Err(refusal) = ipvsadm_usage::check(program, &words) {
                flush(&mut pending, &mut done, report)?;
                let message = match ipvsadm_program {
                    Some(_) => refusal.message,
                    None => format!("line {n}: {}", refusal.message),
                };
                return Err(Failure {
                    message,
                    kind: FailureKind::Usage(refusal.status),
                });
            }
        }
        let command = match ipvsadm::restore_line(&line) {
            Ok(ipvsadm::RestoreLine::Nothing) => continue,
            Ok(ipvsadm::RestoreLine::Unsupported(what)) => {
                // The lines before are applied first, so the messages come in order.
                flush(&mut pending, &mut done, report)?;
                let line = format!("line {n}: not applied: Sluice cannot honour {what}");
                report(&line);
                done.refused.push(line);
                done.last_refused = true;
                continue;
            }
            Ok(ipvsadm::RestoreLine::Apply(command)) => command,
            Err(error) => {
                flush(&mut pending, &mut done, report)?;
                return Err(Failure {
                    message: format!("line {n}: {error}"),
                    kind: FailureKind::Usage(2),
                });
            }
        };
        // A line that is no change is carried out where it stands, as ipvsadm's
        // `process_options` carries out each line: `-L` and `-S` print (on stdout,
        // after the lines before are applied) and count as done; `-R` ends the
        // restore as `restore_table` ends it (`tryhelp_exit(argv[0], -1)`: 255),
        // and a listing that fails ends it as `list_service`'s `exit(1)` does.
        match command.output {
            ipvsadm::Output::Quiet => {}
            // Sluice's own change from a file (relative to wherever the restore
            // runs) is no line ipvsadm has: not carried out from a restore.
            ipvsadm::Output::AclLoad { .. } => {
                let line = format!(
                    "line {n}: not applied: --acl-load reads a file; run it on its own: {}",
                    line.trim()
                );
                report(&line);
                done.refused.push(line);
                done.last_refused = true;
                continue;
            }
            ipvsadm::Output::Restore { .. } => {
                flush(&mut pending, &mut done, report)?;
                let refusal = ipvsadm_usage::tryhelp(ipvsadm_program.unwrap_or("sluicectl"));
                return Err(Failure {
                    message: numbered(n, refusal.message),
                    kind: FailureKind::Usage(refusal.status),
                });
            }
            _ => {
                flush(&mut pending, &mut done, report)?;
                let here = Options {
                    command: Command::Ipvsadm(command),
                    ..options.clone()
                };
                let text = run(&here, ipvsadm_mode).map_err(|failure| Failure {
                    message: numbered(n, failure.message),
                    ..failure
                })?;
                let mut out = io::stdout().lock();
                out.write_all(text.as_bytes())
                    .and_then(|()| out.flush())
                    .map_err(|e| format!("cannot write output: {e}"))?;
                done.applied += 1;
                done.last_refused = false;
                continue;
            }
        }
        pending_bytes += serde_json::to_string(&command.request).map_or(0, |l| l.len() + 1);
        pending.push((n, command.request));
        if pending.len() >= RESTORE_CHUNK || pending_bytes >= BATCH_PART_BYTES {
            flush(&mut pending, &mut done, report)?;
        }
    }
    flush(&mut pending, &mut done, report)?;
    Ok(done)
}

/// Set by SIGINT while `capture` waits: the capture is stopped, its file complete.
static INTERRUPTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    INTERRUPTED.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// `capture -w ...`: starts the capture, then asks for its status every 100 ms until
/// it ends (count or duration reached), or stops it on Ctrl-C; returns the final
/// report.
fn run_capture(options: &Options, start: &Request) -> Result<serde_json::Value, Failure> {
    let Request::CaptureStart { duration_ms, .. } = start else {
        unreachable!("run_capture is given capture_start");
    };
    // SAFETY: installs an async-signal-safe handler (one atomic store) for SIGINT;
    // no other code of this process handles SIGINT.
    unsafe { libc::signal(libc::SIGINT, on_sigint as *const () as libc::sighandler_t) };
    let mut report = client::request(&options.socket, start, options.timeout)?;
    // A duration ends the capture in the daemon; past it (and a margin) ask it to.
    let give_up = duration_ms
        .map(|ms| std::time::Instant::now() + Duration::from_millis(ms) + Duration::from_secs(5));
    while report["running"] == true {
        let late = give_up.is_some_and(|at| std::time::Instant::now() >= at);
        let request = if INTERRUPTED.load(std::sync::atomic::Ordering::Relaxed) || late {
            Request::CaptureStop
        } else {
            std::thread::sleep(Duration::from_millis(100));
            Request::CaptureStatus
        };
        report = client::request(&options.socket, &request, options.timeout)?;
    }
    Ok(report)
}

fn render_capture(r: &sluice::control::report::CaptureReport) -> String {
    if r.path.is_empty() {
        return "no capture has run\n".to_string();
    }
    let state = match (&r.ended, r.running) {
        (_, true) => "running".to_string(),
        (Some(why), false) => format!("ended: {why}"),
        (None, false) => "ended".to_string(),
    };
    format!(
        "{} packets written to {} ({state}); {} copies dropped (copy rings full)\n",
        r.written, r.path, r.dropped
    )
}

/// Sends the request and produces the text to print.
/// `-L --persistent-conn`: the services, and per real server the persistence
/// templates that point at it, counted from the connection listing's templates (no
/// worker, as IPVS lists them among the connections), page by page.
fn persistent_conns(options: &Options, listing: &ipvsadm::Listing) -> Result<String, Failure> {
    let mut connection = client::Connection::open(&options.socket, options.timeout)?;
    let services = connection.call_raw(&Request::ListServices)?;
    if options.json {
        let services = narrowed(listing, parse(&services)?)?;
        let mut text =
            serde_json::to_string_pretty(&services).map_err(|error| error.to_string())?;
        text.push('\n');
        return Ok(text);
    }
    let mut templates: std::collections::HashMap<(String, String, String), u64> =
        std::collections::HashMap::new();
    let mut page = Some(ConnectionsCursor::default());
    while let Some(cursor) = page {
        let result = connection.call_raw(&Request::ListConnections {
            max: Some(CONNECTIONS_PAGE),
            page: Some(cursor),
        })?;
        let report: ConnectionsReport = parse(&result)?;
        for c in report
            .connections
            .into_iter()
            .filter(|c| c.worker.is_none())
        {
            *templates
                .entry((c.proto, c.virtual_service, c.destination))
                .or_default() += 1;
        }
        page = report.next;
    }
    listed(listing, parse(&services)?, |report| {
        render_persistent_conns(report, &|s, r| {
            // As the connection listing writes them: `[address]:port` for IPv6.
            let key = (
                s.proto.clone(),
                sluice::control::render::endpoint(&s.vip, s.port),
                sluice::control::render::endpoint(&r.ip, r.port),
            );
            templates.get(&key).copied().unwrap_or(0)
        })
    })
}

fn run(options: &Options, ipvsadm_mode: bool) -> Result<String, Failure> {
    let result = match &options.command {
        Command::Capture(start) if matches!(**start, Request::CaptureStart { .. }) => {
            raw(&run_capture(options, start)?)?
        }
        Command::Ipvsadm(ipvsadm::Command {
            output: ipvsadm::Output::PersistentConns,
            listing,
            ..
        }) => return persistent_conns(options, listing),
        Command::Ipvsadm(ipvsadm::Command {
            output: ipvsadm::Output::Connections { persistent },
            ..
        }) => {
            let stdout = io::stdout();
            let mut out = io::BufWriter::new(stdout.lock());
            match list_connections(options, *persistent, &mut out).and_then(|()| {
                out.flush()
                    .map_err(|e| Failure::from(format!("cannot write output: {e}")))
            }) {
                Ok(()) => return Ok(String::new()),
                // The reader went away (`sluicectl -Lnc | head`).
                Err(f) if f.message.contains("Broken pipe") => return Ok(String::new()),
                Err(f) => return Err(f),
            }
        }
        Command::Ipvsadm(ipvsadm::Command {
            output: ipvsadm::Output::Restore { atomic: false, .. },
            ..
        }) => {
            // ipvsadm names itself in a refused line's usage text by its own argv[0].
            let program = std::env::args().next().filter(|_| ipvsadm_mode);
            let done = restore_lines(
                options,
                io::stdin().lock(),
                program.as_deref(),
                &mut |line| report_error(line, ipvsadm_mode),
            )?;
            if ipvsadm_mode {
                // ipvsadm's restore_table returns the last command's result alone; each
                // refusal was printed as it came.
                return match done.last_refused {
                    false => Ok(String::new()),
                    true => Err(Failure {
                        message: String::new(),
                        kind: FailureKind::Refused,
                    }),
                };
            }
            if done.refused.is_empty() {
                return Ok(String::new());
            }
            return Err(Failure {
                message: format!(
                    "{} line(s) not applied, {} applied",
                    done.refused.len(),
                    done.applied
                ),
                kind: FailureKind::Refused,
            });
        }
        Command::Ipvsadm(ipvsadm::Command {
            output: ipvsadm::Output::Restore { replace, .. },
            ..
        }) => raw(&send_batch(
            options,
            restore_batch(io::stdin().lock(), *replace)?,
        )?)?,
        Command::Ipvsadm(ipvsadm::Command {
            output: ipvsadm::Output::AclLoad { path },
            request,
            ..
        }) => {
            let file = std::fs::File::open(path).map_err(|e| format!("{path}: {e}"))?;
            let batch =
                acl_load_batch(request.clone(), file).map_err(|e| format!("{path}: {e}"))?;
            raw(&send_batch(options, batch)?)?
        }
        command => {
            let request = command.request();
            match client::request_raw(&options.socket, &request, options.timeout) {
                Ok(result) => result,
                Err(client::ClientError::Daemon(message)) if ipvsadm_mode => {
                    return Err(Failure {
                        message: ipvsadm_words(&request, &message),
                        kind: FailureKind::Refused,
                    })
                }
                Err(error) => return Err(error.into()),
            }
        }
    };
    if options.json {
        let result: serde_json::Value = parse(&result)?;
        let result = match &options.command {
            Command::Ipvsadm(c) => narrowed(&c.listing, result)?,
            _ => result,
        };
        let mut text = serde_json::to_string_pretty(&result).map_err(|error| error.to_string())?;
        text.push('\n');
        return Ok(text);
    }
    match &options.command {
        Command::Ipvsadm(c) if lists_services(&c.output) => {
            // Read once, for the note and the table.
            let report: ServicesReport = parse(&result)?;
            let evicted = (!ipvsadm_mode).then(|| evicted_note(c, &report)).flatten();
            let text = render_listing(c, report)?;
            if let Some(note) = evicted {
                report_error(&note, false);
            }
            Ok(text)
        }
        command => command.render(&result),
    }
}

/// A result the client built itself, as the JSON text a reply carries.
fn raw(result: &serde_json::Value) -> Result<Box<RawValue>, String> {
    serde_json::value::to_raw_value(result).map_err(|error| error.to_string())
}

/// For a service listing (`-L -n`, `--stats`, `--rate`), the real servers health
/// checking has evicted, as one line for stderr. ipvsadm's layout has no column for
/// it and keeps each server's configured weight, so the table alone reads "all
/// well" where keepalived would have taken the server out; the note, on stderr,
/// leaves the pipelines that read stdout as they are. Called as ipvsadm: nothing.
fn evicted_note(c: &ipvsadm::Command, report: &ServicesReport) -> Option<String> {
    if !matches!(
        c.output,
        ipvsadm::Output::List { .. } | ipvsadm::Output::Rates
    ) {
        return None;
    }
    let shown = |s: &ServiceStatus| {
        (c.listing.only).is_none_or(|only| is_listed(&only, &s.proto, &s.vip, s.port))
    };
    let evicted: Vec<String> = (report.services.iter().filter(|s| shown(s)))
        .flat_map(|s| {
            let service = sluice::control::render::endpoint(&s.vip, s.port);
            (s.real_servers.iter().filter(|r| r.evicted)).map(move |r| {
                let server = sluice::control::render::endpoint(&r.ip, r.port);
                format!("{} {service} -> {server}", s.proto.to_uppercase())
            })
        })
        .collect();
    (!evicted.is_empty()).then(|| {
        format!(
            "note: {} real server(s) evicted by health checking take no new connections \
             (listed with their configured weight): {}; see `sluicectl health`",
            evicted.len(),
            evicted.join(", ")
        )
    })
}

/// Prints the message as exactly one line: `sluicectl: <message>`, or, called as
/// ipvsadm, the bare message as ipvsadm prints its errors.
fn report_error(message: &str, ipvsadm_mode: bool) {
    let flattened: Vec<&str> = message
        .split(['\n', '\r'])
        .filter(|s| !s.is_empty())
        .collect();
    if ipvsadm_mode {
        eprintln!("{}", flattened.join(" "));
    } else {
        eprintln!("sluicectl: {}", flattened.join(" "));
    }
}

fn print(text: &str) -> ExitCode {
    match io::stdout().lock().write_all(text.as_bytes()) {
        Ok(()) => ExitCode::SUCCESS,
        // The reader went away (`sluicectl status | head`): nothing left to tell it.
        Err(error) if error.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(error) => {
            report_error(&format!("cannot write output: {error}"), false);
            ExitCode::FAILURE
        }
    }
}

/// `import-keepalived FILE`: the TOML on stdout, each statement that could not be
/// translated on stderr as `FILE:LINE: statement: why`. Exit 0 with a result (even
/// with statements left out), 1 when the file cannot be read or is not keepalived's
/// syntax.
fn import_keepalived(path: &std::path::Path) -> ExitCode {
    let shown = path.display().to_string();
    let text = match std::fs::read(path) {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(error) => {
            report_error(&format!("{shown}: {error}"), false);
            return ExitCode::FAILURE;
        }
    };
    match sluice::config::keepalived::import(&text, &shown) {
        Ok(import) => {
            for (line, what) in &import.untranslated {
                eprintln!("{shown}:{line}: {what}");
            }
            print(&import.toml)
        }
        Err(error) => {
            report_error(&format!("{shown}: {error}"), false);
            ExitCode::FAILURE
        }
    }
}

/// Called as `ipvsadm` (the link `scripts/setup.sh --ipvsadm-link` installs):
/// ipvsadm's exit statuses and words.
fn is_ipvsadm_name(program: &str) -> bool {
    std::path::Path::new(program)
        .file_name()
        .is_some_and(|name| name == "ipvsadm")
}

/// `-v` as ipvsadm prints it (`version()`: `"ipvsadm " IPVSADM_VERSION " (compiled
/// with " IPVS_OPTION_PROCESSING " and IPVS v%d.%d.%d)\n"`), with sluicectl where
/// ipvsadm names its option parser, so the fields scripts read stay in place.
fn ipvsadm_version() -> String {
    format!(
        "ipvsadm v1.31 2019/12/24 (compiled with sluicectl {} and IPVS v1.2.1)\n",
        env!("CARGO_PKG_VERSION")
    )
}

fn main() -> ExitCode {
    let mut argv = std::env::args();
    let program = argv.next().filter(|program| is_ipvsadm_name(program));
    let ipvsadm_mode = program.is_some();
    let args: Vec<String> = argv.collect();
    match parse_args_as(program.as_deref(), &args, std::env::var(SOCKET_ENV).ok()) {
        Ok(Invocation::Help) => match program.as_deref() {
            Some(program) => print(&ipvsadm_usage::help(program, &ipvsadm_version())),
            None => print(&usage()),
        },
        Ok(Invocation::Version) if ipvsadm_mode => print(&ipvsadm_version()),
        Ok(Invocation::Version) => print(&format!("sluicectl {}\n", env!("CARGO_PKG_VERSION"))),
        Ok(Invocation::ImportKeepalived(path)) => import_keepalived(&path),
        Ok(Invocation::Run(options)) => match run(&options, ipvsadm_mode) {
            Ok(text) => print(&text),
            Err(failure) => {
                let message = match failure.kind {
                    FailureKind::Unreachable if ipvsadm_mode => {
                        format!("Can't initialize ipvs: {}", failure.message)
                    }
                    _ => failure.message.clone(),
                };
                if !message.is_empty() {
                    report_error(&message, ipvsadm_mode);
                }
                ExitCode::from(failure.status(ipvsadm_mode))
            }
        },
        Err(UsageError(_, Some(refusal))) => {
            // As ipvsadm prints it: its text, newlines included.
            eprint!("{}", refusal.message);
            ExitCode::from(refusal.status)
        }
        Err(UsageError(message, None)) if ipvsadm_mode => {
            report_error(&message, true);
            ExitCode::from(2)
        }
        Err(UsageError(message, None)) => {
            report_error(&format!("{message} (see sluicectl --help)"), false);
            ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn parse(args: &[&str]) -> Result<Invocation, UsageError> {
        let args: Vec<String> = args.iter().map(|arg| arg.to_string()).collect();
        parse_args(&args, None)
    }

    fn options(args: &[&str]) -> Options {
        match parse(args) {
            Ok(Invocation::Run(options)) => options,
            other => panic!("expected a command, got {other:?}"),
        }
    }

    fn usage_error(args: &[&str]) -> String {
        parse(args).expect_err("expected a usage error").0
    }

    /// IPv6 real servers sort by address, then port, as IPv4 ones (they sorted by
    /// port alone).
    #[test]
    fn real_servers_sort_by_address_then_port_in_both_families() {
        let mut ips = vec![
            ("2001:db8::10", 80),
            ("2001:db8::2", 8080),
            ("198.18.0.20", 80),
            ("2001:db8::2", 80),
            ("fe80::1", 1),
            ("198.18.0.3", 443),
        ];
        ips.sort_by_key(|(ip, port)| (address_order(ip), *port));
        assert_eq!(
            ips,
            [
                ("198.18.0.3", 443),
                ("198.18.0.20", 80),
                ("2001:db8::2", 80),
                ("2001:db8::2", 8080),
                ("2001:db8::10", 80),
                ("fe80::1", 1),
            ]
        );
    }

    /// Services sort by family first, then protocol, address and port: all IPv4
    /// services before the IPv6 ones, as ipvsadm lists them.
    #[test]
    fn services_sort_by_family_protocol_address_and_port() {
        let service = |proto: &str, vip: &str, port: u16| ServiceStatus {
            proto: proto.into(),
            vip: vip.into(),
            port,
            ..Default::default()
        };
        let mut list = [
            service("udp", "2001:db8::1", 53),
            service("tcp", "2001:db8::1", 80),
            service("udp", "198.18.1.1", 53),
            service("tcp", "198.18.1.20", 80),
            service("tcp", "198.18.1.3", 443),
            service("tcp", "198.18.1.3", 80),
        ];
        list.sort_by_key(service_order);
        let order: Vec<(&str, &str, u16)> = list
            .iter()
            .map(|s| (s.proto.as_str(), s.vip.as_str(), s.port))
            .collect();
        assert_eq!(
            order,
            [
                ("tcp", "198.18.1.3", 80),
                ("tcp", "198.18.1.3", 443),
                ("tcp", "198.18.1.20", 80),
                ("udp", "198.18.1.1", 53),
                ("tcp", "2001:db8::1", 80),
                ("udp", "2001:db8::1", 53),
            ]
        );
    }

    /// What an operator's script hands ipvsadm on its command line is read as `-R`
    /// reads it: `--tun-type ipip` (written by ipvsadm 1.31's `-S` on every `-i`
    /// line) and `-b flag-N` on `-A`/`-E` are taken, and what Sluice cannot do is named, also when
    /// called as ipvsadm (not ipvsadm's "Try `ipvsadm -h'", which says the syntax is
    /// wrong).
    #[test]
    fn the_command_line_takes_what_restore_takes_and_names_the_rest() {
        let as_ipvsadm = |args: &[&str]| {
            let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
            parse_args_as(Some("ipvsadm"), &args, None)
        };
        let command = |args: &[&str]| match as_ipvsadm(args) {
            Ok(Invocation::Run(options)) => options.command,
            other => panic!("{args:?}: expected a command, got {other:?}"),
        };
        let refusal = |args: &[&str]| match as_ipvsadm(args) {
            Err(e) => e.0,
            other => panic!("{args:?}: expected a refusal, got {other:?}"),
        };
        // Separate and attached values alike.
        let tunnel = ["-a", "-t", "198.18.1.1:80", "-r", "198.18.0.5:80", "-i"];
        for tun_type in [&["--tun-type", "ipip"][..], &["--tun-type=ipip"]] {
            assert_eq!(
                command(&[&tunnel[..], tun_type].concat()),
                command(&tunnel),
                "{tun_type:?}"
            );
        }
        assert_eq!(
            command(&["-A", "-t", "198.18.1.1:80", "-s", "rr", "-b", "flag-1"]),
            command(&["-A", "-t", "198.18.1.1:80", "-s", "rr"]),
        );
        assert_eq!(
            command(&[
                "-A",
                "-t",
                "198.18.1.1:80",
                "-s",
                "sh",
                "-b",
                "flag-2,flag-3"
            ]),
            command(&["-A", "-t", "198.18.1.1:80", "-s", "sh", "-b", "sh-port"]),
        );
        for (args, named) in [
            (
                &["--start-daemon", "master"][..],
                "--start-daemon: IPVS's connection sync daemon",
            ),
            (
                &["--stop-daemon", "backup"][..],
                "--stop-daemon: IPVS's connection sync daemon",
            ),
            (
                &[
                    "-a",
                    "-t",
                    "198.18.1.1:80",
                    "-r",
                    "198.18.0.5",
                    "-i",
                    "--tun-type",
                    "gue",
                    "--tun-port",
                    "6080",
                ][..],
                "--tun-type gue: Sluice tunnels with IP-in-IP only",
            ),
            (
                &["-A", "-f", "100", "-s", "rr"][..],
                "-f 100: fwmark services",
            ),
            (&["-A", "-f100", "-s", "rr"][..], "-f 100: fwmark services"),
        ] {
            let message = refusal(args);
            assert!(
                message.starts_with(&format!("Sluice cannot honour {named}")),
                "{args:?}: {message}"
            );
        }
        // `--timeout` is ipvsadm's, which only `-L` takes: not the request timeout.
        for timeout in [&["--timeout", "5"][..], &["--timeout=5"]] {
            let args = [&["-A", "-t", "198.18.1.1:80"][..], timeout].concat();
            assert!(
                matches!(as_ipvsadm(&args), Err(UsageError(_, Some(_)))),
                "{args:?}"
            );
        }
        let list_timeout = ["-L", "--timeout"].map(String::from);
        assert_eq!(
            command(&["-L", "--timeout"]),
            Command::Ipvsadm(ipvsadm::parse(&list_timeout).unwrap())
        );
    }

    #[test]
    fn ipvsadm_save_and_timeout_flags_do_not_clash_with_sluicectl_options() {
        let request = |args: &[&str]| options(args).command.request();
        assert_eq!(request(&["-S"]), Request::SaveServices);
        assert_eq!(
            options(&["-S", "-n"]).command,
            Command::Ipvsadm(ipvsadm::parse(&["-S".to_string()]).unwrap())
        );
        let o = options(&["-S", "/x.sock", "-L", "-n"]);
        assert_eq!(
            (o.socket.to_str(), o.command.request()),
            (Some("/x.sock"), Request::ListServices)
        );
        assert_eq!(request(&["-L", "--timeout"]), Request::GetTimeouts);
        let o = options(&["--timeout", "2", "-L", "-n"]);
        assert_eq!(
            (o.timeout, o.command.request()),
            (Duration::from_secs(2), Request::ListServices)
        );
        assert_eq!(
            request(&["--set", "60", "0", "30"]),
            Request::SetTimeouts {
                tcp: 60,
                tcpfin: 0,
                udp: 30
            }
        );
        assert!(usage_error(&["--set", "60", "x", "30"]).contains("tcpfin timeout"));
        assert!(usage_error(&["--set", "60"]).contains("three values"));
        assert_eq!(request(&["-Z"]), Request::ZeroServices);
    }

    #[test]
    fn restore_reads_save_lines_as_one_batch() {
        let input = "# saved\n-A -t 198.18.1.1:80 -s rr\n\n-a -t 198.18.1.1:80 -r 198.18.0.2:8080 -m -w 2\n";
        let Request::Batch { requests, replace } = restore_batch(input.as_bytes(), true).unwrap()
        else {
            panic!("not a batch");
        };
        assert!(replace);
        assert_eq!(requests.len(), 2);
        assert!(matches!(requests[0], Request::AddService { .. }));
        assert!(matches!(requests[1], Request::AddServer { .. }));
        let bad = "-A -t 198.18.1.1:80 -s rr\n-a -t 198.18.1.1:80 -r 198.18.0.2 -w 70000\n";
        let err = restore_batch(bad.as_bytes(), false).unwrap_err();
        assert!(
            err.starts_with("line 2: ") && err.contains("weight"),
            "{err}"
        );
        assert!(restore_batch("# nothing\n\n".as_bytes(), true)
            .unwrap_err()
            .starts_with("refusing to replace the table with nothing"));
        assert!(restore_batch("".as_bytes(), false).is_ok());
        let query = "-L -n\n";
        assert!(restore_batch(query.as_bytes(), false)
            .unwrap_err()
            .contains("line 1: only"));
        // What ipvsadm refuses, though Sluice's parser would take it: the command not
        // first, an option the command does not take.
        for (line, why) in [
            ("-t 198.18.1.6:80 -A -s rr", "Try `sluicectl -h'"),
            (
                "-A -t 198.18.1.7:80 -s rr --tun-type ipip",
                "Illegal 'tun-type' option with the 'add-service' command",
            ),
        ] {
            let input = format!("-A -t 198.18.1.1:80 -s rr\n{line}\n");
            let err = restore_batch(input.as_bytes(), false).unwrap_err();
            assert!(
                err.starts_with("line 2: ")
                    && err.contains(why)
                    && err.ends_with("nothing was changed"),
                "{err}"
            );
        }
    }

    #[test]
    fn help_names_every_scheduler() {
        let help = usage();
        for kind in SchedulerKind::ALL {
            assert!(help.contains(kind.name()), "{} missing", kind.name());
        }
        assert!(!help.contains('{'), "{help}");
        assert!(help.contains("-R --replace"), "{help}");
    }

    #[test]
    fn defaults_apply_when_only_a_command_is_given() {
        assert_eq!(
            options(&["status"]),
            Options {
                socket: PathBuf::from(DEFAULT_SOCKET_PATH),
                timeout: DEFAULT_TIMEOUT,
                json: false,
                command: Command::Status,
            }
        );
    }

    #[test]
    fn options_may_come_before_or_after_the_command() {
        let expected = Options {
            socket: PathBuf::from("/tmp/s.sock"),
            timeout: Duration::from_millis(1500),
            json: true,
            command: Command::Xstats { port: 3 },
        };
        assert_eq!(
            options(&[
                "-S",
                "/tmp/s.sock",
                "--timeout",
                "1.5",
                "xstats",
                "3",
                "--json"
            ]),
            expected
        );
        assert_eq!(
            options(&[
                "xstats",
                "--json",
                "3",
                "--socket=/tmp/s.sock",
                "--timeout=1.5"
            ]),
            expected
        );
        assert_eq!(options(&["--", "zero"]).command, Command::Zero);
    }

    #[test]
    fn socket_comes_from_flag_then_environment_then_default() {
        let socket_of = |args: &[&str], env: Option<&str>| -> PathBuf {
            let args: Vec<String> = args.iter().map(|arg| arg.to_string()).collect();
            match parse_args(&args, env.map(String::from)) {
                Ok(Invocation::Run(options)) => options.socket,
                other => panic!("expected a command, got {other:?}"),
            }
        };
        assert_eq!(
            socket_of(&["status"], Some("/env.sock")),
            Path::new("/env.sock")
        );
        assert_eq!(
            socket_of(&["status"], Some("")),
            Path::new(DEFAULT_SOCKET_PATH)
        );
        assert_eq!(
            socket_of(&["-S", "/flag.sock", "status"], Some("/env.sock")),
            Path::new("/flag.sock")
        );
    }

    #[test]
    fn help_and_version_win_over_everything_else() {
        assert_eq!(parse(&["status", "--help"]), Ok(Invocation::Help));
        assert_eq!(parse(&["-h"]), Ok(Invocation::Help));
        assert_eq!(parse(&["--version", "bogus"]), Ok(Invocation::Version));
    }

    #[test]
    fn bad_usage_is_explained() {
        // As a bare ipvsadm, no command at all lists the table.
        assert_eq!(options(&[]).command.request(), Request::ListServices);
        assert_eq!(parse(&["-v"]), Ok(Invocation::Version));
        assert_eq!(
            usage_error(&["frobnicate"]),
            "unknown command \"frobnicate\""
        );
        assert_eq!(usage_error(&["status", "-x"]), "unknown option \"-x\"");
        assert_eq!(
            usage_error(&["status", "now"]),
            "status takes no arguments (got \"now\")"
        );
        assert_eq!(usage_error(&["xstats"]), "xstats takes exactly one PORT_ID");
        assert_eq!(
            usage_error(&["xstats", "1", "2"]),
            "xstats takes exactly one PORT_ID"
        );
        assert_eq!(
            usage_error(&["xstats", "eth0"]),
            "xstats: PORT_ID must be 0-65535, not \"eth0\""
        );
        assert_eq!(usage_error(&["status", "-S"]), "-S needs a value");
        assert_eq!(
            usage_error(&["status", "--socket="]),
            "--socket needs a non-empty path"
        );
        assert_eq!(
            usage_error(&["status", "--json=yes"]),
            "unknown option \"--json=yes\""
        );
        for bad in ["0", "-1", "abc", "NaN", "inf", "7200"] {
            assert!(
                usage_error(&["status", "--timeout", bad]).starts_with("--timeout must be"),
                "{bad}"
            );
        }
        // ipvsadm's checks judge sluicectl's ipvsadm lines too: what Sluice's parser
        // takes and ipvsadm refuses is refused, in ipvsadm's words.
        assert_eq!(
            parse(&["-A", "-t", "198.18.1.1:80", "-b", "sh-port"]),
            Err(UsageError::new("incompatible scheduler flag `sh-port'"))
        );
        assert_eq!(
            usage_error(&["-C", "-b", "flag-1"]),
            "Illegal 'sched-flags' option with the 'flush' command"
        );
    }

    #[test]
    fn commands_map_to_protocol_requests() {
        assert_eq!(Command::Status.request(), Request::Status);
        assert_eq!(
            Command::Xstats { port: 4 }.request(),
            Request::Xstats { port: 4 }
        );
        assert_eq!(Command::Zero.request(), Request::ZeroCounters);
    }

    #[test]
    fn rendering_rejects_a_reply_of_the_wrong_shape() {
        let error = Command::Status
            .render(&raw(&serde_json::json!([1, 2])).unwrap())
            .unwrap_err()
            .message;
        assert!(
            error.starts_with("unexpected reply from daemon: "),
            "{error}"
        );
        assert_eq!(
            Command::Zero
                .render(&raw(&serde_json::Value::Null).unwrap())
                .unwrap(),
            "counters zeroed\n"
        );
    }

    #[test]
    fn a_reply_missing_a_field_is_an_error_that_names_it() {
        for (command, field) in [
            (Command::Events, "events"),
            (Command::Health, "source"),
            (Command::Vrrp, "vrid"),
            (Command::Sync, "listen"),
            (Command::Cluster, "draining"),
        ] {
            let error = command
                .render(&raw(&serde_json::json!({ "renamed": 1 })).unwrap())
                .unwrap_err()
                .message;
            assert_eq!(
                error,
                format!("unexpected reply from daemon: missing field `{field}`"),
                "{command:?}"
            );
        }
        let error = Command::Events
            .render(
                &raw(&serde_json::json!({"events": [{"unix_ms": 1, "text": "lb=config"}]}))
                    .unwrap(),
            )
            .unwrap_err()
            .message;
        assert_eq!(error, "unexpected reply from daemon: missing field `line`");
    }

    #[test]
    fn an_acl_file_becomes_one_batch_that_clears_the_list_first() {
        use sluice::model::{Protocol, ServiceKey};
        use sluice::service::AclAction;
        let service = ServiceKey::new(
            Protocol::Tcp,
            "198.18.1.1".parse::<std::net::Ipv4Addr>().unwrap(),
            80,
        );
        let mut text = String::from("allow 10.0.0.0/8 # office\n\n");
        for i in 0..2500u32 {
            text.push_str(&format!("deny 11.{}.{}.0/24\n", i >> 8, i & 255));
        }
        let clear = Request::AclClear { service };
        let Request::Batch { requests, replace } =
            acl_load_batch(clear.clone(), text.as_bytes()).unwrap()
        else {
            panic!("not a batch");
        };
        assert!(!replace);
        assert_eq!(requests[0], clear);
        let sizes: Vec<(AclAction, usize)> = requests[1..]
            .iter()
            .map(|r| match r {
                Request::AclAdd {
                    action, prefixes, ..
                } => (*action, prefixes.len()),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            sizes,
            vec![
                (AclAction::Allow, 1),
                (AclAction::Deny, 1000),
                (AclAction::Deny, 1000),
                (AclAction::Deny, 500)
            ]
        );
        let err =
            acl_load_batch(clear, "deny 10.0.0.0/8\ndeny 10.0.0.0/33\n".as_bytes()).unwrap_err();
        assert!(err.starts_with("line 2: "), "{err}");
    }

    #[test]
    fn called_as_ipvsadm_exit_statuses_and_words_are_ipvsadms() {
        use sluice::model::{ForwardMode, Protocol, RealServerSpec, ServiceKey};
        assert!(is_ipvsadm_name("/usr/local/sbin/ipvsadm") && is_ipvsadm_name("ipvsadm"));
        assert!(!is_ipvsadm_name("/usr/bin/sluicectl") && !is_ipvsadm_name("ipvsadm2"));
        let refused = Failure::from(client::ClientError::Daemon("x".into()));
        assert_eq!((refused.status(true), refused.status(false)), (255, 1));
        assert_eq!(Failure::listing(NO_SUCH_SERVICE).status(true), 1);
        let gone = Failure::from(client::ClientError::NoDaemon {
            path: PathBuf::from("/x"),
        });
        assert_eq!((gone.status(true), gone.status(false)), (2, 1));
        let service = ServiceKey::new(Protocol::Tcp, std::net::Ipv4Addr::from([198, 18, 1, 1]), 80);
        let server = RealServerSpec::new(
            std::net::Ipv4Addr::from([198, 18, 0, 2]),
            80,
            1,
            ForwardMode::Dr,
        );
        let missing = sluice::service::ServiceError::NoSuchService(service).to_string();
        assert_eq!(
            ipvsadm_words(&Request::AddServer { service, server }, &missing),
            "Service not defined"
        );
        assert_eq!(
            ipvsadm_words(&Request::ZeroService { service }, &missing),
            "No such service"
        );
        let exists = sluice::service::ServiceError::ServiceExists(service).to_string();
        assert_eq!(
            ipvsadm_words(
                &Request::AddService {
                    service,
                    scheduler: None,
                    persistence: None,
                    sched_flags: None
                },
                &exists
            ),
            "Service already exists"
        );
        // Sluice's own refusals keep their words.
        assert_eq!(
            ipvsadm_words(&Request::AddServer { service, server }, "weight too big"),
            "weight too big"
        );
        assert!(ipvsadm_version().starts_with("ipvsadm v1.31 2019/12/24 (compiled with sluicectl "));
    }

    #[test]
    fn capture_options_build_the_filter_and_bad_ones_name_what_is_wrong() {
        use sluice::dataplane::capture::{Direction, Endpoint};
        let o = options(&[
            "capture",
            "-w",
            "/tmp/x.pcapng",
            "-c",
            "10",
            "--duration",
            "1.5",
            "-s",
            "96",
            "-i",
            "lan0",
            "--dir",
            "tx",
            "--proto",
            "udp",
            "--port=53",
            "--vip",
            "198.18.1.1:53",
            "--host",
            "198.18.0.2",
            "--rs",
            "[2001:db8::21]:53",
            "--host",
            "2001:db8::2",
        ]);
        let Command::Capture(request) = o.command else {
            panic!("{:?}", o.command)
        };
        let Request::CaptureStart {
            path,
            filter,
            interfaces,
            count,
            duration_ms,
            snaplen,
            ..
        } = *request
        else {
            panic!("{request:?}")
        };
        assert_eq!(path, Path::new("/tmp/x.pcapng"));
        assert_eq!(
            (count, duration_ms, snaplen),
            (Some(10), Some(1500), Some(96))
        );
        assert_eq!(interfaces, ["lan0"]);
        assert_eq!(filter.direction, Some(Direction::Tx));
        assert_eq!((filter.proto, filter.l4_port), (Some(17), Some(53)));
        assert_eq!(
            filter.endpoints,
            [
                Endpoint {
                    ip: "198.18.1.1".parse().unwrap(),
                    port: Some(53)
                },
                Endpoint {
                    ip: "198.18.0.2".parse().unwrap(),
                    port: None
                },
                Endpoint {
                    ip: "2001:db8::21".parse().unwrap(),
                    port: Some(53)
                },
                Endpoint {
                    ip: "2001:db8::2".parse().unwrap(),
                    port: None
                }
            ]
        );
        // A relative file is the daemon's to write: made absolute here.
        let o = options(&["capture", "-w", "x.pcapng"]);
        let Command::Capture(request) = o.command else {
            panic!()
        };
        let Request::CaptureStart { path, .. } = *request else {
            panic!()
        };
        assert!(path.is_absolute() && path.ends_with("x.pcapng"));
        assert_eq!(
            options(&["capture", "--stop"]).command,
            Command::Capture(Box::new(Request::CaptureStop))
        );
        for (args, words) in [
            (&["capture", "-c", "3"][..], "-w FILE is required"),
            (
                &["capture", "-w", "f", "--dir", "up"],
                "--dir must be rx or tx",
            ),
            (
                &["capture", "-w", "f", "--vip", "1.2.3"],
                "\"1.2.3\" is not IP, IP:PORT, IPV6 or [IPV6]:PORT",
            ),
            (&["capture", "-w", "f", "-s", "4096"], "-s must be 1-2048"),
            (
                &["capture", "-w", "f", "--host", "1.2.3.4:80"],
                "--host takes an address",
            ),
            (
                &["capture", "--stop", "-c", "1"],
                "--stop takes no other argument",
            ),
            (
                &["capture", "-w", "f", "--bogus", "1"],
                "unknown argument \"--bogus\"",
            ),
        ] {
            let e = parse(args).unwrap_err();
            assert!(e.0.contains(words), "{args:?}: {}", e.0);
        }
    }
}
