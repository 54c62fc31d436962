#!/usr/bin/env python3
"""Generates one cluster state for bench/datapath in three forms, all with the same addresses:

  endpointd/cluster.json   the Services, EndpointSlices and this node's Node, for
                           `endpointd run --source-dir` (endpointd programs its own rules)
  kube-nft/NNN.nft         kube-proxy's nftables layout (pkg/proxy/nftables), as `nft -f` input,
                           split in files of --chunk services, one transaction each (kube-proxy
                           syncs in one; one transaction of 10,000 services takes > 180 s here,
                           bench/results/proxy.md: the rules that result are the same)
  kube-iptables.rules      kube-proxy's iptables layout (pkg/proxy/iptables), as
                           `iptables-restore` input (filter and nat)
  target.env               the addresses the bench connects to

The layouts are written from kube-proxy's published structure (the chain names, the maps and
the rule shapes of its nftables and iptables proxiers), not from its code:

  nftables: table `ip kube-proxy`; base chains filter-{prerouting,input,forward,output} at
  dstnat-10, filter-output-post-dnat at dstnat+10, nat-{prerouting,output} at dstnat,
  nat-postrouting at srcnat; `services` dispatches with `ip daddr . meta l4proto . th dport
  vmap @service-ips` and, for local destinations, `meta l4proto . th dport vmap
  @service-nodeports`; per service port a chain `service-<hash>-<ns>/<name>/tcp/<port>` (the
  masquerade test, then `numgen random mod N vmap { i : goto endpoint-... }`), per external
  access a chain `external-...` (mark for masquerade, goto the service chain), per endpoint a
  chain `endpoint-...` (hairpin mark, `dnat to ep:port`); masquerading on mark 0x4000.

  iptables: nat PREROUTING/OUTPUT -> KUBE-SERVICES, a rule per service port
  `-d CIP/32 -p tcp --dport P -j KUBE-SVC-X`, last `-m addrtype --dst-type LOCAL -j
  KUBE-NODEPORTS`; KUBE-NODEPORTS `-p tcp --dport NP -j KUBE-EXT-X`; KUBE-EXT-X marks and jumps
  to KUBE-SVC-X; KUBE-SVC-X: `! -s <clusterCIDR> ... -j KUBE-MARK-MASQ`, then per endpoint i of
  n `-m statistic --mode random --probability 1/(n-i) -j KUBE-SEP-Y` (the last without
  statistic); KUBE-SEP-Y: `-s ep/32 -j KUBE-MARK-MASQ`, `-p tcp -j DNAT --to-destination ep:port`;
  KUBE-POSTROUTING masquerades marked packets (`--random-fully`); beyond 1,000 endpoints, as
  kube-proxy's large-cluster mode, the endpoint rules carry no comment; filter: KUBE-PROXY-FIREWALL,
  KUBE-SERVICES, KUBE-EXTERNAL-SERVICES, KUBE-NODEPORTS and KUBE-FORWARD on new connections.

Addresses (every service: one TCP port 80 with --endpoints endpoints on port 8080):
  node IP 172.18.0.1, cluster CIDR 10.224.0.0/11, service CIDR 10.96.0.0/12,
  service i: ClusterIP 10.96.0.0 + 1 + i; a NodePort for every --nodeport-every'th service
  (30000 + i / step; at most 2,767 fit the default range); endpoints of the target service
  (the one in the middle, so that iptables' linear walk meets it after half the others):
  10.224.2.10 + j, on node-b; every other endpoint: 10.232.0.0 + (i * M + j), on node-<k>.
"""

import argparse
import hashlib
import ipaddress
import json
import os

NODE_IP = "172.18.0.1"
CLUSTER_CIDR = "10.224.0.0/11"
SERVICE_BASE = int(ipaddress.IPv4Address("10.96.0.1"))
OTHER_EP_BASE = int(ipaddress.IPv4Address("10.232.0.0"))
TARGET_EP_BASE = int(ipaddress.IPv4Address("10.224.2.10"))
MASQ = "0x00004000"


def ip(n):
    return str(ipaddress.IPv4Address(n))


def h(s, n=16):
    return hashlib.sha256(s.encode()).hexdigest()[:n].upper()


class Cluster:
    def __init__(self, services, endpoints):
        self.n = services
        self.m = endpoints
        self.step = max(1, -(-services // 2500))  # at most 2,500 node ports
        self.target = (services // 2) // self.step * self.step

    def cluster_ip(self, i):
        return ip(SERVICE_BASE + i)

    def node_port(self, i):
        return 30000 + i // self.step if i % self.step == 0 else 0

    def endpoints(self, i):
        if i == self.target:
            return [(ip(TARGET_EP_BASE + j), "node-b") for j in range(self.m)]
        return [(ip(OTHER_EP_BASE + i * self.m + j), "node-%d" % ((i + j) % 100)) for j in range(self.m)]

    def name(self, i):
        return "svc-%05d" % i


def write_endpointd(c, out):
    items = [
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": "node-a"},
            "spec": {"podCIDR": "10.224.1.0/24"},
            "status": {"addresses": [{"type": "InternalIP", "address": NODE_IP}]},
        }
    ]
    for i in range(c.n):
        name = c.name(i)
        np = c.node_port(i)
        port = {"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080}
        if np:
            port["nodePort"] = np
        items.append(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": name, "namespace": "bench", "uid": "00000000-0000-4000-8000-%012d" % i},
                "spec": {
                    "type": "NodePort" if np else "ClusterIP",
                    "clusterIP": c.cluster_ip(i),
                    "clusterIPs": [c.cluster_ip(i)],
                    "selector": {"app": name},
                    "ports": [port],
                },
            }
        )
        items.append(
            {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": name + "-0",
                    "namespace": "bench",
                    "labels": {
                        "kubernetes.io/service-name": name,
                        "endpointslice.kubernetes.io/managed-by": "endpointslice-controller.k8s.io",
                    },
                },
                "addressType": "IPv4",
                "ports": [{"name": "http", "protocol": "TCP", "port": 8080}],
                "endpoints": [
                    {
                        "addresses": [a],
                        "conditions": {"ready": True, "serving": True, "terminating": False},
                        "nodeName": node,
                    }
                    for a, node in c.endpoints(i)
                ],
            }
        )
    os.makedirs(os.path.join(out, "endpointd"), exist_ok=True)
    with open(os.path.join(out, "endpointd", "cluster.json"), "w") as f:
        json.dump({"apiVersion": "v1", "kind": "List", "items": items}, f, separators=(",", ":"))


def kube_nft_head():
    return f"""add table ip kube-proxy {{ comment "rules for kube-proxy" ; }}
add set ip kube-proxy cluster-ips {{ type ipv4_addr ; comment "Active ClusterIPs" ; }}
add map ip kube-proxy no-endpoint-services {{ type ipv4_addr . inet_proto . inet_service : verdict ; }}
add map ip kube-proxy no-endpoint-nodeports {{ type inet_proto . inet_service : verdict ; }}
add map ip kube-proxy firewall-ips {{ type ipv4_addr . inet_proto . inet_service : verdict ; }}
add map ip kube-proxy service-ips {{ type ipv4_addr . inet_proto . inet_service : verdict ; }}
add map ip kube-proxy service-nodeports {{ type inet_proto . inet_service : verdict ; }}
add chain ip kube-proxy filter-prerouting {{ type filter hook prerouting priority -110 ; }}
add chain ip kube-proxy filter-input {{ type filter hook input priority -110 ; }}
add chain ip kube-proxy filter-forward {{ type filter hook forward priority -110 ; }}
add chain ip kube-proxy filter-output {{ type filter hook output priority -110 ; }}
add chain ip kube-proxy filter-output-post-dnat {{ type filter hook output priority -90 ; }}
add chain ip kube-proxy nat-prerouting {{ type nat hook prerouting priority -100 ; }}
add chain ip kube-proxy nat-output {{ type nat hook output priority -100 ; }}
add chain ip kube-proxy nat-postrouting {{ type nat hook postrouting priority 100 ; }}
add chain ip kube-proxy firewall-check
add chain ip kube-proxy services
add chain ip kube-proxy service-endpoints-check
add chain ip kube-proxy nodeport-endpoints-check
add chain ip kube-proxy cluster-ips-check
add chain ip kube-proxy reject-chain
add chain ip kube-proxy mark-for-masquerade
add chain ip kube-proxy masquerading
add rule ip kube-proxy filter-prerouting ct state new jump firewall-check
add rule ip kube-proxy filter-input ct state new jump nodeport-endpoints-check
add rule ip kube-proxy filter-input ct state new jump service-endpoints-check
add rule ip kube-proxy filter-forward ct state new jump service-endpoints-check
add rule ip kube-proxy filter-forward ct state new jump cluster-ips-check
add rule ip kube-proxy filter-output ct state new jump service-endpoints-check
add rule ip kube-proxy filter-output ct state new jump firewall-check
add rule ip kube-proxy filter-output-post-dnat ct state new jump cluster-ips-check
add rule ip kube-proxy nat-prerouting jump services
add rule ip kube-proxy nat-output jump services
add rule ip kube-proxy nat-postrouting jump masquerading
add rule ip kube-proxy firewall-check ip daddr . meta l4proto . th dport vmap @firewall-ips
add rule ip kube-proxy services ip daddr . meta l4proto . th dport vmap @service-ips
add rule ip kube-proxy services fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @service-nodeports
add rule ip kube-proxy service-endpoints-check ip daddr . meta l4proto . th dport vmap @no-endpoint-services
add rule ip kube-proxy service-endpoints-check fib daddr type local ip daddr != 127.0.0.0/8 meta l4proto . th dport vmap @no-endpoint-nodeports
add rule ip kube-proxy nodeport-endpoints-check ip daddr != 127.0.0.0/8 fib daddr type local meta l4proto . th dport vmap @no-endpoint-nodeports
add rule ip kube-proxy cluster-ips-check ip daddr @cluster-ips reject comment "Reject traffic to invalid ports of ClusterIPs"
add rule ip kube-proxy cluster-ips-check ip daddr 10.96.0.0/12 drop comment "Drop traffic to unallocated ClusterIPs"
add rule ip kube-proxy reject-chain reject
add rule ip kube-proxy mark-for-masquerade meta mark set meta mark or {MASQ}
add rule ip kube-proxy masquerading meta mark and {MASQ} == 0 return
add rule ip kube-proxy masquerading meta mark set meta mark xor {MASQ}
add rule ip kube-proxy masquerading masquerade fully-random
"""


def write_kube_nft(c, out, chunk):
    d = os.path.join(out, "kube-nft")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "000.nft"), "w") as f:
        f.write(kube_nft_head())
    for start in range(0, c.n, chunk):
        lines = []
        for i in range(start, min(c.n, start + chunk)):
            base = "bench/%s/tcp/http" % c.name(i)
            svc = "service-%s-%s" % (h(base, 8), base)
            cip = c.cluster_ip(i)
            lines.append(f"add chain ip kube-proxy {svc}")
            lines.append(
                f"add rule ip kube-proxy {svc} ip daddr {cip} tcp dport 80 ip saddr != {CLUSTER_CIDR} jump mark-for-masquerade"
            )
            vm = []
            for j, (a, _) in enumerate(c.endpoints(i)):
                ep = "endpoint-%s-%s__%s/8080" % (h(base + a, 8), base, a)
                lines.append(f"add chain ip kube-proxy {ep}")
                lines.append(f"add rule ip kube-proxy {ep} ip saddr {a} jump mark-for-masquerade")
                lines.append(f"add rule ip kube-proxy {ep} meta l4proto tcp dnat to {a}:8080")
                vm.append(f"{j} : goto {ep}")
            lines.append(f"add rule ip kube-proxy {svc} numgen random mod {c.m} vmap {{ {', '.join(vm)} }}")
            lines.append(f"add element ip kube-proxy cluster-ips {{ {cip} }}")
            lines.append(f"add element ip kube-proxy service-ips {{ {cip} . tcp . 80 : goto {svc} }}")
            np = c.node_port(i)
            if np:
                ext = "external-%s-%s" % (h(base, 8), base)
                lines.append(f"add chain ip kube-proxy {ext}")
                lines.append(f"add rule ip kube-proxy {ext} jump mark-for-masquerade")
                lines.append(f"add rule ip kube-proxy {ext} goto {svc}")
                lines.append(f"add element ip kube-proxy service-nodeports {{ tcp . {np} : goto {ext} }}")
        with open(os.path.join(d, "%03d.nft" % (1 + start // chunk)), "w") as f:
            f.write("\n".join(lines) + "\n")


def write_kube_iptables(c, out):
    chains_nat = [
        "KUBE-SERVICES",
        "KUBE-NODEPORTS",
        "KUBE-POSTROUTING",
        "KUBE-MARK-MASQ",
    ]
    rules_nat = [
        "-A PREROUTING -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
        "-A OUTPUT -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
        "-A POSTROUTING -m comment --comment \"kubernetes postrouting rules\" -j KUBE-POSTROUTING",
        "-A KUBE-MARK-MASQ -j MARK --set-xmark 0x4000/0x4000",
        "-A KUBE-POSTROUTING -m mark ! --mark 0x4000/0x4000 -j RETURN",
        "-A KUBE-POSTROUTING -j MARK --set-xmark 0x4000/0x0",
        "-A KUBE-POSTROUTING -m comment --comment \"kubernetes service traffic requiring SNAT\" -j MASQUERADE --random-fully",
    ]
    large = c.n * c.m > 1000
    svc_rules = []
    np_rules = []
    per_service = []
    for i in range(c.n):
        name = "bench/%s:http" % c.name(i)
        svc = "KUBE-SVC-" + h(name + "tcp")
        chains_nat.append(svc)
        cip = c.cluster_ip(i)
        svc_rules.append(
            f"-A KUBE-SERVICES -d {cip}/32 -p tcp -m comment --comment \"{name} cluster IP\" -m tcp --dport 80 -j {svc}"
        )
        body = [
            f"-A {svc} ! -s {CLUSTER_CIDR} -d {cip}/32 -p tcp -m comment --comment \"{name} cluster IP\" -m tcp --dport 80 -j KUBE-MARK-MASQ"
        ]
        eps = c.endpoints(i)
        for j, (a, _) in enumerate(eps):
            sep = "KUBE-SEP-" + h(name + "tcp" + a + ":8080")
            chains_nat.append(sep)
            # kube-proxy's large-cluster mode (more than 1,000 endpoints): no comments on the
            # endpoint rules, which keeps the table's blob smaller.
            to_sep = "" if large else f"-m comment --comment \"{name} -> {a}:8080\" "
            on_sep = "" if large else f"-m comment --comment \"{name}\" "
            if j < len(eps) - 1:
                body.append(
                    f"-A {svc} {to_sep}-m statistic --mode random --probability {1.0 / (len(eps) - j):.10f} -j {sep}"
                )
            else:
                body.append(f"-A {svc} {to_sep}-j {sep}")
            body.append(f"-A {sep} -s {a}/32 {on_sep}-j KUBE-MARK-MASQ")
            body.append(f"-A {sep} -p tcp {on_sep}-m tcp -j DNAT --to-destination {a}:8080")
        np = c.node_port(i)
        if np:
            ext = "KUBE-EXT-" + h(name + "tcp")
            chains_nat.append(ext)
            np_rules.append(f"-A KUBE-NODEPORTS -p tcp -m comment --comment \"{name}\" -m tcp --dport {np} -j {ext}")
            body.append(
                f"-A {ext} -m comment --comment \"masquerade traffic for {name} external destinations\" -j KUBE-MARK-MASQ"
            )
            body.append(f"-A {ext} -j {svc}")
        per_service.extend(body)
    svc_rules.append(
        "-A KUBE-SERVICES -m comment --comment \"kubernetes service nodeports; NOTE: this must be the last rule in this chain\" -m addrtype --dst-type LOCAL -j KUBE-NODEPORTS"
    )
    filt = [
        "*filter",
        ":KUBE-EXTERNAL-SERVICES - [0:0]",
        ":KUBE-FIREWALL - [0:0]",
        ":KUBE-FORWARD - [0:0]",
        ":KUBE-KUBELET-CANARY - [0:0]",
        ":KUBE-NODEPORTS - [0:0]",
        ":KUBE-PROXY-FIREWALL - [0:0]",
        ":KUBE-SERVICES - [0:0]",
        "-A INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL",
        "-A INPUT -m comment --comment \"kubernetes health check service ports\" -j KUBE-NODEPORTS",
        "-A INPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes externally-visible service portals\" -j KUBE-EXTERNAL-SERVICES",
        "-A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL",
        "-A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD",
        "-A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
        "-A FORWARD -m conntrack --ctstate NEW -m comment --comment \"kubernetes externally-visible service portals\" -j KUBE-EXTERNAL-SERVICES",
        "-A OUTPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes load balancer firewall\" -j KUBE-PROXY-FIREWALL",
        "-A OUTPUT -m conntrack --ctstate NEW -m comment --comment \"kubernetes service portals\" -j KUBE-SERVICES",
        "-A KUBE-FORWARD -m conntrack --ctstate INVALID -j DROP",
        "-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding rules\" -m mark --mark 0x4000/0x4000 -j ACCEPT",
        "-A KUBE-FORWARD -m comment --comment \"kubernetes forwarding conntrack rule\" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT",
        "COMMIT",
    ]
    with open(os.path.join(out, "kube-iptables.rules"), "w") as f:
        f.write("\n".join(filt) + "\n")
        f.write("*nat\n")
        for ch in chains_nat:
            f.write(f":{ch} - [0:0]\n")
        for r in rules_nat + svc_rules + np_rules + per_service:
            f.write(r + "\n")
        f.write("COMMIT\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--services", type=int, required=True)
    ap.add_argument("--endpoints", type=int, default=10)
    ap.add_argument("--out", required=True)
    ap.add_argument("--chunk", type=int, default=1000, help="services per kube-proxy nft file")
    a = ap.parse_args()
    c = Cluster(a.services, a.endpoints)
    os.makedirs(a.out, exist_ok=True)
    write_endpointd(c, a.out)
    write_kube_nft(c, a.out, a.chunk)
    write_kube_iptables(c, a.out)
    with open(os.path.join(a.out, "target.env"), "w") as f:
        f.write(f"CLUSTER_IP={c.cluster_ip(c.target)}\nNODE_PORT={c.node_port(c.target)}\nNODE_IP={NODE_IP}\n")
        f.write(f"TARGET_INDEX={c.target}\nNODEPORT_SERVICES={len([i for i in range(c.n) if c.node_port(i)])}\n")


if __name__ == "__main__":
    main()
