//! Running under systemd: the `sd_notify` datagram protocol (`READY=1`, `RELOADING=1`,
//! `STOPPING=1`, `WATCHDOG=1`, `STATUS=...` to `$NOTIFY_SOCKET`, see sd_notify(3)),
//! the watchdog interval systemd asks for (`$WATCHDOG_USEC`, `$WATCHDOG_PID`), and
//! whether stderr is the journal (`$JOURNAL_STREAM`, see systemd.exec(5)), in which
//! case log lines carry sd-daemon(3) priority prefixes (`<3>` error ... `<7>` debug).
//!
//! The protocol is one datagram of `KEY=VALUE` lines to a Unix socket, a path or, when
//! it starts with `@`, a name in the abstract namespace; it needs no library.
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::{Duration, Instant};

/// The notification socket systemd gave this process, or nothing (not under a
/// `Type=notify` unit: every message is then dropped without a syscall).
pub struct Notifier {
    target: Option<(UnixDatagram, SocketAddr)>,
    /// Half the watchdog interval, and when the next ping is due.
    watchdog: Option<(Duration, Instant)>,
}

impl Notifier {
    /// From `$NOTIFY_SOCKET`, `$WATCHDOG_USEC` and `$WATCHDOG_PID`. A socket that
    /// cannot be used is logged once and ignored: the appliance runs without it.
    pub fn from_env() -> Notifier {
        let target = std::env::var_os("NOTIFY_SOCKET").and_then(|name| {
            let name = name.to_string_lossy().into_owned();
            match Self::open(&name) {
                Ok(t) => Some(t),
                Err(e) => {
                    log::warn!("NOTIFY_SOCKET={name}: {e}; not notifying systemd");
                    None
                }
            }
        });
        let watchdog = watchdog_interval(
            std::env::var("WATCHDOG_USEC").ok().as_deref(),
            std::env::var("WATCHDOG_PID").ok().as_deref(),
            std::process::id(),
        )
        .map(|every| (every / 2, Instant::now()));
        Notifier { target, watchdog }
    }

    fn open(name: &str) -> std::io::Result<(UnixDatagram, SocketAddr)> {
        let addr = match name.strip_prefix('@') {
            Some(abstract_name) => {
                use std::os::linux::net::SocketAddrExt;
                SocketAddr::from_abstract_name(abstract_name.as_bytes())?
            }
            None if name.starts_with('/') => SocketAddr::from_pathname(name)?,
            None => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidInput,
                    "neither an absolute path nor an @abstract name",
                ))
            }
        };
        Ok((UnixDatagram::unbound()?, addr))
    }

    /// Sends `state` (newline-separated `KEY=VALUE` assignments); a failure is logged,
    /// never fatal.
    pub fn notify(&self, state: &str) {
        if let Some((sock, addr)) = &self.target {
            if let Err(e) = sock.send_to_addr(state.as_bytes(), addr) {
                log::warn!("sd_notify {:?}: {e}", state.lines().next().unwrap_or(""));
            }
        }
    }

    /// `READY=1` with a status line: start-up finished, or a reload did.
    pub fn ready(&self, status: &str) {
        self.notify(&format!("READY=1\nSTATUS={status}"));
    }

    /// `RELOADING=1`: a reload starts (systemd waits for the next `READY=1`).
    pub fn reloading(&self) {
        self.notify(&format!(
            "RELOADING=1\nMONOTONIC_USEC={}\nSTATUS=reloading",
            monotonic_usec()
        ));
    }

    /// `STOPPING=1`: shutting down.
    pub fn stopping(&self) {
        self.notify("STOPPING=1\nSTATUS=stopping");
    }

    /// `WATCHDOG=1` when half the interval has passed since the last one; called on
    /// every turn of the management loop, so a wedged loop stops the pings.
    pub fn watchdog_tick(&mut self, now: Instant) {
        let Some((half, next)) = &mut self.watchdog else {
            return;
        };
        if now >= *next {
            *next = now + *half;
            self.notify("WATCHDOG=1");
        }
    }
}

/// The watchdog interval, when systemd set one for this process: `WATCHDOG_USEC`
/// microseconds, unless `WATCHDOG_PID` names another process.
fn watchdog_interval(usec: Option<&str>, pid: Option<&str>, own: u32) -> Option<Duration> {
    let usec: u64 = usec?.trim().parse().ok().filter(|&u| u > 0)?;
    match pid.map(|p| p.trim().parse::<u32>()) {
        Some(Ok(p)) if p != own => None,
        Some(Err(_)) => None,
        _ => Some(Duration::from_micros(usec)),
    }
}

/// CLOCK_MONOTONIC in microseconds, as `MONOTONIC_USEC=` wants it.
fn monotonic_usec() -> u64 {
    // SAFETY: timespec is plain data; clock_gettime writes it.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: a valid clock id and a pointer to a timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1_000
}

/// Whether stderr is the journal's stream for this process: `$JOURNAL_STREAM` is
/// `DEVICE:INODE` of the stream systemd connected, and stderr is still that file
/// (not redirected by a wrapper).
pub fn stderr_is_journal() -> bool {
    let Ok(stream) = std::env::var("JOURNAL_STREAM") else {
        return false;
    };
    // SAFETY: stat is plain data; fstat fills it for a descriptor we do not close.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fd 2 and a pointer to a stat we own.
    if unsafe { libc::fstat(2, &mut st) } != 0 {
        return false;
    }
    journal_stream_matches(&stream, st.st_dev, st.st_ino)
}

fn journal_stream_matches(stream: &str, dev: u64, ino: u64) -> bool {
    let Some((d, i)) = stream.trim().split_once(':') else {
        return false;
    };
    d.parse() == Ok(dev) && i.parse() == Ok(ino)
}

/// The sd-daemon(3) prefix the journal reads a line's priority from.
pub fn journal_prefix(level: log::Level) -> &'static str {
    match level {
        log::Level::Error => "<3>",
        log::Level::Warn => "<4>",
        log::Level::Info => "<6>",
        log::Level::Debug | log::Level::Trace => "<7>",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_watchdog_interval_is_ours_only_when_the_pid_matches() {
        let s = Some(Duration::from_secs(3));
        assert_eq!(watchdog_interval(Some("3000000"), None, 7), s);
        assert_eq!(watchdog_interval(Some("3000000"), Some("7"), 7), s);
        assert_eq!(watchdog_interval(Some("3000000"), Some("8"), 7), None);
        assert_eq!(watchdog_interval(Some("3000000"), Some("x"), 7), None);
        assert_eq!(watchdog_interval(Some("0"), None, 7), None);
        assert_eq!(watchdog_interval(Some("soon"), None, 7), None);
        assert_eq!(watchdog_interval(None, Some("7"), 7), None);
    }

    #[test]
    fn journal_stream_is_device_colon_inode() {
        assert!(journal_stream_matches("8:12345", 8, 12345));
        assert!(!journal_stream_matches("8:12345", 8, 12346));
        assert!(!journal_stream_matches("9:12345", 8, 12345));
        assert!(!journal_stream_matches("812345", 8, 12345));
        assert!(!journal_stream_matches("", 8, 12345));
    }

    #[test]
    fn messages_reach_a_path_and_an_abstract_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let listener = UnixDatagram::bind(&path).unwrap();
        let mut buf = [0u8; 256];
        let (sock, addr) = Notifier::open(path.to_str().unwrap()).unwrap();
        let n = Notifier {
            target: Some((sock, addr)),
            watchdog: None,
        };
        n.stopping();
        let len = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"STOPPING=1\nSTATUS=stopping");

        use std::os::linux::net::SocketAddrExt;
        let name = format!("sluice-test-{}", std::process::id());
        let abs = UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(&name).unwrap()).unwrap();
        let (sock, addr) = Notifier::open(&format!("@{name}")).unwrap();
        let n = Notifier {
            target: Some((sock, addr)),
            watchdog: None,
        };
        n.ready("serving");
        let len = abs.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"READY=1\nSTATUS=serving");
        assert!(Notifier::open("relative.sock").is_err());
    }
}
