#!/usr/bin/env python3
"""Runs nat_rewrite benchmark binaries in alternation and prints medians and ranges.

Usage: perf/compare.py RUNS BIN[,BIN...] SESSIONS PACKETS MODE[,MODE...]

Each BIN is a nat_rewrite binary (`cargo bench --bench nat_rewrite --no-run` prints
its path; copy it aside to keep one per code state); each MODE one of its modes (nat,
fullnat, nat6, fullnat6, nat64), with any of its flags after it in the same argument
("nat --foreign"). Every binary runs in every mode, one after the other,
RUNS rounds, so a noisy machine disturbs them alike; each figure is reported as the
median of its runs with the range. Needs root (DPDK).
"""
import os
import re
import statistics
import subprocess
import sys

FIGURES = {
    "established": r"cycles/packet, established \([^|]*\|\s*([\d.]+)",
    "established, median burst": r"cycles/packet, established, median burst[^|]*\|\s*([\d.]+)",
    "new session": r"cycles/new session[^|]*\|\s*([\d.]+)",
    "multicast source MAC": r"cycles/frame, multicast source MAC[^|]*\|\s*([\d.]+)",
    "another host's MAC": r"cycles/frame, another host's MAC[^|]*\|\s*([\d.]+)",
    "establishing ACK": r"cycles/establishing ACK[^|]*\|\s*([\d.]+)",
    "reply direction, median burst": r"cycles/packet, real servers' established ACKs, median burst[^|]*\|\s*([\d.]+)",
    "expired session": r"cycles/expired session[^|]*\|\s*([\d.]+)",
    "bytes/session": r"bytes per session[^|]*\|\s*([\d.]+)",
}


def main():
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    runs = int(sys.argv[1])
    bins = sys.argv[2].split(",")
    sessions, packets = sys.argv[3:5]
    modes = sys.argv[5].split(",")
    cases = [(b, m) for b in bins for m in modes]
    got = {c: {k: [] for k in FIGURES} for c in cases}

    def name(c):
        return f"{os.path.basename(c[0])} {c[1]}"

    for r in range(runs):
        for c in cases:
            cmd = [c[0], sessions, packets] + c[1].split()
            out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
            for fig, pattern in FIGURES.items():
                m = re.search(pattern, out)
                if m:
                    got[c][fig].append(float(m.group(1)))
            last = {k: v[-1] for k, v in got[c].items() if v}
            print(f"round {r + 1} {name(c)}: {last}", flush=True)
    for c in cases:
        parts = [
            f"{k} {statistics.median(v):.0f} [{min(v):.0f}-{max(v):.0f}]"
            for k, v in got[c].items()
            if v
        ]
        print(f"{name(c)} (n={runs}): " + ", ".join(parts))


if __name__ == "__main__":
    main()
