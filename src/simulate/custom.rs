//! `sluice simulate --workload FILE`: a workload described in a small TOML file (see
//! `docs/SIMULATE.md` and `config/simulate/*.toml`).
//!
//! Errors read like the daemon's config errors ([`ConfigError`]):
//! `file:line:column: field: message`, e.g.
//! `w.toml:7:10: servers[1].weight: 70000 is not 0..=65535`.
//! Type errors and unknown keys come from toml/serde with a byte span; the field path
//! is recovered from the surrounding text (the enclosing `[[table]]` and its index,
//! and the key on that line). Range and cross-field checks use the span every value
//! carries (`toml::Spanned`).
use crate::config::ConfigError;
use crate::model::SchedulerKind;
use crate::model::{Persistence, MAX_WEIGHT};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use toml::Spanned;

use super::engine::{self, Change, ClientSpec, Event, RunResult, Scenario, ServerSpec};

/// A parsed custom workload.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Workload {
    pub file: PathBuf,
    pub name: Option<String>,
    pub scenario: Scenario,
    pub schedulers: Vec<SchedulerKind>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CustomRow {
    /// max / mean of the active connections over the servers present at the end.
    pub skew: f64,
    pub result: RunResult,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CustomReport {
    pub workload: &'static str,
    pub params: Workload,
    pub rows: Vec<CustomRow>,
}

impl Workload {
    pub fn run(&self) -> Result<CustomReport, String> {
        let rows = self
            .schedulers
            .iter()
            .map(|&k| {
                engine::run(&self.scenario, k).map(|result| CustomRow {
                    skew: result.last().skew(),
                    result,
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(CustomReport {
            workload: "custom",
            params: self.clone(),
            rows,
        })
    }
}

/// Reads and checks a workload file.
pub fn load(path: &Path) -> Result<Workload, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
        file: path.to_path_buf(),
        line: 0,
        column: 0,
        field: String::new(),
        message: format!("cannot read workload file: {e}"),
    })?;
    parse(&text, path)
}

/// Checks workload `text`; `path` is used in errors and kept in the result.
pub fn parse(text: &str, path: &Path) -> Result<Workload, ConfigError> {
    let at = |span: usize, field: String, message: String| {
        let (line, column) = line_column(text, span);
        ConfigError {
            file: path.to_path_buf(),
            line,
            column,
            field,
            message,
        }
    };
    let file: FileSpec = toml::from_str(text).map_err(|e| {
        let start = e.span().map_or(0, |s| s.start);
        let mut field = field_at(text, start);
        let message = one_line(e.message());
        // "missing field `ip`" points at the table: name the field too.
        if let Some(name) = message
            .strip_prefix("missing field `")
            .and_then(|rest| rest.split('`').next())
        {
            field = join(&field, name);
        }
        at(start, field, message)
    })?;
    file.check(path).map_err(
        |Invalid {
             at: span,
             field,
             message,
         }| at(span, field, message),
    )
}

// --- the file's layout ---------------------------------------------------------------

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileSpec {
    name: Option<String>,
    minutes: Option<Spanned<i64>>,
    step_seconds: Option<Spanned<i64>>,
    seed: Option<Spanned<i64>>,
    schedulers: Option<Vec<Spanned<String>>>,
    churn: Option<Spanned<f64>>,
    arrival_rate: Option<Spanned<f64>>,
    lifetime: Option<Spanned<f64>>,
    arrival_sources: Option<Spanned<i64>>,
    workers: Option<Spanned<i64>>,
    linger: Option<Spanned<i64>>,
    persistence_timeout: Option<Spanned<i64>>,
    persistence_netmask: Option<Spanned<String>>,
    #[serde(default)]
    servers: Vec<ServerEntry>,
    #[serde(default)]
    clients: Vec<ClientEntry>,
    #[serde(default)]
    events: Vec<EventEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ServerEntry {
    ip: Spanned<String>,
    weight: Option<Spanned<i64>>,
    speed: Option<Spanned<f64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ClientEntry {
    count: Option<Spanned<i64>>,
    connections: Spanned<i64>,
    first_ip: Option<Spanned<String>>,
    ip_step: Option<Spanned<i64>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct EventEntry {
    minute: Spanned<i64>,
    action: Spanned<String>,
    ip: Spanned<String>,
    weight: Option<Spanned<i64>>,
    speed: Option<Spanned<f64>>,
}

/// A complaint about one value: byte offset, field path, message.
struct Invalid {
    at: usize,
    field: String,
    message: String,
}

type Check<T> = Result<T, Invalid>;

fn invalid<T>(at: usize, field: &str, message: impl Into<String>) -> Check<T> {
    Err(Invalid {
        at,
        field: field.to_string(),
        message: message.into(),
    })
}

fn int(
    value: &Option<Spanned<i64>>,
    field: &str,
    range: RangeInclusive<i64>,
    default: i64,
) -> Check<i64> {
    match value {
        None => Ok(default),
        Some(v) => int_req(v, field, range),
    }
}

fn int_req(v: &Spanned<i64>, field: &str, range: RangeInclusive<i64>) -> Check<i64> {
    let n = *v.get_ref();
    if range.contains(&n) {
        Ok(n)
    } else {
        invalid(
            v.span().start,
            field,
            format!("{n} is not {}..={}", range.start(), range.end()),
        )
    }
}

fn float(
    value: &Option<Spanned<f64>>,
    field: &str,
    ok: impl Fn(f64) -> bool,
    rule: &str,
    default: f64,
) -> Check<f64> {
    match value {
        None => Ok(default),
        Some(v) if ok(*v.get_ref()) && v.get_ref().is_finite() => Ok(*v.get_ref()),
        Some(v) => invalid(
            v.span().start,
            field,
            format!("{} is not {rule}", v.get_ref()),
        ),
    }
}

fn address(v: &Spanned<String>, field: &str) -> Check<Ipv4Addr> {
    v.get_ref().parse().or_else(|_| {
        invalid(
            v.span().start,
            field,
            format!("{:?} is not an IPv4 address (a.b.c.d)", v.get_ref()),
        )
    })
}

fn weight(v: &Option<Spanned<i64>>, field: &str) -> Check<u32> {
    int(v, field, 0..=i64::from(MAX_WEIGHT), 1).map(|w| w as u32)
}

fn speed(v: &Option<Spanned<f64>>, field: &str) -> Check<f64> {
    float(
        v,
        field,
        |s| s > 0.0 && s <= 1e6,
        "a speed > 0 (at most 1000000)",
        1.0,
    )
}

impl FileSpec {
    fn check(self, path: &Path) -> Check<Workload> {
        let minutes = int(
            &self.minutes,
            "minutes",
            1..=i64::from(engine::MAX_MINUTES),
            60,
        )? as u32;
        let step_s = int(&self.step_seconds, "step_seconds", 1..=60, 1)? as u32;
        if 60 % step_s != 0 {
            let at = self.step_seconds.as_ref().map_or(0, |s| s.span().start);
            return invalid(at, "step_seconds", format!("{step_s} does not divide 60"));
        }
        let seed = int(&self.seed, "seed", 0..=i64::MAX, 1)? as u64;
        let schedulers = match &self.schedulers {
            None => SchedulerKind::ALL.to_vec(),
            Some(names) => {
                if names.is_empty() {
                    return invalid(0, "schedulers", "empty: name at least one scheduler");
                }
                names
                    .iter()
                    .enumerate()
                    .map(|(i, n)| {
                        n.get_ref()
                            .parse::<SchedulerKind>()
                            .or_else(|e| invalid(n.span().start, &format!("schedulers[{i}]"), e))
                    })
                    .collect::<Check<Vec<_>>>()?
            }
        };
        let churn_percent = float(
            &self.churn,
            "churn",
            |c| (0.0..=100.0).contains(&c),
            "a percentage 0..=100",
            0.0,
        )?;
        let arrival_rate = float(
            &self.arrival_rate,
            "arrival_rate",
            |r| (0.0..=1e6).contains(&r),
            "a rate 0..=1000000 per second",
            0.0,
        )?;
        let mean_lifetime_s = float(
            &self.lifetime,
            "lifetime",
            |l| l > 0.0 && l <= 1e7,
            "a number of seconds > 0",
            1.0,
        )?;
        let arrival_sources = int(
            &self.arrival_sources,
            "arrival_sources",
            1..=16_777_216,
            1000,
        )? as u32;
        let workers = int(&self.workers, "workers", 1..=256, 1)? as u32;
        let linger_s = int(&self.linger, "linger", 0..=86_400, 0)? as u32;
        let persistence = match (&self.persistence_timeout, &self.persistence_netmask) {
            (None, None) => None,
            (None, Some(mask)) => {
                return invalid(
                    mask.span().start,
                    "persistence_netmask",
                    "needs persistence_timeout (as -M needs -p)",
                )
            }
            (Some(t), mask) => {
                let timeout_s = int_req(t, "persistence_timeout", 1..=2_678_400)? as u32;
                let mut p = Persistence::new(timeout_s);
                if let Some(mask) = mask {
                    p.netmask = address(mask, "persistence_netmask")?;
                    if !p.netmask_is_contiguous() {
                        return invalid(
                            mask.span().start,
                            "persistence_netmask",
                            format!("{} is not a contiguous netmask", p.netmask),
                        );
                    }
                }
                Some(p)
            }
        };

        let mut servers = Vec::new();
        let mut present: HashMap<Ipv4Addr, ()> = HashMap::new();
        for (i, s) in self.servers.iter().enumerate() {
            let f = |k: &str| format!("servers[{i}].{k}");
            let ip = address(&s.ip, &f("ip"))?;
            if present.insert(ip, ()).is_some() {
                return invalid(s.ip.span().start, &f("ip"), format!("{ip} is listed twice"));
            }
            servers.push(ServerSpec {
                ip,
                weight: weight(&s.weight, &f("weight"))?,
                speed: speed(&s.speed, &f("speed"))?,
            });
        }

        let mut clients = Vec::new();
        let mut next_ip = u32::from(Ipv4Addr::new(198, 18, 0, 1));
        let mut connections: i64 = 0;
        for (i, c) in self.clients.iter().enumerate() {
            let f = |k: &str| format!("clients[{i}].{k}");
            let count = int(&c.count, &f("count"), 1..=1_000_000, 1)? as u32;
            let each = int_req(&c.connections, &f("connections"), 0..=1_000_000)? as u32;
            connections += i64::from(count) * i64::from(each);
            if connections > 10_000_000 {
                return invalid(
                    c.connections.span().start,
                    &f("connections"),
                    "more than 10000000 long-lived connections in all",
                );
            }
            let step = int(&c.ip_step, &f("ip_step"), 1..=16_777_216, 1)? as u32;
            if let Some(first) = &c.first_ip {
                next_ip = u32::from(address(first, &f("first_ip"))?);
            }
            for _ in 0..count {
                clients.push(ClientSpec {
                    ip: Ipv4Addr::from(next_ip),
                    connections: each,
                });
                next_ip = next_ip.wrapping_add(step);
            }
        }

        // Events: checked in the order they will happen (minute, then file order), so
        // "no such server" means "not at that minute".
        let mut order: Vec<usize> = (0..self.events.len()).collect();
        order.sort_by_key(|&i| *self.events[i].minute.get_ref());
        let mut events = Vec::new();
        for i in order {
            let e = &self.events[i];
            let f = |k: &str| format!("events[{i}].{k}");
            let minute = int_req(&e.minute, &f("minute"), 0..=i64::from(minutes))? as u32;
            let ip = address(&e.ip, &f("ip"))?;
            let at_ip = e.ip.span().start;
            let change = match e.action.get_ref().as_str() {
                "add" => {
                    if present.insert(ip, ()).is_some() {
                        return invalid(
                            at_ip,
                            &f("ip"),
                            format!("{ip} is already a server at minute {minute}"),
                        );
                    }
                    Change::Add(ServerSpec {
                        ip,
                        weight: weight(&e.weight, &f("weight"))?,
                        speed: speed(&e.speed, &f("speed"))?,
                    })
                }
                action @ ("remove" | "weight") => {
                    if !present.contains_key(&ip) {
                        return invalid(
                            at_ip,
                            &f("ip"),
                            format!("{ip} is not a server at minute {minute}"),
                        );
                    }
                    if let Some(s) = &e.speed {
                        return invalid(
                            s.span().start,
                            &f("speed"),
                            "only an \"add\" sets a speed",
                        );
                    }
                    if action == "remove" {
                        if let Some(w) = &e.weight {
                            return invalid(
                                w.span().start,
                                &f("weight"),
                                "a \"remove\" takes no weight",
                            );
                        }
                        present.remove(&ip);
                        Change::Remove(ip)
                    } else {
                        let Some(w) = &e.weight else {
                            return invalid(
                                e.action.span().start,
                                &f("weight"),
                                "missing: a \"weight\" event needs weight = N",
                            );
                        };
                        Change::SetWeight(ip, weight(&Some(w.clone()), &f("weight"))?)
                    }
                }
                other => {
                    return invalid(
                        e.action.span().start,
                        &f("action"),
                        format!("unknown action {other:?} (known: add, remove, weight)"),
                    )
                }
            };
            events.push((i, Event { minute, change }));
        }
        // Back to file order within a minute (the engine sorts stably by minute).
        events.sort_by_key(|(i, _)| *i);
        let events: Vec<Event> = events.into_iter().map(|(_, e)| e).collect();

        if servers.is_empty() && !events.iter().any(|e| matches!(e.change, Change::Add(_))) {
            return invalid(
                0,
                "servers",
                "no servers: add at least one [[servers]] table",
            );
        }
        if clients.iter().all(|c| c.connections == 0) && arrival_rate == 0.0 {
            return invalid(
                0,
                "",
                "no connections: add [[clients]] with connections, or an arrival_rate",
            );
        }
        let scenario = Scenario {
            servers,
            events,
            clients,
            churn_percent,
            arrival_rate,
            mean_lifetime_s,
            arrival_sources,
            minutes,
            step_s,
            seed,
            workers,
            persistence,
            linger_s,
        };
        // Everything above should have caught what this would; keep it as a backstop.
        scenario.validate().or_else(|e| invalid(0, "", e))?;
        Ok(Workload {
            file: path.to_path_buf(),
            name: self.name,
            scenario,
            schedulers,
        })
    }
}

// --- positions -----------------------------------------------------------------------

/// 1-based line and column (in characters) of byte offset `at`.
fn line_column(text: &str, at: usize) -> (usize, usize) {
    let mut at = at.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    let before = &text[..at];
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    (
        before.matches('\n').count() + 1,
        before[line_start..].chars().count() + 1,
    )
}

fn one_line(message: &str) -> String {
    message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(": ")
}

fn join(table: &str, key: &str) -> String {
    if table.is_empty() {
        key.to_string()
    } else {
        format!("{table}.{key}")
    }
}

/// Best-effort field path at byte `at`: the enclosing `[[name]]` element (with its
/// index) or `[name]` table, plus the bare key of a `key = value` line.
fn field_at(text: &str, at: usize) -> String {
    let mut table = String::new();
    let mut counts: HashMap<String, usize> = HashMap::new();
    let mut offset = 0;
    for line in text.split_inclusive('\n') {
        let trimmed = line.trim();
        if let Some(name) = trimmed.strip_prefix("[[") {
            let name = name.split(']').next().unwrap_or("").trim().to_string();
            let n = counts.entry(name.clone()).or_insert(0);
            table = format!("{name}[{n}]");
            *n += 1;
        } else if let Some(name) = trimmed.strip_prefix('[') {
            table = name.split(']').next().unwrap_or("").trim().to_string();
        }
        let here = at < offset + line.len();
        offset += line.len();
        if !here {
            continue;
        }
        if trimmed.starts_with('[') {
            return table;
        }
        return match trimmed.split_once('=') {
            Some((key, _))
                if !key.trim().is_empty()
                    && key
                        .trim()
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') =>
            {
                join(&table, key.trim())
            }
            _ => table,
        };
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLES: [(&str, &str); 2] = [
        (
            "config/simulate/scale-out-drain.toml",
            include_str!("../../config/simulate/scale-out-drain.toml"),
        ),
        (
            "config/simulate/sticky-office.toml",
            include_str!("../../config/simulate/sticky-office.toml"),
        ),
    ];

    fn error(text: &str) -> ConfigError {
        parse(text, Path::new("w.toml")).expect_err("should be rejected")
    }

    /// The error names the file, line and field and says what is wrong.
    fn assert_rejected(text: &str, line: usize, field: &str, needle: &str) {
        let e = error(text);
        assert_eq!((e.line, e.field.as_str()), (line, field), "{e}");
        assert!(e.message.contains(needle), "{e}");
        let shown = e.to_string();
        assert!(shown.starts_with(&format!("w.toml:{line}:")), "{shown}");
    }

    const GOOD: &str = "minutes = 10\nschedulers = [\"rr\"]\n\n[[servers]]\nip = \"10.0.0.1\"\n\n[[servers]]\nip = \"10.0.0.2\"\nweight = 2\n\n[[clients]]\ncount = 2\nconnections = 5\n";

    #[test]
    fn a_small_file_parses_with_defaults() {
        let w = parse(GOOD, Path::new("w.toml")).unwrap();
        assert_eq!(w.schedulers, vec![SchedulerKind::Rr]);
        let sc = &w.scenario;
        assert_eq!(sc.minutes, 10);
        assert_eq!(sc.servers[1].weight, 2);
        assert_eq!(sc.servers[0].speed, 1.0);
        assert_eq!(sc.clients.len(), 2);
        assert_eq!(sc.clients[1].ip, Ipv4Addr::new(198, 18, 0, 2));
        assert_eq!(sc.churn_percent, 0.0);
        assert!(sc.persistence.is_none());
        let report = w.run().unwrap();
        assert_eq!(report.rows[0].result.last().total(), 10);
    }

    #[test]
    fn the_example_files_parse_and_run() {
        for (path, text) in EXAMPLES {
            let mut w = parse(text, Path::new(path)).unwrap_or_else(|e| panic!("{e}"));
            w.scenario.minutes = w.scenario.minutes.min(3);
            w.scenario.events.retain(|e| e.minute <= 3);
            w.run().unwrap_or_else(|e| panic!("{path}: {e}"));
        }
    }

    #[test]
    fn type_errors_and_unknown_keys_name_line_and_field() {
        assert_rejected(
            &GOOD.replace("weight = 2", "weigth = 2"),
            9,
            "servers[1].weigth",
            "unknown field `weigth`",
        );
        assert_rejected(
            &GOOD.replace("weight = 2", "weight = \"heavy\""),
            9,
            "servers[1].weight",
            "invalid type: string",
        );
        assert_rejected(
            &GOOD.replace("minutes = 10", "minutes = 1 0"),
            1,
            "minutes",
            "",
        );
        assert_rejected(
            &GOOD.replace("ip = \"10.0.0.2\"\n", ""),
            7,
            "servers[1].ip",
            "missing field `ip`",
        );
    }

    #[test]
    fn bad_values_name_line_column_and_field() {
        let e = error(&GOOD.replace("weight = 2", "weight = 70000"));
        assert_eq!(
            e.to_string(),
            "w.toml:9:10: servers[1].weight: 70000 is not 0..=65535"
        );
        assert_rejected(
            &GOOD.replace("\"10.0.0.2\"", "\"10.0.0.300\""),
            8,
            "servers[1].ip",
            "is not an IPv4 address",
        );
        assert_rejected(
            &GOOD.replace("\"10.0.0.2\"", "\"10.0.0.1\""),
            8,
            "servers[1].ip",
            "listed twice",
        );
        assert_rejected(
            &GOOD.replace("[\"rr\"]", "[\"rr\", \"fastest\"]"),
            2,
            "schedulers[1]",
            "unknown scheduler \"fastest\" (known: ",
        );
        assert_rejected(
            &GOOD.replace("minutes = 10", "minutes = 10\nchurn = 150"),
            2,
            "churn",
            "is not a percentage",
        );
        assert_rejected(
            &GOOD.replace(
                "minutes = 10",
                "minutes = 10\npersistence_netmask = \"255.0.255.0\"",
            ),
            2,
            "persistence_netmask",
            "needs persistence_timeout",
        );
        assert_rejected(
            &GOOD.replace(
                "minutes = 10",
                "minutes = 10\npersistence_timeout = 60\npersistence_netmask = \"255.0.255.0\"",
            ),
            3,
            "persistence_netmask",
            "not a contiguous netmask",
        );
    }

    #[test]
    fn events_are_checked_in_time_order() {
        let add = "\n[[events]]\nminute = 5\naction = \"add\"\nip = \"10.0.0.3\"\n";
        let remove_later = "\n[[events]]\nminute = 8\naction = \"remove\"\nip = \"10.0.0.3\"\n";
        // Written remove-first, but it happens after the add: fine.
        let w = parse(&format!("{GOOD}{remove_later}{add}"), Path::new("w.toml")).unwrap();
        assert_eq!(w.scenario.events.len(), 2);
        let remove_early = remove_later.replace("minute = 8", "minute = 2");
        let text = format!("{GOOD}{add}{remove_early}");
        let line = text.lines().count();
        assert_rejected(
            &text,
            line,
            "events[1].ip",
            "10.0.0.3 is not a server at minute 2",
        );
        assert_rejected(
            &format!("{GOOD}{}", add.replace("add", "explode")),
            17,
            "events[0].action",
            "unknown action \"explode\"",
        );
        assert_rejected(
            &format!("{GOOD}{}", add.replace("minute = 5", "minute = 11")),
            16,
            "events[0].minute",
            "11 is not 0..=10",
        );
        assert_rejected(
            &format!(
                "{GOOD}{}",
                add.replace("add", "weight").replace("10.0.0.3", "10.0.0.2")
            ),
            17,
            "events[0].weight",
            "needs weight = N",
        );
    }

    #[test]
    fn an_unreadable_file_names_the_file() {
        let e = load(Path::new("/nonexistent/w.toml")).unwrap_err();
        assert_eq!(e.line, 0);
        assert!(
            e.to_string()
                .starts_with("/nonexistent/w.toml: cannot read"),
            "{e}"
        );
    }
}
