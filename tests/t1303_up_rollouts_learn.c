/*
 * t1303: the README's main command, shortened: `arclight up --steps 40` with its defaults
 * (the letters demo of examples/letters: the warm start, then the unchanged `openai`-client
 * agent run by the rollout controller over the task set, two LLM calls per rollout) must
 * raise the reward on the held-out val tasks, which it never trains on.
 *
 * The statistic (t1348_up_learn.h): every val task is evaluated (greedy) at the first and
 * at the last evaluation (WORKDIR/eval.jsonl). A one-sided sign test over the tasks whose
 * reward changed must reject "no improvement" at p < 0.01 (exact binomial tail: the chance
 * that a fair coin gives at least that many improvements), and the mean val reward must
 * rise by at least 0.2. A loop that loses the signal anywhere (the controller's rewards, the eval
 * marking, credit, batch's groups, the update, the weight swap) leaves the val tasks where
 * they started.
 */
#include "testlib.h"
#include "support.h"

#include "t1348_up_learn.h"

TEST(held_out_reward_rises_under_the_defaults)
{
    up_learn_check("t1303", NULL, 0.2);
}
