//! Config loading: one test per error class (each checks the field path and the line),
//! the example files, and the EAL argv.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use super::*;

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
    err
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
            "-a",
            "0000:03:00.0",
            "--log-level=lib.eal:notice",
        ])
    );
}
