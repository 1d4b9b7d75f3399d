#!/usr/bin/env bash
# Installs every Debian package Sluice builds and tests with. Idempotent: packages that
# are already present are skipped, so a second run costs one dpkg query.
set -euo pipefail

PACKAGES=(
  dpdk dpdk-dev libdpdk-dev libclang-dev clang pkg-config libpcap-dev
  iproute2 ethtool tcpdump tshark python3-scapy iputils-ping arping curl
  bridge-utils procps python3-prometheus-client keepalived nftables nginx wrk
  prometheus
  # BGP through BIRD (tests/e2e_bgp.rs, docs/CLUSTER.md): the tests run their own bird
  # processes in namespaces, never the system service.
  bird2
  # Packaging (scripts/package.sh, tests/packaging.rs): dpkg-deb and dpkg-shlibdeps,
  # strip, lintian, man -l, systemd-analyze verify.
  dpkg-dev binutils lintian man-db systemd
)

# Opt-in: `scripts/setup.sh --ipvsadm-link [DIR] [SLUICECTL]` links DIR/ipvsadm
# (default /usr/local/sbin) to sluicectl (default: target/release/sluicectl of this
# checkout, else the one on PATH). Called as ipvsadm, sluicectl speaks ipvsadm 1.31's
# exit statuses and words; scripts call it by name (bash expands no aliases in
# scripts). An ipvsadm that is not such a link is left alone.
if [ "${1:-}" = "--ipvsadm-link" ]; then
  dir="${2:-/usr/local/sbin}"
  ctl="${3:-}"
  if [ -z "$ctl" ]; then
    here="$(cd "$(dirname "$0")/.." && pwd)"
    if [ -x "$here/target/release/sluicectl" ]; then
      ctl="$here/target/release/sluicectl"
    else
      ctl="$(command -v sluicectl || true)"
    fi
  fi
  if [ -z "$ctl" ] || [ ! -x "$ctl" ]; then
    echo "scripts/setup.sh: no sluicectl to link to (build it: cargo build --release)" >&2
    exit 1
  fi
  link="$dir/ipvsadm"
  if [ -e "$link" ] && [ ! -L "$link" ]; then
    echo "scripts/setup.sh: $link exists and is not a link (a real ipvsadm?); left alone" >&2
    exit 1
  fi
  if [ -L "$link" ] && [ "$(basename "$(readlink "$link")")" != "sluicectl" ]; then
    echo "scripts/setup.sh: $link links to $(readlink "$link"), not sluicectl; left alone" >&2
    exit 1
  fi
  mkdir -p "$dir"
  ln -sfn "$ctl" "$link"
  echo "scripts/setup.sh: $link -> $ctl"
  exit 0
fi

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
  # nginx, keepalived, prometheus and bird2 would start system-wide services on install (and
  # nginx fail the install if port 80 is taken); the tests run their own instances
  # inside namespaces. A policy-rc.d that refuses every start, only for this install.
  policy=/usr/sbin/policy-rc.d
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' >"$policy"
    chmod +x "$policy"
    trap 'rm -f "$policy"' EXIT
  fi
  apt-get install -y -q --no-install-recommends "${missing[@]}"
  # The packages enable their services, which would start at the next boot: nginx on
  # :80 and Prometheus on :9090 (no authentication) listening on every address,
  # keepalived sending VRRP, BIRD with its default config. The tests run their own
  # instances inside namespaces, and a node runs BIRD on purpose, with its own config
  # (config/bird-node.conf): those installed here are left disabled.
  if command -v systemctl >/dev/null; then
    for pair in nginx:nginx prometheus:prometheus keepalived:keepalived bird2:bird; do
      if [[ " ${missing[*]} " == *" ${pair%%:*} "* ]]; then
        systemctl disable --quiet "${pair#*:}.service" 2>/dev/null || true
      fi
    done
  fi
fi

pkg-config --atleast-version=22.11 libdpdk || {
  echo "scripts/setup.sh: libdpdk >= 22.11 not found after install" >&2
  exit 1
}
echo "scripts/setup.sh: ok (libdpdk $(pkg-config --modversion libdpdk))"
