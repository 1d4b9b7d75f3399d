//! The TCP connection state machine, with the semantics of Linux IPVS
//! (`net/netfilter/ipvs/ip_vs_proto_tcp.c`, default tables, not `secure_tcp`).
//!
//! A load balancer sees at best both halves of a connection and at worst only the
//! client's half (DR and TUN: replies go straight from the real server to the client).
//! It does not track sequence numbers: each packet's flags move the state, looked at in
//! a fixed order of precedence, RST, then SYN, then FIN, then ACK, and the direction
//! selects one of three tables. The state then selects the session's timeout.
//!
//! As in IPVS, a segment carrying none of those four flags moves the connection to
//! CLOSE whatever its state was: IPVS starts from CLOSE and only consults a table when
//! one of the flags is present.
use core::fmt;

use crate::wire::tcp::TcpFlags;

/// Connection states, numbered as IPVS numbers them (`IP_VS_TCP_S_*`), so a state byte
/// synced from or to an IPVS peer keeps its meaning.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum TcpState {
    /// Created, no packet classified yet. Also the state of every UDP session.
    #[default]
    None = 0,
    Established = 1,
    /// The real server sent a SYN (seen on the reply side).
    SynSent = 2,
    /// The client sent a SYN.
    SynRecv = 3,
    FinWait = 4,
    TimeWait = 5,
    Close = 6,
    CloseWait = 7,
    LastAck = 8,
    Listen = 9,
    /// Only reachable with IPVS's `secure_tcp` tables; kept so the numbering and the
    /// timeout table match IPVS.
    SynAck = 10,
}

impl TcpState {
    /// Number of states; the size of per-state tables.
    pub const COUNT: usize = 11;

    /// Every state, in numbering order.
    pub const ALL: [TcpState; TcpState::COUNT] = [
        TcpState::None,
        TcpState::Established,
        TcpState::SynSent,
        TcpState::SynRecv,
        TcpState::FinWait,
        TcpState::TimeWait,
        TcpState::Close,
        TcpState::CloseWait,
        TcpState::LastAck,
        TcpState::Listen,
        TcpState::SynAck,
    ];

    /// The state with IPVS number `n`, if there is one.
    pub const fn from_u8(n: u8) -> Option<TcpState> {
        if (n as usize) < TcpState::COUNT {
            Some(TcpState::ALL[n as usize])
        } else {
            None
        }
    }

    /// The name `ipvsadm -Lnc` prints (taken by IPVS from `/proc/net/ip_vs_conn`).
    pub const fn name(self) -> &'static str {
        match self {
            TcpState::None => "NONE",
            TcpState::Established => "ESTABLISHED",
            TcpState::SynSent => "SYN_SENT",
            TcpState::SynRecv => "SYN_RECV",
            TcpState::FinWait => "FIN_WAIT",
            TcpState::TimeWait => "TIME_WAIT",
            TcpState::Close => "CLOSE",
            TcpState::CloseWait => "CLOSE_WAIT",
            TcpState::LastAck => "LAST_ACK",
            TcpState::Listen => "LISTEN",
            TcpState::SynAck => "SYNACK",
        }
    }
}

impl fmt::Display for TcpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What `ipvsadm -Lnc` shows in the state column of a UDP connection.
pub const UDP_STATE_NAME: &str = "UDP";

/// Which way a packet travels, and so which transition table applies.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Direction {
    /// From the client towards the virtual service.
    Inbound = 0,
    /// From the real server back towards the client (NAT, FullNAT).
    Outbound = 1,
    /// From the client, on a connection whose replies bypass Sluice (DR, TUN). IPVS
    /// calls this table INPUT-ONLY: a client FIN then means the whole connection is
    /// closing, since the server's half is never seen.
    InputOnly = 2,
}

/// The flag a transition looks at: the first present of RST, SYN, FIN, ACK.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum TcpEvent {
    Syn = 0,
    Fin = 1,
    Ack = 2,
    Rst = 3,
}

impl TcpEvent {
    /// Classifies a segment's flags. `None` when none of the four is set (the segment
    /// then closes the connection, as in IPVS).
    #[inline]
    pub const fn from_flags(flags: TcpFlags) -> Option<TcpEvent> {
        // RST first: a reset ends the connection whatever else the segment carries.
        if flags.contains(TcpFlags::RST) {
            Some(TcpEvent::Rst)
        } else if flags.contains(TcpFlags::SYN) {
            Some(TcpEvent::Syn)
        } else if flags.contains(TcpFlags::FIN) {
            Some(TcpEvent::Fin)
        } else if flags.contains(TcpFlags::ACK) {
            Some(TcpEvent::Ack)
        } else {
            None
        }
    }
}

/// A TCP connection whose handshake has not completed: what table pressure may
/// reclaim (the creation order of `reclaim`).
pub const fn is_half_open(state: TcpState) -> bool {
    matches!(
        state,
        TcpState::None | TcpState::SynRecv | TcpState::SynSent
    )
}

/// A TCP connection that is over: TIME_WAIT or CLOSE. Kept only to absorb late
/// segments, so table pressure may reclaim it as it does half-open ones: a client that
/// sends a SYN and then a FIN (or a RST) from spoofed addresses would otherwise fill
/// the table with sessions that no one will use for `time_wait` (120 s).
pub const fn is_finished(state: TcpState) -> bool {
    matches!(state, TcpState::TimeWait | TcpState::Close)
}

/// Whether a connection counts in the real server's ActiveConn column (`ipvsadm -Ln`);
/// every other connection, UDP included, counts in InActConn.
///
/// Only ESTABLISHED is active. Note: IPVS since Linux 4.7 also counts SYN_SENT,
/// SYN_RECV and SYNACK as active; changing this function is all it takes to follow it.
#[inline]
pub const fn is_active(state: TcpState) -> bool {
    matches!(state, TcpState::Established)
}

/// How a transition moved the connection between the active and inactive counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ActivityChange {
    /// Decrement the real server's inactive count, increment its active count.
    BecameActive,
    /// Decrement the real server's active count, increment its inactive count.
    BecameInactive,
}

/// The outcome of one packet on a connection's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Transition {
    pub from: TcpState,
    pub to: TcpState,
}

impl Transition {
    /// The state moved (the timeout must then be re-read for the new state).
    #[inline]
    pub fn changed(&self) -> bool {
        self.from != self.to
    }

    /// Set when the connection moved between the active and inactive counts.
    #[inline]
    pub fn activity_change(&self) -> Option<ActivityChange> {
        match (is_active(self.from), is_active(self.to)) {
            (false, true) => Some(ActivityChange::BecameActive),
            (true, false) => Some(ActivityChange::BecameInactive),
            _ => None,
        }
    }
}

/// The state after a segment with `flags` travelling in `dir`.
#[inline]
pub fn next(state: TcpState, dir: Direction, flags: TcpFlags) -> TcpState {
    match TcpEvent::from_flags(flags) {
        Some(event) => next_on_event(state, dir, event),
        None => TcpState::Close,
    }
}

/// [`next`], reported as a [`Transition`].
#[inline]
pub fn transition(state: TcpState, dir: Direction, flags: TcpFlags) -> Transition {
    Transition {
        from: state,
        to: next(state, dir, flags),
    }
}

/// [`transition`] for a FullNAT session, or one whose client's sequence is not known
/// (a session installed by sync, until a real server's acknowledgment passes), which
/// a blind FIN can move: a SYN never takes a session past its handshake (FIN_WAIT,
/// CLOSE_WAIT, LAST_ACK; ESTABLISHED stays anyway) back to a half-open state, where it
/// stays. Otherwise a FIN (a real one, or a blind one where the sequence is not known:
/// a SYN is never checked) then a SYN would dress a live connection as a handshake
/// that never completed, which a new session may end to take its FullNAT local port.
/// The cost: a client that opens a new connection from the same port while its last
/// one is closing keeps the closing state's timeout for it.
#[inline]
pub fn transition_never_back_to_handshake(
    state: TcpState,
    dir: Direction,
    flags: TcpFlags,
) -> Transition {
    let t = transition(state, dir, flags);
    let past_handshake = matches!(
        state,
        TcpState::Established | TcpState::FinWait | TcpState::CloseWait | TcpState::LastAck
    );
    if past_handshake && is_half_open(t.to) {
        Transition {
            from: state,
            to: state,
        }
    } else {
        t
    }
}

/// The table lookup proper: the state after `event` in direction `dir`.
#[inline]
pub fn next_on_event(state: TcpState, dir: Direction, event: TcpEvent) -> TcpState {
    TABLES[dir as usize][event as usize][state as usize]
}

/// One row per event (in [`TcpEvent`] order), one column per current state (in
/// [`TcpState`] order): the next state.
type Table = [[TcpState; TcpState::COUNT]; 4];

// Short names so each row reads as one line of the IPVS tables. NONE and SYNACK are
// never successors in these tables, so they have no short name.
const ES: TcpState = TcpState::Established;
const SS: TcpState = TcpState::SynSent;
const SR: TcpState = TcpState::SynRecv;
const FW: TcpState = TcpState::FinWait;
const TW: TcpState = TcpState::TimeWait;
const CL: TcpState = TcpState::Close;
const CW: TcpState = TcpState::CloseWait;
const LA: TcpState = TcpState::LastAck;
const LI: TcpState = TcpState::Listen;

#[rustfmt::skip]
const TABLES: [Table; 3] = [
    // Inbound: from the client.
    //     NONE ESTAB SYN_S SYN_R FIN_W TIME_ CLOSE CL_WT L_ACK LISTN SYNAK
    [
        [SR,  ES,   ES,   SR,   SR,   SR,   SR,   SR,   SR,   SR,   SR], // SYN
        [CL,  CW,   SS,   TW,   TW,   TW,   CL,   CW,   LA,   LI,   TW], // FIN
        [ES,  ES,   SS,   ES,   FW,   TW,   CL,   CW,   CL,   LI,   ES], // ACK
        [CL,  CL,   CL,   SR,   CL,   CL,   CL,   CL,   LA,   LI,   SR], // RST
    ],
    // Outbound: from the real server.
    [
        [SS,  ES,   SS,   SR,   SS,   SS,   SS,   SS,   SS,   LI,   SR], // SYN
        [TW,  FW,   SS,   TW,   FW,   TW,   CL,   TW,   LA,   LI,   TW], // FIN
        [ES,  ES,   SS,   ES,   FW,   TW,   CL,   CW,   LA,   ES,   ES], // ACK
        [CL,  CL,   SS,   CL,   CL,   TW,   CL,   CL,   CL,   CL,   CL], // RST
    ],
    // InputOnly: from the client, replies never seen.
    [
        [SR,  ES,   ES,   SR,   SR,   SR,   SR,   SR,   SR,   SR,   SR], // SYN
        [CL,  FW,   SS,   TW,   FW,   TW,   CL,   CW,   LA,   LI,   TW], // FIN
        [ES,  ES,   SS,   ES,   FW,   TW,   CL,   CW,   CL,   LI,   ES], // ACK
        [CL,  CL,   CL,   SR,   CL,   CL,   CL,   CL,   LA,   LI,   CL], // RST
    ],
];

#[cfg(test)]
mod tests {
    use super::*;
    use TcpState::*;

    const S: TcpFlags = TcpFlags::SYN;
    const F: TcpFlags = TcpFlags::FIN;
    const A: TcpFlags = TcpFlags::ACK;
    const R: TcpFlags = TcpFlags::RST;

    /// Expected successors, written per current state (the transpose of the tables
    /// above, so a slip in one layout does not hide in the other):
    /// `(state, [after SYN, after FIN, after ACK, after RST])`.
    type Expected = [(TcpState, [TcpState; 4]); TcpState::COUNT];

    const INBOUND: Expected = [
        (None, [SynRecv, Close, Established, Close]),
        (Established, [Established, CloseWait, Established, Close]),
        (SynSent, [Established, SynSent, SynSent, Close]),
        (SynRecv, [SynRecv, TimeWait, Established, SynRecv]),
        (FinWait, [SynRecv, TimeWait, FinWait, Close]),
        (TimeWait, [SynRecv, TimeWait, TimeWait, Close]),
        (Close, [SynRecv, Close, Close, Close]),
        (CloseWait, [SynRecv, CloseWait, CloseWait, Close]),
        (LastAck, [SynRecv, LastAck, Close, LastAck]),
        (Listen, [SynRecv, Listen, Listen, Listen]),
        (SynAck, [SynRecv, TimeWait, Established, SynRecv]),
    ];

    const OUTBOUND: Expected = [
        (None, [SynSent, TimeWait, Established, Close]),
        (Established, [Established, FinWait, Established, Close]),
        (SynSent, [SynSent, SynSent, SynSent, SynSent]),
        (SynRecv, [SynRecv, TimeWait, Established, Close]),
        (FinWait, [SynSent, FinWait, FinWait, Close]),
        (TimeWait, [SynSent, TimeWait, TimeWait, TimeWait]),
        (Close, [SynSent, Close, Close, Close]),
        (CloseWait, [SynSent, TimeWait, CloseWait, Close]),
        (LastAck, [SynSent, LastAck, LastAck, Close]),
        (Listen, [Listen, Listen, Established, Close]),
        (SynAck, [SynRecv, TimeWait, Established, Close]),
    ];

    const INPUT_ONLY: Expected = [
        (None, [SynRecv, Close, Established, Close]),
        (Established, [Established, FinWait, Established, Close]),
        (SynSent, [Established, SynSent, SynSent, Close]),
        (SynRecv, [SynRecv, TimeWait, Established, SynRecv]),
        (FinWait, [SynRecv, FinWait, FinWait, Close]),
        (TimeWait, [SynRecv, TimeWait, TimeWait, Close]),
        (Close, [SynRecv, Close, Close, Close]),
        (CloseWait, [SynRecv, CloseWait, CloseWait, Close]),
        (LastAck, [SynRecv, LastAck, Close, LastAck]),
        (Listen, [SynRecv, Listen, Listen, Listen]),
        (SynAck, [SynRecv, TimeWait, Established, Close]),
    ];

    #[test]
    fn every_transition_of_every_table() {
        let mut checked = 0;
        for (dir, expected) in [
            (Direction::Inbound, &INBOUND),
            (Direction::Outbound, &OUTBOUND),
            (Direction::InputOnly, &INPUT_ONLY),
        ] {
            // Each state appears once, in order: the list is complete.
            let states: Vec<TcpState> = expected.iter().map(|(s, _)| *s).collect();
            assert_eq!(states, TcpState::ALL);
            for &(state, successors) in expected {
                for (flags, want) in [S, F, A, R].into_iter().zip(successors) {
                    assert_eq!(
                        next(state, dir, flags),
                        want,
                        "{dir:?} {state} on {flags:?}"
                    );
                    checked += 1;
                }
            }
        }
        assert_eq!(checked, 3 * TcpState::COUNT * 4);
    }

    #[test]
    fn no_classifying_flag_closes_in_every_table() {
        for dir in [
            Direction::Inbound,
            Direction::Outbound,
            Direction::InputOnly,
        ] {
            for state in TcpState::ALL {
                for flags in [
                    TcpFlags::empty(),
                    TcpFlags::PSH,
                    TcpFlags::URG | TcpFlags::PSH,
                ] {
                    assert_eq!(next(state, dir, flags), Close, "{dir:?} {state} {flags:?}");
                }
            }
        }
    }

    #[test]
    fn flag_precedence_is_rst_syn_fin_ack() {
        assert_eq!(TcpEvent::from_flags(R | S | F | A), Some(TcpEvent::Rst));
        assert_eq!(TcpEvent::from_flags(S | F | A), Some(TcpEvent::Syn));
        assert_eq!(TcpEvent::from_flags(S | A), Some(TcpEvent::Syn));
        assert_eq!(TcpEvent::from_flags(F | A), Some(TcpEvent::Fin));
        assert_eq!(TcpEvent::from_flags(A | TcpFlags::PSH), Some(TcpEvent::Ack));
        assert_eq!(TcpEvent::from_flags(TcpFlags::PSH), Option::None);
        // A SYN+ACK from the server on a fresh NAT connection: SYN wins.
        assert_eq!(next(SynRecv, Direction::Outbound, S | A), SynRecv);
        // FIN+ACK from the client of an established DR connection: FIN wins.
        assert_eq!(next(Established, Direction::InputOnly, F | A), FinWait);
    }

    #[test]
    fn nat_handshake_and_close() {
        let steps = [
            (Direction::Inbound, S, SynRecv),
            (Direction::Outbound, S | A, SynRecv),
            (Direction::Inbound, A, Established),
            (Direction::Inbound, F | A, CloseWait),
            (Direction::Outbound, A, CloseWait),
            (Direction::Outbound, F | A, TimeWait),
            (Direction::Inbound, A, TimeWait),
        ];
        let mut state = None;
        for (dir, flags, want) in steps {
            state = next(state, dir, flags);
            assert_eq!(state, want, "{dir:?} {flags:?}");
        }
    }

    #[test]
    fn activity_changes_only_across_established() {
        let t = transition(SynRecv, Direction::Inbound, A);
        assert_eq!(t.to, Established);
        assert!(t.changed());
        assert_eq!(t.activity_change(), Some(ActivityChange::BecameActive));

        let t = transition(Established, Direction::InputOnly, F | A);
        assert_eq!(t.activity_change(), Some(ActivityChange::BecameInactive));

        let t = transition(Established, Direction::Inbound, A);
        assert!(!t.changed());
        assert_eq!(t.activity_change(), Option::None);

        let t = transition(None, Direction::Inbound, S);
        assert!(t.changed());
        assert_eq!(t.activity_change(), Option::None);

        for state in TcpState::ALL {
            assert_eq!(is_active(state), state == Established);
        }
    }

    #[test]
    fn names_and_numbers_match_ipvs() {
        let names: Vec<&str> = TcpState::ALL.iter().map(|s| s.name()).collect();
        assert_eq!(
            names,
            [
                "NONE",
                "ESTABLISHED",
                "SYN_SENT",
                "SYN_RECV",
                "FIN_WAIT",
                "TIME_WAIT",
                "CLOSE",
                "CLOSE_WAIT",
                "LAST_ACK",
                "LISTEN",
                "SYNACK"
            ]
        );
        for (n, state) in TcpState::ALL.iter().enumerate() {
            assert_eq!(*state as usize, n);
            assert_eq!(TcpState::from_u8(n as u8), Some(*state));
        }
        assert_eq!(TcpState::from_u8(11), Option::None);
        assert_eq!(SynRecv.to_string(), "SYN_RECV");
        assert_eq!(UDP_STATE_NAME, "UDP");
    }
}
