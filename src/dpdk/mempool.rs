use super::eal::EalGuard;
use super::error::DpdkError;
use std::ffi::CString;
use std::ptr::NonNull;

/// The smallest data room of the appliance's mbufs (after the headroom): a 1500-byte
/// MTU's frame in one segment with room to spare. A larger port MTU makes it larger
/// (`daemon::preflight::mbuf_data_room`).
pub const MBUF_DATA_ROOM: u16 = 2048;

/// What `rte_pktmbuf_pool_create` takes from the EAL's memory, computed as DPDK 22.11
/// sizes a pool (`rte_mempool_create_empty`, `rte_mempool_calc_obj_size`,
/// `rte_mempool_op_calc_mem_size_helper`, the `ring_mp_mc` driver's ring), so that a
/// pool that cannot fit is refused before the EAL starts rather than failing inside it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PoolFootprint {
    /// One object: its header, the mbuf, headroom and data room, padded to cache
    /// lines and spread across memory channels.
    pub object: usize,
    /// The memzone the objects are placed in: no object crosses a page of the EAL's
    /// memory (4 KiB without hugepages: one mbuf a page).
    pub objects: usize,
    /// The pool's own memzone: `struct rte_mempool`, a cache for each of the
    /// `RTE_MAX_LCORE` lcores when it has caches, the pktmbuf private area.
    pub header: usize,
    /// The ring that holds the free objects (the next power of two above the count).
    pub ring: usize,
    /// The heap's bookkeeping: an element header for each allocation, the pool's
    /// list entry, a chunk header (`rte_mempool_memhdr`) for each IOVA-contiguous run
    /// of pages the objects occupy, and the objects' alignment to a page.
    pub bookkeeping: usize,
}

impl PoolFootprint {
    /// A pool of `count` mbufs of `data_room` bytes (+ headroom) with a per-lcore cache
    /// of `cache`, in EAL memory of `page` bytes a page, with `channels` memory
    /// channels times ranks (`-n` x `-r`; DPDK takes 4 x 1 when they are not given).
    pub fn pktmbuf(
        count: u32,
        cache: u32,
        data_room: u16,
        page: usize,
        channels: u32,
    ) -> PoolFootprint {
        use std::mem::size_of;
        const LINE: usize = dpdk_sys::RTE_CACHE_LINE_SIZE as usize;
        let align = |n: usize, to: usize| n.div_ceil(to) * to;
        let count = count as usize;
        // rte_mempool_calc_obj_size without flags: a cache-aligned header, the element
        // (mbuf, private area 0, headroom, data room), a trailer to the next cache
        // line, then cache lines added until their count is prime to the channels.
        let header = align(size_of::<dpdk_sys::rte_mempool_objhdr>(), LINE);
        let element = align(
            size_of::<dpdk_sys::rte_mbuf>()
                + dpdk_sys::RTE_PKTMBUF_HEADROOM as usize
                + usize::from(data_room),
            8,
        );
        let mut lines = align(header + element, LINE) / LINE;
        while gcd(lines, channels.max(1) as usize) != 1 {
            lines += 1;
        }
        let object = lines * LINE;
        // rte_mempool_op_calc_mem_size_helper: objects do not cross pages; the last
        // page holds what is left, plus one object's worth for an unaligned start.
        let objects = match object.cmp(&page) {
            _ if count == 0 => 0,
            std::cmp::Ordering::Greater => align(object, page) * count,
            _ => {
                let per_page = page / object;
                let in_last = (count - 1) % per_page + 1;
                in_last * object + (count - in_last) / per_page * page + object - 1
            }
        };
        let caches = match cache {
            0 => 0,
            _ => dpdk_sys::RTE_MAX_LCORE as usize * size_of::<dpdk_sys::rte_mempool_cache>(),
        };
        let pool_header = align(
            size_of::<dpdk_sys::rte_mempool>()
                + caches
                + align(size_of::<dpdk_sys::rte_pktmbuf_pool_private>(), LINE),
            LINE,
        );
        let slots = (count + 1).next_power_of_two();
        let ring = align(
            size_of::<dpdk_sys::rte_ring>() + slots * size_of::<usize>(),
            LINE,
        );
        // Each memzone, the pool's list entry and each chunk header is a heap element
        // with a cache-aligned `malloc_elem` header (two lines, as a bound); the
        // objects' memzone may be padded before it: a page's worth without hugepages
        // (measured: a cache line is 129 bytes short), bounded at 2 MiB with larger
        // pages, whose padding was not measured here (1 GiB of it would refuse
        // every config on 1 GiB pages). The
        // objects' memzone is one chunk when it is IOVA-contiguous: always without
        // hugepages (the EAL selects IOVA as VA there, physical addresses being
        // unavailable), at worst one a page with hugepages.
        const ELEMENT: usize = 2 * LINE;
        let chunks = match page > 4096 {
            true => objects.div_ceil(page),
            false => 1,
        };
        let small = ELEMENT + align(size_of::<dpdk_sys::rte_mempool_memhdr>(), LINE);
        PoolFootprint {
            object,
            objects,
            header: pool_header,
            ring,
            bookkeeping: 3 * ELEMENT + (1 + chunks) * small + page.min(2 << 20),
        }
    }

    pub fn total(&self) -> usize {
        self.objects + self.header + self.ring + self.bookkeeping
    }
}

fn gcd(a: usize, b: usize) -> usize {
    match b {
        0 => a,
        _ => gcd(b, a % b),
    }
}

/// A packet-buffer pool (`rte_pktmbuf_pool_create`). Dropping it frees the pool when
/// every mbuf taken from it is back; with some still out (in a burst, a ring, a
/// device's queue) it is leaked instead, with a log line, since they still point into
/// it. A port keeps the pool its RX queues refill from alive (it holds an `Arc`).
pub struct Mempool {
    raw: NonNull<dpdk_sys::rte_mempool>,
    /// Keeps the EAL up while the pool exists; forgotten when the pool is leaked.
    eal: Option<EalGuard>,
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
        let room = data_room
            .checked_add(dpdk_sys::RTE_PKTMBUF_HEADROOM as u16)
            .ok_or_else(|| {
                DpdkError::other(
                    format!("mempool {name}"),
                    format!("a data room of {data_room} bytes plus the headroom exceeds 65535"),
                )
            })?;
        let eal = EalGuard::acquire(&format!("mempool {name}"))?;
        // SAFETY: c is a valid name; the EAL is up (eal holds it up).
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
            .map(|raw| Mempool {
                raw,
                eal: Some(eal),
            })
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
        // Only this handle can take mbufs from the pool (ports that refill from it hold
        // it alive), and it is going: once every mbuf is seen back, none goes out again.
        let out = self.in_use();
        if out > 0 {
            log::warn!(
                "mempool {:p}: {out} mbufs still out; the pool is leaked, not freed",
                self.raw
            );
            // The mbufs out still point into the pool: the EAL's memory must stay.
            std::mem::forget(self.eal.take());
            return;
        }
        // SAFETY: we own the pool and nothing else can take an mbuf from it; every mbuf
        // is back in it, as far as `rte_mempool_in_use_count` can tell: it reads the
        // other lcores' caches without synchronising with them (DPDK calls it a
        // debugging aid), so this relies on no other thread returning mbufs of this
        // pool while its last handle drops, as in the daemon, whose workers have
        // stopped by then. The EAL is up (our guard drops after this).
        unsafe { dpdk_sys::rte_mempool_free(self.raw.as_ptr()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the EAL's heap gave `rte_pktmbuf_pool_create` for the daemon's pool
    /// (`heap_allocsz_bytes` of `rte_malloc_get_socket_stats` before and after, EAL
    /// `--no-huge`, DPDK 22.11): the model covers it, within a few KiB.
    /// On 1 GiB pages the pool is its objects (they fit one page) and a bounded
    /// padding, not a page more: the packaged `memory_mb = 1024` must hold it.
    #[test]
    fn large_pages_add_no_page_of_padding() {
        let small = PoolFootprint::pktmbuf(16_383, 256, MBUF_DATA_ROOM, 4096, 4);
        let huge = PoolFootprint::pktmbuf(16_383, 256, MBUF_DATA_ROOM, 1 << 30, 4);
        assert!(huge.total() < 64 << 20, "{huge:?}");
        assert!(huge.total() < small.total(), "{huge:?} {small:?}");
    }

    #[test]
    fn the_pool_footprint_covers_what_dpdk_allocated() {
        for (count, measured) in [(16_383u32, 68_294_848usize), (65_535, 270_014_656)] {
            let pool = PoolFootprint::pktmbuf(count, 256, MBUF_DATA_ROOM, 4096, 4);
            assert!(
                pool.total() >= measured && pool.total() - measured < 16 << 10,
                "{count} mbufs: model {pool:?} = {}, measured {measured}",
                pool.total()
            );
        }
    }

    /// Refused before any DPDK call: no EAL is needed to see it.
    #[test]
    fn a_data_room_that_overflows_with_the_headroom_is_refused() {
        let err = Mempool::new("overflow", 63, 0, u16::MAX)
            .err()
            .expect("a data room of 65535 leaves no place for the headroom");
        assert!(err.message.contains("exceeds 65535"), "{err}");
    }

    #[test]
    fn objects_do_not_cross_pages_and_are_spread_over_channels() {
        let pool = PoolFootprint::pktmbuf(16_383, 256, MBUF_DATA_ROOM, 4096, 4);
        // Header 64, mbuf 128, headroom 128, data room 2048: 37 cache lines, prime to
        // 4 channels.
        assert_eq!(pool.object, 2368);
        // One object a 4 KiB page; the last page holds one, plus an unaligned start.
        assert_eq!(pool.objects, 16_382 * 4096 + 2368 + 2367);
        // The ring: 16384 slots; the header: a cache for each of 128 lcores.
        assert!(pool.ring >= 16_384 * 8 && pool.ring < 16_384 * 8 + 1024);
        assert!(pool.header > 128 * std::mem::size_of::<dpdk_sys::rte_mempool_cache>());
        let no_cache = PoolFootprint::pktmbuf(16_383, 0, MBUF_DATA_ROOM, 4096, 4);
        assert!(no_cache.header < 4096, "{no_cache:?}");
        // 2 MiB pages hold 885 objects each.
        let huge = PoolFootprint::pktmbuf(885 * 3, 256, MBUF_DATA_ROOM, 2 << 20, 4);
        assert_eq!(huge.objects, 885 * 2368 + 2 * (2 << 20) + 2367);
        // A 38-line object is padded to 39 lines over 4 channels, not over 1 or 3.
        let even = 2048 + 64;
        assert_eq!(PoolFootprint::pktmbuf(1, 0, even, 4096, 4).object, 39 * 64);
        assert_eq!(PoolFootprint::pktmbuf(1, 0, even, 4096, 3).object, 38 * 64);
        assert_eq!(PoolFootprint::pktmbuf(1, 0, even, 4096, 1).object, 38 * 64);
    }
}
