//! The local responder: answers ARP and ICMP echo for the appliance's own IPv4
//! addresses, rewriting the received frame in place into the reply so nothing is
//! allocated or copied. It also feeds the neighbour table from ARP (RFC 826 merge).
//!
//! For the port's IPv6 addresses it answers Neighbor Solicitations (address
//! resolution, reachability probes, and duplicate address probes, which it answers to
//! all nodes to defend the address) and ICMPv6 echo requests, and learns solicitors'
//! link-layer addresses into the IPv6 neighbour table (RFC 4861 section 7.2.3). It
//! listens to the all-nodes group and its addresses' solicited-node groups, and takes
//! the frames [`crate::flow::parse::classify`] has validated up to the upper layer.
//!
//! Checks run in a fixed order and every rejected frame gets exactly one
//! [`DropReason`]; the frame is only modified once it is known to be answered.

use std::net::{Ipv4Addr, Ipv6Addr};

use crate::dataplane::counters::{Event, WorkerCounters};
use crate::dataplane::neighbour::{Learn, Neighbour6Table, NeighbourTable};
use crate::flow::parse::{Ipv6Payload, PacketKind, Parsed};
use crate::model::DropReason;
use crate::wire::ethernet::{self, EtherType, MacAddr};
use crate::wire::icmpv6::{self, NdiscError, NdiscRepr};
use crate::wire::{arp, icmp, ipv4, ipv6, IpProtocol, WireError};

/// Most IPv4 addresses, and most IPv6 addresses, one responder answers for (the config
/// enforces the same limits).
pub const MAX_LOCAL_ADDRS: usize = 16;

/// TTL of the echo replies we originate.
const REPLY_TTL: u8 = ipv4::DEFAULT_TTL;

/// What to do with a frame after [`LocalResponder::process`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The frame was rewritten in place into a reply of the same length: transmit it
    /// back out of the port it arrived on.
    Reply,
    /// Drop the frame; the caller counts the reason.
    Drop(DropReason),
}

/// Answers ARP and ICMP echo for our MAC and up to [`MAX_LOCAL_ADDRS`] IPv4 addresses.
#[derive(Clone, Debug)]
pub struct LocalResponder {
    mac: MacAddr,
    /// A fixed array scanned linearly: at most 16 compares, no hashing, no pointers.
    addrs: [Ipv4Addr; MAX_LOCAL_ADDRS],
    /// Each address's subnet mask: who is on the port's link.
    masks: [u32; MAX_LOCAL_ADDRS],
    addr_count: usize,
    /// The port's IPv6 addresses, scanned the same way.
    addrs6: [Ipv6Addr; MAX_LOCAL_ADDRS],
    addr6_count: usize,
}

impl LocalResponder {
    /// A responder for the port with MAC `mac` and the IPv4 addresses `addrs`, each
    /// with its prefix length (which says who is on the port's link).
    ///
    /// # Panics
    /// If more than [`MAX_LOCAL_ADDRS`] addresses are given (the config rejects that
    /// earlier, so reaching it here is a bug).
    pub fn new(mac: [u8; 6], addrs: &[(Ipv4Addr, u8)]) -> Self {
        assert!(
            addrs.len() <= MAX_LOCAL_ADDRS,
            "at most {MAX_LOCAL_ADDRS} local addresses, got {}",
            addrs.len()
        );
        let mut table = [Ipv4Addr::UNSPECIFIED; MAX_LOCAL_ADDRS];
        let mut masks = [u32::MAX; MAX_LOCAL_ADDRS];
        for (i, &(addr, prefix_len)) in addrs.iter().enumerate() {
            table[i] = addr;
            masks[i] = crate::service::acl::mask(prefix_len.min(32));
        }
        LocalResponder {
            mac: MacAddr(mac),
            addrs: table,
            masks,
            addr_count: addrs.len(),
            addrs6: [Ipv6Addr::UNSPECIFIED; MAX_LOCAL_ADDRS],
            addr6_count: 0,
        }
    }

    /// The same responder, also answering for the IPv6 addresses `addrs6`.
    ///
    /// # Panics
    /// If more than [`MAX_LOCAL_ADDRS`] addresses are given (the config rejects that
    /// earlier).
    pub fn with_ipv6(mut self, addrs6: &[Ipv6Addr]) -> Self {
        assert!(
            addrs6.len() <= MAX_LOCAL_ADDRS,
            "at most {MAX_LOCAL_ADDRS} local IPv6 addresses, got {}",
            addrs6.len()
        );
        self.addrs6[..addrs6.len()].copy_from_slice(addrs6);
        self.addr6_count = addrs6.len();
        self
    }

    pub fn addrs6(&self) -> &[Ipv6Addr] {
        &self.addrs6[..self.addr6_count]
    }

    /// `ip` is one of the appliance's own IPv6 addresses.
    #[inline]
    pub fn is_local6(&self, ip: Ipv6Addr) -> bool {
        self.addrs6().contains(&ip)
    }

    /// `group` is a multicast group the port listens to: all nodes, or the
    /// solicited-node group of one of its IPv6 addresses. A port without IPv6
    /// addresses listens to none.
    fn listens(&self, group: Ipv6Addr) -> bool {
        self.addr6_count != 0
            && (group == ipv6::ALL_NODES
                || self
                    .addrs6()
                    .iter()
                    .any(|&ours| ipv6::solicited_node(ours) == group))
    }

    pub fn mac(&self) -> MacAddr {
        self.mac
    }

    pub fn addrs(&self) -> &[Ipv4Addr] {
        &self.addrs[..self.addr_count]
    }

    /// `ip` is one of the appliance's own addresses.
    #[inline]
    pub fn is_local(&self, ip: Ipv4Addr) -> bool {
        self.addrs().contains(&ip)
    }

    /// `ip` is on one of the port's subnets (on its link).
    pub fn on_link(&self, ip: Ipv4Addr) -> bool {
        let ip = u32::from(ip);
        self.addrs()
            .iter()
            .zip(&self.masks)
            .any(|(&ours, &mask)| ip & mask == u32::from(ours) & mask)
    }

    /// Handles one received frame: rewrites it into an ARP reply or ICMP echo reply
    /// (`Verdict::Reply`) or says why it must be dropped. Never panics, whatever the
    /// bytes; never allocates. Counts the events (replies, neighbours learned) itself;
    /// the caller counts drops.
    pub fn process(
        &self,
        frame: &mut [u8],
        neighbours: &mut NeighbourTable,
        now_tsc: u64,
        counters: &WorkerCounters,
    ) -> Verdict {
        self.process_with_vips(
            frame,
            neighbours,
            now_tsc,
            counters,
            &[],
            NeighbourPolicy::default(),
        )
    }

    /// As [`process`](Self::process), also answering for the virtual service
    /// addresses in `vips` (sorted): Sluice owns its VIPs on the wire, so clients
    /// resolve and ping them like its own addresses. `policy` says which neighbours
    /// keep their entries.
    pub fn process_with_vips(
        &self,
        frame: &mut [u8],
        neighbours: &mut NeighbourTable,
        now_tsc: u64,
        counters: &WorkerCounters,
        vips: &[Ipv4Addr],
        policy: NeighbourPolicy<'_>,
    ) -> Verdict {
        let me = Answering {
            responder: self,
            vips,
            policy,
        };
        match me.respond(frame, neighbours, now_tsc, counters) {
            Ok(()) => Verdict::Reply,
            Err(reason) => Verdict::Drop(reason),
        }
    }
}

impl LocalResponder {
    /// Handles one IPv6 frame that [`classify`](crate::flow::parse::classify) took
    /// apart into `parsed`: answers a Neighbor Solicitation for one of our IPv6
    /// addresses with a Neighbor Advertisement, or an echo request to one of them with
    /// its reply, rewriting `buf` in place, and returns the reply's length; or says
    /// why the frame is dropped. `buf` starts with the frame and may run on into the
    /// buffer's free room, which a reply may need (an advertisement is longer than a
    /// duplicate address probe). Never panics, never allocates; every offset of
    /// `parsed` is checked against `buf`. Counts its events; the caller counts drops.
    pub fn process_ipv6(
        &self,
        buf: &mut [u8],
        parsed: &Parsed,
        neighbours: &mut Neighbour6Table,
        now_tsc: u64,
        counters: &WorkerCounters,
        known: Known6<'_>,
    ) -> Result<usize, DropReason> {
        let vips6 = known.vips6;
        let PacketKind::Ipv6(payload) = parsed.kind else {
            return Err(DropReason::UnknownEthertype);
        };
        let eth = ethernet::Frame::new_checked(&*buf).map_err(|_| DropReason::Truncated)?;
        let (peer_mac, dst_mac) = (eth.src_addr(), eth.dst_addr());
        if peer_mac.is_multicast() {
            return Err(DropReason::BadSourceMac);
        }
        let (l3, l4, end) = (parsed.l3, parsed.l4, parsed.ip_end());
        if l3 < ethernet::HEADER_LEN || l4 < l3 + ipv6::HEADER_LEN || l4 > end {
            return Err(DropReason::Truncated);
        }
        let packet = buf
            .get(l3..end)
            .ok_or(DropReason::Truncated)
            .and_then(|b| ipv6::Packet::new_checked(b).map_err(|_| DropReason::BadIpv6Header))?;
        let (src, dst, hop_limit) = (packet.src_addr(), packet.dst_addr(), packet.hop_limit());

        // A group's frames come to its group MAC; unicast ones to ours.
        let mac_fits =
            dst_mac == self.mac || (dst.is_multicast() && dst_mac == MacAddr::ipv6_multicast(dst));
        if !mac_fits {
            return Err(DropReason::NotOurMac);
        }
        // The VIPs are ours too: Neighbor Discovery and echo, as ARP and ping for
        // IPv4 VIPs (sorted, from the snapshot; empty while VRRP makes us a backup).
        let is_vip = |ip: Ipv6Addr| vips6.binary_search(&ip).is_ok();
        let for_us = if dst.is_multicast() {
            self.listens(dst) || vips6.iter().any(|&v| ipv6::solicited_node(v) == dst)
        } else {
            self.is_local6(dst) || is_vip(dst)
        };
        if !for_us {
            return Err(match payload {
                _ if dst.is_multicast() => DropReason::Ipv6GroupNotJoined,
                Ipv6Payload::Tcp { .. } | Ipv6Payload::Udp { .. } => DropReason::Ipv6NoService,
                _ => DropReason::NotLocal,
            });
        }
        let Ipv6Payload::Icmp { icmp_type, .. } = payload else {
            return Err(DropReason::UnsupportedProtocol);
        };
        if icmp_type.is_ndisc() {
            // RFC 6980: Neighbor Discovery in a fragment, an atomic one included, is
            // dropped, as Linux drops it: a fragment header is how ND is slipped past
            // a switch's ND inspection (RFC 7113) to poison a neighbour entry.
            if l4 != l3 + ipv6::HEADER_LEN
                && packet.upper_layer().is_ok_and(|u| u.fragment.is_some())
            {
                return Err(DropReason::NdiscMalformed);
            }
            let message = icmpv6::Packet::new_unchecked(&buf[l4..end]);
            let repr = NdiscRepr::parse(&message, src, dst, hop_limit).map_err(ndisc_drop)?;
            let from = Solicitor {
                ip: src,
                eth_src: peer_mac,
                to_us: self.is_local6(dst),
            };
            return self.answer_ndisc(buf, l3, repr, from, neighbours, now_tsc, counters, known);
        }
        if icmp_type.is_error() {
            // Errors about sessions are the forwarder's: it takes every ICMPv6 error
            // sent to the port's MAC before the responder sees it. One reaching here
            // came to a broadcast or multicast MAC and is about no session of ours.
            return Err(DropReason::IcmpErrorNoSession);
        }
        if dst.is_multicast() {
            // A ping to a group is not answered: one request, many replies.
            return Err(DropReason::NotLocal);
        }
        if ipv6::is_martian_source(src) {
            return Err(DropReason::MartianSource);
        }
        let message =
            icmpv6::Packet::new_checked(&buf[l4..end]).map_err(|_| DropReason::Truncated)?;
        if !message.verify_checksum(src, dst) {
            return Err(DropReason::BadIcmpv6Checksum);
        }
        if !message.is_echo_request() {
            return Err(DropReason::IcmpNotEcho);
        }
        let len = icmpv6::write_echo_reply(buf, l3, l4, self.mac).ok_or(DropReason::Truncated)?;
        counters.event(Event::IcmpV6EchoReplied);
        Ok(len)
    }

    /// Acts on a checked Neighbor Discovery message that came to us.
    #[allow(clippy::too_many_arguments)]
    fn answer_ndisc(
        &self,
        buf: &mut [u8],
        l3: usize,
        repr: NdiscRepr,
        from: Solicitor,
        neighbours: &mut Neighbour6Table,
        now_tsc: u64,
        counters: &WorkerCounters,
        known: Known6<'_>,
    ) -> Result<usize, DropReason> {
        match repr {
            NdiscRepr::NeighborSolicit {
                target,
                source_lladdr,
            } => {
                let target_is_ours =
                    self.is_local6(target) || known.vips6.binary_search(&target).is_ok();
                if let Some(mac) = source_lladdr {
                    if self.may_learn6(from.ip, mac) {
                        // As for ARP: a solicitation for us creates the solicitor's
                        // entry (RFC 4861 section 7.2.3); others only refresh one.
                        let learned = if target_is_ours {
                            Some(known.learn(neighbours, from.ip, mac, now_tsc))
                        } else {
                            neighbours.update_existing(from.ip, mac, now_tsc)
                        };
                        count_learned(learned, counters, NEIGHBOUR6_EVENTS);
                    }
                }
                if !target_is_ours {
                    return Err(DropReason::NdiscNotForUs);
                }
                let probe = from.ip.is_unspecified();
                // Without a source link-layer address option (a unicast reachability
                // probe) the advertisement goes back to the frame's sender.
                let solicitor_mac = source_lladdr.unwrap_or(from.eth_src);
                if !probe && !solicitor_mac.is_unicast() {
                    return Err(DropReason::NdiscMalformed);
                }
                let len = icmpv6::write_solicited_advert(
                    buf,
                    l3,
                    self.mac,
                    target,
                    from.ip,
                    solicitor_mac,
                    false,
                )
                .ok_or(DropReason::Truncated)?;
                counters.event(if probe {
                    Event::NdDadDefended
                } else {
                    Event::NdAnswered
                });
                Ok(len)
            }
            NdiscRepr::NeighborAdvert {
                flags,
                target,
                target_lladdr,
            } => {
                // An unsolicited advertisement creates no entry (RFC 4861 section
                // 7.2.5). A solicited one sent to our own address answers one of our
                // solicitations (for a real server): the entry RFC 4861 would have
                // made INCOMPLETE when soliciting is made now. One claiming our own
                // address is never taken.
                // An unsolicited advertisement without the Override flag does not
                // replace another link-layer address already known (RFC 4861 section
                // 7.2.5): a proxy's or an anycast responder's must not take a host's
                // entry. An answer to our own solicitation does (Sluice keeps no
                // neighbour states, so the RFC's way out, an entry deleted after
                // unanswered probes, is not there).
                let overrides = flags.contains(crate::wire::icmpv6::NaFlags::OVERRIDE);
                let answer = flags.contains(crate::wire::icmpv6::NaFlags::SOLICITED) && from.to_us;
                if let Some(mac) = target_lladdr {
                    let keeps_other = !overrides
                        && !answer
                        && neighbours.lookup(target).is_some_and(|known| known != mac);
                    if self.may_learn6(target, mac) && !keeps_other {
                        let learned = if answer {
                            Some(known.learn(neighbours, target, mac, now_tsc))
                        } else {
                            neighbours.update_existing(target, mac, now_tsc)
                        };
                        count_learned(learned, counters, NEIGHBOUR6_EVENTS);
                    }
                }
                Err(DropReason::NdiscAdvert)
            }
            NdiscRepr::RouterAdvert { .. } => Err(DropReason::NdiscUnsupported),
        }
    }

    /// Whether an IPv6 neighbour may enter the table: a unicast host address that is
    /// not ours, with a unicast MAC.
    fn may_learn6(&self, ip: Ipv6Addr, mac: MacAddr) -> bool {
        mac.is_unicast()
            && mac != MacAddr::ZERO
            && !ip.is_unspecified()
            && !ip.is_multicast()
            && !ip.is_loopback()
            && !self.is_local6(ip)
    }
}

/// What the forwarder knows of the IPv6 addresses a Neighbor Discovery message may
/// name: the VIPs (answered as ours) and the real servers (learned from a
/// solicitation for us or a solicited advertisement to us while the table has room;
/// others only into its unreserved part).
#[derive(Clone, Copy, Default)]
pub struct Known6<'a> {
    /// Sorted.
    pub vips6: &'a [Ipv6Addr],
    /// Sorted.
    pub real_servers6: &'a [Ipv6Addr],
}

impl Known6<'_> {
    /// Learns a neighbour that a message for us vouches for: a real server while the
    /// table has room, any other only into [`NeighbourTable::unreserved`], so
    /// solicitors made up by the thousand (a /64 holds 2^64 of them) cannot leave a
    /// real server added later unresolved.
    fn learn(
        &self,
        neighbours: &mut Neighbour6Table,
        ip: Ipv6Addr,
        mac: MacAddr,
        now_tsc: u64,
    ) -> Learn {
        if self.real_servers6.binary_search(&ip).is_ok() {
            // A real server matters more than any other entry: with the table full,
            // it takes the slot of one that is no real server. Other IPv6 entries
            // give up none (an IPv6 next hop that is no real server is not solicited
            // again once gone).
            let keep = |other: Ipv6Addr| self.real_servers6.binary_search(&other).is_ok();
            neighbours.learn_making_room(ip, mac, now_tsc, neighbours.capacity(), 0, keep)
        } else {
            let room = neighbours.unreserved();
            neighbours.learn_below(ip, mac, now_tsc, room)
        }
    }
}

/// The events one family's neighbour learning counts: learned, reclaimed, table full.
const NEIGHBOUR_EVENTS: [Event; 3] = [
    Event::NeighbourLearned,
    Event::NeighbourReclaimed,
    Event::NeighbourTableFull,
];
const NEIGHBOUR6_EVENTS: [Event; 3] = [
    Event::Neighbour6Learned,
    Event::Neighbour6Reclaimed,
    Event::Neighbour6TableFull,
];

/// Counts what learning a neighbour did, as `events` name it for its family.
fn count_learned(learned: Option<Learn>, counters: &WorkerCounters, events: [Event; 3]) {
    let [learned_event, reclaimed, full] = events;
    match learned {
        Some(Learn::Inserted) => counters.event(learned_event),
        Some(Learn::Reclaimed) => {
            counters.event(learned_event);
            counters.event(reclaimed);
        }
        Some(Learn::Full) => counters.event(full),
        _ => {}
    }
}

/// Who sent a Neighbor Discovery message: its IPv6 source and Ethernet source.
#[derive(Clone, Copy)]
struct Solicitor {
    ip: Ipv6Addr,
    eth_src: MacAddr,
    /// The message was sent to one of our own unicast addresses.
    to_us: bool,
}

/// The drop reason for each way a Neighbor Discovery message can fail its checks.
fn ndisc_drop(err: NdiscError) -> DropReason {
    match err {
        NdiscError::HopLimit => DropReason::NdiscHopLimit,
        NdiscError::Truncated => DropReason::NdiscTruncated,
        NdiscError::BadChecksum => DropReason::BadIcmpv6Checksum,
        NdiscError::Malformed => DropReason::NdiscMalformed,
        NdiscError::Unsupported => DropReason::NdiscUnsupported,
    }
}

/// Which IPv4 neighbours keep their entries in a full table, and when the others may
/// give theirs up.
#[derive(Clone, Copy, Debug)]
pub struct NeighbourPolicy<'a> {
    /// Sorted real-server addresses: worth an entry wherever they are, and, with the
    /// table full, worth the slot of any entry that is neither a real server nor a
    /// peer.
    pub real_servers: &'a [Ipv4Addr],
    /// Sorted addresses of the peers the port sends to by their MACs (VRRP unicast,
    /// session sync over the port): their entries are never given up either.
    pub peers: &'a [Ipv4Addr],
    /// Any other entry not learned or confirmed for this long (TSC cycles) gives its
    /// slot to a new one when its share of the table is full; `u64::MAX`: never.
    pub stale_tsc: u64,
}

impl Default for NeighbourPolicy<'_> {
    /// No real server, no peer, nothing given up.
    fn default() -> Self {
        NeighbourPolicy {
            real_servers: &[],
            peers: &[],
            stale_tsc: u64::MAX,
        }
    }
}

impl NeighbourPolicy<'_> {
    /// Whether `ip`'s entry is never given up.
    #[inline]
    pub fn keeps(&self, ip: Ipv4Addr) -> bool {
        self.real_servers.binary_search(&ip).is_ok() || self.peers.binary_search(&ip).is_ok()
    }

    /// Learns `ip -> mac` into a table shared out as the ARP path does (real servers
    /// to the whole table, making room; others within `limit`, making room from stale
    /// entries); `remember`: offered to the other workers when new or changed.
    pub fn learn(
        &self,
        neighbours: &mut NeighbourTable,
        ip: Ipv4Addr,
        mac: MacAddr,
        now_tsc: u64,
        limit: usize,
        remember: bool,
    ) -> Learn {
        let keep = |other| self.keeps(other);
        let (limit, min_age) = if self.real_servers.binary_search(&ip).is_ok() {
            (neighbours.capacity(), 0)
        } else {
            (limit, self.stale_tsc)
        };
        if remember {
            neighbours.learn_making_room(ip, mac, now_tsc, limit, min_age, keep)
        } else {
            neighbours.learn_shared_making_room(ip, mac, now_tsc, limit, min_age, keep)
        }
    }
}

/// A responder together with the VIPs it answers for on this burst.
struct Answering<'a> {
    responder: &'a LocalResponder,
    /// Sorted virtual service addresses.
    vips: &'a [Ipv4Addr],
    policy: NeighbourPolicy<'a>,
}

impl Answering<'_> {
    /// `ip` is one of our addresses or a VIP.
    #[inline]
    fn owns(&self, ip: Ipv4Addr) -> bool {
        self.responder.is_local(ip) || self.vips.binary_search(&ip).is_ok()
    }

    fn respond(
        &self,
        frame: &mut [u8],
        neighbours: &mut NeighbourTable,
        now_tsc: u64,
        counters: &WorkerCounters,
    ) -> Result<(), DropReason> {
        let eth = ethernet::Frame::new_checked(&*frame).map_err(|_| DropReason::Truncated)?;
        let peer_mac = eth.src_addr();
        if peer_mac.is_multicast() {
            return Err(DropReason::BadSourceMac);
        }
        let dst_mac = eth.dst_addr();
        if dst_mac != self.responder.mac && !dst_mac.is_broadcast() {
            return Err(DropReason::NotOurMac);
        }
        let l2 = ethernet::parse_l2(frame).map_err(|_| DropReason::Truncated)?;
        // VLAN tags stay where they are: the reply leaves on the same VLAN(s).
        let (l2_header, l3) = frame.split_at_mut(l2.l3_offset);
        match l2.ethertype {
            EtherType::ARP => self.answer_arp(l2_header, l3, neighbours, now_tsc, counters),
            EtherType::IPV4 => self.answer_ipv4(l2_header, l3, peer_mac, counters),
            // IPv6 goes to `process_ipv6`, after classification.
            EtherType::IPV6 => Err(DropReason::UnsupportedProtocol),
            _ => Err(DropReason::UnknownEthertype),
        }
    }

    fn answer_arp(
        &self,
        l2_header: &mut [u8],
        l3: &mut [u8],
        neighbours: &mut NeighbourTable,
        now_tsc: u64,
        counters: &WorkerCounters,
    ) -> Result<(), DropReason> {
        let mut packet = arp::Packet::new_checked(l3).map_err(|err| match err {
            WireError::Truncated => DropReason::Truncated,
            _ => DropReason::BadArp,
        })?;
        let operation = packet.operation();
        if let arp::Operation::Unknown(_) = operation {
            return Err(DropReason::BadArp);
        }
        let sender_mac = packet.sender_hardware_addr();
        let sender_ip = packet.sender_protocol_addr();
        let target_ip = packet.target_protocol_addr();
        let target_is_ours = self.owns(target_ip);

        if self.may_learn(sender_ip, sender_mac) {
            // RFC 826: refresh a known sender from any ARP; add a new one only when the
            // packet is for us, so one chatty segment cannot fill the table, and only
            // from the port's link or a real server: senders made up by the thousand
            // would otherwise fill it for good, and a real server added later would
            // never be resolved.
            // A real server may take the whole table; with it full, the slot of
            // any entry that is neither a real server nor a peer. Others make room
            // only from entries not heard from for `stale_tsc`, so what is in use
            // stays, and addresses that came and went do not hold slots for good.
            let policy = self.policy;
            let learned = if !target_is_ours {
                neighbours.update_existing(sender_ip, sender_mac, now_tsc)
            } else if policy.real_servers.binary_search(&sender_ip).is_ok() {
                Some(policy.learn(neighbours, sender_ip, sender_mac, now_tsc, 0, true))
            } else if self.responder.on_link(sender_ip) {
                // A quarter stays for real servers: senders made up on a large
                // subnet must not leave one added later unresolved either.
                let room = neighbours.unreserved();
                Some(policy.learn(neighbours, sender_ip, sender_mac, now_tsc, room, true))
            } else {
                // Off the port's subnets: a host on the link with a route to another
                // subnet (a client a synced session answers before it has sent
                // anything), or a made-up sender. Half the table at most.
                let half = neighbours.capacity() / 2;
                match policy.learn(neighbours, sender_ip, sender_mac, now_tsc, half, true) {
                    Learn::Full => {
                        counters.event(Event::NeighbourOffLink);
                        None
                    }
                    learned => Some(learned),
                }
            };
            count_learned(learned, counters, NEIGHBOUR_EVENTS);
            if learned == Some(Learn::Unchanged)
                && operation == arp::Operation::Reply
                && target_is_ours
            {
                // An answer to our request about an entry this worker holds: another
                // worker may have asked after giving up its copy, and only this one
                // received the answer. (Not when there was no room here: made-up
                // senders could then fill the shares.)
                neighbours.share_again(sender_ip, sender_mac);
            }
        }

        match operation {
            arp::Operation::Request if target_is_ours => {
                // The reply goes to the sender hardware address (RFC 826); a group
                // address there cannot be answered.
                if !sender_mac.is_unicast() {
                    return Err(DropReason::BadArp);
                }
                packet.set_operation(arp::Operation::Reply);
                packet.set_sender_hardware_addr(self.responder.mac);
                packet.set_sender_protocol_addr(target_ip);
                packet.set_target_hardware_addr(sender_mac);
                packet.set_target_protocol_addr(sender_ip);
                self.address_reply(l2_header, sender_mac);
                counters.event(Event::ArpReplied);
                Ok(())
            }
            // A reply is ours (and, with an exception path, the kernel's: its own
            // resolutions) only when it is for one of our addresses; one for another
            // host's, a gratuitous reply among them, has nothing more for anyone here.
            arp::Operation::Reply if target_is_ours => Err(DropReason::ArpReply),
            _ => Err(DropReason::ArpNotForUs),
        }
    }

    /// Whether an ARP sender may enter the neighbour table: a real host address with a
    /// unicast MAC. Probes (sender 0.0.0.0, RFC 5227) and anyone claiming one of our
    /// own addresses are not learned.
    fn may_learn(&self, ip: Ipv4Addr, mac: MacAddr) -> bool {
        mac.is_unicast()
            && mac != MacAddr::ZERO
            && !ip.is_unspecified()
            && !ip.is_broadcast()
            && !ip.is_multicast()
            && !self.owns(ip)
    }

    fn answer_ipv4(
        &self,
        l2_header: &mut [u8],
        l3: &mut [u8],
        peer_mac: MacAddr,
        counters: &WorkerCounters,
    ) -> Result<(), DropReason> {
        let mut packet = ipv4::Packet::new_checked(l3).map_err(|err| match err {
            WireError::Truncated => DropReason::Truncated,
            _ => DropReason::BadIpv4Header,
        })?;
        if !packet.verify_checksum() {
            return Err(DropReason::BadIpv4Checksum);
        }
        let our_ip = packet.dst_addr();
        if !self.owns(our_ip) {
            return Err(DropReason::NotLocal);
        }
        if packet.is_fragment() {
            return Err(DropReason::Ipv4Fragment);
        }
        if packet.protocol() != IpProtocol::ICMP {
            return Err(DropReason::UnsupportedProtocol);
        }
        let peer_ip = packet.src_addr();
        // A source that is not a single remote host (RFC 1812 martians) would turn our
        // reply into a broadcast or a reflection: never answer it.
        if ipv4::is_martian_source(peer_ip) {
            return Err(DropReason::MartianSource);
        }

        let mut message =
            icmp::Packet::new_checked(packet.payload_mut()).map_err(|_| DropReason::Truncated)?;
        if !message.verify_checksum() {
            return Err(DropReason::BadIcmpChecksum);
        }
        if !message.is_echo_request() {
            return Err(DropReason::IcmpNotEcho);
        }
        message.echo_request_to_reply();

        packet.set_src_addr(our_ip);
        packet.set_dst_addr(peer_ip);
        packet.set_ttl(REPLY_TTL);
        // Options are blanked (end-of-list), not reflected: echoing a source route or
        // a half-filled record route back would be wrong, and the length must stay.
        packet.options_mut().fill(0);
        packet.fill_checksum();
        self.address_reply(l2_header, peer_mac);
        counters.event(Event::IcmpEchoReplied);
        Ok(())
    }

    /// Addresses the Ethernet header from us to `to`; VLAN tags are left untouched.
    fn address_reply(&self, l2_header: &mut [u8], to: MacAddr) {
        let mut eth = ethernet::Frame::new_unchecked(l2_header);
        eth.set_dst_addr(to);
        eth.set_src_addr(self.responder.mac);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::test_util::XorShift;

    const OUR_MAC: [u8; 6] = [0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c];
    const CLIENT_MAC: MacAddr = MacAddr([0x52, 0x54, 0x00, 0x12, 0x34, 0x56]);
    const CLIENT_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
    const OUR_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);
    const VLAN_CLIENT_MAC: MacAddr = MacAddr([0x52, 0x54, 0x00, 0xaa, 0xbb, 0xcc]);
    const VLAN_CLIENT_IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
    const OUR_OTHER_IP: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 10);

    // Frames as a Linux host sends them (no FCS; short frames padded to 60 bytes), and
    // the replies expected byte for byte. Checksums computed independently.

    // Broadcast "who has 10.0.0.2? tell 10.0.0.1".
    static ARP_REQUEST: [u8; 60] = [
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x08, 0x06, 0x00,
        0x01, 0x08, 0x00, 0x06, 0x04, 0x00, 0x01, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x0a, 0x00,
        0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0a, 0x00, 0x00, 0x02, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];
    // "10.0.0.2 is at 00:1b:21:0a:0b:0c", unicast back, padding kept.
    static ARP_REPLY: [u8; 60] = [
        0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x08, 0x06, 0x00,
        0x01, 0x08, 0x00, 0x06, 0x04, 0x00, 0x02, 0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x0a, 0x00,
        0x00, 0x02, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x0a, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];
    // 802.1Q VLAN 100: who has 192.0.2.10? tell 192.0.2.1 (padded to 64 bytes).
    static VLAN_ARP_REQUEST: [u8; 64] = [
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x52, 0x54, 0x00, 0xaa, 0xbb, 0xcc, 0x81, 0x00, 0x00,
        0x64, 0x08, 0x06, 0x00, 0x01, 0x08, 0x00, 0x06, 0x04, 0x00, 0x01, 0x52, 0x54, 0x00, 0xaa,
        0xbb, 0xcc, 0xc0, 0x00, 0x02, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xc0, 0x00, 0x02,
        0x0a, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
    ];
    // Its reply, on the same VLAN.
    static VLAN_ARP_REPLY: [u8; 64] = [
        0x52, 0x54, 0x00, 0xaa, 0xbb, 0xcc, 0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x81, 0x00, 0x00,
        0x64, 0x08, 0x06, 0x00, 0x01, 0x08, 0x00, 0x06, 0x04, 0x00, 0x02, 0x00, 0x1b, 0x21, 0x0a,
        0x0b, 0x0c, 0xc0, 0x00, 0x02, 0x0a, 0x52, 0x54, 0x00, 0xaa, 0xbb, 0xcc, 0xc0, 0x00, 0x02,
        0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
    ];
    // `ping` from 10.0.0.1 (three hops away: TTL 61), 56 bytes of data.
    static ECHO_REQUEST: [u8; 98] = [
        0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x08, 0x00, 0x45,
        0x00, 0x00, 0x54, 0x4c, 0x2f, 0x40, 0x00, 0x3d, 0x01, 0xdd, 0x77, 0x0a, 0x00, 0x00, 0x01,
        0x0a, 0x00, 0x00, 0x02, 0x08, 0x00, 0x00, 0x33, 0x0d, 0x05, 0x00, 0x03, 0xe1, 0xb7, 0xa3,
        0x66, 0x00, 0x00, 0x00, 0x00, 0xa2, 0xd3, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x11,
        0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f, 0x20,
        0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27, 0x28, 0x29, 0x2a, 0x2b, 0x2c, 0x2d, 0x2e, 0x2f,
        0x30, 0x31, 0x32, 0x33, 0x34, 0x35, 0x36, 0x37,
    ];
    // Its reply: addresses swapped, TTL 64, type 0, both checksums updated.
    static ECHO_REPLY: [u8; 98] = [
        0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x08, 0x00, 0x45,
        0x00, 0x00, 0x54, 0x4c, 0x2f, 0x40, 0x00, 0x40, 0x01, 0xda, 0x77, 0x0a, 0x00, 0x00, 0x02,
        0x0a, 0x00, 0x00, 0x01, 0x00, 0x00, 0x08, 0x33, 0x0d, 0x05, 0x00, 0x03, 0xe1, 0xb7, 0xa3,
        0x66, 0x00, 0x00, 0x00, 0x00, 0xa2, 0xd3, 0x04, 0x00, 0x00, 0x00, 0x00, 0x00, 0x10, 0x11,
        0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f, 0x20,
        0x21, 0x22, 0x23, 0x24, 0x25, 0x26, 0x27, 0x28, 0x29, 0x2a, 0x2b, 0x2c, 0x2d, 0x2e, 0x2f,
        0x30, 0x31, 0x32, 0x33, 0x34, 0x35, 0x36, 0x37,
    ];
    // QinQ (S-tag 10, C-tag 20), TTL 255, 4 bytes of data, then 6 bytes of padding.
    static QINQ_ECHO_REQUEST: [u8; 60] = [
        0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x52, 0x54, 0x00, 0xaa, 0xbb, 0xcc, 0x88, 0xa8, 0x00,
        0x0a, 0x81, 0x00, 0x00, 0x14, 0x08, 0x00, 0x45, 0x00, 0x00, 0x20, 0x00, 0x00, 0x00, 0x00,
        0xff, 0x01, 0x37, 0xd1, 0xc0, 0x00, 0x02, 0x01, 0xc0, 0x00, 0x02, 0x0a, 0x08, 0x00, 0x18,
        0x2e, 0x00, 0x01, 0x01, 0x00, 0x70, 0x69, 0x6e, 0x67, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];
    // Its reply, tags and padding as they were.
    static QINQ_ECHO_REPLY: [u8; 60] = [
        0x52, 0x54, 0x00, 0xaa, 0xbb, 0xcc, 0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x88, 0xa8, 0x00,
        0x0a, 0x81, 0x00, 0x00, 0x14, 0x08, 0x00, 0x45, 0x00, 0x00, 0x20, 0x00, 0x00, 0x00, 0x00,
        0x40, 0x01, 0xf6, 0xd1, 0xc0, 0x00, 0x02, 0x0a, 0xc0, 0x00, 0x02, 0x01, 0x00, 0x00, 0x20,
        0x2e, 0x00, 0x01, 0x01, 0x00, 0x70, 0x69, 0x6e, 0x67, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];
    // IHL 7: a record-route option and a NOP; odd-length data.
    static OPTIONS_ECHO_REQUEST: [u8; 53] = [
        0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x08, 0x00, 0x47,
        0x00, 0x00, 0x27, 0x12, 0x34, 0x40, 0x00, 0x40, 0x01, 0x07, 0x98, 0x0a, 0x00, 0x00, 0x01,
        0x0a, 0x00, 0x00, 0x02, 0x07, 0x07, 0x04, 0x00, 0x00, 0x00, 0x00, 0x01, 0x08, 0x00, 0x24,
        0x8b, 0x00, 0x07, 0x00, 0x09, 0x6f, 0x64, 0x64,
    ];
    // Its reply: options blanked to end-of-list, header checksum recomputed.
    static OPTIONS_ECHO_REPLY: [u8; 53] = [
        0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x08, 0x00, 0x47,
        0x00, 0x00, 0x27, 0x12, 0x34, 0x40, 0x00, 0x40, 0x01, 0x12, 0xa0, 0x0a, 0x00, 0x00, 0x02,
        0x0a, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x2c,
        0x8b, 0x00, 0x07, 0x00, 0x09, 0x6f, 0x64, 0x64,
    ];

    struct Harness {
        responder: LocalResponder,
        neighbours: NeighbourTable,
        counters: WorkerCounters,
    }

    impl Harness {
        fn new() -> Harness {
            Harness::with_table(NeighbourTable::with_capacity(16))
        }

        fn with_table(neighbours: NeighbourTable) -> Harness {
            Harness {
                responder: LocalResponder::new(OUR_MAC, &[(OUR_IP, 24), (OUR_OTHER_IP, 24)]),
                neighbours,
                counters: WorkerCounters::default(),
            }
        }

        fn process(&mut self, frame: &mut [u8]) -> Verdict {
            self.responder
                .process(frame, &mut self.neighbours, 1000, &self.counters)
        }

        /// Processes a copy and asserts the verdict is the given drop.
        fn expect_drop(&mut self, frame: &[u8], reason: DropReason) {
            let mut copy = frame.to_vec();
            assert_eq!(self.process(&mut copy), Verdict::Drop(reason));
        }

        fn event(&self, event: Event) -> u64 {
            self.counters.events_snapshot()[event as usize]
        }
    }

    /// Rewrites the IPv4 header of an untagged frame and fixes its checksum.
    fn edit_ipv4(frame: &[u8], edit: impl FnOnce(&mut ipv4::Packet<&mut [u8]>)) -> Vec<u8> {
        let mut copy = frame.to_vec();
        let mut packet = ipv4::Packet::new_unchecked(&mut copy[14..]);
        edit(&mut packet);
        packet.fill_checksum();
        copy
    }

    /// Rewrites the ICMP message of an untagged, option-less frame; fixes its checksum.
    fn edit_icmp(frame: &[u8], edit: impl FnOnce(&mut icmp::Packet<&mut [u8]>)) -> Vec<u8> {
        let mut copy = frame.to_vec();
        let mut message = icmp::Packet::new_unchecked(&mut copy[34..]);
        edit(&mut message);
        message.fill_checksum();
        copy
    }

    #[test]
    fn arp_request_becomes_exact_reply() {
        let mut h = Harness::new();
        let mut frame = ARP_REQUEST;
        assert_eq!(h.process(&mut frame), Verdict::Reply);
        assert_eq!(frame, ARP_REPLY);
        assert_eq!(h.event(Event::ArpReplied), 1);
        assert_eq!(h.event(Event::NeighbourLearned), 1);
        assert_eq!(h.neighbours.lookup(CLIENT_IP), Some(CLIENT_MAC));
        // Asked again: answered again, the neighbour is only refreshed.
        let mut again = ARP_REQUEST;
        assert_eq!(h.process(&mut again), Verdict::Reply);
        assert_eq!(h.event(Event::NeighbourLearned), 1);
    }

    #[test]
    fn vlan_tagged_arp_keeps_its_tag() {
        let mut h = Harness::new();
        let mut frame = VLAN_ARP_REQUEST;
        assert_eq!(h.process(&mut frame), Verdict::Reply);
        assert_eq!(frame, VLAN_ARP_REPLY);
        assert_eq!(h.neighbours.lookup(VLAN_CLIENT_IP), Some(VLAN_CLIENT_MAC));
    }

    #[test]
    fn unicast_arp_request_is_answered() {
        // Linux re-validates its cache with unicast requests to our MAC.
        let mut h = Harness::new();
        let mut frame = ARP_REQUEST;
        frame[..6].copy_from_slice(&OUR_MAC);
        assert_eq!(h.process(&mut frame), Verdict::Reply);
        assert_eq!(frame, ARP_REPLY);
    }

    #[test]
    fn arp_probe_is_answered_but_not_learned() {
        // RFC 5227 probe: sender IP 0.0.0.0. We defend the address, learn nothing.
        let mut h = Harness::new();
        let mut frame = ARP_REQUEST;
        frame[28..32].fill(0);
        assert_eq!(h.process(&mut frame), Verdict::Reply);
        assert_eq!(
            frame[38..42],
            [0, 0, 0, 0],
            "target protocol address is the prober's"
        );
        assert_eq!(MacAddr::from_bytes(&frame[..6]), CLIENT_MAC);
        assert!(h.neighbours.is_empty());
        assert_eq!(h.event(Event::NeighbourLearned), 0);
    }

    #[test]
    fn arp_with_group_sender_mac_is_not_learned_nor_answered() {
        let mut h = Harness::new();
        let mut frame = ARP_REQUEST;
        frame[22..28].copy_from_slice(&[0x01, 0x00, 0x5e, 0x00, 0x00, 0x01]);
        h.expect_drop(&frame, DropReason::BadArp);
        assert!(h.neighbours.is_empty());
    }

    #[test]
    fn arp_for_another_host_only_refreshes_known_senders() {
        let mut h = Harness::new();
        let mut not_for_us = ARP_REQUEST;
        not_for_us[38..42].copy_from_slice(&[10, 0, 0, 99]);
        h.expect_drop(&not_for_us, DropReason::ArpNotForUs);
        assert!(h.neighbours.is_empty(), "strangers are not inserted");

        h.neighbours
            .learn(CLIENT_IP, MacAddr([2, 0, 0, 0, 0, 1]), 0);
        h.expect_drop(&not_for_us, DropReason::ArpNotForUs);
        assert_eq!(
            h.neighbours.lookup(CLIENT_IP),
            Some(CLIENT_MAC),
            "known one updated"
        );
        assert_eq!(h.event(Event::NeighbourLearned), 0);
    }

    /// The client answering an ARP request of ours: unicast to our MAC.
    fn client_reply_to_us() -> [u8; 60] {
        let mut reply = ARP_REPLY;
        {
            let mut eth = ethernet::Frame::new_unchecked(&mut reply[..]);
            eth.set_dst_addr(MacAddr(OUR_MAC));
            eth.set_src_addr(CLIENT_MAC);
        }
        let mut packet = arp::Packet::new_unchecked(&mut reply[14..]);
        packet.set_sender_hardware_addr(CLIENT_MAC);
        packet.set_sender_protocol_addr(CLIENT_IP);
        packet.set_target_hardware_addr(MacAddr(OUR_MAC));
        packet.set_target_protocol_addr(OUR_IP);
        reply
    }

    #[test]
    fn arp_reply_to_us_is_learned_then_dropped() {
        let mut h = Harness::new();
        let reply = client_reply_to_us();
        h.expect_drop(&reply, DropReason::ArpReply);
        assert_eq!(h.neighbours.lookup(CLIENT_IP), Some(CLIENT_MAC));
        assert_eq!(h.event(Event::NeighbourLearned), 1);
    }

    /// A static neighbour (`static_neighbours`) keeps its MAC whatever the link says:
    /// a reply to us, a request for us, a gratuitous ARP for another host.
    #[test]
    fn arp_never_moves_a_static_neighbour() {
        let mut h = Harness::new();
        let pinned = MacAddr([2, 0, 0, 0, 0, 0x42]);
        assert!(h.neighbours.pin(CLIENT_IP, pinned));
        h.expect_drop(&client_reply_to_us(), DropReason::ArpReply);
        assert_eq!(h.neighbours.lookup(CLIENT_IP), Some(pinned));
        let _ = h.process(&mut arp_request_from(CLIENT_IP));
        assert_eq!(h.neighbours.lookup(CLIENT_IP), Some(pinned));
        let mut not_for_us = ARP_REQUEST;
        not_for_us[38..42].copy_from_slice(&[10, 0, 0, 99]);
        h.expect_drop(&not_for_us, DropReason::ArpNotForUs);
        assert_eq!(h.neighbours.lookup(CLIENT_IP), Some(pinned));
        assert_eq!(h.event(Event::NeighbourLearned), 0);
        // Nor is the forged MAC shared with the other workers.
        assert_eq!(
            h.neighbours
                .take_changes(|ip, mac| panic!("shared {ip} at {mac:?}")),
            0
        );
    }

    /// An ARP request for us with its sender's address set to `sender`.
    fn arp_request_from(sender: Ipv4Addr) -> [u8; 60] {
        let mut frame = ARP_REQUEST;
        arp::Packet::new_unchecked(&mut frame[14..]).set_sender_protocol_addr(sender);
        frame
    }

    #[test]
    fn off_link_senders_take_half_the_table_at_most() {
        let mut h = Harness::new();
        // Sorted, as the snapshot gives them; one off the port's subnets.
        let real_servers: Vec<Ipv4Addr> =
            (0..5).map(|i| Ipv4Addr::new(203, 0, 113, 10 + i)).collect();
        let real_server = real_servers[0];
        let answer = |h: &mut Harness, sender: Ipv4Addr| {
            let mut frame = arp_request_from(sender);
            h.responder.process_with_vips(
                &mut frame,
                &mut h.neighbours,
                1000,
                &h.counters,
                &[],
                NeighbourPolicy {
                    real_servers: &real_servers,
                    ..NeighbourPolicy::default()
                },
            )
        };
        // Made up by the thousand, off both of the port's subnets (10.0.0.0/24,
        // 192.0.2.0/24): all answered, the first 8 of 16 entries learned, the rest
        // counted.
        for i in 0..4096u32 {
            let sender = Ipv4Addr::from(0xcb00_7100 + (i << 8) + 1);
            assert_eq!(answer(&mut h, sender), Verdict::Reply);
        }
        assert_eq!(h.neighbours.len(), 8);
        assert_eq!(h.event(Event::NeighbourLearned), 8);
        assert_eq!(h.event(Event::NeighbourOffLink), 4096 - 8);
        assert_eq!(h.event(Event::NeighbourTableFull), 0);
        // The other half stays for real servers, wherever they are, and the port's
        // own link; the last quarter for real servers alone.
        assert_eq!(answer(&mut h, real_server), Verdict::Reply);
        assert_eq!(h.neighbours.lookup(real_server), Some(CLIENT_MAC));
        for i in 0..7u8 {
            let on_link = Ipv4Addr::new(192, 0, 2, 100 + i);
            assert_eq!(answer(&mut h, on_link), Verdict::Reply);
            let learned = h.neighbours.lookup(on_link).is_some();
            assert_eq!(learned, i < 3, "on-link sender {i}");
        }
        assert_eq!(h.neighbours.len(), 12);
        assert_eq!(h.event(Event::NeighbourTableFull), 4);
        for &rs in &real_servers[1..] {
            assert_eq!(answer(&mut h, rs), Verdict::Reply);
            assert_eq!(h.neighbours.lookup(rs), Some(CLIENT_MAC));
        }
        assert_eq!(h.neighbours.len(), 16);
        // A known off-link sender is still refreshed.
        let first = Ipv4Addr::from(0xcb00_7101);
        let mut frame = arp_request_from(first);
        arp::Packet::new_unchecked(&mut frame[14..])
            .set_sender_hardware_addr(MacAddr([2, 0, 0, 0, 0, 0x77]));
        h.process(&mut frame);
        assert_eq!(
            h.neighbours.lookup(first),
            Some(MacAddr([2, 0, 0, 0, 0, 0x77]))
        );
    }

    #[test]
    fn a_full_table_makes_room_from_entries_that_came_and_went() {
        let mut h = Harness::new();
        let peer = Ipv4Addr::new(192, 0, 2, 50);
        let mut real_servers = vec![Ipv4Addr::new(192, 0, 2, 60)];
        let answer = |h: &mut Harness, sender: Ipv4Addr, now: u64, rs: &[Ipv4Addr]| {
            let mut frame = arp_request_from(sender);
            let policy = NeighbourPolicy {
                real_servers: rs,
                peers: &[peer],
                stale_tsc: 1000,
            };
            let verdict = h.responder.process_with_vips(
                &mut frame,
                &mut h.neighbours,
                now,
                &h.counters,
                &[],
                policy,
            );
            assert_eq!(verdict, Verdict::Reply, "{sender}");
        };
        // The peer first, then on-link senders up to the unreserved 12 of 16, all at 0.
        answer(&mut h, peer, 0, &real_servers);
        let on_link = |i: u8| Ipv4Addr::new(192, 0, 2, 100 + i);
        for i in 0..11 {
            answer(&mut h, on_link(i), 0, &real_servers);
        }
        assert_eq!(h.neighbours.len(), 12);
        // Nothing stale yet: a new sender is refused.
        answer(&mut h, on_link(11), 999, &real_servers);
        assert_eq!(h.neighbours.lookup(on_link(11)), None);
        assert_eq!(h.event(Event::NeighbourTableFull), 1);
        // 1000 later every sender but the peer is stale: each new one takes the slot
        // of one of them, never the peer's.
        for i in 11..22 {
            answer(&mut h, on_link(i), 1000, &real_servers);
            assert!(h.neighbours.lookup(on_link(i)).is_some(), "sender {i}");
        }
        assert_eq!(h.event(Event::NeighbourReclaimed), 11);
        assert_eq!(h.neighbours.len(), 12);
        assert!(
            h.neighbours.lookup(peer).is_some(),
            "the peer's entry was given up"
        );
        assert!((0..11).all(|i| h.neighbours.lookup(on_link(i)).is_none()));
        // Every slot holds the peer or a fresh sender: the next is refused again.
        answer(&mut h, on_link(22), 1500, &real_servers);
        assert_eq!(h.neighbours.lookup(on_link(22)), None);
        assert_eq!(h.event(Event::NeighbourTableFull), 2);
        // Real servers fill the reserve; with the table full, a real server added
        // later takes a fresh sender's slot at once, and no real server's or the peer's.
        for i in 0..4 {
            real_servers.push(Ipv4Addr::new(192, 0, 2, 61 + i));
        }
        for &rs in &real_servers[..4] {
            answer(&mut h, rs, 1500, &real_servers);
        }
        assert_eq!(h.neighbours.len(), 16);
        let added_later = real_servers[4];
        answer(&mut h, added_later, 1501, &real_servers);
        assert!(h.neighbours.lookup(added_later).is_some());
        assert_eq!(h.event(Event::NeighbourReclaimed), 12);
        assert_eq!(h.neighbours.len(), 16);
        assert!(h.neighbours.lookup(peer).is_some());
        assert!(real_servers
            .iter()
            .all(|&rs| h.neighbours.lookup(rs).is_some()));
        assert_eq!(
            (11..22)
                .filter(|&i| h.neighbours.lookup(on_link(i)).is_some())
                .count(),
            10
        );
    }

    #[test]
    fn an_answer_to_our_request_is_shared_even_unchanged() {
        let mut h = Harness::new();
        // The client answering an ARP request of ours.
        let mut reply = ARP_REPLY;
        reply[..6].copy_from_slice(&OUR_MAC);
        reply[6..12].copy_from_slice(&CLIENT_MAC.0);
        {
            let mut packet = arp::Packet::new_unchecked(&mut reply[14..]);
            packet.set_sender_hardware_addr(CLIENT_MAC);
            packet.set_sender_protocol_addr(CLIENT_IP);
            packet.set_target_hardware_addr(MacAddr(OUR_MAC));
            packet.set_target_protocol_addr(OUR_IP);
        }
        let shared = |h: &mut Harness| {
            let mut seen = Vec::new();
            h.neighbours.take_changes(|ip, mac| seen.push((ip, mac)));
            seen
        };
        h.expect_drop(&reply, DropReason::ArpReply);
        assert_eq!(shared(&mut h), [(CLIENT_IP, CLIENT_MAC)], "new: shared");
        // The same answer again (another worker asked after giving up its copy).
        h.expect_drop(&reply, DropReason::ArpReply);
        assert_eq!(
            shared(&mut h),
            [(CLIENT_IP, CLIENT_MAC)],
            "unchanged: shared again"
        );
        // A request from it is no answer: unchanged, not shared.
        let mut request = arp_request_from(CLIENT_IP);
        arp::Packet::new_unchecked(&mut request[14..]).set_target_protocol_addr(OUR_IP);
        assert_eq!(h.process(&mut request), Verdict::Reply);
        assert_eq!(shared(&mut h), [], "a request: not shared");
        // With no room here (the unreserved 12 of 16 taken), an answer for an address
        // this worker does not hold is not offered (made-up senders could fill the
        // shares); and repeated answers take at most half of a round's shares.
        for i in 0..11 {
            let mut request = arp_request_from(Ipv4Addr::new(10, 0, 0, 100 + i));
            arp::Packet::new_unchecked(&mut request[14..]).set_target_protocol_addr(OUR_IP);
            h.process(&mut request);
        }
        let _ = shared(&mut h);
        assert_eq!(h.neighbours.len(), 12);
        let stranger = Ipv4Addr::new(10, 0, 0, 200);
        let mut from_stranger = reply;
        arp::Packet::new_unchecked(&mut from_stranger[14..]).set_sender_protocol_addr(stranger);
        h.expect_drop(&from_stranger, DropReason::ArpReply);
        assert_eq!(h.neighbours.lookup(stranger), None);
        assert_eq!(shared(&mut h), [], "full here: not shared");
        for _ in 0..100 {
            h.expect_drop(&reply, DropReason::ArpReply);
        }
        assert_eq!(shared(&mut h).len(), 16, "half of the 32 a round holds");
    }

    #[test]
    fn full_neighbour_table_is_counted() {
        let mut h = Harness::with_table(NeighbourTable::with_capacity(1));
        h.neighbours
            .learn(Ipv4Addr::new(10, 0, 0, 77), CLIENT_MAC, 0);
        let mut frame = ARP_REQUEST;
        assert_eq!(h.process(&mut frame), Verdict::Reply, "still answered");
        assert_eq!(h.event(Event::NeighbourTableFull), 1);
        assert_eq!(h.neighbours.lookup(CLIENT_IP), None);
    }

    #[test]
    fn senders_claiming_our_address_are_not_learned() {
        let mut h = Harness::new();
        let mut frame = ARP_REQUEST;
        frame[28..32].copy_from_slice(&OUR_OTHER_IP.octets());
        assert_eq!(h.process(&mut frame), Verdict::Reply);
        assert!(h.neighbours.is_empty());
    }

    #[test]
    fn echo_request_becomes_exact_reply() {
        let mut h = Harness::new();
        let mut frame = ECHO_REQUEST;
        assert_eq!(h.process(&mut frame), Verdict::Reply);
        assert_eq!(frame, ECHO_REPLY);
        assert_eq!(h.event(Event::IcmpEchoReplied), 1);
        assert!(
            h.neighbours.is_empty(),
            "ICMP does not feed the neighbour table"
        );
    }

    #[test]
    fn qinq_echo_with_padding_keeps_tags_and_padding() {
        let mut h = Harness::new();
        let mut frame = QINQ_ECHO_REQUEST;
        assert_eq!(h.process(&mut frame), Verdict::Reply);
        assert_eq!(frame, QINQ_ECHO_REPLY);
    }

    #[test]
    fn echo_options_are_blanked() {
        let mut h = Harness::new();
        let mut frame = OPTIONS_ECHO_REQUEST;
        assert_eq!(h.process(&mut frame), Verdict::Reply);
        assert_eq!(frame, OPTIONS_ECHO_REPLY);
    }

    #[test]
    fn broadcast_mac_echo_is_answered_unicast() {
        let mut h = Harness::new();
        let mut frame = ECHO_REQUEST;
        frame[..6].fill(0xff);
        assert_eq!(h.process(&mut frame), Verdict::Reply);
        assert_eq!(frame, ECHO_REPLY);
    }

    #[test]
    fn incremental_icmp_checksum_equals_full_recompute() {
        let mut rng = XorShift(0x1234_5678_9abc_def1);
        let mut h = Harness::new();
        for _ in 0..500 {
            // Random ident, sequence and data of random length, valid checksum.
            let data_len = rng.below(64);
            let mut frame = ECHO_REQUEST[..42].to_vec();
            frame.resize(42 + data_len, 0);
            rng.fill(&mut frame[38..]);
            let frame = edit_ipv4(&frame, |ip| ip.set_total_len((28 + data_len) as u16));
            let mut frame = edit_icmp(&frame, |_| {});
            assert_eq!(h.process(&mut frame), Verdict::Reply);
            let mut message = icmp::Packet::new_unchecked(&mut frame[34..]);
            let incremental = message.checksum();
            message.fill_checksum();
            assert_eq!(incremental, message.checksum());
        }
    }

    #[test]
    fn every_drop_reason_that_process_can_give() {
        use DropReason::*;
        let mut h = Harness::new();

        // Ethernet.
        h.expect_drop(&ECHO_REQUEST[..13], Truncated);
        h.expect_drop(&QINQ_ECHO_REQUEST[..17], Truncated);
        let mut frame = ECHO_REQUEST;
        frame[6] = 0x01;
        h.expect_drop(&frame, BadSourceMac);
        frame[6..12].fill(0xff);
        h.expect_drop(&frame, BadSourceMac);
        let mut frame = ECHO_REQUEST;
        frame[5] = 0x0d;
        h.expect_drop(&frame, NotOurMac);
        frame[..6].copy_from_slice(&[0x01, 0x00, 0x5e, 0x00, 0x00, 0xfb]);
        h.expect_drop(&frame, NotOurMac);
        let mut frame = ECHO_REQUEST;
        frame[12..14].copy_from_slice(&[0x86, 0xdd]);
        h.expect_drop(&frame, UnsupportedProtocol);
        frame[12..14].copy_from_slice(&[0x88, 0xcc]); // LLDP
        h.expect_drop(&frame, UnknownEthertype);

        // ARP.
        h.expect_drop(&ARP_REQUEST[..14 + 27], Truncated);
        let mut frame = ARP_REQUEST;
        frame[15] = 6; // IEEE 802 hardware
        h.expect_drop(&frame, BadArp);
        let mut frame = ARP_REQUEST;
        frame[19] = 16; // protocol length of IPv6
        h.expect_drop(&frame, BadArp);
        let mut frame = ARP_REQUEST;
        frame[21] = 3; // RARP request
        h.expect_drop(&frame, BadArp);
        let mut frame = ARP_REQUEST;
        frame[41] = 3;
        h.expect_drop(&frame, ArpNotForUs);
        let mut frame = ARP_REPLY;
        frame[..6].copy_from_slice(&OUR_MAC);
        frame[6..12].copy_from_slice(&CLIENT_MAC.0);
        frame[38..42].copy_from_slice(&OUR_IP.octets());
        h.expect_drop(&frame, ArpReply);
        // A reply to our MAC for another host's address: not ours (nor the kernel's).
        frame[41] = 3;
        h.expect_drop(&frame, ArpNotForUs);

        // IPv4.
        h.expect_drop(&ECHO_REQUEST[..14 + 19], Truncated);
        h.expect_drop(&ECHO_REQUEST[..97], Truncated);
        h.expect_drop(
            &edit_ipv4(&ECHO_REQUEST, |ip| ip.set_total_len(99)),
            Truncated,
        );
        let mut frame = ECHO_REQUEST;
        frame[14] = 0x65;
        h.expect_drop(&frame, BadIpv4Header);
        h.expect_drop(
            &edit_ipv4(&ECHO_REQUEST, |ip| ip.set_total_len(19)),
            BadIpv4Header,
        );
        let mut frame = ECHO_REQUEST;
        frame[14] = 0x44; // IHL 4
        h.expect_drop(&frame, BadIpv4Header);
        let mut frame = ECHO_REQUEST;
        frame[24] ^= 0xff;
        h.expect_drop(&frame, BadIpv4Checksum);
        let to_other = edit_ipv4(&ECHO_REQUEST, |ip| {
            ip.set_dst_addr(Ipv4Addr::new(10, 0, 0, 3))
        });
        h.expect_drop(&to_other, NotLocal);
        let more_frags = edit_ipv4(&ECHO_REQUEST, |ip| ip.set_fragmentation(false, true, 0));
        h.expect_drop(&more_frags, Ipv4Fragment);
        let later_frag = edit_ipv4(&ECHO_REQUEST, |ip| ip.set_fragmentation(false, false, 64));
        h.expect_drop(&later_frag, Ipv4Fragment);
        let tcp = edit_ipv4(&ECHO_REQUEST, |ip| ip.set_protocol(IpProtocol::TCP));
        h.expect_drop(&tcp, UnsupportedProtocol);
        for martian in [
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::BROADCAST,
            Ipv4Addr::new(224, 0, 0, 1),
            Ipv4Addr::LOCALHOST,
        ] {
            let frame = edit_ipv4(&ECHO_REQUEST, |ip| ip.set_src_addr(martian));
            h.expect_drop(&frame, MartianSource);
        }

        // ICMP.
        let short = edit_ipv4(&ECHO_REQUEST[..14 + 20 + 7], |ip| ip.set_total_len(27));
        h.expect_drop(&short, Truncated);
        let mut frame = ECHO_REQUEST;
        frame[60] ^= 0x01;
        h.expect_drop(&frame, BadIcmpChecksum);
        let reply = edit_icmp(&ECHO_REQUEST, |m| m.set_msg_type(icmp::Message::ECHO_REPLY));
        h.expect_drop(&reply, IcmpNotEcho);
        let code1 = edit_icmp(&ECHO_REQUEST, |m| m.set_msg_code(1));
        h.expect_drop(&code1, IcmpNotEcho);

        assert_eq!(
            h.event(Event::ArpReplied) + h.event(Event::IcmpEchoReplied),
            0
        );
    }

    #[test]
    fn dropped_frames_are_left_untouched() {
        let mut h = Harness::new();
        let mut frame = ECHO_REQUEST;
        frame[60] ^= 0x01;
        let before = frame;
        assert_eq!(
            h.process(&mut frame),
            Verdict::Drop(DropReason::BadIcmpChecksum)
        );
        assert_eq!(frame, before);
    }

    #[test]
    fn responder_addresses() {
        let responder = LocalResponder::new(OUR_MAC, &[(OUR_IP, 24)]);
        assert_eq!(responder.mac(), MacAddr(OUR_MAC));
        assert_eq!(responder.addrs(), &[OUR_IP]);
        assert!(responder.is_local(OUR_IP) && !responder.is_local(CLIENT_IP));
        assert!(
            !responder.is_local(Ipv4Addr::UNSPECIFIED),
            "unused slots never match"
        );
        let full: Vec<_> = (0..16).map(|i| (Ipv4Addr::new(10, 1, 0, i), 24)).collect();
        assert_eq!(LocalResponder::new(OUR_MAC, &full).addrs().len(), 16);
    }

    #[test]
    #[should_panic(expected = "at most 16 local addresses")]
    fn too_many_addresses_panics() {
        let addrs: Vec<_> = (0..17).map(|i| (Ipv4Addr::new(10, 1, 0, i), 24)).collect();
        LocalResponder::new(OUR_MAC, &addrs);
    }

    /// Length up to which a fixture is essential (beyond it: Ethernet padding).
    fn essential_len(frame: &[u8]) -> usize {
        let l2 = ethernet::parse_l2(frame).unwrap();
        match l2.ethertype {
            EtherType::ARP => l2.l3_offset + arp::PACKET_LEN,
            _ => {
                l2.l3_offset
                    + ipv4::Packet::new_checked(&frame[l2.l3_offset..])
                        .unwrap()
                        .total_len() as usize
            }
        }
    }

    const VALID_FRAMES: [&[u8]; 5] = [
        &ARP_REQUEST,
        &VLAN_ARP_REQUEST,
        &ECHO_REQUEST,
        &QINQ_ECHO_REQUEST,
        &OPTIONS_ECHO_REQUEST,
    ];

    #[test]
    fn every_truncation_drops_as_truncated() {
        let mut h = Harness::new();
        for valid in VALID_FRAMES {
            let essential = essential_len(valid);
            for len in 0..=valid.len() {
                let mut copy = valid[..len].to_vec();
                let verdict = h.process(&mut copy);
                if len < essential {
                    assert_eq!(verdict, Verdict::Drop(DropReason::Truncated), "len {len}");
                } else {
                    assert_eq!(verdict, Verdict::Reply, "len {len}");
                }
            }
        }
    }

    #[test]
    fn never_panics_on_random_or_mutated_frames() {
        let mut rng = XorShift(0x0bad_5eed_0bad_5eed);
        let mut h = Harness::with_table(NeighbourTable::with_capacity(8));
        let mut buf = [0u8; 256];
        let mut replies = 0;
        // Pure noise: almost always dropped at the MAC checks.
        for _ in 0..3000 {
            let len = rng.below(buf.len() + 1);
            rng.fill(&mut buf[..len]);
            if let Verdict::Reply = h.process(&mut buf[..len]) {
                replies += 1;
            }
        }
        assert_eq!(replies, 0, "noise is never answered");
        // Noise behind a valid L2 header, to reach the ARP and IPv4 parsers.
        for _ in 0..3000 {
            let len = 14 + rng.below(buf.len() - 14 + 1);
            rng.fill(&mut buf[..len]);
            buf[..6].copy_from_slice(&OUR_MAC);
            buf[6] &= 0xfe;
            let ethertype: [u8; 2] = match rng.below(3) {
                0 => [0x08, 0x06],
                1 => [0x08, 0x00],
                _ => [0x81, 0x00],
            };
            buf[12..14].copy_from_slice(&ethertype);
            if let Verdict::Reply = h.process(&mut buf[..len]) {
                replies += 1;
            }
        }
        // Valid frames with a few random bytes changed: the deepest paths.
        for _ in 0..5000 {
            let valid = VALID_FRAMES[rng.below(VALID_FRAMES.len())];
            let mut copy = valid.to_vec();
            for _ in 0..1 + rng.below(4) {
                let at = rng.below(copy.len());
                copy[at] = rng.next_u64() as u8;
            }
            let cut = if rng.below(4) == 0 {
                rng.below(copy.len() + 1)
            } else {
                copy.len()
            };
            if h.process(&mut copy[..cut]) == Verdict::Reply {
                // Whatever got through was answered from us, back to a unicast peer.
                let eth = ethernet::Frame::new_checked(&copy[..cut]).unwrap();
                assert_eq!(eth.src_addr(), MacAddr(OUR_MAC));
                assert!(eth.dst_addr().is_unicast());
                replies += 1;
            }
        }
        assert!(replies > 100, "mutations must still reach the reply paths");
    }

    mod ipv6_responder {
        //! Neighbor Discovery and ICMPv6 echo. Frames built with scapy 2.5.0 (our MAC
        //! 00:1b:21:0a:0b:0c, client MAC 52:54:00:12:34:56, our address 2001:db8::1,
        //! the client 2001:db8::a), every checksum and length scapy's.
        use super::*;
        use crate::dataplane::neighbour::Neighbour6Table;
        use crate::flow::parse::classify;

        const OUR_IP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1);
        const CLIENT_IP6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0xa);

        // NS: who has 2001:db8::1, from 2001:db8::a (SLLAO), to the solicited-node group
        static NS: [u8; 86] = [
            0x33, 0x33, 0xff, 0x00, 0x00, 0x01, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x86, 0xdd,
            0x60, 0x00, 0x00, 0x00, 0x00, 0x20, 0x3a, 0xff, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0a, 0xff, 0x02, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0xff, 0x00, 0x00, 0x01, 0x87, 0x00,
            0x97, 0x64, 0x00, 0x00, 0x00, 0x00, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x01, 0x01, 0x52, 0x54, 0x00, 0x12,
            0x34, 0x56,
        ];
        // NA: its answer: solicited, override, target link-layer address ours
        static NA: [u8; 86] = [
            0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x86, 0xdd,
            0x60, 0x00, 0x00, 0x00, 0x00, 0x20, 0x3a, 0xff, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x20, 0x01, 0x0d, 0xb8,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0a, 0x88, 0x00,
            0x60, 0x3b, 0x60, 0x00, 0x00, 0x00, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x02, 0x01, 0x00, 0x1b, 0x21, 0x0a,
            0x0b, 0x0c,
        ];
        // DAD_NS: duplicate address probe for 2001:db8::1 from ::
        static DAD_NS: [u8; 78] = [
            0x33, 0x33, 0xff, 0x00, 0x00, 0x01, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x86, 0xdd,
            0x60, 0x00, 0x00, 0x00, 0x00, 0x18, 0x3a, 0xff, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0xff, 0x02, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0xff, 0x00, 0x00, 0x01, 0x87, 0x00,
            0x4c, 0xed, 0x00, 0x00, 0x00, 0x00, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01,
        ];
        // DAD_NA: its answer to all nodes, not solicited
        static DAD_NA: [u8; 86] = [
            0x33, 0x33, 0x00, 0x00, 0x00, 0x01, 0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x86, 0xdd,
            0x60, 0x00, 0x00, 0x00, 0x00, 0x20, 0x3a, 0xff, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0xff, 0x02, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x88, 0x00,
            0xce, 0xfa, 0x20, 0x00, 0x00, 0x00, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x02, 0x01, 0x00, 0x1b, 0x21, 0x0a,
            0x0b, 0x0c,
        ];
        // ECHO6: ping -6 2001:db8::1 from 2001:db8::a, hop limit 61, 16 bytes of data
        static ECHO6: [u8; 78] = [
            0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x86, 0xdd,
            0x60, 0x00, 0x00, 0x00, 0x00, 0x18, 0x3a, 0x3d, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0a, 0x20, 0x01, 0x0d, 0xb8,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x80, 0x00,
            0xd9, 0xb4, 0x12, 0x34, 0x00, 0x07, 0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07,
            0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f,
        ];
        // ECHO6_REPLY: its reply, hop limit 64
        static ECHO6_REPLY: [u8; 78] = [
            0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x86, 0xdd,
            0x60, 0x00, 0x00, 0x00, 0x00, 0x18, 0x3a, 0x40, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x20, 0x01, 0x0d, 0xb8,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0a, 0x81, 0x00,
            0xd8, 0xb4, 0x12, 0x34, 0x00, 0x07, 0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x06, 0x07,
            0x08, 0x09, 0x0a, 0x0b, 0x0c, 0x0d, 0x0e, 0x0f,
        ];
        // UNSOL_NA: unsolicited advertisement of 2001:db8::a at 52:54:00:aa:bb:cc to all nodes
        static UNSOL_NA: [u8; 86] = [
            0x33, 0x33, 0x00, 0x00, 0x00, 0x01, 0x52, 0x54, 0x00, 0xaa, 0xbb, 0xcc, 0x86, 0xdd,
            0x60, 0x00, 0x00, 0x00, 0x00, 0x20, 0x3a, 0xff, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0a, 0xff, 0x02, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x88, 0x00,
            0xec, 0x4e, 0x20, 0x00, 0x00, 0x00, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0a, 0x02, 0x01, 0x52, 0x54, 0x00, 0xaa,
            0xbb, 0xcc,
        ];
        // UDP6: UDP 2001:db8::a:5353 -> 2001:db8::99:53 to our MAC
        static UDP6: [u8; 67] = [
            0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x86, 0xdd,
            0x60, 0x00, 0x00, 0x00, 0x00, 0x0d, 0x11, 0x40, 0x20, 0x01, 0x0d, 0xb8, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x0a, 0x20, 0x01, 0x0d, 0xb8,
            0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x99, 0x14, 0xe9,
            0x00, 0x35, 0x00, 0x0d, 0x3e, 0xb9, 0x71, 0x75, 0x65, 0x72, 0x79,
        ];

        struct Harness6 {
            responder: LocalResponder,
            neighbours: Neighbour6Table,
            counters: WorkerCounters,
            vips6: Vec<Ipv6Addr>,
            real_servers6: Vec<Ipv6Addr>,
        }

        impl Harness6 {
            fn new() -> Harness6 {
                Harness6::with_table(Neighbour6Table::with_capacity(16))
            }

            fn with_table(neighbours: Neighbour6Table) -> Harness6 {
                Harness6 {
                    responder: LocalResponder::new(OUR_MAC, &[(OUR_IP, 24)]).with_ipv6(&[OUR_IP6]),
                    neighbours,
                    counters: WorkerCounters::default(),
                    vips6: Vec::new(),
                    real_servers6: Vec::new(),
                }
            }

            /// Classifies `frame` and hands it to the responder in a buffer with
            /// room after it, as an mbuf has; the reply (or the drop reason).
            fn process(&mut self, frame: &[u8]) -> Result<Vec<u8>, DropReason> {
                let parsed = classify(frame)?;
                let mut buf = frame.to_vec();
                buf.resize(frame.len() + 128, 0xee);
                let len = self.responder.process_ipv6(
                    &mut buf,
                    &parsed,
                    &mut self.neighbours,
                    1000,
                    &self.counters,
                    Known6 {
                        vips6: &self.vips6,
                        real_servers6: &self.real_servers6,
                    },
                )?;
                buf.truncate(len);
                Ok(buf)
            }

            fn expect_drop(&mut self, frame: &[u8], reason: DropReason) {
                assert_eq!(self.process(frame), Err(reason), "{frame:02x?}");
            }

            fn event(&self, event: Event) -> u64 {
                self.counters.events_snapshot()[event as usize]
            }
        }

        /// Edits an untagged frame's ICMPv6 message (right after the fixed header)
        /// and fixes its checksum.
        fn edit_icmpv6(frame: &[u8], edit: impl FnOnce(&mut icmpv6::Packet<&mut [u8]>)) -> Vec<u8> {
            let mut copy = frame.to_vec();
            let ip = ipv6::Packet::new_checked(&copy[14..]).unwrap();
            let (src, dst, end) = (ip.src_addr(), ip.dst_addr(), 54 + ip.payload_len() as usize);
            let mut message = icmpv6::Packet::new_unchecked(&mut copy[54..end]);
            edit(&mut message);
            message.fill_checksum(src, dst);
            copy
        }

        #[test]
        fn solicitation_is_answered_and_solicitor_learned() {
            let mut h = Harness6::new();
            assert_eq!(h.process(&NS).unwrap(), NA);
            assert_eq!(h.neighbours.lookup(CLIENT_IP6), Some(CLIENT_MAC));
            assert_eq!(h.event(Event::NdAnswered), 1);
            assert_eq!(h.event(Event::Neighbour6Learned), 1);
            // Asked again: answered again, the entry only refreshed.
            assert_eq!(h.process(&NS).unwrap(), NA);
            assert_eq!(h.event(Event::Neighbour6Learned), 1);
            assert!(h.neighbours_v4_untouched());
        }

        #[test]
        fn solicitation_for_a_vip_is_answered_while_serving_it() {
            // A responder without IPv6 addresses of its own, OUR_IP6 as a VIP: the
            // same advertisement as for an own address; not a VIP: not answered.
            let mut h = Harness6::new();
            h.responder = LocalResponder::new(OUR_MAC, &[(OUR_IP, 24)]);
            assert!(h.process(&NS).is_err());
            h.vips6 = vec![OUR_IP6];
            assert_eq!(h.process(&NS).unwrap(), NA);
            assert_eq!(h.event(Event::NdAnswered), 1);
        }

        impl Harness6 {
            /// IPv6 never counts as IPv4 neighbour learning.
            fn neighbours_v4_untouched(&self) -> bool {
                self.event(Event::NeighbourLearned) == 0
            }
        }

        #[test]
        fn unicast_reachability_probe_is_answered_to_its_sender() {
            // Linux confirms reachability with a unicast solicitation to our MAC and
            // address; without a source link-layer address option the answer goes
            // to the frame's sender.
            let mut h = Harness6::new();
            let mut probe = NS[..78].to_vec();
            probe[..6].copy_from_slice(&OUR_MAC);
            probe[18..20].copy_from_slice(&24u16.to_be_bytes());
            probe[38..54].copy_from_slice(&OUR_IP6.octets());
            let probe = edit_icmpv6(&probe, |_| {});
            assert_eq!(h.process(&probe).unwrap(), NA);
            assert!(
                h.neighbours.is_empty(),
                "nothing learned without the option"
            );
        }

        #[test]
        fn duplicate_address_probe_is_defended_to_all_nodes() {
            let mut h = Harness6::new();
            let reply = h.process(&DAD_NS).unwrap();
            assert_eq!(
                reply, DAD_NA,
                "longer than the probe: uses the room after it"
            );
            assert_eq!(h.event(Event::NdDadDefended), 1);
            assert_eq!(h.event(Event::NdAnswered), 0);
            assert!(h.neighbours.is_empty());
        }

        #[test]
        fn echo_request_becomes_exact_reply() {
            let mut h = Harness6::new();
            assert_eq!(h.process(&ECHO6).unwrap(), ECHO6_REPLY);
            assert_eq!(h.event(Event::IcmpV6EchoReplied), 1);
            assert_eq!(h.event(Event::IcmpEchoReplied), 0);
        }

        #[test]
        fn advertisement_refreshes_known_neighbours_only() {
            let mut h = Harness6::new();
            h.expect_drop(&UNSOL_NA, DropReason::NdiscAdvert);
            assert!(
                h.neighbours.is_empty(),
                "no entry created from an advertisement"
            );
            h.neighbours.learn(CLIENT_IP6, CLIENT_MAC, 0);
            // Without the Override flag another address does not replace the known one.
            let mut no_override = UNSOL_NA.to_vec();
            let src = Ipv6Addr::from(<[u8; 16]>::try_from(&no_override[22..38]).unwrap());
            let dst = Ipv6Addr::from(<[u8; 16]>::try_from(&no_override[38..54]).unwrap());
            let mut na = icmpv6::Packet::new_unchecked(&mut no_override[54..]);
            assert!(na.na_flags().contains(icmpv6::NaFlags::OVERRIDE));
            na.set_na_flags(icmpv6::NaFlags(0));
            na.fill_checksum(src, dst);
            h.expect_drop(&no_override, DropReason::NdiscAdvert);
            assert_eq!(h.neighbours.lookup(CLIENT_IP6), Some(CLIENT_MAC));
            // With it, the advertised address replaces it.
            h.expect_drop(&UNSOL_NA, DropReason::NdiscAdvert);
            assert_eq!(
                h.neighbours.lookup(CLIENT_IP6),
                Some(MacAddr([0x52, 0x54, 0x00, 0xaa, 0xbb, 0xcc]))
            );
        }

        /// A static IPv6 neighbour keeps its MAC against an advertisement with
        /// Override, and against a solicitation from its address.
        #[test]
        fn neighbor_discovery_never_moves_a_static_neighbour() {
            let mut h = Harness6::new();
            let pinned = MacAddr([2, 0, 0, 0, 0, 0x42]);
            assert!(h.neighbours.pin(CLIENT_IP6, pinned));
            h.expect_drop(&UNSOL_NA, DropReason::NdiscAdvert);
            assert_eq!(h.neighbours.lookup(CLIENT_IP6), Some(pinned));
            let _ = h.process(&ns_from(CLIENT_IP6));
            assert_eq!(h.neighbours.lookup(CLIENT_IP6), Some(pinned));
        }

        /// `NS` (a solicitation for our address with a source link-layer option)
        /// sent from `src`, its checksum made again.
        fn ns_from(src: Ipv6Addr) -> Vec<u8> {
            let mut frame = NS.to_vec();
            frame[22..38].copy_from_slice(&src.octets());
            let dst = Ipv6Addr::from(<[u8; 16]>::try_from(&frame[38..54]).unwrap());
            icmpv6::Packet::new_unchecked(&mut frame[54..]).fill_checksum(src, dst);
            frame
        }

        /// Solicitors made up by the thousand take three quarters of the table at
        /// most: the last quarter stays for real servers, whose solicitations (and
        /// answers to ours) are still learned.
        #[test]
        fn made_up_solicitors_leave_a_quarter_for_real_servers() {
            let mut h = Harness6::with_table(Neighbour6Table::with_capacity(16));
            let real_servers: Vec<Ipv6Addr> = (0..4u16)
                .map(|i| Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 0x10 + i))
                .collect();
            h.real_servers6 = real_servers.clone();
            for i in 0..1000u16 {
                let made_up = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0x99, i);
                assert_eq!(h.process(&ns_from(made_up)).map(|_| ()), Ok(()), "{i}");
            }
            assert_eq!(h.neighbours.len(), 12);
            assert_eq!(h.event(Event::Neighbour6Learned), 12);
            assert_eq!(h.event(Event::Neighbour6TableFull), 1000 - 12);
            for &rs in &real_servers {
                assert_eq!(h.process(&ns_from(rs)).map(|_| ()), Ok(()));
                assert_eq!(h.neighbours.lookup(rs), Some(CLIENT_MAC), "{rs}");
            }
            assert_eq!(h.neighbours.len(), 16);
        }

        /// A solicited advertisement sent to our address (the answer to one of our
        /// solicitations) for `target`, from `UNSOL_NA`.
        fn solicited_na_for(target: Ipv6Addr) -> Vec<u8> {
            let mut frame = UNSOL_NA.to_vec();
            frame[..6].copy_from_slice(&OUR_MAC);
            frame[38..54].copy_from_slice(&OUR_IP6.octets());
            let src = Ipv6Addr::from(<[u8; 16]>::try_from(&frame[22..38]).unwrap());
            let mut na = icmpv6::Packet::new_unchecked(&mut frame[54..]);
            na.set_na_flags(icmpv6::NaFlags::SOLICITED);
            na.set_target_addr(target);
            na.fill_checksum(src, OUR_IP6);
            frame
        }

        /// An answer to our solicitation replaces a known address even without the
        /// Override flag (a recheck's answer must be able to correct an entry), where
        /// an unsolicited advertisement without it does not.
        #[test]
        fn an_answer_without_override_still_corrects_an_entry() {
            let mut h = Harness6::new();
            let target = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 0x10);
            h.neighbours.learn(target, CLIENT_MAC, 0);
            let answer = solicited_na_for(target);
            let flags = icmpv6::Packet::new_unchecked(&answer[54..]).na_flags();
            assert!(!flags.contains(icmpv6::NaFlags::OVERRIDE));
            h.expect_drop(&answer, DropReason::NdiscAdvert);
            assert_eq!(
                h.neighbours.lookup(target),
                Some(MacAddr([0x52, 0x54, 0x00, 0xaa, 0xbb, 0xcc]))
            );
        }

        /// Answers to our solicitations obey the same reserve: once three quarters
        /// are taken, only a real server's answer makes a new entry.
        #[test]
        fn solicited_advertisements_leave_the_reserve_to_real_servers() {
            let mut h = Harness6::with_table(Neighbour6Table::with_capacity(16));
            let real_server = Ipv6Addr::new(0x2001, 0xdb8, 1, 0, 0, 0, 0, 0x10);
            h.real_servers6 = vec![real_server];
            for i in 0..12u16 {
                let other = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0x98, i);
                h.expect_drop(&solicited_na_for(other), DropReason::NdiscAdvert);
                assert!(h.neighbours.lookup(other).is_some(), "{other}");
            }
            let one_more = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0x98, 12);
            h.expect_drop(&solicited_na_for(one_more), DropReason::NdiscAdvert);
            assert_eq!(h.neighbours.lookup(one_more), None);
            assert_eq!(h.event(Event::Neighbour6TableFull), 1);
            h.expect_drop(&solicited_na_for(real_server), DropReason::NdiscAdvert);
            assert!(h.neighbours.lookup(real_server).is_some());
            assert_eq!(h.neighbours.len(), 13);
        }

        #[test]
        fn full_neighbour6_table_is_counted_and_still_answered() {
            let mut h = Harness6::with_table(Neighbour6Table::with_capacity(1));
            h.neighbours
                .learn("2001:db8::77".parse().unwrap(), CLIENT_MAC, 0);
            assert_eq!(h.process(&NS).unwrap(), NA);
            assert_eq!(h.event(Event::Neighbour6TableFull), 1);
            assert_eq!(h.neighbours.lookup(CLIENT_IP6), None);
        }

        #[test]
        fn every_drop_reason_that_process_ipv6_can_give() {
            use DropReason::*;
            let mut h = Harness6::new();

            // Not ours: another unicast address, a group we do not listen to.
            let mut frame = ECHO6;
            frame[53] = 0x99;
            h.expect_drop(&edit_icmpv6(&frame, |_| {}), NotLocal);
            h.expect_drop(&UDP6, Ipv6NoService);
            let mut other_group = NS;
            other_group[2..6].copy_from_slice(&[0xff, 0x12, 0x34, 0x56]);
            other_group[51..54].copy_from_slice(&[0x12, 0x34, 0x56]);
            h.expect_drop(&edit_icmpv6(&other_group, |_| {}), Ipv6GroupNotJoined);
            // The link's chatter, as a promiscuous port sees it (what Linux sends when
            // an interface comes up): an MLDv2 report to all MLDv2 routers, a router
            // solicitation to all routers. Neither is for a load balancer.
            for (group, mac, msg_type) in [
                ("ff02::16", [0x33, 0x33, 0, 0, 0, 0x16], 143),
                ("ff02::2", [0x33, 0x33, 0, 0, 0, 0x02], 133),
            ] {
                let mut chatter = ECHO6;
                chatter[..6].copy_from_slice(&mac);
                chatter[38..54].copy_from_slice(&group.parse::<Ipv6Addr>().unwrap().octets());
                let chatter = edit_icmpv6(&chatter, |m| m.set_msg_type(icmpv6::Message(msg_type)));
                h.expect_drop(&chatter, Ipv6GroupNotJoined);
            }
            // A group frame under another group's MAC, a unicast one to a group MAC.
            let mut wrong_mac = NS;
            wrong_mac[5] = 0x02;
            h.expect_drop(&wrong_mac, NotOurMac);
            let mut to_group_mac = ECHO6;
            to_group_mac[..6].copy_from_slice(&[0x33, 0x33, 0xff, 0, 0, 1]);
            h.expect_drop(&to_group_mac, NotOurMac);
            // UDP to our own address: no IPv6 service on the appliance itself.
            let mut udp_to_us = UDP6;
            udp_to_us[38..54].copy_from_slice(&OUR_IP6.octets());
            h.expect_drop(&udp_to_us, UnsupportedProtocol);

            // Neighbor Discovery.
            let mut hop = NS;
            hop[21] = 64;
            h.expect_drop(&hop, NdiscHopLimit);
            let mut bad_sum = NS;
            bad_sum[57] ^= 0x01;
            h.expect_drop(&bad_sum, BadIcmpv6Checksum);
            h.expect_drop(&edit_icmpv6(&NS, |m| m.set_msg_code(1)), NdiscMalformed);
            let mut short = NS[..14 + 40 + 20].to_vec();
            short[18..20].copy_from_slice(&20u16.to_be_bytes());
            h.expect_drop(&edit_icmpv6(&short, |_| {}), NdiscTruncated);
            let rs = edit_icmpv6(&NS, |m| m.set_msg_type(icmpv6::Message::ROUTER_SOLICIT));
            h.expect_drop(&rs, NdiscUnsupported);
            let not_ours =
                edit_icmpv6(&NS, |m| m.set_target_addr("2001:db8:1::1".parse().unwrap()));
            h.expect_drop(&not_ours, NdiscNotForUs);
            assert!(h.neighbours.is_empty(), "strangers are not inserted");
            let group_lladdr = edit_icmpv6(&NS, |m| {
                let data = m.data_mut();
                let n = data.len();
                data[n - 6] = 0x01;
            });
            h.expect_drop(&group_lladdr, NdiscMalformed);
            // The same solicitation as an atomic fragment (offset 0, no more): the
            // ICMPv6 checksum still holds (its pseudo-header counts the ICMPv6 length).
            let mut atomic = NS[..54].to_vec();
            atomic[20] = 44;
            let len = u16::from_be_bytes([atomic[18], atomic[19]]) + 8;
            atomic[18..20].copy_from_slice(&len.to_be_bytes());
            atomic.extend_from_slice(&[58, 0, 0, 0, 0x12, 0x34, 0x56, 0x78]);
            atomic.extend_from_slice(&NS[54..]);
            h.expect_drop(&atomic, NdiscMalformed);
            assert!(h.neighbours.is_empty(), "nor is a fragment's sender");

            // Echo.
            let mut bad_sum = ECHO6;
            bad_sum[60] ^= 0x01;
            h.expect_drop(&bad_sum, BadIcmpv6Checksum);
            let reply = edit_icmpv6(&ECHO6, |m| m.set_msg_type(icmpv6::Message::ECHO_REPLY));
            h.expect_drop(&reply, IcmpNotEcho);
            let unreachable = edit_icmpv6(&ECHO6, |m| {
                m.set_msg_type(icmpv6::Message::DEST_UNREACHABLE)
            });
            h.expect_drop(&unreachable, IcmpErrorNoSession);
            let mut from_loopback = ECHO6;
            from_loopback[22..38].copy_from_slice(&Ipv6Addr::LOCALHOST.octets());
            h.expect_drop(&edit_icmpv6(&from_loopback, |_| {}), MartianSource);
            let mut unspecified = ECHO6;
            unspecified[22..38].fill(0);
            h.expect_drop(&edit_icmpv6(&unspecified, |_| {}), MartianSource);
            let mut to_all_nodes = ECHO6;
            to_all_nodes[..6].copy_from_slice(&[0x33, 0x33, 0, 0, 0, 1]);
            to_all_nodes[38..54].copy_from_slice(&ipv6::ALL_NODES.octets());
            h.expect_drop(&edit_icmpv6(&to_all_nodes, |_| {}), NotLocal);
            let mut group_src_mac = ECHO6;
            group_src_mac[6] = 0x01;
            h.expect_drop(&group_src_mac, BadSourceMac);

            assert_eq!(
                h.event(Event::NdAnswered)
                    + h.event(Event::NdDadDefended)
                    + h.event(Event::IcmpV6EchoReplied),
                0
            );
        }

        #[test]
        fn without_ipv6_addresses_nothing_is_answered() {
            let mut h = Harness6::new();
            h.responder = LocalResponder::new(OUR_MAC, &[(OUR_IP, 24)]);
            h.expect_drop(&NS, DropReason::Ipv6GroupNotJoined);
            h.expect_drop(&ECHO6, DropReason::NotLocal);
        }

        #[test]
        fn a_parsed_of_another_frame_gives_an_error_not_a_panic() {
            let mut h = Harness6::new();
            let parsed = classify(&ECHO6).unwrap();
            for len in 0..ECHO6.len() {
                let mut buf = ECHO6[..len].to_vec();
                let got = h.responder.process_ipv6(
                    &mut buf,
                    &parsed,
                    &mut h.neighbours,
                    0,
                    &h.counters,
                    Known6::default(),
                );
                assert!(got.is_err(), "len {len}");
            }
        }

        #[test]
        fn never_panics_on_mutated_frames() {
            let mut rng = XorShift(0x6666_0bad_5eed_0006);
            let mut h = Harness6::with_table(Neighbour6Table::with_capacity(8));
            let valid: [&[u8]; 5] = [&NS, &DAD_NS, &ECHO6, &UNSOL_NA, &UDP6];
            let mut replies = 0;
            for _ in 0..20_000 {
                let mut copy = valid[rng.below(valid.len())].to_vec();
                for _ in 0..1 + rng.below(3) {
                    let at = rng.below(copy.len());
                    copy[at] = rng.next_u64() as u8;
                }
                let cut = copy.len() - rng.below(4).min(copy.len());
                if let Ok(reply) = h.process(&copy[..cut]) {
                    let eth = ethernet::Frame::new_checked(&reply[..]).unwrap();
                    assert_eq!(eth.src_addr(), MacAddr(OUR_MAC));
                    replies += 1;
                }
            }
            assert!(replies > 100, "mutations must still reach the reply paths");
        }
    }
}
