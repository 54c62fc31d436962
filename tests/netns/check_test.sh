#!/usr/bin/env bash
# `endpointd check` with the real nftables probe, in a network namespace this test makes: it
# passes and leaves no table behind; without CAP_NET_ADMIN (the bounding set dropped, as a
# securityContext that forgot it) the nftables line fails, saying what to add, and the exit
# status is 1. Usage: check_test.sh ENDPOINTD_BIN SOURCE_ROOT
set -euo pipefail
[ "$(id -u)" -eq 0 ] || { echo "check: needs root (skipped)"; exit 77; }
bin=$1
root=$2
ns=epd-$$-check
work=$(mktemp -d)
cleanup() {
  ip netns del "$ns" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
ip netns add "$ns"
ip netns exec "$ns" sysctl -qw net.ipv4.ip_forward=1
fail() { echo "check: $*"; cat "$work/out"; exit 1; }
args=(check --source-dir "$root/examples/cluster" --node-name node-a --drain-socket "$work/drain.sock")

rc=0
ip netns exec "$ns" "$bin" "${args[@]}" >"$work/out" 2>&1 || rc=$?
[ "$rc" -eq 0 ] || fail "exit $rc in a namespace with nftables, want 0"
grep -q '^ok    nftables ' "$work/out" || fail "no ok nftables line"
tables=$(ip netns exec "$ns" nft list tables)
[ -z "$tables" ] || fail "tables left behind: $tables"

rc=0
ip netns exec "$ns" setpriv --bounding-set -net_admin -- "$bin" "${args[@]}" >"$work/out" 2>&1 || rc=$?
[ "$rc" -eq 1 ] || fail "exit $rc without CAP_NET_ADMIN, want 1"
grep -q '^FAIL  nftables .*Operation not permitted' "$work/out" || fail "no FAIL nftables line"
grep -q 'CAP_NET_ADMIN' "$work/out" || fail "the failure does not say to add CAP_NET_ADMIN"
grep -q '^ok    drain socket' "$work/out" || fail "other checks did not run"

# --dataplane none asks nothing of nftables, so the same process passes.
ip netns exec "$ns" setpriv --bounding-set -net_admin -- "$bin" "${args[@]}" --dataplane none \
  >"$work/out" 2>&1 || fail "--dataplane none without CAP_NET_ADMIN failed"
grep -q '^skip  nftables' "$work/out" || fail "no skip nftables line"
echo "check: ok"
