//! The ipvsadm-style listings as text: `-L` (with `--stats`, `--rate`), `sluicectl
//! skew`, `-S`, `-L --timeout` and `--get-laddr`.
use crate::control::report::{
    LaddrReport, RealServerStatus, ServiceAdmission, ServiceCounts, ServiceStatus, ServicesReport,
    TimeoutsReport,
};
use std::fmt::Write as _;

fn ipvsadm_forward(mode: &str) -> &str {
    match mode {
        "dr" => "Route",
        "nat" => "Masq",
        "tun" => "Tunnel",
        "fullnat" => "FullNat",
        other => other,
    }
}

/// A counter as ipvsadm 1.31's `print_largenum` prints it, its leading space
/// included. Exact (`-X`/`--exact`): `printf("%*llu", len <= 8 ? 9 : len + 1, i)`.
/// Otherwise below 100 million `"%9llu"`, then `"%8lluK"` (i / 1000) below 1 billion,
/// `"%8lluM"` (i / 1000000) below 100 billion, `"%8lluG"` (i / 1000000000) below 100
/// trillion, and `"%8lluT"` (i / 1000000000000).
pub fn largenum(i: u64, exact: bool) -> String {
    if exact {
        return format!(" {i:>8}");
    }
    match i {
        0..=99_999_999 => format!("{i:>9}"),
        100_000_000..=999_999_999 => format!("{:>8}K", i / 1_000),
        1_000_000_000..=99_999_999_999 => format!("{:>8}M", i / 1_000_000),
        100_000_000_000..=99_999_999_999_999 => format!("{:>8}G", i / 1_000_000_000),
        _ => format!("{:>8}T", i / 1_000_000_000_000),
    }
}

/// Renders the report in `ipvsadm -Ln` layout (or `ipvsadm -Ln --stats` with `stats`),
/// so scripts that parse ipvsadm's columns keep working: a 33-column name, then each
/// counter as [`largenum`] prints it (abbreviated from 100 million on with K/M/G/T
/// unless `exact`, as ipvsadm without `-X`).
///
/// Overload by connection thresholds is not shown here, as ipvsadm does not: a word
/// after InActConn would break the pipelines that read it as the last field. `-Ln
/// --thresholds` ([`render_thresholds`]) shows it.
pub fn render_services(report: &ServicesReport, stats: bool, exact: bool) -> String {
    let mut out = String::from("IP Virtual Server version 1.2.1 (size=4096)\n");
    if stats {
        out += "Prot LocalAddress:Port               Conns   InPkts  OutPkts  InBytes OutBytes\n";
        out += "  -> RemoteAddress:Port\n";
    } else {
        out += "Prot LocalAddress:Port Scheduler Flags\n";
        out += "  -> RemoteAddress:Port           Forward Weight ActiveConn InActConn\n";
    }
    for s in &report.services {
        let proto = s.proto.to_uppercase();
        let local = crate::control::render::endpoint(&s.vip, s.port);
        if stats {
            let sum = |f: fn(&RealServerStatus) -> u64| s.real_servers.iter().map(f).sum::<u64>();
            // The service's own, which a removed real server does not take away.
            let own = s.stats.unwrap_or(ServiceCounts {
                connections: sum(|r| r.connections),
                in_packets: sum(|r| r.in_packets),
                out_packets: sum(|r| r.out_packets),
                in_bytes: sum(|r| r.in_bytes),
                out_bytes: sum(|r| r.out_bytes),
            });
            let _ = write!(out, "{proto:<4} {local:<28}");
            for n in [
                own.connections,
                own.in_packets,
                own.out_packets,
                own.in_bytes,
                own.out_bytes,
            ] {
                out += &largenum(n, exact);
            }
            out += "\n";
        } else {
            out += &service_line(s);
        }
        for r in &s.real_servers {
            let remote = crate::control::render::endpoint(&r.ip, r.port);
            if stats {
                let _ = write!(out, "  -> {remote:<28}");
                for n in [
                    r.connections,
                    r.in_packets,
                    r.out_packets,
                    r.in_bytes,
                    r.out_bytes,
                ] {
                    out += &largenum(n, exact);
                }
                out += "\n";
            } else {
                let _ = writeln!(
                    out,
                    "  -> {remote:<28} {:<7} {:<6} {:<10} {:<10}",
                    ipvsadm_forward(&r.mode),
                    r.weight,
                    r.active,
                    r.inactive
                );
            }
        }
    }
    out
}

/// The persistence netmask as ipvsadm 1.31 shows it, when it is not the family's
/// default: an IPv4 netmask other than 255.255.255.255, an IPv6 prefix length
/// other than 128 (`if (se->netmask != 128)`).
fn shown_netmask(s: &ServiceStatus) -> Option<&str> {
    let default = if s.vip.contains(':') {
        "128"
    } else {
        "255.255.255.255"
    };
    s.persistence_netmask.as_deref().filter(|m| *m != default)
}

/// A service's line of `-Ln` and `-L --thresholds`: protocol, address, scheduler, the
/// scheduler flags in brackets and, as ipvsadm, "persistent 300" and, for a netmask
/// other than /32, "mask M".
fn service_line(s: &ServiceStatus) -> String {
    // `printf(" mask %s", inet_ntoa(mask))` for IPv4, `printf(" mask %i",
    // se->netmask)` for IPv6.
    let persistent = s
        .persistence_s
        .map(|p| match shown_netmask(s) {
            Some(m) => format!(" persistent {p} mask {m}"),
            None => format!(" persistent {p}"),
        })
        .unwrap_or_default();
    // ipvsadm prints the scheduler flags in brackets after the scheduler:
    // `printf(" ("); print_sched_flags(se); printf(")")`.
    let flags = if s.sched_flags.is_empty() {
        String::new()
    } else {
        format!(" ({})", s.sched_flags)
    };
    format!(
        "{:<4} {} {}{flags}{persistent}\n",
        s.proto.to_uppercase(),
        crate::control::render::endpoint(&s.vip, s.port),
        s.scheduler
    )
}

/// `-L --thresholds`, in ipvsadm's layout (`print_title` and `print_service_entry`
/// with `FMT_THRESHOLDS`): per real server its upper and lower thresholds and its
/// active and inactive connections, and `overloaded` after them while the upper
/// threshold keeps it from new connections.
pub fn render_thresholds(report: &ServicesReport) -> String {
    let mut out = String::from("IP Virtual Server version 1.2.1 (size=4096)\n");
    // ipvsadm pads every title column with %-10s, the last one too.
    out += "Prot LocalAddress:Port            Uthreshold Lthreshold ActiveConn InActConn \n";
    out += "  -> RemoteAddress:Port\n";
    for s in &report.services {
        out += &service_line(s);
        for r in &s.real_servers {
            let remote = crate::control::render::endpoint(&r.ip, r.port);
            let _ = write!(
                out,
                "  -> {remote:<28} {:<10} {:<10} {:<10} {:<10}",
                r.upper, r.lower, r.active, r.inactive
            );
            out += if r.overloaded { " overloaded\n" } else { "\n" };
        }
    }
    out
}

/// `-L --persistent-conn`, in ipvsadm's layout (`print_title` and
/// `print_service_entry` with `FMT_PERSISTENTCONN`): per real server its weight, the
/// persistence templates that send clients to it (`persistent(service, server)`, from
/// the connection listing's templates) and its active and inactive connections.
pub fn render_persistent_conns(
    report: &ServicesReport,
    persistent: &dyn Fn(&ServiceStatus, &RealServerStatus) -> u64,
) -> String {
    let mut out = String::from("IP Virtual Server version 1.2.1 (size=4096)\n");
    // `printf("%-33s %-9s %-11s %-10s %-10s\n  -> RemoteAddress:Port\n", ...)`.
    let _ = writeln!(
        out,
        "{:<33} {:<9} {:<11} {:<10} {:<10}",
        "Prot LocalAddress:Port", "Weight", "PersistConn", "ActiveConn", "InActConn"
    );
    out += "  -> RemoteAddress:Port\n";
    for s in &report.services {
        out += &service_line(s);
        for r in &s.real_servers {
            // `addrport_to_anyname`: `[address]:port` for IPv6.
            let remote = crate::control::render::endpoint(&r.ip, r.port);
            // `printf("  -> %-28s %-9u %-11u %-10u %-10u\n", ...)`.
            let _ = writeln!(
                out,
                "  -> {remote:<28} {:<9} {:<11} {:<10} {:<10}",
                r.weight,
                persistent(s, r),
                r.active,
                r.inactive
            );
        }
    }
    out
}

/// `-L --rate`, in ipvsadm's layout: per service and real server, connections, packets
/// and bytes per second each way. As ipvsadm: the service's five rates and a real
/// server's byte rates as [`largenum`] prints them, a real server's connection and
/// packet rates always exact (`"  -> %-28s %8llu %8llu %8llu"`).
pub fn render_rates(report: &ServicesReport, exact: bool) -> String {
    let mut out = String::from("IP Virtual Server version 1.2.1 (size=4096)\n");
    out += "Prot LocalAddress:Port                 CPS    InPPS   OutPPS    InBPS   OutBPS\n";
    out += "  -> RemoteAddress:Port\n";
    for s in &report.services {
        let sum = |f: fn(&RealServerStatus) -> u64| s.real_servers.iter().map(f).sum::<u64>();
        let local = crate::control::render::endpoint(&s.vip, s.port);
        let _ = write!(out, "{:<4} {local:<28}", s.proto.to_uppercase());
        // The service's own rates (IPVS's service estimator), else the listed real
        // servers' sum.
        let own = s
            .rates
            .map(|r| [r.cps, r.in_pps, r.out_pps, r.in_bps, r.out_bps]);
        for n in own.unwrap_or_else(|| {
            [
                sum(|r| r.cps),
                sum(|r| r.in_pps),
                sum(|r| r.out_pps),
                sum(|r| r.in_bps),
                sum(|r| r.out_bps),
            ]
        }) {
            out += &largenum(n, exact);
        }
        out += "\n";
        for r in &s.real_servers {
            let remote = crate::control::render::endpoint(&r.ip, r.port);
            let _ = write!(
                out,
                "  -> {remote:<28} {:>8} {:>8} {:>8}",
                r.cps, r.in_pps, r.out_pps
            );
            out += &largenum(r.in_bps, exact);
            out += &largenum(r.out_bps, exact);
            out += "\n";
        }
    }
    out
}

/// Connection skew above this ([`skew_pct`], percent) earns a WARN (seed 000).
pub const DEFAULT_SKEW_THRESHOLD_PCT: u32 = 300;
/// In-packets per new connection above this: traffic rides on a few long-lived
/// connections, and L4 balance is luck (seed 000's rule of thumb, with in-packets as
/// the L4 proxy for requests).
pub const PACKETS_PER_CONNECTION_ADVISORY: u64 = 1000;

/// The largest share of the total any real server took against the share its weight
/// gives it, in percent (100 = as the weights say; with equal weights, max over
/// average); 0 without traffic. A server that takes no new connections (weight 0,
/// evicted by health checking: `weights` gives it 0) is left out: no share is its.
pub fn skew_pct(values: &[u64], weights: &[u32]) -> u64 {
    let taking = || values.iter().zip(weights).filter(|(_, &w)| w > 0);
    let total: u128 = taking().map(|(&v, _)| u128::from(v)).sum();
    let total_weight: u128 = taking().map(|(_, &w)| u128::from(w)).sum();
    if total == 0 {
        return 0;
    }
    taking()
        .map(|(&v, &w)| u128::from(v) * total_weight * 100 / (u128::from(w) * total))
        .max()
        .map_or(0, |pct| u64::try_from(pct).unwrap_or(u64::MAX))
}

/// The shares [`skew_pct`] judges a service's real servers by, as its scheduler
/// deals: each one's weight for the weighted ones; an equal share for rr, lc and dh,
/// which use a weight only to tell 0 from the rest; everything to the heaviest for
/// fo. 0 for a server that takes no new connections (evicted, or at weight 0).
pub fn skew_weights(s: &ServiceStatus) -> Vec<u32> {
    let taking = |r: &RealServerStatus| !r.evicted && r.weight > 0;
    let heaviest = (s.real_servers.iter().filter(|r| taking(r)))
        .map(|r| r.weight)
        .max();
    (s.real_servers.iter())
        .map(|r| match s.scheduler.as_str() {
            _ if !taking(r) => 0,
            "rr" | "lc" | "dh" => 1,
            "fo" => u32::from(Some(r.weight) == heaviest),
            _ => r.weight,
        })
        .collect()
}

/// `sluicectl skew`: per service, each real server's connections (active + inactive,
/// as `ipvsadm -Lnc` counts them), new connections/s, packets/s and bytes/s, the
/// skew of each ([`skew_pct`]), a WARN when connection skew passes `threshold_pct`, and an
/// advisory when in-packets per new connection pass [`PACKETS_PER_CONNECTION_ADVISORY`].
pub fn render_skew(report: &ServicesReport, only: Option<&str>, threshold_pct: u32) -> String {
    let mut out = String::new();
    for s in &report.services {
        let name = format!(
            "{} {}",
            s.proto.to_uppercase(),
            crate::control::render::endpoint(&s.vip, s.port)
        );
        if only.is_some_and(|o| o != crate::control::render::endpoint(&s.vip, s.port)) {
            continue;
        }
        let conns: Vec<u64> = s
            .real_servers
            .iter()
            .map(|r| r.active + r.inactive)
            .collect();
        let cps: Vec<u64> = s.real_servers.iter().map(|r| r.cps).collect();
        let pps: Vec<u64> = s
            .real_servers
            .iter()
            .map(|r| r.in_pps + r.out_pps)
            .collect();
        let bps: Vec<u64> = s
            .real_servers
            .iter()
            .map(|r| r.in_bps + r.out_bps)
            .collect();
        let _ = writeln!(out, "{name} ({})", s.scheduler);
        let _ = writeln!(
            out,
            "  {:<24} {:>8} {:>8} {:>10} {:>12}",
            "RemoteAddress:Port", "Conns", "CPS", "PPS", "BPS"
        );
        for (i, r) in s.real_servers.iter().enumerate() {
            let _ = writeln!(
                out,
                "  {:<24} {:>8} {:>8} {:>10} {:>12}",
                crate::control::render::endpoint(&r.ip, r.port),
                conns[i],
                cps[i],
                pps[i],
                bps[i]
            );
        }
        let weights = skew_weights(s);
        let (sc, scps, spps, sbps) = (
            skew_pct(&conns, &weights),
            skew_pct(&cps, &weights),
            skew_pct(&pps, &weights),
            skew_pct(&bps, &weights),
        );
        let _ = writeln!(
            out,
            "  skew (share/weight): conns {sc}%  cps {scps}%  pps {spps}%  bps {sbps}%"
        );
        if sc > u64::from(threshold_pct) {
            let _ = writeln!(
                out,
                "  WARN connection skew {sc}% > {threshold_pct}% on {name}: one real server holds far more connections than the average"
            );
        }
        let (new, inp): (u64, u64) = (
            cps.iter().sum(),
            s.real_servers.iter().map(|r| r.in_pps).sum(),
        );
        if inp > 0 && (new == 0 || inp / new.max(1) > PACKETS_PER_CONNECTION_ADVISORY) {
            let per = match inp.checked_div(new) {
                Some(n) => format!("{n} in-packets per new connection"),
                None => "no new connections".to_string(),
            };
            let _ = writeln!(
                out,
                "  ADVISORY {per} (in-packets are the L4 proxy for requests): traffic rides on few long-lived connections, so L4 balance is luck (seed 000); balance requests at L7 or recycle connections"
            );
        }
    }
    if out.is_empty() {
        out = match only {
            Some(o) => format!("no service {o}\n"),
            None => "no services\n".to_string(),
        };
    }
    out
}

/// `-L --timeout`, as ipvsadm prints it.
pub fn render_timeouts(t: &TimeoutsReport) -> String {
    format!(
        "Timeout (tcp tcpfin udp): {} {} {}\n",
        t.tcp, t.tcpfin, t.udp
    )
}

/// `-S`: the services as `ipvsadm-save -n` lines, which `-R` reads back: one `-A` per
/// service (scheduler, persistence), one `-a` per real server (mode, weight, a
/// tunnel's `--tun-type ipip`, thresholds when set), and DPVS's `-P` for FullNAT local
/// addresses. TOA is a
/// config-file setting and is not saved.
pub fn render_save(report: &ServicesReport) -> String {
    let mut out = String::new();
    for s in &report.services {
        let flag = if s.proto == "udp" { "-u" } else { "-t" };
        let service = format!(
            "{flag} {}",
            crate::control::render::endpoint(&s.vip, s.port)
        );
        // In ipvsadm's order: `"-A %s -s %s"`, `" -p %u"`, `" -M %s"`, then `" -b "`
        // and the flags.
        let mut line = format!("-A {service} -s {}", s.scheduler);
        if let Some(p) = s.persistence_s {
            let _ = write!(line, " -p {p}");
            if let Some(mask) = shown_netmask(s) {
                let _ = write!(line, " -M {mask}");
            }
        }
        if !s.sched_flags.is_empty() {
            let _ = write!(line, " -b {}", s.sched_flags);
        }
        let _ = writeln!(out, "{line}");
        for r in &s.real_servers {
            let mode = match r.mode.as_str() {
                "nat" => "-m",
                "tun" => "-i",
                "fullnat" => "-b",
                _ => "-g",
            };
            let mut line = format!(
                "-a {service} -r {} {mode} -w {}",
                crate::control::render::endpoint(&r.ip, r.port),
                r.weight
            );
            // 1.31's print_tunnel_rule: `"-a %s -r %s %s -w %d --tun-type %s\n"`,
            // Sluice's tunnels being IP-in-IP.
            if mode == "-i" {
                line.push_str(" --tun-type ipip");
            }
            if r.upper > 0 {
                let _ = write!(line, " -x {}", r.upper);
            }
            if r.lower > 0 {
                let _ = write!(line, " -y {}", r.lower);
            }
            let _ = writeln!(out, "{line}");
        }
        for lip in &s.local_addresses {
            let _ = writeln!(out, "-P {service} -z {lip}");
        }
        // Sluice's own option, on a line of its own after the real servers (which
        // the proxy requires to be NAT or FullNAT), so the lines above stay ipvsadm's.
        let proxy = &s.synproxy;
        if proxy.mode != crate::model::SynProxyMode::Off {
            let mut line = format!("-E {service} --synproxy {}", proxy.mode.name());
            if proxy.auto_syn_rate != crate::model::DEFAULT_SYNPROXY_AUTO_SYN_RATE {
                let _ = write!(line, " --synproxy-rate {}", proxy.auto_syn_rate);
            }
            if proxy.syn_retries != crate::model::DEFAULT_SYNPROXY_SYN_RETRIES {
                let _ = write!(line, " --synproxy-retries {}", proxy.syn_retries);
            }
            let _ = writeln!(out, "{line}");
        }
        if let Some(admission) = &s.admission {
            save_admission(&mut out, &service, admission);
        }
    }
    out
}

/// Access-list prefixes `-S` writes on one `--acl-add` line: a 100,000-prefix list is
/// 1,000 lines of under 2 KB rather than 100,000 lines, and as many restore commands.
pub const SAVE_ACL_PREFIXES_PER_LINE: usize = 100;

/// Sluice's own lines for a service's access list and rate limit, after its real
/// servers: `--acl-add` lines (allow rules, then deny rules, each in prefix order,
/// [`SAVE_ACL_PREFIXES_PER_LINE`] to a line) and a `--rate-limit` line, which `-R`
/// reads back. The rules are in `save_services`'s reply only.
fn save_admission(out: &mut String, service: &str, admission: &ServiceAdmission) {
    for (option, prefixes) in [("--allow", &admission.allow), ("--deny", &admission.deny)] {
        for chunk in prefixes.chunks(SAVE_ACL_PREFIXES_PER_LINE) {
            let _ = write!(out, "--acl-add {service} {option} ");
            for (i, prefix) in chunk.iter().enumerate() {
                let separator = if i == 0 { "" } else { "," };
                let _ = write!(out, "{separator}{prefix}");
            }
            out.push('\n');
        }
    }
    if let Some(limit) = admission.rate_limit {
        let _ = write!(out, "--rate-limit {} {service}", limit.rate);
        if limit.burst != limit.rate {
            let _ = write!(out, " --burst {}", limit.burst);
        }
        if limit.prefix_len != 32 {
            let _ = write!(out, " --per-prefix {}", limit.prefix_len);
        }
        out.push('\n');
    }
}

/// Renders `--get-laddr` as DPVS's ipvsadm lays it out: the service with the number of
/// local addresses, then one local address per line in the last column; then, when
/// there are pools, one line per worker and address with its port counts and early
/// reuses; then, when ports came round to a real server within its TIME-WAIT or the
/// rate needs more addresses than the service has, a warning with the sizing rule.
pub fn render_laddrs(report: &LaddrReport) -> String {
    let mut out = format!("{:<20} {:<8} {}\n", "VIP:VPORT", "TOTAL", "LIP");
    let service = crate::control::render::endpoint(report.service.vip, report.service.port);
    let _ = writeln!(out, "{service:<20} {}", report.local_addresses.len());
    for lip in &report.local_addresses {
        let _ = writeln!(out, "{:<20} {:<8} {lip}", "", "");
    }
    if !report.pools.is_empty() {
        let _ = writeln!(
            out,
            "\n{:<8} {:<16} {:>8} {:>8} {:>10} {:>10} {:>10}",
            "WORKER", "LIP", "USED", "FREE", "MISS", "EARLY", "UNPROT"
        );
        for p in &report.pools {
            let _ = writeln!(
                out,
                "{:<8} {:<16} {:>8} {:>8} {:>10} {:>10} {:>10}",
                p.worker,
                p.lip.to_string(),
                p.used,
                p.free,
                p.misses,
                p.early_reuses,
                p.unprotected_reuses
            );
        }
    }
    let early: u64 = report.pools.iter().map(|p| p.early_reuses).sum();
    let unprotected: u64 = report.pools.iter().map(|p| p.unprotected_reuses).sum();
    let have = report.local_addresses.len() as u64;
    if let Some(sizing) = report.sizing {
        let needed = sizing.needed();
        if early > 0 || needed > have {
            let _ = writeln!(
                out,
                "\nwarning: {early} local ports came back to a real server within its TIME-WAIT \
                 ({} s); {unprotected} of them without TCP timestamps to rewrite (each may \
                 cost the client a SYN retransmission)",
                sizing.server_time_wait_s
            );
            let _ = writeln!(
                out,
                "sizing: local addresses = rate x TIME-WAIT / ports per address = {}/s x {} s \
                 / {} = {needed} (this service has {have})",
                sizing.connections_per_second, sizing.server_time_wait_s, sizing.ports_per_address
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::report::{LaddrPoolStatus, LaddrSizing, ServiceStatus};
    use crate::model::ServiceKey;
    use std::net::Ipv4Addr;

    fn report() -> ServicesReport {
        ServicesReport {
            services: vec![ServiceStatus {
                proto: "tcp".into(),
                vip: "198.18.1.1".into(),
                port: 80,
                scheduler: "rr".into(),
                persistence_s: None,
                persistence_netmask: None,
                sched_flags: String::new(),
                available: true,
                real_servers: vec![RealServerStatus {
                    ip: "198.18.0.11".into(),
                    port: 80,
                    weight: 1,
                    mode: "dr".into(),
                    active: 2,
                    inactive: 1,
                    connections: 3,
                    in_packets: 15,
                    in_bytes: 900,
                    ..Default::default()
                }],
                local_addresses: vec!["198.18.0.50".into()],
                toa: true,
                sloppy_tcp: false,
                synproxy: crate::model::SynProxy::default(),
                admission: None,
                sorry_server: None,
                sorry_in_use: false,
                stats: None,
                rates: None,
            }],
        }
    }

    #[test]
    fn save_turns_the_syn_proxy_on_after_the_real_servers() {
        use crate::model::{SynProxy, SynProxyMode};
        let mut r = report();
        r.services[0].real_servers[0].mode = "nat".into();
        r.services[0].synproxy = SynProxy {
            mode: SynProxyMode::Auto,
            auto_syn_rate: 5000,
            syn_retries: 1,
        };
        let text = render_save(&r);
        assert_eq!(
            text.lines().last(),
            Some("-E -t 198.18.1.1:80 --synproxy auto --synproxy-rate 5000 --synproxy-retries 1")
        );
        // The line parses back into the same setting.
        let args: Vec<String> = text
            .lines()
            .last()
            .unwrap()
            .split_whitespace()
            .map(String::from)
            .collect();
        assert!(crate::control::ipvsadm::parse(&args).is_ok(), "{args:?}");
        r.services[0].synproxy.mode = SynProxyMode::Off;
        assert!(!render_save(&r).contains("synproxy"));
    }

    #[test]
    fn save_writes_the_access_list_and_rate_limit_as_lines_that_parse_back() {
        use crate::control::protocol::Request;
        use crate::control::report::ServiceAdmission;
        use crate::service::{AclAction, AdmissionTotals, Prefix, RateLimit};
        let prefixes = |n: u32| -> Vec<Prefix> {
            (0..n)
                .map(|i| format!("10.{}.{}.0/24", i / 256, i % 256).parse().unwrap())
                .collect()
        };
        let mut r = report();
        let admission = ServiceAdmission {
            allow_rules: 1,
            deny_rules: 101,
            unmatched: AclAction::Deny,
            rate_limit: Some(RateLimit::new(20, 20, 32).unwrap()),
            workers: 2,
            totals: AdmissionTotals::default(),
            allow: vec!["198.18.0.0/15".parse().unwrap()],
            deny: prefixes(101),
        };
        r.services[0].admission = Some(admission.clone());
        let text = render_save(&r);
        let own: Vec<&str> = text.lines().filter(|l| l.starts_with("--")).collect();
        assert_eq!(own.len(), 4, "{text}");
        assert_eq!(own[0], "--acl-add -t 198.18.1.1:80 --allow 198.18.0.0/15");
        assert!(own[1].starts_with("--acl-add -t 198.18.1.1:80 --deny 10.0.0.0/24,10.0.1.0/24,"));
        assert!(own[1].ends_with(",10.0.99.0/24"), "{}", own[1]);
        assert_eq!(own[2], "--acl-add -t 198.18.1.1:80 --deny 10.0.100.0/24");
        // Default burst and prefix length are left out.
        assert_eq!(own[3], "--rate-limit 20 -t 198.18.1.1:80");
        // Each line parses back to its rules and limit.
        let parsed: Vec<Request> = own
            .iter()
            .map(|l| {
                let args: Vec<String> = l.split_whitespace().map(String::from).collect();
                crate::control::ipvsadm::parse(&args).unwrap().request
            })
            .collect();
        let mut deny = Vec::new();
        for req in &parsed[1..3] {
            match req {
                Request::AclAdd {
                    action: AclAction::Deny,
                    prefixes,
                    ..
                } => deny.extend_from_slice(prefixes),
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(deny, admission.deny);
        assert!(matches!(
            parsed[3],
            Request::SetRateLimit { limit: Some(l), .. } if l == RateLimit::new(20, 20, 32).unwrap()
        ));
        // A limit with its own burst and prefix length says so; no rules, no line.
        r.services[0].admission = Some(ServiceAdmission {
            allow: Vec::new(),
            deny: Vec::new(),
            rate_limit: Some(RateLimit::new(20, 40, 24).unwrap()),
            ..admission
        });
        let own: Vec<String> = render_save(&r)
            .lines()
            .filter(|l| l.starts_with("--"))
            .map(String::from)
            .collect();
        assert_eq!(
            own,
            vec!["--rate-limit 20 -t 198.18.1.1:80 --burst 40 --per-prefix 24"]
        );
    }

    #[test]
    fn save_prints_ipvsadm_save_lines() {
        let mut r = report();
        r.services[0].persistence_s = Some(600);
        r.services[0].persistence_netmask = Some("255.255.255.0".into());
        r.services[0].real_servers.push(RealServerStatus {
            ip: "198.18.0.12".into(),
            port: 8080,
            weight: 3,
            mode: "fullnat".into(),
            upper: 100,
            lower: 10,
            ..Default::default()
        });
        r.services.push(ServiceStatus {
            proto: "udp".into(),
            vip: "198.18.1.2".into(),
            port: 53,
            scheduler: "wrr".into(),
            persistence_s: Some(300),
            persistence_netmask: Some("255.255.255.255".into()),
            ..Default::default()
        });
        assert_eq!(
            render_save(&r),
            "-A -t 198.18.1.1:80 -s rr -p 600 -M 255.255.255.0\n\
             -a -t 198.18.1.1:80 -r 198.18.0.11:80 -g -w 1\n\
             -a -t 198.18.1.1:80 -r 198.18.0.12:8080 -b -w 3 -x 100 -y 10\n\
             -P -t 198.18.1.1:80 -z 198.18.0.50\n\
             -A -u 198.18.1.2:53 -s wrr -p 300\n"
        );
        // Every line parses back as the command it stands for.
        for line in render_save(&r).lines() {
            let args: Vec<String> = line.split_whitespace().map(str::to_string).collect();
            let parsed = crate::control::ipvsadm::parse(&args).unwrap();
            assert_eq!(
                parsed.output,
                crate::control::ipvsadm::Output::Quiet,
                "{line}"
            );
        }
    }

    #[test]
    fn skew_ratios_warnings_and_the_long_lived_advisory() {
        let even = [1; 8];
        assert_eq!(
            skew_pct(&[47, 6, 5, 4, 4, 3, 3, 2], &even),
            47 * 100 * 8 / 74
        );
        assert_eq!(skew_pct(&[10, 10, 10], &even[..3]), 100);
        assert_eq!(skew_pct(&[0, 0], &even[..2]), 0);
        // Shares as the weights give them are no skew; a drained server (weight 0)
        // is left out, whatever it still holds.
        assert_eq!(skew_pct(&[150, 100, 50], &[3, 2, 1]), 100);
        assert_eq!(skew_pct(&[100, 100, 0], &[1, 1, 0]), 100);
        assert_eq!(skew_pct(&[100, 100, 30], &[1, 1, 0]), 100);
        assert_eq!(skew_pct(&[100, 50, 50], &[1, 2, 1]), 200);
        assert_eq!(skew_pct(&[0, 0, 7], &[1, 1, 0]), 0);
        // What each scheduler deals: rr ignores weights but 0, fo sends all to the
        // heaviest, wrr by weight; evicted servers take nothing.
        let mut service = report().services[0].clone();
        let server = |weight: u32, evicted: bool| RealServerStatus {
            weight,
            evicted,
            ..Default::default()
        };
        service.real_servers = vec![
            server(10, false),
            server(1, false),
            server(0, false),
            server(5, true),
        ];
        for (scheduler, shares) in [
            ("rr", [1, 1, 0, 0]),
            ("lc", [1, 1, 0, 0]),
            ("fo", [1, 0, 0, 0]),
            ("wrr", [10, 1, 0, 0]),
            ("wlc", [10, 1, 0, 0]),
        ] {
            service.scheduler = scheduler.into();
            assert_eq!(skew_weights(&service), shares, "{scheduler}");
        }
        let mut r = report();
        let rs = |ip: &str, active: u64, cps: u64, in_pps: u64| RealServerStatus {
            ip: ip.into(),
            port: 80,
            weight: 1,
            active,
            cps,
            in_pps,
            ..Default::default()
        };
        // Seed 000: 78 long connections, 47 on one server, 6000+ packets/s, no new
        // connections.
        r.services[0].real_servers = vec![
            rs("10.0.3.14", 47, 0, 3600),
            rs("10.0.3.11", 6, 0, 460),
            rs("10.0.3.17", 5, 0, 380),
            rs("10.0.3.12", 4, 0, 300),
            rs("10.0.3.13", 4, 0, 300),
            rs("10.0.3.15", 4, 0, 300),
            rs("10.0.3.16", 4, 0, 300),
            rs("10.0.3.18", 4, 0, 300),
        ];
        let text = render_skew(&r, None, DEFAULT_SKEW_THRESHOLD_PCT);
        assert!(text.contains("WARN connection skew 482% > 300%"), "{text}");
        assert!(text.contains("ADVISORY no new connections"), "{text}");
        let calm = render_skew(&r, None, 500);
        assert!(!calm.contains("WARN"), "{calm}");
        // Many new connections for the packets: no advisory.
        for s in &mut r.services[0].real_servers {
            s.cps = 100;
        }
        assert!(!render_skew(&r, None, 300).contains("ADVISORY"));
        assert_eq!(
            render_skew(&r, Some("198.18.9.9:80"), 300),
            "no service 198.18.9.9:80\n"
        );
    }

    #[test]
    fn rates_render_in_ipvsadm_layout() {
        let mut r = report();
        r.services[0].real_servers[0].cps = 12;
        r.services[0].real_servers[0].in_pps = 340;
        let text = render_rates(&r, false);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>(),
            [
                "Prot",
                "LocalAddress:Port",
                "CPS",
                "InPPS",
                "OutPPS",
                "InBPS",
                "OutBPS"
            ]
        );
        assert_eq!(
            lines[3].split_whitespace().collect::<Vec<_>>(),
            ["TCP", "198.18.1.1:80", "12", "340", "0", "0", "0"]
        );
        assert_eq!(
            lines[4].split_whitespace().collect::<Vec<_>>(),
            ["->", "198.18.0.11:80", "12", "340", "0", "0", "0"]
        );
    }

    #[test]
    fn thresholds_render_as_ipvsadm_with_overload_after_the_columns() {
        let mut r = report();
        r.services[0].scheduler = "wlc".into();
        let rs = &mut r.services[0].real_servers;
        (rs[0].upper, rs[0].lower) = (10000, 100);
        rs.push(RealServerStatus {
            ip: "198.18.0.12".into(),
            port: 8080,
            upper: 5,
            active: 5,
            overloaded: true,
            ..Default::default()
        });
        // ipvsadm's print_title and print_service_entry with FMT_THRESHOLDS:
        // "%-33s %-10s %-10s %-10s %-10s\n" and "  -> %-28s %-10u %-10u %-10u %-10u\n".
        let title = format!(
            "{:<33} {:<10} {:<10} {:<10} {:<10}",
            "Prot LocalAddress:Port", "Uthreshold", "Lthreshold", "ActiveConn", "InActConn"
        );
        let text = render_thresholds(&r);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "IP Virtual Server version 1.2.1 (size=4096)");
        assert_eq!(lines[1], title);
        assert_eq!(lines[2], "  -> RemoteAddress:Port");
        assert_eq!(lines[3], "TCP  198.18.1.1:80 wlc");
        assert_eq!(
            lines[4],
            format!(
                "  -> {:<28} {:<10} {:<10} {:<10} {:<10}",
                "198.18.0.11:80", 10000, 100, 2, 1
            )
        );
        assert_eq!(
            lines[5],
            format!(
                "  -> {:<28} {:<10} {:<10} {:<10} {:<10} overloaded",
                "198.18.0.12:8080", 5, 0, 5, 0
            )
        );
        // A sample of real `ipvsadm -Ln --thresholds` output (trailing blanks trimmed).
        let sample = "  -> 192.168.1.182:80             10000      100        0          0";
        let mut one = report();
        let r0 = &mut one.services[0].real_servers[0];
        (r0.ip, r0.upper, r0.lower, r0.active, r0.inactive) =
            ("192.168.1.182".into(), 10000, 100, 0, 0);
        assert_eq!(
            render_thresholds(&one).lines().nth(4).unwrap().trim_end(),
            sample
        );
    }

    #[test]
    fn timeouts_render_as_ipvsadm() {
        let t = TimeoutsReport {
            tcp: 900,
            tcpfin: 120,
            udp: 300,
        };
        assert_eq!(
            render_timeouts(&t),
            "Timeout (tcp tcpfin udp): 900 120 300\n"
        );
    }

    #[test]
    fn list_shows_persistence_and_its_mask_as_ipvsadm() {
        let mut r = report();
        r.services[0].persistence_s = Some(300);
        r.services[0].persistence_netmask = Some("255.255.255.255".into());
        assert_eq!(
            render_services(&r, false, false).lines().nth(3),
            Some("TCP  198.18.1.1:80 rr persistent 300")
        );
        r.services[0].persistence_netmask = Some("255.255.0.0".into());
        assert_eq!(
            render_services(&r, false, false).lines().nth(3),
            Some("TCP  198.18.1.1:80 rr persistent 300 mask 255.255.0.0")
        );
    }

    /// ipvsadm 1.31's `print_tunnel_rule` writes a tunnel's type after its weight:
    /// `"-a %s -r %s %s -w %d --tun-type %s\n"` for ipip.
    #[test]
    fn save_writes_a_tunnels_type_as_ipvsadm_1_31() {
        let mut r = report();
        r.services[0].real_servers[0].mode = "tun".into();
        r.services[0].real_servers[0].weight = 3;
        assert!(
            render_save(&r)
                .lines()
                .any(|l| l == "-a -t 198.18.1.1:80 -r 198.18.0.11:80 -i -w 3 --tun-type ipip"),
            "{}",
            render_save(&r)
        );
        r.services[0].real_servers[0].upper = 10;
        assert!(
            render_save(&r).lines().any(
                |l| l == "-a -t 198.18.1.1:80 -r 198.18.0.11:80 -i -w 3 --tun-type ipip -x 10"
            ),
            "{}",
            render_save(&r)
        );
    }

    #[test]
    fn an_ipv6_service_shows_its_prefix_length_as_ipvsadm_1_31() {
        // print_service_entry: `if (se->af == AF_INET6) if (se->netmask != 128)
        // printf(" mask %i", se->netmask);` in the listing, `printf(" -M %i",
        // se->netmask)` in the rules.
        let mut r = report();
        r.services[0].vip = "2001:db8::1".into();
        r.services[0].persistence_s = Some(300);
        r.services[0].persistence_netmask = Some("64".into());
        assert_eq!(
            render_services(&r, false, false).lines().nth(3),
            Some("TCP  [2001:db8::1]:80 rr persistent 300 mask 64")
        );
        assert!(
            render_save(&r)
                .lines()
                .any(|l| l == "-A -t [2001:db8::1]:80 -s rr -p 300 -M 64"),
            "{}",
            render_save(&r)
        );
        r.services[0].persistence_netmask = Some("128".into());
        assert_eq!(
            render_services(&r, false, false).lines().nth(3),
            Some("TCP  [2001:db8::1]:80 rr persistent 300")
        );
        assert!(render_save(&r)
            .lines()
            .any(|l| l == "-A -t [2001:db8::1]:80 -s rr -p 300"));
    }

    #[test]
    fn list_matches_ipvsadm_columns() {
        let text = render_services(&report(), false, false);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[1], "Prot LocalAddress:Port Scheduler Flags");
        assert_eq!(lines[3], "TCP  198.18.1.1:80 rr");
        assert_eq!(
            lines[4],
            "  -> 198.18.0.11:80               Route   1      2          1         "
        );
        // The seed-000 pipeline: the last field of each real-server line is InActConn.
        assert_eq!(lines[4].split_whitespace().last(), Some("1"));
    }

    #[test]
    fn local_addresses_and_toa_stay_out_of_the_ipvsadm_text() {
        let mut bare = report();
        bare.services[0].local_addresses.clear();
        bare.services[0].toa = false;
        for stats in [false, true] {
            assert_eq!(
                render_services(&report(), stats, false),
                render_services(&bare, stats, false)
            );
        }
    }

    #[test]
    fn services_report_json_carries_local_addresses_and_defaults_without_them() {
        let json = serde_json::to_value(report()).unwrap();
        assert_eq!(
            json["services"][0]["local_addresses"],
            serde_json::json!(["198.18.0.50"])
        );
        assert_eq!(json["services"][0]["toa"], serde_json::json!(true));
        let back: ServicesReport = serde_json::from_value(json.clone()).unwrap();
        assert_eq!(back, report());
        // A reply from a daemon that predates them still parses.
        let mut old = json;
        let service = old["services"][0].as_object_mut().unwrap();
        service.remove("local_addresses");
        service.remove("toa");
        let back: ServicesReport = serde_json::from_value(old).unwrap();
        assert!(back.services[0].local_addresses.is_empty());
        assert!(!back.services[0].toa);
    }

    #[test]
    fn laddr_pools_render_per_worker_after_the_addresses() {
        let report = LaddrReport {
            service: ServiceKey::new(
                crate::model::Protocol::Tcp,
                Ipv4Addr::new(198, 18, 1, 1),
                80,
            ),
            local_addresses: vec![Ipv4Addr::new(198, 18, 0, 50).into()],
            pools: vec![
                LaddrPoolStatus {
                    worker: 0,
                    lip: Ipv4Addr::new(198, 18, 0, 50),
                    used: 3,
                    free: 32253,
                    misses: 0,
                    early_reuses: 0,
                    unprotected_reuses: 0,
                },
                LaddrPoolStatus {
                    worker: 1,
                    lip: Ipv4Addr::new(198, 18, 0, 50),
                    used: 8,
                    free: 0,
                    misses: 12,
                    early_reuses: 40,
                    unprotected_reuses: 2,
                },
            ],
            sizing: Some(LaddrSizing {
                connections_per_second: 20_000,
                server_time_wait_s: 60,
                ports_per_address: 64_512,
            }),
        };
        let text = render_laddrs(&report);
        let rows: Vec<Vec<&str>> = text
            .lines()
            .skip_while(|l| !l.starts_with("WORKER"))
            .map(|l| l.split_whitespace().collect())
            .collect();
        assert_eq!(
            rows[..3],
            [
                vec!["WORKER", "LIP", "USED", "FREE", "MISS", "EARLY", "UNPROT"],
                vec!["0", "198.18.0.50", "3", "32253", "0", "0", "0"],
                vec!["1", "198.18.0.50", "8", "0", "12", "40", "2"],
            ]
        );
        // 20 000/s x 60 s / 64 512 = 18.6: 19 addresses, where the service has 1.
        assert!(
            text.contains(
                "warning: 40 local ports came back to a real server within its TIME-WAIT \
                 (60 s); 2 of them without TCP timestamps to rewrite"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "sizing: local addresses = rate x TIME-WAIT / ports per address = \
                 20000/s x 60 s / 64512 = 19 (this service has 1)"
            ),
            "{text}"
        );
        // Enough addresses and no early reuse: no warning.
        let quiet = LaddrReport {
            pools: report.pools[..1].to_vec(),
            sizing: Some(LaddrSizing {
                connections_per_second: 1000,
                ..report.sizing.unwrap()
            }),
            ..report.clone()
        };
        assert!(!render_laddrs(&quiet).contains("warning"));
    }

    #[test]
    fn laddrs_render_one_per_line_under_the_service() {
        let report = LaddrReport {
            service: ServiceKey::new(
                crate::model::Protocol::Tcp,
                Ipv4Addr::new(198, 18, 1, 1),
                80,
            ),
            local_addresses: vec![
                Ipv4Addr::new(198, 18, 0, 50).into(),
                Ipv4Addr::new(198, 18, 0, 51).into(),
            ],
            pools: Vec::new(),
            sizing: None,
        };
        let expected: String = [
            "VIP:VPORT            TOTAL    LIP",
            "198.18.1.1:80        2",
            "                              198.18.0.50",
            "                              198.18.0.51",
        ]
        .iter()
        .map(|line| format!("{line}\n"))
        .collect();
        assert_eq!(render_laddrs(&report), expected);
        let text = render_laddrs(&report);
        let lips: Vec<&str> = text
            .lines()
            .skip(2)
            .map(|l| l.split_whitespace().last().unwrap())
            .collect();
        assert_eq!(lips, ["198.18.0.50", "198.18.0.51"]);
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "service": {"proto": "tcp", "vip": "198.18.1.1", "port": 80},
                "local_addresses": ["198.18.0.50", "198.18.0.51"],
                "pools": []
            })
        );
        let empty = LaddrReport {
            local_addresses: Vec::new(),
            ..report
        };
        assert_eq!(
            render_laddrs(&empty),
            "VIP:VPORT            TOTAL    LIP\n198.18.1.1:80        0\n"
        );
    }

    /// The service line shows the service's own counters; a report without them
    /// (from an older Sluice) sums the listed real servers.
    #[test]
    fn stats_show_the_service_counters_or_sum_the_real_servers() {
        let service_line = |r: &ServicesReport| {
            let text = render_services(r, true, true);
            let line = text.lines().find(|l| l.starts_with("TCP")).unwrap();
            line.split_whitespace()
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            service_line(&report()),
            ["TCP", "198.18.1.1:80", "3", "15", "0", "900", "0"]
        );
        let mut r = report();
        r.services[0].stats = Some(ServiceCounts {
            connections: 5,
            in_packets: 25,
            out_packets: 2,
            in_bytes: 1500,
            out_bytes: 300,
        });
        assert_eq!(
            service_line(&r),
            ["TCP", "198.18.1.1:80", "5", "25", "2", "1500", "300"]
        );
    }
}

/// Whole-text golden outputs for the ipvsadm listings. The expected text follows
/// ipvsadm's printf layouts (`%-33s` service names, `  -> %-28s` real servers, numbers
/// as `%9llu` in exact mode, `%-7s %-6d %-10u %-10u` for the -Ln columns), so a script
/// that slices ipvsadm's columns by position reads Sluice's the same way.
#[cfg(test)]
mod ipvsadm_golden {
    use super::*;
    use crate::control::report::ServiceStatus;

    fn rs(ip: &str, port: u16, mode: &str, weight: u32) -> RealServerStatus {
        RealServerStatus {
            ip: ip.into(),
            port,
            mode: mode.into(),
            weight,
            ..Default::default()
        }
    }

    fn report() -> ServicesReport {
        let mut a = rs("198.18.0.11", 8080, "nat", 3);
        (a.active, a.inactive) = (120, 7);
        (a.connections, a.in_packets, a.out_packets) = (127, 4400, 4100);
        (a.in_bytes, a.out_bytes) = (290_000, 123_456_000);
        (a.cps, a.in_pps, a.out_pps, a.in_bps, a.out_bps) = (12, 340, 320, 21_760, 2_048_000);
        let mut b = rs("198.18.0.12", 8080, "nat", 0);
        (b.connections, b.in_packets, b.out_packets) = (3, 100, 100);
        (b.in_bytes, b.out_bytes) = (10_000, 789);
        let mut c = rs("198.18.0.21", 53, "dr", 1);
        (c.active, c.inactive) = (5, 12);
        (c.connections, c.in_packets, c.out_packets) = (17, 34, 34);
        (c.in_bytes, c.out_bytes) = (2040, 2040);
        ServicesReport {
            services: vec![
                ServiceStatus {
                    proto: "tcp".into(),
                    vip: "198.18.1.1".into(),
                    port: 80,
                    scheduler: "wrr".into(),
                    available: true,
                    real_servers: vec![a, b],
                    ..Default::default()
                },
                ServiceStatus {
                    proto: "udp".into(),
                    vip: "198.18.1.2".into(),
                    port: 53,
                    scheduler: "sh".into(),
                    persistence_s: Some(300),
                    persistence_netmask: Some("255.255.255.0".into()),
                    available: true,
                    real_servers: vec![c],
                    ..Default::default()
                },
            ],
        }
    }

    #[test]
    fn list_numeric() {
        assert_eq!(
            render_services(&report(), false, false),
            "IP Virtual Server version 1.2.1 (size=4096)\n\
             Prot LocalAddress:Port Scheduler Flags\n  \
             -> RemoteAddress:Port           Forward Weight ActiveConn InActConn\n\
             TCP  198.18.1.1:80 wrr\n  \
             -> 198.18.0.11:8080             Masq    3      120        7         \n  \
             -> 198.18.0.12:8080             Masq    0      0          0         \n\
             UDP  198.18.1.2:53 sh persistent 300 mask 255.255.255.0\n  \
             -> 198.18.0.21:53               Route   1      5          12        \n"
        );
    }

    #[test]
    fn list_stats() {
        // The service line sums its real servers; a 9-digit count widens its column
        // by one, as `ipvsadm --exact` does.
        assert_eq!(
            render_services(&report(), true, true),
            "IP Virtual Server version 1.2.1 (size=4096)\n\
             Prot LocalAddress:Port               Conns   InPkts  OutPkts  InBytes OutBytes\n  \
             -> RemoteAddress:Port\n\
             TCP  198.18.1.1:80                     130     4500     4200   300000 123456789\n  \
             -> 198.18.0.11:8080                  127     4400     4100   290000 123456000\n  \
             -> 198.18.0.12:8080                    3      100      100    10000      789\n\
             UDP  198.18.1.2:53                      17       34       34     2040     2040\n  \
             -> 198.18.0.21:53                     17       34       34     2040     2040\n"
        );
    }

    #[test]
    fn list_rate() {
        assert_eq!(
            render_rates(&report(), true),
            "IP Virtual Server version 1.2.1 (size=4096)\n\
             Prot LocalAddress:Port                 CPS    InPPS   OutPPS    InBPS   OutBPS\n  \
             -> RemoteAddress:Port\n\
             TCP  198.18.1.1:80                      12      340      320    21760  2048000\n  \
             -> 198.18.0.11:8080                   12      340      320    21760  2048000\n  \
             -> 198.18.0.12:8080                    0        0        0        0        0\n\
             UDP  198.18.1.2:53                       0        0        0        0        0\n  \
             -> 198.18.0.21:53                      0        0        0        0        0\n"
        );
    }

    #[test]
    fn large_counters_abbreviate_as_print_largenum_unless_exact() {
        // `printf("%9llu", i)` below 100 million; `printf("%8lluK", i / 1000)` below 1
        // billion; `"%8lluM"` (/ 1000000) below 100 billion; `"%8lluG"`
        // (/ 1000000000) below 100 trillion; `"%8lluT"` (/ 1000000000000) above.
        let cases: &[(u64, &str)] = &[
            (0, "        0"),
            (99_999_999, " 99999999"),
            (100_000_000, "  100000K"),
            (999_999_999, "  999999K"),
            (1_000_000_000, "    1000M"),
            (99_999_999_999, "   99999M"),
            (100_000_000_000, "     100G"),
            (99_999_999_999_999, "   99999G"),
            (100_000_000_000_000, "     100T"),
            (u64::MAX, "18446744T"),
        ];
        for &(n, text) in cases {
            assert_eq!(largenum(n, false), text, "{n}");
        }
        // `-X`: `printf("%*llu", len <= 8 ? 9 : len + 1, i)`.
        assert_eq!(largenum(12, true), "       12");
        assert_eq!(largenum(12_345_678, true), " 12345678");
        assert_eq!(largenum(123_456_789, true), " 123456789");
        assert_eq!(largenum(u64::MAX, true), " 18446744073709551615");
    }

    #[test]
    fn list_stats_abbreviates_without_exact() {
        let text = render_services(&report(), true, false);
        let lines: Vec<&str> = text.lines().collect();
        // 300000 stays; 123456789 bytes become `"%8lluK"` of 123456.
        assert_eq!(
            lines[3],
            "TCP  198.18.1.1:80                     130     4500     4200   300000  123456K"
        );
        assert_eq!(
            lines[4],
            "  -> 198.18.0.11:8080                  127     4400     4100   290000  123456K"
        );
    }

    #[test]
    fn rates_abbreviate_only_where_ipvsadm_does() {
        let mut r = report();
        r.services[0].real_servers[0].in_pps = 123_456_789;
        r.services[0].real_servers[0].in_bps = 5_000_000_000;
        let text = render_rates(&r, false);
        let lines: Vec<&str> = text.lines().collect();
        // The service line: every rate through print_largenum.
        assert_eq!(
            lines[3],
            "TCP  198.18.1.1:80                      12  123456K      320    5000M  2048000"
        );
        // A real server: `"  -> %-28s %8llu %8llu %8llu"`, then the byte rates
        // through print_largenum.
        assert_eq!(
            lines[4],
            "  -> 198.18.0.11:8080                   12 123456789      320    5000M  2048000"
        );
    }

    #[test]
    fn list_shows_scheduler_flags_and_save_writes_them_after_persistence() {
        let mut r = report();
        r.services[1].sched_flags = "sh-fallback,sh-port".into();
        // `printf("%s %s", svc_name, se->sched_name)`, `printf(" (")`, the flags,
        // `printf(")")`, then `printf(" persistent %u", ...)` and `" mask %s"`.
        let text = render_services(&r, false, false);
        assert_eq!(
            text.lines().nth(6),
            Some("UDP  198.18.1.2:53 sh (sh-fallback,sh-port) persistent 300 mask 255.255.255.0")
        );
        // `"-A %s -s %s"`, `" -p %u"`, `" -M %s"`, then `" -b "` and the flags.
        assert_eq!(
            render_save(&r).lines().nth(3),
            Some("-A -u 198.18.1.2:53 -s sh -p 300 -M 255.255.255.0 -b sh-fallback,sh-port")
        );
    }

    #[test]
    fn persistent_conns_render_as_ipvsadm() {
        let text = render_persistent_conns(&report(), &|s, r| {
            if s.port == 53 && r.ip == "198.18.0.21" {
                4
            } else {
                0
            }
        });
        // ipvsadm pads the title's last column too (`%-10s`) and every column of a
        // real server's line (`%-10u`).
        assert_eq!(
            text,
            "IP Virtual Server version 1.2.1 (size=4096)\n\
             Prot LocalAddress:Port            Weight    PersistConn ActiveConn InActConn \n  \
             -> RemoteAddress:Port\n\
             TCP  198.18.1.1:80 wrr\n  \
             -> 198.18.0.11:8080             3         0           120        7         \n  \
             -> 198.18.0.12:8080             0         0           0          0         \n\
             UDP  198.18.1.2:53 sh persistent 300 mask 255.255.255.0\n  \
             -> 198.18.0.21:53               1         4           5          12        \n"
        );
    }

    #[test]
    fn timeouts() {
        let t = TimeoutsReport {
            tcp: 900,
            tcpfin: 120,
            udp: 300,
        };
        assert_eq!(
            render_timeouts(&t),
            "Timeout (tcp tcpfin udp): 900 120 300\n"
        );
    }

    #[test]
    fn save() {
        assert_eq!(
            render_save(&report()),
            "-A -t 198.18.1.1:80 -s wrr\n\
             -a -t 198.18.1.1:80 -r 198.18.0.11:8080 -m -w 3\n\
             -a -t 198.18.1.1:80 -r 198.18.0.12:8080 -m -w 0\n\
             -A -u 198.18.1.2:53 -s sh -p 300 -M 255.255.255.0\n\
             -a -u 198.18.1.2:53 -r 198.18.0.21:53 -g -w 1\n"
        );
    }
}
