//! Tier 3, FullNAT end to end with real kernels: a test bed (scripts/testbed.sh) with a
//! client and three real servers on 198.18.0.0/24, each running
//! `tests/tools/e2e_apps.py serve` (HTTP on 8080 answering its own name, UDP echo on
//! 4444, both logging the client address they see), and Sluice on net_af_packet with a
//! FullNAT TCP service VIP:80 -> RS:8080 and a UDP service VIP:3333 -> RS:4444, rr,
//! local addresses 198.18.0.50 and .51. The real servers have no route set up for
//! Sluice: they answer the LIP on-link (Sluice answers ARP for it).
//!
//! - The real servers resolve both LIPs to Sluice's MAC and ping them.
//! - 60 curl requests on new connections (4 at a time, each bounded) all succeed; rr
//!   spreads them 20/20/20 (+-1); every HTTP log line of every real server shows a LIP
//!   (never the client) and a local port in 1024..=65535; the LIPs are used 30/30
//!   (+-1), and each real server sees both; `sluicectl -L -n --stats --json` counts
//!   exactly the connections each real server answered, with replies through Sluice.
//! - 9 UDP exchanges through the VIP: rr 3/3/3, each echoed from the VIP, each real
//!   server's log shows a LIP.
//! - No checksum error in any kernel, no `tx_full` or `laddr_exhausted` drop.
//!
//! Run: `cargo test --release --test integration e2e_fullnat::` (as root).

use crate::common::*;
use std::collections::BTreeMap;
use std::time::Duration;

const VIP: &str = "198.18.0.240";
const LIPS: [&str; 2] = ["198.18.0.50", "198.18.0.51"];
const HTTP_PORT: u16 = 8080;
const UDP_VPORT: u16 = 3333;
const UDP_RPORT: u16 = 4444;
const REQUESTS: u64 = 60;
const PARALLEL: u32 = 4;

/// `rs{i}`'s log `kind` lines from index `from`: (client IP, client port, local).
fn log_entries(lab: &AppLab, i: u32, kind: &str, from: usize) -> Vec<(String, u32, String)> {
    lab.log_lines(i, kind)[from..]
        .iter()
        .map(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(w.len(), 4, "rs{i}: malformed log line {l:?}");
            let port = w[2]
                .parse()
                .unwrap_or_else(|_| panic!("rs{i}: bad client port in {l:?}"));
            (w[1].to_string(), port, w[3].to_string())
        })
        .collect()
}

/// Every entry's client address is a LIP, its port a FullNAT local port.
fn assert_sources_are_lips(i: u32, kind: &str, entries: &[(String, u32, String)], client_ip: &str) {
    for (ip, port, local) in entries {
        assert!(
            LIPS.contains(&ip.as_str()),
            "rs{i} {kind}: client {ip}:{port} (at {local}) is not a local address {LIPS:?}{}",
            if ip == client_ip {
                ": the real client's address leaked through FullNAT"
            } else {
                ""
            }
        );
        assert!(
            (1024..=65535).contains(port),
            "rs{i} {kind}: local port {port} outside 1024..=65535"
        );
    }
}

#[test]
fn fullnat_rr_spreads_60_connections_and_real_servers_see_only_local_addresses() {
    require_root();
    let mut lab = AppLab::new(3);
    lab.start_servers(
        &[format!("0.0.0.0:{HTTP_PORT}")],
        &[format!("0.0.0.0:{UDP_RPORT}")],
    );
    let rips: Vec<String> = (1..=3).map(|i| lab.bed.rs_ip(i).to_string()).collect();
    let lips = vec![format!(
        "local_addresses = [{}]",
        LIPS.map(|l| format!("\"{l}\"")).join(", ")
    )];
    let tcp: Vec<(&str, u16, u32, &str)> = rips
        .iter()
        .map(|r| (r.as_str(), HTTP_PORT, 1, "fullnat"))
        .collect();
    let udp: Vec<(&str, u16, u32, &str)> = rips
        .iter()
        .map(|r| (r.as_str(), UDP_RPORT, 1, "fullnat"))
        .collect();
    let toml = [
        service_section("tcp", VIP, 80, "rr", &lips, &tcp),
        service_section("udp", VIP, UDP_VPORT, "rr", &lips, &udp),
    ]
    .join("\n");
    let daemon = lab.daemon(&[&format!("{}/24", AppLab::APPLIANCE)], toml);
    lab.prewarm(&daemon, VIP);
    let client_ip = lab.bed.client_ip().to_string();
    let port_mac = port(&daemon.status(), "lan0")["mac"]
        .as_str()
        .unwrap()
        .to_ascii_lowercase();

    // The real servers reach the LIPs on-link: ARP answered by Sluice, echo too.
    for i in 1..=3 {
        let ns = lab.bed.rs_ns(i);
        for lip in LIPS {
            let ping = lab.bed.exec(
                ns,
                &["ping", "-n", "-c", "1", "-W", "2", lip],
                Duration::from_secs(10),
            );
            assert!(
                ping.success(),
                "rs{i} cannot ping the LIP {lip}: {}\n{}",
                ping.describe(),
                daemon.dump()
            );
            let neigh = lab
                .bed
                .exec(ns, &["ip", "neigh", "show", lip], Duration::from_secs(10))
                .expect_success("ip neigh show");
            assert!(
                neigh.stdout.to_ascii_lowercase().contains(&port_mac),
                "rs{i} resolved the LIP {lip} to {:?}, not to Sluice's {port_mac}",
                neigh.stdout
            );
        }
    }

    // 60 HTTP requests on new connections: rr 20/20/20 (+-1).
    let before = lab.http_log_len();
    let batch = lab.curl(&format!("http://{VIP}/"), REQUESTS, PARALLEL, &[]);
    let counts = AppLab::answers(&batch);
    assert_eq!(
        batch["ok"].as_u64(),
        Some(REQUESTS),
        "not every request succeeded: {batch:#}\nstatus: {:#}\nservices: {:#}\n{}\n{}",
        daemon.status(),
        daemon.list_services(),
        daemon.dump(),
        lab.diagnostics()
    );
    assert_eq!(
        counts.keys().cloned().collect::<Vec<_>>(),
        ["rs1", "rs2", "rs3"],
        "answers from unexpected servers: {counts:?}"
    );
    for (name, n) in &counts {
        assert!(
            n.abs_diff(REQUESTS / 3) <= 1,
            "{name} answered {n} of {REQUESTS} requests, expected {} +- 1 (rr): {counts:?}",
            REQUESTS / 3
        );
    }

    // What each real server saw: one log line per answer, always from a LIP.
    let mut per_lip: BTreeMap<String, u64> = BTreeMap::new();
    for i in 1..=3 {
        let entries = log_entries(&lab, i, "http", before[i as usize - 1]);
        let answered = counts[&format!("rs{i}")];
        assert_eq!(
            entries.len() as u64,
            answered,
            "rs{i} logged {} requests but answered {answered}",
            entries.len()
        );
        assert_sources_are_lips(i, "http", &entries, &client_ip);
        let mut seen = std::collections::BTreeSet::new();
        for (ip, port, local) in &entries {
            *per_lip.entry(ip.clone()).or_default() += 1;
            assert!(
                local.ends_with(&format!(":{HTTP_PORT}")),
                "rs{i}: served on {local}"
            );
            // The batch takes seconds, far less than any TCP timeout: its sessions all
            // live, so one LIP:lport twice would be a port handed out twice.
            assert!(
                seen.insert((ip.clone(), *port)),
                "rs{i}: {ip}:{port} used by two connections of the batch: {entries:?}"
            );
        }
        let lips_seen: Vec<&String> = seen.iter().map(|(ip, _)| ip).collect();
        assert!(
            LIPS.iter().all(|l| lips_seen.iter().any(|s| s == l)),
            "rs{i} saw only {lips_seen:?} of the LIPs {LIPS:?} (rr over LIPs per new session)"
        );
    }
    eprintln!("connections by LIP: {per_lip:?}");
    for lip in LIPS {
        let n = per_lip.get(lip).copied().unwrap_or(0);
        assert!(
            n.abs_diff(REQUESTS / 2) <= 1,
            "LIP {lip} carried {n} of {REQUESTS} connections, expected {} +- 1 (rr): {per_lip:?}",
            REQUESTS / 2
        );
    }

    // Sluice's own statistics agree (ipvsadm -Ln --stats).
    let list = daemon.list_services();
    let service = find_service(&list, "tcp", VIP, 80)
        .unwrap_or_else(|| panic!("no service tcp {VIP}:80: {list:#}"));
    assert_eq!(
        service["local_addresses"],
        serde_json::json!(LIPS),
        "{service:#}"
    );
    for i in 1..=3 {
        let rs = real_server(&list, "tcp", VIP, 80, lab.bed.rs_ip(i));
        assert_eq!(rs["mode"], "fullnat", "{rs}");
        let answered = counts[&format!("rs{i}")];
        let conns = rs_counter(rs, "connections");
        assert_eq!(
            conns, answered,
            "Sluice counted {conns} connections to rs{i}, which answered {answered}: {rs}"
        );
        let (inp, outp) = (rs_counter(rs, "in_packets"), rs_counter(rs, "out_packets"));
        assert!(
            inp >= 4 * conns,
            "rs{i}: {inp} packets in for {conns} connections (SYN, ACK, request, FIN at least): {rs}"
        );
        assert!(
            outp >= 3 * conns,
            "rs{i}: {outp} packets out for {conns} FullNAT connections (SYN-ACK, response, FIN at least): {rs}"
        );
    }

    // UDP echo through the VIP: 9 new flows, rr 3/3/3, answered through Sluice.
    let (out, v) = lab.udp(VIP, UDP_VPORT, 9, 43000);
    assert!(
        out.success(),
        "UDP echo through {VIP}:{UDP_VPORT}: {}\nstatus: {:#}\n{}",
        out.describe(),
        daemon.status(),
        lab.diagnostics()
    );
    for i in 1..=3 {
        let n = v["replies"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r.as_str().unwrap().starts_with(&format!("rs{i} ")))
            .count();
        assert_eq!(n, 3, "rs{i} echoed {n} of 9 datagrams (rr): {v}");
        let entries = log_entries(&lab, i, "udp", 0);
        assert_eq!(entries.len(), 3, "rs{i} udp log: {entries:?}");
        assert_sources_are_lips(i, "udp", &entries, &client_ip);
        assert!(
            entries
                .iter()
                .all(|(_, _, local)| *local == format!("0.0.0.0:{UDP_RPORT}")),
            "rs{i} udp log: {entries:?}"
        );
    }
    let list = daemon.list_services();
    let udp_conns: u64 = (1..=3)
        .map(|i| {
            rs_counter(
                real_server(&list, "udp", VIP, UDP_VPORT, lab.bed.rs_ip(i)),
                "connections",
            )
        })
        .sum();
    assert_eq!(udp_conns, 9, "UDP sessions counted: {list:#}");

    lab.assert_no_checksum_errors();
    let status = daemon.status();
    for reason in ["tx_full", "laddr_exhausted"] {
        assert_eq!(drop_count(&status, reason), 0, "{reason}: {status:#}");
    }
    daemon.stop_clean();
}

/// A blind sender who knows a FullNAT connection's client address and port sends a
/// RST, a FIN and a SYN in the client's name, about half the sequence space from the
/// client's own segments: the session stays ESTABLISHED (its local port with it), the
/// RST and FIN count as `tcp_close_out_of_window`, the connection still echoes, and
/// the client's own RST closes it (`AppLab::assert_blind_segments_move_nothing`).
/// Without the sequence check the forged RST takes the session to CLOSE and the SYN
/// then retires it and opens another, from another local port: the connection's next
/// segment reaches the real server from a port it never saw.
#[test]
fn a_blind_rst_fin_and_syn_leave_a_fullnat_connection_established() {
    require_root();
    let mut lab = AppLab::new(1);
    let echo_port = 7777;
    lab.start_servers_listening(&[("--echo", &format!("0.0.0.0:{echo_port}"))]);
    let rip = lab.bed.rs_ip(1).to_string();
    let toml = service_section(
        "tcp",
        VIP,
        7,
        "rr",
        &[format!("local_addresses = [\"{}\"]", LIPS[0])],
        &[(rip.as_str(), echo_port, 1, "fullnat")],
    );
    let daemon = lab.daemon(&[&format!("{}/24", AppLab::APPLIANCE)], toml);
    lab.prewarm(&daemon, VIP);
    let client = lab.bed.client_ip().to_string();
    lab.assert_blind_segments_move_nothing(&daemon, VIP, 7, &client);
    daemon.stop_clean();
}

/// TOA: with `toa = true`, the client's first ACK reaches the real server carrying
/// TCP option 254 with the real client address and port (read by
/// `tests/tools/toa_reader.py` sniffing the real server's interface), the real
/// server's kernel accepts the segments (no checksum errors) and the HTTP exchange
/// completes; `status` counts one insertion per connection and no "no room".
#[test]
fn fullnat_toa_carries_the_client_address_to_the_real_server() {
    toa_reaches_the_real_server(false);
}

/// TOA with the SYN proxy: the option rides on the ACK Sluice sends to complete the
/// real server's handshake (a bare ACK, `flags=A`: the segment kernel TOA modules
/// read it from), once per connection, as without the proxy.
#[test]
fn fullnat_toa_with_the_syn_proxy_rides_on_the_handshake_ack() {
    toa_reaches_the_real_server(true);
}

fn toa_reaches_the_real_server(synproxy: bool) {
    require_root();
    let mut lab = AppLab::new(1);
    lab.start_servers(&[format!("0.0.0.0:{HTTP_PORT}")], &[]);
    let rip = lab.bed.rs_ip(1).to_string();
    let mut extra = vec![
        format!("local_addresses = [\"{}\"]", LIPS[0]),
        "toa = true".to_string(),
    ];
    if synproxy {
        extra.push("synproxy = \"on\"".to_string());
    }
    let toml = service_section(
        "tcp",
        VIP,
        80,
        "rr",
        &extra,
        &[(rip.as_str(), HTTP_PORT, 1, "fullnat")],
    );
    let daemon = lab.daemon(&[&format!("{}/24", AppLab::APPLIANCE)], toml);
    lab.prewarm(&daemon, VIP);
    let client_ip = lab.bed.client_ip().to_string();
    let inserted_before = event_count(&daemon.status(), "toa_inserted");

    let reader_script = format!("{}/tests/tools/toa_reader.py", env!("CARGO_MANIFEST_DIR"));
    let port_arg = HTTP_PORT.to_string();
    let mut reader = BackgroundProcess::spawn(
        Some(lab.bed.rs_ns(1)),
        &[
            "/usr/bin/python3",
            &reader_script,
            "--iface",
            lab.bed.rs_if(1),
            "--port",
            &port_arg,
            "--count",
            "3",
            "--timeout",
            "20",
        ],
    );
    // scapy takes a moment to import and open its socket: it says when it has.
    reader.wait_for_stderr(Duration::from_secs(30), "sniffing");
    let batch = lab.curl(&format!("http://{VIP}/"), 3, 1, &[]);
    assert_eq!(
        batch["ok"].as_u64(),
        Some(3),
        "requests failed: {batch:#}\n{}",
        daemon.dump()
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(25);
    while reader.running() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let seen = reader.stdout_text();
    let carried = seen
        .lines()
        .filter(|l| l.contains(&format!("toa={client_ip}:")))
        .count();
    assert_eq!(
        carried,
        3,
        "the real server should see TOA with the client {client_ip} once per connection:\n{seen}\n{}",
        reader.stderr_text()
    );
    if synproxy {
        let on_bare_acks = seen
            .lines()
            .filter(|l| l.contains(&format!("toa={client_ip}:")) && l.contains("flags=A "))
            .count();
        assert_eq!(
            on_bare_acks, 3,
            "with the SYN proxy, TOA should ride on the handshake's ACK:\n{seen}"
        );
        assert_eq!(
            event_count(&daemon.status(), "synproxy_connections"),
            3,
            "{}",
            daemon.dump()
        );
    }
    let status = daemon.status();
    assert_eq!(
        event_count(&status, "toa_inserted") - inserted_before,
        3,
        "{status:#}"
    );
    assert_eq!(event_count(&status, "toa_no_room"), 0, "{status:#}");
    let csum = lab.bed.exec(
        lab.bed.rs_ns(1),
        &["nstat", "-az", "TcpInCsumErrors"],
        Duration::from_secs(10),
    );
    assert!(
        csum.stdout
            .lines()
            .filter(|l| l.starts_with("TcpInCsumErrors"))
            .all(|l| l.split_whitespace().nth(1) == Some("0")),
        "the real server saw TCP checksum errors: {}",
        csum.stdout
    );
}

/// A frag-needed from the client's side about a UDP reply, judged by the real
/// server's kernel: passed on (clamped to 1280), Linux would lower its path MTU to the
/// local address for every client behind it and send each larger UDP reply in
/// fragments, which Sluice drops. The client exchanges a 1400-byte datagram, sends a
/// forged frag-needed (MTU 576) quoting the echo it got, then exchanges another: the
/// second echo must arrive too, the error must be counted as
/// `icmp_too_big_about_udp`, and the server's route to the local address must carry
/// no path MTU (`AppLab::assert_too_big_about_udp_is_dropped`).
#[test]
fn a_frag_needed_about_a_udp_reply_does_not_shrink_the_servers_path() {
    require_root();
    let mut lab = AppLab::new(1);
    lab.start_servers(&[], &[format!("0.0.0.0:{UDP_RPORT}")]);
    let rip = lab.bed.rs_ip(1).to_string();
    let extra = vec![format!("local_addresses = [\"{}\"]", LIPS[0])];
    let toml = service_section(
        "udp",
        VIP,
        UDP_VPORT,
        "rr",
        &extra,
        &[(rip.as_str(), UDP_RPORT, 1, "fullnat")],
    );
    let daemon = lab.daemon(&[&format!("{}/24", AppLab::APPLIANCE)], toml);
    lab.prewarm(&daemon, VIP);
    let client = lab.bed.client_ip().to_string();
    lab.assert_too_big_about_udp_is_dropped(&daemon, (VIP, UDP_VPORT), &client, 576, LIPS[0]);
}

/// Port-pool exhaustion: one local address with 8 local ports and 20 UDP
/// flows from 20 client ports at once: 8 are echoed, 12 are refused and counted as
/// `laddr_exhausted`; nothing crashes. Once the sessions expire (`udp = 2`), new flows
/// get ports again.
#[test]
fn fullnat_port_pool_exhaustion_refuses_cleanly_and_recovers() {
    require_root();
    let mut lab = AppLab::new(1);
    lab.start_servers(&[], &[format!("0.0.0.0:{UDP_RPORT}")]);
    let rip = lab.bed.rs_ip(1).to_string();
    let extra = vec![format!("local_addresses = [\"{}\"]", LIPS[0])];
    let toml = format!(
        "[timeouts]\nudp = 2\n\n[sessions]\ntick_ms = 10\nlocal_port_first = 2000\nlocal_port_last = 2007\n\n{}",
        service_section("udp", VIP, UDP_VPORT, "rr", &extra, &[(rip.as_str(), UDP_RPORT, 1, "fullnat")])
    );
    let daemon = lab.daemon(&[&format!("{}/24", AppLab::APPLIANCE)], toml);
    lab.prewarm(&daemon, VIP);

    // 20 sockets, one datagram each, then collect the echoes (bounded).
    let script = format!(
        r#"
import socket, select, time
socks = []
for i in range(20):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("0.0.0.0", 0))
    s.sendto(b"flow%d" % i, ("{VIP}", {UDP_VPORT}))
    socks.append(s)
echoed = 0
deadline = time.time() + 3
pending = list(socks)
while pending and time.time() < deadline:
    ready, _, _ = select.select(pending, [], [], 0.2)
    for s in ready:
        s.recvfrom(2048)
        echoed += 1
        pending.remove(s)
print(echoed)
"#
    );
    let flows = |label: &str| -> u64 {
        let out = lab
            .bed
            .exec(
                lab.bed.client_ns(),
                &["/usr/bin/python3", "-c", &script],
                Duration::from_secs(15),
            )
            .expect_success(label);
        out.stdout
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{label}: {:?}", out.stdout))
    };
    let exhausted_before = drop_count(&daemon.status(), "laddr_exhausted");
    assert_eq!(
        flows("first 20 flows"),
        8,
        "only the 8 local ports can carry flows\n{}",
        daemon.dump()
    );
    let status = daemon.status();
    assert_eq!(
        drop_count(&status, "laddr_exhausted") - exhausted_before,
        12,
        "{status:#}"
    );

    // After the UDP timeout the ports are back in the pool.
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while daemon.status()["sessions"].as_u64() != Some(0) {
        assert!(
            std::time::Instant::now() < deadline,
            "sessions never expired: {:#}",
            daemon.status()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        flows("20 flows after expiry"),
        8,
        "ports must be reusable after expiry\n{}",
        daemon.dump()
    );
    assert_eq!(
        drop_count(&daemon.status(), "laddr_exhausted") - exhausted_before,
        24
    );
}
