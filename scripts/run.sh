#!/usr/bin/env bash
# The main job on the embedded default: builds arclight, starts the embedded broker on
# 127.0.0.1:9092 and follows its topics as JSON lines (arclight tail). Ctrl-C stops both.
#   ARCLIGHT_LISTEN=127.0.0.1:19092 bash scripts/run.sh   another port
#   BUILD_DIR=build-x bash scripts/run.sh                 another build directory
set -euo pipefail
cd "$(dirname "$0")/.."
listen="${ARCLIGHT_LISTEN:-127.0.0.1:9092}"
build="${BUILD_DIR:-build}"
logdir="$(mktemp -d "${TMPDIR:-/tmp}/arclight-run.XXXXXX")"

echo "run: building arclight in $build/ (log: $logdir/build.log)" >&2
if ! { cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release &&
       cmake --build "$build" -j"$(nproc)" --target arclight; } >"$logdir/build.log" 2>&1; then
  tail -n 40 "$logdir/build.log" >&2
  echo "run: the build failed (full log: $logdir/build.log)" >&2
  exit 1
fi

# Its own session: Ctrl-C reaches tail alone, and the broker is stopped after tail is done
# (otherwise tail's last moments fill the terminal with "connection refused").
setsid "./$build/arclight" broker --listen "$listen" >"$logdir/broker.out" 2>"$logdir/broker.log" &
broker=$!
cleanup() {
  kill "$broker" 2>/dev/null || true
  wait "$broker" 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The broker prints its bootstrap address once its topics exist.
for _ in $(seq 1 600); do
  [ -s "$logdir/broker.out" ] && break
  if ! kill -0 "$broker" 2>/dev/null; then
    cat "$logdir/broker.log" >&2
    echo "run: the embedded broker did not start (is $listen in use? set ARCLIGHT_LISTEN)" >&2
    exit 1
  fi
  sleep 0.1
done
bootstrap="$(head -n 1 "$logdir/broker.out")"
if [ -z "$bootstrap" ]; then
  echo "run: the embedded broker printed no address within 60 s (log: $logdir/broker.log)" >&2
  exit 1
fi
echo "run: embedded Kafka at $bootstrap (broker log: $logdir/broker.log)" >&2
echo "run: following arclight's topics as JSON lines; Ctrl-C stops" >&2
"./$build/arclight" tail arclight.spans arclight.transitions arclight.batches arclight.policy \
  arclight.deadletter --bootstrap "$bootstrap" --from-beginning --follow
