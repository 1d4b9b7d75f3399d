//! What `sluicectl sync` shows: the management core's sync counters and, per peer,
//! sequence tracking and bulk resync. Plain values, serialized by the daemon and read
//! back by `sluicectl`; the daemon builds them (`crate::daemon`).
use super::peers::ResyncState;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::Ipv4Addr;

/// `sluicectl sync`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncReport {
    pub listen: String,
    /// `port NAME` (`[sync] port`: frames through the data plane) or `kernel socket`.
    pub transport: String,
    /// The group batches are sent to and received from, when `multicast` is set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub multicast: Option<String>,
    pub peers: Vec<String>,
    /// Messages sealed and checked with `key`; false only with `unauthenticated =
    /// true` in the config.
    pub authenticated: bool,
    /// This node's life as its peers see it (the epoch in its messages).
    pub epoch: u64,
    pub stats: SyncStats,
    pub events_pushed: u64,
    /// Events the workers could not queue (ring full).
    pub events_dropped: u64,
    pub accepted_messages: u64,
    pub accepted_records: u64,
    /// Rejected datagrams by reason.
    pub rejected: BTreeMap<String, u64>,
    /// Per peer: messages accepted, sequence gaps, when last heard, bulk resync.
    pub peer_status: Vec<PeerReport>,
}

/// One peer in `sluicectl sync`: its [`Peer`](super::peers::Peer) counters, the bulk
/// resync asked of it, and how long ago it was last heard.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerReport {
    pub addr: Ipv4Addr,
    /// Messages and records accepted from it.
    pub messages: u64,
    pub records: u64,
    /// Messages missing between two accepted ones (sequence gaps).
    pub lost: u64,
    /// Accepted messages too far ahead of the last one to count as lost.
    pub out_of_window: u64,
    /// Messages that came after a later one.
    pub reordered: u64,
    /// Times a later life of it was believed (the peer restarted).
    pub restarts: u64,
    /// Refused: a sequence number of the current life already had.
    pub replayed: u64,
    /// Refused: a sequence number too far behind the highest one.
    pub too_old: u64,
    /// Refused: a message of an earlier life of the peer.
    pub old_epoch: u64,
    /// Refused: a life this node cannot yet tell from a replay.
    pub unconfirmed_epoch: u64,
    /// Its resync requests ignored because a dump to it had just started.
    pub resync_rate_limited: u64,
    /// The peer's life this node believes (its epoch), once known.
    pub epoch: Option<u64>,
    pub resync: ResyncReport,
    /// Milliseconds since its last accepted message: how stale this node's copy of
    /// its sessions may be (none: never heard).
    pub last_heard_ms_ago: Option<u64>,
}

/// The bulk resync asked of one peer ([`Resync`](super::peers::Resync)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResyncReport {
    pub state: ResyncState,
    pub dump_id: u32,
    /// Requests sent for this resync (1 + retries).
    pub attempts: u32,
    /// Chunks and records received in order for the current dump id.
    pub chunks: u32,
    pub records: u64,
    /// Time from the first request to the last chunk, once complete.
    pub took_ms: Option<u64>,
}

/// The management core's sync counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SyncStats {
    pub messages_sent: u64,
    pub bytes_sent: u64,
    pub events_sent: u64,
    pub send_errors: u64,
    pub datagrams_received: u64,
    /// Records handed to a worker to install (the workers count installs themselves).
    pub records_queued: u64,
    /// Records lost because the owner's install inbox was full.
    pub install_inbox_full: u64,
    /// Bulk resync: requests sent (at start) and received, dumps started, dump
    /// chunks received.
    pub resync_requests_sent: u64,
    pub resync_requests_received: u64,
    pub dumps_sent: u64,
    /// Records listed for the dumps, as the tables were when the listing reached
    /// them (a dump dropped before its end counts what it listed).
    pub dump_records_sent: u64,
    /// Records of those left out because a batch had carried a newer record of the
    /// same entry while the dump went out (`Dump::supersede`).
    pub dump_records_superseded: u64,
    pub dump_chunks_received: u64,
    /// Persistence templates: sent in batches (new, changed, or resent), received,
    /// installed (created, or refreshed or replaced), removed on a peer's word, and
    /// skipped (service or real server unknown here, another netmask, expired, a
    /// worker writing the slot, or a later local template to another real server).
    pub templates_sent: u64,
    pub templates_received: u64,
    pub templates_installed: u64,
    pub templates_removed: u64,
    pub templates_skipped: u64,
    /// Templates in the dumps sent (part of `dump_records_sent`).
    pub dump_templates_sent: u64,
    /// With `multicast`: datagrams read from the group socket (part of
    /// `datagrams_received`), and those among them from our own listen address,
    /// ignored (multicast loopback is off, so only a node with our address sends them).
    pub multicast_received: u64,
    pub own_datagrams_ignored: u64,
    /// With `port`: frames queued for worker 0 to transmit (a frame the ring or the
    /// pool refused is a `send_errors`), frames the workers handed up, and those among
    /// them dropped as malformed (lengths, IPv4 or UDP checksum; not counted in
    /// `datagrams_received`).
    pub frames_sent: u64,
    pub frames_received: u64,
    pub frames_malformed: u64,
    /// Records of accepted messages refused for contradicting this node's config (the
    /// rest of their message is installed): their virtual service is not here, the
    /// real server is not in the service, it forwards in another mode here, or a
    /// FullNAT local address is not the service's. And records whose timeout was cut
    /// to this node's for their state.
    pub records_refused_service: u64,
    pub records_refused_real_server: u64,
    pub records_refused_mode: u64,
    pub records_refused_local: u64,
    pub timeouts_clamped: u64,
    /// Resync requests ignored because a dump to that peer started less than
    /// `peers::DUMP_INTERVAL_MS` before (per peer: `resync_rate_limited`).
    pub resync_requests_ignored: u64,
}
