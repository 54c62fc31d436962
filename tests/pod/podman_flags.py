#!/usr/bin/env python3
"""Turns a pod template (from `helm template` output, or a Pod) into what the kubelet would run,
as podman command lines, for tests/pod. Every field of the spec is either translated (the table
TRANSLATED below says how) or refused by name: a field that cannot be honoured is an error,
never silently dropped.

  podman_flags.py RENDERED.yaml --kind DaemonSet|Deployment|Pod [--name NAME] --node NODE
      --pod-name NAME --pod-uid UID --namespace NS --node-root DIR --work DIR
      --netns PATH (the pod's network: the node's for hostNetwork, else the pod's own)
      [--host-shared PATH ...] [--secret NAME=DIR ...] [--sa-dir DIR] [--image-map FROM=TO ...]
      [--pod-ip IP] [--host-ip IP] [--cluster-dns IP] [--kubernetes-service HOST:PORT]

  podman_flags.py --fields     the fields it translates and how (any other is refused)

prints JSON: {"init": [container...], "containers": [container...], "stop_timeout": N}, each
container {"name", "run": [podman argv], "prestop": [argv in the container] or null,
"probes": {"liveness"|"readiness": {"host", "port", "path", ...}}}.
"""
import argparse
import json
import os
import re
import shutil
import sys

import yaml

# Field -> how it is run. Anything else in the spec is refused.
TRANSLATED = {
    "hostNetwork": "true: --network ns:<the node's netns>, --uts host; false: the pod's netns "
                   "(--netns), --hostname <pod name>",
    "hostPID": "true: --pid host",
    "dnsPolicy": "ClusterFirst(WithHostNet): --dns <cluster DNS> and the search path; Default: the node's",
    "serviceAccountName": "the projected token, ca.crt and namespace, read-only at "
                          "/var/run/secrets/kubernetes.io/serviceaccount (--sa-dir)",
    "automountServiceAccountToken": "false: no service account volume",
    "terminationGracePeriodSeconds": "--stop-timeout: SIGTERM, then SIGKILL after it (podman stop, restart)",
    "priorityClassName": "the scheduler's: nothing to run",
    "tolerations": "the scheduler's: nothing to run",
    "nodeSelector": "the scheduler's: nothing to run",
    "initContainers": "run to completion, in order, before the containers",
    "containers": "one podman container each, in the pod's namespaces",
    "volumes": "configMap (files from the rendered ConfigMap), secret (--secret), hostPath "
               "(under --node-root, or shared with --host-shared), emptyDir (a directory, or "
               "tmpfs with its size for medium Memory)",
    "container.image": "the image (--image-map renames), --pull never",
    "container.command": "--entrypoint",
    "container.args": "after the image, $(VAR) expanded from the container's env as the kubelet does",
    "container.env": "--env: value, fieldRef spec.nodeName / metadata.name / metadata.namespace / "
                     "metadata.uid / status.podIP / status.hostIP",
    "container.ports": "nothing to publish (the pod's own network namespace)",
    "container.livenessProbe, readinessProbe": "httpGet: the runner probes host:port/path from the node",
    "container.lifecycle.preStop": "exec: podman exec before podman stop",
    "container.resources": "limits.cpu --cpus, limits.memory --memory, requests.cpu --cpu-shares",
    "container.securityContext": "privileged --privileged; allowPrivilegeEscalation false "
                                 "no-new-privileges; readOnlyRootFilesystem --read-only with no "
                                 "writable tmpfs added; runAsUser --user; capabilities "
                                 "--cap-drop/--cap-add; seccompProfile RuntimeDefault: podman's "
                                 "default profile, Unconfined: seccomp=unconfined",
    "container.volumeMounts": "--volume / --mount with readOnly",
}

SA_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"


class Refused(Exception):
    pass


def refuse(path, why="not translated"):
    raise Refused(f"{path}: {why}")


def allow_only(obj, path, keys):
    for k in obj:
        if k not in keys:
            refuse(f"{path}.{k}")


def find_object(docs, kind, name):
    for d in docs:
        if d and d.get("kind") == kind and (name is None or d["metadata"]["name"] == name):
            return d
    raise SystemExit(f"podman_flags: no {kind}{' ' + name if name else ''} in the rendered objects")


def main():
    if sys.argv[1:] == ["--fields"]:
        for field, how in TRANSLATED.items():
            print(f"{field}: {how}")
        return
    ap = argparse.ArgumentParser()
    ap.add_argument("rendered")
    ap.add_argument("--kind", default="DaemonSet")
    ap.add_argument("--name")
    ap.add_argument("--node", required=True)
    ap.add_argument("--pod-name", required=True)
    ap.add_argument("--pod-uid", required=True)
    ap.add_argument("--namespace", required=True)
    ap.add_argument("--node-root", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--netns", required=True)
    ap.add_argument("--host-shared", action="append", default=[])
    ap.add_argument("--secret", action="append", default=[])
    ap.add_argument("--sa-dir")
    ap.add_argument("--image-map", action="append", default=[])
    ap.add_argument("--pod-ip", default="")
    ap.add_argument("--host-ip", default="")
    ap.add_argument("--cluster-dns", default="")
    ap.add_argument("--kubernetes-service", default="")
    ap.add_argument("--name-prefix", default="")
    a = ap.parse_args()

    with open(a.rendered) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    obj = find_object(docs, a.kind, a.name)
    if a.kind == "Pod":
        meta, spec, base = obj.get("metadata", {}), obj["spec"], "spec"
    else:
        tmpl = obj["spec"]["template"]
        meta, spec, base = tmpl.get("metadata", {}), tmpl["spec"], "spec.template.spec"
    allow_only(meta, base.replace("spec", "metadata", 1) if a.kind == "Pod" else "spec.template.metadata",
               {"labels", "annotations", "name", "namespace"})
    allow_only(spec, base, {"serviceAccountName", "automountServiceAccountToken", "priorityClassName",
                            "hostNetwork", "hostPID", "dnsPolicy", "nodeSelector", "tolerations",
                            "terminationGracePeriodSeconds", "initContainers", "containers", "volumes",
                            "nodeName"})

    pod_dir = os.path.join(a.work, a.pod_name)
    os.makedirs(pod_dir, exist_ok=True)
    images = dict(m.split("=", 1) for m in a.image_map)
    secrets = dict(s.split("=", 1) for s in a.secret)

    # Volumes: name -> (host source, kind, is it read-only whatever the mount says)
    vols = {}
    for i, v in enumerate(spec.get("volumes", [])):
        p = f"{base}.volumes[{i}]"
        name = v["name"]
        kinds = [k for k in v if k != "name"]
        if len(kinds) != 1:
            refuse(p, f"volume {name} has {kinds}")
        kind = kinds[0]
        src = v[kind] or {}
        if kind == "configMap":
            allow_only(src, f"{p}.configMap", {"name", "items", "defaultMode"})
            if "items" in src:
                refuse(f"{p}.configMap.items")
            cm = find_object(docs, "ConfigMap", src["name"])
            d = os.path.join(pod_dir, "volumes", name)
            os.makedirs(d, exist_ok=True)
            for k, text in cm.get("data", {}).items():
                with open(os.path.join(d, k), "w") as f:
                    f.write(text)
                os.chmod(os.path.join(d, k), src.get("defaultMode", 0o644))
            vols[name] = (d, "bind", True)
        elif kind == "secret":
            allow_only(src, f"{p}.secret", {"secretName", "defaultMode", "items"})
            sname = src["secretName"]
            if sname not in secrets:
                refuse(f"{p}.secret.secretName", f"Secret {sname} not given (--secret {sname}=DIR): "
                       "the kubelet would wait for it, ContainerCreating")
            d = os.path.join(pod_dir, "volumes", name)
            shutil.rmtree(d, ignore_errors=True)
            os.makedirs(d)
            items = src.get("items") or [{"key": k, "path": k} for k in sorted(os.listdir(secrets[sname]))]
            for it in items:
                allow_only(it, f"{p}.secret.items[]", {"key", "path"})
                shutil.copyfile(os.path.join(secrets[sname], it["key"]), os.path.join(d, it["path"]))
                os.chmod(os.path.join(d, it["path"]), src.get("defaultMode", 0o644))
            vols[name] = (d, "bind", True)
        elif kind == "hostPath":
            allow_only(src, f"{p}.hostPath", {"path", "type"})
            hp = src["path"]
            t = src.get("type", "")
            host = hp if any(hp == s or hp.startswith(s.rstrip("/") + "/") for s in a.host_shared) \
                else os.path.join(a.node_root, hp.lstrip("/"))
            if t == "DirectoryOrCreate":
                os.makedirs(host, mode=0o755, exist_ok=True)
            elif t == "Directory":
                if not os.path.isdir(host):
                    refuse(f"{p}.hostPath", f"type Directory but {hp} ({host}) is no directory")
            elif t not in ("",):
                refuse(f"{p}.hostPath.type", f"type {t}")
            vols[name] = (host, "bind", False)
        elif kind == "emptyDir":
            allow_only(src, f"{p}.emptyDir", {"medium", "sizeLimit"})
            if src.get("medium") == "Memory":
                vols[name] = (src.get("sizeLimit", ""), "tmpfs", False)
            elif src.get("medium", "") == "":
                d = os.path.join(pod_dir, "volumes", name)
                os.makedirs(d, exist_ok=True)
                vols[name] = (d, "bind", False)
            else:
                refuse(f"{p}.emptyDir.medium", f"medium {src['medium']}")
        else:
            refuse(f"{p}.{kind}")

    if spec.get("serviceAccountName") and spec.get("automountServiceAccountToken", True):
        if not a.sa_dir:
            refuse(f"{base}.serviceAccountName", "no projected token given (--sa-dir)")
        vols["<service account>"] = (a.sa_dir, "bind", True)

    host_network = spec.get("hostNetwork", False)
    common = ["--pull", "never", "--network", f"ns:{a.netns}", "--uts", "private"]
    if host_network:
        common[-1] = "host"  # the node's host name, as hostNetwork gives
    else:
        common += ["--hostname", a.pod_name]
    if spec.get("hostPID"):
        common += ["--pid", "host"]
    # A cgroup under the pod's, as the kubelet's cgroupfs driver makes it: the drain socket
    # identifies a caller by the pod UID in its cgroup path.
    common += ["--cgroup-parent", f"/kubepods/besteffort/pod{a.pod_uid}"]
    policy = spec.get("dnsPolicy", "ClusterFirst")
    if policy in ("ClusterFirst", "ClusterFirstWithHostNet") and (policy == "ClusterFirstWithHostNet" or not host_network):
        if a.cluster_dns:
            common += ["--dns", a.cluster_dns]
            for s in (f"{a.namespace}.svc.cluster.local", "svc.cluster.local", "cluster.local"):
                common += ["--dns-search", s]
    elif policy not in ("Default", "ClusterFirst"):
        refuse(f"{base}.dnsPolicy", f"dnsPolicy {policy}")
    stop_timeout = int(spec.get("terminationGracePeriodSeconds", 30))
    common += ["--stop-timeout", str(stop_timeout)]

    field_env = {"spec.nodeName": a.node, "metadata.name": a.pod_name, "metadata.namespace": a.namespace,
                 "metadata.uid": a.pod_uid, "status.podIP": a.pod_ip or a.host_ip, "status.hostIP": a.host_ip}

    def container(c, path, init):
        allow_only(c, path, {"name", "image", "imagePullPolicy", "command", "args", "env", "ports",
                             "livenessProbe", "readinessProbe", "resources", "securityContext",
                             "volumeMounts", "lifecycle"})
        if init:
            for k in ("livenessProbe", "readinessProbe", "lifecycle"):
                if k in c:
                    refuse(f"{path}.{k}", "an init container has none")
        name = f"{a.name_prefix}{a.pod_name}-{c['name']}"
        run = ["podman", "run", "--name", name, "--replace"] + common
        if c.get("imagePullPolicy", "IfNotPresent") == "Always":
            refuse(f"{path}.imagePullPolicy", "Always: no registry to pull from")
        # The kubelet's environment: the kubernetes Service, then the container's own (which wins).
        env = {}
        if a.kubernetes_service:
            h, port = a.kubernetes_service.rsplit(":", 1)
            env.update({"KUBERNETES_SERVICE_HOST": h, "KUBERNETES_SERVICE_PORT": port})
        for j, e in enumerate(c.get("env", [])):
            allow_only(e, f"{path}.env[{j}]", {"name", "value", "valueFrom"})
            if "value" in e:
                env[e["name"]] = str(e["value"])
            else:
                vf = e.get("valueFrom", {})
                allow_only(vf, f"{path}.env[{j}].valueFrom", {"fieldRef"})
                fp = vf["fieldRef"]["fieldPath"]
                if fp not in field_env:
                    refuse(f"{path}.env[{j}].valueFrom.fieldRef", f"fieldPath {fp}")
                env[e["name"]] = field_env[fp]
        for k, v in env.items():
            run += ["--env", f"{k}={v}"]

        sc = c.get("securityContext", {})
        allow_only(sc, f"{path}.securityContext", {"privileged", "allowPrivilegeEscalation",
                                                    "readOnlyRootFilesystem", "runAsUser", "capabilities",
                                                    "seccompProfile"})
        if sc.get("privileged"):
            run.append("--privileged")
        if sc.get("allowPrivilegeEscalation") is False:
            run += ["--security-opt", "no-new-privileges"]
        if sc.get("readOnlyRootFilesystem"):
            run += ["--read-only", "--read-only-tmpfs=false"]
        if "runAsUser" in sc:
            run += ["--user", str(sc["runAsUser"])]
        caps = sc.get("capabilities", {})
        allow_only(caps, f"{path}.securityContext.capabilities", {"drop", "add"})
        for cap in caps.get("drop", []):
            run += ["--cap-drop", cap.lower()]
        for cap in caps.get("add", []):
            run += ["--cap-add", cap.lower()]
        sp = sc.get("seccompProfile", {})
        if sp:
            allow_only(sp, f"{path}.securityContext.seccompProfile", {"type"})
            if sp["type"] == "Unconfined":
                run += ["--security-opt", "seccomp=unconfined"]
            elif sp["type"] != "RuntimeDefault":
                refuse(f"{path}.securityContext.seccompProfile.type", sp["type"])

        res = c.get("resources", {})
        allow_only(res, f"{path}.resources", {"limits", "requests"})
        lim = res.get("limits", {})
        allow_only(lim, f"{path}.resources.limits", {"cpu", "memory"})
        req = res.get("requests", {})
        allow_only(req, f"{path}.resources.requests", {"cpu", "memory"})
        if "cpu" in lim:
            run += ["--cpus", str(cpu_cores(lim["cpu"]))]
        if "memory" in lim:
            run += ["--memory", str(mem_bytes(lim["memory"]))]
        if "cpu" in req:
            run += ["--cpu-shares", str(max(2, int(cpu_cores(req["cpu"]) * 1024)))]

        mounts = c.get("volumeMounts", [])
        for j, m in enumerate(mounts):
            allow_only(m, f"{path}.volumeMounts[{j}]", {"name", "mountPath", "readOnly"})
            if m["name"] not in vols:
                refuse(f"{path}.volumeMounts[{j}]", f"no volume {m['name']}")
            src, kind, ro = vols[m["name"]]
            ro = ro or m.get("readOnly", False)
            if kind == "tmpfs":
                opt = f"type=tmpfs,destination={m['mountPath']}"
                if src:
                    opt += f",tmpfs-size={mem_bytes(src)}"
                run += ["--mount", opt]
            else:
                run += ["--volume", f"{src}:{m['mountPath']}:{'ro' if ro else 'rw'}"]
        if "<service account>" in vols:
            run += ["--volume", f"{vols['<service account>'][0]}:{SA_PATH}:ro"]

        if "command" in c:
            run += ["--entrypoint", json.dumps(c["command"])]
        image = c["image"]
        run.append(images.get(image, image))
        run += [expand(arg, env) for arg in c.get("args", [])]

        probes = {}
        for kind in ("livenessProbe", "readinessProbe"):
            if kind not in c:
                continue
            pr = c[kind]
            allow_only(pr, f"{path}.{kind}", {"httpGet", "initialDelaySeconds", "periodSeconds",
                                              "timeoutSeconds", "failureThreshold", "successThreshold"})
            if "httpGet" not in pr:
                refuse(f"{path}.{kind}", "only httpGet probes")
            hg = pr["httpGet"]
            allow_only(hg, f"{path}.{kind}.httpGet", {"host", "path", "port", "scheme"})
            if hg.get("scheme", "HTTP") != "HTTP":
                refuse(f"{path}.{kind}.httpGet.scheme", hg["scheme"])
            port = hg["port"]
            if isinstance(port, str):
                named = [p for p in c.get("ports", []) if p.get("name") == port]
                if not named:
                    refuse(f"{path}.{kind}.httpGet.port", f"no port named {port}")
                port = named[0]["containerPort"]
            probes[kind.replace("Probe", "")] = {
                "host": hg.get("host", a.pod_ip or a.host_ip), "port": port, "path": hg.get("path", "/"),
                "timeout": pr.get("timeoutSeconds", 1), "period": pr.get("periodSeconds", 10),
                "initial_delay": pr.get("initialDelaySeconds", 0)}
        for j, p in enumerate(c.get("ports", [])):
            allow_only(p, f"{path}.ports[{j}]", {"name", "containerPort", "protocol", "hostPort"})
            if "hostPort" in p and not host_network:
                refuse(f"{path}.ports[{j}].hostPort")
        prestop = None
        lc = c.get("lifecycle", {})
        allow_only(lc, f"{path}.lifecycle", {"preStop"})
        if "preStop" in lc:
            allow_only(lc["preStop"], f"{path}.lifecycle.preStop", {"exec"})
            prestop = [expand(x, env) for x in lc["preStop"]["exec"]["command"]]
        return {"name": name, "run": run, "prestop": prestop, "probes": probes}

    out = {"init": [container(c, f"{base}.initContainers[{i}]", True)
                    for i, c in enumerate(spec.get("initContainers", []))],
           "containers": [container(c, f"{base}.containers[{i}]", False)
                          for i, c in enumerate(spec["containers"])],
           "stop_timeout": stop_timeout}
    json.dump(out, sys.stdout, indent=1)
    print()


def expand(s, env):
    """$(VAR) as the kubelet expands it in command, args and env; $$(VAR) stays literal."""
    return re.sub(r"\$\$\(|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
                  lambda m: "$(" if m.group(0) == "$$(" else env.get(m.group(1), m.group(0)), s)


def cpu_cores(q):
    q = str(q)
    return int(q[:-1]) / 1000 if q.endswith("m") else float(q)


def mem_bytes(q):
    q = str(q)
    units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "k": 1000, "M": 1000 ** 2, "G": 1000 ** 3}
    for u, m in units.items():
        if q.endswith(u):
            return int(float(q[: -len(u)]) * m)
    return int(q)


if __name__ == "__main__":
    try:
        main()
    except Refused as e:
        print(f"podman_flags: refused: {e}", file=sys.stderr)
        sys.exit(3)
