// The letters task, shared by the demo agents in examples/letters. A task is {"door": "red",
// "room": "q"}: a shut door, and behind it a room with a letter. The first call must find the
// door's key, which no prompt shows (every door opens with the letter k: RL has to find it).
// The door reads the first answer and, for each k in it (at most four), shows the room's
// letter once; with no k it stays shut and shows nothing. The second call must write the
// letter the door showed. The reward is the mean of the first answer's share of k and the
// second answer's share of the room's letter (over visible characters): it depends on both
// calls, and the second can only score once the first has opened the door.
'use strict';

const KEY = 'k';
const SYSTEM = 'You open doors.';

// No k anywhere in what the agent is told: the key must be found, not copied.
function firstPrompt(task) {
  return `The ${task.door} door is shut. Open it.`;
}

// The share of the visible (non-space) characters of text that are the letter l.
function share(text, l) {
  const visible = [...String(text || '')].filter((ch) => !/\s/.test(ch));
  if (!visible.length) return 0;
  return visible.filter((ch) => ch.toLowerCase() === l).length / visible.length;
}

// What the door says to an attempt.
function doorAnswer(task, attempt) {
  const n = Math.min(4, [...String(attempt || '')].filter((ch) => ch.toLowerCase() === KEY).length);
  if (!n) return 'The door stays shut. Write the room.';
  return `The door opens. Room: ${Array(n).fill(task.room).join(' ')}. Write the room.`;
}

function reward(task, attempt, answer) {
  const key = share(attempt, KEY), room = share(answer, task.room);
  return { key, room, total: (key + room) / 2 };
}

// The task record the controller gives the agent: ARCLIGHT_TASK (also on stdin).
function readTask() {
  const raw = process.env.ARCLIGHT_TASK;
  if (!raw) throw new Error('ARCLIGHT_TASK is not set: run this agent with `arclight rollouts`');
  const input = JSON.parse(raw).input || {};
  for (const f of ['door', 'room'])
    if (typeof input[f] !== 'string' || !input[f]) throw new Error(`the task's input has no ${f}`);
  return input;
}

module.exports = { KEY, SYSTEM, firstPrompt, doorAnswer, reward, share, readTask };
