//! Tier 3, end to end with a real kernel over IPv6: the test bed of
//! scripts/testbed.sh (IPv6 off everywhere), IPv6 turned on in the client namespace
//! only, and Sluice, attached with net_af_packet and given the address
//! 2001:db8:18::1/64 besides its IPv4 one, resolved by the client's kernel through
//! Neighbor Discovery and pinged with `ping -6`. Documentation addresses
//! (2001:db8::/32), inside the bed's namespaces only.
//!
//! Run: `cargo test --release --test e2e_ipv6_local` (as root).
mod common;

use common::*;
use std::time::Duration;

const APPLIANCE_IP6: &str = "2001:db8:18::1";
const CLIENT_IP6: &str = "2001:db8:18::2";
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
    // to a solicited-node group Sluice does not listen to and are dropped as not
    // local, unanswered; so is its ping.
    let not_local0 = drop_count(&status, "not_local");
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
        drop_count(&status, "not_local") > not_local0,
        "the solicitations for {NOBODY_IP6} were counted: {status:#}"
    );

    daemon.stop_clean();
}

/// The IPv6 VIP, on the client's link: the client's kernel resolves it through
/// Neighbor Discovery, which Sluice answers for its VIPs.
const VIP6: &str = "2001:db8:18::100";
/// The appliance's address on the real servers' link, their default gateway.
const GATEWAY6: &str = "2001:db8:1a::1";

fn rs_ip6(i: u32) -> String {
    format!("2001:db8:1a::{}", 10 + i)
}

#[test]
fn curl_over_ipv6_through_nat_and_dr_services() {
    require_root();
    let mut lab = AppLab::new(2);
    let ten = Duration::from_secs(10);
    let (client, client_if) = (
        lab.bed.client_ns().to_string(),
        lab.bed.client_if().to_string(),
    );
    lab.bed
        .ipv6_on(&client, &client_if, &format!("{CLIENT_IP6}/64"));
    for i in 1..=2 {
        let (ns, ifname) = (lab.bed.rs_ns(i).to_string(), lab.bed.rs_if(i).to_string());
        lab.bed.ipv6_on(&ns, &ifname, &format!("{}/64", rs_ip6(i)));
        // NAT: replies to the client go back through Sluice, the default gateway.
        // DR: the server holds the VIP on lo (Linux answers Neighbor Discovery only
        // for addresses of the interface asked), and its replies, from the VIP,
        // reach the client's link directly (a table of their own).
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
    lab.start_servers(&["[::]:8080".to_string(), "[::]:81".to_string()], &[]);
    let appliance = format!("{}/24", lab.bed.appliance_ip());
    let services = format!(
        "[[services]]\nproto = \"tcp\"\nvip = \"{VIP6}\"\nport = 80\nscheduler = \"rr\"\n\
         {nat}\n[[services]]\nproto = \"tcp\"\nvip = \"{VIP6}\"\nport = 81\nscheduler = \"rr\"\n{dr}",
        nat = (1..=2)
            .map(|i| format!(
                "  [[services.real_servers]]\n  ip = \"{}\"\n  port = 8080\n  mode = \"nat\"\n",
                rs_ip6(i)
            ))
            .collect::<String>(),
        dr = (1..=2)
            .map(|i| format!(
                "  [[services.real_servers]]\n  ip = \"{}\"\n  port = 81\n  mode = \"dr\"\n",
                rs_ip6(i)
            ))
            .collect::<String>(),
    );
    let daemon = lab.daemon(
        &[
            &appliance,
            &format!("{APPLIANCE_IP6}/64"),
            &format!("{GATEWAY6}/64"),
        ],
        services,
    );
    let listing = daemon.ctl(&["-Ln"]);
    assert!(
        listing.stdout.contains(&format!("TCP  [{VIP6}]:80 rr"))
            && listing
                .stdout
                .contains(&format!("  -> [{}]:8080", rs_ip6(1))),
        "ipvsadm's layout with bracketed IPv6 addresses: {}",
        listing.stdout
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

/// The IPv4 VIP of the dual-stack test, on the client's link (DR: the real server
/// holds it on lo and does not answer ARP for it).
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
    let mut socket = std::os::unix::net::UnixStream::connect(&daemon.config.socket).unwrap();
    socket.set_read_timeout(Some(ten)).unwrap();
    let mut reader = std::io::BufReader::new(socket.try_clone().unwrap());
    let (mut page, mut clients) = (serde_json::json!({"worker": 0, "from": 0}), Vec::new());
    for _ in 0..10 {
        use std::io::{BufRead, Write};
        let request = serde_json::json!({"cmd": "list_connections", "max": 1, "page": page});
        writeln!(socket, "{request}").unwrap();
        let mut line = String::new();
        reader.read_line(&mut line).unwrap();
        let reply: serde_json::Value = serde_json::from_str(&line).unwrap();
        for c in reply["result"]["connections"].as_array().unwrap() {
            clients.push(c["client"].as_str().unwrap().to_string());
        }
        match reply["result"].get("next") {
            Some(next) => page = next.clone(),
            None => break,
        }
    }
    assert_eq!(
        clients,
        [
            format!("{client4}:{port4}"),
            format!("[{CLIENT_IP6}]:{port6}")
        ],
        "paged listing"
    );
}
