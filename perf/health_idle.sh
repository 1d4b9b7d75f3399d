#!/bin/bash
# The management thread's CPU time with a TCP health check on every real server of a
# large table, the daemon otherwise idle.
#
#     sudo perf/health_idle.sh BIN_DIR [SERVICES] [PER] [PASSIVE]
#
# BIN_DIR holds `sluice` and `sluicectl`. Writes perf/config_scale.py's loopback table
# (SERVICES x PER NAT real servers, default 5000 x 10) with `[health] check = "tcp"`,
# `interval_ms = 10000`, `timeout_ms = 1000`, starts the daemon, waits 12 s after its
# control socket answers, then prints the milliseconds of CPU a second its management
# thread (the process's main thread) used over 10 s (/proc/PID/task/PID/schedstat)
# and `sluicectl health --json`'s probe counters; then times three `sluicectl health
# --json`. PASSIVE `passive` adds `passive = true` (passive detection on every real
# server too).
set -euo pipefail
bin=$1
services=${2:-5000}
per=${3:-10}
passive=${4:-}
case "$passive" in
"" | passive) ;;
*) echo "usage: $0 BIN_DIR [SERVICES] [PER] [passive]" >&2; exit 2 ;;
esac
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d /tmp/health-idle-XXXXXX)
pid=""
cleanup() {
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    rm -rf "$work"
}
trap cleanup EXIT
python3 "$here/config_scale.py" "$work/s.toml" "$services" "$per" wlc >/dev/null
sed -i "s#/run/sluice/config-scale.sock#$work/s.sock#; s#file_prefix = \"config-scale\"#file_prefix = \"hi$$\"#" "$work/s.toml"
python3 - "$work/s.toml" "$passive" <<'PY'
import sys
path = sys.argv[1]
text = open(path).read()
at = text.index("[[services]]")
extra = "passive = true\n" if sys.argv[2] == "passive" else ""
text = text[:at] + '[health]\ncheck = "tcp"\ninterval_ms = 10000\ntimeout_ms = 1000\n' + extra + "\n" + text[at:]
open(path, "w").write(text)
PY
"$bin/sluice" --config "$work/s.toml" >/dev/null 2>"$work/log" &
pid=$!
for _ in $(seq 120); do
    "$bin/sluicectl" --socket "$work/s.sock" status >/dev/null 2>&1 && break
    sleep 1
done
sleep 12
before=$(awk '{print $1}' "/proc/$pid/task/$pid/schedstat")
sleep 10
after=$(awk '{print $1}' "/proc/$pid/task/$pid/schedstat")
stats=$("$bin/sluicectl" --socket "$work/s.sock" health --json |
    python3 -c "import json, sys; print(json.load(sys.stdin)['stats'])")
echo "management thread: $(( (after - before) / 10000000 )) ms of CPU a second; probes: $stats"
# Three `sluicectl health --json`: seconds from start to exit, bytes, and the
# management thread's CPU time meanwhile (its idle share above included).
for i in 1 2 3; do
    cpu=$(awk '{print $1}' "/proc/$pid/task/$pid/schedstat")
    started=$(date +%s.%N)
    bytes=$("$bin/sluicectl" --socket "$work/s.sock" health --json | wc -c)
    ended=$(date +%s.%N)
    cpu=$(( ($(awk '{print $1}' "/proc/$pid/task/$pid/schedstat") - cpu) / 1000000 ))
    echo "health --json $i: $(awk "BEGIN { printf \"%.3f\", $ended - $started }") s, $bytes bytes, management thread $cpu ms"
done
