#!/usr/bin/env node
// Writes the letters demo's data (deterministic: the same files on every machine):
//   tasks.jsonl  one task per (door, room): {"id", "input": {door, room}, "split"}; a
//                quarter of them, chosen by a seeded shuffle, are "val" (held out: never
//                trained on, evaluated as training goes)
//   sft.jsonl    the warm start (`arclight model sft`; see below)
//   node examples/letters/make_tasks.js [--rooms bjqvxz] [--doors 16] [--out DIR]
'use strict';
const fs = require('fs');
const path = require('path');
const { SYSTEM, firstPrompt } = require('./task');

function arg(name, dflt) {
  const i = process.argv.indexOf(name);
  return i >= 0 ? process.argv[i + 1] : dflt;
}
const rooms = arg('--rooms', 'bjqvxz').split('');
const doors = ['red', 'blue', 'green', 'gold', 'iron', 'oak', 'glass', 'stone', 'black', 'white',
  'silver', 'copper', 'amber', 'ivory', 'jade', 'coral'].slice(0, Number(arg('--doors', '16')));
const out = arg('--out', __dirname);

let state = 0x2545f491;
function rand() { // xorshift32: the same sequence everywhere
  state ^= state << 13; state >>>= 0;
  state ^= state >>> 17;
  state ^= state << 5; state >>>= 0;
  return state / 4294967296;
}
const pick = (a) => a[Math.floor(rand() * a.length)];

const tasks = [];
for (const door of doors) for (const room of rooms) tasks.push({ door, room });
for (let i = tasks.length - 1; i > 0; i--) {
  const j = Math.floor(rand() * (i + 1));
  [tasks[i], tasks[j]] = [tasks[j], tasks[i]];
}
const nval = Math.round(tasks.length / 4);
const lines = tasks.map((t, i) => JSON.stringify({ id: `${t.door}-${t.room}`, input: t,
  split: i < nval ? 'val' : 'train' }));
fs.writeFileSync(path.join(out, 'tasks.jsonl'), lines.join('\n') + '\n');

// The warm start teaches the shape of an answer and one skill the task needs, and leaves
// the task to RL:
// - repeating the letter a message shows ("Letters: q q q. Repeat them." -> "qqqq"), in one
//   turn, on conversations that are not the task's;
// - answering the task's first prompt ("The jade door is shut. Open it.") with a letter,
//   each of the seven equally often (the same prompt once with each, so that the warm-started
//   model's first answer is about as likely to be any of them): RL then has something to
//   find the key in, and nothing here says which letter it is. Without these the model
//   mostly answered the first prompt with nothing at all, or always with the same letter.
// What the two calls must write (k, then the letter the door shows, in a conversation of two
// turns) is not in it.
const letters = rooms.concat(['k']);
const sft = [];
for (let i = 0; i < 400; i++) {
  const l = pick(letters);
  const n = 2 + Math.floor(rand() * 4);
  sft.push({ messages: [{ role: 'system', content: 'You repeat letters.' },
    { role: 'user', content: `Letters: ${Array(n).fill(l).join(' ')}. Repeat them.` },
    { role: 'assistant', content: l.repeat(3 + Math.floor(rand() * 4)) }] });
}
for (const door of doors)
  for (const l of letters)
    sft.push({ messages: [{ role: 'system', content: SYSTEM },
      { role: 'user', content: firstPrompt({ door }) },
      { role: 'assistant', content: l.repeat(3 + Math.floor(rand() * 4)) }] });
for (let i = sft.length - 1; i > 0; i--) {
  const j = Math.floor(rand() * (i + 1));
  [sft[i], sft[j]] = [sft[j], sft[i]];
}
fs.writeFileSync(path.join(out, 'sft.jsonl'), sft.map((x) => JSON.stringify(x)).join('\n') + '\n');
console.log(`letters: ${tasks.length} tasks (${nval} val) and ${sft.length} warm-start conversations in ${out}`);
