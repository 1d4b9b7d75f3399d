#!/usr/bin/env bash
# Fuzzes the control request parser (and sluicectl's ipvsadm argument parser) for a
# bounded time: fuzz/fuzz_targets/control_request.rs. Installs cargo-fuzz if missing.
# Works on the stable toolchain: cargo-fuzz's default sanitizer (address) needs
# nightly, so this runs with --sanitizer none (panics and failed assertions are still
# caught) and RUSTC_BOOTSTRAP=1 for the -Z flags cargo-fuzz passes to rustc.
#
#   scripts/fuzz.sh            # 30 s
#   FUZZ_SECONDS=600 scripts/fuzz.sh
set -euo pipefail
cd "$(dirname "$0")/.."

CARGO_FUZZ_VERSION=0.13.2
SECONDS_TO_RUN="${FUZZ_SECONDS:-30}"

if ! cargo fuzz --version 2>/dev/null | grep -q "$CARGO_FUZZ_VERSION"; then
  echo "== installing cargo-fuzz $CARGO_FUZZ_VERSION"
  cargo install --locked --version "$CARGO_FUZZ_VERSION" cargo-fuzz
fi

# Built into the main target dir (instrumented crates under
# target/x86_64-unknown-linux-gnu/): nothing is shared with the main build, since
# cargo-fuzz's flags change every fingerprint, but one `cargo clean` clears both.
# fuzz/Cargo.lock is the main lockfile plus libfuzzer-sys, so the versions match.
# New inputs go to a scratch corpus; the committed seeds (real requests and ipvsadm
# command lines) are only read.
corpus="$(mktemp -d)"
trap 'rm -rf "$corpus"' EXIT

echo "== cargo fuzz run control_request (${SECONDS_TO_RUN} s)"
cd fuzz
RUSTC_BOOTSTRAP=1 cargo fuzz run --sanitizer none --release --target-dir ../target control_request \
  "$corpus" seeds/control_request -- \
  -max_total_time="$SECONDS_TO_RUN" -max_len=4096 -timeout=10 -print_final_stats=1
