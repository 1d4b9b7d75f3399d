//! `sluicectl cluster` as text.
use crate::control::report::{BirdProtocol, ClusterReport};

/// `sluicectl cluster`: the node's state, BIRD's sessions (BGP, then BFD) as
/// `birdc show protocols` last showed them, and every VIP with its reason when
/// withdrawn.
pub fn render_cluster(r: &ClusterReport) -> String {
    let node = match (r.shutting_down, r.draining, r.vrrp_backup) {
        (true, _, _) => "shutting down",
        (false, true, _) => "draining",
        (false, false, true) => "vrrp backup",
        (false, false, false) => "serving",
    };
    let mut out = format!(
        "node {node}; BIRD at {}, include {}: {} ({} configure(s), {} failure(s))\n",
        r.socket,
        r.include,
        if r.in_sync { "in sync" } else { "pending" },
        r.applies,
        r.failures
    );
    if let Some(e) = &r.error {
        out.push_str(&format!("last birdc error: {e}\n"));
    }
    match (&r.sessions_error, r.sessions_age_ms) {
        (Some(e), _) => out.push_str(&format!("sessions: unknown ({e})\n")),
        (None, None) => out.push_str("sessions: not read yet\n"),
        (None, Some(ms)) => out.push_str(&format!("sessions (read {ms} ms ago):\n")),
    }
    let rows: Vec<&BirdProtocol> = r.sessions.iter().chain(&r.bfd).collect();
    if !rows.is_empty() {
        let w = rows.iter().map(|p| p.name.len()).max().unwrap_or(4).max(4);
        out.push_str(&format!(
            "  {:<w$}  {:<5}  {:<6}  {:<23}  Info\n",
            "Name", "Proto", "State", "Since"
        ));
        for p in rows {
            let line = format!(
                "  {:<w$}  {:<5}  {:<6}  {:<23}  {}",
                p.name, p.proto, p.state, p.since, p.info
            );
            out.push_str(line.trim_end());
            out.push('\n');
        }
    }
    let announced = r.vips.iter().filter(|v| v.announced).count();
    out.push_str(&format!(
        "VIPs: {announced} announced, {} withdrawn\n",
        r.vips.len() - announced
    ));
    for v in &r.vips {
        let what = match v.reason {
            None => "announced".to_string(),
            Some(w) => format!("withdrawn: {}", w.name()),
        };
        out.push_str(&format!(
            "  {:<39}  {what} ({} service(s))\n",
            v.vip, v.services
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::render_cluster;
    use crate::control::report::{BirdProtocol, ClusterReport, VipReport};
    use crate::ha::bgp::decide::Withdrawal;

    #[test]
    fn shows_sessions_vips_and_reasons() {
        let r = ClusterReport {
            draining: true,
            shutting_down: false,
            vrrp_backup: false,
            socket: "/run/bird/bird.ctl".into(),
            include: "/run/sluice/bird-vips.conf".into(),
            in_sync: true,
            applies: 3,
            failures: 0,
            error: None,
            sessions: vec![BirdProtocol {
                name: "router1".into(),
                proto: "BGP".into(),
                table: "---".into(),
                state: "up".into(),
                since: "06:23:34.463".into(),
                info: "Established".into(),
            }],
            bfd: vec![],
            sessions_age_ms: Some(120),
            sessions_error: None,
            vips: vec![
                VipReport {
                    vip: "198.18.5.1".into(),
                    services: 1,
                    announced: false,
                    reason: Some(Withdrawal::Draining),
                },
                VipReport {
                    vip: "198.18.5.2".into(),
                    services: 0,
                    announced: false,
                    reason: Some(Withdrawal::ServiceGone),
                },
            ],
        };
        let text = render_cluster(&r);
        assert!(
            text.starts_with("node draining; BIRD at /run/bird/bird.ctl"),
            "{text}"
        );
        assert!(
            text.contains("  router1  BGP    up      06:23:34.463             Established\n"),
            "{text}"
        );
        assert!(text.contains("198.18.5.1"), "{text}");
        assert!(
            text.contains("withdrawn: draining (1 service(s))"),
            "{text}"
        );
        assert!(
            text.contains("withdrawn: service gone (0 service(s))"),
            "{text}"
        );
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(json["vips"][1]["reason"], "service_gone");
        assert_eq!(serde_json::from_value::<ClusterReport>(json).unwrap(), r);
        let backup = ClusterReport {
            draining: false,
            vrrp_backup: true,
            vips: vec![VipReport {
                vip: "198.18.5.1".into(),
                services: 1,
                announced: false,
                reason: Some(Withdrawal::VrrpBackup),
            }],
            ..r
        };
        let text = render_cluster(&backup);
        assert!(text.starts_with("node vrrp backup; BIRD at"), "{text}");
        assert!(
            text.contains("withdrawn: vrrp backup (1 service(s))"),
            "{text}"
        );
        let json = serde_json::to_value(&backup).unwrap();
        assert_eq!(json["vips"][0]["reason"], "vrrp_backup");
    }
}
