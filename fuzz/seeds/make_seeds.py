#!/usr/bin/python3
"""Writes the seed corpora of the fuzz targets under fuzz/seeds/<target>/ from the
golden-packet fixtures (tests/tools/golden_forwarding.py and golden_arp_icmp.py build
the same pcaps the golden tests feed the daemon) and the example configs.

    /usr/bin/python3 fuzz/seeds/make_seeds.py      (Debian's scapy; from the repo root)
    /usr/bin/python3 fuzz/seeds/make_seeds.py sync (the sync_receiver seeds only)
    /usr/bin/python3 fuzz/seeds/make_seeds.py ipv6 (the IPv6 frame seeds only)

Input formats (fuzz/src/lib.rs `records`): a record is a tag byte, a 16-bit big-endian
length and that many bytes. Raw frames are tag 1 (forwarder, local_responder), raw
VRRP frames tag 1 after 8 config bytes (vrrp), raw sync datagrams tag 0 or 1 (sync
receiver: bit 0 = the receiver has the key), TOA inputs 4 head bytes then the frame.
"""
import glob
import hashlib
import hmac
import os
import random
import struct
import subprocess
import sys
import tempfile

from scapy.all import (ICMP, IP, TCP, UDP, Ether, ICMPv6DestUnreach, ICMPv6EchoRequest,
                       ICMPv6ND_NA, ICMPv6ND_NS, ICMPv6ND_RS, ICMPv6NDOptDstLLAddr,
                       ICMPv6NDOptSrcLLAddr, ICMPv6PacketTooBig, IPv6, IPv6ExtHdrDestOpt,
                       IPv6ExtHdrFragment, IPv6ExtHdrHopByHop, IPv6ExtHdrRouting, Raw, rdpcap)
from scapy.layers.vrrp import VRRPv3

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SEEDS = os.path.join(ROOT, "fuzz", "seeds")
SYNC_KEY = b"sluice fuzz sync key, 32 bytes."


def record(tag, body):
    return bytes([tag]) + struct.pack(">H", len(body)) + body


def write(target, name, data):
    d = os.path.join(SEEDS, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def golden_frames():
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        for t in ("forwarding", "arp_icmp"):
            pcap, js = os.path.join(tmp, t + ".pcap"), os.path.join(tmp, t + ".json")
            subprocess.run([sys.executable, os.path.join(ROOT, "tests", "tools", f"golden_{t}.py"),
                            "make", pcap, js], check=True, stdout=subprocess.DEVNULL)
            out[t] = [bytes(p) for p in rdpcap(pcap)]
    return out


def sync_message(records, key=None, mtype=1):
    """A sync message of version 6 (docs/SYNC.md) from 198.18.0.2 to every peer, or to
    198.18.0.1 (the fuzz bed's node) for a resync request or dump chunk."""
    flags = 1 if key else 0
    length = 44 + sum(len(r) for r in records)
    to = 0 if mtype == 1 else 0xC6120001
    head = struct.pack(">IBBHHHIIIIQQ", 0x534C5359, 6, mtype, flags, length, len(records),
                       0xC6120002, to, 0, 0, 1, 7)
    msg = head + b"".join(records)
    if key:
        msg += hmac.new(key, msg, hashlib.sha256).digest()
    return msg


def sync_tail(cport, vport, rport, lport, tcp):
    """Ports, timeout (30 s), timestamp offset, SYN proxy fields and reserved: the
    last 28 bytes of an IPv4 or IPv6 record."""
    return struct.pack(">HHHHIII", cport, vport, rport, lport, 30000, 0, 0) + bytes(8)


def sync_record(mode, client, cport, vip, vport, rip, rport, lip="0.0.0.0", lport=0, tcp=True, state=1):
    ip = lambda a: bytes(int(x) for x in a.split("."))
    return struct.pack(">BBBBBBH", 1, 1, 6 if tcp else 17, mode, state if tcp else 0, 32, 0) + \
        ip(client) + ip(vip) + ip(rip) + ip(lip) + sync_tail(cport, vport, rport, lport, tcp)


def sync_record6(mode, client, cport, vip, vport, rip, rport, tcp=True, state=1, flags=0, lip=None, lport=0):
    """An IPv6 connection record (kind 3, 100 bytes); an IPv4 real server or local
    address (NAT64) IPv4-mapped."""
    import ipaddress
    def ip(a):
        a = ipaddress.ip_address(a)
        return (a if a.version == 6 else ipaddress.IPv6Address("::ffff:" + str(a))).packed
    local = ip(lip) if lip else bytes(16)
    return struct.pack(">BBBBBBH", 3, 1, 6 if tcp else 17, mode, state if tcp else 0, 128, flags) + \
        ip(client) + ip(vip) + ip(rip) + local + sync_tail(cport, vport, rport, lport, tcp)


def sync_template6(mode, network, prefix, vip, vport, rip, rport, tcp=True):
    """An IPv6 persistence template record (kind 4, 100 bytes)."""
    import ipaddress
    ip = lambda a: ipaddress.IPv6Address(a).packed
    return struct.pack(">BBBBBBH", 4, 1, 6 if tcp else 17, mode, 0, prefix, 0) + \
        ip(network) + ip(vip) + ip(rip) + bytes(16) + \
        struct.pack(">HHHHIII", 0, vport, rport, 0, 30000, 0, 0) + bytes(8)


def sync_seeds():
    """sync_receiver: sessions of every mode of the bed's services, plain and keyed,
    IPv4 and IPv6 records mixed."""
    recs = [
        sync_record(3, "198.18.0.100", 33000, "198.18.0.210", 80, "198.18.0.11", 80),
        sync_record(0, "198.18.0.100", 33001, "198.18.0.220", 80, "198.18.0.12", 8080),
        sync_record(2, "198.18.0.100", 33002, "198.18.0.230", 80, "198.18.0.13", 80),
        sync_record(5, "198.18.0.100", 33003, "198.18.0.240", 80, "198.18.0.21", 8080, "198.18.0.50", 40000),
        sync_record(5, "198.18.0.101", 33004, "198.18.0.240", 3333, "198.18.0.22", 4444, "198.18.0.51", 40001,
                    tcp=False),
    ]
    recs6 = [
        sync_record6(0, "2001:db8:18::2", 33010, "2001:db8:18::100", 80, "2001:db8:18::21", 8080),
        sync_record6(0, "2001:db8:18::3", 33011, "2001:db8:18::100", 80, "2001:db8:18::22", 8080, state=5),
        sync_record6(3, "2001:db8:18::2", 33012, "2001:db8:18::100", 53, "2001:db8:18::21", 53, tcp=False,
                     flags=1),
    ]
    write("sync_receiver", "plain", record(0, sync_message(recs)))
    write("sync_receiver", "keyed", record(1, sync_message(recs, SYNC_KEY)))
    write("sync_receiver", "keyed-dump", record(1, sync_message(recs[3:], SYNC_KEY, mtype=3)))
    write("sync_receiver", "resync-request", record(0, sync_message([], mtype=2)))
    write("sync_receiver", "ipv6", record(0, sync_message(recs6)))
    write("sync_receiver", "ipv6-keyed-mixed", record(1, sync_message(recs[:2] + recs6 + recs[3:4], SYNC_KEY)))
    write("sync_receiver", "ipv6-keyed-dump", record(1, sync_message(recs6[1:], SYNC_KEY, mtype=3)))
    # IPv6 FullNAT and NAT64 connections and IPv6 templates (format version 6).
    more6 = [
        sync_record6(5, "2001:db8:18::2", 33020, "2001:db8:18::100", 80, "2001:db8:18::21", 8080,
                     lip="2001:db8:18::50", lport=40000),
        sync_record6(5, "2001:db8:18::2", 33021, "2001:db8:18::100", 80, "198.18.0.21", 8080,
                     lip="198.18.0.50", lport=40001),
        sync_template6(0, "2001:db8:18::", 64, "2001:db8:18::100", 80, "2001:db8:18::21", 8080),
        sync_template6(0, "2001:db8:18::2", 128, "2001:db8:18::100", 80, "2001:db8:18::22", 8080),
    ]
    write("sync_receiver", "ipv6-fullnat-nat64-templates", record(0, sync_message(more6)))
    write("sync_receiver", "ipv6-templates-keyed-dump",
          record(1, sync_message(recs6[:1] + more6[2:], SYNC_KEY, mtype=3)))


def ipv6_seeds():
    """IPv6 frames for the bed's IPv6 services (fuzz/src/bed.rs): FullNAT v6, NAT64,
    ICMPv6 errors about sessions both ways (ICMPv4 for NAT64's real servers), Neighbor
    Discovery and echo, and extension headers."""
    L, C, RSM = "02:53:4c:00:00:01", "02:00:00:00:01:00", "02:00:00:00:02:00"
    CL, LB = "2001:db8:18::9", "2001:db8:18::1"
    e = lambda src=C: Ether(dst=L, src=src)

    def conn(vip, sport, dport):
        return [e() / IPv6(src=CL, dst=vip) /
                TCP(sport=sport, dport=dport, flags=fl, seq=1000 if fl == "S" else 1001,
                    ack=0 if fl == "S" else 5001, options=[("MSS", 1440)] if fl == "S" else []) /
                Raw(b"GET / HTTP/1.0\r\n\r\n" if fl == "PA" else b"")
                for fl in ("S", "A", "PA")]
    # FullNAT v6 -> v6: a connection and UDP, with replies from the real servers to the
    # local addresses' first ports (where the pool starts), then the client's FIN.
    f = conn("2001:db8:18::200", 33000, 80)
    for lip in ("2001:db8:18::50", "2001:db8:18::51"):
        for port in (40000, 40001):
            for rs in ("2001:db8:18::31", "2001:db8:18::32"):
                f.append(e(RSM) / IPv6(src=rs, dst=lip) / TCP(sport=8080, dport=port, flags="SA", seq=5000,
                                                               ack=1001, options=[("MSS", 1460)]))
    f += [e() / IPv6(src=CL, dst="2001:db8:18::200") / UDP(sport=1024 + n, dport=53) / Raw(b"q" * 20)
          for n in range(2)]
    f.append(e() / IPv6(src=CL, dst="2001:db8:18::200") / TCP(sport=33000, dport=80, flags="FA", seq=1019, ack=5001))
    write("forwarder", "ipv6-fullnat", b"".join(record(1, bytes(x)) for x in f))
    # NAT64: IPv6 client and VIP, IPv4 replies from the real servers to the IPv4 local
    # address, an ICMPv4 error from a real server about a translated packet, an ICMPv6
    # error from the client about a reply, and time passing.
    f = conn("2001:db8:18::201", 33001, 80)
    # (The bed's worker picks 198.18.0.23 and port 40005 for this connection.)
    for port in (40005, 40000, 40001):
        for rs in ("198.18.0.23", "198.18.0.24"):
            f.append(e(RSM) / IP(src=rs, dst="198.18.0.52") /
                     TCP(sport=8080, dport=port, flags="SA", seq=5000, ack=1001, options=[("MSS", 1460)]))
            f.append(e(RSM) / IP(src=rs, dst="198.18.0.52") / ICMP(type=3, code=4, nexthopmtu=1400) /
                     IP(src="198.18.0.52", dst=rs, flags="DF") / TCP(sport=port, dport=8080, flags="A", seq=1001))
    f.append(e() / IPv6(src=CL, dst="2001:db8:18::201") / UDP(sport=1030, dport=53) / Raw(b"q" * 20))
    f.append(e() / IPv6(src=CL, dst="2001:db8:18::201") / ICMPv6DestUnreach(code=4) /
             IPv6(src="2001:db8:18::201", dst=CL) / UDP(sport=53, dport=1030))
    write("forwarder", "ipv6-nat64", b"".join(record(1, bytes(x)) for x in f) + record(2, struct.pack(">H", 50)))
    # ICMPv6 errors about NAT sessions: the real server's port unreachable about the
    # client's packet, the client's Packet Too Big about a reply.
    f = conn("2001:db8:18::100", 33002, 80)
    f.append(e() / IPv6(src=CL, dst="2001:db8:18::100") / UDP(sport=1031, dport=53) / Raw(b"q"))
    for rs in ("2001:db8:18::21", "2001:db8:18::22"):
        f.append(e(RSM) / IPv6(src=rs, dst=CL) / ICMPv6DestUnreach(code=4) /
                 IPv6(src=CL, dst=rs) / TCP(sport=33002, dport=8080, flags="A", seq=1001))
    f.append(e() / IPv6(src=CL, dst="2001:db8:18::100") / ICMPv6PacketTooBig(mtu=1280) /
             IPv6(src="2001:db8:18::100", dst=CL) / TCP(sport=80, dport=33002, flags="A", seq=5001) / Raw(b"x" * 64))
    write("forwarder", "ipv6-icmp-errors", b"".join(record(1, bytes(x)) for x in f))
    # Neighbor Discovery and echo: NS for the port's address and a VIP (to their
    # solicited-node groups), one with hop limit 64 (ignored), a DAD probe, an NA from
    # the real server not yet known (then a connection to it), a router solicitation,
    # echo requests, and extension headers (hop-by-hop, destination options, routing,
    # a fragment) in front of TCP.
    f = [Ether(dst="33:33:ff:00:00:01", src=C) / IPv6(src=CL, dst="ff02::1:ff00:1", hlim=255) /
         ICMPv6ND_NS(tgt=LB) / ICMPv6NDOptSrcLLAddr(lladdr=C),
         Ether(dst="33:33:ff:00:01:00", src=C) / IPv6(src=CL, dst="ff02::1:ff00:100", hlim=255) /
         ICMPv6ND_NS(tgt="2001:db8:18::100") / ICMPv6NDOptSrcLLAddr(lladdr=C),
         e() / IPv6(src=CL, dst=LB, hlim=64) / ICMPv6ND_NS(tgt=LB) / ICMPv6NDOptSrcLLAddr(lladdr=C),
         Ether(dst="33:33:ff:00:00:01", src=C) / IPv6(src="::", dst="ff02::1:ff00:1", hlim=255) / ICMPv6ND_NS(tgt=LB),
         e(RSM) / IPv6(src="2001:db8:18::32", dst=LB, hlim=255) / ICMPv6ND_NA(tgt="2001:db8:18::32", R=0, S=1, O=1) /
         ICMPv6NDOptDstLLAddr(lladdr=RSM),
         e() / IPv6(src="fe80::1", dst="ff02::2", hlim=255) / ICMPv6ND_RS(),
         e() / IPv6(src=CL, dst=LB) / ICMPv6EchoRequest(id=1, seq=1, data=b"ping"),
         e() / IPv6(src=CL, dst="2001:db8:18::200") / ICMPv6EchoRequest(id=1, seq=2, data=b"ping")]
    f += conn("2001:db8:18::200", 33003, 80)[:1]
    f += [e() / IPv6(src=CL, dst="2001:db8:18::100") / h / TCP(sport=33004, dport=80, flags="S")
          for h in (IPv6ExtHdrHopByHop(), IPv6ExtHdrDestOpt(), IPv6ExtHdrRouting(addresses=["2001:db8:18::100"]),
                    IPv6ExtHdrFragment(offset=0, m=1, id=7))]
    write("forwarder", "ipv6-ndp-echo-ext", b"".join(record(1, bytes(x)) for x in f))
    write("local_responder", "ipv6-ndp-echo", b"".join(record(1, bytes(x)) for x in f[:8]))


def main():
    if sys.argv[1:] == ["sync"]:
        return sync_seeds()
    if sys.argv[1:] == ["ipv6"]:
        return ipv6_seeds()
    frames = golden_frames()
    # forwarder: each golden pcap in runs of at most 64 frames (the target's limit).
    for t, fs in frames.items():
        for i in range(0, len(fs), 48):
            write("forwarder", f"golden-{t}-{i // 48:02}", b"".join(record(1, f) for f in fs[i:i + 48]))
    # The same runs with time passing (2 s) between frames, so sessions expire on the way.
    fs = frames["forwarding"]
    write("forwarder", "golden-forwarding-timed",
          b"".join(record(1, f) + record(2, struct.pack(">H", 20)) for f in fs[:30]))
    # Structured frames (tag 0): the bytes only steer the frame builder, so any
    # bytes make a run of mostly-valid frames; a fixed generator keeps them stable.
    rng = random.Random(24)
    for i in range(8):
        recs = []
        for _ in range(40):
            recs.append(record(rng.choice([0, 0, 0, 3]), bytes(rng.randrange(256) for _ in range(96))))
            if rng.random() < 0.2:
                recs.append(record(2, struct.pack(">H", rng.choice([1, 10, 50, 400]))))
        write("forwarder", f"structured-{i}", b"".join(recs))
    # A FullNAT connection with TOA: SYN, the first ACK (the option goes in), data.
    L, C = "02:53:4c:00:00:01", "02:00:00:00:01:00"
    flow = [Ether(dst=L, src=C) / IP(src="198.18.0.100", dst="198.18.0.240") /
            TCP(sport=33000 + n, dport=80, flags=fl, options=[("MSS", 1460)] if fl == "S" else []) /
            Raw(b"GET / HTTP/1.0\r\n\r\n" if fl == "PA" else b"")
            for n in range(3) for fl in ("S", "A", "PA")]
    udp = [Ether(dst=L, src=C) / IP(src="198.18.0.101", dst="198.18.0.240") / UDP(sport=1024 + n, dport=3333) /
           Raw(b"q" * 20) for n in range(3)]
    write("forwarder", "fullnat-toa", b"".join(record(1, bytes(f)) for f in flow + udp))
    # IPv6: a NAT connection (SYN, ACK, data) with the real server's SYN-ACK, and DR
    # datagrams, to the bed's IPv6 VIP.
    V6, RS6 = "2001:db8:18::100", "2001:db8:18::21"
    v6 = [Ether(dst=L, src=C) / IPv6(src="2001:db8:18::9", dst=V6) /
          TCP(sport=33000, dport=80, flags=fl, seq=1000 if fl == "S" else 1001, ack=0 if fl == "S" else 5001) /
          Raw(b"GET / HTTP/1.0\r\n\r\n" if fl == "PA" else b"")
          for fl in ("S", "A", "PA")]
    v6.insert(1, Ether(dst=L, src="02:00:00:00:02:00") / IPv6(src=RS6, dst="2001:db8:18::9") /
              TCP(sport=8080, dport=33000, flags="SA", seq=5000, ack=1001))
    v6 += [Ether(dst=L, src=C) / IPv6(src="2001:db8:18::9", dst=V6) / UDP(sport=1024 + n, dport=53) /
           Raw(b"q" * 20) for n in range(3)]
    write("forwarder", "ipv6-services", b"".join(record(1, bytes(f)) for f in v6))
    ipv6_seeds()
    # local_responder: ARP and ICMP fixtures, one run.
    write("local_responder", "golden-arp-icmp", b"".join(record(1, f) for f in frames["arp_icmp"]))
    # toa: every golden TCP frame, raw, with room for the option.
    n = 0
    for f in frames["forwarding"]:
        if Ether(f).haslayer(TCP):
            write("toa", f"golden-tcp-{n:02}", bytes([1, 40, 60, 7]) + f)
            n += 1
    syn = Ether(dst="02:53:4c:00:00:01", src="02:00:00:00:01:00") / IP(src="198.18.0.21", dst="198.18.0.50") / \
        TCP(sport=8080, dport=40000, flags="SA", options=[("MSS", 1460), ("SAckOK", b""), ("WScale", 7)])
    write("toa", "synack-mss", bytes([1, 8, 8, 1]) + bytes(syn))
    ack = Ether(dst="02:53:4c:00:00:01", src="02:00:00:00:01:00") / IP(src="198.18.0.100", dst="198.18.0.240") / \
        TCP(sport=33000, dport=80, flags="A", options=[("Timestamp", (1, 2))]) / Raw(b"GET / HTTP/1.0\r\n\r\n")
    write("toa", "ack-data", bytes([1, 40, 40, 2]) + bytes(ack))
    # vrrp: config (VRID 51, priority 100, 1 s, preempt) then adverts from a peer.
    adv = lambda prio, src: bytes(Ether(dst="01:00:5e:00:00:12", src="02:00:00:00:00:09") /
                                  IP(src=src, dst="224.0.0.18", ttl=255) /
                                  VRRPv3(vrid=51, priority=prio, adv=100, addrlist=["198.18.0.210"]))
    cfg = bytes([51, 100, 0, 100, 1, 0, 0, 0])
    write("vrrp", "peer-higher", cfg + record(1, adv(200, "198.18.0.2")) + record(2, struct.pack(">H", 1000)))
    write("vrrp", "peer-lower", cfg + record(2, struct.pack(">H", 4000)) + record(1, adv(50, "198.18.0.2")))
    write("vrrp", "peer-resign", cfg + record(1, adv(0, "198.18.0.3")) + record(2, struct.pack(">H", 700)))
    sync_seeds()
    # config: the example configs and the bed's.
    for path in sorted(glob.glob(os.path.join(ROOT, "config", "*.toml"))):
        with open(path, "rb") as f:
            write("config", os.path.basename(path), f.read())
    with open(os.path.join(ROOT, "fuzz", "src", "bed.rs")) as f:
        src = f.read()
    start = src.index('r#"') + 3
    write("config", "fuzz-bed.toml", src[start:src.index('"#;', start)].encode())


if __name__ == "__main__":
    main()
