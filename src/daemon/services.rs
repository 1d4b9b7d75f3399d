//! The management core's service registry: built from the config, edited by control
//! requests (ipvsadm `-A/-E/-D/-a/-e/-d/-C`), published to the workers as immutable
//! snapshots, and listed with the workers' per-real-server counters.
use crate::config::Config;
use crate::control::protocol::Request;
use crate::control::status::{RealServerStatus, ServiceStatus, ServicesReport};
use crate::dataplane::realserver_stats::{
    RealServerCounters, RealServerTotals, MAX_REAL_SERVER_IDS,
};
use crate::sched::SchedulerKind;
use crate::service::{
    Persistence, RealServerSpec, ServiceError, ServiceTable, Snapshot, SnapshotPublisher,
};
use std::sync::Arc;

/// Scheduler of a service added without `-s`: weighted, so weights mean something.
pub const DEFAULT_SCHEDULER: SchedulerKind = SchedulerKind::Wrr;

/// The editable table and the generation of the last snapshot published from it.
pub struct Services {
    pub table: ServiceTable,
    pub generation: u64,
}

/// Per-worker real-server counters are indexed by id; ids are never reused.
pub fn check_real_server_id(id: u32) -> Result<(), String> {
    if id as usize >= MAX_REAL_SERVER_IDS {
        return Err(format!(
            "real-server id space exhausted ({MAX_REAL_SERVER_IDS} additions in this process); restart sluice"
        ));
    }
    Ok(())
}

impl Services {
    pub fn from_config(cfg: &Config) -> Result<Services, String> {
        let mut table = ServiceTable::new();
        for sc in &cfg.services {
            let at = |e: ServiceError| format!("{}:{}: services: {e}", cfg.path.display(), sc.line);
            let persistence = sc
                .persistence
                .map(|(timeout_s, netmask)| Persistence { timeout_s, netmask });
            table
                .add_service(sc.key, sc.scheduler, persistence)
                .map_err(at)?;
            for rs in &sc.real_servers {
                let spec = RealServerSpec::new(rs.ip, rs.port, rs.weight, rs.mode)
                    .with_thresholds(rs.upper, rs.lower);
                let id = table.add_server(sc.key, spec).map_err(at)?;
                check_real_server_id(id)?;
            }
        }
        Ok(Services {
            table,
            generation: 0,
        })
    }

    /// Whether this request is about services (handled here, not by the stats view).
    pub fn handles(req: &Request) -> bool {
        matches!(
            req,
            Request::ListServices
                | Request::AddService { .. }
                | Request::EditService { .. }
                | Request::DeleteService { .. }
                | Request::AddServer { .. }
                | Request::EditServer { .. }
                | Request::DeleteServer { .. }
                | Request::Clear
        )
    }

    /// Applies one request. A change is validated by the table first (nothing changes
    /// on error) and then published to every worker as one new snapshot, so no worker
    /// ever sees half of it.
    pub fn handle(
        &mut self,
        req: Request,
        publisher: &SnapshotPublisher,
        counters: &[Arc<Box<[RealServerCounters]>>],
    ) -> Result<serde_json::Value, String> {
        let t = &mut self.table;
        let changed = match req {
            Request::ListServices => {
                return serde_json::to_value(self.report(counters)).map_err(|e| e.to_string());
            }
            Request::AddService {
                service,
                scheduler,
                persistence,
            } => t
                .add_service(service, scheduler.unwrap_or(DEFAULT_SCHEDULER), persistence)
                .map(drop),
            Request::EditService {
                service,
                scheduler,
                persistence,
            } => {
                let current = t.get(service).map(|s| s.scheduler);
                let scheduler = scheduler.or(current).unwrap_or(DEFAULT_SCHEDULER);
                t.edit_service(service, scheduler, persistence)
            }
            Request::DeleteService { service } => t.delete_service(service).map(drop),
            Request::AddServer { service, server } => {
                let id = t.add_server(service, server).map_err(|e| e.to_string())?;
                check_real_server_id(id).inspect_err(|_| {
                    // Undo: the worker tables cannot count an id this large.
                    let _ = t.delete_server(service, server.ip, server.port);
                })?;
                Ok(())
            }
            Request::EditServer { service, server } => t.edit_server(service, server),
            Request::DeleteServer { service, ip, port } => {
                t.delete_server(service, ip, port).map(drop)
            }
            Request::Clear => {
                t.clear();
                Ok(())
            }
            other => return Err(format!("{} is not a service command", other.command_name())),
        };
        changed.map_err(|e| e.to_string())?;
        self.publish(publisher)?;
        Ok(serde_json::json!({ "generation": self.generation }))
    }

    /// Publishes the table as the workers' next snapshot.
    pub fn publish(&mut self, publisher: &SnapshotPublisher) -> Result<(), String> {
        let generation = publisher.next_generation();
        publisher
            .publish(Snapshot::build(generation, &self.table))
            .map_err(|e| e.to_string())?;
        self.generation = generation;
        Ok(())
    }

    /// The listing for `sluicectl -L`, with counters summed over workers.
    pub fn report(&self, counters: &[Arc<Box<[RealServerCounters]>>]) -> ServicesReport {
        ServicesReport {
            services: self
                .table
                .services()
                .map(|s| ServiceStatus {
                    proto: s.key.proto.name().to_lowercase(),
                    vip: s.key.vip.to_string(),
                    port: s.key.port,
                    scheduler: s.scheduler.name().into(),
                    persistence_s: s.persistence.map(|p| p.timeout_s),
                    real_servers: s
                        .real_servers
                        .iter()
                        .map(|r| {
                            let t = RealServerTotals::sum(counters, r.id);
                            RealServerStatus {
                                ip: r.ip.to_string(),
                                port: r.port,
                                weight: r.weight,
                                mode: r.mode.name().into(),
                                active: t.active,
                                inactive: t.inactive,
                                connections: t.connections,
                                in_packets: t.in_packets,
                                out_packets: t.out_packets,
                                in_bytes: t.in_bytes,
                                out_bytes: t.out_bytes,
                            }
                        })
                        .collect(),
                })
                .collect(),
        }
    }
}
