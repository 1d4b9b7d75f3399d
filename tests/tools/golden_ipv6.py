#!/usr/bin/python3
"""Golden IPv6 packets for Sluice on net_pcap: every forwarding mode over IPv6 (DR,
NAT, TUN as IPv6-in-IPv6, FullNAT v6 -> v6) and NAT64 (FullNAT to an IPv4 real
server from an IPv4 local address), both directions, ICMPv6 errors about sessions
(and NAT64's ICMPv4 error translated to ICMPv6, RFC 7915), Neighbor Discovery and
echo for the appliance.

    golden_ipv6.py config
        Prints the services config (TOML) for the daemon.

    golden_ipv6.py make IN_PCAP EXPECT_JSON [--lports LPORTS_JSON]
        Writes the input frames (built with scapy from this file's constants) and the
        expected output frames, in order. Without --lports only the frames that do not
        depend on the local ports Sluice picks for FullNAT and NAT64 (phase 1); with
        them, the same frames first, then the real servers' answers to those local
        ports (phase 2).

    golden_ipv6.py learn OUT_PCAP LPORTS_JSON
        Reads the local address and port of each FullNAT/NAT64 session from a phase-1
        output (the one thing Sluice chooses), checks the address is the service's and
        the port in 1024..=65535, and writes them.

    golden_ipv6.py check OUT_PCAP EXPECT_JSON
        Checks OUT_PCAP against the expected frames, in order, nothing missing or
        extra (Sluice's own ARP requests, Neighbor Solicitations and unsolicited
        Neighbor Advertisements excepted, and counted): byte for byte (the IPv4
        identification of NAT64 packets, the translator's choice, excepted); scapy
        recomputing every checksum (outer and of the quoted packets) must find the
        same bytes; tshark, with checksum validation on, must report the same
        addresses, ports and ICMP types as for the expected frames and every checksum
        good. Exit 0 when everything matches, 1 with a report.

    golden_ipv6.py selftest DIR
        Proves the checker (no root, no Sluice): the expected frames themselves must
        pass, and each broken variant (a checksum, a port, an address, the NA's
        solicited flag, the NAT64 MSS, the quoted packets, a hop limit, a tunnel's flow
        label, a missing, an extra and two swapped frames) must fail.

Expected outputs come from the constants below, never from Sluice's output (but for
the learned local ports and the NAT64 identification).
"""

import hashlib
import json
import shutil
import subprocess
import tempfile
import sys

try:
    from scapy.all import (  # noqa: E402
        ARP, ICMP, IP, TCP, UDP, Ether, ICMPv6DestUnreach, ICMPv6EchoReply, ICMPv6EchoRequest,
        ICMPv6ND_NA, ICMPv6ND_NS, ICMPv6NDOptDstLLAddr, ICMPv6NDOptSrcLLAddr, ICMPv6PacketTooBig,
        IPv6, Raw, rdpcap, wrpcap,
    )
    from scapy.layers.inet import ICMPerror, IPerror, TCPerror, UDPerror  # noqa: E402
    from scapy.layers.inet6 import IPerror6  # noqa: E402
except ImportError as e:  # pragma: no cover
    sys.exit(f"golden_ipv6.py: scapy not importable ({e}); run with /usr/bin/python3")

sys.path.insert(0, __import__("os").path.dirname(__file__))
from golden_arp_icmp import Report, field_diff  # noqa: E402

OUR_MAC = "02:53:4c:00:00:01"
OUR_IP4 = "198.18.0.1"
OUR_IP6 = "2001:db8:18::1"
CLIENT_MAC = "02:00:00:00:00:c1"
CLIENT6 = "2001:db8:18::c1"
VIP6 = "2001:db8:18::100"
LIP6 = "2001:db8:18::50"
LIP4 = "198.18.0.50"
RS = {  # name: (address, MAC)
    "dr": ("2001:db8:18::11", "02:00:00:00:00:11"),
    "nat": ("2001:db8:18::12", "02:00:00:00:00:12"),
    "tun": ("2001:db8:18::13", "02:00:00:00:00:13"),
    "fullnat": ("2001:db8:18::14", "02:00:00:00:00:14"),
    "nat64": ("198.18.0.15", "02:00:00:00:00:15"),
}
# The MACs the DR and TUN real servers move to before the last frames.
MOVED_MACS = {"dr": "02:00:00:01:00:11", "tun": "02:00:00:01:00:13"}
# (proto, virtual port, real server, real port, mode, local address)
SERVICES = [
    ("tcp", 81, "dr", 81, "dr", None),
    ("tcp", 80, "nat", 8080, "nat", None),
    ("udp", 53, "nat", 5353, "nat", None),
    ("tcp", 82, "tun", 82, "tun", None),
    ("tcp", 83, "fullnat", 8083, "fullnat", LIP6),
    ("udp", 54, "fullnat", 5454, "fullnat", LIP6),
    ("tcp", 84, "nat64", 8084, "fullnat", LIP4),
    ("udp", 55, "nat64", 5555, "fullnat", LIP4),
]
# The sessions whose local end Sluice picks: (key, proto, real server, real port).
LEARNED = [("fn_tcp", "tcp", "fullnat", 8083), ("fn_udp", "udp", "fullnat", 5454),
           ("n64_tcp", "tcp", "nat64", 8084), ("n64_udp", "udp", "nat64", 5555)]
MSS6 = 1440


def config():
    t = ["[timeouts]"]
    for k in ("tcp", "tcpfin", "udp", "syn_recv", "syn_sent", "time_wait", "close", "close_wait", "last_ack"):
        t.append(f"{k} = 600")
    t.append("")
    for proto, vport, rs, rport, mode, lip in SERVICES:
        t += ["[[services]]", f'proto = "{proto}"', f'vip = "{VIP6}"', f"port = {vport}", 'scheduler = "rr"']
        if lip:
            t.append(f'local_addresses = ["{lip}"]')
        t += ["", "  [[services.real_servers]]", f'  ip = "{RS[rs][0]}"', f"  port = {rport}",
              f'  mode = "{mode}"', ""]
    return "\n".join(t)


def rs_mac(name):
    return RS[name][1]


def rs_ip(name):
    return RS[name][0]


def from_client(l3):
    return Ether(src=CLIENT_MAC, dst=OUR_MAC) / l3


def from_rs(name, l3):
    return Ether(src=rs_mac(name), dst=OUR_MAC) / l3


def ours_to(mac, l3):
    return Ether(src=OUR_MAC, dst=mac) / l3


def raw(p):
    return bytes(p)


def ip6(src, dst, **kw):
    kw.setdefault("hlim", 64)
    return IPv6(src=src, dst=dst, **kw)


def syn(sport, dport, seq=1000, mss=MSS6):
    return TCP(sport=sport, dport=dport, flags="S", seq=seq, window=64800, options=[("MSS", mss)])


def syn_ack(sport, dport, mss, seq=5000, ack=1001):
    return TCP(sport=sport, dport=dport, flags="SA", seq=seq, ack=ack, window=65160, options=[("MSS", mss)])


def build(lports):
    """[(name, input frame, [(output name, expected frame, kind)], drop reason)]."""
    F = []

    def add(name, frame, outs=(), drop=None):
        F.append((name, raw(frame), [(o[0], raw(o[1]), o[2] if len(o) > 2 else "exact") for o in outs], drop))

    # Real servers' solicited advertisements to our address (learned, then dropped),
    # and the IPv4 real server's ARP reply.
    for name in ("dr", "nat", "tun", "fullnat"):
        ip, mac = RS[name]
        add(f"NA from {name} real server",
            Ether(src=mac, dst=OUR_MAC) / IPv6(src=ip, dst=OUR_IP6, hlim=255)
            / ICMPv6ND_NA(R=0, S=1, O=1, tgt=ip) / ICMPv6NDOptDstLLAddr(lladdr=mac), drop="ndisc_advert")
    ip4, mac4 = RS["nat64"]
    add("ARP reply from the NAT64 real server",
        Ether(src=mac4, dst=OUR_MAC) / ARP(op=2, hwsrc=mac4, psrc=ip4, hwdst=OUR_MAC, pdst=OUR_IP4),
        drop="arp_reply")

    # Neighbor Discovery and echo for the appliance.
    snm = "ff02::1:ff00:1"
    add("NS for the appliance's address",
        Ether(src=CLIENT_MAC, dst="33:33:ff:00:00:01") / IPv6(src=CLIENT6, dst=snm, hlim=255)
        / ICMPv6ND_NS(tgt=OUR_IP6) / ICMPv6NDOptSrcLLAddr(lladdr=CLIENT_MAC),
        [("NA for the appliance's address", ours_to(CLIENT_MAC, IPv6(src=OUR_IP6, dst=CLIENT6, hlim=255)
          / ICMPv6ND_NA(R=0, S=1, O=1, tgt=OUR_IP6) / ICMPv6NDOptDstLLAddr(lladdr=OUR_MAC)))])
    for name, dst in (("appliance", OUR_IP6), ("VIP", VIP6)):
        data = f"golden6 echo to the {name}".encode()
        add(f"echo request to the {name}",
            from_client(ip6(CLIENT6, dst, hlim=57) / ICMPv6EchoRequest(id=0x6b6, seq=7, data=data)),
            [(f"echo reply from the {name}",
              ours_to(CLIENT_MAC, ip6(dst, CLIENT6) / ICMPv6EchoReply(id=0x6b6, seq=7, data=data)))])

    # DR: the client's packet as it is, to the real server's MAC.
    p = ip6(CLIENT6, VIP6, tc=0x28, fl=0xbeef) / syn(40001, 81)
    add("DR SYN", from_client(p), [("DR SYN to the real server", ours_to(rs_mac("dr"), p))])

    # NAT, TCP both ways; UDP both ways and the real server's port unreachable.
    add("NAT SYN", from_client(ip6(CLIENT6, VIP6) / syn(40002, 80)),
        [("NAT SYN to the real server", ours_to(rs_mac("nat"), ip6(CLIENT6, rs_ip("nat")) / syn(40002, 8080)))])
    add("NAT SYN-ACK", from_rs("nat", ip6(rs_ip("nat"), CLIENT6) / syn_ack(8080, 40002, 1440)),
        [("NAT SYN-ACK to the client", ours_to(CLIENT_MAC, ip6(VIP6, CLIENT6) / syn_ack(80, 40002, 1440)))])
    q_nat = ip6(CLIENT6, VIP6) / UDP(sport=40003, dport=53) / b"golden6 nat query"
    at_rs = ip6(CLIENT6, rs_ip("nat")) / UDP(sport=40003, dport=5353) / b"golden6 nat query"
    add("NAT UDP query", from_client(q_nat), [("NAT UDP query to the real server", ours_to(rs_mac("nat"), at_rs))])
    add("NAT UDP answer", from_rs("nat", ip6(rs_ip("nat"), CLIENT6) / UDP(sport=5353, dport=40003) / b"answer"),
        [("NAT UDP answer to the client", ours_to(CLIENT_MAC, ip6(VIP6, CLIENT6) / UDP(sport=53, dport=40003)
                                                 / b"answer"))])
    add("NAT port unreachable from the real server",
        from_rs("nat", ip6(rs_ip("nat"), CLIENT6) / ICMPv6DestUnreach(code=4) / raw(at_rs)),
        [("NAT port unreachable to the client, from the VIP",
          ours_to(CLIENT_MAC, ip6(VIP6, CLIENT6) / ICMPv6DestUnreach(code=4) / raw(q_nat)))])

    # TUN: IPv6-in-IPv6 from our address, hop limit 64, traffic class and flow label
    # copied from the inner packet.
    p = ip6(CLIENT6, VIP6, tc=0x48, fl=0x12345, hlim=33) / syn(40004, 82)
    add("TUN SYN", from_client(p),
        [("TUN SYN encapsulated", ours_to(rs_mac("tun"), IPv6(src=OUR_IP6, dst=rs_ip("tun"), nh=41, hlim=64,
                                                                tc=0x48, fl=0x12345) / p))])

    # No new connection from an address of ours or a multicast one: its session would
    # send the real server's answers to ourselves.
    for name, src, l4 in (("the VIP to itself", VIP6, UDP(sport=53, dport=53) / b"golden6 loop"),
                          ("the FullNAT local address", LIP6, syn(40009, 80)),
                          ("the appliance's address", OUR_IP6, syn(40010, 80)),
                          ("a multicast address", "ff0e::1:2", UDP(sport=40011, dport=53) / b"golden6 mc"),
                          ("the loopback address", "::1", syn(40012, 80)),
                          ("the unspecified address", "::", syn(40013, 80))):
        add(f"new connection from {name}", from_client(ip6(src, VIP6) / l4), drop="martian_source")

    # FullNAT v6 -> v6 and NAT64: the client's side first.
    fn_syn = ip6(CLIENT6, VIP6) / syn(40005, 83)
    fn_q = ip6(CLIENT6, VIP6) / UDP(sport=40006, dport=54) / b"golden6 fullnat query"
    n64_syn = ip6(CLIENT6, VIP6) / syn(40008, 84)
    n64_q = ip6(CLIENT6, VIP6) / UDP(sport=40007, dport=55) / b"golden6 nat64 query"
    L = lports or {}

    def at_lip(key, l4):
        """The client's packet as Sluice must send it towards the real server."""
        lip, lport = L[key]["lip"], L[key]["lport"]
        if key.startswith("fn"):
            return ip6(lip, rs_ip("fullnat")) / l4(lport)
        return IP(src=lip, dst=rs_ip("nat64"), ttl=64, id=L[key].get("id", 0)) / l4(lport)

    learning = lports is None
    fn_tcp_out = None if learning else at_lip("fn_tcp", lambda lp: syn(lp, 8083))
    fn_udp_out = None if learning else at_lip(
        "fn_udp", lambda lp: UDP(sport=lp, dport=5454) / b"golden6 fullnat query")
    n64_tcp_out = None if learning else at_lip("n64_tcp", lambda lp: syn(lp, 8084))
    n64_udp_out = None if learning else at_lip(
        "n64_udp", lambda lp: UDP(sport=lp, dport=5555) / b"golden6 nat64 query")
    kind = "learn" if learning else "exact"
    add("FullNAT SYN", from_client(fn_syn),
        [("FullNAT SYN to the real server", ours_to(rs_mac("fullnat"), fn_tcp_out or Raw()), kind)])
    add("FullNAT UDP query", from_client(fn_q),
        [("FullNAT UDP query to the real server", ours_to(rs_mac("fullnat"), fn_udp_out or Raw()), kind)])
    add("NAT64 SYN", from_client(n64_syn),
        [("NAT64 SYN to the real server, as IPv4", ours_to(rs_mac("nat64"), n64_tcp_out or Raw()),
          "learn" if learning else "nat64")])
    add("NAT64 UDP query", from_client(n64_q),
        [("NAT64 UDP query to the real server, as IPv4", ours_to(rs_mac("nat64"), n64_udp_out or Raw()),
          "learn" if learning else "nat64")])
    if learning:
        return F

    # The real servers' side, to the local ports learned in phase 1.
    fl, fu, nt, nu = (L[k]["lport"] for k in ("fn_tcp", "fn_udp", "n64_tcp", "n64_udp"))
    add("FullNAT SYN-ACK", from_rs("fullnat", ip6(rs_ip("fullnat"), LIP6) / syn_ack(8083, fl, 1440)),
        [("FullNAT SYN-ACK to the client", ours_to(CLIENT_MAC, ip6(VIP6, CLIENT6) / syn_ack(83, 40005, 1440)))])
    add("FullNAT UDP answer", from_rs("fullnat", ip6(rs_ip("fullnat"), LIP6) / UDP(sport=5454, dport=fu) / b"ans"),
        [("FullNAT UDP answer to the client", ours_to(CLIENT_MAC, ip6(VIP6, CLIENT6) / UDP(sport=54, dport=40006)
                                                     / b"ans"))])
    add("FullNAT port unreachable from the real server",
        from_rs("fullnat", ip6(rs_ip("fullnat"), LIP6) / ICMPv6DestUnreach(code=4) / raw(fn_udp_out)),
        [("FullNAT port unreachable to the client, from the VIP",
          ours_to(CLIENT_MAC, ip6(VIP6, CLIENT6) / ICMPv6DestUnreach(code=4) / raw(fn_q)))])
    add("FullNAT packet too big from the real server",
        from_rs("fullnat", ip6(rs_ip("fullnat"), LIP6) / ICMPv6PacketTooBig(mtu=1400) / raw(fn_tcp_out)),
        [("FullNAT packet too big to the client, from the VIP",
          ours_to(CLIENT_MAC, ip6(VIP6, CLIENT6) / ICMPv6PacketTooBig(mtu=1400) / raw(fn_syn)))])
    # NAT64: the IPv4 SYN-ACK's MSS lowered by 20 as IPv6; the UDP answer; the ICMPv4
    # port unreachable as ICMPv6 port unreachable (RFC 7915 4.2), quoting the
    # client's packet as it was.
    add("NAT64 SYN-ACK (IPv4, MSS 1460)",
        from_rs("nat64", IP(src=rs_ip("nat64"), dst=LIP4, ttl=64, id=0x4242) / syn_ack(8084, nt, 1460)),
        [("NAT64 SYN-ACK to the client, as IPv6, MSS 1440",
          ours_to(CLIENT_MAC, ip6(VIP6, CLIENT6) / syn_ack(84, 40008, 1440)))])
    add("NAT64 UDP answer (IPv4)",
        from_rs("nat64", IP(src=rs_ip("nat64"), dst=LIP4, ttl=61, tos=0x10, id=0x4343)
                / UDP(sport=5555, dport=nu) / b"ans64"),
        [("NAT64 UDP answer to the client, as IPv6",
          ours_to(CLIENT_MAC, ip6(VIP6, CLIENT6, hlim=61, tc=0x10) / UDP(sport=55, dport=40007) / b"ans64"))])
    add("NAT64 ICMPv4 port unreachable from the real server",
        from_rs("nat64", IP(src=rs_ip("nat64"), dst=LIP4, ttl=64, id=0x4444) / ICMP(type=3, code=3)
                / raw(n64_udp_out)),
        [("NAT64 ICMPv6 port unreachable to the client, from the VIP",
          ours_to(CLIENT_MAC, ip6(VIP6, CLIENT6) / ICMPv6DestUnreach(code=4) / raw(n64_q)))])
    # The client's side, about the real servers' answers: NAT to the real server from
    # the client, FullNAT from the local address, quoting the answer as the real server
    # sent it; NAT64's ICMPv6 port unreachable as ICMPv4 port unreachable (RFC 7915
    # 5.2) from the IPv4 local address.
    nat_ans = ip6(rs_ip("nat"), CLIENT6) / UDP(sport=5353, dport=40003) / b"answer"
    add("NAT port unreachable from the client",
        from_client(ip6(CLIENT6, VIP6) / ICMPv6DestUnreach(code=4)
                    / raw(ip6(VIP6, CLIENT6) / UDP(sport=53, dport=40003) / b"answer")),
        [("NAT port unreachable to the real server",
          ours_to(rs_mac("nat"), ip6(CLIENT6, rs_ip("nat")) / ICMPv6DestUnreach(code=4) / raw(nat_ans)))])
    fn_ans = ip6(rs_ip("fullnat"), LIP6) / UDP(sport=5454, dport=fu) / b"ans"
    add("FullNAT port unreachable from the client",
        from_client(ip6(CLIENT6, VIP6) / ICMPv6DestUnreach(code=4)
                    / raw(ip6(VIP6, CLIENT6) / UDP(sport=54, dport=40006) / b"ans")),
        [("FullNAT port unreachable to the real server, from the local address",
          ours_to(rs_mac("fullnat"), ip6(LIP6, rs_ip("fullnat")) / ICMPv6DestUnreach(code=4) / raw(fn_ans)))])
    n64_ans = IP(src=rs_ip("nat64"), dst=LIP4, ttl=61, tos=0x10, id=0x4343) / UDP(sport=5555, dport=nu) / b"ans64"
    add("NAT64 port unreachable from the client",
        from_client(ip6(CLIENT6, VIP6) / ICMPv6DestUnreach(code=4)
                    / raw(ip6(VIP6, CLIENT6, hlim=61, tc=0x10) / UDP(sport=55, dport=40007) / b"ans64")),
        [("NAT64 ICMPv4 port unreachable to the real server, from the local address",
          ours_to(rs_mac("nat64"), IP(src=LIP4, dst=rs_ip("nat64"), ttl=64) / ICMP(type=3, code=3)
                  / raw(n64_ans)), "nat64")])
    # The DR and TUN real servers move to new MACs (a NIC swapped, a VM migrated) and
    # say so with an unsolicited advertisement (Override set): their sessions' next
    # packets go to the new MACs, not to the ones they first had.
    for name in ("dr", "tun"):
        ip, mac = rs_ip(name), MOVED_MACS[name]
        add(f"unsolicited NA from the {name} real server at its new MAC",
            Ether(src=mac, dst=OUR_MAC) / IPv6(src=ip, dst=OUR_IP6, hlim=255)
            / ICMPv6ND_NA(R=0, S=0, O=1, tgt=ip) / ICMPv6NDOptDstLLAddr(lladdr=mac), drop="ndisc_advert")
    p = ip6(CLIENT6, VIP6) / TCP(sport=40001, dport=81, flags="A", seq=1001, ack=5001, window=64800)
    add("DR ACK", from_client(p), [("DR ACK to the real server's new MAC", ours_to(MOVED_MACS["dr"], p))])
    p = ip6(CLIENT6, VIP6, hlim=33) / TCP(sport=40004, dport=82, flags="A", seq=1001, ack=5001, window=64800)
    add("TUN ACK", from_client(p),
        [("TUN ACK encapsulated, to the real server's new MAC",
          ours_to(MOVED_MACS["tun"], IPv6(src=OUR_IP6, dst=rs_ip("tun"), nh=41, hlim=64) / p))])
    return F


def cmd_make(args):
    in_pcap, expect_json = args[0], args[1]
    lports = None
    if "--lports" in args:
        with open(args[args.index("--lports") + 1]) as f:
            lports = json.load(f)
    F = build(lports)
    wrpcap(in_pcap, [Ether(r) for _, r, _, _ in F])
    drops = {}
    for _, _, _, d in F:
        if d:
            drops[d] = drops.get(d, 0) + 1
    outputs = [{"name": o[0], "hex": o[1].hex(), "kind": o[2], "input": i}
               for i, (_, _, outs, _) in enumerate(F) for o in outs]
    with open(expect_json, "w") as f:
        json.dump({"input_frames": len(F), "outputs": outputs, "drops": drops,
                   "frames": [n for n, _, _, _ in F]}, f, indent=1)


def is_own_chatter(frame):
    """Frames Sluice sends on its own: ARP requests, Neighbor Solicitations,
    unsolicited Neighbor Advertisements to all nodes."""
    p = Ether(frame)
    if p.src != OUR_MAC:
        return False
    if ARP in p:
        return p[ARP].op == 1
    if ICMPv6ND_NS in p:
        return True
    if ICMPv6ND_NA in p:
        return p[IPv6].dst == "ff02::1" and p[ICMPv6ND_NA].S == 0
    return False


def cmd_learn(args):
    out_pcap, lports_json = args
    frames = [raw(p) for p in rdpcap(out_pcap)]
    learned, problems = {}, []
    for key, proto, rs, rport in LEARNED:
        l4cls = TCP if proto == "tcp" else UDP
        netcls = IPv6 if key.startswith("fn") else IP
        want_lip = LIP6 if netcls is IPv6 else LIP4
        hits = [Ether(f) for f in frames]
        hits = [p for p in hits if netcls in p and l4cls in p and p[netcls].dst == rs_ip(rs)
                and p[l4cls].dport == rport]
        if len(hits) != 1:
            problems.append(f"{key}: {len(hits)} frames to {rs_ip(rs)} {proto}/{rport}, expected 1")
            continue
        p = hits[0]
        lip, lport = p[netcls].src, p[l4cls].sport
        if lip != want_lip or not 1024 <= lport <= 65535:
            problems.append(f"{key}: local end {lip}:{lport}, expected {want_lip} and a port in 1024..=65535")
        learned[key] = {"lip": lip, "lport": lport}
        if netcls is IP:
            learned[key]["id"] = p[IP].id
    ports = [(v["lip"], v["lport"]) for v in learned.values()]
    if len(set(ports)) != len(ports):
        problems.append(f"local ends not distinct: {ports}")
    with open(lports_json, "w") as f:
        json.dump(learned, f)
    print(f"learned local ends: {learned}")
    if problems:
        print("LEARN FAILED:\n  " + "\n  ".join(problems))
        sys.exit(1)


def recomputed(frame):
    """The frame rebuilt by scapy with every checksum it carries (IPv4 header, TCP,
    UDP, ICMP, ICMPv6, outer and tunnelled; quoted packets of ICMP errors apart)
    deleted and so recomputed."""
    p = Ether(frame)
    layer = p
    while layer and layer.__class__.__name__ != "NoPayload":
        if isinstance(layer, (IPerror, TCPerror, UDPerror, ICMPerror, IPerror6)):
            break
        for f in ("chksum", "cksum"):
            if f in layer.fields:
                delattr(layer, f)  # (not `del fields[f]`: that keeps the cached bytes)
        layer = layer.payload
    return raw(p)


def quote_of(frame):
    """The packet quoted by an ICMP or ICMPv6 error, as bytes, or None."""
    p = Ether(frame)
    if IPv6 in p and (ICMPv6DestUnreach in p or ICMPv6PacketTooBig in p):
        return raw(p[IPv6].payload)[8:]
    if IP in p and ICMP in p and p[ICMP].type in (3, 11, 12):
        return raw(p[ICMP])[8:]
    return None


def quote_recomputed(q):
    cls = IPv6 if q[0] >> 4 == 6 else IP
    p = cls(q)
    layer = p
    while layer and layer.__class__.__name__ != "NoPayload":
        for f in ("chksum", "cksum"):
            if f in layer.fields:
                delattr(layer, f)
        layer = layer.payload
    return raw(p)


TSHARK_FIELDS = [
    "eth.src", "eth.dst", "ipv6.src", "ipv6.dst", "ipv6.hlim", "ipv6.tclass", "ipv6.flow", "ipv6.nxt",
    "ip.src", "ip.dst", "ip.ttl", "ip.checksum.status", "tcp.srcport", "tcp.dstport", "tcp.checksum.status",
    "tcp.options.mss_val", "udp.srcport", "udp.dstport", "udp.checksum.status", "icmp.type", "icmp.code",
    "icmp.checksum.status", "icmpv6.type", "icmpv6.code", "icmpv6.checksum.status", "icmpv6.mtu",
    "icmpv6.nd.na.target_address", "icmpv6.nd.na.flag.s", "icmpv6.nd.na.flag.o", "icmpv6.opt.linkaddr",
    "icmpv6.echo.identifier", "icmpv6.echo.sequence_number", "_ws.malformed",
]
STATUS_FIELDS = [f for f in TSHARK_FIELDS if f.endswith("checksum.status")]


_TSHARK_ROWS = {}


def tshark(pcap):
    """tshark's rows for pcap, once per content (the self-test decodes the same
    expected frames many times, and tshark takes a while to start)."""
    with open(pcap, "rb") as f:
        content = hashlib.sha256(f.read()).digest()
    if content not in _TSHARK_ROWS:
        _TSHARK_ROWS[content] = tshark_run(pcap)
    return _TSHARK_ROWS[content]


def tshark_run(pcap):
    exe = shutil.which("tshark")
    if not exe:
        raise RuntimeError("tshark not found (run scripts/setup.sh)")
    cmd = [exe, "-n", "-r", pcap, "-o", "ip.check_checksum:TRUE", "-o", "tcp.check_checksum:TRUE",
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


def with_actual_ident(expected, actual):
    """NAT64's IPv4 identification is the translator's choice (RFC 7915 5.1): the
    expected frame takes the actual one, its header checksum recomputed by scapy."""
    e, a = Ether(expected), Ether(actual)
    if IP not in e or IP not in a:
        return expected
    e[IP].id = a[IP].id
    del e[IP].chksum
    if ICMP in e and IPerror in e and IPerror in a:
        # An ICMPv4 error quoting a packet translated from IPv6, which had no
        # identification: the quoted one is the translator's too.
        e[IPerror].id = a[IPerror].id
        del e[IPerror].chksum
        del e[ICMP].chksum
    return raw(e)


def check(out_pcap, expect_json):
    """The checker's findings: (errors, outputs, Sluice's own frames set aside)."""
    with open(expect_json) as f:
        expect = json.load(f)
    rep = Report()
    all_frames = [raw(p) for p in rdpcap(out_pcap)]
    chatter = [f for f in all_frames if is_own_chatter(f)]
    frames = [f for f in all_frames if not is_own_chatter(f)]
    outs = expect["outputs"]
    if len(frames) != len(outs):
        rep.fail(f"{len(frames)} output frames (besides {len(chatter)} of Sluice's own ARP/NS/NA), "
                 f"expected {len(outs)}")
    expected = []
    for i, (o, actual) in enumerate(zip(outs, frames)):
        exp = bytes.fromhex(o["hex"])
        if o["kind"] == "nat64":
            exp = with_actual_ident(exp, actual)
        expected.append(exp)
        where = f"output frame #{i} ({o['name']})"
        if o["kind"] == "learn":
            continue
        if actual != exp:
            rep.fail(f"{where}: differs from the expected frame:\n" + "\n".join(field_diff(actual, exp)))
        # scapy: every checksum recomputed gives the same frame.
        if recomputed(actual) != actual:
            rep.fail(f"{where} [scapy]: checksums recomputed by scapy differ:\n"
                     + "\n".join(field_diff(actual, recomputed(actual))))
        q = quote_of(actual)
        if q is not None and quote_recomputed(q) != q:
            rep.fail(f"{where} [scapy]: the quoted packet's checksums recomputed differ")
    # tshark on the actual frames and on the expected ones (built from the constants).
    if frames:
        with tempfile.TemporaryDirectory() as d:
            wrpcap(f"{d}/actual.pcap", [Ether(f) for f in frames])
            wrpcap(f"{d}/expected.pcap", [Ether(f) for f in expected])
            got, want = tshark(f"{d}/actual.pcap"), tshark(f"{d}/expected.pcap")
        for i, (o, g, w) in enumerate(zip(outs, got, want)):
            if o["kind"] == "learn":
                continue
            where = f"output frame #{i} ({o['name']}) [tshark]"
            for field in TSHARK_FIELDS:
                if field in STATUS_FIELDS:
                    for k, st in enumerate(filter(None, g[field].split("|"))):
                        rep.eq(where, f"{field} #{k + 1} (1 = good)", st, "1")
                else:
                    rep.eq(where, field, g[field], w[field])
            # Every output carries a checksum (TCP, UDP, ICMPv6, IPv4): tshark must
            # have verified at least one.
            if not any(g[f] for f in STATUS_FIELDS):
                rep.fail(f"{where}: tshark verified no checksum")
    return rep.errors, len(frames), len(chatter)


def cmd_check(args):
    out_pcap, expect_json = args
    errors, outputs, chatter = check(out_pcap, expect_json)
    print(f"{outputs} outputs checked ({chatter} frames of Sluice's own ARP/NS/NA beside)")
    with open(expect_json + ".summary", "w") as f:
        json.dump({"chatter": chatter}, f)
    if errors:
        print("CHECK FAILED:\n  " + "\n  ".join(errors))
        sys.exit(1)
    print("check OK")


SELFTEST_LPORTS = {"fn_tcp": {"lip": LIP6, "lport": 1024}, "fn_udp": {"lip": LIP6, "lport": 1025},
                   "n64_tcp": {"lip": LIP4, "lport": 4096, "id": 1}, "n64_udp": {"lip": LIP4, "lport": 4097, "id": 2}}


def cmd_selftest(args):
    d = args[0]
    with open(f"{d}/lports.json", "w") as f:
        json.dump(SELFTEST_LPORTS, f)
    cmd_make([f"{d}/in.pcap", f"{d}/expect.json", "--lports", f"{d}/lports.json"])
    with open(f"{d}/expect.json") as f:
        outs = json.load(f)["outputs"]
    good = [bytes.fromhex(o["hex"]) for o in outs]
    at = {o["name"]: i for i, o in enumerate(outs)}

    def edit(name, change):
        frames = list(good)
        p = Ether(frames[at[name]])
        change(p)
        frames[at[name]] = raw(p)
        return frames

    def flip_tcp_checksum(p):
        p[TCP].chksum ^= 1

    def port(p):
        p[UDP].sport += 1
        del p[UDP].chksum

    def address(p):
        p[IPv6].src = LIP6
        del p[TCP].chksum

    def na_flag(p):
        p[ICMPv6ND_NA].S = 0
        del p[ICMPv6ND_NA].cksum

    def mss(p):
        p[TCP].options = [("MSS", 1460)]
        del p[TCP].chksum

    def quote(p):
        load = bytearray(p[Raw].load)
        load[-1] ^= 0xFF
        p[Raw].load = bytes(load)
        del p[ICMPv6DestUnreach].cksum

    def hop_limit(p):
        p[IPv6].hlim -= 1

    def flow_label(p):
        p[IPv6].fl = 0

    def echo_data(p):
        p[ICMPv6EchoReply].data = b"x" + p[ICMPv6EchoReply].data[1:]

    def quoted_ttl(p):
        p[IPerror].ttl -= 1
        del p[IPerror].chksum
        del p[ICMP].chksum

    nat64_ip_checksum = lambda p: setattr(p[IP], "chksum", p[IP].chksum ^ 0x100)  # noqa: E731
    cases = [
        ("expected frames", good, True),
        ("NAT SYN: TCP checksum off by one", edit("NAT SYN to the real server", flip_tcp_checksum), False),
        ("FullNAT UDP answer: source port + 1", edit("FullNAT UDP answer to the client", port), False),
        ("FullNAT SYN-ACK: from the local address", edit("FullNAT SYN-ACK to the client", address), False),
        ("NA without the solicited flag", edit("NA for the appliance's address", na_flag), False),
        ("NAT64 SYN-ACK: MSS not clamped", edit("NAT64 SYN-ACK to the client, as IPv6, MSS 1440", mss), False),
        ("NAT64 port unreachable: quote changed",
         edit("NAT64 ICMPv6 port unreachable to the client, from the VIP", quote), False),
        ("NAT64 UDP query: IPv4 header checksum",
         edit("NAT64 UDP query to the real server, as IPv4", nat64_ip_checksum), False),
        ("NAT64 ICMPv4 error: quoted TTL changed",
         edit("NAT64 ICMPv4 port unreachable to the real server, from the local address", quoted_ttl), False),
        ("DR SYN: hop limit decremented", edit("DR SYN to the real server", hop_limit), False),
        ("TUN: outer flow label not copied", edit("TUN SYN encapsulated", flow_label), False),
        ("echo reply: data changed", edit("echo reply from the VIP", echo_data), False),
        ("a frame missing", good[:-1], False),
        ("a frame extra", good + [good[0]], False),
        ("two frames swapped", good[:4] + [good[5], good[4]] + good[6:], False),
    ]
    wrong = 0
    for name, frames, want_ok in cases:
        wrpcap(f"{d}/out.pcap", [Ether(f) for f in frames])
        errors, _, _ = check(f"{d}/out.pcap", f"{d}/expect.json")
        ok = not errors
        wrong += ok != want_ok
        why = " ".join(" ".join(errors).split())
        print(f"{name}: {'accepted' if ok else 'rejected'} ({'as it must' if ok == want_ok else 'WRONG'})"
              + (f": {why[:150]}" if why else ""))
    if wrong:
        sys.exit(f"selftest FAILED: {wrong} verdicts wrong")
    print("selftest OK: the checker accepts the expected output and rejects every broken variant")


def main():
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "config":
        print(config())
    elif cmd == "make":
        cmd_make(args)
    elif cmd == "learn":
        cmd_learn(args)
    elif cmd == "check":
        cmd_check(args)
    elif cmd == "selftest":
        cmd_selftest(args)
    else:
        sys.exit(f"unknown command {cmd}")


if __name__ == "__main__":
    main()
