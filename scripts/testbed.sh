#!/usr/bin/env bash
# Sluice network-namespace test bed.
#
#   scripts/testbed.sh up NAME [N_REAL_SERVERS]   build it, print KEY=VALUE facts
#   scripts/testbed.sh down NAME                  remove everything named NAME-*
#   scripts/testbed.sh status NAME                show what exists
#
# Set-up for forwarding tests, on a bed that is up (each idempotent, each fails with
# exit 1 when the bed does not exist):
#
#   scripts/testbed.sh dr-vip NAME VIP...         every real server holds each VIP on lo
#                                                 (/32) and neither answers nor announces
#                                                 it: arp_ignore=1, arp_announce=2 (DR, TUN)
#   scripts/testbed.sh rs-gateway NAME GW         every real server's default route goes
#                                                 via GW (NAT: Sluice's address)
#   scripts/testbed.sh client-addr NAME A/LEN [GW] the client's address becomes A/LEN (the
#                                                 old one is removed), default route via
#                                                 GW if given; prints CLIENT_IP=A
#   scripts/testbed.sh lb2 NAME                   a second appliance (two-node failover):
#                                                 namespace NAME-lb2 with veth NAME-lb2v on
#                                                 the bridge (port NAME-plb2), built exactly
#                                                 like NAME-lb0 (up, no address, forwarding
#                                                 off, arp_ignore=8, offloads off), plus a
#                                                 kernel "sync link" veth pair NAME-s1 in
#                                                 NAME-lb (198.19.0.1/24) <-> NAME-s2 in
#                                                 NAME-lb2 (198.19.0.2/24); prints LB2_NS,
#                                                 LB2_IF, LB2_MAC, SYNC1_IF, SYNC1_IP,
#                                                 SYNC2_IF, SYNC2_IP. Fails if NAME-lb2
#                                                 exists; `down` removes it all.
#
# Layout (NAME is [a-z0-9]{1,8}; every name below starts with "NAME-"):
#
#   namespace NAME-sw    bridge NAME-br (the switch: STP off, mcast_snooping 0)
#                        ports NAME-plb, NAME-pc, NAME-pr1 .. NAME-prN
#   namespace NAME-lb    NAME-lb0  the appliance's veth: up, NO address, forwarding off
#   namespace NAME-c     NAME-c0   client, 198.18.0.100/24
#   namespace NAME-rsI   NAME-rI   real server I, 198.18.0.(10+I)/24
#
# A test may add more namespaces of the same pattern (tests/e2e_ecmp.rs: NAME-lb3 with
# NAME-lb3v/NAME-plb3, a router NAME-rt with NAME-rtv/NAME-prt); `down` removes
# NAME-lbN and NAME-rt as well.
#
# Sluice attaches to NAME-lb0 with net_af_packet (run it with `ip netns exec NAME-lb`)
# and is expected to own 198.18.0.1 (APPLIANCE_IP). Every veth end has its offloads off
# (checksum, TSO, GSO, GRO), IPv6 is disabled in every namespace (no DAD/RS/MLD noise
# on the wire) and nothing is connected to the host's own network: no traffic leaves
# the namespaces. Veths are created directly inside their namespaces, so no interface
# ever appears in the root namespace.
#
# `up` fails (exit 1, nothing touched) when any namespace of NAME already exists; if it
# fails half-way it removes what it built. `down` removes every namespace and interface
# of NAME (and stops processes still running inside those namespaces, e.g. a Sluice
# left by a crashed test), even when half-built, and never touches anything else.
set -euo pipefail

PROG="scripts/testbed.sh"
MAX_RS=32
SUBNET_PREFIX="198.18.0"
PREFIX_LEN=24
APPLIANCE_IP="${SUBNET_PREFIX}.1"
CLIENT_IP="${SUBNET_PREFIX}.100"

die() {
  echo "$PROG: $*" >&2
  exit 1
}

usage() {
  cat >&2 <<EOF
usage: $PROG up NAME [N_REAL_SERVERS]
       $PROG down NAME
       $PROG status NAME
       $PROG dr-vip NAME VIP...
       $PROG rs-gateway NAME GW
       $PROG client-addr NAME ADDR/LEN [GW]
       $PROG lb2 NAME
NAME: 1-8 characters [a-z0-9]; N_REAL_SERVERS: 0..$MAX_RS (default 0)
EOF
  exit 2
}

check_name() {
  [[ "${1:-}" =~ ^[a-z0-9]{1,8}$ ]] || die "invalid NAME '${1:-}': use 1-8 characters [a-z0-9]"
}

need_root() {
  [ "$(id -u)" -eq 0 ] || die "must run as root (network namespaces, veth, bridge)"
  local t
  for t in ip ethtool sysctl; do
    command -v "$t" >/dev/null 2>&1 || die "'$t' not found (run scripts/setup.sh)"
  done
}

# Every namespace whose name belongs to NAME (exact patterns, nothing else).
namespaces_of() {
  local name="$1"
  ip netns list 2>/dev/null | awk '{print $1}' |
    grep -E "^${name}-(sw|lb|lb[0-9]+|c|rt|rs[0-9]+)$" || true
}

# Interfaces in the ROOT namespace that belong to NAME (normally none; only a
# half-built bed made by hand or an interrupted older run could leave some).
root_links_of() {
  local name="$1"
  ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | sed 's/@.*//' |
    grep -E "^${name}-(br|lb0|lb[0-9]+v|plb|plb[0-9]+|s1|s2|c0|pc|rtv|prt|r[0-9]+|pr[0-9]+)$" || true
}

nsx() {
  local ns="$1"
  shift
  ip netns exec "$ns" "$@"
}

# Offloads off on one veth end: no TSO/GSO super-frames and no half-computed
# checksums reach af_packet or the peers. Features a driver cannot change are
# reported by ethtool on stderr; only failure to change everything is fatal.
offloads_off() {
  local ns="$1" ifname="$2"
  nsx "$ns" ethtool -K "$ifname" rx off tx off sg off tso off gso off gro off >/dev/null 2>&1 ||
    nsx "$ns" ethtool -K "$ifname" tx off tso off gso off >/dev/null ||
    die "ethtool -K $ifname (in $ns) failed"
  local feat
  feat="$(nsx "$ns" ethtool -k "$ifname")"
  for f in tx-checksumming tcp-segmentation-offload generic-segmentation-offload; do
    grep -qE "^$f: off" <<<"$feat" || die "$ifname (in $ns): $f is still on"
  done
}

# An appliance's namespace NS with its veth IF on the switch (bridge port PORT): up,
# unaddressed, forwarding off, arp_ignore=8, so the kernel never answers for Sluice.
appliance_namespace() {
  local name="$1" ns="$2" ifname="$3" port="$4"
  new_namespace "$ns"
  nsx "$ns" sysctl -qw net.ipv4.conf.all.forwarding=0
  attach "$name" "$ns" "$ifname" "$port"
  nsx "$ns" sysctl -qw "net.ipv4.conf.${ifname}.forwarding=0"
  nsx "$ns" sysctl -qw "net.ipv4.conf.${ifname}.arp_ignore=8"
  if [ -n "$(nsx "$ns" ip -o addr show dev "$ifname")" ]; then
    die "$ifname unexpectedly has an address"
  fi
}

new_namespace() {
  local ns="$1"
  ip netns add "$ns"
  nsx "$ns" ip link set lo up
  # No IPv6 on any interface created later in this namespace.
  nsx "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1
  nsx "$ns" sysctl -qw net.ipv6.conf.default.disable_ipv6=1
  nsx "$ns" sysctl -qw net.ipv4.ip_forward=0
}

# One endpoint: veth EP in namespace NS, its peer SWPORT in the switch namespace,
# enslaved to the bridge. Both ends are created directly in their namespaces.
attach() {
  local name="$1" ns="$2" ep="$3" swport="$4"
  ip link add "$ep" netns "$ns" type veth peer name "$swport" netns "${name}-sw"
  offloads_off "$ns" "$ep"
  offloads_off "${name}-sw" "$swport"
  nsx "${name}-sw" ip link set "$swport" master "${name}-br"
  nsx "${name}-sw" ip link set "$swport" up
  nsx "$ns" ip link set "$ep" up
}

mac_of() {
  nsx "$1" cat "/sys/class/net/$2/address"
}

BUILDING=""
# On a failed or interrupted `up`, remove the half-built bed (only after the lock
# was taken, so another run's bed is never touched).
on_exit() {
  local rc=$?
  if [ -n "$BUILDING" ] && [ "$rc" -ne 0 ]; then
    echo "$PROG: up $BUILDING failed (exit $rc), removing what was built" >&2
    cmd_down "$BUILDING" >/dev/null 2>&1 || true
  fi
  exit "$rc"
}

cmd_up() {
  local name="$1" nrs="$2"
  [[ "$nrs" =~ ^[0-9]+$ ]] && [ "$nrs" -le "$MAX_RS" ] ||
    die "invalid N_REAL_SERVERS '$nrs': use 0..$MAX_RS"

  local existing
  existing="$(namespaces_of "$name" | tr '\n' ' ')"
  [ -z "$existing" ] ||
    die "test bed '$name' already exists (namespaces: ${existing% }); run '$PROG down $name' first"
  # `ip netns add` of the switch namespace is the lock: it fails if another `up` of
  # the same NAME won the race, and then nothing of the other run is touched.
  if ! ip netns add "${name}-sw" 2>/dev/null; then
    die "test bed '$name' already exists (namespace ${name}-sw); run '$PROG down $name' first"
  fi
  # From here on, every namespace of NAME is ours: remove all of it on any failure.
  BUILDING="$name"
  trap on_exit EXIT
  trap 'exit 130' INT TERM

  nsx "${name}-sw" ip link set lo up
  nsx "${name}-sw" sysctl -qw net.ipv6.conf.all.disable_ipv6=1
  nsx "${name}-sw" sysctl -qw net.ipv6.conf.default.disable_ipv6=1
  nsx "${name}-sw" ip link add "${name}-br" type bridge stp_state 0 forward_delay 0 mcast_snooping 0
  nsx "${name}-sw" ip link set "${name}-br" up

  # The appliance: up, unaddressed, forwarding off, so the kernel never answers for it.
  appliance_namespace "$name" "${name}-lb" "${name}-lb0" "${name}-plb"

  new_namespace "${name}-c"
  attach "$name" "${name}-c" "${name}-c0" "${name}-pc"
  nsx "${name}-c" ip addr add "${CLIENT_IP}/${PREFIX_LEN}" dev "${name}-c0"

  local i
  for ((i = 1; i <= nrs; i++)); do
    new_namespace "${name}-rs$i"
    attach "$name" "${name}-rs$i" "${name}-r$i" "${name}-pr$i"
    nsx "${name}-rs$i" ip addr add "${SUBNET_PREFIX}.$((10 + i))/${PREFIX_LEN}" dev "${name}-r$i"
  done

  BUILDING=""

  echo "TESTBED=$name"
  echo "SW_NS=${name}-sw"
  echo "BRIDGE=${name}-br"
  echo "LB_NS=${name}-lb"
  echo "LB_IF=${name}-lb0"
  echo "LB_MAC=$(mac_of "${name}-lb" "${name}-lb0")"
  echo "APPLIANCE_IP=$APPLIANCE_IP"
  echo "PREFIX_LEN=$PREFIX_LEN"
  echo "CLIENT_NS=${name}-c"
  echo "CLIENT_IF=${name}-c0"
  echo "CLIENT_IP=$CLIENT_IP"
  echo "CLIENT_MAC=$(mac_of "${name}-c" "${name}-c0")"
  echo "RS_COUNT=$nrs"
  local list=""
  for ((i = 1; i <= nrs; i++)); do
    echo "RS${i}_NS=${name}-rs$i"
    echo "RS${i}_IF=${name}-r$i"
    echo "RS${i}_IP=${SUBNET_PREFIX}.$((10 + i))"
    echo "RS${i}_MAC=$(mac_of "${name}-rs$i" "${name}-r$i")"
    list="$list ${name}-rs$i"
  done
  echo "RS_NS=${list# }"
}

# Stops whatever still runs inside a namespace of this test bed (TERM, then KILL
# after 3 s). Only pids that `ip netns pids` reports for that namespace are signalled.
stop_processes() {
  local ns="$1" pids i
  pids="$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')"
  [ -n "${pids// /}" ] || return 0
  echo "$PROG: stopping processes left in $ns: $pids" >&2
  # shellcheck disable=SC2086
  kill -TERM $pids 2>/dev/null || true
  for ((i = 0; i < 30; i++)); do
    pids="$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')"
    [ -n "${pids// /}" ] || return 0
    sleep 0.1
  done
  # shellcheck disable=SC2086
  kill -KILL $pids 2>/dev/null || true
}

cmd_down() {
  local name="$1" ns link
  for ns in $(namespaces_of "$name"); do
    stop_processes "$ns"
  done
  # Deleting a namespace destroys its veth ends, and with them their peers.
  for ns in $(namespaces_of "$name"); do
    ip netns del "$ns" 2>/dev/null || ip netns del "$ns"
  done
  for link in $(root_links_of "$name"); do
    ip link del "$link" 2>/dev/null || true
  done
  # A namespace is freed asynchronously after `ip netns del`; wait (bounded) until
  # the veth peers are gone too, so a following `up` of the same NAME cannot collide.
  local left i
  for ((i = 0; i < 50; i++)); do
    left="$(namespaces_of "$name")$(root_links_of "$name")"
    [ -z "$left" ] && break
    sleep 0.1
  done
  [ -z "$left" ] || die "down $name: still present: $(echo "$left" | tr '\n' ' ')"
  echo "$PROG: test bed '$name' is down"
}

cmd_status() {
  local name="$1" ns found=0
  for ns in $(namespaces_of "$name"); do
    found=1
    echo "== namespace $ns"
    nsx "$ns" ip -br link show | grep -v '^lo ' || true
    nsx "$ns" ip -br -4 addr show | grep -v '^lo ' || true
    local pids
    pids="$(ip netns pids "$ns" 2>/dev/null | tr '\n' ' ')"
    [ -z "${pids// /}" ] || echo "processes: $pids"
  done
  local links
  links="$(root_links_of "$name")"
  if [ -n "$links" ]; then
    found=1
    echo "== root namespace links of $name: $(echo "$links" | tr '\n' ' ')"
  fi
  if [ "$found" -eq 0 ]; then
    echo "test bed '$name' does not exist"
    return 1
  fi
}

check_ipv4() {
  local a="$1" o
  [[ "$a" =~ ^([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})$ ]] || die "invalid IPv4 address '$a'"
  for o in "${BASH_REMATCH[@]:1}"; do
    [ "$o" -le 255 ] || die "invalid IPv4 address '$a'"
  done
}

# The real-server namespaces of NAME, in order (rs1, rs2, ...).
rs_namespaces_of() {
  namespaces_of "$1" | grep -E -- "-rs[0-9]+$" | sed -E 's/^(.*-rs)([0-9]+)$/\2 \1\2/' |
    sort -n | cut -d' ' -f2 || true
}

require_bed() {
  ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "${1}-sw" ||
    die "test bed '$1' does not exist (run '$PROG up $1 N' first)"
}

# DR (and TUN): the VIP on lo of every real server, which must neither answer ARP for
# it (arp_ignore=1: only for addresses of the receiving interface) nor use it as the
# sender address of its own ARP requests (arp_announce=2: the best local address for
# the target), or the client would learn the VIP at a real server's MAC.
cmd_dr_vip() {
  local name="$1" ns i vip
  shift
  [ $# -ge 1 ] || usage
  for vip in "$@"; do check_ipv4 "$vip"; done
  require_bed "$name"
  for ns in $(rs_namespaces_of "$name"); do
    i="${ns##*-rs}"
    for conf in all "${name}-r$i"; do
      nsx "$ns" sysctl -qw "net.ipv4.conf.${conf}.arp_ignore=1"
      nsx "$ns" sysctl -qw "net.ipv4.conf.${conf}.arp_announce=2"
    done
    for vip in "$@"; do
      nsx "$ns" ip addr replace "$vip/32" dev lo
    done
  done
}

# NAT: replies to clients must go back through Sluice.
cmd_rs_gateway() {
  local name="$1" gw="$2" ns
  check_ipv4 "$gw"
  require_bed "$name"
  for ns in $(rs_namespaces_of "$name"); do
    nsx "$ns" ip route replace default via "$gw"
  done
}

# Moves the client to another subnet (e.g. in front of a NAT appliance whose real
# servers are on the bed's 198.18.0.0/24).
cmd_client_addr() {
  local name="$1" addr="$2" gw="${3:-}"
  [[ "$addr" =~ ^([0-9.]+)/([0-9]{1,2})$ ]] || die "invalid address '$addr' (expected a.b.c.d/n)"
  local ip="${BASH_REMATCH[1]}" len="${BASH_REMATCH[2]}"
  check_ipv4 "$ip"
  [ "$len" -le 32 ] || die "invalid prefix length in '$addr'"
  [ -z "$gw" ] || check_ipv4 "$gw"
  require_bed "$name"
  nsx "${name}-c" ip addr flush dev "${name}-c0"
  nsx "${name}-c" ip addr add "$addr" dev "${name}-c0"
  if [ -n "$gw" ]; then
    nsx "${name}-c" ip route replace default via "$gw"
  fi
  nsx "${name}-c" ip neigh flush all
  echo "CLIENT_IP=$ip"
}

# A second appliance namespace on the same switch (built like NAME-lb in `up`) and a
# kernel veth link between the two appliance namespaces for session sync.
SYNC1_IP="198.19.0.1"
SYNC2_IP="198.19.0.2"
cmd_lb2() {
  local name="$1"
  require_bed "$name"
  ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "${name}-lb" ||
    die "test bed '$name' has no ${name}-lb"
  if ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "${name}-lb2"; then
    die "test bed '$name' already has ${name}-lb2"
  fi
  appliance_namespace "$name" "${name}-lb2" "${name}-lb2v" "${name}-plb2"
  ip link add "${name}-s1" netns "${name}-lb" type veth peer name "${name}-s2" netns "${name}-lb2"
  offloads_off "${name}-lb" "${name}-s1"
  offloads_off "${name}-lb2" "${name}-s2"
  nsx "${name}-lb" ip addr add "${SYNC1_IP}/24" dev "${name}-s1"
  nsx "${name}-lb2" ip addr add "${SYNC2_IP}/24" dev "${name}-s2"
  nsx "${name}-lb" ip link set "${name}-s1" up
  nsx "${name}-lb2" ip link set "${name}-s2" up

  echo "LB2_NS=${name}-lb2"
  echo "LB2_IF=${name}-lb2v"
  echo "LB2_MAC=$(mac_of "${name}-lb2" "${name}-lb2v")"
  echo "SYNC1_IF=${name}-s1"
  echo "SYNC1_IP=$SYNC1_IP"
  echo "SYNC2_IF=${name}-s2"
  echo "SYNC2_IP=$SYNC2_IP"
}

main() {
  [ $# -ge 2 ] || usage
  local cmd="$1" name="$2"
  check_name "$name"
  case "$cmd" in
    up)
      [ $# -le 3 ] || usage
      need_root
      cmd_up "$name" "${3:-0}"
      ;;
    down)
      [ $# -eq 2 ] || usage
      need_root
      cmd_down "$name"
      ;;
    status)
      [ $# -eq 2 ] || usage
      need_root
      cmd_status "$name"
      ;;
    dr-vip)
      [ $# -ge 3 ] || usage
      need_root
      shift 2
      cmd_dr_vip "$name" "$@"
      ;;
    rs-gateway)
      [ $# -eq 3 ] || usage
      need_root
      cmd_rs_gateway "$name" "$3"
      ;;
    client-addr)
      [ $# -eq 3 ] || [ $# -eq 4 ] || usage
      need_root
      cmd_client_addr "$name" "$3" "${4:-}"
      ;;
    lb2)
      [ $# -eq 2 ] || usage
      need_root
      cmd_lb2 "$name"
      ;;
    *) usage ;;
  esac
}

main "$@"
