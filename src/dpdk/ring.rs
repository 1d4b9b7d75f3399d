use super::burst::{Burst, BURST_SIZE};
use super::error::{check, DpdkError};
use std::ffi::CString;
use std::ptr::NonNull;

/// A ring of mbufs: the bounded channel between lcores. A full ring refuses packets;
/// it never blocks. Single consumer always; single producer unless built with
/// [`PacketRing::new_multi_producer`].
pub struct PacketRing {
    raw: NonNull<dpdk_sys::rte_ring>,
}

// SAFETY: an SP/SC rte_ring is safe to use from one producer and one consumer thread at
// a time, an MP/SC one from any number of producers and one consumer; callers keep to
// that (the ring is handed to exactly those owners).
unsafe impl Send for PacketRing {}
// SAFETY: see above; the ring's own head/tail protocol orders the two sides.
unsafe impl Sync for PacketRing {}

impl PacketRing {
    /// A single-producer/single-consumer ring. `size` must be a power of two; the ring
    /// holds `size - 1` packets.
    pub fn new(name: &str, size: u32) -> Result<Self, DpdkError> {
        Self::create(
            name,
            size,
            dpdk_sys::RING_F_SP_ENQ | dpdk_sys::RING_F_SC_DEQ,
        )
    }

    /// A ring any lcore may enqueue to (compare-and-swap on the producer head) and one
    /// lcore dequeues from: the inbox of a worker that every other worker feeds.
    pub fn new_multi_producer(name: &str, size: u32) -> Result<Self, DpdkError> {
        Self::create(name, size, dpdk_sys::RING_F_SC_DEQ)
    }

    fn create(name: &str, size: u32, flags: u32) -> Result<Self, DpdkError> {
        let c = CString::new(name).map_err(|_| DpdkError::other("ring", "NUL in name"))?;
        // SAFETY: valid name; the flags match what the constructors document.
        let raw =
            unsafe { dpdk_sys::rte_ring_create(c.as_ptr(), size, dpdk_sys::SOCKET_ID_ANY, flags) };
        NonNull::new(raw)
            .map(|raw| PacketRing { raw })
            .ok_or_else(|| DpdkError::from_code(format!("rte_ring_create({name})"), 0))
    }

    pub fn as_ptr(&self) -> *mut dpdk_sys::rte_ring {
        self.raw.as_ptr()
    }

    /// Moves as many packets of `burst` as fit into the ring (from the front); the rest
    /// stay in `burst`.
    pub fn enqueue(&self, burst: &mut Burst) -> usize {
        // SAFETY: the burst's first len slots are owned mbufs; the ring takes the first n.
        let n = unsafe {
            dpdk_sys::rte_ring_enqueue_burst(
                self.raw.as_ptr(),
                burst.storage() as *const *mut std::ffi::c_void,
                burst.len() as u32,
                std::ptr::null_mut(),
            )
        } as usize;
        burst.consume_front(n);
        n
    }

    /// Appends up to a burst's free room of packets from the ring.
    pub fn dequeue(&self, burst: &mut Burst) -> usize {
        let room = BURST_SIZE - burst.len();
        // SAFETY: writes at most `room` pointers after the burst's current packets.
        unsafe {
            let dst = burst.storage().add(burst.len()) as *mut *mut std::ffi::c_void;
            let n = dpdk_sys::rte_ring_dequeue_burst(
                self.raw.as_ptr(),
                dst,
                room as u32,
                std::ptr::null_mut(),
            ) as usize;
            burst.set_len(burst.len() + n);
            n
        }
    }

    pub fn count(&self) -> u32 {
        // SAFETY: live ring.
        unsafe { dpdk_sys::rte_ring_count(self.raw.as_ptr()) }
    }
}

impl Drop for PacketRing {
    fn drop(&mut self) {
        // Return any packets still queued to their pool before freeing the ring.
        let mut b = Burst::new();
        while self.dequeue(&mut b) > 0 {
            b.free_all();
        }
        // SAFETY: we own the ring and nobody uses it any more.
        unsafe { dpdk_sys::rte_ring_free(self.raw.as_ptr()) }
    }
}

/// Two ethdev ports joined back to back by rings (`rte_eth_from_rings`): what one
/// transmits on queue q, the other receives on queue q. The in-process wire between
/// Sluice and the peer emulator or traffic generator.
pub struct RingPortPair {
    pub a: u16,
    pub b: u16,
    // Rings outlive the ports built on them: drop the Ports first (the daemon does).
    _a_to_b: Vec<PacketRing>,
    _b_to_a: Vec<PacketRing>,
}

impl RingPortPair {
    pub fn new(name: &str, queues: u16, ring_size: u32) -> Result<Self, DpdkError> {
        let mk = |dir: &str| -> Result<Vec<PacketRing>, DpdkError> {
            (0..queues)
                .map(|q| PacketRing::new(&format!("{name}_{dir}{q}"), ring_size))
                .collect()
        };
        let a_to_b = mk("ab")?;
        let b_to_a = mk("ba")?;
        let ptrs = |v: &[PacketRing]| v.iter().map(|r| r.as_ptr()).collect::<Vec<_>>();
        let (ab, ba) = (ptrs(&a_to_b), ptrs(&b_to_a));
        let make_port =
            |suffix: &str, rx: &[*mut dpdk_sys::rte_ring], tx: &[*mut dpdk_sys::rte_ring]| {
                let n = CString::new(format!("{name}_{suffix}"))
                    .map_err(|_| DpdkError::other("ring port", "NUL in name"))?;
                // SAFETY: rx/tx hold `queues` live rings each, which outlive the port (kept
                // in this struct); the name is a valid C string.
                let rc = unsafe {
                    dpdk_sys::rte_eth_from_rings(
                        n.as_ptr(),
                        rx.as_ptr(),
                        queues as u32,
                        tx.as_ptr(),
                        queues as u32,
                        0,
                    )
                };
                check(&format!("rte_eth_from_rings({name}_{suffix})"), rc).map(|id| id as u16)
            };
        let a = make_port("a", &ba, &ab)?;
        let b = make_port("b", &ab, &ba)?;
        Ok(RingPortPair {
            a,
            b,
            _a_to_b: a_to_b,
            _b_to_a: b_to_a,
        })
    }
}
