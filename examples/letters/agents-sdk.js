#!/usr/bin/env node
// The letters demo on the OpenAI Agents SDK for JavaScript (@openai/agents), the way its
// users write an agent for a server that speaks chat completions: an Agent with
// instructions and a function `tool` (zod parameters), on an OpenAIChatCompletionsModel
// over an `openai` client whose baseURL is OPENAI_BASE_URL (set by `arclight rollouts`),
// tracing off (there is no OpenAI platform to send traces to). Unchanged but for that base
// URL; the model's name is ARCLIGHT_MODEL and its answer length ARCLIGHT_MAX_TOKENS (see
// tool_agent.js).
//
// Call 1 should call open_door with a key; the SDK runs the tool, sends its answer back,
// and call 2 writes the room (maxTurns 2: a second tool call instead ends the run with
// MaxTurnsExceededError, and the room scores 0; so does a call to a tool that does not
// exist, which the SDK ends with ModelBehaviorError). A call 1 in plain text is the run's
// final output at once: that text is the attempt and the room scores 0. The reward goes to
// ARCLIGHT_REWARD_URL in two parts, "key" from inside the tool (after call 1) and "room"
// after the run (tool_agent.js).
'use strict';
const path = require('path');
const { SYSTEM, firstPrompt, readTask } = require('./task');
const { TOOL_NAME, TOOL_DESCRIPTION, KEY_DESCRIPTION, maxTokens, door } = require('./tool_agent');

function load(name) {
  try {
    return require(name);
  } catch (e) {
    return require(path.join(__dirname, '..', 'node_modules', name));
  }
}
const OpenAI = load('openai');
const { Agent, run, tool, OpenAIChatCompletionsModel, setTracingDisabled, MaxTurnsExceededError,
  ModelBehaviorError } = load('@openai/agents');
const { z } = load('zod');

async function main() {
  const task = readTask();
  const theDoor = door(task);
  setTracingDisabled(true);
  const client = new OpenAI({ baseURL: process.env.OPENAI_BASE_URL, maxRetries: 3 });
  const openDoor = tool({
    name: TOOL_NAME,
    description: TOOL_DESCRIPTION,
    parameters: z.object({ key: z.string().describe(KEY_DESCRIPTION) }),
    execute: async ({ key }) => theDoor.open(key),
  });
  const agent = new Agent({
    name: 'Door opener',
    instructions: SYSTEM,
    model: new OpenAIChatCompletionsModel(client, process.env.ARCLIGHT_MODEL || 'tiny'),
    modelSettings: { maxTokens: maxTokens() },
    tools: [openDoor],
  });
  let output = '';
  try {
    const result = await run(agent, firstPrompt(task), { maxTurns: 2 });
    output = typeof result.finalOutput === 'string' ? result.finalOutput : '';
  } catch (e) {
    // The model broke the protocol: a tool call again in call 2 (past maxTurns), or a call to
    // a tool the agent does not have. What it did before still counts; the rest scores 0.
    if (!(e instanceof MaxTurnsExceededError || e instanceof ModelBehaviorError)) throw e;
  }
  // With the tool used, the final output is call 2's answer; without, call 1's text.
  if (theDoor.opened()) await theDoor.finish('', output);
  else await theDoor.finish(output, '');
}

main().catch((e) => {
  console.error(`letters agents-sdk agent: ${e.message || e}`);
  process.exit(1);
});
