//! The ARP and ICMP echo responder (`LocalResponder::process_with_vips`) on a sequence
//! of frames (records: tag % 2 = 0 a structured frame, 1 raw bytes; tag bit 4 puts our
//! MAC first), with the appliance's address and two VIPs.
//!
//! Properties: a dropped frame is left as it came and no drop is counted inside (the
//! caller counts the one reason returned); a reply has the frame's length, comes from
//! our MAC back to the sender's, and its checksums verify (checked here); an ARP reply
//! answers for an address we own, to the asker; an echo reply goes from the address
//! pinged, an address we own, back to the pinger; no address we own is ever learned as
//! a neighbour. Frames that classify as IPv6 also go through
//! `LocalResponder::process_ipv6` (with the address 2001:db8:18::1 and a VIP): no panic, no drop
//! counted inside, a reply from our MAC, our IPv6 address never learned.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use sluice::dataplane::counters::WorkerCounters;
use sluice::dataplane::local::{LocalResponder, NeighbourPolicy, Verdict};
use sluice::dataplane::neighbour::{Neighbour6Table, NeighbourTable};
use sluice::flow::parse::{classify, PacketKind};
use sluice_fuzz::bed::{ADDRS, ADDRS6, ENDPOINTS, ENDPOINTS6, LB_IP, LB_IP6, LB_MAC, MACS, PORTS};
use sluice_fuzz::check::{self, Frame};
use sluice_fuzz::frames::{FrameSpec, Universe};
use std::net::Ipv4Addr;

const VIPS: &[Ipv4Addr] = &[
    Ipv4Addr::new(198, 18, 0, 210),
    Ipv4Addr::new(198, 18, 0, 240),
];

/// One of ADDRS off the port's /24: learned only as a real server (the other
/// off-link senders are answered, not learned).
const REAL_SERVERS: &[Ipv4Addr] = &[Ipv4Addr::new(198, 51, 100, 7)];

fuzz_target!(|data: &[u8]| {
    let universe = Universe {
        our_mac: LB_MAC,
        macs: MACS,
        addrs: ADDRS,
        ports: PORTS,
        endpoints: ENDPOINTS,
        addrs6: ADDRS6,
        endpoints6: ENDPOINTS6,
    };
    let responder = LocalResponder::new(LB_MAC, &[(LB_IP, 24)]).with_ipv6(&[LB_IP6]);
    let mut neighbours = NeighbourTable::with_capacity(16);
    let mut neighbours6 = Neighbour6Table::with_capacity(16);
    let counters = WorkerCounters::default();
    let owns = |ip: Ipv4Addr| ip == LB_IP || VIPS.contains(&ip);
    for (n, (tag, body)) in sluice_fuzz::records(data).enumerate() {
        if n >= 64 {
            break;
        }
        let mut frame = if tag % 2 == 0 {
            let Ok(spec) = FrameSpec::arbitrary(&mut Unstructured::new(body)) else {
                continue;
            };
            universe.build(&spec)
        } else {
            body.to_vec()
        };
        if tag & 0x10 != 0 && frame.len() >= 6 {
            frame[..6].copy_from_slice(&LB_MAC);
        }
        if let Ok(
            parsed @ sluice::flow::parse::Parsed {
                kind: PacketKind::Ipv6(_),
                ..
            },
        ) = classify(&frame)
        {
            // With room after the frame, as an mbuf has, for a longer reply.
            let mut buf = frame.clone();
            buf.resize(frame.len() + 256, 0);
            let drops = counters.drops_snapshot();
            // One IPv6 VIP, answered as the responder's own addresses are.
            let vips6: [std::net::Ipv6Addr; 1] = [std::net::Ipv6Addr::new(
                0x2001, 0xdb8, 0x18, 0, 0, 0, 0, 0x100,
            )];
            // One IPv6 real server, learned into the reserved quarter.
            let real_servers6: [std::net::Ipv6Addr; 1] = [std::net::Ipv6Addr::new(
                0x2001, 0xdb8, 0x18, 0, 0, 0, 0, 0x11,
            )];
            let got = responder.process_ipv6(
                &mut buf,
                &parsed,
                &mut neighbours6,
                n as u64,
                &counters,
                sluice::dataplane::local::Known6 {
                    vips6: &vips6,
                    real_servers6: &real_servers6,
                },
            );
            assert_eq!(
                drops,
                counters.drops_snapshot(),
                "the responder counted a drop"
            );
            if let Ok(len) = got {
                assert!(len <= buf.len());
                assert_eq!(buf[6..12], LB_MAC, "IPv6 reply not from our MAC");
            }
            assert!(
                neighbours6.lookup(LB_IP6).is_none(),
                "learned our own IPv6 address"
            );
        }
        let input = frame.clone();
        let drops = counters.drops_snapshot();
        let verdict = responder.process_with_vips(
            &mut frame,
            &mut neighbours,
            n as u64,
            &counters,
            VIPS,
            NeighbourPolicy {
                real_servers: REAL_SERVERS,
                peers: &[],
                // Entries of lesser standing give their slots up after a few frames.
                stale_tsc: 3,
            },
        );
        assert_eq!(
            drops,
            counters.drops_snapshot(),
            "the responder counted a drop"
        );
        match verdict {
            Verdict::Drop(reason) => {
                assert_eq!(frame, input, "dropped ({reason:?}) but changed");
            }
            Verdict::Reply => {
                assert_eq!(frame.len(), input.len());
                assert_eq!(frame[6..12], LB_MAC, "reply not from our MAC");
                let (l3, ethertype) = check::l2(&frame).unwrap();
                // ARP answers the sender hardware address it carries (RFC 826);
                // ICMP the frame's source.
                let asker = if ethertype == 0x0806 {
                    &input[l3 + 8..l3 + 14]
                } else {
                    &input[6..12]
                };
                assert_eq!(&frame[..6], asker, "reply not to the asker's MAC");
                match check::rewritten(&input, &frame) {
                    Ok(Frame::Arp { op }) => {
                        assert_eq!(op, 2);
                        let (a, q) = (&frame[l3..l3 + 28], &input[l3..l3 + 28]);
                        let us = Ipv4Addr::new(a[14], a[15], a[16], a[17]);
                        assert!(owns(us), "ARP reply for {us}");
                        assert_eq!(a[8..14], LB_MAC);
                        assert_eq!(a[18..28], q[8..18], "the reply's target is the asker");
                    }
                    Ok(Frame::Ipv4(ip)) => {
                        let Ok(Frame::Ipv4(asked)) = check::inspect(&input) else {
                            panic!("an echo reply to a frame that is not IPv4");
                        };
                        assert_eq!(ip.protocol, 1);
                        assert_eq!(ip.l4_ok, Some(true), "echo reply with a bad ICMP checksum");
                        assert_eq!(frame[l3 + ip.header_len], 0, "not an echo reply");
                        assert!(owns(ip.src), "echo reply from {}", ip.src);
                        assert_eq!((ip.src, ip.dst), (asked.dst, asked.src));
                    }
                    other => panic!("reply {other:?}\n in: {input:02x?}\nout: {frame:02x?}"),
                }
            }
        }
        for ip in [LB_IP].iter().chain(VIPS) {
            assert!(
                neighbours.lookup(*ip).is_none(),
                "learned our own {ip} as a neighbour"
            );
        }
    }
});
