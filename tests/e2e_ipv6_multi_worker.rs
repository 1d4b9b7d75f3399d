//! Tier 3, IPv6 NAT and FullNAT with two workers: the IPv6 bed of
//! `tests/e2e_ipv6_local.rs` (a client and two real servers whose kernels speak IPv6,
//! real servers running `tests/tools/e2e_apps.py serve`), and Sluice with two workers
//! on net_af_packet with `qpairs=2`, sharing CPU 1 as in `tests/e2e_multi_worker.rs`.
//! The kernel's packet-fanout hash spreads the frames over the two queues (not
//! Toeplitz: the port is steered), so about half of the real servers' replies land on
//! the worker that does not own their session, and the real servers' Neighbor
//! Advertisements on one worker only.
//!
//! - a NAT and a FullNAT TCP service: 60 new connections each (curl, 4 at a time,
//!   each bounded to 5 s), all answered, by both real servers;
//! - the same for UDP, 8 exchanges each;
//! - the real servers saw the FullNAT local address with a port of its own for every
//!   connection (two workers never pick the same pair towards one server);
//! - the workers redirected packets to each other, received every one, and dropped
//!   none as `ipv6_no_service`, `tcp_no_session` or `laddr_exhausted`.
//!
//! Run: `cargo test --release --test integration e2e_ipv6_multi_worker::` (as root).

use crate::common::*;
use crate::e2e_ipv6_local::{appliance6, ipv6_lab, service6, LIP6, VIP6};

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
    let addresses = appliance6(&lab);
    let daemon = lab.daemon_with_workers(
        &addresses.each_ref().map(String::as_str),
        services,
        WORKERS,
    );
    let lan = port(&daemon.status(), "lan0").clone();
    assert_eq!(lan["ownership"], "steered", "{lan:#}");

    for (port, mode) in [(80, "nat"), (82, "fullnat")] {
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
    assert_eq!(out, inn, "every redirected packet reached its owner: {status:#}");
    for reason in [
        "ipv6_no_service",
        "tcp_no_session",
        "laddr_exhausted",
        "redirect_ring_full",
    ] {
        assert_eq!(drop_count(&status, reason), 0, "{reason}: {status:#}");
    }
}
