// The official `openai` npm client against `arclight serve` (OPENAI_BASE_URL=http://HOST/v1):
// models, a chat call with logprobs (and the raw response's policy-version header), the same
// call streamed, a tool-calling round (tool call, tool result, final answer), a streamed tool
// call, a legacy completion with logprobs, and a 400. Prints what it saw as one JSON line
// for t1103 to check.
const path = require('path');
const OpenAI = require(path.join(__dirname, '..', 'node', 'node_modules', 'openai'));

async function main() {
  const client = new OpenAI({ apiKey: 'sk-none', maxRetries: 0 });
  const out = {};
  const models = await client.models.list();
  out.models = models.data.map((m) => m.id);
  const model = out.models[0];

  const base = {
    model, seed: 7, max_tokens: 12, logprobs: true, top_logprobs: 2,
    messages: [{ role: 'user', content: 'Say something.' }],
  };
  const { data: chat, response } = await client.chat.completions.create(base).withResponse();
  out.chat = chat.choices[0].message.content;
  out.chat_logprobs = chat.choices[0].logprobs.content.length;
  out.chat_top = chat.choices[0].logprobs.content[0].top_logprobs.length;
  out.usage = chat.usage.completion_tokens;
  out.header_version = response.headers.get('x-arclight-policy-version');
  out.json_version = chat.policy_version;

  const stream = await client.chat.completions.create({ ...base, stream: true });
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
  const t = await client.chat.completions.create({ model, tools, messages, temperature: 0 });
  out.tool_finish = t.choices[0].finish_reason;
  const call = t.choices[0].message.tool_calls[0];
  out.tool = { name: call.function.name, args: JSON.parse(call.function.arguments), id: call.id };
  messages.push(t.choices[0].message);
  messages.push({ role: 'tool', tool_call_id: call.id, content: '{"temp_c": 21}' });
  const fin = await client.chat.completions.create({ model, tools, messages, temperature: 0 });
  out.final = fin.choices[0].message.content;

  const ts = await client.chat.completions.create({
    model, tools, stream: true, temperature: 0, messages: [{ role: 'user', content: 'Weather again?' }],
  });
  let args = '';
  let name = '';
  let finish = null;
  for await (const c of ts) {
    const ch = c.choices.length ? c.choices[0] : null;
    if (ch && ch.delta.tool_calls) {
      for (const tc of ch.delta.tool_calls) {
        if (tc.function && tc.function.name) name += tc.function.name;
        if (tc.function && tc.function.arguments) args += tc.function.arguments;
      }
    }
    if (ch && ch.finish_reason) finish = ch.finish_reason;
  }
  out.stream_tool = { name, args: JSON.parse(args), finish };

  const comp = await client.completions.create({ model, prompt: 'Hello', max_tokens: 5, logprobs: 1, seed: 1 });
  out.completion_tokens = comp.choices[0].logprobs.tokens.length;

  try {
    await client.chat.completions.create({ ...base, temperature: 9 });
    out.bad = 'no error';
  } catch (e) {
    out.bad = { status: e.status, param: e.param || (e.error && e.error.param) };
  }
  console.log(JSON.stringify(out));
}

main().catch((e) => {
  console.error('client failed:', e && e.message ? e.message : e);
  process.exit(1);
});
