//! The active node's side: turning drained events into sync messages, answering a
//! resync request with a chunked dump, and asking for one. Pure: the caller provides
//! the buffer (one MTU) and a `send` for each finished datagram.
use super::auth;
use crate::dataplane::sync_events::EventRing;
use crate::ha::auth::SharedKey;
use crate::session::replication::{
    MessageBuilder, MessageFlags, MessageRepr, MessageType, RecordRepr, RecordSubject,
};
use std::collections::{HashMap, VecDeque};
use std::net::Ipv4Addr;

/// A short chunk goes out when a dump under way sent none for this long, so the
/// standby, whose stall timer asks again after `peers::RESYNC_TIMEOUT_MS` (2 s)
/// without a chunk, sees progress while a sparse table is still being listed. Costs
/// at most two near-empty datagrams a second per dump.
pub const KEEPALIVE_MS: u64 = 500;

/// A table being dumped to a peer, chunk by chunk (`SyncSender::continue_dump`), so a
/// large table goes out over several ticks instead of flooding the peer's receive
/// buffer at once.
///
/// The records come in as the caller lists the table a slice per turn
/// ([`Dump::push`]), and only what was listed and not yet sent is held: a chunk goes
/// out when it is full, a short one when listing is over (the last, flagged), as the
/// first (at once) or when none went out for [`KEEPALIVE_MS`]. The caller lists no
/// more than the turn's chunks carry ([`Dump::wanted`]), so the queue stays within a
/// turn's worth.
///
/// Batches keep flowing meanwhile, to every peer, the one dumped to included. A batch
/// record is newer than a record of the same entry listed before it, so once one went
/// out (`supersede`) such a listed record still queued is not sent: arriving after
/// the batch's, it would set the peer's copy back to the older state (or bring back a
/// session the batch ended) until the entry's next record. A record listed after the
/// batch read the table later: it is as new as the batch's or newer, and goes out.
pub struct Dump {
    pub dump_id: u32,
    /// The peer that asked (its listen address): the chunks name it as recipient.
    pub to: Ipv4Addr,
    /// Listed and not sent yet, in listing order.
    queue: VecDeque<RecordRepr>,
    /// Records listed so far: the queue's front is record `listed - queue.len()`.
    listed: u64,
    /// The caller listed the whole table: the queue's end is the dump's end.
    listing_done: bool,
    next_chunk: u32,
    done: bool,
    /// Entries a batch described while records were queued, each with `listed` at
    /// that moment: a queued record of the entry numbered below it was listed before
    /// the batch. An entry is dropped once the queue's front has passed its number
    /// (no record listed before its batch is left), so it holds only the entries
    /// batched while records listed before them still wait, a turn or two's worth.
    superseded: HashMap<RecordSubject, u64>,
    /// The dump's records left out for a newer batch record.
    skipped: u64,
    /// When the last chunk went out (or the dump started).
    last_sent_ms: u64,
}

impl Dump {
    /// A dump starting at `now_ms` with nothing listed yet.
    pub fn new(dump_id: u32, to: Ipv4Addr, now_ms: u64) -> Self {
        Dump {
            dump_id,
            to,
            queue: VecDeque::new(),
            listed: 0,
            listing_done: false,
            next_chunk: 0,
            done: false,
            superseded: HashMap::new(),
            skipped: 0,
            last_sent_ms: now_ms,
        }
    }

    /// A dump of `records`, the whole table (tests).
    pub fn of(
        dump_id: u32,
        to: Ipv4Addr,
        records: impl IntoIterator<Item = RecordRepr>,
        now_ms: u64,
    ) -> Self {
        let mut dump = Dump::new(dump_id, to, now_ms);
        records.into_iter().for_each(|r| dump.push(r));
        dump.end_listing();
        dump
    }

    /// The next record listed.
    pub fn push(&mut self, record: RecordRepr) {
        if !self.listing_done {
            self.queue.push_back(record);
            self.listed += 1;
        }
    }

    /// The whole table was listed: the chunk that empties the queue is the last.
    pub fn end_listing(&mut self) {
        self.listing_done = true;
    }

    pub fn listing_done(&self) -> bool {
        self.listing_done
    }

    /// Records listed and not sent yet.
    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// Records to list so that `chunks` chunks of `per_chunk` records can go out
    /// (none once listing is over).
    pub fn wanted(&self, chunks: u32, per_chunk: usize) -> usize {
        if self.listing_done {
            return 0;
        }
        (chunks as usize)
            .saturating_mul(per_chunk)
            .saturating_sub(self.queue.len())
    }

    /// A batch carried `record` to every peer: a record of the same entry listed
    /// before and not sent yet is older and is left out. Records listed from now on
    /// are not.
    pub fn supersede(&mut self, record: &RecordRepr) {
        if !self.done && !self.queue.is_empty() {
            self.superseded.insert(record.subject(), self.listed);
        }
    }

    /// The dump's records left out so far for a newer batch record.
    pub fn skipped(&self) -> u64 {
        self.skipped
    }

    /// Whether the last chunk went out.
    pub fn is_done(&self) -> bool {
        self.done
    }

    pub fn chunks_sent(&self) -> u32 {
        self.next_chunk
    }
}

/// Numbers and seals the messages one node sends.
#[derive(Debug)]
pub struct SyncSender {
    node_id: u32,
    epoch: u64,
    sequence: u64,
    mtu: u16,
    key: Option<SharedKey>,
}

/// This life's epoch: the wall clock in microseconds since the Unix epoch, so a later
/// start has a larger one (as long as the clock does not go back across a restart:
/// docs/SYNC.md). Never 0.
pub fn epoch_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_micros() as u64)
        .max(1)
}

impl SyncSender {
    /// A sender starting a new life ([`epoch_now`]), sequence 0.
    pub fn new(node_id: u32, mtu: u16, key: Option<SharedKey>) -> SyncSender {
        SyncSender {
            node_id,
            epoch: epoch_now(),
            sequence: 0,
            mtu,
            key,
        }
    }

    /// The same sender in life `epoch`, its next message numbered `sequence` (tests,
    /// and tools that must speak as a given life).
    pub fn with_epoch(mut self, epoch: u64, sequence: u64) -> SyncSender {
        self.epoch = epoch;
        self.sequence = sequence;
        self
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Whether messages are sealed with an HMAC.
    pub fn authenticated(&self) -> bool {
        self.key.is_some()
    }

    /// The sequence number the next message gets.
    pub fn next_sequence(&self) -> u64 {
        self.sequence
    }

    /// A header for the next message; `to` is the one peer a resync request or a dump
    /// chunk is for (unspecified for a batch).
    fn header(
        &self,
        message_type: MessageType,
        to: Ipv4Addr,
        dump_id: u32,
        chunk: u32,
    ) -> MessageRepr {
        MessageRepr {
            message_type,
            flags: MessageFlags::empty(),
            sender: self.node_id,
            recipient: to,
            epoch: self.epoch,
            sequence: self.sequence,
            dump_id,
            chunk,
            count: 0,
        }
    }

    fn finish(&mut self, builder: MessageBuilder, send: &mut impl FnMut(&[u8])) {
        let message = builder.finish();
        if let Some(key) = &self.key {
            auth::seal(message, key);
        }
        send(message);
        self.sequence += 1;
    }

    /// Drains up to `budget` events from `rings` (round by round, so one busy worker
    /// cannot starve the others) into as few batches as fit the MTU. `sent` sees
    /// every record batched (for the dumps under way: `Dump::supersede`).
    pub fn send_events(
        &mut self,
        rings: &[EventRing],
        budget: usize,
        buf: &mut [u8],
        mut send: impl FnMut(&[u8]),
        mut sent: impl FnMut(&RecordRepr),
    ) -> usize {
        let authenticated = self.key.is_some();
        let header = self.header(MessageType::SessionBatch, Ipv4Addr::UNSPECIFIED, 0, 0);
        let mut builder = MessageBuilder::new(&mut *buf, header, self.mtu, authenticated);
        let capacity = builder.capacity().max(1);
        let mut records = Vec::with_capacity(capacity);
        let mut taken = 0;
        // Take a message's worth at a time, spread over the rings.
        while taken < budget {
            let before = taken;
            for ring in rings {
                let share = (capacity / rings.len().max(1)).max(1);
                taken += ring.drain(share.min(budget - taken), |e| records.push(e.record));
            }
            if taken == before {
                break;
            }
            for record in records.drain(..) {
                sent(&record);
                if builder.push(&record).is_err() {
                    self.finish(builder, &mut send);
                    let header =
                        self.header(MessageType::SessionBatch, Ipv4Addr::UNSPECIFIED, 0, 0);
                    builder = MessageBuilder::new(&mut *buf, header, self.mtu, authenticated);
                    // A fresh message always has room for one record.
                    let _ = builder.push(&record);
                }
            }
        }
        if !builder.is_empty() {
            self.finish(builder, &mut send);
        }
        taken
    }

    /// Sends `records` (the management core's own, e.g. persistence templates) as
    /// session batches, as few as fit the MTU. Returns the records sent.
    pub fn send_records(
        &mut self,
        records: impl IntoIterator<Item = RecordRepr>,
        buf: &mut [u8],
        mut send: impl FnMut(&[u8]),
    ) -> usize {
        let authenticated = self.key.is_some();
        let header = self.header(MessageType::SessionBatch, Ipv4Addr::UNSPECIFIED, 0, 0);
        let mut builder = MessageBuilder::new(&mut *buf, header, self.mtu, authenticated);
        let mut sent = 0;
        for record in records {
            if builder.push(&record).is_err() {
                self.finish(builder, &mut send);
                let header = self.header(MessageType::SessionBatch, Ipv4Addr::UNSPECIFIED, 0, 0);
                builder = MessageBuilder::new(&mut *buf, header, self.mtu, authenticated);
                // A fresh message always has room for one record.
                let _ = builder.push(&record);
            }
            sent += 1;
        }
        if !builder.is_empty() {
            self.finish(builder, &mut send);
        }
        sent
    }

    /// IPv4 records a dump chunk holds (fewer IPv6 ones fit): what a full chunk
    /// asks of the listing.
    pub fn records_per_chunk(&self) -> usize {
        let header = self.header(MessageType::DumpChunk, Ipv4Addr::UNSPECIFIED, 0, 0);
        let mut buf = vec![0u8; usize::from(self.mtu)];
        MessageBuilder::new(&mut buf, header, self.mtu, self.key.is_some())
            .capacity()
            .max(1)
    }

    /// Sends a whole table as dump `dump_id` at once: chunks numbered from 0, the last
    /// one flagged (an empty table is one empty last chunk). Returns the chunk count.
    pub fn send_dump(
        &mut self,
        dump_id: u32,
        to: Ipv4Addr,
        records: impl IntoIterator<Item = RecordRepr>,
        buf: &mut [u8],
        send: impl FnMut(&[u8]),
    ) -> u32 {
        let mut dump = Dump::of(dump_id, to, records, 0);
        self.continue_dump(&mut dump, u32::MAX, 0, buf, send);
        dump.chunks_sent()
    }

    /// Sends at most `max_chunks` more chunks of `dump` at `now_ms` (numbered on from
    /// the last call): full ones while the queue fills them; then, with the queue
    /// short of a full chunk, the last (flagged) once listing is over, the first, or
    /// a short one when none went out for [`KEEPALIVE_MS`]; else the queue waits for
    /// the next listing. Returns the chunks sent now.
    pub fn continue_dump(
        &mut self,
        dump: &mut Dump,
        max_chunks: u32,
        now_ms: u64,
        buf: &mut [u8],
        mut send: impl FnMut(&[u8]),
    ) -> u32 {
        let authenticated = self.key.is_some();
        let mut sent = 0;
        while !dump.done && sent < max_chunks {
            let header = self.header(
                MessageType::DumpChunk,
                dump.to,
                dump.dump_id,
                dump.next_chunk,
            );
            // Fill the chunk from the queue's front; the records are taken off only if
            // it goes out.
            let mut builder = MessageBuilder::new(&mut *buf, header, self.mtu, authenticated);
            let front = dump.listed - dump.queue.len() as u64;
            let (mut taken, mut skipped, mut left_over) = (0, 0, false);
            for (i, record) in dump.queue.iter().enumerate() {
                let listed_before_a_batch = !dump.superseded.is_empty()
                    && (dump.superseded.get(&record.subject()))
                        .is_some_and(|&at| front + (i as u64) < at);
                if listed_before_a_batch {
                    skipped += 1;
                } else if builder.push(record).is_err() && !builder.is_empty() {
                    left_over = true;
                    break;
                }
                // (One that does not fit an empty message can never go: passed over.)
                taken += 1;
            }
            let full = left_over || builder.is_full();
            let last = !left_over && dump.listing_done;
            // The first chunk goes at once, short if need be: it confirms this node's
            // life to a peer that just started, which refuses our batches until then
            // (`peers::Peers::admit`); a batch it refused would still leave the
            // dump's older record of its entry out (`supersede`), and the entry with it.
            let first = dump.next_chunk == 0;
            let keepalive = now_ms.saturating_sub(dump.last_sent_ms) >= KEEPALIVE_MS;
            if !(full || last || first || keepalive) {
                break;
            }
            dump.queue.drain(..taken);
            dump.skipped += skipped;
            if dump.queue.is_empty() {
                // Nothing queued is older than any batch to come.
                dump.superseded.clear();
            } else if !dump.superseded.is_empty() {
                // Records numbered below the new front are gone: marks at or below it
                // can leave nothing out any more.
                let front = front + taken as u64;
                dump.superseded.retain(|_, at| *at > front);
            }
            dump.next_chunk += 1;
            dump.last_sent_ms = now_ms;
            sent += 1;
            if last {
                dump.done = true;
                dump.queue = VecDeque::new();
                dump.superseded = HashMap::new();
                builder.set_last_chunk();
            }
            self.finish(builder, &mut send);
        }
        sent
    }

    /// A resync request to peer `to` for dump `dump_id`, written into `buf`.
    pub fn resync_request<'a>(
        &mut self,
        dump_id: u32,
        to: Ipv4Addr,
        buf: &'a mut [u8],
    ) -> &'a [u8] {
        let header = self.header(MessageType::ResyncRequest, to, dump_id, 0);
        let builder = MessageBuilder::new(&mut *buf, header, self.mtu, self.key.is_some());
        let message = builder.finish();
        if let Some(key) = &self.key {
            auth::seal(message, key);
        }
        self.sequence += 1;
        message
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dataplane::sync_events::{EventKind, SessionEvent};
    use crate::flow::FlowKey4;
    use crate::ha::sync::receiver::{Receiver, ReceiverConfig};
    use crate::model::ForwardMode;
    use crate::model::Protocol;
    use crate::session::Session;
    use std::net::Ipv4Addr;

    const PEER: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
    const US: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 3);

    fn session(worker: u8, n: u16) -> Session {
        let key = FlowKey4::new(
            Protocol::Tcp,
            Ipv4Addr::new(198, 51, 100, worker),
            n,
            Ipv4Addr::new(203, 0, 113, 10),
            80,
        );
        Session::new(&key, ForwardMode::Nat, 0, 0, Ipv4Addr::new(10, 0, 0, 2), 80)
    }

    fn receiver(key: Option<SharedKey>) -> Receiver {
        Receiver::new(ReceiverConfig {
            local: US,
            peers: vec![PEER],
            key,
        })
    }

    #[test]
    fn events_become_full_batches_that_a_receiver_accepts() {
        let key = SharedKey::new(&[5; 32]).unwrap();
        let rings: Vec<EventRing> = (0..3).map(|_| EventRing::with_capacity(256)).collect();
        for (w, ring) in rings.iter().enumerate() {
            for n in 0..50 {
                assert!(ring.push(SessionEvent::new(
                    EventKind::Created,
                    &session(w as u8, n),
                    1
                )));
            }
        }
        let mut sender = SyncSender::new(u32::from(PEER), 1500, Some(key.clone()));
        let mut rx = receiver(Some(key));
        let mut buf = [0u8; 1500];
        let mut sizes = Vec::new();
        let mut seen = Vec::new();
        let taken = sender.send_events(
            &rings,
            1000,
            &mut buf,
            |datagram| {
                let accepted = rx.receive(datagram, PEER).unwrap();
                assert_eq!(accepted.header.sender, u32::from(PEER));
                seen.push(accepted.header.sequence);
                sizes.push(accepted.header.count);
                assert!(datagram.len() + 28 <= 1500);
            },
            |_| {},
        );
        assert_eq!(taken, 150);
        // 150 records at 26 per authenticated message: 26 five times, 20.
        assert_eq!(sizes, [26, 26, 26, 26, 26, 20]);
        assert_eq!(seen, [0, 1, 2, 3, 4, 5]);
        assert_eq!(rx.counters().accepted_records, 150);
        // The budget bounds the work per call; nothing left, nothing sent.
        assert_eq!(
            sender.send_events(&rings, 10, &mut buf, |_| panic!(), |_| panic!()),
            0
        );
    }

    #[test]
    fn dump_chunks_are_numbered_and_the_last_is_flagged() {
        for (records, chunks) in [(0usize, 1u32), (27, 1), (28, 2), (100, 4)] {
            let mut sender = SyncSender::new(u32::from(PEER), 1500, None);
            let mut rx = receiver(None);
            let mut buf = [0u8; 1500];
            let table = (0..records as u16).map(|n| {
                crate::session::replication::RecordRepr::connection(
                    &session(1, n),
                    crate::session::replication::RecordOp::Update,
                    9,
                )
            });
            let mut got = Vec::new();
            let sent = sender.send_dump(42, US, table, &mut buf, |datagram| {
                let a = rx.receive(datagram, PEER).unwrap();
                assert_eq!(a.header.message_type, MessageType::DumpChunk);
                assert_eq!(a.header.dump_id, 42);
                got.push((
                    a.header.chunk,
                    a.header.count,
                    a.header.flags.contains(MessageFlags::LAST_CHUNK),
                ));
            });
            assert_eq!(sent, chunks, "{records} records");
            assert_eq!(got.len() as u32, chunks);
            for (i, &(chunk, _, last)) in got.iter().enumerate() {
                assert_eq!(chunk, i as u32);
                assert_eq!(last, i + 1 == got.len());
            }
            let total: usize = got.iter().map(|g| g.1 as usize).sum();
            assert_eq!(total, records);
        }
    }

    #[test]
    fn a_paced_dump_numbers_on_across_calls_and_flags_only_its_end() {
        let mut sender = SyncSender::new(u32::from(PEER), 1500, None);
        let mut rx = receiver(None);
        let mut buf = [0u8; 1500];
        let table: Vec<_> = (0..410u16)
            .map(|n| {
                crate::session::replication::RecordRepr::connection(
                    &session(1, n),
                    crate::session::replication::RecordOp::Update,
                    9,
                )
            })
            .collect();
        let mut dump = Dump::of(7, US, table, 0);
        let mut got = Vec::new();
        let mut calls = 0;
        while !dump.is_done() {
            calls += 1;
            let sent = sender.continue_dump(&mut dump, 4, 0, &mut buf, |d| {
                let a = rx.receive(d, PEER).unwrap();
                got.push((
                    a.header.chunk,
                    a.header.count,
                    a.header.flags.contains(MessageFlags::LAST_CHUNK),
                ));
            });
            assert!(sent <= 4);
            assert!(calls < 10, "never done");
        }
        // 410 records, 27 a chunk: 16 chunks, 4 per call.
        assert_eq!((calls, dump.chunks_sent(), got.len()), (4, 16, 16));
        for (i, &(chunk, count, last)) in got.iter().enumerate() {
            assert_eq!(chunk, i as u32);
            assert_eq!(last, i == 15);
            assert_eq!(count, if i == 15 { 5 } else { 27 });
        }
        assert_eq!(
            sender.continue_dump(&mut dump, 4, 0, &mut buf, |_| panic!()),
            0
        );
    }

    #[test]
    fn a_dump_leaves_out_what_a_batch_sent_meanwhile() {
        use crate::session::replication::RecordOp;
        let mut sender = SyncSender::new(u32::from(PEER), 1500, None);
        let mut rx = receiver(None);
        let table: Vec<_> = (0..410u16)
            .map(|n| RecordRepr::connection(&session(1, n), RecordOp::Update, 9))
            .collect();
        let mut dump = Dump::of(7, US, table, 0);
        let mut dumped = Vec::new();
        let mut chunks = |sender: &mut SyncSender, dump: &mut Dump, n| {
            sender.continue_dump(dump, n, 0, &mut [0u8; 1500], |d| {
                let a = rx.receive(d, PEER).unwrap();
                assert_eq!(a.header.message_type, MessageType::DumpChunk);
                dumped.extend(a.records().map(|r| (r.client.port(), r.op)));
            })
        };
        // Four chunks (108 records) go out; then the workers report session 10
        // (dumped already), 300 ended and 350 changed.
        assert_eq!(chunks(&mut sender, &mut dump, 4), 4);
        let ring = EventRing::with_capacity(16);
        for (n, kind) in [
            (10, EventKind::StateChanged),
            (300, EventKind::Deleted),
            (350, EventKind::StateChanged),
        ] {
            assert!(ring.push(SessionEvent::new(kind, &session(1, n), 1)));
        }
        let mut batched = Vec::new();
        sender.send_events(
            std::slice::from_ref(&ring),
            16,
            &mut [0u8; 1500],
            |_| {},
            |r| {
                batched.push(r.client.port());
                dump.supersede(r)
            },
        );
        assert_eq!(batched, [10, 300, 350]);
        while !dump.is_done() {
            chunks(&mut sender, &mut dump, 4);
        }
        let ports: Vec<u16> = dumped.iter().map(|d| d.0).collect();
        let expected: Vec<u16> = (0..410).filter(|n| ![300, 350].contains(n)).collect();
        assert_eq!(
            ports, expected,
            "the dump's older records of 300 and 350 stay out"
        );
        assert_eq!(dump.skipped(), 2);
        // A finished dump has nothing left to leave out, and keeps no set.
        dump.supersede(&RecordRepr::connection(&session(1, 1), RecordOp::Update, 9));
        assert!(dump.superseded.is_empty());
    }

    fn update(n: u16) -> RecordRepr {
        use crate::session::replication::RecordOp;
        RecordRepr::connection(&session(1, n), RecordOp::Update, 9)
    }

    /// (chunk, client ports, last) of each chunk `continue_dump` sends now.
    fn chunks_now(
        sender: &mut SyncSender,
        rx: &mut Receiver,
        dump: &mut Dump,
        max: u32,
        now_ms: u64,
    ) -> Vec<(u32, Vec<u16>, bool)> {
        let mut got = Vec::new();
        sender.continue_dump(dump, max, now_ms, &mut [0u8; 1500], |d| {
            let a = rx.receive(d, PEER).unwrap();
            assert_eq!(a.header.message_type, MessageType::DumpChunk);
            got.push((
                a.header.chunk,
                a.records().map(|r| r.client.port()).collect(),
                a.header.flags.contains(MessageFlags::LAST_CHUNK),
            ));
        });
        got
    }

    /// Records listed a few at a time over many turns go out in full chunks only,
    /// numbered on from 0, each once and in listing order; the chunk that empties
    /// the queue after the listing ended is the last, and the only one flagged.
    #[test]
    fn a_streamed_dump_sends_full_chunks_as_records_are_listed() {
        let mut sender = SyncSender::new(u32::from(PEER), 1500, None);
        let per_chunk = sender.records_per_chunk();
        assert_eq!(per_chunk, 27);
        let mut rx = receiver(None);
        let mut dump = Dump::new(3, US, 0);
        let mut rng = crate::wire::test_util::XorShift(0x57_4ea3);
        let mut next = 0u16;
        let mut got = Vec::new();
        for _turn in 0..200 {
            let wanted = dump.wanted(2, per_chunk);
            assert!(wanted <= 2 * per_chunk);
            for _ in 0..rng.below(wanted + 1) {
                dump.push(update(next));
                next += 1;
            }
            assert!(dump.queued() <= 2 * per_chunk, "holds a turn's worth");
            got.extend(chunks_now(&mut sender, &mut rx, &mut dump, 2, 0));
        }
        dump.end_listing();
        assert_eq!(dump.wanted(2, per_chunk), 0);
        while !dump.is_done() {
            got.extend(chunks_now(&mut sender, &mut rx, &mut dump, 2, 0));
        }
        assert!(got.len() > 20, "{} chunks", got.len());
        for (i, (chunk, ports, last)) in got.iter().enumerate() {
            assert_eq!(*chunk, i as u32);
            assert_eq!(*last, i + 1 == got.len());
            // The first goes at once, with what the first turn listed.
            if !last && i > 0 {
                assert_eq!(ports.len(), per_chunk, "chunk {i} went out short");
            }
        }
        let ports: Vec<u16> = got.into_iter().flat_map(|c| c.1).collect();
        assert_eq!(ports, (0..next).collect::<Vec<_>>());
        assert_eq!(dump.queued(), 0);
    }

    /// A batch of state changes for the sessions of client ports `ports`, sent to
    /// every peer while `dump` goes out (which hears of each, as the node does).
    fn send_batch(sender: &mut SyncSender, dump: &mut Dump, ports: &[u16]) {
        let ring = EventRing::with_capacity(16);
        for &n in ports {
            assert!(ring.push(SessionEvent::new(
                EventKind::StateChanged,
                &session(1, n),
                1
            )));
        }
        sender.send_events(
            std::slice::from_ref(&ring),
            16,
            &mut [0u8; 1500],
            |_| {},
            |r| dump.supersede(r),
        );
    }

    /// Only a record listed before a batch and still queued is older than the
    /// batch's: a record of the same entry listed after the batch read the
    /// table later and goes out, and so does one sent before the batch.
    #[test]
    fn a_streamed_dump_leaves_out_only_what_was_listed_before_the_batch() {
        let mut sender = SyncSender::new(u32::from(PEER), 1500, None);
        let mut rx = receiver(None);
        let mut dump = Dump::new(9, US, 0);
        (0..40).for_each(|n| dump.push(update(n)));
        let mut got = chunks_now(&mut sender, &mut rx, &mut dump, 1, 0);
        assert_eq!(got[0].1, (0..27).collect::<Vec<_>>());
        // A batch for 5 (sent), 30 (listed, queued), 45 (not listed yet).
        send_batch(&mut sender, &mut dump, &[5, 30, 45]);
        // Listed after the batch: 40..60 (45 among them), and 30 again (a session
        // ended and made again in a later slot).
        (40..60).for_each(|n| dump.push(update(n)));
        dump.push(update(30));
        dump.end_listing();
        while !dump.is_done() {
            got.extend(chunks_now(&mut sender, &mut rx, &mut dump, 1, 0));
        }
        let ports: Vec<u16> = got.into_iter().flat_map(|c| c.1).collect();
        let mut expected: Vec<u16> = (0..60).filter(|&n| n != 30).collect();
        expected.push(30);
        assert_eq!(ports, expected);
        assert_eq!(dump.skipped(), 1);
    }

    /// A listing that keeps ahead of the sending never lets the queue empty; a
    /// batch's mark must still go once every record listed before the batch is sent,
    /// or the marks would pile up for the whole dump.
    #[test]
    fn a_batch_mark_goes_once_the_records_listed_before_it_are_sent() {
        let mut sender = SyncSender::new(u32::from(PEER), 1500, None);
        let mut rx = receiver(None);
        let mut dump = Dump::new(9, US, 0);
        (0..40).for_each(|n| dump.push(update(n)));
        chunks_now(&mut sender, &mut rx, &mut dump, 1, 0);
        send_batch(&mut sender, &mut dump, &[30]);
        assert_eq!(dump.superseded.len(), 1);
        let mut next = 40;
        for _ in 0..3 {
            (next..next + 30).for_each(|n| dump.push(update(n)));
            next += 30;
            chunks_now(&mut sender, &mut rx, &mut dump, 1, 0);
            assert!(
                dump.queued() > 0,
                "the queue emptied: the test proves nothing"
            );
        }
        assert!(dump.superseded.is_empty(), "{:?}", dump.superseded);
        assert_eq!(dump.skipped(), 1);
    }

    /// A sparse table lists few records a turn: a short chunk (empty if need be)
    /// goes out once none went for `KEEPALIVE_MS`, and the standby takes each as
    /// progress, so its stall timer never fires however long the listing takes.
    #[test]
    fn a_slow_listing_sends_keepalive_chunks_the_standby_counts_as_progress() {
        use crate::ha::sync::peers::{Heard, Peers, ResyncState, RESYNC_TIMEOUT_MS};
        let mut sender = SyncSender::new(u32::from(PEER), 1500, None);
        let mut rx = receiver(None);
        let mut standby = Peers::new([PEER]);
        let start = 10_000;
        assert!(standby.asking(PEER, 5, false, start));
        let mut dump = Dump::new(5, US, start);
        let mut sent_at = Vec::new();
        let mut next = 0;
        // Ten seconds of 5 ms turns, one record listed every 200 turns (a second).
        for turn in 0..2_000u64 {
            let now = start + 5 * turn;
            if turn % 200 == 199 {
                dump.push(update(next));
                next += 1;
            }
            sender.continue_dump(&mut dump, 4, now, &mut [0u8; 1500], |d| {
                let a = rx.receive(d, PEER).unwrap();
                assert!(!a.header.flags.contains(MessageFlags::LAST_CHUNK));
                assert_eq!(standby.admit(PEER, &a.header, now), Ok(Heard::Ok));
                sent_at.push(now);
            });
            assert_eq!(standby.stalled(now).count(), 0, "stalled at {now}");
            assert_eq!(
                standby
                    .stalled(now + RESYNC_TIMEOUT_MS - KEEPALIVE_MS)
                    .count(),
                0
            );
        }
        // The first at once, then one every KEEPALIVE_MS.
        assert_eq!(sent_at[0], start);
        let gaps: Vec<u64> = sent_at.windows(2).map(|w| w[1] - w[0]).collect();
        assert!(gaps.iter().all(|&g| g == KEEPALIVE_MS), "{gaps:?}");
        assert_eq!(sent_at.len(), 20);
        let r = standby.iter().next().unwrap().resync;
        // Every other keepalive is empty.
        assert_eq!(
            (r.state, r.chunks, r.records),
            (ResyncState::Receiving, 20, 9)
        );
        dump.end_listing();
        let now = start + 10_000;
        sender.continue_dump(&mut dump, 4, now, &mut [0u8; 1500], |d| {
            let a = rx.receive(d, PEER).unwrap();
            assert!(a.header.flags.contains(MessageFlags::LAST_CHUNK));
            standby.admit(PEER, &a.header, now).unwrap();
        });
        let r = standby.iter().next().unwrap().resync;
        assert_eq!(
            (r.state, r.chunks, r.records),
            (ResyncState::Complete, 21, 10)
        );
    }

    /// The first chunk goes at once, whatever was listed by then; a short one after
    /// it waits for more records unless the listing is over, when it is the last; an
    /// empty table is one empty last chunk.
    #[test]
    fn the_first_chunk_goes_at_once_and_the_last_when_the_listing_ends() {
        let mut sender = SyncSender::new(u32::from(PEER), 1500, None);
        let mut rx = receiver(None);
        let mut dump = Dump::new(1, US, 0);
        assert_eq!(
            chunks_now(&mut sender, &mut rx, &mut dump, 4, 0),
            [(0, vec![], false)]
        );
        dump.push(update(1));
        assert!(chunks_now(&mut sender, &mut rx, &mut dump, 4, 1).is_empty());
        dump.end_listing();
        dump.push(update(2));
        assert_eq!(
            chunks_now(&mut sender, &mut rx, &mut dump, 4, 2),
            [(1, vec![1], true)],
            "nothing is taken after the listing ended"
        );
        let mut empty = Dump::of(2, US, [], 0);
        assert_eq!(
            chunks_now(&mut sender, &mut rx, &mut empty, 4, 0),
            [(0, vec![], true)]
        );
    }

    #[test]
    fn records_go_out_as_full_batches() {
        let mut sender = SyncSender::new(u32::from(PEER), 1500, None);
        let mut rx = receiver(None);
        let mut buf = [0u8; 1500];
        let template = crate::session::replication::RecordRepr::template(
            crate::session::replication::RecordOp::Update,
            Protocol::Tcp,
            std::net::SocketAddrV4::new(Ipv4Addr::new(203, 0, 113, 10), 80),
            Ipv4Addr::new(198, 51, 100, 0),
            24,
            std::net::SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), 80),
            ForwardMode::Nat,
            60_000,
        );
        let mut counts = Vec::new();
        let sent = sender.send_records(std::iter::repeat_n(template, 90), &mut buf, |d| {
            let a = rx.receive(d, PEER).unwrap();
            assert_eq!(a.header.message_type, MessageType::SessionBatch);
            assert!(a.records().all(|r| r == template));
            counts.push(a.header.count);
        });
        assert_eq!(sent, 90);
        assert_eq!(counts, [27, 27, 27, 9]);
        assert_eq!(
            sender.send_records(std::iter::empty(), &mut buf, |_| panic!()),
            0
        );
    }

    #[test]
    fn resync_request_is_accepted_and_carries_the_dump_id() {
        let key = SharedKey::new(&[1; 16]).unwrap();
        let mut sender = SyncSender::new(u32::from(PEER), 1500, Some(key.clone()));
        let mut buf = [0u8; 128];
        let request = sender.resync_request(0xabcd, US, &mut buf).to_vec();
        let mut rx = receiver(Some(key));
        let accepted = rx.receive(&request, PEER).unwrap();
        assert_eq!(accepted.header.message_type, MessageType::ResyncRequest);
        assert_eq!(accepted.header.dump_id, 0xabcd);
        assert_eq!(accepted.header.recipient, US);
        assert_eq!(accepted.header.epoch, sender.epoch());
        assert_eq!(accepted.records().count(), 0);
        assert_eq!(sender.next_sequence(), 1);
    }
}
