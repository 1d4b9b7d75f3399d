//! The forwarding core of one worker: classify a frame, find or create its session,
//! rewrite it for its mode (DR, NAT, TUN) and say where it goes. Owns the worker's
//! session table and scheduler instances; reads services from the RCU snapshot.
//!
//! A TCP/UDP packet's path reads in `Forwarder::l4`, stage after stage, each stage
//! in its own file under `forwarder/`: look up, then `hit` (an established session)
//! or `miss` (no session: a new connection or something else), `admission` (the
//! service's access list and rate limit) and `placement` (which
//! real server, which local port; the session opens), `observe` (accounting, passive
//! health, session sync), `egress` (rewrite for the mode, next hop). ICMP errors
//! about a session take `icmp_error`, ICMPv6 errors and NAT64's `icmp6_error`.
pub mod admission;
mod burst;
mod confirm;
mod egress;
mod hit;
mod icmp6_error;
mod icmp_error;
mod ipv6;
mod miss;
mod observe;
mod placement;
mod sync6;
mod synproxy;

// The sync receiver's tests check their redirects against it.
#[cfg(test)]
pub(crate) use miss::nat_reply_owner;

use crate::dataplane::awaiting::AwaitServer;
use crate::dataplane::counters::{bump, Event, WorkerCounters};
use crate::dataplane::exception;
use crate::dataplane::loads::LoadView;
use crate::dataplane::local::{LocalResponder, NeighbourPolicy, Verdict};
use crate::dataplane::neighbour::{Neighbour6Table, NeighbourTable};
use crate::dataplane::overload::Overload;
use crate::dataplane::probe_acks::ProbeAcks;
use crate::dataplane::query::{
    ConnectionEntry, ListedSession, NeighbourEntry, NeighbourRole, NeighbourTables, PoolEntry,
    Query, NEIGHBOUR_SLOTS_PER_ANSWER, SLOTS_PER_ANSWER,
};
use crate::dataplane::realserver_stats::{Passive, RealServerCounters};
use crate::dpdk::{Burst, Packet, BURST_SIZE};
use crate::flow::parse::{classify, peek_key, peek_key6, Ipv6Payload, PacketKind, Parsed};
use crate::flow::rss::{HashFields, Reta, Toeplitz};
use crate::flow::{FlowKey4, FlowKey6};
use crate::forward::laddr::{LaddrSet, PortPool};
use crate::forward::timestamps;
use crate::model::DropReason;
use crate::model::{ForwardMode, Protocol, ServiceKey};
use crate::sched::{self, Scheduler, ServerLoad};
use crate::service::SnapshotReader;
use crate::session::persist::{PersistTable, Trust};
use crate::session::table6::{HashedKey6, SessionTable6};
use crate::session::{
    ClientSegment, Direction, HashedKey, Session, SessionFlags, SessionId, SessionTable,
    TickTimeouts, Transition,
};
use crate::wire::ethernet::{self, MacAddr};
use crate::wire::tcp::TcpFlags;
use crate::wire::vrrp;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

/// Sessions expired per poll at most, so expiry never stalls the RX loop.
const EXPIRY_BUDGET: usize = 64;
/// Slots of the ARP-request rate limiter (direct-mapped by address).
const ARP_LIMITER_SLOTS: usize = 64;
/// A real server's neighbour entry not confirmed for this long is asked for again
/// (an ARP request or Neighbor Solicitation, to everyone), so a MAC that changed
/// without a gratuitous ARP is found within about this time. Linux holds an entry
/// reachable for 15 to 45 s before checking it. One request per real server per
/// period: 1,000 real servers cost about 33 a second.
pub const NEIGHBOUR_RECHECK_S: u64 = 30;
/// An IPv4 neighbour entry that is neither a real server's nor a configured peer's,
/// neither learned nor confirmed for this long, gives its slot to a new entry when its
/// share of the table is full (`NeighbourTable::learn_making_room`). Hosts in use
/// confirm theirs every minute or so (Linux re-resolves a neighbour it talks to after
/// 15 to 45 s); one given up while still wanted is asked for again.
pub const NEIGHBOUR_STALE_S: u64 = 300;

/// What the port a frame arrived on looks like to the forwarder.
pub struct PortContext<'a> {
    pub responder: &'a LocalResponder,
    /// The port's index among the worker's: where the SYN proxy's timer sends a SYN
    /// again.
    pub index: u16,
    pub mac: MacAddr,
    /// The port's first address: source of Sluice's own ARP, ICMP and tunnel packets.
    pub addr: Ipv4Addr,
    pub mtu: u16,
    /// The frames come from another worker's redirect ring: never redirect them again.
    pub redirected: bool,
    /// The port has a kernel interface (`[ports.exception]`): frames for its own
    /// addresses that Sluice does not handle go there (`Action::Exception`).
    pub exception: bool,
}

/// What to do with a frame after `Forwarder::handle`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Transmit the (rewritten) frame on the port it came from.
    Transmit,
    /// Drop it, counting the reason.
    Drop(DropReason),
    /// The frame was turned into something else Sluice must send (an ARP request for
    /// an unresolved next hop, an ICMP frag-needed): transmit it, and count the
    /// original packet as dropped for `reason`.
    TransmitInstead(DropReason),
    /// The frame belongs to a session of the worker owning this RX queue (a NAT reply
    /// the NIC's hash put elsewhere): hand it to that worker's redirect ring.
    Redirect(u16),
    /// For the management core (an answer to a health probe, a VRRP advertisement, a
    /// sync datagram with `[sync] port`): hand it over through the health ring.
    Punt,
    /// For the kernel: the port's own addresses' traffic that Sluice does not handle
    /// (`dataplane::exception`): hand it to the port's exception ring, on the budget
    /// it draws on.
    Exception(exception::Punt),
    /// The frame is rewritten but its next hop's MAC is unknown: hold it until this
    /// address resolves (the worker asks for it by ARP, or for an IPv6 next hop by
    /// Neighbor Solicitation), then address and send it.
    Hold(std::net::IpAddr),
    /// A client segment of a proxied session whose real server has not answered yet:
    /// give it to [`Forwarder::await_server`], and it goes through `handle` again
    /// once the server has ([`Forwarder::release_awaiting`]).
    AwaitServer(AwaitServer),
    /// The packet waits for the end of its burst, where [`Forwarder::handle_burst`]
    /// finishes it and hands on its real action: a new session is filed then, once
    /// its reply key's bucket has loaded. Only `handle_burst` parks packets, and it
    /// never hands this action on.
    Parked,
}

/// What a packet is handled with besides the forwarder's own state, for one call of
/// `Forwarder::handle`: the port it came in on, the worker's neighbour table, the
/// time and the worker's counters.
struct Context<'a> {
    port: &'a PortContext<'a>,
    neighbours: &'a mut NeighbourTable,
    now_tsc: u64,
    counters: &'a WorkerCounters,
}

/// What `handle` makes of a frame's Ethernet header, before it parses anything else.
/// The burst's passes neither peek at nor classify a frame decided here
/// ([`EthernetVerdict::needs_parsing`]): a flood of such frames costs their drop,
/// not a parse each. (Only a frame to the VRRP or sync group is parsed, by
/// [`Forwarder::to_group`] itself.)
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum EthernetVerdict {
    /// Shorter than an Ethernet header.
    Truncated,
    /// From a group address: no host sends from one.
    MulticastSource,
    /// For another host, or a group other than the broadcast and IPv6's: dropped
    /// unless it is the VRRP or sync group ([`Forwarder::to_group`]).
    NotOurs(MacAddr),
    /// For the port's MAC, the broadcast address or an IPv6 group (Neighbor
    /// Discovery, which the responder checks): parsed, sent to this MAC.
    Parse(MacAddr),
}

impl EthernetVerdict {
    #[inline(always)]
    fn of(frame: &[u8], port_mac: MacAddr) -> EthernetVerdict {
        let Ok(eth) = ethernet::Frame::new_checked(frame) else {
            return EthernetVerdict::Truncated;
        };
        if eth.src_addr().is_multicast() {
            return EthernetVerdict::MulticastSource;
        }
        let to = eth.dst_addr();
        if to == port_mac || to.is_broadcast() || to.is_ipv6_multicast() {
            EthernetVerdict::Parse(to)
        } else {
            EthernetVerdict::NotOurs(to)
        }
    }

    /// Whether `handle` goes on to parse `frame`, which came in on a port with MAC
    /// `port_mac`.
    #[inline(always)]
    fn needs_parsing(frame: &[u8], port_mac: MacAddr) -> bool {
        matches!(Self::of(frame, port_mac), EthernetVerdict::Parse(_))
    }
}

/// What the burst's prefetch passes leave to do ([`Forwarder::prefetch_parsed`]).
struct Prefetched {
    /// Which frames `handle` parses.
    parses: [bool; BURST_SIZE],
    past_home: PastHome,
}

/// The frames (one bit each) whose key may lie past its home bucket (no tag of it
/// there, and keys passed it), in the IPv4 and the IPv6 table: their next bucket is
/// loading.
#[derive(Clone, Copy, Debug, Default)]
struct PastHome {
    v4: u32,
    v6: u32,
}

/// The session a TCP/UDP packet belongs to, as the hit stage found it or placement
/// opened it: which of its keys the packet matched, the entry, and what the packet
/// did to its state.
///
/// `session` is a copy of the entry: as the packet found it (the hit stage), or as
/// its first packet left it (placement, which files it and moves it by that packet).
/// Egress and accounting read what no packet moves from it: the addresses, ports,
/// mode, service, real server, and the flags they check. What a packet moves (the
/// TCP state, whose move `transition` gives, `NO_OUTPUT`, the client's sequence, the
/// timer, a UDP session's count) is read from the live entry, `sessions.get(id)`.
/// The peer's MAC is read from the copy: a NAT or FullNAT client's packet moves it
/// after the copy, and that packet goes to the real server, which does not use it;
/// a DR or TUN packet moves it once sent.
struct Matched {
    id: SessionId,
    dir: Direction,
    session: Session,
    transition: Option<Transition>,
}

pub struct Forwarder {
    sessions: SessionTable,
    /// IPv6 sessions, in a table of their own (`session::table6`).
    sessions6: SessionTable6,
    /// The SYN proxy's per-slot side array and rate meters.
    synproxy: synproxy::ProxyState,
    /// Each frame's tuple and hash as the burst's prefetch pass peeked them.
    peeked: [Option<HashedKey>; BURST_SIZE],
    /// The same for IPv6 frames: written only for the burst's IPv6 frames (the
    /// others keep an earlier burst's, which [`Forwarder::hashed6`] sees through).
    peeked6: [Option<HashedKey6>; BURST_SIZE],
    /// [`ForwarderConfig::park_new_sessions`], decided.
    park_new_sessions: bool,
    /// Within [`Forwarder::handle_burst`]: new sessions are made but filed at the
    /// burst's end (`forwarder/burst.rs`).
    parking: bool,
    /// The burst's packets that wait for the end of it: new sessions and the later
    /// packets of their connections, in arrival order. Never more than a burst.
    parked: Vec<burst::Parked>,
    /// The hashes of the keys the parked sessions will be filed under (two a
    /// session at most): a packet's check against them is one compare each.
    parked_hashes: Vec<crate::session::KeyHash>,
    snapshot: SnapshotReader,
    /// One scheduler per service, by snapshot index; rebuilt when a new snapshot
    /// changes the service's scheduling inputs.
    schedulers: Vec<Box<dyn Scheduler>>,
    /// The id and [`Snapshot::scheduling_version`] of each service of `schedulers`,
    /// to match them with the next snapshot's.
    scheduled: Vec<(u32, u64)>,
    /// Scratch for the loads handed to a scheduler (capacity kept across picks).
    loads: Vec<ServerLoad>,
    /// Real-server loads over all workers, or of this worker only.
    load_view: LoadView,
    /// Which real servers their connection thresholds keep from new connections.
    overload: Overload,
    timeouts: TickTimeouts,
    tsc_per_tick: u64,
    now_tick: u32,
    real_servers: Arc<Box<[RealServerCounters]>>,
    /// (address, TSC of the last ARP request we sent for it).
    arp_sent: [(u32, u64); ARP_LIMITER_SLOTS],
    /// Where the next resolution round starts in the real servers and peers (IPv4,
    /// IPv6): a round that ran out of room resumes there, so the addresses after a
    /// run of unanswered ones are still asked and rechecked.
    resolve_cursor: (usize, usize),
    arp_interval_tsc: u64,
    /// [`NEIGHBOUR_RECHECK_S`] in TSC cycles.
    neighbour_recheck_tsc: u64,
    ip_ident: u16,
    snapshot_changed: bool,
    /// An IPv6 packet found its next hop unresolved: solicit at the next poll.
    resolve_wanted: bool,
    /// VIPs and FullNAT local addresses of the snapshot, sorted: the addresses Sluice
    /// answers ARP and ping for besides its port addresses. Rebuilt per snapshot.
    owned: Vec<Ipv4Addr>,
    /// IPv6 VIPs and FullNAT local addresses, sorted: the addresses Sluice answers
    /// Neighbor Discovery and echo for besides its port addresses.
    owned6: Vec<std::net::Ipv6Addr>,
    /// Where the next IPv6 FullNAT local address and port are looked for
    /// (`forwarder/ipv6.rs`).
    laddr6_cursor: u64,
    /// The IPv6 neighbour table, fed by Neighbor Discovery to the port's addresses.
    neighbours6: Neighbour6Table,
    /// `static_neighbours` of IPv4, which the worker pins in its own table.
    static_neighbours4: Vec<(Ipv4Addr, MacAddr)>,
    /// FullNAT local ports, one pool per local address shared by every service that
    /// uses it, kept across snapshots while a service lists the address or a session
    /// holds one of its ports (`forward::laddr`). Made with the first FullNAT service.
    pool: Option<PortPool>,
    /// Each service's local addresses in `pool` (empty when it has no IPv4 FullNAT
    /// local address), with its id, by snapshot index.
    laddr_sets: Vec<(u32, LaddrSet)>,
    /// What is left of this tick's budget of held local ports looked at to end a
    /// session for a new one (`placement::PortReclaimBudget`).
    port_reclaim: placement::PortReclaimBudget,
    /// Persistence templates, shared by all workers.
    persist: Option<Arc<PersistTable>>,
    /// What a NAT or FullNAT client's ACK must acknowledge to confirm its connection's
    /// template (`confirm`); with `persist` only.
    proofs: Option<confirm::HandshakeProofs>,
    /// Session-clock ticks per second, for template timeouts.
    ticks_per_second: u32,
    /// Milliseconds per session-clock tick.
    tick_ms: u32,
    rss: RssView,
    local_ports: std::ops::RangeInclusive<u16>,
    /// The real servers' TIME-WAIT, for the pools' early-reuse counts.
    server_time_wait_ms: u32,
    /// FullNAT TCP timestamps are moved onto `ts_clock` (see `forward::timestamps`).
    rewrite_timestamps: bool,
    ts_clock: timestamps::Clock,
    /// Health probes' source address and ports: TCP to them from a real server that
    /// answers the probe in flight on its port goes to the management core
    /// (`Action::Punt`).
    health_source: Option<(Ipv4Addr, Arc<ProbeAcks>)>,
    /// The IPv6 probes' source addresses (same ports): TCP to them is punted too.
    health_sources6: Vec<Ipv6Addr>,
    /// Passive detection: a client SYN resent this many ticks after the session began,
    /// with nothing from the real server, counts as unanswered.
    passive_syn_ticks: u32,
    /// VRRP runs on the management core: its peers' advertisements go there.
    vrrp: VrrpSenders,
    /// `[vrrp] unicast`: the peers' adverts to a port address go there too.
    vrrp_unicast: bool,
    /// Session sync: where this worker tells the management core about its sessions.
    sync: Option<SyncLink>,
    /// Session sync over a DPDK port: UDP to the listen address
    /// goes to the management core...
    sync_listen: Option<SocketAddrV4>,
    /// ...and, with multicast, UDP to the group, arriving with the group's MAC.
    sync_group: Option<(MacAddr, SocketAddrV4)>,
    /// The sync peers' addresses, sorted: datagrams from anyone else are dropped here,
    /// not queued on the sync ring ahead of the peers' own.
    sync_peers: Vec<Ipv4Addr>,
    /// The VRRP unicast and sync peers, sorted: their neighbour entries are kept.
    neighbour_peers: Vec<Ipv4Addr>,
    /// [`NEIGHBOUR_STALE_S`] in TSC cycles.
    neighbour_stale_tsc: u64,
    /// Per-source new-connection rate-limit buckets (`forwarder/admission.rs`).
    rate_table: admission::RateTable,
    /// The ICMP errors this worker writes itself, rate-limited (RFC 4443 2.4(f)).
    icmp_errors: admission::ErrorLimiter,
    tsc_hz: u64,
}

/// Whose VRRP advertisements a worker hands to the management core. VRRPv3 carries
/// no authentication, so the sender's address (on the link: adverts count only with
/// TTL 255) is what tells a peer from a stranger; a stranger's advert is dropped here,
/// before it takes the punt ring's room or moves the election.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum VrrpSenders {
    /// VRRP is off: the VRRP group's frames are not ours.
    #[default]
    Off,
    /// `[vrrp] any_peer = true`: every sender's.
    Any,
    /// `[vrrp] peers`: theirs only.
    Peers(Vec<Ipv4Addr>),
}

impl VrrpSenders {
    fn sorted(self) -> VrrpSenders {
        match self {
            VrrpSenders::Peers(mut peers) => {
                peers.sort_unstable();
                peers.dedup();
                VrrpSenders::Peers(peers)
            }
            other => other,
        }
    }

    /// Whether an advertisement from `src` goes up (VRRP on).
    fn admits(&self, src: Ipv4Addr) -> bool {
        match self {
            VrrpSenders::Off => false,
            VrrpSenders::Any => true,
            VrrpSenders::Peers(peers) => peers.binary_search(&src).is_ok(),
        }
    }
}

/// A worker's end of session sync: its event ring (index `index` of `rings`) and when
/// to use it.
pub struct SyncLink {
    pub rings: Arc<Vec<crate::dataplane::sync_events::EventRing>>,
    pub index: usize,
    pub policy: crate::dataplane::sync_events::SyncPolicy,
}

/// How the NIC spreads packets over queues (`flow::ownership`), for choosing FullNAT
/// local ports whose replies come back to this worker, redirecting NAT replies, and,
/// when the device's choice cannot be known, steering packets to their owner.
pub struct RssView {
    pub toeplitz: Toeplitz,
    pub reta: Reta,
    pub fields: HashFields,
    /// The fields IPv6 TCP/UDP tuples are hashed with.
    pub fields6: HashFields,
    /// This worker's RX queue.
    pub queue: u16,
    /// The device does not hash as this view says (`Ownership::Steered`): a packet
    /// that misses this worker's table goes to the worker the view gives it to.
    pub steer: bool,
    /// The same for IPv6 packets (also when only IPv6 is not hashed as modelled).
    pub steer6: bool,
}

impl RssView {
    /// The view of worker `queue` of `queues` behind a device that hashes TCP/UDP
    /// tuples with the default Toeplitz key into a round-robin RETA of 128 entries:
    /// what a benchmark or a test without a real device assumes.
    pub fn default_spread(queues: u16, queue: u16) -> RssView {
        RssView {
            toeplitz: Toeplitz::new(&crate::flow::rss::DEFAULT_RSS_KEY)
                .expect("the default key is 40 bytes"),
            reta: Reta::new_round_robin(128, queues).expect("1 to 128 queues"),
            fields: HashFields::L3L4,
            fields6: HashFields::L3L4,
            queue,
            steer: false,
            steer6: false,
        }
    }

    /// The worker (queue) the view gives this IPv6 tuple to.
    #[inline]
    pub(crate) fn owner_of6(&self, key: &FlowKey6) -> u16 {
        self.reta.queue(self.toeplitz.hash_key6(self.fields6, key))
    }

    /// As [`RssView::steer_to`] for an IPv6 packet.
    #[inline]
    pub(crate) fn steer_to6(&self, key: &FlowKey6, redirected: bool) -> Option<u16> {
        if !self.steer6 || redirected {
            return None;
        }
        let owner = self.owner_of6(key);
        (owner != self.queue).then_some(owner)
    }

    /// The worker (queue) the view gives this tuple to.
    #[inline]
    fn owner_of(&self, key: &FlowKey4) -> u16 {
        self.reta.queue(self.toeplitz.hash_tuple(
            self.fields,
            key.src_addr(),
            key.dst_addr(),
            key.sport,
            key.dport,
        ))
    }

    /// With software steering, the other worker a packet that missed this worker's
    /// table belongs to: the view's owner of its own tuple (client packets, FullNAT
    /// replies, whose local port was chosen so the view gives the reply to the
    /// session's worker). `None` when it is this worker's, or already redirected.
    #[inline]
    fn steer_to(&self, key: &FlowKey4, redirected: bool) -> Option<u16> {
        if !self.steer || redirected {
            return None;
        }
        let owner = self.owner_of(key);
        (owner != self.queue).then_some(owner)
    }
}

/// A connection pinned by a persistence template ended: the template lives on for the
/// service's timeout from now, as an IPVS template outlives the connections it
/// controls.
fn extend_template(
    persist: &Option<Arc<PersistTable>>,
    snap: &crate::service::Snapshot,
    s: &Session,
    now: u32,
    ticks_per_second: u32,
) {
    let client = Ipv4Addr::from(s.client_addr).into();
    let persistent = s.flags().contains(SessionFlags::PERSISTENT);
    extend_client_template(
        persist,
        snap,
        s.service,
        client,
        persistent,
        now,
        ticks_per_second,
    );
}

/// [`extend_template`] of an IPv6 session.
fn extend_template6(
    persist: &Option<Arc<PersistTable>>,
    snap: &crate::service::Snapshot,
    s: &crate::session::table6::Session6,
    now: u32,
    ticks_per_second: u32,
) {
    let client = s.client.into();
    extend_client_template(
        persist,
        snap,
        s.service,
        client,
        s.persistent,
        now,
        ticks_per_second,
    );
}

fn extend_client_template(
    persist: &Option<Arc<PersistTable>>,
    snap: &crate::service::Snapshot,
    service: u32,
    client: std::net::IpAddr,
    persistent: bool,
    now: u32,
    ticks_per_second: u32,
) {
    if let Some((table, key, p)) = client_template(persist, snap, service, client, persistent) {
        let timeout = p.timeout_s.saturating_mul(ticks_per_second).max(1);
        key.refresh(table, now.wrapping_add(timeout), now);
    }
}

/// The template a connection of `client` to `service` falls under, if a template
/// placed it (`persistent`) and the service still persists.
fn client_template<'a>(
    persist: &'a Option<Arc<PersistTable>>,
    snap: &crate::service::Snapshot,
    service: u32,
    client: std::net::IpAddr,
    persistent: bool,
) -> Option<(
    &'a PersistTable,
    placement::AnyTemplateKey,
    crate::model::Persistence,
)> {
    let (Some(table), true) = (persist, persistent) else {
        return None;
    };
    let p = snap.by_id(service)?.persistence?;
    Some((table, placement::AnyTemplateKey::of(service, client, &p), p))
}

/// How a live connection placed by a persistence template keeps it, as IPVS keeps a
/// template while it controls connections: every `every` ticks (half the timeout, at
/// least a second) the connection renews it for `holds` ticks (the timeout, and at
/// least two renewals' worth), so it never lapses between two renewals. Once the last
/// connection ends, the template lives the timeout on from then (at most `holds`
/// after the last renewal: 2 s for a timeout under 2 s).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TemplateRenewal {
    pub every: u32,
    pub holds: u32,
}

impl TemplateRenewal {
    pub(crate) fn of(timeout_s: u32, ticks_per_second: u32) -> TemplateRenewal {
        let timeout = timeout_s.saturating_mul(ticks_per_second).max(1);
        let every = (timeout / 2).max(ticks_per_second).max(1);
        TemplateRenewal {
            every,
            holds: timeout.max(every.saturating_mul(2)),
        }
    }
}

/// A live connection placed by a persistence template renews it
/// ([`TemplateRenewal`]). Returns the tick by which it must be renewed again, or
/// None when it has no template to keep.
fn keep_client_template(
    persist: &Option<Arc<PersistTable>>,
    snap: &crate::service::Snapshot,
    service: u32,
    client: std::net::IpAddr,
    persistent: bool,
    now: u32,
    ticks_per_second: u32,
) -> Option<u32> {
    let (table, key, p) = client_template(persist, snap, service, client, persistent)?;
    let renewal = TemplateRenewal::of(p.timeout_s, ticks_per_second);
    key.refresh(table, now.wrapping_add(renewal.holds), now);
    Some(now.wrapping_add(renewal.every))
}

/// FullNAT local ports handed out (DPVS's default range).
pub const LOCAL_PORTS: std::ops::RangeInclusive<u16> = 1024..=65535;

/// Health checking's tap on the packet path.
#[derive(Clone, Debug)]
pub struct HealthTap {
    /// TCP to this address on `ports` is a probe's answer: handed to the management
    /// core.
    pub source: Ipv4Addr,
    /// ...and TCP to these IPv6 addresses on the same ports (probes to IPv6 real
    /// servers).
    pub sources6: Vec<Ipv6Addr>,
    /// The probe source ports, and what an answer to the probe in flight on each
    /// acknowledges: only such answers are handed up.
    pub acks: Arc<ProbeAcks>,
    /// Passive detection: a client SYN resent this long or more after the first, with
    /// nothing from the real server, counts against its real server.
    pub passive_syn_ms: u32,
}

/// Everything a worker's forwarder is made from, in one value: built on the main core,
/// turned into a [`Forwarder`] on the worker's own lcore, so that the session table is
/// first touched, and placed, on that lcore's NUMA node.
pub struct ForwarderConfig {
    /// Sessions the table holds.
    pub capacity: usize,
    /// IPv6 sessions the IPv6 table holds: [`ipv6_capacity`] of `capacity` (what the
    /// daemon uses); set apart only where the IPv6 table is measured on its own
    /// (the `nat_rewrite` benchmark's IPv6 modes).
    pub capacity6: usize,
    pub snapshot: SnapshotReader,
    pub timeouts: TickTimeouts,
    pub tsc_per_tick: u64,
    pub tsc_hz: u64,
    /// This worker's per-real-server counters.
    pub real_servers: Arc<Box<[RealServerCounters]>>,
    pub rss: RssView,
    /// FullNAT local ports handed out per local address (`[sessions]
    /// local_port_first/last`).
    pub local_ports: std::ops::RangeInclusive<u16>,
    /// How long real servers keep closed connections in TIME-WAIT (`[fullnat]
    /// server_time_wait`), for counting early local-port reuses.
    pub server_time_wait_ms: u32,
    /// Whether FullNAT TCP sessions get their timestamps moved onto Sluice's clock
    /// (`[fullnat] rewrite_timestamps`).
    pub rewrite_timestamps: bool,
    /// Real-server loads over all workers, for the load-aware schedulers; `None`: this
    /// worker's own connections only.
    pub load_view: Option<LoadView>,
    /// Persistence templates shared by all workers; without them, services with
    /// persistence are scheduled connection by connection.
    pub persistence: Option<Arc<PersistTable>>,
    pub health: Option<HealthTap>,
    /// Whose VRRP advertisements (to 224.0.0.18, protocol 112) go to the management
    /// core.
    pub vrrp: VrrpSenders,
    /// `[vrrp] unicast`: their advertisements to a port address go up too.
    pub vrrp_unicast: bool,
    /// Session sync: sessions worth telling the standby about become events on this
    /// worker's ring.
    pub sync: Option<SyncLink>,
    /// Session sync over a DPDK port (`[sync] port`): untagged UDP datagrams to the
    /// listen address, and to the group (with its MAC as destination) when set, go to
    /// the management core, as VRRP advertisements do.
    pub sync_port: Option<(SocketAddrV4, Option<SocketAddrV4>)>,
    /// With `sync_port`: the peers' addresses, the only sources whose datagrams go up.
    pub sync_peers: Vec<Ipv4Addr>,
    /// This worker's share of the ICMP errors Sluice writes itself (Packet Too Big,
    /// frag-needed), in TSC ticks.
    pub icmp_error_limit: crate::service::admission::WorkerLimit,
    /// Whether [`Forwarder::handle_burst`] files new NAT and FullNAT sessions at the
    /// end of their burst (`forwarder/burst.rs`). `None`: when the session index is
    /// at least [`PARK_INDEX_BYTES`], where the bucket of a new reply key is rarely in
    /// the cache; `Some` decides it either way (tests).
    pub park_new_sessions: Option<bool>,
    /// The SYN proxy's first wait for a real server's SYN-ACK before the SYN goes
    /// again ([`synproxy::SYN_TIMEOUT_MS`]); tests shorten it.
    pub synproxy_syn_timeout_ms: u32,
    /// Entries of each of the worker's neighbour tables (IPv4 and IPv6; `[sessions]
    /// neighbours`).
    pub neighbour_capacity: usize,
    /// `ports[].static_neighbours`: entries pinned in both tables, which ARP and
    /// Neighbor Discovery never change.
    pub static_neighbours: Vec<(IpAddr, MacAddr)>,
}

/// The index size from which new sessions are parked by default. Parking costs a new
/// session about 200 cycles when its reply bucket is cached anyway (a 1k-session
/// table, `nat_rewrite --park`) and saves about 100 when the bucket comes from memory
/// (1M sessions, a 20 MiB index; `perf/results/nat_rewrite.md`); 4 MiB is past a
/// core's L2 on current x86 parts. Sizes in between were not measured.
pub const PARK_INDEX_BYTES: usize = 4 << 20;

impl ForwarderConfig {
    /// A configuration with the required parts and nothing optional: default local
    /// ports, own loads only, no persistence, health tap, VRRP or sync.
    pub fn new(
        capacity: usize,
        snapshot: SnapshotReader,
        timeouts: TickTimeouts,
        tsc_per_tick: u64,
        tsc_hz: u64,
        real_servers: Arc<Box<[RealServerCounters]>>,
        rss: RssView,
    ) -> ForwarderConfig {
        ForwarderConfig {
            capacity,
            capacity6: ipv6_capacity(capacity),
            snapshot,
            timeouts,
            tsc_per_tick,
            tsc_hz,
            real_servers,
            rss,
            local_ports: LOCAL_PORTS,
            server_time_wait_ms: crate::forward::laddr::DEFAULT_SERVER_TIME_WAIT_MS,
            rewrite_timestamps: true,
            load_view: None,
            persistence: None,
            health: None,
            vrrp: VrrpSenders::Off,
            vrrp_unicast: false,
            sync: None,
            sync_port: None,
            sync_peers: Vec::new(),
            icmp_error_limit: crate::service::admission::DEFAULT_ICMP_ERROR_LIMIT
                .per_worker(1, tsc_hz),
            park_new_sessions: None,
            synproxy_syn_timeout_ms: synproxy::SYN_TIMEOUT_MS,
            neighbour_capacity: crate::dataplane::worker::NEIGHBOUR_CAPACITY,
            static_neighbours: Vec::new(),
        }
    }
}

impl Forwarder {
    /// Bytes a worker's per-session state takes at `capacity`: its session table
    /// (`wheel_slots` wheel) and the SYN proxy's side array (16 bytes a slot, mapped
    /// as proxied sessions use it, so counted whole: a proxied flood maps it all).
    /// Start-up checks this against the memory available.
    pub fn session_bytes_for(capacity: usize, wheel_slots: usize) -> usize {
        SessionTable::bytes_for(capacity, wheel_slots)
            .saturating_add(synproxy::ProxyState::bytes_for(capacity))
            .saturating_add(SessionTable6::bytes_for(ipv6_capacity(capacity)))
    }

    /// Entries each of the worker's neighbour tables holds (the IPv6 one is the
    /// forwarder's, the IPv4 one the worker's).
    pub fn neighbour_capacity(&self) -> usize {
        self.neighbours6.capacity()
    }

    /// The IPv4 `static_neighbours`, for the worker to pin in its table.
    pub fn static_neighbours4(&self) -> &[(Ipv4Addr, MacAddr)] {
        &self.static_neighbours4
    }

    /// A worker's forwarder; panics when the session table's memory cannot be had
    /// ([`Forwarder::try_new`] reports it).
    pub fn new(config: ForwarderConfig) -> Self {
        Self::try_new(config).unwrap_or_else(|e| panic!("{e}"))
    }

    /// As [`Forwarder::new`], reporting a session table the memory cannot hold
    /// instead of panicking. Call it on the worker's lcore: the table is placed where
    /// it is first written.
    pub fn try_new(config: ForwarderConfig) -> Result<Self, crate::session::TableAllocError> {
        let ForwarderConfig {
            capacity,
            capacity6,
            snapshot,
            timeouts,
            tsc_per_tick,
            tsc_hz,
            real_servers,
            rss,
            local_ports,
            server_time_wait_ms,
            rewrite_timestamps,
            load_view,
            persistence,
            health,
            vrrp,
            vrrp_unicast,
            sync,
            sync_port,
            sync_peers,
            icmp_error_limit,
            park_new_sessions,
            synproxy_syn_timeout_ms,
            neighbour_capacity,
            static_neighbours,
        } = config;
        let mut neighbours6 = Neighbour6Table::with_capacity(neighbour_capacity);
        let mut static_neighbours4 = Vec::new();
        for &(ip, mac) in &static_neighbours {
            // The config check keeps them within an eighth of the table.
            let pinned = match ip {
                IpAddr::V4(v4) => {
                    static_neighbours4.push((v4, mac));
                    true
                }
                IpAddr::V6(v6) => neighbours6.pin(v6, mac),
            };
            debug_assert!(pinned, "static neighbour {ip} does not fit");
        }
        let tsc_per_tick = tsc_per_tick.max(1);
        let tick_ms =
            (tsc_per_tick as u128 * 1000 / tsc_hz.max(1) as u128).clamp(1, u32::MAX as u128) as u32;
        let mut f = Forwarder {
            sessions: SessionTable::try_with_wheel(
                capacity,
                crate::session::DEFAULT_WHEEL_SLOTS,
                0,
            )?,
            sessions6: SessionTable6::try_with_capacity(capacity6)?,
            synproxy: synproxy::ProxyState::new(capacity, tsc_hz, synproxy_syn_timeout_ms),
            peeked: [None; BURST_SIZE],
            peeked6: [None; BURST_SIZE],
            park_new_sessions: false,
            parking: false,
            parked: Vec::with_capacity(BURST_SIZE),
            parked_hashes: Vec::with_capacity(2 * BURST_SIZE),
            snapshot,
            schedulers: Vec::new(),
            scheduled: Vec::new(),
            loads: Vec::new(),
            load_view: load_view
                .unwrap_or_else(|| LoadView::new(vec![real_servers.clone()], 0, tsc_hz)),
            overload: Overload::default(),
            timeouts,
            tsc_per_tick,
            now_tick: 0,
            real_servers,
            arp_sent: [(0, 0); ARP_LIMITER_SLOTS],
            resolve_cursor: (0, 0),
            // At most ten ARP requests a second per unresolved address.
            arp_interval_tsc: tsc_hz / 10,
            neighbour_recheck_tsc: tsc_hz * NEIGHBOUR_RECHECK_S,
            ip_ident: 0,
            // The first poll resolves the real servers of the initial snapshot.
            snapshot_changed: true,
            resolve_wanted: false,
            owned: Vec::new(),
            owned6: Vec::new(),
            laddr6_cursor: 0,
            neighbours6,
            static_neighbours4,
            pool: None,
            laddr_sets: Vec::new(),
            port_reclaim: placement::PortReclaimBudget::default(),
            proofs: persistence
                .as_ref()
                .map(|_| confirm::HandshakeProofs::new()),
            persist: persistence,
            ticks_per_second: (tsc_hz / tsc_per_tick).clamp(1, u32::MAX as u64) as u32,
            tick_ms,
            rss,
            local_ports,
            server_time_wait_ms,
            rewrite_timestamps,
            ts_clock: timestamps::Clock::new(tsc_hz, crate::dpdk::tsc(), wall_clock_ms()),
            passive_syn_ticks: health
                .as_ref()
                .map_or(u32::MAX, |h| h.passive_syn_ms.div_ceil(tick_ms)),
            health_sources6: health
                .as_ref()
                .map_or_else(Vec::new, |h| h.sources6.clone()),
            health_source: health.map(|h| (h.source, h.acks)),
            // The peers this port sends to by their MACs: sync's when it runs over the
            // port (over a kernel socket the kernel resolves them), VRRP's in unicast
            // (multicast adverts go to the group's MAC).
            neighbour_peers: {
                let mut peers = match sync_port {
                    Some(_) => sync_peers.clone(),
                    None => Vec::new(),
                };
                if let (VrrpSenders::Peers(vrrp_peers), true) = (&vrrp, vrrp_unicast) {
                    peers.extend_from_slice(vrrp_peers);
                }
                peers.sort_unstable();
                peers.dedup();
                peers
            },
            neighbour_stale_tsc: tsc_hz.saturating_mul(NEIGHBOUR_STALE_S),
            vrrp: vrrp.sorted(),
            vrrp_unicast,
            sync,
            sync_listen: sync_port.map(|(listen, _)| listen),
            sync_peers: {
                let mut peers = sync_peers;
                peers.sort_unstable();
                peers
            },
            sync_group: sync_port
                .and_then(|(_, group)| group)
                .map(|g| (MacAddr::ipv4_multicast(*g.ip()), g)),
            rate_table: admission::RateTable::new(admission::random_seed()),
            icmp_errors: admission::ErrorLimiter::new(icmp_error_limit),
            tsc_hz,
        };
        f.park_new_sessions =
            park_new_sessions.unwrap_or(f.sessions.index_bytes() >= PARK_INDEX_BYTES);
        f.rebuild_schedulers();
        Ok(f)
    }

    /// Once per poll: pick up a new service snapshot (one atomic load when nothing
    /// changed), advance the clock and expire due sessions within a budget.
    pub fn poll(&mut self, now_tsc: u64, counters: &WorkerCounters) {
        if self.snapshot.refresh() {
            self.snapshot_changed = true;
            if let Some(t) = self.snapshot.current().timeouts() {
                // `--set`: new timeouts apply to each session's next packet.
                self.timeouts = t.in_ticks(self.tick_ms);
            }
            self.rebuild_schedulers();
        }
        if self.snapshot_changed {
            // Adopted (schedulers rebuilt): tell the management core, which times
            // publish -> adoption. The first poll reports the start-up snapshot.
            // The old schedulers are gone: the old snapshot, and the Maglev tables
            // they shared with it, are the publisher's to free, which it does once
            // the generation below shows this worker adopted.
            self.snapshot.let_go_of_replaced();
            use std::sync::atomic::Ordering::{Relaxed, Release};
            counters
                .snapshot_adopted_tsc
                .store(crate::dpdk::tsc(), Relaxed);
            counters
                .snapshot_generation
                .store(self.snapshot.current().generation(), Release);
        }
        self.now_tick = (now_tsc / self.tsc_per_tick) as u32;
        self.ts_clock.advance(now_tsc);
        let now_ms = self.ts_clock.now_ms();
        let Forwarder {
            sessions,
            real_servers,
            pool,
            persist,
            snapshot,
            ticks_per_second,
            now_tick,
            load_view,
            schedulers,
            overload,
            synproxy,
            ..
        } = self;
        let mut expired = 0;
        let snap = snapshot.current();
        sessions.expire_visiting(
            *now_tick,
            EXPIRY_BUDGET,
            |id, s| {
                expired += 1;
                synproxy.ended(id, s);
                extend_template(persist, snap, s, *now_tick, *ticks_per_second);
                if observe::expired_unanswered(s) {
                    real_servers[s.real() as usize].count_passive(Passive::Unanswered);
                }
                forget(pool, real_servers, s, now_ms);
                tell_load(load_view, schedulers, overload, real_servers, s.real());
            },
            // A live connection keeps its persistence template.
            |_, s| {
                keep_client_template(
                    persist,
                    snap,
                    s.service,
                    Ipv4Addr::from(s.client_addr).into(),
                    s.flags().contains(SessionFlags::PERSISTENT),
                    *now_tick,
                    *ticks_per_second,
                )
            },
        );
        let expired = expired + self.sweep_v6();
        if expired > 0 {
            bump(&counters.sessions_expired, expired);
        }
        let sessions = self.sessions.len() + self.sessions6.len();
        counters.sessions.store(sessions as u64, Relaxed);
    }

    /// Calls `send` for each real server of the current snapshot, and each configured
    /// peer (`[vrrp] peers`, `[sync] peers`), whose MAC is not known yet (at most ten
    /// times a second per address), so the first client packet towards it usually
    /// finds it resolved; with `recheck` (one worker does it: the answers are shared
    /// when they change anything), also for each whose entry was not confirmed for
    /// [`NEIGHBOUR_RECHECK_S`] (`NeighbourTable::recheck_due`). A peer whose MAC
    /// changed without a gratuitous ARP (a node rebuilt on other hardware) would
    /// otherwise get the adverts and sync frames at its old MAC for good: a VRRP
    /// backup that no longer hears the master takes over, and both are masters.
    /// Stops at the first `send` that finds no room (a burst's worth a round, so
    /// thousands of real servers do not make a broadcast storm): the others wait
    /// for the next round, which starts where this one stopped (real servers that
    /// never answer would otherwise take every round's room, and those after them
    /// would never be rechecked). Runs once per second and on every new snapshot,
    /// never per packet.
    pub fn resolve_real_servers(
        &mut self,
        neighbours: &mut NeighbourTable,
        now_tsc: u64,
        recheck: bool,
        mut send: impl FnMut(Ipv4Addr) -> bool,
    ) {
        let snap = self.snapshot.current();
        let (servers, peers) = (snap.real_servers_v4(), &self.neighbour_peers);
        let count = servers.len() + peers.len();
        let start = self.resolve_cursor.0 % count.max(1);
        for k in 0..count {
            let at = (start + k) % count;
            let ip = match servers.get(at) {
                Some(&ip) => ip,
                None => peers[at - servers.len()],
            };
            // Where the next round starts if this `send` finds no room.
            self.resolve_cursor.0 = at;
            // `send` false: no room this round; the rest are not marked as asked,
            // and go in the next rounds.
            if neighbours.lookup(ip).is_some() {
                if recheck && neighbours.recheck_due(ip, now_tsc, self.neighbour_recheck_tsc) {
                    if !send(ip) {
                        return;
                    }
                    neighbours.mark_rechecked(ip, now_tsc);
                }
                continue;
            }
            let slot = &mut self.arp_sent[limiter_slot(ip)];
            if slot.0 == u32::from(ip) && now_tsc.wrapping_sub(slot.1) < self.arp_interval_tsc {
                continue;
            }
            if !send(ip) {
                return;
            }
            *slot = (u32::from(ip), now_tsc);
        }
    }

    /// Answers a management query from this worker's own state (`neighbours`: its
    /// IPv4 neighbour table, `now_tsc`: the time entries' ages are counted to); fills
    /// at most the room the query brought (never allocates).
    pub fn answer(
        &self,
        query: &mut Query,
        worker: u16,
        neighbours: &NeighbourTable,
        now_tsc: u64,
    ) {
        match query {
            Query::Neighbours {
                from,
                out,
                next,
                tables,
            } => {
                *tables = NeighbourTables {
                    ipv4: neighbours.len(),
                    ipv6: self.neighbours6.len(),
                    capacity: neighbours.capacity(),
                    capacity6: self.neighbours6.capacity(),
                };
                let (v4_slots, v6_slots) = (neighbours.slot_count(), self.neighbours6.slot_count());
                // At most one entry a slot: no more slots than the room the caller
                // brought, so nothing grows here.
                let step = NEIGHBOUR_SLOTS_PER_ANSWER.min(out.capacity() - out.len());
                let end = from.saturating_add(step);
                *next = (end < v4_slots + v6_slots).then_some(end);
                let age_ms =
                    |updated: u64| now_tsc.saturating_sub(updated) / (self.tsc_hz / 1000).max(1);
                let policy = self.neighbour_policy();
                for (_, n) in neighbours.slots(*from..end) {
                    let role = if neighbours.is_pinned(n.ip) {
                        NeighbourRole::Static
                    } else if policy.real_servers.binary_search(&n.ip).is_ok() {
                        NeighbourRole::RealServer
                    } else if policy.peers.binary_search(&n.ip).is_ok() {
                        NeighbourRole::Peer
                    } else {
                        NeighbourRole::Other
                    };
                    out.push(NeighbourEntry {
                        worker,
                        ip: n.ip.into(),
                        mac: n.mac,
                        // A static entry is never learned: it has no age.
                        age_ms: match role {
                            NeighbourRole::Static => 0,
                            _ => age_ms(n.updated_tsc),
                        },
                        role,
                    });
                }
                let real_servers6 = self.snapshot.current().real_servers_v6();
                let slots6 = from.saturating_sub(v4_slots)..end.saturating_sub(v4_slots);
                for (_, n) in self.neighbours6.slots(slots6) {
                    let role = if self.neighbours6.is_pinned(n.ip) {
                        NeighbourRole::Static
                    } else if real_servers6.binary_search(&n.ip).is_ok() {
                        NeighbourRole::RealServer
                    } else {
                        NeighbourRole::Other
                    };
                    out.push(NeighbourEntry {
                        worker,
                        ip: n.ip.into(),
                        mac: n.mac,
                        // A static entry is never learned: it has no age.
                        age_ms: match role {
                            NeighbourRole::Static => 0,
                            _ => age_ms(n.updated_tsc),
                        },
                        role,
                    });
                }
            }
            Query::Connections { from, out, next } => {
                *next = None;
                let now = self.now_tick;
                // Due but not yet swept (expiry runs within a budget): 0.
                let left = |deadline: u32| (deadline.wrapping_sub(now) as i32).max(0) as u32;
                let v4_slots = self.sessions.capacity();
                // The slots this answer reads, used or not: its cost is bounded even
                // in a large, nearly empty table.
                let end = from.saturating_add(SLOTS_PER_ANSWER);
                for (index, s) in self.sessions.iter_slots(*from..end) {
                    if out.len() == out.capacity() {
                        *next = Some(index);
                        return;
                    }
                    let addr = |ip: u32, port: u16| {
                        SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::from(ip), port))
                    };
                    out.push(ConnectionEntry {
                        worker,
                        proto: s.proto,
                        state: s.state_name(),
                        expires_ticks: left(s.deadline()),
                        client: addr(s.client_addr, s.client_port),
                        virtual_service: addr(s.vip, s.vport),
                        local: (s.mode == ForwardMode::FullNat)
                            .then(|| addr(s.local_addr, s.local_port)),
                        real_server: addr(s.real_addr, s.real_port),
                        session: ListedSession::V4(*s),
                        synproxy: self.synproxy_delta(index as u32, s),
                    });
                }
                let slots6 = from.saturating_sub(v4_slots)..end.saturating_sub(v4_slots);
                for (index, s) in self.sessions6.iter_slots(slots6) {
                    if out.len() == out.capacity() {
                        *next = Some(v4_slots + index);
                        return;
                    }
                    let addr = |ip: std::net::Ipv6Addr, port: u16| {
                        SocketAddr::V6(std::net::SocketAddrV6::new(ip, port, 0, 0))
                    };
                    // NAT64's IPv4 ends, kept IPv4-mapped, listed as the IPv4
                    // addresses they are.
                    let end = |ip: std::net::Ipv6Addr, port: u16| match ip.to_ipv4_mapped() {
                        Some(v4) => SocketAddr::V4(SocketAddrV4::new(v4, port)),
                        None => addr(ip, port),
                    };
                    out.push(ConnectionEntry {
                        worker,
                        proto: s.proto,
                        state: s.state_name(),
                        expires_ticks: left(s.deadline()),
                        client: addr(s.client, s.client_port),
                        virtual_service: addr(s.vip, s.vport),
                        local: (s.mode == ForwardMode::FullNat)
                            .then(|| end(s.local_addr, s.local_port)),
                        real_server: end(s.real_addr, s.real_port),
                        session: ListedSession::V6(*s),
                        synproxy: None,
                    });
                }
                if end < v4_slots + self.sessions6.capacity() {
                    *next = Some(end);
                }
            }
            Query::Pools { from, out, next } => {
                *next = None;
                let Some(pool) = &self.pool else {
                    return;
                };
                for (slot, counters) in pool.counters_from(*from) {
                    if out.len() == out.capacity() {
                        *next = Some(slot);
                        return;
                    }
                    out.push(PoolEntry { worker, counters });
                }
            }
        }
    }

    /// Whether a new snapshot arrived since the last call (the first call says yes).
    /// Whether a packet found its next hop unresolved since the last call: the
    /// worker then resolves now rather than at the next second.
    pub fn take_resolve_wanted(&mut self) -> bool {
        std::mem::take(&mut self.resolve_wanted)
    }

    pub fn take_snapshot_changed(&mut self) -> bool {
        std::mem::take(&mut self.snapshot_changed)
    }

    pub fn sessions(&self) -> &SessionTable {
        &self.sessions
    }

    fn rebuild_schedulers(&mut self) {
        let snap = self.snapshot.current();
        // Workers draw different random sequences (wrandom, p2c); Maglev tables come
        // prebuilt with the snapshot.
        let seed = sched::DEFAULT_SEED
            ^ (u64::from(self.rss.queue) + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        // A service whose scheduling inputs did not change keeps its scheduler (and
        // its loads' sums below): with thousands of services, building them all again
        // at every change to one stalled the worker for milliseconds. Any other
        // carries on from the service's previous one (Scheduler::inherit).
        let mut previous: hashbrown::HashMap<u32, (u64, usize, Box<dyn Scheduler>)> = self
            .scheduled
            .drain(..)
            .zip(self.schedulers.drain(..))
            .enumerate()
            .map(|(index, ((id, version), scheduler))| (id, (version, index, scheduler)))
            .collect();
        let mut kept_from = Vec::with_capacity(snap.services().len());
        let mut rebuilt = Vec::with_capacity(snap.services().len());
        self.schedulers = snap
            .services()
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let version = snap.scheduling_version(i);
                let old = previous.remove(&s.id);
                let unchanged = old.as_ref().is_some_and(|(v, ..)| *v == version);
                kept_from.push(old.as_ref().filter(|_| unchanged).map(|(_, j, _)| *j));
                let keep = unchanged && snap.maglev(i).is_none();
                rebuilt.push(!keep);
                match (snap.maglev(i), old) {
                    (None, Some((_, _, kept))) if keep => kept,
                    (maglev, old) => {
                        let mut scheduler = match maglev {
                            // The snapshot's own table: shared, never copied.
                            Some(table) => Box::new(Arc::clone(table)) as Box<dyn Scheduler>,
                            None => sched::build_with(
                                s.scheduler,
                                &s.real_servers,
                                &snap.scheduler_params(i, seed),
                            ),
                        };
                        if let Some((_, _, previous)) = old {
                            scheduler.inherit(&*previous);
                        }
                        scheduler
                    }
                }
            })
            .collect();
        self.scheduled = (snap.services().iter().enumerate())
            .map(|(i, s)| (s.id, snap.scheduling_version(i)))
            .collect();
        self.synproxy
            .reset_services(snap.services().iter().map(|s| s.id));
        let widest = snap
            .services()
            .iter()
            .map(|s| s.real_servers.len())
            .max()
            .unwrap_or(0);
        self.loads.reserve(widest);
        self.load_view.reset(
            (snap.services().iter().zip(&kept_from))
                .map(|(s, &kept)| (s.real_servers.as_slice(), kept)),
            Arc::clone(snap.load_positions()),
        );
        self.overload.reset(
            snap.services().iter().map(|s| s.real_servers.as_slice()),
            &self.real_servers,
        );
        // A kept scheduler already has its overloaded servers (the same ones, the
        // service being unchanged) at weight 0; telling it again would cost wrr its
        // replayed cycle.
        for (i, scheduler) in self.schedulers.iter_mut().enumerate() {
            if rebuilt[i] {
                self.overload.tell(i, &mut **scheduler);
            }
        }
        self.owned.clear();
        if snap.serving_vips() {
            self.owned.extend_from_slice(snap.vips());
            self.owned.extend_from_slice(snap.local_addresses());
            self.owned.extend_from_slice(snap.extra_addresses());
        }
        self.owned.sort_unstable();
        self.owned.dedup();
        self.owned6.clear();
        if snap.serving_vips() {
            self.owned6.extend_from_slice(snap.vips6());
            self.owned6.extend_from_slice(snap.local_addresses6());
        }
        self.owned6.sort_unstable();
        self.owned6.dedup();
        // The ports belong to the local address, not to the service: services that
        // share one allocate from the same free lists, so no two of them hand out the
        // same reply tuple, and a service's edit leaves the ports its sessions hold
        // (and the address's counters) as they are. IPv6 local addresses have no pool:
        // `open_v6` picks from them.
        let fullnat = |s: &crate::model::Service| {
            s.real_servers
                .iter()
                .any(|r| r.mode == ForwardMode::FullNat)
        };
        let lips = snap
            .services()
            .iter()
            .filter(|s| fullnat(s))
            .flat_map(|s| s.local_addresses4());
        if self.pool.is_none() && lips.clone().next().is_some() {
            let rss = &self.rss;
            match PortPool::new(
                self.local_ports.clone(),
                &rss.toeplitz,
                &rss.reta,
                rss.fields,
                rss.queue,
            ) {
                Ok(mut pool) => {
                    pool.set_server_time_wait(self.server_time_wait_ms);
                    self.pool = Some(pool);
                }
                Err(e) => log::warn!("no FullNAT port pool: {e}"),
            }
        }
        if let Some(pool) = &mut self.pool {
            pool.set_addresses(lips, self.ts_clock.now_ms());
        }
        let old_sets: hashbrown::HashMap<u32, LaddrSet> =
            std::mem::take(&mut self.laddr_sets).into_iter().collect();
        let mut service_lips = Vec::new();
        self.laddr_sets = snap
            .services()
            .iter()
            .map(|s| {
                service_lips.clear();
                service_lips.extend(s.local_addresses4());
                let mut set = match &self.pool {
                    Some(pool) if fullnat(s) && !service_lips.is_empty() => {
                        pool.set_of(&service_lips).unwrap_or_else(|e| {
                            log::warn!("service {}: no FullNAT local port: {e}", s.key);
                            LaddrSet::default()
                        })
                    }
                    _ => LaddrSet::default(),
                };
                if let Some(old) = old_sets.get(&s.id) {
                    set.continue_from(old);
                }
                (s.id, set)
            })
            .collect();
        log::info!(
            "worker: service snapshot {} ({} services)",
            snap.generation(),
            snap.services().len()
        );
    }

    /// First pass over a burst, before any frame is handled, so that the cache misses
    /// of the whole burst overlap instead of stalling `handle` one packet at a time:
    /// peek at each frame's 5-tuple, IPv4 or IPv6, and hash it (once: `handle` reuses
    /// the hash for the lookup, and for IPv4 the insert), start loading every index
    /// bucket, then, the buckets arriving meanwhile, start loading the session
    /// entries they name, or the next bucket of a key that may lie past its home, and
    /// then the entries those name. (Here that third step comes right after the
    /// second and waits for those next buckets; `handle_burst` puts its classify pass
    /// between them.) Decides nothing: `handle` validates every frame properly.
    #[inline]
    pub fn prefetch_sessions(&mut self, burst: &Burst) {
        let past_home = self.prefetch_parsed(burst, None).past_home;
        self.prefetch_past_home(past_home);
    }

    /// [`Forwarder::prefetch_sessions`] for a burst that came in on a port with MAC
    /// `port_mac`: frames `handle` decides on their Ethernet header alone
    /// ([`EthernetVerdict`]) are skipped. Returns which frames `handle` parses (every
    /// frame, without `port_mac`), and the keys found past their home bucket, whose
    /// next bucket is loading: [`Forwarder::prefetch_past_home`] starts loading their
    /// entries once it is there.
    #[inline]
    fn prefetch_parsed(&mut self, burst: &Burst, port_mac: Option<MacAddr>) -> Prefetched {
        const { assert!(BURST_SIZE <= 32, "a burst's IPv6 frames are a u32 mask") };
        let n = burst.len().min(BURST_SIZE);
        let mut parses = [false; BURST_SIZE];
        // The frames whose IPv6 tuple was peeked: an IPv4 burst pays one test for it.
        let mut v6 = 0u32;
        for (i, peeked) in self.peeked[..n].iter_mut().enumerate() {
            let frame = burst.packet(i);
            parses[i] = port_mac.is_none_or(|mac| EthernetVerdict::needs_parsing(frame, mac));
            *peeked = if parses[i] {
                peek_key(frame).map(HashedKey::new)
            } else {
                None
            };
            if let Some(key) = peeked {
                self.sessions.prefetch_bucket(key);
            } else if let Some(key) = parses[i].then(|| peek_key6(frame)).flatten() {
                let key = HashedKey6::new(key);
                self.sessions6.prefetch_bucket(&key);
                self.peeked6[i] = Some(key);
                v6 |= 1 << i;
            }
        }
        let mut past_home = PastHome::default();
        for (i, key) in self.peeked[..n].iter().enumerate() {
            if let Some(key) = key {
                past_home.v4 |= u32::from(self.sessions.prefetch_entry(key)) << i;
            }
        }
        while v6 != 0 {
            let i = v6.trailing_zeros() as usize;
            v6 &= v6 - 1;
            if let Some(key) = &self.peeked6[i] {
                past_home.v6 |= u32::from(self.sessions6.prefetch_entry(key)) << i;
            }
        }
        Prefetched { parses, past_home }
    }

    /// The prefetch's third step, for the keys the second found may lie past their
    /// home bucket (at 1M sessions in a table sized to them, up to one key in eight:
    /// 1.12 buckets a lookup): once the next bucket has had time to arrive, starts
    /// loading the entry it names. Unprefetched, such a packet's lookup waits for that
    /// bucket, then for the entry.
    #[inline]
    fn prefetch_past_home(&self, past_home: PastHome) {
        let PastHome { mut v4, mut v6 } = past_home;
        while v4 != 0 {
            let i = v4.trailing_zeros() as usize;
            v4 &= v4 - 1;
            if let Some(Some(key)) = self.peeked.get(i) {
                self.sessions.prefetch_entry_past_home(key);
            }
        }
        while v6 != 0 {
            let i = v6.trailing_zeros() as usize;
            v6 &= v6 - 1;
            if let Some(Some(key)) = self.peeked6.get(i) {
                self.sessions6.prefetch_entry_past_home(key);
            }
        }
    }

    /// `key` with its hash: the one the prefetch pass computed for frame `i` when it
    /// read the same tuple, else computed now.
    #[inline]
    fn hashed(&self, i: usize, key: FlowKey4) -> HashedKey {
        match self.peeked.get(i) {
            Some(Some(peeked)) if *peeked.key() == key => *peeked,
            _ => HashedKey::new(key),
        }
    }

    /// [`Forwarder::hashed`] for an IPv6 tuple.
    #[inline]
    fn hashed6(&self, i: usize, key: FlowKey6) -> HashedKey6 {
        match self.peeked6.get(i) {
            Some(Some(peeked)) if *peeked.key() == key => *peeked,
            _ => HashedKey6::new(key),
        }
    }

    /// The IPv6 addresses Neighbor Discovery treats apart: the VIPs answered for,
    /// and the real servers, whose entries may use the whole neighbour table.
    /// (Of the fields apart, so the neighbour table can be borrowed beside it.)
    fn known6<'a>(
        owned6: &'a [Ipv6Addr],
        snapshot: &'a SnapshotReader,
    ) -> crate::dataplane::local::Known6<'a> {
        crate::dataplane::local::Known6 {
            vips6: owned6,
            real_servers6: snapshot.current().real_servers_v6(),
        }
    }

    /// Handles one packet of a burst. Never panics; allocates nothing.
    pub fn handle(
        &mut self,
        pkt: Packet<'_>,
        port: &PortContext,
        neighbours: &mut NeighbourTable,
        now_tsc: u64,
        counters: &WorkerCounters,
    ) -> Action {
        self.handle_classified(pkt, None, port, neighbours, now_tsc, counters)
    }

    /// [`Forwarder::handle`], with the frame's classification when the burst's
    /// classify pass has it (`flow::parse::classify_into`'s outcome and the `Parsed`
    /// it wrote; `None`: classified here).
    #[inline]
    pub(super) fn handle_classified(
        &mut self,
        mut pkt: Packet<'_>,
        classified: Option<Result<&Parsed, DropReason>>,
        port: &PortContext,
        neighbours: &mut NeighbourTable,
        now_tsc: u64,
        counters: &WorkerCounters,
    ) -> Action {
        let frame = pkt.bytes_mut();
        let to = match EthernetVerdict::of(frame, port.mac) {
            EthernetVerdict::Truncated => return Action::Drop(DropReason::Truncated),
            EthernetVerdict::MulticastSource => return Action::Drop(DropReason::BadSourceMac),
            EthernetVerdict::NotOurs(to) => return self.to_group(frame, to, port),
            EthernetVerdict::Parse(to) => to,
        };
        let to_port = to == port.mac;
        let to_us = to_port || to.is_broadcast();
        let here;
        let parsed: &Parsed = match classified {
            Some(Ok(p)) => p,
            Some(Err(reason)) => return Action::Drop(reason),
            None => match classify(frame) {
                Ok(p) => {
                    here = p;
                    &here
                }
                Err(reason) => return Action::Drop(reason),
            },
        };
        let vips = &self.owned[..];
        let owns = |ip: Ipv4Addr| port.responder.is_local(ip) || vips.binary_search(&ip).is_ok();
        let cx = Context {
            port,
            neighbours,
            now_tsc,
            counters,
        };
        let action = match parsed.kind {
            PacketKind::Ipv6(Ipv6Payload::Icmp { icmp_type, .. })
                if to == port.mac && icmp_type.is_error() =>
            {
                self.icmp6_error(&mut pkt, parsed, &cx)
            }
            PacketKind::Ipv6(_) => {
                if to == port.mac {
                    if let Some(action) = self.l4_v6(&mut pkt, parsed, &cx) {
                        return action;
                    }
                }
                let reply = port.responder.process_ipv6(
                    pkt.with_tailroom_mut(),
                    parsed,
                    &mut self.neighbours6,
                    now_tsc,
                    counters,
                    Self::known6(&self.owned6, &self.snapshot),
                );
                match reply {
                    Ok(len) if pkt.set_len(len as u16) => Action::Transmit,
                    Ok(_) => Action::Drop(DropReason::Truncated),
                    Err(reason) => Action::Drop(reason),
                }
            }
            _ if !to_us => Action::Drop(DropReason::NotOurMac),
            PacketKind::Arp => local(port.responder.process_with_vips(
                frame,
                cx.neighbours,
                now_tsc,
                counters,
                vips,
                self.neighbour_policy(),
            )),
            // What Sluice forwards must come to its own MAC: as Linux forwards no
            // frame sent to another host or to all (`ip_forward`), and IPVS balances
            // none, a TCP or UDP packet, or an ICMP error, in a broadcast frame is
            // dropped; taken, it would be forwarded by every node of a VRRP or ECMP
            // link at once. (An echo request is answered, as Linux answers it.)
            PacketKind::Tcp { .. } | PacketKind::Udp { .. } if !to_port => {
                Action::Drop(DropReason::NotOurMac)
            }
            PacketKind::Icmp { icmp_type, .. } if icmp_type.is_error() && !to_port => {
                Action::Drop(DropReason::NotOurMac)
            }
            PacketKind::Icmp { dst, icmp_type, .. } => {
                if icmp_type.is_error() {
                    self.icmp_error(&mut pkt, parsed, &cx)
                } else if owns(dst) {
                    local(port.responder.process_with_vips(
                        frame,
                        cx.neighbours,
                        now_tsc,
                        counters,
                        vips,
                        NeighbourPolicy::default(),
                    ))
                } else {
                    Action::Drop(DropReason::NotLocal)
                }
            }
            PacketKind::OtherIpv4 { src, dst, protocol } => {
                self.other_ipv4(frame, (src, dst, protocol), owns(dst), port)
            }
            PacketKind::Tcp { .. } | PacketKind::Udp { .. } => self.l4(&mut pkt, parsed, &cx),
        };
        self.unless_for_kernel(action, to, pkt.bytes(), parsed, port)
    }

    /// Which IPv4 neighbours keep their entries (the current real servers and the
    /// configured peers), and when the others may give theirs up.
    pub fn neighbour_policy(&self) -> NeighbourPolicy<'_> {
        NeighbourPolicy {
            real_servers: self.snapshot.current().real_servers_v4(),
            peers: &self.neighbour_peers,
            stale_tsc: self.neighbour_stale_tsc,
        }
    }

    /// `action`, unless it drops a frame to our MAC on a port with an exception path:
    /// then the kernel may take it (see [`Forwarder::to_kernel_or`]).
    #[inline]
    fn unless_for_kernel(
        &self,
        action: Action,
        to: MacAddr,
        frame: &[u8],
        parsed: &Parsed,
        port: &PortContext,
    ) -> Action {
        match action {
            // Only a drop can be the kernel's: forwarded and answered frames pay this
            // one compare.
            Action::Drop(reason) if port.exception && to == port.mac => {
                self.to_kernel_or(reason, frame, parsed, port)
            }
            action => action,
        }
    }

    /// A frame to our MAC dropped for `reason`, on a port with an exception path: the
    /// kernel's if [`exception::for_kernel`] says so, else the drop.
    #[cold]
    fn to_kernel_or(
        &self,
        reason: DropReason,
        frame: &[u8],
        parsed: &Parsed,
        port: &PortContext,
    ) -> Action {
        let dst6 = match parsed.kind {
            PacketKind::Ipv6(_) => frame
                .get(parsed.l3 + 24..parsed.l3 + 40)
                .and_then(|b| <[u8; 16]>::try_from(b).ok())
                .map(Ipv6Addr::from),
            _ => None,
        };
        if exception::for_kernel(reason, &parsed.kind, dst6, port.responder) {
            Action::Exception(exception::punt_class(&parsed.kind, frame, parsed.l3))
        } else {
            Action::Drop(reason)
        }
    }

    /// An IPv4 protocol other than TCP, UDP and ICMP, from `src` to `dst` (`owned`: a
    /// VIP or an address of the port): with `[vrrp] unicast` (keepalived's
    /// `unicast_peer`), a VRRP advert to the port goes up by the rules of one to the
    /// group; the rest is not ours to serve.
    fn other_ipv4(
        &self,
        frame: &[u8],
        (src, dst, protocol): (Ipv4Addr, Ipv4Addr, crate::wire::IpProtocol),
        owned: bool,
        port: &PortContext,
    ) -> Action {
        if protocol == vrrp::PROTOCOL && self.vrrp_unicast && port.responder.is_local(dst) {
            self.vrrp_advert(frame, src, true, port)
        } else if owned {
            Action::Drop(DropReason::UnsupportedProtocol)
        } else {
            Action::Drop(DropReason::NotLocal)
        }
    }

    /// A VRRP advertisement (`frame`) from `src`, to the group or, `unicast`, to one
    /// of the port's addresses: up to the management core when it is a peer's (any
    /// sender's with `any_peer`), on the link of the port it came in on, too: a host
    /// on another port's link that forges a peer's address (TTL 255 holds on its own
    /// link) must not move the election. One to a port address may have been routed
    /// from anywhere: only TTL 255 says it was sent on this link (RFC 5798 section
    /// 5.1.1.3), so another TTL stays off the VRRP ring (the group's never leave
    /// their link; the management core checks their TTL). Untagged only: the
    /// management core reads them so. VRRP off: nobody's.
    fn vrrp_advert(
        &self,
        frame: &[u8],
        src: Ipv4Addr,
        unicast: bool,
        port: &PortContext,
    ) -> Action {
        if self.vrrp == VrrpSenders::Off || !vrrp::carries_vrrp(frame) {
            return Action::Drop(DropReason::UnsupportedProtocol);
        }
        let ip = crate::wire::ipv4::Packet::new_unchecked(&frame[ethernet::HEADER_LEN..]);
        let from_the_link = !unicast || ip.ttl() == vrrp::TTL;
        if from_the_link && self.vrrp.admits(src) && port.responder.on_link(src) {
            Action::Punt
        } else {
            Action::Drop(DropReason::NotAPeer)
        }
    }

    /// Whether `ip` is one of the sync peers (`[sync] port`).
    fn is_sync_peer(&self, ip: Ipv4Addr) -> bool {
        self.sync_peers.binary_search(&ip).is_ok()
    }

    /// A frame to a MAC neither ours nor broadcast: a VRRP advertisement (with VRRP
    /// on) or a sync datagram to the group (with sync over a port and multicast) goes
    /// to the management core; anything else is not ours.
    fn to_group(&self, frame: &[u8], to: MacAddr, port: &PortContext) -> Action {
        let vrrp = self.vrrp != VrrpSenders::Off && to == vrrp::MULTICAST_MAC;
        let sync = self
            .sync_group
            .and_then(|(mac, group)| (mac == to).then_some(group));
        if !vrrp && sync.is_none() {
            return Action::Drop(DropReason::NotOurMac);
        }
        match classify(frame) {
            Ok(Parsed {
                kind:
                    PacketKind::OtherIpv4 {
                        src,
                        dst: crate::wire::vrrp::MULTICAST_GROUP,
                        protocol: crate::wire::vrrp::PROTOCOL,
                    },
                ..
            }) if vrrp => self.vrrp_advert(frame, src, false, port),
            Ok(Parsed {
                kind: PacketKind::Udp { key },
                l3: ethernet::HEADER_LEN,
                ..
            }) if sync == Some(SocketAddrV4::new(key.dst_addr(), key.dport)) => {
                if self.is_sync_peer(key.src_addr()) {
                    Action::Punt
                } else {
                    Action::Drop(DropReason::NotAPeer)
                }
            }
            Ok(_) => Action::Drop(DropReason::NotOurMac),
            Err(reason) => Action::Drop(reason),
        }
    }

    /// A TCP segment or UDP datagram, stage after stage:
    /// 1. look its session up, by the hash the prefetch pass computed; a SYN reusing
    ///    the port of a finished connection retires it and misses (`miss.rs`);
    /// 2. hit: the session's state moves on the packet (`hit.rs`);
    ///    miss: is it a new connection to a service (`miss.rs`)? May it open
    ///    (`admission.rs`: access list, rate limit)? Which real server,
    ///    which local port (`placement.rs`)? Then its session opens (`placement.rs`),
    ///    within a burst at the burst's end, it and the later packets of its
    ///    connection parked till then (`burst.rs`);
    /// 3. account: the packet counts on its real server (`observe.rs`);
    /// 4. egress: rewritten for the session's mode and addressed to its next hop
    ///    (`egress.rs`).
    fn l4(&mut self, pkt: &mut Packet, parsed: &Parsed, cx: &Context) -> Action {
        let (key, flags) = match parsed.kind {
            PacketKind::Tcp { key, flags, .. } => (key, flags),
            PacketKind::Udp { key } => (key, TcpFlags::empty()),
            // `handle` passes TCP and UDP only.
            _ => return Action::Drop(DropReason::UnsupportedProtocol),
        };
        let hashed = self.hashed(pkt.index(), key);
        let found = self.sessions.lookup_hashed(&hashed);
        let found = self.unless_reopened(found, flags, cx.counters);
        if self.parking && !self.parked.is_empty() && self.waits_on_parked(&hashed, found) {
            // A packet whose session a parked one will file (or retire): after it.
            return self.park(burst::Parked::Behind(pkt.index()));
        }
        // The SYN proxy may turn the segment into another (the SYN to the real
        // server): then it goes on as that.
        let rewritten;
        let (mut parsed, mut flags) = (parsed, flags);
        let matched = match found {
            Some((id, dir)) => {
                if key.proto == Protocol::Tcp {
                    match self.synproxy_pending(id, dir, pkt, parsed, flags, cx) {
                        synproxy::Pending::No => {}
                        synproxy::Pending::Done(action) => return action,
                        synproxy::Pending::Resend(p, as_flags) => {
                            rewritten = p;
                            (parsed, flags) = (&rewritten, as_flags);
                        }
                    }
                }
                let seq = segment_seq(pkt.bytes(), parsed, dir, flags);
                self.hit(id, dir, flags, seq, pkt, Some(parsed), cx.counters)
            }
            None => {
                // NAT64 replies: IPv4 to a local address, in the IPv6 table.
                if !self.sessions6.is_empty() {
                    if let Some(action) = self.nat64_reply(pkt, parsed, &key, flags, cx) {
                        return action;
                    }
                }
                let service = match self.admit(&key, flags, pkt.bytes(), parsed, cx.port) {
                    Ok(service) => service,
                    Err(action) => return action,
                };
                // Admission (access list, rate limit) decides on the packet that
                // opens: for a proxied service the SYN, before its cookie. The ACK
                // that then carries a valid cookie proves a SYN that was admitted,
                // and meets the access list again (not the rate, which its SYN paid):
                // a cookie lives about two minutes, and a deny added meanwhile, in
                // an incident, must hold against the cookies already handed out.
                let syn = flags.contains(TcpFlags::SYN);
                if key.proto != Protocol::Tcp || syn {
                    if let Err(reason) = self.check_admission(service, &key, cx.now_tsc) {
                        return Action::Drop(reason);
                    }
                }
                let (mut proxied, mut held) = (None, None);
                if key.proto == Protocol::Tcp {
                    match self.synproxy_miss(service, pkt, parsed, flags, cx) {
                        synproxy::Miss::NotProxied if !syn => {
                            if let Err(reason) = self.check_admission(service, &key, cx.now_tsc) {
                                return Action::Drop(reason);
                            }
                        }
                        synproxy::Miss::NotProxied => {}
                        synproxy::Miss::Done(action) => return action,
                        synproxy::Miss::Open(..) | synproxy::Miss::OpenHeld(..)
                            if self.acl_refuses(service, &key) =>
                        {
                            return Action::Drop(DropReason::AclDenied);
                        }
                        synproxy::Miss::Open(hs, p) => {
                            rewritten = p;
                            (parsed, flags) = (&rewritten, TcpFlags::SYN);
                            proxied = Some(hs);
                        }
                        synproxy::Miss::OpenHeld(hs, seq) => {
                            flags = TcpFlags::SYN;
                            proxied = Some(hs);
                            held = Some(seq);
                        }
                    }
                }
                // The SYN proxy's cookie proved the client; UDP cannot prove it.
                let trust = match (&proxied, key.proto) {
                    (Some(_), _) => Trust::Confirmed,
                    (None, Protocol::Tcp) => Trust::Unconfirmed,
                    (None, _) => Trust::Unverified,
                };
                let placement = match self.place(service, &key, trust, cx.now_tsc, cx.counters) {
                    Ok(placement) => placement,
                    Err(reason) => {
                        return match &proxied {
                            Some(hs) => self.synproxy_refuse(reason, service, hs, pkt, parsed, cx),
                            None => self.refuse(reason, service, key.proto, pkt, parsed, cx),
                        }
                    }
                };
                let mut opening = self.prepare_open(&hashed, &placement, flags, pkt, parsed, cx);
                // Within a burst, a plain new session (neither proxied nor holding its
                // first data) with a reply key is filed at the burst's end, once its
                // reply bucket, loading since `prepare_open`, is there.
                if self.parking && proxied.is_none() && opening.has_reply() {
                    self.count_load_early(&mut opening);
                    let to = MacAddr(
                        pkt.bytes()[..6]
                            .try_into()
                            .expect("checked Ethernet header"),
                    );
                    return self.park(burst::Parked::Open {
                        index: pkt.index(),
                        opening,
                        parsed: *parsed,
                        to,
                    });
                }
                match self.file_open(&opening, cx.counters) {
                    Ok(mut matched) => {
                        if let Some(hs) = &proxied {
                            self.synproxy_opened(&mut matched, hs);
                            if held.is_none() {
                                // The frame is the first SYN now.
                                let tsval = hs.client_tsval.filter(|_| hs.cookie_tsval.is_some());
                                self.synproxy_arm(
                                    matched.id,
                                    hs,
                                    tsval,
                                    pkt.bytes(),
                                    parsed.l3,
                                    cx,
                                );
                            }
                        }
                        if let Some(seq) = held {
                            // The ACK waits with its data; a copy becomes the SYN.
                            return Action::AwaitServer(AwaitServer {
                                session: matched.id.index(),
                                seq,
                                needs_syn: true,
                            });
                        }
                        matched
                    }
                    Err(reason) => {
                        return match &proxied {
                            Some(hs) => self.synproxy_refuse(reason, service, hs, pkt, parsed, cx),
                            None => Action::Drop(reason),
                        }
                    }
                }
            }
        };
        self.account_packet(&matched, u64::from(pkt.len()));
        self.egress(pkt, parsed, &matched, flags, cx)
    }

    /// Session sync (standby): installs, refreshes or removes the peer's session
    /// `r`. Returns the event to count, or `None` when the record cannot be installed
    /// (no such service or real server here, or no room).
    pub fn install(&mut self, r: &crate::session::replication::RecordRepr) -> Option<Event> {
        use crate::session::replication::{RecordKind, RecordOp};
        if r.kind != RecordKind::Connection {
            return None;
        }
        if r.is_ipv6() {
            return self.install_v6(r);
        }
        let key = r.in_key()?;
        let found = self.sessions.lookup(&key).map(|(id, _)| id);
        if r.op == RecordOp::Remove {
            let counters_free = found.and_then(|id| Some((id, self.sessions.remove(id)?)));
            if let Some((id, s)) = counters_free {
                self.synproxy.ended(id, &s);
                forget(
                    &mut self.pool,
                    &self.real_servers,
                    &s,
                    self.ts_clock.now_ms(),
                );
                self.load_changed(s.real());
            }
            return Some(Event::SyncRemoved);
        }
        let timeout_ticks = r.timeout_ms.div_ceil(self.tick_ms.max(1)).max(1);
        if let Some(id) = found {
            let live = self.sessions.get_mut(id)?;
            let was_active = live.is_active();
            *live = live
                .with_state(r.state)
                .with_timestamp_offset(r.timestamp_offset);
            let now_active = live.is_active();
            let real = live.real();
            let c = &self.real_servers[real as usize];
            if was_active != now_active {
                RealServerCounters::gauge_add(&c.active, if now_active { 1 } else { -1 });
                RealServerCounters::gauge_add(&c.inactive, if now_active { -1 } else { 1 });
                self.load_changed(real);
            }
            self.sessions.touch(id, self.now_tick, timeout_ticks);
            if let Some(delta) = &r.synproxy {
                self.synproxy_install(id, delta);
            }
            return Some(Event::SyncInstalled);
        }
        let snap = self.snapshot.current();
        let service_key =
            ServiceKey::new(r.proto, r.virtual_service.ip(), r.virtual_service.port());
        let service = snap.find(&service_key)?;
        let SocketAddr::V4(real) = r.real_server else {
            return None;
        };
        let local = match r.local {
            None => None,
            Some(SocketAddr::V4(local)) => Some(local),
            Some(SocketAddr::V6(_)) => return None,
        };
        let (rip, rport) = (*real.ip(), real.port());
        let rs = service
            .real_servers
            .iter()
            .find(|x| x.ip == rip && x.port == rport)?;
        if rs.mode != r.mode {
            // The peer forwards to it in another mode than this node would (FullNAT
            // where this node has no local addresses, say): not this node's session.
            return None;
        }
        let mut session = Session::new(&key, r.mode, service.id, rs.id, rip, rport)
            .with_state(r.state)
            .with_timestamp_offset(r.timestamp_offset);
        match (r.mode, local) {
            (ForwardMode::FullNat, Some(local)) => {
                // The active chose this port: keep this worker from handing it out.
                // A port this worker cannot reserve (held for another session, or
                // not of this service's local addresses here: the nodes' configs
                // differ) is not this node's to use: the record is not installed.
                let reserved = service.local_addresses4().any(|a| a == *local.ip())
                    && self
                        .pool
                        .as_mut()
                        .is_some_and(|pool| pool.reserve(*local.ip(), local.port(), real));
                if !reserved {
                    return None;
                }
                session = session.with_local(*local.ip(), local.port());
            }
            (ForwardMode::FullNat, None) => return None,
            _ => {}
        }
        session.created = self.now_tick;
        let persistent = r
            .flags
            .contains(crate::session::replication::RecordFlags::PERSISTENT);
        if persistent {
            // It renews its template here too (the standby's copy, synced).
            session.set_flags(SessionFlags::PERSISTENT);
        }
        let active = session.is_active();
        let Ok(id) = self.sessions.insert(session, self.now_tick, timeout_ticks) else {
            // No room, or a key taken: the port reserved above goes back.
            release_local_port(&mut self.pool, &session, self.ts_clock.now_ms());
            return None;
        };
        let c = &self.real_servers[rs.id as usize];
        RealServerCounters::gauge_add(if active { &c.active } else { &c.inactive }, 1);
        self.load_changed(rs.id);
        if persistent {
            self.schedule_template_renewal(id, session.service);
            if let Some(proofs) = self.proofs.as_mut() {
                proofs.forget(id.index());
            }
        }
        if let (Some(delta), Some((id, _))) = (r.synproxy, self.sessions.lookup(&key)) {
            self.synproxy_install(id, &delta);
        }
        Some(Event::SyncInstalled)
    }

    /// Whether an ARP request for `target` may go out now (at most one per address
    /// per ARP interval); records it as sent when it may.
    pub fn arp_due(&mut self, target: Ipv4Addr, now_tsc: u64) -> bool {
        let slot = &mut self.arp_sent[limiter_slot(target)];
        if slot.0 == u32::from(target) && now_tsc.wrapping_sub(slot.1) < self.arp_interval_tsc {
            return false;
        }
        *slot = (u32::from(target), now_tsc);
        true
    }
}

/// The bookkeeping of a session leaving the table (expired, retired or removed by
/// sync): its FullNAT local port goes back to the pool and its real server's
/// active/inactive gauge drops.
fn forget(
    pool: &mut Option<PortPool>,
    real_servers: &[RealServerCounters],
    s: &Session,
    now_ms: u32,
) {
    release_local_port(pool, s, now_ms);
    let c = &real_servers[s.real() as usize];
    RealServerCounters::gauge_add(
        if s.is_active() {
            &c.active
        } else {
            &c.inactive
        },
        -1,
    );
}

/// Tells real server `id`'s new load, after one of this worker's counts of it
/// changed, to the scheduler that tracks its loads (O(log n) there) and to its
/// connection thresholds, if its service has any of either.
#[inline]
pub(super) fn tell_load(
    load_view: &LoadView,
    schedulers: &mut [Box<dyn Scheduler>],
    overload: &mut Overload,
    own: &[RealServerCounters],
    id: u32,
) {
    if let Some((service, position)) = load_view.tracked_position(id) {
        if let Some(scheduler) = schedulers.get_mut(service) {
            let load = load_view.load(service, position, id);
            scheduler.set_load(position, load);
            overload.apply(service, position, load, &mut **scheduler, own);
        }
    }
}

impl Forwarder {
    /// [`tell_load`] for real server `id`.
    #[inline]
    fn load_changed(&mut self, id: u32) {
        tell_load(
            &self.load_view,
            &mut self.schedulers,
            &mut self.overload,
            &self.real_servers,
            id,
        );
    }
}

/// Returns a FullNAT session's local port to its local address's pool at `now_ms` on
/// the timestamp clock, whichever service the session was of (no-op otherwise).
fn release_local_port(pool: &mut Option<PortPool>, s: &Session, now_ms: u32) {
    if s.mode == ForwardMode::FullNat && s.local_port != 0 {
        if let Some(pool) = pool {
            let _ = pool.release(
                Ipv4Addr::from(s.local_addr),
                s.local_port,
                Ipv4Addr::from(s.real_addr),
                now_ms,
            );
        }
    }
}

/// Milliseconds since the Unix epoch (0 if the system clock is before it).
fn wall_clock_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[inline]
/// The IPv6 session capacity of a worker whose IPv4 table holds `capacity`: an
/// eighth, at least 256 and at most 2^20 (IPv6 entries are larger; see
/// `session::table6`).
pub fn ipv6_capacity(capacity: usize) -> usize {
    (capacity / 8).clamp(256, 1 << 20)
}

pub(super) fn limiter_slot(ip: Ipv4Addr) -> usize {
    (u32::from(ip) as usize).wrapping_mul(2654435761) % ARP_LIMITER_SLOTS
}

#[inline]
fn local(v: Verdict) -> Action {
    match v {
        Verdict::Reply => Action::Transmit,
        Verdict::Drop(r) => Action::Drop(r),
    }
}

/// A client's TCP segment's sequence numbers, IPv4 or IPv6, for its session's check
/// (`SessionTable::on_client_segment`): `None` for a reply, a UDP datagram, or a
/// header `classify` did not check (never, for a TCP `parsed`).
#[inline]
fn client_segment(frame: &[u8], parsed: &Parsed, dir: Direction) -> Option<ClientSegment> {
    let (flags, payload_len) = match parsed.kind {
        PacketKind::Tcp {
            flags, payload_len, ..
        }
        | PacketKind::Ipv6(Ipv6Payload::Tcp {
            flags, payload_len, ..
        }) => (flags, payload_len),
        _ => return None,
    };
    if dir != Direction::Inbound {
        return None;
    }
    let seq = tcp_word(frame, parsed, 4)?;
    let ends = u32::from(flags.contains(TcpFlags::SYN)) + u32::from(flags.contains(TcpFlags::FIN));
    Some(ClientSegment {
        seq,
        next: seq.wrapping_add(u32::from(payload_len)).wrapping_add(ends),
    })
}

/// The 32-bit field at `offset` of the TCP header at `parsed.l4` (4: the sequence
/// number, 8: the acknowledgment number). `classify` checked the header, so it is
/// there; `None` only for a `parsed` that does not describe `frame`.
#[inline]
fn tcp_word(frame: &[u8], parsed: &Parsed, offset: usize) -> Option<u32> {
    let at = parsed.l4 + offset;
    Some(u32::from_be_bytes(frame.get(at..at + 4)?.try_into().ok()?))
}

/// What a TCP segment tells its session's sequence check (`Forwarder::hit`).
#[derive(Clone, Copy, Debug)]
pub(super) enum SegmentSeq {
    /// Nothing: a UDP datagram, a real server's segment without ACK or with RST, or a
    /// segment the SYN proxy made up.
    None,
    /// A client's segment: its sequence numbers (`SessionTable::on_client_segment`).
    Client(ClientSegment),
    /// A real server's segment with ACK and without RST: its acknowledgment number
    /// (`SessionTable::on_server_segment`).
    ServerAck(u32),
}

/// [`SegmentSeq`] of a segment seen going `dir`, with `flags`.
#[inline]
fn segment_seq(frame: &[u8], parsed: &Parsed, dir: Direction, flags: TcpFlags) -> SegmentSeq {
    let tcp = matches!(
        parsed.kind,
        PacketKind::Tcp { .. } | PacketKind::Ipv6(Ipv6Payload::Tcp { .. })
    );
    match dir {
        Direction::Outbound
            if tcp && flags.contains(TcpFlags::ACK) && !flags.contains(TcpFlags::RST) =>
        {
            tcp_word(frame, parsed, 8).map_or(SegmentSeq::None, SegmentSeq::ServerAck)
        }
        Direction::Outbound => SegmentSeq::None,
        _ => client_segment(frame, parsed, dir).map_or(SegmentSeq::None, SegmentSeq::Client),
    }
}

#[inline]
fn done(r: Result<(), DropReason>) -> Action {
    match r {
        Ok(()) => Action::Transmit,
        Err(reason) => Action::Drop(reason),
    }
}

/// A one-worker configuration over `table` with room for `capacity` sessions, and the
/// publisher its reader follows: the forwarder of the unit tests.
#[cfg(test)]
pub(crate) fn test_config(
    table: &crate::service::ServiceTable,
    capacity: usize,
) -> (crate::service::SnapshotPublisher, ForwarderConfig) {
    let publisher =
        crate::service::SnapshotPublisher::new(crate::service::Snapshot::build(1, table));
    let hz = 1_000_000_000;
    let config = ForwarderConfig::new(
        capacity,
        publisher.reader(),
        crate::session::Timeouts::default().in_ticks(100),
        hz / 10,
        hz,
        Arc::new(crate::dataplane::realserver_stats::new_table()),
        RssView::default_spread(1, 0),
    );
    (publisher, config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Protocol;
    use std::net::IpAddr;

    /// The configuration of a forwarder with no service (and the publisher its
    /// reader follows).
    fn bare_config() -> (crate::service::SnapshotPublisher, ForwarderConfig) {
        test_config(&crate::service::ServiceTable::new(), 1024)
    }

    /// A forwarder that has adopted a snapshot of `table` (generation 2), and the
    /// publisher it follows.
    fn forwarder_for(
        table: &crate::service::ServiceTable,
    ) -> (crate::service::SnapshotPublisher, Forwarder) {
        let (publisher, mut config) = bare_config();
        publisher
            .publish(crate::service::Snapshot::build(2, table))
            .unwrap();
        config.snapshot = publisher.reader();
        (publisher, Forwarder::new(config))
    }

    /// Publishes `table` as snapshot `generation`, built from the current one (as the
    /// daemon does), and has `f` adopt it.
    fn adopt(
        publisher: &crate::service::SnapshotPublisher,
        f: &mut Forwarder,
        table: &crate::service::ServiceTable,
        generation: u64,
    ) {
        let health = crate::service::HealthOverlay::default();
        let previous = publisher.current();
        let next = crate::service::Snapshot::build_reusing(
            generation,
            table,
            &health,
            &[],
            Some(&previous),
        );
        publisher.publish(next).unwrap();
        f.poll(0, &crate::dataplane::counters::WorkerCounters::default());
        assert_eq!(f.snapshot.current().generation(), generation);
    }

    /// The first port, 198.18.0.1/24, answering with `responder`.
    fn lan0(responder: &LocalResponder) -> PortContext<'_> {
        PortContext {
            responder,
            index: 0,
            mac: MacAddr([2, 0, 0, 0, 0, 1]),
            addr: Ipv4Addr::new(198, 18, 0, 1),
            mtu: 1500,
            redirected: false,
            exception: false,
        }
    }

    fn lan0_responder() -> LocalResponder {
        LocalResponder::new([2, 0, 0, 0, 0, 1], &[(Ipv4Addr::new(198, 18, 0, 1), 24)])
    }

    #[test]
    fn a_template_renewal_holds_past_the_next_one() {
        for tps in [1, 10, 100, 1000] {
            for timeout_s in [1, 2, 3, 10, 300, 2_678_400] {
                let r = TemplateRenewal::of(timeout_s, tps);
                let timeout = timeout_s * tps;
                assert!(r.every >= tps, "at most once a second: {r:?}");
                assert!(r.every <= timeout.max(tps), "{r:?}");
                assert!(r.holds >= timeout, "at least the timeout: {r:?}");
                assert!(r.holds >= 2 * r.every, "no gap between renewals: {r:?}");
                assert!(
                    r.holds <= timeout.max(2 * tps),
                    "no longer than needed: {r:?}"
                );
            }
        }
    }

    #[test]
    fn a_synced_persistent_session_stays_persistent() {
        use crate::model::{RealServerSpec, ServiceKey};
        use crate::session::replication::{RecordFlags, RecordKind, RecordOp, RecordRepr};
        let vip = Ipv4Addr::new(198, 18, 0, 240);
        let real = std::net::SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 21), 8080);
        let mut table = crate::service::ServiceTable::new();
        let key = ServiceKey::new(Protocol::Tcp, vip, 80);
        let persistence = Some(crate::model::Persistence::new(60));
        table
            .add_service(key, crate::model::SchedulerKind::Rr, persistence)
            .unwrap();
        let rs = RealServerSpec::new(*real.ip(), real.port(), 1, ForwardMode::Nat);
        table.add_server(key, rs).unwrap();
        let (_publisher, config) = test_config(&table, 16);
        let mut f = Forwarder::new(config);
        let record = |port: u16, flags: RecordFlags| RecordRepr {
            kind: RecordKind::Connection,
            op: RecordOp::Update,
            proto: Protocol::Tcp,
            mode: ForwardMode::Nat,
            state: crate::session::TcpState::Established,
            client_prefix_len: 32,
            flags,
            client: std::net::SocketAddrV4::new(Ipv4Addr::new(198, 18, 1, 7), port).into(),
            virtual_service: std::net::SocketAddrV4::new(vip, 80).into(),
            real_server: real.into(),
            local: None,
            timeout_ms: 60_000,
            timestamp_offset: 0,
            synproxy: None,
        };
        for (port, flags, persistent) in [
            (40000, RecordFlags::PERSISTENT, true),
            (40001, RecordFlags::default(), false),
        ] {
            assert_eq!(f.install(&record(port, flags)), Some(Event::SyncInstalled));
            let (_, s) = f
                .sessions()
                .iter()
                .find(|(_, s)| s.client_port == port)
                .unwrap();
            assert_eq!(
                s.flags().contains(SessionFlags::PERSISTENT),
                persistent,
                "{port}"
            );
        }
    }

    /// A forwarder with no service (and the publisher its reader follows).
    fn bare_forwarder() -> (crate::service::SnapshotPublisher, Forwarder) {
        let (publisher, config) = bare_config();
        (publisher, Forwarder::new(config))
    }

    #[test]
    fn vrrp_adverts_go_up_from_the_peers_only() {
        use crate::ha::vrrp::node::{VirtualAddresses, VrrpNode};
        use crate::ha::vrrp::router::VrrpConfig;
        // A real advert, from `from` (priority 255 advertises at once).
        let advert_from = |from: Ipv4Addr| {
            let mut node = VrrpNode::new(
                VrrpConfig {
                    vrid: 51,
                    priority: 255,
                    advert_interval_cs: 100,
                    preempt: true,
                    primary_addr: from,
                },
                MacAddr([2, 0, 0, 0, 0, 2]),
            );
            let mut frames = Vec::new();
            let addrs = VirtualAddresses {
                v4: vec![Ipv4Addr::new(198, 18, 1, 1)],
                v6: Vec::new(),
            };
            node.start(0, &addrs, &mut |f: &[u8]| {
                frames.push(f.to_vec());
                true
            });
            frames.swap_remove(0)
        };
        let (peer, stranger) = (Ipv4Addr::new(198, 18, 0, 2), Ipv4Addr::new(198, 18, 0, 3));
        let with = |senders: VrrpSenders| {
            let (publisher, mut config) = bare_config();
            config.vrrp = senders;
            (publisher, Forwarder::new(config))
        };
        let mac = vrrp::MULTICAST_MAC;
        let responder = lan0_responder();
        let port = lan0(&responder);
        let (_p, f) = with(VrrpSenders::Peers(vec![Ipv4Addr::new(198, 18, 0, 9), peer]));
        assert_eq!(f.to_group(&advert_from(peer), mac, &port), Action::Punt);
        assert_eq!(
            f.to_group(&advert_from(stranger), mac, &port),
            Action::Drop(DropReason::NotAPeer)
        );
        // A peer's address on a port whose link it is not on: forged there.
        let other = LocalResponder::new([2, 0, 0, 0, 0, 2], &[(Ipv4Addr::new(198, 19, 0, 1), 24)]);
        assert_eq!(
            f.to_group(&advert_from(peer), mac, &lan0(&other)),
            Action::Drop(DropReason::NotAPeer)
        );
        // `any_peer = true`: anyone's goes up; VRRP off: the group is not ours.
        let (_p, f) = with(VrrpSenders::Any);
        assert_eq!(f.to_group(&advert_from(stranger), mac, &port), Action::Punt);
        let (_p, f) = with(VrrpSenders::Off);
        assert_eq!(
            f.to_group(&advert_from(peer), mac, &port),
            Action::Drop(DropReason::NotOurMac)
        );
    }

    /// Real servers are ARPed for while unknown, and, by the worker that rechecks,
    /// again once their entry was not confirmed for `NEIGHBOUR_RECHECK_S`.
    #[test]
    fn real_servers_are_resolved_and_rechecked_after_the_recheck_age() {
        let mut table = crate::service::ServiceTable::new();
        let key = crate::model::ServiceKey::new(Protocol::Tcp, Ipv4Addr::new(198, 18, 1, 1), 80);
        table
            .add_service(key, crate::model::SchedulerKind::Rr, None)
            .unwrap();
        let rs = Ipv4Addr::new(198, 18, 0, 11);
        let spec = crate::model::RealServerSpec::new(rs, 80, 1, ForwardMode::Dr);
        table.add_server(key, spec).unwrap();
        let (_publisher, mut f) = forwarder_for(&table);
        let hz: u64 = 1_000_000_000;
        let age = NEIGHBOUR_RECHECK_S * hz;
        let mut neighbours = NeighbourTable::with_capacity(16);
        let asked = |f: &mut Forwarder, n: &mut NeighbourTable, now: u64, recheck: bool| {
            let mut sent = Vec::new();
            f.resolve_real_servers(n, now, recheck, |ip| {
                sent.push(ip);
                true
            });
            sent
        };
        assert_eq!(asked(&mut f, &mut neighbours, 1, true), [rs], "unknown");
        neighbours.learn(rs, MacAddr([2, 0, 0, 0, 0, 11]), 2);
        assert!(asked(&mut f, &mut neighbours, 2 + age, true).is_empty());
        assert!(
            asked(&mut f, &mut neighbours, 3 + age, false).is_empty(),
            "not the worker that rechecks"
        );
        assert_eq!(asked(&mut f, &mut neighbours, 3 + age, true), [rs]);
        assert!(
            asked(&mut f, &mut neighbours, 4 + age, true).is_empty(),
            "asked already"
        );
        // The answer carries the new MAC and restarts the age.
        neighbours.learn(rs, MacAddr([2, 0, 0, 0, 0, 12]), 5 + age);
        assert!(asked(&mut f, &mut neighbours, 5 + 2 * age, true).is_empty());
        assert_eq!(asked(&mut f, &mut neighbours, 6 + 2 * age, true), [rs]);
        // No room for the request: not counted as asked, so asked in the next round.
        let mut tried = 0;
        f.resolve_real_servers(&mut neighbours, 7 + 3 * age, true, |_| {
            tried += 1;
            false
        });
        assert_eq!(tried, 1);
        assert_eq!(asked(&mut f, &mut neighbours, 7 + 3 * age, true), [rs]);
    }

    /// Real servers that never answer, first in the list and more than a round has
    /// room for, do not starve the rechecks of those after them: each round resumes
    /// where the last ran out of room.
    #[test]
    fn unanswered_real_servers_do_not_starve_the_rechecks_after_them() {
        let mut table = crate::service::ServiceTable::new();
        let key = crate::model::ServiceKey::new(Protocol::Tcp, Ipv4Addr::new(198, 18, 1, 1), 80);
        table
            .add_service(key, crate::model::SchedulerKind::Rr, None)
            .unwrap();
        // 40 silent ones (198.18.0.x sort before 198.18.1.x), then 60 that answer.
        let silent = |i: u8| Ipv4Addr::new(198, 18, 0, 10 + i);
        let known = |i: u8| Ipv4Addr::new(198, 18, 1, 10 + i);
        for ip in (0..40).map(silent).chain((0..60).map(known)) {
            let spec = crate::model::RealServerSpec::new(ip, 80, 1, ForwardMode::Nat);
            table.add_server(key, spec).unwrap();
        }
        let (_publisher, config) = test_config(&table, 1024);
        let mut f = Forwarder::new(config);
        let hz: u64 = 1_000_000_000;
        let mut neighbours = NeighbourTable::with_capacity(256);
        for i in 0..60 {
            neighbours.learn(known(i), MacAddr([2, 0, 0, 0, 1, i]), 1);
        }
        // One round a second, 32 requests of room each, from when every known entry
        // is due for its recheck: within a few rounds each has been asked.
        let mut rechecked = std::collections::BTreeSet::new();
        for round in 0..8u64 {
            let now = NEIGHBOUR_RECHECK_S * hz + round * hz + 2;
            let mut room = 32;
            f.resolve_real_servers(&mut neighbours, now, true, |ip| {
                if room == 0 {
                    return false;
                }
                room -= 1;
                if ip.octets()[2] == 1 {
                    rechecked.insert(ip);
                }
                true
            });
        }
        assert_eq!(rechecked.len(), 60, "rechecked: {rechecked:?}");
    }

    /// The peers this port sends to by their MACs (VRRP unicast, session sync over the
    /// port) are resolved and rechecked as real servers are: a peer rebuilt with
    /// another MAC is found again. Multicast VRRP and sync over a kernel socket need
    /// no entry here, and get no ARP.
    #[test]
    fn peers_are_resolved_and_rechecked_as_real_servers_are() {
        let (peer, sync_peer) = (Ipv4Addr::new(198, 18, 0, 2), Ipv4Addr::new(198, 18, 0, 3));
        let peers = |unicast: bool, over_port: bool| {
            let (_publisher, mut config) = bare_config();
            config.vrrp = VrrpSenders::Peers(vec![peer]);
            config.vrrp_unicast = unicast;
            config.sync_peers = vec![sync_peer];
            if over_port {
                config.sync_port = Some(("198.18.0.1:8848".parse().unwrap(), None));
            }
            Forwarder::new(config)
        };
        for (unicast, over_port, want) in [
            (false, false, vec![]),
            (true, false, vec![peer]),
            (false, true, vec![sync_peer]),
        ] {
            let mut f = peers(unicast, over_port);
            let mut sent = Vec::new();
            f.resolve_real_servers(&mut NeighbourTable::with_capacity(16), 1, true, |ip| {
                sent.push(ip);
                true
            });
            assert_eq!(
                sent, want,
                "unicast {unicast}, sync over the port {over_port}"
            );
        }
        let mut f = peers(true, true);
        let age = NEIGHBOUR_RECHECK_S * 1_000_000_000;
        let mut neighbours = NeighbourTable::with_capacity(16);
        let asked = |f: &mut Forwarder, n: &mut NeighbourTable, now: u64| {
            let mut sent = Vec::new();
            f.resolve_real_servers(n, now, true, |ip| {
                sent.push(ip);
                true
            });
            sent
        };
        assert_eq!(
            asked(&mut f, &mut neighbours, 1),
            [peer, sync_peer],
            "unknown"
        );
        neighbours.learn(peer, MacAddr([2, 0, 0, 0, 0, 2]), 2);
        neighbours.learn(sync_peer, MacAddr([2, 0, 0, 0, 0, 3]), 2);
        assert!(asked(&mut f, &mut neighbours, 2 + age).is_empty());
        assert_eq!(asked(&mut f, &mut neighbours, 3 + age), [peer, sync_peer]);
        assert!(asked(&mut f, &mut neighbours, 4 + age).is_empty(), "asked");
    }

    /// With `[vrrp] unicast`, an advert to one of the port's addresses (keepalived's
    /// `unicast_peer`) goes up by the sender rules of one to the group, and only with
    /// TTL 255: any other may have been routed from anywhere.
    #[test]
    fn unicast_vrrp_adverts_to_the_port_go_up_from_the_peers_on_the_link_only() {
        let (peer, stranger) = (Ipv4Addr::new(198, 18, 0, 2), Ipv4Addr::new(198, 18, 0, 3));
        let (ours, elsewhere) = (Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 18, 0, 50));
        let responder = lan0_responder();
        let port = lan0(&responder);
        // IPv4 protocol `protocol` with `ttl` from `src` to `dst`, to the port's MAC
        // (the body: a VRRPv3 header; the management core checks the rest).
        let frame = |src: Ipv4Addr, dst: Ipv4Addr, protocol: u8, ttl: u8| {
            let mut f = vec![0u8; 14 + 20 + 8];
            ethernet::Repr {
                src_addr: MacAddr([2, 0, 0, 0, 0, 9]),
                dst_addr: MacAddr([2, 0, 0, 0, 0, 1]),
                ethertype: ethernet::EtherType::IPV4,
            }
            .emit(&mut ethernet::Frame::new_unchecked(&mut f[..]));
            crate::wire::ipv4::Repr {
                src_addr: src,
                dst_addr: dst,
                protocol: crate::wire::IpProtocol(protocol),
                payload_len: 8,
                ttl,
            }
            .emit(&mut crate::wire::ipv4::Packet::new_unchecked(&mut f[14..]));
            f[34..38].copy_from_slice(&[0x31, 51, 254, 0]);
            f
        };
        let decide = |senders: VrrpSenders, unicast: bool, f: &[u8]| {
            let (_publisher, mut config) = bare_config();
            config.vrrp = senders;
            config.vrrp_unicast = unicast;
            let ip = crate::wire::ipv4::Packet::new_unchecked(&f[14..]);
            let (src, dst) = (ip.src_addr(), ip.dst_addr());
            Forwarder::new(config).other_ipv4(
                f,
                (src, dst, ip.protocol()),
                responder.is_local(dst),
                &port,
            )
        };
        let peers = || VrrpSenders::Peers(vec![peer]);
        let advert = |src, dst| frame(src, dst, 112, 255);
        assert_eq!(decide(peers(), true, &advert(peer, ours)), Action::Punt);
        assert_eq!(
            decide(peers(), true, &advert(stranger, ours)),
            Action::Drop(DropReason::NotAPeer)
        );
        // Routed (TTL below 255): not from the link, whatever its source says.
        assert_eq!(
            decide(peers(), true, &frame(peer, ours, 112, 254)),
            Action::Drop(DropReason::NotAPeer)
        );
        assert_eq!(
            decide(peers(), true, &advert(peer, elsewhere)),
            Action::Drop(DropReason::NotLocal)
        );
        assert_eq!(
            decide(VrrpSenders::Any, true, &advert(stranger, ours)),
            Action::Punt
        );
        // Without `unicast`, or with VRRP off, protocol 112 to the port is not ours
        // (the kernel's, with an exception path); nor is another protocol.
        for (senders, unicast) in [(peers(), false), (VrrpSenders::Off, true)] {
            assert_eq!(
                decide(senders, unicast, &advert(peer, ours)),
                Action::Drop(DropReason::UnsupportedProtocol)
            );
        }
        assert_eq!(
            decide(peers(), true, &frame(peer, ours, 89, 255)),
            Action::Drop(DropReason::UnsupportedProtocol)
        );
        // A peer's address from another port's link: forged there.
        let other = LocalResponder::new([2, 0, 0, 0, 0, 2], &[(Ipv4Addr::new(198, 19, 0, 1), 24)]);
        let (_publisher, mut config) = bare_config();
        config.vrrp = peers();
        config.vrrp_unicast = true;
        let to_other = advert(peer, Ipv4Addr::new(198, 19, 0, 1));
        assert_eq!(
            Forwarder::new(config).other_ipv4(
                &to_other,
                (peer, Ipv4Addr::new(198, 19, 0, 1), vrrp::PROTOCOL),
                true,
                &lan0(&other)
            ),
            Action::Drop(DropReason::NotAPeer)
        );
    }

    #[test]
    fn sync_datagrams_to_the_group_mac_go_up_and_nothing_else_does() {
        use crate::ha::sync::frame;
        let listen = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 1), 8848);
        let group = SocketAddrV4::new(Ipv4Addr::new(224, 0, 0, 81), 8848);
        let peer = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 2), 8848);
        let mac = MacAddr::ipv4_multicast(*group.ip());
        let build_from = |from: SocketAddrV4, to: SocketAddrV4, dst_mac: MacAddr| {
            let mut f = vec![0u8; frame::HEADERS_LEN + 8];
            frame::write(&mut f, from, to, b"SLSY\x01\x01\0\0").unwrap();
            f[0..6].copy_from_slice(&dst_mac.0);
            f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 2]);
            f
        };
        let build = |to: SocketAddrV4, dst_mac: MacAddr| build_from(peer, to, dst_mac);
        let responder = lan0_responder();
        let port = lan0(&responder);
        let (_publisher, f) = bare_forwarder();
        // Not configured: a group MAC is not ours.
        assert_eq!(
            f.to_group(&build(group, mac), mac, &port),
            Action::Drop(DropReason::NotOurMac)
        );
        let with_sync_port = |port| {
            let (publisher, mut config) = bare_config();
            config.sync_port = Some(port);
            config.sync_peers = vec![Ipv4Addr::new(198, 18, 0, 9), *peer.ip()];
            (publisher, Forwarder::new(config))
        };
        let (_publisher, f) = with_sync_port((listen, Some(group)));
        assert_eq!(f.to_group(&build(group, mac), mac, &port), Action::Punt);
        // The same datagram from an address that is no peer's: dropped here.
        let stranger = build_from(
            SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 3), 8848),
            group,
            mac,
        );
        assert_eq!(
            f.to_group(&stranger, mac, &port),
            Action::Drop(DropReason::NotAPeer)
        );
        // Another port of the group, another group with the same MAC (the low 23 bits
        // only), or another group MAC: not ours.
        let other_port = SocketAddrV4::new(*group.ip(), 8849);
        let same_mac = SocketAddrV4::new(Ipv4Addr::new(224, 128, 0, 81), 8848);
        assert_eq!(MacAddr::ipv4_multicast(*same_mac.ip()), mac);
        for (to, dst_mac) in [
            (other_port, mac),
            (same_mac, mac),
            (group, MacAddr::ipv4_multicast(Ipv4Addr::new(224, 0, 0, 82))),
        ] {
            assert_eq!(
                f.to_group(&build(to, dst_mac), dst_mac, &port),
                Action::Drop(DropReason::NotOurMac),
                "{to} to {dst_mac}"
            );
        }
        // VRRP's MAC stays VRRP's: not ours while VRRP is off.
        assert_eq!(
            f.to_group(
                &build(group, vrrp::MULTICAST_MAC),
                vrrp::MULTICAST_MAC,
                &port
            ),
            Action::Drop(DropReason::NotOurMac)
        );
        // A broken IPv4 header on the group's MAC: dropped for what it is.
        let mut bad = build(group, mac);
        bad[24] ^= 1;
        assert_eq!(
            f.to_group(&bad, mac, &port),
            Action::Drop(DropReason::BadIpv4Checksum)
        );
        // Unicast sync needs no group: set without one, the group MAC is not ours.
        let (_publisher, f) = with_sync_port((listen, None));
        assert_eq!(
            f.to_group(&build(group, mac), mac, &port),
            Action::Drop(DropReason::NotOurMac)
        );
    }

    /// Local ports of every pool of `f` in use.
    fn pool_ports_in_use(f: &Forwarder) -> u32 {
        let mut q = Query::Pools {
            from: 0,
            out: Vec::with_capacity(8),
            next: None,
        };
        f.answer(&mut q, 0, &NeighbourTable::with_capacity(1), 0);
        let Query::Pools { out, .. } = q else {
            unreachable!()
        };
        out.iter().map(|e| e.counters.used).sum()
    }

    /// Fuzzing found three ways synced FullNAT sessions got the local-port books wrong
    /// on the standby: a record refused for lack of room (or a key taken) kept the
    /// port it had reserved, forever; a record with a port another session of this
    /// worker holds was installed with it anyway (both sessions then own one port,
    /// and the first to end frees it under the other); a FullNAT record for a real
    /// server this node forwards to in another mode was installed with a local port
    /// of no pool here.
    #[test]
    fn synced_fullnat_sessions_keep_the_port_books_straight() {
        use crate::model::{RealServerSpec, ServiceKey};
        use crate::service::ServiceTable;
        use crate::session::replication::{RecordFlags, RecordKind, RecordOp, RecordRepr};
        use crate::session::TcpState;
        let vip = Ipv4Addr::new(198, 18, 0, 240);
        let dr_vip = Ipv4Addr::new(198, 18, 0, 210);
        let lip = Ipv4Addr::new(198, 18, 0, 50);
        let mut table = ServiceTable::new();
        let full = ServiceKey::new(Protocol::Tcp, vip, 80);
        table
            .add_service(full, crate::model::SchedulerKind::Rr, None)
            .unwrap();
        let rs = RealServerSpec::new(Ipv4Addr::new(198, 18, 0, 21), 8080, 1, ForwardMode::FullNat);
        table.add_server(full, rs).unwrap();
        table.add_laddr(full, lip.into()).unwrap();
        let dr = ServiceKey::new(Protocol::Tcp, dr_vip, 80);
        table
            .add_service(dr, crate::model::SchedulerKind::Rr, None)
            .unwrap();
        let rs = RealServerSpec::new(Ipv4Addr::new(198, 18, 0, 11), 80, 1, ForwardMode::Dr);
        table.add_server(dr, rs).unwrap();
        // Room for one session.
        let (_publisher, mut config) = test_config(&table, 1);
        config.local_ports = 40000..=40031;
        let mut f = Forwarder::new(config);
        let record = |client: u16, vip: Ipv4Addr, real: SocketAddrV4, lport: u16| RecordRepr {
            kind: RecordKind::Connection,
            op: RecordOp::Update,
            proto: Protocol::Tcp,
            mode: ForwardMode::FullNat,
            state: TcpState::Established,
            client_prefix_len: 32,
            flags: RecordFlags::default(),
            client: SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 100), client).into(),
            virtual_service: SocketAddrV4::new(vip, 80).into(),
            real_server: real.into(),
            local: Some(SocketAddrV4::new(lip, lport).into()),
            timeout_ms: 60_000,
            timestamp_offset: 0,
            synproxy: None,
        };
        let full_rs = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 21), 8080);
        let dr_rs = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 11), 80);
        // FullNAT towards a real server this node reaches by DR: not installed.
        assert_eq!(f.install(&record(33000, dr_vip, dr_rs, 40000)), None);
        assert_eq!((f.sessions().len(), pool_ports_in_use(&f)), (0, 0));
        // A local address this service does not have here (the peers' configs
        // differ), or a port outside the pool: no port to reserve, not installed.
        let mut foreign = record(33000, vip, full_rs, 40000);
        foreign.local = Some(SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 52), 40000).into());
        assert_eq!(f.install(&foreign), None);
        assert_eq!(f.install(&record(33000, vip, full_rs, 50000)), None);
        assert_eq!((f.sessions().len(), pool_ports_in_use(&f)), (0, 0));
        assert_eq!(
            f.install(&record(33000, vip, full_rs, 40000)),
            Some(Event::SyncInstalled)
        );
        assert_eq!((f.sessions().len(), pool_ports_in_use(&f)), (1, 1));
        // Another connection with the port the first one holds: refused.
        assert_eq!(f.install(&record(33001, vip, full_rs, 40000)), None);
        // Another port, but the table is full: refused, and the port stays free.
        assert_eq!(f.install(&record(33002, vip, full_rs, 40001)), None);
        assert_eq!((f.sessions().len(), pool_ports_in_use(&f)), (1, 1));
        // The peer removes the one session: its port goes back.
        let mut gone = record(33000, vip, full_rs, 40000);
        gone.op = RecordOp::Remove;
        assert_eq!(f.install(&gone), Some(Event::SyncRemoved));
        assert_eq!((f.sessions().len(), pool_ports_in_use(&f)), (0, 0));
    }
    /// A listing reads at most [`SLOTS_PER_ANSWER`] slots per answer, used or not: a
    /// large table with one session is read in short chunks (each between two polls),
    /// and the one session is listed once.
    #[test]
    fn a_connection_listing_reads_a_bounded_number_of_slots_per_answer() {
        use crate::model::{RealServerSpec, ServiceKey};
        use crate::service::ServiceTable;
        use crate::session::replication::{RecordFlags, RecordKind, RecordOp, RecordRepr};
        use crate::session::TcpState;
        let vip = Ipv4Addr::new(198, 18, 0, 210);
        let real = SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 11), 80);
        let mut table = ServiceTable::new();
        let dr = ServiceKey::new(Protocol::Tcp, vip, 80);
        table
            .add_service(dr, crate::model::SchedulerKind::Rr, None)
            .unwrap();
        let rs = RealServerSpec::new(*real.ip(), 80, 1, ForwardMode::Dr);
        table.add_server(dr, rs).unwrap();
        let (_publisher, config) = test_config(&table, 4 * SLOTS_PER_ANSWER);
        let mut f = Forwarder::new(config);
        let record = RecordRepr {
            kind: RecordKind::Connection,
            op: RecordOp::Update,
            proto: Protocol::Tcp,
            mode: ForwardMode::Dr,
            state: TcpState::Established,
            client_prefix_len: 32,
            flags: RecordFlags::default(),
            client: SocketAddrV4::new(Ipv4Addr::new(198, 18, 0, 100), 33000).into(),
            virtual_service: SocketAddrV4::new(vip, 80).into(),
            real_server: real.into(),
            local: None,
            timeout_ms: 60_000,
            timestamp_offset: 0,
            synproxy: None,
        };
        assert_eq!(f.install(&record), Some(Event::SyncInstalled));
        let slots = f.sessions().capacity() + f.sessions6.capacity();
        let (mut from, mut answers, mut listed) = (Some(0), 0, 0);
        while let Some(at) = from {
            let mut query = Query::Connections {
                from: at,
                out: Vec::with_capacity(crate::dataplane::query::CONNECTIONS_PER_CHUNK),
                next: None,
            };
            f.answer(&mut query, 0, &NeighbourTable::with_capacity(1), 0);
            let Query::Connections { out, next, .. } = query else {
                unreachable!()
            };
            if let Some(n) = next {
                assert!(n > at && n - at <= SLOTS_PER_ANSWER, "{at} -> {n}");
            }
            listed += out.len();
            answers += 1;
            from = next;
            assert!(answers <= slots, "the listing does not end");
        }
        assert_eq!(listed, 1);
        assert_eq!(answers, slots.div_ceil(SLOTS_PER_ANSWER));
    }

    /// The standby's IPv6 FullNAT and NAT64 sessions: a NAT64 session's IPv4 local
    /// port is reserved in the service's pool (so no new connection takes it), a port
    /// held already or of no local address here refuses the record, and a removal
    /// gives the port back; an IPv6 FullNAT session needs one of the service's IPv6
    /// local addresses, and its reply (real server to local address and port) finds
    /// it.
    #[test]
    fn synced_ipv6_fullnat_and_nat64_sessions_hold_their_local_ends() {
        use crate::model::{RealServerSpec, ServiceKey};
        use crate::service::ServiceTable;
        use crate::session::replication::{RecordFlags, RecordKind, RecordOp, RecordRepr};
        use crate::session::TcpState;
        use std::net::Ipv6Addr;
        let vip: Ipv6Addr = "2001:db8:18::100".parse().unwrap();
        let (lip4, rs4) = (Ipv4Addr::new(198, 18, 0, 50), Ipv4Addr::new(198, 18, 0, 21));
        let (lip6, rs6): (Ipv6Addr, Ipv6Addr) = (
            "2001:db8:1a::50".parse().unwrap(),
            "2001:db8:1a::11".parse().unwrap(),
        );
        let mut table = ServiceTable::new();
        let nat64 = ServiceKey::new(Protocol::Tcp, vip, 83);
        table
            .add_service(nat64, crate::model::SchedulerKind::Rr, None)
            .unwrap();
        let rs = RealServerSpec::new(rs4, 8080, 1, ForwardMode::FullNat);
        table.add_server(nat64, rs).unwrap();
        table.add_laddr(nat64, lip4.into()).unwrap();
        let full6 = ServiceKey::new(Protocol::Tcp, vip, 82);
        table
            .add_service(full6, crate::model::SchedulerKind::Rr, None)
            .unwrap();
        let rs = RealServerSpec::new(rs6, 8080, 1, ForwardMode::FullNat);
        table.add_server(full6, rs).unwrap();
        table.add_laddr(full6, lip6.into()).unwrap();
        let (_publisher, mut config) = test_config(&table, 64);
        config.local_ports = 40000..=40031;
        let mut f = Forwarder::new(config);
        let client: Ipv6Addr = "2001:db8:18::2".parse().unwrap();
        let record = |cport: u16, vport: u16, real: SocketAddr, local: SocketAddr| RecordRepr {
            kind: RecordKind::Connection,
            op: RecordOp::Update,
            proto: Protocol::Tcp,
            mode: ForwardMode::FullNat,
            state: TcpState::Established,
            client_prefix_len: 128,
            flags: RecordFlags::default(),
            client: SocketAddr::new(client.into(), cport),
            virtual_service: SocketAddr::new(vip.into(), vport),
            real_server: real,
            local: Some(local),
            timeout_ms: 60_000,
            timestamp_offset: 0,
            synproxy: None,
        };
        let (real4, real6) = (
            SocketAddr::new(rs4.into(), 8080),
            SocketAddr::new(rs6.into(), 8080),
        );
        let at4 = |port| SocketAddr::new(lip4.into(), port);
        // NAT64: a port outside the pool, or of another address: not installed.
        assert_eq!(f.install(&record(33000, 83, real4, at4(50000))), None);
        let other = SocketAddr::new(Ipv4Addr::new(198, 18, 0, 52).into(), 40000);
        assert_eq!(f.install(&record(33000, 83, real4, other)), None);
        assert_eq!((f.sessions6().len(), pool_ports_in_use(&f)), (0, 0));
        assert_eq!(
            f.install(&record(33000, 83, real4, at4(40000))),
            Some(Event::SyncInstalled)
        );
        assert_eq!((f.sessions6().len(), pool_ports_in_use(&f)), (1, 1));
        // The port taken: neither the peer's next record nor this worker's pool
        // hands it out again.
        assert_eq!(f.install(&record(33001, 83, real4, at4(40000))), None);
        assert!(f.pool.as_ref().is_some_and(|p| p.is_in_use(lip4, 40000)));
        // Its IPv4 reply key finds it (IPv4-mapped, as the data plane files it).
        let reply = FlowKey6 {
            src: rs4.to_ipv6_mapped(),
            dst: lip4.to_ipv6_mapped(),
            sport: 8080,
            dport: 40000,
            proto: Protocol::Tcp,
        };
        assert!(f.sessions6.lookup(&reply, 0).is_some());
        let mut gone = record(33000, 83, real4, at4(40000));
        gone.op = RecordOp::Remove;
        assert_eq!(f.install(&gone), Some(Event::SyncRemoved));
        assert_eq!((f.sessions6().len(), pool_ports_in_use(&f)), (0, 0));

        // IPv6 FullNAT: a local address the service has not here is refused.
        let at6 = |ip: Ipv6Addr, port| SocketAddr::new(ip.into(), port);
        let stranger: Ipv6Addr = "2001:db8:1a::52".parse().unwrap();
        assert_eq!(
            f.install(&record(33002, 82, real6, at6(stranger, 41000))),
            None
        );
        assert_eq!(
            f.install(&record(33002, 82, real6, at6(lip6, 41000))),
            Some(Event::SyncInstalled)
        );
        let reply = FlowKey6 {
            src: rs6,
            dst: lip6,
            sport: 8080,
            dport: 41000,
            proto: Protocol::Tcp,
        };
        let (id, dir) = f.sessions6.lookup(&reply, 0).unwrap();
        assert_eq!(dir, crate::session::Direction::Outbound);
        assert_eq!(f.sessions6.get(id).unwrap().client_port, 33002);
        // Another client with that local end: its reply key is taken, refused.
        assert_eq!(f.install(&record(33003, 82, real6, at6(lip6, 41000))), None);
        // Mixed families are no session: an IPv6 real server behind an IPv4 end.
        assert_eq!(f.install(&record(33004, 82, real6, at4(40001))), None);
        assert_eq!((f.sessions6().len(), pool_ports_in_use(&f)), (1, 0));
    }

    /// Neighbor Discovery is told the snapshot's IPv6 real servers, and what other
    /// workers share keeps the table's last quarter for them too.
    #[test]
    fn ipv6_real_servers_keep_their_quarter_of_the_neighbour_table() {
        use crate::model::{RealServerSpec, ServiceKey};
        use crate::service::ServiceTable;
        use std::net::Ipv6Addr;
        let vip: Ipv6Addr = "2001:db8:18::100".parse().unwrap();
        let rs: Ipv6Addr = "2001:db8:1a::11".parse().unwrap();
        let mut table = ServiceTable::new();
        let key = ServiceKey::new(Protocol::Tcp, vip, 80);
        table
            .add_service(key, crate::model::SchedulerKind::Rr, None)
            .unwrap();
        table
            .add_server(key, RealServerSpec::new(rs, 80, 1, ForwardMode::Dr))
            .unwrap();
        let (_publisher, config) = test_config(&table, 1024);
        let mut f = Forwarder::new(config);
        let known = Forwarder::known6(&f.owned6, &f.snapshot);
        assert_eq!(known.real_servers6, &[rs][..]);
        let mac = |i: u16| MacAddr([2, 0, 0, 0, (i >> 8) as u8, i as u8]);
        let capacity = crate::dataplane::worker::NEIGHBOUR_CAPACITY;
        for i in 0..capacity as u16 {
            let made_up = Ipv6Addr::new(0x2001, 0xdb8, 0x1a, 0, 0, 0, 0x99, i);
            f.learn_shared_neighbour6(made_up, mac(i), 1);
        }
        assert_eq!(f.neighbours6.len(), capacity - capacity / 4);
        f.learn_shared_neighbour6(rs, mac(7), 2);
        assert_eq!(f.neighbour6(rs), Some(mac(7)));
    }

    /// `sluicectl neigh`'s question: every entry of both tables once, with its role
    /// and age, in answers of at most a bounded number of slots.
    #[test]
    fn the_neighbours_query_lists_both_tables_in_bounded_steps() {
        use crate::dataplane::query::{NeighbourRole, NEIGHBOUR_SLOTS_PER_ANSWER};
        use crate::model::{RealServerSpec, ServiceKey};
        use crate::service::ServiceTable;
        use std::net::Ipv6Addr;
        let rs4 = Ipv4Addr::new(198, 18, 0, 11);
        let rs6: Ipv6Addr = "2001:db8:1a::11".parse().unwrap();
        let peer = Ipv4Addr::new(198, 18, 0, 2);
        let mut table = ServiceTable::new();
        for (vip, rs) in [
            (
                IpAddr::from(Ipv4Addr::new(198, 18, 1, 1)),
                IpAddr::from(rs4),
            ),
            ("2001:db8:18::100".parse().unwrap(), rs6.into()),
        ] {
            let key = ServiceKey::new(Protocol::Tcp, vip, 80);
            table
                .add_service(key, crate::model::SchedulerKind::Rr, None)
                .unwrap();
            table
                .add_server(key, RealServerSpec::new(rs, 80, 1, ForwardMode::Dr))
                .unwrap();
        }
        let (_publisher, mut config) = test_config(&table, 1024);
        config.sync_peers = vec![peer];
        config.sync_port = Some(("198.18.0.1:8848".parse().unwrap(), None));
        let mut f = Forwarder::new(config);
        let hz = 1_000_000_000;
        let mac = |i: u16| MacAddr([2, 0, 0, 0, (i >> 8) as u8, i as u8]);
        let capacity = crate::dataplane::worker::NEIGHBOUR_CAPACITY;
        let mut v4 = NeighbourTable::with_capacity(capacity);
        v4.learn(rs4, mac(1), 0);
        v4.learn(peer, mac(2), hz);
        // Others to well past one answer's slots.
        const OTHERS: u16 = 3000;
        for i in 0..OTHERS {
            v4.learn(Ipv4Addr::from(0x0a00_0000 + u32::from(i)), mac(100 + i), 0);
        }
        f.learn_shared_neighbour6(rs6, mac(6), 2 * hz);
        f.learn_shared_neighbour6("2001:db8:1a::99".parse().unwrap(), mac(7), 0);
        let now = 5 * hz;
        let (mut from, mut asked, mut got) = (0, 0, Vec::new());
        loop {
            let mut q = Query::Neighbours {
                from,
                out: Vec::with_capacity(NEIGHBOUR_SLOTS_PER_ANSWER),
                next: None,
                tables: Default::default(),
            };
            f.answer(&mut q, 3, &v4, now);
            asked += 1;
            let Query::Neighbours {
                out, next, tables, ..
            } = q
            else {
                unreachable!()
            };
            assert_eq!((tables.ipv4, tables.ipv6), (OTHERS as usize + 2, 2));
            assert!(out.capacity() == NEIGHBOUR_SLOTS_PER_ANSWER, "never grown");
            got.extend(out);
            match next {
                Some(next) => from = next,
                None => break,
            }
        }
        let slots = v4.slot_count() + f.neighbours6.slot_count();
        assert_eq!(asked, slots.div_ceil(NEIGHBOUR_SLOTS_PER_ANSWER));
        assert_eq!(got.len(), OTHERS as usize + 4, "each entry once");
        let find = |ip: IpAddr| {
            let e = got.iter().find(|e| e.ip == ip).unwrap();
            (e.worker, e.mac, e.age_ms, e.role)
        };
        assert_eq!(
            find(rs4.into()),
            (3, mac(1), 5000, NeighbourRole::RealServer)
        );
        assert_eq!(find(peer.into()), (3, mac(2), 4000, NeighbourRole::Peer));
        assert_eq!(
            find(rs6.into()),
            (3, mac(6), 3000, NeighbourRole::RealServer)
        );
        assert_eq!(
            find("2001:db8:1a::99".parse().unwrap()).3,
            NeighbourRole::Other
        );
        assert_eq!(
            find(Ipv4Addr::new(10, 0, 0, 7).into()).3,
            NeighbourRole::Other
        );
        // Less room than a step reads only as many slots as the room holds.
        let mut q = Query::Neighbours {
            from: 0,
            out: Vec::with_capacity(4),
            next: None,
            tables: Default::default(),
        };
        f.answer(&mut q, 3, &v4, now);
        let Query::Neighbours { out, next, .. } = q else {
            unreachable!()
        };
        assert!(out.len() <= 4 && out.capacity() == 4);
        assert_eq!(next, Some(4));
    }

    /// The management core's view of the pools with many services (600 of 8 local
    /// addresses each): every service gets a row per local address, and the whole
    /// listing costs the worker two questions (4800 addresses, 4096 a chunk), not one
    /// per service.
    #[test]
    fn the_pools_query_gives_every_service_its_local_addresses() {
        use crate::model::{RealServerSpec, SchedulerKind, ServiceKey};
        use crate::service::ServiceTable;
        const SERVICES: u32 = 600;
        const LIPS: u32 = 8;
        let lip = |service: u32, i: u32| Ipv4Addr::from(0x0a00_0001 + service * LIPS + i);
        let mut table = ServiceTable::new();
        for service in 0..SERVICES {
            let key = ServiceKey::new(Protocol::Tcp, Ipv4Addr::from(0xc612_0100 + service), 80);
            table.add_service(key, SchedulerKind::Rr, None).unwrap();
            let rs = RealServerSpec::new(
                Ipv4Addr::new(198, 51, 100, 21),
                8080,
                1,
                ForwardMode::FullNat,
            );
            table.add_server(key, rs).unwrap();
            for i in 0..LIPS {
                table.add_laddr(key, lip(service, i).into()).unwrap();
            }
        }
        let (_publisher, mut config) = test_config(&table, 1024);
        config.local_ports = 40000..=40003;
        let f = Forwarder::new(config);
        let mut asked = 0;
        let rows = crate::daemon::collect_pool_rows(1, |_, mut query| {
            asked += 1;
            f.answer(&mut query, 0, &NeighbourTable::with_capacity(1), 0);
            Ok(query)
        })
        .unwrap();
        assert_eq!(rows.len(), (SERVICES * LIPS) as usize);
        assert_eq!(asked, 2);
        for service in 0..SERVICES {
            let lips: Vec<Ipv4Addr> = (0..LIPS).map(|i| lip(service, i)).collect();
            let mine = crate::daemon::service_pools(&rows, &lips);
            let got: Vec<Ipv4Addr> = mine.iter().map(|p| p.lip).collect();
            assert_eq!(got, lips, "service {service}");
            assert!(mine.iter().all(|p| p.used == 0 && p.free == 4));
        }
    }

    /// Both neighbour tables take `[sessions] neighbours` (the worker sizes its IPv4
    /// table from the forwarder's).
    #[test]
    fn the_neighbour_tables_take_the_configured_capacity() {
        let table = crate::service::ServiceTable::new();
        let (_publisher, config) = test_config(&table, 1024);
        assert_eq!(
            Forwarder::new(config).neighbour_capacity(),
            crate::dataplane::worker::NEIGHBOUR_CAPACITY
        );
        let (_publisher, config) = test_config(&table, 1024);
        let f = Forwarder::new(ForwarderConfig {
            neighbour_capacity: 20_000,
            ..config
        });
        assert_eq!(f.neighbour_capacity(), 20_000);
        assert_eq!(f.neighbours6.capacity(), 20_000);
    }

    /// A worker picks from the snapshot's own Maglev table, not from a copy of it:
    /// adopting a snapshot costs no copy of any `mh` table, and a snapshot that
    /// reuses the previous one's table leaves the worker on that same table.
    #[test]
    fn workers_share_the_snapshots_maglev_tables() {
        let mut table = crate::service::ServiceTable::new();
        let key = crate::model::ServiceKey::new(Protocol::Tcp, Ipv4Addr::new(198, 18, 1, 1), 80);
        table
            .add_service(key, crate::model::SchedulerKind::Mh, None)
            .unwrap();
        for last in [11, 12] {
            let rs = Ipv4Addr::new(198, 18, 0, last);
            let spec = crate::model::RealServerSpec::new(rs, 80, 1, ForwardMode::Dr);
            table.add_server(key, spec).unwrap();
        }
        let (publisher, mut f) = forwarder_for(&table);
        let shares = |f: &Forwarder, publisher: &crate::service::SnapshotPublisher| {
            let any: &dyn std::any::Any = &*f.schedulers[0];
            let mine = any
                .downcast_ref::<Arc<crate::sched::Maglev>>()
                .expect("the worker's mh scheduler is the snapshot's table");
            Arc::ptr_eq(mine, publisher.current().maglev(0).unwrap())
        };
        assert!(shares(&f, &publisher));
        let first = publisher.current();
        adopt(&publisher, &mut f, &table, 3);
        assert!(shares(&f, &publisher));
        assert!(Arc::ptr_eq(
            first.maglev(0).unwrap(),
            publisher.current().maglev(0).unwrap()
        ));
    }

    /// A worker adopting a snapshot keeps the scheduler of each service whose
    /// scheduling inputs did not change (the same object, its state with it) and
    /// builds one for a service that did change.
    #[test]
    fn a_worker_keeps_the_schedulers_of_unchanged_services() {
        let mut table = crate::service::ServiceTable::new();
        let key =
            |port| crate::model::ServiceKey::new(Protocol::Tcp, Ipv4Addr::new(198, 18, 1, 1), port);
        for port in [80, 81] {
            table
                .add_service(key(port), crate::model::SchedulerKind::Wlc, None)
                .unwrap();
            for last in [11, 12] {
                let rs = Ipv4Addr::new(198, 18, 0, last);
                let spec = crate::model::RealServerSpec::new(rs, port, 1, ForwardMode::Nat);
                table.add_server(key(port), spec).unwrap();
            }
        }
        let (publisher, mut f) = forwarder_for(&table);
        let schedulers = |f: &Forwarder| -> Vec<*const ()> {
            let snap = f.snapshot.current();
            [80, 81]
                .map(|port| {
                    let i = snap.find_index(&key(port)).unwrap();
                    &*f.schedulers[i] as *const dyn Scheduler as *const ()
                })
                .to_vec()
        };
        let before = schedulers(&f);
        let rs = Ipv4Addr::new(198, 18, 0, 13);
        let spec = crate::model::RealServerSpec::new(rs, 81, 1, ForwardMode::Nat);
        table.add_server(key(81), spec).unwrap();
        adopt(&publisher, &mut f, &table, 3);
        let after = schedulers(&f);
        assert_eq!(
            after[0], before[0],
            ":80 did not change: its scheduler is kept"
        );
        assert_ne!(after[1], before[1], ":81 has a new server: a new scheduler");
        // :80 deleted: :81 moves to index 0 and keeps its scheduler.
        table.delete_service(key(80)).unwrap();
        adopt(&publisher, &mut f, &table, 4);
        assert_eq!(f.snapshot.current().find_index(&key(81)), Some(0));
        let moved = &*f.schedulers[0] as *const dyn Scheduler as *const ();
        assert_eq!(moved, after[1], ":81 keeps its scheduler at its new index");
    }

    /// A kept scheduler whose service has an overloaded server (over its upper
    /// threshold) still leaves it out after an adoption that changed another service:
    /// the worker does not tell it again, and it needs no telling.
    #[test]
    fn a_kept_scheduler_still_leaves_an_overloaded_server_out() {
        let mut table = crate::service::ServiceTable::new();
        let key =
            |port| crate::model::ServiceKey::new(Protocol::Tcp, Ipv4Addr::new(198, 18, 1, 1), port);
        let kind = |port| match port {
            80 => crate::model::SchedulerKind::Fo,
            _ => crate::model::SchedulerKind::Rr,
        };
        for port in [80, 81] {
            table.add_service(key(port), kind(port), None).unwrap();
        }
        for (last, weight, upper) in [(11, 2, 1), (12, 1, 0)] {
            let rs = Ipv4Addr::new(198, 18, 0, last);
            let mut spec = crate::model::RealServerSpec::new(rs, 80, weight, ForwardMode::Nat);
            spec.upper = upper;
            table.add_server(key(80), spec).unwrap();
        }
        let (publisher, mut f) = forwarder_for(&table);
        let pick = |f: &mut Forwarder| {
            let i = f.snapshot.current().find_index(&key(80)).unwrap();
            let servers = f.overload.servers(i).expect("thresholds").to_vec();
            let ctx = crate::sched::PickContext::new(Ipv4Addr::new(198, 18, 2, 9), 1024, &[]);
            f.schedulers[i].pick(&servers, &ctx)
        };
        assert_eq!(pick(&mut f), Some(0), "fo: the heavier server");
        let i = f.snapshot.current().find_index(&key(80)).unwrap();
        let own = Arc::clone(&f.real_servers);
        let load = crate::sched::ServerLoad::new(1, 0);
        f.overload.apply(i, 0, load, &mut *f.schedulers[i], &own);
        assert_eq!(pick(&mut f), Some(1), "the heavier server is overloaded");
        let kept = &*f.schedulers[i] as *const dyn Scheduler as *const ();
        let rs = Ipv4Addr::new(198, 18, 0, 13);
        let spec = crate::model::RealServerSpec::new(rs, 81, 1, ForwardMode::Nat);
        table.add_server(key(81), spec).unwrap();
        adopt(&publisher, &mut f, &table, 3);
        let i = f.snapshot.current().find_index(&key(80)).unwrap();
        assert_eq!(&*f.schedulers[i] as *const dyn Scheduler as *const (), kept);
        assert_eq!(pick(&mut f), Some(1), "still overloaded, still left out");
    }

    /// What the sequence check reads of a segment: a client's sequence numbers
    /// inbound; outbound, a real server's acknowledgment only on a TCP segment with ACK
    /// and without RST (a SYN-ACK included), nothing for a RST, a bare SYN or UDP.
    #[test]
    fn segment_seq_reads_a_clients_sequence_and_a_servers_acknowledgment() {
        let frame = |proto: u8, flags: u8| {
            let mut f = vec![0u8; 14 + 20 + 20];
            f[..12].copy_from_slice(&[2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2]);
            f[12..14].copy_from_slice(&[0x08, 0x00]);
            f[14..34].copy_from_slice(&[
                0x45, 0, 0, 40, 0, 0, 0x40, 0, 64, proto, 0, 0, 198, 18, 0, 21, 198, 18, 0, 9,
            ]);
            crate::wire::ipv4::Packet::new_unchecked(&mut f[14..34]).fill_checksum();
            // Ports, sequence 0x01020304, acknowledgment 0x0a0b0c0d, 20-byte header.
            f[34..54].copy_from_slice(&[
                0, 80, 0x9c, 0x40, 1, 2, 3, 4, 10, 11, 12, 13, 0x50, flags, 0x20, 0, 0, 0, 0, 0,
            ]);
            if proto == 17 {
                // UDP: the same ports, length 20, no checksum.
                f[38..42].copy_from_slice(&[0, 20, 0, 0]);
            }
            f
        };
        let (syn, rst, ack) = (0x02, 0x04, 0x10);
        let seq = |proto, flags, dir| {
            let f = frame(proto, flags);
            let parsed = classify(&f).expect("a valid frame");
            let flags = if proto == 6 {
                TcpFlags(flags)
            } else {
                TcpFlags::empty()
            };
            format!("{:?}", segment_seq(&f, &parsed, dir, flags))
        };
        let server_ack = format!("{:?}", SegmentSeq::ServerAck(0x0a0b_0c0d));
        let none = format!("{:?}", SegmentSeq::None);
        assert_eq!(seq(6, ack, Direction::Outbound), server_ack);
        assert_eq!(seq(6, syn | ack, Direction::Outbound), server_ack);
        assert_eq!(seq(6, rst | ack, Direction::Outbound), none);
        assert_eq!(seq(6, syn, Direction::Outbound), none);
        assert_eq!(seq(17, ack, Direction::Outbound), none);
        let client = ClientSegment {
            seq: 0x0102_0304,
            next: 0x0102_0304,
        };
        assert_eq!(
            seq(6, ack, Direction::Inbound),
            format!("{:?}", SegmentSeq::Client(client))
        );
    }

    #[test]
    fn the_ethernet_verdict_is_handles_first_decision() {
        let port = MacAddr([0x02, 0x53, 0x4c, 0, 0, 1]);
        let host = [0x02, 0xc1, 0, 0, 0, 1];
        let frame = |dst: [u8; 6], src: [u8; 6]| {
            let mut f = vec![0u8; 60];
            f[..6].copy_from_slice(&dst);
            f[6..12].copy_from_slice(&src);
            f[12..14].copy_from_slice(&[0x08, 0x00]);
            f
        };
        let other = [0x02, 0x4f, 0x54, 0, 0, 1];
        let vrrp = [0x01, 0x00, 0x5e, 0, 0, 0x12];
        let sync_group = [0x01, 0x00, 0x5e, 0, 0, 0x51];
        let ipv6_group = [0x33, 0x33, 0, 0, 0, 1];
        let cases: [(Vec<u8>, EthernetVerdict); 10] = [
            (
                frame(port.0, host)[..13].to_vec(),
                EthernetVerdict::Truncated,
            ),
            // A bare header is the verdict's to make; what follows is classify's.
            (
                frame(port.0, host)[..14].to_vec(),
                EthernetVerdict::Parse(port),
            ),
            (frame(port.0, host), EthernetVerdict::Parse(port)),
            (
                frame([0xff; 6], host),
                EthernetVerdict::Parse(MacAddr([0xff; 6])),
            ),
            (
                frame(ipv6_group, host),
                EthernetVerdict::Parse(MacAddr(ipv6_group)),
            ),
            (frame(other, host), EthernetVerdict::NotOurs(MacAddr(other))),
            (frame(vrrp, host), EthernetVerdict::NotOurs(MacAddr(vrrp))),
            (
                frame(sync_group, host),
                EthernetVerdict::NotOurs(MacAddr(sync_group)),
            ),
            // A group source is refused whatever the frame is sent to.
            (
                frame(port.0, [0x03, 0, 0, 0, 0, 1]),
                EthernetVerdict::MulticastSource,
            ),
            (
                frame([0xff; 6], [0xff; 6]),
                EthernetVerdict::MulticastSource,
            ),
        ];
        for (f, want) in cases {
            let got = EthernetVerdict::of(&f, port);
            assert_eq!(got, want, "{:02x?}", &f[..12.min(f.len())]);
        }
    }
}
