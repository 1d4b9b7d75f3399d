//! The management side of the appliance: the Unix-socket control channel between the
//! daemon and `sluicectl`, and the reports it carries.
//!
//! - [`protocol`]: the wire format (line-delimited JSON) and the [`Request`] commands.
//! - [`server`]: [`ControlServer`], run by the daemon's management thread.
//! - [`client`]: [`client::request`], used by `sluicectl`.
//! - [`report`]: the reports the daemon builds and sends ([`StatusReport`] and the
//!   rest), one module per family.
//! - [`render`]: those reports as the text `sluicectl` prints, one module per command.
//! - [`ipvsadm`]: `sluicectl`'s ipvsadm-compatible command line; [`ipvsadm_usage`]:
//!   ipvsadm 1.31's own checks of it, with its words and exit statuses.
//!
//! `docs/CLI.md` documents the protocol and the command-line tool.
pub mod client;
pub mod ipvsadm;
pub mod ipvsadm_usage;
pub mod protocol;
pub mod render;
pub mod report;
pub mod server;

pub use protocol::{Request, Response, MAX_REQUEST_BYTES};
pub use report::{LcoreStatus, PortStatus, StatusReport, XstatsReport};
pub use server::{ControlServer, Handler, ServerLimits};

/// Where the daemon listens and `sluicectl` connects when nothing else is configured.
pub const DEFAULT_SOCKET_PATH: &str = "/run/sluice/sluice.sock";
