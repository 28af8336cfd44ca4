#!/usr/bin/env node
// The letters demo on the official `openai` npm client, the way its users write an agent:
// a chat call, a look at the environment, a second chat call. It knows nothing of arclight
// but what the controller puts in its environment (OPENAI_BASE_URL, ARCLIGHT_TASK,
// ARCLIGHT_REWARD_URL). It reports each call's part of the reward right after that call
// (half the first answer's share of the key, then half the second's share of the room's
// letter), so that credit can tell the two calls apart (`arclight credit --credit
// discounted`: the first call's return includes the room it opened); their sum is the
// task's reward.
//
// With --final-reward it posts the task's reward once, after call 2, as most agents can
// (the SQL query was right, the tests passed): credit then has to work out which call
// earned it (`arclight credit --credit step`, docs/LEARNING.md).
'use strict';
const path = require('path');
const { SYSTEM, firstPrompt, doorAnswer, reward, readTask } = require('./task');

function load(name) {
  try {
    return require(name);
  } catch (e) {
    return require(path.join(__dirname, '..', 'node_modules', name));
  }
}
const OpenAI = load('openai');

async function postReward(value, name) {
  const r = await fetch(process.env.ARCLIGHT_REWARD_URL, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ value, name }),
  });
  if (!r.ok) throw new Error(`reward ${name}: HTTP ${r.status} ${await r.text()}`);
}

const FINAL_ONLY = process.argv.slice(2).includes('--final-reward');

async function main() {
  const task = readTask();
  const client = new OpenAI({ maxRetries: 3 }); // OPENAI_BASE_URL and OPENAI_API_KEY from env
  const model = process.env.ARCLIGHT_MODEL || 'tiny';
  const maxTokens = Number(process.env.ARCLIGHT_MAX_TOKENS || 8);
  const messages = [{ role: 'system', content: SYSTEM }, { role: 'user', content: firstPrompt(task) }];
  const first = await client.chat.completions.create({ model, messages, max_tokens: maxTokens });
  const answer1 = first.choices[0].message.content || '';
  if (!FINAL_ONLY) await postReward(reward(task, answer1, '').key / 2, 'key');
  messages.push({ role: 'assistant', content: answer1 });
  messages.push({ role: 'user', content: doorAnswer(task, answer1) });
  const second = await client.chat.completions.create({ model, messages, max_tokens: maxTokens });
  const answer2 = second.choices[0].message.content || '';
  const r = reward(task, answer1, answer2);
  if (FINAL_ONLY) await postReward(r.total, 'reward');
  else await postReward(r.room / 2, 'room');
}

main().catch((e) => {
  console.error(`letters agent: ${e.message || e}`);
  process.exit(1);
});
