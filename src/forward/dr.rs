//! Direct routing (`ipvsadm -g`): the frame goes to the real server's MAC with the IP
//! packet untouched, VIP still its destination. The real server holds the VIP on `lo`
//! (with `arp_ignore=1`, `arp_announce=2`, so it neither answers nor announces it) and
//! replies to the client directly.
//!
//! The same MAC rewrite addresses the next hop in every other mode after its L3 work.

use crate::model::DropReason;
use crate::wire::ethernet::{self, MacAddr};

/// Rewrites the Ethernet destination to `dst_mac` (the real server or next hop) and
/// the source to `src_mac` (our port's). VLAN tags, IP header and payload are left as
/// they are. `Err(Truncated)` if the frame is shorter than an Ethernet header.
#[inline]
pub fn forward(frame: &mut [u8], dst_mac: MacAddr, src_mac: MacAddr) -> Result<(), DropReason> {
    let mut eth = ethernet::Frame::new_checked(frame).map_err(|_| DropReason::Truncated)?;
    eth.set_dst_addr(dst_mac);
    eth.set_src_addr(src_mac);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::parse::classify;
    use crate::wire::test_util::XorShift;

    const RS_MAC: MacAddr = MacAddr([0x52, 0x54, 0x00, 0x00, 0x00, 0x0b]);
    const OUR_MAC: MacAddr = MacAddr([0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c]);

    // 802.1Q VLAN 100: TCP SYN 198.51.100.10:40000 -> 203.0.113.10:80 (scapy), padded.
    static VLAN_SYN: [u8; 64] = [
        0x00, 0x1b, 0x21, 0x0a, 0x0b, 0x0c, 0x52, 0x54, 0x00, 0x12, 0x34, 0x56, 0x81, 0x00, 0x00,
        0x64, 0x08, 0x00, 0x45, 0x00, 0x00, 0x28, 0x00, 0x01, 0x00, 0x00, 0x40, 0x06, 0x14, 0x87,
        0xc6, 0x33, 0x64, 0x0a, 0xcb, 0x00, 0x71, 0x0a, 0x9c, 0x40, 0x00, 0x50, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00, 0x00, 0x50, 0x02, 0x20, 0x00, 0x8d, 0x09, 0x00, 0x00, 0x00, 0x00,
        0x00, 0x00, 0x00, 0x00,
    ];

    #[test]
    fn only_macs_change() {
        let before = classify(&VLAN_SYN).unwrap();
        let mut buf = VLAN_SYN;
        forward(&mut buf, RS_MAC, OUR_MAC).unwrap();
        assert_eq!(buf[..6], RS_MAC.0);
        assert_eq!(buf[6..12], OUR_MAC.0);
        assert_eq!(buf[12..], VLAN_SYN[12..], "tags, IP and TCP untouched");
        assert_eq!(classify(&buf).unwrap(), before);
    }

    #[test]
    fn short_frames_are_errors() {
        for len in 0..14 {
            let mut buf = VLAN_SYN;
            assert_eq!(
                forward(&mut buf[..len], RS_MAC, OUR_MAC),
                Err(DropReason::Truncated)
            );
            assert_eq!(buf, VLAN_SYN);
        }
        let mut header_only = [0u8; 14];
        forward(&mut header_only, RS_MAC, OUR_MAC).unwrap();
    }

    #[test]
    fn fuzz_never_panics() {
        let mut rng = XorShift(0xd1d1_0707_3c3c_9999);
        let mut buf = [0u8; 80];
        for _ in 0..10_000 {
            let len = rng.below(buf.len() + 1);
            rng.fill(&mut buf[..len]);
            let tail = buf[14.min(len)..len].to_vec();
            let ok = forward(&mut buf[..len], RS_MAC, OUR_MAC).is_ok();
            assert_eq!(ok, len >= 14);
            assert_eq!(buf[14.min(len)..len], tail[..]);
        }
    }
}
