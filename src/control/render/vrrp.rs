//! `sluicectl vrrp` as text.
use crate::control::report::VrrpReport;

/// `sluicectl vrrp`.
pub fn render_vrrp(r: &VrrpReport) -> String {
    let s = &r.stats;
    // No master heard prints as JSON's null, as it always has.
    let master_priority = r
        .master_priority
        .map_or_else(|| "null".to_string(), |p| p.to_string());
    let peers = match (r.peers.is_empty(), r.unicast) {
        (true, _) => "any sender (any_peer = true)".to_string(),
        (false, false) => r.peers.join(", "),
        (false, true) => format!("{} (adverts sent to each)", r.peers.join(", ")),
    };
    let unsealed = match r.accept_unsealed {
        true => format!(
            ", UNSEALED taken too (accept_unsealed = true): {}",
            s.adverts_unsealed
        ),
        false => String::new(),
    };
    let auth = match r.authenticated {
        true => format!(
            "authenticated (key): refused {} bad auth, {} replayed, {} clock skew{unsealed}",
            s.adverts_bad_auth, s.adverts_replayed, s.adverts_clock_skew
        ),
        false => format!(
            "UNAUTHENTICATED (unauthenticated = true); sealed adverts refused {}",
            s.adverts_bad_auth
        ),
    };
    format!(
        "VRRP vrid {} {} (priority {}, advert {} ms, preempt {}) from {} for {:.1}s\n\
         peers: {peers}\n\
         {auth}\n\
         master heard: {} (priority {})\n\
         adverts sent {} received {} rejected {}; gratuitous ARP {}; unsolicited NA {}; \
         transitions {}\n",
        r.vrid,
        r.state,
        r.priority,
        r.advert_interval_ms,
        r.preempt,
        r.primary,
        r.since_change_ms as f64 / 1000.0,
        r.master.as_deref().unwrap_or("-"),
        master_priority,
        s.adverts_sent,
        s.adverts_received,
        s.adverts_rejected,
        s.gratuitous_arps_sent,
        s.unsolicited_nas_sent,
        s.transitions
    )
}

#[cfg(test)]
mod tests {
    use super::render_vrrp;
    use crate::control::report::{VrrpReport, VrrpStats};

    fn vrrp() -> VrrpReport {
        VrrpReport {
            vrid: 51,
            state: "BACKUP".into(),
            priority: 100,
            advert_interval_ms: 1000,
            preempt: true,
            primary: "198.18.0.2".into(),
            master: Some("198.18.0.1".into()),
            master_priority: Some(200),
            since_change_ms: 12_345,
            stats: VrrpStats {
                adverts_sent: 1,
                adverts_received: 40,
                adverts_rejected: 2,
                gratuitous_arps_sent: 3,
                unsolicited_nas_sent: 5,
                transitions: 4,
                adverts_bad_auth: 6,
                adverts_replayed: 7,
                adverts_clock_skew: 8,
                adverts_unsealed: 0,
            },
            peers: vec!["198.18.0.1".into(), "198.18.0.3".into()],
            unicast: false,
            authenticated: true,
            accept_unsealed: false,
        }
    }

    #[test]
    fn vrrp_shows_state_master_heard_and_counters() {
        let mut r = vrrp();
        assert_eq!(
            render_vrrp(&r),
            "VRRP vrid 51 BACKUP (priority 100, advert 1000 ms, preempt true) from 198.18.0.2 for 12.3s\n\
             peers: 198.18.0.1, 198.18.0.3\n\
             authenticated (key): refused 6 bad auth, 7 replayed, 8 clock skew\n\
             master heard: 198.18.0.1 (priority 200)\n\
             adverts sent 1 received 40 rejected 2; gratuitous ARP 3; unsolicited NA 5; \
             transitions 4\n"
        );
        r.master = None;
        r.master_priority = None;
        assert!(
            render_vrrp(&r).contains("\nmaster heard: - (priority null)\n"),
            "{}",
            render_vrrp(&r)
        );
        r.unicast = true;
        assert!(
            render_vrrp(&r).contains("\npeers: 198.18.0.1, 198.18.0.3 (adverts sent to each)\n"),
            "{}",
            render_vrrp(&r)
        );
        r.peers.clear();
        assert!(
            render_vrrp(&r).contains("\npeers: any sender (any_peer = true)\n"),
            "{}",
            render_vrrp(&r)
        );
        r.accept_unsealed = true;
        r.stats.adverts_unsealed = 9;
        assert!(
            render_vrrp(&r).contains(
                "\nauthenticated (key): refused 6 bad auth, 7 replayed, 8 clock skew, \
                 UNSEALED taken too (accept_unsealed = true): 9\n"
            ),
            "{}",
            render_vrrp(&r)
        );
        r.authenticated = false;
        assert!(
            render_vrrp(&r)
                .contains("\nUNAUTHENTICATED (unauthenticated = true); sealed adverts refused 6\n"),
            "{}",
            render_vrrp(&r)
        );
        let json = serde_json::to_value(&r).unwrap();
        assert_eq!(serde_json::from_value::<VrrpReport>(json).unwrap(), r);
    }
}
