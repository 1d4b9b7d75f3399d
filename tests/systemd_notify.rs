//! The daemon under systemd's `Type=notify` protocol, driven as systemd drives it (no
//! systemd runs in this container: PID 1 is not systemd): `NOTIFY_SOCKET` names a
//! datagram socket the test listens on, `WATCHDOG_USEC` asks for pings. Checked:
//! `READY=1` comes once the control socket answers (a `sluicectl status` sent the
//! moment it arrives succeeds at the first try, with the port and worker up);
//! `WATCHDOG=1` pings at half the interval; `sluicectl reload` and SIGHUP are each
//! framed by `RELOADING=1` (with `MONOTONIC_USEC`) and `READY=1`, and reloads asked
//! for together still alternate the two; SIGTERM sends
//! `STOPPING=1` before the exit. And with `JOURNAL_STREAM` naming its stderr, log
//! lines carry sd-daemon priorities (`<6>` info, `<4>` warning, `<3>` error), plain
//! without.
//!
//! Run: `cargo test --release --test integration systemd_notify::` (as root; about 3 s).

use crate::common::*;
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::UnixDatagram;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

fn loopback_config() -> DaemonConfig {
    let mut cfg = DaemonConfig::new(vec![PortSpec::loopback(
        "lan0",
        "02:53:4c:00:00:01",
        &["198.18.0.1/24"],
    )]);
    cfg.loopback = vec!["peers = 1".into()];
    cfg
}

/// Every datagram on `sock`, with its arrival time, on a channel.
fn listen(sock: UnixDatagram) -> mpsc::Receiver<(Instant, String)> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = sock.recv(&mut buf) {
            let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
            if tx.send((Instant::now(), msg)).is_err() {
                break;
            }
        }
    });
    rx
}

/// The next message that is not a watchdog ping, within `timeout`.
fn next_state(rx: &mpsc::Receiver<(Instant, String)>, timeout: Duration) -> Option<String> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.checked_duration_since(Instant::now())?;
        let (_, msg) = rx.recv_timeout(left).ok()?;
        if msg != "WATCHDOG=1" {
            return Some(msg);
        }
    }
}

#[test]
fn ready_watchdog_reload_and_stopping_are_notified_when_they_happen() {
    require_root();
    let cfg = loopback_config();
    let notify_path = cfg.path("notify.sock");
    let sock = UnixDatagram::bind(&notify_path).unwrap();
    let rx = listen(sock);
    let notify = notify_path.display().to_string();
    let daemon = Daemon::spawn_with_env(
        cfg,
        &[("NOTIFY_SOCKET", &notify), ("WATCHDOG_USEC", "400000")],
    );

    // READY=1 is the first message; the control socket answers the moment it comes.
    let first = next_state(&rx, READY_TIMEOUT)
        .unwrap_or_else(|| panic!("no READY=1 within {READY_TIMEOUT:?}\n{}", daemon.dump()));
    let status = daemon.ctl(&["--timeout", "2", "status", "--json"]);
    assert!(
        status.success(),
        "{first:?} came but the control socket does not answer: {}\n{}",
        status.describe(),
        daemon.dump()
    );
    assert!(
        first.starts_with("READY=1\n") && first.contains("STATUS=serving"),
        "first message: {first:?}"
    );
    let report: serde_json::Value = serde_json::from_str(&status.stdout).unwrap();
    assert_eq!(
        report["ports"].as_array().map(Vec::len),
        Some(1),
        "{report:#}"
    );

    // Pings every 200 ms (half of 400 ms): at least 4 within 1.2 s, none far apart.
    let mut pings = Vec::new();
    let until = Instant::now() + Duration::from_millis(1200);
    while let Some(left) = until.checked_duration_since(Instant::now()) {
        match rx.recv_timeout(left) {
            Ok((at, m)) if m == "WATCHDOG=1" => pings.push(at),
            Ok((_, m)) => panic!("unexpected message {m:?}"),
            Err(_) => break,
        }
    }
    assert!(pings.len() >= 4, "{} watchdog pings in 1.2 s", pings.len());
    let widest = pings.windows(2).map(|w| w[1] - w[0]).max().unwrap();
    assert!(
        widest < Duration::from_millis(400),
        "pings {widest:?} apart: longer than WATCHDOG_USEC"
    );

    // A reload through the control socket, then one through SIGHUP.
    let out = daemon.ctl(&["reload"]);
    assert!(out.success(), "{}", out.describe());
    for how in ["sluicectl reload", "SIGHUP"] {
        if how == "SIGHUP" {
            daemon.signal(libc::SIGHUP);
        }
        let reloading = next_state(&rx, Duration::from_secs(5))
            .unwrap_or_else(|| panic!("{how}: no RELOADING=1\n{}", daemon.dump()));
        assert!(
            reloading.starts_with("RELOADING=1\nMONOTONIC_USEC="),
            "{how}: {reloading:?}"
        );
        let ready = next_state(&rx, Duration::from_secs(5))
            .unwrap_or_else(|| panic!("{how}: no READY=1 after RELOADING=1"));
        assert!(
            ready.starts_with("READY=1\n") && ready.contains("reloaded, 0 change(s)"),
            "{how}: {ready:?}"
        );
    }

    // SIGTERM: STOPPING=1, then a clean exit.
    daemon.signal(libc::SIGTERM);
    let stopping = next_state(&rx, Duration::from_secs(5))
        .unwrap_or_else(|| panic!("no STOPPING=1 after SIGTERM\n{}", daemon.dump()));
    assert!(stopping.starts_with("STOPPING=1"), "{stopping:?}");
    daemon.stop_clean();
}

/// Reloads asked for together, each just after a save of the file (saved as editors
/// do, by renaming a new file over it): every `sluicectl reload` is answered,
/// `RELOADING=1` and `READY=1` alternate however the reloads overlap (one asked for
/// during a read waits for the next, and never starts a read beside it), and the table
/// ends as the last save has it. Whether a reload asked for during a read is read
/// again after it depends on timing here (a read of this file takes milliseconds); the
/// unit tests of `daemon::reloads` hold a read open to check that rule.
#[test]
fn reloads_asked_for_together_alternate_their_notifications_and_the_last_save_wins() {
    require_root();
    let mut cfg = loopback_config();
    let service = |weight: u32| {
        service_section(
            "tcp",
            "198.18.0.100",
            80,
            "wrr",
            &[],
            &[("198.18.0.2", 8080, weight, "nat")],
        )
    };
    cfg.extra_toml = vec![service(1)];
    let notify_path = cfg.path("notify.sock");
    let rx = listen(UnixDatagram::bind(&notify_path).unwrap());
    let notify = notify_path.display().to_string();
    let daemon = Daemon::spawn_with_env(cfg, &[("NOTIFY_SOCKET", &notify)]);
    let first = next_state(&rx, READY_TIMEOUT)
        .unwrap_or_else(|| panic!("no READY=1 within {READY_TIMEOUT:?}\n{}", daemon.dump()));
    assert!(first.starts_with("READY=1\n"), "{first:?}");

    let path = daemon.config.path("sluice.toml");
    let original = std::fs::read_to_string(&path).unwrap();
    assert!(original.contains(&service(1)), "the fixture changed");
    let saved = daemon.config.path("sluice.toml.new");
    let asked = 5;
    std::thread::scope(|s| {
        let reloads: Vec<_> = (2..2 + asked)
            .map(|weight| {
                std::fs::write(&saved, original.replace(&service(1), &service(weight))).unwrap();
                std::fs::rename(&saved, &path).unwrap();
                let daemon = &daemon;
                s.spawn(move || daemon.ctl(&["--timeout", "30", "reload"]))
            })
            .collect();
        for reload in reloads {
            let out = reload.join().expect("the reload thread");
            assert!(
                out.success() && out.stdout.starts_with("reloaded: "),
                "{}\n{}",
                out.describe(),
                daemon.dump()
            );
        }
    });
    // Every answer came after its READY=1: what was sent is all here.
    let mut states = Vec::new();
    while let Some(m) = next_state(&rx, Duration::from_millis(300)) {
        states.push(m);
    }
    let reads = states.len() / 2;
    assert!(
        states.len() % 2 == 0 && (1..=asked as usize).contains(&reads),
        "{states:#?}"
    );
    for pair in states.chunks(2) {
        assert!(
            pair[0].starts_with("RELOADING=1\n") && pair[1].starts_with("READY=1\n"),
            "not alternating: {states:#?}"
        );
        assert!(pair[1].contains("STATUS=serving: reloaded"), "{states:#?}");
    }
    let table = daemon.ctl(&["-S", "-n"]);
    let last = format!(
        "-a -t 198.18.0.100:80 -r 198.18.0.2:8080 -m -w {}\n",
        1 + asked
    );
    assert!(table.stdout.contains(&last), "{}", table.describe());
    daemon.stop_clean();
}

/// Runs the daemon for a moment with stderr in a file, `JOURNAL_STREAM` naming that
/// file (`stream` true) or another one; returns stderr.
fn stderr_with_journal_stream(stream: bool) -> String {
    let cfg = loopback_config();
    let path = cfg.write();
    let err_path = cfg.path("stderr.txt");
    let err = std::fs::File::create(&err_path).unwrap();
    let meta = err.metadata().unwrap();
    let ino = if stream { meta.ino() } else { meta.ino() + 1 };
    let mut child = Command::new(SLUICE)
        .arg("--config")
        .arg(&path)
        .args(["--duration", "0.5"])
        .env("JOURNAL_STREAM", format!("{}:{ino}", meta.dev()))
        // Not a socket address systemd gives: the daemon warns, and carries on.
        .env("NOTIFY_SOCKET", "nobody/notify")
        .stdout(Stdio::null())
        .stderr(err)
        .spawn()
        .unwrap();
    let status = wait_with_deadline(&mut child, Duration::from_secs(20));
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    std::fs::read_to_string(&err_path).unwrap()
}

#[test]
fn log_lines_carry_priorities_only_when_stderr_is_the_journal() {
    require_root();
    let journal = stderr_with_journal_stream(true);
    let up = journal
        .lines()
        .find(|l| l.contains("sluice up:"))
        .unwrap_or_else(|| panic!("no `sluice up` line:\n{journal}"));
    assert!(up.starts_with("<6>sluice::daemon: sluice up:"), "{up:?}");
    // A warning: `<4>`.
    let warning = journal
        .lines()
        .find(|l| l.contains("nobody/notify"))
        .unwrap_or_else(|| panic!("no warning about NOTIFY_SOCKET:\n{journal}"));
    assert!(
        warning.starts_with("<4>sluice::daemon::systemd: "),
        "{warning:?}"
    );
    let plain = stderr_with_journal_stream(false);
    let up = plain
        .lines()
        .find(|l| l.contains("sluice up:"))
        .unwrap_or_else(|| panic!("no `sluice up` line:\n{plain}"));
    assert!(up.starts_with('[') && !up.contains("<6>"), "{up:?}");

    // An error: `<3>` before the `sluice:` line.
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[eal]\nmemory_mb = \"lots\"\n").unwrap();
    let err_path = dir.path().join("stderr.txt");
    let err = std::fs::File::create(&err_path).unwrap();
    let meta = err.metadata().unwrap();
    let mut child = Command::new(SLUICE)
        .arg("--config")
        .arg(&bad)
        .env("JOURNAL_STREAM", format!("{}:{}", meta.dev(), meta.ino()))
        .stderr(err)
        .spawn()
        .unwrap();
    let status = wait_with_deadline(&mut child, Duration::from_secs(10));
    assert_eq!(status.and_then(|s| s.code()), Some(1));
    let text = std::fs::read_to_string(&err_path).unwrap();
    assert!(
        text.starts_with(&format!("<3>sluice: {}:2:", bad.display())),
        "{text:?}"
    );
}
