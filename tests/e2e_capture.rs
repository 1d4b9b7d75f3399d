//! `sluicectl capture` in the namespace test bed, against tcpdump and tshark: while a
//! kernel client talks HTTP and UDP through Sluice (NAT) to two real servers,
//! tcpdump records the appliance's veth from the bridge side with the BPF expression
//! the capture filter stands for, and Sluice captures with that filter into pcapng.
//! tshark reads both files: the same packets (addresses, ports, sequence numbers, IP
//! ids, lengths), each direction flag as the frame's MACs say, nothing outside the
//! filter; a second capture honours direction, protocol, count and snap length.
//! The daemon runs confined as the packaged systemd unit confines it (its capability
//! bounding set, no new privileges, a read-only file system), so the unit's
//! capabilities are shown to be enough for af_packet and for captures.
//!
//! Run: `cargo test --release --test integration e2e_capture::` (as root; about 15 s).

use crate::common::*;
use std::path::Path;
use std::time::Duration;

const APPLIANCE: &str = "198.18.0.1";
const CLIENT: &str = "198.18.2.100/24";
const GATEWAY: &str = "198.18.2.1";
const VIP: &str = "198.18.1.10";
const HTTP_PORT: u16 = 8080;
const UDP_PORT: u16 = 4444;

/// tshark's fields of every packet of `file` (one line each, tab-separated), for
/// packets matching the display filter `filter` (all when empty).
fn tshark(file: &Path, fields: &[&str], filter: &str) -> Vec<String> {
    let mut args = vec!["tshark", "-n", "-r"];
    let path = file.to_string_lossy();
    args.push(&path);
    if !filter.is_empty() {
        args.extend(["-Y", filter]);
    }
    args.extend(["-T", "fields"]);
    for f in fields {
        args.extend(["-e", f]);
    }
    let out = run_bounded(
        std::process::Command::new(args[0]).args(&args[1..]),
        Duration::from_secs(30),
    );
    assert!(out.success(), "{}", out.describe());
    let mut lines: Vec<String> = out.stdout.lines().map(str::to_string).collect();
    lines.sort();
    lines
}

fn ctl(daemon: &Daemon, args: &[&str]) -> CmdOutput {
    daemon.ctl(args)
}

/// The process `pid` is confined as `DaemonConfig::in_unit_sandbox` says: the unit's
/// capability bounding set (CAP_IPC_LOCK 14, CAP_SYS_ADMIN 21, CAP_SYS_RAWIO 17,
/// CAP_NET_RAW 13, CAP_NET_ADMIN 12, CAP_CHOWN 0, CAP_DAC_OVERRIDE 1, CAP_SETUID 7,
/// CAP_SETGID 6, numbered as in linux/capability.h), no new privileges, and a
/// read-only root file system.
fn assert_unit_sandbox(pid: i32) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} in {status}"))
            .trim()
            .to_string()
    };
    let unit_caps: u64 = [14, 21, 17, 13, 12, 0, 1, 7, 6]
        .iter()
        .map(|b| 1u64 << b)
        .sum();
    assert_eq!(field("CapBnd:"), format!("{unit_caps:016x}"), "{status}");
    assert_eq!(field("CapEff:"), format!("{unit_caps:016x}"), "{status}");
    assert_eq!(field("NoNewPrivs:"), "1", "{status}");
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mounts")).unwrap();
    let root = mounts
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some("/"))
        .unwrap();
    let options = root.split_whitespace().nth(3).unwrap();
    assert!(options.split(',').any(|o| o == "ro"), "{root}");
}

#[test]
fn a_filtered_capture_holds_what_tcpdump_saw_on_the_veth_and_honours_every_filter() {
    require_root();
    let mut lab = AppLab::new(2);
    lab.bed.configure("client-addr", &[CLIENT, GATEWAY]);
    lab.bed.configure("rs-gateway", &[APPLIANCE]);
    lab.start_servers(
        &[format!("0.0.0.0:{HTTP_PORT}")],
        &[format!("0.0.0.0:{UDP_PORT}")],
    );
    let (rs1, rs2) = (lab.bed.rs_ip(1).to_string(), lab.bed.rs_ip(2).to_string());
    let service = |proto: &str, port: u16| {
        service_section(
            proto,
            VIP,
            port,
            "rr",
            &[],
            &[
                (&rs1, port_of(port), 1, "nat"),
                (&rs2, port_of(port), 1, "nat"),
            ],
        )
    };
    fn port_of(vport: u16) -> u16 {
        if vport == 80 {
            HTTP_PORT
        } else {
            UDP_PORT
        }
    }
    let toml = [service("tcp", 80), service("udp", UDP_PORT)].join("\n");
    // The daemon runs confined as the packaged unit confines it: what it does here
    // (af_packet, promiscuous mode, captures created as their requester) needs no
    // capability the unit does not keep.
    let daemon = Daemon::start(
        lab.daemon_config(
            &[&format!("{APPLIANCE}/24"), &format!("{GATEWAY}/24")],
            toml,
        )
        .in_unit_sandbox(),
    );
    assert_unit_sandbox(daemon.pid());
    lab.prewarm(&daemon, GATEWAY);

    // The filter: the VIP's HTTP, and each real server's HTTP port, TCP only: both
    // halves of every NAT connection, none of the UDP or ICMP.
    let vip = format!("{VIP}:80");
    let (r1, r2) = (format!("{rs1}:{HTTP_PORT}"), format!("{rs2}:{HTTP_PORT}"));
    let bpf = format!(
        "tcp and ((src host {VIP} and src port 80) or (dst host {VIP} and dst port 80) or \
         (src host {rs1} and src port {HTTP_PORT}) or (dst host {rs1} and dst port {HTTP_PORT}) or \
         (src host {rs2} and src port {HTTP_PORT}) or (dst host {rs2} and dst port {HTTP_PORT}))"
    );
    let wire = lab.dir.path().join("veth.pcap");
    let plb = format!("{}-plb", lab.bed.name);
    let mut tcpdump = BackgroundProcess::spawn(
        Some(lab.bed.fact("SW_NS")),
        &[
            "tcpdump",
            "-i",
            &plb,
            "-n",
            "-U",
            // Without it libpcap hands packets over a block at a time (up to a second
            // late), and tcpdump stopped before then writes none of them.
            "--immediate-mode",
            "-s",
            "0",
            "-w",
            &wire.to_string_lossy(),
            &bpf,
        ],
    );
    tcpdump.wait_for_output(Duration::from_secs(10), "listening on");

    let began = wall_now();
    let file = lab.dir.path().join("sluice.pcapng");
    let socket = daemon.socket().to_string_lossy().into_owned();
    let mut capture = daemon.start_capture(
        &file,
        &[
            "--proto",
            "tcp",
            "--vip",
            &vip,
            "--rs",
            &r1,
            "--rs",
            &r2,
            "--duration",
            "30",
        ],
    );

    let batch = lab.curl(&format!("http://{VIP}/"), 20, 2, &[]);
    assert_eq!(batch["ok"], 20, "{batch}");
    let (_, udp) = lab.udp(VIP, UDP_PORT, 5, 40000);
    assert_eq!(udp["ok"], 5, "{udp}");
    // The last ACKs and FINs are on the wire by now; let them reach both.
    std::thread::sleep(Duration::from_millis(300));
    let stopped = ctl(&daemon, &["capture", "--stop"]);
    assert!(stopped.success(), "{}", stopped.describe());
    let exit = capture.wait_exit(Duration::from_secs(5));
    assert!(
        exit.is_some_and(|s| s.success()),
        "sluicectl capture: {exit:?}\n{}\n{}",
        capture.stdout_text(),
        capture.stderr_text()
    );
    assert!(
        capture
            .stdout_text()
            .contains("(ended: stopped); 0 copies dropped"),
        "{}",
        capture.stdout_text()
    );
    let ours_count = tshark(&file, &["frame.number"], "").len();
    // tcpdump writes each frame as it gets it; stop it once it has as many as Sluice
    // copied, or after a bound (the comparison below then shows what it missed).
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let frames_so_far = || {
        // Not `tshark()`: a file still being written may end in half a record.
        let out = run_bounded(
            std::process::Command::new("tshark")
                .args(["-n", "-r"])
                .arg(&wire),
            Duration::from_secs(30),
        );
        out.stdout.lines().count()
    };
    while frames_so_far() < ours_count && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(tcpdump);

    let fields = [
        "eth.src",
        "eth.dst",
        "ip.src",
        "ip.dst",
        "ip.id",
        "tcp.srcport",
        "tcp.dstport",
        "tcp.seq_raw",
        "tcp.ack_raw",
        "tcp.flags",
        "frame.len",
    ];
    let ours = tshark(&file, &fields, "");
    let theirs = tshark(&wire, &fields, "");
    // 20 connections, each at least SYN, SYN-ACK, ACK, request, response, FIN, FIN,
    // ACK on each side of Sluice.
    assert!(
        ours.len() >= 20 * 8 * 2,
        "{} packets: {ours:#?}",
        ours.len()
    );
    // The workers counted what they copied (every frame in the file, and any still
    // in their rings at the stop) and dropped none: `sluicectl status`, whence the
    // metrics `sluice_worker_capture_{copied,dropped}_total`.
    let status = ctl(&daemon, &["--json", "status"]);
    let status: serde_json::Value = serde_json::from_str(&status.stdout).unwrap();
    let workers = status["lcores"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|l| l["role"] == "worker");
    let (copied, dropped) = workers.fold((0, 0), |(c, d), l| {
        (
            c + l["capture_copied"].as_u64().unwrap(),
            d + l["capture_dropped"].as_u64().unwrap(),
        )
    });
    assert!(
        copied >= ours.len() as u64 && dropped == 0,
        "copied {copied}, dropped {dropped}, {} in the file",
        ours.len()
    );
    assert_eq!(
        ours,
        theirs,
        "Sluice's capture and tcpdump on the veth differ ({} vs {} packets)",
        ours.len(),
        theirs.len()
    );
    // Nothing outside the filter, and both sides of the NAT with each real server.
    let outside = tshark(
        &file,
        &["frame.number"],
        &format!(
            "!(tcp && ((ip.src=={VIP} && tcp.srcport==80) || (ip.dst=={VIP} && tcp.dstport==80) || \
             (ip.addr=={rs1} && tcp.port=={HTTP_PORT}) || (ip.addr=={rs2} && tcp.port=={HTTP_PORT})))"
        ),
    );
    assert!(
        outside.is_empty(),
        "packets outside the filter: {outside:?}"
    );
    for host in [VIP, &rs1, &rs2] {
        let n = tshark(&file, &["frame.number"], &format!("ip.addr=={host}")).len();
        assert!(n >= 20, "{host}: {n} packets");
    }
    // Each packet's direction flag says what its MACs say: received frames are to
    // Sluice's MAC, sent ones from it.
    let mac = lab.bed.lb_mac().to_lowercase();
    let inbound = tshark(&file, &["eth.dst"], "frame.packet_flags_direction == 1");
    let outbound = tshark(&file, &["eth.src"], "frame.packet_flags_direction == 2");
    assert_eq!(inbound.len() + outbound.len(), ours.len());
    assert!(inbound.iter().all(|m| *m == mac), "{inbound:?}");
    assert!(outbound.iter().all(|m| *m == mac), "{outbound:?}");
    assert!(!inbound.is_empty() && !outbound.is_empty());
    // Timestamps are wall-clock times of the capture (from the worker's TSC).
    let ended = wall_now();
    let times = tshark(&file, &["frame.time_epoch"], "");
    assert!(
        times.iter().all(|t| {
            let t: f64 = t.parse().unwrap();
            (began..=ended).contains(&t)
        }),
        "timestamps outside {began}..{ended}: {times:?}"
    );
    let names = tshark(&file, &["frame.interface_name"], "");
    assert!(names.iter().all(|n| n == "lan0"), "{names:?}");

    // Direction, protocol, count and snap length: 4 received UDP frames, 40 bytes of
    // each (an Ethernet, IPv4 and UDP header take 42); HTTP goes on meanwhile.
    let small = lab.dir.path().join("udp.pcapng");
    let small_s = small.to_string_lossy().into_owned();
    let mut capture = daemon.start_capture(
        &small,
        &[
            "--dir",
            "rx",
            "--proto",
            "udp",
            "-c",
            "4",
            "-s",
            "40",
            "--duration",
            "20",
        ],
    );
    lab.curl(&format!("http://{VIP}/"), 4, 1, &[]);
    let (_, udp) = lab.udp(VIP, UDP_PORT, 5, 41000);
    assert_eq!(udp["ok"], 5, "{udp}");
    let exit = capture.wait_exit(Duration::from_secs(10));
    assert!(
        exit.is_some_and(|s| s.success()),
        "{}",
        capture.stderr_text()
    );
    assert!(
        capture.stdout_text().contains("4 packets written")
            && capture.stdout_text().contains("(ended: count)"),
        "{}",
        capture.stdout_text()
    );
    let got = tshark(
        &small,
        &[
            "frame.packet_flags_direction",
            "ip.proto",
            "frame.cap_len",
            "frame.len",
            "eth.dst",
        ],
        "",
    );
    assert_eq!(got.len(), 4, "{got:?}");
    for line in &got {
        let f: Vec<&str> = line.split('\t').collect();
        assert_eq!(&f[..2], &["0x00000001", "17"], "{line}");
        let (cap, len): (u32, u32) = (f[2].parse().unwrap(), f[3].parse().unwrap());
        assert!(cap == 40 && len > 40, "{line}");
        assert_eq!(f[4], mac, "{line}");
    }
    // Port and host, and an end by duration: UDP to rs1's port only, for 1 s while
    // UDP and HTTP run through both real servers.
    let timed = lab.dir.path().join("timed.pcapng");
    let asked = wall_now();
    let mut capture = daemon.start_capture(
        &timed,
        &[
            "--port",
            &UDP_PORT.to_string(),
            "--host",
            &rs1,
            "--duration",
            "1",
        ],
    );
    let (_, udp) = lab.udp(VIP, UDP_PORT, 6, 42000);
    assert_eq!(udp["ok"], 6, "{udp}");
    lab.curl(&format!("http://{VIP}/"), 4, 1, &[]);
    let exit = capture.wait_exit(Duration::from_secs(10));
    let took = wall_now() - asked;
    assert!(
        exit.is_some_and(|s| s.success()) && capture.stdout_text().contains("(ended: duration)"),
        "{exit:?} {}\n{}",
        capture.stdout_text(),
        capture.stderr_text()
    );
    assert!((1.0..5.0).contains(&took), "a 1 s capture took {took:.2} s");
    let got = tshark(
        &timed,
        &["ip.src", "ip.dst", "udp.srcport", "udp.dstport"],
        "",
    );
    let port = UDP_PORT.to_string();
    assert!(
        got.iter().all(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            (f[0] == rs1 || f[1] == rs1) && (f[2] == port || f[3] == port)
        }),
        "{got:?}"
    );
    // rr over two servers: 3 of the 6 exchanges on rs1, each a request in and out and
    // an answer in and out.
    let to_rs1 = got
        .iter()
        .filter(|l| l.split('\t').nth(1) == Some(rs1.as_str()));
    assert!(to_rs1.count() >= 3, "{got:?}");

    // Bad requests change nothing and say what is wrong.
    let bad = ctl(&daemon, &["capture", "-w", &small_s, "-i", "nosuch"]);
    assert!(
        !bad.success() && bad.stderr.contains("interface \"nosuch\""),
        "{}",
        bad.describe()
    );
    let bad = ctl(
        &daemon,
        &["capture", "-w", "/nonexistent/dir/x.pcapng", "-c", "1"],
    );
    assert!(
        !bad.success() && bad.stderr.contains("cannot create"),
        "{}",
        bad.describe()
    );
    // An existing file is never overwritten (the daemon runs as root).
    let bad = ctl(&daemon, &["capture", "-w", &small_s, "-c", "1"]);
    assert!(
        !bad.success() && bad.stderr.contains("File exists"),
        "{}",
        bad.describe()
    );
    // The file is created with the permissions of whoever asks, and belongs to them
    // (the daemon runs as root; a control-socket user must not create files where
    // they could not). Here `nobody`, let in by opening the socket to everyone.
    let nobody_dir = tempfile::Builder::new()
        .prefix("sluice-capture-nobody-")
        .tempdir()
        .unwrap();
    let run_as_nobody = |target: &Path| {
        run_bounded(
            std::process::Command::new("setpriv")
                .args([
                    "--reuid=65534",
                    "--regid=65534",
                    "--clear-groups",
                    SLUICECTL,
                    "-S",
                    &socket,
                    "capture",
                    "-w",
                ])
                .arg(target)
                .args(["-c", "1", "--duration", "1"]),
            Duration::from_secs(20),
        )
    };
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    std::fs::set_permissions(daemon.socket(), std::fs::Permissions::from_mode(0o666)).unwrap();
    std::fs::set_permissions(nobody_dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // A root-owned directory nobody cannot write to: refused, nothing created.
    let forbidden = nobody_dir.path().join("x.pcapng");
    let bad = run_as_nobody(&forbidden);
    assert!(
        !bad.success() && bad.stderr.contains("Permission denied") && !forbidden.exists(),
        "{}",
        bad.describe()
    );
    // A directory nobody owns: created, and nobody's.
    let own = nobody_dir.path().join("own");
    std::fs::create_dir(&own).unwrap();
    std::os::unix::fs::chown(&own, Some(65534), Some(65534)).unwrap();
    let allowed = own.join("x.pcapng");
    let good = run_as_nobody(&allowed);
    assert!(good.success(), "{}", good.describe());
    let meta = std::fs::metadata(&allowed).unwrap();
    assert_eq!((meta.uid(), meta.gid()), (65534, 65534));
    let status = ctl(&daemon, &["--json", "capture", "--status"]);
    assert!(
        status.stdout.contains("\"running\": false"),
        "{}",
        status.describe()
    );
    daemon.stop_clean();
}
