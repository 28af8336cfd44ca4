/*
 * feeds.c: the rollout controller's Kafka readers (assign-based: no consumer group, no
 * commits). arclight.policy, followed from its beginning in one reader (lib/kafka/follower.h),
 * gives the policy versions that pace the run and the trainer's numbers for the report;
 * arclight.spans, read from the end (lib/kafka/topic_reader.h), what each of this run's
 * rollouts got (the versions that answered its calls, its rewards, its end read back),
 * whoever posted them. Spans of other tasks are skipped by their Kafka key before decoding.
 */
#include "rollouts/rollouts.h"

#include "core/log.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A PolicyVersion: its numbers into the report, the newest version of our model paces. */
static void on_version(rl_ctl *c, const al_policy_version *pv)
{
    if (!c->model[0]) snprintf(c->model, sizeof c->model, "%s", pv->model);
    if (strcmp(pv->model, c->model)) return;
    rl_version_row *row = rl_report_row(&c->rep, pv->version);
    if (row) {
        row->have_train_metrics = 1;
        row->tokens_per_s = pv->metrics.tokens_per_s;
        row->loss = pv->metrics.loss;
        row->kl = pv->metrics.kl;
        row->entropy = pv->metrics.entropy;
        row->clip_frac = pv->metrics.clip_fraction;
        if (c->have_v && row->time_s < 0) row->time_s = rl_now_s(c);
    }
    if (!c->have_v || pv->version > c->v) {
        c->v = pv->version;
        c->v_seen_us = al_mono_us();
    }
}

/* A span of one of our rollouts' current attempts: what it says of the rollout. */
static void on_span(rl_ctl *c, const al_span *s)
{
    rl_rollout *r = rl_rtab_find(c, s->rollout_id);
    if (!r || s->attempt != r->attempt) return;
    if (s->kind == AL_SPAN_KIND_LLM_CALL) {
        r->n_calls++;
        int64_t v = s->llm_call.policy_version;
        if (v >= 0 && (r->min_version < 0 || v < r->min_version)) r->min_version = v;
    } else if (s->kind == AL_SPAN_KIND_REWARD) {
        if (c->o.reward_name && strcmp(c->o.reward_name, s->reward.name ? s->reward.name : ""))
            return;
        r->reward += s->reward.value;
        r->n_rewards++;
    } else if (s->kind == AL_SPAN_KIND_ROLLOUT_END) {
        if (r->done) r->end_seen = 1;
    }
}

/* The set of the tasks' keys (keyset_has). 0, or -1 when out of memory. */
int rl_feeds_keyset_build(rl_ctl *c)
{
    for (size_t i = 0; i < c->tasks.n; i++)
        if (al_map_put(&c->keyset, c->tasks.t[i].key, &c->tasks.t[i])) return -1;
    return 0;
}

/* 1 when the Kafka key is one of our tasks'. */
static int keyset_has(const rl_ctl *c, const void *key, size_t len)
{
    return key && len && al_map_findn(&c->keyset, key, len) != NULL;
}

/* One record of the policy topic from the follower (k its al_follower_next result, m the
 * record or error event, destroyed here). warn: say so when a record is not a
 * PolicyVersion. 0, or -1 when following cannot go on (logged). */
static int feeds_policy_record(rl_ctl *c, int k, rd_kafka_message_t *m, int warn)
{
    char err[512];
    int rc = 0;
    if (k < 0) {
        if (al_kafka_error_classify(m->err) == AL_KAFKA_ERRCLASS_FATAL ||
            al_kafka_error_classify(m->err) == AL_KAFKA_ERRCLASS_ABORTABLE) {
            al_log_error(COMP, "reading %s: %s", c->o.policy_topic, rd_kafka_message_errstr(m));
            rc = -1;
        } else {
            al_log_warn(COMP, "reading %s: %s (retrying)", c->o.policy_topic,
                        rd_kafka_message_errstr(m));
        }
    } else if (al_policy_version_decode(m->payload, m->len, &c->pv, err, sizeof err) == 0) {
        on_version(c, &c->pv);
    } else if (warn) {
        al_log_warn(COMP, "%s [%d] offset %" PRId64 ": %s (skipped)", c->o.policy_topic,
                    (int)m->partition, m->offset, err);
    }
    rd_kafka_message_destroy(m);
    return rc;
}

/* Follows the policy topic from its beginning and reads the versions so far, to the end it
 * had at start (v0 paces from there); the loop goes on from where this stops, so no version
 * falls between the two. 0, or -1 (logged). */
static int feeds_read_versions(rl_ctl *c)
{
    char err[1024];
    al_follower_opts fo = {
        .topic = c->o.policy_topic,
        .client = "arclight-rollouts-policy",
        .timeout_ms = 10000,
    };
    if (!(c->policy = al_follower_new(c->kc, &fo, err, sizeof err)) ||
        al_follower_assign(c->policy, err, sizeof err)) {
        al_log_error(COMP, "%s", err);
        return -1;
    }
    while (!al_follower_caught_up(c->policy)) {
        rd_kafka_message_t *m;
        int k = al_follower_next(c->policy, 200, &m);
        if (k != 0 && feeds_policy_record(c, k, m, 0)) return -1;
    }
    c->have_v = c->model[0] != 0;
    return 0;
}

/* Reads the versions so far, then opens the spans reader (from the end) that the loop polls
 * with the policy follower (the controller owns both, rl_run_free frees them). 0, or -1
 * (logged). */
int rl_feeds_open(rl_ctl *c)
{
    char err[1024];
    if (feeds_read_versions(c)) return -1;
    const char *stopics[] = {c->o.spans_topic};
    al_topic_reader_opts so = {stopics, 1, -1, AL_TOPIC_START_END, 0, 0, -1, -1, 1};
    if (!(c->spans_rd = al_topic_reader_new(c->kc, &so, err, sizeof err))) {
        al_log_error(COMP, "%s", err);
        return -1;
    }
    return 0;
}

/* Drains what the policy follower and the spans reader have now. -1 when one failed for
 * good. */
int rl_feeds_poll(rl_ctl *c, int wait_ms)
{
    char err[512];
    rd_kafka_message_t *m;
    for (int i = 0; i < 2000; i++) {
        int k = al_follower_next(c->policy, i ? 0 : wait_ms, &m);
        if (k == 0) break;
        if (feeds_policy_record(c, k, m, 1)) return -1;
    }
    for (int i = 0; i < 5000; i++) {
        int k = al_topic_reader_next(c->spans_rd, 0, &m, err, sizeof err);
        if (k < 0) {
            al_log_error(COMP, "reading %s: %s", c->o.spans_topic, err);
            return -1;
        }
        if (k != 1) break;
        if (keyset_has(c, m->key, m->key_len) &&
            al_span_decode(m->payload, m->len, &c->span, err, sizeof err) == 0 &&
            c->span.rollout_id && !strncmp(c->span.rollout_id, c->run, strlen(c->run)))
            on_span(c, &c->span);
        rd_kafka_message_destroy(m);
    }
    return 0;
}
