#!/usr/bin/python3
"""Checks docker-compose.yml the way `docker compose config` and a first `up` would
notice problems, without a Docker engine: structure, listener consistency, that the host
listener is arclight's default bootstrap, and that the topics job runs a real arclight
command against files that exist. Prints one line per failed check and exits 1 if any."""
import os
import re
import sys

import yaml

root = os.environ.get("ARCLIGHT_SOURCE_DIR", ".")
failures = []


def check(cond, msg):
    if not cond:
        failures.append(msg)


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

for f in failures:
    print("compose:", f)
print(f"compose: {len(failures)} problems")
sys.exit(1 if failures else 0)
