#!/usr/bin/python3
"""Golden-packet fixtures for Sluice's forwarding core: DR, NAT and TUN, TCP and UDP.

    golden_forwarding.py make IN_PCAP EXPECT_JSON
        Writes IN_PCAP (the frames a client and three real servers send to the
        appliance, built with scapy) and EXPECT_JSON: the services config (TOML, for
        the daemon), every expected output frame in order with the fields it must
        carry, and the expected drop and event counters.

    golden_forwarding.py check IN_PCAP OUT_PCAP EXPECT_JSON [SUMMARY_JSON]
        Decodes OUT_PCAP (what Sluice transmitted) with scapy AND with tshark (IPv4,
        TCP and UDP checksum validation on; ICMP is always validated) and checks that it
        is exactly the expected frames, in order, nothing else: bytes (with the few
        fields Sluice may choose, like the outer IP id of a tunnel, as wildcards), every
        rewritten field by name, every checksum at every layer. ARP requests from Sluice
        for a real server's address are the one kind of extra frame allowed (and
        counted). Writes SUMMARY_JSON ({"arp_requests": N, "outputs": N}) for the
        counter checks. Exit 0 when everything matches, 1 with a report otherwise.

    golden_forwarding.py selftest DIR
        Proves the checker: the expected frames themselves must pass, and each of a
        set of broken outputs (a flipped payload byte, a wrong TTL, a missing or an
        extra frame, two frames swapped, a rewritten port off by one) must fail.

Run with /usr/bin/python3 (Debian's scapy). The appliance is 02:53:4c:00:00:01 /
198.18.0.1/24, as in golden_arp_icmp.py, whose helpers this tool reuses.

The contract encoded here (see docs/TESTING.md, "Golden forwarding"):
  * DR: only the Ethernet addresses change (dst = the real server's MAC, src = ours).
  * NAT in: destination VIP:vport -> RIP:rport, IPv4 and TCP/UDP checksums valid, TTL
    untouched, Ethernet dst = the real server. NAT out (the real server's reply, sent
    to our MAC): source RIP:rport -> VIP:vport, Ethernet dst = the client. A UDP
    checksum of 0 stays 0.
  * TUN: IPv4-in-IPv4 (protocol 4): outer src = 198.18.0.1, dst = RIP, TTL 64, TOS
    and DF copied from the inner packet, outer id free; the inner packet byte for byte.
  * TUN, inner packet with DF and inner length + 20 > MTU 1500: ICMP 3/4 to the client
    with next-hop MTU 1480 quoting the IP header + 8 bytes; the packet is dropped
    (too_big). Without DF: dropped (too_big), nothing sent.
  * ICMP errors quoting a NAT session's packet are translated (outer address, quoted
    address and port, checksums); for DR/TUN they go where the session's packets go.
  * Ethernet padding of a forwarded frame may be kept or trimmed (DR, NAT).
  * A DR or TUN real server that announces a new MAC (an ARP reply) gets its
    sessions' next packets at the new MAC.
  * Port reuse (IPVS conn_reuse): a SYN (no ACK/RST) on the tuple of a TCP session in
    TIME_WAIT/CLOSE (DR/TUN: also FIN_WAIT) retires it (sessions_expired) and is
    scheduled afresh (rr: the next real server); on an ESTABLISHED session it follows
    the session and takes no scheduler pick. A NAT SYN whose reply tuple (RIP:rport ->
    client:port) a session of another VIP holds is dropped (nat_tuple_in_use).
"""

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

try:
    from scapy.all import (  # noqa: E402
        ARP,
        Ether,
        ICMP,
        IP,
        IPerror,
        IPOption_NOP,
        IPOption_Router_Alert,
        Raw,
        RawPcapWriter,
        TCP,
        TCPerror,
        UDP,
        UDPerror,
        rdpcap,
    )
    from scapy.utils import checksum as inet_checksum  # noqa: E402
except ImportError as e:  # pragma: no cover
    sys.exit(f"golden_forwarding.py: scapy not importable ({e}); run with /usr/bin/python3 "
             "after scripts/setup.sh (python3-scapy)")

import golden_arp_icmp as base  # noqa: E402  (the ARP/ICMP golden tool: shared helpers)
from golden_arp_icmp import Report, arp_request, echo_request, field_diff, payload  # noqa: E402

OUR_MAC = base.OUR_MAC
OUR_IP = base.OUR_IP
MTU = 1500

CLIENT_MAC, CLIENT_IP = "02:00:00:00:01:00", "198.18.0.100"
# mode -> (VIP, real server IP, real server MAC, TCP real port, UDP real port)
VIP_TCP_PORT = 80
VIP_UDP_PORT = 3333
MODES = {
    "dr": ("198.18.0.210", "198.18.0.11", "02:00:00:00:00:11", 80, 3333),
    "nat": ("198.18.0.220", "198.18.0.12", "02:00:00:00:00:12", 8080, 4444),
    "tun": ("198.18.0.230", "198.18.0.13", "02:00:00:00:00:13", 80, 3333),
}
# Two more NAT TCP services (VIP port 80, real port 8080): one with rr over two real
# servers, for port reuse after a finished connection (IPVS conn_reuse); one whose only
# real server is the NAT real server above, for the NAT reply-tuple conflict.
RR_VIP = "198.18.0.221"
RR_SERVERS = [("198.18.0.14", "02:00:00:00:00:14"), ("198.18.0.15", "02:00:00:00:00:15")]  # rr order
SHARED_VIP = "198.18.0.222"
NAT_TCP_RPORT = MODES["nat"][3]
RIPS = [m[1] for m in MODES.values()] + [ip for ip, _ in RR_SERVERS]
RS_MACS = {**{m[1]: m[2] for m in MODES.values()}, **dict(RR_SERVERS)}
# The MACs the DR and TUN real servers move to before the last frames (a NIC swapped,
# a VM migrated): their sessions' packets must follow.
MOVED_MACS = {"dr": "02:00:00:01:00:11", "tun": "02:00:00:01:00:13"}

# Every drop reason `sluicectl status --json` reports (all compared, zeros included).
DROP_REASONS = base.DROP_REASONS + [
    "ipv4_options", "bad_tcp_header", "bad_udp_header", "tcp_no_session",
    "no_real_server", "session_table_full", "neighbour_unresolved", "no_service", "too_big",
    "icmp_error_no_session", "icmp_error_misaddressed", "nat_tuple_in_use",
    "icmp_too_big_about_udp",
]


def mac_bytes(mac):
    return bytes.fromhex(mac.replace(":", ""))


def ip_bytes(ip):
    return bytes(int(x) for x in ip.split("."))


def ip_len(raw):
    return int.from_bytes(raw[16:18], "big")


def strip_pad(raw):
    """The frame without Ethernet padding (untagged IPv4 frames only)."""
    return raw[:14 + ip_len(raw)]


def with_macs(raw, dst, src):
    return mac_bytes(dst) + mac_bytes(src) + raw[12:]


def pad(raw, to):
    return raw + b"\x00" * max(0, to - len(raw))


def frame(ip_layer, src_mac=CLIENT_MAC, dst_mac=OUR_MAC, pad_to=0):
    raw = bytes(Ether(src=src_mac, dst=dst_mac) / ip_layer)
    return pad(raw, pad_to)


def tcp(src, sport, dst, dport, flags, seq, ack=0, data=b"", ip_id=1, ttl=64, tos=0, df=True,
        options=None, window=64240, src_mac=CLIENT_MAC, pad_to=0, ip_options=None, **tcp_fields):
    ip = IP(src=src, dst=dst, id=ip_id, ttl=ttl, tos=tos, flags="DF" if df else 0)
    if ip_options is not None:
        ip.options = ip_options
    seg = TCP(sport=sport, dport=dport, flags=flags, seq=seq, ack=ack, window=window,
              options=options or [], **tcp_fields)
    pkt = ip / seg / Raw(data) if data else ip / seg
    return frame(pkt, src_mac=src_mac, pad_to=pad_to)


def udp(src, sport, dst, dport, data, ip_id=1, ttl=64, tos=0, df=True, chksum=None,
        src_mac=CLIENT_MAC, pad_to=0, ip_options=None, frag=0, mf=False, **udp_fields):
    flags = (0x2 if df else 0) | (0x1 if mf else 0)
    ip = IP(src=src, dst=dst, id=ip_id, ttl=ttl, tos=tos, flags=flags, frag=frag)
    if ip_options is not None:
        ip.options = ip_options
    u = UDP(sport=sport, dport=dport, **udp_fields)
    if chksum is not None:
        u.chksum = chksum
    return frame(ip / u / Raw(data), src_mac=src_mac, pad_to=pad_to)


def icmp_error(src, dst, icmp_type, code, quoted_ip, src_mac=CLIENT_MAC, ttl=64, ip_id=7, df=False,
               mtu=0):
    """An ICMP error quoting the first IHL + 8 bytes of `quoted_ip` (an IP packet);
    `mtu`: a frag-needed's next-hop MTU."""
    ihl = (quoted_ip[0] & 0x0F) * 4
    ip = IP(src=src, dst=dst, ttl=ttl, id=ip_id, flags="DF" if df else 0)
    message = ICMP(type=icmp_type, code=code, nexthopmtu=mtu)
    return frame(ip / message / Raw(quoted_ip[:ihl + 8]), src_mac=src_mac)


def arp_reply_from(rs_mac, rs_ip):
    """The real server's answer to a who-has from us (Sluice learns it)."""
    return bytes(Ether(src=rs_mac, dst=OUR_MAC) / ARP(op=2, hwsrc=rs_mac, psrc=rs_ip,
                                                      hwdst=OUR_MAC, pdst=OUR_IP))


def ipv4_checksum_fixed(b, off):
    """b with the IPv4 header at `off` carrying a freshly computed checksum."""
    b = bytearray(b)
    ihl = (b[off] & 0x0F) * 4
    b[off + 10:off + 12] = b"\x00\x00"
    b[off + 10:off + 12] = inet_checksum(bytes(b[off:off + ihl])).to_bytes(2, "big")
    return bytes(b)


# ----------------------------------------------------------------------------------
# Expected outputs, computed from the input frames independently of the daemon.


def out(kind, name, alts, eth_dst, fields, wild=(), ipsum=(), zero_eq=()):
    """One expected output frame. alts: acceptable byte strings (e.g. with and without
    the input's Ethernet padding). wild: [(offset, length, what, allowed hex values or
    None)] copied from the actual frame before comparing, then the IPv4 header
    checksums at `ipsum` offsets are recomputed. zero_eq: offsets of 16-bit checksum
    fields where 0x0000 and 0xffff are both accepted (both are zero in one's
    complement). fields: {"Layer[#n].field": value} checked on scapy's decoding."""
    return {"kind": kind, "name": name, "alts": [a.hex() for a in alts], "eth_dst": eth_dst,
            "eth_src": OUR_MAC, "fields": fields,
            "wild": [{"off": o, "len": n, "what": w, "allowed": al} for o, n, w, al in wild],
            "ipsum": list(ipsum), "zero_eq": list(zero_eq)}


def padding_alts(raw):
    body = strip_pad(raw)
    return [raw] if body == raw else [raw, body]


def ip_fields(raw, prefix="IP"):
    """The IPv4 fields a forwarder must not touch (from the input frame)."""
    p = Ether(strip_pad(raw))[IP]
    return {f"{prefix}.ttl": p.ttl, f"{prefix}.id": p.id, f"{prefix}.tos": p.tos,
            f"{prefix}.flags": int(p.flags), f"{prefix}.len": p.len, f"{prefix}.proto": p.proto}


def l4_zero_eq(raw):
    """Offset of a TCP checksum (0/0xffff equivalence is fine there; for UDP 0 means
    'no checksum', so it is not)."""
    p = Ether(strip_pad(raw))
    if TCP in p:
        return [14 + p[IP].ihl * 4 + 16]
    return []


def expect_dr(name, raw, mode, rs_mac=None):
    _, rip, first_mac, _, _ = MODES[mode]
    rs_mac = rs_mac or first_mac
    p = Ether(strip_pad(raw))[IP]
    fields = {"IP.src": p.src, "IP.dst": p.dst, **ip_fields(raw)}
    return out("dr", name, [with_macs(a, rs_mac, OUR_MAC) for a in padding_alts(raw)], rs_mac, fields)


def nat_rewrite(raw, src=None, sport=None, dst=None, dport=None):
    """The frame with its addresses/ports changed and every checksum computed afresh by
    scapy (not incrementally), padding alternatives included."""
    body = strip_pad(raw)
    padding = raw[len(body):]
    p = Ether(body)
    assert bytes(p) == body, "scapy does not round-trip the frame"
    ip = p[IP]
    l4 = p[TCP] if TCP in p else p[UDP]
    if src is not None:
        ip.src = src
    if dst is not None:
        ip.dst = dst
    if sport is not None:
        l4.sport = sport
    if dport is not None:
        l4.dport = dport
    del ip.chksum
    if not (isinstance(l4, UDP) and l4.chksum == 0):
        del l4.chksum  # scapy writes 0xffff for a computed UDP 0
    new = bytes(p)
    return [new + padding, new] if padding else [new]


def expect_nat_in(name, raw, rip=None):
    """raw DNATed towards rip (default: the NAT mode's real server) at the real port of
    its protocol."""
    _, nat_rip, _, tport, uport = MODES["nat"]
    rip = rip or nat_rip
    rs_mac = RS_MACS[rip]
    p = Ether(strip_pad(raw))
    is_tcp = TCP in p
    l4 = "TCP" if is_tcp else "UDP"
    rport = tport if is_tcp else uport
    alts = [with_macs(a, rs_mac, OUR_MAC) for a in nat_rewrite(raw, dst=rip, dport=rport)]
    fields = {"IP.src": p[IP].src, "IP.dst": rip, f"{l4}.sport": p[l4].sport, f"{l4}.dport": rport,
              **ip_fields(raw)}
    if not is_tcp and p[UDP].chksum == 0:
        fields["UDP.chksum"] = 0
    return out("nat-in", name, alts, rs_mac, fields, zero_eq=[24] + l4_zero_eq(raw))


def expect_nat_out(name, raw, vip=None):
    """A real server's reply SNATed to vip (default: the NAT mode's VIP)."""
    vip = vip or MODES["nat"][0]
    p = Ether(strip_pad(raw))
    is_tcp = TCP in p
    l4 = "TCP" if is_tcp else "UDP"
    vport = VIP_TCP_PORT if is_tcp else VIP_UDP_PORT
    alts = [with_macs(a, CLIENT_MAC, OUR_MAC) for a in nat_rewrite(raw, src=vip, sport=vport)]
    fields = {"IP.src": vip, "IP.dst": p[IP].dst, f"{l4}.sport": vport, f"{l4}.dport": p[l4].dport,
              **ip_fields(raw)}
    return out("nat-out", name, alts, CLIENT_MAC, fields, zero_eq=[24] + l4_zero_eq(raw))


def expect_tun(name, raw, rs_mac=None):
    _, rip, first_mac, _, _ = MODES["tun"]
    rs_mac = rs_mac or first_mac
    inner = strip_pad(raw)[14:]
    tos = inner[1]
    df = inner[6] & 0x40
    hdr = bytearray(20)
    hdr[0] = 0x45
    hdr[1] = tos
    hdr[2:4] = (len(inner) + 20).to_bytes(2, "big")
    hdr[4:6] = b"\x00\x00"  # identification: Sluice's choice (wildcard)
    hdr[6] = df
    hdr[8] = 64
    hdr[9] = 4
    hdr[12:16] = ip_bytes(OUR_IP)
    hdr[16:20] = ip_bytes(rip)
    raw_out = ipv4_checksum_fixed(mac_bytes(rs_mac) + mac_bytes(OUR_MAC) + b"\x08\x00" + bytes(hdr) + inner, 14)
    ip_in = Ether(raw)[IP]
    fields = {"IP.version": 4, "IP.ihl": 5, "IP.tos": tos, "IP.len": len(inner) + 20,
              "IP.flags": 2 if df else 0, "IP.frag": 0, "IP.ttl": 64, "IP.proto": 4,
              "IP.src": OUR_IP, "IP.dst": rip, "IP#2.src": ip_in.src, "IP#2.dst": ip_in.dst,
              "IP#2.ttl": ip_in.ttl, "IP#2.id": ip_in.id, "inner_ip_hex": inner.hex()}
    return out("tun", name, [raw_out], rs_mac, fields,
               wild=[(18, 2, "outer ip.id", None)], ipsum=[14])


def expect_frag_needed(name, raw, vip):
    body = strip_pad(raw)
    ipb = body[14:]
    ihl = (ipb[0] & 0x0F) * 4
    quote = ipb[:ihl + 8]
    next_hop = MTU - 20
    msg = bytearray(bytes([3, 4, 0, 0, 0, 0]) + next_hop.to_bytes(2, "big") + quote)
    msg[2:4] = inet_checksum(bytes(msg)).to_bytes(2, "big")
    hdr = bytearray(20)
    hdr[0] = 0x45
    hdr[1] = 0xC0
    hdr[2:4] = (20 + len(msg)).to_bytes(2, "big")
    hdr[6] = 0x40
    hdr[8] = 64
    hdr[9] = 1
    # From the VIP the packet was sent to, as IPVS's host stack answers (a port
    # address may be private, and the client's filters expect the VIP).
    hdr[12:16] = ip_bytes(vip)
    hdr[16:20] = ip_bytes(Ether(raw)[IP].src)
    src_mac = ":".join(f"{b:02x}" for b in raw[6:12])
    raw_out = ipv4_checksum_fixed(mac_bytes(src_mac) + mac_bytes(OUR_MAC) + b"\x08\x00" + bytes(hdr) + bytes(msg), 14)
    fields = {"IP.dst": Ether(raw)[IP].src, "IP.proto": 1, "IP.ttl": 64, "IP.frag": 0,
              "ICMP.type": 3, "ICMP.code": 4, "ICMP.nexthopmtu": next_hop,
              "quote_hex": quote.hex()}
    return out("frag-needed", name, [raw_out], src_mac, fields,
               wild=[(15, 1, "ip.tos", None), (18, 2, "ip.id", None),
                     (20, 2, "ip.flags+offset (DF or not, offset 0)", ["4000", "0000"])],
               ipsum=[14])


def translate_icmp(raw, outer_src=None, outer_dst=None, new_quote=None):
    """An ICMP error with its outer addresses changed and its quote replaced; IPv4 and
    ICMP checksums recomputed."""
    b = bytearray(raw)
    if outer_src:
        b[26:30] = ip_bytes(outer_src)
    if outer_dst:
        b[30:34] = ip_bytes(outer_dst)
    qoff = 14 + 20 + 8
    assert len(new_quote) == len(b) - qoff
    b[qoff:] = new_quote
    b[36:38] = b"\x00\x00"
    b[36:38] = inet_checksum(bytes(b[34:])).to_bytes(2, "big")
    return ipv4_checksum_fixed(bytes(b), 14)


def expect_icmp_nat(name, raw, towards, quote_alts, quote_fields):
    """towards: "client" (outer src RIP -> VIP) or "rs" (outer dst VIP -> RIP). quote_alts:
    the acceptable quoted bytes (L4 checksum inside the quote updated or left as it
    was)."""
    vip, rip, rs_mac, _, _ = MODES["nat"]
    alts = []
    for q in quote_alts:
        if towards == "client":
            t = translate_icmp(raw, outer_src=vip, new_quote=q)
            alts.append(with_macs(t, CLIENT_MAC, OUR_MAC))
        else:
            t = translate_icmp(raw, outer_dst=rip, new_quote=q)
            alts.append(with_macs(t, rs_mac, OUR_MAC))
    p = Ether(raw)
    fields = {"IP.src": vip if towards == "client" else p[IP].src,
              "IP.dst": p[IP].dst if towards == "client" else rip,
              "IP.ttl": p[IP].ttl, "IP.id": p[IP].id, "ICMP.type": p[ICMP].type, "ICMP.code": p[ICMP].code,
              **quote_fields}
    return out("icmp-nat", name, alts, CLIENT_MAC if towards == "client" else rs_mac, fields,
               zero_eq=[24, 36, 14 + 20 + 8 + 10])


def quote_of(ip_packet):
    ihl = (ip_packet[0] & 0x0F) * 4
    return ip_packet[:ihl + 8]


def with_quoted_l4_checksum(quote, from_quote):
    """quote with the quoted UDP checksum (bytes 6..8 after the quoted IP header) taken
    from from_quote."""
    ihl = (quote[0] & 0x0F) * 4
    q = bytearray(quote)
    q[ihl + 6:ihl + 8] = from_quote[ihl + 6:ihl + 8]
    return bytes(q)


# ----------------------------------------------------------------------------------
# The input: (name, frame, drop reason or None, [expected outputs])


def services_toml():
    t = ["[timeouts]"]
    # Long enough that nothing expires while the test runs: the session count is exact.
    for k in ("tcp", "tcpfin", "udp", "syn_recv", "syn_sent", "time_wait", "close", "close_wait", "last_ack"):
        t.append(f"{k} = 600")
    t.append("")
    for mode, (vip, rip, _, tport, uport) in MODES.items():
        for proto, vport, rport in (("tcp", VIP_TCP_PORT, tport), ("udp", VIP_UDP_PORT, uport)):
            t += ["[[services]]", f'proto = "{proto}"', f'vip = "{vip}"', f"port = {vport}",
                  'scheduler = "rr"', "", "  [[services.real_servers]]", f'  ip = "{rip}"',
                  f"  port = {rport}", "  weight = 1", f'  mode = "{mode}"', ""]
    for vip, rips in ((RR_VIP, [ip for ip, _ in RR_SERVERS]), (SHARED_VIP, [MODES["nat"][1]])):
        t += ["[[services]]", 'proto = "tcp"', f'vip = "{vip}"', f"port = {VIP_TCP_PORT}", 'scheduler = "rr"', ""]
        for rip in rips:
            t += ["  [[services.real_servers]]", f'  ip = "{rip}"', f"  port = {NAT_TCP_RPORT}", "  weight = 1",
                  '  mode = "nat"', ""]
    return "\n".join(t)


def http_request(host):
    return f"GET / HTTP/1.1\r\nHost: {host}\r\nUser-Agent: golden\r\n\r\n".encode()


def http_response(name):
    body = f"{name}\n".encode()
    return b"HTTP/1.1 200 OK\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body


def build():
    """The input frames, and the sessions ledger: per (VIP, RIP), the sessions created,
    those retired by a new SYN on their tuple, and those ESTABLISHED at the end."""
    F = []  # (name, raw, drop, outputs)
    ledger = {}

    def entry(key):
        return ledger.setdefault(key, {"connections": 0, "retired": 0, "active": 0})

    def fwd(name, raw, expect, opens=False, retires=None, active=False):
        """opens: the frame creates a session (counted on the real server it goes to);
        retires: (VIP, RIP) of the finished session it replaces; active: the session it
        creates is ESTABLISHED when the input ends."""
        outs = [expect(name, raw)]
        F.append((name, raw, None, outs))
        if opens:
            e = entry(session_of(raw, outs, None))
            e["connections"] += 1
            e["active"] += int(active)
        if retires:
            entry(retires)["retired"] += 1

    def drop(name, raw, reason):
        F.append((name, raw, reason, []))

    mss = [("MSS", 1460), ("SAckOK", b""), ("Timestamp", (1000, 0)), ("NOP", None), ("WScale", 7)]
    c = CLIENT_IP
    vdr, vnat, vtun = MODES["dr"][0], MODES["nat"][0], MODES["tun"][0]
    rip_nat, nat_rs_mac = MODES["nat"][1], MODES["nat"][2]

    # --- neighbours: the real servers answer Sluice's who-has (learned, dropped) ----
    for mode, (_, rip, rs_mac, _, _) in MODES.items():
        drop(f"ARP reply from the {mode} real server", arp_reply_from(rs_mac, rip), "arp_reply")
    for rip, rs_mac in RR_SERVERS:
        drop(f"ARP reply from the rr real server {rip}", arp_reply_from(rs_mac, rip), "arp_reply")
    # --- the client resolves Sluice and every VIP, and pings two of them -------------
    for target in (OUR_IP, vdr, vnat, vtun):
        raw = arp_request(CLIENT_MAC, c, target)
        F.append((f"client who-has {target}", raw, None,
                  [out("arp-reply", f"is-at for {target}", [base.expected_arp_reply(raw)], CLIENT_MAC,
                       {"ARP.op": 2, "ARP.hwsrc": OUR_MAC, "ARP.psrc": target, "ARP.hwdst": CLIENT_MAC,
                        "ARP.pdst": c})]))
    for target in (vdr, OUR_IP):
        raw = echo_request(CLIENT_MAC, c, dst_ip=target, size=24, seq=1, seed=3)
        F.append((f"echo to {target}", raw, None,
                  [out("echo-reply", f"echo reply from {target}", [base.expected_echo_reply(raw)], CLIENT_MAC,
                       {"IP.src": target, "IP.dst": c, "ICMP.type": 0, "IP.ttl": 64})]))

    # --- DR, TCP: handshake, data, FIN (only client -> server passes Sluice) ---------
    cp = 40001
    fwd("DR TCP SYN", tcp(c, cp, vdr, 80, "S", 1000, options=mss, ip_id=101), lambda n, r: expect_dr(n, r, "dr"),
        opens=True)
    drop("runt: Ethernet + 12 bytes of IPv4 to the DR VIP",
         tcp(c, cp, vdr, 80, "S", 1000)[:14 + 12], "truncated")
    fwd("DR TCP ACK of the SYN-ACK (padded to 60)", tcp(c, cp, vdr, 80, "A", 1001, 5001, ip_id=102, pad_to=60),
        lambda n, r: expect_dr(n, r, "dr"))
    fwd("DR TCP request", tcp(c, cp, vdr, 80, "PA", 1001, 5001, data=http_request(vdr), ip_id=103),
        lambda n, r: expect_dr(n, r, "dr"))
    fwd("DR TCP ACK of the response", tcp(c, cp, vdr, 80, "A", 1001 + len(http_request(vdr)), 5100, ip_id=104),
        lambda n, r: expect_dr(n, r, "dr"))
    fwd("DR TCP FIN from the client",
        tcp(c, cp, vdr, 80, "FA", 1001 + len(http_request(vdr)), 5100, ip_id=105), lambda n, r: expect_dr(n, r, "dr"))
    fwd("DR TCP last ACK", tcp(c, cp, vdr, 80, "A", 1002 + len(http_request(vdr)), 5101, ip_id=106),
        lambda n, r: expect_dr(n, r, "dr"))
    # The session is in FIN_WAIT, and DR sees only the client side: a new SYN on the
    # same port retires it and opens a new connection (one real server: the same one).
    fwd("DR TCP SYN reusing the port of the connection in FIN_WAIT",
        tcp(c, cp, vdr, 80, "S", 6000, options=mss, ip_id=107), lambda n, r: expect_dr(n, r, "dr"),
        opens=True, retires=(vdr, MODES["dr"][1]))
    # --- DR, UDP -----------------------------------------------------------------------
    dr_udp = udp(c, 40002, vdr, VIP_UDP_PORT, b"dr udp request " + payload(21, 1), ip_id=201)
    fwd("DR UDP request", dr_udp, lambda n, r: expect_dr(n, r, "dr"), opens=True)
    fwd("DR UDP second datagram, TOS 0xb8, no DF",
        udp(c, 40002, vdr, VIP_UDP_PORT, b"again", ip_id=202, tos=0xB8, df=False, pad_to=60),
        lambda n, r: expect_dr(n, r, "dr"))
    # The client rejects the real server's direct reply (VIP:3333 -> client:40002).
    dr_reply = bytes(IP(src=vdr, dst=c, id=9, flags="DF") / UDP(sport=VIP_UDP_PORT, dport=40002) / Raw(b"reply"))
    fwd("DR ICMP time-exceeded about the session's reply",
        icmp_error(c, vdr, 11, 0, dr_reply), lambda n, r: expect_dr(n, r, "dr"))
    # In DR the real server's replies bypass Sluice (fragments too): a frag-needed
    # about one goes on to it.
    fwd("DR ICMP frag-needed about the session's reply",
        icmp_error(c, vdr, 3, 4, dr_reply, ip_id=8, mtu=1400), lambda n, r: expect_dr(n, r, "dr"))

    # --- malformed input between valid flows -------------------------------------------
    drop("IPv4 IHL 4", bytes(Ether(src=CLIENT_MAC, dst=OUR_MAC) / IP(src=c, dst=vdr, ihl=4)
                             / TCP(sport=40100, dport=80, flags="S")), "bad_ipv4_header")
    bad_ihl15 = bytearray(tcp(c, 40101, vdr, 80, "S", 1))
    bad_ihl15[14] = 0x4F  # IHL 15: a 60-byte header in a 40-byte packet
    drop("IPv4 IHL 15 past the total length", ipv4_checksum_fixed(bytes(bad_ihl15), 14), "bad_ipv4_header")
    too_long = bytearray(tcp(c, 40102, vdr, 80, "S", 1, pad_to=60))
    too_long[16:18] = (1000).to_bytes(2, "big")
    drop("IPv4 total length 1000 in a 60-byte frame", ipv4_checksum_fixed(bytes(too_long), 14), "bad_ipv4_header")
    drop("TCP SYN with an IPv4 option (router alert)",
         tcp(c, 40103, vdr, 80, "S", 1, ip_options=[IPOption_Router_Alert()]), "ipv4_options")
    drop("UDP with IPv4 options (NOPs)",
         udp(c, 40104, vnat, VIP_UDP_PORT, b"opts", ip_options=[IPOption_NOP()] * 4), "ipv4_options")
    drop("UDP first fragment (MF)", udp(c, 40105, vnat, VIP_UDP_PORT, payload(64), df=False, mf=True),
         "ipv4_fragment")
    drop("IPv4 later fragment (offset 1480)", frame(IP(src=c, dst=vnat, proto=17, frag=185, id=77) / Raw(payload(40))),
         "ipv4_fragment")
    drop("TCP data offset 15 past the end", tcp(c, 40106, vdr, 80, "S", 1, dataofs=15), "bad_tcp_header")
    drop("TCP data offset 4", tcp(c, 40107, vdr, 80, "S", 1, dataofs=4), "bad_tcp_header")
    drop("TCP segment of 12 bytes", frame(IP(src=c, dst=vdr, proto=6) / Raw(payload(12)), pad_to=60),
         "bad_tcp_header")
    drop("UDP length 0", udp(c, 40108, vnat, VIP_UDP_PORT, b"zero length", len=0), "bad_udp_header")
    drop("UDP length 7", udp(c, 40109, vnat, VIP_UDP_PORT, b"seven", len=7), "bad_udp_header")
    drop("UDP length past the IP payload", udp(c, 40110, vnat, VIP_UDP_PORT, b"short", len=200),
         "bad_udp_header")
    drop("TCP SYN to a VIP port without a service", tcp(c, 40111, vdr, 81, "S", 1), "no_service")
    drop("TCP SYN to a VIP in a broadcast frame",
         frame(IP(src=c, dst=vdr, flags="DF") / TCP(sport=40115, dport=80, flags="S", seq=1),
               dst_mac="ff:ff:ff:ff:ff:ff"), "not_our_mac")
    drop("ICMP error in a broadcast frame",
         frame(IP(src=c, dst=vnat) / ICMP(type=3, code=3)
               / Raw(bytes(IP(src=vnat, dst=c) / UDP(sport=VIP_UDP_PORT, dport=49998))[:28]),
               dst_mac="ff:ff:ff:ff:ff:ff"), "not_our_mac")
    drop("UDP to a VIP port without a service", udp(c, 40112, vnat, VIP_UDP_PORT + 1, b"nobody"), "no_service")
    drop("TCP ACK without a session", tcp(c, 40113, vdr, 80, "A", 5, 6), "tcp_no_session")
    drop("TCP data without a session", tcp(c, 40114, vnat, 80, "PA", 5, 6, data=b"hello"), "tcp_no_session")
    unknown = bytes(IP(src=vnat, dst=c, flags="DF") / UDP(sport=VIP_UDP_PORT, dport=49999) / Raw(b"?"))
    drop("ICMP port unreachable quoting a flow without a session", icmp_error(c, vnat, 3, 3, unknown),
         "icmp_error_no_session")

    # --- NAT, TCP: both directions pass Sluice ----------------------------------------
    cp = 40003
    nat_tcp_rs = lambda n, r: expect_nat_out(n, r)  # noqa: E731
    rq = http_request(vnat)
    rs = http_response("rs2")
    syn = tcp(c, cp, vnat, 80, "S", 7000, options=mss, ip_id=301, ttl=61)
    fwd("NAT TCP SYN (TTL 61)", syn, lambda n, r: expect_nat_in(n, r), opens=True)
    fwd("NAT TCP SYN-ACK from the real server",
        tcp(rip_nat, 8080, c, cp, "SA", 9000, 7001, options=mss, ip_id=401, src_mac=nat_rs_mac), nat_tcp_rs)
    fwd("NAT TCP ACK (padded to 60)", tcp(c, cp, vnat, 80, "A", 7001, 9001, ip_id=302, pad_to=60),
        lambda n, r: expect_nat_in(n, r))
    req = tcp(c, cp, vnat, 80, "PA", 7001, 9001, data=rq, ip_id=303)
    fwd("NAT TCP request", req, lambda n, r: expect_nat_in(n, r))
    # A router behind the real server returns time-exceeded for the request as DNATed
    # (client -> RIP:8080); only 8 bytes of TCP are quoted, so no TCP checksum in it.
    dnat_req = bytes.fromhex(expect_nat_in("", req)["alts"][0])[14:]
    orig_req = strip_pad(req)[14:]
    fwd("NAT ICMP time-exceeded from the server side about the request",
        icmp_error(rip_nat, c, 11, 0, dnat_req, src_mac=nat_rs_mac, ip_id=402),
        lambda n, r: expect_icmp_nat(n, r, "client", [quote_of(orig_req)],
                                     {"IPerror.src": c, "IPerror.dst": vnat, "TCPerror.sport": cp,
                                      "TCPerror.dport": 80}))
    # The same quote addressed elsewhere than to its source (the client): translated,
    # it would go to a host of the sender's choice from the VIP.
    drop("NAT ICMP error about the session's request, addressed to another host",
         icmp_error(rip_nat, "198.18.0.99", 11, 0, dnat_req, src_mac=nat_rs_mac, ip_id=406),
         "icmp_error_misaddressed")
    # The same error from a source no host sends from (RFC 1812), and new connections
    # from such a source or from an address of the appliance's own (the VIP itself).
    drop("NAT ICMP error about the session's request, from 127.0.0.1",
         icmp_error("127.0.0.1", c, 11, 0, dnat_req, src_mac=nat_rs_mac, ip_id=407), "martian_source")
    drop("NAT TCP SYN from 0.0.0.0", tcp("0.0.0.0", 40151, vnat, 80, "S", 100, ip_id=308), "martian_source")
    drop("NAT TCP SYN from the VIP to itself", tcp(vnat, 40152, vnat, 80, "S", 100, ip_id=309), "martian_source")
    fwd("NAT TCP response", tcp(rip_nat, 8080, c, cp, "PA", 9001, 7001 + len(rq), data=rs, ip_id=403,
                                src_mac=nat_rs_mac), nat_tcp_rs)
    drop("IPv4 IHL 4 in the middle of the NAT flow",
         bytes(Ether(src=CLIENT_MAC, dst=OUR_MAC) / IP(src=c, dst=vnat, ihl=4) / TCP(sport=cp, dport=80, flags="A")),
         "bad_ipv4_header")
    fwd("NAT TCP ACK of the response", tcp(c, cp, vnat, 80, "A", 7001 + len(rq), 9001 + len(rs), ip_id=304),
        lambda n, r: expect_nat_in(n, r))
    fwd("NAT TCP FIN from the real server",
        tcp(rip_nat, 8080, c, cp, "FA", 9001 + len(rs), 7001 + len(rq), ip_id=404, src_mac=nat_rs_mac, pad_to=60),
        nat_tcp_rs)
    fwd("NAT TCP FIN from the client",
        tcp(c, cp, vnat, 80, "FA", 7001 + len(rq), 9002 + len(rs), ip_id=305), lambda n, r: expect_nat_in(n, r))
    fwd("NAT TCP last ACK from the real server",
        tcp(rip_nat, 8080, c, cp, "A", 9002 + len(rs), 7002 + len(rq), ip_id=405, src_mac=nat_rs_mac), nat_tcp_rs)

    # --- NAT, UDP: request and reply, a datagram without checksum, ICMP both ways ------
    cp = 40004
    nat_udp_req = udp(c, cp, vnat, VIP_UDP_PORT, b"nat udp request " + payload(33, 5), ip_id=501)
    fwd("NAT UDP request", nat_udp_req, lambda n, r: expect_nat_in(n, r), opens=True)
    nat_udp_reply = udp(rip_nat, MODES["nat"][4], c, cp, b"rs2 " + payload(40, 6), ip_id=601, src_mac=nat_rs_mac)
    fwd("NAT UDP reply", nat_udp_reply, lambda n, r: expect_nat_out(n, r))
    # The real server's port is closed: it answers the DNATed request with port
    # unreachable; the client must see it from the VIP, about its own packet.
    dnat_udp = bytes.fromhex(expect_nat_in("", nat_udp_req)["alts"][0])[14:]
    orig_udp = strip_pad(nat_udp_req)[14:]
    q_orig, q_dnat = quote_of(orig_udp), quote_of(dnat_udp)
    fwd("NAT ICMP port-unreachable from the real server",
        icmp_error(rip_nat, c, 3, 3, dnat_udp, src_mac=nat_rs_mac, ip_id=602),
        lambda n, r: expect_icmp_nat(n, r, "client", [q_orig, with_quoted_l4_checksum(q_orig, q_dnat)],
                                     {"IPerror.src": c, "IPerror.dst": vnat, "UDPerror.sport": cp,
                                      "UDPerror.dport": VIP_UDP_PORT}))
    # The client rejects the (SNATed) reply: the real server must see it about its own.
    snat_reply = bytes.fromhex(expect_nat_out("", nat_udp_reply)["alts"][0])[14:]
    orig_reply = strip_pad(nat_udp_reply)[14:]
    q_rs, q_snat = quote_of(orig_reply), quote_of(snat_reply)
    fwd("NAT ICMP port-unreachable from the client about the reply",
        icmp_error(c, vnat, 3, 3, snat_reply, ip_id=502),
        lambda n, r: expect_icmp_nat(n, r, "rs", [q_rs, with_quoted_l4_checksum(q_rs, q_snat)],
                                     {"IPerror.src": rip_nat, "IPerror.dst": c,
                                      "UDPerror.sport": MODES["nat"][4], "UDPerror.dport": cp}))
    # A frag-needed from the client about the reply would lower the real server's path
    # MTU to the client with nothing to check: its larger replies would then leave in
    # fragments, which Sluice drops. From the real server's side it goes on.
    drop("NAT ICMP frag-needed from the client about the UDP reply",
         icmp_error(c, vnat, 3, 4, snat_reply, ip_id=505, mtu=576), "icmp_too_big_about_udp")
    fwd("NAT ICMP frag-needed from the real server's side about the UDP request",
        icmp_error(rip_nat, c, 3, 4, dnat_udp, src_mac=nat_rs_mac, ip_id=603, mtu=1400),
        lambda n, r: expect_icmp_nat(n, r, "client", [q_orig, with_quoted_l4_checksum(q_orig, q_dnat)],
                                     {"IPerror.src": c, "IPerror.dst": vnat, "UDPerror.sport": cp,
                                      "UDPerror.dport": VIP_UDP_PORT}))
    fwd("NAT UDP without checksum (0 stays 0), padded",
        udp(c, 40005, vnat, VIP_UDP_PORT, b"no sum", ip_id=503, chksum=0, pad_to=60), lambda n, r: expect_nat_in(n, r),
        opens=True)

    # --- NAT, rr over A and B: port reuse after TIME_WAIT (IPVS conn_reuse) ----------
    (rip_a, mac_a), (rip_b, mac_b) = RR_SERVERS
    rport = NAT_TCP_RPORT

    def rr_in(rip):
        return lambda n, r: expect_nat_in(n, r, rip)

    def rr_out(n, r):
        return expect_nat_out(n, r, RR_VIP)

    cp = 40020
    rq = http_request(RR_VIP)
    rs = http_response("rr-a")
    fwd("rr TCP SYN from port 40020 (first rr pick: A)",
        tcp(c, cp, RR_VIP, 80, "S", 20000, options=mss, ip_id=1101), rr_in(rip_a), opens=True)
    fwd("rr TCP SYN-ACK from A", tcp(rip_a, rport, c, cp, "SA", 30000, 20001, options=mss, ip_id=1201,
                                     src_mac=mac_a), rr_out)
    fwd("rr TCP ACK to A", tcp(c, cp, RR_VIP, 80, "A", 20001, 30001, ip_id=1102), rr_in(rip_a))
    fwd("rr TCP request to A", tcp(c, cp, RR_VIP, 80, "PA", 20001, 30001, data=rq, ip_id=1103), rr_in(rip_a))
    fwd("rr TCP response from A", tcp(rip_a, rport, c, cp, "PA", 30001, 20001 + len(rq), data=rs, ip_id=1202,
                                      src_mac=mac_a), rr_out)
    fwd("rr TCP FIN from the client (CLOSE_WAIT)",
        tcp(c, cp, RR_VIP, 80, "FA", 20001 + len(rq), 30001 + len(rs), ip_id=1104), rr_in(rip_a))
    fwd("rr TCP FIN from A (TIME_WAIT)", tcp(rip_a, rport, c, cp, "FA", 30001 + len(rs), 20002 + len(rq),
                                             ip_id=1203, src_mac=mac_a), rr_out)
    fwd("rr TCP last ACK from the client", tcp(c, cp, RR_VIP, 80, "A", 20002 + len(rq), 30002 + len(rs),
                                               ip_id=1105), rr_in(rip_a))
    fwd("rr TCP SYN reusing port 40020 after TIME_WAIT: rescheduled, next rr pick B",
        tcp(c, cp, RR_VIP, 80, "S", 25000, options=mss, ip_id=1106), rr_in(rip_b), opens=True,
        retires=(RR_VIP, rip_a), active=True)
    # The retired session's reply tuple is gone: a late segment from A matches nothing.
    drop("rr TCP late ACK from A for the retired connection",
         tcp(rip_a, rport, c, cp, "A", 30002 + len(rs), 20002 + len(rq), ip_id=1204, src_mac=mac_a), "not_local")
    fwd("rr TCP SYN-ACK from B for the new connection",
        tcp(rip_b, rport, c, cp, "SA", 50000, 25001, options=mss, ip_id=1301, src_mac=mac_b), rr_out)
    fwd("rr TCP ACK to B (ESTABLISHED)", tcp(c, cp, RR_VIP, 80, "A", 25001, 50001, ip_id=1107), rr_in(rip_b))
    # A SYN on an ESTABLISHED session is not a new connection: it follows the session
    # (to A, although B is next in rotation) and takes no rr pick.
    cp = 40021
    fwd("rr TCP SYN from port 40021 (rr pick: A)",
        tcp(c, cp, RR_VIP, 80, "S", 21000, options=mss, ip_id=1111), rr_in(rip_a), opens=True, active=True)
    fwd("rr TCP SYN-ACK from A for port 40021",
        tcp(rip_a, rport, c, cp, "SA", 31000, 21001, options=mss, ip_id=1211, src_mac=mac_a), rr_out)
    fwd("rr TCP ACK to A for port 40021 (ESTABLISHED)", tcp(c, cp, RR_VIP, 80, "A", 21001, 31001, ip_id=1112),
        rr_in(rip_a))
    fwd("rr TCP SYN on the ESTABLISHED session of port 40021: not rescheduled, still A",
        tcp(c, cp, RR_VIP, 80, "S", 21500, options=mss, ip_id=1113), rr_in(rip_a))
    fwd("rr TCP request to A on port 40021",
        tcp(c, cp, RR_VIP, 80, "PA", 21001, 31001, data=rq, ip_id=1114), rr_in(rip_a))
    fwd("rr TCP SYN from port 40022 (rr pick: B)",
        tcp(c, 40022, RR_VIP, 80, "S", 22000, options=mss, ip_id=1121), rr_in(rip_b), opens=True)

    # --- NAT tuple conflict: two VIPs, one real server 198.18.0.12:8080 ----------------
    cp = 40030
    fwd("NAT TCP SYN from port 40030 to the NAT VIP",
        tcp(c, cp, vnat, 80, "S", 23000, options=mss, ip_id=1131), lambda n, r: expect_nat_in(n, r), opens=True)
    # Same client port to another VIP, scheduled to the same RIP:8080: its reply tuple
    # (RIP:8080 -> client:40030) belongs to the first session.
    drop("NAT TCP SYN from port 40030 to the shared VIP (same real server): tuple in use",
         tcp(c, cp, SHARED_VIP, 80, "S", 24000, options=mss, ip_id=1132), "nat_tuple_in_use")
    fwd("NAT TCP SYN-ACK for port 40030: still from the NAT VIP",
        tcp(rip_nat, rport, c, cp, "SA", 33000, 23001, options=mss, ip_id=1231, src_mac=nat_rs_mac),
        lambda n, r: expect_nat_out(n, r))
    fwd("NAT TCP SYN from port 40031 to the shared VIP",
        tcp(c, 40031, SHARED_VIP, 80, "S", 24100, options=mss, ip_id=1133), lambda n, r: expect_nat_in(n, r),
        opens=True)
    fwd("NAT TCP SYN-ACK for port 40031 from the shared VIP",
        tcp(rip_nat, rport, c, 40031, "SA", 34000, 24101, options=mss, ip_id=1232, src_mac=nat_rs_mac),
        lambda n, r: expect_nat_out(n, r, SHARED_VIP))

    # --- TUN, TCP ----------------------------------------------------------------------
    cp = 40006
    tun = lambda n, r: expect_tun(n, r)  # noqa: E731
    fwd("TUN TCP SYN", tcp(c, cp, vtun, 80, "S", 3000, options=mss, ip_id=701), tun, opens=True)
    fwd("TUN TCP ACK (padded to 60: padding not tunnelled)", tcp(c, cp, vtun, 80, "A", 3001, 8001, ip_id=702,
                                                                 pad_to=60), tun)
    fwd("TUN TCP request, TOS 0x10", tcp(c, cp, vtun, 80, "PA", 3001, 8001, data=http_request(vtun), ip_id=703,
                                         tos=0x10), tun)
    fwd("TUN TCP FIN", tcp(c, cp, vtun, 80, "FA", 3001 + len(http_request(vtun)), 8100, ip_id=704), tun)
    fwd("TUN TCP last ACK", tcp(c, cp, vtun, 80, "A", 3002 + len(http_request(vtun)), 8101, ip_id=705), tun)
    # --- TUN, UDP, and the MTU ---------------------------------------------------------
    cp = 40007
    fwd("TUN UDP request, TOS 0xb8, no DF", udp(c, cp, vtun, VIP_UDP_PORT, b"tun udp " + payload(30, 7), ip_id=801,
                                                tos=0xB8, df=False), tun, opens=True)
    # 1480 bytes inside: exactly 1500 once encapsulated, the largest that fits.
    fwd("TUN UDP of 1480 bytes with DF (fits exactly)",
        udp(c, cp, vtun, VIP_UDP_PORT, payload(1480 - 28, 8), ip_id=802), tun)
    big_df = udp(c, cp, vtun, VIP_UDP_PORT, payload(1490 - 28, 9), ip_id=803)
    F.append(("TUN UDP of 1490 bytes with DF: frag-needed", big_df, "too_big",
              [expect_frag_needed("ICMP frag-needed (MTU 1480) for the client", big_df, vtun)]))
    drop("TUN UDP of 1481 bytes without DF (not fragmented)",
         udp(c, cp, vtun, VIP_UDP_PORT, payload(1481 - 28, 10), ip_id=804, df=False), "too_big")
    tun_reply = bytes(IP(src=vtun, dst=c, id=11, flags="DF") / UDP(sport=VIP_UDP_PORT, dport=cp) / Raw(b"tun reply"))
    fwd("TUN ICMP port-unreachable about the session's reply", icmp_error(c, vtun, 3, 3, tun_reply, df=True), tun)

    # The DR and TUN real servers move to new MACs and say so (a gratuitous ARP reply):
    # their sessions' next packets go to the new MACs, not the ones they first had.
    for mode in ("dr", "tun"):
        drop(f"ARP reply from the {mode} real server at its new MAC",
             arp_reply_from(MOVED_MACS[mode], MODES[mode][1]), "arp_reply")
    # A last valid frame of each mode, so a frame that goes missing at the end shows.
    fwd("DR UDP final datagram, to the real server's new MAC",
        udp(c, 40002, vdr, VIP_UDP_PORT, b"final", ip_id=203),
        lambda n, r: expect_dr(n, r, "dr", MOVED_MACS["dr"]))
    fwd("NAT UDP final datagram", udp(c, 40004, vnat, VIP_UDP_PORT, b"final", ip_id=504),
        lambda n, r: expect_nat_in(n, r))
    fwd("TUN UDP final datagram, to the real server's new MAC",
        udp(c, 40007, vtun, VIP_UDP_PORT, b"final", ip_id=805),
        lambda n, r: expect_tun(n, r, MOVED_MACS["tun"]))
    return F, ledger


# Real servers' expected statistics (sluicectl -L -n --stats --json).
MAC_TO_RIP = {**{mac: ip for ip, mac in RS_MACS.items()},
              **{mac: MODES[mode][1] for mode, mac in MOVED_MACS.items()}}
# VIPs served by one real server whatever the packet (DR and TUN).
SOLE_RIP = {MODES[m][0]: MODES[m][1] for m in ("dr", "tun")}


def session_of(raw, outs, dropped):
    """(VIP, RIP) of the session an input frame is counted on, from the frame and its
    expected output; None when it is counted on no real server. From a real server
    (NAT reply, ICMP error): the VIP it leaves as. To a VIP: the real server the output
    goes to; a too-big packet for TUN, the tunnel's real server."""
    p = Ether(raw)
    if IP not in p or (TCP not in p and UDP not in p and ICMP not in p):
        return None
    if ICMP in p and p[ICMP].type == 8:
        return None
    ip = p[IP]
    if ip.src in RIPS:
        if not outs:
            return None
        return (Ether(bytes.fromhex(outs[0]["alts"][0]))[IP].src, ip.src)
    if outs and outs[0]["kind"] in ("dr", "nat-in", "tun", "icmp-nat"):
        return (ip.dst, MAC_TO_RIP[outs[0]["eth_dst"]])
    if dropped == "too_big":
        return (ip.dst, SOLE_RIP[ip.dst])
    return None


def expected_stats(F, ledger):
    """One entry per (VIP, RIP): the real server's services on that VIP; connections
    (sessions created), active (ESTABLISHED at the end) and inactive (the others, less
    those retired by a new SYN on their tuple), exact; and the inbound/outbound TCP/UDP
    frames that reached it, as exact lower bounds, ICMP errors and dropped packets of a
    session being counted or not."""
    stats = {}
    for mode, (vip, rip, _, _, _) in MODES.items():
        stats[(vip, rip)] = {"mode": mode, "services": [["tcp", VIP_TCP_PORT], ["udp", VIP_UDP_PORT]]}
    for vip, rips in ((RR_VIP, [ip for ip, _ in RR_SERVERS]), (SHARED_VIP, [MODES["nat"][1]])):
        for rip in rips:
            stats[(vip, rip)] = {"mode": "nat", "services": [["tcp", VIP_TCP_PORT]]}
    for (vip, rip), s in stats.items():
        led = ledger.get((vip, rip), {"connections": 0, "retired": 0, "active": 0})
        s.update({"vip": vip, "rip": rip, "connections": led["connections"], "active": led["active"],
                  "inactive": led["connections"] - led["retired"] - led["active"],
                  "in_min": 0, "in_max": 0, "out_min": 0, "out_max": 0})
    assert set(ledger) <= set(stats), ledger
    for name, raw, dropped, outs in F:
        key = session_of(raw, outs, dropped)
        if key is None:
            continue
        s = stats[key]
        p = Ether(raw)
        icmp = ICMP in p
        if p[IP].src in RIPS:
            s["out_max"] += 1
            if not icmp:
                s["out_min"] += 1
        else:
            s["in_max"] += 1
            if not icmp and dropped is None:
                s["in_min"] += 1
    return list(stats.values())


def cmd_make(args):
    F, ledger = build()
    outputs, drops = [], {r: 0 for r in DROP_REASONS}
    for index, (name, raw, dropped, outs) in enumerate(F):
        if dropped is not None:
            assert dropped in drops, dropped
            drops[dropped] += 1
        for o in outs:
            o["input_index"] = index
            outputs.append(o)
    writer = RawPcapWriter(args.in_pcap, linktype=1)
    writer.write_header(None)
    for i, (_, raw, _, _) in enumerate(F):
        writer.write_packet(raw, sec=1_700_000_000 + i, usec=0)
    writer.close()
    back = [bytes(p) for p in rdpcap(args.in_pcap)]
    created = sum(e["connections"] for e in ledger.values())
    retired = sum(e["retired"] for e in ledger.values())
    assert back == [raw for _, raw, _, _ in F], "pcap round trip changed the frames"
    expect = {
        "appliance": {"mac": OUR_MAC, "ip": OUR_IP, "mtu": MTU},
        "client": {"mac": CLIENT_MAC, "ip": CLIENT_IP},
        "modes": {m: {"vip": v[0], "rip": v[1], "rs_mac": v[2], "tcp_rport": v[3], "udp_rport": v[4]}
                  for m, v in MODES.items()},
        "rips": RIPS,
        "services_toml": services_toml(),
        "input_frames": len(F),
        "frames": [{"index": i, "name": n, "drop": d, "outputs": len(o), "len": len(r)}
                   for i, (n, r, d, o) in enumerate(F)],
        "outputs": outputs,
        "drops": drops,
        "events": {"arp_replied": sum(1 for o in outputs if o["kind"] == "arp-reply"),
                   "icmp_echo_replied": sum(1 for o in outputs if o["kind"] == "echo-reply"),
                   # the client and every real server
                   "neighbour_learned": 1 + len(RIPS), "neighbour_table_full": 0},
        # Nothing expires (timeouts of 600 s): only a SYN reusing a finished
        # connection's tuple retires a session.
        "sessions_created": created,
        "sessions_expired": retired,
        "sessions": created - retired,
        "real_servers": expected_stats(F, ledger),
    }
    with open(args.expect_json, "w") as f:
        json.dump(expect, f, indent=1)
    print(f"wrote {args.in_pcap} ({len(F)} frames) and {args.expect_json} "
          f"({len(outputs)} outputs, {sum(drops.values())} drops)")
    return 0


# ----------------------------------------------------------------------------------
# check


def is_our_arp_request(frame, rips):
    """An ARP who-has from Sluice for a real server (the only extra frames allowed)."""
    if len(frame) < 42 or frame[12:14] != b"\x08\x06":
        return False
    p = Ether(frame)
    if ARP not in p:
        return False
    a = p[ARP]
    return (a.op == 1 and p.src == OUR_MAC and p.dst == "ff:ff:ff:ff:ff:ff" and a.hwsrc == OUR_MAC
            and a.psrc == OUR_IP and a.pdst in rips and a.hwtype == 1 and a.ptype == 0x0800
            and frame[42:] == b"\x00" * (len(frame) - 42))


def candidate(alt, actual, exp):
    """alt with the wildcard fields taken from actual and the IPv4 checksums at
    exp["ipsum"] recomputed; None (plus a reason) when actual's wildcard value is not
    allowed or does not fit."""
    b = bytearray(alt)
    for w in exp["wild"]:
        o, n = w["off"], w["len"]
        if len(actual) < o + n or len(b) < o + n:
            return None, f"too short for {w['what']}"
        value = actual[o:o + n]
        if w["allowed"] is not None and value.hex() not in w["allowed"]:
            return None, f"{w['what']} is {value.hex()}, allowed {w['allowed']}"
        b[o:o + n] = value
    out_b = bytes(b)
    for off in exp["ipsum"]:
        out_b = ipv4_checksum_fixed(out_b, off)
    return out_b, None


def match(actual, exp, notes=None):
    """True when actual is one of exp's alternatives (wildcards applied), or differs
    from one only in checksum fields written as 0xffff for 0x0000 or back."""
    for alt_hex in exp["alts"]:
        cand, _ = candidate(bytes.fromhex(alt_hex), actual, exp)
        if cand is None:
            continue
        if cand == actual:
            return True
        if len(cand) != len(actual):
            continue
        diff = [i for i in range(len(cand)) if cand[i] != actual[i]]
        ok = True
        touched = set()
        for i in diff:
            field = next((z for z in exp["zero_eq"] if z <= i < z + 2), None)
            if field is None:
                ok = False
                break
            touched.add(field)
        if ok and all({cand[z:z + 2], actual[z:z + 2]} == {b"\x00\x00", b"\xff\xff"} for z in touched):
            if notes is not None:
                notes.append(f"{exp['name']}: checksum at offset(s) {sorted(touched)} is 0xffff/0x0000 where "
                             "the other representation of zero was computed: accepted")
            return True
    return False


def align(outputs, expected):
    """Longest common subsequence of (output, expected) under `match`: the pairs in
    order. Unpaired frames are reported as missing, unexpected or different."""
    n, m = len(outputs), len(expected)
    ok = [[match(outputs[i], expected[j]) for j in range(m)] for i in range(n)]
    L = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            L[i][j] = L[i + 1][j + 1] + 1 if ok[i][j] else max(L[i + 1][j], L[i][j + 1])
    pairs, i, j = [], 0, 0
    while i < n and j < m:
        if ok[i][j]:
            pairs.append((i, j))
            i += 1
            j += 1
        elif L[i + 1][j] >= L[i][j + 1]:
            i += 1
        else:
            j += 1
    return pairs


def get_field(pkt, path):
    """"IP.src", "IP#2.ttl", "UDPerror.dport" on a scapy packet."""
    layer, field = path.rsplit(".", 1)
    name, _, nb = layer.partition("#")
    cls = {"IP": IP, "TCP": TCP, "UDP": UDP, "ICMP": ICMP, "ARP": ARP, "IPerror": IPerror,
           "TCPerror": TCPerror, "UDPerror": UDPerror}[name]
    lay = pkt.getlayer(cls, nb=int(nb) if nb else 1)
    if lay is None:
        return "<no such layer>"
    if field == "flags":
        return int(lay.flags)
    return lay.getfieldval(field)


def l4_checksum_ok(ip_raw):
    """TCP/UDP checksum of a whole IPv4 packet, recomputed over the pseudo-header."""
    ihl = (ip_raw[0] & 0x0F) * 4
    total = int.from_bytes(ip_raw[2:4], "big")
    proto = ip_raw[9]
    seg = ip_raw[ihl:total]
    if proto == 17 and int.from_bytes(seg[6:8], "big") == 0:
        return True  # no checksum
    pseudo = ip_raw[12:20] + bytes([0, proto]) + len(seg).to_bytes(2, "big")
    return inet_checksum(pseudo + seg) == 0


def scapy_checks(rep, i, actual, exp, inputs):
    where = f"output frame #{i} ({exp['name']})"
    p = Ether(actual)
    rep.eq(where, "eth.src", p.src, exp["eth_src"])
    rep.eq(where, "eth.dst", p.dst, exp["eth_dst"])
    for path, want in exp["fields"].items():
        if path == "inner_ip_hex":
            inner = bytes(p[IP].payload)
            rep.eq(where, "inner IPv4 packet (bytes)", inner.hex(), want)
            continue
        if path == "quote_hex":
            rep.eq(where, "ICMP quote (bytes)", bytes(p[ICMP].payload).hex(), want)
            continue
        rep.eq(where, path, get_field(p, path), want)
    if IP not in p:
        return
    # Every IPv4 header verifies, and every L4 checksum that covers a whole packet.
    ip_off = 14
    ip_raw = actual[ip_off:]
    ihl = (ip_raw[0] & 0x0F) * 4
    rep.eq(where, "ip.checksum (recomputed)", inet_checksum(ip_raw[:ihl]), 0)
    total = int.from_bytes(ip_raw[2:4], "big")
    rep.eq(where, "ip.len vs frame", total <= len(ip_raw), True)
    proto = ip_raw[9]
    if proto in (6, 17):
        rep.eq(where, "tcp/udp checksum (recomputed)", l4_checksum_ok(ip_raw), True)
    elif proto == 4:
        inner = ip_raw[ihl:total]
        iihl = (inner[0] & 0x0F) * 4
        rep.eq(where, "inner ip.checksum (recomputed)", inet_checksum(inner[:iihl]), 0)
        if inner[9] in (6, 17):
            rep.eq(where, "inner tcp/udp checksum (recomputed)", l4_checksum_ok(inner), True)
        if inner[9] == 1:
            rep.eq(where, "inner icmp checksum (recomputed)", inet_checksum(inner[iihl:]), 0)
    elif proto == 1:
        msg = ip_raw[ihl:total]
        rep.eq(where, "icmp.checksum (recomputed)", inet_checksum(msg), 0)
        if msg[0] in (3, 11, 12) and len(msg) >= 28:
            q = msg[8:]
            qihl = (q[0] & 0x0F) * 4
            rep.eq(where, "quoted ip.checksum (recomputed)", inet_checksum(q[:qihl]), 0)


TSHARK_FIELDS = [
    "frame.len", "eth.dst", "eth.src", "arp.opcode", "arp.src.hw_mac", "arp.src.proto_ipv4",
    "arp.dst.hw_mac", "arp.dst.proto_ipv4", "ip.src", "ip.dst", "ip.ttl", "ip.proto", "ip.len",
    "ip.checksum.status", "tcp.srcport", "tcp.dstport", "tcp.checksum.status", "udp.srcport",
    "udp.dstport", "udp.checksum.status", "icmp.type", "icmp.code", "icmp.checksum.status", "icmp.mtu",
    "_ws.expert.severity", "_ws.expert.message", "_ws.malformed",
]
# Expert severities (epan/proto.h): chat 0x200000, note 0x400000, warn 0x600000, error 0x800000.
WARN = 0x600000


# tshark's rows per pcap content: a self-test checks the same input many times, and
# tshark takes about half a second to start.
_TSHARK_ROWS = {}


def tshark_decode(pcap):
    with open(pcap, "rb") as f:
        content = hashlib.sha256(f.read()).digest()
    if content not in _TSHARK_ROWS:
        _TSHARK_ROWS[content] = tshark_run(pcap)
    return [dict(row) for row in _TSHARK_ROWS[content]]


def tshark_run(pcap):
    tshark = shutil.which("tshark")
    if not tshark:
        raise RuntimeError("tshark not found (run scripts/setup.sh)")
    cmd = [tshark, "-n", "-r", pcap, "-o", "ip.check_checksum:TRUE", "-o", "tcp.check_checksum:TRUE",
           "-o", "udp.check_checksum:TRUE", "-o", "tcp.analyze_sequence_numbers:FALSE",
           "-T", "fields", "-E", "separator=\t", "-E", "occurrence=a", "-E", "aggregator=|"]
    for f in TSHARK_FIELDS:
        cmd += ["-e", f]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if res.returncode != 0:
        raise RuntimeError(f"tshark failed ({res.returncode}): {res.stderr.strip()}")
    rows = []
    for line in res.stdout.splitlines():
        values = line.split("\t")
        values += [""] * (len(TSHARK_FIELDS) - len(values))
        rows.append(dict(zip(TSHARK_FIELDS, values)))
    return rows


def scapy_view(frame):
    """What tshark should report for frame, from scapy's own decoding."""
    p = Ether(frame)
    v = {"frame.len": str(len(frame)), "eth.dst": p.dst, "eth.src": p.src}
    ips = [lay for lay in p.iterpayloads() if isinstance(lay, IP)]
    v["ip.src"] = "|".join(x.src for x in ips)
    v["ip.dst"] = "|".join(x.dst for x in ips)
    v["ip.proto"] = "|".join(str(x.proto) for x in ips)
    v["ip.ttl"] = "|".join(str(x.ttl) for x in ips)
    for proto, cls in (("tcp", TCP), ("udp", UDP)):
        segs = [lay for lay in p.iterpayloads() if isinstance(lay, cls)]
        v[f"{proto}.srcport"] = "|".join(str(s.sport) for s in segs)
        v[f"{proto}.dstport"] = "|".join(str(s.dport) for s in segs)
    if ICMP in p:
        v["icmp.type"] = str(p[ICMP].type)
        v["icmp.code"] = str(p[ICMP].code)
    if ARP in p:
        v["arp.opcode"] = str(p[ARP].op)
        v["arp.src.proto_ipv4"] = p[ARP].psrc
        v["arp.dst.proto_ipv4"] = p[ARP].pdst
    return v


def tshark_checks(rep, i, row, frame, name):
    where = f"output frame #{i} ({name}) [tshark]"
    for field, want in scapy_view(frame).items():
        got = row[field]
        if field in ("ip.src", "ip.dst", "ip.proto", "ip.ttl", "tcp.srcport", "tcp.dstport",
                     "udp.srcport", "udp.dstport"):
            # scapy's quoted IPerror/UDPerror are IP/UDP to tshark too
            p = Ether(frame)
            if ICMP in p and p[ICMP].type in (3, 11, 12):
                continue
        rep.eq(where, field, got, want)
    rep.eq(where, "_ws.malformed", row["_ws.malformed"], "")
    severities = [int(s, 0) for s in row["_ws.expert.severity"].split("|") if s]
    messages = row["_ws.expert.message"].split("|")
    p = Ether(frame)
    for k, s in enumerate(severities):
        message = messages[k] if k < len(messages) else "?"
        # tshark warns of every reset it sees; a reset is what this frame is meant to be.
        if message == "Connection reset (RST)" and TCP in p and p[TCP].flags.R:
            continue
        if s >= WARN:
            rep.fail(f"{where}: expert info (severity {s:#x}): {message}")
    if IP in p:
        for k, st in enumerate(row["ip.checksum.status"].split("|")):
            rep.eq(where, f"ip.checksum.status #{k + 1} (1 = good)", st, "1")
    # Checksums of whole segments must be good; those of segments quoted inside an ICMP
    # error (cut to 8 bytes) cannot be verified, tshark says 2, but must never be bad.
    for proto, cls, err in (("tcp", TCP, TCPerror), ("udp", UDP, UDPerror)):
        segs = [lay for lay in p.iterpayloads() if isinstance(lay, cls)]
        for k, st in enumerate(filter(None, row[f"{proto}.checksum.status"].split("|"))):
            seg = segs[k] if k < len(segs) else None
            if seg is None or isinstance(seg, err):
                rep.eq(where, f"{proto}.checksum.status #{k + 1} (quoted: not 0 = bad)", st in ("1", "2"), True)
            elif proto == "udp" and seg.chksum == 0:
                rep.eq(where, f"udp.checksum.status #{k + 1} (3 = not present)", st, "3")
            else:
                rep.eq(where, f"{proto}.checksum.status #{k + 1} (1 = good)", st, "1")
    if ICMP in p:
        for k, st in enumerate(row["icmp.checksum.status"].split("|")):
            rep.eq(where, f"icmp.checksum.status #{k + 1} (1 = good)", st, "1")


def check_tshark_validates(rep, in_pcap, expect):
    """Proves tshark's checksum validation is on: the input's checksums must be good
    (tcp/udp/ip) on the valid frames."""
    rows = tshark_decode(in_pcap)
    if len(rows) != expect["input_frames"]:
        rep.fail(f"tshark sees {len(rows)} input frames, expected {expect['input_frames']}")
        return
    for f in expect["frames"]:
        if f["outputs"] == 0:
            continue
        row = rows[f["index"]]
        where = f"input frame #{f['index']} ({f['name']}) [tshark]"
        for field in ("ip.checksum.status", "tcp.checksum.status"):
            for st in filter(None, row[field].split("|")):
                rep.eq(where, field, st, "1")


def cmd_check(args):
    with open(args.expect_json) as f:
        expect = json.load(f)
    rep = Report()
    notes = []
    inputs = [bytes(p) for p in rdpcap(args.in_pcap)]
    if len(inputs) != expect["input_frames"]:
        rep.fail(f"{args.in_pcap}: {len(inputs)} frames, expected {expect['input_frames']}")
    check_tshark_validates(rep, args.in_pcap, expect)
    if not os.path.exists(args.out_pcap):
        print(f"FAIL: {args.out_pcap} does not exist (was the port closed cleanly?)")
        return 1
    all_out = [bytes(p) for p in rdpcap(args.out_pcap)] if os.path.getsize(args.out_pcap) > 24 else []
    rips = expect["rips"]
    arp_requests = [i for i, o in enumerate(all_out) if is_our_arp_request(o, rips)]
    if arp_requests:
        notes.append(f"{len(arp_requests)} ARP request(s) from Sluice for real servers (allowed): "
                     + ", ".join(Ether(all_out[i])[ARP].pdst for i in arp_requests))
    index = [i for i in range(len(all_out)) if i not in arp_requests]
    outputs = [all_out[i] for i in index]
    expected = expect["outputs"]

    pairs = align(outputs, expected)
    differing = []  # (output, expected) pairs in the same gap: compared field by field
    # Report the gaps: frames between two aligned pairs are shown side by side.
    prev_o, prev_e = -1, -1
    for o, e in pairs + [(len(outputs), len(expected))]:
        gap_o = list(range(prev_o + 1, o))
        gap_e = list(range(prev_e + 1, e))
        for k in range(max(len(gap_o), len(gap_e))):
            if k < len(gap_o) and k < len(gap_e):
                oo, ee = gap_o[k], gap_e[k]
                want = bytes.fromhex(expected[ee]["alts"][0])
                cand, why = candidate(want, outputs[oo], expected[ee])
                rep.fail(f"output frame #{index[oo]} should be expected #{ee} ({expected[ee]['name']}, from input "
                         f"#{expected[ee]['input_index']}) but differs" + (f" ({why})" if why else "") + ":\n"
                         + "\n".join(field_diff(outputs[oo], cand or want))
                         + f"\n      got      {outputs[oo].hex()}\n      expected {(cand or want).hex()}")
                differing.append((oo, ee))
            elif k < len(gap_e):
                ee = gap_e[k]
                rep.fail(f"expected #{ee} ({expected[ee]['name']}, from input #{expected[ee]['input_index']}): "
                         f"missing from the output (expected {expected[ee]['alts'][0]})")
            else:
                oo = gap_o[k]
                rep.fail(f"output frame #{index[oo]}: unexpected: {Ether(outputs[oo]).summary()} "
                         f"({outputs[oo].hex()})")
        prev_o, prev_e = o, e
    for o, e in pairs:
        match(outputs[o], expected[e], notes)  # collect the notes of accepted equivalences
    for o, e in pairs + differing:
        scapy_checks(rep, index[o], outputs[o], expected[e], inputs)

    try:
        rows = tshark_decode(args.out_pcap) if all_out else []
    except RuntimeError as e:
        rep.fail(str(e))
        rows = []
    if len(rows) != len(all_out):
        rep.fail(f"tshark decodes {len(rows)} output frames, scapy {len(all_out)}")
    else:
        for o, e in pairs + differing:
            tshark_checks(rep, index[o], rows[index[o]], outputs[o], expected[e]["name"])
        for i in arp_requests:
            tshark_checks(rep, i, rows[i], all_out[i], "ARP request from Sluice")
    if args.summary:
        with open(args.summary, "w") as f:
            json.dump({"arp_requests": len(arp_requests), "outputs": len(all_out), "matched": len(pairs)}, f)
    for n_ in notes:
        print(f"note: {n_}")
    if rep.errors:
        print(f"FAIL: {len(rep.errors)} problem(s) between {args.out_pcap} and {args.expect_json}:")
        for e in rep.errors:
            print(f"  - {e}")
        return 1
    kinds = {}
    for e in expected:
        kinds[e["kind"]] = kinds.get(e["kind"], 0) + 1
    print(f"OK: {len(pairs)} frames match ({', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))}); "
          "scapy and tshark agree, IPv4/TCP/UDP/ICMP checksums good")
    return 0


# ----------------------------------------------------------------------------------
# selftest: the checker must accept the right output and reject broken ones.


def write_pcap(path, frames):
    w = RawPcapWriter(path, linktype=1)
    w.write_header(None)
    for i, f in enumerate(frames):
        w.write_packet(f, sec=1_700_000_000 + i, usec=0)
    w.close()


def run_check(in_pcap, out_pcap, expect_json):
    ns = argparse.Namespace(in_pcap=in_pcap, out_pcap=out_pcap, expect_json=expect_json, summary=None)
    saved = sys.stdout
    with open(os.devnull, "w") as devnull:
        sys.stdout = devnull
        try:
            return cmd_check(ns)
        finally:
            sys.stdout = saved


def cmd_selftest(args):
    os.makedirs(args.dir, exist_ok=True)
    in_pcap = os.path.join(args.dir, "in.pcap")
    expect_json = os.path.join(args.dir, "expect.json")
    cmd_make(argparse.Namespace(in_pcap=in_pcap, expect_json=expect_json))
    with open(expect_json) as f:
        expect = json.load(f)
    good = []
    for e in expect["outputs"]:
        b = bytearray.fromhex(e["alts"][-1])
        for w in e["wild"]:  # a value Sluice could have chosen, not the template's
            if w["allowed"] is None:
                b[w["off"]] ^= 0x5A
        b = bytes(b)
        for off in e["ipsum"]:
            b = ipv4_checksum_fixed(b, off)
        good.append(b)
    arp = bytes(Ether(src=OUR_MAC, dst="ff:ff:ff:ff:ff:ff") / ARP(op=1, hwsrc=OUR_MAC, psrc=OUR_IP,
                                                                   pdst=MODES["nat"][1])) + b"\x00" * 18
    failures = []

    def expect_result(label, frames, want_ok):
        path = os.path.join(args.dir, f"out-{label}.pcap")
        write_pcap(path, frames)
        rc = run_check(in_pcap, path, expect_json)
        if (rc == 0) != want_ok:
            failures.append(f"{label}: checker returned {rc}, expected {'success' if want_ok else 'failure'}")
        print(f"selftest {label}: checker {'accepts' if rc == 0 else 'rejects'} "
              f"({'as it must' if (rc == 0) == want_ok else 'WRONG'})")

    def find(kind):
        return next(i for i, e in enumerate(expect["outputs"]) if e["kind"] == kind)

    expect_result("correct", good, True)
    expect_result("correct-with-arp-request", [arp] + good[:5] + [arp] + good[5:], True)

    def mutate(i, off, xor=0x01, fix_ip=False):
        frames = list(good)
        b = bytearray(frames[i])
        b[off] ^= xor
        if fix_ip:
            b = bytearray(ipv4_checksum_fixed(bytes(b), 14))
        frames[i] = bytes(b)
        return frames

    nat_in, nat_out, tun, dr, icmp = find("nat-in"), find("nat-out"), find("tun"), find("dr"), find("icmp-nat")
    frag = find("frag-needed")
    expect_result("nat-payload-byte-flipped", mutate(nat_in, len(good[nat_in]) - 1), False)
    expect_result("nat-out-sport-off-by-one", mutate(nat_out, 14 + 20 + 1), False)
    expect_result("nat-ttl-decremented", mutate(nat_in, 22, 0x03, fix_ip=True), False)
    expect_result("tun-outer-ttl-63", mutate(tun, 22, 0x7F, fix_ip=True), False)
    expect_result("tun-outer-checksum-wrong", mutate(tun, 24), False)
    expect_result("dr-ip-byte-changed", mutate(dr, 14 + 8), False)
    expect_result("icmp-quote-port-wrong", mutate(icmp, len(good[icmp]) - 6), False)
    expect_result("frag-needed-mtu-wrong", mutate(frag, 14 + 20 + 7), False)
    expect_result("frame-missing", good[:10] + good[11:], False)
    expect_result("frame-extra", good[:10] + [good[10]] + good[10:], False)
    expect_result("frames-swapped", good[:10] + [good[11], good[10]] + good[12:], False)
    expect_result("arp-request-for-a-stranger",
                  [bytes(Ether(src=OUR_MAC, dst="ff:ff:ff:ff:ff:ff") / ARP(op=1, hwsrc=OUR_MAC, psrc=OUR_IP,
                                                                           pdst="198.18.0.99"))] + good, False)
    # Port reuse and the tuple conflict: what a daemon without conn_reuse, or one that
    # reschedules too eagerly, or one that crosses two sessions, would send.
    inputs = [bytes(p) for p in rdpcap(in_pcap)]

    def output_named(prefix):
        return next(i for i, e in enumerate(expect["outputs"]) if e["name"].startswith(prefix))

    def sent_to(i, rip):
        """Expected output i as if its input had been DNATed towards rip instead."""
        e = expect["outputs"][i]
        return bytes.fromhex(expect_nat_in(e["name"], inputs[e["input_index"]], rip)["alts"][-1])

    (rip_a, _), (rip_b, _) = RR_SERVERS
    reuse = output_named("rr TCP SYN reusing port 40020")
    expect_result("reused-port-syn-to-the-old-real-server",
                  good[:reuse] + [sent_to(reuse, rip_a)] + good[reuse + 1:], False)
    est = output_named("rr TCP SYN on the ESTABLISHED session")
    expect_result("established-syn-rescheduled", good[:est] + [sent_to(est, rip_b)] + good[est + 1:], False)
    conflict = next(f["index"] for f in expect["frames"] if f["drop"] == "nat_tuple_in_use")
    at = sum(1 for e in expect["outputs"] if e["input_index"] < conflict)
    crossed = bytes.fromhex(expect_nat_in("", inputs[conflict])["alts"][-1])
    expect_result("conflicting-nat-syn-forwarded", good[:at] + [crossed] + good[at:], False)
    if failures:
        print("SELFTEST FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("selftest OK: the checker accepts the expected output and rejects every broken variant")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    mk = sub.add_parser("make", help="write the input pcap and the expectations")
    mk.add_argument("in_pcap")
    mk.add_argument("expect_json")
    ck = sub.add_parser("check", help="check Sluice's output against the expectations")
    ck.add_argument("in_pcap")
    ck.add_argument("out_pcap")
    ck.add_argument("expect_json")
    ck.add_argument("summary", nargs="?")
    st = sub.add_parser("selftest", help="prove the checker accepts good and rejects bad output")
    st.add_argument("dir")
    args = parser.parse_args()
    return {"make": cmd_make, "check": cmd_check, "selftest": cmd_selftest}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
