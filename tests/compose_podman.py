#!/usr/bin/python3
"""Runs docker-compose.yml for real with podman-compose (t1507, label `compose`): the image of
this tree built from the Dockerfile, Kafka and every stage in containers, the letters demo
cut to --steps policy versions.

The file is used as it is but for what a shared test machine needs, written to a copy under
--dir: the build context and bind mounts made absolute, no ports published on the host (two
runs, or anything else on 8000/8080/9092, must not collide; health checks run inside the
containers), the image named --image (built here: `podman build`, its layers cached, so
an unchanged tree builds nothing; scripts/setup.sh builds it once), and the rollout
controller's --steps. The project name (-p) is unique to the run, so containers, volumes
and the network are the run's own.

podman-compose 1.0.3 starts every service at once (it ignores depends_on conditions) and
runs no health checks (they need systemd), so this waits itself: the one-shot services
(topics, model, warmstart) must exit 0, every service with a health check must pass it (run
with `podman exec`), and the rollout controller must exit 0 after its last version. Then it
copies metrics.csv and reward.svg out to --dir, stops the services downstream first with
their stop_grace_period, checks that each exited 0 (kafka: 0 or 143, the JVM's answer to
SIGTERM), and removes the containers, volumes and network (also when something failed).

Prints `compose-podman: ok ...` and exits 0; prints `compose-podman: SKIP: why` and exits 77
when this machine cannot run podman; otherwise prints what failed (with the tail of the
logs) and exits 1. Logs of every container: DIR/logs/SERVICE.log."""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import yaml

ap = argparse.ArgumentParser()
ap.add_argument("--source", default=os.environ.get("ARCLIGHT_SOURCE_DIR", "."))
ap.add_argument("--dir", required=True)
ap.add_argument("--project", default=f"arclight-t1507-{os.getpid()}")
ap.add_argument("--image", default="localhost/arclight-compose-test:latest")
ap.add_argument("--steps", type=int, default=2)
ap.add_argument("--timeout", type=float, default=900)
ap.add_argument("--build-only", action="store_true", help="build the image and exit")
args = ap.parse_args()

src = os.path.abspath(args.source)
work = os.path.abspath(args.dir)
logs = os.path.join(work, "logs")
os.makedirs(logs, exist_ok=True)
started = time.monotonic()
deadline = started + args.timeout
BASE_IMAGES = ["docker.io/library/debian:12", "docker.io/library/node:20-bookworm-slim",
               "docker.io/apache/kafka:4.1.1"]
ONE_SHOT = ["topics", "model", "warmstart"]
STOP_ORDER = ["rollouts", "proxy", "credit", "batch", "train", "serve", "kafka"]


def say(msg):
    print(f"compose-podman: {msg} [{time.monotonic() - started:.0f}s]", flush=True)


def run(cmd, timeout=120, check=False):
    """Runs CMD (a list); its CompletedProcess (stdout and stderr as text, merged)."""
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {r.returncode}: {r.stdout[-2000:]}")
    return r


def skip(why):
    print(f"compose-podman: SKIP: {why}", flush=True)
    sys.exit(77)


def preflight():
    """Skips (exit 77) unless podman runs here and the base images are present."""
    for tool in ("podman", "podman-compose"):
        if not shutil.which(tool):
            skip(f"no {tool} on PATH (scripts/setup.sh installs it)")
    r = run(["podman", "info", "--format", "{{.Host.OCIRuntime.Name}}"])
    if r.returncode != 0:
        skip(f"podman does not run here: {r.stdout.strip()[-300:]}")
    for img in BASE_IMAGES:
        if run(["podman", "image", "exists", img]).returncode != 0:
            skip(f"no image {img} (scripts/setup.sh builds it: scripts/compose_deps.sh)")


def build_image():
    """Builds the Dockerfile of the tree as --image; its layers are cached."""
    say(f"building {args.image} from {src}/Dockerfile")
    old = run(["podman", "image", "inspect", "--format", "{{.Id}}", args.image]).stdout.strip()
    with open(os.path.join(logs, "build.log"), "w") as f:
        r = subprocess.run(["nice", "-n", "10", "podman", "build", "-t", args.image, src],
                           stdout=f, stderr=subprocess.STDOUT, timeout=max(60, deadline - time.monotonic()))
    if r.returncode != 0:
        fail(f"podman build exited {r.returncode} (see {logs}/build.log)")
    new = run(["podman", "image", "inspect", "--format", "{{.Id}}", args.image]).stdout.strip()
    if old and old != new:  # the image of an older tree: 1.2 GB that nothing names any more
        run(["podman", "rmi", old])
    say("image built")


def compose_file():
    """Writes the run's copy of docker-compose.yml; returns its path and its services."""
    with open(os.path.join(src, "docker-compose.yml")) as f:
        doc = yaml.safe_load(f)
    for name, svc in doc["services"].items():
        svc.pop("ports", None)
        if "build" in svc:
            svc.pop("build")
            svc["image"] = args.image
        vols = []
        for v in svc.get("volumes", []):
            if v.startswith("./"):
                v = os.path.join(src, v[2:])
            vols.append(v)
        if vols:
            svc["volumes"] = vols
    cmd = doc["services"]["rollouts"]["command"]
    cmd[cmd.index("--steps") + 1] = str(args.steps)
    path = os.path.join(work, "docker-compose.yml")
    with open(path, "w") as f:
        yaml.safe_dump(doc, f, sort_keys=False)
    return path, doc["services"]


def compose(*cmd, timeout=300):
    return run(["podman-compose", "-p", args.project, "-f", compose_path, *cmd], timeout=timeout)


def containers():
    """service -> (container name, state, exit code) of the project's containers."""
    r = run(["podman", "ps", "-a", "--filter", f"label=io.podman.compose.project={args.project}",
             "--format", "json"], check=True)
    out = {}
    for c in json.loads(r.stdout or "[]"):
        svc = (c.get("Labels") or {}).get("com.docker.compose.service")
        if svc:
            out[svc] = (c["Names"][0], c["State"], c.get("ExitCode", 0))
    return out


def save_logs():
    for svc, (name, _, _) in containers().items():
        with open(os.path.join(logs, f"{svc}.log"), "w") as f:
            subprocess.run(["podman", "logs", name], stdout=f, stderr=subprocess.STDOUT,
                           timeout=60)


def tail(svc, n=25):
    try:
        with open(os.path.join(logs, f"{svc}.log")) as f:
            lines = f.readlines()[-n:]
    except OSError:
        return
    print(f"---- {svc} (last {len(lines)} lines) ----")
    sys.stdout.write("".join(lines))


def down():
    """Removes the run's containers, volumes and network, whatever state they are in."""
    compose("down", "-v", "-t", "5")
    for name, _, _ in containers().values():
        run(["podman", "rm", "-f", "-v", name])
    r = run(["podman", "volume", "ls", "-q", "--filter",
             f"label=io.podman.compose.project={args.project}"])
    for vol in r.stdout.split():
        run(["podman", "volume", "rm", "-f", vol])
    run(["podman", "network", "rm", "-f", f"{args.project}_default"])


def fail(msg, svc=None):
    print(f"compose-podman: FAILED: {msg}", flush=True)
    if compose_path:
        save_logs()
        for s in ([svc] if svc else containers().keys()):
            tail(s)
        down()
    print(f"  logs kept in {logs}")
    sys.exit(1)


def healthy(svc, name):
    """Runs SVC's health check inside its container; True when it passes."""
    test = services[svc]["healthcheck"]["test"]
    argv = test[1:] if test[0] == "CMD" else ["sh", "-c", test[1]]
    return run(["podman", "exec", name, *argv], timeout=30).returncode == 0


def wait_stack():
    """Waits for the one-shot jobs, every health check, then the controller's exit 0."""
    pending_jobs, pending_health = set(ONE_SHOT), {s for s, v in services.items()
                                                     if v.get("healthcheck")}
    failed_since = None  # when rollouts was first seen exited non-zero
    while time.monotonic() < deadline:
        now = containers()
        if "rollouts" in now and now["rollouts"][1] != "exited":
            failed_since = None
        for svc in sorted(pending_jobs):
            if svc in now and now[svc][1] == "exited":
                if now[svc][2] != 0:
                    fail(f"{svc} exited {now[svc][2]}", svc)
                pending_jobs.discard(svc)
                say(f"{svc} completed")
        for svc in sorted(pending_health):
            if svc not in now:
                continue
            name, state, code = now[svc]
            if state == "running" and healthy(svc, name):
                pending_health.discard(svc)
                say(f"{svc} healthy")
            elif state == "exited" and svc != "rollouts" and code != 0:
                say(f"{svc} exited {code} before it was healthy (its restart policy restarts it)")
        if "rollouts" in now and now["rollouts"][1] == "exited":
            code = now["rollouts"][2]
            # restart: on-failure brings it back (it exits when it starts before its
            # topics exist); a failure is an exit that stays
            if code != 0 and failed_since is None:
                failed_since = time.monotonic()
                say(f"rollouts exited {code} (its restart policy restarts it)")
            if code != 0 and time.monotonic() - failed_since < 10:
                time.sleep(2)
                continue
            if code != 0:
                fail(f"rollouts exited {code} and stayed down", "rollouts")
            if pending_jobs or pending_health - {"rollouts"}:
                fail(f"rollouts finished but {sorted(pending_jobs | pending_health)} never were "
                     "completed/healthy")
            say("rollouts finished (exit 0)")
            return
        time.sleep(2)
    fail(f"timed out after {args.timeout:.0f} s (jobs pending {sorted(pending_jobs)}, "
         f"health pending {sorted(pending_health)})")


def stop_all():
    """Stops the services downstream first; fails unless each exited cleanly."""
    now = containers()
    bad = []
    for svc in STOP_ORDER + sorted(set(now) - set(STOP_ORDER)):
        if svc not in now:
            continue
        name = now[svc][0]
        grace = str(services[svc].get("stop_grace_period", "10s")).rstrip("s")
        run(["podman", "stop", "-t", grace, name], timeout=int(grace) + 60)
        code = containers()[svc][2]
        ok = code == 0 or (svc == "kafka" and code == 143)
        say(f"{svc} stopped, exit {code}")
        if not ok:
            bad.append(f"{svc} exited {code}")
    if bad:
        fail("not stopped cleanly: " + ", ".join(bad), None)


compose_path = None
# Ctrl-C or a SIGTERM (ctest's timeout is later than --timeout) still brings the stack down.
for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, lambda n, _f: fail(f"stopped by signal {n}"))
preflight()
build_image()
if args.build_only:
    sys.exit(0)
compose_path, services = compose_file()
say(f"up: project {args.project}, rollouts --steps {args.steps}")
r = compose("up", "-d", timeout=600)
with open(os.path.join(logs, "up.log"), "w") as f:
    f.write(r.stdout)
if r.returncode != 0:
    fail(f"podman-compose up exited {r.returncode} (see {logs}/up.log)")
wait_stack()
name = containers()["rollouts"][0]
for f in ("metrics.csv", "reward.svg"):
    r = run(["podman", "cp", f"{name}:/var/lib/arclight/rollouts/{f}", os.path.join(work, f)])
    if r.returncode != 0:
        fail(f"podman cp of {f} out of {name}: {r.stdout.strip()}")
stop_all()
save_logs()
down()
left = containers()
if left:
    fail(f"containers left after down: {sorted(left)}")
say(f"ok: stack ran --steps {args.steps}, every service stopped cleanly, removed")
