//! The reports the daemon builds and `sluicectl` renders, one module per family, each
//! type both serializable (the daemon's JSON, `sluicectl --json`) and deserializable
//! (`sluicectl` reads a reply into its type, so a reply of another shape is an error).
//! Health, VRRP and sync reports are built next to their state (`crate::health`,
//! `crate::ha`) and re-exported here.
pub mod admission;
pub mod capture;
pub mod connections;
pub mod events;
pub mod neighbours;
pub mod services;
pub mod status;

pub use crate::ha::bgp::bird::BirdProtocol;
pub use crate::ha::bgp::{ClusterReport, VipReport};
pub use crate::ha::sync::report::{PeerReport, ResyncReport, SyncReport, SyncStats};
pub use crate::ha::vrrp::node::{VrrpReport, VrrpStats};
pub use crate::health::{HealthReport, MonitorStats, TargetReport};
pub use admission::{AclRuleStatus, AdmissionReport, ServiceAdmission};
pub use capture::CaptureReport;
pub use connections::{ConnectionStatus, ConnectionsReport};
pub use events::{EventLine, EventsReport};
pub use neighbours::{
    NeighbourStatus, NeighboursReport, UnresolvedNeighbour, WorkerNeighbourTables,
};
pub use services::{
    LaddrPoolStatus, LaddrReport, LaddrSizing, RealServerStatus, ServiceCounts, ServiceRates,
    ServiceStatus, ServicesReport, TimeoutsReport,
};
pub use status::{
    AdoptionReport, LcoreStatus, ManagementReport, PortStatus, RealServerIdsReport, StatusReport,
    TemplateTableReport, TemplatesReport, XstatsReport,
};
