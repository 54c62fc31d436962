#!/usr/bin/env bash
# The chart's pods, run as the kubelet runs them: the DaemonSet rendered by `helm template`,
# turned into podman command lines by podman_flags.py (every field translated or refused by
# name), run from the image scripts/image builds, on a cluster of network namespaces
# (tests/netns/cluster.sh) against the fake API server over TLS with the projected token and CA
# at the in-cluster paths. node-a runs the chart's default values, node-b DNS + feed +
# node-local DNS. In order:
#   - the nodes start with kube-proxy's rules (nftables table and iptables-nft chains) carrying a
#     ClusterIP; the swap out (README "Swapping kube-proxy out") under load, 0 failed;
#   - `endpointd check` in each agent's pod; the probes on the ports the chart names; traffic
#     through a ClusterIP and a NodePort; node-local DNS; the feed listening;
#   - the agent's privileges as the chart says (user, capabilities, read-only root, seccomp,
#     no-new-privileges); `podman restart` of the agent under load, 0 failed;
#   - the chart's example nginx workload rolled under wrk and new connections, preStop
#     `endpointd prestop` before SIGTERM, 0 failed, every drain's timeline;
#   - each capability the chart adds shown necessary (a fresh node without it is never ready);
#   - bad input: a binary missing a library, no token at the in-cluster path, a pod spec field
#     the translator cannot honour;
#   - the swap back under load, 0 failed, no endpointd table left.
#
#   pod_test.sh REPO BUILD_DIR
# Exit 77 (a ctest skip) when not root or podman cannot run containers here, saying why.
set -euo pipefail

repo=$(cd "$1" && pwd)
build=$(cd "$2" && pwd)
bin=$build/daemon/endpointd
server=$build/tests/netns/endpointd-testserver
client=$build/tests/netns/endpointd-loadclient
fakeapi=$build/tests/fakeapi/endpointd-fakeapi
flags=$repo/tests/pod/podman_flags.py
prefix=epd-pod
image=endpointd:0.1.0-test
cache=$build/image-cache
export CONTAINERS_CONF=$cache/containers.conf

skip() { echo "SKIP: tests/pod: $*"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }
step() { echo; echo "== $*"; }
[ "$(id -u)" -eq 0 ] || skip "needs root (rootful podman, network namespaces)"
command -v podman >/dev/null || skip "podman is not installed (apt-get install podman runc debootstrap; .ci/run installs them)"
command -v iptables-nft >/dev/null || skip "iptables-nft is not installed (Debian's iptables; .ci/run installs it): kube-proxy's chains cannot be loaded"
command -v runc >/dev/null || skip "runc is not installed (podman here needs Debian's runc: crun refuses hybrid cgroups)"
helm=${HELM:-}
for h in "$(command -v helm 2>/dev/null)" "${ENDPOINTD_TOOLS:-/opt/endpointd-tools}/bin/helm"; do
  [ -z "$helm" ] && [ -n "$h" ] && [ -x "$h" ] && helm=$h
done
[ -n "$helm" ] || fail "helm not found (scripts/setup installs it)"

work=$(mktemp -d /tmp/endpointd-pod.XXXXXX)
pids=()
cleanup() {
  local rc=$?
  podman ps -a --format '{{.Names}}' 2>/dev/null | grep "^$prefix-" | xargs -r podman rm -f -t 0 >/dev/null 2>&1 || true
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  "$repo/tests/netns/cluster.sh" down "$prefix" >/dev/null 2>&1 || true
  if [ $rc -ne 0 ] && [ $rc -ne 77 ]; then
    for f in "$work"/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -25 "$f"; }; done
  fi
  rm -rf "$work"
  exit $rc
}
trap cleanup EXIT
in_ns() { local ns=$1; shift; ip netns exec "$prefix-$ns" "$@"; }

"$repo/scripts/image" --setup-only --cache "$cache" --quiet || fail "scripts/image --setup-only failed"
# A run killed before its cleanup leaves containers; they go now.
podman ps -a --format '{{.Names}}' | grep "^$prefix-" | xargs -r podman rm -f -t 0 >/dev/null 2>&1 || true
# Can podman start a container here at all? A root file system of /bin/true and its libraries
# answers before any image is built.
mkdir -p "$work/probe-root/bin"
cp /bin/true "$work/probe-root/bin/"
for lib in $(ldd /bin/true | grep -o '/[^ ]*'); do
  mkdir -p "$work/probe-root$(dirname "$lib")"
  cp -L "$lib" "$work/probe-root$lib"
done
if ! err=$(podman run --rm --network none --rootfs "$work/probe-root" /bin/true 2>&1); then
  skip "podman cannot start a container on this machine: $err"
fi

step "the image (scripts/image --prebuilt: the Dockerfile's runtime stage over this build's binaries)"
t0=$(date +%s)
"$repo/scripts/image" --prebuilt "$build" --tag "$image" --cache "$cache" --quiet ||
  fail "scripts/image could not build $image"
echo "   $(( $(date +%s) - t0 )) s"
podman run --rm --network none "$image" version || fail "endpointd version does not run in $image"

step "a library the binary needs missing: scripts/image --collect names it"
mkdir -p "$work/broken"
cp "$bin" "$work/broken/endpointd"
patchelf --add-needed libendpointd-absent.so.1 "$work/broken/endpointd"
if out=$("$repo/scripts/image" --collect "$work/broken-out" "$work/broken/endpointd" 2>&1); then
  fail "--collect accepted a binary missing a library"
fi
echo "   $out"
grep -q 'libendpointd-absent.so.1' <<<"$out" || fail "--collect did not name the missing library"

step "a cluster of namespaces: node-a, node-b, pods, a client, the API server at 192.168.77.50"
"$repo/tests/netns/cluster.sh" up "$prefix" >/dev/null
attach_to_bridge() {  # ns port ip
  ip netns add "$prefix-$1"
  ip -n "$prefix-$1" link set lo up
  ip -n "$prefix-$1" link add eth0 type veth peer name "$2" netns "$prefix-br"
  ip -n "$prefix-br" link set "$2" master br0 up
  ip -n "$prefix-$1" addr add "$3/24" dev eth0
  ip -n "$prefix-$1" link set eth0 up
}
attach_to_bridge api a0 192.168.77.50
for pod in web-1 web-2 web-3; do
  in_ns "$pod" "$server" --name "$pod" --tcp 8080 --grace-ms 2000 >"$work/$pod.log" 2>&1 &
  pids+=($!)
done

# The API's TLS certificate (for its address, as the kubernetes Service's endpoint has it), the
# CA that signed it and the service account token: what the kubelet projects into the pod.
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=endpointd-test-ca -keyout "$work/ca.key" \
  -out "$work/ca.crt" 2>/dev/null
openssl req -newkey rsa:2048 -nodes -subj /CN=kube-apiserver -keyout "$work/api.key" -out "$work/api.csr" 2>/dev/null
printf 'subjectAltName=IP:192.168.77.50\nextendedKeyUsage=serverAuth\n' >"$work/api.ext"
openssl x509 -req -in "$work/api.csr" -CA "$work/ca.crt" -CAkey "$work/ca.key" -CAcreateserial -days 2 \
  -extfile "$work/api.ext" -out "$work/api.crt" 2>/dev/null
token=$(head -c 24 /dev/urandom | base64 | tr -d '/+=')
mkdir -p "$work/sa"
cp "$work/ca.crt" "$work/sa/ca.crt"
echo -n "$token" >"$work/sa/token"
echo -n kube-system >"$work/sa/namespace"
"$repo/scripts/peer-certs" --dir "$work/peer-tls" node-a node-b node-c >/dev/null

# The cluster's objects: examples/cluster, a NodePort service over web, and the agents' own
# headless Service (the chart's endpointd-peers) with both nodes' agents in it.
cp -r "$repo/examples/cluster" "$work/manifests"
cat >"$work/manifests/pod-test.yaml" <<'YAML'
apiVersion: v1
kind: Service
metadata: {name: web-np, namespace: demo, uid: 5f1c0a4e-0000-4000-8000-0000000000a1}
spec:
  type: NodePort
  clusterIP: 10.96.0.80
  clusterIPs: [10.96.0.80]
  selector: {app: web}
  ports: [{name: http, protocol: TCP, port: 80, targetPort: 8080, nodePort: 30080}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: web-np-1
  namespace: demo
  labels: {kubernetes.io/service-name: web-np}
addressType: IPv4
ports: [{name: http, protocol: TCP, port: 8080}]
endpoints:
- {addresses: [10.244.1.10], conditions: {ready: true, serving: true, terminating: false}, nodeName: node-a}
- {addresses: [10.244.1.11], conditions: {ready: true, serving: true, terminating: false}, nodeName: node-a}
- {addresses: [10.244.2.10], conditions: {ready: true, serving: true, terminating: false}, nodeName: node-b}
---
apiVersion: v1
kind: Service
metadata: {name: endpointd-peers, namespace: kube-system, uid: 5f1c0a4e-0000-4000-8000-0000000000a2}
spec:
  clusterIP: None
  selector: {app.kubernetes.io/name: endpointd}
  ports: [{name: drain-peer, protocol: TCP, port: 9465}]
---
apiVersion: discovery.k8s.io/v1
kind: EndpointSlice
metadata:
  name: endpointd-peers-1
  namespace: kube-system
  labels: {kubernetes.io/service-name: endpointd-peers}
addressType: IPv4
ports: [{name: drain-peer, protocol: TCP, port: 9465}]
endpoints:
- {addresses: [192.168.77.2], conditions: {ready: true, serving: true, terminating: false}, nodeName: node-a}
- {addresses: [192.168.77.3], conditions: {ready: true, serving: true, terminating: false}, nodeName: node-b}
YAML
in_ns api "$fakeapi" --listen 192.168.77.50:6443 --dir "$work/manifests" --token "$token" \
  --tls-cert "$work/api.crt" --tls-key "$work/api.key" --poll-ms 200 >"$work/api.port" 2>"$work/fakeapi.log" &
pids+=($!)
for _ in $(seq 100); do [ -s "$work/api.port" ] && break; sleep 0.05; done
[ -s "$work/api.port" ] || fail "the fake API server did not start"

step "helm template: node-a with the default values, node-b with DNS + feed + node-local DNS"
# Peers by mutual TLS with a pair per node (drain.peerAuth=peerTLS): the chart's default, peer
# identity, mounts a projected ServiceAccount token that podman_flags does not make yet (it
# would mint one from the fake API's TokenRequest); the identity itself is tested by
# tests/drain/peer_identity_test.cc and tests/daemon/daemon_identity_test.cc.
common_values=(--set image.tag=0.1.0-test --set apiServer.host=192.168.77.50 --set apiServer.port=6443
               --set 'clusterCIDR={10.244.0.0/16}' --set drain.peerAuth=peerTLS)
"$helm" template endpointd "$repo/helm/endpointd" -n kube-system "${common_values[@]}" >"$work/default.yaml"
"$helm" template endpointd "$repo/helm/endpointd" -n kube-system "${common_values[@]}" \
  --set dns.enabled=true --set dns.nodeLocalAddress=169.254.20.10 --set feed.enabled=true \
  --set 'dns.upstream={127.0.0.1:5399}' >"$work/dns-feed.yaml"

declare -A node_ip=([node-a]=192.168.77.2 [node-b]=192.168.77.3 [node-c]=192.168.77.9)
declare -A values=([node-a]=default [node-b]=dns-feed)
declare -A node_no=([node-a]=1 [node-b]=2 [node-c]=3)
uid_of() { printf '0d0e0000-0000-4000-8000-%012d' "${node_no[$1]}"; }
translate() {  # node values-file pod-name uid [more flags]
  local node=$1 vals=$2 name=$3 uid=$4; shift 4
  # hostPaths live under the node's root; a real node has /lib/modules (this machine has none).
  mkdir -p "$work/root-$node/lib/modules"
  python3 "$flags" "$work/$vals.yaml" --kind DaemonSet --node "$node" --pod-name "$name" \
    --pod-uid "$uid" --namespace kube-system --node-root "$work/root-$node" --work "$work/pods" \
    --netns "/run/netns/$prefix-$node" --secret "endpointd-peer-tls=$work/peer-tls" --sa-dir "$work/sa" \
    --host-ip "${node_ip[$node]}" --cluster-dns 10.96.0.53 --kubernetes-service 10.96.0.1:443 \
    --name-prefix "$prefix-" "$@"
}
# Runs a pod's containers (init containers to completion first) from podman_flags.py's JSON.
start_pod() {  # json
  python3 - "$1" <<'PY' >"$1.sh"
import json, shlex, sys
pod = json.load(open(sys.argv[1]))
for c in pod["init"]:
    print(shlex.join(c["run"][:2] + ["--rm"] + c["run"][2:]))
for c in pod["containers"]:
    print(shlex.join(c["run"][:2] + ["-d"] + c["run"][2:]) + " >/dev/null")
PY
  bash -e "$1.sh"
}
probe() {  # json kind -> HTTP status from the node, as the kubelet probes
  local node=$1 json=$2 kind=$3 h p path
  read -r h p path < <(python3 -c 'import json,sys; c=json.load(open(sys.argv[1]))["containers"][0]["probes"][sys.argv[2]]; print(c["host"], c["port"], c["path"])' "$json" "$kind")
  in_ns "$node" curl -s -o /dev/null -m 2 -w '%{http_code}' "http://$h:$p$path" || true
}
wait_ready() {  # node json seconds
  local i
  for i in $(seq $(($3 * 10))); do
    [ "$(probe "$1" "$2" readiness)" = 200 ] && return 0
    sleep 0.1
  done
  return 1
}
for node in node-a node-b; do
  translate "$node" "${values[$node]}" "endpointd-$node" "$(uid_of "$node")" >"$work/$node.json" 2>"$work/$node.translate.log" ||
    fail "$(cat "$work/$node.translate.log")"
done
echo "   the pod spec fields podman_flags.py translates (any other is refused by name):"
python3 "$flags" --fields | sed 's/^/     /'
echo "   podman run for node-a's agent, from the DaemonSet's pod template:"
python3 -c 'import json,shlex,sys; print("   " + shlex.join(json.load(open(sys.argv[1]))["containers"][0]["run"]))' "$work/node-a.json"

tally() { awk '$2=="ok"{n[$3]++} $2=="fail"{f++} END{for (b in n) printf "%s: %d  ", b, n[b]; printf "failed: %d\n", f+0}' "$1"; }
failed() { awk '$2=="fail"{f++} END{print f+0}' "$1"; }
backends() { awk '$2=="ok"{n[$3]=1} END{print length(n)}' "$1"; }

step "kube-proxy's rules in place on both nodes (its nftables table and iptables-nft chains), carrying the ClusterIP"
# What kube-proxy leaves in a node's kernel for web (10.96.0.10:80 → three pods' 8080): the
# nftables mode's table ip kube-proxy, and the iptables mode's KUBE-* chains (iptables-nft), the
# layouts of pkg/proxy/nftables and pkg/proxy/iptables for this one service.
web_eps=(10.244.1.10 10.244.1.11 10.244.2.10)
kube_proxy_nft() {
  local i vmap="" eps=""
  for i in 0 1 2; do
    [ $i -eq 0 ] || vmap+=", "
    vmap+="$i : goto endpoint-$i-demo/web/tcp/http__${web_eps[$i]}/8080"
    eps+="  chain endpoint-$i-demo/web/tcp/http__${web_eps[$i]}/8080 {
    ip saddr ${web_eps[$i]} jump mark-for-masquerade
    meta l4proto tcp dnat to ${web_eps[$i]}:8080
  }
"
  done
  cat <<NFT
table ip kube-proxy {
  comment "rules for kube-proxy"
  set cluster-ips { type ipv4_addr; comment "Active ClusterIPs"; elements = { 10.96.0.10 } }
  map no-endpoint-services { type ipv4_addr . inet_proto . inet_service : verdict; }
  map service-ips { type ipv4_addr . inet_proto . inet_service : verdict; }
  map service-nodeports { type inet_proto . inet_service : verdict; }
  chain filter-forward { type filter hook forward priority -110; ct state new jump service-endpoints-check; }
  chain filter-output { type filter hook output priority -110; ct state new jump service-endpoints-check; }
  chain nat-prerouting { type nat hook prerouting priority -100; jump services; }
  chain nat-output { type nat hook output priority -100; jump services; }
  chain nat-postrouting { type nat hook postrouting priority 100; jump masquerading; }
  chain mark-for-masquerade { meta mark set meta mark | 0x4000; }
  chain masquerading { meta mark & 0x4000 == 0 return; meta mark set meta mark ^ 0x4000; masquerade fully-random; }
  chain services {
    ip daddr . meta l4proto . th dport vmap @service-ips
    fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports
  }
  chain service-endpoints-check { ip daddr . meta l4proto . th dport vmap @no-endpoint-services; }
  chain service-demo/web/tcp/http {
    ip daddr 10.96.0.10 tcp dport 80 ip saddr != 10.244.0.0/16 jump mark-for-masquerade
    numgen random mod 3 vmap { $vmap }
  }
$eps}
add element ip kube-proxy service-ips { 10.96.0.10 . tcp . 80 : goto service-demo/web/tcp/http }
NFT
}
kube_proxy_iptables() {
  cat <<IPT
*nat
:KUBE-SERVICES - [0:0]
:KUBE-POSTROUTING - [0:0]
:KUBE-MARK-MASQ - [0:0]
:KUBE-SVC-WEBDEMO - [0:0]
:KUBE-SEP-WEB1 - [0:0]
:KUBE-SEP-WEB2 - [0:0]
:KUBE-SEP-WEB3 - [0:0]
-A PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES
-A POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING
-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000
-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN
-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0
-A KUBE-POSTROUTING -m comment --comment "kubernetes service traffic requiring SNAT" -j MASQUERADE --random-fully
-A KUBE-SERVICES -d 10.96.0.10/32 -p tcp -m comment --comment "demo/web:http cluster IP" -m tcp --dport 80 -j KUBE-SVC-WEBDEMO
-A KUBE-SVC-WEBDEMO ! -s 10.244.0.0/16 -d 10.96.0.10/32 -p tcp -m tcp --dport 80 -j KUBE-MARK-MASQ
-A KUBE-SVC-WEBDEMO -m statistic --mode random --probability 0.33333333349 -j KUBE-SEP-WEB1
-A KUBE-SVC-WEBDEMO -m statistic --mode random --probability 0.50000000000 -j KUBE-SEP-WEB2
-A KUBE-SVC-WEBDEMO -j KUBE-SEP-WEB3
-A KUBE-SEP-WEB1 -s 10.244.1.10/32 -j KUBE-MARK-MASQ
-A KUBE-SEP-WEB1 -p tcp -m tcp -j DNAT --to-destination 10.244.1.10:8080
-A KUBE-SEP-WEB2 -s 10.244.1.11/32 -j KUBE-MARK-MASQ
-A KUBE-SEP-WEB2 -p tcp -m tcp -j DNAT --to-destination 10.244.1.11:8080
-A KUBE-SEP-WEB3 -s 10.244.2.10/32 -j KUBE-MARK-MASQ
-A KUBE-SEP-WEB3 -p tcp -m tcp -j DNAT --to-destination 10.244.2.10:8080
COMMIT
IPT
}
# kube-proxy's own start (its DaemonSet's pod on the node) writes these; here they are loaded.
kube_proxy_start() {  # node
  kube_proxy_nft | in_ns "$1" nft -f - || fail "kube-proxy's nftables layout did not load on $1"
  kube_proxy_iptables | in_ns "$1" iptables-nft-restore --noflush || fail "kube-proxy's iptables chains did not load on $1"
}
# What `kube-proxy --cleanup` removes: its nftables tables, and its iptables chains with the
# jumps to them.
kube_proxy_cleanup() {  # node
  in_ns "$1" nft delete table ip kube-proxy 2>/dev/null || true
  in_ns "$1" nft delete table ip6 kube-proxy 2>/dev/null || true
  in_ns "$1" iptables-nft -t nat -D PREROUTING -m comment --comment "kubernetes service portals" -j KUBE-SERVICES 2>/dev/null || true
  in_ns "$1" iptables-nft -t nat -D OUTPUT -m comment --comment "kubernetes service portals" -j KUBE-SERVICES 2>/dev/null || true
  in_ns "$1" iptables-nft -t nat -D POSTROUTING -m comment --comment "kubernetes postrouting rules" -j KUBE-POSTROUTING 2>/dev/null || true
  local chains c
  chains=$(in_ns "$1" iptables-nft -t nat -S | awk '$1 == "-N" && $2 ~ /^KUBE-/ {print $2}')
  for c in $chains; do in_ns "$1" iptables-nft -t nat -F "$c"; done
  for c in $chains; do in_ns "$1" iptables-nft -t nat -X "$c"; done
}
kube_proxy_rules() {  # node -> what of kube-proxy's is in the kernel
  { in_ns "$1" nft list tables | grep -w kube-proxy; in_ns "$1" iptables-nft -t nat -S | grep -c KUBE- | sed 's/$/ iptables rules and chains KUBE-*/'; } | tr '\n' ' '
}
for node in node-a node-b; do kube_proxy_start "$node"; echo "   $node: $(kube_proxy_rules "$node")"; done
in_ns client "$client" --target 10.96.0.10:80 --mode new --count 60 --out "$work/kube-proxy.out" >/dev/null
echo "   ClusterIP through kube-proxy's rules alone: $(tally "$work/kube-proxy.out")"
[ "$(failed "$work/kube-proxy.out")" = 0 ] && [ "$(backends "$work/kube-proxy.out")" = 3 ] ||
  fail "kube-proxy's rules do not carry the ClusterIP: $(tally "$work/kube-proxy.out")"

step "the swap: README's \"Swapping kube-proxy out\" commands as written, under load through the ClusterIP"
# Load through a service while something happens: new connections (2 workers) and wrk keep-alive
# connections, until load_stop ends them with a signal (both report what they did; a machine
# slower today does not cut a step's load short).
load_start() {  # name ip:port wrk-connections (ip netns exec execs: $! is the load tool itself)
  ip netns exec "$prefix-client" "$client" --target "$2" --mode new --concurrency 2 --duration-ms 600000 \
    --interval-ms 5 --out "$work/$1-new.out" >/dev/null &
  load_new=$!
  ip netns exec "$prefix-client" wrk -t 1 -c "$3" -d 600s --timeout 3s "http://$2/" >"$work/$1-wrk.out" 2>&1 &
  load_wrk=$!
  sleep 1
}
load_stop() {  # name what -> fails on any failed request
  sleep 1  # a second of load after the last step
  kill -TERM $load_new
  kill -INT $load_wrk
  wait $load_new || true
  wait $load_wrk || true
  local wrk_errors
  wrk_errors=$(grep -E 'Socket errors|Non-2xx' "$work/$1-wrk.out" | tr -s ' ' || true)
  grep -qE '[0-9]+ requests in' "$work/$1-wrk.out" || fail "wrk did not report during $2: $(cat "$work/$1-wrk.out")"
  # A request the stopping signal interrupted fails with EINTR in the load client: not the
  # network's doing, so not counted (and said).
  local cut
  cut=$(awk '$2 == "fail" && $3 ~ /EINTR/' "$work/$1-new.out" | wc -l)
  sed -i '/ fail [^ ]*EINTR/d' "$work/$1-new.out"
  awk '$2 == "fail"' "$work/$1-new.out" | head -5 | sed 's/^/   failed: /'
  echo "   under $2: new connections $(tally "$work/$1-new.out") (and $cut cut by the stop); wrk ($(awk '/connections$/{print $4}' "$work/$1-wrk.out") keep-alive connections) $(grep -Eo '[0-9]+ requests in [0-9.]+[a-z]+' "$work/$1-wrk.out"), ${wrk_errors:-no socket errors, no non-2xx responses}"
  [ "$(failed "$work/$1-new.out")" = 0 ] || fail "requests failed during $2"
  [ -z "$wrk_errors" ] || fail "wrk saw errors during $2: $wrk_errors"
}
# README's "Swapping kube-proxy out" commands, run as written: its two sh blocks (out, back),
# a line naming node/NODE once per node. kubectl and helm are the functions below, which do on
# this cluster what the commands do on a real one; the README's example API server address
# gives way to this cluster's (apiServer.host is the user's own value), and its image tag to
# the one built for this test.
python3 - "$repo/README.md" "$work/swap" <<'PY' || fail "README's swap section: no two sh blocks"
import re, sys
text = open(sys.argv[1]).read()
start = text.index("### Swapping kube-proxy out")
end = text.find("\n## ", start)
blocks = re.findall(r"```sh\n(.*?)```", text[start:end], re.S)
if len(blocks) != 2:
    sys.exit(1)
for name, block in zip(("out", "back"), blocks):
    with open(f"{sys.argv[2]}-{name}.sh", "w") as f:
        f.write(block.replace("\\\n", " "))
PY
cluster_values=(--set image.tag=0.1.0-test --set apiServer.host=192.168.77.50 --set apiServer.port=6443
                --set drain.peerAuth=peerTLS)
helm() {
  case "$1" in
    install)  # the DaemonSet's pod on every node (node-b: DNS + feed + node-local DNS on as well)
      local release=$2 chart=$3 node
      shift 3
      (cd "$repo" && "$helm" template "$release" "$chart" "$@" "${cluster_values[@]}") >"$work/default.yaml"
      (cd "$repo" && "$helm" template "$release" "$chart" "$@" "${cluster_values[@]}" --set dns.enabled=true \
        --set dns.nodeLocalAddress=169.254.20.10 --set feed.enabled=true --set 'dns.upstream={127.0.0.1:5399}') \
        >"$work/dns-feed.yaml"
      for node in node-a node-b; do
        translate "$node" "${values[$node]}" "endpointd-$node" "$(uid_of "$node")" >"$work/$node.json" ||
          fail "helm install: $node's pod cannot be run"
        start_pod "$work/$node.json"
      done ;;
    uninstall)  # the agents' pods go; SIGTERM, their tables stay
      for node in node-a node-b; do podman rm -f -t 30 "$prefix-endpointd-$node-endpointd" >/dev/null; done ;;
    *) fail "helm $*: not one of the swap's steps" ;;
  esac
}
kubectl() {
  local node all="$*"
  case "$all" in
    *"rollout status ds/endpointd"*)
      for node in node-a node-b; do
        wait_ready "$node" "$work/$node.json" 30 ||
          { podman logs "$prefix-endpointd-$node-endpointd" 2>&1 | tail -30; fail "$node's agent not ready in 30 s"; }
      done ;;
    *"rollout status ds/kube-proxy"*)
      for node in node-a node-b; do
        in_ns "$node" nft list tables | grep -qw kube-proxy || fail "kube-proxy's rules are not on $node"
      done ;;
    *"patch ds kube-proxy --type json"*)  # unparked: its pods are back and write their rules
      for node in node-a node-b; do kube_proxy_start "$node"; done ;;
    *"patch ds kube-proxy"*) ;;  # parked: its pods leave the nodes, their rules stay
    *"debug node/"*"-- kube-proxy --cleanup"*)
      node=${all#*node/}; node=${node%% *}
      kube_proxy_cleanup "$node" ;;
    *"debug node/"*"-- endpointd run --cleanup"*)  # --profile=sysadmin: privileged, the node's network
      node=${all#*node/}; node=${node%% *}
      podman run --rm --pull never --privileged --network "ns:/run/netns/$prefix-$node" "$image" run --cleanup \
        >"$work/cleanup-$node.log" 2>&1 || fail "endpointd run --cleanup failed on $node: $(cat "$work/cleanup-$node.log")" ;;
    *) fail "kubectl $*: not one of the swap's steps" ;;
  esac
}
run_readme_steps() {  # out|back
  local line node
  while IFS= read -r line <&3; do
    [ -n "${line// /}" ] || continue
    if [[ $line == *NODE* ]]; then
      for node in node-a node-b; do echo "   \$ ${line//NODE/$node}"; eval "${line//NODE/$node}"; done
    else
      echo "   \$ $line"
      eval "$line"
    fi
  done 3<"$work/swap-$1.sh"
}
load_start swap-out 10.96.0.10:80 8
t0=$(date +%s%N)
run_readme_steps out
echo "   done in $(( ($(date +%s%N) - t0) / 1000000 )) ms"
for node in node-a node-b; do echo "   $node after: $(kube_proxy_rules "$node")"; done
load_stop swap-out "the swap"
for node in node-a node-b; do
  [ -z "$(in_ns "$node" nft list tables | grep -w kube-proxy)" ] && ! in_ns "$node" iptables-nft -t nat -S | grep -q KUBE- ||
    fail "kube-proxy's rules are still on $node"
done

step "the probes, on the port the chart names"
for node in node-a node-b; do
  for kind in liveness readiness; do
    code=$(probe "$node" "$work/$node.json" "$kind")
    read -r h p path < <(python3 -c 'import json,sys; c=json.load(open(sys.argv[1]))["containers"][0]["probes"][sys.argv[2]]; print(c["host"], c["port"], c["path"])' "$work/$node.json" "$kind")
    echo "   $node $kind http://$h:$p$path → $code"
    [ "$code" = 200 ] || fail "$node's $kind probe answered $code"
  done
done


step "endpointd check in each agent's pod, with the pod's own arguments (run → check)"
for node in node-a node-b; do
  mapfile -t check_args < <(python3 -c '
import json, sys
run = json.load(open(sys.argv[1]))["containers"][0]["run"]
i = run.index(sys.argv[2])
args = run[i + 1:]
args[args.index("run")] = "check"
print("\n".join(args))' "$work/$node.json" "$image")
  rc=0
  podman exec "$prefix-endpointd-$node-endpointd" /usr/local/bin/endpointd "${check_args[@]}" >"$work/check-$node.out" 2>&1 || rc=$?
  sed 's/^/   '"$node"': /' "$work/check-$node.out"
  [ $rc -eq 0 ] || fail "endpointd check failed in $node's agent pod (exit $rc)"
done

step "traffic: the client to web's ClusterIP 10.96.0.10:80 (through node-a) and to the NodePort 30080 of both nodes"
in_ns client "$client" --target 10.96.0.10:80 --mode new --count 60 --out "$work/clusterip.out" >/dev/null
echo "   ClusterIP: $(tally "$work/clusterip.out")"
[ "$(failed "$work/clusterip.out")" = 0 ] && [ "$(backends "$work/clusterip.out")" = 3 ] ||
  fail "ClusterIP traffic: $(tally "$work/clusterip.out")"
for node in node-a node-b; do
  in_ns client "$client" --target "${node_ip[$node]}:30080" --mode new --count 30 --out "$work/np-$node.out" >/dev/null
  echo "   NodePort on $node: $(tally "$work/np-$node.out")"
  [ "$(failed "$work/np-$node.out")" = 0 ] && [ "$(backends "$work/np-$node.out")" -ge 2 ] ||
    fail "NodePort traffic on $node: $(tally "$work/np-$node.out")"
done
answer=$(in_ns node-b dig +short +time=2 +tries=1 @169.254.20.10 web.demo.svc.cluster.local A)
echo "   node-b's node-local DNS 169.254.20.10: web.demo.svc.cluster.local A → $answer"
[ "$answer" = 10.96.0.10 ] || fail "node-local DNS answered '$answer'"
in_ns node-b ss -ltn | grep -q ':18000 ' || fail "node-b's feed is not listening on 18000"
echo "   node-b's feed listens on 0.0.0.0:18000"

step "the agent as the chart says: user, capabilities, read-only root, seccomp, no new privileges"
for node in node-a node-b; do
  ctr=$prefix-endpointd-$node-endpointd
  pid=$(podman inspect --format '{{.State.Pid}}' "$ctr")
  st=/proc/$pid/status
  uid=$(awk '/^Uid:/{print $2}' "$st"); capeff=$(awk '/^CapEff:/{print $2}' "$st")
  seccomp=$(awk '/^Seccomp:/{print $2}' "$st"); nnp=$(awk '/^NoNewPrivs:/{print $2}' "$st")
  ro=$(podman inspect --format '{{.HostConfig.ReadonlyRootfs}}' "$ctr")
  want=0000000000001000                        # NET_ADMIN
  [ "$node" = node-b ] && want=0000000000001400  # NET_ADMIN, NET_BIND_SERVICE (DNS on 53)
  echo "   $node: uid $uid, CapEff $capeff, Seccomp $seccomp (2: filter), NoNewPrivs $nnp, read-only root $ro"
  [ "$uid" = 0 ] && [ "$capeff" = "$want" ] && [ "$seccomp" = 2 ] && [ "$nnp" = 1 ] && [ "$ro" = true ] ||
    fail "$node's agent does not run as the chart says (CapEff wanted $want)"
  if podman exec "$ctr" sh -c ': > /usr/local/bin/written' 2>/dev/null; then
    fail "$node: the agent's root file system is writable"
  fi
done

step "podman restart of node-a's agent under load: new connections and wrk keep-alive through the ClusterIP"
load_start restart 10.96.0.10:80 8
t0=$(date +%s%N)
podman restart "$prefix-endpointd-node-a-endpointd" >/dev/null
wait_ready node-a "$work/node-a.json" 30 || fail "node-a's agent not ready again after podman restart"
echo "   restarted and ready again in $(( ($(date +%s%N) - t0) / 1000000 )) ms"
load_stop restart "the restart"

step "an nginx Deployment (the chart's example workload) rolled under wrk: preStop 'endpointd prestop' before SIGTERM"
podman build -q --network host -t endpointd-test-nginx:1 "$repo/tests/pod/nginx" >/dev/null 2>"$work/nginx-build.log" ||
  fail "the nginx image did not build: $(tail -5 "$work/nginx-build.log")"
"$helm" template endpointd "$repo/helm/endpointd" -n kube-system "${common_values[@]}" \
  --set exampleWorkload.enabled=true --set exampleWorkload.image=endpointd-test-nginx:1 \
  --set exampleWorkload.drainAction= >"$work/workload.yaml"
declare -A ng_ip=([ng-1]=10.244.1.30 [ng-2]=10.244.1.31 [ng-3]=10.244.1.32 [ng-4]=10.244.1.33)
declare -A ng_uid=([ng-1]=1a000000-0000-4000-8000-000000000001 [ng-2]=1a000000-0000-4000-8000-000000000002
                   [ng-3]=1a000000-0000-4000-8000-000000000003 [ng-4]=1a000000-0000-4000-8000-000000000004)
declare -A ng_state=()
ng_veth=10
add_pod_ns() {  # name: a pod's namespace on node-a, as cluster.sh makes them
  local pns=$prefix-$1 ip=${ng_ip[$1]} veth=p$ng_veth
  ng_veth=$((ng_veth + 1))
  ip netns add "$pns"
  ip -n "$pns" link set lo up
  ip -n "$prefix-node-a" link add "$veth" type veth peer name eth0 netns "$pns"
  ip -n "$prefix-node-a" addr add 10.244.1.1/32 dev "$veth"
  ip -n "$prefix-node-a" link set "$veth" up
  ip -n "$prefix-node-a" route add "$ip/32" dev "$veth"
  ip -n "$pns" addr add "$ip/32" dev eth0
  ip -n "$pns" link set eth0 up
  ip -n "$pns" route add 10.244.1.1 dev eth0 scope link
  ip -n "$pns" route add default via 10.244.1.1 dev eth0
}
# The API's view, as the Deployment, the kubelet and the EndpointSlice controller would write it:
# the Service, one Pod per pod (annotations from the rendered template, release-after: drained)
# and the slice; a pod being deleted has a deletionTimestamp and a terminating endpoint.
publish() {
  local spec="" n
  for n in "${!ng_state[@]}"; do spec+="$n,${ng_uid[$n]},${ng_ip[$n]},${ng_state[$n]} "; done
  python3 - "$work/workload.yaml" "$work/manifests/nginx.yaml" $spec <<'PY'
import os, sys, yaml
rendered, out, pods = sys.argv[1], sys.argv[2], [p.split(",") for p in sys.argv[3:]]
dep = next(d for d in yaml.safe_load_all(open(rendered)) if d and d["kind"] == "Deployment")
meta = dep["spec"]["template"]["metadata"]
ann = dict(meta.get("annotations") or {})
ann["endpointd.io/release-after"] = "drained"
grace = dep["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
docs = [{"apiVersion": "v1", "kind": "Service",
         "metadata": {"name": "nginx", "namespace": "kube-system", "uid": "5f1c0a4e-0000-4000-8000-0000000000a3"},
         "spec": {"clusterIP": "10.96.0.90", "clusterIPs": ["10.96.0.90"], "selector": meta["labels"],
                  "ports": [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 80}]}}]
eps = []
for name, uid, ip, state in sorted(pods):
    pm = {"name": name, "namespace": "kube-system", "uid": uid, "labels": meta["labels"], "annotations": ann}
    if state == "terminating":
        pm["deletionTimestamp"] = "2026-11-28T00:00:00Z"
        pm["deletionGracePeriodSeconds"] = grace
    docs.append({"apiVersion": "v1", "kind": "Pod", "metadata": pm,
                 "spec": {"nodeName": "node-a", "terminationGracePeriodSeconds": grace},
                 "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]}})
    t = state == "terminating"
    eps.append({"addresses": [ip], "nodeName": "node-a",
                "conditions": {"ready": not t, "serving": True, "terminating": t},
                "targetRef": {"kind": "Pod", "namespace": "kube-system", "name": name, "uid": uid}})
docs.append({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
             "metadata": {"name": "nginx-1", "namespace": "kube-system",
                          "labels": {"kubernetes.io/service-name": "nginx"}},
             "addressType": "IPv4", "ports": [{"name": "http", "protocol": "TCP", "port": 80}],
             "endpoints": eps})
with open(out + ".tmp", "w") as f:
    yaml.safe_dump_all(docs, f)
os.rename(out + ".tmp", out)
PY
}
start_ng() {  # name: the pod's containers, from the Deployment's template, as the kubelet runs them
  add_pod_ns "$1"
  python3 "$flags" "$work/workload.yaml" --kind Deployment --node node-a --pod-name "$1" \
    --pod-uid "${ng_uid[$1]}" --namespace kube-system --node-root "$work/root-node-a" --work "$work/pods" \
    --netns "/run/netns/$prefix-$1" --pod-ip "${ng_ip[$1]}" --host-ip 192.168.77.2 --cluster-dns 10.96.0.53 \
    --kubernetes-service 10.96.0.1:443 --name-prefix "$prefix-" >"$work/$1.json" || fail "$1: $(cat "$work/$1.json")"
  start_pod "$work/$1.json"
  for _ in $(seq 100); do in_ns node-a curl -fs -m 1 -o /dev/null "http://${ng_ip[$1]}/" && return 0; sleep 0.1; done
  fail "nginx in $1 does not answer"
}
# The kubelet's deletion: the API marks the pod, the preStop hook runs in the container, SIGTERM
# only when it returned (podman stop, the grace period as its timeout), then the endpoint goes.
stop_ng() {  # name
  local ctr=$prefix-$1-web hook t0 t1 rc=0
  ng_state[$1]=terminating
  publish
  t0=$(date +%s%N)
  read -r -a hook < <(python3 -c 'import json,shlex,sys; print(shlex.join(json.load(open(sys.argv[1]))["containers"][0]["prestop"]))' "$work/$1.json")
  podman exec "$ctr" "${hook[@]}" >"$work/$1.prestop" 2>&1 || rc=$?
  t1=$(date +%s%N)
  echo "   $1: preStop returned $rc after $(( (t1 - t0) / 1000000 )) ms: $(tail -1 "$work/$1.prestop")"
  [ $rc -eq 0 ] || fail "$1's preStop failed"
  podman stop -t 60 "$ctr" >/dev/null
  unset "ng_state[$1]"
  publish
}
ng_state=([ng-1]=ready [ng-2]=ready)
publish
start_ng ng-1
start_ng ng-2
for _ in $(seq 50); do
  in_ns client "$client" --target 10.96.0.90:80 --mode new --count 20 --out "$work/ng-warm.out" >/dev/null
  [ "$(backends "$work/ng-warm.out")" = 2 ] && [ "$(failed "$work/ng-warm.out")" = 0 ] && break
  sleep 0.2
done
echo "   before: $(tally "$work/ng-warm.out")"
load_start roll 10.96.0.90:80 32
t_roll=$(date +%s)
for pair in ng-1:ng-3 ng-2:ng-4; do
  old=${pair%%:*} new=${pair##*:}
  start_ng "$new"
  ng_state[$new]=ready
  publish
  sleep 1  # the new pod takes traffic before the old one goes (maxSurge 1, maxUnavailable 0)
  stop_ng "$old"
done
roll_s=$(( $(date +%s) - t_roll ))
echo "   rollout in $roll_s s"
load_stop roll "the rollout"
echo "   the drains, as node-a's agent recorded them (/debug/state):"
in_ns node-a curl -fs http://127.0.0.1:10249/debug/state >"$work/state.json"
python3 - "$work/state.json" <<'PY' || fail "a drain did not reach released"
import json, sys
ok = True
for d in json.load(open(sys.argv[1]))["drains"]:
    if not d["pod"].endswith(("ng-1", "ng-2")):
        continue
    t = d["timeline_ms"]
    print(f"     {d['pod']} {d['address']}: stop-accepting {t['stop_accepting']} ms -> removed {t.get('removed', '-')} ms"
          f" -> drained {t.get('drained', '-')} ms -> released {t.get('released', '-')} ms ({d.get('outcome') or '-'})")
    ok = ok and "released" in t
sys.exit(0 if ok else 1)
PY
[ "$(backends "$work/roll-new.out")" -ge 3 ] || fail "the new pods took no traffic"

step "each capability the chart adds is necessary: node-c, fresh, runs the pod without it"
attach_to_bridge node-c n9 192.168.77.9
caps_run() {  # values-file drop-cap|"" -> 0 if ready within $2 s
  local vals=$1 drop=$2 secs=$3 json=$work/node-c-$vals-${drop:-all}.json
  translate node-c "$vals" endpointd-node-c "$(uid_of node-c)" >"$json"
  if [ -n "$drop" ]; then
    python3 - "$json" "$drop" <<'PY'
import json, sys
p, drop = sys.argv[1], sys.argv[2].lower()
pod = json.load(open(p))
run = pod["containers"][0]["run"]
i = next(i for i in range(len(run) - 1) if run[i] == "--cap-add" and run[i + 1] == drop)
del run[i:i + 2]
json.dump(pod, open(p, "w"))
PY
  fi
  start_pod "$json"
  local rc=1
  wait_ready node-c "$json" "$secs" && rc=0
  podman logs "$prefix-endpointd-node-c-endpointd" >"$work/node-c-${drop:-all}.log" 2>&1 || true
  podman rm -f -t 0 "$prefix-endpointd-node-c-endpointd" >/dev/null
  in_ns node-c nft delete table ip endpointd 2>/dev/null || true
  ip -n "$prefix-node-c" link del endpointd-dns 2>/dev/null || true
  return $rc
}
for vals in default dns-feed; do
  caps_run "$vals" "" 30 || fail "node-c's agent ($vals values) with the chart's capabilities was not ready in 30 s"
  caps=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1]))["containers"][0]["run"]; print(" ".join(r[i+1] for i in range(len(r)-1) if r[i]=="--cap-add"))' "$work/node-c-$vals-all.json")
  echo "   $vals values, capabilities $caps: ready"
  for cap in $caps; do
    if caps_run "$vals" "$cap" 8; then fail "$vals values: the agent is ready without $cap: the chart adds more than it needs"; fi
    why=$( (grep ' E ' "$work/node-c-$cap.log"; grep -iE 'not permitted|permission denied' "$work/node-c-$cap.log") | head -1 | cut -c1-200 || true)
    echo "   $vals values without $cap: not ready in 8 s (${why:-no error line})"
  done
done

step "bad input: no token at the in-cluster path, and a pod spec field the runner cannot honour"
mkdir -p "$work/sa-notoken"
cp "$work/sa/ca.crt" "$work/sa/namespace" "$work/sa-notoken/"
translate node-c default endpointd-node-c "$(uid_of node-c)" --sa-dir "$work/sa-notoken" >"$work/node-c-notoken.json"
start_pod "$work/node-c-notoken.json"
for _ in $(seq 50); do
  [ "$(podman inspect --format '{{.State.Running}}' "$prefix-endpointd-node-c-endpointd")" = false ] && break
  sleep 0.1
done
msg=$(podman logs "$prefix-endpointd-node-c-endpointd" 2>&1 | grep -m1 'token' || true)
echo "   $msg"
grep -q '/var/run/secrets/kubernetes.io/serviceaccount/token' <<<"$msg" || fail "the agent's error does not name the token file"
podman rm -f -t 0 "$prefix-endpointd-node-c-endpointd" >/dev/null
python3 - "$work/default.yaml" >"$work/bad.yaml" <<'PY'
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
for d in docs:
    if d["kind"] == "DaemonSet":
        d["spec"]["template"]["spec"]["shareProcessNamespace"] = True
print(yaml.safe_dump_all(docs))
PY
if out=$(translate node-c bad endpointd-node-c "$(uid_of node-c)" 2>&1); then fail "podman_flags.py accepted shareProcessNamespace"; fi
echo "   $out"
grep -q 'spec.template.spec.shareProcessNamespace' <<<"$out" || fail "the refusal does not name the field"

step "and back: README's commands as written, under load through the ClusterIP"
load_start swap-back 10.96.0.10:80 8
run_readme_steps back
load_stop swap-back "the swap back"
for node in node-a node-b; do
  left=$(in_ns "$node" nft list tables | grep -w endpointd || true)
  echo "   $node: endpointd's tables: ${left:-none}; kube-proxy's: $(kube_proxy_rules "$node")"
  [ -z "$left" ] || fail "endpointd's tables are still on $node"
done

echo
echo "PASS"
