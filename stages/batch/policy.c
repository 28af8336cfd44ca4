/*
 * policy.c: the batch worker follows arclight.policy (kafka/follower.h) for the latest version
 * of each model, which the batcher's staleness bound measures samples against. Read to its end
 * before the first step (and again after an aborted transaction), then polled as the worker
 * keeps house.
 */
#include "batch.h"

#include "core/log.h"
#include "core/util.h"

#include <inttypes.h>

#define COMP "batch"

/* One PolicyVersion record: the batcher's latest version of its model. */
static void policy_apply(batch_worker *w, const rd_kafka_message_t *m)
{
    char e[256];
    if (al_policy_version_decode(m->payload, m->len, &w->pv, e, sizeof e) != 0) {
        al_log_warn(COMP, "policy topic [%d] offset %" PRId64 ": not a PolicyVersion (%s); ignored",
                    (int)m->partition, m->offset, e);
        return;
    }
    al_batcher_set_policy_version(w->batcher, w->pv.model, w->pv.version);
    al_gauge_set(w->met.policy_version, (double)w->pv.version);
    al_log_debug(COMP, "policy %s version %" PRId64, w->pv.model, w->pv.version);
}

void batch_policy_poll(batch_worker *w, int timeout_ms)
{
    rd_kafka_message_t *m;
    int k;
    while (w->policy && (k = al_follower_next(w->policy, timeout_ms, &m)) != 0) {
        timeout_ms = 0;
        if (k < 0)
            al_log_warn(COMP, "policy topic: %s", rd_kafka_message_errstr(m));
        else if (m->payload) /* a tombstone deletes nothing here: versions only go up */
            policy_apply(w, m);
        rd_kafka_message_destroy(m);
    }
}

int batch_policy_read_to_end(batch_worker *w, const al_kafka_conf *kc, char *errstr,
                             size_t errlen)
{
    al_follower_opts fo = {
        .topic = w->o->policy_topic,
        .client = "arclight-batch-policy",
        .timeout_ms = 10000,
        .missing_hint = " (create it: arclight topics create)",
    };
    batch_policy_stop(w);
    w->policy = al_follower_new(kc, &fo, errstr, errlen);
    if (!w->policy || al_follower_assign(w->policy, errstr, errlen) != 0) return -1;
    int64_t deadline = al_mono_us() + 60 * 1000000LL;
    while (!al_follower_caught_up(w->policy) && !al_stage_stop_requested()) {
        batch_policy_poll(w, 200);
        if (al_mono_us() > deadline)
            return al_err(errstr, errlen, "reading %s to its end took over 60 s",
                          w->o->policy_topic);
    }
    return 0;
}

void batch_policy_stop(batch_worker *w)
{
    al_follower_free(w->policy);
    w->policy = NULL;
}
