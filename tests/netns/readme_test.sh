#!/usr/bin/env bash
# The README's first commands, as written: the first `build/daemon/endpointd run` line of the
# README runs (in a network namespace and a mount namespace with its own /run, both made here)
# until /readyz, logs that it has no peer port, and `build/daemon/endpointd status` shows it;
# the same on examples/cluster (two nodes) refuses to start and says what to pass.
# Usage: readme_test.sh BUILD_DIR SOURCE_ROOT
set -euo pipefail
[ "$(id -u)" -eq 0 ] || { echo "readme: needs root (skipped)"; exit 77; }
build=$(cd "$1" && pwd)
cd "$2"
ns=epd-$$-readme
work=$(mktemp -d)
cleanup() {
  [ -n "${pid:-}" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null || true
  ip netns del "$ns" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "readme: $*"; cat "$work/log" 2>/dev/null || true; exit 1; }
run_line=$(grep -m1 '^build/daemon/endpointd run ' README.md) || fail "no 'build/daemon/endpointd run' line in README.md"
status_line=$(grep -m1 '^build/daemon/endpointd status' README.md | sed 's/ *#.*//') || fail "no status line"
echo "readme: $run_line"
# The README's build/ is this build directory.
as_written() { echo "${1/build\/daemon\/endpointd/$build/daemon/endpointd}"; }
ip netns add "$ns"
ip -n "$ns" link set lo up
# Its own /run: the default drain socket (/run/endpointd/drain.sock) stays in it.
in_ns() { ip netns exec "$ns" unshare -m sh -c 'mount -t tmpfs tmpfs /run && exec "$@"' sh "$@"; }
# In a subshell that becomes the agent (exec all the way down), so that $pid is the agent
# itself: a backgrounded function is a subshell of its own, and killing it left the agent
# running after the test.
# shellcheck disable=SC2046 # the line is split into words as a shell would
(exec ip netns exec "$ns" unshare -m sh -c 'mount -t tmpfs tmpfs /run && exec "$@"' sh \
  $(as_written "$run_line")) >"$work/log" 2>&1 &
pid=$!
for _ in $(seq 100); do
  ip netns exec "$ns" curl -fs --max-time 1 http://127.0.0.1:10249/readyz >/dev/null 2>&1 && break
  kill -0 "$pid" 2>/dev/null || fail "exited"
  sleep 0.1
done
ip netns exec "$ns" curl -fs --max-time 1 http://127.0.0.1:10249/readyz >/dev/null || fail "not ready"
grep -q 'no peer port' "$work/log" || fail "no log line saying it runs without the peer port"
# shellcheck disable=SC2046
ip netns exec "$ns" $(as_written "$status_line") >"$work/status" || fail "status exited $?"
grep -q '^Peers: .*no peer port' "$work/status" || { cat "$work/status"; fail "status does not say there is no peer port"; }
kill "$pid"
wait "$pid" 2>/dev/null || true
pid=

# Two nodes named: a refusal that says what to pass.
rc=0
in_ns "$build/daemon/endpointd" run --source-dir examples/cluster --node-name node-a >"$work/log" 2>&1 || rc=$?
[ "$rc" -eq 1 ] || fail "examples/cluster without peer TLS: exit $rc, want 1"
grep -q 'scripts/peer-certs --dir PKI node-a node-b' "$work/log" || fail "the error does not name scripts/peer-certs"
grep -q -- '--drain-peer-ca PKI/ca.crt --drain-peer-cert PKI/node-a.crt --drain-peer-key PKI/node-a.key' "$work/log" ||
  fail "the error does not say which flags"
echo "readme: ok"
