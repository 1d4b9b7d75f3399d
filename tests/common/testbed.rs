//! The network-namespace test bed of `scripts/testbed.sh`: [`Testbed`] builds one
//! with a unique name and removes it on `Drop`, also when the test panics.

use super::process::{
    netns_exec, repo_root, require_root, run_bounded, unique_tag, CmdOutput, PYTHON,
};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// `scripts/testbed.sh`.
pub fn testbed_script() -> PathBuf {
    repo_root().join("scripts/testbed.sh")
}

/// A test bed from `scripts/testbed.sh` (see the script's header for the layout):
/// switch namespace, client, N real servers, and the appliance's namespace with its
/// unaddressed veth. Removed by `Drop` (even when the test panics) or by [`down`].
///
/// [`down`]: Testbed::down
pub struct Testbed {
    pub name: String,
    facts: BTreeMap<String, String>,
    is_up: bool,
}

impl Testbed {
    /// Builds a test bed with a fresh unique name and `real_servers` real servers.
    pub fn up(real_servers: u32) -> Testbed {
        require_root();
        // "t" + 7 characters: the script allows [a-z0-9]{1,8}.
        let name = format!("t{}", unique_tag());
        let out = run_bounded(
            Command::new(testbed_script()).args(["up", &name, &real_servers.to_string()]),
            Duration::from_secs(60),
        );
        if !out.success() {
            // The script removes a half-built bed itself; make sure anyway.
            let _ = run_testbed_down(&name);
            panic!("testbed up {name} failed: {}", out.describe());
        }
        let facts: BTreeMap<String, String> = out
            .stdout
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect();
        let bed = Testbed {
            name,
            facts,
            is_up: true,
        };
        assert_eq!(
            bed.fact("TESTBED"),
            bed.name,
            "testbed up printed: {}",
            out.stdout
        );
        bed
    }

    /// A `KEY=VALUE` fact printed by `testbed.sh up` (panics if absent).
    pub fn fact(&self, key: &str) -> &str {
        self.facts.get(key).unwrap_or_else(|| {
            panic!(
                "testbed {}: no fact {key} (have {:?})",
                self.name, self.facts
            )
        })
    }

    pub fn facts(&self) -> &BTreeMap<String, String> {
        &self.facts
    }

    pub fn lb_ns(&self) -> &str {
        self.fact("LB_NS")
    }
    pub fn lb_if(&self) -> &str {
        self.fact("LB_IF")
    }
    pub fn lb_mac(&self) -> &str {
        self.fact("LB_MAC")
    }
    pub fn appliance_ip(&self) -> &str {
        self.fact("APPLIANCE_IP")
    }
    pub fn client_ns(&self) -> &str {
        self.fact("CLIENT_NS")
    }
    pub fn client_if(&self) -> &str {
        self.fact("CLIENT_IF")
    }
    pub fn client_ip(&self) -> &str {
        self.fact("CLIENT_IP")
    }

    /// Number of real servers (`RS_COUNT`).
    pub fn rs_count(&self) -> u32 {
        self.fact("RS_COUNT").parse().expect("RS_COUNT is a number")
    }
    /// Namespace of real server `i` (1-based).
    pub fn rs_ns(&self, i: u32) -> &str {
        self.fact(&format!("RS{i}_NS"))
    }
    pub fn rs_ip(&self, i: u32) -> &str {
        self.fact(&format!("RS{i}_IP"))
    }
    pub fn rs_if(&self, i: u32) -> &str {
        self.fact(&format!("RS{i}_IF"))
    }
    pub fn rs_mac(&self, i: u32) -> &str {
        self.fact(&format!("RS{i}_MAC"))
    }

    /// Runs `scripts/testbed.sh CMD NAME ARGS...` (one of the set-up subcommands
    /// `dr-vip`, `rs-gateway`, `client-addr`), bounded; panics on failure. `KEY=VALUE`
    /// lines it prints update the bed's facts (`client-addr` prints `CLIENT_IP`).
    pub fn configure(&mut self, cmd: &str, args: &[&str]) -> CmdOutput {
        let out = run_bounded(
            Command::new(testbed_script())
                .arg(cmd)
                .arg(&self.name)
                .args(args),
            Duration::from_secs(60),
        )
        .expect_success(&format!("testbed.sh {cmd} {}", self.name));
        for (k, v) in out.stdout.lines().filter_map(|l| l.split_once('=')) {
            self.facts
                .insert(k.trim().to_string(), v.trim().to_string());
        }
        out
    }

    /// IPv6 on in namespace `ns` on `ifname` (and lo), with `addr` (`A/LEN`; no
    /// duplicate address detection: the test owns the link). The bed itself runs with
    /// IPv6 off everywhere.
    pub fn ipv6_on(&self, ns: &str, ifname: &str, addr: &str) {
        let ten = Duration::from_secs(10);
        for sysctl in [
            "net.ipv6.conf.all.disable_ipv6=0".to_string(),
            format!("net.ipv6.conf.{ifname}.disable_ipv6=0"),
            "net.ipv6.conf.lo.disable_ipv6=0".to_string(),
        ] {
            self.exec(ns, &["sysctl", "-qw", &sysctl], ten)
                .expect_success("sysctl");
        }
        self.exec(
            ns,
            &["ip", "-6", "addr", "add", addr, "dev", ifname, "nodad"],
            ten,
        )
        .expect_success("ip -6 addr add");
    }

    /// An IPv6 DR real server in `ns`: it holds `vip` on lo (Linux answers Neighbor
    /// Discovery only for addresses of the interface asked), and its replies, from
    /// the VIP, go straight to `client_net` on `ifname` (a table of their own).
    pub fn ipv6_dr_vip(&self, ns: &str, ifname: &str, vip: &str, client_net: &str) {
        let vip128 = format!("{vip}/128");
        for cmd in [
            &["addr", "add", &vip128, "dev", "lo"][..],
            &["rule", "add", "from", vip, "table", "100"],
            &["route", "add", client_net, "dev", ifname, "table", "100"],
        ] {
            let argv: Vec<&str> = ["ip", "-6"].iter().chain(cmd).copied().collect();
            self.exec(ns, &argv, Duration::from_secs(10))
                .expect_success("ipv6 DR real server");
        }
    }

    /// Runs a command inside one of this bed's namespaces, bounded.
    pub fn exec(&self, ns: &str, args: &[&str], timeout: Duration) -> CmdOutput {
        assert!(
            ns.starts_with(&format!("{}-", self.name)),
            "namespace {ns} is not part of test bed {}",
            self.name
        );
        netns_exec(ns, args, timeout)
    }

    /// Whether interface `ifname` in namespace `ns` holds IPv4 address `addr` (any
    /// prefix length).
    pub fn has_addr(&self, ns: &str, ifname: &str, addr: &str) -> bool {
        let out = self
            .exec(
                ns,
                &["ip", "-o", "-4", "addr", "show", "dev", ifname],
                Duration::from_secs(10),
            )
            .expect_success("ip addr show");
        out.stdout
            .split_whitespace()
            .any(|w| w.split('/').next() == Some(addr))
    }

    /// The MAC addresses (lowercase) that answer one broadcast ARP request for
    /// `target` sent by `sender` from `ifname` in namespace `ns`, collected for 1 s
    /// (scapy), sorted.
    pub fn arp_repliers(&self, ns: &str, ifname: &str, sender: &str, target: &str) -> Vec<String> {
        const SCRIPT: &str = r#"
import sys
from scapy.all import Ether, ARP, srp, conf, get_if_hwaddr
conf.verb = 0
iface, sender, target = sys.argv[1:4]
mac = get_if_hwaddr(iface)
ans, _ = srp(Ether(src=mac, dst="ff:ff:ff:ff:ff:ff")/ARP(op=1, hwsrc=mac, psrc=sender, pdst=target),
             iface=iface, timeout=1, multi=True)
for _, r in ans:
    print(r[ARP].hwsrc.lower())
"#;
        let out = self
            .exec(
                ns,
                &[PYTHON, "-c", SCRIPT, ifname, sender, target],
                Duration::from_secs(20),
            )
            .expect_success("scapy ARP request");
        let mut macs: Vec<String> = out.stdout.lines().map(|l| l.trim().to_string()).collect();
        macs.sort();
        macs.dedup();
        macs
    }

    /// The link-layer address the kernel of namespace `ns` holds for `ip` on
    /// `ifname` (`ip neigh`), if any.
    pub fn neighbour_mac(&self, ns: &str, ifname: &str, ip: &str) -> Option<String> {
        let out = self
            .exec(
                ns,
                &["ip", "neigh", "show", ip, "dev", ifname],
                Duration::from_secs(10),
            )
            .expect_success("ip neigh show");
        let words: Vec<&str> = out.stdout.split_whitespace().collect();
        words
            .iter()
            .position(|w| *w == "lladdr")
            .and_then(|i| words.get(i + 1))
            .map(|m| m.to_lowercase())
    }

    /// Every namespace on the host whose name belongs to this bed.
    pub fn namespaces_left(&self) -> Vec<String> {
        namespaces_named(&self.name)
    }

    /// Removes the bed now (idempotent) and returns the script's output.
    pub fn down(&mut self) -> CmdOutput {
        self.is_up = false;
        run_testbed_down(&self.name)
    }
}

impl Drop for Testbed {
    fn drop(&mut self) {
        if self.is_up {
            let out = run_testbed_down(&self.name);
            if !out.success() {
                eprintln!(
                    "warning: testbed down {} failed: {}",
                    self.name,
                    out.describe()
                );
            }
        }
    }
}

fn run_testbed_down(name: &str) -> CmdOutput {
    run_bounded(
        Command::new(testbed_script()).args(["down", name]),
        Duration::from_secs(60),
    )
}

/// Names in `ip netns list` that are `NAME` or start with `NAME-`.
pub fn namespaces_named(name: &str) -> Vec<String> {
    let out = run_bounded(
        Command::new("ip").args(["netns", "list"]),
        Duration::from_secs(10),
    )
    .expect_success("ip netns list");
    out.stdout
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|ns| *ns == name || ns.starts_with(&format!("{name}-")))
        .map(str::to_string)
        .collect()
}
