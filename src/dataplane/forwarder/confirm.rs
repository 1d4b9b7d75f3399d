//! Confirm: a persistence template bound by a client's SYN starts unconfirmed
//! (`session::persist::Trust`: it never evicts one that stands higher) until its
//! connection shows that its client is there:
//!
//! - **NAT and FullNAT:** the client's ACK that establishes the session
//!   acknowledges the real server's SYN-ACK exactly (its sequence number + 1): the
//!   template is confirmed. A spoofed SYN's SYN-ACK goes to the address it spoofed,
//!   so its sender never learns that number. The worker remembers the SYN-ACK's
//!   sequence number in a small table by session slot ([`HandshakeProofs`]): a
//!   SYN-ACK writes it, the establishing ACK reads it.
//! - **DR and TUN:** the real server's SYN-ACK bypasses Sluice. The client's ACK that
//!   completes its handshake raises the template to unverified, UDP's standing: a
//!   blind sender can send that ACK too, so such templates can evict each other, and
//!   UDP ones, but never a confirmed one.
//! - The SYN proxy's connections (its cookie proved the client) start confirmed, UDP
//!   ones unverified (`Forwarder::place`).
//!
//! IPv6 sessions (and NAT64 ones) are raised the same way, their slots keyed apart
//! ([`PersistentSession`]).
//!
//! **Cost.** Only a packet that moves a persistent session's state, or a real
//! server's SYN-ACK to one, comes here: a handful per connection, none in its
//! established run. A SYN-ACK writes one 8-byte entry of the table; the client's ACK
//! that establishes the session reads it, then reads the shared template, and writes
//! it when it raises it (once per template while it lives, not per connection).
//!
//! **What it takes from an attacker.** The client's ACK is checked when it moves the
//! session to ESTABLISHED, once. Whatever gets the session there first leaves that
//! connection's template where it stood: a blind sender who knows a client's address
//! and port and sends a forged ACK the server drops (a bad checksum), or a real
//! server that sends data before the handshake completes (TCP Fast Open), which
//! moves the session itself. The template then stays unconfirmed, evictable by
//! anything, until another connection of the client confirms it. A sloppy TCP
//! session (opened by a segment other than a SYN) has no SYN-ACK to answer: its
//! template stays unconfirmed too.
use super::{client_template, tcp_word, Forwarder, TemplateRenewal};
use crate::dataplane::counters::{Event, WorkerCounters};
use crate::flow::parse::Parsed;
use crate::model::{ForwardMode, Protocol};
use crate::session::persist::{Bind, Template, Trust};
use crate::session::table6::Session6;
use crate::session::{Direction, Session, SessionFlags, SessionId, TcpState, Transition};
use crate::wire::tcp::TcpFlags;
use std::net::{IpAddr, Ipv4Addr};

/// What the client's ACK must acknowledge, per session slot, in a table of
/// [`HandshakeProofs::SLOTS`] entries indexed by the slot's low bits: handshakes in
/// flight on one worker at once are few, and two that share an entry cost the
/// earlier one its confirmation only (its template stays unconfirmed). Under a flood
/// of spoofed SYNs each SYN-ACK, and each of its retransmissions, overwrites an entry
/// at random: at 100,000 SYN-ACKs a second a client has about 40 ms to answer. Such
/// floods are what the SYN proxy is for.
pub(super) struct HandshakeProofs {
    entries: Box<[Expected]>,
}

#[derive(Clone, Copy, Default)]
struct Expected {
    /// The session slot + 1; 0: none.
    slot: u32,
    /// The acknowledgment number that confirms (the SYN-ACK's sequence + 1).
    ack: u32,
}

impl HandshakeProofs {
    /// Entries: 32 KiB per worker.
    pub(super) const SLOTS: usize = 4096;

    pub(super) fn new() -> HandshakeProofs {
        HandshakeProofs {
            entries: vec![Expected::default(); Self::SLOTS].into_boxed_slice(),
        }
    }

    fn entry(&mut self, slot: u32) -> &mut Expected {
        &mut self.entries[slot as usize % Self::SLOTS]
    }

    /// The session of `slot` (a [`PersistentSession::proof_key`]): its real server
    /// sent its SYN-ACK with sequence number `seq`.
    pub(super) fn expect(&mut self, slot: u32, seq: u32) {
        *self.entry(slot) = Expected {
            slot: slot.wrapping_add(1),
            ack: seq.wrapping_add(1),
        };
    }

    /// Whether a client's acknowledgment `ack` on the session in `slot` answers its
    /// SYN-ACK; the entry is used up when it does, and left when it does not.
    pub(super) fn take(&mut self, slot: u32, ack: u32) -> bool {
        let e = self.entry(slot);
        let hit = e.slot == slot.wrapping_add(1) && e.ack == ack;
        if hit {
            *e = Expected::default();
        }
        hit
    }

    /// A new session took `slot`: an entry the slot's last session left means nothing.
    pub(super) fn forget(&mut self, slot: u32) {
        let e = self.entry(slot);
        if e.slot == slot.wrapping_add(1) {
            *e = Expected::default();
        }
    }
}

/// What [`Forwarder::confirm_on`] needs of a persistent session of either table.
#[derive(Clone, Copy, Debug)]
pub(super) struct PersistentSession {
    /// Its key in [`HandshakeProofs`]: its slot in the IPv4 table, or in the IPv6
    /// table with [`PersistentSession::V6`] set (slots are below 2^26).
    pub proof_key: u32,
    pub mode: ForwardMode,
    pub proto: Protocol,
    /// Opened by the SYN proxy: placement bound or raised its template to confirmed
    /// (unless that write was lost to another writer's).
    pub proxied: bool,
    pub service: u32,
    pub real: u32,
    pub client: IpAddr,
}

impl PersistentSession {
    /// Marks an IPv6 table slot's proof key.
    const V6: u32 = 1 << 31;

    /// IPv4 session `id`, `s`.
    pub(super) fn of(id: SessionId, s: &Session) -> PersistentSession {
        PersistentSession {
            proof_key: id.index(),
            mode: s.mode,
            proto: s.proto,
            proxied: s.flags().contains(SessionFlags::SYNPROXY),
            service: s.service,
            real: s.real(),
            client: Ipv4Addr::from(s.client_addr).into(),
        }
    }

    /// IPv6 (or NAT64) session `id`, `s`.
    pub(super) fn of_v6(id: u32, s: &Session6) -> PersistentSession {
        PersistentSession {
            proof_key: Self::proof_key_v6(id),
            mode: s.mode,
            proto: s.proto,
            proxied: false,
            service: s.service,
            real: s.real,
            client: s.client.into(),
        }
    }

    /// The proof key of IPv6 table slot `id`.
    pub(super) fn proof_key_v6(id: u32) -> u32 {
        id | Self::V6
    }
}

impl Forwarder {
    /// A segment moved persistent session `s` by `t`, a state change or the real
    /// server's SYN-ACK (`frame`, its headers `parsed`): a NAT or FullNAT SYN-ACK is
    /// remembered; the client's ACK that answers it (establishing the session)
    /// confirms the session's template; in DR and TUN, the client's ACK that
    /// completes the handshake raises it to unverified.
    ///
    /// Cold and not inlined: a few packets per persistent connection come here, and
    /// the established path keeps only the test that sends them.
    #[cold]
    #[inline(never)]
    pub(super) fn confirm_on(
        &mut self,
        s: PersistentSession,
        (dir, flags, t): (Direction, TcpFlags, Transition),
        frame: &[u8],
        parsed: &Parsed,
        counters: &WorkerCounters,
    ) {
        if s.proto != Protocol::Tcp || s.proxied {
            return; // UDP and the SYN proxy's connections were placed as high as they go.
        }
        let Some(proofs) = self.proofs.as_mut() else {
            return;
        };
        let established = t.changed() && t.to == TcpState::Established;
        let raised = match (s.mode, dir) {
            (ForwardMode::Nat | ForwardMode::FullNat, Direction::Outbound)
                if flags.contains(TcpFlags::SYN | TcpFlags::ACK) =>
            {
                if let Some(seq) = tcp_word(frame, parsed, 4) {
                    proofs.expect(s.proof_key, seq);
                }
                None
            }
            (ForwardMode::Nat | ForwardMode::FullNat, Direction::Inbound)
                if established && !flags.intersects(TcpFlags::SYN | TcpFlags::RST) =>
            {
                tcp_word(frame, parsed, 8)
                    .is_some_and(|ack| proofs.take(s.proof_key, ack))
                    .then_some(Trust::Confirmed)
            }
            // Only what a blind sender can forge: no higher than UDP's.
            (ForwardMode::Dr | ForwardMode::Tun, Direction::Inbound) => (established
                && matches!(t.from, TcpState::SynRecv | TcpState::SynAck))
            .then_some(Trust::Unverified),
            _ => None,
        };
        if let Some(trust) = raised {
            self.raise_template(&s, trust, counters);
        }
    }

    /// Session `s`'s connection showed its client as far as `trust`: its template,
    /// bound lower, is raised (or bound again, if it went meanwhile).
    fn raise_template(&self, s: &PersistentSession, trust: Trust, counters: &WorkerCounters) {
        let snap = self.snapshot.current();
        let Some((table, key, p)) = client_template(&self.persist, snap, s.service, s.client, true)
        else {
            return;
        };
        let (now, real) = (self.now_tick, s.real);
        // A connection that followed a template as high has nothing to add: a read.
        if key
            .lookup(table, now)
            .is_some_and(|t| t.trust >= trust && t.real == real)
        {
            return;
        }
        // Not for a real server that left, or across the sorry server's switch: the
        // next connection of the network is placed afresh, as placement would.
        let placeable = snap.by_id(s.service).is_some_and(|v| {
            v.real_servers.iter().any(|r| r.id == real)
                && !v.sorry_switched(real)
                && snap.keeps_real_server(real)
        });
        if !placeable {
            return;
        }
        let holds = TemplateRenewal::of(p.timeout_s, self.ticks_per_second).holds;
        match key.bind(
            table,
            Template::new(real, now.wrapping_add(holds), trust),
            now,
        ) {
            Bind::Created | Bind::Raised => {}
            // As high already (a connection of another worker raised it an instant
            // ago), or bound to another server since: that one's own connection
            // raises it, or not.
            Bind::Existing(_) => return,
            Bind::CreatedEvicting => counters.event(Event::PersistEvicted),
            Bind::Busy => {
                counters.event(Event::PersistBusy);
                return;
            }
            // An unverified template (DR, TUN) in a bucket of confirmed ones: placement
            // counted its connection in `persist_no_room` already.
            Bind::NoRoom => return,
        }
        counters.event(match trust {
            Trust::Confirmed => Event::PersistConfirmed,
            _ => Event::PersistUnverified,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The client's ACK confirms only with the SYN-ACK's sequence + 1, once; a wrong
    /// guess leaves the entry; another slot sharing the entry takes it over; a new
    /// session in the slot forgets what the last one left.
    #[test]
    fn only_an_ack_of_the_syn_acks_sequence_takes_the_entry() {
        let mut proofs = HandshakeProofs::new();
        assert!(!proofs.take(5, 0), "nothing expected");
        proofs.expect(5, u32::MAX);
        assert!(!proofs.take(5, u32::MAX), "the SYN-ACK's own number");
        assert!(!proofs.take(6, 0), "another slot");
        assert!(proofs.take(5, 0), "sequence + 1, wrapped");
        assert!(!proofs.take(5, 0), "used up");
        let shares = HandshakeProofs::SLOTS as u32 + 5;
        proofs.expect(5, 100);
        proofs.expect(shares, 200);
        assert!(
            !proofs.take(5, 101),
            "overwritten by a slot sharing its entry"
        );
        assert!(proofs.take(shares, 201));
        proofs.expect(7, 300);
        proofs.forget(7 + HandshakeProofs::SLOTS as u32);
        assert!(proofs.take(7, 301), "another slot's forget leaves it");
        proofs.expect(7, 300);
        proofs.forget(7);
        assert!(!proofs.take(7, 301), "forgotten");
    }

    /// A TCP segment from `src` to `dst` with `flags`, sequence `seq` and
    /// acknowledgment `ack`, in an Ethernet frame, and its headers.
    fn segment(
        src: (Ipv4Addr, u16),
        dst: (Ipv4Addr, u16),
        flags: u8,
        seq: u32,
        ack: u32,
    ) -> (Vec<u8>, Parsed) {
        let mut f = vec![0u8; 14 + 20 + 20];
        f[..12].copy_from_slice(&[2, 0, 0, 0, 0, 1, 2, 0, 0, 0, 0, 2]);
        f[12..14].copy_from_slice(&[0x08, 0x00]);
        f[14..26].copy_from_slice(&[0x45, 0, 0, 40, 0, 0, 0x40, 0, 64, 6, 0, 0]);
        f[26..30].copy_from_slice(&src.0.octets());
        f[30..34].copy_from_slice(&dst.0.octets());
        crate::wire::ipv4::Packet::new_unchecked(&mut f[14..34]).fill_checksum();
        f[34..36].copy_from_slice(&src.1.to_be_bytes());
        f[36..38].copy_from_slice(&dst.1.to_be_bytes());
        f[38..42].copy_from_slice(&seq.to_be_bytes());
        f[42..46].copy_from_slice(&ack.to_be_bytes());
        f[46..48].copy_from_slice(&[0x50, flags]);
        f[48..50].copy_from_slice(&[0x20, 0]);
        let parsed = crate::flow::parse::classify(&f).expect("a valid frame");
        (f, parsed)
    }

    /// The NAT and DR rules end to end on the forwarder, with frames: the client's
    /// establishing ACK confirms a NAT template only when it acknowledges the
    /// remembered SYN-ACK exactly (one off does not, nor an ACK with no SYN-ACK
    /// seen, nor another slot's, nor the IPv6 table's slot of the same number); a DR
    /// handshake ACK raises to unverified, and only from SYN_RECV; a SYN-proxy session
    /// is left alone.
    #[test]
    fn only_an_exact_answer_to_the_syn_ack_confirms_a_nat_template() {
        use crate::model::{Persistence, RealServerSpec, SchedulerKind, ServiceKey};
        use crate::session::persist::{PersistTable, TemplateKey};
        const VIP: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 1);
        const CLIENT: Ipv4Addr = Ipv4Addr::new(203, 0, 113, 7);
        const RS: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 11);
        let mut table = crate::service::ServiceTable::new();
        let key = ServiceKey::new(Protocol::Tcp, VIP, 80);
        let persistence = Persistence {
            timeout_s: 300,
            netmask: Ipv4Addr::BROADCAST,
            prefix6: Persistence::FULL_PREFIX6,
        };
        table
            .add_service(key, SchedulerKind::Rr, Some(persistence))
            .unwrap();
        let real = table
            .add_server(key, RealServerSpec::new(RS, 8080, 1, ForwardMode::Nat))
            .unwrap();
        let service = table.get(key).unwrap().id;
        let (_publisher, config) = super::super::test_config(&table, 1024);
        let persist = std::sync::Arc::new(PersistTable::with_capacity(64));
        let mut f = Forwarder::new(super::super::ForwarderConfig {
            persistence: Some(persist.clone()),
            ..config
        });
        let counters = WorkerCounters::default();
        let template = TemplateKey {
            service,
            network: u32::from(CLIENT),
        };
        let standing = |t: &PersistTable| t.lookup(template, 0).map(|t| t.trust);
        // The client's template, unconfirmed again.
        let unconfirmed = |t: &PersistTable| {
            t.remove(template);
            t.bind(template, Template::new(real, 1000, Trust::Unconfirmed), 0);
        };
        unconfirmed(&persist);
        let nat = PersistentSession {
            proof_key: 5,
            mode: ForwardMode::Nat,
            proto: Protocol::Tcp,
            proxied: false,
            service,
            real,
            client: CLIENT.into(),
        };
        let (syn, ack, rst) = (0x02, 0x10, 0x04);
        let synack = TcpFlags(syn | ack);
        let server = (RS, 8080);
        let client = (CLIENT, 40000);
        let vip = (VIP, 80);
        let handshake = Transition {
            from: TcpState::SynRecv,
            to: TcpState::Established,
        };
        let still = Transition {
            from: TcpState::SynRecv,
            to: TcpState::SynRecv,
        };
        let client_ack = |f: &mut Forwarder, s: PersistentSession, flags: u8, n: u32| {
            let (frame, parsed) = segment(client, vip, flags, 1, n);
            let moved = (Direction::Inbound, TcpFlags(flags), handshake);
            f.confirm_on(s, moved, &frame, &parsed, &counters);
        };
        // No SYN-ACK seen: nothing to answer.
        client_ack(&mut f, nat, ack, 0x1000_0001);
        assert_eq!(standing(&persist), Some(Trust::Unconfirmed));
        let (frame, parsed) = segment(server, client, syn | ack, 0x1000_0000, 2);
        f.confirm_on(
            nat,
            (Direction::Outbound, synack, still),
            &frame,
            &parsed,
            &counters,
        );
        for wrong in [0x1000_0000, 0x1000_0002] {
            client_ack(&mut f, nat, ack, wrong);
        }
        client_ack(&mut f, nat, ack | rst, 0x1000_0001);
        let six = PersistentSession {
            proof_key: PersistentSession::proof_key_v6(5),
            ..nat
        };
        client_ack(&mut f, six, ack, 0x1000_0001);
        let other = PersistentSession {
            proof_key: 6,
            ..nat
        };
        client_ack(&mut f, other, ack, 0x1000_0001);
        assert_eq!(standing(&persist), Some(Trust::Unconfirmed));
        client_ack(&mut f, nat, ack, 0x1000_0001);
        assert_eq!(standing(&persist), Some(Trust::Confirmed));

        // DR: the handshake ACK raises to unverified, from SYN_RECV only.
        unconfirmed(&persist);
        let dr = PersistentSession {
            mode: ForwardMode::Dr,
            ..nat
        };
        let (frame, parsed) = segment(client, vip, ack, 1, 77);
        let from_none = Transition {
            from: TcpState::None,
            to: TcpState::Established,
        };
        let moved = (Direction::Inbound, TcpFlags(ack), from_none);
        f.confirm_on(dr, moved, &frame, &parsed, &counters);
        assert_eq!(standing(&persist), Some(Trust::Unconfirmed));
        client_ack(&mut f, dr, ack, 77);
        assert_eq!(standing(&persist), Some(Trust::Unverified));

        // A SYN-proxy session is placed as high as it goes: nothing to do here.
        unconfirmed(&persist);
        let proxied = PersistentSession {
            proxied: true,
            proof_key: 9,
            ..nat
        };
        let (frame, parsed) = segment(server, client, syn | ack, 500, 2);
        f.confirm_on(
            proxied,
            (Direction::Outbound, synack, still),
            &frame,
            &parsed,
            &counters,
        );
        client_ack(&mut f, proxied, ack, 501);
        assert_eq!(standing(&persist), Some(Trust::Unconfirmed));
        let events = counters.events_snapshot();
        assert_eq!(events[Event::PersistConfirmed as usize], 1);
        assert_eq!(events[Event::PersistUnverified as usize], 1);
    }
}
