/*
 * t1405: the letters demo's agent on the official `openai` Python client
 * (examples/letters/openai_agent.py: chat completions, a function tool, its own tool loop)
 * completes rollouts through `arclight rollouts`, `arclight proxy` and `arclight serve`,
 * unchanged, on scripts/setup.sh's virtual environment (skipped, exit 77, without one).
 * The tiny model is warm-started on examples/letters/sft-openai-py.jsonl (the fixture
 * tests/serve/letters-openai-py unless the data changed), so that it writes <tool_call>
 * blocks that serve parses into tool_calls and the agent's loop runs: most first calls are
 * open_door calls whose second call saw the door's answer; every call a span with the served
 * token ids and logprobs; every rollout scored as the agent documents; every call asked
 * with the tools of the warm start.
 */
#define _GNU_SOURCE /* memmem */
#include "testlib.h"
#include "broker_fixture.h"
#include "t1099_proxy_helpers.h"
#include "t1199_serve_helpers.h"
#include "t1420_letters_helpers.h"
#include "venv.h"

TEST(the_openai_python_agent_calls_the_door_through_the_proxy_and_serve)
{
    char py[1024];
    al_test_venv_python(py, sizeof py, "openai");
    /* the warm start teaches a tool call as the first answer (about 24 in 25 for the
     * Agents SDK's); fewer than half would be a broken warm start, template or parser */
    lt_tool_agent_test_cmd("t1405", py, "openai_agent.py", "examples/letters/sft-openai-py.jsonl",
                           "tests/serve/letters-openai-py", 12, 13);
}
