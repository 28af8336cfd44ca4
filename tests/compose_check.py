#!/usr/bin/python3
"""Checks docker-compose.yml the way `docker compose config` and a first `up` would
notice problems, without a Docker engine: structure, listener consistency, that the host
listener is arclight's default bootstrap, that the topics job runs a real arclight
command against files that exist, and, for every other service: that it runs `arclight CMD`
of the Dockerfile's image with flags that `arclight CMD --help` lists (the binary is run:
$ARCLIGHT_BIN), listens where other containers reach it, is reached at ports it listens on,
has a health check on its /healthz, writes only to named volumes and reads files the image
holds, starts after what it depends on, and that the services are wired as `arclight up`
wires its letters demo (tools/up.c): one model from the warm start for serve and train,
serve reading the trainer's checkpoints, credit, batch and the controller agreeing on the
group size and the step, credit scalable (`--scale credit=N`), batch single.
Prints one line per failed check and exits 1 if any."""
import os
import re
import shlex
import subprocess
import sys

import yaml

root = os.environ.get("ARCLIGHT_SOURCE_DIR", ".")
failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)
    return cond


with open(os.path.join(root, "docker-compose.yml")) as f:
    doc = yaml.safe_load(f)

services = doc.get("services", {})
check("kafka" in services, "no kafka service")
kafka = services.get("kafka", {})
env = {k: str(v) for k, v in kafka.get("environment", {}).items()}

# The same Kafka release as the real-Kafka tests run (tests/kafka/pom.xml).
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "kafka", "pom.xml")) as f:
    m = re.search(r"<kafka.version>([^<]+)</kafka.version>", f.read())
check(m is not None, "tests/kafka/pom.xml names no kafka.version")
if m:
    check(kafka.get("image") == f"apache/kafka:{m.group(1)}",
          f"kafka image {kafka.get('image')} is not apache/kafka:{m.group(1)}, the release the tests run")

listeners = dict(re.match(r"(\w+)://(.*)", l).groups() for l in env.get("KAFKA_LISTENERS", "").split(","))
proto = dict(p.split(":") for p in env.get("KAFKA_LISTENER_SECURITY_PROTOCOL_MAP", "").split(","))
advertised = dict(re.match(r"(\w+)://(.*)", l).groups() for l in env.get("KAFKA_ADVERTISED_LISTENERS", "").split(","))
for name in listeners:
    check(name in proto, f"listener {name} has no security protocol")
for name in advertised:
    check(name in listeners, f"advertised listener {name} is not a listener")
check(env.get("KAFKA_INTER_BROKER_LISTENER_NAME") in listeners, "inter-broker listener is not defined")
ctrl = env.get("KAFKA_CONTROLLER_LISTENER_NAMES")
check(ctrl in listeners, "controller listener is not defined")
voters = env.get("KAFKA_CONTROLLER_QUORUM_VOTERS", "")
m = re.match(r"(\d+)@([\w.-]+):(\d+)$", voters)
check(m is not None, f"bad quorum voters: {voters}")
if m and ctrl in listeners:
    check(m.group(1) == env.get("KAFKA_NODE_ID"), "quorum voter id is not this node's id")
    check(listeners[ctrl].endswith(":" + m.group(3)), "quorum voter port is not the controller listener's")
    check(m.group(2) == kafka.get("hostname"), "quorum voter host is not the kafka hostname")

# The host listener must be what arclight uses by default (lib/core/cli.c).
with open(os.path.join(root, "lib/core/cli.c")) as f:
    default_bootstrap = re.search(r'"(127\.0\.0\.1:\d+)"', f.read()).group(1)
check(any(v == default_bootstrap for v in advertised.values()),
      f"no advertised listener at arclight's default bootstrap {default_bootstrap}")
port = default_bootstrap.split(":")[1]
check(any(str(p).endswith(f":{port}:{port}") for p in kafka.get("ports", [])),
      f"port {port} is not published on the host")

# The topics job: a real arclight command, reaching Kafka through the docker listener,
# reading files that exist in the repository.
topics = services.get("topics", {})
cmd = topics.get("command", [])
check(cmd[:3] == ["arclight", "topics", "create"], f"topics job runs {cmd}")
with open(os.path.join(root, "tools/main.c")) as f:
    check('{"topics", cmd_topics' in f.read(), "arclight has no topics command")
if "--bootstrap" in cmd:
    bs = cmd[cmd.index("--bootstrap") + 1]
    check(bs in advertised.values(), f"topics job bootstraps from {bs}, not an advertised listener")
for vol in topics.get("volumes", []):
    src, dst = vol.split(":")[:2]
    check(os.path.exists(os.path.join(root, src)), f"volume source {src} does not exist")
    if "--topics" in cmd:
        tf = cmd[cmd.index("--topics") + 1]
        if tf.startswith(dst):
            check(os.path.exists(os.path.join(root, src, os.path.relpath(tf, dst))),
                  f"topics file {tf} is not in {src}")
check(topics.get("depends_on", {}).get("kafka", {}).get("condition") == "service_healthy",
      "topics job does not wait for a healthy kafka")
if "build" in topics:
    check(os.path.exists(os.path.join(root, topics["build"], "Dockerfile")), "no Dockerfile to build")
for name, vol in (doc.get("volumes") or {}).items():
    pass
for svc in services.values():
    for vol in svc.get("volumes", []):
        src = vol.split(":")[0]
        if not src.startswith(".") and not src.startswith("/"):
            check(src in (doc.get("volumes") or {}), f"named volume {src} is not declared")

# ---- every arclight service: the binary's commands and flags, ports, health, volumes -------
binary = os.environ.get("ARCLIGHT_BIN", "arclight")
IMAGE_SRC = "/src/arclight"  # the Dockerfile's WORKDIR: the repository in the image
with open(os.path.join(root, "tools/main.c")) as f:
    commands = set(re.findall(r'\{"(\w+)",\s*cmd_\w+', f.read()))
SUBCOMMANDS = {"topics": ("create", "list"), "model": ("init", "sft", "info")}
help_cache = {}


def help_flags(words):
    """The --flags `arclight WORDS... --help` prints, or None when it fails."""
    key = tuple(words)
    if key not in help_cache:
        try:
            p = subprocess.run([binary, *words, "--help"], capture_output=True, text=True, timeout=60)
            help_cache[key] = (set(re.findall(r"(--[a-z0-9][a-z0-9-]*)", p.stdout + p.stderr))
                               if p.returncode == 0 else None)
        except OSError as e:
            check(False, f"cannot run {binary}: {e}")
            help_cache[key] = None
    return help_cache[key]


def port_of(hostport):
    m = re.match(r"^(?:\[[0-9a-fA-F:]+\]|[^:/]*):(\d+)$", hostport)
    return int(m.group(1)) if m else None


try:
    with open(os.path.join(root, "Dockerfile")) as f:
        dockerfile = f.read()
except OSError:
    dockerfile = ""
m = re.search(r"^WORKDIR\s+(\S+)", dockerfile, re.M)
check(m is not None and m.group(1) == IMAGE_SRC, f"the Dockerfile's WORKDIR is not {IMAGE_SRC}")
docker_listener = [v for k, v in advertised.items() if not v.startswith("127.0.0.1:")]

stages = {}  # service -> {"cmd", "opts", "argv", "listen": {flag: port}, "mounts": {path: (vol, ro)}}
for name, svc in services.items():
    if name == "kafka":
        continue
    argv = svc.get("command")
    if not check(isinstance(argv, list) and all(isinstance(a, str) for a in argv),
                 f"{name}: command is not a list of strings (exec form)"):
        continue
    check(argv[:1] == ["arclight"], f"{name}: runs {argv[:1]}, not arclight")
    check(svc.get("image") == topics.get("image"),
          f"{name}: image {svc.get('image')} is not the Dockerfile's image {topics.get('image')}")
    check(svc.get("build") in (None, ".", "./"), f"{name}: builds {svc.get('build')}, not the repository's Dockerfile")
    cmd = argv[1] if len(argv) > 1 else None
    words = [cmd]
    if cmd in SUBCOMMANDS:
        check(len(argv) > 2 and argv[2] in SUBCOMMANDS[cmd], f"{name}: arclight {cmd} {argv[2:3]} is no subcommand")
        words.append(argv[2] if len(argv) > 2 else "")
    flags = None
    if check(cmd in commands, f"{name}: arclight has no command {cmd!r}"):
        flags = help_flags(words)
        check(flags is not None, f"{name}: `arclight {' '.join(words)} --help` failed")
    opts = {}
    for i, a in enumerate(argv[len(words) + 1:], start=len(words) + 1):
        if not a.startswith("--"):
            continue
        flag = a.split("=", 1)[0]
        if flags is not None:
            check(flag in flags, f"{name}: {flag} is not a flag of `arclight {' '.join(words)}`")
        opts[flag] = a.split("=", 1)[1] if "=" in a else (argv[i + 1] if i + 1 < len(argv) else "")
    env = {k: str(v) for k, v in (svc.get("environment") or {}).items()}
    bs = opts.get("--bootstrap", env.get("ARCLIGHT_BOOTSTRAP"))
    if cmd not in ("model",):
        check(bs in docker_listener, f"{name}: bootstraps from {bs}, not kafka's container listener {docker_listener}")
    mounts = {}
    for vol in svc.get("volumes", []):
        parts = str(vol).split(":")
        mounts[parts[1].rstrip("/")] = (parts[0], len(parts) > 2 and "ro" in parts[2].split(","))
    listen = {}
    for flag in ("--listen", "--metrics"):
        if flag in opts:
            p = port_of(opts[flag])
            if check(p is not None, f"{name}: {flag} {opts[flag]!r} is not HOST:PORT"):
                listen[flag] = p
                check(opts[flag].startswith("0.0.0.0:"),
                      f"{name}: {flag} {opts[flag]} is not 0.0.0.0: other containers cannot reach it")
    stages[name] = {"cmd": cmd, "opts": opts, "argv": argv, "listen": listen, "mounts": mounts, "env": env}

    # Files: what a command writes is on a writable named volume; what it reads is on a
    # volume or in the image's copy of the repository (and exists there).
    def under(path):
        hits = [mp for mp in mounts if path == mp or path.startswith(mp + "/")]
        return max(hits, key=len) if hits else None
    for flag, writes in (("--out", True), ("--spool-dir", True), ("--workdir", True),
                         ("--model", False), ("--tokenizer", False), ("--tasks", False),
                         ("--data", False), ("--config", False), ("--topics", False)):
        if flag not in opts or (cmd == "rollouts" and flag == "--model"):
            continue  # the controller's --model is a model name
        path = opts[flag]
        mp = under(path)
        if path.startswith(IMAGE_SRC + "/"):
            check(not writes, f"{name}: {flag} {path} writes into the image")
            check(os.path.exists(os.path.join(root, path[len(IMAGE_SRC) + 1:])),
                  f"{name}: {flag} {path}: {path[len(IMAGE_SRC) + 1:]} is not in the repository")
        elif check(mp is not None, f"{name}: {flag} {path} is on no volume (lost with the container)"):
            vol, ro = mounts[mp]
            if writes:
                check(not ro, f"{name}: {flag} {path} is on a read-only mount")
                check(not vol.startswith((".", "/")), f"{name}: {flag} {path} is on a bind mount, not a named volume")
    if cmd == "rollouts" and "--agent" in opts:
        for w in shlex.split(opts["--agent"]):
            if w.startswith(IMAGE_SRC + "/"):
                check(os.path.exists(os.path.join(root, w[len(IMAGE_SRC) + 1:])),
                      f"{name}: the agent's {w} is not in the repository")
        if shlex.split(opts["--agent"])[:1] == ["node"]:
            check(re.search(r"\bnode\b", dockerfile) and re.search(r"npm (ci|install)", dockerfile),
                  f"{name}: the agent runs on node, which the Dockerfile does not install with examples' packages")

    # Health: long-running services answer /healthz where the health check asks.
    long_running = str(svc.get("restart", "no")) != "no"
    hc = svc.get("healthcheck")
    if long_running and check(hc and isinstance(hc.get("test"), list), f"{name}: no health check"):
        test = " ".join(str(t) for t in hc["test"][1:])
        m = re.search(r"https?://(?:127\.0\.0\.1|localhost):(\d+)(/\S*)", test)
        want = listen.get("--listen") if cmd in ("proxy", "serve") else listen.get("--metrics")
        if check(m is not None, f"{name}: health check {test!r} requests no local URL"):
            check(int(m.group(1)) == want and m.group(2) == "/healthz",
                  f"{name}: health check asks {m.group(2)} on port {m.group(1)}; {cmd} answers /healthz "
                  f"on its {'--listen' if cmd in ('proxy', 'serve') else '--metrics'} port {want}")
            check(hc["test"][0] != "CMD" or hc["test"][1] in ("curl",) and re.search(r"\bcurl\b", dockerfile),
                  f"{name}: health check runs {hc['test'][1]}, which the image does not install")
    if not long_running:
        check(str(svc.get("restart")) == "no", f"{name}: a one-shot job without restart: \"no\"")

    # Scaling: a service scaled with --scale has no fixed name and no fixed host port.
    if cmd == "credit":
        check("container_name" not in svc and not svc.get("ports"),
              f"{name}: container_name or host ports stop `docker compose up --scale {name}=3`")
    if cmd == "batch":
        reps = ((svc.get("deploy") or {}).get("replicas", 1))
        check(reps == 1, f"{name}: batch must run one replica (single writer), has {reps}")

# Dependencies: named services, conditions that can be met.
for name, svc in services.items():
    deps = svc.get("depends_on") or {}
    for dep, how in (deps.items() if isinstance(deps, dict) else ((d, {}) for d in deps)):
        cond = (how or {}).get("condition", "service_started")
        if not check(dep in services, f"{name}: depends on {dep}, which is not a service"):
            continue
        check(cond in ("service_started", "service_healthy", "service_completed_successfully"),
              f"{name}: depends on {dep} with condition {cond}")
        if cond == "service_healthy":
            check(bool(services[dep].get("healthcheck")), f"{name}: waits for {dep} healthy; {dep} has no health check")
        if cond == "service_completed_successfully":
            check(str(services[dep].get("restart", "no")) == "no", f"{name}: waits for {dep} to complete; {dep} restarts")

# References: SERVICE:PORT in commands and environments is a port that service listens on.
for name, st in stages.items():
    for text in st["argv"] + list(st["env"].values()):
        for m in re.finditer(r"(?:^|//|\s)([a-z][a-z0-9_-]*):(\d+)", text):
            host, port = m.group(1), int(m.group(2))
            if host == "kafka" or host not in services:
                continue
            check(host in stages and port in stages[host]["listen"].values(),
                  f"{name}: {host}:{port}: {host} listens on {sorted(stages.get(host, {}).get('listen', {}).values())}")


# The letters demo's wiring, as `arclight up` wires it.
def by_cmd(cmd, sub=None):
    return [n for n, st in stages.items() if st["cmd"] == cmd and (sub is None or st["argv"][2:3] == [sub])]


for cmd in ("serve", "proxy", "credit", "batch", "train", "rollouts"):
    check(len(by_cmd(cmd)) == 1, f"{len(by_cmd(cmd))} services run arclight {cmd}, want one")
if all(len(by_cmd(c)) == 1 for c in ("serve", "proxy", "credit", "batch", "train", "rollouts")):
    serve, proxy, credit, batch, train, ctl = (stages[by_cmd(c)[0]] for c in
                                               ("serve", "proxy", "credit", "batch", "train", "rollouts"))
    sft = [stages[n] for n in by_cmd("model", "sft")]
    check(serve["opts"].get("--model") == train["opts"].get("--model"),
          "serve and train start from different weights")
    if sft:
        check(train["opts"].get("--model") == sft[0]["opts"].get("--out"),
              "train does not start from the warm start's output")
    check("--follow-policy" in serve["opts"], "serve does not follow the policy")
    check(serve["opts"].get("--served-model-name") == train["opts"].get("--model-name") == ctl["opts"].get("--model"),
          "serve's --served-model-name, train's --model-name and the controller's --model differ")
    # serve loads the file:// URIs train publishes (no --listen): the same path in both
    if "--listen" not in train["opts"]:
        out = train["opts"].get("--out", "")
        tv = [v for mp, v in train["mounts"].items() if out == mp or out.startswith(mp + "/")]
        sv = [v for mp, v in serve["mounts"].items() if out == mp or out.startswith(mp + "/")]
        check(tv and sv and tv[0][0] == sv[0][0],
              f"serve does not see train's checkpoints at {out} (file:// URIs name that path)")
    check("--resume" in train["opts"], "train does not --resume: a restart finds its checkpoints and stops")
    check(proxy["opts"].get("--upstream") == f"http://{by_cmd('serve')[0]}:{serve['listen'].get('--listen')}",
          f"the proxy's upstream {proxy['opts'].get('--upstream')} is not serve")
    check(ctl["opts"].get("--proxy") == f"http://{by_cmd('proxy')[0]}:{proxy['listen'].get('--listen')}",
          f"the controller's --proxy {ctl['opts'].get('--proxy')} is not the proxy")
    check(credit["opts"].get("--group-size", "8") == ctl["opts"].get("--group-size", "8"),
          "credit's and the controller's --group-size differ")
    check(batch["opts"].get("--step-groups") == ctl["opts"].get("--step-groups", "1"),
          "batch's --step-groups is not the controller's (the step it paces on)")
    check(credit["opts"].get("--credit") == "discounted" and credit["opts"].get("--gamma") == "1",
          "credit is not --credit discounted --gamma 1 (the letters demo's second call needs it)")
    with open(os.path.join(root, "tools/up.c")) as f:
        upc = f.read()
    # the KL penalty to the warm start that `arclight up` gives train when it warm-starts
    m = re.search(r'\(warm_start && \*warm_start\) \? "([^"]+)"', upc)
    if m and sft:
        check(train["opts"].get("--kl-beta") == m.group(1),
              f"train --kl-beta {train['opts'].get('--kl-beta')}, `arclight up` gives {m.group(1)} after a warm start")
    for flag in ("--group-idle-ms", "--max-staleness"):
        m = re.search(r'"%s", "([^"]+)"' % flag, upc)
        if m and flag in batch["opts"]:
            check(batch["opts"][flag] == m.group(1), f"batch {flag} {batch['opts'][flag]}, `arclight up` gives {m.group(1)}")

for f in failures:
    print("compose:", f)
print(f"compose: {len(failures)} problems")
sys.exit(1 if failures else 0)
