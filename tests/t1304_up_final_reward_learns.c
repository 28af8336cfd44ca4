/*
 * t1304: issue 25's target, shortened: the letters demo with an agent that posts only the
 * task's final reward (examples/letters/agent.js --final-reward: nothing after call 1) must
 * learn under `arclight up`'s defaults, whose credit (--credit step) has to work out from
 * that one number which call earned it. The statistic is t1303's (t1348_up_learn.h): a
 * sign test over the held-out val tasks between v0 and v40, p < 0.01, and a mean rise of
 * at least 0.3.
 */
#include "testlib.h"
#include "support.h"

#include "t1348_up_learn.h"

TEST(held_out_reward_rises_from_a_final_reward_alone)
{
    up_learn_check("t1304", "examples/letters/agent.js --final-reward", 0.3);
}
