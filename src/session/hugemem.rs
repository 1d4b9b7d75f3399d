//! An allocator for the worker's large tables (session slab, key array, hash index)
//! that asks the kernel for transparent 2 MiB pages. With 4 KiB pages a table of a
//! million sessions spans ~45 000 pages and nearly every random lookup also misses
//! the TLB; with 2 MiB pages the whole table fits in the second-level TLB's reach.
//! Small allocations go to the global allocator. Where THP is disabled (`never`), the
//! advice is ignored and the memory is ordinary pages: correct, only slower. Large
//! blocks are faulted in when allocated (see [`prefault`]), never on the fast path.
use allocator_api2::alloc::{AllocError, Allocator, Global, Layout};
use std::ptr::NonNull;

const HUGE_PAGE: usize = 2 << 20;

/// Allocations of at least one huge page are mapped 2 MiB-aligned and advised
/// `MADV_HUGEPAGE`; smaller ones come from the global allocator.
#[derive(Clone, Copy, Debug, Default)]
pub struct HugePageAlloc;

fn mapped_len(layout: Layout) -> usize {
    layout.size().div_ceil(HUGE_PAGE) * HUGE_PAGE
}

/// Touches every 4 KiB page of a fresh anonymous mapping (writing the zero it already
/// holds), so that its page faults happen now, when the table is made, and not on the
/// worker's fast path: a hash index is allocated but not written, and the first
/// sessions then each fault in a new 2 MiB page (measured: ~5 ms of kernel time
/// apiece on a VM, ~200 ms for a burst of 100 new connections, long enough for a
/// worker to miss sending or reading VRRP adverts at a 100 ms interval).
///
/// # Safety
/// `start..start + len` is writable memory of one fresh anonymous mapping that holds
/// zeros and that nothing else references yet.
unsafe fn prefault(start: *mut u8, len: usize) {
    for offset in (0..len).step_by(4096) {
        // SAFETY: inside the `len` bytes the caller vouches for; the byte is zero (fresh
        // anonymous memory) and nobody else holds the block yet.
        unsafe { std::ptr::write_volatile(start.add(offset), 0) };
    }
}

// SAFETY: allocate returns memory valid for the layout (2 MiB-aligned mappings satisfy
// any alignment up to 2 MiB, and larger alignments are refused); deallocate frees
// exactly what allocate mapped, choosing the path by the same size test.
unsafe impl Allocator for HugePageAlloc {
    fn allocate(&self, layout: Layout) -> Result<NonNull<[u8]>, AllocError> {
        if layout.size() < HUGE_PAGE {
            return Global.allocate(layout);
        }
        if layout.align() > HUGE_PAGE {
            return Err(AllocError);
        }
        let len = mapped_len(layout);
        // Map one extra huge page so an aligned start exists, then trim both ends.
        let span = len + HUGE_PAGE;
        // SAFETY: an anonymous private mapping with no address hint; checked below.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                span,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(AllocError);
        }
        let start = raw as usize;
        let aligned = start.next_multiple_of(HUGE_PAGE);
        let head = aligned - start;
        let tail = span - head - len;
        // SAFETY: both ranges lie inside the mapping just made and outside the part we
        // keep; unmapping whole pages of our own mapping cannot fail for other reasons.
        unsafe {
            if head > 0 {
                libc::munmap(raw, head);
            }
            if tail > 0 {
                libc::munmap((aligned + len) as *mut libc::c_void, tail);
            }
            // Advice only: failure (THP disabled) leaves ordinary pages.
            libc::madvise(aligned as *mut libc::c_void, len, libc::MADV_HUGEPAGE);
        }
        // SAFETY: `aligned..aligned + len` is the part of the fresh anonymous mapping
        // kept above, zero-filled, and not yet handed to anyone.
        unsafe { prefault(aligned as *mut u8, len) };
        let ptr = NonNull::new(aligned as *mut u8).ok_or(AllocError)?;
        Ok(NonNull::slice_from_raw_parts(ptr, len))
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, layout: Layout) {
        if layout.size() < HUGE_PAGE {
            // SAFETY: small blocks came from Global with this layout.
            unsafe { Global.deallocate(ptr, layout) };
            return;
        }
        // SAFETY: large blocks are our own mappings of exactly mapped_len bytes.
        unsafe { libc::munmap(ptr.as_ptr() as *mut libc::c_void, mapped_len(layout)) };
    }
}

/// Bytes of `[start, start + len)` resident in memory now, counted page by page as the
/// kernel reports them (`mincore`): what a table really occupies, as opposed to the
/// size it asked for. The range is widened to whole 4 KiB pages.
pub fn resident_bytes(start: *const u8, len: usize) -> std::io::Result<usize> {
    const PAGE: usize = 4096;
    if len == 0 {
        return Ok(0);
    }
    let first = start as usize / PAGE * PAGE;
    let end = (start as usize + len).next_multiple_of(PAGE);
    let pages = (end - first) / PAGE;
    let mut vec = vec![0u8; pages];
    // SAFETY: mincore only reads the page tables of the range and writes one byte per
    // page into `vec`, which has exactly that many; an unmapped range is an error.
    let rc = unsafe { libc::mincore(first as *mut libc::c_void, end - first, vec.as_mut_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(vec.iter().filter(|&&b| b & 1 == 1).count() * PAGE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn large_blocks_are_huge_page_aligned_and_usable() {
        let mut v: allocator_api2::vec::Vec<u64, HugePageAlloc> =
            allocator_api2::vec::Vec::with_capacity_in(1 << 20, HugePageAlloc);
        assert_eq!(v.as_ptr() as usize % HUGE_PAGE, 0);
        v.extend((0..1u64 << 20).map(|i| i * 3));
        assert_eq!(v[12345], 12345 * 3);
        let small: allocator_api2::vec::Vec<u8, HugePageAlloc> =
            allocator_api2::vec::Vec::with_capacity_in(100, HugePageAlloc);
        assert!(small.capacity() >= 100);
    }

    #[test]
    fn resident_bytes_sees_touched_pages_only() {
        let len = 8 << 20;
        // SAFETY: a fresh anonymous mapping, unmapped at the end of the test.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        assert_ne!(raw, libc::MAP_FAILED);
        // Ordinary pages: no THP collapse to fault in neighbours.
        // SAFETY: advice on our own mapping.
        unsafe { libc::madvise(raw, len, libc::MADV_NOHUGEPAGE) };
        let start = raw as *mut u8;
        assert_eq!(resident_bytes(start, len).unwrap(), 0);
        for page in 0..10 {
            // SAFETY: inside the mapping.
            unsafe { std::ptr::write_volatile(start.add(page * 4096 * 3), 1) };
        }
        assert_eq!(resident_bytes(start, len).unwrap(), 10 * 4096);
        // SAFETY: our own mapping, no references into it remain.
        unsafe { libc::munmap(raw, len) };
    }
}
