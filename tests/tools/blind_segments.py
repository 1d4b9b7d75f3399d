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
                      --client CLIENT_IP [--syn] [--hold READY GO --socket-after SOCK]

With --hold, after the first echo it creates the file READY and waits (up to 60 s)
for the file GO (a test fails a load balancer over meanwhile), echoes once more, then
forges; the states after that are read from --socket-after's daemon.

Prints, one per line:

    echo before True|False     the connection echoes before the forgeries
    state before STATE         the session's state in `sluicectl -L -n -c --json`
    echo held True|False       with --hold: the connection echoes after GO
    state forged STATE         ... after the forgeries
    echo after True|False      the connection still echoes
    state reset STATE          ... after the client's own RST ("none": no session)

Needs root (raw sockets) and Debian's scapy: run with /usr/bin/python3.
"""

import argparse
import json
import os
import random
import socket
import struct
import subprocess
import sys
import time

from scapy.all import IP, TCP, AsyncSniffer, send


def state(args, step, port, sock):
    out = subprocess.run(
        [args.ctl, "--socket", sock, "-L", "-n", "-c", "--json"],
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
    parser.add_argument("--hold", nargs=2, metavar=("READY", "GO"))
    parser.add_argument("--socket-after")
    args = parser.parse_args()
    after = args.socket_after or args.socket

    # The port first, so that the capture holds this connection's segments only.
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind(("0.0.0.0", 0))
    port = s.getsockname()[1]
    sniffer = AsyncSniffer(
        iface=args.iface,
        filter="tcp and dst host %s and dst port %d and src port %d"
        % (args.vip, args.port, port),
    )
    sniffer.start()
    time.sleep(0.5)
    s.settimeout(3)
    s.connect((args.vip, args.port))
    print("echo before", echo(s, b"one"), flush=True)
    state(args, "before", port, args.socket)
    if args.hold:
        ready, go = args.hold
        open(ready, "w").close()
        deadline = time.monotonic() + 60
        while not os.path.exists(go) and time.monotonic() < deadline:
            time.sleep(0.05)
        print("echo held", echo(s, b"held"), flush=True)
    time.sleep(0.2)
    seen = [p[TCP].seq + len(p[TCP].payload) for p in sniffer.stop()]
    if not seen:
        sys.exit("the sniffer saw none of the connection's segments")
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
    state(args, "forged", port, after)
    print("echo after", echo(s, b"two"), flush=True)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()
    time.sleep(0.3)
    state(args, "reset", port, after)


if __name__ == "__main__":
    main()
