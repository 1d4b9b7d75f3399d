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
//! ICMPv6 errors about sessions with two workers (as `e2e_ipv6_local.rs`'s
//! `icmp_errors_cross_nat_fullnat_and_nat64_both_ways` with one): the kernel hashes
//! an ICMPv6 error by its addresses only, so the errors about a service's sessions
//! all land on one worker, about half of them off their session's; each reaches its
//! owner and is translated there.
//!
//! And health checks of three IPv6 real servers with two workers: worker 0 sends the
//! probes from its IPv6 neighbour table, and every server is probed up although the
//! fanout puts each server's Neighbor Advertisements on one queue only (the other
//! worker shares what it learns).
//!
//! Run: `cargo test --release --test integration e2e_ipv6_multi_worker::` (as root).

use crate::common::*;
use crate::e2e_ipv6_local::{
    appliance6, ipv6_lab, rs_ip6, service6, CLIENT_IP6, LATE_REPLIER, LIP4, LIP6, VIP6,
};
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

/// ICMPv6 errors about IPv6 sessions cross two workers, both ways, NAT and FullNAT,
/// between real kernels. From the real server's side: 8 UDP datagrams from the
/// client, each from a socket of its own, to a port the real server does not listen
/// on; each socket must hear the real server's port unreachable, translated, as
/// ECONNREFUSED. From the client's side: 4 real server sockets per mode answer late
/// to client sockets already closed, and each must hear the client's port
/// unreachable (NAT: from the client; FullNAT: from the local address). The errors
/// of one kind share their addresses, so the kernel's fanout puts them all on one
/// queue, and the sessions they are about live on both workers (by their client
/// ports): without the redirect, about half are dropped (`icmp_error_no_session`)
/// and their sockets time out. The kernels' own ICMPv6 rate limit (a burst of 6 per
/// destination) is turned off in the namespaces. About 3 s.
#[test]
fn icmpv6_errors_reach_the_worker_of_their_session() {
    require_root();
    const ERRORS: u32 = 8;
    const LATE: u16 = 4;
    let lab = AppLab::new(1);
    ipv6_lab(&lab);
    for ns in [lab.bed.client_ns(), lab.bed.rs_ns(1)] {
        lab.bed
            .exec(
                ns,
                &["sysctl", "-q", "-w", "net.ipv6.icmp.ratelimit=0"],
                Duration::from_secs(10),
            )
            .expect_success("no ICMPv6 rate limit");
    }
    let lip6 = format!("local_addresses = [\"{LIP6}\"]\n");
    // A closed port (5399), and the late replier's (5380 to 5383 and 5390 to 5393).
    let mut services = vec![
        service6(&lab, "udp", 5301, 5399, "nat", ""),
        service6(&lab, "udp", 5302, 5399, "fullnat", &lip6),
    ];
    for i in 0..LATE {
        services.push(service6(&lab, "udp", 5320 + i, 5390 + i, "nat", ""));
        services.push(service6(&lab, "udp", 5330 + i, 5380 + i, "fullnat", &lip6));
    }
    let addresses = appliance6(&lab);
    let daemon = lab.daemon_with_workers(
        &addresses.each_ref().map(String::as_str),
        services.join("\n"),
        WORKERS,
    );

    for (i, (port, what)) in [(5301, "nat"), (5302, "fullnat")].into_iter().enumerate() {
        let (out, v) = lab.udp(VIP6, port, ERRORS, 43000 + 100 * i as u16);
        let refused = v["failures"].as_array().map_or(0, |f| {
            f.iter()
                .filter(|e| e.to_string().contains("Connection refused"))
                .count()
        });
        assert_eq!(
            refused,
            ERRORS as usize,
            "{what}: every client socket to a closed port is refused: {}\nstatus: {:#}\n{}",
            out.describe(),
            daemon.status(),
            daemon.dump()
        );
    }

    let ports: Vec<String> = (0..LATE)
        .flat_map(|i| [format!("6:{}", 5390 + i), format!("6:{}", 5380 + i)])
        .collect();
    let mut argv = vec![PYTHON, "-c", LATE_REPLIER];
    argv.extend(ports.iter().map(String::as_str));
    let mut replier = BackgroundProcess::spawn(Some(lab.bed.rs_ns(1)), &argv);
    replier.wait_for_stderr(Duration::from_secs(10), "ready");
    let send_and_close = format!(
        "import socket\nfor port in [*range(5320, {}), *range(5330, {})]:\n    \
         s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)\n    \
         s.sendto(b'early', ('{VIP6}', port))\n    s.close()\n",
        5320 + LATE,
        5330 + LATE
    );
    lab.bed
        .exec(
            lab.bed.client_ns(),
            &[PYTHON, "-c", &send_and_close],
            Duration::from_secs(10),
        )
        .expect_success("client datagrams");
    replier.wait_exit(Duration::from_secs(10));
    let mut lines: Vec<String> = replier.stdout_text().lines().map(String::from).collect();
    lines.sort();
    let mut expected: Vec<String> = (0..LATE)
        .flat_map(|i| {
            [
                format!("{} {LIP6} refused", 5380 + i),
                format!("{} {CLIENT_IP6} refused", 5390 + i),
            ]
        })
        .collect();
    expected.sort();
    assert_eq!(
        lines,
        expected,
        "every real server socket hears the client's port unreachable: {}\nstatus: {:#}\n{}",
        replier.stderr_text(),
        daemon.status(),
        daemon.dump()
    );
    let status = daemon.status();
    assert_eq!(
        drop_count(&status, "icmp_error_no_session"),
        0,
        "{status:#}"
    );
    assert_eq!(
        event_count(&status, "redirected_out"),
        event_count(&status, "redirected_in"),
        "{status:#}"
    );
}
