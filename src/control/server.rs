//! The daemon side of the control socket.
//!
//! One serving thread does all socket I/O with poll(2) over non-blocking sockets: it
//! accepts, reads request lines, writes responses and enforces deadlines for every
//! connection, and never sleeps or blocks on any one of them. Complete requests go to
//! a few executor threads ([`EXECUTORS`]), which run the [`Handler`] (in the daemon it
//! waits for the management loop) and hand the response back. So:
//!
//! - the accept path never waits: a connection over [`ServerLimits::max_connections`]
//!   gets one error line, written without blocking, and is closed at once;
//! - an idle or slow client (one that trickles bytes and never ends its line) costs one
//!   descriptor and its buffered bytes until [`ServerLimits::request_timeout`], counted
//!   from connect or from its previous response, and delays nobody meanwhile; one that
//!   stops reading its response is dropped once that long passes without a byte taken;
//! - a slow handler delays the requests queued behind it on the executors, not the
//!   reading, writing and refusing of other connections;
//! - requests wait for an executor one user after another ([`FairQueue`]), so one
//!   user's many connections cannot hold another user's request behind all of theirs.
//!
//! Costs: one descriptor per open connection (the soft open-file limit is raised to fit
//! [`ServerLimits::max_connections`]), at most [`MAX_REQUEST_BYTES`] + 16 KiB of buffer
//! per connection while a line is incomplete, and an O(connections) poll(2) set rebuilt
//! per wake-up (about 10 us for 1,000 connections).
//!
//! A connection may stage a large batch over several request lines (`batch_begin`,
//! `batch_part`..., `batch_commit`): the parts are held here, per connection, and the
//! handler receives one [`Request::Batch`] at the commit, so a transaction is never
//! bounded by the request line limit. At most [`MAX_STAGED_COMMANDS`] commands, in
//! request lines of at most [`ServerLimits::user_staged_bytes`] in all, are staged over
//! one user's connections.
//!
//! Users other than root (`[control] group` members: an operator, a monitoring agent)
//! are bounded each on their own, so that one of them cannot take what root needs:
//! [`ServerLimits::user_connections`] connections, and
//! [`ServerLimits::user_unsent_bytes`] of answers not yet read over their connections
//! (an answer that would go over is replaced by an error saying so). Without that, a
//! member could open every connection, or ask for the 53 MB exposition on 2,048
//! connections and read each slowly, until the daemon ran out of memory.
use crate::control::protocol::{
    parse_request, ProtocolError, Request, Requester, Response, MAX_REQUEST_BYTES,
};
use crate::dpdk::spawn_helper;
use serde_json::Value;
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// Executes one request on behalf of a client. Runs on an executor thread, so it must
/// be thread-safe; an `Err` becomes `{"ok":false,"error":...}`, a panic becomes
/// `"internal error"`.
pub type Handler = Arc<dyn Fn(Request) -> Result<Reply, String> + Send + Sync>;

/// A handler's result: a JSON value, or a report already written out as its whole
/// success line ([`Response::success_line_of`]). The line is for large answers (a
/// listing of 50,000 real servers): building a [`Value`] of one first costs a tree of
/// millions of small allocations, which each executor's allocator arena keeps after
/// they are freed (the daemon's memory rose to about 0.9 GB after a dozen such
/// listings; perf/results/config_scale.md).
#[derive(Debug)]
pub enum Reply {
    Value(Value),
    Line(String),
}

/// A [`Handler`] from a function that answers with values.
pub fn value_handler(
    answer: impl Fn(Request) -> Result<Value, String> + Send + Sync + 'static,
) -> Handler {
    Arc::new(move |request| answer(request).map(Reply::Value))
}

/// Threads that run handler calls. The daemon's handler serialises on the management
/// loop anyway; more than one keeps a slow call from holding up the queue's hand-off.
pub const EXECUTORS: usize = 4;

/// Commands held in open `batch_begin` ... `batch_commit` transactions, over one
/// user's connections (about 100 bytes each): room for a restore of a million real
/// servers.
pub const MAX_STAGED_COMMANDS: usize = 2_000_000;

/// The default of [`ServerLimits::user_staged_bytes`]. A restore of a million real
/// servers is about 150 MB of lines.
pub const MAX_STAGED_BYTES: usize = 256 << 20;

/// How long the listener is left alone after accept(2) ran out of descriptors.
const ACCEPT_PAUSE: Duration = Duration::from_millis(100);

/// On shutdown, how long a response already being written may still take.
const SHUTDOWN_WRITE_GRACE: Duration = Duration::from_millis(200);

/// Mode of the socket file: only the daemon's user (root) may connect.
pub const SOCKET_MODE: u32 = 0o600;

/// Mode of the socket file with `[control] group`: that group's members may connect.
pub const GROUP_SOCKET_MODE: u32 = 0o660;

/// Mode of a parent directory the server has to create.
pub const SOCKET_DIR_MODE: u32 = 0o755;

/// The longest path a Unix socket address holds (`sun_path` is 108 bytes with the NUL).
const MAX_SOCKET_PATH_BYTES: usize = 107;

/// Resource limits that keep misbehaving clients from starving the others.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerLimits {
    /// Connections open at once; more are answered with an error and closed at once.
    pub max_connections: usize,
    /// Time a client has to deliver each complete request line (from connect or from
    /// the previous response), and to take the next bytes of a response (a large
    /// response may take longer as a whole, while it moves). A connection that misses
    /// it is closed.
    pub request_timeout: Duration,
    /// Connections one user other than [`ServerLimits::unlimited_uid`] may hold at
    /// once; more are refused as over `max_connections` are.
    pub user_connections: usize,
    /// Bytes of answers written but not yet read that one such user's connections may
    /// hold. An answer that would take them over is replaced by an error line.
    pub user_unsent_bytes: usize,
    /// Bytes of `batch_part` request lines held in open transactions over one user's
    /// connections, root's too. The commands alone do not bound the memory: one line
    /// of 64 KiB can be one command holding thousands of ACL prefixes.
    pub user_staged_bytes: usize,
    /// The user the two limits above do not bound: root, who runs the daemon and can
    /// stop it anyway. `None` bounds everyone.
    pub unlimited_uid: Option<u32>,
}

impl Default for ServerLimits {
    fn default() -> ServerLimits {
        ServerLimits {
            max_connections: 2048,
            request_timeout: Duration::from_secs(2),
            user_connections: 64,
            // Four full expositions at 50,000 real servers (53 MB each).
            user_unsent_bytes: 256 << 20,
            user_staged_bytes: MAX_STAGED_BYTES,
            unlimited_uid: Some(0),
        }
    }
}

/// The user a connection's limits are counted under: its peer's uid, or, when the
/// kernel did not say, a uid no user has.
fn user_of(requester: Option<Requester>) -> u32 {
    requester.map_or(u32::MAX, |r| r.uid)
}

/// A running control socket. Dropping it stops accepting, waits for in-flight requests
/// to finish, and removes the socket file; no handler runs after `drop` returns.
pub struct ControlServer {
    path: PathBuf,
    /// Device and inode of the socket file we bound, so `Drop` never deletes a socket
    /// that someone else has since put at the same path.
    socket_identity: (u64, u64),
    stop: Arc<AtomicBool>,
    /// Wakes the serving thread out of poll(2).
    wake: Arc<UnixStream>,
    acceptor: Option<JoinHandle<()>>,
}

impl ControlServer {
    /// Creates the parent directory (0755) if missing, removes a stale socket file
    /// (only if it is a socket and nobody answers on it; if a live daemon answers, fails
    /// with "another sluice is serving PATH"), binds, restricts the socket to 0600, and
    /// spawns the serving thread, with [`ServerLimits::default`].
    pub fn spawn(path: &Path, handler: Handler) -> io::Result<ControlServer> {
        ControlServer::spawn_with_limits(path, handler, ServerLimits::default())
    }

    /// [`ControlServer::spawn`] with explicit limits.
    pub fn spawn_with_limits(
        path: &Path,
        handler: Handler,
        limits: ServerLimits,
    ) -> io::Result<ControlServer> {
        ControlServer::spawn_with_group(path, handler, limits, None)
    }

    /// [`ControlServer::spawn_with_limits`], and with `group` (a gid) the socket
    /// belongs to that group with mode 0660 instead of 0600.
    pub fn spawn_with_group(
        path: &Path,
        handler: Handler,
        limits: ServerLimits,
        group: Option<u32>,
    ) -> io::Result<ControlServer> {
        if limits.max_connections == 0 || limits.request_timeout.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "control server limits must be non-zero",
            ));
        }
        create_parent_dir(path)?;
        remove_stale_socket(path)?;
        let listener = bind_owner_only(path, group)?;
        let metadata = fs::symlink_metadata(path)?;
        let socket_identity = (metadata.dev(), metadata.ino());
        if let Err(error) = listener.set_nonblocking(true) {
            let _ = fs::remove_file(path);
            return Err(error);
        }

        let (wake_rx, wake_tx) = match wake_pair() {
            Ok(pair) => pair,
            Err(error) => {
                let _ = fs::remove_file(path);
                return Err(error);
            }
        };
        raise_fd_limit(limits.max_connections as u64 + 256);
        let stop = Arc::new(AtomicBool::new(false));
        let wake = Arc::new(wake_tx);
        let acceptor = {
            let (stop, wake) = (Arc::clone(&stop), Arc::clone(&wake));
            spawn_helper(
                thread::Builder::new().name("sluice-control".into()),
                move || serve(listener, handler, limits, stop, wake_rx, wake),
            )
        };
        let acceptor = match acceptor {
            Ok(acceptor) => acceptor,
            Err(error) => {
                let _ = fs::remove_file(path);
                return Err(error);
            }
        };
        log::info!("control socket listening on {}", path.display());
        Ok(ControlServer {
            path: path.to_path_buf(),
            socket_identity,
            stop,
            wake,
            acceptor: Some(acceptor),
        })
    }

    /// Where the socket lives.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl ControlServer {
    /// Asks the server to stop, without waiting: it takes no new connection and ends
    /// once every request in flight is answered ([`ControlServer::is_stopped`]).
    pub fn begin_stop(&self) {
        self.stop.store(true, Ordering::Release);
        let _ = (&*self.wake).write(&[1]);
    }

    /// Whether the server's thread has ended.
    pub fn is_stopped(&self) -> bool {
        self.acceptor.as_ref().is_none_or(|t| t.is_finished())
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let _ = (&*self.wake).write(&[1]);
        if let Some(acceptor) = self.acceptor.take() {
            if acceptor.join().is_err() {
                log::error!("control socket thread panicked");
            }
        }
        let still_ours = fs::symlink_metadata(&self.path)
            .map(|metadata| (metadata.dev(), metadata.ino()) == self.socket_identity)
            .unwrap_or(false);
        if still_ours {
            if let Err(error) = fs::remove_file(&self.path) {
                log::warn!("cannot remove {}: {error}", self.path.display());
            }
        }
    }
}

/// Creates the directory of the socket at `path` (and its parents) with mode
/// [`SOCKET_DIR_MODE`] if it does not exist; an existing one is left as it is.
pub fn create_parent_dir(path: &Path) -> io::Result<()> {
    let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) else {
        return Ok(());
    };
    if parent.exists() {
        return Ok(());
    }
    fs::DirBuilder::new()
        .recursive(true)
        .mode(SOCKET_DIR_MODE)
        .create(parent)
        .map_err(|error| annotate(error, format!("cannot create {}", parent.display())))?;
    // The umask may have narrowed the mode; clients need to traverse the directory.
    fs::set_permissions(parent, fs::Permissions::from_mode(SOCKET_DIR_MODE))
}

/// Removes a socket file left behind by a daemon that died, but never a live one's and
/// never something that is not a socket (a typo in the config must not delete a file).
fn remove_stale_socket(path: &Path) -> io::Result<()> {
    let metadata = match fs::symlink_metadata(path) {
        Ok(metadata) => metadata,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(error) => {
            return Err(annotate(
                error,
                format!("cannot inspect {}", path.display()),
            ))
        }
    };
    if !metadata.file_type().is_socket() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!(
                "{} exists and is not a socket; refusing to replace it",
                path.display()
            ),
        ));
    }
    match UnixStream::connect(path) {
        Ok(_) => Err(another_daemon(path)),
        Err(error) if error.kind() == io::ErrorKind::ConnectionRefused => {
            log::info!("removing stale control socket {}", path.display());
            match fs::remove_file(path) {
                Err(error) if error.kind() != io::ErrorKind::NotFound => Err(annotate(
                    error,
                    format!("cannot remove stale socket {}", path.display()),
                )),
                _ => Ok(()),
            }
        }
        Err(error) => Err(annotate(
            error,
            format!("cannot tell whether {} is in use", path.display()),
        )),
    }
}

fn another_daemon(path: &Path) -> io::Error {
    io::Error::new(
        io::ErrorKind::AddrInUse,
        format!("another sluice is serving {}", path.display()),
    )
}

/// Binds `path` so that it is never connectable by other users, not even for the
/// instant between bind(2) (which applies the umask) and chmod(2): the socket is
/// created inside a private 0700 staging directory, narrowed to 0600 there, and then
/// hard-linked into place. Linking (unlike renaming) fails if a daemon started at
/// `path` meanwhile, instead of replacing its socket.
fn bind_owner_only(path: &Path, group: Option<u32>) -> io::Result<UnixListener> {
    static STAGING_SEQUENCE: AtomicU64 = AtomicU64::new(0);
    let parent = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let staging_dir = parent.join(format!(
        ".sluice-bind.{}.{}",
        std::process::id(),
        STAGING_SEQUENCE.fetch_add(1, Ordering::Relaxed)
    ));
    let staged_socket = staging_dir.join("s");
    if staged_socket.as_os_str().len() > MAX_SOCKET_PATH_BYTES {
        // No room for the staging name: bind, then chmod. The socket is bound under a
        // umask that leaves it owner-only until then: a connect(2) made in between
        // would otherwise wait in the backlog and be served after the chmod. The umask
        // is the process's; nothing else here creates files while the daemon starts.
        // SAFETY: umask only swaps the process's file mode mask.
        let umask = unsafe { libc::umask(0o177) };
        let bound = bind(path);
        // SAFETY: as above, putting the caller's mask back.
        unsafe { libc::umask(umask) };
        let listener = bound?;
        restrict(path, group)?;
        return Ok(listener);
    }

    fs::DirBuilder::new()
        .mode(0o700)
        .create(&staging_dir)
        .map_err(|error| annotate(error, format!("cannot create {}", staging_dir.display())))?;
    let result = (|| {
        let listener = bind(&staged_socket)?;
        restrict(&staged_socket, group)?;
        fs::hard_link(&staged_socket, path).map_err(|error| {
            if error.kind() == io::ErrorKind::AlreadyExists {
                another_daemon(path)
            } else {
                annotate(error, format!("cannot bind {}", path.display()))
            }
        })?;
        Ok(listener)
    })();
    let _ = fs::remove_file(&staged_socket);
    let _ = fs::remove_dir(&staging_dir);
    result
}

/// The socket's group (when configured) and mode: the group first, so the socket is
/// never 0660 for the wrong group.
fn restrict(path: &Path, group: Option<u32>) -> io::Result<()> {
    let mode = match group {
        Some(gid) => {
            std::os::unix::fs::chown(path, None, Some(gid)).map_err(|error| {
                annotate(
                    error,
                    format!("cannot give {} to gid {gid}", path.display()),
                )
            })?;
            GROUP_SOCKET_MODE
        }
        None => SOCKET_MODE,
    };
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
}

fn bind(path: &Path) -> io::Result<UnixListener> {
    UnixListener::bind(path)
        .map_err(|error| annotate(error, format!("cannot bind {}", path.display())))
}

fn annotate(error: io::Error, context: String) -> io::Error {
    io::Error::new(error.kind(), format!("{context}: {error}"))
}

/// A connected pair, both ends non-blocking: (the end the serving thread polls, the end
/// executors and `Drop` write a byte to).
/// The connected peer's user and group, as the kernel recorded them at connect.
fn peer_credentials(stream: &UnixStream) -> Option<Requester> {
    use std::os::fd::AsRawFd;
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `cred` and `len` are valid for writes of the sizes given, and the fd is
    // the stream's own, open for the call's duration.
    let rc = unsafe {
        libc::getsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    (rc == 0 && len as usize == std::mem::size_of::<libc::ucred>()).then_some(Requester {
        uid: cred.uid,
        gid: cred.gid,
    })
}

fn wake_pair() -> io::Result<(UnixStream, UnixStream)> {
    let (rx, tx) = UnixStream::pair()?;
    rx.set_nonblocking(true)?;
    tx.set_nonblocking(true)?;
    Ok((rx, tx))
}

/// A connection's place in its request/response cycle.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// Waiting for a complete request line, until `deadline`.
    Reading,
    /// A request is with an executor; the connection reads nothing meanwhile, so
    /// requests on one connection are answered in order.
    Executing,
    /// Sending `out`, until `deadline`; then close (`close_after`) or read again.
    Writing,
}

/// A `batch_begin` ... `batch_commit` in progress on one connection.
struct Staged {
    replace: bool,
    requests: Vec<Request>,
    /// Length of the `batch_part` lines staged.
    bytes: usize,
}

struct Connection {
    stream: UnixStream,
    /// The peer's user and group (`SO_PEERCRED`), stamped on the requests that act
    /// with the requester's permissions.
    requester: Option<Requester>,
    /// The user its limits count under ([`user_of`]).
    user: u32,
    /// Matches an executor's answer to its connection; never reused.
    token: u64,
    phase: Phase,
    deadline: Instant,
    /// Received bytes not yet consumed as request lines.
    pending: Vec<u8>,
    /// How much of `pending` is known to hold no newline.
    scanned: usize,
    /// The peer shut down its writing side.
    eof: bool,
    out: Vec<u8>,
    written: usize,
    close_after: bool,
    staged: Option<Staged>,
}

/// Work for an executor thread, and its answer.
type Job = (u64, Request);
/// A request's token and its response line.
type Done = (u64, String);

/// Requests waiting for a free executor, served one user after another: each user's
/// oldest first, then the next user's. A user with many connections (a member's
/// monitoring agent, or one flooding the socket) then delays another user's request
/// by at most one of its own (besides those the executors already hold), not by all
/// it has queued. Turns are counted in requests, whatever each costs. A connection has
/// at most one request here or executing, so a user has at most as many as its
/// connections.
#[derive(Default)]
struct FairQueue {
    /// Users with requests waiting, in the order they are served; none is empty.
    users: std::collections::VecDeque<(u32, std::collections::VecDeque<Job>)>,
}

impl FairQueue {
    fn push(&mut self, user: u32, job: Job) {
        match self.users.iter_mut().find(|(u, _)| *u == user) {
            Some((_, jobs)) => jobs.push_back(job),
            None => self
                .users
                .push_back((user, std::collections::VecDeque::from([job]))),
        }
    }

    /// The next user's oldest request; that user then goes last.
    fn pop(&mut self) -> Option<Job> {
        let (user, mut jobs) = self.users.pop_front()?;
        let job = jobs.pop_front();
        if !jobs.is_empty() {
            self.users.push_back((user, jobs));
        }
        job
    }
}

/// What the serving thread owns.
struct ServeLoop {
    listener: UnixListener,
    limits: ServerLimits,
    stop: Arc<AtomicBool>,
    /// Executors (and `Drop`) write a byte to its peer; the loop polls it.
    wake_rx: UnixStream,
    jobs: Option<crossbeam::channel::Sender<Job>>,
    done: crossbeam::channel::Receiver<Done>,
    executors: Vec<JoinHandle<()>>,
    /// Requests not yet handed to an executor: one goes out as one comes back, so
    /// the order users are served in is decided here, not by a first-come queue.
    waiting: FairQueue,
    /// Requests handed to the executors and not answered yet (at most one each).
    executing: usize,
    connections: Vec<Connection>,
    next_token: u64,
    /// After accept(2) failed for want of descriptors, the listener is left out of the
    /// poll set until then, instead of sleeping or spinning on it.
    accept_paused_until: Option<Instant>,
}

/// Serves the socket until `stop`: accepts, reads, dispatches and writes for every
/// connection from this one thread, without ever blocking on one of them.
fn serve(
    listener: UnixListener,
    handler: Handler,
    limits: ServerLimits,
    stop: Arc<AtomicBool>,
    wake_rx: UnixStream,
    wake_tx: Arc<UnixStream>,
) {
    let (jobs_tx, jobs_rx) = crossbeam::channel::unbounded::<Job>();
    let (done_tx, done_rx) = crossbeam::channel::unbounded::<Done>();
    let mut executors = Vec::with_capacity(EXECUTORS);
    for _ in 0..EXECUTORS {
        let (jobs, done, handler, wake) = (
            jobs_rx.clone(),
            done_tx.clone(),
            Arc::clone(&handler),
            Arc::clone(&wake_tx),
        );
        let spawned = spawn_helper(
            thread::Builder::new().name("sluice-control-exec".into()),
            move || {
                for (token, request) in jobs {
                    let response = execute(request, &handler);
                    if done.send((token, response)).is_err() {
                        return;
                    }
                    // A full pipe already holds a wake-up: nothing is lost.
                    let _ = (&*wake).write(&[1]);
                }
            },
        );
        match spawned {
            Ok(executor) => executors.push(executor),
            Err(error) => log::error!("cannot start a control executor thread: {error}"),
        }
    }
    // The executors hold the only receivers: should they all exit, a send fails and
    // the request is answered with an error instead of waiting for nobody.
    drop(jobs_rx);
    let mut state = ServeLoop {
        listener,
        limits,
        stop,
        wake_rx,
        jobs: Some(jobs_tx),
        done: done_rx,
        executors,
        waiting: FairQueue::default(),
        executing: 0,
        connections: Vec::new(),
        next_token: 0,
        accept_paused_until: None,
    };
    state.run();
}

impl ServeLoop {
    fn run(&mut self) {
        let mut fds: Vec<libc::pollfd> = Vec::new();
        loop {
            let stopping = self.stop.load(Ordering::Acquire);
            if stopping {
                self.begin_shutdown();
                if self.connections.is_empty() {
                    break;
                }
            }
            let now = Instant::now();
            if self.accept_paused_until.is_some_and(|until| now >= until) {
                self.accept_paused_until = None;
            }
            let listening = !stopping && self.accept_paused_until.is_none();
            fds.clear();
            fds.push(pollfd(self.wake_rx.as_raw_fd(), libc::POLLIN));
            if listening {
                fds.push(pollfd(self.listener.as_raw_fd(), libc::POLLIN));
            }
            let first_connection = fds.len();
            for connection in &self.connections {
                // A negative descriptor is skipped by poll(2): while a request executes,
                // a hang-up must not make poll return at once, over and over.
                let (fd, events) = match connection.phase {
                    Phase::Reading => (connection.stream.as_raw_fd(), libc::POLLIN),
                    Phase::Writing => (connection.stream.as_raw_fd(), libc::POLLOUT),
                    Phase::Executing => (-1, 0),
                };
                fds.push(pollfd(fd, events));
            }
            let timeout = self.poll_timeout(now);
            // SAFETY: `fds` is a valid, initialised array of `fds.len()` pollfd structs
            // that lives across the call; poll(2) only writes their `revents`.
            let ready = unsafe {
                libc::poll(
                    fds.as_mut_ptr(),
                    fds.len() as libc::nfds_t,
                    timeout.as_millis().min(i32::MAX as u128) as i32,
                )
            };
            if ready < 0 {
                let error = io::Error::last_os_error();
                if error.kind() != io::ErrorKind::Interrupted {
                    log::error!("control socket poll failed: {error}");
                    break;
                }
                continue;
            }
            if fds[0].revents != 0 {
                self.drain_wake();
            }
            self.collect_answers();
            // Connections first (their indexes match `fds`), then new ones, which are
            // appended and so do not disturb the indexes.
            let revents: Vec<i16> = fds[first_connection..]
                .iter()
                .map(|fd| fd.revents)
                .collect();
            for (index, events) in revents.into_iter().enumerate() {
                if events != 0 {
                    self.on_ready(index, events);
                }
            }
            self.expire(Instant::now());
            self.reap();
            if listening && fds[1].revents != 0 {
                self.accept_all();
            }
        }
        // Dropping the sender ends the executors' loops once they are idle.
        self.jobs = None;
        for executor in self.executors.drain(..) {
            if executor.join().is_err() {
                log::error!("control executor thread panicked");
            }
        }
    }

    /// Until the nearest deadline; at most a second, so a stop is noticed even if a
    /// wake-up were lost.
    fn poll_timeout(&self, now: Instant) -> Duration {
        let mut timeout = Duration::from_secs(1);
        for connection in &self.connections {
            if connection.phase != Phase::Executing {
                timeout = timeout.min(connection.deadline.saturating_duration_since(now));
            }
        }
        if let Some(until) = self.accept_paused_until {
            timeout = timeout.min(until.saturating_duration_since(now));
        }
        // Round up so a deadline 0.4 ms away does not make poll(2) return at once.
        if !timeout.subsec_nanos().is_multiple_of(1_000_000) {
            timeout += Duration::from_millis(1);
        }
        timeout
    }

    fn drain_wake(&mut self) {
        let mut sink = [0u8; 256];
        while matches!((&self.wake_rx).read(&mut sink), Ok(n) if n > 0) {}
    }

    fn collect_answers(&mut self) {
        while let Ok((token, response)) = self.done.try_recv() {
            self.executing = self.executing.saturating_sub(1);
            self.hand_out();
            let timeout = self.limits.request_timeout;
            let Some(index) = self.connections.iter().position(|c| c.token == token) else {
                continue;
            };
            let response = self.within_unsent_budget(index, response);
            self.connections[index].respond(response, false, timeout);
            if self.connections[index].phase == Phase::Reading {
                // Requests pipelined behind the one just answered.
                self.take_requests(index);
            }
        }
    }

    /// `response` for connection `index`, or, when its user is bounded and its
    /// connections already hold too many bytes of answers nobody read, an error line in
    /// its place (the answer is dropped at once).
    fn within_unsent_budget(&self, index: usize, response: String) -> String {
        let user = self.connections[index].user;
        if self.limits.unlimited_uid == Some(user) {
            return response;
        }
        let unsent: usize = self
            .connections
            .iter()
            .filter(|c| c.user == user)
            .map(|c| c.out.len() - c.written)
            .sum();
        // With nothing else unread, any answer goes (one larger than the budget would
        // otherwise never reach this user).
        if unsent == 0 || unsent + response.len() <= self.limits.user_unsent_bytes {
            return response;
        }
        Response::failure(format!(
            "answer of {} bytes withheld: this user's control connections already hold {unsent} \
             bytes of answers not yet read (limit {} per user other than root); read those first",
            response.len(),
            self.limits.user_unsent_bytes
        ))
        .to_line()
    }

    /// Commands and bytes staged in open batches over `user`'s connections.
    fn staged_by(&self, user: u32) -> (usize, usize) {
        self.connections
            .iter()
            .filter(|c| c.user == user)
            .filter_map(|c| c.staged.as_ref())
            .fold((0, 0), |(n, b), s| (n + s.requests.len(), b + s.bytes))
    }

    /// Removes closed connections, and the batches they left open.
    fn reap(&mut self) {
        self.connections.retain(|c| !c.closed());
    }

    /// Accepts every waiting connection; the over-limit ones get one error line,
    /// written without blocking, and are closed at once.
    fn accept_all(&mut self) {
        loop {
            let stream = match self.listener.accept() {
                Ok((stream, _)) => stream,
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return,
                Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
                Err(error) => {
                    // Typically EMFILE/ENFILE: the pending connection stays queued, so
                    // stop polling the listener for a moment rather than spin on it.
                    log::warn!("control socket accept failed: {error}");
                    self.accept_paused_until = Some(Instant::now() + ACCEPT_PAUSE);
                    return;
                }
            };
            if self.connections.len() >= self.limits.max_connections {
                reject(
                    stream,
                    &format!(
                        "too many control connections (limit {}); try again",
                        self.limits.max_connections
                    ),
                );
                continue;
            }
            let requester = peer_credentials(&stream);
            let user = user_of(requester);
            if self.limits.unlimited_uid != Some(user)
                && self.connections.iter().filter(|c| c.user == user).count()
                    >= self.limits.user_connections
            {
                reject(
                    stream,
                    &format!(
                        "too many control connections from uid {user} (limit {} per user \
                         other than root); close some and try again",
                        self.limits.user_connections
                    ),
                );
                continue;
            }
            if stream.set_nonblocking(true).is_err() {
                continue;
            }
            self.next_token += 1;
            self.connections.push(Connection {
                stream,
                requester,
                user,
                token: self.next_token,
                phase: Phase::Reading,
                deadline: Instant::now() + self.limits.request_timeout,
                pending: Vec::new(),
                scanned: 0,
                eof: false,
                out: Vec::new(),
                written: 0,
                close_after: false,
                staged: None,
            });
        }
    }

    fn on_ready(&mut self, index: usize, events: i16) {
        let timeout = self.limits.request_timeout;
        match self.connections[index].phase {
            Phase::Reading => {
                if events & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
                    self.connections[index].fill();
                    self.take_requests(index);
                }
            }
            Phase::Writing => {
                let connection = &mut self.connections[index];
                // The deadline bounds a peer that stops reading, not the length of a
                // response: a large one (`-S` of 100k services is megabytes) read at
                // the pace a loaded machine allows keeps its connection while it moves.
                if connection.flush() {
                    connection.deadline = Instant::now() + timeout;
                }
                if connection.phase == Phase::Reading {
                    connection.deadline = Instant::now() + timeout;
                    // Requests pipelined behind the one just answered.
                    self.take_requests(index);
                }
            }
            Phase::Executing => {}
        }
    }

    /// Consumes complete request lines while the connection is reading.
    fn take_requests(&mut self, index: usize) {
        let timeout = self.limits.request_timeout;
        while self.connections[index].phase == Phase::Reading {
            let connection = &mut self.connections[index];
            let line = match connection.next_line() {
                LineRead::Line(line) => (line, false),
                LineRead::FinalLine(line) => (line, true),
                LineRead::Oversize => {
                    let error = Response::failure(ProtocolError::Oversize.to_string());
                    connection.respond(error.to_line(), true, timeout);
                    return;
                }
                LineRead::Closed => {
                    connection.close();
                    return;
                }
                LineRead::Incomplete => return,
            };
            self.dispatch(index, &line.0, line.1);
        }
    }

    /// Answers protocol errors and batch staging here; anything else goes to an
    /// executor.
    fn dispatch(&mut self, index: usize, line: &[u8], last: bool) {
        let timeout = self.limits.request_timeout;
        let request = match parse_request(line) {
            Ok(request) => request,
            Err(error) => {
                let close = last || error.closes_connection();
                self.connections[index].respond(
                    Response::failure(error.to_string()).to_line(),
                    close,
                    timeout,
                );
                return;
            }
        };
        let staged = match request {
            Request::BatchBegin { replace } => Some(self.batch_begin(index, replace)),
            Request::BatchPart { requests } => Some(self.batch_part(index, requests, line.len())),
            Request::BatchCommit => match self.batch_commit(index) {
                Ok(batch) => {
                    self.execute_later(index, batch, last);
                    None
                }
                Err(message) => Some(Err(message)),
            },
            Request::CaptureStart {
                path,
                filter,
                interfaces,
                count,
                duration_ms,
                snaplen,
                requester: _,
            } => {
                let requester = self.connections[index].requester;
                let request = Request::CaptureStart {
                    path,
                    requester,
                    filter,
                    interfaces,
                    count,
                    duration_ms,
                    snaplen,
                };
                self.execute_later(index, request, last);
                None
            }
            request => {
                self.execute_later(index, request, last);
                None
            }
        };
        if let Some(result) = staged {
            let response = match result {
                Ok(value) => Response::success(value),
                Err(message) => Response::failure(message),
            };
            self.connections[index].respond(response.to_line(), last, timeout);
        }
    }

    fn batch_begin(&mut self, index: usize, replace: bool) -> Result<Value, String> {
        let connection = &mut self.connections[index];
        if connection.staged.is_some() {
            return Err(
                "a batch is already open on this connection (batch_commit it first)".into(),
            );
        }
        connection.staged = Some(Staged {
            replace,
            requests: Vec::new(),
            bytes: 0,
        });
        Ok(serde_json::json!({ "staged": 0 }))
    }

    /// Stages `requests`, from a `batch_part` line of `line_len` bytes.
    fn batch_part(
        &mut self,
        index: usize,
        requests: Vec<Request>,
        line_len: usize,
    ) -> Result<Value, String> {
        if self.connections[index].staged.is_none() {
            return Err("batch_part without batch_begin on this connection".into());
        }
        if let Some(nested) = requests.iter().find(|r| r.is_batch()) {
            return Err(format!(
                "a batch cannot contain {} (nothing was changed)",
                nested.command_name()
            ));
        }
        let (commands, bytes) = self.staged_by(self.connections[index].user);
        let connection = &mut self.connections[index];
        if commands + requests.len() > MAX_STAGED_COMMANDS
            || bytes + line_len > self.limits.user_staged_bytes
        {
            connection.staged = None;
            return Err(format!(
                "batch too large: more than {MAX_STAGED_COMMANDS} commands or {} bytes of \
                 batch_part lines staged by this user; the batch was dropped (nothing was \
                 changed)",
                self.limits.user_staged_bytes
            ));
        }
        let staged = connection.staged.as_mut().expect("checked above");
        staged.bytes += line_len;
        staged.requests.extend(requests);
        Ok(serde_json::json!({ "staged": staged.requests.len() }))
    }

    fn batch_commit(&mut self, index: usize) -> Result<Request, String> {
        let connection = &mut self.connections[index];
        let Some(staged) = connection.staged.take() else {
            return Err("batch_commit without batch_begin on this connection".into());
        };
        Ok(Request::Batch {
            requests: staged.requests,
            replace: staged.replace,
        })
    }

    fn execute_later(&mut self, index: usize, request: Request, last: bool) {
        let connection = &mut self.connections[index];
        connection.close_after = last;
        if self.jobs.is_none() || self.executors.is_empty() {
            let failure = Response::failure("internal error: no control executor");
            connection.respond(failure.to_line(), true, self.limits.request_timeout);
            return;
        }
        connection.phase = Phase::Executing;
        let (user, token) = (connection.user, connection.token);
        self.waiting.push(user, (token, request));
        self.hand_out();
    }

    /// Hands waiting requests to the executors, one per idle executor, in the
    /// [`FairQueue`]'s order.
    fn hand_out(&mut self) {
        while self.executing < self.executors.len() {
            let Some((token, request)) = self.waiting.pop() else {
                return;
            };
            let sent = self
                .jobs
                .as_ref()
                .is_some_and(|jobs| jobs.send((token, request)).is_ok());
            if sent {
                self.executing += 1;
            } else if let Some(connection) = self.connections.iter_mut().find(|c| c.token == token)
            {
                let failure = Response::failure("internal error: no control executor");
                connection.respond(failure.to_line(), true, self.limits.request_timeout);
            }
        }
    }

    /// Closes connections whose deadline passed: an incomplete request gets an error
    /// line (written now, without blocking), an idle one is closed quietly.
    fn expire(&mut self, now: Instant) {
        let timeout = self.limits.request_timeout;
        for connection in &mut self.connections {
            if connection.phase == Phase::Executing || now < connection.deadline {
                continue;
            }
            if connection.phase == Phase::Reading && !connection.pending.is_empty() {
                let error = Response::failure(format!(
                    "incomplete request line after {timeout:?}; closing connection"
                ));
                let _ = (&connection.stream).write(error.to_line().as_bytes());
            }
            connection.close();
        }
    }

    /// On stop: idle and reading connections close now; those with a request in
    /// progress get its answer first, if the peer takes it within
    /// [`SHUTDOWN_WRITE_GRACE`].
    fn begin_shutdown(&mut self) {
        let grace_end = Instant::now() + SHUTDOWN_WRITE_GRACE;
        for connection in &mut self.connections {
            match connection.phase {
                Phase::Reading => connection.close(),
                Phase::Writing => {
                    connection.close_after = true;
                    connection.deadline = connection.deadline.min(grace_end);
                }
                Phase::Executing => connection.close_after = true,
            }
        }
        self.expire(Instant::now());
        self.reap();
    }
}

impl Connection {
    fn closed(&self) -> bool {
        self.phase == Phase::Writing && self.out.is_empty() && self.close_after
    }

    /// Marks the connection for removal (the stream closes when it is dropped).
    fn close(&mut self) {
        self.phase = Phase::Writing;
        self.out.clear();
        self.written = 0;
        self.close_after = true;
    }

    /// Reads what the socket has, up to just past the request size cap.
    fn fill(&mut self) {
        let mut chunk = [0u8; 16 * 1024];
        while self.pending.len() <= MAX_REQUEST_BYTES && !self.eof {
            match (&self.stream).read(&mut chunk) {
                Ok(0) => self.eof = true,
                Ok(read) => {
                    self.pending.extend_from_slice(&chunk[..read]);
                    if chunk[..read].contains(&b'\n') {
                        return;
                    }
                }
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return,
                Err(_) => {
                    // Reset by the peer: nothing more will come, nothing can be sent.
                    self.pending.clear();
                    self.eof = true;
                    return;
                }
            }
        }
    }

    fn next_line(&mut self) -> LineRead {
        if let Some(offset) = self.pending[self.scanned..]
            .iter()
            .position(|&byte| byte == b'\n')
        {
            let end = self.scanned + offset;
            self.scanned = 0;
            if end > MAX_REQUEST_BYTES {
                return LineRead::Oversize;
            }
            let mut line: Vec<u8> = self.pending.drain(..=end).collect();
            line.pop();
            return LineRead::Line(line);
        }
        self.scanned = self.pending.len();
        if self.pending.len() > MAX_REQUEST_BYTES {
            return LineRead::Oversize;
        }
        if self.eof {
            self.scanned = 0;
            return if self.pending.is_empty() {
                LineRead::Closed
            } else {
                LineRead::FinalLine(std::mem::take(&mut self.pending))
            };
        }
        LineRead::Incomplete
    }

    /// Queues the response `line` and starts sending it.
    fn respond(&mut self, line: String, close: bool, timeout: Duration) {
        self.out = line.into_bytes();
        self.written = 0;
        self.close_after = close || self.close_after;
        self.phase = Phase::Writing;
        // From now, not from when the request arrived: writing out a large answer
        // (`-S` of 100k services) can take longer than the timeout on a loaded
        // machine.
        self.deadline = Instant::now() + timeout;
        self.flush();
    }

    /// Writes what the socket takes; when the whole response is out, the connection
    /// reads again (or is marked closed). Whether any byte was written.
    fn flush(&mut self) -> bool {
        let mut progress = false;
        while self.written < self.out.len() {
            match (&self.stream).write(&self.out[self.written..]) {
                Ok(0) => break,
                Ok(written) => {
                    self.written += written;
                    progress = true;
                }
                Err(error) if error.kind() == io::ErrorKind::Interrupted => {}
                Err(error) if error.kind() == io::ErrorKind::WouldBlock => return progress,
                Err(_) => {
                    self.close();
                    return progress;
                }
            }
        }
        self.out = Vec::new();
        self.written = 0;
        if self.close_after || (self.eof && self.pending.is_empty()) {
            self.close();
        } else {
            self.phase = Phase::Reading;
        }
        progress
    }
}

fn pollfd(fd: std::os::unix::io::RawFd, events: i16) -> libc::pollfd {
    libc::pollfd {
        fd,
        events,
        revents: 0,
    }
}

/// Sends one error line without ever blocking the acceptor, then closes.
fn reject(stream: UnixStream, message: &str) {
    if stream.set_nonblocking(true).is_ok() {
        let _ = (&stream).write(Response::failure(message).to_line().as_bytes());
    }
}

/// What the buffered bytes of a connection hold.
enum LineRead {
    /// A complete line, newline removed.
    Line(Vec<u8>),
    /// The peer closed after sending an unterminated line; treated as a last request so
    /// `printf '{"cmd":"status"}' | nc -U` works.
    FinalLine(Vec<u8>),
    /// The peer closed between requests.
    Closed,
    /// More than [`MAX_REQUEST_BYTES`] without a newline.
    Oversize,
    /// No complete line yet.
    Incomplete,
}

/// Runs one request through the handler, to the response line (written out here, on
/// the executor, not on the serving thread). An `Err` becomes an error response, a
/// panic `"internal error"`.
fn execute(request: Request, handler: &Handler) -> String {
    let command = request.command_name();
    match catch_unwind(AssertUnwindSafe(|| handler(request))) {
        Ok(Ok(Reply::Value(result))) => Response::success(result).to_line(),
        Ok(Ok(Reply::Line(line))) => line,
        Ok(Err(message)) => Response::failure(message).to_line(),
        Err(_) => {
            log::error!("control handler panicked while serving \"{command}\"");
            Response::failure("internal error").to_line()
        }
    }
}

/// Raises the soft limit on open files so that `wanted` descriptors fit (the hard
/// limit permitting): each control connection holds one.
fn raise_fd_limit(wanted: u64) {
    let Some((soft, hard)) = open_file_limits() else {
        return;
    };
    if soft >= wanted {
        return;
    }
    let target = wanted.min(hard);
    if !set_open_file_soft_limit(target) || target < wanted {
        log::warn!(
            "open-file limit {target} is below the {wanted} the control socket may need; connections beyond it wait in the backlog"
        );
    }
}

/// This process's limits on open files, (soft, hard); `None` when unreadable.
pub fn open_file_limits() -> Option<(u64, u64)> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct we pass, which outlives the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return None;
    }
    Some((limit.rlim_cur, limit.rlim_max))
}

/// Sets this process's soft limit on open files to `soft` (at most the hard limit);
/// whether the kernel took it.
pub fn set_open_file_soft_limit(soft: u64) -> bool {
    let Some((_, hard)) = open_file_limits() else {
        return false;
    };
    let raised = libc::rlimit {
        rlim_cur: soft.min(hard),
        rlim_max: hard,
    };
    // SAFETY: setrlimit only reads the struct we pass, which outlives the call.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::io::{BufRead, BufReader};
    use std::sync::atomic::AtomicUsize;

    fn echo_handler() -> Handler {
        value_handler(|request: Request| match request {
            Request::Status => Ok(json!({"status": "fine"})),
            Request::Xstats { port: 13 } => panic!("deliberate handler panic"),
            Request::Xstats { port } => Err(format!("no port {port}")),
            Request::ZeroCounters => Ok(Value::Null),
            Request::Batch { requests, replace } => {
                Ok(json!({"applied": requests.len(), "replace": replace}))
            }
            other => Err(format!(
                "{} not served by this test handler",
                other.command_name()
            )),
        })
    }

    fn fast_limits() -> ServerLimits {
        ServerLimits {
            max_connections: 4,
            request_timeout: Duration::from_millis(300),
            ..ServerLimits::default()
        }
    }

    struct Peer {
        writer: UnixStream,
        reader: BufReader<UnixStream>,
    }

    impl Peer {
        fn connect(path: &Path) -> Peer {
            let writer = UnixStream::connect(path).unwrap();
            writer
                .set_read_timeout(Some(Duration::from_secs(5)))
                .unwrap();
            let reader = BufReader::new(writer.try_clone().unwrap());
            Peer { writer, reader }
        }

        fn send(&mut self, bytes: &[u8]) {
            self.writer.write_all(bytes).unwrap();
        }

        /// The next response line, or `None` when the server closed the connection.
        fn receive(&mut self) -> Option<Response> {
            let mut line = String::new();
            match self.reader.read_line(&mut line) {
                Ok(0) => None,
                Ok(_) => Some(serde_json::from_str(&line).expect("response is JSON")),
                Err(error) if error.kind() == io::ErrorKind::ConnectionReset => None,
                Err(error) => panic!("reading response: {error}"),
            }
        }

        fn call(&mut self, bytes: &[u8]) -> Response {
            self.send(bytes);
            self.receive().expect("a response")
        }
    }

    fn error_of(response: Response) -> String {
        assert!(!response.ok, "expected an error, got {response:?}");
        response.error.expect("error text")
    }

    #[test]
    fn serves_many_requests_on_one_connection_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ctl.sock");
        let server = ControlServer::spawn(&path, echo_handler()).unwrap();
        assert_eq!(server.path(), path);
        let mut peer = Peer::connect(&path);
        // Pipelined: both requests in one write.
        peer.send(b"{\"cmd\":\"status\"}\n{\"cmd\":\"xstats\",\"port\":2}\n");
        assert_eq!(
            peer.receive().unwrap().into_result(),
            Ok(json!({"status": "fine"}))
        );
        assert_eq!(error_of(peer.receive().unwrap()), "no port 2");
        let response = peer.call(b"{\"cmd\":\"zero_counters\"}\r\n");
        assert_eq!(response.into_result(), Ok(Value::Null));
    }

    #[test]
    fn malformed_request_gets_an_error_and_the_connection_stays_usable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ctl.sock");
        let _server = ControlServer::spawn(&path, echo_handler()).unwrap();
        let mut peer = Peer::connect(&path);
        assert!(error_of(peer.call(b"{nope\n")).starts_with("malformed request"));
        assert!(error_of(peer.call(b"\n")).starts_with("malformed request"));
        assert!(error_of(peer.call(b"{\"cmd\":\"reboot\"}\n")).contains("known commands"));
        assert!(peer.call(b"{\"cmd\":\"status\"}\n").ok);
    }

    #[test]
    fn handler_panic_becomes_internal_error_and_server_survives() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ctl.sock");
        let _server = ControlServer::spawn(&path, echo_handler()).unwrap();
        let mut peer = Peer::connect(&path);
        assert_eq!(
            error_of(peer.call(b"{\"cmd\":\"xstats\",\"port\":13}\n")),
            "internal error"
        );
        assert!(peer.call(b"{\"cmd\":\"status\"}\n").ok);
        assert!(Peer::connect(&path).call(b"{\"cmd\":\"status\"}\n").ok);
    }

    #[test]
    fn oversize_line_gets_an_error_and_the_connection_is_closed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ctl.sock");
        let _server = ControlServer::spawn(&path, echo_handler()).unwrap();
        let mut peer = Peer::connect(&path);
        // Written from a thread: the server stops reading at the cap, so a blocking
        // write of the whole line could otherwise never finish.
        let mut writer = peer.writer.try_clone().unwrap();
        let sender = thread::spawn(move || {
            let _ = writer.write_all(&vec![b'x'; MAX_REQUEST_BYTES * 4]);
        });
        let error = error_of(peer.receive().expect("an error before closing"));
        assert!(error.contains("65536-byte limit"), "{error}");
        assert!(peer.receive().is_none(), "connection should be closed");
        sender.join().unwrap();
    }

    #[test]
    fn unterminated_last_request_is_answered() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ctl.sock");
        let _server = ControlServer::spawn(&path, echo_handler()).unwrap();
        let mut peer = Peer::connect(&path);
        peer.send(b"{\"cmd\":\"status\"}");
        peer.writer.shutdown(std::net::Shutdown::Write).unwrap();
        assert!(peer.receive().unwrap().ok);
        assert!(peer.receive().is_none());
    }

    #[test]
    fn silent_and_slow_clients_are_timed_out() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ctl.sock");
        let _server =
            ControlServer::spawn_with_limits(&path, echo_handler(), fast_limits()).unwrap();
        let mut silent = Peer::connect(&path);
        let started = Instant::now();
        assert!(silent.receive().is_none(), "idle connection closes quietly");
        assert!(started.elapsed() < Duration::from_secs(3));

        // Trickling bytes does not extend the deadline of a request.
        let mut slow = Peer::connect(&path);
        for _ in 0..6 {
            if slow.writer.write_all(b" ").is_err() {
                break;
            }
            thread::sleep(Duration::from_millis(80));
        }
        let error = error_of(slow.receive().expect("a timeout error"));
        assert!(error.starts_with("incomplete request line"), "{error}");
    }

    #[test]
    fn connections_beyond_the_limit_are_refused_with_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ctl.sock");
        let limits = ServerLimits {
            max_connections: 2,
            request_timeout: Duration::from_secs(5),
            ..ServerLimits::default()
        };
        let _server = ControlServer::spawn_with_limits(&path, echo_handler(), limits).unwrap();
        let mut held: Vec<Peer> = (0..2).map(|_| Peer::connect(&path)).collect();
        // Make sure both are being served before opening the third.
        for peer in &mut held {
            assert!(peer.call(b"{\"cmd\":\"status\"}\n").ok);
        }
        let mut extra = Peer::connect(&path);
        let error = error_of(extra.receive().expect("a refusal"));
        assert_eq!(error, "too many control connections (limit 2); try again");
        assert!(extra.receive().is_none());
        drop(held.pop());
        // The freed slot becomes usable once the server notices the close.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let mut peer = Peer::connect(&path);
            if peer.call(b"{\"cmd\":\"status\"}\n").ok {
                break;
            }
            assert!(Instant::now() < deadline, "slot never freed");
            thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn socket_is_owner_only_and_parent_dir_is_created() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run").join("sluice").join("ctl.sock");
        let server = ControlServer::spawn(&path, echo_handler()).unwrap();
        let metadata = fs::symlink_metadata(&path).unwrap();
        assert!(metadata.file_type().is_socket());
        assert_eq!(metadata.permissions().mode() & 0o777, SOCKET_MODE);
        let parent = fs::metadata(path.parent().unwrap()).unwrap();
        assert_eq!(parent.permissions().mode() & 0o777, SOCKET_DIR_MODE);
        // The staging directory is gone: only the socket remains.
        let entries: Vec<_> = fs::read_dir(path.parent().unwrap()).unwrap().collect();
        assert_eq!(entries.len(), 1);
        drop(server);
        assert!(!path.exists(), "drop removes the socket");
    }

    #[test]
    fn live_daemon_is_not_replaced_but_stale_socket_is() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ctl.sock");
        let live = ControlServer::spawn(&path, echo_handler()).unwrap();
        let error = ControlServer::spawn(&path, echo_handler()).err().unwrap();
        assert_eq!(error.kind(), io::ErrorKind::AddrInUse);
        assert_eq!(
            error.to_string(),
            format!("another sluice is serving {}", path.display())
        );
        assert!(Peer::connect(&path).call(b"{\"cmd\":\"status\"}\n").ok);
        drop(live);

        // A socket file nobody listens on, as left by a crashed daemon.
        drop(UnixListener::bind(&path).unwrap());
        assert!(path.exists());
        let _server = ControlServer::spawn(&path, echo_handler()).unwrap();
        assert!(Peer::connect(&path).call(b"{\"cmd\":\"status\"}\n").ok);
    }

    #[test]
    fn refuses_to_replace_a_file_that_is_not_a_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sluice.toml");
        fs::write(&path, "precious").unwrap();
        let error = ControlServer::spawn(&path, echo_handler()).err().unwrap();
        assert!(error.to_string().contains("is not a socket"), "{error}");
        assert_eq!(fs::read_to_string(&path).unwrap(), "precious");
    }

    #[test]
    fn drop_is_prompt_and_waits_for_in_flight_requests() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ctl.sock");
        let calls = Arc::new(AtomicUsize::new(0));
        let handler: Handler = {
            let calls = Arc::clone(&calls);
            value_handler(move |_| {
                thread::sleep(Duration::from_millis(200));
                calls.fetch_add(1, Ordering::SeqCst);
                Ok(Value::Null)
            })
        };
        let server = ControlServer::spawn(&path, handler).unwrap();
        let mut busy = Peer::connect(&path);
        busy.send(b"{\"cmd\":\"status\"}\n");
        let _idle = Peer::connect(&path);
        thread::sleep(Duration::from_millis(50));
        let started = Instant::now();
        drop(server);
        assert_eq!(
            calls.load(Ordering::SeqCst),
            1,
            "in-flight request completed"
        );
        assert!(busy.receive().expect("its response").ok);
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
        assert!(!path.exists());
    }

    #[test]
    fn drop_leaves_a_socket_that_replaced_ours_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ctl.sock");
        let server = ControlServer::spawn(&path, echo_handler()).unwrap();
        fs::remove_file(&path).unwrap();
        let _other = UnixListener::bind(&path).unwrap();
        drop(server);
        assert!(path.exists());
    }

    #[test]
    fn a_batch_staged_over_several_lines_reaches_the_handler_whole() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ctl.sock");
        let _server = ControlServer::spawn(&path, echo_handler()).unwrap();
        let mut peer = Peer::connect(&path);
        assert!(
            error_of(peer.call(b"{\"cmd\":\"batch_commit\"}\n")).contains("without batch_begin")
        );
        assert!(
            error_of(peer.call(b"{\"cmd\":\"batch_part\",\"requests\":[]}\n"))
                .contains("without batch_begin")
        );
        let begin = Request::BatchBegin { replace: true };
        assert_eq!(
            peer.call(begin.to_line().as_bytes()).into_result(),
            Ok(json!({"staged": 0}))
        );
        assert!(error_of(peer.call(begin.to_line().as_bytes())).contains("already open"));
        let part = Request::BatchPart {
            requests: vec![Request::Clear, Request::Clear],
        };
        for staged in [2, 4, 6] {
            assert_eq!(
                peer.call(part.to_line().as_bytes()).into_result(),
                Ok(json!({"staged": staged}))
            );
        }
        let nested = Request::BatchPart {
            requests: vec![Request::BatchCommit],
        };
        assert!(error_of(peer.call(nested.to_line().as_bytes())).contains("cannot contain"));
        assert_eq!(
            peer.call(Request::BatchCommit.to_line().as_bytes())
                .into_result(),
            Ok(json!({"applied": 6, "replace": true}))
        );
        // Committed: nothing stays open.
        assert!(
            error_of(peer.call(Request::BatchCommit.to_line().as_bytes()))
                .contains("without batch_begin")
        );
        // A batch belongs to its connection.
        let mut other = Peer::connect(&path);
        other.call(Request::BatchBegin { replace: false }.to_line().as_bytes());
        drop(other);
        assert!(
            error_of(peer.call(Request::BatchCommit.to_line().as_bytes()))
                .contains("without batch_begin")
        );
    }

    /// Limits that bound root too, so a test (run as root) meets them.
    fn user_limits() -> ServerLimits {
        ServerLimits {
            max_connections: 16,
            request_timeout: Duration::from_secs(5),
            unlimited_uid: None,
            ..ServerLimits::default()
        }
    }

    #[test]
    fn one_user_holds_at_most_its_share_of_connections() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ctl.sock");
        let limits = ServerLimits {
            user_connections: 2,
            ..user_limits()
        };
        let _server = ControlServer::spawn_with_limits(&path, echo_handler(), limits).unwrap();
        let mut held: Vec<Peer> = (0..2).map(|_| Peer::connect(&path)).collect();
        for peer in &mut held {
            assert!(peer.call(b"{\"cmd\":\"status\"}\n").ok);
        }
        let mut extra = Peer::connect(&path);
        let error = error_of(extra.receive().expect("a refusal"));
        assert_eq!(
            error,
            "too many control connections from uid 0 (limit 2 per user other than root); \
             close some and try again"
        );
        // Root is not bounded by default.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ctl.sock");
        let limits = ServerLimits {
            user_connections: 2,
            unlimited_uid: Some(0),
            ..user_limits()
        };
        let _server = ControlServer::spawn_with_limits(&path, echo_handler(), limits).unwrap();
        let mut held: Vec<Peer> = (0..4).map(|_| Peer::connect(&path)).collect();
        for peer in &mut held {
            assert!(peer.call(b"{\"cmd\":\"status\"}\n").ok);
        }
    }

    /// A user whose connections hold answers nobody reads gets no more answers than
    /// its budget; once it reads them it does again. Root is not bounded by default.
    #[test]
    fn answers_nobody_reads_are_bounded_per_user() {
        const ANSWER: usize = 4 << 20;
        let big = || {
            value_handler(|request: Request| match request {
                Request::Status => Ok(json!("x".repeat(ANSWER))),
                other => Err(format!("{} not served here", other.command_name())),
            })
        };
        let status = b"{\"cmd\":\"status\"}\n";
        for bounded in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("ctl.sock");
            let limits = ServerLimits {
                user_unsent_bytes: 6 << 20,
                unlimited_uid: (!bounded).then_some(0),
                ..user_limits()
            };
            let _server = ControlServer::spawn_with_limits(&path, big(), limits).unwrap();
            let (mut unread, mut asker) = (Peer::connect(&path), Peer::connect(&path));
            unread.send(status);
            // Until its answer has begun (it is answered on an executor thread): from
            // then on it is held here, all but what the socket took (a few hundred KB).
            assert!(!unread.reader.fill_buf().unwrap().is_empty());
            let response = asker.call(status);
            if !bounded {
                assert!(response.ok, "{response:?}");
                continue;
            }
            let error = error_of(response);
            let line = Response::success(json!("x".repeat(ANSWER))).to_line().len();
            let head = format!(
                "answer of {line} bytes withheld: this user's control connections already hold "
            );
            let tail = "bytes of answers not yet read (limit 6291456 per user other than root); \
                        read those first";
            assert!(error.starts_with(&head) && error.ends_with(tail), "{error}");
            let answer = unread.receive().expect("the held answer");
            assert_eq!(
                answer.into_result().unwrap().as_str().map(str::len),
                Some(ANSWER)
            );
            assert!(asker.call(status).ok, "answered once the other was read");
        }
    }

    #[test]
    fn staged_batch_lines_are_bounded_in_bytes_per_user() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ctl.sock");
        let part = Request::BatchPart {
            requests: vec![Request::Clear, Request::Clear],
        }
        .to_line();
        let line = part.len() - 1;
        let limits = ServerLimits {
            user_staged_bytes: 3 * line,
            ..user_limits()
        };
        let _server = ControlServer::spawn_with_limits(&path, echo_handler(), limits).unwrap();
        let (mut a, mut b) = (Peer::connect(&path), Peer::connect(&path));
        let begin = Request::BatchBegin { replace: false }.to_line();
        assert!(a.call(begin.as_bytes()).ok);
        assert!(b.call(begin.as_bytes()).ok);
        assert!(a.call(part.as_bytes()).ok);
        assert!(b.call(part.as_bytes()).ok);
        assert!(a.call(part.as_bytes()).ok);
        // A fourth line of this user's, on either connection, is too much.
        let error = error_of(b.call(part.as_bytes()));
        assert_eq!(
            error,
            format!(
                "batch too large: more than {MAX_STAGED_COMMANDS} commands or {} bytes of \
                 batch_part lines staged by this user; the batch was dropped (nothing was \
                 changed)",
                3 * line
            )
        );
        assert!(error_of(b.call(Request::BatchCommit.to_line().as_bytes()))
            .contains("without batch_begin"));
        // The dropped batch's bytes are free again.
        assert!(b.call(begin.as_bytes()).ok);
        assert!(b.call(part.as_bytes()).ok);
        assert_eq!(
            a.call(Request::BatchCommit.to_line().as_bytes())
                .into_result(),
            Ok(json!({"applied": 4, "replace": false}))
        );
    }

    /// An answer larger than the whole budget still reaches a bounded user that has
    /// nothing else unread.
    #[test]
    fn a_lone_answer_larger_than_the_budget_goes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ctl.sock");
        let handler = value_handler(|_| Ok(json!("x".repeat(2 << 20))));
        let limits = ServerLimits {
            user_unsent_bytes: 1 << 20,
            ..user_limits()
        };
        let _server = ControlServer::spawn_with_limits(&path, handler, limits).unwrap();
        let mut peer = Peer::connect(&path);
        let answer = peer.call(b"{\"cmd\":\"status\"}\n");
        assert_eq!(
            answer.into_result().unwrap().as_str().map(str::len),
            Some(2 << 20)
        );
    }

    #[test]
    fn the_fair_queue_serves_users_in_turn_each_in_order() {
        let job = |token: u64| (token, Request::Status);
        let mut queue = FairQueue::default();
        assert!(queue.pop().is_none());
        for token in 1..=4 {
            queue.push(1000, job(token));
        }
        queue.push(0, job(10));
        queue.push(1000, job(5));
        queue.push(7, job(20));
        queue.push(0, job(11));
        let order: Vec<u64> = std::iter::from_fn(|| queue.pop().map(|(t, _)| t)).collect();
        // 1000 first (it came first), then 0, then 7, then round again.
        assert_eq!(order, [1, 10, 20, 2, 11, 3, 4, 5]);
        assert!(queue.users.is_empty());
    }
}
