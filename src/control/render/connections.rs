//! `-Lnc` as text.
use crate::control::report::ConnectionsReport;
use std::fmt::Write as _;

/// Renders `-Lnc`: ipvsadm's columns (`pro expire state source virtual destination`,
/// the real server last so `awk '{print $NF}'` pipelines keep working) with DPVS's
/// additions: the worker as `[w]` before the protocol and the FullNAT local address
/// before the destination (`-` for other modes).
pub fn render_connections(report: &ConnectionsReport) -> String {
    let mut out = String::from("IPVS connection entries\n");
    let _ = writeln!(
        out,
        "pro expire state       source                virtual               local                 destination"
    );
    for c in &report.connections {
        let expire = format!("{:02}:{:02}", c.expires_s / 60, c.expires_s % 60);
        let _ = writeln!(
            out,
            "{:<6} {expire:<6} {:<11} {:<21} {:<21} {:<21} {}",
            format!(
                "[{}]{}",
                c.worker.map_or_else(|| "-".to_string(), |w| w.to_string()),
                c.proto.to_uppercase()
            ),
            c.state,
            c.client,
            c.virtual_service,
            c.local.as_deref().unwrap_or("-"),
            c.destination
        );
    }
    if report.truncated {
        out.push_str("(more sessions exist than this listing holds)\n");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::report::ConnectionStatus;

    #[test]
    fn connections_render_ipvsadm_columns_with_worker_and_local_address() {
        let conn = |worker, local: Option<&str>, rs: &str| ConnectionStatus {
            worker: Some(worker),
            proto: "tcp".into(),
            expires_s: 899,
            state: "ESTABLISHED".into(),
            client: "198.18.0.9:40000".into(),
            virtual_service: "198.18.1.1:80".into(),
            local: local.map(str::to_string),
            destination: rs.into(),
        };
        let report = ConnectionsReport {
            connections: vec![
                conn(0, None, "198.18.0.2:8080"),
                conn(1, Some("198.18.0.50:1031"), "198.18.0.3:8080"),
            ],
            truncated: false,
        };
        let text = render_connections(&report);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "IPVS connection entries");
        assert_eq!(
            lines[1].split_whitespace().collect::<Vec<_>>(),
            [
                "pro",
                "expire",
                "state",
                "source",
                "virtual",
                "local",
                "destination"
            ]
        );
        assert_eq!(
            lines[2].split_whitespace().collect::<Vec<_>>(),
            [
                "[0]TCP",
                "14:59",
                "ESTABLISHED",
                "198.18.0.9:40000",
                "198.18.1.1:80",
                "-",
                "198.18.0.2:8080"
            ]
        );
        assert_eq!(
            lines[3].split_whitespace().collect::<Vec<_>>(),
            [
                "[1]TCP",
                "14:59",
                "ESTABLISHED",
                "198.18.0.9:40000",
                "198.18.1.1:80",
                "198.18.0.50:1031",
                "198.18.0.3:8080"
            ]
        );
        // Seed 000's pipeline: `awk 'NR>1{print $NF}'` gives the real servers.
        let last: Vec<&str> = lines[2..]
            .iter()
            .map(|l| l.split_whitespace().last().unwrap())
            .collect();
        assert_eq!(last, ["198.18.0.2:8080", "198.18.0.3:8080"]);
        assert!(!text.contains("more sessions"));
        let cut = ConnectionsReport {
            truncated: true,
            ..report
        };
        assert!(
            render_connections(&cut).ends_with("(more sessions exist than this listing holds)\n")
        );
        let json = serde_json::to_value(&cut.connections[1]).unwrap();
        assert_eq!(json["virtual"], "198.18.1.1:80");
        assert_eq!(json["local"], "198.18.0.50:1031");
    }

    /// `-Lnc` keeps ipvsadm's header words and order, with DPVS's additions (the
    /// worker as `[w]` before the protocol, the FullNAT local address before the
    /// destination) and 21-character address columns, wide enough for any
    /// `a.b.c.d:port` so the columns never run together (ipvsadm's 18 do).
    #[test]
    fn connections() {
        let conn = |worker, state: &str, client: &str, local: Option<&str>| ConnectionStatus {
            worker,
            proto: "tcp".into(),
            expires_s: 65,
            state: state.into(),
            client: client.into(),
            virtual_service: "198.18.1.1:80".into(),
            local: local.map(str::to_string),
            destination: "198.18.0.11:8080".into(),
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
            truncated: true,
        };
        assert_eq!(
            render_connections(&report),
            "IPVS connection entries\n\
             pro expire state       source                virtual               local                 destination\n\
             [0]TCP 01:05  ESTABLISHED 198.18.100.200:40000  198.18.1.1:80         -                     198.18.0.11:8080\n\
             [1]TCP 01:05  TIME_WAIT   198.18.0.9:1025       198.18.1.1:80         198.18.0.50:1031      198.18.0.11:8080\n\
             [-]TCP 01:05  NONE        198.18.0.0:0          198.18.1.1:80         -                     198.18.0.11:8080\n\
             (more sessions exist than this listing holds)\n"
        );
    }
}
