//! The destination-address table of lblc and lblcr: a map from an IPv4 destination to
//! a value (a server, a server set) with a fixed capacity, allocated when the
//! scheduler is built and never grown, so a pick never allocates.
//!
//! - Open addressing with linear probing over a power-of-two slot array at most half
//!   full (slots hold entry numbers); removal by backward shift, so no tombstones.
//! - Entries sit in an arena of `capacity` entries threaded on a doubly linked
//!   least-recently-used list. A lookup hit moves the entry to the front.
//! - When the table is full, inserting replaces the least recently used entry (the
//!   oldest). Entries not used for `expiration_ms` are gone: a lookup treats them as
//!   absent and removes them, and each insert first drops up to two expired entries
//!   from the old end of the list (a bounded share of IPVS's periodic collection).
/// No entry (in a slot, or as a list link).
const NIL: u32 = u32::MAX;

#[derive(Clone, Debug)]
struct Entry<V> {
    key: u32,
    value: V,
    last_use: u64,
    /// Towards the most recently used end.
    prev: u32,
    /// Towards the least recently used end (or the next free entry).
    next: u32,
}

/// Fixed-capacity destination → `V` table with LRU replacement and expiry.
#[derive(Clone, Debug)]
pub(crate) struct LocalityTable<V> {
    slots: Vec<u32>,
    /// `64 - log2(slots.len())`: Fibonacci hashing keeps the top bits.
    shift: u32,
    entries: Vec<Entry<V>>,
    capacity: usize,
    /// Free entries (removed ones), chained through `next`.
    free: u32,
    len: usize,
    /// Most recently used entry.
    head: u32,
    /// Least recently used entry.
    tail: u32,
    expiration_ms: u64,
}

impl<V: Copy> LocalityTable<V> {
    /// A table for up to `capacity` (at least 1) destinations whose entries expire after
    /// `expiration_ms` without use.
    pub(crate) fn new(capacity: usize, expiration_ms: u64) -> Self {
        let capacity = capacity.clamp(1, (u32::MAX / 2) as usize);
        let slot_count = (capacity * 2).next_power_of_two();
        LocalityTable {
            slots: vec![NIL; slot_count],
            shift: 64 - slot_count.trailing_zeros(),
            entries: Vec::with_capacity(capacity),
            capacity,
            free: NIL,
            len: 0,
            head: NIL,
            tail: NIL,
            expiration_ms,
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    #[cfg(test)]
    pub(crate) fn capacity(&self) -> usize {
        self.capacity
    }

    #[inline]
    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    #[inline]
    fn home(&self, key: u32) -> usize {
        (u64::from(key).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> self.shift) as usize
    }

    /// `Ok(slot)` holding `key`, or `Err(slot)`: the empty slot ending its probe run.
    #[inline]
    fn find(&self, key: u32) -> Result<usize, usize> {
        let mask = self.mask();
        let mut slot = self.home(key);
        loop {
            let id = self.slots[slot];
            if id == NIL {
                return Err(slot);
            }
            if self.entries[id as usize].key == key {
                return Ok(slot);
            }
            slot = (slot + 1) & mask;
        }
    }

    #[inline]
    fn expired(&self, id: u32, now_ms: u64) -> bool {
        now_ms.saturating_sub(self.entries[id as usize].last_use) >= self.expiration_ms
    }

    /// The value for `key`, marked used at `now_ms`; None if absent or expired (an
    /// expired entry is removed).
    pub(crate) fn lookup(&mut self, key: u32, now_ms: u64) -> Option<&mut V> {
        let slot = self.find(key).ok()?;
        let id = self.slots[slot];
        if self.expired(id, now_ms) {
            self.remove_at(slot);
            return None;
        }
        self.entries[id as usize].last_use = now_ms;
        self.unlink(id);
        self.push_front(id);
        Some(&mut self.entries[id as usize].value)
    }

    /// The value for `key` without marking it used or expiring it (tests, diagnostics).
    pub(crate) fn peek(&self, key: u32) -> Option<&V> {
        let slot = self.find(key).ok()?;
        Some(&self.entries[self.slots[slot] as usize].value)
    }

    /// Sets `key`'s value, used at `now_ms`. A new key takes a free entry; in a full
    /// table it replaces the least recently used one.
    pub(crate) fn insert(&mut self, key: u32, value: V, now_ms: u64) {
        if let Ok(slot) = self.find(key) {
            let id = self.slots[slot];
            let entry = &mut self.entries[id as usize];
            entry.value = value;
            entry.last_use = now_ms;
            self.unlink(id);
            self.push_front(id);
            return;
        }
        for _ in 0..2 {
            if self.tail != NIL && self.expired(self.tail, now_ms) {
                self.remove_entry(self.tail);
            }
        }
        if self.len == self.capacity {
            self.remove_entry(self.tail);
        }
        let entry = Entry {
            key,
            value,
            last_use: now_ms,
            prev: NIL,
            next: NIL,
        };
        let id = if self.free != NIL {
            let id = self.free;
            self.free = self.entries[id as usize].next;
            self.entries[id as usize] = entry;
            id
        } else {
            // Below capacity: the arena's reserved room, no reallocation.
            self.entries.push(entry);
            (self.entries.len() - 1) as u32
        };
        // The key was absent and removals only shorten runs: probe again.
        let slot = self.find(key).unwrap_err();
        self.slots[slot] = id;
        self.push_front(id);
        self.len += 1;
    }

    fn remove_entry(&mut self, id: u32) {
        let key = self.entries[id as usize].key;
        if let Ok(slot) = self.find(key) {
            self.remove_at(slot);
        }
    }

    /// Removes the entry in `slot`: frees it and closes the gap in its probe run by
    /// shifting back the entries that would no longer be found.
    fn remove_at(&mut self, slot: usize) {
        let id = self.slots[slot];
        self.unlink(id);
        self.entries[id as usize].next = self.free;
        self.free = id;
        self.len -= 1;

        let mask = self.mask();
        let mut hole = slot;
        let mut probe = slot;
        loop {
            probe = (probe + 1) & mask;
            let moved = self.slots[probe];
            if moved == NIL {
                break;
            }
            let home = self.home(self.entries[moved as usize].key);
            // The entry may fill the hole if the hole lies on its probe path, that is,
            // between its home and its slot (cyclically).
            if probe.wrapping_sub(home) & mask >= probe.wrapping_sub(hole) & mask {
                self.slots[hole] = moved;
                hole = probe;
            }
        }
        self.slots[hole] = NIL;
    }

    fn unlink(&mut self, id: u32) {
        let Entry { prev, next, .. } = self.entries[id as usize];
        if prev == NIL {
            self.head = next;
        } else {
            self.entries[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.entries[next as usize].prev = prev;
        }
    }

    fn push_front(&mut self, id: u32) {
        let old_head = self.head;
        {
            let entry = &mut self.entries[id as usize];
            entry.prev = NIL;
            entry.next = old_head;
        }
        if old_head == NIL {
            self.tail = id;
        } else {
            self.entries[old_head as usize].prev = id;
        }
        self.head = id;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insert_lookup_update() {
        let mut table = LocalityTable::new(8, 1000);
        assert_eq!(table.lookup(1, 0), None);
        table.insert(1, 10u32, 0);
        table.insert(2, 20, 0);
        assert_eq!(table.lookup(1, 5).copied(), Some(10));
        table.insert(1, 11, 6);
        assert_eq!(table.lookup(1, 7).copied(), Some(11));
        assert_eq!(table.len(), 2);
        *table.lookup(2, 8).unwrap() = 21;
        assert_eq!(table.peek(2), Some(&21));
    }

    #[test]
    fn full_table_replaces_the_least_recently_used() {
        let mut table = LocalityTable::new(3, u64::MAX);
        table.insert(1, 1u32, 0);
        table.insert(2, 2, 1);
        table.insert(3, 3, 2);
        // Touch 1: now 2 is the oldest.
        assert!(table.lookup(1, 3).is_some());
        table.insert(4, 4, 4);
        assert_eq!(table.len(), 3);
        assert_eq!(table.peek(2), None);
        for key in [1, 3, 4] {
            assert_eq!(table.peek(key), Some(&key));
        }
        assert_eq!(table.capacity(), 3);
    }

    #[test]
    fn entries_expire_after_the_timeout_without_use() {
        let mut table = LocalityTable::new(4, 100);
        table.insert(1, 1u32, 0);
        assert!(table.lookup(1, 99).is_some()); // used at 99: lives until 199
        assert!(table.lookup(1, 198).is_some());
        assert!(table.lookup(1, 298).is_none()); // 100 ms idle: gone
        assert_eq!(table.len(), 0);
        // Inserting collects expired entries from the old end.
        table.insert(2, 2, 0);
        table.insert(3, 3, 0);
        table.insert(4, 4, 150);
        assert_eq!(table.len(), 1);
        // A clock that goes backwards does not expire anything.
        assert!(table.lookup(4, 10).is_some());
    }

    #[test]
    fn churn_against_a_reference_map() {
        // Random inserts, lookups and evictions with colliding keys, checked against a
        // std HashMap that mirrors the LRU policy.
        use std::collections::HashMap;
        let capacity = 64;
        let mut table = LocalityTable::new(capacity, u64::MAX);
        let mut reference: HashMap<u32, (u32, u64)> = HashMap::new();
        let mut rng = crate::model::rng::Rng::new(99);
        for now in 0..50_000u64 {
            let key = rng.below(200) as u32 * 1024; // many keys share low bits
            if rng.below(2) == 0 {
                let got = table.lookup(key, now).copied();
                let want = reference.get_mut(&key).map(|(v, t)| {
                    *t = now;
                    *v
                });
                assert_eq!(got, want, "lookup {key} at {now}");
            } else {
                let value = now as u32;
                if !reference.contains_key(&key) && reference.len() == capacity {
                    let oldest = *reference.iter().min_by_key(|(_, (_, t))| *t).unwrap().0;
                    reference.remove(&oldest);
                }
                reference.insert(key, (value, now));
                table.insert(key, value, now);
            }
            assert_eq!(table.len(), reference.len());
        }
        for (key, (value, _)) in &reference {
            assert_eq!(table.peek(*key), Some(value));
        }
    }

    #[test]
    fn never_allocates_after_construction() {
        let mut table = LocalityTable::new(16, 10);
        let slots = table.slots.as_ptr();
        let entries = table.entries.as_ptr();
        for now in 0..10_000u64 {
            table.insert((now * 7919) as u32, now, now);
        }
        assert_eq!(table.slots.as_ptr(), slots);
        assert_eq!(table.entries.as_ptr(), entries);
        assert!(table.entries.capacity() == 16 && table.len() <= 16);
    }
}
