/*
 * t0806_credit_eval_retry: what credit does with a rollout controller's two signals
 * (schemas/span.avsc): spans marked eval (a held-out evaluation rollout) train nothing and
 * join no group; an attempt whose end says retried neither trains nor counts towards its
 * group, and the new attempt takes its place in it. Expected values come from those two
 * sentences and grpo's definition.
 */
#include "testlib.h"
#include "credit.h"
#include "t0849_credit_helpers.h"

static al_span eval_span(al_span s)
{
    s.eval = 1;
    return s;
}

TEST(eval_spans_are_counted_and_train_nothing)
{
    al_credit_config c;
    al_credit_config_init(&c);
    c.group_size = 2;
    sink_t s;
    al_credit_part *p = mk_part(&c, &s);
    REQUIRE(p);
    /* an eval rollout of task t (the task's training group must not see it), then the
     * training group of t */
    CHECK(feed(p, eval_span(mk_simple("t", "ev", 0, 10))) == 0);
    CHECK(feed(p, eval_span(mk_reward("t", "ev", 1, 11, "final", 1.0, 0))) == 0);
    CHECK(feed(p, eval_span(mk_end("t", "ev", 2, 12, AL_ROLLOUT_STATUS_SUCCEEDED, 1))) == 0);
    /* even a malformed eval span is passed over, not dead-lettered */
    al_span bad = eval_span(mk_simple("t", "ev2", 0, 13));
    bad.llm_call.n_response_tokens = 0;
    CHECK(feed(p, bad) == 0);
    const al_credit_stats *st = al_credit_part_stats(p);
    CHECK_EQ_INT(st->eval_spans, 4);
    CHECK_EQ_INT(st->open_rollouts, 0);
    CHECK_EQ_INT(st->open_groups, 0);
    CHECK_EQ_INT(s.n, 0);
    /* their offsets are finished with at once */
    CHECK_EQ_INT(al_credit_part_safe_offset(p), off_counter);
    feed_rollout(p, "t", "a", 1.0, 20);
    feed_rollout(p, "t", "b", 0.0, 21);
    REQUIRE(s.n == 2);
    /* the group is a and b alone: grpo over {1, 0} gives +-1 (std 0.5, eps 1e-6) */
    CHECK(fabs(tr(&s, 0)->advantage - 0.5 / (0.5 + 1e-6)) < 1e-9);
    CHECK_EQ_INT(tr(&s, 0)->group_size, 2);
    CHECK_EQ_INT(st->transitions, 2);
    al_credit_part_free(p);
    sink_free(&s);
}

TEST(a_retried_attempt_gives_its_place_to_the_next)
{
    al_credit_config c;
    al_credit_config_init(&c);
    c.group_size = 2;
    sink_t s;
    al_credit_part *p = mk_part(&c, &s);
    REQUIRE(p);
    /* rollout x fails its attempt 0 and is retried; y succeeds; the group must wait for
     * x's attempt 1 instead of completing with the failed attempt */
    CHECK(feed(p, mk_simple("t", "x", 0, 10)) == 0);
    al_span end = mk_end("t", "x", 1, 11, AL_ROLLOUT_STATUS_FAILED, 2);
    end.rollout_end.retried = 1;
    CHECK(feed(p, end) == 0);
    feed_rollout(p, "t", "y", 0.0, 12);
    CHECK_EQ_INT(s.n, 0);
    const al_credit_stats *st = al_credit_part_stats(p);
    CHECK_EQ_INT(st->rollouts_retried, 1);
    CHECK_EQ_INT(st->open_groups, 1);
    /* attempt 1 of x: its spans count from 0 again */
    al_span a1 = mk_simple("t", "x", 0, 13);
    a1.attempt = 1;
    CHECK(feed(p, a1) == 0);
    al_span r1 = mk_reward("t", "x", 1, 14, "final", 1.0, 0);
    r1.attempt = 1;
    CHECK(feed(p, r1) == 0);
    al_span e1 = mk_end("t", "x", 2, 15, AL_ROLLOUT_STATUS_SUCCEEDED, 2);
    e1.attempt = 1;
    CHECK(feed(p, e1) == 0);
    REQUIRE(s.n == 2);
    CHECK(tr_id(&s, "x:1:0") != NULL);
    CHECK(tr_id(&s, "x:0:0") == NULL);
    CHECK(tr_id(&s, "y:0:0") != NULL);
    const al_transition *t = tr_id(&s, "x:1:0");
    REQUIRE(t);
    CHECK(t->advantage > 0.99 && t->group_size == 2);
    /* a retried end without a new attempt leaves the group short: it times out as usual */
    al_credit_part_free(p);
    sink_free(&s);
}

/* Without retried, a failed attempt is a member of its group (dropped under the default
 * --on-failed drop): the group completes on it. */
TEST(a_failed_attempt_without_retried_completes_its_group)
{
    al_credit_config c;
    al_credit_config_init(&c);
    c.group_size = 2;
    sink_t s;
    al_credit_part *p = mk_part(&c, &s);
    REQUIRE(p);
    CHECK(feed(p, mk_simple("t", "x", 0, 10)) == 0);
    CHECK(feed(p, mk_end("t", "x", 1, 11, AL_ROLLOUT_STATUS_FAILED, 2)) == 0);
    feed_rollout(p, "t", "y", 0.5, 12);
    CHECK_EQ_INT(s.n, 1); /* y alone: a group of one kept rollout */
    CHECK_EQ_INT(al_credit_part_stats(p)->rollouts_retried, 0);
    CHECK_EQ_INT(al_credit_part_stats(p)->open_groups, 0);
    al_credit_part_free(p);
    sink_free(&s);
}
