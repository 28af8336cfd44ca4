#!/usr/bin/env bash
# What the compose test (t1507, label `compose`) needs to run docker-compose.yml for real:
# Debian's podman, podman-compose, runc and debootstrap, podman configured for machines of
# this kind, and the three base images the stack names, built locally because no container
# registry is reachable from here:
#   docker.io/library/debian:12               `debootstrap --variant=minbase bookworm`, with
#                                             the machine's extra CA certificates (HTTPS
#                                             from inside goes through an intercepting proxy)
#   docker.io/library/node:20-bookworm-slim   debian:12 plus this machine's node and npm
#   docker.io/apache/kafka:4.1.1              debian:12 plus Debian's JRE and the Kafka jars
#                                             Maven fetched for the tests (build-kafka/libs),
#                                             started by scripts/compose/kafka-start.sh
# An image already present (a real one, or one a previous run built) is kept: a second run
# builds nothing. Run by scripts/setup.sh, which goes on when this fails: the compose test
# then skips with a message. Exits 0 when podman is usable and the images are present, 1
# with a message otherwise.
set -uo pipefail
cd "$(dirname "$0")/.."

say() { echo "setup: compose: $*"; }
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

# Packages. --no-install-recommends keeps crun out: it refuses this kernel's hybrid cgroups.
missing=()
for p in podman podman-compose runc debootstrap containernetworking-plugins \
         golang-github-containernetworking-plugin-dnsname; do  # dnsname: service names resolve
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]}"
  if ! DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q --no-install-recommends \
       "${missing[@]}" >/tmp/arclight-apt-podman.log 2>&1; then
    say "apt-get install failed (see /tmp/arclight-apt-podman.log); the compose test will skip" >&2
    exit 1
  fi
fi

# Configuration: a drop-in, read after the machine's own containers.conf (which stays as it
# is); only these keys are overridden. runc and cgroupfs because there is no systemd and the
# cgroups are hybrid; the file event logger because there is no journald; limits the
# stages' sockets and threads need.
DROPIN=/etc/containers/containers.conf.d/50-arclight.conf
want='[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"'
if [ "$(cat "$DROPIN" 2>/dev/null)" != "$want" ]; then
  say "writing $DROPIN"
  $SUDO mkdir -p "$(dirname "$DROPIN")" && printf '%s\n' "$want" | $SUDO tee "$DROPIN" >/dev/null
fi
if ! out=$($SUDO podman info --format '{{.Host.OCIRuntime.Name}} {{.Host.CgroupManager}}' 2>&1); then
  say "podman does not run here ($out); the compose test will skip" >&2
  exit 1
fi

have_image() { $SUDO podman image exists "$1"; }
work=$(mktemp -d /tmp/arclight-images.XXXXXX)
trap 'rm -rf "$work"' EXIT

# debian:12 from debootstrap, the machine's extra CA certificates trusted inside
if ! have_image docker.io/library/debian:12; then
  say "building debian:12 with debootstrap (a few minutes)"
  root="$work/rootfs"
  if ! nice -n 10 $SUDO debootstrap --variant=minbase --include=ca-certificates bookworm "$root" \
       http://deb.debian.org/debian >/tmp/arclight-debootstrap.log 2>&1; then
    say "debootstrap failed (see /tmp/arclight-debootstrap.log); the compose test will skip" >&2
    exit 1
  fi
  $SUDO cp /usr/local/share/ca-certificates/*.crt "$root/usr/local/share/ca-certificates/" 2>/dev/null
  $SUDO chroot "$root" update-ca-certificates >/dev/null 2>&1
  $SUDO rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*
  if ! $SUDO tar -C "$root" -c . | $SUDO podman import -q \
       --change 'ENV NODE_EXTRA_CA_CERTS=/etc/ssl/certs/ca-certificates.crt' \
       --change 'CMD ["bash"]' - docker.io/library/debian:12 >/dev/null; then
    say "podman import of debian:12 failed; the compose test will skip" >&2
    exit 1
  fi
  $SUDO rm -rf "$root"
fi

# node:20-bookworm-slim: where the official image keeps node and npm
if ! have_image docker.io/library/node:20-bookworm-slim; then
  node=$(command -v node) npm_dir=$(dirname "$(dirname "$(readlink -f "$(command -v npm)")")")
  say "building node:20-bookworm-slim from $node ($(node --version)) and $npm_dir"
  mkdir -p "$work/node"
  cp "$node" "$work/node/node" && cp -r "$npm_dir" "$work/node/npm"
  printf '%s\n' 'FROM docker.io/library/debian:12' \
    'COPY node /usr/local/bin/node' 'COPY npm /usr/local/lib/node_modules/npm' \
    'RUN ln -s ../lib/node_modules/npm/bin/npm-cli.js /usr/local/bin/npm' \
    'CMD ["node"]' >"$work/node/Containerfile"
  if ! nice -n 10 $SUDO podman build -q -t docker.io/library/node:20-bookworm-slim \
       "$work/node" >/tmp/arclight-image-node.log 2>&1; then
    say "building node:20-bookworm-slim failed (see /tmp/arclight-image-node.log)" >&2
    exit 1
  fi
fi

# apache/kafka:4.1.1: the jars of build-kafka/libs (scripts/setup.sh fetched them)
if ! have_image docker.io/apache/kafka:4.1.1; then
  say "building apache/kafka:4.1.1 from Debian's JRE and build-kafka/libs"
  [ -f build-kafka/libs/kafka_2.13-4.1.1.jar ] \
    || { say "no Kafka 4.1.1 jars in build-kafka/libs" >&2; exit 1; }
  mkdir -p "$work/kafka"
  cp -r build-kafka/libs "$work/kafka/libs"
  cp scripts/compose/kafka-start.sh scripts/compose/kafka-broker-api-versions.sh "$work/kafka/"
  printf '%s\n' 'FROM docker.io/library/debian:12' \
    'RUN apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends openjdk-17-jre-headless && rm -rf /var/lib/apt/lists/*' \
    'COPY libs /opt/kafka/libs' \
    'COPY kafka-start.sh kafka-broker-api-versions.sh /opt/kafka/bin/' \
    'RUN mkdir -p /var/lib/kafka/data /opt/kafka/config' \
    'CMD ["/opt/kafka/bin/kafka-start.sh"]' >"$work/kafka/Containerfile"
  if ! nice -n 10 $SUDO podman build -q -t docker.io/apache/kafka:4.1.1 \
       "$work/kafka" >/tmp/arclight-image-kafka.log 2>&1; then
    say "building apache/kafka:4.1.1 failed (see /tmp/arclight-image-kafka.log)" >&2
    exit 1
  fi
fi
say "podman $($SUDO podman version --format "{{.Client.Version}}"), base images present"

# The image of this tree (what t1507 runs): built now so that its layers are cached; the
# test builds it again, which takes seconds when the tree has not changed since.
# ARCLIGHT_COMPOSE_IMAGE=0 leaves it to the test (t0002 does, not to compile in a test).
if [ "${ARCLIGHT_COMPOSE_IMAGE:-1}" = 0 ]; then
  say "ready (the image of this tree left to t1507)"
  exit 0
fi
say "building the image of this tree (localhost/arclight-compose-test; minutes the first time)"
if ! /usr/bin/python3 tests/compose_podman.py --build-only --dir "$work/build" >/tmp/arclight-image-arclight.log 2>&1; then
  cp "$work/build/logs/build.log" /tmp/arclight-image-arclight-build.log 2>/dev/null
  say "building the arclight image failed (see /tmp/arclight-image-arclight-build.log)" >&2
  exit 1
fi
say "ready"
