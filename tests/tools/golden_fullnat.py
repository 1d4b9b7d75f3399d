#!/usr/bin/python3
"""Golden-packet fixtures for Sluice's FullNAT forwarding (DPVS's `-b`).

FullNAT rewrites the client's source to a local address and port (LIP:lport) that
Sluice picks at run time, and the real server replies to that LIP:lport. A real
server's frames in the input therefore depend on the daemon's choice, so the input
cannot be written before the run as golden_forwarding.py does: this tool plays the
client and the real servers live, one frame at a time, over the test bed's client
veth, while Sluice receives on the appliance veth (net_pcap `rx_iface_in=`) and
writes what it sends into a pcap file (`tx_pcap=`, flushed per burst). When a
session's first packet comes out, its LIP:lport is read from it; the real server's
frames of that session are then addressed to it. Everything else, the expected
outputs included, is computed from the script below and those bindings, and checked
offline by golden_forwarding.py's checker (scapy and tshark, byte for byte).

    golden_fullnat.py config
        Prints the services config (TOML) the daemon must run with.

    golden_fullnat.py run IFACE IN_PCAP OUT_PCAP RUN_JSON --sluicectl PATH --socket SOCK
        Plays the script on IFACE (AF_PACKET, run it inside the client's namespace).
        After each frame it waits (bounded: 3 s) until Sluice's out.pcap holds the
        frame's expected outputs, or, for a frame that must be dropped, until the
        drop counters (`sluicectl status --json`) have grown. Writes IN_PCAP (the
        frames sent, in order) and RUN_JSON ({"bindings": {SESSION: [LIP, LPORT, TS_OFFSET] or
        null}, "timeouts": [...]}). Exit 0 once everything was sent, whatever Sluice
        did: `check` gives the verdict.

    golden_fullnat.py check IN_PCAP OUT_PCAP RUN_JSON EXPECT_JSON [SUMMARY_JSON]
        Rebuilds the input from the script and the bindings (must equal IN_PCAP, so
        the real servers really used the LIP:lport each session's first packet
        carried), checks the bindings (LIP one of the service's, lport in
        1024..=65535, distinct among the concurrent sessions towards the same real
        server on the same LIP, LIPs taken round robin per new session of a
        service), writes EXPECT_JSON in golden_forwarding.py's format (outputs,
        drops, events, sessions, real-server statistics) and runs its checker on
        OUT_PCAP. Exit 0 when everything matches, 1 with a report otherwise.

    golden_fullnat.py selftest DIR
        Proves the checker with made-up bindings: the expected output must pass;
        broken outputs (lport or LIP changed within a session, client port or VIP not
        restored, wrong checksum, wrong ICMP quote, a missing ARP reply for a LIP,
        frames swapped, a UDP checksum of 0 replaced, a TSval not moved or a TSecr not
        moved back) and broken bindings (an lport shared by two concurrent sessions, an
        lport below 1024, a LIP that is not the service's, LIPs not taken round robin, a
        binding that is not the one the input used, TCP timestamps not rewritten, a
        timestamp clock that goes back, a UDP session with a timestamp offset) must
        fail.

Run with /usr/bin/python3 (Debian's scapy). The appliance is 02:53:4c:00:00:01 /
198.18.0.1/24 as in golden_forwarding.py, whose frame builders, expectation format and
checker this tool reuses.

The contract encoded here (docs/TESTING.md, "Golden FullNAT"):
  * client:cport -> VIP:vport becomes LIP:lport -> RIP:rport (Ethernet dst = the real
    server, src = Sluice); IPv4 and TCP/UDP checksums valid; TTL, id, TOS, flags,
    TCP sequence numbers, payload and options untouched but for the timestamps: a TCP
    session's TSval is moved onto Sluice's clock, by an offset learned from its SYN's
    output (its clock at the SYN minus the SYN's TSval; never going back from one
    session to the next); a UDP checksum of 0 stays 0.
  * RIP:rport -> LIP:lport (to Sluice's MAC) becomes VIP:vport -> client:cport,
    Ethernet dst = the MAC the client's packets came from; the TSecr is moved back by
    the session's offset.
  * One LIP:lport per session for its whole life; LIPs round robin per new session.
  * ICMP errors: from the real-server side, quoting LIP:lport -> RIP:rport, they reach
    the client from the VIP, quoting client:cport -> VIP:vport; from the client,
    quoting VIP:vport -> client:cport, they reach the real server from the LIP,
    quoting RIP:rport -> LIP:lport (the L4 checksum inside the quote updated or left);
    a frag-needed from the client reaches it with an MTU of at least 1280 when it
    quotes TCP, and is dropped (`icmp_too_big_about_udp`) when it quotes UDP.
  * Sluice answers ARP and echo for its LIPs (and not for a neighbouring address).
"""

import argparse
import io
import json
import os
import socket
import struct
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

try:
    from scapy.all import ARP, ICMP, Ether, IP, TCP, UDP, rdpcap  # noqa: E402
except ImportError as e:  # pragma: no cover
    sys.exit(f"golden_fullnat.py: scapy not importable ({e}); run with /usr/bin/python3 "
             "after scripts/setup.sh (python3-scapy)")

import golden_forwarding as gf  # noqa: E402  (frame builders, expectation format, checker)
import golden_arp_icmp as base  # noqa: E402
from golden_arp_icmp import Report  # noqa: E402

OUR_MAC, OUR_IP = gf.OUR_MAC, gf.OUR_IP
CLIENT_MAC, CLIENT_IP = gf.CLIENT_MAC, gf.CLIENT_IP
VIP = "198.18.0.240"
LIPS = ["198.18.0.50", "198.18.0.51"]
NOT_A_LIP = "198.18.0.52"
RSS = [("198.18.0.21", "02:00:00:00:00:21"), ("198.18.0.22", "02:00:00:00:00:22")]  # rr order
RIPS = [ip for ip, _ in RSS]
PORTS = {"tcp": (80, 8080), "udp": (3333, 4444)}  # proto -> (VIP port, real port)
LPORT_MIN, LPORT_MAX = 1024, 65535
# Session -> (proto, client port, index of the real server rr picks). Per service,
# sessions open in this order; all stay live to the end (timeouts of 600 s).
SESSIONS = {
    "T1": ("tcp", 41001, 0),
    "T2": ("tcp", 41002, 1),
    "T3": ("tcp", 41003, 0),
    "U1": ("udp", 42001, 0),
    "U2": ("udp", 42002, 1),
    "U3": ("udp", 42003, 0),
}
# Stands in for the binding of a session whose first packet never came out, so the
# script can go on (check then fails, naming the session).
PLACEHOLDER = (LIPS[0], 1, 0)


def services_toml():
    t = ["[timeouts]"]
    for k in ("tcp", "tcpfin", "udp", "syn_recv", "syn_sent", "time_wait", "close", "close_wait", "last_ack"):
        t.append(f"{k} = 600")
    t.append("")
    lips = ", ".join(f'"{x}"' for x in LIPS)
    for proto, (vport, rport) in PORTS.items():
        t += ["[[services]]", f'proto = "{proto}"', f'vip = "{VIP}"', f"port = {vport}", 'scheduler = "rr"',
              f"local_addresses = [{lips}]", ""]
        for rip, _ in RSS:
            t += ["  [[services.real_servers]]", f'  ip = "{rip}"', f"  port = {rport}", "  weight = 1",
                  '  mode = "fullnat"', ""]
    return "\n".join(t)


# ----------------------------------------------------------------------------------
# Expected outputs (golden_forwarding.py's format), from an input frame and bindings.


def session_rs(key):
    proto, cport, rsi = SESSIONS[key]
    rip, rs_mac = RSS[rsi]
    vport, rport = PORTS[proto]
    return proto, cport, rip, rs_mac, vport, rport


def l4_name(proto):
    return "TCP" if proto == "tcp" else "UDP"


def tcp_timestamps(frame):
    """(TSval, TSecr) of a frame's TCP timestamps option, or None."""
    try:
        p = Ether(frame)
    except Exception:  # noqa: BLE001 (undecodable: no timestamps)
        return None
    if TCP not in p:
        return None
    return next((tuple(v) for k, v in p[TCP].options if k == "Timestamp"), None)


def timestamps_moved(raw, tsval_add=0, tsecr_sub=0):
    """raw with its TCP timestamps option moved (TSval + tsval_add, TSecr - tsecr_sub,
    modulo 2^32), everything else as it was (nat_rewrite then computes the checksums).
    Frames without the option are returned as they are."""
    body = gf.strip_pad(raw)
    p = Ether(body)
    if TCP not in p or tcp_timestamps(body) is None:
        return raw
    opts = []
    for k, v in p[TCP].options:
        if k == "Timestamp":
            v = ((v[0] + tsval_add) & 0xFFFFFFFF, (v[1] - tsecr_sub) & 0xFFFFFFFF)
        opts.append((k, v))
    p[TCP].options = opts
    new = bytes(p)
    assert len(new) == len(body), "scapy re-laid the options"
    return new + raw[len(body):]


def expect_to_rs(name, raw, key, b):
    """A client frame of session `key` as the real server must get it: addresses and
    ports rewritten, and the TSval moved by the session's timestamp offset."""
    proto, _, rip, rs_mac, _, rport = session_rs(key)
    lip, lport, offset = b[key]
    moved = timestamps_moved(raw, tsval_add=offset)
    alts = [gf.with_macs(a, rs_mac, OUR_MAC) for a in gf.nat_rewrite(moved, src=lip, sport=lport, dst=rip, dport=rport)]
    l4 = l4_name(proto)
    fields = {"IP.src": lip, "IP.dst": rip, f"{l4}.sport": lport, f"{l4}.dport": rport, **gf.ip_fields(raw)}
    p = Ether(gf.strip_pad(raw))
    if proto == "tcp":
        fields.update({"TCP.seq": p[TCP].seq, "TCP.ack": p[TCP].ack, "TCP.flags": int(p[TCP].flags)})
    elif p[UDP].chksum == 0:
        fields["UDP.chksum"] = 0
    return gf.out("fullnat-in", name, alts, rs_mac, fields, zero_eq=[24] + gf.l4_zero_eq(raw))


def expect_to_client(name, raw, key, b):
    """A real server's frame of session `key` as the client must get it: addresses and
    ports restored, and the TSecr moved back by the session's timestamp offset."""
    proto, cport, _, _, vport, _ = session_rs(key)
    moved = timestamps_moved(raw, tsecr_sub=b[key][2])
    alts = [gf.with_macs(a, CLIENT_MAC, OUR_MAC) for a in gf.nat_rewrite(moved, src=VIP, sport=vport, dst=CLIENT_IP,
                                                                         dport=cport)]
    l4 = l4_name(proto)
    fields = {"IP.src": VIP, "IP.dst": CLIENT_IP, f"{l4}.sport": vport, f"{l4}.dport": cport, **gf.ip_fields(raw)}
    p = Ether(gf.strip_pad(raw))
    if proto == "tcp":
        fields.update({"TCP.seq": p[TCP].seq, "TCP.ack": p[TCP].ack, "TCP.flags": int(p[TCP].flags)})
    elif p[UDP].chksum == 0:
        fields["UDP.chksum"] = 0
    return gf.out("fullnat-out", name, alts, CLIENT_MAC, fields, zero_eq=[24] + gf.l4_zero_eq(raw))


def ip_packet(frame_hex_or_raw):
    raw = bytes.fromhex(frame_hex_or_raw) if isinstance(frame_hex_or_raw, str) else frame_hex_or_raw
    return gf.strip_pad(raw)[14:]


def quote_alts(orig_ip, translated_ip):
    """The quote of orig_ip as expected after translating an error about
    translated_ip back: exactly orig's, or with the quoted UDP checksum left as it was
    (a quoted TCP header of 8 bytes holds no checksum)."""
    q_orig, q_tr = gf.quote_of(orig_ip), gf.quote_of(translated_ip)
    if orig_ip[9] == 17:
        return [q_orig, gf.with_quoted_l4_checksum(q_orig, q_tr)]
    return [q_orig]


def expect_icmp(name, raw, key, b, towards, orig_ip, next_hop_mtu=None):
    """An ICMP error about a packet of session `key`: towards "client" (it came from the
    real-server side, to the LIP) or "rs" (it came from the client, to the VIP).
    orig_ip: the packet the receiver sent, which the translated quote must show.
    next_hop_mtu: the frag-needed MTU the receiver must see, if not the sender's."""
    proto, cport, rip, rs_mac, vport, rport = session_rs(key)
    lip, lport, _ = b[key]
    translated = gf.strip_pad(raw)[14 + 20 + 8:]
    if next_hop_mtu is not None:
        raw = raw[:14 + 20 + 6] + next_hop_mtu.to_bytes(2, "big") + raw[14 + 20 + 8:]
    alts = []
    for q in quote_alts(orig_ip, translated):
        if towards == "client":
            alts.append(gf.with_macs(gf.translate_icmp(raw, outer_src=VIP, outer_dst=CLIENT_IP, new_quote=q),
                                     CLIENT_MAC, OUR_MAC))
        else:
            alts.append(gf.with_macs(gf.translate_icmp(raw, outer_src=lip, outer_dst=rip, new_quote=q),
                                     rs_mac, OUR_MAC))
    p = Ether(raw)
    l4 = "TCPerror" if proto == "tcp" else "UDPerror"
    if towards == "client":
        fields = {"IP.src": VIP, "IP.dst": CLIENT_IP, "IPerror.src": CLIENT_IP, "IPerror.dst": VIP,
                  f"{l4}.sport": cport, f"{l4}.dport": vport}
    else:
        fields = {"IP.src": lip, "IP.dst": rip, "IPerror.src": rip, "IPerror.dst": lip,
                  f"{l4}.sport": rport, f"{l4}.dport": lport}
    fields.update({"IP.ttl": p[IP].ttl, "IP.id": p[IP].id, "ICMP.type": p[ICMP].type, "ICMP.code": p[ICMP].code})
    if next_hop_mtu is not None:
        fields["ICMP.nexthopmtu"] = next_hop_mtu
    return gf.out("icmp-fullnat", name, alts, CLIENT_MAC if towards == "client" else rs_mac, fields,
                  zero_eq=[24, 36, 14 + 20 + 8 + 10])


def expect_arp_reply(name, req, asked, requester_mac, requester_ip):
    return gf.out("arp-reply", name, [base.expected_arp_reply(req)], requester_mac,
                  {"ARP.op": 2, "ARP.hwsrc": OUR_MAC, "ARP.psrc": asked, "ARP.hwdst": requester_mac,
                   "ARP.pdst": requester_ip})


# ----------------------------------------------------------------------------------
# The script: steps whose frames and expectations are functions of the bindings.


class Step:
    """name; make(b) -> frame; drop: the reason it is dropped for, or None;
    expect(b, raw) -> [expected outputs]; opens: the session whose first packet it is;
    session: the session it is counted on (real-server statistics)."""

    def __init__(self, name, make, drop=None, expect=None, opens=None, session=None):
        self.name, self.make, self.drop, self.opens, self.session = name, make, drop, opens, session
        self.expect = expect or (lambda b, raw: [])


def script():
    S = []
    c = CLIENT_IP
    mss = [("MSS", 1460), ("SAckOK", b""), ("Timestamp", (1000, 0)), ("NOP", None), ("WScale", 7)]
    (rip1, mac1), (rip2, mac2) = RSS
    tv, tr = PORTS["tcp"]
    uv, ur = PORTS["udp"]

    def const(raw):
        return lambda b: raw

    def client_tcp(key, flags, seq, ack=0, **kw):
        _, cport, *_ = session_rs(key)
        return lambda b: gf.tcp(c, cport, VIP, tv, flags, seq, ack, **kw)

    def client_udp(key, data, **kw):
        _, cport, *_ = session_rs(key)
        return lambda b: gf.udp(c, cport, VIP, uv, data, **kw)

    def rs_tcp(key, flags, seq, ack=0, **kw):
        _, _, rip, rs_mac, _, rport = session_rs(key)
        return lambda b: gf.tcp(rip, rport, b[key][0], b[key][1], flags, seq, ack, src_mac=rs_mac, **kw)

    def rs_udp(key, data, **kw):
        _, _, rip, rs_mac, _, rport = session_rs(key)
        return lambda b: gf.udp(rip, rport, b[key][0], b[key][1], data, src_mac=rs_mac, **kw)

    def to_rs(key, opens=False):
        def add(name, make):
            S.append(Step(name, make, expect=lambda b, raw: [expect_to_rs(name, raw, key, b)],
                          opens=key if opens else None, session=key))
        return add

    def to_client(key):
        def add(name, make):
            S.append(Step(name, make, expect=lambda b, raw: [expect_to_client(name, raw, key, b)], session=key))
        return add

    def drop(name, make, reason):
        S.append(Step(name, make, drop=reason))

    # --- neighbours: the real servers answer Sluice's who-has; they resolve the LIPs ---
    for rip, mac in RSS:
        drop(f"ARP reply from the real server {rip}", const(gf.arp_reply_from(mac, rip)), "arp_reply")
    for (rip, mac), lip in ((RSS[0], LIPS[0]), (RSS[1], LIPS[1]), (RSS[1], LIPS[0]), (RSS[0], LIPS[1])):
        req = base.arp_request(mac, rip, lip)
        S.append(Step(f"{rip} who-has LIP {lip}", const(req),
                      expect=lambda b, raw, n=f"is-at for LIP {lip} to {rip}", lip=lip, mac=mac, rip=rip:
                      [expect_arp_reply(n, raw, lip, mac, rip)]))
    drop(f"{rip1} who-has {NOT_A_LIP} (not Sluice's)", const(base.arp_request(mac1, rip1, NOT_A_LIP)),
         "arp_not_for_us")
    req = base.arp_request(CLIENT_MAC, c, VIP)
    S.append(Step(f"client who-has the VIP {VIP}", const(req),
                  expect=lambda b, raw: [expect_arp_reply(f"is-at for the VIP {VIP}", raw, VIP, CLIENT_MAC, c)]))
    ping = base.echo_request(mac1, rip1, dst_ip=LIPS[0], size=24, seq=1, seed=5)
    S.append(Step(f"echo from {rip1} to LIP {LIPS[0]}", const(ping),
                  expect=lambda b, raw: [gf.out("echo-reply", f"echo reply from LIP {LIPS[0]}",
                                                [base.expected_echo_reply(raw)], mac1,
                                                {"IP.src": LIPS[0], "IP.dst": rip1, "ICMP.type": 0, "IP.ttl": 64})]))

    # --- TCP: T1 complete (handshake, data both ways, FIN both ways); T2 and T3 open
    # while T1 is established (T3 goes to T1's real server on T1's LIP) -------------
    rq, rs = gf.http_request(VIP), gf.http_response("rs1")
    to_rs("T1", True)("T1 SYN (TTL 61, options)", client_tcp("T1", "S", 1000, options=mss, ip_id=101, ttl=61))
    to_client("T1")("T1 SYN-ACK from rs1", rs_tcp("T1", "SA", 5000, 1001, options=mss, ip_id=201))
    to_rs("T1")("T1 ACK (padded to 60)", client_tcp("T1", "A", 1001, 5001, ip_id=102, pad_to=60))
    to_rs("T1")("T1 request", client_tcp("T1", "PA", 1001, 5001, data=rq, ip_id=103))
    to_rs("T2", True)("T2 SYN", client_tcp("T2", "S", 2000, options=mss, ip_id=111))
    to_client("T1")("T1 response from rs1", rs_tcp("T1", "PA", 5001, 1001 + len(rq), data=rs, ip_id=202))
    t2_syn_ack = rs_tcp("T2", "SA", 6000, 2001, options=mss, ip_id=301)
    to_client("T2")("T2 SYN-ACK from rs2", t2_syn_ack)
    t2_ack = client_tcp("T2", "A", 2001, 6001, ip_id=112)
    to_rs("T2")("T2 ACK", t2_ack)
    to_rs("T3", True)("T3 SYN (rs1 again, T1 still established)",
                      client_tcp("T3", "S", 3000, options=mss, ip_id=121, tos=0x10))
    to_client("T3")("T3 SYN-ACK from rs1", rs_tcp("T3", "SA", 7000, 3001, options=mss, ip_id=203))
    to_rs("T3")("T3 ACK", client_tcp("T3", "A", 3001, 7001, ip_id=122))

    # A router behind rs2 returns time-exceeded for T2's ACK as rs2's side saw it
    # (LIP:lport -> RIP:8080, 8 bytes of TCP quoted): the client must see it from the
    # VIP, about its own segment.
    def t2_time_exceeded(b):
        seen = ip_packet(expect_to_rs("", t2_ack(b), "T2", b)["alts"][0])
        return gf.icmp_error(rip2, b["T2"][0], 11, 0, seen, src_mac=mac2, ip_id=302)
    S.append(Step("ICMP time-exceeded from rs2's side about T2's ACK", t2_time_exceeded, session="T2",
                  expect=lambda b, raw: [expect_icmp("time-exceeded to the client about T2's ACK", raw, "T2", b,
                                                     "client", ip_packet(t2_ack(b)))]))

    drop("client TCP ACK without a session", lambda b: gf.tcp(c, 41009, VIP, tv, "A", 9, 9, ip_id=131),
         "tcp_no_session")
    drop(f"rs1 TCP ACK to LIP {LIPS[0]}:1000 (no session; the LIP is Sluice's)",
         lambda b: gf.tcp(rip1, tr, LIPS[0], 1000, "A", 9, 9, ip_id=204, src_mac=mac1), "tcp_no_session")
    to_client("T1")("T1 FIN from rs1 (padded to 60)",
                    rs_tcp("T1", "FA", 5001 + len(rs), 1001 + len(rq), ip_id=205, pad_to=60))
    to_rs("T1")("T1 FIN from the client", client_tcp("T1", "FA", 1001 + len(rq), 5002 + len(rs), ip_id=104))
    to_client("T1")("T1 last ACK from rs1", rs_tcp("T1", "A", 5002 + len(rs), 1002 + len(rq), ip_id=206))

    # --- UDP: U1 request, reply, error from the client about the reply; U2 answered
    # with port unreachable; U3 without checksum ------------------------------------
    u1_req = client_udp("U1", b"fullnat udp request " + base.payload(30, 1), ip_id=501)
    to_rs("U1", True)("U1 request", u1_req)
    u1_reply = rs_udp("U1", b"rs1 " + base.payload(40, 2), ip_id=601)
    to_client("U1")("U1 reply from rs1", u1_reply)
    u2_req = client_udp("U2", b"to a closed port " + base.payload(20, 3), ip_id=502, tos=0xB8, df=False)
    to_rs("U2", True)("U2 request (TOS 0xb8, no DF)", u2_req)

    def u2_unreachable(b):
        seen = ip_packet(expect_to_rs("", u2_req(b), "U2", b)["alts"][0])
        return gf.icmp_error(rip2, b["U2"][0], 3, 3, seen, src_mac=mac2, ip_id=602)
    S.append(Step("ICMP port-unreachable from rs2 about U2's request", u2_unreachable, session="U2",
                  expect=lambda b, raw: [expect_icmp("port-unreachable to the client about U2", raw, "U2", b,
                                                     "client", ip_packet(u2_req(b)))]))

    def u1_rejected(b):
        seen = ip_packet(expect_to_client("", u1_reply(b), "U1", b)["alts"][0])
        return gf.icmp_error(c, VIP, 3, 3, seen, ip_id=503)
    S.append(Step("ICMP port-unreachable from the client about U1's reply", u1_rejected, session="U1",
                  expect=lambda b, raw: [expect_icmp("port-unreachable to rs1 about its U1 reply", raw, "U1", b,
                                                     "rs", ip_packet(u1_reply(b)))]))

    # A frag-needed from the client's side about a UDP reply is dropped: the real
    # server would fragment its larger replies to the local address, for every client
    # behind it, and Sluice forwards no fragment.
    def u1_frag_needed(b):
        seen = ip_packet(expect_to_client("", u1_reply(b), "U1", b)["alts"][0])
        return gf.icmp_error(c, VIP, 3, 4, seen, ip_id=505, mtu=576)
    drop("ICMP frag-needed (MTU 576) from the client about U1's reply", u1_frag_needed,
         "icmp_too_big_about_udp")
    # About a TCP segment it goes on (the server checks the quoted sequence number); the
    # real server knows every client as the local address, so the MTU it hears is at
    # least 1280 (a forged 576 would lower it for all of them).
    def t2_frag_needed(b):
        seen = ip_packet(expect_to_client("", t2_syn_ack(b), "T2", b)["alts"][0])
        return gf.icmp_error(c, VIP, 3, 4, seen, ip_id=507, mtu=576)
    S.append(Step("ICMP frag-needed (MTU 576) from the client about T2's SYN-ACK", t2_frag_needed,
                  session="T2",
                  expect=lambda b, raw: [expect_icmp("frag-needed (MTU 1280) to rs2 about its T2 SYN-ACK", raw,
                                                     "T2", b, "rs", ip_packet(t2_syn_ack(b)),
                                                     next_hop_mtu=1280)]))
    unknown = bytes(IP(src=LIPS[1], dst=rip1, flags="DF") / UDP(sport=1000, dport=ur) / b"?")
    drop("ICMP port-unreachable from rs1 quoting a LIP port without a session",
         lambda b: gf.icmp_error(rip1, LIPS[1], 3, 3, unknown, src_mac=mac1, ip_id=603), "icmp_error_no_session")
    drop("UDP to a VIP port without a service", lambda b: gf.udp(c, 42009, VIP, uv + 1, b"nobody", ip_id=504),
         "no_service")
    to_rs("U3", True)("U3 request without UDP checksum (0 stays 0), padded",
                      client_udp("U3", b"no sum", ip_id=505, chksum=0, pad_to=60))
    to_client("U3")("U3 reply from rs1 without UDP checksum", rs_udp("U3", b"rs1 no sum", ip_id=604, chksum=0))

    # --- the end: every live session still uses its LIP:lport ------------------------
    to_rs("U1")("U1 second request", client_udp("U1", b"again", ip_id=506))
    to_rs("T2")("T2 request", client_tcp("T2", "PA", 2001, 6001, data=gf.http_request(VIP), ip_id=113))
    to_rs("T3")("T3 request", client_tcp("T3", "PA", 3001, 7001, data=gf.http_request(VIP), ip_id=123))
    to_client("T3")("T3 response from rs1", rs_tcp("T3", "PA", 7001, 3001 + len(gf.http_request(VIP)),
                                                   data=gf.http_response("rs1"), ip_id=207))
    return S


# Which sessions end ESTABLISHED (active); the others are inactive at the end.
ACTIVE_AT_END = {"T2", "T3"}


# ----------------------------------------------------------------------------------
# Bindings


def binding_from_output(frame, key, raw_in):
    """(LIP, lport, timestamp offset) from the first output of session key's opening
    packet raw_in, or None when the frame is not a TCP/UDP packet towards the session's
    real server. The offset is what Sluice added to the TSval (0 without timestamps)."""
    proto, _, rip, _, _, rport = session_rs(key)
    try:
        p = Ether(frame)
    except Exception:  # noqa: BLE001 (anything undecodable is simply not a binding)
        return None
    cls = TCP if proto == "tcp" else UDP
    if IP not in p or cls not in p or p[IP].dst != rip or p[cls].dport != rport:
        return None
    ts_in, ts_out = tcp_timestamps(raw_in), tcp_timestamps(frame)
    offset = (ts_out[0] - ts_in[0]) & 0xFFFFFFFF if ts_in and ts_out else 0
    return (p[IP].src, p[cls].sport, offset)


def binding_problems(bindings):
    """What is wrong with the bindings the daemon chose (a list of messages)."""
    errs = []
    for key in SESSIONS:
        v = bindings.get(key)
        if v is None:
            errs.append(f"session {key}: its first packet produced no output towards its real server, so no "
                        f"LIP:lport was learned (the real server's frames used {PLACEHOLDER})")
            continue
        lip, lport, offset = v
        if SESSIONS[key][0] == "udp" and offset != 0:
            errs.append(f"session {key}: a UDP session's timestamp offset {offset} (UDP has no timestamps)")
        if SESSIONS[key][0] == "tcp" and offset == 0:
            errs.append(f"session {key}: the SYN's TSval came out unchanged: timestamps not moved onto "
                        "Sluice's clock (rewrite_timestamps is on by default)")
        if lip not in LIPS:
            errs.append(f"session {key}: source {lip} is not one of the service's local addresses {LIPS}")
        if not LPORT_MIN <= lport <= LPORT_MAX:
            errs.append(f"session {key}: local port {lport} outside {LPORT_MIN}..={LPORT_MAX}")
    keys = [k for k in SESSIONS if bindings.get(k) is not None]
    for i, k1 in enumerate(keys):
        for k2 in keys[i + 1:]:
            same_dest = SESSIONS[k1][0] == SESSIONS[k2][0] and SESSIONS[k1][2] == SESSIONS[k2][2]
            if same_dest and tuple(bindings[k1][:2]) == tuple(bindings[k2][:2]):
                errs.append(f"sessions {k1} and {k2} (concurrent, same real server) share "
                            f"{tuple(bindings[k1][:2])}")
    # Every SYN of the script carries the same TSval: the values Sluice gave them are its
    # clock at each opening, which must never go back (RFC 1982 order, as PAWS compares).
    tcp = [k for k in SESSIONS if SESSIONS[k][0] == "tcp" and bindings.get(k)]
    for k1, k2 in zip(tcp, tcp[1:]):
        step = (bindings[k2][2] - bindings[k1][2]) & 0xFFFFFFFF
        if step >= 1 << 31:
            errs.append(f"sessions {k1} then {k2}: Sluice's timestamp clock went back "
                        f"({bindings[k1][2]} then {bindings[k2][2]} added to the same TSval)")
    for proto in PORTS:
        order = [k for k in SESSIONS if SESSIONS[k][0] == proto]
        lips = [bindings[k][0] if bindings.get(k) else None for k in order]
        for (k1, a), (k2, b) in zip(zip(order, lips), zip(order[1:], lips[1:])):
            if a is not None and b is not None and a == b:
                errs.append(f"{proto} service: sessions {k1} and {k2}, opened one after the other, both use LIP "
                            f"{a}: local addresses are not taken round robin ({dict(zip(order, lips))})")
    return errs


def usable(bindings):
    return {k: tuple(bindings[k]) if bindings.get(k) else PLACEHOLDER for k in SESSIONS}


# ----------------------------------------------------------------------------------
# config / run


def cmd_config(_args):
    print(services_toml())
    return 0


def read_pcap_frames(path):
    """The complete records of a pcap file that may still be growing."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return []
    if len(data) < 24:
        return []
    endian = "<" if data[:4] in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1") else ">"
    frames, off = [], 24
    while off + 16 <= len(data):
        incl = struct.unpack(endian + "I", data[off + 8:off + 12])[0]
        if off + 16 + incl > len(data):
            break
        frames.append(data[off + 16:off + 16 + incl])
        off += 16 + incl
    return frames


def status_json(args):
    r = subprocess.run([args.sluicectl, "--socket", args.socket, "status", "--json"], capture_output=True,
                       text=True, timeout=10)
    if r.returncode != 0:
        return None
    return json.loads(r.stdout)


def drops_total(args):
    status = status_json(args)
    return None if status is None else sum(status.get("drops", {}).values())


def events_reached(args, want):
    """Whether every event counter named in `want` has reached its value."""
    if not want:
        return True
    events = (status_json(args) or {}).get("events", {})
    return all(events.get(k, 0) >= v for k, v in want.items())


def play_live(args, steps, bindings, usable, learn):
    """Sends the frames of `steps` on args.iface one at a time, each made from
    usable(bindings); after each, waits (at most 3 s) until args.out_pcap holds its
    expected outputs (Sluice's ARP requests for real servers aside), for a frame that
    must be dropped until the drop counters have grown, and for a step with `events`
    ({name: n}, optional) until those event counters have grown by n; then calls
    learn(step, raw, new_outputs), which may update bindings. A step's `drop_later`
    (optional) is a drop that comes later (a frame held, then dropped): once every
    frame was sent, the play waits (at most 5 s) until the drop counters have grown by
    those too. Writes args.in_pcap (the frames sent). Returns the timeouts (a list of
    messages), None when sluicectl does not answer."""
    sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    sock.bind((args.iface, 0))
    sent, timeouts = [], []

    def outputs():
        return [f for f in read_pcap_frames(args.out_pcap) if not gf.is_our_arp_request(f, args.rips)]

    want_out = len(outputs())
    if want_out:
        print(f"note: {want_out} frame(s) in {args.out_pcap} before the first input", flush=True)
    status = status_json(args)
    if status is None:
        print("FAIL: sluicectl status does not answer", flush=True)
        return None
    want_drops = sum(status.get("drops", {}).values())
    want_events = dict(status.get("events", {}))
    later = 0
    for step in steps:
        b = usable(bindings)
        raw = step.make(b)
        n = len(step.expect(b, raw))
        sock.send(raw)
        sent.append(raw)
        first = want_out
        want_out += n
        want_drops += 1 if step.drop else 0
        later += 1 if getattr(step, "drop_later", None) else 0
        events = getattr(step, "events", None) or {}
        for k, v in events.items():
            want_events[k] = want_events.get(k, 0) + v
        step_events = {k: want_events[k] for k in events}
        deadline = time.monotonic() + 3.0
        while True:
            outs = outputs()
            if (len(outs) >= want_out and (step.drop is None or (drops_total(args) or 0) >= want_drops)
                    and events_reached(args, step_events)):
                break
            if time.monotonic() > deadline:
                timeouts.append(f"{step.name}: {len(outs) - first} of {n} output(s) after 3 s"
                                + ("" if step.drop is None else f", drops {drops_total(args)} of {want_drops}")
                                + ("" if not events else f", events short of {step_events}"))
                print(f"timeout: {timeouts[-1]}", flush=True)
                break
            time.sleep(0.002)
        learn(step, raw, outs[first:])
    if later:
        want_drops += later
        deadline = time.monotonic() + 5.0
        while (drops_total(args) or 0) < want_drops:
            if time.monotonic() > deadline:
                timeouts.append(f"{later} later drop(s): drops {drops_total(args)} of {want_drops} after 5 s")
                print(f"timeout: {timeouts[-1]}", flush=True)
                break
            time.sleep(0.01)
    time.sleep(0.3)
    gf.write_pcap(args.in_pcap, sent)
    print(f"sent {len(sent)} frames; {len(timeouts)} timeout(s)", flush=True)
    return timeouts


def cmd_run(args):
    bindings = {}

    def learn(step, raw, new_outputs):
        if step.opens:
            bindings[step.opens] = next((bd for bd in (binding_from_output(f, step.opens, raw)
                                                       for f in new_outputs) if bd), None)
            print(f"{step.opens}: {bindings[step.opens]}", flush=True)

    args.rips = RIPS
    timeouts = play_live(args, script(), bindings, usable, learn)
    if timeouts is None:
        return 1
    with open(args.run_json, "w") as f:
        json.dump({"bindings": {k: list(v) if v else None for k, v in
                                ((k, bindings.get(k)) for k in SESSIONS)},
                   "timeouts": timeouts}, f, indent=1)
    return 0


# ----------------------------------------------------------------------------------
# check


def build_expectations(bindings):
    """The frames (from the script and the bindings) and golden_forwarding.py's
    expectation dict for them."""
    b = usable(bindings)
    steps = script()
    frames, outputs, drops = [], [], {r: 0 for r in gf.DROP_REASONS + ["laddr_exhausted", "icmp_too_big_about_udp"]}
    ledger = {(proto, rip): {"connections": 0, "active": 0, "in_min": 0, "in_max": 0, "out_min": 0, "out_max": 0}
              for proto in PORTS for rip in RIPS}
    for index, step in enumerate(steps):
        raw = step.make(b)
        outs = step.expect(b, raw)
        for o in outs:
            o["input_index"] = index
        outputs += outs
        frames.append({"index": index, "name": step.name, "drop": step.drop, "outputs": len(outs),
                       "len": len(raw), "raw": raw})
        if step.drop:
            drops[step.drop] += 1
        if step.session:
            proto, _, rip, *_ = session_rs(step.session)
            e = ledger[(proto, rip)]
            if step.opens:
                e["connections"] += 1
                e["active"] += int(step.opens in ACTIVE_AT_END)
            p = Ether(raw)
            icmp = ICMP in p
            side = "out" if p[IP].src in RIPS else "in"
            e[f"{side}_max"] += 1
            if not icmp:
                e[f"{side}_min"] += 1
    created = len(SESSIONS)
    expect = {
        "appliance": {"mac": OUR_MAC, "ip": OUR_IP},
        "client": {"mac": CLIENT_MAC, "ip": CLIENT_IP},
        "vip": VIP, "local_addresses": LIPS, "rips": RIPS,
        "bindings": {k: list(v) for k, v in b.items()},
        "services_toml": services_toml(),
        "input_frames": len(frames),
        "frames": [{k: v for k, v in f.items() if k != "raw"} for f in frames],
        "outputs": outputs,
        "drops": drops,
        "events": {"arp_replied": sum(1 for o in outputs if o["kind"] == "arp-reply"),
                   "icmp_echo_replied": sum(1 for o in outputs if o["kind"] == "echo-reply"),
                   "neighbour_learned": 1 + len(RIPS), "neighbour_table_full": 0},
        "sessions_created": created, "sessions_expired": 0, "sessions": created,
        "real_servers": [{"vip": VIP, "rip": rip, "mode": "fullnat", "services": [[proto, PORTS[proto][0]]],
                          "connections": e["connections"], "active": e["active"],
                          "inactive": e["connections"] - e["active"], **{k: e[k] for k in
                                                                         ("in_min", "in_max", "out_min", "out_max")}}
                         for (proto, rip), e in ledger.items()],
    }
    return [f["raw"] for f in frames], expect


def check_live(args, run, bindings, problems, frames, expect, what):
    """The verdict of a live run: `problems` (with what Sluice chose, named `what`),
    IN_PCAP equal to `frames` (the script played with `bindings`), and
    golden_forwarding.py's checker on OUT_PCAP against `expect` (written to
    EXPECT_JSON). Returns 0 when all is well, 1 with a report otherwise."""
    rep = Report()
    for t in run.get("timeouts", []):
        print(f"note: during the run: {t}")
    for e in problems:
        rep.fail(e)
    sent = [bytes(p) for p in rdpcap(args.in_pcap)]
    if sent != frames:
        diff = next((i for i in range(min(len(sent), len(frames))) if sent[i] != frames[i]), None)
        rep.fail(f"{args.in_pcap} is not the script played with the bindings {bindings}: "
                 f"{len(sent)} frames, expected {len(frames)}"
                 + (f"; first difference at frame #{diff} ({expect['frames'][diff]['name']})" if diff is not None
                    else ""))
    with open(args.expect_json, "w") as f:
        json.dump(expect, f, indent=1)
    rc = gf.cmd_check(argparse.Namespace(in_pcap=args.in_pcap, out_pcap=args.out_pcap,
                                         expect_json=args.expect_json, summary=args.summary))
    if rep.errors:
        print(f"FAIL: {len(rep.errors)} problem(s) with {what} or the input:")
        for e in rep.errors:
            print(f"  - {e}")
        return 1
    return rc


def cmd_check(args):
    with open(args.run_json) as f:
        run = json.load(f)
    bindings = {k: tuple(v) if v else None for k, v in run["bindings"].items()}
    frames, expect = build_expectations(bindings)
    rc = check_live(args, run, bindings, binding_problems(bindings), frames, expect, "the FullNAT bindings")
    if rc == 0:
        print(f"OK: bindings {dict(sorted(bindings.items()))}: LIPs round robin, local ports in range and "
              "distinct per real server")
    return rc


# ----------------------------------------------------------------------------------
# selftest


GOOD_BINDINGS = {"T1": ("198.18.0.50", 20001, 0xFFFFFF00), "T2": ("198.18.0.51", 33333, 0xFFFFFF07),
                 "T3": ("198.18.0.50", 20002, 0x00000011),
                 "U1": ("198.18.0.51", 1024, 0), "U2": ("198.18.0.50", 40001, 0), "U3": ("198.18.0.51", 65535, 0)}


def rewritten(frame, **changes):
    """frame with IP/L4 fields changed (e.g. sport=1), every checksum recomputed."""
    p = Ether(frame)
    ip = p[IP]
    l4 = p[TCP] if TCP in p else p[UDP]
    for k, v in changes.items():
        setattr(ip if k in ("src", "dst", "ttl") else l4, k, v)
    del ip.chksum
    if not (isinstance(l4, UDP) and l4.chksum == 0):
        del l4.chksum
    return bytes(p)


def run_captured(fn, ns):
    """fn(ns) with its stdout captured: (return value, the first problem it reported)."""
    saved = sys.stdout
    sys.stdout = io.StringIO()
    try:
        rc = fn(ns)
    finally:
        text, sys.stdout = sys.stdout.getvalue(), saved
    first = next((line.strip() for line in text.splitlines() if line.startswith("  - ")), "")
    return rc, first


def cmd_selftest(args):
    os.makedirs(args.dir, exist_ok=True)
    failures = []

    def scenario(label, bindings, want_ok, out_frames=None, in_bindings=None):
        """Writes the input played with in_bindings (default: bindings), run.json with
        bindings, and out_frames (default: the expected output for them), then checks."""
        d = os.path.join(args.dir, label)
        os.makedirs(d, exist_ok=True)
        frames, expect = build_expectations(in_bindings or bindings)
        in_pcap, out_pcap = os.path.join(d, "in.pcap"), os.path.join(d, "out.pcap")
        run_json, expect_json = os.path.join(d, "run.json"), os.path.join(d, "expect.json")
        gf.write_pcap(in_pcap, frames)
        if out_frames is None:
            out_frames = good_frames(expect)
        gf.write_pcap(out_pcap, out_frames)
        with open(run_json, "w") as f:
            json.dump({"bindings": {k: list(v) if v else None for k, v in bindings.items()}}, f)
        rc, why = run_captured(cmd_check, argparse.Namespace(in_pcap=in_pcap, out_pcap=out_pcap, run_json=run_json,
                                                             expect_json=expect_json, summary=None))
        ok = rc == 0
        if ok != want_ok:
            failures.append(f"{label}: checker returned {rc}, expected {'success' if want_ok else 'failure'}")
        print(f"selftest {label}: checker {'accepts' if ok else 'rejects'} "
              f"({'as it must' if ok == want_ok else 'WRONG'})" + (f": {why[:150]}" if why else ""))

    def good_frames(expect):
        return [bytes.fromhex(o["alts"][-1]) for o in expect["outputs"]]

    _, expect = build_expectations(GOOD_BINDINGS)
    good = good_frames(expect)
    names = [o["name"] for o in expect["outputs"]]

    def at(prefix):
        return next(i for i, n in enumerate(names) if n.startswith(prefix))

    def replaced(i, frame):
        return good[:i] + [frame] + good[i + 1:]

    arp = bytes(Ether(src=OUR_MAC, dst="ff:ff:ff:ff:ff:ff") / ARP(op=1, hwsrc=OUR_MAC, psrc=OUR_IP,
                                                                   pdst=RIPS[1])) + b"\x00" * 18
    scenario("correct", GOOD_BINDINGS, True)
    scenario("correct-with-arp-requests-for-real-servers", GOOD_BINDINGS, True, [arp] + good[:7] + [arp] + good[7:])
    t1_req = at("T1 request")
    scenario("lport-changes-within-a-session", GOOD_BINDINGS, False,
             replaced(t1_req, rewritten(good[t1_req], sport=20003)))
    scenario("lip-changes-within-a-session", GOOD_BINDINGS, False,
             replaced(t1_req, rewritten(good[t1_req], src=LIPS[1])))
    resp = at("T1 response")
    scenario("client-port-not-restored", GOOD_BINDINGS, False,
             replaced(resp, rewritten(good[resp], dport=GOOD_BINDINGS["T1"][1])))
    scenario("vip-not-restored", GOOD_BINDINGS, False, replaced(resp, rewritten(good[resp], src=RIPS[0])))
    scenario("client-address-leaks-to-the-real-server", GOOD_BINDINGS, False,
             replaced(t1_req, rewritten(good[t1_req], src=CLIENT_IP)))
    bad_sum = bytearray(good[t1_req])
    bad_sum[14 + 20 + 16] ^= 0x01
    scenario("tcp-checksum-wrong", GOOD_BINDINGS, False, replaced(t1_req, bytes(bad_sum)))
    ttl = bytearray(good[resp])
    ttl[22] -= 1
    scenario("ttl-decremented", GOOD_BINDINGS, False, replaced(resp, gf.ipv4_checksum_fixed(bytes(ttl), 14)))
    icmp = at("port-unreachable to the client about U2")
    q = bytearray(good[icmp])
    q[-6] ^= 0x01  # the quoted destination port
    scenario("icmp-quote-port-wrong", GOOD_BINDINGS, False, replaced(icmp, bytes(q)))
    icmp_rs = at("port-unreachable to rs1")
    scenario("icmp-to-the-real-server-from-the-vip", GOOD_BINDINGS, False,
             replaced(icmp_rs, gf.ipv4_checksum_fixed(good[icmp_rs][:26] + gf.ip_bytes(VIP) + good[icmp_rs][30:], 14)))
    mac = bytearray(good[resp])
    mac[0:6] = gf.mac_bytes(RSS[0][1])
    scenario("reply-sent-to-the-real-server-mac", GOOD_BINDINGS, False, replaced(resp, bytes(mac)))
    lip_arp = at("is-at for LIP 198.18.0.51 to 198.18.0.22")
    scenario("no-arp-reply-for-a-lip", GOOD_BINDINGS, False, good[:lip_arp] + good[lip_arp + 1:])
    scenario("frames-swapped", GOOD_BINDINGS, False, good[:12] + [good[13], good[12]] + good[14:])
    u3 = at("U3 request")
    filled = Ether(good[u3])
    del filled[UDP].chksum  # scapy computes it
    scenario("udp-checksum-0-filled-in", GOOD_BINDINGS, False, replaced(u3, bytes(filled)))
    t1_offset = GOOD_BINDINGS["T1"][2]
    syn = at("T1 SYN")
    scenario("tsval-not-moved-to-the-real-server", GOOD_BINDINGS, False,
             replaced(syn, rewritten(timestamps_moved(good[syn], tsval_add=-t1_offset))))
    syn_ack = at("T1 SYN-ACK")
    scenario("tsecr-not-moved-back-to-the-client", GOOD_BINDINGS, False,
             replaced(syn_ack, rewritten(timestamps_moved(good[syn_ack], tsecr_sub=-t1_offset))))
    scenario("timestamp-clock-goes-back", {**GOOD_BINDINGS, "T2": ("198.18.0.51", 33333, 0xFFFFFE00)}, False)
    scenario("tcp-timestamps-not-rewritten", {**GOOD_BINDINGS, "T1": ("198.18.0.50", 20001, 0)}, False)
    scenario("udp-with-a-timestamp-offset", {**GOOD_BINDINGS, "U1": ("198.18.0.51", 1024, 5)}, False)
    scenario("lport-shared-by-concurrent-sessions", {**GOOD_BINDINGS, "T3": ("198.18.0.50", 20001, 0x11)}, False)
    scenario("lport-below-1024", {**GOOD_BINDINGS, "U2": ("198.18.0.50", 1023, 0)}, False)
    scenario("lip-not-the-services", {**GOOD_BINDINGS, "T2": (NOT_A_LIP, 33333, 0xFFFFFF07)}, False)
    scenario("lips-not-round-robin", {**GOOD_BINDINGS, "T2": ("198.18.0.50", 33333, 0xFFFFFF07)}, False)
    scenario("no-binding-learned", {**GOOD_BINDINGS, "U1": None}, False)
    scenario("input-played-with-another-lport", GOOD_BINDINGS, False,
             in_bindings={**GOOD_BINDINGS, "T1": ("198.18.0.50", 20009, 0xFFFFFF00)})
    if failures:
        print("SELFTEST FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("selftest OK: the checker accepts the expected output and rejects every broken variant")
    return 0


def live_tool_main(doc, commands):
    """The command line of a live golden tool: config, run, check, selftest, each
    handled by commands[name](args)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("config", help="print the services config")
    r = sub.add_parser("run", help="play the script against a running Sluice")
    r.add_argument("iface")
    r.add_argument("in_pcap")
    r.add_argument("out_pcap")
    r.add_argument("run_json")
    r.add_argument("--sluicectl", required=True)
    r.add_argument("--socket", required=True)
    ck = sub.add_parser("check", help="check Sluice's output")
    ck.add_argument("in_pcap")
    ck.add_argument("out_pcap")
    ck.add_argument("run_json")
    ck.add_argument("expect_json")
    ck.add_argument("summary", nargs="?")
    st = sub.add_parser("selftest", help="prove the checker")
    st.add_argument("dir")
    args = parser.parse_args()
    return commands[args.cmd](args)


def main():
    return live_tool_main(__doc__, {"config": cmd_config, "run": cmd_run, "check": cmd_check,
                                    "selftest": cmd_selftest})


if __name__ == "__main__":
    sys.exit(main())
