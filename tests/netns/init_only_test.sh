#!/usr/bin/env bash
# `endpointd run --init-only` writes the conntrack settings and exits, so that the agent can run
# where /proc/sys is read-only (an unprivileged container) with only CAP_NET_ADMIN: it finds
# the values in place and writes nothing. The settings used are per network namespace
# (nf_conntrack_udp_timeout, _udp_timeout_stream), in one this test makes. Control: the agent
# asked for another value under the read-only /proc/sys refuses to start, naming the setting.
# Usage: init_only_test.sh ENDPOINTD_BIN SOURCE_ROOT
set -euo pipefail
[ "$(id -u)" -eq 0 ] || { echo "init-only: needs root (skipped)"; exit 77; }
bin=$1
root=$2
ns=epd-$$-init
work=$(mktemp -d)
cleanup() {
  # Every process in the namespace (the agent runs under ip netns exec, unshare and setpriv:
  # the background job's pid is only the first of them).
  ip netns pids "$ns" 2>/dev/null | xargs -r kill 2>/dev/null || true
  [ -n "${pid:-}" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  ip netns del "$ns" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "init-only: $*"; [ -f "$work/log" ] && cat "$work/log"; exit 1; }
ip netns add "$ns"
ip -n "$ns" link set lo up
cp -r "$root/examples/cluster" "$work/manifests"
modprobe nf_conntrack 2>/dev/null || true
sysctl_file=/proc/sys/net/netfilter/nf_conntrack_udp_timeout
ip netns exec "$ns" test -w "$sysctl_file" || { echo "init-only: no $sysctl_file (skipped)"; exit 77; }
# Values nobody has by default, so that each write is seen.
before=$(ip netns exec "$ns" cat "$sysctl_file")
want=47
[ "$before" != "$want" ] || want=48

# 1. The init container: full privileges, writes the values, exits 0 without serving anything.
out=$(ip netns exec "$ns" timeout 10 "$bin" run --init-only --conntrack-udp-timeout "${want}s" \
  --conntrack-udp-timeout-stream 133s --admin-listen 127.0.0.1:10249 2>&1) ||
  fail "--init-only failed: $out"
[[ $out == *"nf_conntrack_udp_timeout=$want (was $before)"* ]] || fail "--init-only did not name the value: $out"
got=$(ip netns exec "$ns" cat "$sysctl_file")
[ "$got" = "$want" ] || fail "nf_conntrack_udp_timeout is $got after --init-only, want $want"
[ "$(ip netns exec "$ns" cat /proc/sys/net/netfilter/nf_conntrack_udp_timeout_stream)" = 133 ] ||
  fail "nf_conntrack_udp_timeout_stream not written"
# Nothing was programmed: no table, no listener left behind.
ip netns exec "$ns" nft list table ip endpointd >/dev/null 2>&1 && fail "--init-only made the table"
out2=$(ip netns exec "$ns" "$bin" run --init-only --conntrack-udp-timeout "${want}s" 2>&1) ||
  fail "second --init-only failed: $out2"
[[ $out2 == *"0 conntrack settings written"* ]] || fail "second --init-only wrote again: $out2"

# The agent as the chart runs it unprivileged: only CAP_NET_ADMIN, /proc/sys read-only.
agent() {
  ip netns exec "$ns" unshare --mount sh -c \
    'mount --bind -o ro /proc/sys /proc/sys && exec "$@"' sh \
    setpriv --bounding-set -all,+net_admin -- "$bin" run \
    --source-dir "$work/manifests" --dataplane nftables --node-name node-a \
    --cluster-cidr 10.244.0.0/16 --admin-listen 127.0.0.1:10249 \
    --drain-socket "$work/drain.sock" --drain-peer-listen "" "$@"
}

# 2. Control: a value not in place cannot be written there, and the start stops naming it.
if agent --conntrack-udp-timeout 49s >"$work/log" 2>&1; then
  fail "the agent started with a setting it could not write"
fi
grep -q "nf_conntrack_udp_timeout" "$work/log" || fail "the refusal does not name the setting"
[ "$(ip netns exec "$ns" cat "$sysctl_file")" = "$want" ] || fail "the read-only /proc/sys was written"

# 3. The values in place: the agent starts, writes nothing, and is ready.
agent --conntrack-udp-timeout "${want}s" --conntrack-udp-timeout-stream 133s >"$work/log" 2>&1 &
pid=$!
for _ in $(seq 100); do
  ip netns exec "$ns" curl -fs --max-time 1 http://127.0.0.1:10249/readyz >/dev/null 2>&1 && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
ip netns exec "$ns" curl -fs --max-time 1 http://127.0.0.1:10249/readyz >/dev/null ||
  fail "the agent did not become ready over the values --init-only wrote"
echo "init-only: ok (nf_conntrack_udp_timeout $before -> $want, the agent ready under a read-only /proc/sys)"
