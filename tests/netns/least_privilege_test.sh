#!/usr/bin/env bash
# The chart's capability set is enough: `endpointd run` with only CAP_NET_ADMIN (the bounding
# set of every other capability dropped, as the chart's securityContext does) programs its
# nftables table, serves its admin port and its drain socket, in a network
# namespace this test makes. Usage: least_privilege_test.sh ENDPOINTD_BIN SOURCE_ROOT
set -euo pipefail
[ "$(id -u)" -eq 0 ] || { echo "least privilege: needs root (skipped)"; exit 77; }
bin=$1
root=$2
ns=epd-$$-caps
work=$(mktemp -d)
cleanup() {
  [ -n "${pid:-}" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  ip netns del "$ns" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
ip netns add "$ns"
ip -n "$ns" link set lo up
cp -r "$root/examples/cluster" "$work/manifests"
caps=${ENDPOINTD_TEST_CAPS-+net_admin}  # what the chart adds (a test of the test: set it empty)
ip netns exec "$ns" setpriv --bounding-set "-all${caps:+,$caps}" -- "$bin" run \
  --source-dir "$work/manifests" --dataplane nftables --node-name node-a \
  --cluster-cidr 10.244.0.0/16 --admin-listen 127.0.0.1:10249 \
  --drain-socket "$work/drain.sock" --drain-peer-listen "" >"$work/log" 2>&1 &
pid=$!
for _ in $(seq 100); do
  ip netns exec "$ns" curl -fs --max-time 1 http://127.0.0.1:10249/readyz >/dev/null 2>&1 && break
  sleep 0.1
done
fail() { echo "least privilege: $*"; cat "$work/log"; exit 1; }
ip netns exec "$ns" curl -fs --max-time 1 http://127.0.0.1:10249/readyz >/dev/null || fail "not ready"
# Its effective capabilities: CAP_NET_ADMIN (bit 12) and nothing else.
eff=$(awk '/^CapEff/ {print $2}' "/proc/$pid/status")
[ "$((16#$eff))" -eq $((1 << 12)) ] || fail "CapEff $eff, want only CAP_NET_ADMIN (0x1000)"
# The service table is in the kernel (within 5 s).
# (The listing goes to a variable: with pipefail, `nft | grep -q` fails when grep stops early.)
table=""
for _ in $(seq 50); do
  table=$(ip netns exec "$ns" nft list table ip endpointd 2>/dev/null || true)
  [[ $table == *10.96.0.10* ]] && break
  sleep 0.1
done
[[ $table == *10.96.0.10* ]] || fail "no nftables rules"
# The drain socket answers (a caller that is no pod is refused, by name).
out=$(ip netns exec "$ns" sh -c 'mount --bind -o ro "$0" "$0" && exec "$@"' "$work" \
  "$bin" prestop --drain-socket "$work/drain.sock" --timeout 5s 2>&1) && fail "released a non-pod: $out"
echo "$out" | grep -q refused || fail "prestop from outside a pod: $out"
echo "least privilege: ok (CapEff $eff)"
