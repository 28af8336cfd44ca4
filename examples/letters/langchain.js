#!/usr/bin/env node
// The letters demo on LangChain.js, the way its users write a tool-calling agent: a
// ChatOpenAI model, a `tool` with a zod schema, and langchain's createAgent (a ReAct loop
// over the model and the tool). Unchanged but for its base URL, which comes from the
// environment (OPENAI_BASE_URL, set by `arclight rollouts`), like the model's name
// (ARCLIGHT_MODEL) and its answer length (ARCLIGHT_MAX_TOKENS, see tool_agent.js).
//
// Call 1 should call open_door with a key; the tool's answer (the door's) goes back, and
// call 2 writes the room. The run stops after two model calls (modelCallLimitMiddleware). A
// call 1 in plain text ends the run at once: that text is the attempt and the room scores 0.
// The reward goes to ARCLIGHT_REWARD_URL in two parts, "key" from inside the tool (after
// call 1) and "room" after the run (tool_agent.js); with --final-reward, once after the run
// (the task's reward, "reward"), as an agent that only knows the outcome does.
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
const { ChatOpenAI } = load('@langchain/openai');
const { createAgent, tool, modelCallLimitMiddleware, AIMessage } = load('langchain');
const { z } = load('zod');

async function main() {
  const task = readTask();
  const theDoor = door(task, process.argv.slice(2).includes('--final-reward'));
  const openDoor = tool(async ({ key }) => theDoor.open(key), {
    name: TOOL_NAME,
    description: TOOL_DESCRIPTION,
    schema: z.object({ key: z.string().describe(KEY_DESCRIPTION) }),
  });
  const model = new ChatOpenAI({
    model: process.env.ARCLIGHT_MODEL || 'tiny',
    maxTokens: maxTokens(),
    maxRetries: 3,
    configuration: { baseURL: process.env.OPENAI_BASE_URL }, // the only change
  });
  const agent = createAgent({
    model,
    tools: [openDoor],
    systemPrompt: SYSTEM,
    middleware: [modelCallLimitMiddleware({ runLimit: 2 })],
  });
  const result = await agent.invoke({ messages: [{ role: 'user', content: firstPrompt(task) }] });
  // The model's answers, in order (the limit's own closing message has no response data).
  const answers = result.messages.filter((m) => AIMessage.isInstance(m) && m.response_metadata &&
    Object.keys(m.response_metadata).length);
  const text = (m) => (m && !(m.tool_calls && m.tool_calls.length) ? m.text || '' : '');
  await theDoor.finish(text(answers[0]), theDoor.opened() ? text(answers[1]) : '');
}

main().catch((e) => {
  console.error(`letters langchain agent: ${e.message || e}`);
  process.exit(1);
});
