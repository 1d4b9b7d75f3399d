//! VRRPv3 (RFC 5798) for IPv4, interoperable with keepalived. The packet is
//! `crate::wire::vrrp`.
//!
//! - [`auth`]: Sluice's own authentication of adverts between Sluice nodes that share
//!   a key, and the replay check.
//! - [`router`]: the state machine (Initialize, Backup, Master), pure over events and
//!   time.
//! - [`node`]: one virtual router on a port: checks received advertisements, sends its
//!   own and the gratuitous ARPs when it becomes master.
pub mod auth;
pub mod node;
pub mod router;
