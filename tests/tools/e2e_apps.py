#!/usr/bin/python3
"""Small network programs for Sluice's end-to-end forwarding tests, run inside the test
bed's namespaces (`ip netns exec NS /usr/bin/python3 e2e_apps.py ...`).

    e2e_apps.py serve --name NAME --log FILE --ready FILE [--http ADDR:PORT]... [--udp ADDR:PORT]...
        A real server. HTTP on each --http address: every GET is answered with
        "NAME\\n", every POST with "NAME BYTES_RECEIVED\\n" (HTTP/1.0, connection
        closed), and logged as
        "http CLIENT_IP CLIENT_PORT LOCAL_IP:LOCAL_PORT". UDP echo on each --udp
        address: each datagram is answered with b"NAME " + the datagram, from the
        address it was sent to (bind to the VIP for direct routing), and logged as
        "udp CLIENT_IP CLIENT_PORT LOCAL_IP:LOCAL_PORT". The log is flushed per line.
        FILE given with --ready is created once every socket is bound. Runs until
        SIGTERM/SIGINT.

    e2e_apps.py decap --tun DEV --log FILE --ready FILE
        A user-space IP-in-IP (RFC 2003) decapsulator for a real server whose kernel
        has no ipip module: creates the TUN device DEV (up, rp_filter off), receives
        every IPv4 protocol-4 packet addressed to this namespace on a raw socket, and
        writes the inner packet to DEV, where the kernel receives it as if it had
        arrived there (the VIP is on lo). Logs "ipip OUTER_SRC INNER_SRC INNER_DST LEN"
        per packet. Runs until SIGTERM/SIGINT.

    e2e_apps.py curl URL --count N [--parallel P] [--max-time S] [--post-bytes B]
        N requests with curl (a new connection each: one curl process per request,
        --noproxy '*', bounded by --max-time), P at a time; GET, or a POST of B bytes
        (answered with "NAME B"). Prints one JSON object:
        {"ok": N_OK, "bodies": {BODY: COUNT}, "failures": ["...", ...],
         "seconds": ELAPSED}. Exit 0 when every request succeeded.

    e2e_apps.py udp ADDR PORT --count N [--sport-base P] [--timeout S]
        N UDP exchanges, each from a new socket (source port P+i when --sport-base is
        given, an ephemeral one otherwise): send b"ping I", wait for one reply.
        Prints one JSON object: {"ok": N_OK, "replies": ["...", ...], "failures": [...],
        "last_reply_at": UNIX_TIME}. Exit 0 when every exchange got its reply.
"""

import argparse
import http.server
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor


def addr_port(s):
    host, _, port = s.rpartition(":")
    return host, int(port)


class Log:
    def __init__(self, path):
        self.f = open(path, "a", buffering=1)
        self.lock = threading.Lock()

    def line(self, text):
        with self.lock:
            self.f.write(text + "\n")
            self.f.flush()


def cmd_serve(args):
    log = Log(args.log)
    name = args.name
    body = f"{name}\n".encode()

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"

        def do_GET(self):  # noqa: N802 (http.server's naming)
            self.answer(body)

        def do_POST(self):  # noqa: N802
            length = int(self.headers.get("Content-Length", "0"))
            got = len(self.rfile.read(length)) if length else 0
            self.answer(f"{name} {got}\n".encode())

        def answer(self, text):
            client_ip, client_port = self.client_address[:2]
            local = self.connection.getsockname()
            log.line(f"http {client_ip} {client_port} {local[0]}:{local[1]}")
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(text)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(text)

        def log_message(self, *a):
            pass

    class Server(http.server.ThreadingHTTPServer):
        allow_reuse_address = True
        daemon_threads = True
        request_queue_size = 128

    servers = [Server(addr_port(a), Handler) for a in args.http]
    udp_socks = []
    for a in args.udp:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(addr_port(a))
        udp_socks.append(s)

    def udp_loop(s):
        local = s.getsockname()
        while True:
            data, peer = s.recvfrom(65535)
            log.line(f"udp {peer[0]} {peer[1]} {local[0]}:{local[1]}")
            s.sendto(name.encode() + b" " + data, peer)

    for srv in servers:
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    for s in udp_socks:
        threading.Thread(target=udp_loop, args=(s,), daemon=True).start()
    if args.ready:
        write_ready(args.ready)
    print(f"{name}: serving http {args.http} udp {args.udp}", flush=True)
    wait_for_stop()
    return 0


def wait_for_stop():
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    while not stop.wait(0.5):
        pass


def write_ready(path):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.write(f"{os.getpid()}\n")
    os.rename(tmp, path)


def cmd_decap(args):
    import fcntl
    import struct

    TUNSETIFF = 0x400454CA
    IFF_TUN, IFF_NO_PI = 0x0001, 0x1000
    tun = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(tun, TUNSETIFF, struct.pack("16sH", args.tun.encode(), IFF_TUN | IFF_NO_PI))
    subprocess.run(["ip", "link", "set", args.tun, "up"], check=True)
    # The inner packet's source (the client) is routed via the Ethernet interface, not
    # the TUN device: strict reverse-path filtering would drop it.
    for conf in ("all", "default", args.tun):
        with open(f"/proc/sys/net/ipv4/conf/{conf}/rp_filter", "w") as f:
            f.write("0")
    raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, 4)  # IPPROTO_IPIP
    log = Log(args.log)

    def loop():
        while True:
            pkt = raw.recv(65535)
            ihl = (pkt[0] & 0x0F) * 4
            inner = pkt[ihl:]
            if len(inner) < 20 or inner[0] >> 4 != 4:
                continue
            os.write(tun, inner)
            log.line(f"ipip {socket.inet_ntoa(pkt[12:16])} {socket.inet_ntoa(inner[12:16])} "
                     f"{socket.inet_ntoa(inner[16:20])} {len(inner)}")

    threading.Thread(target=loop, daemon=True).start()
    write_ready(args.ready)
    print(f"decapsulating IP-in-IP onto {args.tun}", flush=True)
    wait_for_stop()
    return 0


def cmd_curl(args):
    post = []
    if args.post_bytes:
        import tempfile
        data = tempfile.NamedTemporaryFile(prefix="e2e-post-", delete=False)
        data.write(bytes((i * 7) & 0xFF for i in range(args.post_bytes)))
        data.close()
        post = ["--data-binary", "@" + data.name, "-H", "Content-Type: application/octet-stream"]

    def one(i):
        cmd = ["curl", "-sS", "--noproxy", "*", "--max-time", str(args.max_time), "-o", "-",
               "-w", "\\n%{http_code}", *post, args.url]
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=args.max_time + 5)
        except subprocess.TimeoutExpired:
            return None, f"#{i}: curl did not exit"
        lines = r.stdout.rsplit("\n", 1)
        if r.returncode != 0 or len(lines) != 2 or lines[1] != "200":
            return None, f"#{i}: exit {r.returncode}, stdout {r.stdout!r}, stderr {r.stderr.strip()!r}"
        return lines[0].strip(), None

    start = time.time()
    try:
        with ThreadPoolExecutor(max_workers=args.parallel) as pool:
            results = list(pool.map(one, range(args.count)))
    finally:
        if post:
            os.unlink(post[1][1:])
    bodies, failures = {}, []
    for b, err in results:
        if err:
            failures.append(err)
        else:
            bodies[b] = bodies.get(b, 0) + 1
    ok = sum(bodies.values())
    print(json.dumps({"ok": ok, "bodies": bodies, "failures": failures,
                      "seconds": round(time.time() - start, 3)}))
    return 0 if ok == args.count else 1


def cmd_udp(args):
    replies, failures = [], []
    last = None
    for i in range(args.count):
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if args.sport_base:
                s.bind(("", args.sport_base + i))
            s.settimeout(args.timeout)
            s.connect((args.addr, args.port))
            msg = f"ping {i}".encode()
            s.send(msg)
            data = s.recv(65535)
            if not data.endswith(b" " + msg):
                failures.append(f"#{i}: reply {data!r} does not echo {msg!r}")
            else:
                replies.append(data.decode())
                last = time.time()
        except OSError as e:
            failures.append(f"#{i}: {e}")
        finally:
            s.close()
    print(json.dumps({"ok": len(replies), "replies": replies, "failures": failures, "last_reply_at": last}))
    return 0 if not failures else 1


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--name", required=True)
    s.add_argument("--log", required=True)
    s.add_argument("--ready")
    s.add_argument("--http", action="append", default=[])
    s.add_argument("--udp", action="append", default=[])
    c = sub.add_parser("curl")
    c.add_argument("url")
    c.add_argument("--count", type=int, required=True)
    c.add_argument("--parallel", type=int, default=4)
    c.add_argument("--max-time", type=int, default=5)
    c.add_argument("--post-bytes", type=int, default=0)
    d = sub.add_parser("decap")
    d.add_argument("--tun", required=True)
    d.add_argument("--log", required=True)
    d.add_argument("--ready", required=True)
    u = sub.add_parser("udp")
    u.add_argument("addr")
    u.add_argument("port", type=int)
    u.add_argument("--count", type=int, required=True)
    u.add_argument("--sport-base", type=int, default=0)
    u.add_argument("--timeout", type=float, default=2.0)
    args = p.parse_args()
    return {"serve": cmd_serve, "curl": cmd_curl, "udp": cmd_udp, "decap": cmd_decap}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
