//! The daemon side of the control socket.
//!
//! One acceptor thread polls a non-blocking listener so that dropping the server stops
//! it within [`POLL_INTERVAL`]; each connection gets its own short-lived thread, capped
//! at [`ServerLimits::max_connections`]. Every read and write runs against a deadline,
//! so a slow, silent or hostile client costs at most one connection slot for
//! [`ServerLimits::request_timeout`] and never delays other clients or the daemon.
use crate::control::protocol::{
    parse_request, ProtocolError, Request, Response, MAX_REQUEST_BYTES,
};
use serde_json::Value;
use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// Executes one request on behalf of a client. Runs on a connection thread, so it must
/// be thread-safe; an `Err` becomes `{"ok":false,"error":...}`, a panic becomes
/// `"internal error"`.
pub type Handler = Arc<dyn Fn(Request) -> Result<Value, String> + Send + Sync>;

/// How often blocked threads wake to check for shutdown. Bounds how long `Drop` waits
/// (plus any handler call in progress) and the accept latency of an idle server.
pub const POLL_INTERVAL: Duration = Duration::from_millis(20);

/// How long a new connection may wait for a free slot before it is refused.
const SLOT_GRACE: Duration = Duration::from_millis(50);

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
    /// Connections served at once; more are answered with an error and closed.
    pub max_connections: usize,
    /// Time a client has to deliver each complete request line (from connect or from
    /// the previous response), and to take each response. A connection that misses it
    /// is closed.
    pub request_timeout: Duration,
}

impl Default for ServerLimits {
    fn default() -> ServerLimits {
        ServerLimits {
            max_connections: 16,
            request_timeout: Duration::from_secs(2),
        }
    }
}

/// A running control socket. Dropping it stops accepting, waits for in-flight requests
/// to finish, and removes the socket file; no handler runs after `drop` returns.
pub struct ControlServer {
    path: PathBuf,
    /// Device and inode of the socket file we bound, so `Drop` never deletes a socket
    /// that someone else has since put at the same path.
    socket_identity: (u64, u64),
    stop: Arc<AtomicBool>,
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

        let stop = Arc::new(AtomicBool::new(false));
        let acceptor = {
            let stop = Arc::clone(&stop);
            thread::Builder::new()
                .name("sluice-control".into())
                .spawn(move || accept_loop(listener, handler, limits, stop))
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
            acceptor: Some(acceptor),
        })
    }

    /// Where the socket lives.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
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

fn create_parent_dir(path: &Path) -> io::Result<()> {
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
        // No room for the staging name: fall back to bind-then-chmod, which leaves a
        // window of microseconds with umask permissions.
        let listener = bind(path)?;
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

fn accept_loop(
    listener: UnixListener,
    handler: Handler,
    limits: ServerLimits,
    stop: Arc<AtomicBool>,
) {
    let mut connections: Vec<JoinHandle<()>> = Vec::new();
    while !stop.load(Ordering::Acquire) {
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(error) if error.kind() == io::ErrorKind::WouldBlock => {
                thread::sleep(POLL_INTERVAL);
                continue;
            }
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(error) => {
                // Typically EMFILE/ENFILE: back off rather than spin, and keep serving.
                log::warn!("control socket accept failed: {error}");
                thread::sleep(POLL_INTERVAL);
                continue;
            }
        };
        connections.retain(|connection| !connection.is_finished());
        // A burst of short requests can fill every slot for a moment; give finishing
        // connections a brief chance to free one before refusing a well-behaved client.
        let grace_end = Instant::now() + SLOT_GRACE;
        while connections.len() >= limits.max_connections
            && Instant::now() < grace_end
            && !stop.load(Ordering::Acquire)
        {
            thread::sleep(Duration::from_millis(1));
            connections.retain(|connection| !connection.is_finished());
        }
        if connections.len() >= limits.max_connections {
            reject(
                stream,
                &format!(
                    "too many control connections (limit {}); try again",
                    limits.max_connections
                ),
            );
            continue;
        }
        // The thread gets a clone so that, should spawning fail, the acceptor still has
        // the stream to tell the client why it is being dropped.
        let spawned = {
            let (handler, limits, stop) = (Arc::clone(&handler), limits.clone(), Arc::clone(&stop));
            match stream.try_clone() {
                Ok(for_thread) => thread::Builder::new()
                    .name("sluice-control-conn".into())
                    .spawn(move || serve_connection(for_thread, &handler, &limits, &stop)),
                Err(error) => Err(error),
            }
        };
        match spawned {
            Ok(connection) => connections.push(connection),
            Err(error) => {
                log::warn!("cannot serve control connection: {error}");
                reject(stream, "internal error: cannot serve connection");
            }
        }
    }
    for connection in connections {
        let _ = connection.join();
    }
}

/// Sends one error line without ever blocking the acceptor, then closes.
fn reject(stream: UnixStream, message: &str) {
    if stream.set_nonblocking(true).is_ok() {
        let _ = (&stream).write_all(Response::failure(message).to_line().as_bytes());
    }
}

/// What reading one request line produced.
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
    /// The request did not arrive before its deadline.
    TimedOut { partial: bool },
    /// The server is shutting down, or the socket failed.
    Abandoned,
}

fn serve_connection(
    mut stream: UnixStream,
    handler: &Handler,
    limits: &ServerLimits,
    stop: &AtomicBool,
) {
    // Accepted sockets do not inherit the listener's O_NONBLOCK on Linux, but make the
    // blocking-with-timeout mode explicit since every read relies on it.
    if stream.set_nonblocking(false).is_err() {
        return;
    }
    let mut pending = Vec::new();
    loop {
        let deadline = Instant::now() + limits.request_timeout;
        let (response, keep_open) = match read_line(&mut stream, &mut pending, deadline, stop) {
            LineRead::Line(line) => respond(&line, handler),
            LineRead::FinalLine(line) => (respond(&line, handler).0, false),
            LineRead::Oversize => (
                Response::failure(ProtocolError::Oversize.to_string()),
                false,
            ),
            LineRead::TimedOut { partial: true } => (
                Response::failure(format!(
                    "incomplete request line after {:?}; closing connection",
                    limits.request_timeout
                )),
                false,
            ),
            LineRead::TimedOut { partial: false } | LineRead::Closed | LineRead::Abandoned => {
                return
            }
        };
        let deadline = Instant::now() + limits.request_timeout;
        let written = write_all_before(&mut stream, response.to_line().as_bytes(), deadline, stop);
        if !keep_open || written.is_err() {
            return;
        }
    }
}

/// Parses and executes one request line. Returns the response and whether the
/// connection can carry further requests.
fn respond(line: &[u8], handler: &Handler) -> (Response, bool) {
    let request = match parse_request(line) {
        Ok(request) => request,
        Err(error) => {
            return (
                Response::failure(error.to_string()),
                !error.closes_connection(),
            )
        }
    };
    let command = request.command_name();
    let response = match catch_unwind(AssertUnwindSafe(|| handler(request))) {
        Ok(Ok(result)) => Response::success(result),
        Ok(Err(message)) => Response::failure(message),
        Err(_) => {
            log::error!("control handler panicked while serving \"{command}\"");
            Response::failure("internal error")
        }
    };
    (response, true)
}

/// Reads until a newline, the deadline, EOF, the size cap, or shutdown. Bytes after the
/// newline stay in `pending` for the next call (clients may pipeline requests).
fn read_line(
    stream: &mut UnixStream,
    pending: &mut Vec<u8>,
    deadline: Instant,
    stop: &AtomicBool,
) -> LineRead {
    let mut scanned = 0;
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(offset) = pending[scanned..].iter().position(|&byte| byte == b'\n') {
            let end = scanned + offset;
            if end > MAX_REQUEST_BYTES {
                return LineRead::Oversize;
            }
            let mut line: Vec<u8> = pending.drain(..=end).collect();
            line.pop();
            return LineRead::Line(line);
        }
        scanned = pending.len();
        if pending.len() > MAX_REQUEST_BYTES {
            return LineRead::Oversize;
        }
        if stop.load(Ordering::Acquire) {
            return LineRead::Abandoned;
        }
        let now = Instant::now();
        if now >= deadline {
            return LineRead::TimedOut {
                partial: !pending.is_empty(),
            };
        }
        if stream
            .set_read_timeout(Some((deadline - now).min(POLL_INTERVAL)))
            .is_err()
        {
            return LineRead::Abandoned;
        }
        match stream.read(&mut chunk) {
            Ok(0) if pending.is_empty() => return LineRead::Closed,
            Ok(0) => return LineRead::FinalLine(std::mem::take(pending)),
            Ok(read) => pending.extend_from_slice(&chunk[..read]),
            Err(error) if is_retryable(&error) => {}
            Err(_) => return LineRead::Abandoned,
        }
    }
}

/// `write_all` that gives up at the deadline or on shutdown, so a client that stops
/// reading cannot pin the connection thread (or `Drop`) indefinitely.
fn write_all_before(
    stream: &mut UnixStream,
    mut bytes: &[u8],
    deadline: Instant,
    stop: &AtomicBool,
) -> io::Result<()> {
    while !bytes.is_empty() {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        stream.set_write_timeout(Some(remaining.min(POLL_INTERVAL)))?;
        match stream.write(bytes) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(written) => bytes = &bytes[written..],
            // Shutdown is only checked once the peer stops taking bytes, so the answer to
            // a request that was in flight during `Drop` is still delivered.
            Err(error) if is_retryable(&error) && !stop.load(Ordering::Acquire) => {}
            Err(error) => return Err(error),
        }
    }
    Ok(())
}

fn is_retryable(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::io::{BufRead, BufReader};
    use std::sync::atomic::AtomicUsize;

    fn echo_handler() -> Handler {
        Arc::new(|request: Request| match request {
            Request::Status => Ok(json!({"status": "fine"})),
            Request::Xstats { port: 13 } => panic!("deliberate handler panic"),
            Request::Xstats { port } => Err(format!("no port {port}")),
            Request::ZeroCounters => Ok(Value::Null),
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
            Arc::new(move |_| {
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
}
