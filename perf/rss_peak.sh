#!/bin/bash
# Peak RssAnon (kB) of one nat_rewrite run: BIN SESSIONS [PACKETS] [MODE].
# Run it with 1000 and with 1000000 sessions; the difference over the 999000 extra
# sessions is what each session costs the process in resident memory, measured from
# the kernel's own count whatever the code's formula says. Needs root (DPDK).
set -eu
bin=$1 sessions=$2 packets=${3:-60000000} mode=${4:-nat}
"$bin" "$sessions" "$packets" "$mode" >/dev/null 2>&1 &
pid=$!
peak=0
while kill -0 "$pid" 2>/dev/null; do
    v=$(awk '/^RssAnon/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
    if [ -n "$v" ] && [ "$v" -gt "$peak" ]; then peak=$v; fi
    sleep 0.5
done
wait "$pid"
echo "$peak"
