#!/usr/bin/python3
"""Checks deploy/k8s the way `kubectl apply -k` and a first rollout would notice problems,
without a cluster: every document is a Kubernetes object, kustomization.yaml lists every
file, every container runs a real `arclight CMD` whose --flags are in `arclight CMD --help`
(the binary is run: $ARCLIGHT_BIN), probes and Services point at ports the commands listen
on, Services select pods that exist, batch runs one replica and credit no more than the
spans topic has partitions, the rollout controller is sharded by its pod ordinal (--shard
$(VAR)/N with N its replicas) and its shards' steps add up to batch's, mounted volumes are declared, the broker ConfigMap is
broker-config/ verbatim, and every container is non-root with a read-only root filesystem,
resource requests/limits and $ARCLIGHT_BOOTSTRAP from the one ConfigMap that holds it.
Field names and types are checked against the Kubernetes API models of python3-kubernetes
(unknown fields fail, as under the API server's strict field validation).
Prints one line per failed check and exits 1 if any."""
import os
import re
import shlex
import shutil
import subprocess
import sys

import yaml

root = os.environ.get("ARCLIGHT_SOURCE_DIR", ".")
kdir = os.path.join(root, "deploy", "k8s")
binary = os.environ.get("ARCLIGHT_BIN", "arclight")
failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
    return cond


# ---- documents ---------------------------------------------------------------------------
docs = []  # (file, doc)
files = sorted(f for f in os.listdir(kdir) if f.endswith((".yaml", ".yml")))
for f in files:
    with open(os.path.join(kdir, f)) as fh:
        try:
            loaded = [d for d in yaml.safe_load_all(fh) if d is not None]
        except yaml.YAMLError as e:
            check(False, f"{f}: does not parse: {e}")
            continue
    for d in loaded:
        if not check(isinstance(d, dict), f"{f}: a document is not a mapping"):
            continue
        name = (d.get("metadata") or {}).get("name") if isinstance(d.get("metadata"), dict) else None
        check(bool(d.get("apiVersion")) and bool(d.get("kind")), f"{f}: document without apiVersion/kind")
        check(d.get("kind") == "Kustomization" or bool(name), f"{f}: {d.get('kind')} without metadata.name")
        docs.append((f, d))

# ---- schema: field names and types of the Kubernetes API (python3-kubernetes' models) -------
try:
    import kubernetes.client as kclient
except ImportError:
    kclient = None
    print("k8s: note: python3-kubernetes is not installed (scripts/setup.sh); field names unchecked")


def validate(value, typ, path):
    """Checks value against an OpenAPI type name of the Kubernetes client: unknown fields
    and wrong scalar types are failures (as the API server's strict field validation)."""
    if typ.startswith("list["):
        if check(isinstance(value, list), f"{path}: not a list"):
            for i, v in enumerate(value):
                validate(v, typ[5:-1], f"{path}[{i}]")
    elif typ.startswith("dict("):
        if check(isinstance(value, dict), f"{path}: not a mapping"):
            for k, v in value.items():
                validate(v, typ[typ.index(",") + 1:-1].strip(), f"{path}.{k}")
    elif typ == "str":
        # Quantities (cpu: 2) may be numbers; every other string field must be a string.
        check(isinstance(value, str) or (isinstance(value, (int, float)) and not isinstance(value, bool)
                                         and (".limits." in path or ".requests." in path)),
              f"{path}: {value!r} is not a string")
    elif typ == "int":
        check(isinstance(value, int) and not isinstance(value, bool), f"{path}: {value!r} is not an integer")
    elif typ == "bool":
        check(isinstance(value, bool), f"{path}: {value!r} is not a boolean")
    elif typ == "float":
        check(isinstance(value, (int, float)) and not isinstance(value, bool), f"{path}: {value!r} is not a number")
    elif typ in ("object", "datetime", "date"):
        pass  # int-or-string ports, free-form objects
    else:
        cls = getattr(kclient, typ, None)
        if not check(cls is not None, f"{path}: unknown type {typ}"):
            return
        if not check(isinstance(value, dict), f"{path}: not a mapping"):
            return
        fields = {j: py for py, j in cls.attribute_map.items()}
        for k, v in value.items():
            if check(k in fields, f"{path}: unknown field {k!r} ({typ})"):
                validate(v, cls.openapi_types[fields[k]], f"{path}.{k}")


if kclient is not None:
    for f, d in docs:
        if f == "kustomization.yaml" or not isinstance(d.get("kind"), str):
            continue
        group_version = str(d.get("apiVersion", ""))
        check(group_version in ("v1", "apps/v1", "batch/v1"), f"{f}: apiVersion {group_version} is not v1/apps/v1/batch/v1")
        validate(d, "V1" + d["kind"], f"{f}:{d['kind']}")

kust = [d for f, d in docs if f == "kustomization.yaml"]
check(len(kust) == 1, "no kustomization.yaml")
kust = kust[0] if kust else {}
resources = kust.get("resources", [])
for f in files:
    if f != "kustomization.yaml":
        check(f in resources, f"kustomization.yaml does not list {f}")
for r in resources:
    check(os.path.exists(os.path.join(kdir, r)), f"kustomization.yaml lists {r}, which does not exist")
images = {i.get("name") for i in kust.get("images", [])}
# Where kubectl is at hand, its built-in kustomize must render the folder, image set.
if shutil.which("kubectl"):
    p = subprocess.run(["kubectl", "kustomize", kdir], capture_output=True, text=True, timeout=60)
    if check(p.returncode == 0, f"kubectl kustomize fails: {p.stderr.strip()[:500]}"):
        rendered = [d for d in yaml.safe_load_all(p.stdout) if d]
        check(len(rendered) == len(docs) - 1,
              f"kubectl kustomize renders {len(rendered)} objects, the files hold {len(docs) - 1}")
        want = {f"{i.get('newName', i.get('name'))}:{i['newTag']}" for i in kust.get("images", []) if "newTag" in i}
        for d in rendered:
            for c in (((d.get("spec") or {}).get("template") or {}).get("spec") or {}).get("containers", []):
                check(not want or c.get("image") in want, f"kubectl kustomize: {d['metadata']['name']} runs {c.get('image')}")

objs = [(f, d) for f, d in docs if f != "kustomization.yaml"]
seen = set()
for f, d in objs:
    key = (d["kind"], d["metadata"]["name"])
    check(key not in seen, f"{f}: {key[0]} {key[1]} is defined twice")
    seen.add(key)

# ---- the binary's commands and flags ----------------------------------------------------
with open(os.path.join(root, "tools", "main.c")) as fh:
    commands = set(re.findall(r'\{"(\w+)",\s*cmd_\w+', fh.read()))
help_cache = {}


def help_flags(cmd):
    """The --flags `arclight CMD --help` prints, or None when it fails."""
    if cmd not in help_cache:
        try:
            p = subprocess.run([binary, cmd, "--help"], capture_output=True, text=True, timeout=60)
            text = p.stdout + p.stderr
            help_cache[cmd] = set(re.findall(r"(--[a-z0-9][a-z0-9-]*)", text)) if p.returncode == 0 else None
        except OSError as e:
            check(False, f"cannot run {binary}: {e}")
            help_cache[cmd] = None
    return help_cache[cmd]


def port_of(hostport):
    m = re.match(r"^(?:\[[0-9a-fA-F:]+\]|[^:]*):(\d+)$", hostport)
    return int(m.group(1)) if m else None


# ---- config maps ---------------------------------------------------------------------------
configmaps = {d["metadata"]["name"]: d.get("data", {}) for f, d in objs if d["kind"] == "ConfigMap"}
holders = [n for n, data in configmaps.items() if "ARCLIGHT_BOOTSTRAP" in data]
check(len(holders) == 1, f"ARCLIGHT_BOOTSTRAP is in {len(holders)} ConfigMaps, not one: {holders}")
bootstrap_cm = holders[0] if holders else None
if bootstrap_cm:
    bs = configmaps[bootstrap_cm]["ARCLIGHT_BOOTSTRAP"]
    check(all(port_of(h) for h in str(bs).split(",")), f"ARCLIGHT_BOOTSTRAP {bs!r} is not HOST:PORT[,HOST:PORT]")
broker_cms = [n for n, data in configmaps.items() if "topics.conf" in data or "client.conf" in data]
check(len(broker_cms) >= 1, "no ConfigMap holds broker-config/ (client.conf, topics.conf)")
for n in broker_cms:
    for key in ("client.conf", "topics.conf"):
        check(key in configmaps[n], f"ConfigMap {n} has no {key}")
    for key, text in configmaps[n].items():
        path = os.path.join(root, "broker-config", key)
        if check(os.path.exists(path), f"ConfigMap {n}: broker-config/{key} does not exist"):
            with open(path) as fh:
                check(fh.read() == text, f"ConfigMap {n}: {key} differs from broker-config/{key} (regenerate it)")

# Partitions per topic, from the repository's topics.conf.
partitions = {}
with open(os.path.join(root, "broker-config", "topics.conf")) as fh:
    for line in fh:
        parts = line.split("#")[0].split()
        if len(parts) >= 2 and parts[1].isdigit():
            partitions[parts[0]] = int(parts[1])
pvcs = {d["metadata"]["name"] for f, d in objs if d["kind"] == "PersistentVolumeClaim"}

# ---- workloads -----------------------------------------------------------------------------
pods = []  # (file, workload name, pod labels, {port name: number}, set of numbers)
rollouts_steps, rollouts_refs, batch_step_groups, served_names = [], [], [], []
IMAGE_SRC = "/src/arclight"  # the Dockerfile's WORKDIR: the repository in the image
WORKLOADS = ("Deployment", "StatefulSet", "Job", "DaemonSet")
for f, d in objs:
    if d["kind"] not in WORKLOADS:
        continue
    wname = f"{d['kind']} {d['metadata']['name']}"
    spec = d.get("spec", {})
    tmpl = spec.get("template", {})
    labels = (tmpl.get("metadata") or {}).get("labels") or {}
    if d["kind"] != "Job":
        sel = (spec.get("selector") or {}).get("matchLabels") or {}
        check(sel and all(labels.get(k) == v for k, v in sel.items()),
              f"{wname}: selector {sel} does not match its pod labels {labels}")
    pspec = tmpl.get("spec", {})
    psc = pspec.get("securityContext") or {}
    volumes = {v.get("name"): v for v in pspec.get("volumes", [])}
    claim_templates = {(c.get("metadata") or {}).get("name") for c in spec.get("volumeClaimTemplates", [])}
    if d["kind"] == "StatefulSet":
        check(spec.get("serviceName") in {o["metadata"]["name"] for _, o in objs if o["kind"] == "Service"},
              f"{wname}: serviceName {spec.get('serviceName')} is not a Service")
    for v in volumes.values():
        if "configMap" in v:
            check(v["configMap"].get("name") in configmaps,
                  f"{wname}: volume {v['name']} uses ConfigMap {v['configMap'].get('name')}, which is not defined")
        if "persistentVolumeClaim" in v:
            check(v["persistentVolumeClaim"].get("claimName") in pvcs,
                  f"{wname}: volume {v['name']} claims {v['persistentVolumeClaim'].get('claimName')}, "
                  "which is not defined")
    port_names, port_numbers = {}, set()
    for c in pspec.get("initContainers", []) + pspec.get("containers", []):
        cname = f"{wname} container {c.get('name')}"
        argv = list(c.get("command") or []) + list(c.get("args") or [])
        check(all(isinstance(a, str) for a in argv), f"{cname}: command/args hold a non-string {argv}")
        argv = [str(a) for a in argv]
        check(argv[:1] == ["arclight"], f"{cname}: runs {argv[:1]}, not arclight")
        image = str(c.get("image", ""))
        check(image.split(":")[0].split("@")[0] in images,
              f"{cname}: image {image} is not the kustomization's arclight image {sorted(images)}")
        cmd = argv[1] if len(argv) > 1 else None
        flags = None
        if check(cmd in commands, f"{cname}: arclight has no command {cmd!r}"):
            flags = help_flags(cmd)
            check(flags is not None, f"{cname}: `arclight {cmd} --help` failed")
        if cmd == "topics":
            check(argv[2:3] == ["create"], f"{cname}: runs topics {argv[2:3]}, not topics create")
        opts = {}
        for i, a in enumerate(argv[2:], start=2):
            if not a.startswith("--"):
                continue
            flag = a.split("=", 1)[0]
            if flags is not None:
                check(flag in flags, f"{cname}: {flag} is not a flag of `arclight {cmd}`")
            opts[flag] = a.split("=", 1)[1] if "=" in a else (argv[i + 1] if i + 1 < len(argv) else "")
        check("--bootstrap" not in opts, f"{cname}: passes --bootstrap; the address belongs in the ConfigMap")
        env = {e.get("name"): e for e in c.get("env", [])}
        ref = ((env.get("ARCLIGHT_BOOTSTRAP") or {}).get("valueFrom") or {}).get("configMapKeyRef") or {}
        check(ref.get("name") == bootstrap_cm and ref.get("key") == "ARCLIGHT_BOOTSTRAP",
              f"{cname}: ARCLIGHT_BOOTSTRAP does not come from ConfigMap {bootstrap_cm}")
        # Ports the command listens on, from its flags.
        listening = {}
        for flag in ("--listen", "--metrics"):
            if flag in opts:
                p = port_of(opts[flag])
                if check(p is not None, f"{cname}: {flag} {opts[flag]!r} is not HOST:PORT"):
                    listening[flag] = p
                    host = opts[flag].rsplit(":", 1)[0]
                    check(host not in ("127.0.0.1", "localhost", "[::1]"),
                          f"{cname}: {flag} {opts[flag]} is loopback, unreachable from the cluster")
        cports = {}
        for p in c.get("ports", []):
            check(p.get("containerPort") in listening.values(),
                  f"{cname}: containerPort {p.get('containerPort')} is not a port it listens on {listening}")
            if p.get("name"):
                cports[p["name"]] = p.get("containerPort")
            port_names[p.get("name")] = p.get("containerPort")
            port_numbers.add(p.get("containerPort"))
        for kind in ("readinessProbe", "livenessProbe"):
            probe = c.get(kind)
            if d["kind"] == "Job":
                continue
            if not check(probe and "httpGet" in probe, f"{cname}: no {kind} (httpGet)"):
                continue
            hg = probe["httpGet"]
            port = cports.get(hg.get("port"), hg.get("port"))
            path = hg.get("path")
            if cmd in ("proxy", "serve"):
                # proxy and serve answer health on their own --listen port.
                want = "/healthz" if cmd == "proxy" else "/health"
                check(port == listening.get("--listen") and path in (want, "/healthz"),
                      f"{cname}: {kind} is {path} on port {hg.get('port')}; {cmd} answers {want} on "
                      f"its --listen port {listening.get('--listen')}")
            else:
                check(port == listening.get("--metrics") and path == "/healthz",
                      f"{cname}: {kind} is {path} on port {hg.get('port')}; {cmd} answers /healthz on "
                      f"its --metrics port {listening.get('--metrics')}")
        ann = (tmpl.get("metadata") or {}).get("annotations") or {}
        if d["kind"] != "Job":
            check(ann.get("prometheus.io/scrape") == "true", f"{wname}: no prometheus.io/scrape annotation")
            mport = listening.get("--metrics", listening.get("--listen") if cmd in ("proxy", "serve") else None)
            check(str(ann.get("prometheus.io/port")) == str(mport),
                  f"{wname}: prometheus.io/port {ann.get('prometheus.io/port')} is not its metrics port {mport}")
        res = c.get("resources") or {}
        for part in ("requests", "limits"):
            check(all(k in (res.get(part) or {}) for k in ("cpu", "memory")), f"{cname}: no cpu/memory {part}")
        sc = c.get("securityContext") or {}
        check(sc.get("readOnlyRootFilesystem") is True, f"{cname}: root filesystem is not read-only")
        check(sc.get("allowPrivilegeEscalation") is False, f"{cname}: privilege escalation allowed")
        check((sc.get("runAsNonRoot", psc.get("runAsNonRoot")) is True)
              and sc.get("runAsUser", psc.get("runAsUser", 1)) != 0, f"{cname}: may run as root")
        mounts = {}
        for m in c.get("volumeMounts", []):
            check(m.get("name") in volumes or m.get("name") in claim_templates,
                  f"{cname}: mounts volume {m.get('name')}, which is not declared")
            mounts[m.get("mountPath")] = m
        check("/tmp" in mounts, f"{cname}: no writable /tmp on a read-only root filesystem")
        # Directories a command writes must be writable mounts; those it reads must be mounted.
        for flag, writes in (("--spool-dir", True), ("--out", True), ("--workdir", True), ("--model", False),
                             ("--tasks", False), ("--topics", False), ("--train-config", False),
                             ("--config", False)):
            if flag not in opts or (cmd == "rollouts" and flag == "--model"):  # a model name there
                continue
            path = opts[flag]
            if not writes and path.startswith(IMAGE_SRC + "/"):
                # the image's copy of the repository (the Dockerfile's WORKDIR)
                check(os.path.exists(os.path.join(root, path[len(IMAGE_SRC) + 1:])),
                      f"{cname}: {flag} {path}: {path[len(IMAGE_SRC) + 1:]} is not in the repository")
                continue
            under = [mp for mp in mounts if path == mp or path.startswith(mp.rstrip("/") + "/")]
            if check(under, f"{cname}: {flag} {path} is on no mounted volume (read-only root filesystem)"):
                check(not writes or not mounts[max(under, key=len)].get("readOnly"),
                      f"{cname}: {flag} {path} is on a read-only mount")
        if "ARCLIGHT_BROKER_CONFIG" in env:
            bc = env["ARCLIGHT_BROKER_CONFIG"].get("value", "")
            check(bc in mounts and "configMap" in volumes.get(mounts[bc].get("name"), {}),
                  f"{cname}: ARCLIGHT_BROKER_CONFIG {bc} is not a mounted ConfigMap")
        if cmd == "batch":
            check(d["kind"] in ("Deployment", "StatefulSet") and spec.get("replicas") == 1,
                  f"{wname}: batch must run exactly 1 replica (single writer), has {spec.get('replicas')}")
            if d["kind"] == "Deployment":
                check((spec.get("strategy") or {}).get("type") == "Recreate",
                      f"{wname}: a rolling update would run two batch workers; use strategy Recreate")
        if cmd == "credit":
            topic = opts.get("--input", "arclight.spans")
            n = partitions.get(topic)
            check(n is not None and spec.get("replicas", 1) <= n,
                  f"{wname}: {spec.get('replicas')} credit replicas for {n} partitions of {topic}")
        if cmd == "proxy":
            check(d["kind"] == "StatefulSet" and "--spool-dir" in opts and
                  any(m.get("name") in claim_templates for m in c.get("volumeMounts", [])
                      if opts["--spool-dir"].startswith(m.get("mountPath", "\0"))),
                  f"{wname}: the proxy's --spool-dir must be on a per-pod persistent volume")
        if cmd == "serve":
            check("--follow-policy" in opts, f"{wname}: serve does not follow the policy (--follow-policy)")
        if cmd == "rollouts":
            # Sharded by the pod's ordinal: --shard $(VAR)/N, VAR the pod-index label, N replicas.
            m = re.fullmatch(r"\$\((\w+)\)/(\d+)", opts.get("--shard", ""))
            if check(d["kind"] == "StatefulSet" and m is not None,
                     f"{wname}: the controller must be a StatefulSet run with --shard $(VAR)/N "
                     f"(the pod's ordinal), has --shard {opts.get('--shard')!r}"):
                fp = (((env.get(m.group(1)) or {}).get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")
                check(fp == "metadata.labels['apps.kubernetes.io/pod-index']",
                      f"{wname}: ${m.group(1)} is {fp!r}, not the pod's apps.kubernetes.io/pod-index label")
                check(int(m.group(2)) == spec.get("replicas", 1),
                      f"{wname}: --shard .../{m.group(2)} but {spec.get('replicas', 1)} replicas: "
                      "shards would be run twice or not at all")
                rollouts_steps.append((wname, int(m.group(2)) * int(opts.get("--step-groups", "1"))))
            check(any(m.get("name") in claim_templates for m in c.get("volumeMounts", [])
                      if opts.get("--workdir", ".").startswith(m.get("mountPath", "\0"))),
                  f"{wname}: the controller's --workdir must be on a per-pod persistent volume")
            rollouts_refs.append((wname, opts.get("--proxy", ""), opts.get("--model")))
            for w in shlex.split(opts.get("--agent", "")):
                if w.startswith(IMAGE_SRC + "/"):
                    check(os.path.exists(os.path.join(root, w[len(IMAGE_SRC) + 1:])),
                          f"{wname}: the agent's {w} is not in the repository")
        if cmd == "batch":
            batch_step_groups.append(opts.get("--step-groups"))
        if cmd == "serve":
            served_names.append(opts.get("--served-model-name"))
    pods.append((f, wname, labels, port_names, port_numbers))

# ---- the rollout controllers, with batch, serve and the proxy ------------------------------
services_by_name = {d["metadata"]["name"]: d for f, d in objs if d["kind"] == "Service"}
for wname, total in rollouts_steps:
    check(batch_step_groups == [str(total)],
          f"{wname}: shards x --step-groups = {total} groups per step, batch closes steps at "
          f"--step-groups {batch_step_groups}")
for wname, proxy_url, model in rollouts_refs:
    m = re.fullmatch(r"http://([a-z0-9-]+):(\d+)", proxy_url)
    svc = services_by_name.get(m.group(1)) if m else None
    check(svc is not None and any(str(p.get("port")) == m.group(2) for p in svc["spec"].get("ports", []))
          and (svc["spec"].get("selector") or {}).get("app.kubernetes.io/component") == "proxy",
          f"{wname}: --proxy {proxy_url} is not the proxy's Service and port")
    check(model in served_names, f"{wname}: --model {model} is not a model serve serves {served_names}")

# ---- services ------------------------------------------------------------------------------
for f, d in objs:
    if d["kind"] != "Service":
        continue
    sname = f"Service {d['metadata']['name']}"
    sel = (d.get("spec") or {}).get("selector") or {}
    match = [p for p in pods if sel and all(p[2].get(k) == v for k, v in sel.items())]
    if not check(match, f"{sname}: selector {sel} matches no pod"):
        continue
    for sp in (d.get("spec") or {}).get("ports", []):
        tp = sp.get("targetPort", sp.get("port"))
        for p in match:
            ok = tp in p[3] if isinstance(tp, str) else tp in p[4]
            check(ok, f"{sname}: targetPort {tp} is not a port of {p[1]}")

for f in failures:
    print("k8s:", f)
print(f"k8s: {len(docs)} documents, {len(pods)} workloads, {len(failures)} problems")
sys.exit(1 if failures else 0)
