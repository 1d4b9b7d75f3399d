//! Shared fixtures for Sluice's integration tests (tiers 2 and 3 of docs/TESTING.md).
//!
//! - [`require_root`]: fails (never skips) a test that is not run as root.
//! - [`unique_tag`]: short names unique per process and call, so test binaries and
//!   tests can run side by side (DPDK file prefixes, test-bed names, sockets).
//! - [`run_bounded`]: runs a command with a deadline; every external command goes
//!   through it, so no test can hang.
//! - [`Testbed`]: `scripts/testbed.sh up` with a unique name; `Drop` runs `down`, also
//!   when the test panics.
//! - [`Daemon`]: writes a config into a temp dir, starts `sluice` (optionally inside a
//!   network namespace), waits until `sluicectl status` answers, stops it with a
//!   signal within a bound; `Drop` kills it if still running and prints its output
//!   when the test failed.
#![allow(dead_code)]

pub mod eal;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// The daemon and the CLI under test, built by Cargo for this test run.
pub const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");
pub const SLUICECTL: &str = env!("CARGO_BIN_EXE_sluicectl");
/// Debian's interpreter: the one that sees python3-scapy (the `python3` first on PATH
/// may be another build).
pub const PYTHON: &str = "/usr/bin/python3";

/// How long a daemon gets to answer its first `sluicectl status`.
pub const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a daemon gets to exit after SIGTERM/SIGINT.
pub const EXIT_TIMEOUT: Duration = Duration::from_secs(10);

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub fn tool(name: &str) -> PathBuf {
    repo_root().join("tests/tools").join(name)
}

/// Fails the test with a clear message unless it runs as root. Tests that need root
/// (DPDK's runtime directory, AF_PACKET, network namespaces) are never skipped
/// silently: a green run means they really ran.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "this test must run as root (it starts DPDK and/or builds network namespaces); \
         run e.g. `sudo -E cargo test --release --test <name>` (euid is {euid})"
    );
}

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A 7-character [0-9a-z] tag, unique among all live processes on this host and all
/// calls in this process: 5 base-36 digits of the pid (pid_max <= 2^22 < 36^5), then 2
/// of a per-process counter. Used for test-bed names, DPDK file prefixes and paths.
pub fn unique_tag() -> String {
    let n = COUNTER.fetch_add(1, Ordering::SeqCst);
    assert!(
        n < 36 * 36,
        "unique_tag: more than 1296 tags in one process"
    );
    format!("{}{}", base36(std::process::id(), 5), base36(n, 2))
}

fn base36(mut v: u32, width: usize) -> String {
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut out = vec![b'0'; width];
    for slot in out.iter_mut().rev() {
        *slot = DIGITS[(v % 36) as usize];
        v /= 36;
    }
    assert_eq!(v, 0, "value does not fit in {width} base-36 digits");
    String::from_utf8(out).unwrap()
}

/// The output of a command that ran to completion.
#[derive(Debug)]
pub struct CmdOutput {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
    /// The command line, for messages.
    pub what: String,
}

impl CmdOutput {
    pub fn success(&self) -> bool {
        self.status.success()
    }

    /// Panics with the whole output unless the command succeeded.
    pub fn expect_success(self, context: &str) -> CmdOutput {
        assert!(self.success(), "{context}: {}", self.describe());
        self
    }

    pub fn describe(&self) -> String {
        format!(
            "`{}` exited with {}\n--- stdout ---\n{}\n--- stderr ---\n{}",
            self.what, self.status, self.stdout, self.stderr
        )
    }
}

fn describe_command(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Collects a pipe into a shared buffer on a thread of its own.
fn drain<R: Read + Send + 'static>(mut pipe: R, buf: Arc<Mutex<Vec<u8>>>) -> JoinHandle<()> {
    thread::spawn(move || {
        let mut chunk = [0u8; 8192];
        loop {
            match pipe.read(&mut chunk) {
                Ok(0) | Err(_) => break,
                Ok(n) => buf.lock().unwrap().extend_from_slice(&chunk[..n]),
            }
        }
    })
}

fn text(buf: &Arc<Mutex<Vec<u8>>>) -> String {
    String::from_utf8_lossy(&buf.lock().unwrap()).into_owned()
}

/// Waits for `child` to exit, polling, for at most `timeout`.
fn wait_with_deadline(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Some(status),
            Ok(None) if Instant::now() >= deadline => return None,
            Ok(None) => thread::sleep(Duration::from_millis(20)),
            Err(e) => panic!("waiting for child {}: {e}", child.id()),
        }
    }
}

/// Runs `cmd` to completion with stdin closed and stdout/stderr captured. Panics if it
/// cannot be started or does not finish within `timeout` (it is killed first).
pub fn run_bounded(cmd: &mut Command, timeout: Duration) -> CmdOutput {
    let what = describe_command(cmd);
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start `{what}`: {e}"));
    let out = Arc::new(Mutex::new(Vec::new()));
    let err = Arc::new(Mutex::new(Vec::new()));
    let t_out = drain(child.stdout.take().unwrap(), out.clone());
    let t_err = drain(child.stderr.take().unwrap(), err.clone());
    match wait_with_deadline(&mut child, timeout) {
        Some(status) => {
            // The pipes close when the command exits (none of ours leave children
            // holding them), so the readers finish.
            let _ = t_out.join();
            let _ = t_err.join();
            CmdOutput {
                status,
                stdout: text(&out),
                stderr: text(&err),
                what,
            }
        }
        None => {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "`{what}` did not finish within {timeout:?}; killed\n--- stdout ---\n{}\n--- stderr ---\n{}",
                text(&out),
                text(&err)
            );
        }
    }
}

/// `ip netns exec NS ARGS...`, bounded.
pub fn netns_exec(ns: &str, args: &[&str], timeout: Duration) -> CmdOutput {
    run_bounded(
        Command::new("ip").args(["netns", "exec", ns]).args(args),
        timeout,
    )
}

/// Polls `probe` every `every` until it returns `Some`, for at most `timeout`.
pub fn wait_for<T>(
    timeout: Duration,
    every: Duration,
    mut probe: impl FnMut() -> Option<T>,
) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = probe() {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        thread::sleep(every);
    }
}

// ---------------------------------------------------------------------------------
// Network-namespace test bed

pub fn testbed_script() -> PathBuf {
    repo_root().join("scripts/testbed.sh")
}

/// A test bed from `scripts/testbed.sh` (see the script's header for the layout):
/// switch namespace, client, N real servers, and the appliance's namespace with its
/// unaddressed veth. Removed by `Drop` (even when the test panics) or by [`down`].
///
/// [`down`]: Testbed::down
pub struct Testbed {
    pub name: String,
    facts: BTreeMap<String, String>,
    is_up: bool,
}

impl Testbed {
    /// Builds a test bed with a fresh unique name and `real_servers` real servers.
    pub fn up(real_servers: u32) -> Testbed {
        require_root();
        // "t" + 7 characters: the script allows [a-z0-9]{1,8}.
        let name = format!("t{}", unique_tag());
        let out = run_bounded(
            Command::new(testbed_script()).args(["up", &name, &real_servers.to_string()]),
            Duration::from_secs(60),
        );
        if !out.success() {
            // The script removes a half-built bed itself; make sure anyway.
            let _ = run_testbed_down(&name);
            panic!("testbed up {name} failed: {}", out.describe());
        }
        let facts: BTreeMap<String, String> = out
            .stdout
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect();
        let bed = Testbed {
            name,
            facts,
            is_up: true,
        };
        assert_eq!(
            bed.fact("TESTBED"),
            bed.name,
            "testbed up printed: {}",
            out.stdout
        );
        bed
    }

    /// A `KEY=VALUE` fact printed by `testbed.sh up` (panics if absent).
    pub fn fact(&self, key: &str) -> &str {
        self.facts.get(key).unwrap_or_else(|| {
            panic!(
                "testbed {}: no fact {key} (have {:?})",
                self.name, self.facts
            )
        })
    }

    pub fn facts(&self) -> &BTreeMap<String, String> {
        &self.facts
    }

    pub fn lb_ns(&self) -> &str {
        self.fact("LB_NS")
    }
    pub fn lb_if(&self) -> &str {
        self.fact("LB_IF")
    }
    pub fn lb_mac(&self) -> &str {
        self.fact("LB_MAC")
    }
    pub fn appliance_ip(&self) -> &str {
        self.fact("APPLIANCE_IP")
    }
    pub fn client_ns(&self) -> &str {
        self.fact("CLIENT_NS")
    }
    pub fn client_if(&self) -> &str {
        self.fact("CLIENT_IF")
    }
    pub fn client_ip(&self) -> &str {
        self.fact("CLIENT_IP")
    }

    /// Runs a command inside one of this bed's namespaces, bounded.
    pub fn exec(&self, ns: &str, args: &[&str], timeout: Duration) -> CmdOutput {
        assert!(
            ns.starts_with(&format!("{}-", self.name)),
            "namespace {ns} is not part of test bed {}",
            self.name
        );
        netns_exec(ns, args, timeout)
    }

    /// Every namespace on the host whose name belongs to this bed.
    pub fn namespaces_left(&self) -> Vec<String> {
        namespaces_named(&self.name)
    }

    /// Removes the bed now (idempotent) and returns the script's output.
    pub fn down(&mut self) -> CmdOutput {
        self.is_up = false;
        run_testbed_down(&self.name)
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        if self.is_up {
            let out = run_testbed_down(&self.name);
            if !out.success() {
                eprintln!(
                    "warning: testbed down {} failed: {}",
                    self.name,
                    out.describe()
                );
            }
        }
    }
}

fn run_testbed_down(name: &str) -> CmdOutput {
    run_bounded(
        Command::new(testbed_script()).args(["down", name]),
        Duration::from_secs(60),
    )
}

/// Names in `ip netns list` that are `NAME` or start with `NAME-`.
pub fn namespaces_named(name: &str) -> Vec<String> {
    let out = run_bounded(
        Command::new("ip").args(["netns", "list"]),
        Duration::from_secs(10),
    )
    .expect_success("ip netns list");
    out.stdout
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|ns| *ns == name || ns.starts_with(&format!("{name}-")))
        .map(str::to_string)
        .collect()
}

// ---------------------------------------------------------------------------------
// The daemon

/// One `[[ports]]` entry.
#[derive(Clone, Debug)]
pub struct PortSpec {
    pub name: String,
    /// `Some(vdev)` for an EAL virtual device, `None` for `loopback = true`.
    pub vdev: Option<String>,
    pub mac: Option<String>,
    pub addresses: Vec<String>,
}

impl PortSpec {
    pub fn vdev(name: &str, vdev: &str, addresses: &[&str]) -> PortSpec {
        PortSpec {
            name: name.into(),
            vdev: Some(vdev.into()),
            mac: None,
            addresses: addresses.iter().map(|a| a.to_string()).collect(),
        }
    }

    pub fn loopback(name: &str, mac: &str, addresses: &[&str]) -> PortSpec {
        PortSpec {
            name: name.into(),
            vdev: None,
            mac: Some(mac.into()),
            addresses: addresses.iter().map(|a| a.to_string()).collect(),
        }
    }

    pub fn with_mac(mut self, mac: &str) -> PortSpec {
        self.mac = Some(mac.into());
        self
    }
}

/// A Sluice configuration plus how to run it. Create with [`DaemonConfig::new`], which
/// also makes the temp dir holding the config file and the control socket.
pub struct DaemonConfig {
    pub dir: tempfile::TempDir,
    pub tag: String,
    pub file_prefix: String,
    pub socket: PathBuf,
    pub workers: Vec<u32>,
    /// `[lcores] cpus`: the CPU of each worker lcore (several may share one).
    pub cpus: Option<Vec<u32>>,
    pub ports: Vec<PortSpec>,
    /// `[loopback]` section lines (e.g. `peers = 2`); written when non-empty.
    pub loopback: Vec<String>,
    /// Run inside this network namespace (`ip netns exec`).
    pub netns: Option<String>,
    /// Extra command-line arguments for `sluice`.
    pub args: Vec<String>,
    /// `[control] metrics` (the Prometheus endpoint's ADDRESS:PORT), when set.
    pub metrics: Option<String>,
    /// Raw TOML appended after everything else (e.g. `[timeouts]`, `[sessions]`,
    /// `[[services]]` sections), verbatim.
    pub extra_toml: Vec<String>,
    /// `Some(mb)`: run on hugepages with `memory_mb = mb` (default: ordinary memory).
    pub hugepages_mb: Option<u32>,
}

impl DaemonConfig {
    pub fn new(ports: Vec<PortSpec>) -> DaemonConfig {
        let tag = unique_tag();
        let dir = tempfile::Builder::new()
            .prefix(&format!("sluice-test-{tag}-"))
            .tempdir()
            .expect("creating a temp dir");
        let socket = dir.path().join("ctl.sock");
        assert!(
            socket.as_os_str().len() < 108,
            "socket path too long: {}",
            socket.display()
        );
        DaemonConfig {
            file_prefix: format!("sl-{tag}"),
            tag,
            dir,
            socket,
            workers: vec![1],
            cpus: None,
            metrics: None,
            ports,
            loopback: Vec::new(),
            netns: None,
            args: Vec::new(),
            extra_toml: Vec::new(),
            hugepages_mb: None,
        }
    }

    pub fn in_netns(mut self, ns: &str) -> DaemonConfig {
        self.netns = Some(ns.into());
        self
    }

    pub fn path(&self, file: &str) -> PathBuf {
        self.dir.path().join(file)
    }

    pub fn toml(&self) -> String {
        let mut t = String::new();
        let q = |s: &str| format!("{s:?}");
        let (hugepages, memory_mb) = match self.hugepages_mb {
            Some(mb) => (true, mb),
            None => (false, 256),
        };
        writeln!(
            t,
            "[eal]\nhugepages = {hugepages}\nmemory_mb = {memory_mb}\nfile_prefix = {}\n",
            q(&self.file_prefix)
        )
        .unwrap();
        let workers: Vec<String> = self.workers.iter().map(|w| w.to_string()).collect();
        writeln!(
            t,
            "[lcores]\nmanagement = 0\nworkers = [{}]",
            workers.join(", ")
        )
        .unwrap();
        if let Some(cpus) = &self.cpus {
            let cpus: Vec<String> = cpus.iter().map(|c| c.to_string()).collect();
            writeln!(t, "cpus = [{}]", cpus.join(", ")).unwrap();
        }
        t.push('\n');
        writeln!(
            t,
            "[control]\nsocket = {}",
            q(&self.socket.to_string_lossy())
        )
        .unwrap();
        if let Some(m) = &self.metrics {
            writeln!(t, "metrics = {}", q(m)).unwrap();
        }
        t.push('\n');
        for p in &self.ports {
            writeln!(t, "[[ports]]\nname = {}", q(&p.name)).unwrap();
            match &p.vdev {
                Some(v) => writeln!(t, "vdev = {}", q(v)).unwrap(),
                None => writeln!(t, "loopback = true").unwrap(),
            }
            if let Some(mac) = &p.mac {
                writeln!(t, "mac = {}", q(mac)).unwrap();
            }
            let addrs: Vec<String> = p.addresses.iter().map(|a| q(a)).collect();
            writeln!(t, "addresses = [{}]\n", addrs.join(", ")).unwrap();
        }
        if !self.loopback.is_empty() {
            writeln!(t, "[loopback]\n{}", self.loopback.join("\n")).unwrap();
        }
        for extra in &self.extra_toml {
            writeln!(t, "\n{extra}").unwrap();
        }
        t
    }

    /// Writes the config file and returns its path.
    pub fn write(&self) -> PathBuf {
        let path = self.path("sluice.toml");
        std::fs::write(&path, self.toml()).expect("writing the config");
        path
    }
}

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
        let config_path = config.write();
        let mut cmd = match &config.netns {
            Some(ns) => {
                // `ip netns exec` execs the program: the child pid is sluice's own.
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, SLUICE]);
                c
            }
            None => Command::new(SLUICE),
        };
        cmd.arg("--config").arg(&config_path).args(&config.args);
        let what = describe_command(&cmd);
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start `{what}`: {e}"));
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let readers = vec![
            drain(child.stdout.take().unwrap(), stdout.clone()),
            drain(child.stderr.take().unwrap(), stderr.clone()),
        ];
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

// ---------------------------------------------------------------------------------
// Status JSON helpers

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

// ---------------------------------------------------------------------------------
// Forwarding: services, real-server statistics, background servers in namespaces

/// `status["sessions"]`: live sessions over all workers; panics when absent.
pub fn session_count(status: &serde_json::Value) -> u64 {
    status["sessions"]
        .as_u64()
        .unwrap_or_else(|| panic!("status has no numeric `sessions`: {status}"))
}

impl Daemon {
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

/// A long-running helper (an HTTP server in a real-server namespace, ...). Started
/// with [`BackgroundProcess::spawn`]; `Drop` sends SIGTERM, then SIGKILL after 3 s, and
/// reaps it, so nothing outlives the test (test-bed `down` is the second line of
/// defence: it stops whatever still runs in the bed's namespaces).
pub struct BackgroundProcess {
    pub what: String,
    child: Child,
    stdout: Arc<Mutex<Vec<u8>>>,
    stderr: Arc<Mutex<Vec<u8>>>,
}

impl BackgroundProcess {
    /// `ip netns exec NS ARGS...` (the child pid is the program's own: `ip netns exec`
    /// execs it), or ARGS directly when `ns` is None.
    pub fn spawn(ns: Option<&str>, args: &[&str]) -> BackgroundProcess {
        let mut cmd = match ns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).args(args);
                c
            }
            None => {
                let mut c = Command::new(args[0]);
                c.args(&args[1..]);
                c
            }
        };
        let what = describe_command(&cmd);
        let mut child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start `{what}`: {e}"));
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        drain(child.stdout.take().unwrap(), stdout.clone());
        drain(child.stderr.take().unwrap(), stderr.clone());
        BackgroundProcess {
            what,
            child,
            stdout,
            stderr,
        }
    }

    pub fn stdout_text(&self) -> String {
        text(&self.stdout)
    }

    pub fn stderr_text(&self) -> String {
        text(&self.stderr)
    }

    /// Waits at most `timeout` for the process to exit on its own; its exit status.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        wait_with_deadline(&mut self.child, timeout)
    }

    /// Still running?
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Waits (bounded) until `probe` holds, failing early with the process's output if
    /// it exits. For "the server has bound its sockets" and the like.
    pub fn wait_until(&mut self, timeout: Duration, what: &str, mut probe: impl FnMut() -> bool) {
        let deadline = Instant::now() + timeout;
        loop {
            if probe() {
                return;
            }
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "`{}` exited with {status} before {what}\n--- stdout ---\n{}\n--- stderr ---\n{}",
                    self.what,
                    self.stdout_text(),
                    self.stderr_text()
                );
            }
            assert!(
                Instant::now() < deadline,
                "`{}`: not {what} within {timeout:?}\n--- stdout ---\n{}\n--- stderr ---\n{}",
                self.what,
                self.stdout_text(),
                self.stderr_text()
            );
            thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for BackgroundProcess {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            // SAFETY: kill(2) on our own child, not reaped yet (try_wait said running).
            unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
            if wait_with_deadline(&mut self.child, Duration::from_secs(3)).is_none() {
                let _ = self.child.kill();
                let _ = wait_with_deadline(&mut self.child, Duration::from_secs(3));
            }
        }
        if thread::panicking() {
            eprintln!(
                "=== `{}` ===\n--- stdout ---\n{}\n--- stderr ---\n{}",
                self.what,
                self.stdout_text(),
                self.stderr_text()
            );
        }
    }
}

impl Testbed {
    /// Number of real servers (`RS_COUNT`).
    pub fn rs_count(&self) -> u32 {
        self.fact("RS_COUNT").parse().expect("RS_COUNT is a number")
    }
    /// Namespace of real server `i` (1-based).
    pub fn rs_ns(&self, i: u32) -> &str {
        self.fact(&format!("RS{i}_NS"))
    }
    pub fn rs_ip(&self, i: u32) -> &str {
        self.fact(&format!("RS{i}_IP"))
    }
    pub fn rs_if(&self, i: u32) -> &str {
        self.fact(&format!("RS{i}_IF"))
    }
    pub fn rs_mac(&self, i: u32) -> &str {
        self.fact(&format!("RS{i}_MAC"))
    }

    /// Runs `scripts/testbed.sh CMD NAME ARGS...` (one of the set-up subcommands
    /// `dr-vip`, `rs-gateway`, `client-addr`), bounded; panics on failure. `KEY=VALUE`
    /// lines it prints update the bed's facts (`client-addr` prints `CLIENT_IP`).
    pub fn configure(&mut self, cmd: &str, args: &[&str]) -> CmdOutput {
        let out = run_bounded(
            Command::new(testbed_script())
                .arg(cmd)
                .arg(&self.name)
                .args(args),
            Duration::from_secs(60),
        )
        .expect_success(&format!("testbed.sh {cmd} {}", self.name));
        for (k, v) in out.stdout.lines().filter_map(|l| l.split_once('=')) {
            self.facts
                .insert(k.trim().to_string(), v.trim().to_string());
        }
        out
    }
}

// ---------------------------------------------------------------------------------
// Golden-packet runs: the counters a golden tool expects (golden_forwarding.py's
// expectation format, also written by golden_fullnat.py)

/// Counter mismatches, collected so that one run reports all of them.
#[derive(Default, Debug)]
pub struct Mismatches(pub Vec<String>);

impl Mismatches {
    pub fn eq(&mut self, what: String, got: u64, want: u64) {
        if got != want {
            self.0.push(format!("{what}: got {got}, expected {want}"));
        }
    }

    pub fn fail(&mut self, what: String) {
        self.0.push(what);
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn report(&self) -> String {
        self.0.join("\n  ")
    }
}

/// Compares `sluicectl status --json` (`status`) and `sluicectl -L -n --stats --json`
/// (`list`) with a golden tool's expectations (`expect`): every drop reason exactly
/// (those the tool does not name must be 0, and every one it names must be reported),
/// `events`, `neighbours` (= `events.neighbour_learned`), `sessions`,
/// `sessions_created` and `sessions_expired`, and per entry of `real_servers` ({rip,
/// vip, mode, services: [[proto, port]...], connections, active, inactive, in_min,
/// in_max, out_min, out_max}, summed over its services): exact connections, active and
/// inactive, packets within bounds, at least 40 bytes a packet, and the mode.
pub fn golden_counter_mismatches(
    status: &serde_json::Value,
    list: &serde_json::Value,
    expect: &serde_json::Value,
) -> Mismatches {
    let mut m = Mismatches::default();
    let want_drops: BTreeMap<String, u64> = expect["drops"]
        .as_object()
        .expect("expectations have `drops`")
        .iter()
        .map(|(k, v)| (k.clone(), v.as_u64().unwrap()))
        .collect();
    let got_drops = status["drops"]
        .as_object()
        .expect("status.drops is an object");
    for reason in want_drops.keys() {
        if !got_drops.contains_key(reason) {
            m.fail(format!("drops.{reason}: not reported by sluicectl status"));
        }
    }
    let mut reasons: Vec<&String> = want_drops.keys().chain(got_drops.keys()).collect();
    reasons.sort();
    reasons.dedup();
    for reason in reasons {
        let want = want_drops.get(reason).copied().unwrap_or(0);
        m.eq(format!("drops.{reason}"), drop_count(status, reason), want);
    }
    for (event, want) in expect["events"]
        .as_object()
        .expect("expectations have `events`")
    {
        m.eq(
            format!("events.{event}"),
            event_count(status, event),
            want.as_u64().unwrap(),
        );
    }
    m.eq(
        "neighbours".into(),
        status["neighbours"].as_u64().unwrap_or(u64::MAX),
        expect["events"]["neighbour_learned"].as_u64().unwrap(),
    );
    for field in ["sessions", "sessions_created", "sessions_expired"] {
        m.eq(
            field.into(),
            status[field].as_u64().unwrap_or(u64::MAX),
            expect[field].as_u64().unwrap(),
        );
    }
    for want in expect["real_servers"].as_array().expect("`real_servers`") {
        let rip = want["rip"].as_str().unwrap();
        let vip = want["vip"].as_str().unwrap();
        let mode = want["mode"].as_str().unwrap();
        let services: Vec<(String, u16)> = want["services"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| (s[0].as_str().unwrap().into(), s[1].as_u64().unwrap() as u16))
            .collect();
        let mut sum = |field: &str| -> u64 {
            services
                .iter()
                .map(|(proto, port)| {
                    let rs = real_server(list, proto, vip, *port, rip);
                    if rs["mode"] != mode {
                        m.fail(format!(
                            "{proto} {vip}:{port} -> {rip}: mode {}",
                            rs["mode"]
                        ));
                    }
                    rs_counter(rs, field)
                })
                .sum()
        };
        let (conns, active, inactive) = (sum("connections"), sum("active"), sum("inactive"));
        let (inp, outp) = (sum("in_packets"), sum("out_packets"));
        let (in_bytes, out_bytes) = (sum("in_bytes"), sum("out_bytes"));
        let n = |k: &str| want[k].as_u64().unwrap();
        let what = format!("real server {rip} of {vip} {services:?} ({mode})");
        m.eq(format!("{what} connections"), conns, n("connections"));
        m.eq(format!("{what} active"), active, n("active"));
        m.eq(format!("{what} inactive"), inactive, n("inactive"));
        for (field, got, lo, hi) in [
            ("in_packets", inp, n("in_min"), n("in_max")),
            ("out_packets", outp, n("out_min"), n("out_max")),
        ] {
            if !(lo..=hi).contains(&got) {
                m.fail(format!("{what} {field}: {got}, expected {lo}..={hi}"));
            }
        }
        for (field, bytes, packets) in [("in_bytes", in_bytes, inp), ("out_bytes", out_bytes, outp)]
        {
            if bytes < 40 * packets || (packets == 0) != (bytes == 0) {
                m.fail(format!("{what} {field}: {bytes} for {packets} packets"));
            }
        }
    }
    m
}

impl Daemon {
    /// SIGTERM; asserts exit 0 and that no DPDK runtime directory is left.
    pub fn stop_clean(mut self) {
        let exit = self.terminate();
        assert!(exit.success(), "sluice exited with {exit}\n{}", self.dump());
        assert!(
            dpdk_runtime_dirs(&self.config.file_prefix).is_empty(),
            "DPDK runtime dir left behind"
        );
    }
}

// ---------------------------------------------------------------------------------
// End to end with applications: a test bed whose real servers run
// tests/tools/e2e_apps.py (HTTP answering their own name, UDP echo, logs of the
// client address each saw) and a client that runs curl and UDP exchanges.

/// `[[services]]` TOML: one service, `extra` lines after its header (e.g.
/// `local_addresses = [...]`), then `real_servers` as (ip, port, weight, mode).
pub fn service_section(
    proto: &str,
    vip: &str,
    port: u16,
    scheduler: &str,
    extra: &[String],
    real_servers: &[(&str, u16, u32, &str)],
) -> String {
    let mut t = format!(
        "[[services]]\nproto = \"{proto}\"\nvip = \"{vip}\"\nport = {port}\nscheduler = \"{scheduler}\"\n"
    );
    for line in extra {
        t.push_str(line);
        t.push('\n');
    }
    for (ip, rport, weight, mode) in real_servers {
        t.push_str(&format!(
            "\n  [[services.real_servers]]\n  ip = \"{ip}\"\n  port = {rport}\n  weight = {weight}\n  mode = \"{mode}\"\n"
        ));
    }
    t
}

/// The lines of a file (none when it does not exist).
pub fn read_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

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

    /// Sluice on the appliance's veth (net_af_packet) with these addresses and config.
    pub fn daemon(&self, addresses: &[&str], extra_toml: String) -> Daemon {
        let mut cfg = DaemonConfig::new(vec![PortSpec::vdev(
            "lan0",
            &format!("net_af_packet0,iface={}", self.bed.lb_if()),
            addresses,
        )])
        .in_netns(self.bed.lb_ns());
        cfg.extra_toml.push(extra_toml);
        Daemon::start(cfg)
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

/// The number after the first `key` (e.g. "bad ") in `text`.
pub fn number_after(text: &str, key: &str) -> u64 {
    let at = text
        .find(key)
        .unwrap_or_else(|| panic!("no `{key}` in:\n{text}"));
    let digits: String = text[at + key.len()..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits
        .parse()
        .unwrap_or_else(|_| panic!("no number after `{key}` in:\n{text}"))
}

// ---------------------------------------------------------------------------------
// Health checking: one real server's process or address taken away and
// given back, and the daemon's health and events reports.

impl BackgroundProcess {
    /// SIGKILL now and reap (bounded): the process's sockets close at once, so its
    /// kernel refuses new connections (RST) from then on.
    pub fn kill_now(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            assert!(
                wait_with_deadline(&mut self.child, Duration::from_secs(5)).is_some(),
                "`{}` still running 5 s after SIGKILL",
                self.what
            );
        }
    }
}

impl AppLab {
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
}

impl Daemon {
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

// ---------------------------------------------------------------------------------
// VRRP (e2e_vrrp): the daemon's VRRP report, a hard kill, addresses on a namespace's
// interface and who answers ARP for an address.

impl Daemon {
    /// `sluicectl vrrp --json`, parsed (see `daemon::vrrp::VrrpReport`).
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

impl Testbed {
    /// Whether interface `ifname` in namespace `ns` holds IPv4 address `addr` (any
    /// prefix length).
    pub fn has_addr(&self, ns: &str, ifname: &str, addr: &str) -> bool {
        let out = self
            .exec(
                ns,
                &["ip", "-o", "-4", "addr", "show", "dev", ifname],
                Duration::from_secs(10),
            )
            .expect_success("ip addr show");
        out.stdout
            .split_whitespace()
            .any(|w| w.split('/').next() == Some(addr))
    }

    /// The MAC addresses (lowercase) that answer one broadcast ARP request for
    /// `target` sent by `sender` from `ifname` in namespace `ns`, collected for 1 s
    /// (scapy), sorted.
    pub fn arp_repliers(&self, ns: &str, ifname: &str, sender: &str, target: &str) -> Vec<String> {
        const SCRIPT: &str = r#"
import sys
from scapy.all import Ether, ARP, srp, conf, get_if_hwaddr
conf.verb = 0
iface, sender, target = sys.argv[1:4]
mac = get_if_hwaddr(iface)
ans, _ = srp(Ether(src=mac, dst="ff:ff:ff:ff:ff:ff")/ARP(op=1, hwsrc=mac, psrc=sender, pdst=target),
             iface=iface, timeout=1, multi=True)
for _, r in ans:
    print(r[ARP].hwsrc.lower())
"#;
        let out = self
            .exec(
                ns,
                &[PYTHON, "-c", SCRIPT, ifname, sender, target],
                Duration::from_secs(20),
            )
            .expect_success("scapy ARP request");
        let mut macs: Vec<String> = out.stdout.lines().map(|l| l.trim().to_string()).collect();
        macs.sort();
        macs.dedup();
        macs
    }

    /// The link-layer address the kernel of namespace `ns` holds for `ip` on
    /// `ifname` (`ip neigh`), if any.
    pub fn neighbour_mac(&self, ns: &str, ifname: &str, ip: &str) -> Option<String> {
        let out = self
            .exec(
                ns,
                &["ip", "neigh", "show", ip, "dev", ifname],
                Duration::from_secs(10),
            )
            .expect_success("ip neigh show");
        let words: Vec<&str> = out.stdout.split_whitespace().collect();
        words
            .iter()
            .position(|w| *w == "lladdr")
            .and_then(|i| words.get(i + 1))
            .map(|m| m.to_lowercase())
    }
}

impl BackgroundProcess {
    /// Waits (bounded) until the process's stdout or stderr contains `needle`.
    pub fn wait_for_output(&mut self, timeout: Duration, needle: &str) {
        let (out, err) = (self.stdout.clone(), self.stderr.clone());
        self.wait_until(timeout, &format!("printed {needle:?}"), || {
            text(&out).contains(needle) || text(&err).contains(needle)
        });
    }
}
