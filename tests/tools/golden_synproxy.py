#!/usr/bin/python3
"""Golden-packet fixtures for Sluice's SYN proxy (docs/SYNPROXY.md), NAT and FullNAT.

The cookie in Sluice's SYN-ACK is a keyed hash under a secret drawn per process from
/dev/urandom, and the client's ACK must carry it: the input cannot be written before
the run. No test-only secret exists and none is added; as golden_fullnat.py does for
the FullNAT local port, this tool plays the client and the real servers **live**, one
frame at a time, on the test bed's client veth while Sluice receives on the appliance
veth (net_pcap `rx_iface_in=`) and writes what it sends to a pcap file (`tx_pcap=`,
flushed per burst). From each cookie SYN-ACK it reads the cookie and the cookie TSval;
from a FullNAT session's SYN to the real server, its LIP:lport and timestamp offset.
The later frames of the session (the client's ACK carrying the cookie, the real
server's frames to the LIP:lport) are built from them. Everything else, the expected
outputs included, is computed from the script below and those bindings, and checked
offline by golden_forwarding.py's checker (scapy and tshark, byte for byte, every
checksum validated).

What the checker cannot recompute it checks as far as it can: a cookie's low 3 bits
are the MSS index of the client's MSS, its bits 3-4 the time slot of the cookie TSval
(Sluice's clock, whose low 6 bits carry the client's window scale and SACK-permitted
and which must read the wall clock within 5 s); that the cookie is Sluice's own is
proven by Sluice accepting the ACK that carries it, and rejecting the same ACK with a
hash bit flipped, with another ISN, and from another port.

    golden_synproxy.py config
        Prints the services config (TOML) the daemon must run with.

    golden_synproxy.py run IFACE IN_PCAP OUT_PCAP RUN_JSON --sluicectl PATH --socket SOCK
        Plays the script on IFACE (AF_PACKET, run it inside the client's namespace).
        After each frame it waits (bounded: 3 s) until out.pcap holds the frame's
        expected outputs or, for a frame that must be dropped, until the drop counters
        (`sluicectl status --json`) have grown. Writes IN_PCAP (the frames sent) and
        RUN_JSON ({"bindings": {SESSION: {...} or null}, "timeouts": [...]}). Exit 0
        once everything was sent, whatever Sluice did: `check` gives the verdict.

    golden_synproxy.py check IN_PCAP OUT_PCAP RUN_JSON EXPECT_JSON [SUMMARY_JSON]
        Rebuilds the input from the script and the bindings (must equal IN_PCAP),
        checks the bindings (above), writes EXPECT_JSON in golden_forwarding.py's format
        (outputs, drops, events, sessions, real-server statistics) and runs its checker
        on OUT_PCAP. Exit 0 when everything matches, 1 with a report otherwise.

    golden_synproxy.py selftest DIR
        Proves the checker with made-up bindings: the expected output must pass; broken
        outputs and broken bindings (see cmd_selftest) must fail.

Run with /usr/bin/python3 (Debian's scapy). The appliance is 02:53:4c:00:00:01 /
198.18.0.1/24 as in golden_forwarding.py.

The contract encoded here (docs/SYNPROXY.md; docs/TESTING.md, "Golden SYN proxy"):
  * Client SYN -> the cookie SYN-ACK, back to the client's MAC from Sluice's: VIP:vport
    -> client:cport, a fresh IPv4 header (id 0, DF, TTL 64, TOS 0), seq = cookie,
    ack = ISN + 1, flags SA, window 65535, options MSS (the client's, rounded down to
    536 1200 1300 1360 1400 1440 1452 1460), SACK-permitted, timestamps (TSval: the
    cookie TSval, TSecr: the client's TSval), NOP, window scale 7; without client
    timestamps: the MSS only.
  * Client ACK with ack = cookie + 1 -> the SYN to the real server: NAT client:cport ->
    RIP:rport, FullNAT LIP:lport -> RIP:rport (TSval on Sluice's clock); fresh IPv4
    header, seq = client ISN, ack 0, flags S, window = the ACK's window unscaled
    (65535 at most), options MSS (the cookie's), SACK-permitted, timestamps (the ACK's
    TSval, 0), NOP, the client's window scale, as the client offered them (SACK and
    window scale only with timestamps).
  * The real server's SYN-ACK never reaches the client; it becomes the ACK to the real
    server: seq = client ISN + 1, ack = server ISN + 1, flags A, window = the client
    ACK's (shifted by its scale when the server offered no window scale), options NOP
    NOP timestamps (TSval: the TSecr of the server's SYN-ACK, TSecr: the server's
    TSval) when both use timestamps, none otherwise.
  * Then, with delta = cookie - server ISN and the timestamp delta = cookie TSval -
    server TSval: server -> client seq + delta, TSval + timestamp delta, window from
    the server's scale to 7, SACK blocks untouched (they are in the client's sequence
    space, the same on both sides); client -> server ack - delta, every SACK edge -
    delta, TSecr - timestamp delta, window shifted by the client's scale when the server
    does not scale. FullNAT's timestamp offset composes: client TSval + offset, server
    TSecr - offset. Addresses and ports as for NAT and FullNAT; TTL, id, TOS, flags,
    payload untouched; every checksum valid.
  * An ACK whose ack - 1 is not a cookie of its tuple and ISN: dropped
    (tcp_no_session), synproxy_cookies_invalid.
  * Client data (or a FIN) before the real server's SYN-ACK: nothing comes out
    (synproxy_data_held); after the SYN-ACK, the ACK to the server, then the held
    segments in the order they came, translated as above (synproxy_data_sent). A held
    segment sent again (same seq): the SYN to the server again, with that segment's
    TSval (synproxy_syn_resent), the data still delivered once. A cookie ACK with
    data: the SYN at once (made from a copy, not counted as resent), the ACK itself
    held. A server that never answers: the held segment dropped after 3 s
    (server_unanswered).
"""

import argparse
import concurrent.futures
import copy
import json
import multiprocessing
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

try:
    from scapy.all import ARP, Ether, IP, TCP  # noqa: E402
except ImportError as e:  # pragma: no cover
    sys.exit(f"golden_synproxy.py: scapy not importable ({e}); run with /usr/bin/python3 "
             "after scripts/setup.sh (python3-scapy)")

import golden_arp_icmp as base  # noqa: E402
import golden_forwarding as gf  # noqa: E402  (frame builders, expectation format, checker)
import golden_fullnat as gfn  # noqa: E402  (live-run helpers)

OUR_MAC, OUR_IP = gf.OUR_MAC, gf.OUR_IP
CLIENT_MAC, CLIENT_IP = gf.CLIENT_MAC, gf.CLIENT_IP
NAT_VIP = "198.18.0.241"
FNAT_VIP = "198.18.0.242"
LIP = "198.18.0.61"
RS_NAT = ("198.18.0.31", "02:00:00:00:00:31")
RS_FNAT = ("198.18.0.32", "02:00:00:00:00:32")
RIPS = [RS_NAT[0], RS_FNAT[0]]
VPORT, RPORT = 80, 8080
LPORT_MIN, LPORT_MAX = 1024, 65535
MSS_TABLE = [536, 1200, 1300, 1360, 1400, 1440, 1452, 1460]
PROXY_WSCALE = 7
COUNTER_SHIFT = 16
# How far Sluice's timestamp clock (wall-clock milliseconds) may be from this tool's
# reading of the wall clock when the frame came out.
CLOCK_SLACK_MS = 5000


def linux_syn_options(tsval, mss=1460, wscale=7):
    """The options of a Linux client's SYN."""
    return [("MSS", mss), ("SAckOK", b""), ("Timestamp", (tsval, 0)), ("NOP", None), ("WScale", wscale)]


# Session -> mode (of its service); the client's port, ISN, SYN options, and what they
# offer (ts: the SYN's TSval, wscale, sack, mss; None: not offered); the real server's
# ISN, first TSval, window scale and SACK-permitted (None / False: not offered).
SESSIONS = {
    # NAT, a Linux client (MSS, SACK, timestamps, window scale 7), a Linux server.
    "A": dict(mode="nat", cport=43001, isn=0x1A2B3C4D, syn=linux_syn_options(1000), ts=1000, wscale=7, sack=True,
              mss=1460, sisn=0x70000000, srv_ts=500000, srv_wscale=7, srv_sack=True),
    # NAT, a client without timestamps (so no SACK or window scale either), MSS 1380.
    "B": dict(mode="nat", cport=43002, isn=0x00000010, syn=[("MSS", 1380)], ts=None, wscale=None, sack=False,
              mss=1380, sisn=0x12345678, srv_ts=None, srv_wscale=None, srv_sack=False),
    # FullNAT, a Linux client; the server scales by 5 and its sequence numbers cross
    # 2^32.
    "C": dict(mode="fullnat", cport=43003, isn=0x33330000, syn=linux_syn_options(2000), ts=2000, wscale=7,
              sack=True, mss=1460, sisn=0xFFFFFF00, srv_ts=700000, srv_wscale=5, srv_sack=True),
    # NAT, a client near the end of the sequence space; the server offers timestamps
    # but neither window scale nor SACK.
    "D": dict(mode="nat", cport=43004, isn=0xFFFFFFF0, syn=linux_syn_options(3000), ts=3000, wscale=7, sack=True,
              mss=1460, sisn=0x44440000, srv_ts=900000, srv_wscale=None, srv_sack=False),
    # NAT: the SYN is answered, and every ACK is forged (no session opens).
    "E": dict(mode="nat", cport=43005, isn=0x55550000, syn=linux_syn_options(4000), ts=4000, wscale=7, sack=True,
              mss=1460, sisn=None, srv_ts=None, srv_wscale=None, srv_sack=False),
    # NAT: the client's request, a second segment and its FIN come before the real
    # server's SYN-ACK: held, then sent after the ACK that completes the server's side.
    "F": dict(mode="nat", cport=43007, isn=0x66660000, syn=linux_syn_options(5000), ts=5000, wscale=7, sack=True,
              mss=1460, sisn=0x77770000, srv_ts=1100000, srv_wscale=7, srv_sack=True),
    # NAT: a held request retransmitted before the server answered: the SYN again.
    "G": dict(mode="nat", cport=43008, isn=0x0ABC0000, syn=linux_syn_options(6000), ts=6000, wscale=7, sack=True,
              mss=1460, sisn=0x0DEF0000, srv_ts=1200000, srv_wscale=7, srv_sack=True),
    # FullNAT: the cookie ACK carries the request itself.
    "H": dict(mode="fullnat", cport=43009, isn=0x88880000, syn=linux_syn_options(7000), ts=7000, wscale=7,
              sack=True, mss=1460, sisn=0x99990000, srv_ts=1300000, srv_wscale=7, srv_sack=True),
    # NAT: a real server that never answers: the held request is dropped after 3 s.
    "I": dict(mode="nat", cport=43010, isn=0x9A9A0000, syn=linux_syn_options(8000), ts=8000, wscale=7, sack=True,
              mss=1460, sisn=None, srv_ts=None, srv_wscale=None, srv_sack=False),
    # NAT: the client resets the connection before the real server answered; the
    # server's SYN-ACK comes after.
    "R": dict(mode="nat", cport=43011, isn=0xB0B00000, syn=linux_syn_options(9000), ts=9000, wscale=7, sack=True,
              mss=1460, sisn=0xC0C00000, srv_ts=1400000, srv_wscale=7, srv_sack=True),
}
# Sessions opened by a valid cookie; those whose real server answered (spliced).
OPENED = ["A", "B", "C", "D", "F", "G", "H", "I", "R"]
SPLICED = ["A", "B", "C", "D", "F", "G", "H"]
# Which sessions end ESTABLISHED (active); A closes, F's client sent its FIN, I's
# server never answered.
ACTIVE_AT_END = {"B", "C", "D", "G", "H"}
# Client segments held for their real server's handshake, sent once it answered, the
# SYN sent again for a retransmission of a held segment, and held segments dropped
# because the server never answered.
DATA_HELD = {"F": 10, "G": 1, "H": 1, "I": 1, "R": 1}
SYN_RESENT = {"G": 1}
# Stands in for a binding that never came out, so the script can go on (check then
# fails, naming the session).
PLACEHOLDER = {"cookie": 0, "tsval": None, "seen_ms": 0}
FNAT_PLACEHOLDER = {"lip": LIP, "lport": 1, "offset": 0, "seen_ms": 0}


def services_toml():
    t = ["[timeouts]"]
    for k in ("tcp", "tcpfin", "udp", "syn_recv", "syn_sent", "time_wait", "close", "close_wait", "last_ack"):
        t.append(f"{k} = 600")
    t.append("")
    for vip, (rip, _), mode in ((NAT_VIP, RS_NAT, "nat"), (FNAT_VIP, RS_FNAT, "fullnat")):
        # No SYN timer: its SYNs come at times the script cannot place among its frames
        # (tests/eal_synproxy.rs covers it).
        t += ["[[services]]", 'proto = "tcp"', f'vip = "{vip}"', f"port = {VPORT}", 'scheduler = "rr"',
              'synproxy = "on"', "synproxy_syn_retries = 0"]
        if mode == "fullnat":
            t.append(f'local_addresses = ["{LIP}"]')
        t += ["", "  [[services.real_servers]]", f'  ip = "{rip}"', f"  port = {RPORT}", "  weight = 1",
              f'  mode = "{mode}"', ""]
    return "\n".join(t)


# ----------------------------------------------------------------------------------
# What the checker can recompute of a cookie and its TSval.


def mss_index(mss):
    mss = MSS_TABLE[0] if mss is None else mss
    return max((i for i, m in enumerate(MSS_TABLE) if m <= mss), default=0)


def tsval_option_bits(wscale, sack):
    """The low 6 bits of the cookie TSval: window scale (15: none) and SACK (bit 4)."""
    return (15 if wscale is None else min(wscale, 14)) | (16 if sack else 0)


def session(key):
    s = SESSIONS[key]
    vip = NAT_VIP if s["mode"] == "nat" else FNAT_VIP
    rip, rs_mac = RS_NAT if s["mode"] == "nat" else RS_FNAT
    return s, vip, rip, rs_mac


def server_view(key, b):
    """(address, port) the real server sees the client as: the client for NAT, the
    LIP:lport for FullNAT."""
    s = SESSIONS[key]
    if s["mode"] == "nat":
        return CLIENT_IP, s["cport"]
    return b[key]["lip"], b[key]["lport"]


def fnat_offset(key, b):
    return b[key]["offset"] if SESSIONS[key]["mode"] == "fullnat" else 0


def seq_delta(key, b):
    return (b[key]["cookie"] - SESSIONS[key]["sisn"]) & 0xFFFFFFFF


def ts_delta(key, b):
    s = SESSIONS[key]
    if b[key]["tsval"] is None or s["srv_ts"] is None:
        return 0
    return (b[key]["tsval"] - s["srv_ts"]) & 0xFFFFFFFF


def server_opts(key, tsecr):
    """The real server's SYN-ACK options (Linux's order), for the SYN it got."""
    s = SESSIONS[key]
    o = [("MSS", 1460)]
    if s["srv_ts"] is not None and s["srv_sack"]:
        o += [("SAckOK", b""), ("Timestamp", (s["srv_ts"], tsecr))]
    elif s["srv_ts"] is not None:
        o += [("NOP", None), ("NOP", None), ("Timestamp", (s["srv_ts"], tsecr))]
    elif s["srv_sack"]:
        o += [("NOP", None), ("NOP", None), ("SAckOK", b"")]
    if s["srv_wscale"] is not None:
        o += [("NOP", None), ("WScale", s["srv_wscale"])]
    return o


def handshake_opts(mss, sack, ts, wscale):
    """Options as Sluice writes a handshake segment (Linux's order)."""
    o = [("MSS", mss)]
    if sack and ts is not None:
        o += [("SAckOK", b""), ("Timestamp", ts)]
    elif ts is not None:
        o += [("NOP", None), ("NOP", None), ("Timestamp", ts)]
    elif sack:
        o += [("NOP", None), ("NOP", None), ("SAckOK", b"")]
    if wscale is not None:
        o += [("NOP", None), ("WScale", wscale)]
    return o


# ----------------------------------------------------------------------------------
# Expected outputs (golden_forwarding.py's format).


def fresh(src, sport, dst, dport, flags, seq, ack, window, options, eth_dst):
    """A segment Sluice writes anew: a fresh IPv4 header (id 0, DF, TTL 64, TOS 0)."""
    raw = gf.tcp(src, sport, dst, dport, flags, seq, ack, ip_id=0, ttl=64, tos=0, df=True, options=options,
                 window=window)
    return gf.with_macs(raw, eth_dst, OUR_MAC)


def tcp_fields(raw):
    p = Ether(gf.strip_pad(raw))
    t = p[TCP]
    return {"IP.src": p[IP].src, "IP.dst": p[IP].dst, "TCP.sport": t.sport, "TCP.dport": t.dport,
            "TCP.seq": t.seq, "TCP.ack": t.ack, "TCP.flags": int(t.flags), "TCP.window": t.window,
            "IP.ttl": p[IP].ttl, "IP.id": p[IP].id, "IP.tos": p[IP].tos, "IP.flags": int(p[IP].flags)}


def expect_fresh(kind, name, frame, eth_dst):
    return gf.out(kind, name, [frame], eth_dst, tcp_fields(frame), zero_eq=[24, 50])


def expect_cookie_synack(name, raw, key, b):
    s, vip, _, _ = session(key)
    ts = (b[key]["tsval"], s["ts"]) if s["ts"] is not None else None
    sack = s["sack"] and ts is not None
    wscale = PROXY_WSCALE if (ts is not None and s["wscale"] is not None) else None
    frame = fresh(vip, VPORT, CLIENT_IP, s["cport"], "SA", b[key]["cookie"], (s["isn"] + 1) & 0xFFFFFFFF, 65535,
                  handshake_opts(MSS_TABLE[mss_index(s["mss"])], sack, ts, wscale), CLIENT_MAC)
    return expect_fresh("synproxy-cookie-synack", name, frame, CLIENT_MAC)


def client_ack_window(key):
    return 502 if SESSIONS[key]["wscale"] is not None else 64240


def expect_server_syn(name, raw, key, b, tsval=None):
    """The SYN to the real server: made from the cookie ACK, or again from a later
    client segment (TSval: that segment's, `tsval`)."""
    s, _, rip, rs_mac = session(key)
    src, sport = server_view(key, b)
    with_ts = s["ts"] is not None
    tsval = (s["ts"] or 0) + 1 if tsval is None else tsval
    ts = ((tsval + fnat_offset(key, b)) & 0xFFFFFFFF, 0) if with_ts else None
    window = min(client_ack_window(key) << (s["wscale"] if with_ts and s["wscale"] is not None else 0), 65535)
    frame = fresh(src, sport, rip, RPORT, "S", s["isn"], 0, window,
                  handshake_opts(MSS_TABLE[mss_index(s["mss"])], s["sack"] and with_ts, ts,
                                 s["wscale"] if with_ts else None), rs_mac)
    return expect_fresh("synproxy-server-syn", name, frame, rs_mac)


def expect_server_ack(name, raw, key, b):
    """The real server's SYN-ACK (raw) turned into the ACK that completes its side."""
    s, _, rip, rs_mac = session(key)
    src, sport = server_view(key, b)
    syn_ack = Ether(raw)[TCP]
    echo = dict(syn_ack.options).get("Timestamp")
    ts = [("NOP", None), ("NOP", None), ("Timestamp", (echo[1], echo[0]))] if echo and s["ts"] is not None else []
    window = client_ack_window(key)
    if s["wscale"] is not None and s["ts"] is not None and s["srv_wscale"] is None:
        window = min(window << s["wscale"], 65535)
    frame = fresh(src, sport, rip, RPORT, "A", (s["isn"] + 1) & 0xFFFFFFFF, (s["sisn"] + 1) & 0xFFFFFFFF, window,
                  ts, rs_mac)
    return expect_fresh("synproxy-server-ack", name, frame, rs_mac)


def expect_server_rst(name, raw, key, b):
    """The client's reset before the real server answered, as the server can take
    it: the client's sequence number, no ACK, no options, window 0."""
    s, _, rip, rs_mac = session(key)
    src, sport = server_view(key, b)
    frame = fresh(src, sport, rip, RPORT, "R", Ether(raw)[TCP].seq, 0, 0, [], rs_mac)
    return expect_fresh("synproxy-server-rst", name, frame, rs_mac)


def translated(raw, src, sport, dst, dport, seq_add=0, ack_sub=0, tsval_add=0, tsecr_sub=0, sack_sub=0,
               window=None):
    """raw with addresses, ports, sequence numbers, timestamps, SACK edges and window
    changed (modulo 2^32), every checksum computed afresh by scapy, padding
    alternatives included."""
    body = gf.strip_pad(raw)
    padding = raw[len(body):]
    p = Ether(body)
    ip, t = p[IP], p[TCP]
    ip.src, ip.dst, t.sport, t.dport = src, dst, sport, dport
    t.seq = (t.seq + seq_add) & 0xFFFFFFFF
    if int(t.flags) & 0x10:
        t.ack = (t.ack - ack_sub) & 0xFFFFFFFF
    if window is not None:
        t.window = window
    opts = []
    for k, v in t.options:
        if k == "Timestamp":
            v = ((v[0] + tsval_add) & 0xFFFFFFFF, (v[1] - tsecr_sub) & 0xFFFFFFFF)
        elif k == "SAck":
            v = tuple((e - sack_sub) & 0xFFFFFFFF for e in v)
        opts.append((k, v))
    t.options = opts
    del ip.chksum
    del t.chksum
    new = bytes(p)
    assert len(new) == len(body), "scapy re-laid the options"
    return [new + padding, new] if padding else [new]


def scaled_window(window, from_shift, to_shift):
    w = min((window << from_shift) >> to_shift, 65535)
    return 1 if w == 0 and window != 0 else w


def expect_to_server(name, raw, key, b):
    s, _, rip, rs_mac = session(key)
    src, sport = server_view(key, b)
    window = None
    client_scales = s["ts"] is not None and s["wscale"] is not None
    if client_scales and s["srv_wscale"] is None:
        window = min(Ether(raw)[TCP].window << s["wscale"], 65535)
    alts = translated(raw, src, sport, rip, RPORT, ack_sub=seq_delta(key, b), tsval_add=fnat_offset(key, b),
                      tsecr_sub=ts_delta(key, b), sack_sub=seq_delta(key, b), window=window)
    alts = [gf.with_macs(a, rs_mac, OUR_MAC) for a in alts]
    return gf.out("synproxy-to-server", name, alts, rs_mac, {**tcp_fields(alts[-1]), **gf.ip_fields(raw)},
                  zero_eq=[24, 50])


def expect_to_client(name, raw, key, b):
    s, vip, _, _ = session(key)
    window = None
    client_scales = s["ts"] is not None and s["wscale"] is not None
    if client_scales and (s["srv_wscale"] or 0) != PROXY_WSCALE:
        window = scaled_window(Ether(raw)[TCP].window, s["srv_wscale"] or 0, PROXY_WSCALE)
    alts = translated(raw, vip, VPORT, CLIENT_IP, s["cport"], seq_add=seq_delta(key, b), tsval_add=ts_delta(key, b),
                      tsecr_sub=fnat_offset(key, b), window=window)
    alts = [gf.with_macs(a, CLIENT_MAC, OUR_MAC) for a in alts]
    return gf.out("synproxy-to-client", name, alts, CLIENT_MAC, {**tcp_fields(alts[-1]), **gf.ip_fields(raw)},
                  zero_eq=[24, 50])


def expect_arp_reply(name, req, asked, requester_mac, requester_ip):
    return gf.out("arp-reply", name, [base.expected_arp_reply(req)], requester_mac,
                  {"ARP.op": 2, "ARP.hwsrc": OUR_MAC, "ARP.psrc": asked, "ARP.hwdst": requester_mac,
                   "ARP.pdst": requester_ip})


# ----------------------------------------------------------------------------------
# The script: steps whose frames and expectations are functions of the bindings.


class Step:
    """name; make(b) -> frame; drop: the reason it is dropped for, or None;
    expect(b, raw) -> [expected outputs]; learns: (session, "cookie" | "fullnat"), what
    its output binds; session: the session it counts on (real-server statistics), side
    "in" or "out"; events: {event: n} the frame moves (waited for when nothing comes
    out); drop_later: the reason it is dropped for after a hold."""

    def __init__(self, name, make, drop=None, expect=None, learns=None, session=None, side=None, opens=False,
                 events=None, drop_later=None):
        self.name, self.make, self.drop, self.learns = name, make, drop, learns
        self.session, self.side, self.opens = session, side, opens
        self.expect = expect or (lambda b, raw: [])
        # Event counters the frame moves (the live play waits for them), and a drop
        # that comes later (a held frame whose server never answers).
        self.events, self.drop_later = events or {}, drop_later


def script():
    S = []
    c = CLIENT_IP
    rq = gf.http_request(NAT_VIP)

    def const(raw):
        return lambda b: raw

    def client(key, flags, seq, ack, tsval=None, sack=None, data=b"", ip_id=1, window=None):
        """A client segment of `key`: seq relative to the client ISN, ack to the
        cookie; timestamps (tsval, echo of the cookie TSval) when the client uses them;
        SACK edges relative to the cookie."""
        s, vip, _, _ = session(key)

        def make(b):
            opts = []
            if tsval is not None and s["ts"] is not None:
                opts += [("NOP", None), ("NOP", None), ("Timestamp", (tsval, b[key]["tsval"] or 0))]
            if sack is not None:
                opts += [("NOP", None), ("NOP", None),
                         ("SAck", tuple((b[key]["cookie"] + e) & 0xFFFFFFFF for e in sack))]
            return gf.tcp(c, s["cport"], vip, VPORT, flags, (s["isn"] + seq) & 0xFFFFFFFF,
                          (b[key]["cookie"] + ack) & 0xFFFFFFFF, data=data, ip_id=ip_id, options=opts,
                          window=window or client_ack_window(key))
        return make

    def server(key, flags, seq, ack, tsval=None, tsecr=None, sack=None, data=b"", ip_id=1, window=1000,
               options=None):
        """A real-server segment of `key`, in its own view: seq relative to its ISN, ack
        to the client's ISN; tsecr: the client's TSval as the server saw it."""
        s, _, rip, rs_mac = session(key)

        def make(b):
            dst, dport = server_view(key, b)
            if options is not None:
                opts = options(b)
            else:
                opts = []
                if tsval is not None and s["srv_ts"] is not None:
                    opts += [("NOP", None), ("NOP", None),
                             ("Timestamp", (s["srv_ts"] + tsval, (tsecr + fnat_offset(key, b)) & 0xFFFFFFFF))]
                if sack is not None:
                    opts += [("NOP", None), ("NOP", None),
                             ("SAck", tuple((s["isn"] + e) & 0xFFFFFFFF for e in sack))]
            return gf.tcp(rip, RPORT, dst, dport, flags, (s["sisn"] + seq) & 0xFFFFFFFF,
                          (s["isn"] + ack) & 0xFFFFFFFF, data=data, ip_id=ip_id, options=opts, window=window,
                          src_mac=rs_mac)
        return make

    def to_server(key, name, make, opens=False):
        S.append(Step(name, make, expect=lambda b, raw: [expect_to_server(name, raw, key, b)], session=key,
                      side="in", opens=opens))

    def to_client(key, name, make):
        S.append(Step(name, make, expect=lambda b, raw: [expect_to_client(name, raw, key, b)], session=key,
                      side="out"))

    def syn(key, ip_id):
        s, vip, _, _ = session(key)
        name = f"{key} SYN ({'no options but MSS ' + str(s['mss']) if s['ts'] is None else 'Linux options'})"
        S.append(Step(name, const(gf.tcp(c, s["cport"], vip, VPORT, "S", s["isn"], options=s["syn"], ip_id=ip_id,
                                         window=64240)),
                      expect=lambda b, raw: [expect_cookie_synack(f"{key} cookie SYN-ACK", raw, key, b)],
                      learns=(key, "cookie")))

    # Per session: the client segments held for its real server (the name of their
    # output, make), in the order they came.
    held = {}

    def cookie_ack(key, ip_id, data=b""):
        """The client's ACK with the cookie: the SYN to the real server. With data,
        the ACK itself waits (held) and a copy of it becomes the SYN."""
        s = SESSIONS[key]
        name = f"{key} ACK with the cookie" + (" and the request" if data else "")
        make = client(key, "PA" if data else "A", 1, 1, tsval=(s["ts"] or 0) + 1, data=data, ip_id=ip_id)
        if data:
            held.setdefault(key, []).append((f"{key} request on the cookie ACK (held, sent after the ACK)", make))
        S.append(Step(name, make,
                      expect=lambda b, raw: [expect_server_syn(f"{key} SYN to the real server", raw, key, b)],
                      learns=(key, "fullnat") if s["mode"] == "fullnat" else None, session=key, side="in",
                      opens=True, events={"synproxy_data_held": 1} if data else None))

    def hold(key, name, make, drop_later=None):
        """A client segment before the real server answered: nothing comes out yet."""
        held.setdefault(key, []).append((name.replace(" (held)", "") + " (held, sent after the ACK)", make))
        S.append(Step(name, make, session=key, side="in", events={"synproxy_data_held": 1},
                      drop_later=drop_later))

    def syn_again(key, name, make, tsval):
        """A client retransmission of a held segment: the SYN to the real server
        again, with the retransmission's TSval."""
        S.append(Step(name, make, expect=lambda b, raw: [expect_server_syn(f"{key} SYN to the real server again",
                                                                           raw, key, b, tsval=tsval)],
                      session=key, side="in", events={"synproxy_syn_resent": 1}))

    def server_synack(key, ip_id):
        """The real server's SYN-ACK: the ACK to the server, then the client's held
        segments (in order, translated)."""
        s = SESSIONS[key]
        make = server(key, "SA", 0, 1, window=65160,
                      options=lambda b: server_opts(key, (s["ts"] + 1 + fnat_offset(key, b)) & 0xFFFFFFFF
                                                    if s["ts"] is not None else 0))
        waiting = held.pop(key, [])

        def expect(b, raw):
            return [expect_server_ack(f"{key} ACK to the real server", raw, key, b)] + [
                expect_to_server(name, m(b), key, b) for name, m in waiting]
        S.append(Step(f"{key} SYN-ACK from the real server (absorbed)", make, expect=expect, session=key,
                      side="out", events={"synproxy_data_sent": len(waiting)} if waiting else None))

    def drop(name, make, reason):
        S.append(Step(name, make, drop=reason))

    # --- neighbours -----------------------------------------------------------------
    for rip, mac in (RS_NAT, RS_FNAT):
        drop(f"ARP reply from the real server {rip}", const(gf.arp_reply_from(mac, rip)), "arp_reply")
    for vip in (NAT_VIP, FNAT_VIP):
        req = base.arp_request(CLIENT_MAC, c, vip)
        S.append(Step(f"client who-has the VIP {vip}", const(req),
                      expect=lambda b, raw, vip=vip: [expect_arp_reply(f"is-at for the VIP {vip}", raw, vip,
                                                                       CLIENT_MAC, c)]))
    req = base.arp_request(RS_FNAT[1], RS_FNAT[0], LIP)
    S.append(Step(f"{RS_FNAT[0]} who-has the LIP {LIP}", const(req),
                  expect=lambda b, raw: [expect_arp_reply(f"is-at for the LIP {LIP}", raw, LIP, RS_FNAT[1],
                                                          RS_FNAT[0])]))

    # --- I: the real server never answers: the held request is dropped after 3 s ------
    # (first, so that its hold time runs out while the rest plays)
    syn("I", 181)
    cookie_ack("I", 182)
    hold("I", "I request (held; its server never answers)", client("I", "PA", 1, 1, tsval=8002, data=rq,
                                                                   ip_id=183), drop_later="server_unanswered")
    held.pop("I")

    # --- R: the client resets before its real server answered -----------------------
    syn("R", 191)
    cookie_ack("R", 192)
    hold("R", "R request (held; its client then resets)", client("R", "PA", 1, 1, tsval=9002, data=rq,
                                                                  ip_id=193), drop_later="client_reset")
    held.pop("R")
    # Resets the client cannot have sent: past the window the cookie SYN-ACK gave it,
    # or acknowledging something else than the cookie.
    drop("R reset 65,536 bytes past the client's ISN + 1 (off-path guess)",
         client("R", "RA", 1 + 65536, 1, ip_id=194), "reset_out_of_window")
    drop("R reset acknowledging another number than the cookie (off-path guess)",
         client("R", "RA", 1 + len(rq), 5, ip_id=195), "reset_out_of_window")
    make = client("R", "RA", 1 + len(rq), 1, ip_id=196)
    S.append(Step("R reset from the client (after its held request)", make,
                  expect=lambda b, raw: [expect_server_rst("R reset to the real server", raw, "R", b)],
                  session="R", side="in", events={"synproxy_client_reset": 1}))
    drop("R SYN-ACK from the real server after the reset",
         server("R", "SA", 0, 1, window=65160, options=lambda b: server_opts("R", 9001)), "client_reset")

    # --- A: NAT, Linux client and server; data both ways, SACK both ways, FIN ---------
    syn("A", 101)
    cookie_ack("A", 102)
    server_synack("A", 201)
    to_server("A", "A request", client("A", "PA", 1, 1, tsval=1002, data=rq, ip_id=103))
    n = len(rq)
    seg = [base.payload(100, k) for k in range(4)]
    to_client("A", "A response segment 1 (the client loses it)",
              server("A", "A", 1, 1 + n, tsval=10, tsecr=1002, data=seg[0], ip_id=202))
    to_client("A", "A response segment 2", server("A", "A", 101, 1 + n, tsval=10, tsecr=1002, data=seg[1], ip_id=203))
    to_client("A", "A response segment 3 (the client loses it)",
              server("A", "A", 201, 1 + n, tsval=11, tsecr=1002, data=seg[2], ip_id=204))
    to_client("A", "A response segment 4", server("A", "A", 301, 1 + n, tsval=11, tsecr=1002, data=seg[3],
                                                  ip_id=205))
    to_server("A", "A dup ACK with two SACK blocks (segments 4 and 2)",
              client("A", "A", 1 + n, 1, tsval=1003, sack=(301, 401, 101, 201), ip_id=104))
    to_client("A", "A segment 1 again", server("A", "A", 1, 1 + n, tsval=12, tsecr=1003, data=seg[0], ip_id=206))
    to_server("A", "A ACK of 1-2 with a SACK block (segment 4)",
              client("A", "A", 1 + n, 201, tsval=1004, sack=(301, 401), ip_id=105))
    to_client("A", "A segment 3 again", server("A", "A", 201, 1 + n, tsval=13, tsecr=1004, data=seg[2], ip_id=207))
    to_server("A", "A ACK of everything", client("A", "A", 1 + n, 401, tsval=1005, ip_id=106))
    up = [base.payload(200, 10 + k) for k in range(2)]
    to_server("A", "A upload segment 1 (the server loses it)",
              client("A", "PA", 1 + n, 401, tsval=1006, data=up[0], ip_id=107))
    to_server("A", "A upload segment 2", client("A", "PA", 201 + n, 401, tsval=1006, data=up[1], ip_id=108))
    to_client("A", "A server's dup ACK with a SACK block (upload segment 2: the client's space, unchanged)",
              server("A", "A", 401, 1 + n, tsval=14, tsecr=1006, sack=(201 + n, 401 + n), ip_id=208))
    to_server("A", "A upload segment 1 again", client("A", "PA", 1 + n, 401, tsval=1007, data=up[0], ip_id=109))
    to_client("A", "A server's ACK of the upload", server("A", "A", 401, 401 + n, tsval=15, tsecr=1007, ip_id=209))
    to_client("A", "A FIN from the server", server("A", "FA", 401, 401 + n, tsval=16, tsecr=1007, ip_id=210))
    to_server("A", "A FIN from the client", client("A", "FA", 401 + n, 402, tsval=1008, ip_id=110))
    to_client("A", "A last ACK from the server", server("A", "A", 402, 402 + n, tsval=17, tsecr=1008, ip_id=211))

    # --- B: NAT, a client without timestamps: MSS only ------------------------------
    syn("B", 121)
    cookie_ack("B", 122)
    server_synack("B", 301)
    to_server("B", "B request", client("B", "PA", 1, 1, data=rq, ip_id=123))
    to_client("B", "B response", server("B", "PA", 1, 1 + n, data=gf.http_response("rs1"), ip_id=302, window=1000))

    # --- C: FullNAT; the server scales by 5, its sequence numbers wrap ---------------
    syn("C", 131)
    cookie_ack("C", 132)
    server_synack("C", 401)
    rqf = gf.http_request(FNAT_VIP)
    nf = len(rqf)
    to_server("C", "C request", client("C", "PA", 1, 1, tsval=2002, data=rqf, ip_id=133))
    cseg = [base.payload(300, 20 + k) for k in range(2)]
    to_client("C", "C response segment 1 (lost; crosses 2^32 in the server's space)",
              server("C", "A", 1, 1 + nf, tsval=5, tsecr=2002, data=cseg[0], ip_id=402, window=1000))
    to_client("C", "C response segment 2", server("C", "PA", 301, 1 + nf, tsval=5, tsecr=2002, data=cseg[1],
                                                  ip_id=403, window=1000))
    to_server("C", "C dup ACK with a SACK block (segment 2)",
              client("C", "A", 1 + nf, 1, tsval=2003, sack=(301, 601), ip_id=134))
    to_client("C", "C segment 1 again", server("C", "A", 1, 1 + nf, tsval=6, tsecr=2003, data=cseg[0], ip_id=404,
                                               window=1000))
    to_server("C", "C ACK of everything", client("C", "A", 1 + nf, 601, tsval=2004, ip_id=135))
    cup = [base.payload(150, 30 + k) for k in range(2)]
    to_server("C", "C upload segment 1 (the server loses it)",
              client("C", "PA", 1 + nf, 601, tsval=2005, data=cup[0], ip_id=136))
    to_server("C", "C upload segment 2", client("C", "PA", 151 + nf, 601, tsval=2005, data=cup[1], ip_id=137))
    to_client("C", "C server's dup ACK with a SACK block (unchanged)",
              server("C", "A", 601, 1 + nf, tsval=7, tsecr=2005, sack=(151 + nf, 301 + nf), ip_id=405, window=1000))

    # --- D: NAT; the server offers no window scale: windows rescaled both ways -------
    syn("D", 141)
    cookie_ack("D", 142)
    server_synack("D", 501)
    to_server("D", "D request (its sequence numbers cross 2^32)",
              client("D", "PA", 1, 1, tsval=3002, data=rq, ip_id=143))
    to_client("D", "D response", server("D", "PA", 1, 1 + n, tsval=3, tsecr=3002, data=gf.http_response("rs1"),
                                        ip_id=502, window=29200))
    to_server("D", "D ACK", client("D", "A", 1 + n, 1 + len(gf.http_response("rs1")), tsval=3003, ip_id=144))

    # --- E: the SYN answered, then forged ACKs: dropped, counted invalid --------------
    syn("E", 151)
    s = SESSIONS["E"]

    def forged(isn_add=1, cookie_xor=0, cport=None):
        def make(b):
            return gf.tcp(c, cport or s["cport"], NAT_VIP, VPORT, "A", (s["isn"] + isn_add) & 0xFFFFFFFF,
                          ((b["E"]["cookie"] ^ cookie_xor) + 1) & 0xFFFFFFFF, ip_id=152,
                          options=[("NOP", None), ("NOP", None), ("Timestamp", (4001, b["E"]["tsval"] or 0))],
                          window=502)
        return make
    drop("E ACK with a hash bit of the cookie flipped", forged(cookie_xor=0x40000000), "tcp_no_session")
    drop("E ACK with the cookie and another ISN", forged(isn_add=2), "tcp_no_session")
    drop("E ACK with the cookie from another client port", forged(cport=43006), "tcp_no_session")

    # --- F: a whole initial window (an upload: headers, eight body segments, the FIN) before
    # the server's SYN-ACK: all ten wait, none goes to the server as the SYN again ----
    syn("F", 161)
    cookie_ack("F", 162)
    # An upload: the headers, then the body in eight segments (text, which tshark
    # reads as the body its Content-Length announces).
    body = [bytes(0x61 + (k + i) % 26 for i in range(120)) for k in range(8)]
    post = (f"POST / HTTP/1.1\r\nHost: {NAT_VIP}\r\nContent-Length: {sum(map(len, body))}\r\n\r\n").encode()
    hold("F", "F request headers (held)", client("F", "PA", 1, 1, tsval=5002, data=post, ip_id=163))
    sent = 1 + len(post)
    for k, fdata in enumerate(body):
        hold("F", f"F body segment {k + 1} (held)", client("F", "PA", sent, 1, tsval=5002, data=fdata, ip_id=164 + k))
        sent += len(fdata)
    hold("F", "F FIN (held)", client("F", "FA", sent, 1, tsval=5003, ip_id=172))
    server_synack("F", 601)
    to_client("F", "F server's ACK of everything, FIN included",
              server("F", "A", 1, sent + 1, tsval=1, tsecr=5003, ip_id=602))

    # --- G: a held request retransmitted before the server's SYN-ACK -----------------
    syn("G", 171)
    cookie_ack("G", 172)
    hold("G", "G request (held)", client("G", "PA", 1, 1, tsval=6002, data=rq, ip_id=173))
    syn_again("G", "G request retransmitted (same seq)", client("G", "PA", 1, 1, tsval=6003, data=rq, ip_id=174),
              6003)
    server_synack("G", 701)
    to_client("G", "G response", server("G", "PA", 1, 1 + n, tsval=1, tsecr=6002, data=gf.http_response("rs1"),
                                        ip_id=702))

    # --- H: FullNAT; the request rides on the cookie ACK ------------------------------
    syn("H", 191)
    cookie_ack("H", 192, data=rqf)
    server_synack("H", 801)
    to_client("H", "H response", server("H", "PA", 1, 1 + nf, tsval=1, tsecr=7001, data=gf.http_response("rs2"),
                                        ip_id=802))
    assert not held, f"held segments never released: {held}"
    return S


# ----------------------------------------------------------------------------------
# Bindings


def cookie_from_output(frame, key):
    """{"cookie", "tsval"} from a cookie SYN-ACK of session key, or None."""
    s, vip, _, _ = session(key)
    try:
        p = Ether(frame)
    except Exception:  # noqa: BLE001 (undecodable: not a binding)
        return None
    if IP not in p or TCP not in p or p[IP].src != vip or p[TCP].dport != s["cport"] or int(p[TCP].flags) != 0x12:
        return None
    ts = dict(p[TCP].options).get("Timestamp")
    return {"cookie": p[TCP].seq, "tsval": ts[0] if ts else None}


def fullnat_from_output(frame, key, raw_in):
    """{"lip", "lport", "offset"} from the SYN to the real server of session key."""
    _, _, rip, _ = session(key)
    try:
        p = Ether(frame)
    except Exception:  # noqa: BLE001
        return None
    if IP not in p or TCP not in p or p[IP].dst != rip or p[TCP].dport != RPORT:
        return None
    ts_in, ts_out = gfn.tcp_timestamps(raw_in), gfn.tcp_timestamps(frame)
    offset = (ts_out[0] - ts_in[0]) & 0xFFFFFFFF if ts_in and ts_out else 0
    return {"lip": p[IP].src, "lport": p[TCP].sport, "offset": offset}


def clock_distance(a, b):
    d = (a - b) & 0xFFFFFFFF
    return min(d, (1 << 32) - d)


def binding_problems(bindings):
    errs = []
    for key, s in SESSIONS.items():
        v = bindings.get(key)
        if not v or v.get("cookie") is None:
            errs.append(f"session {key}: no cookie SYN-ACK came out for its SYN (the script went on with "
                        f"{PLACEHOLDER})")
            continue
        cookie, tsval = v["cookie"], v.get("tsval")
        want_index = mss_index(s["mss"])
        if cookie & 7 != want_index:
            errs.append(f"session {key}: cookie {cookie:#010x} carries MSS index {cookie & 7}, expected "
                        f"{want_index} ({MSS_TABLE[want_index]} for the client's MSS {s['mss']})")
        if s["ts"] is None:
            if tsval is not None:
                errs.append(f"session {key}: the client sent no timestamps, the SYN-ACK has TSval {tsval}")
            continue
        if tsval is None:
            errs.append(f"session {key}: the client sent timestamps, the SYN-ACK has none")
            continue
        bits = tsval_option_bits(s["wscale"], s["sack"])
        if tsval & 63 != bits:
            errs.append(f"session {key}: cookie TSval {tsval:#010x} carries option bits {tsval & 63:#x}, expected "
                        f"{bits:#x} (window scale {s['wscale']}, SACK {s['sack']})")
        # The TSval is the clock with its low 6 bits replaced, moved back 64 ms if that
        # put it ahead: the clock read tsval..tsval+127, in one of two slots.
        slots = {(tsval >> COUNTER_SHIFT) & 3, (((tsval + 127) & 0xFFFFFFFF) >> COUNTER_SHIFT) & 3}
        if (cookie >> 3) & 3 not in slots:
            errs.append(f"session {key}: cookie {cookie:#010x} carries time slot bits {(cookie >> 3) & 3}, but its "
                        f"TSval {tsval:#010x} is in slot(s) {sorted(slots)} (mod 4)")
        if clock_distance(tsval, v.get("seen_ms", 0)) > CLOCK_SLACK_MS:
            errs.append(f"session {key}: cookie TSval {tsval} is {clock_distance(tsval, v.get('seen_ms', 0))} ms "
                        f"from the wall clock when it came out ({v.get('seen_ms')}): not Sluice's clock")
    keys = [k for k in SESSIONS if bindings.get(k) and bindings[k].get("cookie") is not None]
    cookies = [bindings[k]["cookie"] for k in keys]
    if len(set(cookies)) != len(cookies):
        errs.append(f"two sessions got the same cookie: {dict(zip(keys, cookies))}")
    for key, s in SESSIONS.items():
        if s["mode"] != "fullnat":
            continue
        v = bindings.get(key) or {}
        if v.get("lip") is None:
            errs.append(f"session {key}: its cookie ACK produced no SYN towards the real server, so no LIP:lport "
                        f"was learned (the real server's frames used {FNAT_PLACEHOLDER})")
            continue
        if v["lip"] != LIP:
            errs.append(f"session {key}: source {v['lip']} is not the service's local address {LIP}")
        if not LPORT_MIN <= v["lport"] <= LPORT_MAX:
            errs.append(f"session {key}: local port {v['lport']} outside {LPORT_MIN}..={LPORT_MAX}")
        moved = (s["ts"] + 1 + v["offset"]) & 0xFFFFFFFF
        if v["offset"] == 0 or clock_distance(moved, v.get("fnat_seen_ms", 0)) > CLOCK_SLACK_MS:
            errs.append(f"session {key}: the SYN to the real server has TSval {moved} (offset {v['offset']}), "
                        "expected Sluice's clock (FullNAT moves the client's timestamps onto it)")
    return errs


def usable(bindings):
    b = {}
    for key, s in SESSIONS.items():
        v = dict(bindings.get(key) or {})
        if v.get("cookie") is None:
            v.update(PLACEHOLDER)
            v["tsval"] = 0 if s["ts"] is not None else None
        if s["mode"] == "fullnat" and v.get("lip") is None:
            v.update(FNAT_PLACEHOLDER)
        b[key] = v
    return b


# ----------------------------------------------------------------------------------
# config / run


def cmd_config(_args):
    print(services_toml())
    return 0


def wall_ms():
    return int(time.time() * 1000) & 0xFFFFFFFF


def cmd_run(args):
    bindings = {k: {} for k in SESSIONS}

    def learn(step, raw, new_outputs):
        if not step.learns:
            return
        now = wall_ms()
        key, what = step.learns
        for f in new_outputs:
            found = cookie_from_output(f, key) if what == "cookie" else fullnat_from_output(f, key, raw)
            if found:
                found["seen_ms" if what == "cookie" else "fnat_seen_ms"] = now
                bindings[key].update(found)
                break
        print(f"{key}: {bindings[key]}", flush=True)

    args.rips = RIPS
    timeouts = gfn.play_live(args, script(), bindings, usable, learn)
    if timeouts is None:
        return 1
    with open(args.run_json, "w") as f:
        json.dump({"bindings": bindings, "timeouts": timeouts}, f, indent=1)
    return 0


# ----------------------------------------------------------------------------------
# check


# build_expectations' results per bindings: the self-test checks one set many times.
_EXPECTATIONS = {}


def build_expectations(bindings):
    """The frames (from the script and the bindings) and golden_forwarding.py's
    expectation dict for them (a copy, the caller may change it)."""
    key = json.dumps(bindings, sort_keys=True)
    if key not in _EXPECTATIONS:
        _EXPECTATIONS[key] = expectations_of(bindings)
    frames, expect = _EXPECTATIONS[key]
    return list(frames), copy.deepcopy(expect)


def expectations_of(bindings):
    b = usable(bindings)
    frames, outputs, drops = [], [], {r: 0 for r in gf.DROP_REASONS + ["server_unanswered", "client_reset", "reset_out_of_window"]}
    ledger = {rip: {"connections": 0, "active": 0, "in": 0, "out": 0} for rip in RIPS}
    for index, step in enumerate(script()):
        raw = step.make(b)
        outs = step.expect(b, raw)
        for o in outs:
            o["input_index"] = index
        outputs += outs
        frames.append({"index": index, "name": step.name, "drop": step.drop or step.drop_later, "outputs": len(outs),
                       "len": len(raw), "raw": raw})
        if step.drop or step.drop_later:
            drops[step.drop or step.drop_later] += 1
        if step.session:
            e = ledger[session(step.session)[2]]
            if step.opens:
                e["connections"] += 1
                e["active"] += int(step.session in ACTIVE_AT_END)
            # Counted on the real server when they pass: every client segment that
            # goes to it (a cookie ACK as the SYN, a held segment once released, a
            # retransmission as the SYN again) and every server segment (its SYN-ACK
            # too, which comes out as the ACK to the server; that ACK, written by
            # Sluice, is not a packet that arrived).
            e["in"] += sum(1 for o in outs if o["kind"] in ("synproxy-server-syn", "synproxy-to-server",
                                                             "synproxy-server-rst"))
            e["out"] += sum(1 for o in outs if o["kind"] in ("synproxy-to-client", "synproxy-server-ack"))
    syns = sum(1 for s in SESSIONS.values())
    forged = sum(1 for f in frames if f["drop"] == "tcp_no_session")
    expect = {
        "appliance": {"mac": OUR_MAC, "ip": OUR_IP},
        "client": {"mac": CLIENT_MAC, "ip": CLIENT_IP},
        "vips": [NAT_VIP, FNAT_VIP], "local_addresses": [LIP], "rips": RIPS,
        "bindings": b,
        "services_toml": services_toml(),
        "input_frames": len(frames),
        "frames": [{k: v for k, v in f.items() if k != "raw"} for f in frames],
        "outputs": outputs,
        "drops": drops,
        "events": {"arp_replied": sum(1 for o in outputs if o["kind"] == "arp-reply"),
                   "neighbour_learned": 1 + len(RIPS), "neighbour_table_full": 0,
                   "synproxy_cookies_sent": syns, "synproxy_cookies_valid": len(OPENED),
                   "synproxy_cookies_invalid": forged, "synproxy_cookies_expired": 0,
                   "synproxy_connections": len(SPLICED), "synproxy_syn_resent": sum(SYN_RESENT.values()),
                   "synproxy_data_held": sum(DATA_HELD.values()), "synproxy_client_reset": 1,
                   "synproxy_data_sent": sum(v for k, v in DATA_HELD.items() if k in SPLICED)},
        "sessions_created": len(OPENED), "sessions_expired": 0, "sessions": len(OPENED),
        "real_servers": [{"vip": vip, "rip": rip, "mode": mode, "services": [["tcp", VPORT]],
                          "connections": ledger[rip]["connections"], "active": ledger[rip]["active"],
                          "inactive": ledger[rip]["connections"] - ledger[rip]["active"],
                          "in_min": ledger[rip]["in"], "in_max": ledger[rip]["in"],
                          "out_min": ledger[rip]["out"], "out_max": ledger[rip]["out"]}
                         for vip, (rip, _), mode in ((NAT_VIP, RS_NAT, "nat"), (FNAT_VIP, RS_FNAT, "fullnat"))],
    }
    return [f["raw"] for f in frames], expect


def cmd_check(args):
    with open(args.run_json) as f:
        run = json.load(f)
    bindings = run["bindings"]
    frames, expect = build_expectations(bindings)
    rc = gfn.check_live(args, run, bindings, binding_problems(bindings), frames, expect,
                        "the cookies or the FullNAT binding")
    if rc == 0:
        print("OK: cookies carry the MSS index, the time slot of their TSval, and the client's options in the "
              f"TSval; bindings {bindings}")
    return rc


# ----------------------------------------------------------------------------------
# selftest

SEEN = 0x6B2C4F00  # a wall-clock reading (ms mod 2^32) for the made-up bindings


def made_up_tsval(wscale, sack, at=SEEN):
    return (at & ~63) - 64 + tsval_option_bits(wscale, sack)


def made_up_cookie(hash_bits, tsval, mss):
    return (hash_bits & ~0x1F) | (((tsval >> COUNTER_SHIFT) & 3) << 3) | mss_index(mss)


def good_bindings():
    b = {}
    for i, (key, s) in enumerate(SESSIONS.items()):
        tsval = made_up_tsval(s["wscale"], s["sack"]) if s["ts"] is not None else None
        b[key] = {"cookie": made_up_cookie(0x9E3779B9 * (i + 1) & 0xFFFFFFFF, tsval or SEEN, s["mss"]),
                  "tsval": tsval, "seen_ms": SEEN + 3}
    b["C"].update({"lip": LIP, "lport": 20001, "offset": (SEEN - 2001) & 0xFFFFFFFF, "fnat_seen_ms": SEEN + 5})
    b["H"].update({"lip": LIP, "lport": 20002, "offset": (SEEN - 7001) & 0xFFFFFFFF, "fnat_seen_ms": SEEN + 7})
    return b


def check_captured(ns):
    """cmd_check(ns) with its output captured (a self-test scenario, in a worker)."""
    return gfn.run_captured(cmd_check, ns)


def cmd_selftest(args):
    os.makedirs(args.dir, exist_ok=True)
    failures = []
    good_b = good_bindings()
    # (label, want_ok, arguments of check): run once all are written, in parallel.
    checks = []

    def scenario(label, bindings, want_ok, out_frames=None, in_bindings=None):
        d = os.path.join(args.dir, label)
        os.makedirs(d, exist_ok=True)
        frames, expect = build_expectations(in_bindings or bindings)
        in_pcap, out_pcap = os.path.join(d, "in.pcap"), os.path.join(d, "out.pcap")
        run_json, expect_json = os.path.join(d, "run.json"), os.path.join(d, "expect.json")
        gf.write_pcap(in_pcap, frames)
        if out_frames is None:
            out_frames = [bytes.fromhex(o["alts"][-1]) for o in expect["outputs"]]
        gf.write_pcap(out_pcap, out_frames)
        with open(run_json, "w") as f:
            json.dump({"bindings": bindings}, f)
        checks.append((label, want_ok, argparse.Namespace(in_pcap=in_pcap, out_pcap=out_pcap, run_json=run_json,
                                                          expect_json=expect_json, summary=None)))

    _, expect = build_expectations(good_b)
    good = [bytes.fromhex(o["alts"][-1]) for o in expect["outputs"]]
    names = [o["name"] for o in expect["outputs"]]

    def at(prefix):
        return next(i for i, n in enumerate(names) if n.startswith(prefix))

    def replaced(i, frame):
        return good[:i] + [frame] + good[i + 1:]

    def changed(i, **kw):
        """Output i with TCP fields or options changed, checksums recomputed."""
        p = Ether(good[i])
        for k, v in kw.items():
            if k == "options":
                p[TCP].options = v(p[TCP].options)
            else:
                setattr(p[TCP], k, v)
        del p[IP].chksum
        del p[TCP].chksum
        return bytes(p)

    def opt(name, fn):
        return lambda options: [(k, fn(v) if k == name else v) for k, v in options]

    def without(name):
        return lambda options: [(k, v) for k, v in options if k != name] + [("NOP", None)] * (
            3 if name == "WScale" else 0)

    arp = bytes(Ether(src=OUR_MAC, dst="ff:ff:ff:ff:ff:ff") / ARP(op=1, hwsrc=OUR_MAC, psrc=OUR_IP,
                                                                   pdst=RIPS[1])) + b"\x00" * 18
    scenario("correct", good_b, True)
    scenario("correct-with-arp-requests-for-real-servers", good_b, True, [arp] + good[:5] + [arp] + good[5:])
    sa = at("A cookie SYN-ACK")
    scenario("synack-ack-not-isn-plus-1", good_b, False, replaced(sa, changed(sa, ack=SESSIONS["A"]["isn"] + 2)))
    scenario("synack-without-window-scale", good_b, False, replaced(sa, changed(sa, options=without("WScale"))))
    scenario("synack-tsecr-not-the-clients-tsval", good_b, False,
             replaced(sa, changed(sa, options=opt("Timestamp", lambda v: (v[0], v[1] + 1)))))
    scenario("synack-mss-not-rounded-down", good_b, False,
             replaced(at("B cookie SYN-ACK"), changed(at("B cookie SYN-ACK"), options=opt("MSS", lambda v: 1380))))
    syn = at("A SYN to the real server")
    scenario("server-syn-without-the-client-isn", good_b, False,
             replaced(syn, changed(syn, seq=SESSIONS["A"]["isn"] + 1)))
    scenario("server-syn-still-acking-the-cookie", good_b, False,
             replaced(syn, changed(syn, ack=good_b["A"]["cookie"] + 1)))
    csyn = at("C SYN to the real server")
    scenario("fullnat-server-syn-tsval-not-moved", good_b, False,
             replaced(csyn, changed(csyn, options=opt("Timestamp", lambda v: (2001, v[1])))))
    ack = at("A ACK to the real server")
    scenario("server-ack-acks-the-isn-not-isn-plus-1", good_b, False,
             replaced(ack, changed(ack, ack=SESSIONS["A"]["sisn"])))
    scenario("server-synack-leaks-to-the-client", good_b, False,
             good[:ack] + [gf.with_macs(good[ack], CLIENT_MAC, OUR_MAC)] + good[ack:])
    scenario("server-ack-missing", good_b, False, good[:ack] + good[ack + 1:])
    dack = at("D ACK to the real server")
    scenario("server-ack-window-not-scaled-for-a-server-without-wscale", good_b, False,
             replaced(dack, changed(dack, window=502)))
    req = at("A request")
    scenario("client-ack-not-translated", good_b, False, replaced(req, changed(req, ack=good_b["A"]["cookie"] + 1)))
    scenario("client-tsecr-not-translated", good_b, False,
             replaced(req, changed(req, options=opt("Timestamp", lambda v: (v[0], good_b["A"]["tsval"])))))
    resp = at("A response segment 1")
    scenario("server-seq-not-translated", good_b, False,
             replaced(resp, changed(resp, seq=SESSIONS["A"]["sisn"] + 1)))
    scenario("server-tsval-not-translated", good_b, False,
             replaced(resp, changed(resp, options=opt("Timestamp", lambda v: (SESSIONS["A"]["srv_ts"] + 10, v[1])))))
    sack = at("A dup ACK with two SACK blocks")
    delta = seq_delta("A", usable(good_b))
    scenario("second-sack-block-not-translated", good_b, False,
             replaced(sack, changed(sack, options=opt("SAck", lambda v: v[:2] + tuple((e + delta) & 0xFFFFFFFF
                                                                                      for e in v[2:])))))
    ssack = at("A server's dup ACK with a SACK block")
    scenario("server-sack-block-translated", good_b, False,
             replaced(ssack, changed(ssack, options=opt("SAck", lambda v: tuple((e + delta) & 0xFFFFFFFF
                                                                                for e in v)))))
    cresp = at("C response segment 2")
    scenario("window-not-rescaled-to-the-client", good_b, False, replaced(cresp, changed(cresp, window=1000)))
    bad_sum = bytearray(good[req])
    bad_sum[14 + 20 + 16] ^= 0x01
    scenario("tcp-checksum-wrong", good_b, False, replaced(req, bytes(bad_sum)))
    scenario("frames-swapped", good_b, False, good[:req] + [good[req + 1], good[req]] + good[req + 2:])
    # Client segments that came before the real server's SYN-ACK.
    fack, freq = at("F ACK to the real server"), at("F request headers (held")
    scenario("held-data-before-the-server-ack", good_b, False,
             good[:fack] + [good[freq], good[fack]] + good[freq + 1:])
    scenario("held-data-sent-at-once-not-held", good_b, False,
             good[:at("F SYN to the real server") + 1] + [good[freq]] + good[at("F SYN to the real server") + 1:freq]
             + good[freq + 1:])
    scenario("held-segments-reordered", good_b, False, good[:freq] + [good[freq + 1], good[freq]] + good[freq + 2:])
    ffin = at("F FIN (held")
    scenario("held-fin-lost", good_b, False, good[:ffin] + good[ffin + 1:])
    scenario("held-data-ack-not-translated", good_b, False,
             replaced(freq, changed(freq, ack=good_b["F"]["cookie"] + 1)))
    scenario("held-data-tsecr-not-translated", good_b, False,
             replaced(freq, changed(freq, options=opt("Timestamp", lambda v: (v[0], good_b["F"]["tsval"])))))
    greq = at("G request (held")
    scenario("held-data-delivered-twice", good_b, False, good[:greq + 1] + [good[greq]] + good[greq + 1:])
    gsyn = at("G SYN to the real server again")
    scenario("retransmission-not-the-syn-again", good_b, False, good[:gsyn] + good[gsyn + 1:])
    scenario("syn-again-with-the-first-tsval", good_b, False,
             replaced(gsyn, changed(gsyn, options=opt("Timestamp", lambda v: (6001, v[1])))))
    hsyn, hack, hreq = at("H SYN to the real server"), at("H ACK to the real server"), at("H request on")
    scenario("cookie-ack-with-data-forwarded-not-the-syn", good_b, False,
             replaced(hsyn, good[hreq]))
    scenario("cookie-ack-data-before-the-server-ack", good_b, False,
             good[:hack] + [good[hreq], good[hack]] + good[hreq + 1:])
    scenario("cookie-ack-data-fullnat-tsval-not-moved", good_b, False,
             replaced(hreq, changed(hreq, options=opt("Timestamp", lambda v: (7001, v[1])))))
    ireq = SESSIONS["I"]
    i_raw = script()[next(i for i, st in enumerate(script()) if st.name.startswith("I request"))].make(
        usable(good_b))
    leaked = translated(i_raw, CLIENT_IP, ireq["cport"], RS_NAT[0], RPORT)[-1]
    scenario("unanswered-segment-delivered", good_b, False, good + [gf.with_macs(leaked, RS_NAT[1], OUR_MAC)])
    b = good_bindings()
    b["A"]["cookie"] ^= 1
    scenario("cookie-mss-index-wrong", b, False)
    b = good_bindings()
    b["A"]["cookie"] ^= 0x10
    scenario("cookie-slot-not-the-tsvals", b, False)
    b = good_bindings()
    b["C"]["tsval"] ^= 0x10
    scenario("tsval-without-sack-bit", b, False)
    b = good_bindings()
    b["D"]["tsval"] = made_up_tsval(7, True, SEEN + 60000)
    b["D"]["cookie"] = made_up_cookie(0x12345678, b["D"]["tsval"], 1460)
    scenario("tsval-not-the-clock", b, False)
    b = good_bindings()
    b["C"]["cookie"] = b["A"]["cookie"]
    scenario("same-cookie-twice", b, False)
    b = good_bindings()
    b["C"]["lport"] = 1000
    scenario("lport-below-1024", b, False)
    b = good_bindings()
    b["C"]["offset"] = 0
    scenario("fullnat-timestamps-not-moved", b, False)
    b = good_bindings()
    b["E"] = {}
    scenario("no-cookie-learned", b, False)
    other = good_bindings()
    other["A"]["cookie"] ^= 0x100
    scenario("input-played-with-another-cookie", good_b, False, in_bindings=other)
    # Each check is a process of its own (forked: the expectations built so far and
    # tshark's view of the common input come along).
    gf.tshark_decode(checks[0][2].in_pcap)
    workers = max(1, min(4, os.cpu_count() or 1))
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
        results = list(pool.map(check_captured, [ns for _, _, ns in checks]))
    for (label, want_ok, _), (rc, why) in zip(checks, results):
        ok = rc == 0
        if ok != want_ok:
            failures.append(f"{label}: checker returned {rc}, expected {'success' if want_ok else 'failure'}")
        print(f"selftest {label}: checker {'accepts' if ok else 'rejects'} "
              f"({'as it must' if ok == want_ok else 'WRONG'})" + (f": {why[:150]}" if why else ""))
    if failures:
        print("SELFTEST FAILED:\n  " + "\n  ".join(failures))
        return 1
    print("selftest OK: the checker accepts the expected output and rejects every broken variant")
    return 0


def main():
    return gfn.live_tool_main(__doc__, {"config": cmd_config, "run": cmd_run, "check": cmd_check,
                                        "selftest": cmd_selftest})


if __name__ == "__main__":
    sys.exit(main())
