#!/usr/bin/env bash
# The performance harness (issue 7) in one command: builds the release binaries, runs
# a scenario set with dpdk-testpmd in Sluice's place as the reference, prints the
# table and writes it to perf/results/harness.md (unless --out says otherwise).
#
#   sudo perf/run.sh                 # the quick set (16 runs, ~5 minutes)
#   sudo perf/run.sh --full          # every scenario (long; 10M sessions need ~4 GB)
#   sudo perf/run.sh --scenarios testpmd-5tswap,nat-1m-established --duration 10
#   target/release/sluice-gen list   # scenario names
#
# Needs root (DPDK), Debian's dpdk packages (scripts/setup.sh) and a quiet machine:
# the generator polls CPU 0 and the device under test CPU 1. Not for CI.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
  echo "perf/run.sh: run as root (DPDK needs it)" >&2
  exit 1
fi
if [ ! -x /usr/bin/dpdk-testpmd ]; then
  echo "perf/run.sh: /usr/bin/dpdk-testpmd missing (apt-get install dpdk, or scripts/setup.sh)" >&2
  exit 1
fi

cargo build --release --bins
exec target/release/sluice-gen bench --out perf/results/harness.md "$@"
