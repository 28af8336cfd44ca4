/*
 * feeds.c: the rollout controller's Kafka readers (lib/kafka/topic_reader.h: assign-based,
 * no consumer group, no commits). arclight.policy gives the policy versions that pace the
 * run and the trainer's numbers for the report; arclight.spans what each of this run's
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

/* The policy versions so far: reads the policy topic to its end (v0 paces from there).
 * 0, or -1 (logged). */
static int feeds_read_versions(rl_ctl *c)
{
    char err[1024];
    const char *topics[] = {c->o.policy_topic};
    al_topic_reader_opts ro = {topics, 1, -1, AL_TOPIC_START_BEGINNING, 0, 0, -1, -1, 0};
    al_topic_reader *rd = al_topic_reader_new(c->kc, &ro, err, sizeof err);
    if (!rd) {
        al_log_error(COMP, "%s", err);
        return -1;
    }
    rd_kafka_message_t *m;
    int k;
    while ((k = al_topic_reader_next(rd, 200, &m, err, sizeof err)) != 2) {
        if (k < 0) {
            al_log_error(COMP, "reading %s: %s", c->o.policy_topic, err);
            al_topic_reader_free(rd);
            return -1;
        }
        if (k == 1) {
            if (al_policy_version_decode(m->payload, m->len, &c->pv, err, sizeof err) == 0)
                on_version(c, &c->pv);
            rd_kafka_message_destroy(m);
        }
    }
    al_topic_reader_free(rd);
    c->have_v = c->model[0] != 0;
    return 0;
}

/* Reads the versions so far, then opens the readers the loop polls (both from the end; the
 * controller owns them, rl_run_free frees them). 0, or -1 (logged). */
int rl_feeds_open(rl_ctl *c)
{
    char err[1024];
    if (feeds_read_versions(c)) return -1;
    const char *topics[] = {c->o.policy_topic};
    al_topic_reader_opts ro = {topics, 1, -1, AL_TOPIC_START_END, 0, 0, -1, -1, 1};
    const char *stopics[] = {c->o.spans_topic};
    al_topic_reader_opts so = {stopics, 1, -1, AL_TOPIC_START_END, 0, 0, -1, -1, 1};
    if (!(c->policy_rd = al_topic_reader_new(c->kc, &ro, err, sizeof err)) ||
        !(c->spans_rd = al_topic_reader_new(c->kc, &so, err, sizeof err))) {
        al_log_error(COMP, "%s", err);
        return -1;
    }
    return 0;
}

/* Drains what the readers have now. -1 when a reader failed for good. */
int rl_feeds_poll(rl_ctl *c, int wait_ms)
{
    char err[512];
    rd_kafka_message_t *m;
    for (int i = 0; i < 2000; i++) {
        int k = al_topic_reader_next(c->policy_rd, i ? 0 : wait_ms, &m, err, sizeof err);
        if (k < 0) {
            al_log_error(COMP, "reading %s: %s", c->o.policy_topic, err);
            return -1;
        }
        if (k != 1) break;
        if (al_policy_version_decode(m->payload, m->len, &c->pv, err, sizeof err) == 0)
            on_version(c, &c->pv);
        else
            al_log_warn(COMP, "%s [%d] offset %" PRId64 ": %s (skipped)", c->o.policy_topic,
                        (int)m->partition, m->offset, err);
        rd_kafka_message_destroy(m);
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
