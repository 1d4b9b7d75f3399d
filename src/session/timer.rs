//! A hashed timer wheel with intrusive links, driving session expiry.
//!
//! The wheel is an array of `2^k` list heads, one slot per tick modulo the wheel size.
//! The entries are not owned by the wheel: each lives in the caller's slab and embeds a
//! [`TimerLink`] (next, prev, deadline; `u32` indices into that slab), so arming,
//! re-arming and disarming are a few index writes and never allocate.
//!
//! **Lazy re-arming.** A session is touched on every packet, and almost always only
//! postponed. Moving it between lists each time would write to two neighbours' cache
//! lines per packet; instead a later deadline is only stored in the entry. The entry
//! stays in the slot it was put in, which the wheel reaches *no later* than the old
//! deadline; at that point the entry is either expired (its deadline has passed) or
//! moved to the slot of its current deadline. An earlier deadline (a FIN shortening
//! 900 s to 120 s) would break that invariant, so that case, rare, relinks at once.
//!
//! **Long timeouts.** A deadline further than one revolution away goes to the slot of
//! its tick modulo the wheel size; the wheel meets it once per revolution and re-files
//! it until the deadline comes. With 4096 slots of 10 ms (41 s per revolution) an idle
//! ESTABLISHED session (900 s) is looked at about 22 times in its life.
//!
//! **Bounded work.** [`TimerWheel::advance`] examines at most `budget` entries per call
//! and steps through at most one revolution of slots, then returns; the next call
//! resumes exactly where it stopped. A reached slot's whole list is first spliced, in
//! O(1), onto a "due" list that is worked through from its head: entries the caller
//! re-arms or removes meanwhile are unlinked from it like from any slot, so no cursor
//! can dangle, and re-filed entries go to a slot list, never back onto the due list.
//!
//! Ticks are `u32` and wrap; deadlines are compared with wrapping arithmetic, which is
//! exact while every deadline is less than 2^31 ticks ahead (see [`MAX_DELAY_TICKS`]).

/// End of a list, in [`TimerLink`]'s `next`.
pub const NIL: u32 = u32::MAX;

/// Largest number of slots a wheel may have.
pub const MAX_SLOTS: usize = 1 << 24;

/// Largest entry index the links can address: indices must leave the top bit free,
/// which marks a list head.
pub const MAX_INDEX: u32 = HEAD - 1;

/// Longest delay, in ticks, a caller should arm: it keeps deadlines well inside the
/// half of the `u32` tick range the wrapping comparisons can order, even if the wheel
/// has fallen behind the caller's clock. 2^30 ticks are 12 days at 1 ms a tick.
pub const MAX_DELAY_TICKS: u32 = 1 << 30;

/// Set in `prev` of a list's first entry, with the list number in the low bits: the
/// entry can then be unlinked without knowing which slot it was filed in.
const HEAD: u32 = 1 << 31;

/// `prev` of an entry in no list. Distinct from every `HEAD | list` value since lists
/// number at most `MAX_SLOTS + 1`.
const UNLINKED: u32 = u32::MAX;

/// The per-entry part of the wheel, embedded in each entry: 12 bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(C)]
pub struct TimerLink {
    /// Next entry in the same list, or [`NIL`]. While an entry is vacant (unarmed, not
    /// in use) its owner may use this field for its own free list.
    pub(super) next: u32,
    /// Previous entry, `HEAD | list` for the first entry, [`UNLINKED`] if unarmed.
    prev: u32,
    /// The tick at which the entry expires.
    deadline: u32,
}

impl TimerLink {
    /// An unarmed link.
    pub const fn new() -> TimerLink {
        TimerLink {
            next: NIL,
            prev: UNLINKED,
            deadline: 0,
        }
    }

    #[inline]
    pub fn is_armed(&self) -> bool {
        self.prev != UNLINKED
    }

    /// The tick the entry expires at (meaningful while armed).
    #[inline]
    pub fn deadline(&self) -> u32 {
        self.deadline
    }
}

impl Default for TimerLink {
    fn default() -> Self {
        TimerLink::new()
    }
}

/// An entry type that embeds a [`TimerLink`].
pub trait Timed {
    fn timer(&self) -> &TimerLink;
    fn timer_mut(&mut self) -> &mut TimerLink;
}

impl Timed for TimerLink {
    fn timer(&self) -> &TimerLink {
        self
    }
    fn timer_mut(&mut self) -> &mut TimerLink {
        self
    }
}

/// `deadline` is at or before `now`.
#[inline]
fn is_due(deadline: u32, now: u32) -> bool {
    now.wrapping_sub(deadline) as i32 >= 0
}

/// What one [`TimerWheel::advance`] call did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Advance {
    /// Entries looked at (expired or re-filed): at most the budget.
    pub examined: usize,
    /// Entries expired (passed to the callback).
    pub expired: usize,
    /// The wheel has reached the requested tick and nothing due is left: calling again
    /// with the same tick would do nothing.
    pub caught_up: bool,
}

/// A hashed timer wheel over entries stored by the caller; see the module docs.
#[derive(Debug)]
pub struct TimerWheel {
    /// One list head per slot, plus the due list at index `slots`.
    heads: Box<[u32]>,
    /// `slots - 1`.
    mask: u32,
    /// The last tick whose slot has been spliced onto the due list.
    now: u32,
    /// Entries in any list, the due list included.
    armed: usize,
}

impl TimerWheel {
    /// A wheel of `slots` slots (a power of two, at most [`MAX_SLOTS`]) that considers
    /// ticks up to `now` already processed.
    pub fn new(slots: usize, now: u32) -> TimerWheel {
        assert!(
            slots.is_power_of_two() && slots <= MAX_SLOTS,
            "timer wheel slots must be a power of two <= {MAX_SLOTS}, not {slots}"
        );
        TimerWheel {
            heads: vec![NIL; slots + 1].into_boxed_slice(),
            mask: (slots - 1) as u32,
            now,
            armed: 0,
        }
    }

    /// Number of slots: one revolution, in ticks.
    pub fn slots(&self) -> usize {
        self.mask as usize + 1
    }

    /// The last tick processed.
    pub fn now(&self) -> u32 {
        self.now
    }

    /// Entries currently armed.
    pub fn armed(&self) -> usize {
        self.armed
    }

    /// Bytes the wheel itself allocated.
    pub fn memory_bytes(&self) -> usize {
        std::mem::size_of_val::<[u32]>(&self.heads)
    }

    /// [`memory_bytes`](Self::memory_bytes) of a wheel of `slots` slots.
    pub fn bytes_for(slots: usize) -> usize {
        (slots + 1) * std::mem::size_of::<u32>()
    }

    #[inline]
    fn due_list(&self) -> u32 {
        self.mask + 1
    }

    /// The list an entry with `deadline` belongs to now.
    #[inline]
    fn list_for(&self, deadline: u32) -> u32 {
        if is_due(deadline, self.now) {
            self.due_list()
        } else {
            deadline & self.mask
        }
    }

    /// Arms entry `id` to expire at tick `deadline`, or re-arms it if armed.
    ///
    /// `now` is the caller's current tick: when nothing is armed the wheel jumps to it,
    /// so the first entry after a long idle period costs no catching up.
    pub fn schedule<T: Timed>(&mut self, nodes: &mut [T], id: u32, now: u32, deadline: u32) {
        debug_assert!(id <= MAX_INDEX);
        let link = nodes[id as usize].timer_mut();
        if !link.is_armed() {
            if self.armed == 0 {
                // Nothing to process between the old tick and this one.
                self.now = now;
            }
            link.deadline = deadline;
            self.push(nodes, id, self.list_for(deadline));
            self.armed += 1;
        } else if is_due(link.deadline, deadline) {
            // Later (or equal): the slot the entry is in comes no later than the old
            // deadline, where the entry will be re-filed. Lazy: one write.
            link.deadline = deadline;
        } else {
            // Earlier: the entry could be found too late where it is. Refile it now.
            link.deadline = deadline;
            self.unlink(nodes, id);
            self.push(nodes, id, self.list_for(deadline));
        }
    }

    /// Makes sure the wheel meets armed entry `id` by tick `visit` (for
    /// [`TimerWheel::advance_visiting`]'s `on_visit`), moving it to that tick's slot
    /// when its deadline comes later. Its deadline is untouched. A `visit` already
    /// due, or not before the deadline, changes nothing.
    pub fn visit_by<T: Timed>(&mut self, nodes: &mut [T], id: u32, visit: u32) {
        let link = nodes[id as usize].timer();
        if link.is_armed()
            && !is_due(visit, self.now)
            && is_due(visit, link.deadline)
            && visit != link.deadline
        {
            self.unlink(nodes, id);
            self.push(nodes, id, visit & self.mask);
        }
    }

    /// Disarms entry `id`. Returns whether it was armed.
    pub fn cancel<T: Timed>(&mut self, nodes: &mut [T], id: u32) -> bool {
        if !nodes[id as usize].timer().is_armed() {
            return false;
        }
        self.unlink(nodes, id);
        self.armed -= 1;
        true
    }

    /// Processes ticks up to `now`, expiring entries whose deadline has come: each is
    /// disarmed, then passed to `on_expire` with its index (which may recycle it).
    ///
    /// Stops after examining `budget` entries or stepping through one revolution of
    /// slots, whichever comes first; see [`Advance::caught_up`].
    pub fn advance<T: Timed>(
        &mut self,
        nodes: &mut [T],
        now: u32,
        budget: usize,
        on_expire: impl FnMut(u32, &mut T),
    ) -> Advance {
        self.advance_visiting(nodes, now, budget, on_expire, |_, _| None)
    }

    /// [`TimerWheel::advance`], also showing `on_visit` each live entry the wheel
    /// meets (filed in a slot before its deadline: postponed since, or a deadline more
    /// than a revolution away). `on_visit` may ask to meet the entry again by a tick of
    /// its own: the entry is then filed in that tick's slot if it comes before the
    /// deadline's. So a caller can look at a long-lived entry at least that often,
    /// at the cost of a re-filing each time; its deadline is untouched.
    pub fn advance_visiting<T: Timed>(
        &mut self,
        nodes: &mut [T],
        now: u32,
        budget: usize,
        mut on_expire: impl FnMut(u32, &mut T),
        mut on_visit: impl FnMut(u32, &T) -> Option<u32>,
    ) -> Advance {
        let mut done = Advance::default();
        let due = self.due_list();
        let mut steps = 0;
        loop {
            // Work through what is due, from the head, one entry at a time.
            loop {
                let id = self.heads[due as usize];
                if id == NIL {
                    break;
                }
                if done.examined == budget {
                    return done;
                }
                done.examined += 1;
                self.unlink(nodes, id);
                let deadline = nodes[id as usize].timer().deadline;
                if is_due(deadline, self.now) {
                    self.armed -= 1;
                    done.expired += 1;
                    on_expire(id, &mut nodes[id as usize]);
                } else {
                    // Postponed since it was filed: file it by its current deadline,
                    // which is in the future, so never onto the due list again; or
                    // by the visit asked for, if that comes first (and after now).
                    let at = match on_visit(id, &nodes[id as usize]) {
                        Some(visit) if !is_due(visit, self.now) && is_due(visit, deadline) => visit,
                        _ => deadline,
                    };
                    self.push(nodes, id, at & self.mask);
                }
            }
            if self.armed == 0 {
                // Nothing anywhere: skip the empty slots, however many.
                self.now = now;
                done.caught_up = true;
                return done;
            }
            if is_due(now, self.now) {
                done.caught_up = true;
                return done;
            }
            if steps == self.slots() {
                return done;
            }
            steps += 1;
            self.now = self.now.wrapping_add(1);
            // Splice the whole slot of the new tick onto the (empty) due list.
            let slot = (self.now & self.mask) as usize;
            let head = self.heads[slot];
            if head != NIL {
                self.heads[slot] = NIL;
                self.heads[due as usize] = head;
                nodes[head as usize].timer_mut().prev = HEAD | due;
            }
        }
    }

    /// Puts an unlinked entry at the head of `list`.
    #[inline]
    fn push<T: Timed>(&mut self, nodes: &mut [T], id: u32, list: u32) {
        let old_head = self.heads[list as usize];
        let link = nodes[id as usize].timer_mut();
        link.next = old_head;
        link.prev = HEAD | list;
        if old_head != NIL {
            nodes[old_head as usize].timer_mut().prev = id;
        }
        self.heads[list as usize] = id;
    }

    /// Takes a linked entry out of its list.
    #[inline]
    fn unlink<T: Timed>(&mut self, nodes: &mut [T], id: u32) {
        let TimerLink { next, prev, .. } = *nodes[id as usize].timer();
        debug_assert_ne!(prev, UNLINKED);
        if prev & HEAD != 0 {
            self.heads[(prev & !HEAD) as usize] = next;
        } else {
            nodes[prev as usize].timer_mut().next = next;
        }
        if next != NIL {
            nodes[next as usize].timer_mut().prev = prev;
        }
        let link = nodes[id as usize].timer_mut();
        link.next = NIL;
        link.prev = UNLINKED;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOTHING: [u32; 0] = [];

    fn nodes(n: usize) -> Vec<TimerLink> {
        vec![TimerLink::new(); n]
    }

    /// Advances to `now` with an unlimited budget, returning the expired ids in order.
    fn run(wheel: &mut TimerWheel, nodes: &mut [TimerLink], now: u32) -> Vec<u32> {
        let mut expired = Vec::new();
        loop {
            let step = wheel.advance(nodes, now, usize::MAX, |id, link| {
                assert!(!link.is_armed());
                expired.push(id);
            });
            if step.caught_up {
                return expired;
            }
        }
    }

    #[test]
    fn expires_exactly_at_its_tick() {
        let mut wheel = TimerWheel::new(64, 0);
        let mut n = nodes(3);
        wheel.schedule(&mut n, 0, 0, 10);
        wheel.schedule(&mut n, 1, 0, 11);
        wheel.schedule(&mut n, 2, 0, 63);
        assert_eq!(wheel.armed(), 3);
        assert_eq!(run(&mut wheel, &mut n, 9), NOTHING);
        assert_eq!(run(&mut wheel, &mut n, 10), [0]);
        assert_eq!(run(&mut wheel, &mut n, 10), NOTHING);
        assert_eq!(run(&mut wheel, &mut n, 62), [1]);
        assert_eq!(run(&mut wheel, &mut n, 63), [2]);
        assert_eq!(wheel.armed(), 0);
        assert!(n.iter().all(|l| !l.is_armed()));
    }

    #[test]
    fn tick_by_tick_matches_one_jump() {
        let mut wheel = TimerWheel::new(8, 0);
        let mut n = nodes(20);
        for id in 0..20 {
            wheel.schedule(&mut n, id, 0, 1 + id * 3);
        }
        for tick in 1..=60 {
            let expired = run(&mut wheel, &mut n, tick);
            let want: Vec<u32> = (0..20).filter(|id| 1 + id * 3 == tick).collect();
            assert_eq!(expired, want, "tick {tick}");
        }
    }

    #[test]
    fn already_due_expires_on_next_advance() {
        let mut wheel = TimerWheel::new(16, 100);
        let mut n = nodes(2);
        wheel.schedule(&mut n, 0, 100, 100);
        wheel.schedule(&mut n, 1, 100, 90);
        let mut got = run(&mut wheel, &mut n, 100);
        got.sort();
        assert_eq!(got, [0, 1]);
    }

    #[test]
    fn rearm_later_pushes_expiry_lazily() {
        let mut wheel = TimerWheel::new(16, 0);
        let mut n = nodes(1);
        wheel.schedule(&mut n, 0, 0, 5);
        assert_eq!(run(&mut wheel, &mut n, 4), NOTHING);
        // Touched at tick 4: now due at 4 + 30, far beyond one revolution.
        wheel.schedule(&mut n, 0, 4, 34);
        assert_eq!(n[0].deadline(), 34);
        let mut examined = 0;
        for tick in 5..34 {
            let step = wheel.advance(&mut n, tick, usize::MAX, |_, _| panic!("early"));
            assert!(step.caught_up);
            examined += step.examined;
        }
        // Looked at in slot 5 (re-filed to slot 34 % 16 = 2) and at tick 18.
        assert_eq!(examined, 2);
        assert_eq!(run(&mut wheel, &mut n, 34), [0]);
    }

    #[test]
    fn rearm_earlier_relinks_at_once() {
        let mut wheel = TimerWheel::new(16, 0);
        let mut n = nodes(2);
        wheel.schedule(&mut n, 0, 0, 900);
        wheel.schedule(&mut n, 1, 0, 900);
        wheel.schedule(&mut n, 0, 3, 7);
        assert_eq!(run(&mut wheel, &mut n, 6), NOTHING);
        assert_eq!(run(&mut wheel, &mut n, 7), [0]);
        // Shortened to the past: due on the next call.
        wheel.schedule(&mut n, 1, 8, 2);
        assert_eq!(run(&mut wheel, &mut n, 8), [1]);
    }

    #[test]
    fn timeouts_longer_than_the_span() {
        let mut wheel = TimerWheel::new(4, 0);
        let mut n = nodes(3);
        wheel.schedule(&mut n, 0, 0, 1000);
        wheel.schedule(&mut n, 1, 0, 1001);
        wheel.schedule(&mut n, 2, 0, 4);
        assert_eq!(run(&mut wheel, &mut n, 4), [2]);
        assert_eq!(run(&mut wheel, &mut n, 999), NOTHING);
        assert_eq!(run(&mut wheel, &mut n, 1000), [0]);
        assert_eq!(run(&mut wheel, &mut n, 1001), [1]);
    }

    #[test]
    fn a_far_jump_takes_bounded_steps_per_call() {
        let mut wheel = TimerWheel::new(16, 0);
        let mut n = nodes(2);
        wheel.schedule(&mut n, 0, 0, 40);
        wheel.schedule(&mut n, 1, 0, 100_000);
        // The first call may not walk 50 revolutions: it stops after one.
        let first = wheel.advance(&mut n, 800, usize::MAX, |_, _| {});
        assert!(!first.caught_up);
        assert_eq!(wheel.now(), 16);
        assert_eq!(run(&mut wheel, &mut n, 800), [0]);
        assert_eq!(wheel.now(), 800);
        assert_eq!(run(&mut wheel, &mut n, 100_000), [1]);
        // Empty wheel: the next jump is immediate.
        let step = wheel.advance(&mut n, 5_000_000, 0, |_, _| {});
        assert!(step.caught_up);
        assert_eq!(wheel.now(), 5_000_000);
    }

    #[test]
    fn small_budget_resumes_where_it_stopped() {
        let mut wheel = TimerWheel::new(8, 0);
        let mut n = nodes(1000);
        for id in 0..1000 {
            wheel.schedule(&mut n, id, 0, 3);
        }
        // A few in the same slot but one revolution later: re-filed, not expired.
        for id in 990..1000 {
            wheel.schedule(&mut n, id, 0, 11);
        }
        let mut expired = Vec::new();
        let mut calls = 0;
        loop {
            calls += 1;
            let step = wheel.advance(&mut n, 3, 7, |id, _| expired.push(id));
            assert!(step.examined <= 7);
            if step.caught_up {
                break;
            }
        }
        assert_eq!(calls, 1000 / 7 + 1);
        expired.sort();
        assert_eq!(expired, (0..990).collect::<Vec<_>>());
        assert_eq!(wheel.armed(), 10);
        let mut later = run(&mut wheel, &mut n, 11);
        later.sort();
        assert_eq!(later, (990..1000).collect::<Vec<_>>());
    }

    #[test]
    fn zero_budget_does_nothing_when_something_is_due() {
        let mut wheel = TimerWheel::new(8, 0);
        let mut n = nodes(1);
        wheel.schedule(&mut n, 0, 0, 1);
        let step = wheel.advance(&mut n, 1, 0, |_, _| {});
        assert_eq!(step, Advance::default());
        assert_eq!(run(&mut wheel, &mut n, 1), [0]);
    }

    #[test]
    fn cancel_head_middle_tail_and_from_the_due_list() {
        let mut wheel = TimerWheel::new(8, 0);
        let mut n = nodes(8);
        for id in 0..5 {
            wheel.schedule(&mut n, id, 0, 2);
        }
        // List order is 4 3 2 1 0: cancel head, middle and tail.
        assert!(wheel.cancel(&mut n, 4));
        assert!(wheel.cancel(&mut n, 2));
        assert!(wheel.cancel(&mut n, 0));
        assert!(!wheel.cancel(&mut n, 0));
        assert_eq!(wheel.armed(), 2);
        let mut got = run(&mut wheel, &mut n, 2);
        got.sort();
        assert_eq!(got, [1, 3]);

        // Stop part way through a slot, then cancel and re-arm entries still due.
        for id in 0..6 {
            wheel.schedule(&mut n, id, 2, 5);
        }
        let mut expired = Vec::new();
        let step = wheel.advance(&mut n, 5, 2, |id, _| expired.push(id));
        assert_eq!((step.expired, step.caught_up), (2, false));
        assert_eq!(expired, [5, 4]);
        assert!(wheel.cancel(&mut n, 2));
        wheel.schedule(&mut n, 1, 5, 9);
        assert_eq!(run(&mut wheel, &mut n, 5), [3, 0]);
        assert_eq!(run(&mut wheel, &mut n, 9), [1]);
        assert_eq!(wheel.armed(), 0);
    }

    #[test]
    fn tick_counter_wraps() {
        let start = u32::MAX - 5;
        let mut wheel = TimerWheel::new(16, start);
        let mut n = nodes(3);
        wheel.schedule(&mut n, 0, start, start.wrapping_add(3)); // u32::MAX - 2
        wheel.schedule(&mut n, 1, start, start.wrapping_add(20)); // 14
        wheel.schedule(&mut n, 2, start, start.wrapping_add(100)); // 94
        assert_eq!(run(&mut wheel, &mut n, u32::MAX - 3), NOTHING);
        assert_eq!(run(&mut wheel, &mut n, u32::MAX - 2), [0]);
        assert_eq!(run(&mut wheel, &mut n, 13), NOTHING);
        assert_eq!(run(&mut wheel, &mut n, 14), [1]);
        assert_eq!(run(&mut wheel, &mut n, 93), NOTHING);
        assert_eq!(run(&mut wheel, &mut n, 94), [2]);
    }

    #[test]
    fn first_arm_after_idle_jumps_ahead() {
        let mut wheel = TimerWheel::new(16, 0);
        let mut n = nodes(1);
        // Far more than 2^31 ticks after the wheel was made: must still order correctly.
        let now = 3_000_000_000;
        wheel.schedule(&mut n, 0, now, now + 5);
        assert_eq!(wheel.now(), now);
        assert_eq!(run(&mut wheel, &mut n, now + 4), NOTHING);
        assert_eq!(run(&mut wheel, &mut n, now + 5), [0]);
    }

    /// (tick, entry id) pairs.
    type Ticked = Vec<(u32, u32)>;

    /// Advances tick by tick to `to`, returning (tick, id) of every visit and expiry;
    /// `visit_every` is what `on_visit` asks for (None: nothing).
    fn visits(
        wheel: &mut TimerWheel,
        n: &mut [TimerLink],
        from: u32,
        to: u32,
        visit_every: Option<u32>,
    ) -> (Ticked, Ticked) {
        let (mut visited, mut expired) = (Vec::new(), Vec::new());
        for tick in from..=to {
            let step = wheel.advance_visiting(
                n,
                tick,
                usize::MAX,
                |id, _| expired.push((tick, id)),
                |id, _| {
                    visited.push((tick, id));
                    visit_every.map(|every| tick + every)
                },
            );
            assert!(step.caught_up);
        }
        (visited, expired)
    }

    #[test]
    fn a_visit_asked_for_comes_before_the_deadline_and_leaves_it_alone() {
        // 16 slots; an entry due at 100, far beyond a revolution.
        let mut wheel = TimerWheel::new(16, 0);
        let mut n = nodes(1);
        wheel.schedule(&mut n, 0, 0, 100);
        // Left alone, the wheel meets it once a revolution (ticks 100 mod 16 = 4, ...).
        let (visited, _) = visits(&mut wheel, &mut n, 1, 40, None);
        assert_eq!(visited, [(4, 0), (20, 0), (36, 0)]);
        // Asking for every 5 ticks: met first where it sits (52, its slot's next
        // turn), then every 5 ticks from there.
        let (visited, expired) = visits(&mut wheel, &mut n, 41, 100, Some(5));
        let ticks: Vec<u32> = visited.iter().map(|v| v.0).collect();
        assert_eq!(ticks, [52, 57, 62, 67, 72, 77, 82, 87, 92, 97]);
        // The deadline is untouched: it expires at 100, not before, not after.
        assert_eq!(expired, [(100, 0)]);
        // A visit asked for at or after the deadline changes nothing.
        wheel.schedule(&mut n, 0, 100, 110);
        let (visited, expired) = visits(&mut wheel, &mut n, 101, 120, Some(50));
        assert!(visited.is_empty(), "{visited:?}");
        assert_eq!(expired, [(110, 0)]);
    }

    #[test]
    fn visit_by_moves_an_entry_ahead_of_its_deadline_only() {
        let mut wheel = TimerWheel::new(64, 0);
        let mut n = nodes(3);
        for id in 0..3 {
            wheel.schedule(&mut n, id, 0, 50);
        }
        wheel.visit_by(&mut n, 0, 10); // before the deadline: met at 10
        wheel.visit_by(&mut n, 1, 50); // at the deadline: nothing
        wheel.visit_by(&mut n, 2, 0); // already due: nothing
        let (visited, expired) = visits(&mut wheel, &mut n, 1, 60, None);
        assert_eq!(visited, [(10, 0)]);
        let mut expired: Vec<u32> = expired.iter().map(|e| e.0).collect();
        expired.dedup();
        assert_eq!(expired, [50], "all three expire at their deadline");
        // Not armed: nothing happens, nothing breaks.
        wheel.visit_by(&mut n, 0, 70);
        assert_eq!(wheel.armed(), 0);
    }

    #[test]
    #[should_panic(expected = "power of two")]
    fn slots_must_be_a_power_of_two() {
        TimerWheel::new(12, 0);
    }
}
