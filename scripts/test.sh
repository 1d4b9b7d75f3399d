#!/usr/bin/env bash
# The whole test suite: installs what it needs, then formatting, lints, unit tests,
# DPDK integration tests, golden-packet tests and end-to-end tests in namespaces, every
# benchmark run once small (scripts/bench_smoke.sh), and a bounded fuzzing run of
# every fuzz target (scripts/fuzz.sh, 10 s each here).
# Needs root (DPDK, network namespaces). Usage: sudo scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
  echo "scripts/test.sh: run as root (DPDK and network namespaces need it)" >&2
  exit 1
fi

bash scripts/setup.sh

echo "== cargo fmt --check"
cargo fmt --all -- --check

echo "== cargo clippy -D warnings"
cargo clippy --release --all-targets -- -D warnings

echo "== cargo test (unit, DPDK integration, golden pcap, namespaces)"
# Test binaries run one after another: the unit tests, the integration tests (one
# binary, tests/integration.rs; its tests run two at a time, each with its own
# daemon, file prefix and namespace names), then the few apart (eal_*,
# perf_validation). Without LTO and with line tables only: each test binary links
# the library, and thin LTO per binary cost minutes of the CI budget. The tests check
# behaviour, not speed; the benchmarks (perf/) build with the release profile as is.
CARGO_PROFILE_RELEASE_LTO=false CARGO_PROFILE_RELEASE_DEBUG=line-tables-only \
  cargo test --release --workspace --no-fail-fast -- --test-threads=2

# Every benchmark once, small, in each of its modes: that it runs and its own checks
# hold (seconds; times nothing).
echo "== benchmarks run once, small (scripts/bench_smoke.sh)"
bash scripts/bench_smoke.sh

# 10 s per target (two at a time) keeps the whole run under CI's 30 minutes; the
# script's own default, for a run by hand, is 30 s, and --long runs for hours.
echo "== fuzz every target (10 s each; scripts/fuzz.sh)"
FUZZ_SECONDS="${FUZZ_SECONDS:-10}" bash scripts/fuzz.sh
