//! Tier 3, end to end with a real kernel over IPv6: the test bed of
//! scripts/testbed.sh (IPv6 off everywhere), IPv6 turned on in the client namespace
//! only, and Sluice, attached with net_af_packet and given the address
//! 2001:db8:18::1/64 besides its IPv4 one, resolved by the client's kernel through
//! Neighbor Discovery and pinged with `ping -6`. Documentation addresses
//! (2001:db8::/32), inside the bed's namespaces only.
//!
//! Run: `cargo test --release --test integration e2e_ipv6_local::` (as root).

use crate::common::*;
use std::time::Duration;

const APPLIANCE_IP6: &str = "2001:db8:18::1";
pub(crate) const CLIENT_IP6: &str = "2001:db8:18::2";
/// On the appliance's /64, but no one's.
const NOBODY_IP6: &str = "2001:db8:18::99";

#[test]
fn client_kernel_resolves_and_pings_the_appliance_over_ipv6() {
    require_root();
    let bed = Testbed::up(0);
    let appliance_ip = bed.appliance_ip().to_string();
    let mut cfg = DaemonConfig::new(vec![PortSpec::vdev(
        "lan0",
        &format!("net_af_packet0,iface={}", bed.lb_if()),
        &[
            &format!("{appliance_ip}/24"),
            &format!("{APPLIANCE_IP6}/64"),
        ],
    )])
    .in_netns(bed.lb_ns());
    cfg.args = vec!["--stats-interval".into(), "1000".into()];
    let daemon = Daemon::start(cfg);

    let status = daemon.status();
    let lan0 = port(&status, "lan0");
    let port_mac = lan0["mac"]
        .as_str()
        .expect("ports[lan0].mac is a string")
        .to_ascii_lowercase();
    let addresses = lan0["addresses"].to_string();
    assert!(
        addresses.contains(&format!("{APPLIANCE_IP6}/64")),
        "status lists the IPv6 address: {addresses}"
    );
    let before = |name: &str| event_count(&status, name);
    let (nd0, echo0, learned0) = (
        before("nd_answered"),
        before("icmpv6_echo_replied"),
        before("neighbour6_learned"),
    );

    // IPv6 on in the client namespace, on its interface to the appliance only; no
    // duplicate address detection for the client's own address (Sluice would rightly
    // not answer it, but the address would stay tentative for a second).
    let client = bed.client_ns().to_string();
    let client_if = bed.client_if().to_string();
    let ten = Duration::from_secs(10);
    for sysctl in [
        "net.ipv6.conf.all.disable_ipv6=0".to_string(),
        format!("net.ipv6.conf.{client_if}.disable_ipv6=0"),
    ] {
        bed.exec(&client, &["sysctl", "-qw", &sysctl], ten)
            .expect_success("sysctl");
    }
    bed.exec(
        &client,
        &[
            "ip",
            "-6",
            "addr",
            "add",
            &format!("{CLIENT_IP6}/64"),
            "dev",
            &client_if,
            "nodad",
        ],
        ten,
    )
    .expect_success("ip -6 addr add");
    bed.exec(&client, &["ip", "-6", "neigh", "flush", "all"], ten)
        .expect_success("ip -6 neigh flush");

    // ping -6: 5 requests, all answered; the first needs Neighbor Discovery.
    let ping = bed.exec(
        &client,
        &[
            "ping",
            "-6",
            "-n",
            "-c",
            "5",
            "-W",
            "1",
            "-i",
            "0.2",
            APPLIANCE_IP6,
        ],
        Duration::from_secs(30),
    );
    assert!(
        ping.success() && ping.stdout.contains(" 0% packet loss"),
        "ping -6 from the client lost packets: {}\n{}",
        ping.describe(),
        daemon.dump()
    );
    assert!(ping.stdout.contains("5 received"), "ping: {}", ping.stdout);

    // The kernel's neighbour cache holds the appliance's MAC, from Sluice's NA.
    let neigh = bed
        .exec(
            &client,
            &[
                "ip",
                "-6",
                "neigh",
                "show",
                APPLIANCE_IP6,
                "dev",
                &client_if,
            ],
            ten,
        )
        .expect_success("ip -6 neigh show");
    let lladdr = neigh
        .stdout
        .split_whitespace()
        .skip_while(|w| *w != "lladdr")
        .nth(1)
        .map(str::to_ascii_lowercase);
    assert_eq!(
        lladdr.as_deref(),
        Some(port_mac.as_str()),
        "client neighbour entry for {APPLIANCE_IP6}: {:?}",
        neigh.stdout
    );

    let status = daemon.status();
    let echoed = event_count(&status, "icmpv6_echo_replied") - echo0;
    assert_eq!(echoed, 5, "one reply per request: {status:#}");
    let answered = event_count(&status, "nd_answered");
    assert!(
        answered > nd0,
        "the client's solicitation was answered: {status:#}"
    );
    let learned = event_count(&status, "neighbour6_learned") - learned0;
    assert_eq!(
        learned, 1,
        "the client learned once, from its solicitation: {status:#}"
    );
    assert_eq!(
        event_count(&status, "nd_dad_defended"),
        0,
        "no one probed for the appliance's address: {status:#}"
    );

    // An address on the link that no one has: the kernel's solicitations for it go
    // to a solicited-node group Sluice does not listen to and are dropped as such,
    // unanswered (not as `not_local`, which is for unicast to others).
    let (not_joined0, not_local0) = (
        drop_count(&status, "ipv6_group_not_joined"),
        drop_count(&status, "not_local"),
    );
    let lost = bed.exec(
        &client,
        &["ping", "-6", "-n", "-c", "1", "-W", "2", NOBODY_IP6],
        Duration::from_secs(30),
    );
    assert!(
        !lost.success(),
        "no one answers {NOBODY_IP6}: {}",
        lost.describe()
    );
    let status = daemon.status();
    assert_eq!(
        event_count(&status, "nd_answered"),
        answered,
        "nothing answered for {NOBODY_IP6}: {status:#}"
    );
    assert!(
        drop_count(&status, "ipv6_group_not_joined") > not_joined0,
        "the solicitations for {NOBODY_IP6} were counted: {status:#}"
    );
    assert_eq!(drop_count(&status, "not_local"), not_local0, "{status:#}");

    daemon.stop_clean();
}

/// The IPv6 VIP, on the client's link: the client's kernel resolves it through
/// Neighbor Discovery, which Sluice answers for its VIPs.
pub(crate) const VIP6: &str = "2001:db8:18::100";
/// The appliance's address on the real servers' link, their default gateway.
pub(crate) const GATEWAY6: &str = "2001:db8:1a::1";

pub(crate) fn rs_ip6(i: u32) -> String {
    format!("2001:db8:1a::{}", 10 + i)
}

/// IPv6 on the client and on every real server, each server set up for all the modes:
/// NAT: replies to the client go back through Sluice, the default gateway. DR and
/// TUN: the server holds the VIP on lo (Linux answers Neighbor Discovery only for
/// addresses of the interface asked), and its replies, from the VIP, reach the
/// client's link directly (a table of their own).
pub(crate) fn ipv6_lab(lab: &AppLab) {
    let ten = Duration::from_secs(10);
    let (client, client_if) = (lab.bed.client_ns(), lab.bed.client_if());
    lab.bed
        .ipv6_on(client, client_if, &format!("{CLIENT_IP6}/64"));
    for i in 1..=lab.bed.rs_count() {
        let (ns, ifname) = (lab.bed.rs_ns(i).to_string(), lab.bed.rs_if(i).to_string());
        lab.bed.ipv6_on(&ns, &ifname, &format!("{}/64", rs_ip6(i)));
        let vip = format!("{VIP6}/128");
        let direct = [
            "route",
            "add",
            "2001:db8:18::/64",
            "dev",
            &ifname,
            "table",
            "100",
        ];
        for cmd in [
            &["route", "add", "default", "via", GATEWAY6][..],
            &["addr", "add", &vip, "dev", "lo"],
            &["rule", "add", "from", VIP6, "table", "100"],
            &direct,
        ] {
            let argv: Vec<&str> = ["ip", "-6"].iter().chain(cmd).copied().collect();
            lab.bed
                .exec(&ns, &argv, ten)
                .expect_success("rs ipv6 setup");
        }
    }
}

/// `[[services]]` TOML for `proto` on the IPv6 VIP's `port`, to every real server of
/// `lab` on `rport` in `mode`, with `extra` lines for the service.
pub(crate) fn service6(
    lab: &AppLab,
    proto: &str,
    port: u16,
    rport: u16,
    mode: &str,
    extra: &str,
) -> String {
    let servers: String = (1..=lab.bed.rs_count())
        .map(|i| {
            format!(
                "  [[services.real_servers]]\n  ip = \"{}\"\n  port = {rport}\n  mode = \"{mode}\"\n",
                rs_ip6(i)
            )
        })
        .collect();
    format!(
        "[[services]]\nproto = \"{proto}\"\nvip = \"{VIP6}\"\nport = {port}\nscheduler = \"rr\"\n{extra}{servers}"
    )
}

/// The addresses of the appliance's port in the IPv6 labs: IPv4, the client's link,
/// the real servers' link.
pub(crate) fn appliance6(lab: &AppLab) -> [String; 3] {
    [
        format!("{}/24", lab.bed.appliance_ip()),
        format!("{APPLIANCE_IP6}/64"),
        format!("{GATEWAY6}/64"),
    ]
}

#[test]
fn curl_over_ipv6_through_nat_and_dr_services() {
    require_root();
    let mut lab = AppLab::new(2);
    ipv6_lab(&lab);
    lab.start_servers(
        &["[::]:8080".to_string(), "[::]:81".to_string()],
        // DR: bound to the VIP, so that the replies come from it.
        &["[::]:5353".to_string(), format!("[{VIP6}]:5301")],
    );
    let services = [
        service6(&lab, "tcp", 80, 8080, "nat", ""),
        service6(&lab, "tcp", 81, 81, "dr", ""),
        service6(&lab, "udp", 5300, 5353, "nat", ""),
        service6(&lab, "udp", 5301, 5301, "dr", ""),
    ]
    .join("\n");
    let addresses = appliance6(&lab);
    let daemon = lab.daemon(&addresses.each_ref().map(String::as_str), services);
    let listing = daemon.ctl(&["-Ln"]);
    assert!(
        listing.stdout.contains(&format!("TCP  [{VIP6}]:80 rr"))
            && listing
                .stdout
                .contains(&format!("  -> [{}]:8080", rs_ip6(1))),
        "ipvsadm's layout with bracketed IPv6 addresses: {}",
        listing.stdout
    );

    // A capture filtered by the IPv6 VIP and port, running through both services.
    let capture_file = lab.dir.path().join("vip6.pcapng");
    let vip80 = format!("[{VIP6}]:80");
    let mut capture = daemon.start_capture(
        &capture_file,
        &["--proto", "tcp", "--vip", &vip80, "--duration", "60"],
    );
    for (port, mode) in [(80, "nat"), (81, "dr")] {
        let url = format!("http://[{VIP6}]:{port}/");
        let batch = lab.curl(&url, 20, 4, &[]);
        let bodies = AppLab::answers(&batch);
        assert!(
            batch["ok"] == 20 && bodies.len() == 2,
            "{mode}: 20 requests over IPv6, both real servers answering: {batch:#}\n{}\n{}",
            lab.diagnostics(),
            daemon.dump()
        );
    }
    for (port, mode) in [(5300, "nat"), (5301, "dr")] {
        let (out, v) = lab.udp(VIP6, port, 4, 0);
        assert!(
            v["ok"] == 4,
            "{mode}: 4 UDP exchanges over IPv6: {}\n{}",
            out.describe(),
            daemon.dump()
        );
    }
    let stopped = daemon.ctl(&["capture", "--stop"]);
    assert!(stopped.success(), "{}", stopped.describe());
    assert!(capture.wait_exit(Duration::from_secs(5)).is_some());
    // tshark reads it: every frame has the VIP's port 80 on one side (none of the DR
    // service's port 81, no UDP), the 20 NAT clients' SYNs received and their 20
    // SYN-ACKs sent from the VIP.
    let out = run_bounded(
        std::process::Command::new("tshark").args([
            "-n",
            "-r",
            &capture_file.to_string_lossy(),
            "-T",
            "fields",
            "-e",
            "ipv6.src",
            "-e",
            "tcp.srcport",
            "-e",
            "ipv6.dst",
            "-e",
            "tcp.dstport",
            "-e",
            "tcp.flags.str",
        ]),
        Duration::from_secs(30),
    );
    assert!(out.success(), "{}", out.describe());
    let frames: Vec<Vec<&str>> = out
        .stdout
        .lines()
        .map(|l| l.split('\t').collect())
        .collect();
    let at_vip = |f: &Vec<&str>| (f[0] == VIP6 && f[1] == "80") || (f[2] == VIP6 && f[3] == "80");
    // tshark's flag strings, 12 positions: SYN alone, and SYN with ACK.
    let syns = frames
        .iter()
        .filter(|f| f[2] == VIP6 && f[4] == "··········S·")
        .count();
    let syn_acks = frames
        .iter()
        .filter(|f| f[0] == VIP6 && f[4] == "·······A··S·")
        .count();
    assert!(
        frames.iter().all(|f| f.len() == 5 && at_vip(f)) && syns >= 20 && syn_acks >= 20,
        "{syns} SYNs, {syn_acks} SYN-ACKs in {} frames:\n{}",
        frames.len(),
        out.stdout
    );
    // The real servers saw the client's own address (NAT and DR keep it).
    let lines: Vec<String> = (1..=2).flat_map(|i| lab.log_lines(i, "http")).collect();
    assert!(
        lines.len() >= 40
            && lines
                .iter()
                .all(|l| l.split(' ').nth(1) == Some(CLIENT_IP6)),
        "client address at the real servers: {lines:?}"
    );
    let status = daemon.status();
    assert!(
        event_count(&status, "nd_answered") >= 1,
        "the client resolved the VIP through Sluice: {status:#}"
    );
}

#[test]
fn curl_over_ipv6_through_a_tun_service_with_packet_too_big() {
    require_root();
    let mut lab = AppLab::new(2);
    ipv6_lab(&lab);
    lab.start_decapsulators(true);
    lab.start_servers(&["[::]:80".to_string()], &[]);
    let addresses = appliance6(&lab);
    let daemon = lab.daemon(
        &addresses.each_ref().map(String::as_str),
        service6(&lab, "tcp", 80, 80, "tun", ""),
    );
    let url = format!("http://[{VIP6}]/");
    let batch = lab.curl(&url, 20, 4, &[]);
    let bodies = AppLab::answers(&batch);
    assert!(
        batch["ok"] == 20 && bodies.len() == 2,
        "tun: 20 requests over IPv6, both real servers answering: {batch:#}\n{}\n{}",
        lab.diagnostics(),
        daemon.dump()
    );
    // Every packet reached the servers inside an outer IPv6 header from the
    // appliance's address on their link, the client's packet whole inside.
    for i in 1..=2 {
        let log = read_lines(&lab.dir.path().join(format!("rs{i}.ip6ip6.log")));
        assert!(
            log.len() >= 4 * 5,
            "rs{i} decapsulated {} packets",
            log.len()
        );
        for l in &log {
            let w: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(
                w.get(1..4),
                Some(&[GATEWAY6, CLIENT_IP6, VIP6][..]),
                "rs{i} tunnel log line {l:?}"
            );
        }
        let http = lab.log_lines(i, "http");
        assert!(
            !http.is_empty() && http.iter().all(|l| l.split(' ').nth(1) == Some(CLIENT_IP6)),
            "rs{i} saw the client's address: {http:?}"
        );
    }

    // Path MTU: a 20000-byte upload in 1500-byte packets, 1540 once encapsulated:
    // Sluice answers Packet Too Big (MTU 1460), the client's kernel lowers its path
    // MTU to the VIP and the upload completes.
    let too_big0 = drop_count(&daemon.status(), "too_big");
    let batch = lab.curl(&url, 1, 1, &["--post-bytes", "20000"]);
    let body = AppLab::answers(&batch)
        .into_keys()
        .next()
        .unwrap_or_default();
    assert!(
        batch["ok"] == 1 && body.ends_with(" 20000"),
        "the upload through the tunnel: {batch:#}\n{}",
        daemon.dump()
    );
    let too_big = drop_count(&daemon.status(), "too_big") - too_big0;
    assert!(too_big >= 1, "no packet was too big: {}", daemon.dump());
    let route = lab
        .bed
        .exec(
            lab.bed.client_ns(),
            &["ip", "-6", "route", "get", VIP6],
            Duration::from_secs(10),
        )
        .expect_success("ip -6 route get");
    assert!(
        route.stdout.contains("mtu 1460"),
        "the client learned the tunnel's MTU: {}",
        route.stdout
    );
}

/// An IPv6 FullNAT local address, on the real servers' link.
pub(crate) const LIP6: &str = "2001:db8:1a::50";

#[test]
fn curl_and_udp_over_ipv6_through_fullnat() {
    require_root();
    let mut lab = AppLab::new(2);
    ipv6_lab(&lab);
    lab.start_servers(&["[::]:8080".to_string()], &["[::]:5353".to_string()]);
    let addresses = appliance6(&lab);
    let laddr = format!("local_addresses = [\"{LIP6}\"]\n");
    let services = [
        service6(&lab, "tcp", 80, 8080, "fullnat", &laddr),
        service6(&lab, "udp", 5300, 5353, "fullnat", &laddr),
    ]
    .join("\n");
    let daemon = lab.daemon(&addresses.each_ref().map(String::as_str), services);
    let batch = lab.curl(&format!("http://[{VIP6}]/"), 20, 4, &[]);
    let bodies = AppLab::answers(&batch);
    assert!(
        batch["ok"] == 20 && bodies.len() == 2,
        "fullnat: 20 requests over IPv6, both real servers answering: {batch:#}\n{}\n{}",
        lab.diagnostics(),
        daemon.dump()
    );
    let (out, v) = lab.udp(VIP6, 5300, 4, 0);
    assert!(
        v["ok"] == 4,
        "fullnat: 4 UDP exchanges over IPv6: {}\n{}",
        out.describe(),
        daemon.dump()
    );
    // The real servers saw the local address only, each connection from its own port.
    for kind in ["http", "udp"] {
        let lines: Vec<String> = (1..=2).flat_map(|i| lab.log_lines(i, kind)).collect();
        let ports: std::collections::BTreeSet<&str> =
            lines.iter().filter_map(|l| l.split(' ').nth(2)).collect();
        assert!(
            lines.len() >= 4
                && lines.iter().all(|l| l.split(' ').nth(1) == Some(LIP6))
                && ports.len() == lines.len(),
            "{kind}: the real servers saw {LIP6}, a port per connection: {lines:?}"
        );
    }
}

/// `e2e_fullnat`'s `a_frag_needed_about_a_udp_reply_does_not_shrink_the_servers_path`
/// over IPv6: a Packet Too Big (MTU 1280, the least IPv6 has) from the client's side
/// about a UDP reply would make the real server's kernel fragment every larger UDP
/// reply to the local address; it must be dropped (`icmp_too_big_about_udp`), the
/// server's route to the local address carry no path MTU, and the next 1400-byte
/// echo arrive.
#[test]
fn a_packet_too_big_about_a_udp_reply_does_not_shrink_the_servers_path() {
    check_a_packet_too_big_about_a_udp_reply(false);
}

/// The same through NAT64: the IPv4 real server would hear a frag-needed (MTU 1260)
/// about its reply to the IPv4 local address.
#[test]
fn a_packet_too_big_about_a_nat64_udp_reply_does_not_shrink_the_servers_path() {
    check_a_packet_too_big_about_a_udp_reply(true);
}

fn check_a_packet_too_big_about_a_udp_reply(nat64: bool) {
    require_root();
    let mut lab = AppLab::new(1);
    let (daemon, vport, lip) = if nat64 {
        // IPv6 on the client only: the real server keeps the test bed's IPv4 alone.
        let (client, client_if) = (lab.bed.client_ns(), lab.bed.client_if());
        lab.bed
            .ipv6_on(client, client_if, &format!("{CLIENT_IP6}/64"));
        lab.start_servers(&[], &["0.0.0.0:5353".to_string()]);
        let service = format!(
            "[[services]]\nproto = \"udp\"\nvip = \"{VIP6}\"\nport = 5353\nscheduler = \"rr\"\n\
             local_addresses = [\"{LIP4}\"]\n  [[services.real_servers]]\n  ip = \"{}\"\n  \
             port = 5353\n  mode = \"fullnat\"\n",
            lab.bed.rs_ip(1)
        );
        let addresses = [
            format!("{}/24", lab.bed.appliance_ip()),
            format!("{APPLIANCE_IP6}/64"),
        ];
        let daemon = lab.daemon(&addresses.each_ref().map(String::as_str), service);
        (daemon, 5353, LIP4)
    } else {
        ipv6_lab(&lab);
        lab.start_servers(&[], &["[::]:5353".to_string()]);
        let addresses = appliance6(&lab);
        let laddr = format!("local_addresses = [\"{LIP6}\"]\n");
        let service = service6(&lab, "udp", 5300, 5353, "fullnat", &laddr);
        let daemon = lab.daemon(&addresses.each_ref().map(String::as_str), service);
        (daemon, 5300, LIP6)
    };
    lab.assert_too_big_about_udp_is_dropped(&daemon, (VIP6, vport), CLIENT_IP6, 1280, lip);
}

/// NAT64's IPv4 local address, on the real servers' (IPv4) link.
pub(crate) const LIP4: &str = "198.18.0.50";

#[test]
fn nat64_an_ipv6_client_downloads_1_mb_from_ipv4_only_real_servers() {
    require_root();
    let mut lab = AppLab::new(2);
    // IPv6 on the client only: the real servers keep the test bed's IPv4 alone.
    let (client, client_if) = (lab.bed.client_ns(), lab.bed.client_if());
    lab.bed
        .ipv6_on(client, client_if, &format!("{CLIENT_IP6}/64"));
    lab.start_servers(&["0.0.0.0:8080".to_string()], &["0.0.0.0:5353".to_string()]);
    let servers = |proto: &str, port: u16| {
        let rs: String = (1..=2)
            .map(|i| {
                format!(
                    "  [[services.real_servers]]\n  ip = \"{}\"\n  port = {port}\n  mode = \"fullnat\"\n",
                    lab.bed.rs_ip(i)
                )
            })
            .collect();
        format!(
            "[[services]]\nproto = \"{proto}\"\nvip = \"{VIP6}\"\nport = {port}\nscheduler = \"rr\"\n\
             local_addresses = [\"{LIP4}\"]\n{rs}"
        )
    };
    let services = [servers("tcp", 8080), servers("udp", 5353)].join("\n");
    let addresses = [
        format!("{}/24", lab.bed.appliance_ip()),
        format!("{APPLIANCE_IP6}/64"),
    ];
    let daemon = lab.daemon(&addresses.each_ref().map(String::as_str), services);

    let url = format!("http://[{VIP6}]:8080/");
    let batch = lab.curl(&url, 10, 2, &[]);
    assert!(
        batch["ok"] == 10 && AppLab::answers(&batch).len() == 2,
        "nat64: 10 requests, both real servers answering: {batch:#}\n{}\n{}",
        lab.diagnostics(),
        daemon.dump()
    );
    let (out, v) = lab.udp(VIP6, 5353, 4, 0);
    assert!(
        v["ok"] == 4,
        "nat64: 4 UDP exchanges: {}\n{}",
        out.describe(),
        daemon.dump()
    );
    // 1 MB, checked against the pattern's digest computed apart from Sluice.
    const MB: usize = 1 << 20;
    let script = format!(
        "python3 -c 'import hashlib; print(hashlib.sha256(bytes((i * 7) & 0xFF for i in range({MB}))).hexdigest())'; \
         curl -sS --globoff --noproxy '*' --max-time 20 http://[{VIP6}]:8080/bytes/{MB} | sha256sum | cut -d' ' -f1"
    );
    let out = lab.bed.exec(
        lab.bed.client_ns(),
        &["sh", "-c", &script],
        Duration::from_secs(40),
    );
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert!(
        lines.len() == 2 && lines[0].len() == 64 && lines[0] == lines[1],
        "nat64: the 1 MB download is not intact: {}\n{}",
        out.describe(),
        daemon.dump()
    );
    // The real servers saw the IPv4 local address only.
    for kind in ["http", "udp"] {
        let lines: Vec<String> = (1..=2).flat_map(|i| lab.log_lines(i, kind)).collect();
        assert!(
            !lines.is_empty() && lines.iter().all(|l| l.split(' ').nth(1) == Some(LIP4)),
            "{kind}: the real servers saw {LIP4}: {lines:?}"
        );
    }
}

const VIP4: &str = "198.18.0.200";

/// One line of `ipvsadm -Lnc`, written from ipvsadm 1.31's `print_conn`:
/// `printf("%-3s %-6s %-11s %-18s %-18s %s\n", protocol, expire_str, state, cname,
/// vname, dname)`, each name from `addrport_to_anyname` with `FMT_NUMERIC`:
/// `snprintf(buf, 60, "%s%s%s:%u", af == AF_INET ? "" : "[", inet_ntop(af, addr, ...),
/// af == AF_INET ? "" : "]", port)`.
fn ipvsadm_conn_line(
    expire: &str,
    state: &str,
    client: (&str, u16),
    virtual_service: (&str, u16),
    destination: (&str, u16),
) -> String {
    let name = |(addr, port): (&str, u16)| {
        let v6 = addr.contains(':');
        format!(
            "{}{addr}{}:{port}",
            if v6 { "[" } else { "" },
            if v6 { "]" } else { "" }
        )
    };
    format!(
        "{:<3} {:<6} {:<11} {:<18} {:<18} {}",
        "TCP",
        expire,
        state,
        name(client),
        name(virtual_service),
        name(destination)
    )
}

/// Dual stack: one real server behind an IPv4 VIP and an IPv6 VIP of the same port, a
/// kernel TCP connection through each, and `-Lnc` lists both sessions, each line as
/// ipvsadm prints it (the IPv6 addresses in brackets); `--json` and the paged listing
/// carry both too.
#[test]
fn lnc_lists_ipv4_and_ipv6_sessions_of_a_dual_stack_service() {
    require_root();
    let mut lab = AppLab::new(1);
    let ten = Duration::from_secs(10);
    lab.bed.configure("dr-vip", &[VIP4]);
    let (client, client_if) = (
        lab.bed.client_ns().to_string(),
        lab.bed.client_if().to_string(),
    );
    lab.bed
        .ipv6_on(&client, &client_if, &format!("{CLIENT_IP6}/64"));
    let (ns, ifname) = (lab.bed.rs_ns(1).to_string(), lab.bed.rs_if(1).to_string());
    lab.bed.ipv6_on(&ns, &ifname, &format!("{}/64", rs_ip6(1)));
    // DR over IPv6, as above: the VIP on lo, replies from it straight to the client.
    lab.bed.ipv6_dr_vip(&ns, &ifname, VIP6, "2001:db8:18::/64");
    // One listening socket for both families (an IPv6 socket takes IPv4 too).
    lab.start_servers(&["[::]:80".to_string()], &[]);
    let rs4 = lab.bed.rs_ip(1).to_string();
    let client4 = lab.bed.client_ip().to_string();
    let services = format!(
        "[[services]]\nproto = \"tcp\"\nvip = \"{VIP4}\"\nport = 80\nscheduler = \"rr\"\n\
         [[services.real_servers]]\nip = \"{rs4}\"\nport = 80\nmode = \"dr\"\n\
         [[services]]\nproto = \"tcp\"\nvip = \"{VIP6}\"\nport = 80\nscheduler = \"rr\"\n\
         [[services.real_servers]]\nip = \"{}\"\nport = 80\nmode = \"dr\"\n",
        rs_ip6(1)
    );
    let appliance = format!("{}/24", lab.bed.appliance_ip());
    let daemon = lab.daemon(
        &[
            &appliance,
            &format!("{APPLIANCE_IP6}/64"),
            &format!("{GATEWAY6}/64"),
        ],
        services,
    );
    lab.prewarm(&daemon, VIP4);

    // One connection each, from fixed client ports, at once.
    let (port4, port6) = (40004u16, 40006u16);
    let curl = |url: &str, port: u16| {
        let port = port.to_string();
        let args = [
            "curl",
            "-sS",
            "--globoff",
            "--noproxy",
            "*",
            "--max-time",
            "5",
            "--local-port",
            &port,
            url,
        ];
        let mut cmd = std::process::Command::new("ip");
        cmd.args(["netns", "exec", &client]).args(args);
        cmd
    };
    let url6 = format!("http://[{VIP6}]:80/");
    let url4 = format!("http://{VIP4}:80/");
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| run_bounded(&mut curl(&url4, port4), ten));
        let b = s.spawn(|| run_bounded(&mut curl(&url6, port6), ten));
        (a.join().unwrap(), b.join().unwrap())
    });
    for (out, url) in [(&a, &url4), (&b, &url6)] {
        assert!(
            out.success() && out.stdout.starts_with("rs1"),
            "{url}: {}\n{}\n{}",
            out.describe(),
            lab.diagnostics(),
            daemon.dump()
        );
    }

    let listing = daemon.ctl(&["-Lnc"]);
    assert!(listing.success(), "{}", listing.describe());
    let text = listing.stdout;
    eprintln!("{text}");
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("IPVS connection entries"), "{text}");
    assert_eq!(
        lines.next(),
        Some(
            format!(
                "pro expire {:<11} {:<18} {:<18} {}",
                "state", "source", "virtual", "destination"
            )
            .as_str()
        ),
        "{text}"
    );
    let entries: Vec<&str> = lines.collect();
    assert_eq!(entries.len(), 2, "one session per family:\n{text}");
    let fields = |line: &str| -> (String, String) {
        let f: Vec<&str> = line.split_whitespace().collect();
        (f[1].to_string(), f[2].to_string())
    };
    let find = |client_port: u16| {
        entries
            .iter()
            .find(|l| l.contains(&format!(":{client_port} ")))
            .unwrap_or_else(|| panic!("no session from port {client_port}:\n{text}"))
    };
    let (line4, line6) = (find(port4), find(port6));
    // The expiry and the state are the session's own: read from the line, checked
    // for their shape; the rest is what ipvsadm would print.
    let ipvs_states = [
        "NONE",
        "ESTABLISHED",
        "SYN_SENT",
        "SYN_RECV",
        "FIN_WAIT",
        "TIME_WAIT",
        "CLOSE",
        "CLOSE_WAIT",
        "LAST_ACK",
        "LISTEN",
        "SYNACK",
    ];
    for line in [line4, line6] {
        let (expire, state) = fields(line);
        let e = expire.as_bytes();
        assert!(
            e.len() == 5 && e[2] == b':' && ipvs_states.contains(&state.as_str()),
            "{line}"
        );
    }
    let (expire4, state4) = fields(line4);
    let (expire6, state6) = fields(line6);
    assert_eq!(
        *line4,
        ipvsadm_conn_line(&expire4, &state4, (&client4, port4), (VIP4, 80), (&rs4, 80)),
        "{text}"
    );
    assert_eq!(
        *line6,
        ipvsadm_conn_line(
            &expire6,
            &state6,
            (CLIENT_IP6, port6),
            (VIP6, 80),
            (&rs_ip6(1), 80)
        ),
        "{text}"
    );
    // The same packets went through both: the same state.
    assert_eq!(state4, state6, "{text}");

    // --json: the same sessions, the worker and the bracketed IPv6 endpoints.
    let json = daemon.ctl(&["-Lnc", "--json"]);
    let v: serde_json::Value =
        serde_json::from_str(&json.stdout).unwrap_or_else(|e| panic!("{e}: {}", json.describe()));
    let v6 = v["connections"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["client"] == format!("[{CLIENT_IP6}]:{port6}"))
        .unwrap_or_else(|| panic!("no IPv6 session in {v:#}"));
    assert_eq!(v6["virtual"], format!("[{VIP6}]:80"), "{v:#}");
    assert_eq!(v6["destination"], format!("[{}]:80", rs_ip6(1)), "{v:#}");
    assert_eq!(v6["worker"], 0, "{v:#}");

    // Pages of one session: the cursor goes on from the IPv4 table into the IPv6 one.
    let clients: Vec<String> = (daemon.connection_pages(1).iter().flatten())
        .map(|c| c["client"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        clients,
        [
            format!("{client4}:{port4}"),
            format!("[{CLIENT_IP6}]:{port6}")
        ],
        "paged listing"
    );
}

/// Health checks to IPv6 real servers: a TCP check of two IPv6 real servers (real
/// kernel listeners) from the appliance's address on their link; rs2's listener
/// killed (its kernel answers RST) gets it evicted, new connections over IPv6 all go
/// to rs1, and rs2 listening again restores it. About 8 s.
#[test]
fn an_ipv6_real_server_is_health_checked_evicted_and_restored() {
    use std::time::Instant;
    require_root();
    let started = Instant::now();
    let mut lab = AppLab::new(2);
    ipv6_lab(&lab);
    let http = "[::]:8080";
    lab.start_servers(&[http.to_string()], &[]);
    let services = format!(
        "[health]\ncheck = \"tcp\"\ninterval_ms = 200\ntimeout_ms = 150\nfall = 2\nrise = 1\nretry_ms = 200\n\n{}",
        service6(&lab, "tcp", 80, 8080, "nat", "")
    );
    let addresses = appliance6(&lab);
    let daemon = lab.daemon(&addresses.each_ref().map(String::as_str), services);
    let service = format!("[{VIP6}]:80/tcp");
    let (rs1, rs2) = (rs_ip6(1), rs_ip6(2));
    // `sluicectl health --json` every 50 ms until `pred` holds, for at most 5 s.
    let wait = |lab: &AppLab, what: &str, pred: &dyn Fn(&serde_json::Value) -> bool| {
        wait_for(Duration::from_secs(5), Duration::from_millis(50), || {
            let h = daemon.health();
            pred(&h).then_some(h)
        })
        .unwrap_or_else(|| {
            panic!(
                "{what}: {:#}\n{}\n{}",
                daemon.health(),
                lab.diagnostics(),
                daemon.dump()
            )
        })
    };
    let target = |h: &serde_json::Value, ip: &str| health_target(h, &service, ip).clone();
    let h = wait(&lab, "both IPv6 servers probed up", &|h| {
        [&rs1, &rs2]
            .iter()
            .all(|ip| target(h, ip)["last_outcome"] == "ok")
    });
    assert_eq!(h["sources6"], serde_json::json!([APPLIANCE_IP6, GATEWAY6]));
    let text = daemon
        .ctl(&["health"])
        .expect_success("sluicectl health")
        .stdout;
    assert!(
        text.contains(&format!("[{rs2}]:8080")) && text.contains(GATEWAY6),
        "{text}"
    );

    // rs2's listener gone: its kernel refuses the probes, and it is evicted.
    lab.kill_server(2);
    let killed = Instant::now();
    let h = wait(&lab, "rs2 evicted", &|h| target(h, &rs2)["evicted"] == true);
    eprintln!("IPv6 rs2 evicted {:?} after the kill", killed.elapsed());
    assert_eq!(target(&h, &rs2)["last_outcome"], "refused");
    assert_eq!(target(&h, &rs1)["evicted"], false);
    let listed = daemon.list_services();
    let listed = real_server(&listed, "tcp", VIP6, 80, &rs2);
    assert_eq!(
        (&listed["evicted"], &listed["evictions"]),
        (&serde_json::json!(true), &serde_json::json!(1)),
        "{listed}"
    );
    let batch = lab.curl(&format!("http://[{VIP6}]:80/"), 10, 2, &[]);
    assert_eq!(
        AppLab::answers(&batch).into_iter().collect::<Vec<_>>(),
        [("rs1".to_string(), 10)],
        "every new connection to rs1 while rs2 is evicted: {batch:#}"
    );

    // Listening again: restored at the next probe.
    lab.restart_server(2, &[("--http", http)], &[]);
    wait(&lab, "rs2 restored", &|h| {
        target(h, &rs2)["evicted"] == false
    });
    // The link's own chatter (the kernels' MLD reports and router solicitations, to
    // groups Sluice has not joined) is counted as such; nothing the bed sends is
    // unicast to an address not Sluice's.
    let status = daemon.status();
    assert_eq!(drop_count(&status, "not_local"), 0, "{status:#}");
    let events = daemon.event_lines();
    for op in ["evict", "restore"] {
        assert!(
            events
                .iter()
                .any(|l| l.starts_with(&format!("lb={op} "))
                    && l.contains(&format!("rs=[{rs2}]:8080"))),
            "an lb={op} line for [{rs2}]:8080: {events:?}"
        );
    }
    eprintln!("IPv6 health e2e took {:?}", started.elapsed());
}

/// VRRP taking over an IPv6 VIP (RFC 4861 section 7.2.6): the client's kernel holds
/// a stale entry for the VIP at another MAC (an earlier master's). Sluice, the VRRP
/// owner (priority 255: master from the start, with no peer), announces the VIP by
/// an unsolicited Neighbor Advertisement with the override flag, and the client's
/// entry moves to Sluice's MAC without the client soliciting it (an advertisement
/// without override, or none, leaves the entry at the old MAC).
#[test]
fn vrrp_takeover_moves_a_clients_ipv6_neighbour_entry_to_sluice() {
    require_root();
    const OLD_MAC: &str = "02:00:5e:00:01:33";
    let bed = Testbed::up(0);
    let ten = Duration::from_secs(10);
    let (client, client_if) = (bed.client_ns().to_string(), bed.client_if().to_string());
    bed.ipv6_on(&client, &client_if, &format!("{CLIENT_IP6}/64"));
    bed.exec(
        &client,
        &[
            "ip", "-6", "neigh", "replace", VIP6, "lladdr", OLD_MAC, "dev", &client_if, "nud",
            "stale",
        ],
        ten,
    )
    .expect_success("a stale neighbour entry for the VIP");
    let neighbour_mac = || {
        let shown = bed
            .exec(
                &client,
                &["ip", "-6", "neigh", "show", VIP6, "dev", &client_if],
                ten,
            )
            .expect_success("ip -6 neigh show");
        shown
            .stdout
            .split_whitespace()
            .skip_while(|w| *w != "lladdr")
            .nth(1)
            .map(str::to_ascii_lowercase)
    };
    assert_eq!(neighbour_mac().as_deref(), Some(OLD_MAC));

    let appliance_ip = bed.appliance_ip().to_string();
    let mut cfg = DaemonConfig::new(vec![PortSpec::vdev(
        "lan0",
        &format!("net_af_packet0,iface={}", bed.lb_if()),
        &[
            &format!("{appliance_ip}/24"),
            &format!("{APPLIANCE_IP6}/64"),
        ],
    )])
    .in_netns(bed.lb_ns());
    cfg.extra_toml.push(format!(
        "[[services]]\nproto = \"tcp\"\nvip = \"{VIP6}\"\nport = 80\nscheduler = \"rr\"\n\
         [[services.real_servers]]\nip = \"{}\"\nport = 80\nmode = \"dr\"\n\n\
         [vrrp]\nvrid = 51\npriority = 255\nadvert_interval_ms = 100\nany_peer = true\n\
         key = \"000102030405060708090a0b0c0d0e0f\"\n",
        rs_ip6(1)
    ));
    let daemon = Daemon::start(cfg);
    // Alone on its link, it takes adverts from anyone: said at start and in the report.
    let warned = wait_for(Duration::from_secs(5), Duration::from_millis(50), || {
        daemon
            .stderr_text()
            .contains("vrrp: adverts from ANY sender on the link count")
            .then_some(())
    });
    assert!(warned.is_some(), "no warning at start:\n{}", daemon.dump());
    assert_eq!(daemon.vrrp()["peers"], serde_json::json!([]));
    let port_mac = port(&daemon.status(), "lan0")["mac"]
        .as_str()
        .expect("ports[lan0].mac is a string")
        .to_ascii_lowercase();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let mut seen = neighbour_mac();
    while seen.as_deref() != Some(port_mac.as_str()) && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        seen = neighbour_mac();
    }
    let vrrp = daemon.vrrp();
    assert_eq!(
        seen.as_deref(),
        Some(port_mac.as_str()),
        "the client's entry for {VIP6} after the takeover: {vrrp:#}\n{}",
        daemon.dump()
    );
    assert_eq!(vrrp["state"], "MASTER", "{vrrp:#}");
    // One at the takeover, and one more 5 s later (`ANNOUNCE_AGAIN_MS`).
    let sent = vrrp["stats"]["unsolicited_nas_sent"].as_u64();
    if vrrp["since_change_ms"].as_u64().is_some_and(|ms| ms < 4800) {
        assert_eq!(sent, Some(1), "{vrrp:#}");
    }
    let again = wait_for(Duration::from_secs(7), Duration::from_millis(100), || {
        let v = daemon.vrrp();
        (v["stats"]["unsolicited_nas_sent"] == 2).then_some(v)
    });
    let again = again.unwrap_or_else(|| panic!("no second announcement: {:#}", daemon.vrrp()));
    assert!(
        again["since_change_ms"]
            .as_u64()
            .is_some_and(|ms| ms >= 5000),
        "announced again before its time: {again:#}"
    );
    let text = daemon.ctl(&["vrrp"]);
    assert!(
        text.stdout.contains("; unsolicited NA 2; "),
        "sluicectl vrrp: {}",
        text.stdout
    );
    daemon.stop_clean();
}

/// Packet Too Big is rate-limited (RFC 4443 section 2.4(f)): a flood of 400
/// over-MTU UDP datagrams to a TUN service, sent by scapy from the client as fast as
/// it can (past the client kernel's own path MTU), with `icmp_error_rate = 20` and
/// `icmp_error_burst = 5`. The client's kernel counts the Packet Too Big it receives
/// (`Icmp6InPktTooBigs`): at least the burst, at most burst + rate * t (+ 1 for
/// the edges of t, the flood's own duration); Sluice counts every datagram as `too_big` and the rest as
/// `icmp_errors_suppressed`.
#[test]
fn packet_too_big_is_rate_limited_during_a_flood() {
    require_root();
    const FLOOD: u64 = 400;
    const RATE: f64 = 20.0;
    const BURST: u64 = 5;
    let lab = AppLab::new(1);
    ipv6_lab(&lab);
    let addresses = appliance6(&lab);
    let daemon = lab.daemon(
        &addresses.each_ref().map(String::as_str),
        service6(&lab, "udp", 5400, 5400, "tun", "")
            + &format!("\n[sessions]\nicmp_error_rate = {RATE}\nicmp_error_burst = {BURST}\n"),
    );
    let client = lab.bed.client_ns().to_string();
    let client_if = lab.bed.client_if().to_string();
    let ten = Duration::from_secs(10);
    let received = || -> u64 {
        let snmp = lab
            .bed
            .exec(&client, &["cat", "/proc/net/snmp6"], ten)
            .expect_success("/proc/net/snmp6");
        snmp.stdout
            .lines()
            .find_map(|l| l.strip_prefix("Icmp6InPktTooBigs"))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no Icmp6InPktTooBigs in {}", snmp.stdout))
    };
    let status = daemon.status();
    let mac = port(&status, "lan0")["mac"].as_str().unwrap().to_string();
    let (ptb0, too_big0, suppressed0) = (
        received(),
        drop_count(&status, "too_big"),
        event_count(&status, "icmp_errors_suppressed"),
    );
    // 1452 bytes of payload: a 1500-byte packet, 1540 once encapsulated, over the
    // port's 1500.
    let script = format!(
        "import time\n\
         from scapy.all import Ether, IPv6, UDP, Raw, sendp, conf\n\
         p = Ether(dst='{mac}')/IPv6(src='{CLIENT_IP6}', dst='{VIP6}')/UDP(sport=40000, dport=5400)/Raw(b'x' * 1452)\n\
         s = conf.L2socket(iface='{client_if}')\n\
         t = time.monotonic()\n\
         for _ in range({FLOOD}):\n    s.send(p)\n\
         print(time.monotonic() - t)\n"
    );
    let flood = lab
        .bed
        .exec(
            &client,
            &["/usr/bin/python3", "-c", &script],
            Duration::from_secs(60),
        )
        .expect_success("scapy flood");
    // Sluice's window: the flood's, from its first datagram to its last, with 0.1 s
    // for the last ones to get through. The Packet Too Big are all in by then.
    let sending: f64 = flood.stdout.trim().parse().expect("the flood's duration");
    std::thread::sleep(Duration::from_millis(300));
    let window = sending + 0.1;
    let ptb = received() - ptb0;
    let status = daemon.status();
    let too_big = drop_count(&status, "too_big") - too_big0;
    let suppressed = event_count(&status, "icmp_errors_suppressed") - suppressed0;
    let bound = BURST as f64 + RATE * window + 1.0;
    println!(
        "flood of {FLOOD} in {sending:.3} s: {too_big} too big, {ptb} Packet Too Big \
         received, {suppressed} suppressed, bound {bound:.1}"
    );
    assert!(
        too_big >= FLOOD * 9 / 10,
        "the flood reached Sluice: {too_big} too big: {status:#}"
    );
    assert!(
        ptb >= BURST && ptb as f64 <= bound,
        "{ptb} Packet Too Big in {window:.2} s, expected {BURST} to {bound:.0}\n{}",
        daemon.dump()
    );
    assert_eq!(
        suppressed + ptb,
        too_big,
        "each datagram too big got a Packet Too Big or was counted suppressed: {status:#}"
    );
    daemon.stop_clean();
}

/// `e2e_apps.py ask` in the client's namespace against the IPv6 VIP's `port`:
/// `rounds` rounds, each one kernel TCP connection from every address of `sources`
/// in that order; the real server ("rs1", "rs2") that answered each, in order.
pub(crate) fn ask6(
    lab: &AppLab,
    port: u16,
    sources: &[&str],
    rounds: u32,
) -> Vec<(String, String)> {
    let (apps, port_s, rounds_s) = (AppLab::apps(), port.to_string(), rounds.to_string());
    let mut args = vec![
        PYTHON,
        &apps,
        "ask",
        VIP6,
        &port_s,
        "--rounds",
        &rounds_s,
        "--timeout",
        "4",
    ];
    for s in sources {
        args.extend(["--source", s]);
    }
    let bound = Duration::from_secs(u64::from(rounds) * sources.len() as u64 * 8 + 10);
    let out = lab.bed.exec(lab.bed.client_ns(), &args, bound);
    assert!(out.success(), "ask [{VIP6}]:{port}: {}", out.describe());
    let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    v["answers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| {
            let field = |k: &str| a[k].as_str().unwrap().to_string();
            (field("source"), field("server"))
        })
        .collect()
}

/// The real servers that answered `source`'s connections, in order.
pub(crate) fn servers_of(answers: &[(String, String)], source: &str) -> Vec<String> {
    answers
        .iter()
        .filter(|(s, _)| s == source)
        .map(|(_, server)| server.clone())
        .collect()
}

/// A template of an IPv6 service lives while a connection it placed is open, as for
/// IPv4 (`e2e_schedulers::check_template_kept_while_open`; IPv6 sessions expire by
/// another mechanism, a sweep of their table). About 15 s.
#[test]
fn an_ipv6_persistence_template_lives_while_its_connection_is_open() {
    require_root();
    let mut lab = AppLab::new(2);
    ipv6_lab(&lab);
    lab.start_servers_listening(&[("--echo", "[::]:7000")]);
    let services = service6(&lab, "tcp", 93, 7000, "nat", "persistence_timeout = 2\n");
    let addresses = appliance6(&lab);
    let daemon = lab.daemon(&addresses.each_ref().map(String::as_str), services);
    crate::e2e_schedulers::check_template_kept_while_open(
        &lab,
        &daemon,
        VIP6,
        93,
        &format!("[{CLIENT_IP6}]:0"),
        &|i| format!("[{}]:7000", rs_ip6(i as u32)),
    );
    daemon.stop_clean();
}

/// Persistence on an IPv6 service (`-p`, `-M` a prefix length): `rr` over two NAT
/// real servers (line-echo servers naming themselves), kernel TCP connections from
/// two client addresses of one /64. Without persistence one client's connections
/// alternate; with `-p` each client stays on one server, and the two clients (their
/// first connections placed one after the other by rr) land on different ones; with
/// `-M 64` both clients, one /64, share one server. `-Lnc` (and `--json`) lists the
/// templates as IPVS does (state NONE, the client network with port 0), `-Ln`, `-S`
/// and `--persistent-conn` as ipvsadm 1.31 does. Then the /64's server at weight 0
/// keeps it, and removed takes its template along. About 5 s.
#[test]
fn ipv6_persistence_pins_a_client_and_its_prefix_to_one_real_server() {
    require_root();
    let mut lab = AppLab::new(2);
    ipv6_lab(&lab);
    let second = "2001:db8:18::3";
    let (client, client_if) = (
        lab.bed.client_ns().to_string(),
        lab.bed.client_if().to_string(),
    );
    lab.bed
        .exec(
            &client,
            &[
                "ip",
                "-6",
                "addr",
                "add",
                &format!("{second}/64"),
                "dev",
                &client_if,
                "nodad",
            ],
            Duration::from_secs(10),
        )
        .expect_success("second client address");
    lab.start_servers_listening(&[("--echo", "[::]:7000")]);
    let services = [
        service6(&lab, "tcp", 90, 7000, "nat", ""),
        service6(&lab, "tcp", 91, 7000, "nat", "persistence_timeout = 60\n"),
        service6(
            &lab,
            "tcp",
            92,
            7000,
            "nat",
            "persistence_timeout = 60\npersistence_netmask = 64\n",
        ),
    ]
    .join("\n");
    let addresses = appliance6(&lab);
    let daemon = lab.daemon(&addresses.each_ref().map(String::as_str), services);
    let sources = [CLIENT_IP6, second];

    // No persistence: rr alternates each client's connections.
    let plain = ask6(&lab, 90, &[CLIENT_IP6], 4);
    let plain = servers_of(&plain, CLIENT_IP6);
    assert!(
        plain.windows(2).all(|w| w[0] != w[1]),
        "rr without persistence alternates: {plain:?}\n{}",
        daemon.dump()
    );
    // -p (per client address, /128): each client's connections in a row (rr would
    // alternate them) stay on one server; the second client's first connection is
    // the scheduler's next pick, the other server.
    let pinned: Vec<_> = [CLIENT_IP6, second]
        .iter()
        .flat_map(|s| ask6(&lab, 91, &[s], 3))
        .collect();
    let (a, b) = (servers_of(&pinned, CLIENT_IP6), servers_of(&pinned, second));
    assert!(
        a.len() == 3
            && a.iter().all(|s| *s == a[0])
            && b.len() == 3
            && b.iter().all(|s| *s == b[0]),
        "each client on one real server: {pinned:?}\n{}",
        daemon.dump()
    );
    assert_ne!(a[0], b[0], "/128: two clients, two templates: {pinned:?}");
    // -p -M 64: the two clients of one /64 share the first one's server.
    let prefix = ask6(&lab, 92, &sources, 4);
    assert!(
        prefix.len() == 8 && prefix.iter().all(|(_, s)| *s == prefix[0].1),
        "one /64, one real server: {prefix:?}\n{}",
        daemon.dump()
    );
    let status = daemon.status();
    assert!(
        event_count(&status, "persist_followed") >= 4 + 7,
        "connections placed by their template: {status:#}"
    );

    // The templates, as ipvsadm 1.31's `print_conn` prints IPVS's: state NONE, the
    // client network and port 0, the virtual service, the template's real server.
    let listing = daemon.ctl(&["-Lnc"]);
    assert!(listing.success(), "{}", listing.describe());
    let text = listing.stdout;
    let templates: Vec<&str> = text.lines().filter(|l| l.contains(" NONE ")).collect();
    let rs_of = |name: &str| rs_ip6(name.trim_start_matches("rs").parse().unwrap());
    let expected = [
        (CLIENT_IP6, 91, rs_of(&a[0])),
        (second, 91, rs_of(&b[0])),
        ("2001:db8:18::", 92, rs_of(&prefix[0].1)),
    ];
    assert_eq!(templates.len(), expected.len(), "{text}");
    for (network, vport, rs) in expected {
        let line = templates
            .iter()
            .find(|l| l.contains(&format!("[{network}]:0 ")) && l.contains(&format!("]:{vport} ")))
            .unwrap_or_else(|| panic!("no template of [{network}]:0 for port {vport}:\n{text}"));
        let expire = line.split_whitespace().nth(1).unwrap();
        assert_eq!(
            *line,
            ipvsadm_conn_line(expire, "NONE", (network, 0), (VIP6, vport), (&rs, 7000)),
            "{text}"
        );
    }
    // `-Ln`: `printf(" persistent %u", se->timeout)`, then for AF_INET6
    // `if (se->netmask != 128) printf(" mask %i", se->netmask)`; `-S`: `" -p %u"` and
    // `" -M %i"` under the same condition.
    let list = daemon.ctl(&["-Ln"]).stdout;
    for line in [
        format!("TCP  [{VIP6}]:90 rr\n"),
        format!("TCP  [{VIP6}]:91 rr persistent 60\n"),
        format!("TCP  [{VIP6}]:92 rr persistent 60 mask 64\n"),
    ] {
        assert!(list.contains(&line), "{line:?} in\n{list}");
    }
    let save = daemon.ctl(&["-S", "-n"]).stdout;
    for line in [
        format!("-A -t [{VIP6}]:91 -s rr -p 60\n"),
        format!("-A -t [{VIP6}]:92 -s rr -p 60 -M 64\n"),
    ] {
        assert!(save.contains(&line), "{line:?} in\n{save}");
    }
    // `--persistent-conn`: each real server `"  -> %-28s %-9u %-11u %-10u %-10u\n"`,
    // PersistConn the templates pointing at it: the /64's server has one.
    let vip92 = format!("[{VIP6}]:92");
    let out = daemon.ctl(&["-Ln", "--persistent-conn", "-t", &vip92]);
    let pinned_rs = format!("[{}]:7000", rs_of(&prefix[0].1));
    let persist_conn = |line: &str| {
        let f: Vec<&str> = line.split_whitespace().collect();
        let n = |i: usize| f[i].parse::<u64>().unwrap();
        assert_eq!(
            line,
            format!(
                "  -> {:<28} {:<9} {:<11} {:<10} {:<10}",
                f[1],
                n(2),
                n(3),
                n(4),
                n(5)
            )
        );
        (f[1].to_string(), n(3))
    };
    let counted: Vec<(String, u64)> = out
        .stdout
        .lines()
        .filter(|l| l.starts_with("  -> ["))
        .map(persist_conn)
        .collect();
    assert_eq!(counted.len(), 2, "{}", out.describe());
    for (rs, templates) in counted {
        assert_eq!(
            templates,
            u64::from(rs == pinned_rs),
            "{rs}: {}",
            out.stdout
        );
    }
    // --json: the templates with no worker.
    let json = daemon.ctl(&["-Lnc", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&json.stdout).unwrap();
    let template = v["connections"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["client"] == "[2001:db8:18::]:0")
        .unwrap_or_else(|| panic!("no /64 template in {v:#}"));
    assert_eq!(template["state"], "NONE", "{v:#}");
    assert_eq!(template["virtual"], vip92, "{v:#}");
    assert!(template["worker"].is_null(), "{v:#}");

    // As for IPv4: the template follows its real server at weight 0 (IPVS with
    // expire_quiescent_template off), and goes when the server is removed; the next
    // connection's server becomes the /64's template.
    let pinned_addr = format!("[{}]:7000", rs_of(&prefix[0].1));
    let edit = daemon.ctl(&["-e", "-t", &vip92, "-r", &pinned_addr, "-m", "-w", "0"]);
    assert!(edit.success(), "{}", edit.describe());
    let drained = ask6(&lab, 92, &sources, 1);
    assert!(
        drained.iter().all(|(_, s)| *s == prefix[0].1),
        "weight 0 keeps its template's clients: {drained:?}"
    );
    let removed = daemon.ctl(&["-d", "-t", &vip92, "-r", &pinned_addr]);
    assert!(removed.success(), "{}", removed.describe());
    let moved = ask6(&lab, 92, &sources, 2);
    assert!(
        moved
            .iter()
            .all(|(_, s)| *s != prefix[0].1 && *s == moved[0].1),
        "the template went with its server; the other one took the /64: {moved:?}"
    );
    // -S, -C, -R: the IPv6 services come back with their prefix lengths.
    let saved = daemon.ctl(&["-S", "-n"]).stdout;
    assert!(saved.contains(" -M 64\n"), "{saved}");
    assert!(daemon.ctl(&["-C"]).success());
    let out = daemon.restore(&saved);
    assert!(out.success(), "{}", out.describe());
    assert_eq!(daemon.ctl(&["-S", "-n"]).stdout, saved);
}

/// The real server's side of [`icmp_errors_cross_nat_fullnat_and_nat64_both_ways`]:
/// for each `FAMILY:PORT` argument, a UDP socket that takes one datagram, connects
/// to its sender, answers it half a second later (by then the client's socket is
/// closed) and prints `PORT SENDER refused` when its kernel reports the port
/// unreachable that comes back (ECONNREFUSED), `timeout` when nothing does. For
/// `4big:PORT`, the answer is a 1500-byte IPv4 datagram with DF, and it prints
/// `PORT SENDER mtu N`, N the path MTU its kernel then holds for the sender.
pub(crate) const LATE_REPLIER: &str = r#"
import socket, sys, threading, time
def serve(family, port, big):
    s = socket.socket(family, socket.SOCK_DGRAM)
    if family == socket.AF_INET6:
        s.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
    s.bind(("::" if family == socket.AF_INET6 else "0.0.0.0", port))
    ready.release()
    s.settimeout(20)
    _, peer = s.recvfrom(100)
    s.connect(peer[:2])
    time.sleep(0.5)
    if big:
        s.setsockopt(socket.IPPROTO_IP, 10, 2)  # IP_MTU_DISCOVER = IP_PMTUDISC_DO
        s.send(bytes(1472))
        time.sleep(0.5)
        result = "mtu %d" % s.getsockopt(socket.IPPROTO_IP, 14)  # IP_MTU
    else:
        s.send(b"late")
        s.settimeout(3)
        try:
            s.recv(100)
            result = "answered"
        except ConnectionRefusedError:
            result = "refused"
        except socket.timeout:
            result = "timeout"
    with lock:
        print(f"{port} {peer[0]} {result}", flush=True)
ready = threading.Semaphore(0)
lock = threading.Lock()
threads = []
for arg in sys.argv[1:]:
    family, port = arg.split(":")
    af = socket.AF_INET6 if family == "6" else socket.AF_INET
    t = threading.Thread(target=serve, args=(af, int(port), family == "4big"))
    t.start()
    threads.append(t)
for _ in threads:
    ready.acquire()
print("ready", file=sys.stderr, flush=True)
for t in threads:
    t.join()
"#;

/// ICMP errors about sessions cross NAT, FullNAT and NAT64 both ways, between real
/// kernels. From the real server's side: a UDP datagram from the client to a port
/// the real server does not listen on gets the real server's port unreachable
/// (ICMPv6, or ICMPv4 for NAT64), translated into the ICMPv6 error the client's
/// kernel matches to its socket: `recv` fails with ECONNREFUSED. From the client's
/// side: a real server's late answer to a client socket already closed gets the
/// client's ICMPv6 port unreachable, translated for the real server (to its own
/// address and port; FullNAT: from and to the local address; NAT64: into ICMPv4),
/// whose connected socket then fails with ECONNREFUSED too. And a NAT64 real
/// server's 1500-byte answer with DF, 1520 bytes as IPv6, gets Sluice's frag-needed
/// (MTU 1480): the real server's kernel then holds 1480 as the path MTU to the local
/// address. About 3 s.
#[test]
fn icmp_errors_cross_nat_fullnat_and_nat64_both_ways() {
    require_root();
    let lab = AppLab::new(1);
    ipv6_lab(&lab);
    let rs4 = lab.bed.rs_ip(1).to_string();
    let lip6 = format!("local_addresses = [\"{LIP6}\"]\n");
    let nat64 = |port: u16, rport: u16| {
        format!(
            "[[services]]\nproto = \"udp\"\nvip = \"{VIP6}\"\nport = {port}\nscheduler = \"rr\"\n\
             local_addresses = [\"{LIP4}\"]\n  [[services.real_servers]]\n  ip = \"{rs4}\"\n  \
             port = {rport}\n  mode = \"fullnat\"\n"
        )
    };
    // Closed ports (5399) and the late replier's (5395 to 5398).
    let services = [
        service6(&lab, "udp", 5301, 5399, "nat", ""),
        service6(&lab, "udp", 5302, 5399, "fullnat", &lip6),
        nat64(5303, 5399),
        service6(&lab, "udp", 5311, 5398, "nat", ""),
        service6(&lab, "udp", 5312, 5396, "fullnat", &lip6),
        nat64(5313, 5397),
        nat64(5314, 5395),
    ]
    .join("\n");
    let addresses = appliance6(&lab);
    let daemon = lab.daemon(&addresses.each_ref().map(String::as_str), services);

    for (port, what) in [(5301, "nat"), (5302, "fullnat"), (5303, "nat64")] {
        // Two tries: the first may find the real server's MAC still unresolved.
        let (out, v) = lab.udp(VIP6, port, 2, 0);
        let failures = v["failures"].to_string();
        assert!(
            v["ok"] == 0 && failures.contains("Connection refused"),
            "{what}: the client's UDP socket to a closed port is refused: {}\n{}",
            out.describe(),
            daemon.dump()
        );
    }

    let mut replier = BackgroundProcess::spawn(
        Some(lab.bed.rs_ns(1)),
        &[
            PYTHON,
            "-c",
            LATE_REPLIER,
            "6:5398",
            "6:5396",
            "4:5397",
            "4big:5395",
        ],
    );
    replier.wait_for_stderr(Duration::from_secs(10), "ready");
    let send_and_close = format!(
        "import socket\nfor port in (5311, 5312, 5313, 5314):\n    \
         s = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)\n    \
         s.sendto(b'early', ('{VIP6}', port))\n    s.close()\n"
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
    assert_eq!(
        lines,
        [
            format!("5395 {LIP4} mtu 1480"),
            format!("5396 {LIP6} refused"),
            format!("5397 {LIP4} refused"),
            format!("5398 {CLIENT_IP6} refused"),
        ],
        "the real server's sockets hear the client's port unreachable (NAT: from the \
         client; FullNAT and NAT64: from the local address), and NAT64's frag-needed: \
         {}\n{}",
        replier.stderr_text(),
        daemon.dump()
    );
}

/// The first SYN to an IPv6 real server whose MAC Sluice does not know yet waits for
/// the Neighbor Advertisement (as IPv4 frames wait for ARP) instead of being lost to
/// the client's retransmission timeout (1 s for a SYN on Linux). The real server's
/// address is taken away before Sluice starts, so its solicitations at start go
/// unanswered; it comes back (without duplicate address detection) in the same shell
/// command that times the client's `connect` to the NAT VIP, which must take well
/// under the second a lost SYN costs, with nothing dropped as `neighbour_unresolved`.
/// (Sluice's own solicitations, once a second, could find the server in the few
/// milliseconds between the two: then nothing was held, and the connect is fast
/// anyway.) About 2 s.
#[test]
fn the_first_syn_to_an_unresolved_ipv6_real_server_waits_for_its_advertisement() {
    require_root();
    let mut lab = AppLab::new(1);
    ipv6_lab(&lab);
    lab.start_servers(&["[::]:8080".to_string()], &[]);
    let (rs_ns, rs_if, rs) = (
        lab.bed.rs_ns(1).to_string(),
        lab.bed.rs_if(1).to_string(),
        rs_ip6(1),
    );
    let prefix = format!("{rs}/64");
    lab.bed
        .exec(
            &rs_ns,
            &["ip", "-6", "addr", "del", &prefix, "dev", &rs_if],
            Duration::from_secs(10),
        )
        .expect_success("the real server's address away");
    let addresses = appliance6(&lab);
    let daemon = lab.daemon(
        &addresses.each_ref().map(String::as_str),
        service6(&lab, "tcp", 80, 8080, "nat", ""),
    );
    // Sluice asked at start and heard nothing.
    std::thread::sleep(Duration::from_millis(300));
    let connect = format!(
        "import socket, time\nt = time.monotonic()\n\
         s = socket.create_connection(('{VIP6}', 80), timeout=3)\n\
         print(time.monotonic() - t)\n"
    );
    let script = format!(
        "ip -n {rs_ns} -6 addr add {prefix} dev {rs_if} nodad && \
         ip -n {rs_ns} -6 route replace default via {GATEWAY6} && \
         exec {PYTHON} -c \"$0\"",
    );
    let out = lab.bed.exec(
        lab.bed.client_ns(),
        &["sh", "-c", &script, &connect],
        Duration::from_secs(10),
    );
    let status = daemon.status();
    let out = out.expect_success("the address back, then a connection");
    let seconds: f64 = out
        .stdout
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("connect time ({e}): {}", out.describe()));
    let (held, sent) = (
        event_count(&status, "neighbour_held"),
        event_count(&status, "neighbour_held_sent"),
    );
    eprintln!(
        "connect to an unresolved IPv6 real server: {seconds:.3} s; held {held}, sent {sent}"
    );
    assert!(
        seconds < 0.5,
        "the first SYN waited for the real server's MAC, no retransmission: {seconds} s\n\
         {status:#}\n{}",
        daemon.dump()
    );
    assert_eq!(drop_count(&status, "neighbour_unresolved"), 0, "{status:#}");
    assert_eq!(held, sent, "every held frame went out: {status:#}");
}

/// Session-table pressure over IPv6, as `e2e_table_pressure` over IPv4: a session
/// table of 1024 (256 IPv6 slots per worker), then 1,500 SYNs to a NAT service from
/// spoofed IPv6 sources (scapy, from the client's namespace). The real server answers
/// each one, so every SYN leaves a half-open session that would hold its slot for the
/// SYN_RECV timeout (60 s). With the table nearly full, each new session reclaims the
/// oldest half-open ones, so 30 kernel connections right after the flood all succeed.
#[test]
fn a_spoofed_ipv6_syn_flood_does_not_lock_out_new_connections() {
    require_root();
    const SPOOFED: u64 = 1500;
    let mut lab = AppLab::new(1);
    ipv6_lab(&lab);
    lab.start_servers(&["[::]:8080".to_string()], &[]);
    let addresses = appliance6(&lab);
    let daemon = lab.daemon(
        &addresses.each_ref().map(String::as_str),
        service6(&lab, "tcp", 80, 8080, "nat", "") + "\n[sessions]\ncapacity = 1024\n",
    );
    let client = lab.bed.client_ns().to_string();
    let client_if = lab.bed.client_if().to_string();
    let mac = port(&daemon.status(), "lan0")["mac"]
        .as_str()
        .unwrap()
        .to_string();
    // Sources on the client's /64 (none of them the client's), one per SYN.
    let script = format!(
        "from scapy.all import Ether, IPv6, TCP, sendp, conf\n\
         conf.verb = 0\n\
         frames = [Ether(dst='{mac}')/IPv6(src='2001:db8:18::1:%x' % i, dst='{VIP6}')\
         /TCP(sport=1024 + i, dport=80, flags='S', seq=i) for i in range({SPOOFED})]\n\
         sendp(frames, iface='{client_if}')\n"
    );
    lab.bed
        .exec(
            &client,
            &["/usr/bin/python3", "-c", &script],
            Duration::from_secs(60),
        )
        .expect_success("scapy flood");
    // The flood is in once the SYNs past the table's room have made room for
    // themselves (or, if they cannot, after 10 s).
    wait_for(Duration::from_secs(10), Duration::from_millis(100), || {
        (event_count(&daemon.status(), "half_open_reclaimed") >= SPOOFED / 2).then_some(())
    });
    let batch = lab.curl(&format!("http://[{VIP6}]:80/"), 30, 4, &[]);
    let after = daemon.status();
    let (reclaimed, full) = (
        event_count(&after, "half_open_reclaimed"),
        drop_count(&after, "session_table_full"),
    );
    println!(
        "{SPOOFED} spoofed IPv6 SYNs into 256 IPv6 slots: {reclaimed} half-open sessions \
         reclaimed, {full} refused as session_table_full; new connections after: {} of 30",
        batch["ok"]
    );
    assert_eq!(batch["ok"].as_u64(), Some(30), "{batch}\n{}", daemon.dump());
    assert_eq!(
        full, 0,
        "no new session was refused for want of room: {after:#}"
    );
    assert!(
        reclaimed >= SPOOFED / 2,
        "the spoofed SYNs past the table's room made room for themselves: {reclaimed}"
    );
    daemon.stop_clean();
}

/// Persistence templates against spoofed SYNs over IPv6, as
/// `e2e_table_pressure::spoofed_syns_do_not_evict_a_real_clients_persistence_template`
/// over IPv4: a NAT `rr` service over two real servers, persistent (300 s), with the
/// smallest IPv6 template table (256 slots: 64 buckets of four). The client's
/// connections (kernel TCP, curl) confirm its template by acknowledging the real
/// server's SYN-ACK. Then 1,000 spoofed IPv6 SYNs (one per source), each followed by
/// an ACK guessing the SYN-ACK: about 16 per bucket, so without confirmation the
/// client's template (expiring first in its bucket) would go. Every spoofed template
/// took a free slot or evicted another spoofed one; the client's template is still
/// listed, and its next connections reach its server.
#[test]
fn spoofed_ipv6_syns_do_not_evict_a_real_clients_persistence_template() {
    require_root();
    const SPOOFED: u64 = 1000;
    let mut lab = AppLab::new(2);
    ipv6_lab(&lab);
    lab.start_servers(&["[::]:8080".to_string()], &[]);
    let addresses = appliance6(&lab);
    let daemon = lab.daemon(
        &addresses.each_ref().map(String::as_str),
        service6(&lab, "tcp", 80, 8080, "nat", "persistence_timeout = 300\n")
            + "\n[sessions]\npersistence_templates = 4\n",
    );
    let url = format!("http://[{VIP6}]:80/");
    let pinned = lab.curl_one_server(&url, 5, &daemon);
    let before = daemon.status();
    assert_eq!(
        event_count(&before, "persist_confirmed"),
        1,
        "the client's handshake confirmed its template once: {before:#}"
    );
    let (client, client_if) = (lab.bed.client_ns(), lab.bed.client_if());
    let mac = port(&before, "lan0")["mac"].as_str().unwrap().to_string();
    // Sources on the client's /64 (none of them the client's), one per SYN; the ACKs
    // 300 ms after, once the SYN-ACKs have passed.
    let script = format!(
        "import time\n\
         from scapy.all import Ether, IPv6, TCP, sendp, conf\n\
         conf.verb = 0\n\
         syns, acks = [], []\n\
         for i in range({SPOOFED}):\n\
         \x20   head = Ether(dst='{mac}')/IPv6(src='2001:db8:18::2:%x' % i, dst='{VIP6}')\n\
         \x20   syns.append(head/TCP(sport=1024 + i, dport=80, flags='S', seq=i))\n\
         \x20   acks.append(head/TCP(sport=1024 + i, dport=80, flags='A', seq=i + 1, ack=1))\n\
         sendp(syns, iface='{client_if}')\n\
         time.sleep(0.3)\n\
         sendp(acks, iface='{client_if}')\n"
    );
    lab.bed
        .exec(
            client,
            &["/usr/bin/python3", "-c", &script],
            Duration::from_secs(60),
        )
        .expect_success("scapy flood");
    let listed = wait_for(Duration::from_secs(10), Duration::from_millis(200), || {
        let listed = daemon.ctl(&["-L", "-n", "-c", "--json"]);
        assert!(listed.success(), "{}", listed.describe());
        let v: serde_json::Value = serde_json::from_str(&listed.stdout).unwrap();
        let templates: Vec<serde_json::Value> = v["connections"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|c| c["state"] == "NONE")
            .cloned()
            .collect();
        let status = daemon.status();
        let evicted = event_count(&status, "persist_evicted");
        // Each spoofed SYN's template took a free slot (listed) or evicted one.
        (evicted + templates.len() as u64 - 1 == SPOOFED).then_some((templates, status))
    });
    let (templates, flooded) = listed.unwrap_or_else(|| {
        panic!(
            "not every spoofed SYN made its template: {:#}",
            daemon.status()
        )
    });
    let after = lab.curl_one_server(&url, 5, &daemon);
    println!(
        "{SPOOFED} spoofed IPv6 SYNs (and ACKs) into 256 template slots: {} evicted, {} \
         listed after; the client's server before {pinned}, after {}",
        event_count(&flooded, "persist_evicted"),
        templates.len(),
        after
    );
    assert!(
        templates.iter().any(|t| {
            t["client"] == format!("[{CLIENT_IP6}]:0").as_str() && t["standing"] == "confirmed"
        }),
        "the client's confirmed template survived the spoofed SYNs"
    );
    assert_eq!(
        templates
            .iter()
            .filter(|t| t["standing"] == "confirmed")
            .count(),
        1,
        "no spoofed template confirmed"
    );
    assert_eq!(event_count(&flooded, "persist_no_room"), 0, "{flooded:#}");
    assert_eq!(after, pinned, "{}", daemon.dump());
    assert_eq!(
        event_count(&daemon.status(), "persist_confirmed"),
        1,
        "no spoofed ACK confirmed a template"
    );
    daemon.stop_clean();
}
