//! What Sluice writes for BIRD 2 and what it reads back from `birdc`: the include file
//! of static routes (one `protocol static` per address family, the announced VIPs as
//! /32 and /128 routes) and the table of `birdc show protocols`.
use std::net::IpAddr;

/// A BGP community `(ASN, VALUE)` that BIRD attaches to every announced VIP.
pub type Community = (u16, u16);

/// The include file for the VIPs in `announced`: `protocol static PREFIX4` with the
/// IPv4 ones as /32 routes and `protocol static PREFIX6` with the IPv6 ones as /128
/// routes, both always present (so a withdrawal of the last VIP is a reconfigure that
/// empties the protocol, not one that removes it). The routes are `blackhole`: they
/// exist to be exported by BGP; the node's BIRD must not export them to its kernel
/// (the sample config/bird-node.conf has no kernel protocol for them).
pub fn render_include(protocol: &str, announced: &[IpAddr], communities: &[Community]) -> String {
    let attrs = if communities.is_empty() {
        String::new()
    } else {
        let adds: String = communities
            .iter()
            .map(|(asn, value)| format!(" bgp_community.add(({asn}, {value}));"))
            .collect();
        format!(" {{{adds} }}")
    };
    let mut out = String::from(
        "# Written by Sluice: the VIPs this node announces. Rewritten whole on every change;\n\
         # do not edit (see docs/CLUSTER.md).\n",
    );
    for (suffix, family, v6) in [("4", "ipv4", false), ("6", "ipv6", true)] {
        out.push_str(&format!(
            "protocol static {protocol}{suffix} {{\n  {family};\n"
        ));
        for vip in announced.iter().filter(|a| a.is_ipv6() == v6) {
            let len = if v6 { 128 } else { 32 };
            out.push_str(&format!("  route {vip}/{len} blackhole{attrs};\n"));
        }
        out.push_str("}\n");
    }
    out
}

/// One row of `birdc show protocols`.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct BirdProtocol {
    pub name: String,
    /// `BGP`, `BFD`, `Static`, `Device`, `Kernel`, ...
    pub proto: String,
    /// `---` for protocols without a table (BGP has its tables in its channels).
    pub table: String,
    /// `up`, `down`, `start`, `stop`.
    pub state: String,
    /// When the state was entered, as BIRD prints it (its `timeformat protocol`).
    pub since: String,
    /// For BGP the session state (`Established`, `Active`, `Connect`, `Idle`) and the
    /// last error, as BIRD prints it.
    pub info: String,
}

/// Parses the text `birdc show protocols` prints (with or without its
/// `BIRD x.y ready.` greeting; not `-v` output). The columns are split on white
/// space, the `Since` column may hold a date and a time (BIRD's formats for older
/// events), and `Info` is the rest of the line. Lines that are not a row (the header,
/// blank lines) are skipped; a row with fewer than five columns is an error naming
/// the line.
pub fn parse_protocols(text: &str) -> Result<Vec<BirdProtocol>, String> {
    let mut rows = Vec::new();
    let mut header = false;
    for (n, line) in text.lines().enumerate() {
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.is_empty() || (words[0] == "BIRD" && line.trim_end().ends_with("ready.")) {
            continue;
        }
        if words[..words.len().min(2)] == ["Name", "Proto"] {
            header = true;
            continue;
        }
        if !header {
            return Err(format!(
                "line {}: {line:?} before the `Name Proto Table State Since Info` header",
                n + 1
            ));
        }
        if words.len() < 5 {
            return Err(format!(
                "line {}: {line:?} has {} column(s), expected at least 5 (Name Proto Table State Since)",
                n + 1,
                words.len()
            ));
        }
        let mut rest = 5;
        let mut since = words[4].to_string();
        // `2026-12-03 06:23:34` (iso long) or a date followed by a time.
        if words.len() > 5 && looks_like_date(words[4]) && looks_like_time(words[5]) {
            since = format!("{} {}", words[4], words[5]);
            rest = 6;
        }
        rows.push(BirdProtocol {
            name: words[0].to_string(),
            proto: words[1].to_string(),
            table: words[2].to_string(),
            state: words[3].to_string(),
            since,
            info: words[rest..].join(" "),
        });
    }
    if !header {
        return Err(
            "no `Name Proto Table State Since Info` header: not `show protocols` output".into(),
        );
    }
    Ok(rows)
}

fn looks_like_date(w: &str) -> bool {
    let b = w.as_bytes();
    b.len() == 10 && b[4] == b'-' && b[7] == b'-'
}

fn looks_like_time(w: &str) -> bool {
    let b = w.as_bytes();
    b.len() >= 8 && b[2] == b':' && b[5] == b':'
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Recorded from BIRD 2.0.12 (Debian 12's bird2) by the namespace test bed of
    /// tests/e2e_bgp.rs: a node with an established session to its router, BFD, the
    /// static protocols Sluice writes, and a second neighbour that does not answer.
    const SHOW_PROTOCOLS: &str = include_str!("../../../tests/fixtures/bird/show-protocols.txt");

    #[test]
    fn parses_a_real_show_protocols() {
        let rows = parse_protocols(SHOW_PROTOCOLS).unwrap();
        let bgp: Vec<_> = rows.iter().filter(|r| r.proto == "BGP").collect();
        assert!(bgp.len() >= 2, "{rows:?}");
        let up = bgp.iter().find(|r| r.state == "up").expect("an up session");
        assert_eq!(up.info, "Established");
        assert_eq!(up.table, "---");
        assert!(looks_like_time(&up.since), "{up:?}");
        let down = bgp
            .iter()
            .find(|r| r.state != "up")
            .expect("a session not up");
        assert!(
            ["Active", "Connect", "Idle"]
                .iter()
                .any(|s| down.info.starts_with(s)),
            "{down:?}"
        );
        assert!(rows.iter().any(|r| r.proto == "BFD" && r.state == "up"));
        assert!(rows
            .iter()
            .any(|r| r.proto == "Static" && r.name == "sluice4" && r.table == "master4"));
    }

    #[test]
    fn since_with_a_date_and_info_with_spaces() {
        let text = "BIRD 2.0.12 ready.\n\
            Name       Proto      Table      State  Since         Info\n\
            r1         BGP        ---        start  2026-12-01 09:00:00  Active        Socket: Connection refused\n\
            r2         BGP        ---        up     2026-12-01    Established\n";
        let rows = parse_protocols(text).unwrap();
        assert_eq!(rows[0].since, "2026-12-01 09:00:00");
        assert_eq!(rows[0].info, "Active Socket: Connection refused");
        assert_eq!(rows[1].since, "2026-12-01");
        assert_eq!(rows[1].info, "Established");
    }

    #[test]
    fn rejects_what_is_not_show_protocols() {
        assert!(parse_protocols("BIRD 2.0.12 ready.\nReconfigured\n")
            .unwrap_err()
            .contains("before the"));
        assert!(parse_protocols("").unwrap_err().contains("no `Name Proto"));
        let short = "Name Proto Table State Since Info\nr1 BGP ---\n";
        assert!(parse_protocols(short).unwrap_err().contains("line 2"));
    }

    #[test]
    fn include_has_both_families_and_the_communities() {
        let vips: Vec<IpAddr> = vec![
            "198.18.5.1".parse().unwrap(),
            "2001:db8::5".parse().unwrap(),
        ];
        let text = render_include("sluice", &vips, &[(65000, 100)]);
        assert!(text.contains(
            "protocol static sluice4 {\n  ipv4;\n  route 198.18.5.1/32 blackhole { bgp_community.add((65000, 100)); };\n}\n"
        ), "{text}");
        assert!(text.contains(
            "protocol static sluice6 {\n  ipv6;\n  route 2001:db8::5/128 blackhole { bgp_community.add((65000, 100)); };\n}\n"
        ), "{text}");
        let empty = render_include("sluice", &[], &[]);
        assert!(
            empty.contains("protocol static sluice4 {\n  ipv4;\n}\n"),
            "{empty}"
        );
        assert!(
            empty.contains("protocol static sluice6 {\n  ipv6;\n}\n"),
            "{empty}"
        );
    }
}
