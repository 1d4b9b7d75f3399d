//! Tier 3, BGP announcements through BIRD 2 (docs/CLUSTER.md) with real BIRD processes
//! in namespaces: the NAT test bed with one real server (`e2e_apps.py serve --http`),
//! Sluice in the bed's appliance namespace, and next to it
//!
//! - a node BIRD in the same namespace (config/bird-node.conf as it is, its include
//!   pattern moved into the test's directory; started before Sluice has written the
//!   file), peering over a plain veth pair
//!   (`NAME-g1` 198.19.77.1 in `NAME-lb`, `NAME-g2` 198.19.77.2 in the router's) with
//! - a router BIRD in a namespace of its own (`bgprt-TAG`, config/bird-router.conf as
//!   it is), which
//!   installs what it learns into its kernel.
//!
//! What is checked is what the router sees, in its kernel (`ip route`) and in BIRD
//! (`birdc show route all`, with the community `[bgp] communities` asks for): the VIP is announced while its service has a healthy real
//! server; withdrawn when the server fails its health check and when its weight is
//! set to 0, announced again when it recovers; withdrawn on `sluicectl drain` while
//! the client's connections still go through, back on `undrain`; withdrawn when the
//! service is deleted, back when `reload` restores it from the file; withdrawn on
//! SIGTERM while Sluice still runs its shutdown grace. BFD sessions come up (100 ms x
//! 3). `sluicectl cluster` names BIRD's session and the reason of each withdrawal.
//! Both BIRDs run in the foreground (`bird -f`) as the test's children with their own
//! control sockets and pid files; they, the router's namespace and the bed go on
//! drop, also on failure.
//!
//! A second test runs Sluice with `[vrrp]` too, alone on its link: while it is VRRP
//! backup (three 2.5 s adverts) the BGP session comes up and the router gets no
//! route; once it is master, the route comes.
//!
//! About 6 s (bed, BGP session, six transitions with 200 ms health checks), and 9 s
//! for the VRRP test.
//!
//! Run: `cargo test --release --test integration e2e_bgp:: -- --nocapture` (as root).

use crate::common::*;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

const APPLIANCE: &str = "198.18.0.1";
const CLIENT: &str = "198.18.2.100/24";
const GATEWAY: &str = "198.18.2.1";
const VIP: &str = "198.18.1.1";
const HTTP_PORT: u16 = 8080;
const NODE_PEER: &str = "198.19.77.1";
const ROUTER_PEER: &str = "198.19.77.2";
/// The include pattern the sample node config names; the test moves it.
const SAMPLE_INCLUDE: &str = "/run/sluice/bird-vips*.conf";
/// How long a route change may take to reach the router's kernel: the health
/// verdict (2 x 200 ms), birdc, one BGP UPDATE, the kernel protocol; generous for a
/// shared 2-core machine.
const ROUTE_BOUND: Duration = Duration::from_secs(10);
const GRACE_MS: u64 = 1500;
/// The Prometheus endpoint, inside the appliance's namespace.
const METRICS: &str = "127.0.0.1:9180";

pub(crate) fn sample(name: &str) -> String {
    std::fs::read_to_string(repo_root().join("config").join(name))
        .unwrap_or_else(|e| panic!("config/{name}: {e}"))
}

/// The router's namespace (deleted on drop: declare it before the processes in it)
/// and the veth pair to it from the bed's appliance namespace.
fn router_link(bed: &Testbed) -> Netns {
    let ns = Netns::new("bgprt");
    let rt = ns.0.clone();
    let (g1, g2) = (format!("{}-g1", bed.name), format!("{}-g2", bed.name));
    let t = Duration::from_secs(10);
    let run = |args: &[&str]| {
        run_bounded(std::process::Command::new(args[0]).args(&args[1..]), t)
            .expect_success(&args.join(" "))
    };
    run(&[
        "ip", "link", "add", &g1, "type", "veth", "peer", "name", &g2,
    ]);
    run(&["ip", "link", "set", &g1, "netns", bed.lb_ns()]);
    run(&["ip", "link", "set", &g2, "netns", &rt]);
    let a1 = format!("{NODE_PEER}/24");
    let a2 = format!("{ROUTER_PEER}/24");
    run(&["ip", "-n", bed.lb_ns(), "addr", "add", &a1, "dev", &g1]);
    run(&["ip", "-n", &rt, "addr", "add", &a2, "dev", &g2]);
    run(&["ip", "-n", bed.lb_ns(), "link", "set", &g1, "up"]);
    run(&["ip", "-n", &rt, "link", "set", &g2, "up"]);
    ns
}

/// `bird -f` in `ns` with `conf`, its own control socket and pid file in `dir`.
pub(crate) fn start_bird(
    ns: &str,
    dir: &Path,
    who: &str,
    conf: &str,
) -> (BackgroundProcess, PathBuf) {
    let conf_path = dir.join(format!("{who}.conf"));
    std::fs::write(&conf_path, conf).unwrap();
    let ctl = dir.join(format!("{who}.ctl"));
    let pid = dir.join(format!("{who}.pid"));
    let args = [
        "bird",
        "-f",
        "-c",
        conf_path.to_str().unwrap(),
        "-s",
        ctl.to_str().unwrap(),
        "-P",
        pid.to_str().unwrap(),
    ];
    let mut p = BackgroundProcess::spawn(Some(ns), &args);
    p.wait_until(Duration::from_secs(10), "its control socket", || {
        ctl.exists()
    });
    (p, ctl)
}

pub(crate) fn birdc(ctl: &Path, args: &[&str]) -> String {
    let mut cmd = std::process::Command::new("birdc");
    cmd.arg("-s").arg(ctl).args(args);
    run_bounded(&mut cmd, Duration::from_secs(5))
        .expect_success("birdc")
        .stdout
}

/// The router's kernel route to the VIP, if any (`ip route show VIP`).
fn router_route(rt: &str) -> String {
    netns_exec(rt, &["ip", "route", "show", VIP], Duration::from_secs(5))
        .expect_success("ip route show")
        .stdout
        .trim()
        .to_string()
}

/// Waits until the router's kernel has (`present`) or lacks the VIP's route via the
/// node; the time it took.
fn wait_route(rt: &str, present: bool, what: &str, dump: &dyn Fn() -> String) -> Duration {
    let start = Instant::now();
    let via = format!("via {NODE_PEER}");
    wait_for(ROUTE_BOUND, Duration::from_millis(50), || {
        (router_route(rt).contains(&via) == present).then_some(())
    })
    .unwrap_or_else(|| {
        panic!(
            "{what}: the router's route to {VIP} is {:?}, expected it {} within {ROUTE_BOUND:?}\n{}",
            router_route(rt),
            if present { "present" } else { "gone" },
            dump()
        )
    });
    eprintln!(
        "{what}: router {} after {:?}",
        if present {
            "has the route"
        } else {
            "lost the route"
        },
        start.elapsed()
    );
    start.elapsed()
}

fn cluster(daemon: &Daemon) -> serde_json::Value {
    let out = daemon.ctl(&["cluster", "--json"]);
    assert!(
        out.success(),
        "sluicectl cluster --json: {}",
        out.describe()
    );
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", out.stdout))
}

fn vip_reason(c: &serde_json::Value) -> serde_json::Value {
    c["vips"]
        .as_array()
        .and_then(|v| v.iter().find(|v| v["vip"] == VIP))
        .map(|v| v["reason"].clone())
        .unwrap_or_else(|| panic!("no {VIP} in {c}"))
}

/// The bed with one real server serving HTTP, the router's namespace with its BIRD
/// (config/bird-router.conf), and the node's BIRD (config/bird-node.conf, its include
/// pattern moved into the test's directory) next to where Sluice will run. Fields
/// drop in order: the BIRDs, then the router's namespace, then the bed.
struct BgpBed {
    _node_bird: BackgroundProcess,
    _router_bird: BackgroundProcess,
    _rt_ns: Netns,
    lab: AppLab,
    rt: String,
    dir: PathBuf,
    /// Sluice's include file (not written yet when BIRD starts: the node config's
    /// pattern matches nothing then).
    include: PathBuf,
    router_ctl: PathBuf,
    node_ctl: PathBuf,
}

impl BgpBed {
    fn new() -> BgpBed {
        let mut lab = AppLab::new(1);
        lab.bed.configure("client-addr", &[CLIENT, GATEWAY]);
        lab.bed.configure("rs-gateway", &[APPLIANCE]);
        let http = format!("0.0.0.0:{HTTP_PORT}");
        lab.start_servers_with(&[("--http", &http)], |_| Vec::new());
        let rt_ns = router_link(&lab.bed);
        let rt = rt_ns.0.clone();
        let dir = lab.dir.path().to_path_buf();
        let include = dir.join("bird-vips.conf");
        let (router_bird, router_ctl) =
            start_bird(&rt, &dir, "router", &sample("bird-router.conf"));
        let node_conf = sample("bird-node.conf");
        assert!(node_conf.contains(SAMPLE_INCLUDE));
        let pattern = dir.join("bird-vips*.conf");
        let node_conf = node_conf.replace(SAMPLE_INCLUDE, pattern.to_str().unwrap());
        let (node_bird, node_ctl) = start_bird(lab.bed.lb_ns(), &dir, "node", &node_conf);
        BgpBed {
            _node_bird: node_bird,
            _router_bird: router_bird,
            _rt_ns: rt_ns,
            lab,
            rt,
            dir,
            include,
            router_ctl,
            node_ctl,
        }
    }
}

/// Sluice's `[bgp]` section for `bed`, short timers (ends with a newline).
fn bgp_section(include: &Path, node_ctl: &Path) -> String {
    format!(
        "[bgp]\ninclude = \"{}\"\nsocket = \"{}\"\npoll_ms = 200\nretry_ms = 200\ntimeout_ms = 3000\ncommunities = [\"65000:100\"]\n",
        include.display(),
        node_ctl.display(),
    )
}

// ---------------------------------------------------------------------------------

#[test]
fn bird_announces_the_vip_while_it_has_a_healthy_server_and_withdraws_it_on_failure_drain_and_sigterm(
) {
    require_root();
    let mut bed = BgpBed::new();
    let lab = &mut bed.lab;
    let (rt, dir) = (bed.rt.clone(), bed.dir.clone());
    let (include, router_ctl, node_ctl) = (&bed.include, &bed.router_ctl, &bed.node_ctl);
    let http = format!("0.0.0.0:{HTTP_PORT}");
    let rs = lab.bed.rs_ip(1).to_string();
    let toml = format!(
        "[health]\ncheck = \"tcp\"\ninterval_ms = 200\ntimeout_ms = 150\nfall = 2\nrise = 1\nretry_ms = 500\n\n\
         {}shutdown_grace_ms = {GRACE_MS}\n\n{}",
        bgp_section(include, node_ctl),
        service_section("tcp", VIP, 80, "rr", &[], &[(&rs, HTTP_PORT, 1, "nat")])
    );
    let mut cfg = lab.daemon_config(
        &[&format!("{APPLIANCE}/24"), &format!("{GATEWAY}/24")],
        toml,
    );
    cfg.metrics = Some(METRICS.into());
    let mut daemon = Daemon::start(cfg);
    lab.prewarm(&daemon, GATEWAY);
    let dump = || {
        format!(
            "router: {}\nnode: {}\ninclude: {}",
            birdc(router_ctl, &["show", "route", "all"]),
            birdc(node_ctl, &["show", "protocols"]),
            std::fs::read_to_string(include).unwrap_or_default()
        )
    };

    // Announced: the router's kernel and BIRD have it via the node.
    wait_route(&rt, true, "healthy server", &dump);
    let shown = birdc(router_ctl, &["show", "route", "all", &format!("{VIP}/32")]);
    assert!(
        shown.contains(&format!("{VIP}/32"))
            && shown.contains(&format!("via {NODE_PEER}"))
            && shown.contains("BGP.community: (65000,100)"),
        "{shown}"
    );
    let c = wait_for(Duration::from_secs(5), Duration::from_millis(100), || {
        let c = cluster(&daemon);
        (c["sessions"][0]["info"] == "Established").then_some(c)
    })
    .unwrap_or_else(|| panic!("no Established session in {}", cluster(&daemon)));
    assert_eq!(c["sessions"][0]["name"], "router1", "{c}");
    assert_eq!(vip_reason(&c), serde_json::Value::Null, "{c}");
    assert_eq!(c["in_sync"], true, "{c}");
    let text = daemon
        .ctl(&["cluster"])
        .expect_success("sluicectl cluster")
        .stdout;
    assert!(
        text.contains("router1") && text.contains("Established"),
        "{text}"
    );
    // BFD at 100 ms x 3, on both sides.
    let bfd = wait_for(Duration::from_secs(5), Duration::from_millis(100), || {
        let s = birdc(router_ctl, &["show", "bfd", "sessions"]);
        s.lines()
            .any(|l| l.starts_with(NODE_PEER) && l.contains(" Up "))
            .then_some(s)
    })
    .unwrap_or_else(|| {
        panic!(
            "no BFD session up: {}",
            birdc(router_ctl, &["show", "bfd", "sessions"])
        )
    });
    assert!(bfd.contains("0.100") && bfd.contains("0.300"), "{bfd}");

    // The real server dies: health evicts it, the VIP goes.
    lab.kill_server(1);
    wait_route(&rt, false, "server killed", &dump);
    assert_eq!(vip_reason(&cluster(&daemon)), "no_healthy_server");
    lab.restart_server(1, &[("--http", &http)], &[]);
    wait_route(&rt, true, "server back", &dump);

    // Weight 0: no server can take a new connection.
    let target = format!("{VIP}:80");
    let real = format!("{rs}:{HTTP_PORT}");
    daemon
        .ctl(&["-e", "-t", &target, "-r", &real, "-m", "-w", "0"])
        .expect_success("weight 0");
    wait_route(&rt, false, "weight 0", &dump);
    assert_eq!(vip_reason(&cluster(&daemon)), "no_healthy_server");
    daemon
        .ctl(&["-e", "-t", &target, "-r", &real, "-m", "-w", "1"])
        .expect_success("weight 1");
    wait_route(&rt, true, "weight 1", &dump);

    // Drain: withdrawn, and the client's connections still go through Sluice.
    let drained = daemon
        .ctl(&["drain", "--json"])
        .expect_success("drain")
        .stdout;
    let drained: serde_json::Value = serde_json::from_str(&drained).unwrap();
    assert_eq!(drained["draining"], true, "{drained}");
    wait_route(&rt, false, "drain", &dump);
    assert_eq!(vip_reason(&cluster(&daemon)), "draining");
    let batch = lab.curl(&format!("http://{VIP}/"), 10, 2, &[]);
    assert_eq!(batch["ok"], 10, "forwarding while drained: {batch}");
    daemon.ctl(&["undrain"]).expect_success("undrain");
    wait_route(&rt, true, "undrain", &dump);

    // The service deleted: gone; the config file's service back by `reload`.
    daemon.ctl(&["-D", "-t", &target]).expect_success("-D");
    wait_route(&rt, false, "service deleted", &dump);
    assert_eq!(vip_reason(&cluster(&daemon)), "service_gone");
    daemon.ctl(&["reload"]).expect_success("reload");
    wait_route(&rt, true, "service reloaded", &dump);
    eprintln!(
        "{}",
        daemon.ctl(&["cluster"]).expect_success("cluster").stdout
    );

    // The same as Prometheus metrics, which promtool accepts.
    let scraped = netns_exec(
        lab.bed.lb_ns(),
        &["curl", "-sf", &format!("http://{METRICS}/metrics")],
        Duration::from_secs(10),
    )
    .expect_success("scrape");
    let exposition = dir.join("metrics.txt");
    std::fs::write(&exposition, &scraped.stdout).unwrap();
    let lint = run_bounded(
        std::process::Command::new("sh").args([
            "-c",
            &format!("promtool check metrics < {}", exposition.display()),
        ]),
        Duration::from_secs(10),
    );
    assert!(
        lint.success() && lint.stdout.trim().is_empty() && lint.stderr.trim().is_empty(),
        "promtool check metrics: {}",
        lint.describe()
    );
    for line in [
        format!("sluice_bgp_vip_announced{{vip=\"{VIP}\"}} 1"),
        "sluice_bgp_session_established{name=\"router1\"} 1".to_string(),
        "sluice_bgp_draining 0".to_string(),
    ] {
        assert!(
            scraped.stdout.lines().any(|l| l == line),
            "{line} not in\n{}",
            scraped.stdout
        );
    }

    // SIGTERM: the route goes while Sluice is still in its grace, then it exits.
    let events = daemon.event_lines();
    assert!(
        events
            .iter()
            .any(|l| l == &format!("lb=bgp vip={VIP} withdraw reason=\"draining\"")),
        "{events:?}"
    );
    daemon.signal(libc::SIGTERM);
    let took = wait_route(&rt, false, "SIGTERM", &dump);
    assert!(
        daemon.try_exit().is_none(),
        "sluice exited before its grace ({took:?} after SIGTERM)\n{}",
        daemon.dump()
    );
    assert!(
        daemon
            .wait_exit(Duration::from_secs(20))
            .is_some_and(|s| s.success()),
        "{}",
        daemon.dump()
    );
    let left = std::fs::read_to_string(include).unwrap();
    assert!(
        !left.contains("route "),
        "routes left in the include file:\n{left}"
    );
}

#[test]
fn a_vrrp_backup_announces_nothing_until_it_is_master() {
    require_root();
    let mut bed = BgpBed::new();
    let lab = &mut bed.lab;
    let rt = bed.rt.clone();
    let (include, router_ctl, node_ctl) = (&bed.include, &bed.router_ctl, &bed.node_ctl);
    let rs = lab.bed.rs_ip(1).to_string();
    // A peer that never advertises (no host has its address).
    const PEER: &str = "198.18.0.250";
    // Alone on its link, the node is backup for three adverts (7.5 s and its skew)
    // before it becomes master: long enough for the BGP session to come up first.
    let toml = format!(
        "{}\n[vrrp]\nvrid = 61\npriority = 100\nadvert_interval_ms = 2500\n\
         peers = [\"{PEER}\"]\nkey = \"0f1e2d3c4b5a69788796a5b4c3d2e1f0\"\n\n{}",
        bgp_section(include, node_ctl),
        service_section("tcp", VIP, 80, "rr", &[], &[(&rs, HTTP_PORT, 1, "nat")])
    );
    let daemon = lab.daemon(
        &[&format!("{APPLIANCE}/24"), &format!("{GATEWAY}/24")],
        toml,
    );
    let start = Instant::now();
    let dump = || {
        format!(
            "router: {}\nnode: {}\ninclude: {}\nvrrp: {}",
            birdc(router_ctl, &["show", "route", "all"]),
            birdc(node_ctl, &["show", "protocols"]),
            std::fs::read_to_string(include).unwrap_or_default(),
            daemon.vrrp()
        )
    };
    let c = wait_for(Duration::from_secs(7), Duration::from_millis(100), || {
        let c = cluster(&daemon);
        (c["sessions"][0]["info"] == "Established" && c["in_sync"] == true).then_some(c)
    })
    .unwrap_or_else(|| panic!("no Established session in sync: {}", dump()));
    assert_eq!(
        daemon.vrrp()["state"],
        "BACKUP",
        "master {:?} after start, before the BGP session was up: nothing to check\n{}",
        start.elapsed(),
        dump()
    );
    // Backup, BGP established and BIRD in sync with Sluice's file: the router has
    // nothing from the node.
    assert_eq!(c["vrrp_backup"], true, "{c}");
    assert_eq!(vip_reason(&c), "vrrp_backup", "{c}");
    assert!(
        !router_route(&rt).contains(&format!("via {NODE_PEER}")),
        "a backup's route at the router: {}\n{}",
        router_route(&rt),
        dump()
    );
    let text = daemon.ctl(&["cluster"]).expect_success("cluster").stdout;
    assert!(text.starts_with("node vrrp backup;"), "{text}");

    // Master: the route comes.
    let master = wait_for(Duration::from_secs(15), Duration::from_millis(50), || {
        (daemon.vrrp()["state"] == "MASTER").then(|| start.elapsed())
    })
    .unwrap_or_else(|| panic!("never master: {}", dump()));
    let took = wait_route(&rt, true, "VRRP master", &dump);
    eprintln!("master {master:?} after start; the router had the route {took:?} later");
    let c = cluster(&daemon);
    assert_eq!(c["vrrp_backup"], false, "{c}");
    assert_eq!(vip_reason(&c), serde_json::Value::Null, "{c}");
    assert!(
        daemon
            .event_lines()
            .iter()
            .any(|l| l == &format!("lb=bgp vip={VIP} announce")),
        "{:?}",
        daemon.event_lines()
    );
}
