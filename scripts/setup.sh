#!/usr/bin/env bash
# Installs everything arclight needs on a fresh Debian 12 machine: Debian packages via apt,
# npm packages via npm, Python packages via pip into a virtual environment, and the Apache Kafka broker the real-Kafka tests run via Maven. Idempotent: a second run installs nothing and succeeds. Fails with a
# message naming what is missing when something cannot be installed.
set -euo pipefail
cd "$(dirname "$0")/.."

DEBIAN_PACKAGES=(
  build-essential cmake pkg-config git unzip
  clang libclang-rt-14-dev            # libFuzzer for the fuzz targets
  librdkafka-dev libavro-dev avro-bin libjansson-dev libevent-dev libcurl4-openssl-dev
  libssl-dev libopenblas-dev zlib1g-dev  # zlib: replay inflates deflate recordings
  libgloo-dev                         # CPU data parallelism of the trainer (lib/model/dist.h)
  kcat nginx wrk                      # benchmark references
  python3-torch python3-numpy         # PyTorch reference for the model tests
  python3-venv                        # the virtual environment of the Python agents
  python3-yaml python3-kubernetes     # manifest checks: compose (t0003), deploy/k8s schema (t0004)
)
# Java 17 and Maven fetch and run the real Kafka broker of the `kafka`-labelled tests.
command -v java >/dev/null 2>&1 || DEBIAN_PACKAGES+=(openjdk-17-jre-headless)
command -v mvn >/dev/null 2>&1 || DEBIAN_PACKAGES+=(maven)
# Node.js and npm run the openai npm client as a test agent. Machines of this kind ship a
# Node.js build that includes npm; install Debian's only where there is none.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  DEBIAN_PACKAGES+=(nodejs npm)
fi

missing=()
for p in "${DEBIAN_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi

if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  if ! $SUDO apt-get update -q >/tmp/arclight-apt-update.log 2>&1; then
    echo "setup: apt-get update failed (see /tmp/arclight-apt-update.log)" >&2
    exit 1
  fi
  if ! $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}" >/tmp/arclight-apt-install.log 2>&1; then
    echo "setup: apt-get install failed (see /tmp/arclight-apt-install.log)" >&2
  fi
  still=()
  for p in "${missing[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || still+=("$p")
  done
  if [ ${#still[@]} -gt 0 ]; then
    echo "setup: these Debian packages are still missing: ${still[*]}" >&2
    exit 1
  fi
else
  echo "setup: Debian packages already installed"
fi

# npm packages: the tests' (tests/node) and the example agents' (examples), each pinned in its
# package.json and package-lock.json.
for dir in tests/node examples; do
  [ -f "$dir/package.json" ] || continue
  if [ ! -d "$dir/node_modules" ] || [ "$dir/package.json" -nt "$dir/node_modules" ]; then
    echo "setup: installing npm packages for $dir"
    log="/tmp/arclight-npm-${dir//\//-}.log"
    if ! (cd "$dir" && npm install --no-audit --no-fund --silent >"$log" 2>&1); then
      echo "setup: npm install in $dir failed (see $log)" >&2
      exit 1
    fi
    touch "$dir/node_modules"
  else
    echo "setup: npm packages for $dir already installed"
  fi
done

# Apache Kafka for the real-Kafka tests (ctest -L kafka): the release pinned in
# tests/kafka/pom.xml, its jars copied by Maven into build-kafka/libs (Maven's own cache,
# ~/.m2, makes a second copy quick; a second run with the same pom copies nothing).
# tests/kafka_fixture.h runs it from there.
KAFKA_LIBS=build-kafka/libs
kafka_version=$(sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' tests/kafka/pom.xml)
if [ -f "$KAFKA_LIBS/.complete" ] && [ "$(cat "$KAFKA_LIBS/.complete")" = "$kafka_version" ] \
   && [ "$KAFKA_LIBS/.complete" -nt tests/kafka/pom.xml ]; then
  echo "setup: Kafka $kafka_version already in $KAFKA_LIBS"
else
  echo "setup: fetching Apache Kafka $kafka_version with Maven into $KAFKA_LIBS"
  rm -rf "$KAFKA_LIBS"
  if ! mvn -B -q -f tests/kafka/pom.xml dependency:copy-dependencies -DincludeScope=runtime \
       -DoutputDirectory="$PWD/$KAFKA_LIBS" >/tmp/arclight-mvn.log 2>&1; then
    echo "setup: Maven could not fetch Kafka $kafka_version (see /tmp/arclight-mvn.log)" >&2
    exit 1
  fi
  [ -f "$KAFKA_LIBS/kafka_2.13-$kafka_version.jar" ] \
    || { echo "setup: kafka_2.13-$kafka_version.jar missing in $KAFKA_LIBS" >&2; exit 1; }
  echo "$kafka_version" >"$KAFKA_LIBS/.complete"
fi

# A Python virtual environment for the Python example agents (examples/letters/*.py: the
# openai and anthropic clients) and the Python references (torch, transformers,
# safetensors, tensorboard's event reader), never the system Python's site-packages. It
# lives in $ARCLIGHT_VENV (default ~/.cache/arclight/venv, where the tests look for it);
# a stamp of scripts/python-requirements.txt makes a second run install nothing. pip reads
# the machine's configured indexes (here a local mirror; --retries 0 so an unreachable
# default index is skipped at once instead of retried). LangChain for Python is not
# installed: langchain-core needs langchain-protocol, which the local index lacks.
VENV=${ARCLIGHT_VENV:-$HOME/.cache/arclight/venv}
REQS=scripts/python-requirements.txt
TORCH_CPU="torch==2.13.0+cpu" # the CPU build: the CUDA one pulls ~2.5 GB of NVIDIA wheels
stamp="$(sha256sum "$REQS" | cut -d' ' -f1) $TORCH_CPU"
if [ -x "$VENV/bin/python" ] && [ "$(cat "$VENV/.arclight-stamp" 2>/dev/null)" = "$stamp" ]; then
  echo "setup: Python packages already in $VENV"
else
  echo "setup: installing Python packages into $VENV (1.3 GB; one to five minutes)"
  log=/tmp/arclight-pip.log
  pip_install() { "$VENV/bin/python" -m pip install -q --retries 0 --timeout 20 --disable-pip-version-check "$@" >>"$log" 2>&1; }
  : >"$log"
  if ! { [ -x "$VENV/bin/python" ] || python3 -m venv "$VENV" >>"$log" 2>&1; }; then
    echo "setup: could not make a virtual environment in $VENV (python3-venv?; see $log)" >&2
    exit 1
  fi
  # torch: the CPU build where the index has it, else whatever torch the index offers
  if ! pip_install "$TORCH_CPU" && ! pip_install torch; then
    echo "setup: pip could not install torch into $VENV (see $log)" >&2
    exit 1
  fi
  if ! pip_install -r "$REQS"; then
    echo "setup: pip could not install $REQS into $VENV (see $log)" >&2
    exit 1
  fi
  "$VENV/bin/python" -c "import openai, anthropic, torch, transformers, safetensors, tensorboard" >>"$log" 2>&1 \
    || { echo "setup: the packages of $VENV do not import (see $log)" >&2; exit 1; }
  echo "$stamp" >"$VENV/.arclight-stamp"
fi

# cuBLAS, cuDNN and NCCL for the CUDA backend, where nvcc is present (scripts/cuda_deps.sh).
bash scripts/cuda_deps.sh

# podman and the local base images for the compose test (t1507, label compose), then the
# image of this tree, whose layers podman caches for the test (scripts/compose_deps.sh).
# Optional: where podman cannot run (no network for the packages, no user namespaces) this
# says so and setup goes on; t1507 then skips. ARCLIGHT_NO_COMPOSE=1 leaves podman out.
if [ "${ARCLIGHT_NO_COMPOSE:-0}" = 1 ]; then
  echo "setup: compose: left out (ARCLIGHT_NO_COMPOSE=1); t1507 will skip"
elif ! bash scripts/compose_deps.sh; then
  echo "setup: compose: not ready; going on without it (t1507 will skip)" >&2
fi

for tool in cmake cc pkg-config kcat avrocat node npm java mvn; do
  command -v "$tool" >/dev/null 2>&1 || { echo "setup: '$tool' is not on PATH after install" >&2; exit 1; }
done
[ -f /usr/include/librdkafka/rdkafka_mock.h ] || { echo "setup: rdkafka_mock.h missing (librdkafka-dev)" >&2; exit 1; }
echo "setup: ok"
