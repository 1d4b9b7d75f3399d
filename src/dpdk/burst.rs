use super::mempool::Mempool;
use dpdk_sys::rte_mbuf;

/// Packets per RX/TX burst, as testpmd's default.
pub const BURST_SIZE: usize = 32;

/// A burst of owned mbufs: the unit a worker receives, transmits and frees. Packets are
/// reached as byte slices computed from the mbuf's fields, with no FFI call per packet.
/// Dropping a burst frees whatever it still holds with one bulk call.
///
/// [`Burst::move_to`] leaves a hole (a null slot) where the packet was, so the rest
/// keep their indices during a pass over the burst. Every accessor checks its slot
/// (a moved-out packet panics, it is never read; a [`Packet`] checks it once, when
/// it is made), and everything that hands the
/// burst's mbufs to DPDK (TX, rings) closes the holes first, so no null pointer ever
/// leaves the burst: soundness does not depend on the caller's discipline.
pub struct Burst {
    mbufs: [*mut rte_mbuf; BURST_SIZE],
    len: usize,
    /// Some slot below `len` is null (moved out).
    holes: bool,
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
            holes: false,
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

    /// The slots as DPDK takes and fills them, holes closed first: the first `len`
    /// are owned mbufs, all non-null (to transmit or enqueue), and an RX burst or ring
    /// dequeue may fill the ones after them (then `set_len`).
    pub(crate) fn storage(&mut self) -> *mut *mut rte_mbuf {
        if self.holes {
            self.compact_moved();
        }
        self.mbufs.as_mut_ptr()
    }

    /// Packet `i`'s mbuf: below `len` and not moved out, else a panic (a bug in the
    /// caller, caught before any pointer is read).
    #[inline(always)]
    fn live(&self, i: usize) -> *mut rte_mbuf {
        assert!(i < self.len, "packet {i} of a burst of {}", self.len);
        let m = self.mbufs[i];
        assert!(!m.is_null(), "packet {i} was moved out of the burst");
        m
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
        let m = self.live(i);
        if to.is_full() {
            return false;
        }
        // `to` may have holes of its own; its slots past `len` are free either way.
        to.mbufs[to.len] = m;
        to.len += 1;
        self.mbufs[i] = std::ptr::null_mut();
        self.holes = true;
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
        self.holes = false;
    }

    /// Packet `i`'s bytes (first segment), mutable.
    #[inline(always)]
    pub fn packet_mut(&mut self, i: usize) -> &mut [u8] {
        let m = self.live(i);
        // SAFETY: `live` checked the slot: a live mbuf this burst owns, which nobody
        // else references while we hold &mut self.
        unsafe { mbuf::bytes_mut(m) }
    }

    /// Packet `i`'s bytes followed by the free space after them in the mbuf (its
    /// tailroom): for rewrites that grow the packet in place. Call `set_packet_len`
    /// with the new length afterwards.
    #[inline]
    pub fn packet_with_tailroom_mut(&mut self, i: usize) -> &mut [u8] {
        let m = self.live(i);
        // SAFETY: as in packet_mut.
        unsafe { mbuf::with_tailroom_mut(m) }
    }

    /// Packet `i`'s bytes (first segment).
    #[inline(always)]
    pub fn packet(&self, i: usize) -> &[u8] {
        let m = self.live(i);
        // SAFETY: as in packet_mut, with shared access.
        unsafe { mbuf::bytes(m) }
    }

    /// Total bytes of packet `i` (all segments).
    #[inline(always)]
    pub fn packet_len(&self, i: usize) -> u32 {
        let m = self.live(i);
        // SAFETY: live mbuf owned by this burst.
        unsafe { mbuf::pkt_len(m) }
    }

    /// The port field of packet `i`'s mbuf: which port it arrived on, where the data
    /// plane records it before handing the packet to another worker.
    #[inline]
    pub fn port(&self, i: usize) -> u16 {
        let m = self.live(i);
        // SAFETY: live mbuf owned by this burst.
        unsafe { (*m).port }
    }

    #[inline]
    pub fn set_port(&mut self, i: usize, port: u16) {
        let m = self.live(i);
        // SAFETY: owned live mbuf; a plain field write.
        unsafe { (*m).port = port }
    }

    /// The mbuf's word for its holder's own use (`hash.usr`, which only an RX queue
    /// fills, with the RSS hash): how a frame handed from one lcore to another says
    /// what it is.
    #[inline]
    pub fn user_tag(&self, i: usize) -> u32 {
        let m = self.live(i);
        // SAFETY: live mbuf owned by this burst; every variant of the hash union is a
        // plain integer, so reading `usr` is reading 4 initialised bytes.
        unsafe { (*m).__bindgen_anon_2.hash.usr }
    }

    #[inline]
    pub fn set_user_tag(&mut self, i: usize, tag: u32) {
        let m = self.live(i);
        // SAFETY: owned live mbuf; a plain field write.
        unsafe { (*m).__bindgen_anon_2.hash.usr = tag }
    }

    /// Packet `i` as a handle of its own, borrowing the burst: below `len` and not
    /// moved out, else a panic now (a bug in the caller).
    #[inline(always)]
    pub fn packet_at(&mut self, i: usize) -> Packet<'_> {
        let mbuf = self.live(i);
        Packet {
            mbuf,
            index: i,
            _burst: std::marker::PhantomData,
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

    /// Appends a fresh mbuf from `pool` holding a copy of `frame`. False, and the
    /// burst unchanged, when the burst is full, the pool is empty or `frame` does not
    /// fit one mbuf.
    pub fn push_copy(&mut self, pool: &Mempool, frame: &[u8]) -> bool {
        let Ok(len) = u16::try_from(frame.len()) else {
            return false;
        };
        if self.is_full() || !self.alloc_from(pool, 1) {
            return false;
        }
        let i = self.len - 1;
        if !self.set_packet_len(i, len) {
            // Back out the fresh mbuf rather than send a short frame.
            let mut m = std::mem::replace(&mut self.mbufs[i], std::ptr::null_mut());
            self.len -= 1;
            // SAFETY: `m` is the live mbuf just allocated, owned by no one else now.
            unsafe { dpdk_sys::rte_pktmbuf_free_bulk(&mut m, 1) };
            return false;
        }
        self.packet_mut(i).copy_from_slice(frame);
        true
    }

    /// Sets packet `i`'s length (single segment); returns false if it exceeds the
    /// buffer's tailroom.
    pub fn set_packet_len(&mut self, i: usize, len: u16) -> bool {
        let m = self.live(i);
        // SAFETY: owned live mbuf, nobody else references it while we hold &mut self.
        unsafe { mbuf::set_len(m, len) }
    }

    /// Grows packet `i` by `n` bytes at the front (into the mbuf's headroom, as
    /// `rte_pktmbuf_prepend`); the new bytes are uninitialised packet space. Returns
    /// false, changing nothing, when the headroom is too small.
    pub fn prepend(&mut self, i: usize, n: u16) -> bool {
        let m = self.live(i);
        // SAFETY: owned live mbuf, nobody else references it while we hold &mut self.
        unsafe { mbuf::prepend(m, n) }
    }

    /// Shrinks packet `i` by `n` bytes at the front (as `rte_pktmbuf_adj`): they
    /// become headroom. Returns false, changing nothing, when the packet is shorter.
    pub fn adj(&mut self, i: usize, n: u16) -> bool {
        let m = self.live(i);
        // SAFETY: owned live mbuf, nobody else references it while we hold &mut self.
        unsafe { mbuf::adj(m, n) }
    }

    /// Frees every packet still held (one bulk call).
    pub fn free_all(&mut self) {
        if self.len > 0 {
            // SAFETY: the first len slots hold owned mbufs (moved-out slots are null,
            // which rte_pktmbuf_free_bulk skips).
            unsafe { dpdk_sys::rte_pktmbuf_free_bulk(self.mbufs.as_mut_ptr(), self.len as u32) };
            self.mbufs[..self.len].fill(std::ptr::null_mut());
            self.len = 0;
            self.holes = false;
        }
    }
}

/// One packet of a burst, borrowed mutably with the burst: the handle the forwarding
/// stages pass along instead of a `(burst, index)` pair. It reaches only its own
/// packet, and while it lives nothing else reaches the burst, so a stage cannot
/// touch another packet or move this one out from under itself. Made by
/// [`Burst::packet_at`], which checks the slot once and keeps its mbuf: the slot
/// cannot change while the burst is borrowed, and no method here moves the mbuf out
/// (they change its length and offset in place), so the accessors need no check of
/// their own.
pub struct Packet<'a> {
    /// The live mbuf in slot `index`, owned by the borrowed burst.
    mbuf: *mut rte_mbuf,
    index: usize,
    _burst: std::marker::PhantomData<&'a mut Burst>,
}

impl Packet<'_> {
    /// The packet's position in its burst (what the burst's prefetch pass keyed its
    /// peeks by).
    #[inline(always)]
    pub fn index(&self) -> usize {
        self.index
    }

    /// The packet's bytes (first segment).
    #[inline(always)]
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `mbuf` is live and owned by the burst this handle borrows mutably
        // (checked by `packet_at`, unchangeable since); shared access through &self.
        unsafe { mbuf::bytes(self.mbuf) }
    }

    /// The packet's bytes (first segment), mutable.
    #[inline(always)]
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes`; exclusive through &mut self.
        unsafe { mbuf::bytes_mut(self.mbuf) }
    }

    /// The packet's bytes followed by its mbuf's tailroom, for rewrites that grow it in
    /// place; call [`Packet::set_len`] with the new length afterwards.
    #[inline]
    pub fn with_tailroom_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `bytes_mut`.
        unsafe { mbuf::with_tailroom_mut(self.mbuf) }
    }

    /// Total bytes of the packet (all segments).
    #[inline(always)]
    pub fn len(&self) -> u32 {
        // SAFETY: as in `bytes`.
        unsafe { mbuf::pkt_len(self.mbuf) }
    }

    /// Whether the packet holds no byte (a runt no driver delivers, but a length is
    /// a length).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sets the packet's length (single segment); false when it exceeds the tailroom.
    #[inline]
    pub fn set_len(&mut self, len: u16) -> bool {
        // SAFETY: as in `bytes_mut`.
        unsafe { mbuf::set_len(self.mbuf, len) }
    }

    /// Grows the packet by `n` bytes at the front (see [`Burst::prepend`]).
    #[inline]
    pub fn prepend(&mut self, n: u16) -> bool {
        // SAFETY: as in `bytes_mut`.
        unsafe { mbuf::prepend(self.mbuf, n) }
    }

    /// Shrinks the packet by `n` bytes at the front (see [`Burst::adj`]).
    #[inline]
    pub fn adj(&mut self, n: u16) -> bool {
        // SAFETY: as in `bytes_mut`.
        unsafe { mbuf::adj(self.mbuf, n) }
    }
}

/// What [`Burst`] and [`Packet`] do to one mbuf, once they have checked it is theirs.
/// Single-segment packets: the data lies at `buf_addr + data_off` for `data_len`
/// bytes, inside the mbuf's buffer of `buf_len` bytes.
mod mbuf {
    use dpdk_sys::rte_mbuf;

    /// # Safety
    /// `m` is a live mbuf the caller owns and nobody writes while the slice lives.
    #[inline(always)]
    pub(super) unsafe fn bytes<'a>(m: *mut rte_mbuf) -> &'a [u8] {
        // SAFETY: the caller's guarantee; the data lies inside the mbuf's buffer.
        unsafe {
            let mb = &*m;
            std::slice::from_raw_parts(
                (mb.buf_addr as *const u8).add(mb.data_off as usize),
                mb.data_len as usize,
            )
        }
    }

    /// # Safety
    /// `m` is a live mbuf the caller owns and nobody else references while the slice
    /// lives.
    #[inline(always)]
    pub(super) unsafe fn bytes_mut<'a>(m: *mut rte_mbuf) -> &'a mut [u8] {
        // SAFETY: the caller's guarantee; the data lies inside the mbuf's buffer.
        unsafe {
            let mb = &*m;
            std::slice::from_raw_parts_mut(
                (mb.buf_addr as *mut u8).add(mb.data_off as usize),
                mb.data_len as usize,
            )
        }
    }

    /// The data and the free space after it, to the end of the buffer.
    ///
    /// # Safety
    /// As [`bytes_mut`].
    #[inline]
    pub(super) unsafe fn with_tailroom_mut<'a>(m: *mut rte_mbuf) -> &'a mut [u8] {
        // SAFETY: the caller's guarantee; the slice ends at the end of the mbuf's data
        // buffer (buf_len), which the mbuf owns, and data_off <= buf_len always holds.
        unsafe {
            let mb = &*m;
            let room = mb.buf_len.saturating_sub(mb.data_off) as usize;
            std::slice::from_raw_parts_mut((mb.buf_addr as *mut u8).add(mb.data_off as usize), room)
        }
    }

    /// # Safety
    /// `m` is a live mbuf the caller owns.
    #[inline(always)]
    pub(super) unsafe fn pkt_len(m: *mut rte_mbuf) -> u32 {
        // SAFETY: the caller's guarantee.
        unsafe { (*m).pkt_len }
    }

    /// Sets the length (single segment); false, changing nothing, past the tailroom.
    ///
    /// # Safety
    /// `m` is a live mbuf the caller owns and nobody else references.
    #[inline]
    pub(super) unsafe fn set_len(m: *mut rte_mbuf, len: u16) -> bool {
        // SAFETY: the caller's guarantee; the length fields are written only after
        // checking the room.
        unsafe {
            let mb = &mut *m;
            if mb.data_off as u32 + len as u32 > mb.buf_len as u32 {
                return false;
            }
            mb.data_len = len;
            mb.pkt_len = len as u32;
        }
        true
    }

    /// Grows the data by `n` bytes at the front (as `rte_pktmbuf_prepend`); false,
    /// changing nothing, when the headroom is too small.
    ///
    /// # Safety
    /// As [`set_len`].
    #[inline]
    pub(super) unsafe fn prepend(m: *mut rte_mbuf, n: u16) -> bool {
        // SAFETY: the caller's guarantee; data_off moves back within the buffer only
        // after checking there is room, and data_len/pkt_len stay consistent.
        unsafe {
            let mb = &mut *m;
            if mb.data_off < n || mb.data_len as u32 + n as u32 > u16::MAX as u32 {
                return false;
            }
            mb.data_off -= n;
            mb.data_len += n;
            mb.pkt_len += n as u32;
        }
        true
    }

    /// Shrinks the data by `n` bytes at the front (as `rte_pktmbuf_adj`): they become
    /// headroom. False, changing nothing, when the data is shorter.
    ///
    /// # Safety
    /// As [`set_len`].
    #[inline]
    pub(super) unsafe fn adj(m: *mut rte_mbuf, n: u16) -> bool {
        // SAFETY: the caller's guarantee; data_off moves forward by at most data_len,
        // so it stays within the buffer, and data_len/pkt_len shrink by the same amount.
        unsafe {
            let mb = &mut *m;
            if mb.data_len < n {
                return false;
            }
            mb.data_off += n;
            mb.data_len -= n;
            mb.pkt_len -= n as u32;
        }
        true
    }
}

impl Drop for Burst {
    fn drop(&mut self) {
        self.free_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A burst holding `n` fake mbuf pointers, never dereferenced: the slot checks run
    /// before any read. Forgotten at the end, since freeing them would.
    fn fake_burst(n: usize) -> Burst {
        let mut b = Burst::new();
        for i in 0..n {
            b.mbufs[i] = (0x1000 * (i + 1)) as *mut rte_mbuf;
        }
        // SAFETY: test only; the pointers are never dereferenced and `b` is forgotten.
        unsafe { b.set_len(n) };
        b
    }

    #[test]
    fn a_moved_out_packet_cannot_be_read_and_storage_closes_the_holes() {
        let mut a = fake_burst(3);
        let mut b = Burst::new();
        assert!(a.move_to(1, &mut b));
        let err = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| a.packet(1)))
            .expect_err("reading a moved-out slot panics");
        let msg = err.downcast_ref::<String>().cloned().unwrap_or_default();
        assert!(msg.contains("moved out"), "{msg}");
        assert!(
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let mut c = Burst::new();
                let moved = a.move_to(1, &mut c);
                std::mem::forget(c);
                moved
            }))
            .is_err(),
            "moving a moved-out slot again panics"
        );
        // What DPDK would be handed: the two remaining packets, in order, no null.
        let slots = a.storage();
        // SAFETY: reading two of the burst's own slots.
        let handed = unsafe { [*slots, *slots.add(1)] };
        assert_eq!(handed, [0x1000 as *mut rte_mbuf, 0x3000 as *mut rte_mbuf]);
        assert_eq!(a.len(), 2);
        assert_eq!(b.len(), 1);
        std::mem::forget(a);
        std::mem::forget(b);
    }

    #[test]
    fn a_packet_handle_is_only_made_for_a_live_slot() {
        let mut a = fake_burst(3);
        let mut b = Burst::new();
        assert_eq!(a.packet_at(2).index(), 2);
        assert!(a.move_to(1, &mut b));
        for i in [1, 3] {
            assert!(
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    a.packet_at(i);
                }))
                .is_err(),
                "a handle for slot {i}"
            );
        }
        std::mem::forget(a);
        std::mem::forget(b);
    }
}
