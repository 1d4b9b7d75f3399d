//! Which worker receives a packet, as far as Sluice can know it: decided once per
//! start from what the device reports about its receive-side scaling.
//!
//! A session lives on one worker, so every packet of it must reach that worker. With a
//! NIC that hashes with Toeplitz, Sluice computes the device's choice in software
//! ([`super::rss`]): FullNAT picks local ports whose replies hash to their owner, and a
//! NAT reply is redirected once to the worker its request tuple hashes to. That is only
//! right when the software view uses the key, the hash fields and the redirection table
//! the device really uses. A default key differs between drivers (i40e, ice and mlx5
//! do not use Microsoft's), a driver may narrow the fields, and some devices do not
//! hash with Toeplitz at all: `net_af_packet` with `qpairs=N` spreads frames with the
//! kernel's packet-fanout hash (a seeded, symmetric flow hash Sluice cannot compute),
//! `net_tap` claims RSS but cannot report its key (and without the `multiq` qdisc it
//! does not program its eBPF hash either).
//!
//! So the view is built from the device's own answers, read back after configuration
//! ([`decide`]): a device that reports a Toeplitz key, hash fields Sluice can model
//! and a redirection table gets [`Ownership::Device`]. Any other device with several
//! workers gets [`Ownership::Steered`]: the workers agree on the software view (the
//! configured key or Microsoft's, a round-robin table over the workers) and a worker
//! that receives a packet of a session, or of a connection being opened, that the view
//! gives to another worker hands it to that worker's redirect ring, where it is
//! processed as if the device had delivered it there. Correct whatever the device
//! does, for a cost: one Toeplitz hash per packet that misses the receiving worker's
//! table, and for the (workers - 1) / workers share of packets the device puts on the
//! "wrong" queue, one ring hop to the owner (an enqueue per burst, a dequeue, and the
//! packet's cache lines moving between cores).
use crate::flow::rss::{HashFields, Reta, RssError, Toeplitz, DEFAULT_RSS_KEY};
use core::fmt;

/// `RTE_ETH_RSS_IPV4`, `RTE_ETH_RSS_NONFRAG_IPV4_TCP`, `RTE_ETH_RSS_NONFRAG_IPV4_UDP`
/// and the `*_ONLY` field selectors, as ethdev numbers them (stable ABI bits).
pub mod flow_type {
    pub const IPV4: u64 = 1 << 2;
    pub const FRAG_IPV4: u64 = 1 << 3;
    pub const NONFRAG_IPV4_TCP: u64 = 1 << 4;
    pub const NONFRAG_IPV4_UDP: u64 = 1 << 5;
    pub const NONFRAG_IPV4_OTHER: u64 = 1 << 7;
    pub const IPV6: u64 = 1 << 8;
    pub const NONFRAG_IPV6_TCP: u64 = 1 << 10;
    pub const NONFRAG_IPV6_UDP: u64 = 1 << 11;
    pub const L3_SRC_ONLY: u64 = 1 << 63;
    pub const L3_DST_ONLY: u64 = 1 << 62;
    pub const L4_SRC_ONLY: u64 = 1 << 61;
    pub const L4_DST_ONLY: u64 = 1 << 60;
    /// Field selectors a Toeplitz view over the whole tuple cannot model.
    pub const FIELD_SELECTORS: u64 = L3_SRC_ONLY | L3_DST_ONLY | L4_SRC_ONLY | L4_DST_ONLY;
}

/// What a device said about its receive-side scaling, read back after configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceRss {
    /// The `RTE_ETH_RSS_*` flow types the device can hash (`flow_type_rss_offloads`);
    /// 0 when it has no RSS.
    pub offloads: u64,
    /// The key in force (`rte_eth_dev_rss_hash_conf_get`), `None` when the device
    /// would not say.
    pub key: Option<Vec<u8>>,
    /// The flow types hashed in force, as read back with the key.
    pub hash_fields: u64,
    /// The redirection table (`rte_eth_dev_rss_reta_query`), `None` when the device
    /// would not say.
    pub reta: Option<Vec<u16>>,
}

/// How the packets of a port reach the worker that owns their session.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ownership {
    /// One worker: every packet is its own.
    Single,
    /// The device hashes with the Toeplitz key, fields and table it reported back, and
    /// the software view is built from them: replies land on their owner by
    /// construction (FullNAT), or are redirected once (NAT).
    Device,
    /// The loopback port, whose far side (the peer emulator) spreads frames over the
    /// queues with the software view's key and table, as a NIC would.
    Emulated,
    /// Sluice cannot compute the device's choice: the workers steer packets to the
    /// view's owner in software (see the module doc).
    Steered(SteerReason),
}

/// Why a port's packets are steered in software.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SteerReason {
    /// The device has no RSS (af_packet's fanout, pcap, null).
    NoRss,
    /// The device has RSS but would not report its key.
    KeyNotReported,
    /// The device reported a key Sluice cannot hash with (not 40 or 52 bytes).
    KeyUnusable(usize),
    /// The device uses another key than the one configured.
    KeyNotApplied,
    /// The device would not report its redirection table, or reported an empty one.
    TableNotReported,
    /// The device hashes fields a whole-tuple view cannot model (TCP and UDP hashed
    /// differently, or a `*_ONLY` selector).
    FieldsNotModelled(u64),
    /// Another port hashes differently, and the workers share one view.
    PortsDiffer,
}

impl fmt::Display for SteerReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SteerReason::NoRss => f.write_str("the device has no Toeplitz RSS"),
            SteerReason::KeyNotReported => f.write_str("the device does not report its RSS key"),
            SteerReason::KeyUnusable(len) => {
                write!(
                    f,
                    "the device reports a {len}-byte RSS key (40 or 52 expected)"
                )
            }
            SteerReason::KeyNotApplied => {
                f.write_str("the device reports another RSS key than the configured one")
            }
            SteerReason::TableNotReported => {
                f.write_str("the device does not report its redirection table")
            }
            SteerReason::FieldsNotModelled(hf) => {
                write!(
                    f,
                    "the device hashes fields {hf:#x}, which Sluice cannot model"
                )
            }
            SteerReason::PortsDiffer => f.write_str("the ports hash differently"),
        }
    }
}

impl fmt::Display for Ownership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ownership::Single => f.write_str("single worker"),
            Ownership::Device => f.write_str("device RSS (key and table read back)"),
            Ownership::Emulated => f.write_str("emulated RSS (loopback peer)"),
            Ownership::Steered(why) => write!(f, "software steering ({why})"),
        }
    }
}

impl Ownership {
    /// Short name for reports and metrics labels.
    pub fn name(&self) -> &'static str {
        match self {
            Ownership::Single => "single",
            Ownership::Device => "device",
            Ownership::Emulated => "emulated",
            Ownership::Steered(_) => "steered",
        }
    }

    /// Whether workers must steer packets to the view's owner themselves.
    pub fn steers(&self) -> bool {
        matches!(self, Ownership::Steered(_))
    }
}

/// The software view of a port's queue choice, and how far it can be trusted.
#[derive(Clone, Debug)]
pub struct QueueView {
    pub toeplitz: Toeplitz,
    pub reta: Reta,
    pub fields: HashFields,
    /// The fields IPv6 TCP and UDP are hashed with, when the device hashes them as
    /// this view can model; `None`: the workers steer IPv6 packets to the view's owner
    /// (over [`HashFields::L3L4`]) in software, whatever `ownership` says of IPv4.
    pub fields6: Option<HashFields>,
    pub ownership: Ownership,
}

impl QueueView {
    /// The fields the view hashes IPv6 tuples with: the device's, or the whole tuple
    /// when IPv6 is steered.
    pub fn view_fields6(&self) -> HashFields {
        self.fields6.unwrap_or(HashFields::L3L4)
    }

    /// Whether the workers must steer IPv6 packets to the view's owner themselves.
    pub fn steers6(&self) -> bool {
        self.ownership.steers() || (self.ownership != Ownership::Single && self.fields6.is_none())
    }
}

/// The view for `queues` workers of a port whose device reported `device`, configured
/// with `configured_key` (`None`: the device's default). `loopback` marks the
/// emulated port. Errors only for a configured key Sluice cannot hash with.
pub fn decide(
    device: &DeviceRss,
    configured_key: Option<&[u8]>,
    queues: u16,
    loopback: bool,
) -> Result<QueueView, RssError> {
    let fallback_key = configured_key.unwrap_or(&DEFAULT_RSS_KEY);
    let fallback = |ownership: Ownership| -> Result<QueueView, RssError> {
        // One worker owns everything; the loopback peer puts IPv6 on queue 0 (it
        // hashes IPv4 only) and a steered device is steered for IPv6 too.
        let fields6 = (ownership == Ownership::Single).then_some(HashFields::L3L4);
        Ok(QueueView {
            toeplitz: Toeplitz::new(fallback_key)?,
            reta: Reta::new_round_robin(128, queues.max(1))?,
            fields: HashFields::L3L4,
            fields6,
            ownership,
        })
    };
    if queues <= 1 {
        return fallback(Ownership::Single);
    }
    if loopback {
        return fallback(Ownership::Emulated);
    }
    let steered = |why| fallback(Ownership::Steered(why));
    if device.offloads == 0 {
        return steered(SteerReason::NoRss);
    }
    let Some(key) = &device.key else {
        return steered(SteerReason::KeyNotReported);
    };
    if let Some(wanted) = configured_key {
        if wanted != key.as_slice() {
            return steered(SteerReason::KeyNotApplied);
        }
    }
    let Ok(toeplitz) = Toeplitz::new(key) else {
        return steered(SteerReason::KeyUnusable(key.len()));
    };
    let Some(fields) = model_fields(device.hash_fields) else {
        return steered(if device.hash_fields == 0 {
            SteerReason::NoRss
        } else {
            SteerReason::FieldsNotModelled(device.hash_fields)
        });
    };
    let reta = match &device.reta {
        Some(entries) if !entries.is_empty() => Reta::from_entries(entries.clone())?,
        _ => return steered(SteerReason::TableNotReported),
    };
    Ok(QueueView {
        toeplitz,
        reta,
        fields,
        fields6: model_fields6(device.hash_fields),
        ownership: Ownership::Device,
    })
}

/// The whole-tuple fields the device hashes IPv6 TCP and UDP with, as for IPv4
/// ([`model_fields`]): the same Toeplitz over 32 address bytes, then the ports.
fn model_fields6(hf: u64) -> Option<HashFields> {
    use flow_type::*;
    if hf & FIELD_SELECTORS != 0 {
        return None;
    }
    let (tcp, udp) = (hf & NONFRAG_IPV6_TCP != 0, hf & NONFRAG_IPV6_UDP != 0);
    match (tcp, udp) {
        (true, true) => Some(HashFields::L3L4),
        (false, false) if hf & IPV6 != 0 => Some(HashFields::L3),
        _ => None,
    }
}

/// The whole-tuple fields the device hashes IPv4 TCP and UDP with, when one
/// [`HashFields`] describes both.
fn model_fields(hf: u64) -> Option<HashFields> {
    use flow_type::*;
    if hf & FIELD_SELECTORS != 0 {
        return None;
    }
    let (tcp, udp) = (hf & NONFRAG_IPV4_TCP != 0, hf & NONFRAG_IPV4_UDP != 0);
    match (tcp, udp) {
        (true, true) => Some(HashFields::L3L4),
        // Without the L4 flow types a NIC hashes TCP and UDP by the IPv4 addresses.
        (false, false) if hf & IPV4 != 0 => Some(HashFields::L3),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::flow_type::*;
    use super::*;

    /// An i40e-like device: 52-byte key of its own, 512-entry table over 2 queues.
    fn nic(key_len: usize) -> DeviceRss {
        DeviceRss {
            offloads: IPV4 | FRAG_IPV4 | NONFRAG_IPV4_TCP | NONFRAG_IPV4_UDP | NONFRAG_IPV4_OTHER,
            key: Some((0..key_len as u8).map(|b| b.wrapping_mul(37)).collect()),
            hash_fields: IPV4
                | NONFRAG_IPV4_TCP
                | NONFRAG_IPV4_UDP
                | IPV6
                | NONFRAG_IPV6_TCP
                | NONFRAG_IPV6_UDP,
            reta: Some((0..512).map(|i| (i % 2) as u16).collect()),
        }
    }

    #[test]
    fn a_device_that_reports_everything_is_trusted_with_its_own_key_and_table() {
        let device = nic(52);
        let view = decide(&device, None, 2, false).unwrap();
        assert_eq!(view.ownership, Ownership::Device);
        assert_eq!(view.toeplitz.key(), device.key.as_deref().unwrap());
        assert_eq!(view.reta.size(), 512);
        assert_eq!(view.fields, HashFields::L3L4);
        assert_eq!(view.fields6, Some(HashFields::L3L4));
        assert!(!view.ownership.steers() && !view.steers6());
    }

    #[test]
    fn ipv6_is_steered_alone_when_the_device_does_not_hash_it_as_modelled() {
        let mut device = nic(40);
        device.hash_fields = IPV4 | NONFRAG_IPV4_TCP | NONFRAG_IPV4_UDP;
        let view = decide(&device, None, 2, false).unwrap();
        assert_eq!(view.ownership, Ownership::Device);
        assert_eq!(view.fields6, None);
        assert!(view.steers6());
        assert_eq!(view.view_fields6(), HashFields::L3L4);
        device.hash_fields |= IPV6;
        let view = decide(&device, None, 2, false).unwrap();
        assert_eq!(view.fields6, Some(HashFields::L3));
        assert!(!view.steers6());
        device.hash_fields |= NONFRAG_IPV6_TCP;
        assert!(decide(&device, None, 2, false).unwrap().steers6());
        // Steered and emulated ports steer IPv6 too; one worker needs nothing.
        let none = DeviceRss::default();
        assert!(decide(&none, None, 2, false).unwrap().steers6());
        assert!(decide(&none, None, 2, true).unwrap().steers6());
        assert!(!decide(&none, None, 1, false).unwrap().steers6());
    }

    #[test]
    fn the_view_follows_the_fields_the_device_reports() {
        let mut device = nic(40);
        device.hash_fields = IPV4 | FRAG_IPV4;
        assert_eq!(
            decide(&device, None, 2, false).unwrap().fields,
            HashFields::L3
        );
        device.hash_fields = IPV4 | NONFRAG_IPV4_TCP;
        assert_eq!(
            decide(&device, None, 2, false).unwrap().ownership,
            Ownership::Steered(SteerReason::FieldsNotModelled(IPV4 | NONFRAG_IPV4_TCP))
        );
        device.hash_fields = NONFRAG_IPV4_TCP | NONFRAG_IPV4_UDP | L4_DST_ONLY;
        assert!(decide(&device, None, 2, false).unwrap().ownership.steers());
    }

    #[test]
    fn devices_that_do_not_report_are_steered_with_an_agreed_view() {
        let af_packet = DeviceRss::default();
        let view = decide(&af_packet, None, 2, false).unwrap();
        assert_eq!(view.ownership, Ownership::Steered(SteerReason::NoRss));
        assert_eq!(view.toeplitz.key(), &DEFAULT_RSS_KEY[..]);
        assert_eq!(view.reta, Reta::new_round_robin(128, 2).unwrap());

        let mut tap = nic(40);
        tap.key = None;
        assert_eq!(
            decide(&tap, None, 2, false).unwrap().ownership,
            Ownership::Steered(SteerReason::KeyNotReported)
        );
        let mut no_table = nic(40);
        no_table.reta = Some(vec![]);
        assert_eq!(
            decide(&no_table, None, 2, false).unwrap().ownership,
            Ownership::Steered(SteerReason::TableNotReported)
        );
        let mut odd_key = nic(16);
        odd_key.key = Some(vec![1; 16]);
        assert_eq!(
            decide(&odd_key, None, 2, false).unwrap().ownership,
            Ownership::Steered(SteerReason::KeyUnusable(16))
        );
    }

    #[test]
    fn a_configured_key_the_device_did_not_take_is_not_believed() {
        let device = nic(40);
        let view = decide(&device, Some(&DEFAULT_RSS_KEY), 2, false).unwrap();
        assert_eq!(
            view.ownership,
            Ownership::Steered(SteerReason::KeyNotApplied)
        );
        // The workers then agree on the configured key.
        assert_eq!(view.toeplitz.key(), &DEFAULT_RSS_KEY[..]);
        let same = decide(&device, device.key.as_deref(), 2, false).unwrap();
        assert_eq!(same.ownership, Ownership::Device);
    }

    #[test]
    fn flow_type_bits_are_ethdevs() {
        assert_eq!(IPV4, dpdk_sys::SLUICE_ETH_RSS_IPV4);
        assert_eq!(FRAG_IPV4, dpdk_sys::SLUICE_ETH_RSS_FRAG_IPV4);
        assert_eq!(NONFRAG_IPV4_TCP, dpdk_sys::SLUICE_ETH_RSS_NONFRAG_IPV4_TCP);
        assert_eq!(NONFRAG_IPV4_UDP, dpdk_sys::SLUICE_ETH_RSS_NONFRAG_IPV4_UDP);
        assert_eq!(
            NONFRAG_IPV4_OTHER,
            dpdk_sys::SLUICE_ETH_RSS_NONFRAG_IPV4_OTHER
        );
        assert_eq!(IPV6, dpdk_sys::SLUICE_ETH_RSS_IPV6);
        assert_eq!(NONFRAG_IPV6_TCP, dpdk_sys::SLUICE_ETH_RSS_NONFRAG_IPV6_TCP);
        assert_eq!(NONFRAG_IPV6_UDP, dpdk_sys::SLUICE_ETH_RSS_NONFRAG_IPV6_UDP);
        // What the daemon asks every port for covers IPv6 TCP and UDP.
        let asked = dpdk_sys::SLUICE_ETH_RSS_IP
            | dpdk_sys::SLUICE_ETH_RSS_TCP
            | dpdk_sys::SLUICE_ETH_RSS_UDP;
        assert_eq!(
            asked & (IPV6 | NONFRAG_IPV6_TCP | NONFRAG_IPV6_UDP),
            IPV6 | NONFRAG_IPV6_TCP | NONFRAG_IPV6_UDP
        );
        // The `*_ONLY` selectors are not in the bindings (not link-time constants):
        // ethdev defines them as RTE_BIT64(63) down to RTE_BIT64(60).
        assert_eq!(
            FIELD_SELECTORS, 0xf000_0000_0000_0000,
            "L3_SRC_ONLY..L4_DST_ONLY are bits 63..60"
        );
    }

    #[test]
    fn one_worker_and_the_loopback_port_need_no_device_report() {
        let none = DeviceRss::default();
        assert_eq!(
            decide(&none, None, 1, false).unwrap().ownership,
            Ownership::Single
        );
        assert_eq!(
            decide(&none, None, 4, true).unwrap().ownership,
            Ownership::Emulated
        );
        assert!(decide(&none, Some(&[0; 7]), 4, true).is_err());
    }
}
