// An agent written against the official `openai` npm client, unchanged but for its base
// URL: OPENAI_BASE_URL=http://PROXY/r/{task}/{rollout}/v1. It makes a plain chat call, a
// streamed one, and a tool-calling round (tool call, tool result, final answer; the tool
// call once streamed), then prints what it saw as one JSON line for the test to check.
const path = require('path');
const OpenAI = require(path.join(__dirname, '..', 'node', 'node_modules', 'openai'));

async function main() {
  const client = new OpenAI({ apiKey: process.env.OPENAI_API_KEY || 'sk-none', maxRetries: 0 });
  const out = {};
  const model = 'fake-model';

  const chat = await client.chat.completions.create({
    model, messages: [{ role: 'user', content: 'What is 2+2?' }],
  });
  out.chat = chat.choices[0].message.content;
  out.chat_keys = Object.keys(chat.choices[0]).sort();
  out.usage = chat.usage.completion_tokens;

  const stream = await client.chat.completions.create({
    model, stream: true, messages: [{ role: 'user', content: 'Count' }],
  });
  let text = '';
  let chunks = 0;
  for await (const c of stream) {
    chunks++;
    if (c.choices.length && c.choices[0].delta.content) text += c.choices[0].delta.content;
  }
  out.stream = text;
  out.stream_chunks = chunks;

  const tools = [{
    type: 'function',
    function: {
      name: 'get_weather', description: 'Weather of a city',
      parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
    },
  }];
  const messages = [{ role: 'user', content: 'Weather in Paris?' }];
  const t = await client.chat.completions.create({ model, tools, messages });
  const call = t.choices[0].message.tool_calls[0];
  out.tool = { name: call.function.name, args: JSON.parse(call.function.arguments) };
  messages.push(t.choices[0].message);
  messages.push({ role: 'tool', tool_call_id: call.id, content: '{"temp_c": 21}' });
  const fin = await client.chat.completions.create({ model, tools, messages });
  out.final = fin.choices[0].message.content;

  const ts = await client.chat.completions.create({
    model, tools, stream: true, messages: [{ role: 'user', content: 'Weather again?' }],
  });
  let args = '';
  let name = '';
  for await (const c of ts) {
    const d = c.choices.length ? c.choices[0].delta : null;
    if (d && d.tool_calls) {
      for (const tc of d.tool_calls) {
        if (tc.function && tc.function.name) name += tc.function.name;
        if (tc.function && tc.function.arguments) args += tc.function.arguments;
      }
    }
  }
  out.stream_tool = { name, args: JSON.parse(args) };
  console.log(JSON.stringify(out));
}

main().catch((e) => {
  console.error('agent failed:', e && e.message ? e.message : e);
  process.exit(1);
});
