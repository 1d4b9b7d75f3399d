#!/usr/bin/env python3
"""Bulk resync probe: asks a running Sluice for its whole session table, as a standby
starting up would, and checks the dump that comes back.

It plays the peer that `sluice-gen bench --sync` configures (127.0.0.1, the DUT's
listen port + 1, no key: `unauthenticated = true`): binds that address, sends one
resync request (sync format v6, type 2, addressed to the DUT, a fresh epoch) and reads dump chunks (type 3) until the one flagged LAST_CHUNK, or 5 s of
silence. Prints chunks, records, missing chunk numbers and the time from request to
last chunk. Other datagrams (the DUT's ordinary batches) are counted and ignored.

Usage (as root, while a bench scenario runs):
  sudo target/release/sluice-gen bench --scenarios nat-1m-established --sync --duration 40 &
  sleep 15; python3 perf/resync_probe.py PORT   # PORT: [sync] listen of the DUT's config
"""
import socket
import struct
import sys
import time

# magic, version, type, flags, length, count, sender, recipient, dump id, chunk, epoch, sequence
HEADER = ">4sBBHHHIIIIQQ"
HEADER_LEN = struct.calcsize(HEADER)  # 44
LAST_CHUNK = 2
# The sync format's version (src/session/replication.rs, VERSION): a node rejects
# every version but its own. The header's layout has not changed since version 2.
VERSION = 6


def main() -> None:
    port = int(sys.argv[1])
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", port + 1))
    dump_id = 4242
    recipient = struct.unpack(">I", socket.inet_aton("127.0.0.1"))[0]
    # The sender field must be the address the request comes from (the peer's).
    sender = recipient
    epoch = int(time.time() * 1e6)
    request = struct.pack(
        HEADER, b"SLSY", VERSION, 2, 0, HEADER_LEN, 0, sender, recipient, dump_id, 0, epoch, 0
    )
    started = time.time()
    s.sendto(request, ("127.0.0.1", port))
    s.settimeout(5.0)
    chunks = records = expect = missing = other = 0
    last = False
    while not last:
        try:
            d, _ = s.recvfrom(65536)
        except socket.timeout:
            break
        _, _, kind, flags, _, count, _, _, did, chunk, _, _ = struct.unpack(
            HEADER, d[:HEADER_LEN]
        )
        if kind != 3 or did != dump_id:
            other += 1
            continue
        missing += max(0, chunk - expect)
        expect = chunk + 1
        chunks += 1
        records += count
        last = bool(flags & LAST_CHUNK)
    print(
        f"dump: {chunks} chunks, {records} records, {missing} chunks missing, "
        f"last chunk seen: {last}, {time.time() - started:.2f} s; {other} other datagrams"
    )
    sys.exit(0 if last and missing == 0 else 1)


if __name__ == "__main__":
    main()
