#!/usr/bin/env python3
"""Reads the TensorBoard event files under a directory with TensorBoard's own reader
(tensorboard.backend.event_processing.event_accumulator, from scripts/setup.sh's virtual
environment) and prints what it found as JSON: {"run": {"tag": [[step, wall_time, value],
...]}} for every run (a directory holding event files; "." for the top one). Used by the
tests of arclight's event writer (lib/core/tbevent.c): t0007, t1405.

    ~/.cache/arclight/venv/bin/python tests/tb_read.py DIR
"""
import json
import os
import sys

from tensorboard.backend.event_processing import event_accumulator


def main():
    top = sys.argv[1]
    out = {}
    for root, _dirs, files in os.walk(top):
        if not any("tfevents" in f for f in files):
            continue
        acc = event_accumulator.EventAccumulator(root, size_guidance={event_accumulator.SCALARS: 0})
        acc.Reload()
        run = os.path.relpath(root, top)
        out[run] = {tag: [[e.step, e.wall_time, e.value] for e in acc.Scalars(tag)]
                    for tag in acc.Tags()["scalars"]}
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
