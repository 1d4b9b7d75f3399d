#!/usr/bin/python3
"""Prints the client address carried in TOA options (TCP option kind 254, length 8:
client port then client IPv4 address, network order; DPVS's format) of the TCP
segments seen on an interface or in a pcap file. For FullNAT end-to-end tests: run it
on a real server's interface (or its namespace) and check that the client is recovered.

    toa_reader.py --iface eth0 [--port 8080] [--count N] [--timeout S] [--expect IP[:PORT]]
    toa_reader.py --pcap capture.pcap [--port 8080] [--expect IP[:PORT]]

One line per segment carrying TOA:

    10.0.0.1:61000 -> 10.0.0.11:8080 flags=A toa=198.51.100.10:40000

Exit status: 0 when at least one TOA was seen (and, with --expect, one matched the
expected client); 1 otherwise; 2 on usage errors. Sniffing needs CAP_NET_RAW (root).
Run with /usr/bin/python3 (Debian's scapy).

The options are parsed from the raw TCP header here, not by scapy's option decoder, as
the toa kernel module does: walk the options, stop at End of Option List or at a
malformed length, take the first kind-254 option whose length is 8.
"""

import argparse
import ipaddress
import struct
import sys

try:
    from scapy.all import IP, TCP, rdpcap, sniff  # noqa: E402
except ImportError:  # pragma: no cover - the tool is useless without scapy
    sys.stderr.write("toa_reader.py needs scapy (apt install python3-scapy)\n")
    sys.exit(2)

TOA_KIND = 254
TOA_LEN = 8


def find_toa(options):
    """The (ip, port) of the first kind-254 length-8 option in raw TCP options."""
    at = 0
    while at < len(options):
        kind = options[at]
        if kind == 0:  # End of Option List
            return None
        if kind == 1:  # No-Operation
            at += 1
            continue
        if at + 1 >= len(options):
            return None
        length = options[at + 1]
        if length < 2 or at + length > len(options):
            return None
        if kind == TOA_KIND and length == TOA_LEN:
            port, addr = struct.unpack("!H4s", options[at + 2 : at + TOA_LEN])
            return str(ipaddress.IPv4Address(addr)), port
        at += length
    return None


def tcp_options(packet):
    """Raw options bytes of the packet's TCP header, or None if not IPv4/TCP."""
    if IP not in packet or TCP not in packet:
        return None
    segment = bytes(packet[IP].payload)
    if len(segment) < 20:
        return None
    header_len = (segment[12] >> 4) * 4
    if header_len < 20 or header_len > len(segment):
        return None
    return segment[20:header_len]


def parse_expect(text):
    if text is None:
        return None
    host, _, port = text.partition(":")
    ipaddress.IPv4Address(host)  # raises ValueError on a bad address
    return host, int(port) if port else None


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--iface", help="interface to sniff on")
    source.add_argument("--pcap", help="pcap file to read instead")
    parser.add_argument("--port", type=int, help="only segments to or from this TCP port")
    parser.add_argument("--count", type=int, default=0, help="stop after N TOA segments")
    parser.add_argument("--timeout", type=float, help="stop sniffing after S seconds")
    parser.add_argument("--expect", help="client IP[:PORT] that must appear")
    args = parser.parse_args()
    try:
        expected = parse_expect(args.expect)
    except ValueError as error:
        parser.error(f"--expect: {error}")

    seen = []

    def handle(packet):
        options = tcp_options(packet)
        if options is None:
            return False
        tcp = packet[TCP]
        if args.port is not None and args.port not in (tcp.sport, tcp.dport):
            return False
        toa = find_toa(options)
        if toa is None:
            return False
        seen.append(toa)
        print(
            f"{packet[IP].src}:{tcp.sport} -> {packet[IP].dst}:{tcp.dport} "
            f"flags={tcp.flags} toa={toa[0]}:{toa[1]}",
            flush=True,
        )
        return bool(args.count) and len(seen) >= args.count

    if args.pcap:
        for packet in rdpcap(args.pcap):
            if handle(packet):
                break
    else:
        bpf = "tcp" if args.port is None else f"tcp port {args.port}"
        sniff(
            iface=args.iface,
            filter=bpf,
            store=False,
            prn=lambda p: None,
            stop_filter=handle,
            timeout=args.timeout,
            # Says when the capture is open, so a caller need not guess how long
            # importing scapy takes.
            started_callback=lambda: print("sniffing", file=sys.stderr, flush=True),
        )

    if not seen:
        print("no TOA option seen", file=sys.stderr)
        return 1
    if expected is not None:
        host, port = expected
        if not any(ip == host and (port is None or p == port) for ip, p in seen):
            print(f"expected client {args.expect} not among {seen}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
