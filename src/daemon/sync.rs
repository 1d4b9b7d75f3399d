//! Session sync on the management core: the workers' session events are batched into
//! sync messages for the peers, and the peers' messages are checked (peer, version,
//! HMAC, known services) and handed to the worker that will own each session under
//! this node's RSS (`sync::receiver::session_owner`), through that worker's install
//! inbox. One non-blocking UDP socket on a kernel interface; nothing here waits.
use crate::config::SyncSettings;
use crate::dataplane::mesh::Mesh;
use crate::flow::rss::{HashFields, Reta, Toeplitz};
use crate::service::{ServiceKey, ServiceTable};
use crate::sync::auth::SyncKey;
use crate::sync::events::EventRing;
use crate::sync::receiver::{session_owner, Receiver, ReceiverConfig, RejectReason};
use crate::sync::sender::SyncSender;
use std::net::{SocketAddr, SocketAddrV4, UdpSocket};
use std::sync::Arc;

/// Events turned into messages per tick at most.
const EVENTS_PER_TICK: usize = 65_536;
/// Datagrams read per tick at most.
const DATAGRAMS_PER_TICK: usize = 1024;

#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
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
    /// Bulk resync: requests sent (at start) and received, dumps sent, dump chunks
    /// received.
    pub resync_requests_sent: u64,
    pub resync_requests_received: u64,
    pub dumps_sent: u64,
    pub dump_records_sent: u64,
    pub dump_chunks_received: u64,
}

pub struct SyncNode {
    socket: UdpSocket,
    peers: Vec<SocketAddrV4>,
    sender: SyncSender,
    receiver: Receiver,
    rings: Arc<Vec<EventRing>>,
    rss: (Toeplitz, Reta, HashFields),
    buf: Vec<u8>,
    /// Receive buffer (the largest UDP datagram), kept across ticks.
    datagram: Vec<u8>,
    /// Asked a peer for its table yet (done at the first tick).
    resync_asked: bool,
    /// A peer's request for our table, to answer with a dump.
    resync_request: Option<(SocketAddrV4, u32)>,
    pub stats: SyncStats,
}

/// `sluicectl sync`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct SyncReport {
    pub listen: String,
    pub peers: Vec<String>,
    pub authenticated: bool,
    pub stats: SyncStats,
    pub events_pushed: u64,
    /// Events the workers could not queue (ring full).
    pub events_dropped: u64,
    pub accepted_messages: u64,
    pub accepted_records: u64,
    /// Rejected datagrams by reason.
    pub rejected: std::collections::BTreeMap<String, u64>,
}

impl SyncNode {
    pub fn bind(
        settings: &SyncSettings,
        rings: Arc<Vec<EventRing>>,
        rss: (Toeplitz, Reta, HashFields),
    ) -> Result<SyncNode, String> {
        let socket = UdpSocket::bind(settings.listen)
            .map_err(|e| format!("sync: cannot bind {}: {e}", settings.listen))?;
        socket
            .set_nonblocking(true)
            .map_err(|e| format!("sync: {e}"))?;
        let key = settings
            .key
            .as_deref()
            .map(SyncKey::from_hex)
            .transpose()
            .map_err(|e| format!("sync.key: {e}"))?;
        Ok(SyncNode {
            socket,
            peers: settings.peers.clone(),
            sender: SyncSender::new(u32::from(*settings.listen.ip()), settings.mtu, key.clone()),
            receiver: Receiver::new(ReceiverConfig {
                peers: settings.peers.iter().map(|p| *p.ip()).collect(),
                key,
            }),
            rings,
            rss,
            buf: vec![0; usize::from(settings.mtu)],
            datagram: vec![0; 65_536],
            resync_asked: false,
            resync_request: None,
            stats: SyncStats::default(),
        })
    }

    /// A peer's pending request for our whole table: (where to send, dump id).
    pub fn take_resync_request(&mut self) -> Option<(SocketAddrV4, u32)> {
        self.resync_request.take()
    }

    /// Sends `records` to `peer` as dump `dump_id`; returns the chunk count.
    pub fn send_dump(
        &mut self,
        peer: SocketAddrV4,
        dump_id: u32,
        records: Vec<crate::sync::wire::RecordRepr>,
    ) -> u32 {
        let n = records.len() as u64;
        let (socket, stats) = (&self.socket, &mut self.stats);
        let chunks = self.sender.send_dump(dump_id, records, &mut self.buf, |d| {
            match socket.send_to(d, peer) {
                Ok(len) => {
                    stats.messages_sent += 1;
                    stats.bytes_sent += len as u64;
                }
                Err(_) => stats.send_errors += 1,
            }
        });
        self.stats.dumps_sent += 1;
        self.stats.dump_records_sent += n;
        chunks
    }

    /// One turn: send what the workers queued, install what the peers sent.
    pub fn tick(&mut self, table: &ServiceTable, mesh: &Mesh) {
        if !self.resync_asked {
            // Starting up: ask every peer for its table (bulk resync).
            self.resync_asked = true;
            let dump_id = std::process::id();
            let request = self.sender.resync_request(dump_id, &mut self.buf).to_vec();
            for peer in &self.peers {
                if self.socket.send_to(&request, peer).is_ok() {
                    self.stats.resync_requests_sent += 1;
                } else {
                    self.stats.send_errors += 1;
                }
            }
        }
        let SyncNode {
            socket,
            peers,
            sender,
            rings,
            buf,
            stats,
            ..
        } = self;
        let sent = sender.send_events(rings, EVENTS_PER_TICK, buf, |datagram| {
            for peer in peers.iter() {
                match socket.send_to(datagram, peer) {
                    Ok(n) => {
                        stats.messages_sent += 1;
                        stats.bytes_sent += n as u64;
                    }
                    Err(_) => stats.send_errors += 1,
                }
            }
        });
        self.stats.events_sent += sent as u64;
        for _ in 0..DATAGRAMS_PER_TICK {
            let (len, from) = match self.socket.recv_from(&mut self.datagram) {
                Ok(got) => got,
                Err(_) => break, // WouldBlock: nothing more now.
            };
            self.stats.datagrams_received += 1;
            let SocketAddr::V4(from) = from else {
                continue;
            };
            let exists = |proto, vs: SocketAddrV4| {
                table
                    .get(ServiceKey::new(proto, *vs.ip(), vs.port()))
                    .is_some()
            };
            let Ok(accepted) = self
                .receiver
                .receive(&self.datagram[..len], *from.ip(), exists)
            else {
                continue;
            };
            match accepted.header.message_type {
                crate::sync::wire::MessageType::ResyncRequest => {
                    self.stats.resync_requests_received += 1;
                    // Answer to the peer's configured sync address.
                    if let Some(peer) = self.peers.iter().find(|p| p.ip() == from.ip()) {
                        self.resync_request = Some((*peer, accepted.header.dump_id));
                    }
                    continue;
                }
                crate::sync::wire::MessageType::DumpChunk => self.stats.dump_chunks_received += 1,
                crate::sync::wire::MessageType::SessionBatch => {}
            }
            let (toeplitz, reta, fields) = &self.rss;
            for record in accepted.records() {
                let Some(owner) = session_owner(&record, toeplitz, reta, *fields) else {
                    continue;
                };
                if mesh.install(usize::from(owner.queue), record) {
                    self.stats.records_queued += 1;
                } else {
                    self.stats.install_inbox_full += 1;
                }
            }
        }
    }

    pub fn report(&self, listen: SocketAddrV4) -> SyncReport {
        let c = self.receiver.counters();
        SyncReport {
            listen: listen.to_string(),
            peers: self.peers.iter().map(|p| p.to_string()).collect(),
            authenticated: self.sender.authenticated(),
            stats: self.stats,
            events_pushed: self.rings.iter().map(|r| r.stats().pushed).sum(),
            events_dropped: self.rings.iter().map(|r| r.stats().dropped).sum(),
            accepted_messages: c.accepted_messages,
            accepted_records: c.accepted_records,
            rejected: RejectReason::ALL
                .iter()
                .map(|r| (r.name().to_string(), c.rejected(*r)))
                .collect(),
        }
    }
}
