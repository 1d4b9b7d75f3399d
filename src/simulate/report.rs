//! Plain-text tables for the reports (the CLI's default output; `--json` prints the
//! report structs instead).
use std::fmt::Write;
use std::net::Ipv4Addr;

use super::custom::CustomReport;
use super::engine::{Change, Scenario};
use super::workloads::{Common, FewClientsReport, HeteroReport, ScaleOutReport, SKEW_WARN};

/// Beyond this many servers the per-server columns become a min/max summary.
const MAX_COLUMNS: usize = 16;

fn pct(fraction: f64) -> String {
    format!("{:.1}%", fraction * 100.0)
}

fn pct0(fraction: f64) -> String {
    format!("{:.0}%", fraction * 100.0)
}

fn number(x: f64) -> String {
    if x.fract() == 0.0 && x.abs() < 1e15 {
        format!("{x:.0}")
    } else {
        format!("{x}")
    }
}

fn list<T: ToString>(items: &[T], sep: &str) -> String {
    items
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(sep)
}

/// ", persistence 300 s /24, 4 workers, linger 120 s" for what differs from plain.
fn extras(persistence: Option<crate::model::Persistence>, workers: u32, linger_s: u32) -> String {
    let mut s = String::new();
    if let Some(p) = persistence {
        let _ = write!(
            s,
            ", persistence {} s /{}",
            p.timeout_s,
            u32::from(p.netmask).leading_ones()
        );
    }
    if workers > 1 {
        let _ = write!(s, ", {workers} workers");
    }
    if linger_s > 0 {
        let _ = write!(s, ", linger {linger_s} s");
    }
    s
}

fn common_line(c: &Common) -> String {
    format!(
        "{} min, step {} s, seed {}{}",
        c.minutes,
        c.step_s,
        c.seed,
        extras(c.persistence, c.workers, c.linger_s)
    )
}

/// Column label for a server: its last octet (".11") when all share the first three.
fn labels(ips: &[Ipv4Addr]) -> Vec<String> {
    let same_net = ips
        .windows(2)
        .all(|w| w[0].octets()[..3] == w[1].octets()[..3]);
    ips.iter()
        .map(|ip| {
            if same_net {
                format!(".{}", ip.octets()[3])
            } else {
                ip.to_string()
            }
        })
        .collect()
}

pub fn scale_out(r: &ScaleOutReport) -> String {
    let p = &r.params;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "scale-out: {} servers x {} long-lived connections ({} clients), +{} servers at t=0, {}",
        p.old_servers,
        p.per_server,
        p.clients,
        p.new_servers,
        common_line(&p.common)
    );
    let _ = writeln!(
        out,
        "share of all connections held by the {} new servers; fair share {} ({} of {} by weight)",
        p.new_servers,
        pct(r.fair_share),
        p.new_servers,
        p.old_servers + p.new_servers
    );
    let _ = writeln!(out);
    let marks: Vec<u32> = r
        .rows
        .first()
        .map(|row| row.marks.iter().map(|(m, _)| *m).collect())
        .unwrap_or_default();
    let mut header = format!("{:<10} {:>9}", "scheduler", "churn");
    for m in &marks {
        let _ = write!(header, " {:>7}", format!("t={m}"));
    }
    let _ = write!(header, " {:>7}  half-share", "fair");
    let _ = writeln!(out, "{header}");
    for row in &r.rows {
        let mut line = format!(
            "{:<10} {:>9}",
            row.scheduler.name(),
            format!("{}%/min", number(row.churn_percent))
        );
        for (_, share) in &row.marks {
            let _ = write!(line, " {:>7}", pct(*share));
        }
        let half = match row.half_share_minute {
            Some(m) => format!("{m} min"),
            None => format!(">{} min", p.common.minutes),
        };
        let _ = write!(line, " {:>7}  {half}", pct(r.fair_share));
        let _ = writeln!(out, "{line}");
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "half-share: first whole minute at which the new servers hold half their fair share."
    );
    out
}

pub fn few_clients(r: &FewClientsReport) -> String {
    let p = &r.params;
    let total: u32 = p.connections.iter().sum();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "few-clients: {} clients ({} = {} long-lived connections) over {} servers, churn {}%/min, {}",
        p.connections.len(),
        list(&p.connections, "+"),
        total,
        p.servers,
        number(p.churn),
        common_line(&p.common)
    );
    let _ = writeln!(out, "clients: {}", list(&r.client_ips, " "));
    let columns = r.server_ips.len() <= MAX_COLUMNS;
    let first_last = match (r.server_ips.first(), r.server_ips.last()) {
        (Some(a), Some(b)) => format!("{a} .. {b}"),
        _ => String::new(),
    };
    let _ = writeln!(
        out,
        "active connections per server at t={} ({first_last}); skew = max / mean over all {} servers;",
        p.common.minutes, p.servers
    );
    let _ = writeln!(
        out,
        "peak = highest skew at any whole minute; WARN when the peak is above {} (seed 000's check)",
        pct0(SKEW_WARN)
    );
    let _ = writeln!(out);
    let mut header = format!("{:<10}", "scheduler");
    if columns {
        for l in labels(&r.server_ips) {
            let _ = write!(header, " {l:>4}");
        }
    } else {
        let _ = write!(header, " {:>5} {:>5}", "min", "max");
    }
    let _ = write!(header, " {:>6} {:>6} {:>5}", "skew", "peak", "idle");
    let _ = writeln!(out, "{}", header.trim_end());
    for row in &r.rows {
        let mut line = format!("{:<10}", row.scheduler.name());
        if columns {
            for c in &row.counts {
                let _ = write!(line, " {c:>4}");
            }
        } else {
            let min = row.counts.iter().min().copied().unwrap_or(0);
            let max = row.counts.iter().max().copied().unwrap_or(0);
            let _ = write!(line, " {min:>5} {max:>5}");
        }
        let _ = write!(
            line,
            " {:>6} {:>6} {:>5}",
            pct0(row.skew),
            pct0(row.peak_skew),
            row.idle_servers
        );
        if row.warn {
            line.push_str("  WARN");
        }
        let _ = writeln!(out, "{line}");
    }
    out
}

pub fn hetero(r: &HeteroReport) -> String {
    let p = &r.params;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "hetero: {} servers, {} new connections/s from {} clients, mean lifetime {} s at speed 1 (lifetime / speed), {}",
        p.speeds.len(),
        number(p.rate),
        p.sources,
        number(p.lifetime_s),
        common_line(&p.common)
    );
    let _ = writeln!(
        out,
        "share = fraction of the new connections sent to the server; mean active = its mean concurrent connections"
    );
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "{:<10} {:<15} {:>6} {:>6} {:>7} {:>11} {:>6}",
        "scheduler", "server", "speed", "weight", "share", "mean active", "peak"
    );
    for row in &r.rows {
        for (i, s) in row.servers.iter().enumerate() {
            let name = if i == 0 { row.scheduler.name() } else { "" };
            let _ = writeln!(
                out,
                "{:<10} {:<15} {:>6} {:>6} {:>7} {:>11.1} {:>6}",
                name,
                s.ip.to_string(),
                number(s.speed),
                s.weight,
                pct(s.share),
                s.mean_active,
                s.peak_active
            );
        }
    }
    out
}

fn describe_change(c: &Change) -> String {
    match c {
        Change::Add(s) => format!(
            "add {} (weight {}, speed {})",
            s.ip,
            s.weight,
            number(s.speed)
        ),
        Change::Remove(ip) => format!("remove {ip}"),
        Change::SetWeight(ip, w) => format!("weight {ip} = {w}"),
    }
}

fn scenario_line(sc: &Scenario) -> String {
    let connections: u64 = sc.clients.iter().map(|c| u64::from(c.connections)).sum();
    let mut s = format!(
        "{} servers, {} long-lived connections from {} clients, churn {}%/min",
        sc.servers.len(),
        connections,
        sc.clients.len(),
        number(sc.churn_percent)
    );
    if sc.arrival_rate > 0.0 {
        let _ = write!(
            s,
            ", {} new connections/s from {} sources (lifetime {} s)",
            number(sc.arrival_rate),
            sc.arrival_sources,
            number(sc.mean_lifetime_s)
        );
    }
    let _ = write!(
        s,
        ", {} min, step {} s, seed {}{}",
        sc.minutes,
        sc.step_s,
        sc.seed,
        extras(sc.persistence, sc.workers, sc.linger_s)
    );
    s
}

/// Minutes shown in a custom report's timeline: 0, the quarters, and every event minute.
fn timeline_minutes(sc: &Scenario) -> Vec<u32> {
    let m = sc.minutes;
    let mut minutes = vec![0, m / 4, m / 2, m * 3 / 4, m];
    minutes.extend(sc.events.iter().map(|e| e.minute));
    minutes.sort_unstable();
    minutes.dedup();
    minutes
}

pub fn custom(r: &CustomReport) -> String {
    let w = &r.params;
    let sc = &w.scenario;
    let mut out = String::new();
    let title = match &w.name {
        Some(name) => format!("{} ({name})", w.file.display()),
        None => w.file.display().to_string(),
    };
    let _ = writeln!(out, "workload {title}: {}", scenario_line(sc));
    for e in &sc.events {
        let _ = writeln!(
            out,
            "  minute {:>4}: {}",
            e.minute,
            describe_change(&e.change)
        );
    }
    let minutes = timeline_minutes(sc);
    for row in &r.rows {
        let res = &row.result;
        let _ = writeln!(out);
        let _ = writeln!(
            out,
            "{}: {} connections placed at t>=0, {} refused, {} dropped; skew at end {}",
            res.scheduler,
            res.scheduled,
            res.refused,
            res.dropped,
            pct0(row.skew)
        );
        let mut header = format!(
            "  {:<15} {:>6} {:>5} {:>9} {:>7} {:>11} {:>5}",
            "server", "weight", "speed", "new conns", "share", "mean active", "peak"
        );
        for m in &minutes {
            let _ = write!(header, " {:>6}", format!("t={m}"));
        }
        let _ = writeln!(out, "{header}");
        for (i, s) in res.servers.iter().enumerate() {
            let mut line = format!(
                "  {:<15} {:>6} {:>5} {:>9} {:>7} {:>11.1} {:>5}",
                if s.present {
                    s.ip.to_string()
                } else {
                    format!("{} (gone)", s.ip)
                },
                s.weight,
                number(s.speed),
                s.new_connections,
                pct(res.new_share(s.ip)),
                s.mean_active,
                s.peak_active
            );
            for &m in &minutes {
                let cell = res
                    .samples
                    .get(m as usize)
                    .and_then(|sample| sample.active.get(i).copied().flatten())
                    .map_or("-".to_string(), |a| a.to_string());
                let _ = write!(line, " {cell:>6}");
            }
            let _ = writeln!(out, "{line}");
        }
    }
    let _ = writeln!(out);
    let _ = writeln!(
        out,
        "t=M: active connections at the end of minute M (after that minute's events); - = not a server then"
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::SchedulerKind;
    use crate::simulate::workloads::{FewClients, Hetero, ScaleOut};

    #[test]
    fn tables_have_their_headers_and_one_line_per_row() {
        let mut so = ScaleOut {
            churn: vec![5.0],
            ..ScaleOut::default()
        };
        so.common.schedulers = vec![SchedulerKind::Rr, SchedulerKind::Wrr];
        so.common.minutes = 12;
        let text = scale_out(&so.run().unwrap());
        assert!(
            text.contains("scheduler      churn     t=5    t=10    t=12    fair  half-share"),
            "{text}"
        );
        for name in ["rr ", "wrr "] {
            let rows: Vec<&str> = text.lines().filter(|l| l.starts_with(name)).collect();
            assert_eq!(rows.len(), 1, "{text}");
            assert!(
                rows[0].contains(" 5%/min ") && rows[0].ends_with(">12 min"),
                "{text}"
            );
        }

        let mut fc = FewClients::default();
        fc.common.schedulers = vec![SchedulerKind::Rr];
        fc.common.minutes = 5;
        let text = few_clients(&fc.run().unwrap());
        assert!(
            text.contains("scheduler    .1   .2   .3   .4   .5   .6   .7   .8   skew   peak  idle"),
            "{text}"
        );

        let mut h = Hetero::default();
        h.common.schedulers = vec![SchedulerKind::Rr];
        h.common.minutes = 1;
        let text = hetero(&h.run().unwrap());
        assert!(
            text.contains("scheduler  server           speed weight   share mean active   peak"),
            "{text}"
        );
        assert_eq!(text.matches("10.0.0.").count(), 4, "{text}");
    }
}
