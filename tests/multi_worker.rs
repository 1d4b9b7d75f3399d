//! The multi-worker data plane in loopback emulation: 2 and 4 workers (sharing CPU 1:
//! oversubscribed, a functional test), the emulator playing a NIC with RSS (each frame
//! goes on the queue the appliance port's Toeplitz key and RETA select) and 10,000+
//! TCP connections per run through FullNAT or NAT.
//!
//! What each run proves, from two independent counts: the emulator knows, for every
//! real-server reply it sends through the appliance, whether the NIC hash puts it on
//! the queue of the connection's owner (the queue its client packets use); the workers
//! count what they redirect to each other.
//! - FullNAT: the local ports the workers chose make every reply land on its owner:
//!   zero replies off the owner's queue, zero redirects, nothing dropped for want of a
//!   session.
//! - NAT (one arm): replies land anywhere; every one that lands elsewhere is
//!   redirected to its owner: redirects out = redirects in = the emulator's count.
//!
//! Run: `cargo test --release --test integration multi_worker::` (as root).

use crate::common::*;
use std::sync::Mutex;
use std::time::Duration;

/// The runs take turns: their workers busy-poll CPU 1.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Connections each run must complete.
const FLOWS: u64 = 10_000;
/// 20 clients, one connection each every 10 ms: 2,000 new connections per second.
const DURATION_S: u64 = 9;

struct Worker {
    sessions_created: u64,
    redirected_out: u64,
    redirected_in: u64,
}

struct Outcome {
    summary: String,
    workers: Vec<Worker>,
    drops: String,
    context: String,
}

fn run(workers: u32, mode: &str) -> Outcome {
    require_root();
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut cfg = DaemonConfig::new(vec![PortSpec::loopback(
        "lan0",
        "02:53:4c:00:00:01",
        &["198.18.0.1/24"],
    )]);
    cfg.workers = (1..=workers).collect();
    cfg.cpus = Some(vec![1; workers as usize]);
    cfg.loopback = vec![
        "peers = 20".into(),
        "ping_interval_ms = 10".into(),
        "garbage_every = 0".into(),
        "stats_interval_ms = 100000".into(),
    ];
    let extra = if mode == "fullnat" {
        vec!["local_addresses = [\"198.18.0.200\", \"198.18.0.201\"]".to_string()]
    } else {
        Vec::new()
    };
    cfg.extra_toml = vec![
        "[sessions]\ncapacity = 65536\ntick_ms = 100".into(),
        service_section(
            "tcp",
            "198.18.1.1",
            80,
            "rr",
            &extra,
            &[
                ("198.18.0.2", 8080, 1, mode),
                ("198.18.0.3", 8080, 1, mode),
                ("198.18.0.4", 8080, 1, mode),
            ],
        ),
    ];
    cfg.args = vec!["--duration".into(), DURATION_S.to_string()];
    let mut daemon = Daemon::start(cfg);
    std::thread::sleep(Duration::from_secs(DURATION_S / 2));
    check_listings(&daemon, workers, mode);
    let status = daemon
        .wait_exit(Duration::from_secs(DURATION_S) + EXIT_TIMEOUT)
        .unwrap_or_else(|| panic!("sluice did not stop by itself\n{}", daemon.dump()));
    let context = daemon.dump();
    assert!(status.success(), "sluice exited with {status}\n{context}");
    let stdout = daemon.stdout_text();
    let summary = stdout
        .lines()
        .skip_while(|l| !l.starts_with("arp "))
        .take_while(|l| !l.trim().is_empty())
        .map(str::trim)
        .collect::<Vec<_>>()
        .join("\n");
    assert!(!summary.is_empty(), "no emulator summary\n{context}");
    // The final statistics, printed after the workers stopped.
    let finals = &stdout[stdout.rfind("arp ").unwrap()..];
    let workers: Vec<Worker> = (0..workers)
        .map(|w| {
            let line = finals
                .lines()
                .find(|l| l.trim_start().starts_with(&format!("worker {w} (lcore")))
                .unwrap_or_else(|| panic!("no final line for worker {w}\n{context}"));
            Worker {
                sessions_created: number_after(line, "(created "),
                redirected_out: number_after(line, "redirected out "),
                redirected_in: number_after(line, " in "),
            }
        })
        .collect();
    let drops = finals
        .lines()
        .find(|l| l.trim_start().starts_with("drops"))
        .unwrap_or("")
        .to_string();
    // For the record (cargo test -- --nocapture).
    eprintln!("{} worker(s), {mode}:\n{summary}\n{drops}", workers.len());
    for (w, worker) in workers.iter().enumerate() {
        eprintln!(
            "  worker {w}: sessions created {} redirected out {} in {}",
            worker.sessions_created, worker.redirected_out, worker.redirected_in
        );
    }
    Outcome {
        summary,
        workers,
        drops,
        context,
    }
}

/// While traffic flows: `-Lnc` lists sessions of every worker, with the local address
/// for FullNAT only, and seed 000's pipeline (`awk 'NR>1{print $NF}'`) yields real
/// servers; `--get-laddr` shows every worker's pool on both local addresses.
fn check_listings(daemon: &Daemon, workers: u32, mode: &str) {
    let out = daemon.ctl(&["-L", "-n", "-c", "--json"]);
    assert!(out.success(), "{}\n{}", out.describe(), daemon.dump());
    let json: serde_json::Value = serde_json::from_str(&out.stdout).expect("JSON");
    let conns = json["connections"].as_array().expect("connections");
    assert!(conns.len() > 100, "only {} sessions listed", conns.len());
    let servers = ["198.18.0.2:8080", "198.18.0.3:8080", "198.18.0.4:8080"];
    for w in 0..workers {
        let mine: Vec<_> = conns.iter().filter(|c| c["worker"] == w).collect();
        assert!(!mine.is_empty(), "no session of worker {w} listed");
    }
    for c in conns {
        assert_eq!(c["virtual"], "198.18.1.1:80", "{c}");
        assert!(servers.contains(&c["destination"].as_str().unwrap()), "{c}");
        match (mode, c["local"].as_str()) {
            ("fullnat", Some(l)) => assert!(l.starts_with("198.18.0.20"), "{c}"),
            ("nat", None) => {}
            _ => panic!("{mode}: wrong local address in {c}"),
        }
    }
    let text = daemon.ctl(&["-Lnc"]);
    assert!(text.success(), "{}", text.describe());
    let lasts: Vec<&str> = text
        .stdout
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().last())
        .collect();
    assert!(lasts.len() > 100, "{}", text.stdout);
    assert!(
        lasts
            .iter()
            .all(|l| *l == "destination" || servers.contains(l)),
        "awk '{{print $NF}}' gives something else than real servers:\n{}",
        text.stdout
    );
    if mode == "fullnat" {
        let laddr = daemon.ctl(&["-G", "-t", "198.18.1.1:80", "--json"]);
        assert!(laddr.success(), "{}", laddr.describe());
        let json: serde_json::Value = serde_json::from_str(&laddr.stdout).expect("JSON");
        let pools = json["pools"].as_array().expect("pools");
        assert_eq!(pools.len() as u32, workers * 2, "{json}");
        let used: u64 = pools.iter().map(|p| p["used"].as_u64().unwrap()).sum();
        assert!(used > 0, "no port in use: {json}");
        for p in pools {
            assert_eq!(p["misses"], 0, "{json}");
        }
    }
}

/// Every connection completed, nothing was wrong, and every worker owned a share.
fn check_common(o: &Outcome) {
    let s = &o.summary;
    let ctx = format!("{s}\n{}\n{}", o.drops, o.context);
    assert_eq!(number_after(s, "bad "), 0, "bad frames\n{ctx}");
    assert_eq!(number_after(s, "failed "), 0, "failed connections\n{ctx}");
    let completed = number_after(s, "completed ");
    assert!(
        completed >= FLOWS,
        "only {completed} connections completed\n{ctx}"
    );
    for (w, worker) in o.workers.iter().enumerate() {
        assert!(
            worker.sessions_created > completed / (o.workers.len() as u64 * 4),
            "worker {w} created only {} sessions: RSS did not spread\n{ctx}",
            worker.sessions_created
        );
    }
    // SYN-ACK, response and FIN-ACK per connection: all but a few (a client ISN two
    // open connections share) are attributed to their connection.
    let via = number_after(s, "replies via the appliance ");
    assert!(
        via * 100 >= completed * 3 * 99,
        "{via} replies attributed for {completed} connections\n{ctx}"
    );
    for reason in ["tcp_no_session=", "redirect_ring_full=", "not_local="] {
        assert!(!o.drops.contains(reason), "drops {reason}\n{ctx}");
    }
}

fn check_fullnat(workers: u32) {
    let o = run(workers, "fullnat");
    check_common(&o);
    let ctx = format!("{}\n{}\n{}", o.summary, o.drops, o.context);
    assert_eq!(
        number_after(&o.summary, "off the owner's queue "),
        0,
        "FullNAT replies reached a worker that does not own their session\n{ctx}"
    );
    let redirected: u64 = o.workers.iter().map(|w| w.redirected_out).sum();
    assert_eq!(redirected, 0, "FullNAT needed redirects\n{ctx}");
    assert!(!o.drops.contains("laddr_exhausted="), "{ctx}");
}

fn check_nat(workers: u32) {
    let o = run(workers, "nat");
    check_common(&o);
    let ctx = format!("{}\n{}\n{}", o.summary, o.drops, o.context);
    let off = number_after(&o.summary, "off the owner's queue ");
    let via = number_after(&o.summary, "replies via the appliance ");
    // With N queues about (N-1)/N of the replies land elsewhere; at least a quarter.
    assert!(off * 4 >= via, "only {off} of {via} off the owner\n{ctx}");
    let out: u64 = o.workers.iter().map(|w| w.redirected_out).sum();
    let inn: u64 = o.workers.iter().map(|w| w.redirected_in).sum();
    assert_eq!(out, off, "redirects out != replies off the owner\n{ctx}");
    assert_eq!(inn, out, "redirects in != out\n{ctx}");
}

#[test]
fn fullnat_replies_reach_their_owner_with_two_workers() {
    check_fullnat(2);
}

#[test]
fn nat_replies_are_redirected_to_their_owner_with_two_workers() {
    check_nat(2);
}

#[test]
fn fullnat_replies_reach_their_owner_with_four_workers() {
    check_fullnat(4);
}

#[test]
fn nat_replies_are_redirected_to_their_owner_with_four_workers() {
    check_nat(4);
}

/// Persistence with two workers: the NIC hashes one client's connections (different
/// source ports) to both workers, and the shared template table still pins each client
/// to one real server; templates are listed as IPVS lists them. Removing a real server
/// moves its clients' templates to the others.
#[test]
fn persistence_pins_each_client_across_workers() {
    require_root();
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut cfg = DaemonConfig::new(vec![PortSpec::loopback(
        "lan0",
        "02:53:4c:00:00:01",
        &["198.18.0.1/24"],
    )]);
    cfg.workers = vec![1, 2];
    cfg.cpus = Some(vec![1, 1]);
    cfg.loopback = vec![
        "peers = 8".into(),
        "ping_interval_ms = 20".into(),
        "garbage_every = 0".into(),
        "stats_interval_ms = 100000".into(),
    ];
    cfg.extra_toml = vec![service_section(
        "tcp",
        "198.18.1.1",
        80,
        "rr",
        &["persistence_timeout = 60".to_string()],
        &[
            ("198.18.0.2", 8080, 1, "nat"),
            ("198.18.0.3", 8080, 1, "nat"),
            ("198.18.0.4", 8080, 1, "nat"),
        ],
    )];
    cfg.args = vec!["--duration".into(), "30".into()];
    let daemon = Daemon::start(cfg);
    std::thread::sleep(Duration::from_secs(3));

    let listing = |daemon: &Daemon| -> Vec<serde_json::Value> {
        let out = daemon.ctl(&["-L", "-n", "-c", "--json"]);
        assert!(out.success(), "{}\n{}", out.describe(), daemon.dump());
        let json: serde_json::Value = serde_json::from_str(&out.stdout).expect("JSON");
        json["connections"].as_array().expect("connections").clone()
    };
    let entries = listing(&daemon);
    let ip = |addr: &serde_json::Value| {
        addr.as_str()
            .unwrap()
            .split(':')
            .next()
            .unwrap()
            .to_string()
    };
    let mut by_client: std::collections::BTreeMap<String, std::collections::BTreeSet<String>> =
        Default::default();
    let mut workers_per_client: std::collections::BTreeMap<
        String,
        std::collections::BTreeSet<u64>,
    > = Default::default();
    let mut templates = Vec::new();
    for e in &entries {
        if e["state"] == "NONE" {
            assert!(
                e["worker"].is_null(),
                "a template belongs to no worker: {e}"
            );
            templates.push(e.clone());
            continue;
        }
        by_client
            .entry(ip(&e["client"]))
            .or_default()
            .insert(e["destination"].as_str().unwrap().to_string());
        workers_per_client
            .entry(ip(&e["client"]))
            .or_default()
            .insert(e["worker"].as_u64().unwrap());
    }
    assert!(
        by_client.len() >= 8,
        "too few clients listed: {by_client:?}"
    );
    for (client, servers) in &by_client {
        assert_eq!(servers.len(), 1, "client {client} reached {servers:?}");
    }
    assert!(
        workers_per_client.values().any(|w| w.len() == 2),
        "no client's connections spread over both workers: the test proves nothing\n{workers_per_client:?}"
    );
    let used: std::collections::BTreeSet<&String> = by_client.values().flatten().collect();
    assert!(
        used.len() >= 2,
        "rr pinned every client to one server: {used:?}"
    );
    assert_eq!(
        templates.len(),
        by_client.len(),
        "one template per client: {templates:?}"
    );
    for t in &templates {
        let client = ip(&t["client"]);
        assert!(t["client"].as_str().unwrap().ends_with(":0"), "{t}");
        assert_eq!(
            Some(t["destination"].as_str().unwrap().to_string()),
            by_client
                .get(&client)
                .and_then(|s| s.iter().next().cloned()),
            "template and sessions of {client} disagree"
        );
    }
    // Each client's handshakes (the emulator's TCP, its SYN-ACKs on whichever worker
    // owns the session) confirmed its template.
    for t in &templates {
        assert_eq!(t["standing"], "confirmed", "{t}");
    }
    // Templates in ipvsadm's layout: protocol, expiry, state NONE.
    let text = daemon.ctl(&["-Lnc"]);
    assert!(
        text.stdout.lines().any(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            words.first() == Some(&"TCP") && words.get(2) == Some(&"NONE")
        }),
        "{}",
        text.stdout
    );

    // Remove a real server that has clients: their templates move elsewhere.
    let removed = used.iter().next().unwrap().to_string();
    let out = daemon.ctl(&["-d", "-t", "198.18.1.1:80", "-r", &removed]);
    assert!(out.success(), "{}", out.describe());
    std::thread::sleep(Duration::from_secs(2));
    let after = listing(&daemon);
    let moved: Vec<_> = after.iter().filter(|e| e["state"] == "NONE").collect();
    assert!(moved.len() >= by_client.len(), "templates lost: {moved:?}");
    for t in moved {
        assert_ne!(t["destination"].as_str().unwrap(), removed, "{t}");
        assert_ne!(t["destination"], "-", "{t}");
    }
    let status = daemon.status();
    assert!(
        status["events"]["persist_followed"].as_u64().unwrap() > 50,
        "{status}"
    );
    daemon.stop_clean();
}
