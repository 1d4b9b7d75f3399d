//! Tier 3, the exception path end to end with real kernels (docs/EXCEPTION_PATH.md):
//! Sluice on net_af_packet in the node's namespace with `[ports.exception] kind =
//! "tap"`, one DR real server behind a VIP, and in the node's namespace a kernel TCP
//! listener (`e2e_apps.py serve --echo`) on the appliance's own address, put on the
//! tap interface as an operator would.
//!
//! - The tap interface carries the port's MAC; the client's connections to the
//!   listener complete through Sluice's port (the kernel's ARP for the client goes
//!   out, its answer comes back up), while curl through the VIP is forwarded.
//! - A SYN flood to the appliance's address (spoofed sources, ~4000/s for 3 s) is
//!   held to the configured rate: `exception_punted` grows by about rate x seconds,
//!   `exception_rate_limited` takes the rest; requests through the VIP all succeed
//!   meanwhile, and the listener answers again once the flood ends.
//! - During the flood, with IP TTL 255 (as BFD and BIRD's `ttl security on` send):
//!   5 connections to a second listener on the BGP port (179) complete, and a burst
//!   of 60 datagrams to a kernel echo socket on BFD's port (3784) is answered whole,
//!   6 times the rate's bucket: their frames take the control budget
//!   (`exception_punted_control`, bucket 100), which the flood (TTL 64) cannot spend.
//!
//! About 7 s. Run: `cargo test --release --test integration e2e_exception::` (as root).

use crate::common::*;
use serde_json::Value;
use std::time::{Duration, Instant};

const APPLIANCE: &str = "198.18.0.1";
const VIP: &str = "198.18.0.200";
const LISTEN_PORT: u16 = 2222;
/// `[ports.exception] rate`, frames per second.
const RATE: u64 = 200;
/// The bucket's depth for that rate (`ExceptionLink::new`: a twentieth of the rate,
/// at least 8).
const BURST: u64 = 10;
const FLOOD_SYNS: u64 = 12_000;
const FLOOD_SECONDS: f64 = 3.0;

/// The kernel's listener on the BGP port, asked with TTL 255.
const BGP_PORT: u16 = 179;
/// The kernel's UDP echo socket on BFD's single-hop port.
const BFD_PORT: u16 = 3784;
/// Datagrams sent to it at once during the flood, with TTL 255: far more than the
/// rate's bucket (10) passes, fewer than the control budget's (100).
const BFD_BURST: u64 = 60;

/// `e2e_apps.py ask` from the client to the kernel's listener on `listen_port`,
/// `rounds` connections, each operation within `timeout` seconds, with IP TTL `ttl`
/// if given: how many the listener answered, and the JSON.
fn ask_listener(
    lab: &AppLab,
    listen_port: u16,
    rounds: u32,
    timeout: &str,
    ttl: Option<u8>,
) -> (usize, Value) {
    let (apps, port) = (AppLab::apps(), listen_port.to_string());
    let rounds = rounds.to_string();
    let ttl = ttl.map(|t| t.to_string());
    let mut args = vec![
        PYTHON,
        apps.as_str(),
        "ask",
        APPLIANCE,
        &port,
        "--source",
        lab.bed.client_ip(),
        "--rounds",
        &rounds,
        "--timeout",
        timeout,
    ];
    if let Some(ttl) = &ttl {
        args.extend(["--ttl", ttl.as_str()]);
    }
    let out = lab
        .bed
        .exec(lab.bed.client_ns(), &args, Duration::from_secs(60));
    let v: Value = serde_json::from_str(out.stdout.trim())
        .unwrap_or_else(|e| panic!("ask printed no JSON ({e}): {}", out.describe()));
    let answered = v["answers"]
        .as_array()
        .map_or(0, |a| a.iter().filter(|r| r["server"] == "kernel").count());
    (answered, v)
}

#[test]
fn a_kernel_listener_on_the_appliance_address_answers_and_a_flood_to_it_is_held_to_the_rate() {
    require_root();
    let mut lab = AppLab::new(1);
    lab.bed.configure("dr-vip", &[VIP]);
    lab.start_servers(&["0.0.0.0:80".into()], &[]);
    let rs = lab.bed.rs_ip(1).to_string();
    let iface = format!("sx{}", lab.bed.name);
    let mut cfg = lab.daemon_config(
        &[&format!("{APPLIANCE}/24")],
        service_section("tcp", VIP, 80, "rr", &[], &[(&rs, 80, 1, "dr")]),
    );
    cfg.ports[0].exception = vec![
        "kind = \"tap\"".into(),
        format!("interface = {iface:?}"),
        format!("rate = {RATE}"),
    ];
    cfg.metrics = Some("127.0.0.1:9101".into());
    let daemon = Daemon::start(cfg);
    let lb = lab.bed.lb_ns().to_string();
    let t = Duration::from_secs(10);

    // The kernel's side: the interface is up with the port's MAC; the operator puts
    // the appliance's address on it.
    let status = daemon.status();
    let port_mac = port(&status, "lan0")["mac"]
        .as_str()
        .unwrap()
        .to_ascii_lowercase();
    let link = lab
        .bed
        .exec(&lb, &["ip", "-o", "link", "show", &iface], t)
        .expect_success("ip link show");
    assert!(
        link.stdout.to_ascii_lowercase().contains(&port_mac) && link.stdout.contains(",UP"),
        "{iface} should be up with the port's MAC {port_mac}: {}",
        link.stdout
    );
    assert_eq!(
        port(&status, "lan0")["exception"]["interface"],
        iface.as_str()
    );
    lab.bed
        .exec(
            &lb,
            &[
                "ip",
                "addr",
                "add",
                &format!("{APPLIANCE}/24"),
                "dev",
                &iface,
            ],
            t,
        )
        .expect_success("ip addr add");
    // The node's kernel sees Sluice's veth too (net_af_packet reads it beside the
    // kernel): frames to the port's MAC would reach the tap's address that way as
    // well, around the exception path. Strict reverse-path filtering on the veth drops
    // them there (the client's route is the tap's); af_packet still gets them all.
    lab.bed
        .exec(
            &lb,
            &[
                "sysctl",
                "-qw",
                &format!("net.ipv4.conf.{}.rp_filter=1", lab.bed.lb_if()),
            ],
            t,
        )
        .expect_success("sysctl rp_filter");
    let ready = lab.dir.path().join("kernel.ready");
    let log = lab.dir.path().join("kernel.log");
    let mut listener = BackgroundProcess::spawn(
        Some(&lb),
        &[
            PYTHON,
            &AppLab::apps(),
            "serve",
            "--name",
            "kernel",
            "--log",
            &log.to_string_lossy(),
            "--ready",
            &ready.to_string_lossy(),
            "--echo",
            &format!("{APPLIANCE}:{LISTEN_PORT}"),
            "--echo",
            &format!("{APPLIANCE}:{BGP_PORT}"),
            "--udp",
            &format!("{APPLIANCE}:{BFD_PORT}"),
        ],
    );
    listener.wait_until(Duration::from_secs(15), "listener ready", || ready.exists());
    lab.prewarm(&daemon, VIP);

    // The kernel's listener answers through Sluice's port, and the VIP forwards.
    let (answered, v) = ask_listener(&lab, LISTEN_PORT, 5, "3", None);
    assert_eq!(answered, 5, "{v}\n{}", daemon.dump());
    let batch = lab.curl(&format!("http://{VIP}/"), 20, 4, &[]);
    assert_eq!(batch["ok"], 20, "{batch}\n{}", daemon.dump());
    let status = daemon.status();
    assert!(
        event_count(&status, "exception_punted") >= 5 * 3,
        "each connection's segments went up: {status:#}"
    );
    assert!(
        event_count(&status, "exception_injected") >= 5 * 3,
        "and the kernel's answers out: {status:#}"
    );

    // The kernel's frames leave only from the port's addresses: given one more
    // address of its own on the interface, its pings to the client from it are
    // refused, so the client's kernel never hears from that address (answering, it
    // would have had to resolve it: a neighbour entry, even a failed one).
    let foreign = "198.18.0.77";
    let refused_before = drop_count(&daemon.status(), "exception_foreign_source");
    let ip = |args: &[&str]| lab.bed.exec(&lb, args, t).expect_success("ip");
    ip(&["ip", "addr", "add", &format!("{foreign}/32"), "dev", &iface]);
    let ping = lab.bed.exec(
        &lb,
        &[
            "ping",
            "-c",
            "2",
            "-W",
            "1",
            "-I",
            foreign,
            lab.bed.client_ip(),
        ],
        t,
    );
    ip(&["ip", "addr", "del", &format!("{foreign}/32"), "dev", &iface]);
    let neigh = lab
        .bed
        .exec(
            lab.bed.client_ns(),
            &["ip", "-4", "neigh", "show", foreign],
            t,
        )
        .expect_success("ip neigh");
    assert!(
        neigh.stdout.trim().is_empty(),
        "the client learned {foreign} from the kernel: {}\n{}",
        neigh.stdout,
        ping.describe()
    );
    assert!(
        ping.stdout.contains("2 packets transmitted"),
        "{}",
        ping.describe()
    );
    let refused = drop_count(&daemon.status(), "exception_foreign_source") - refused_before;
    assert!(refused >= 1, "{}\n{}", ping.describe(), daemon.dump());

    // A SYN flood to the listener from spoofed sources (no route back: the kernel's
    // answers go nowhere), with requests through the VIP at the same time.
    let before = daemon.status();
    let t0 = Instant::now();
    let mut flood = BackgroundProcess::spawn(
        Some(lab.bed.client_ns()),
        &[
            PYTHON,
            &AppLab::apps(),
            "synflood",
            APPLIANCE,
            &LISTEN_PORT.to_string(),
            "--count",
            &FLOOD_SYNS.to_string(),
            "--net",
            "198.18.3.0/24",
            "--seconds",
            &FLOOD_SECONDS.to_string(),
        ],
    );
    std::thread::sleep(Duration::from_millis(500));
    // BGP with TTL 255 while the flood holds the port's rate: each connection's
    // segments (SYN, ACK, data, FIN) take the control budget. Without it, one SYN in
    // twenty would pass, and a connect waits 1 s before its first retry.
    let (answered, bgp) = ask_listener(&lab, BGP_PORT, 5, "1", Some(255));
    let bfd = lab
        .bed
        .exec(
            lab.bed.client_ns(),
            &[
                PYTHON,
                &AppLab::apps(),
                "udp",
                APPLIANCE,
                &BFD_PORT.to_string(),
                "--count",
                &BFD_BURST.to_string(),
                "--timeout",
                "0.5",
                "--ttl",
                "255",
                "--burst",
            ],
            Duration::from_secs(30),
        )
        .stdout;
    let bgp_done = t0.elapsed().as_secs_f64();
    let during = lab.curl(&format!("http://{VIP}/"), 30, 4, &[]);
    let exit = flood.wait_exit(Duration::from_secs(30));
    let elapsed = t0.elapsed().as_secs_f64();
    let after = daemon.status();
    assert!(
        exit.is_some_and(|e| e.success()),
        "synflood: {exit:?} {}",
        flood.stderr_text()
    );
    let sent: Value = serde_json::from_str(flood.stdout_text().trim()).unwrap_or_default();
    let flood_s = sent["seconds"].as_f64().unwrap_or(FLOOD_SECONDS);
    assert_eq!(
        during["ok"],
        30,
        "forwarding during the flood: {during}\n{}",
        daemon.dump()
    );
    assert_eq!(
        answered,
        5,
        "BGP with TTL 255 during the flood: {bgp}\n{}",
        daemon.dump()
    );
    let bfd: Value = serde_json::from_str(bfd.trim()).unwrap_or_default();
    assert_eq!(
        bfd["ok"].as_u64(),
        Some(BFD_BURST),
        "UDP to BFD's port with TTL 255 during the flood: {bfd}\n{}",
        daemon.dump()
    );
    assert!(
        bgp_done < flood_s,
        "the BGP and BFD exchanges ended at {bgp_done:.2} s, after the {flood_s} s flood"
    );
    let delta = |name: &str| event_count(&after, name) - event_count(&before, name);
    let control = delta("exception_punted_control");
    assert!(
        control >= 5 * 3 + BFD_BURST,
        "the BGP connections' segments and the BFD datagrams took the control budget: \
         {control}"
    );
    // The control budget's frames come on top of the rate.
    let punted = delta("exception_punted") - control;
    let limited = drop_count(&after, "exception_rate_limited")
        - drop_count(&before, "exception_rate_limited");
    eprintln!(
        "flood: {sent} in {elapsed:.2} s: punted {punted} and {control} control, \
         rate-limited {limited}, ring full {}",
        drop_count(&after, "exception_ring_full")
    );
    // At most the rate over the whole window plus one bucket (and the few frames of
    // the kernel's own ARP); at least most of the rate over the flood itself.
    assert!(
        punted <= (RATE as f64 * elapsed) as u64 + BURST + 20,
        "punted {punted} in {elapsed:.2} s at {RATE}/s: the limit did not hold"
    );
    assert!(
        punted as f64 >= RATE as f64 * flood_s * 0.7,
        "punted {punted} in a {flood_s} s flood at {RATE}/s: the kernel got too little"
    );
    assert!(
        limited as f64 >= FLOOD_SYNS as f64 * 0.5,
        "rate-limited {limited} of {FLOOD_SYNS} SYNs: {after:#}"
    );
    assert_eq!(drop_count(&after, "exception_ring_full"), 0, "{after:#}");
    assert_eq!(
        drop_count(&after, "exception_control_ring_full"),
        0,
        "{after:#}"
    );

    // The management core wrote every punted frame to the kernel interface.
    let total = event_count(&after, "exception_punted");
    let caught_up = wait_for(Duration::from_secs(5), Duration::from_millis(50), || {
        let s = daemon.status();
        let e = port(&s, "lan0")["exception"].clone();
        let written =
            e["to_kernel"].as_u64().unwrap_or(0) + e["to_kernel_lost"].as_u64().unwrap_or(0);
        (written >= total).then_some(e)
    });
    let e = caught_up
        .unwrap_or_else(|| panic!("the interface got fewer than {total}: {}", daemon.dump()));
    assert_eq!(e["to_kernel_lost"], 0, "{e}");

    // The Prometheus endpoint, read by the reference parser, says the same.
    let script = repo_root().join("tests/tools/prom_scrape.py");
    let out = lab
        .bed
        .exec(
            &lb,
            &[
                PYTHON,
                &script.to_string_lossy(),
                "http://127.0.0.1:9101/metrics",
            ],
            Duration::from_secs(20),
        )
        .expect_success("prom_scrape.py");
    let scraped: Value = serde_json::from_str(out.stdout.trim()).unwrap();
    let sample = |name: &str, label: (&str, &str)| {
        scraped["samples"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s[0] == name && s[1][label.0] == label.1)
            .and_then(|s| s[2].as_f64())
            .unwrap_or_else(|| panic!("no {name} {label:?} in {scraped}"))
    };
    let to_kernel = sample("sluice_exception_frames_total", ("direction", "to_kernel"));
    assert!(to_kernel >= total as f64, "{to_kernel} < {total}");
    assert!(
        sample(
            "sluice_exception_frames_total",
            ("direction", "from_kernel")
        ) > 0.0
    );
    assert!(sample("sluice_drops_total", ("reason", "exception_rate_limited")) >= limited as f64);

    // Flood over: the listener answers again.
    std::thread::sleep(Duration::from_millis(200));
    let (answered, v) = ask_listener(&lab, LISTEN_PORT, 3, "3", None);
    assert_eq!(answered, 3, "after the flood: {v}\n{}", daemon.dump());
    listener.kill_now();
}
