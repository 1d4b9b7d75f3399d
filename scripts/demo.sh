#!/usr/bin/env bash
# The loopback demo: Sluice on an in-process net_ring port with emulated neighbours
# that ARP for and ping the appliance. No NIC, no hugepages. Ctrl-C stops it.
# Usage: sudo scripts/demo.sh [extra sluice args, e.g. --duration 10]
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
  echo "scripts/demo.sh: run as root (DPDK needs it)" >&2
  exit 1
fi

bash scripts/setup.sh
cargo build --release --bins
exec ./target/release/sluice --config config/loopback.toml "$@"
