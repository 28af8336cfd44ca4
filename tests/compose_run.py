#!/usr/bin/python3
"""Runs docker-compose.yml's stack without Docker: every service but kafka as local
processes, with the commands, environment, start order (depends_on and its conditions) and
health checks the file gives, against a Kafka cluster that is already running (--bootstrap;
t1503 starts real Apache Kafka of the file's release with tests/kafka_fixture.h).

What a container would have is rewritten, and nothing else:
  - every port a service listens on (0.0.0.0:P in its command, 127.0.0.1:P in its health
    check) becomes a free loopback port of that service (of each replica, with --scale);
    SERVICE:P in another service's command or environment becomes that port too, and the
    kafka service's container listener (kafka:29092) becomes --bootstrap;
  - /src/arclight (the image's copy of the repository) becomes this source tree and
    `arclight` the binary under test;
  - every volume becomes a directory under --dir (a named volume one directory shared by the
    services that mount it, as Docker shares it; a bind mount its source in this tree);
  - each process gets a /tmp of its own (TMPDIR) and its container's name as
    ARCLIGHT_INSTANCE_ID (a container's host name is its own), as containers would.
Health checks run every 0.5 s instead of their interval (the test is short).

It starts the stack, waits until --until-version V shows in the rollout controller's
metrics.csv (a row for a version >= V, with the trainer's numbers), checks every health check
once more and the controller's /metrics, then stops everything the way `docker compose stop`
does (SIGTERM, downstream first, SIGKILL after the service's stop_grace_period) and checks that
each process stopped cleanly. Prints `compose-run: ok ...` and exits 0, or prints what failed
(with the tail of that service's log) and exits 1. Logs: DIR/logs/SERVICE[-N].log."""
import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import time

import yaml

ap = argparse.ArgumentParser()
ap.add_argument("--bootstrap", required=True)
ap.add_argument("--bin", required=True)
ap.add_argument("--dir", required=True)
ap.add_argument("--source", default=os.environ.get("ARCLIGHT_SOURCE_DIR", "."))
ap.add_argument("--scale", action="append", default=[], help="SERVICE=N")
ap.add_argument("--until-version", type=int, default=2)
ap.add_argument("--timeout", type=float, default=600)
args = ap.parse_args()

src = os.path.abspath(args.source)
work = os.path.abspath(args.dir)
deadline = time.monotonic() + args.timeout
os.makedirs(os.path.join(work, "logs"), exist_ok=True)
with open(os.path.join(src, "docker-compose.yml")) as f:
    doc = yaml.safe_load(f)
services = doc["services"]
scale = {s.split("=")[0]: int(s.split("=")[1]) for s in args.scale}
IMAGE_SRC = "/src/arclight"


def fail(msg, svc=None):
    print(f"compose-run: FAILED: {msg}", flush=True)
    for p in procs:
        if svc is None or p.name.startswith(svc):
            p.tail()
    stop_all(quiet=True)
    sys.exit(1)


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def seconds(v, default):
    if v is None:
        return default
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)?", str(v))
    n = float(m.group(1))
    return n / 1000 if m.group(2) == "ms" else n * 60 if m.group(2) == "m" else n


# ---- ports: every port a service listens on, per replica -------------------------------------
kafka_listeners = set()
for l in str(services["kafka"]["environment"]["KAFKA_ADVERTISED_LISTENERS"]).split(","):
    hostport = l.split("://", 1)[1]
    if not hostport.startswith("127.0.0.1:"):
        kafka_listeners.add(hostport)


def listen_ports(svc):
    s = services[svc]
    ports = set()
    for a in s.get("command") or []:
        m = re.fullmatch(r"0\.0\.0\.0:(\d+)", str(a))
        if m:
            ports.add(int(m.group(1)))
    for a in ((s.get("healthcheck") or {}).get("test") or [])[1:]:
        for m in re.finditer(r"(?:127\.0\.0\.1|localhost):(\d+)", str(a)):
            ports.add(int(m.group(1)))
    return ports


port_map = {}  # (service, replica, container port) -> loopback port
for svc in services:
    if svc == "kafka":
        continue
    for r in range(1, scale.get(svc, 1) + 1):
        for p in listen_ports(svc):
            port_map[(svc, r, p)] = free_port()


def volume_dirs(svc):
    """Container path -> host directory (and whether read-only), longest first."""
    out = []
    for v in services[svc].get("volumes") or []:
        parts = str(v).split(":")
        srcv, dst = parts[0], parts[1]
        host = os.path.normpath(os.path.join(src, srcv)) if srcv.startswith(".") else os.path.join(work, "volumes", srcv)
        os.makedirs(host, exist_ok=True)
        out.append((dst.rstrip("/"), host))
    return sorted(out, key=lambda x: -len(x[0]))


def rewrite(value, svc, replica):
    s = str(value)
    for kl in kafka_listeners:
        s = s.replace(kl, args.bootstrap)

    def local(m):
        return f"127.0.0.1:{port_map[(svc, replica, int(m.group(2)))]}"
    s = re.sub(r"(0\.0\.0\.0|127\.0\.0\.1|localhost):(\d+)",
               lambda m: local(m) if (svc, replica, int(m.group(2))) in port_map else m.group(0), s)

    def other(m):
        key = (m.group(1), 1, int(m.group(2)))
        return f"127.0.0.1:{port_map[key]}" if key in port_map else m.group(0)
    s = re.sub(r"\b([a-z][a-z0-9_-]*):(\d+)\b", other, s)
    for dst, host in volume_dirs(svc):
        s = re.sub(re.escape(dst) + r"(?=/|$|\s)", host, s)
    s = re.sub(re.escape(IMAGE_SRC) + r"(?=/|$|\s)", src, s)
    return s


# ---- processes --------------------------------------------------------------------------------
class Proc:
    def __init__(self, svc, replica):
        self.svc, self.replica = svc, replica
        self.name = svc if scale.get(svc, 1) == 1 else f"{svc}-{replica}"
        self.log = os.path.join(work, "logs", self.name + ".log")
        self.p = None

    def start(self):
        s = services[self.svc]
        argv = [rewrite(a, self.svc, self.replica) for a in s["command"]]
        if argv[0] != "arclight":
            fail(f"{self.svc} runs {argv[0]}, not arclight")
        argv[0] = args.bin
        env = dict(os.environ)
        for k in list(env):  # a container has only what the file gives it
            if k.startswith("ARCLIGHT_"):
                del env[k]
        for k, v in (s.get("environment") or {}).items():
            env[k] = rewrite(v, self.svc, self.replica)
        tmp = os.path.join(work, "tmp", self.name)
        os.makedirs(tmp, exist_ok=True)
        env["TMPDIR"] = tmp
        env["ARCLIGHT_INSTANCE_ID"] = f"arclight-{self.name}"
        self.argv = argv
        self.logf = open(self.log, "w")
        self.p = subprocess.Popen(argv, cwd=src, env=env, stdout=self.logf, stderr=subprocess.STDOUT,
                                  stdin=subprocess.DEVNULL, start_new_session=True)
        print(f"compose-run: started {self.name} (pid {self.p.pid}): {' '.join(argv[1:])}", flush=True)

    def alive(self):
        return self.p is not None and self.p.poll() is None

    def health(self):
        hc = services[self.svc].get("healthcheck")
        if not hc:
            return True
        test = [rewrite(a, self.svc, self.replica) for a in hc["test"]]
        if test[0] == "CMD":
            cmd = test[1:]
        elif test[0] == "CMD-SHELL":
            cmd = ["/bin/sh", "-c", test[1]]
        else:
            fail(f"{self.svc}: health check {test[0]} is neither CMD nor CMD-SHELL")
        try:
            return subprocess.run(cmd, capture_output=True, timeout=seconds(hc.get("timeout"), 30)).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def tail(self, n=30):
        try:
            with open(self.log, errors="replace") as f:
                lines = f.readlines()[-n:]
        except OSError:
            return
        for l in lines:
            print(f"  {self.name}| {l.rstrip()}")


procs = []
done = {}  # service -> "completed" | "healthy" | "started"


def stop_all(quiet=False):
    """SIGTERM downstream first (the reverse of the start order), SIGKILL after the grace
    period. Returns the names of processes that did not stop cleanly."""
    unclean = []
    for p in reversed(procs):
        if not p.alive():
            continue
        os.killpg(p.p.pid, signal.SIGTERM)
        try:
            p.p.wait(timeout=seconds(services[p.svc].get("stop_grace_period"), 10))
        except subprocess.TimeoutExpired:
            os.killpg(p.p.pid, signal.SIGKILL)
            p.p.wait()
            unclean.append(f"{p.name} (SIGKILL after its grace period)")
            continue
        rc = p.p.returncode
        if rc not in (0, 130, 143, -signal.SIGTERM, -signal.SIGINT):
            unclean.append(f"{p.name} (exit {rc})")
    for p in procs:
        try:
            os.killpg(p.p.pid, signal.SIGKILL)  # what is left in its group (agents)
        except (ProcessLookupError, PermissionError, AttributeError):
            pass
    return unclean


def check_running():
    for p in procs:
        if p.p.poll() is not None and done.get(p.svc) != "completed" and p.svc not in oneshot:
            fail(f"{p.name} exited ({p.p.returncode}) while the stack runs", p.name)


oneshot = {s for s, d in services.items() if str(d.get("restart", "")) == "no"}


def wait_for(svc, condition):
    if done.get(svc) in ("completed", condition.replace("service_", "")):
        return
    mine = [p for p in procs if p.svc == svc]
    if not mine:
        fail(f"{svc} is waited for but was not started")
    while True:
        if time.monotonic() > deadline:
            fail(f"{svc} not {condition} within --timeout", svc)
        if condition == "service_completed_successfully":
            if all(not p.alive() for p in mine):
                bad = [p for p in mine if p.p.returncode != 0]
                if bad:
                    fail(f"{bad[0].name} exited with status {bad[0].p.returncode}", svc)
                done[svc] = "completed"
                print(f"compose-run: {svc} completed", flush=True)
                return
        elif condition == "service_healthy":
            for p in mine:
                if not p.alive():
                    fail(f"{p.name} exited ({p.p.returncode}) before it was healthy", p.name)
            if all(p.health() for p in mine):
                done[svc] = "healthy"
                print(f"compose-run: {svc} healthy", flush=True)
                return
        else:
            return
        check_running()
        time.sleep(0.5)


def start(svc, seen=()):
    if svc in done or svc == "kafka":
        return
    deps = services[svc].get("depends_on") or {}
    if isinstance(deps, list):
        deps = {d: {"condition": "service_started"} for d in deps}
    for dep, how in deps.items():
        if dep in seen:
            fail(f"depends_on cycle through {dep}")
        if dep == "kafka":
            continue  # the cluster under --bootstrap is up
        start(dep, seen + (svc,))
        wait_for(dep, (how or {}).get("condition", "service_started"))
    for r in range(1, scale.get(svc, 1) + 1):
        p = Proc(svc, r)
        procs.append(p)
        p.start()
    done[svc] = "started"


for svc in services:
    start(svc)

# ---- until the policy reaches --until-version, as the controller reports it ------------------
ctl = [s for s, d in services.items() if (d.get("command") or [None, None])[1] == "rollouts"]
if not ctl:
    fail("no service runs arclight rollouts")
ctl = ctl[0]
cmd = services[ctl]["command"]
csv = os.path.join(rewrite(cmd[cmd.index("--workdir") + 1], ctl, 1), "metrics.csv")
rows = []
while True:
    check_running()
    if time.monotonic() > deadline:
        fail(f"no row for policy version {args.until_version} in {csv} within --timeout")
    try:
        with open(csv) as f:
            lines = f.read().splitlines()
        head = lines[0].split(",")
        rows = [dict(zip(head, l.split(","))) for l in lines[1:]]
    except (OSError, IndexError):
        rows = []
    if any(int(r["version"]) >= args.until_version and r["loss"] for r in rows):
        break
    time.sleep(1)
print(f"compose-run: metrics.csv: " + "; ".join(
    f"v{r['version']} rollouts {r['rollouts']} train {r['train_reward_mean'] or '-'} "
    f"val {r['val_reward'] or '-'} loss {r['loss'] or '-'}" for r in rows), flush=True)

# Every long-running service still healthy; the controller's own numbers.
for p in procs:
    if p.svc in oneshot:
        continue
    if not p.health():
        fail(f"{p.name} is no longer healthy", p.name)
mport = [port_map[k] for k in port_map if k[0] == ctl]
import urllib.request

text = ""
for port in mport:
    try:
        text += urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    except OSError:
        pass
m = re.search(r'^arclight_rollouts_ended\{outcome="succeeded"\} (\S+)$', text, re.M)
succeeded = float(m.group(1)) if m else 0
print(f"compose-run: {ctl} /metrics: {succeeded:.0f} rollouts succeeded", flush=True)
if succeeded <= 0:
    fail(f"{ctl}'s /metrics shows no succeeded rollout", ctl)

unclean = stop_all()
if unclean:
    print("compose-run: FAILED: did not stop cleanly: " + ", ".join(unclean), flush=True)
    for p in procs:
        if any(u.startswith(p.name + " ") for u in unclean):
            p.tail()
    sys.exit(1)
top = max(int(r["version"]) for r in rows)
print(f"compose-run: ok: policy version {top}, {len(rows)} metrics.csv rows, "
      f"{len(procs)} processes of {len(done)} services, all stopped cleanly", flush=True)
