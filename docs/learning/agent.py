#!/usr/bin/env python3
"""The letters agent of examples/letters/agent.js, in Python's standard library only: what the
seed runs of docs/LEARNING.md ran (node's start-up costs a third of a CPU-second a rollout, which
the 2-core machine felt). Run by `arclight rollouts`, it reads its task from ARCLIGHT_TASK, makes
the two calls through OPENAI_BASE_URL and posts each call's half of the reward to
ARCLIGHT_REWARD_URL right after that call:

  arclight up --agent '/usr/bin/python3 docs/learning/agent.py' \\
      --tasks examples/letters/tasks.jsonl --warm-start examples/letters/sft.jsonl --steps 40
"""
import json
import os
import urllib.request

KEY = 'k'
task = json.loads(os.environ['ARCLIGHT_TASK'])['input']
base = os.environ['OPENAI_BASE_URL']
model = os.environ.get('ARCLIGHT_MODEL', 'tiny')
max_tokens = int(os.environ.get('ARCLIGHT_MAX_TOKENS', '8'))


def post_json(url, body, timeout):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={'content-type': 'application/json',
                                          'authorization': 'Bearer unused'})
    return json.loads(urllib.request.urlopen(req, timeout=timeout).read() or b'null')


def chat(messages):
    answer = post_json(base + '/chat/completions',
                       {'model': model, 'messages': messages, 'max_tokens': max_tokens}, 60)
    return answer['choices'][0]['message']['content'] or ''


def share(text, letter):
    visible = [c for c in text if not c.isspace()]
    return sum(c.lower() == letter for c in visible) / len(visible) if visible else 0.0


messages = [{'role': 'system', 'content': 'You open doors.'},
            {'role': 'user', 'content': f"The {task['door']} door is shut. Open it."}]
attempt = chat(messages)
post_json(os.environ['ARCLIGHT_REWARD_URL'], {'value': share(attempt, KEY) / 2, 'name': 'key'}, 30)

keys = min(4, sum(c.lower() == KEY for c in attempt))
door = (f"The door opens. Room: {' '.join([task['room']] * keys)}. Write the room." if keys
        else 'The door stays shut. Write the room.')
messages += [{'role': 'assistant', 'content': attempt}, {'role': 'user', 'content': door}]
answer = chat(messages)
post_json(os.environ['ARCLIGHT_REWARD_URL'], {'value': share(answer, task['room']) / 2,
                                             'name': 'room'}, 30)
