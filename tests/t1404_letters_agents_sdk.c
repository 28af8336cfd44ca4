/*
 * t1404: the letters demo's OpenAI Agents SDK agent (examples/letters/agents-sdk.js: an Agent
 * on OpenAIChatCompletionsModel with an open_door tool defined with zod) completes rollouts through
 * `arclight rollouts`, `arclight proxy` and `arclight serve`, unchanged. The tiny model is
 * warm-started on examples/letters/sft-agents-sdk.jsonl first (as `arclight up --warm-start`
 * does; the fixture tests/serve/letters-agents-sdk unless the data changed), so that it writes
 * <tool_call> blocks, which serve parses into tool_calls and the SDK runs: most
 * first calls are open_door calls, answered by the door, whose second call saw the door's
 * answer; every rollout is scored as the agent documents; every call asked with the tools
 * the warm start was made with.
 */
#define _GNU_SOURCE /* memmem */
#include "testlib.h"
#include "broker_fixture.h"
#include "t1099_proxy_helpers.h"
#include "t1199_serve_helpers.h"
#include "t1420_letters_helpers.h"

TEST(the_agents_sdk_agent_calls_the_door_through_the_proxy_and_serve)
{
    /* sampled at temperature 1, the warm-started tiny model (500 steps on 4,112
     * conversations) wrote a call serve can parse in 24 first calls of 25 in one run
     * (1 of 3 after the earlier 160 steps on 512): fewer than 13 of 25, about half, would
     * be a broken warm start, template or parser */
    lt_tool_agent_test("t1404", "agents-sdk.js", "examples/letters/sft-agents-sdk.jsonl",
                       "tests/serve/letters-agents-sdk", 12, 13);
}
