#!/usr/bin/env python3
"""Times changes to a loopback daemon holding a large table: a line-by-line `-R` with
a refused line, and single `-a` changes, each with what the daemon measured of it.

    sudo perf/change_scale.py BIN_DIR SERVICES PER SCHEDULER RESTORE_LINES CHANGES [RELOADS [SCRAPES [STALLED]]]

BIN_DIR holds `sluice` and `sluicectl` (e.g. ./target/release). The table is
`perf/config_scale.py`'s: SERVICES TCP services on 10.0.0.1:80, 10.0.0.2:80, ... with
PER NAT real servers each. Then:

- `sluicectl -R` of RESTORE_LINES lines: the first names a service that does not
  exist (refused), the others add a real server (a new port of an address the table
  already has) to the services in turn. Printed: seconds from `sluicectl` start to
  exit, and the snapshots the daemon published for it (`status`:
  `snapshot_adoption.publishes`).
- CHANGES single `-a` to the first service, each timed the same way, with the
  daemon's own figure for it: the time from the publish to the slowest worker's
  adoption of the snapshot (`snapshot_adoption.last_ns`), which includes the worker's
  rebuild of its schedulers; the worker forwards nothing meanwhile. And the CPU time
  the daemon's management thread (which handles the request and builds the snapshot)
  spent from `sluicectl` start to exit (`/proc/PID/task/PID/schedstat`); it includes
  whatever else the thread did meanwhile (its 5 ms tick, a once-a-second statistics
  print), so read medians.
- RELOADS (default 0) `sluicectl reload`s of the config file, each with the first real
  server's weight edited (so each publishes a snapshot), timed the same way: seconds,
  and the management thread's CPU time, which is the file's parse and check, the diff
  against the running table, and the snapshot (the `-a` changes above are undone by
  the first). Also timed: a `sluicectl status` sent 100 ms into each reload, from
  its start to its answer (the management loop answers it between its other work).
- SCRAPES (default 0) Prometheus scrapes of the daemon's metrics endpoint (on
  127.0.0.1, a free port), then as many `sluicectl -L -n` listings, each timed the
  same way: seconds, bytes, and the management thread's CPU time (what the loop spent
  gathering the reports, and writing them out where it does). Also timed: a
  `sluicectl status` sent 100 ms into each scrape, and the same status alone. After
  each listing, the daemon's resident memory (`VmRSS`): what the allocator kept.
- STALLED (default 0, needs SCRAPES) clients of the metrics endpoint that send their
  request and read nothing, one every 0.7 s, two from each of 127.0.0.2, .3, ... (the
  endpoint serves two at once from one address, eight in all). Printed: the daemon's
  resident memory (`VmRSS`, sampled every 50 ms) before the first and at its peak until
  10 s after the last (the endpoint cuts a client off 8 s after it connects at most),
  the difference, and the management thread's CPU time meanwhile (the reports it
  gathered).
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time

bin_dir, services, per, scheduler, lines, changes = sys.argv[1:7]
services, per, lines, changes = int(services), int(per), int(lines), int(changes)
reloads = int(sys.argv[7]) if len(sys.argv) > 7 else 0
scrapes = int(sys.argv[8]) if len(sys.argv) > 8 else 0
stalled = int(sys.argv[9]) if len(sys.argv) > 9 else 0
if stalled and not scrapes:
    sys.exit("STALLED needs SCRAPES (the metrics endpoint is configured for scrapes)")
if stalled > 8:
    sys.exit("STALLED is at most 8 (the endpoint closes more unanswered)")
here = os.path.dirname(os.path.abspath(__file__))
work = tempfile.mkdtemp(prefix="change-scale-")
config = os.path.join(work, "sluice.toml")
socket = os.path.join(work, "sluice.sock")
subprocess.run(
    [sys.executable, os.path.join(here, "config_scale.py"), config, str(services), str(per), scheduler],
    check=True,
    stdout=subprocess.DEVNULL,
)
with open(config) as f:
    text = f.read()
text = text.replace("/run/sluice/config-scale.sock", socket)
text = text.replace('file_prefix = "config-scale"', f'file_prefix = "cs-{os.getpid()}"')
if scrapes:
    import socket as sockets

    with sockets.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        metrics_port = probe.getsockname()[1]
    text = text.replace("[control]\n", f'[control]\nmetrics = "127.0.0.1:{metrics_port}"\n', 1)
with open(config, "w") as f:
    f.write(text)
ctl = [os.path.join(bin_dir, "sluicectl"), "--socket", socket, "--timeout", "120"]
log = open(os.path.join(work, "sluice.log"), "w")
daemon = subprocess.Popen([os.path.join(bin_dir, "sluice"), "--config", config], stdout=log, stderr=log)


def management_cpu_ns():
    """CPU time of the daemon's management thread (its main thread) so far, in ns."""
    with open(f"/proc/{daemon.pid}/task/{daemon.pid}/schedstat") as f:
        return int(f.read().split()[0])


def resident_kb():
    """The daemon's resident memory (`VmRSS`), in KiB."""
    with open(f"/proc/{daemon.pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def status():
    out = subprocess.run(ctl + ["status", "--json"], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)["snapshot_adoption"]


try:
    deadline = time.time() + 120
    while True:
        if daemon.poll() is not None:
            sys.exit(f"the daemon exited: see {log.name}")
        if os.path.exists(socket) and subprocess.run(ctl + ["status"], capture_output=True).returncode == 0:
            break
        if time.time() > deadline:
            sys.exit("the daemon did not start within 120 s")
        time.sleep(0.2)
    restore = ["-a -t 10.255.255.254:80 -r 198.18.1.0:8080 -m"]
    for i in range(lines - 1):
        service = 1 + i % services
        first_rs = (service - 1) * per
        rs = f"198.18.{1 + first_rs // 256}.{first_rs % 256}"
        restore.append(f"-a -t 10.0.{(service >> 8) & 255}.{service & 255}:80 -r {rs}:{9000 + i // services} -m")
    before = status()["publishes"]
    started = time.monotonic()
    out = subprocess.run(ctl + ["-R"], input="\n".join(restore) + "\n", capture_output=True, text=True)
    took = time.monotonic() - started
    published = status()["publishes"] - before
    summary = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else ""
    print(f"restore of {lines} lines: {took:.2f} s, {published} snapshot(s); {summary}")
    for i in range(changes):
        cpu = management_cpu_ns()
        started = time.monotonic()
        subprocess.run(
            ctl + ["-a", "-t", "10.0.0.1:80", "-r", f"198.18.1.0:{20000 + i}", "-m"],
            check=True,
            capture_output=True,
        )
        took = time.monotonic() - started
        cpu = (management_cpu_ns() - cpu) / 1e6
        last = status()["last_ns"]
        adopted = f"{last / 1e6:.2f} ms" if last is not None else "late"
        print(f"-a {i + 1}: {took:.3f} s, adoption {adopted}, management thread {cpu:.1f} ms")
    for i in range(reloads):
        with open(config, "w") as f:
            f.write(text.replace('  mode = "nat"\n', f'  mode = "nat"\n  weight = {2 + i}\n', 1))
        before = status()["publishes"]
        cpu = management_cpu_ns()
        started = time.monotonic()
        reload = subprocess.Popen(ctl + ["reload"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # Another command 100 ms into the reload: how long the management loop keeps
        # it waiting.
        time.sleep(0.1)
        asked = time.monotonic()
        subprocess.run(ctl + ["status"], check=True, capture_output=True)
        waited = time.monotonic() - asked
        if reload.wait() != 0:
            sys.exit("the reload failed")
        took = time.monotonic() - started
        cpu = (management_cpu_ns() - cpu) / 1e6
        published = status()["publishes"] - before
        print(
            f"reload {i + 1}: {took:.3f} s, {published} snapshot(s), management thread {cpu:.1f} ms;"
            f" a status 100 ms in answered in {waited:.3f} s"
        )
    if scrapes:
        # The same status with nothing else going on, to compare with.
        alone = []
        for _ in range(scrapes):
            time.sleep(0.2)
            asked = time.monotonic()
            subprocess.run(ctl + ["status"], check=True, capture_output=True)
            alone.append(time.monotonic() - asked)
        print("a status alone answered in " + ", ".join(f"{t:.3f}" for t in alone) + " s")
    for i in range(scrapes):
        import urllib.request

        cpu = management_cpu_ns()
        started = time.monotonic()
        # A status 100 ms in, while the text is being written on the endpoint's thread
        # (which shares the management core): how long the loop keeps it waiting.
        status_took = []

        def status_100ms_in():
            time.sleep(0.1)
            asked = time.monotonic()
            subprocess.run(ctl + ["status"], check=True, capture_output=True)
            status_took.append(time.monotonic() - asked)

        status_during = threading.Thread(target=status_100ms_in)
        status_during.start()
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=60) as answer:
            size = len(answer.read())
        took = time.monotonic() - started
        cpu = (management_cpu_ns() - cpu) / 1e6
        status_during.join()
        if not status_took:
            sys.exit("the status during a scrape failed")
        waited = status_took[0]
        print(
            f"scrape {i + 1}: {took:.3f} s, {size} bytes, management thread {cpu:.1f} ms;"
            f" a status 100 ms in answered in {waited:.3f} s"
        )
    for i in range(scrapes):
        cpu = management_cpu_ns()
        started = time.monotonic()
        out = subprocess.run(ctl + ["-L", "-n"], check=True, capture_output=True)
        took = time.monotonic() - started
        cpu = (management_cpu_ns() - cpu) / 1e6
        print(
            f"-L -n {i + 1}: {took:.3f} s, {len(out.stdout)} bytes, management thread {cpu:.1f} ms;"
            f" daemon VmRSS after {resident_kb() / 1024:.1f} MiB"
        )
    if stalled:
        import socket as sockets

        time.sleep(10)  # the scrapes above are cut off or done
        base = peak = resident_kb()
        cpu = management_cpu_ns()
        clients = []
        next_at = time.monotonic()
        until = next_at + 0.7 * (stalled - 1) + 10
        while time.monotonic() < until:
            if len(clients) < stalled and time.monotonic() >= next_at:
                client = sockets.socket()
                client.setsockopt(sockets.SOL_SOCKET, sockets.SO_RCVBUF, 4096)
                client.bind((f"127.0.0.{2 + len(clients) // 2}", 0))
                client.connect(("127.0.0.1", metrics_port))
                client.sendall(b"GET /metrics HTTP/1.1\r\n\r\n")
                clients.append(client)
                next_at += 0.7
            peak = max(peak, resident_kb())
            time.sleep(0.05)
        cpu = (management_cpu_ns() - cpu) / 1e6
        for client in clients:
            client.close()
        print(
            f"{stalled} stalled clients: VmRSS {base / 1024:.1f} MiB before, peak {peak / 1024:.1f} MiB,"
            f" +{(peak - base) / 1024:.1f} MiB; management thread {cpu:.1f} ms"
        )
finally:
    daemon.send_signal(signal.SIGTERM)
    try:
        daemon.wait(timeout=30)
    except subprocess.TimeoutExpired:
        daemon.kill()
