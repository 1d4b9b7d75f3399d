//! Config loading: one test per error class (each checks the field path and the line),
//! the example files, and the EAL argv.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use super::*;
use crate::model::{Persistence, Protocol};

/// A small valid config. Line numbers matter to the tests below:
/// 1 [eal], 2 hugepages, 3 memory_mb, 4 file_prefix, 6 [lcores], 7 management,
/// 8 workers, 10 [control], 11 socket, 13 [[ports]], 14 name, 15 loopback, 16 mac,
/// 17 addresses, 19 [loopback], 20 peers.
const BASE: &str = r#"[eal]
hugepages = false
memory_mb = 256
file_prefix = "test"

[lcores]
management = 0
workers = [1]

[control]
socket = "/run/sluice/test.sock"

[[ports]]
name = "lan0"
loopback = true
mac = "02:00:00:00:00:01"
addresses = ["198.18.0.1/24"]

[loopback]
peers = 4
"#;

/// A second port, appended to BASE: lines 21 [[ports]], 22 name, 23 vdev, 24 addresses.
const SECOND_PORT: &str = r#"[[ports]]
name = "lan1"
vdev = "net_null0"
addresses = ["198.18.1.1/24"]
"#;

/// A service, appended to BASE: lines 21 [[services]], 22 proto, 23 vip, 24 port,
/// 25 scheduler, 27 [[services.real_servers]], 28 ip, 29 weight,
/// 31 [[services.real_servers]], 32 ip, 33 mode. A second copy starts at line 34.
const SERVICE: &str = r#"[[services]]
proto = "tcp"
vip = "198.18.1.1"
port = 80
scheduler = "rr"

[[services.real_servers]]
ip = "198.18.0.11"
weight = 1

[[services.real_servers]]
ip = "198.18.0.12"
mode = "dr"
"#;

/// BASE plus SERVICE with the first occurrence of `from` replaced by `to`.
fn service_with(from: &str, to: &str) -> String {
    assert!(SERVICE.contains(from), "SERVICE has no {from:?}");
    format!("{BASE}{}", SERVICE.replacen(from, to, 1))
}

/// BASE, SERVICE, then a second service: SERVICE with `from` replaced by `to`.
fn two_services(from: &str, to: &str) -> String {
    assert!(SERVICE.contains(from), "SERVICE has no {from:?}");
    format!("{BASE}{SERVICE}{}", SERVICE.replacen(from, to, 1))
}

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, Path::new("test.toml"))
}

/// BASE with the first occurrence of `from` replaced by `to`.
fn base_with(from: &str, to: &str) -> String {
    assert!(BASE.contains(from), "BASE has no {from:?}");
    BASE.replacen(from, to, 1)
}

fn two_ports(port2_from: &str, port2_to: &str) -> String {
    assert!(
        SECOND_PORT.contains(port2_from),
        "SECOND_PORT has no {port2_from:?}"
    );
    format!("{BASE}{}", SECOND_PORT.replacen(port2_from, port2_to, 1))
}

/// Asserts that `text` is rejected at `line` for `field`, with a message containing
/// `needle`.
#[track_caller]
fn assert_rejected(text: &str, line: usize, field: &str, needle: &str) -> ConfigError {
    let err = match parse(text) {
        Ok(cfg) => panic!("accepted, expected an error at {field}: {cfg:?}"),
        Err(e) => e,
    };
    assert_eq!(err.field, field, "wrong field in: {err}");
    assert_eq!(err.line, line, "wrong line in: {err}");
    assert!(err.message.contains(needle), "{needle:?} not in: {err}");
    assert_eq!(err.file, PathBuf::from("test.toml"));
    record_rejected(text, line, field, needle);
    err
}

/// Where the rejected configs are kept as files, for `sluice --check-config`'s test
/// (tests/check_config.rs) and [`broken_config_fixtures_are_rejected_as_recorded`].
const BROKEN_CONFIGS: &str = "tests/fixtures/broken-configs.json";

/// With `SLUICE_RECORD_BROKEN_CONFIGS=DIR`, each config [`assert_rejected`] refuses is
/// written to DIR as one JSON case (`scripts/record-broken-configs.sh` gathers them
/// into [`BROKEN_CONFIGS`]). Without it, the config must already be there, so a new
/// rejection test cannot leave `sluice --check-config`'s test behind.
fn record_rejected(text: &str, line: usize, field: &str, needle: &str) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    // A config naming a file of the test's temp dir cannot be replayed without it.
    if text.contains(&*std::env::temp_dir().to_string_lossy()) {
        return;
    }
    let Some(dir) = std::env::var_os("SLUICE_RECORD_BROKEN_CONFIGS") else {
        assert!(
            recorded_broken_configs().contains(text),
            "this rejected config is not in {BROKEN_CONFIGS}: run scripts/record-broken-configs.sh"
        );
        return;
    };
    let name = std::thread::current()
        .name()
        .unwrap_or("unnamed")
        .rsplit("::")
        .next()
        .unwrap_or("unnamed")
        .to_string();
    let case = serde_json::json!({
        "test": name, "line": line, "field": field, "needle": needle, "text": text,
    });
    let file = Path::new(&dir).join(format!(
        "{name}-{}-{}.json",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    std::fs::write(file, case.to_string()).expect("recording a rejected config");
}

fn example(name: &str) -> Config {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("config")
        .join(name);
    Config::load(&path).unwrap_or_else(|e| panic!("{e}"))
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

// ---- valid input -------------------------------------------------------------

#[test]
fn base_parses_with_defaults() {
    let cfg = parse(BASE).unwrap();
    assert_eq!(cfg.path, PathBuf::from("test.toml"));
    assert!(!cfg.eal.hugepages);
    assert!(cfg.eal.extra_args.is_empty());
    assert_eq!(cfg.lcores.workers, vec![1]);
    let port = &cfg.ports[0];
    assert_eq!(port.device, PortDevice::Loopback);
    assert_eq!(port.mac, Some([2, 0, 0, 0, 0, 1]));
    assert_eq!((port.rx_desc, port.tx_desc), (1024, 1024));
    assert_eq!((port.rss_key.clone(), port.mtu), (None, None));
    assert_eq!(cfg.loopback.ping_interval_ms, 100);
    assert_eq!(cfg.loopback.garbage_every, 10);
    assert_eq!(cfg.loopback.stats_interval_ms, 1000);
}

#[test]
fn minimal_file_gets_every_default() {
    let cfg = parse(
        "[lcores]\nmanagement = 0\nworkers = [1]\n\
         [[ports]]\nname = \"p\"\npci = \"03:00.0\"\naddresses = [\"10.0.0.1/8\"]\n",
    )
    .unwrap();
    assert!(cfg.eal.hugepages);
    assert_eq!(cfg.eal.memory_mb, 256);
    assert_eq!(cfg.eal.file_prefix, "sluice");
    assert_eq!(cfg.control.socket, PathBuf::from("/run/sluice/sluice.sock"));
    // The short PCI form is expanded to the device name DPDK uses.
    assert_eq!(cfg.ports[0].device, PortDevice::Pci("0000:03:00.0".into()));
    assert_eq!(cfg.loopback.peers, 4);
}

#[test]
fn dotted_keys_and_implicit_tables_parse() {
    // toml has no span for tables made by dotted keys or by a `[a.b]` header alone;
    // the tree must cope (see tree.rs).
    let no_eal = base_with(
        "[eal]\nhugepages = false\nmemory_mb = 256\nfile_prefix = \"test\"\n",
        "",
    );
    // `eal` and `eal.x` are both implicit here; the error points at the key `x`.
    let err = assert_rejected(
        &format!("eal.x.y = 1\n{no_eal}"),
        1,
        "eal.x",
        "unknown key `x`",
    );
    assert_eq!(err.column, 5);
    let err = assert_rejected(
        &format!("{no_eal}[eal.x]\ny = 1\n"),
        17,
        "eal.x",
        "unknown key `x`",
    );
    assert_eq!(err.column, 6);
    let text = "lcores.management = 0\nlcores.workers = [3]\n\
                [[ports]]\nname = \"p\"\nloopback = true\naddresses = [\"10.0.0.1/8\"]\n\
                [loopback]\n";
    assert_eq!(parse(text).unwrap().lcores.workers, vec![3]);
}

#[test]
fn loopback_false_is_not_a_device_kind() {
    let text = base_with("loopback = true", "loopback = false\nvdev = \"net_null0\"");
    let cfg = parse(&text).unwrap();
    assert_eq!(cfg.ports[0].device, PortDevice::Vdev("net_null0".into()));
}

#[test]
fn slash_31_and_32_may_use_every_address() {
    let text = two_ports(
        "\"198.18.1.1/24\"",
        "\"198.18.1.0/31\", \"198.18.2.255/32\"",
    );
    let cfg = parse(&text).unwrap();
    assert_eq!(cfg.ports[1].addresses.len(), 2);
}

#[test]
fn port_index_finds_ports_by_name() {
    let cfg = parse(&two_ports("lan1", "lan1")).unwrap();
    assert_eq!(cfg.port_index("lan0"), Some(0));
    assert_eq!(cfg.port_index("lan1"), Some(1));
    assert_eq!(cfg.port_index("lan2"), None);
}

// ---- errors: file and TOML level ------------------------------------------

#[test]
fn unreadable_file_is_line_zero() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("missing.toml");
    let err = Config::load(&path).unwrap_err();
    assert_eq!((err.line, err.column), (0, 0));
    assert!(err.message.contains("No such file"), "{err}");
    assert!(err
        .to_string()
        .starts_with(&format!("{}: ", path.display())));
}

#[test]
fn load_reads_a_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ok.toml");
    std::fs::write(&path, BASE).unwrap();
    assert_eq!(Config::load(&path).unwrap().path, path);
}

#[test]
fn toml_syntax_error() {
    let err = assert_rejected(
        &base_with("256", "25 6"),
        3,
        "eal.memory_mb",
        "invalid TOML",
    );
    assert_eq!(err.column, 16);
    // Inside the n-th [[ports]] table the path says which one.
    let text = two_ports("vdev = \"net_null0\"", "vdev = net_null0");
    assert_rejected(&text, 23, "ports[1].vdev", "invalid TOML");
    // A duplicate key is toml's error too.
    assert_rejected(
        &base_with("peers = 4", "peers = 4\npeers = 5"),
        21,
        "loopback.peers",
        "duplicate key",
    );
}

#[test]
fn unknown_key() {
    let err = assert_rejected(
        &base_with("hugepages", "hugepage"),
        2,
        "eal.hugepage",
        "unknown key `hugepage`",
    );
    assert!(
        err.message.contains("hugepages"),
        "lists the valid keys: {err}"
    );
    assert_rejected(
        &format!("{BASE}[extra]\n"),
        21,
        "extra",
        "unknown key `extra`",
    );
    assert_rejected(
        &base_with("mac =", "macaddr ="),
        16,
        "ports[0].macaddr",
        "unknown key",
    );
}

#[test]
fn wrong_type() {
    let err = assert_rejected(
        &base_with("addresses", "rx_desc = \"1024\"\naddresses"),
        17,
        "ports[0].rx_desc",
        "invalid type: string \"1024\", expected an integer",
    );
    assert_eq!(err.column, 11);
    assert_rejected(
        &base_with("= false", "= \"no\""),
        2,
        "eal.hugepages",
        "expected a boolean",
    );
    assert_rejected(
        &base_with("workers = [1]", "workers = 1"),
        8,
        "lcores.workers",
        "expected an array",
    );
    assert_rejected(
        &base_with("workers = [1]", "workers = [\"1\"]"),
        8,
        "lcores.workers[0]",
        "expected an integer",
    );
    assert_rejected(
        &base_with("peers = 4", "peers = 1979-05-27"),
        20,
        "loopback.peers",
        "invalid type: datetime",
    );
    let no_control = base_with("[control]\nsocket = \"/run/sluice/test.sock\"\n", "");
    assert_rejected(
        &format!("control = 5\n{no_control}"),
        1,
        "control",
        "expected a table",
    );
}

#[test]
fn missing_section_or_key() {
    let no_lcores = base_with("[lcores]\nmanagement = 0\nworkers = [1]\n", "");
    assert_rejected(&no_lcores, 1, "lcores", "[lcores] section is required");
    assert_rejected(
        &base_with("workers = [1]\n", ""),
        6,
        "lcores.workers",
        "missing required key `workers`",
    );
    assert_rejected(
        &base_with("name = \"lan0\"\n", ""),
        13,
        "ports[0].name",
        "missing required key `name`",
    );
    assert_rejected(
        &base_with("addresses = [\"198.18.0.1/24\"]\n", ""),
        13,
        "ports[0].addresses",
        "missing required key `addresses`",
    );
    let no_ports = BASE.split("[[ports]]").next().unwrap().to_string();
    assert_rejected(&no_ports, 1, "ports", "at least one [[ports]]");
    assert_rejected(
        &format!("ports = []\n{no_ports}"),
        1,
        "ports",
        "at least one port",
    );
    let single = base_with("[[ports]]", "[ports]");
    assert_rejected(&single, 13, "ports", "[[ports]]");
}

// ---- errors: ports -----------------------------------------------------------

#[test]
fn bad_pci_address() {
    for bad in [
        "0000:03:00",
        "0000:03:20.0",
        "0000:03:00.8",
        "03.00.0",
        "zz:00.0",
    ] {
        let text = base_with("loopback = true", &format!("pci = \"{bad}\""));
        assert_rejected(&text, 15, "ports[0].pci", "is not a PCI address");
    }
}

#[test]
fn vdev_must_start_with_net() {
    let text = base_with("loopback = true", "vdev = \"eth_af_packet0,iface=x\"");
    assert_rejected(&text, 15, "ports[0].vdev", "does not start with \"net_\"");
    let text = base_with("loopback = true", "vdev = \"net_\"");
    assert_rejected(&text, 15, "ports[0].vdev", "no driver name");
}

#[test]
fn exactly_one_device_kind() {
    let two = base_with("loopback = true", "loopback = true\npci = \"0000:03:00.0\"");
    // pci is checked first, so the later key (loopback) is the conflict.
    assert_rejected(&two, 15, "ports[0].loopback", "conflicts with `pci`");
    let none = base_with("loopback = true\n", "");
    assert_rejected(&none, 13, "ports[0]", "no device");
}

#[test]
fn bad_or_multicast_mac() {
    assert_rejected(
        &base_with("02:00:00:00:00:01", "02:00:00:00:00"),
        16,
        "ports[0].mac",
        "is not a MAC address",
    );
    assert_rejected(
        &base_with("02:00:00:00:00:01", "02:00:00:00:00:0g"),
        16,
        "ports[0].mac",
        "is not a MAC address",
    );
    assert_rejected(
        &base_with("02:00:00:00:00:01", "01:00:5e:00:00:01"),
        16,
        "ports[0].mac",
        "multicast",
    );
    assert_rejected(
        &base_with("02:00:00:00:00:01", "00:00:00:00:00:00"),
        16,
        "ports[0].mac",
        "all-zero",
    );
}

#[test]
fn bad_cidr() {
    let text = base_with(
        "\"198.18.0.1/24\"]",
        "\"198.18.0.1/24\", \"198.18.0.300/24\"]",
    );
    let err = assert_rejected(
        &text,
        17,
        "ports[0].addresses[1]",
        "\"198.18.0.300/24\" is not an IPv4 address with prefix (expected a.b.c.d/n)",
    );
    assert_eq!(err.column, 31);
    assert_eq!(
        err.to_string(),
        "test.toml:17:31: ports[0].addresses[1]: \"198.18.0.300/24\" is not an IPv4 address \
         with prefix (expected a.b.c.d/n)"
    );
    assert_rejected(
        &base_with("198.18.0.1/24", "198.18.0.1"),
        17,
        "ports[0].addresses[0]",
        "expected a.b.c.d/n",
    );
}

#[test]
fn prefix_out_of_range() {
    assert_rejected(
        &base_with("/24", "/33"),
        17,
        "ports[0].addresses[0]",
        "prefix length is out of range",
    );
}

#[test]
fn special_addresses_are_rejected() {
    let at = |addr: &str, needle: &str| {
        assert_rejected(
            &base_with("198.18.0.1/24", addr),
            17,
            "ports[0].addresses[0]",
            needle,
        );
    };
    at("0.0.0.0/8", "unspecified");
    at("224.0.0.1/4", "multicast");
    at("255.255.255.255/32", "limited broadcast");
    at("198.18.0.0/24", "network address of 198.18.0.0/24");
}

#[test]
fn subnet_broadcast_address() {
    let text = base_with("198.18.0.1/24", "198.18.0.255/24");
    assert_rejected(
        &text,
        17,
        "ports[0].addresses[0]",
        "broadcast address of 198.18.0.0/24",
    );
}

#[test]
fn address_count() {
    assert_rejected(
        &base_with("[\"198.18.0.1/24\"]", "[]"),
        17,
        "ports[0].addresses",
        "1..=16",
    );
    let many: Vec<String> = (1..=17).map(|i| format!("\"10.0.0.{i}/24\"")).collect();
    let text = base_with("[\"198.18.0.1/24\"]", &format!("[{}]", many.join(", ")));
    assert_rejected(&text, 17, "ports[0].addresses", "1..=16");
}

#[test]
fn ipv6_addresses_come_besides_ipv4_ones() {
    let text = base_with(
        "\"198.18.0.1/24\"]",
        "\"2001:db8:18::1/64\", \"198.18.0.1/24\", \"fe80::1/64\"]",
    );
    let cfg = parse(&text).unwrap();
    let port = &cfg.ports[0];
    assert_eq!(port.addresses.len(), 1);
    assert_eq!(
        port.addresses[0].addr,
        std::net::Ipv4Addr::new(198, 18, 0, 1)
    );
    let v6: Vec<String> = port.addresses6.iter().map(|a| a.to_string()).collect();
    assert_eq!(v6, ["2001:db8:18::1/64", "fe80::1/64"]);

    let at = |addr: &str, field: &str, needle: &str| {
        let text = base_with(
            "\"198.18.0.1/24\"]",
            &format!("\"198.18.0.1/24\", \"{addr}\"]"),
        );
        assert_rejected(&text, 17, field, needle);
    };
    let second = "ports[0].addresses[1]";
    at("2001:db8::1", second, "not an IPv6 address with prefix");
    at("2001:db8::1/129", second, "out of range (0..=128)");
    at("2001:db8::zz/64", second, "not an IPv6 address");
    at("::/0", second, "unspecified");
    at("::1/128", second, "loopback");
    at("ff02::1/16", second, "multicast");
    at("::ffff:198.18.0.9/96", second, "IPv4-mapped");
    at(
        "2001:db8:18::/64",
        second,
        "subnet-router anycast address of 2001:db8:18::/64",
    );
    at("198.18.0.1/24", second, "already used");
    // /127 and /128 have no subnet-router anycast address.
    let text = base_with(
        "\"198.18.0.1/24\"]",
        "\"198.18.0.1/24\", \"2001:db8::/127\", \"2001:db8:1::/128\"]",
    );
    assert_eq!(parse(&text).unwrap().ports[0].addresses6.len(), 2);
}

#[test]
fn a_port_needs_an_ipv4_address_and_at_most_16_of_each() {
    assert_rejected(
        &base_with("\"198.18.0.1/24\"]", "\"2001:db8::1/64\"]"),
        17,
        "ports[0].addresses",
        "0 IPv4 addresses; a port needs 1..=16",
    );
    let many: Vec<String> = (1..=17).map(|i| format!("\"2001:db8::{i}/64\"")).collect();
    let text = base_with(
        "\"198.18.0.1/24\"]",
        &format!("\"198.18.0.1/24\", {}]", many.join(", ")),
    );
    assert_rejected(&text, 17, "ports[0].addresses", "17 IPv6 addresses");
}

#[test]
fn duplicate_ipv6_address_across_ports() {
    let text = two_ports("\"198.18.1.1/24\"", "\"198.18.1.1/24\", \"2001:db8::1/64\"").replacen(
        "\"198.18.0.1/24\"",
        "\"198.18.0.1/24\", \"2001:db8::1/48\"",
        1,
    );
    assert_rejected(
        &text,
        24,
        "ports[1].addresses[1]",
        "address 2001:db8::1 is already used",
    );
}

#[test]
fn duplicate_address_across_ports() {
    let text = two_ports("198.18.1.1/24", "198.18.0.1/16");
    let err = assert_rejected(
        &text,
        24,
        "ports[1].addresses[0]",
        "address 198.18.0.1 is already used",
    );
    assert!(err.message.contains("ports[0].addresses[0]"), "{err}");
    // Within one port too.
    let text = base_with(
        "\"198.18.0.1/24\"]",
        "\"198.18.0.1/24\", \"198.18.0.1/25\"]",
    );
    assert_rejected(&text, 17, "ports[0].addresses[1]", "already used");
}

#[test]
fn duplicate_port_names_and_devices() {
    let err = assert_rejected(
        &two_ports("lan1", "lan0"),
        22,
        "ports[1].name",
        "port name \"lan0\" is already used",
    );
    assert!(err.message.contains("ports[0].name"), "{err}");
    let text = format!(
        "{}{}",
        two_ports("lan1", "lan1"),
        SECOND_PORT.replacen("lan1", "lan2", 1)
    );
    assert_rejected(&text, 27, "ports[2].vdev", "vdev net_null0 is already used");
    assert_rejected(&two_ports("lan1", "LAN1"), 22, "ports[1].name", "only a-z");
    assert_rejected(
        &two_ports("lan1", "a-very-long-port"),
        22,
        "ports[1].name",
        "1..=15",
    );
}

#[test]
fn bad_descriptor_count() {
    let text = |v: &str| base_with("addresses", &format!("tx_desc = {v}\naddresses"));
    assert_rejected(&text("1000"), 17, "ports[0].tx_desc", "not a power of two");
    assert_rejected(
        &text("32"),
        17,
        "ports[0].tx_desc",
        "out of range (64..=4096)",
    );
    assert_rejected(&text("8192"), 17, "ports[0].tx_desc", "out of range");
}

#[test]
fn bad_rss_key() {
    let text = |v: &str| base_with("addresses", &format!("rss_key = \"{v}\"\naddresses"));
    assert_rejected(
        &text(&"6d".repeat(39)),
        17,
        "ports[0].rss_key",
        "exactly 40 or 52 bytes",
    );
    assert_rejected(
        &text(&"6d5".repeat(27)),
        17,
        "ports[0].rss_key",
        "exactly 40 or 52 bytes",
    );
    let non_hex = format!("{}zz", "6d".repeat(39));
    assert_rejected(
        &text(&non_hex),
        17,
        "ports[0].rss_key",
        "not hex: 'z' at position 78",
    );
    let ok = parse(&text(&"6d5a".repeat(26))).unwrap();
    assert_eq!(ok.ports[0].rss_key.as_ref().map(Vec::len), Some(52));
    assert_eq!(ok.ports[0].rss_key.as_ref().unwrap()[..2], [0x6d, 0x5a]);
}

#[test]
fn mtu_range() {
    let text = |v: &str| base_with("addresses", &format!("mtu = {v}\naddresses"));
    assert_rejected(&text("67"), 17, "ports[0].mtu", "out of range (68..=9000)");
    assert_eq!(parse(&text("9000")).unwrap().ports[0].mtu, Some(9000));
    assert_eq!(parse(&text("576")).unwrap().ports[0].mtu, Some(576));
    // IPv6 needs 1280 on every link.
    let dual = |v: &str| {
        base_with(
            "addresses = [\"198.18.0.1/24\"]",
            &format!("mtu = {v}\naddresses = [\"198.18.0.1/24\", \"2001:db8:18::1/64\"]"),
        )
    };
    assert_rejected(
        &dual("1279"),
        17,
        "ports[0].mtu",
        "below IPv6's minimum link MTU of 1280",
    );
    assert_eq!(parse(&dual("1280")).unwrap().ports[0].mtu, Some(1280));
}

// ---- errors: lcores, control, eal ------------------------------------------

#[test]
fn bad_workers() {
    let w = |v: &str| base_with("workers = [1]", &format!("workers = {v}"));
    assert_rejected(&w("[]"), 8, "lcores.workers", "at least one worker");
    assert_rejected(&w("[1, 2, 1]"), 8, "lcores.workers[2]", "listed twice");
    assert_rejected(
        &w("[1, 0]"),
        8,
        "lcores.workers[1]",
        "is the management lcore",
    );
    assert_rejected(
        &w("[128]"),
        8,
        "lcores.workers[0]",
        "out of range (0..=127)",
    );
    let many: Vec<String> = (1..=65).map(|i| i.to_string()).collect();
    assert_rejected(
        &w(&format!("[{}]", many.join(","))),
        8,
        "lcores.workers",
        "at most 64",
    );
    assert_rejected(
        &base_with("management = 0", "management = -1"),
        7,
        "lcores.management",
        "out of range",
    );
}

#[test]
fn bad_socket_path() {
    let s = |v: &str| base_with("/run/sluice/test.sock", v);
    assert_rejected(
        &s("run/sluice.sock"),
        11,
        "control.socket",
        "not an absolute path",
    );
    let long = format!("/run/{}.sock", "x".repeat(100));
    assert_rejected(&s(&long), 11, "control.socket", "shorter than 108");
    assert_rejected(&s("/run/sluice/"), 11, "control.socket", "directory");
}

#[test]
fn bad_file_prefix() {
    let p = |v: &str| base_with("\"test\"", v);
    assert_rejected(&p("\"a/b\""), 4, "eal.file_prefix", "contains '/'");
    assert_rejected(&p("\"\""), 4, "eal.file_prefix", "1..=32");
    assert_rejected(
        &p(&format!("\"{}\"", "x".repeat(33))),
        4,
        "eal.file_prefix",
        "1..=32",
    );
}

#[test]
fn memory_too_small_without_hugepages() {
    assert_rejected(
        &base_with("256", "32"),
        3,
        "eal.memory_mb",
        "too small without hugepages",
    );
    // With hugepages a small reservation is the EAL's business.
    let ok = base_with("256", "32").replacen("hugepages = false", "hugepages = true", 1);
    assert_eq!(parse(&ok).unwrap().eal.memory_mb, 32);
    assert_rejected(&base_with("256", "0"), 3, "eal.memory_mb", "out of range");
}

// ---- errors: loopback --------------------------------------------------------

#[test]
fn loopback_port_needs_loopback_section() {
    let text = base_with("[loopback]\npeers = 4\n", "");
    assert_rejected(&text, 15, "ports[0].loopback", "needs a [loopback] section");
    // Without a loopback port the section is optional, but still checked.
    let text = base_with("loopback = true", "vdev = \"net_null0\"");
    parse(&text).unwrap();
    let text = text.replacen("peers = 4", "peers = 0", 1);
    assert_rejected(&text, 20, "loopback.peers", "out of range");
}

#[test]
fn only_one_loopback_port() {
    let text = two_ports("vdev = \"net_null0\"", "loopback = true");
    let err = assert_rejected(
        &text,
        23,
        "ports[1].loopback",
        "only one port may be a loopback port, and ports[0].loopback already is",
    );
    assert!(err.message.contains("loopback"), "{err}");
}

#[test]
fn peers_out_of_range() {
    let p = |v: &str| base_with("peers = 4", &format!("peers = {v}"));
    assert_rejected(&p("0"), 20, "loopback.peers", "out of range (1..=250)");
    assert_rejected(&p("251"), 20, "loopback.peers", "out of range (1..=250)");
    // 250 peers fit in a /24 after .1; they would not fit in a /30.
    parse(&p("250")).unwrap();
    let small = p("4").replacen("/24", "/30", 1);
    assert_rejected(&small, 20, "loopback.peers", "do not fit in 198.18.0.1/30");
    // Peers may not collide with the port's own addresses.
    let clash = base_with(
        "\"198.18.0.1/24\"]",
        "\"198.18.0.1/24\", \"198.18.0.3/24\"]",
    );
    assert_rejected(&clash, 20, "loopback.peers", "198.18.0.3");
}

#[test]
fn loopback_intervals() {
    let t = |kv: &str| base_with("peers = 4", &format!("peers = 4\n{kv}"));
    assert_rejected(
        &t("stats_interval_ms = 99"),
        21,
        "loopback.stats_interval_ms",
        "out of range",
    );
    assert_rejected(
        &t("ping_interval_ms = 0"),
        21,
        "loopback.ping_interval_ms",
        "out of range",
    );
    assert_eq!(
        parse(&t("garbage_every = 0"))
            .unwrap()
            .loopback
            .garbage_every,
        0
    );
}

// ---- examples and the EAL argv -------------------------------------------------

#[test]
fn example_loopback() {
    let cfg = example("loopback.toml");
    assert!(!cfg.eal.hugepages);
    assert_eq!(cfg.eal.memory_mb, 256);
    assert_eq!(cfg.eal.file_prefix, "sluice-loopback");
    assert_eq!(
        (cfg.lcores.management, cfg.lcores.workers.clone()),
        (0, vec![1])
    );
    assert_eq!(
        cfg.control.socket,
        PathBuf::from("/run/sluice/loopback.sock")
    );
    assert_eq!(cfg.ports.len(), 1);
    let port = &cfg.ports[0];
    assert_eq!(port.name, "lan0");
    assert_eq!(port.device, PortDevice::Loopback);
    assert_eq!(port.mac, Some([0x02, 0x53, 0x4c, 0, 0, 1]));
    assert_eq!(
        port.addresses,
        vec!["198.18.0.1/24".parse::<Ipv4Cidr>().unwrap()]
    );
    assert_eq!(cfg.loopback.peers, 4);
    assert_eq!(cfg.timeouts, TimeoutsConfig::default());
    assert_eq!(cfg.sessions.capacity, 65536);
    assert_eq!(cfg.services.len(), 1);
    let svc = &cfg.services[0];
    assert_eq!(svc.key.to_string(), "TCP 198.18.1.1:80");
    assert_eq!(svc.scheduler, SchedulerKind::Rr);
    assert_eq!(svc.persistence, None);
    let servers: Vec<_> = svc
        .real_servers
        .iter()
        .map(|r| (r.ip.to_string(), r.port, r.weight, r.mode))
        .collect();
    assert_eq!(
        servers,
        vec![
            ("198.18.0.2".to_string(), 8080, 1, ForwardMode::Nat),
            ("198.18.0.3".to_string(), 8080, 2, ForwardMode::Nat),
        ]
    );
    assert_eq!(
        cfg.eal_args(),
        strings(&[
            "sluice",
            "-l",
            "0,1",
            "--main-lcore",
            "0",
            "--file-prefix",
            "sluice-loopback",
            "--no-huge",
            "-m",
            "256",
            "--no-shconf",
            "--no-pci",
        ])
    );
}

#[test]
fn example_netns() {
    let cfg = example("netns.toml");
    assert_eq!(cfg.control.socket, PathBuf::from("/run/sluice/netns.sock"));
    assert_eq!(
        cfg.ports[0].device,
        PortDevice::Vdev("net_af_packet0,iface=sl-lb0".into())
    );
    assert_eq!(cfg.ports[0].addresses[0].addr, Ipv4Addr::new(198, 18, 0, 1));
    assert_eq!(cfg.timeouts, TimeoutsConfig::default());
    assert_eq!(cfg.sessions, SessionsConfig::default());
    assert_eq!(cfg.services.len(), 1);
    let svc = &cfg.services[0];
    assert_eq!(svc.key.to_string(), "TCP 198.18.0.100:80");
    assert_eq!(svc.scheduler, SchedulerKind::Wrr);
    assert_eq!(
        svc.persistence,
        Some(Persistence {
            netmask: Ipv4Addr::BROADCAST,
            ..Persistence::new(300)
        })
    );
    assert!(svc
        .real_servers
        .iter()
        .all(|r| r.mode == ForwardMode::Dr && r.port == 80));
    assert_eq!(
        svc.real_servers
            .iter()
            .map(|r| r.weight)
            .collect::<Vec<_>>(),
        vec![1, 3]
    );
    assert_eq!(
        cfg.eal_args(),
        strings(&[
            "sluice",
            "-l",
            "0,1",
            "--main-lcore",
            "0",
            "--file-prefix",
            "sluice-netns",
            "--no-huge",
            "-m",
            "256",
            "--no-shconf",
            "--no-pci",
            "--vdev",
            "net_af_packet0,iface=sl-lb0",
        ])
    );
}

#[test]
fn example_baremetal() {
    let cfg = example("baremetal.toml");
    assert!(cfg.eal.hugepages);
    assert_eq!(cfg.eal.memory_mb, 2048);
    assert_eq!(cfg.lcores.workers.len(), 2);
    assert!(matches!(cfg.ports[0].device, PortDevice::Pci(_)));
    assert_eq!(cfg.ports[0].rss_key.as_ref().map(Vec::len), Some(40));
    assert_eq!(
        (
            cfg.timeouts.tcp_s,
            cfg.timeouts.syn_recv_s,
            cfg.timeouts.close_s
        ),
        (900, 30, 10)
    );
    assert_eq!(cfg.sessions.capacity, 2_097_152);
    let svc = &cfg.services[0];
    assert_eq!(svc.key.to_string(), "TCP 203.0.113.80:443");
    assert_eq!(
        svc.persistence,
        Some(Persistence {
            netmask: Ipv4Addr::new(255, 255, 255, 0),
            ..Persistence::new(600)
        })
    );
    assert_eq!(svc.real_servers.len(), 3);
    assert!(svc
        .real_servers
        .iter()
        .all(|r| r.mode == ForwardMode::FullNat && r.port == 8443));
    assert!(!svc.local_addresses.is_empty());
    assert_eq!(
        (svc.real_servers[0].upper, svc.real_servers[0].lower),
        (20000, 15000)
    );
    assert_eq!(svc.real_servers[2].weight, 0);
    assert_eq!(
        cfg.eal_args(),
        strings(&[
            "sluice",
            "-l",
            "0,1,2",
            "--main-lcore",
            "0",
            "--file-prefix",
            "sluice",
            "-m",
            "2048",
            "--huge-unlink=always",
            "-a",
            "0000:03:00.0",
            "--log-level=lib.eal:notice",
        ])
    );
    // Options that exclude unlinking, given in extra_args, leave it out.
    for extra in [
        "--single-file-segments",
        "--in-memory",
        "--huge-unlink=never",
    ] {
        let mut c = cfg.clone();
        c.eal.extra_args = vec![extra.into()];
        let args = c.eal_args();
        assert!(
            !args.contains(&"--huge-unlink=always".to_string()),
            "{args:?}"
        );
        assert_eq!(args.last().map(String::as_str), Some(extra));
    }
}

#[test]
fn extra_args_refuse_the_memory_options_sluice_passes() {
    let text = |v: &str| base_with("[eal]\n", &format!("[eal]\nextra_args = {v}\n"));
    for arg in ["--socket-mem=1024", "--socket-mem", "-m", "-m512"] {
        assert_rejected(
            &text(&format!("[\"--log-level=lib.eal:notice\", \"{arg}\"]")),
            2,
            "eal.extra_args",
            "Sluice passes -m itself",
        );
    }
    let cfg = parse(&text("[\"--iova-mode=va\", \"--match-allocations\"]")).unwrap();
    assert_eq!(
        cfg.eal.extra_args,
        ["--iova-mode=va", "--match-allocations"]
    );
}

// ---- timeouts, sessions, services: valid input ---------------------------------

#[test]
fn new_sections_default_when_absent() {
    let cfg = parse(BASE).unwrap();
    let t = &cfg.timeouts;
    assert_eq!(
        [
            t.tcp_s,
            t.tcpfin_s,
            t.udp_s,
            t.syn_recv_s,
            t.syn_sent_s,
            t.time_wait_s,
            t.close_s,
            t.close_wait_s,
            t.last_ack_s
        ],
        [900, 120, 300, 60, 120, 120, 10, 60, 30]
    );
    assert_eq!(cfg.timeouts, TimeoutsConfig::default());
    assert_eq!(cfg.sessions.capacity, 1_048_576);
    assert_eq!(cfg.sessions.tick_ms, 100);
    assert!(cfg.services.is_empty());
    // Empty sections are the same as absent ones.
    let cfg = parse(&format!("{BASE}[timeouts]\n[sessions]\n")).unwrap();
    assert_eq!(cfg.timeouts, TimeoutsConfig::default());
    assert_eq!(cfg.sessions, SessionsConfig::default());
    assert!(parse(&format!("services = []\n{BASE}"))
        .unwrap()
        .services
        .is_empty());
}

#[test]
fn service_defaults() {
    let text = service_with("scheduler = \"rr\"\n", "");
    let cfg = parse(&text).unwrap();
    assert_eq!(cfg.services.len(), 1);
    let svc = &cfg.services[0];
    assert_eq!(
        svc.key,
        ServiceKey {
            proto: Protocol::Tcp,
            vip: Ipv4Addr::new(198, 18, 1, 1).into(),
            port: 80
        }
    );
    assert_eq!(svc.line, 21);
    assert_eq!(svc.scheduler, SchedulerKind::Wlc);
    assert_eq!(svc.persistence, None);
    assert_eq!(
        svc.real_servers[0],
        RealServerConfig {
            ip: Ipv4Addr::new(198, 18, 0, 11).into(),
            port: 80,
            weight: 1,
            mode: ForwardMode::Dr,
            health: Default::default(),
            upper: 0,
            lower: 0,
        }
    );
    assert_eq!(svc.real_servers[1].port, 80);
    assert!(svc.local_addresses.is_empty());
    assert!(!svc.toa);
    assert_eq!(cfg.service(&svc.key).map(|s| s.line), Some(21));
    // A service without real servers is allowed (ipvsadm -A alone).
    let bare = format!("{BASE}[[services]]\nproto = \"udp\"\nvip = \"198.18.1.2\"\nport = 53\n");
    let cfg = parse(&bare).unwrap();
    assert!(cfg.services[0].real_servers.is_empty());
    assert_eq!(cfg.services[0].key.proto, Protocol::Udp);
}

#[test]
fn full_valid_example() {
    let text = format!(
        r#"{BASE}
[timeouts]
tcp = 7200
tcpfin = 60
udp = 30
syn_recv = 30
syn_sent = 20
time_wait = 90
close = 5
close_wait = 45
last_ack = 15

[sessions]
capacity = 100000
tick_ms = 10

[[services]]
proto = "tcp"
vip = "198.18.1.1"
port = 443
scheduler = "wrr"
persistence_timeout = 300
persistence_netmask = "255.255.255.0"
local_addresses = ["198.18.0.50", "198.18.0.51"]
toa = true

  [[services.real_servers]]
  ip = "10.0.0.11"
  port = 8443
  weight = 3
  mode = "nat"
  upper = 1000
  lower = 500

  [[services.real_servers]]
  ip = "10.0.0.12"
  port = 9443
  weight = 0
  mode = "fullnat"

  [[services.real_servers]]
  ip = "10.0.0.11"
  port = 443
  mode = "tun"

[[services]]
proto = "udp"
vip = "198.18.1.1"
port = 443
persistence_timeout = 60

  [[services.real_servers]]
  ip = "10.0.0.21"
  mode = "dr"
  upper = 10
  lower = 10

[[services]]
proto = "tcp"
vip = "198.18.1.1"
port = 80
"#
    );
    let cfg = parse(&text).unwrap();
    let t = &cfg.timeouts;
    assert_eq!(
        [
            t.tcp_s,
            t.tcpfin_s,
            t.udp_s,
            t.syn_recv_s,
            t.syn_sent_s,
            t.time_wait_s,
            t.close_s,
            t.close_wait_s,
            t.last_ack_s
        ],
        [7200, 60, 30, 30, 20, 90, 5, 45, 15]
    );
    assert_eq!(
        cfg.sessions,
        SessionsConfig {
            capacity: 100_000,
            tick_ms: 10,
            local_port_first: 1024,
            local_port_last: 65535,
            server_time_wait_s: 60,
            rewrite_timestamps: true,
            icmp_error_limit: crate::service::admission::DEFAULT_ICMP_ERROR_LIMIT,
            neighbours: 4096,
            persistence_templates: 1 << 18,
        }
    );
    assert_eq!(cfg.services.len(), 3);
    let https = &cfg.services[0];
    assert_eq!(https.key.to_string(), "TCP 198.18.1.1:443");
    assert_eq!(https.line, 37);
    assert_eq!(https.scheduler, SchedulerKind::Wrr);
    assert_eq!(
        https.persistence,
        Some(Persistence {
            netmask: Ipv4Addr::new(255, 255, 255, 0),
            ..Persistence::new(300)
        })
    );
    assert_eq!(
        https.real_servers,
        vec![
            RealServerConfig {
                ip: Ipv4Addr::new(10, 0, 0, 11).into(),
                port: 8443,
                weight: 3,
                mode: ForwardMode::Nat,
                health: Default::default(),
                upper: 1000,
                lower: 500,
            },
            RealServerConfig {
                ip: Ipv4Addr::new(10, 0, 0, 12).into(),
                port: 9443,
                weight: 0,
                mode: ForwardMode::FullNat,
                health: Default::default(),
                upper: 0,
                lower: 0,
            },
            RealServerConfig {
                ip: Ipv4Addr::new(10, 0, 0, 11).into(),
                port: 443,
                weight: 1,
                mode: ForwardMode::Tun,
                health: Default::default(),
                upper: 0,
                lower: 0,
            },
        ]
    );
    // Same VIP and port, other protocol: a different service.
    let dns = &cfg.services[1];
    assert_eq!(dns.key.proto, Protocol::Udp);
    assert_eq!(dns.line, 66);
    assert_eq!(
        dns.persistence,
        Some(Persistence {
            netmask: Ipv4Addr::BROADCAST,
            ..Persistence::new(60)
        })
    );
    assert_eq!(
        (dns.real_servers[0].upper, dns.real_servers[0].lower),
        (10, 10)
    );
    assert_eq!(cfg.services[2].line, 78);
    assert!(cfg.services[2].real_servers.is_empty());
    assert_eq!(
        https.local_addresses,
        vec![Ipv4Addr::new(198, 18, 0, 50), Ipv4Addr::new(198, 18, 0, 51)]
    );
    assert!(https.toa);
    assert!(dns.local_addresses.is_empty() && !dns.toa);
}

#[test]
fn inline_services_parse() {
    let text = format!(
        "{BASE}services = [\n  {{ proto = \"udp\", vip = \"198.18.1.9\", port = 53, \
         real_servers = [{{ ip = \"198.18.0.20\", port = 5353, mode = \"nat\" }}] }},\n]\n"
    );
    // `services = [...]` after [loopback] belongs to [loopback]: put it first.
    assert_rejected(&text, 21, "loopback.services", "unknown key `services`");
    let text = format!(
        "services = [\n  {{ proto = \"udp\", vip = \"198.18.1.9\", port = 53, \
         real_servers = [{{ ip = \"198.18.0.20\", port = 5353, mode = \"nat\" }}] }},\n]\n{BASE}"
    );
    let cfg = parse(&text).unwrap();
    assert_eq!(cfg.services[0].line, 2);
    assert_eq!(cfg.services[0].real_servers[0].port, 5353);
    assert_rejected(
        &text.replacen("5353", "0", 1),
        2,
        "services[0].real_servers[0].port",
        "out of range (1..=65535)",
    );
}

#[test]
fn timeouts_partial_and_out_of_range() {
    let t = |kv: &str| format!("{BASE}[timeouts]\n{kv}\n");
    let cfg = parse(&t("tcp = 60\nclose = 2147483")).unwrap();
    assert_eq!((cfg.timeouts.tcp_s, cfg.timeouts.close_s), (60, 2_147_483));
    assert_eq!(cfg.timeouts.tcpfin_s, 120);
    assert_eq!(cfg.timeouts.udp_s, 300);
    assert_rejected(
        &t("tcp = 0"),
        22,
        "timeouts.tcp",
        "out of range (1..=2147483)",
    );
    assert_rejected(
        &t("udp = 300\nlast_ack = 2147484"),
        23,
        "timeouts.last_ack",
        "out of range (1..=2147483)",
    );
    assert_rejected(
        &t("syn_recv = \"60s\""),
        22,
        "timeouts.syn_recv",
        "expected an integer",
    );
    let err = assert_rejected(
        &t("fin_wait = 120"),
        22,
        "timeouts.fin_wait",
        "unknown key `fin_wait`",
    );
    assert!(err.message.contains("tcpfin, udp, syn_recv"), "{err}");
}

#[test]
fn sessions_out_of_range() {
    let s = |kv: &str| format!("{BASE}[sessions]\n{kv}\n");
    // Not a power of two is fine.
    assert_eq!(
        parse(&s("capacity = 3000")).unwrap().sessions.capacity,
        3000
    );
    assert_eq!(parse(&s("tick_ms = 1000")).unwrap().sessions.tick_ms, 1000);
    assert_rejected(
        &s("capacity = 1023"),
        22,
        "sessions.capacity",
        "out of range (1024..=67108864)",
    );
    assert_rejected(
        &s("capacity = 67108865"),
        22,
        "sessions.capacity",
        "out of range (1024..=67108864)",
    );
    assert_rejected(
        &s("tick_ms = 9"),
        22,
        "sessions.tick_ms",
        "out of range (10..=1000)",
    );
    assert_rejected(
        &s("tick_ms = 1001"),
        22,
        "sessions.tick_ms",
        "out of range (10..=1000)",
    );
}

// ---- errors: services --------------------------------------------------------

#[test]
fn duplicate_service() {
    let err = assert_rejected(
        &two_services("scheduler = \"rr\"", "scheduler = \"wrr\""),
        34,
        "services[1]",
        "service TCP 198.18.1.1:80 is defined twice",
    );
    assert!(err.message.contains("services[0]"), "{err}");
    assert_eq!(err.column, 1);
    // Another port, VIP or protocol is another service.
    parse(&two_services("port = 80", "port = 81")).unwrap();
    parse(&two_services("198.18.1.1", "198.18.1.2")).unwrap();
    parse(&two_services("\"tcp\"", "\"udp\"")).unwrap();
}

#[test]
fn duplicate_real_server() {
    let text = service_with("198.18.0.12", "198.18.0.11");
    let err = assert_rejected(
        &text,
        31,
        "services[0].real_servers[1]",
        "real server 198.18.0.11:80 is already in this service",
    );
    assert!(err.message.contains("services[0].real_servers[0]"), "{err}");
    // Same address, another port (NAT): a different real server.
    let text = service_with(
        "198.18.0.12\"\nmode = \"dr\"",
        "198.18.0.11\"\nmode = \"nat\"\nport = 81",
    );
    assert_eq!(parse(&text).unwrap().services[0].real_servers[1].port, 81);
    // The same real server in two services is fine.
    parse(&two_services("port = 80", "port = 81")).unwrap();
}

/// A real server at a loopback address is refused where it stands: Sluice has no
/// local delivery.
#[test]
fn loopback_real_server() {
    let text = service_with("198.18.0.11", "127.0.0.1");
    assert_rejected(
        &text,
        27,
        "services[0].real_servers[0]",
        "invalid real server address 127.0.0.1: a loopback address",
    );
}

#[test]
fn vip_special_addresses() {
    let at = |vip: &str, needle: &str| {
        assert_rejected(
            &service_with("198.18.1.1", vip),
            23,
            "services[0].vip",
            needle,
        );
    };
    at("0.0.0.0", "VIP 0.0.0.0 is the unspecified address");
    at("224.0.0.1", "VIP 224.0.0.1 is a multicast address");
    at("239.255.255.250", "multicast");
    at("255.255.255.255", "limited broadcast");
    at(
        "198.18.1.1/32",
        "is not an IP address (expected a.b.c.d or an IPv6 address",
    );
    at("198.18.1", "is not an IP address");
    at("ff02::1", "VIP ff02::1 is a multicast address");
    at("::", "VIP :: is the unspecified address");
    assert_rejected(
        &service_with("vip = \"198.18.1.1\"", "vip = 3323070721"),
        23,
        "services[0].vip",
        "expected a string",
    );
}

#[test]
fn vip_is_a_port_address() {
    let err = assert_rejected(
        &service_with("198.18.1.1", "198.18.0.1"),
        23,
        "services[0].vip",
        "VIP 198.18.0.1 is one of the appliance's own addresses",
    );
    assert!(err.message.contains("ports[0].addresses[0]"), "{err}");
    // Any port's address, not just the first: lan1 has 198.18.1.1, SERVICE's VIP.
    let text = format!("{}{SERVICE}", two_ports("lan1", "lan1"));
    assert_rejected(&text, 27, "services[0].vip", "ports[1].addresses[0]");
    // Real servers cannot be the appliance either.
    assert_rejected(
        &service_with("198.18.0.11", "198.18.0.1"),
        28,
        "services[0].real_servers[0].ip",
        "real server 198.18.0.1 is one of the appliance's own addresses (ports[0].addresses[0])",
    );
    assert_rejected(
        &service_with("198.18.0.11", "255.255.255.255"),
        28,
        "services[0].real_servers[0].ip",
        "real server 255.255.255.255 is the limited broadcast address",
    );
}

#[test]
fn real_server_port_only_changes_with_nat() {
    // dr written out.
    let err = assert_rejected(
        &service_with("mode = \"dr\"", "mode = \"dr\"\nport = 8080"),
        34,
        "services[0].real_servers[1].port",
        "port 8080 differs from the service port 80, but mode dr keeps the destination port",
    );
    assert!(err.message.contains("only nat and fullnat"), "{err}");
    // dr by default.
    assert_rejected(
        &service_with("weight = 1", "weight = 1\nport = 8080"),
        30,
        "services[0].real_servers[0].port",
        "mode dr (the default) keeps the destination port",
    );
    assert_rejected(
        &service_with("mode = \"dr\"", "mode = \"tun\"\nport = 8080"),
        34,
        "services[0].real_servers[1].port",
        "mode tun keeps",
    );
    // The service port written out is fine with any mode.
    parse(&service_with("mode = \"dr\"", "mode = \"tun\"\nport = 80")).unwrap();
    for mode in ["nat", "fullnat"] {
        let text = service_with("mode = \"dr\"", &format!("mode = \"{mode}\"\nport = 8080"))
            .replacen(
                "port = 80\n",
                "port = 80\nlocal_addresses = [\"198.18.0.50\"]\n",
                1,
            );
        assert_eq!(parse(&text).unwrap().services[0].real_servers[1].port, 8080);
    }
}

#[test]
fn unknown_scheduler() {
    let err = assert_rejected(
        &service_with("\"rr\"", "\"lcx\""),
        25,
        "services[0].scheduler",
        "unknown scheduler \"lcx\" (known: ",
    );
    for kind in SchedulerKind::ALL {
        assert!(err.message.contains(kind.name()), "{err}");
    }
}

#[test]
fn unknown_forward_mode() {
    let err = assert_rejected(
        &service_with("\"dr\"", "\"masq\""),
        33,
        "services[0].real_servers[1].mode",
        "unknown forwarding mode \"masq\" (known: ",
    );
    for mode in ForwardMode::ALL {
        assert!(err.message.contains(mode.name()), "{err}");
    }
    // Names are lowercase, as in the docs.
    assert_rejected(
        &service_with("\"dr\"", "\"DR\""),
        33,
        "services[0].real_servers[1].mode",
        "unknown forwarding mode",
    );
}

#[test]
fn unknown_protocol() {
    assert_rejected(
        &service_with("\"tcp\"", "\"sctp\""),
        22,
        "services[0].proto",
        "unknown protocol \"sctp\" (known: tcp, udp)",
    );
    assert_rejected(
        &service_with("\"tcp\"", "\"TCP\""),
        22,
        "services[0].proto",
        "unknown protocol",
    );
}

#[test]
fn netmask_without_persistence_timeout() {
    let text = service_with(
        "scheduler = \"rr\"",
        "scheduler = \"rr\"\npersistence_netmask = \"255.255.255.0\"",
    );
    assert_rejected(
        &text,
        26,
        "services[0].persistence_netmask",
        "set `persistence_timeout` too",
    );
    let ok = text.replacen("port = 80", "port = 80\npersistence_timeout = 2678400", 1);
    let cfg = parse(&ok).unwrap();
    assert_eq!(
        cfg.services[0].persistence,
        Some(Persistence {
            netmask: Ipv4Addr::new(255, 255, 255, 0),
            ..Persistence::new(2_678_400)
        })
    );
}

#[test]
fn bad_persistence() {
    let p = |kv: &str| service_with("scheduler = \"rr\"", &format!("scheduler = \"rr\"\n{kv}"));
    assert_rejected(
        &p("persistence_timeout = 0"),
        26,
        "services[0].persistence_timeout",
        "out of range (1..=2678400)",
    );
    assert_rejected(
        &p("persistence_timeout = 2678401"),
        26,
        "services[0].persistence_timeout",
        "out of range (1..=2678400)",
    );
    let mask = |m: &str| {
        p(&format!(
            "persistence_timeout = 60\npersistence_netmask = \"{m}\""
        ))
    };
    for bad in ["255.0.255.0", "0.255.255.255", "255.255.255.1"] {
        assert_rejected(
            &mask(bad),
            27,
            "services[0].persistence_netmask",
            "is not a contiguous netmask",
        );
    }
    assert_rejected(
        &mask("255.255.255.0/24"),
        27,
        "services[0].persistence_netmask",
        "is not a netmask",
    );
    for good in ["0.0.0.0", "255.255.128.0", "255.255.255.255"] {
        let cfg = parse(&mask(good)).unwrap();
        assert_eq!(
            cfg.services[0].persistence.unwrap().netmask.to_string(),
            good
        );
    }
}

#[test]
fn service_number_ranges() {
    assert_rejected(
        &service_with("port = 80", "port = 0"),
        24,
        "services[0].port",
        "out of range (1..=65535)",
    );
    assert_rejected(
        &service_with("port = 80", "port = 65536"),
        24,
        "services[0].port",
        "out of range (1..=65535)",
    );
    assert_rejected(
        &service_with("weight = 1", "weight = 65536"),
        29,
        "services[0].real_servers[0].weight",
        "out of range (0..=65535)",
    );
    assert_rejected(
        &service_with("weight = 1", "weight = -1"),
        29,
        "services[0].real_servers[0].weight",
        "out of range",
    );
    let drained = parse(&service_with("weight = 1", "weight = 0")).unwrap();
    assert_eq!(drained.services[0].real_servers[0].weight, 0);
    assert_rejected(
        &service_with("weight = 1", "upper = -1"),
        29,
        "services[0].real_servers[0].upper",
        "out of range (0..=2147483647)",
    );
    // ipvsadm's INT_MAX: a larger threshold would make an `-S` that its restore refuses.
    assert_rejected(
        &service_with("weight = 1", "lower = 2147483648"),
        29,
        "services[0].real_servers[0].lower",
        "out of range (0..=2147483647)",
    );
}

#[test]
fn lower_threshold_above_upper() {
    assert_rejected(
        &service_with("weight = 1", "upper = 100\nlower = 101"),
        30,
        "services[0].real_servers[0].lower",
        "101 is above the upper threshold 100",
    );
    // As IPVS (and `sluicectl -a`), also without an upper threshold.
    assert_rejected(
        &service_with("weight = 1", "lower = 101"),
        29,
        "services[0].real_servers[0].lower",
        "101 is above the upper threshold 0",
    );
}

#[test]
fn missing_service_keys() {
    for (key, line) in [("proto", 22), ("vip", 23), ("port", 24)] {
        let line_text = SERVICE.lines().nth(line - 21).unwrap();
        assert!(line_text.starts_with(key));
        let text = service_with(&format!("{line_text}\n"), "");
        assert_rejected(
            &text,
            21,
            &format!("services[0].{key}"),
            &format!("missing required key `{key}`"),
        );
    }
    assert_rejected(
        &service_with("ip = \"198.18.0.12\"\n", ""),
        31,
        "services[0].real_servers[1].ip",
        "missing required key `ip`",
    );
}

#[test]
fn services_unknown_keys_and_shapes() {
    let err = assert_rejected(
        &service_with("scheduler", "sched"),
        25,
        "services[0].sched",
        "unknown key `sched`",
    );
    assert!(err.message.contains("persistence_netmask"), "{err}");
    assert_rejected(
        &service_with("weight", "wieght"),
        29,
        "services[0].real_servers[0].wieght",
        "unknown key `wieght`",
    );
    assert_rejected(
        &service_with("[[services]]", "[services]"),
        21,
        "services",
        "write each service as a [[services]] table",
    );
    let single_rs = format!(
        "{BASE}[[services]]\nproto = \"tcp\"\nvip = \"198.18.1.1\"\nport = 80\n\
         [services.real_servers]\nip = \"198.18.0.11\"\n"
    );
    assert_rejected(
        &single_rs,
        25,
        "services[0].real_servers",
        "write each real server as a [[services.real_servers]] table",
    );
    assert_rejected(
        &format!("services = [1]\n{BASE}"),
        1,
        "services[0]",
        "expected a table",
    );
    // A syntax error inside a nested array of tables names the table.
    assert_rejected(
        &service_with("weight = 1", "weight = 1 1"),
        29,
        "services[0].real_servers[0].weight",
        "invalid TOML",
    );
}

// ---- FullNAT local addresses and TOA ----------------------------------------------

/// BASE plus SERVICE with `kv` after the scheduler line (line 26), and the second real
/// server switched to fullnat (line 34 after the insertion).
fn fullnat_service(kv: &str) -> String {
    service_with("scheduler = \"rr\"", &format!("scheduler = \"rr\"\n{kv}")).replacen(
        "mode = \"dr\"",
        "mode = \"fullnat\"",
        1,
    )
}

#[test]
fn local_addresses_and_toa_parse() {
    let cfg = parse(&fullnat_service(
        "local_addresses = [\"198.18.0.50\", \"10.9.0.1\", \"198.18.0.49\"]\ntoa = true",
    ))
    .unwrap();
    let svc = &cfg.services[0];
    // File order is kept.
    assert_eq!(
        svc.local_addresses,
        vec![
            Ipv4Addr::new(198, 18, 0, 50),
            Ipv4Addr::new(10, 9, 0, 1),
            Ipv4Addr::new(198, 18, 0, 49)
        ]
    );
    assert!(svc.toa);
    assert_eq!(svc.real_servers[1].mode, ForwardMode::FullNat);
    // toa = false written out, and local addresses without any fullnat server.
    let text = service_with(
        "scheduler = \"rr\"",
        "scheduler = \"rr\"\nlocal_addresses = [\"198.18.0.50\"]\ntoa = false",
    );
    let svc = &parse(&text).unwrap().services[0];
    assert_eq!(svc.local_addresses, vec![Ipv4Addr::new(198, 18, 0, 50)]);
    assert!(!svc.toa);
    // Two services may share a local address, as in DPVS.
    let lips = "port = 80\nlocal_addresses = [\"198.18.0.50\"]";
    let text = format!(
        "{BASE}{}{}",
        SERVICE.replacen("port = 80", lips, 1),
        SERVICE
            .replacen("port = 80", lips, 1)
            .replacen("80", "81", 1)
    );
    let cfg = parse(&text).unwrap();
    assert_eq!(cfg.services[1].key.port, 81);
    assert_eq!(
        cfg.services[1].local_addresses,
        cfg.services[0].local_addresses
    );
    // Up to 64.
    let many: Vec<String> = (1..=64).map(|i| format!("\"198.18.2.{i}\"")).collect();
    let text = fullnat_service(&format!("local_addresses = [{}]", many.join(", ")));
    assert_eq!(parse(&text).unwrap().services[0].local_addresses.len(), 64);
}

#[test]
fn fullnat_needs_a_local_address() {
    let text = service_with("mode = \"dr\"", "mode = \"fullnat\"");
    let err = assert_rejected(
        &text,
        21,
        "services[0].local_addresses",
        "missing key `local_addresses`: real server 198.18.0.12:80 (services[0].real_servers[1]) uses mode fullnat",
    );
    assert!(err.message.contains("at least one local address"), "{err}");
    assert_eq!(err.column, 1);
    assert_rejected(
        &fullnat_service("local_addresses = []"),
        26,
        "services[0].local_addresses",
        "no local addresses, but real server 198.18.0.12:80",
    );
    // Only fullnat needs one.
    for mode in ["nat", "tun", "dr"] {
        parse(&service_with(
            "mode = \"dr\"",
            &format!("mode = \"{mode}\""),
        ))
        .unwrap();
    }
    // The first fullnat server is named.
    let text = fullnat_service("").replacen("weight = 1", "weight = 1\nmode = \"fullnat\"", 1);
    assert_rejected(
        &text,
        21,
        "services[0].local_addresses",
        "real server 198.18.0.11:80 (services[0].real_servers[0])",
    );
}

#[test]
fn bad_local_addresses() {
    let at = |lips: &str, field: &str, needle: &str| {
        assert_rejected(
            &fullnat_service(&format!("local_addresses = {lips}")),
            26,
            field,
            needle,
        )
    };
    at(
        "[\"198.18.0.300\"]",
        "services[0].local_addresses[0]",
        "\"198.18.0.300\" is not an IP address (expected a.b.c.d or an IPv6 address, without a prefix)",
    );
    at(
        "[\"198.18.0.50\", \"198.18.0.51/32\"]",
        "services[0].local_addresses[1]",
        "is not an IP address",
    );
    at(
        "[\"0.0.0.0\"]",
        "services[0].local_addresses[0]",
        "local address 0.0.0.0 is the unspecified address",
    );
    at(
        "[\"224.0.0.5\"]",
        "services[0].local_addresses[0]",
        "local address 224.0.0.5 is a multicast address",
    );
    at(
        "[\"255.255.255.255\"]",
        "services[0].local_addresses[0]",
        "limited broadcast",
    );
    at(
        "[\"127.0.0.2\"]",
        "services[0].local_addresses[0]",
        "local address 127.0.0.2 is a loopback address",
    );
    at(
        "[1]",
        "services[0].local_addresses[0]",
        "invalid type: integer `1`, expected a string",
    );
    at(
        "\"198.18.0.50\"",
        "services[0].local_addresses",
        "expected an array",
    );
    let err = at(
        "[\"198.18.0.50\", \"198.18.0.51\", \"198.18.0.50\"]",
        "services[0].local_addresses[2]",
        "local address 198.18.0.50 is listed twice in this service",
    );
    assert!(
        err.message.contains("services[0].local_addresses[0]"),
        "{err}"
    );
    let many: Vec<String> = (1..=65).map(|i| format!("\"198.18.2.{i}\"")).collect();
    at(
        &format!("[{}]", many.join(", ")),
        "services[0].local_addresses",
        "65 local addresses; a service may have at most 64",
    );
}

#[test]
fn local_address_must_be_an_address_of_its_own() {
    let at = |lip: &str, field: &str, needle: &str| {
        assert_rejected(
            &fullnat_service(&format!("local_addresses = [\"198.18.0.50\", \"{lip}\"]")),
            26,
            field,
            needle,
        )
    };
    at(
        "198.18.0.1",
        "services[0].local_addresses[1]",
        "local address 198.18.0.1 is one of the appliance's own addresses (ports[0].addresses[0])",
    );
    at(
        "198.18.1.1",
        "services[0].local_addresses[1]",
        "local address 198.18.1.1 is the VIP of TCP 198.18.1.1:80 (services[0].vip)",
    );
    at(
        "198.18.0.12",
        "services[0].local_addresses[1]",
        "local address 198.18.0.12 is a real server of TCP 198.18.1.1:80 (services[0].real_servers[1])",
    );
    // Any service's VIP or real server, before or after this one.
    let second =
        SERVICE
            .replacen("198.18.1.1", "198.18.1.2", 1)
            .replacen("198.18.0.11", "198.18.0.21", 1);
    let text = format!(
        "{}{second}",
        fullnat_service("local_addresses = [\"198.18.1.2\"]")
    );
    assert_rejected(
        &text,
        26,
        "services[0].local_addresses[0]",
        "local address 198.18.1.2 is the VIP of TCP 198.18.1.2:80 (services[1].vip)",
    );
    let text = format!(
        "{}{second}",
        fullnat_service("local_addresses = [\"198.18.0.21\"]")
    );
    assert_rejected(
        &text,
        26,
        "services[0].local_addresses[0]",
        "local address 198.18.0.21 is a real server of TCP 198.18.1.2:80 (services[1].real_servers[0])",
    );
    let text = format!(
        "{BASE}{second}{}",
        SERVICE.replacen(
            "port = 80",
            "port = 80\nlocal_addresses = [\"198.18.1.2\"]",
            1
        )
    );
    assert_rejected(
        &text,
        38,
        "services[1].local_addresses[0]",
        "is the VIP of TCP 198.18.1.2:80 (services[0].vip)",
    );
}

#[test]
fn toa_is_a_tcp_boolean() {
    assert_rejected(
        &fullnat_service("local_addresses = [\"198.18.0.50\"]\ntoa = \"yes\""),
        27,
        "services[0].toa",
        "invalid type: string \"yes\", expected a boolean",
    );
    let udp = fullnat_service("local_addresses = [\"198.18.0.50\"]\ntoa = true")
        .replacen("\"tcp\"", "\"udp\"", 1);
    assert_rejected(&udp, 27, "services[0].toa", "TOA is a TCP option");
    let cfg = parse(&udp.replacen("toa = true", "toa = false", 1)).unwrap();
    assert!(!cfg.services[0].toa);
    let err = assert_rejected(
        &service_with("scheduler", "tao = true\nscheduler"),
        25,
        "services[0].tao",
        "unknown key `tao`",
    );
    assert!(err.message.contains("local_addresses, toa"), "{err}");
}

#[test]
fn docs_examples_of_new_sections_parse() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/CONFIG.md");
    let doc = std::fs::read_to_string(path).unwrap();
    let blocks: Vec<&str> = doc
        .split("```toml\n")
        .skip(1)
        .filter_map(|b| b.split("```").next())
        .filter(|b| {
            [
                "[timeouts]",
                "[sessions]",
                "[[services]]",
                "services = [",
                "[bgp]",
                "[[ports]]",
            ]
            .iter()
            .any(|h| b.starts_with(h))
        })
        .collect();
    assert_eq!(blocks.len(), 13, "{blocks:?}");
    for block in blocks {
        // Top-level keys go before BASE's first header, tables after its last.
        let text = if block.starts_with("services = [") {
            format!("{block}{BASE}")
        } else {
            format!("{BASE}{block}")
        };
        if let Err(e) = parse(&text) {
            panic!("{e} in:\n{block}");
        }
    }
}

#[test]
fn local_port_range() {
    let s = |kv: &str| format!("{BASE}[sessions]\n{kv}\n");
    let cfg = parse(&s("local_port_first = 2000\nlocal_port_last = 2007")).unwrap();
    assert_eq!(
        (cfg.sessions.local_port_first, cfg.sessions.local_port_last),
        (2000, 2007)
    );
    assert_rejected(
        &s("local_port_first = 0"),
        22,
        "sessions.local_port_first",
        "out of range (1..=65535)",
    );
    assert_rejected(
        &s("local_port_first = 3000\nlocal_port_last = 2000"),
        23,
        "sessions.local_port_last",
        "local_port_first 3000 is above local_port_last 2000",
    );
}

#[test]
fn neighbour_tables_are_sized_by_sessions_neighbours() {
    let s = |kv: &str| format!("{BASE}[sessions]\n{kv}\n");
    let cfg = parse(&s("neighbours = 65536")).unwrap();
    assert_eq!(cfg.sessions.neighbours, 65536);
    assert_eq!(cfg.sessions.server_addresses(), 49152);
    assert_eq!(parse(BASE).unwrap().sessions.server_addresses(), 3072);
    for bad in ["255", "1048577"] {
        assert_rejected(
            &s(&format!("neighbours = {bad}")),
            22,
            "sessions.neighbours",
            "out of range (256..=1048576)",
        );
    }
}

#[test]
fn the_template_table_is_sized_by_sessions_persistence_templates() {
    let s = |kv: &str| format!("{BASE}[sessions]\n{kv}\n");
    let cfg = parse(&s("persistence_templates = 4")).unwrap();
    assert_eq!(cfg.sessions.persistence_templates, 4);
    assert_eq!(parse(BASE).unwrap().sessions.persistence_templates, 262_144);
    for bad in ["3", "16777217"] {
        assert_rejected(
            &s(&format!("persistence_templates = {bad}")),
            22,
            "sessions.persistence_templates",
            "out of range (4..=16777216)",
        );
    }
}

#[test]
fn fullnat_time_wait_and_timestamp_rewriting() {
    let s = |kv: &str| format!("{BASE}[sessions]\n{kv}\n");
    let cfg = parse(&s("server_time_wait = 120\nrewrite_timestamps = false")).unwrap();
    assert_eq!(
        (
            cfg.sessions.server_time_wait_s,
            cfg.sessions.rewrite_timestamps
        ),
        (120, false)
    );
    assert_rejected(
        &s("server_time_wait = 0"),
        22,
        "sessions.server_time_wait",
        "out of range (1..=3600)",
    );
    assert_rejected(
        &s("rewrite_timestamps = 1"),
        22,
        "sessions.rewrite_timestamps",
        "boolean",
    );
}

#[test]
fn worker_cpus_map_lcores_onto_shared_cpus() {
    let cfg = parse(&base_with(
        "workers = [1]",
        "workers = [1, 2, 3]\ncpus = [1, 1, 0]",
    ))
    .unwrap();
    assert_eq!(cfg.lcores.cpus, Some(vec![1, 1, 0]));
    let args = cfg.eal_args();
    let at = args.iter().position(|a| a == "--lcores").expect("--lcores");
    assert_eq!(args[at + 1], "0@0,1@1,2@1,3@0");
    assert!(!args.contains(&"-l".to_string()), "{args:?}");
    assert_rejected(
        &base_with("workers = [1]", "workers = [1, 2]\ncpus = [1]"),
        9,
        "lcores.cpus",
        "1 CPU(s) for 2 worker(s)",
    );
    assert_rejected(
        &base_with("workers = [1]", "workers = [1]\ncpus = [\"x\"]"),
        9,
        "lcores.cpus[0]",
        "expected an integer",
    );
}

#[test]
fn idle_sleep_defaults_to_polling_without_pause_and_is_bounded() {
    assert_eq!(
        parse(&base_with("workers = [1]", "workers = [1]"))
            .unwrap()
            .lcores
            .idle_sleep_us,
        0
    );
    let cfg = parse(&base_with(
        "workers = [1]",
        "workers = [1]\nidle_sleep_us = 20",
    ))
    .unwrap();
    assert_eq!(cfg.lcores.idle_sleep_us, 20);
    assert_rejected(
        &base_with("workers = [1]", "workers = [1]\nidle_sleep_us = 1001"),
        9,
        "lcores.idle_sleep_us",
        "1001",
    );
    assert_rejected(
        &base_with("workers = [1]", "workers = [1]\nidle_sleep_us = -1"),
        9,
        "lcores.idle_sleep_us",
        "-1",
    );
}

#[test]
fn scheduler_flags_and_maglev_table_size() {
    let with = |extra: &str| service_with("scheduler = \"rr\"", extra);
    let cfg = parse(&with(
        "scheduler = \"mh\"\nscheduler_flags = \"mh-port\"\nmh_table_size = 251",
    ))
    .unwrap();
    let svc = &cfg.services[0];
    assert_eq!(svc.sched_flags.to_string(), "mh-port");
    assert_eq!(svc.mh_table_size, Some(251));
    assert_rejected(
        &with("scheduler = \"rr\"\nscheduler_flags = \"sh-port\""),
        26,
        "services[0].scheduler_flags",
        "does not apply to scheduler rr",
    );
    assert_rejected(
        &with("scheduler = \"mh\"\nscheduler_flags = \"mh-turbo\""),
        26,
        "services[0].scheduler_flags",
        "unknown scheduler flag",
    );
    assert_rejected(
        &with("scheduler = \"mh\"\nmh_table_size = 65536"),
        26,
        "services[0].mh_table_size",
        "is not prime",
    );
}

#[test]
fn metrics_address() {
    let text = base_with(
        "[control]\nsocket = \"/run/sluice/test.sock\"\n",
        "[control]\nsocket = \"/run/sluice/test.sock\"\nmetrics = \"127.0.0.1:9101\"\n",
    );
    let cfg = parse(&text).unwrap();
    assert_eq!(cfg.control.metrics, Some("127.0.0.1:9101".parse().unwrap()));
    let bad = base_with(
        "[control]\nsocket = \"/run/sluice/test.sock\"\n",
        "[control]\nsocket = \"/run/sluice/test.sock\"\nmetrics = \"localhost\"\n",
    );
    assert_rejected(&bad, 12, "control.metrics", "ADDRESS:PORT");
}

#[test]
fn control_group_by_name_or_gid() {
    let with = |v: &str| {
        base_with(
            "socket = \"/run/sluice/test.sock\"\n",
            &format!("socket = \"/run/sluice/test.sock\"\ngroup = {v}\n"),
        )
    };
    assert_eq!(parse(BASE).unwrap().control.group, None);
    let root = Some(ControlGroup {
        name: "root".into(),
        gid: 0,
    });
    assert_eq!(parse(&with("\"root\"")).unwrap().control.group, root);
    assert_eq!(parse(&with("0")).unwrap().control.group, root);
    // Line 12 is the group line, right after the socket.
    assert_rejected(
        &with("\"sluice-no-such-group-4f2a\""),
        12,
        "control.group",
        "no group named \"sluice-no-such-group-4f2a\"",
    );
    assert_rejected(
        &with("4000000123"),
        12,
        "control.group",
        "no group with gid 4000000123",
    );
    assert_rejected(&with("-1"), 12, "control.group", "out of range");
    assert_rejected(&with("\"\""), 12, "control.group", "not a group name");
    assert_rejected(
        &with("true"),
        12,
        "control.group",
        "expected a group name or a gid",
    );
}

#[test]
fn health_vrrp_and_sync_sections_parse_with_their_overrides() {
    let service = SERVICE
        .replacen(
            "scheduler = \"rr\"\n",
            "scheduler = \"rr\"\nhealth = { check = \"http\", path = \"/health\", all_down = \"drop\" }\n",
            1,
        )
        .replacen(
            "mode = \"dr\"\n",
            "mode = \"dr\"\nhealth = { check = \"tcp\", port = 9000 }\n",
            1,
        );
    let text = format!(
        "{BASE}[health]\ncheck = \"tcp\"\ninterval_ms = 3000\nall_down = \"rst\"\n\n\
         [vrrp]\nvrid = 51\nadvert_interval_ms = 100\naddresses = [\"198.18.0.254\"]\n\
         peers = [\"198.18.0.3\", \"198.18.0.2\"]\n{VRRP_KEY_LINE}\n\
         [sync]\nlisten = \"198.19.0.1:8848\"\npeers = [\"198.19.0.2:8848\"]\n\
         multicast = \"224.0.0.81:8848\"\nkey = \"000102030405060708090a0b0c0d0e0f\"\n\n{service}"
    );
    let cfg = parse(&text).unwrap_or_else(|e| panic!("{e}"));
    use crate::health::spec::{AllDown, CheckKind};
    assert_eq!(cfg.health.defaults.kind, CheckKind::Tcp);
    assert_eq!(cfg.health.defaults.interval_ms, 3000);
    assert_eq!(cfg.health.defaults.fall, 2, "seed 004's default");
    assert_eq!(cfg.health.all_down, AllDown::Rst);
    let s = &cfg.services[0];
    assert_eq!(s.health.kind, Some(CheckKind::Http));
    assert_eq!(s.health.path.as_deref(), Some("/health"));
    assert_eq!(s.all_down, Some(AllDown::Drop));
    assert_eq!(s.real_servers[1].health.port, Some(9000));
    let vrrp = cfg.vrrp.as_ref().unwrap();
    assert_eq!(
        (
            vrrp.vrid,
            vrrp.priority,
            vrrp.advert_interval_ms,
            vrrp.preempt
        ),
        (51, 100, 100, true)
    );
    assert_eq!(vrrp.addresses, vec![Ipv4Addr::new(198, 18, 0, 254)]);
    assert_eq!(
        vrrp.peers,
        vec![Ipv4Addr::new(198, 18, 0, 3), Ipv4Addr::new(198, 18, 0, 2)]
    );
    // Taking adverts from anyone on the link is an explicit choice.
    let any = parse(&format!(
        "{BASE}[vrrp]\nvrid = 51\nany_peer = true\nunauthenticated = true\n"
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    let any = any.vrrp.unwrap();
    assert_eq!((any.peers, any.any_peer), (Vec::<Ipv4Addr>::new(), true));
    assert!(!vrrp.unicast && !any.unicast);
    let unicast = parse(&format!(
        "{BASE}[vrrp]\nvrid = 51\npeers = [\"198.18.0.2\"]\nunicast = true\nunauthenticated = true\n"
    ))
    .unwrap_or_else(|e| panic!("{e}"));
    let unicast = unicast.vrrp.unwrap();
    assert!(unicast.unicast);
    assert!(vrrp.key.is_some() && unicast.key.is_none() && any.key.is_none());
    assert_eq!(vrrp.max_clock_skew_ms, 60_000);
    let sync = cfg.sync.as_ref().unwrap();
    assert_eq!(sync.peers.len(), 1);
    assert_eq!(
        (sync.threshold, sync.period_ms, sync.mtu),
        (3, 10_000, 1500)
    );
    assert_eq!(sync.dump_records_per_turn, 65_536);
    assert_eq!(sync.multicast, Some("224.0.0.81:8848".parse().unwrap()));
    assert!(parse(BASE).unwrap().vrrp.is_none());
    assert!(parse(BASE).unwrap().sync.is_none());
}

/// A valid `key` line of `[vrrp]`.
const VRRP_KEY_LINE: &str = "key = \"f0e1d2c3b4a5968778695a4b3c2d1e0f\"\n";

/// `[vrrp]` needs a key, a key file or an explicit `unauthenticated = true`, exactly
/// one; `max_clock_skew_ms` only with a key.
#[test]
fn vrrp_is_authenticated_unless_the_config_opts_out() {
    // `[vrrp]` on line 21, vrid 22, peers 23, then `rest` from line 24.
    let vrrp = |rest: &str| format!("{BASE}[vrrp]\nvrid = 51\npeers = [\"198.18.0.2\"]\n{rest}");
    let err = assert_rejected(&vrrp(""), 21, "vrrp.key", "missing key");
    assert!(err.to_string().contains("unauthenticated = true"), "{err}");
    assert!(err.to_string().contains("keepalived"), "{err}");
    let keyed = parse(&vrrp(&format!("{VRRP_KEY_LINE}max_clock_skew_ms = 5000\n")))
        .unwrap_or_else(|e| panic!("{e}"))
        .vrrp
        .unwrap();
    assert_eq!(
        keyed.key.as_ref().map(|k| k.as_str()),
        Some("f0e1d2c3b4a5968778695a4b3c2d1e0f")
    );
    assert_eq!(
        (keyed.key_file.as_ref(), keyed.max_clock_skew_ms),
        (None, 5000)
    );
    assert_rejected(
        &vrrp(&format!("{VRRP_KEY_LINE}unauthenticated = true\n")),
        25,
        "vrrp.unauthenticated",
        "with a `key`",
    );
    assert_rejected(
        &vrrp("key = \"abcd\"\n"),
        24,
        "vrrp.key",
        "key of 2 bytes (at least 16)",
    );
    assert_rejected(&vrrp("key = \"xyz\"\n"), 24, "vrrp.key", "not hexadecimal");
    assert_rejected(
        &vrrp("unauthenticated = true\nmax_clock_skew_ms = 5000\n"),
        25,
        "vrrp.max_clock_skew_ms",
        "only adverts sealed with a `key`",
    );
    assert_rejected(
        &vrrp("unauthenticated = true\naccept_unsealed = true\n"),
        25,
        "vrrp.accept_unsealed",
        "only with a `key`",
    );
    let switching = parse(&vrrp(&format!("{VRRP_KEY_LINE}accept_unsealed = true\n")))
        .unwrap_or_else(|e| panic!("{e}"))
        .vrrp
        .unwrap();
    assert!(switching.accept_unsealed && !keyed.accept_unsealed);
    assert_rejected(
        &vrrp(&format!("{VRRP_KEY_LINE}max_clock_skew_ms = 999\n")),
        25,
        "vrrp.max_clock_skew_ms",
        "out of range",
    );
    // A key file, as `[sync]`'s: refused with a key, read without one.
    let dir = std::env::temp_dir().join(format!("sluice-vrrp-key-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("vrrp.key");
    std::fs::write(&file, "f0e1d2c3b4a5968778695a4b3c2d1e0f\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let line = format!("key_file = {:?}\n", file.display().to_string());
    let from_file = parse(&vrrp(&line))
        .unwrap_or_else(|e| panic!("{e}"))
        .vrrp
        .unwrap();
    assert_eq!(from_file.key, keyed.key);
    assert_eq!(from_file.key_file.as_deref(), Some(file.as_path()));
    assert_rejected(
        &vrrp(&format!("{VRRP_KEY_LINE}{line}")),
        25,
        "vrrp.key_file",
        "with a `key`",
    );
    assert_rejected(
        &vrrp(&format!("{line}unauthenticated = true\n")),
        25,
        "vrrp.unauthenticated",
        "`unauthenticated = true` with `key_file`",
    );
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    assert_rejected(&vrrp(&line), 24, "vrrp.key_file", "has mode 0644");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `[sync]` with `multicast = {value}` on line 24 (and a key on line 25).
fn sync_with_multicast(value: &str) -> String {
    format!(
        "{BASE}[sync]\nlisten = \"198.19.0.1:8848\"\npeers = [\"198.19.0.2:8848\"]\nmulticast = {value}\n{SYNC_KEY_LINE}"
    )
}

/// A valid `key` line of `[sync]`.
const SYNC_KEY_LINE: &str = "key = \"000102030405060708090a0b0c0d0e0f\"\n";

/// `[sync]` on line 21 (listen 22, peers 23), then `rest` from line 24.
fn sync_with(rest: &str) -> String {
    format!("{BASE}[sync]\nlisten = \"198.19.0.1:8848\"\npeers = [\"198.19.0.2:8848\"]\n{rest}")
}

/// `key_file` reads the same key a `key` line gives, from a file beside the config
/// (or at an absolute path); with `key` too, or with `unauthenticated`, it is refused.
#[test]
fn a_sync_key_file_gives_the_key_and_excludes_the_inline_one() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("sync.key");
    std::fs::write(&key, "  000102030405060708090a0b0c0d0e0f\n").unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let config = dir.path().join("sluice.toml");
    for line in [
        "key_file = \"sync.key\"\n".to_string(),
        format!("key_file = {:?}\n", key.display().to_string()),
    ] {
        let cfg = Config::parse(&sync_with(&line), &config).unwrap_or_else(|e| panic!("{e}"));
        let sync = cfg.sync.unwrap();
        assert_eq!(
            sync.key.as_ref().map(|k| k.as_str()),
            Some("000102030405060708090a0b0c0d0e0f")
        );
        assert_eq!(sync.key_file.as_deref(), Some(key.as_path()));
    }
    let absolute = format!("key_file = {:?}\n", key.display().to_string());
    let err = parse(&sync_with(&format!("{SYNC_KEY_LINE}{absolute}"))).unwrap_err();
    assert_eq!(
        (err.field.as_str(), err.line),
        ("sync.key_file", 25),
        "{err}"
    );
    assert!(err.message.contains("with a `key`"), "{err}");
    let err = parse(&sync_with(&format!("{absolute}unauthenticated = true\n"))).unwrap_err();
    assert_eq!(err.field, "sync.unauthenticated", "{err}");
    // Not through a symbolic link, not a FIFO (which would hang the load), not past
    // the size of any key.
    let link = dir.path().join("link.key");
    std::os::unix::fs::symlink(&key, &link).unwrap();
    let fifo = dir.path().join("fifo.key");
    let made = std::process::Command::new("mkfifo").arg(&fifo).status();
    assert!(made.is_ok_and(|s| s.success()), "mkfifo");
    std::fs::set_permissions(&fifo, std::fs::Permissions::from_mode(0o600)).unwrap();
    let long = dir.path().join("long.key");
    std::fs::write(&long, "00".repeat(3000)).unwrap();
    std::fs::set_permissions(&long, std::fs::Permissions::from_mode(0o600)).unwrap();
    for (file, needle) in [
        ("link.key", "cannot read"),
        ("fifo.key", "is not a regular file"),
        ("long.key", "is longer than 4096 bytes"),
    ] {
        let line = format!("key_file = \"{file}\"\n");
        let err = Config::parse(&sync_with(&line), &config).unwrap_err();
        assert_eq!(err.field, "sync.key_file", "{err}");
        assert!(err.message.contains(needle), "{needle:?} not in {err}");
    }
}

#[test]
fn sync_without_a_key_needs_the_explicit_opt_out() {
    let err = assert_rejected(&sync_with(""), 21, "sync.key", "missing key `key`");
    assert!(err.to_string().starts_with("test.toml:21:"), "{err}");
    assert!(err.to_string().contains("unauthenticated = true"), "{err}");
    assert_rejected(
        &sync_with("unauthenticated = false\n"),
        21,
        "sync.key",
        "sync needs a shared key",
    );
    let open = parse(&sync_with("unauthenticated = true\n")).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(open.sync.unwrap().key, None);
    let keyed = parse(&sync_with(SYNC_KEY_LINE)).unwrap_or_else(|e| panic!("{e}"));
    // A debug print of the config (a log line, a panic message) shows no key.
    let shown = format!("{keyed:?}");
    assert!(
        shown.contains("SecretHex(..)") && !shown.contains("0102030405"),
        "{shown}"
    );
    assert_eq!(
        keyed.sync.unwrap().key.as_ref().map(|k| k.as_str()),
        Some("000102030405060708090a0b0c0d0e0f")
    );
    assert_rejected(
        &sync_with(&format!("{SYNC_KEY_LINE}unauthenticated = true\n")),
        25,
        "sync.unauthenticated",
        "with a `key`",
    );
    assert_rejected(
        &sync_with("unauthenticated = \"yes\"\n"),
        24,
        "sync.unauthenticated",
        "a boolean",
    );
}

#[test]
fn sync_multicast_is_optional_and_any_group_of_224_0_0_0_4() {
    let sync = |text: &str| parse(text).unwrap_or_else(|e| panic!("{e}")).sync.unwrap();
    let unicast = sync_with(SYNC_KEY_LINE);
    assert_eq!(sync(&unicast).multicast, None);
    for group in ["224.0.0.0:1", "224.0.0.81:8848", "239.255.255.255:65535"] {
        assert_eq!(
            sync(&sync_with_multicast(&format!("\"{group}\""))).multicast,
            Some(group.parse().unwrap())
        );
    }
}

/// `dump_records_per_turn` bounds a dump's listing per turn: from 1 (a record a
/// turn) to 1,000,000; 0 would never list, and anything else is named with its line.
#[test]
fn sync_dump_records_per_turn_is_bounded_and_named_when_wrong() {
    let ok = |n: u32| {
        let text = sync_with(&format!("dump_records_per_turn = {n}\n{SYNC_KEY_LINE}"));
        parse(&text).unwrap_or_else(|e| panic!("{e}")).sync.unwrap()
    };
    assert_eq!(ok(1).dump_records_per_turn, 1);
    assert_eq!(ok(1_000_000).dump_records_per_turn, 1_000_000);
    for (value, needle) in [
        ("0", "1..=1000000"),
        ("1000001", "1..=1000000"),
        ("-5", "1..=1000000"),
        ("\"many\"", "invalid type"),
    ] {
        assert_rejected(
            &sync_with(&format!("dump_records_per_turn = {value}\n{SYNC_KEY_LINE}")),
            24,
            "sync.dump_records_per_turn",
            needle,
        );
    }
}

#[test]
fn a_sync_multicast_that_is_no_group_names_its_field() {
    for address in [
        "198.19.0.9",
        "223.255.255.255",
        "240.0.0.1",
        "255.255.255.255",
        "0.0.0.0",
    ] {
        assert_rejected(
            &sync_with_multicast(&format!("\"{address}:8848\"")),
            24,
            "sync.multicast",
            &format!("{address} is not an IPv4 multicast address (224.0.0.0/4)"),
        );
    }
    for (value, needle) in [
        ("\"224.0.0.81\"", "expected GROUP:PORT"),
        ("\"224.0.0.81:70000\"", "expected GROUP:PORT"),
        ("\"ff02::81:8848\"", "expected GROUP:PORT"),
        ("\"224.0.0.81:0\"", "port 0"),
        ("8848", "invalid type"),
    ] {
        assert_rejected(&sync_with_multicast(value), 24, "sync.multicast", needle);
    }
}

#[test]
fn bad_health_vrrp_and_sync_settings_name_their_field() {
    assert_rejected(
        &format!("{BASE}[health]\ncheck = \"icmp\"\n"),
        22,
        "health.check",
        "\"tcp\"",
    );
    assert_rejected(
        &format!("{BASE}[health]\ninterval_ms = 100\ntimeout_ms = 200\n"),
        23,
        "health.timeout_ms",
        "longer than the interval",
    );
    assert_rejected(
        &format!("{BASE}[vrrp]\nvrid = 1\nadvert_interval_ms = 105\n"),
        23,
        "vrrp.advert_interval_ms",
        "multiple of 10",
    );
    // VRRPv3 has no authentication: the peers' addresses are what it takes, and
    // they share the first port's link.
    assert_rejected(
        &format!("{BASE}[vrrp]\nvrid = 1\n"),
        21,
        "vrrp.peers",
        "any host on the link",
    );
    assert_rejected(
        &format!("{BASE}[vrrp]\nvrid = 1\npeers = []\n"),
        23,
        "vrrp.peers",
        "at least one peer",
    );
    assert_rejected(
        &format!("{BASE}[vrrp]\nvrid = 1\npeers = [\"198.19.0.2\"]\n"),
        23,
        "vrrp.peers[0]",
        "not on a subnet of port \"lan0\"",
    );
    let many: Vec<String> = (2..=34).map(|i| format!("\"198.18.0.{i}\"")).collect();
    assert_rejected(
        &format!("{BASE}[vrrp]\nvrid = 1\npeers = [{}]\n", many.join(", ")),
        23,
        "vrrp.peers[32]",
        "more than 32 peers",
    );
    assert_rejected(
        &format!("{BASE}[vrrp]\nvrid = 1\npeers = [\"198.18.0.2\", \"198.18.0.1\"]\n"),
        23,
        "vrrp.peers[1]",
        "one of this node's own addresses",
    );
    assert_rejected(
        &format!("{BASE}[vrrp]\nvrid = 1\npeers = [\"198.18.0.2\"]\nany_peer = true\n"),
        24,
        "vrrp.any_peer",
        "remove one of them",
    );
    assert_rejected(
        &format!("{BASE}[vrrp]\nvrid = 1\nany_peer = true\nunicast = true\n"),
        24,
        "vrrp.unicast",
        "`any_peer = true` lists none",
    );
    assert_rejected(
        &format!("{BASE}[vrrp]\nvrid = 1\nunicast = true\n"),
        21,
        "vrrp.peers",
        "VRRP needs the other routers' addresses",
    );
    assert_rejected(
        &format!("{BASE}[vrrp]\nvrid = 1\nsource = \"198.18.0.9\"\npeers = [\"198.18.0.2\"]\n"),
        23,
        "vrrp.source",
        "not an address of port \"lan0\"",
    );
    assert_rejected(
        &format!("{BASE}[sync]\nlisten = \"198.19.0.1:1\"\npeers = []\n"),
        23,
        "sync.peers",
        "at least one peer",
    );
    assert_rejected(
        &format!("{BASE}[sync]\nlisten = \"0.0.0.0:8848\"\npeers = [\"198.19.0.2:1\"]\n"),
        22,
        "sync.listen",
        "not one of this node's addresses",
    );
    // One file for both nodes, listing both: this node would take its own batches.
    assert_rejected(
        &format!(
            "{BASE}[sync]\nlisten = \"198.19.0.1:8848\"\npeers = [\"198.19.0.2:8848\", \"198.19.0.1:8848\"]\n{SYNC_KEY_LINE}"
        ),
        23,
        "sync.peers[1]",
        "this node's own `listen` address",
    );
    assert_rejected(
        &format!(
            "{BASE}[sync]\nlisten = \"198.19.0.1:8848\"\npeers = [\"198.19.0.2:8848\", \"198.19.0.2:8849\"]\n{SYNC_KEY_LINE}"
        ),
        23,
        "sync.peers[1]",
        "198.19.0.2 is listed twice",
    );
    assert_rejected(
        &format!(
            "{BASE}[sync]\nlisten = \"198.19.0.1:1\"\npeers = [\"198.19.0.2:1\"]\nkey = \"abcd\"\n"
        ),
        24,
        "sync.key",
        "16",
    );
}

/// `[sync]` over port `port` from line 21: 22 listen, 23 port, 24 peers, then `extra`
/// from line 25.
fn sync_over_port(text: &str, listen: &str, port: &str, peers: &str, extra: &str) -> String {
    format!(
        "{text}[sync]\nlisten = \"{listen}\"\nport = \"{port}\"\npeers = [{peers}]\n{extra}{SYNC_KEY_LINE}"
    )
}

#[test]
fn sync_over_the_first_port_parses() {
    let sync = |text: &str| parse(text).unwrap_or_else(|e| panic!("{e}")).sync.unwrap();
    let s = sync(&sync_over_port(
        BASE,
        "198.18.0.1:8848",
        "lan0",
        "\"198.18.0.2:8848\", \"198.18.0.3:8849\"",
        "multicast = \"224.0.0.81:8848\"\n",
    ));
    assert_eq!(s.port.as_deref(), Some("lan0"));
    assert_eq!(s.listen, "198.18.0.1:8848".parse().unwrap());
    assert_eq!(s.multicast, Some("224.0.0.81:8848".parse().unwrap()));
    // Any address of the port, a peer on any of its subnets; the port's own MTU bounds
    // the datagrams.
    let two_addresses = base_with(
        "addresses = [\"198.18.0.1/24\"]",
        "addresses = [\"198.18.0.1/24\", \"198.19.0.1/30\"]\nmtu = 1400",
    );
    let s = sync(&sync_over_port(
        &two_addresses,
        "198.19.0.1:1",
        "lan0",
        "\"198.19.0.2:1\", \"198.18.0.200:1\"",
        "mtu = 1400\n",
    ));
    assert_eq!((s.port.as_deref(), s.mtu), (Some("lan0"), 1400));
    // Without `port`: a kernel socket, `listen` anywhere.
    let kernel = format!(
        "{BASE}[sync]\nlisten = \"203.0.113.1:1\"\npeers = [\"203.0.113.2:1\"]\n{SYNC_KEY_LINE}"
    );
    assert_eq!(sync(&kernel).port, None);
}

#[test]
fn sync_over_a_port_names_the_field_it_cannot_use() {
    let peer = "\"198.18.0.2:8848\"";
    assert_rejected(
        &sync_over_port(BASE, "198.18.0.1:8848", "lan9", peer, ""),
        23,
        "sync.port",
        "no [[ports]] named \"lan9\" (the ports are \"lan0\")",
    );
    // Lines 21-24 are the second port here: [sync] from line 25.
    let second = format!("{}\n", two_ports("lan1", "lan1"));
    let err = assert_rejected(
        &sync_over_port(
            &second,
            "198.18.1.1:8848",
            "lan1",
            "\"198.18.1.2:8848\"",
            "",
        ),
        28,
        "sync.port",
        "sync over a DPDK port needs the first port (\"lan0\")",
    );
    assert!(err.to_string().starts_with("test.toml:28:"), "{err}");
    assert_rejected(
        &sync_over_port(BASE, "198.19.0.1:8848", "lan0", peer, ""),
        22,
        "sync.listen",
        "198.19.0.1 is not an address of port \"lan0\" (198.18.0.1/24)",
    );
    assert_rejected(
        &sync_over_port(BASE, "198.18.0.1:0", "lan0", peer, ""),
        22,
        "sync.listen",
        "port 0",
    );
    assert_rejected(
        &sync_over_port(
            BASE,
            "198.18.0.1:8848",
            "lan0",
            "\"198.18.0.2:8848\", \"198.19.0.2:8848\"",
            "",
        ),
        24,
        "sync.peers[1]",
        "198.19.0.2 is not on a subnet of port \"lan0\" (198.18.0.1/24): sync frames go to a peer directly",
    );
    assert_rejected(
        &sync_over_port(BASE, "198.18.0.1:8848", "lan0", peer, "mtu = 1600\n"),
        25,
        "sync.mtu",
        "sync.mtu 1600 is above port \"lan0\"'s MTU 1500",
    );
    // The default sync MTU over a port with a smaller one: reported at `port`.
    let small = base_with(
        "addresses = [\"198.18.0.1/24\"]",
        "addresses = [\"198.18.0.1/24\"]\nmtu = 1400",
    );
    assert_rejected(
        &sync_over_port(&small, "198.18.0.1:8848", "lan0", peer, ""),
        24,
        "sync.port",
        "sync.mtu 1500 (the default) is above port \"lan0\"'s MTU 1400",
    );
    // A jumbo port: the frame must still fit one mbuf.
    let jumbo = base_with(
        "addresses = [\"198.18.0.1/24\"]",
        "addresses = [\"198.18.0.1/24\"]\nmtu = 9000",
    );
    assert_rejected(
        &sync_over_port(&jumbo, "198.18.0.1:8848", "lan0", peer, "mtu = 4000\n"),
        26,
        "sync.mtu",
        "a sync frame must fit one mbuf, so at most 2034",
    );
    assert_rejected(
        &sync_over_port(BASE, "198.18.0.1:8848", "true", peer, "").replace("\"true\"", "true"),
        23,
        "sync.port",
        "invalid type",
    );
}

#[test]
fn access_lists_and_rate_limits_parse_per_service() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("blocked.acl"),
        "# lab networks\ndeny 198.51.100.0/24\nallow 203.0.113.7\n",
    )
    .unwrap();
    let text = service_with(
        "scheduler = \"rr\"",
        "scheduler = \"rr\"\nacl_allow = [\"10.0.0.0/8\"]\nacl_deny = [\"10.1.0.0/16\", \"10.2.0.0/16\"]\n\
         acl_file = \"blocked.acl\"\nrate_limit = 50\nrate_limit_prefix = 24",
    );
    let path = dir.path().join("sluice.toml");
    std::fs::write(&path, &text).unwrap();
    let cfg = Config::load(&path).unwrap_or_else(|e| panic!("{e}"));
    let svc = &cfg.services[0];
    let p = |s: &str| s.parse::<crate::service::Prefix>().unwrap();
    use crate::service::AclAction::{Allow, Deny};
    assert_eq!(
        svc.acl,
        vec![
            (Allow, p("10.0.0.0/8")),
            (Deny, p("10.1.0.0/16")),
            (Deny, p("10.2.0.0/16")),
            (Deny, p("198.51.100.0/24")),
            (Allow, p("203.0.113.7/32")),
        ]
    );
    assert_eq!(
        svc.rate_limit,
        Some(crate::service::RateLimit::new(50, 50, 24).unwrap())
    );
    let plain = parse(&format!("{BASE}{SERVICE}")).unwrap();
    assert!(plain.services[0].acl.is_empty() && plain.services[0].rate_limit.is_none());
}

#[test]
fn bad_access_lists_and_rate_limits_name_their_field_and_line() {
    let with = |extra: &str| {
        service_with(
            "scheduler = \"rr\"",
            &format!("scheduler = \"rr\"\n{extra}"),
        )
    };
    assert_rejected(
        &with("acl_deny = [\"10.0.0.0/16\", \"10.1.0.0/8\"]"),
        26,
        "services[0].acl_deny[1]",
        "host bits",
    );
    assert_rejected(
        &with("acl_allow = [\"10.0.0.0/8\"]\nacl_deny = [\"10.0.0.0/8\"]"),
        27,
        "services[0].acl_deny[0]",
        "already listed in services[0].acl_allow[0]",
    );
    assert_rejected(
        &with("acl_file = \"/nonexistent/sluice.acl\""),
        26,
        "services[0].acl_file",
        "cannot read",
    );
    assert_rejected(&with("rate_limit = 0"), 26, "services[0].rate_limit", "");
    assert_rejected(
        &with("rate_limit = 10\nrate_limit_burst = 1000"),
        26,
        "services[0].rate_limit",
        "burst 1000",
    );
    assert_rejected(
        &with("rate_limit_prefix = 24"),
        26,
        "services[0].rate_limit_prefix",
        "needs rate_limit",
    );
    let dir = tempfile::tempdir().unwrap();
    let list = dir.path().join("bad.acl");
    std::fs::write(&list, "deny 10.0.0.0/8\nblock 10.1.0.0/16\n").unwrap();
    let err = assert_rejected(
        &with(&format!("acl_file = \"{}\"", list.display())),
        26,
        "services[0].acl_file",
        "bad.acl:2: \"block\": expected allow or deny",
    );
    assert!(err.to_string().contains("test.toml:26"), "{err}");
    // Not a file that could hang the load or never end: a FIFO (no writer), a device.
    let fifo = dir.path().join("fifo.acl");
    let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path; mkfifo has no other precondition.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
    for list in [fifo.as_path(), std::path::Path::new("/dev/zero")] {
        assert_rejected(
            &with(&format!("acl_file = \"{}\"", list.display())),
            26,
            "services[0].acl_file",
            "is not a regular file",
        );
    }
}

/// SERVICE with both real servers in NAT mode and `kv` after the scheduler (line 26).
fn nat_service(kv: &str) -> String {
    service_with("scheduler = \"rr\"", &format!("scheduler = \"rr\"\n{kv}"))
        .replacen("weight = 1\n", "weight = 1\nmode = \"nat\"\n", 1)
        .replacen("mode = \"dr\"", "mode = \"nat\"", 1)
}

#[test]
fn synproxy_parses_and_refuses_dr_tun_udp_and_bad_values() {
    let cfg = parse(&nat_service(
        "synproxy = \"auto\"\nsynproxy_auto_syn_rate = 5000\nsynproxy_syn_retries = 5",
    ))
    .unwrap();
    assert_eq!(
        cfg.services[0].synproxy,
        crate::model::SynProxy {
            mode: crate::model::SynProxyMode::Auto,
            auto_syn_rate: 5000,
            syn_retries: 5,
        }
    );
    let cfg = parse(&nat_service("synproxy = \"on\"")).unwrap();
    assert_eq!(
        cfg.services[0].synproxy.mode,
        crate::model::SynProxyMode::On
    );
    assert_eq!(cfg.services[0].synproxy.auto_syn_rate, 1000);
    assert_eq!(cfg.services[0].synproxy.syn_retries, 3);
    let cfg = parse(&nat_service("")).unwrap();
    assert_eq!(cfg.services[0].synproxy, crate::model::SynProxy::default());
    // A TUN real server (the second, at services[0].real_servers[1]).
    let dr = nat_service("synproxy = \"on\"");
    let dr = {
        let at = dr.rfind("mode = \"nat\"").unwrap();
        format!(
            "{}mode = \"tun\"{}",
            &dr[..at],
            &dr[at + "mode = \"nat\"".len()..]
        )
    };
    assert_rejected(
        &dr,
        26,
        "services[0].synproxy",
        "198.18.0.12:80 (services[0].real_servers[1]) uses mode tun, whose replies bypass Sluice",
    );
    assert_rejected(
        &nat_service("synproxy = \"yes\""),
        26,
        "services[0].synproxy",
        "expected \"off\", \"on\" or \"auto\"",
    );
    assert_rejected(
        &nat_service("synproxy = \"on\"").replacen("\"tcp\"", "\"udp\"", 1),
        26,
        "services[0].synproxy",
        "only a tcp service",
    );
    assert_rejected(
        &nat_service("synproxy = \"auto\"\nsynproxy_auto_syn_rate = 0"),
        27,
        "services[0].synproxy_auto_syn_rate",
        "",
    );
    assert_rejected(
        &nat_service("synproxy = \"on\"\nsynproxy_syn_retries = 6"),
        27,
        "services[0].synproxy_syn_retries",
        "6 is out of range (0..=5)",
    );
    assert_rejected(
        &nat_service("synproxy = \"on\"\nsynproxy_syn_retries = \"3\""),
        27,
        "services[0].synproxy_syn_retries",
        "an integer",
    );
    // Off is fine with DR.
    parse(&service_with(
        "scheduler = \"rr\"",
        "scheduler = \"rr\"\nsynproxy = \"off\"",
    ))
    .unwrap();
}

/// The texts of [`BROKEN_CONFIGS`], read once.
fn recorded_broken_configs() -> &'static std::collections::HashSet<String> {
    static TEXTS: std::sync::OnceLock<std::collections::HashSet<String>> =
        std::sync::OnceLock::new();
    TEXTS.get_or_init(|| {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(BROKEN_CONFIGS);
        let cases: Vec<serde_json::Value> =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        cases
            .iter()
            .map(|case| case["text"].as_str().unwrap().to_string())
            .collect()
    })
}

/// The configs of [`BROKEN_CONFIGS`] are still refused at the line and field recorded
/// (rerun scripts/record-broken-configs.sh when a rejection test changes).
#[test]
fn broken_config_fixtures_are_rejected_as_recorded() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(BROKEN_CONFIGS);
    let cases: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert!(
        cases.len() > 100,
        "{} cases in {}",
        cases.len(),
        path.display()
    );
    for case in &cases {
        let text = case["text"].as_str().unwrap();
        let err = parse(text).expect_err(&format!("{} accepted: {text}", case["test"]));
        assert_eq!(
            err.line as u64,
            case["line"].as_u64().unwrap(),
            "{}: {err}",
            case["test"]
        );
        assert_eq!(
            err.field,
            case["field"].as_str().unwrap(),
            "{}: {err}",
            case["test"]
        );
        assert!(
            err.message.contains(case["needle"].as_str().unwrap()),
            "{}: {err}",
            case["test"]
        );
    }
}

/// BASE (IPv4 only), `[health]` with `health` lines from line 22, and a service on an
/// IPv6 VIP with one IPv6 real server (its `rs` lines after its `ip`).
fn ipv6_checked(base: &str, health: &str, rs: &str) -> String {
    format!(
        "{base}[health]\n{health}\n[[services]]\nproto = \"tcp\"\nvip = \"2001:db8:18::100\"\nport = 80\n\n[[services.real_servers]]\nip = \"2001:db8:1a::11\"\n{rs}"
    )
}

#[test]
fn an_ipv6_real_server_needs_an_ipv6_address_on_the_first_port() {
    let err = assert_rejected(
        &ipv6_checked(BASE, "check = \"tcp\"\n", ""),
        24,
        "services[0]",
        "is IPv6, but the first port has no IPv6 address",
    );
    assert!(
        err.message
            .contains("[2001:db8:1a::11]:80 (real_servers[0])")
            && err.message.contains("probes its tcp check"),
        "{err}"
    );
    // Without a check too: nothing would resolve its MAC.
    let err = assert_rejected(
        &ipv6_checked(
            BASE,
            "check = \"tcp\"\n",
            "  [services.real_servers.health]\n  check = \"none\"\n",
        ),
        24,
        "services[0]",
        "finds its MAC by Neighbor Discovery",
    );
    assert!(!err.message.contains("probes"), "{err}");
    // NAT64: IPv4 real servers behind the IPv6 VIP are found by ARP.
    let nat64 = format!(
        "{BASE}[[services]]\nproto = \"tcp\"\nvip = \"2001:db8:18::100\"\nport = 80\n\
         local_addresses = [\"198.18.0.50\"]\n\n[[services.real_servers]]\n\
         ip = \"198.18.0.11\"\nmode = \"fullnat\"\n"
    );
    parse(&nat64).unwrap();
    // With an IPv6 address on the first port it is accepted; the probes come from
    // the port's IPv6 addresses (or the one `source6` names).
    let dual = BASE.replace(
        "addresses = [\"198.18.0.1/24\"]",
        "addresses = [\"198.18.0.1/24\", \"2001:db8:18::1/64\", \"2001:db8:1a::1/64\"]",
    );
    let cfg = parse(&ipv6_checked(&dual, "check = \"tcp\"\n", "")).unwrap();
    assert_eq!(
        cfg.health_sources6(),
        [v6("2001:db8:18::1"), v6("2001:db8:1a::1")]
    );
    let cfg = parse(&ipv6_checked(&dual, "source6 = \"2001:db8:1a::1\"\n", "")).unwrap();
    assert_eq!(cfg.health_sources6(), [v6("2001:db8:1a::1")]);
    assert_rejected(
        &ipv6_checked(&dual, "source6 = \"2001:db8:1a::2\"\n", ""),
        22,
        "health.source6",
        "not an IPv6 address of the first port",
    );
    assert_rejected(
        &ipv6_checked(&dual, "source6 = \"198.18.0.1\"\n", ""),
        22,
        "health.source6",
        "expected an IPv6 address",
    );
}

#[test]
fn the_ipv4_probe_source_must_be_an_address_of_the_first_port() {
    let two = BASE.replace(
        "addresses = [\"198.18.0.1/24\"]",
        "addresses = [\"198.18.0.1/24\", \"198.18.2.1/24\"]",
    );
    let health = |base: &str, source: &str| format!("{base}[health]\nsource = \"{source}\"\n");
    // Unset: the first port's first address; set: any of the first port's.
    assert_eq!(
        parse(BASE).unwrap().health_source(),
        Some(Ipv4Addr::new(198, 18, 0, 1))
    );
    let cfg = parse(&health(&two, "198.18.2.1")).unwrap();
    assert_eq!(cfg.health_source(), Some(Ipv4Addr::new(198, 18, 2, 1)));
    // A typo: every probe would go out from an address nobody answers for.
    let err = assert_rejected(
        &health(BASE, "198.18.0.9"),
        22,
        "health.source",
        "198.18.0.9 is not an IPv4 address of the first port \"lan0\" (198.18.0.1/24)",
    );
    assert!(err.to_string().starts_with("test.toml:22:"), "{err}");
    // Probes leave through the first port only: another port's address is refused too.
    assert_rejected(
        &health(&two_ports("name", "name"), "198.18.1.1"),
        26,
        "health.source",
        "not an IPv4 address of the first port",
    );
    assert_rejected(
        &health(BASE, "2001:db8::1"),
        22,
        "health.source",
        "expected an IPv4 address",
    );
}

fn v6(s: &str) -> std::net::Ipv6Addr {
    s.parse().unwrap()
}

#[test]
fn icmp_error_rate_and_burst() {
    let s = |kv: &str| format!("{BASE}[sessions]\n{kv}\n");
    let limit = |text: &str| {
        let l = parse(text).unwrap().sessions.icmp_error_limit;
        (l.rate, l.burst)
    };
    assert_eq!(
        limit(BASE),
        (1000, 50),
        "Linux's icmp_msgs_per_sec and burst"
    );
    assert_eq!(
        limit(&s("icmp_error_rate = 20\nicmp_error_burst = 5")),
        (20, 5)
    );
    // A rate alone keeps the default burst, up to 10 times the rate.
    assert_eq!(limit(&s("icmp_error_rate = 2")), (2, 20));
    assert_eq!(limit(&s("icmp_error_rate = 200")), (200, 50));
    assert_rejected(
        &s("icmp_error_rate = 0"),
        22,
        "sessions.icmp_error_rate",
        "out of range",
    );
    assert_rejected(
        &s("icmp_error_rate = 10\nicmp_error_burst = 101"),
        23,
        "sessions.icmp_error_burst",
        "burst 101: 1 to 100 (10 times the rate)",
    );
}

#[test]
fn a_sorry_server_is_read_and_checked_as_a_real_server() {
    let cfg = parse(&service_with(
        "scheduler = \"rr\"",
        "scheduler = \"rr\"\nsorry_server = { ip = \"198.18.0.99\", inhibit = true }",
    ))
    .unwrap();
    let sorry = cfg.services[0].sorry_server.unwrap();
    assert_eq!(
        (sorry.ip, sorry.port, sorry.mode, sorry.inhibit),
        ("198.18.0.99".parse().unwrap(), 80, ForwardMode::Dr, true)
    );
    assert_eq!(cfg.services[0].real_servers.len(), 2);
    assert!(parse(BASE)
        .unwrap()
        .services
        .iter()
        .all(|s| s.sorry_server.is_none()));
    assert_rejected(
        &service_with(
            "scheduler = \"rr\"",
            "scheduler = \"rr\"\nsorry_server = { ip = \"198.18.0.12\" }",
        ),
        26,
        "services[0].sorry_server",
        "is also a real server of this service",
    );
    assert_rejected(
        &service_with(
            "scheduler = \"rr\"",
            "scheduler = \"rr\"\nsorry_server = { ip = \"198.18.0.99\", port = 8080 }",
        ),
        26,
        "services[0].sorry_server",
        "only nat and fullnat can map ports",
    );
    assert_rejected(
        &service_with(
            "scheduler = \"rr\"",
            "scheduler = \"rr\"\nsorry_server = { ip = \"198.18.0.99\", weight = 2 }",
        ),
        26,
        "services[0].sorry_server.weight",
        "unknown key `weight`",
    );
    // What the table would refuse is refused at the sorry server's place.
    assert_rejected(
        &format!(
            "{BASE}{}",
            SERVICE
                .replacen(
                    "scheduler = \"rr\"",
                    "scheduler = \"rr\"\nsynproxy = \"on\"\nsorry_server = { ip = \"198.18.0.99\" }",
                    1
                )
                .replacen("weight = 1", "weight = 1\nmode = \"nat\"", 1)
                .replacen("mode = \"dr\"", "mode = \"nat\"", 1)
        ),
        27,
        "services[0].sorry_server",
        "the SYN proxy needs nat or fullnat",
    );
    assert_rejected(
        &service_with(
            "scheduler = \"rr\"",
            "scheduler = \"rr\"\nlocal_addresses = [\"198.18.0.99\"]\nsorry_server = { ip = \"198.18.0.99\", mode = \"nat\" }",
        ),
        26,
        "services[0].local_addresses[0]",
        "is the sorry server of",
    );
}

#[test]
fn an_ipv6_service_persists_per_a_prefix_length() {
    let text = |netmask: &str| {
        format!(
            "{}[[services]]\nproto = \"tcp\"\nvip = \"2001:db8:18::100\"\nport = 80\n\
             scheduler = \"rr\"\npersistence_timeout = 60\n{netmask}\n\
             [[services.real_servers]]\nip = \"2001:db8:18::11\"\n",
            base_with(
                "\"198.18.0.1/24\"]",
                "\"198.18.0.1/24\", \"2001:db8:18::1/64\"]"
            )
        )
    };
    let cfg = parse(&text("persistence_netmask = 64")).unwrap();
    assert_eq!(
        cfg.services[0].persistence,
        Some(Persistence::with_prefix6(60, 64))
    );
    let cfg = parse(&text("")).unwrap();
    assert_eq!(
        cfg.services[0].persistence,
        Some(Persistence::with_prefix6(60, 128)),
        "per client address by default"
    );
    let field = "services[0].persistence_netmask";
    assert_rejected(
        &text("persistence_netmask = 0"),
        27,
        field,
        "out of range (1..=128)",
    );
    assert_rejected(
        &text("persistence_netmask = 129"),
        27,
        field,
        "out of range (1..=128)",
    );
    assert_rejected(
        &text("persistence_netmask = \"255.255.255.0\""),
        27,
        field,
        "an IPv6 service's prefix length: write an integer",
    );
    // An IPv4 service's stays dotted.
    let v4 = service_with(
        "scheduler = \"rr\"",
        "scheduler = \"rr\"\npersistence_timeout = 60\npersistence_netmask = 24",
    );
    assert_rejected(&v4, 27, field, "expected a string");
}

#[test]
fn an_ipv6_service_refuses_access_lists_and_rate_limits_it_would_not_enforce() {
    let text = |extra: &str| {
        format!(
            "{}[[services]]\nproto = \"tcp\"\nvip = \"2001:db8:18::100\"\nport = 80\n\
             scheduler = \"rr\"\n{extra}\n\
             [[services.real_servers]]\nip = \"2001:db8:18::11\"\n",
            base_with(
                "\"198.18.0.1/24\"]",
                "\"198.18.0.1/24\", \"2001:db8:18::1/64\"]"
            )
        )
    };
    parse(&text("")).unwrap();
    for (extra, field, needle) in [
        (
            "acl_allow = [\"10.0.0.0/8\"]",
            "acl_allow",
            "an access list is not supported on IPv6 services",
        ),
        (
            "acl_deny = [\"0.0.0.0/0\"]",
            "acl_deny",
            "an access list is not supported on IPv6 services",
        ),
        (
            "acl_file = \"rules.txt\"",
            "acl_file",
            "an access list is not supported on IPv6 services",
        ),
        (
            "rate_limit = 1",
            "rate_limit",
            "a per-source rate limit is not supported on IPv6 services",
        ),
    ] {
        assert_rejected(&text(extra), 26, &format!("services[0].{field}"), needle);
    }
}

#[test]
fn sloppy_tcp_is_off_by_default_tcp_only_and_not_with_fullnat() {
    assert!(parse(BASE).unwrap().services.iter().all(|s| !s.sloppy_tcp));
    let on = parse(&service_with(
        "scheduler = \"rr\"",
        "scheduler = \"mh\"\nsloppy_tcp = true",
    ))
    .unwrap();
    assert!(on.services[0].sloppy_tcp);
    assert!(
        !parse(&service_with("scheduler = \"rr\"", "scheduler = \"rr\""))
            .unwrap()
            .services[0]
            .sloppy_tcp
    );
    let udp = service_with("proto = \"tcp\"", "proto = \"udp\"").replacen(
        "scheduler = \"rr\"",
        "scheduler = \"rr\"\nsloppy_tcp = true",
        1,
    );
    assert_rejected(&udp, 26, "services[0].sloppy_tcp", "only a tcp service");
    assert_rejected(
        &service_with(
            "scheduler = \"rr\"",
            "scheduler = \"rr\"\nsloppy_tcp = true\nlocal_addresses = [\"198.18.0.50\"]",
        )
        .replacen("mode = \"dr\"", "mode = \"fullnat\"", 1),
        26,
        "services[0].sloppy_tcp",
        "cannot serve fullnat real server 198.18.0.12:80",
    );
    assert_rejected(
        &service_with(
            "scheduler = \"rr\"",
            "scheduler = \"rr\"\nsloppy_tcp = true\nlocal_addresses = [\"198.18.0.50\"]\n\
             sorry_server = { ip = \"198.18.0.99\", mode = \"fullnat\" }",
        ),
        26,
        "services[0].sloppy_tcp",
        "198.18.0.99:80 (its sorry_server)",
    );
    assert_rejected(
        &service_with(
            "scheduler = \"rr\"",
            "scheduler = \"rr\"\nsynproxy = \"on\"\nsloppy_tcp = true",
        )
        .replacen("mode = \"dr\"", "mode = \"nat\"", 1)
        .replacen("weight = 1", "weight = 1\nmode = \"nat\"", 1),
        27,
        "services[0].sloppy_tcp",
        "sloppy_tcp and synproxy exclude each other",
    );
    assert_rejected(
        &service_with(
            "scheduler = \"rr\"",
            "scheduler = \"rr\"\nsorry_server = { ip = \"198.18.0.99\", mode = \"fullnat\" }",
        ),
        21,
        "services[0].local_addresses",
        "sorry server 198.18.0.99:80 (services[0].sorry_server) uses mode fullnat",
    );
    assert_rejected(
        &service_with("scheduler = \"rr\"", "scheduler = \"rr\"\nsloppy_tcp = 1"),
        26,
        "services[0].sloppy_tcp",
        "expected a boolean",
    );
}

#[test]
fn bgp_section_parses_with_its_defaults() {
    let text = format!(
        "{BASE}[bgp]\ninclude = \"/run/sluice/bird-vips.conf\"\ncommunities = [\"65000:100\", \"65000:7\"]\n"
    );
    let cfg = parse(&text).unwrap_or_else(|e| panic!("{e}"));
    let bgp = cfg.bgp.unwrap();
    assert_eq!(bgp.include, PathBuf::from("/run/sluice/bird-vips.conf"));
    assert_eq!(bgp.socket, PathBuf::from("/run/bird/bird.ctl"));
    assert_eq!(bgp.birdc, PathBuf::from("birdc"));
    assert_eq!(bgp.protocol, "sluice");
    assert_eq!(bgp.communities, vec![(65000, 100), (65000, 7)]);
    assert_eq!(
        (
            bgp.timeout_ms,
            bgp.retry_ms,
            bgp.poll_ms,
            bgp.shutdown_grace_ms
        ),
        (5000, 2000, 1000, 2000)
    );
    assert!(parse(BASE).unwrap().bgp.is_none());
}

#[test]
fn bad_bgp_settings_name_their_field() {
    // BASE has 20 lines; [bgp] is line 21.
    assert_rejected(
        &format!("{BASE}[bgp]\nsocket = \"/run/bird/bird.ctl\"\n"),
        21,
        "bgp.include",
        "missing",
    );
    assert_rejected(
        &format!("{BASE}[bgp]\ninclude = \"bird-vips.conf\"\n"),
        22,
        "bgp.include",
        "absolute file path",
    );
    assert_rejected(
        &format!("{BASE}[bgp]\ninclude = \"/run/a\\\"b.conf\"\n"),
        22,
        "bgp.include",
        "cannot be named",
    );
    assert_rejected(
        &format!("{BASE}[bgp]\ninclude = \"/run/v.conf\"\nsocket = \"bird.ctl\"\n"),
        23,
        "bgp.socket",
        "absolute file path",
    );
    assert_rejected(
        &format!("{BASE}[bgp]\ninclude = \"/run/v.conf\"\nprotocol = \"4sluice\"\n"),
        23,
        "bgp.protocol",
        "BIRD symbol",
    );
    assert_rejected(
        &format!(
            "{BASE}[bgp]\ninclude = \"/run/v.conf\"\ncommunities = [\"65000:100\", \"70000:1\"]\n"
        ),
        23,
        "bgp.communities[1]",
        "not a BGP community",
    );
    assert_rejected(
        &format!("{BASE}[bgp]\ninclude = \"/run/v.conf\"\ntimeout_ms = 50\n"),
        23,
        "bgp.timeout_ms",
        "100",
    );
    assert_rejected(
        &format!("{BASE}[bgp]\ninclude = \"/run/v.conf\"\nhold_ms = 5\n"),
        23,
        "bgp.hold_ms",
        "unknown",
    );
}

#[test]
fn exception_interfaces() {
    // BASE, SECOND_PORT (lines 21-24), then [ports.exception] at line 25, keys from 26.
    let s = |kv: &str| format!("{BASE}{SECOND_PORT}[ports.exception]\n{kv}\n");
    let cfg = parse(&s("kind = \"tap\"")).unwrap();
    let e = cfg.ports[1].exception.clone().expect("the second port's");
    assert_eq!(
        (
            e.kind,
            e.interface.as_str(),
            e.rate,
            e.ring_size,
            e.kind_line
        ),
        (
            ExceptionKind::Tap,
            "sx-lan1",
            ExceptionConfig::DEFAULT_RATE,
            ExceptionConfig::DEFAULT_RING_SIZE,
            26
        )
    );
    assert!(cfg.ports[0].exception.is_none());
    assert!(cfg
        .eal_args()
        .windows(2)
        .any(|w| w == ["--vdev", "net_tap_sx1,iface=sx-lan1"]));
    let cfg = parse(&s(
        "kind = \"virtio-user\"\ninterface = \"bgp0\"\nrate = 500\nring_size = 256",
    ))
    .unwrap();
    let e = cfg.ports[1].exception.clone().unwrap();
    assert_eq!(
        (e.kind, e.rate, e.ring_size),
        (ExceptionKind::VirtioUser, 500, 256)
    );
    assert_eq!(
        e.vdev(1).1,
        "virtio_user_sx1,path=/dev/vhost-net,iface=bgp0,queue_size=256"
    );

    assert_rejected(
        &s("interface = \"x\""),
        25,
        "ports[1].exception.kind",
        "missing",
    );
    assert_rejected(
        &s("kind = \"kni\""),
        26,
        "ports[1].exception.kind",
        "\"kni\" is not a kind of kernel interface (expected \"tap\" or \"virtio-user\")",
    );
    assert_rejected(
        &s("kind = \"tap\"\ninterface = \"tap,iface=eth0\""),
        27,
        "ports[1].exception.interface",
        "contains ','",
    );
    assert_rejected(
        &s("kind = \"tap\"\ninterface = \"a-very-long-name0\""),
        27,
        "ports[1].exception.interface",
        "must be 1..=15 characters long",
    );
    assert_rejected(
        &s("kind = \"tap\"\nrate = 0"),
        27,
        "ports[1].exception.rate",
        "0 is out of range (1..=11800)",
    );
    // The management core writes 64 frames per 5 ms tick to the interface (12800/s),
    // 1000/s of which are the control budget's: a higher rate could never be met.
    let cfg = parse(&s("kind = \"tap\"\nrate = 11800")).unwrap();
    assert_eq!(cfg.ports[1].exception.as_ref().unwrap().rate, 11_800);
    for rate in ["11801", "10000000"] {
        assert_rejected(
            &s(&format!("kind = \"tap\"\nrate = {rate}")),
            27,
            "ports[1].exception.rate",
            &format!(
                "{rate} frames/s is more than the management core writes to the kernel \
                 interface: at most 11800 (64 frames per 5 ms tick, 12800/s, less the \
                 1000/s of the control budget for BGP, BFD and ARP)"
            ),
        );
    }
    assert_rejected(
        &s("kind = \"tap\"\nring_size = 1000"),
        27,
        "ports[1].exception.ring_size",
        "1000 is not a power of two (64..=16384)",
    );
    assert_rejected(
        &s("kind = \"tap\"\nqueues = 2"),
        27,
        "ports[1].exception.queues",
        "unknown",
    );
    // The loopback port has no kernel side; two ports cannot share an interface.
    assert_rejected(
        &base_with(
            "addresses = [\"198.18.0.1/24\"]\n",
            "addresses = [\"198.18.0.1/24\"]\n[ports.exception]\nkind = \"tap\"\n",
        ),
        18,
        "ports[0].exception",
        "a loopback port has no kernel side",
    );
    let two = format!(
        "{BASE}{SECOND_PORT}[ports.exception]\nkind = \"tap\"\ninterface = \"k0\"\n\
         [[ports]]\nname = \"lan2\"\nvdev = \"net_null1\"\naddresses = [\"198.18.2.1/24\"]\n\
         [ports.exception]\nkind = \"tap\"\ninterface = \"k0\"\n"
    );
    assert_rejected(
        &two,
        32,
        "ports[2].exception",
        "kernel interface \"k0\" is already used by ports[1].exception",
    );
}

/// `Config::locate` finds a value where the text has it, through tables, arrays of
/// tables, array elements, dotted keys and inline tables; a field left to its default
/// has no place.
#[test]
fn a_field_is_located_at_its_value() {
    let cfg = parse(&format!("{BASE}{SERVICE}")).unwrap();
    assert_eq!(cfg.locate("lcores.workers"), Some((8, 11)));
    assert_eq!(cfg.locate("lcores.workers[0]"), Some((8, 12)));
    assert_eq!(cfg.locate("ports[0].mac"), Some((16, 7)));
    assert_eq!(
        cfg.locate("services[0].real_servers[1].mode"),
        Some((33, 8))
    );
    assert_eq!(cfg.locate("sessions.capacity"), None);
    assert_eq!(cfg.locate("lcores.workers[1]"), None);
    assert_eq!(cfg.locate("ports[3].mac"), None);
    assert_eq!(cfg.place("sessions.capacity"), "test.toml");
    assert_eq!(cfg.place("lcores.workers[0]"), "test.toml:8:12");
    let dotted = parse(&format!("sessions.capacity = 4096\n{BASE}")).unwrap();
    assert_eq!(dotted.locate("sessions.capacity"), Some((1, 21)));
    assert_eq!(dotted.locate("lcores.workers[0]"), Some((9, 12)));
    let inline = format!(
        "control = {{ socket = \"/run/sluice/x.sock\" }}\n{}",
        BASE.replace("[control]\nsocket = \"/run/sluice/test.sock\"", "")
    );
    let cfg = parse(&inline).unwrap();
    assert_eq!(cfg.locate("control.socket"), Some((1, 22)));
}

/// `ports[].static_neighbours = [{ address, mac }]`.
fn with_static(list: &str) -> String {
    base_with(
        "addresses",
        &format!("static_neighbours = [{list}]\naddresses"),
    )
}

#[test]
fn static_neighbours_are_read() {
    let cfg = parse(&with_static(
        r#"{ address = "198.18.0.20", mac = "02:00:00:00:00:14" }, { address = "fe80::14", mac = "02:00:00:00:00:15" }"#,
    ))
    .unwrap();
    assert_eq!(
        cfg.ports[0].static_neighbours,
        [
            super::StaticNeighbour {
                address: "198.18.0.20".parse().unwrap(),
                mac: [2, 0, 0, 0, 0, 0x14]
            },
            super::StaticNeighbour {
                address: "fe80::14".parse().unwrap(),
                mac: [2, 0, 0, 0, 0, 0x15]
            },
        ]
    );
    assert!(parse(BASE).unwrap().ports[0].static_neighbours.is_empty());
}

#[test]
fn static_neighbours_are_checked() {
    let one = |address: &str, mac: &str| {
        with_static(&format!(r#"{{ address = "{address}", mac = "{mac}" }}"#))
    };
    let mac = "02:00:00:00:00:14";
    let (at, mac_at) = (
        "ports[0].static_neighbours[0].address",
        "ports[0].static_neighbours[0].mac",
    );
    for (address, given, field, error) in [
        ("10.0.0.1", mac, at, "is on none of this port's subnets"),
        ("198.18.0.255", mac, at, "is on none of this port's subnets"),
        ("2001:db8::1", mac, at, "is on none of this port's subnets"),
        ("198.18.0.1", mac, at, "is one of this port's own addresses"),
        ("gateway", mac, at, "is not an IPv4 or IPv6 address"),
        (
            "198.18.0.20",
            "01:00:5e:00:00:01",
            mac_at,
            "is not a unicast MAC",
        ),
        (
            "198.18.0.20",
            "00:00:00:00:00:00",
            mac_at,
            "is not a unicast MAC",
        ),
        (
            "198.18.0.20",
            "02:00:00:00:14",
            mac_at,
            "is not a MAC address",
        ),
    ] {
        assert_rejected(&one(address, given), 17, field, error);
    }
    let twice = with_static(&format!(
        r#"{{ address = "198.18.0.20", mac = "{mac}" }}, {{ address = "198.18.0.20", mac = "02:00:00:00:00:15" }}"#
    ));
    assert_rejected(
        &twice,
        17,
        "ports[0].static_neighbours[1].address",
        "198.18.0.20 is given twice (first at static_neighbours[0])",
    );
    // The workers' tables are keyed by address alone: not on two ports either.
    let both = two_ports(
        "addresses",
        &format!("static_neighbours = [{{ address = \"fe80::14\", mac = \"{mac}\" }}]\naddresses"),
    )
    .replacen(
        "addresses = [\"198.18.0.1/24\"]",
        &format!("static_neighbours = [{{ address = \"fe80::14\", mac = \"{mac}\" }}]\naddresses = [\"198.18.0.1/24\"]"),
        1,
    );
    assert_rejected(
        &both,
        25,
        "ports[1].static_neighbours[0].address",
        "fe80::14 is a static neighbour of another port too (ports[0].static_neighbours[0].address)",
    );
    // Within an eighth of sessions.neighbours per family.
    let many = format!(
        "{}\n[sessions]\nneighbours = 256\n",
        with_static(
            &(20..53)
                .map(|i| format!(r#"{{ address = "198.18.0.{i}", mac = "{mac}" }}"#))
                .collect::<Vec<_>>()
                .join(", ")
        )
    );
    assert_rejected(
        &many,
        17,
        "ports[0].static_neighbours[32].address",
        "more than 32 static neighbours of one address family",
    );
}

/// On a /31 (RFC 3021) both addresses are hosts: the other end is a neighbour.
#[test]
fn a_static_neighbour_may_be_the_other_end_of_a_31() {
    let text = base_with(
        "addresses = [\"198.18.0.1/24\"]",
        "static_neighbours = [{ address = \"10.0.0.1\", mac = \"02:00:00:00:00:14\" }]\naddresses = [\"198.18.0.1/24\", \"10.0.0.0/31\"]",
    );
    let cfg = parse(&text).unwrap();
    assert_eq!(
        cfg.ports[0].static_neighbours[0].address,
        "10.0.0.1".parse::<std::net::IpAddr>().unwrap()
    );
}
