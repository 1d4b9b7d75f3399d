//! What a node knows about each sync peer, from the messages it accepted: how many,
//! how long ago the last one came (the sync lag an operator watches), the messages
//! lost or reordered on the way (from the sender's sequence numbers), the peer's
//! restarts, and the progress of the bulk resync this node asked it for: a dump that
//! arrives with a gap in its chunk numbers, or stops arriving, is asked for again
//! under a new dump id, a bounded number of times. Pure logic, clocked by the caller.
use crate::sync::wire::{MessageFlags, MessageRepr, MessageType};
use std::net::Ipv4Addr;

/// A sequence number this far behind the last one is a restarted sender, not a late
/// message (a sender restarts from 0).
const REORDER_WINDOW: u32 = 1024;
/// A dump whose next chunk has not come this long after the request or the last chunk
/// is asked for again.
pub const RESYNC_TIMEOUT_MS: u64 = 2000;
/// How many times a dump is asked for before giving up (until the peer is heard again
/// after a silence).
pub const RESYNC_ATTEMPTS: u32 = 5;
/// A peer silent this long and then heard again has reconnected: a backup asks it for
/// its table again.
pub const SILENCE_MS: u64 = 5000;

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
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
    };
}

/// One peer as this node sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Peer {
    pub addr: Ipv4Addr,
    /// Messages and records accepted from it.
    pub messages: u64,
    pub records: u64,
    /// Messages missing between two accepted ones (sequence gaps): lost on the way or
    /// rejected here. With more than one peer, a dump the peer sent to another node
    /// counts too (one sequence per sender).
    pub lost: u64,
    /// Messages that came after a later one (or twice).
    pub reordered: u64,
    /// Times its sequence started over (the peer restarted).
    pub restarts: u64,
    /// When the last message was accepted (ms on the caller's clock).
    #[serde(skip)]
    pub last_heard_ms: Option<u64>,
    #[serde(skip)]
    last_sequence: Option<u32>,
    pub resync: Resync,
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
                    reordered: 0,
                    restarts: 0,
                    last_heard_ms: None,
                    last_sequence: None,
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

    /// A message from `from` passed every check.
    pub fn accepted(&mut self, from: Ipv4Addr, m: &MessageRepr, now_ms: u64) -> Heard {
        let Some(peer) = self.get_mut(from) else {
            return Heard::Ok;
        };
        let silent = peer
            .last_heard_ms
            .is_some_and(|t| now_ms.saturating_sub(t) >= SILENCE_MS);
        peer.messages += 1;
        peer.records += u64::from(m.count);
        peer.last_heard_ms = Some(now_ms);
        match peer.last_sequence {
            None => peer.last_sequence = Some(m.sequence),
            Some(last) => {
                let ahead = m.sequence.wrapping_sub(last);
                let behind = last.wrapping_sub(m.sequence);
                if ahead != 0 && ahead < u32::MAX / 2 {
                    peer.lost += u64::from(ahead - 1);
                    peer.last_sequence = Some(m.sequence);
                } else if behind < REORDER_WINDOW {
                    peer.reordered += 1;
                } else {
                    peer.restarts += 1;
                    peer.last_sequence = Some(m.sequence);
                }
            }
        }
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
        if m.chunk != r.chunks {
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
        };
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
    use crate::sync::wire::MessageFlags;

    const A: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 1);
    const STRANGER: Ipv4Addr = Ipv4Addr::new(198, 19, 0, 9);

    fn batch(sequence: u32) -> MessageRepr {
        MessageRepr {
            message_type: MessageType::SessionBatch,
            flags: MessageFlags::empty(),
            sender: 1,
            sequence,
            dump_id: 0,
            chunk: 0,
            count: 3,
        }
    }

    fn chunk(sequence: u32, dump_id: u32, chunk: u32, last: bool) -> MessageRepr {
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

    #[test]
    fn sequence_gaps_reorders_and_restarts_are_told_apart() {
        let mut p = Peers::new([A]);
        for seq in [5010, 5011, 5014, 5013, 5015, 5015] {
            assert_eq!(p.accepted(A, &batch(seq), 0), Heard::Ok);
        }
        let a = peer(&p);
        assert_eq!((a.messages, a.records), (6, 18));
        // 5012 and 5013 were missing when 5014 came; 5013 then came late, 5015 twice.
        assert_eq!((a.lost, a.reordered, a.restarts), (2, 2, 0));
        // A restart: the sequence starts over, far behind. (A restart soon after the
        // last one, within the reorder window, counts as reordered instead.)
        p.accepted(A, &batch(0), 0);
        p.accepted(A, &batch(1), 0);
        let a = peer(&p);
        assert_eq!((a.lost, a.reordered, a.restarts), (2, 2, 1));
        // Wrapping is no gap.
        let mut p = Peers::new([A]);
        p.accepted(A, &batch(u32::MAX), 0);
        p.accepted(A, &batch(0), 0);
        assert_eq!(peer(&p).lost, 0);
        // Strangers are not tracked (the receiver rejects them before).
        assert_eq!(p.accepted(STRANGER, &batch(5), 0), Heard::Ok);
        assert_eq!(peer(&p).messages, 2);
    }

    #[test]
    fn silence_then_a_message_is_a_reconnection() {
        let mut p = Peers::new([A]);
        assert_eq!(p.accepted(A, &batch(1), 1_000), Heard::Ok, "first ever");
        assert_eq!(p.accepted(A, &batch(2), 1_000 + SILENCE_MS - 1), Heard::Ok);
        assert_eq!(
            p.accepted(A, &batch(3), 1_000 + 2 * SILENCE_MS),
            Heard::AfterSilence
        );
        assert_eq!(peer(&p).last_heard_ms, Some(1_000 + 2 * SILENCE_MS));
    }

    #[test]
    fn a_dump_completes_in_order_and_a_gap_or_a_stall_asks_again() {
        let mut p = Peers::new([A]);
        assert_eq!(peer(&p).resync.state, ResyncState::None);
        assert!(p.asking(A, 7, false, 100));
        assert_eq!(p.stalled(100 + RESYNC_TIMEOUT_MS - 1).count(), 0);
        p.accepted(A, &chunk(1, 7, 0, false), 200);
        p.accepted(A, &batch(2), 300);
        // A chunk of another dump (an older request) does not count.
        p.accepted(A, &chunk(3, 6, 1, false), 350);
        assert_eq!(peer(&p).resync.state, ResyncState::Receiving);
        p.accepted(A, &chunk(4, 7, 1, true), 400);
        let r = peer(&p).resync;
        assert_eq!(
            (r.state, r.chunks, r.records, r.took_ms, r.attempts),
            (ResyncState::Complete, 2, 6, Some(300), 1)
        );
        assert_eq!(p.stalled(10_000).count(), 0, "complete: nothing to ask");

        // A gap: chunk 1 lost.
        assert!(p.asking(A, 8, false, 1_000));
        p.accepted(A, &chunk(5, 8, 0, false), 1_010);
        assert_eq!(p.accepted(A, &chunk(7, 8, 2, true), 1_020), Heard::DumpGap);
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
