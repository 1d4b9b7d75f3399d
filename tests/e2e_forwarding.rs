//! Tier 3, forwarding end to end with real kernels: a test bed (scripts/testbed.sh)
//! with a client and three real servers, each running a small HTTP server that answers
//! with its own name and logs the client's address (tests/tools/e2e_apps.py), and
//! Sluice on net_af_packet in front of them.
//!
//! - DR: the VIPs on every real server's `lo` with arp_ignore=1 / arp_announce=2; 300
//!   curl requests on new connections through an rr VIP (100/100/100 +-2) and 300
//!   through a wrr 3:2:1 VIP (150/100/50 +-2 % of 300), all succeed, every real server
//!   logs the client's own address; UDP echo; a service added and removed through the
//!   control socket.
//! - NAT: the same with the client on another subnet, the real servers' default route
//!   via Sluice and port mapping 80 -> 8080; UDP echo.
//! - UDP session expiry: with `[timeouts] udp = 2` and `tick_ms = 10` the sessions of a
//!   UDP exchange disappear within a bounded wait (not before the timeout), the real
//!   servers' counts return to 0, and a new datagram makes a new session.
//! - A real server's new MAC (set without a gratuitous ARP): unreachable at once,
//!   reached again within 30 s (+5) of its last confirmation, when Sluice asks anew.
//!
//! Run: `cargo test --release --test integration e2e_forwarding::` (as root).

use crate::common::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

const APPLIANCE: &str = "198.18.0.1";
const REQUESTS: u64 = 300;
const PARALLEL: u32 = 4;
const UDP_PORT: u16 = 3333;

/// [`AppLab::diagnostics`] plus the host's per-CPU backlog drops, for failure messages.
fn diagnostics(lab: &AppLab) -> String {
    format!(
        "{}--- /proc/net/softnet_stat (hex; 2nd column: backlog drops) ---\n{}",
        lab.diagnostics(),
        std::fs::read_to_string("/proc/net/softnet_stat").unwrap_or_default()
    )
}

/// `[[services]]` TOML for one service over the three real servers.
fn service_toml(
    proto: &str,
    vip: &str,
    port: u16,
    scheduler: &str,
    real_servers: &[(&str, u16, u32, &str)],
) -> String {
    let mut t = format!(
        "[[services]]\nproto = \"{proto}\"\nvip = \"{vip}\"\nport = {port}\nscheduler = \"{scheduler}\"\n"
    );
    for (ip, rport, weight, mode) in real_servers {
        t.push_str(&format!(
            "\n  [[services.real_servers]]\n  ip = \"{ip}\"\n  port = {rport}\n  weight = {weight}\n  mode = \"{mode}\"\n"
        ));
    }
    t
}

/// Asserts a batch: every request succeeded, and each real server got its share
/// within `tolerance`. Returns the counts by real-server name.
fn assert_spread(
    lab: &AppLab,
    batch: &Value,
    want: &[(&str, u64)],
    tolerance: u64,
    daemon: &Daemon,
) -> BTreeMap<String, u64> {
    let counts: BTreeMap<String, u64> = batch["bodies"]
        .as_object()
        .map(|o| {
            o.iter()
                .map(|(k, v)| (k.clone(), v.as_u64().unwrap()))
                .collect()
        })
        .unwrap_or_default();
    let total: u64 = want.iter().map(|(_, n)| n).sum();
    assert_eq!(
        batch["ok"].as_u64(),
        Some(total),
        "not every request succeeded: {batch:#}\nstatus: {:#}\nservices: {:#}\n{}\n{}",
        daemon.status(),
        daemon.list_services(),
        daemon.dump(),
        diagnostics(lab)
    );
    for (name, n) in want {
        let got = counts.get(*name).copied().unwrap_or(0);
        assert!(
            got.abs_diff(*n) <= tolerance,
            "{name} answered {got} of {total} requests, expected {n} +- {tolerance}: {counts:?}"
        );
    }
    assert_eq!(
        counts.len(),
        want.len(),
        "answers from unexpected servers: {counts:?}"
    );
    counts
}

/// The HTTP log lines of each real server since `before[i]`: their number equals the
/// answers it gave, and every one names `client_ip`.
fn assert_logs(lab: &AppLab, before: &[usize], counts: &BTreeMap<String, u64>, client_ip: &str) {
    for i in 1..=lab.bed.rs_count() {
        let lines = lab.log_lines(i, "http");
        let new = &lines[before[i as usize - 1]..];
        let answered = counts.get(&format!("rs{i}")).copied().unwrap_or(0);
        assert_eq!(
            new.len() as u64,
            answered,
            "rs{i} logged {} requests but answered {answered}",
            new.len()
        );
        for l in new {
            let ip = l.split_whitespace().nth(1).unwrap_or("");
            assert_eq!(
                ip, client_ip,
                "rs{i} saw a client other than the real one: {l:?}"
            );
        }
    }
}

/// Sluice's own statistics for a service agree with what the real servers saw.
fn assert_rs_stats(
    daemon: &Daemon,
    lab: &AppLab,
    vip: &str,
    port: u16,
    counts: &BTreeMap<String, u64>,
    nat: bool,
) {
    let list = daemon.list_services();
    for i in 1..=lab.bed.rs_count() {
        let rs = real_server(&list, "tcp", vip, port, lab.bed.rs_ip(i));
        let answered = counts.get(&format!("rs{i}")).copied().unwrap_or(0);
        let conns = rs_counter(rs, "connections");
        assert_eq!(
            conns, answered,
            "Sluice counted {conns} connections to rs{i}, which answered {answered}: {rs}"
        );
        let inp = rs_counter(rs, "in_packets");
        assert!(
            inp >= 4 * conns,
            "rs{i}: {inp} packets in for {conns} connections (SYN, ACK, request, FIN at least): {rs}"
        );
        let outp = rs_counter(rs, "out_packets");
        if nat {
            assert!(
                outp >= 3 * conns,
                "rs{i}: {outp} packets out for {conns} NAT connections (SYN-ACK, response, FIN at least): {rs}"
            );
        } else {
            assert_eq!(
                outp, 0,
                "rs{i}: DR replies must not pass Sluice, yet out_packets = {outp}: {rs}"
            );
        }
    }
}

fn stop(mut daemon: Daemon) {
    let exit = daemon.terminate();
    assert!(
        exit.success(),
        "sluice exited with {exit}\n{}",
        daemon.dump()
    );
    assert!(
        dpdk_runtime_dirs(&daemon.config.file_prefix).is_empty(),
        "DPDK runtime dir left behind"
    );
}

// ---------------------------------------------------------------------------------

const DR_VIP_RR: &str = "198.18.0.200";
const DR_VIP_WRR: &str = "198.18.0.201";
const DR_VIP_ADDED: &str = "198.18.0.202";

#[test]
fn dr_rr_and_wrr_spread_300_connections_and_keep_the_client_address() {
    require_root();
    let mut lab = AppLab::new(3);
    lab.bed
        .configure("dr-vip", &[DR_VIP_RR, DR_VIP_WRR, DR_VIP_ADDED]);
    lab.start_servers(&["0.0.0.0:80".into()], &[format!("{DR_VIP_RR}:{UDP_PORT}")]);
    let rips: Vec<String> = (1..=3).map(|i| lab.bed.rs_ip(i).to_string()).collect();
    let rr: Vec<(&str, u16, u32, &str)> = rips.iter().map(|r| (r.as_str(), 80, 1, "dr")).collect();
    let wrr: Vec<(&str, u16, u32, &str)> = rips
        .iter()
        .zip([3, 2, 1])
        .map(|(r, w)| (r.as_str(), 80, w, "dr"))
        .collect();
    let udp: Vec<(&str, u16, u32, &str)> = rips
        .iter()
        .map(|r| (r.as_str(), UDP_PORT, 1, "dr"))
        .collect();
    let toml = [
        service_toml("tcp", DR_VIP_RR, 80, "rr", &rr),
        service_toml("tcp", DR_VIP_WRR, 80, "wrr", &wrr),
        service_toml("udp", DR_VIP_RR, UDP_PORT, "rr", &udp),
    ]
    .join("\n");
    let daemon = lab.daemon(&[&format!("{APPLIANCE}/24")], toml);
    lab.prewarm(&daemon, DR_VIP_RR);

    // The VIP resolves to Sluice, never to a real server (arp_ignore=1 on them).
    let port_mac = port(&daemon.status(), "lan0")["mac"]
        .as_str()
        .unwrap()
        .to_ascii_lowercase();
    let neigh = lab
        .bed
        .exec(
            lab.bed.client_ns(),
            &["ip", "neigh", "show", DR_VIP_RR],
            Duration::from_secs(10),
        )
        .expect_success("ip neigh show");
    assert!(
        neigh.stdout.to_ascii_lowercase().contains(&port_mac),
        "the client resolved the VIP {DR_VIP_RR} to {:?}, not to Sluice's {port_mac}",
        neigh.stdout
    );
    let client_ip = lab.bed.client_ip().to_string();

    // rr: 100/100/100 (+-2).
    let before = lab.http_log_len();
    let batch = lab.curl(&format!("http://{DR_VIP_RR}/"), REQUESTS, PARALLEL, &[]);
    let counts = assert_spread(
        &lab,
        &batch,
        &[("rs1", 100), ("rs2", 100), ("rs3", 100)],
        2,
        &daemon,
    );
    assert_logs(&lab, &before, &counts, &client_ip);
    assert_rs_stats(&daemon, &lab, DR_VIP_RR, 80, &counts, false);

    // wrr 3:2:1: 150/100/50 (+-2 % of 300).
    let before = lab.http_log_len();
    let batch = lab.curl(&format!("http://{DR_VIP_WRR}/"), REQUESTS, PARALLEL, &[]);
    let counts = assert_spread(
        &lab,
        &batch,
        &[("rs1", 150), ("rs2", 100), ("rs3", 50)],
        6,
        &daemon,
    );
    assert_logs(&lab, &before, &counts, &client_ip);
    assert_rs_stats(&daemon, &lab, DR_VIP_WRR, 80, &counts, false);

    // UDP echo through the VIP: 9 new flows, rr 3/3/3, replies straight from the
    // real servers (bound to the VIP).
    let (out, v) = lab.udp(DR_VIP_RR, UDP_PORT, 9, 42000);
    assert!(
        out.success(),
        "UDP echo through {DR_VIP_RR}:{UDP_PORT}: {}\nstatus: {:#}",
        out.describe(),
        daemon.status()
    );
    for i in 1..=3 {
        let n = v["replies"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r.as_str().unwrap().starts_with(&format!("rs{i} ")))
            .count();
        assert_eq!(n, 3, "rs{i} echoed {n} of 9 datagrams (rr): {v}");
        let logged = lab.log_lines(i, "udp");
        assert_eq!(logged.len(), 3, "rs{i} udp log: {logged:?}");
        assert!(
            logged
                .iter()
                .all(|l| l.split_whitespace().nth(1) == Some(&client_ip)),
            "rs{i} saw another client address: {logged:?}"
        );
    }

    // A service added and removed through the control socket (ipvsadm syntax).
    let vs = format!("{DR_VIP_ADDED}:80");
    let rs2 = format!("{}:80", lab.bed.rs_ip(2));
    daemon
        .ctl(&["-A", "-t", &vs, "-s", "rr"])
        .expect_success("sluicectl -A");
    daemon
        .ctl(&["-a", "-t", &vs, "-r", &rs2, "-g", "-w", "1"])
        .expect_success("sluicectl -a");
    let list = daemon.list_services();
    let added = real_server(&list, "tcp", DR_VIP_ADDED, 80, lab.bed.rs_ip(2));
    assert_eq!(added["mode"], "dr", "{added}");
    assert_eq!(added["weight"], 1, "{added}");
    let batch = lab.curl(&format!("http://{DR_VIP_ADDED}/"), 6, PARALLEL, &[]);
    assert_spread(&lab, &batch, &[("rs2", 6)], 0, &daemon);
    daemon
        .ctl(&["-d", "-t", &vs, "-r", &rs2])
        .expect_success("sluicectl -d");
    let list = daemon.list_services();
    let svc = find_service(&list, "tcp", DR_VIP_ADDED, 80)
        .unwrap_or_else(|| panic!("service {vs} gone after -d: {list:#}"));
    assert_eq!(
        svc["real_servers"].as_array().map(Vec::len),
        Some(0),
        "{svc}"
    );
    daemon
        .ctl(&["-D", "-t", &vs])
        .expect_success("sluicectl -D");
    let list = daemon.list_services();
    assert!(
        find_service(&list, "tcp", DR_VIP_ADDED, 80).is_none(),
        "service {vs} still listed after -D: {list:#}"
    );

    lab.assert_no_checksum_errors();
    let status = daemon.status();
    assert_eq!(drop_count(&status, "tx_full"), 0, "{status:#}");
    stop(daemon);
}

const NAT_CLIENT: &str = "198.18.2.100/24";
const NAT_GATEWAY: &str = "198.18.2.1";
const NAT_VIP_RR: &str = "198.18.1.1";
const NAT_VIP_WRR: &str = "198.18.1.2";
const NAT_HTTP_PORT: u16 = 8080;
/// The wrr service's real port. Each service has real ports of its own: a client that
/// reuses a source port towards the other VIP would otherwise need a second session
/// with the same real-server-side 5-tuple (RIP:rport <-> client:port), which Sluice
/// refuses (the SYN is dropped as `no_real_server`; the client retries a second later),
/// and that would measure this limitation instead of the spread.
const NAT_HTTP_PORT_WRR: u16 = 8081;
const NAT_UDP_PORT: u16 = 4444;

/// The NAT layout: the client on 198.18.2.0/24 behind Sluice's second address, the
/// real servers' default route via Sluice's 198.18.0.1.
fn nat_lab() -> AppLab {
    let mut lab = AppLab::new(3);
    lab.bed.configure("client-addr", &[NAT_CLIENT, NAT_GATEWAY]);
    lab.bed.configure("rs-gateway", &[APPLIANCE]);
    lab.start_servers(
        &[
            format!("0.0.0.0:{NAT_HTTP_PORT}"),
            format!("0.0.0.0:{NAT_HTTP_PORT_WRR}"),
        ],
        &[format!("0.0.0.0:{NAT_UDP_PORT}")],
    );
    lab
}

fn nat_addresses() -> [String; 2] {
    [format!("{APPLIANCE}/24"), format!("{NAT_GATEWAY}/24")]
}

#[test]
fn nat_rr_and_wrr_spread_300_connections_and_keep_the_client_address() {
    require_root();
    let lab = nat_lab();
    let rips: Vec<String> = (1..=3).map(|i| lab.bed.rs_ip(i).to_string()).collect();
    let rr: Vec<(&str, u16, u32, &str)> = rips
        .iter()
        .map(|r| (r.as_str(), NAT_HTTP_PORT, 1, "nat"))
        .collect();
    let wrr: Vec<(&str, u16, u32, &str)> = rips
        .iter()
        .zip([3, 2, 1])
        .map(|(r, w)| (r.as_str(), NAT_HTTP_PORT_WRR, w, "nat"))
        .collect();
    let udp: Vec<(&str, u16, u32, &str)> = rips
        .iter()
        .map(|r| (r.as_str(), NAT_UDP_PORT, 1, "nat"))
        .collect();
    let toml = [
        service_toml("tcp", NAT_VIP_RR, 80, "rr", &rr),
        service_toml("tcp", NAT_VIP_WRR, 80, "wrr", &wrr),
        service_toml("udp", NAT_VIP_RR, UDP_PORT, "rr", &udp),
    ]
    .join("\n");
    let addrs = nat_addresses();
    let daemon = lab.daemon(&[&addrs[0], &addrs[1]], toml);
    lab.prewarm(&daemon, NAT_GATEWAY);
    let client_ip = lab.bed.client_ip().to_string();
    assert_eq!(client_ip, "198.18.2.100");

    let before = lab.http_log_len();
    let batch = lab.curl(&format!("http://{NAT_VIP_RR}/"), REQUESTS, PARALLEL, &[]);
    let counts = assert_spread(
        &lab,
        &batch,
        &[("rs1", 100), ("rs2", 100), ("rs3", 100)],
        2,
        &daemon,
    );
    assert_logs(&lab, &before, &counts, &client_ip);
    assert_rs_stats(&daemon, &lab, NAT_VIP_RR, 80, &counts, true);

    let before = lab.http_log_len();
    let batch = lab.curl(&format!("http://{NAT_VIP_WRR}/"), REQUESTS, PARALLEL, &[]);
    let counts = assert_spread(
        &lab,
        &batch,
        &[("rs1", 150), ("rs2", 100), ("rs3", 50)],
        6,
        &daemon,
    );
    assert_logs(&lab, &before, &counts, &client_ip);
    assert_rs_stats(&daemon, &lab, NAT_VIP_WRR, 80, &counts, true);

    // UDP echo: the replies come back through Sluice, from the VIP.
    let (out, v) = lab.udp(NAT_VIP_RR, UDP_PORT, 9, 42000);
    assert!(
        out.success(),
        "UDP echo through {NAT_VIP_RR}:{UDP_PORT}: {}\nstatus: {:#}",
        out.describe(),
        daemon.status()
    );
    for i in 1..=3 {
        let n = v["replies"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r.as_str().unwrap().starts_with(&format!("rs{i} ")))
            .count();
        assert_eq!(n, 3, "rs{i} echoed {n} of 9 datagrams (rr): {v}");
        let logged = lab.log_lines(i, "udp");
        assert!(
            logged.len() == 3
                && logged.iter().all(|l| {
                    let w: Vec<&str> = l.split_whitespace().collect();
                    w.get(1) == Some(&client_ip.as_str())
                        && w.get(3) == Some(&format!("0.0.0.0:{NAT_UDP_PORT}").as_str())
                }),
            "rs{i} udp log: {logged:?}"
        );
    }

    lab.assert_no_checksum_errors();
    let status = daemon.status();
    assert_eq!(drop_count(&status, "tx_full"), 0, "{status:#}");
    stop(daemon);
}

/// A real server whose MAC changes without a gratuitous ARP (Linux sends none when
/// its address is set): connections to it fail at once, since Sluice's entry still
/// holds the old MAC, and go through again once worker 0 has asked for the real
/// server anew, within `NEIGHBOUR_RECHECK_S` (30 s) of the entry's last confirmation.
/// The real server is given Sluice's MAC for good first, so it never ARPs for Sluice
/// itself (which would tell Sluice the new MAC without the recheck).
#[test]
fn a_real_server_that_changes_its_mac_is_reached_again_after_the_recheck() {
    require_root();
    const RECHECK: Duration = Duration::from_secs(30);
    let mut lab = AppLab::new(1);
    lab.bed.configure("client-addr", &[NAT_CLIENT, NAT_GATEWAY]);
    lab.bed.configure("rs-gateway", &[APPLIANCE]);
    lab.start_servers(&[format!("0.0.0.0:{NAT_HTTP_PORT}")], &[]);
    let rs = lab.bed.rs_ip(1).to_string();
    // A second real server nobody answers for (weight 0: never scheduled), which
    // `sluicectl neigh` must list as unresolved.
    let silent = {
        let mut octets = lab.bed.rs_ip(1).parse::<Ipv4Addr>().unwrap().octets();
        octets[3] = 250;
        Ipv4Addr::from(octets).to_string()
    };
    let toml = service_toml(
        "tcp",
        NAT_VIP_RR,
        80,
        "rr",
        &[
            (rs.as_str(), NAT_HTTP_PORT, 1, "nat"),
            (silent.as_str(), NAT_HTTP_PORT, 0, "nat"),
        ],
    );
    let addrs = nat_addresses();
    let daemon = lab.daemon(&[&addrs[0], &addrs[1]], toml);
    // The real server pings Sluice, which learns (confirms) its MAC now.
    lab.prewarm(&daemon, NAT_GATEWAY);
    let confirmed = Instant::now();
    let url = format!("http://{NAT_VIP_RR}/");
    let batch = lab.curl(&url, 3, 1, &[]);
    assert_eq!(batch["ok"], 3, "{batch}\n{}", diagnostics(&lab));

    let (ns, ifname, t) = (lab.bed.rs_ns(1), lab.bed.rs_if(1), Duration::from_secs(10));
    // `sluicectl neigh` against the kernel's own word for the real server's MAC.
    let kernel_mac = || {
        let out = lab
            .bed
            .exec(ns, &["ip", "-j", "link", "show", "dev", ifname], t);
        let link: serde_json::Value = serde_json::from_str(&out.stdout).expect("ip -j link");
        link[0]["address"].as_str().expect("a MAC").to_string()
    };
    let listed_mac = |want: &str| {
        let table = daemon.neighbours();
        let rows: Vec<&serde_json::Value> = table["neighbours"]
            .as_array()
            .expect("neighbours")
            .iter()
            .filter(|n| n["address"] == rs.as_str())
            .collect();
        let workers = table["workers"].as_array().expect("workers").len();
        let every_worker: Vec<u64> = (0..workers as u64).collect();
        let unresolved: Vec<&str> = table["unresolved"]
            .as_array()
            .expect("unresolved")
            .iter()
            .filter_map(|u| u["address"].as_str())
            .collect();
        assert_eq!(unresolved, [silent.as_str()], "{table}");
        (rows.len() == 1
            && rows[0]["mac"] == want
            && rows[0]["role"] == "real_server"
            && rows[0]["workers"] == serde_json::json!(every_worker))
        .then_some(())
        .ok_or(table)
    };
    let before = kernel_mac();
    if let Err(table) = listed_mac(&before) {
        panic!("sluicectl neigh does not list {rs} at {before} on every worker: {table}");
    }
    let text = daemon.ctl(&["neigh"]);
    assert!(
        text.success() && text.stdout.contains(&before) && text.stdout.contains("(unresolved)"),
        "{}",
        text.describe()
    );

    let lb_mac = lab.bed.lb_mac().to_lowercase();
    for cmd in [
        vec![
            "ip",
            "link",
            "set",
            "dev",
            ifname,
            "address",
            "02:53:4c:99:00:01",
        ],
        vec![
            "ip",
            "neigh",
            "replace",
            APPLIANCE,
            "lladdr",
            &lb_mac,
            "nud",
            "permanent",
            "dev",
            ifname,
        ],
    ] {
        lab.bed.exec(ns, &cmd, t).expect_success(&cmd.join(" "));
    }
    let once = || lab.curl(&url, 1, 1, &["--max-time", "2"])["ok"] == 1;
    assert!(
        !once(),
        "reached at the new MAC at once: the test shows nothing"
    );
    let reached = wait_for(
        RECHECK + Duration::from_secs(10),
        Duration::from_millis(500),
        || once().then(|| confirmed.elapsed()),
    );
    eprintln!("the real server's new MAC reached {reached:?} after its last confirmation");
    let reached = reached.unwrap_or_else(|| {
        panic!(
            "never reached at its new MAC\n{}\n{}",
            diagnostics(&lab),
            daemon.dump()
        )
    });
    // Asked once the entry is RECHECK old, at the next second's round, plus the
    // curl that saw it.
    assert!(reached < RECHECK + Duration::from_secs(5), "{reached:?}");
    let batch = lab.curl(&url, 5, 1, &[]);
    assert_eq!(batch["ok"], 5, "{batch}\n{}", diagnostics(&lab));
    let after = kernel_mac();
    assert_eq!(after, "02:53:4c:99:00:01");
    if let Err(table) = listed_mac(&after) {
        panic!("sluicectl neigh does not list {rs} at its new MAC {after}: {table}");
    }
    stop(daemon);
}

/// A static neighbour (`ports[].static_neighbours`) holds against a forged ARP: a
/// second host on the link (the other real server's namespace, with scapy) sends
/// gratuitous ARP replies claiming the real server's address at its own MAC. Without
/// the static entry Sluice would take them (as Linux does) and send the real server's
/// connections to the forger; with it, every connection still reaches the real
/// server, and `sluicectl neigh` lists the entry as `static` at the configured MAC.
#[test]
fn a_static_neighbour_holds_against_a_forged_arp() {
    require_root();
    let mut lab = AppLab::new(2);
    lab.bed.configure("client-addr", &[NAT_CLIENT, NAT_GATEWAY]);
    lab.bed.configure("rs-gateway", &[APPLIANCE]);
    lab.start_servers(&[format!("0.0.0.0:{NAT_HTTP_PORT}")], &[]);
    let t = Duration::from_secs(10);
    let mac_of = |i: u32| {
        let out = lab.bed.exec(
            lab.bed.rs_ns(i),
            &["ip", "-j", "link", "show", "dev", lab.bed.rs_if(i)],
            t,
        );
        let link: serde_json::Value = serde_json::from_str(&out.stdout).expect("ip -j link");
        link[0]["address"].as_str().expect("a MAC").to_string()
    };
    let (rs, real_mac, forger_mac) = (lab.bed.rs_ip(1).to_string(), mac_of(1), mac_of(2));
    let toml = service_toml(
        "tcp",
        NAT_VIP_RR,
        80,
        "rr",
        &[(rs.as_str(), NAT_HTTP_PORT, 1, "nat")],
    );
    let addrs = nat_addresses();
    let mut cfg = lab.daemon_config(&[&addrs[0], &addrs[1]], toml);
    cfg.ports[0].settings.push(format!(
        "static_neighbours = [{{ address = \"{rs}\", mac = \"{real_mac}\" }}]"
    ));
    let daemon = Daemon::start(cfg);
    let url = format!("http://{NAT_VIP_RR}/");
    let batch = lab.curl(&url, 3, 1, &[]);
    assert_eq!(batch["ok"], 3, "{batch}\n{}", diagnostics(&lab));
    // Gratuitous ARP replies from the forger, to everyone on the link.
    let forge = format!(
        "from scapy.all import Ether, ARP, sendp\n\
         sendp(Ether(dst='ff:ff:ff:ff:ff:ff', src='{forger_mac}') / ARP(op=2, hwsrc='{forger_mac}', \
         psrc='{rs}', hwdst='ff:ff:ff:ff:ff:ff', pdst='{rs}'), iface='{}', count=5, inter=0.05, verbose=False)\n",
        lab.bed.rs_if(2)
    );
    lab.bed
        .exec(lab.bed.rs_ns(2), &["/usr/bin/python3", "-c", &forge], t)
        .expect_success("scapy forging ARP");
    std::thread::sleep(Duration::from_millis(300));
    let batch = lab.curl(&url, 5, 1, &["--max-time", "2"]);
    assert_eq!(
        batch["ok"],
        5,
        "connections lost after a forged ARP: {batch}\n{}\n{}",
        diagnostics(&lab),
        daemon.dump()
    );
    let table = daemon.neighbours();
    let rows: Vec<&serde_json::Value> = table["neighbours"]
        .as_array()
        .expect("neighbours")
        .iter()
        .filter(|n| n["address"] == rs.as_str())
        .collect();
    assert!(
        rows.len() == 1 && rows[0]["role"] == "static" && rows[0]["mac"] == real_mac.as_str(),
        "{table}"
    );
    stop(daemon);
}

/// A blind sender who knows a NAT connection's addresses and ports sends a RST, a FIN
/// and a SYN in the client's name at a sequence number far from the client's (scapy,
/// from the client's namespace, about half the sequence space from the client's own
/// segments, which it captures): the session stays ESTABLISHED, the worker counts the
/// RST and FIN as `tcp_close_out_of_window`, and the connection still echoes. Then the
/// client's own kernel resets it (SO_LINGER 0), at its exact next byte: the session
/// goes to CLOSE (`AppLab::assert_blind_segments_move_nothing`). Without the check the
/// forged RST moves the session to CLOSE (10 s to live: an idle connection would find
/// no session when it spoke again), and the SYN after it retires the session.
#[test]
fn a_blind_rst_fin_and_syn_leave_a_nat_connection_established() {
    require_root();
    let mut lab = AppLab::new(1);
    lab.bed.configure("client-addr", &[NAT_CLIENT, NAT_GATEWAY]);
    lab.bed.configure("rs-gateway", &[APPLIANCE]);
    let echo_port = 7777;
    lab.start_servers_listening(&[("--echo", &format!("0.0.0.0:{echo_port}"))]);
    let rs = lab.bed.rs_ip(1).to_string();
    let toml = service_toml(
        "tcp",
        NAT_VIP_RR,
        7,
        "rr",
        &[(rs.as_str(), echo_port, 1, "nat")],
    );
    let addrs = nat_addresses();
    let daemon = lab.daemon(&[&addrs[0], &addrs[1]], toml);
    lab.prewarm(&daemon, NAT_GATEWAY);
    let client = NAT_CLIENT.split('/').next().unwrap();
    lab.assert_blind_segments_move_nothing(&daemon, NAT_VIP_RR, 7, client);
    stop(daemon);
}

#[test]
fn udp_sessions_expire_after_the_configured_timeout() {
    require_root();
    let lab = nat_lab();
    let vip = "198.18.1.3";
    let rips: Vec<String> = (1..=3).map(|i| lab.bed.rs_ip(i).to_string()).collect();
    let udp: Vec<(&str, u16, u32, &str)> = rips
        .iter()
        .map(|r| (r.as_str(), NAT_UDP_PORT, 1, "nat"))
        .collect();
    let toml = format!(
        "[timeouts]\nudp = 2\n\n[sessions]\ntick_ms = 10\n\n{}",
        service_toml("udp", vip, UDP_PORT, "rr", &udp)
    );
    let addrs = nat_addresses();
    let daemon = lab.daemon(&[&addrs[0], &addrs[1]], toml);
    lab.prewarm(&daemon, NAT_GATEWAY);
    assert_eq!(
        session_count(&daemon.status()),
        0,
        "sessions before any traffic"
    );

    // 6 flows (fixed source ports), 2 per real server.
    let (out, v) = lab.udp(vip, UDP_PORT, 6, 41000);
    assert!(
        out.success(),
        "UDP echo through {vip}:{UDP_PORT}: {}\nstatus: {:#}",
        out.describe(),
        daemon.status()
    );
    let last_reply = Instant::now();
    let status = daemon.status();
    let live = session_count(&status);
    let list = daemon.list_services();
    let per_rs: Vec<(u64, u64, u64)> = (1..=3)
        .map(|i| {
            let rs = real_server(&list, "udp", vip, UDP_PORT, lab.bed.rs_ip(i));
            (
                rs_counter(rs, "active"),
                rs_counter(rs, "inactive"),
                rs_counter(rs, "connections"),
            )
        })
        .collect();
    assert!(
        last_reply.elapsed() < Duration::from_millis(1500),
        "reading the counters took too long to tell anything about expiry"
    );
    assert_eq!(live, 6, "sessions right after 6 exchanges: {status:#}\n{v}");
    for (i, (active, inactive, conns)) in per_rs.iter().enumerate() {
        assert_eq!(
            (*active + *inactive, *conns),
            (2, 2),
            "rs{}: active {active} + inactive {inactive}, connections {conns}: {list:#}",
            i + 1
        );
    }

    // Expiry: within the timeout plus a margin; never well before it.
    let expired_at = wait_for(Duration::from_secs(10), Duration::from_millis(20), || {
        (session_count(&daemon.status()) == 0).then(Instant::now)
    })
    .unwrap_or_else(|| {
        panic!(
            "UDP sessions still live 10 s after the exchange (udp timeout 2 s): {:#}",
            daemon.status()
        )
    });
    let after = expired_at.duration_since(last_reply);
    eprintln!("UDP sessions expired {after:?} after the last reply (timeout 2 s)");
    assert!(
        after >= Duration::from_millis(1500),
        "sessions expired after {after:?}, before the 2 s UDP timeout"
    );
    let list = daemon.list_services();
    for i in 1..=3 {
        let rs = real_server(&list, "udp", vip, UDP_PORT, lab.bed.rs_ip(i));
        assert_eq!(
            (rs_counter(rs, "active"), rs_counter(rs, "inactive")),
            (0, 0),
            "rs{i} still counts sessions after expiry: {rs}"
        );
        assert_eq!(
            rs_counter(rs, "connections"),
            2,
            "connections is cumulative: {rs}"
        );
    }

    // The same flow again: a new session, scheduled afresh.
    let (out, _) = lab.udp(vip, UDP_PORT, 1, 41000);
    assert!(out.success(), "UDP after expiry: {}", out.describe());
    assert_eq!(session_count(&daemon.status()), 1);
    let list = daemon.list_services();
    let total: u64 = (1..=3)
        .map(|i| {
            rs_counter(
                real_server(&list, "udp", vip, UDP_PORT, lab.bed.rs_ip(i)),
                "connections",
            )
        })
        .sum();
    assert_eq!(total, 7, "a new session after expiry: {list:#}");

    lab.assert_no_checksum_errors();
    stop(daemon);
}

const TUN_VIP: &str = "198.18.0.203";

/// TUN end to end: Sluice encapsulates, each real server's user-space decapsulator
/// hands the inner packet to its kernel (VIP on lo), the replies go to the client
/// directly. Then a POST larger than the tunnel's MTU: Sluice answers the client's
/// 1500-byte DF segments with frag-needed (MTU 1480), the client's kernel lowers its
/// path MTU and the upload completes.
#[test]
fn tun_through_a_user_space_decapsulator_with_path_mtu_discovery() {
    require_root();
    let mut lab = AppLab::new(3);
    lab.bed.configure("dr-vip", &[TUN_VIP]);
    lab.start_decapsulators(false);
    lab.start_servers(&["0.0.0.0:80".into()], &[]);
    let rips: Vec<String> = (1..=3).map(|i| lab.bed.rs_ip(i).to_string()).collect();
    let rs: Vec<(&str, u16, u32, &str)> = rips.iter().map(|r| (r.as_str(), 80, 1, "tun")).collect();
    let daemon = lab.daemon(
        &[&format!("{APPLIANCE}/24")],
        service_toml("tcp", TUN_VIP, 80, "rr", &rs),
    );
    lab.prewarm(&daemon, TUN_VIP);
    let client_ip = lab.bed.client_ip().to_string();

    let before = lab.http_log_len();
    let batch = lab.curl(&format!("http://{TUN_VIP}/"), 30, PARALLEL, &[]);
    let counts = assert_spread(
        &lab,
        &batch,
        &[("rs1", 10), ("rs2", 10), ("rs3", 10)],
        2,
        &daemon,
    );
    assert_logs(&lab, &before, &counts, &client_ip);
    let list = daemon.list_services();
    for i in 1..=3 {
        let entry = real_server(&list, "tcp", TUN_VIP, 80, lab.bed.rs_ip(i));
        assert_eq!(entry["mode"], "tun", "{entry}");
        let answered = counts.get(&format!("rs{i}")).copied().unwrap_or(0);
        assert_eq!(rs_counter(entry, "connections"), answered, "{entry}");
        assert_eq!(rs_counter(entry, "out_packets"), 0, "{entry}");
        // Everything reached the server through the tunnel, from Sluice's address.
        let ipip = read_lines(&lab.dir.path().join(format!("rs{i}.ipip.log")));
        assert!(
            ipip.len() as u64 >= 4 * answered,
            "rs{i} decapsulated {} packets for {answered} connections",
            ipip.len()
        );
        for l in &ipip {
            let w: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(
                (w.get(1).copied(), w.get(2).copied(), w.get(3).copied()),
                (Some(APPLIANCE), Some(client_ip.as_str()), Some(TUN_VIP)),
                "rs{i} tunnel log line {l:?}"
            );
        }
    }

    // Path MTU: a 20000-byte upload in 1500-byte segments with DF.
    let too_big_before = drop_count(&daemon.status(), "too_big");
    let batch = lab.curl(
        &format!("http://{TUN_VIP}/"),
        1,
        PARALLEL,
        &["--post-bytes", "20000"],
    );
    assert_eq!(
        batch["ok"].as_u64(),
        Some(1),
        "the upload through the tunnel failed: {batch:#}\nstatus: {:#}",
        daemon.status()
    );
    let body = batch["bodies"]
        .as_object()
        .unwrap()
        .keys()
        .next()
        .unwrap()
        .clone();
    assert!(
        body.ends_with(" 20000"),
        "the real server received {body:?}"
    );
    let too_big = drop_count(&daemon.status(), "too_big") - too_big_before;
    assert!(
        too_big >= 1,
        "no segment was too big for the tunnel: {:#}",
        daemon.status()
    );
    let route = lab
        .bed
        .exec(
            lab.bed.client_ns(),
            &["ip", "route", "get", TUN_VIP],
            Duration::from_secs(10),
        )
        .expect_success("ip route get");
    assert!(
        route.stdout.contains("mtu 1480"),
        "the client did not learn the path MTU 1480 from Sluice's frag-needed: {}",
        route.stdout
    );

    lab.assert_no_checksum_errors();
    stop(daemon);
}
