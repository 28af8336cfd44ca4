/*
 * t1403: the letters demo's LangChain.js agent (examples/letters/langchain.js: createAgent
 * over ChatOpenAI with an open_door tool defined with zod) completes rollouts through
 * `arclight rollouts`, `arclight proxy` and `arclight serve`, unchanged. The tiny model is
 * warm-started on examples/letters/sft-langchain.jsonl first (as `arclight up --warm-start`
 * does; the fixture tests/serve/letters-langchain unless the data changed), so that it writes
 * <tool_call> blocks, which serve parses into tool_calls and LangChain runs: at least some
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

TEST(the_langchain_agent_calls_the_door_through_the_proxy_and_serve)
{
    /* sampled at temperature 1, the warm-started tiny model writes a call serve can parse
     * in about 2 first calls of 5 (8 of 20 on the task's first prompt), the rest broken
     * JSON: 17 rollouts make fewer than 2 such calls a chance of about 1 in 500 */
    lt_tool_agent_test("t1403", "langchain.js", "examples/letters/sft-langchain.jsonl",
                       "tests/serve/letters-langchain", 8, 2);
}
