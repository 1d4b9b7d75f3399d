//! `ipvsadm` command-line syntax, turned into control requests, so that
//! `alias ipvsadm=sluicectl` keeps existing scripts working. Covered so far: services
//! (`-A/-E/-D`), real servers (`-a/-e/-d`), `-C`, listing (`-L/-l` with `-n`,
//! `--stats`, `-c`), and DPVS's FullNAT local addresses (`-P|--add-laddr`,
//! `-Q|--del-laddr`, `-G|--get-laddr` with `-z LIP` and `-F ifname`). The rest of
//! ipvsadm's options arrive with the control-plane work.
use super::protocol::Request;
use crate::model::Protocol;
use crate::model::{
    ForwardMode, Persistence, RealServerSpec, ServiceKey, MAX_CONN_THRESHOLD,
    MAX_PERSISTENCE_TIMEOUT_S, MAX_WEIGHT,
};
use crate::model::{SchedFlags, SchedulerKind};
use crate::model::{
    SynProxy, SynProxyMode, DEFAULT_SYNPROXY_AUTO_SYN_RATE, DEFAULT_SYNPROXY_SYN_RETRIES,
    MAX_SYNPROXY_SYN_RETRIES,
};
use crate::service::admission::MAX_RATE;
use crate::service::{AclAction, Prefix, RateLimit};
use crate::session::timeouts::MAX_TIMEOUT_SECS;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// How the CLI shows the daemon's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    /// `-L`: the ipvsadm table (or the `--stats` table).
    List { stats: bool },
    /// `-L --timeout`: `Timeout (tcp tcpfin udp): 900 120 300`.
    Timeouts,
    /// `-L --rate`: connections, packets and bytes per second
    /// ([`render_rates`](crate::control::render::render_rates)).
    Rates,
    /// `-L --persistent-conn`: each real server's weight, persistence templates and
    /// connections
    /// ([`render_persistent_conns`](crate::control::render::render_persistent_conns)).
    PersistentConns,
    /// `-L --thresholds`: each real server's upper and lower connection thresholds
    /// and its connections
    /// ([`render_thresholds`](crate::control::render::render_thresholds)).
    Thresholds,
    /// `-S`: the services as ipvsadm-save lines, then Sluice's own lines for what
    /// ipvsadm has no option for (SYN proxy, access lists, rate limits)
    /// ([`render_save`](crate::control::render::render_save)).
    Save,
    /// `-Lc`: the connection entries
    /// ([`render_connections`](crate::control::render::render_connections)); with
    /// `persistent` (`-Lc --persistent-conn`) the title has ipvsadm's persistence
    /// engine columns, which stay empty: Sluice has no persistence engine.
    Connections { persistent: bool },
    /// A change: nothing to print on success, as ipvsadm.
    Quiet,
    /// `-R`: the CLI reads ipvsadm-save lines from stdin. By default it applies them
    /// line by line as ipvsadm does, carrying on past a line that fails or that
    /// Sluice cannot honour ([`restore_line`]). With `atomic` (`-R --atomic`) it sends
    /// them as one [`Request::Batch`], staged over as many request lines as it needs,
    /// all or nothing; the request here is that batch, still empty. `replace` (`-R
    /// --replace`, atomic too): the lines are the whole table, replacing it in the
    /// same transaction.
    Restore { replace: bool, atomic: bool },
    /// `--get-laddr`: the service's local addresses, one per line
    /// ([`render_laddrs`](crate::control::render::render_laddrs) of a
    /// [`LaddrReport`](crate::control::report::LaddrReport)).
    Laddrs,
    /// `--acl-list`: the access list with hits
    /// ([`render_admission`](crate::control::render::render_admission)).
    Admission,
    /// `--acl-list` without a service: every service's access list and rate limit in
    /// brief, with its counts, from the services listing
    /// ([`render_admission_all`](crate::control::render::render_admission_all)).
    AdmissionAll,
    /// `--acl-load FILE`: the CLI reads the rules from `path` (one `allow|deny
    /// PREFIX` a line) and sends them after the request here (the service's list
    /// cleared) as one staged batch: the list is replaced in one change.
    AclLoad { path: String },
}

#[derive(Clone, Debug, PartialEq)]
pub struct Command {
    pub request: Request,
    pub output: Output,
    /// What of the listing to show and in which order (`-L`, `--stats`, `--rate`,
    /// `--thresholds`, `-S`).
    pub listing: Listing,
}

/// ipvsadm's listing choices: `-L -t|-u VIP:port` shows that one service, without
/// the version line (ipvsadm's `list_service`); real servers are sorted by address
/// and port (`ipvs_sort_dests`) unless `--nosort`; counters of 100 million and more
/// are abbreviated with K, M, G or T (`print_largenum`) unless `-X`/`--exact`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Listing {
    pub only: Option<ServiceKey>,
    pub nosort: bool,
    pub exact: bool,
}

/// The ipvsadm command options (the first argument of an ipvsadm invocation).
pub fn is_command(arg: &str) -> bool {
    const LONG: &[&str] = &[
        "--add-service",
        "--edit-service",
        "--delete-service",
        "--add-server",
        "--edit-server",
        "--delete-server",
        "--clear",
        "--list",
        "--add-laddr",
        "--del-laddr",
        "--get-laddr",
        "--zero",
        "--save",
        "--restore",
        "--set",
        "--acl-add",
        "--acl-del",
        "--acl-list",
        "--acl-load",
        "--rate-limit",
        "--start-daemon",
        "--stop-daemon",
    ];
    if LONG.contains(&arg) {
        return true;
    }
    let mut chars = arg.chars();
    chars.next() == Some('-') && chars.next().is_some_and(|c| "AEDaedCLlPQGZSR".contains(c))
}

/// The command options, for messages.
const COMMANDS: &str = "-A, -E, -D, -a, -e, -d, -C, -L, -Z, -S, -R, --set, -P, -Q, -G, \
     --acl-add, --acl-del, --acl-list, --acl-load, --rate-limit";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Verb {
    AddService,
    EditService,
    DeleteService,
    AddServer,
    EditServer,
    DeleteServer,
    Clear,
    List,
    AddLaddr,
    DelLaddr,
    GetLaddr,
    Zero,
    Save,
    Restore,
    Set,
    AclAdd,
    AclDel,
    AclList,
    AclLoad,
    RateLimit,
}

impl Verb {
    /// The command's name in ipvsadm's messages (its `cmdnames`), or Sluice's option.
    fn name(self) -> &'static str {
        match self {
            Verb::AddService => "add-service",
            Verb::EditService => "edit-service",
            Verb::DeleteService => "delete-service",
            Verb::AddServer => "add-server",
            Verb::EditServer => "edit-server",
            Verb::DeleteServer => "delete-server",
            Verb::Clear => "flush",
            Verb::List => "list",
            Verb::AddLaddr => "add-laddr",
            Verb::DelLaddr => "del-laddr",
            Verb::GetLaddr => "get-laddr",
            Verb::Zero => "zero",
            Verb::Save => "save",
            Verb::Restore => "restore",
            Verb::Set => "set",
            Verb::AclAdd => "acl-add",
            Verb::AclDel => "acl-del",
            Verb::AclList => "acl-list",
            Verb::AclLoad => "acl-load",
            Verb::RateLimit => "rate-limit",
        }
    }

    /// Whether the command takes the option named `option` ([`option_name`]): for
    /// ipvsadm's commands and options, what its `commands_v_options` table does not
    /// mark 'x'; Sluice's own options only on the commands they belong to.
    fn takes(self, option: &str) -> bool {
        if let Some(allowed) = super::ipvsadm_usage::allows(self.name(), option) {
            return allowed;
        }
        let own: &[&str] = match self {
            Verb::AddService | Verb::EditService => {
                &["synproxy", "synproxy-rate", "synproxy-retries"]
            }
            Verb::Restore => &["replace", "atomic"],
            Verb::AddLaddr | Verb::DelLaddr => &["service-address", "laddr", "ifname"],
            Verb::GetLaddr | Verb::AclList => &["service-address", "numeric"],
            Verb::AclAdd | Verb::AclDel | Verb::AclLoad => &["service-address"],
            Verb::RateLimit => &["service-address", "burst", "per-prefix"],
            _ => &[],
        };
        own.contains(&option)
    }
}

/// The short options that take a value, in ipvsadm's popt table (`-t -u -f -s -p -M
/// -r -w -x -y -b`), plus Sluice's own `-z` (local address) and `-F` (interface).
const SHORT_WITH_VALUE: &str = "tufspMrwxybzF";

/// Splits the words as popt reads them, so the parsers see one option or one value
/// per word:
/// - bundled short options: `-Ln` -> `-L -n`;
/// - a value attached to a short option, alone or at the end of a bundle: `-w5` ->
///   `-w 5`, `-Lnt10.0.0.1:80` -> `-L -n -t 10.0.0.1:80`, `-p300` -> `-p 300`;
/// - a value attached to a long option: `--weight=5` -> `--weight 5`;
/// - the word after a short option that takes a value is that value, whatever it
///   looks like (`-w -1` is a weight of -1, which the value check then refuses).
///
/// A word whose first character after `-` is not a letter or `6` (`-1`) passes as is.
pub(crate) fn expand(args: &[String]) -> Vec<String> {
    let mut out = Vec::new();
    let mut value_next = false;
    for a in args {
        if std::mem::take(&mut value_next) {
            out.push(a.clone());
            continue;
        }
        if let Some(long) = a.strip_prefix("--") {
            match long.split_once('=') {
                Some((name, value)) if !name.is_empty() => {
                    out.push(format!("--{name}"));
                    out.push(value.to_string());
                }
                _ => out.push(a.clone()),
            }
            continue;
        }
        let Some(bundle) = a.strip_prefix('-') else {
            out.push(a.clone());
            continue;
        };
        if !bundle
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '6')
        {
            out.push(a.clone());
            continue;
        }
        for (i, c) in bundle.char_indices() {
            out.push(format!("-{c}"));
            if SHORT_WITH_VALUE.contains(c) {
                let rest = &bundle[i + c.len_utf8()..];
                if !rest.is_empty() {
                    out.push(rest.to_string());
                } else {
                    // `-p`'s value is optional: the parsers take the next word only
                    // when it does not start with '-'. `-b` is also DPVS's FullNAT
                    // flag on the real-server commands, which takes no value.
                    value_next = !matches!(c, 'p' | 'b');
                }
                break;
            }
        }
    }
    out
}

/// Parses an ipvsadm command line (without the program name).
pub fn parse(args: &[String]) -> Result<Command, String> {
    let args = expand(args);
    let mut verb: Option<Verb> = None;
    let mut service: Option<ServiceKey> = None;
    let mut scheduler: Option<SchedulerKind> = None;
    let mut persistence: Option<u32> = None;
    let mut netmask: Option<(String, bool)> = None;
    let mut server: Option<(IpAddr, Option<u16>)> = None;
    let mut mode: Option<ForwardMode> = None;
    let mut weight: Option<u32> = None;
    let mut upper: Option<u32> = None;
    let mut lower: Option<u32> = None;
    let mut stats = false;
    let mut connections = false;
    // `-b`'s text, read once the scheduler is known.
    let mut sched_flags_text: Option<String> = None;
    let mut tun_type = false;
    let mut show_timeouts = false;
    let mut rate = false;
    let mut thresholds = false;
    let mut set_values: Option<[u32; 3]> = None;
    let mut laddr: Option<(String, IpAddr)> = None;
    let mut ifname = false;
    let mut replace = false;
    let mut atomic = false;
    let mut nosort = false;
    let mut exact = false;
    let mut persistent_conn = false;
    // Access lists and rate limits (Sluice's own options).
    let mut acl_rules: Vec<(AclAction, Prefix)> = Vec::new();
    let mut acl_file: Option<String> = None;
    let mut limit_rate: Option<u32> = None;
    let mut burst: Option<u32> = None;
    let mut per_prefix: Option<u8> = None;
    let mut synproxy_mode: Option<SynProxyMode> = None;
    let mut synproxy_rate: Option<u32> = None;
    let mut synproxy_retries: Option<u8> = None;
    // As ipvsadm, an option given twice is an error rather than the last one winning.
    let mut given: Vec<&'static str> = Vec::new();

    let mut it = args.iter().peekable();
    while let Some(arg) = it.next() {
        // `-b` is ipvsadm's sched-flags on -A and -E, and wherever a value follows
        // it (ipvsadm refuses those elsewhere); DPVS's FullNAT alone.
        let b_is_sched_flags = arg == "-b"
            && (matches!(verb, Some(Verb::AddService | Verb::EditService))
                || it.peek().is_some_and(|next| !next.starts_with('-')));
        if let Some(name) = option_name(arg, b_is_sched_flags) {
            if given.contains(&name) {
                return Err(format!("multiple '{name}' options specified"));
            }
            given.push(name);
        }
        let mut value = |name: &str| {
            it.next()
                .cloned()
                .ok_or_else(|| format!("option {name} requires an argument"))
        };
        let loading_acl = verb == Some(Verb::AclLoad);
        let mut set_verb = |v: Verb| match verb.replace(v) {
            Some(_) => Err(format!("only one command ({COMMANDS}) may be given")),
            None => Ok(()),
        };
        match arg.as_str() {
            "-A" | "--add-service" => set_verb(Verb::AddService)?,
            "-E" | "--edit-service" => set_verb(Verb::EditService)?,
            "-D" | "--delete-service" => set_verb(Verb::DeleteService)?,
            "-a" | "--add-server" => set_verb(Verb::AddServer)?,
            "-e" | "--edit-server" => set_verb(Verb::EditServer)?,
            "-d" | "--delete-server" => set_verb(Verb::DeleteServer)?,
            "-C" | "--clear" => set_verb(Verb::Clear)?,
            "-L" | "-l" | "--list" => set_verb(Verb::List)?,
            "-P" | "--add-laddr" => set_verb(Verb::AddLaddr)?,
            "-Q" | "--del-laddr" => set_verb(Verb::DelLaddr)?,
            "-G" | "--get-laddr" => set_verb(Verb::GetLaddr)?,
            "-Z" | "--zero" => set_verb(Verb::Zero)?,
            "-S" | "--save" => set_verb(Verb::Save)?,
            "-R" | "--restore" => set_verb(Verb::Restore)?,
            "--set" => {
                set_verb(Verb::Set)?;
                let mut values = [0u32; 3];
                for (slot, name) in values.iter_mut().zip(["tcp", "tcpfin", "udp"]) {
                    let v = it.next().ok_or(
                        "--set needs three values: tcp tcpfin udp (seconds, 0 keeps a value)",
                    )?;
                    *slot = parse_number(&format!("{name} timeout"), v, 0, MAX_TIMEOUT_SECS)?;
                }
                set_values = Some(values);
            }
            "--acl-add" => set_verb(Verb::AclAdd)?,
            "--acl-del" => set_verb(Verb::AclDel)?,
            "--acl-list" => set_verb(Verb::AclList)?,
            // The file may follow the option or end the line (`--acl-load -t VIP:port
            // FILE`).
            "--acl-load" => {
                set_verb(Verb::AclLoad)?;
                if it.peek().is_some_and(|next| !next.starts_with('-')) {
                    acl_file = it.next().cloned();
                }
            }
            file if loading_acl && acl_file.is_none() && !file.starts_with('-') => {
                acl_file = Some(file.to_string())
            }
            "--rate-limit" => {
                set_verb(Verb::RateLimit)?;
                limit_rate = Some(parse_number("rate", &value(arg)?, 0, MAX_RATE)?);
            }
            "--allow" | "--deny" => {
                let action = if arg == "--allow" {
                    AclAction::Allow
                } else {
                    AclAction::Deny
                };
                for text in value(arg)?.split(',') {
                    acl_rules.push((action, text.parse::<Prefix>()?));
                }
            }
            "--burst" => burst = Some(parse_number("burst", &value(arg)?, 1, u32::MAX)?),
            "--per-prefix" => {
                per_prefix = Some(parse_number("prefix length", &value(arg)?, 8, 32)? as u8)
            }
            "--timeout" => show_timeouts = true,
            "--replace" => replace = true,
            "--atomic" => atomic = true,
            "-z" | "--laddr" => {
                let v = value(arg)?;
                let bare = v.strip_prefix('[').and_then(|s| s.strip_suffix(']'));
                let ip = bare.unwrap_or(&v).parse().map_err(|_| {
                    format!("illegal local address \"{v}\" (expected a.b.c.d or an IPv6 address)")
                })?;
                laddr = Some((arg.clone(), ip));
            }
            // DPVS binds the address to this interface; Sluice answers ARP for local
            // addresses on every port, so the name is accepted and not used.
            "-F" | "--ifname" => {
                value(arg)?;
                ifname = true;
            }
            "-t" | "--tcp-service" | "-u" | "--udp-service" => {
                let proto = if arg.starts_with("-t") || arg == "--tcp-service" {
                    Protocol::Tcp
                } else {
                    Protocol::Udp
                };
                let key = parse_service(proto, &value(arg)?)?;
                // ipvsadm 1.31's `parse_service` sets an IPv6 service's netmask to
                // 128: a `-M` before it no longer counts.
                if key.is_ipv6() {
                    netmask = None;
                }
                service = Some(key);
            }
            // An empty name is ipvsadm's default, as if `-s` were not given.
            "-s" | "--scheduler" => {
                scheduler = match value(arg)?.as_str() {
                    "" => None,
                    name => Some(name.parse::<SchedulerKind>()?),
                }
            }
            "-p" | "--persistent" => {
                // The timeout is optional, as in ipvsadm (default 360 s).
                let timeout = match it.peek() {
                    Some(v) if v.chars().all(|c| c.is_ascii_digit()) => {
                        let v = it.next().expect("peeked");
                        parse_number("persistence timeout", v, 1, MAX_PERSISTENCE_TIMEOUT_S)?
                    }
                    _ => Persistence::DEFAULT_TIMEOUT_S,
                };
                persistence = Some(timeout);
            }
            // A prefix length after an IPv6 service, else a dotted netmask.
            "-M" | "--netmask" => {
                let ipv6 = service.is_some_and(|s| s.is_ipv6());
                netmask = Some((value(arg)?.to_string(), ipv6));
            }
            "-r" | "--real-server" => {
                let proto = service.map_or(Protocol::Tcp, |s| s.proto);
                server = Some(parse_server(proto, &value(arg)?)?)
            }
            "-g" | "--gatewaying" => mode = Some(ForwardMode::Dr),
            "-m" | "--masquerading" => mode = Some(ForwardMode::Nat),
            "-i" | "--ipip" => mode = Some(ForwardMode::Tun),
            "--sched-flags" => sched_flags_text = Some(value(arg)?),
            "-b" if b_is_sched_flags => sched_flags_text = Some(value(arg)?),
            "-b" | "--fullnat" => mode = Some(ForwardMode::FullNat),
            // ipvsadm 1.31's `-S` writes `--tun-type ipip` on every `-i` line; Sluice's
            // tunnels are IP-in-IP.
            "--tun-type" => match value(arg)?.as_str() {
                "ipip" => tun_type = true,
                other @ ("gue" | "gre") => {
                    return Err(format!(
                        "--tun-type {other}: Sluice tunnels with IP-in-IP only"
                    ))
                }
                _ => return Err("illegal tunnel type specified".into()),
            },
            "-w" | "--weight" => {
                weight = Some(parse_number("weight", &value(arg)?, 0, MAX_WEIGHT)?)
            }
            "-x" | "--u-threshold" => {
                upper = Some(parse_number(
                    "upper threshold",
                    &value(arg)?,
                    0,
                    MAX_CONN_THRESHOLD,
                )?)
            }
            "-y" | "--l-threshold" => {
                lower = Some(parse_number(
                    "lower threshold",
                    &value(arg)?,
                    0,
                    MAX_CONN_THRESHOLD,
                )?)
            }
            "--synproxy" => {
                let text = value(arg)?;
                synproxy_mode =
                    Some(SynProxyMode::parse(&text).ok_or_else(|| {
                        format!("--synproxy takes on, off or auto, not \"{text}\"")
                    })?)
            }
            "--synproxy-rate" => {
                synproxy_rate = Some(parse_number(
                    "synproxy SYN rate",
                    &value(arg)?,
                    1,
                    100_000_000,
                )?)
            }
            "--synproxy-retries" => {
                let n = parse_number(
                    "synproxy SYN retries",
                    &value(arg)?,
                    0,
                    u32::from(MAX_SYNPROXY_SYN_RETRIES),
                )?;
                synproxy_retries = Some(n as u8)
            }
            "-n" | "--numeric" => {}
            "-X" | "--exact" => exact = true,
            "--persistent-conn" => persistent_conn = true,
            "--stats" => stats = true,
            "--nosort" => nosort = true,
            // Sorting is the default; ipvsadm keeps `--sort` as a no-op.
            "--sort" => {}
            "--rate" => rate = true,
            "--thresholds" => thresholds = true,
            "-c" | "--connection" => connections = true,
            other => return Err(format!("unknown or unsupported option \"{other}\"")),
        }
    }

    let verb = verb.ok_or_else(|| format!("no command given (one of {COMMANDS})"))?;
    // Other commands do not take them: refused below with the other options.
    let sched_flags = match sched_flags_text {
        Some(text) if matches!(verb, Verb::AddService | Verb::EditService) => {
            Some(ipvsadm_sched_flags(&text, scheduler)?).filter(|f| !f.is_empty())
        }
        _ => None,
    };
    if !acl_rules.is_empty() && !matches!(verb, Verb::AclAdd | Verb::AclDel) {
        return Err("options --allow and --deny only apply to --acl-add and --acl-del".into());
    }
    if (burst.is_some() || per_prefix.is_some()) && verb != Verb::RateLimit {
        return Err("options --burst and --per-prefix only apply to --rate-limit".into());
    }
    if connections && verb != Verb::List {
        return Err("option -c/--connection only applies to -L/--list".into());
    }
    for (given, option) in [
        (stats, "--stats"),
        (rate, "--rate"),
        (thresholds, "--thresholds"),
        (persistent_conn, "--persistent-conn"),
        (show_timeouts, "--timeout"),
    ] {
        if given && verb != Verb::List {
            return Err(format!("option {option} only applies to -L/--list"));
        }
    }
    // ipvsadm's own list checks: `-c` and `--timeout` list one thing each, so none of
    // the table formats apply to them (`--persistent-conn` does to `-c`: the columns
    // of a persistence engine), and they are "1" options, one at a time.
    if verb == Verb::List {
        // `generic_opt_check` comes first in ipvsadm.
        if connections && show_timeouts {
            return Err(
                "The option 'timeout' conflicts with the 'connection' option in the 'list' command"
                    .into(),
            );
        }
        if (connections || show_timeouts) && (stats || rate || thresholds)
            || show_timeouts && persistent_conn
        {
            return Err("options conflicts in the list command".into());
        }
    }
    if (synproxy_mode.is_some() || synproxy_rate.is_some() || synproxy_retries.is_some())
        && !matches!(verb, Verb::AddService | Verb::EditService)
    {
        return Err(
            "options --synproxy, --synproxy-rate and --synproxy-retries only apply to -A and -E"
                .into(),
        );
    }
    if synproxy_rate.is_some() && synproxy_mode.is_none() {
        return Err("option --synproxy-rate needs --synproxy".into());
    }
    if synproxy_retries.is_some() && synproxy_mode.is_none() {
        return Err("option --synproxy-retries needs --synproxy".into());
    }
    let synproxy = synproxy_mode.map(|mode| SynProxy {
        mode,
        auto_syn_rate: synproxy_rate.unwrap_or(DEFAULT_SYNPROXY_AUTO_SYN_RATE),
        syn_retries: synproxy_retries.unwrap_or(DEFAULT_SYNPROXY_SYN_RETRIES),
    });
    // Only the SYN proxy changes with `-E --synproxy` and nothing else of ipvsadm's.
    let synproxy_only = verb == Verb::EditService
        && synproxy.is_some()
        && scheduler.is_none()
        && persistence.is_none()
        && netmask.is_none()
        && sched_flags.is_none();
    if replace && verb != Verb::Restore {
        return Err("option --replace only applies to -R/--restore".into());
    }
    if atomic && verb != Verb::Restore {
        return Err("option --atomic only applies to -R/--restore".into());
    }
    if matches!(verb, Verb::Save | Verb::Restore | Verb::Set) && service.is_some() {
        return Err("-S, -R and --set apply to every service: drop -t/-u".into());
    }
    // ipvsadm's "exclusive" list options (its commands_v_options table).
    if verb == Verb::List && service.is_some() {
        if connections {
            return Err("The option 'service-address' conflicts with the 'connection' option in the 'list' command".into());
        }
        if show_timeouts {
            return Err("The option 'timeout' conflicts with the 'service-address' option in the 'list' command".into());
        }
    }
    if nosort && verb != Verb::List {
        return Err("option --nosort only applies to -L/--list".into());
    }
    if exact && verb != Verb::List {
        return Err("option -X/--exact only applies to -L/--list".into());
    }
    let listing = Listing {
        only: if verb == Verb::List { service } else { None },
        nosort,
        exact,
    };
    if !matches!(verb, Verb::AddLaddr | Verb::DelLaddr) {
        if let Some((option, _)) = &laddr {
            return Err(format!(
                "option {option} only applies to --add-laddr and --del-laddr"
            ));
        }
        if ifname {
            return Err("option -F/--ifname only applies to --add-laddr and --del-laddr".into());
        }
    }
    // Every option the command does not take is refused, in ipvsadm's words: a line
    // ipvsadm refuses must never act (`-C -t VIP:port` would otherwise flush the whole
    // table, `-A ... -r RIP` add the service without its server).
    if let Some(name) = given.iter().find(|name| !verb.takes(name)) {
        return Err(format!(
            "Illegal '{name}' option with the '{}' command",
            verb.name()
        ));
    }
    // ipvsadm: only tunnelling takes tunnel options; they do not make it one.
    if tun_type && mode != Some(ForwardMode::Tun) {
        return Err("Tunnel options conflict with forward method".into());
    }
    let needs_laddr = || {
        laddr
            .as_ref()
            .map(|(_, ip)| *ip)
            .ok_or_else(|| "this command needs a local address: -z LIP".to_string())
    };
    let needs_service =
        || service.ok_or_else(|| "this command needs a service: -t|-u VIP:port".to_string());
    // ipvsadm 1.31 reads `-M` after an IPv6 `-t`/`-u` with `atoi` as a prefix length,
    // 1..128 ("illegal ipv6 netmask specified"), else as a dotted netmask.
    let (mask, prefix6) = match netmask {
        Some((v, true)) => match crate::control::ipvsadm_usage::atoi(&v) {
            n @ 1..=128 => (Ipv4Addr::BROADCAST, n as u8),
            _ => {
                return Err(format!(
                    "illegal ipv6 netmask specified: \"{v}\" (a prefix length, 1..128)"
                ))
            }
        },
        Some((v, false)) => (
            v.parse().map_err(|_| format!("illegal netmask \"{v}\""))?,
            Persistence::FULL_PREFIX6,
        ),
        None => (Ipv4Addr::BROADCAST, Persistence::FULL_PREFIX6),
    };
    // As ipvsadm: the mask is taken and only counts with persistence.
    let persistence = persistence.map(|timeout_s| Persistence {
        netmask: mask,
        prefix6,
        ..Persistence::new(timeout_s)
    });
    let spec = |service: ServiceKey| -> Result<RealServerSpec, String> {
        let (ip, port) = server.ok_or("this command needs a real server: -r RIP[:port]")?;
        let mode = mode.unwrap_or(ForwardMode::Dr);
        // As ipvsadm: direct routing and tunnelling deliver to the service port, so
        // on -a/-e a different real-server port is replaced by it, silently.
        let keeps_port = matches!(verb, Verb::AddServer | Verb::EditServer)
            && matches!(mode, ForwardMode::Dr | ForwardMode::Tun);
        let port = match port {
            Some(_) if keeps_port => service.port,
            Some(port) => port,
            None => service.port,
        };
        let spec = RealServerSpec::new(ip, port, weight.unwrap_or(1), mode);
        Ok(spec.with_thresholds(upper.unwrap_or(0), lower.unwrap_or(0)))
    };
    let (request, output) = match verb {
        Verb::List if connections => (
            Request::ListConnections {
                max: None,
                page: None,
            },
            Output::Connections {
                persistent: persistent_conn,
            },
        ),
        Verb::List if show_timeouts => (Request::GetTimeouts, Output::Timeouts),
        // Of several table formats the first of these wins, as in ipvsadm's
        // `print_title` and `print_service_entry`.
        Verb::List if stats => (Request::ListServices, Output::List { stats }),
        Verb::List if rate => (Request::ListServices, Output::Rates),
        Verb::List if thresholds => (Request::ListServices, Output::Thresholds),
        Verb::List if persistent_conn => (Request::ListServices, Output::PersistentConns),
        Verb::Zero => match service {
            Some(service) => (Request::ZeroService { service }, Output::Quiet),
            None => (Request::ZeroServices, Output::Quiet),
        },
        Verb::Save => (Request::SaveServices, Output::Save),
        Verb::Restore => (
            Request::Batch {
                requests: Vec::new(),
                replace,
            },
            Output::Restore {
                replace,
                atomic: atomic || replace,
            },
        ),
        Verb::Set => {
            let [tcp, tcpfin, udp] = set_values.expect("set with --set");
            (Request::SetTimeouts { tcp, tcpfin, udp }, Output::Quiet)
        }
        Verb::List => (Request::ListServices, Output::List { stats: false }),
        Verb::Clear => (Request::Clear, Output::Quiet),
        Verb::EditService if synproxy_only => (
            Request::SetSynproxy {
                service: needs_service()?,
                synproxy: synproxy.expect("synproxy_only"),
            },
            Output::Quiet,
        ),
        Verb::AddService | Verb::EditService => {
            let service = needs_service()?;
            // `-E` sets the whole service as ipvsadm's does: without `-s` the
            // scheduler is wlc again (ipvsadm's `DEF_SCHED`), without `-b` no flags.
            let (scheduler, sched_flags) = if verb == Verb::EditService {
                (
                    Some(scheduler.unwrap_or(SchedulerKind::Wlc)),
                    Some(sched_flags.unwrap_or_default()),
                )
            } else {
                (scheduler, sched_flags)
            };
            let request = if verb == Verb::AddService {
                Request::AddService {
                    service,
                    scheduler,
                    persistence,
                    sched_flags,
                }
            } else {
                Request::EditService {
                    service,
                    scheduler,
                    persistence,
                    sched_flags,
                }
            };
            // With --synproxy: one transaction, so a refused proxy adds nothing.
            let request = match synproxy {
                Some(synproxy) => Request::Batch {
                    requests: vec![request, Request::SetSynproxy { service, synproxy }],
                    replace: false,
                },
                None => request,
            };
            (request, Output::Quiet)
        }
        Verb::DeleteService => (
            Request::DeleteService {
                service: needs_service()?,
            },
            Output::Quiet,
        ),
        Verb::AddServer => {
            let service = needs_service()?;
            (
                Request::AddServer {
                    service,
                    server: spec(service)?,
                },
                Output::Quiet,
            )
        }
        Verb::EditServer => {
            let service = needs_service()?;
            (
                Request::EditServer {
                    service,
                    server: spec(service)?,
                },
                Output::Quiet,
            )
        }
        Verb::DeleteServer => {
            let service = needs_service()?;
            let s = spec(service)?;
            (
                Request::DeleteServer {
                    service,
                    ip: s.ip,
                    port: s.port,
                },
                Output::Quiet,
            )
        }
        Verb::AddLaddr => (
            Request::AddLaddr {
                service: needs_service()?,
                ip: needs_laddr()?,
            },
            Output::Quiet,
        ),
        Verb::DelLaddr => (
            Request::DelLaddr {
                service: needs_service()?,
                ip: needs_laddr()?,
            },
            Output::Quiet,
        ),
        Verb::GetLaddr => (
            Request::GetLaddr {
                service: needs_service()?,
            },
            Output::Laddrs,
        ),
        Verb::AclAdd => {
            let service = needs_service()?;
            let action = match acl_rules.first() {
                Some((action, _)) => *action,
                None => {
                    return Err(
                        "--acl-add needs --allow PREFIX[,...] or --deny PREFIX[,...]".into(),
                    )
                }
            };
            if acl_rules.iter().any(|(a, _)| *a != action) {
                return Err("--acl-add takes --allow or --deny, not both in one command".into());
            }
            (
                Request::AclAdd {
                    service,
                    action,
                    prefixes: acl_rules.iter().map(|(_, p)| *p).collect(),
                },
                Output::Quiet,
            )
        }
        Verb::AclDel => {
            if acl_rules.is_empty() {
                return Err("--acl-del needs the prefixes: --allow|--deny PREFIX[,...]".into());
            }
            (
                Request::AclDel {
                    service: needs_service()?,
                    prefixes: acl_rules.iter().map(|(_, p)| *p).collect(),
                },
                Output::Quiet,
            )
        }
        Verb::AclList => match service {
            Some(service) => (Request::AclList { service, max: None }, Output::Admission),
            None => (Request::ListServices, Output::AdmissionAll),
        },
        Verb::AclLoad => (
            Request::AclClear {
                service: needs_service()?,
            },
            Output::AclLoad {
                path: acl_file.ok_or("--acl-load needs a file of rules")?,
            },
        ),
        Verb::RateLimit => {
            let service = needs_service()?;
            let limit = match limit_rate.expect("--rate-limit takes a rate") {
                0 => None,
                rate => Some(
                    RateLimit::new(rate, burst.unwrap_or(rate), per_prefix.unwrap_or(32))
                        .map_err(|e| format!("--rate-limit: {e}"))?,
                ),
            };
            (Request::SetRateLimit { service, limit }, Output::Quiet)
        }
    };
    Ok(Command {
        request,
        output,
        listing,
    })
}

/// ipvsadm's name for an option (its `optnames`), for the "given twice" error; `None`
/// for commands, which have their own check. `-b` is the scheduler flags when
/// `b_is_sched_flags`, else the FullNAT forwarding method.
fn option_name(arg: &str, b_is_sched_flags: bool) -> Option<&'static str> {
    let name = match arg {
        "-t" | "--tcp-service" | "-u" | "--udp-service" => "service-address",
        "-s" | "--scheduler" => "scheduler",
        "-p" | "--persistent" => "persistent",
        "-M" | "--netmask" => "netmask",
        "-r" | "--real-server" => "real-server",
        "-b" if b_is_sched_flags => "sched-flags",
        "--sched-flags" => "sched-flags",
        "--tun-type" => "tun-type",
        "-g" | "--gatewaying" | "-m" | "--masquerading" | "-i" | "--ipip" | "-b" | "--fullnat" => {
            "forwarding-method"
        }
        "-w" | "--weight" => "weight",
        "-x" | "--u-threshold" => "u-threshold",
        "-y" | "--l-threshold" => "l-threshold",
        "-n" | "--numeric" => "numeric",
        "-X" | "--exact" => "exact",
        "--persistent-conn" => "persistent-conn",
        "-c" | "--connection" => "connection",
        "--timeout" => "timeout",
        "--stats" => "stats",
        "--rate" => "rate",
        "--thresholds" => "thresholds",
        "--nosort" => "nosort",
        "--replace" => "replace",
        "--atomic" => "atomic",
        "--synproxy" => "synproxy",
        "--synproxy-rate" => "synproxy-rate",
        "--synproxy-retries" => "synproxy-retries",
        "-z" | "--laddr" => "laddr",
        "-F" | "--ifname" => "ifname",
        "--burst" => "burst",
        "--per-prefix" => "per-prefix",
        _ => return None,
    };
    Some(name)
}

/// ipvsadm's `-b` text as IPVS takes it for `scheduler` (ipvsadm's default, wlc,
/// when not given): names separated by commas, empty ones skipped as `strtok` skips
/// them. `flag-1` and `flag-2` are sh's and mh's fallback and port flags, and mean
/// nothing to other schedulers, nor `flag-3` to any: Sluice drops those. A name is
/// taken whole, as ipvsadm's `strcmp` takes it, so `sh-port, sh-fallback` is
/// refused, in `parse_sched_flags`'s words.
fn ipvsadm_sched_flags(text: &str, scheduler: Option<SchedulerKind>) -> Result<SchedFlags, String> {
    let family = match scheduler {
        Some(SchedulerKind::Sh) => Some("sh"),
        Some(SchedulerKind::Mh) => Some("mh"),
        _ => None,
    };
    // ipvsadm 1.31 reads the list with `strtok` and crashes on one without a name
    // (`-b ,`, `-b ''`): refused here, where it would otherwise clear the flags.
    if text.split(',').all(str::is_empty) {
        return Err(format!("no scheduler flag in `{text}'"));
    }
    let mut names = Vec::new();
    for flag in text.split(',').filter(|f| !f.is_empty()) {
        match (flag, family) {
            ("flag-1", Some(family)) => names.push(format!("{family}-fallback")),
            ("flag-2", Some(family)) => names.push(format!("{family}-port")),
            ("flag-1" | "flag-2" | "flag-3", _) => {}
            (name, _) if SchedFlags::NAMES.contains(&name) => names.push(name.to_string()),
            (name, _) => return Err(format!("invalid scheduler flag `{name}'")),
        }
    }
    names.join(",").parse()
}

/// `host[:port]` as ipvsadm reads it: an IPv6 address in brackets with a port
/// (`[2001:db8::1]:80`), bare without one (`2001:db8::1`). ipvsadm 1.31's
/// `parse_service` takes brackets only before `:` (`[2001:db8::1]` alone is no
/// address to it: "illegal real server address[:port] specified"); Sluice also
/// wants an IPv6 address in them, where ipvsadm would read `[1.2.3.4]:80` as 1.2.3.4
/// and drop the port.
fn split_host_port(text: &str) -> Option<(&str, Option<&str>)> {
    if let Some(rest) = text.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        host.parse::<Ipv6Addr>().ok()?;
        return Some((host, Some(after.strip_prefix(':')?)));
    }
    if text.parse::<Ipv6Addr>().is_ok() {
        return Some((text, None));
    }
    Some(match text.rsplit_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (text, None),
    })
}

/// Whether `text` is all digits (or empty): no address for ipvsadm (`str_is_digit`),
/// where a name lookup would read `8080` as 0.0.31.144.
fn all_digits(text: &str) -> bool {
    text.chars().all(|c| c.is_ascii_digit())
}

fn parse_service(proto: Protocol, text: &str) -> Result<ServiceKey, String> {
    let illegal = || format!("illegal virtual server address \"{text}\"");
    if all_digits(text) {
        return Err(illegal());
    }
    let (ip, port) = split_host_port(text).ok_or_else(illegal)?;
    // Without a port, port 0, as ipvsadm (its "all ports" service).
    let port = port.unwrap_or("0");
    let vip = resolve_host(ip).ok_or_else(illegal)?;
    let port = resolve_port(proto, port)?;
    Ok(ServiceKey::new(proto, vip, port))
}

/// `-r RIP[:port]`; a port name is looked up for `proto` (the service's, as ipvsadm).
fn parse_server(proto: Protocol, text: &str) -> Result<(IpAddr, Option<u16>), String> {
    let illegal = || format!("illegal real server address \"{text}\"");
    if all_digits(text) {
        return Err(illegal());
    }
    let (ip, port) = split_host_port(text).ok_or_else(illegal)?;
    let port = port.map(|p| resolve_port(proto, p)).transpose()?;
    let ip = resolve_host(ip).ok_or_else(illegal)?;
    Ok((ip, port))
}

/// An IPv4 address, or a host name resolved to its first IPv4 address (ipvsadm's
/// `host_to_addr`, so that a save written without `-n` restores).
pub(crate) fn resolve_host(text: &str) -> Option<IpAddr> {
    if let Ok(ip) = text.parse() {
        return Some(ip);
    }
    if text.is_empty()
        || !text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-._".contains(c))
    {
        return None;
    }
    use std::net::ToSocketAddrs;
    (text, 0)
        .to_socket_addrs()
        .ok()?
        .find_map(|a| match a.ip() {
            IpAddr::V4(ip) => Some(IpAddr::V4(ip)),
            IpAddr::V6(_) => None,
        })
}

/// A port number, or a service name from `/etc/services` for the protocol (ipvsadm's
/// `service_to_port`: `http`, `domain`).
pub(crate) fn resolve_port(proto: Protocol, text: &str) -> Result<u16, String> {
    if let Ok(port) = parse_number("port", text, 0, u16::MAX as u32) {
        return Ok(port as u16);
    }
    let services = std::fs::read_to_string("/etc/services").unwrap_or_default();
    service_port(&services, &proto.name().to_lowercase(), text).ok_or_else(|| {
        format!("illegal port \"{text}\" (a number 0..=65535 or a name from /etc/services)")
    })
}

/// The port `/etc/services` text gives `name` (or an alias of it) for `proto`.
fn service_port(services: &str, proto: &str, name: &str) -> Option<u16> {
    services.lines().find_map(|line| {
        let line = line.split('#').next().unwrap_or("");
        let mut words = line.split_whitespace();
        let (first, port_proto) = (words.next()?, words.next()?);
        let (port, p) = port_proto.split_once('/')?;
        (p == proto && (first == name || words.any(|alias| alias == name)))
            .then(|| port.parse().ok())
            .flatten()
    })
}

/// What `-R` makes of one line of an ipvsadm save file.
#[derive(Clone, Debug, PartialEq)]
pub enum RestoreLine {
    /// Blank, or only a comment.
    Nothing,
    /// A command to apply.
    Apply(Command),
    /// A valid ipvsadm line with an option Sluice cannot honour (named).
    Unsupported(String),
}

/// ipvsadm's schedulers (its `SCHEDULERS` file, 1.31).
pub(crate) const IPVSADM_SCHEDULERS: &[&str] = &[
    "rr", "wrr", "lc", "wlc", "lblc", "lblcr", "dh", "sh", "sed", "nq", "fo", "ovf", "mh",
];

/// The words of one `-R` line as ipvsadm's `config_stream_read` splits it: on
/// whitespace, up to a `#`, without the word `ipvsadm` (a saved line may start with
/// it).
pub fn restore_words(line: &str) -> Vec<String> {
    let text = line.split_once('#').map_or(line, |(before, _)| before);
    text.split_whitespace()
        .filter(|w| *w != "ipvsadm")
        .map(str::to_string)
        .collect()
}

/// One line of `ipvsadm -S` output as `-R` reads it, as ipvsadm's `config_stream_read`
/// does: the word `ipvsadm` is dropped wherever it stands; `#` starts a comment (a
/// line ipvsadm's restore script drops). What ipvsadm 1.31 writes and Sluice does
/// too is accepted where ipvsadm takes it ([`parse`]): `--tun-type ipip` with `-i`
/// (Sluice's `-i` is IP-in-IP), `-b flag-N` on `-A`/`-E` (IPVS gives them a meaning
/// only for sh and mh, where they are `sh-fallback`/`sh-port` and
/// `mh-fallback`/`mh-port`), host and port names. What Sluice cannot do is named:
/// fwmark and SCTP services, IPv6, one-packet scheduling, persistence engines,
/// schedulers it lacks, GUE and GRE tunnels. That names what Sluice cannot do, not
/// that ipvsadm would take the line: the callers judge it with ipvsadm's checks
/// ([`super::ipvsadm_usage::check`]) too.
pub fn restore_line(line: &str) -> Result<RestoreLine, String> {
    read_words(restore_words(line))
}

/// An ipvsadm command's words, read as [`restore_line`] reads a line: the command
/// line and `-R` take the same things and name the same things Sluice cannot do.
pub fn read_words(words: Vec<String>) -> Result<RestoreLine, String> {
    if words.is_empty() {
        return Ok(RestoreLine::Nothing);
    }
    // Attached values apart first (`--tun-type=gue`, `-f100`), as `parse` does.
    let words = expand(&words);
    let mut i = 0;
    while i < words.len() {
        let next = words.get(i + 1).cloned().unwrap_or_default();
        let unsupported = |what: String| Ok(RestoreLine::Unsupported(what));
        match words[i].as_str() {
            "-f" | "--fwmark-service" => {
                return unsupported(format!(
                    "{} {next}: fwmark services (Sluice matches a service by protocol, address and port)",
                    words[i]
                ))
            }
            "--sctp-service" => {
                return unsupported(format!("--sctp-service {next}: SCTP services (Sluice balances TCP and UDP)"))
            }
            "-6" | "--ipv6" => return unsupported(format!("{}: IPv6 services", words[i])),
            "-o" | "--ops" => {
                return unsupported(format!("{}: one-packet scheduling", words[i]))
            }
            "--pe" => return unsupported(format!("--pe {next}: persistence engines")),
            opt @ ("--start-daemon" | "--stop-daemon" | "--daemon") => {
                return unsupported(format!(
                    "{opt}: IPVS's connection sync daemon (Sluice syncs sessions as its \
                     [sync] section says, docs/SYNC.md; `sluicectl sync` shows it)"
                ))
            }
            // Without a value it is ipvsadm's own usage error, which `parse` reports.
            "-s" | "--scheduler"
                if i + 1 < words.len() && next.parse::<SchedulerKind>().is_err() =>
            {
                // ipvsadm takes any name here and IPVS refuses what no module
                // provides: the line is not applied and the restore goes on.
                return unsupported(if IPVSADM_SCHEDULERS.contains(&next.as_str()) {
                    format!("-s {next}: Sluice has no {next} scheduler")
                } else {
                    format!(
                        "-s {next}: no scheduler is called {next:?} (IPVS: Scheduler or \
                         persistence engine not found)"
                    )
                });
            }
            "--tun-type" if next == "gue" || next == "gre" => {
                return unsupported(format!("--tun-type {next}: Sluice tunnels with IP-in-IP only"))
            }
            opt @ ("--tun-port" | "--tun-nocsum" | "--tun-csum" | "--tun-remcsum") => {
                return unsupported(format!("{opt}: GUE and GRE tunnel options"))
            }
            _ => {}
        }
        i += 1;
    }
    parse(&words).map(RestoreLine::Apply)
}

fn parse_number(what: &str, text: &str, min: u32, max: u32) -> Result<u32, String> {
    text.parse::<u32>()
        .ok()
        .filter(|v| (min..=max).contains(v))
        .ok_or_else(|| format!("illegal {what} \"{text}\" (expected {min}..={max})"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(line: &str) -> Result<Command, String> {
        parse(
            &line
                .split_whitespace()
                .map(String::from)
                .collect::<Vec<_>>(),
        )
    }

    fn key(proto: Protocol, vip: [u8; 4], port: u16) -> ServiceKey {
        ServiceKey::new(proto, std::net::Ipv4Addr::from(vip), port)
    }

    #[test]
    fn synproxy_rides_on_add_and_edit_service() {
        use crate::model::{SynProxy, SynProxyMode};
        let vip = key(Protocol::Tcp, [198, 18, 1, 1], 80);
        let on = SynProxy {
            mode: SynProxyMode::On,
            auto_syn_rate: 1000,
            syn_retries: 3,
        };
        assert_eq!(
            p("-A -t 198.18.1.1:80 -s rr --synproxy on")
                .unwrap()
                .request,
            Request::Batch {
                requests: vec![
                    Request::AddService {
                        service: vip,
                        scheduler: Some(SchedulerKind::Rr),
                        persistence: None,
                        sched_flags: None,
                    },
                    Request::SetSynproxy {
                        service: vip,
                        synproxy: on,
                    }
                ],
                replace: false,
            }
        );
        // -E with only --synproxy changes nothing else.
        assert_eq!(
            p("-E -t 198.18.1.1:80 --synproxy auto --synproxy-rate 20000 --synproxy-retries 0")
                .unwrap()
                .request,
            Request::SetSynproxy {
                service: vip,
                synproxy: SynProxy {
                    mode: SynProxyMode::Auto,
                    auto_syn_rate: 20000,
                    syn_retries: 0,
                },
            }
        );
        for (line, needle) in [
            ("-A -t 198.18.1.1:80 --synproxy maybe", "on, off or auto"),
            (
                "-a -t 198.18.1.1:80 -r 10.0.0.1 --synproxy on",
                "only apply to -A and -E",
            ),
            ("-E -t 198.18.1.1:80 --synproxy-rate 5", "needs --synproxy"),
            (
                "-E -t 198.18.1.1:80 --synproxy on --synproxy off",
                "multiple",
            ),
            (
                "-E -t 198.18.1.1:80 --synproxy auto --synproxy-rate 0",
                "rate",
            ),
            (
                "-E -t 198.18.1.1:80 --synproxy on --synproxy-retries 6",
                "illegal synproxy SYN retries \"6\" (expected 0..=5)",
            ),
            (
                "-E -t 198.18.1.1:80 --synproxy-retries 2",
                "needs --synproxy",
            ),
        ] {
            let err = p(line).unwrap_err();
            assert!(err.contains(needle), "{line}: {err}");
        }
        // Plain -A is unchanged.
        assert!(matches!(
            p("-A -t 198.18.1.1:80").unwrap().request,
            Request::AddService { .. }
        ));
    }

    #[test]
    fn service_commands() {
        assert_eq!(
            p("-A -t 198.18.1.1:80 -s rr").unwrap().request,
            Request::AddService {
                service: key(Protocol::Tcp, [198, 18, 1, 1], 80),
                scheduler: Some(SchedulerKind::Rr),
                persistence: None,
                sched_flags: None
            }
        );
        assert_eq!(
            p("-A -t 198.18.1.1:80 -s sh -b sh-port,sh-fallback")
                .unwrap()
                .request,
            Request::AddService {
                service: key(Protocol::Tcp, [198, 18, 1, 1], 80),
                scheduler: Some(SchedulerKind::Sh),
                persistence: None,
                sched_flags: Some("sh-fallback,sh-port".parse().unwrap())
            }
        );
        assert_eq!(
            p("-A -t 198.18.1.1:80 -s sh -b sh-quick").map(|_| ()),
            Err("invalid scheduler flag `sh-quick'".to_string())
        );
        for list in [",", ",,"] {
            assert_eq!(
                p(&format!("-E -t 198.18.1.1:80 -s sh -b {list}")).map(|_| ()),
                Err(format!("no scheduler flag in `{list}'"))
            );
        }
        // An empty word (`-b ''` in a shell), and the same as `--sched-flags=`.
        for args in [&["-b", ""][..], &["--sched-flags="]] {
            let line: Vec<String> = ["-E", "-t", "198.18.1.1:80", "-s", "sh"]
                .iter()
                .chain(args)
                .map(|a| a.to_string())
                .collect();
            assert_eq!(
                parse(&line).map(|_| ()),
                Err("no scheduler flag in `'".to_string()),
                "{args:?}"
            );
        }
        // -b on a real server is DPVS's FullNAT.
        let fullnat = p("-a -t 198.18.1.1:80 -r 198.18.0.2:80 -b")
            .unwrap()
            .request;
        assert!(
            matches!(fullnat, Request::AddServer { server, .. } if server.mode == ForwardMode::FullNat)
        );
        assert_eq!(
            p("-E -u 198.18.1.1:53 -p 60 -M 255.255.255.0")
                .unwrap()
                .request,
            Request::EditService {
                service: key(Protocol::Udp, [198, 18, 1, 1], 53),
                scheduler: Some(SchedulerKind::Wlc),
                persistence: Some(Persistence {
                    netmask: [255, 255, 255, 0].into(),
                    ..Persistence::new(60)
                }),
                sched_flags: Some(SchedFlags::default())
            }
        );
        assert_eq!(
            p("-A -t 198.18.1.1:443 -p").unwrap().request,
            Request::AddService {
                service: key(Protocol::Tcp, [198, 18, 1, 1], 443),
                scheduler: None,
                persistence: Some(Persistence::new(Persistence::DEFAULT_TIMEOUT_S)),
                sched_flags: None
            }
        );
        assert_eq!(
            p("-D -t 198.18.1.1:80").unwrap().request,
            Request::DeleteService {
                service: key(Protocol::Tcp, [198, 18, 1, 1], 80)
            }
        );
        assert_eq!(p("-C").unwrap().request, Request::Clear);
    }

    #[test]
    fn server_commands_default_like_ipvsadm() {
        let svc = key(Protocol::Tcp, [198, 18, 1, 1], 80);
        assert_eq!(
            p("-a -t 198.18.1.1:80 -r 198.18.0.11").unwrap().request,
            Request::AddServer {
                service: svc,
                server: RealServerSpec::new(
                    std::net::Ipv4Addr::from([198, 18, 0, 11]),
                    80,
                    1,
                    ForwardMode::Dr
                )
            }
        );
        assert_eq!(
            p("-e -t 198.18.1.1:80 -r 198.18.0.11:8080 -m -w 3 -x 100 -y 10")
                .unwrap()
                .request,
            Request::EditServer {
                service: svc,
                server: RealServerSpec::new(
                    std::net::Ipv4Addr::from([198, 18, 0, 11]),
                    8080,
                    3,
                    ForwardMode::Nat
                )
                .with_thresholds(100, 10)
            }
        );
        assert_eq!(
            p("-d -t 198.18.1.1:80 -r 198.18.0.11").unwrap().request,
            Request::DeleteServer {
                service: svc,
                ip: [198, 18, 0, 11].into(),
                port: 80
            }
        );
        assert_eq!(
            p("-a -t 198.18.1.1:80 -r 198.18.0.12 -i").unwrap().request,
            {
                Request::AddServer {
                    service: svc,
                    server: RealServerSpec::new(
                        std::net::Ipv4Addr::from([198, 18, 0, 12]),
                        80,
                        1,
                        ForwardMode::Tun,
                    ),
                }
            }
        );
    }

    #[test]
    fn values_attached_as_popt_reads_them() {
        let words = |line: &str| expand(&line.split(' ').map(String::from).collect::<Vec<_>>());
        assert_eq!(words("-w5"), ["-w", "5"]);
        assert_eq!(words("--weight=5"), ["--weight", "5"]);
        assert_eq!(words("-Lnt10.0.0.1:80"), ["-L", "-n", "-t", "10.0.0.1:80"]);
        assert_eq!(words("-p300 -p"), ["-p", "300", "-p"]);
        assert_eq!(words("-w -1x"), ["-w", "-1x"]);
        assert_eq!(words("-s -Ln"), ["-s", "-Ln"]);
        assert_eq!(words("-b -Ln"), ["-b", "-L", "-n"]);
        assert_eq!(words("-1 -6Ln"), ["-1", "-6", "-L", "-n"]);
        assert_eq!(words("--=x"), ["--=x"]);
        let attached = p("-a -t198.18.1.1:80 -r198.18.2.1:8080 -mw5 --u-threshold=7").unwrap();
        let separate = p("-a -t 198.18.1.1:80 -r 198.18.2.1:8080 -m -w 5 -x 7").unwrap();
        assert_eq!(attached.request, separate.request);
        assert_eq!(
            p("-A -t 198.18.1.1:80 --scheduler=wrr --persistent=60")
                .unwrap()
                .request,
            p("-A -t 198.18.1.1:80 -s wrr -p 60").unwrap().request
        );
    }

    #[test]
    fn listing_with_bundled_flags() {
        assert_eq!(p("-Ln").unwrap().output, Output::List { stats: false });
        let lnc = p("-Lnc").unwrap();
        assert_eq!(
            lnc.request,
            Request::ListConnections {
                max: None,
                page: None,
            }
        );
        assert_eq!(lnc.output, Output::Connections { persistent: false });
        assert_eq!(
            p("-Lnc --persistent-conn").unwrap().output,
            Output::Connections { persistent: true }
        );
        assert!(p("-A -t 198.18.1.1:80 -c")
            .unwrap_err()
            .contains("only applies to -L"));
        assert_eq!(
            p("-L -n --stats").unwrap().output,
            Output::List { stats: true }
        );
        assert_eq!(p("-Ln --thresholds").unwrap().output, Output::Thresholds);
        // ipvsadm takes several table formats and shows the first of stats, rate,
        // thresholds, persistent-conn (`print_title`'s if/else chain).
        for (line, output) in [
            ("-Ln --rate --stats", Output::List { stats: true }),
            ("-Ln --thresholds --stats", Output::List { stats: true }),
            (
                "-Ln --persistent-conn --stats",
                Output::List { stats: true },
            ),
            ("-Ln --thresholds --rate", Output::Rates),
            ("-Ln --persistent-conn --rate", Output::Rates),
            ("-Ln --persistent-conn --thresholds", Output::Thresholds),
            ("-Ln -t 198.18.1.1:80 --thresholds --rate", Output::Rates),
        ] {
            assert_eq!(p(line).unwrap().output, output, "{line}");
        }
        // ipvsadm: `fail(2, "options conflicts in the list command")` for a table
        // format with -c or --timeout, and for --persistent-conn with --timeout.
        for bad in [
            "-L -c --stats",
            "-Lnc --rate",
            "-Lnc --thresholds",
            "-L --timeout --stats",
            "-L --timeout --persistent-conn",
        ] {
            assert_eq!(
                p(bad).unwrap_err(),
                "options conflicts in the list command",
                "{bad}"
            );
        }
        for line in ["-L -c --timeout", "-L -c --timeout --stats"] {
            assert_eq!(
                p(line).unwrap_err(),
                "The option 'timeout' conflicts with the 'connection' option in the 'list' command"
            );
        }
        // An empty name is ipvsadm's default scheduler (`if (strlen(sched_name) == 0)
        // strcpy(sched_name, DEF_SCHED)`).
        let words = ["-A", "-t", "198.18.1.1:80", "-s", ""].map(String::from);
        assert!(matches!(
            parse(&words).unwrap().request,
            Request::AddService {
                scheduler: None,
                ..
            }
        ));
        assert!(is_command("-Ln") && is_command("-a") && is_command("--list"));
        assert!(!is_command("status") && !is_command("--json"));
        assert!(is_command("-S") && is_command("-Z") && is_command("-R") && is_command("--set"));
    }

    #[test]
    fn local_address_commands_in_dpvs_syntax() {
        let svc = key(Protocol::Tcp, [198, 18, 1, 1], 80);
        let lip = Ipv4Addr::new(198, 18, 0, 50);
        let add = Command {
            request: Request::AddLaddr {
                service: svc,
                ip: lip.into(),
            },
            output: Output::Quiet,
            listing: Listing::default(),
        };
        for line in [
            "--add-laddr -t 198.18.1.1:80 -z 198.18.0.50",
            "--add-laddr -z 198.18.0.50 -t 198.18.1.1:80 -F dpdk0",
            "-P -t 198.18.1.1:80 --laddr 198.18.0.50 --ifname lan0",
        ] {
            assert_eq!(p(line).unwrap(), add, "{line}");
        }
        let udp = key(Protocol::Udp, [198, 18, 1, 1], 53);
        assert_eq!(
            p("--del-laddr -u 198.18.1.1:53 -z 198.18.0.50 -F dpdk0").unwrap(),
            Command {
                request: Request::DelLaddr {
                    service: udp,
                    ip: lip.into()
                },
                output: Output::Quiet,
                listing: Listing::default(),
            }
        );
        assert_eq!(
            p("-Q -u 198.18.1.1:53 -z 198.18.0.50").unwrap().request,
            Request::DelLaddr {
                service: udp,
                ip: lip.into()
            }
        );
        for line in ["--get-laddr -t 198.18.1.1:80", "-G -t 198.18.1.1:80"] {
            assert_eq!(
                p(line).unwrap(),
                Command {
                    request: Request::GetLaddr { service: svc },
                    output: Output::Laddrs,
                    listing: Listing::default(),
                },
                "{line}"
            );
        }
        for arg in [
            "--add-laddr",
            "--del-laddr",
            "--get-laddr",
            "-P",
            "-Q",
            "-G",
        ] {
            assert!(is_command(arg), "{arg}");
        }
        assert!(!is_command("-z") && !is_command("-F") && !is_command("--laddr"));
    }

    #[test]
    fn bad_local_address_commands_are_named() {
        for (line, needle) in [
            ("--add-laddr -z 198.18.0.50", "needs a service"),
            (
                "--add-laddr -t 198.18.1.1:80",
                "needs a local address: -z LIP",
            ),
            (
                "--del-laddr -t 198.18.1.1:80 -F dpdk0",
                "needs a local address",
            ),
            (
                "--add-laddr -t 198.18.1.1:80 -z 198.18.0.300",
                "illegal local address \"198.18.0.300\"",
            ),
            (
                "--add-laddr -t 198.18.1.1:80 -z 198.18.0.50/32",
                "illegal local address",
            ),
            (
                "--add-laddr -t 198.18.1.1:80 -z",
                "option -z requires an argument",
            ),
            (
                "--add-laddr -t 198.18.1.1:80 -z 198.18.0.50 -F",
                "option -F requires an argument",
            ),
            ("--get-laddr", "needs a service"),
            (
                "--get-laddr -t 198.18.1.1:80 -z 198.18.0.50",
                "option -z only applies to --add-laddr and --del-laddr",
            ),
            (
                "-a -t 198.18.1.1:80 -r 198.18.0.11 --laddr 198.18.0.50",
                "option --laddr only applies",
            ),
            ("-A -t 198.18.1.1:80 -F dpdk0", "-F/--ifname only applies"),
            (
                "--add-laddr --del-laddr -t 198.18.1.1:80 -z 198.18.0.50",
                "only one command",
            ),
            ("-P -G -t 198.18.1.1:80", "-P, -Q, -G"),
        ] {
            let err = p(line).expect_err(line);
            assert!(err.contains(needle), "{line}: {err}");
        }
    }

    /// An option the command does not take is refused, whatever the program is
    /// called, in ipvsadm's words (its `commands_v_options` 'x' entries), and so is
    /// the same line in a restore file: nothing of it acts.
    #[test]
    fn options_the_command_does_not_take_are_refused() {
        const S: &str = "-t 198.18.1.1:80";
        const R: &str = "-r 198.18.0.11:80";
        for (line, option, command) in [
            (format!("-C {S}"), "service-address", "flush"),
            (format!("-D {S} -s rr"), "scheduler", "delete-service"),
            ("-Z -s rr".to_string(), "scheduler", "zero"),
            (format!("-A {S} -w 5"), "weight", "add-service"),
            (format!("-A {S} {R}"), "real-server", "add-service"),
            (format!("-A {S} -m"), "forwarding-method", "add-service"),
            (format!("-E {S} -x 5"), "u-threshold", "edit-service"),
            (format!("-a {S} {R} -s rr"), "scheduler", "add-server"),
            (format!("-a {S} {R} -p 60"), "persistent", "add-server"),
            (format!("-d {S} {R} -w 5"), "weight", "delete-server"),
            (format!("-e {S} {R} -n"), "numeric", "edit-server"),
            ("-L -w 3".to_string(), "weight", "list"),
            ("-S -y 1".to_string(), "l-threshold", "save"),
            ("--set 1 2 3 -n".to_string(), "numeric", "set"),
            ("-R -n".to_string(), "numeric", "restore"),
            (format!("--rate-limit 5 {S} -w 1"), "weight", "rate-limit"),
            (format!("-P {S} -z 198.18.0.50 -w 1"), "weight", "add-laddr"),
            // ipvsadm 1.31's save words, where ipvsadm refuses them.
            ("-C --tun-type ipip".to_string(), "tun-type", "flush"),
            (
                format!("-D {S} --tun-type ipip"),
                "tun-type",
                "delete-service",
            ),
            ("-C -b flag-1".to_string(), "sched-flags", "flush"),
            (
                format!("-d {S} {R} -b flag-1"),
                "sched-flags",
                "delete-server",
            ),
            (
                format!("-a {S} {R} -m -b flag-2"),
                "sched-flags",
                "add-server",
            ),
            (
                format!("-e {S} {R} --sched-flags sh-port"),
                "sched-flags",
                "edit-server",
            ),
        ] {
            let want = format!("Illegal '{option}' option with the '{command}' command");
            assert_eq!(p(&line).map(|_| ()), Err(want.clone()), "{line}");
            assert_eq!(restore_line(&line).map(|_| ()), Err(want), "{line}");
        }
        // What the commands do take still parses.
        for line in [
            format!("-A {S} -s rr -p 60 -M 255.255.255.0 -b sh-port"),
            format!("-a {S} {R} -m -w 3 -x 10 -y 5"),
            format!("-d {S} {R}"),
            format!("-Z {S}"),
            "-C".to_string(),
            "-Ln --stats --nosort --exact".to_string(),
            "-S -n".to_string(),
            "-R --atomic".to_string(),
            format!("-a {S} {R} -i --tun-type ipip"),
            format!("-a {S} {R} -b -w 2"),
        ] {
            assert!(p(&line).is_ok(), "{line}: {:?}", p(&line).err());
        }
    }

    /// ipvsadm 1.31 writes `--tun-type ipip` and `-b flag-N`; they are taken only
    /// where ipvsadm takes them, never dropped to leave a line ipvsadm refuses.
    #[test]
    fn save_words_are_taken_only_where_ipvsadm_takes_them() {
        const A: &str = "-a -t 198.18.1.1:80 -r 198.18.0.11:80";
        for line in [
            format!("{A} --tun-type ipip"),
            format!("{A} -m --tun-type ipip"),
        ] {
            assert_eq!(
                restore_line(&line).map(|_| ()),
                Err("Tunnel options conflict with forward method".to_string()),
                "{line}"
            );
        }
        assert_eq!(
            p(&format!("{A} -i --tun-type ipip --tun-type ipip")).map(|_| ()),
            Err("multiple 'tun-type' options specified".to_string())
        );
        assert_eq!(
            p(&format!("{A} -i --tun-type vxlan")).map(|_| ()),
            Err("illegal tunnel type specified".to_string())
        );
        // `strcmp` of each name `strtok` leaves: no flag-9, no space.
        for flags in ["flag-9", "sh-port, sh-fallback", "sh-port,nope"] {
            let args: Vec<String> = ["-A", "-t", "198.18.1.1:80", "-s", "sh", "-b", flags]
                .map(String::from)
                .to_vec();
            let err = parse(&args).unwrap_err();
            assert!(
                err.starts_with("invalid scheduler flag `"),
                "{flags}: {err}"
            );
        }
        // Empty names are skipped, as `strtok` skips them.
        assert_eq!(
            p("-A -t 198.18.1.1:80 -s sh -b sh-port,,flag-1,").map(|c| c.request),
            p("-A -t 198.18.1.1:80 -s sh -b sh-port,sh-fallback").map(|c| c.request)
        );
    }

    /// Connection thresholds stop at ipvsadm's `INT_MAX`: a saved table with a larger
    /// one would stop ipvsadm's restore at that line.
    #[test]
    fn thresholds_above_int_max_are_refused() {
        const A: &str = "-a -t 198.18.1.1:80 -r 198.18.0.11:80 -m";
        assert!(p(&format!("{A} -x 2147483647 -y 2147483647")).is_ok());
        for option in ["-x", "-y"] {
            let err = p(&format!("{A} {option} 2147483648")).unwrap_err();
            assert!(err.contains("threshold"), "{option}: {err}");
        }
    }

    #[test]
    fn bad_input_is_named() {
        for (line, needle) in [
            ("-A", "needs a service"),
            ("-A -t 198.18.1.300:80", "illegal virtual server address"),
            // All digits: no address for ipvsadm (a lookup would give 0.0.31.144).
            ("-A -t 8080", "illegal virtual server address"),
            (
                "-a -t 198.18.1.5:80 -r 8080 -m",
                "illegal real server address",
            ),
            (
                "-A -t 198.18.1.1:80 -s nosuch",
                "unknown scheduler \"nosuch\"",
            ),
            ("-a -t 198.18.1.1:80", "needs a real server"),
            (
                "-a -t 198.18.1.1:80 -r 198.18.0.11 -w 70000",
                "illegal weight \"70000\"",
            ),
            (
                "-a -t 198.18.1.1:80 -r 198.18.0.11 -w",
                "requires an argument",
            ),
            ("-A -D -t 198.18.1.1:80", "only one command"),
            ("-A -t 198.18.1.1:80 -p -M 255.0.0.300", "illegal netmask"),
            ("-S -X", "-X/--exact only applies to -L"),
            (
                "-L --timeout --persistent-conn",
                "options conflicts in the list",
            ),
            ("-S --stats", "--stats only applies to -L"),
            ("-L --bogus", "unknown or unsupported option \"--bogus\""),
            ("-n", "no command given"),
            (
                "-a -t 198.18.1.1:80 -r 198.18.0.11 -w 1 -w 2",
                "multiple 'weight' options specified",
            ),
            (
                "-a -t 198.18.1.1:80 -r 198.18.0.11 -m -g",
                "multiple 'forwarding-method' options specified",
            ),
            (
                "-A -t 198.18.1.1:80 -u 198.18.1.1:53",
                "multiple 'service-address' options specified",
            ),
            ("-A -t 198.18.1.1:80 -s rr -s wrr", "multiple 'scheduler'"),
            (
                "-e -t 198.18.1.1:80 -r 198.18.0.11 -r 198.18.0.12",
                "multiple 'real-server'",
            ),
            (
                "-a -t 198.18.1.1:80 -r 198.18.0.11 -x 5 -x 6",
                "multiple 'u-threshold'",
            ),
            ("-A -t 198.18.1.1:80 -p 60 -p 90", "multiple 'persistent'"),
            ("-L -n --stats --stats", "multiple 'stats'"),
            ("-S --replace", "--replace only applies to -R"),
            ("-R --replace --replace", "multiple 'replace'"),
        ] {
            let err = p(line).expect_err(line);
            assert!(err.contains(needle), "{line}: {err}");
        }
    }

    #[test]
    fn access_list_and_rate_limit_commands() {
        let svc = ServiceKey::new(Protocol::Tcp, Ipv4Addr::new(198, 18, 1, 1), 80);
        let prefix = |s: &str| s.parse::<Prefix>().unwrap();
        assert_eq!(
            p("--acl-add -t 198.18.1.1:80 --deny 198.18.5.0/24,198.18.6.0/24").unwrap(),
            Command {
                request: Request::AclAdd {
                    service: svc,
                    action: AclAction::Deny,
                    prefixes: vec![prefix("198.18.5.0/24"), prefix("198.18.6.0/24")],
                },
                output: Output::Quiet,
                listing: Listing::default(),
            }
        );
        assert_eq!(
            p("--acl-del -t 198.18.1.1:80 --allow 10.0.0.1")
                .unwrap()
                .request,
            Request::AclDel {
                service: svc,
                prefixes: vec![prefix("10.0.0.1/32")],
            }
        );
        assert_eq!(
            p("--acl-list -t 198.18.1.1:80").unwrap().output,
            Output::Admission
        );
        assert_eq!(
            p("--acl-list").unwrap(),
            Command {
                request: Request::ListServices,
                output: Output::AdmissionAll,
                listing: Listing::default(),
            }
        );
        assert_eq!(
            p("-S -n").unwrap(),
            Command {
                request: Request::SaveServices,
                output: Output::Save,
                listing: Listing::default(),
            }
        );
        for line in [
            "--acl-load -t 198.18.1.1:80 /etc/sluice/lists/web.acl",
            "--acl-load /etc/sluice/lists/web.acl -t 198.18.1.1:80",
        ] {
            assert_eq!(
                p(line).unwrap(),
                Command {
                    request: Request::AclClear { service: svc },
                    output: Output::AclLoad {
                        path: "/etc/sluice/lists/web.acl".into()
                    },
                    listing: Listing::default(),
                },
                "{line}"
            );
        }
        assert_eq!(
            p("--rate-limit 50 --burst 100 --per-prefix 24 -t 198.18.1.1:80")
                .unwrap()
                .request,
            Request::SetRateLimit {
                service: svc,
                limit: Some(RateLimit::new(50, 100, 24).unwrap()),
            }
        );
        assert_eq!(
            p("--rate-limit 0 -t 198.18.1.1:80").unwrap().request,
            Request::SetRateLimit {
                service: svc,
                limit: None
            }
        );
        for (line, needle) in [
            ("--acl-add -t 198.18.1.1:80", "needs --allow"),
            (
                "--acl-add -t 198.18.1.1:80 --allow 10.0.0.0/8 --deny 11.0.0.0/8",
                "not both",
            ),
            ("--acl-add -t 198.18.1.1:80 --deny 10.1.0.0/8", "host bits"),
            ("--acl-del -t 198.18.1.1:80", "needs the prefixes"),
            ("--acl-load -t 198.18.1.1:80", "needs a file"),
            ("-L -n --deny 10.0.0.0/8", "only apply to --acl-add"),
            ("--rate-limit 10 --burst 500 -t 198.18.1.1:80", "burst 500"),
            (
                "--acl-add --burst 5 -t 198.18.1.1:80 --deny 10.0.0.0/8",
                "only apply to --rate-limit",
            ),
        ] {
            let error = p(line).unwrap_err();
            assert!(error.contains(needle), "{line}: {error}");
        }
    }

    #[test]
    fn direct_routing_and_tunnels_take_the_service_port_as_ipvsadm() {
        let svc = key(Protocol::Tcp, [198, 18, 1, 1], 80);
        for (line, mode) in [
            ("-a -t 198.18.1.1:80 -r 198.18.0.2:8080 -g", ForwardMode::Dr),
            ("-a -t 198.18.1.1:80 -r 198.18.0.2:8080", ForwardMode::Dr),
            (
                "-e -t 198.18.1.1:80 -r 198.18.0.2:8080 -i",
                ForwardMode::Tun,
            ),
        ] {
            let server =
                RealServerSpec::new(std::net::Ipv4Addr::from([198, 18, 0, 2]), 80, 1, mode);
            let request = p(line).unwrap().request;
            assert!(
                request
                    == Request::AddServer {
                        service: svc,
                        server
                    }
                    || request
                        == Request::EditServer {
                            service: svc,
                            server
                        },
                "{line}: {request:?}"
            );
        }
        // NAT maps ports; -d names the server it deletes.
        let nat = p("-a -t 198.18.1.1:80 -r 198.18.0.2:8080 -m")
            .unwrap()
            .request;
        assert!(matches!(nat, Request::AddServer { server, .. } if server.port == 8080));
        assert_eq!(
            p("-d -t 198.18.1.1:80 -r 198.18.0.2:8080").unwrap().request,
            Request::DeleteServer {
                service: svc,
                ip: [198, 18, 0, 2].into(),
                port: 8080
            }
        );
    }

    #[test]
    fn one_service_is_listed_and_zeroed_with_t() {
        let svc = key(Protocol::Tcp, [198, 18, 1, 1], 80);
        let listed = p("-L -n -t 198.18.1.1:80").unwrap();
        assert_eq!(listed.request, Request::ListServices);
        assert_eq!(
            listed.listing,
            Listing {
                only: Some(svc),
                nosort: false,
                exact: false
            }
        );
        assert!(p("-Ln --nosort").unwrap().listing.nosort);
        assert!(p("-Ln --sort").is_ok());
        assert_eq!(
            p("-Z -t 198.18.1.1:80").unwrap().request,
            Request::ZeroService { service: svc }
        );
        assert_eq!(p("-Z").unwrap().request, Request::ZeroServices);
        assert_eq!(
            p("-Lnc -t 198.18.1.1:80").unwrap_err(),
            "The option 'service-address' conflicts with the 'connection' option in the 'list' command"
        );
    }

    #[test]
    fn port_names_come_from_etc_services() {
        let services =
            "http\t\t80/tcp\t\twww # WorldWideWeb HTTP\ndomain\t\t53/tcp\ndomain\t\t53/udp\n";
        assert_eq!(service_port(services, "tcp", "http"), Some(80));
        assert_eq!(service_port(services, "tcp", "www"), Some(80));
        assert_eq!(service_port(services, "udp", "domain"), Some(53));
        assert_eq!(service_port(services, "udp", "http"), None);
    }

    /// Lines as ipvsadm 1.31's `print_service_entry` and `print_tunnel_rule` write
    /// them (`"-A %s -s %s"`, `" -p %u"`, `" --pe %s"`, `" -o"`, `" -b "`, `"-a %s -r
    /// %s %s -w %d --tun-type %s\n"`).
    #[test]
    fn restore_lines_accept_what_sluice_honours_and_name_the_rest() {
        let apply = |line: &str| match restore_line(line).unwrap() {
            RestoreLine::Apply(c) => c.request,
            other => panic!("{line}: {other:?}"),
        };
        let unsupported = |line: &str| match restore_line(line).unwrap() {
            RestoreLine::Unsupported(what) => what,
            other => panic!("{line}: {other:?}"),
        };
        assert_eq!(
            restore_line("# saved by ipvsadm").unwrap(),
            RestoreLine::Nothing
        );
        assert_eq!(restore_line("   ").unwrap(), RestoreLine::Nothing);
        assert_eq!(
            apply("ipvsadm -A -t 198.18.1.1:80 -s wlc # web"),
            apply("-A -t 198.18.1.1:80 -s wlc")
        );
        assert_eq!(
            apply("-a -t 198.18.1.1:80 -r 198.18.0.5:80 -i -w 1 --tun-type ipip"),
            apply("-a -t 198.18.1.1:80 -r 198.18.0.5:80 -i -w 1")
        );
        assert_eq!(
            apply("-A -t 198.18.1.1:80 -s rr -b flag-1,flag-3"),
            apply("-A -t 198.18.1.1:80 -s rr")
        );
        assert_eq!(
            apply("-A -t 198.18.1.1:80 -s sh -b flag-1,flag-2"),
            apply("-A -t 198.18.1.1:80 -s sh -b sh-fallback,sh-port")
        );
        assert_eq!(
            apply("-A -t 198.18.1.1:http -s wlc"),
            apply("-A -t 198.18.1.1:80 -s wlc")
        );
        for (line, named) in [
            ("-A -f 1 -s wlc", "-f 1: fwmark services"),
            ("-a -f 1 -r 198.18.0.5:0 -g -w 1", "-f 1"),
            ("-A --sctp-service 198.18.1.1:5060 -s rr", "--sctp-service 198.18.1.1:5060"),
            ("-A -u 198.18.1.1:53 -s rr -o", "-o: one-packet scheduling"),
            ("-A -u 198.18.1.1:5060 -s rr -p 360 --pe sip", "--pe sip"),
            ("-A -t 198.18.1.1:80 -s ovf", "-s ovf"),
            ("-A -t 198.18.1.1:80 -s nosuch", "-s nosuch: no scheduler is called \"nosuch\""),
            (
                "-a -t 198.18.1.1:80 -r 198.18.0.5:80 -i -w 1 --tun-type gue --tun-port 6080 --tun-nocsum",
                "--tun-type gue",
            ),
        ] {
            let what = unsupported(line);
            assert!(what.starts_with(named), "{line}: {what}");
        }
        // What ipvsadm itself refuses is an error.
        assert!(restore_line("-A -t").is_err());
        let missing = restore_line("-A -t 198.18.1.1:80 -s").unwrap_err();
        assert!(missing.contains("-s"), "{missing}");
        assert!(restore_line("-A -t 198.18.1.1:80 -w 1").is_err());
    }

    #[test]
    fn an_ipv6_service_takes_a_prefix_length_as_its_netmask() {
        let persistence = |line: &str| match p(line).map(|c| c.request) {
            Ok(Request::AddService { persistence, .. }) => Ok(persistence),
            Ok(other) => panic!("{line}: {other:?}"),
            Err(e) => Err(e),
        };
        // ipvsadm 1.31, `case 'M'`: after an IPv6 service `ce->svc.netmask =
        // atoi(optarg)`, 1..128.
        let v6 = "-A -t [2001:db8::1]:80 -s rr -p 60";
        assert_eq!(
            persistence(&format!("{v6} -M 64")),
            Ok(Some(Persistence::with_prefix6(60, 64)))
        );
        assert_eq!(
            persistence(v6),
            Ok(Some(Persistence::with_prefix6(60, 128)))
        );
        assert_eq!(
            persistence("-A -u [2001:db8::1]:53 -p 60 --netmask 1"),
            Ok(Some(Persistence::with_prefix6(60, 1)))
        );
        for bad in ["0", "129", "255.255.255.0", "abc"] {
            let err = persistence(&format!("{v6} -M {bad}")).unwrap_err();
            assert!(
                err.starts_with("illegal ipv6 netmask specified"),
                "{bad}: {err}"
            );
        }
        // `parse_service` sets an IPv6 service's netmask to 128: a `-M` before the
        // service no longer counts.
        assert_eq!(
            persistence("-A -M 64 -t [2001:db8::1]:80 -p 60"),
            Ok(Some(Persistence::with_prefix6(60, 128)))
        );
        // An IPv4 service's stays a dotted netmask.
        assert_eq!(
            persistence("-A -t 198.18.1.1:80 -p 60 -M 255.255.0.0"),
            Ok(Some(Persistence {
                netmask: Ipv4Addr::new(255, 255, 0, 0),
                ..Persistence::new(60)
            }))
        );
        assert!(persistence("-A -t 198.18.1.1:80 -p 60 -M 64")
            .unwrap_err()
            .contains("illegal netmask"));
    }

    #[test]
    fn smaller_ipvsadm_behaviours() {
        let svc = key(Protocol::Tcp, [198, 18, 1, 1], 80);
        // `-M` without `-p`: ipvsadm takes the mask, which only counts with persistence.
        assert_eq!(
            p("-A -t 198.18.1.1:80 -s rr -M 255.255.255.0")
                .unwrap()
                .request,
            Request::AddService {
                service: svc,
                scheduler: Some(SchedulerKind::Rr),
                persistence: None,
                sched_flags: None
            }
        );
        // `-E` without `-s`: ipvsadm's `process_options` sets `DEF_SCHED` ("wlc"),
        // and without `-b` the flags are 0.
        assert_eq!(
            p("-E -t 198.18.1.1:80 -p 60").unwrap().request,
            Request::EditService {
                service: svc,
                scheduler: Some(SchedulerKind::Wlc),
                persistence: Some(Persistence::new(60)),
                sched_flags: Some(SchedFlags::default())
            }
        );
        // `-E --synproxy` alone still changes only the SYN proxy.
        assert!(matches!(
            p("-E -t 198.18.1.1:80 --synproxy on").unwrap().request,
            Request::SetSynproxy { .. }
        ));
        // No port: port 0, ipvsadm's all-ports service (the daemon names why it
        // refuses one); a port name from /etc/services.
        assert!(matches!(
            p("-A -t 198.18.1.1 -p").unwrap().request,
            Request::AddService { service, .. } if service == key(Protocol::Tcp, [198, 18, 1, 1], 0)
        ));
        // ipvsadm's `parse_service` reads a bare IPv6 address whole: port 0.
        let v6: std::net::IpAddr = "2001:db8::1:80".parse().unwrap();
        assert!(matches!(
            p("-A -t 2001:db8::1:80 -p").unwrap().request,
            Request::AddService { service, .. } if service == ServiceKey::new(Protocol::Tcp, v6, 0)
        ));
        // -X and the listing options.
        assert!(p("-Ln --stats -X").unwrap().listing.exact);
        assert!(p("-Ln --rate --exact").unwrap().listing.exact);
        assert!(!p("-Ln --stats").unwrap().listing.exact);
        assert!(p("-LnX").unwrap().listing.exact);
        assert_eq!(
            p("-Ln --persistent-conn").unwrap().output,
            Output::PersistentConns
        );
        assert!(p("-Ln --sort --nosort --thresholds").is_ok());
    }

    #[test]
    fn ipv6_addresses_in_brackets_with_a_port() {
        let vip: std::net::IpAddr = "2001:db8::1".parse().unwrap();
        let rip: std::net::IpAddr = "2001:db8:1::2".parse().unwrap();
        let svc = ServiceKey::new(Protocol::Tcp, vip, 80);
        let cmd = p("-A -t [2001:db8::1]:80 -s rr").unwrap();
        assert!(matches!(cmd.request, Request::AddService { service, .. } if service == svc));
        for (line, port) in [
            ("-a -t [2001:db8::1]:80 -r [2001:db8:1::2]:8080 -m", 8080),
            ("-a -t [2001:db8::1]:80 -r 2001:db8:1::2 -m", 80),
        ] {
            let Request::AddServer { service, server } = p(line).unwrap().request else {
                panic!("{line}");
            };
            assert_eq!(
                (service, server.ip, server.port),
                (svc, rip, port),
                "{line}"
            );
        }
        let Request::AddLaddr { ip, .. } = p("-P -t [2001:db8::1]:80 -z 2001:db8:2::1")
            .unwrap()
            .request
        else {
            panic!()
        };
        assert_eq!(ip, "2001:db8:2::1".parse::<std::net::IpAddr>().unwrap());
        for (line, needle) in [
            ("-A -t [2001:db8::1:80", "illegal virtual server address"),
            ("-A -t [2001:db8::1]80", "illegal virtual server address"),
            ("-A -t [2001:db8::zz]:80", "illegal virtual server address"),
            // Brackets only before a port, as ipvsadm's `parse_service`.
            ("-A -t [2001:db8::1] -p", "illegal virtual server address"),
            (
                "-a -t [2001:db8::1]:80 -r [2001:db8:1::2] -m",
                "illegal real server address",
            ),
            ("-A -t [198.18.1.1]:80", "illegal virtual server address"),
        ] {
            let err = p(line).unwrap_err();
            assert!(err.contains(needle), "{line}: {err}");
        }
    }
}
