#!/usr/bin/env python3
"""Writes the DNS benchmark's records for NSD and Knot as zone files, and dnsperf's queries.

The same deterministic cluster that bench_server builds as a Snapshot (keep the two in step):
  services i = 0..N-1: name svc<i>, namespace ns<i % 100>, ClusterIP 10.96.<i/256>.<i%256>,
  one named port http/TCP 80, E endpoints each 10.<128 + (i*E+j)/65536>.<((i*E+j)/256)%256>.<(i*E+j)%256>
  (port 8080); every tenth service is headless (its ready endpoints are its A records,
  ep-<j> hostnames). PTR records for every ClusterIP and headless endpoint address go to a
  second zone, 10.in-addr.arpa (endpointd serves them beside the cluster zone).
Queries: 60 % A of a service, 10 % AAAA (NODATA), 10 % NXDOMAIN, 10 % SRV, 10 % PTR.
With --manifests DIR, the same cluster as `endpointd run --source-dir DIR` reads it: one Node
(node-a, the agent's own), the Services and their EndpointSlices (one slice per service, every
endpoint ready on node-a), as JSON `kind: List` files.
Usage: gen_zone.py OUTDIR [--services N] [--endpoints-per-service E] [--manifests DIR]
"""
import argparse
import json
import os
import random

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--services", type=int, default=10000)
ap.add_argument("--endpoints-per-service", type=int, default=10)
ap.add_argument("--queries", type=int, default=100000)
ap.add_argument("--manifests", help="also write the cluster as manifests into this directory")
a = ap.parse_args()
os.makedirs(a.out, exist_ok=True)
Z = "cluster.local"
N, E = a.services, a.endpoints_per_service


def cip(i):
    return f"10.96.{i // 256}.{i % 256}"


def eip(i, j):
    k = i * E + j
    return f"10.{128 + k // 65536}.{(k // 256) % 256}.{k % 256}"


with open(os.path.join(a.out, "cluster.local.zone"), "w") as f:
    f.write(f"$ORIGIN {Z}.\n$TTL 5\n")
    f.write(f"@ IN SOA ns.dns.{Z}. hostmaster.{Z}. 1 7200 1800 86400 5\n")
    f.write(f"@ IN NS ns.dns.{Z}.\n")
    f.write("ns.dns IN A 127.0.0.1\n")
    f.write('dns-version IN TXT "1.1.0"\n')
    for i in range(N):
        base = f"svc{i}.ns{i % 100}.svc"
        if i % 10 == 0:
            for j in range(E):
                f.write(f"{base} IN A {eip(i, j)}\n")
                f.write(f"ep-{j}.{base} IN A {eip(i, j)}\n")
                f.write(f"_http._tcp.{base} IN SRV 0 10 8080 ep-{j}.{base}.{Z}.\n")
        else:
            f.write(f"{base} IN A {cip(i)}\n")
            f.write(f"_http._tcp.{base} IN SRV 0 100 80 {base}.{Z}.\n")

def rev(ip):
    return ".".join(reversed(ip.split("."))) + ".in-addr.arpa"


with open(os.path.join(a.out, "10.in-addr.arpa.zone"), "w") as f:
    f.write("$ORIGIN 10.in-addr.arpa.\n$TTL 5\n")
    f.write(f"@ IN SOA ns.dns.{Z}. hostmaster.{Z}. 1 7200 1800 86400 5\n")
    f.write(f"@ IN NS ns.dns.{Z}.\n")
    for i in range(N):
        base = f"svc{i}.ns{i % 100}.svc.{Z}."
        if i % 10 == 0:
            for j in range(E):
                f.write(f"{rev(eip(i, j))}. IN PTR ep-{j}.{base}\n")
        else:
            f.write(f"{rev(cip(i))}. IN PTR {base}\n")

rng = random.Random(1)
with open(os.path.join(a.out, "queries.txt"), "w") as f:
    for _ in range(a.queries):
        i = rng.randrange(N)
        base = f"svc{i}.ns{i % 100}.svc.{Z}"
        r = rng.random()
        if r < 0.6:
            f.write(f"{base} A\n")
        elif r < 0.7:
            f.write(f"{base} AAAA\n")  # NODATA
        elif r < 0.8:
            f.write(f"nope{i}.ns{i % 100}.svc.{Z} A\n")  # NXDOMAIN
        elif r < 0.9:
            f.write(f"_http._tcp.{base} SRV\n")
        else:
            ip = eip(i, rng.randrange(E)) if i % 10 == 0 else cip(i)
            f.write(f"{rev(ip)} PTR\n")


def write_manifests(out):
    os.makedirs(out, exist_ok=True)
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "node-a"},
            "spec": {"podCIDR": "10.244.0.0/24"},
            "status": {"addresses": [{"type": "InternalIP", "address": "192.168.77.2"},
                                     {"type": "Hostname", "address": "node-a"}]}}
    services, slices = [], []
    for i in range(N):
        ns, name = f"ns{i % 100}", f"svc{i}"
        ip = "None" if i % 10 == 0 else cip(i)
        services.append({
            "apiVersion": "v1", "kind": "Service",
            "metadata": {"name": name, "namespace": ns, "uid": f"00000000-0000-4000-8000-{i:012d}"},
            "spec": {"type": "ClusterIP", "clusterIP": ip, "clusterIPs": [ip],
                     "selector": {"app": name},
                     "ports": [{"name": "http", "protocol": "TCP", "port": 80,
                                "targetPort": 8080}]}})
        slices.append({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": f"{name}-0", "namespace": ns,
                         "labels": {"kubernetes.io/service-name": name,
                                    "endpointslice.kubernetes.io/managed-by":
                                        "endpointslice-controller.k8s.io"}},
            "addressType": "IPv4",
            "ports": [{"name": "http", "protocol": "TCP", "port": 8080}],
            "endpoints": [{"addresses": [eip(i, j)], "hostname": f"ep-{j}", "nodeName": "node-a",
                           "conditions": {"ready": True, "serving": True, "terminating": False}}
                          for j in range(E)]})
    for fname, items in (("nodes.json", [node]), ("services.json", services),
                         ("endpointslices.json", slices)):
        with open(os.path.join(out, fname), "w") as f:
            json.dump({"apiVersion": "v1", "kind": "List", "items": items}, f,
                      separators=(",", ":"))


if a.manifests:
    write_manifests(a.manifests)
