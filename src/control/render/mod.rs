//! The reports of `crate::control::report` as the text `sluicectl` prints, one module
//! per command (the ipvsadm listings of the service table share one).
pub mod admission;
pub mod cluster;
pub mod connections;
pub mod events;
pub mod health;
pub mod neighbours;
pub mod services;
pub mod status;
pub mod sync;
pub mod vrrp;

pub use admission::{render_admission, render_admission_all};
pub use cluster::render_cluster;
pub use connections::{connection_line, connections_title, render_connections};
pub use events::{render_events, utc};
pub use health::render_health;
pub use neighbours::render_neighbours;
pub use services::{
    largenum, render_laddrs, render_persistent_conns, render_rates, render_save, render_services,
    render_skew, render_thresholds, render_timeouts, skew_pct, skew_weights,
    DEFAULT_SKEW_THRESHOLD_PCT, PACKETS_PER_CONNECTION_ADVISORY,
};
pub use status::{render_status, render_xstats};
pub use sync::render_sync;
pub use vrrp::render_vrrp;

/// `address:port` as ipvsadm prints it: `198.18.1.1:80`, `[2001:db8::1]:80` (an IPv6
/// address in brackets, as `getnameinfo` callers in ipvsadm's `addrport_to_anyname`).
pub fn endpoint(address: impl std::fmt::Display, port: u16) -> String {
    let address = address.to_string();
    if address.contains(':') {
        format!("[{address}]:{port}")
    } else {
        format!("{address}:{port}")
    }
}
