use super::mempool::Mempool;
use dpdk_sys::rte_mbuf;

/// Packets per RX/TX burst, as testpmd's default.
pub const BURST_SIZE: usize = 32;

/// A burst of owned mbufs: the unit a worker receives, transmits and frees. Packets are
/// reached as byte slices computed from the mbuf's fields, with no FFI call per packet.
/// Dropping a burst frees whatever it still holds with one bulk call.
pub struct Burst {
    mbufs: [*mut rte_mbuf; BURST_SIZE],
    len: usize,
}

// SAFETY: the burst exclusively owns its mbufs; moving them to another thread is how
// DPDK hands packets between lcores (rings do the same).
unsafe impl Send for Burst {}

impl Default for Burst {
    fn default() -> Self {
        Self::new()
    }
}

impl Burst {
    pub const fn new() -> Self {
        Burst {
            mbufs: [std::ptr::null_mut(); BURST_SIZE],
            len: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn is_full(&self) -> bool {
        self.len == BURST_SIZE
    }

    /// Raw storage for an RX burst to fill; `set_len` must follow.
    pub(crate) fn storage(&mut self) -> *mut *mut rte_mbuf {
        self.mbufs.as_mut_ptr()
    }

    /// # Safety
    /// The first `len` slots must hold mbufs this burst now owns.
    pub(crate) unsafe fn set_len(&mut self, len: usize) {
        debug_assert!(len <= BURST_SIZE);
        self.len = len;
    }

    /// Removes the first `n` packets from the burst without freeing them (they were
    /// handed to a TX queue or ring), keeping the rest in order.
    pub(crate) fn consume_front(&mut self, n: usize) {
        let n = n.min(self.len);
        self.mbufs.copy_within(n..self.len, 0);
        self.len -= n;
    }

    /// Moves packet `i` of `self` to the end of `to`. Returns false (and leaves the packet
    /// where it was) when `to` is full.
    pub fn move_to(&mut self, i: usize, to: &mut Burst) -> bool {
        debug_assert!(i < self.len);
        if to.is_full() {
            return false;
        }
        to.mbufs[to.len] = self.mbufs[i];
        to.len += 1;
        self.mbufs[i] = std::ptr::null_mut();
        true
    }

    /// Closes the gaps `move_to` left, keeping the remaining packets in order.
    pub fn compact_moved(&mut self) {
        let mut kept = 0;
        for i in 0..self.len {
            if !self.mbufs[i].is_null() {
                self.mbufs[kept] = self.mbufs[i];
                kept += 1;
            }
        }
        self.mbufs[kept..self.len].fill(std::ptr::null_mut());
        self.len = kept;
    }

    /// Forgets the (moved-out) contents without freeing: use after every packet was
    /// moved with `move_to`.
    pub fn clear_moved(&mut self) {
        debug_assert!(self.mbufs[..self.len].iter().all(|m| m.is_null()));
        self.len = 0;
    }

    /// Packet `i`'s bytes (first segment), mutable.
    #[inline(always)]
    pub fn packet_mut(&mut self, i: usize) -> &mut [u8] {
        assert!(i < self.len);
        let m = self.mbufs[i];
        // SAFETY: m is a live mbuf owned by this burst (i < len and not moved out); its
        // data lies at buf_addr + data_off for data_len bytes, inside the mbuf's buffer,
        // and nobody else references it while we hold &mut self.
        unsafe {
            let mb = &*m;
            std::slice::from_raw_parts_mut(
                (mb.buf_addr as *mut u8).add(mb.data_off as usize),
                mb.data_len as usize,
            )
        }
    }

    /// Packet `i`'s bytes followed by the free space after them in the mbuf (its
    /// tailroom): for rewrites that grow the packet in place. Call `set_packet_len`
    /// with the new length afterwards.
    #[inline]
    pub fn packet_with_tailroom_mut(&mut self, i: usize) -> &mut [u8] {
        assert!(i < self.len);
        let m = self.mbufs[i];
        // SAFETY: as in packet_mut; the slice ends at the end of the mbuf's data buffer
        // (buf_len), which the mbuf owns, and data_off <= buf_len always holds.
        unsafe {
            let mb = &*m;
            let room = mb.buf_len.saturating_sub(mb.data_off) as usize;
            std::slice::from_raw_parts_mut((mb.buf_addr as *mut u8).add(mb.data_off as usize), room)
        }
    }

    /// Packet `i`'s bytes (first segment).
    #[inline(always)]
    pub fn packet(&self, i: usize) -> &[u8] {
        assert!(i < self.len);
        let m = self.mbufs[i];
        // SAFETY: as in packet_mut, with shared access.
        unsafe {
            let mb = &*m;
            std::slice::from_raw_parts(
                (mb.buf_addr as *const u8).add(mb.data_off as usize),
                mb.data_len as usize,
            )
        }
    }

    /// Total bytes of packet `i` (all segments).
    #[inline(always)]
    pub fn packet_len(&self, i: usize) -> u32 {
        assert!(i < self.len);
        // SAFETY: live mbuf owned by this burst.
        unsafe { (*self.mbufs[i]).pkt_len }
    }

    /// The port field of packet `i`'s mbuf: which port it arrived on, where the data
    /// plane records it before handing the packet to another worker.
    #[inline]
    pub fn port(&self, i: usize) -> u16 {
        assert!(i < self.len);
        // SAFETY: live mbuf owned by this burst.
        unsafe { (*self.mbufs[i]).port }
    }

    #[inline]
    pub fn set_port(&mut self, i: usize, port: u16) {
        assert!(i < self.len);
        // SAFETY: owned live mbuf; a plain field write.
        unsafe { (*self.mbufs[i]).port = port }
    }

    /// Prefetches packet `i`'s first data cache line (no-op past the end).
    #[inline(always)]
    pub fn prefetch(&self, i: usize) {
        if i < self.len {
            // SAFETY: reading buf_addr/data_off of an owned mbuf; the prefetch itself
            // cannot fault.
            unsafe {
                let mb = &*self.mbufs[i];
                let p = (mb.buf_addr as *const i8).add(mb.data_off as usize);
                core::arch::x86_64::_mm_prefetch(p, core::arch::x86_64::_MM_HINT_T0);
            }
        }
    }

    /// Allocates `n` fresh mbufs from `pool` (one bulk call). Returns false and leaves
    /// the burst unchanged when the pool cannot supply all of them.
    pub fn alloc_from(&mut self, pool: &Mempool, n: usize) -> bool {
        let n = n.min(BURST_SIZE - self.len);
        // SAFETY: the destination slots lie within our array; pool is a live mempool.
        let rc = unsafe {
            dpdk_sys::rte_pktmbuf_alloc_bulk(
                pool.as_ptr(),
                self.mbufs.as_mut_ptr().add(self.len),
                n as u32,
            )
        };
        if rc != 0 {
            return false;
        }
        self.len += n;
        true
    }

    /// Sets packet `i`'s length (single segment); returns false if it exceeds the
    /// buffer's tailroom.
    pub fn set_packet_len(&mut self, i: usize, len: u16) -> bool {
        assert!(i < self.len);
        // SAFETY: owned live mbuf; we only write its length fields after checking room.
        unsafe {
            let mb = &mut *self.mbufs[i];
            if mb.data_off as u32 + len as u32 > mb.buf_len as u32 {
                return false;
            }
            mb.data_len = len;
            mb.pkt_len = len as u32;
        }
        true
    }

    /// Grows packet `i` by `n` bytes at the front (into the mbuf's headroom, as
    /// `rte_pktmbuf_prepend`); the new bytes are uninitialised packet space. Returns
    /// false, changing nothing, when the headroom is too small.
    pub fn prepend(&mut self, i: usize, n: u16) -> bool {
        assert!(i < self.len);
        // SAFETY: owned live mbuf; we move data_off back within the buffer only after
        // checking there is room, and keep data_len/pkt_len consistent.
        unsafe {
            let mb = &mut *self.mbufs[i];
            if mb.data_off < n || mb.data_len as u32 + n as u32 > u16::MAX as u32 {
                return false;
            }
            mb.data_off -= n;
            mb.data_len += n;
            mb.pkt_len += n as u32;
        }
        true
    }

    /// Frees every packet still held (one bulk call).
    pub fn free_all(&mut self) {
        if self.len > 0 {
            // SAFETY: the first len slots hold owned mbufs (moved-out slots are null,
            // which rte_pktmbuf_free_bulk skips).
            unsafe { dpdk_sys::rte_pktmbuf_free_bulk(self.mbufs.as_mut_ptr(), self.len as u32) };
            self.len = 0;
        }
    }
}

impl Drop for Burst {
    fn drop(&mut self) {
        self.free_all();
    }
}
