#!/usr/bin/env python3
"""Checks the endpointd Helm chart: helm lint, helm template with the default values and with
every feature switched on and off, the rendered objects, the example workload's prestop
wiring, and that invalid values fail naming the value.

usage: chart_test.py HELM CHART_DIR [ENDPOINTD_BINARY]"""
import base64
import ipaddress
import os
import subprocess
import sys
import tempfile
import time

import yaml

HELM, CHART = sys.argv[1], sys.argv[2]
ENDPOINTD = sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] else ""
PEER_CERTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "scripts", "peer-certs")
failures = []
checks = 0


def check(cond, what):
    global checks
    checks += 1
    if not cond:
        failures.append(what)
        print("FAIL:", what)


def helm(*args):
    return subprocess.run([HELM, *args], capture_output=True, text=True, timeout=120)


def render(name, sets, namespace="endpointd"):
    args = ["template", "t", CHART, "--namespace", namespace]
    for s in sets:
        args += ["--set", s]
    r = helm(*args)
    check(r.returncode == 0, f"[{name}] helm template failed: {r.stderr.strip()}")
    if r.returncode != 0:
        return []
    return [d for d in yaml.safe_load_all(r.stdout) if d]


API = {
    "ServiceAccount": "v1",
    "ConfigMap": "v1",
    "Service": "v1",
    "ClusterRole": "rbac.authorization.k8s.io/v1",
    "ClusterRoleBinding": "rbac.authorization.k8s.io/v1",
    "DaemonSet": "apps/v1",
    "Deployment": "apps/v1",
    "ServiceMonitor": "monitoring.coreos.com/v1",
    "NetworkPolicy": "networking.k8s.io/v1",
    "Secret": "v1",
}


def one(objs, kind, name=None):
    got = [o for o in objs if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    return got[0] if len(got) == 1 else None


def hostport(s):
    host, _, port = s.rpartition(":")
    return host.strip("[]"), int(port)


def loopback(host):
    return host.startswith("127.") or host in ("::1", "localhost")


def values_of(sets):
    """The chart's values.yaml with the --set overrides applied (the ones this test uses)."""
    v = yaml.safe_load(open(os.path.join(CHART, "values.yaml")))
    for s in sets:
        key, _, val = s.partition("=")
        node = v
        parts = key.split(".")
        for p in parts[:-1]:
            node = node[p]
        if val.startswith("{") and val.endswith("}"):
            val = [x for x in val[1:-1].split(",") if x]
        elif val in ("true", "false"):
            val = val == "true"
        elif val.isdigit():
            val = int(val)
        node[parts[-1]] = val
    return v


def peer_auth(v):
    """identity, peerTLS or insecure (drain.peerTLS.insecure wins), as the chart decides."""
    return "insecure" if v["drain"]["peerTLS"]["insecure"] else v["drain"]["peerAuth"]


def peer_server_secret(v, objs):
    return v["drain"]["peerIdentity"]["serverSecretName"] or \
        one(objs, "DaemonSet")["metadata"]["name"] + "-peer-server"


def check_render(name, sets, namespace="endpointd"):
    objs = render(name, sets, namespace)
    if not objs:
        return None
    v = values_of(sets)
    auth = peer_auth(v)
    dns_port = hostport(v["dns"]["listen"])[1]
#Kinds and apiVersions.
    kinds = sorted(o["kind"] for o in objs)
    want = ["ClusterRole", "ClusterRoleBinding", "ConfigMap", "DaemonSet", "ServiceAccount"]
    if auth == "identity":
        want.append("ClusterRoleBinding")  # system:service-account-issuer-discovery
        if not v["drain"]["peerIdentity"]["serverSecretName"]:
            want.append("Secret")  # the peer port's one server certificate
    if v["kubeDNS"]["enabled"]:
        want.append("Service")
    if v["drain"]["members"] == "service":
        want.append("Service")
    if v["metrics"]["serviceMonitor"]["enabled"]:
        want += ["Service", "ServiceMonitor"]
    if v["exampleWorkload"]["enabled"]:
        want.append("Deployment")
    if v["networkPolicy"]["enabled"]:
        want.append("NetworkPolicy")
    check(kinds == sorted(want), f"[{name}] kinds {kinds}, want {sorted(want)}")
    for o in objs:
        check(o["apiVersion"] == API.get(o["kind"]), f"[{name}] {o['kind']} has apiVersion {o['apiVersion']}")
        if o["kind"] not in ("ClusterRole", "ClusterRoleBinding"):
            check(o["metadata"].get("namespace") == namespace, f"[{name}] {o['kind']} not in namespace {namespace}")

#The config file.
    cm = one(objs, "ConfigMap")
    cfg = yaml.safe_load(cm["data"]["config.yaml"])
    check(cfg["dataplane"] == ("nftables" if v["dataplane"]["enabled"] else "none"), f"[{name}] dataplane {cfg['dataplane']}")
    check(("dns-listen" in cfg) == v["dns"]["enabled"], f"[{name}] dns-listen present iff dns.enabled")
    if v["dns"]["enabled"]:
        check(cfg["dns-listen"] == v["dns"]["listen"], f"[{name}] dns-listen {cfg.get('dns-listen')}")
#Node-local DNS: the address as given, only with DNS on.
    want_nla = v["dns"]["nodeLocalAddress"] if v["dns"]["enabled"] else ""
    check(cfg.get("dns-node-local-address", "") == want_nla,
          f"[{name}] dns-node-local-address {cfg.get('dns-node-local-address')}, want {want_nla!r}")
#Additional zones: as given, only with DNS on.
    want_zones = v["dns"]["extraZones"] if v["dns"]["enabled"] else []
    check(cfg.get("dns-extra-zones", []) == want_zones,
          f"[{name}] dns-extra-zones {cfg.get('dns-extra-zones')}, want {want_zones!r}")
    check(("feed-listen" in cfg) == v["feed"]["enabled"], f"[{name}] feed-listen present iff feed.enabled")
    check(cfg["admin-listen"] == v["admin"]["listen"], f"[{name}] admin-listen {cfg['admin-listen']}")
    check(cfg["health-listen"] == v["health"]["listen"], f"[{name}] health-listen {cfg['health-listen']}")
    check(cfg["detect-local-mode"] == v["detectLocalMode"], f"[{name}] detect-local-mode {cfg.get('detect-local-mode')}")
    check(cfg.get("service-cidr", []) == v["serviceCIDR"], f"[{name}] service-cidr {cfg.get('service-cidr')}")
    check(cfg.get("pod-interface-name-prefix", "") == v["podInterfaceNamePrefix"],
          f"[{name}] pod-interface-name-prefix {cfg.get('pod-interface-name-prefix')}")
    check(cfg["watch-stall-timeout"] == v["watchStallTimeoutSeconds"],
          f"[{name}] watch-stall-timeout {cfg.get('watch-stall-timeout')}")
    token = v["admin"]["tokenSecret"]
    want_token = f"/etc/endpointd-admin-token/{token['key']}" if token["name"] else None
    check(cfg.get("admin-token-file") == want_token,
          f"[{name}] admin-token-file {cfg.get('admin-token-file')}, want {want_token}")
    ftls = v["feed"]["tls"]
    feed_tls = v["feed"]["enabled"] and bool(ftls["secretName"])
    want_feed = {}
    if v["feed"]["enabled"]:
        # Kept next to the drain socket, in the hostPath directory the agent mounts read-write.
        want_feed["feed-state-file"] = v["drain"]["socketDir"].rstrip("/") + "/feed-subscribers"
    if feed_tls:
        want_feed.update({"feed-tls-cert": "/etc/endpointd-feed-tls/tls.crt",
                          "feed-tls-key": "/etc/endpointd-feed-tls/tls.key"})
        if ftls["clientCA"]:
            want_feed["feed-client-ca"] = "/etc/endpointd-feed-tls/ca.crt"
    got_feed = {k: x for k, x in cfg.items() if k.startswith("feed-") and k != "feed-listen"}
    check(got_feed == want_feed, f"[{name}] feed settings {got_feed}, want {want_feed}")
    sock = v["drain"]["socketDir"].rstrip("/") + "/" + v["drain"]["socketName"]
    check(cfg["drain-socket"] == sock, f"[{name}] drain-socket {cfg['drain-socket']}, want {sock}")
    check(cfg["drain-peer-policy"] == v["drain"]["peerPolicy"], f"[{name}] drain-peer-policy")
    check(cfg["drain-peer-timeout-ms"] == v["drain"]["peerTimeoutMs"], f"[{name}] drain-peer-timeout-ms")
    check(cfg["drain-release-after"] == v["drain"]["releaseAfter"], f"[{name}] drain-release-after")
#The drain's members: the agents' own headless Service, or (no flag) every Node.
    peers_name = one(objs, "DaemonSet")["metadata"]["name"] + "-peers"
    want_members = f"{namespace}/{peers_name}" if v["drain"]["members"] == "service" else None
    check(cfg.get("drain-members-service") == want_members,
          f"[{name}] drain-members-service {cfg.get('drain-members-service')}, want {want_members}")
    check(cfg["log-format"] == v["log"]["format"], f"[{name}] log-format")
    check(cfg["watch-pods"] == v["watchPods"], f"[{name}] watch-pods")
    check(cfg["events"] == v["events"]["enabled"], f"[{name}] events")
    check(cfg.get("cluster-cidr", []) == v["clusterCIDR"], f"[{name}] cluster-cidr {cfg.get('cluster-cidr')}")

#The DaemonSet.
    ds = one(objs, "DaemonSet")
    spec = ds["spec"]
    pod = spec["template"]["spec"]
    check(spec["updateStrategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}},
          f"[{name}] updateStrategy {spec['updateStrategy']}")
    check(spec["selector"]["matchLabels"].items() <= spec["template"]["metadata"]["labels"].items(),
          f"[{name}] selector does not select the template")
    check(pod.get("hostNetwork") is True, f"[{name}] hostNetwork")
    check(pod.get("hostPID") is True, f"[{name}] hostPID")
    check(pod.get("dnsPolicy") == "Default", f"[{name}] dnsPolicy (the node's resolv.conf: never its own upstream)")
    check(pod.get("priorityClassName") == "system-node-critical", f"[{name}] priorityClassName")
    check(pod.get("tolerations") == [{"operator": "Exists"}], f"[{name}] tolerations {pod.get('tolerations')}")
    sa = one(objs, "ServiceAccount")
    check(pod.get("serviceAccountName") == sa["metadata"]["name"], f"[{name}] serviceAccountName")
    check(len(pod["containers"]) == 1, f"[{name}] one container")
    c = pod["containers"][0]
    check(c["args"][:3] == ["run", "--config", "/etc/endpointd/config.yaml"], f"[{name}] args {c['args']}")
#Peers : identity (a projected token, one shared server certificate), mutual TLS from the
#Secret (this node's pair), or plaintext only when asked for.
    tls_dir = "/etc/endpointd-peer-tls"
    pod_vols = ds["spec"]["template"]["spec"]["volumes"]
    peer_vols = [x for x in pod_vols if x["name"] == "peer-tls"]
    peer_mounts = [m for m in c["volumeMounts"] if m["name"] == "peer-tls"]
    token_vols = [x for x in pod_vols if x["name"] == "peer-token"]
    server_vols = [x for x in pod_vols if x["name"] == "peer-server"]
    if auth == "insecure":
        check(c["args"][3:] == ["--drain-peer-insecure"], f"[{name}] insecure peers: args {c['args']}")
        check(not peer_vols and not peer_mounts and not token_vols and not server_vols,
              f"[{name}] insecure peers mount no Secret and no token")
    elif auth == "identity":
        sdir = "/etc/endpointd-peer-server"
        want_args = ["--drain-peer-token-file", "/var/run/secrets/endpointd-peer/token",
                     "--drain-peer-ca", sdir + "/ca.crt", "--drain-peer-cert", sdir + "/tls.crt",
                     "--drain-peer-key", sdir + "/tls.key"]
        check(c["args"][3:] == want_args, f"[{name}] peer identity args {c['args']}")
        check(not peer_vols and not peer_mounts, f"[{name}] identity mounts the per-node peer Secret")
        src = token_vols[0]["projected"]["sources"] if len(token_vols) == 1 else []
        check(src == [{"serviceAccountToken": {
                  "audience": "endpointd-peer",
                  "expirationSeconds": v["drain"]["peerIdentity"]["expirationSeconds"], "path": "token"}}],
              f"[{name}] peer token volume {token_vols}")
        mounts_by = {m["name"]: m for m in c["volumeMounts"]}
        check(mounts_by.get("peer-token", {}).get("mountPath") == "/var/run/secrets/endpointd-peer"
              and mounts_by["peer-token"].get("readOnly") is True, f"[{name}] peer token mount")
        check(mounts_by.get("peer-server", {}).get("mountPath") == sdir
              and mounts_by["peer-server"].get("readOnly") is True, f"[{name}] peer server mount")
        # The Done-when of issue 33: no Secret mounted holds a node's private key. The server
        # Secret's volume projects exactly the shared certificate, its key and the CA.
        sv = server_vols[0]["secret"] if len(server_vols) == 1 else {}
        check(sv.get("secretName") == peer_server_secret(v, objs)
              and sorted(i["key"] for i in sv.get("items", [])) == ["ca.crt", "tls.crt", "tls.key"],
              f"[{name}] peer server Secret volume {server_vols}")
        made = one(objs, "Secret", peer_server_secret(v, objs))
        if not v["drain"]["peerIdentity"]["serverSecretName"]:
            check(made is not None and sorted(made["data"]) == ["ca.crt", "tls.crt", "tls.key"],
                  f"[{name}] the chart's peer server Secret holds {sorted(made['data']) if made else None}")
            if made:
                crt = base64.b64decode(made["data"]["tls.crt"]).decode()
                out = subprocess.run(["openssl", "x509", "-noout", "-subject"], input=crt, capture_output=True,
                                     text=True).stdout
                check("endpointd-peer" in out, f"[{name}] peer server certificate subject {out.strip()}")
        for o in objs:
            if o["kind"] == "Secret":
                check(not [k for k in o.get("data", {}) if k.endswith(".key") and k != "tls.key"],
                      f"[{name}] Secret {o['metadata']['name']} holds per-node keys {sorted(o['data'])}")
        disc = [o for o in objs if o["kind"] == "ClusterRoleBinding"
                and o["roleRef"]["name"] == "system:service-account-issuer-discovery"]
        check(len(disc) == 1 and disc[0]["subjects"] == [
            {"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": namespace}],
              f"[{name}] issuer discovery binding {disc}")
    else:
        want_args = ["--drain-peer-ca", tls_dir + "/ca.crt",
                     "--drain-peer-cert", tls_dir + "/$(NODE_NAME).crt",
                     "--drain-peer-key", tls_dir + "/$(NODE_NAME).key"]
        check(c["args"][3:] == want_args, f"[{name}] peer TLS args {c['args']}")
        check(len(peer_vols) == 1 and peer_vols[0]["secret"]["secretName"] == v["drain"]["peerTLS"]["secretName"],
              f"[{name}] peer Secret volume {peer_vols}")
        check(len(peer_mounts) == 1 and peer_mounts[0]["mountPath"] == tls_dir and peer_mounts[0].get("readOnly"),
              f"[{name}] peer Secret mount {peer_mounts}")
        check(not token_vols and not server_vols, f"[{name}] peerTLS mounts no token")
    env = {e["name"]: e for e in c.get("env", [])}
    check(env.get("NODE_NAME", {}).get("valueFrom") == {"fieldRef": {"fieldPath": "spec.nodeName"}},
          f"[{name}] NODE_NAME from the downward API")
    res = c.get("resources", {})
    check(res.get("requests", {}).get("cpu") and res.get("requests", {}).get("memory")
          and res.get("limits", {}).get("memory"), f"[{name}] resources {res}")

    # The conntrack settings: in the config file under their flags' names, and written by a
    # privileged init container (`run --init-only`) unless the agent itself is privileged.
    ct_names = {"maxPerCore": "conntrack-max-per-core", "min": "conntrack-min",
                "tcpTimeoutEstablished": "conntrack-tcp-timeout-established",
                "tcpTimeoutCloseWait": "conntrack-tcp-timeout-close-wait",
                "tcpBeLiberal": "conntrack-tcp-be-liberal", "udpTimeout": "conntrack-udp-timeout",
                "udpTimeoutStream": "conntrack-udp-timeout-stream"}
    ct_given = {flag: v["conntrack"][k] for k, flag in ct_names.items() if v["conntrack"][k]}
    ct_cfg = {k: val for k, val in cfg.items() if k.startswith("conntrack-")}
    check({k: str(val).lower() for k, val in ct_cfg.items()} == {k: str(val).lower() for k, val in ct_given.items()},
          f"[{name}] conntrack keys in the config {ct_cfg}, want {ct_given}")
    inits = ds["spec"]["template"]["spec"].get("initContainers", [])
    if ct_given and not v["privileged"]:
        check(len(inits) == 1, f"[{name}] conntrack settings without their init container: {inits}")
        if inits:
            ic = inits[0]
            want_args = ["run", "--init-only"] + [f"--{k}={str(val).lower()}" for k, val in ct_given.items()]
            check(sorted(ic.get("args", [])) == sorted(want_args), f"[{name}] init container args {ic.get('args')}, want {want_args}")
            check(ic.get("securityContext", {}).get("privileged") is True, f"[{name}] init container not privileged")
            check(ic.get("image") == c["image"], f"[{name}] init container image {ic.get('image')}")
    else:
        check(inits == [], f"[{name}] an init container without conntrack settings to write (or privileged): {inits}")

    sc = c["securityContext"]
    if v["privileged"]:
        check(sc.get("privileged") is True, f"[{name}] privileged asked for, not set")
    else:
        check(sc.get("privileged") is False, f"[{name}] privileged {sc.get('privileged')}")
        check(sc.get("allowPrivilegeEscalation") is False, f"[{name}] allowPrivilegeEscalation")
        check(sc.get("readOnlyRootFilesystem") is True, f"[{name}] readOnlyRootFilesystem")
        caps = sc.get("capabilities", {})
        check(caps.get("drop") == ["ALL"], f"[{name}] capabilities.drop {caps.get('drop')}")
        want_caps = {"NET_ADMIN"}
        if v["dns"]["enabled"] and dns_port < 1024:
            want_caps.add("NET_BIND_SERVICE")
        check(set(caps.get("add", [])) == want_caps and len(caps.get("add", [])) == len(want_caps),
              f"[{name}] capabilities.add {caps.get('add')}, want {sorted(want_caps)}")
#No rendered object asks for NET_RAW(endpointd opens no raw or packet socket).
    check("NET_RAW" not in yaml.safe_dump_all(objs), f"[{name}] NET_RAW in the rendered objects")

#Mounts and volumes : the config, the drain socket's host directory, /lib/modules read-only.
    vols = {x["name"]: x for x in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    cfg_mount = mounts.get("/etc/endpointd")
    check(cfg_mount and cfg_mount.get("readOnly") is True
          and vols[cfg_mount["name"]].get("configMap", {}).get("name") == cm["metadata"]["name"],
          f"[{name}] /etc/endpointd is not the ConfigMap, read-only")
    sdir = v["drain"]["socketDir"]
    sm = mounts.get(sdir)
    check(sm and vols[sm["name"]].get("hostPath", {}).get("path") == sdir,
          f"[{name}] drain socket dir {sdir} is not a hostPath mount")
    if "feed-state-file" in cfg:
        check(sm and not sm.get("readOnly") and os.path.dirname(cfg["feed-state-file"]) == sdir.rstrip("/"),
              f"[{name}] feed-state-file {cfg['feed-state-file']} is not in the agent's writable {sdir}")
    lm = mounts.get("/lib/modules")
    check(lm and lm.get("readOnly") is True and vols[lm["name"]].get("hostPath", {}).get("path") == "/lib/modules",
          f"[{name}] /lib/modules not mounted read-only from the host")
    stdir = v["drain"]["stateDir"]
    stm = mounts.get(stdir)
    check(stm and not stm.get("readOnly") and vols[stm["name"]].get("hostPath", {}).get("path") == stdir
          and os.path.dirname(cfg.get("drain-state-file", "")) == stdir.rstrip("/"),
          f"[{name}] drain-state-file {cfg.get('drain-state-file')} is not in the agent's writable {stdir}")
    host_paths = sorted(x["hostPath"]["path"] for x in pod["volumes"] if "hostPath" in x)
    check(host_paths == sorted([sdir, stdir, "/lib/modules"]), f"[{name}] host paths {host_paths}")
#The admin token and the feed's TLS files: from their Secrets, read-only, only when asked for.
    tm = mounts.get("/etc/endpointd-admin-token")
    if token["name"]:
        tv = vols.get(tm["name"], {}).get("secret", {}) if tm else {
}
        check(tm and tm.get("readOnly") is True and tv.get("secretName") == token["name"]
              and [i["key"] for i in tv.get("items", [])] == [token["key"]]
              and [i["path"] for i in tv.get("items", [])] == [token["key"]],
              f"[{name}] admin token Secret mount {tm} {tv}")
    else:
        check(tm is None, f"[{name}] admin token mounted without admin.tokenSecret.name")
    fm = mounts.get("/etc/endpointd-feed-tls")
    if feed_tls:
        fv = vols.get(fm["name"], {}).get("secret", {}) if fm else {}
        check(fm and fm.get("readOnly") is True and fv.get("secretName") == ftls["secretName"],
              f"[{name}] feed TLS Secret mount {fm} {fv}")
    else:
        check(fm is None, f"[{name}] feed TLS mounted without feed.enabled and feed.tls.secretName")
    secret_vols = sorted(x["secret"]["secretName"] for x in pod["volumes"] if "secret" in x)
    want_secrets = {"insecure": [], "peerTLS": [v["drain"]["peerTLS"]["secretName"]],
                    "identity": [peer_server_secret(v, objs)]}[auth] \
        + ([token["name"]] if token["name"] else []) + ([ftls["secretName"]] if feed_tls else [])
    check(secret_vols == sorted(want_secrets), f"[{name}] Secret volumes {secret_vols}, want {sorted(want_secrets)}")

#Probes on the health port(the admin port when health is off), at real paths.
    probe_listen = cfg["health-listen"] or cfg["admin-listen"]
    phost, pport = hostport(probe_listen)
    for probe, path in (("livenessProbe", "/livez"), ("readinessProbe", "/readyz")):
        g = c.get(probe, {}).get("httpGet", {})
        check(g.get("path") == path, f"[{name}] {probe} path {g.get('path')}, want {path}")
        check(g.get("port") == pport, f"[{name}] {probe} port {g.get('port')}, want {pport} ({probe_listen})")
        if loopback(phost):
            check(g.get("host") == "127.0.0.1", f"[{name}] {probe} of a loopback address has host {g.get('host')}")
        elif phost in ("", "0.0.0.0", "::"):
            check("host" not in g, f"[{name}] {probe} sets host {g.get('host')}")
        else:
            check(g.get("host") == phost, f"[{name}] {probe} host {g.get('host')}, want {phost}")
    ports = {p["name"]: p for p in c["ports"]}
    if cfg["health-listen"]:
        check(ports.get("health", {}).get("containerPort") == hostport(cfg["health-listen"])[1],
              f"[{name}] health containerPort {ports.get('health')}")
    else:
        check("health" not in ports, f"[{name}] health containerPort with health-listen off")
    aport = hostport(cfg["admin-listen"])[1] if cfg["admin-listen"] else None
    if cfg["admin-listen"] and not loopback(hostport(cfg["admin-listen"])[0]):
        check(ports.get("admin", {}).get("containerPort") == aport,
              f"[{name}] admin containerPort {ports.get('admin')}")
    else:
        check("admin" not in ports, f"[{name}] admin containerPort for a loopback or disabled admin listener")

#RBAC : list / watch on exactly services, nodes, pods and endpointslices; create / patch on
#events.k8s.io events only with events.enabled.
    role = one(objs, "ClusterRole")
    granted = set()
    events_rules = [r for r in role["rules"] if r.get("apiGroups") == ["events.k8s.io"]]
    want_events = [{"apiGroups": ["events.k8s.io"], "resources": ["events"], "verbs": ["create", "patch"]}]
    check(events_rules == (want_events if v["events"]["enabled"] else []),
          f"[{name}] events rule {events_rules}")
    pod_get = [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]
    get_rules = [r for r in role["rules"] if r.get("verbs") == ["get"]]
    check(get_rules == (pod_get if auth == "identity" else []), f"[{name}] get rules {get_rules}")
    for rule in role["rules"]:
        if rule in events_rules or rule in get_rules:
            continue
        check(sorted(rule.get("verbs", [])) == ["list", "watch"], f"[{name}] verbs {rule.get('verbs')}")
        check(set(rule) <= {"apiGroups", "resources", "verbs"}, f"[{name}] rule has {sorted(rule)}")
        for g in rule.get("apiGroups", []):
            for r in rule.get("resources", []):
                granted.add((g, r))
    check(granted == {("", "services"), ("", "nodes"), ("", "pods"), ("discovery.k8s.io", "endpointslices")},
          f"[{name}] RBAC grants {sorted(granted)}")
    crb = [o for o in objs if o["kind"] == "ClusterRoleBinding" and o["roleRef"]["kind"] == "ClusterRole"
           and o["roleRef"]["name"] == role["metadata"]["name"]]
    crb = crb[0] if len(crb) == 1 else {"roleRef": None, "subjects": None}
    check(crb["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role["metadata"]["name"]},
          f"[{name}] roleRef {crb['roleRef']}")
    check(crb["subjects"] == [{"kind": "ServiceAccount", "name": sa["metadata"]["name"], "namespace": namespace}],
          f"[{name}] subjects {crb['subjects']}")

    pod_labels = spec["template"]["metadata"]["labels"]
    if v["kubeDNS"]["enabled"]:
        svc = one(objs, "Service", v["kubeDNS"]["name"])
        check(svc is not None, f"[{name}] no Service {v['kubeDNS']['name']}")
        if svc:
            check(svc["spec"]["clusterIP"] == v["kubeDNS"]["clusterIP"], f"[{name}] kube-dns clusterIP")
            check(sorted((p["port"], p["protocol"], p["targetPort"]) for p in svc["spec"]["ports"])
                  == [(53, "TCP", dns_port), (53, "UDP", dns_port)], f"[{name}] kube-dns ports {svc['spec']['ports']}")
            check(svc["spec"]["selector"].items() <= pod_labels.items(), f"[{name}] kube-dns does not select the agents")
            check(svc["spec"].get("internalTrafficPolicy") == v["kubeDNS"]["internalTrafficPolicy"],
                  f"[{name}] kube-dns internalTrafficPolicy {svc['spec'].get('internalTrafficPolicy')}")
    peers = one(objs, "Service", peers_name)
    check((peers is not None) == (v["drain"]["members"] == "service"),
          f"[{name}] Service {peers_name} present iff drain.members is service")
    if peers:
        # Headless over exactly the agent pods, at the peer port: its endpoints are the members.
        check(peers["spec"].get("clusterIP") == "None", f"[{name}] {peers_name} is not headless")
        check(peers["spec"]["selector"] == spec["selector"]["matchLabels"],
              f"[{name}] {peers_name} selector {peers['spec']['selector']}, want the DaemonSet's")
        check([(p["port"], p["protocol"]) for p in peers["spec"]["ports"]] == [(v["drain"]["peerPort"], "TCP")],
              f"[{name}] {peers_name} ports {peers['spec']['ports']}")
    if v["metrics"]["serviceMonitor"]["enabled"]:
        sm_obj = one(objs, "ServiceMonitor")
        msvc = [o for o in objs if o["kind"] == "Service" and o["metadata"]["name"].endswith("-metrics")]
        check(len(msvc) == 1, f"[{name}] metrics Service")
        if msvc and sm_obj:
            msvc = msvc[0]
            check(msvc["spec"]["selector"].items() <= pod_labels.items(), f"[{name}] metrics Service selector")
            check(sm_obj["spec"]["selector"]["matchLabels"].items() <= msvc["metadata"]["labels"].items(),
                  f"[{name}] ServiceMonitor does not select the metrics Service")
            check(msvc["spec"]["ports"][0]["port"] == aport, f"[{name}] metrics port")
            ep = sm_obj["spec"]["endpoints"][0]
            check(ep["port"] == "admin" and ep["path"] == "/metrics", f"[{name}] ServiceMonitor endpoint")
            want_bearer = {"name": token["name"], "key": token["key"]} if token["name"] else None
            check(ep.get("bearerTokenSecret") == want_bearer,
                  f"[{name}] ServiceMonitor bearerTokenSecret {ep.get('bearerTokenSecret')}, want {want_bearer}")
            check(ports.get("admin") is not None, f"[{name}] ServiceMonitor scrapes a port the pod does not declare")
    if v["networkPolicy"]["enabled"]:
        check_network_policy(name, one(objs, "NetworkPolicy"), v, cfg, pod_labels, ds)
    if v["exampleWorkload"]["enabled"]:
        check_workload(name, one(objs, "Deployment"), ds, cfg)
    return objs


def check_network_policy(name, np, v, cfg, pod_labels, ds):
    """Ingress only, to the agent pods: which port is open to whom."""
    check(np is not None, f"[{name}] no NetworkPolicy")
    if np is None:
        return
    spec = np["spec"]
    check(spec["podSelector"]["matchLabels"] == ds["spec"]["selector"]["matchLabels"],
          f"[{name}] NetworkPolicy podSelector {spec['podSelector']}")
    check(spec["policyTypes"] == ["Ingress"], f"[{name}] NetworkPolicy policyTypes {spec['policyTypes']}")
    rules = {}
    for rule in spec["ingress"]:
        for p in rule["ports"]:
            rules.setdefault((p["port"], p["protocol"]), []).append(rule.get("from"))
    nodes = [{
  "ipBlock" : {
    "cidr" : c
  }} for c in v["networkPolicy"]["nodeCIDRs"]]
    want = {}
    if cfg["health-listen"]:
        want[(hostport(cfg["health-listen"])[1], "TCP")] = [None]  # from anywhere
    want[(v["drain"]["peerPort"], "TCP")] = [nodes]
    if v["feed"]["enabled"]:
        want[(hostport(cfg["feed-listen"])[1], "TCP")] = [[v["networkPolicy"]["feedClients"]]]
    if v["dns"]["enabled"]:
        dp = hostport(cfg["dns-listen"])[1]
        want[(dp, "UDP")] = want[(dp, "TCP")] = [[{"namespaceSelector": {}}] + nodes]
    admin_clients = v["networkPolicy"]["adminClients"]
    if cfg["admin-listen"] and not loopback(hostport(cfg["admin-listen"])[0]) and admin_clients:
        want[(hostport(cfg["admin-listen"])[1], "TCP")] = [admin_clients]
    check(rules == want, f"[{name}] NetworkPolicy ingress {rules}, want {want}")


def check_workload(name, dep, ds, cfg):
    """The preStop runs a binary the init container provides, on the agent's socket."""
    pod = dep["spec"]["template"]["spec"]
    vols = {x["name"]: x for x in pod["volumes"]}
    check(isinstance(pod.get("terminationGracePeriodSeconds"), int), f"[{name}] workload terminationGracePeriodSeconds")
    init = pod["initContainers"][0]
    init_mounts = {m["name"]: m["mountPath"] for m in init["volumeMounts"]}
    app = [c for c in pod["containers"] if "lifecycle" in c][0]
    cmd = app["lifecycle"]["preStop"]["exec"]["command"]
    check(cmd[1] == "prestop" and "--drain-socket" in cmd, f"[{name}] preStop {cmd}")
    binary = cmd[0]
    app_mounts = {m["mountPath"]: m["name"] for m in app["volumeMounts"]}
    bin_dir = os.path.dirname(binary)
    vol = app_mounts.get(bin_dir)
    check(vol is not None and "emptyDir" in vols.get(vol, {}), f"[{name}] {bin_dir} is not a shared emptyDir in the app")
    check(init_mounts.get(vol) is not None, f"[{name}] the init container does not mount {vol}")
#The init container copies the image's prestop bundle (endpointd + lib/) into that volume.
    icmd = init.get("command", [])
    check(icmd[:2] == ["cp", "-a"] and icmd[-1].rstrip("/") == init_mounts.get(vol, "").rstrip("/")
          and os.path.basename(binary) == "endpointd",
          f"[{name}] init container {icmd} does not provide {binary}")
    check(init["image"] == ds["spec"]["template"]["spec"]["containers"][0]["image"],
          f"[{name}] init container image {init['image']} is not the agent's")
    sock = cmd[cmd.index("--drain-socket") + 1]
    check(sock == cfg["drain-socket"], f"[{name}] preStop socket {sock}, agent's {cfg['drain-socket']}")
    sv = app_mounts.get(os.path.dirname(sock))
    ds_sock_vol = [x for x in ds["spec"]["template"]["spec"]["volumes"]
                   if x.get("hostPath", {}).get("path") == os.path.dirname(cfg["drain-socket"])]
    check(sv is not None and ds_sock_vol and vols[sv].get("hostPath", {}).get("path") == ds_sock_vol[0]["hostPath"]["path"],
          f"[{name}] the app does not mount the agent's socket host directory")
    ro = [m for m in app["volumeMounts"] if m["mountPath"] == os.path.dirname(sock)]
    check(ro and ro[0].get("readOnly") is True,
          f"[{name}] the app mounts the socket directory writable: a pod could replace the socket")


def run_config_with_binary(name, objs):
    """The rendered config file is accepted by the real `endpointd run --config` (the listeners
    moved to loopback and the source to an empty directory by flags, which win over the file)."""
    if not ENDPOINTD:
        return
    if not os.access(ENDPOINTD, os.X_OK):
        check(False, f"[{name}] no endpointd binary at {ENDPOINTD} to check the rendered config with")
        return
    cm = one(objs, "ConfigMap")
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "config.yaml")
        os.mkdir(os.path.join(d, "manifests"))
#The container's own arguments, with the peer Secret that scripts/peer-certs makes
#unpacked where the chart mounts it.
        c = one(objs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
        tls_dir = os.path.join(d, "peer-tls")
        os.mkdir(tls_dir)
        secret = yaml.safe_load(subprocess.run([PEER_CERTS, "n1", "n2"], capture_output=True, text=True,
                                               check=True).stdout)
        for k, b64 in secret["data"].items():
            open(os.path.join(tls_dir, k), "wb").write(base64.b64decode(b64))
#The admin token and the feed's Secret (a pair of the same CA as its tls.crt/tls.key),
#where the config file names them.
        token_dir, feed_dir = os.path.join(d, "admin-token"), os.path.join(d, "feed-tls")
        os.mkdir(token_dir)
        os.mkdir(feed_dir)
        cfg_text = cm["data"]["config.yaml"]
        tf = yaml.safe_load(cfg_text).get("admin-token-file")
        if tf:
            open(os.path.join(token_dir, os.path.basename(tf)), "w").write("s3cret-token\n")
        for src, dst in (("ca.crt", "ca.crt"), ("n1.crt", "tls.crt"), ("n1.key", "tls.key")):
            open(os.path.join(feed_dir, dst), "wb").write(open(os.path.join(tls_dir, src), "rb").read())
        cfg_text = cfg_text.replace("/etc/endpointd-admin-token", token_dir)
        cfg_text = cfg_text.replace("/etc/endpointd-feed-tls", feed_dir)
        open(path, "w").write(cfg_text)
        extra = [a.replace("/etc/endpointd-peer-tls", tls_dir).replace("$(NODE_NAME)", "n1")
                 for a in c["args"][3:]]
        # Identity fetches the issuer's keys from an API server there is none of here (its flags
        # are checked by check_render; tests/daemon/daemon_identity_test runs them): plaintext.
        if "--drain-peer-token-file" in extra:
            extra = ["--drain-peer-insecure"]
        args = [ENDPOINTD, "run", "--config", path, "--source-dir", os.path.join(d, "manifests"),
                "--node-name", "n1", "--dataplane", "none", "--admin-listen", "127.0.0.1:0",
                "--health-listen", "127.0.0.1:0",
                "--drain-socket", os.path.join(d, "drain.sock"), "--drain-peer-listen", "127.0.0.1:0"] + extra
        if "dns-listen" in yaml.safe_load(cm["data"]["config.yaml"]):
            args += ["--dns-listen", "127.0.0.1:0", "--dns-upstream", "127.0.0.1:1"]
        if "feed-listen" in yaml.safe_load(cm["data"]["config.yaml"]):
            args += ["--feed-listen", "127.0.0.1:0"]
        if "feed-state-file" in yaml.safe_load(cm["data"]["config.yaml"]):
            args += ["--feed-state-file", os.path.join(d, "feed-subscribers")]
        if "drain-state-file" in yaml.safe_load(cm["data"]["config.yaml"]):
            args += ["--drain-state-file", os.path.join(d, "drain-state")]
#The node-local address would go on an interface of this host: off here (the key is still
#taken; its values are checked by tests/netns/dns_node_local_test.cc, which runs it).
        if "dns-node-local-address" in yaml.safe_load(cm["data"]["config.yaml"]):
            args += ["--dns-node-local-address", ""]
        p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(1.5)
        rc = p.poll()
        if rc is None:
            p.terminate()
        out, err = p.communicate(timeout=30)
        check(rc is None, f"[{name}] endpointd rejected the rendered config (exit {rc}): {err.strip()[-500:]}")


# The names the agent's code exports metrics under: every string literal that is a metric name of
# one of its prefixes, in the agent's sources (prometheus-cpp registrations, the helpers that
# take a name, and the process collector's text).
AGENT_DIRS = ["watcher", "pipeline", "proxy", "httpd", "dns", "feed", "drain", "daemon"]
METRIC_LITERAL = r'"((?:kubeproxy|endpointd|coredns|rest_client|process)_[a-z0-9_]+)"'
PROMQL_WORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or",
                "unless", "offset", "le", "inf", "nan"}


def exported_metrics(source_root):
    import re
    names = set()
    for d in AGENT_DIRS:
        for dirpath, _, files in os.walk(os.path.join(source_root, d)):
            for f in files:
                if f.endswith((".cc", ".h")):
                    with open(os.path.join(dirpath, f), encoding="utf-8") as fh:
                        text = fh.read()
                    names.update(re.findall(METRIC_LITERAL, text))
                    # Written as Prometheus text by hand (the process collector, build info).
                    names.update(re.findall(r"# TYPE ([a-z_]+_[a-z0-9_]+) ", text))
    return names


def promql_metric_names(expr):
    """The metric names a PromQL expression selects: identifiers outside label matchers, ranges,
    strings and by/without lists that are not functions or keywords."""
    import re
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    names = set()
    for m in re.finditer(r"[a-zA-Z_:][a-zA-Z0-9_:]*", e):
        word = m.group(0)
        rest = e[m.end():].lstrip()
        if rest.startswith("(") or word.lower() in PROMQL_WORDS:
            continue
        if m.start() > 0 and (e[m.start() - 1].isdigit() or e[m.start() - 1] == "."):
            continue  # part of a number (1e3)
        names.add(word)
    return names


def unexported(names, exported):
    def known(n):
        if n in exported:
            return True
        for suffix in ("_bucket", "_sum", "_count"):
            if n.endswith(suffix) and n[: -len(suffix)] in exported:
                return True
        return False
    return sorted(n for n in names if not known(n))


def check_dashboard():
    """The Grafana dashboard ConfigMap: rendered only when enabled, labelled for the sidecar, and
    every query names only metrics the agent exports."""
    import json
    source_root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    exported = exported_metrics(source_root)
    check(len(exported) > 50, f"dashboard: only {len(exported)} exported metric names found")
    # The checker itself: it must see a name the agent does not export, and none in a valid one.
    check(unexported(promql_metric_names('rate(endpointd_not_a_metric_total{job="x"}[5m])'),
                     exported) == ["endpointd_not_a_metric_total"], "dashboard: the checker misses a bad name")
    check(unexported(promql_metric_names(
        'histogram_quantile(0.99, sum by (le, instance) (rate(kubeproxy_network_programming_duration_seconds_bucket[5m])))'),
        exported) == [], "dashboard: the checker refuses a good query")
    objs = render("dashboard-off", [])
    check(not [o for o in objs if o["kind"] == "ConfigMap" and "endpointd.json" in o.get("data", {})],
          "dashboard: rendered while disabled")
    objs = render("dashboard", ["metrics.grafanaDashboard.enabled=true"])
    cms = [o for o in objs if o["kind"] == "ConfigMap" and "endpointd.json" in o.get("data", {})]
    check(len(cms) == 1, f"dashboard: {len(cms)} ConfigMaps with endpointd.json")
    if len(cms) != 1:
        return
    cm = cms[0]
    check(cm["metadata"]["labels"].get("grafana_dashboard") == "1", "dashboard: no grafana_dashboard label")
    dash = json.loads(cm["data"]["endpointd.json"])
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    exprs += [v["query"]["query"] for v in dash["templating"]["list"] if isinstance(v.get("query"), dict)]
    check(len(exprs) >= 10, f"dashboard: {len(exprs)} queries")
    seen = set()
    for e in exprs:
        import re
        names = promql_metric_names(re.sub(r"label_values\(([^,)]*).*", r"\1", e))
        check(names, f"dashboard: query names no metric: {e}")
        bad = unexported(names, exported)
        check(not bad, f"dashboard: {bad} not exported by the agent, in {e}")
        seen |= names
    for want in ("kubeproxy_network_programming_duration_seconds_bucket", "endpointd_drain_releases_total",
                 "coredns_dns_responses_total", "endpointd_feed_nacks_total"):
        check(want in seen, f"dashboard: no panel on {want}")


def main():
    r = helm("lint", CHART)
    check(r.returncode == 0, f"helm lint: {r.stdout}{r.stderr}")
    r = helm("lint", CHART, "--namespace", "kube-system", "--set", "dns.enabled=true", "--set", "kubeDNS.enabled=true",
             "--set", "kubeDNS.clusterIP=10.96.0.10", "--set", "feed.enabled=true",
             "--set", "feed.tls.secretName=feed-tls", "--set", "admin.listen=0.0.0.0:10249",
             "--set", "admin.tokenSecret.name=admin-token", "--set", "networkPolicy.enabled=true",
             "--set", "networkPolicy.nodeCIDRs={192.168.0.0/16}",
             "--set", "metrics.serviceMonitor.enabled=true", "--set", "exampleWorkload.enabled=true")
    check(r.returncode == 0, f"helm lint (all on): {r.stdout}{r.stderr}")

    all_on = ["dataplane.enabled=true", "dns.enabled=true", "kubeDNS.enabled=true", "kubeDNS.clusterIP=10.96.0.10",
              "feed.enabled=true", "metrics.serviceMonitor.enabled=true", "exampleWorkload.enabled=true",
              "clusterCIDR={10.244.0.0/16,fd00:10:244::/56}", "nodePortAddresses={192.168.0.0/16}",
              "detectLocalMode=InterfaceNamePrefix", "podInterfaceNamePrefix=veth",
              "serviceCIDR={10.96.0.0/12,fd00:10:96::/112}",
              "masqueradeAll=true", "watchPods=true", "log.format=json", "drain.peerPolicy=wait",
              "drain.peerTimeoutMs=2000", "drain.releaseAfter=removed",
              "admin.listen=0.0.0.0:10249", "admin.tokenSecret.name=endpointd-admin", "admin.tokenSecret.key=bearer",
              "feed.tls.secretName=endpointd-feed-tls", "networkPolicy.enabled=true",
              "networkPolicy.nodeCIDRs={192.168.0.0/16,fd00:1::/64}", "watchStallTimeoutSeconds=30",
              "dns.nodeLocalAddress=169.254.20.10"]
    all_off = ["dataplane.enabled=false", "dns.enabled=false", "kubeDNS.enabled=false", "feed.enabled=false",
               "metrics.serviceMonitor.enabled=false", "exampleWorkload.enabled=false", "watchPods=false",
               "networkPolicy.enabled=false", "watchStallTimeoutSeconds=0", "events.enabled=false"]
    scenarios = [
        ("defaults", [], "endpointd"),
        ("all-on", all_on, "kube-system"),
        ("all-off", all_off, "endpointd"),
        ("privileged", ["privileged=true"], "endpointd"),
        ("loopback-admin", ["admin.listen=127.0.0.1:10250", "exampleWorkload.enabled=true"], "endpointd"),
        ("loopback-health", ["health.listen=127.0.0.1:10256"], "endpointd"),
        ("node-health", ["health.listen=10.1.2.3:10256"], "endpointd"),
        ("health-off", ["health.listen="], "endpointd"),
        ("health-off-admin-wide", ["health.listen=", "admin.listen=0.0.0.0:10249"], "endpointd"),
        ("admin-off", ["admin.listen="], "endpointd"),
        ("admin-wide", ["admin.listen=0.0.0.0:10249"], "endpointd"),
        ("admin-token", ["admin.tokenSecret.name=adm"], "endpointd"),
        ("servicemonitor", ["metrics.serviceMonitor.enabled=true", "admin.listen=0.0.0.0:10249"], "endpointd"),
        ("servicemonitor-token", ["metrics.serviceMonitor.enabled=true", "admin.listen=0.0.0.0:10249",
                                  "admin.tokenSecret.name=adm", "admin.tokenSecret.key=t.txt"], "endpointd"),
        ("feed-tls", ["feed.enabled=true", "feed.tls.secretName=ftls"], "endpointd"),
        ("feed-tls-no-client-ca", ["feed.enabled=true", "feed.tls.secretName=ftls", "feed.tls.clientCA=false"],
         "endpointd"),
        ("feed-tls-feed-off", ["feed.enabled=false", "feed.tls.secretName=ftls"], "endpointd"),
        ("networkpolicy", ["networkPolicy.enabled=true", "networkPolicy.nodeCIDRs={10.0.0.0/8}"], "endpointd"),
        ("networkpolicy-all", ["networkPolicy.enabled=true", "networkPolicy.nodeCIDRs={10.0.0.0/8}",
                               "feed.enabled=true", "dns.enabled=true", "dns.listen=0.0.0.0:5353"], "endpointd"),
        ("networkpolicy-health-off", ["networkPolicy.enabled=true", "networkPolicy.nodeCIDRs={10.0.0.0/8}",
                                      "health.listen="], "endpointd"),
        ("node-local-dns", ["dns.enabled=true", "dns.nodeLocalAddress=169.254.20.10", "kubeDNS.enabled=true",
                            "kubeDNS.clusterIP=10.96.0.10"], "kube-system"),
        ("dns-extra-zones", ["dns.enabled=true", "dns.extraZones={example.com,corp.internal}"], "endpointd"),
        ("node-local-dns-v6", ["dns.enabled=true", "dns.listen=[::]:53", "dns.nodeLocalAddress=fd00::10"],
         "endpointd"),
        ("kube-dns-cluster-policy", ["dns.enabled=true", "kubeDNS.enabled=true", "kubeDNS.clusterIP=10.96.0.10",
                                     "kubeDNS.internalTrafficPolicy=Cluster"], "kube-system"),
        ("conntrack", ["conntrack.maxPerCore=32768", "conntrack.min=131072",
                       "conntrack.tcpTimeoutEstablished=24h0m0s", "conntrack.tcpTimeoutCloseWait=1h",
                       "conntrack.tcpBeLiberal=true", "conntrack.udpTimeout=30s",
                       "conntrack.udpTimeoutStream=2m"], "endpointd"),
        ("conntrack-one", ["conntrack.udpTimeout=45s"], "endpointd"),
        ("members-nodes", ["drain.members=nodes"], "endpointd"),
        ("peer-tls", ["drain.peerAuth=peerTLS"], "endpointd"),
        ("peer-identity-own-secret", ["drain.peerIdentity.serverSecretName=my-peer-server",
                                      "drain.peerIdentity.expirationSeconds=3600"], "kube-system"),
        ("peer-tls-insecure", ["drain.peerAuth=peerTLS", "drain.peerTLS.insecure=true"], "endpointd"),
        ("members-service-other-port", ["drain.members=service", "drain.peerPort=9500"], "kube-system"),
        ("conntrack-privileged", ["conntrack.udpTimeout=45s", "privileged=true"], "endpointd"),
        ("other-socket", ["drain.socketDir=/var/run/edp", "drain.socketName=d.sock", "exampleWorkload.enabled=true",
                          "dns.enabled=true", "dns.listen=169.254.20.10:5353"], "endpointd"),
    ]
    for feature, on in (("dataplane.enabled", True), ("dns.enabled", True), ("feed.enabled", True),
                        ("exampleWorkload.enabled", True), ("privileged", True),
                        ("watchPods", False), ("masqueradeAll", True), ("drain.peerTLS.insecure", True)):
        scenarios.append((f"{feature}={str(on).lower()}", [f"{feature}={str(on).lower()}"], "endpointd"))
        scenarios.append((f"{feature}={str(not on).lower()}", [f"{feature}={str(not on).lower()}"], "endpointd"))
    for name, sets, ns in scenarios:
        objs = check_render(name, sets, ns)
        if objs and name in ("defaults", "all-on", "all-off", "health-off", "feed-tls-no-client-ca"):
            run_config_with_binary(name, objs)

#Defaults : probes on the health port, the admin server on loopback, no NET_RAW.
    objs = render("defaults", [])
    cfg = yaml.safe_load(one(objs, "ConfigMap")["data"]["config.yaml"])
    check(cfg["health-listen"] == "0.0.0.0:10256", f"default health-listen {cfg['health-listen']}")
    check(loopback(hostport(cfg["admin-listen"])[0]), f"default admin-listen {cfg['admin-listen']} is not loopback")
    c = one(objs, "DaemonSet")["spec"]["template"]["spec"]["containers"][0]
    check(c["readinessProbe"]["httpGet"]["port"] == 10256 and c["livenessProbe"]["httpGet"]["port"] == 10256,
          "default probes are not on the health port 10256")
    check("NET_RAW" not in yaml.safe_dump_all(objs), "default render grants NET_RAW")
    check(not any(o["kind"] == "NetworkPolicy" for o in objs), "NetworkPolicy rendered by default")

#The static example matches the chart's defaults.
    default_objs = render("defaults", [])
    ex = yaml.safe_load(open(os.path.join(CHART, "examples", "workload.yaml")))
    check(ex["kind"] == "Deployment" and ex["apiVersion"] == "apps/v1", "examples/workload.yaml kind")
    ds = one(default_objs, "DaemonSet")
    cfg = yaml.safe_load(one(default_objs, "ConfigMap")["data"]["config.yaml"])
    check_workload("examples/workload.yaml", ex, ds, cfg)

#Invalid values fail, naming the value.
    bad = [
        (["clusterCIDR={10.0.0.0/33}"], "clusterCIDR"),
        (["nodePortAddresses={not-a-cidr}"], "nodePortAddresses"),
        (["serviceCIDR={10.96.0.0/40}"], "serviceCIDR"),
        (["detectLocalMode=PodCIDR"], "detectLocalMode"),
        (["podBridgeInterface=br/0"], "podBridgeInterface"),
        (["admin.listen=0.0.0.0:70000"], "/admin/listen"),
        (["dns.listen=0.0.0.0:0"], "/dns/listen"),
        (["feed.listen=localhost"], "/feed/listen"),
        (["drain.peerPort=70000"], "/drain/peerPort"),
        (["drain.peerPolicy=maybe"], "/drain/peerPolicy"),
        (["drain.peerAuth=token"], "/drain/peerAuth"),
        (["drain.peerIdentity.expirationSeconds=60"], "/drain/peerIdentity/expirationSeconds"),
        (["drain.members=pods"], "/drain/members"),
        (["image.repository=null"], "repository"),
        (["dns.enabled=true", "kubeDNS.enabled=true"], "/kubeDNS/clusterIP"),
        (["dns.enabled=true", "kubeDNS.enabled=true", "kubeDNS.clusterIP=10.96.0.300"], "/kubeDNS/clusterIP"),
        (["kubeDNS.enabled=true", "kubeDNS.clusterIP=10.96.0.10"], "/dns/enabled"),
        (["log.format=xml"], "/log/format"),
        (["dns.enabled=true", "dns.nodeLocalAddress=dns.local"], "/dns/nodeLocalAddress"),
        (["dns.nodeLocalAddress=169.254.20.10"], "dns.nodeLocalAddress needs dns.enabled"),
        (["dns.enabled=true", "dns.extraZones={Bad_Zone}"], "/dns/extraZones"),
        (["dns.enabled=true", "kubeDNS.enabled=true", "kubeDNS.clusterIP=10.96.0.10",
          "kubeDNS.internalTrafficPolicy=Nope"], "/kubeDNS/internalTrafficPolicy"),
        (["metrics.serviceMonitor.enabled=true", "admin.listen=127.0.0.1:10249"], "admin.listen"),
        (["metrics.serviceMonitor.enabled=true"], "admin.listen"),
        (["metrics.serviceMonitor.enabled=true", "admin.listen="], "admin.listen"),
        (["health.listen=0.0.0.0:70000"], "/health/listen"),
        (["health.listen=", "admin.listen="], "health.listen"),
        (["admin.listen=0.0.0.0:10256"], "health.listen"),
        (["admin.tokenSecret.key=a/b"], "/admin/tokenSecret/key"),
        (["admin.tokenSecret.name=Not_A_Name"], "/admin/tokenSecret/name"),
        (["feed.tls.secretName=Not_A_Name"], "/feed/tls/secretName"),
        (["watchStallTimeoutSeconds=-1"], "/watchStallTimeoutSeconds"),
        (["watchStallTimeoutSeconds=5"], "/watchStallTimeoutSeconds"),
        (["watchStallTimeoutSeconds=3601"], "/watchStallTimeoutSeconds"),
        (["networkPolicy.enabled=true"], "/networkPolicy/nodeCIDRs"),
        (["networkPolicy.enabled=true", "networkPolicy.nodeCIDRs={10.0.0.0/33}"], "nodeCIDRs"),
        (["networkPolicy.enabled=true", "networkPolicy.nodeCIDRs={10.0.0.0/8}", "feed.enabled=true",
          "networkPolicy.feedClients=null"], "networkPolicy.feedClients"),
        (["conntrack.udpTimeout=45x"], "/conntrack/udpTimeout"),
        (["conntrack.maxPerCore=-1"], "/conntrack/maxPerCore"),
        (["conntrack.tcpTimeout=1h"], "tcpTimeout"),
        (["unknownValue=1"], "unknownValue"),
    ]
    for sets, named in bad:
        args = ["template", "t", CHART]
        for s in sets:
            args += ["--set", s]
        r = helm(*args)
        check(r.returncode != 0, f"invalid {sets} rendered")
        check(named in r.stderr, f"invalid {sets}: message does not name {named}: {r.stderr.strip()}")
    for ip in ("10.96.0.10",):
        ipaddress.ip_address(ip)
    check_dashboard()

    print(f"{checks} checks, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
