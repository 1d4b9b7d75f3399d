#!/usr/bin/env python3
"""Medians over repeated harness runs.

    perf/harness_median.py RUN1.json RUN2.json ...

Each argument is the `--json` file of one `sluice-gen bench` run (for example
`sudo perf/run.sh --json /tmp/run1.json`, three times). Prints a markdown table with,
per Sluice scenario, the median over the runs of its cycles per packet, of its ratio to
its own run's testpmd 5tswap median (`ratio_to_testpmd`), and of its new sessions per
second, each with the range over the runs; and the testpmd 5tswap medians of the runs.
Rows that failed in a run are left out of that run and counted.
"""
import json
import statistics
import sys


def fmt(values, digits):
    if not values:
        return "-"
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:.{digits}f}"
    return f"{med:.{digits}f} [{min(values):.{digits}f}-{max(values):.{digits}f}]"


def main(paths):
    if not paths:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    runs = [json.load(open(p)) for p in paths]
    order, rows, failed = [], {}, {}
    testpmd = []
    for run in runs:
        medians = {r["testpmd_median_cycles"] for r in run if r.get("testpmd_median_cycles")}
        testpmd.extend(medians)
        for r in run:
            if r["dut"] != "sluice":
                continue
            name = r["name"]
            if name not in rows:
                order.append(name)
                rows[name] = {"cycles": [], "ratio": [], "sessions": []}
            if not r["ok"] or r.get("ratio_to_testpmd") is None:
                failed[name] = failed.get(name, 0) + 1
                continue
            rows[name]["cycles"].append(r["cycles_per_packet"])
            rows[name]["ratio"].append(r["ratio_to_testpmd"])
            if r.get("new_sessions_per_s_per_worker"):
                rows[name]["sessions"].append(r["new_sessions_per_s_per_worker"])
    print(f"{len(runs)} runs; testpmd 5tswap median cycles/packet per run: "
          + ", ".join(f"{t:.1f}" for t in testpmd))
    print()
    print("| scenario | runs | cycles/pkt | x testpmd 5tswap (run's median) | new sessions/s per worker |")
    print("|---|---:|---:|---:|---:|")
    for name in order:
        r = rows[name]
        note = f" ({failed[name]} failed)" if name in failed else ""
        print(f"| {name} | {len(r['ratio'])}{note} | {fmt(r['cycles'], 1)} | {fmt(r['ratio'], 2)} | "
              f"{fmt(r['sessions'], 0)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
