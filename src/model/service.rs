//! Plain data shared by config, control and data plane.
//!
//! Everything here is a value: the management core edits these through
//! [`ServiceTable`](crate::service::ServiceTable) and workers read copies of them in an
//! immutable [`Snapshot`](crate::service::Snapshot).
use super::protocol::Protocol;
use super::scheduler::{SchedFlags, SchedulerKind, MH_DEFAULT_TABLE_SIZE};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::str::FromStr;

/// How packets reach a real server, per real server as in ipvsadm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ForwardMode {
    /// Direct routing (`-g`): only the destination MAC changes.
    Dr,
    /// Masquerading (`-m`): DNAT in, SNAT back; the real server routes via Sluice.
    Nat,
    /// IP-in-IP tunnelling (`-i`).
    Tun,
    /// DNAT + SNAT to a local address (`-b`, as in DPVS).
    FullNat,
}

impl ForwardMode {
    pub const ALL: [ForwardMode; 4] = [
        ForwardMode::Dr,
        ForwardMode::Nat,
        ForwardMode::Tun,
        ForwardMode::FullNat,
    ];

    /// The config/JSON name.
    pub fn name(self) -> &'static str {
        match self {
            ForwardMode::Dr => "dr",
            ForwardMode::Nat => "nat",
            ForwardMode::Tun => "tun",
            ForwardMode::FullNat => "fullnat",
        }
    }

    /// The `Forward` column of `ipvsadm -Ln`.
    /// Whether the real server's replies come back through Sluice, rewritten (NAT,
    /// FullNAT), rather than straight to the client (DR, TUN).
    pub fn rewrites_replies(self) -> bool {
        matches!(self, ForwardMode::Nat | ForwardMode::FullNat)
    }

    pub fn ipvsadm_name(self) -> &'static str {
        match self {
            ForwardMode::Dr => "Route",
            ForwardMode::Nat => "Masq",
            ForwardMode::Tun => "Tunnel",
            ForwardMode::FullNat => "FullNat",
        }
    }
}

impl fmt::Display for ForwardMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for ForwardMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        ForwardMode::ALL
            .iter()
            .copied()
            .find(|m| m.name() == s)
            .ok_or_else(|| format!("unknown forwarding mode {s:?} (known: dr, nat, tun, fullnat)"))
    }
}

/// What identifies a virtual service: protocol, VIP and port.
///
/// Port 0 is ipvsadm's "all ports" service, which is only valid with persistence.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct ServiceKey {
    #[serde(with = "protocol_name")]
    pub proto: Protocol,
    pub vip: IpAddr,
    pub port: u16,
}

impl fmt::Display for ServiceKey {
    /// As ipvsadm prints it: `TCP 198.18.1.1:80`, `TCP [2001:db8::1]:80`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.proto.name(), self.endpoint())
    }
}

impl ServiceKey {
    pub fn new(proto: Protocol, vip: impl Into<IpAddr>, port: u16) -> Self {
        ServiceKey {
            proto,
            vip: vip.into(),
            port,
        }
    }

    /// VIP and port as ipvsadm writes them: `198.18.1.1:80`, `[2001:db8::1]:80`.
    pub fn endpoint(&self) -> SocketAddr {
        SocketAddr::new(self.vip, self.port)
    }

    /// The VIP when it is an IPv4 address.
    pub fn vip4(&self) -> Option<Ipv4Addr> {
        match self.vip {
            IpAddr::V4(a) => Some(a),
            IpAddr::V6(_) => None,
        }
    }

    pub fn is_ipv6(&self) -> bool {
        self.vip.is_ipv6()
    }

    /// How event lines name a service: `198.18.1.1:80/tcp`, `[2001:db8::1]:80/tcp`.
    pub fn event_name(&self) -> String {
        format!(
            "{}/{}",
            self.endpoint(),
            self.proto.name().to_ascii_lowercase()
        )
    }
}

impl Serialize for ForwardMode {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for ForwardMode {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

/// `Protocol` carries no serde of its own; services name it `"tcp"` / `"udp"`.
mod protocol_name {
    use crate::model::Protocol;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(proto: &Protocol, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(match proto {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
        })
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<Protocol, D::Error> {
        let name = String::deserialize(deserializer)?;
        match name.to_ascii_lowercase().as_str() {
            "tcp" => Ok(Protocol::Tcp),
            "udp" => Ok(Protocol::Udp),
            _ => Err(serde::de::Error::custom(format!(
                "unknown protocol {name:?} (known: tcp, udp)"
            ))),
        }
    }
}

/// The largest weight ipvsadm accepts (`-w 0..65535`).
pub const MAX_WEIGHT: u32 = 65535;

/// The largest connection threshold (`-x`, `-y`) ipvsadm accepts: its `INT_MAX`. A
/// larger one would make a saved table (`-S`) that ipvsadm's restore refuses.
pub const MAX_CONN_THRESHOLD: u32 = i32::MAX as u32;

/// The longest persistence timeout (`-p`), 31 days, as ipvsadm allows.
pub const MAX_PERSISTENCE_TIMEOUT_S: u32 = 31 * 86_400;

/// The most local addresses (FullNAT source addresses) one service may have. Each
/// one is a pool of about 64k source ports per real server, so 64 is far beyond
/// what any service needs, and it keeps per-worker pool memory bounded.
pub const MAX_LOCAL_ADDRESSES: usize = 64;

/// Real-server ids are below this (id 0 is never handed out): the workers count each
/// real server in a slot of a fixed array indexed by its id, and a session entry keeps
/// the id in two bytes.
pub const MAX_REAL_SERVER_IDS: usize = 65536;

/// One real server (an ipvsadm "destination") of a virtual service.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RealServer {
    /// Assigned by the table; stable across edits, so per-worker stats keyed by it
    /// survive snapshot swaps. Handed out again after the server's removal only once
    /// nothing refers to it any more (the daemon releases it to the table).
    pub id: u32,
    /// Of the service's family, except behind an IPv6 FullNAT service (NAT64).
    pub ip: IpAddr,
    pub port: u16,
    /// 0..=[`MAX_WEIGHT`]. 0 drains: no new connections, existing ones continue.
    pub weight: u32,
    pub mode: ForwardMode,
    /// Upper connection threshold (`ipvsadm -x`); 0 = no limit.
    pub upper: u32,
    /// Lower connection threshold (`ipvsadm -y`); 0 = none.
    pub lower: u32,
}

impl RealServer {
    /// Whether schedulers may give this server new connections.
    #[inline]
    pub fn accepts_new(&self) -> bool {
        self.weight > 0
    }

    /// The address of a real server of an IPv4 service. The service table refuses
    /// an IPv4 service with an IPv6 real server, so the IPv4 data path never meets
    /// one; were it to, this is 0.0.0.0, which no neighbour resolves.
    #[inline]
    pub fn ipv4(&self) -> Ipv4Addr {
        match self.ip {
            IpAddr::V4(a) => a,
            IpAddr::V6(_) => Ipv4Addr::UNSPECIFIED,
        }
    }

    /// Address and port as ipvsadm writes them: `10.0.0.2:80`, `[2001:db8::2]:80`.
    pub fn endpoint(&self) -> SocketAddr {
        SocketAddr::new(self.ip, self.port)
    }
}

/// What an operator supplies for a real server (`ipvsadm -a/-e`); the table adds the id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RealServerSpec {
    pub ip: IpAddr,
    pub port: u16,
    pub weight: u32,
    pub mode: ForwardMode,
    pub upper: u32,
    pub lower: u32,
}

impl RealServerSpec {
    /// A real server without connection thresholds.
    pub fn new(ip: impl Into<IpAddr>, port: u16, weight: u32, mode: ForwardMode) -> Self {
        RealServerSpec {
            ip: ip.into(),
            port,
            weight,
            mode,
            upper: 0,
            lower: 0,
        }
    }

    /// Sets the upper (`-x`) and lower (`-y`) connection thresholds.
    pub fn with_thresholds(mut self, upper: u32, lower: u32) -> Self {
        self.upper = upper;
        self.lower = lower;
        self
    }
}

/// Client affinity as `ipvsadm -p timeout -M netmask`: connections from one client
/// network go to the same real server until the template times out. An IPv4
/// service's network is the client's address & `netmask`; an IPv6 service's is its
/// first `prefix6` bits (`-M` takes a prefix length after an IPv6 `-t`/`-u`, as in
/// ipvsadm). Each family leaves the other's field at its default (all ones).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Persistence {
    pub timeout_s: u32,
    pub netmask: Ipv4Addr,
    /// 1..=128.
    #[serde(default = "full_prefix6")]
    pub prefix6: u8,
}

fn full_prefix6() -> u8 {
    Persistence::FULL_PREFIX6
}

impl Persistence {
    /// ipvsadm's default for `-p` without a value (libipvs's
    /// `IPVS_SVC_PERSISTENT_TIMEOUT`, 6 minutes).
    pub const DEFAULT_TIMEOUT_S: u32 = 360;
    /// An IPv6 service's prefix length without `-M`: per client address.
    pub const FULL_PREFIX6: u8 = 128;

    /// Per-client persistence (netmask /32, prefix /128), as `-p timeout` without `-M`.
    pub fn new(timeout_s: u32) -> Self {
        Persistence {
            timeout_s,
            netmask: Ipv4Addr::BROADCAST,
            prefix6: Self::FULL_PREFIX6,
        }
    }

    /// Per client network of `prefix6` bits, for an IPv6 service.
    pub fn with_prefix6(timeout_s: u32, prefix6: u8) -> Self {
        Persistence {
            prefix6,
            ..Self::new(timeout_s)
        }
    }

    /// Whether the netmask is contiguous ones followed by zeros.
    pub fn netmask_is_contiguous(&self) -> bool {
        let mask = u32::from(self.netmask);
        mask.leading_ones() + mask.trailing_zeros() == 32
    }
}

/// A virtual service and its real servers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Service {
    /// Assigned by the table; stable across edits and never reused within a run.
    pub id: u32,
    pub key: ServiceKey,
    pub scheduler: SchedulerKind,
    pub persistence: Option<Persistence>,
    /// In the order they were added; schedulers index into this slice.
    pub real_servers: Vec<RealServer>,
    /// FullNAT local addresses (LIPs, `ipvsadm --add-laddr`), in the order they were
    /// added: the source addresses of FullNAT sessions towards the real servers.
    /// Without one, new FullNAT sessions are refused (DR, NAT and TUN need none).
    #[serde(default)]
    pub local_addresses: Vec<IpAddr>,
    /// Insert the client's address and port as a TCP option (TOA, kind 254) into
    /// FullNAT sessions towards the real servers. Off by default; TCP only.
    #[serde(default)]
    pub toa: bool,
    /// Scheduler flags (`ipvsadm -b sh-port,...`); only the service's scheduler's
    /// own flags may be set.
    #[serde(default)]
    pub sched_flags: SchedFlags,
    /// Maglev lookup table size (mh only), a prime.
    #[serde(default = "default_mh_table_size")]
    pub mh_table_size: u32,
    /// The SYN proxy: whether Sluice answers new TCP connections with SYN cookies
    /// before opening them to a real server (NAT and FullNAT only).
    #[serde(default)]
    pub synproxy: SynProxy,
    /// The fallback real server (keepalived's `sorry_server`): it gets new
    /// connections only while no real server of `real_servers` can take one.
    #[serde(default)]
    pub sorry_server: Option<SorryServer>,
    /// Open a session from any TCP segment but an RST, not only from a SYN (IPVS's
    /// `sloppy_tcp`, here per service): a connection whose packets reach a node that
    /// never saw its SYN (another node of an ECMP cluster, a restarted node, a backup
    /// that took over without sync) carries on to the real server the scheduler picks
    /// for it, which with mh, sh or dh is the one every node picks. Not with FullNAT
    /// real servers: the server would see the connection from a new source.
    #[serde(default)]
    pub sloppy_tcp: bool,
}

/// A service's sorry server: scheduled as an ordinary real server of weight 1 while
/// no real server can take a new connection (every one evicted, of weight 0, or none
/// left), and as one of weight 0 otherwise, so its sessions carry on after the
/// regular servers come back while new connections go to them. Never health-checked
/// (as keepalived).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SorryServer {
    /// Assigned by the table from the real servers' ids.
    pub id: u32,
    pub ip: IpAddr,
    pub port: u16,
    pub mode: ForwardMode,
    /// keepalived's `sorry_server_inhibit`: listed (weight 0) while not in use, as
    /// keepalived leaves it in IPVS; without it, listed only while in use.
    #[serde(default)]
    pub inhibit: bool,
}

/// What an operator supplies for a sorry server (a service's `sorry_server` table);
/// the table adds the id.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SorryServerSpec {
    pub ip: IpAddr,
    pub port: u16,
    pub mode: ForwardMode,
    #[serde(default)]
    pub inhibit: bool,
}

impl SorryServer {
    /// What it was made from.
    pub fn spec(&self) -> SorryServerSpec {
        SorryServerSpec {
            ip: self.ip,
            port: self.port,
            mode: self.mode,
            inhibit: self.inhibit,
        }
    }

    /// The sorry server as a real server of weight 1 (in use) or 0.
    pub fn as_real_server(&self, in_use: bool) -> RealServer {
        RealServer {
            id: self.id,
            ip: self.ip,
            port: self.port,
            weight: u32::from(in_use),
            mode: self.mode,
            upper: 0,
            lower: 0,
        }
    }
}

impl Service {
    /// Whether the sorry server takes new connections: the service has one and none
    /// of its real servers accepts new connections in `real_servers` (the table's,
    /// or the table's with evicted servers at weight 0).
    pub fn sorry_in_use(&self, real_servers: &[RealServer]) -> bool {
        self.sorry_server.is_some() && !real_servers.iter().any(RealServer::accepts_new)
    }

    /// For a snapshot's service (its sorry server last in `real_servers`): whether a
    /// persistence template pinned to real server `id` is on the wrong side of the
    /// sorry server's switch, pinned to the sorry server while it is not in use or to
    /// another while it is. Such a template is not followed, so a persistent client
    /// goes where new connections go, as when keepalived removes or adds the sorry
    /// server in IPVS.
    #[inline]
    pub fn sorry_switched(&self, id: u32) -> bool {
        let Some(sorry) = self.sorry_server else {
            return false;
        };
        let in_use = self
            .real_servers
            .last()
            .is_some_and(|r| r.id == sorry.id && r.weight > 0);
        (id == sorry.id) != in_use
    }
}

/// When the SYN proxy answers a service's new connections.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SynProxyMode {
    /// Never: every SYN opens a session.
    #[default]
    Off,
    /// Always.
    On,
    /// On a worker while it sees more SYNs without a session per second for the
    /// service than [`SynProxy::auto_syn_rate`], and for at least one second after.
    Auto,
}

impl SynProxyMode {
    pub fn parse(s: &str) -> Option<SynProxyMode> {
        match s {
            "off" => Some(SynProxyMode::Off),
            "on" => Some(SynProxyMode::On),
            "auto" => Some(SynProxyMode::Auto),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            SynProxyMode::Off => "off",
            SynProxyMode::On => "on",
            SynProxyMode::Auto => "auto",
        }
    }
}

/// The default of [`SynProxy::auto_syn_rate`]: SYNs per second without a session, per
/// worker and service.
pub const DEFAULT_SYNPROXY_AUTO_SYN_RATE: u32 = 1000;

/// The default of [`SynProxy::syn_retries`]: as LVS's `synproxy_syn_retry`.
pub const DEFAULT_SYNPROXY_SYN_RETRIES: u8 = 3;

/// The most [`SynProxy::syn_retries`]: the SYN goes at 0, 1, 3, 7, 15 and 31 s and the
/// connection is given up at 63 s, while the SYN_RECV timeout (60 s by default) that
/// each SYN renews still holds the session.
pub const MAX_SYNPROXY_SYN_RETRIES: u8 = 5;

/// A service's SYN proxy settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SynProxy {
    pub mode: SynProxyMode,
    /// `auto`: SYNs per second without a session, per worker, above which the proxy
    /// turns on.
    #[serde(default = "default_auto_syn_rate")]
    pub auto_syn_rate: u32,
    /// Times the SYN to the real server is sent again, 1 s after it and then after
    /// twice as long each time, while the server does not answer; after the last
    /// wait the connection is given up (a reset to each side). 0: no timer, the SYN
    /// goes again only on the client's next segment.
    #[serde(default = "default_syn_retries")]
    pub syn_retries: u8,
}

fn default_auto_syn_rate() -> u32 {
    DEFAULT_SYNPROXY_AUTO_SYN_RATE
}

fn default_syn_retries() -> u8 {
    DEFAULT_SYNPROXY_SYN_RETRIES
}

impl Default for SynProxy {
    fn default() -> Self {
        SynProxy {
            mode: SynProxyMode::Off,
            auto_syn_rate: DEFAULT_SYNPROXY_AUTO_SYN_RATE,
            syn_retries: DEFAULT_SYNPROXY_SYN_RETRIES,
        }
    }
}

fn default_mh_table_size() -> u32 {
    MH_DEFAULT_TABLE_SIZE
}

impl Service {
    /// Index of the real server `ip:port`, as ipvsadm identifies a destination.
    pub fn server_index(&self, ip: impl Into<IpAddr>, port: u16) -> Option<usize> {
        let ip = ip.into();
        self.real_servers
            .iter()
            .position(|rs| rs.ip == ip && rs.port == port)
    }

    /// The real server `ip:port`.
    pub fn server(&self, ip: impl Into<IpAddr>, port: u16) -> Option<&RealServer> {
        self.server_index(ip, port).map(|i| &self.real_servers[i])
    }

    /// The server `ip:port` a session or template may be pinned to: a real server or
    /// the sorry server, which the table keeps out of `real_servers` (the sorry server
    /// as a real server of weight 0; only its identity and mode count here).
    pub fn pinnable_server(&self, ip: impl Into<IpAddr>, port: u16) -> Option<RealServer> {
        let ip = ip.into();
        self.server(ip, port).cloned().or_else(|| {
            self.sorry_server
                .filter(|s| s.ip == ip && s.port == port)
                .map(|s| s.as_real_server(false))
        })
    }

    /// As [`Service::pinnable_server`], by id.
    pub fn pinnable_server_by_id(&self, id: u32) -> Option<RealServer> {
        self.real_servers
            .iter()
            .find(|r| r.id == id)
            .cloned()
            .or_else(|| {
                self.sorry_server
                    .filter(|s| s.id == id)
                    .map(|s| s.as_real_server(false))
            })
    }

    /// Whether any real server can take a new connection (some weight > 0).
    pub fn has_available_server(&self) -> bool {
        self.real_servers.iter().any(RealServer::accepts_new)
    }

    /// Whether some real server is reached by FullNAT, and so needs a local address.
    pub fn has_fullnat_server(&self) -> bool {
        self.real_servers
            .iter()
            .any(|rs| rs.mode == ForwardMode::FullNat)
    }

    /// The IPv4 local addresses, in order (those of an IPv4 service: all of them).
    pub fn local_addresses4(&self) -> impl Iterator<Item = Ipv4Addr> + Clone + '_ {
        self.local_addresses.iter().filter_map(|a| match a {
            IpAddr::V4(a) => Some(*a),
            IpAddr::V6(_) => None,
        })
    }

    /// The IPv6 local addresses, in order.
    pub fn local_addresses6(&self) -> impl Iterator<Item = std::net::Ipv6Addr> + Clone + '_ {
        self.local_addresses.iter().filter_map(|a| match a {
            IpAddr::V6(a) => Some(*a),
            IpAddr::V4(_) => None,
        })
    }

    /// Whether `ip` is one of this service's local addresses.
    pub fn has_local_address(&self, ip: impl Into<IpAddr>) -> bool {
        self.local_addresses.contains(&ip.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample_service() -> Service {
        Service {
            id: 7,
            key: ServiceKey::new(Protocol::Udp, Ipv4Addr::new(198, 18, 1, 1), 53),
            scheduler: SchedulerKind::Wrr,
            persistence: Some(Persistence {
                netmask: Ipv4Addr::new(255, 255, 255, 0),
                ..Persistence::new(60)
            }),
            real_servers: vec![RealServer {
                id: 3,
                ip: Ipv4Addr::new(10, 0, 0, 2).into(),
                port: 5353,
                weight: 2,
                mode: ForwardMode::FullNat,
                upper: 100,
                lower: 50,
            }],
            local_addresses: vec![
                Ipv4Addr::new(198, 18, 0, 50).into(),
                Ipv4Addr::new(198, 18, 0, 51).into(),
            ],
            toa: true,
            sched_flags: "mh-port".parse().unwrap(),
            mh_table_size: 251,
            synproxy: SynProxy::default(),
            sorry_server: None,
            sloppy_tcp: false,
        }
    }

    #[test]
    fn service_round_trips_through_json_with_readable_names() {
        let service = sample_service();
        let json = serde_json::to_string(&service).unwrap();
        assert!(json.contains(r#""proto":"udp""#), "{json}");
        assert!(json.contains(r#""scheduler":"wrr""#), "{json}");
        assert!(json.contains(r#""mode":"fullnat""#), "{json}");
        assert!(json.contains(r#""vip":"198.18.1.1""#), "{json}");
        assert!(
            json.contains(r#""local_addresses":["198.18.0.50","198.18.0.51"]"#),
            "{json}"
        );
        assert!(json.contains(r#""toa":true"#), "{json}");
        let back: Service = serde_json::from_str(&json).unwrap();
        assert_eq!(back, service);
    }

    #[test]
    fn json_from_before_local_addresses_still_parses() {
        let mut value = serde_json::to_value(sample_service()).unwrap();
        let object = value.as_object_mut().unwrap();
        object.remove("local_addresses");
        object.remove("toa");
        let back: Service = serde_json::from_value(value).unwrap();
        assert!(back.local_addresses.is_empty());
        assert!(!back.toa);
        assert_eq!(back.real_servers, sample_service().real_servers);
    }

    #[test]
    fn fullnat_and_local_address_queries() {
        let mut service = sample_service();
        assert!(service.has_fullnat_server());
        assert!(service.has_local_address(Ipv4Addr::new(198, 18, 0, 51)));
        assert!(!service.has_local_address(Ipv4Addr::new(198, 18, 0, 52)));
        service.real_servers[0].mode = ForwardMode::Nat;
        assert!(!service.has_fullnat_server());
    }

    #[test]
    fn unknown_names_are_rejected_when_deserializing() {
        let json = serde_json::to_string(&sample_service()).unwrap();
        for (good, bad) in [
            (r#""udp""#, r#""sctp""#),
            (r#""wrr""#, r#""fastest""#),
            (r#""fullnat""#, r#""bridge""#),
        ] {
            let broken = json.replace(good, bad);
            assert!(
                serde_json::from_str::<Service>(&broken).is_err(),
                "{broken}"
            );
        }
    }

    #[test]
    fn netmask_contiguity() {
        let mut p = Persistence::new(300);
        assert!(p.netmask_is_contiguous());
        p.netmask = Ipv4Addr::new(255, 255, 0, 0);
        assert!(p.netmask_is_contiguous());
        p.netmask = Ipv4Addr::UNSPECIFIED;
        assert!(p.netmask_is_contiguous());
        p.netmask = Ipv4Addr::new(255, 0, 255, 0);
        assert!(!p.netmask_is_contiguous());
    }

    #[test]
    fn server_lookup_and_availability() {
        let mut service = sample_service();
        assert_eq!(
            service.server_index(Ipv4Addr::new(10, 0, 0, 2), 5353),
            Some(0)
        );
        assert!(service.server(Ipv4Addr::new(10, 0, 0, 2), 53).is_none());
        assert!(service.has_available_server());
        service.real_servers[0].weight = 0;
        assert!(!service.has_available_server());
    }
}
