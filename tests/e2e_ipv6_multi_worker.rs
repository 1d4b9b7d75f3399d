//! Tier 3, IPv6 NAT and FullNAT with two workers: the IPv6 bed of
//! `tests/e2e_ipv6_local.rs` (a client and two real servers whose kernels speak IPv6,
//! real servers running `tests/tools/e2e_apps.py serve`), and Sluice with two workers
//! on net_af_packet with `qpairs=2`, sharing CPU 1 as in `tests/e2e_multi_worker.rs`.
//! The kernel's packet-fanout hash spreads the frames over the two queues (not
//! Toeplitz: the port is steered), so about half of the real servers' replies land on
//! the worker that does not own their session, and the real servers' Neighbor
//! Advertisements on one worker only.
//!
//! - a NAT, a FullNAT and a NAT64 TCP service: 60 new connections each (curl, 4 at a
//!   time, each bounded to 5 s), all answered, by both real servers;
//! - the same for UDP, 8 exchanges each;
//! - the real servers saw the FullNAT local address with a port of its own for every
//!   connection (two workers never pick the same pair towards one server);
//! - the workers redirected packets to each other, received every one, and dropped
//!   none as `ipv6_no_service`, `tcp_no_session` or `laddr_exhausted`.
//!
//! And health checks of three IPv6 real servers with two workers: worker 0 sends the
//! probes from its IPv6 neighbour table, and every server is probed up although the
//! fanout puts each server's Neighbor Advertisements on one queue only (the other
//! worker shares what it learns).
//!
//! Run: `cargo test --release --test integration e2e_ipv6_multi_worker::` (as root).

use crate::common::*;
use crate::e2e_ipv6_local::{appliance6, ipv6_lab, rs_ip6, service6, LIP4, LIP6, VIP6};
use std::time::Duration;

const WORKERS: u32 = 2;
const CONNECTIONS: u64 = 60;
const EXCHANGES: u32 = 8;

#[test]
fn ipv6_nat_and_fullnat_with_two_workers_lose_no_connection() {
    require_root();
    let mut lab = AppLab::new(2);
    ipv6_lab(&lab);
    lab.start_servers(&["[::]:8080".to_string()], &["[::]:5353".to_string()]);
    let laddr = format!("local_addresses = [\"{LIP6}\"]\n");
    let services = [
        service6(&lab, "tcp", 80, 8080, "nat", ""),
        service6(&lab, "udp", 5300, 5353, "nat", ""),
        service6(&lab, "tcp", 82, 8080, "fullnat", &laddr),
        service6(&lab, "udp", 5302, 5353, "fullnat", &laddr),
    ]
    .join("\n");
    // NAT64: the same real servers' IPv4 addresses (the listeners take both), from an
    // IPv4 local address on their link.
    let nat64: String = (1..=2)
        .map(|i| {
            format!(
                "  [[services.real_servers]]\n  ip = \"{}\"\n  port = 8080\n  mode = \"fullnat\"\n",
                lab.bed.rs_ip(i)
            )
        })
        .collect();
    let services = format!(
        "{services}\n[[services]]\nproto = \"tcp\"\nvip = \"{VIP6}\"\nport = 83\n\
         scheduler = \"rr\"\nlocal_addresses = [\"{LIP4}\"]\n{nat64}"
    );
    let addresses = appliance6(&lab);
    let daemon =
        lab.daemon_with_workers(&addresses.each_ref().map(String::as_str), services, WORKERS);
    let lan = port(&daemon.status(), "lan0").clone();
    assert_eq!(lan["ownership"], "steered", "{lan:#}");

    for (port, mode) in [(80, "nat"), (82, "fullnat"), (83, "nat64")] {
        let batch = lab.curl(&format!("http://[{VIP6}]:{port}/"), CONNECTIONS, 4, &[]);
        assert!(
            batch["ok"].as_u64() == Some(CONNECTIONS) && AppLab::answers(&batch).len() == 2,
            "{mode}: not every IPv6 connection succeeded with two workers: {batch:#}\n\
             status: {:#}\n{}\n{}",
            daemon.status(),
            daemon.dump(),
            lab.diagnostics()
        );
    }
    for (i, (port, mode)) in [(5300, "nat"), (5302, "fullnat")].into_iter().enumerate() {
        let (out, v) = lab.udp(VIP6, port, EXCHANGES, 42000 + 100 * i as u16);
        assert!(
            v["ok"] == EXCHANGES,
            "{mode}: {EXCHANGES} UDP exchanges over IPv6: {}\nstatus: {:#}\n{}",
            out.describe(),
            daemon.status(),
            daemon.dump()
        );
    }

    // FullNAT: each real server saw the local address, and a port per connection.
    for i in 1..=2 {
        let lines: Vec<String> = lab
            .log_lines(i, "http")
            .into_iter()
            .filter(|l| l.split(' ').nth(1) == Some(LIP6))
            .collect();
        let ports: std::collections::BTreeSet<&str> =
            lines.iter().filter_map(|l| l.split(' ').nth(2)).collect();
        assert!(
            !lines.is_empty() && ports.len() == lines.len(),
            "real server {i}: a local port per FullNAT connection: {lines:?}"
        );
    }

    let status = daemon.status();
    let (out, inn) = (
        event_count(&status, "redirected_out"),
        event_count(&status, "redirected_in"),
    );
    eprintln!("redirected_out {out} redirected_in {inn}");
    assert!(
        out > 0,
        "no packet landed off its owner: the test did not exercise redirects: {status:#}"
    );
    assert_eq!(
        out, inn,
        "every redirected packet reached its owner: {status:#}"
    );
    for reason in [
        "ipv6_no_service",
        "tcp_no_session",
        "laddr_exhausted",
        "redirect_ring_full",
    ] {
        assert_eq!(drop_count(&status, reason), 0, "{reason}: {status:#}");
    }
}

#[test]
fn ipv6_real_servers_are_probed_up_with_two_workers() {
    require_root();
    let mut lab = AppLab::new(3);
    ipv6_lab(&lab);
    lab.start_servers(&["[::]:8080".to_string()], &[]);
    let services = format!(
        "[health]\ncheck = \"tcp\"\ninterval_ms = 200\ntimeout_ms = 150\nfall = 2\nrise = 1\nretry_ms = 200\n\n{}",
        service6(&lab, "tcp", 80, 8080, "nat", "")
    );
    let addresses = appliance6(&lab);
    let daemon =
        lab.daemon_with_workers(&addresses.each_ref().map(String::as_str), services, WORKERS);
    let service = format!("[{VIP6}]:80/tcp");
    let servers: Vec<String> = (1..=3).map(rs_ip6).collect();
    let up = wait_for(Duration::from_secs(5), Duration::from_millis(50), || {
        let h = daemon.health();
        servers
            .iter()
            .all(|ip| health_target(&h, &service, ip)["last_outcome"] == "ok")
            .then_some(h)
    });
    assert!(
        up.is_some(),
        "every IPv6 real server probed up with two workers: {:#}\nstatus: {:#}\n{}",
        daemon.health(),
        daemon.status(),
        daemon.dump()
    );
    let batch = lab.curl(&format!("http://[{VIP6}]/"), 30, 3, &[]);
    assert!(
        batch["ok"] == 30 && AppLab::answers(&batch).len() == 3,
        "30 connections over the three servers: {batch:#}\n{}",
        daemon.dump()
    );
    let status = daemon.status();
    assert!(event_count(&status, "neighbour_shared") > 0, "{status:#}");
}
