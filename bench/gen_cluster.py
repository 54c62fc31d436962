#!/usr/bin/env python3
"""Generates a synthetic cluster for endpointd's benchmarks, as the API server serves it.

Writes, into OUT:
  services.json        a ServiceList (items without kind, as the API serves a typed list)
  endpointslices.json  an EndpointSliceList
  nodes.json           a NodeList
  events.jsonl         watch-event lines ({"type":"MODIFIED","object":{...EndpointSlice...}}),
                       each toggling one endpoint's ready/serving condition. The sequence is a
                       cycle: the second half flips back, in order, what the first half flipped,
                       so replaying it any number of times makes every line a real change.
  manifests/           the same objects for `endpointd run --source-dir` (JSON `kind: List`
                       files, items with kind and apiVersion)

Deterministic: the same --seed and sizes give byte-identical output. Python 3 stdlib only.
"""

import argparse
import hashlib
import json
import os
import random

ZONES = ["zone-a", "zone-b", "zone-c"]
SLICE_CONTROLLER = "endpointslice-controller.k8s.io"
ALNUM = "bcdfghjklmnpqrstvwxz2456789"  # the alphabet of Kubernetes' generated name suffixes


def dumps(obj):
    return json.dumps(obj, separators=(",", ":"))


class Gen:
    def __init__(self, seed):
        self.rng = random.Random(seed)
        self.rv = 100000

    def next_rv(self):
        self.rv += self.rng.randint(1, 7)
        return str(self.rv)

    def uid(self):
        h = "%032x" % self.rng.getrandbits(128)
        return "%s-%s-4%s-%s-%s" % (h[0:8], h[8:12], h[13:16], h[16:20], h[20:32])

    def suffix(self, n):
        return "".join(self.rng.choice(ALNUM) for _ in range(n))

    def timestamp(self):
        day = self.rng.randint(1, 28)
        return "2025-03-%02dT%02d:%02d:%02dZ" % (
            day, self.rng.randint(0, 23), self.rng.randint(0, 59), self.rng.randint(0, 59))


def managed_fields(manager, operation, ts, fields):
    return [{"manager": manager, "operation": operation, "apiVersion": "v1", "time": ts,
             "fieldsType": "FieldsV1", "fieldsV1": fields}]


def make_nodes(g, count):
    nodes = []
    for n in range(count):
        name = "node-%04d" % n
        zone = ZONES[n % len(ZONES)]
        pod_cidr = "10.%d.%d.0/24" % (64 + n // 256, n % 256)
        ts = g.timestamp()
        nodes.append({
            "metadata": {
                "name": name, "uid": g.uid(), "resourceVersion": g.next_rv(),
                "creationTimestamp": ts,
                "labels": {
                    "kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64", "node.kubernetes.io/instance-type": "m6i.2xlarge",
                    "topology.kubernetes.io/region": "region-1", "topology.kubernetes.io/zone": zone,
                },
                "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                                "volumes.kubernetes.io/controller-managed-attach-detach": "true"},
            },
            "spec": {"podCIDR": pod_cidr, "podCIDRs": [pod_cidr], "providerID": "aws:///%s/i-%016x" % (zone, g.rng.getrandbits(64))},
            "status": {
                "addresses": [
                    {"type": "InternalIP", "address": "172.20.%d.%d" % (n // 250, 4 + n % 250)},
                    {"type": "Hostname", "address": name},
                ],
                "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                "message": "kubelet is posting ready status",
                                "lastHeartbeatTime": ts, "lastTransitionTime": ts}],
                "nodeInfo": {"kubeletVersion": "v1.31.4", "kernelVersion": "6.1.0-28-amd64",
                             "containerRuntimeVersion": "containerd://1.7.24",
                             "osImage": "Debian GNU/Linux 12 (bookworm)", "architecture": "amd64",
                             "operatingSystem": "linux"},
            },
        })
    return nodes


def port_shape(g, i):
    """Service ports and the matching EndpointSlice ports (1-2 ports, some named, some UDP)."""
    r = g.rng.random()
    if i % 50 == 0:  # a DNS-like service: UDP and TCP on one number
        sp = [{"name": "dns", "protocol": "UDP", "port": 53, "targetPort": 5353},
              {"name": "dns-tcp", "protocol": "TCP", "port": 53, "targetPort": 5353}]
    elif r < 0.30:
        sp = [{"protocol": "TCP", "port": 80, "targetPort": 8080}]
    elif r < 0.60:
        sp = [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": "http"}]
    elif r < 0.80:
        sp = [{"name": "http", "protocol": "TCP", "port": 80, "targetPort": 8080},
              {"name": "metrics", "protocol": "TCP", "port": 9090, "targetPort": 9090}]
    else:
        sp = [{"name": "grpc", "protocol": "TCP", "port": 9000, "targetPort": "grpc"},
              {"name": "http", "protocol": "TCP", "port": 8080, "targetPort": 8080}]
    ep = []
    for p in sp:
        tp = p["targetPort"]
        number = tp if isinstance(tp, int) else {"http": 8080, "grpc": 9000}[tp]
        e = {"name": p.get("name", ""), "protocol": p["protocol"], "port": number}
        ep.append(e)
    return sp, ep


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--services", type=int, default=10000)
    ap.add_argument("--endpoints-per-service", type=int, default=10)
    ap.add_argument("--namespaces", type=int, default=100)
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--split-every", type=int, default=8,
                    help="every Nth service has its endpoints in two slices")
    ap.add_argument("--max-per-slice", type=int, default=100)
    ap.add_argument("--events", type=int, default=4000, help="watch events (even)")
    ap.add_argument("--manifest-files", type=int, default=10,
                    help="files per kind in manifests/")
    args = ap.parse_args()

    g = Gen(args.seed)
    os.makedirs(os.path.join(args.out, "manifests"), exist_ok=True)

    nodes = make_nodes(g, args.nodes)
    node_zone = {n["metadata"]["name"]: n["metadata"]["labels"]["topology.kubernetes.io/zone"] for n in nodes}
    # Pod address slots: each node's /24, .2 upwards, handed out in a shuffled order.
    per_node = -(-args.services * args.endpoints_per_service // args.nodes) + 1
    if per_node > 250:
        raise SystemExit("too many endpoints for %d nodes with a /24 each" % args.nodes)
    slots = [(n, s) for n in range(args.nodes) for s in range(per_node)]
    g.rng.shuffle(slots)

    services, slices = [], []
    slot = 0
    for i in range(args.services):
        ns = "team-%03d" % (i % args.namespaces)
        name = "svc-%05d" % i
        svc_uid = g.uid()
        ts = g.timestamp()
        sp, ep_ports = port_shape(g, i)
        headless = i % 97 == 0  # a StatefulSet's governing service: endpoints with hostnames
        ip = "None" if headless else "10.%d.%d.%d" % (96 + (i + 10) // 65536, ((i + 10) // 256) % 256, (i + 10) % 256)
        spec = {"ports": sp, "selector": {"app.kubernetes.io/name": name},
                "clusterIP": ip, "clusterIPs": [ip], "type": "ClusterIP", "sessionAffinity": "None",
                "ipFamilies": ["IPv4"], "ipFamilyPolicy": "SingleStack",
                "internalTrafficPolicy": "Cluster"}
        if i % 41 == 0:
            spec["sessionAffinity"] = "ClientIP"
            spec["sessionAffinityConfig"] = {"clientIP": {"timeoutSeconds": 10800}}
        if i % 23 == 0:
            spec["trafficDistribution"] = "PreferClose"
        services.append({
            "metadata": {
                "name": name, "namespace": ns, "uid": svc_uid, "resourceVersion": g.next_rv(),
                "creationTimestamp": ts,
                "labels": {"app.kubernetes.io/name": name, "app.kubernetes.io/part-of": "shop-%d" % (i % 37),
                           "app.kubernetes.io/managed-by": "Helm"},
                "annotations": {"meta.helm.sh/release-name": "rel-%d" % (i % 53),
                                "meta.helm.sh/release-namespace": ns},
                "managedFields": managed_fields("helm", "Update", ts, {
                    "f:metadata": {"f:annotations": {".": {}, "f:meta.helm.sh/release-name": {},
                                                      "f:meta.helm.sh/release-namespace": {}},
                                   "f:labels": {".": {}, "f:app.kubernetes.io/managed-by": {},
                                                "f:app.kubernetes.io/name": {}, "f:app.kubernetes.io/part-of": {}}},
                    "f:spec": {"f:internalTrafficPolicy": {}, "f:ports": {}, "f:selector": {},
                               "f:sessionAffinity": {}, "f:type": {}}}),
            },
            "spec": spec,
            "status": {"loadBalancer": {}},
        })

        pod_prefix = "%s-%s-" % (name, "%x" % g.rng.getrandbits(36))
        endpoints = []
        for k in range(args.endpoints_per_service):
            node, s = slots[slot]
            slot += 1
            node_name = "node-%04d" % node
            pod = pod_prefix + g.suffix(5) if not headless else "%s-%d" % (name, k)
            r = g.rng.random()
            cond = {"ready": True, "serving": True, "terminating": False}
            if r < 0.02:
                cond = {"ready": False, "serving": False, "terminating": False}
            elif r < 0.025:
                cond = {"ready": False, "serving": True, "terminating": True}
            e = {"addresses": ["10.%d.%d.%d" % (64 + node // 256, node % 256, 2 + s)],
                 "conditions": cond}
            if headless:
                e["hostname"] = pod
            e["nodeName"] = node_name
            e["targetRef"] = {"kind": "Pod", "namespace": ns, "name": pod, "uid": g.uid()}
            e["zone"] = node_zone[node_name]
            endpoints.append(e)

        if i % args.split_every == 0 and len(endpoints) > 1:
            cut = max(1, len(endpoints) * 7 // 10)
            groups = [endpoints[:cut], endpoints[cut:]]
        else:
            groups = [endpoints[j:j + args.max_per_slice] for j in range(0, len(endpoints), args.max_per_slice)]
        for grp in groups:
            sts = g.timestamp()
            slices.append({
                "metadata": {
                    "name": name + "-" + g.suffix(5), "generateName": name + "-", "namespace": ns,
                    "uid": g.uid(), "resourceVersion": g.next_rv(), "generation": 1,
                    "creationTimestamp": sts,
                    "labels": {"app.kubernetes.io/managed-by": "Helm", "app.kubernetes.io/name": name,
                               "endpointslice.kubernetes.io/managed-by": SLICE_CONTROLLER,
                               "kubernetes.io/service-name": name},
                    "annotations": {"endpoints.kubernetes.io/last-change-trigger-time": sts},
                    "ownerReferences": [{"apiVersion": "v1", "kind": "Service", "name": name, "uid": svc_uid,
                                         "controller": True, "blockOwnerDeletion": True}],
                    "managedFields": managed_fields("kube-controller-manager", "Update", sts, {
                        "f:addressType": {}, "f:endpoints": {},
                        "f:metadata": {"f:annotations": {".": {}, "f:endpoints.kubernetes.io/last-change-trigger-time": {}},
                                       "f:generateName": {},
                                       "f:labels": {".": {}, "f:app.kubernetes.io/managed-by": {},
                                                    "f:app.kubernetes.io/name": {},
                                                    "f:endpointslice.kubernetes.io/managed-by": {},
                                                    "f:kubernetes.io/service-name": {}},
                                       "f:ownerReferences": {".": {}, 'k:{"uid":"%s"}' % svc_uid: {}}},
                        "f:ports": {}}),
                },
                "addressType": "IPv4",
                "endpoints": grp,
                "ports": ep_ports,
            })

    def write_list(path, kind, items):
        with open(path, "w") as f:
            f.write(dumps({"kind": kind, "apiVersion": "v1" if kind != "EndpointSliceList" else "discovery.k8s.io/v1",
                           "metadata": {"resourceVersion": str(g.rv)}, "items": items}))

    write_list(os.path.join(args.out, "services.json"), "ServiceList", services)
    write_list(os.path.join(args.out, "endpointslices.json"), "EndpointSliceList", slices)
    write_list(os.path.join(args.out, "nodes.json"), "NodeList", nodes)

    # Manifest directory: the same objects, with kind and apiVersion on every item.
    def write_manifests(prefix, kind, api, items, files):
        per = -(-len(items) // files)
        for fi in range(files):
            chunk = items[fi * per:(fi + 1) * per]
            if not chunk:
                break
            with open(os.path.join(args.out, "manifests", "%s-%02d.json" % (prefix, fi)), "w") as f:
                f.write(dumps({"kind": "List", "apiVersion": "v1",
                               "items": [{"kind": kind, "apiVersion": api, **it} for it in chunk]}))

    write_manifests("services", "Service", "v1", services, args.manifest_files)
    write_manifests("endpointslices", "EndpointSlice", "discovery.k8s.io/v1", slices, args.manifest_files)
    write_manifests("nodes", "Node", "v1", nodes, 1)

    # Watch events: distinct (slice, endpoint) pairs flipped, then flipped back in order.
    half = args.events // 2
    picks, seen = [], set()
    while len(picks) < half:
        si = g.rng.randrange(len(slices))
        ei = g.rng.randrange(len(slices[si]["endpoints"]))
        if (si, ei) in seen or slices[si]["endpoints"][ei]["conditions"]["terminating"]:
            continue
        seen.add((si, ei))
        picks.append((si, ei))
    with open(os.path.join(args.out, "events.jsonl"), "w") as f:
        for si, ei in picks + picks:
            sl = slices[si]
            c = sl["endpoints"][ei]["conditions"]
            c["ready"] = not c["ready"]
            c["serving"] = c["ready"]
            sl["metadata"]["resourceVersion"] = g.next_rv()
            sl["metadata"]["generation"] += 1
            obj = {"kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1", **sl}
            f.write(dumps({"type": "MODIFIED", "object": obj}) + "\n")
    # After the full cycle every slice is back where it started (the lists above).

    digest = hashlib.sha256()
    for fn in ("services.json", "endpointslices.json", "events.jsonl"):
        with open(os.path.join(args.out, fn), "rb") as f:
            digest.update(f.read())
    n_eps = sum(len(s["endpoints"]) for s in slices)
    print("services=%d endpointslices=%d endpoints=%d nodes=%d events=%d sha256=%s" % (
        len(services), len(slices), n_eps, len(nodes), 2 * half, digest.hexdigest()[:16]))


if __name__ == "__main__":
    main()
