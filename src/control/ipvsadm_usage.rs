//! ipvsadm 1.31's own checks of a command line, with its words and exit statuses, for
//! `sluicectl` called as `ipvsadm`. A port of what ipvsadm does before it talks to the
//! kernel: popt's option parsing (`parse_options`), the value checks made as each
//! option is read (`fail(2, ...)`), the table of legal command and option
//! combinations (`commands_v_options`, `generic_opt_check`) and the checks of
//! `process_options`. The messages are ipvsadm.c's format strings, filled in as it
//! fills them.
//!
//! A line whose command is one of Sluice's own (FullNAT local addresses, access lists,
//! rate limits) is not ipvsadm's and is left to [`super::ipvsadm::parse`], which names
//! what is wrong in Sluice's words. Sluice's own options on ipvsadm's commands (the
//! SYN proxy, `-R --atomic`, DPVS's FullNAT `-b` on a real server) are stepped over:
//! every other word of the line is still judged as ipvsadm judges it, so an extension
//! never lets through what ipvsadm refuses.
use super::ipvsadm::{expand, resolve_host, resolve_port};
use crate::model::{Protocol, SchedulerKind};
use std::net::Ipv6Addr;

/// Why ipvsadm would refuse the command line: what it prints on stderr (its whole
/// text, newlines included) and its exit status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    pub message: String,
    pub status: u8,
}

/// ipvsadm's `fail(2, fmt, ...)`: the message, a newline, exit status 2.
fn fail(message: impl Into<String>) -> Refusal {
    Refusal {
        message: message.into() + "\n",
        status: 2,
    }
}

/// ipvsadm's `tryhelp_exit(argv[0], -1)`: for a line whose first option is not a
/// command.
pub fn tryhelp(program: &str) -> Refusal {
    Refusal {
        message: format!("Try `{program} -h' or '{program} --help' for more information.\n"),
        status: 255,
    }
}

/// ipvsadm's `cmdnames`, in its `CMD_*` order.
const CMDNAMES: [&str; 14] = [
    "add-service",
    "edit-service",
    "delete-service",
    "flush",
    "list",
    "add-server",
    "delete-server",
    "edit-server",
    "set",
    "start-daemon",
    "stop-daemon",
    "restore",
    "save",
    "zero",
];

/// ipvsadm's `optnames`, in its `OPTC_*` order.
const OPTNAMES: [&str; 34] = [
    "numeric",
    "connection",
    "service-address",
    "scheduler",
    "persistent",
    "netmask",
    "real-server",
    "forwarding-method",
    "weight",
    "u-threshold",
    "l-threshold",
    "mcast-interface",
    "timeout",
    "daemon",
    "stats",
    "rate",
    "thresholds",
    "persistent-conn",
    "nosort",
    "syncid",
    "exact",
    "ops",
    "pe",
    "sched-flags",
    "mcast-group",
    "mcast-port",
    "mcast-ttl",
    "sync-maxlen",
    "tun-info",
    "tun-type",
    "tun-port",
    "tun-nocsum",
    "tun-csum",
    "tun-remcsum",
];

/// ipvsadm 1.31's `commands_v_options`, row by command (`CMDNAMES`), column by option
/// (`OPTNAMES`): `+` compulsory, `x` illegal, `1` exclusive, ` ` optional.
const COMMANDS_V_OPTIONS: [&[u8; 34]; 14] = [
    b"xx+   xxxxxxxxxxxxxxx   xxxxxxxxxx", // ADD
    b"xx+   xxxxxxxxxxxxxxx   xxxxxxxxxx", // EDIT
    b"xx+xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", // DEL
    b"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", // FLUSH
    b" 11xxxxxxxxx11       xxxxxxx xxxxx", // LIST
    b"xx+xxx+    xxxxxxxxxxxxxxxxxx     ", // ADDSRV
    b"xx+xxx+xxxxxxxxxxxxxxxxxxxxxxxxxxx", // DELSRV
    b"xx+xxx+    xxxxxxxxxxxxxxxxxx     ", // EDITSRV
    b"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", // TIMEOUT
    b"xxxxxxxxxxx xxxxxxx xxxx    xxxxxx", // STARTD
    b"xxxxxxxxxxxxxxxxxxx xxxxxxxxxxxxxx", // STOPD
    b"xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", // RESTORE
    b" xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", // SAVE
    b"xx xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", // ZERO
];

/// Whether ipvsadm's `commands_v_options` lets `command` (a `CMDNAMES` name) take
/// `option` (an `OPTNAMES` name): `None` when either is not ipvsadm's.
pub fn allows(command: &str, option: &str) -> Option<bool> {
    let row = CMDNAMES.iter().position(|&c| c == command)?;
    let column = OPTNAMES.iter().position(|&o| o == option)?;
    Some(COMMANDS_V_OPTIONS[row][column] != b'x')
}

// Indexes into `CMDNAMES`.
const ADD: usize = 0;
const EDIT: usize = 1;
const LIST: usize = 4;
const ADDDEST: usize = 5;
const EDITDEST: usize = 7;
const TIMEOUT_CMD: usize = 8;

// Indexes into `OPTNAMES`.
const O_CONNECTION: usize = 1;
const O_FORWARD: usize = 7;
const O_TIMEOUT: usize = 12;
const O_DAEMON: usize = 13;
const O_STATS: usize = 14;
const O_RATE: usize = 15;
const O_THRESHOLDS: usize = 16;
const O_PERSISTENTCONN: usize = 17;
const O_ONEPACKET: usize = 21;
const O_TUN_TYPE: usize = 29;
const O_TUN_PORT: usize = 30;
const O_TUN_NOCSUM: usize = 31;
const O_TUN_CSUM: usize = 32;
const O_TUN_REMCSUM: usize = 33;

/// ipvsadm's `-h` (`usage_exit(argv[0], 0)`): its version line, then its usage text as
/// 1.31 prints it, with `program` where it prints `argv[0]`. The schedulers are the
/// ones 1.31's `SCHEDULERS` file lists, all of which Sluice has except `ovf`.
pub fn help(program: &str, version_line: &str) -> String {
    let mut text = String::from(version_line);
    text.push_str("Usage:\n");
    for form in [
        "-A|E virtual-service [-s scheduler] [-p [timeout]] [-M netmask] [--pe persistence_engine] [-b sched-flags]",
        "-D virtual-service",
        "-C",
        "-R",
        "-S [-n]",
        "-a|e virtual-service -r server-address [options]",
        "-d virtual-service -r server-address",
        "-L|l [virtual-service] [options]",
        "-Z [virtual-service]",
        "--set tcp tcpfin udp",
        "--start-daemon {master|backup} [daemon-options]",
        "--stop-daemon {master|backup}",
        "-h",
    ] {
        text.push_str(&format!("  {program} {form}\n"));
    }
    text.push('\n');
    text.push_str(HELP_BODY);
    text
}

/// The rest of `usage_exit`'s text, with `SCHEDULERS`, `PE_LIST`, `DEF_SCHED` and
/// `DEF_TUNNEL_TYPE` filled in as 1.31's Makefile and ipvsadm.c define them.
const HELP_BODY: &str = "Commands:
Either long or short options are allowed.
  --add-service     -A        add virtual service with options
  --edit-service    -E        edit virtual service with options
  --delete-service  -D        delete virtual service
  --clear           -C        clear the whole table
  --restore         -R        restore rules from stdin
  --save            -S        save rules to stdout
  --add-server      -a        add real server with options
  --edit-server     -e        edit real server with options
  --delete-server   -d        delete real server
  --list            -L|-l     list the table
  --zero            -Z        zero counters in a service or all services
  --set tcp tcpfin udp        set connection timeout values
  --start-daemon              start connection sync daemon
  --stop-daemon               stop connection sync daemon
  --help            -h        display this help message

virtual-service:
  --tcp-service|-t  service-address   service-address is host[:port]
  --udp-service|-u  service-address   service-address is host[:port]
  --sctp-service    service-address   service-address is host[:port]
  --fwmark-service|-f fwmark          fwmark is an integer greater than zero

Options:
  --ipv6         -6                   fwmark entry uses IPv6
  --scheduler    -s scheduler         one of rr|wrr|lc|wlc|lblc|lblcr|dh|sh|sed|nq|fo|ovf|mh,
                                      the default scheduler is wlc.
  --pe            engine              alternate persistence engine may be sip,
                                      not set by default.
  --persistent   -p [timeout]         persistent service
  --netmask      -M netmask           persistent granularity mask
  --real-server  -r server-address    server-address is host (and port)
  --gatewaying   -g                   gatewaying (direct routing) (default)
  --ipip         -i                   ipip encapsulation (tunneling)
  --masquerading -m                   masquerading (NAT)
  --tun-type      type                one of ipip|gue|gre,
                                      the default tunnel type is ipip.
  --tun-port      port                tunnel destination port
  --tun-nocsum                        tunnel encapsulation without checksum
  --tun-csum                          tunnel encapsulation with checksum
  --tun-remcsum                       tunnel encapsulation with remote checksum
  --weight       -w weight            capacity of real server
  --u-threshold  -x uthreshold        upper threshold of connections
  --l-threshold  -y lthreshold        lower threshold of connections
  --connection   -c                   output of current IPVS connections
  --timeout                           output of timeout (tcp tcpfin udp)
  --daemon                            output of daemon information
  --stats                             output of statistics information
  --rate                              output of rate information
  --exact                             expand numbers (display exact values)
  --thresholds                        output of thresholds information
  --persistent-conn                   output of persistent connection info
  --tun-info                          output of tunnel information
  --nosort                            disable sorting output of service/server entries
  --sort                              does nothing, for backwards compatibility
  --ops          -o                   one-packet scheduling
  --numeric      -n                   numeric output of addresses and ports
  --sched-flags  -b flags             scheduler flags (comma-separated)
Daemon Options:
  --syncid sid                        syncid for connection sync (default=255)
  --sync-maxlen length                Max sync message length (default=1472)
  --mcast-interface interface         multicast interface for connection sync
  --mcast-group address               IPv4/IPv6 group (default=224.0.0.81)
  --mcast-port port                   UDP port (default=8848)
  --mcast-ttl ttl                     Multicast TTL (default=1)
";

/// `MAX_TIMEOUT`: 31 days.
const MAX_TIMEOUT: i64 = 86400 * 31;
/// `INT_MAX`, the thresholds' bound.
const INT_MAX: i64 = i32::MAX as i64;

/// The command an option word starts, as ipvsadm's first `poptGetNextOpt` reads it.
fn command_index(word: &str) -> Option<usize> {
    Some(match word {
        "-A" | "--add-service" => ADD,
        "-E" | "--edit-service" => EDIT,
        "-D" | "--delete-service" => 2,
        "-C" | "--clear" => 3,
        "-L" | "-l" | "--list" => LIST,
        "-a" | "--add-server" => ADDDEST,
        "-d" | "--delete-server" => 6,
        "-e" | "--edit-server" => EDITDEST,
        "--set" => TIMEOUT_CMD,
        "--start-daemon" => 9,
        "--stop-daemon" => 10,
        "-R" | "--restore" => 11,
        "-S" | "--save" => 12,
        "-Z" | "--zero" => 13,
        _ => return None,
    })
}

/// How an option takes its value in ipvsadm's popt table.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Arg {
    None,
    Required,
    /// `POPT_ARGFLAG_OPTIONAL`: the next word, unless it starts with '-'.
    Optional,
}

/// An option after the command: its `OPTC_*` index (`None` for `--sort`, which sets
/// nothing, and `-6`), and how it takes a value.
fn option(word: &str) -> Option<(Option<usize>, Arg)> {
    use Arg::*;
    let (index, arg) = match word {
        "-n" | "--numeric" => (0, None),
        "-c" | "--connection" => (1, None),
        "-t" | "--tcp-service" | "-u" | "--udp-service" | "--sctp-service" | "-f"
        | "--fwmark-service" => (2, Required),
        "-s" | "--scheduler" => (3, Required),
        "-p" | "--persistent" => (4, Optional),
        "-M" | "--netmask" => (5, Required),
        "-r" | "--real-server" => (6, Required),
        "-g" | "--gatewaying" | "-m" | "--masquerading" | "-i" | "--ipip" => (7, None),
        "-w" | "--weight" => (8, Required),
        "-x" | "--u-threshold" => (9, Required),
        "-y" | "--l-threshold" => (10, Required),
        "--mcast-interface" => (11, Required),
        "--timeout" => (12, None),
        "--daemon" => (13, None),
        "--stats" => (14, None),
        "--rate" => (15, None),
        "--thresholds" => (16, None),
        "--persistent-conn" => (17, None),
        "--nosort" => (18, None),
        "--syncid" => (19, Required),
        "-X" | "--exact" => (20, None),
        "-o" | "--ops" => (21, None),
        "--pe" => (22, Required),
        "-b" | "--sched-flags" => (23, Required),
        "--mcast-group" => (24, Required),
        "--mcast-port" => (25, Required),
        "--mcast-ttl" => (26, Required),
        "--sync-maxlen" => (27, Required),
        "--tun-info" => (28, None),
        "--tun-type" => (29, Required),
        "--tun-port" => (30, Required),
        "--tun-nocsum" => (31, None),
        "--tun-csum" => (32, None),
        "--tun-remcsum" => (33, None),
        "--sort" | "-6" | "--ipv6" => return Some((Option::None, None)),
        _ => return Option::None,
    };
    Some((Some(index), arg))
}

/// Sluice's own commands: a line that starts with one is Sluice's alone to judge.
fn is_sluice_command(word: &str) -> bool {
    const OWN: &[&str] = &[
        "-P",
        "--add-laddr",
        "-Q",
        "--del-laddr",
        "-G",
        "--get-laddr",
        "--acl-add",
        "--acl-del",
        "--acl-list",
        "--acl-load",
        "--rate-limit",
    ];
    OWN.contains(&word)
}

/// Sluice's own options, and whether each takes a value: stepped over by the check
/// (with their value), so the rest of the line is judged; which commands take them
/// is Sluice's parser's to say.
fn sluice_option(word: &str) -> Option<Arg> {
    Some(match word {
        "-z" | "--laddr" | "-F" | "--ifname" | "--allow" | "--deny" | "--burst"
        | "--per-prefix" | "--synproxy" | "--synproxy-rate" | "--synproxy-retries" => Arg::Required,
        "--atomic" | "--replace" => Arg::None,
        _ => return None,
    })
}

/// Whether `-b` is DPVS's FullNAT forwarding method, which Sluice takes: on a
/// real-server command and with no value after it. With a value it is ipvsadm's
/// `--sched-flags`, which only `-A` and `-E` take (ipvsadm's `commands_v_options`).
fn is_fullnat_b(command: usize, next: Option<&String>) -> bool {
    (ADDDEST..=EDITDEST).contains(&command) && next.is_none_or(|w| w.starts_with('-'))
}

/// ipvsadm's `string_to_number`: `strtol` of the whole text, within `min..=max`.
fn string_to_number(text: &str, min: i64, max: i64) -> Option<i64> {
    let digits = text.trim_start_matches([' ', '\t', '\n']);
    let n: i64 = digits.strip_prefix('+').unwrap_or(digits).parse().ok()?;
    (!digits.starts_with("+-") && (min..=max).contains(&n)).then_some(n)
}

/// ipvsadm's `parse_service`: whether an address, whether a port was given, and the
/// address family (6 for IPv6), or `None` (`SERVICE_NONE`) when the text is not an
/// address[:port].
fn parse_service(text: &str, proto: Protocol) -> Option<(bool, u16, u8)> {
    if text.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let port = |p: &str| match string_to_number(p, 0, 65535) {
        Some(n) => Some(n as u16),
        None => resolve_port(proto, p).ok(),
    };
    if let Some(rest) = text.strip_prefix('[') {
        let (addr, after) = rest.split_once(']')?;
        let p = after.strip_prefix(':')?;
        addr.parse::<Ipv6Addr>().ok()?;
        return Some((true, port(p)?, 6));
    }
    if text.parse::<Ipv6Addr>().is_ok() {
        return Some((false, 0, 6));
    }
    let (host, p) = match text.rsplit_once(':') {
        Some((host, p)) => (host, Some(p)),
        None => (text, None),
    };
    resolve_host(host)?;
    match p {
        Some(p) => Some((true, port(p)?, 4)),
        None => Some((false, 0, 4)),
    }
}

/// ipvsadm's `parse_sched_flags` for scheduler `sched` (default wlc).
fn check_sched_flags(sched: Option<&str>, flags: &str) -> Result<(), Refusal> {
    let sched = sched.filter(|s| !s.is_empty()).unwrap_or("wlc");
    // `strtok` finds no name in `,` or `` and 1.31 crashes on the NULL it returns.
    if flags.split(',').all(str::is_empty) {
        return Err(fail(format!("no scheduler flag in `{flags}'")));
    }
    for flag in flags.split(',').filter(|f| !f.is_empty()) {
        let family = match flag {
            "flag-1" | "flag-2" | "flag-3" => continue,
            "sh-fallback" | "sh-port" => "sh",
            "mh-fallback" | "mh-port" => "mh",
            _ => return Err(fail(format!("invalid scheduler flag `{flag}'"))),
        };
        if sched != family {
            return Err(fail(format!("incompatible scheduler flag `{flag}'")));
        }
    }
    Ok(())
}

/// Judges an ipvsadm command line (the words after the program name) as ipvsadm 1.31
/// does before it calls the kernel. `Ok` when ipvsadm would go ahead, or when the
/// line's command is Sluice's own; Sluice's own options on ipvsadm's commands are
/// stepped over and the rest of the line judged. `program` is the name it was called by
/// (ipvsadm's `argv[0]`, which `tryhelp_exit` prints). `-R` judges each line with
/// this alone: ipvsadm stops a restore at a line its parser refuses, and carries on
/// past one the kernel refuses.
pub fn check(program: &str, args: &[String]) -> Result<(), Refusal> {
    check_words(program, args).map(drop)
}

/// [`check`], then what the kernel refuses of a single command before Sluice would
/// see it, in libipvs's words: a scheduler no kernel has (`ipvs_add_service` and
/// `ipvs_update_service` fail with ENOENT, which ipvsadm prints through
/// `ipvs_strerror` before main returns -1). One of IPVS's that Sluice lacks (`ovf`)
/// is left to Sluice's own words. The kernel looks the service up before the
/// scheduler, so `-A` of a service that exists (or `-E` of one that does not) with
/// such a name gets this answer here where ipvsadm says "Service already exists"
/// ("No such service"), with the same status.
pub fn check_command(program: &str, args: &[String]) -> Result<(), Refusal> {
    let unknown = |name: &str| {
        !name.is_empty()
            && name.parse::<SchedulerKind>().is_err()
            && !super::ipvsadm::IPVSADM_SCHEDULERS.contains(&name)
            // Linux 6.3's, newer than ipvsadm 1.31's list.
            && name != "twos"
    };
    match check_words(program, args)? {
        Some(name) if unknown(&name) => Err(Refusal {
            message: "Scheduler or persistence engine not found\n".into(),
            status: 255,
        }),
        _ => Ok(()),
    }
}

/// [`check`]'s work; on `Ok` the scheduler named by `-A` or `-E`, if any.
fn check_words(program: &str, args: &[String]) -> Result<Option<String>, Refusal> {
    let words = expand(args);
    let Some(first) = words.first() else {
        return Ok(None);
    };
    // `-h` and `-v` print and exit 0; the caller handles them.
    if matches!(first.as_str(), "-h" | "--help" | "-v" | "--version") {
        return Ok(None);
    }
    if is_sluice_command(first) {
        return Ok(None);
    }
    let Some(command) = command_index(first) else {
        return Err(tryhelp(program));
    };
    let mut it = words[1..].iter().peekable();
    if matches!(command, 9 | 10) {
        // --start-daemon and --stop-daemon take master or backup.
        match it.next().map(String::as_str) {
            Some("master" | "backup") => {}
            None => return Err(missing(first)),
            Some(_) if command == 9 => {
                return Err(fail("illegal start-daemon parameter specified"))
            }
            Some(_) => return Err(fail("illegal start_daemon specified")),
        }
    }
    let mut given = [false; 34];
    let mut positional: Vec<&String> = Vec::new();
    let mut proto = Protocol::Tcp;
    let mut svc_port: Option<u16> = None;
    let mut svc_af = 4u8;
    let mut fwmark = false;
    let mut persistent = false;
    let mut dest_af = 4u8;
    let mut tunnel = false;
    let mut fullnat = false;
    let mut tun_type = 0usize;
    let mut sched: Option<String> = None;
    let mut sched_flags: Option<String> = None;
    while let Some(word) = it.next() {
        if !word.starts_with('-') || word == "-" {
            positional.push(word);
            continue;
        }
        if word == "--fullnat" || (word == "-b" && is_fullnat_b(command, it.peek().copied())) {
            // A forwarding method, as -g, -m and -i are.
            if given[O_FORWARD] {
                return Err(fail("multiple 'forwarding-method' options specified"));
            }
            given[O_FORWARD] = true;
            tunnel = false;
            fullnat = true;
            continue;
        }
        if let Some(arg) = sluice_option(word) {
            if arg == Arg::Required {
                it.next().ok_or_else(|| missing(word))?;
            }
            continue;
        }
        let Some((index, arg)) = option(word) else {
            // Another command, or an option ipvsadm does not know.
            return Err(
                if command_index(word).is_some() || word == "-h" || word == "-v" {
                    fail(format!("invalid option `{word}'"))
                } else {
                    unknown(word)
                },
            );
        };
        if let Some(i) = index {
            if given[i] {
                return Err(fail(format!(
                    "multiple '{}' options specified",
                    OPTNAMES[i]
                )));
            }
            given[i] = true;
        }
        let value = match arg {
            Arg::None => None,
            Arg::Required => Some(it.next().ok_or_else(|| missing(word))?.as_str()),
            Arg::Optional => it.next_if(|v| !v.starts_with('-')).map(String::as_str),
        };
        let v = value.unwrap_or("");
        match word.as_str() {
            "-t" | "--tcp-service" | "-u" | "--udp-service" | "--sctp-service" => {
                proto = if word.starts_with("-u") || word == "--udp-service" {
                    Protocol::Udp
                } else {
                    Protocol::Tcp
                };
                // "illegal virtual server address[:port] specified"
                let (_, port, af) = parse_service(v, proto)
                    .ok_or_else(|| fail("illegal virtual server address[:port] specified"))?;
                svc_port = Some(port);
                svc_af = af;
            }
            "-f" | "--fwmark-service" => {
                if string_to_number(v, 1, u32::MAX as i64).is_none() {
                    return Err(fail(format!("invalid fwmark value `{v}' specified")));
                }
                fwmark = true;
            }
            "-s" | "--scheduler" => sched = Some(v.to_string()),
            "-p" | "--persistent" => {
                persistent = true;
                if value.is_some() && string_to_number(v, 1, MAX_TIMEOUT).is_none() {
                    return Err(fail(format!("invalid timeout value `{v}' specified")));
                }
            }
            "-M" | "--netmask" if svc_af == 6 && !(1..=128).contains(&atoi(v)) => {
                return Err(fail("illegal ipv6 netmask specified"));
            }
            "-M" | "--netmask" if svc_af != 6 && resolve_host(v).is_none() => {
                return Err(fail("illegal virtual server persistent mask specified"));
            }
            "-r" | "--real-server" => {
                let (_, _, af) = parse_service(v, proto)
                    .ok_or_else(|| fail("illegal real server address[:port] specified"))?;
                dest_af = af;
            }
            "-i" | "--ipip" => (tunnel, fullnat) = (true, false),
            "-g" | "--gatewaying" | "-m" | "--masquerading" => (tunnel, fullnat) = (false, false),
            "-w" | "--weight" => number(v, 0, 65535, "illegal weight specified")?,
            "-x" | "--u-threshold" => number(v, 0, INT_MAX, "illegal u_threshold specified")?,
            "-y" | "--l-threshold" => number(v, 0, INT_MAX, "illegal l_threshold specified")?,
            "--syncid" => number(v, 0, 255, "illegal syncid specified")?,
            "-6" | "--ipv6" => {
                if !fwmark {
                    // ipvsadm's format string ends in a newline of its own.
                    return Err(fail("-6 used before -f\n"));
                }
                svc_af = 6;
            }
            "-b" | "--sched-flags" => sched_flags = Some(v.to_string()),
            "--mcast-group" => {
                let ok = if v.contains(':') {
                    v.parse::<Ipv6Addr>().is_ok_and(|a| a.is_multicast())
                } else {
                    v.parse::<std::net::Ipv4Addr>()
                        .is_ok_and(|a| a.is_multicast())
                };
                if !ok {
                    let family = if v.contains(':') { "IPv6" } else { "IPv4" };
                    return Err(fail(format!("invalid {family} mcast-group `{v}'")));
                }
            }
            "--mcast-port" => number(v, 1, 65535, "illegal mcast-port specified")?,
            "--mcast-ttl" => number(v, 1, 255, "illegal mcast-ttl specified")?,
            "--sync-maxlen" => number(v, 1, 65535 - 20 - 8, "illegal sync-maxlen specified")?,
            "--tun-type" => {
                tun_type = ["ipip", "gue", "gre"]
                    .iter()
                    .position(|t| *t == v)
                    .ok_or_else(|| fail("illegal tunnel type specified"))?;
            }
            "--tun-port" => number(v, 1, 65535, "illegal tunnel port specified")?,
            _ => {}
        }
    }
    let mut positional = positional.into_iter();
    if command == TIMEOUT_CMD {
        let values: Vec<&String> = positional.by_ref().take(3).collect();
        if values.len() < 3 {
            return Err(fail("--set option requires 3 timeout values"));
        }
        for v in values {
            if string_to_number(v, 0, MAX_TIMEOUT).is_none() {
                return Err(fail(format!("invalid timeout value `{v}' specified")));
            }
        }
    }
    if let Some(extra) = positional.next() {
        return Err(fail(format!("unexpected argument {extra}")));
    }
    if let Some(flags) = &sched_flags {
        check_sched_flags(sched.as_deref(), flags)?;
    }
    generic_opt_check(command, &given)?;
    if command == ADD || command == EDIT {
        if !fwmark && svc_port == Some(0) && !persistent {
            return Err(fail("Zero port specified for non-persistent service"));
        }
        if given[O_ONEPACKET] && !fwmark && proto != Protocol::Udp {
            return Err(fail(
                "One-Packet Scheduling is only for UDP virtual services",
            ));
        }
    }
    if command == ADDDEST || command == EDITDEST {
        // Sluice's FullNAT may cross families too (NAT64: IPv4 real servers behind
        // an IPv6 service).
        if dest_af != svc_af && !tunnel && !fullnat {
            return Err(fail(
                "Different address family is allowed only for tunneling servers",
            ));
        }
        let tun_options = [
            O_TUN_TYPE,
            O_TUN_PORT,
            O_TUN_NOCSUM,
            O_TUN_CSUM,
            O_TUN_REMCSUM,
        ];
        if tun_options.iter().any(|&o| given[o]) && !tunnel {
            return Err(fail("Tunnel options conflict with forward method"));
        }
        tunnel_opt_check(tun_type, &given)?;
    }
    if command == LIST {
        let any = |opts: &[usize]| opts.iter().any(|&o| given[o]);
        if (any(&[O_CONNECTION, O_TIMEOUT, O_DAEMON]) && any(&[O_STATS, O_RATE, O_THRESHOLDS]))
            || (any(&[O_TIMEOUT, O_DAEMON]) && given[O_PERSISTENTCONN])
        {
            return Err(fail("options conflicts in the list command"));
        }
    }
    Ok(sched.filter(|_| command == ADD || command == EDIT))
}

/// C's `atoi`: the leading digits, 0 without any.
/// C's `atoi` for the digits ipvsadm reads with it: the leading ones, else 0.
pub(crate) fn atoi(text: &str) -> i64 {
    let digits: String = text.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().unwrap_or(0)
}

fn number(text: &str, min: i64, max: i64, message: &str) -> Result<(), Refusal> {
    string_to_number(text, min, max)
        .map(drop)
        .ok_or_else(|| fail(message))
}

/// popt's `POPT_ERROR_NOARG`, which ipvsadm prints as `"%s: %s\n"` (the option,
/// `poptStrerror`) before it returns -1.
fn missing(word: &str) -> Refusal {
    Refusal {
        message: format!("{word}: missing argument\n"),
        status: 255,
    }
}

/// popt's `POPT_ERROR_BADOPT`, printed as [`missing`].
fn unknown(word: &str) -> Refusal {
    Refusal {
        message: format!("{word}: unknown option\n"),
        status: 255,
    }
}

/// ipvsadm's `generic_opt_check`: options in `OPTC_*` order against the command's row.
fn generic_opt_check(command: usize, given: &[bool; 34]) -> Result<(), Refusal> {
    let row = COMMANDS_V_OPTIONS[command];
    let cmd = CMDNAMES[command];
    let mut last: Option<usize> = None;
    for (j, &rule) in row.iter().enumerate() {
        let opt = OPTNAMES[j];
        if !given[j] {
            if rule == b'+' {
                return Err(fail(format!(
                    "You need to supply the '{opt}' option for the '{cmd}' command"
                )));
            }
            continue;
        }
        match rule {
            b'x' => {
                return Err(fail(format!(
                    "Illegal '{opt}' option with the '{cmd}' command"
                )))
            }
            b'1' => match last {
                None => last = Some(j),
                Some(l) => {
                    return Err(fail(format!(
                        "The option '{opt}' conflicts with the '{}' option in the '{cmd}' command",
                        OPTNAMES[l]
                    )))
                }
            },
            _ => {}
        }
    }
    Ok(())
}

/// ipvsadm's `tunnel_opt_check` with its `tunnel_types_v_options` table (ipip, gue,
/// gre by tun-port, tun-nocsum, tun-csum, tun-remcsum).
fn tunnel_opt_check(tun_type: usize, given: &[bool; 34]) -> Result<(), Refusal> {
    const TUNNAMES: [&str; 3] = ["ipip", "gue", "gre"];
    const TABLE: [&[u8; 4]; 3] = [b"xxxx", b"+111", b"x11x"];
    const TUNOPTS: [usize; 4] = [O_TUN_PORT, O_TUN_NOCSUM, O_TUN_CSUM, O_TUN_REMCSUM];
    let tun = TUNNAMES[tun_type];
    let mut last: Option<usize> = None;
    for (j, &rule) in TABLE[tun_type].iter().enumerate() {
        let k = TUNOPTS[j];
        let opt = OPTNAMES[k];
        if !given[k] {
            if rule == b'+' {
                return Err(fail(format!(
                    "You need to supply the '{opt}' option for the '{tun}' tunnel type"
                )));
            }
            continue;
        }
        match rule {
            b'x' => {
                return Err(fail(format!(
                    "Illegal '{opt}' option with the '{tun}' tunnel type"
                )))
            }
            b'1' => match last {
                None => last = Some(k),
                Some(l) => {
                    return Err(fail(format!(
                    "The option '{opt}' conflicts with the '{}' option in the '{tun}' tunnel type",
                    OPTNAMES[l]
                )))
                }
            },
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(line: &str) -> Refusal {
        let args: Vec<String> = line.split_whitespace().map(str::to_string).collect();
        check("ipvsadm", &args).expect_err(line)
    }

    fn passes(line: &str) {
        let args: Vec<String> = line.split_whitespace().map(str::to_string).collect();
        assert_eq!(check("ipvsadm", &args), Ok(()), "{line}");
    }

    /// libipvs's `{ ipvs_add_service, ENOENT, "Scheduler or persistence engine not
    /// found" }` (and `ipvs_update_service`'s), then main's -1: for a command alone,
    /// never for a `-R` line, which ipvsadm carries on past.
    #[test]
    fn a_scheduler_the_kernel_lacks_is_refused_as_libipvs_words_it() {
        let words =
            |line: &str| -> Vec<String> { line.split_whitespace().map(str::to_string).collect() };
        for line in ["-A -t 1.2.3.4:80 -s nosuch", "-E -t 1.2.3.4:80 -s RR"] {
            assert_eq!(
                check_command("ipvsadm", &words(line)),
                Err(Refusal {
                    message: "Scheduler or persistence engine not found\n".into(),
                    status: 255
                }),
                "{line}"
            );
            passes(line);
        }
        for line in [
            "-A -t 1.2.3.4:80 -s mh -b mh-port",
            "-E -t 1.2.3.4:80",
            "-a -t 1.2.3.4:80 -r 10.0.0.1",
            // IPVS has them, Sluice not: Sluice's words follow.
            "-A -t 1.2.3.4:80 -s ovf",
            "-A -t 1.2.3.4:80 -s twos",
        ] {
            assert_eq!(check_command("ipvsadm", &words(line)), Ok(()), "{line}");
        }
        // Usage refusals come first, as in ipvsadm.
        assert_eq!(
            check_command("ipvsadm", &words("-A -s nosuch"))
                .unwrap_err()
                .status,
            2
        );
    }

    #[test]
    fn the_tables_are_ipvsadms() {
        // Rows as ipvsadm.c writes them, quote for quote (ADD and LIST).
        let add = "{'x', 'x', '+', ' ', ' ', ' ', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', ' ', ' ', ' ', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x'}";
        let list = "{' ', '1', '1', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', 'x', '1', '1', ' ', ' ', ' ', ' ', ' ', ' ', ' ', 'x', 'x', 'x', 'x', 'x', 'x', 'x', ' ', 'x', 'x', 'x', 'x', 'x'}";
        let row = |c: &str| -> Vec<u8> {
            c.split('\'')
                .skip(1)
                .step_by(2)
                .map(|s| s.as_bytes()[0])
                .collect()
        };
        assert_eq!(row(add), COMMANDS_V_OPTIONS[ADD].to_vec());
        assert_eq!(row(list), COMMANDS_V_OPTIONS[LIST].to_vec());
    }

    #[test]
    fn usage_errors_carry_ipvsadms_words_and_status() {
        let cases: &[(&str, &str, u8)] = &[
            // `fail(2, "illegal virtual server address[:port] specified")`
            (
                "-A -t 1.2.3.4:notaport",
                "illegal virtual server address[:port] specified\n",
                2,
            ),
            ("-A -t 80", "illegal virtual server address[:port] specified\n", 2),
            // `fail(2, "Zero port specified for non-persistent service")`
            ("-A -t 1.2.3.4", "Zero port specified for non-persistent service\n", 2),
            ("-A -t 1.2.3.4:0", "Zero port specified for non-persistent service\n", 2),
            // `fail(2, "You need to supply the '%s' option for the '%s' command", ...)`
            (
                "-A -s rr",
                "You need to supply the 'service-address' option for the 'add-service' command\n",
                2,
            ),
            (
                "-a -t 1.2.3.4:80",
                "You need to supply the 'real-server' option for the 'add-server' command\n",
                2,
            ),
            // `fail(2, "Illegal '%s' option with the '%s' command", ...)`
            (
                "-D -t 1.2.3.4:80 -s rr",
                "Illegal 'scheduler' option with the 'delete-service' command\n",
                2,
            ),
            // `fail(2, "The option '%s' conflicts with the '%s' option in the '%s' command", ...)`
            (
                "-L -c --timeout",
                "The option 'timeout' conflicts with the 'connection' option in the 'list' command\n",
                2,
            ),
            // `fail(2, "multiple '%s' options specified", optnames[optc])`
            ("-L -n -n", "multiple 'numeric' options specified\n", 2),
            // `fail(2, "illegal weight specified")`
            ("-a -t 1.2.3.4:80 -r 10.0.0.1 -w 70000", "illegal weight specified\n", 2),
            // `fail(2, "invalid timeout value `%s' specified", buf)`
            ("-A -t 1.2.3.4:80 -p abc", "invalid timeout value `abc' specified\n", 2),
            // `fail(2, "illegal virtual server persistent mask specified")`
            (
                "-A -t 1.2.3.4:80 -p -M 1.2.3.4.5",
                "illegal virtual server persistent mask specified\n",
                2,
            ),
            // After an IPv6 service, `ce->svc.netmask = atoi(optarg); if
            // ((ce->svc.netmask < 1) || (ce->svc.netmask > 128)) fail(2, "illegal ipv6
            // netmask specified")`.
            (
                "-A -t [2001:db8::1]:80 -p -M 129",
                "illegal ipv6 netmask specified\n",
                2,
            ),
            (
                "-A -u [2001:db8::1]:53 -p -M 255.255.255.0",
                "illegal ipv6 netmask specified\n",
                2,
            ),
            // `fail(2, "options conflicts in the list command")`
            ("-L -c --stats", "options conflicts in the list command\n", 2),
            ("-L --timeout --rate", "options conflicts in the list command\n", 2),
            (
                "-L --timeout --persistent-conn",
                "options conflicts in the list command\n",
                2,
            ),
            // `fail(2, "--set option requires 3 timeout values")`
            ("--set 1 2", "--set option requires 3 timeout values\n", 2),
            // `fail(2, "unexpected argument %s", optarg)`
            ("-L -n extra", "unexpected argument extra\n", 2),
            // `fail(2, "invalid option `%s'", poptBadOption(...))`
            ("-L -A", "invalid option `-A'\n", 2),
            // `fail(2, "invalid scheduler flag `%s'", flag)`
            ("-A -t 1.2.3.4:80 -s sh -b nope", "invalid scheduler flag `nope'\n", 2),
            // 1.31 crashes on a list without a name.
            ("-A -t 1.2.3.4:80 -s sh -b ,", "no scheduler flag in `,'\n", 2),
            // `fail(2, "incompatible scheduler flag `%s'", flag)`
            ("-A -t 1.2.3.4:80 -b sh-port", "incompatible scheduler flag `sh-port'\n", 2),
            // `fail(2, "One-Packet Scheduling is only for UDP virtual services")`
            (
                "-A -t 1.2.3.4:80 -o",
                "One-Packet Scheduling is only for UDP virtual services\n",
                2,
            ),
            // `fail(2, "Tunnel options conflict with forward method")`
            (
                "-a -t 1.2.3.4:80 -r 10.0.0.1 -m --tun-type gue",
                "Tunnel options conflict with forward method\n",
                2,
            ),
            // tunnel_opt_check: `"You need to supply the '%s' option for the '%s' tunnel type"`
            (
                "-a -t 1.2.3.4:80 -r 10.0.0.1 -i --tun-type gue",
                "You need to supply the 'tun-port' option for the 'gue' tunnel type\n",
                2,
            ),
            // `fail(2, "-6 used before -f\n")`: two newlines.
            ("-A -6", "-6 used before -f\n\n", 2),
            // `tryhelp_exit(argv[0], -1)`: the first option is not a command.
            (
                "-n -L",
                "Try `ipvsadm -h' or 'ipvsadm --help' for more information.\n",
                255,
            ),
            // popt's errors: `fprintf(stderr, "%s: %s\n", poptBadOption(...), poptStrerror(c))`
            ("-L --bogus", "--bogus: unknown option\n", 255),
            ("-A -t", "-t: missing argument\n", 255),
            // `-b` with a value is ipvsadm's sched-flags, whatever the command: only
            // -A and -E take it (`parse_sched_flags` first, then `generic_opt_check`).
            (
                "-d -t 1.2.3.4:80 -r 10.0.0.1 -b flag-1",
                "Illegal 'sched-flags' option with the 'delete-server' command\n",
                2,
            ),
            (
                "-a -t 1.2.3.4:80 -r 10.0.0.1 -m -b flag-2",
                "Illegal 'sched-flags' option with the 'add-server' command\n",
                2,
            ),
            (
                "-e -t 1.2.3.4:80 -r 10.0.0.1 -b sh-port",
                "incompatible scheduler flag `sh-port'\n",
                2,
            ),
            (
                "-C -b flag-1",
                "Illegal 'sched-flags' option with the 'flush' command\n",
                2,
            ),
            (
                "-A -t 1.2.3.4:80 -s rr -b flag-9",
                "invalid scheduler flag `flag-9'\n",
                2,
            ),
            // Words ipvsadm takes on other commands.
            (
                "-C --tun-type ipip",
                "Illegal 'tun-type' option with the 'flush' command\n",
                2,
            ),
            (
                "-D -t 1.2.3.4:80 --tun-type ipip",
                "Illegal 'tun-type' option with the 'delete-service' command\n",
                2,
            ),
            // Tunnel options need -i; ipvsadm does not imply it.
            (
                "-a -t 1.2.3.4:80 -r 10.0.0.1 --tun-type ipip",
                "Tunnel options conflict with forward method\n",
                2,
            ),
            (
                "-a -t 1.2.3.4:80 -r 10.0.0.1 -m --tun-type ipip",
                "Tunnel options conflict with forward method\n",
                2,
            ),
            // Sluice's own words on the line leave the others judged.
            (
                "-a -t 1.2.3.4:80 -r 10.0.0.1 -b -w 70000",
                "illegal weight specified\n",
                2,
            ),
            (
                "-a -t 1.2.3.4:80 -r 10.0.0.1 -b -m",
                "multiple 'forwarding-method' options specified\n",
                2,
            ),
            (
                "-a -t 1.2.3.4:80 -r 10.0.0.1 --fullnat --tun-type ipip",
                "Tunnel options conflict with forward method\n",
                2,
            ),
            (
                "-A -t 1.2.3.4:80 --synproxy on -w 1",
                "Illegal 'weight' option with the 'add-service' command\n",
                2,
            ),
            (
                "-R --atomic -n",
                "Illegal 'numeric' option with the 'restore' command\n",
                2,
            ),
            // Sluice's commands come first, as ipvsadm's do.
            (
                "-t 1.2.3.4:80 -P -z 10.0.0.9",
                "Try `ipvsadm -h' or 'ipvsadm --help' for more information.\n",
                255,
            ),
            ("-A -t 1.2.3.4:80 -P", "-P: unknown option\n", 255),
        ];
        for (line, message, status) in cases {
            let r = refused(line);
            assert_eq!(
                (r.message.as_str(), r.status),
                (*message, *status),
                "{line}"
            );
        }
    }

    #[test]
    fn what_ipvsadm_accepts_passes() {
        passes("-A -t 1.2.3.4:80 -s rr");
        passes("-A -t 1.2.3.4 -p");
        passes("-A -t 1.2.3.4:http -s wlc -p 600 -M 255.255.255.0");
        passes("-A -t 1.2.3.4:80 -M 255.255.255.0");
        passes("-A -t [2001:db8::1]:80 -p 60 -M 64");
        passes("-A -u [2001:db8::1]:53 -p -M 128");
        passes("-E -t 1.2.3.4:80");
        passes("-a -t 1.2.3.4:80 -r 10.0.0.1:8080 -m -w 0");
        passes("-a -t 1.2.3.4:80 -r 10.0.0.1 -i --tun-type ipip");
        passes("-Ln");
        passes("-L -n -t 1.2.3.4:80 --stats --exact");
        passes("-Ln --nosort --sort --persistent-conn");
        passes("-L --timeout");
        passes("--set 900 120 300");
        passes("-Z -t 1.2.3.4:80");
        passes("-S -n");
        passes("-A -t 1.2.3.4:80 -s sh -b sh-port,flag-3");
        // Sluice's own options are for Sluice's parser.
        passes("-a -t 1.2.3.4:80 -r 10.0.0.1:80 -b");
        passes("-a -t 1.2.3.4:80 -r 10.0.0.1:8080 -b -w 2 -x 10");
        passes("-e -t 1.2.3.4:80 -r 10.0.0.1:8080 --fullnat");
        passes("-a -t [2001:db8::1]:80 -r 10.0.0.1:80 -b");
        passes("-A -t 1.2.3.4:80 -s rr --synproxy on --synproxy-rate 100");
        passes("-P -t 1.2.3.4:80 -z 10.0.0.9");
        passes("--acl-add -t 1.2.3.4:80 --allow 10.0.0.0/8");
        passes("-R --atomic");
        passes("-R --replace");
    }

    /// `parse_sched_flags` splits with `strtok(optarg, ",")`: a space stays in the
    /// flag's name, which no flag has.
    #[test]
    fn a_space_in_the_scheduler_flags_is_refused_as_strtok_leaves_it() {
        let args: Vec<String> = [
            "-A",
            "-t",
            "1.2.3.4:80",
            "-s",
            "sh",
            "-b",
            "sh-port, sh-fallback",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            check("ipvsadm", &args),
            Err(fail("invalid scheduler flag ` sh-fallback'"))
        );
    }

    #[test]
    fn garbage_never_panics() {
        let words = [
            "-A",
            "-t",
            "-p",
            "[",
            "]:",
            "-",
            "--set",
            "-b",
            ",",
            "::",
            "-6",
            "--tun-type",
            "x",
        ];
        for a in words {
            for b in words {
                for c in words {
                    let args = vec![a.to_string(), b.to_string(), c.to_string()];
                    let _ = check("ipvsadm", &args);
                }
            }
        }
    }
}
