//! What a node knows about each sync peer, from the messages it accepted: how many,
//! how long ago the last one came (the sync lag an operator watches), the messages
//! lost or reordered on the way (from the sender's sequence numbers), the peer's
//! restarts, and the progress of the bulk resync this node asked it for: a dump that
//! arrives with a gap in its chunk numbers, or stops arriving, is asked for again
//! under a new dump id, a bounded number of times. Pure logic, clocked by the caller.
//!
//! It also decides which authenticated messages are fresh ([`Peers::admit`]): each
//! peer life (epoch) has a sliding window of sequence numbers (as IPsec's
//! anti-replay window, RFC 4303 section 3.4.3), so a message already had, one behind
//! the window, and one from an earlier life are refused. A later life is believed
//! once this node has known an earlier one, or, after this node's own start (when it
//! knows none), when it answers the dump this node asked for under a dump id no
//! earlier message can carry.
use crate::session::replication::{MessageFlags, MessageRepr, MessageType};
use std::net::Ipv4Addr;

/// Sequence numbers the window remembers behind the highest one accepted: a message
/// this far behind (or further) is refused, as one the window cannot tell from a replay.
pub const WINDOW: u64 = 1024;
const WINDOW_WORDS: usize = (WINDOW / 64) as usize;
/// A gap up to this many messages ahead counts as lost; a larger jump (an
/// authenticated sender of this life, so no replay) is counted as `out_of_window`
/// instead, so one odd sequence number cannot make `lost` jump by billions.
pub const LOSS_BOUND: u64 = 65_536;
/// Dumps started for one peer at most this often; further requests are counted and
/// ignored (a replayed or repeated request costs one dump, not one each).
pub const DUMP_INTERVAL_MS: u64 = 1000;
/// How soon after asking a peer for its table, traffic from a life of it this node
/// cannot confirm yet asks again.
pub const UNCONFIRMED_ASK_MS: u64 = 500;
/// After [`RESYNC_ATTEMPTS`] such asks without a life confirmed, each waits twice as
/// long as the one before, up to this: every ask costs the peer a walk of its whole
/// table, and a peer that cannot be confirmed soon (its dumps lost on the way, say)
/// would otherwise pay it every second for as long as its traffic comes.
pub const UNCONFIRMED_ASK_MAX_MS: u64 = 64_000;
/// A dump whose next chunk has not come this long after the request or the last chunk
/// is asked for again.
pub const RESYNC_TIMEOUT_MS: u64 = 2000;
/// How many times a dump is asked for before giving up (until the peer is heard again
/// after a silence).
pub const RESYNC_ATTEMPTS: u32 = 5;
/// A peer silent this long and then heard again has reconnected: a backup asks it for
/// its table again.
pub const SILENCE_MS: u64 = 5000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ResyncState {
    /// Never asked (or this node asks nobody).
    None,
    /// Asked; no chunk yet.
    Requested,
    /// Chunks arriving in order.
    Receiving,
    /// The last chunk came and none was missing.
    Complete,
    /// Asked `RESYNC_ATTEMPTS` times without a complete dump.
    Failed,
}

/// The bulk resync asked of one peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Resync {
    pub state: ResyncState,
    pub dump_id: u32,
    /// Requests sent for this resync (1 + retries).
    pub attempts: u32,
    /// Chunks and records received in order for the current dump id.
    pub chunks: u32,
    pub records: u64,
    /// Time from the first request to the last chunk, once complete.
    pub took_ms: Option<u64>,
    #[serde(skip)]
    started_ms: u64,
    #[serde(skip)]
    progress_ms: u64,
    /// A chunk of the current dump id was missing: it is asked for again, and its
    /// later chunks are no news (each would be the same gap).
    #[serde(skip)]
    gap: bool,
}

impl Resync {
    const IDLE: Resync = Resync {
        state: ResyncState::None,
        dump_id: 0,
        attempts: 0,
        chunks: 0,
        records: 0,
        took_ms: None,
        started_ms: 0,
        progress_ms: 0,
        gap: false,
    };
}

/// The sequence numbers of one peer life seen so far: the highest, and which of the
/// [`WINDOW`] before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Window {
    top: u64,
    /// Bit `i` (word `i / 64`, bit `i % 64`): sequence `top - i` was accepted.
    seen: [u64; WINDOW_WORDS],
}

/// Where a sequence number falls against a [`Window`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Position {
    /// This many ahead of the highest.
    Ahead(u64),
    /// Within the window, not seen yet: late.
    Late,
    /// Within the window and seen: a duplicate or a replay.
    Seen,
    /// Behind the window.
    TooOld,
}

impl Window {
    /// A new life's window at its first accepted message: everything before it counts
    /// as seen, since nothing says which of them were genuine and not yet had.
    fn starting_at(top: u64) -> Window {
        Window {
            top,
            seen: [u64::MAX; WINDOW_WORDS],
        }
    }

    fn position(&self, sequence: u64) -> Position {
        if sequence > self.top {
            return Position::Ahead(sequence - self.top);
        }
        let behind = self.top - sequence;
        if behind >= WINDOW {
            return Position::TooOld;
        }
        let (word, bit) = ((behind / 64) as usize, behind % 64);
        if self.seen[word] & (1 << bit) != 0 {
            Position::Seen
        } else {
            Position::Late
        }
    }

    /// Marks `sequence` seen (a late one, or a new highest: the window slides).
    fn mark(&mut self, sequence: u64) {
        if sequence > self.top {
            let shift = sequence - self.top;
            self.top = sequence;
            if shift >= WINDOW {
                self.seen = [0; WINDOW_WORDS];
            } else {
                let (words, bits) = ((shift / 64) as usize, (shift % 64) as u32);
                for i in (0..WINDOW_WORDS).rev() {
                    let from = |k: usize| i.checked_sub(k).map_or(0, |j| self.seen[j]);
                    let high = from(words) << bits;
                    let low = if bits == 0 {
                        0
                    } else {
                        from(words + 1) >> (64 - bits)
                    };
                    self.seen[i] = high | low;
                }
            }
            self.seen[0] |= 1;
            return;
        }
        let behind = self.top - sequence;
        if behind < WINDOW {
            self.seen[(behind / 64) as usize] |= 1 << (behind % 64);
        }
    }
}

/// One peer as this node sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Peer {
    pub addr: Ipv4Addr,
    /// Messages and records accepted from it.
    pub messages: u64,
    pub records: u64,
    /// Messages missing between two accepted ones (sequence gaps of at most
    /// [`LOSS_BOUND`]): lost on the way or rejected here. With more than one peer, a
    /// dump the peer sent to another node counts too (one sequence per sender).
    pub lost: u64,
    /// Accepted messages more than [`LOSS_BOUND`] ahead of the last one (not counted
    /// as lost).
    pub out_of_window: u64,
    /// Messages that came after a later one (within the window, not had before).
    pub reordered: u64,
    /// Times a later life of it was believed (the peer restarted).
    pub restarts: u64,
    /// Refused: a sequence number of the current life already had (a duplicate or a
    /// replay).
    pub replayed: u64,
    /// Refused: a sequence number [`WINDOW`] or more behind the highest one.
    pub too_old: u64,
    /// Refused: a message of an earlier life of the peer.
    pub old_epoch: u64,
    /// Refused: a life this node cannot yet tell from a replay (it knew none of the
    /// peer's since its own start, and the message answers no dump it asked for).
    pub unconfirmed_epoch: u64,
    /// Resync requests of the peer ignored: a dump had started less than
    /// [`DUMP_INTERVAL_MS`] before.
    pub resync_rate_limited: u64,
    /// The peer's life this node believes (its epoch), once known.
    pub epoch: Option<u64>,
    /// When the last message was accepted (ms on the caller's clock).
    #[serde(skip)]
    pub last_heard_ms: Option<u64>,
    #[serde(skip)]
    window: Option<Window>,
    /// The resync requests served from a life this node cannot confirm: its epoch
    /// and their sequence numbers. Each costs a dump of the whole table, so each is
    /// served once: a replayed one is refused as a believed life's would be.
    #[serde(skip)]
    unconfirmed_requests: Option<(u64, Window)>,
    /// Asks for its table because of traffic from a life not confirmed (a life once
    /// confirmed stays known: a later one is believed from its messages), and when
    /// the last one went out.
    #[serde(skip)]
    confirm_asks: u32,
    #[serde(skip)]
    last_confirm_ask_ms: Option<u64>,
    /// When the last dump for it started.
    #[serde(skip)]
    last_dump_ms: Option<u64>,
    pub resync: Resync,
}

impl Peer {
    /// Counts a refused message under its reason; the refusal.
    fn refuse<T>(&mut self, stale: Stale) -> Result<T, Stale> {
        *match stale {
            Stale::Replayed => &mut self.replayed,
            Stale::TooOld => &mut self.too_old,
            Stale::OldEpoch => &mut self.old_epoch,
            Stale::Unconfirmed => &mut self.unconfirmed_epoch,
        } += 1;
        Err(stale)
    }
}

/// Why a sequence number's place in its life's window refuses it: had already, or
/// behind the window.
fn stale_at(position: Position) -> Option<Stale> {
    match position {
        Position::Seen => Some(Stale::Replayed),
        Position::TooOld => Some(Stale::TooOld),
        Position::Late | Position::Ahead(_) => None,
    }
}

/// Why [`Peers::admit`] refused an authenticated message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stale {
    /// Its sequence number was already had in this life.
    Replayed,
    /// Behind the window.
    TooOld,
    /// From an earlier life.
    OldEpoch,
    /// From a life this node cannot yet confirm.
    Unconfirmed,
}

/// What `Peers::accepted` saw, for the caller to act on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Heard {
    /// Nothing to do.
    Ok,
    /// The first message after at least `SILENCE_MS` of silence.
    AfterSilence,
    /// The dump this node asked for arrived with a gap: ask again.
    DumpGap,
    /// A resync request from a life this node cannot confirm yet: answered (rate
    /// limited), but the life is not believed, and the peer should be asked for its
    /// table (which confirms it).
    Unconfirmed,
}

pub struct Peers {
    peers: Vec<Peer>,
}

impl Peers {
    pub fn new(addrs: impl IntoIterator<Item = Ipv4Addr>) -> Peers {
        Peers {
            peers: addrs
                .into_iter()
                .map(|addr| Peer {
                    addr,
                    messages: 0,
                    records: 0,
                    lost: 0,
                    out_of_window: 0,
                    reordered: 0,
                    restarts: 0,
                    replayed: 0,
                    too_old: 0,
                    old_epoch: 0,
                    unconfirmed_epoch: 0,
                    resync_rate_limited: 0,
                    epoch: None,
                    last_heard_ms: None,
                    window: None,
                    unconfirmed_requests: None,
                    confirm_asks: 0,
                    last_confirm_ask_ms: None,
                    last_dump_ms: None,
                    resync: Resync::IDLE,
                })
                .collect(),
        }
    }

    pub fn iter(&self) -> impl Iterator<Item = &Peer> + '_ {
        self.peers.iter()
    }

    fn get_mut(&mut self, addr: Ipv4Addr) -> Option<&mut Peer> {
        self.peers.iter_mut().find(|p| p.addr == addr)
    }

    /// An authenticated, well-formed message from `from`: is it fresh? Refused (and
    /// counted on the peer) when its sequence number was already had in the peer's
    /// current life or is behind the window, when it comes from an earlier life, or
    /// from a later life this node cannot confirm yet. A later life is believed when
    /// this node knew an earlier one (every message of an earlier life carries a
    /// smaller epoch, so none can be replayed as this one), or when it is a dump chunk
    /// answering the dump this node asked the peer for (a dump id this node's earlier
    /// messages never used). A resync request from an unconfirmed life is let through
    /// (`Heard::Unconfirmed`: the caller rate-limits the dump it costs) without the
    /// life being believed, once: one already let through, one from before the first
    /// let through, or one of an earlier life, is refused. Fresh messages are then
    /// counted as `accepted` does.
    pub fn admit(&mut self, from: Ipv4Addr, m: &MessageRepr, now_ms: u64) -> Result<Heard, Stale> {
        let Some(peer) = self.get_mut(from) else {
            return Ok(Heard::Ok);
        };
        match (peer.epoch, peer.window.as_mut()) {
            (Some(epoch), _) if m.epoch < epoch => return peer.refuse(Stale::OldEpoch),
            (Some(epoch), Some(window)) if m.epoch == epoch => {
                let position = window.position(m.sequence);
                if let Some(stale) = stale_at(position) {
                    return peer.refuse(stale);
                }
                match position {
                    Position::Late => peer.reordered += 1,
                    Position::Ahead(n) if n <= LOSS_BOUND => peer.lost += n - 1,
                    Position::Ahead(_) => peer.out_of_window += 1,
                    Position::Seen | Position::TooOld => {}
                }
                window.mark(m.sequence);
            }
            (known, _) => {
                let r = &peer.resync;
                let answers_us = m.message_type == MessageType::DumpChunk
                    && m.dump_id == r.dump_id
                    && matches!(r.state, ResyncState::Requested | ResyncState::Receiving);
                if known.is_none() && !answers_us {
                    if m.message_type == MessageType::ResyncRequest {
                        let requests = &mut peer.unconfirmed_requests;
                        match requests {
                            Some((epoch, _)) if m.epoch < *epoch => {
                                return peer.refuse(Stale::OldEpoch)
                            }
                            Some((epoch, window)) if m.epoch == *epoch => {
                                if let Some(stale) = stale_at(window.position(m.sequence)) {
                                    return peer.refuse(stale);
                                }
                                window.mark(m.sequence);
                            }
                            _ => *requests = Some((m.epoch, Window::starting_at(m.sequence))),
                        }
                        return Ok(Heard::Unconfirmed);
                    }
                    return peer.refuse(Stale::Unconfirmed);
                }
                peer.restarts += u64::from(known.is_some());
                peer.epoch = Some(m.epoch);
                peer.window = Some(Window::starting_at(m.sequence));
            }
        }
        Ok(self.accepted(from, m, now_ms))
    }

    /// A fresh message from `from` (see `admit`): counted, and the resync progress.
    fn accepted(&mut self, from: Ipv4Addr, m: &MessageRepr, now_ms: u64) -> Heard {
        let Some(peer) = self.get_mut(from) else {
            return Heard::Ok;
        };
        let silent = peer
            .last_heard_ms
            .is_some_and(|t| now_ms.saturating_sub(t) >= SILENCE_MS);
        peer.messages += 1;
        peer.records += u64::from(m.count);
        peer.last_heard_ms = Some(now_ms);
        let heard = if silent {
            Heard::AfterSilence
        } else {
            Heard::Ok
        };
        let r = &mut peer.resync;
        if m.message_type != MessageType::DumpChunk
            || m.dump_id != r.dump_id
            || !matches!(r.state, ResyncState::Requested | ResyncState::Receiving)
        {
            return heard;
        }
        if r.gap {
            return heard;
        }
        if m.chunk != r.chunks {
            r.gap = true;
            return Heard::DumpGap;
        }
        r.chunks += 1;
        r.records += u64::from(m.count);
        r.progress_ms = now_ms;
        if m.flags.contains(MessageFlags::LAST_CHUNK) {
            r.state = ResyncState::Complete;
            r.took_ms = Some(now_ms.saturating_sub(r.started_ms));
        } else {
            r.state = ResyncState::Receiving;
        }
        heard
    }

    /// This node asks `addr` for its table under `dump_id`: a new resync (`retry`
    /// false) or another attempt at the current one. False when the attempts are used
    /// up (the resync is then `Failed`; a new one starts when the peer is heard again).
    pub fn asking(&mut self, addr: Ipv4Addr, dump_id: u32, retry: bool, now_ms: u64) -> bool {
        let Some(peer) = self.get_mut(addr) else {
            return false;
        };
        let r = &mut peer.resync;
        if retry && r.attempts >= RESYNC_ATTEMPTS {
            r.state = ResyncState::Failed;
            return false;
        }
        let (attempts, started_ms) = if retry {
            (r.attempts + 1, r.started_ms)
        } else {
            (1, now_ms)
        };
        *r = Resync {
            state: ResyncState::Requested,
            dump_id,
            attempts,
            chunks: 0,
            records: 0,
            took_ms: None,
            started_ms,
            progress_ms: now_ms,
            gap: false,
        };
        true
    }

    /// Whether a dump for `addr` may start now (none started in the last
    /// [`DUMP_INTERVAL_MS`]); if so, it counts as started. A refusal is counted.
    pub fn may_dump(&mut self, addr: Ipv4Addr, now_ms: u64) -> bool {
        let Some(peer) = self.get_mut(addr) else {
            return false;
        };
        if peer
            .last_dump_ms
            .is_some_and(|t| now_ms.saturating_sub(t) < DUMP_INTERVAL_MS)
        {
            peer.resync_rate_limited += 1;
            return false;
        }
        peer.last_dump_ms = Some(now_ms);
        true
    }

    /// Whether to ask `addr` for its table because of traffic from a life of it this
    /// node cannot confirm: no request of ours went out in the last
    /// [`UNCONFIRMED_ASK_MS`], nor an ask of this kind within its back-off
    /// ([`UNCONFIRMED_ASK_MAX_MS`]). If so, it counts as asked.
    pub fn should_ask_to_confirm(&mut self, addr: Ipv4Addr, now_ms: u64) -> bool {
        let Some(p) = self.get_mut(addr) else {
            return false;
        };
        if p.epoch.is_some() {
            return false;
        }
        let under_way = matches!(
            p.resync.state,
            ResyncState::Requested | ResyncState::Receiving
        ) && now_ms.saturating_sub(p.resync.progress_ms) < UNCONFIRMED_ASK_MS;
        let backed_off = p.last_confirm_ask_ms.is_some_and(|t| {
            let doublings = p
                .confirm_asks
                .saturating_add(1)
                .saturating_sub(RESYNC_ATTEMPTS)
                .min(16);
            let wait = (UNCONFIRMED_ASK_MS << doublings).min(UNCONFIRMED_ASK_MAX_MS);
            now_ms.saturating_sub(t) < wait
        });
        if under_way || backed_off {
            return false;
        }
        p.confirm_asks = p.confirm_asks.saturating_add(1);
        p.last_confirm_ask_ms = Some(now_ms);
        true
    }

    /// Peers whose dump stalled (no chunk for `RESYNC_TIMEOUT_MS`): to ask again.
    pub fn stalled(&self, now_ms: u64) -> impl Iterator<Item = Ipv4Addr> + '_ {
        self.peers.iter().filter_map(move |p| {
            (matches!(
                p.resync.state,
                ResyncState::Requested | ResyncState::Receiving
            ) && now_ms.saturating_sub(p.resync.progress_ms) >= RESYNC_TIMEOUT_MS)
                .then_some(p.addr)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::replication::MessageFlags;

    const A: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 1);
    const STRANGER: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 9);
    const LIFE: u64 = 1_700_000_000_000_000;

    fn batch_of(epoch: u64, sequence: u64) -> MessageRepr {
        MessageRepr {
            message_type: MessageType::SessionBatch,
            flags: MessageFlags::empty(),
            sender: 1,
            recipient: Ipv4Addr::UNSPECIFIED,
            epoch,
            sequence,
            dump_id: 0,
            chunk: 0,
            count: 3,
        }
    }

    fn batch(sequence: u64) -> MessageRepr {
        batch_of(LIFE, sequence)
    }

    fn chunk(sequence: u64, dump_id: u32, chunk: u32, last: bool) -> MessageRepr {
        MessageRepr {
            message_type: MessageType::DumpChunk,
            flags: if last {
                MessageFlags::LAST_CHUNK
            } else {
                MessageFlags::empty()
            },
            dump_id,
            chunk,
            ..batch(sequence)
        }
    }

    fn peer(p: &Peers) -> Peer {
        *p.iter().next().unwrap()
    }

    /// Peers that know `A`'s life `LIFE` from an empty dump it asked for, whose chunk
    /// was sequence `sequence`.
    fn knowing_a(sequence: u64) -> Peers {
        let mut p = Peers::new([A]);
        assert!(p.asking(A, 1, false, 0));
        assert_eq!(p.admit(A, &chunk(sequence, 1, 0, true), 0), Ok(Heard::Ok));
        assert_eq!(peer(&p).epoch, Some(LIFE));
        p
    }

    #[test]
    fn sequence_gaps_reorders_and_restarts_are_told_apart() {
        let mut p = knowing_a(5009);
        for seq in [5010, 5011, 5014, 5013, 5015] {
            assert_eq!(p.admit(A, &batch(seq), 0), Ok(Heard::Ok));
        }
        // 5015 again: had already.
        assert_eq!(p.admit(A, &batch(5015), 0), Err(Stale::Replayed));
        let a = peer(&p);
        assert_eq!((a.messages, a.records), (6, 18));
        // 5012 and 5013 were missing when 5014 came; 5013 then came late.
        assert_eq!((a.lost, a.reordered, a.restarts, a.replayed), (2, 1, 0, 1));
        // A restart: a later life, from 0; the earlier life's messages are then stale.
        assert_eq!(p.admit(A, &batch_of(LIFE + 1, 0), 0), Ok(Heard::Ok));
        assert_eq!(p.admit(A, &batch_of(LIFE + 1, 1), 0), Ok(Heard::Ok));
        assert_eq!(p.admit(A, &batch(5016), 0), Err(Stale::OldEpoch));
        let a = peer(&p);
        assert_eq!((a.lost, a.reordered, a.restarts, a.old_epoch), (2, 1, 1, 1));
        assert_eq!(a.epoch, Some(LIFE + 1));
        // Strangers are not tracked (the receiver rejects them before).
        assert_eq!(p.admit(STRANGER, &batch(5), 0), Ok(Heard::Ok));
        assert_eq!(peer(&p).messages, 8);
    }

    /// Every message of a life, replayed in any order after the genuine run, is
    /// refused: as had (within the window) or too old (behind it); none is accepted
    /// twice, and the counters add up.
    #[test]
    fn replays_are_refused_within_and_behind_the_window() {
        let mut p = knowing_a(0);
        let mut rng = crate::wire::test_util::XorShift(0x5eed_0f7e_91a7);
        // Genuine: 1..=3000 with some losses and local reordering.
        let mut sent: Vec<u64> = (1..=3000).filter(|s| s % 97 != 0).collect();
        for i in (1..sent.len()).step_by(7) {
            sent.swap(i - 1, i);
        }
        let mut accepted = 0;
        for &s in &sent {
            if p.admit(A, &batch(s), 0).is_ok() {
                accepted += 1;
            }
        }
        assert_eq!(accepted, sent.len(), "a fresh run is accepted whole");
        let genuine = peer(&p);
        // Replays: every genuine message again, shuffled.
        for i in (1..sent.len()).rev() {
            sent.swap(i, rng.below(i + 1));
        }
        for &s in &sent {
            let refused = p.admit(A, &batch(s), 0).unwrap_err();
            assert!(
                matches!(refused, Stale::Replayed | Stale::TooOld),
                "{s}: {refused:?}"
            );
        }
        let after = peer(&p);
        assert_eq!(after.messages, genuine.messages);
        assert_eq!(
            after.replayed + after.too_old,
            sent.len() as u64,
            "{after:?}"
        );
        // The window holds the last WINDOW sequence numbers exactly.
        assert_eq!(
            after.too_old,
            (1..=3000 - WINDOW).filter(|s| s % 97 != 0).count() as u64
        );
        // The chunk that confirmed the life, replayed, is refused too.
        assert_eq!(p.admit(A, &chunk(0, 1, 0, true), 0), Err(Stale::TooOld));
    }

    #[test]
    fn the_window_slides_by_any_amount() {
        let mut w = Window::starting_at(100);
        assert_eq!(w.position(100), Position::Seen);
        assert_eq!(w.position(50), Position::Seen, "before the first: as seen");
        for (next, late) in [
            (101u64, None),
            (165, Some(130)),
            (300, Some(236)),
            (5000, Some(4000)),
        ] {
            w.mark(next);
            assert_eq!(w.position(next), Position::Seen);
            assert_eq!(w.position(next + 1), Position::Ahead(1));
            if let Some(late) = late {
                assert_eq!(w.position(late), Position::Late, "{late} after {next}");
                w.mark(late);
                assert_eq!(w.position(late), Position::Seen);
            }
        }
        assert_eq!(w.position(5000 - WINDOW), Position::TooOld);
        assert_eq!(w.position(5000 - WINDOW + 1), Position::Late);
        // 101 and 165 slid out of the window; 4000 is still in it.
        assert_eq!(w.position(4000), Position::Seen);
        assert_eq!(w.position(3999), Position::Late);
    }

    /// A forged or odd sequence number far ahead cannot make `lost` jump: gaps count
    /// as lost up to LOSS_BOUND only, and the messages behind the jump are then too
    /// old.
    #[test]
    fn lost_stays_sane_under_sequence_jumps() {
        let mut p = knowing_a(10);
        p.admit(A, &batch(12), 0).unwrap();
        assert_eq!(peer(&p).lost, 1);
        p.admit(A, &batch(12 + LOSS_BOUND), 0).unwrap();
        assert_eq!(peer(&p).lost, LOSS_BOUND);
        p.admit(A, &batch(u64::MAX - 5), 0).unwrap();
        let a = peer(&p);
        assert_eq!((a.lost, a.out_of_window), (LOSS_BOUND, 1));
        assert_eq!(p.admit(A, &batch(13 + LOSS_BOUND), 0), Err(Stale::TooOld));
    }

    /// After this node's start it knows no life of the peer: batches are refused until
    /// a dump chunk answering its own request confirms one; a resync request is let
    /// through without being believed; a replayed chunk of another dump id confirms
    /// nothing.
    #[test]
    fn a_life_is_believed_only_once_confirmed() {
        let mut p = Peers::new([A]);
        assert_eq!(p.admit(A, &batch(40), 0), Err(Stale::Unconfirmed));
        assert!(p.should_ask_to_confirm(A, 0));
        let request = MessageRepr {
            message_type: MessageType::ResyncRequest,
            dump_id: 77,
            count: 0,
            ..batch(41)
        };
        assert_eq!(p.admit(A, &request, 0), Ok(Heard::Unconfirmed));
        assert_eq!(peer(&p).epoch, None);
        assert!(p.asking(A, 9, false, 10));
        assert!(!p.should_ask_to_confirm(A, 10 + UNCONFIRMED_ASK_MS - 1));
        assert!(p.should_ask_to_confirm(A, 10 + UNCONFIRMED_ASK_MS));
        // A chunk of another dump (an earlier life's, replayed) is no answer.
        assert_eq!(
            p.admit(A, &chunk(42, 8, 0, true), 20),
            Err(Stale::Unconfirmed)
        );
        assert_eq!(p.admit(A, &chunk(43, 9, 0, false), 30), Ok(Heard::Ok));
        assert_eq!(peer(&p).epoch, Some(LIFE));
        assert!(!p.should_ask_to_confirm(A, 10_000));
        assert_eq!(p.admit(A, &batch(44), 40), Ok(Heard::Ok));
        // What came before the confirming chunk is never accepted later.
        assert_eq!(p.admit(A, &batch(40), 50), Err(Stale::Replayed));
        assert_eq!(p.admit(A, &request, 50), Err(Stale::Replayed));
        let a = peer(&p);
        assert_eq!((a.unconfirmed_epoch, a.replayed, a.messages), (2, 2, 2));
    }

    /// A resync request of a life this node cannot confirm costs a dump of the whole
    /// table: a captured one sent again, at any pace, gets none.
    #[test]
    fn a_resync_request_of_an_unconfirmed_life_is_served_once() {
        let mut p = Peers::new([A]);
        let request = |epoch: u64, sequence: u64| MessageRepr {
            message_type: MessageType::ResyncRequest,
            dump_id: 77,
            count: 0,
            ..batch_of(epoch, sequence)
        };
        assert_eq!(p.admit(A, &request(LIFE, 41), 0), Ok(Heard::Unconfirmed));
        for t in [1_000, 60_000, 3_600_000] {
            assert_eq!(p.admit(A, &request(LIFE, 41), t), Err(Stale::Replayed));
        }
        // One sent before it (captured earlier): refused too.
        assert_eq!(p.admit(A, &request(LIFE, 40), 0), Err(Stale::Replayed));
        // The peer's next request, and a later life's, are served; an earlier life's
        // is not.
        assert_eq!(p.admit(A, &request(LIFE, 45), 0), Ok(Heard::Unconfirmed));
        assert_eq!(p.admit(A, &request(LIFE, 43), 0), Ok(Heard::Unconfirmed));
        assert_eq!(p.admit(A, &request(LIFE, 43), 0), Err(Stale::Replayed));
        assert_eq!(p.admit(A, &request(LIFE - 1, 99), 0), Err(Stale::OldEpoch));
        assert_eq!(p.admit(A, &request(LIFE + 1, 0), 0), Ok(Heard::Unconfirmed));
        assert_eq!(p.admit(A, &request(LIFE, 46), 0), Err(Stale::OldEpoch));
        let a = peer(&p);
        assert_eq!(a.epoch, None, "a request confirms no life");
        assert_eq!((a.replayed, a.old_epoch, a.messages), (5, 2, 0));
    }

    /// A chunk lost from the dump this node asked for is one gap (one request again),
    /// not one for every chunk after it.
    #[test]
    fn a_lost_chunk_is_one_gap() {
        let mut p = Peers::new([A]);
        assert!(p.asking(A, 8, false, 0));
        assert_eq!(p.admit(A, &chunk(10, 8, 0, false), 1), Ok(Heard::Ok));
        assert_eq!(p.admit(A, &chunk(12, 8, 2, false), 2), Ok(Heard::DumpGap));
        for (seq, n) in [(13, 3), (14, 4), (15, 5)] {
            assert_eq!(p.admit(A, &chunk(seq, 8, n, n == 5), 3), Ok(Heard::Ok));
        }
        let r = peer(&p).resync;
        assert_eq!((r.state, r.chunks), (ResyncState::Receiving, 1));
        // Asked again: the new dump counts from its first chunk.
        assert!(p.asking(A, 9, true, 4));
        for (seq, n) in [(16, 0), (17, 1)] {
            assert_eq!(p.admit(A, &chunk(seq, 9, n, n == 1), 5), Ok(Heard::Ok));
        }
        let r = peer(&p).resync;
        assert_eq!(
            (r.state, r.chunks, r.attempts),
            (ResyncState::Complete, 2, 2)
        );
    }

    /// A peer whose life cannot be confirmed (no dump ever arrives) is asked every
    /// 500 ms at first, then less and less often, at least once every 64 s; once a
    /// life is confirmed, no more.
    #[test]
    fn asks_to_confirm_back_off() {
        let mut p = Peers::new([A]);
        let mut asked = Vec::new();
        for t in (0..300_000).step_by(100) {
            if p.should_ask_to_confirm(A, t) {
                asked.push(t);
            }
        }
        let gaps: Vec<u64> = asked.windows(2).map(|w| w[1] - w[0]).collect();
        assert_eq!(
            gaps[..10],
            [500, 500, 500, 500, 1000, 2000, 4000, 8000, 16000, 32000]
        );
        assert!(gaps[10..].iter().all(|&g| g == 64_000), "{gaps:?}");
        // Confirmed by the dump asked for: no more asks.
        assert!(p.asking(A, 3, false, 300_000));
        assert_eq!(p.admit(A, &chunk(1, 3, 0, true), 300_001), Ok(Heard::Ok));
        assert!(!p.should_ask_to_confirm(A, 400_000));
    }

    #[test]
    fn dumps_start_at_most_once_per_interval() {
        let mut p = Peers::new([A]);
        assert!(p.may_dump(A, 1_000));
        for t in [1_000, 1_500, 1_000 + DUMP_INTERVAL_MS - 1] {
            assert!(!p.may_dump(A, t));
        }
        assert!(p.may_dump(A, 1_000 + DUMP_INTERVAL_MS));
        assert_eq!(peer(&p).resync_rate_limited, 3);
        assert!(!p.may_dump(STRANGER, 0));
    }

    #[test]
    fn silence_then_a_message_is_a_reconnection() {
        let mut p = knowing_a(0);
        assert_eq!(p.admit(A, &batch(1), 1_000), Ok(Heard::Ok));
        assert_eq!(p.admit(A, &batch(2), 1_000 + SILENCE_MS - 1), Ok(Heard::Ok));
        assert_eq!(
            p.admit(A, &batch(3), 1_000 + 2 * SILENCE_MS),
            Ok(Heard::AfterSilence)
        );
        assert_eq!(peer(&p).last_heard_ms, Some(1_000 + 2 * SILENCE_MS));
    }

    #[test]
    fn a_dump_completes_in_order_and_a_gap_or_a_stall_asks_again() {
        let mut p = Peers::new([A]);
        assert_eq!(peer(&p).resync.state, ResyncState::None);
        assert!(p.asking(A, 7, false, 100));
        assert_eq!(p.stalled(100 + RESYNC_TIMEOUT_MS - 1).count(), 0);
        p.admit(A, &chunk(1, 7, 0, false), 200).unwrap();
        p.admit(A, &batch(2), 300).unwrap();
        // A chunk of another dump (an older request) does not count.
        p.admit(A, &chunk(3, 6, 1, false), 350).unwrap();
        assert_eq!(peer(&p).resync.state, ResyncState::Receiving);
        p.admit(A, &chunk(4, 7, 1, true), 400).unwrap();
        let r = peer(&p).resync;
        assert_eq!(
            (r.state, r.chunks, r.records, r.took_ms, r.attempts),
            (ResyncState::Complete, 2, 6, Some(300), 1)
        );
        assert_eq!(p.stalled(10_000).count(), 0, "complete: nothing to ask");

        // A gap: chunk 1 lost.
        assert!(p.asking(A, 8, false, 1_000));
        p.admit(A, &chunk(5, 8, 0, false), 1_010).unwrap();
        assert_eq!(p.admit(A, &chunk(7, 8, 2, true), 1_020), Ok(Heard::DumpGap));
        assert_ne!(peer(&p).resync.state, ResyncState::Complete);
        assert!(p.asking(A, 9, true, 1_020));
        assert_eq!(peer(&p).resync.attempts, 2);

        // A stall: nothing comes; each timeout asks again, up to the limit.
        let mut now = 1_020;
        let mut asked = 2;
        loop {
            now += RESYNC_TIMEOUT_MS;
            let stalled: Vec<_> = p.stalled(now).collect();
            if stalled.is_empty() {
                break;
            }
            assert_eq!(stalled, [A]);
            if !p.asking(A, 100 + asked, true, now) {
                break;
            }
            asked += 1;
        }
        assert_eq!(asked, RESYNC_ATTEMPTS);
        let r = peer(&p).resync;
        assert_eq!(
            (r.state, r.attempts),
            (ResyncState::Failed, RESYNC_ATTEMPTS)
        );
        // Heard again later: a fresh resync may start.
        assert!(p.asking(A, 200, false, now));
        assert_eq!(peer(&p).resync.attempts, 1);
    }
}
