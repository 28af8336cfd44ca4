#!/usr/bin/env node
// The demo agent of `arclight up`: a plain program on the official `openai` npm client that
// knows nothing about arclight but its base URL (OPENAI_BASE_URL, the capture proxy) and the
// proxy's reward/end endpoints. Its task: "answer with as many letters a as you can". The
// reward it computes itself is the share of the answer's visible characters that are 'a'
// (0 for an empty answer), so a random tiny model starts near 0 and the loop can push it up.
//
// Each round runs STEP_GROUPS tasks of GROUP_SIZE rollouts (one trainer step's worth), posts
// every rollout's reward and end, prints the round's mean reward with the policy version that
// answered, then waits (polling GET /v1/models) until the server has a newer policy before the
// next round: on-policy rounds, so the printed means follow the policy versions.
//
//   OPENAI_BASE_URL=http://127.0.0.1:8080/v1 node examples/demo-agent/agent.js [--rounds N]
//   env: ARCLIGHT_GROUP_SIZE (8), ARCLIGHT_STEP_GROUPS (4), ARCLIGHT_MAX_TOKENS (12),
//        ARCLIGHT_MODEL (default: the first model the server lists)
'use strict';
const path = require('path');

function loadOpenAI() {
  try {
    return require('openai');
  } catch (e) {
    // In the arclight tree the client is installed for the tests (scripts/setup.sh).
    return require(path.join(__dirname, '..', '..', 'tests', 'node', 'node_modules', 'openai'));
  }
}
const OpenAI = loadOpenAI();

function intOpt(name, env, dflt) {
  const i = process.argv.indexOf(name);
  const raw = i >= 0 ? process.argv[i + 1] : process.env[env];
  if (raw === undefined || raw === '') return dflt;
  const v = Number(raw);
  if (!Number.isInteger(v) || v < 1) {
    console.error(`demo-agent: ${name} wants a positive integer, got '${raw}'`);
    process.exit(2);
  }
  return v;
}

const baseURL = process.env.OPENAI_BASE_URL;
if (!baseURL) {
  console.error('demo-agent: set OPENAI_BASE_URL to the proxy, e.g. http://127.0.0.1:8080/v1');
  process.exit(2);
}
const groupSize = intOpt('--group-size', 'ARCLIGHT_GROUP_SIZE', 8);
const stepGroups = intOpt('--step-groups', 'ARCLIGHT_STEP_GROUPS', 4);
const maxTokens = intOpt('--max-tokens', 'ARCLIGHT_MAX_TOKENS', 12);
const rounds = intOpt('--rounds', 'ARCLIGHT_ROUNDS', Infinity);
const waitSeconds = intOpt('--wait', 'ARCLIGHT_POLICY_WAIT', 10);
const client = new OpenAI({ baseURL, apiKey: process.env.OPENAI_API_KEY || 'none', maxRetries: 3 });
const runId = Date.now().toString(36);
const PROMPT = 'Write the letter a as many times as you can, and nothing else.';

// The share of visible characters that are 'a' or 'A'.
function reward(text) {
  const visible = text.replace(/\s/g, '');
  if (!visible.length) return 0;
  return (visible.match(/[aA]/g) || []).length / visible.length;
}

async function post(url, headers, body) {
  const r = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify(body),
  });
  if (!r.ok) throw new Error(`POST ${url}: ${r.status} ${await r.text()}`);
}

// One rollout: one chat call, then its reward and its end on the proxy. A call that fails
// (after the client's retries) ends the rollout as failed; credit leaves it out of its group.
async function rollout(model, task, id) {
  const headers = { 'X-Arclight-Task': task, 'X-Arclight-Rollout': id };
  try {
    return await scoredCall(model, headers);
  } catch (e) {
    console.error(`demo-agent: rollout ${id} failed: ${e.message || e}`);
    await post(`${baseURL}/end`, headers, { status: 'failed', group_size: groupSize,
      reason: String(e.message || e).slice(0, 200) }).catch(() => {});
    return null;
  }
}

async function scoredCall(model, headers) {
  const { data, response } = await client.chat.completions
    .create({ model, messages: [{ role: 'user', content: PROMPT }], max_tokens: maxTokens,
      temperature: 1.0 }, { headers })
    .withResponse();
  const text = data.choices[0].message.content || '';
  const version = Number(data.policy_version ?? response.headers.get('x-arclight-policy-version') ?? 0);
  const r = reward(text);
  await post(`${baseURL}/reward`, headers, { value: r });
  await post(`${baseURL}/end`, headers, { status: 'succeeded', group_size: groupSize });
  return { text, version, reward: r };
}

async function serverVersion() {
  const list = await client.models.list();
  const m = list.data[0] || {};
  return { id: m.id, version: Number(m.policy_version ?? 0) };
}

const sleep = (ms) => new Promise((res) => setTimeout(res, ms));

async function main() {
  let { id: model, version } = await serverVersion();
  model = process.env.ARCLIGHT_MODEL || model;
  console.log(`demo-agent: model ${model}, ${stepGroups} tasks x ${groupSize} rollouts per round, ` +
    `max_tokens ${maxTokens}; reward = share of 'a' in the answer`);
  for (let round = 0; round < rounds; round++) {
    const jobs = [];
    for (let g = 0; g < stepGroups; g++) {
      const task = `a-${runId}-${round}-${g}`;
      for (let i = 0; i < groupSize; i++) jobs.push(rollout(model, task, `${task}-${i}`));
    }
    const done = (await Promise.all(jobs)).filter((d) => d);
    if (!done.length) throw new Error(`every rollout of round ${round} failed`);
    const mean = done.reduce((s, d) => s + d.reward, 0) / done.length;
    const versions = [...new Set(done.map((d) => d.version))].sort((a, b) => a - b);
    const best = done.reduce((b, d) => (d.reward > b.reward ? d : b), done[0]);
    console.log(`demo-agent: policy v${versions.join(',v')}: mean reward ${mean.toFixed(3)} over ` +
      `${done.length} rollouts (best: ${JSON.stringify(best.text.slice(0, 40))})`);
    // On-policy: the next round waits for the policy this round trains.
    const seen = Math.max(version, ...versions);
    const deadline = Date.now() + waitSeconds * 1000;
    while (Date.now() < deadline) {
      version = (await serverVersion()).version;
      if (version > seen) break;
      await sleep(200);
    }
  }
}

process.on('SIGTERM', () => process.exit(0));
main().catch((e) => {
  console.error(`demo-agent: ${e.stack || e}`);
  process.exit(1);
});
