//! Where a bulk resync dump stands in the active node's tables, so the table is
//! listed a slice per management turn instead of whole in one: the workers' sessions
//! (worker by worker, by table position), then the IPv4 persistence templates, then
//! the IPv6 ones (by slot). Pure: the tables are read through a [`DumpSource`].
//!
//! What a dump listed across turns holds: every session or template that stays in its
//! slot from the dump's start to its end, once. An entry created (or moved to another
//! slot by being removed and made again) after the cursor passed its slot is not in
//! the dump; one the sync policy reports reaches the peer in a batch, as any change
//! made while a dump goes out. An entry removed before the cursor reached it is not
//! in the dump either, which is right.
use crate::session::replication::RecordRepr;

/// Template slots read per step at most (2 MiB of IPv4 slots): a step's cost is
/// bounded even in a large, nearly empty table.
pub const TEMPLATE_SLOTS_PER_STEP: usize = 65_536;

/// The tables a dump lists.
pub trait DumpSource {
    /// How many workers hold sessions.
    fn workers(&self) -> usize;

    /// Worker `worker`'s sessions from its table position `from` on, at most `max`
    /// (at least 1), as records given to `each`; where to go on in that worker's
    /// table (None: its end). A bounded piece of work (one question to the worker);
    /// Err when the worker could not be asked.
    fn sessions(
        &mut self,
        worker: usize,
        from: usize,
        max: usize,
        each: &mut dyn FnMut(RecordRepr),
    ) -> Result<Option<usize>, String>;

    /// Slots of the IPv4 template table (`v6` false) or the IPv6 one.
    fn template_slots(&self, v6: bool) -> usize;

    /// The live templates worth sending in slots `slots` of that table, as records.
    fn templates(
        &mut self,
        v6: bool,
        slots: std::ops::Range<usize>,
        each: &mut dyn FnMut(RecordRepr),
    );
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Position {
    Sessions { worker: usize, from: usize },
    Templates { v6: bool, from: usize },
    Done,
}

/// A dump's place in the tables; a new dump starts at the first worker's first slot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DumpCursor {
    at: Position,
}

impl Default for DumpCursor {
    fn default() -> Self {
        DumpCursor {
            at: Position::Sessions { worker: 0, from: 0 },
        }
    }
}

impl DumpCursor {
    /// Whether every table was listed to its end.
    pub fn is_done(&self) -> bool {
        self.at == Position::Done
    }

    /// Lists on from where the cursor stands, at most `max` records, while `more()`
    /// says there is time left (asked before each piece of work: one question to a
    /// worker, or up to [`TEMPLATE_SLOTS_PER_STEP`] template slots, so a step
    /// overruns its time by one piece at most). The cursor then stands after what
    /// was listed. Returns how many records were given to `each`.
    pub fn step(
        &mut self,
        source: &mut impl DumpSource,
        max: usize,
        mut more: impl FnMut() -> bool,
        mut each: impl FnMut(RecordRepr),
    ) -> Result<usize, String> {
        let mut listed = 0;
        while listed < max && !self.is_done() && more() {
            let room = max - listed;
            let mut count = |r| {
                listed += 1;
                each(r)
            };
            self.at = match self.at {
                Position::Sessions { worker, .. } if worker >= source.workers() => {
                    Position::Templates { v6: false, from: 0 }
                }
                Position::Sessions { worker, from } => {
                    match source.sessions(worker, from, room, &mut count)? {
                        Some(from) => Position::Sessions { worker, from },
                        None => Position::Sessions {
                            worker: worker + 1,
                            from: 0,
                        },
                    }
                }
                Position::Templates { v6, from } if from >= source.template_slots(v6) => {
                    if v6 {
                        Position::Done
                    } else {
                        Position::Templates { v6: true, from: 0 }
                    }
                }
                Position::Templates { v6, from } => {
                    // A slot holds one template at most: `room` slots cannot give
                    // more than `room` records.
                    let end = source
                        .template_slots(v6)
                        .min(from + room.min(TEMPLATE_SLOTS_PER_STEP));
                    source.templates(v6, from..end, &mut count);
                    Position::Templates { v6, from: end }
                }
                Position::Done => Position::Done,
            };
        }
        Ok(listed)
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// `moves` random slots of `table` change: an entry numbered a multiple of
    /// `every` ends (the others stay for the whole test), a free slot takes a new
    /// entry, numbered from `fresh` on in steps of `every`.
    pub(in crate::ha::sync) fn churn(
        table: &mut [Option<u16>],
        rng: &mut crate::wire::test_util::XorShift,
        moves: usize,
        every: u16,
        fresh: &mut u16,
    ) {
        for _ in 0..moves {
            let i = rng.below(table.len());
            match table[i] {
                Some(n) if n % every == 0 => table[i] = None,
                None => {
                    table[i] = Some(*fresh);
                    *fresh += every;
                }
                Some(_) => {}
            }
        }
    }
    use crate::flow::FlowKey4;
    use crate::model::{ForwardMode, Protocol};
    use crate::session::replication::{RecordKind, RecordOp};
    use crate::session::Session;
    use std::net::{Ipv4Addr, SocketAddrV4};

    /// Tables of plain slots: a session's or a template's record is its client port
    /// (and for a template, its client network's last octet).
    pub(crate) struct Tables {
        pub workers: Vec<Vec<Option<u16>>>,
        pub templates: [Vec<Option<u16>>; 2],
        /// Slots a worker reads per question at most (as `SLOTS_PER_ANSWER`).
        pub slots_per_answer: usize,
        pub questions: usize,
        pub fail_worker: Option<usize>,
    }

    pub(crate) fn session_record(port: u16) -> RecordRepr {
        let key = FlowKey4::new(
            Protocol::Tcp,
            Ipv4Addr::new(198, 51, 100, 1),
            port,
            Ipv4Addr::new(203, 0, 113, 10),
            80,
        );
        let s = Session::new(&key, ForwardMode::Nat, 0, 0, Ipv4Addr::new(10, 0, 0, 2), 80);
        RecordRepr::connection(&s, RecordOp::Update, 9)
    }

    pub(crate) fn template_record(n: u16) -> RecordRepr {
        RecordRepr::template(
            RecordOp::Update,
            Protocol::Tcp,
            SocketAddrV4::new(Ipv4Addr::new(203, 0, 113, 10), 80),
            Ipv4Addr::new(198, 51, (n >> 8) as u8, n as u8),
            32,
            SocketAddrV4::new(Ipv4Addr::new(10, 0, 0, 2), 80),
            ForwardMode::Nat,
            60_000,
        )
    }

    impl DumpSource for Tables {
        fn workers(&self) -> usize {
            self.workers.len()
        }

        fn sessions(
            &mut self,
            worker: usize,
            from: usize,
            max: usize,
            each: &mut dyn FnMut(RecordRepr),
        ) -> Result<Option<usize>, String> {
            assert!(max >= 1);
            self.questions += 1;
            if self.fail_worker == Some(worker) {
                return Err(format!("worker {worker}: no answer"));
            }
            let slots = &self.workers[worker];
            let end = slots.len().min(from + self.slots_per_answer);
            let mut given = 0;
            for (i, slot) in slots.iter().enumerate().take(end).skip(from) {
                if let Some(port) = slot {
                    if given == max {
                        return Ok(Some(i));
                    }
                    each(session_record(*port));
                    given += 1;
                }
            }
            Ok((end < slots.len()).then_some(end))
        }

        fn template_slots(&self, v6: bool) -> usize {
            self.templates[usize::from(v6)].len()
        }

        fn templates(
            &mut self,
            v6: bool,
            slots: std::ops::Range<usize>,
            each: &mut dyn FnMut(RecordRepr),
        ) {
            let table = &self.templates[usize::from(v6)];
            for n in table[slots].iter().flatten() {
                each(template_record(*n));
            }
        }
    }

    /// What a record stands for in these tables: ("s" or "t", its number).
    pub(crate) fn name(r: &RecordRepr) -> (char, u16) {
        match (r.kind, r.client.ip()) {
            (RecordKind::Template, std::net::IpAddr::V4(network)) => {
                let o = network.octets();
                ('t', u16::from_be_bytes([o[2], o[3]]))
            }
            _ => ('s', r.client.port()),
        }
    }

    fn tables() -> Tables {
        let slots = |n: usize, base: u16, every: usize| -> Vec<Option<u16>> {
            (0..n)
                .map(|i| (i % every == 0).then_some(base + i as u16))
                .collect()
        };
        Tables {
            // Worker 0 dense, worker 1 empty, worker 2 sparse.
            workers: vec![slots(300, 1000, 1), vec![None; 50], slots(1000, 5000, 37)],
            templates: [slots(100, 100, 3), slots(40, 400, 4)],
            slots_per_answer: 64,
            questions: 0,
            fail_worker: None,
        }
    }

    fn everything(t: &Tables) -> Vec<(char, u16)> {
        let sessions = t.workers.iter().flatten().flatten().map(|p| ('s', *p));
        let templates = t.templates.iter().flatten().flatten().map(|n| ('t', *n));
        sessions.chain(templates).collect()
    }

    #[test]
    fn steps_list_every_table_once_in_order_within_the_bound() {
        for max in [1, 7, 27, 1000, usize::MAX] {
            let mut t = tables();
            let mut cursor = DumpCursor::default();
            let mut got = Vec::new();
            let mut steps = 0;
            while !cursor.is_done() {
                steps += 1;
                let mut this_step = 0;
                let n = cursor
                    .step(
                        &mut t,
                        max,
                        || true,
                        |r| {
                            this_step += 1;
                            got.push(name(&r))
                        },
                    )
                    .unwrap();
                assert_eq!(n, this_step);
                assert!(n <= max, "{n} listed, bound {max}");
                assert!(steps < 10_000, "never done");
            }
            assert_eq!(got, everything(&t), "bound {max}");
            assert_eq!(cursor.step(&mut t, max, || true, |_| panic!()), Ok(0));
        }
    }

    /// The time bound: `more` is asked before each piece of work, so a step that is
    /// out of time at once lists nothing and does not move, and one allowed `k`
    /// pieces asks `k` questions at most.
    #[test]
    fn a_step_stops_when_its_time_is_up() {
        let mut t = tables();
        let mut cursor = DumpCursor::default();
        assert_eq!(cursor.step(&mut t, 100, || false, |_| panic!()), Ok(0));
        assert_eq!((cursor, t.questions), (DumpCursor::default(), 0));
        let mut got = Vec::new();
        let mut pieces = 0;
        while !cursor.is_done() {
            let mut left = 2;
            let before = t.questions;
            cursor
                .step(
                    &mut t,
                    usize::MAX,
                    || {
                        left -= 1;
                        left >= 0
                    },
                    |r| got.push(name(&r)),
                )
                .unwrap();
            assert!(t.questions - before <= 2);
            pieces += 1;
        }
        assert_eq!(got, everything(&t));
        assert!(pieces > 10, "{pieces} steps");
    }

    /// Between steps the tables change: what stays put from start to end is listed
    /// exactly once; what is removed before the cursor reaches it is not; nothing is
    /// listed twice.
    #[test]
    fn a_table_changing_between_steps_loses_and_repeats_nothing_that_stays() {
        let mut t = tables();
        let mut rng = crate::wire::test_util::XorShift(0x0d0e_5eed);
        let stays: Vec<(char, u16)> = everything(&t)
            .into_iter()
            .filter(|(_, n)| n % 5 != 0)
            .collect();
        let mut cursor = DumpCursor::default();
        let mut got = Vec::new();
        let mut next_new = 20_000u16;
        while !cursor.is_done() {
            cursor
                .step(&mut t, 11, || true, |r| got.push(name(&r)))
                .unwrap();
            // Entries numbered a multiple of 5 may go; new ones land in free slots.
            for table in t.workers.iter_mut().chain(t.templates.iter_mut()) {
                churn(table, &mut rng, 3, 5, &mut next_new);
            }
        }
        let mut sorted = got.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), got.len(), "something listed twice");
        for entry in &stays {
            assert!(got.contains(entry), "{entry:?} stayed and was not listed");
        }
    }

    #[test]
    fn a_worker_that_does_not_answer_fails_the_step() {
        let mut t = tables();
        t.fail_worker = Some(2);
        let mut cursor = DumpCursor::default();
        let err = loop {
            match cursor.step(&mut t, 50, || true, |_| {}) {
                Ok(_) => assert!(!cursor.is_done()),
                Err(e) => break e,
            }
        };
        assert!(err.contains("worker 2"), "{err}");
    }
}
