//! `-Lnc` as text.
use crate::control::report::{ConnectionStatus, ConnectionsReport};

/// `-Lnc`'s two title lines, as ipvsadm's `list_conn` prints them:
/// `printf("IPVS connection entries\n")` and
/// `printf("pro expire %-11s %-18s %-18s %s\n", "state", "source", "virtual", "destination")`,
/// or with `persistent` (`--persistent-conn`)
/// `printf("pro expire %-11s %-18s %-18s %-18s %-16s %s\n", ..., "destination", "pe name", "pe_data")`.
/// Sessions are listed the same either way: ipvsadm prints the two columns only for
/// a connection of a persistence engine (SIP), which Sluice does not have.
pub fn connections_title(persistent: bool) -> String {
    let (state, source, virt, dest) = ("state", "source", "virtual", "destination");
    if persistent {
        format!(
            "IPVS connection entries\npro expire {state:<11} {source:<18} {virt:<18} {dest:<18} {:<16} {}\n",
            "pe name", "pe_data"
        )
    } else {
        format!("IPVS connection entries\npro expire {state:<11} {source:<18} {virt:<18} {dest}\n")
    }
}

/// One session in ipvsadm's `print_conn` layout:
/// `printf("%-3s %-6s %-11s %-18s %-18s %s\n", protocol, expire_str, state, cname,
/// vname, dname)` with `expire_str` as `"%02d:%02d"`. The worker and the FullNAT
/// local address are not part of ipvsadm's layout: `--json` carries them.
pub fn connection_line(c: &ConnectionStatus) -> String {
    let expire = format!("{:02}:{:02}", c.expires_s / 60, c.expires_s % 60);
    format!(
        "{:<3} {expire:<6} {:<11} {:<18} {:<18} {}\n",
        c.proto.to_uppercase(),
        c.state,
        c.client,
        c.virtual_service,
        c.destination
    )
}

/// Renders `-Lnc` whole: the title, then every session (see [`connection_line`]).
pub fn render_connections(report: &ConnectionsReport, persistent: bool) -> String {
    let mut out = connections_title(persistent);
    for c in &report.connections {
        out += &connection_line(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The expected text is written from ipvsadm 1.31's format strings (`list_conn`
    /// and `print_conn`): `"pro expire %-11s %-18s %-18s %s\n"` and
    /// `"%-3s %-6s %-11s %-18s %-18s %s\n"`.
    #[test]
    fn connections_are_listed_in_ipvsadm_layout_without_worker_or_local_address() {
        let conn = |worker, state: &str, client: &str, local: Option<&str>| ConnectionStatus {
            worker,
            proto: "tcp".into(),
            expires_s: 65,
            state: state.into(),
            client: client.into(),
            virtual_service: "198.18.1.1:80".into(),
            local: local.map(str::to_string),
            destination: "198.18.0.11:8080".into(),
            standing: None,
        };
        let report = ConnectionsReport {
            connections: vec![
                conn(Some(0), "ESTABLISHED", "198.18.100.200:40000", None),
                conn(
                    Some(1),
                    "TIME_WAIT",
                    "198.18.0.9:1025",
                    Some("198.18.0.50:1031"),
                ),
                conn(None, "NONE", "198.18.0.0:0", None),
            ],
            truncated: false,
            next: None,
        };
        assert_eq!(
            render_connections(&report, false),
            "IPVS connection entries\n\
             pro expire state       source             virtual            destination\n\
             TCP 01:05  ESTABLISHED 198.18.100.200:40000 198.18.1.1:80      198.18.0.11:8080\n\
             TCP 01:05  TIME_WAIT   198.18.0.9:1025    198.18.1.1:80      198.18.0.11:8080\n\
             TCP 01:05  NONE        198.18.0.0:0       198.18.1.1:80      198.18.0.11:8080\n"
        );
        // `awk '$1=="TCP"'` and `awk '{print $6}'` pipelines.
        let text = render_connections(&report, false);
        let sixth: Vec<&str> = text
            .lines()
            .filter(|l| l.split_whitespace().next() == Some("TCP"))
            .map(|l| l.split_whitespace().nth(5).unwrap())
            .collect();
        assert_eq!(sixth, ["198.18.0.11:8080"; 3]);
        // `-Lnc --persistent-conn`: the title of `list_conn` with `FMT_PERSISTENTCONN`;
        // the lines as before (`print_conn` adds the two columns only to a
        // persistence engine's eleven-field entries).
        let persistent = render_connections(&report, true);
        let mut lines = persistent.lines();
        assert_eq!(lines.next(), Some("IPVS connection entries"));
        assert_eq!(
            lines.next(),
            Some(
                "pro expire state       source             virtual            \
                 destination        pe name          pe_data"
            )
        );
        assert!(lines.eq(text.lines().skip(2)));
        // The extended fields stay in the JSON.
        let json = serde_json::to_value(&report.connections[1]).unwrap();
        assert_eq!(json["virtual"], "198.18.1.1:80");
        assert_eq!(json["local"], "198.18.0.50:1031");
        assert_eq!(json["worker"], 1);
    }
}
