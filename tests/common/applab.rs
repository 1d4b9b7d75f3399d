//! End to end with applications: a test bed whose real servers run
//! `tests/tools/e2e_apps.py` (HTTP answering their own name, UDP echo, logs of the
//! client address each saw) and a client that runs curl and UDP exchanges.

use super::config::{DaemonConfig, PortSpec};
use super::daemon::{drop_count, event_count, Daemon, SLUICECTL};
use super::process::{
    netns_exec, read_lines, tool, wait_for, BackgroundProcess, CmdOutput, PYTHON,
};
use super::testbed::Testbed;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// A test bed with real servers running `e2e_apps.py serve`, plus the helpers to drive
/// the client. Fields drop in order: the servers first, the bed last (a daemon
/// declared after the lab in a test drops before it).
pub struct AppLab {
    pub servers: Vec<BackgroundProcess>,
    pub dir: tempfile::TempDir,
    pub bed: Testbed,
}

impl AppLab {
    /// Appliance address every bed uses (`APPLIANCE_IP`).
    pub const APPLIANCE: &'static str = "198.18.0.1";
    /// curl's bound per request (seconds).
    pub const CURL_MAX_TIME: &'static str = "5";
    /// Bound of a whole curl batch.
    pub const BATCH_TIMEOUT: Duration = Duration::from_secs(120);

    pub fn new(real_servers: u32) -> AppLab {
        let bed = Testbed::up(real_servers);
        let dir = tempfile::Builder::new()
            .prefix(&format!("sluice-e2e-{}-", bed.name))
            .tempdir()
            .expect("temp dir");
        AppLab {
            bed,
            dir,
            servers: Vec::new(),
        }
    }

    pub fn apps() -> String {
        tool("e2e_apps.py").to_string_lossy().into_owned()
    }

    /// A user-space decapsulator (TUN device `sltun0`, `e2e_apps.py decap`) on every
    /// real server, for tunnelled services: this kernel has neither the ipip nor the
    /// ip6_tunnel module. IP-in-IP, or with `v6` IPv6-in-IPv6; each logs what it
    /// decapsulated to `rsI.ipip.log` (`rsI.ip6ip6.log`).
    pub fn start_decapsulators(&mut self, v6: bool) {
        let kind = if v6 { "ip6ip6" } else { "ipip" };
        for i in 1..=self.bed.rs_count() {
            let ready = self.dir.path().join(format!("rs{i}.decap.ready"));
            let log = self.dir.path().join(format!("rs{i}.{kind}.log"));
            let (ready_s, log_s) = (
                ready.to_string_lossy().into_owned(),
                log.to_string_lossy().into_owned(),
            );
            let apps = Self::apps();
            let mut argv = vec![
                PYTHON, &apps, "decap", "--tun", "sltun0", "--log", &log_s, "--ready", &ready_s,
            ];
            if v6 {
                argv.push("--v6");
            }
            let mut p = BackgroundProcess::spawn(Some(self.bed.rs_ns(i)), &argv);
            p.wait_until(Duration::from_secs(15), "ready", || ready.exists());
            self.servers.push(p);
        }
    }

    pub fn log_path(&self, i: u32) -> PathBuf {
        self.dir.path().join(format!("rs{i}.log"))
    }

    /// Starts `e2e_apps.py serve --name rsI` on every real server with these listen
    /// addresses (`ADDR:PORT`) and waits until each has bound its sockets.
    pub fn start_servers(&mut self, http: &[String], udp: &[String]) {
        let listen: Vec<(&str, &str)> = http
            .iter()
            .map(|h| ("--http", h.as_str()))
            .chain(udp.iter().map(|u| ("--udp", u.as_str())))
            .collect();
        self.start_servers_listening(&listen);
    }

    /// As [`start_servers`](AppLab::start_servers), with any of `serve`'s listen
    /// options as (option, `ADDR:PORT`) pairs: `("--http", ..)`, `("--udp", ..)`,
    /// `("--echo", ..)`.
    pub fn start_servers_listening(&mut self, listen: &[(&str, &str)]) {
        for i in 1..=self.bed.rs_count() {
            let ready = self.dir.path().join(format!("rs{i}.ready"));
            let mut args: Vec<String> = vec![
                PYTHON.into(),
                Self::apps(),
                "serve".into(),
                "--name".into(),
                format!("rs{i}"),
                "--log".into(),
                self.log_path(i).to_string_lossy().into_owned(),
                "--ready".into(),
                ready.to_string_lossy().into_owned(),
            ];
            for (option, addr) in listen {
                args.extend([option.to_string(), addr.to_string()]);
            }
            let argv: Vec<&str> = args.iter().map(String::as_str).collect();
            let mut p = BackgroundProcess::spawn(Some(self.bed.rs_ns(i)), &argv);
            p.wait_until(Duration::from_secs(15), "ready", || ready.exists());
            self.servers.push(p);
        }
    }

    /// Starts `e2e_apps.py serve --name rsI` on real server `i` with these listen
    /// options (as in [`start_servers_listening`](AppLab::start_servers_listening)) and
    /// `extra` arguments (e.g. `--health-path`), waits until it has bound its sockets,
    /// and returns it. The caller keeps it (see [`start_servers_with`] and
    /// [`restart_server`]).
    ///
    /// [`start_servers_with`]: AppLab::start_servers_with
    /// [`restart_server`]: AppLab::restart_server
    pub fn spawn_server(
        &self,
        i: u32,
        listen: &[(&str, &str)],
        extra: &[&str],
    ) -> BackgroundProcess {
        let ready = self.dir.path().join(format!("rs{i}.ready"));
        let _ = std::fs::remove_file(&ready);
        let mut args: Vec<String> = vec![
            PYTHON.into(),
            Self::apps(),
            "serve".into(),
            "--name".into(),
            format!("rs{i}"),
            "--log".into(),
            self.log_path(i).to_string_lossy().into_owned(),
            "--ready".into(),
            ready.to_string_lossy().into_owned(),
        ];
        for (option, addr) in listen {
            args.extend([option.to_string(), addr.to_string()]);
        }
        args.extend(extra.iter().map(|e| e.to_string()));
        let argv: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut p = BackgroundProcess::spawn(Some(self.bed.rs_ns(i)), &argv);
        p.wait_until(Duration::from_secs(15), "ready", || ready.exists());
        p
    }

    /// As [`start_servers_listening`](AppLab::start_servers_listening), with `extra(i)`
    /// arguments for real server `i`.
    pub fn start_servers_with(
        &mut self,
        listen: &[(&str, &str)],
        extra: impl Fn(u32) -> Vec<String>,
    ) {
        for i in 1..=self.bed.rs_count() {
            let more = extra(i);
            let more: Vec<&str> = more.iter().map(String::as_str).collect();
            let p = self.spawn_server(i, listen, &more);
            self.servers.push(p);
        }
    }

    /// SIGKILLs real server `i`'s `serve` process (started in order, so it is
    /// `servers[i - 1]`).
    pub fn kill_server(&mut self, i: u32) {
        self.servers[i as usize - 1].kill_now();
    }

    /// Starts real server `i`'s `serve` again (after [`kill_server`]) and waits until
    /// it is ready.
    ///
    /// [`kill_server`]: AppLab::kill_server
    pub fn restart_server(&mut self, i: u32, listen: &[(&str, &str)], extra: &[&str]) {
        let p = self.spawn_server(i, listen, extra);
        self.servers[i as usize - 1] = p;
    }

    /// Removes real server `i`'s address (its process keeps running): nothing it is
    /// sent is answered any more, not even with an RST (its routes go too).
    pub fn rs_addr_del(&self, i: u32) {
        let addr = format!("{}/24", self.bed.rs_ip(i));
        self.bed
            .exec(
                self.bed.rs_ns(i),
                &["ip", "addr", "del", &addr, "dev", self.bed.rs_if(i)],
                Duration::from_secs(10),
            )
            .expect_success("ip addr del");
    }

    /// Gives real server `i` its address back, with its default route via `gateway`.
    pub fn rs_addr_add(&self, i: u32, gateway: &str) {
        let (ns, t) = (self.bed.rs_ns(i), Duration::from_secs(10));
        let addr = format!("{}/24", self.bed.rs_ip(i));
        self.bed
            .exec(
                ns,
                &["ip", "addr", "add", &addr, "dev", self.bed.rs_if(i)],
                t,
            )
            .expect_success("ip addr add");
        self.bed
            .exec(
                ns,
                &["ip", "route", "replace", "default", "via", gateway],
                t,
            )
            .expect_success("ip route replace default");
    }

    /// Sluice on the appliance's veth (net_af_packet) with these addresses and config.
    pub fn daemon(&self, addresses: &[&str], extra_toml: String) -> Daemon {
        Daemon::start(self.daemon_config(addresses, extra_toml))
    }

    /// The config [`daemon`](AppLab::daemon) starts, to change before starting it.
    pub fn daemon_config(&self, addresses: &[&str], extra_toml: String) -> DaemonConfig {
        let mut cfg = DaemonConfig::new(vec![PortSpec::vdev(
            "lan0",
            &format!("net_af_packet0,iface={}", self.bed.lb_if()),
            addresses,
        )])
        .in_netns(self.bed.lb_ns());
        cfg.extra_toml.push(extra_toml);
        cfg
    }

    /// As [`daemon`](AppLab::daemon), with `workers` worker lcores sharing CPU 1 and
    /// one af_packet queue pair each (`qpairs`): the kernel's fanout hash, not
    /// Toeplitz, picks the worker that receives a frame.
    pub fn daemon_with_workers(
        &self,
        addresses: &[&str],
        extra_toml: String,
        workers: u32,
    ) -> Daemon {
        let mut cfg = DaemonConfig::new(vec![PortSpec::vdev(
            "lan0",
            &format!("net_af_packet0,iface={},qpairs={workers}", self.bed.lb_if()),
            addresses,
        )])
        .in_netns(self.bed.lb_ns());
        cfg.workers = (1..=workers).collect();
        cfg.cpus = Some(vec![1; workers as usize]);
        cfg.extra_toml.push(extra_toml);
        Daemon::start(cfg)
    }

    /// Flushes every neighbour cache; each real server pings Sluice (which learns it)
    /// and the client pings `client_target` through Sluice; waits until Sluice knows
    /// the client and every real server.
    pub fn prewarm(&self, daemon: &Daemon, client_target: &str) {
        let t = Duration::from_secs(10);
        let client = self.bed.client_ns();
        self.bed
            .exec(client, &["ip", "neigh", "flush", "all"], t)
            .expect_success("ip neigh flush");
        for i in 1..=self.bed.rs_count() {
            let ns = self.bed.rs_ns(i);
            self.bed
                .exec(ns, &["ip", "neigh", "flush", "all"], t)
                .expect_success("ip neigh flush");
            let ping = self.bed.exec(
                ns,
                &["ping", "-n", "-c", "1", "-W", "2", Self::APPLIANCE],
                t,
            );
            assert!(
                ping.success(),
                "real server {i} cannot ping Sluice: {}\n{}",
                ping.describe(),
                daemon.dump()
            );
        }
        let ping = self.bed.exec(
            client,
            &["ping", "-n", "-c", "1", "-W", "2", client_target],
            t,
        );
        assert!(
            ping.success(),
            "the client cannot ping {client_target} (answered by Sluice): {}\n{}",
            ping.describe(),
            daemon.dump()
        );
        let want = u64::from(self.bed.rs_count()) + 1;
        let known = wait_for(Duration::from_secs(5), Duration::from_millis(50), || {
            (daemon.status()["neighbours"].as_u64().unwrap_or(0) >= want).then_some(())
        });
        assert!(
            known.is_some(),
            "Sluice did not learn the client and the {} real servers: {:#}",
            want - 1,
            daemon.status()
        );
    }

    /// `count` curl requests to `url` from the client, each on a new connection,
    /// `parallel` at a time, bounded; `e2e_apps.py curl`'s JSON.
    pub fn curl(&self, url: &str, count: u64, parallel: u32, extra: &[&str]) -> serde_json::Value {
        let (apps, count_s, parallel_s) = (Self::apps(), count.to_string(), parallel.to_string());
        let mut args = vec![
            PYTHON,
            &apps,
            "curl",
            url,
            "--count",
            &count_s,
            "--parallel",
            &parallel_s,
            "--max-time",
            Self::CURL_MAX_TIME,
        ];
        args.extend_from_slice(extra);
        let out = self
            .bed
            .exec(self.bed.client_ns(), &args, Self::BATCH_TIMEOUT);
        let v: serde_json::Value = serde_json::from_str(out.stdout.trim())
            .unwrap_or_else(|e| panic!("curl batch printed no JSON ({e}): {}", out.describe()));
        eprintln!(
            "{count} requests to {url}: {} ok in {} s, by real server {}",
            v["ok"], v["seconds"], v["bodies"]
        );
        v
    }

    /// `count` requests to `url` from the client, one at a time (`curl`): all must
    /// succeed, on one real server, whose body (`rs1`, ...) is returned.
    pub fn curl_one_server(&self, url: &str, count: u64, daemon: &Daemon) -> String {
        let batch = self.curl(url, count, 1, &[]);
        assert_eq!(
            batch["ok"].as_u64(),
            Some(count),
            "{batch}\n{}",
            daemon.dump()
        );
        let bodies = batch["bodies"].as_object().unwrap();
        assert_eq!(bodies.len(), 1, "one server for the client: {batch}");
        bodies.keys().next().unwrap().clone()
    }

    /// `count` UDP exchanges with `addr:port` from the client (`e2e_apps.py udp`):
    /// the command's output and its JSON.
    pub fn udp(
        &self,
        addr: &str,
        port: u16,
        count: u32,
        sport_base: u16,
    ) -> (CmdOutput, serde_json::Value) {
        let out = self.bed.exec(
            self.bed.client_ns(),
            &[
                PYTHON,
                &Self::apps(),
                "udp",
                addr,
                &port.to_string(),
                "--count",
                &count.to_string(),
                "--sport-base",
                &sport_base.to_string(),
                "--timeout",
                "2",
            ],
            Duration::from_secs(u64::from(count) * 3 + 10),
        );
        let v: serde_json::Value = serde_json::from_str(out.stdout.trim())
            .unwrap_or_else(|e| panic!("udp client printed no JSON ({e}): {}", out.describe()));
        (out, v)
    }

    /// A frag-needed (IPv4 `vip`) or Packet Too Big (IPv6) announcing `mtu`, from the
    /// client (`source`) about a UDP echo of `vip:vport`, must be dropped as
    /// `icmp_too_big_about_udp`, judged by the kernels: `e2e_apps.py too-big`
    /// exchanges a 1400-byte datagram before and after sending it, and real server
    /// 1's route to `server_sees` (the address the server sends its echoes to) must
    /// carry no path MTU, and the second echo must come back.
    pub fn assert_too_big_about_udp_is_dropped(
        &self,
        daemon: &Daemon,
        (vip, vport): (&str, u16),
        source: &str,
        mtu: u16,
        server_sees: &str,
    ) {
        let out = self
            .bed
            .exec(
                self.bed.client_ns(),
                &[
                    PYTHON,
                    &Self::apps(),
                    "too-big",
                    vip,
                    &vport.to_string(),
                    "--source",
                    source,
                    "--mtu",
                    &mtu.to_string(),
                ],
                Duration::from_secs(20),
            )
            .expect_success("UDP exchanges around a frag-needed");
        let v: serde_json::Value = serde_json::from_str(out.stdout.trim())
            .unwrap_or_else(|e| panic!("no JSON ({e}): {}", out.describe()));
        assert!(
            v["first"].as_i64().unwrap() > 1400,
            "{v}\n{}\n{}",
            self.diagnostics(),
            daemon.dump()
        );
        let family = if server_sees.contains(':') {
            "-6"
        } else {
            "-4"
        };
        let route = self
            .bed
            .exec(
                self.bed.rs_ns(1),
                &["ip", family, "route", "get", server_sees],
                Duration::from_secs(5),
            )
            .expect_success("ip route get");
        assert!(
            !route.stdout.contains("mtu"),
            "the real server lowered its path MTU to {server_sees}: {}",
            route.stdout
        );
        assert!(
            v["second"].as_i64().unwrap() > 1400,
            "the echo after the error was lost: {v}\n{}",
            daemon.dump()
        );
        let status = daemon.status();
        assert_eq!(
            drop_count(&status, "icmp_too_big_about_udp"),
            1,
            "{status:#}"
        );
    }

    /// Real server `i`'s log lines of `kind` ("http" or "udp"): `KIND CLIENT_IP
    /// CLIENT_PORT LOCAL_IP:LOCAL_PORT`.
    pub fn log_lines(&self, i: u32, kind: &str) -> Vec<String> {
        read_lines(&self.log_path(i))
            .into_iter()
            .filter(|l| l.starts_with(&format!("{kind} ")))
            .collect()
    }

    /// The number of HTTP log lines of each real server, to tell a batch's lines apart.
    pub fn http_log_len(&self) -> Vec<usize> {
        (1..=self.bed.rs_count())
            .map(|i| self.log_lines(i, "http").len())
            .collect()
    }

    /// A curl batch's answers by real-server name (`rs1`...).
    pub fn answers(batch: &serde_json::Value) -> BTreeMap<String, u64> {
        batch["bodies"]
            .as_object()
            .map(|o| {
                o.iter()
                    .map(|(k, v)| (k.clone(), v.as_u64().unwrap()))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// `tests/tools/blind_segments.py` in the client's namespace, against the echo
    /// service at `vip:port` through `daemon`: a RST, a FIN and a SYN in the client's
    /// name, about half the sequence space from its own, then the client's own RST.
    /// Asserts what a sequence-checking session must show: it stays ESTABLISHED and
    /// echoes through the forgeries, the client's RST closes it, and the worker counts
    /// the forged RST and FIN as `tcp_close_out_of_window`.
    pub fn assert_blind_segments_move_nothing(
        &self,
        daemon: &Daemon,
        vip: &str,
        port: u16,
        client: &str,
    ) {
        let argv = blind_segments_argv(daemon.socket(), self.bed.client_if(), vip, port, client);
        let args: Vec<&str> = argv.iter().map(String::as_str).collect();
        let before = daemon.status();
        let out = self
            .bed
            .exec(self.bed.client_ns(), &args, Duration::from_secs(30));
        let after = daemon.status();
        let lines: Vec<&str> = out.stdout.lines().collect();
        assert_eq!(
            lines,
            blind_segments_moved_nothing(false),
            "{}\n{after:#}\n{}",
            out.describe(),
            self.diagnostics()
        );
        let counted = event_count(&after, "tcp_close_out_of_window")
            - event_count(&before, "tcp_close_out_of_window");
        assert_eq!(counted, 2, "the forged RST and FIN: {after:#}");
    }

    /// The kernels' view, for failure messages: link counters of the switch and the
    /// appliance, TCP/UDP counters and neighbours of the client and real servers.
    pub fn diagnostics(&self) -> String {
        let mut out = String::new();
        let name = &self.bed.name;
        let run = |ns: &str, args: &[&str]| {
            let o = netns_exec(ns, args, Duration::from_secs(10));
            format!("--- {ns}: {} ---\n{}{}", args.join(" "), o.stdout, o.stderr)
        };
        out += &run(&format!("{name}-sw"), &["ip", "-s", "link"]);
        out += &run(self.bed.lb_ns(), &["ip", "-s", "link"]);
        let mut kernels = vec![self.bed.client_ns().to_string()];
        kernels.extend((1..=self.bed.rs_count()).map(|i| self.bed.rs_ns(i).to_string()));
        for ns in &kernels {
            out += &run(ns, &["nstat", "-as"]);
            out += &run(ns, &["ip", "neigh"]);
        }
        out
    }

    /// Every checksum error counter of the bed's kernels must be 0: a checksum Sluice
    /// got wrong shows up here even if a retransmission hid it.
    pub fn assert_no_checksum_errors(&self) {
        let mut namespaces = vec![self.bed.client_ns().to_string()];
        namespaces.extend((1..=self.bed.rs_count()).map(|i| self.bed.rs_ns(i).to_string()));
        for ns in namespaces {
            let out = self
                .bed
                .exec(
                    &ns,
                    &[
                        "nstat",
                        "-asz",
                        "TcpInCsumErrors",
                        "UdpInCsumErrors",
                        "IcmpInCsumErrors",
                    ],
                    Duration::from_secs(10),
                )
                .expect_success("nstat");
            for line in out.stdout.lines().filter(|l| !l.starts_with('#')) {
                let mut w = line.split_whitespace();
                let (Some(name), Some(value)) = (w.next(), w.next()) else {
                    continue;
                };
                assert_eq!(value, "0", "{ns}: {name} = {value}\n{}", out.stdout);
            }
        }
    }
}

/// `tests/tools/blind_segments.py`'s command line (run it in the client's
/// namespace, on its interface `iface`): against the echo service at `vip:port`, the
/// daemon at `socket` listing the session, a RST, a FIN and a SYN forged in `client`'s
/// name.
pub fn blind_segments_argv(
    socket: &std::path::Path,
    iface: &str,
    vip: &str,
    port: u16,
    client: &str,
) -> Vec<String> {
    let tool = tool("blind_segments.py").to_string_lossy().into_owned();
    let socket = socket.to_string_lossy().into_owned();
    [
        PYTHON, &tool, "--ctl", SLUICECTL, "--socket", &socket, "--iface", iface,
    ]
    .into_iter()
    .map(String::from)
    .chain([
        "--vip".to_string(),
        vip.to_string(),
        "--port".to_string(),
        port.to_string(),
        "--client".to_string(),
        client.to_string(),
        "--syn".to_string(),
    ])
    .collect()
}

/// What `blind_segments.py` prints when its forgeries moved nothing and the
/// client's own RST closed the session (with `held`, a `--hold` run: one more echo
/// after GO).
pub fn blind_segments_moved_nothing(held: bool) -> Vec<&'static str> {
    let mut lines = vec!["echo before True", "state before ESTABLISHED"];
    if held {
        lines.push("echo held True");
    }
    lines.extend([
        "state forged ESTABLISHED",
        "echo after True",
        "state reset CLOSE",
    ]);
    lines
}

/// `e2e_apps.py stream` running in the client's namespace (see [`AppLab::stream`]).
pub struct StreamClient {
    process: BackgroundProcess,
    out: PathBuf,
    stop: PathBuf,
}

impl AppLab {
    /// Starts `e2e_apps.py stream` from the client against `vip:port` with `options`
    /// (`--long`, `--interval-ms`, `--new-per-s`, `--duration`, ...; the output,
    /// ready and stop files are added here) and returns once its long connections are
    /// open, or failed, within 20 s. `tag` names its files in the lab's directory.
    pub fn stream(&self, tag: &str, vip: &str, port: u16, options: &[&str]) -> StreamClient {
        let path = |ext: &str| self.dir.path().join(format!("stream-{tag}.{ext}"));
        let (out, ready, stop) = (path("json"), path("ready"), path("stop"));
        let (apps, port_s) = (Self::apps(), port.to_string());
        let (out_s, ready_s, stop_s) = (
            out.to_string_lossy().into_owned(),
            ready.to_string_lossy().into_owned(),
            stop.to_string_lossy().into_owned(),
        );
        let mut args = vec![PYTHON, &apps, "stream", vip, &port_s];
        args.extend_from_slice(options);
        args.extend_from_slice(&["--out", &out_s, "--ready", &ready_s, "--stop", &stop_s]);
        let mut process = BackgroundProcess::spawn(Some(self.bed.client_ns()), &args);
        process.wait_until(Duration::from_secs(20), "long connections open", || {
            ready.exists()
        });
        StreamClient { process, out, stop }
    }
}

impl StreamClient {
    /// Tells the client to stop (its stop file) and returns its JSON report, waiting
    /// at most 15 s for it.
    pub fn stop_and_report(self) -> serde_json::Value {
        self.stop_and_report_with_exit().0
    }

    /// As [`StreamClient::stop_and_report`], with the client's exit code (1 when any
    /// connection failed) and its stderr.
    pub fn stop_and_report_with_exit(mut self) -> (serde_json::Value, Option<i32>, String) {
        std::fs::write(&self.stop, b"").expect("stop file");
        let out = self.out.clone();
        self.process
            .wait_until(Duration::from_secs(15), "stream client done", || {
                out.exists()
            });
        let exit = self.process.wait_exit(Duration::from_secs(15));
        let report =
            serde_json::from_str(&std::fs::read_to_string(&self.out).expect("stream report"))
                .expect("stream JSON");
        (
            report,
            exit.and_then(|e| e.code()),
            self.process.stderr_text(),
        )
    }
}
