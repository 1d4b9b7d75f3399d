//! Session sync on the management core: the workers' session events are batched into
//! sync messages for the peers, and the peers' messages are checked (peer, version,
//! HMAC, known services) and handed to the worker that will own each session under
//! this node's RSS (`sync::receiver::session_owner`), through that worker's install
//! inbox. Persistence templates, which the workers share in one table, are the
//! management core's own business both ways (`sync::templates`): it scans the table a
//! slice per tick for templates to send, and installs the peers' directly.
//!
//! Two transports (`Transport`), behind one `send` and one `handle`: one non-blocking
//! UDP socket on a kernel interface (two with `multicast`), or, with `[sync] port`,
//! Ethernet/IPv4/UDP frames through the data plane: built here (`sync::frame`) and
//! queued for worker 0 to transmit (`inject`), received from the workers, which hand
//! datagrams to the listen address (or the group) to the management core like probe
//! answers (`on_frame`). Nothing here waits.
use crate::config::SyncSettings;
use crate::dataplane::mesh::{Injected, Mesh};
use crate::dataplane::sync_events::EventRing;
use crate::dpdk::{Mempool, RingConsumer, RingProducer};
use crate::flow::rss::{HashFields, Reta, Toeplitz};
use crate::ha::auth::SharedKey;
use crate::ha::sync::cursor::DumpSource;
use crate::ha::sync::dumps::Dumps;
use crate::ha::sync::frame;
use crate::ha::sync::peers::{Heard, Peer, Peers, Stale};
use crate::ha::sync::receiver::{
    check_record, session_owner, Conflict, Receiver, ReceiverConfig, RejectReason,
};
use crate::ha::sync::report::{PeerReport, ResyncReport, SyncReport, SyncStats};
use crate::ha::sync::sender::SyncSender;
use crate::ha::sync::templates::{self, Applied, ServicesById, TemplateTracker};
use crate::model::ServiceKey;
use crate::service::ServiceTable;
use crate::session::persist::PersistTable;
use crate::session::replication::{RecordKind, RecordRepr};
use crate::session::Timeouts;
use crate::wire::ethernet::{self, MacAddr};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Events turned into messages per tick at most.
const EVENTS_PER_TICK: usize = 65_536;
/// Datagrams read per tick at most.
const DATAGRAMS_PER_TICK: usize = 1024;
/// The time a scan of the whole template table takes, over management ticks.
const TEMPLATE_PASS_MS: u32 = 1000;
/// Dump chunks sent per tick at most, over all dumps under way (`Dumps::send`).
const DUMP_CHUNKS_PER_TICK: u32 = 32;
/// The time a turn spends listing the tables for the dumps under way, at most (one
/// question to a worker or one slice of template slots may overrun it: a few hundred
/// microseconds when the worker answers between two polls, up to the query timeout,
/// 1 s, when it does not, and the dump then ends). The rest of the turn (VRRP adverts,
/// health checks, the watchdog) never waits for a whole table.
const DUMP_LISTING_BUDGET: Duration = Duration::from_millis(2);
/// Over a DPDK port, the resync request waits this long after ARP requests for the
/// peers: worker 0 turns a frame to a peer it has not resolved into an ARP request
/// for it, so a request sent first would be lost (through a kernel socket, the kernel
/// holds the datagram while it resolves). An answer takes well under a millisecond on
/// a LAN; the margin covers busy CPUs.
const RESOLVE_WAIT: Duration = Duration::from_millis(200);

/// What the management core sends and receives through the data plane with: the
/// workers' shared inboxes, the pool of its frames' mbufs, and its own ends of the
/// inject ring (to worker 0) and the punt rings (from every worker).
#[derive(Clone, Copy)]
pub struct Plane<'a> {
    pub mesh: &'a Mesh,
    pub pool: &'a Mempool,
    pub inject: &'a RingProducer,
    pub punted: &'a RingConsumer,
    /// The VRRP advertisements the workers punted, on their own ring.
    pub vrrp_punted: &'a RingConsumer,
    /// The peers' sync datagrams the workers punted, on their own ring.
    pub sync_punted: &'a RingConsumer,
}

/// The kernel sockets of sync without `[sync] port`: the one bound to `listen`, and
/// with `multicast` the one bound to the group. Bound before the EAL starts
/// ([`super::preflight::Listeners`]) and handed to [`SyncNode::bind`].
pub struct SyncSockets {
    socket: UdpSocket,
    group: Option<UdpSocket>,
}

impl SyncSockets {
    /// Binds `listen` (and joins the group); the error names the field.
    pub fn bind(settings: &SyncSettings) -> Result<SyncSockets, String> {
        let socket = UdpSocket::bind(settings.listen).map_err(|e| {
            format!(
                "sync.listen: cannot bind {}: {e}{}",
                settings.listen,
                super::preflight::bind_hint(&e)
            )
        })?;
        socket
            .set_nonblocking(true)
            .map_err(|e| format!("sync.listen: {e}"))?;
        let group = settings
            .multicast
            .map(|group| multicast_socket(&socket, settings.listen, group))
            .transpose()?;
        Ok(SyncSockets { socket, group })
    }
}

/// How sync datagrams leave and arrive.
enum Transport {
    /// Bound to `listen`: sends everything (batches to the group with `multicast`),
    /// receives what is sent to `listen`; with `multicast`, the socket bound to the
    /// group that receives the group's datagrams (see `multicast_socket`).
    Socket {
        socket: UdpSocket,
        group: Option<UdpSocket>,
    },
    /// `[sync] port`: frames through the data plane of the port `name`, whose MAC
    /// is `mac`, built in `frame` (kept across sends).
    Port {
        name: String,
        mac: MacAddr,
        frame: Vec<u8>,
    },
}

impl Transport {
    /// Sends `datagram` from `from` to `to`: through the socket, or as a frame queued
    /// for worker 0. Whether it went (a frame's fate on the wire is worker 0's).
    fn send(
        &mut self,
        plane: Plane,
        from: SocketAddrV4,
        to: SocketAddrV4,
        datagram: &[u8],
        stats: &mut SyncStats,
    ) -> bool {
        match self {
            Transport::Socket { socket, .. } => socket.send_to(datagram, to).is_ok(),
            Transport::Port { frame, .. } => {
                let sent = frame::write(frame, from, to, datagram)
                    .is_some_and(|len| super::inject(plane, Injected::SyncDatagram, &frame[..len]));
                stats.frames_sent += u64::from(sent);
                sent
            }
        }
    }

    /// Over a port, an ARP request (broadcast, from `from`) for `target`, so that
    /// worker 0 knows the peer's MAC before the first datagram to it. Whether it went.
    fn resolve(&mut self, plane: Plane, from: Ipv4Addr, target: Ipv4Addr) -> bool {
        let Transport::Port { mac, .. } = self else {
            return true;
        };
        let mut frame = [0u8; 60];
        crate::wire::arp::write_request(&mut frame, ethernet::HEADER_LEN, *mac, from, target)
            .is_some_and(|len| super::inject(plane, Injected::Addressed, &frame[..len]))
    }

    fn describe(&self) -> String {
        match self {
            Transport::Socket { .. } => "kernel socket".into(),
            Transport::Port { name, .. } => format!("port {name}"),
        }
    }
}

/// Bulk resync at start: our request for the peers' tables, sent once, at the first
/// tick, or over a DPDK port once the peers had time to answer ARP (`RESOLVE_WAIT`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Resync {
    Start,
    /// Over a port: ARP requests for the peers went out then.
    Resolving(Instant),
    Asked,
}

/// A tick's clocks, and whether this node is a VRRP backup.
#[derive(Clone, Copy)]
pub struct When {
    /// The session clock (ticks).
    pub now: u32,
    /// The management clock.
    pub now_ms: u64,
    /// Only a backup asks a peer for its table again (a dump stalled or with a gap, a
    /// peer heard after a silence): a master's own sessions are the live ones, and a
    /// peer's copies of them would only set them back.
    pub backup: bool,
    /// A VRRP master: it does not ask a peer for its table to confirm the peer's life
    /// either (the peer's batches stay refused until then; a backup sends few).
    pub master: bool,
    /// This node's session timeouts: no synced record gets a longer one.
    pub timeouts: Timeouts,
}

pub struct SyncNode {
    transport: Transport,
    listen: SocketAddrV4,
    /// With `multicast`: the group batches go to and come from.
    group: Option<SocketAddrV4>,
    peers: Vec<SocketAddrV4>,
    sender: SyncSender,
    receiver: Receiver,
    rings: Arc<Vec<EventRing>>,
    rss: (Toeplitz, Reta, HashFields, HashFields),
    buf: Vec<u8>,
    /// Receive buffer of the socket (the largest UDP datagram), kept across ticks.
    datagram: Vec<u8>,
    /// Our requests for the peers' tables at start.
    resync: Resync,
    /// The last dump id this node asked for (one more per request).
    dump_id: u32,
    /// What the peers' accepted messages told: lag, losses, resync progress.
    seen: Peers,
    /// Dumps to ask for at the next tick: (peer, another attempt?).
    asks: Vec<(SocketAddrV4, bool)>,
    /// Our tables being dumped to peers that asked, listed and sent a slice per tick.
    dumps: Dumps,
    /// `[sync] dump_records_per_turn`: records listed per tick for all dumps at most.
    dump_records_per_turn: usize,
    /// Peers' requests for our table, to answer each with a dump (several peers may
    /// ask in one tick, after a shared restart).
    resync_requests: Vec<(SocketAddrV4, u32)>,
    /// The workers' persistence templates, and the session clock's tick.
    persist: Arc<PersistTable>,
    tick_ms: u32,
    /// Which templates the peers have been told.
    tracker: TemplateTracker,
    /// This tick's template records (kept across ticks).
    template_records: Vec<RecordRepr>,
    pub stats: SyncStats,
}

impl SyncNode {
    /// Binds the socket(s) on the kernel interface, or with `port`, opens nothing: the
    /// workers were told what to hand up (`Forwarder::set_sync_port`), and frames go
    /// out from `mac`, the port's.
    pub fn bind(
        settings: &SyncSettings,
        sockets: Option<SyncSockets>,
        rings: Arc<Vec<EventRing>>,
        rss: (Toeplitz, Reta, HashFields, HashFields),
        persist: Arc<PersistTable>,
        tick_ms: u32,
        mac: MacAddr,
    ) -> Result<SyncNode, String> {
        let transport = match &settings.port {
            Some(name) => Transport::Port {
                name: name.clone(),
                mac,
                frame: vec![0; frame::HEADERS_LEN + usize::from(settings.mtu)],
            },
            None => {
                let SyncSockets { socket, group } = match sockets {
                    Some(bound) => bound,
                    None => SyncSockets::bind(settings)?,
                };
                Transport::Socket { socket, group }
            }
        };
        let key = settings
            .key
            .as_ref()
            .map(|k| SharedKey::from_hex(k.as_str()))
            .transpose()
            .map_err(|e| format!("sync.key: {e}"))?;
        if key.is_none() {
            log::warn!(
                "sync: UNAUTHENTICATED (`unauthenticated = true` in [sync], no `key`): any host \
                 that can send from a peer's address can install, change and remove sessions \
                 and ask for this node's whole table; set `key` to authenticate"
            );
        }
        Ok(SyncNode {
            transport,
            listen: settings.listen,
            group: settings.multicast,
            peers: settings.peers.clone(),
            sender: SyncSender::new(u32::from(*settings.listen.ip()), settings.mtu, key.clone()),
            receiver: Receiver::new(ReceiverConfig {
                local: *settings.listen.ip(),
                peers: settings.peers.iter().map(|p| *p.ip()).collect(),
                key,
            }),
            rings,
            rss,
            buf: vec![0; usize::from(settings.mtu)],
            // The frame path reads datagrams in place, in their mbufs.
            datagram: match settings.port {
                Some(_) => Vec::new(),
                None => vec![0; 65_536],
            },
            resync: Resync::Start,
            // Random, so no chunk of a previous life's dumps answers this one's
            // requests: such an answer is what confirms a peer's life after a start.
            dump_id: random_u32(),
            seen: Peers::new(settings.peers.iter().map(|p| *p.ip())),
            asks: Vec::new(),
            dumps: Dumps::default(),
            dump_records_per_turn: settings.dump_records_per_turn as usize,
            resync_requests: Vec::new(),
            tracker: TemplateTracker::new(
                &persist,
                (TEMPLATE_PASS_MS / crate::dataplane::MANAGEMENT_TICK_MS) as usize,
                resend_ticks(settings.period_ms, tick_ms),
            ),
            persist,
            tick_ms,
            template_records: Vec::new(),
            stats: SyncStats::default(),
        })
    }

    /// The peers' pending requests for our whole table: (where to send, dump id).
    pub fn take_resync_requests(&mut self) -> Vec<(SocketAddrV4, u32)> {
        std::mem::take(&mut self.resync_requests)
    }

    /// Starts dumping our table to `peer` as dump `dump_id`, from the first slot
    /// (`step_dumps` lists and sends it, a slice per tick). A dump already under way
    /// to that peer is dropped: it asked again (`Dumps::start`).
    pub fn start_dump(&mut self, peer: SocketAddrV4, dump_id: u32, now_ms: u64) {
        if let Some(old) = self.dumps.start(peer, dump_id, now_ms) {
            self.stats.dump_records_superseded += old.dump.skipped();
            log::info!(
                "sync: dump {} to {peer} dropped after {} chunks: it asked again",
                old.dump.dump_id,
                old.dump.chunks_sent()
            );
        }
        log::info!("sync: dump {dump_id} to {peer} started");
        self.stats.dumps_sent += 1;
    }

    /// The dumps' turn: lists the next slice of the tables from `tables` for each dump
    /// under way, as much as its share of the tick's `DUMP_CHUNKS_PER_TICK` chunks
    /// carries (within `dump_records_per_turn` and `DUMP_LISTING_BUDGET` for all of
    /// them), then sends the chunks, at a pace the peer's receive buffer (or ring,
    /// over a port) and its management tick keep up with (32 chunks of 1500 bytes
    /// every 5 ms: about 170,000 records a second). A dump whose listing fails (a
    /// worker did not answer) is dropped rather than tried again each turn, which
    /// would stall every turn for the query's timeout: a peer that is a VRRP backup
    /// asks again when its stall timer fires; one without `[vrrp]` asks only at start.
    pub fn step_dumps(&mut self, tables: &mut impl DumpSource, plane: Plane, now_ms: u64) {
        if self.dumps.is_empty() {
            return;
        }
        let per_chunk = self.sender.records_per_chunk();
        let deadline = Instant::now() + DUMP_LISTING_BUDGET;
        let listed = self.dumps.list(
            tables,
            DUMP_CHUNKS_PER_TICK,
            per_chunk,
            self.dump_records_per_turn,
            || Instant::now() < deadline,
        );
        self.stats.dump_records_sent += listed.records;
        self.stats.dump_templates_sent += listed.templates;
        for (d, e) in listed.failed {
            self.stats.dump_records_superseded += d.dump.skipped();
            log::warn!("sync: dump {} to {} failed: {e}", d.dump.dump_id, d.peer);
        }
        let SyncNode {
            transport,
            listen,
            sender,
            buf,
            stats,
            dumps,
            ..
        } = self;
        let finished = dumps.send(sender, DUMP_CHUNKS_PER_TICK, now_ms, buf, |peer, d| {
            if transport.send(plane, *listen, peer, d, stats) {
                stats.messages_sent += 1;
                stats.bytes_sent += d.len() as u64;
            } else {
                stats.send_errors += 1;
            }
        });
        for d in finished {
            self.stats.dump_records_superseded += d.dump.skipped();
            log::info!(
                "sync: dump {} to {}: {} chunks in {} ms",
                d.dump.dump_id,
                d.peer,
                d.dump.chunks_sent(),
                now_ms.saturating_sub(d.started_ms)
            );
        }
    }

    /// One turn at session-clock tick `now`: send what the workers queued and the
    /// templates due in this tick's slice of the template table, install what the
    /// peers sent.
    pub fn tick(&mut self, table: &ServiceTable, plane: Plane, when: When) {
        let now = when.now;
        self.ask_for_resync(plane, when.now_ms);
        if when.backup {
            // A dump that stopped arriving is asked for again (bounded).
            let stalled: Vec<Ipv4Addr> = self.seen.stalled(when.now_ms).collect();
            for ip in stalled {
                if let Some(peer) = self.peers.iter().find(|p| *p.ip() == ip).copied() {
                    self.asks.push((peer, true));
                }
            }
        }
        let mut asks = std::mem::take(&mut self.asks);
        for (peer, retry) in asks.drain(..) {
            self.ask_for_dump(plane, peer, retry, when.now_ms);
        }
        self.asks = asks;
        let SyncNode {
            transport,
            listen,
            group,
            peers,
            sender,
            rings,
            buf,
            stats,
            persist,
            tick_ms,
            tracker,
            template_records,
            dumps,
            ..
        } = self;
        // Batches: once to the group with `multicast`, else once to every peer.
        let group_only;
        let destinations = match group {
            Some(g) => {
                group_only = [*g];
                &group_only[..]
            }
            None => &peers[..],
        };
        let from = *listen;
        let mut to_peers = |datagram: &[u8]| {
            for to in destinations {
                if transport.send(plane, from, *to, datagram, stats) {
                    stats.messages_sent += 1;
                    stats.bytes_sent += datagram.len() as u64;
                } else {
                    stats.send_errors += 1;
                }
            }
        };
        // A record batched now is newer than a dump's copy of it listed before and
        // still to go out.
        let sent = sender.send_events(rings, EVENTS_PER_TICK, buf, &mut to_peers, |r| {
            dumps.supersede(r)
        });
        // This tick's slice of the template table: what the peers were not told yet.
        // (The services by id are built only when a template is due.)
        let mut by_id = None;
        template_records.clear();
        tracker.scan(persist, now, |key, template| {
            by_id
                .get_or_insert_with(|| ServicesById::new(table))
                .record(key, template, now, *tick_ms)
                .map(|r| template_records.push(r))
                .is_some()
        });
        for r in template_records.iter() {
            dumps.supersede(r);
        }
        let templates_sent = sender.send_records(template_records.drain(..), buf, &mut to_peers);
        self.stats.events_sent += sent as u64;
        self.stats.templates_sent += templates_sent as u64;
        // The socket's datagrams (a port's come as frames: `on_frame`).
        let mut datagram = std::mem::take(&mut self.datagram);
        for from_group in [false, true] {
            for _ in 0..DATAGRAMS_PER_TICK {
                // None: WouldBlock (nothing more now), or no such socket.
                let Some((len, from)) = self.recv(from_group, &mut datagram) else {
                    break;
                };
                // Always IPv4: the sockets are bound to IPv4 addresses.
                if let SocketAddr::V4(from) = from {
                    self.handle(&datagram[..len], from, from_group, table, plane.mesh, when);
                }
            }
        }
        self.datagram = datagram;
    }

    /// Starting up: asks every peer for its table (bulk resync), once. Over a DPDK
    /// port, first asks for the peers' MACs (ARP) and waits `RESOLVE_WAIT`.
    fn ask_for_resync(&mut self, plane: Plane, now_ms: u64) {
        let SyncNode {
            transport,
            listen,
            peers,
            stats,
            resync,
            ..
        } = self;
        match *resync {
            Resync::Asked => return,
            Resync::Start if matches!(transport, Transport::Port { .. }) => {
                for peer in peers.iter() {
                    if !transport.resolve(plane, *listen.ip(), *peer.ip()) {
                        stats.send_errors += 1;
                    }
                }
                *resync = Resync::Resolving(Instant::now());
                return;
            }
            Resync::Resolving(at) if at.elapsed() < RESOLVE_WAIT => return,
            Resync::Start | Resync::Resolving(_) => {}
        }
        *resync = Resync::Asked;
        for peer in self.peers.clone() {
            self.ask_for_dump(plane, peer, false, now_ms);
        }
    }

    /// Asks `peer` for its whole table under a new dump id: a new resync, or another
    /// attempt at the current one (bounded: `peers::RESYNC_ATTEMPTS`).
    fn ask_for_dump(&mut self, plane: Plane, peer: SocketAddrV4, retry: bool, now_ms: u64) {
        self.dump_id = self.dump_id.wrapping_add(1);
        if !self.seen.asking(*peer.ip(), self.dump_id, retry, now_ms) {
            log::warn!(
                "sync: no complete table from {peer} after {} requests; asking again when it is heard after a silence",
                crate::ha::sync::peers::RESYNC_ATTEMPTS
            );
            return;
        }
        let request = self
            .sender
            .resync_request(self.dump_id, *peer.ip(), &mut self.buf);
        if self
            .transport
            .send(plane, self.listen, peer, request, &mut self.stats)
        {
            self.stats.resync_requests_sent += 1;
        } else {
            self.stats.send_errors += 1;
        }
    }

    /// Reads one datagram into `into`, from the listen socket or the group's.
    fn recv(&mut self, from_group: bool, into: &mut [u8]) -> Option<(usize, SocketAddr)> {
        let Transport::Socket { socket, group } = &self.transport else {
            return None;
        };
        let socket = match (from_group, group) {
            (false, _) => socket,
            (true, Some(socket)) => socket,
            (true, None) => return None,
        };
        socket.recv_from(into).ok()
    }

    /// A frame a worker handed up (`[sync] port`): a datagram to the listen address or
    /// the group, checked (lengths, both checksums) and then handled as one from the
    /// socket; a malformed one is counted and dropped.
    pub fn on_frame(&mut self, frame: &[u8], table: &ServiceTable, mesh: &Mesh, when: When) {
        self.stats.frames_received += 1;
        let datagram = match frame::parse(frame) {
            Ok(d) => d,
            Err(e) => {
                self.stats.frames_malformed += 1;
                log::debug!("sync: malformed frame dropped: {e:?}");
                return;
            }
        };
        let from_group = self.group == Some(datagram.to);
        if !from_group && datagram.to != self.listen {
            // The workers hand up only these; counted should it ever happen.
            self.stats.frames_malformed += 1;
            return;
        }
        self.handle(
            datagram.payload,
            datagram.from,
            from_group,
            table,
            mesh,
            when,
        );
    }

    /// Checks `datagram`, from `from` (to the group if `from_group`), and hands its
    /// records to their owners. Both transports end here.
    fn handle(
        &mut self,
        datagram: &[u8],
        from: SocketAddrV4,
        from_group: bool,
        table: &ServiceTable,
        mesh: &Mesh,
        when: When,
    ) {
        let now = when.now;
        self.stats.datagrams_received += 1;
        self.stats.multicast_received += u64::from(from_group);
        if from_group && from.ip() == self.listen.ip() {
            // Our own batch back (loopback is off, so another node with our address):
            // neither a peer's message nor a forgery to count.
            self.stats.own_datagrams_ignored += 1;
            return;
        }
        let Ok(accepted) = self.receiver.receive(datagram, *from.ip()) else {
            return;
        };
        let peer = self.peers.iter().find(|p| p.ip() == from.ip()).copied();
        let heard = match self.seen.admit(*from.ip(), &accepted.header, when.now_ms) {
            Ok(heard) => heard,
            Err(stale) => {
                let reason = match stale {
                    Stale::Unconfirmed => RejectReason::UnconfirmedEpoch,
                    Stale::Replayed | Stale::TooOld | Stale::OldEpoch => RejectReason::Replayed,
                };
                self.receiver.reject(&accepted.header, reason);
                if stale == Stale::Unconfirmed && !when.master {
                    self.ask_to_confirm(peer, when.now_ms);
                }
                return;
            }
        };
        match (heard, peer) {
            (Heard::DumpGap, Some(peer)) if when.backup => self.asks.push((peer, true)),
            (Heard::AfterSilence, Some(peer)) if when.backup => {
                log::info!("sync: {peer} heard again after a silence: asking for its table");
                self.asks.push((peer, false));
            }
            (Heard::Unconfirmed, _) if !when.master => self.ask_to_confirm(peer, when.now_ms),
            _ => {}
        }
        match accepted.header.message_type {
            crate::session::replication::MessageType::ResyncRequest => {
                self.stats.resync_requests_received += 1;
                // Answer to the peer's configured sync address, one dump per interval.
                if let Some(peer) = peer {
                    if self.seen.may_dump(*peer.ip(), when.now_ms) {
                        self.resync_requests.push((peer, accepted.header.dump_id));
                    } else {
                        self.stats.resync_requests_ignored += 1;
                    }
                }
                return;
            }
            crate::session::replication::MessageType::DumpChunk => {
                self.stats.dump_chunks_received += 1
            }
            crate::session::replication::MessageType::SessionBatch => {}
        }
        let (toeplitz, reta, fields, fields6) = &self.rss;
        for record in accepted.records() {
            let service = table.get(ServiceKey::new(
                record.proto,
                record.virtual_service.ip(),
                record.virtual_service.port(),
            ));
            // A service the peer has and this node lacks (a config change reaching
            // one node first): that record alone is refused.
            let Some(service) = service else {
                self.stats.records_refused_service += 1;
                continue;
            };
            let record = match check_record(&record, service, &when.timeouts) {
                Ok((record, clamped)) => {
                    self.stats.timeouts_clamped += u64::from(clamped);
                    record
                }
                Err(conflict) => {
                    *match conflict {
                        Conflict::UnknownRealServer => &mut self.stats.records_refused_real_server,
                        Conflict::WrongMode => &mut self.stats.records_refused_mode,
                        Conflict::WrongLocal => &mut self.stats.records_refused_local,
                    } += 1;
                    continue;
                }
            };
            if record.kind == RecordKind::Template {
                // Shared by all workers: installed here, not by an owner.
                self.stats.templates_received += 1;
                let applied = templates::identify(table, &record, now, self.tick_ms).map(
                    |(key, template)| {
                        let applied = templates::apply(&self.persist, key, template, now);
                        match (applied, key.lookup(&self.persist, now)) {
                            // The peer knows what we hold now: not echoed back.
                            (
                                Applied::Created | Applied::Refreshed | Applied::Replaced,
                                Some(held),
                            ) => self.tracker.received(key, held, now),
                            // Ours differs (or is gone): tell the peer next pass.
                            _ => self.tracker.forget(key),
                        }
                        applied
                    },
                );
                match applied {
                    Ok(Applied::Created | Applied::Refreshed | Applied::Replaced) => {
                        self.stats.templates_installed += 1
                    }
                    Ok(Applied::Removed) => self.stats.templates_removed += 1,
                    Ok(Applied::Kept | Applied::Busy) | Err(_) => self.stats.templates_skipped += 1,
                }
                continue;
            }
            let Some(owner) = session_owner(&record, toeplitz, reta, *fields, *fields6) else {
                continue;
            };
            if mesh.install(usize::from(owner.queue), record) {
                self.stats.records_queued += 1;
            } else {
                self.stats.install_inbox_full += 1;
            }
        }
    }

    /// Traffic from a life of `peer` this node cannot confirm: ask for its table (the
    /// answer confirms it), unless a request is under way.
    fn ask_to_confirm(&mut self, peer: Option<SocketAddrV4>, now_ms: u64) {
        let Some(peer) = peer else { return };
        if !self.asks.iter().any(|(p, _)| *p == peer)
            && self.seen.should_ask_to_confirm(*peer.ip(), now_ms)
        {
            log::info!(
                "sync: {peer} speaks from a life this node has not confirmed: asking for its table"
            );
            self.asks.push((peer, false));
        }
    }

    pub fn report(&self, listen: SocketAddrV4, now_ms: u64) -> SyncReport {
        let c = self.receiver.counters();
        SyncReport {
            listen: listen.to_string(),
            transport: self.transport.describe(),
            multicast: self.group.as_ref().map(|g| g.to_string()),
            peers: self.peers.iter().map(|p| p.to_string()).collect(),
            authenticated: self.sender.authenticated(),
            epoch: self.sender.epoch(),
            stats: self.stats,
            events_pushed: self.rings.iter().map(|r| r.stats().pushed).sum(),
            events_dropped: self.rings.iter().map(|r| r.stats().dropped).sum(),
            accepted_messages: c.accepted_messages,
            accepted_records: c.accepted_records,
            rejected: RejectReason::ALL
                .iter()
                .map(|r| (r.name().to_string(), c.rejected(*r)))
                .collect(),
            peer_status: self.seen.iter().map(|p| peer_report(p, now_ms)).collect(),
        }
    }
}

/// One peer's line of `sluicectl sync`.
fn peer_report(p: &Peer, now_ms: u64) -> PeerReport {
    let r = p.resync;
    PeerReport {
        addr: p.addr,
        messages: p.messages,
        records: p.records,
        lost: p.lost,
        out_of_window: p.out_of_window,
        reordered: p.reordered,
        restarts: p.restarts,
        replayed: p.replayed,
        too_old: p.too_old,
        old_epoch: p.old_epoch,
        unconfirmed_epoch: p.unconfirmed_epoch,
        resync_rate_limited: p.resync_rate_limited,
        epoch: p.epoch,
        resync: ResyncReport {
            state: r.state,
            dump_id: r.dump_id,
            attempts: r.attempts,
            chunks: r.chunks,
            records: r.records,
            took_ms: r.took_ms,
        },
        last_heard_ms_ago: p.last_heard_ms.map(|t| now_ms.saturating_sub(t)),
    }
}

/// Multicast (`[sync] multicast`): batches leave the listen socket for the group, and a
/// second socket bound to GROUP:PORT receives the group's datagrams.
///
/// Why a second socket rather than one bound to 0.0.0.0:PORT: the sender's source
/// address must stay `listen`, because the peers accept only their configured peer
/// addresses (a wildcard-bound socket's source would be whatever the route picks);
/// the listen port and the group port may differ, which one socket cannot cover; and a
/// wildcard socket would also take unicast for PORT on every other interface. The
/// listen socket, bound to a unicast address, never gets the group's datagrams (the
/// kernel delivers by destination address), and the group socket, bound to the group,
/// never gets unicast: nothing is read twice, whether the ports are equal or not.
fn multicast_socket(
    unicast: &UdpSocket,
    listen: SocketAddrV4,
    group: SocketAddrV4,
) -> Result<UdpSocket, String> {
    use socket2::{Domain, Protocol, SockRef, Socket, Type};
    let fail = |what: &'static str| {
        move |e: std::io::Error| format!("sync.multicast: {group}: {what}: {e}")
    };
    // Sending: out of the interface that holds `listen` (IP_MULTICAST_IF), one hop
    // (the standby is on the same link, as with IPVS), and not back to this node.
    let send = SockRef::from(unicast);
    send.set_multicast_if_v4(listen.ip())
        .map_err(fail("IP_MULTICAST_IF"))?;
    send.set_multicast_ttl_v4(1)
        .map_err(fail("IP_MULTICAST_TTL"))?;
    send.set_multicast_loop_v4(false)
        .map_err(fail("IP_MULTICAST_LOOP"))?;
    // Receiving.
    let recv =
        Socket::new(Domain::IPV4, Type::DGRAM, Some(Protocol::UDP)).map_err(fail("socket"))?;
    // As IPVS's receive socket (sk_reuse): other listeners of the group on this host
    // (a capture, a monitor) may bind it too; each gets its own copy.
    recv.set_reuse_address(true).map_err(fail("SO_REUSEADDR"))?;
    recv.bind(&SocketAddr::V4(group).into())
        .map_err(fail("bind"))?;
    // IP_ADD_MEMBERSHIP on the interface that holds `listen`; with IP_MULTICAST_ALL
    // off, only the group's datagrams arriving there are delivered to this socket,
    // not those of another interface where some other program joined the group.
    recv.join_multicast_v4(group.ip(), listen.ip())
        .map_err(fail("IP_ADD_MEMBERSHIP"))?;
    recv.set_multicast_all_v4(false)
        .map_err(fail("IP_MULTICAST_ALL"))?;
    recv.set_nonblocking(true).map_err(fail("O_NONBLOCK"))?;
    Ok(recv.into())
}

/// A random number from the kernel (at start, not on any packet path); the time's
/// low bits should the kernel not answer.
fn random_u32() -> u32 {
    use std::io::Read;
    let mut bytes = [0u8; 4];
    match std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes)) {
        Ok(()) => u32::from_ne_bytes(bytes),
        Err(_) => crate::ha::sync::sender::epoch_now() as u32,
    }
}

/// Ticks after which an unchanged template is sent again: one scan pass before the
/// sync period is up, so every live template goes out at least every `period_ms`.
fn resend_ticks(period_ms: u32, tick_ms: u32) -> u32 {
    (period_ms.saturating_sub(TEMPLATE_PASS_MS) / tick_ms.max(1)).max(1)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_peer_report_has_the_fields_the_metrics_read() {
        use crate::ha::sync::peers::Peers;
        let peers = Peers::new(["198.19.0.2".parse().unwrap()]);
        let p = *peers.iter().next().unwrap();
        let mut heard = p;
        heard.last_heard_ms = Some(750);
        let v = serde_json::to_value(super::peer_report(&heard, 1000)).unwrap();
        assert_eq!(v["addr"], "198.19.0.2");
        assert_eq!(v["last_heard_ms_ago"], 250);
        for key in ["messages", "lost", "reordered", "restarts"] {
            assert_eq!(v[key], 0, "{key} in {v}");
        }
        assert_eq!(v["resync"]["state"], "none");
    }

    #[test]
    fn templates_are_resent_within_the_sync_period() {
        // 10 s period, 100 ms ticks: after 9 s, so the next pass (1 s) sends it.
        assert_eq!(super::resend_ticks(10_000, 100), 90);
        assert_eq!(super::resend_ticks(500, 100), 1, "every pass");
    }
}
