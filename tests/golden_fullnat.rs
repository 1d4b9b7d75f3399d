//! Tier 2, golden packets for FullNAT (`mode = "fullnat"`, DPVS's `-b`): a TCP and a
//! UDP service on one VIP, rr over two real servers, two local addresses (LIPs). A
//! client opens three TCP connections (one complete: handshake, data both ways, FIN
//! both ways; two left established, one of them to the same real server on the same
//! LIP as the first) and three UDP flows (a reply, a port unreachable from the real
//! server, a port unreachable from the client about a reply, a datagram without
//! checksum); the real servers resolve the LIPs (ARP) and ping one; a few frames are
//! dropped on purpose (no session, no service, an ARP for an address that is not
//! Sluice's, an ICMP error quoting no session).
//!
//! The local port of a session is Sluice's choice, and the real server must reply to
//! it, so the input cannot be written in advance: `tests/tools/golden_fullnat.py run`
//! plays client and real servers live, frame by frame, on the test bed's client veth
//! while Sluice receives on the appliance veth (`net_pcap`, `rx_iface_in=`) and writes
//! what it sends to `out.pcap` (`tx_pcap=`). The tool learns each session's LIP:lport
//! from its first output and addresses the real server's frames to it. Then `check`
//! rebuilds the input from the script and those bindings, checks the bindings (LIP of
//! the service, round robin; lport in 1024..=65535, distinct per concurrent session
//! towards one real server) and runs golden_forwarding.py's checker on the output
//! (scapy and tshark, every field and checksum, order, nothing extra but Sluice's own
//! ARP requests for real servers). Counters (drops, events, sessions, per real
//! server) are compared with the expectations here.
//!
//! Run: `cargo test --release --test integration golden_fullnat::` (as root).

use crate::common::*;

const VIP: &str = "198.18.0.240";
const LIPS: [&str; 2] = ["198.18.0.50", "198.18.0.51"];

/// The checker must accept the expected frames and reject broken outputs and broken
/// bindings (see `golden_fullnat.py selftest`). Needs scapy and tshark, not root.
#[test]
fn golden_fullnat_checker_rejects_broken_output() {
    assert_checker_selftest("golden_fullnat.py", 20);
}

#[test]
fn golden_fullnat_both_directions_icmp_arp_and_counters() {
    require_root();
    let mut run = run_live_golden("golden_fullnat.py", 35, 30);
    // The services' LIPs, as configured.
    for (proto, port) in [("tcp", 80), ("udp", 3333)] {
        let service = find_service(&run.list, proto, VIP, port)
            .unwrap_or_else(|| panic!("no service {proto} {VIP}:{port}: {:#}", run.list));
        if service["local_addresses"] != serde_json::json!(LIPS) {
            let got = service["local_addresses"].clone();
            run.problems.fail(format!(
                "{proto} {VIP}:{port}: local_addresses {got}, expected {LIPS:?}"
            ));
        }
    }
    run.assert_passed();
}
