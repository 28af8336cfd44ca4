#!/usr/bin/env node
// Writes the warm starts of the tool-calling agents (deterministic: the same files on
// every machine with the same framework versions):
//   sft-langchain.jsonl    for langchain.js
//   sft-agents-sdk.jsonl   for agents-sdk.js
//   sft-openai-py.jsonl    for openai_agent.py and responses_agent.py (the proxy translates
//                          the Responses API's tool and instructions into the same chat
//                          tool and system message, key order included)
//   sft-anthropic-py.jsonl for anthropic_agent.py
// (the Python agents run on scripts/setup.sh's virtual environment)
//   node examples/letters/make_tool_sft.js [--n 4000] [--out DIR]
//
// Each line is a conversation for `arclight model sft` with the agent's own system message
// and "tools" exactly as its framework sends them: both are captured by running the agent
// once against a stand-in server (capture.js), so the warm start renders the system prompt
// (the template's <tools> block) the agent's calls will have. They teach two skills on
// conversations that are not the task's, and the shape of the first call on the task's
// own first prompt, as sft.jsonl does for agent.js:
//   - the tool call itself: a user message that is not the task's ("Letters: q q q. Try
//     them." or "Try a key.") answered by an open_door call whose key repeats the shown
//     letter, or a random one (four letters); the letters are the rooms' and k, each as
//     likely, so the key is one letter among seven, never singled out (RL has to find it);
//   - the task's first prompt ("The jade door is shut. Open it.") answered by an open_door
//     call, once with each of the seven letters for each door: the warm-started model's
//     first call is then a tool call with about as likely any of them as its key, which
//     gives RL something to find k in, and nothing here says which letter it is;
//   - repeating a letter a tool's result shows ("Letters: b b b. Repeat them." after such a
//     call: "bbbb"), in text, as the second call must (the door's own words are left to
//     RL).
'use strict';
const fs = require('fs');
const path = require('path');
const { capture } = require('./capture');
const { TOOL_NAME } = require('./tool_agent');
const { firstPrompt } = require('./task');

function arg(name, dflt) {
  const i = process.argv.indexOf(name);
  return i >= 0 ? process.argv[i + 1] : dflt;
}
// Many conversations, each seen about twice in the warm start's 500 steps of 16. From the
// 512 that --n 400 wrote (160 steps, then 480: 5 and 15 passes) the tiny model learned
// each by heart rather than learning to copy: it wrote one letter whatever the tool's result
// showed (10 of 40 of its own conversations right, 10 of 40 with the shown letter swapped),
// and RL never taught the second call to copy either (the Agents SDK agent stayed at 0.5,
// the key's half). From 4,112 (--n 4000) it copies: 36 of 40, 40 of 40 swapped, and five of
// the six rooms' letters in the door's own words, which it never saw.
const count = Number(arg('--n', '4000'));
const out = arg('--out', __dirname);
const LETTERS = 'bjqvxzk'.split(''); // the rooms' letters (make_tasks.js) and the key
// Keys and answers are always four letters: a length the tiny model can stop at. With a
// length drawn at random it learns no place to stop, and greedy decoding (the held-out
// evaluation's) then repeats the letter until max_tokens, never closing the tool call's
// JSON, which serve then cannot parse.
const KEY_LENGTH = 4;

function rng(seed) { // xorshift32, as make_tasks.js
  let state = seed >>> 0;
  return () => {
    state ^= state << 13; state >>>= 0;
    state ^= state >>> 17;
    state ^= state << 5; state >>>= 0;
    return state / 4294967296;
  };
}

let callId = 0;
function toolCall(key) {
  return { role: 'assistant', content: null, tool_calls: [{ id: `call_${callId++}`, type: 'function',
    function: { name: TOOL_NAME, arguments: JSON.stringify({ key }) } }] };
}

const DOORS = ['red', 'blue', 'green', 'gold', 'iron', 'oak', 'glass', 'stone', 'black', 'white',
  'silver', 'copper', 'amber', 'ivory', 'jade', 'coral']; // make_tasks.js's

function conversations(system, tools, rand) {
  const pick = (a) => a[Math.floor(rand() * a.length)];
  const shown = (l, n) => Array(n).fill(l).join(' ');
  const lines = [];
  const results = [(r, n) => `Letters: ${shown(r, n)}. Repeat them.`,
    (r, n) => `It shows: ${shown(r, n)}. Write it.`, (r, n) => `Shown: ${shown(r, n)}. Write what is shown.`];
  for (let i = 0; i < count; i++) {
    const l = pick(LETTERS), u = rand();
    // the first turn: letters shown, none, or the task's first prompt (any door)
    const user = { role: 'user', content: u < 1 / 3 ? `Letters: ${shown(l, 2 + Math.floor(rand() * 3))}. Try them.`
      : u < 2 / 3 ? 'Try a key.' : firstPrompt({ door: pick(DOORS) }) };
    const call = toolCall(l.repeat(KEY_LENGTH));
    if (i % 3 === 0) {
      lines.push({ tools, messages: [system, user, call] });
    } else {
      // the tool's result shows another letter (drawn apart from the key's): that one is
      // the answer
      const r = pick(LETTERS);
      lines.push({ tools, messages: [system, user, call,
        { role: 'tool', tool_call_id: call.tool_calls[0].id, content: pick(results)(r, 2 + Math.floor(rand() * 3)) },
        { role: 'assistant', content: r.repeat(KEY_LENGTH) }] });
    }
  }
  // the task's first prompt, once with each letter as the key for each door
  for (const door of DOORS)
    for (const l of LETTERS)
      lines.push({ tools, messages: [system, { role: 'user', content: firstPrompt({ door }) },
        toolCall(l.repeat(KEY_LENGTH))] });
  for (let i = lines.length - 1; i > 0; i--) {
    const j = Math.floor(rand() * (i + 1));
    [lines[i], lines[j]] = [lines[j], lines[i]];
  }
  return lines;
}

// An Anthropic Messages request as the model server sees it after the proxy's translation
// (lib/api/messages.c): the system prompt as the first system message, each tool as a chat
// function tool {name, parameters, description} in that key order (the order the chat
// template renders).
function messagesAsChat(request) {
  const tools = (request.tools || []).map((t) => ({ type: 'function',
    function: { name: t.name, parameters: t.input_schema, description: t.description } }));
  return { tools, messages: [{ role: 'system', content: request.system }, ...request.messages] };
}

async function main() {
  const agents = [['langchain.js', 'sft-langchain.jsonl', 0x5eed1a], ['agents-sdk.js', 'sft-agents-sdk.jsonl', 0x5eed5d],
    ['openai_agent.py', 'sft-openai-py.jsonl', 0x5eed0a], ['anthropic_agent.py', 'sft-anthropic-py.jsonl', 0x5eeda7, messagesAsChat]];
  for (const [agent, file, seed, asChat] of agents) {
    const { requests } = await capture(agent);
    const first = asChat ? asChat(requests[0]) : requests[0];
    if (!Array.isArray(first.tools) || !first.tools.length) throw new Error(`${agent} sent no tools`);
    const system = first.messages.find((m) => m.role === 'system');
    if (!system) throw new Error(`${agent} sent no system message`);
    callId = 0;
    const lines = conversations(system, first.tools, rng(seed));
    fs.writeFileSync(path.join(out, file), lines.map((x) => JSON.stringify(x)).join('\n') + '\n');
    console.log(`letters: ${lines.length} warm-start conversations for ${agent} in ${path.join(out, file)}`);
  }
}

main().catch((e) => {
  console.error(`make_tool_sft: ${e.message || e}`);
  process.exit(1);
});
