//! VRRPv3 from the network: the advertisement parser (`wire::vrrp`) and the node that
//! feeds it to the state machine (`daemon::vrrp::VrrpNode`, over `sync::vrrp::Router`).
//! The first 8 bytes configure our router (VRID, priority, interval, preempt, whether
//! it holds `[vrrp] key`); then
//! records (tag, length, bytes), tag % 3: 0 an advertisement built from the bytes
//! (mostly valid: TTL 255, to 224.0.0.18, checksums right unless damaged), 1 a raw
//! frame, 2 time passes (two bytes, in ms) and timers fire.
//!
//! Properties: every frame is counted once, received, rejected or refused by
//! authentication; one whose VRRP or IPv4 checksum we broke, whose TTL is not 255, or
//! whose address count disagrees with its payload, is rejected (or, by a keyed node,
//! refused as bad auth when the extra bytes could be a trailer); a keyed node takes no
//! unsealed advert, and an advert sealed with its key (tag 0, `seal`) that it took is
//! refused as replayed when sent again; a parsed
//! advertisement survives emit -> parse; everything the node sends is a well-formed
//! advertisement of our VRID (checksums verified here), a gratuitous ARP for one of
//! our IPv4 addresses or an unsolicited Neighbor Advertisement (hop limit 255, to all
//! nodes, checksum verified here) for one of our IPv6 addresses; the owner (priority
//! 255) is master from the start.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use sluice::ha::auth::SharedKey;
use sluice::ha::vrrp::auth::AdvertAuth;
use sluice::ha::vrrp::node::{VirtualAddresses, VrrpNode};
use sluice::ha::vrrp::router::VrrpConfig;
use sluice::wire::ethernet::MacAddr;
use sluice::wire::vrrp;
use sluice_fuzz::check::{self, Frame};
use sluice_fuzz::frames::fix_ip_checksum;
use sluice_fuzz::net::{pseudo, sum, verifies};
use std::net::{Ipv4Addr, Ipv6Addr};

const MAC: [u8; 6] = [0x02, 0x53, 0x4c, 0, 0, 1];
const KEY: &[u8] = b"the fuzzed group's key, 32 bytes";
/// The keyed node's wall clock, in microseconds: it stands still.
const NOW_US: u64 = 1_800_000_000_000_000;

fn clock() -> u64 {
    NOW_US
}
const PRIMARY: Ipv4Addr = Ipv4Addr::new(198, 18, 0, 1);
const VIRTUAL: &[Ipv4Addr] = &[
    Ipv4Addr::new(198, 18, 0, 210),
    Ipv4Addr::new(198, 18, 0, 220),
];
const VIRTUAL6: &[Ipv6Addr] = &[Ipv6Addr::new(0x2001, 0xdb8, 0x18, 0, 0, 0, 0, 0x80)];

#[derive(Arbitrary, Debug)]
struct Advert {
    vrid_ours: bool,
    vrid: u8,
    priority: u8,
    interval_cs: u16,
    addresses: Vec<u32>,
    version: Option<u8>,
    ttl: Option<u8>,
    sender: u32,
    break_vrrp_checksum: bool,
    break_ip_checksum: bool,
    count_skew: i8,
    /// Sealed with the key (before any damage), its counter this many ms from the
    /// node's clock.
    seal: Option<i32>,
}

fn advert_frame(a: &Advert, our_vrid: u8) -> (Vec<u8>, bool) {
    let count = a.addresses.len().min(20);
    let vrrp_len = 8 + 4 * count;
    let mut f = vec![0u8; 14 + 20 + vrrp_len];
    f[..6].copy_from_slice(&[0x01, 0x00, 0x5e, 0x00, 0x00, 0x12]);
    f[6..12].copy_from_slice(&[2, 0, 0, 0, 0, 9]);
    f[12..14].copy_from_slice(&[0x08, 0x00]);
    let ttl = a.ttl.unwrap_or(255);
    let sender = Ipv4Addr::from(a.sender | 0x0100_0000);
    let ip = &mut f[14..34];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&((20 + vrrp_len) as u16).to_be_bytes());
    ip[8] = ttl;
    ip[9] = 112;
    ip[12..16].copy_from_slice(&sender.octets());
    ip[16..20].copy_from_slice(&vrrp::MULTICAST_GROUP.octets());
    fix_ip_checksum(&mut f[14..]);
    let v = &mut f[34..];
    v[0] = (a.version.unwrap_or(3) << 4) | 1;
    v[1] = if a.vrid_ours { our_vrid } else { a.vrid };
    v[2] = a.priority;
    v[3] = (count as u8).wrapping_add_signed(a.count_skew);
    v[4..6].copy_from_slice(&(a.interval_cs & 0x0fff).to_be_bytes());
    for (i, addr) in a.addresses.iter().take(count).enumerate() {
        v[8 + 4 * i..12 + 4 * i].copy_from_slice(&addr.to_be_bytes());
    }
    let c = sluice_fuzz::net::finish(pseudo(sender, vrrp::MULTICAST_GROUP, 112, vrrp_len) + sum(v));
    v[6..8].copy_from_slice(&c.to_be_bytes());
    if let Some(ms) = a.seal {
        f.extend_from_slice(&[0; vrrp::auth::TRAILER_LEN]);
        let total = (20 + vrrp_len + vrrp::auth::TRAILER_LEN) as u16;
        f[16..18].copy_from_slice(&total.to_be_bytes());
        fix_ip_checksum(&mut f[14..]);
        let counter = NOW_US.wrapping_add_signed(i64::from(ms) * 1000);
        AdvertAuth::new(SharedKey::new(KEY).unwrap(), 60_000).seal(
            &mut f[34..],
            sender,
            vrrp::MULTICAST_GROUP,
            counter,
        );
    }
    if a.break_vrrp_checksum {
        f[34 + 7] ^= 0x01;
    }
    if a.break_ip_checksum {
        f[24] ^= 0x01;
    }
    // A count 11 over on a sealed advert counts the 44-byte trailer as 11 addresses:
    // a consistent advert to a node without the key.
    let trailer_as_addresses =
        a.seal.is_some() && i64::from(a.count_skew) * 4 == vrrp::auth::TRAILER_LEN as i64;
    let must_reject = a.break_vrrp_checksum
        || a.break_ip_checksum
        || ttl != 255
        || (a.count_skew != 0 && !trailer_as_addresses);
    (f, must_reject)
}

/// Checks a frame the node sent (`keyed`: with `[vrrp] key`).
fn check_sent(frame: &[u8], vrid: u8, keyed: bool) {
    if frame.get(12..14) == Some(&[0x86, 0xdd]) {
        assert_eq!(
            frame.len(),
            14 + 40 + 32,
            "an advertisement with one option"
        );
        assert_eq!(frame[..6], [0x33, 0x33, 0, 0, 0, 1], "to all nodes");
        let ip = &frame[14..54];
        assert_eq!((ip[6], ip[7]), (58, 255), "ICMPv6, hop limit 255");
        let src = Ipv6Addr::from(<[u8; 16]>::try_from(&ip[8..24]).unwrap());
        let na = &frame[54..];
        assert_eq!(
            (na[0], na[4]),
            (136, 0x20),
            "an advertisement, override only"
        );
        assert_eq!(na[8..24], src.octets(), "from the target");
        assert!(VIRTUAL6.contains(&src), "advertisement for {src}");
        // The IPv6 pseudo-header: addresses, length, next header.
        let total = sum(&ip[8..40]) + na.len() as u64 + 58 + sum(na);
        assert!(verifies(total), "advertisement with a bad ICMPv6 checksum");
        return;
    }
    match check::inspect(frame) {
        Ok(Frame::Ipv4(ip)) => {
            assert!(ip.header_ok, "advert with a bad IPv4 checksum");
            assert_eq!(
                (ip.protocol, ip.dst, ip.src),
                (112, vrrp::MULTICAST_GROUP, PRIMARY)
            );
            assert_eq!(frame[14 + 8], 255, "advert TTL");
            let body = &frame[14 + ip.header_len..14 + ip.total_len];
            assert!(
                verifies(pseudo(ip.src, ip.dst, 112, body.len()) + sum(body)),
                "advert with a bad VRRP checksum"
            );
            assert_eq!(body[0], 0x31, "version 3, type advertisement");
            assert_eq!(body[1], vrid);
            let message = 8 + 4 * usize::from(body[3]);
            match keyed {
                true => {
                    assert_eq!(body.len(), message + vrrp::auth::TRAILER_LEN);
                    assert_eq!(body[message..message + 4], *b"SLVA");
                }
                false => assert_eq!(body.len(), message),
            }
        }
        Ok(Frame::Arp { op }) => {
            assert_eq!(op, 1, "gratuitous ARP is a request");
            let a = &frame[14..42];
            assert_eq!(a[14..18], a[24..28], "gratuitous: sender = target");
            let ip = Ipv4Addr::new(a[14], a[15], a[16], a[17]);
            assert!(VIRTUAL.contains(&ip), "gratuitous ARP for {ip}");
        }
        other => panic!("the node sent {other:?}"),
    }
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 8 {
        return;
    }
    let (head, rest) = data.split_at(8);
    let config = VrrpConfig {
        vrid: head[0].max(1),
        priority: head[1].max(1),
        advert_interval_cs: u16::from_be_bytes([head[2], head[3]]).clamp(1, 4095),
        preempt: head[4] & 1 != 0,
        primary_addr: PRIMARY,
    };
    let keyed = head[5] & 1 != 0;
    let mut node = VrrpNode::new(config, MacAddr(MAC));
    if keyed {
        node = node.with_auth(AdvertAuth::new(SharedKey::new(KEY).unwrap(), 60_000), clock);
    }
    let virtual_addresses = VirtualAddresses {
        v4: VIRTUAL.to_vec(),
        v6: VIRTUAL6.to_vec(),
    };
    let vrid = config.vrid;
    let mut now: u64 = 1000;
    let mut send = |f: &[u8]| {
        check_sent(f, vrid, keyed);
        true
    };
    let counted = |n: &VrrpNode| {
        let s = n.stats;
        s.adverts_received
            + s.adverts_rejected
            + s.adverts_bad_auth
            + s.adverts_replayed
            + s.adverts_clock_skew
    };
    node.start(now, &virtual_addresses, &mut send);
    let owner = config.priority == 255;
    if owner {
        assert!(node.serving(), "the owner is master at start-up");
    }
    let mut fed = 0u64;
    for (n, (tag, body)) in sluice_fuzz::records(rest).enumerate() {
        if n >= 64 {
            break;
        }
        let before = node.stats;
        match tag % 3 {
            0 => {
                let Ok(a) = Advert::arbitrary(&mut Unstructured::new(body)) else {
                    continue;
                };
                let (frame, must_reject) = advert_frame(&a, vrid);
                // The parser alone, and emit -> parse of what it accepts.
                if let Ok(packet) = vrrp::Packet::new_checked(&frame[34..]) {
                    if let Ok(repr) = vrrp::Repr::parse(
                        &packet,
                        Ipv4Addr::from(a.sender | 0x0100_0000),
                        vrrp::MULTICAST_GROUP,
                    ) {
                        let mut buf = vec![0u8; repr.buffer_len()];
                        let src = Ipv4Addr::new(192, 0, 2, 1);
                        repr.emit(
                            &mut vrrp::Packet::new_unchecked(&mut buf[..]),
                            src,
                            vrrp::MULTICAST_GROUP,
                        );
                        let back = vrrp::Repr::parse(
                            &vrrp::Packet::new_checked(&buf[..]).unwrap(),
                            src,
                            vrrp::MULTICAST_GROUP,
                        );
                        assert_eq!(back.as_ref(), Ok(&repr));
                    }
                }
                node.on_frame(&frame, now, &virtual_addresses, &mut send);
                fed += 1;
                let s = node.stats;
                if must_reject {
                    let refused = s.adverts_rejected + s.adverts_bad_auth;
                    assert_eq!(
                        refused,
                        before.adverts_rejected + before.adverts_bad_auth + 1
                    );
                    if !keyed && a.seal.is_none() {
                        assert_eq!(s.adverts_rejected, before.adverts_rejected + 1);
                    }
                }
                if keyed && a.seal.is_none() {
                    assert_eq!(
                        s.adverts_received, before.adverts_received,
                        "unsealed taken"
                    );
                }
                if keyed && a.seal.is_some() && s.adverts_received > before.adverts_received {
                    // Taken once: the same bytes again are a replay.
                    node.on_frame(&frame, now, &virtual_addresses, &mut send);
                    fed += 1;
                    assert_eq!(node.stats.adverts_replayed, s.adverts_replayed + 1);
                }
            }
            1 => {
                node.on_frame(body, now, &virtual_addresses, &mut send);
                fed += 1;
            }
            _ => {
                let ms = u16::from_be_bytes([
                    body.first().copied().unwrap_or(0),
                    body.get(1).copied().unwrap_or(100),
                ]);
                now += u64::from(ms);
                node.tick(now, &virtual_addresses, &mut send);
            }
        }
        assert_eq!(counted(&node), fed);
    }
});
