//! Virtual services and their real servers: the model the management core edits and
//! the immutable snapshots the workers read.
pub mod model;
pub mod snapshot;
pub mod table;

pub use model::{
    ForwardMode, Persistence, RealServer, RealServerSpec, Service, ServiceKey,
    MAX_PERSISTENCE_TIMEOUT_S, MAX_WEIGHT,
};
pub use snapshot::{
    HealthOverlay, NatRoute, Snapshot, SnapshotPublisher, SnapshotReader, StaleGeneration,
};
pub use table::{validate_server, validate_service, ServiceError, ServiceTable};
