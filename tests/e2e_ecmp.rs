//! Tier 3, an ECMP cluster of three Sluice nodes behind a BIRD router (docs/CLUSTER.md,
//! "ECMP across nodes"), all real processes in namespaces of one test bed (3 real
//! servers):
//!
//! - the router `NAME-rt`: veth `NAME-rtv` (198.18.0.254) on the bed's switch, and the
//!   client's link (`NAME-pc`, taken off the switch: 198.18.2.1, the client
//!   198.18.2.100 behind it); BIRD with config/bird-router.conf (one `bgp` protocol per
//!   node, `merge paths on`), IP forwarding, `fib_multipath_hash_policy=1`;
//! - three nodes, `NAME-lb`, `NAME-lb2` (`testbed.sh lb2`) and `NAME-lb3` (built here
//!   the same way), each Sluice on its veth (net_af_packet, one worker, idle sleep)
//!   with `[ports.exception] kind = "tap"`, the node's address (198.18.0.1..3) on the
//!   tap, and BIRD (config/bird-node.conf) in the node's namespace peering with the
//!   router through the tap, that is through Sluice's port; BFD 100 ms x 3;
//! - three DR real servers (VIP on lo, `testbed.sh dr-vip`) running `e2e_apps.py serve
//!   --echo`, replying to the client through the router.
//!
//! The service 198.18.1.1:7000 schedules by `mh` (`mh-port`) with `sloppy_tcp`, and
//! the nodes share nothing: no sync. The client opens 150 long-lived connections (a
//! request every 200 ms each; each answer names its real server, which must not
//! change). Checked, in order:
//!
//! 1. the router's kernel route to the VIP has three next hops, and every node holds
//!    sessions (ECMP spreads the flows);
//! 2. `kill -9` of Sluice on node 1 (its BIRD runs on, but its BGP and BFD went
//!    through Sluice's port): the router's route drops to two next hops (BFD, within
//!    2 s), the flows ECMP moves to the other two nodes open sessions there from
//!    mid-connection segments, to the same real servers;
//! 3. Sluice on node 1 started again (a new tap, the same BIRD): BIRD's session comes
//!    back, the VIP is announced (three next hops), and the flows ECMP moves back to
//!    node 1 open sessions there;
//! 4. `sluicectl drain` on node 2: two next hops again, no connection breaks.
//!
//! Asserted: >= 99% of the connections survive the whole run (at most 1 of 150), none
//! breaks after the kill's phase, the largest gap around the kill is under 1 s (3 s
//! in the later phases, where only CPU contention stalls a connection).
//! Printed: the time of each route change, the connections lost and the largest gaps
//! per phase (the client lists every gap over two request intervals), each node's
//! sessions and drops.
//!
//! About 19 s (17.9-19.2 s measured on the shared 2-core machine). Run:
//! `cargo test --release --test integration e2e_ecmp:: -- --nocapture` (as root).

use crate::common::*;
use crate::e2e_bgp::{birdc, sample, start_bird};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

const VIP: &str = "198.18.1.1";
const PORT: u16 = 7000;
const ROUTER: &str = "198.18.0.254";
const CLIENT: &str = "198.18.2.100/24";
const CLIENT_GATEWAY: &str = "198.18.2.1";
const NODES: [&str; 3] = ["198.18.0.1", "198.18.0.2", "198.18.0.3"];
/// The addresses in the sample BIRD configs (node, router), replaced by the test's.
const SAMPLE_NODE: &str = "198.19.77.1";
const SAMPLE_ROUTER: &str = "198.19.77.2";
const SAMPLE_INCLUDE: &str = "/run/sluice/bird-vips*.conf";
const LONG: usize = 150;
const INTERVAL_MS: u32 = 200;
/// The largest gap a connection may see (BFD 3 x 100 ms, then BIRD and the kernel).
const TARGET: Duration = Duration::from_secs(1);
/// The loose bound on gaps in the restart and drain phases, where nothing but
/// scheduling delays a segment (see the end of the test).
const SLOW_GAP: Duration = Duration::from_secs(3);
/// How long a route change may take to reach the router's kernel on a shared 2-core
/// machine (a BGP session's first establishment included).
const ROUTE_BOUND: Duration = Duration::from_secs(15);
/// BFD's 300 ms with room for a busy machine; BGP's hold time is 9 s.
const BFD_BOUND: Duration = Duration::from_secs(2);
/// Time each phase leaves the connections to run after its route change.
const SETTLE: Duration = Duration::from_secs(3);

/// One node's fixed parts: its namespace, its veth on the switch, its address, and
/// where its BIRD's files go.
struct NodeSite {
    ns: String,
    iface: String,
    addr: &'static str,
    dir: PathBuf,
}

impl NodeSite {
    fn include(&self) -> PathBuf {
        self.dir.join("bird-vips.conf")
    }

    /// The node BIRD's control socket (`start_bird`'s name for "node").
    fn ctl(&self) -> PathBuf {
        self.dir.join("node.ctl")
    }
}

/// A running node: Sluice and its BIRD (the daemon drops first: declared first;
/// BIRD is only kept running).
struct Node {
    daemon: Daemon,
    _bird: BackgroundProcess,
}

fn run(args: &[&str]) {
    run_bounded(
        std::process::Command::new(args[0]).args(&args[1..]),
        Duration::from_secs(10),
    )
    .expect_success(&args.join(" "));
}

fn ns_run(ns: &str, args: &[&str]) {
    netns_exec(ns, args, Duration::from_secs(10)).expect_success(&args.join(" "));
}

/// Offloads off on a veth end, as testbed.sh does for its own.
fn offloads_off(ns: &str, ifname: &str) {
    ns_run(
        ns,
        &[
            "ethtool", "-K", ifname, "tx", "off", "tso", "off", "gso", "off", "gro", "off",
        ],
    );
}

/// A namespace of the bed (`NAME-SUFFIX`, removed by `testbed.sh down`) with veth
/// `ifname` on the switch (bridge port `port`), IPv6 off.
fn on_switch(bed: &Testbed, suffix: &str, ifname: &str, port: &str) -> String {
    let ns = format!("{}-{suffix}", bed.name);
    let sw = format!("{}-sw", bed.name);
    run(&["ip", "netns", "add", &ns]);
    ns_run(&ns, &["ip", "link", "set", "lo", "up"]);
    for s in [
        "net.ipv6.conf.all.disable_ipv6=1",
        "net.ipv6.conf.default.disable_ipv6=1",
    ] {
        ns_run(&ns, &["sysctl", "-qw", s]);
    }
    run(&[
        "ip", "link", "add", ifname, "netns", &ns, "type", "veth", "peer", "name", port, "netns",
        &sw,
    ]);
    offloads_off(&ns, ifname);
    offloads_off(&sw, port);
    ns_run(
        &sw,
        &[
            "ip",
            "link",
            "set",
            port,
            "master",
            &format!("{}-br", bed.name),
        ],
    );
    ns_run(&sw, &["ip", "link", "set", port, "up"]);
    ns_run(&ns, &["ip", "link", "set", ifname, "up"]);
    ns
}

/// The third node's namespace, built like testbed.sh's appliance namespaces: veth up
/// without an address, forwarding off, arp_ignore=8.
fn third_node(bed: &Testbed) -> (String, String) {
    let iface = format!("{}-lb3v", bed.name);
    let ns = on_switch(bed, "lb3", &iface, &format!("{}-plb3", bed.name));
    for s in [
        "net.ipv4.conf.all.forwarding=0".to_string(),
        format!("net.ipv4.conf.{iface}.arp_ignore=8"),
    ] {
        ns_run(&ns, &["sysctl", "-qw", &s]);
    }
    (ns, iface)
}

/// The router between the client and the switch: `NAME-rt` with `NAME-rtv` on the
/// switch and the client's own veth end, moved off the switch into it.
fn router(bed: &mut Testbed) -> String {
    let name = bed.name.clone();
    let rtv = format!("{name}-rtv");
    let rt = on_switch(bed, "rt", &rtv, &format!("{name}-prt"));
    let pc = format!("{name}-pc");
    let sw = format!("{name}-sw");
    ns_run(&sw, &["ip", "link", "set", &pc, "nomaster"]);
    ns_run(&sw, &["ip", "link", "set", &pc, "netns", &rt]);
    for s in [
        "net.ipv4.ip_forward=1",
        // Flows spread by their ports too, not only by their addresses: the client
        // has one address.
        "net.ipv4.fib_multipath_hash_policy=1",
    ] {
        ns_run(&rt, &["sysctl", "-qw", s]);
    }
    ns_run(
        &rt,
        &["ip", "addr", "add", &format!("{ROUTER}/24"), "dev", &rtv],
    );
    ns_run(
        &rt,
        &[
            "ip",
            "addr",
            "add",
            &format!("{CLIENT_GATEWAY}/24"),
            "dev",
            &pc,
        ],
    );
    ns_run(&rt, &["ip", "link", "set", &pc, "up"]);
    bed.configure("client-addr", &[CLIENT, CLIENT_GATEWAY]);
    // The real servers answer the client (DR) through the router.
    bed.configure("rs-gateway", &[ROUTER]);
    rt
}

/// config/bird-router.conf with the test's addresses and one protocol per node.
fn router_conf() -> String {
    let conf = sample("bird-router.conf");
    let first = format!("protocol bgp node1 from node {{\n  local {SAMPLE_ROUTER};\n  neighbor {SAMPLE_NODE} as 65001;\n}}");
    assert!(conf.contains(&first), "config/bird-router.conf changed");
    let mut conf = conf
        .replace(SAMPLE_ROUTER, ROUTER)
        .replace(SAMPLE_NODE, NODES[0]);
    for (i, addr) in NODES.iter().enumerate().skip(1) {
        conf.push_str(&format!(
            "\nprotocol bgp node{} from node {{\n  local {ROUTER};\n  neighbor {addr} as 65001;\n}}\n",
            i + 1
        ));
    }
    conf
}

/// config/bird-node.conf for a node: its address, the router's, its include pattern
/// (matching the file Sluice writes, [`NodeSite::include`]).
fn node_conf(site: &NodeSite) -> String {
    let conf = sample("bird-node.conf");
    assert!(conf.contains(SAMPLE_INCLUDE) && conf.contains(SAMPLE_NODE));
    let pattern = site.dir.join("bird-vips*.conf");
    conf.replace(SAMPLE_INCLUDE, pattern.to_str().unwrap())
        .replace(SAMPLE_NODE, site.addr)
        .replace(SAMPLE_ROUTER, ROUTER)
}

/// Starts Sluice on the node, then the node's BIRD (which announces the VIP).
fn start_node(lab: &AppLab, site: &NodeSite, rs: &[String]) -> Node {
    let daemon = start_sluice(lab, site, rs);
    let (bird, ctl) = start_bird(&site.ns, &site.dir, "node", &node_conf(site));
    assert_eq!(ctl, site.ctl());
    Node {
        daemon,
        _bird: bird,
    }
}

/// Starts Sluice on the node (tap exception path, `[bgp]` pointing at the node's
/// BIRD), puts the node's address on the tap and lets Sluice learn the real
/// servers' MACs.
fn start_sluice(lab: &AppLab, site: &NodeSite, rs: &[String]) -> Daemon {
    std::fs::create_dir_all(&site.dir).unwrap();
    let ctl = site.ctl();
    let servers: Vec<(&str, u16, u32, &str)> =
        rs.iter().map(|ip| (ip.as_str(), PORT, 1, "dr")).collect();
    let extra = vec!["sloppy_tcp = true\nscheduler_flags = \"mh-port\"".to_string()];
    let toml = format!(
        "[bgp]\ninclude = \"{}\"\nsocket = \"{}\"\npoll_ms = 500\nretry_ms = 200\ntimeout_ms = 3000\n\
         shutdown_grace_ms = 0\n\n{}",
        site.include().display(),
        ctl.display(),
        service_section("tcp", VIP, PORT, "mh", &extra, &servers)
    );
    let mut cfg = DaemonConfig::new(vec![PortSpec::vdev(
        "lan0",
        &format!("net_af_packet0,iface={}", site.iface),
        &[&format!("{}/24", site.addr)],
    )])
    .in_netns(&site.ns);
    cfg.idle_sleep_us = 100;
    cfg.ports[0].exception = vec!["kind = \"tap\"".into()];
    cfg.extra_toml.push(toml);
    let daemon = Daemon::start(cfg);
    let tap = port(&daemon.status(), "lan0")["exception"]["interface"]
        .as_str()
        .unwrap_or_else(|| panic!("no exception interface: {}", daemon.dump()))
        .to_string();
    ns_run(
        &site.ns,
        &[
            "ip",
            "addr",
            "add",
            &format!("{}/24", site.addr),
            "dev",
            &tap,
        ],
    );
    // Frames on the veth reach this kernel too (af_packet only copies them): strict
    // reverse-path filtering drops them there, since the router is behind the tap,
    // so BIRD sees each segment once, through Sluice.
    ns_run(
        &site.ns,
        &[
            "sysctl",
            "-qw",
            &format!("net.ipv4.conf.{}.rp_filter=1", site.iface),
        ],
    );
    warm(lab, &daemon, site.addr);
    daemon
}

/// Each real server pings the node's address, so Sluice knows their MACs.
fn warm(lab: &AppLab, daemon: &Daemon, addr: &str) {
    for i in 1..=lab.bed.rs_count() {
        let ping = lab.bed.exec(
            lab.bed.rs_ns(i),
            &["ping", "-n", "-c", "1", "-W", "2", addr],
            Duration::from_secs(10),
        );
        assert!(
            ping.success(),
            "real server {i} cannot ping {addr}: {}\n{}",
            ping.describe(),
            daemon.dump()
        );
    }
}

/// The next hops of the router's kernel route to the VIP (`ip route show VIP`: one
/// `via` for a single path, one `nexthop via` line per path of a multipath route).
fn next_hops(rt: &str) -> Vec<String> {
    let out = netns_exec(rt, &["ip", "route", "show", VIP], Duration::from_secs(5))
        .expect_success("ip route show");
    let words: Vec<&str> = out.stdout.split_whitespace().collect();
    let mut hops: Vec<String> = words
        .windows(2)
        .filter(|w| w[0] == "via")
        .map(|w| w[1].to_string())
        .collect();
    hops.sort();
    hops
}

/// Waits until the router's route to the VIP has exactly `want` as next hops; the
/// time since `start` (the event's) when it had.
fn wait_hops(
    rt: &str,
    want: &[&str],
    start: Instant,
    what: &str,
    dump: &dyn Fn() -> String,
) -> Duration {
    let mut want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
    want.sort();
    wait_for(ROUTE_BOUND, Duration::from_millis(20), || {
        (next_hops(rt) == want).then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "{what}: the router's next hops for {VIP} are {:?}, expected {want:?} within \
             {ROUTE_BOUND:?}\n{}",
            next_hops(rt),
            dump()
        )
    });
    let took = start.elapsed();
    eprintln!("{what}: router's next hops {want:?} after {took:?}");
    took
}

/// The wall-clock bounds of the run's phases, for telling losses and gaps apart.
struct Phases(Vec<(&'static str, f64)>);

impl Phases {
    fn of(&self, t: f64) -> &'static str {
        self.0
            .iter()
            .rev()
            .find(|(_, start)| t >= *start)
            .map_or("before", |(name, _)| name)
    }
}

fn sessions(node: &Node) -> u64 {
    session_count(&node.daemon.status())
}

// ---------------------------------------------------------------------------------

#[test]
fn three_nodes_behind_an_ecmp_router_keep_connections_through_a_kill_a_restart_and_a_drain() {
    require_root();
    let started = Instant::now();
    let mut lab = AppLab::new(3);
    lab.bed.configure("dr-vip", &[VIP]);
    lab.bed.configure("lb2", &[]);
    let (lb3_ns, lb3_if) = third_node(&lab.bed);
    let rt = router(&mut lab.bed);
    let echo = format!("0.0.0.0:{PORT}");
    lab.start_servers_listening(&[("--echo", echo.as_str())]);
    let rs: Vec<String> = (1..=3).map(|i| lab.bed.rs_ip(i).to_string()).collect();

    let dir = lab.dir.path().to_path_buf();
    let (_router_bird, router_ctl) = start_bird(&rt, &dir, "router", &router_conf());
    let sites: Vec<NodeSite> = [
        (lab.bed.lb_ns().to_string(), lab.bed.lb_if().to_string()),
        (
            lab.bed.fact("LB2_NS").to_string(),
            lab.bed.fact("LB2_IF").to_string(),
        ),
        (lb3_ns, lb3_if),
    ]
    .into_iter()
    .zip(NODES)
    .enumerate()
    .map(|(i, ((ns, iface), addr))| NodeSite {
        ns,
        iface,
        addr,
        dir: dir.join(format!("node{}", i + 1)),
    })
    .collect();
    let mut nodes: Vec<Node> = sites.iter().map(|s| start_node(&lab, s, &rs)).collect();
    let dump = |nodes: &[Node]| {
        let mut s = format!(
            "router: {}\n{}",
            birdc(&router_ctl, &["show", "protocols"]),
            birdc(&router_ctl, &["show", "route", "all"])
        );
        for (i, n) in nodes.iter().enumerate() {
            s += &format!(
                "node {}: {}\n{}\n",
                i + 1,
                n.daemon.ctl(&["cluster"]).stdout,
                n.daemon.ctl(&["status"]).stdout
            );
        }
        s
    };

    // 1. Three next hops; the connections spread over the three nodes.
    wait_hops(&rt, &NODES, Instant::now(), "three nodes up", &|| {
        dump(&nodes)
    });
    // BFD comes up after BGP (BIRD starts it for an established session): without
    // it, the kill below would wait for the hold time.
    let bfd_up = |s: &str| {
        s.lines()
            .filter(|l| l.contains(" Up ") && l.contains("0.100") && l.contains("0.300"))
            .count()
    };
    let bfd = wait_for(Duration::from_secs(10), Duration::from_millis(100), || {
        let s = birdc(&router_ctl, &["show", "bfd", "sessions"]);
        (bfd_up(&s) == 3).then_some(s)
    })
    .unwrap_or_else(|| {
        panic!(
            "three BFD sessions up at 100 ms x 3 on the router:\n{}",
            birdc(&router_ctl, &["show", "bfd", "sessions"])
        )
    });
    eprintln!("{bfd}");
    let (long_s, interval_s) = (LONG.to_string(), INTERVAL_MS.to_string());
    let client = lab.stream(
        "ecmp",
        VIP,
        PORT,
        &[
            "--long",
            &long_s,
            "--interval-ms",
            &interval_s,
            "--new-per-s",
            "0",
            "--duration",
            "60",
            "--timeout",
            "5",
        ],
    );
    let opened_wall = wall_now();
    std::thread::sleep(Duration::from_secs(1));
    let spread: Vec<u64> = nodes.iter().map(sessions).collect();
    eprintln!("sessions per node with {LONG} connections open: {spread:?}");
    assert!(
        spread.iter().all(|&n| n > 0),
        "ECMP did not spread the flows over the three nodes: {spread:?}\n{}",
        dump(&nodes)
    );

    // 2. kill -9 of Sluice on node 1: its BIRD stays, but its BGP and BFD ran through
    // Sluice's port; the router's BFD takes the route away.
    let (killed_wall, killed) = (wall_now(), Instant::now());
    nodes[0].daemon.kill_hard();
    let withdrawn = wait_hops(&rt, &NODES[1..], killed, "node 1 killed", &|| dump(&nodes));
    // BFD's doing, not BGP's hold time (9 s): nothing else tells the router.
    assert!(
        withdrawn < BFD_BOUND,
        "the route to the dead node went after {withdrawn:?}, not within {BFD_BOUND:?}"
    );
    std::thread::sleep(SETTLE);
    let after_kill: Vec<u64> = nodes[1..].iter().map(sessions).collect();
    eprintln!("sessions on nodes 2 and 3 after the kill: {after_kill:?} (before {spread:?})");

    // 3. Sluice back on node 1 (a new tap; the same BIRD): it announces again, and
    // the flows ECMP moves back open there.
    let (restarted_wall, restarted) = (wall_now(), Instant::now());
    nodes[0].daemon = start_sluice(&lab, &sites[0], &rs);
    let announced = wait_hops(&rt, &NODES, restarted, "node 1 restarted", &|| dump(&nodes));
    std::thread::sleep(SETTLE);
    let back = sessions(&nodes[0]);
    eprintln!("sessions on the restarted node 1: {back}");
    assert!(
        back > 0,
        "no flow came back to the restarted node 1\n{}",
        dump(&nodes)
    );

    // 4. Drain node 2: its route goes, nothing breaks.
    let (drained_wall, drain_start) = (wall_now(), Instant::now());
    nodes[1]
        .daemon
        .ctl(&["drain"])
        .expect_success("sluicectl drain");
    let drained = wait_hops(
        &rt,
        &[NODES[0], NODES[2]],
        drain_start,
        "node 2 drained",
        &|| dump(&nodes),
    );
    let cluster = nodes[1].daemon.ctl(&["cluster", "--json"]);
    let cluster: serde_json::Value = serde_json::from_str(&cluster.stdout)
        .unwrap_or_else(|e| panic!("sluicectl cluster --json ({e}): {}", cluster.describe()));
    let vip = cluster["vips"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["vip"] == VIP))
        .unwrap_or_else(|| panic!("no {VIP} in {cluster}"));
    assert_eq!(vip["reason"], "draining", "{cluster}");
    std::thread::sleep(SETTLE);
    let report = client.stop_and_report();
    let stopped_wall = wall_now();

    let phases = Phases(vec![
        ("open", opened_wall),
        ("kill", killed_wall),
        ("restart", restarted_wall),
        ("drain", drained_wall),
    ]);
    let long = report["long"].as_array().expect("long connections");
    assert_eq!(long.len(), LONG);
    let mut lost: Vec<String> = Vec::new();
    let mut lost_after_kill = 0;
    // Per phase (the one in which the request that went unanswered was sent): the
    // largest gap and how many connections had one of at least TARGET.
    let mut gaps: BTreeMap<&str, (f64, usize)> = BTreeMap::new();
    for (i, l) in long.iter().enumerate() {
        let fails = l["failures"].as_array().unwrap();
        let last = l["last_answer"].as_f64().unwrap_or(0.0);
        if !fails.is_empty() || last < stopped_wall - 2.0 {
            let when = l["t_failed"].as_f64().unwrap_or(last);
            let phase = phases.of(when);
            if phase == "restart" || phase == "drain" {
                lost_after_kill += 1;
            }
            lost.push(format!(
                "L{i} ({}) in the {phase} phase: {fails:?}, last answer {:.3} s after the kill",
                l["server"],
                last - killed_wall
            ));
            continue;
        }
        let mut worst: BTreeMap<&str, f64> = BTreeMap::new();
        for g in l["gaps"].as_array().unwrap() {
            let (from, to) = (g[0].as_f64().unwrap(), g[1].as_f64().unwrap());
            // The phase in which the request after the last answer went out.
            let sent = from + f64::from(INTERVAL_MS) / 1000.0;
            let w = worst.entry(phases.of(sent)).or_default();
            *w = w.max(to - from);
        }
        for (phase, gap) in worst {
            let e = gaps.entry(phase).or_default();
            e.0 = e.0.max(gap);
            e.1 += usize::from(gap >= TARGET.as_secs_f64());
        }
    }
    let survived = LONG - lost.len();
    let gap_of = |phase: &str| gaps.get(phase).map_or(0.0, |g| g.0);
    eprintln!(
        "ECMP cluster: {survived}/{LONG} connections survived (kill, restart, drain); \
         route withdrawn {withdrawn:?} after the kill, re-announced {announced:?} after the \
         restart began, withdrawn {drained:?} after the drain; per phase (where a gap's first unanswered request went out): \
         (largest gap s, connections with a gap >= {TARGET:?}) {gaps:?}; {} requests answered; test so far {:?}",
        long.iter().map(|l| l["ok"].as_u64().unwrap()).sum::<u64>(),
        started.elapsed()
    );
    for l in &lost {
        eprintln!("lost: {l}");
    }
    for (i, n) in nodes.iter().enumerate() {
        let st = n.daemon.status();
        let drops: BTreeMap<String, u64> = st["drops"]
            .as_object()
            .map(|m| {
                m.iter()
                    .filter_map(|(k, v)| v.as_u64().filter(|n| *n > 0).map(|n| (k.clone(), n)))
                    .collect()
            })
            .unwrap_or_default();
        eprintln!(
            "node {}: sessions {}, rx {} (missed {}), drops {drops:?}",
            i + 1,
            session_count(&st),
            port_counter(&st, "lan0", "rx_packets"),
            port_counter(&st, "lan0", "rx_missed"),
        );
    }
    assert!(
        survived * 100 >= LONG * 99,
        "{} of {LONG} connections lost:\n{}\n{}",
        lost.len(),
        lost.join("\n"),
        dump(&nodes)
    );
    assert_eq!(
        lost_after_kill,
        0,
        "connections broke on the restart or the drain:\n{}",
        lost.join("\n")
    );
    // Nothing happens before the kill but the connections running: a gap there counts
    // against the kill's bound too.
    let kill_gap = gap_of("open").max(gap_of("kill"));
    assert!(
        kill_gap < TARGET.as_secs_f64(),
        "largest gap around the kill {kill_gap:.3} s >= {TARGET:?} ({gaps:?})"
    );
    // In the runs measured no node dropped or missed a frame, yet one run beside other
    // tests saw 2.0-2.6 s gaps in the restart and drain phases, where no route change
    // loses a segment: the shared CPUs (a starved client, server or worker, then TCP's
    // backoff). Measured and printed, bounded loosely.
    for phase in ["restart", "drain"] {
        assert!(
            gap_of(phase) < SLOW_GAP.as_secs_f64(),
            "largest gap in the {phase} phase {:.3} s >= {SLOW_GAP:?} ({gaps:?})",
            gap_of(phase)
        );
    }
    // SIGTERM: each node withdraws (BIRD accepts), exits 0 and cleans up.
    for n in nodes {
        n.daemon.stop_clean();
    }
}
