#!/usr/bin/python3
"""Golden-packet fixtures for Sluice's local responder (ARP and ICMP echo).

    golden_arp_icmp.py make IN_PCAP [EXPECT_JSON]
        Writes IN_PCAP (frames for the appliance, built with scapy) and EXPECT_JSON
        (default: IN_PCAP with ".expect.json" in place of ".pcap"): the expected replies,
        in order and byte for byte, and the expected drop and event counters.

    golden_arp_icmp.py check IN_PCAP OUT_PCAP EXPECT_JSON
        Decodes OUT_PCAP (what Sluice transmitted) with scapy AND with tshark (IP and
        ICMP checksum validation on) and checks every field of every reply: exactly the
        expected replies, in order, nothing else. Exit 0 when everything matches, 1 with
        a field-by-field diff otherwise, 2 on bad usage.

The appliance is 02:53:4c:00:00:01 / 198.18.0.1 (override with --mac / --ip, given
before the subcommand). Run with /usr/bin/python3 (Debian's scapy).

Expected behaviour encoded here (the contract of the data plane):
  * ARP request for our address -> reply in place: eth dst = requester, eth src = us,
    VLAN tags kept, op 2, sender = our MAC + asked IP, target = requester MAC + IP,
    frame length unchanged (padding kept).
  * ICMP echo request to our address -> reply in place: MACs swapped (src = us), VLAN
    tags kept, IP src/dst swapped, TTL 64, every other IP header field unchanged
    except the checksum, IP options blanked to zero (end-of-list; length kept), ICMP
    type 0 code 0, same id/seq/data, both checksums valid, padding kept.
  * Everything else is dropped with one reason each (see FRAMES below).
"""

import argparse
import difflib
import json
import os
import shutil
import subprocess
import sys

try:
    from scapy.all import (
        ARP,
        Dot1AD,
        Dot1Q,
        Ether,
        ICMP,
        IP,
        IPOption_EOL,
        IPOption_NOP,
        IPOption_Router_Alert,
        IPv6,
        ICMPv6EchoRequest,
        ConditionalField,
        Raw,
        RawPcapWriter,
        UDP,
        rdpcap,
    )
    from scapy.utils import checksum as inet_checksum
except ImportError as e:  # pragma: no cover
    sys.exit(f"golden_arp_icmp.py: scapy not importable ({e}); run with /usr/bin/python3 "
             "after scripts/setup.sh (python3-scapy)")

OUR_MAC = "02:53:4c:00:00:01"
OUR_IP = "198.18.0.1"
A_MAC, A_IP = "02:00:00:00:00:0a", "198.18.0.10"
B_MAC, B_IP = "02:00:00:00:00:0b", "198.18.0.20"
OTHER_MAC = "02:00:00:00:00:99"
OTHER_IP = "198.18.0.99"
BCAST = "ff:ff:ff:ff:ff:ff"

DROP_REASONS = [
    "truncated", "unknown_ethertype", "ipv6_no_service", "bad_ipv4_header", "bad_ipv4_checksum",
    "ipv4_fragment", "not_local", "unsupported_protocol", "bad_arp", "arp_not_for_us",
    "arp_reply", "icmp_not_echo", "bad_icmp_checksum", "bad_source_mac", "not_our_mac",
    "tx_full", "martian_source",
]


def payload(n, seed=0):
    return bytes((seed + i * 7) & 0xFF for i in range(n))


def l2(src, dst, vlans=()):
    """Ether header plus VLAN tags; vlans is a list of (tpid, vid, prio) outer first."""
    pkt = Ether(src=src, dst=dst)
    for tpid, vid, prio in vlans:
        tag = Dot1AD(vlan=vid, prio=prio) if tpid == 0x88A8 else Dot1Q(vlan=vid, prio=prio)
        pkt = pkt / tag
    return pkt


def arp_request(src_mac, src_ip, asked_ip, dst=BCAST, vlans=(), pad_to=0):
    pkt = l2(src_mac, dst, vlans) / ARP(op=1, hwsrc=src_mac, psrc=src_ip,
                                        hwdst="00:00:00:00:00:00", pdst=asked_ip)
    raw = bytes(pkt)
    return raw + b"\x00" * max(0, pad_to - len(raw))


def echo_request(src_mac, src_ip, dst_ip=None, dst_mac=None, vlans=(), size=56, ident=0x1234,
                 seq=1, ttl=64, ip_id=0x4242, flags="DF", tos=0, options=None, pad_to=0,
                 icmp_type=8, seed=0):
    ip = IP(src=src_ip, dst=dst_ip or OUR_IP, ttl=ttl, id=ip_id, flags=flags, tos=tos)
    if options is not None:
        ip.options = options
    pkt = l2(src_mac, dst_mac or OUR_MAC, vlans) / ip / ICMP(type=icmp_type, id=ident, seq=seq) / Raw(payload(size, seed))
    raw = bytes(pkt)
    return raw + b"\x00" * max(0, pad_to - len(raw))


def corrupt(raw, offset, xor=0xFF):
    b = bytearray(raw)
    b[offset] ^= xor
    return bytes(b)


def l3_offset(raw):
    off, et = 14, int.from_bytes(raw[12:14], "big")
    while et in (0x8100, 0x88A8) and off + 4 <= len(raw):
        et = int.from_bytes(raw[off + 2:off + 4], "big")
        off += 4
    return off


def expected_arp_reply(req):
    """The reply, built independently of the daemon from the request's bytes."""
    off = l3_offset(req)
    b = bytearray(req)
    requester_mac = req[off + 8:off + 14]
    requester_ip = req[off + 14:off + 18]
    asked_ip = req[off + 24:off + 28]
    b[0:6] = requester_mac
    b[6:12] = bytes.fromhex(OUR_MAC.replace(":", ""))
    b[off + 6:off + 8] = (2).to_bytes(2, "big")
    b[off + 8:off + 14] = bytes.fromhex(OUR_MAC.replace(":", ""))
    b[off + 14:off + 18] = asked_ip
    b[off + 18:off + 24] = requester_mac
    b[off + 24:off + 28] = requester_ip
    return bytes(b)


def expected_echo_reply(req):
    off = l3_offset(req)
    b = bytearray(req)
    b[0:6] = req[6:12]
    b[6:12] = bytes.fromhex(OUR_MAC.replace(":", ""))
    ihl = (req[off] & 0x0F) * 4
    total = int.from_bytes(req[off + 2:off + 4], "big")
    b[off + 8] = 64  # TTL
    b[off + 12:off + 16] = req[off + 16:off + 20]
    b[off + 16:off + 20] = req[off + 12:off + 16]
    b[off + 20:off + ihl] = b"\x00" * (ihl - 20)  # options blanked (end of list)
    b[off + 10:off + 12] = b"\x00\x00"
    b[off + 10:off + 12] = inet_checksum(bytes(b[off:off + ihl])).to_bytes(2, "big")
    icmp = off + ihl
    b[icmp] = 0  # echo reply
    b[icmp + 1] = 0
    b[icmp + 2:icmp + 4] = b"\x00\x00"
    b[icmp + 2:icmp + 4] = inet_checksum(bytes(b[icmp:off + total])).to_bytes(2, "big")
    return bytes(b)


def with_icmp_checksum(raw, value):
    """The frame with its (untagged, option-less) ICMP checksum field set to value."""
    b = bytearray(raw)
    b[14 + 20 + 2:14 + 20 + 4] = value.to_bytes(2, "big")
    return bytes(b)


def build_checksum_corners():
    """One's-complement corner cases of the echo reply's ICMP checksum."""
    return [
        # The reply's words sum to 0xffff (-0): its checksum is 0x0000.
        ("echo whose reply checksum is 0x0000", echo_request(B_MAC, B_IP, size=0, ident=0xFFFE, seq=1), "reply"),
        # The request's checksum written as 0xffff instead of the computed 0x0000: the
        # other representation of zero, valid for a receiver (RFC 1624 section 3).
        ("echo with checksum 0xffff for 0x0000",
         with_icmp_checksum(echo_request(B_MAC, B_IP, size=0, ident=0xF7FF, seq=0), 0xFFFF), "reply"),
        # id 0, seq 0, no data (scapy's default ICMP()): the reply message is all zeros,
        # its words sum to +0 and the only valid checksum is 0xffff.
        ("echo whose reply message is all zeros", echo_request(B_MAC, B_IP, size=0, ident=0, seq=0), "reply"),
        ("final echo from A", echo_request(A_MAC, A_IP, size=56, seq=99, seed=9), "reply"),
    ]


def build_jumbo():
    """Echo requests in jumbo frames, for a port at MTU 9000: each is received whole
    (one mbuf) and answered in full."""
    return [
        ("echo 1472 bytes (a 1500-byte packet)", echo_request(A_MAC, A_IP, size=1472, seq=1, seed=1), "reply"),
        ("echo 4000 bytes", echo_request(A_MAC, A_IP, size=4000, seq=2, seed=2), "reply"),
        ("echo 8972 bytes (a 9000-byte packet)", echo_request(B_MAC, B_IP, size=8972, seq=3, seed=3), "reply"),
        ("echo 8972 bytes, VLAN 100", echo_request(A_MAC, A_IP, vlans=[(0x8100, 100, 0)], size=8972, seq=4,
                                                   seed=4), "reply"),
        ("final echo from A", echo_request(A_MAC, A_IP, size=56, seq=99, seed=9), "reply"),
    ]


FRAME_SETS = {"main": lambda: build_frames(), "checksum-corners": lambda: build_checksum_corners(),
              "jumbo": lambda: build_jumbo()}


def build_frames():
    """[(name, frame bytes, verdict)] where verdict is "reply" or a drop reason."""
    q100 = [(0x8100, 100, 0)]
    qinq = [(0x88A8, 10, 3), (0x8100, 20, 5)]
    frames = [
        # --- ARP -------------------------------------------------------------------
        ("arp request for us from A", arp_request(A_MAC, A_IP, OUR_IP), "reply"),
        ("arp request for us from B, padded to 60", arp_request(B_MAC, B_IP, OUR_IP, pad_to=60), "reply"),
        ("arp request for us, VLAN 100", arp_request(A_MAC, A_IP, OUR_IP, vlans=q100), "reply"),
        ("arp request for us, unicast to our MAC", arp_request(B_MAC, B_IP, OUR_IP, dst=OUR_MAC), "reply"),
        ("arp request for another IP", arp_request(A_MAC, A_IP, OTHER_IP), "arp_not_for_us"),
        ("gratuitous arp from B", arp_request(B_MAC, B_IP, B_IP), "arp_not_for_us"),
        ("arp reply to us", bytes(Ether(src=B_MAC, dst=OUR_MAC) / ARP(
            op=2, hwsrc=B_MAC, psrc=B_IP, hwdst=OUR_MAC, pdst=OUR_IP)), "arp_reply"),
        # --- ICMP echo ---------------------------------------------------------------
        ("echo 0 bytes from A", echo_request(A_MAC, A_IP, size=0, seq=1, ttl=64), "reply"),
        ("echo 56 bytes from A", echo_request(A_MAC, A_IP, size=56, seq=2, ttl=128, seed=1), "reply"),
        ("echo 1400 bytes from B", echo_request(B_MAC, B_IP, size=1400, ident=0xBEEF, seq=3, ttl=1,
                                                flags=0, seed=2), "reply"),
        ("echo 57 bytes (odd) from B, tos 0xb8", echo_request(B_MAC, B_IP, size=57, ident=0xFFFF, seq=0xFFFF,
                                                             ttl=255, tos=0xB8, seed=3), "reply"),
        ("echo VLAN 100", echo_request(A_MAC, A_IP, vlans=q100, size=56, seq=4, seed=4), "reply"),
        ("echo QinQ 10/20", echo_request(A_MAC, A_IP, vlans=qinq, size=20, seq=5, seed=5), "reply"),
        ("echo with IP options (router alert + NOPs)",
         echo_request(A_MAC, A_IP, size=32, seq=6, options=[IPOption_Router_Alert(), IPOption_NOP(), IPOption_NOP(),
                                                      IPOption_NOP(), IPOption_EOL()],
                      seed=6), "reply"),
        ("echo 4 bytes padded to 60", echo_request(B_MAC, B_IP, size=4, seq=7, pad_to=60, seed=7), "reply"),
        ("echo to broadcast MAC", echo_request(A_MAC, A_IP, dst_mac=BCAST, size=8, seq=8, seed=8), "reply"),
        # --- drops -------------------------------------------------------------------
        ("echo to another IP", echo_request(A_MAC, A_IP, dst_ip=OTHER_IP, seq=9), "not_local"),
        ("echo with bad ICMP checksum",
         corrupt(echo_request(A_MAC, A_IP, seq=10), 14 + 20 + 2, 0x5A), "bad_icmp_checksum"),
        ("IPv4 with bad header checksum",
         corrupt(echo_request(A_MAC, A_IP, seq=11), 14 + 10, 0x5A), "bad_ipv4_checksum"),
        ("UDP to us", bytes(Ether(src=A_MAC, dst=OUR_MAC) / IP(src=A_IP, dst=OUR_IP)
                            / UDP(sport=40000, dport=53) / Raw(b"udp payload")), "unsupported_protocol"),
        ("ICMP timestamp request", bytes(Ether(src=A_MAC, dst=OUR_MAC) / IP(src=A_IP, dst=OUR_IP)
                                        / ICMP(type=13, id=7, seq=7) / Raw(b"\x00" * 12)), "icmp_not_echo"),
        ("ICMP echo reply to us", echo_request(A_MAC, A_IP, icmp_type=0, seq=12), "icmp_not_echo"),
        ("IPv4 first fragment (MF) to us", echo_request(A_MAC, A_IP, flags="MF", seq=13), "ipv4_fragment"),
        ("IPv4 later fragment to us", bytes(Ether(src=A_MAC, dst=OUR_MAC) / IP(
            src=A_IP, dst=OUR_IP, proto=1, frag=8, flags=0) / Raw(payload(24))), "ipv4_fragment"),
        # From addresses no single host sends from (RFC 1812): never answered.
        ("echo from 0.0.0.0", echo_request(A_MAC, "0.0.0.0", seq=19), "martian_source"),
        ("echo from 127.0.0.1", echo_request(A_MAC, "127.0.0.1", seq=20), "martian_source"),
        ("echo from a multicast address", echo_request(A_MAC, "224.0.0.5", seq=21), "martian_source"),
        ("echo from the limited broadcast", echo_request(A_MAC, "255.255.255.255", seq=22), "martian_source"),
        # The port has no IPv6 address: an echo to any IPv6 address is not for us.
        ("IPv6 echo", bytes(Ether(src=A_MAC, dst=OUR_MAC) / IPv6(src="2001:2::a", dst="2001:2::1")
                            / ICMPv6EchoRequest(id=1, seq=1)), "not_local"),
        ("unknown ethertype 0x88b5", bytes(Ether(src=A_MAC, dst=OUR_MAC, type=0x88B5) / Raw(payload(46))),
         "unknown_ethertype"),
        ("echo to another unicast MAC", echo_request(A_MAC, A_IP, dst_mac=OTHER_MAC, seq=14), "not_our_mac"),
        ("arp request unicast to another MAC", arp_request(A_MAC, A_IP, OUR_IP, dst=OTHER_MAC), "not_our_mac"),
        ("echo to a multicast MAC", echo_request(A_MAC, A_IP, dst_mac="01:00:5e:00:00:01", seq=15),
         "not_our_mac"),
        ("runt of 10 bytes", bytes(echo_request(A_MAC, A_IP, seq=16))[:10], "truncated"),
        ("ethernet + half an IPv4 header", bytes(echo_request(A_MAC, A_IP, seq=17))[:14 + 10], "truncated"),
        ("ethernet + ARP cut short", arp_request(A_MAC, A_IP, OUR_IP)[:14 + 20], "truncated"),
        ("VLAN tag cut short", arp_request(A_MAC, A_IP, OUR_IP, vlans=q100)[:16], "truncated"),
        ("multicast source MAC", echo_request("01:00:5e:00:00:05", A_IP, seq=18), "bad_source_mac"),
        ("broadcast source MAC", arp_request(BCAST, A_IP, OUR_IP), "bad_source_mac"),
        # A last valid request, so a reply that goes missing at the end is noticed.
        ("final echo from A", echo_request(A_MAC, A_IP, size=56, seq=99, seed=9), "reply"),
    ]
    return frames


def cmd_make(args):
    frames = FRAME_SETS[args.set]()
    replies, drops = [], {r: 0 for r in DROP_REASONS}
    arp_replied = icmp_replied = 0
    learned = set()
    for index, (name, raw, verdict) in enumerate(frames):
        if verdict == "reply":
            off = l3_offset(raw)
            ethertype = int.from_bytes(raw[off - 2:off], "big")
            if ethertype == 0x0806:
                expected = expected_arp_reply(raw)
                kind = "arp"
                arp_replied += 1
                learned.add(raw[off + 14:off + 18])  # requester learned (RFC 826 merge)
            else:
                expected = expected_echo_reply(raw)
                kind = "icmp"
                icmp_replied += 1
            replies.append({"request_index": index, "name": name, "kind": kind, "hex": expected.hex()})
        else:
            assert verdict in drops, verdict
            drops[verdict] += 1
    writer = RawPcapWriter(args.in_pcap, linktype=1)  # DLT_EN10MB, bytes written as they are
    writer.write_header(None)
    for i, (_, raw, _) in enumerate(frames):
        writer.write_packet(raw, sec=1_700_000_000 + i, usec=0)
    writer.close()
    # Re-read and compare: scapy must not have altered a single byte.
    back = [bytes(p) for p in rdpcap(args.in_pcap)]
    assert back == [raw for _, raw, _ in frames], "pcap round trip changed the frames"
    expect = {
        "set": args.set,
        "appliance": {"mac": OUR_MAC, "ip": OUR_IP},
        "input_frames": len(frames),
        "frames": [{"index": i, "name": n, "verdict": v, "len": len(r)} for i, (n, r, v) in enumerate(frames)],
        "replies": replies,
        "drops": drops,
        "events": {
            "arp_replied": arp_replied,
            "icmp_echo_replied": icmp_replied,
            "neighbour_learned": len(learned),
            "neighbour_table_full": 0,
        },
    }
    out = args.expect_json or (args.in_pcap[:-5] if args.in_pcap.endswith(".pcap") else args.in_pcap) + ".expect.json"
    with open(out, "w") as f:
        json.dump(expect, f, indent=1)
    print(f"wrote {args.in_pcap} ({len(frames)} frames) and {out} "
          f"({len(replies)} replies, {sum(drops.values())} drops)")
    return 0


# ----------------------------------------------------------------------------------
# check


class Report:
    def __init__(self):
        self.errors = []

    def eq(self, where, field, actual, expected):
        if actual != expected:
            self.errors.append(f"{where}: {field}: got {actual!r}, expected {expected!r}")

    def fail(self, msg):
        self.errors.append(msg)


def flatten(pkt):
    """Every field of every layer, as [(layer.field, repr)], for a readable diff."""
    out = []
    layer = pkt
    depth = 0
    while layer is not None and layer.__class__.__name__ != "NoPayload":
        for f in layer.fields_desc:
            if isinstance(f, ConditionalField) and not f._evalcond(layer):
                continue
            out.append((f"{depth}:{layer.__class__.__name__}.{f.name}", repr(layer.getfieldval(f.name))))
        layer = layer.payload
        depth += 1
    return out


def field_diff(actual, expected):
    a, e = dict(flatten(Ether(actual))), dict(flatten(Ether(expected)))
    lines = []
    for k in list(dict.fromkeys(list(e) + list(a))):
        if a.get(k) != e.get(k):
            lines.append(f"      {k}: got {a.get(k, '<absent>')}, expected {e.get(k, '<absent>')}")
    if not lines and actual != expected:
        first = next((i for i in range(min(len(actual), len(expected))) if actual[i] != expected[i]), None)
        lines.append(f"      bytes differ (lengths {len(actual)} vs {len(expected)}, first difference at "
                     f"{first if first is not None else min(len(actual), len(expected))})")
    return lines


def scapy_checks(rep, i, frame, exp, appliance):
    """Decode the reply with scapy and check its fields one by one (on top of the
    byte comparison), including checksums recomputed by scapy."""
    where = f"output frame #{i} ({exp['name']})"
    pkt = Ether(frame)
    rep.eq(where, "eth.src", pkt.src, appliance["mac"])
    req_src = bytes.fromhex(exp["hex"])[0:6]
    rep.eq(where, "eth.dst", pkt.dst, ":".join(f"{b:02x}" for b in req_src))
    if exp["kind"] == "arp":
        if ARP not in pkt:
            rep.fail(f"{where}: scapy finds no ARP layer")
            return
        a = pkt[ARP]
        rep.eq(where, "arp.hwtype", a.hwtype, 1)
        rep.eq(where, "arp.ptype", a.ptype, 0x0800)
        rep.eq(where, "arp.hwlen", a.hwlen, 6)
        rep.eq(where, "arp.plen", a.plen, 4)
        rep.eq(where, "arp.op", a.op, 2)
        rep.eq(where, "arp.hwsrc", a.hwsrc, appliance["mac"])
        rep.eq(where, "arp.psrc", a.psrc, appliance["ip"])
        rep.eq(where, "arp.hwdst", a.hwdst, pkt.dst)
    else:
        if IP not in pkt or ICMP not in pkt:
            rep.fail(f"{where}: scapy finds no IP/ICMP layer")
            return
        ip, icmp = pkt[IP], pkt[ICMP]
        rep.eq(where, "ip.src", ip.src, appliance["ip"])
        rep.eq(where, "ip.ttl", ip.ttl, 64)
        ihl = ip.ihl * 4
        raw_ip = bytes(ip)[:ihl]
        rep.eq(where, "ip.checksum (recomputed over the header)", inet_checksum(raw_ip), 0)
        rep.eq(where, "icmp.type", icmp.type, 0)
        rep.eq(where, "icmp.code", icmp.code, 0)
        raw_icmp = bytes(ip)[ihl:ip.len]
        rep.eq(where, "icmp.checksum (recomputed over the message)", inet_checksum(raw_icmp), 0)


TSHARK_FIELDS = [
    "frame.number", "frame.len", "eth.dst", "eth.src", "ieee8021ad.id", "vlan.id", "arp.opcode",
    "arp.src.hw_mac", "arp.src.proto_ipv4", "arp.dst.hw_mac", "arp.dst.proto_ipv4", "ip.src",
    "ip.dst", "ip.ttl", "ip.len", "ip.id", "ip.checksum.status", "icmp.type", "icmp.code",
    "icmp.ident", "icmp.seq", "icmp.checksum.status", "_ws.malformed", "_ws.expert.message",
]


def icmp_checksum_field(frame):
    off = l3_offset(frame)
    ihl = (frame[off] & 0x0F) * 4
    return int.from_bytes(frame[off + ihl + 2:off + ihl + 4], "big")


def equivalent_zero_checksum(got, want, exp):
    """True when got differs from want only in an ICMP checksum of 0x0000 vs 0xffff
    and got's checksum still verifies. Both are zero in one's complement; which one a
    sender writes depends on how it computed it (RFC 1624), and receivers accept both
    as long as the sum over the message comes out as -0."""
    if exp["kind"] != "icmp" or len(got) != len(want):
        return False
    g, w = icmp_checksum_field(got), icmp_checksum_field(want)
    if {g, w} != {0x0000, 0xFFFF}:
        return False
    off = l3_offset(got)
    ihl = (got[off] & 0x0F) * 4
    at = off + ihl + 2
    if got[:at] + got[at + 2:] != want[:at] + want[at + 2:]:
        return False
    total = int.from_bytes(got[off + 2:off + 4], "big")
    return inet_checksum(got[off + ihl:off + total]) == 0


def tshark_decode(pcap):
    tshark = shutil.which("tshark")
    if not tshark:
        raise RuntimeError("tshark not found (run scripts/setup.sh)")
    cmd = [tshark, "-n", "-r", pcap, "-o", "ip.check_checksum:TRUE", "-T", "fields",
           "-E", "separator=\t", "-E", "occurrence=a", "-E", "aggregator=,"]
    for f in TSHARK_FIELDS:
        cmd += ["-e", f]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    if res.returncode != 0:
        raise RuntimeError(f"tshark failed ({res.returncode}): {res.stderr.strip()}")
    rows = []
    for line in res.stdout.splitlines():
        values = line.split("\t")
        values += [""] * (len(TSHARK_FIELDS) - len(values))
        rows.append(dict(zip(TSHARK_FIELDS, values)))
    return rows


def tag_ids(frame):
    """(802.1ad ids, 802.1Q ids) as tshark would list them."""
    ad, q = [], []
    off, et = 14, int.from_bytes(frame[12:14], "big")
    while et in (0x8100, 0x88A8):
        vid = int.from_bytes(frame[off:off + 2], "big") & 0x0FFF
        (ad if et == 0x88A8 else q).append(str(vid))
        et = int.from_bytes(frame[off + 2:off + 4], "big")
        off += 4
    return ",".join(ad), ",".join(q)


def tshark_checks(rep, i, row, exp, appliance):
    where = f"output frame #{i} ({exp['name']}) [tshark]"
    want = bytes.fromhex(exp["hex"])
    rep.eq(where, "frame.len", row["frame.len"], str(len(want)))
    rep.eq(where, "eth.src", row["eth.src"], appliance["mac"])
    rep.eq(where, "eth.dst", row["eth.dst"], ":".join(f"{b:02x}" for b in want[0:6]))
    ad, q = tag_ids(want)
    rep.eq(where, "ieee8021ad.id", row["ieee8021ad.id"], ad)
    rep.eq(where, "vlan.id", row["vlan.id"], q)
    rep.eq(where, "_ws.malformed", row["_ws.malformed"], "")
    rep.eq(where, "_ws.expert.message", row["_ws.expert.message"], "")
    req = Ether(want)
    if exp["kind"] == "arp":
        a = req[ARP]
        rep.eq(where, "arp.opcode", row["arp.opcode"], "2")
        rep.eq(where, "arp.src.hw_mac", row["arp.src.hw_mac"], appliance["mac"])
        rep.eq(where, "arp.src.proto_ipv4", row["arp.src.proto_ipv4"], appliance["ip"])
        rep.eq(where, "arp.dst.hw_mac", row["arp.dst.hw_mac"], a.hwdst)
        rep.eq(where, "arp.dst.proto_ipv4", row["arp.dst.proto_ipv4"], a.pdst)
        rep.eq(where, "ip.src", row["ip.src"], "")
    else:
        ip, icmp = req[IP], req[ICMP]
        rep.eq(where, "ip.src", row["ip.src"], appliance["ip"])
        rep.eq(where, "ip.dst", row["ip.dst"], ip.dst)
        rep.eq(where, "ip.ttl", row["ip.ttl"], "64")
        rep.eq(where, "ip.len", row["ip.len"], str(ip.len))
        rep.eq(where, "ip.id", row["ip.id"], f"0x{ip.id:04x}")
        rep.eq(where, "ip.checksum.status (1 = good)", row["ip.checksum.status"], "1")
        rep.eq(where, "icmp.type", row["icmp.type"], "0")
        rep.eq(where, "icmp.code", row["icmp.code"], "0")
        rep.eq(where, "icmp.ident", row["icmp.ident"], str(icmp.id))
        rep.eq(where, "icmp.seq", row["icmp.seq"], str(icmp.seq))
        rep.eq(where, "icmp.checksum.status (1 = good)", row["icmp.checksum.status"], "1")


def check_tshark_validates(rep, in_pcap, expect):
    """Proves tshark's checksum validation is really on: on the INPUT it must call the
    deliberately corrupted checksums bad and the echo requests' checksums good."""
    rows = tshark_decode(in_pcap)
    if len(rows) != expect["input_frames"]:
        rep.fail(f"tshark sees {len(rows)} input frames, expected {expect['input_frames']}")
        return
    for f in expect["frames"]:
        row = rows[f["index"]]
        where = f"input frame #{f['index']} ({f['name']}) [tshark]"
        if f["verdict"] == "bad_ipv4_checksum":
            rep.eq(where, "ip.checksum.status (0 = bad)", row["ip.checksum.status"], "0")
        elif f["verdict"] == "bad_icmp_checksum":
            rep.eq(where, "icmp.checksum.status (0 = bad)", row["icmp.checksum.status"], "0")
        elif f["verdict"] == "reply" and row["icmp.type"]:
            rep.eq(where, "ip.checksum.status (1 = good)", row["ip.checksum.status"], "1")
            rep.eq(where, "icmp.checksum.status (1 = good)", row["icmp.checksum.status"], "1")


def cmd_check(args):
    with open(args.expect_json) as f:
        expect = json.load(f)
    appliance = expect["appliance"]
    rep = Report()

    inputs = [bytes(p) for p in rdpcap(args.in_pcap)]
    if len(inputs) != expect["input_frames"]:
        rep.fail(f"{args.in_pcap}: {len(inputs)} frames, expected {expect['input_frames']} "
                 "(input and expectations do not belong together)")
    check_tshark_validates(rep, args.in_pcap, expect)

    if not os.path.exists(args.out_pcap):
        print(f"FAIL: {args.out_pcap} does not exist (was the port closed cleanly?)")
        return 1
    outputs = [bytes(p) for p in rdpcap(args.out_pcap)] if os.path.getsize(args.out_pcap) > 24 else []
    replies = expect["replies"]

    notes = []
    # 1. The sequence: exactly the expected replies, in order, byte for byte. An
    # alignment first, so one missing or extra frame is reported as such instead of
    # shifting every comparison after it.
    out_hex = [o.hex() for o in outputs]
    want_hex = [r["hex"] for r in replies]
    pairs = []  # (output index, reply index)
    matcher = difflib.SequenceMatcher(None, out_hex, want_hex, autojunk=False)
    for op, o1, o2, r1, r2 in matcher.get_opcodes():
        if op == "equal":
            pairs += list(zip(range(o1, o2), range(r1, r2)))
            continue
        common = min(o2 - o1, r2 - r1) if op == "replace" else 0
        for k in range(common):
            o, r = o1 + k, r1 + k
            pairs.append((o, r))
            want = bytes.fromhex(want_hex[r])
            if equivalent_zero_checksum(outputs[o], want, replies[r]):
                notes.append(f"output frame #{o} ({replies[r]['name']}): ICMP checksum "
                             f"{icmp_checksum_field(outputs[o]):#06x} where {icmp_checksum_field(want):#06x} "
                             "was computed; the other representation of zero, and it verifies: accepted")
                continue
            rep.fail(f"output frame #{o} = reply #{r} ({replies[r]['name']}, request frame "
                     f"{replies[r]['request_index']}) differs from the expected bytes:\n"
                     + "\n".join(field_diff(outputs[o], want))
                     + f"\n      got      {out_hex[o]}\n      expected {want_hex[r]}")
        for r in range(r1 + common, r2):
            rep.fail(f"reply #{r} ({replies[r]['name']}, request frame {replies[r]['request_index']}): "
                     f"missing from the output (expected {want_hex[r]})")
        for o in range(o1 + common, o2):
            rep.fail(f"output frame #{o}: unexpected frame: {Ether(outputs[o]).summary()} ({out_hex[o]})")
    if [r for _, r in pairs] != sorted(r for _, r in pairs):
        rep.fail("replies are out of order")

    # 2. Field checks by scapy, independent of the byte comparison.
    for o, r in pairs:
        scapy_checks(rep, o, outputs[o], replies[r], appliance)

    # 3. The same replies through tshark's dissectors, checksum validation on.
    try:
        rows = tshark_decode(args.out_pcap) if outputs else []
    except RuntimeError as e:
        rep.fail(str(e))
        rows = []
    if len(rows) != len(outputs):
        rep.fail(f"tshark decodes {len(rows)} output frames, scapy {len(outputs)}")
    else:
        for o, r in pairs:
            tshark_checks(rep, o, rows[o], replies[r], appliance)

    for n_ in notes:
        print(f"note: {n_}")
    if rep.errors:
        print(f"FAIL: {len(rep.errors)} mismatch(es) between {args.out_pcap} and {args.expect_json}:")
        for e in rep.errors:
            print(f"  - {e}")
        return 1
    print(f"OK: {len(outputs)} replies match byte for byte; scapy and tshark agree, "
          "IP and ICMP checksums good")
    return 0


def main():
    global OUR_MAC, OUR_IP
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mac", default=OUR_MAC, help="the appliance's MAC")
    parser.add_argument("--ip", default=OUR_IP, help="the appliance's IPv4 address")
    sub = parser.add_subparsers(dest="cmd", required=True)
    mk = sub.add_parser("make", help="write the input pcap and the expectations")
    mk.add_argument("--set", choices=sorted(FRAME_SETS), default="main",
                    help="which fixture: main (every reply and drop reason, default) or "
                         "checksum-corners (one's-complement corner cases)")
    mk.add_argument("in_pcap")
    mk.add_argument("expect_json", nargs="?")
    ck = sub.add_parser("check", help="check Sluice's output against the expectations")
    ck.add_argument("in_pcap")
    ck.add_argument("out_pcap")
    ck.add_argument("expect_json")
    args = parser.parse_args()
    OUR_MAC, OUR_IP = args.mac.lower(), args.ip
    return cmd_make(args) if args.cmd == "make" else cmd_check(args)


if __name__ == "__main__":
    sys.exit(main())
