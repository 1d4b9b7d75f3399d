#!/usr/bin/env bash
# Fuzzes what faces the network, and the control and config readers, each target for a
# bounded time (fuzz/fuzz_targets/, described in docs/TESTING.md, "Fuzzing"):
#   forwarder        classify + Forwarder::handle on one worker (DR/NAT/TUN/FullNAT)
#   sync_receiver    sync datagrams (with and without a key) and the standby's installer
#   vrrp             VRRP advertisements and the VRRP node
#   local_responder  ARP and ICMP echo answering
#   toa              TOA insertion and MSS clamping
#   config           TOML text -> validated config -> services
#   control_request  control socket requests and sluicectl's ipvsadm arguments
# Installs cargo-fuzz if missing. Runs on the stable toolchain (RUSTC_BOOTSTRAP=1 for
# the -Z flags cargo-fuzz passes to rustc). Needs root: the forwarder target starts
# a DPDK EAL (no huge pages, no PCI) for its mbufs.
#
#   scripts/fuzz.sh                       # every target, FUZZ_SECONDS (default 30) each
#   scripts/fuzz.sh forwarder toa         # only these
#   scripts/fuzz.sh --long                # every target FUZZ_LONG_SECONDS (default 4 h) each
#   FUZZ_RUNS=10000000 scripts/fuzz.sh vrrp  # stop after this many inputs instead of a time
#   FUZZ_SANITIZER=address scripts/fuzz.sh  # AddressSanitizer, stable toolchain (default: none)
#   FUZZ_CORPUS=DIR scripts/fuzz.sh       # keep the corpora in DIR/<target> (default: scratch)
#   FUZZ_JOBS=1 scripts/fuzz.sh           # one target at a time (default: two)
#
# Findings: libFuzzer writes the crashing input to fuzz/artifacts/<target>/; replay it
# with `cargo fuzz run <target> <file>` (same flags as below), then turn it into a unit
# test next to the fixed code.
set -euo pipefail
cd "$(dirname "$0")/.."

CARGO_FUZZ_VERSION=0.13.2
ALL_TARGETS=(forwarder sync_receiver vrrp local_responder toa config control_request)
seconds="${FUZZ_SECONDS:-30}"
runs="${FUZZ_RUNS:-}"
sanitizer="${FUZZ_SANITIZER:-none}"
targets=()
for arg in "$@"; do
  case "$arg" in
    --long) seconds="${FUZZ_LONG_SECONDS:-14400}" ;;
    -*) echo "scripts/fuzz.sh: unknown option $arg" >&2; exit 2 ;;
    *) targets+=("$arg") ;;
  esac
done
[ ${#targets[@]} -gt 0 ] || targets=("${ALL_TARGETS[@]}")

if ! cargo fuzz --version 2>/dev/null | grep -q "$CARGO_FUZZ_VERSION"; then
  echo "== installing cargo-fuzz $CARGO_FUZZ_VERSION"
  cargo install --locked --version "$CARGO_FUZZ_VERSION" cargo-fuzz
fi

# Built into the main target dir (instrumented crates under
# target/x86_64-unknown-linux-gnu/): nothing is shared with the main build, since
# cargo-fuzz's flags change every fingerprint, but one `cargo clean` clears both.
# New inputs go to a scratch corpus unless FUZZ_CORPUS is set; the committed seeds
# (fuzz/seeds/<target>, written by fuzz/seeds/make_seeds.py and hand-made ones) are
# only read.
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
corpus_root="${FUZZ_CORPUS:-$scratch}"

cd fuzz
# A sanitizer build lives apart, so switching does not rebuild the other.
target_dir=../target
[ "$sanitizer" = none ] || target_dir="../target/fuzz-$sanitizer"
run=(cargo fuzz run --sanitizer "$sanitizer" --release --target-dir "$target_dir")
echo "== cargo fuzz build (sanitizer $sanitizer)"
RUSTC_BOOTSTRAP=1 cargo fuzz build --sanitizer "$sanitizer" --release --target-dir "$target_dir"

# Two targets at a time (FUZZ_JOBS) on a two-core machine halves the wall time at the
# same fuzzing time per target; each target's output is printed when it ends.
jobs_max="${FUZZ_JOBS:-2}"
fuzz_one() {
  local t="$1"
  mkdir -p "$corpus_root/$t"
  if [ -n "$runs" ]; then
    limit=(-runs="$runs")
    echo "== cargo fuzz run $t ($runs inputs, sanitizer $sanitizer)"
  else
    limit=(-max_total_time="$seconds")
    echo "== cargo fuzz run $t (${seconds} s, sanitizer $sanitizer)"
  fi
  # -rss_limit_mb: the EAL maps its 64 MB at start; leaks still show as growth.
  RUSTC_BOOTSTRAP=1 "${run[@]}" "$t" "$corpus_root/$t" "seeds/$t" -- \
    "${limit[@]}" -max_len=8192 -timeout=10 -rss_limit_mb=4096 \
    -print_final_stats=1 2>&1 | grep -v -E '^#[0-9]+\s+(NEW|REDUCE|pulse)' || {
    echo "scripts/fuzz.sh: $t failed; the input is in fuzz/artifacts/$t/"
    return 1
  }
}
pids=() names=()
failed=0
finish_one() {
  # Waits for the oldest running target and prints its output.
  local pid="${pids[0]}" t="${names[0]}"
  if ! wait "$pid"; then failed=1; fi
  cat "$scratch/$t.log"
  pids=("${pids[@]:1}") names=("${names[@]:1}")
}
for t in "${targets[@]}"; do
  [ "${#pids[@]}" -lt "$jobs_max" ] || finish_one
  fuzz_one "$t" > "$scratch/$t.log" 2>&1 &
  pids+=("$!") names+=("$t")
done
while [ "${#pids[@]}" -gt 0 ]; do finish_one; done
if [ "$failed" -ne 0 ]; then
  echo "scripts/fuzz.sh: a target failed (see above)" >&2
  exit 1
fi
