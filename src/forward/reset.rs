//! An RST in answer to a segment, written over that segment in place: to a client
//! when a service has no real server able to take a new connection and is set to
//! fail fast (`all_down = "rst"`), so it gets "connection refused" at once instead of
//! resending SYNs into silence; and by the SYN proxy, to a client whose cookie ACK
//! cannot be placed, or to a real server answering the proxied SYN with an ACK of an
//! older connection.
//!
//! RFC 9293 §3.10.7.1: to a segment without ACK, the RST has sequence number 0 and
//! acknowledges the segment (SYN counts one); to a segment with ACK, the RST takes
//! its sequence number from that ACK.
use crate::flow::parse::Parsed;
use crate::model::DropReason;
use crate::wire::ethernet::{self, MacAddr};
use crate::wire::tcp::{self, TcpFlags};
use crate::wire::{ipv4, IpProtocol};

/// Turns the TCP segment of `frame` into an RST back to its sender, from `port_mac`,
/// VLAN tags kept. Returns the new frame length (headers only, no payload).
pub fn answer_with_rst(
    frame: &mut [u8],
    parsed: &Parsed,
    port_mac: MacAddr,
) -> Result<usize, DropReason> {
    let seg = segment(frame, parsed)?;
    let flags = seg.flags();
    let mut consumed = seg.payload().len() as u32;
    if flags.contains(TcpFlags::SYN) {
        consumed += 1;
    }
    if flags.contains(TcpFlags::FIN) {
        consumed += 1;
    }
    let (seq, ack, rst_flags) = if flags.contains(TcpFlags::ACK) {
        (seg.ack_number(), 0, TcpFlags::RST)
    } else {
        (
            0,
            seg.seq_number().wrapping_add(consumed),
            TcpFlags::RST | TcpFlags::ACK,
        )
    };
    write_rst(frame, parsed, port_mac, seq, ack, rst_flags)
}

/// Turns the TCP segment of `frame` into an RST without ACK back to its sender at
/// sequence number `seq`, from `port_mac`: for a segment whose ACK field is not what
/// its sender expects the reset at (the SYN proxy rewrote the cookie ACK into the SYN
/// to the real server, which acknowledges nothing). Returns the new frame length.
pub fn reset_sender_at(
    frame: &mut [u8],
    parsed: &Parsed,
    port_mac: MacAddr,
    seq: u32,
) -> Result<usize, DropReason> {
    segment(frame, parsed)?;
    write_rst(frame, parsed, port_mac, seq, 0, TcpFlags::RST)
}

fn segment<'a>(frame: &'a [u8], parsed: &Parsed) -> Result<tcp::Packet<&'a [u8]>, DropReason> {
    tcp::Packet::new_checked(
        frame
            .get(parsed.l4..parsed.ip_end())
            .ok_or(DropReason::Truncated)?,
    )
    .map_err(|_| DropReason::Truncated)
}

fn write_rst(
    frame: &mut [u8],
    parsed: &Parsed,
    port_mac: MacAddr,
    seq: u32,
    ack: u32,
    rst_flags: TcpFlags,
) -> Result<usize, DropReason> {
    let (sport, dport) = {
        let seg = segment(frame, parsed)?;
        (seg.src_port(), seg.dst_port())
    };
    let ip = ipv4::Packet::new_checked(&frame[parsed.l3..]).map_err(|_| DropReason::Truncated)?;
    let (client, vip) = (ip.src_addr(), ip.dst_addr());
    let l4 = parsed.l3 + ipv4::MIN_HEADER_LEN;
    let end = l4 + tcp::MIN_HEADER_LEN;
    if end > frame.len() {
        return Err(DropReason::Truncated);
    }
    let client_mac = ethernet::Frame::new_unchecked(&*frame).src_addr();
    crate::forward::dr::forward(frame, client_mac, port_mac)?;
    ipv4::Repr {
        src_addr: vip,
        dst_addr: client,
        protocol: IpProtocol::TCP,
        payload_len: tcp::MIN_HEADER_LEN,
        ttl: ipv4::DEFAULT_TTL,
    }
    .emit(&mut ipv4::Packet::new_unchecked(&mut frame[parsed.l3..end]));
    let mut out = tcp::Packet::new_unchecked(&mut frame[l4..end]);
    out.set_src_port(dport);
    out.set_dst_port(sport);
    out.set_seq_number(seq);
    out.set_ack_number(ack);
    out.set_header_len(tcp::MIN_HEADER_LEN);
    out.set_flags(rst_flags);
    out.set_window_len(0);
    out.set_urgent_at(0);
    out.fill_checksum(vip, client);
    Ok(end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::flow::parse::classify;
    use crate::health::probe::{parse_segment, write_segment, Endpoints, MAX_FRAME_LEN};
    use std::net::{Ipv4Addr, SocketAddrV4};

    const OUR_MAC: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 1]);
    const CLIENT_MAC: MacAddr = MacAddr([0x02, 0, 0, 0, 0, 2]);

    fn segment(flags: TcpFlags, seq: u32, ack: u32, payload: &[u8]) -> Vec<u8> {
        let ends = Endpoints {
            local: SocketAddrV4::new(Ipv4Addr::new(198, 18, 2, 100), 40000).into(),
            remote: SocketAddrV4::new(Ipv4Addr::new(198, 18, 1, 1), 80).into(),
        };
        let mut buf = [0u8; MAX_FRAME_LEN];
        let n = write_segment(&mut buf, &ends, seq, ack, flags, Some(1460), payload);
        let mut f = buf[..n].to_vec();
        f[0..6].copy_from_slice(&OUR_MAC.0);
        f[6..12].copy_from_slice(&CLIENT_MAC.0);
        f
    }

    #[test]
    fn a_syn_gets_rst_ack_acknowledging_it() {
        let mut f = segment(TcpFlags::SYN, 1000, 0, &[]);
        let parsed = classify(&f).unwrap();
        let n = answer_with_rst(&mut f, &parsed, OUR_MAC).unwrap();
        let rst = parse_segment(&f[..n]).expect("valid checksums");
        assert_eq!(rst.flags, TcpFlags::RST | TcpFlags::ACK);
        assert_eq!((rst.seq, rst.ack), (0, 1001));
        assert_eq!(
            rst.from,
            SocketAddrV4::new(Ipv4Addr::new(198, 18, 1, 1), 80).into()
        );
        assert_eq!(
            rst.to,
            SocketAddrV4::new(Ipv4Addr::new(198, 18, 2, 100), 40000).into()
        );
        assert_eq!(&f[0..6], &CLIENT_MAC.0);
        assert_eq!(&f[6..12], &OUR_MAC.0);
        assert_eq!(n, 54);
    }

    #[test]
    fn a_segment_with_ack_gets_an_rst_at_its_ack_number() {
        let mut f = segment(
            TcpFlags::ACK | TcpFlags::PSH,
            5,
            777,
            b"GET / HTTP/1.0\r\n\r\n",
        );
        let parsed = classify(&f).unwrap();
        let n = answer_with_rst(&mut f, &parsed, OUR_MAC).unwrap();
        let rst = parse_segment(&f[..n]).unwrap();
        assert_eq!(rst.flags, TcpFlags::RST);
        assert_eq!(rst.seq, 777);
        assert!(rst.payload.is_empty());
    }

    #[test]
    fn a_reset_at_a_given_number_has_no_ack() {
        let mut f = segment(TcpFlags::SYN, 1000, 0, &[]);
        let parsed = classify(&f).unwrap();
        let n = reset_sender_at(&mut f, &parsed, OUR_MAC, 0xdead_beef).unwrap();
        let rst = parse_segment(&f[..n]).expect("valid checksums");
        assert_eq!(rst.flags, TcpFlags::RST);
        assert_eq!((rst.seq, rst.ack), (0xdead_beef, 0));
        assert_eq!(
            rst.to,
            SocketAddrV4::new(Ipv4Addr::new(198, 18, 2, 100), 40000).into()
        );
        assert_eq!(&f[0..6], &CLIENT_MAC.0);
    }
}
