//! The thread that talks to BIRD, so the management loop never waits for it: it
//! writes the include file (a temp file renamed over it), runs `birdc -s SOCKET
//! configure` within a time limit, retries a failed one, and reads `birdc show
//! protocols` every poll interval.
use crate::dpdk::spawn_helper;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam::channel::{self, Receiver, RecvTimeoutError, Sender};

use super::bird::{parse_protocols, BirdProtocol};

/// How to reach BIRD.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BirdLink {
    pub birdc: PathBuf,
    pub socket: PathBuf,
    pub include: PathBuf,
    /// The longest a `birdc` call may take; past it the child is killed.
    pub timeout: Duration,
    /// The wait before a failed `configure` is tried again.
    pub retry: Duration,
    /// How often `show protocols` is read.
    pub poll: Duration,
}

/// What the thread last did, for `sluicectl cluster` and the shutdown wait.
#[derive(Clone, Debug, Default)]
pub struct SpeakerStatus {
    /// The generation of the last include file BIRD accepted.
    pub applied: u64,
    /// The generation last handed to the thread.
    pub wanted: u64,
    /// Successful and failed `configure` calls.
    pub applies: u64,
    pub failures: u64,
    /// The last failure (`configure`), cleared by a success.
    pub error: Option<String>,
    /// When the generation `wanted` was first tried and failed (the shutdown wait
    /// gives up on a withdrawal BIRD refuses).
    pub failed_at: Option<Instant>,
    /// The last `show protocols`, when it was read, and its error if the last read
    /// failed.
    pub protocols: Vec<BirdProtocol>,
    pub protocols_at: Option<Instant>,
    pub protocols_error: Option<String>,
}

enum Order {
    Apply { generation: u64, text: String },
    Stop,
}

/// The handle the management loop keeps; dropping it stops and joins the thread.
pub struct Speaker {
    orders: Sender<Order>,
    status: Arc<Mutex<SpeakerStatus>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Speaker {
    pub fn start(link: BirdLink) -> std::io::Result<Speaker> {
        let (orders, rx) = channel::unbounded();
        let status = Arc::new(Mutex::new(SpeakerStatus::default()));
        let shared = status.clone();
        let thread = spawn_helper(
            std::thread::Builder::new().name("bgp-birdc".into()),
            move || run(&link, &rx, &shared),
        )?;
        Ok(Speaker {
            orders,
            status,
            thread: Some(thread),
        })
    }

    /// Hands the thread a new include file; it replaces any not yet applied.
    pub fn apply(&self, generation: u64, text: String) {
        if let Ok(mut s) = self.status.lock() {
            s.wanted = generation;
        }
        let _ = self.orders.send(Order::Apply { generation, text });
    }

    pub fn status(&self) -> SpeakerStatus {
        self.status.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

impl Drop for Speaker {
    fn drop(&mut self) {
        let _ = self.orders.send(Order::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(link: &BirdLink, orders: &Receiver<Order>, status: &Mutex<SpeakerStatus>) {
    let mut pending: Option<(u64, String)> = None;
    // What BIRD last accepted, to write again if the file goes (a cleaned /run, an
    // operator) or changes under us.
    let mut applied: Option<(u64, String)> = None;
    let mut retry_at = Instant::now();
    let mut poll_at = Instant::now();
    loop {
        let now = Instant::now();
        let next = match &pending {
            Some(_) => retry_at.min(poll_at),
            None => poll_at,
        };
        match orders.recv_timeout(next.saturating_duration_since(now)) {
            Ok(Order::Apply { generation, text }) => {
                // A newer file replaces one still waiting for its retry: try it now.
                pending = Some((generation, text));
                retry_at = Instant::now();
                // Take every order already queued before calling birdc.
                continue;
            }
            Ok(Order::Stop) | Err(RecvTimeoutError::Disconnected) => return,
            Err(RecvTimeoutError::Timeout) => {}
        }
        let now = Instant::now();
        if let Some((generation, text)) = &pending {
            if now >= retry_at {
                let outcome = write_atomically(&link.include, text)
                    .map_err(|e| format!("writing {}: {e}", link.include.display()))
                    .and_then(|()| birdc(link, &["configure"]));
                let mut s = status.lock().unwrap_or_else(|e| e.into_inner());
                match outcome {
                    Ok(_) => {
                        log::info!(
                            "bgp: BIRD reconfigured with {} (generation {generation})",
                            link.include.display()
                        );
                        s.applied = *generation;
                        s.applies += 1;
                        s.error = None;
                        s.failed_at = None;
                        applied = pending.take();
                    }
                    Err(e) => {
                        log::warn!(
                            "bgp: birdc configure failed, retrying in {} ms: {e}",
                            link.retry.as_millis()
                        );
                        s.failures += 1;
                        s.error = Some(e);
                        s.failed_at.get_or_insert(now);
                        retry_at = now + link.retry;
                    }
                }
            }
        }
        if Instant::now() >= poll_at {
            if let (None, Some((generation, text))) = (&pending, &applied) {
                if std::fs::read_to_string(&link.include).ok().as_deref() != Some(text.as_str()) {
                    log::warn!(
                        "bgp: {} is gone or was changed by someone else; writing it again",
                        link.include.display()
                    );
                    pending = Some((*generation, text.clone()));
                    retry_at = Instant::now();
                }
            }
            let read = birdc(link, &["show", "protocols"]).and_then(|out| parse_protocols(&out));
            let mut s = status.lock().unwrap_or_else(|e| e.into_inner());
            match read {
                Ok(rows) => {
                    s.protocols = rows;
                    s.protocols_at = Some(Instant::now());
                    s.protocols_error = None;
                }
                Err(e) => s.protocols_error = Some(e),
            }
            poll_at = Instant::now() + link.poll;
        }
    }
}

/// Writes `text` to `path` through a temp file in the same directory renamed over it,
/// so BIRD never reads half a file.
pub fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(text.as_bytes())?;
    f.sync_all()?;
    drop(f);
    std::fs::rename(&tmp, path)
}

/// Runs `birdc -s SOCKET ARGS...`, killed past `link.timeout`; its output on success
/// (exit 0), else an error with its last line.
///
/// The whole call is bounded by the timeout, not only the child: `birdc` is often a
/// wrapper (`ip netns exec`, `sudo`, a script without `exec`) whose own children
/// hold the output pipes, so killing the child alone leaves them open and a read to
/// their end waits for the grandchild. The child leads a process group of its own,
/// and a timeout kills the group.
pub fn birdc(link: &BirdLink, args: &[&str]) -> Result<String, String> {
    use std::os::unix::process::CommandExt;
    let what = format!("birdc {}", args.join(" "));
    let deadline = Instant::now() + link.timeout;
    let mut child = Command::new(&link.birdc)
        .arg("-s")
        .arg(&link.socket)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| format!("running {}: {e}", link.birdc.display()))?;
    // Both pipes are read at once, so a child filling one is never stuck while the
    // other is read; the readers end at EOF, once every process holding the pipe
    // has exited or closed it.
    let (tx, rx) = channel::bounded(2);
    if let Some(out) = child.stdout.take() {
        drain(out, 0, tx.clone());
    }
    if let Some(err) = child.stderr.take() {
        drain(err, 1, tx.clone());
    }
    drop(tx);
    let mut output = [Vec::new(), Vec::new()];
    let mut open = 2;
    // Nothing but this function reaps the child, so until it has, the child's pid,
    // which is its process group's id, cannot be reused.
    let status = loop {
        if open > 0 {
            match rx.recv_deadline(deadline) {
                Ok((stream, bytes)) => {
                    output[stream] = bytes;
                    open -= 1;
                }
                Err(RecvTimeoutError::Disconnected) => open = 0,
                Err(RecvTimeoutError::Timeout) => break None,
            }
            continue;
        }
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) => {
                let now = Instant::now();
                if now >= deadline {
                    break None;
                }
                std::thread::sleep((deadline - now).min(Duration::from_millis(2)));
            }
            Err(e) => return Err(format!("{what}: {e}")),
        }
    };
    let Some(status) = status else {
        // SAFETY: kill(2) on the process group the child leads (its id is the
        // child's pid, `process_group(0)`); the child is not reaped yet (see the
        // loop), so that id still names its group and no one else's.
        unsafe {
            libc::kill(-(child.id() as libc::pid_t), libc::SIGKILL);
        }
        let _ = child.wait();
        // The readers are left to end at EOF: a process that left the group (its
        // own session) could hold the pipes open for as long as it lives.
        return Err(format!(
            "{what}: no answer within {} ms (killed)",
            link.timeout.as_millis()
        ));
    };
    let [stdout, stderr] = output;
    let stdout = String::from_utf8_lossy(&stdout).into_owned();
    if status.success() {
        return Ok(stdout);
    }
    let stderr = String::from_utf8_lossy(&stderr);
    let last = stderr
        .lines()
        .chain(stdout.lines())
        .rfind(|l| !l.trim().is_empty() && !l.ends_with("ready."))
        .unwrap_or("no output")
        .trim()
        .to_string();
    Err(format!("{what}: {status} ({last})"))
}

/// Reads `pipe` to its end on a thread of its own and sends what it read, tagged
/// `stream`.
fn drain(
    mut pipe: impl std::io::Read + Send + 'static,
    stream: usize,
    tx: Sender<(usize, Vec<u8>)>,
) {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        let _ = tx.send((stream, bytes));
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(birdc: &Path, dir: &Path) -> BirdLink {
        BirdLink {
            birdc: birdc.to_path_buf(),
            socket: dir.join("bird.ctl"),
            include: dir.join("vips.conf"),
            timeout: Duration::from_millis(300),
            retry: Duration::from_millis(50),
            poll: Duration::from_secs(60),
        }
    }

    fn script(dir: &Path, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join("birdc");
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    #[test]
    fn a_file_removed_under_it_is_written_again() {
        let dir = tempfile::tempdir().unwrap();
        let mut l = link(&script(dir.path(), "exit 0"), dir.path());
        l.poll = Duration::from_millis(20);
        let speaker = Speaker::start(l.clone()).unwrap();
        speaker.apply(1, "protocol static sluice4 { ipv4; }\n".into());
        let wait = |what: &str, done: &dyn Fn() -> bool| {
            let deadline = Instant::now() + Duration::from_secs(5);
            while !done() {
                assert!(Instant::now() < deadline, "{what}");
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        wait("applied", &|| speaker.status().applies == 1);
        std::fs::remove_file(&l.include).unwrap();
        wait("written again", &|| speaker.status().applies == 2);
        assert_eq!(
            std::fs::read_to_string(&l.include).unwrap(),
            "protocol static sluice4 { ipv4; }\n"
        );
    }

    #[test]
    fn a_hanging_birdc_is_killed_at_the_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let l = link(&script(dir.path(), "exec sleep 30"), dir.path());
        let t = Instant::now();
        let e = birdc(&l, &["configure"]).unwrap_err();
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        assert!(e.contains("no answer within 300 ms"), "{e}");
    }

    /// A wrapper that runs birdc as a child of its own (no `exec`), here a process
    /// that hangs holding the output pipes: the call still ends at the timeout, and
    /// the grandchild is killed with the wrapper.
    #[test]
    fn a_hanging_grandchild_of_birdc_is_killed_at_the_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let pidfile = dir.path().join("grandchild.pid");
        let body = format!("sh -c 'echo $$ > {}; exec sleep 30'", pidfile.display());
        let mut l = link(&script(dir.path(), &body), dir.path());
        // Time for the wrapper to start the grandchild on a loaded machine.
        l.timeout = Duration::from_secs(1);
        let bound = l.timeout + Duration::from_secs(5);
        let (tx, rx) = std::sync::mpsc::channel();
        let call = l.clone();
        std::thread::spawn(move || {
            let _ = tx.send(birdc(&call, &["configure"]));
        });
        let e = rx
            .recv_timeout(bound)
            .unwrap_or_else(|_| panic!("birdc still running after {bound:?}"))
            .unwrap_err();
        assert!(e.contains("no answer within 1000 ms"), "{e}");
        let pid = std::fs::read_to_string(&pidfile).expect("the grandchild started");
        let stat = format!("/proc/{}/stat", pid.trim());
        // Gone, or a zombie until whoever inherited it reaps it.
        let dead = || match std::fs::read_to_string(&stat) {
            Ok(s) => s
                .rsplit_once(") ")
                .is_some_and(|(_, rest)| rest.starts_with(['Z', 'X'])),
            Err(_) => true,
        };
        let deadline = Instant::now() + Duration::from_secs(2);
        while !dead() {
            assert!(Instant::now() < deadline, "grandchild {} alive", pid.trim());
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn a_failing_birdc_names_its_error_and_is_retried() {
        let dir = tempfile::tempdir().unwrap();
        // Fails once (BIRD's syntax error line), then succeeds.
        let flag = dir.path().join("failed-once");
        let body = format!(
            "echo \"$@\" >> {d}/calls\n\
             if [ \"$3\" = configure ] && [ ! -e {f} ]; then touch {f}; \
             echo 'BIRD 2.0.12 ready.'; echo '/x/vips.conf:3:9 syntax error'; exit 1; fi\n\
             echo 'BIRD 2.0.12 ready.'; echo 'Name Proto Table State Since Info'",
            d = dir.path().display(),
            f = flag.display()
        );
        let l = link(&script(dir.path(), &body), dir.path());
        let speaker = Speaker::start(l.clone()).unwrap();
        speaker.apply(1, "protocol static sluice4 { ipv4; }\n".into());
        let deadline = Instant::now() + Duration::from_secs(5);
        while speaker.status().applied != 1 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let s = speaker.status();
        assert_eq!((s.applied, s.applies, s.failures), (1, 1, 1), "{s:?}");
        assert!(s.error.is_none());
        assert_eq!(
            std::fs::read_to_string(&l.include).unwrap(),
            "protocol static sluice4 { ipv4; }\n"
        );
        let calls = std::fs::read_to_string(dir.path().join("calls")).unwrap();
        let socket = l.socket.display().to_string();
        assert!(calls.contains(&format!("-s {socket} configure")), "{calls}");
        assert!(
            calls.contains(&format!("-s {socket} show protocols")),
            "{calls}"
        );
        let e = birdc(
            &link(
                &script(dir.path(), "echo 'syntax error' >&2; exit 1"),
                dir.path(),
            ),
            &["configure"],
        )
        .unwrap_err();
        assert!(e.contains("syntax error"), "{e}");
    }
}
