#!/usr/bin/python3
"""A blind sender against one TCP connection through Sluice, for end-to-end tests.

Run in the client's namespace. It opens a connection to an echo service at VIP:PORT
and captures its own segments, to aim the forgeries about half the sequence space
away from the client's. Then, in the client's name (the connection's addresses and
ports, which a blind sender may know or guess, but not its sequence numbers), it sends
a RST and a FIN, and with --syn a SYN after them (the client opening a new connection
from the same port, as far as Sluice can tell). Last, the client's own kernel resets
the connection (SO_LINGER 0), at its exact next byte.

    blind_segments.py --ctl SLUICECTL --socket SOCK --iface IF --vip VIP --port PORT
                      --client CLIENT_IP [--syn]

Prints, one per line:

    echo before True|False     the connection echoes before the forgeries
    state before STATE         the session's state in `sluicectl -L -n -c --json`
    state forged STATE         ... after the forgeries
    echo after True|False      the connection still echoes
    state reset STATE          ... after the client's own RST ("none": no session)

Needs root (raw sockets) and Debian's scapy: run with /usr/bin/python3.
"""

import argparse
import json
import random
import socket
import struct
import subprocess
import time

from scapy.all import IP, TCP, AsyncSniffer, send


def state(args, step, port):
    out = subprocess.run(
        [args.ctl, "--socket", args.socket, "-L", "-n", "-c", "--json"],
        capture_output=True,
        text=True,
        timeout=10,
    ).stdout
    virtual = "%s:%d" % (args.vip, args.port)
    rows = [
        c["state"]
        for c in json.loads(out)["connections"]
        if c["client"].endswith(":%d" % port) and c["virtual"] == virtual
    ]
    print("state", step, rows[0] if rows else "none", flush=True)


def echo(s, line):
    s.sendall(line + b"\n")
    got = b""
    while not got.endswith(b"\n"):
        chunk = s.recv(100)
        if not chunk:
            return False
        got += chunk
    return got.endswith(line + b"\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ctl", required=True)
    parser.add_argument("--socket", required=True)
    parser.add_argument("--iface", required=True)
    parser.add_argument("--vip", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--client", required=True)
    parser.add_argument("--syn", action="store_true")
    args = parser.parse_args()

    sniffer = AsyncSniffer(
        iface=args.iface,
        filter="tcp and dst host %s and dst port %d" % (args.vip, args.port),
    )
    sniffer.start()
    time.sleep(0.5)
    s = socket.create_connection((args.vip, args.port), timeout=3)
    port = s.getsockname()[1]
    print("echo before", echo(s, b"one"), flush=True)
    state(args, "before", port)
    time.sleep(0.2)
    seen = [
        p[TCP].seq + len(p[TCP].payload) for p in sniffer.stop() if p[TCP].sport == port
    ]
    far = (seen[-1] + (1 << 31) + random.randrange(-(1 << 29), 1 << 29)) % (1 << 32)
    forged = ["RA", "FA"] + (["S"] if args.syn else [])
    for flags in forged:
        ack = 0 if flags == "S" else 1
        send(
            IP(src=args.client, dst=args.vip)
            / TCP(sport=port, dport=args.port, flags=flags, seq=far, ack=ack),
            verbose=False,
        )
    time.sleep(0.3)
    state(args, "forged", port)
    print("echo after", echo(s, b"two"), flush=True)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()
    time.sleep(0.3)
    state(args, "reset", port)


if __name__ == "__main__":
    main()
