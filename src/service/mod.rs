//! Virtual services and their real servers: the model the management core edits and
//! the immutable snapshots the workers read.
pub mod acl;
pub mod admission;
pub mod snapshot;
pub mod table;

pub use acl::{Acl, AclAction, Prefix};
pub use admission::{Admission, AdmissionEvent, AdmissionRules, AdmissionTotals, RateLimit};
pub use snapshot::{
    HealthOverlay, LoadPositions, NatRoute, Snapshot, SnapshotPublisher, SnapshotReader,
    StaleGeneration,
};
pub use table::{validate_server, validate_service, ServiceError, ServiceTable};
