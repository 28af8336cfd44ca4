/*
 * t1405: the letters demo's agent on the official `openai` Python client
 * (examples/letters/openai_agent.py: chat completions, a function tool, its own tool loop)
 * completes rollouts through `arclight rollouts`, `arclight proxy` and `arclight serve`,
 * unchanged, on scripts/setup.sh's virtual environment (skipped, exit 77, without one):
 * four train tasks in groups of two and one val task on the tiny random model. Every
 * rollout succeeds, every call is a span with the served token ids and logprobs, every
 * call asks with the tools its warm start (sft-openai-py.jsonl) was made with, and every
 * rollout is scored as the agent documents (a tool call runs the door and a second call;
 * text ends the run).
 *
 * The model is not warm-started here: the warm start (500 steps) has no fixture yet
 * (tests/serve/letters-openai-py; making it took longer than this machine had), so the
 * random model rarely writes a <tool_call> and most rollouts take the text path.
 */
#define _GNU_SOURCE /* memmem */
#include "testlib.h"
#include "broker_fixture.h"
#include "t1099_proxy_helpers.h"
#include "t1199_serve_helpers.h"
#include "t1420_letters_helpers.h"
#include "venv.h"

TEST(the_openai_python_agent_completes_rollouts_through_the_proxy_and_serve)
{
    char py[1024];
    al_test_venv_python(py, sizeof py, "openai");
    lt_run r;
    REQUIRE(lt_start(&r, "t1405", NULL, NULL) == 0);
    int st = lt_rollouts_cmd(&r, py, "openai_agent.py", 4, 1, 2);
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rollouts: status %d after %.0f s:\n%s", st,
           r.rollouts_s, r.rollouts_log);
    CHECK(lt_read_spans(&r, 9) == 9);
    lt_rollout o[16];
    size_t n = lt_rollouts_of(&r, o, 16);
    int calls = lt_check_rollouts(o, n, 9, 1, 2);
    int tools = lt_check_tool_agent(o, n, "examples/letters/sft-openai-py.jsonl");
    fprintf(stderr, "%zu rollouts, %d calls in %.0f s; %d first calls were open_door calls\n", n,
            calls, r.rollouts_s, tools);
    lt_stop(&r);
}
