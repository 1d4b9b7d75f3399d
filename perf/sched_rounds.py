#!/usr/bin/env python3
"""Runs sched benchmark binaries in alternation and prints medians and ranges.

Usage: perf/sched_rounds.py ROUNDS PICKS BIN[,BIN...] [SCHEDULER...]

Each BIN is a sched binary (`cargo bench --bench sched --no-run` prints its path;
copy it aside to keep one per code state). The binaries run one after the other,
ROUNDS rounds, so a noisy machine disturbs them alike. For each binary, prints its
table with every cell as `median (min-max)` of its rounds, in ns per pick. SCHEDULER
names, if any, are passed on to the binaries (only those rows).
"""
import os
import re
import statistics
import subprocess
import sys

ROW = re.compile(r"^\|\s*([^|]+?)\s*\|((?:\s*[\d.]+\s*\|)+)\s*$")
HEADER = re.compile(r"^\|\s*scheduler\s*\|")


def run(binary, picks, only):
    out = subprocess.run([binary, str(picks)] + only, capture_output=True, text=True,
                         check=True).stdout
    header, rows = None, {}
    for line in out.splitlines():
        if HEADER.match(line):
            header = [c.strip() for c in line.strip().strip("|").split("|")]
            continue
        m = ROW.match(line)
        if m:
            rows[m.group(1)] = [float(c) for c in m.group(2).strip().strip("|").split("|")]
    return header, rows


def main():
    if len(sys.argv) < 4:
        sys.exit(__doc__)
    only = sys.argv[4:]
    rounds, picks = int(sys.argv[1]), int(sys.argv[2])
    bins = sys.argv[3].split(",")
    got = {b: {} for b in bins}
    headers = {}
    for r in range(rounds):
        for b in bins:
            header, rows = run(b, picks, only)
            headers[b] = header
            for name, cells in rows.items():
                got[b].setdefault(name, []).append(cells)
            print(f"round {r + 1} {os.path.basename(b)} done", file=sys.stderr, flush=True)
    for b in bins:
        print(f"\n{os.path.basename(b)}: ns per pick, median (min-max) of {rounds} runs, "
              f"{picks} picks per cell\n")
        print("| " + " | ".join(headers[b]) + " |")
        print("|---" + "|---:" * (len(headers[b]) - 1) + "|")
        for name, runs in got[b].items():
            cells = []
            for column in zip(*runs):
                cells.append(f"{statistics.median(column):.1f} ({min(column):.1f}-{max(column):.1f})")
            print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
