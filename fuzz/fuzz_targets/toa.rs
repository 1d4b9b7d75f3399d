//! FullNAT's TCP option rewriting (`forward::toa`): TOA insertion and MSS clamping,
//! on a classified TCP frame (structured from the bytes after the first four, or raw
//! when byte 0 is odd), in a buffer with byte 1 % 64 bytes of room after the frame
//! and a frame-length cap byte 2 % 80 bytes above the frame's.
//!
//! Properties, checked with this crate's own checksum and option reader:
//! insert: `Inserted` grows the IPv4 packet by exactly 8 bytes within the room and the
//! cap, leaves the payload as it was (other kind-254 options may have become NOPs),
//! and the option
//! read back is the client; `Replaced` keeps the length and reads back the client;
//! the option the `toa` module would read first (any kind-254 option) is Sluice's;
//! `NoRoom` and `remove_forged` (but on a SYN) leave no kind-254 option the module would read and
//! change no other byte but the checksum; errors leave the frame unchanged; the TCP
//! and IPv4 checksums verify whenever the input's did. clamp_mss: the MSS only goes down, by at most the amount
//! asked and not below 88 (unless it was already), everything else unchanged.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use sluice::flow::parse::{classify, PacketKind};
use sluice::forward::toa::{self, InsertOutcome, MssOutcome, MIN_MSS, TOA_LEN};
use sluice_fuzz::bed::{ADDRS, ADDRS6, ENDPOINTS, ENDPOINTS6, LB_MAC, MACS, PORTS};
use sluice_fuzz::check::{self, Frame};
use sluice_fuzz::frames::{FrameSpec, Universe};
use std::net::Ipv4Addr;

/// The TCP header length and options of the IPv4/TCP packet at `l3`.
fn tcp_options(frame: &[u8], l3: usize, ihl: usize) -> &[u8] {
    let l4 = l3 + ihl;
    let header_len = usize::from(frame[l4 + 12] >> 4) * 4;
    &frame[l4 + 20..l4 + header_len]
}

/// Independent reader, walking as the `toa` kernel module does (End of Option List
/// stops, NOP is one byte, any other option is stepped over by its length while that
/// is at least 2 and fits): the first option for which `wanted(kind, length)` holds.
fn first_option(options: &[u8], wanted: impl Fn(u8, usize) -> bool) -> Option<&[u8]> {
    let mut at = 0;
    while at < options.len() {
        match options[at] {
            0 => return None,
            1 => at += 1,
            k => {
                let l = usize::from(*options.get(at + 1)?);
                if l < 2 || at + l > options.len() {
                    return None;
                }
                if wanted(k, l) {
                    return Some(&options[at..at + l]);
                }
                at += l;
            }
        }
    }
    None
}

/// The first option of kind 254 of any length (the module takes 8, and DPVS's 20).
fn first_toa_kind(options: &[u8]) -> Option<&[u8]> {
    first_option(options, |kind, _| kind == 254)
}

/// The first option of kind `kind` with length `len`.
fn option(options: &[u8], kind: u8, len: usize) -> Option<&[u8]> {
    first_option(options, |k, l| k == kind && l == len)
}

/// `out` is `frame` with any kind-254 option the module would read made NOPs: no
/// other byte changed but the TCP checksum's, which verifies whenever it did.
fn no_toa_kind_left(frame: &[u8], out: &[u8], l3: usize, before: &check::Ipv4) {
    let l4 = l3 + before.header_len;
    let opts = tcp_options(out, l3, before.header_len);
    assert_eq!(first_toa_kind(opts), None, "a kind-254 option is left");
    let options = l4 + 20..l4 + 20 + opts.len();
    for i in (0..frame.len()).filter(|&i| out[i] != frame[i]) {
        let in_checksum = (l4 + 16..l4 + 18).contains(&i);
        assert!(
            in_checksum || (options.contains(&i) && out[i] == 1),
            "byte {i} changed to {}",
            out[i]
        );
    }
    check::rewritten(frame, out).unwrap();
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 4 {
        return;
    }
    let (head, body) = data.split_at(4);
    let frame = if head[0] & 1 == 0 {
        let universe = Universe {
            our_mac: LB_MAC,
            macs: MACS,
            addrs: ADDRS,
            ports: PORTS,
            endpoints: ENDPOINTS,
            addrs6: ADDRS6,
            endpoints6: ENDPOINTS6,
        };
        let Ok(spec) = FrameSpec::arbitrary(&mut Unstructured::new(body)) else {
            return;
        };
        universe.build(&spec)
    } else {
        body.to_vec()
    };
    let Ok(parsed) = classify(&frame) else {
        return;
    };
    let PacketKind::Tcp { .. } = parsed.kind else {
        return;
    };
    let room = usize::from(head[1] % 64);
    let cap = frame.len() + usize::from(head[2] % 80);
    let client = (
        Ipv4Addr::new(203, 0, 113, head[3]),
        1000 + u16::from(head[3]),
    );
    let Ok(Frame::Ipv4(before)) = check::inspect(&frame) else {
        panic!("classified as TCP, unreadable here");
    };
    let l3 = parsed.l3;
    let ip_end = l3 + before.total_len;
    let header_len = usize::from(frame[l3 + before.header_len + 12] >> 4) * 4;
    let payload_at = l3 + before.header_len + header_len;

    // Insertion.
    let mut buf = frame.clone();
    buf.resize(frame.len() + room, 0xee);
    match toa::insert(&mut buf, &parsed, client, cap) {
        Ok(InsertOutcome::Inserted { new_len }) => {
            assert_eq!(new_len, ip_end + TOA_LEN);
            assert!(
                new_len <= buf.len() && new_len <= cap,
                "{new_len} past room or cap"
            );
            let out = &buf[..new_len];
            let after = match check::rewritten(&frame, out) {
                Ok(Frame::Ipv4(a)) => a,
                other => panic!("{other:?}"),
            };
            assert_eq!(after.total_len, before.total_len + TOA_LEN);
            assert_eq!(
                out[payload_at + TOA_LEN..new_len],
                frame[payload_at..ip_end],
                "payload changed"
            );
            let opts = tcp_options(out, l3, after.header_len);
            let got = first_toa_kind(opts).expect("no TOA option after insertion");
            assert_eq!(got, toa::encode(client), "the module would read another");
            assert_eq!(toa::find(opts), Some(client));
        }
        Ok(InsertOutcome::Replaced) => {
            check::rewritten(&frame, &buf[..frame.len()]).unwrap();
            let opts = tcp_options(&buf, l3, before.header_len);
            assert_eq!(first_toa_kind(opts), Some(&toa::encode(client)[..]));
            assert_eq!(toa::find(opts), Some(client));
        }
        Ok(InsertOutcome::NoRoom) => no_toa_kind_left(&frame, &buf[..frame.len()], l3, &before),
        Err(_) => assert_eq!(buf[..frame.len()], frame[..], "refused but changed"),
    }

    // A later segment's own TOA options (a SYN keeps its own: the module reads ACKs).
    let mut buf = frame.clone();
    let syn = frame[l3 + before.header_len + 13] & 0x02 != 0;
    match toa::remove_forged(&mut buf, &parsed) {
        Ok(_) if !syn => no_toa_kind_left(&frame, &buf, l3, &before),
        Ok(n) => assert!(n == 0 && buf == frame, "a SYN changed"),
        Err(_) => assert_eq!(buf, frame, "refused but changed"),
    }

    // MSS clamping.
    let reduce = u16::from(head[1]);
    let mut buf = frame.clone();
    let mss_before = option(tcp_options(&frame, l3, before.header_len), 2, 4)
        .map(|o| u16::from_be_bytes([o[2], o[3]]));
    match toa::clamp_mss(&mut buf, &parsed, reduce) {
        Ok(MssOutcome::Clamped { from, to }) => {
            assert_eq!(
                Some(from),
                mss_before,
                "clamped an MSS option this reader does not see"
            );
            assert!(to <= from && from - to <= reduce);
            assert!(to >= MIN_MSS.min(from), "MSS {from} -> {to}");
            check::rewritten(&frame, &buf).unwrap();
            let now = option(tcp_options(&buf, l3, before.header_len), 2, 4)
                .map(|o| u16::from_be_bytes([o[2], o[3]]));
            assert_eq!(now, Some(to));
            let changed: Vec<usize> = (0..buf.len()).filter(|&i| buf[i] != frame[i]).collect();
            assert!(changed.len() <= 4, "clamping changed bytes {changed:?}");
        }
        _ => assert_eq!(buf, frame, "not clamped but changed"),
    }
});
