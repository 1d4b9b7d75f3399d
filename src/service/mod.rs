//! Virtual services and their real servers: the model the management core edits and
//! the immutable snapshots the workers read.
pub mod model;
