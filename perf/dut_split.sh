#!/bin/sh
# Where a harness DUT's forwarding core spends its cycles: its own code against the
# memif driver that moves every packet in and out.
#
#   sudo perf/dut_split.sh SCENARIO [SECONDS] [ROUNDS]
#
# Runs `sluice-gen bench --scenarios SCENARIO --no-brackets` ROUNDS times (default 3),
# with `SLUICE=BIN SLUICECTL=CTL` in the environment against that build of Sluice.
# In each, once the generator reports ready, it samples the DUT's forwarding thread
# (`rte-worker-1`: Sluice's worker, testpmd's forwarding lcore) with `perf record -e
# cpu-clock` for SECONDS (default 10) of the measure window, then splits the samples by
# the shared object they fell in. Each share times the row's own DUT cycles/packet
# gives cycles per packet spent there.
#
# cpu-clock is a software timer, the one sampling event this VM offers: a sample lands
# up to a few instructions after where the time went, so the split by object is sound
# and a split by instruction is not.
set -eu
scenario=${1:?usage: perf/dut_split.sh SCENARIO [SECONDS] [ROUNDS]}
seconds=${2:-10}
rounds=${3:-3}
gen=${SLUICE_GEN:-target/release/sluice-gen}
# Another Sluice build as the DUT: SLUICE=BIN SLUICECTL=CTL (both, as `bench` takes them).
dut=
if [ -n "${SLUICE:-}" ]; then dut="--sluice $SLUICE --sluicectl ${SLUICECTL:?SLUICECTL too}"; fi
command -v perf >/dev/null || { echo "perf not found (Debian: linux-perf)" >&2; exit 1; }
[ -x "$gen" ] || { echo "$gen not found: cargo build --release --bins" >&2; exit 1; }

work=$(mktemp -d /tmp/dut-split.XXXXXX)
trap 'rm -rf "$work"' EXIT
printf '| round | DUT cycles/pkt | DUT code | memif | mbuf/mempool | kernel | other | busy %% DUT/gen | c2c ns | new sessions/s |\n'
printf '|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n'
round=1
while [ "$round" -le "$rounds" ]; do
    # shellcheck disable=SC2086
    "$gen" bench --scenarios "$scenario" --no-brackets --duration $((seconds + 10)) \
        $dut --out "$work/out.md" >"$work/bench.log" 2>&1 &
    bench=$!
    # The scenario's directory holds the generator's log; @READY ends establishing.
    ready=
    for _ in $(seq 1 600); do
        if grep -qs '^@READY' /tmp/sluice-bench-$bench-*/gen.log; then ready=1; break; fi
        kill -0 "$bench" 2>/dev/null || break
        sleep 0.2
    done
    [ -n "$ready" ] || { echo "round $round: the generator never got ready" >&2; cat "$work/bench.log" >&2; exit 1; }
    sleep 1
    tid=
    for t in /proc/[0-9]*/task/*; do
        [ "$(cat "$t/comm" 2>/dev/null)" = rte-worker-1 ] || continue
        # The DUT's thread, not the generator's (which polls on lcore 0).
        case $(cat "${t%/task/*}/cmdline" 2>/dev/null | tr '\0' ' ') in
            *sluice-gen*) ;;
            *) tid=${t##*/} ;;
        esac
    done
    [ -n "$tid" ] || { echo "round $round: no DUT forwarding thread found" >&2; exit 1; }
    perf record -q -e cpu-clock -F 2000 -t "$tid" -o "$work/perf.data" -- sleep "$seconds" >/dev/null 2>&1
    wait "$bench" || { echo "round $round: the bench failed" >&2; cat "$work/bench.log" >&2; exit 1; }
    # The row's cycles/packet and its c2c reading, found by the table's header.
    set -- $(awk -F'|' -v s="$scenario" '
        /^\| scenario \|/ { for (i = 1; i <= NF; i++) { h = $i; gsub(/^ +| +$/, "", h); col[h] = i } }
        $2 ~ "^ *" s " *$" && col["c2c ns"] {
            c = $col["DUT cycles/pkt"]; x = $col["c2c ns"]; b = $col["busy % DUT/gen"]
            n = $col["new sess/s per worker"]
            gsub(/ /, "", c); gsub(/ /, "", x); gsub(/ /, "", b); gsub(/ /, "", n)
            print c, x, b, n; exit
        }' "$work/out.md")
    [ $# -eq 4 ] || { echo "round $round: no row for $scenario" >&2; exit 1; }
    cycles=$1 c2c=$2 busy=$3 new=$4
    perf report -i "$work/perf.data" --no-children --sort dso --stdio 2>/dev/null |
        awk -v r="$round" -v c="$cycles" -v x="$c2c" -v busy="$busy" -v new="$new" '
            /^ *[0-9.]+%/ {
                share = $1; sub(/%/, "", share); dso = $2
                if (dso ~ /memif/) m += share
                else if (dso ~ /librte_(mbuf|mempool)/) b += share
                else if (dso ~ /kernel/) k += share
                else if (dso == "sluice" || dso == "dpdk-testpmd") d += share
                else o += share
            }
            END { printf "| %d | %s | %.0f | %.0f | %.0f | %.0f | %.0f | %s | %s | %s |\n", r, c,
                  c * d / 100, c * m / 100, c * b / 100, c * k / 100, c * o / 100, busy, x, new }'
    round=$((round + 1))
done
