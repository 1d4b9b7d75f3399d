//! Indexes that make a pick cost independent of the pool size.
//!
//! - [`LoadIndex`]: a tournament (winner tree) over one key per real server, built
//!   from its weight and load. The root holds the choice, so a pick reads one word; a
//!   changed load or weight replays the matches on its leaf's path to the root, O(log
//!   n), and stops early once a match's winner is unchanged and is not that leaf. lc,
//!   wlc, sed and nq use it with their own orders ([`Rank`]).
//! - [`SmoothMax`]: the same tree for smooth weighted round robin, whose running
//!   weights all grow at every pick. Server `i`'s running weight after `t` picks is
//!   the line `weight[i] * t + base[i]`; each match also keeps the first pick at which
//!   its loser would overtake (a kinetic tournament), so a pick replays only the
//!   matches whose order changed, plus the chosen server's path.
//!
//! Ties go to the server earlier in list order everywhere, as in the linear scans the
//! schedulers replaced: a match's left side always holds the lower indices, and the
//! right side wins only when strictly better.
use super::{PickContext, ServerLoad};
use crate::model::RealServer;

/// No server: a leaf that cannot take connections (weight 0, or padding up to a
/// power of two), or a match without any.
const NONE: u32 = u32::MAX;

/// The order a [`LoadIndex`] picks by: its key of one real server.
pub(crate) trait Rank: Copy + Default {
    /// The key of a server with `weight` > 0 and `load`.
    fn of(weight: u32, load: ServerLoad) -> Self;
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
    keys: Vec<K>,
    /// Implicit binary tree: node 1 is the root, node `k`'s children are `2k` and
    /// `2k + 1`, leaf `i` is node `leaves + i`. Each node holds its winner's index.
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
            self.keys = vec![K::default(); n];
            self.winners = vec![NONE; 2 * self.leaves];
        }
        for (i, server) in servers.iter().enumerate() {
            self.weights[i] = server.weight;
            self.loads[i] = loads.get(i).copied().unwrap_or_default();
            self.keys[i] = K::of(server.weight, self.loads[i]);
            self.winners[self.leaves + i] = if server.weight > 0 { i as u32 } else { NONE };
        }
        for node in (1..self.leaves).rev() {
            self.winners[node] = self.play(node);
        }
    }

    /// The winner of the match at internal node `node`, from its children's winners.
    #[inline]
    fn play(&self, node: usize) -> u32 {
        let (left, right) = (self.winners[2 * node], self.winners[2 * node + 1]);
        if left == NONE {
            right
        } else if right == NONE || !self.keys[right as usize].beats(&self.keys[left as usize]) {
            left
        } else {
            right
        }
    }

    /// Re-keys server `index` and replays the matches on its path: O(log n).
    fn update(&mut self, index: usize) {
        let available = self.weights[index] > 0;
        self.keys[index] = K::of(self.weights[index], self.loads[index]);
        let mut node = self.leaves + index;
        self.winners[node] = if available { index as u32 } else { NONE };
        // With one server its leaf is the root: the loop does not run.
        node /= 2;
        while node >= 1 {
            let winner = self.play(node);
            // An unchanged winner other than `index` has an unchanged key: every
            // match above sees the same players.
            if winner == self.winners[node] && winner != index as u32 {
                return;
            }
            self.winners[node] = winner;
            node /= 2;
        }
    }

    /// Server `index` now has `load`. Ignored past the end of the list.
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

    /// The winner as things stand: one read.
    #[inline]
    pub fn winner(&self) -> Option<usize> {
        // `winners` has at least two nodes: with one server its leaf is the root.
        let winner = self.winners[1];
        (winner != NONE).then_some(winner as usize)
    }

    /// The number of servers.
    pub fn len(&self) -> usize {
        self.weights.len()
    }
}

/// Smooth weighted round robin's running weights, with the strictly largest (first in
/// list order on ties) kept at the root; see the module documentation.
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
    /// Picks made so far (the `t` of the lines).
    picks: u64,
    /// Sum of the weights of the servers that take part.
    total: i128,
}

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
        };
        for (i, server) in servers.iter().enumerate() {
            if server.weight > 0 {
                max.winners[leaves + i] = i as u32;
            }
        }
        for node in (1..leaves).rev() {
            max.play(node);
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
                    clamp_pick((num + den - 1) / den)
                } else {
                    u64::MAX
                };
                (right, change)
            } else {
                // Right overtakes at the first t' with rw*t' + rb > lw*t' + lb:
                // t' = floor((lb - rb) / (rw - lw)) + 1, with lb - rb >= 0.
                let change = if rw > lw {
                    clamp_pick((lb - rb) / (rw - lw) + 1)
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
    /// weight, the largest wins and loses the total. O(log n) matches replayed per
    /// pick on weights' usual spreads (those whose order changed, and the winner's
    /// path).
    pub fn pick(&mut self) -> Option<usize> {
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
        Some(winner as usize)
    }

    /// Server `index` now has `weight` (0: takes no part). Its running weight keeps
    /// its value and grows by the new weight from the next pick on, as when the scan
    /// reads a changed weight. Ignored past the end.
    pub fn set_weight(&mut self, index: usize, weight: u32) {
        let Some(&old) = self.weights.get(index) else {
            return;
        };
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
        (0..self.weights.len())
            .map(|i| self.value(i as u32, self.picks) as i64)
            .collect()
    }
}

/// A pick number from a (non-negative) 128-bit one; beyond u64 means never.
#[inline]
fn clamp_pick(t: i128) -> u64 {
    u64::try_from(t).unwrap_or(u64::MAX)
}
