//! Golden-packet runs: comparing the daemon's counters with the expectations a golden
//! tool writes (`tests/tools/golden_forwarding.py`'s format, also written by
//! `golden_fullnat.py`).

use super::daemon::{drop_count, event_count, real_server, rs_counter};
use std::collections::BTreeMap;

/// Counter mismatches, collected so that one run reports all of them.
#[derive(Default, Debug)]
pub struct Mismatches(pub Vec<String>);

impl Mismatches {
    pub fn eq(&mut self, what: String, got: u64, want: u64) {
        if got != want {
            self.0.push(format!("{what}: got {got}, expected {want}"));
        }
    }

    pub fn fail(&mut self, what: String) {
        self.0.push(what);
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn report(&self) -> String {
        self.0.join("\n  ")
    }
}

/// Compares `sluicectl status --json` (`status`) and `sluicectl -L -n --stats --json`
/// (`list`) with a golden tool's expectations (`expect`): every drop reason exactly
/// (those the tool does not name must be 0, and every one it names must be reported),
/// `events`, `neighbours` (= `events.neighbour_learned`), `sessions`,
/// `sessions_created` and `sessions_expired`, and per entry of `real_servers` ({rip,
/// vip, mode, services: [[proto, port]...], connections, active, inactive, in_min,
/// in_max, out_min, out_max}, summed over its services): exact connections, active and
/// inactive, packets within bounds, at least 40 bytes a packet, and the mode.
pub fn golden_counter_mismatches(
    status: &serde_json::Value,
    list: &serde_json::Value,
    expect: &serde_json::Value,
) -> Mismatches {
    let mut m = Mismatches::default();
    let want_drops: BTreeMap<String, u64> = expect["drops"]
        .as_object()
        .expect("expectations have `drops`")
        .iter()
        .map(|(k, v)| (k.clone(), v.as_u64().unwrap()))
        .collect();
    let got_drops = status["drops"]
        .as_object()
        .expect("status.drops is an object");
    for reason in want_drops.keys() {
        if !got_drops.contains_key(reason) {
            m.fail(format!("drops.{reason}: not reported by sluicectl status"));
        }
    }
    let mut reasons: Vec<&String> = want_drops.keys().chain(got_drops.keys()).collect();
    reasons.sort();
    reasons.dedup();
    for reason in reasons {
        let want = want_drops.get(reason).copied().unwrap_or(0);
        m.eq(format!("drops.{reason}"), drop_count(status, reason), want);
    }
    for (event, want) in expect["events"]
        .as_object()
        .expect("expectations have `events`")
    {
        m.eq(
            format!("events.{event}"),
            event_count(status, event),
            want.as_u64().unwrap(),
        );
    }
    m.eq(
        "neighbours".into(),
        status["neighbours"].as_u64().unwrap_or(u64::MAX),
        expect["events"]["neighbour_learned"].as_u64().unwrap(),
    );
    for field in ["sessions", "sessions_created", "sessions_expired"] {
        m.eq(
            field.into(),
            status[field].as_u64().unwrap_or(u64::MAX),
            expect[field].as_u64().unwrap(),
        );
    }
    for want in expect["real_servers"].as_array().expect("`real_servers`") {
        let rip = want["rip"].as_str().unwrap();
        let vip = want["vip"].as_str().unwrap();
        let mode = want["mode"].as_str().unwrap();
        let services: Vec<(String, u16)> = want["services"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| (s[0].as_str().unwrap().into(), s[1].as_u64().unwrap() as u16))
            .collect();
        let mut sum = |field: &str| -> u64 {
            services
                .iter()
                .map(|(proto, port)| {
                    let rs = real_server(list, proto, vip, *port, rip);
                    if rs["mode"] != mode {
                        m.fail(format!(
                            "{proto} {vip}:{port} -> {rip}: mode {}",
                            rs["mode"]
                        ));
                    }
                    rs_counter(rs, field)
                })
                .sum()
        };
        let (conns, active, inactive) = (sum("connections"), sum("active"), sum("inactive"));
        let (inp, outp) = (sum("in_packets"), sum("out_packets"));
        let (in_bytes, out_bytes) = (sum("in_bytes"), sum("out_bytes"));
        let n = |k: &str| want[k].as_u64().unwrap();
        let what = format!("real server {rip} of {vip} {services:?} ({mode})");
        m.eq(format!("{what} connections"), conns, n("connections"));
        m.eq(format!("{what} active"), active, n("active"));
        m.eq(format!("{what} inactive"), inactive, n("inactive"));
        for (field, got, lo, hi) in [
            ("in_packets", inp, n("in_min"), n("in_max")),
            ("out_packets", outp, n("out_min"), n("out_max")),
        ] {
            if !(lo..=hi).contains(&got) {
                m.fail(format!("{what} {field}: {got}, expected {lo}..={hi}"));
            }
        }
        for (field, bytes, packets) in [("in_bytes", in_bytes, inp), ("out_bytes", out_bytes, outp)]
        {
            if bytes < 40 * packets || (packets == 0) != (bytes == 0) {
                m.fail(format!("{what} {field}: {bytes} for {packets} packets"));
            }
        }
    }
    m
}
