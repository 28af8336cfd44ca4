#!/usr/bin/env bash
# The main job on the embedded default: builds arclight, starts the embedded broker on
# 127.0.0.1:9092 and follows its topics as JSON lines. Ctrl-C stops both.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" >/dev/null
./build/arclight broker --listen 127.0.0.1:9092 &
broker=$!
trap 'kill $broker 2>/dev/null; wait $broker 2>/dev/null' EXIT INT TERM
sleep 1
./build/arclight tail arclight.spans arclight.transitions arclight.batches arclight.policy \
  arclight.deadletter --bootstrap 127.0.0.1:9092 --from-beginning --follow
