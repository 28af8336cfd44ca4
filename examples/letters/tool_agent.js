// What the two framework agents of the letters demo (langchain.js, agents-sdk.js) share
// besides task.js: the door as a tool, how the rollout's reward is split between its calls,
// and how long an answer may be. Nothing here is framework code: each agent builds its own
// tool and agent the way that framework's users do, from these few facts.
//
// The door is a function tool, open_door({key}), whose result is doorAnswer(task, key):
// call 1 should be a tool call (the key attempt is its argument), the framework runs the
// tool and sends its result back, and call 2 is the final text answer. If call 1 answers in
// plain text instead, the framework ends the run after that one call: the text is the
// attempt, and the room part of the reward is 0 (there was no second call to write it).
'use strict';
const { KEY, share, doorAnswer } = require('./task');

const TOOL_NAME = 'open_door';
const TOOL_DESCRIPTION = 'Try a key on the shut door. Says what the door does.';
const KEY_DESCRIPTION = 'The key to try.';

// max_tokens. The frameworks take one max_tokens for both calls, and a tool call spends
// tokens around its key that a text answer does not: in the tiny tokenizer
// (tests/tokenizer/tiny) `<tool_call>\n{"name": "open_door", "arguments": {"key": "` is 29
// tokens, `"}}\n</tool_call>` 5 and the end of turn 1. So the tool agents ask for
// ARCLIGHT_MAX_TOKENS (what agent.js gives each answer: 12 under `arclight up`) plus those
// 35: the key may be as long as agent.js's first answer, and the second call's text answer
// may run longer than agent.js's, which only costs time (it stops at <|im_end|>; its reward
// is a share, not a count).
const TOOL_CALL_TOKENS = 35;

function maxTokens() {
  const n = Number(process.env.ARCLIGHT_MAX_TOKENS || 12);
  if (!Number.isInteger(n) || n < 1) throw new Error(`ARCLIGHT_MAX_TOKENS must be a positive integer, got '${process.env.ARCLIGHT_MAX_TOKENS}'`);
  return n + TOOL_CALL_TOKENS;
}

// Posts one part of the reward to the rollout's reward endpoint (ARCLIGHT_REWARD_URL,
// which `arclight rollouts` sets). Named parts: "key" (half the attempt's share of the key
// letter) right after call 1, "room" (half the answer's share of the room's letter) after
// call 2; their sum is the task's reward (task.js), and `arclight credit --credit
// discounted` gives call 1 both parts and call 2 its own.
async function postReward(value, name) {
  const url = process.env.ARCLIGHT_REWARD_URL;
  if (!url) throw new Error('ARCLIGHT_REWARD_URL is not set: run this agent with `arclight rollouts`');
  const r = await fetch(url, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ value, name }),
  });
  if (!r.ok) throw new Error(`reward ${name}: HTTP ${r.status} ${await r.text()}`);
}

// The door's side of a rollout: the tool's body and the two reward posts. Only the first
// use of the tool counts (a model that calls it again in its second call, or twice in its
// first, gets the first attempt's answer each time and is scored on the first attempt).
// finalOnly (an agent's --final-reward): one post of the task's reward after the run,
// named "reward", instead of the two parts.
function door(task, finalOnly = false) {
  const state = { attempt: null };
  return {
    // open_door's body: scores the attempt (posted before the result goes back, so the
    // proxy files it after call 1) and answers as the door does.
    async open(key) {
      const attempt = String(key ?? '');
      if (state.attempt === null) {
        state.attempt = attempt;
        if (!finalOnly) await postReward(share(attempt, KEY) / 2, 'key');
      }
      return doorAnswer(task, state.attempt);
    },
    opened() {
      return state.attempt !== null;
    },
    // After the run: `firstText` is call 1's text (used as the attempt when the tool was
    // never called), `answer` the text of call 2 ('' when there was none, or when it was a
    // tool call again). Posts what is left and returns the parts.
    async finish(firstText, answer) {
      if (state.attempt === null) {
        state.attempt = String(firstText || '');
        if (!finalOnly) await postReward(share(state.attempt, KEY) / 2, 'key');
        answer = ''; // no door answer came back: nothing to write the room from
      }
      const key = share(state.attempt, KEY), room = share(answer, task.room);
      if (finalOnly) await postReward((key + room) / 2, 'reward');
      else await postReward(room / 2, 'room');
      return { key, room, total: (key + room) / 2 };
    },
  };
}

module.exports = { TOOL_NAME, TOOL_DESCRIPTION, KEY_DESCRIPTION, TOOL_CALL_TOKENS, maxTokens, postReward, door };
