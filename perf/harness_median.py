#!/usr/bin/env python3
"""Medians over repeated harness runs.

    perf/harness_median.py RUN1.json RUN2.json ...

Each argument is the `--json` file of one `sluice-gen bench` run (for example
`sudo perf/run.sh --json /tmp/run1.json`, three times). Prints a markdown table with,
per Sluice scenario, the median over the runs of its cycles per packet, of its ratio to
its own run's testpmd 5tswap median (`ratio_to_testpmd`), and of its new sessions per
second, each with the range over the runs; and the testpmd 5tswap medians of the runs.
Rows that failed in a run are left out of that run and counted. SYN flood rows
(`nat-SIZE-synflood[-noproxy]`) get a second table: SYN-ACKs per second (over the window
and before the table filled), live sessions at the end, the collapse time and drops.
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
    flood_table(runs)
    return 0


def collapse(per_100ms):
    """Start (s) of the run of 100 ms slots, to the end and two at least, each below a
    tenth of the best slot; None without one (the rule of bench.rs's collapse_s)."""
    if not per_100ms:
        return None
    best = max(per_100ms)
    low = 0
    for n in reversed(per_100ms):
        if n * 10 >= best:
            break
        low += 1
    return (len(per_100ms) - low) / 10 if low >= 2 else None


def flood_table(runs):
    order, rows = [], {}
    testpmd_pps = []
    for run in runs:
        pps = [r["gen_mpps"] * 1e6 for r in run if r["name"] == "testpmd-5tswap" and r["ok"]]
        run_pps = statistics.median(pps) if pps else None
        if run_pps:
            testpmd_pps.append(run_pps)
        for r in run:
            if r["dut"] != "sluice" or r.get("workload") != "synflood":
                continue
            name = r["name"]
            if name not in rows:
                order.append(name)
                rows[name] = {"rate": [], "before": [], "ratio": [], "live": [], "collapse": [], "reclaimed": [],
                              "of_testpmd": [],
                              "drops": [], "failed": 0, "stolen": []}
            row = rows[name]
            if not r["ok"]:
                row["failed"] += 1
                continue
            row["rate"].append(r["flood_syn_acks_per_s"])
            if run_pps:
                row["of_testpmd"].append(r["flood_syn_acks_per_s"] / run_pps)
            series = r.get("flood_syn_acks_per_100ms") or []
            at = collapse(series)
            if at is None:
                row["before"].append(r["flood_syn_acks_per_s"])
            elif at > 0:
                row["before"].append(sum(series[:round(at * 10)]) / at)
            if r.get("ratio_to_testpmd") is not None:
                row["ratio"].append(r["ratio_to_testpmd"])
            row["live"].append(r["live_sessions"])
            if r.get("half_open_reclaimed") is not None:
                row["reclaimed"].append(r["half_open_reclaimed"])
            row["collapse"].append("none" if at is None else f"{at:.1f}")
            row["drops"].append(r.get("dut_drop_reasons") or {})
            row["stolen"].append(max(r.get("dut_stolen_percent") or 0, r.get("gen_stolen_percent") or 0))
    if not order:
        return
    print()
    print("testpmd 5tswap packets reflected per second, median per run: "
          + ", ".join(f"{p:.0f}" for p in testpmd_pps))
    print()
    print("| SYN flood scenario | runs | SYN-ACKs/s | SYN-ACKs/s before collapse | SYN-ACKs/s over "
          "testpmd 5tswap pkts/s (run's median) | x testpmd 5tswap cycles/pkt "
          "(run's median) | live sessions at end | half-open reclaimed | collapse at s, per run | "
          "CPU stolen %, per run |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|---|")
    for name in order:
        r = rows[name]
        note = f" ({r['failed']} failed)" if r["failed"] else ""
        print(f"| {name} | {len(r['rate'])}{note} | {fmt(r['rate'], 0)} | {fmt(r['before'], 0)} | "
              f"{fmt(r['of_testpmd'], 2)} | {fmt(r['ratio'], 2)} | {fmt(r['live'], 0)} | {fmt(r['reclaimed'], 0)} | "
              f"{', '.join(r['collapse'])} | "
              f"{', '.join(f'{s:.0f}' for s in r['stolen'])} |")
    for name in order:
        for i, d in enumerate(rows[name]["drops"]):
            if d:
                print(f"- {name}, run {i + 1}: DUT drops {d}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
