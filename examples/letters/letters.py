"""The letters task and its door, for the Python agents of examples/letters.

What task.js and tool_agent.js are to the JavaScript agents: the task the controller hands
over (ARCLIGHT_TASK), the door as a tool's body (open_door(key)), how the rollout's reward
is split between its two calls and posted to ARCLIGHT_REWARD_URL, and how long an answer
may be. No client library is used here: each agent builds its own client and tool loop
the way that library's users do, from these few facts. The rules are task.js's, to the
character (a share counts visible characters, as JavaScript's /\\s/ splits them).
"""
import json
import os
import re
import urllib.request

KEY = "k"
SYSTEM = "You open doors."
TOOL_NAME = "open_door"
TOOL_DESCRIPTION = "Try a key on the shut door. Says what the door does."
KEY_DESCRIPTION = "The key to try."
# tool_agent.js's TOOL_CALL_TOKENS: what a <tool_call> block costs around its key
TOOL_CALL_TOKENS = 35

# JavaScript's \s (task.js splits on it): ASCII and Unicode spaces, line separators, BOM
_JS_SPACE = re.compile("[\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]")


def first_prompt(task):
    """Call 1's user message: no k anywhere (the key must be found, not copied)."""
    return f"The {task['door']} door is shut. Open it."


def share(text, letter):
    """The share of the visible characters of text that are letter (either case)."""
    visible = [ch for ch in str(text or "") if not _JS_SPACE.fullmatch(ch)]
    if not visible:
        return 0.0
    # JavaScript's toLowerCase() also folds the Kelvin sign to k; Python's lower() does too
    return sum(1 for ch in visible if ch.lower() == letter) / len(visible)


def door_answer(task, attempt):
    """What the door says to an attempt: the room's letter once per k (at most four)."""
    n = min(4, sum(1 for ch in str(attempt or "") if ch.lower() == KEY))
    if not n:
        return "The door stays shut. Write the room."
    return f"The door opens. Room: {' '.join([task['room']] * n)}. Write the room."


def read_task():
    """The task's input from ARCLIGHT_TASK (set by `arclight rollouts`)."""
    raw = os.environ.get("ARCLIGHT_TASK")
    if not raw:
        raise RuntimeError("ARCLIGHT_TASK is not set: run this agent with `arclight rollouts`")
    task = json.loads(raw).get("input") or {}
    for field in ("door", "room"):
        if not isinstance(task.get(field), str) or not task[field]:
            raise RuntimeError(f"the task's input has no {field}")
    return task


def max_tokens():
    """ARCLIGHT_MAX_TOKENS (12 under `arclight up`) plus a tool call's own tokens."""
    raw = os.environ.get("ARCLIGHT_MAX_TOKENS", "12")
    if not raw.isdigit() or int(raw) < 1:
        raise RuntimeError(f"ARCLIGHT_MAX_TOKENS must be a positive integer, got '{raw}'")
    return int(raw) + TOOL_CALL_TOKENS


def post_reward(value, name):
    """Posts one named part of the reward to ARCLIGHT_REWARD_URL; raises on an HTTP error."""
    url = os.environ.get("ARCLIGHT_REWARD_URL")
    if not url:
        raise RuntimeError("ARCLIGHT_REWARD_URL is not set: run this agent with `arclight rollouts`")
    body = json.dumps({"value": value, "name": name}).encode()
    req = urllib.request.Request(url, data=body, headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as r:
        r.read()


class Door:
    """The door's side of a rollout, as tool_agent.js's door(): the tool's body and the two
    reward posts. Only the first use of the tool counts: later calls get the first
    attempt's answer again."""

    def __init__(self, task):
        self.task = task
        self.attempt = None

    def open(self, key):
        """open_door's body: scores the attempt (posted before the result goes back, so the
        proxy files it after call 1) and answers as the door does."""
        if self.attempt is None:
            self.attempt = str(key if key is not None else "")
            post_reward(share(self.attempt, KEY) / 2, "key")
        return door_answer(self.task, self.attempt)

    def opened(self):
        return self.attempt is not None

    def finish(self, first_text, answer):
        """After the run: first_text is call 1's text (the attempt when the tool was never
        called), answer call 2's text ('' when there was none). Posts the room's part."""
        if self.attempt is None:
            self.attempt = str(first_text or "")
            post_reward(share(self.attempt, KEY) / 2, "key")
            answer = ""  # the door never answered: nothing to write the room from
        post_reward(share(answer, self.task["room"]) / 2, "room")
