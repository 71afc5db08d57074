#!/bin/sh
# Two simulated hosts on this machine: network namespaces PREFIX0 and PREFIX1 joined by a veth pair,
# with the test addresses 10.231.0.1/24 (host 0) and 10.231.0.2/24 (host 1). Needs root (CAP_NET_ADMIN)
# and iproute2. Undo with scripts/netns_teardown.sh PREFIX.
#
#   scripts/netns_setup.sh vnpu-host      # creates vnpu-host0, vnpu-host1
#   then one torchrun per namespace, with --rdzv-conf is_host=... and --local-addr (the command and why:
#   docs/distributed.md, "Two hosts")
#
# Each namespace has its own loopback and one interface, PREFIX<i>-v; processes in the two namespaces
# reach each other only over the veth pair (TCP), as two hosts would. vccl treats processes in different
# network namespaces as different hosts, so it moves data with Gloo over TCP between them.
set -eu
PREFIX=${1:-vnpu-host}
SUBNET=${2:-10.231.0}
for i in 0 1; do
  ip netns add "${PREFIX}$i"
  ip netns exec "${PREFIX}$i" ip link set lo up
done
ip link add "${PREFIX}0-v" type veth peer name "${PREFIX}1-v"
for i in 0 1; do
  ip link set "${PREFIX}$i-v" netns "${PREFIX}$i"
  ip netns exec "${PREFIX}$i" ip addr add "${SUBNET}.$((i + 1))/24" dev "${PREFIX}$i-v"
  ip netns exec "${PREFIX}$i" ip link set "${PREFIX}$i-v" up
done
# wait until both ends report carrier (the link comes up asynchronously)
for _ in $(seq 1 50); do
  if ip netns exec "${PREFIX}0" ip link show "${PREFIX}0-v" | grep -q LOWER_UP &&
     ip netns exec "${PREFIX}1" ip link show "${PREFIX}1-v" | grep -q LOWER_UP; then exit 0; fi
  sleep 0.1
done
echo "netns_setup: the veth pair ${PREFIX}0-v/${PREFIX}1-v did not come up" >&2
exit 1
