/*
 * t1406: the letters demo's agent on the `openai` Python client's Responses API
 * (examples/letters/responses_agent.py: client.responses.create(stream=True), a function
 * tool, its own loop over function_call and function_call_output items) completes rollouts
 * through `arclight rollouts`, the proxy (which serves /v1/responses by translation to
 * serve's chat completions, streaming included) and `arclight serve`, unchanged, on
 * scripts/setup.sh's virtual environment (skipped, exit 77, without one), on the tiny
 * random model (no warm start: see t1405). Every call a span with token ids and logprobs,
 * the agent's tool in every request, every rollout scored as the agent documents.
 */
#define _GNU_SOURCE /* memmem */
#include "testlib.h"
#include "broker_fixture.h"
#include "t1099_proxy_helpers.h"
#include "t1199_serve_helpers.h"
#include "t1420_letters_helpers.h"
#include "venv.h"
#include "t1421_letters_api_checks.h"

TEST(the_responses_api_python_agent_completes_rollouts_through_the_proxy_and_serve)
{
    lt_api_agent_test("t1406", LT_RESPONSES, "responses_agent.py", 4);
}
