//! The packet path of one worker: `classify` and `Forwarder::handle_burst` (one frame a
//! burst, new sessions parked and filed at its end) over a sequence of
//! frames (structured ones aimed at the VIPs, real servers and local addresses, and
//! raw bytes), with time passing and sessions expiring in between. See `bed.rs` for
//! the services (DR, NAT, TUN, FullNAT with a local-port pool, TOA, persistence).
//!
//! Input: records (tag, length, bytes). Tag % 4: 0 a structured frame, 1 raw frame
//! bytes (bit 4: our MAC as destination), 2 time passes (first two bytes, in 100 ms
//! ticks) and the forwarder polls, 3 a structured frame arriving from another worker's
//! redirect ring.
//!
//! After every frame: handle counted no drop itself (the worker counts the one reason
//! it returns); a frame to transmit fits its mbuf, its IPv4 header checksum verifies
//! and its TCP/UDP/ICMP checksum verifies whenever the input's did; a frame to a NAT
//! VIP never leaves with the VIP as its source, one to a FullNAT VIP leaves from a
//! local address; it grew only within the MTU; the same for IPv6 (a TCP/UDP packet to
//! an IPv6 FullNAT VIP leaves from an IPv6 local address, one to a NAT64 VIP as IPv4
//! from an IPv4 local address, none with the VIP as source; the IPv6 L4 checksum
//! verifies whenever the input's did); the session table, the local-port pools
//! (IPv6 and NAT64 sessions' ports included) and the real servers' gauges agree. At the end every session expires and every
//! local port is back in its pool.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use sluice::dataplane::counters::WorkerCounters;
use sluice::dataplane::forwarder::{Action, PortContext};
use sluice::dataplane::local::LocalResponder;
use sluice::flow::parse::{classify, Ipv6Payload, PacketKind};
use sluice::wire::ethernet::MacAddr;
use sluice_fuzz::bed::{self, LB_IP, LB_MAC};
use sluice_fuzz::check::{self, Frame};
use sluice_fuzz::eal::burst_of;
use sluice_fuzz::frames::{FrameSpec, Universe};

const MTU: u16 = 1500;

fuzz_target!(|data: &[u8]| {
    let shared = bed::shared();
    let universe = Universe {
        our_mac: LB_MAC,
        macs: bed::MACS,
        addrs: bed::ADDRS,
        ports: bed::PORTS,
        endpoints: bed::ENDPOINTS,
        addrs6: bed::ADDRS6,
        endpoints6: bed::ENDPOINTS6,
    };
    bed::with_bed(|bed| run(bed, data, &universe, shared));
});

fn run(bed: &mut bed::Bed, data: &[u8], universe: &Universe, shared: &bed::Shared) {
    let bed::Bed { fwd, now, .. } = bed;
    let mut neighbours = bed::neighbours();
    let counters = WorkerCounters::default();
    // The port's IPv6 address too, so that IPv6 frames reach Neighbor Discovery and echo.
    let responder = LocalResponder::new(LB_MAC, &[(LB_IP, 24)]).with_ipv6(&[bed::LB_IP6]);
    fwd.poll(*now, &counters);
    let mut actions = [0u64; 8];
    for (n, (tag, body)) in sluice_fuzz::records(data).enumerate() {
        if n >= 64 {
            break;
        }
        let frame = match tag % 4 {
            0 | 3 => {
                let Ok(spec) = FrameSpec::arbitrary(&mut Unstructured::new(body)) else {
                    continue;
                };
                universe.build(&spec)
            }
            1 => {
                let mut f = body.to_vec();
                if tag & 0x10 != 0 && f.len() >= 6 {
                    f[..6].copy_from_slice(&LB_MAC);
                }
                f
            }
            _ => {
                let ticks = u16::from_be_bytes([
                    body.first().copied().unwrap_or(0),
                    body.get(1).copied().unwrap_or(1),
                ]);
                *now += u64::from(ticks) * bed::TSC_PER_TICK;
                fwd.poll(*now, &counters);
                if let Err(e) = bed::check_books(fwd) {
                    panic!("after a poll: {e}");
                }
                continue;
            }
        };
        let port = PortContext {
            responder: &responder,
            index: 0,
            mac: MacAddr(LB_MAC),
            addr: LB_IP,
            mtu: MTU,
            redirected: tag % 4 == 3,
            // Half the frames on a port with an exception path: a drop may then
            // become the kernel's.
            exception: tag % 8 >= 4,
        };
        let mut burst = burst_of(&frame);
        let input = burst.packet(0).to_vec();
        let drops_before = counters.drops_snapshot();
        // As the worker does: a burst (of one frame) through `handle_burst`.
        let mut handed = None;
        fwd.handle_burst(
            &mut burst,
            &port,
            &mut neighbours,
            *now,
            &counters,
            |_, _, i, a| {
                assert!(i == 0 && handed.is_none(), "frame {i} handed on again");
                handed = Some(a);
            },
        );
        let action = handed.expect("the frame handed on");
        assert_eq!(
            drops_before,
            counters.drops_snapshot(),
            "handle counted a drop itself ({action:?}); the worker counts the reason it returns"
        );
        if let Action::Drop(reason) | Action::TransmitInstead(reason) = action {
            counters.drop(reason);
            let after = counters.drops_snapshot();
            let counted: u64 = after.iter().zip(&drops_before).map(|(a, b)| a - b).sum();
            assert_eq!(counted, 1);
        }
        if let Some(trace) = std::env::var_os("FUZZ_TRACE") {
            eprintln!(
                "{action:?} {} -> {} bytes",
                input.len(),
                burst.packet(0).len()
            );
            if trace == "bytes" {
                eprintln!("  in: {input:02x?}\n out: {:02x?}", burst.packet(0));
            }
        }
        actions[match action {
            Action::Transmit => 0,
            Action::TransmitInstead(_) => 1,
            Action::Drop(_) => 2,
            Action::Redirect(_) => 3,
            Action::Punt => 4,
            Action::Hold(_) => 5,
            Action::AwaitServer(_) => 6,
            Action::Exception(_) => 7,
            Action::Parked => unreachable!("handle_burst never hands on Parked"),
        }] += 1;
        let out = burst.packet(0).to_vec();
        let room = burst.packet_with_tailroom_mut(0).len();
        assert!(out.len() <= room, "frame of {} bytes in {room}", out.len());
        assert_eq!(burst.packet_len(0) as usize, out.len());
        if matches!(action, Action::Transmit | Action::TransmitInstead(_)) {
            let sent = match check::rewritten(&input, &out) {
                Ok(f) => f,
                Err(e) => panic!("{action:?}: {e}\n in: {input:02x?}\nout: {out:02x?}"),
            };
            if let (Action::Transmit, Ok(p)) = (action, classify(&input)) {
                if let PacketKind::Ipv6(Ipv6Payload::Tcp { .. } | Ipv6Payload::Udp { .. }) = p.kind
                {
                    let dst = &input[p.l3 + 24..p.l3 + 40];
                    let vip = std::net::Ipv6Addr::from(<[u8; 16]>::try_from(dst).unwrap());
                    check_v6(shared, vip, &sent, &out);
                }
            }
            if let (Frame::Ipv4(o), Ok(p)) = (&sent, classify(&input)) {
                let grew = out.len() > input.len();
                if grew && o.total_len > usize::from(MTU) && o.protocol == 6 {
                    panic!("grew past the MTU: {} bytes", o.total_len);
                }
                let key = match p.kind {
                    PacketKind::Tcp { key, .. } | PacketKind::Udp { key } => Some(key),
                    _ => None,
                };
                if let (Some(key), Action::Transmit) = (key, action) {
                    let vip = key.dst_addr();
                    if shared.nat_vips.contains(&vip) && o.src == vip {
                        panic!("NAT: a frame to VIP {vip} leaves with the VIP as source: {o:?}");
                    }
                    if shared.fullnat_vips.contains(&vip) && !shared.lips.contains(&o.src) {
                        panic!(
                            "FullNAT: a frame to VIP {vip} leaves from {} ({o:?})",
                            o.src
                        );
                    }
                }
            }
        }
        drop(burst);
        if let Err(e) = bed::check_books(fwd) {
            panic!("after {action:?}: {e}\n in: {input:02x?}");
        }
    }
    if let Err(e) = bed::drain(fwd, now, &counters) {
        panic!("draining: {e}");
    }
    if std::env::var_os("FUZZ_STATS").is_some() {
        tally(&counters, &actions);
    }
}

/// A TCP/UDP packet to an IPv6 FullNAT VIP leaves from one of its IPv6 local
/// addresses, one to a NAT64 VIP as IPv4 from an IPv4 local address; one to a NAT VIP
/// never with the VIP as its source.
fn check_v6(shared: &bed::Shared, vip: std::net::Ipv6Addr, sent: &Frame, out: &[u8]) {
    let Some((l3, _)) = check::l2(out) else {
        return;
    };
    let src6 = || {
        out.get(l3 + 8..l3 + 24)
            .map(|b| std::net::Ipv6Addr::from(<[u8; 16]>::try_from(b).unwrap()))
    };
    if shared.nat64_vips.contains(&vip) {
        match sent {
            Frame::Ipv4(o) if shared.lips.contains(&o.src) => {}
            _ => panic!("NAT64: a packet to VIP {vip} leaves as {sent:?}\nout: {out:02x?}"),
        }
    } else if shared.fullnat6_vips.contains(&vip) {
        if !src6().is_some_and(|s| shared.lips6.contains(&s)) {
            panic!("FullNAT: a packet to VIP {vip} leaves from {:?}", src6());
        }
    } else if src6() == Some(vip) {
        panic!("a packet to VIP {vip} leaves with the VIP as its source");
    }
}

/// With FUZZ_STATS set: what the inputs reached so far (actions, drop reasons and
/// events summed over inputs), every 65536 inputs, to see that the deep paths run.
fn tally(counters: &WorkerCounters, actions: &[u64; 8]) {
    use sluice::dataplane::counters::Event;
    use sluice::model::DropReason;
    use std::cell::RefCell;
    thread_local! {
        static TOTAL: RefCell<(u64, [u64; 8], Vec<u64>, Vec<u64>)> =
            RefCell::new((0, [0; 8], vec![0; DropReason::COUNT], vec![0; Event::COUNT]));
    }
    TOTAL.with(|t| {
        let mut t = t.borrow_mut();
        t.0 += 1;
        for (a, b) in t.1.iter_mut().zip(actions) {
            *a += b;
        }
        for (a, b) in t.2.iter_mut().zip(counters.drops_snapshot()) {
            *a += b;
        }
        for (a, b) in t.3.iter_mut().zip(counters.events_snapshot()) {
            *a += b;
        }
        if t.0 % 65536 == 0 {
            eprintln!(
                "inputs {} actions [transmit, instead, drop, redirect, punt, hold, await, exception] {:?}",
                t.0,
                &t.1[..]
            );
            let drops: Vec<String> = DropReason::ALL
                .iter()
                .zip(&t.2)
                .filter(|(_, n)| **n > 0)
                .map(|(r, n)| format!("{}={n}", r.name()))
                .collect();
            eprintln!("  drops {}", drops.join(" "));
            let events: Vec<String> = Event::ALL
                .iter()
                .zip(&t.3)
                .filter(|(_, n)| **n > 0)
                .map(|(e, n)| format!("{}={n}", e.name()))
                .collect();
            eprintln!("  events {}", events.join(" "));
        }
    });
}
