#!/usr/bin/env bash
# Runs every benchmark of perf/ once, small: each in every mode and with every flag it
# takes, so that each still runs and its own checks still hold (nat_rewrite asserts
# that every SYN opens a session, every established packet is forwarded, every
# session stays until the expiry phase, ...). A benchmark that no longer runs cannot
# reproduce the figures perf/results/ quotes from it. Times nothing: the figures of
# runs this small mean nothing and are not read.
#
# Usage: sudo scripts/bench_smoke.sh   (DPDK needs root; no hugepages, no NIC)
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
  echo "scripts/bench_smoke.sh: run as root (DPDK needs it)" >&2
  exit 1
fi

# As scripts/test.sh builds the tests, so that the library they built is reused.
export CARGO_PROFILE_RELEASE_LTO="${CARGO_PROFILE_RELEASE_LTO:-false}"
export CARGO_PROFILE_RELEASE_DEBUG="${CARGO_PROFILE_RELEASE_DEBUG:-line-tables-only}"
built=$(cargo bench --bench nat_rewrite --bench sched --bench acl --no-run 2>&1) || {
  echo "$built" >&2
  exit 1
}
# "  Executable perf/nat_rewrite.rs (target/release/deps/nat_rewrite-HASH)"
binary() {
  echo "$built" | sed -n "s|.*Executable perf/$1\.rs (\(.*\))|\1|p" | tail -1
}
nat_rewrite=$(binary nat_rewrite)
sched=$(binary sched)
acl=$(binary acl)
for b in "$nat_rewrite" "$sched" "$acl"; do
  [ -x "$b" ] || { echo "bench binary not found in cargo's output:" >&2; echo "$built" >&2; exit 1; }
done

work=$(mktemp -d "${TMPDIR:-/tmp}/bench-smoke.XXXXXX")
trap 'rm -rf "$work"' EXIT

failed=0
run() {
  local name=$1
  shift
  if timeout 120 "$@" >"$work/out" 2>&1; then
    echo "ok   $name"
  else
    echo "FAIL $name (exit $?): $*"
    tail -20 "$work/out"
    failed=$((failed + 1))
  fi
}

# nat_rewrite: 1,000 sessions, 20,000 established packets per phase.
for args in "nat" "fullnat" "nat6" "fullnat6" "nat64" \
  "nat --sync" "fullnat --sync" "nat --timestamps" "fullnat --timestamps" \
  "nat --synproxy" "fullnat --synproxy" "nat --replies" "fullnat --replies" \
  "nat --persist=300" "nat --park" "nat --exception" "nat --foreign" \
  "nat6 --foreign"; do
  # shellcheck disable=SC2086 # the mode and its flags, split on purpose
  run "nat_rewrite $args" "$nat_rewrite" 1000 20000 $args
done
run "sched" "$sched" 10000
run "acl" "$acl" 1 10000
gcc -O2 -o "$work/mem_floor" perf/mem_floor.c
run "mem_floor" "$work/mem_floor" 2 1
gcc -O2 -o "$work/page_walk" perf/page_walk.c
run "page_walk" "$work/page_walk" 2048 64

if [ "$failed" -ne 0 ]; then
  echo "scripts/bench_smoke.sh: $failed benchmark run(s) failed" >&2
  exit 1
fi
