//! The management side of the appliance: the Unix-socket control channel between the
//! daemon and `sluicectl`, and the reports it carries.
//!
//! - [`protocol`]: the wire format (line-delimited JSON) and the [`Request`] commands.
//! - [`server`]: [`ControlServer`], run by the daemon's management thread.
//! - [`client`]: [`client::request`], used by `sluicectl`.
//! - [`status`]: [`StatusReport`] and its text rendering, shared by both sides.
//!
//! `docs/CLI.md` documents the protocol and the command-line tool.
pub mod client;
pub mod ipvsadm;
pub mod protocol;
pub mod server;
pub mod status;

pub use protocol::{Request, Response, MAX_REQUEST_BYTES};
pub use server::{ControlServer, Handler, ServerLimits};
pub use status::{LcoreStatus, PortStatus, StatusReport, XstatsReport};

/// Where the daemon listens and `sluicectl` connects when nothing else is configured.
pub const DEFAULT_SOCKET_PATH: &str = "/run/sluice/sluice.sock";
