#!/usr/bin/env python3
"""The letters demo on the official `openai` Python client's Responses API, streamed, the
way its users write a tool-calling agent: `client.responses.create(..., stream=True)` with
instructions and a function tool, the stream's events read as they come (text deltas, then
the completed response with its output items), and their own tool loop: each
function_call item is run and its function_call_output goes back in the next call's input
with the items before it. Unchanged but for its base URL, which the client reads from
OPENAI_BASE_URL (set by `arclight rollouts`); the model's name is ARCLIGHT_MODEL and its
answer length ARCLIGHT_MAX_TOKENS (letters.max_tokens).

The protocol and the reward are openai_agent.py's: call 1 should call open_door, call 2
writes the room; at most two model calls; a call 1 in text is the attempt and the room
scores 0. `arclight proxy` serves /v1/responses by translation to the model server's chat
completions (README, "Agent APIs"), so serve sees the tool as a chat function tool.
"""
import json
import os
import sys

from openai import OpenAI

import letters

TOOLS = [{
    "type": "function",
    "name": letters.TOOL_NAME,
    "description": letters.TOOL_DESCRIPTION,
    "parameters": {
        "type": "object",
        "properties": {"key": {"type": "string", "description": letters.KEY_DESCRIPTION}},
        "required": ["key"],
    },
}]
MAX_MODEL_CALLS = 2


def respond(client, model, items):
    """One streamed call: returns (text, function_call items) of the finished response."""
    stream = client.responses.create(model=model, instructions=letters.SYSTEM, input=items,
                                     tools=TOOLS, max_output_tokens=letters.max_tokens(),
                                     stream=True)
    text, response = [], None
    for event in stream:
        if event.type == "response.output_text.delta":
            text.append(event.delta)
        elif event.type in ("response.completed", "response.incomplete"):
            response = event.response  # incomplete: cut at max_output_tokens, still an answer
        elif event.type in ("response.failed", "error"):
            raise RuntimeError(f"the response failed: {event}")
    if response is None:
        raise RuntimeError("the stream ended without the response")
    calls = [item for item in response.output if item.type == "function_call"]
    return "".join(text), calls


def main():
    task = letters.read_task()
    door = letters.Door(task)
    client = OpenAI(max_retries=3)  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
    model = os.environ.get("ARCLIGHT_MODEL", "tiny")
    items = [{"role": "user", "content": letters.first_prompt(task)}]
    texts = []
    for _ in range(MAX_MODEL_CALLS):
        text, calls = respond(client, model, items)
        if not calls:
            texts.append(text)
            break
        texts.append("")
        for call in calls:
            items.append({"type": "function_call", "call_id": call.call_id, "name": call.name,
                          "arguments": call.arguments})
            if call.name != letters.TOOL_NAME:
                result = f"error: no tool named {call.name}"
            else:
                try:
                    key = json.loads(call.arguments).get("key")
                except (ValueError, AttributeError):
                    key = None
                result = door.open(key) if isinstance(key, str) else "error: open_door needs a string key"
            items.append({"type": "function_call_output", "call_id": call.call_id, "output": result})
    if door.opened():
        door.finish("", texts[1] if len(texts) > 1 else "")
    else:
        door.finish(texts[0] if texts else "", "")


if __name__ == "__main__":
    try:
        main()
    except Exception as e:  # the controller records the exit status and this line
        print(f"letters responses agent: {e}", file=sys.stderr)
        sys.exit(1)
