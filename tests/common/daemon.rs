//! A `sluice` process under test: [`Daemon`] starts it from a [`DaemonConfig`]
//! (optionally inside a network namespace), waits until `sluicectl status` answers,
//! drives it through `sluicectl`, stops it with a signal within a bound, and on `Drop`
//! kills it if still running and prints its output when the test failed. The free
//! functions read fields out of its JSON reports.

use super::config::DaemonConfig;
use super::process::{
    describe_command, drain, run_bounded, text, unique_tag, wait_with_deadline, BackgroundProcess,
    CmdOutput,
};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// The daemon under test, built by Cargo for this test run.
pub const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");
/// The CLI under test, built by Cargo for this test run.
pub const SLUICECTL: &str = env!("CARGO_BIN_EXE_sluicectl");

/// How long a daemon gets to answer its first `sluicectl status`.
pub const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a daemon gets to exit after SIGTERM/SIGINT.
pub const EXIT_TIMEOUT: Duration = Duration::from_secs(10);

/// The DPDK runtime directories that exist for `prefix` (should be none after exit).
pub fn dpdk_runtime_dirs(prefix: &str) -> Vec<PathBuf> {
    ["/var/run/dpdk", "/run/dpdk"]
        .iter()
        .map(|d| Path::new(d).join(prefix))
        .filter(|p| p.exists())
        .collect()
}

/// A running (or exited) `sluice` process.
pub struct Daemon {
    pub config: DaemonConfig,
    pub config_path: PathBuf,
    child: Child,
    stdout: Arc<Mutex<Vec<u8>>>,
    stderr: Arc<Mutex<Vec<u8>>>,
    readers: Vec<JoinHandle<()>>,
    exit: Option<ExitStatus>,
}

impl Daemon {
    /// Starts the daemon and waits (at most [`READY_TIMEOUT`]) until `sluicectl status`
    /// answers. Panics with the daemon's output if it exits or never answers.
    pub fn start(config: DaemonConfig) -> Daemon {
        let mut d = Daemon::spawn(config);
        d.wait_ready(READY_TIMEOUT);
        d
    }

    /// Writes the config and starts the daemon, without waiting for anything.
    pub fn spawn(config: DaemonConfig) -> Daemon {
        Daemon::spawn_with_env(config, &[])
    }

    /// [`Daemon::spawn`] with these environment variables set for the daemon.
    pub fn spawn_with_env(config: DaemonConfig, env: &[(&str, &str)]) -> Daemon {
        Daemon::spawn_inner(config, env, true)
    }

    /// [`Daemon::spawn`] with stdout a pipe nobody reads: its read end is closed at once,
    /// so every write to it fails with EPIPE (`sluice ... | head` once head is done).
    pub fn spawn_with_stdout_closed(config: DaemonConfig) -> Daemon {
        Daemon::spawn_inner(config, &[], false)
    }

    fn spawn_inner(config: DaemonConfig, env: &[(&str, &str)], read_stdout: bool) -> Daemon {
        let config_path = config.write();
        // `ip netns exec` and the wrapper exec the next program: the child pid is
        // sluice's own.
        let mut argv: Vec<&str> = match &config.netns {
            Some(ns) => vec!["ip", "netns", "exec", ns],
            None => Vec::new(),
        };
        argv.extend(config.wrapper.iter().map(String::as_str));
        argv.push(SLUICE);
        let mut cmd = Command::new(argv[0]);
        cmd.args(&argv[1..]);
        cmd.arg("--config").arg(&config_path).args(&config.args);
        cmd.envs(env.iter().copied());
        let what = describe_command(&cmd);
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start `{what}`: {e}"));
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let mut readers = vec![drain(child.stderr.take().unwrap(), stderr.clone())];
        let out = child.stdout.take().unwrap();
        match read_stdout {
            true => readers.push(drain(out, stdout.clone())),
            false => drop(out),
        }
        Daemon {
            config,
            config_path,
            child,
            stdout,
            stderr,
            readers,
            exit: None,
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn socket(&self) -> &Path {
        &self.config.socket
    }

    /// `sluicectl capture -w file FILTER...` in the background, once the daemon
    /// reports the capture running (within 5 s, else the test fails).
    pub fn start_capture(&self, file: &Path, filter: &[&str]) -> BackgroundProcess {
        let socket = self.socket().to_string_lossy().into_owned();
        let file = file.to_string_lossy().into_owned();
        let mut argv = vec![SLUICECTL, "-S", &socket, "capture", "-w", &file];
        argv.extend_from_slice(filter);
        let capture = BackgroundProcess::spawn(None, &argv);
        let running =
            super::process::wait_for(Duration::from_secs(5), Duration::from_millis(50), || {
                self.ctl(&["--json", "capture", "--status"])
                    .stdout
                    .contains("\"running\": true")
                    .then_some(())
            });
        assert!(
            running.is_some(),
            "the capture did not start: {}",
            capture.stderr_text()
        );
        capture
    }

    pub fn stderr_text(&self) -> String {
        text(&self.stderr)
    }

    pub fn stdout_text(&self) -> String {
        text(&self.stdout)
    }

    /// Config, stdout and stderr, for failure messages.
    pub fn dump(&self) -> String {
        format!(
            "--- sluice config {} ---\n{}--- sluice stdout ---\n{}\n--- sluice stderr ---\n{}",
            self.config_path.display(),
            self.config.toml(),
            self.stdout_text(),
            self.stderr_text()
        )
    }

    /// Exit status if the process has exited (reaped once, remembered).
    pub fn try_exit(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            if let Ok(Some(status)) = self.child.try_wait() {
                self.exit = Some(status);
                self.join_readers();
            }
        }
        self.exit
    }

    fn join_readers(&mut self) {
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
    }

    /// Polls until `sluicectl status` answers; panics if the daemon exits first or the
    /// time runs out.
    pub fn wait_ready(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.try_exit() {
                panic!(
                    "sluice exited with {status} before answering on its control socket\n{}",
                    self.dump()
                );
            }
            if self.config.socket.exists() && self.ctl(&["--timeout", "1", "status"]).success() {
                return;
            }
            if Instant::now() >= deadline {
                panic!(
                    "sluice did not answer `sluicectl status` within {timeout:?}\n{}",
                    self.dump()
                );
            }
            thread::sleep(Duration::from_millis(100));
        }
    }

    /// `sluicectl --socket SOCKET ARGS...`, bounded (15 s).
    pub fn ctl(&self, args: &[&str]) -> CmdOutput {
        run_bounded(
            Command::new(SLUICECTL)
                .arg("--socket")
                .arg(&self.config.socket)
                .args(args),
            Duration::from_secs(15),
        )
    }

    /// `sluicectl ARGS`, which must succeed; its wall-clock ([`wall_now`]) just
    /// before and just after.
    pub fn ctl_timed(&self, args: &[&str]) -> (f64, f64) {
        let before = super::process::wall_now();
        let out = self.ctl(args);
        let after = super::process::wall_now();
        assert!(out.success(), "{}\n{}", out.describe(), self.dump());
        (before, after)
    }

    /// `sluicectl --socket SOCKET -R` with `input` on stdin, bounded (15 s).
    pub fn restore(&self, input: &str) -> CmdOutput {
        let file = self.config.path(&format!("restore-{}.txt", unique_tag()));
        std::fs::write(&file, input).expect("writing the restore input");
        let line = format!(
            "{SLUICECTL} --socket {} -R < {}",
            self.config.socket.display(),
            file.display()
        );
        run_bounded(
            Command::new("sh").args(["-c", &line]),
            Duration::from_secs(15),
        )
    }

    /// `sluicectl status --json`, parsed. Panics (with the daemon's output) on failure.
    pub fn status(&self) -> serde_json::Value {
        let out = self.ctl(&["status", "--json"]);
        assert!(
            out.success(),
            "sluicectl status --json failed: {}\n{}",
            out.describe(),
            self.dump()
        );
        serde_json::from_str(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "sluicectl status --json printed invalid JSON ({e}):\n{}",
                out.stdout
            )
        })
    }

    /// The connections listing in pages of `max` (`{"cmd":"list_connections"}` with
    /// a cursor, over one connection), each page's entries; at most 10,000 pages.
    pub fn connection_pages(&self, max: u32) -> Vec<Vec<serde_json::Value>> {
        use std::io::{BufRead, Write};
        let mut socket =
            std::os::unix::net::UnixStream::connect(&self.config.socket).expect("control socket");
        socket
            .set_read_timeout(Some(Duration::from_secs(10)))
            .unwrap();
        let mut reader = std::io::BufReader::new(socket.try_clone().unwrap());
        let (mut page, mut pages) = (serde_json::json!({"worker": 0, "from": 0}), Vec::new());
        for _ in 0..10_000 {
            let request = serde_json::json!({"cmd": "list_connections", "max": max, "page": page});
            writeln!(socket, "{request}").unwrap();
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            let reply: serde_json::Value = serde_json::from_str(&line)
                .unwrap_or_else(|e| panic!("list_connections answered {line:?}: {e}"));
            pages.push(reply["result"]["connections"].as_array().unwrap().clone());
            match reply["result"].get("next") {
                Some(next) => page = next.clone(),
                None => return pages,
            }
        }
        panic!("list_connections: no last page after 10,000 pages of {max}")
    }

    /// `sluicectl -L -n --stats --json` (ipvsadm -Ln --stats), parsed: `{"services":
    /// [{"proto", "vip", "port", "scheduler", "real_servers": [{"ip", "port", "weight",
    /// "mode", "active", "inactive", "connections", "in_packets", ...}]}]}`.
    pub fn list_services(&self) -> serde_json::Value {
        let out = self.ctl(&["-L", "-n", "--stats", "--json"]);
        assert!(
            out.success(),
            "sluicectl -L -n --stats --json failed: {}\n{}",
            out.describe(),
            self.dump()
        );
        serde_json::from_str(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "sluicectl -L -n --stats --json printed invalid JSON ({e}):\n{}",
                out.stdout
            )
        })
    }

    /// `sluicectl neigh --json`, parsed: `{"workers": [...], "neighbours": [...],
    /// "unresolved": [...]}`.
    pub fn neighbours(&self) -> serde_json::Value {
        let out = self.ctl(&["neigh", "--json"]);
        assert!(
            out.success(),
            "sluicectl neigh --json failed: {}\n{}",
            out.describe(),
            self.dump()
        );
        serde_json::from_str(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "sluicectl neigh --json printed invalid JSON ({e}):\n{}",
                out.stdout
            )
        })
    }

    /// `sluicectl health --json`, parsed: `{"targets": [...], "stats": {...}}`.
    pub fn health(&self) -> serde_json::Value {
        let out = self.ctl(&["health", "--json"]);
        assert!(
            out.success(),
            "sluicectl health --json failed: {}\n{}",
            out.describe(),
            self.dump()
        );
        serde_json::from_str(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "sluicectl health --json printed invalid JSON ({e}):\n{}",
                out.stdout
            )
        })
    }

    /// The lines of `sluicectl events --json` (`lb=...`, without their stamps), oldest
    /// first.
    pub fn event_lines(&self) -> Vec<String> {
        let out = self.ctl(&["events", "--json"]);
        assert!(
            out.success(),
            "sluicectl events --json failed: {}\n{}",
            out.describe(),
            self.dump()
        );
        let v: serde_json::Value = serde_json::from_str(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "sluicectl events --json printed invalid JSON ({e}):\n{}",
                out.stdout
            )
        });
        v["events"]
            .as_array()
            .unwrap_or_else(|| panic!("no `events` array: {v}"))
            .iter()
            .map(|e| e["line"].as_str().unwrap_or_default().to_string())
            .collect()
    }

    /// `sluicectl vrrp --json`, parsed (see `ha::vrrp::node::VrrpReport`).
    pub fn vrrp(&self) -> serde_json::Value {
        let out = self.ctl(&["vrrp", "--json"]);
        assert!(
            out.success(),
            "sluicectl vrrp --json failed: {}\n{}",
            out.describe(),
            self.dump()
        );
        serde_json::from_str(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "sluicectl vrrp --json printed invalid JSON ({e}):\n{}",
                out.stdout
            )
        })
    }

    /// Sends a signal to the daemon.
    pub fn signal(&self, sig: libc::c_int) {
        if self.exit.is_some() {
            return;
        }
        // SAFETY: kill(2) on our own child's pid; the child is not reaped yet (exit is
        // None and only try_exit/wait reap it), so the pid cannot have been reused.
        let rc = unsafe { libc::kill(self.pid(), sig) };
        assert_eq!(
            rc,
            0,
            "kill({}, {sig}): {}",
            self.pid(),
            std::io::Error::last_os_error()
        );
    }

    /// Waits at most `timeout` for the daemon to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        if self.exit.is_none() {
            if let Some(status) = wait_with_deadline(&mut self.child, timeout) {
                self.exit = Some(status);
                self.join_readers();
            }
        }
        self.exit
    }

    /// Sends `sig` and returns the exit status; panics if the daemon is still running
    /// after [`EXIT_TIMEOUT`] (Drop then kills it).
    pub fn stop_with(&mut self, sig: libc::c_int) -> ExitStatus {
        self.signal(sig);
        let started = Instant::now();
        match self.wait_exit(EXIT_TIMEOUT) {
            Some(status) => {
                eprintln!(
                    "sluice exited with {status} {:?} after signal {sig}",
                    started.elapsed()
                );
                status
            }
            None => panic!(
                "sluice still running {EXIT_TIMEOUT:?} after signal {sig}\n{}",
                self.dump()
            ),
        }
    }

    /// SIGTERM, then the exit status (bounded by [`EXIT_TIMEOUT`]).
    pub fn terminate(&mut self) -> ExitStatus {
        self.stop_with(libc::SIGTERM)
    }

    /// SIGTERM; asserts exit 0 and that no DPDK runtime directory is left.
    pub fn stop_clean(mut self) {
        let exit = self.terminate();
        assert!(exit.success(), "sluice exited with {exit}\n{}", self.dump());
        assert!(
            dpdk_runtime_dirs(&self.config.file_prefix).is_empty(),
            "DPDK runtime dir left behind"
        );
    }

    /// SIGKILL (a crash: no resign, no clean-up), reaped within 5 s; removes the DPDK
    /// runtime directory the killed process leaves behind.
    pub fn kill_hard(&mut self) {
        self.signal(libc::SIGKILL);
        assert!(
            self.wait_exit(Duration::from_secs(5)).is_some(),
            "sluice still running 5 s after SIGKILL\n{}",
            self.dump()
        );
        for dir in dpdk_runtime_dirs(&self.config.file_prefix) {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let mut killed = false;
        if self.try_exit().is_none() {
            // Still running (the test failed half-way): SIGTERM first so DPDK cleans
            // up its runtime directory, SIGKILL if that does not work within 5 s.
            killed = true;
            // Never panic in Drop (it may run during a panic): no assertion here.
            // SAFETY: as in `signal`; the child is not reaped yet.
            unsafe { libc::kill(self.pid(), libc::SIGTERM) };
            if self.wait_exit(Duration::from_secs(5)).is_none() {
                let _ = self.child.kill();
                if let Some(status) = wait_with_deadline(&mut self.child, Duration::from_secs(5)) {
                    self.exit = Some(status);
                    self.join_readers();
                }
            }
        }
        let clean = matches!(self.exit, Some(s) if s.success());
        if thread::panicking() || killed || !clean {
            eprintln!(
                "=== sluice (pid {}) {} ===\n{}",
                self.pid(),
                if killed {
                    format!(
                        "was still running at the end of the test; stopped: {:?}",
                        self.exit
                    )
                } else {
                    format!("exited with {:?}", self.exit)
                },
                self.dump()
            );
        }
    }
}

/// `status["drops"][reason]`, 0 when absent.
pub fn drop_count(status: &serde_json::Value, reason: &str) -> u64 {
    status["drops"][reason].as_u64().unwrap_or(0)
}

/// `status["events"][name]`; panics when absent (every event is always reported).
pub fn event_count(status: &serde_json::Value, name: &str) -> u64 {
    status["events"][name]
        .as_u64()
        .unwrap_or_else(|| panic!("status has no events.{name}: {status}"))
}

/// The port entry called `name` in `status["ports"]`.
pub fn port<'a>(status: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    status["ports"]
        .as_array()
        .and_then(|ports| ports.iter().find(|p| p["name"] == name))
        .unwrap_or_else(|| panic!("status has no port {name:?}: {status}"))
}

/// A numeric field of a port entry; panics when absent.
pub fn port_counter(status: &serde_json::Value, port_name: &str, field: &str) -> u64 {
    port(status, port_name)[field]
        .as_u64()
        .unwrap_or_else(|| panic!("port {port_name} has no numeric {field}: {status}"))
}

/// `status["sessions"]`: live sessions over all workers; panics when absent.
pub fn session_count(status: &serde_json::Value) -> u64 {
    status["sessions"]
        .as_u64()
        .unwrap_or_else(|| panic!("status has no numeric `sessions`: {status}"))
}

/// The service `proto vip:port` in a [`Daemon::list_services`] result, if listed.
pub fn find_service<'a>(
    list: &'a serde_json::Value,
    proto: &str,
    vip: &str,
    port: u16,
) -> Option<&'a serde_json::Value> {
    list["services"]
        .as_array()?
        .iter()
        .find(|s| s["proto"] == proto && s["vip"] == vip && s["port"].as_u64() == Some(port as u64))
}

/// Real server `rip` (any port) of service `proto vip:port`; panics when absent.
pub fn real_server<'a>(
    list: &'a serde_json::Value,
    proto: &str,
    vip: &str,
    port: u16,
    rip: &str,
) -> &'a serde_json::Value {
    find_service(list, proto, vip, port)
        .and_then(|s| s["real_servers"].as_array())
        .and_then(|rs| rs.iter().find(|r| r["ip"] == rip))
        .unwrap_or_else(|| panic!("no real server {rip} in {proto} {vip}:{port}: {list:#}"))
}

/// A numeric field of a real-server entry; panics when absent.
pub fn rs_counter(rs: &serde_json::Value, field: &str) -> u64 {
    rs[field]
        .as_u64()
        .unwrap_or_else(|| panic!("real server has no numeric {field}: {rs}"))
}

/// The health target of real server `ip` in service `service` (`VIP:PORT/PROTO`) in a
/// [`Daemon::health`] result; panics when absent.
pub fn health_target<'a>(
    health: &'a serde_json::Value,
    service: &str,
    ip: &str,
) -> &'a serde_json::Value {
    health["targets"]
        .as_array()
        .and_then(|t| t.iter().find(|t| t["service"] == service && t["ip"] == ip))
        .unwrap_or_else(|| panic!("no health target {ip} in {service}: {health:#}"))
}

/// Clients that flood a daemon's control socket: each pipelines, over its own
/// connection, 25 pairs of adding and deleting a service (its own, `vip` at port
/// `first_port + k`), then reads the 50 answers, and again, until stopped. More
/// clients than the control server has executors keep its queue from ever emptying.
pub struct ControlFlood {
    stop: Arc<std::sync::atomic::AtomicBool>,
    clients: Vec<JoinHandle<u64>>,
}

impl ControlFlood {
    pub fn start(socket: &Path, clients: u8, vip: std::net::Ipv4Addr, first_port: u16) -> Self {
        use sluice::control::protocol::Request;
        use sluice::model::{Protocol, SchedulerKind, ServiceKey};
        use std::io::{BufRead, BufReader, Write};
        use std::os::unix::net::UnixStream;
        use std::sync::atomic::Ordering;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let clients = (0..clients)
            .map(|k| {
                let (path, stop) = (socket.to_path_buf(), stop.clone());
                thread::spawn(move || {
                    let service = ServiceKey::new(Protocol::Tcp, vip, first_port + u16::from(k));
                    let add = Request::AddService {
                        service,
                        scheduler: Some(SchedulerKind::Rr),
                        persistence: None,
                        sched_flags: None,
                    };
                    let lines = format!(
                        "{}\n{}\n",
                        serde_json::to_string(&add).unwrap(),
                        serde_json::to_string(&Request::DeleteService { service }).unwrap()
                    )
                    .repeat(25);
                    let stream = UnixStream::connect(&path).expect("control socket");
                    let mut reader = BufReader::new(stream.try_clone().unwrap());
                    let mut writer = stream;
                    let (mut answered, mut line) = (0u64, String::new());
                    while !stop.load(Ordering::Relaxed) {
                        writer
                            .write_all(lines.as_bytes())
                            .expect("pipelined requests");
                        for _ in 0..50 {
                            line.clear();
                            if reader.read_line(&mut line).unwrap_or(0) == 0 {
                                return answered;
                            }
                            answered += 1;
                        }
                    }
                    answered
                })
            })
            .collect();
        ControlFlood { stop, clients }
    }

    /// Stops the clients (each after its round of 50 answers); the answers they read
    /// in all.
    pub fn stop(self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.clients.into_iter().map(|c| c.join().unwrap()).sum()
    }
}
