#!/bin/sh
# Where a harness DUT's forwarding core spends its cycles: its own code against the
# memif driver that moves every packet in and out.
#
#   sudo perf/dut_split.sh SCENARIO [SECONDS] [ROUNDS]
#
# Runs `sluice-gen bench --scenarios SCENARIO --no-brackets --attempts 1` ROUNDS times
# (default 3), with `SLUICE=BIN SLUICECTL=CTL` in the environment against that build
# of Sluice. In each, once the generator reports ready, it samples the DUT's
# forwarding thread (`rte-worker-1`: Sluice's worker, testpmd's forwarding lcore) with
# `perf record -e cpu-clock` for SECONDS (default 10) of the measure window, then
# splits the samples by the shared object they fell in. Each share times the row's own
# DUT cycles/packet gives cycles per packet spent there.
#
# What that assumes: the row's cycles/packet counts only polls that received packets,
# while the samples cover every poll. The thread's idle polls are thereby spread over
# the objects in proportion to its busy ones. The row's busy share (printed) bounds the
# error: at 97% busy the split is within 3% of the total either way.
#
# cpu-clock is a software timer, the one sampling event this VM offers: a sample lands
# up to a few instructions after where the time went, so the split by object is sound
# and a split by instruction is not.
set -eu
scenario=${1:?usage: perf/dut_split.sh SCENARIO [SECONDS] [ROUNDS]}
seconds=${2:-10}
rounds=${3:-3}
gen=${SLUICE_GEN:-target/release/sluice-gen}
if [ -n "${SLUICE:-}" ] && [ -z "${SLUICECTL:-}" ]; then
    echo "SLUICE needs SLUICECTL too (bench takes both)" >&2
    exit 1
fi
command -v perf >/dev/null || { echo "perf not found (Debian: linux-perf)" >&2; exit 1; }
[ -x "$gen" ] || { echo "$gen not found: cargo build --release --bins" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/dut-split.XXXXXX")
bench=
# shellcheck disable=SC2317
cleanup() {
    if [ -n "$bench" ]; then kill "$bench" 2>/dev/null || true; wait "$bench" 2>/dev/null || true; fi
    rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP

fail() {
    echo "round $round: $1" >&2
    [ -s "$work/bench.log" ] && tail -20 "$work/bench.log" >&2
    exit 1
}

# Run in the background: `exec` makes the bench's PID the background job's.
run_bench() {
    if [ -n "${SLUICE:-}" ]; then
        exec "$gen" bench --scenarios "$scenario" --no-brackets --attempts 1 \
            --duration $((seconds + 10)) --sluice "$SLUICE" --sluicectl "$SLUICECTL" \
            --out "$work/out.md"
    else
        exec "$gen" bench --scenarios "$scenario" --no-brackets --attempts 1 \
            --duration $((seconds + 10)) --out "$work/out.md"
    fi
}

printf '| round | DUT cycles/pkt | DUT code | memif | mbuf/mempool | kernel | other | busy %% DUT/gen | c2c ns | new sessions/s |\n'
printf '|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n'
round=1
while [ "$round" -le "$rounds" ]; do
    rm -f "$work/out.md" "$work/perf.data"
    run_bench >"$work/bench.log" 2>&1 &
    bench=$!
    # The DUT is the bench's child with an `rte-worker-1` thread (the generator polls
    # on its main lcore only); the generator's log says @READY when establishing is
    # over. Establishing 10M sessions takes minutes: wait as long as the bench lives.
    tid= exe= ready=
    while kill -0 "$bench" 2>/dev/null; do
        if [ -z "$tid" ]; then
            found=0
            for child in $(pgrep -P "$bench" || true); do
                for t in /proc/"$child"/task/*; do
                    [ "$(cat "$t/comm" 2>/dev/null)" = rte-worker-1 ] || continue
                    tid=${t##*/}
                    exe=$(basename "$(readlink /proc/"$child"/exe)")
                    found=$((found + 1))
                done
            done
            [ "$found" -le 1 ] || fail "$found forwarding threads among the bench's children"
        fi
        if [ -n "$tid" ] && grep -qs '^@READY' "${TMPDIR:-/tmp}"/sluice-bench-"$bench"-*/gen.log; then
            ready=1
            break
        fi
        sleep 0.2
    done
    [ -n "$ready" ] || fail "the DUT never got ready"
    sleep 1
    perf record -q -e cpu-clock -F 2000 -t "$tid" -o "$work/perf.data" -- sleep "$seconds" \
        >"$work/perf.log" 2>&1 || { cat "$work/perf.log" >&2; fail "perf record failed"; }
    status=0
    wait "$bench" || status=$?
    bench=
    [ "$status" -eq 0 ] || fail "the bench failed (exit $status)"
    # The row of the first table whose first column is the scenario, its fields found
    # by that table's header.
    set -- $(awk -F'|' -v s="$scenario" '
        /^\| scenario \|/ {
            split("", col)
            for (i = 1; i <= NF; i++) { h = $i; gsub(/^ +| +$/, "", h); col[h] = i }
        }
        $2 ~ "^ *" s " *$" && col["c2c ns"] {
            c = $col["DUT cycles/pkt"]; x = $col["c2c ns"]; b = $col["busy % DUT/gen"]
            n = $col["new sess/s per worker"]
            gsub(/ /, "", c); gsub(/ /, "", x); gsub(/ /, "", b); gsub(/ /, "", n)
            print c, x, b, n; exit
        }' "$work/out.md")
    [ $# -eq 4 ] || fail "no row for $scenario in the bench's table"
    cycles=$1 c2c=$2 busy=$3 new=$4
    perf report -i "$work/perf.data" --no-children --sort dso --stdio 2>/dev/null |
        awk -v r="$round" -v c="$cycles" -v x="$c2c" -v busy="$busy" -v new="$new" -v exe="$exe" '
            /^ *[0-9.]+%/ {
                share = $1; sub(/%/, "", share); dso = $2
                if (dso ~ /memif/) m += share
                else if (dso ~ /librte_(mbuf|mempool)/) b += share
                else if (dso ~ /kernel/) k += share
                else if (dso == exe) d += share
                else o += share
            }
            END { printf "| %d | %s | %.0f | %.0f | %.0f | %.0f | %.0f | %s | %s | %s |\n", r, c,
                  c * d / 100, c * m / 100, c * b / 100, c * k / 100, c * o / 100, busy, x, new }'
    round=$((round + 1))
done
