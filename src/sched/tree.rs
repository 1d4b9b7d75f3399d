//! Indexes that make a pick cost independent of the pool size.
//!
//! - [`LoadIndex`]: a tournament (winner tree) over one key per real server, built
//!   from its weight and load. The root holds the choice, so a pick reads one word; a
//!   changed load or weight replays the matches on its leaf's path to the root, O(log
//!   n), and stops early once a match's winner is unchanged and is not that leaf. lc,
//!   wlc, sed, nq and fo use it with their own orders ([`Rank`]).
//! - [`SmoothMax`]: the same tree for smooth weighted round robin, whose running
//!   weights all grow at every pick. Server `i`'s running weight after `t` picks is
//!   the line `weight[i] * t + base[i]`; each match also keeps the first pick at which
//!   its loser would overtake (a kinetic tournament), so a pick replays only the
//!   matches whose order changed, plus the chosen server's path. Once the first
//!   cycle from a fresh start is picked, it is replayed instead.
//!
//! Ties go to the server earlier in list order everywhere, as in the linear scans the
//! schedulers replaced: a match's left side always holds the lower indices, and the
//! right side wins only when strictly better.
use super::{PickContext, ServerLoad};
use crate::model::RealServer;

/// No server, in [`SmoothMax`]: a leaf that cannot take part (weight 0, or padding
/// up to a power of two), or a match without any.
const NONE: u32 = u32::MAX;

/// The order a [`LoadIndex`] picks by: its key of one real server.
pub(crate) trait Rank: Copy + Default {
    /// The key of a server with `weight` > 0 and `load`.
    fn of(weight: u32, load: ServerLoad) -> Self;
    /// The key of a server that cannot take connections (or of no server): it beats
    /// nothing, and every key from [`Rank::of`] beats it. So a match needs no test
    /// for absent players.
    fn absent() -> Self;
    /// Whether `self`, a server later in list order, is strictly preferable to
    /// `earlier` (a tie keeps `earlier`).
    fn beats(&self, earlier: &Self) -> bool;
}

/// Tournament over per-server keys of type `K`; see the module documentation.
#[derive(Clone, Debug)]
pub(crate) struct LoadIndex<K> {
    /// Indexed like the servers: weight (0 drains) and load as last told.
    weights: Vec<u32>,
    loads: Vec<ServerLoad>,
    /// One key per leaf: the server's, or [`Rank::absent`] for a server that cannot
    /// take connections and for the padding up to a power of two.
    keys: Vec<K>,
    /// Implicit binary tree: node 1 is the root, node `k`'s children are `2k` and
    /// `2k + 1`, leaf `i` is node `leaves + i` and holds `i`. Each internal node holds
    /// the leaf that won its match.
    winners: Vec<u32>,
    leaves: usize,
}

impl<K: Rank> LoadIndex<K> {
    /// The index of `servers` with every load zero.
    pub fn new(servers: &[RealServer]) -> Self {
        let mut index = LoadIndex {
            weights: Vec::new(),
            loads: Vec::new(),
            keys: Vec::new(),
            winners: Vec::new(),
            leaves: 0,
        };
        index.rebuild(servers, &[]);
        index
    }

    /// Takes every weight from `servers` and every load from `loads` (missing ones
    /// count as zero) and replays every match: O(n). Allocates only when the number
    /// of servers changed.
    pub fn rebuild(&mut self, servers: &[RealServer], loads: &[ServerLoad]) {
        let n = servers.len();
        if n != self.weights.len() || self.winners.is_empty() {
            self.leaves = n.next_power_of_two();
            self.weights = vec![0; n];
            self.loads = vec![ServerLoad::default(); n];
            self.keys = vec![K::absent(); self.leaves];
            self.winners = (0..2 * self.leaves as u32)
                .map(|node| node.saturating_sub(self.leaves as u32))
                .collect();
        }
        for (i, server) in servers.iter().enumerate() {
            self.weights[i] = server.weight;
            self.loads[i] = loads.get(i).copied().unwrap_or_default();
            self.keys[i] = self.key(i);
        }
        for node in (1..self.leaves).rev() {
            let (left, right) = (self.winners[2 * node], self.winners[2 * node + 1]);
            let right_wins = self.keys[right as usize].beats(&self.keys[left as usize]);
            self.winners[node] = if right_wins { right } else { left };
        }
    }

    /// Server `i`'s key as its weight and load stand.
    #[inline]
    fn key(&self, i: usize) -> K {
        if self.weights[i] > 0 {
            K::of(self.weights[i], self.loads[i])
        } else {
            K::absent()
        }
    }

    /// Re-keys server `index` and replays the matches on its path: O(log n). The
    /// winner climbing the path is carried along with its key, so each level reads
    /// one sibling and its key; which side wins is data, not a pattern a branch
    /// predictor could learn, so it is chosen by conditional moves.
    fn update(&mut self, index: usize) {
        let key = self.key(index);
        self.keys[index] = key;
        let (mut climbing, mut climbing_key) = (index as u32, key);
        let mut node = self.leaves + index;
        // With one server its leaf is the root: the loop does not run.
        while node > 1 {
            let sibling = self.winners[node ^ 1];
            let sibling_key = self.keys[sibling as usize];
            // The left player stays on a tie: the climbing one wins from the left
            // unless the sibling beats it, from the right only if it beats the sibling.
            let from_right = climbing_key.beats(&sibling_key);
            let from_left = !sibling_key.beats(&climbing_key);
            let climbing_wins =
                std::hint::select_unpredictable(node & 1 == 1, from_right, from_left);
            let (winner, winner_key) = std::hint::select_unpredictable(
                climbing_wins,
                (climbing, climbing_key),
                (sibling, sibling_key),
            );
            node /= 2;
            // An unchanged winner other than `index` has an unchanged key: every
            // match above sees the same players.
            if winner == self.winners[node] && winner != index as u32 {
                return;
            }
            self.winners[node] = winner;
            (climbing, climbing_key) = (winner, winner_key);
        }
    }

    /// Server `index` now has `load`. Ignored past the end of the list.
    #[inline]
    pub fn set_load(&mut self, index: usize, load: ServerLoad) {
        if index < self.loads.len() && self.loads[index] != load {
            self.loads[index] = load;
            self.update(index);
        }
    }

    /// Server `index` now has `weight` (0: draining). Ignored past the end.
    pub fn set_weight(&mut self, index: usize, weight: u32) {
        if index < self.weights.len() && self.weights[index] != weight {
            self.weights[index] = weight;
            self.update(index);
        }
    }

    /// The choice for a new connection. When the caller tracks loads (it tells every
    /// change with [`LoadIndex::set_load`] and says so in `ctx`) and the list is the
    /// one the index was built for, this is one read. Otherwise the index first takes
    /// weights from `servers` and loads from `ctx`, O(n), so a caller that hands loads
    /// in the context gets exactly what it handed.
    #[inline]
    pub fn pick(&mut self, servers: &[RealServer], ctx: &PickContext) -> Option<usize> {
        if !ctx.loads_tracked || servers.len() != self.weights.len() {
            self.rebuild(servers, ctx.loads);
        }
        self.winner()
    }

    /// The winner as things stand: one read. A root whose winner cannot take
    /// connections means nobody can (every real key beats an absent one).
    #[inline]
    pub fn winner(&self) -> Option<usize> {
        // At least two nodes: with one server its leaf is the root.
        let winner = self.winners[1] as usize;
        (self.weights.get(winner).is_some_and(|&w| w > 0)).then_some(winner)
    }

    /// The number of servers.
    pub fn len(&self) -> usize {
        self.weights.len()
    }

    /// Every server's load as last told, indexed like the servers.
    #[inline]
    pub fn loads(&self) -> &[ServerLoad] {
        &self.loads
    }

    /// Server `index`'s weight as last told (0 past the end).
    #[inline]
    pub fn weight(&self, index: usize) -> u32 {
        self.weights.get(index).copied().unwrap_or(0)
    }
}

/// Smooth weighted round robin's running weights, with the strictly largest (first in
/// list order on ties) kept at the root; see the module documentation.
///
/// From a fresh start (every running weight 0) the sequence is periodic: after
/// `total / g` picks (`g` the weights' greatest common divisor) every running weight
/// is 0 again. So the first cycle is recorded as it is picked, checked to end back at
/// zero, and then replayed: one read per pick. A cycle longer than [`MAX_CYCLE`], or
/// a weight changed in the middle, keeps the tournament picking.
#[derive(Clone, Debug)]
pub(crate) struct SmoothMax {
    /// Per server: weight (0: takes no part) and `base`, so that its running weight
    /// after `picks` picks is `weight * picks + base`. 128 bits: `picks` grows without
    /// bound and a base loses the total weight at every pick of its server.
    weights: Vec<u32>,
    bases: Vec<i128>,
    /// Implicit tree as in [`LoadIndex`]: winner index per node, and per node the
    /// first pick number at which a match in its subtree may change winner.
    winners: Vec<u32>,
    changes_at: Vec<u64>,
    leaves: usize,
    /// Picks made by the tournament so far (the `t` of the lines).
    picks: u64,
    /// Sum of the weights of the servers that take part.
    total: i128,
    /// The first cycle's picks while it is recorded, then the whole cycle.
    cycle: Vec<u16>,
    /// Where the recording stands: the cycle's length while recording, nothing when
    /// not recording.
    recording: Option<usize>,
    /// While replaying: the position of the next pick in `cycle`.
    replaying: Option<usize>,
}

/// The longest smooth-WRR cycle recorded for replay: 2^18 picks (512 KiB).
pub(crate) const MAX_CYCLE: u64 = 1 << 18;

impl SmoothMax {
    /// Running weights all 0 for `servers` (the sequence starts afresh).
    pub fn new(servers: &[RealServer]) -> Self {
        let n = servers.len();
        let leaves = n.next_power_of_two();
        let mut max = SmoothMax {
            weights: servers.iter().map(|s| s.weight).collect(),
            bases: vec![0; n],
            winners: vec![NONE; 2 * leaves],
            changes_at: vec![u64::MAX; 2 * leaves],
            leaves,
            picks: 0,
            total: servers.iter().map(|s| i128::from(s.weight)).sum(),
            cycle: Vec::new(),
            recording: None,
            replaying: None,
        };
        for (i, server) in servers.iter().enumerate() {
            if server.weight > 0 {
                max.winners[leaves + i] = i as u32;
            }
        }
        for node in (1..leaves).rev() {
            max.play(node);
        }
        let divisor = servers
            .iter()
            .fold(0u64, |g, s| gcd(g, u64::from(s.weight)));
        if divisor > 0 && n <= usize::from(u16::MAX) + 1 {
            let period = max.total as u64 / divisor;
            if period <= MAX_CYCLE {
                max.cycle.reserve_exact(period as usize);
                max.recording = Some(period as usize);
            }
        }
        max
    }

    pub fn len(&self) -> usize {
        self.weights.len()
    }

    /// Server `i`'s running weight after `t` picks.
    #[inline]
    fn value(&self, i: u32, t: u64) -> i128 {
        i128::from(self.weights[i as usize]) * i128::from(t) + self.bases[i as usize]
    }

    /// Replays the match at internal node `node` at the current pick number: its
    /// winner, and the first pick at which its loser would win or anything below it
    /// change.
    fn play(&mut self, node: usize) {
        let (left, right) = (self.winners[2 * node], self.winners[2 * node + 1]);
        let below = self.changes_at[2 * node].min(self.changes_at[2 * node + 1]);
        let t = self.picks;
        let (winner, change) = if left == NONE {
            (right, u64::MAX)
        } else if right == NONE {
            (left, u64::MAX)
        } else {
            let (lv, rv) = (self.value(left, t), self.value(right, t));
            let (lw, rw) = (
                i128::from(self.weights[left as usize]),
                i128::from(self.weights[right as usize]),
            );
            let (lb, rb) = (self.bases[left as usize], self.bases[right as usize]);
            if rv > lv {
                // Left wins again at the first t' with lw*t' + lb >= rw*t' + rb, which
                // needs a steeper left line: t' = ceil((rb - lb) / (lw - rw)), and
                // rb - lb > (lw - rw) * t >= 0 since right leads now.
                let change = if lw > rw {
                    let (num, den) = (rb - lb, lw - rw);
                    clamp_pick(divide(num + den - 1, den))
                } else {
                    u64::MAX
                };
                (right, change)
            } else {
                // Right overtakes at the first t' with rw*t' + rb > lw*t' + lb:
                // t' = floor((lb - rb) / (rw - lw)) + 1, with lb - rb >= 0.
                let change = if rw > lw {
                    clamp_pick(divide(lb - rb, rw - lw) + 1)
                } else {
                    u64::MAX
                };
                (left, change)
            }
        };
        self.winners[node] = winner;
        self.changes_at[node] = change.min(below);
    }

    /// Replays every match whose order may have changed by the current pick number.
    fn settle(&mut self, node: usize) {
        if node >= self.leaves || self.changes_at[node] > self.picks {
            return;
        }
        self.settle(2 * node);
        self.settle(2 * node + 1);
        self.play(node);
    }

    /// Replays the matches on leaf `index`'s path.
    fn replay_path(&mut self, index: usize) {
        let mut node = (self.leaves + index) / 2;
        while node >= 1 {
            self.play(node);
            node /= 2;
        }
    }

    /// The next server in the smooth sequence: every running weight grows by its
    /// weight, the largest wins and loses the total. One read when replaying a
    /// recorded cycle; otherwise the tournament replays the matches whose order
    /// changed and the winner's path.
    #[inline]
    pub fn pick(&mut self) -> Option<usize> {
        if let Some(position) = self.replaying {
            let winner = self.cycle[position];
            let next = position + 1;
            self.replaying = Some(if next == self.cycle.len() { 0 } else { next });
            return Some(usize::from(winner));
        }
        self.pick_from_tournament()
    }

    fn pick_from_tournament(&mut self) -> Option<usize> {
        if self.total == 0 {
            // Nobody takes part: nothing grows (as the scan, which adds nothing).
            return None;
        }
        self.picks += 1;
        // With one server its leaf is the root and there is no match to replay.
        self.settle(1);
        let winner = self.winners[1];
        if winner == NONE {
            return None;
        }
        self.bases[winner as usize] -= self.total;
        self.replay_path(winner as usize);
        if let Some(period) = self.recording {
            self.cycle.push(winner as u16);
            if self.cycle.len() == period {
                self.recording = None;
                // Back at zero, as smooth WRR is from a fresh start: replay from now
                // on. (Were it not, the tournament would simply go on.)
                if (0..self.weights.len()).all(|i| self.value(i as u32, self.picks) == 0) {
                    self.replaying = Some(0);
                    self.picks = 0;
                    self.bases.fill(0);
                } else {
                    self.cycle = Vec::new();
                }
            }
        }
        Some(winner as usize)
    }

    /// Leaves replay at its current position: the tournament's state is set to the
    /// running weights there (each server's weight times the position, less the total
    /// for each of its picks so far in the cycle). O(position + n); only on a weight
    /// change.
    fn stop_replaying(&mut self) {
        let Some(position) = self.replaying.take() else {
            return;
        };
        self.picks = position as u64;
        self.bases.fill(0);
        for &i in &self.cycle[..position] {
            self.bases[usize::from(i)] -= self.total;
        }
        self.cycle = Vec::new();
        self.changes_at.fill(u64::MAX);
        for node in (1..self.leaves).rev() {
            self.play(node);
        }
    }

    /// Server `index`'s weight as it was last set.
    pub fn weight(&self, index: usize) -> u32 {
        self.weights[index]
    }

    /// Server `index` now has `weight` (0: takes no part). Its running weight keeps
    /// its value and grows by the new weight from the next pick on, as when the scan
    /// reads a changed weight. Ignored past the end.
    pub fn set_weight(&mut self, index: usize, weight: u32) {
        let Some(&old) = self.weights.get(index) else {
            return;
        };
        self.stop_replaying();
        self.recording = None;
        self.cycle = Vec::new();
        let t = i128::from(self.picks);
        let running = self.value(index as u32, self.picks);
        self.total += i128::from(weight) - i128::from(old);
        self.weights[index] = weight;
        self.bases[index] = running - i128::from(weight) * t;
        self.winners[self.leaves + index] = if weight > 0 { index as u32 } else { NONE };
        self.replay_path(index);
    }

    /// The running weights, as the scan keeps them (for tests and diagnostics).
    pub fn current_weights(&self) -> Vec<i64> {
        let mut copy = self.clone();
        copy.stop_replaying();
        (0..copy.weights.len())
            .map(|i| copy.value(i as u32, copy.picks) as i64)
            .collect()
    }

    /// Whether picks are replayed from a recorded cycle (for tests).
    #[cfg(test)]
    pub fn replaying(&self) -> bool {
        self.replaying.is_some()
    }
}

/// `num / den` for `den > 0` and `num >= 0`, in 64 bits when both fit (a 128-bit
/// division is a library call several times slower).
#[inline]
fn divide(num: i128, den: i128) -> i128 {
    match (u64::try_from(num), u64::try_from(den)) {
        (Ok(n), Ok(d)) => i128::from(n / d),
        _ => num / den,
    }
}

/// A pick number from a (non-negative) 128-bit one; beyond u64 means never.
#[inline]
fn clamp_pick(t: i128) -> u64 {
    u64::try_from(t).unwrap_or(u64::MAX)
}

/// Greatest common divisor (`gcd(0, x) = x`).
fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}
