#!/usr/bin/env python3
"""The letters demo on the official `openai` Python client, chat completions, the way its
users write a tool-calling agent: a function tool described in JSON Schema, and their own
tool loop (call the model; if it asked for tools, run them, append their results, call
again). Unchanged but for its base URL, which the client reads from OPENAI_BASE_URL (set
by `arclight rollouts`); the model's name is ARCLIGHT_MODEL and its answer length
ARCLIGHT_MAX_TOKENS (letters.max_tokens).

Call 1 should call open_door with a key; the loop runs the tool and sends the door's answer
back, and call 2 writes the room. The loop stops after two model calls (a tool call again
in call 2 scores the room 0). A call 1 in plain text ends the run at once: that text is the
attempt and the room scores 0. The reward goes to ARCLIGHT_REWARD_URL in two parts, "key"
from inside the tool (after call 1) and "room" after the loop (letters.Door).

    ~/.cache/arclight/venv/bin/python examples/letters/openai_agent.py   # under arclight rollouts
"""
import json
import os
import sys

from openai import OpenAI

import letters

TOOLS = [{
    "type": "function",
    "function": {
        "name": letters.TOOL_NAME,
        "description": letters.TOOL_DESCRIPTION,
        "parameters": {
            "type": "object",
            "properties": {"key": {"type": "string", "description": letters.KEY_DESCRIPTION}},
            "required": ["key"],
        },
    },
}]
MAX_MODEL_CALLS = 2


def main():
    task = letters.read_task()
    door = letters.Door(task)
    client = OpenAI(max_retries=3)  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
    model = os.environ.get("ARCLIGHT_MODEL", "tiny")
    messages = [{"role": "system", "content": letters.SYSTEM},
                {"role": "user", "content": letters.first_prompt(task)}]
    texts = []
    for _ in range(MAX_MODEL_CALLS):
        completion = client.chat.completions.create(
            model=model, messages=messages, tools=TOOLS, max_tokens=letters.max_tokens())
        message = completion.choices[0].message
        if not message.tool_calls:
            texts.append(message.content or "")
            break
        texts.append("")
        messages.append(message.model_dump(exclude_none=True))
        for call in message.tool_calls:
            if call.function.name != letters.TOOL_NAME:
                result = f"error: no tool named {call.function.name}"
            else:
                try:
                    key = json.loads(call.function.arguments).get("key")
                except (ValueError, AttributeError):
                    key = None
                result = door.open(key) if isinstance(key, str) else "error: open_door needs a string key"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
    # with the tool used, call 2's text is the answer; without, call 1's text is the attempt
    if door.opened():
        door.finish("", texts[1] if len(texts) > 1 else "")
    else:
        door.finish(texts[0] if texts else "", "")


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # the controller records the exit status and this line
        print(f"letters openai agent: {e}", file=sys.stderr)
        sys.exit(1)
