use super::error::DpdkError;
use std::ffi::CString;
use std::ptr::NonNull;

/// Data room of the appliance's mbufs (after the headroom): its largest frame in one
/// segment.
pub const MBUF_DATA_ROOM: u16 = 2048;

/// A packet-buffer pool (`rte_pktmbuf_pool_create`). Dropping it frees the pool: every
/// mbuf taken from it must have been returned first (ports stopped, rings drained).
pub struct Mempool {
    raw: NonNull<dpdk_sys::rte_mempool>,
}

// SAFETY: rte_mempool is designed for concurrent use from many lcores (per-lcore caches
// plus a lock-free ring); the pointer itself is never mutated through this handle.
unsafe impl Send for Mempool {}
// SAFETY: as above, all operations on a mempool are thread-safe.
unsafe impl Sync for Mempool {}

impl Mempool {
    /// `count` mbufs of `data_room` bytes each (+ headroom); `count` should be 2^k - 1.
    pub fn new(name: &str, count: u32, cache: u32, data_room: u16) -> Result<Self, DpdkError> {
        let c = CString::new(name).map_err(|_| DpdkError::other("mempool", "NUL in name"))?;
        let room = data_room + dpdk_sys::RTE_PKTMBUF_HEADROOM as u16;
        // SAFETY: c is a valid name; the EAL is initialised (callers hold an Eal).
        let raw = unsafe {
            dpdk_sys::rte_pktmbuf_pool_create(
                c.as_ptr(),
                count,
                cache,
                0,
                room,
                dpdk_sys::SOCKET_ID_ANY,
            )
        };
        NonNull::new(raw)
            .map(|raw| Mempool { raw })
            .ok_or_else(|| DpdkError::from_code(format!("rte_pktmbuf_pool_create({name})"), 0))
    }

    pub fn as_ptr(&self) -> *mut dpdk_sys::rte_mempool {
        self.raw.as_ptr()
    }

    /// Mbufs currently in the pool (not handed out).
    pub fn available(&self) -> u32 {
        // SAFETY: raw is a live mempool.
        unsafe { dpdk_sys::rte_mempool_avail_count(self.raw.as_ptr()) }
    }

    /// Mbufs currently handed out.
    pub fn in_use(&self) -> u32 {
        // SAFETY: raw is a live mempool.
        unsafe { dpdk_sys::rte_mempool_in_use_count(self.raw.as_ptr()) }
    }
}

impl Drop for Mempool {
    fn drop(&mut self) {
        // SAFETY: we own the pool; callers returned its mbufs (documented contract).
        unsafe { dpdk_sys::rte_mempool_free(self.raw.as_ptr()) }
    }
}
