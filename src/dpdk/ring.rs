use super::burst::{Burst, BURST_SIZE};
use super::eal::EalGuard;
use super::error::{check, DpdkError};
use super::port::Port;
use std::cell::Cell;
use std::ffi::CString;
use std::marker::PhantomData;
use std::ptr::NonNull;
use std::sync::Arc;

/// A ring of mbufs: the bounded channel between lcores. A full ring refuses packets;
/// it never blocks. It is used only through its ends, whose types carry the ring's
/// threading contract, so a second producer of a single-producer ring, or a second
/// consumer, cannot be written:
///
/// - [`RingProducer`]: the one producer of a single-producer ring; `Send`, not `Sync`,
///   not `Clone` (one thread at a time can reach it);
/// - [`SharedProducer`]: a producer of a multi-producer ring; `Clone` and `Sync`;
/// - [`RingConsumer`]: the one consumer (every ring has one); `Send`, not `Sync`, not
///   `Clone`.
///
/// The ring is freed (its packets returned to their pools) when its last end is
/// dropped.
pub struct PacketRing {
    raw: NonNull<dpdk_sys::rte_ring>,
    _eal: EalGuard,
}

// SAFETY: the ring itself is only reached through its ends, which enforce the
// producer/consumer contract; the raw pointer may move between threads and the ring's
// own head/tail protocol orders the two sides.
unsafe impl Send for PacketRing {}
// SAFETY: as above; shared access to the ring is only `count` and the ends' enqueue or
// dequeue under the contract their types enforce.
unsafe impl Sync for PacketRing {}

/// Makes a type `Send` but not `Sync`: one thread at a time holds it.
type NotSync = PhantomData<Cell<()>>;

/// The one producer of a single-producer ring.
pub struct RingProducer {
    ring: Arc<PacketRing>,
    _one_thread: NotSync,
}

/// A producer of a multi-producer ring: any number of threads may enqueue at once.
#[derive(Clone)]
pub struct SharedProducer {
    ring: Arc<PacketRing>,
}

/// The one consumer of a ring.
pub struct RingConsumer {
    ring: Arc<PacketRing>,
    _one_thread: NotSync,
}

impl PacketRing {
    /// A single-producer/single-consumer ring. `size` must be a power of two; the ring
    /// holds `size - 1` packets.
    pub fn single_producer(
        name: &str,
        size: u32,
    ) -> Result<(RingProducer, RingConsumer), DpdkError> {
        let ring = Arc::new(Self::create(
            name,
            size,
            dpdk_sys::RING_F_SP_ENQ | dpdk_sys::RING_F_SC_DEQ,
        )?);
        Ok((
            RingProducer {
                ring: ring.clone(),
                _one_thread: PhantomData,
            },
            RingConsumer {
                ring,
                _one_thread: PhantomData,
            },
        ))
    }

    /// A ring any lcore may enqueue to (compare-and-swap on the producer head) and one
    /// lcore dequeues from: the inbox of a worker that every other worker feeds.
    pub fn multi_producer(
        name: &str,
        size: u32,
    ) -> Result<(SharedProducer, RingConsumer), DpdkError> {
        let ring = Arc::new(Self::create(name, size, dpdk_sys::RING_F_SC_DEQ)?);
        Ok((
            SharedProducer { ring: ring.clone() },
            RingConsumer {
                ring,
                _one_thread: PhantomData,
            },
        ))
    }

    fn create(name: &str, size: u32, flags: u32) -> Result<Self, DpdkError> {
        let c = CString::new(name).map_err(|_| DpdkError::other("ring", "NUL in name"))?;
        let eal = EalGuard::acquire(&format!("ring {name}"))?;
        // SAFETY: valid name; the flags match what the constructors document; the EAL
        // is up (eal holds it up).
        let raw =
            unsafe { dpdk_sys::rte_ring_create(c.as_ptr(), size, dpdk_sys::SOCKET_ID_ANY, flags) };
        NonNull::new(raw)
            .map(|raw| PacketRing { raw, _eal: eal })
            .ok_or_else(|| DpdkError::from_code(format!("rte_ring_create({name})"), 0))
    }

    /// Moves as many packets of `burst` as fit into the ring (from the front); the rest
    /// stay in `burst`.
    ///
    /// # Safety
    /// The caller is a producer the ring's flags allow: the only one at a time for a
    /// single-producer ring.
    unsafe fn enqueue(&self, burst: &mut Burst) -> usize {
        let slots = burst.storage() as *const *mut std::ffi::c_void;
        // SAFETY: the burst's first len slots are owned, non-null mbufs (storage closed
        // any holes); the ring takes the first n; the caller keeps the producer contract.
        let n = unsafe {
            dpdk_sys::rte_ring_enqueue_burst(
                self.raw.as_ptr(),
                slots,
                burst.len() as u32,
                std::ptr::null_mut(),
            )
        } as usize;
        burst.consume_front(n);
        n
    }

    /// Appends up to a burst's free room of packets from the ring.
    ///
    /// # Safety
    /// The caller is the ring's only consumer at this time.
    unsafe fn dequeue(&self, burst: &mut Burst) -> usize {
        let room = BURST_SIZE - burst.len();
        // SAFETY: writes at most `room` pointers after the burst's current packets (holes
        // closed by storage), each an mbuf the ring owned and now hands to the burst; the
        // caller is the only consumer.
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

impl RingProducer {
    /// Moves as many packets of `burst` as fit into the ring (from the front); the rest
    /// stay in `burst`.
    pub fn enqueue(&self, burst: &mut Burst) -> usize {
        // SAFETY: this is the ring's only producer (not Clone), and not Sync, so only
        // the one thread holding it can be here.
        unsafe { self.ring.enqueue(burst) }
    }
}

impl SharedProducer {
    /// As [`RingProducer::enqueue`]; safe from any number of threads at once.
    pub fn enqueue(&self, burst: &mut Burst) -> usize {
        // SAFETY: the ring was created multi-producer (only `multi_producer` makes a
        // SharedProducer).
        unsafe { self.ring.enqueue(burst) }
    }
}

impl RingConsumer {
    /// Appends up to a burst's free room of packets from the ring.
    pub fn dequeue(&self, burst: &mut Burst) -> usize {
        // SAFETY: this is the ring's only consumer (not Clone), and not Sync, so only
        // the one thread holding it can be here.
        unsafe { self.ring.dequeue(burst) }
    }

    /// Packets waiting.
    pub fn count(&self) -> u32 {
        self.ring.count()
    }
}

impl Drop for PacketRing {
    fn drop(&mut self) {
        // Return any packets still queued to their pool before freeing the ring.
        let mut b = Burst::new();
        // SAFETY: the last end is gone: nobody else produces or consumes.
        while unsafe { self.dequeue(&mut b) } > 0 {
            b.free_all();
        }
        // SAFETY: we own the ring and nobody uses it any more.
        unsafe { dpdk_sys::rte_ring_free(self.raw.as_ptr()) }
    }
}

/// Two ethdev ports joined back to back by rings (`rte_eth_from_rings`): what one
/// transmits on queue q, the other receives on queue q. The in-process wire between
/// Sluice and the peer emulator or traffic generator. Each port holds the rings alive,
/// so they are freed only once both devices, which point at them, are closed.
pub struct RingPortPair {
    pub a: Port,
    pub b: Port,
}

/// The rings of a [`RingPortPair`], shared by its two ports.
pub(super) struct PairRings {
    _a_to_b: Vec<PacketRing>,
    _b_to_a: Vec<PacketRing>,
}

impl RingPortPair {
    pub fn new(name: &str, queues: u16, ring_size: u32) -> Result<Self, DpdkError> {
        let mk = |dir: &str| -> Result<Vec<PacketRing>, DpdkError> {
            (0..queues)
                .map(|q| {
                    PacketRing::create(
                        &format!("{name}_{dir}{q}"),
                        ring_size,
                        dpdk_sys::RING_F_SP_ENQ | dpdk_sys::RING_F_SC_DEQ,
                    )
                })
                .collect()
        };
        let (a_to_b, b_to_a) = (mk("ab")?, mk("ba")?);
        let ptrs = |v: &[PacketRing]| v.iter().map(|r| r.raw.as_ptr()).collect::<Vec<_>>();
        let (ab, ba) = (ptrs(&a_to_b), ptrs(&b_to_a));
        let rings = Arc::new(PairRings {
            _a_to_b: a_to_b,
            _b_to_a: b_to_a,
        });
        let make_port =
            |suffix: &str, rx: &[*mut dpdk_sys::rte_ring], tx: &[*mut dpdk_sys::rte_ring]| {
                let n = CString::new(format!("{name}_{suffix}"))
                    .map_err(|_| DpdkError::other("ring port", "NUL in name"))?;
                // SAFETY: rx/tx hold `queues` live rings each, which the port made below
                // holds alive until its device is closed; the name is a valid C string.
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
                let id = check(&format!("rte_eth_from_rings({name}_{suffix})"), rc)? as u16;
                Port::claim(id, Some(rings.clone())).inspect_err(|_| {
                    // Unowned, the device is never closed and keeps pointing at the
                    // rings: they must never be freed.
                    std::mem::forget(rings.clone());
                })
            };
        // Should b fail, a drops here: its device is closed before the rings go.
        let a = make_port("a", &ba, &ab)?;
        let b = make_port("b", &ab, &ba)?;
        Ok(RingPortPair { a, b })
    }
}
