//! The order in which a table's TCP sessions were made, so that a table under pressure
//! can give up its oldest half-open or finished sessions first
//! ([`SessionTable::oldest_reclaimable`]).
//!
//! **Why.** A flood of spoofed SYNs opens sessions that never complete. Left alone they
//! fill the table and every new connection is refused until they time out (IPVS's
//! weakness too). Established sessions must never pay for it, and among half-open ones
//! the oldest is the one least likely to complete (its SYN-ACK went unanswered for
//! longest).
//!
//! **How.** A ring of one 32-bit entry per slot of the table: each TCP session, when
//! inserted, is appended as its slot index with the low bits of its creation tick
//! above it. Entries are never removed when their session ends; the ring simply
//! overwrites its oldest entry when full. Reading it from the oldest end, an entry
//! still names its session when the slot is in use, by a TCP session created at a
//! tick with the same low bits; otherwise the slot was freed (and maybe reused) since,
//! and the entry is skipped. With `2^k` slots the ring keeps `32 - k` bits of the tick
//! (12 bits, 41 s at 10 ms ticks, for a million slots): a slot reused by a later
//! session whose tick matches in those bits is taken for the old one, and that later
//! session, if half-open too, goes first. Appending is one store on the insert
//! path.
//!
//! **Cost.** 4 bytes per slot (88 bytes per session in all, from 84), allocated with
//! the table.
use super::hugemem::HugePageAlloc;
use allocator_api2::vec::Vec as HugeVec;

pub(super) struct CreationOrder {
    entries: HugeVec<u32, HugePageAlloc>,
    /// Index of the oldest entry.
    head: u32,
    len: u32,
    slot_bits: u32,
}

impl CreationOrder {
    /// A ring for a table of `capacity` slots; `None` when the memory cannot be had.
    pub(super) fn try_new(capacity: usize) -> Option<Self> {
        let mut entries = HugeVec::new_in(HugePageAlloc);
        entries.try_reserve_exact(capacity).ok()?;
        entries.resize(capacity, 0);
        Some(CreationOrder {
            entries,
            head: 0,
            len: 0,
            slot_bits: slot_bits(capacity),
        })
    }

    /// Bytes a ring for `capacity` slots allocates.
    pub(super) fn bytes_for(capacity: usize) -> usize {
        capacity.saturating_mul(std::mem::size_of::<u32>())
    }

    /// Where the entries are and how many bytes they take.
    pub(super) fn memory(&self) -> (*const u8, usize) {
        (
            self.entries.as_ptr() as *const u8,
            std::mem::size_of_val::<[u32]>(&self.entries),
        )
    }

    /// The tick bits an entry keeps of `created`.
    #[inline]
    pub(super) fn tick_bits(&self, created: u32) -> u32 {
        created
            .checked_shl(self.slot_bits)
            .map_or(0, |t| t >> self.slot_bits)
    }

    /// Appends the session made in `slot` at tick `created`, overwriting the oldest
    /// entry when the ring is full.
    #[inline]
    pub(super) fn push(&mut self, slot: u32, created: u32) {
        let cap = self.entries.len() as u32;
        if cap == 0 {
            return;
        }
        let entry = slot | created.checked_shl(self.slot_bits).unwrap_or(0);
        let at = (self.head + self.len) % cap;
        self.entries[at as usize] = entry;
        if self.len == cap {
            self.head = (self.head + 1) % cap;
        } else {
            self.len += 1;
        }
    }

    /// Takes the oldest entry: its slot and the tick bits it kept.
    #[inline]
    pub(super) fn pop(&mut self) -> Option<(u32, u32)> {
        if self.len == 0 {
            return None;
        }
        let entry = self.entries[self.head as usize];
        self.head = (self.head + 1) % self.entries.len() as u32;
        self.len -= 1;
        let mask = low_mask(self.slot_bits);
        Some((entry & mask, entry.checked_shr(self.slot_bits).unwrap_or(0)))
    }

    /// Entries waiting.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.len as usize
    }
}

/// Bits that hold every slot index below `capacity`.
fn slot_bits(capacity: usize) -> u32 {
    usize::BITS - capacity.saturating_sub(1).leading_zeros()
}

fn low_mask(bits: u32) -> u32 {
    1u32.checked_shl(bits).map_or(u32::MAX, |b| b - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_keep_slot_and_the_low_tick_bits_and_wrap_oldest_first() {
        assert_eq!(slot_bits(1), 0);
        assert_eq!(slot_bits(4), 2);
        assert_eq!(slot_bits(5), 3);
        assert_eq!(slot_bits(1 << 20), 20);
        let mut ring = CreationOrder::try_new(4).unwrap();
        assert_eq!(ring.pop(), None);
        for (slot, tick) in [(0, 7), (3, 8), (1, (1 << 30) + 9)] {
            ring.push(slot, tick);
        }
        assert_eq!(ring.pop(), Some((0, ring.tick_bits(7))));
        assert_eq!(ring.tick_bits(7), 7);
        assert_eq!(
            ring.tick_bits((1 << 30) + 9),
            9,
            "30 bits above two slot bits"
        );
        // Full: the oldest entry is overwritten.
        for (slot, tick) in [(2, 10), (0, 11), (3, 12)] {
            ring.push(slot, tick);
        }
        assert_eq!(ring.len(), 4);
        let rest: Vec<_> = std::iter::from_fn(|| ring.pop()).collect();
        assert_eq!(rest, [(1, 9), (2, 10), (0, 11), (3, 12)]);
        ring.push(3, 13);
        let rest: Vec<_> = std::iter::from_fn(|| ring.pop()).collect();
        assert_eq!(rest, [(3, 13)]);
        assert_eq!(CreationOrder::try_new(0).unwrap().pop(), None);
    }
}
