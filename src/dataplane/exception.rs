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
use crate::dpdk::{Burst, SharedProducer};
use crate::flow::parse::{Ipv6Payload, PacketKind};
use crate::model::DropReason;
use crate::service::admission::RateLimit;
use std::net::Ipv6Addr;

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
        PacketKind::Icmp { dst, .. } => {
            matches!(reason, R::IcmpNotEcho | R::IcmpErrorNoSession) && port.is_local(dst)
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
                Ipv6Payload::Icmp { .. } => matches!(
                    reason,
                    R::IcmpNotEcho
                        | R::IcmpErrorNoSession
                        | R::NdiscAdvert
                        | R::NdiscNotForUs
                        | R::NotLocal
                ),
            }
        }
    }
}

/// A worker's end of one port's exception path: the ring to the management core and
/// this worker's share of the port's rate limit.
pub struct ExceptionLink {
    ring: SharedProducer,
    limiter: ErrorLimiter,
    /// This burst's frames for the kernel, handed to the ring once per burst.
    pending: Burst,
}

impl ExceptionLink {
    /// `rate` frames per second over all `workers` (each worker takes its share, with
    /// bursts of a twentieth of a second), at `tsc_hz`.
    pub fn new(ring: SharedProducer, rate: u32, workers: usize, tsc_hz: u64) -> ExceptionLink {
        let limit = RateLimit {
            rate: rate.max(1),
            burst: (rate / 20).max(8),
            prefix_len: 32,
        };
        ExceptionLink {
            ring,
            limiter: ErrorLimiter::new(limit.per_worker(workers, tsc_hz)),
            pending: Burst::new(),
        }
    }

    /// Takes frame `i` of `rx` for the kernel if the rate limit allows it at `now`
    /// (TSC); otherwise the reason to drop it for (it stays in `rx`).
    #[inline]
    pub fn take(&mut self, rx: &mut Burst, i: usize, now: u64) -> Result<(), DropReason> {
        if !self.limiter.allow(now) {
            return Err(DropReason::ExceptionRateLimited);
        }
        if !rx.move_to(i, &mut self.pending) {
            // Cannot happen: pending is emptied after every burst, which it fits.
            return Err(DropReason::ExceptionRingFull);
        }
        Ok(())
    }

    /// Hands this burst's frames to the ring; what it refuses is counted and freed.
    #[inline]
    pub fn flush(&mut self, counters: &WorkerCounters) {
        if self.pending.is_empty() {
            return;
        }
        let taken = self.ring.enqueue(&mut self.pending);
        counters.event_n(Event::ExceptionPunted, taken as u64);
        for _ in 0..self.pending.len() {
            counters.drop(DropReason::ExceptionRingFull);
        }
        self.pending.free_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::FlowKey4;
    use crate::model::Protocol;
    use crate::wire::icmp;
    use crate::wire::icmpv6;
    use crate::wire::tcp::TcpFlags;
    use crate::wire::IpProtocol;
    use std::net::Ipv4Addr;

    const PORT: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
    const VIP: Ipv4Addr = Ipv4Addr::new(198, 18, 1, 1);
    const CLIENT: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 100);

    fn port() -> LocalResponder {
        LocalResponder::new([2, 0, 0, 0, 0, 1], &[PORT])
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
    }
}
