//! Running external commands with a bound, so no test can hang: [`run_bounded`] for
//! commands that finish, [`BackgroundProcess`] for helpers that run while a test
//! does, and the small things every test needs (root, unique names, paths).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// Debian's interpreter: the one that sees python3-scapy (the `python3` first on PATH
/// may be another build).
pub const PYTHON: &str = "/usr/bin/python3";

/// The repository's root (the crate's manifest directory).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A helper script under `tests/tools/`.
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

pub(super) fn describe_command(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Collects a pipe into a shared buffer on a thread of its own.
pub(super) fn drain<R: Read + Send + 'static>(
    mut pipe: R,
    buf: Arc<Mutex<Vec<u8>>>,
) -> JoinHandle<()> {
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

pub(super) fn text(buf: &Arc<Mutex<Vec<u8>>>) -> String {
    String::from_utf8_lossy(&buf.lock().unwrap()).into_owned()
}

/// Waits for `child` to exit, polling, for at most `timeout`.
pub fn wait_with_deadline(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
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

/// A long-running helper (an HTTP server in a real-server namespace, ...). Started
/// with [`BackgroundProcess::spawn`]; `Drop` sends SIGTERM, then SIGKILL after 3 s, and
/// reaps it, so nothing outlives the test (test-bed `down` is the second line of
/// defence: it stops whatever still runs in the bed's namespaces).
pub struct BackgroundProcess {
    pub what: String,
    child: Child,
    stdout: Arc<Mutex<Vec<u8>>>,
    stderr: Arc<Mutex<Vec<u8>>>,
    /// The threads reading stdout and stderr into the buffers above.
    drains: [JoinHandle<()>; 2],
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
        let drains = [
            drain(child.stdout.take().unwrap(), stdout.clone()),
            drain(child.stderr.take().unwrap(), stderr.clone()),
        ];
        BackgroundProcess {
            what,
            child,
            stdout,
            stderr,
            drains,
        }
    }

    pub fn stdout_text(&self) -> String {
        text(&self.stdout)
    }

    pub fn stderr_text(&self) -> String {
        text(&self.stderr)
    }

    /// Waits (bounded, as [`BackgroundProcess::wait_until`]) until the process has
    /// written `line` to its stderr: a tool saying it is ready.
    pub fn wait_for_stderr(&mut self, timeout: Duration, line: &str) {
        let stderr = self.stderr.clone();
        self.wait_until(timeout, &format!("`{line}` on stderr"), || {
            text(&stderr).lines().any(|l| l == line)
        });
    }

    /// Waits at most `timeout` for the process to exit on its own; its exit status.
    /// Its output is all in [`BackgroundProcess::stdout_text`] then: the threads reading
    /// its pipes are given up to 2 s more to reach their end (a process that exited
    /// may have written its last line a moment before, still in the pipe).
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let status = wait_with_deadline(&mut self.child, timeout)?;
        let until = Instant::now() + Duration::from_secs(2);
        while self.drains.iter().any(|d| !d.is_finished()) && Instant::now() < until {
            thread::sleep(Duration::from_millis(10));
        }
        Some(status)
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

    /// Waits (bounded) until the process's stdout or stderr contains `needle`.
    pub fn wait_for_output(&mut self, timeout: Duration, needle: &str) {
        let (out, err) = (self.stdout.clone(), self.stderr.clone());
        self.wait_until(timeout, &format!("printed {needle:?}"), || {
            text(&out).contains(needle) || text(&err).contains(needle)
        });
    }

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

/// The lines of a file (none when it does not exist).
pub fn read_lines(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
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

/// Wall-clock seconds since the Unix epoch, to compare with the timestamps the
/// Python clients record (`time.time()`).
pub fn wall_now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs_f64()
}

/// A network namespace of the test's own with only `lo` (up), deleted on drop: a
/// private loopback where fixed ports cannot collide with anything else on the host.
pub struct Netns(pub String);

impl Netns {
    /// `PREFIX-TAG`, with a [`unique_tag`].
    pub fn new(prefix: &str) -> Netns {
        let name = format!("{prefix}-{}", unique_tag());
        let t = Duration::from_secs(10);
        run_bounded(Command::new("ip").args(["netns", "add", &name]), t)
            .expect_success("ip netns add");
        let ns = Netns(name);
        run_bounded(
            Command::new("ip").args(["-n", &ns.0, "link", "set", "lo", "up"]),
            t,
        )
        .expect_success("ip link set lo up");
        ns
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = run_bounded(
            Command::new("ip").args(["netns", "del", &self.0]),
            Duration::from_secs(10),
        );
    }
}
