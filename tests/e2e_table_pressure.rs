//! Tier 3, session-table pressure with real kernels: a NAT service, a session table of
//! 1024 (the least allowed), two long-lived keep-alive connections, then 5,000 SYNs from
//! spoofed sources (scapy, from the client's namespace). The real server answers each
//! spoofed SYN, so every one leaves a half-open session that would hold its slot for
//! the SYN_RECV timeout (60 s). With the table nearly full, each new session reclaims
//! the oldest half-open ones: the long-lived connections keep going, and 30 new
//! connections right after the flood all succeed. The same with each spoofed SYN
//! followed by a FIN, which moves its session to TIME_WAIT: finished sessions are
//! reclaimed as half-open ones are. And FullNAT, whose local ports towards a real
//! server run out long before the table fills: a flood holding every port leaves
//! new connections the ports of its half-open sessions once they are over 3 s old.
//!
//! Run: `cargo test --release --test integration e2e_table_pressure::` (as root).

use crate::common::*;
use std::time::Duration;

const APPLIANCE: &str = "198.18.0.1";
const CLIENT: &str = "198.18.2.100/24";
const GATEWAY: &str = "198.18.2.1";
const VIP: &str = "198.18.1.1";
const HTTP_PORT: u16 = 8080;
const ECHO_PORT: u16 = 7000;
const CAPACITY: u64 = 1024;
const SPOOFED: u32 = 5000;

/// Sends `count` TCP SYNs to VIP:80 from sources 198.18.64.0/18 (one per SYN), each
/// in an Ethernet frame to the appliance's MAC, from `iface`; with a fifth argument
/// `fin`, each SYN is followed by a FIN from the same source (no answer needed); with
/// `ack`, 300 ms after the SYNs (once their SYN-ACKs have passed), each source sends
/// a bare ACK acknowledging 1, a blind sender's guess at the SYN-ACK it never saw.
const FLOOD: &str = r#"
import sys, time
from scapy.all import Ether, IP, TCP, sendp, conf, get_if_hwaddr
conf.verb = 0
iface, lb_mac, vip, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
then = sys.argv[5] if len(sys.argv) > 5 else None
mac = get_if_hwaddr(iface)
frames, acks = [], []
for i in range(count):
    head = Ether(src=mac, dst=lb_mac) / IP(src="198.18.%d.%d" % (64 + (i >> 8) % 64, i & 0xff), dst=vip)
    frames.append(head / TCP(sport=1024 + i % 60000, dport=80, flags="S", seq=i))
    if then == "fin":
        frames.append(head / TCP(sport=1024 + i % 60000, dport=80, flags="FA", seq=i + 1, ack=1))
    elif then == "ack":
        acks.append(head / TCP(sport=1024 + i % 60000, dport=80, flags="A", seq=i + 1, ack=1))
sendp(frames, iface=iface)
if acks:
    time.sleep(0.3)
    sendp(acks, iface=iface)
print(count)
"#;

/// What follows each spoofed SYN from its source.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Then {
    Nothing,
    Fin,
    /// An ACK acknowledging 1: a blind sender's guess at the SYN-ACK it never saw.
    Ack,
}

/// Sends `count` spoofed SYNs to `vip`:80 (each followed by `then`) from the client's
/// namespace.
fn flood(lab: &AppLab, vip: &str, count: u32, then: Then) {
    let count_arg = count.to_string();
    let mut args = vec![
        PYTHON,
        "-c",
        FLOOD,
        lab.bed.client_if(),
        lab.bed.lb_mac(),
        vip,
        &count_arg,
    ];
    match then {
        Then::Nothing => {}
        Then::Fin => args.push("fin"),
        Then::Ack => args.push("ack"),
    }
    let flood = lab
        .bed
        .exec(lab.bed.client_ns(), &args, Duration::from_secs(60));
    assert!(flood.success(), "{}", flood.describe());
}

/// Sends `count` spoofed SYNs (each followed by a FIN with `fin`) from the client's
/// namespace, then waits until the worker counts the event `reclaimed` and the table
/// holds as many sessions as its pressure mark lets it.
fn flood_until_reclaimed(lab: &AppLab, daemon: &Daemon, count: u32, fin: bool, reclaimed: &str) {
    flood(lab, VIP, count, if fin { Then::Fin } else { Then::Nothing });
    let settled = wait_for(Duration::from_secs(10), Duration::from_millis(100), || {
        let s = daemon.status();
        (event_count(&s, reclaimed) > 0).then_some(s)
    });
    let during = settled.unwrap_or_else(|| {
        panic!(
            "no {reclaimed} after {count} spoofed SYNs (FINs: {fin}): {:#}\n{}",
            daemon.status(),
            daemon.dump()
        )
    });
    let sessions = during["sessions"].as_u64().unwrap();
    assert!(
        (CAPACITY * 9 / 10..=CAPACITY).contains(&sessions),
        "the flood fills the table up to its pressure mark: {sessions} of {CAPACITY}"
    );
}

#[test]
fn a_spoofed_syn_flood_does_not_lock_out_new_or_established_connections() {
    require_root();
    let mut lab = AppLab::new(1);
    lab.bed.configure("client-addr", &[CLIENT, GATEWAY]);
    lab.bed.configure("rs-gateway", &[APPLIANCE]);
    let (http, echo) = (
        format!("0.0.0.0:{HTTP_PORT}"),
        format!("0.0.0.0:{ECHO_PORT}"),
    );
    lab.start_servers_listening(&[("--http", &http), ("--echo", &echo)]);
    let rip = lab.bed.rs_ip(1).to_string();
    let toml = service_section("tcp", VIP, 80, "rr", &[], &[(&rip, HTTP_PORT, 1, "nat")])
        + "\n"
        + &service_section(
            "tcp",
            VIP,
            ECHO_PORT,
            "rr",
            &[],
            &[(&rip, ECHO_PORT, 1, "nat")],
        )
        + &format!("\n[sessions]\ncapacity = {CAPACITY}\n");
    let daemon = lab.daemon(
        &[&format!("{APPLIANCE}/24"), &format!("{GATEWAY}/24")],
        toml,
    );
    lab.prewarm(&daemon, GATEWAY);

    let options = [
        "--long",
        "2",
        "--interval-ms",
        "100",
        "--new-per-s",
        "0",
        "--duration",
        "40",
        "--timeout",
        "5",
    ];
    let client = lab.stream("long", VIP, ECHO_PORT, &options);

    // The last spoofed SYNs' sessions are in: the table is at its pressure mark.
    flood_until_reclaimed(&lab, &daemon, SPOOFED, false, "half_open_reclaimed");

    let batch = lab.curl(&format!("http://{VIP}/"), 30, 4, &[]);
    let after = daemon.status();
    let report = client.stop_and_report();
    let reclaimed = event_count(&after, "half_open_reclaimed");
    let full = drop_count(&after, "session_table_full");
    eprintln!(
        "{SPOOFED} spoofed SYNs into {CAPACITY} slots: {reclaimed} half-open sessions \
         reclaimed, {full} refused as session_table_full; new connections after: {} of 30",
        batch["ok"]
    );
    assert_eq!(batch["ok"].as_u64(), Some(30), "{batch}\n{}", daemon.dump());
    for long in report["long"].as_array().unwrap() {
        assert!(long["failures"].as_array().unwrap().is_empty(), "{long}");
        let gap = long["max_gap_s"].as_f64().unwrap();
        assert!(gap < 1.0, "a long-lived connection stalled {gap} s: {long}");
    }
    assert_eq!(full, 0, "no new session was refused for want of room");
    assert!(
        reclaimed >= u64::from(SPOOFED) / 2,
        "the spoofed SYNs past the table's room made room for themselves: {reclaimed}"
    );
    daemon.stop_clean();
}

/// Spoofed SYNs each followed by a FIN: the FIN moves each session from SYN_RECV to
/// TIME_WAIT (IPVS's table) without any answer from a client, where it would hold its
/// slot for `time_wait` (120 s) and, being past the handshake, never be reclaimed as a
/// half-open one: the table would refuse every new connection for two minutes.
/// Finished sessions are reclaimed too: 30 new connections right after all succeed.
#[test]
fn a_spoofed_syn_and_fin_flood_does_not_lock_out_new_connections() {
    require_root();
    let mut lab = AppLab::new(1);
    lab.bed.configure("client-addr", &[CLIENT, GATEWAY]);
    lab.bed.configure("rs-gateway", &[APPLIANCE]);
    lab.start_servers(&[format!("0.0.0.0:{HTTP_PORT}")], &[]);
    let rip = lab.bed.rs_ip(1).to_string();
    let toml = service_section("tcp", VIP, 80, "rr", &[], &[(&rip, HTTP_PORT, 1, "nat")])
        + &format!("\n[sessions]\ncapacity = {CAPACITY}\n");
    let daemon = lab.daemon(
        &[&format!("{APPLIANCE}/24"), &format!("{GATEWAY}/24")],
        toml,
    );
    lab.prewarm(&daemon, GATEWAY);
    let spoofed = 3000;
    flood_until_reclaimed(&lab, &daemon, spoofed, true, "finished_reclaimed");
    let batch = lab.curl(&format!("http://{VIP}/"), 30, 4, &[]);
    let after = daemon.status();
    let finished = event_count(&after, "finished_reclaimed");
    let full = drop_count(&after, "session_table_full");
    eprintln!(
        "{spoofed} spoofed SYNs and FINs into {CAPACITY} slots: {finished} finished sessions \
         reclaimed, {} half-open, {full} refused; new connections after: {} of 30",
        event_count(&after, "half_open_reclaimed"),
        batch["ok"]
    );
    assert_eq!(batch["ok"].as_u64(), Some(30), "{batch}\n{}", daemon.dump());
    assert_eq!(
        full, 0,
        "no new session was refused for want of room: {after:#}"
    );
    daemon.stop_clean();
}

/// FullNAT with 64 local ports: 200 spoofed SYNs take every port towards the real
/// server (a real kernel, which answers each and keeps it in its SYN queue), the rest
/// are refused as `laddr_exhausted`. Those sessions would hold their ports for the
/// SYN_RECV timeout (60 s) while the table (1,024) is far from full, so table pressure
/// never reclaims them. 3.5 s later, 30 new connections all succeed, each taking
/// the port of one of them (`local_port_reclaimed`).
#[test]
fn a_spoofed_syn_flood_holding_every_fullnat_port_does_not_lock_out_new_connections() {
    require_root();
    const FULLNAT_VIP: &str = "198.18.0.240";
    const LIP: &str = "198.18.0.50";
    let mut lab = AppLab::new(1);
    lab.start_servers(&[format!("0.0.0.0:{HTTP_PORT}")], &[]);
    let rip = lab.bed.rs_ip(1).to_string();
    let extra = [format!("local_addresses = [\"{LIP}\"]")];
    let toml = format!(
        "[sessions]\ncapacity = {CAPACITY}\nlocal_port_first = 2000\nlocal_port_last = 2063\n\n{}",
        service_section(
            "tcp",
            FULLNAT_VIP,
            80,
            "rr",
            &extra,
            &[(&rip, HTTP_PORT, 1, "fullnat")]
        )
    );
    let daemon = lab.daemon(&[&format!("{}/24", AppLab::APPLIANCE)], toml);
    lab.prewarm(&daemon, FULLNAT_VIP);
    let spoofed = 200;
    flood(&lab, FULLNAT_VIP, spoofed, Then::Nothing);
    let held = wait_for(Duration::from_secs(10), Duration::from_millis(100), || {
        let s = daemon.status();
        (drop_count(&s, "laddr_exhausted") >= 100).then_some(s)
    })
    .unwrap_or_else(|| panic!("the flood did not use up the ports: {:#}", daemon.status()));
    assert_eq!(held["sessions"].as_u64(), Some(64), "{held:#}");
    // Half-open sessions 3 s old or less may still be handshakes in progress.
    std::thread::sleep(Duration::from_millis(3500));
    let batch = lab.curl(&format!("http://{FULLNAT_VIP}/"), 30, 4, &[]);
    let after = daemon.status();
    let reclaimed = event_count(&after, "local_port_reclaimed");
    eprintln!(
        "{spoofed} spoofed SYNs into 64 local ports: {} refused as laddr_exhausted \
         during the flood; new connections after: {} of 30, {reclaimed} ports reclaimed, \
         {} refused after",
        drop_count(&held, "laddr_exhausted"),
        batch["ok"],
        drop_count(&after, "laddr_exhausted") - drop_count(&held, "laddr_exhausted")
    );
    assert_eq!(batch["ok"].as_u64(), Some(30), "{batch}\n{}", daemon.dump());
    assert!(
        (30..=64).contains(&reclaimed),
        "each new connection took a held port: {reclaimed}"
    );
    daemon.stop_clean();
}

/// Persistence templates against spoofed SYNs, in NAT: a client's connections
/// confirm their template when they acknowledge the real server's SYN-ACK, which each
/// spoofed SYN's following ACK fails to
/// ([`check_spoofed_syns_leave_a_real_clients_template`]).
#[test]
fn spoofed_syns_do_not_evict_a_real_clients_persistence_template() {
    check_spoofed_syns_leave_a_real_clients_template("nat");
}

/// The same in DR, where the real server's SYN-ACK bypasses Sluice: the client's
/// handshake-completing ACK raises its template to unverified, above the spoofed
/// SYNs' unconfirmed ones (spoofed SYNs each followed by an ACK would stand as high,
/// and could evict it: CONFIG.md, `persistence_timeout`).
#[test]
fn spoofed_syns_do_not_evict_a_real_clients_dr_persistence_template() {
    check_spoofed_syns_leave_a_real_clients_template("dr");
}

/// An `rr` service in `mode` over two real servers, persistent (300 s), with a
/// template table of one bucket of four (`persistence_templates = 4`). A real client's
/// connections (kernel TCP, through curl) make its template and confirm it. Then 200
/// SYNs from 200 spoofed sources (in NAT, each followed by a guessed ACK): each binds
/// an unconfirmed template, and none raises it; the first three take the free slots,
/// the other 197 evict each other, never the client's raised one (confirmed in NAT,
/// unverified in DR; bound first, it expires first: a table that did not tell
/// standings apart would evict it first). The client's template is still listed, and
/// its next connections all reach its server.
fn check_spoofed_syns_leave_a_real_clients_template(mode: &str) {
    const DR_VIP: &str = "198.18.0.200";
    require_root();
    let mut lab = AppLab::new(2);
    let (vip, addresses, client_ip) = if mode == "dr" {
        lab.bed.configure("dr-vip", &[DR_VIP]);
        let client = lab.bed.client_ip().to_string();
        (DR_VIP, vec![format!("{APPLIANCE}/24")], client)
    } else {
        lab.bed.configure("client-addr", &[CLIENT, GATEWAY]);
        lab.bed.configure("rs-gateway", &[APPLIANCE]);
        let addresses = vec![format!("{APPLIANCE}/24"), format!("{GATEWAY}/24")];
        (
            VIP,
            addresses,
            CLIENT.split('/').next().unwrap().to_string(),
        )
    };
    // DR does not translate ports: the servers listen on the service's.
    lab.start_servers(&["0.0.0.0:80".to_string()], &[]);
    let rips: Vec<String> = (1..=2).map(|i| lab.bed.rs_ip(i).to_string()).collect();
    let servers: Vec<(&str, u16, u32, &str)> =
        rips.iter().map(|r| (r.as_str(), 80, 1, mode)).collect();
    let toml = service_section(
        "tcp",
        vip,
        80,
        "rr",
        &["persistence_timeout = 300".to_string()],
        &servers,
    ) + "\n[sessions]\npersistence_templates = 4\n";
    let addresses: Vec<&str> = addresses.iter().map(String::as_str).collect();
    let daemon = lab.daemon(&addresses, toml);
    lab.prewarm(&daemon, if mode == "dr" { DR_VIP } else { GATEWAY });
    let url = format!("http://{vip}/");
    let pinned = lab.curl_one_server(&url, 5, &daemon);
    // NAT confirms; DR can only raise to unverified.
    let raised = if mode == "dr" {
        "persist_unverified"
    } else {
        "persist_confirmed"
    };
    let before = daemon.status();
    assert_eq!(
        event_count(&before, raised),
        1,
        "the client's handshake raised its template once: {before:#}"
    );
    let spoofed = 200;
    // In NAT each spoofed SYN comes with the ACK a blind sender would guess. In DR that
    // ACK would raise each spoofed template to unverified, as high as the client's,
    // which they could then evict: the limit CONFIG.md states, not tested here.
    let then = if mode == "dr" {
        Then::Nothing
    } else {
        Then::Ack
    };
    flood(&lab, vip, spoofed, then);
    let flooded = wait_for(Duration::from_secs(10), Duration::from_millis(100), || {
        let s = daemon.status();
        (event_count(&s, "persist_evicted") >= u64::from(spoofed) - 3).then_some(s)
    })
    .unwrap_or_else(|| {
        panic!(
            "the spoofed SYNs' templates did not fill the bucket: {:#}",
            daemon.status()
        )
    });
    let listed = daemon.ctl(&["-L", "-n", "-c", "--json"]);
    assert!(listed.success(), "{}", listed.describe());
    let after = lab.curl_one_server(&url, 5, &daemon);
    let v: serde_json::Value = serde_json::from_str(&listed.stdout).unwrap();
    let templates: Vec<&serde_json::Value> = v["connections"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["state"] == "NONE")
        .collect();
    eprintln!(
        "{mode}: {spoofed} spoofed SYNs into a 4-template table: {} templates evicted, \
         {} listed after; the client's server before {pinned}, after {}",
        event_count(&flooded, "persist_evicted"),
        templates.len(),
        after
    );
    assert_eq!(templates.len(), 4, "{templates:?}");
    // In pages of 3, 4 and 5 (the page where the sessions end holds templates too,
    // unless their number divides by the page's size), sessions then templates: no
    // page holds more, and the pages list the same templates.
    let named = |c: &serde_json::Value| {
        ["client", "virtual_service", "destination", "standing"].map(|f| c[f].to_string())
    };
    let listed_templates: Vec<_> = templates.iter().map(|c| named(c)).collect();
    for max in [3, 4, 5] {
        let pages = daemon.connection_pages(max);
        assert!(pages.iter().all(|p| p.len() <= max as usize), "{pages:?}");
        let paged: Vec<_> = (pages.iter().flatten())
            .filter(|c| c["state"] == "NONE")
            .map(named)
            .collect();
        assert_eq!(paged, listed_templates, "{pages:?}");
    }
    let standing = if mode == "dr" {
        "unverified"
    } else {
        "confirmed"
    };
    assert!(
        templates.iter().any(|t| {
            t["client"] == format!("{client_ip}:0").as_str() && t["standing"] == standing
        }),
        "the client's template, {standing}, survived the spoofed SYNs: {templates:?}"
    );
    assert!(
        templates
            .iter()
            .filter(|t| t["client"] != format!("{client_ip}:0").as_str())
            .all(|t| t["standing"] == "unconfirmed"),
        "every spoofed template unconfirmed: {templates:?}"
    );
    assert_eq!(
        event_count(&flooded, "persist_evicted"),
        u64::from(spoofed) - 3,
        "each spoofed SYN past the three free slots evicted another one's: {flooded:#}"
    );
    assert_eq!(event_count(&flooded, "persist_no_room"), 0, "{flooded:#}");
    assert_eq!(after, pinned, "{}", daemon.dump());
    let end = daemon.status();
    assert_eq!(
        (event_count(&end, "persist_confirmed") + event_count(&end, "persist_unverified")),
        1,
        "no spoofed segment raised a template, and a connection that follows a raised \
         one has nothing to raise: {end:#}"
    );
    // The status's count by standing (a whole count every few seconds) comes to what
    // the listing showed: the client's template and three spoofed ones.
    let (unverified, confirmed) = if mode == "dr" { (1, 0) } else { (0, 1) };
    let want = serde_json::json!({
        "slots": 4, "unconfirmed": 3, "unverified": unverified, "confirmed": confirmed
    });
    let counted = wait_for(Duration::from_secs(15), Duration::from_millis(250), || {
        let s = daemon.status();
        (s["persistence_templates"]["ipv4"] == want).then_some(s)
    })
    .unwrap_or_else(|| {
        panic!(
            "the status never counted the listed templates ({want}): {:#}",
            daemon.status()["persistence_templates"]
        )
    });
    let ipv6 = &counted["persistence_templates"]["ipv6"];
    for standing in ["unconfirmed", "unverified", "confirmed"] {
        assert_eq!(ipv6[standing], 0, "{counted:#}");
    }
    let text = daemon.ctl(&["status"]);
    assert!(
        text.stdout.contains(&format!(
            "persistence templates IPv4 4 of 4 slots (confirmed {confirmed}, unverified \
             {unverified}, unconfirmed 3)"
        )),
        "{}",
        text.stdout
    );
    daemon.stop_clean();
}
