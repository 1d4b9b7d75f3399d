//! `sluicectl import-keepalived` on keepalived's own sample configs (copies of
//! keepalived's `doc/samples` under tests/fixtures/keepalived/, see its README): the
//! TOML checked against what each sample says, the statements without a Sluice
//! equivalent listed by line, and Sluice started with a result, listing the services.
//!
//! Run: `cargo test --release --test integration keepalived_import::` (the daemon part as root).

use crate::common::*;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/keepalived")
        .join(name)
}

/// `sluicectl import-keepalived FILE`: stdout, and the line numbers stderr names.
fn import(name: &str) -> (String, Vec<usize>) {
    let path = fixture(name);
    let out = run_bounded(
        Command::new(SLUICECTL).arg("import-keepalived").arg(&path),
        Duration::from_secs(10),
    );
    assert_eq!(out.status.code(), Some(0), "{}", out.describe());
    let prefix = format!("{}:", path.display());
    let lines = out
        .stderr
        .lines()
        .map(|l| {
            let rest = l
                .strip_prefix(&prefix)
                .unwrap_or_else(|| panic!("{l}\n{}", out.describe()));
            rest.split(':').next().unwrap().parse().unwrap()
        })
        .collect();
    (out.stdout, lines)
}

/// The TOML after the three header comment lines.
fn body(toml: &str) -> &str {
    let mut rest = toml;
    for _ in 0..3 {
        assert!(rest.starts_with('#'), "{toml}");
        rest = rest.split_once('\n').unwrap().1;
    }
    rest
}

/// keepalived.conf.sample: `vrrp_instance VI_1` (`virtual_router_id 50`, `nopreempt`,
/// `priority 100`, `advert_int 1`, three `virtual_ipaddress`), `virtual_server
/// 10.10.10.2 1358` (`delay_loop 6`, `lb_algo rr`, `lb_kind NAT`,
/// `persistence_timeout 50`, `protocol TCP`) with `real_server 192.168.200.2 1358`
/// (`weight 1`, `HTTP_GET` of `/testurl3/test.jsp`, `connect_timeout 3`, `retry 3`).
const SAMPLE: &str = "
[vrrp]
vrid = 50
priority = 100
advert_interval_ms = 1000
preempt = false
addresses = [\"192.168.200.11\", \"192.168.200.12\", \"192.168.200.13\"]

[[services]]
proto = \"tcp\"
vip = \"10.10.10.2\"
port = 1358
scheduler = \"rr\"
persistence_timeout = 50

  [[services.real_servers]]
  ip = \"192.168.200.2\"
  port = 1358
  weight = 1
  mode = \"nat\"

    [services.real_servers.health]
    check = \"http\"
    path = \"/testurl3/test.jsp\"
    expect = 200
    interval_ms = 6000
    timeout_ms = 3000
    fall = 4
";

/// keepalived.conf.inhibit: the sample's virtual server without VRRP or sorry
/// server, its real server `inhibit_on_failure` (Sluice's eviction: the server stays,
/// without new connections).
const INHIBIT: &str = "
[[services]]
proto = \"tcp\"
vip = \"10.10.10.2\"
port = 1358
scheduler = \"rr\"
persistence_timeout = 50

  [[services.real_servers]]
  ip = \"192.168.200.2\"
  port = 1358
  weight = 1
  mode = \"nat\"

    [services.real_servers.health]
    check = \"http\"
    path = \"/testurl3/test.jsp\"
    expect = 200
    interval_ms = 6000
    timeout_ms = 3000
    fall = 4
";

/// keepalived.conf.status_code: `virtual_server 192.168.200.100 443` with an
/// `SSL_GET` (a TCP handshake in Sluice, which speaks no TLS).
const STATUS_CODE: &str = "
[[services]]
proto = \"tcp\"
vip = \"192.168.200.100\"
port = 443
scheduler = \"rr\"
persistence_timeout = 50

  [[services.real_servers]]
  ip = \"192.168.201.100\"
  port = 443
  weight = 1
  mode = \"nat\"

    [services.real_servers.health]
    check = \"tcp\"
    interval_ms = 6000
    timeout_ms = 3000
    fall = 4
";

/// keepalived.conf.SSL_GET: `vrrp_instance VI_1` (`state MASTER`, `virtual_router_id
/// 51`, `authentication`), an SSL_GET service on 443 and an HTTP_GET one on 80.
const SSL_GET: &str = "
[vrrp]
vrid = 51
priority = 100
advert_interval_ms = 1000
addresses = [\"192.168.200.16\", \"192.168.200.17\", \"192.168.200.18\"]

[[services]]
proto = \"tcp\"
vip = \"192.168.200.100\"
port = 443
scheduler = \"rr\"
persistence_timeout = 50

  [[services.real_servers]]
  ip = \"192.168.201.100\"
  port = 443
  weight = 1
  mode = \"nat\"

    [services.real_servers.health]
    check = \"tcp\"
    interval_ms = 6000
    timeout_ms = 3000
    fall = 4

[[services]]
proto = \"tcp\"
vip = \"192.168.200.100\"
port = 80
scheduler = \"rr\"
persistence_timeout = 50

  [[services.real_servers]]
  ip = \"192.168.201.100\"
  port = 80
  weight = 1
  mode = \"nat\"

    [services.real_servers.health]
    check = \"http\"
    path = \"/\"
    expect = 200
    interval_ms = 6000
    timeout_ms = 3000
    fall = 4
";

#[test]
fn keepalived_samples_translate_as_they_read() {
    // (fixture, TOML, the lines stderr must name: what Sluice has no equivalent for)
    let cases: [(&str, &str, &[usize]); 4] = [
        // 3 global_defs, 14 interface eth0, 33 sorry_server, 40 digest,
        // 44 delay_before_retry.
        ("keepalived.conf.sample", SAMPLE, &[3, 14, 33, 40, 44]),
        // 3 global_defs, 26 digest, 30 delay_before_retry.
        ("keepalived.conf.inhibit", INHIBIT, &[3, 26, 30]),
        // 4 global_defs, 23 SSL_GET, 35 delay_before_retry.
        ("keepalived.conf.status_code", STATUS_CODE, &[4, 23, 35]),
        // 3 global_defs, 14 state, 15 interface, 19 authentication, 39 SSL_GET,
        // 50 delay_before_retry; 67 digest, 69 the second url, 75 delay_before_retry
        // of the HTTP_GET.
        (
            "keepalived.conf.SSL_GET",
            SSL_GET,
            &[3, 14, 15, 19, 39, 50, 67, 69, 75],
        ),
    ];
    for (name, toml, lines) in cases {
        let (out, named) = import(name);
        assert_eq!(body(&out), toml, "{name}:\n{out}");
        assert_eq!(named, lines, "{name}");
    }
    // A file that is not keepalived's syntax: exit 1, the line named.
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.conf");
    std::fs::write(&bad, "virtual_server 10.0.0.1 80 {\n  lb_algo rr\n").unwrap();
    let out = run_bounded(
        Command::new(SLUICECTL).arg("import-keepalived").arg(&bad),
        Duration::from_secs(10),
    );
    assert_eq!(out.status.code(), Some(1), "{}", out.describe());
    assert_eq!(
        out.stderr,
        format!(
            "sluicectl: {}: line 1: this block is never closed\n",
            bad.display()
        )
    );
    assert_eq!(out.stdout, "");
}

/// Sluice runs the imported sample (VRRP and a service with an HTTP check), and
/// `sluicectl -Ln` lists the service as ipvsadm would: `"%-4s %s"` and the scheduler,
/// `" persistent %u"`, then `"  -> %-28s %-7s %-6d %-10u %-10u\n"`.
#[test]
fn sluice_starts_with_an_imported_sample() {
    require_root();
    let (toml, _) = import("keepalived.conf.sample");
    let mut cfg = DaemonConfig::new(vec![PortSpec::loopback(
        "lan0",
        "02:53:4c:00:00:01",
        &["198.18.0.1/24"],
    )]);
    cfg.loopback = vec!["peers = 1".into(), "garbage_every = 0".into()];
    cfg.extra_toml = vec![toml];
    let daemon = Daemon::start(cfg);
    let out = daemon.ctl(&["-L", "-n"]);
    assert!(out.success(), "{}", out.describe());
    assert_eq!(
        out.stdout,
        format!(
            "IP Virtual Server version 1.2.1 (size=4096)\n\
             Prot LocalAddress:Port Scheduler Flags\n  \
             -> RemoteAddress:Port           Forward Weight ActiveConn InActConn\n\
             TCP  10.10.10.2:1358 rr persistent 50\n  \
             -> {:<28} {:<7} {:<6} {:<10} {:<10}\n",
            "192.168.200.2:1358", "Masq", 1, 0, 0
        ),
        "{}",
        out.describe()
    );
    daemon.stop_clean();
}
