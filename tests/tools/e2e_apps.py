#!/usr/bin/python3
"""Small network programs for Sluice's end-to-end forwarding tests, run inside the test
bed's namespaces (`ip netns exec NS /usr/bin/python3 e2e_apps.py ...`).

    e2e_apps.py serve --name NAME --log FILE --ready FILE [--http ADDR:PORT]... [--udp ADDR:PORT]...
                      [--echo ADDR:PORT]... [--health-path PATH [--health-status-file SFILE]]
        A real server. HTTP on each --http address: every GET is answered with
        "NAME\\n", every POST with "NAME BYTES_RECEIVED\\n" (HTTP/1.0, connection
        closed), and logged as
        "http CLIENT_IP CLIENT_PORT LOCAL_IP:LOCAL_PORT". UDP echo on each --udp
        address: each datagram is answered with b"NAME " + the datagram, from the
        address it was sent to (bind to the VIP for direct routing), and logged as
        "udp CLIENT_IP CLIENT_PORT LOCAL_IP:LOCAL_PORT". The log is flushed per line.
        Line echo on each --echo address (TCP, keep-alive): every line received is
        answered with "NAME LINE\\n" on the same connection until the client closes;
        each accepted connection is logged as "echo CLIENT_IP CLIENT_PORT
        LOCAL_IP:LOCAL_PORT". FILE given with --ready is created once every socket is
        bound. Runs until SIGTERM/SIGINT.
        --health-path PATH [--health-status-file SFILE]: a GET of PATH on an --http
        address is a health check: answered "NAME health STATUS\n" with the status read
        from SFILE at each request (an integer; 200 when SFILE is not given, missing or
        unreadable), logged as "health CLIENT_IP CLIENT_PORT LOCAL_IP:LOCAL_PORT" (not
        "http"), so a server can fail its HTTP check while its port stays open.

    e2e_apps.py decap --tun DEV --log FILE --ready FILE [--v6]
        A user-space IP-in-IP (RFC 2003) decapsulator for a real server whose kernel
        has no ipip module: creates the TUN device DEV (up, rp_filter off), receives
        every IPv4 protocol-4 packet addressed to this namespace on a raw socket, and
        writes the inner packet to DEV, where the kernel receives it as if it had
        arrived there (the VIP is on lo). Logs "ipip OUTER_SRC INNER_SRC INNER_DST LEN"
        per packet. With --v6, IPv6-in-IPv6 (RFC 2473, next header 41; no ip6_tunnel
        module either): IPv6 turned on for DEV, logged as "ip6ip6 ...". Runs until
        SIGTERM/SIGINT.

    e2e_apps.py curl URL --count N [--parallel P] [--max-time S] [--post-bytes B]
        N requests with curl (a new connection each: one curl process per request,
        --noproxy '*', bounded by --max-time), P at a time; GET, or a POST of B bytes
        (answered with "NAME B"). Prints one JSON object:
        {"ok": N_OK, "bodies": {BODY: COUNT}, "failures": ["...", ...],
         "seconds": ELAPSED}. Exit 0 when every request succeeded.

    e2e_apps.py udp ADDR PORT --count N [--sport-base P] [--timeout S] [--ttl T] [--burst]
        N UDP exchanges, each from a new socket (source port P+i when --sport-base is
        given, an ephemeral one otherwise; IP TTL T with --ttl): send b"ping I", wait
        for one reply. With --burst, one socket sends the N datagrams back to back,
        then takes the replies until none came for --timeout.
        Prints one JSON object: {"ok": N_OK, "replies": ["...", ...], "failures": [...],
        "last_reply_at": UNIX_TIME}. Exit 0 when every exchange got its reply.

    e2e_apps.py too-big ADDR PORT --source SRC --mtu M [--sport P] [--timeout S]
        Two UDP exchanges of 1400-byte datagrams with ADDR:PORT from SRC:P (default
        40123) around an ICMP error about the first echo, as a router on the client's
        path would send it: a frag-needed (IPv4) or Packet Too Big (IPv6) announcing
        M, quoting ADDR:PORT -> SRC:P, sent to ADDR through the kernel's routing (raw
        socket). Prints {"first": LEN, "second": LEN}: each echo's length, 0 when it
        never came, -1 when it was not the echo.

    e2e_apps.py stream ADDR PORT [--long N] [--interval-ms MS] [--new-per-s R]
                      [--duration S] [--timeout S] --out FILE [--ready FILE] [--stop FILE]
                      [--source IP] [--pool N]
        Traffic against line-echo servers (serve --echo), for hot changes under load.
        N long-lived connections, each sending "L<i> <seq>" every MS milliseconds and
        checking every answer: the echo of that line, always from the same server.
        Meanwhile R new short connections a second (each: connect, one "N<j>" line,
        its answer, close), each recorded with wall-clock (time.time()) stamps: t_start
        before connect, t_connected when connect returned (null if it never did), t_end
        after the close or the failure, and the server that answered or the failure.
        FILE given with --ready is created once every long connection got its first
        answer (or failed). Stops after S seconds or as soon as the --stop file exists,
        whichever comes first; every socket operation is bounded by --timeout. Every
        connection comes from --source when given; at most --pool (default 32) new
        connections are under way at once. Writes
        one JSON object to --out (atomically) and prints it:
        {"long": [{"server", "sent", "ok", "failures": [...], "max_gap_s",
                   "max_gap_end", "last_answer", "t_failed", "gaps"}],
         "new": [{"t_start", "t_connected", "t_end", "server", "error"}],
         "seconds": ELAPSED}. Exit 0 when nothing failed. Per long connection,
        max_gap_s is the largest time between two consecutive answers (0.0 until it
        had two), max_gap_end the wall time of the answer that ended that gap (null
        until then), last_answer the wall time of the last answer and t_failed that of
        the failure that ended it (null if none): a failover's interruption, measured.
        gaps lists every gap longer than two intervals as [wall time of the answer
        before it, wall time of the answer that ended it].

    e2e_apps.py abort ADDR PORT --watch NS --watch-port P [--watch NS]... [--timeout S] [--again]
        A connection reset before the real server finished its handshake: connects to
        ADDR:PORT, waits (at most S seconds) until one of the --watch namespaces holds a
        half-open connection on local port P (`ss state syn-recv`), then closes with
        SO_LINGER 0 (the kernel sends an RST) and waits (at most S seconds) until no
        --watch namespace holds one. Prints one JSON object: {"connected": bool,
        "half_open_before": N, "half_open_after": N, "cleared_after_s": SECONDS or
        null}. With --again, the same again from the same local address and port
        (a client reusing its port), both records in a list. Exit 0 when every
        half-open connection appeared and went.

    e2e_apps.py ask ADDR PORT --source IP [--source IP]... [--rounds R] [--timeout S]
                    [--ttl T]
        Which line-echo server (serve --echo) answers each client address: R rounds
        (default 1); in each, for every --source in the order given, one connection
        from that address (bound to IP, an ephemeral port), one line "A<round> IP",
        its answer (checked to be the echo), close. At most 1000 connections, every
        socket operation bounded by --timeout; --ttl sets the connections' IP TTL
        (IP_TTL, from the SYN on). Prints one JSON object:
        {"answers": [{"source", "round", "server", "error"}], "seconds": ELAPSED}
        (server null and error set on a failure). Exit 0 when every one was answered.
"""

import argparse
import http.server
import json
import os
import signal
import socket
import socketserver
import struct
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor


def addr_port(s):
    """ADDR:PORT, or [IPV6]:PORT."""
    host, _, port = s.rpartition(":")
    return host.strip("[]"), int(port)


def is_v6(listen):
    return ":" in addr_port(listen)[0]


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
            if self.path.startswith("/bytes/") and self.path[7:].isdigit():
                # N bytes of a fixed pattern, for transfers checked by digest.
                n = min(int(self.path[7:]), 64 << 20)
                self.answer(bytes((i * 7) & 0xFF for i in range(n)))
                return
            if args.health_path and self.path == args.health_path:
                status = health_status()
                self.answer(f"{name} health {status}\n".encode(), status, "health")
                return
            self.answer(body)

        def do_POST(self):  # noqa: N802
            length = int(self.headers.get("Content-Length", "0"))
            got = len(self.rfile.read(length)) if length else 0
            self.answer(f"{name} {got}\n".encode())

        def answer(self, text, status=200, kind="http"):
            client_ip, client_port = self.client_address[:2]
            local = self.connection.getsockname()
            log.line(f"{kind} {client_ip} {client_port} {local[0]}:{local[1]}")
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(text)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(text)

        def log_message(self, *a):
            pass

    def health_status():
        if not args.health_status_file:
            return 200
        try:
            with open(args.health_status_file) as f:
                return int(f.read().strip())
        except (OSError, ValueError):
            return 200

    class Server(http.server.ThreadingHTTPServer):
        allow_reuse_address = True
        daemon_threads = True
        request_queue_size = 128

    class EchoHandler(socketserver.StreamRequestHandler):
        def handle(self):
            client_ip, client_port = self.client_address[:2]
            local = self.connection.getsockname()
            log.line(f"echo {client_ip} {client_port} {local[0]}:{local[1]}")
            try:
                for line in self.rfile:
                    self.wfile.write(name.encode() + b" " + line.rstrip(b"\r\n") + b"\n")
                    self.wfile.flush()
            except OSError:
                pass  # the client's problem: it records the failure

    class EchoServer(socketserver.ThreadingTCPServer):
        allow_reuse_address = True
        daemon_threads = True
        request_queue_size = 128

    class Server6(Server):
        address_family = socket.AF_INET6

    class EchoServer6(EchoServer):
        address_family = socket.AF_INET6

    servers = [(Server6 if is_v6(a) else Server)(addr_port(a), Handler) for a in args.http]
    servers += [(EchoServer6 if is_v6(a) else EchoServer)(addr_port(a), EchoHandler) for a in args.echo]
    udp_socks = []
    for a in args.udp:
        s = socket.socket(socket.AF_INET6 if is_v6(a) else socket.AF_INET, socket.SOCK_DGRAM)
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
    print(f"{name}: serving http {args.http} udp {args.udp} echo {args.echo}", flush=True)
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
    log = Log(args.log)
    if args.v6:
        # IPv6 on the device, so the kernel takes the inner IPv6 packets written to it.
        for conf in ("all", args.tun):
            with open(f"/proc/sys/net/ipv6/conf/{conf}/disable_ipv6", "w") as f:
                f.write("0")
        # A raw IPv6 socket gets the payload only: the inner packet, whole.
        raw = socket.socket(socket.AF_INET6, socket.SOCK_RAW, 41)  # IPPROTO_IPV6
    else:
        raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, 4)  # IPPROTO_IPIP

    def ntop6(b):
        return socket.inet_ntop(socket.AF_INET6, b)

    def loop():
        while True:
            if args.v6:
                inner, peer = raw.recvfrom(65535)
                if len(inner) < 40 or inner[0] >> 4 != 6:
                    continue
                os.write(tun, inner)
                log.line(f"ip6ip6 {peer[0]} {ntop6(inner[8:24])} {ntop6(inner[24:40])} {len(inner)}")
                continue
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
        cmd = ["curl", "-sS", "--globoff", "--noproxy", "*", "--max-time", str(args.max_time), "-o", "-",
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
    if args.burst:
        return udp_burst(args)
    replies, failures = [], []
    last = None
    for i in range(args.count):
        s = socket.socket(socket.AF_INET6 if ":" in args.addr else socket.AF_INET, socket.SOCK_DGRAM)
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if args.ttl is not None:
                s.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, args.ttl)
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


def udp_burst(args):
    """`udp --burst`: the N datagrams back to back from one socket, then the echoes
    until --timeout passes without one."""
    s = socket.socket(socket.AF_INET6 if ":" in args.addr else socket.AF_INET, socket.SOCK_DGRAM)
    if args.ttl is not None:
        s.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, args.ttl)
    s.connect((args.addr, args.port))
    sent = [f"ping {i}".encode() for i in range(args.count)]
    for msg in sent:
        s.send(msg)
    s.settimeout(args.timeout)
    echoed, last = set(), None
    while True:
        try:
            data = s.recv(65535)
        except socket.timeout:
            break
        _, _, msg = data.partition(b" ")
        echoed.add(msg)
        last = time.time()
    s.close()
    replies = sorted(m.decode() for m in echoed if m in set(sent))
    failures = [m.decode() for m in sent if m not in echoed]
    print(json.dumps({"ok": len(replies), "replies": replies, "failures": failures, "last_reply_at": last}))
    return 0 if not failures else 1


def cmd_too_big(args):
    from scapy.all import ICMP, IP, UDP, ICMPv6PacketTooBig, IPv6
    v6 = ":" in args.addr
    s = socket.socket(socket.AF_INET6 if v6 else socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((args.source, args.sport))
    s.settimeout(args.timeout)

    def exchange(tag):
        msg = tag + b" " + b"x" * (1400 - len(tag) - 1)
        s.sendto(msg, (args.addr, args.port))
        try:
            data, _ = s.recvfrom(4096)
            return len(data) if data.endswith(msg) else -1
        except socket.timeout:
            return 0

    first = exchange(b"first")
    # The echo as the client got it, ADDR:PORT -> SRC:P (its lengths about right).
    udp = UDP(sport=args.port, dport=args.sport, len=1408)
    if v6:
        quote = bytes(IPv6(src=args.addr, dst=args.source, plen=1408) / udp)[:48]
        error = bytes(ICMPv6PacketTooBig(mtu=args.mtu, cksum=0) / quote)
        raw = socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6)
    else:
        quote = bytes(IP(src=args.addr, dst=args.source, flags="DF", len=1428) / udp)[:28]
        error = bytes(ICMP(type=3, code=4, nexthopmtu=args.mtu) / quote)
        raw = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    # The kernel fills in the ICMPv6 checksum; scapy computed ICMP's.
    raw.sendto(error, (args.addr, 0))
    time.sleep(0.5)
    second = exchange(b"second")
    print(json.dumps({"first": first, "second": second}))
    return 0


class LineConn:
    """A TCP connection exchanging lines, every operation bounded by `timeout`."""

    def __init__(self, addr, port, timeout, source=None, ttl=None):
        if ttl is None:
            self.sock = socket.create_connection((addr, port), timeout=timeout,
                                                 source_address=(source, 0) if source else None)
        else:
            # Every segment, the SYN included, leaves with this TTL (GTSM senders use 255).
            self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            self.sock.settimeout(timeout)
            self.sock.setsockopt(socket.IPPROTO_IP, socket.IP_TTL, ttl)
            if source:
                self.sock.bind((source, 0))
            try:
                self.sock.connect((addr, port))
            except OSError:
                self.sock.close()
                raise
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.rfile = self.sock.makefile("rb")

    def ask(self, line):
        """Sends `line`, returns (server, None) for a correct echo, else (None, why)."""
        self.sock.sendall(line.encode() + b"\n")
        answer = self.rfile.readline()
        if not answer.endswith(b"\n"):
            return None, f"{line!r}: answer {answer!r} (connection closed?)"
        server, _, echoed = answer.decode(errors="replace").rstrip("\n").partition(" ")
        if echoed != line:
            return None, f"{line!r}: answer {answer!r} is not its echo"
        return server, None

    def close(self):
        self.rfile.close()
        self.sock.close()


def cmd_stream(args):
    start = time.time()
    deadline = start + args.duration
    stop = threading.Event()

    def stopping():
        return stop.is_set() or time.time() >= deadline or (args.stop and os.path.exists(args.stop))

    def long_conn(i, rec, started):
        seq, conn = 0, None
        try:
            conn = LineConn(args.addr, args.port, args.timeout, source=args.source)
            while True:
                line = f"L{i} {seq}"
                seq += 1
                rec["sent"] += 1
                server, err = conn.ask(line)
                if err:
                    rec["failures"].append(err)
                    rec["t_failed"] = time.time()
                    return
                now = time.time()
                if rec["server"] is None:
                    rec["server"] = server
                    started.set()
                elif server != rec["server"]:
                    rec["failures"].append(f"{line!r}: answered by {server}, not {rec['server']}")
                    return
                rec["ok"] += 1
                if rec["last_answer"] is not None and now - rec["last_answer"] > rec["max_gap_s"]:
                    rec["max_gap_s"] = now - rec["last_answer"]
                    rec["max_gap_end"] = now
                if rec["last_answer"] is not None and now - rec["last_answer"] > 2 * args.interval_ms / 1000.0:
                    rec["gaps"].append([rec["last_answer"], now])
                rec["last_answer"] = now
                if stop.wait(args.interval_ms / 1000.0):
                    return
        except OSError as e:
            rec["failures"].append(f"#{seq}: {e!r}")
            rec["t_failed"] = time.time()
        finally:
            started.set()
            if conn:
                conn.close()

    def new_conn(j):
        rec = {"t_start": time.time(), "t_connected": None, "t_end": None, "server": None, "error": None}
        conn = None
        try:
            conn = LineConn(args.addr, args.port, args.timeout, source=args.source)
            rec["t_connected"] = time.time()
            server, err = conn.ask(f"N{j}")
            rec["server"], rec["error"] = server, err
        except OSError as e:
            rec["error"] = repr(e)
        finally:
            if conn:
                conn.close()
            rec["t_end"] = time.time()
        return rec

    # Per long connection, besides the counts: the largest time between two consecutive
    # answers (max_gap_s, 0 until two answers) and the wall time (time.time()) of the
    # answer that ended it (max_gap_end), the wall time of the last answer, and of the
    # failure if one ended the connection (t_failed); every gap longer than two
    # intervals as [wall time of the answer before it, of the answer after it] (gaps).
    longs = [{"server": None, "sent": 0, "ok": 0, "failures": [], "max_gap_s": 0.0,
              "max_gap_end": None, "last_answer": None, "t_failed": None, "gaps": []}
             for _ in range(args.long)]
    started = [threading.Event() for _ in range(args.long)]
    threads = [threading.Thread(target=long_conn, args=(i, longs[i], started[i]), daemon=True)
               for i in range(args.long)]
    for t in threads:
        t.start()
    for e in started:
        e.wait(max(0.0, deadline - time.time()))
    if args.ready:
        write_ready(args.ready)

    futures = []
    with ThreadPoolExecutor(max_workers=args.pool) as pool:
        j, period = 0, 1.0 / args.new_per_s if args.new_per_s > 0 else None
        next_at = time.time()
        while not stopping():
            if period is None:
                time.sleep(0.05)
                continue
            if time.time() >= next_at:
                futures.append(pool.submit(new_conn, j))
                j += 1
                next_at += period
            time.sleep(max(0.0, min(0.05, next_at - time.time())))
        stop.set()
        new = [f.result() for f in futures]
    for t in threads:
        t.join(args.timeout + args.interval_ms / 1000.0 + 1)
        if t.is_alive():
            longs[threads.index(t)]["failures"].append("still running at the end")
    out = {"long": longs, "new": new, "seconds": round(time.time() - start, 3)}
    text = json.dumps(out)
    tmp = args.out + ".tmp"
    with open(tmp, "w") as f:
        f.write(text + "\n")
    os.rename(tmp, args.out)
    print(text)
    failed = any(r["failures"] or r["server"] is None for r in longs) or any(r["error"] for r in new)
    return 1 if failed else 0


def cmd_synflood(args):
    """Spoofed SYNs to ADDR:PORT through a raw socket: `count` of them, sources drawn
    from `net` (a /N), random ports and ISNs, paced over `seconds`. Prints the count
    sent and the time taken as JSON."""
    import ipaddress
    import random
    import struct
    net = ipaddress.ip_network(args.net)
    base, size = int(net.network_address), net.num_addresses
    dst = socket.inet_aton(args.addr)
    rng = random.Random(args.seed)
    sock = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)

    def csum(data):
        total = sum(struct.unpack(f"!{len(data) // 2}H", data))
        while total >> 16:
            total = (total & 0xFFFF) + (total >> 16)
        return ~total & 0xFFFF

    sent, start = 0, time.time()
    per_ms = max(1, args.count // max(1, int(args.seconds * 1000)))
    while sent < args.count:
        for _ in range(min(per_ms, args.count - sent)):
            src = struct.pack("!I", base + rng.randrange(1, size - 1))
            sport, isn = rng.randrange(1024, 65536), rng.getrandbits(32)
            # MSS 1460, SACK permitted, timestamps, NOP, window scale 7: as Linux.
            opts = struct.pack("!BBHBBBBIIBBBB", 2, 4, 1460, 4, 2, 8, 10, isn, 0, 1, 3, 3, 7)
            tcp = struct.pack("!HHIIBBHHH", sport, args.port, isn, 0, (40 // 4) << 4, 0x02,
                              64240, 0, 0) + opts
            pseudo = src + dst + struct.pack("!BBH", 0, 6, len(tcp))
            tcp = tcp[:16] + struct.pack("!H", csum(pseudo + tcp)) + tcp[18:]
            ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 0, 0x4000, 64, 6, 0,
                             src, dst)
            try:
                sock.sendto(ip + tcp, (args.addr, 0))
                sent += 1
            except BlockingIOError:
                time.sleep(0.0005)
            except OSError as e:
                if e.errno != 105:  # ENOBUFS: the qdisc is full, try again
                    raise
                time.sleep(0.0005)
        ahead = start + sent / args.count * args.seconds - time.time()
        if ahead > 0:
            time.sleep(ahead)
    print(json.dumps({"sent": sent, "seconds": round(time.time() - start, 3)}))
    return 0


def half_open(namespaces, port):
    """Half-open (SYN-RECV) connections on local port `port` in `namespaces`."""
    n = 0
    for ns in namespaces:
        out = subprocess.run(["ip", "netns", "exec", ns, "ss", "-Htn", "state", "syn-recv",
                              f"( sport = :{port} )"], capture_output=True, text=True, timeout=10)
        n += sum(1 for line in out.stdout.splitlines() if line.strip())
    return n


def wait_half_open(namespaces, port, want_some, timeout):
    deadline = time.time() + timeout
    while True:
        n = half_open(namespaces, port)
        if (n > 0) == want_some or time.time() >= deadline:
            return n
        time.sleep(0.05)


def abort_once(args, local=None):
    """Connect (from `local` if given), wait for the half-open connection, reset, wait
    for it to go. Returns (record, the local address used)."""
    rec = {"connected": False, "half_open_before": 0, "half_open_after": None, "cleared_after_s": None}
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.settimeout(args.timeout)
    try:
        if local is not None:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(local)
        sock.connect((args.addr, args.port))
    except OSError as e:
        rec["error"] = repr(e)
        sock.close()
        return rec, local
    rec["connected"] = True
    local = sock.getsockname()
    rec["half_open_before"] = wait_half_open(args.watch, args.watch_port, True, args.timeout)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    reset_at = time.time()
    sock.close()
    rec["half_open_after"] = wait_half_open(args.watch, args.watch_port, False, args.timeout)
    if rec["half_open_after"] == 0:
        rec["cleared_after_s"] = round(time.time() - reset_at, 3)
    return rec, local


def cmd_abort(args):
    rec, local = abort_once(args)
    runs = [rec]
    if args.again and rec["connected"]:
        runs.append(abort_once(args, local)[0])
    print(json.dumps(runs if args.again else rec))
    ok = all(r["connected"] and r["half_open_before"] > 0 and r["half_open_after"] == 0 for r in runs)
    return 0 if ok and len(runs) == 1 + int(args.again) else 1


def cmd_ask(args):
    if args.rounds * len(args.source) > 1000:
        print("ask: at most 1000 connections", file=sys.stderr)
        return 2
    start = time.time()
    answers = []
    for r in range(args.rounds):
        for src in args.source:
            rec = {"source": src, "round": r, "server": None, "error": None}
            conn = None
            try:
                conn = LineConn(args.addr, args.port, args.timeout, source=src, ttl=args.ttl)
                rec["server"], rec["error"] = conn.ask(f"A{r} {src}")
            except OSError as e:
                rec["error"] = repr(e)
            finally:
                if conn:
                    conn.close()
            answers.append(rec)
    print(json.dumps({"answers": answers, "seconds": round(time.time() - start, 3)}))
    return 0 if all(a["server"] for a in answers) else 1


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--name", required=True)
    s.add_argument("--log", required=True)
    s.add_argument("--ready")
    s.add_argument("--http", action="append", default=[])
    s.add_argument("--udp", action="append", default=[])
    s.add_argument("--echo", action="append", default=[])
    s.add_argument("--health-path")
    s.add_argument("--health-status-file")
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
    d.add_argument("--v6", action="store_true")
    u = sub.add_parser("udp")
    u.add_argument("addr")
    u.add_argument("port", type=int)
    u.add_argument("--count", type=int, required=True)
    u.add_argument("--sport-base", type=int, default=0)
    u.add_argument("--timeout", type=float, default=2.0)
    u.add_argument("--ttl", type=int)
    u.add_argument("--burst", action="store_true")
    tb = sub.add_parser("too-big")
    tb.add_argument("addr")
    tb.add_argument("port", type=int)
    tb.add_argument("--source", required=True)
    tb.add_argument("--mtu", type=int, required=True)
    tb.add_argument("--sport", type=int, default=40123)
    tb.add_argument("--timeout", type=float, default=2.0)
    st = sub.add_parser("stream")
    st.add_argument("addr")
    st.add_argument("port", type=int)
    st.add_argument("--long", type=int, default=20)
    st.add_argument("--interval-ms", type=int, default=50)
    st.add_argument("--new-per-s", type=float, default=20.0)
    st.add_argument("--duration", type=float, default=30.0)
    st.add_argument("--timeout", type=float, default=5.0)
    st.add_argument("--out", required=True)
    st.add_argument("--ready")
    st.add_argument("--stop")
    st.add_argument("--source")
    st.add_argument("--pool", type=int, default=32)
    f = sub.add_parser("synflood")
    f.add_argument("addr")
    f.add_argument("port", type=int)
    f.add_argument("--count", type=int, required=True)
    f.add_argument("--net", required=True)
    f.add_argument("--seconds", type=float, default=4.0)
    f.add_argument("--seed", type=int, default=1)
    ab = sub.add_parser("abort")
    ab.add_argument("addr")
    ab.add_argument("port", type=int)
    ab.add_argument("--watch", action="append", required=True)
    ab.add_argument("--watch-port", type=int, required=True)
    ab.add_argument("--timeout", type=float, default=3.0)
    ab.add_argument("--again", action="store_true")
    a = sub.add_parser("ask")
    a.add_argument("addr")
    a.add_argument("port", type=int)
    a.add_argument("--source", action="append", required=True)
    a.add_argument("--rounds", type=int, default=1)
    a.add_argument("--timeout", type=float, default=2.0)
    a.add_argument("--ttl", type=int)
    args = p.parse_args()
    return {"serve": cmd_serve, "curl": cmd_curl, "udp": cmd_udp, "decap": cmd_decap,
            "stream": cmd_stream, "ask": cmd_ask, "abort": cmd_abort,
            "synflood": cmd_synflood, "too-big": cmd_too_big}[args.cmd](args)


if __name__ == "__main__":
    sys.exit(main())
