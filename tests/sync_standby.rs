//! Session sync between two Sluice nodes, end to end over real UDP: an active node (a
//! loopback port whose emulated clients open TCP connections through a NAT service)
//! syncs its sessions to a standby node (the same service, an idle af_packet port),
//! both in a network namespace this test creates, sync on its loopback interface.
//!
//! - Every session the active holds in TIME_WAIT (a state that no longer changes) is
//!   installed on the standby with the same client, VIP and real server, in the same
//!   state, expiring no later than on the active (plus a tick of slack).
//! - A standby started after the active catches up by bulk resync: it asks for the
//!   active's table, and the active dumps its sessions, TIME_WAIT ones included (they
//!   never change again, so no other message would bring them).
//! - Persistence templates reach the standby: with a persistent service, the standby
//!   lists the active's templates (client network, service, real server), expiring no
//!   later than on the active (plus slack); a standby started later gets them in the
//!   active's dump.
//! - Forged or malformed datagrams (wrong version, truncated, unknown peer, bad HMAC,
//!   a session for a VIP the standby does not have) are rejected, each counted under
//!   its reason, and install nothing.
//!
//! Run: `cargo test --release --test sync_standby` (as root).
mod common;

use common::*;
use sluice::flow::{FlowKey4, Protocol};
use sluice::service::ForwardMode;
use sluice::session::Session;
use sluice::sync::auth::SyncKey;
use sluice::sync::events::{EventKind, EventRing, SessionEvent};
use sluice::sync::sender::SyncSender;
use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::Duration;

const KEY: &str = "000102030405060708090a0b0c0d0e0f";
const VIP: &str = "198.18.1.1";

/// A namespace of this test's own, removed on drop.
struct Netns(String);

impl Netns {
    fn new(tag: &str) -> Netns {
        let name = format!("sl-sync-{tag}");
        let t = Duration::from_secs(10);
        run_bounded(
            std::process::Command::new("ip").args(["netns", "add", &name]),
            t,
        )
        .expect_success("ip netns add");
        let ns = Netns(name);
        for args in [
            vec!["ip", "link", "set", "lo", "up"],
            vec![
                "ip", "link", "add", "sy0", "type", "veth", "peer", "name", "sy1",
            ],
            vec!["ip", "link", "set", "sy0", "up"],
            vec!["ip", "link", "set", "sy1", "up"],
        ] {
            netns_exec(&ns.0, &args, t).expect_success("netns set-up");
        }
        ns
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = run_bounded(
            std::process::Command::new("ip").args(["netns", "del", &self.0]),
            Duration::from_secs(10),
        );
    }
}

/// The NAT service both nodes have; `persistence` adds service keys (e.g. a timeout).
fn service(extra: &str, persistence: &str) -> String {
    format!(
        "{extra}\n[[services]]\nproto = \"tcp\"\nvip = \"{VIP}\"\nport = 80\nscheduler = \"rr\"\n{persistence}\n  \
         [[services.real_servers]]\n  ip = \"198.18.0.2\"\n  port = 8080\n  mode = \"nat\"\n\n  \
         [[services.real_servers]]\n  ip = \"198.18.0.3\"\n  port = 8080\n  mode = \"nat\"\n"
    )
}

fn sync_section(listen: u16, peer: u16) -> String {
    format!(
        "[sync]\nlisten = \"127.0.0.1:{listen}\"\npeers = [\"127.0.0.1:{peer}\"]\nkey = \"{KEY}\"\n"
    )
}

/// (client, virtual, destination) -> (state, expires_s) of a node's sessions.
fn sessions(daemon: &Daemon) -> BTreeMap<(String, String, String), (String, u64)> {
    let out = daemon.ctl(&["-L", "-n", "-c", "--json"]);
    assert!(out.success(), "{}", out.describe());
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    v["connections"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["worker"].is_number())
        .map(|c| {
            let s = |k: &str| c[k].as_str().unwrap().to_string();
            (
                (s("client"), s("virtual"), s("destination")),
                (s("state"), c["expires_s"].as_u64().unwrap()),
            )
        })
        .collect()
}

/// The active node: a loopback port whose emulated clients keep opening connections.
fn active_node(ns: &Netns, port: u16, peer: u16, persistence: &str) -> Daemon {
    let mut cfg = DaemonConfig::new(vec![PortSpec::loopback(
        "lan0",
        "02:53:4c:00:00:01",
        &["198.18.0.1/24"],
    )])
    .in_netns(&ns.0);
    cfg.loopback = vec!["peers = 4".into(), "ping_interval_ms = 50".into()];
    cfg.extra_toml
        .push(service(&sync_section(port, peer), persistence));
    Daemon::start(cfg)
}

/// The standby node: the same service on an idle af_packet port.
fn standby_node(ns: &Netns, port: u16, peer: u16, persistence: &str) -> Daemon {
    let mut cfg = DaemonConfig::new(vec![PortSpec::vdev(
        "lan0",
        "net_af_packet0,iface=sy0",
        &["198.18.0.1/24"],
    )])
    .in_netns(&ns.0);
    cfg.extra_toml
        .push(service(&sync_section(port, peer), persistence));
    Daemon::start(cfg)
}

/// (client network, virtual, destination) -> expires_s of a node's persistence
/// templates (the `NONE` rows without a worker).
fn templates(daemon: &Daemon) -> BTreeMap<(String, String, String), u64> {
    let out = daemon.ctl(&["-L", "-n", "-c", "--json"]);
    assert!(out.success(), "{}", out.describe());
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    v["connections"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["worker"].is_null() && c["state"] == "NONE")
        .map(|c| {
            let s = |k: &str| c[k].as_str().unwrap().to_string();
            (
                (s("client"), s("virtual"), s("destination")),
                c["expires_s"].as_u64().unwrap(),
            )
        })
        .collect()
}

/// Where `standby`'s templates differ from `active`'s (taken first): missing, another
/// real server, or expiring more than `slack_s` later than on the active, or more than
/// `stale_s` sooner (a refresh never arrived).
fn template_differences(
    active: &BTreeMap<(String, String, String), u64>,
    standby: &BTreeMap<(String, String, String), u64>,
    slack_s: u64,
    stale_s: u64,
) -> Vec<String> {
    let mut out = Vec::new();
    for (key, &expires) in active {
        match standby.get(key) {
            Some(&e) if e <= expires + slack_s && e + stale_s >= expires => {}
            other => out.push(format!("{key:?}: active {expires}s, standby {other:?}")),
        }
    }
    for key in standby.keys().filter(|k| !active.contains_key(*k)) {
        out.push(format!("{key:?}: only on the standby"));
    }
    out
}

fn sync_report(daemon: &Daemon) -> serde_json::Value {
    let out = daemon.ctl(&["sync", "--json"]);
    assert!(out.success(), "{}", out.describe());
    serde_json::from_str(&out.stdout).unwrap()
}

/// A sealed sync message carrying one connection to `vip`, from node `sender`.
fn message(vip: Ipv4Addr, key: Option<&str>) -> Vec<u8> {
    let client = FlowKey4::new(
        Protocol::Tcp,
        Ipv4Addr::new(198, 18, 0, 77),
        40_000,
        vip,
        80,
    );
    let session = Session::new(
        &client,
        ForwardMode::Nat,
        0,
        0,
        Ipv4Addr::new(198, 18, 0, 2),
        8080,
    );
    let ring = EventRing::with_capacity(4);
    assert!(ring.push(SessionEvent::new(EventKind::Created, &session, 60_000)));
    let mut sender = SyncSender::new(1, 1500, key.map(|k| SyncKey::from_hex(k).unwrap()));
    let mut buf = vec![0u8; 1500];
    let mut out = Vec::new();
    sender.send_events(std::slice::from_ref(&ring), 16, &mut buf, |d| {
        out = d.to_vec()
    });
    assert!(!out.is_empty());
    out
}

/// Sends `datagram` to 127.0.0.1:`port` from `source` inside `ns` (Python's socket).
fn send_from(ns: &str, source: &str, port: u16, datagram: &[u8]) {
    let hex: String = datagram.iter().map(|b| format!("{b:02x}")).collect();
    let script = format!(
        "import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
         s.bind(('{source}', 0))\ns.sendto(bytes.fromhex('{hex}'), ('127.0.0.1', {port}))\n"
    );
    netns_exec(ns, &["python3", "-c", &script], Duration::from_secs(10)).expect_success("send");
}

#[test]
fn standby_installs_the_active_sessions_and_rejects_forged_messages() {
    require_root();
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tag = unique_tag();
    let ns = Netns::new(&tag);
    let (active_port, standby_port) = (40_000 + (std::process::id() % 10_000) as u16, 0);
    let standby_port = standby_port + active_port + 1;

    let standby = standby_node(&ns, standby_port, active_port, "");

    let active = active_node(&ns, active_port, standby_port, "");

    // Let the emulated clients open and close a few hundred connections.
    let enough = wait_for(Duration::from_secs(20), Duration::from_millis(200), || {
        let n = sessions(&active)
            .values()
            .filter(|(state, _)| state == "TIME_WAIT")
            .count();
        (n >= 200).then_some(n)
    });
    assert!(
        enough.is_some(),
        "the active node made no sessions\n{}",
        active.dump()
    );
    let on_active = sessions(&active);
    // TIME_WAIT is final: what the active held then, the standby must hold now (after
    // a moment for the last messages to arrive).
    std::thread::sleep(Duration::from_millis(500));
    let on_standby = sessions(&standby);
    let mut checked = 0;
    let mut missing = Vec::new();
    for (key, (state, expires)) in on_active.iter().filter(|(_, (s, _))| s == "TIME_WAIT") {
        checked += 1;
        match on_standby.get(key) {
            Some((s, e)) if s == state && *e <= expires + 1 => {}
            other => missing.push(format!(
                "{key:?}: active {state} {expires}s, standby {other:?}"
            )),
        }
    }
    let report = sync_report(&active);
    eprintln!(
        "active: {} sessions ({checked} in TIME_WAIT), standby: {}; active sent {} events in {} messages ({} bytes), dropped {}",
        on_active.len(),
        on_standby.len(),
        report["stats"]["events_sent"],
        report["stats"]["messages_sent"],
        report["stats"]["bytes_sent"],
        report["events_dropped"]
    );
    assert!(
        missing.is_empty(),
        "{} of {checked} TIME_WAIT sessions not on the standby as on the active:\n{}",
        missing.len(),
        missing[..missing.len().min(10)].join("\n")
    );
    assert_eq!(report["events_dropped"], 0);

    // Forged and malformed messages: stop the active first, so only ours arrive.
    active.stop_clean();
    std::thread::sleep(Duration::from_millis(200));
    let before = sync_report(&standby);
    let installed_before = event_count(&standby.status(), "sync_installed");
    let vip: Ipv4Addr = VIP.parse().unwrap();
    let good = message(vip, Some(KEY));
    let mut wrong_version = good.clone();
    wrong_version[4] = 2;
    let truncated = good[..good.len() - 10].to_vec();
    let mut bad_hmac = good.clone();
    let last = bad_hmac.len() - 1;
    bad_hmac[last] ^= 1;
    let unknown_vip = message(Ipv4Addr::new(198, 18, 9, 9), Some(KEY));
    let unsealed = message(vip, None);
    send_from(&ns.0, "127.0.0.1", standby_port, &wrong_version);
    send_from(&ns.0, "127.0.0.1", standby_port, &truncated);
    send_from(&ns.0, "127.0.0.2", standby_port, &good);
    send_from(&ns.0, "127.0.0.1", standby_port, &bad_hmac);
    send_from(&ns.0, "127.0.0.1", standby_port, &unknown_vip);
    send_from(&ns.0, "127.0.0.1", standby_port, &unsealed);
    let want = [
        ("wrong_version", 1),
        ("truncated", 1),
        ("unknown_peer", 1),
        ("bad_hmac", 2),
        ("unknown_vip", 1),
    ];
    let counted = wait_for(Duration::from_secs(5), Duration::from_millis(50), || {
        let r = sync_report(&standby);
        want.iter()
            .all(|(reason, n)| {
                r["rejected"][reason].as_u64().unwrap()
                    == before["rejected"][reason].as_u64().unwrap() + n
            })
            .then_some(r)
    });
    let after = counted.unwrap_or_else(|| {
        panic!(
            "rejections not counted as expected: before {before:#}\nafter {:#}",
            sync_report(&standby)
        )
    });
    assert_eq!(
        after["accepted_messages"], before["accepted_messages"],
        "{after:#}"
    );
    assert_eq!(
        event_count(&standby.status(), "sync_installed"),
        installed_before,
        "nothing installed from forged messages"
    );
    eprintln!("standby rejected: {}", after["rejected"]);

    // The same message, untampered, from the peer: accepted and installed.
    send_from(&ns.0, "127.0.0.1", standby_port, &good);
    let installed = wait_for(Duration::from_secs(5), Duration::from_millis(50), || {
        (event_count(&standby.status(), "sync_installed") == installed_before + 1).then_some(())
    });
    assert!(
        installed.is_some(),
        "the genuine message was not installed: {:#}",
        sync_report(&standby)
    );
    let s = sessions(&standby);
    assert!(
        s.contains_key(&(
            "198.18.0.77:40000".to_string(),
            format!("{VIP}:80"),
            "198.18.0.2:8080".to_string()
        )),
        "{s:?}"
    );
    standby.stop_clean();
}

/// The SERIAL guard: each test's two daemons busy-poll CPU 1.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn a_standby_started_late_catches_up_by_bulk_resync() {
    require_root();
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tag = unique_tag();
    let ns = Netns::new(&tag);
    let (active_port, standby_port) = (8848, 8849);
    let active = active_node(&ns, active_port, standby_port, "");
    let enough = wait_for(Duration::from_secs(20), Duration::from_millis(200), || {
        let n = sessions(&active)
            .values()
            .filter(|(state, _)| state == "TIME_WAIT")
            .count();
        (n >= 200).then_some(n)
    });
    assert!(
        enough.is_some(),
        "the active node made no sessions\n{}",
        active.dump()
    );
    let before_standby = sessions(&active);

    let standby = standby_node(&ns, standby_port, active_port, "");
    // Every session the active held in TIME_WAIT before the standby existed.
    let old: Vec<_> = before_standby
        .iter()
        .filter(|(_, (s, _))| s == "TIME_WAIT")
        .map(|(k, _)| k.clone())
        .collect();
    let caught_up = wait_for(Duration::from_secs(10), Duration::from_millis(100), || {
        let on_standby = sessions(&standby);
        old.iter()
            .all(|k| on_standby.contains_key(k))
            .then_some(on_standby.len())
    });
    let report = sync_report(&active);
    let standby_report = sync_report(&standby);
    eprintln!(
        "bulk resync: {} TIME_WAIT sessions on the active before the standby started; active: resync requests received {}, dumps sent {} ({} records); standby: dump chunks received {}, holds {:?}",
        old.len(),
        report["stats"]["resync_requests_received"],
        report["stats"]["dumps_sent"],
        report["stats"]["dump_records_sent"],
        standby_report["stats"]["dump_chunks_received"],
        caught_up
    );
    assert!(
        caught_up.is_some(),
        "the standby did not catch up: {} of {} old sessions missing\nactive {report:#}\nstandby {standby_report:#}",
        old.iter().filter(|k| !sessions(&standby).contains_key(*k)).count(),
        old.len()
    );
    assert!(report["stats"]["dumps_sent"].as_u64().unwrap() >= 1);
    standby.stop_clean();
    active.stop_clean();
}

#[test]
fn persistence_templates_reach_the_standby_live_and_by_dump() {
    require_root();
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let tag = unique_tag();
    let ns = Netns::new(&format!("t{tag}"));
    let (active_port, standby_port) = (8858, 8859);
    // Per-client persistence (/32): one template per emulated client.
    let persistent = "persistence_timeout = 120";
    let standby = standby_node(&ns, standby_port, active_port, persistent);
    let active = active_node(&ns, active_port, standby_port, persistent);

    let on_active = wait_for(Duration::from_secs(20), Duration::from_millis(200), || {
        let t = templates(&active);
        (t.len() >= 4).then_some(t)
    });
    let Some(on_active) = on_active else {
        panic!("the active node made no templates\n{}", active.dump());
    };
    // A template travels within a scan pass (about 1 s) of its creation.
    let mut last = Vec::new();
    let synced = wait_for(Duration::from_secs(5), Duration::from_millis(200), || {
        let a = templates(&active);
        let s = templates(&standby);
        last = template_differences(&a, &s, 1, 12);
        last.is_empty().then_some((a, s))
    });
    let active_report = sync_report(&active);
    let standby_report = sync_report(&standby);
    eprintln!(
        "templates: active {} (first seen {on_active:?}), standby {:?}; active sent {}, standby received {} installed {} skipped {}",
        templates(&active).len(),
        synced.as_ref().map(|(_, s)| s.len()),
        active_report["stats"]["templates_sent"],
        standby_report["stats"]["templates_received"],
        standby_report["stats"]["templates_installed"],
        standby_report["stats"]["templates_skipped"],
    );
    assert!(
        synced.is_some(),
        "the standby's templates differ from the active's:\n{}\nactive {active_report:#}\nstandby {standby_report:#}",
        last.join("\n")
    );
    let (a, s) = synced.unwrap();
    assert!(a.len() >= 4 && s.len() == a.len());
    assert!(active_report["stats"]["templates_sent"].as_u64().unwrap() >= 4);
    assert!(
        standby_report["stats"]["templates_installed"]
            .as_u64()
            .unwrap()
            >= 4
    );
    assert_eq!(standby_report["stats"]["templates_skipped"], 0);
    // The standby does not echo them back (its workers leave them alone: no traffic,
    // and its copies of the synced sessions, which extend a template when they end,
    // do not end within the test).
    assert_eq!(active_report["stats"]["templates_received"], 0);

    // A standby started afresh gets them in the active's dump.
    standby.stop_clean();
    let dumped_before = sync_report(&active)["stats"]["dump_templates_sent"]
        .as_u64()
        .unwrap();
    let standby = standby_node(&ns, standby_port, active_port, persistent);
    let dumped = wait_for(Duration::from_secs(10), Duration::from_millis(100), || {
        let n = sync_report(&active)["stats"]["dump_templates_sent"]
            .as_u64()
            .unwrap();
        (n >= dumped_before + 4).then_some(n - dumped_before)
    });
    assert!(
        dumped.is_some(),
        "no templates in the dump: {:#}",
        sync_report(&active)
    );
    let synced = wait_for(Duration::from_secs(5), Duration::from_millis(200), || {
        let a = templates(&active);
        last = template_differences(&a, &templates(&standby), 1, 12);
        last.is_empty().then_some(a.len())
    });
    eprintln!(
        "restarted standby: {:?} templates in the dump, standby holds {:?}",
        dumped, synced
    );
    assert!(
        synced.is_some(),
        "the restarted standby's templates differ:\n{}",
        last.join("\n")
    );
    standby.stop_clean();
    active.stop_clean();
}
