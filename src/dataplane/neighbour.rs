//! The worker's neighbour tables: IPv4 address -> MAC address (the ARP cache), and
//! the same for IPv6 (the Neighbor Discovery cache), one generic table over the
//! address type.
//!
//! Fixed capacity, allocated once at construction: the data plane never allocates, and
//! a flood of ARP from a segment cannot grow memory; when full, new entries are refused
//! and the caller counts it, unless the caller lets a new entry take the slot of one
//! it does not keep and that has not been heard from for a while
//! ([`NeighbourTable::learn_making_room`]): entries are never expired on a timer (a
//! worker that learns an entry from another is not told when it is confirmed), but
//! addresses that came and went (real servers removed, clients, made-up senders) do
//! not hold their slots for good. Open addressing with linear probing over at least
//! twice as many slots as entries keeps probe sequences short; removal shifts entries
//! back instead of leaving tombstones, so lookups never slow down over time.
//!
//! The hash is keyed, with multipliers drawn from the kernel's random source for each
//! table: anyone on the link can have addresses learned (an ARP request or Neighbor
//! Solicitation from a made-up sender), and with a fixed hash they could choose two
//! thousand whose home slots meet, so that a real server added later sat at the end of
//! one long probe chain that every packet to it would walk.

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::wire::MacAddr;

/// An address a neighbour table is keyed by.
pub trait NeighbourAddr: Copy + Eq + core::fmt::Debug {
    /// The value unused slots hold (never looked up: slots carry `occupied`).
    const UNSPECIFIED: Self;
    /// The address hashed with `key`, whose top bits pick the home slot
    /// (multiply-shift: for a random odd multiplier, two given addresses share their
    /// top bits about as often as random values would).
    fn hash_with(self, key: &HashKey) -> u64;
}

/// A table's hash multipliers, odd.
#[derive(Clone, Copy, Debug)]
pub struct HashKey {
    low: u64,
    high: u64,
}

impl HashKey {
    /// From the kernel's random source (the TSC if that fails); fixed under the
    /// fuzzer, whose runs must repeat to be reproduced.
    pub fn random() -> HashKey {
        if cfg!(fuzzing) {
            return HashKey {
                low: 0x9e37_79b9_7f4a_7c15,
                high: 0xc2b2_ae3d_27d4_eb4f,
            };
        }
        let random = crate::dataplane::forwarder::admission::random_seed;
        HashKey {
            low: random() | 1,
            high: random() | 1,
        }
    }
}

impl NeighbourAddr for Ipv4Addr {
    const UNSPECIFIED: Self = Ipv4Addr::UNSPECIFIED;
    #[inline]
    fn hash_with(self, key: &HashKey) -> u64 {
        u64::from(u32::from(self)).wrapping_mul(key.low)
    }
}

impl NeighbourAddr for Ipv6Addr {
    const UNSPECIFIED: Self = Ipv6Addr::UNSPECIFIED;
    /// Each half under its own multiplier: hosts of one /64 differ in the low half,
    /// /64s in the high, and neither half can be chosen to cancel the other without
    /// the key.
    #[inline]
    fn hash_with(self, key: &HashKey) -> u64 {
        let bits = u128::from(self);
        (bits as u64).wrapping_mul(key.low) ^ ((bits >> 64) as u64).wrapping_mul(key.high)
    }
}

/// The IPv6 neighbour table (Neighbor Discovery cache).
pub type Neighbour6Table = NeighbourTable<Ipv6Addr>;

/// What [`NeighbourTable::learn`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Learn {
    /// A new entry was added.
    Inserted,
    /// The entry existed with another MAC, which was replaced.
    Updated,
    /// The entry existed with the same MAC; only its timestamp was refreshed.
    Unchanged,
    /// No entry existed and the table is full: nothing was stored.
    Full,
    /// A new entry was added in the slot of one the caller does not keep and that had
    /// not been heard from for long enough ([`NeighbourTable::learn_making_room`]).
    Reclaimed,
}

/// How many slots one search for an entry to give up looks at, at most: the work a
/// refused insert costs is bounded whatever fills the table (at the table's load of at
/// most one half, about 32 entries).
const RECLAIM_SCAN: usize = 64;

/// One learned neighbour.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Neighbour<A = Ipv4Addr> {
    pub ip: A,
    pub mac: MacAddr,
    /// TSC when the entry was last learned or confirmed.
    pub updated_tsc: u64,
}

#[derive(Clone, Copy)]
struct Slot<A> {
    occupied: bool,
    /// A static entry (`static_neighbours`): nothing the link sends changes or removes
    /// it, and it is never asked about again.
    pinned: bool,
    neighbour: Neighbour<A>,
    /// TSC when it was last asked about ([`NeighbourTable::mark_rechecked`]; 0: never).
    rechecked_tsc: u64,
}

impl<A: NeighbourAddr> Slot<A> {
    const EMPTY: Slot<A> = Slot {
        occupied: false,
        pinned: false,
        neighbour: Neighbour {
            ip: A::UNSPECIFIED,
            mac: MacAddr::ZERO,
            updated_tsc: 0,
        },
        rechecked_tsc: 0,
    };
}

pub struct NeighbourTable<A = Ipv4Addr> {
    slots: Box<[Slot<A>]>,
    /// log2 of `slots.len()`, for the hash.
    slot_bits: u32,
    key: HashKey,
    capacity: usize,
    len: usize,
    /// Entries added or changed by `learn`/`update_existing` since the last
    /// `take_changes`, for the worker to share with the other workers (a NIC delivers
    /// ARP to one queue only). Fixed size; overflow is reported by `take_changes`.
    changes: [(A, MacAddr); CHANGES],
    changes_len: usize,
    changes_lost: usize,
    /// Entries inserted or changed so far (any source): frames waiting for a next hop
    /// are looked at again only when this moved.
    learned_total: u64,
    /// Where the next search for an entry to give up starts (it goes round the slots).
    reclaim_cursor: usize,
}

/// Changes remembered between two `take_changes` calls (a worker calls it after every
/// burst, and a burst holds at most 32 frames).
const CHANGES: usize = 32;

impl<A: NeighbourAddr> NeighbourTable<A> {
    /// Bytes a table of `capacity` entries allocates.
    pub fn bytes_for(capacity: usize) -> usize {
        Self::slots_for(capacity) * std::mem::size_of::<Slot<A>>()
    }

    fn slots_for(capacity: usize) -> usize {
        capacity.saturating_mul(2).max(2).next_power_of_two()
    }

    /// A table holding at most `capacity` neighbours; all memory is allocated here.
    pub fn with_capacity(capacity: usize) -> NeighbourTable<A> {
        // Load factor at most 1/2; at least two slots so the hash shift stays below 64.
        let slot_count = Self::slots_for(capacity);
        NeighbourTable {
            slots: vec![Slot::EMPTY; slot_count].into_boxed_slice(),
            slot_bits: slot_count.trailing_zeros(),
            key: HashKey::random(),
            capacity,
            len: 0,
            changes: [(A::UNSPECIFIED, MacAddr::ZERO); CHANGES],
            changes_len: 0,
            changes_lost: 0,
            learned_total: 0,
            reclaim_cursor: 0,
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn is_full(&self) -> bool {
        self.len >= self.capacity
    }

    /// The top bits of the keyed hash: the multiply spreads every address bit into
    /// them, so hosts that differ only in their network part do not collide either.
    #[inline]
    fn home_slot(&self, ip: A) -> usize {
        (ip.hash_with(&self.key) >> (64 - self.slot_bits)) as usize
    }

    #[inline]
    fn mask(&self) -> usize {
        self.slots.len() - 1
    }

    /// The slot holding `ip`, or the empty slot where it would go. Terminates because
    /// the table always has an empty slot (len <= capacity < slot count).
    #[inline]
    fn probe(&self, ip: A) -> (usize, bool) {
        let mut index = self.home_slot(ip);
        loop {
            let slot = &self.slots[index];
            if !slot.occupied {
                return (index, false);
            }
            if slot.neighbour.ip == ip {
                return (index, true);
            }
            index = (index + 1) & self.mask();
        }
    }

    #[inline]
    pub fn lookup(&self, ip: A) -> Option<MacAddr> {
        self.get(ip).map(|n| n.mac)
    }

    pub fn get(&self, ip: A) -> Option<&Neighbour<A>> {
        match self.probe(ip) {
            (index, true) => Some(&self.slots[index].neighbour),
            _ => None,
        }
    }

    /// Inserts or updates `ip -> mac`. Never allocates; refuses new entries when full.
    /// A new or changed entry is remembered for `take_changes`.
    pub fn learn(&mut self, ip: A, mac: MacAddr, now_tsc: u64) -> Learn {
        let learned = self.learn_shared(ip, mac, now_tsc);
        self.remember(learned, ip, mac);
        learned
    }

    /// `learn`, but a new entry only while the table holds fewer than `limit`: for
    /// neighbours of lesser standing, which must leave the rest of the table to the
    /// others however many of them come.
    pub fn learn_below(&mut self, ip: A, mac: MacAddr, now_tsc: u64, limit: usize) -> Learn {
        let learned = self.learn_within(ip, mac, now_tsc, limit.min(self.capacity));
        self.remember(learned, ip, mac);
        learned
    }

    /// `learn_below`, but when the table already holds `limit` entries a new entry may
    /// take the slot of one that `keep` does not claim and that has been neither learned
    /// nor confirmed for `min_age_tsc` or more (0: any such entry), found among the next
    /// [`RECLAIM_SCAN`] slots from where the last search stopped ([`Learn::Reclaimed`]);
    /// only when there is none is it refused ([`Learn::Full`]).
    pub fn learn_making_room(
        &mut self,
        ip: A,
        mac: MacAddr,
        now_tsc: u64,
        limit: usize,
        min_age_tsc: u64,
        keep: impl Fn(A) -> bool,
    ) -> Learn {
        let learned = self.learn_reclaiming(ip, mac, now_tsc, limit, min_age_tsc, keep);
        self.remember(learned, ip, mac);
        learned
    }

    /// `learn_making_room` for an entry another worker learned and shared: not
    /// remembered again, so updates never bounce between workers.
    pub fn learn_shared_making_room(
        &mut self,
        ip: A,
        mac: MacAddr,
        now_tsc: u64,
        limit: usize,
        min_age_tsc: u64,
        keep: impl Fn(A) -> bool,
    ) -> Learn {
        self.learn_reclaiming(ip, mac, now_tsc, limit, min_age_tsc, keep)
    }

    fn learn_reclaiming(
        &mut self,
        ip: A,
        mac: MacAddr,
        now_tsc: u64,
        limit: usize,
        min_age_tsc: u64,
        keep: impl Fn(A) -> bool,
    ) -> Learn {
        let limit = limit.min(self.capacity);
        match self.learn_within(ip, mac, now_tsc, limit) {
            Learn::Full if self.reclaim(now_tsc, min_age_tsc, keep) => {
                // A replacement: the table holds as many entries as before, however
                // far past `limit` others (real servers in the reserve) have taken it.
                match self.learn_within(ip, mac, now_tsc, self.capacity) {
                    Learn::Inserted => Learn::Reclaimed,
                    other => other,
                }
            }
            learned => learned,
        }
    }

    /// Removes one entry that `keep` does not claim and that is at least `min_age_tsc`
    /// old, among the next [`RECLAIM_SCAN`] slots; whether one went.
    fn reclaim(&mut self, now_tsc: u64, min_age_tsc: u64, keep: impl Fn(A) -> bool) -> bool {
        let mask = self.mask();
        for _ in 0..RECLAIM_SCAN {
            let index = self.reclaim_cursor;
            self.reclaim_cursor = (index + 1) & mask;
            let slot = &self.slots[index];
            if slot.occupied
                && !slot.pinned
                && now_tsc.saturating_sub(slot.neighbour.updated_tsc) >= min_age_tsc
                && !keep(slot.neighbour.ip)
            {
                self.remove_at(index);
                return true;
            }
        }
        false
    }

    /// Offers `ip -> mac` to the other workers again although it did not change here:
    /// for an answer to a request of ours, which another worker may have asked for after
    /// giving up its own copy, and which only this worker received. Only into the first
    /// half of the changes a round holds: the rest stays for entries that are new or
    /// changed, however many such answers (or forged ones) arrive.
    pub fn share_again(&mut self, ip: A, mac: MacAddr) {
        // A static entry is every worker's already: what the link says of it is no news.
        if self.changes_len < CHANGES / 2 && !self.is_pinned(ip) {
            self.remember(Learn::Inserted, ip, mac);
        }
    }

    /// How many entries neighbours other than real servers may hold: all but a
    /// quarter of the table, which stays for real servers (learned with
    /// [`NeighbourTable::learn`] up to the whole capacity), whatever else asks.
    pub fn unreserved(&self) -> usize {
        self.capacity - self.capacity / 4
    }

    /// `learn` for an entry another worker learned and shared: not remembered again,
    /// so updates never bounce between workers.
    pub fn learn_shared(&mut self, ip: A, mac: MacAddr, now_tsc: u64) -> Learn {
        self.learn_within(ip, mac, now_tsc, self.capacity)
    }

    /// `learn_shared` for what another worker shared, keeping the reserve here too:
    /// a real server's entry may take the whole table, any other a new entry only
    /// within [`NeighbourTable::unreserved`]. The learning worker judged the entry
    /// against its own table, and this one may be fuller.
    pub fn learn_shared_keeping_reserve(
        &mut self,
        ip: A,
        mac: MacAddr,
        now_tsc: u64,
        real_server: bool,
    ) -> Learn {
        let limit = match real_server {
            true => self.capacity,
            false => self.unreserved(),
        };
        self.learn_within(ip, mac, now_tsc, limit)
    }

    fn learn_within(&mut self, ip: A, mac: MacAddr, now_tsc: u64, limit: usize) -> Learn {
        let (index, found) = self.probe(ip);
        if found && self.slots[index].pinned {
            return Learn::Unchanged;
        }
        if found {
            let learned = Self::refresh(&mut self.slots[index].neighbour, mac, now_tsc);
            self.learned_total += u64::from(learned == Learn::Updated);
            return learned;
        }
        if self.len >= limit {
            return Learn::Full;
        }
        self.slots[index] = Slot {
            occupied: true,
            pinned: false,
            neighbour: Neighbour {
                ip,
                mac,
                updated_tsc: now_tsc,
            },
            rechecked_tsc: 0,
        };
        self.len += 1;
        self.learned_total += 1;
        Learn::Inserted
    }

    /// Whether to ask for `ip` again: its entry has been neither learned, confirmed
    /// nor asked about ([`NeighbourTable::mark_rechecked`]) for more than `age_tsc`.
    /// An address with no entry is never due: resolving it is the caller's other job.
    ///
    /// Entries are only ever replaced by what the neighbour itself sends, so a host
    /// that changes its MAC without a gratuitous ARP (a rebuilt VM, a swapped NIC;
    /// Linux sends none by default) would keep getting frames at its old MAC, health
    /// probes included, for as long as the process runs. Asking again finds the new
    /// MAC, and the answer replaces the entry.
    pub fn recheck_due(&self, ip: A, now_tsc: u64, age_tsc: u64) -> bool {
        let (index, true) = self.probe(ip) else {
            return false;
        };
        let slot = &self.slots[index];
        let last = slot.neighbour.updated_tsc.max(slot.rechecked_tsc);
        !slot.pinned && now_tsc.saturating_sub(last) > age_tsc
    }

    /// `ip` was asked about at `now_tsc`: not due again for an age.
    pub fn mark_rechecked(&mut self, ip: A, now_tsc: u64) {
        if let (index, true) = self.probe(ip) {
            self.slots[index].rechecked_tsc = now_tsc;
        }
    }

    /// How many entries were inserted or changed so far.
    pub fn learned_total(&self) -> u64 {
        self.learned_total
    }

    /// Updates `ip` only if it is already known (the RFC 826 merge step for ARP packets
    /// not addressed to us); `None` when it is not in the table.
    pub fn update_existing(&mut self, ip: A, mac: MacAddr, now_tsc: u64) -> Option<Learn> {
        let (index, true) = self.probe(ip) else {
            return None;
        };
        if self.slots[index].pinned {
            return Some(Learn::Unchanged);
        }
        let learned = Self::refresh(&mut self.slots[index].neighbour, mac, now_tsc);
        self.learned_total += u64::from(learned == Learn::Updated);
        self.remember(learned, ip, mac);
        Some(learned)
    }

    /// Makes `ip -> mac` a static entry (the operator's `static_neighbours`): learning,
    /// ARP and Neighbor Discovery, reclaiming, removal and expiry leave it as it is, and
    /// it is never due for asking again, so a host on the link that forges the
    /// neighbour's address cannot take its traffic. Whether it fits (a table full of
    /// other entries refuses it).
    pub fn pin(&mut self, ip: A, mac: MacAddr) -> bool {
        let (index, found) = self.probe(ip);
        if !found && self.len >= self.capacity {
            return false;
        }
        if !found {
            self.len += 1;
        }
        self.slots[index] = Slot {
            occupied: true,
            pinned: true,
            neighbour: Neighbour {
                ip,
                mac,
                updated_tsc: 0,
            },
            rechecked_tsc: 0,
        };
        self.learned_total += 1;
        true
    }

    /// Whether `ip` is a static entry ([`NeighbourTable::pin`]).
    pub fn is_pinned(&self, ip: A) -> bool {
        matches!(self.probe(ip), (index, true) if self.slots[index].pinned)
    }

    fn remember(&mut self, learned: Learn, ip: A, mac: MacAddr) {
        if !matches!(learned, Learn::Inserted | Learn::Updated | Learn::Reclaimed) {
            return;
        }
        match self.changes.get_mut(self.changes_len) {
            Some(slot) => {
                *slot = (ip, mac);
                self.changes_len += 1;
            }
            None => self.changes_lost += 1,
        }
    }

    /// Calls `each` for every entry added or changed since the last call, oldest first,
    /// and forgets them; returns how many changes did not fit in between (lost for
    /// sharing, not for this table).
    pub fn take_changes(&mut self, mut each: impl FnMut(A, MacAddr)) -> usize {
        for &(ip, mac) in &self.changes[..self.changes_len] {
            each(ip, mac);
        }
        self.changes_len = 0;
        std::mem::take(&mut self.changes_lost)
    }

    fn refresh(neighbour: &mut Neighbour<A>, mac: MacAddr, now_tsc: u64) -> Learn {
        neighbour.updated_tsc = now_tsc;
        if neighbour.mac == mac {
            Learn::Unchanged
        } else {
            neighbour.mac = mac;
            Learn::Updated
        }
    }

    /// Removes `ip`, returning its entry; a static one stays.
    pub fn remove(&mut self, ip: A) -> Option<Neighbour<A>> {
        match self.probe(ip) {
            (index, true) if !self.slots[index].pinned => {
                let removed = self.slots[index].neighbour;
                self.remove_at(index);
                Some(removed)
            }
            _ => None,
        }
    }

    /// Empties slot `hole` and shifts later members of its probe run back, so every
    /// entry stays reachable from its home slot without tombstones.
    fn remove_at(&mut self, mut hole: usize) {
        self.slots[hole] = Slot::EMPTY;
        self.len -= 1;
        let mask = self.mask();
        let mut index = (hole + 1) & mask;
        while self.slots[index].occupied {
            let home = self.home_slot(self.slots[index].neighbour.ip);
            // The entry may move into the hole unless its home lies cyclically in
            // (hole, index]: then the hole is before its home and it must stay.
            let home_after_hole =
                (index.wrapping_sub(home) & mask) < (index.wrapping_sub(hole) & mask);
            if !home_after_hole {
                self.slots[hole] = self.slots[index];
                self.slots[index] = Slot::EMPTY;
                hole = index;
            }
            index = (index + 1) & mask;
        }
    }

    /// Removes entries not refreshed for more than `max_age_tsc` cycles; returns how
    /// many went.
    pub fn expire(&mut self, now_tsc: u64, max_age_tsc: u64) -> usize {
        let before = self.len;
        let mut index = 0;
        while index < self.slots.len() {
            let slot = &self.slots[index];
            if slot.occupied
                && !slot.pinned
                && now_tsc.saturating_sub(slot.neighbour.updated_tsc) > max_age_tsc
            {
                // Shifting may pull an unvisited entry into `index`: look at it again.
                self.remove_at(index);
            } else {
                index += 1;
            }
        }
        before - self.len
    }

    pub fn clear(&mut self) {
        self.slots.fill(Slot::EMPTY);
        self.len = 0;
    }

    /// How many slots the table has (entries listed by [`NeighbourTable::slots`] are
    /// at positions below it).
    pub fn slot_count(&self) -> usize {
        self.slots.len()
    }

    /// The entries in the slots of `range` (clamped to the table), with their slot
    /// positions: a listing reads a large table in bounded steps.
    pub fn slots(
        &self,
        range: core::ops::Range<usize>,
    ) -> impl Iterator<Item = (usize, &Neighbour<A>)> + '_ {
        let end = range.end.min(self.slots.len());
        let start = range.start.min(end);
        self.slots[start..end]
            .iter()
            .enumerate()
            .filter(|(_, slot)| slot.occupied)
            .map(move |(i, slot)| (start + i, &slot.neighbour))
    }

    /// All entries, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = &Neighbour<A>> + '_ {
        self.slots
            .iter()
            .filter(|slot| slot.occupied)
            .map(|slot| &slot.neighbour)
    }
}

impl<A> core::fmt::Debug for NeighbourTable<A> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("NeighbourTable")
            .field("len", &self.len)
            .field("capacity", &self.capacity)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn mac(last: u8) -> MacAddr {
        MacAddr([0x02, 0, 0, 0, 0, last])
    }

    #[test]
    fn learn_lookup_update() {
        let mut table = NeighbourTable::with_capacity(4);
        let ip = Ipv4Addr::new(10, 0, 0, 1);
        assert!(table.is_empty());
        assert_eq!(table.lookup(ip), None);
        assert_eq!(table.learn(ip, mac(1), 100), Learn::Inserted);
        assert_eq!(table.lookup(ip), Some(mac(1)));
        assert_eq!(table.learn(ip, mac(1), 200), Learn::Unchanged);
        assert_eq!(table.get(ip).unwrap().updated_tsc, 200);
        assert_eq!(table.learn(ip, mac(2), 300), Learn::Updated);
        assert_eq!(table.lookup(ip), Some(mac(2)));
        assert_eq!(table.len(), 1);
    }

    #[test]
    fn update_existing_never_inserts() {
        let mut table = NeighbourTable::with_capacity(4);
        let known = Ipv4Addr::new(10, 0, 0, 1);
        let stranger = Ipv4Addr::new(10, 0, 0, 9);
        table.learn(known, mac(1), 0);
        assert_eq!(table.update_existing(stranger, mac(9), 5), None);
        assert_eq!(table.lookup(stranger), None);
        assert_eq!(
            table.update_existing(known, mac(3), 5),
            Some(Learn::Updated)
        );
        assert_eq!(
            table.update_existing(known, mac(3), 6),
            Some(Learn::Unchanged)
        );
        assert_eq!(table.lookup(known), Some(mac(3)));
    }

    #[test]
    fn full_table_refuses_new_but_updates_existing() {
        let mut table = NeighbourTable::with_capacity(3);
        for i in 1..=3 {
            assert_eq!(
                table.learn(Ipv4Addr::new(10, 0, 0, i), mac(i), 0),
                Learn::Inserted
            );
        }
        assert!(table.is_full());
        let slots_before = table.slots.as_ptr();
        assert_eq!(
            table.learn(Ipv4Addr::new(10, 0, 0, 4), mac(4), 0),
            Learn::Full
        );
        assert_eq!(
            table.learn(Ipv4Addr::new(10, 0, 0, 2), mac(9), 1),
            Learn::Updated
        );
        assert_eq!(table.len(), 3);
        assert_eq!(table.slots.as_ptr(), slots_before, "no reallocation");
        let mut ips: Vec<_> = table.iter().map(|n| n.ip).collect();
        ips.sort();
        assert_eq!(ips, [1, 2, 3].map(|i| Ipv4Addr::new(10, 0, 0, i)));
    }

    #[test]
    fn zero_capacity_is_always_full() {
        let mut table = NeighbourTable::with_capacity(0);
        assert_eq!(
            table.learn(Ipv4Addr::new(1, 2, 3, 4), mac(1), 0),
            Learn::Full
        );
        assert_eq!(table.lookup(Ipv4Addr::new(1, 2, 3, 4)), None);
    }

    #[test]
    fn expire_and_remove() {
        let mut table = NeighbourTable::with_capacity(8);
        for i in 1..=8u8 {
            table.learn(Ipv4Addr::new(10, 0, 0, i), mac(i), i as u64 * 10);
        }
        assert_eq!(
            table.remove(Ipv4Addr::new(10, 0, 0, 1)).unwrap().mac,
            mac(1)
        );
        assert_eq!(table.remove(Ipv4Addr::new(10, 0, 0, 1)), None);
        // At tsc 100 with max age 50, entries updated before tsc 50 go: 2, 3, 4.
        assert_eq!(table.expire(100, 50), 3);
        assert_eq!(table.len(), 4);
        for i in 5..=8u8 {
            assert_eq!(table.lookup(Ipv4Addr::new(10, 0, 0, i)), Some(mac(i)));
        }
        table.clear();
        assert!(table.is_empty() && table.iter().next().is_none());
    }

    /// Random operations against a `HashMap` model: probe runs, wrap-around and
    /// backward-shift removal must keep every entry reachable.
    #[test]
    fn matches_a_model_under_random_operations() {
        let mut rng = crate::wire::test_util::XorShift(0xdead_beef_cafe_f00d);
        let mut table = NeighbourTable::with_capacity(50);
        let mut model: HashMap<Ipv4Addr, (MacAddr, u64)> = HashMap::new();
        for step in 0..50_000u64 {
            // Few distinct addresses, many collisions: a 7-bit host part in two nets.
            let r = rng.next_u64();
            let ip = Ipv4Addr::new(10, (r >> 8) as u8 & 1, 0, r as u8 & 0x7f);
            match r >> 60 {
                0..=8 => {
                    let m = mac((r >> 16) as u8 & 3);
                    let expected = match model.get(&ip) {
                        Some((old, _)) if *old == m => Learn::Unchanged,
                        Some(_) => Learn::Updated,
                        None if model.len() >= 50 => Learn::Full,
                        None => Learn::Inserted,
                    };
                    assert_eq!(table.learn(ip, m, step), expected);
                    if expected != Learn::Full {
                        model.insert(ip, (m, step));
                    }
                }
                9..=13 => {
                    assert_eq!(
                        table.remove(ip).map(|n| n.mac),
                        model.remove(&ip).map(|e| e.0)
                    );
                }
                14 => {
                    let max_age = 200;
                    let expected = model.len();
                    model.retain(|_, (_, tsc)| step - *tsc <= max_age);
                    assert_eq!(table.expire(step, max_age), expected - model.len());
                }
                _ => {}
            }
            assert_eq!(table.lookup(ip), model.get(&ip).map(|e| e.0));
            assert_eq!(table.len(), model.len());
        }
        for (ip, (m, _)) in &model {
            assert_eq!(table.lookup(*ip), Some(*m));
        }
        assert_eq!(table.iter().count(), model.len());
    }

    /// `learn_making_room` against a `HashMap` model, in a full table with many
    /// collisions: an entry given up is one the caller does not keep and old enough,
    /// exactly one goes per reclaimed insert, and every other entry stays reachable
    /// after the backward shift.
    #[test]
    fn making_room_gives_up_only_stale_entries_not_kept() {
        let mut rng = crate::wire::test_util::XorShift(0x5eed_0f51_07a5_u64);
        let mut table = NeighbourTable::with_capacity(40);
        let mut model: HashMap<Ipv4Addr, (MacAddr, u64)> = HashMap::new();
        // Even host parts are kept (real servers, peers).
        let keep = |ip: Ipv4Addr| ip.octets()[3].is_multiple_of(2);
        let min_age = 300;
        let (mut reclaimed, mut refused) = (0, 0);
        for step in 0..50_000u64 {
            let r = rng.next_u64();
            let ip = Ipv4Addr::new(10, (r >> 8) as u8 & 1, 0, r as u8 & 0x7f);
            let m = mac((r >> 16) as u8 & 3);
            let limit = if r >> 63 == 0 { 40 } else { 30 };
            if (r >> 56) & 0xf == 0 {
                assert_eq!(
                    table.remove(ip).map(|n| n.mac),
                    model.remove(&ip).map(|e| e.0)
                );
                continue;
            }
            let learned = table.learn_making_room(ip, m, step, limit, min_age, keep);
            match learned {
                Learn::Unchanged | Learn::Updated => {
                    let old = model.get(&ip).expect("known").0;
                    assert_eq!(learned == Learn::Unchanged, old == m);
                }
                Learn::Inserted => assert!(!model.contains_key(&ip) && model.len() < limit),
                Learn::Reclaimed => {
                    assert!(!model.contains_key(&ip) && model.len() >= limit);
                    let gone: Vec<Ipv4Addr> = model
                        .keys()
                        .copied()
                        .filter(|&k| table.lookup(k).is_none())
                        .collect();
                    assert_eq!(gone.len(), 1, "one entry per reclaimed insert");
                    let (_, learned_at) = model.remove(&gone[0]).unwrap();
                    assert!(!keep(gone[0]), "a kept entry was given up");
                    assert!(step - learned_at >= min_age, "a fresh entry was given up");
                    reclaimed += 1;
                }
                Learn::Full => {
                    assert!(!model.contains_key(&ip) && model.len() >= limit);
                    refused += 1;
                }
            }
            if learned != Learn::Full {
                model.insert(ip, (m, step));
            }
            assert_eq!(table.len(), model.len());
            for (k, (mac, _)) in &model {
                assert_eq!(table.lookup(*k), Some(*mac), "step {step}");
            }
        }
        assert!(reclaimed > 100 && refused > 100, "{reclaimed} {refused}");
    }

    #[test]
    fn changes_are_remembered_once_for_sharing_and_shared_ones_are_not() {
        let mut table = NeighbourTable::with_capacity(64);
        let (a, b) = (Ipv4Addr::new(198, 18, 0, 1), Ipv4Addr::new(198, 18, 0, 2));
        let (m1, m2) = (MacAddr([2, 0, 0, 0, 0, 1]), MacAddr([2, 0, 0, 0, 0, 2]));
        assert_eq!(table.learn(a, m1, 1), Learn::Inserted);
        assert_eq!(table.learn(a, m1, 2), Learn::Unchanged);
        assert_eq!(table.update_existing(a, m2, 3), Some(Learn::Updated));
        assert_eq!(table.learn_shared(b, m1, 4), Learn::Inserted);
        let mut seen = Vec::new();
        assert_eq!(table.take_changes(|ip, mac| seen.push((ip, mac))), 0);
        assert_eq!(seen, vec![(a, m1), (a, m2)]);
        assert_eq!(table.take_changes(|_, _| panic!("already taken")), 0);
        assert_eq!(table.lookup(b), Some(m1));

        for i in 0..(CHANGES as u8 + 5) {
            table.learn(Ipv4Addr::new(198, 19, 0, i), m1, 5);
        }
        let mut count = 0;
        assert_eq!(table.take_changes(|_, _| count += 1), 5);
        assert_eq!(count, CHANGES);
    }

    #[test]
    fn ipv6_neighbours_live_in_the_same_table() {
        let mut table: NeighbourTable<Ipv6Addr> = NeighbourTable::with_capacity(64);
        // One /64's hosts, and the same host part in other /64s: all kept apart.
        let addr = |net: u16, host: u16| Ipv6Addr::new(0x2001, 0xdb8, 0, net, 0, 0, 0, host);
        for net in 0..4 {
            for host in 1..=16 {
                let learned = table.learn(addr(net, host), mac(host as u8), u64::from(net));
                assert_eq!(learned, Learn::Inserted);
            }
        }
        assert!(table.is_full());
        assert_eq!(table.learn(addr(9, 9), mac(9), 0), Learn::Full);
        for net in 0..4 {
            for host in 1..=16 {
                assert_eq!(table.lookup(addr(net, host)), Some(mac(host as u8)));
            }
        }
        assert_eq!(
            table.update_existing(addr(0, 1), mac(99), 7),
            Some(Learn::Updated)
        );
        assert_eq!(table.update_existing(addr(9, 9), mac(99), 7), None);
        let mut changes = Vec::new();
        table.take_changes(|ip, mac| changes.push((ip, mac)));
        assert_eq!(
            changes.len(),
            32,
            "65 changes: the first 32 kept for sharing"
        );
        assert_eq!(table.remove(addr(0, 1)).map(|n| n.mac), Some(mac(99)));
        assert_eq!(
            table.expire(4, 1),
            63 - 16,
            "entries of nets 0..=2 are too old"
        );
        assert_eq!(table.len(), 16);
    }

    /// An entry is asked about again once neither an answer nor a question touched
    /// it for the age; then not again for another age, unless an answer came.
    #[test]
    fn recheck_is_due_once_per_age_since_the_last_answer_or_question() {
        let mut table = NeighbourTable::with_capacity(4);
        let ip = Ipv4Addr::new(10, 0, 0, 1);
        // Due, and then asked.
        let due = |table: &mut NeighbourTable, now: u64| {
            let due = table.recheck_due(ip, now, 10);
            if due {
                table.mark_rechecked(ip, now);
            }
            due
        };
        assert!(!due(&mut table, 1_000), "no entry: nothing to recheck");
        table.learn(ip, mac(1), 100);
        assert!(!due(&mut table, 110));
        assert!(due(&mut table, 111));
        assert!(!due(&mut table, 112), "asked at 111");
        assert!(!due(&mut table, 121));
        assert!(due(&mut table, 122), "no answer: asked again");
        // The answer (the same MAC, or a new one) restarts the age.
        assert_eq!(table.learn(ip, mac(2), 125), Learn::Updated);
        assert!(!due(&mut table, 135));
        assert!(due(&mut table, 136));
        // Moved by another entry's removal: the mark moves with it.
        let other = Ipv4Addr::new(10, 0, 0, 2);
        table.learn(other, mac(3), 136);
        table.remove(other);
        assert!(!due(&mut table, 140));
    }

    #[test]
    fn a_quarter_is_reserved_and_shared_entries_respect_it() {
        let mut table = NeighbourTable::with_capacity(16);
        assert_eq!(table.unreserved(), 12);
        for i in 0..12u8 {
            let ip = Ipv4Addr::new(10, 0, 0, i);
            let learned = table.learn_shared_keeping_reserve(ip, mac(i), 1, false);
            assert_eq!(learned, Learn::Inserted);
        }
        let next = Ipv4Addr::new(10, 0, 0, 12);
        let learned = table.learn_shared_keeping_reserve(next, mac(12), 1, false);
        assert_eq!(learned, Learn::Full);
        // A known entry is still refreshed, and a shared one never remembered.
        let first = Ipv4Addr::new(10, 0, 0, 0);
        let learned = table.learn_shared_keeping_reserve(first, mac(99), 2, false);
        assert_eq!(learned, Learn::Updated);
        assert_eq!(table.lookup(first), Some(mac(99)));
        // A real server takes the reserve, up to the whole table and no further.
        for i in 12..16u8 {
            let ip = Ipv4Addr::new(10, 0, 0, i);
            let learned = table.learn_shared_keeping_reserve(ip, mac(i), 2, true);
            assert_eq!(learned, Learn::Inserted);
        }
        let beyond = Ipv4Addr::new(10, 0, 0, 16);
        let learned = table.learn_shared_keeping_reserve(beyond, mac(16), 2, true);
        assert_eq!(learned, Learn::Full);
        let mut changes = 0;
        table.take_changes(|_, _| changes += 1);
        assert_eq!(changes, 0);
    }

    /// What the start-up memory check counts for a table is what it allocates.
    #[test]
    fn bytes_for_is_what_a_table_allocates() {
        for capacity in [1, 256, 1000, 4096, 65536] {
            let v4 = NeighbourTable::<Ipv4Addr>::with_capacity(capacity);
            let v6 = Neighbour6Table::with_capacity(capacity);
            assert_eq!(
                std::mem::size_of_val(&*v4.slots),
                NeighbourTable::<Ipv4Addr>::bytes_for(capacity)
            );
            assert_eq!(
                std::mem::size_of_val(&*v6.slots),
                Neighbour6Table::bytes_for(capacity)
            );
        }
        // 40 and 48 bytes a slot, two slots an entry (rounded up to a power of two).
        assert_eq!(NeighbourTable::<Ipv4Addr>::bytes_for(4096), 8192 * 40);
        assert_eq!(Neighbour6Table::bytes_for(4096), 8192 * 48);
    }

    /// The longest distance of an entry from its home slot.
    fn longest_probe<A: NeighbourAddr>(t: &NeighbourTable<A>) -> usize {
        (0..t.slots.len())
            .filter(|&i| t.slots[i].occupied)
            .map(|i| i.wrapping_sub(t.home_slot(t.slots[i].neighbour.ip)) & t.mask())
            .max()
            .unwrap_or(0)
    }

    /// Addresses chosen to share one home slot under a fixed multiplier (Fibonacci
    /// hashing's, as an attacker would choose them for any fixed hash) spread out under
    /// the table's random key: no long probe chain for a real server to land behind.
    #[test]
    fn addresses_chosen_to_collide_under_a_fixed_hash_spread_out() {
        let mut t = NeighbourTable::<Ipv4Addr>::with_capacity(1024);
        let bits = t.slot_bits;
        let fixed = |ip: u32| u64::from(ip).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> (64 - bits);
        let chosen: Vec<Ipv4Addr> = (0xc612_0000u32..)
            .filter(|&ip| fixed(ip) == fixed(0xc612_0000))
            .take(512)
            .map(Ipv4Addr::from)
            .collect();
        for &ip in &chosen {
            assert_eq!(t.learn(ip, MacAddr([2, 0, 0, 0, 0, 1]), 1), Learn::Inserted);
        }
        let longest = longest_probe(&t);
        assert!(longest < 64, "a probe chain of {longest} slots");
        // IPv6: senders whose halves were chosen to cancel under a fixed fold.
        let mut t6 = Neighbour6Table::with_capacity(1024);
        for i in 0..512u64 {
            let high = 0x2001_0db8_0000_0000 | i;
            let low = high.rotate_left(29) ^ 0x5a5a;
            let ip = Ipv6Addr::from((u128::from(high) << 64) | u128::from(low));
            assert_eq!(
                t6.learn(ip, MacAddr([2, 0, 0, 0, 0, 1]), 1),
                Learn::Inserted
            );
        }
        let longest = longest_probe(&t6);
        assert!(longest < 64, "a probe chain of {longest} slots");
    }

    /// A pinned entry: learning, updates, removal, expiry and reclaiming leave it, it
    /// is never due for asking again, and it is never shared as a change.
    #[test]
    fn a_pinned_entry_is_left_as_it_is() {
        let ip = Ipv4Addr::new(198, 18, 0, 20);
        let mut t = NeighbourTable::<Ipv4Addr>::with_capacity(4);
        assert!(t.pin(ip, mac(1)));
        assert!(t.is_pinned(ip));
        assert_eq!(t.len(), 1);
        assert_eq!(t.learn(ip, mac(2), 10), Learn::Unchanged);
        assert_eq!(t.update_existing(ip, mac(3), 10), Some(Learn::Unchanged));
        assert_eq!(t.learn_shared(ip, mac(4), 10), Learn::Unchanged);
        assert_eq!(t.remove(ip), None);
        assert_eq!(t.expire(u64::MAX, 0), 0);
        assert!(!t.recheck_due(ip, u64::MAX, 0));
        assert_eq!(t.lookup(ip), Some(mac(1)));
        assert_eq!(
            t.take_changes(|_, _| panic!("a pinned entry is no change")),
            0
        );
        // A full table makes room for a real server from any entry but the pinned one.
        for last in 21..24 {
            t.learn(Ipv4Addr::new(198, 18, 0, last), mac(last), 0);
        }
        assert!(t.is_full());
        let mut reclaimed = 0;
        for last in 30..40 {
            let learned = t.learn_making_room(
                Ipv4Addr::new(198, 18, 0, last),
                mac(last),
                100,
                4,
                0,
                |_| false,
            );
            reclaimed += usize::from(learned == Learn::Reclaimed);
        }
        assert!(reclaimed > 0);
        assert_eq!(t.lookup(ip), Some(mac(1)), "the pinned entry stays");
        // Pinning an address already learned makes it static.
        let other = Ipv4Addr::new(198, 18, 0, 39);
        assert!(t.pin(other, mac(9)));
        assert_eq!((t.lookup(other), t.len()), (Some(mac(9)), 4));
        assert_eq!(t.learn(other, mac(2), 200), Learn::Unchanged);
    }
}
