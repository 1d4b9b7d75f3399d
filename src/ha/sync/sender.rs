//! The active node's side: turning drained events into sync messages, answering a
//! resync request with a chunked dump, and asking for one. Pure: the caller provides
//! the buffer (one MTU) and a `send` for each finished datagram.
use super::auth;
use crate::dataplane::sync_events::EventRing;
use crate::ha::auth::SharedKey;
use crate::session::replication::{
    MessageBuilder, MessageFlags, MessageRepr, MessageType, RecordRepr, RecordSubject,
};
use std::collections::HashSet;
use std::net::Ipv4Addr;

/// A table being dumped to a peer, chunk by chunk (`SyncSender::continue_dump`), so a
/// large table goes out over several ticks instead of flooding the peer's receive
/// buffer at once.
///
/// The records are the table as it was when the peer asked, and the last chunks go
/// out seconds later (about 4 s for 1M sessions). Batches keep flowing meanwhile, to
/// every peer, the one dumped to included. A batch record is newer than the dump's
/// record of the same entry, so once one went out (`supersede`) the dump's is not
/// sent: arriving after the batch's, it would set the peer's copy back to the older
/// state (or bring back a session the batch ended) until the entry's next record.
pub struct Dump<I: Iterator<Item = RecordRepr>> {
    pub dump_id: u32,
    /// The peer that asked (its listen address): the chunks name it as recipient.
    pub to: Ipv4Addr,
    records: std::iter::Peekable<I>,
    next_chunk: u32,
    done: bool,
    /// Entries a batch described since the dump began. It grows with the batches
    /// sent while the dump goes out and is dropped with the dump.
    superseded: HashSet<RecordSubject>,
    /// The dump's records left out for a newer batch record.
    skipped: u64,
}

impl<I: Iterator<Item = RecordRepr>> Dump<I> {
    pub fn new(dump_id: u32, to: Ipv4Addr, records: impl IntoIterator<IntoIter = I>) -> Self {
        Dump {
            dump_id,
            to,
            records: records.into_iter().peekable(),
            next_chunk: 0,
            done: false,
            superseded: HashSet::new(),
            skipped: 0,
        }
    }

    /// A batch carried `record` to every peer: the dump's own record of the same
    /// entry, if not sent yet, is older and is left out.
    pub fn supersede(&mut self, record: &RecordRepr) {
        if !self.done {
            self.superseded.insert(record.subject());
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
        &mut self,
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

    /// Sends a whole table as dump `dump_id` at once: chunks numbered from 0, the last
    /// one flagged (an empty table is one empty last chunk). Returns the chunk count.
    pub fn send_dump<I: Iterator<Item = RecordRepr>>(
        &mut self,
        dump_id: u32,
        to: Ipv4Addr,
        records: impl IntoIterator<IntoIter = I>,
        buf: &mut [u8],
        send: impl FnMut(&[u8]),
    ) -> u32 {
        let mut dump = Dump::new(dump_id, to, records);
        self.continue_dump(&mut dump, u32::MAX, buf, send);
        dump.chunks_sent()
    }

    /// Sends at most `max_chunks` more chunks of `dump` (numbered on from the last
    /// call; the one holding the last record flagged). Returns the chunks sent now.
    pub fn continue_dump<I: Iterator<Item = RecordRepr>>(
        &mut self,
        dump: &mut Dump<I>,
        max_chunks: u32,
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
            // Fill the chunk; peeking at the next record then says whether it is the last.
            let mut builder = MessageBuilder::new(&mut *buf, header, self.mtu, authenticated);
            while let Some(record) = dump.records.peek() {
                if !dump.superseded.is_empty() && dump.superseded.contains(&record.subject()) {
                    dump.records.next();
                    dump.skipped += 1;
                    continue;
                }
                if builder.push(record).is_err() {
                    if builder.is_empty() {
                        // Larger than an empty message's room: it can never go.
                        dump.records.next();
                        continue;
                    }
                    break;
                }
                dump.records.next();
            }
            dump.next_chunk += 1;
            sent += 1;
            if dump.records.peek().is_none() {
                dump.done = true;
                dump.superseded = HashSet::new();
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
        let mut dump = Dump::new(7, US, table);
        let mut got = Vec::new();
        let mut calls = 0;
        while !dump.is_done() {
            calls += 1;
            let sent = sender.continue_dump(&mut dump, 4, &mut buf, |d| {
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
            sender.continue_dump(&mut dump, 4, &mut buf, |_| panic!()),
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
        let mut dump = Dump::new(7, US, table);
        let mut dumped = Vec::new();
        let mut chunks = |sender: &mut SyncSender, dump: &mut Dump<_>, n| {
            sender.continue_dump(dump, n, &mut [0u8; 1500], |d| {
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
