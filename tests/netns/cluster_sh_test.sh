#!/usr/bin/env bash
# Test of cluster.sh: up makes the 2-node layout (pod to pod across nodes, client to pods),
# down removes every namespace it made. The prefix carries this shell's pid so the harness's
# sweeper also removes the namespaces if this test is killed midway.
set -euo pipefail
here=$(dirname "$0")
prefix=epd-$$-sh
trap '"$here/cluster.sh" down "$prefix"' EXIT
"$here/cluster.sh" up "$prefix"
[ "$("$here/cluster.sh" list "$prefix" | wc -l)" -eq 9 ]
ip netns exec "$prefix-web-1" ping -c1 -W2 10.244.2.20 >/dev/null
ip netns exec "$prefix-web-3" ping -c1 -W2 10.244.1.11 >/dev/null
ip netns exec "$prefix-client" ping -c1 -W2 10.244.2.10 >/dev/null
"$here/cluster.sh" down "$prefix"
[ -z "$("$here/cluster.sh" list "$prefix")" ]
echo "cluster.sh: ok"
