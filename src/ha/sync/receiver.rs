//! The standby's side: is a received datagram a sync message it may believe, and
//! which worker takes each synced session.
//!
//! [`Receiver::receive`] checks, cheapest first and before anything is installed: the
//! source is a configured peer; the message is well formed in this version; the HMAC
//! (when a key is configured); a resync request or dump chunk is addressed to this
//! node, a batch to no one in particular; every record is valid; every record's
//! virtual service exists here. Any failure rejects the whole datagram with one counted
//! [`RejectReason`], so a forged or damaged message installs nothing, not even its good
//! records. Whether an authenticated message is fresh (not a replay) is the peer
//! tracker's call (`sync::peers`), counted here too ([`Receiver::reject`]).
//!
//! [`check_record`] then holds each record against this node's own configuration: the
//! real server must be in the service with the record's forwarding mode, a FullNAT
//! local address one of the service's, and the timeout at most what this node would
//! give the state. A record that contradicts it is refused alone ([`Conflict`]).
//!
//! [`session_owner`] says which worker will own a synced session after a takeover:
//! the worker whose RX queue the NIC hashes the session's packets to, computed with
//! the data plane's own Toeplitz and RETA (`crate::flow::rss`), as the data plane
//! decides it (see `dataplane::forwarder` and `forward::laddr`).
use core::fmt;
use std::net::{Ipv4Addr, SocketAddr};

use super::auth;
use crate::flow::rss::{HashFields, Reta, Toeplitz};
use crate::ha::auth::SharedKey;
use crate::model::ForwardMode;
use crate::model::Service;
use crate::session::replication::{
    parse_records, MessageRepr, MessageType, Packet, RecordKind, RecordRepr, SyncWireError,
};
use crate::session::Timeouts;

/// Why a datagram was rejected. Each rejection counts exactly one reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RejectReason {
    /// The source address is not a configured peer.
    UnknownPeer,
    /// Not a sync message at all (bad magic).
    NotSync,
    /// A sync message of another version.
    WrongVersion,
    /// Shorter than its header or its declared length.
    Truncated,
    /// Inconsistent lengths, unknown type or flags.
    Malformed,
    /// A record with a forbidden value.
    BadRecord,
    /// The HMAC is wrong, missing while a key is configured, or present while none is.
    BadHmac,
    /// A resync request or dump chunk for another node, or a batch naming a recipient.
    Misdirected,
    /// Authenticated, but its sender (the node's listen address, under the HMAC) is
    /// not the address it came from: one peer's message replayed from another's.
    WrongSender,
    /// Authenticated, but not fresh: a sequence number already had or behind the
    /// window, or an earlier life of the peer (`sync::peers`).
    Replayed,
    /// Authenticated, from a life of the peer this node cannot confirm yet.
    UnconfirmedEpoch,
}

impl RejectReason {
    pub const COUNT: usize = 11;
    pub const ALL: [RejectReason; RejectReason::COUNT] = [
        RejectReason::UnknownPeer,
        RejectReason::NotSync,
        RejectReason::WrongVersion,
        RejectReason::Truncated,
        RejectReason::Malformed,
        RejectReason::BadRecord,
        RejectReason::BadHmac,
        RejectReason::Misdirected,
        RejectReason::WrongSender,
        RejectReason::Replayed,
        RejectReason::UnconfirmedEpoch,
    ];

    /// The counter's name in stats output.
    pub const fn name(self) -> &'static str {
        match self {
            RejectReason::UnknownPeer => "unknown_peer",
            RejectReason::NotSync => "not_sync",
            RejectReason::WrongVersion => "wrong_version",
            RejectReason::Truncated => "truncated",
            RejectReason::Malformed => "malformed",
            RejectReason::BadRecord => "bad_record",
            RejectReason::BadHmac => "bad_hmac",
            RejectReason::Misdirected => "misdirected",
            RejectReason::WrongSender => "wrong_sender",
            RejectReason::Replayed => "replayed",
            RejectReason::UnconfirmedEpoch => "unconfirmed_epoch",
        }
    }
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl From<SyncWireError> for RejectReason {
    fn from(error: SyncWireError) -> RejectReason {
        match error {
            SyncWireError::Truncated => RejectReason::Truncated,
            SyncWireError::BadMagic => RejectReason::NotSync,
            SyncWireError::WrongVersion(_) => RejectReason::WrongVersion,
            SyncWireError::BadLength
            | SyncWireError::UnknownType(_)
            | SyncWireError::UnknownFlags(_) => RejectReason::Malformed,
            SyncWireError::BadRecord { .. } => RejectReason::BadRecord,
        }
    }
}

/// What the receiver counted. Kept by the management core alone: plain integers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReceiverCounters {
    pub accepted_messages: u64,
    pub accepted_records: u64,
    pub rejected: [u64; RejectReason::COUNT],
}

impl ReceiverCounters {
    pub fn rejected(&self, reason: RejectReason) -> u64 {
        self.rejected[reason as usize]
    }

    pub fn rejected_total(&self) -> u64 {
        self.rejected.iter().sum()
    }
}

/// Who the standby listens to.
#[derive(Clone, Debug)]
pub struct ReceiverConfig {
    /// This node's listen address: the recipient resync requests and dump chunks for
    /// it name.
    pub local: Ipv4Addr,
    /// Source addresses sync messages are accepted from.
    pub peers: Vec<Ipv4Addr>,
    /// The shared key; when set, every message must carry a valid HMAC.
    pub key: Option<SharedKey>,
}

/// A message that passed every check; its records are all valid.
#[derive(Clone, Copy, Debug)]
pub struct Accepted<'a> {
    pub header: MessageRepr,
    packet: Packet<&'a [u8]>,
}

impl<'a> Accepted<'a> {
    /// The records, in order (parsed again from the datagram: no allocation).
    pub fn records(&self) -> impl Iterator<Item = RecordRepr> + 'a {
        let packet = self.packet;
        (0..packet.count() as usize).filter_map(move |i| RecordRepr::parse(&packet.record(i)).ok())
    }
}

/// Validates datagrams and counts the outcome.
#[derive(Debug)]
pub struct Receiver {
    config: ReceiverConfig,
    counters: ReceiverCounters,
}

impl Receiver {
    pub fn new(config: ReceiverConfig) -> Receiver {
        Receiver {
            config,
            counters: ReceiverCounters::default(),
        }
    }

    pub fn counters(&self) -> &ReceiverCounters {
        &self.counters
    }

    /// Counts a message that passed `receive` but was refused after it (not fresh):
    /// it is no longer an accepted one.
    pub fn reject(&mut self, accepted: &MessageRepr, reason: RejectReason) {
        self.counters.accepted_messages -= 1;
        self.counters.accepted_records -= u64::from(accepted.count);
        self.counters.rejected[reason as usize] += 1;
    }

    /// Checks `datagram` from `source`. Counts the result either way.
    pub fn receive<'a>(
        &mut self,
        datagram: &'a [u8],
        source: Ipv4Addr,
    ) -> Result<Accepted<'a>, RejectReason> {
        let result = validate(datagram, source, &self.config);
        match &result {
            Ok(accepted) => {
                self.counters.accepted_messages += 1;
                self.counters.accepted_records += u64::from(accepted.header.count);
            }
            Err(reason) => self.counters.rejected[*reason as usize] += 1,
        }
        result
    }
}

/// The checks of [`Receiver::receive`], without counting.
/// Records are checked for their values only: one for a virtual service this node
/// does not have is the caller's to skip (and count), as any record that
/// contradicts this node's config, so that peers whose services differ for a while
/// (a rolling config change) keep syncing the services they share.
pub fn validate<'a>(
    datagram: &'a [u8],
    source: Ipv4Addr,
    config: &ReceiverConfig,
) -> Result<Accepted<'a>, RejectReason> {
    if !config.peers.contains(&source) {
        return Err(RejectReason::UnknownPeer);
    }
    let packet = Packet::new_checked(datagram)?;
    // Authenticate before looking at anything the sender chose (type, records).
    auth::verify(&packet, config.key.as_ref()).map_err(|_| RejectReason::BadHmac)?;
    let header = MessageRepr::parse(&packet)?;
    // The key is shared by every node, so the HMAC alone does not say which node
    // sealed the message; its sender field does, and it must be where it came from.
    // Else a message captured from one peer, sent again from another's address, would
    // be judged fresh against that other peer's window (or taken for its restart).
    if header.sender != u32::from(source) {
        return Err(RejectReason::WrongSender);
    }
    let for_us = match header.message_type {
        MessageType::SessionBatch => header.recipient.is_unspecified(),
        MessageType::ResyncRequest | MessageType::DumpChunk => header.recipient == config.local,
    };
    if !for_us {
        return Err(RejectReason::Misdirected);
    }
    parse_records(&packet, |_| ())?;
    Ok(Accepted { header, packet })
}

/// How a record contradicts this node's configuration.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Conflict {
    /// The real server is not in the service here.
    UnknownRealServer,
    /// The real server forwards in another mode here (e.g. a DR record for a NAT
    /// real server).
    WrongMode,
    /// FullNAT: the local address is not one of the service's here.
    WrongLocal,
}

/// Holds `record` against `service` (the one of its virtual service here): the real
/// server must be in it (or be its sorry server) with the record's mode, a FullNAT local address must be one of
/// the service's. Returns the record with its timeout clamped to what this node gives
/// its state (`timeouts`; a template: the service's persistence timeout), and whether
/// it was clamped.
pub fn check_record(
    record: &RecordRepr,
    service: &Service,
    timeouts: &Timeouts,
) -> Result<(RecordRepr, bool), Conflict> {
    let rs = service
        .pinnable_server(record.real_server.ip(), record.real_server.port())
        .ok_or(Conflict::UnknownRealServer)?;
    if rs.mode != record.mode {
        return Err(Conflict::WrongMode);
    }
    if let Some(local) = record.local {
        if !service.has_local_address(local.ip()) {
            return Err(Conflict::WrongLocal);
        }
    }
    let limit_ms = match record.kind {
        RecordKind::Connection => timeouts.session_ms(record.proto, record.state),
        RecordKind::Template => service
            .persistence
            .map_or(0, |p| p.timeout_s.saturating_mul(1000)),
    };
    let mut checked = *record;
    checked.timeout_ms = record.timeout_ms.min(limit_ms);
    Ok((checked, checked.timeout_ms != record.timeout_ms))
}

/// Which worker (RX queue) owns a session, as the data plane decides it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Owner {
    /// The worker that must hold the session.
    pub queue: u16,
    /// The queue the client's packets land on. The same as `queue` except, possibly,
    /// for FullNAT (see [`session_owner`]).
    pub client_queue: u16,
}

impl Owner {
    /// FullNAT only: the client's packets and the real server's replies land on two
    /// different workers. The active node never creates such a session (it picks the
    /// local port so they agree), so on the standby it means its RSS key, RETA or
    /// queue count differs from the active's: the client side then needs the NAT-style
    /// redirect the data plane does not do for FullNAT yet.
    pub fn is_split(&self) -> bool {
        self.queue != self.client_queue
    }
}

/// The owner of a synced connection under this node's RSS (`None` for a template:
/// templates live in the table shared by all workers). `fields` are the fields the
/// device hashes IPv4 TCP/UDP tuples with, `fields6` those of IPv6 ones (the data
/// plane's `RssView::fields` and `fields6`: a device may hash the two differently).
///
/// - DR, TUN, NAT: the queue of the request tuple `client:cport -> VIP:vport`. That is
///   where the client's packets arrive; NAT replies are redirected there by
///   `nat_reply_owner` in the forwarder, which hashes this same tuple.
/// - FullNAT: the queue of the reply tuple `RIP:rport -> LIP:lport`, the tuple the
///   forwarder's `PortPool` chose `lport` for; replies are never redirected.
/// - IPv6: the queue the NIC's Toeplitz hash of the IPv6 tuple gives (source and
///   destination address, then the ports with L3L4), as RSS hashes IPv6 packets: of
///   the request tuple for DR, TUN and NAT (NAT replies are redirected there, by
///   `reply_owner_v6`), of the reply tuple for FullNAT (`local_port_v6` chose the
///   local port for it).
/// - NAT64 (an IPv6 client, FullNAT to an IPv4 real server from an IPv4 local
///   address): the queue of its IPv4 reply tuple, hashed as IPv4, the tuple the
///   worker's `PortPool` chose the port for; its client's packets hash as IPv6.
pub fn session_owner(
    record: &RecordRepr,
    toeplitz: &Toeplitz,
    reta: &Reta,
    fields: HashFields,
    fields6: HashFields,
) -> Option<Owner> {
    if record.kind != RecordKind::Connection {
        return None;
    }
    let queue_of = |src: SocketAddr, dst: SocketAddr| match (src, dst) {
        (SocketAddr::V4(s), SocketAddr::V4(d)) => {
            reta.queue(toeplitz.hash_tuple(fields, *s.ip(), *d.ip(), s.port(), d.port()))
        }
        _ => {
            let v6 = |a: SocketAddr| match a.ip() {
                std::net::IpAddr::V6(a) => a,
                std::net::IpAddr::V4(a) => a.to_ipv6_mapped(),
            };
            let hash = toeplitz.hash_tuple6(fields6, v6(src), v6(dst), src.port(), dst.port());
            reta.queue(hash)
        }
    };
    let client_queue = queue_of(record.client, record.virtual_service);
    let queue = match (record.mode, record.local) {
        (ForwardMode::FullNat, Some(local)) => queue_of(record.real_server, local),
        _ => client_queue,
    };
    Some(Owner {
        queue,
        client_queue,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::forwarder::{nat_reply_owner, RssView};
    use crate::flow::rss::DEFAULT_RSS_KEY;
    use crate::flow::FlowKey4;
    use crate::forward::laddr::{LaddrSet, LocalPort, PortPool};
    use crate::model::Protocol;
    use crate::model::SchedulerKind;
    use crate::model::ServiceKey;
    use crate::model::{RealServer, Service};
    use crate::service::Snapshot;
    use crate::session::replication::{
        MessageBuilder, MessageFlags, MessageType, RecordOp, HEADER_LEN, RECORD_LEN,
    };
    use crate::session::{Session, TcpState};
    use crate::wire::test_util::XorShift;
    use std::net::SocketAddrV4;

    const PEER: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
    const US: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 3);
    const VIP: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 10);
    const RS: Ipv4Addr = Ipv4Addr::new(10, 1, 0, 21);

    fn record(vip: Ipv4Addr, cport: u16) -> RecordRepr {
        let key = FlowKey4::new(
            Protocol::Tcp,
            Ipv4Addr::new(198, 51, 100, 7),
            cport,
            vip,
            80,
        );
        let mut session = Session::new(&key, ForwardMode::Nat, 0, 0, RS, 8080);
        session.set_state(TcpState::Established);
        RecordRepr::connection(&session, RecordOp::Update, 900_000)
    }

    fn message(records: &[RecordRepr], key: Option<&SharedKey>) -> Vec<u8> {
        let header = MessageRepr {
            message_type: MessageType::SessionBatch,
            flags: MessageFlags::empty(),
            sender: u32::from(PEER),
            recipient: Ipv4Addr::UNSPECIFIED,
            epoch: 1,
            sequence: 1,
            dump_id: 0,
            chunk: 0,
            count: 0,
        };
        let mut buf = [0u8; 1500];
        let mut builder = MessageBuilder::new(&mut buf, header, 1500, key.is_some());
        for r in records {
            builder.push(r).unwrap();
        }
        let out = builder.finish();
        if let Some(key) = key {
            auth::seal(out, key);
        }
        out.to_vec()
    }

    fn receiver(key: Option<SharedKey>) -> Receiver {
        Receiver::new(ReceiverConfig {
            local: US,
            peers: vec![PEER, Ipv4Addr::new(192, 0, 2, 2)],
            key,
        })
    }

    #[test]
    fn accepts_and_returns_records() {
        let key = SharedKey::new(b"a shared key, 32 bytes long.....").unwrap();
        let records = [record(VIP, 1000), record(VIP, 1001)];
        for key in [None, Some(key)] {
            let mut rx = receiver(key.clone());
            let bytes = message(&records, key.as_ref());
            let accepted = rx.receive(&bytes, PEER).unwrap();
            assert_eq!(accepted.records().collect::<Vec<_>>(), records);
            assert_eq!(rx.counters().accepted_messages, 1);
            assert_eq!(rx.counters().accepted_records, 2);
            assert_eq!(rx.counters().rejected_total(), 0);
        }
        // A record for a service this node lacks does not void the message: the
        // caller skips it and installs the rest.
        let other = [record(VIP, 1000), record(Ipv4Addr::new(203, 0, 113, 99), 1)];
        let mut rx = receiver(None);
        let bytes = message(&other, None);
        let accepted = rx.receive(&bytes, PEER).unwrap();
        assert_eq!(accepted.records().collect::<Vec<_>>(), other);
    }

    /// Each forged or malformed case is rejected with its own reason, counted once,
    /// and nothing comes out to install.
    #[test]
    fn every_reject_reason() {
        let key = SharedKey::new(b"a shared key, 32 bytes long.....").unwrap();
        let good = message(&[record(VIP, 1000), record(VIP, 1001)], Some(&key));
        let mut rx = receiver(Some(key.clone()));
        assert!(rx.receive(&good, PEER).is_ok());

        let mut cases: Vec<(Vec<u8>, Ipv4Addr, RejectReason)> = Vec::new();
        cases.push((
            good.clone(),
            Ipv4Addr::new(192, 0, 2, 99),
            RejectReason::UnknownPeer,
        ));
        let mut v1 = good.clone();
        v1[4] = 1;
        cases.push((v1, PEER, RejectReason::WrongVersion));
        cases.push((
            good[..good.len() - 1].to_vec(),
            PEER,
            RejectReason::Truncated,
        ));
        cases.push((
            good[..HEADER_LEN - 1].to_vec(),
            PEER,
            RejectReason::Truncated,
        ));
        let mut magic = good.clone();
        magic[0] = 0;
        cases.push((magic, PEER, RejectReason::NotSync));
        let mut tampered = good.clone();
        tampered[HEADER_LEN + 9] ^= 1; // client address of record 0
        cases.push((tampered, PEER, RejectReason::BadHmac));
        // Unauthenticated message to a keyed receiver.
        cases.push((
            message(&[record(VIP, 1)], None),
            PEER,
            RejectReason::BadHmac,
        ));
        // A well-authenticated message with a bad record (forged by a key holder, or
        // a sender bug): still nothing installed.
        let mut bad_record = good.clone();
        bad_record[HEADER_LEN + RECORD_LEN + 2] = 1; // protocol of record 1
        auth::seal(&mut bad_record, &key);
        cases.push((bad_record, PEER, RejectReason::BadRecord));
        let mut bad_type = good.clone();
        bad_type[5] = 9;
        auth::seal(&mut bad_type, &key);
        cases.push((bad_type, PEER, RejectReason::Malformed));
        // A batch naming a recipient; a resync request for another node (a copy of
        // one sent to the other peer), and one for us that passes.
        let mut named = good.clone();
        named[16..20].copy_from_slice(&US.octets());
        auth::seal(&mut named, &key);
        cases.push((named, PEER, RejectReason::Misdirected));
        let mut sender =
            crate::ha::sync::sender::SyncSender::new(u32::from(PEER), 1500, Some(key.clone()));
        let mut buf = [0u8; 128];
        let other = Ipv4Addr::new(192, 0, 2, 2);
        let to_other = sender.resync_request(5, other, &mut buf).to_vec();
        cases.push((to_other, PEER, RejectReason::Misdirected));
        let to_us = sender.resync_request(6, US, &mut buf).to_vec();
        assert!(rx.receive(&to_us, PEER).is_ok());
        // PEER's own batch and request, sent again from the other peer's address:
        // authentic, but not that peer's.
        cases.push((good.clone(), other, RejectReason::WrongSender));
        cases.push((to_us.clone(), other, RejectReason::WrongSender));

        for (bytes, source, reason) in &cases {
            assert_eq!(rx.receive(bytes, *source).map(|a| a.header), Err(*reason));
        }
        for reason in RejectReason::ALL {
            let want = cases.iter().filter(|c| c.2 == reason).count() as u64;
            assert_eq!(rx.counters().rejected(reason), want, "{reason}");
        }
        assert_eq!(rx.counters().accepted_messages, 2);

        // Without a key, a keyed message is refused too (the peers disagree).
        let mut open = receiver(None);
        assert_eq!(
            open.receive(&good, PEER).map(|a| a.header),
            Err(RejectReason::BadHmac)
        );
    }

    #[test]
    fn random_garbage_from_a_peer_is_counted_never_accepted() {
        let mut rng = XorShift(0x0bad_5eed_0bad_5eed);
        let mut rx = receiver(Some(SharedKey::new(&[9; 32]).unwrap()));
        let mut buf = [0u8; 300];
        for _ in 0..5000 {
            let len = rng.below(buf.len());
            rng.fill(&mut buf[..len]);
            if rng.below(2) == 0 && len >= 8 {
                buf[..5].copy_from_slice(&[0x53, 0x4c, 0x53, 0x59, 2]);
            }
            assert!(rx.receive(&buf[..len], PEER).is_err());
        }
        assert_eq!(rx.counters().rejected_total(), 5000);
    }

    fn nat_snapshot() -> Snapshot {
        let service = Service {
            id: 0,
            key: ServiceKey::new(Protocol::Tcp, VIP, 80),
            scheduler: SchedulerKind::Rr,
            persistence: None,
            real_servers: vec![RealServer {
                id: 0,
                ip: RS.into(),
                port: 8080,
                weight: 1,
                mode: ForwardMode::Nat,
                upper: 0,
                lower: 0,
            }],
            local_addresses: Vec::new(),
            toa: false,
            sched_flags: Default::default(),
            mh_table_size: crate::model::MH_DEFAULT_TABLE_SIZE,
            synproxy: crate::model::SynProxy::default(),
            sorry_server: None,
            sloppy_tcp: false,
        };
        Snapshot::from_services(1, vec![service])
    }

    /// NAT: the owner is what the forwarder's own redirect decision says. A reply
    /// landing on worker q is redirected to the owner, or kept when q is the owner.
    #[test]
    fn nat_owner_matches_the_forwarders_redirect() {
        let snap = nat_snapshot();
        let mut rng = XorShift(0x4e47_0000_0000_0001);
        for queues in [2u16, 4, 6] {
            let toeplitz = Toeplitz::new(&DEFAULT_RSS_KEY).unwrap();
            let reta = Reta::new_round_robin(128, queues).unwrap();
            for _ in 0..300 {
                let client = Ipv4Addr::from(rng.next_u64() as u32);
                let cport = rng.next_u64() as u16;
                let key = FlowKey4::new(Protocol::Tcp, client, cport, VIP, 80);
                let session = Session::new(&key, ForwardMode::Nat, 0, 0, RS, 8080);
                let record = RecordRepr::connection(&session, RecordOp::Update, 1);
                let owner = session_owner(
                    &record,
                    &toeplitz,
                    &reta,
                    HashFields::L3L4,
                    HashFields::L3L4,
                )
                .unwrap();
                assert!(!owner.is_split());
                let reply = session.reply_key().unwrap();
                for queue in 0..queues {
                    let rss = RssView {
                        toeplitz: toeplitz.clone(),
                        reta: reta.clone(),
                        fields: HashFields::L3L4,
                        fields6: HashFields::L3L4,
                        queue,
                        steer: false,
                        steer6: false,
                    };
                    let redirect = nat_reply_owner(&snap, &rss, &reply, false);
                    let expected = (owner.queue != queue).then_some(owner.queue);
                    assert_eq!(redirect, expected, "{client}:{cport} seen on {queue}");
                }
            }
        }
    }

    /// FullNAT: the owner of a session is the worker whose `PortPool` handed out its
    /// local port, for every port handed out, on both hash field settings.
    #[test]
    fn fullnat_owner_is_the_worker_that_allocated_the_port() {
        let lips = [Ipv4Addr::new(10, 1, 255, 1), Ipv4Addr::new(10, 1, 255, 2)];
        let mut rng = XorShift(0xf0_11ad_0000_0002);
        for fields in [HashFields::L3L4, HashFields::L3] {
            let toeplitz = Toeplitz::new(&DEFAULT_RSS_KEY).unwrap();
            let reta = Reta::new_round_robin(128, 4).unwrap();
            for queue in 0..4u16 {
                let (mut pool, mut set) =
                    PortPool::build(&lips, 1024..=65535, &toeplitz, &reta, fields, queue).unwrap();
                for _ in 0..300 {
                    let rs = SocketAddrV4::new(
                        Ipv4Addr::from(rng.next_u64() as u32),
                        rng.next_u64() as u16 | 1,
                    );
                    let Some(LocalPort {
                        lip, port: lport, ..
                    }) = pool.allocate(&mut set, rs, 0)
                    else {
                        continue; // L3 hashing: this worker may own no class for rs
                    };
                    // The client side: a client whose request hashes to this worker.
                    let (client, cport) = loop {
                        let c = Ipv4Addr::from(rng.next_u64() as u32);
                        let p = rng.next_u64() as u16;
                        let h = toeplitz.hash_tuple(fields, c, VIP, p, 80);
                        if reta.queue(h) == queue {
                            break (c, p);
                        }
                    };
                    let key = FlowKey4::new(Protocol::Tcp, client, cport, VIP, 80);
                    let session =
                        Session::new(&key, ForwardMode::FullNat, 0, 0, *rs.ip(), rs.port())
                            .with_local(lip, lport);
                    let record = RecordRepr::connection(&session, RecordOp::Update, 1);
                    let owner = session_owner(&record, &toeplitz, &reta, fields, fields).unwrap();
                    assert_eq!(
                        owner.queue,
                        pool.owner_queue(),
                        "{fields:?} {rs} {lip}:{lport}"
                    );
                    assert!(!owner.is_split());
                }
            }
        }
    }

    /// A record must agree with the service here: real server, mode, local address;
    /// its timeout is clamped to this node's for the state.
    #[test]
    fn records_contradicting_the_local_config_are_refused() {
        let snap = nat_snapshot();
        let service = snap.find(&ServiceKey::new(Protocol::Tcp, VIP, 80)).unwrap();
        let timeouts = Timeouts::default();
        let good = record(VIP, 1000);
        assert_eq!(check_record(&good, service, &timeouts), Ok((good, false)));
        // A DR record for the NAT real server.
        let mut dr = good;
        dr.mode = ForwardMode::Dr;
        assert_eq!(
            check_record(&dr, service, &timeouts),
            Err(Conflict::WrongMode)
        );
        // Another real server, or another port of it.
        for rs in [
            SocketAddrV4::new(Ipv4Addr::new(10, 1, 0, 99), 8080),
            SocketAddrV4::new(RS, 8081),
        ] {
            let mut other = good;
            other.real_server = rs.into();
            assert_eq!(
                check_record(&other, service, &timeouts),
                Err(Conflict::UnknownRealServer)
            );
        }
        // FullNAT: the local address must be the service's.
        let mut fnat_service = service.clone();
        fnat_service.real_servers[0].mode = ForwardMode::FullNat;
        fnat_service.local_addresses = vec![Ipv4Addr::new(10, 1, 255, 1).into()];
        let mut fnat = good;
        fnat.mode = ForwardMode::FullNat;
        fnat.local = Some(SocketAddrV4::new(Ipv4Addr::new(10, 1, 255, 1), 5000).into());
        assert!(check_record(&fnat, &fnat_service, &timeouts).is_ok());
        fnat.local = Some(SocketAddrV4::new(Ipv4Addr::new(10, 1, 255, 2), 5000).into());
        assert_eq!(
            check_record(&fnat, &fnat_service, &timeouts),
            Err(Conflict::WrongLocal)
        );
        // A forged 24.8-day timeout: clamped to ESTABLISHED's 900 s here.
        let mut long = good;
        long.timeout_ms = crate::session::replication::MAX_TIMEOUT_MS;
        let (clamped, was) = check_record(&long, service, &timeouts).unwrap();
        assert_eq!((clamped.timeout_ms, was), (900_000, true));
        // A template: clamped to the service's persistence timeout (none here: 0).
        let template = RecordRepr::template(
            RecordOp::Update,
            Protocol::Tcp,
            SocketAddrV4::new(VIP, 80),
            Ipv4Addr::new(198, 51, 100, 0),
            24,
            SocketAddrV4::new(RS, 8080),
            ForwardMode::Nat,
            1_000_000,
        );
        let mut persistent = service.clone();
        persistent.persistence = Some(crate::model::Persistence {
            netmask: Ipv4Addr::new(255, 255, 255, 0),
            ..crate::model::Persistence::new(300)
        });
        let (t, was) = check_record(&template, &persistent, &timeouts).unwrap();
        assert_eq!((t.timeout_ms, was), (300_000, true));
    }

    /// A session pinned to the sorry server is held against the table's service, whose
    /// `real_servers` leave the sorry server out: it is accepted all the same.
    #[test]
    fn a_record_for_the_sorry_server_is_accepted() {
        let key = ServiceKey::new(Protocol::Tcp, VIP, 80);
        let mut table = crate::service::ServiceTable::new();
        table.add_service(key, SchedulerKind::Rr, None).unwrap();
        table
            .add_server(
                key,
                crate::model::RealServerSpec::new(RS, 8080, 1, ForwardMode::Nat),
            )
            .unwrap();
        let sorry = SocketAddrV4::new(Ipv4Addr::new(10, 1, 0, 99), 80);
        table
            .set_sorry_server(
                key,
                Some(crate::model::SorryServerSpec {
                    ip: (*sorry.ip()).into(),
                    port: sorry.port(),
                    mode: ForwardMode::Nat,
                    inhibit: false,
                }),
            )
            .unwrap();
        let service = table.get(key).unwrap();
        assert!(service.server(*sorry.ip(), sorry.port()).is_none());
        let timeouts = Timeouts::default();
        let mut to_sorry = record(VIP, 1000);
        to_sorry.real_server = sorry.into();
        assert_eq!(
            check_record(&to_sorry, service, &timeouts),
            Ok((to_sorry, false))
        );
        let mut dr = to_sorry;
        dr.mode = ForwardMode::Dr;
        assert_eq!(
            check_record(&dr, service, &timeouts),
            Err(Conflict::WrongMode)
        );
        // Another port of the sorry server's address is not it.
        let mut other = to_sorry;
        other.real_server = SocketAddrV4::new(*sorry.ip(), 81).into();
        assert_eq!(
            check_record(&other, service, &timeouts),
            Err(Conflict::UnknownRealServer)
        );
    }

    #[test]
    fn split_fullnat_and_templates() {
        let toeplitz = Toeplitz::new(&DEFAULT_RSS_KEY).unwrap();
        let reta = Reta::new_round_robin(128, 8).unwrap();
        // Some local port puts the reply on another queue than the request.
        let key = FlowKey4::new(
            Protocol::Tcp,
            Ipv4Addr::new(198, 51, 100, 7),
            40000,
            VIP,
            80,
        );
        let split = (1024..2048u16).find_map(|lport| {
            let s = Session::new(&key, ForwardMode::FullNat, 0, 0, RS, 8080)
                .with_local(Ipv4Addr::new(10, 1, 255, 1), lport);
            let r = RecordRepr::connection(&s, RecordOp::Update, 1);
            session_owner(&r, &toeplitz, &reta, HashFields::L3L4, HashFields::L3L4)
                .filter(Owner::is_split)
        });
        assert!(split.is_some());
        let template = RecordRepr::template(
            RecordOp::Update,
            Protocol::Tcp,
            SocketAddrV4::new(VIP, 80),
            Ipv4Addr::new(198, 51, 100, 0),
            24,
            SocketAddrV4::new(RS, 8080),
            ForwardMode::Nat,
            1,
        );
        assert_eq!(
            session_owner(
                &template,
                &toeplitz,
                &reta,
                HashFields::L3L4,
                HashFields::L3L4
            ),
            None
        );
    }

    /// An IPv6 record's owner is the queue of the Toeplitz hash of its IPv6 request
    /// tuple: checked against the IPv6 verification vectors of Microsoft's RSS
    /// specification ("Verifying the RSS Hash Calculation": source, destination, their
    /// ports; the hash over the addresses alone, and with the ports), through a
    /// 65536-entry table that maps each hash's low 16 bits to a queue of that number.
    #[test]
    fn an_ipv6_owner_is_the_queue_of_the_ipv6_tuples_hash() {
        let toeplitz = Toeplitz::new(&DEFAULT_RSS_KEY).unwrap();
        let reta = Reta::from_entries((0..=u16::MAX).collect()).unwrap();
        let vectors = [
            (
                "3ffe:2501:200:1fff::7",
                2794,
                "3ffe:2501:200:3::1",
                1766,
                0x2cc1_8cd5u32,
                0x4020_7d3du32,
            ),
            (
                "3ffe:501:8::260:97ff:fe40:efab",
                14230,
                "ff02::1",
                4739,
                0x0f0c_461c,
                0xdde5_1bbf,
            ),
            (
                "3ffe:1900:4545:3:200:f8ff:fe21:67cf",
                44251,
                "fe80::200:f8ff:fe21:67cf",
                38024,
                0x4b61_e985,
                0x02d1_feef,
            ),
        ];
        let other = |f| match f {
            HashFields::L3 => HashFields::L3L4,
            HashFields::L3L4 => HashFields::L3,
        };
        for (src, sport, dst, dport, l3, l3l4) in vectors {
            let mut r = record(VIP, 1);
            r.mode = ForwardMode::Dr;
            r.client = SocketAddr::new(src.parse().unwrap(), sport);
            r.virtual_service = SocketAddr::new(dst.parse().unwrap(), dport);
            r.real_server = SocketAddr::new("2001:db8::2".parse().unwrap(), 80);
            for (fields, hash) in [(HashFields::L3, l3), (HashFields::L3L4, l3l4)] {
                // The IPv4 fields do not matter to an IPv6 tuple.
                let owner = session_owner(&r, &toeplitz, &reta, other(fields), fields).unwrap();
                assert_eq!(
                    (owner.queue, owner.client_queue),
                    (hash as u16, hash as u16),
                    "{src} -> {dst} {fields:?}"
                );
            }
        }
    }
    /// IPv6 owners are the data plane's with several workers, whatever the IPv4
    /// fields: NAT by the view's owner of the request tuple (where `reply_owner_v6`
    /// redirects replies), FullNAT by the view's owner of the reply tuple (the one
    /// `local_port_v6` chose the port for), NAT64 by the worker whose IPv4
    /// `PortPool` handed out the port. The IPv6 fields differing from the IPv4 ones,
    /// hashing IPv6 tuples with the IPv4 fields would put some on other workers.
    #[test]
    fn ipv6_owners_follow_the_ipv6_view_of_the_data_plane() {
        let toeplitz = Toeplitz::new(&DEFAULT_RSS_KEY).unwrap();
        let reta = Reta::new_round_robin(128, 4).unwrap();
        let vip: std::net::Ipv6Addr = "2001:db8:18::100".parse().unwrap();
        let rs6: std::net::Ipv6Addr = "2001:db8:1a::11".parse().unwrap();
        let lip6: std::net::Ipv6Addr = "2001:db8:1a::50".parse().unwrap();
        let lips = [Ipv4Addr::new(10, 1, 255, 1)];
        let mut rng = XorShift(0x0006_0000_0000_0006);
        for (fields, fields6) in [
            (HashFields::L3, HashFields::L3L4),
            (HashFields::L3L4, HashFields::L3),
        ] {
            let view = |queue| RssView {
                toeplitz: toeplitz.clone(),
                reta: reta.clone(),
                fields,
                fields6,
                queue,
                steer: true,
                steer6: true,
            };
            let mut pools: Vec<(PortPool, LaddrSet)> = (0..4)
                .map(|q| PortPool::build(&lips, 1024..=65535, &toeplitz, &reta, fields, q).unwrap())
                .collect();
            let mut moved = 0;
            for n in 0..400u32 {
                let client = std::net::Ipv6Addr::from(
                    0x2001_0db8_0002_0000_0000_0000_0000_0000u128 | u128::from(rng.next_u64()),
                );
                let key = crate::flow::FlowKey6 {
                    src: client,
                    dst: vip,
                    sport: rng.next_u64() as u16,
                    dport: 80,
                    proto: Protocol::Tcp,
                };
                let owner = |s: &crate::session::table6::Session6| {
                    let r = RecordRepr::connection6(s, RecordOp::Update, 1);
                    let wrong = session_owner(&r, &toeplitz, &reta, fields, fields);
                    (
                        session_owner(&r, &toeplitz, &reta, fields, fields6).unwrap(),
                        wrong.unwrap().queue,
                    )
                };
                let client_queue = view(0).owner_of6(&key);
                // NAT.
                let nat =
                    crate::session::table6::Session6::new(&key, ForwardMode::Nat, 0, 0, rs6, 8080);
                let (o, wrong) = owner(&nat);
                assert_eq!((o.queue, o.client_queue), (client_queue, client_queue));
                moved += usize::from(wrong != o.queue);
                // FullNAT: the local port a worker would choose, i.e. one whose reply
                // tuple its view owns.
                let mut full = crate::session::table6::Session6::new(
                    &key,
                    ForwardMode::FullNat,
                    0,
                    0,
                    rs6,
                    8080,
                );
                (full.local_addr, full.local_port) = (lip6, 1024 + (n as u16 % 60000));
                let reply = full.reply_key().unwrap();
                let (o, _) = owner(&full);
                assert_eq!(o.queue, view(0).owner_of6(&reply));
                assert_eq!(o.client_queue, client_queue);
                for q in 0..4u16 {
                    // Steering on worker q sends the reply to the owner, or keeps it.
                    let stays = view(q).steer_to6(&reply, false).is_none();
                    assert_eq!(stays, q == o.queue);
                }
                // NAT64: the worker the client's packets land on takes an IPv4 port.
                let rs4 = SocketAddrV4::new(Ipv4Addr::from(rng.next_u64() as u32), 8080);
                let (pool, set) = &mut pools[usize::from(client_queue)];
                let Some(LocalPort { lip, port, .. }) = pool.allocate(set, rs4, 0) else {
                    continue; // L3 hashing: this worker may own no class for rs4
                };
                let mut nat64 = crate::session::table6::Session6::new(
                    &key,
                    ForwardMode::FullNat,
                    0,
                    0,
                    rs4.ip().to_ipv6_mapped(),
                    8080,
                );
                (nat64.local_addr, nat64.local_port) = (lip.to_ipv6_mapped(), port);
                let (o, _) = owner(&nat64);
                assert_eq!(o.queue, pool.owner_queue(), "{rs4} {lip}:{port}");
                assert!(!o.is_split());
            }
            assert!(moved > 100, "{fields:?}/{fields6:?}: {moved} of 400 moved");
        }
    }
}
