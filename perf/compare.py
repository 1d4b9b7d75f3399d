#!/usr/bin/env python3
"""Runs nat_rewrite benchmark binaries in alternation and prints medians and ranges.

Usage: perf/compare.py RUNS BIN[,BIN...] SESSIONS PACKETS MODE

Each BIN is a nat_rewrite binary (`cargo bench --bench nat_rewrite --no-run` prints
its path; copy it aside to keep one per code state). The binaries run one after the
other, RUNS rounds, so a noisy machine disturbs them alike; each figure is reported
as the median of its runs with the range. Needs root (DPDK).
"""
import os
import re
import statistics
import subprocess
import sys

FIGURES = {
    "established": r"cycles/packet, established[^|]*\|\s*([\d.]+)",
    "new session": r"cycles/new session[^|]*\|\s*([\d.]+)",
    "establishing ACK": r"cycles/establishing ACK[^|]*\|\s*([\d.]+)",
    "bytes/session": r"bytes per session[^|]*\|\s*([\d.]+)",
}


def main():
    if len(sys.argv) != 6:
        sys.exit(__doc__)
    runs = int(sys.argv[1])
    bins = sys.argv[2].split(",")
    args = sys.argv[3:]
    got = {b: {k: [] for k in FIGURES} for b in bins}
    for r in range(runs):
        for b in bins:
            out = subprocess.run([b] + args, capture_output=True, text=True, check=True).stdout
            for name, pattern in FIGURES.items():
                m = re.search(pattern, out)
                if m:
                    got[b][name].append(float(m.group(1)))
            last = {k: v[-1] for k, v in got[b].items() if v}
            print(f"round {r + 1} {os.path.basename(b)}: {last}", flush=True)
    for b in bins:
        parts = [
            f"{k} {statistics.median(v):.0f} [{min(v):.0f}-{max(v):.0f}]"
            for k, v in got[b].items()
            if v
        ]
        print(f"{os.path.basename(b)} (n={runs}): " + ", ".join(parts))


if __name__ == "__main__":
    main()
