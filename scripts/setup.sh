#!/usr/bin/env bash
# Installs everything arclight needs on a fresh Debian 12 machine: Debian packages via apt,
# npm packages via npm, and the Apache Kafka broker the real-Kafka tests run via Maven. Idempotent: a second run installs nothing and succeeds. Fails with a
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

# cuBLAS, cuDNN and NCCL for the CUDA backend, where nvcc is present (scripts/cuda_deps.sh).
bash scripts/cuda_deps.sh

for tool in cmake cc pkg-config kcat avrocat node npm java mvn; do
  command -v "$tool" >/dev/null 2>&1 || { echo "setup: '$tool' is not on PATH after install" >&2; exit 1; }
done
[ -f /usr/include/librdkafka/rdkafka_mock.h ] || { echo "setup: rdkafka_mock.h missing (librdkafka-dev)" >&2; exit 1; }
echo "setup: ok"
