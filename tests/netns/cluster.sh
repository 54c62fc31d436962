#!/usr/bin/env bash
# Makes (up) or removes (down) the 2-node namespace cluster of examples/cluster, the same
# layout tests/netns/cluster.cc builds, for scripts/demo and for poking around by hand:
#
#   client 192.168.77.100 ── bridge ns (br0) ── node-a 192.168.77.2, node-b 192.168.77.3
#   node-a ── web-1 10.244.1.10, web-2 10.244.1.11, db-1 10.244.1.20
#   node-b ── web-3 10.244.2.10, db-0 10.244.2.20
#
# Namespaces are named "$PREFIX-<what>" (PREFIX defaults to epd-demo): $PREFIX-br,
# $PREFIX-client, $PREFIX-node-a, $PREFIX-web-1, ... Every address lives inside them.
#   cluster.sh up [PREFIX]     build it (removes a leftover one of the same prefix first)
#   cluster.sh down [PREFIX]   remove every namespace named PREFIX-*
#   cluster.sh list [PREFIX]   show the namespaces
set -euo pipefail

cmd=${1:-}
prefix=${2:-epd-demo}
service_cidr=10.96.0.0/12

nodes=(node-a node-b)
declare -A node_ip=([node-a]=192.168.77.2 [node-b]=192.168.77.3)
declare -A node_net=([node-a]=10.244.1 [node-b]=10.244.2)
declare -A node_pods=([node-a]="web-1:10 web-2:11 db-1:20" [node-b]="web-3:10 db-0:20")

down() {
  local ns
  for ns in $(ip netns list | awk '{print $1}' | grep -E "^${prefix}-" || true); do
    # Processes inside die with SIGKILL first so nothing keeps the namespace alive.
    ip netns pids "$ns" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns delete "$ns"
  done
}

up() {
  down
  trap 'echo "cluster.sh: setup failed; removing what was made" >&2; down' ERR
  local br=$prefix-br
  ip netns add "$br"
  ip -n "$br" link set lo up
  ip -n "$br" link add br0 type bridge
  ip -n "$br" link set br0 up

  attach() {  # ns bridge-port ip
    ip -n "$1" link add eth0 type veth peer name "$2" netns "$br"
    ip -n "$br" link set "$2" master br0 up
    ip -n "$1" addr add "$3/24" dev eth0
    ip -n "$1" link set eth0 up
  }

  local client=$prefix-client
  ip netns add "$client"
  ip -n "$client" link set lo up
  attach "$client" c0 192.168.77.100
  # The client closes first (the test server waits for it); it reuses its TIME-WAIT ports
  # after a second, as a busy client host does (tests/netns/cluster.cc says why).
  ip netns exec "$client" sysctl -qw net.ipv4.tcp_tw_reuse=1

  local i=0 n other p name last j
  for n in "${nodes[@]}"; do
    local ns=$prefix-$n
    ip netns add "$ns"
    ip -n "$ns" link set lo up
    attach "$ns" "n$i" "${node_ip[$n]}"
    ip netns exec "$ns" sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.all.rp_filter=0 \
      net.ipv4.conf.default.rp_filter=0
    ip -n "$ns" route add "$service_cidr" dev eth0
    for other in "${nodes[@]}"; do
      [ "$other" = "$n" ] || ip -n "$ns" route add "${node_net[$other]}.0/24" via "${node_ip[$other]}"
    done
    j=0
    for p in ${node_pods[$n]}; do
      name=${p%%:*}
      last=${p##*:}
      local pns=$prefix-$name
      ip netns add "$pns"
      ip -n "$pns" link set lo up
      ip -n "$ns" link add "p$j" type veth peer name eth0 netns "$pns"
      ip -n "$ns" addr add "${node_net[$n]}.1/32" dev "p$j"
      ip -n "$ns" link set "p$j" up
      ip -n "$ns" route add "${node_net[$n]}.$last/32" dev "p$j"
      ip -n "$pns" addr add "${node_net[$n]}.$last/32" dev eth0
      ip -n "$pns" link set eth0 up
      ip -n "$pns" route add "${node_net[$n]}.1" dev eth0 scope link
      ip -n "$pns" route add default via "${node_net[$n]}.1" dev eth0
      j=$((j + 1))
    done
    ip -n "$client" route add "${node_net[$n]}.0/24" via "${node_ip[$n]}"
    i=$((i + 1))
  done
  ip -n "$client" route add "$service_cidr" via "${node_ip[node-a]}"
  trap - ERR
  echo "cluster.sh: up ($prefix-*)"
}

case "$cmd" in
  up) up ;;
  down) down ;;
  list) ip netns list | awk '{print $1}' | grep -E "^${prefix}-" || true ;;
  *) echo "usage: $0 up|down|list [PREFIX]" >&2; exit 2 ;;
esac
