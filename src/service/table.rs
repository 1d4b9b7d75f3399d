//! The management core's mutable registry of virtual services, edited with ipvsadm's
//! operations. Workers never see it: they read [`Snapshot`](super::snapshot::Snapshot)s
//! built from it.
//!
//! Every operation validates completely before it changes anything, so a failed command
//! leaves the table exactly as it was (an invalid weight never becomes 0, a rejected
//! service never half-exists).
//!
//! [`validate_service`] and [`validate_server`] are the one set of rules for services
//! and real servers: the config loader applies them to the file (with the file's
//! place), and every control command meets them here, with the appliance's own
//! addresses ([`ServiceTable::set_own_addresses`]) refused in every role.
use super::acl::{AclAction, Prefix};
use super::admission::{Admission, AdmissionRules, RateLimit};
use crate::model::Protocol;
use crate::model::{
    ForwardMode, Persistence, RealServer, RealServerSpec, Service, ServiceKey, SorryServer,
    SorryServerSpec, SynProxy, SynProxyMode, MAX_CONN_THRESHOLD, MAX_LOCAL_ADDRESSES,
    MAX_PERSISTENCE_TIMEOUT_S, MAX_WEIGHT,
};
use crate::model::{SchedFlags, SchedulerKind, MAX_REAL_SERVER_IDS};
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::fmt;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

/// Why a table operation was refused. `Display` gives one line that starts with
/// ipvsadm's own text where ipvsadm has one, so scripts grepping for it keep working.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServiceError {
    ServiceExists(ServiceKey),
    /// An access-list or rate-limit change refused (the reason).
    Admission(ServiceKey, String),
    NoSuchService(ServiceKey),
    DestinationExists {
        service: ServiceKey,
        ip: IpAddr,
        port: u16,
    },
    NoSuchDestination {
        service: ServiceKey,
        ip: IpAddr,
        port: u16,
    },
    WeightOutOfRange(u32),
    /// A connection threshold above [`MAX_CONN_THRESHOLD`] (ipvsadm's `INT_MAX`).
    ThresholdOutOfRange(u32),
    /// ipvsadm/IPVS refuse a lower threshold above the upper one.
    ThresholdsInverted {
        upper: u32,
        lower: u32,
    },
    /// DR and TUN deliver the packet unchanged at L4, so the real server must listen
    /// on the service port; only NAT and FullNAT rewrite it.
    PortMappingNotAllowed {
        mode: ForwardMode,
        service_port: u16,
        server_port: u16,
    },
    /// Port 0 on a real server would rewrite to port 0.
    ZeroServerPort {
        service_port: u16,
    },
    /// Sluice matches a service by its exact port: an "all ports" (port 0) service,
    /// which ipvsadm allows with persistence, would never match a packet.
    ZeroPort(ServiceKey),
    /// One of the appliance's own (port) addresses as a VIP or a real server: ARP,
    /// ICMP and traffic to it are the appliance's own.
    OwnAddress {
        what: &'static str,
        addr: IpAddr,
    },
    /// A persistence timeout beyond [`MAX_PERSISTENCE_TIMEOUT_S`].
    PersistenceTimeoutTooLong(u32),
    /// The VIP or real server address is not a unicast address.
    NotUnicast {
        what: &'static str,
        addr: IpAddr,
    },
    /// A VIP on a loopback address: no packet to one comes from the wire.
    LoopbackVip(IpAddr),
    PersistenceTimeoutZero,
    PersistenceNetmaskInvalid(Ipv4Addr),
    /// An IPv6 service's persistence prefix length (`-M`) outside 1..=128.
    PersistencePrefixInvalid(u8),
    /// A persistence netmask of the other family: a dotted netmask on an IPv6
    /// service, or a prefix length on an IPv4 one.
    PersistenceMaskFamily {
        service: ServiceKey,
    },
    /// 2^32 service ids handed out in one run; service ids are never reused, so none
    /// are left.
    IdsExhausted,
    /// Every real-server id below the table's limit is held: by a real or sorry
    /// server, or by one removed whose id is not released yet.
    ServerIdsExhausted {
        limit: u32,
    },
    /// A real or sorry server at a new address when the table holds as many distinct
    /// addresses of its family as the workers' neighbour tables are sized for.
    ServerAddressesExhausted {
        ip: IpAddr,
        limit: usize,
    },
    /// Scheduler flags the scheduler does not take, or a Maglev table size that is
    /// not a usable prime.
    SchedulerParams(String),
    /// An `mh` service with more real servers than its Maglev table has slots: the
    /// servers past the last slot would never get a connection.
    MaglevTableTooSmall {
        service: ServiceKey,
        slots: u32,
        servers: usize,
    },
    LocalAddressExists {
        service: ServiceKey,
        ip: IpAddr,
    },
    NoSuchLocalAddress {
        service: ServiceKey,
        ip: IpAddr,
    },
    /// A service already has [`MAX_LOCAL_ADDRESSES`].
    TooManyLocalAddresses(ServiceKey),
    /// A local address is not an address a real server can reply to.
    BadLocalAddress {
        ip: IpAddr,
        why: &'static str,
    },
    /// A real server (or sorry server) that is a VIP of this table, or a VIP that is
    /// one of its real servers: Sluice answers ARP for its VIPs and sends to real
    /// servers, so it would send the traffic to itself (or both it and the host would
    /// answer for the address).
    VipIsRealServer {
        ip: IpAddr,
        /// What `ip` already is ("the VIP", "a real server") of `holder`.
        role: &'static str,
        holder: ServiceKey,
    },
    /// A real server at a loopback address: Sluice has no local delivery (IPVS's
    /// "local" forwarding); a real server is a host on one of its links.
    LoopbackRealServer {
        what: &'static str,
        addr: IpAddr,
    },
    /// One address in two roles: a local address that is also a VIP or a real server.
    /// `role` is what `ip` already is ("the VIP", "a real server", "a local
    /// address") of `holder`. Sluice answers ARP for its local addresses and VIPs and
    /// sends to real servers, so the two roles would break each other.
    AddressConflict {
        ip: IpAddr,
        role: &'static str,
        holder: ServiceKey,
    },
    /// TOA is a TCP option: a UDP service cannot carry it.
    ToaNeedsTcp(ServiceKey),
    /// The SYN proxy answers TCP handshakes: a UDP service has none.
    SynProxyNeedsTcp(ServiceKey),
    /// The SYN proxy translates every segment of a connection both ways; DR and TUN
    /// replies bypass Sluice, so it cannot serve them.
    SynProxyNeedsNat {
        service: ServiceKey,
        ip: IpAddr,
        port: u16,
        mode: ForwardMode,
    },
    /// `auto` needs a SYN rate of at least 1 per second.
    SynProxyRateZero,
    /// More SYN retries than [`crate::model::MAX_SYNPROXY_SYN_RETRIES`].
    SynProxyRetries(u8),
    /// `sloppy_tcp` is about TCP segments: a UDP service opens sessions from any
    /// datagram already.
    SloppyNeedsTcp(ServiceKey),
    /// A session opened mid-connection towards a FullNAT real server would reach it
    /// from a new local address and port, a connection it never saw.
    SloppyNotFullNat {
        service: ServiceKey,
        ip: IpAddr,
        port: u16,
    },
    /// The SYN proxy opens connections only from a cookie ACK, so with it `sloppy_tcp`
    /// would do nothing: the two are refused together.
    SloppyWithSynProxy(ServiceKey),
    /// A real server or local address of the other address family than the
    /// service's (`what` names which), except what NAT64 takes: IPv4 FullNAT real
    /// servers and IPv4 local addresses behind an IPv6 service.
    FamilyMismatch {
        service: ServiceKey,
        what: &'static str,
        ip: IpAddr,
    },
    /// A feature the IPv6 data path does not have yet (`what` names it).
    Ipv6Unsupported {
        service: ServiceKey,
        what: &'static str,
    },
    /// The sorry server is also a real server of the service (either way round):
    /// one address and port cannot be both.
    SorryIsRealServer {
        service: ServiceKey,
        ip: IpAddr,
        port: u16,
    },
}

/// Refuses an `mh` service whose Maglev table of `slots` would be smaller than its
/// `servers`: a table fills one slot per server per round, so once it is full the
/// servers not yet placed get none, silently.
fn check_maglev_room(
    service: ServiceKey,
    scheduler: SchedulerKind,
    slots: u32,
    servers: usize,
) -> Result<(), ServiceError> {
    if scheduler == SchedulerKind::Mh && servers > slots as usize {
        return Err(ServiceError::MaglevTableTooSmall {
            service,
            slots,
            servers,
        });
    }
    Ok(())
}

impl fmt::Display for ServiceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServiceError::Admission(key, why) => write!(f, "{key}: {why}"),
            ServiceError::ServiceExists(key) => write!(f, "Service already exists: {key}"),
            ServiceError::NoSuchService(key) => write!(f, "No such service: {key}"),
            ServiceError::DestinationExists { service, ip, port } => {
                let dest = std::net::SocketAddr::new(*ip, *port);
                write!(f, "Destination already exists: {dest} in {service}")
            }
            ServiceError::NoSuchDestination { service, ip, port } => {
                let dest = std::net::SocketAddr::new(*ip, *port);
                write!(f, "No such destination: {dest} in {service}")
            }
            ServiceError::WeightOutOfRange(weight) => {
                write!(f, "illegal weight specified: {weight} (range 0..{MAX_WEIGHT})")
            }
            ServiceError::ThresholdOutOfRange(threshold) => write!(
                f,
                "illegal threshold specified: {threshold} (range 0..{MAX_CONN_THRESHOLD})"
            ),
            ServiceError::ThresholdsInverted { upper, lower } => write!(
                f,
                "illegal thresholds: lower threshold {lower} is higher than upper threshold {upper}"
            ),
            ServiceError::PortMappingNotAllowed {
                mode,
                service_port,
                server_port,
            } => write!(
                f,
                "real server port {server_port} differs from service port {service_port}: \
                 {} forwarding keeps the port; only nat and fullnat can map ports",
                mode.name()
            ),
            ServiceError::ZeroServerPort { service_port } => write!(
                f,
                "real server port 0 is not a port (the service is on port {service_port})"
            ),
            ServiceError::ZeroPort(key) => write!(
                f,
                "Zero port specified for service {key}: Sluice has no all-ports services (ports 1-65535)"
            ),
            ServiceError::OwnAddress { what, addr } => write!(
                f,
                "{what} {addr} is one of the appliance's own port addresses; a {what} needs an address of its own"
            ),
            ServiceError::PersistenceTimeoutTooLong(timeout) => write!(
                f,
                "illegal timeout for persistent service: {timeout} (at most {MAX_PERSISTENCE_TIMEOUT_S} s, 31 days)"
            ),
            ServiceError::NotUnicast { what, addr } => {
                write!(f, "invalid {what} address {addr}: not a unicast address")
            }
            ServiceError::LoopbackVip(addr) => write!(
                f,
                "invalid virtual service address {addr}: a loopback address (Sluice serves \
                 the wire, where no packet to one comes from)"
            ),
            ServiceError::PersistenceTimeoutZero => {
                f.write_str("illegal timeout for persistent service: 0 (must be at least 1 s)")
            }
            ServiceError::PersistenceNetmaskInvalid(mask) => {
                write!(f, "illegal persistent netmask {mask}: not contiguous")
            }
            ServiceError::PersistencePrefixInvalid(n) => write!(
                f,
                "illegal ipv6 netmask {n}: an IPv6 service persists per a prefix length, 1..128"
            ),
            ServiceError::PersistenceMaskFamily { service } if service.is_ipv6() => write!(
                f,
                "{service} is an IPv6 service: its persistence netmask is a prefix length \
                 (-M 64), not a dotted netmask"
            ),
            ServiceError::PersistenceMaskFamily { service } => write!(
                f,
                "{service} is an IPv4 service: its persistence netmask is dotted \
                 (-M 255.255.255.0), not a prefix length"
            ),
            ServiceError::IdsExhausted => f.write_str("no service ids left"),
            ServiceError::ServerAddressesExhausted { ip, limit } => write!(
                f,
                "real server address {ip}: the workers' neighbour tables are sized for {limit} \
                 distinct {} real and sorry server addresses, all in use (three quarters of \
                 [sessions] neighbours; raise it, a restart)",
                if ip.is_ipv6() { "IPv6" } else { "IPv4" }
            ),
            ServiceError::MaglevTableTooSmall {
                service,
                slots,
                servers,
            } => write!(
                f,
                "{service}: an mh table of {slots} slots cannot hold {servers} real servers \
                 (each needs a slot; mh_table_size is a prime, 65537 by default, and spreads \
                 weights finely only when it is many times the number of real servers)"
            ),
            ServiceError::ServerIdsExhausted { limit } => write!(
                f,
                "too many real servers: at most {} real and sorry servers at once, counting \
                 removed ones until their last session ends",
                limit - 1
            ),
            ServiceError::LocalAddressExists { service, ip } => {
                write!(f, "Local address already exists: {ip} in {service}")
            }
            ServiceError::NoSuchLocalAddress { service, ip } => {
                write!(f, "No such local address: {ip} in {service}")
            }
            ServiceError::TooManyLocalAddresses(service) => write!(
                f,
                "Too many local addresses: {service} already has {MAX_LOCAL_ADDRESSES}"
            ),
            ServiceError::BadLocalAddress { ip, why } => {
                write!(f, "invalid local address {ip}: {why}")
            }
            ServiceError::VipIsRealServer { ip, role, holder } => write!(
                f,
                "address {ip} is already {role} of {holder}; a VIP cannot also be a real server (Sluice would send the traffic to itself)"
            ),
            ServiceError::LoopbackRealServer { what, addr } => write!(
                f,
                "invalid {what} address {addr}: a loopback address (Sluice has no local delivery; a real server is a host on one of its links)"
            ),
            ServiceError::AddressConflict { ip, role, holder } => write!(
                f,
                "address {ip} is already {role} of {holder}; a local address cannot also be a VIP or a real server"
            ),
            ServiceError::ToaNeedsTcp(service) => write!(
                f,
                "TOA is a TCP option: it cannot be enabled on {service}"
            ),
            ServiceError::SynProxyNeedsTcp(service) => write!(
                f,
                "the SYN proxy answers TCP handshakes: it cannot be enabled on {service}"
            ),
            ServiceError::SynProxyNeedsNat {
                service,
                ip,
                port,
                mode,
            } => write!(
                f,
                "the SYN proxy needs nat or fullnat: real server {} of {service} is {}, \
                 whose replies bypass Sluice",
                std::net::SocketAddr::new(*ip, *port),
                mode.name()
            ),
            ServiceError::SloppyNeedsTcp(service) => write!(
                f,
                "sloppy_tcp opens sessions from TCP segments that are not SYNs: it cannot be \
                 enabled on {service}, a UDP service opens them from any datagram"
            ),
            ServiceError::SloppyNotFullNat { service, ip, port } => write!(
                f,
                "sloppy_tcp cannot serve fullnat real server {} of {service}: a session opened \
                 mid-connection would reach it from a new local port, a connection it never saw",
                std::net::SocketAddr::new(*ip, *port)
            ),
            ServiceError::SloppyWithSynProxy(service) => write!(
                f,
                "sloppy_tcp and the SYN proxy exclude each other on {service}: the SYN proxy \
                 opens connections only from a cookie ACK"
            ),
            ServiceError::SynProxyRateZero => {
                f.write_str("synproxy auto SYN rate must be at least 1 per second")
            }
            ServiceError::SynProxyRetries(n) => write!(
                f,
                "synproxy SYN retries {n} is out of range (0..={})",
                crate::model::MAX_SYNPROXY_SYN_RETRIES
            ),
            ServiceError::SchedulerParams(reason) => f.write_str(reason),
            ServiceError::FamilyMismatch { service, what, ip } => write!(
                f,
                "{what} {ip} is not of the address family of {service}; \
                 only FullNAT (NAT64) takes IPv4 real servers behind an IPv6 service"
            ),
            ServiceError::Ipv6Unsupported { service, what } => {
                write!(f, "{what} is not supported on IPv6 services yet ({service})")
            }
            ServiceError::SorryIsRealServer { service, ip, port } => write!(
                f,
                "{} is both a real server and the sorry server of {service}",
                std::net::SocketAddr::new(*ip, *port)
            ),
        }
    }
}

impl std::error::Error for ServiceError {}

/// The registry of virtual services.
///
/// Keep one table for the life of the process and apply config reloads as edits to it:
/// ids come from this table's counters, which is what makes them unique and stable.
#[derive(Clone, Debug)]
pub struct ServiceTable {
    /// Ordered by key (protocol, VIP, port): listings are stable and do not depend on
    /// the order commands were issued in.
    services: BTreeMap<ServiceKey, Service>,
    next_service_id: u32,
    next_server_id: u32,
    /// Real-server ids stay below this ([`ServiceTable::set_server_id_limit`]).
    server_id_limit: u32,
    /// Distinct real and sorry server addresses of one family the table takes
    /// ([`ServiceTable::set_server_address_limit`]), and how many it holds (the keys
    /// of `server_uses`), IPv4 then IPv6.
    server_address_limit: usize,
    server_addresses: [usize; 2],
    /// Ids of real and sorry servers removed since [`ServiceTable::take_removed_server_ids`]
    /// last gave them out.
    removed_server_ids: Vec<u32>,
    /// Ids removed and given out, not yet released: held until their owner says no
    /// session or template refers to them any more.
    unreleased_server_ids: HashSet<u32>,
    /// Ids released ([`ServiceTable::release_server_id`]), handed out again oldest
    /// first once no fresh id is left.
    free_server_ids: VecDeque<u32>,
    /// Bumped by every successful change; a natural snapshot generation.
    version: u64,
    /// The appliance's own (port) addresses, which no service may use.
    own_addresses: Vec<IpAddr>,
    /// How many services use each address as a VIP, a real server or a local address,
    /// so the role checks cost O(1) with 100k services (a restore adds them all).
    vip_uses: HashMap<IpAddr, u32>,
    server_uses: HashMap<IpAddr, u32>,
    local_address_uses: HashMap<IpAddr, u32>,
    /// Access lists and rate limits, of the services that have any.
    admission: HashMap<ServiceKey, AdmissionRules>,
    /// Workers the admission counts and rates are kept for.
    workers: usize,
    /// Compiled admission rules replaced or removed, kept until no snapshot a worker
    /// may hold uses them: a 100k-prefix list is then freed here, on the management
    /// core, not by the worker that lets go of the last snapshot holding it (which
    /// would stall that worker for milliseconds).
    retired_admission: Vec<Arc<Admission>>,
}

/// Counts one more (`up`) or one less use of `ip` in `uses`.
fn count_use(uses: &mut HashMap<IpAddr, u32>, ip: IpAddr, up: bool) {
    if up {
        *uses.entry(ip).or_insert(0) += 1;
    } else if let Some(count) = uses.get_mut(&ip) {
        *count -= 1;
        if *count == 0 {
            uses.remove(&ip);
        }
    }
}

impl Default for ServiceTable {
    fn default() -> Self {
        Self::new()
    }
}

impl ServiceTable {
    pub fn new() -> Self {
        ServiceTable {
            services: BTreeMap::new(),
            next_service_id: 1,
            next_server_id: 1,
            server_id_limit: MAX_REAL_SERVER_IDS as u32,
            server_address_limit: usize::MAX,
            server_addresses: [0, 0],
            removed_server_ids: Vec::new(),
            unreleased_server_ids: HashSet::new(),
            free_server_ids: VecDeque::new(),
            version: 0,
            own_addresses: Vec::new(),
            vip_uses: HashMap::new(),
            server_uses: HashMap::new(),
            local_address_uses: HashMap::new(),
            admission: HashMap::new(),
            workers: 1,
            retired_admission: Vec::new(),
        }
    }

    /// An empty table with this one's own addresses (and fresh ids): where a batch
    /// that replaces the whole table is built and checked before it is applied.
    pub fn empty_like(&self) -> ServiceTable {
        let mut table = ServiceTable::new();
        table.own_addresses = self.own_addresses.clone();
        table.workers = self.workers;
        table
    }

    /// The appliance's own (port) addresses: refused from now on as a VIP, a real
    /// server or a local address. Services already in the table are not re-checked.
    pub fn set_own_addresses(&mut self, addresses: Vec<IpAddr>) {
        self.own_addresses = addresses;
    }

    fn check_not_own(&self, what: &'static str, addr: IpAddr) -> Result<(), ServiceError> {
        if self.own_addresses.contains(&addr) {
            return Err(ServiceError::OwnAddress { what, addr });
        }
        Ok(())
    }

    /// A real server or sorry server at `ip` must not be a VIP of the table.
    fn check_not_vip(&self, ip: IpAddr) -> Result<(), ServiceError> {
        if !self.vip_uses.contains_key(&ip) {
            return Ok(());
        }
        match self.services.values().find(|s| s.key.vip == ip) {
            Some(holder) => Err(ServiceError::VipIsRealServer {
                ip,
                role: "the VIP",
                holder: holder.key,
            }),
            None => Ok(()),
        }
    }

    /// A VIP must not be a real server or sorry server of the table.
    fn check_not_real_server(&self, vip: IpAddr) -> Result<(), ServiceError> {
        if !self.server_uses.contains_key(&vip) {
            return Ok(());
        }
        let holder = self.services.values().find(|s| {
            s.real_servers.iter().any(|r| r.ip == vip)
                || s.sorry_server.is_some_and(|r| r.ip == vip)
        });
        match holder {
            Some(holder) => Err(ServiceError::VipIsRealServer {
                ip: vip,
                role: "a real server",
                holder: holder.key,
            }),
            None => Ok(()),
        }
    }

    /// `ipvsadm -A`. Returns the new service's id.
    pub fn add_service(
        &mut self,
        key: ServiceKey,
        scheduler: SchedulerKind,
        persistence: Option<Persistence>,
    ) -> Result<u32, ServiceError> {
        if self.services.contains_key(&key) {
            return Err(ServiceError::ServiceExists(key));
        }
        validate_service(&key, persistence.as_ref())?;
        self.check_not_own("VIP", key.vip)?;
        self.check_not_real_server(key.vip)?;
        self.check_not_local_address(key.vip)?;
        let id = take_id(&mut self.next_service_id)?;
        count_use(&mut self.vip_uses, key.vip, true);
        self.services.insert(
            key,
            Service {
                id,
                key,
                scheduler,
                persistence,
                real_servers: Vec::new(),
                local_addresses: Vec::new(),
                toa: false,
                sched_flags: SchedFlags::default(),
                mh_table_size: crate::model::MH_DEFAULT_TABLE_SIZE,
                synproxy: crate::model::SynProxy::default(),
                sorry_server: None,
                sloppy_tcp: false,
            },
        );
        self.version += 1;
        Ok(id)
    }

    /// `ipvsadm -E`: change the scheduler and persistence; id and real servers stay.
    pub fn edit_service(
        &mut self,
        key: ServiceKey,
        scheduler: SchedulerKind,
        persistence: Option<Persistence>,
    ) -> Result<(), ServiceError> {
        validate_service(&key, persistence.as_ref())?;
        let service = self
            .services
            .get_mut(&key)
            .ok_or(ServiceError::NoSuchService(key))?;
        check_maglev_room(
            key,
            scheduler,
            service.mh_table_size,
            service.real_servers.len(),
        )?;
        service.scheduler = scheduler;
        service.persistence = persistence;
        self.version += 1;
        Ok(())
    }

    /// `ipvsadm -D`. Returns the removed service.
    pub fn delete_service(&mut self, key: ServiceKey) -> Result<Service, ServiceError> {
        let removed = self
            .services
            .remove(&key)
            .ok_or(ServiceError::NoSuchService(key))?;
        count_use(&mut self.vip_uses, key.vip, false);
        for server in &removed.real_servers {
            self.count_server_address(server.ip, false);
            self.removed_server_ids.push(server.id);
        }
        if let Some(sorry) = removed.sorry_server {
            self.count_server_address(sorry.ip, false);
            self.removed_server_ids.push(sorry.id);
        }
        for &ip in &removed.local_addresses {
            count_use(&mut self.local_address_uses, ip, false);
        }
        if let Some(rules) = self.admission.remove(&key) {
            self.retired_admission.extend(rules.into_compiled());
        }
        self.version += 1;
        Ok(removed)
    }

    /// `ipvsadm -a`. The server goes to the end of the service's list. Returns its id.
    ///
    /// A FullNAT server may be added to a service that has no local address yet (as
    /// in DPVS, where `--add-laddr` often follows `-a`), but new FullNAT sessions to
    /// it are refused until the service has one. Its address may not be a local
    /// address of any service.
    pub fn add_server(
        &mut self,
        key: ServiceKey,
        spec: RealServerSpec,
    ) -> Result<u32, ServiceError> {
        let service = self
            .services
            .get(&key)
            .ok_or(ServiceError::NoSuchService(key))?;
        if service.server_index(spec.ip, spec.port).is_some() {
            return Err(ServiceError::DestinationExists {
                service: key,
                ip: spec.ip,
                port: spec.port,
            });
        }
        if service
            .sorry_server
            .is_some_and(|s| (s.ip, s.port) == (spec.ip, spec.port))
        {
            return Err(ServiceError::SorryIsRealServer {
                service: key,
                ip: spec.ip,
                port: spec.port,
            });
        }
        validate_server(&key, &spec)?;
        check_synproxy_mode(service, &spec)?;
        check_sloppy_mode(service, &spec)?;
        check_maglev_room(
            key,
            service.scheduler,
            service.mh_table_size,
            service.real_servers.len() + 1,
        )?;
        self.check_not_own("real server", spec.ip)?;
        self.check_not_vip(spec.ip)?;
        self.check_not_local_address(spec.ip)?;
        self.check_server_address_room(spec.ip)?;
        let id = self.take_server_id()?;
        let service = self.services.get_mut(&key).expect("looked up above");
        service.real_servers.push(real_server(id, &spec));
        self.count_server_address(spec.ip, true);
        self.version += 1;
        Ok(id)
    }

    /// `ipvsadm -e`: the server is identified by `spec.ip:spec.port`; weight, mode and
    /// thresholds change, its id and position stay.
    pub fn edit_server(
        &mut self,
        key: ServiceKey,
        spec: RealServerSpec,
    ) -> Result<(), ServiceError> {
        let service = self
            .services
            .get_mut(&key)
            .ok_or(ServiceError::NoSuchService(key))?;
        let index =
            service
                .server_index(spec.ip, spec.port)
                .ok_or(ServiceError::NoSuchDestination {
                    service: key,
                    ip: spec.ip,
                    port: spec.port,
                })?;
        validate_server(&key, &spec)?;
        check_synproxy_mode(service, &spec)?;
        check_sloppy_mode(service, &spec)?;
        let server = &mut service.real_servers[index];
        *server = real_server(server.id, &spec);
        self.version += 1;
        Ok(())
    }

    /// `ipvsadm -d`. Returns the removed server; the others keep their order.
    pub fn delete_server(
        &mut self,
        key: ServiceKey,
        ip: IpAddr,
        port: u16,
    ) -> Result<RealServer, ServiceError> {
        let service = self
            .services
            .get_mut(&key)
            .ok_or(ServiceError::NoSuchService(key))?;
        let index = service
            .server_index(ip, port)
            .ok_or(ServiceError::NoSuchDestination {
                service: key,
                ip,
                port,
            })?;
        let removed = service.real_servers.remove(index);
        self.count_server_address(ip, false);
        self.removed_server_ids.push(removed.id);
        self.version += 1;
        Ok(removed)
    }

    /// `ipvsadm --add-laddr` (DPVS): adds a FullNAT local address to the end of the
    /// service's list. The address must be unicast, not loopback, not already in this
    /// service, and neither a VIP nor a real server of any service. The same local
    /// address may serve several services, as in DPVS.
    pub fn add_laddr(&mut self, key: ServiceKey, ip: IpAddr) -> Result<(), ServiceError> {
        let service = self
            .services
            .get(&key)
            .ok_or(ServiceError::NoSuchService(key))?;
        if service.has_local_address(ip) {
            return Err(ServiceError::LocalAddressExists { service: key, ip });
        }
        if service.local_addresses.len() >= MAX_LOCAL_ADDRESSES {
            return Err(ServiceError::TooManyLocalAddresses(key));
        }
        validate_local_address(ip)?;
        // NAT64: IPv4 local addresses on an IPv6 service, towards IPv4 real servers.
        if ip.is_ipv6() && !key.is_ipv6() {
            return Err(ServiceError::FamilyMismatch {
                service: key,
                what: "local address",
                ip,
            });
        }
        if self.own_addresses.contains(&ip) {
            return Err(ServiceError::BadLocalAddress {
                ip,
                why: "it is one of the appliance's own port addresses",
            });
        }
        let conflict = self.vip_uses.contains_key(&ip) || self.server_uses.contains_key(&ip);
        if conflict {
            for other in self.services.values() {
                let role = if other.key.vip == ip {
                    "the VIP"
                } else if other.real_servers.iter().any(|rs| rs.ip == ip) {
                    "a real server"
                } else if other.sorry_server.is_some_and(|rs| rs.ip == ip) {
                    "the sorry server"
                } else {
                    continue;
                };
                return Err(ServiceError::AddressConflict {
                    ip,
                    role,
                    holder: other.key,
                });
            }
        }
        let service = self.services.get_mut(&key).expect("looked up above");
        service.local_addresses.push(ip);
        count_use(&mut self.local_address_uses, ip, true);
        self.version += 1;
        Ok(())
    }

    /// `ipvsadm --del-laddr` (DPVS). The other addresses keep their order. Removing
    /// the last one is allowed even with FullNAT real servers: new FullNAT sessions
    /// are then refused until a local address is added again; existing sessions keep
    /// the address they have until they end.
    pub fn del_laddr(&mut self, key: ServiceKey, ip: IpAddr) -> Result<(), ServiceError> {
        let service = self
            .services
            .get_mut(&key)
            .ok_or(ServiceError::NoSuchService(key))?;
        let index = service
            .local_addresses
            .iter()
            .position(|&a| a == ip)
            .ok_or(ServiceError::NoSuchLocalAddress { service: key, ip })?;
        service.local_addresses.remove(index);
        count_use(&mut self.local_address_uses, ip, false);
        self.version += 1;
        Ok(())
    }

    /// `ipvsadm --get-laddr` (DPVS): the service's local addresses, in the order they
    /// were added.
    pub fn laddrs(&self, key: ServiceKey) -> Result<&[IpAddr], ServiceError> {
        self.services
            .get(&key)
            .map(|s| s.local_addresses.as_slice())
            .ok_or(ServiceError::NoSuchService(key))
    }

    /// Turns TOA (the client address as a TCP option in FullNAT sessions) on or off.
    /// Only TCP services can turn it on; turning it off is always allowed.
    pub fn set_toa(&mut self, key: ServiceKey, toa: bool) -> Result<(), ServiceError> {
        let service = self
            .services
            .get_mut(&key)
            .ok_or(ServiceError::NoSuchService(key))?;
        if toa && key.proto != Protocol::Tcp {
            return Err(ServiceError::ToaNeedsTcp(key));
        }
        if toa && key.is_ipv6() {
            return Err(ServiceError::Ipv6Unsupported {
                service: key,
                what: "TOA",
            });
        }
        service.toa = toa;
        self.version += 1;
        Ok(())
    }

    /// Sets or removes (`None`) the sorry server of a service. It meets the rules of a
    /// real server of the service and may not be one of them. The same address, port
    /// and mode keep their id (and so their counters and sessions). Nothing changes on
    /// error.
    pub fn set_sorry_server(
        &mut self,
        key: ServiceKey,
        spec: Option<SorryServerSpec>,
    ) -> Result<(), ServiceError> {
        let service = self
            .services
            .get(&key)
            .ok_or(ServiceError::NoSuchService(key))?;
        let old = service.sorry_server;
        let new = match spec {
            None => None,
            Some(spec) => {
                if service.server_index(spec.ip, spec.port).is_some() {
                    return Err(ServiceError::SorryIsRealServer {
                        service: key,
                        ip: spec.ip,
                        port: spec.port,
                    });
                }
                let as_rs = RealServerSpec::new(spec.ip, spec.port, 1, spec.mode);
                validate_server(&key, &as_rs)?;
                check_synproxy_mode(service, &as_rs)?;
                check_sloppy_mode(service, &as_rs)?;
                self.check_not_own("sorry server", spec.ip)?;
                self.check_not_vip(spec.ip)?;
                self.check_not_local_address(spec.ip)?;
                // The old sorry server's address goes if nothing else uses it.
                let frees_its_family = old.is_some_and(|o| {
                    o.ip != spec.ip
                        && o.ip.is_ipv6() == spec.ip.is_ipv6()
                        && self.server_uses.get(&o.ip) == Some(&1)
                });
                if !frees_its_family {
                    self.check_server_address_room(spec.ip)?;
                }
                let id = match old {
                    Some(o) if (o.ip, o.port, o.mode) == (spec.ip, spec.port, spec.mode) => o.id,
                    _ => self.take_server_id()?,
                };
                Some(SorryServer {
                    id,
                    ip: spec.ip,
                    port: spec.port,
                    mode: spec.mode,
                    inhibit: spec.inhibit,
                })
            }
        };
        if let Some(o) = old {
            self.count_server_address(o.ip, false);
            if new.is_none_or(|n| n.id != o.id) {
                self.removed_server_ids.push(o.id);
            }
        }
        if let Some(n) = new {
            self.count_server_address(n.ip, true);
        }
        self.services
            .get_mut(&key)
            .expect("looked up above")
            .sorry_server = new;
        self.version += 1;
        Ok(())
    }

    /// Turns `sloppy_tcp` on or off: a TCP service only, none of whose real servers
    /// (sorry server included) is FullNAT. Turning it off is always allowed.
    pub fn set_sloppy_tcp(&mut self, key: ServiceKey, on: bool) -> Result<(), ServiceError> {
        let service = self
            .services
            .get_mut(&key)
            .ok_or(ServiceError::NoSuchService(key))?;
        if on {
            if key.proto != Protocol::Tcp {
                return Err(ServiceError::SloppyNeedsTcp(key));
            }
            if service.synproxy.mode != SynProxyMode::Off {
                return Err(ServiceError::SloppyWithSynProxy(key));
            }
            let sorry = service.sorry_server.map(|s| s.as_real_server(false));
            if let Some(rs) = service
                .real_servers
                .iter()
                .chain(sorry.iter())
                .find(|rs| rs.mode == ForwardMode::FullNat)
            {
                return Err(ServiceError::SloppyNotFullNat {
                    service: key,
                    ip: rs.ip,
                    port: rs.port,
                });
            }
        }
        service.sloppy_tcp = on;
        self.version += 1;
        Ok(())
    }

    /// Sets the SYN proxy of a service. Turning it on (or auto) needs TCP and every
    /// real server in NAT or FullNAT mode; turning it off is always allowed. Nothing
    /// changes on error.
    pub fn set_synproxy(
        &mut self,
        key: ServiceKey,
        synproxy: SynProxy,
    ) -> Result<(), ServiceError> {
        let service = self
            .services
            .get_mut(&key)
            .ok_or(ServiceError::NoSuchService(key))?;
        if synproxy.mode != SynProxyMode::Off {
            if key.proto != Protocol::Tcp {
                return Err(ServiceError::SynProxyNeedsTcp(key));
            }
            if synproxy.auto_syn_rate == 0 {
                return Err(ServiceError::SynProxyRateZero);
            }
            if synproxy.syn_retries > crate::model::MAX_SYNPROXY_SYN_RETRIES {
                return Err(ServiceError::SynProxyRetries(synproxy.syn_retries));
            }
            if service.sloppy_tcp {
                return Err(ServiceError::SloppyWithSynProxy(key));
            }
            if key.is_ipv6() {
                return Err(ServiceError::Ipv6Unsupported {
                    service: key,
                    what: "the SYN proxy",
                });
            }
            let sorry = service.sorry_server.map(|s| s.as_real_server(false));
            if let Some(rs) = service
                .real_servers
                .iter()
                .chain(sorry.iter())
                .find(|rs| !rs.mode.rewrites_replies())
            {
                return Err(ServiceError::SynProxyNeedsNat {
                    service: key,
                    ip: rs.ip,
                    port: rs.port,
                    mode: rs.mode,
                });
            }
        }
        service.synproxy = synproxy;
        self.version += 1;
        Ok(())
    }

    /// Sets the scheduler flags (`-b`) and, for mh, the Maglev table size. Both are
    /// checked against the service's scheduler; nothing changes on error.
    pub fn set_sched_params(
        &mut self,
        key: ServiceKey,
        flags: SchedFlags,
        mh_table_size: Option<u32>,
    ) -> Result<(), ServiceError> {
        let service = self
            .services
            .get_mut(&key)
            .ok_or(ServiceError::NoSuchService(key))?;
        flags
            .check_compatible(service.scheduler)
            .map_err(ServiceError::SchedulerParams)?;
        let size = mh_table_size.unwrap_or(service.mh_table_size);
        crate::sched::mh::check_table_size(size)
            .map_err(|e| ServiceError::SchedulerParams(format!("mh table size: {e}")))?;
        check_maglev_room(key, service.scheduler, size, service.real_servers.len())?;
        service.sched_flags = flags;
        service.mh_table_size = size;
        self.version += 1;
        Ok(())
    }

    /// Refuses `ip` as a new VIP or real server if some service uses it as a local
    /// address.
    fn check_not_local_address(&self, ip: IpAddr) -> Result<(), ServiceError> {
        if !self.local_address_uses.contains_key(&ip) {
            return Ok(());
        }
        match self.services.values().find(|s| s.has_local_address(ip)) {
            Some(holder) => Err(ServiceError::AddressConflict {
                ip,
                role: "a local address",
                holder: holder.key,
            }),
            None => Ok(()),
        }
    }

    /// `ipvsadm -C`. Id counters are not reset: service ids are never reused within a
    /// run, and real-server ids only once released.
    pub fn clear(&mut self) {
        for s in self.services.values() {
            let sorry = s.sorry_server.map(|r| r.id);
            let ids = s.real_servers.iter().map(|r| r.id).chain(sorry);
            self.removed_server_ids.extend(ids);
        }
        self.services.clear();
        self.vip_uses.clear();
        self.server_uses.clear();
        self.server_addresses = [0, 0];
        self.local_address_uses.clear();
        for (_, rules) in self.admission.drain() {
            self.retired_admission.extend(rules.into_compiled());
        }
        self.version += 1;
    }

    /// At most `limit` distinct real and sorry server addresses of each family: every
    /// worker keeps a neighbour entry for each. Set before any server is added.
    pub fn set_server_address_limit(&mut self, limit: usize) {
        self.server_address_limit = limit;
    }

    /// Refuses a real or sorry server at `ip` when it would be one distinct address
    /// of its family too many.
    fn check_server_address_room(&self, ip: IpAddr) -> Result<(), ServiceError> {
        let family = usize::from(ip.is_ipv6());
        if self.server_uses.contains_key(&ip)
            || self.server_addresses[family] < self.server_address_limit
        {
            return Ok(());
        }
        Err(ServiceError::ServerAddressesExhausted {
            ip,
            limit: self.server_address_limit,
        })
    }

    /// One more (`up`) or one less real or sorry server at `ip`.
    fn count_server_address(&mut self, ip: IpAddr, up: bool) {
        let before = self.server_uses.len();
        count_use(&mut self.server_uses, ip, up);
        let family = usize::from(ip.is_ipv6());
        match self.server_uses.len().cmp(&before) {
            std::cmp::Ordering::Greater => self.server_addresses[family] += 1,
            std::cmp::Ordering::Less => self.server_addresses[family] -= 1,
            std::cmp::Ordering::Equal => {}
        }
    }

    /// Real-server ids stay below `limit` (the workers count each real server in a
    /// slot of a fixed array indexed by its id), and never reach
    /// [`MAX_REAL_SERVER_IDS`], the default; set before any server is added.
    pub fn set_server_id_limit(&mut self, limit: u32) {
        self.server_id_limit = limit.min(MAX_REAL_SERVER_IDS as u32);
    }

    /// A real-server id: a fresh one while any is left below the limit, so a removed
    /// server's id waits as long as it can before it is used again; then the oldest
    /// released one.
    fn take_server_id(&mut self) -> Result<u32, ServiceError> {
        if self.next_server_id < self.server_id_limit {
            return take_id(&mut self.next_server_id);
        }
        self.free_server_ids
            .pop_front()
            .ok_or(ServiceError::ServerIdsExhausted {
                limit: self.server_id_limit,
            })
    }

    /// The ids of the real and sorry servers removed since the last call (`-d`, `-D`,
    /// `-C`, a sorry server replaced): their owner releases each one
    /// ([`ServiceTable::release_server_id`]) once nothing refers to it any more.
    pub fn take_removed_server_ids(&mut self) -> Vec<u32> {
        let removed = std::mem::take(&mut self.removed_server_ids);
        self.unreleased_server_ids.extend(removed.iter().copied());
        removed
    }

    /// Ids of removed servers not released yet, given out or not.
    pub fn unreleased_server_ids(&self) -> usize {
        self.removed_server_ids.len() + self.unreleased_server_ids.len()
    }

    /// Makes removed server `id` available again. Only an id that
    /// [`ServiceTable::take_removed_server_ids`] gave out, and only once: any other id
    /// (one a server holds, one already released) is refused with `false`.
    pub fn release_server_id(&mut self, id: u32) -> bool {
        if !self.unreleased_server_ids.remove(&id) {
            return false;
        }
        self.free_server_ids.push_back(id);
        true
    }

    /// How many workers admission counts and rate limits are kept for (1 until set);
    /// set before any rule is added.
    pub fn set_workers(&mut self, workers: usize) {
        self.workers = workers.max(1);
    }

    /// A service's access-list rules and rate limit, when it has any.
    pub fn admission(&self, key: ServiceKey) -> Option<&AdmissionRules> {
        self.admission.get(&key)
    }

    /// Edits a service's admission rules with `edit`; nothing changes if it fails.
    fn edit_admission(
        &mut self,
        key: ServiceKey,
        edit: impl FnOnce(&mut AdmissionRules) -> Result<(), String>,
    ) -> Result<(), ServiceError> {
        if !self.services.contains_key(&key) {
            return Err(ServiceError::NoSuchService(key));
        }
        let workers = self.workers;
        let rules = self
            .admission
            .entry(key)
            .or_insert_with(|| AdmissionRules::new(workers));
        edit(rules).map_err(|why| ServiceError::Admission(key, why))?;
        self.version += 1;
        Ok(())
    }

    /// Adds access-list rules to a service (a prefix already listed takes `action`).
    pub fn acl_add(
        &mut self,
        key: ServiceKey,
        action: AclAction,
        prefixes: &[Prefix],
    ) -> Result<(), ServiceError> {
        // The rules match IPv4 clients only, and the IPv6 path does not consult them:
        // accepted, they would show in --acl-list and deny no one.
        if key.is_ipv6() {
            return Err(ServiceError::Ipv6Unsupported {
                service: key,
                what: "an access list",
            });
        }
        self.edit_admission(key, |r| r.add(action, prefixes))
    }

    /// Removes access-list rules; each prefix must be in the list.
    pub fn acl_del(&mut self, key: ServiceKey, prefixes: &[Prefix]) -> Result<(), ServiceError> {
        self.edit_admission(key, |r| r.remove(prefixes))
    }

    /// Empties a service's access list.
    pub fn acl_clear(&mut self, key: ServiceKey) -> Result<(), ServiceError> {
        self.edit_admission(key, |r| {
            r.clear_acl();
            Ok(())
        })
    }

    /// Sets or (`None`) removes a service's per-source rate limit.
    pub fn set_rate_limit(
        &mut self,
        key: ServiceKey,
        limit: Option<RateLimit>,
    ) -> Result<(), ServiceError> {
        if limit.is_some() && key.is_ipv6() {
            return Err(ServiceError::Ipv6Unsupported {
                service: key,
                what: "a per-source rate limit",
            });
        }
        self.edit_admission(key, |r| r.set_rate_limit(limit))
    }

    /// After a publish: the compiled rules the published ones replaced are retired,
    /// and retired ones no snapshot holds any more are freed (here).
    pub fn admission_published(&mut self) {
        for rules in self.admission.values_mut() {
            self.retired_admission.extend(rules.take_replaced());
        }
        self.retired_admission.retain(|a| Arc::strong_count(a) > 1);
    }

    /// `-Z`: zeroes every service's admission counts and access-list rule hits.
    pub fn zero_admission_counts(&self) {
        self.admission
            .values()
            .for_each(AdmissionRules::zero_counts);
    }

    /// Compiled admission rules waiting for the workers to let go of them.
    pub fn retired_admission(&self) -> usize {
        self.retired_admission.len()
    }

    /// All services, ordered by (protocol, VIP, port).
    pub fn services(&self) -> impl ExactSizeIterator<Item = &Service> + '_ {
        self.services.values()
    }

    pub fn get(&self, key: ServiceKey) -> Option<&Service> {
        self.services.get(&key)
    }

    pub fn len(&self) -> usize {
        self.services.len()
    }

    pub fn is_empty(&self) -> bool {
        self.services.is_empty()
    }

    /// Starts at 0 and grows with every successful change; failed operations leave it.
    pub fn version(&self) -> u64 {
        self.version
    }
}

fn take_id(counter: &mut u32) -> Result<u32, ServiceError> {
    let id = *counter;
    *counter = id.checked_add(1).ok_or(ServiceError::IdsExhausted)?;
    Ok(id)
}

fn real_server(id: u32, spec: &RealServerSpec) -> RealServer {
    RealServer {
        id,
        ip: spec.ip,
        port: spec.port,
        weight: spec.weight,
        mode: spec.mode,
        upper: spec.upper,
        lower: spec.lower,
    }
}

/// An address packets can be sent to: not unspecified, broadcast or multicast, and
/// for IPv4 not in 0.0.0.0/8 ("this network", a source only: RFC 1122 3.2.1.3, where a
/// digits-only host name such as `8080` lands, 0.0.31.144, through `inet_aton`).
fn is_unicast(addr: IpAddr) -> bool {
    match addr {
        IpAddr::V4(a) => !(a.octets()[0] == 0 || a.is_broadcast() || a.is_multicast()),
        IpAddr::V6(a) => !(a.is_unspecified() || a.is_multicast()),
    }
}

/// A FullNAT local address is the source of packets to real servers, which must be
/// able to reply to it.
fn validate_local_address(ip: IpAddr) -> Result<(), ServiceError> {
    let why = if !is_unicast(ip) {
        "not a unicast address"
    } else if ip.is_loopback() {
        "a loopback address"
    } else {
        return Ok(());
    };
    Err(ServiceError::BadLocalAddress { ip, why })
}

/// The rules every service meets, from the config or a command: a unicast VIP not on
/// loopback, a real port, a persistence timeout of 1 s to 31 days with a contiguous
/// netmask.
pub fn validate_service(
    key: &ServiceKey,
    persistence: Option<&Persistence>,
) -> Result<(), ServiceError> {
    if !is_unicast(key.vip) {
        return Err(ServiceError::NotUnicast {
            what: "virtual service",
            addr: key.vip,
        });
    }
    if key.vip.to_canonical().is_loopback() {
        return Err(ServiceError::LoopbackVip(key.vip));
    }
    if key.port == 0 {
        return Err(ServiceError::ZeroPort(*key));
    }
    let family = |service| ServiceError::PersistenceMaskFamily { service };
    match persistence {
        None => Ok(()),
        Some(p) if p.timeout_s == 0 => Err(ServiceError::PersistenceTimeoutZero),
        Some(p) if p.timeout_s > MAX_PERSISTENCE_TIMEOUT_S => {
            Err(ServiceError::PersistenceTimeoutTooLong(p.timeout_s))
        }
        Some(p) if key.is_ipv6() && p.netmask != Ipv4Addr::BROADCAST => Err(family(*key)),
        Some(p) if key.is_ipv6() && !(1..=128).contains(&p.prefix6) => {
            Err(ServiceError::PersistencePrefixInvalid(p.prefix6))
        }
        Some(p) if !key.is_ipv6() && p.prefix6 != Persistence::FULL_PREFIX6 => Err(family(*key)),
        Some(p) if !p.netmask_is_contiguous() => {
            Err(ServiceError::PersistenceNetmaskInvalid(p.netmask))
        }
        Some(_) => Ok(()),
    }
}

/// A `sloppy_tcp` service takes no FullNAT real server.
fn check_sloppy_mode(service: &Service, spec: &RealServerSpec) -> Result<(), ServiceError> {
    if service.sloppy_tcp && spec.mode == ForwardMode::FullNat {
        return Err(ServiceError::SloppyNotFullNat {
            service: service.key,
            ip: spec.ip,
            port: spec.port,
        });
    }
    Ok(())
}

/// A service with the SYN proxy on (or auto) takes NAT and FullNAT real servers only.
fn check_synproxy_mode(service: &Service, spec: &RealServerSpec) -> Result<(), ServiceError> {
    if service.synproxy.mode != SynProxyMode::Off && !spec.mode.rewrites_replies() {
        return Err(ServiceError::SynProxyNeedsNat {
            service: service.key,
            ip: spec.ip,
            port: spec.port,
            mode: spec.mode,
        });
    }
    Ok(())
}

/// The forwarding modes the IPv6 data path has.
pub const IPV6_MODES: &[ForwardMode] = &[
    ForwardMode::Dr,
    ForwardMode::Nat,
    ForwardMode::Tun,
    ForwardMode::FullNat,
];

/// The rules every real server meets, from the config or a command: a unicast address,
/// a weight of 0 to [`MAX_WEIGHT`], a lower threshold not above the upper one (as IPVS,
/// even when the upper is 0), and the service's port unless NAT or FullNAT maps it.
pub fn validate_server(key: &ServiceKey, spec: &RealServerSpec) -> Result<(), ServiceError> {
    if !is_unicast(spec.ip) {
        return Err(ServiceError::NotUnicast {
            what: "real server",
            addr: spec.ip,
        });
    }
    if spec.ip.is_loopback() {
        return Err(ServiceError::LoopbackRealServer {
            what: "real server",
            addr: spec.ip,
        });
    }
    // NAT64 (FullNAT only): an IPv4 real server behind an IPv6 VIP.
    let nat64 = key.is_ipv6() && !spec.ip.is_ipv6() && spec.mode == ForwardMode::FullNat;
    if spec.ip.is_ipv6() != key.is_ipv6() && !nat64 {
        return Err(ServiceError::FamilyMismatch {
            service: *key,
            what: "real server",
            ip: spec.ip,
        });
    }
    if key.is_ipv6() && !IPV6_MODES.contains(&spec.mode) {
        return Err(ServiceError::Ipv6Unsupported {
            service: *key,
            what: spec.mode.name(),
        });
    }
    if spec.weight > MAX_WEIGHT {
        return Err(ServiceError::WeightOutOfRange(spec.weight));
    }
    if let Some(&t) = [spec.upper, spec.lower]
        .iter()
        .find(|&&t| t > MAX_CONN_THRESHOLD)
    {
        return Err(ServiceError::ThresholdOutOfRange(t));
    }
    // As IPVS: the check applies even with upper = 0 (no limit), where any lower
    // threshold would be meaningless.
    if spec.lower > spec.upper {
        return Err(ServiceError::ThresholdsInverted {
            upper: spec.upper,
            lower: spec.lower,
        });
    }
    if spec.port == 0 {
        return Err(ServiceError::ZeroServerPort {
            service_port: key.port,
        });
    }
    if spec.port != key.port {
        match spec.mode {
            ForwardMode::Dr | ForwardMode::Tun => {
                return Err(ServiceError::PortMappingNotAllowed {
                    mode: spec.mode,
                    service_port: key.port,
                    server_port: spec.port,
                })
            }
            ForwardMode::Nat | ForwardMode::FullNat if spec.port == 0 => {
                return Err(ServiceError::ZeroServerPort {
                    service_port: key.port,
                })
            }
            ForwardMode::Nat | ForwardMode::FullNat => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Protocol;

    const VIP: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 1);

    fn http() -> ServiceKey {
        ServiceKey::new(Protocol::Tcp, VIP, 80)
    }

    fn rs(last: u8, port: u16, weight: u32, mode: ForwardMode) -> RealServerSpec {
        RealServerSpec::new(Ipv4Addr::new(10, 0, 0, last), port, weight, mode)
    }

    fn table_with_http() -> ServiceTable {
        let mut table = ServiceTable::new();
        table.add_service(http(), SchedulerKind::Rr, None).unwrap();
        table
    }

    /// Runs `op`, expects it to fail with a message containing `text`, and checks the
    /// table is unchanged (content and version).
    fn assert_rejected(
        table: &mut ServiceTable,
        text: &str,
        op: impl FnOnce(&mut ServiceTable) -> Result<(), ServiceError>,
    ) {
        let before: Vec<Service> = table.services().cloned().collect();
        let version = table.version();
        let err = op(table).expect_err("operation should fail");
        let message = err.to_string();
        assert!(message.contains(text), "{message:?} lacks {text:?}");
        assert!(!message.contains('\n'), "{message:?}");
        assert_eq!(table.services().cloned().collect::<Vec<_>>(), before);
        assert_eq!(table.version(), version);
    }

    /// A real server (or sorry server) at a VIP of the table, a VIP at one of its
    /// real servers, and a real server at a loopback address are refused, naming
    /// why, and change nothing.
    #[test]
    fn real_servers_at_a_vip_or_a_loopback_address_are_refused() {
        let mut table = table_with_http();
        let other = ServiceKey::new(Protocol::Tcp, Ipv4Addr::new(198, 18, 1, 2), 80);
        table.add_service(other, SchedulerKind::Rr, None).unwrap();
        let at = |ip: IpAddr| RealServerSpec::new(ip, 80, 1, ForwardMode::Dr);
        for vip in [VIP, Ipv4Addr::new(198, 18, 1, 2)] {
            assert_rejected(&mut table, "a VIP cannot also be a real server", |t| {
                t.add_server(http(), at(vip.into())).map(drop)
            });
        }
        for lo in [
            IpAddr::from(Ipv4Addr::new(127, 0, 0, 1)),
            Ipv4Addr::new(127, 9, 9, 9).into(),
        ] {
            assert_rejected(&mut table, "a loopback address", |t| {
                t.add_server(http(), at(lo)).map(drop)
            });
        }
        let sorry = |ip: IpAddr| crate::model::SorryServerSpec {
            ip,
            port: 80,
            mode: ForwardMode::Dr,
            inhibit: false,
        };
        assert_rejected(&mut table, "a VIP cannot also be a real server", |t| {
            t.set_sorry_server(http(), Some(sorry(Ipv4Addr::new(198, 18, 1, 2).into())))
        });
        assert_rejected(&mut table, "a loopback address", |t| {
            t.set_sorry_server(http(), Some(sorry(Ipv4Addr::LOCALHOST.into())))
        });
        // The other way round: a VIP at a real server's or the sorry server's address.
        table
            .add_server(http(), rs(7, 80, 1, ForwardMode::Dr))
            .unwrap();
        table
            .set_sorry_server(other, Some(sorry(Ipv4Addr::new(10, 0, 0, 8).into())))
            .unwrap();
        for taken in [7, 8] {
            let key = ServiceKey::new(Protocol::Tcp, Ipv4Addr::new(10, 0, 0, taken), 443);
            assert_rejected(&mut table, "is already a real server of", |t| {
                t.add_service(key, SchedulerKind::Rr, None).map(drop)
            });
        }
        // Removed, the address is free for a VIP again.
        table
            .delete_server(http(), Ipv4Addr::new(10, 0, 0, 7).into(), 80)
            .unwrap();
        let key = ServiceKey::new(Protocol::Tcp, Ipv4Addr::new(10, 0, 0, 7), 443);
        table.add_service(key, SchedulerKind::Rr, None).unwrap();
    }

    #[test]
    fn add_get_and_list_services_in_key_order() {
        let mut table = ServiceTable::new();
        let udp = ServiceKey::new(Protocol::Udp, VIP, 53);
        let https = ServiceKey::new(Protocol::Tcp, VIP, 443);
        let low_vip = ServiceKey::new(Protocol::Tcp, Ipv4Addr::new(198, 18, 0, 9), 8080);
        for key in [udp, https, http(), low_vip] {
            table.add_service(key, SchedulerKind::Wrr, None).unwrap();
        }
        let keys: Vec<_> = table.services().map(|s| s.key).collect();
        assert_eq!(keys, vec![low_vip, http(), https, udp]);
        assert_eq!(table.len(), 4);
        let svc = table.get(https).unwrap();
        assert_eq!((svc.scheduler, svc.persistence), (SchedulerKind::Wrr, None));
        assert!(svc.real_servers.is_empty());
        assert!(table.get(ServiceKey::new(Protocol::Udp, VIP, 80)).is_none());
    }

    #[test]
    fn duplicate_service_is_rejected() {
        let mut table = table_with_http();
        assert_rejected(&mut table, "Service already exists", |t| {
            t.add_service(http(), SchedulerKind::Wrr, None).map(drop)
        });
    }

    #[test]
    fn missing_service_is_reported_by_every_operation() {
        let mut table = table_with_http();
        let other = ServiceKey::new(Protocol::Udp, VIP, 80);
        let spec = rs(1, 80, 1, ForwardMode::Dr);
        assert_rejected(&mut table, "No such service", |t| {
            t.edit_service(other, SchedulerKind::Wrr, None)
        });
        assert_rejected(&mut table, "No such service", |t| {
            t.delete_service(other).map(drop)
        });
        assert_rejected(&mut table, "No such service", |t| {
            t.add_server(other, spec).map(drop)
        });
        assert_rejected(&mut table, "No such service", |t| {
            t.edit_server(other, spec)
        });
        assert_rejected(&mut table, "No such service", |t| {
            t.delete_server(other, spec.ip, spec.port).map(drop)
        });
    }

    #[test]
    fn servers_are_added_in_order_edited_in_place_and_deleted() {
        let mut table = table_with_http();
        let a = table
            .add_server(http(), rs(1, 80, 3, ForwardMode::Dr))
            .unwrap();
        let b = table
            .add_server(http(), rs(2, 8080, 2, ForwardMode::Nat))
            .unwrap();
        let c = table
            .add_server(
                http(),
                rs(3, 80, 1, ForwardMode::Tun).with_thresholds(100, 10),
            )
            .unwrap();
        let ids = |t: &ServiceTable| -> Vec<u32> {
            t.get(http())
                .unwrap()
                .real_servers
                .iter()
                .map(|r| r.id)
                .collect()
        };
        assert_eq!(ids(&table), vec![a, b, c]);

        table
            .edit_server(http(), rs(2, 8080, 0, ForwardMode::FullNat))
            .unwrap();
        let edited = table.get(http()).unwrap().real_servers[1].clone();
        assert_eq!(
            (edited.id, edited.weight, edited.mode),
            (b, 0, ForwardMode::FullNat)
        );
        assert_eq!(ids(&table), vec![a, b, c], "edit keeps id and position");

        let removed = table
            .delete_server(http(), Ipv4Addr::new(10, 0, 0, 1).into(), 80)
            .unwrap();
        assert_eq!(removed.id, a);
        assert_eq!(ids(&table), vec![b, c]);
        let third = &table.get(http()).unwrap().real_servers[1];
        assert_eq!((third.upper, third.lower), (100, 10));
    }

    #[test]
    fn duplicate_and_missing_destinations_are_rejected() {
        let mut table = table_with_http();
        table
            .add_server(http(), rs(1, 80, 1, ForwardMode::Dr))
            .unwrap();
        assert_rejected(&mut table, "Destination already exists", |t| {
            t.add_server(http(), rs(1, 80, 5, ForwardMode::Dr))
                .map(drop)
        });
        assert_rejected(&mut table, "No such destination", |t| {
            t.edit_server(http(), rs(2, 80, 1, ForwardMode::Dr))
        });
        assert_rejected(&mut table, "No such destination", |t| {
            t.delete_server(http(), Ipv4Addr::new(10, 0, 0, 1).into(), 81)
                .map(drop)
        });
    }

    #[test]
    fn weight_range_is_0_to_65535_and_a_bad_edit_keeps_the_old_weight() {
        let mut table = table_with_http();
        table
            .add_server(http(), rs(1, 80, 0, ForwardMode::Dr))
            .unwrap();
        table
            .add_server(http(), rs(2, 80, MAX_WEIGHT, ForwardMode::Dr))
            .unwrap();
        assert_rejected(&mut table, "illegal weight specified: 65536", |t| {
            t.add_server(http(), rs(3, 80, 65536, ForwardMode::Dr))
                .map(drop)
        });
        assert_rejected(&mut table, "illegal weight", |t| {
            t.edit_server(http(), rs(2, 80, 1_000_000, ForwardMode::Dr))
        });
        assert_eq!(
            table.get(http()).unwrap().real_servers[1].weight,
            MAX_WEIGHT
        );
    }

    #[test]
    fn lower_threshold_may_not_exceed_upper() {
        let mut table = table_with_http();
        table
            .add_server(
                http(),
                rs(1, 80, 1, ForwardMode::Dr).with_thresholds(10, 10),
            )
            .unwrap();
        assert_rejected(
            &mut table,
            "lower threshold 11 is higher than upper threshold 10",
            |t| {
                t.add_server(
                    http(),
                    rs(2, 80, 1, ForwardMode::Dr).with_thresholds(10, 11),
                )
                .map(drop)
            },
        );
        assert_rejected(&mut table, "lower threshold", |t| {
            t.edit_server(http(), rs(1, 80, 1, ForwardMode::Dr).with_thresholds(0, 5))
        });
    }

    #[test]
    fn only_nat_and_fullnat_may_map_ports() {
        let mut table = table_with_http();
        for mode in [ForwardMode::Dr, ForwardMode::Tun] {
            assert_rejected(&mut table, "only nat and fullnat can map ports", |t| {
                t.add_server(http(), rs(1, 8080, 1, mode)).map(drop)
            });
        }
        table
            .add_server(http(), rs(1, 8080, 1, ForwardMode::Nat))
            .unwrap();
        table
            .add_server(http(), rs(2, 8081, 1, ForwardMode::FullNat))
            .unwrap();
        table
            .add_server(http(), rs(3, 80, 1, ForwardMode::Dr))
            .unwrap();
        table
            .add_server(http(), rs(4, 80, 1, ForwardMode::Tun))
            .unwrap();
        // Switching a port-mapped server to DR is the same violation.
        assert_rejected(&mut table, "dr forwarding keeps the port", |t| {
            t.edit_server(http(), rs(1, 8080, 1, ForwardMode::Dr))
        });
        assert_rejected(&mut table, "real server port 0 is not a port", |t| {
            t.add_server(http(), rs(5, 0, 1, ForwardMode::Nat))
                .map(drop)
        });
    }

    #[test]
    fn port_zero_services_are_refused_even_with_persistence() {
        let mut table = ServiceTable::new();
        let all_ports = ServiceKey::new(Protocol::Tcp, VIP, 0);
        for persistence in [None, Some(Persistence::new(300))] {
            assert_rejected(&mut table, "Zero port specified for service TCP", |t| {
                t.add_service(all_ports, SchedulerKind::Rr, persistence)
                    .map(drop)
            });
        }
    }

    #[test]
    fn own_addresses_are_refused_in_every_role() {
        let own = Ipv4Addr::new(198, 18, 0, 1);
        let mut table = table_with_http();
        table.set_own_addresses(vec![own.into()]);
        let mine = ServiceKey::new(Protocol::Tcp, own, 80);
        assert_rejected(
            &mut table,
            "VIP 198.18.0.1 is one of the appliance's own port addresses",
            |t| t.add_service(mine, SchedulerKind::Rr, None).map(drop),
        );
        let spec = RealServerSpec::new(own, 8080, 1, ForwardMode::Nat);
        assert_rejected(
            &mut table,
            "real server 198.18.0.1 is one of the appliance's own port addresses",
            |t| t.add_server(http(), spec).map(drop),
        );
        assert_rejected(&mut table, "own port addresses", |t| {
            t.add_laddr(http(), own.into())
        });
        // An empty table built for a replacing batch keeps the rule.
        let mut scratch = table.empty_like();
        assert!(scratch.add_service(mine, SchedulerKind::Rr, None).is_err());
    }

    #[test]
    fn role_indexes_follow_deletes_and_clear() {
        let mut table = table_with_http();
        let ip = Ipv4Addr::new(10, 0, 0, 1);
        table
            .add_server(http(), rs(1, 80, 1, ForwardMode::Dr))
            .unwrap();
        assert!(table.add_laddr(http(), ip.into()).is_err(), "a real server");
        table.delete_server(http(), ip.into(), 80).unwrap();
        table.add_laddr(http(), ip.into()).unwrap();
        assert!(table
            .add_server(http(), rs(1, 80, 1, ForwardMode::Dr))
            .is_err());
        table.delete_service(http()).unwrap();
        table.add_service(http(), SchedulerKind::Rr, None).unwrap();
        table
            .add_server(http(), rs(1, 80, 1, ForwardMode::Dr))
            .unwrap();
        table.clear();
        table.add_service(http(), SchedulerKind::Rr, None).unwrap();
        table.add_laddr(http(), ip.into()).unwrap();
    }

    #[test]
    fn persistence_is_validated() {
        let mut table = ServiceTable::new();
        assert_rejected(&mut table, "illegal timeout", |t| {
            t.add_service(http(), SchedulerKind::Rr, Some(Persistence::new(0)))
                .map(drop)
        });
        let holes = Persistence {
            netmask: Ipv4Addr::new(255, 0, 255, 0),
            ..Persistence::new(60)
        };
        assert_rejected(&mut table, "illegal persistent netmask 255.0.255.0", |t| {
            t.add_service(http(), SchedulerKind::Rr, Some(holes))
                .map(drop)
        });
    }

    #[test]
    fn addresses_must_be_unicast() {
        let mut table = ServiceTable::new();
        for vip in [
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::BROADCAST,
            Ipv4Addr::new(224, 0, 0, 1),
            Ipv4Addr::new(0, 0, 31, 144),
        ] {
            let key = ServiceKey::new(Protocol::Tcp, vip, 80);
            assert_rejected(&mut table, "not a unicast address", |t| {
                t.add_service(key, SchedulerKind::Rr, None).map(drop)
            });
        }
        // Nothing to a loopback address comes from the wire Sluice serves.
        for vip in [
            IpAddr::V4(Ipv4Addr::LOCALHOST),
            IpAddr::V4(Ipv4Addr::new(127, 1, 2, 3)),
            IpAddr::V6(std::net::Ipv6Addr::LOCALHOST),
            IpAddr::V6(Ipv4Addr::LOCALHOST.to_ipv6_mapped()),
        ] {
            let key = ServiceKey::new(Protocol::Tcp, vip, 80);
            assert_rejected(&mut table, "a loopback address", |t| {
                t.add_service(key, SchedulerKind::Rr, None).map(drop)
            });
        }
        table.add_service(http(), SchedulerKind::Rr, None).unwrap();
        for ip in [Ipv4Addr::UNSPECIFIED, Ipv4Addr::new(0, 0, 31, 144)] {
            let bad = RealServerSpec::new(ip, 80, 1, ForwardMode::Dr);
            assert_rejected(&mut table, "invalid real server address", |t| {
                t.add_server(http(), bad).map(drop)
            });
        }
    }

    #[test]
    fn edit_service_keeps_id_and_servers() {
        let mut table = table_with_http();
        let id = table.get(http()).unwrap().id;
        table
            .add_server(http(), rs(1, 80, 1, ForwardMode::Dr))
            .unwrap();
        let persistence = Some(Persistence {
            netmask: Ipv4Addr::new(255, 255, 255, 0),
            ..Persistence::new(600)
        });
        table
            .edit_service(http(), SchedulerKind::Wrr, persistence)
            .unwrap();
        let svc = table.get(http()).unwrap();
        assert_eq!(svc.id, id);
        assert_eq!(
            (svc.scheduler, svc.persistence),
            (SchedulerKind::Wrr, persistence)
        );
        assert_eq!(svc.real_servers.len(), 1);
    }

    #[test]
    fn ids_are_never_reused_even_after_delete_and_clear() {
        let mut table = ServiceTable::new();
        let mut service_ids = Vec::new();
        let mut server_ids = Vec::new();
        for round in 0..3 {
            service_ids.push(table.add_service(http(), SchedulerKind::Rr, None).unwrap());
            server_ids.push(
                table
                    .add_server(http(), rs(1, 80, 1, ForwardMode::Dr))
                    .unwrap(),
            );
            table
                .delete_server(http(), Ipv4Addr::new(10, 0, 0, 1).into(), 80)
                .unwrap();
            server_ids.push(
                table
                    .add_server(http(), rs(1, 80, 1, ForwardMode::Dr))
                    .unwrap(),
            );
            if round % 2 == 0 {
                table.delete_service(http()).unwrap();
            } else {
                table.clear();
            }
        }
        let unique = |ids: &[u32]| ids.iter().collect::<std::collections::HashSet<_>>().len();
        assert_eq!(unique(&service_ids), service_ids.len(), "{service_ids:?}");
        assert_eq!(unique(&server_ids), server_ids.len(), "{server_ids:?}");
        assert!(table.is_empty());
    }

    #[test]
    fn server_ids_are_unique_across_services() {
        let mut table = table_with_http();
        let other = ServiceKey::new(Protocol::Udp, VIP, 53);
        table.add_service(other, SchedulerKind::Rr, None).unwrap();
        let a = table
            .add_server(http(), rs(1, 80, 1, ForwardMode::Dr))
            .unwrap();
        let b = table
            .add_server(other, rs(1, 53, 1, ForwardMode::Dr))
            .unwrap();
        assert_ne!(a, b);
    }

    #[test]
    fn version_counts_successful_changes_only() {
        let mut table = ServiceTable::new();
        assert_eq!(table.version(), 0);
        table.add_service(http(), SchedulerKind::Rr, None).unwrap();
        table
            .add_server(http(), rs(1, 80, 1, ForwardMode::Dr))
            .unwrap();
        assert_eq!(table.version(), 2);
        let _ = table.add_server(http(), rs(1, 80, 1, ForwardMode::Dr));
        assert_eq!(table.version(), 2);
        table.clear();
        assert_eq!(table.version(), 3);
    }

    const LIP: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 50);

    #[test]
    fn local_addresses_are_added_in_order_listed_and_deleted() {
        let mut table = table_with_http();
        assert_eq!(table.laddrs(http()).unwrap(), &[] as &[Ipv4Addr]);
        let second = Ipv4Addr::new(198, 18, 0, 51);
        let third = Ipv4Addr::new(198, 18, 0, 49);
        for ip in [LIP, second, third] {
            table.add_laddr(http(), ip.into()).unwrap();
        }
        assert_eq!(table.laddrs(http()).unwrap(), &[LIP, second, third]);
        assert_eq!(table.version(), 4);
        table.del_laddr(http(), second.into()).unwrap();
        assert_eq!(table.laddrs(http()).unwrap(), &[LIP, third]);
        assert_eq!(table.get(http()).unwrap().local_addresses, vec![LIP, third]);
        // Another service may share a local address, as in DPVS.
        let udp = ServiceKey::new(Protocol::Udp, VIP, 53);
        table.add_service(udp, SchedulerKind::Rr, None).unwrap();
        table.add_laddr(udp, LIP.into()).unwrap();
        // Deleting a service takes its local addresses with it.
        let removed = table.delete_service(http()).unwrap();
        assert_eq!(removed.local_addresses, vec![LIP, third]);
        assert_eq!(table.laddrs(udp).unwrap(), &[LIP]);
    }

    #[test]
    fn local_address_errors_change_nothing() {
        let mut table = table_with_http();
        table.add_laddr(http(), LIP.into()).unwrap();
        let other = ServiceKey::new(Protocol::Udp, VIP, 80);
        assert_rejected(&mut table, "No such service: UDP 198.18.1.1:80", |t| {
            t.add_laddr(other, LIP.into())
        });
        assert_rejected(&mut table, "No such service", |t| {
            t.del_laddr(other, LIP.into())
        });
        assert_eq!(
            table.laddrs(other).unwrap_err(),
            ServiceError::NoSuchService(other)
        );
        assert_rejected(
            &mut table,
            "Local address already exists: 198.18.0.50 in TCP 198.18.1.1:80",
            |t| t.add_laddr(http(), LIP.into()),
        );
        assert_rejected(
            &mut table,
            "No such local address: 198.18.0.51 in TCP 198.18.1.1:80",
            |t| t.del_laddr(http(), Ipv4Addr::new(198, 18, 0, 51).into()),
        );
        for (ip, why) in [
            (Ipv4Addr::UNSPECIFIED, "not a unicast address"),
            (Ipv4Addr::BROADCAST, "not a unicast address"),
            (Ipv4Addr::new(239, 1, 1, 1), "not a unicast address"),
            (Ipv4Addr::new(127, 0, 0, 2), "a loopback address"),
        ] {
            assert_rejected(&mut table, why, |t| t.add_laddr(http(), ip.into()));
        }
    }

    #[test]
    fn at_most_64_local_addresses_per_service() {
        let mut table = table_with_http();
        for i in 0..MAX_LOCAL_ADDRESSES {
            table
                .add_laddr(http(), Ipv4Addr::new(198, 18, 2, i as u8 + 1).into())
                .unwrap();
        }
        assert_rejected(
            &mut table,
            "Too many local addresses: TCP 198.18.1.1:80 already has 64",
            |t| t.add_laddr(http(), Ipv4Addr::new(198, 18, 3, 1).into()),
        );
        // A duplicate is still named as such.
        assert_rejected(&mut table, "Local address already exists", |t| {
            t.add_laddr(http(), Ipv4Addr::new(198, 18, 2, 1).into())
        });
    }

    #[test]
    fn a_local_address_is_never_a_vip_or_a_real_server() {
        let mut table = table_with_http();
        let udp = ServiceKey::new(Protocol::Udp, Ipv4Addr::new(198, 18, 1, 2), 53);
        table.add_service(udp, SchedulerKind::Rr, None).unwrap();
        table
            .add_server(udp, rs(7, 53, 1, ForwardMode::Nat))
            .unwrap();
        // Any service's VIP or real server, not only this service's.
        assert_rejected(
            &mut table,
            "address 198.18.1.2 is already the VIP of UDP 198.18.1.2:53",
            |t| t.add_laddr(http(), Ipv4Addr::new(198, 18, 1, 2).into()),
        );
        assert_rejected(&mut table, "already the VIP of TCP 198.18.1.1:80", |t| {
            t.add_laddr(http(), VIP.into())
        });
        assert_rejected(
            &mut table,
            "address 10.0.0.7 is already a real server of UDP 198.18.1.2:53",
            |t| t.add_laddr(http(), Ipv4Addr::new(10, 0, 0, 7).into()),
        );
        // And the other way round.
        table.add_laddr(udp, LIP.into()).unwrap();
        let lip_service = ServiceKey::new(Protocol::Tcp, LIP, 80);
        assert_rejected(
            &mut table,
            "address 198.18.0.50 is already a local address of UDP 198.18.1.2:53",
            |t| {
                t.add_service(lip_service, SchedulerKind::Rr, None)
                    .map(drop)
            },
        );
        let lip_server = RealServerSpec::new(LIP, 80, 1, ForwardMode::FullNat);
        assert_rejected(&mut table, "already a local address", |t| {
            t.add_server(http(), lip_server).map(drop)
        });
    }

    #[test]
    fn fullnat_servers_may_precede_their_local_addresses() {
        let mut table = table_with_http();
        table
            .add_server(http(), rs(1, 8080, 1, ForwardMode::FullNat))
            .unwrap();
        assert!(table.get(http()).unwrap().has_fullnat_server());
        assert!(table.laddrs(http()).unwrap().is_empty());
        table.add_laddr(http(), LIP.into()).unwrap();
        // The last one may go too: new FullNAT sessions are refused until one is back.
        table.del_laddr(http(), LIP.into()).unwrap();
        assert!(table.laddrs(http()).unwrap().is_empty());
    }

    #[test]
    fn synproxy_needs_tcp_and_nat_or_fullnat_servers_both_ways() {
        use crate::model::{SynProxy, SynProxyMode};
        let on = SynProxy {
            mode: SynProxyMode::On,
            ..SynProxy::default()
        };
        let mut table = ServiceTable::new();
        table.add_service(http(), SchedulerKind::Rr, None).unwrap();
        let dr = RealServerSpec::new(Ipv4Addr::new(10, 0, 0, 2), 80, 1, ForwardMode::Dr);
        table.add_server(http(), dr).unwrap();
        let before = table.clone();
        let err = table.set_synproxy(http(), on).unwrap_err();
        assert!(
            matches!(
                err,
                ServiceError::SynProxyNeedsNat {
                    mode: ForwardMode::Dr,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("bypass"), "{err}");
        assert_eq!(table.get(http()), before.get(http()), "nothing changed");
        table.delete_server(http(), dr.ip, 80).unwrap();
        table.set_synproxy(http(), on).unwrap();
        assert_eq!(table.get(http()).unwrap().synproxy, on);
        // A TUN server cannot join a proxied service, nor can a NAT one become DR.
        let tun = RealServerSpec::new(Ipv4Addr::new(10, 0, 0, 3), 80, 1, ForwardMode::Tun);
        assert!(matches!(
            table.add_server(http(), tun),
            Err(ServiceError::SynProxyNeedsNat { .. })
        ));
        let nat = RealServerSpec::new(Ipv4Addr::new(10, 0, 0, 4), 8080, 1, ForwardMode::Nat);
        table.add_server(http(), nat).unwrap();
        let dr = RealServerSpec::new(Ipv4Addr::new(10, 0, 0, 4), 8080, 1, ForwardMode::Dr);
        assert!(table.edit_server(http(), dr).is_err());
        assert!(matches!(
            table.set_synproxy(
                http(),
                SynProxy {
                    mode: SynProxyMode::Auto,
                    auto_syn_rate: 0,
                    ..SynProxy::default()
                }
            ),
            Err(ServiceError::SynProxyRateZero)
        ));
        assert!(matches!(
            table.set_synproxy(
                http(),
                SynProxy {
                    mode: SynProxyMode::On,
                    syn_retries: 6,
                    ..SynProxy::default()
                }
            ),
            Err(ServiceError::SynProxyRetries(6))
        ));
        let udp = ServiceKey::new(Protocol::Udp, VIP, 53);
        table.add_service(udp, SchedulerKind::Rr, None).unwrap();
        assert!(matches!(
            table.set_synproxy(udp, on),
            Err(ServiceError::SynProxyNeedsTcp(_))
        ));
        table.set_synproxy(udp, SynProxy::default()).unwrap();
    }

    #[test]
    fn sloppy_tcp_is_tcp_only_and_keeps_fullnat_out() {
        let mut table = table_with_http();
        assert!(!table.get(http()).unwrap().sloppy_tcp);
        table
            .add_server(http(), rs(1, 80, 1, ForwardMode::Dr))
            .unwrap();
        table.set_sloppy_tcp(http(), true).unwrap();
        assert!(table.get(http()).unwrap().sloppy_tcp);
        // A FullNAT real server, added, edited into, or as the sorry server: refused.
        table
            .add_laddr(http(), Ipv4Addr::new(10, 0, 1, 1).into())
            .unwrap();
        let refusal =
            "sloppy_tcp cannot serve fullnat real server 10.0.0.2:80 of TCP 198.18.1.1:80";
        assert_rejected(&mut table, refusal, |t| {
            t.add_server(http(), rs(2, 80, 1, ForwardMode::FullNat))
                .map(drop)
        });
        assert_rejected(
            &mut table,
            "sloppy_tcp cannot serve fullnat real server 10.0.0.1:80",
            |t| t.edit_server(http(), rs(1, 80, 1, ForwardMode::FullNat)),
        );
        assert_rejected(&mut table, refusal, |t| {
            t.set_sorry_server(
                http(),
                Some(SorryServerSpec {
                    ip: Ipv4Addr::new(10, 0, 0, 2).into(),
                    port: 80,
                    mode: ForwardMode::FullNat,
                    inhibit: false,
                }),
            )
        });
        // Off, the FullNAT server comes in; then sloppy_tcp cannot go back on.
        table.set_sloppy_tcp(http(), false).unwrap();
        table
            .add_server(http(), rs(2, 80, 1, ForwardMode::FullNat))
            .unwrap();
        assert_rejected(&mut table, refusal, |t| t.set_sloppy_tcp(http(), true));
        let udp = ServiceKey::new(Protocol::Udp, VIP, 53);
        table.add_service(udp, SchedulerKind::Rr, None).unwrap();
        assert_rejected(
            &mut table,
            "sloppy_tcp opens sessions from TCP segments that are not SYNs: it cannot be enabled on UDP 198.18.1.1:53",
            |t| t.set_sloppy_tcp(udp, true),
        );
        table.set_sloppy_tcp(udp, false).unwrap();
        // The SYN proxy and sloppy_tcp exclude each other, whichever comes first.
        let web = ServiceKey::new(Protocol::Tcp, VIP, 8080);
        table.add_service(web, SchedulerKind::Rr, None).unwrap();
        table.set_sloppy_tcp(web, true).unwrap();
        let on = SynProxy {
            mode: SynProxyMode::On,
            ..SynProxy::default()
        };
        let both = "sloppy_tcp and the SYN proxy exclude each other on TCP 198.18.1.1:8080";
        assert_rejected(&mut table, both, |t| t.set_synproxy(web, on));
        table.set_sloppy_tcp(web, false).unwrap();
        table.set_synproxy(web, on).unwrap();
        assert_rejected(&mut table, both, |t| t.set_sloppy_tcp(web, true));
    }

    #[test]
    fn toa_is_off_by_default_and_tcp_only() {
        let mut table = table_with_http();
        assert!(!table.get(http()).unwrap().toa);
        table.set_toa(http(), true).unwrap();
        assert!(table.get(http()).unwrap().toa);
        table.set_toa(http(), false).unwrap();
        assert!(!table.get(http()).unwrap().toa);
        let udp = ServiceKey::new(Protocol::Udp, VIP, 53);
        assert_rejected(&mut table, "No such service", |t| t.set_toa(udp, true));
        table.add_service(udp, SchedulerKind::Rr, None).unwrap();
        assert_rejected(
            &mut table,
            "TOA is a TCP option: it cannot be enabled on UDP 198.18.1.1:53",
            |t| t.set_toa(udp, true),
        );
        table.set_toa(udp, false).unwrap();
    }

    #[test]
    fn error_messages_are_single_lines_with_ipvsadm_text() {
        let key = http();
        let cases = [
            (
                ServiceError::ServiceExists(key),
                "Service already exists: TCP 198.18.1.1:80",
            ),
            (
                ServiceError::NoSuchService(key),
                "No such service: TCP 198.18.1.1:80",
            ),
            (
                ServiceError::NoSuchDestination {
                    service: key,
                    ip: Ipv4Addr::new(10, 0, 0, 1).into(),
                    port: 80,
                },
                "No such destination: 10.0.0.1:80 in TCP 198.18.1.1:80",
            ),
        ];
        for (err, text) in cases {
            assert_eq!(err.to_string(), text);
        }
    }

    #[test]
    fn ipv6_services_take_ipv6_real_servers_in_the_modes_the_data_path_has() {
        let vip6: std::net::Ipv6Addr = "2001:db8::1".parse().unwrap();
        let key = ServiceKey::new(Protocol::Tcp, vip6, 80);
        let mut t = ServiceTable::new();
        t.add_service(key, SchedulerKind::Rr, None).unwrap();
        let rs6: std::net::Ipv6Addr = "2001:db8:1::2".parse().unwrap();
        t.add_server(key, RealServerSpec::new(rs6, 80, 1, ForwardMode::Dr))
            .unwrap();
        t.add_server(key, RealServerSpec::new(rs6, 8080, 1, ForwardMode::Nat))
            .unwrap();
        let rs6b: std::net::Ipv6Addr = "2001:db8:1::3".parse().unwrap();
        t.add_server(key, RealServerSpec::new(rs6b, 80, 1, ForwardMode::Tun))
            .unwrap();
        assert_eq!(
            t.get(key).unwrap().real_servers[1].endpoint().to_string(),
            "[2001:db8:1::2]:8080"
        );
        assert_rejected(&mut t, "not of the address family", |t| {
            t.add_server(
                key,
                RealServerSpec::new(Ipv4Addr::new(10, 0, 0, 1), 80, 1, ForwardMode::Nat),
            )
            .map(drop)
        });
        t.add_server(key, RealServerSpec::new(rs6, 81, 1, ForwardMode::FullNat))
            .unwrap();
        t.add_laddr(
            key,
            "2001:db8:1::50"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .into(),
        )
        .unwrap();
        // NAT64: IPv4 local addresses and FullNAT real servers behind the IPv6 VIP.
        t.add_laddr(key, Ipv4Addr::new(198, 18, 0, 50).into())
            .unwrap();
        t.add_server(
            key,
            RealServerSpec::new(Ipv4Addr::new(10, 0, 0, 1), 8080, 1, ForwardMode::FullNat),
        )
        .unwrap();
        for mode in [ForwardMode::Dr, ForwardMode::Tun] {
            assert_rejected(&mut t, "only FullNAT (NAT64) takes IPv4", |t| {
                t.add_server(
                    key,
                    RealServerSpec::new(Ipv4Addr::new(10, 0, 0, 2), 80, 1, mode),
                )
                .map(drop)
            });
        }
        assert_rejected(&mut t, "the SYN proxy is not supported on IPv6", |t| {
            t.set_synproxy(
                key,
                crate::model::SynProxy {
                    mode: SynProxyMode::On,
                    ..Default::default()
                },
            )
        });
        assert_rejected(&mut t, "TOA is not supported on IPv6", |t| {
            t.set_toa(key, true)
        });
        assert_rejected(&mut t, "an access list is not supported on IPv6", |t| {
            let any = crate::service::acl::Prefix::new(Ipv4Addr::UNSPECIFIED, 0).unwrap();
            t.acl_add(key, crate::service::acl::AclAction::Deny, &[any])
        });
        assert_rejected(
            &mut t,
            "a per-source rate limit is not supported on IPv6",
            |t| {
                let limit = crate::service::admission::RateLimit {
                    rate: 1,
                    burst: 1,
                    prefix_len: 32,
                };
                t.set_rate_limit(key, Some(limit))
            },
        );
        t.set_rate_limit(key, None).unwrap();
        assert!(t.admission(key).is_none_or(|r| r.rate_limit().is_none()));
        // An IPv6 real server behind an IPv4 service is refused the same way.
        let mut t = table_with_http();
        assert_rejected(&mut t, "not of the address family", |t| {
            t.add_server(http(), RealServerSpec::new(rs6, 80, 1, ForwardMode::Dr))
                .map(drop)
        });
    }

    #[test]
    fn ipv6_persistence_takes_a_prefix_length() {
        let key = ServiceKey::new(Protocol::Tcp, "2001:db8::1".parse::<IpAddr>().unwrap(), 80);
        let mut t = ServiceTable::new();
        for bad in [0, 129, 255] {
            let p = Some(Persistence::with_prefix6(300, bad));
            let err = t.add_service(key, SchedulerKind::Rr, p).unwrap_err();
            assert_eq!(
                err.to_string(),
                format!("illegal ipv6 netmask {bad}: an IPv6 service persists per a prefix length, 1..128")
            );
        }
        let dotted = Some(Persistence {
            netmask: Ipv4Addr::new(255, 255, 255, 0),
            ..Persistence::new(300)
        });
        assert_rejected(&mut t, "its persistence netmask is a prefix length", |t| {
            t.add_service(key, SchedulerKind::Rr, dotted).map(drop)
        });
        assert!(t.is_empty(), "nothing changed");
        let prefixed = Some(Persistence::with_prefix6(300, 64));
        assert_rejected(&mut t, "its persistence netmask is dotted", |t| {
            t.add_service(http(), SchedulerKind::Rr, prefixed).map(drop)
        });
        t.add_service(key, SchedulerKind::Rr, prefixed).unwrap();
        t.edit_service(key, SchedulerKind::Rr, Some(Persistence::new(60)))
            .unwrap();
        assert_eq!(
            t.get(key).unwrap().persistence,
            Some(Persistence::with_prefix6(60, 128))
        );
    }

    /// However high the limit asked, no real-server id reaches
    /// [`MAX_REAL_SERVER_IDS`] (a session entry keeps the id in two bytes): the last
    /// fresh id is 65,535, and the next server is refused.
    #[test]
    fn real_server_ids_stay_below_the_session_entrys_two_bytes() {
        for limit in [None, Some(u32::MAX)] {
            let mut table = table_with_http();
            if let Some(limit) = limit {
                table.set_server_id_limit(limit);
            }
            // As if 65,533 servers had come and gone, none waiting for release.
            table.next_server_id = MAX_REAL_SERVER_IDS as u32 - 2;
            let ids: Vec<u32> = (1..=2)
                .map(|i| {
                    table
                        .add_server(http(), rs(i, 80, 1, ForwardMode::Dr))
                        .unwrap()
                })
                .collect();
            assert_eq!(ids, [65_534, 65_535], "limit {limit:?}");
            assert_rejected(&mut table, "too many real servers", |t| {
                t.add_server(http(), rs(3, 80, 1, ForwardMode::Dr))
                    .map(drop)
            });
        }
    }

    /// Real-server ids stay below the limit; a removed server's id comes back only
    /// when its owner releases it, once, after every fresh id is used; each way a
    /// server leaves (`-d`, `-D`, `-C`, a sorry server replaced or removed) gives its
    /// id out for release, and a kept sorry server keeps its id.
    #[test]
    fn removed_server_ids_come_back_only_when_released() {
        let mut table = table_with_http();
        // Ids 1, 2 and 3.
        table.set_server_id_limit(4);
        let a = table
            .add_server(http(), rs(1, 80, 1, ForwardMode::Dr))
            .unwrap();
        let b = table
            .add_server(http(), rs(2, 80, 1, ForwardMode::Dr))
            .unwrap();
        let c = table
            .add_server(http(), rs(3, 80, 1, ForwardMode::Dr))
            .unwrap();
        assert_eq!((a, b, c), (1, 2, 3));
        assert_rejected(&mut table, "too many real servers: at most 3", |t| {
            t.add_server(http(), rs(4, 80, 1, ForwardMode::Dr))
                .map(drop)
        });
        table
            .delete_server(http(), rs(2, 80, 1, ForwardMode::Dr).ip, 80)
            .unwrap();
        // Removed, not released: still held.
        assert_eq!(table.unreleased_server_ids(), 1);
        assert_rejected(&mut table, "too many real servers", |t| {
            t.add_server(http(), rs(4, 80, 1, ForwardMode::Dr))
                .map(drop)
        });
        // Not given out yet: nothing to release, and no id a server holds.
        assert!(!table.release_server_id(b));
        assert!(!table.release_server_id(a));
        assert_eq!(table.take_removed_server_ids(), vec![b]);
        assert_eq!(table.take_removed_server_ids(), Vec::<u32>::new());
        assert!(table.release_server_id(b));
        assert!(!table.release_server_id(b), "released twice");
        assert_eq!(table.unreleased_server_ids(), 0);
        assert_eq!(
            table
                .add_server(http(), rs(4, 80, 1, ForwardMode::Dr))
                .unwrap(),
            b
        );

        // Every other way out.
        let sorry = |last: u8, port: u16| SorryServerSpec {
            ip: Ipv4Addr::new(10, 0, 1, last).into(),
            port,
            mode: ForwardMode::Dr,
            inhibit: false,
        };
        let mut table = table_with_http();
        let other = ServiceKey::new(Protocol::Udp, VIP, 53);
        table.add_service(other, SchedulerKind::Rr, None).unwrap();
        table
            .add_server(http(), rs(1, 80, 1, ForwardMode::Dr))
            .unwrap();
        table.set_sorry_server(http(), Some(sorry(1, 80))).unwrap();
        table
            .add_server(other, rs(2, 53, 1, ForwardMode::Dr))
            .unwrap();
        table.set_sorry_server(other, Some(sorry(2, 53))).unwrap();
        let sorry_id = |t: &ServiceTable, k| t.get(k).unwrap().sorry_server.unwrap().id;
        let first_sorry = sorry_id(&table, http());
        // The same sorry server again keeps its id; another replaces it.
        table.set_sorry_server(http(), Some(sorry(1, 80))).unwrap();
        assert_eq!(table.take_removed_server_ids(), Vec::<u32>::new());
        table.set_sorry_server(http(), Some(sorry(3, 80))).unwrap();
        assert_eq!(table.take_removed_server_ids(), vec![first_sorry]);
        let second_sorry = sorry_id(&table, http());
        table.set_sorry_server(http(), None).unwrap();
        assert_eq!(table.take_removed_server_ids(), vec![second_sorry]);
        let other_ids = {
            let s = table.get(other).unwrap();
            vec![s.real_servers[0].id, s.sorry_server.unwrap().id]
        };
        table.delete_service(other).unwrap();
        assert_eq!(table.take_removed_server_ids(), other_ids);
        let http_id = table.get(http()).unwrap().real_servers[0].id;
        table.clear();
        assert_eq!(table.take_removed_server_ids(), vec![http_id]);
        assert_eq!(table.unreleased_server_ids(), 5);
    }

    /// The table takes at most as many distinct real and sorry server addresses of
    /// each family as it is told (each needs a neighbour entry in every worker): a
    /// new address beyond is refused, naming the key to raise, and changes nothing;
    /// another port of an address it holds is no new address; a removal makes room.
    #[test]
    fn distinct_real_server_addresses_stay_within_the_limit() {
        let mut table = table_with_http();
        let six = ServiceKey::new(Protocol::Tcp, "2001:db8::1".parse::<IpAddr>().unwrap(), 80);
        table.add_service(six, SchedulerKind::Rr, None).unwrap();
        table.set_server_address_limit(2);
        let nat = |last: u8, port: u16| rs(last, port, 1, ForwardMode::Nat);
        table.add_server(http(), nat(1, 80)).unwrap();
        table.add_server(http(), nat(2, 80)).unwrap();
        table.add_server(http(), nat(2, 81)).unwrap();
        assert_rejected(
            &mut table,
            "real server address 10.0.0.3: the workers' neighbour tables are sized for 2 \
             distinct IPv4 real and sorry server addresses, all in use (three quarters of \
             [sessions] neighbours; raise it, a restart)",
            |t| t.add_server(http(), nat(3, 80)).map(drop),
        );
        let sorry = SorryServerSpec {
            ip: Ipv4Addr::new(10, 0, 0, 3).into(),
            port: 80,
            mode: ForwardMode::Nat,
            inhibit: false,
        };
        assert_rejected(&mut table, "sized for 2 distinct IPv4", |t| {
            t.set_sorry_server(http(), Some(sorry))
        });
        // A sorry server moving from an address only it uses to a new one: no more
        // addresses than before. Then removed, its address is free again.
        let other = ServiceKey::new(Protocol::Udp, VIP, 53);
        table.add_service(other, SchedulerKind::Rr, None).unwrap();
        let sorry_at = |last: u8| SorryServerSpec {
            ip: Ipv4Addr::new(10, 0, 0, last).into(),
            port: 53,
            mode: ForwardMode::Nat,
            inhibit: false,
        };
        table
            .delete_server(http(), Ipv4Addr::new(10, 0, 0, 1).into(), 80)
            .unwrap();
        table.set_sorry_server(other, Some(sorry_at(7))).unwrap();
        table.set_sorry_server(other, Some(sorry_at(8))).unwrap();
        assert_rejected(&mut table, "sized for 2 distinct IPv4", |t| {
            t.add_server(http(), nat(1, 80)).map(drop)
        });
        table.set_sorry_server(other, None).unwrap();
        table.add_server(http(), nat(1, 80)).unwrap();
        // A deleted service's addresses are free again.
        let one = Ipv4Addr::new(10, 0, 0, 1).into();
        table.delete_server(http(), one, 80).unwrap();
        table
            .add_server(other, rs(9, 53, 1, ForwardMode::Nat))
            .unwrap();
        assert_rejected(&mut table, "sized for 2 distinct IPv4", |t| {
            t.add_server(http(), nat(1, 80)).map(drop)
        });
        table.delete_service(other).unwrap();
        table.add_server(http(), nat(1, 80)).unwrap();
        // The other family counts on its own.
        let v6 = |last: u16| {
            RealServerSpec::new(
                std::net::Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, last),
                80,
                1,
                ForwardMode::Dr,
            )
        };
        table.add_server(six, v6(1)).unwrap();
        table.add_server(six, v6(2)).unwrap();
        assert_rejected(&mut table, "sized for 2 distinct IPv6", |t| {
            t.add_server(six, v6(3)).map(drop)
        });
        // 10.0.0.2 still has port 81: no room yet; without it, room for 10.0.0.3.
        table
            .delete_server(http(), Ipv4Addr::new(10, 0, 0, 2).into(), 80)
            .unwrap();
        assert!(table.add_server(http(), nat(3, 80)).is_err());
        table
            .delete_server(http(), Ipv4Addr::new(10, 0, 0, 2).into(), 81)
            .unwrap();
        table.add_server(http(), nat(3, 80)).unwrap();
        table.clear();
        table.add_service(http(), SchedulerKind::Rr, None).unwrap();
        table.add_server(http(), nat(4, 80)).unwrap();
        table.add_server(http(), nat(5, 80)).unwrap();
    }

    /// An `mh` service holds no more real servers than its Maglev table has slots:
    /// a server beyond, a smaller table, or a switch to `mh` with too many servers is
    /// refused and changes nothing; other schedulers have no such bound.
    #[test]
    fn an_mh_table_holds_no_more_real_servers_than_slots() {
        let mut table = table_with_http();
        let dr = |last: u8| rs(last, 80, 1, ForwardMode::Dr);
        for last in 1..=4 {
            table.add_server(http(), dr(last)).unwrap();
        }
        // rr: any table size, however small.
        table
            .set_sched_params(http(), SchedFlags::default(), Some(3))
            .unwrap();
        let too_small = "TCP 198.18.1.1:80: an mh table of 3 slots cannot hold 4 real servers";
        assert_rejected(&mut table, too_small, |t| {
            t.edit_service(http(), SchedulerKind::Mh, None)
        });
        table.delete_server(http(), dr(4).ip, 80).unwrap();
        table.edit_service(http(), SchedulerKind::Mh, None).unwrap();
        assert_rejected(&mut table, too_small, |t| {
            t.add_server(http(), dr(4)).map(drop)
        });
        assert_rejected(
            &mut table,
            "an mh table of 2 slots cannot hold 3 real servers",
            |t| t.set_sched_params(http(), SchedFlags::default(), Some(2)),
        );
        table
            .set_sched_params(http(), SchedFlags::default(), Some(5))
            .unwrap();
        table.add_server(http(), dr(4)).unwrap();
        table.add_server(http(), dr(5)).unwrap();
        assert_eq!(table.get(http()).unwrap().real_servers.len(), 5);
    }
}
