//! ipvsadm's table commands against a running daemon: `-S` / `-C` / `-R` round trip,
//! `--set` and `-L --timeout`, `-Z`, and bad input that must change nothing; access
//! lists and rate limits through `-S` / `-R`, the listings and `-Z`.
//!
//! Run: `cargo test --release --test integration cli_ipvsadm::` (as root).

use crate::common::*;
use std::time::Duration;

/// One loopback port and one emulated peer sending no malformed frames; no service.
fn loopback_config() -> DaemonConfig {
    let mut cfg = DaemonConfig::new(vec![PortSpec::loopback(
        "lan0",
        "02:53:4c:00:00:01",
        &["198.18.0.1/24"],
    )]);
    cfg.loopback = vec!["peers = 1".into(), "garbage_every = 0".into()];
    cfg
}

fn daemon() -> Daemon {
    require_root();
    let mut cfg = loopback_config();
    cfg.extra_toml = vec![
        service_section(
            "tcp",
            "198.18.1.1",
            80,
            "rr",
            &[
                "persistence_timeout = 600".into(),
                "persistence_netmask = \"255.255.255.0\"".into(),
            ],
            &[("198.18.0.2", 8080, 1, "nat"), ("198.18.0.3", 80, 3, "dr")],
        ),
        service_section(
            "udp",
            "198.18.1.2",
            53,
            "wrr",
            &["local_addresses = [\"198.18.0.50\", \"198.18.0.51\"]".into()],
            &[("198.18.0.4", 5353, 2, "fullnat")],
        ),
    ];
    Daemon::start(cfg)
}

fn ok(daemon: &Daemon, args: &[&str]) -> String {
    let out = daemon.ctl(args);
    assert!(out.success(), "{}\n{}", out.describe(), daemon.dump());
    out.stdout
}

#[test]
fn save_clear_restore_gives_back_the_same_table() {
    let daemon = daemon();
    let saved = ok(&daemon, &["-S", "-n"]);
    assert_eq!(
        saved,
        "-A -t 198.18.1.1:80 -s rr -p 600 -M 255.255.255.0\n\
         -a -t 198.18.1.1:80 -r 198.18.0.2:8080 -m -w 1\n\
         -a -t 198.18.1.1:80 -r 198.18.0.3:80 -g -w 3\n\
         -A -u 198.18.1.2:53 -s wrr\n\
         -a -u 198.18.1.2:53 -r 198.18.0.4:5353 -b -w 2\n\
         -P -u 198.18.1.2:53 -z 198.18.0.50\n\
         -P -u 198.18.1.2:53 -z 198.18.0.51\n"
    );
    // The emulated client connects meanwhile: compare without the connection counts
    // (the restored real servers are new ones, with counts of their own).
    let without_counts = |text: String| -> Vec<String> {
        text.lines()
            .map(|l| match l.trim_start().starts_with("->") {
                true => l.split_whitespace().take(4).collect::<Vec<_>>().join(" "),
                false => l.to_string(),
            })
            .collect()
    };
    let listed = without_counts(ok(&daemon, &["-L", "-n"]));
    ok(&daemon, &["-C"]);
    assert_eq!(ok(&daemon, &["-S"]), "", "-C left services");
    let out = daemon.restore(&saved);
    assert!(out.success(), "{}", out.describe());
    assert_eq!(ok(&daemon, &["-S", "-n"]), saved);
    assert_eq!(without_counts(ok(&daemon, &["-L", "-n"])), listed);
    // As ipvsadm: the FullNAT addresses come back too.
    assert!(ok(&daemon, &["-G", "-u", "198.18.1.2:53"]).contains("198.18.0.51"));
    daemon.stop_clean();
}

/// `sluicectl --socket SOCKET -R --atomic` with `input` on stdin, bounded (15 s).
fn restore_atomic(daemon: &Daemon, input: &str) -> CmdOutput {
    let file = daemon.config.path(&format!("restore-{}.txt", unique_tag()));
    std::fs::write(&file, input).expect("writing the restore input");
    let line = format!(
        "{SLUICECTL} --socket {} -R --atomic < {}",
        daemon.config.socket.display(),
        file.display()
    );
    run_bounded(
        std::process::Command::new("sh").args(["-c", &line]),
        Duration::from_secs(15),
    )
}

#[test]
fn a_bad_restore_line_changes_nothing() {
    let daemon = daemon();
    let before = ok(&daemon, &["-S", "-n"]);
    // Line 2 is fine on its own, line 3 fails in the daemon (no such service): the
    // batch is refused whole, line 2's service does not appear.
    let input = "-C\n-A -t 198.18.9.9:80 -s rr\n-a -t 198.18.7.7:80 -r 198.18.0.2:80 -m\n";
    let out = restore_atomic(&daemon, input);
    assert!(!out.success(), "{}", out.describe());
    assert!(
        out.stderr.contains("command 3 of 3") && out.stderr.contains("nothing was changed"),
        "{}",
        out.describe()
    );
    assert_eq!(ok(&daemon, &["-S", "-n"]), before);
    // A line Sluice cannot honour (a scheduler no one has) is caught before anything
    // is sent.
    let out = restore_atomic(&daemon, "-C\n-A -t 198.18.9.9:80 -s fastest\n");
    assert!(!out.success());
    assert!(
        out.stderr
            .contains("line 2: Sluice cannot honour -s fastest: no scheduler is called")
            && out.stderr.contains("nothing was changed"),
        "{}",
        out.describe()
    );
    assert_eq!(ok(&daemon, &["-S", "-n"]), before);
    // Line by line, a line ipvsadm refuses (its command not first) stops the restore
    // after the lines before, as ipvsadm's -R does, though Sluice's parser would
    // read it.
    let input = "-A -t 198.18.9.8:80 -s rr\n-t 198.18.9.9:80 -A -s rr\n-A -t 198.18.9.7:80 -s rr\n";
    let (out, _) = restore_timed(&daemon, input, false, Duration::from_secs(15));
    assert!(
        !out.success() && out.stderr.contains("line 2: Try `sluicectl -h'"),
        "{}",
        out.describe()
    );
    let saved = ok(&daemon, &["-S", "-n"]);
    assert!(saved.contains("-A -t 198.18.9.8:80 -s rr"), "{saved}");
    assert!(
        !saved.contains("198.18.9.9") && !saved.contains("198.18.9.7"),
        "{saved}"
    );
    daemon.stop_clean();
}

/// `-R` line by line with a refused line among 120 (one request to the daemon): the refused line is reported by
/// number with the daemon's words and changes nothing, every other line is applied,
/// and the whole restore is one snapshot (each publish rebuilds the workers' snapshot
/// from the whole table: one per line made a large restore take minutes).
#[test]
fn a_line_by_line_restore_with_a_refused_line_is_one_snapshot() {
    let daemon = daemon();
    // Publishes counted by the management loop, which waits for every worker's
    // adoption before it answers the change.
    let publishes = |d: &Daemon| {
        d.status()["snapshot_adoption"]["publishes"]
            .as_u64()
            .expect("snapshot_adoption.publishes")
    };
    let mut input = String::from("-A -t 198.18.9.1:80 -s wrr\n");
    // Line 2 names a service that does not exist.
    input.push_str("-a -t 198.18.9.2:80 -r 198.18.0.9:80 -m\n");
    for port in 1000..1118 {
        input.push_str(&format!("-a -t 198.18.9.1:80 -r 198.18.0.9:{port} -m\n"));
    }
    let before = publishes(&daemon);
    let (out, _) = restore_timed(&daemon, &input, false, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(1), "{}", out.describe());
    assert!(
        out.stderr.contains("line 2: ")
            && out.stderr.contains("1 line(s) not applied, 119 applied"),
        "{}",
        out.describe()
    );
    assert_eq!(publishes(&daemon), before + 1, "{}", daemon.dump());
    let saved = ok(&daemon, &["-S", "-n"]);
    assert_eq!(
        saved.matches("-a -t 198.18.9.1:80 -r 198.18.0.9:").count(),
        118,
        "{saved}"
    );
    assert!(!saved.contains("198.18.9.2"), "{saved}");
    daemon.stop_clean();
}

/// `sluicectl --socket SOCKET -R [--replace]` with `input` on stdin, timed; bounded by
/// `timeout`.
fn restore_timed(
    daemon: &Daemon,
    input: &str,
    replace: bool,
    timeout: Duration,
) -> (CmdOutput, Duration) {
    let file = daemon.config.path(&format!("restore-{}.txt", unique_tag()));
    std::fs::write(&file, input).expect("writing the restore input");
    let line = format!(
        "{SLUICECTL} --socket {} -R {} < {}",
        daemon.config.socket.display(),
        if replace { "--replace" } else { "" },
        file.display()
    );
    let started = std::time::Instant::now();
    let out = run_bounded(
        std::process::Command::new("sh").args(["-c", &line]),
        timeout,
    );
    (out, started.elapsed())
}

/// `-S -n`, timed.
fn save_timed(daemon: &Daemon) -> (String, Duration) {
    let started = std::time::Instant::now();
    let out = run_bounded(
        std::process::Command::new(SLUICECTL)
            .arg("--socket")
            .arg(&daemon.config.socket)
            .args(["--timeout", "30", "-S", "-n"]),
        Duration::from_secs(60),
    );
    assert!(out.success(), "{}\n{}", out.describe(), daemon.dump());
    (out.stdout, started.elapsed())
}

/// `-R --replace` of `saved` (what `-S -n` printed): `-S -n` prints it again, byte for
/// byte. Returns how long the restore took.
fn replace_gives_back(daemon: &Daemon, saved: &str) -> Duration {
    let (out, took) = restore_timed(daemon, saved, true, Duration::from_secs(120));
    assert!(out.success(), "{}\n{}", out.describe(), daemon.dump());
    let (again, _) = save_timed(daemon);
    assert!(
        again == saved,
        "-S after -R --replace is not byte-identical"
    );
    took
}

/// 100,000 services (25,000 with a real server), in the order and format `-S -n`
/// prints them.
fn big_table() -> String {
    let mut text = String::new();
    for i in 0..100_000u32 {
        let vip = std::net::Ipv4Addr::from(0x0a00_0001 + i);
        // Not mh: each Maglev service carries a 65537-entry table.
        let scheduler = ["rr", "wrr", "wlc", "lc"][(i % 4) as usize];
        text.push_str(&format!("-A -t {vip}:80 -s {scheduler}\n"));
        if i % 4 == 0 {
            // 750 addresses, each serving many services: the neighbour tables hold
            // 3072 real-server addresses by default.
            let rip = std::net::Ipv4Addr::from(0xac10_0001 + i % 3000);
            text.push_str(&format!("-a -t {vip}:80 -r {rip}:80 -g -w {}\n", 1 + i % 7));
        }
    }
    text
}

/// The documented recipe at scale: `-S > saved; -R --replace < saved` gives back the
/// same table, byte for byte, and a bad line anywhere in a replacing restore changes
/// nothing. The timings are printed (run with `--nocapture` to see them).
#[test]
fn save_and_replace_round_trip_100k_services() {
    let daemon = daemon();
    let table = big_table();
    let (out, loaded) = restore_timed(&daemon, &table, true, Duration::from_secs(120));
    assert!(out.success(), "{}\n{}", out.describe(), daemon.dump());
    let (saved, save_took) = save_timed(&daemon);
    assert_eq!(saved.lines().count(), 125_000);
    assert!(saved == table, "-S differs from what -R --replace loaded");

    let replaced = replace_gives_back(&daemon, &saved);

    // One real server that is the appliance's own address, as the last line: refused,
    // and the 100k services stay as they were.
    let bad = format!("{saved}-a -t 10.0.0.1:80 -r 198.18.0.1:80 -m\n");
    let (out, refused_after) = restore_timed(&daemon, &bad, true, Duration::from_secs(120));
    assert!(!out.success(), "{}", out.describe());
    assert!(
        out.stderr.contains("command 125001 of 125001")
            && out.stderr.contains("own port addresses")
            && out.stderr.contains("nothing was changed"),
        "{}",
        out.describe()
    );
    let (after, _) = save_timed(&daemon);
    assert!(after == saved, "a refused replace changed the table");
    eprintln!(
        "100k services (125,000 lines, {} bytes): -R --replace into the 2-service table {:?}, -S {:?}, -R --replace of the same table {:?}, refused -R --replace {:?}",
        table.len(),
        loaded,
        save_took,
        replaced,
        refused_after
    );
    daemon.stop_clean();
}

/// `-A` of one service and `-a` of `count` NAT real servers at address `rip`, ports
/// 1, 2, ..., as `-R` reads them.
fn one_service_of(rip: std::net::Ipv4Addr, count: u16) -> String {
    let mut text = String::from("-A -t 198.18.1.1:80 -s rr\n");
    for port in 1..=count {
        text.push_str(&format!("-a -t 198.18.1.1:80 -r {rip}:{port} -m -w 1\n"));
    }
    text
}

/// `status --json`'s real-server ids: (in use, waiting, limit).
fn real_server_ids(daemon: &Daemon) -> (u64, u64, u64) {
    let status = ok_json(daemon, &["status"]);
    let ids = &status["real_server_ids"];
    let field = |name: &str| ids[name].as_u64().unwrap_or_else(|| panic!("{status}"));
    (field("in_use"), field("waiting"), field("limit"))
}

/// The workers count each real server in one of 65,535 slots, by id: a daemon must
/// still take its 65,536th real server when earlier ones were removed (their ids come
/// back once nothing refers to them), and refuse, changing nothing, a table that would
/// hold more at once (removed servers count until released).
#[test]
fn real_servers_removed_give_their_ids_to_new_ones() {
    require_root();
    let cfg = loopback_config();
    // No service in the config: the emulated clients open connections to the
    // config's services only, and a removed server's id waits for its sessions (and
    // any template naming it).
    let daemon = Daemon::start(cfg);
    let released = |daemon: &Daemon, in_use: u64| {
        wait_for(Duration::from_secs(15), Duration::from_millis(200), || {
            let ids = real_server_ids(daemon);
            (ids.0 == in_use && ids.1 == 0).then_some(())
        })
        .unwrap_or_else(|| panic!("ids {:?}\n{}", real_server_ids(daemon), daemon.dump()));
    };
    let first = one_service_of(std::net::Ipv4Addr::new(10, 0, 0, 1), 40_000);
    let (out, _) = restore_timed(&daemon, &first, true, Duration::from_secs(120));
    assert!(out.success(), "{}\n{}", out.describe(), daemon.dump());
    released(&daemon, 40_000);
    assert_eq!(real_server_ids(&daemon).2, 65_535);

    // 40,000 others in their place at once: 80,000 ids held. Refused, nothing changed.
    let second = one_service_of(std::net::Ipv4Addr::new(10, 0, 0, 2), 40_000);
    let (out, _) = restore_timed(&daemon, &second, true, Duration::from_secs(120));
    assert!(!out.success(), "{}", out.describe());
    assert!(
        out.stderr
            .contains("too many real servers: at most 65535 real and sorry servers")
            && out.stderr.contains("nothing was changed"),
        "{}",
        out.describe()
    );
    let (saved, _) = save_timed(&daemon);
    assert!(saved == first, "a refused replace changed the table");
    assert_eq!(real_server_ids(&daemon).0, 40_000);

    // Cleared, the 40,000 ids come back (no session refers to them), and the same
    // 40,000 others are taken: 80,000 real servers over the daemon's life.
    ok(&daemon, &["-C"]);
    released(&daemon, 0);
    let (out, _) = restore_timed(&daemon, &second, true, Duration::from_secs(120));
    assert!(out.success(), "{}\n{}", out.describe(), daemon.dump());
    let (saved, _) = save_timed(&daemon);
    assert!(saved == second, "-S differs from what -R --replace loaded");
    assert_eq!(real_server_ids(&daemon).0, 40_000);
    daemon.stop_clean();
}

/// `[sessions] neighbours` sizes every worker's IPv4 and IPv6 neighbour tables, as
/// `neigh` reports them, and the service table takes three quarters of it in real
/// server addresses: the 769th address of 1024 is refused, changing nothing.
#[test]
fn the_neighbour_tables_are_the_size_the_config_gives() {
    require_root();
    let mut cfg = loopback_config();
    cfg.workers = vec![1, 2];
    cfg.cpus = Some(vec![1, 1]);
    cfg.extra_toml = vec!["[sessions]\nneighbours = 1024\n".into()];
    let daemon = Daemon::start(cfg);
    let report = ok_json(&daemon, &["neigh"]);
    let workers = report["workers"].as_array().expect("workers");
    assert_eq!(workers.len(), 2, "{report}");
    for w in workers {
        assert_eq!(
            (w["capacity"].as_u64(), w["capacity6"].as_u64()),
            (Some(1024), Some(1024)),
            "{report}"
        );
    }
    let mut table = String::from("-A -t 198.18.1.1:80 -s rr\n");
    for i in 0..768u32 {
        let rip = std::net::Ipv4Addr::from(0x0a00_0001 + i);
        table.push_str(&format!("-a -t 198.18.1.1:80 -r {rip}:80 -g -w 1\n"));
    }
    let (out, _) = restore_timed(&daemon, &table, true, Duration::from_secs(60));
    assert!(out.success(), "{}\n{}", out.describe(), daemon.dump());
    let out = daemon.ctl(&["-a", "-t", "198.18.1.1:80", "-r", "10.0.9.1", "-g"]);
    assert!(
        !out.success()
            && out.stderr.contains(
                "real server address 10.0.9.1: the workers' neighbour tables are sized for 768 \
                 distinct IPv4 real and sorry server addresses"
            ),
        "{}",
        out.describe()
    );
    let (saved, _) = save_timed(&daemon);
    assert!(saved == table, "a refused -a changed the table");
    // Another port of an address it holds is no new address.
    ok(
        &daemon,
        &["-a", "-t", "198.18.1.1:80", "-r", "10.0.0.1:8080", "-m"],
    );
    daemon.stop_clean();
}

/// The CLI meets the config's rules: each bad command fails (non-zero exit, one line
/// naming the problem) and `-S -n` shows the table unchanged afterwards.
#[test]
fn bad_commands_are_refused_and_change_nothing() {
    let daemon = daemon();
    let before = ok(&daemon, &["-S", "-n"]);
    let cases: &[(&str, i32, &str)] = &[
        (
            "-A -t 198.18.0.1:80",
            1,
            "VIP 198.18.0.1 is one of the appliance's own port addresses",
        ),
        (
            "-a -t 198.18.1.1:80 -r 198.18.0.1:8080 -m",
            1,
            "real server 198.18.0.1 is one of the appliance's own port addresses",
        ),
        (
            "-P -t 198.18.1.1:80 -z 198.18.0.1",
            1,
            "invalid local address 198.18.0.1: it is one of the appliance's own port addresses",
        ),
        (
            "-e -t 198.18.1.1:80 -r 198.18.0.2:8080 -m -w 1 -w 2",
            2,
            "multiple 'weight' options specified",
        ),
        (
            "-a -t 198.18.1.1:80 -r 198.18.0.9:8080 -m -g",
            2,
            "multiple 'forwarding-method' options specified",
        ),
        (
            "-E -t 198.18.1.1:80 -s rr -s wrr",
            2,
            "multiple 'scheduler' options specified",
        ),
        (
            "-e -t 198.18.1.1:80 -r 198.18.0.2:8080 -m -w 65536",
            2,
            "illegal weight \"65536\" (expected 0..=65535)",
        ),
        (
            "-e -t 198.18.1.1:80 -r 198.18.0.2:8080 -m -x 10 -y 20",
            1,
            "lower threshold 20 is higher than upper threshold 10",
        ),
        (
            "-e -t 198.18.1.1:80 -r 198.18.0.2:8080 -m -y 5",
            1,
            "lower threshold 5 is higher than upper threshold 0",
        ),
        (
            "-A -t 198.18.1.9:0 -p",
            1,
            "Zero port specified for service TCP 198.18.1.9:0",
        ),
        (
            "-A -t 198.18.1.9:80 -p 2678401",
            2,
            "illegal persistence timeout \"2678401\"",
        ),
        ("--set 1 1 2147484", 2, "illegal udp timeout \"2147484\""),
        // Options the command does not take (ipvsadm's commands_v_options): refused
        // as plain sluicectl too, before anything is sent (`-C` would flush all).
        (
            "-C -t 198.18.1.1:80",
            2,
            "Illegal 'service-address' option with the 'flush' command",
        ),
        (
            "-D -t 198.18.1.1:80 -s rr",
            2,
            "Illegal 'scheduler' option with the 'delete-service' command",
        ),
        (
            "-A -t 198.18.1.9:80 -r 198.18.0.9:80",
            2,
            "Illegal 'real-server' option with the 'add-service' command",
        ),
        (
            "-e -t 198.18.1.1:80 -r 198.18.0.2:8080 -m -x 2147483648",
            2,
            "illegal upper threshold \"2147483648\"",
        ),
    ];
    for (line, code, needle) in cases {
        let args: Vec<&str> = line.split_whitespace().collect();
        let out = daemon.ctl(&args);
        assert_eq!(out.status.code(), Some(*code), "{line}: {}", out.describe());
        assert!(out.stderr.contains(needle), "{line}: {}", out.describe());
        assert_eq!(out.stderr.lines().count(), 1, "{line}: {}", out.describe());
        assert_eq!(
            ok(&daemon, &["-S", "-n"]),
            before,
            "{line} changed the table"
        );
    }
    // An option a line's command does not take refuses the whole batch too.
    let out = restore_atomic(&daemon, "-A -t 198.18.9.9:80 -s rr\n-C -t 198.18.1.1:80\n");
    assert!(!out.success(), "{}", out.describe());
    assert!(
        out.stderr
            .contains("line 2: Illegal 'service-address' option with the 'flush' command"),
        "{}",
        out.describe()
    );
    assert_eq!(ok(&daemon, &["-S", "-n"]), before);
    // The same rules inside a restore: the whole batch is refused.
    let out = restore_atomic(
        &daemon,
        "-A -t 198.18.9.9:80 -s rr\n-A -t 198.18.0.1:443 -s rr\n",
    );
    assert!(!out.success(), "{}", out.describe());
    assert!(
        out.stderr
            .contains("command 2 of 2: VIP 198.18.0.1 is one of the appliance's own"),
        "{}",
        out.describe()
    );
    assert_eq!(ok(&daemon, &["-S", "-n"]), before);
    daemon.stop_clean();
}

/// The starvation figures against the daemon itself (its 2 s request timeout and its
/// management loop): 1,000 idle connections, re-opened as the daemon cuts them, and 20
/// slowloris clients (a byte every 100 ms, never a newline, reconnecting when cut)
/// while 20 status requests, 100 ms apart, are each answered within 100 ms.
#[test]
fn the_daemon_answers_within_100_ms_beside_1000_idle_and_20_slowloris_clients() {
    use sluice::control::{client, Request};
    use std::io::{ErrorKind, Read, Write};
    use std::os::unix::net::UnixStream;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Instant;

    let daemon = daemon();
    let path = daemon.config.socket.clone();
    let stop = Arc::new(AtomicBool::new(false));
    let holder = {
        let (path, stop) = (path.clone(), Arc::clone(&stop));
        std::thread::spawn(move || {
            let connect = || {
                let stream = UnixStream::connect(&path).expect("holding a connection");
                stream.set_nonblocking(true).unwrap();
                stream
            };
            let mut held: Vec<UnixStream> = (0..1000).map(|_| connect()).collect();
            let mut reopened = 0usize;
            let mut byte = [0u8; 64];
            while !stop.load(Ordering::Relaxed) {
                for stream in held.iter_mut() {
                    match (&*stream).read(&mut byte) {
                        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                        _ => {
                            *stream = connect();
                            reopened += 1;
                        }
                    }
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            reopened
        })
    };
    let slowloris: Vec<_> = (0..20)
        .map(|_| {
            let (path, stop) = (path.clone(), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut cuts = 0usize;
                let mut stream = UnixStream::connect(&path).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    if stream.write_all(b" ").is_err() {
                        cuts += 1;
                        stream = UnixStream::connect(&path).unwrap();
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
                cuts
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let mut latencies = Vec::new();
    for _ in 0..20 {
        let started = Instant::now();
        client::request(&path, &Request::Status, Duration::from_secs(5)).expect("status");
        latencies.push(started.elapsed());
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, Ordering::Relaxed);
    let reopened = holder.join().unwrap();
    let cuts: usize = slowloris.into_iter().map(|t| t.join().unwrap()).sum();
    latencies.sort();
    let max = *latencies.last().unwrap();
    eprintln!(
        "daemon status beside 1,000 held and 20 slowloris connections: p50 {:?}, max {:?} over {} requests; {reopened} held connections re-opened and {cuts} slowloris cut off by the 2 s request timeout meanwhile",
        latencies[latencies.len() / 2],
        max,
        latencies.len()
    );
    // The daemon's per-connection deadline did cut the slow clients.
    assert!(cuts >= 20, "only {cuts} slowloris cut off");
    assert!(
        max < Duration::from_millis(100),
        "worst answer took {max:?}"
    );
    daemon.stop_clean();
}

/// `-t`/`-u` narrow a JSON listing as they narrow the text: one service, or none with
/// "No such service" and exit 1 (a script asking for one service must not read
/// another's counters).
#[test]
fn a_json_listing_is_narrowed_to_its_service_as_the_text_is() {
    let daemon = daemon();
    for args in [
        &["-L", "-n", "-u", "198.18.1.2:53"][..],
        &["-L", "-n", "--stats", "-u", "198.18.1.2:53"],
        &["-L", "-n", "--rate", "-u", "198.18.1.2:53"],
        &["-L", "-n", "--persistent-conn", "-u", "198.18.1.2:53"],
    ] {
        let json = ok_json(&daemon, args);
        let services = json["services"].as_array().expect("services");
        assert_eq!(services.len(), 1, "{args:?}: {json:#}");
        assert_eq!(
            (
                &services[0]["proto"],
                &services[0]["vip"],
                &services[0]["port"]
            ),
            (&"udp".into(), &"198.18.1.2".into(), &53.into()),
            "{args:?}: {json:#}"
        );
    }
    let out = daemon.ctl(&["--json", "-L", "-n", "-t", "198.18.1.99:80"]);
    assert_eq!(out.status.code(), Some(1), "{}", out.describe());
    assert!(out.stdout.is_empty(), "{}", out.describe());
    assert!(out.stderr.contains("No such service"), "{}", out.describe());
    daemon.stop_clean();
}

#[test]
fn timeouts_are_set_and_shown_as_ipvsadm_does() {
    let daemon = daemon();
    assert_eq!(
        ok(&daemon, &["-L", "--timeout"]),
        "Timeout (tcp tcpfin udp): 900 120 300\n"
    );
    ok(&daemon, &["--set", "60", "0", "30"]);
    assert_eq!(
        ok(&daemon, &["-L", "--timeout"]),
        "Timeout (tcp tcpfin udp): 60 120 30\n"
    );
    let json: serde_json::Value =
        serde_json::from_str(&ok(&daemon, &["-L", "--timeout", "--json"])).unwrap();
    assert_eq!(
        json,
        serde_json::json!({"tcp": 60, "tcpfin": 120, "udp": 30})
    );
    for bad in [
        vec!["--set", "60", "x", "30"],
        vec!["--set", "60"],
        vec!["--set", "99999999", "0", "0"],
        vec!["--set", "1", "1", "1", "-t", "198.18.1.1:80"],
    ] {
        let out = daemon.ctl(&bad);
        assert!(!out.success(), "{bad:?} accepted");
        assert_eq!(out.stderr.lines().count(), 1, "{}", out.describe());
    }
    assert_eq!(
        ok(&daemon, &["-L", "--timeout"]),
        "Timeout (tcp tcpfin udp): 60 120 30\n",
        "a refused --set changed the timeouts"
    );
    ok(&daemon, &["-Z"]);
    // The change is in the events log, stamped, in seed 004's style; the refused ones
    // are not.
    let events = ok(&daemon, &["events"]);
    let set: Vec<&str> = events
        .lines()
        .filter(|l| l.contains("op=set-timeouts"))
        .collect();
    assert_eq!(set.len(), 1, "{events}");
    assert!(
        set[0].ends_with("lb=config op=set-timeouts tcp=60 tcpfin=0 udp=30"),
        "{events}"
    );
    assert!(set[0].starts_with("20") && set[0].contains('T'), "{events}");
    daemon.stop_clean();
}

/// Seed 000's incident in miniature: every client pinned to one of four real servers
/// (persistence with netmask 0.0.0.0) next to a balanced rr service. `sluicectl skew`
/// flags the first and not the second; `-L --rate` shows the traffic.
#[test]
fn skew_flags_a_pinned_service_and_rates_show_traffic() {
    require_root();
    let mut cfg = DaemonConfig::new(vec![PortSpec::loopback(
        "lan0",
        "02:53:4c:00:00:01",
        &["198.18.0.1/24"],
    )]);
    cfg.loopback = vec![
        "peers = 4".into(),
        "ping_interval_ms = 50".into(),
        "garbage_every = 0".into(),
    ];
    let four: Vec<(&str, u16, u32, &str)> =
        ["198.18.0.2", "198.18.0.3", "198.18.0.4", "198.18.0.5"]
            .into_iter()
            .map(|ip| (ip, 8080, 1, "nat"))
            .collect();
    let four_other: Vec<(&str, u16, u32, &str)> =
        four.iter().map(|&(ip, _, w, m)| (ip, 8081, w, m)).collect();
    cfg.extra_toml = vec![
        service_section(
            "tcp",
            "198.18.1.1",
            80,
            "rr",
            &[
                "persistence_timeout = 600".into(),
                "persistence_netmask = \"0.0.0.0\"".into(),
            ],
            &four,
        ),
        service_section("tcp", "198.18.1.2", 80, "rr", &[], &four_other),
    ];
    let daemon = Daemon::start(cfg);
    std::thread::sleep(Duration::from_secs(3));
    let skew = ok(&daemon, &["skew"]);
    let pinned = skew
        .split("TCP 198.18.1.2:80")
        .next()
        .expect("the pinned service first");
    assert!(
        pinned.contains("WARN connection skew 400% > 300%"),
        "pinned service not flagged:\n{skew}"
    );
    let balanced = skew
        .split("TCP 198.18.1.2:80")
        .nth(1)
        .expect("the rr service");
    assert!(
        !balanced.contains("WARN"),
        "balanced service flagged:\n{skew}"
    );
    // One service only, with a threshold above its skew: no warning.
    let one = ok(
        &daemon,
        &["skew", "-t", "198.18.1.1:80", "--threshold", "500"],
    );
    assert!(
        one.starts_with("TCP 198.18.1.1:80") && !one.contains("198.18.1.2"),
        "{one}"
    );
    assert!(!one.contains("WARN"), "{one}");
    for bad in [
        vec!["skew", "-t", "nowhere"],
        vec!["skew", "--window", "0"],
        vec!["skew", "--bogus", "1"],
    ] {
        let out = daemon.ctl(&bad);
        assert!(
            !out.success() && out.stderr.starts_with("sluicectl: skew:"),
            "{bad:?}: {}",
            out.describe()
        );
    }
    // -L --rate: the rr service takes about 4 clients x 20 connections a second.
    let rates = ok(&daemon, &["-L", "-n", "--rate"]);
    let line = rates
        .lines()
        .find(|l| l.starts_with("TCP  198.18.1.2:80"))
        .unwrap_or_else(|| panic!("{rates}"));
    let cps: u64 = line.split_whitespace().nth(2).unwrap().parse().unwrap();
    assert!((20..=200).contains(&cps), "CPS {cps}: {rates}");
    // -Z zeroes what ipvsadm's zeroes, the services' counters, and not the ports':
    // monitoring reads those as counters that only grow. `sluicectl zero` resets
    // them too.
    let conns = |daemon: &Daemon| -> u64 {
        let stats = ok(daemon, &["-L", "-n", "--stats", "--exact"]);
        let line = stats
            .lines()
            .find(|l| l.starts_with("TCP  198.18.1.2:80"))
            .unwrap_or_else(|| panic!("{stats}"));
        line.split_whitespace().nth(2).unwrap().parse().unwrap()
    };
    let rx = |daemon: &Daemon| port_counter(&daemon.status(), "lan0", "rx_packets");
    let (conns_before, rx_before) = (conns(&daemon), rx(&daemon));
    assert!(conns_before >= 40, "{conns_before} connections in 3 s");
    ok(&daemon, &["-Z"]);
    let conns_after = conns(&daemon);
    assert!(
        conns_after < conns_before / 2,
        "-Z left {conns_after} of {conns_before} connections"
    );
    assert!(rx(&daemon) >= rx_before, "-Z reset the port's counters");
    ok(&daemon, &["zero"]);
    assert!(rx(&daemon) < rx_before, "zero left the port's counters");
    daemon.stop_clean();
}

/// `sluicectl reload`: a bad file changes nothing and names file, line and field; a
/// good one is applied as its difference (weights, a removed and an added real server,
/// a new service) in one change; a second reload of the same file changes nothing.
#[test]
fn reload_applies_the_config_files_difference() {
    let daemon = daemon();
    let before = ok(&daemon, &["-S", "-n"]);
    let path = daemon.config.path("sluice.toml");
    let original = std::fs::read_to_string(&path).unwrap();

    let bad = original.replace("scheduler = \"wrr\"", "scheduler = \"fastest\"");
    assert_ne!(bad, original, "the fixture changed");
    std::fs::write(&path, &bad).unwrap();
    let out = daemon.ctl(&["reload"]);
    assert!(!out.success());
    assert!(
        out.stderr.contains("sluice.toml:") && out.stderr.contains("scheduler"),
        "{}",
        out.describe()
    );
    assert_eq!(ok(&daemon, &["-S", "-n"]), before);
    // A file the services refuse (a TOA change needs a restart) changes nothing, the
    // health checks it also turns on included: within a health tick of applying them
    // the monitor would list a target per real server.
    let targets = |daemon: &Daemon| ok_json(daemon, &["health"])["targets"].clone();
    assert_eq!(targets(&daemon), serde_json::json!([]), "checks are off");
    let refused = original.replacen("scheduler = \"rr\"", "scheduler = \"rr\"\ntoa = true", 1)
        + "\n[health]\ncheck = \"tcp\"\ninterval_ms = 3000\n";
    std::fs::write(&path, &refused).unwrap();
    let out = daemon.ctl(&["reload"]);
    assert!(
        !out.success() && out.stderr.contains("toa changes need a restart"),
        "{}",
        out.describe()
    );
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(targets(&daemon), serde_json::json!([]));
    assert_eq!(ok(&daemon, &["-S", "-n"]), before);

    // 198.18.0.3 leaves, 198.18.0.2 weighs 5, 198.18.0.6 joins; a new service.
    let mut cfg = daemon.config.toml();
    cfg = cfg.replace(
        &service_section(
            "tcp",
            "198.18.1.1",
            80,
            "rr",
            &[
                "persistence_timeout = 600".into(),
                "persistence_netmask = \"255.255.255.0\"".into(),
            ],
            &[("198.18.0.2", 8080, 1, "nat"), ("198.18.0.3", 80, 3, "dr")],
        ),
        &service_section(
            "tcp",
            "198.18.1.1",
            80,
            "rr",
            &[
                "persistence_timeout = 600".into(),
                "persistence_netmask = \"255.255.255.0\"".into(),
            ],
            &[
                ("198.18.0.2", 8080, 5, "nat"),
                ("198.18.0.6", 8080, 1, "nat"),
            ],
        ),
    );
    cfg += &service_section(
        "tcp",
        "198.18.1.3",
        443,
        "sh",
        &[],
        &[("198.18.0.7", 443, 1, "dr")],
    );
    std::fs::write(&path, &cfg).unwrap();
    assert!(ok(&daemon, &["reload"]).starts_with("reloaded: 5 change(s)"));
    let saved = ok(&daemon, &["-S", "-n"]);
    assert!(
        saved.contains("-a -t 198.18.1.1:80 -r 198.18.0.2:8080 -m -w 5\n"),
        "{saved}"
    );
    assert!(
        saved.contains("-a -t 198.18.1.1:80 -r 198.18.0.6:8080 -m -w 1\n"),
        "{saved}"
    );
    assert!(!saved.contains("198.18.0.3"), "{saved}");
    assert!(saved.contains("-A -t 198.18.1.3:443 -s sh\n"), "{saved}");
    assert!(
        saved.contains("-P -u 198.18.1.2:53 -z 198.18.0.51\n"),
        "untouched service lost: {saved}"
    );
    assert!(ok(&daemon, &["reload"]).starts_with("reloaded: 0 change(s)"));
    assert!(ok(&daemon, &["events"]).contains("op=reload"));
    // Health checks turned on, then off: each reload changes one thing, and says so.
    let checked = format!("{cfg}\n[health]\ncheck = \"tcp\"\ninterval_ms = 3000\n");
    for text in [&checked, &cfg] {
        std::fs::write(&path, text).unwrap();
        assert_eq!(ok(&daemon, &["reload"]), "reloaded: 1 change(s) applied\n");
    }
    // A new service with a health table of its own: its two commands (the service,
    // its real server), the table no third change.
    let with_new = cfg.clone()
        + &service_section(
            "tcp",
            "198.18.1.4",
            80,
            "rr",
            &["[services.health]".into(), "check = \"tcp\"".into()],
            &[("198.18.0.8", 80, 1, "dr")],
        );
    std::fs::write(&path, &with_new).unwrap();
    assert_eq!(ok(&daemon, &["reload"]), "reloaded: 2 change(s) applied\n");
    // Gone again: one command (the service, its server with it).
    std::fs::write(&path, &cfg).unwrap();
    assert_eq!(ok(&daemon, &["reload"]), "reloaded: 1 change(s) applied\n");
    // What only a restart applies is not applied, and the answer says so.
    std::fs::write(&path, format!("{cfg}\n[sessions]\ncapacity = 4096\n")).unwrap();
    assert_eq!(
        ok(&daemon, &["reload"]),
        "reloaded: 0 change(s) applied\nnot applied, needs a restart: sessions\n"
    );
    daemon.stop_clean();
}

/// `sluicectl --json ARGS`'s result.
fn ok_json(daemon: &Daemon, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    serde_json::from_str(&ok(daemon, &all)).expect("sluicectl --json prints JSON")
}

/// Polls `--acl-list -t service --json` until `done` holds for it; panics after 15 s.
fn wait_for_admission(
    daemon: &Daemon,
    service: &str,
    what: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let listed = ok_json(daemon, &["--acl-list", "-t", service]);
        if done(&listed) {
            return listed;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not within 15 s: {listed}\n{}",
            daemon.dump()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A service's access list and rate limit, set while the emulated client connects:
/// `-S` writes them after its ipvsadm lines, `-R --replace` of those lines gives them
/// back (and of plain ipvsadm lines takes them away), `-L -n` keeps ipvsadm's layout,
/// the JSON listing and `--acl-list` show them with the counts, and `-Z` zeroes the
/// counts.
#[test]
fn access_lists_and_rate_limits_round_trip_show_and_zero() {
    let daemon = daemon();
    let plain = ok(&daemon, &["-S", "-n"]);
    let layout = |text: String| -> Vec<String> {
        text.lines()
            .map(|l| l.split_whitespace().take(4).collect::<Vec<_>>().join(" "))
            .collect()
    };
    let listed_before = layout(ok(&daemon, &["-L", "-n"]));
    let http = "198.18.1.1:80";

    // The client (198.18.0.5) is denied, then allowed by a longer prefix, which
    // freezes the deny rule's hits and the denied count; then rate-limited per /24.
    ok(
        &daemon,
        &["--acl-add", "-t", http, "--deny", "198.18.0.0/24"],
    );
    wait_for_admission(&daemon, http, "the client denied", |l| {
        l["totals"]["acl_denied"].as_u64() >= Some(5)
    });
    ok(
        &daemon,
        &["--acl-add", "-t", http, "--allow", "198.18.0.0/25"],
    );
    ok(
        &daemon,
        &["--rate-limit", "1", "-t", http, "--per-prefix", "24"],
    );
    let limited = wait_for_admission(&daemon, http, "the client rate-limited", |l| {
        l["totals"]["rate_limited"].as_u64() >= Some(20)
    });
    let denied = limited["totals"]["acl_denied"].as_u64().unwrap();
    assert_eq!(limited["rules"][0]["prefix"], "198.18.0.0/24", "{limited}");
    // The rule's hits: carried into the rebuilt list, less any the old list took
    // while a worker still read it.
    let hits = limited["rules"][0]["hits"].as_u64().unwrap();
    assert!(hits > 0 && hits <= denied, "{limited}");

    // -S: the ipvsadm lines as before, then the list and the limit.
    let saved = ok(&daemon, &["-S", "-n"]);
    assert_eq!(
        saved,
        format!(
            "{}--acl-add -t 198.18.1.1:80 --allow 198.18.0.0/25\n\
             --acl-add -t 198.18.1.1:80 --deny 198.18.0.0/24\n\
             --rate-limit 1 -t 198.18.1.1:80 --per-prefix 24\n{}",
            plain
                .split_inclusive('\n')
                .take_while(|l| !l.starts_with("-A -u"))
                .collect::<String>(),
            plain
                .split_inclusive('\n')
                .skip_while(|l| !l.starts_with("-A -u"))
                .collect::<String>()
        )
    );
    // -L -n: ipvsadm's layout, nothing added.
    assert_eq!(layout(ok(&daemon, &["-L", "-n"])), listed_before);
    // The JSON listing: the list in brief (no rules), the limit, the counts; nothing
    // for the service without either.
    let listing = ok_json(&daemon, &["-L", "-n"]);
    let admission = &listing["services"][0]["admission"];
    assert_eq!(
        (
            &admission["allow_rules"],
            &admission["deny_rules"],
            &admission["unmatched"],
            &admission["rate_limit"]
        ),
        (
            &serde_json::json!(1),
            &serde_json::json!(1),
            &serde_json::json!("deny"),
            &serde_json::json!({"rate": 1, "burst": 1, "prefix_len": 24})
        ),
        "{listing}"
    );
    assert!(admission.get("deny").is_none(), "{listing}");
    assert_eq!(admission["totals"]["acl_denied"].as_u64(), Some(denied));
    assert!(
        listing["services"][1].get("admission").is_none(),
        "{listing}"
    );
    // --acl-list without a service: every service's in brief.
    let brief = ok(&daemon, &["--acl-list"]);
    let lines: Vec<&str> = brief.lines().collect();
    assert_eq!(lines.len(), 3, "{brief}");
    assert_eq!(
        lines[0],
        "TCP 198.18.1.1:80  rules 2  unmatched sources: deny"
    );
    assert!(
        lines[1].starts_with("rate limit: 1/s burst 1 per /24 source"),
        "{brief}"
    );
    assert!(
        lines[2].starts_with(&format!("denied by the list {denied}  over the rate ")),
        "{brief}"
    );

    // -Z: the frozen counts read 0; the rate-limited count starts again (the client
    // keeps coming, a few a second).
    let before_zero = ok_json(&daemon, &["--acl-list", "-t", http]);
    let limited_before = before_zero["totals"]["rate_limited"].as_u64().unwrap();
    ok(&daemon, &["-Z"]);
    let zeroed = ok_json(&daemon, &["--acl-list", "-t", http]);
    assert_eq!(zeroed["totals"]["acl_denied"], 0, "{zeroed}");
    assert_eq!(zeroed["rules"][0]["hits"], 0, "{zeroed}");
    let limited_after = zeroed["totals"]["rate_limited"].as_u64().unwrap();
    assert!(
        limited_after < limited_before,
        "rate_limited {limited_before} before -Z, {limited_after} after"
    );

    // -R --replace of plain ipvsadm lines: they are the whole table, so no list and no
    // limit; of the saved lines: both back, byte for byte.
    let out = restore_timed(&daemon, &plain, true, Duration::from_secs(30)).0;
    assert!(out.success(), "{}", out.describe());
    assert_eq!(ok(&daemon, &["-S", "-n"]), plain);
    let out = restore_timed(&daemon, &saved, true, Duration::from_secs(30)).0;
    assert!(out.success(), "{}", out.describe());
    assert_eq!(ok(&daemon, &["-S", "-n"]), saved);
    // ipvsadm's habit, -C then -R, too.
    ok(&daemon, &["-C"]);
    let out = daemon.restore(&saved);
    assert!(out.success(), "{}", out.describe());
    assert_eq!(ok(&daemon, &["-S", "-n"]), saved);
    daemon.stop_clean();
}

/// `allow` every tenth of 100,000 /24 prefixes, `deny` the others, on the UDP service,
/// written as `-S` writes them (100 prefixes a line).
fn big_access_list() -> String {
    let prefix = |i: u32| std::net::Ipv4Addr::from((10 << 24) + (i << 8));
    let mut text = String::new();
    for (option, keep) in [("--allow", 0u32), ("--deny", 1)] {
        let chosen: Vec<u32> = (0..100_000u32)
            .filter(|i| (i % 10 != 0) as u32 == keep)
            .collect();
        for chunk in chosen.chunks(100) {
            let list: Vec<String> = chunk.iter().map(|&i| format!("{}/24", prefix(i))).collect();
            text.push_str(&format!(
                "--acl-add -u 198.18.1.2:53 {option} {}\n",
                list.join(",")
            ));
        }
    }
    text
}

/// A 100,000-prefix access list through `-R`, `-S` and `-R --replace`: restored, saved
/// byte for byte, replaced with itself, and listed. Timings printed (`--nocapture`).
#[test]
fn save_and_restore_a_100k_prefix_access_list() {
    let daemon = daemon();
    let plain = ok(&daemon, &["-S", "-n"]);
    assert!(plain.contains("-A -u 198.18.1.2:53"), "{plain}");
    // The UDP service is saved last: its lines end the file.
    let table = format!("{plain}{}", big_access_list());
    assert_eq!(table.lines().count(), plain.lines().count() + 1_000);

    let (out, restored) = restore_timed(&daemon, &table, true, Duration::from_secs(120));
    assert!(out.success(), "{}\n{}", out.describe(), daemon.dump());
    let (saved, save_took) = save_timed(&daemon);
    assert!(saved == table, "-S differs from the access list -R loaded");
    let brief = ok_json(&daemon, &["--acl-list", "-u", "198.18.1.2:53"]);
    assert_eq!(brief["rules_total"], 100_000, "{}", brief["rules_total"]);
    assert_eq!(brief["unmatched"], "deny");

    let replaced = replace_gives_back(&daemon, &saved);
    // Without the list: replaced by nothing, in one change.
    let (out, emptied) = restore_timed(&daemon, &plain, true, Duration::from_secs(120));
    assert!(out.success(), "{}\n{}", out.describe(), daemon.dump());
    assert_eq!(ok(&daemon, &["-S", "-n"]), plain);
    // -R without --replace adds the lines to the running table.
    let (out, added) = restore_timed(&daemon, &big_access_list(), false, Duration::from_secs(120));
    assert!(out.success(), "{}\n{}", out.describe(), daemon.dump());
    assert!(save_timed(&daemon).0 == table, "-R of the list alone");
    eprintln!(
        "100k-prefix list (1,000 lines, {} bytes): -R --replace {restored:?}, -S {save_took:?}, -R --replace of the same {replaced:?}, -R --replace without it {emptied:?}, -R of the list alone {added:?}",
        table.len() - plain.len()
    );
    daemon.stop_clean();
}
