//! `sluicectl sync` as text.
use crate::control::report::SyncReport;
use crate::ha::sync::peers::ResyncState;
use std::fmt::Write as _;

/// `sluicectl sync`: what was sent and received, the rejections, then one line per
/// peer (when last heard, sequence gaps, the bulk resync asked of it).
pub fn render_sync(r: &SyncReport) -> String {
    let s = &r.stats;
    let mut out = String::new();
    let multicast = r
        .multicast
        .as_deref()
        .map(|g| format!(", multicast {g}"))
        .unwrap_or_default();
    let _ = writeln!(
        out,
        "sync on {}{multicast}, peers {}, {}",
        r.listen,
        r.peers.join(" "),
        if r.authenticated {
            "HMAC on"
        } else {
            "UNAUTHENTICATED (unauthenticated = true: no key; forged messages from a peer's address are believed)"
        }
    );
    let _ = writeln!(
        out,
        "sent: {} messages ({} bytes), {} session events, {} templates, {} send errors; \
         events lost to full rings {}",
        s.messages_sent,
        s.bytes_sent,
        s.events_sent,
        s.templates_sent,
        s.send_errors,
        r.events_dropped
    );
    let _ = writeln!(
        out,
        "received: {} datagrams, {} accepted with {} records; {} templates installed; \
         records lost to full install inboxes {}",
        s.datagrams_received,
        r.accepted_messages,
        r.accepted_records,
        s.templates_installed,
        s.install_inbox_full
    );
    let rejected: Vec<String> = r
        .rejected
        .iter()
        .filter(|(_, v)| **v > 0)
        .map(|(k, v)| format!("{k} {v}"))
        .collect();
    let _ = writeln!(
        out,
        "rejected: {}",
        if rejected.is_empty() {
            "none".to_string()
        } else {
            rejected.join(", ")
        }
    );
    let _ = writeln!(
        out,
        "records refused (contradict this node's config): service {}, real server {}, mode {}, \
         local address {}; timeouts cut to this node's {}",
        s.records_refused_service,
        s.records_refused_real_server,
        s.records_refused_mode,
        s.records_refused_local,
        s.timeouts_clamped
    );
    let _ = writeln!(
        out,
        "resync: {} requests sent, {} received ({} ignored: rate limit), {} dumps started ({} records listed, \
         {} left out: a batch sent them newer), {} chunks received",
        s.resync_requests_sent,
        s.resync_requests_received,
        s.resync_requests_ignored,
        s.dumps_sent,
        s.dump_records_sent,
        s.dump_records_superseded,
        s.dump_chunks_received
    );
    let _ = writeln!(
        out,
        "{:<16} {:>10} {:>9} {:>6} {:>9} {:>8}  Resync",
        "Peer", "Heard", "Messages", "Lost", "Reordered", "Restarts"
    );
    for p in &r.peer_status {
        let heard = p.last_heard_ms_ago.map_or_else(
            || "never".to_string(),
            |ms| format!("{:.3}s ago", ms as f64 / 1000.0),
        );
        let rs = &p.resync;
        let under_way = |state: &str| {
            format!(
                "{state}: {} chunk(s), {} records (attempt {})",
                rs.chunks, rs.records, rs.attempts
            )
        };
        let resync = match rs.state {
            ResyncState::None => "-".to_string(),
            ResyncState::Complete => format!(
                "complete: {} chunk(s), {} records in {} ms (attempt {})",
                rs.chunks,
                rs.records,
                rs.took_ms.unwrap_or(0),
                rs.attempts
            ),
            ResyncState::Requested => under_way("requested"),
            ResyncState::Receiving => under_way("receiving"),
            ResyncState::Failed => under_way("failed"),
        };
        let _ = writeln!(
            out,
            "{:<16} {:>10} {:>9} {:>6} {:>9} {:>8}  {resync}",
            p.addr.to_string(),
            heard,
            p.messages,
            p.lost,
            p.reordered,
            p.restarts
        );
    }
    for p in &r.peer_status {
        let epoch = p
            .epoch
            .map_or_else(|| "not confirmed".to_string(), |e| e.to_string());
        let _ = writeln!(
            out,
            "{:<16} epoch {epoch}; refused: replayed {}, too old {}, old epoch {}, unconfirmed epoch {}; \
             out of window {}; resync requests rate-limited {}",
            p.addr.to_string(),
            p.replayed,
            p.too_old,
            p.old_epoch,
            p.unconfirmed_epoch,
            p.out_of_window,
            p.resync_rate_limited
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::render_sync;
    use crate::control::report::{PeerReport, ResyncReport, SyncReport, SyncStats};
    use crate::ha::sync::peers::ResyncState;

    fn report() -> SyncReport {
        SyncReport {
            listen: "198.19.0.2:8848".into(),
            transport: "kernel socket".into(),
            multicast: None,
            peers: vec!["198.19.0.1:8848".into()],
            authenticated: true,
            epoch: 1,
            stats: SyncStats {
                messages_sent: 3,
                bytes_sent: 300,
                events_sent: 9,
                datagrams_received: 52,
                resync_requests_sent: 1,
                dump_chunks_received: 7,
                ..SyncStats::default()
            },
            events_pushed: 9,
            events_dropped: 0,
            accepted_messages: 50,
            accepted_records: 1200,
            rejected: [("bad_hmac".to_string(), 2), ("unknown_peer".to_string(), 0)].into(),
            peer_status: vec![PeerReport {
                addr: "198.19.0.1".parse().unwrap(),
                messages: 50,
                records: 1200,
                lost: 2,
                out_of_window: 0,
                reordered: 0,
                restarts: 0,
                replayed: 17,
                too_old: 0,
                old_epoch: 1,
                unconfirmed_epoch: 0,
                resync_rate_limited: 19,
                epoch: Some(1_700_000_000_000_001),
                resync: ResyncReport {
                    state: ResyncState::Complete,
                    dump_id: 4,
                    attempts: 1,
                    chunks: 7,
                    records: 273,
                    took_ms: Some(12),
                },
                last_heard_ms_ago: Some(4),
            }],
        }
    }

    #[test]
    fn the_sync_summary_names_rejections_and_each_peers_lag_and_resync() {
        let report = report();
        let text = render_sync(&report);
        assert!(text.starts_with("sync on 198.19.0.2:8848, peers 198.19.0.1:8848, HMAC on\n"));
        assert!(text.contains("\nrejected: bad_hmac 2\n"), "{text}");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[lines.len() - 2],
            "198.19.0.1       0.004s ago        50      2         0        0  \
             complete: 7 chunk(s), 273 records in 12 ms (attempt 1)"
        );
        assert_eq!(
            lines[lines.len() - 1],
            "198.19.0.1       epoch 1700000000000001; refused: replayed 17, too old 0, old epoch 1, \
             unconfirmed epoch 0; out of window 0; resync requests rate-limited 19"
        );
        let open = render_sync(&SyncReport {
            authenticated: false,
            ..report
        });
        assert!(open.lines().next().unwrap().ends_with(", UNAUTHENTICATED (unauthenticated = true: no key; forged messages from a peer's address are believed)"), "{open}");
    }

    #[test]
    fn a_sync_report_reads_back_from_its_json() {
        let json = serde_json::to_value(report()).unwrap();
        assert_eq!(json["peer_status"][0]["resync"]["state"], "complete");
        assert_eq!(json["peer_status"][0]["addr"], "198.19.0.1");
        assert!(json.get("multicast").is_none(), "{json}");
        assert_eq!(
            serde_json::from_value::<SyncReport>(json).unwrap(),
            report()
        );
    }
}
