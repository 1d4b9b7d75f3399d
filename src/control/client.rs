//! The client side of the control socket, used by `sluicectl` and the tests.
use crate::control::protocol::{RawResponse, Request, Response};
use serde_json::value::RawValue;
use serde_json::Value;
use std::fmt;
use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

/// The largest response the client buffers. Far above any real reply (xstats of a
/// many-queue NIC is tens of kilobytes) yet bounded, so a broken peer cannot exhaust
/// the CLI's memory.
pub const MAX_RESPONSE_BYTES: usize = 64 * 1024 * 1024;

/// Why a request did not produce a result. Each variant displays as one line that says
/// what happened and, where there is one, what to do about it.
#[derive(Debug)]
pub enum ClientError {
    /// Nothing listens at the path (missing file, stale socket, or not a socket).
    NoDaemon { path: PathBuf },
    /// The socket exists but is not accessible to this user.
    PermissionDenied { path: PathBuf },
    /// The daemon accepted nothing, or did not reply, within the timeout.
    Timeout { path: PathBuf, after: Duration },
    /// The daemon closed the connection before replying.
    Closed { path: PathBuf },
    /// Any other socket failure.
    Io { path: PathBuf, source: io::Error },
    /// The reply was not a protocol response.
    BadResponse { path: PathBuf, detail: String },
    /// The daemon executed the request and reported this error.
    Daemon(String),
}

impl fmt::Display for ClientError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ClientError::NoDaemon { path } => write!(
                f,
                "no sluice daemon at {} (is it running? check control.socket in the config)",
                path.display()
            ),
            ClientError::PermissionDenied { path } => write!(
                f,
                "permission denied on {} (run as root, or as a member of the control.group the config gives the socket)",
                path.display()
            ),
            ClientError::Timeout { path, after } => write!(
                f,
                "no reply from the sluice daemon at {} within {}",
                path.display(),
                format_duration(*after)
            ),
            ClientError::Closed { path } => write!(
                f,
                "the sluice daemon at {} closed the connection without replying",
                path.display()
            ),
            ClientError::Io { path, source } => {
                write!(
                    f,
                    "cannot talk to the sluice daemon at {}: {source}",
                    path.display()
                )
            }
            ClientError::BadResponse { path, detail } => write!(
                f,
                "unreadable reply from the sluice daemon at {}: {detail}",
                path.display()
            ),
            ClientError::Daemon(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for ClientError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ClientError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Sends one request on a fresh connection and returns the daemon's result. `timeout`
/// bounds the whole exchange: connecting, sending and waiting for the reply.
pub fn request(path: &Path, req: &Request, timeout: Duration) -> Result<Value, ClientError> {
    let deadline = Instant::now() + timeout;
    Connection::open_before(path, timeout, deadline)?.call(req)
}

/// As [`request`], with the result left as JSON text, for reading it straight into a
/// report type ([`Connection::call_raw`]).
pub fn request_raw(
    path: &Path,
    req: &Request,
    timeout: Duration,
) -> Result<Box<RawValue>, ClientError> {
    let deadline = Instant::now() + timeout;
    Connection::open_before(path, timeout, deadline)?.call_raw(req)
}

/// An open control connection that can carry several requests in turn.
pub struct Connection {
    path: PathBuf,
    stream: UnixStream,
    timeout: Duration,
    /// Bytes received after the last response line (normally none).
    pending: Vec<u8>,
    /// Where reads land: 64 KiB, since a listing of 50,000 real servers is 18 MB.
    /// Allocated by the first call that reads.
    chunk: Vec<u8>,
}

impl Connection {
    /// Connects to the daemon; `timeout` bounds the connect and then each later call.
    pub fn open(path: &Path, timeout: Duration) -> Result<Connection, ClientError> {
        Connection::open_before(path, timeout, Instant::now() + timeout)
    }

    fn open_before(
        path: &Path,
        timeout: Duration,
        deadline: Instant,
    ) -> Result<Connection, ClientError> {
        let stream = connect_before(path, timeout, deadline)?;
        Ok(Connection {
            path: path.to_path_buf(),
            stream,
            timeout,
            pending: Vec::new(),
            chunk: Vec::new(),
        })
    }

    /// Bounds each later call (send and reply) to `timeout`.
    pub fn set_timeout(&mut self, timeout: Duration) {
        self.timeout = timeout;
    }

    /// Sends `req` and waits up to the connection's timeout for its reply.
    pub fn call(&mut self, req: &Request) -> Result<Value, ClientError> {
        let line = self.exchange(req)?;
        let response: Response =
            serde_json::from_slice(&line).map_err(|error| self.bad_response(error))?;
        response.into_result().map_err(ClientError::Daemon)
    }

    /// As [`call`](Connection::call), with the result left as JSON text: the caller
    /// reads it into its report type without a [`Value`] tree in between (a listing
    /// of 50,000 real servers is 18 MB of JSON).
    pub fn call_raw(&mut self, req: &Request) -> Result<Box<RawValue>, ClientError> {
        let line = self.exchange(req)?;
        let response: RawResponse =
            serde_json::from_slice(&line).map_err(|error| self.bad_response(error))?;
        response.into_result().map_err(ClientError::Daemon)
    }

    /// Sends `req` and returns its reply line, within the connection's timeout.
    fn exchange(&mut self, req: &Request) -> Result<Vec<u8>, ClientError> {
        let deadline = Instant::now() + self.timeout;
        self.send(req.to_line().as_bytes(), deadline)?;
        self.receive_line(deadline)
    }

    fn bad_response(&self, error: serde_json::Error) -> ClientError {
        ClientError::BadResponse {
            path: self.path.clone(),
            detail: error.to_string(),
        }
    }

    fn send(&mut self, mut bytes: &[u8], deadline: Instant) -> Result<(), ClientError> {
        while !bytes.is_empty() {
            self.stream
                .set_write_timeout(Some(self.remaining(deadline)?))
                .map_err(|error| self.io_error(error))?;
            match self.stream.write(bytes) {
                Ok(0) => {
                    return Err(ClientError::Closed {
                        path: self.path.clone(),
                    })
                }
                Ok(written) => bytes = &bytes[written..],
                Err(error) if is_retryable(&error) => {}
                // The daemon may have closed on us after answering with an error (for
                // example when it is at its connection limit): prefer showing that answer.
                Err(error) if is_disconnect(&error) => return self.answer_after_disconnect(),
                Err(error) => return Err(self.io_error(error)),
            }
        }
        Ok(())
    }

    fn answer_after_disconnect(&mut self) -> Result<(), ClientError> {
        let short_wait = Instant::now() + Duration::from_millis(100);
        let line = self.receive_line(short_wait).map_err(|error| match error {
            ClientError::Timeout { .. } => ClientError::Closed {
                path: self.path.clone(),
            },
            other => other,
        })?;
        match serde_json::from_slice::<Response>(&line).map(Response::into_result) {
            Ok(Err(message)) => Err(ClientError::Daemon(message)),
            _ => Err(ClientError::Closed {
                path: self.path.clone(),
            }),
        }
    }

    fn receive_line(&mut self, deadline: Instant) -> Result<Vec<u8>, ClientError> {
        let mut scanned = 0;
        if self.chunk.is_empty() {
            self.chunk = vec![0; 1 << 16];
        }
        loop {
            if let Some(offset) = self.pending[scanned..].iter().position(|&b| b == b'\n') {
                // The line is usually all there is: keep its buffer, copy the rest.
                let rest = self.pending.split_off(scanned + offset + 1);
                let mut line = std::mem::replace(&mut self.pending, rest);
                line.pop();
                return Ok(line);
            }
            scanned = self.pending.len();
            if self.pending.len() > MAX_RESPONSE_BYTES {
                return Err(ClientError::BadResponse {
                    path: self.path.clone(),
                    detail: format!("reply exceeds {MAX_RESPONSE_BYTES} bytes"),
                });
            }
            self.stream
                .set_read_timeout(Some(self.remaining(deadline)?))
                .map_err(|error| self.io_error(error))?;
            match self.stream.read(&mut self.chunk) {
                Ok(0) => {
                    return Err(ClientError::Closed {
                        path: self.path.clone(),
                    })
                }
                Ok(read) => self.pending.extend_from_slice(&self.chunk[..read]),
                Err(error) if is_retryable(&error) => {}
                Err(error) if is_disconnect(&error) => {
                    return Err(ClientError::Closed {
                        path: self.path.clone(),
                    })
                }
                Err(error) => return Err(self.io_error(error)),
            }
        }
    }

    fn remaining(&self, deadline: Instant) -> Result<Duration, ClientError> {
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            Err(ClientError::Timeout {
                path: self.path.clone(),
                after: self.timeout,
            })
        } else {
            Ok(remaining)
        }
    }

    fn io_error(&self, source: io::Error) -> ClientError {
        classify_io_error(&self.path, source)
    }
}

/// Connects, giving up at the deadline. connect(2) on a Unix socket blocks while the
/// listener's backlog is full (a hung daemon), and std offers no connect timeout, so
/// the connect runs on a helper thread that is abandoned if it does not finish in time.
fn connect_before(
    path: &Path,
    timeout: Duration,
    deadline: Instant,
) -> Result<UnixStream, ClientError> {
    let (sender, receiver) = mpsc::channel();
    let target = path.to_path_buf();
    thread::Builder::new()
        .name("sluice-ctl-connect".into())
        .spawn(move || {
            let _ = sender.send(UnixStream::connect(&target));
        })
        .map_err(|source| ClientError::Io {
            path: path.to_path_buf(),
            source,
        })?;
    let remaining = deadline.saturating_duration_since(Instant::now());
    match receiver.recv_timeout(remaining) {
        Ok(Ok(stream)) => Ok(stream),
        Ok(Err(error)) => Err(classify_io_error(path, error)),
        Err(_) => Err(ClientError::Timeout {
            path: path.to_path_buf(),
            after: timeout,
        }),
    }
}

fn classify_io_error(path: &Path, source: io::Error) -> ClientError {
    let path = path.to_path_buf();
    match source.kind() {
        io::ErrorKind::NotFound
        | io::ErrorKind::ConnectionRefused
        | io::ErrorKind::NotADirectory => ClientError::NoDaemon { path },
        io::ErrorKind::PermissionDenied => ClientError::PermissionDenied { path },
        _ => ClientError::Io { path, source },
    }
}

fn is_retryable(error: &io::Error) -> bool {
    // Timeouts surface as WouldBlock/TimedOut; the loops re-check the deadline.
    matches!(
        error.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut | io::ErrorKind::Interrupted
    )
}

fn is_disconnect(error: &io::Error) -> bool {
    matches!(
        error.kind(),
        io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::ConnectionAborted
    )
}

/// `5s`, `1.5s`, `250ms`.
fn format_duration(duration: Duration) -> String {
    if duration.subsec_millis() == 0 {
        format!("{}s", duration.as_secs())
    } else if duration.as_secs() == 0 {
        format!("{}ms", duration.as_millis())
    } else {
        format!("{}s", duration.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::server::{value_handler, ControlServer, Handler};
    use serde_json::json;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::net::UnixListener;

    const TIMEOUT: Duration = Duration::from_secs(5);

    fn handler() -> Handler {
        value_handler(|request: Request| match request {
            Request::Status => Ok(json!({"up": true})),
            Request::Xstats { port } => Err(format!("no port {port}")),
            Request::ZeroCounters => Ok(Value::Null),
            // Many reads' worth (the client reads 64 KiB at a time).
            Request::ListServices => Ok(json!({"blob": "x".repeat(1 << 20)})),
            other => Err(format!(
                "{} not served by this test handler",
                other.command_name()
            )),
        })
    }

    #[test]
    fn request_returns_the_result_or_the_daemon_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ctl.sock");
        let _server = ControlServer::spawn(&path, handler()).unwrap();
        assert_eq!(
            request(&path, &Request::Status, TIMEOUT).unwrap(),
            json!({"up": true})
        );
        let error = request(&path, &Request::Xstats { port: 9 }, TIMEOUT).unwrap_err();
        assert!(
            matches!(&error, ClientError::Daemon(text) if text == "no port 9"),
            "{error:?}"
        );
        assert_eq!(error.to_string(), "no port 9");
        assert_eq!(
            request(&path, &Request::ZeroCounters, TIMEOUT).unwrap(),
            Value::Null
        );
    }

    #[test]
    fn one_connection_carries_several_calls() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ctl.sock");
        let _server = ControlServer::spawn(&path, handler()).unwrap();
        let mut connection = Connection::open(&path, TIMEOUT).unwrap();
        for _ in 0..3 {
            assert_eq!(
                connection.call(&Request::Status).unwrap(),
                json!({"up": true})
            );
        }
    }

    #[test]
    fn a_raw_request_returns_the_result_text_or_the_daemon_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ctl.sock");
        let _server = ControlServer::spawn(&path, handler()).unwrap();
        let status = request_raw(&path, &Request::Status, TIMEOUT).unwrap();
        assert_eq!(status.get(), r#"{"up":true}"#);
        let error = request_raw(&path, &Request::Xstats { port: 9 }, TIMEOUT).unwrap_err();
        assert!(
            matches!(&error, ClientError::Daemon(text) if text == "no port 9"),
            "{error:?}"
        );
        let zeroed = request_raw(&path, &Request::ZeroCounters, TIMEOUT).unwrap();
        assert_eq!(zeroed.get(), "null");
        // A reply of many reads, twice on one connection, each the same as the value
        // the daemon sent.
        let mut connection = Connection::open(&path, TIMEOUT).unwrap();
        for _ in 0..2 {
            let blob = connection.call_raw(&Request::ListServices).unwrap();
            let value: Value = serde_json::from_str(blob.get()).unwrap();
            assert_eq!(value, json!({"blob": "x".repeat(1 << 20)}));
            assert_eq!(
                connection.call(&Request::Status).unwrap(),
                json!({"up": true})
            );
        }
    }

    #[test]
    fn missing_socket_says_no_daemon_and_where_to_look() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("absent.sock");
        let error = request(&path, &Request::Status, TIMEOUT).unwrap_err();
        assert!(matches!(error, ClientError::NoDaemon { .. }), "{error:?}");
        assert_eq!(
            error.to_string(),
            format!(
                "no sluice daemon at {} (is it running? check control.socket in the config)",
                path.display()
            )
        );
    }

    #[test]
    fn stale_socket_also_says_no_daemon() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stale.sock");
        drop(UnixListener::bind(&path).unwrap());
        let error = request(&path, &Request::Status, TIMEOUT).unwrap_err();
        assert!(matches!(error, ClientError::NoDaemon { .. }), "{error:?}");
    }

    #[test]
    fn unreadable_socket_says_permission_denied() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ctl.sock");
        let _server = ControlServer::spawn(&path, handler()).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o000)).unwrap();
        let result = request(&path, &Request::Status, TIMEOUT);
        // root bypasses file permissions, so the denial is only observable as non-root.
        if is_root() {
            assert!(result.is_ok());
        } else {
            let error = result.unwrap_err();
            assert!(
                matches!(error, ClientError::PermissionDenied { .. }),
                "{error:?}"
            );
            assert!(error.to_string().starts_with("permission denied on "));
        }
    }

    fn is_root() -> bool {
        fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|status| {
                status
                    .lines()
                    .find(|line| line.starts_with("Uid:"))
                    .map(|line| line.split_whitespace().nth(2) == Some("0"))
            })
            .unwrap_or(false)
    }

    #[test]
    fn silent_daemon_times_out_with_the_configured_duration() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("mute.sock");
        // Listens (so connect succeeds) but never accepts or answers.
        let _listener = UnixListener::bind(&path).unwrap();
        let started = Instant::now();
        let error = request(&path, &Request::Status, Duration::from_millis(250)).unwrap_err();
        assert!(started.elapsed() >= Duration::from_millis(250));
        assert!(started.elapsed() < Duration::from_secs(3));
        assert!(matches!(error, ClientError::Timeout { .. }), "{error:?}");
        assert_eq!(
            error.to_string(),
            format!(
                "no reply from the sluice daemon at {} within 250ms",
                path.display()
            )
        );
    }

    #[test]
    fn garbage_reply_is_reported_as_unreadable() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("liar.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let liar = thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut request = [0u8; 64];
            let _ = stream.read(&mut request).unwrap();
            stream.write_all(b"HTTP/1.0 200 OK\n").unwrap();
        });
        let error = request(&path, &Request::Status, TIMEOUT).unwrap_err();
        assert!(
            matches!(error, ClientError::BadResponse { .. }),
            "{error:?}"
        );
        liar.join().unwrap();
    }

    /// A fake daemon on `path` that, for its one connection, reads one request and
    /// writes `reply`, then waits for `done` before closing.
    fn fake_daemon(path: &Path, reply: Vec<u8>) -> (mpsc::Sender<()>, thread::JoinHandle<()>) {
        let listener = UnixListener::bind(path).unwrap();
        let (done, wait) = mpsc::channel::<()>();
        let daemon = thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut request = [0u8; 64];
            let _ = stream.read(&mut request).unwrap();
            let _ = stream.write_all(&reply);
            let _ = wait.recv_timeout(Duration::from_secs(10));
        });
        (done, daemon)
    }

    #[test]
    fn two_replies_in_one_read_answer_two_calls() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("two.sock");
        // Both replies in one write: the second waits in the connection's buffer.
        let (done, daemon) = fake_daemon(
            &path,
            b"{\"ok\":true,\"result\":1}\n{\"ok\":true,\"result\":[2]}\n".to_vec(),
        );
        let mut connection = Connection::open(&path, TIMEOUT).unwrap();
        assert_eq!(connection.call_raw(&Request::Status).unwrap().get(), "1");
        assert_eq!(connection.call(&Request::Status).unwrap(), json!([2]));
        done.send(()).unwrap();
        daemon.join().unwrap();
    }

    #[test]
    fn a_reply_past_the_size_limit_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big.sock");
        // Never ends its line.
        let (done, daemon) = fake_daemon(&path, vec![b' '; MAX_RESPONSE_BYTES + (1 << 17)]);
        let error = request_raw(&path, &Request::Status, TIMEOUT).unwrap_err();
        assert!(
            matches!(&error, ClientError::BadResponse { detail, .. }
                if detail == &format!("reply exceeds {MAX_RESPONSE_BYTES} bytes")),
            "{error:?}"
        );
        done.send(()).unwrap();
        daemon.join().unwrap();
    }

    #[test]
    fn socket_errors_are_classified_by_cause() {
        let path = Path::new("/run/sluice/x.sock");
        let classify = |kind: io::ErrorKind| classify_io_error(path, io::Error::from(kind));
        assert!(matches!(
            classify(io::ErrorKind::NotFound),
            ClientError::NoDaemon { .. }
        ));
        assert!(matches!(
            classify(io::ErrorKind::ConnectionRefused),
            ClientError::NoDaemon { .. }
        ));
        let denied = classify(io::ErrorKind::PermissionDenied);
        assert_eq!(
            denied.to_string(),
            "permission denied on /run/sluice/x.sock (run as root, or as a member of the control.group the config gives the socket)"
        );
        let other = classify(io::ErrorKind::OutOfMemory);
        assert!(matches!(other, ClientError::Io { .. }), "{other:?}");
        assert!(other
            .to_string()
            .starts_with("cannot talk to the sluice daemon at /run/sluice/x.sock: "));
    }

    #[test]
    fn durations_format_compactly() {
        assert_eq!(format_duration(Duration::from_secs(5)), "5s");
        assert_eq!(format_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(format_duration(Duration::from_millis(250)), "250ms");
    }
}
