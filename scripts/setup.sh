#!/usr/bin/env bash
# Installs every Debian package Sluice builds and tests with. Idempotent: packages that
# are already present are skipped, so a second run costs one dpkg query.
set -euo pipefail

PACKAGES=(
  dpdk dpdk-dev libdpdk-dev libclang-dev clang pkg-config libpcap-dev
  iproute2 ethtool tcpdump tshark python3-scapy iputils-ping arping curl
  bridge-utils procps python3-prometheus-client keepalived nftables nginx wrk
)

if [ "$(id -u)" -ne 0 ]; then
  echo "scripts/setup.sh: run as root (apt-get install)" >&2
  exit 1
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -gt 0 ]; then
  echo "scripts/setup.sh: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # tshark asks whether non-root users may capture; answer once, non-interactively.
  echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
  apt-get update -q
  # nginx and keepalived would start system-wide services on install (and nginx fail
  # the install if port 80 is taken); the tests run their own instances inside
  # namespaces. A policy-rc.d that refuses every start, only for this install.
  policy=/usr/sbin/policy-rc.d
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod +x "$policy"
    trap 'rm -f "$policy"' EXIT
  fi
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

pkg-config --atleast-version=22.11 libdpdk || {
  echo "scripts/setup.sh: libdpdk >= 22.11 not found after install" >&2
  exit 1
}
echo "scripts/setup.sh: ok (libdpdk $(pkg-config --modversion libdpdk))"
