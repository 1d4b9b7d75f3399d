use super::burst::{Burst, BURST_SIZE};
use super::eal::EalGuard;
use super::error::{check, DpdkError};
use super::mempool::Mempool;
use super::ring::PairRings;
use std::cell::Cell;
use std::ffi::CStr;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// How to set up a port.
#[derive(Debug, Clone, Default)]
pub struct PortSettings {
    /// RX and TX queues: one pair per worker.
    pub queues: u16,
    pub rx_desc: u16,
    pub tx_desc: u16,
    pub mtu: Option<u16>,
    /// MAC address to set instead of the device's own.
    pub mac: Option<[u8; 6]>,
    /// Receive-side scaling; ignored (with a log line) when the device has no RSS.
    pub rss: Option<RssSettings>,
}

#[derive(Debug, Clone, Default)]
pub struct RssSettings {
    /// `SLUICE_ETH_RSS_*` bits.
    pub hash_fields: u64,
    /// Toeplitz key; the device's default when `None`.
    pub key: Option<Vec<u8>>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LinkStatus {
    pub up: bool,
    pub speed_mbps: u32,
    pub full_duplex: bool,
}

/// The basic ethdev counters (`rte_eth_stats`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PortStats {
    pub rx_packets: u64,
    pub tx_packets: u64,
    pub rx_bytes: u64,
    pub tx_bytes: u64,
    /// Dropped by the NIC because no RX descriptor was free (the worker fell behind).
    pub rx_missed: u64,
    pub rx_errors: u64,
    pub tx_errors: u64,
    /// RX mbuf allocation failures (mempool empty).
    pub rx_nombuf: u64,
}

/// Which ethdevs a [`Port`] owns: one owner per device, so that each queue has one
/// handle.
static CLAIMED: [AtomicBool; dpdk_sys::RTE_MAX_ETHPORTS as usize] =
    [const { AtomicBool::new(false) }; dpdk_sys::RTE_MAX_ETHPORTS as usize];

/// An ethdev port, the one owner of its device (a second `Port` for the same ethdev is
/// refused). Its queue handles (`take_queues`) share the device with it: while one is
/// alive the port is not stopped or reconfigured under it, and the device is stopped
/// and closed when the port and all its queue handles are gone. Control calls are not
/// thread-safe in DPDK, so a port is `Send` but not `Sync`.
pub struct Port {
    shared: Arc<PortShared>,
    id: u16,
    queues: u16,
    configured: bool,
    queues_taken: bool,
    /// The configured MAC when the device cannot take it (net_ring): `mac()` returns it.
    software_mac: Option<[u8; 6]>,
    _not_sync: PhantomData<Cell<()>>,
}

/// What a port and its queue handles share; the last of them to go closes the device.
struct PortShared {
    id: u16,
    started: AtomicBool,
    /// The rings of a ring port ([`RingPortPair`](super::RingPortPair)): the device
    /// points at them, so they are freed only after it is closed.
    _rings: Option<Arc<PairRings>>,
    /// Every pool an RX queue of the device was set up on: it refills from them until it
    /// is closed. Dropped after the rings, which return their mbufs to them.
    rx_pools: Vec<Arc<Mempool>>,
    _eal: EalGuard,
}

impl Drop for PortShared {
    fn drop(&mut self) {
        if *self.started.get_mut() {
            // SAFETY: the port and every queue handle are gone, so nothing polls it.
            let rc = unsafe { dpdk_sys::rte_eth_dev_stop(self.id) };
            if rc < 0 {
                log::warn!(
                    "{}",
                    DpdkError::from_code(format!("rte_eth_dev_stop(port {})", self.id), rc)
                );
            }
        }
        // SAFETY: the port is stopped and nothing polls or configures it any more (the
        // port and every queue handle are gone); its rings and pools outlive the call.
        let rc = unsafe { dpdk_sys::rte_eth_dev_close(self.id) };
        if rc < 0 {
            log::warn!(
                "{}",
                DpdkError::from_code(format!("close port {}", self.id), rc)
            );
        }
        CLAIMED[usize::from(self.id)].store(false, Ordering::Release);
    }
}

/// The limits a device reports for the settings Sluice gives it, read before they are
/// applied so that a refusal can name the config field rather than the DPDK call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceLimits {
    pub max_rx_queues: u16,
    pub max_tx_queues: u16,
    pub min_mtu: u16,
    pub max_mtu: u16,
}

/// The largest MTU a device takes: its own limit, and what its largest frame
/// (`max_rx_pktlen`) carries past the L2 overhead, as `rte_eth_dev_set_mtu` reckons
/// it (the difference of the two when the device reports both, else Ethernet header
/// and CRC, 18 bytes). 0 is "no limit known": a device that reports no MTU limit but a
/// largest frame is held to the frame.
fn max_mtu(device_max_mtu: u16, max_rx_pktlen: u32) -> u16 {
    const ETHER_HEADER_AND_CRC: u32 = 18;
    if max_rx_pktlen == 0 {
        return device_max_mtu;
    }
    let device_max_mtu = if device_max_mtu == 0 {
        u16::MAX
    } else {
        device_max_mtu
    };
    let overhead = if device_max_mtu != u16::MAX && max_rx_pktlen > u32::from(device_max_mtu) {
        max_rx_pktlen - u32::from(device_max_mtu)
    } else {
        ETHER_HEADER_AND_CRC
    };
    let by_frame = max_rx_pktlen.saturating_sub(overhead);
    device_max_mtu.min(u16::try_from(by_frame).unwrap_or(u16::MAX))
}

impl Port {
    /// Takes ownership of ethdev `id` (probed by the EAL). Refused when the EAL is not
    /// up, when no such ethdev exists, or when another `Port` owns it.
    pub fn new(id: u16) -> Result<Port, DpdkError> {
        Port::claim(id, None)
    }

    /// As `new`, for a ring port whose device points at `rings`.
    pub(super) fn claim(id: u16, rings: Option<Arc<PairRings>>) -> Result<Port, DpdkError> {
        let op = format!("port {id}");
        let eal = EalGuard::acquire(&op)?;
        let claim = CLAIMED
            .get(usize::from(id))
            .ok_or_else(|| DpdkError::other(op.as_str(), "port id out of range"))?;
        if claim.swap(true, Ordering::AcqRel) {
            return Err(DpdkError::other(op, "already owned by another Port"));
        }
        // SAFETY: a plain query; the EAL is up (eal holds it up).
        if unsafe { dpdk_sys::rte_eth_dev_is_valid_port(id) } == 0 {
            claim.store(false, Ordering::Release);
            return Err(DpdkError::other(op, "no such ethdev"));
        }
        Ok(Port {
            shared: Arc::new(PortShared {
                id,
                started: AtomicBool::new(false),
                _rings: rings,
                rx_pools: Vec::new(),
                _eal: eal,
            }),
            id,
            queues: 0,
            configured: false,
            queues_taken: false,
            software_mac: None,
            _not_sync: PhantomData,
        })
    }

    /// Refuses `op` while a queue handle of this port is alive (a lcore may poll it).
    fn check_no_queue_handles(&mut self, op: &str) -> Result<&mut PortShared, DpdkError> {
        let id = self.id;
        Arc::get_mut(&mut self.shared).ok_or_else(|| {
            DpdkError::other(
                format!("{op} (port {id})"),
                "its queue handles are still alive (drop them first)",
            )
        })
    }

    pub fn id(&self) -> u16 {
        self.id
    }

    pub fn queue_count(&self) -> u16 {
        self.queues
    }

    fn info(&self) -> Result<dpdk_sys::rte_eth_dev_info, DpdkError> {
        let mut info = dpdk_sys::rte_eth_dev_info::default();
        // SAFETY: info is a valid out pointer; id names an existing port.
        check("rte_eth_dev_info_get", unsafe {
            dpdk_sys::rte_eth_dev_info_get(self.id, &mut info)
        })?;
        Ok(info)
    }

    /// What the device can be configured with, as it reports it. `max_mtu` is the
    /// smaller of the device's MTU limit and what its largest frame carries, which
    /// `rte_eth_dev_set_mtu` also checks (net_af_packet reports no MTU limit but
    /// 1518-byte frames).
    pub fn limits(&self) -> Result<DeviceLimits, DpdkError> {
        let info = self.info()?;
        Ok(DeviceLimits {
            max_rx_queues: info.max_rx_queues,
            max_tx_queues: info.max_tx_queues,
            min_mtu: info.min_mtu,
            max_mtu: max_mtu(info.max_mtu, info.max_rx_pktlen),
        })
    }

    /// The PMD's name (`net_ring`, `net_af_packet`, `net_ixgbe`, ...).
    pub fn driver_name(&self) -> String {
        match self.info() {
            // SAFETY: driver_name points at a static string inside the PMD.
            Ok(info) if !info.driver_name.is_null() => unsafe {
                CStr::from_ptr(info.driver_name)
                    .to_string_lossy()
                    .into_owned()
            },
            _ => String::from("unknown"),
        }
    }

    /// The ethdev's name (vdev name or PCI address).
    pub fn device_name(&self) -> String {
        let mut buf = [0 as std::os::raw::c_char; 64];
        // SAFETY: buf is 64 bytes >= RTE_ETH_NAME_MAX_LEN.
        let rc = unsafe { dpdk_sys::rte_eth_dev_get_name_by_port(self.id, buf.as_mut_ptr()) };
        if rc < 0 {
            return format!("port{}", self.id);
        }
        // SAFETY: DPDK wrote a NUL-terminated string into buf.
        unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned()
    }

    /// Configures queues, RSS, MTU and MAC, and sets up every RX queue on `pool`, which
    /// the port keeps alive while the device may refill from it. Refused while the port
    /// runs or a queue handle of it is alive.
    pub fn configure(&mut self, s: &PortSettings, pool: &Arc<Mempool>) -> Result<(), DpdkError> {
        let shared = self.check_no_queue_handles("port configure")?;
        if *shared.started.get_mut() {
            return Err(DpdkError::other(
                "port configure",
                "port is running; stop it first",
            ));
        }
        if !shared.rx_pools.iter().any(|p| Arc::ptr_eq(p, pool)) {
            shared.rx_pools.push(pool.clone());
        }
        // Until this configuration is whole: a failure half-way leaves no queue to hand
        // out from the old one.
        self.configured = false;
        let info = self.info()?;
        if s.queues == 0 || s.queues > info.max_rx_queues || s.queues > info.max_tx_queues {
            return Err(DpdkError::other(
                format!("port {} configure", self.id),
                format!(
                    "{} queues requested; the device supports {} RX / {} TX",
                    s.queues, info.max_rx_queues, info.max_tx_queues
                ),
            ));
        }
        let mut conf = dpdk_sys::rte_eth_conf::default();
        let mut key = s.rss.as_ref().and_then(|r| r.key.clone());
        if let Some(rss) = &s.rss {
            let supported = rss.hash_fields & info.flow_type_rss_offloads;
            if supported == 0 {
                log::info!(
                    "port {}: {} has no RSS for the requested fields; queues are fed without hashing",
                    self.id,
                    self.driver_name()
                );
            } else {
                if supported != rss.hash_fields {
                    log::warn!(
                        "port {}: RSS fields {:#x} reduced to {:#x} (device capability)",
                        self.id,
                        rss.hash_fields,
                        supported
                    );
                }
                conf.rxmode.mq_mode = dpdk_sys::rte_eth_rx_mq_mode_RTE_ETH_MQ_RX_RSS;
                conf.rx_adv_conf.rss_conf.rss_hf = supported;
                if let Some(k) = key.as_mut() {
                    conf.rx_adv_conf.rss_conf.rss_key = k.as_mut_ptr();
                    conf.rx_adv_conf.rss_conf.rss_key_len = k.len() as u8;
                }
            }
        }
        // SAFETY: conf is fully initialised; rss_key (if set) points into `key`, which
        // lives until the end of this function (DPDK copies it during configure).
        check(
            &format!("rte_eth_dev_configure(port {})", self.id),
            unsafe { dpdk_sys::rte_eth_dev_configure(self.id, s.queues, s.queues, &conf) },
        )?;
        if let Some(mtu) = s.mtu {
            // SAFETY: configured port id.
            let rc = unsafe { dpdk_sys::rte_eth_dev_set_mtu(self.id, mtu) };
            if rc == -(libc::ENOTSUP) {
                // A device without an MTU of its own (net_pcap, net_ring) passes frames
                // of any size it holds; Sluice keeps to `mtu` in software as always.
                log::info!(
                    "port {}: {} has no MTU to set; {mtu} applies in software",
                    self.id,
                    self.driver_name()
                );
            } else {
                check(&format!("set MTU {mtu} on port {}", self.id), rc)?;
            }
        }
        if let Some(mac) = s.mac {
            let mut addr = dpdk_sys::rte_ether_addr { addr_bytes: mac };
            // SAFETY: addr is a valid ether address.
            let rc = unsafe { dpdk_sys::rte_eth_dev_default_mac_addr_set(self.id, &mut addr) };
            if rc == -(libc::ENOTSUP) {
                // Virtual devices such as net_ring cannot change their address. Use the
                // configured MAC in software, and receive frames sent to it.
                log::info!(
                    "port {}: {} cannot set its MAC; answering as {} in software (promiscuous)",
                    self.id,
                    self.driver_name(),
                    crate::wire::ethernet::MacAddr(mac)
                );
                self.software_mac = Some(mac);
                // SAFETY: plain call on a valid port; failure only means the device
                // already delivers every frame (rings, pcap).
                let _ = unsafe { dpdk_sys::rte_eth_promiscuous_enable(self.id) };
            } else {
                check(&format!("set MAC on port {}", self.id), rc)?;
            }
        }
        let (mut rx_desc, mut tx_desc) = (s.rx_desc, s.tx_desc);
        // SAFETY: valid out pointers.
        check("rte_eth_dev_adjust_nb_rx_tx_desc", unsafe {
            dpdk_sys::rte_eth_dev_adjust_nb_rx_tx_desc(self.id, &mut rx_desc, &mut tx_desc)
        })?;
        // SAFETY: plain query.
        let socket = unsafe { dpdk_sys::rte_eth_dev_socket_id(self.id) };
        let socket = if socket < 0 { 0 } else { socket as u32 };
        for q in 0..s.queues {
            // SAFETY: queue q < configured count; a null rx_conf means device defaults;
            // the port keeps pool alive until the device is closed (rx_pools).
            check(&format!("rx queue {q} setup on port {}", self.id), unsafe {
                dpdk_sys::rte_eth_rx_queue_setup(
                    self.id,
                    q,
                    rx_desc,
                    socket,
                    std::ptr::null(),
                    pool.as_ptr(),
                )
            })?;
            // SAFETY: as above, null tx_conf = defaults.
            check(&format!("tx queue {q} setup on port {}", self.id), unsafe {
                dpdk_sys::rte_eth_tx_queue_setup(self.id, q, tx_desc, socket, std::ptr::null())
            })?;
        }
        self.queues = s.queues;
        self.configured = true;
        // No handle of the old queues is alive (checked above): the new ones may be
        // handed out.
        self.queues_taken = false;
        Ok(())
    }

    /// Starts the device. Refused while a queue handle is alive: starting rewrites the
    /// burst functions an lcore polling that queue would be reading.
    pub fn start(&mut self) -> Result<(), DpdkError> {
        if !self.configured {
            return Err(DpdkError::other("port start", "port not configured"));
        }
        self.check_no_queue_handles("port start")?;
        // SAFETY: configured port; no queue handle is alive (checked just above, and
        // none can be made while we hold &mut self), so nothing polls it meanwhile.
        check(&format!("rte_eth_dev_start(port {})", self.id), unsafe {
            dpdk_sys::rte_eth_dev_start(self.id)
        })?;
        self.shared.started.store(true, Ordering::Relaxed);
        Ok(())
    }

    /// Stops the device. Refused while a queue handle of the port is alive.
    pub fn stop(&mut self) -> Result<(), DpdkError> {
        if self.shared.started.load(Ordering::Relaxed) {
            let id = self.id;
            let shared = self.check_no_queue_handles("port stop")?;
            // SAFETY: started port; no queue handle is alive (checked just above, and
            // none can be made while we hold &mut self), so nothing polls it.
            check(&format!("rte_eth_dev_stop(port {id})"), unsafe {
                dpdk_sys::rte_eth_dev_stop(id)
            })?;
            *shared.started.get_mut() = false;
        }
        Ok(())
    }

    /// Hands out the queue tokens, once per configuration: one (RX, TX) pair per queue
    /// index.
    pub fn take_queues(&mut self) -> Result<Vec<(RxQueue, TxQueue)>, DpdkError> {
        if !self.configured || self.queues_taken {
            return Err(DpdkError::other(
                "take queues",
                "port not configured, or queues already taken",
            ));
        }
        self.queues_taken = true;
        Ok((0..self.queues)
            .map(|q| {
                (
                    RxQueue {
                        port: self.id,
                        queue: q,
                        _device: self.shared.clone(),
                        _one_lcore: PhantomData,
                    },
                    TxQueue {
                        port: self.id,
                        queue: q,
                        _device: self.shared.clone(),
                        _one_lcore: PhantomData,
                    },
                )
            })
            .collect())
    }

    pub fn mac(&self) -> Result<[u8; 6], DpdkError> {
        if let Some(mac) = self.software_mac {
            return Ok(mac);
        }
        let mut addr = dpdk_sys::rte_ether_addr::default();
        // SAFETY: valid out pointer.
        check("rte_eth_macaddr_get", unsafe {
            dpdk_sys::rte_eth_macaddr_get(self.id, &mut addr)
        })?;
        Ok(addr.addr_bytes)
    }

    pub fn link(&self) -> LinkStatus {
        let mut link = dpdk_sys::rte_eth_link::default();
        // SAFETY: valid out pointer; _nowait never blocks.
        let rc = unsafe { dpdk_sys::rte_eth_link_get_nowait(self.id, &mut link) };
        if rc < 0 {
            return LinkStatus::default();
        }
        LinkStatus {
            // bindgen emits no accessor for link_status: bit 2 of the bitfield unit.
            up: link._bitfield_1.get(2, 1) == 1,
            speed_mbps: link.link_speed,
            full_duplex: link.link_duplex() == 1,
        }
    }

    pub fn stats(&self) -> Result<PortStats, DpdkError> {
        let mut s = dpdk_sys::rte_eth_stats::default();
        // SAFETY: valid out pointer.
        check("rte_eth_stats_get", unsafe {
            dpdk_sys::rte_eth_stats_get(self.id, &mut s)
        })?;
        Ok(PortStats {
            rx_packets: s.ipackets,
            tx_packets: s.opackets,
            rx_bytes: s.ibytes,
            tx_bytes: s.obytes,
            rx_missed: s.imissed,
            rx_errors: s.ierrors,
            tx_errors: s.oerrors,
            rx_nombuf: s.rx_nombuf,
        })
    }

    pub fn reset_stats(&self) -> Result<(), DpdkError> {
        // SAFETY: plain call on a valid port.
        check("rte_eth_stats_reset", unsafe {
            dpdk_sys::rte_eth_stats_reset(self.id)
        })?;
        // Not every PMD has xstats; a failure to reset them is not an error.
        // SAFETY: plain call on a valid port.
        let _ = unsafe { dpdk_sys::rte_eth_xstats_reset(self.id) };
        Ok(())
    }

    /// Extended statistics: every counter the PMD exposes, by name.
    pub fn xstats(&self) -> Result<Vec<(String, u64)>, DpdkError> {
        // SAFETY: a null array with size 0 asks for the count.
        let n = check("rte_eth_xstats_get_names", unsafe {
            dpdk_sys::rte_eth_xstats_get_names(self.id, std::ptr::null_mut(), 0)
        })? as usize;
        let mut names = vec![dpdk_sys::rte_eth_xstat_name::default(); n];
        let mut values = vec![dpdk_sys::rte_eth_xstat::default(); n];
        // SAFETY: both arrays have n elements.
        let got_names = check("rte_eth_xstats_get_names", unsafe {
            dpdk_sys::rte_eth_xstats_get_names(self.id, names.as_mut_ptr(), n as u32)
        })? as usize;
        // SAFETY: as above.
        let got = check("rte_eth_xstats_get", unsafe {
            dpdk_sys::rte_eth_xstats_get(self.id, values.as_mut_ptr(), n as u32)
        })? as usize;
        let got = got.min(got_names).min(n);
        Ok(values[..got]
            .iter()
            .filter_map(|v| {
                let name = names.get(v.id as usize)?;
                // SAFETY: DPDK NUL-terminates names within the 64-byte array.
                let s = unsafe { CStr::from_ptr(name.name.as_ptr()) };
                Some((s.to_string_lossy().into_owned(), v.value))
            })
            .collect())
    }

    /// Redirection table size (0 when the device has no RSS).
    pub fn reta_size(&self) -> Result<u16, DpdkError> {
        Ok(self.info()?.reta_size)
    }

    /// Writes the RSS redirection table: entry i sends hash bucket i to queue `reta[i]`.
    pub fn set_reta(&self, reta: &[u16]) -> Result<(), DpdkError> {
        let group = dpdk_sys::RTE_ETH_RETA_GROUP_SIZE as usize;
        let mut conf =
            vec![dpdk_sys::rte_eth_rss_reta_entry64::default(); reta.len().div_ceil(group)];
        for (i, q) in reta.iter().enumerate() {
            conf[i / group].mask |= 1 << (i % group);
            conf[i / group].reta[i % group] = *q;
        }
        // SAFETY: conf covers reta.len() entries in groups of 64.
        check("rte_eth_dev_rss_reta_update", unsafe {
            dpdk_sys::rte_eth_dev_rss_reta_update(self.id, conf.as_mut_ptr(), reta.len() as u16)
        })?;
        Ok(())
    }

    /// Reads the RSS redirection table.
    pub fn reta(&self) -> Result<Vec<u16>, DpdkError> {
        let size = self.reta_size()? as usize;
        let group = dpdk_sys::RTE_ETH_RETA_GROUP_SIZE as usize;
        let mut conf = vec![
            dpdk_sys::rte_eth_rss_reta_entry64 {
                mask: u64::MAX,
                reta: [0; 64]
            };
            size.div_ceil(group)
        ];
        // SAFETY: conf covers `size` entries.
        check("rte_eth_dev_rss_reta_query", unsafe {
            dpdk_sys::rte_eth_dev_rss_reta_query(self.id, conf.as_mut_ptr(), size as u16)
        })?;
        Ok((0..size).map(|i| conf[i / group].reta[i % group]).collect())
    }

    /// The RSS hash fields and key in force, as the device reports them.
    pub fn rss_conf(&self) -> Result<RssSettings, DpdkError> {
        let key_len = match self.info()?.hash_key_size {
            0 => 64,
            n => n as usize,
        };
        let mut key = vec![0u8; key_len];
        let mut conf = dpdk_sys::rte_eth_rss_conf {
            rss_key: key.as_mut_ptr(),
            rss_key_len: key_len as u8,
            rss_hf: 0,
        };
        // SAFETY: rss_key points at a buffer of rss_key_len bytes, the device's key
        // size (ethdev refuses a shorter buffer, and drivers write hash_key_size bytes).
        check("rte_eth_dev_rss_hash_conf_get", unsafe {
            dpdk_sys::rte_eth_dev_rss_hash_conf_get(self.id, &mut conf)
        })?;
        // Some drivers do not set rss_key_len on the way out: trust only the device's
        // key size, which the buffer was made to.
        Ok(RssSettings {
            hash_fields: conf.rss_hf,
            key: Some(key),
        })
    }

    /// The `RTE_ETH_RSS_*` flow types the device can hash (0: no RSS).
    pub fn rss_offloads(&self) -> Result<u64, DpdkError> {
        Ok(self.info()?.flow_type_rss_offloads)
    }

    pub fn enable_promiscuous(&self) -> Result<(), DpdkError> {
        // SAFETY: plain call on a valid port.
        check("rte_eth_promiscuous_enable", unsafe {
            dpdk_sys::rte_eth_promiscuous_enable(self.id)
        })?;
        Ok(())
    }
}

/// The right to receive on one queue of one port. `Send` (it moves to its lcore once)
/// but not `Sync`: DPDK queues are not thread-safe, so exactly one lcore polls each.
/// It keeps the device open (and its port from stopping or reconfiguring it).
pub struct RxQueue {
    port: u16,
    queue: u16,
    _device: Arc<PortShared>,
    _one_lcore: PhantomData<Cell<()>>,
}

impl RxQueue {
    pub fn port(&self) -> u16 {
        self.port
    }
    pub fn queue(&self) -> u16 {
        self.queue
    }

    /// Receives up to a free burst's worth of packets into `burst` (appending).
    #[inline]
    pub fn rx(&mut self, burst: &mut Burst) -> usize {
        let room = BURST_SIZE - burst.len();
        // SAFETY: the destination slots are inside the burst's array; this token is the
        // only poller of (port, queue) (one Port per device, one handle per queue), and
        // keeps the device open and configured; the burst owns what DPDK hands back.
        unsafe {
            let dst = burst.storage().add(burst.len());
            let n = dpdk_sys::rte_eth_rx_burst(self.port, self.queue, dst, room as u16) as usize;
            burst.set_len(burst.len() + n);
            n
        }
    }
}

/// The right to transmit on one queue of one port (see `RxQueue`).
pub struct TxQueue {
    port: u16,
    queue: u16,
    _device: Arc<PortShared>,
    _one_lcore: PhantomData<Cell<()>>,
}

impl TxQueue {
    pub fn port(&self) -> u16 {
        self.port
    }
    pub fn queue(&self) -> u16 {
        self.queue
    }

    /// Transmits the burst; what the device did not accept stays in `burst`, in order,
    /// for the caller to count and free (or retry).
    #[inline]
    pub fn tx(&mut self, burst: &mut Burst) -> usize {
        if burst.is_empty() {
            return 0;
        }
        // SAFETY: the first len slots are owned mbufs; DPDK takes ownership of the first
        // n it returns, which we then forget with consume_front; this token is the only
        // user of (port, queue) and keeps the device open and configured.
        let n = unsafe {
            dpdk_sys::rte_eth_tx_burst(self.port, self.queue, burst.storage(), burst.len() as u16)
        } as usize;
        burst.consume_front(n);
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As devices report themselves in DPDK 22.11 (`rte_eth_dev_info`).
    #[test]
    fn the_largest_mtu_is_what_both_the_mtu_and_the_frame_limits_allow() {
        // net_af_packet: no MTU limit, 1518-byte frames.
        assert_eq!(max_mtu(u16::MAX, 1518), 1500);
        // net_pcap: no MTU limit, 65535-byte frames.
        assert_eq!(max_mtu(u16::MAX, 65535), 65517);
        // A NIC reporting both (i40e): the MTU limit, the frame 26 bytes more.
        assert_eq!(max_mtu(9702, 9728), 9702);
        // A frame limit below what the MTU limit says.
        assert_eq!(max_mtu(9000, 4000), 3982);
        // Nothing reported: nothing to check against.
        assert_eq!(max_mtu(0, 0), 0);
        // No MTU limit reported, a largest frame reported: the frame's.
        assert_eq!(max_mtu(0, 1518), 1500);
        assert_eq!(max_mtu(1500, 0), 1500);
    }

    /// DPDK's ethdev control calls are not thread-safe: a `Port` moves between threads
    /// but is never shared by two. (A compile-time check: were `Port` `Sync`, both
    /// impls below would apply and the call would be ambiguous.)
    #[test]
    fn a_port_is_send_but_not_sync() {
        trait AmbiguousIfSync<A> {
            fn check() {}
        }
        impl<T: ?Sized> AmbiguousIfSync<()> for T {}
        impl<T: ?Sized + Sync> AmbiguousIfSync<u8> for T {}
        <Port as AmbiguousIfSync<_>>::check();
        fn send<T: Send>() {}
        send::<Port>();
        send::<RxQueue>();
        send::<TxQueue>();
    }
}
