//! Why the data plane dropped a frame: one reason per drop, counted per worker.

/// Why a frame was dropped. Every drop in the data plane has exactly one reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum DropReason {
    /// Shorter than the header it claims to carry (Ethernet, VLAN, ARP, IPv4, ICMP,
    /// IPv6, ICMPv6).
    Truncated,
    /// An EtherType Sluice does not handle (anything but IPv4, ARP and IPv6).
    UnknownEthertype,
    /// IPv6 TCP or UDP to an address that is not the appliance's: there are no IPv6
    /// services yet.
    Ipv6NoService,
    /// IPv4 header inconsistent: version, IHL, total length.
    BadIpv4Header,
    /// IPv4 header checksum wrong.
    BadIpv4Checksum,
    /// IPv4 fragment (non-first or more-fragments set) addressed to us.
    Ipv4Fragment,
    /// IPv4 or IPv6 packet whose destination is not one of the appliance's addresses;
    /// for IPv6, also an echo request to a group it listens to (not answered: one
    /// request, many replies).
    NotLocal,
    /// IPv4 or IPv6 protocol with no handler (for the appliance's own addresses).
    UnsupportedProtocol,
    /// ARP that is not Ethernet/IPv4, or has bad lengths.
    BadArp,
    /// ARP request or reply for an address that is not ours (a known sender is
    /// refreshed from it; nothing is answered).
    ArpNotForUs,
    /// ARP reply for one of our addresses (learned from, nothing to send back; with an
    /// exception path, the kernel's).
    ArpReply,
    /// ICMP or ICMPv6 message (not an error, not Neighbor Discovery) other than echo
    /// request.
    IcmpNotEcho,
    /// ICMP checksum wrong.
    BadIcmpChecksum,
    /// Frame with a source MAC that is multicast or broadcast.
    BadSourceMac,
    /// Frame addressed to another station's unicast MAC.
    NotOurMac,
    /// TX queue full: the frame could not be transmitted.
    TxFull,
    /// IPv4 header with options on a forwarded packet (not supported, as in Katran).
    Ipv4Options,
    /// TCP header shorter than 20 bytes or data offset past the end of the packet.
    BadTcpHeader,
    /// UDP length field below 8 or past the end of the packet.
    BadUdpHeader,
    /// TCP segment without SYN and without a session (IPVS drops these too).
    TcpNoSession,
    /// Packet to a service port that has no session and no usable real server.
    NoRealServer,
    /// The worker's session table is full: the new connection is refused.
    SessionTableFull,
    /// The next hop's MAC is not known yet (an ARP request has been sent).
    NeighbourUnresolved,
    /// Packet to a VIP on a port or protocol without a virtual service.
    NoService,
    /// Packet would exceed the MTU after encapsulation (ICMP frag-needed sent when DF).
    TooBig,
    /// ICMP error quoting a packet of no known session.
    IcmpErrorNoSession,
    /// ICMP error not addressed to the source of the packet it quotes, which is where
    /// every sender of an error addresses it: forged, it would have been forwarded to
    /// an address of the sender's choosing.
    IcmpErrorMisaddressed,
    /// A frag-needed (ICMP) or Packet Too Big (ICMPv6) from the client's side about a
    /// UDP datagram of a NAT, FullNAT or NAT64 real server. Passed on, it would lower
    /// the server's path MTU (no sequence number to check, so anyone with a session,
    /// or a spoofed datagram that made one, could), and the server would then send
    /// its larger UDP replies in fragments, which Sluice does not forward.
    IcmpTooBigAboutUdp,
    /// NAT: the real-server side tuple (RIP:rport <-> client:cport) is taken by another
    /// session (the same client port through another VIP to the same real server); the
    /// real server could not tell the two connections apart, so the new one is refused.
    NatTupleInUse,
    /// FullNAT: no local address/port left for this worker towards that real server
    /// (or the service has no local address yet).
    LaddrExhausted,
    /// Multi-worker: the packet belongs to another worker's session and that worker's
    /// redirect ring is full.
    RedirectRingFull,
    /// A health probe's answer could not be handed to the management core (its ring
    /// is full); the probe times out.
    HealthRingFull,
    /// A VRRP advertisement could not be handed to the management core (its own ring
    /// is full).
    VrrpRingFull,
    /// A new connection from a source the service's access list denies.
    AclDenied,
    /// A new connection over the service's per-source rate limit.
    RateLimited,
    /// SYN proxy: a client segment waited for its real server's handshake longer than
    /// the hold time (the server never answered).
    ServerUnanswered,
    /// SYN proxy: a segment of a connection its client reset before the real server
    /// answered (a client segment that waited for the server, the server's late
    /// SYN-ACK, anything after).
    ClientReset,
    /// SYN proxy: a reset for a connection still waiting for its real server, at a
    /// sequence number its client cannot have reached or acknowledging something
    /// other than the cookie (an off-path guess).
    ResetOutOfWindow,
    /// IPv6 header inconsistent: version, a payload length past the frame; or TCP/UDP
    /// from or to an IPv4-mapped address (`::ffff:0:0/96`).
    BadIpv6Header,
    /// IPv6 fragment: a non-first one, or a first one with more to come (an atomic
    /// fragment, RFC 6946, is whole and goes on).
    Ipv6Fragment,
    /// More IPv6 extension headers than the walk crosses (six).
    Ipv6TooManyExtHeaders,
    /// An IPv6 extension header runs past the end of the packet.
    Ipv6ExtHeaderTruncated,
    /// A hop-by-hop options header anywhere but first.
    Ipv6HopByHopNotFirst,
    /// An IPv6 option whose type says to discard the packet when not recognised
    /// (jumbo payload included).
    Ipv6UnrecognizedOption,
    /// An IPv6 option that runs past the end of its options header.
    Ipv6MalformedOption,
    /// An IPv6 routing header with segments left: the packet is not for this hop.
    Ipv6RoutingHeader,
    /// Neighbor Discovery with a hop limit other than 255: maybe from off the link.
    NdiscHopLimit,
    /// Neighbor Discovery message shorter than its fixed part.
    NdiscTruncated,
    /// Neighbor Discovery message breaking a rule of RFC 4861 (code, options,
    /// multicast target, a duplicate address probe to the wrong group, ...) or
    /// RFC 6980 (a fragment header, an atomic fragment's included).
    NdiscMalformed,
    /// Router solicitation, router advertisement or redirect: Sluice neither answers
    /// nor follows them.
    NdiscUnsupported,
    /// Neighbor Solicitation for an address that is not ours (a known sender is
    /// refreshed from it, not answered).
    NdiscNotForUs,
    /// Neighbor Advertisement (a known neighbour is refreshed from it, nothing to send
    /// back).
    NdiscAdvert,
    /// ICMPv6 checksum wrong (echo request, Neighbor Discovery, or an error about a
    /// session).
    BadIcmpv6Checksum,
    /// An ICMP error about a NAT64 session whose type or code RFC 7915 does not
    /// translate between ICMPv4 and ICMPv6 (source route failed to a host precedence
    /// violation, a parameter problem pointing at a field the other IP lacks, ...).
    IcmpUntranslatable,
    /// IPv6 multicast to a group Sluice does not listen to: the chatter of other hosts
    /// on the link, which a port in promiscuous mode sees (MLD reports to ff02::16,
    /// router solicitations to ff02::2, duplicate address probes and solicitations to
    /// other hosts' solicited-node groups). Sluice is neither a router nor an MLD
    /// querier.
    Ipv6GroupNotJoined,
    /// A frame for the kernel interface of the exception path over the port's punt
    /// rate limit (`[ports.exception] rate`, this worker's share).
    ExceptionRateLimited,
    /// A frame for the kernel interface of the exception path found the port's
    /// general ring full (the management core is behind, a flood outruns its writes
    /// to the interface). Control frames have a ring of their own:
    /// [`DropReason::ExceptionControlRingFull`].
    ExceptionRingFull,
    /// To the health checker's probe ports from an address that is no real server's,
    /// to the sync listen address (`[sync] port`) from one that is no peer's, or a
    /// VRRP advert from an address not in `[vrrp] peers` (or, to a port address, with
    /// a TTL other than 255: routed, not from the link): kept off the rings that carry
    /// the probes' answers and the VRRP adverts up.
    NotAPeer,
    /// TCP to the health checker's probe ports from a real server's address that
    /// answers no probe in flight: its acknowledgement number is not in the span of
    /// the last probe sent from that port (`dataplane::probe_acks`), or it has no
    /// ACK. A forger's (the probe's sequence numbers cannot be worked out), or a late
    /// answer to an earlier probe from the same port; kept off the ring the probes'
    /// answers share.
    NotAProbeAnswer,
    /// A source address no single host sends from (`wire::ipv4::is_martian_source`,
    /// `wire::ipv6::is_martian_source`: "this network", loopback, multicast, the
    /// limited broadcast, IPv6's unspecified address), on an echo request, an ICMP
    /// error or a new connection; or, for a new connection, an address of the
    /// appliance's own (its port's, a VIP, a local address), whose session would send
    /// the real server's answers to ourselves. Forged or misrouted, never malformed.
    MartianSource,
    /// A peer's sync datagram the management core's sync ring had no room for (it
    /// falls behind, or a flood forged from a peer's address fills it).
    SyncRingFull,
    /// A frame the kernel wrote to a port's exception interface whose source MAC or
    /// address is not the port's own (the kernel forwarding between its interfaces, a
    /// program on the host forging): never sent out of the port.
    ExceptionForeignSource,
    /// A control frame for the kernel (BGP or BFD with TTL 255, an ARP reply, IPv6
    /// neighbour discovery: `dataplane::exception::Punt::Control`) found the port's
    /// control ring full. Its budget lets at most 1,000 a second in (bursts of 100)
    /// and the management core empties it first every tick, so its 255 frames fill
    /// only when the management core has not run for about 0.15 s: stalled, not
    /// flooded.
    ExceptionControlRingFull,
}

impl DropReason {
    pub const COUNT: usize = 63;
    pub const ALL: [DropReason; Self::COUNT] = [
        DropReason::Truncated,
        DropReason::UnknownEthertype,
        DropReason::Ipv6NoService,
        DropReason::BadIpv4Header,
        DropReason::BadIpv4Checksum,
        DropReason::Ipv4Fragment,
        DropReason::NotLocal,
        DropReason::UnsupportedProtocol,
        DropReason::BadArp,
        DropReason::ArpNotForUs,
        DropReason::ArpReply,
        DropReason::IcmpNotEcho,
        DropReason::BadIcmpChecksum,
        DropReason::BadSourceMac,
        DropReason::NotOurMac,
        DropReason::TxFull,
        DropReason::Ipv4Options,
        DropReason::BadTcpHeader,
        DropReason::BadUdpHeader,
        DropReason::TcpNoSession,
        DropReason::NoRealServer,
        DropReason::SessionTableFull,
        DropReason::NeighbourUnresolved,
        DropReason::NoService,
        DropReason::TooBig,
        DropReason::IcmpErrorNoSession,
        DropReason::IcmpErrorMisaddressed,
        DropReason::IcmpTooBigAboutUdp,
        DropReason::NatTupleInUse,
        DropReason::LaddrExhausted,
        DropReason::RedirectRingFull,
        DropReason::HealthRingFull,
        DropReason::VrrpRingFull,
        DropReason::AclDenied,
        DropReason::RateLimited,
        DropReason::ServerUnanswered,
        DropReason::ClientReset,
        DropReason::ResetOutOfWindow,
        DropReason::BadIpv6Header,
        DropReason::Ipv6Fragment,
        DropReason::Ipv6TooManyExtHeaders,
        DropReason::Ipv6ExtHeaderTruncated,
        DropReason::Ipv6HopByHopNotFirst,
        DropReason::Ipv6UnrecognizedOption,
        DropReason::Ipv6MalformedOption,
        DropReason::Ipv6RoutingHeader,
        DropReason::NdiscHopLimit,
        DropReason::NdiscTruncated,
        DropReason::NdiscMalformed,
        DropReason::NdiscUnsupported,
        DropReason::NdiscNotForUs,
        DropReason::NdiscAdvert,
        DropReason::BadIcmpv6Checksum,
        DropReason::IcmpUntranslatable,
        DropReason::Ipv6GroupNotJoined,
        DropReason::ExceptionRateLimited,
        DropReason::ExceptionRingFull,
        DropReason::NotAPeer,
        DropReason::NotAProbeAnswer,
        DropReason::MartianSource,
        DropReason::SyncRingFull,
        DropReason::ExceptionForeignSource,
        DropReason::ExceptionControlRingFull,
    ];

    /// Stable snake_case name, used in `sluicectl status`, JSON and logs.
    pub fn name(self) -> &'static str {
        match self {
            DropReason::Truncated => "truncated",
            DropReason::UnknownEthertype => "unknown_ethertype",
            DropReason::Ipv6NoService => "ipv6_no_service",
            DropReason::BadIpv4Header => "bad_ipv4_header",
            DropReason::BadIpv4Checksum => "bad_ipv4_checksum",
            DropReason::Ipv4Fragment => "ipv4_fragment",
            DropReason::NotLocal => "not_local",
            DropReason::UnsupportedProtocol => "unsupported_protocol",
            DropReason::BadArp => "bad_arp",
            DropReason::ArpNotForUs => "arp_not_for_us",
            DropReason::ArpReply => "arp_reply",
            DropReason::IcmpNotEcho => "icmp_not_echo",
            DropReason::BadIcmpChecksum => "bad_icmp_checksum",
            DropReason::BadSourceMac => "bad_source_mac",
            DropReason::NotOurMac => "not_our_mac",
            DropReason::TxFull => "tx_full",
            DropReason::Ipv4Options => "ipv4_options",
            DropReason::BadTcpHeader => "bad_tcp_header",
            DropReason::BadUdpHeader => "bad_udp_header",
            DropReason::TcpNoSession => "tcp_no_session",
            DropReason::NoRealServer => "no_real_server",
            DropReason::SessionTableFull => "session_table_full",
            DropReason::NeighbourUnresolved => "neighbour_unresolved",
            DropReason::NoService => "no_service",
            DropReason::TooBig => "too_big",
            DropReason::IcmpErrorNoSession => "icmp_error_no_session",
            DropReason::IcmpErrorMisaddressed => "icmp_error_misaddressed",
            DropReason::IcmpTooBigAboutUdp => "icmp_too_big_about_udp",
            DropReason::NatTupleInUse => "nat_tuple_in_use",
            DropReason::LaddrExhausted => "laddr_exhausted",
            DropReason::RedirectRingFull => "redirect_ring_full",
            DropReason::HealthRingFull => "health_ring_full",
            DropReason::VrrpRingFull => "vrrp_ring_full",
            DropReason::AclDenied => "acl_denied",
            DropReason::RateLimited => "rate_limited",
            DropReason::ServerUnanswered => "server_unanswered",
            DropReason::ClientReset => "client_reset",
            DropReason::ResetOutOfWindow => "reset_out_of_window",
            DropReason::BadIpv6Header => "bad_ipv6_header",
            DropReason::Ipv6Fragment => "ipv6_fragment",
            DropReason::Ipv6TooManyExtHeaders => "ipv6_too_many_ext_headers",
            DropReason::Ipv6ExtHeaderTruncated => "ipv6_ext_header_truncated",
            DropReason::Ipv6HopByHopNotFirst => "ipv6_hop_by_hop_not_first",
            DropReason::Ipv6UnrecognizedOption => "ipv6_unrecognized_option",
            DropReason::Ipv6MalformedOption => "ipv6_malformed_option",
            DropReason::Ipv6RoutingHeader => "ipv6_routing_header",
            DropReason::NdiscHopLimit => "ndisc_hop_limit",
            DropReason::NdiscTruncated => "ndisc_truncated",
            DropReason::NdiscMalformed => "ndisc_malformed",
            DropReason::NdiscUnsupported => "ndisc_unsupported",
            DropReason::NdiscNotForUs => "ndisc_not_for_us",
            DropReason::NdiscAdvert => "ndisc_advert",
            DropReason::BadIcmpv6Checksum => "bad_icmpv6_checksum",
            DropReason::IcmpUntranslatable => "icmp_untranslatable",
            DropReason::Ipv6GroupNotJoined => "ipv6_group_not_joined",
            DropReason::ExceptionRateLimited => "exception_rate_limited",
            DropReason::ExceptionRingFull => "exception_ring_full",
            DropReason::NotAPeer => "not_a_peer",
            DropReason::NotAProbeAnswer => "not_a_probe_answer",
            DropReason::MartianSource => "martian_source",
            DropReason::SyncRingFull => "sync_ring_full",
            DropReason::ExceptionForeignSource => "exception_foreign_source",
            DropReason::ExceptionControlRingFull => "exception_control_ring_full",
        }
    }
}
