//! The management core's mutable registry of virtual services, edited with ipvsadm's
//! operations. Workers never see it: they read [`Snapshot`](super::snapshot::Snapshot)s
//! built from it.
//!
//! Every operation validates completely before it changes anything, so a failed command
//! leaves the table exactly as it was (an invalid weight never becomes 0, a rejected
//! service never half-exists).
use super::model::{
    ForwardMode, Persistence, RealServer, RealServerSpec, Service, ServiceKey, MAX_WEIGHT,
};
use crate::sched::SchedulerKind;
use std::collections::BTreeMap;
use std::fmt;
use std::net::Ipv4Addr;

/// Why a table operation was refused. `Display` gives one line that starts with
/// ipvsadm's own text where ipvsadm has one, so scripts grepping for it keep working.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ServiceError {
    ServiceExists(ServiceKey),
    NoSuchService(ServiceKey),
    DestinationExists {
        service: ServiceKey,
        ip: Ipv4Addr,
        port: u16,
    },
    NoSuchDestination {
        service: ServiceKey,
        ip: Ipv4Addr,
        port: u16,
    },
    WeightOutOfRange(u32),
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
    /// Port 0 on a real server of a service with a real port would rewrite to port 0.
    ZeroServerPort {
        service_port: u16,
    },
    /// ipvsadm: a port-0 ("all ports") service must be persistent.
    ZeroPortWithoutPersistence(ServiceKey),
    /// The VIP or real server address is not a unicast address.
    NotUnicast {
        what: &'static str,
        addr: Ipv4Addr,
    },
    PersistenceTimeoutZero,
    PersistenceNetmaskInvalid(Ipv4Addr),
    /// 2^32 ids handed out in one run; ids are never reused, so none are left.
    IdsExhausted,
}

impl fmt::Display for ServiceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServiceError::ServiceExists(key) => write!(f, "Service already exists: {key}"),
            ServiceError::NoSuchService(key) => write!(f, "No such service: {key}"),
            ServiceError::DestinationExists { service, ip, port } => {
                write!(f, "Destination already exists: {ip}:{port} in {service}")
            }
            ServiceError::NoSuchDestination { service, ip, port } => {
                write!(f, "No such destination: {ip}:{port} in {service}")
            }
            ServiceError::WeightOutOfRange(weight) => {
                write!(f, "illegal weight specified: {weight} (range 0..{MAX_WEIGHT})")
            }
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
                "real server port 0 is only valid for a port-0 service (this one is on port {service_port})"
            ),
            ServiceError::ZeroPortWithoutPersistence(key) => {
                write!(f, "Zero port specified for non-persistent service: {key}")
            }
            ServiceError::NotUnicast { what, addr } => {
                write!(f, "invalid {what} address {addr}: not a unicast address")
            }
            ServiceError::PersistenceTimeoutZero => {
                f.write_str("illegal timeout for persistent service: 0 (must be at least 1 s)")
            }
            ServiceError::PersistenceNetmaskInvalid(mask) => {
                write!(f, "illegal persistent netmask {mask}: not contiguous")
            }
            ServiceError::IdsExhausted => f.write_str("no service or real server ids left"),
        }
    }
}

impl std::error::Error for ServiceError {}

/// The registry of virtual services.
///
/// Keep one table for the life of the process and apply config reloads as edits to it:
/// ids come from this table's counters, which is what makes them unique and stable.
#[derive(Debug)]
pub struct ServiceTable {
    /// Ordered by key (protocol, VIP, port): listings are stable and do not depend on
    /// the order commands were issued in.
    services: BTreeMap<ServiceKey, Service>,
    next_service_id: u32,
    next_server_id: u32,
    /// Bumped by every successful change; a natural snapshot generation.
    version: u64,
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
            version: 0,
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
        let id = take_id(&mut self.next_service_id)?;
        self.services.insert(
            key,
            Service {
                id,
                key,
                scheduler,
                persistence,
                real_servers: Vec::new(),
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
        self.version += 1;
        Ok(removed)
    }

    /// `ipvsadm -a`. The server goes to the end of the service's list. Returns its id.
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
        validate_server(&key, &spec)?;
        let id = take_id(&mut self.next_server_id)?;
        let service = self.services.get_mut(&key).expect("looked up above");
        service.real_servers.push(real_server(id, &spec));
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
        let server = &mut service.real_servers[index];
        *server = real_server(server.id, &spec);
        self.version += 1;
        Ok(())
    }

    /// `ipvsadm -d`. Returns the removed server; the others keep their order.
    pub fn delete_server(
        &mut self,
        key: ServiceKey,
        ip: Ipv4Addr,
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
        self.version += 1;
        Ok(removed)
    }

    /// `ipvsadm -C`. Id counters are not reset: ids are never reused within a run.
    pub fn clear(&mut self) {
        self.services.clear();
        self.version += 1;
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

fn is_unicast(addr: Ipv4Addr) -> bool {
    !(addr.is_unspecified() || addr.is_broadcast() || addr.is_multicast())
}

fn validate_service(
    key: &ServiceKey,
    persistence: Option<&Persistence>,
) -> Result<(), ServiceError> {
    if !is_unicast(key.vip) {
        return Err(ServiceError::NotUnicast {
            what: "virtual service",
            addr: key.vip,
        });
    }
    match persistence {
        None if key.port == 0 => Err(ServiceError::ZeroPortWithoutPersistence(*key)),
        None => Ok(()),
        Some(p) if p.timeout_s == 0 => Err(ServiceError::PersistenceTimeoutZero),
        Some(p) if !p.netmask_is_contiguous() => {
            Err(ServiceError::PersistenceNetmaskInvalid(p.netmask))
        }
        Some(_) => Ok(()),
    }
}

fn validate_server(key: &ServiceKey, spec: &RealServerSpec) -> Result<(), ServiceError> {
    if !is_unicast(spec.ip) {
        return Err(ServiceError::NotUnicast {
            what: "real server",
            addr: spec.ip,
        });
    }
    if spec.weight > MAX_WEIGHT {
        return Err(ServiceError::WeightOutOfRange(spec.weight));
    }
    // As IPVS: the check applies even with upper = 0 (no limit), where any lower
    // threshold would be meaningless.
    if spec.lower > spec.upper {
        return Err(ServiceError::ThresholdsInverted {
            upper: spec.upper,
            lower: spec.lower,
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
    use crate::flow::Protocol;

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
            .delete_server(http(), Ipv4Addr::new(10, 0, 0, 1), 80)
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
            t.delete_server(http(), Ipv4Addr::new(10, 0, 0, 1), 81)
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
        assert_rejected(&mut table, "real server port 0", |t| {
            t.add_server(http(), rs(5, 0, 1, ForwardMode::Nat))
                .map(drop)
        });
    }

    #[test]
    fn port_zero_service_needs_persistence() {
        let mut table = ServiceTable::new();
        let all_ports = ServiceKey::new(Protocol::Tcp, VIP, 0);
        assert_rejected(
            &mut table,
            "Zero port specified for non-persistent service",
            |t| t.add_service(all_ports, SchedulerKind::Rr, None).map(drop),
        );
        table
            .add_service(all_ports, SchedulerKind::Rr, Some(Persistence::new(300)))
            .unwrap();
        assert_rejected(&mut table, "Zero port", |t| {
            t.edit_service(all_ports, SchedulerKind::Rr, None)
        });
        // DR to a port-0 service keeps port 0, i.e. the client's destination port.
        table
            .add_server(all_ports, rs(1, 0, 1, ForwardMode::Dr))
            .unwrap();
    }

    #[test]
    fn persistence_is_validated() {
        let mut table = ServiceTable::new();
        assert_rejected(&mut table, "illegal timeout", |t| {
            t.add_service(http(), SchedulerKind::Rr, Some(Persistence::new(0)))
                .map(drop)
        });
        let holes = Persistence {
            timeout_s: 60,
            netmask: Ipv4Addr::new(255, 0, 255, 0),
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
        ] {
            let key = ServiceKey::new(Protocol::Tcp, vip, 80);
            assert_rejected(&mut table, "not a unicast address", |t| {
                t.add_service(key, SchedulerKind::Rr, None).map(drop)
            });
        }
        table.add_service(http(), SchedulerKind::Rr, None).unwrap();
        let bad = RealServerSpec::new(Ipv4Addr::UNSPECIFIED, 80, 1, ForwardMode::Dr);
        assert_rejected(&mut table, "invalid real server address", |t| {
            t.add_server(http(), bad).map(drop)
        });
    }

    #[test]
    fn edit_service_keeps_id_and_servers() {
        let mut table = table_with_http();
        let id = table.get(http()).unwrap().id;
        table
            .add_server(http(), rs(1, 80, 1, ForwardMode::Dr))
            .unwrap();
        let persistence = Some(Persistence {
            timeout_s: 600,
            netmask: Ipv4Addr::new(255, 255, 255, 0),
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
                .delete_server(http(), Ipv4Addr::new(10, 0, 0, 1), 80)
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
                    ip: Ipv4Addr::new(10, 0, 0, 1),
                    port: 80,
                },
                "No such destination: 10.0.0.1:80 in TCP 198.18.1.1:80",
            ),
        ];
        for (err, text) in cases {
            assert_eq!(err.to_string(), text);
        }
    }
}
