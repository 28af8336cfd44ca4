/*
 * t1402: the letters demo's agent on the official `openai` npm client (examples/letters/
 * agent.js) completes rollouts through `arclight rollouts`, `arclight proxy` and `arclight
 * serve`, unchanged: three train tasks in groups of two and one val task (evaluated
 * through the proxy's eval route), on the tiny random model. Every rollout succeeds with
 * its two calls, each a span with the served token ids and logprobs, and a reward within
 * [0, 1] (the agent's own posts, or its last {"reward": R} line posted by the controller).
 */
#define _GNU_SOURCE /* memmem */
#include "testlib.h"
#include "broker_fixture.h"
#include "t1099_proxy_helpers.h"
#include "t1199_serve_helpers.h"
#include "t1420_letters_helpers.h"

TEST(the_openai_client_agent_completes_rollouts_through_the_proxy_and_serve)
{
    lt_run r;
    REQUIRE(lt_start(&r, "t1402", NULL, NULL) == 0);
    int st = lt_rollouts(&r, "agent.js", 3, 1, 2);
    CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "rollouts: status %d after %.0f s:\n%s", st,
           r.rollouts_s, r.rollouts_log);
    CHECKF(strstr(r.rollouts_log, "done at policy v0"), "%s", r.rollouts_log);
    REQUIRE(lt_read_spans(&r, 7) == 7);
    lt_rollout o[16];
    size_t n = lt_rollouts_of(&r, o, 16);
    int calls = lt_check_rollouts(o, n, 7, 1, 2);
    for (size_t k = 0; k < n; k++)
        CHECKF(o[k].ncalls == 2, "rollout %s: %d calls", o[k].rollout, o[k].ncalls);
    fprintf(stderr, "%zu rollouts, %d calls in %.0f s\n", n, calls, r.rollouts_s);
    lt_stop(&r);
}
