//! Tier 3, end to end with real kernels: a network-namespace test bed
//! (scripts/testbed.sh), Sluice attached to the appliance's veth with net_af_packet,
//! and the client namespace's own kernel resolving and pinging 198.18.0.1.
//!
//! Run: `cargo test --release --test integration e2e_netns::` (as root).

use crate::common::*;
use std::time::Duration;

/// Which arping is installed: iputils (`-I IFACE`, "Unicast reply from ...") or
/// Thomas Habets' (`-i IFACE`, "... bytes from MAC (IP): index=..."). Debian packages
/// them as `iputils-arping` and `arping`, which conflict; scripts/setup.sh installs
/// the latter.
fn arping_iface_flag() -> &'static str {
    let help = std::process::Command::new("arping")
        .arg("--help")
        .output()
        .expect("arping not found (run scripts/setup.sh)");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&help.stdout),
        String::from_utf8_lossy(&help.stderr)
    );
    if text.contains("Habets") {
        "-i"
    } else {
        "-I"
    }
}

/// Number of arping reply lines that name `mac` (either arping's format).
fn arping_replies_from(output: &str, mac: &str) -> (usize, Vec<String>) {
    let mac = mac.to_ascii_lowercase();
    let mut from_us = 0;
    let mut others = Vec::new();
    for line in output.lines() {
        let l = line.to_ascii_lowercase();
        let is_reply = l.contains("reply from") || l.contains("bytes from");
        if !is_reply {
            continue;
        }
        if l.contains(&mac) {
            from_us += 1;
        } else {
            others.push(line.to_string());
        }
    }
    (from_us, others)
}

#[test]
fn client_kernel_resolves_and_pings_the_appliance() {
    require_root();
    let bed = Testbed::up(0);
    let appliance_ip = bed.appliance_ip().to_string();
    let mut cfg = DaemonConfig::new(vec![PortSpec::vdev(
        "lan0",
        &format!("net_af_packet0,iface={}", bed.lb_if()),
        &[&format!("{appliance_ip}/24")],
    )])
    .in_netns(bed.lb_ns());
    cfg.args = vec!["--stats-interval".into(), "1000".into()];
    let mut daemon = Daemon::start(cfg);

    let status = daemon.status();
    let port_mac = port(&status, "lan0")["mac"]
        .as_str()
        .expect("ports[lan0].mac is a string")
        .to_ascii_lowercase();
    assert_eq!(
        port_mac,
        bed.lb_mac().to_ascii_lowercase(),
        "without a mac override the af_packet port uses the veth's MAC"
    );
    let before_arp = event_count(&status, "arp_replied");
    let before_icmp = event_count(&status, "icmp_echo_replied");

    // A clean neighbour cache: the client must really resolve 198.18.0.1 via ARP.
    let client = bed.client_ns().to_string();
    bed.exec(
        &client,
        &["ip", "neigh", "flush", "all"],
        Duration::from_secs(10),
    )
    .expect_success("ip neigh flush");

    // ping: 5 requests, all answered.
    let ping = bed.exec(
        &client,
        &[
            "ping",
            "-n",
            "-c",
            "5",
            "-W",
            "1",
            "-i",
            "0.2",
            &appliance_ip,
        ],
        Duration::from_secs(30),
    );
    assert!(
        ping.success() && ping.stdout.contains(" 0% packet loss"),
        "ping from the client lost packets: {}\n{}",
        ping.describe(),
        daemon.dump()
    );
    assert!(ping.stdout.contains("5 received"), "ping: {}", ping.stdout);

    // The kernel learned the appliance's MAC through Sluice's ARP reply.
    let neigh = bed
        .exec(
            &client,
            &["ip", "neigh", "show", &appliance_ip],
            Duration::from_secs(10),
        )
        .expect_success("ip neigh show");
    let lladdr = neigh
        .stdout
        .split_whitespace()
        .skip_while(|w| *w != "lladdr")
        .nth(1)
        .map(str::to_ascii_lowercase);
    assert_eq!(
        lladdr.as_deref(),
        Some(port_mac.as_str()),
        "client neighbour entry for {appliance_ip}: {:?}",
        neigh.stdout
    );

    // arping: ARP requests straight from user space, answered by Sluice.
    let flag = arping_iface_flag();
    let arping = bed.exec(
        &client,
        &[
            "arping",
            flag,
            bed.client_if(),
            "-c",
            "3",
            "-w",
            "5",
            &appliance_ip,
        ],
        Duration::from_secs(20),
    );
    let (from_us, others) =
        arping_replies_from(&format!("{}\n{}", arping.stdout, arping.stderr), &port_mac);
    assert!(
        arping.success() && from_us >= 1 && others.is_empty(),
        "arping got {from_us} replies from {port_mac}, others {others:?}: {}",
        arping.describe()
    );

    // The daemon saw it all.
    let status = daemon.status();
    let arp_replied = event_count(&status, "arp_replied") - before_arp;
    let icmp_replied = event_count(&status, "icmp_echo_replied") - before_icmp;
    // At least the kernel's own resolution before the ping, plus every arping reply.
    assert!(
        arp_replied > from_us as u64,
        "arp_replied grew by {arp_replied}: {status:#}"
    );
    assert!(
        icmp_replied >= 5,
        "icmp_echo_replied grew by {icmp_replied}: {status:#}"
    );
    let rx = port_counter(&status, "lan0", "rx_packets");
    let tx = port_counter(&status, "lan0", "tx_packets");
    assert!(
        rx >= arp_replied + icmp_replied,
        "port rx_packets {rx} < replies: {status:#}"
    );
    assert!(
        tx >= arp_replied + icmp_replied,
        "port tx_packets {tx} < replies: {status:#}"
    );
    for field in ["tx_errors", "rx_nombuf"] {
        assert_eq!(
            port_counter(&status, "lan0", field),
            0,
            "ports[lan0].{field}: {status:#}"
        );
    }
    assert_eq!(drop_count(&status, "tx_full"), 0, "{status:#}");
    assert!(
        event_count(&status, "neighbour_learned") >= 1,
        "client not learned: {status:#}"
    );

    // The human-readable status names the port, its MAC and its address.
    let text = daemon.ctl(&["status"]).expect_success("sluicectl status");
    let port_line = text
        .stdout
        .lines()
        .find(|l| l.split_whitespace().any(|w| w == "lan0"));
    assert!(
        port_line.is_some_and(
            |l| l.to_ascii_lowercase().contains(&port_mac) && l.contains(&appliance_ip)
        ),
        "text status has no line with lan0, {port_mac} and {appliance_ip}:\n{}",
        text.stdout
    );

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
    assert!(!daemon.socket().exists(), "control socket left behind");
}
