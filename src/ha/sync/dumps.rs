//! The bulk resync dumps under way on the active node, one per peer that asked: each
//! turn they list the next slice of the tables ([`DumpCursor`]) and send the chunks
//! it fills ([`Dump`]), taking turns so that one peer's dump cannot starve another's
//! of listing time or chunks. Pure: the tables come through a [`DumpSource`], the
//! clock and the datagrams' way out from the caller.
use super::cursor::{DumpCursor, DumpSource};
use super::sender::{Dump, SyncSender};
use crate::session::replication::{RecordKind, RecordRepr};
use std::net::SocketAddrV4;

/// One dump: to whom, what was listed and not sent yet, where the listing stands.
pub struct UnderWay {
    pub peer: SocketAddrV4,
    pub dump: Dump,
    cursor: DumpCursor,
    pub started_ms: u64,
}

/// What a turn's listing did.
#[derive(Default)]
pub struct Listed {
    /// Records listed, and how many of them were templates.
    pub records: u64,
    pub templates: u64,
    /// Dumps whose listing failed (a worker did not answer), dropped, with why: the
    /// peer asks again if it is a VRRP backup (its stall timer); without `[vrrp]` it
    /// asks only at start.
    pub failed: Vec<(UnderWay, String)>,
}

#[derive(Default)]
pub struct Dumps {
    under_way: Vec<UnderWay>,
    /// Which dump lists and sends first this turn: one more each turn.
    next: usize,
}

impl Dumps {
    pub fn is_empty(&self) -> bool {
        self.under_way.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &UnderWay> + '_ {
        self.under_way.iter()
    }

    /// Starts dump `dump_id` to `peer` at the first slot of the tables. A dump
    /// already under way to that peer is dropped and returned: the peer asked again
    /// (it lost a chunk, or restarted), and resuming that dump under the new id would
    /// leave out what went under the old one, a hole the peer would take as complete.
    pub fn start(&mut self, peer: SocketAddrV4, dump_id: u32, now_ms: u64) -> Option<UnderWay> {
        let old = (self.under_way.iter())
            .position(|d| d.peer == peer)
            .map(|i| self.under_way.remove(i));
        self.under_way.push(UnderWay {
            peer,
            dump: Dump::new(dump_id, *peer.ip(), now_ms),
            cursor: DumpCursor::default(),
            started_ms: now_ms,
        });
        old
    }

    /// A batch carried `record` to every peer (`Dump::supersede`).
    pub fn supersede(&mut self, record: &RecordRepr) {
        for d in &mut self.under_way {
            d.dump.supersede(record);
        }
    }

    /// Lists the next slice of the tables for every dump, as much as its share of
    /// `chunks` (the turn's chunk budget) carries at `per_chunk` records a chunk
    /// beyond what it holds already, `max_records` for all dumps at most, while
    /// `more()` says there is time. The dumps take their turn in a different order
    /// each turn, so one that uses the time up does not always leave the same one
    /// without.
    pub fn list(
        &mut self,
        source: &mut impl DumpSource,
        chunks: u32,
        per_chunk: usize,
        max_records: usize,
        mut more: impl FnMut() -> bool,
    ) -> Listed {
        let mut listed = Listed::default();
        let n = self.under_way.len();
        if n == 0 {
            return listed;
        }
        let share = chunks.div_ceil(n as u32);
        let mut room = max_records;
        let mut failed = Vec::new();
        for k in 0..n {
            let i = (self.next % n + k) % n;
            let UnderWay { dump, cursor, .. } = &mut self.under_way[i];
            let want = dump.wanted(share, per_chunk).min(room);
            if want == 0 {
                continue;
            }
            let mut templates = 0;
            match cursor.step(source, want, &mut more, |r| {
                templates += u64::from(r.kind == RecordKind::Template);
                dump.push(r)
            }) {
                Ok(n) => {
                    room -= n;
                    listed.records += n as u64;
                    listed.templates += templates;
                    if cursor.is_done() {
                        dump.end_listing();
                    }
                }
                Err(e) => failed.push((i, e)),
            }
        }
        // Highest index first, so the others stay where they are.
        failed.sort_unstable_by_key(|f| std::cmp::Reverse(f.0));
        for (i, e) in failed {
            listed.failed.push((self.under_way.remove(i), e));
        }
        listed
    }

    /// Sends at most `chunks` chunks over all dumps, one per dump in turn (starting
    /// with a different dump each turn) until the budget is spent or none has a chunk
    /// to send; `send` gets each chunk with its peer. Returns the dumps that sent
    /// their last chunk, no longer under way.
    pub fn send(
        &mut self,
        sender: &mut SyncSender,
        chunks: u32,
        now_ms: u64,
        buf: &mut [u8],
        mut send: impl FnMut(SocketAddrV4, &[u8]),
    ) -> Vec<UnderWay> {
        let n = self.under_way.len();
        let mut budget = chunks;
        while budget > 0 {
            let mut sent_in_round = 0;
            for k in 0..n {
                if budget == 0 {
                    break;
                }
                let d = &mut self.under_way[(self.next % n + k) % n];
                let peer = d.peer;
                let sent = sender.continue_dump(&mut d.dump, 1, now_ms, buf, |m| send(peer, m));
                budget -= sent;
                sent_in_round += sent;
            }
            if sent_in_round == 0 {
                break;
            }
        }
        self.next = self.next.wrapping_add(1);
        let mut finished = Vec::new();
        let mut i = 0;
        while i < self.under_way.len() {
            if self.under_way[i].dump.is_done() {
                finished.push(self.under_way.remove(i));
            } else {
                i += 1;
            }
        }
        finished
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::FlowKey4;
    use crate::ha::sync::receiver::{Receiver, ReceiverConfig};
    use crate::model::{ForwardMode, Protocol};
    use crate::session::replication::{MessageFlags, RecordOp};
    use crate::session::Session;
    use std::collections::BTreeMap;
    use std::net::Ipv4Addr;

    const US: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 3);
    const A: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(192, 0, 2, 1), 8848);
    const B: SocketAddrV4 = SocketAddrV4::new(Ipv4Addr::new(192, 0, 2, 2), 8848);

    /// Two workers' session slots (a session is its client port), no templates; a
    /// worker reads 64 slots per question.
    struct Table(Vec<Vec<Option<u16>>>);

    impl DumpSource for Table {
        fn workers(&self) -> usize {
            self.0.len()
        }

        fn sessions(
            &mut self,
            worker: usize,
            from: usize,
            max: usize,
            each: &mut dyn FnMut(RecordRepr),
        ) -> Result<Option<usize>, String> {
            let slots = &self.0[worker];
            let end = slots.len().min(from + 64);
            let mut given = 0;
            for (i, port) in slots.iter().enumerate().take(end).skip(from) {
                if let Some(port) = port {
                    if given == max {
                        return Ok(Some(i));
                    }
                    let key = FlowKey4::new(
                        Protocol::Tcp,
                        Ipv4Addr::new(198, 51, 100, 1),
                        *port,
                        Ipv4Addr::new(203, 0, 113, 10),
                        80,
                    );
                    let s =
                        Session::new(&key, ForwardMode::Nat, 0, 0, Ipv4Addr::new(10, 0, 0, 2), 80);
                    each(RecordRepr::connection(&s, RecordOp::Update, 9));
                    given += 1;
                }
            }
            Ok((end < slots.len()).then_some(end))
        }

        fn template_slots(&self, _v6: bool) -> usize {
            0
        }

        fn templates(&mut self, _: bool, _: std::ops::Range<usize>, _: &mut dyn FnMut(RecordRepr)) {
        }
    }

    fn table(sessions: u16) -> Table {
        let worker = |base: u16| (0..sessions).map(|n| Some(base + n)).collect();
        Table(vec![worker(0), worker(30_000)])
    }

    /// What each peer received: per dump id, (chunk, ports, last) in order.
    type Received = BTreeMap<(SocketAddrV4, u32), Vec<(u32, Vec<u16>, bool)>>;

    /// One management turn: list within `max_records`, send 32 chunks at most.
    fn turn(
        dumps: &mut Dumps,
        t: &mut Table,
        sender: &mut SyncSender,
        max_records: usize,
        now_ms: u64,
        got: &mut Received,
    ) -> Vec<UnderWay> {
        let per_chunk = sender.records_per_chunk();
        let listed = dumps.list(t, 32, per_chunk, max_records, || true);
        assert!(listed.failed.is_empty());
        for d in dumps.iter() {
            assert!(
                d.dump.queued() <= 32 * per_chunk,
                "more than a turn's worth held"
            );
        }
        dumps.send(sender, 32, now_ms, &mut [0u8; 1500], |peer, d| {
            // The peer's receiver: a chunk names the one peer it is for.
            let mut rx = Receiver::new(ReceiverConfig {
                local: *peer.ip(),
                peers: vec![US],
                key: None,
            });
            let a = rx.receive(d, US).unwrap();
            got.entry((peer, a.header.dump_id)).or_default().push((
                a.header.chunk,
                a.records().map(|r| r.client.port()).collect(),
                a.header.flags.contains(MessageFlags::LAST_CHUNK),
            ));
        })
    }

    fn check_chunks(chunks: &[(u32, Vec<u16>, bool)]) -> Vec<u16> {
        for (i, (chunk, _, last)) in chunks.iter().enumerate() {
            assert_eq!(*chunk, i as u32);
            assert_eq!(
                *last,
                i + 1 == chunks.len(),
                "chunk {i} of {}",
                chunks.len()
            );
        }
        chunks.iter().flat_map(|c| c.1.iter().copied()).collect()
    }

    /// A table listed 50 records a turn while sessions come and go between turns:
    /// chunks numbered from 0, the last flagged, and every session that stayed from
    /// start to end sent exactly once.
    #[test]
    fn a_dump_over_many_turns_of_a_changing_table_loses_and_repeats_nothing() {
        let mut t = table(1000);
        let mut sender = SyncSender::new(u32::from(US), 1500, None);
        let mut dumps = Dumps::default();
        assert!(dumps.start(A, 7, 0).is_none());
        let mut got = Received::new();
        let mut rng = crate::wire::test_util::XorShift(0xd0_3b5);
        let mut fresh = 10_000u16;
        let mut turns = 0;
        while !dumps.is_empty() {
            turns += 1;
            let done = turn(&mut dumps, &mut t, &mut sender, 50, turns * 5, &mut got);
            assert!(done.iter().all(|d| d.peer == A && d.dump.is_done()));
            // Sessions numbered a multiple of 7 may end; new ones take free slots.
            for w in t.0.iter_mut() {
                super::super::cursor::tests::churn(w, &mut rng, 5, 7, &mut fresh);
            }
            assert!(turns < 1000, "never done");
        }
        assert!(turns >= 40, "{turns} turns");
        let sent = check_chunks(&got[&(A, 7)]);
        let mut once = sent.clone();
        once.sort_unstable();
        once.dedup();
        assert_eq!(once.len(), sent.len(), "a session sent twice");
        for n in (0..1000).chain(30_000..31_000).filter(|n| n % 7 != 0) {
            assert!(sent.contains(&n), "{n} stayed and was not sent");
        }
    }

    /// A peer that asks again while its dump is under way gets a new dump from the
    /// first slot, numbered from 0: the sessions the old one had sent included.
    #[test]
    fn a_new_ask_restarts_the_dump_from_the_first_slot() {
        let mut t = table(500);
        let mut sender = SyncSender::new(u32::from(US), 1500, None);
        let mut dumps = Dumps::default();
        dumps.start(A, 1, 0);
        let mut got = Received::new();
        for now in [5, 10, 15] {
            turn(&mut dumps, &mut t, &mut sender, 100, now, &mut got);
        }
        let first = &got[&(A, 1)];
        assert!(first.iter().any(|c| c.1.contains(&0)));
        assert!(first.iter().all(|c| !c.2), "the first dump did not end");
        let old = dumps.start(A, 2, 20).expect("the old dump is dropped");
        assert_eq!((old.dump.dump_id, old.dump.is_done()), (1, false));
        assert_eq!(dumps.iter().count(), 1);
        let mut now = 20;
        while !dumps.is_empty() {
            now += 5;
            turn(&mut dumps, &mut t, &mut sender, 100, now, &mut got);
        }
        let mut sent = check_chunks(&got[&(A, 2)]);
        sent.sort_unstable();
        let all: Vec<u16> = (0..500).chain(30_000..30_500).collect();
        assert_eq!(sent, all);
    }

    /// Two peers dumped at once share each turn's 32 chunks: neither waits for the
    /// other's dump to end, and both end.
    #[test]
    fn two_dumps_share_the_turns_chunks() {
        let mut t = table(20_000);
        let mut sender = SyncSender::new(u32::from(US), 1500, None);
        let mut dumps = Dumps::default();
        dumps.start(A, 1, 0);
        dumps.start(B, 2, 0);
        let mut got = Received::new();
        let mut now = 0;
        let mut finished = Vec::new();
        while !dumps.is_empty() {
            now += 5;
            let before = (
                got.get(&(A, 1)).map_or(0, Vec::len),
                got.get(&(B, 2)).map_or(0, Vec::len),
            );
            finished.extend(
                turn(&mut dumps, &mut t, &mut sender, usize::MAX, now, &mut got)
                    .into_iter()
                    .map(|d| (d.peer, now)),
            );
            let a = got.get(&(A, 1)).map_or(0, Vec::len) - before.0;
            let b = got.get(&(B, 2)).map_or(0, Vec::len) - before.1;
            if finished.is_empty() {
                assert_eq!((a, b), (16, 16), "turn at {now}");
            }
            assert!(now < 100_000, "never done");
        }
        // 40,000 records a dump, 27 a chunk: 1482 chunks each, 16 a turn.
        assert_eq!(check_chunks(&got[&(A, 1)]).len(), 40_000);
        assert_eq!(check_chunks(&got[&(B, 2)]).len(), 40_000);
        let ends: Vec<u64> = finished.iter().map(|f| f.1).collect();
        assert!(ends[1] - ends[0] <= 5, "{finished:?}");
    }

    /// Each dump lists its share of the turn's chunks; under a record bound, the one
    /// listing first changes from turn to turn, so neither is always left without.
    #[test]
    fn the_listing_is_shared_between_dumps_in_turn() {
        let mut t = table(20_000);
        let mut sender = SyncSender::new(u32::from(US), 1500, None);
        let per_chunk = sender.records_per_chunk();
        let mut dumps = Dumps::default();
        dumps.start(A, 1, 0);
        dumps.start(B, 2, 0);
        let listed = dumps.list(&mut t, 32, per_chunk, usize::MAX, || true);
        assert_eq!(listed.records as usize, 32 * per_chunk);
        let queued: Vec<usize> = dumps.iter().map(|d| d.dump.queued()).collect();
        assert_eq!(queued, [16 * per_chunk, 16 * per_chunk]);
        // Under a bound of 100 records a turn: A's turn first, then B's.
        let mut dumps = Dumps::default();
        dumps.start(A, 3, 0);
        dumps.start(B, 4, 0);
        let mut firsts = Vec::new();
        for now in [5, 10, 15, 20] {
            let before: Vec<usize> = dumps.iter().map(|d| d.dump.queued()).collect();
            dumps.list(&mut t, 32, per_chunk, 100, || true);
            let grew: Vec<usize> = (dumps.iter().zip(&before))
                .map(|(d, b)| d.dump.queued() - b)
                .collect();
            firsts.push(grew);
            dumps.send(&mut sender, 32, now, &mut [0u8; 1500], |_, _| {});
        }
        assert_eq!(firsts, [[100, 0], [0, 100], [100, 0], [0, 100]]);
    }

    /// The turn's chunks are taken one per dump in turn: a dump with more queued
    /// than its share does not take the others' part.
    #[test]
    fn the_chunks_are_taken_one_per_dump_in_turn() {
        let mut sender = SyncSender::new(u32::from(US), 1500, None);
        let mut t = table(2_000);
        let mut dumps = Dumps::default();
        dumps.start(A, 1, 0);
        dumps.start(B, 2, 0);
        // More than the whole turn's chunks queued for each.
        for d in &mut dumps.under_way {
            let mut from = Some(0);
            while let Some(at) = from {
                from = t
                    .sessions(0, at, usize::MAX, &mut |r| d.dump.push(r))
                    .unwrap();
            }
            assert_eq!(d.dump.queued(), 2_000);
        }
        let mut sent = BTreeMap::new();
        dumps.send(&mut sender, 32, 0, &mut [0u8; 1500], |peer, _| {
            *sent.entry(peer).or_insert(0) += 1
        });
        assert_eq!(sent, BTreeMap::from([(A, 16), (B, 16)]));
    }

    #[test]
    fn a_dump_whose_listing_fails_is_dropped() {
        struct Silent;
        impl DumpSource for Silent {
            fn workers(&self) -> usize {
                1
            }
            fn sessions(
                &mut self,
                w: usize,
                _: usize,
                _: usize,
                _: &mut dyn FnMut(RecordRepr),
            ) -> Result<Option<usize>, String> {
                Err(format!("worker {w}: no answer within 1000 ms"))
            }
            fn template_slots(&self, _: bool) -> usize {
                0
            }
            fn templates(
                &mut self,
                _: bool,
                _: std::ops::Range<usize>,
                _: &mut dyn FnMut(RecordRepr),
            ) {
            }
        }
        let mut dumps = Dumps::default();
        dumps.start(A, 1, 0);
        dumps.start(B, 2, 0);
        let listed = dumps.list(&mut Silent, 32, 27, 1000, || true);
        let failed: Vec<_> = listed
            .failed
            .iter()
            .map(|(d, e)| (d.peer, e.as_str()))
            .collect();
        assert_eq!(
            failed,
            [
                (B, "worker 0: no answer within 1000 ms"),
                (A, "worker 0: no answer within 1000 ms")
            ]
        );
        assert!(dumps.is_empty());
    }
}
