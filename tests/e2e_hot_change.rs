//! Tier 3, hot changes under load, end to end with real kernels: a NAT test
//! bed (client on its own subnet, four real servers running `e2e_apps.py serve --echo`),
//! one TCP service, and `e2e_apps.py stream` in the client: 20 long-lived connections
//! each sending a small numbered line every 50 ms, plus 20 new short connections a
//! second. Meanwhile the test removes and re-adds real server rs4 50 times, edits
//! every weight and switches the scheduler each round, recording the wall-clock time
//! before and after each `sluicectl` call. Then it takes rs4 out of the config file
//! and puts it back 6 times (switching the scheduler with it), applied by
//! `sluicectl reload` and by SIGHUP in turn, as `systemctl reload` does.
//!
//! rs4 is in the service when the long connections open (round robin over four
//! servers: five of them land on rs4), so its removals must spare established
//! sessions, as IPVS does. What must hold:
//! - every request on every long connection answered, by the same server each time
//!   (the client checks the echo and the server name of each answer);
//! - every new connection answered;
//! - a new connection answered by rs4 was opened (its SYNs: between its `t_start`
//!   and `t_connected`) while rs4 may have been in the service: within some
//!   [before the add call, after the remove call returned]. Anything else is a
//!   misroute;
//! - Sluice dropped nothing while the traffic ran (every drop counter but the ARP
//!   ones unchanged: e.g. `tcp_no_session` for a packet of a lost session,
//!   `no_real_server`, `not_local` for a reply without a session), and no kernel saw
//!   a checksum error.
//!
//! Run: `cargo test --release --test integration e2e_hot_change:: -- --nocapture` (as root).

use crate::common::*;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const APPLIANCE: &str = "198.18.0.1";
const CLIENT: &str = "198.18.2.100/24";
const GATEWAY: &str = "198.18.2.1";
const VIP: &str = "198.18.1.1";
const VPORT: u16 = 80;
const ECHO_PORT: u16 = 7000;
/// Long-lived connections, and the interval between two requests on each.
const LONG: u32 = 20;
const INTERVAL_MS: u64 = 50;
/// New connections a second.
const NEW_PER_S: u32 = 20;
/// Rounds of remove rs4 / edit weights / switch scheduler / add rs4 / edit its weight.
const ROUNDS: usize = 50;
/// Pause after each step of a round: the traffic sees every state for a while.
const STEP_PAUSE: Duration = Duration::from_millis(120);
/// Rounds of rs4 out of the config file and back, applied by `sluicectl reload` and
/// SIGHUP in turn.
const RELOAD_ROUNDS: usize = 6;
/// The schedulers the rounds cycle through.
const SCHEDULERS: [&str; 8] = ["wlc", "rr", "wrr", "lc", "mh", "sh", "sed", "wrandom"];
/// The client's own bound (it stops earlier, when told to).
const CLIENT_MAX_S: u64 = 120;

/// One new connection of the stream client's report.
#[derive(Debug, Clone)]
struct NewConn {
    t_start: f64,
    t_connected: Option<f64>,
    t_end: f64,
    server: Option<String>,
    error: Option<String>,
}

impl NewConn {
    fn parse(v: &serde_json::Value) -> NewConn {
        let f = |k: &str| {
            v[k].as_f64()
                .unwrap_or_else(|| panic!("new connection without {k}: {v}"))
        };
        NewConn {
            t_start: f("t_start"),
            t_connected: v["t_connected"].as_f64(),
            t_end: f("t_end"),
            server: v["server"].as_str().map(str::to_string),
            error: v["error"].as_str().map(str::to_string),
        }
    }
}

/// The new connections answered by `server` whose SYNs (sent between `t_start` and
/// `t_connected`) overlap none of `windows`, the wall-clock intervals [from, to] in
/// which `server` may have been in the service: misroutes.
fn outside_windows(conns: &[NewConn], server: &str, windows: &[(f64, f64)]) -> Vec<String> {
    conns
        .iter()
        .filter(|c| c.server.as_deref() == Some(server))
        .filter(|c| {
            let syn_end = c.t_connected.unwrap_or(c.t_end);
            !windows
                .iter()
                .any(|&(from, to)| c.t_start <= to && syn_end >= from)
        })
        .map(|c| {
            format!(
                "a new connection reached {server} while it was not in the service: \
                 SYNs within [{:.6}, {:.6}]",
                c.t_start,
                c.t_connected.unwrap_or(c.t_end)
            )
        })
        .collect()
}

#[test]
fn hot_changes_under_load_keep_sessions_and_route_new_ones_to_present_servers() {
    require_root();
    let mut lab = AppLab::new(4);
    lab.bed.configure("client-addr", &[CLIENT, GATEWAY]);
    lab.bed.configure("rs-gateway", &[APPLIANCE]);
    let echo = format!("0.0.0.0:{ECHO_PORT}");
    lab.start_servers_listening(&[("--echo", &echo)]);
    let rips: Vec<String> = (1..=4).map(|i| lab.bed.rs_ip(i).to_string()).collect();
    let servers: Vec<(&str, u16, u32, &str)> = rips
        .iter()
        .map(|r| (r.as_str(), ECHO_PORT, 1, "nat"))
        .collect();
    // Round robin while the long connections open: 20 over 4 servers, 5 on rs4.
    let toml = service_section("tcp", VIP, VPORT, "rr", &[], &servers);
    let daemon = lab.daemon(
        &[&format!("{APPLIANCE}/24"), &format!("{GATEWAY}/24")],
        toml.clone(),
    );
    lab.prewarm(&daemon, GATEWAY);
    let before = daemon.status();

    let service = format!("{VIP}:{VPORT}");
    let rs = |i: usize| format!("{}:{ECHO_PORT}", rips[i - 1]);
    let (long_s, interval_s, rate_s, max_s) = (
        LONG.to_string(),
        INTERVAL_MS.to_string(),
        NEW_PER_S.to_string(),
        CLIENT_MAX_S.to_string(),
    );
    let client = lab.stream(
        "hot",
        VIP,
        VPORT,
        &[
            "--long",
            &long_s,
            "--interval-ms",
            &interval_s,
            "--new-per-s",
            &rate_s,
            "--duration",
            &max_s,
            "--timeout",
            "5",
        ],
    );

    // rs4 is in the service from the start until the first removal returns, then
    // from before each add until the next removal returns, and after the last add.
    let started = Instant::now();
    let mut windows: Vec<(f64, f64)> = Vec::new();
    let mut open_since = f64::NEG_INFINITY;
    let mut changes = 0u32;
    for round in 0..ROUNDS {
        let (_, removed) = daemon.ctl_timed(&["-d", "-t", &service, "-r", &rs(4)]);
        windows.push((open_since, removed));
        changes += 1;
        std::thread::sleep(STEP_PAUSE);
        for i in 1..=3 {
            let weight = ((round + i) % 4 + 1).to_string();
            daemon.ctl_timed(&["-e", "-t", &service, "-r", &rs(i), "-m", "-w", &weight]);
            changes += 1;
        }
        let scheduler = SCHEDULERS[round % SCHEDULERS.len()];
        daemon.ctl_timed(&["-E", "-t", &service, "-s", scheduler]);
        changes += 1;
        std::thread::sleep(STEP_PAUSE);
        let weight = (round % 3 + 1).to_string();
        let (adding, _) =
            daemon.ctl_timed(&["-a", "-t", &service, "-r", &rs(4), "-m", "-w", &weight]);
        open_since = adding;
        changes += 1;
        std::thread::sleep(STEP_PAUSE);
        let weight = (round % 3 + 2).to_string();
        daemon.ctl_timed(&["-e", "-t", &service, "-r", &rs(4), "-m", "-w", &weight]);
        changes += 1;
        std::thread::sleep(STEP_PAUSE);
    }
    // The last state is what the rounds left: every worker has it.
    let list = daemon.list_services();
    let svc = find_service(&list, "tcp", VIP, VPORT).expect("the service is listed");
    assert_eq!(
        svc["scheduler"],
        SCHEDULERS[(ROUNDS - 1) % SCHEDULERS.len()],
        "{svc}"
    );
    let rs4 = real_server(&list, "tcp", VIP, VPORT, &rips[3]);
    assert_eq!(
        rs_counter(rs4, "weight"),
        ((ROUNDS - 1) % 3 + 2) as u64,
        "{rs4}"
    );

    // Then the same through the config file, as `systemctl reload` applies it (the
    // unit's ExecReload is `sluicectl reload`; SIGHUP does the same): rs4 out of the
    // file with the scheduler switched to wlc, then the file as it started, each by
    // one means and back by the other. A reload's change is in the listing when
    // `sluicectl reload` returns; a SIGHUP's once the listing shows it. rs4's long
    // connections live through its removals as through `-d`.
    let path = daemon.config_path.clone();
    let file = std::fs::read_to_string(&path).unwrap();
    assert_eq!(file.matches(&toml).count(), 1, "{file}");
    let without_rs4 = file.replace(
        &toml,
        &service_section("tcp", VIP, VPORT, "wlc", &[], &servers[..3]),
    );
    let listed = || {
        let list = daemon.list_services();
        let svc = find_service(&list, "tcp", VIP, VPORT).expect("the service is listed");
        let rs4 = svc["real_servers"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["ip"] == rips[3].as_str());
        (svc["scheduler"].as_str().unwrap().to_string(), rs4)
    };
    let apply = |text: &str, by_ctl: bool, want: (&str, bool)| -> (f64, f64) {
        std::fs::write(&path, text).unwrap();
        let (before, after) = if by_ctl {
            let (before, after) = daemon.ctl_timed(&["reload"]);
            assert_eq!(listed(), (want.0.to_string(), want.1), "reload returned");
            (before, after)
        } else {
            let before = wall_now();
            daemon.signal(libc::SIGHUP);
            let seen = wait_for(Duration::from_secs(5), Duration::from_millis(20), || {
                (listed() == (want.0.to_string(), want.1)).then_some(())
            });
            assert!(seen.is_some(), "SIGHUP not applied\n{}", daemon.dump());
            (before, wall_now())
        };
        std::thread::sleep(STEP_PAUSE * 3);
        (before, after)
    };
    for round in 0..RELOAD_ROUNDS {
        let (_, removed) = apply(&without_rs4, round % 2 == 0, ("wlc", false));
        windows.push((open_since, removed));
        let (adding, _) = apply(&file, round % 2 == 1, ("rr", true));
        open_since = adding;
        changes += 2;
    }
    windows.push((open_since, f64::INFINITY));
    let changing = started.elapsed();
    let list = daemon.list_services();
    let rs4 = real_server(&list, "tcp", VIP, VPORT, &rips[3]);
    assert_eq!(rs_counter(rs4, "weight"), 1, "the file's weight: {rs4}");

    let (report, exit, client_stderr) = client.stop_and_report_with_exit();
    let status = daemon.status();

    // Figures.
    let mut failures: Vec<String> = Vec::new();
    let long = report["long"].as_array().expect("long connections");
    let mut long_by_server: BTreeMap<String, u64> = BTreeMap::new();
    let (mut long_sent, mut long_ok) = (0u64, 0u64);
    for (i, l) in long.iter().enumerate() {
        let server = l["server"].as_str().unwrap_or("none").to_string();
        let (sent, ok) = (l["sent"].as_u64().unwrap(), l["ok"].as_u64().unwrap());
        long_sent += sent;
        long_ok += ok;
        *long_by_server.entry(server.clone()).or_default() += 1;
        for f in l["failures"].as_array().unwrap() {
            failures.push(format!("long connection {i} (on {server}): {f}"));
        }
        if sent != ok || l["server"].is_null() {
            failures.push(format!("long connection {i}: {l}"));
        }
        // It streamed through all the changes: at least half the requests its
        // interval allows (the client's own pace includes each answer's wait).
        let expected = changing.as_millis() as u64 / INTERVAL_MS;
        if ok < expected / 2 {
            failures.push(format!(
                "long connection {i} on {server}: only {ok} answers over {changing:?} \
                 (at least {} expected)",
                expected / 2
            ));
        }
    }
    let new: Vec<NewConn> = report["new"]
        .as_array()
        .expect("new connections")
        .iter()
        .map(NewConn::parse)
        .collect();
    let mut new_by_server: BTreeMap<String, u64> = BTreeMap::new();
    for (j, c) in new.iter().enumerate() {
        match (&c.server, &c.error) {
            (Some(s), None) => *new_by_server.entry(s.clone()).or_default() += 1,
            _ => failures.push(format!("new connection {j}: {c:?}")),
        }
    }
    let slowest_new = new
        .iter()
        .map(|c| c.t_end - c.t_start)
        .fold(0.0f64, f64::max);
    // Every drop reason that moved while the traffic ran; ARP frames Sluice consumes
    // count as drops too but are not lost packets.
    let moved_drops: BTreeMap<String, u64> = status["drops"]
        .as_object()
        .expect("status.drops")
        .keys()
        .map(|r| {
            (
                r.clone(),
                drop_count(&status, r).saturating_sub(drop_count(&before, r)),
            )
        })
        .filter(|(_, n)| *n > 0)
        .collect();
    // TCP retransmissions in every kernel (a figure: a stalled CPU can cause some).
    let mut kernels = vec![lab.bed.client_ns().to_string()];
    kernels.extend((1..=4).map(|i| lab.bed.rs_ns(i).to_string()));
    let retransmitted: u64 = kernels
        .iter()
        .map(|ns| {
            let out = lab
                .bed
                .exec(
                    ns,
                    &["nstat", "-asz", "TcpRetransSegs"],
                    Duration::from_secs(10),
                )
                .expect_success("nstat");
            out.stdout
                .lines()
                .find_map(|l| l.strip_prefix("TcpRetransSegs"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
                .unwrap_or(0)
        })
        .sum();
    eprintln!(
        "hot changes under load: {changes} changes ({ROUNDS} removals and adds of rs4, \
         weight edits, scheduler switches over {SCHEDULERS:?}) in {changing:.1?}; client ran \
         {} s, exit {exit:?}",
        report["seconds"]
    );
    eprintln!(
        "  long connections: {} ({long_by_server:?} by server), {long_sent} requests sent, \
         {long_ok} answered",
        long.len()
    );
    eprintln!(
        "  new connections: {} ({new_by_server:?} by server), slowest {slowest_new:.3} s",
        new.len()
    );
    eprintln!(
        "  sluice: {} sessions created, drop counters moved: {moved_drops:?}; TCP segments \
         retransmitted by the client and real servers: {retransmitted}",
        status["sessions_created"]
    );

    // Checks.
    failures.extend(outside_windows(&new, "rs4", &windows));
    if long.len() != LONG as usize {
        failures.push(format!("{} long connections reported", long.len()));
    }
    if long_by_server.get("rs4").copied().unwrap_or(0) == 0 {
        failures.push(format!(
            "no long connection on rs4, its removals proved nothing: {long_by_server:?}"
        ));
    }
    for server in ["rs1", "rs2", "rs3", "rs4"] {
        if new_by_server.get(server).copied().unwrap_or(0) == 0 {
            failures.push(format!(
                "no new connection reached {server}: {new_by_server:?}"
            ));
        }
    }
    // 20 a second while the rounds run: a client that fell far behind tested little.
    let expected_new = changing.as_secs() * u64::from(NEW_PER_S);
    if (new.len() as u64) < expected_new / 2 {
        failures.push(format!(
            "only {} new connections over {changing:?}",
            new.len()
        ));
    }
    for (reason, n) in &moved_drops {
        if !reason.starts_with("arp_") {
            failures.push(format!("sluice dropped {n} packets: {reason}"));
        }
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}\nrs4 windows: {windows:?}\n{}\n{}",
        failures.len(),
        failures.join("\n"),
        lab.diagnostics(),
        daemon.dump()
    );
    assert_eq!(exit, Some(0), "{client_stderr}");
    lab.assert_no_checksum_errors();
    daemon.stop_clean();
}

#[test]
fn the_window_check_catches_a_misroute() {
    let conn = |t_start: f64, t_connected: f64, server: &str| NewConn {
        t_start,
        t_connected: Some(t_connected),
        t_end: t_connected + 0.01,
        server: Some(server.into()),
        error: None,
    };
    let windows = [
        (f64::NEG_INFINITY, 10.0),
        (20.0, 30.0),
        (40.0, f64::INFINITY),
    ];
    // Inside a window, overlapping its edges, or on another server: fine.
    let fine = [
        conn(5.0, 5.1, "rs4"),
        conn(9.9, 10.2, "rs4"),
        conn(19.9, 20.1, "rs4"),
        conn(25.0, 25.1, "rs4"),
        conn(45.0, 45.1, "rs4"),
        conn(15.0, 15.1, "rs1"),
    ];
    assert!(outside_windows(&fine, "rs4", &windows).is_empty());
    // SYNs sent entirely while rs4 was out of the service: caught.
    let bad = [conn(15.0, 15.1, "rs4"), conn(10.01, 19.99, "rs4")];
    assert_eq!(outside_windows(&bad, "rs4", &windows).len(), 2);
    // No window at all: every rs4 connection is a misroute.
    assert_eq!(outside_windows(&fine[..5], "rs4", &[]).len(), 5);
}
