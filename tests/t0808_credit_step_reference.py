#!/usr/bin/env python3
"""t0808's reference: step credit (credit.h "Step credit") computed from recorded spans with
nothing of credit.c, from its documented definition only.

Input: a JSON-lines file, one decoded span per line in the order of the recording, with its
partition and offset (t0808_credit_step_reference.c writes it from
tests/credit/letters-final-spans.avro). Output: one line per transition, "ID ADVANTAGE RETURN",
ADVANTAGE and RETURN as repr() of Python floats (round-trip exact).

The definition, for the clean stream a recording of a finished run is (no retries, no
timeouts, ends after their rollout's spans, one group per task and partition):
  - a rollout is the spans with one (rollout id, attempt) in one partition; held-out eval
    spans count for nothing; it ends with its end span and then joins its task's group in
    end order; the group is complete when it has group_size members (the end span's
    group_size, else the configured one) and only complete groups train;
  - a rollout trains when it succeeded (failed, aborted and timed-out ones are dropped) and
    has a call; its calls are its llm-call spans in sequence order;
  - each reward span belongs to the last call whose sequence is <= its after_sequence (the
    first call when none is); r_k the sum of call k's; G_k = r_k + gamma G_(k+1);
  - moments of a set of returns: mean, population std; the set is flat when it has one
    member or std <= 1e-9 max |v|;
  - grpo: (v - mean) / (std + eps); dr_grpo: v - mean; rloo: v - mean of the others; flat: 0;
  - A_E: G_k against the G_k of the group's training members that have a call k (with one
    final reward and gamma 1: R against the group's R); a step group: the training members'
    calls (any position) with the same state; A_S: G_k against its step group's G (0
    without a twin); advantage = A_E + w A_S;
  - a call's state: "prompt": its prompt token ids; "observed": for a call whose prompt
    starts with the previous call's prompt and response, the previous call's state and
    the rest of its prompt; for any other call its prompt.
"""
import json
import math
import sys


def moments(v):
    n = len(v)
    mean = sum(v) / n if n else 0.0
    std = math.sqrt(sum((x - mean) ** 2 for x in v) / n) if n else 0.0
    flat = n <= 1 or std <= 1e-9 * max((abs(x) for x in v), default=0.0)
    return mean, std, flat


def relative(estimator, v, i, eps):
    mean, std, flat = moments(v)
    if estimator == "none":
        return v[i]
    if flat:
        return 0.0
    if estimator == "grpo":
        return (v[i] - mean) / (std + eps)
    if estimator == "dr_grpo":
        return v[i] - mean
    if estimator == "rloo":
        return v[i] - (sum(v) - v[i]) / (len(v) - 1)
    raise ValueError(estimator)


def settle(r, gamma):
    """The rollout's calls (sorted), per-call returns and score."""
    calls = sorted(r["calls"], key=lambda c: c["seq"])
    rk = [0.0] * len(calls)
    for w in sorted(r["rewards"], key=lambda w: w["seq"]):
        at = 0
        for k, c in enumerate(calls):
            if c["seq"] <= w["after"]:
                at = k
        rk[at] += w["value"]
    g, acc = [0.0] * len(calls), 0.0
    for k in range(len(calls) - 1, -1, -1):
        acc = rk[k] + gamma * acc
        g[k] = acc
    score = 0.0
    for x in rk:
        score += x
    return calls, g, score


COUNTS = {"step groups": 0, "with twins": 0, "with spread": 0, "later calls with spread": 0}


def states(calls, mode):
    out = []
    for k, c in enumerate(calls):
        if mode == "observed" and k:
            before = calls[k - 1]["prompt"] + calls[k - 1]["response"]
            if c["prompt"][:len(before)] == before:
                out.append(out[k - 1] + c["prompt"][len(before):])
                continue
        out.append(list(c["prompt"]))
    return out


def group_transitions(members, estimator, gamma, w, eps, mode):
    trained = []
    for r in members:
        if r["status"] != "succeeded" or not r["calls"]:
            continue
        calls, g, score = settle(r, gamma)
        trained.append((r, calls, g, score))
    positions = {}  # k -> [member index] of the members with a call k, in member order
    for i, (_, calls, _, _) in enumerate(trained):
        for k in range(len(calls)):
            positions.setdefault(k, []).append(i)
    steps = {}  # prompt ids -> [(member index, k)] in member order, then call order
    for i, (_, calls, _, _) in enumerate(trained):
        for k, st in enumerate(states(calls, mode)):
            steps.setdefault(tuple(st), []).append((i, k))
    a_s = {}
    for refs in steps.values():
        vals = [trained[i][2][k] for i, k in refs]
        COUNTS["step groups"] += 1
        COUNTS["with twins"] += len(refs) > 1
        spread = len(refs) > 1 and not moments(vals)[2]
        COUNTS["with spread"] += spread
        COUNTS["later calls with spread"] += spread and refs[0][1] > 0
        for j, (i, k) in enumerate(refs):
            a_s[(i, k)] = relative(estimator, vals, j, eps) if len(refs) > 1 else 0.0
    out = []
    for i, (r, calls, g, score) in enumerate(trained):
        for k, c in enumerate(calls):
            at = positions[k]
            a_e = relative(estimator, [trained[j][2][k] for j in at], at.index(i), eps)
            tid = "%s:%d:%d" % (r["rollout"], r["attempt"], c["seq"])
            out.append((tid, a_e + w * a_s[(i, k)], g[k]))
    return out


def main():
    path, estimator, gamma, w, eps, default_size, mode = sys.argv[1:8]
    gamma, w, eps, default_size = float(gamma), float(w), float(eps), int(default_size)
    open_rollouts, groups = {}, {}
    out = []
    with open(path) as f:
        for line in f:
            s = json.loads(line)
            if s["eval"]:
                continue
            key = (s["partition"], s["rollout"], s["attempt"])
            r = open_rollouts.setdefault(key, {"rollout": s["rollout"], "attempt": s["attempt"],
                                               "task": s["task"], "calls": [], "rewards": []})
            if s["kind"] == "call":
                r["calls"].append({"seq": s["seq"], "prompt": s["prompt"], "response": s["response"]})
            elif s["kind"] == "reward":
                r["rewards"].append({"seq": s["seq"], "value": s["value"], "after": s["after"]})
            else:
                r["status"] = s["status"]
                del open_rollouts[key]
                gkey = (s["partition"], r["task"] or r["rollout"])
                g = groups.setdefault(gkey, {"size": s["group_size"] or default_size, "members": []})
                g["members"].append(r)
                if len(g["members"]) == g["size"]:
                    out.extend(group_transitions(g["members"], estimator, gamma, w, eps, mode))
                    del groups[gkey]
    for tid, adv, ret in out:
        print(tid, repr(adv), repr(ret))
    print("reference: %d transitions; %s" % (len(out), ", ".join(
        "%s %d" % kv for kv in COUNTS.items())), file=sys.stderr)


if __name__ == "__main__":
    main()
