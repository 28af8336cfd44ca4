// An agent written with the OpenAI Agents SDK for JavaScript (@openai/agents): its default
// model class (the Responses API) and one function tool, unchanged but for its base URL
// (OPENAI_BASE_URL=http://PROXY/r/{task}/{rollout}/v1) and the model's name
// (ARCLIGHT_MODEL). It runs the agent once with whole answers and once streamed, and prints
// what it saw as one JSON line: the final outputs, the tool calls it ran, the model class.
const path = require('path');
const nm = path.join(__dirname, '..', 'node', 'node_modules');
const { Agent, run, tool, setTracingDisabled } = require(path.join(nm, '@openai', 'agents'));
const { z } = require(path.join(nm, 'zod'));

setTracingDisabled(true); // the SDK would export traces to OpenAI's servers otherwise

async function main() {
  const calls = [];
  const getWeather = tool({
    name: 'get_weather',
    description: 'The current weather in a city',
    parameters: z.object({ city: z.string() }),
    execute: async ({ city }) => {
      calls.push(city);
      return `It is sunny in ${city}.`;
    },
  });
  const maxTokens = Number(process.env.ARCLIGHT_MAX_TOKENS || 0);
  const agent = new Agent({
    name: 'Weather assistant',
    instructions: 'Answer questions about the weather. Use the tool.',
    tools: [getWeather],
    model: process.env.ARCLIGHT_MODEL || 'fake-model',
    modelSettings: maxTokens ? { maxTokens } : {},
  });
  const out = { calls };
  const whole = await run(agent, 'What is the weather in Paris?', { maxTurns: 4 });
  out.final = whole.finalOutput;
  out.items = whole.newItems.map((i) => i.type);
  const streamed = await run(agent, 'And in Oslo?', { stream: true, maxTurns: 4 });
  let deltas = '';
  for await (const ev of streamed) {
    if (ev.type === 'raw_model_stream_event' && ev.data.type === 'output_text_delta')
      deltas += ev.data.delta;
  }
  await streamed.completed;
  out.stream_final = streamed.finalOutput;
  out.stream_deltas = deltas;
  console.log(JSON.stringify(out));
}

main().catch((e) => {
  console.error(e && e.stack ? e.stack : e);
  process.exit(1);
});
