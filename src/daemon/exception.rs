//! The management core's side of the exception path (`[ports.exception]`,
//! docs/EXCEPTION_PATH.md): per port, a kernel interface (DPDK `net_tap`, or
//! `virtio_user` over vhost-net) with the port's MAC, and the ring the workers hand
//! its frames to. Each management tick moves what the workers punted into the
//! interface, and what the kernel wrote to it onto the inject ring, for worker 0 to
//! send out of the port. The interface's syscalls (a write per frame) are made here,
//! never on a worker.
use crate::config::{ExceptionConfig, ExceptionKind, PortConfig};
use crate::control::report::status::{ExceptionCounts as Counts, ExceptionStatus};
use crate::dataplane::exception::{PuntRings, BURSTS_PER_TICK, CONTROL_RING_SIZE};
use crate::dataplane::mesh::Injected;
use crate::dpdk::{
    Burst, Eal, Mempool, PacketRing, Port, PortSettings, RingConsumer, RingProducer, RxQueue,
    SharedProducer, TxQueue,
};
use std::sync::Arc;

/// Descriptors of the kernel interface's one RX and one TX queue.
pub const INTERFACE_DESC: u16 = 512;

/// One port's kernel interface and what has crossed it.
pub struct KernelInterface {
    /// The data port's index (`cfg.ports`), written into the kernel's frames' mbufs
    /// so worker 0 sends them out of that port.
    port_index: u16,
    port_name: String,
    config: ExceptionConfig,
    /// Workers' frames for the kernel: those taken on the control budget, emptied
    /// first at every tick, and the others.
    punted_control: RingConsumer,
    punted: RingConsumer,
    /// The producer ends the workers clone.
    producer_control: SharedProducer,
    producer: SharedProducer,
    rx: RxQueue,
    tx: TxQueue,
    counts: Counts,
    /// Dropped last: its queues are no longer polled once this drops.
    port: Port,
}

impl KernelInterface {
    /// Opens port `index`'s kernel interface (the EAL created its vdev from
    /// `ExceptionConfig::vdev`), gives it the port's `mac` and starts it.
    pub fn open(
        eal: &Eal,
        index: usize,
        pc: &PortConfig,
        config: &ExceptionConfig,
        mac: [u8; 6],
        pool: &Arc<Mempool>,
    ) -> Result<KernelInterface, String> {
        let what = format!(
            "port {}: exception interface {} ({})",
            pc.name,
            config.interface,
            config.kind.as_str()
        );
        let (vdev, _) = config.vdev(index);
        let id = eal
            .port_by_name(&vdev)
            .map_err(|e| format!("{what}: {e}"))?;
        let mut port = Port::new(id).map_err(|e| format!("{what}: {e}"))?;
        let settings = PortSettings {
            queues: 1,
            rx_desc: INTERFACE_DESC,
            tx_desc: INTERFACE_DESC,
            mtu: pc.mtu,
            // net_tap sets the kernel interface's own address: the kernel then takes
            // the frames Sluice writes (to the port's MAC) as its own.
            mac: Some(mac),
            rss: None,
        };
        port.configure(&settings, pool)
            .map_err(|e| format!("{what}: {e}"))?;
        if config.kind == ExceptionKind::VirtioUser {
            // virtio-user's MAC is the device's; the kernel's side is the vhost-net tap.
            set_kernel_mac(&config.interface, mac).map_err(|e| format!("{what}: {e}"))?;
        }
        port.start().map_err(|e| format!("{what}: {e}"))?;
        let (rx, tx) = port
            .take_queues()
            .map_err(|e| format!("{what}: {e}"))?
            .pop()
            .ok_or_else(|| format!("{what}: no queue"))?;
        let (producer, punted) =
            PacketRing::multi_producer(&format!("sluice_exc{index}"), config.ring_size)
                .map_err(|e| format!("{what}: {e}"))?;
        let (producer_control, punted_control) =
            PacketRing::multi_producer(&format!("sluice_exc{index}c"), CONTROL_RING_SIZE)
                .map_err(|e| format!("{what}: {e}"))?;
        log::info!(
            "{what}: MAC {}, {} frames/s to the kernel at most, a ring of {} (control: {})",
            crate::wire::MacAddr(mac),
            config.rate,
            config.ring_size,
            CONTROL_RING_SIZE
        );
        Ok(KernelInterface {
            port_index: index as u16,
            port_name: pc.name.clone(),
            config: config.clone(),
            punted_control,
            punted,
            producer_control,
            producer,
            rx,
            tx,
            counts: Counts::default(),
            port,
        })
    }

    /// The data port this interface pairs with (index into `cfg.ports`).
    pub fn port_index(&self) -> usize {
        usize::from(self.port_index)
    }

    /// The ring ends a worker hands this port's frames for the kernel to.
    pub fn rings(&self) -> PuntRings {
        PuntRings {
            general: self.producer.clone(),
            control: self.producer_control.clone(),
        }
    }

    pub fn config(&self) -> &ExceptionConfig {
        &self.config
    }

    /// One management tick: the workers' frames into the interface, the kernel's onto
    /// the inject ring. Up to a burst of the control ring's frames first (the control
    /// budget lets in about five a tick), then at most `exception::FRAMES_PER_TICK`
    /// others, and as many from the kernel (a syscall per frame), so a flood cannot
    /// stretch the tick that also runs health checks, VRRP, BGP and control
    /// requests; the rest waits in its ring (or the interface's queue) for the next
    /// tick.
    pub fn pump(&mut self, inject: &RingProducer) {
        let mut burst = Burst::new();
        if self.punted_control.dequeue(&mut burst) > 0 {
            self.write(&mut burst);
        }
        for _ in 0..BURSTS_PER_TICK {
            if self.punted.dequeue(&mut burst) == 0 {
                break;
            }
            self.write(&mut burst);
        }
        for _ in 0..BURSTS_PER_TICK {
            let got = self.rx.rx(&mut burst);
            if got == 0 {
                break;
            }
            for i in 0..got {
                burst.set_user_tag(i, Injected::Kernel.tag());
                burst.set_port(i, self.port_index);
            }
            let taken = inject.enqueue(&mut burst);
            self.counts.from_kernel += taken as u64;
            self.counts.from_kernel_lost += (got - taken) as u64;
            burst.free_all();
        }
    }

    /// Writes `burst` to the interface, counting what it took and what it refused.
    fn write(&mut self, burst: &mut Burst) {
        let queued = burst.len();
        let sent = self.tx.tx(burst);
        self.counts.to_kernel += sent as u64;
        self.counts.to_kernel_lost += (queued - sent) as u64;
        burst.free_all();
    }

    pub fn report(&self) -> ExceptionStatus {
        ExceptionStatus {
            port: self.port_name.clone(),
            interface: self.config.interface.clone(),
            kind: self.config.kind.as_str().to_string(),
            rate: self.config.rate,
            ring_size: self.config.ring_size,
            counts: self.counts,
        }
    }

    /// Stops the interface (the kernel's side goes down with it) and closes it: its
    /// queue handles go first, since a port is not stopped under them.
    pub fn stop(self) {
        let KernelInterface {
            rx, tx, mut port, ..
        } = self;
        drop((rx, tx));
        if let Err(e) = port.stop() {
            log::warn!("{e}");
        }
    }
}

/// Sets the kernel interface `name`'s MAC address and brings it up (SIOCSIFHWADDR,
/// SIOCSIFFLAGS), for virtio-user, whose kernel side DPDK does not address.
fn set_kernel_mac(name: &str, mac: [u8; 6]) -> Result<(), String> {
    // SAFETY: plain socket call; the descriptor is closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0) };
    if fd < 0 {
        return Err(format!("socket: {}", std::io::Error::last_os_error()));
    }
    let result = (|| {
        // SAFETY: ifreq is plain data; zeroed is a valid empty request.
        let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
        if name.len() >= req.ifr_name.len() {
            return Err(format!("interface name {name:?} too long"));
        }
        for (d, s) in req.ifr_name.iter_mut().zip(name.bytes()) {
            *d = s as libc::c_char;
        }
        // SAFETY: writing the hwaddr member of the request's union.
        unsafe {
            req.ifr_ifru.ifru_hwaddr.sa_family = libc::ARPHRD_ETHER;
            for (d, s) in req.ifr_ifru.ifru_hwaddr.sa_data.iter_mut().zip(mac) {
                *d = s as libc::c_char;
            }
        }
        // SAFETY: fd is a socket; req a valid ifreq naming the interface.
        if unsafe { libc::ioctl(fd, libc::SIOCSIFHWADDR, &req) } < 0 {
            return Err(format!(
                "setting {name}'s MAC: {}",
                std::io::Error::last_os_error()
            ));
        }
        // SAFETY: as above; SIOCGIFFLAGS fills the flags member.
        if unsafe { libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut req) } < 0 {
            return Err(format!(
                "reading {name}'s flags: {}",
                std::io::Error::last_os_error()
            ));
        }
        // SAFETY: the flags member was just filled by the kernel.
        unsafe { req.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short };
        // SAFETY: as above.
        if unsafe { libc::ioctl(fd, libc::SIOCSIFFLAGS, &req) } < 0 {
            return Err(format!(
                "bringing {name} up: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(())
    })();
    // SAFETY: fd is ours, closed once.
    unsafe { libc::close(fd) };
    result
}
