#!/usr/bin/env bash
# The main job on the embedded default: builds arclight and runs the whole loop on this
# machine with `arclight up`: the embedded broker (127.0.0.1:9092), the policy server with a
# tiny model (127.0.0.1:8000) warm-started on examples/letters/sft.jsonl, the capture proxy
# (127.0.0.1:8080), credit, batch, train, and the rollout controller, which runs the letters
# demo (examples/letters: an unchanged agent on the openai npm client, two LLM calls per
# rollout) over its task set and evaluates the held-out tasks every 10 versions. It ends with
# a summary line (val reward at the start and at the end, minutes taken); metrics.csv,
# reward.svg and eval.jsonl are in the work directory it prints. Ctrl-C stops everything.
#   bash scripts/run.sh                                   until the held-out reward is up (--steps 60)
#   bash scripts/run.sh --steps 100                       stop after 100 policy versions
#   bash scripts/run.sh --agent 'python3 my_agent.py' --tasks my_tasks.jsonl
#   ARCLIGHT_LISTEN=127.0.0.1:19092 bash scripts/run.sh   the broker on another port
#   BUILD_DIR=build-x bash scripts/run.sh                 another build directory
# Every flag given to run.sh goes to `arclight up` (see `arclight up --help`).
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
echo "run: starting the loop (arclight up); watch the topics with" >&2
echo "run:   ./$build/arclight tail arclight.spans arclight.policy --bootstrap $listen --follow" >&2
steps=(--steps 60)
for a in "$@"; do [ "$a" = "--steps" ] && steps=(); done
exec "./$build/arclight" up --listen-broker "$listen" --workdir "$logdir/up" "${steps[@]}" "$@"
