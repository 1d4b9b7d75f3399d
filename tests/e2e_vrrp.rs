//! Tier 3, VRRPv3 (RFC 5798) end to end with a real keepalived (2.2.7, installed by
//! scripts/setup.sh) as the other router: a NAT test bed (client on its own subnet
//! with an on-link route to the VIP, so it ARPs for the VIP itself; two real servers
//! routing via Sluice), keepalived running VRRP only in real server 2's namespace
//! for VRID 51 and the VIP 198.18.1.1, priority 100.
//!
//! 1. Election both ways: Sluice at priority 150 becomes master, keepalived stays
//!    backup (the VIP is not on rs2), only Sluice answers ARP for the VIP and a curl
//!    through the VIP reaches rs1; Sluice SIGKILLed: keepalived takes the VIP within
//!    3 intervals + its skew (+ tolerance); Sluice back at 150 preempts and keepalived
//!    drops the VIP; Sluice at 50 stays backup, reports keepalived as master and does
//!    not answer ARP for the VIP (rs2 does).
//! 2. Planned switchover: SIGTERM on a master Sluice sends a priority-0 advert, and
//!    keepalived takes over after its skew time (0.6 s at 1 s intervals), well before
//!    the 3.6 s a silent master would take.
//! 3. Malformed and foreign adverts (wrong VRID, TTL 64, bad checksum, truncated
//!    address list; each with priority 254, which would win were it accepted) sent
//!    with scapy are counted as rejected and change nothing; so does the advert
//!    without a defect from an address not in `[vrrp] peers` (dropped by the worker
//!    as `not_a_peer`); the same advert from the peer is accepted and makes Sluice
//!    backup (the checks can fail).
//! 4. keepalived in unicast mode (`unicast_peer` Sluice, which makes it leave
//!    224.0.0.18 alone) and Sluice with `unicast = true`: Sluice at 50 hears
//!    keepalived's adverts to its own address and stays backup; Sluice at 150 preempts,
//!    so keepalived heard Sluice's adverts to its address (tried by hand with Sluice
//!    multicasting instead: keepalived kept the VIP, both master).
//!
//! 5. Sluice with `[vrrp] key`, against adverts sealed by a Python script from the
//!    trailer's description in docs/CONFIG.md (its own HMAC-SHA256, not Sluice's): the
//!    script verifies Sluice's adverts captured on the wire; its sealed advert at
//!    priority 254 makes Sluice backup; the same bytes sent again, an unsealed advert
//!    (what keepalived sends), one sealed under another key and one whose counter is
//!    2 minutes old change nothing and are counted by reason; the event log names the
//!    peer's first refusal only (once a minute per peer).
//! 6. A flood of costly control requests (six clients pipelining service changes at
//!    20,000 services) against a Sluice master at a 100 ms interval: keepalived, its
//!    backup, never takes the VIP.
//!
//! Measured times are printed (`--nocapture`). Run: `cargo test --release --test
//! integration e2e_vrrp:: -- --nocapture --test-threads 1` (as root).

use crate::common::*;
use std::path::PathBuf;
use std::time::{Duration, Instant};

const APPLIANCE: &str = "198.18.0.1";
const CLIENT: &str = "198.18.2.100/24";
const CLIENT_IP: &str = "198.18.2.100";
const GATEWAY: &str = "198.18.2.1";
const VIP: &str = "198.18.1.1";
const HTTP_PORT: u16 = 8080;
const VRID: u8 = 51;
/// keepalived's priority.
const PEER_PRIORITY: u8 = 100;
/// Slack on every measured bound: process start-up of the pollers (`ip netns exec`
/// every 10 ms), keepalived's and Sluice's loops, on a shared 2-core machine.
const TOLERANCE: Duration = Duration::from_secs(1);
/// On the client's subnet, not a peer: its adverts must not count.
const STRANGER: &str = "198.18.0.77";
/// How often an address or a state is polled while timing a change.
const POLL: Duration = Duration::from_millis(10);

/// RFC 5798: `((256 - priority) * interval) / 256`, centiseconds to a duration.
fn skew(priority: u8, interval_cs: u32) -> Duration {
    Duration::from_millis(u64::from((256 - u32::from(priority)) * interval_cs / 256) * 10)
}

/// `3 * interval + skew`.
fn master_down(priority: u8, interval_cs: u32) -> Duration {
    Duration::from_millis(u64::from(3 * interval_cs) * 10) + skew(priority, interval_cs)
}

/// The NAT lab: client on 198.18.2.0/24 via Sluice, with an on-link route to the VIP;
/// real servers via Sluice, each serving HTTP.
fn lab() -> AppLab {
    let mut lab = AppLab::new(2);
    lab.bed.configure("client-addr", &[CLIENT, GATEWAY]);
    lab.bed.configure("rs-gateway", &[APPLIANCE]);
    let client_if = lab.bed.client_if().to_string();
    lab.bed
        .exec(
            lab.bed.client_ns(),
            &[
                "ip",
                "route",
                "replace",
                &format!("{VIP}/32"),
                "dev",
                &client_if,
            ],
            Duration::from_secs(10),
        )
        .expect_success("on-link route to the VIP");
    lab.start_servers(&[format!("0.0.0.0:{HTTP_PORT}")], &[]);
    lab
}

/// Sluice with one NAT service (VIP:80 -> rs1) and `[vrrp]` at `priority`, keepalived
/// (rs2's address) its peer.
fn sluice(lab: &AppLab, priority: u8, advert_interval_ms: u32) -> Daemon {
    sluice_with(lab, priority, advert_interval_ms, "")
}

/// [`sluice`] with `extra` lines in `[vrrp]`.
fn sluice_with(lab: &AppLab, priority: u8, advert_interval_ms: u32, extra: &str) -> Daemon {
    let mut toml = service_section(
        "tcp",
        VIP,
        80,
        "rr",
        &[],
        &[(lab.bed.rs_ip(1), HTTP_PORT, 1, "nat")],
    );
    toml.push_str(&format!(
        "\n[vrrp]\nvrid = {VRID}\npriority = {priority}\nadvert_interval_ms = {advert_interval_ms}\n\
         peers = [\"{}\"]\nunauthenticated = true\n{extra}",
        lab.bed.rs_ip(2)
    ));
    lab.daemon(
        &[&format!("{APPLIANCE}/24"), &format!("{GATEWAY}/24")],
        toml,
    )
}

/// keepalived (VRRP only, foreground, logging to the console) in rs2's namespace:
/// VRID 51, priority 100, the VIP, `advert_int` in seconds.
struct Keepalived {
    process: BackgroundProcess,
}

impl Keepalived {
    fn start(lab: &AppLab, advert_int: &str) -> Keepalived {
        Keepalived::start_with(lab, advert_int, "")
    }

    /// In unicast mode: adverts from rs2's address to Sluice's, and only Sluice's
    /// count (`unicast_peer` makes keepalived leave 224.0.0.18 alone).
    fn start_unicast(lab: &AppLab, advert_int: &str) -> Keepalived {
        let unicast = format!(
            "  unicast_src_ip {}\n  unicast_peer {{\n    {APPLIANCE}\n  }}\n",
            lab.bed.rs_ip(2)
        );
        Keepalived::start_with(lab, advert_int, &unicast)
    }

    /// With `extra` lines in its `vrrp_instance`.
    fn start_with(lab: &AppLab, advert_int: &str, extra: &str) -> Keepalived {
        let dir = lab.dir.path();
        let file = |name: &str| -> PathBuf { dir.join(name) };
        let conf = file("keepalived.conf");
        std::fs::write(
            &conf,
            format!(
                "global_defs {{\n  vrrp_version 3\n  router_id {name}\n}}\n\
                 vrrp_instance VI_1 {{\n  state BACKUP\n  interface {ifname}\n  \
                 virtual_router_id {VRID}\n  priority {PEER_PRIORITY}\n  advert_int {advert_int}\n  \
                 virtual_ipaddress {{\n    {VIP}/32\n  }}\n{extra}}}\n",
                name = lab.bed.name,
                ifname = lab.bed.rs_if(2),
            ),
        )
        .expect("writing keepalived.conf");
        let s = |p: PathBuf| p.to_string_lossy().into_owned();
        let (conf, pid, vrrp_pid) = (s(conf), s(file("keepalived.pid")), s(file("vrrp.pid")));
        let mut process = BackgroundProcess::spawn(
            Some(lab.bed.rs_ns(2)),
            &[
                "/usr/sbin/keepalived",
                "-n",
                "-l",
                "-D",
                "-P",
                "--no-syslog",
                "-f",
                &conf,
                "-p",
                &pid,
                "-r",
                &vrrp_pid,
            ],
        );
        process.wait_for_output(Duration::from_secs(15), "Entering BACKUP STATE");
        Keepalived { process }
    }

    fn log(&self) -> String {
        self.process.stdout_text() + &self.process.stderr_text()
    }
}

fn vip_on_rs2(lab: &AppLab) -> bool {
    lab.bed.has_addr(lab.bed.rs_ns(2), lab.bed.rs_if(2), VIP)
}

/// Polls (every [`POLL`]) until `vip_on_rs2` equals `want`; the time it took from
/// `since`, or None after `timeout`.
fn time_until_vip_on_rs2(
    lab: &AppLab,
    want: bool,
    since: Instant,
    timeout: Duration,
) -> Option<Duration> {
    wait_for(timeout, POLL, || {
        (vip_on_rs2(lab) == want).then(|| since.elapsed())
    })
}

/// Polls until Sluice reports `state`; the time it took from `since`.
fn time_until_state(
    daemon: &Daemon,
    state: &str,
    since: Instant,
    timeout: Duration,
) -> Option<Duration> {
    wait_for(timeout, POLL, || {
        (daemon.vrrp()["state"] == state).then(|| since.elapsed())
    })
}

fn stat(v: &serde_json::Value, field: &str) -> u64 {
    v["stats"][field]
        .as_u64()
        .unwrap_or_else(|| panic!("vrrp report has no numeric stats.{field}: {v}"))
}

#[test]
fn election_both_ways_with_keepalived() {
    require_root();
    let lab = lab();
    let (client_ns, client_if) = (lab.bed.client_ns(), lab.bed.client_if());
    let lb_mac = lab.bed.lb_mac().to_lowercase();
    let rs2_mac = lab.bed.rs_mac(2).to_lowercase();
    let interval_cs = 10; // 100 ms on both sides.
    let peer_down = master_down(PEER_PRIORITY, interval_cs);

    // (a) Sluice at 150 first, then keepalived at 100: Sluice master, keepalived backup.
    let mut daemon = sluice(&lab, 150, 100);
    let became = time_until_state(&daemon, "MASTER", Instant::now(), Duration::from_secs(5));
    assert!(became.is_some(), "{:#}\n{}", daemon.vrrp(), daemon.dump());
    let keepalived = Keepalived::start(&lab, "0.1");
    // keepalived would take over after its master-down interval (360 ms) without
    // Sluice's adverts: for 3 times that, the VIP never shows up on rs2.
    let deadline = Instant::now() + peer_down * 3;
    while Instant::now() < deadline {
        assert!(
            !vip_on_rs2(&lab),
            "keepalived took the VIP from a master Sluice at higher priority\n{}\n{:#}",
            keepalived.log(),
            daemon.vrrp()
        );
        std::thread::sleep(POLL);
    }
    let v = daemon.vrrp();
    eprintln!("(a) Sluice: {v}");
    assert_eq!(v["state"], "MASTER", "{v:#}");
    assert_eq!(v["vrid"], VRID);
    assert_eq!(v["priority"], 150);
    assert_eq!(v["primary"], APPLIANCE);
    assert!(stat(&v, "adverts_sent") >= 5, "{v:#}");
    assert!(stat(&v, "gratuitous_arps_sent") >= 1, "{v:#}");
    assert!(
        !keepalived.log().contains("Entering MASTER STATE"),
        "{}",
        keepalived.log()
    );
    assert!(
        daemon
            .event_lines()
            .iter()
            .any(|l| l == "lb=vrrp vrid=51 state=MASTER from=BACKUP priority=150 addresses=1"),
        "{:?}",
        daemon.event_lines()
    );
    // Only Sluice answers ARP for the VIP; the client's kernel resolves it to Sluice.
    let repliers = lab.bed.arp_repliers(client_ns, client_if, CLIENT_IP, VIP);
    assert_eq!(
        repliers,
        vec![lb_mac.clone()],
        "ARP for {VIP} while Sluice is master"
    );
    lab.prewarm(&daemon, GATEWAY);
    let t = Duration::from_secs(10);
    lab.bed
        .exec(client_ns, &["ip", "neigh", "flush", "all"], t)
        .expect_success("ip neigh flush");
    let batch = lab.curl(&format!("http://{VIP}/"), 5, 1, &[]);
    assert_eq!(batch["ok"], 5, "{batch}\n{}", lab.diagnostics());
    assert_eq!(AppLab::answers(&batch).get("rs1"), Some(&5), "{batch}");
    assert_eq!(
        lab.bed.neighbour_mac(client_ns, client_if, VIP).as_deref(),
        Some(lb_mac.as_str()),
        "the client's neighbour entry for the VIP\n{}",
        lab.diagnostics()
    );

    // (b) Sluice crashes: keepalived takes the VIP within its master-down interval.
    let killed = Instant::now();
    daemon.kill_hard();
    let took = time_until_vip_on_rs2(&lab, true, killed, Duration::from_secs(10));
    let bound = peer_down + TOLERANCE;
    eprintln!(
        "(b) SIGKILL of master Sluice -> VIP on keepalived's interface after {took:?} \
         (master down interval {peer_down:?}, bound {bound:?})"
    );
    let took =
        took.unwrap_or_else(|| panic!("keepalived never took the VIP\n{}", keepalived.log()));
    assert!(took < bound, "{took:?} >= {bound:?}\n{}", keepalived.log());
    drop(daemon);

    // (c) Sluice back at 150 with preempt: master again, keepalived drops the VIP.
    let spawned = Instant::now();
    let daemon = sluice(&lab, 150, 100);
    let ready = Instant::now();
    let dropped = time_until_vip_on_rs2(&lab, false, ready, Duration::from_secs(10));
    let master = time_until_state(&daemon, "MASTER", ready, Duration::from_secs(5));
    // Sluice starts as backup and preempts when its own master-down timer runs out.
    let own_down = master_down(150, interval_cs);
    eprintln!(
        "(c) Sluice restarted at 150 (ready {:?} after spawn): MASTER {master:?} and VIP \
         gone from keepalived {dropped:?} after ready (its master down {own_down:?})",
        ready - spawned
    );
    let dropped = dropped.unwrap_or_else(|| {
        panic!(
            "keepalived kept the VIP\n{}\n{:#}",
            keepalived.log(),
            daemon.vrrp()
        )
    });
    assert!(master.is_some(), "{:#}\n{}", daemon.vrrp(), daemon.dump());
    assert!(dropped < own_down + TOLERANCE, "{dropped:?}");
    assert_eq!(
        lab.bed.arp_repliers(client_ns, client_if, CLIENT_IP, VIP),
        vec![lb_mac.clone()],
        "ARP for {VIP} after the preemption"
    );
    // Hand over cleanly (resign) before the low-priority run.
    let stopped = Instant::now();
    daemon.stop_clean();
    let took = time_until_vip_on_rs2(&lab, true, stopped, Duration::from_secs(10));
    assert!(
        took.is_some(),
        "keepalived never took the VIP\n{}",
        keepalived.log()
    );

    // (d) Sluice at 50: backup, keepalived the master it reports, no ARP for the VIP.
    let daemon = sluice(&lab, 50, 100);
    let heard = wait_for(Duration::from_secs(5), POLL, || {
        let v = daemon.vrrp();
        (v["master"] == "198.18.0.12").then_some(v)
    });
    let v = heard.unwrap_or_else(|| {
        panic!(
            "Sluice never reported keepalived as master: {:#}\n{}",
            daemon.vrrp(),
            keepalived.log()
        )
    });
    assert_eq!(v["state"], "BACKUP", "{v:#}");
    assert_eq!(v["master_priority"], PEER_PRIORITY, "{v:#}");
    // A while later: still backup, never master (one transition: INIT -> BACKUP).
    std::thread::sleep(peer_down * 3);
    let v = daemon.vrrp();
    eprintln!("(d) Sluice at 50: {v}");
    assert_eq!(v["state"], "BACKUP", "{v:#}");
    assert_eq!(stat(&v, "transitions"), 1, "{v:#}");
    assert_eq!(stat(&v, "adverts_sent"), 0, "{v:#}");
    assert!(stat(&v, "adverts_received") >= 5, "{v:#}");
    assert!(vip_on_rs2(&lab), "{}", keepalived.log());
    let arp_before = event_count(&daemon.status(), "arp_replied");
    let repliers = lab.bed.arp_repliers(client_ns, client_if, CLIENT_IP, VIP);
    assert_eq!(
        repliers,
        vec![rs2_mac.clone()],
        "ARP for {VIP} while Sluice is backup"
    );
    lab.bed
        .exec(client_ns, &["ip", "neigh", "flush", "all"], t)
        .expect_success("ip neigh flush");
    let _ = lab
        .bed
        .exec(client_ns, &["ping", "-n", "-c", "1", "-W", "2", VIP], t);
    assert_eq!(
        lab.bed.neighbour_mac(client_ns, client_if, VIP).as_deref(),
        Some(rs2_mac.as_str()),
        "the client's neighbour entry for the VIP while Sluice is backup"
    );
    // Informational: the kernels of the bed may ARP for Sluice's own address meanwhile.
    let arp_after = event_count(&daemon.status(), "arp_replied");
    eprintln!(
        "(d) Sluice's arp_replied {arp_before} -> {arp_after} around two ARP requests for the VIP"
    );
    daemon.stop_clean();
    drop(keepalived);
}

/// A flood of costly control requests must not silence the master's adverts. Six
/// clients pipeline service changes over more connections than the control server
/// has executors, on a table of 20,000 services (each change copies and publishes
/// it), so the management loop never finds the queue empty; it answers them for a
/// bounded time per turn and runs VRRP between. Judged by keepalived, backup at a
/// 100 ms interval (it takes over 360 ms after the last advert it heard): it must stay
/// backup, and the VIP must stay off its interface, all through the flood.
#[test]
fn a_control_flood_leaves_keepalived_backup() {
    require_root();
    let lab = lab();
    let daemon = sluice(&lab, 150, 100);
    // The table first, before keepalived listens: the restore is one staged change.
    let table: String = (0..20_000u32)
        .map(|i| format!("-A -t {VIP}:{} -s rr\n", 10_000 + i))
        .collect();
    let restored = daemon.restore(&table);
    assert!(restored.success(), "{restored:?}");
    let became = time_until_state(&daemon, "MASTER", Instant::now(), Duration::from_secs(5));
    assert!(became.is_some(), "{:#}\n{}", daemon.vrrp(), daemon.dump());
    let keepalived = Keepalived::start(&lab, "0.1");
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        !keepalived.log().contains("Entering MASTER STATE"),
        "keepalived took over before the flood\n{}",
        keepalived.log()
    );
    let before = daemon.status();
    let vip: std::net::Ipv4Addr = VIP.parse().unwrap();
    let flood = ControlFlood::start(daemon.socket(), 6, vip, 40_000);
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        assert!(
            !vip_on_rs2(&lab),
            "keepalived took the VIP during the control flood\n{}\n{:#}",
            keepalived.log(),
            daemon.status()
        );
        std::thread::sleep(POLL);
    }
    let during = daemon.status();
    let answered = flood.stop();
    let management = |s: &serde_json::Value, field: &str| {
        s["management"][field]
            .as_u64()
            .unwrap_or_else(|| panic!("no management.{field} in {s:#}"))
    };
    let cut = management(&during, "control_turns_cut") - management(&before, "control_turns_cut");
    eprintln!(
        "{answered} requests answered in the flood, {cut} turns cut at the budget, longest \
         turn {} us",
        management(&during, "longest_turn_us")
    );
    assert!(
        !keepalived.log().contains("Entering MASTER STATE"),
        "{}",
        keepalived.log()
    );
    // The flood ran, and held the queue: turns were cut at the budget.
    assert!(answered >= 50, "{answered} requests answered");
    assert!(cut > 0, "{during:#}");
    assert_eq!(daemon.vrrp()["state"], "MASTER", "{:#}", daemon.vrrp());
}

#[test]
fn sigterm_resigns_and_keepalived_takes_over_after_its_skew() {
    require_root();
    let lab = lab();
    // 1 s intervals on both sides: the resign path (skew, 0.6 s) and the silent-master
    // path (at least 3 intervals after the last advert: 2.6 s or more after the
    // signal) are far apart.
    let interval_cs = 100;
    let mut daemon = sluice(&lab, 150, 1000);
    let became = time_until_state(&daemon, "MASTER", Instant::now(), Duration::from_secs(10));
    assert!(became.is_some(), "{:#}\n{}", daemon.vrrp(), daemon.dump());
    let keepalived = Keepalived::start(&lab, "1");
    // keepalived hears at least one advert, and stays backup.
    std::thread::sleep(Duration::from_millis(1500));
    assert!(!vip_on_rs2(&lab), "{}", keepalived.log());
    assert_eq!(daemon.vrrp()["state"], "MASTER");
    let sent_before = stat(&daemon.vrrp(), "adverts_sent");

    let signalled = Instant::now();
    daemon.signal(libc::SIGTERM);
    let took = time_until_vip_on_rs2(&lab, true, signalled, Duration::from_secs(10));
    let exit = daemon.wait_exit(EXIT_TIMEOUT);
    let peer_skew = skew(PEER_PRIORITY, interval_cs);
    let bound = peer_skew + TOLERANCE;
    let silent = Duration::from_millis(u64::from(2 * interval_cs) * 10) + peer_skew;
    eprintln!(
        "SIGTERM of master Sluice -> VIP on keepalived's interface after {took:?} \
         (keepalived's skew {peer_skew:?}, bound {bound:?}; a silent master: >= {silent:?})"
    );
    assert!(
        matches!(exit, Some(s) if s.success()),
        "sluice exit {exit:?}\n{}",
        daemon.dump()
    );
    let took =
        took.unwrap_or_else(|| panic!("keepalived never took the VIP\n{}", keepalived.log()));
    assert!(
        took < bound,
        "{took:?} >= {bound:?}: no resign heard?\n{}\n{}",
        keepalived.log(),
        daemon.dump()
    );
    assert!(sent_before >= 1);
    assert!(
        daemon
            .stderr_text()
            .contains("lb=vrrp vrid=51 state=INIT from=MASTER priority=150"),
        "{}",
        daemon.dump()
    );
    // keepalived took the short path because it heard the resign.
    assert!(
        keepalived
            .log()
            .contains("(VI_1) Backup received priority 0 advertisement"),
        "{}",
        keepalived.log()
    );
    drop(keepalived);
}

#[test]
fn election_both_ways_with_keepalived_in_unicast_mode() {
    require_root();
    let lab = lab();
    let interval_cs = 10; // 100 ms on both sides.
    let peer_down = master_down(PEER_PRIORITY, interval_cs);
    let unicast = "unicast = true\n";
    let rs2 = lab.bed.rs_ip(2);

    // (a) keepalived alone in unicast mode: master, the VIP on rs2.
    let keepalived = Keepalived::start_unicast(&lab, "0.1");
    let took = time_until_vip_on_rs2(&lab, true, Instant::now(), Duration::from_secs(10));
    assert!(took.is_some(), "{}", keepalived.log());

    // (b) Sluice at 50: it hears keepalived's adverts to its own address, so it stays
    // backup (taking the VIP would mean it heard nothing).
    let daemon = sluice_with(&lab, 50, 100, unicast);
    let heard = wait_for(Duration::from_secs(5), POLL, || {
        let v = daemon.vrrp();
        (v["master"] == rs2).then_some(v)
    });
    let v = heard.unwrap_or_else(|| {
        panic!(
            "Sluice never heard keepalived's unicast adverts: {:#}\n{}\n{}",
            daemon.vrrp(),
            keepalived.log(),
            daemon.dump()
        )
    });
    assert_eq!(v["unicast"], true, "{v:#}");
    std::thread::sleep(peer_down * 3);
    let v = daemon.vrrp();
    eprintln!("(b) Sluice at 50 beside keepalived in unicast mode: {v}");
    assert_eq!(v["state"], "BACKUP", "{v:#}");
    assert_eq!(stat(&v, "transitions"), 1, "{v:#}");
    assert!(stat(&v, "adverts_received") >= 5, "{v:#}");
    assert_eq!(stat(&v, "adverts_rejected"), 0, "{v:#}");
    assert!(vip_on_rs2(&lab), "{}", keepalived.log());
    daemon.stop_clean();

    // (c) Sluice at 150 preempts: keepalived hears Sluice's adverts to its address
    // (it does not listen to 224.0.0.18 in this mode) and gives the VIP up; and it
    // stays backup, its log free of complaints about them.
    // Timed from when the daemon is up, as the multicast case is: its start-up (EAL,
    // tables) is not VRRP's to answer for, and takes a second and more on a loaded
    // machine.
    let daemon = sluice_with(&lab, 150, 100, unicast);
    let ready = Instant::now();
    let dropped = time_until_vip_on_rs2(&lab, false, ready, Duration::from_secs(10));
    let own_down = master_down(150, interval_cs);
    eprintln!("(c) Sluice at 150: VIP gone from keepalived after {dropped:?} (its master down {own_down:?})");
    let dropped = dropped.unwrap_or_else(|| {
        panic!(
            "keepalived kept the VIP: it never heard Sluice\n{}\n{:#}",
            keepalived.log(),
            daemon.vrrp()
        )
    });
    assert!(dropped < own_down + TOLERANCE, "{dropped:?}");
    let deadline = Instant::now() + peer_down * 3;
    while Instant::now() < deadline {
        assert!(
            !vip_on_rs2(&lab),
            "keepalived took the VIP back\n{}",
            keepalived.log()
        );
        std::thread::sleep(POLL);
    }
    let v = daemon.vrrp();
    assert_eq!(v["state"], "MASTER", "{v:#}");
    assert!(stat(&v, "adverts_sent") >= 5, "{v:#}");
    let log = keepalived.log();
    assert!(log.contains("Entering BACKUP STATE"), "{log}");
    for complaint in ["invalid", "checksum", "not a unicast peer"] {
        assert!(
            !log.contains(complaint),
            "{complaint:?} in keepalived's log\n{log}"
        );
    }
    daemon.stop_clean();
    drop(keepalived);
}

/// Sends VRRPv3 adverts for VRID 51 at priority 254 from the client with scapy:
/// `bad` sends four, each with one defect (VRID 52, TTL 64, VRRP checksum damaged,
/// address list cut off: count 1 with no address); `good` sends one without defect.
/// All go to 224.0.0.18 / 01:00:5e:00:00:12.
const ADVERTS: &str = r#"
import sys
from scapy.all import Ether, IP, Raw, raw, sendp, conf, get_if_hwaddr
from scapy.layers.vrrp import VRRPv3
conf.verb = 0
iface, src, vip, kind = sys.argv[1:5]
mac = get_if_hwaddr(iface)
def advert(vrid=51, ttl=255):
    return raw(IP(src=src, dst="224.0.0.18", ttl=ttl, proto=112)
               / VRRPv3(vrid=vrid, priority=254, adv=300, addrlist=[vip]))
def send(ip):
    sendp(Ether(src=mac, dst="01:00:5e:00:00:12", type=0x0800) / Raw(ip), iface=iface)
if kind == "bad":
    send(advert(vrid=52))
    send(advert(ttl=64))
    damaged = bytearray(advert())
    damaged[20 + 6] ^= 0xff
    send(bytes(damaged))
    send(raw(IP(src=src, dst="224.0.0.18", ttl=255, proto=112) / Raw(advert()[20:28])))
    print(4)
else:
    send(advert())
    print(1)
"#;

/// Sluice alone on the lab's link, NAT service VIP:80 -> rs1, `[vrrp]` at priority 150
/// every 100 ms with the client as its one peer and `auth` (`key = ...` or
/// `unauthenticated = true`); returned once it is master.
fn master_alone(lab: &AppLab, auth: &str) -> Daemon {
    let toml = service_section(
        "tcp",
        VIP,
        80,
        "rr",
        &[],
        &[(lab.bed.rs_ip(1), HTTP_PORT, 1, "nat")],
    ) + &format!(
        "\n[vrrp]\nvrid = {VRID}\npriority = 150\nadvert_interval_ms = 100\npeers = [\"{}\"]\n{auth}\n",
        lab.bed.client_ip()
    );
    let daemon = lab.daemon(&[&format!("{APPLIANCE}/24")], toml);
    let became = time_until_state(&daemon, "MASTER", Instant::now(), Duration::from_secs(5));
    assert!(became.is_some(), "{:#}\n{}", daemon.vrrp(), daemon.dump());
    daemon
}

#[test]
fn malformed_and_foreign_adverts_are_rejected() {
    require_root();
    let lab = AppLab::new(1);
    let (client_ns, client_if, client_ip) = (
        lab.bed.client_ns(),
        lab.bed.client_if(),
        lab.bed.client_ip(),
    );
    let daemon = master_alone(&lab, "unauthenticated = true");
    let send_from = |src: &str, kind: &str| {
        lab.bed
            .exec(
                client_ns,
                &[PYTHON, "-c", ADVERTS, client_if, src, VIP, kind],
                Duration::from_secs(30),
            )
            .expect_success("scapy adverts");
    };
    let send = |kind: &str| send_from(client_ip, kind);

    let before = daemon.vrrp();
    assert_eq!(
        before["peers"],
        serde_json::json!([client_ip]),
        "{before:#}"
    );
    send("bad");
    let rejected_before = stat(&before, "adverts_rejected");
    let counted = wait_for(Duration::from_secs(3), POLL, || {
        let v = daemon.vrrp();
        (stat(&v, "adverts_rejected") >= rejected_before + 4).then_some(v)
    });
    // Anything still on its way is counted too before the final look.
    std::thread::sleep(Duration::from_millis(300));
    let after = daemon.vrrp();
    eprintln!("before the bad adverts: {before}\nafter: {after}");
    assert!(
        counted.is_some(),
        "not all 4 bad adverts were rejected: {after:#}\n{:#}",
        daemon.status()
    );
    assert_eq!(
        stat(&after, "adverts_rejected"),
        rejected_before + 4,
        "{after:#}"
    );
    assert_eq!(
        stat(&after, "adverts_received"),
        stat(&before, "adverts_received"),
        "{after:#}"
    );
    assert_eq!(after["state"], "MASTER", "{after:#}");
    assert_eq!(
        stat(&after, "transitions"),
        stat(&before, "transitions"),
        "{after:#}"
    );
    assert!(after["master"].is_null(), "{after:#}");

    // The advert without a defect, from an address that is not a peer's: the worker
    // drops it (VRRPv3 has no authentication; the peer list is what stands in for it).
    let strangers_before = drop_count(&daemon.status(), "not_a_peer");
    send_from(STRANGER, "good");
    let dropped = wait_for(Duration::from_secs(3), POLL, || {
        (drop_count(&daemon.status(), "not_a_peer") > strangers_before).then_some(())
    });
    std::thread::sleep(Duration::from_millis(300));
    let after = daemon.vrrp();
    assert!(
        dropped.is_some(),
        "a stranger's advert was not dropped as not_a_peer: {:#}",
        daemon.status()
    );
    assert_eq!(
        drop_count(&daemon.status(), "not_a_peer"),
        strangers_before + 1
    );
    assert_eq!(after["state"], "MASTER", "{after:#}");
    assert_eq!(
        stat(&after, "adverts_received"),
        stat(&before, "adverts_received"),
        "{after:#}"
    );
    assert_eq!(
        stat(&after, "adverts_rejected"),
        rejected_before + 4,
        "{after:#}"
    );

    // The same advert from the peer wins (254 > 150): the checks above can fail.
    send("good");
    let backup = wait_for(Duration::from_secs(3), POLL, || {
        let v = daemon.vrrp();
        (v["state"] == "BACKUP").then_some(v)
    });
    let v = backup.unwrap_or_else(|| {
        panic!(
            "a valid advert at priority 254 did not make Sluice backup: {:#}",
            daemon.vrrp()
        )
    });
    eprintln!("after the good advert: {v}");
    assert_eq!(v["master"], client_ip, "{v:#}");
    assert_eq!(v["master_priority"], 254, "{v:#}");
    assert_eq!(
        stat(&v, "adverts_received"),
        stat(&after, "adverts_received") + 1
    );
    assert_eq!(stat(&v, "adverts_rejected"), rejected_before + 4);
    daemon.stop_clean();
}

/// Adverts sealed as docs/CONFIG.md (`[vrrp] key`) describes Sluice's trailer, written
/// from that description with Python's own HMAC: `IFACE SRC VIP KEYHEX KIND`. Kinds:
/// `verify` (checks one advert of SRC captured on IFACE and prints `verified`), `twice`
/// (one sealed advert, then the same bytes again), `unsealed`, `forged` (another key),
/// `stale` (a counter 120 s old).
const SEALED: &str = r#"
import sys, time, hmac, hashlib, struct, socket
from scapy.all import Ether, IP, Raw, raw, sendp, sniff, conf, get_if_hwaddr
from scapy.layers.vrrp import VRRPv3
from scapy.utils import checksum
conf.verb = 0
iface, src, vip, key_hex, kind = sys.argv[1:6]
key = bytes.fromhex(key_hex)
GROUP = "224.0.0.18"
def pseudo(s, d, n):
    return socket.inet_aton(s) + socket.inet_aton(d) + struct.pack("!BBH", 0, 112, n)
def signed(s, d, payload):
    head = bytearray(payload[:-32])
    head[6:8] = b"\0\0"
    return b"SLVA" + socket.inet_aton(s) + socket.inet_aton(d) + bytes(head)
def advert():
    return raw(IP(src=src, dst=GROUP, ttl=255, proto=112)
               / VRRPv3(vrid=51, priority=254, adv=100, addrlist=[vip]))[20:]
def sealed(key, counter):
    msg = advert()
    payload = bytearray(msg + b"SLVA" + struct.pack("!Q", counter) + bytes(32))
    payload[-32:] = hmac.new(key, signed(src, GROUP, payload), hashlib.sha256).digest()
    payload[6:8] = b"\0\0"
    payload[6:8] = struct.pack("!H", checksum(pseudo(src, GROUP, len(payload)) + bytes(payload)))
    return bytes(payload)
def send(payload):
    sendp(Ether(src=get_if_hwaddr(iface), dst="01:00:5e:00:00:12", type=0x0800)
          / IP(src=src, dst=GROUP, ttl=255, proto=112) / Raw(payload), iface=iface)
now = int(time.time() * 1e6)
if kind == "verify":
    got = sniff(iface=iface, filter="ip proto 112 and src host " + src, count=1, timeout=5)
    ip = got[0][IP]
    payload = bytes(ip.payload)
    assert payload[-44:-40] == b"SLVA", payload.hex()
    assert checksum(pseudo(ip.src, ip.dst, len(payload)) + payload) == 0, "checksum"
    tag = hmac.new(key, signed(ip.src, ip.dst, payload), hashlib.sha256).digest()
    assert hmac.compare_digest(tag, payload[-32:]), "tag"
    counter = struct.unpack("!Q", payload[-40:-32])[0]
    assert abs(counter - now) < 10_000_000, (counter, now)
    print("verified")
elif kind == "twice":
    p = sealed(key, now)
    send(p)
    time.sleep(0.3)
    send(p)
elif kind == "unsealed":
    send(advert())
elif kind == "forged":
    send(sealed(bytes(range(32)), now))
elif kind == "stale":
    send(sealed(key, now - 120_000_000))
"#;

#[test]
fn sealed_adverts_count_once_and_unsealed_forged_replayed_or_stale_ones_never() {
    require_root();
    const KEY: &str = "6b6579206f66207468652067726f7570206f6620736c75696365206e6f646573";
    let lab = AppLab::new(1);
    let (client_ns, client_if, client_ip) = (
        lab.bed.client_ns(),
        lab.bed.client_if(),
        lab.bed.client_ip(),
    );
    let daemon = master_alone(&lab, &format!("key = \"{KEY}\""));
    assert_eq!(daemon.vrrp()["authenticated"], true);
    let run = |src: &str, kind: &str| {
        lab.bed
            .exec(
                client_ns,
                &[PYTHON, "-c", SEALED, client_if, src, VIP, KEY, kind],
                Duration::from_secs(30),
            )
            .expect_success("sealed adverts")
    };
    // Sluice's own adverts, checked by the script's HMAC.
    let verified = run(APPLIANCE, "verify");
    assert_eq!(verified.stdout.trim(), "verified", "{verified:?}");

    // Each refused kind, counted under its reason; none moves Sluice off MASTER.
    let refused = |kind: &str, field: &str| {
        let before = daemon.vrrp();
        run(client_ip, kind);
        let counted = wait_for(Duration::from_secs(3), POLL, || {
            let v = daemon.vrrp();
            (stat(&v, field) > stat(&before, field)).then_some(v)
        });
        std::thread::sleep(Duration::from_millis(300));
        let after = daemon.vrrp();
        assert!(
            counted.is_some(),
            "{kind}: not counted as {field}: {after:#}"
        );
        assert_eq!(
            stat(&after, field),
            stat(&before, field) + 1,
            "{kind}: {after:#}"
        );
        assert_eq!(after["state"], "MASTER", "{kind}: {after:#}");
        assert_eq!(
            stat(&after, "adverts_received"),
            stat(&before, "adverts_received"),
            "{kind}: {after:#}"
        );
        assert_eq!(stat(&after, "transitions"), stat(&before, "transitions"));
    };
    refused("unsealed", "adverts_bad_auth");
    refused("forged", "adverts_bad_auth");
    refused("stale", "adverts_clock_skew");
    // The peer's first refusal is in the event log, the next two are not (once a
    // minute per peer).
    let refusals = || -> Vec<String> {
        let from = format!("op=refused from={client_ip} reason=");
        daemon
            .event_lines()
            .into_iter()
            .filter(|l| l.contains(&from))
            .collect()
    };
    let logged = refusals();
    assert_eq!(logged.len(), 1, "{logged:#?}");
    assert!(
        logged[0].contains("reason=bad_auth: no trailer, or a tag not made with this node's key"),
        "{logged:#?}"
    );

    // Sealed with the key: believed once (254 beats 150), refused the second time.
    let before = daemon.vrrp();
    run(client_ip, "twice");
    let replayed = wait_for(Duration::from_secs(3), POLL, || {
        let v = daemon.vrrp();
        (stat(&v, "adverts_replayed") > stat(&before, "adverts_replayed")).then_some(v)
    });
    let v =
        replayed.unwrap_or_else(|| panic!("the second copy was not refused: {:#}", daemon.vrrp()));
    eprintln!("after a sealed advert and its copy: {v}");
    assert_eq!(v["state"], "BACKUP", "{v:#}");
    assert_eq!(v["master"], client_ip, "{v:#}");
    assert_eq!(v["master_priority"], 254, "{v:#}");
    assert_eq!(
        stat(&v, "adverts_received"),
        stat(&before, "adverts_received") + 1
    );
    assert_eq!(
        stat(&v, "adverts_replayed"),
        stat(&before, "adverts_replayed") + 1
    );
    // Within the minute, the replay's refusal is counted, not logged.
    let logged = refusals();
    assert_eq!(logged.len(), 1, "{logged:#?}");
    // A clock 120 s behind, now that the peer is known: a replay, 120 s behind.
    run(client_ip, "stale");
    let stale = wait_for(Duration::from_secs(3), POLL, || {
        let v = daemon.vrrp();
        (stat(&v, "adverts_replayed") == stat(&before, "adverts_replayed") + 2).then_some(v)
    });
    assert!(stale.is_some(), "{:#}", daemon.vrrp());
    daemon.stop_clean();
}
