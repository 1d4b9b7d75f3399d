//! The exception path: which frames the port's kernel interface (`[ports.exception]`)
//! gets, and a worker's end of the ring that carries them to the management core,
//! which writes them to the interface. Frames the kernel writes come back through
//! the inject ring and leave through worker 0 (`mesh::Injected::Kernel`).
//!
//! Only frames the forwarder would otherwise drop are looked at: a forwarded packet,
//! or one Sluice answers itself, never reaches [`for_kernel`], so the path costs
//! forwarding nothing. The table of what goes where is in docs/EXCEPTION_PATH.md.
use crate::dataplane::counters::{Event, WorkerCounters};
use crate::dataplane::forwarder::admission::ErrorLimiter;
use crate::dataplane::local::LocalResponder;
use crate::dpdk::{Burst, SharedProducer, BURST_SIZE};
use crate::flow::parse::{Ipv6Payload, PacketKind};
use crate::model::DropReason;
use crate::service::admission::RateLimit;
use crate::wire::ethernet::{self, EtherType};
use crate::wire::{icmp, icmpv6};
use std::net::{Ipv4Addr, Ipv6Addr};

/// Bursts of the general ring, and of the kernel's frames, the management core moves
/// per tick and port (besides a burst of the control ring's): its writes to the
/// interface are a syscall per frame (~23 us each measured on a 2-CPU VM,
/// perf/results/exception.md), so 64 frames each way and at most 32 control ones
/// keep a tick's exception work near 4 ms at the very most, inside the 5 ms tick.
/// The rest waits in its ring.
pub const BURSTS_PER_TICK: usize = 2;
/// Frames the management core moves each way per tick and port.
pub const FRAMES_PER_TICK: u32 = (BURSTS_PER_TICK * BURST_SIZE) as u32;
/// Management ticks per second: they start [`MANAGEMENT_TICK_MS`](super::MANAGEMENT_TICK_MS)
/// apart, whatever their work took (`daemon::management_loop`).
pub const TICKS_PER_SECOND: u32 = 1000 / super::MANAGEMENT_TICK_MS;
/// The control budget of a port, frames per second over all workers (each takes its
/// share): BFD at 10 ms intervals on a few sessions, BGP keepalives and updates,
/// ARP and neighbour discovery fit many times over.
pub const CONTROL_RATE: u32 = 1000;
/// The highest `[ports.exception] rate`: what the management core moves per second
/// each way (`FRAMES_PER_TICK` x `TICKS_PER_SECOND`) less the control budget, so that
/// the kernel's answers to a flood at the full rate and to the control frames (which
/// have a ring of their own, [`PuntRings`]) are read from the interface as fast.
pub const MAX_RATE: u32 = FRAMES_PER_TICK * TICKS_PER_SECOND - CONTROL_RATE;

/// TCP port of BGP.
const BGP_PORT: u16 = 179;
/// UDP ports of BFD: single-hop control (RFC 5881), echo, multihop (RFC 5883).
const BFD_PORTS: [u16; 3] = [3784, 3785, 4784];
/// The TTL (hop limit) a frame from a neighbour on the link arrives with when sent
/// with the most (GTSM, RFC 5082): a sender further away cannot reach it.
const GTSM_TTL: u8 = 255;

/// Which of a port's two punt budgets a frame for the kernel draws on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Punt {
    /// The port's `rate`, shared with whatever else comes to the appliance's
    /// address, a flood included.
    General,
    /// The control budget first ([`CONTROL_RATE`]), then the general one: frames
    /// only a neighbour on the link can send, which the kernel's routing needs.
    Control,
}

/// The budget a frame [`for_kernel`] passed draws on: [`Punt::Control`] for frames no
/// one beyond the link can forge, which the appliance's routing depends on:
///
/// - BGP (TCP from or to port 179) and BFD (UDP to 3784, 3785, 4784) arriving with
///   TTL (IPv6: hop limit) 255: single-hop BFD is always sent so (RFC 5881), BGP
///   with GTSM (`ttl security on` in BIRD); every router on the way lowers it, so a
///   remote flood cannot carry it, whatever it forges;
/// - ARP replies, which no router forwards, and neighbour discovery (ICMPv6 133 to
///   137, which the kernel accepts only with hop limit 255 anyway).
///
/// The rest, including BGP with a lower TTL: [`Punt::General`]. `frame` is the whole
/// frame, `l3` the offset of its IP header.
pub fn punt_class(kind: &PacketKind, frame: &[u8], l3: usize) -> Punt {
    // IPv4 TTL at byte 8 of the header, IPv6 hop limit at byte 7.
    let ttl_at = |offset: usize| frame.get(l3 + offset).copied() == Some(GTSM_TTL);
    let control = match *kind {
        PacketKind::Arp => true,
        PacketKind::Tcp { key, .. } => {
            (key.dport == BGP_PORT || key.sport == BGP_PORT) && ttl_at(8)
        }
        PacketKind::Udp { key } => BFD_PORTS.contains(&key.dport) && ttl_at(8),
        PacketKind::Icmp { .. } | PacketKind::OtherIpv4 { .. } => false,
        PacketKind::Ipv6(payload) => {
            let ours = match payload {
                Ipv6Payload::Tcp { sport, dport, .. } => sport == BGP_PORT || dport == BGP_PORT,
                Ipv6Payload::Udp { dport, .. } => BFD_PORTS.contains(&dport),
                Ipv6Payload::Icmp { icmp_type, .. } => (133..=137).contains(&icmp_type.0),
                Ipv6Payload::Other { .. } => false,
            };
            ours && ttl_at(7)
        }
    };
    if control {
        Punt::Control
    } else {
        Punt::General
    }
}

/// Whether a frame unicast to the port's MAC, which the forwarder dropped for
/// `reason`, is the kernel's instead: traffic for the port's own addresses that Sluice
/// does not handle itself.
///
/// - TCP, UDP and other IP protocols to a port address that no service, health
///   probe or sync listener takes (BGP, BFD, SSH, OSPF...);
/// - ICMP to a port address other than an echo request (Sluice answers those):
///   echo replies to the kernel's pings, and ICMP errors that quote no session
///   (about the kernel's own connections);
/// - ARP replies (Sluice learned from them too), so the kernel's own resolutions
///   complete; ARP requests stay Sluice's, which answers for every address;
/// - IPv6 alike, to a port IPv6 address or a link-local one (the kernel's own, which
///   Sluice does not have): TCP, UDP and other protocols, ICMPv6 but echo requests,
///   Neighbor Advertisements and unicast solicitations Sluice does not answer.
///
/// `dst6` is the IPv6 destination (for an IPv6 frame).
pub fn for_kernel(
    reason: DropReason,
    kind: &PacketKind,
    dst6: Option<Ipv6Addr>,
    port: &LocalResponder,
) -> bool {
    use DropReason as R;
    match *kind {
        PacketKind::Arp => reason == R::ArpReply,
        PacketKind::Tcp { key, .. } | PacketKind::Udp { key } => {
            reason == R::UnsupportedProtocol && port.is_local(key.dst_addr())
        }
        PacketKind::Icmp { dst, icmp_type, .. } => {
            matches!(reason, R::IcmpNotEcho | R::IcmpErrorNoSession)
                && port.is_local(dst)
                && KERNEL_ICMP.contains(&icmp_type)
        }
        PacketKind::OtherIpv4 { dst, .. } => reason == R::UnsupportedProtocol && port.is_local(dst),
        PacketKind::Ipv6(payload) => {
            let Some(dst) = dst6 else {
                return false;
            };
            let link_local = dst.segments()[0] & 0xffc0 == 0xfe80;
            let ours = port.is_local6(dst);
            if !ours && !link_local {
                return false;
            }
            match payload {
                Ipv6Payload::Tcp { .. } | Ipv6Payload::Udp { .. } | Ipv6Payload::Other { .. } => {
                    matches!(reason, R::UnsupportedProtocol | R::Ipv6NoService)
                }
                Ipv6Payload::Icmp { icmp_type, .. } => {
                    matches!(
                        reason,
                        R::IcmpNotEcho
                            | R::IcmpErrorNoSession
                            | R::NdiscAdvert
                            | R::NdiscNotForUs
                            | R::NotLocal
                    ) && !NOT_KERNEL_ICMPV6.contains(&icmp_type)
                }
            }
        }
    }
}

/// The ICMP messages to a port address the kernel gets: answers to its own pings and
/// errors about its own connections. Not redirects, router advertisements, timestamps
/// or address masks: anyone can send those with a forged source (a redirect from the
/// gateway's address would move the kernel's routes), and an appliance's kernel needs
/// none of them.
const KERNEL_ICMP: [icmp::Message; 4] = [
    icmp::Message::ECHO_REPLY,
    icmp::Message::DEST_UNREACHABLE,
    icmp::Message::TIME_EXCEEDED,
    icmp::Message::PARAMETER_PROBLEM,
];

/// ICMPv6 messages the kernel never gets: router advertisements and redirects, which
/// would change its routes (Sluice drops the ones to all nodes too); only a sender on
/// the link can make the kernel take them (hop limit 255), but that is anyone on a
/// shared segment.
const NOT_KERNEL_ICMPV6: [icmpv6::Message; 2] =
    [icmpv6::Message::ROUTER_ADVERT, icmpv6::Message::REDIRECT];

/// LLDP's EtherType: the one besides IPv4, ARP and IPv6 the kernel's frames may carry
/// (lldpd on the interface); it has no address to check.
const ETHERTYPE_LLDP: EtherType = EtherType(0x88cc);

/// Whether a frame the kernel wrote to a port's interface may leave as that port's
/// (`port`) own: its source MAC is the port's, and
/// - IPv4: its source is one of the port's addresses;
/// - ARP: its sender is the port's MAC and one of the port's addresses, or it is a
///   probe for one of them (sender 0.0.0.0, RFC 5227), which changes no one's cache;
/// - IPv6: its source is one of the port's addresses, a link-local address (the
///   kernel's own, which Sluice does not know) or `::` (duplicate address detection);
///   not a Router Advertisement or Redirect; a Neighbor Advertisement only for one of
///   the port's addresses or its own source;
/// - LLDP: the MAC alone; any other EtherType (more VLAN tags than Sluice walks,
///   MPLS, PPPoE, which carry addresses it would not see): never.
///
/// So a kernel that forwards between its interfaces, or a program on the host writing
/// frames of its own, cannot send out of the port from an address Sluice does not own
/// (a VIP, another host's) around everything Sluice checks.
pub fn kernel_frame_is_ours(frame: &[u8], port: &LocalResponder) -> bool {
    let Ok(l2) = ethernet::parse_l2(frame) else {
        return false;
    };
    if ethernet::Frame::new_unchecked(frame).src_addr() != port.mac() {
        return false;
    }
    let l3 = &frame[l2.l3_offset.min(frame.len())..];
    let v4 = |at: usize| {
        l3.get(at..at + 4)
            .map(|b| Ipv4Addr::new(b[0], b[1], b[2], b[3]))
    };
    let v6 = |at: usize| {
        l3.get(at..at + 16)
            .and_then(|b| <[u8; 16]>::try_from(b).ok())
            .map(Ipv6Addr::from)
    };
    match l2.ethertype {
        EtherType::IPV4 => v4(12).is_some_and(|src| port.is_local(src)),
        EtherType::ARP => {
            // The sender's MAC and address after the 8-byte header; the target's
            // address at 24.
            let sender_mac = l3.get(8..14).is_some_and(|m| m == port.mac().0);
            match (v4(14), v4(24)) {
                (Some(sender), _) if port.is_local(sender) => sender_mac,
                (Some(Ipv4Addr::UNSPECIFIED), Some(target)) => port.is_local(target),
                _ => false,
            }
        }
        EtherType::IPV6 => {
            let Some(src) = v6(8) else {
                return false;
            };
            let from_ours =
                src.is_unspecified() || src.segments()[0] & 0xffc0 == 0xfe80 || port.is_local6(src);
            // ICMPv6 (next header 58 right after the fixed header): its type at 40.
            let icmp_type = (l3.get(6) == Some(&58))
                .then(|| l3.get(40).copied())
                .flatten();
            from_ours
                && match icmp_type.map(icmpv6::Message) {
                    Some(icmpv6::Message::ROUTER_ADVERT | icmpv6::Message::REDIRECT) => false,
                    // The target address after the 8-byte ICMPv6 header.
                    Some(icmpv6::Message::NEIGHBOR_ADVERT) => {
                        v6(48).is_some_and(|target| target == src || port.is_local6(target))
                    }
                    _ => true,
                }
        }
        ETHERTYPE_LLDP => true,
        _ => false,
    }
}

/// One worker's shares of a port's two punt budgets (GCRA on the worker's TSC): the
/// general `rate`, and [`CONTROL_RATE`] for [`Punt::Control`] frames.
pub struct PuntBudgets {
    general: ErrorLimiter,
    control: ErrorLimiter,
}

impl PuntBudgets {
    /// `rate` frames per second over all `workers` (each worker takes its share, with
    /// bursts of a twentieth of a second), and [`CONTROL_RATE`] more for control
    /// frames (bursts of a tenth of a second), at `tsc_hz`.
    pub fn new(rate: u32, workers: usize, tsc_hz: u64) -> PuntBudgets {
        let general = RateLimit {
            rate: rate.max(1),
            burst: (rate / 20).max(8),
            prefix_len: 32,
        };
        let control = RateLimit {
            rate: CONTROL_RATE,
            burst: CONTROL_RATE / 10,
            prefix_len: 32,
        };
        PuntBudgets {
            general: ErrorLimiter::new(general.per_worker(workers, tsc_hz)),
            control: ErrorLimiter::new(control.per_worker(workers, tsc_hz)),
        }
    }

    /// The budget a frame of class `punt` is taken on at `now` (TSC), if any: a
    /// control frame the control budget while it lasts, then (as any other) the
    /// general one.
    #[inline]
    pub fn admit(&mut self, punt: Punt, now: u64) -> Option<Punt> {
        if punt == Punt::Control && self.control.allow(now) {
            Some(Punt::Control)
        } else if self.general.allow(now) {
            Some(Punt::General)
        } else {
            None
        }
    }
}

/// Slots of a port's control ring ([`PuntRings::control`]): the control budget lets
/// at most [`CONTROL_RATE`] frames a second (bursts of a tenth of a second: 100) into
/// it, and the management core empties it first at every tick.
pub const CONTROL_RING_SIZE: u32 = 256;

/// A port's two rings to the management core, each a multi-producer ring of its own:
/// frames taken on the control budget go to `control`, which the management core
/// empties first at every tick, so a flood that fills `general` (the workers' punts
/// arriving faster than a tick writes them to the interface) never crowds them out.
pub struct PuntRings {
    pub general: SharedProducer,
    pub control: SharedProducer,
}

/// A worker's end of one port's exception path: the rings to the management core and
/// this worker's shares of the port's budgets.
pub struct ExceptionLink {
    rings: PuntRings,
    budgets: PuntBudgets,
    /// This burst's frames for the kernel, handed to the ring once per burst.
    pending: Burst,
    /// Those of them taken on the control budget, handed to the ring first.
    pending_control: Burst,
}

impl ExceptionLink {
    /// The budgets of [`PuntBudgets::new`] for `rate` over `workers`.
    pub fn new(rings: PuntRings, rate: u32, workers: usize, tsc_hz: u64) -> ExceptionLink {
        ExceptionLink {
            rings,
            budgets: PuntBudgets::new(rate, workers, tsc_hz),
            pending: Burst::new(),
            pending_control: Burst::new(),
        }
    }

    /// Takes frame `i` of `rx`, of class `punt`, for the kernel if a budget allows it
    /// at `now` (TSC, [`PuntBudgets::admit`]); otherwise the reason to drop it for (it
    /// stays in `rx`).
    #[inline]
    pub fn take(
        &mut self,
        rx: &mut Burst,
        i: usize,
        punt: Punt,
        now: u64,
    ) -> Result<(), DropReason> {
        let to = match self.budgets.admit(punt, now) {
            Some(Punt::Control) => &mut self.pending_control,
            Some(Punt::General) => &mut self.pending,
            None => return Err(DropReason::ExceptionRateLimited),
        };
        if !rx.move_to(i, to) {
            // Cannot happen: pending is emptied after every burst, which it fits.
            return Err(DropReason::ExceptionRingFull);
        }
        Ok(())
    }

    /// Hands this burst's frames to the rings, those taken on the control budget to
    /// the control ring; what a ring refuses is counted and freed.
    #[inline]
    pub fn flush(&mut self, counters: &WorkerCounters) {
        if !self.pending_control.is_empty() {
            let taken = Self::hand(
                &self.rings.control,
                &mut self.pending_control,
                DropReason::ExceptionControlRingFull,
                counters,
            );
            counters.event_n(Event::ExceptionPuntedControl, taken as u64);
        }
        if !self.pending.is_empty() {
            let ring = &self.rings.general;
            Self::hand(
                ring,
                &mut self.pending,
                DropReason::ExceptionRingFull,
                counters,
            );
        }
    }

    /// Enqueues `pending` on `ring`, counts what it refused as `full` and frees it;
    /// how many it took.
    #[inline]
    fn hand(
        ring: &SharedProducer,
        pending: &mut Burst,
        full: DropReason,
        counters: &WorkerCounters,
    ) -> usize {
        let taken = ring.enqueue(pending);
        counters.event_n(Event::ExceptionPunted, taken as u64);
        counters.drop_n(full, pending.len() as u64);
        pending.free_all();
        taken
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::emulator::frames::{self, Endpoints};
    use crate::flow::parse::classify;
    use crate::flow::FlowKey4;
    use crate::model::Protocol;
    use crate::wire::checksum;
    use crate::wire::icmp;
    use crate::wire::icmpv6;
    use crate::wire::tcp::TcpFlags;
    use crate::wire::IpProtocol;
    use std::net::Ipv4Addr;

    const PORT: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
    const VIP: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 1);
    const CLIENT: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 100);

    fn port() -> LocalResponder {
        LocalResponder::new([2, 0, 0, 0, 0, 1], &[(PORT, 24)])
            .with_ipv6(&["2001:db8::1".parse().unwrap()])
    }

    fn tcp(dst: Ipv4Addr, dport: u16) -> PacketKind {
        PacketKind::Tcp {
            key: FlowKey4::new(Protocol::Tcp, CLIENT, 40000, dst, dport),
            flags: TcpFlags::SYN,
            payload_len: 0,
        }
    }

    fn udp(dst: Ipv4Addr, dport: u16) -> PacketKind {
        PacketKind::Udp {
            key: FlowKey4::new(Protocol::Udp, CLIENT, 40000, dst, dport),
        }
    }

    fn icmp(dst: Ipv4Addr, icmp_type: icmp::Message) -> PacketKind {
        PacketKind::Icmp {
            src: CLIENT,
            dst,
            icmp_type,
            code: 0,
        }
    }

    #[test]
    fn the_port_addresses_unclaimed_tcp_and_udp_go_to_the_kernel() {
        let p = port();
        use DropReason as R;
        // BGP, SSH, BFD to the port's own address: no service, no probe, no sync.
        assert!(for_kernel(
            R::UnsupportedProtocol,
            &tcp(PORT, 179),
            None,
            &p
        ));
        assert!(for_kernel(R::UnsupportedProtocol, &tcp(PORT, 22), None, &p));
        assert!(for_kernel(
            R::UnsupportedProtocol,
            &udp(PORT, 3784),
            None,
            &p
        ));
        assert!(for_kernel(
            R::UnsupportedProtocol,
            &udp(PORT, 4784),
            None,
            &p
        ));
        // To a VIP without that service, to another host, or a segment dropped for
        // another reason (malformed, not ours): Sluice's drop stands.
        assert!(!for_kernel(R::NoService, &tcp(VIP, 22), None, &p));
        assert!(!for_kernel(R::UnsupportedProtocol, &tcp(VIP, 22), None, &p));
        assert!(!for_kernel(R::NotLocal, &tcp(CLIENT, 22), None, &p));
        assert!(!for_kernel(R::TcpNoSession, &tcp(PORT, 179), None, &p));
        assert!(!for_kernel(R::BadIpv4Header, &udp(PORT, 3784), None, &p));
    }

    #[test]
    fn icmp_the_responder_leaves_and_other_protocols_go_to_the_kernel() {
        let p = port();
        use DropReason as R;
        let reply = icmp::Message::ECHO_REPLY;
        let unreachable = icmp::Message::DEST_UNREACHABLE;
        assert!(for_kernel(R::IcmpNotEcho, &icmp(PORT, reply), None, &p));
        assert!(for_kernel(
            R::IcmpErrorNoSession,
            &icmp(PORT, unreachable),
            None,
            &p
        ));
        // A bad checksum stays a drop; so does ICMP to a VIP.
        assert!(!for_kernel(
            R::BadIcmpChecksum,
            &icmp(PORT, reply),
            None,
            &p
        ));
        assert!(!for_kernel(R::IcmpNotEcho, &icmp(VIP, reply), None, &p));
        // Time exceeded and parameter problem are errors about the kernel's own
        // traffic; redirects, router advertisements, timestamps and address masks,
        // which anyone can forge, are not its.
        for kind in [11, 12] {
            let error = icmp(PORT, icmp::Message(kind));
            assert!(
                for_kernel(R::IcmpErrorNoSession, &error, None, &p),
                "{kind}"
            );
        }
        for kind in [5, 9, 13, 17, 42] {
            let other = icmp(PORT, icmp::Message(kind));
            assert!(!for_kernel(R::IcmpNotEcho, &other, None, &p), "{kind}");
        }
        let ospf = |dst| PacketKind::OtherIpv4 {
            src: CLIENT,
            dst,
            protocol: IpProtocol(89),
        };
        assert!(for_kernel(R::UnsupportedProtocol, &ospf(PORT), None, &p));
        assert!(!for_kernel(R::UnsupportedProtocol, &ospf(VIP), None, &p));
    }

    #[test]
    fn arp_replies_go_to_the_kernel_requests_stay_with_sluice() {
        let p = port();
        use DropReason as R;
        assert!(for_kernel(R::ArpReply, &PacketKind::Arp, None, &p));
        // Requests for our addresses are answered (no drop); others are not ours.
        assert!(!for_kernel(R::ArpNotForUs, &PacketKind::Arp, None, &p));
        assert!(!for_kernel(R::BadArp, &PacketKind::Arp, None, &p));
    }

    #[test]
    fn ipv6_to_the_port_or_a_link_local_address_goes_to_the_kernel() {
        let p = port();
        use DropReason as R;
        let ours: Ipv6Addr = "2001:db8::1".parse().unwrap();
        let link_local: Ipv6Addr = "fe80::1".parse().unwrap();
        let other: Ipv6Addr = "2001:db8::99".parse().unwrap();
        let bgp = PacketKind::Ipv6(Ipv6Payload::Tcp {
            sport: 40000,
            dport: 179,
            flags: TcpFlags::SYN,
            payload_len: 0,
        });
        let na = PacketKind::Ipv6(Ipv6Payload::Icmp {
            icmp_type: icmpv6::Message::NEIGHBOR_ADVERT,
            code: 0,
        });
        assert!(for_kernel(R::UnsupportedProtocol, &bgp, Some(ours), &p));
        assert!(for_kernel(R::Ipv6NoService, &bgp, Some(link_local), &p));
        assert!(!for_kernel(R::Ipv6NoService, &bgp, Some(other), &p));
        assert!(!for_kernel(R::UnsupportedProtocol, &bgp, None, &p));
        assert!(for_kernel(R::NdiscAdvert, &na, Some(ours), &p));
        assert!(for_kernel(R::NdiscAdvert, &na, Some(link_local), &p));
        assert!(!for_kernel(R::NdiscAdvert, &na, Some(other), &p));
        assert!(!for_kernel(R::BadIcmpv6Checksum, &na, Some(ours), &p));
        // Router advertisements and redirects would change the kernel's routes.
        for kind in [icmpv6::Message::ROUTER_ADVERT, icmpv6::Message::REDIRECT] {
            let message = PacketKind::Ipv6(Ipv6Payload::Icmp {
                icmp_type: kind,
                code: 0,
            });
            assert!(!for_kernel(R::IcmpNotEcho, &message, Some(link_local), &p));
            assert!(!for_kernel(R::NotLocal, &message, Some(ours), &p));
        }
    }

    const LB_MAC: [u8; 6] = [2, 0, 0, 0, 0, 1];
    const PEER_MAC: [u8; 6] = [2, 0, 0, 0, 0, 2];

    /// What the kernel writes leaves only from the port's MAC and addresses.
    #[test]
    fn the_kernels_frames_leave_only_as_the_ports_own() {
        let p = port();
        let tcp_from = |mac, src| {
            let e = Endpoints {
                src_mac: mac,
                dst_mac: PEER_MAC,
                src,
                dst: CLIENT,
                sport: 179,
                dport: 40000,
            };
            let mut b = vec![0; frames::MAX_FRAME];
            let n = frames::tcp_segment(&mut b, &e, 1, 0, 0x12, &[]);
            b.truncate(n);
            b
        };
        let arp_from = |mac, sender| {
            let mut b = vec![0; frames::MAX_FRAME];
            let n = frames::arp_request(&mut b, mac, sender, CLIENT);
            b.truncate(n);
            b
        };
        let ipv6_from = |mac: [u8; 6], src: &str| {
            let mut b = vec![0u8; 54];
            b[6..12].copy_from_slice(&mac);
            b[12..14].copy_from_slice(&[0x86, 0xdd]);
            b[14] = 0x60;
            b[20] = 59; // no next header
            b[21] = 255;
            b[22..38].copy_from_slice(&src.parse::<Ipv6Addr>().unwrap().octets());
            b[38..54].copy_from_slice(&"ff02::1".parse::<Ipv6Addr>().unwrap().octets());
            b
        };
        assert!(kernel_frame_is_ours(&tcp_from(LB_MAC, PORT), &p));
        assert!(
            !kernel_frame_is_ours(&tcp_from(PEER_MAC, PORT), &p),
            "another MAC"
        );
        assert!(!kernel_frame_is_ours(&tcp_from(LB_MAC, VIP), &p), "a VIP");
        assert!(kernel_frame_is_ours(&arp_from(LB_MAC, PORT), &p));
        assert!(
            !kernel_frame_is_ours(&arp_from(LB_MAC, VIP), &p),
            "ARP for a VIP"
        );
        for ours in ["2001:db8::1", "fe80::1", "::"] {
            assert!(kernel_frame_is_ours(&ipv6_from(LB_MAC, ours), &p), "{ours}");
        }
        assert!(!kernel_frame_is_ours(
            &ipv6_from(LB_MAC, "2001:db8::99"),
            &p
        ));
        assert!(!kernel_frame_is_ours(&ipv6_from(PEER_MAC, "fe80::1"), &p));
        // ICMPv6: no Router Advertisements or Redirects; a Neighbor Advertisement for
        // the port's address or its own source only.
        let icmpv6_from = |src: &str, kind: u8, target: &str| {
            let mut b = ipv6_from(LB_MAC, src);
            b[20] = 58;
            b.extend_from_slice(&[kind, 0, 0, 0, 0, 0, 0, 0]);
            b.extend_from_slice(&target.parse::<Ipv6Addr>().unwrap().octets());
            b
        };
        for (kind, target, ours) in [
            (134, "::", false),
            (137, "::", false),
            (136, "2001:db8::1", true),
            (136, "fe80::1", true),
            (136, "fe80::9", false),
            (136, "2001:db8::99", false),
            (135, "2001:db8::99", true),
        ] {
            let frame = icmpv6_from("fe80::1", kind, target);
            assert_eq!(
                kernel_frame_is_ours(&frame, &p),
                ours,
                "type {kind}, {target}"
            );
        }
        // ARP: the sender's MAC inside too; a probe (sender 0.0.0.0) for the port's
        // address passes, for another address not.
        let mut other_mac = arp_from(LB_MAC, PORT);
        other_mac[22..28].copy_from_slice(&PEER_MAC);
        assert!(!kernel_frame_is_ours(&other_mac, &p));
        let probe = |target| {
            let mut b = vec![0; frames::MAX_FRAME];
            let n = frames::arp_request(&mut b, LB_MAC, Ipv4Addr::UNSPECIFIED, target);
            b.truncate(n);
            b
        };
        assert!(kernel_frame_is_ours(&probe(PORT), &p));
        assert!(!kernel_frame_is_ours(&probe(VIP), &p));
        // LLDP: the MAC alone; other EtherTypes (MPLS, a third VLAN tag) and frames
        // cut short: never.
        let mut lldp = vec![0u8; 60];
        lldp[6..12].copy_from_slice(&LB_MAC);
        lldp[12..14].copy_from_slice(&[0x88, 0xcc]);
        assert!(kernel_frame_is_ours(&lldp, &p));
        let mut mpls = lldp.clone();
        mpls[12..14].copy_from_slice(&[0x88, 0x47]);
        assert!(!kernel_frame_is_ours(&mpls, &p));
        let mut tagged = vec![0u8; 12];
        tagged[6..12].copy_from_slice(&LB_MAC);
        for _ in 0..3 {
            tagged.extend_from_slice(&[0x81, 0x00, 0, 1]);
        }
        tagged.extend_from_slice(&tcp_from(LB_MAC, PORT)[12..]);
        assert!(!kernel_frame_is_ours(&tagged, &p), "three VLAN tags");
        assert!(!kernel_frame_is_ours(&tcp_from(LB_MAC, PORT)[..20], &p));
        assert!(!kernel_frame_is_ours(&lldp[..10], &p));
    }

    /// The TTL of an IPv4 frame from `emulator::frames` (which writes 64) set to
    /// `ttl`, the header checksum redone.
    fn with_ttl(mut frame: Vec<u8>, ttl: u8) -> Vec<u8> {
        frame[22] = ttl;
        frame[24..26].fill(0);
        let c = checksum::finish(checksum::sum(&frame[14..34]));
        frame[24..26].copy_from_slice(&c.to_be_bytes());
        frame
    }

    fn endpoints(sport: u16, dport: u16) -> Endpoints {
        Endpoints {
            src_mac: PEER_MAC,
            dst_mac: LB_MAC,
            src: CLIENT,
            dst: PORT,
            sport,
            dport,
        }
    }

    /// A SYN from the client to the port's address, `sport` to `dport`, with `ttl`.
    fn syn_frame(sport: u16, dport: u16, ttl: u8) -> Vec<u8> {
        let mut b = vec![0; frames::MAX_FRAME];
        let n = frames::tcp_segment(&mut b, &endpoints(sport, dport), 1, 0, 0x02, &[]);
        b.truncate(n);
        with_ttl(b, ttl)
    }

    /// A datagram from the client to the port's address, `sport` to `dport`, `ttl`.
    fn udp_frame(sport: u16, dport: u16, ttl: u8) -> Vec<u8> {
        let mut b = vec![0; frames::MAX_FRAME];
        let n = frames::udp_datagram(&mut b, &endpoints(sport, dport), b"bfd");
        b.truncate(n);
        with_ttl(b, ttl)
    }

    /// An IPv6 frame from fe80::2 to the port's 2001:db8::1 with hop limit `hops`
    /// carrying `l4` (next header `proto`), its checksum filled in at `sum_at`.
    fn ipv6_frame(proto: u8, hops: u8, mut l4: Vec<u8>, sum_at: usize) -> Vec<u8> {
        let (src, dst): (Ipv6Addr, Ipv6Addr) =
            ("fe80::2".parse().unwrap(), "2001:db8::1".parse().unwrap());
        let pseudo = checksum::pseudo_header_sum_v6(src, dst, proto, l4.len() as u32);
        let c = checksum::finish(pseudo + checksum::sum(&l4));
        l4[sum_at..sum_at + 2].copy_from_slice(&c.to_be_bytes());
        let mut b = Vec::new();
        b.extend_from_slice(&LB_MAC);
        b.extend_from_slice(&PEER_MAC);
        b.extend_from_slice(&[0x86, 0xdd, 0x60, 0, 0, 0]);
        b.extend_from_slice(&(l4.len() as u16).to_be_bytes());
        b.extend_from_slice(&[proto, hops]);
        b.extend_from_slice(&src.octets());
        b.extend_from_slice(&dst.octets());
        b.extend_from_slice(&l4);
        b
    }

    fn syn6_frame(dport: u16, hops: u8) -> Vec<u8> {
        let mut tcp = vec![0; 20];
        tcp[0..2].copy_from_slice(&40000u16.to_be_bytes());
        tcp[2..4].copy_from_slice(&dport.to_be_bytes());
        tcp[12] = 5 << 4;
        tcp[13] = 0x02;
        tcp[14..16].copy_from_slice(&65535u16.to_be_bytes());
        ipv6_frame(6, hops, tcp, 16)
    }

    fn udp6_frame(dport: u16, hops: u8) -> Vec<u8> {
        let mut udp = vec![0; 12];
        udp[0..2].copy_from_slice(&49152u16.to_be_bytes());
        udp[2..4].copy_from_slice(&dport.to_be_bytes());
        udp[4..6].copy_from_slice(&12u16.to_be_bytes());
        ipv6_frame(17, hops, udp, 6)
    }

    /// A Neighbor Advertisement for the client's fe80::2.
    fn na6_frame(hops: u8) -> Vec<u8> {
        let mut na = vec![0; 24];
        na[0] = 136;
        na[4] = 0x60;
        na[8..24].copy_from_slice(&"fe80::2".parse::<Ipv6Addr>().unwrap().octets());
        ipv6_frame(58, hops, na, 2)
    }

    /// The class of a frame as the forwarder finds it: the parser's view of it.
    fn class_of(frame: &[u8]) -> Punt {
        let parsed = classify(frame).unwrap_or_else(|r| panic!("{r:?}: {frame:02x?}"));
        punt_class(&parsed.kind, frame, parsed.l3)
    }

    #[test]
    fn bgp_and_bfd_with_ttl_255_arp_and_nd_are_control_the_rest_general() {
        use Punt::{Control, General};
        // BGP from or to port 179 and BFD (single-hop, echo, multihop) sent with
        // TTL 255: only a neighbour on the link can deliver them so.
        assert_eq!(class_of(&syn_frame(40000, 179, 255)), Control);
        assert_eq!(class_of(&syn_frame(179, 40000, 255)), Control);
        for bfd in [3784, 3785, 4784] {
            assert_eq!(class_of(&udp_frame(49152, bfd, 255)), Control, "{bfd}");
            // One router on the way, or a sender that did not ask for GTSM.
            assert_eq!(class_of(&udp_frame(49152, bfd, 254)), General, "{bfd}");
        }
        assert_eq!(class_of(&syn_frame(40000, 179, 64)), General);
        assert_eq!(class_of(&syn_frame(40000, 179, 1)), General);
        // TTL 255 gives no priority to other ports (SSH, DNS, BFD's port as source).
        assert_eq!(class_of(&syn_frame(40000, 22, 255)), General);
        assert_eq!(class_of(&udp_frame(49152, 53, 255)), General);
        assert_eq!(class_of(&udp_frame(3784, 40000, 255)), General);
        // ARP replies never cross a router.
        let mut arp = vec![0; frames::MAX_FRAME];
        let n = frames::arp_reply(&mut arp, PEER_MAC, CLIENT, LB_MAC, PORT);
        assert_eq!(class_of(&arp[..n]), Control);
        // IPv6 alike, by the hop limit; neighbour discovery is sent with 255 always.
        assert_eq!(class_of(&syn6_frame(179, 255)), Control);
        assert_eq!(class_of(&syn6_frame(179, 64)), General);
        assert_eq!(class_of(&syn6_frame(22, 255)), General);
        assert_eq!(class_of(&udp6_frame(3784, 255)), Control);
        assert_eq!(class_of(&udp6_frame(3784, 63)), General);
        assert_eq!(class_of(&na6_frame(255)), Control);
        assert_eq!(class_of(&na6_frame(64)), General);
        // A frame cut short of its TTL (as no parsed frame is) is general.
        assert_eq!(punt_class(&tcp(PORT, 179), &[0; 20], 14), General);
    }

    #[test]
    fn a_flood_spends_the_general_budget_bgp_and_bfd_with_ttl_255_keep_theirs() {
        // One worker, TSC at 1 MHz (1 tick = 1 us), rate 200/s (bucket 10).
        const HZ: u64 = 1_000_000;
        let mut budgets = PuntBudgets::new(200, 1, HZ);
        let flood = syn_frame(40000, 179, 64);
        let (bgp, bfd) = (syn_frame(179, 40000, 255), udp_frame(49152, 3784, 255));
        let forged = syn_frame(40000, 22, 255);
        let mut got = std::collections::HashMap::<(&str, Option<Punt>), u32>::new();
        let mut take = |what, frame: &[u8], now| {
            *got.entry((what, budgets.admit(class_of(frame), now)))
                .or_default() += 1;
        };
        // One second: a SYN flood to port 179 at TTL 64, 4000/s; a BGP segment and a
        // BFD packet every 20 ms (50/s each), and as many SYNs forged with TTL 255 to
        // SSH.
        for step in 0..4000u64 {
            let now = HZ + step * 250;
            take("flood", &flood, now);
            if step % 80 == 0 {
                take("bgp", &bgp, now);
                take("bfd", &bfd, now);
                take("forged", &forged, now);
            }
        }
        let n = |what, budget| got.get(&(what, budget)).copied().unwrap_or(0);
        // Every BGP and BFD frame passed, on the control budget.
        assert_eq!(n("bgp", Some(Punt::Control)), 50, "{got:?}");
        assert_eq!(n("bfd", Some(Punt::Control)), 50, "{got:?}");
        // The flood got the general rate over the second, plus its bucket, at most.
        let flooded = n("flood", Some(Punt::General));
        assert!((190..=211).contains(&flooded), "{flooded}: {got:?}");
        assert_eq!(n("flood", Some(Punt::Control)), 0, "{got:?}");
        // The forged frames drew on the general budget only, which the flood holds.
        assert_eq!(n("forged", Some(Punt::Control)), 0, "{got:?}");
        assert!(n("forged", None) >= 40, "{got:?}");
    }

    #[test]
    fn control_frames_over_their_budget_fall_back_to_the_general_one() {
        const HZ: u64 = 1_000_000;
        let mut budgets = PuntBudgets::new(200, 1, HZ);
        let now = HZ;
        // At one instant: the control bucket (a tenth of CONTROL_RATE), then the
        // general bucket (rate / 20 = 10), then nothing.
        let control = (CONTROL_RATE / 10) as usize;
        let admitted: Vec<_> = (0..control + 11)
            .map(|_| budgets.admit(Punt::Control, now))
            .collect();
        assert!(admitted[..control]
            .iter()
            .all(|a| *a == Some(Punt::Control)));
        assert!(admitted[control..control + 10]
            .iter()
            .all(|a| *a == Some(Punt::General)));
        assert_eq!(admitted[control + 10], None);
    }
}
