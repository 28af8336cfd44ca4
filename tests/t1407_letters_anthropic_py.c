/*
 * t1407: the letters demo's agent on the official `anthropic` Python client
 * (examples/letters/anthropic_agent.py: messages.create with a tool, its own loop over
 * tool_use and tool_result blocks) completes rollouts through `arclight rollouts`, the
 * proxy (which serves /v1/messages by translation to serve's chat completions) and
 * `arclight serve`, unchanged, on scripts/setup.sh's virtual environment (skipped, exit 77,
 * without one), on the tiny random model (no warm start: see t1405). Every call a span with
 * token ids and logprobs, the agent's tool in every request, every rollout scored as the
 * agent documents.
 */
#define _GNU_SOURCE /* memmem */
#include "testlib.h"
#include "broker_fixture.h"
#include "t1099_proxy_helpers.h"
#include "t1199_serve_helpers.h"
#include "t1420_letters_helpers.h"
#include "venv.h"
#include "t1421_letters_api_checks.h"

TEST(the_anthropic_python_agent_completes_rollouts_through_the_proxy_and_serve)
{
    lt_api_agent_test("t1407", LT_MESSAGES, "anthropic_agent.py", 4);
}
