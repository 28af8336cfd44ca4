#!/usr/bin/env python3
"""The letters demo on the official `anthropic` Python client, the way its users write a
tool-using agent on the Messages API: `client.messages.create` with a system prompt and a
tool (name, description, input_schema), and their own loop: while the model stops with
stop_reason "tool_use", run each tool_use block, send the tool_result blocks back in a user
turn, and call again. Unchanged but for its base URL, which the client reads from
ANTHROPIC_BASE_URL (set by `arclight rollouts`); the model's name is ARCLIGHT_MODEL and its
answer length ARCLIGHT_MAX_TOKENS (letters.max_tokens).

The protocol and the reward are openai_agent.py's: call 1 should call open_door, call 2
writes the room; at most two model calls; a call 1 in text is the attempt and the room
scores 0. `arclight proxy` serves /v1/messages by translation to the model server's chat
completions (README, "Agent APIs").
"""
import os
import sys

import anthropic

import letters

TOOLS = [{
    "name": letters.TOOL_NAME,
    "description": letters.TOOL_DESCRIPTION,
    "input_schema": {
        "type": "object",
        "properties": {"key": {"type": "string", "description": letters.KEY_DESCRIPTION}},
        "required": ["key"],
    },
}]
MAX_MODEL_CALLS = 2


def main():
    task = letters.read_task()
    door = letters.Door(task)
    # ANTHROPIC_BASE_URL and ANTHROPIC_API_KEY from the environment (the proxy needs no key;
    # the client insists on one)
    client = anthropic.Anthropic(api_key=os.environ.get("ANTHROPIC_API_KEY", "arclight"),
                                 max_retries=3)
    model = os.environ.get("ARCLIGHT_MODEL", "tiny")
    messages = [{"role": "user", "content": letters.first_prompt(task)}]
    texts = []
    for _ in range(MAX_MODEL_CALLS):
        message = client.messages.create(model=model, system=letters.SYSTEM, messages=messages,
                                         tools=TOOLS, max_tokens=letters.max_tokens())
        uses = [block for block in message.content if block.type == "tool_use"]
        if message.stop_reason != "tool_use" or not uses:
            texts.append("".join(block.text for block in message.content if block.type == "text"))
            break
        texts.append("")
        messages.append({"role": "assistant", "content": message.content})
        results = []
        for use in uses:
            key = use.input.get("key") if isinstance(use.input, dict) else None
            if use.name != letters.TOOL_NAME:
                result = f"error: no tool named {use.name}"
            else:
                result = door.open(key) if isinstance(key, str) else "error: open_door needs a string key"
            results.append({"type": "tool_result", "tool_use_id": use.id, "content": result})
        messages.append({"role": "user", "content": results})
    if door.opened():
        door.finish("", texts[1] if len(texts) > 1 else "")
    else:
        door.finish(texts[0] if texts else "", "")


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # the controller records the exit status and this line
        print(f"letters anthropic agent: {e}", file=sys.stderr)
        sys.exit(1)
