#!/bin/sh
# Removes the namespaces (and with them the veth pair) made by scripts/netns_setup.sh PREFIX.
PREFIX=${1:-vnpu-host}
for i in 0 1; do
  ip netns pids "${PREFIX}$i" 2>/dev/null | xargs -r kill 2>/dev/null
  ip netns del "${PREFIX}$i" 2>/dev/null
done
exit 0
