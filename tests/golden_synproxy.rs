//! Tier 2, golden packets for the SYN proxy (`synproxy = "on"`, docs/SYNPROXY.md): a
//! NAT and a FullNAT TCP service, one real server each. Four connections go through
//! the proxied handshake: a Linux client (MSS, SACK-permitted, timestamps, window
//! scale 7) to a Linux server, with data and SACK blocks both ways and a close; a
//! client without timestamps (MSS 1380 only); a FullNAT connection whose server scales
//! by 5 and whose sequence numbers wrap; a server that offers no window scale. A fifth
//! SYN is answered and then three forged ACKs (a hash bit of the cookie flipped,
//! another ISN, another client port) are dropped as invalid.
//!
//! Client data before the real server's SYN-ACK (docs/SYNPROXY.md): a whole initial
//! window (an upload's headers, eight body segments, the FIN) held, none of it sent
//! as the SYN again, then sent translated after the ACK that completes
//! the server's handshake; a held request retransmitted (the SYN again, the data
//! delivered once); a FullNAT cookie ACK that carries the request (its copy is the
//! SYN; the data follows the ACK); a server that never answers (its held request
//! dropped as `server_unanswered` after 3 s, while the rest plays).
//!
//! The cookie is a keyed hash under a secret Sluice draws per process, and the client's
//! ACK must carry it, so the input cannot be written in advance (and no test-only
//! fixed secret exists): `tests/tools/golden_synproxy.py run` plays client and real
//! servers live, frame by frame, on the test bed's client veth while Sluice receives on
//! the appliance veth (`net_pcap`, `rx_iface_in=`) and writes what it sends to
//! `out.pcap` (`tx_pcap=`). The tool reads each cookie (and FullNAT's LIP:lport) from
//! Sluice's output and builds the session's later frames with it. `check` rebuilds the
//! input from the script and those bindings, checks what it can recompute of each
//! cookie (MSS index, time slot of the cookie TSval, the client's options in the TSval,
//! the TSval on the wall clock) and runs golden_forwarding.py's checker on the output
//! (scapy and tshark, every field and checksum, order, nothing extra but Sluice's ARP
//! requests for real servers). Counters (drops, events including every `synproxy_*`,
//! sessions, per real server) are compared exactly.
//!
//! Run: `cargo test --release --test integration golden_synproxy::` (as root).

use crate::common::*;

const FULLNAT_VIP: &str = "198.18.0.242";
const LIP: &str = "198.18.0.61";

/// The checker must accept the expected frames and reject broken outputs and broken
/// cookies (see `golden_synproxy.py selftest`). Needs scapy and tshark, not root.
#[test]
fn golden_synproxy_checker_rejects_broken_output() {
    assert_checker_selftest("golden_synproxy.py", 44);
}

#[test]
fn golden_synproxy_handshake_translation_and_counters() {
    require_root();
    let mut run = run_live_golden("golden_synproxy.py", 84, 75);
    for (reason, n) in [
        ("server_unanswered", 1),
        ("client_reset", 2),
        ("reset_out_of_window", 2),
    ] {
        if run.expect["drops"][reason].as_u64() != Some(n) {
            run.problems
                .fail(format!("the expectations do not name drops.{reason} = {n}"));
        }
    }
    // The SYN proxy's counters must be among those compared exactly.
    for event in [
        "synproxy_cookies_sent",
        "synproxy_cookies_valid",
        "synproxy_cookies_invalid",
        "synproxy_cookies_expired",
        "synproxy_connections",
        "synproxy_syn_resent",
        "synproxy_data_held",
        "synproxy_data_sent",
        "synproxy_client_reset",
    ] {
        if run.expect["events"][event].as_u64().is_none() {
            run.problems
                .fail(format!("the expectations do not name events.{event}"));
        }
    }
    let service = find_service(&run.list, "tcp", FULLNAT_VIP, 80)
        .unwrap_or_else(|| panic!("no service tcp {FULLNAT_VIP}:80: {:#}", run.list));
    if service["local_addresses"] != serde_json::json!([LIP]) {
        let got = service["local_addresses"].clone();
        run.problems.fail(format!(
            "tcp {FULLNAT_VIP}:80: local_addresses {got}, expected [{LIP}]"
        ));
    }
    run.assert_passed();
}
