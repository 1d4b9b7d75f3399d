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
/// `persistence_timeout 50`, `protocol TCP`, `sorry_server 192.168.200.200 1358`,
/// forwarded as the service's NAT) with `real_server 192.168.200.2 1358`
/// (`weight 1`, `HTTP_GET` of `/testurl3/test.jsp`, `connect_timeout 3`, `retry 3`).
const SAMPLE: &str = "
[vrrp]
vrid = 50
any_peer = true
unauthenticated = true
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
sorry_server = { ip = \"192.168.200.200\", port = 1358, mode = \"nat\" }

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
any_peer = true
unauthenticated = true
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

/// keepalived.conf.UDP_CHECK: `virtual_server 10.10.10.2 1358`, `protocol UDP`,
/// `lb_algo rr`, `lb_kind NAT`, `persistence_timeout 50`, its real server
/// `192.168.200.6 1358` (`weight 1`) checked by `UDP_CHECK`, which Sluice has not:
/// no health table.
const UDP_CHECK: &str = "
[[services]]
proto = \"udp\"
vip = \"10.10.10.2\"
port = 1358
scheduler = \"rr\"
persistence_timeout = 50

  [[services.real_servers]]
  ip = \"192.168.200.6\"
  port = 1358
  weight = 1
  mode = \"nat\"
";

/// keepalived.conf.IPv6: `virtual_server ae00::1 80` (`lb_algo rr`, `lb_kind NAT`,
/// `persistence_timeout 50`) with `real_server ae00::10 25` (`weight 1`) checked by
/// `SMTP_CHECK` (not Sluice's): a NAT server on another port, no health table.
const IPV6: &str = "
[[services]]
proto = \"tcp\"
vip = \"ae00::1\"
port = 80
scheduler = \"rr\"
persistence_timeout = 50

  [[services.real_servers]]
  ip = \"ae00::10\"
  port = 25
  weight = 1
  mode = \"nat\"
";

/// keepalived.conf.quorum: `virtual_server 10.0.1.1 80` (`lb_algo wrr`, `lb_kind
/// NAT`, `persistence_timeout 900`), ten real servers `10.0.0.N 8080` (`weight 1`),
/// each with a `TCP_CHECK` on `connect_port 80`, `connect_timeout 3`, keepalived's
/// default `retry` 1 and the service's `delay_loop 6`.
fn quorum() -> String {
    let mut t = "
[[services]]
proto = \"tcp\"
vip = \"10.0.1.1\"
port = 80
scheduler = \"wrr\"
persistence_timeout = 900
"
    .to_string();
    for n in 1..=10 {
        t += &format!(
            "
  [[services.real_servers]]
  ip = \"10.0.0.{n}\"
  port = 8080
  weight = 1
  mode = \"nat\"

    [services.real_servers.health]
    check = \"tcp\"
    port = 80
    interval_ms = 6000
    timeout_ms = 3000
    fall = 2
"
        );
    }
    t
}

#[test]
fn keepalived_samples_translate_as_they_read() {
    let quorum = quorum();
    // (fixture, TOML, the lines stderr must name: what Sluice has no equivalent for)
    let cases: [(&str, &str, &[usize]); 8] = [
        // 3 global_defs, 13 vrrp_instance without unicast_peer (any_peer) and
        // unauthenticated (two notes), 14 interface eth0, 40 digest, 44
        // delay_before_retry.
        ("keepalived.conf.sample", SAMPLE, &[3, 13, 13, 14, 40, 44]),
        // 3 global_defs, 26 digest, 30 delay_before_retry.
        ("keepalived.conf.inhibit", INHIBIT, &[3, 26, 30]),
        // 4 global_defs, 23 SSL_GET, 35 delay_before_retry.
        ("keepalived.conf.status_code", STATUS_CODE, &[4, 23, 35]),
        // 3 global_defs, 13 vrrp_instance without unicast_peer (any_peer) and
        // unauthenticated (two notes), 14 state, 15 interface, 19 authentication, 39 SSL_GET, 50 delay_before_retry;
        // 67 digest, 69 the second url, 75 delay_before_retry of the HTTP_GET.
        (
            "keepalived.conf.SSL_GET",
            SSL_GET,
            &[3, 13, 13, 14, 15, 19, 39, 50, 67, 69, 75],
        ),
        // 4 global_defs, 23 UDP_CHECK.
        ("keepalived.conf.UDP_CHECK", UDP_CHECK, &[4, 23]),
        // 3 global_defs, 7 virtual_server_group, 24 SMTP_CHECK.
        ("keepalived.conf.IPv6", IPV6, &[3, 7, 24]),
        // 3 global_defs, 13 virtual_server_group, 22 `virtual_server group VSG_1`:
        // Sluice has no service groups, so nothing is translated.
        ("keepalived.conf.virtual_server_group", "", &[3, 13, 22]),
        // 29 alpha, 30 omega, 31 quorum, 32 hysteresis, 33 quorum_up, 34 quorum_down.
        ("keepalived.conf.quorum", &quorum, &[29, 30, 31, 32, 33, 34]),
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

/// Sluice runs the imported sample (VRRP, a service with an HTTP check and a sorry
/// server), and `sluicectl -Ln` lists the service as ipvsadm would: `"%-4s %s"` and
/// the scheduler, `" persistent %u"`, then `"  -> %-28s %-7s %-6d %-10u %-10u\n"`;
/// the sorry server is not listed while the real server can take connections (as
/// keepalived keeps it out of IPVS). Then every other sample's result starts too.
#[test]
fn sluice_starts_with_an_imported_sample() {
    require_root();
    let start = |name: &str| {
        let (toml, _) = import(name);
        // An IPv6 address too: the IPv6 sample's real servers are found by Neighbor
        // Discovery from one.
        let mut cfg = DaemonConfig::new(vec![PortSpec::loopback(
            "lan0",
            "02:53:4c:00:00:01",
            &["198.18.0.1/24", "2001:db8:18::1/64"],
        )]);
        cfg.loopback = vec!["peers = 1".into(), "garbage_every = 0".into()];
        cfg.extra_toml = vec![toml];
        Daemon::start(cfg)
    };
    let daemon = start("keepalived.conf.sample");
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
    let list = daemon.list_services();
    let sorry = &list["services"][0]["sorry_server"];
    assert_eq!(
        (&sorry["ip"], &sorry["port"], &sorry["mode"]),
        (&"192.168.200.200".into(), &1358.into(), &"nat".into()),
        "{list}"
    );
    daemon.stop_clean();
    // The others: each starts and lists its services (a sample with none, such as
    // virtual_server_group's, starts empty).
    for (name, services) in [
        ("keepalived.conf.inhibit", 1),
        ("keepalived.conf.status_code", 1),
        ("keepalived.conf.SSL_GET", 2),
        ("keepalived.conf.UDP_CHECK", 1),
        ("keepalived.conf.IPv6", 1),
        ("keepalived.conf.virtual_server_group", 0),
        ("keepalived.conf.quorum", 1),
    ] {
        let daemon = start(name);
        let list = daemon.list_services();
        assert_eq!(
            list["services"].as_array().map(Vec::len),
            Some(services),
            "{name}: {list}"
        );
        daemon.stop_clean();
    }
}
