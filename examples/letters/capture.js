#!/usr/bin/env node
// Captures what an agent of this folder really sends: runs it once against a local
// stand-in for the model server (an HTTP server on a free loopback port that answers the
// first chat call with an open_door tool call and later ones with a short text, and takes
// the reward posts), and returns every request body the agent made, as the framework wrote
// it. A Python agent (NAME.py) runs on the virtual environment's python
// ($ARCLIGHT_VENV/bin/python, default ~/.cache/arclight/venv, made by scripts/setup.sh);
// an agent on the Anthropic Messages API gets the same two answers in that API's shape. make_tool_sft.js takes each tool agent's "tools" from here, so that the warm start
// renders the same system prompt the agent's calls will have.
//   node examples/letters/capture.js langchain.js    # prints the requests and reward posts
'use strict';
const http = require('http');
const os = require('os');
const path = require('path');
const { spawn } = require('child_process');

function answer(body, n) {
  const hasTool = (body.messages || []).some((m) => m.role === 'tool');
  const message = hasTool
    ? { role: 'assistant', content: 'q' }
    : { role: 'assistant', content: null, tool_calls: [{ id: 'call_0', type: 'function',
      function: { name: 'open_door', arguments: '{"key": "b"}' } }] };
  return { id: `chatcmpl-capture-${n}`, object: 'chat.completion', created: 0, model: body.model,
    choices: [{ index: 0, message, finish_reason: hasTool ? 'stop' : 'tool_calls', logprobs: null }],
    usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 } };
}

// The same two answers as an Anthropic Message (POST /v1/messages).
function answerMessage(body, n) {
  const hasTool = (body.messages || []).some((m) => Array.isArray(m.content) &&
    m.content.some((b) => b.type === 'tool_result'));
  const content = hasTool ? [{ type: 'text', text: 'q' }]
    : [{ type: 'tool_use', id: 'toolu_0', name: 'open_door', input: { key: 'b' } }];
  return { id: `msg_capture_${n}`, type: 'message', role: 'assistant', model: body.model, content,
    stop_reason: hasTool ? 'end_turn' : 'tool_use', stop_sequence: null,
    usage: { input_tokens: 1, output_tokens: 1 } };
}

// The command that runs an agent file of this folder: node, or the venv's python.
function command(agent) {
  const file = path.join(__dirname, agent);
  if (!agent.endsWith('.py')) return [process.execPath, [file]];
  const venv = process.env.ARCLIGHT_VENV || path.join(os.homedir(), '.cache', 'arclight', 'venv');
  return [path.join(venv, 'bin', 'python'), [file]];
}

// Runs `node AGENT` (or a Python AGENT) (a file of this folder) on one task; resolves to {requests, rewards}.
function capture(agent, task = { door: 'red', room: 'q' }) {
  return new Promise((resolve, reject) => {
    const requests = [], rewards = [];
    const server = http.createServer((req, res) => {
      let data = '';
      req.on('data', (c) => { data += c; });
      req.on('end', () => {
        let body;
        try {
          body = JSON.parse(data || '{}');
        } catch (e) {
          res.writeHead(400).end();
          return;
        }
        let out;
        if (req.url.endsWith('/chat/completions')) {
          requests.push(body);
          out = answer(body, requests.length);
        } else if (req.url.endsWith('/v1/messages')) {
          requests.push(body);
          out = answerMessage(body, requests.length);
        } else if (req.url.endsWith('/reward')) {
          rewards.push(body);
          out = { ok: true };
        } else {
          res.writeHead(404, { 'content-type': 'application/json' }).end('{"error":"not here"}');
          return;
        }
        res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(out));
      });
    });
    server.listen(0, '127.0.0.1', () => {
      const base = `http://127.0.0.1:${server.address().port}`;
      const env = { ...process.env, OPENAI_BASE_URL: `${base}/v1`, OPENAI_API_KEY: 'capture',
        ANTHROPIC_BASE_URL: base, ANTHROPIC_API_KEY: 'capture',
        ARCLIGHT_REWARD_URL: `${base}/reward`, ARCLIGHT_MODEL: 'tiny', ARCLIGHT_MAX_TOKENS: '12',
        ARCLIGHT_TASK: JSON.stringify({ id: 'capture', input: task }) };
      const [program, args] = command(agent);
      const child = spawn(program, args, { env, stdio: ['ignore', 'ignore', 'pipe'] });
      let err = '';
      child.stderr.on('data', (c) => { err += c; });
      child.on('error', (e) => {
        server.close();
        reject(new Error(`${program} could not run ${agent}: ${e.message} (for a Python agent: bash scripts/setup.sh)`));
      });
      child.on('exit', (code) => {
        server.close();
        if (code !== 0) reject(new Error(`${agent} exited ${code}: ${err.trim()}`));
        else if (!requests.length) reject(new Error(`${agent} made no chat call`));
        else resolve({ requests, rewards });
      });
    });
  });
}

module.exports = { capture };

if (require.main === module) {
  capture(process.argv[2] || 'langchain.js').then((r) => console.log(JSON.stringify(r, null, 2)),
    (e) => { console.error(`capture: ${e.message}`); process.exit(1); });
}
