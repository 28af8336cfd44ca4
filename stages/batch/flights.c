/*
 * flights.c: the batch worker's steps in flight (batch.h). A step built by the batcher is sent
 * chunk by chunk to the output topic, keyed by model; each chunk's delivery report names its
 * step, and a step whose chunks are all acknowledged is retired: counted in the metrics,
 * logged, and its transitions' inputs ended, so that their offsets may be stored (main.c's
 * delivery contract). The stage's metrics live here too: most count what was retired.
 */
#include "batch.h"

#include "core/fault.h"
#include "core/log.h"
#include "core/util.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define COMP "batch"

/* ---- metrics ------------------------------------------------------------------------------- */

static const double lag_buckets[] = {0, 1, 2, 3, 4, 6, 8, 12, 16, 32, 64};
static const double token_buckets[] = {1e3, 4e3, 16e3, 64e3, 256e3, 1e6, 4e6, 16e6};
static const double seq_buckets[] = {1, 4, 16, 64, 256, 1024, 4096};
static const double eff_buckets[] = {0.5, 0.7, 0.8, 0.9, 0.95, 0.97, 0.98, 0.99, 1.0};

void batch_metrics_init(batch_metrics *m)
{
    al_metrics *r = m->reg;
    const char *tn = "arclight_batch_transitions_total", *th = "Transitions consumed, by outcome";
    m->added = al_metrics_counter(r, tn, th, "result", "added", NULL);
    m->duplicate = al_metrics_counter(r, tn, th, "result", "duplicate", NULL);
    m->invalid = al_metrics_counter(r, tn, th, "result", "invalid", NULL);
    m->undecodable = al_metrics_counter(r, tn, th, "result", "undecodable", NULL);
    m->stale_dropped = al_metrics_counter(r, tn, th, "result", "stale_dropped", NULL);
    m->stale_kept = al_metrics_counter(r, "arclight_batch_stale_kept_total",
                                       "Sequences kept in a step although older than --max-staleness", NULL);
    m->steps = al_metrics_counter(r, "arclight_batch_steps_total", "Trainer steps acknowledged", NULL);
    m->chunks = al_metrics_counter(r, "arclight_batch_chunks_total", "BatchChunk messages acknowledged", NULL);
    m->tokens = al_metrics_counter(r, "arclight_batch_tokens_total", "Tokens in acknowledged steps", NULL);
    m->capacity = al_metrics_counter(r, "arclight_batch_capacity_tokens_total",
                                     "Micro-batch capacity of acknowledged steps (tokens)", NULL);
    m->step_tokens = al_metrics_histogram(r, "arclight_batch_step_tokens", "Tokens per step",
                                          token_buckets, AL_ARRAY_LEN(token_buckets), NULL);
    m->step_seqs = al_metrics_histogram(r, "arclight_batch_step_sequences", "Sequences per step",
                                        seq_buckets, AL_ARRAY_LEN(seq_buckets), NULL);
    m->lag = al_metrics_histogram(r, "arclight_batch_policy_lag",
                                  "Policy versions between a sequence's sampler and the latest, per sequence stepped",
                                  lag_buckets, AL_ARRAY_LEN(lag_buckets), NULL);
    m->lag_unknown = al_metrics_gauge(r, "arclight_batch_policy_lag_unknown",
                                      "Sequences of the last step with no known lag (no version)", NULL);
    m->efficiency_h = al_metrics_histogram(r, "arclight_batch_packing_efficiency_ratio",
                                           "Packing efficiency per step (tokens / capacity)",
                                           eff_buckets, AL_ARRAY_LEN(eff_buckets), NULL);
    m->efficiency = al_metrics_gauge(r, "arclight_batch_packing_efficiency",
                                     "Packing efficiency of the last step (tokens / capacity)", NULL);
    m->open_groups = al_metrics_gauge(r, "arclight_batch_open_groups", "Groups still receiving transitions", NULL);
    m->queued_groups = al_metrics_gauge(r, "arclight_batch_queued_groups", "Complete groups waiting for a step", NULL);
    m->queued_seqs = al_metrics_gauge(r, "arclight_batch_queued_sequences", "Sequences waiting for a step", NULL);
    m->policy_version = al_metrics_gauge(r, "arclight_batch_policy_version",
                                         "Latest policy version seen (any model)", NULL);
}

/* ---- steps in flight ----------------------------------------------------------------------- */

static void end_inputs(al_batch_step *st)
{
    for (size_t i = 0; i < st->n_opaques; i++) al_input_end(st->opaques[i]);
}

/* A finished step: account for it, release its inputs (their offsets may now be stored). */
static void step_acked(batch_worker *w, batch_flight *f)
{
    al_batch_step *st = f->step;
    end_inputs(st);
    batch_metrics *m = &w->met;
    al_counter_inc(m->steps);
    al_counter_add(m->chunks, (double)st->n_chunks);
    al_counter_add(m->tokens, (double)st->n_tokens);
    al_counter_add(m->capacity, (double)st->capacity_tokens);
    al_histogram_observe(m->step_tokens, (double)st->n_tokens);
    al_histogram_observe(m->step_seqs, (double)st->n_sequences);
    al_histogram_observe(m->efficiency_h, st->efficiency);
    al_gauge_set(m->efficiency, st->efficiency);
    al_counter_add(m->stale_kept, st->n_stale);
    int64_t unknown = 0, lag_max = -1;
    for (int32_t i = 0; i < st->n_sequences; i++) {
        if (st->lags[i] < 0) {
            unknown++;
            continue;
        }
        al_histogram_observe(m->lag, (double)st->lags[i]);
        if (st->lags[i] > lag_max) lag_max = st->lags[i];
    }
    al_gauge_set(m->lag_unknown, (double)unknown);
    char policy[32] = "policy not seen yet"; /* no PolicyVersion read yet: version -1 */
    if (st->policy_version >= 0)
        snprintf(policy, sizeof policy, "policy v%" PRId64, st->policy_version);
    al_log_info(COMP,
                "%s step %" PRId64 ": %d groups, %d sequences, %" PRId64 " tokens (%" PRId64
                " trained) in %d micro-batches, %.1f%% packed, %zu chunk%s, %s, lag max %" PRId64
                "%s",
                st->model, st->step, st->n_groups, st->n_sequences, st->n_tokens,
                st->n_loss_tokens, st->n_micro_batches, 100.0 * st->efficiency, st->n_chunks,
                st->n_chunks == 1 ? "" : "s", policy, lag_max,
                unknown ? " (some versions unknown)" : "");
    w->steps_done++;
    w->last_step_acked = st->step;
    w->last_step_us = al_mono_us();
}

/* Steps finish in order (one partition per model): the head of the list is retired first. */
void batch_flights_retire(batch_worker *w)
{
    int retired = 0;
    while (w->flights && w->flights->acked == w->flights->step->n_chunks) {
        batch_flight *f = w->flights;
        w->flights = f->next;
        step_acked(w, f);
        al_batch_step_free(f->step);
        free(f);
        retired = 1;
    }
    /* Their inputs' offsets go to the broker now, not at the next periodic commit: a
     * restart knows the steps on the topic that are past the committed offset only from the
     * last --recover-chunks chunks it reads back, and a burst (a backlog after a broker
     * outage: 66 steps in 0.8 s in t1504) made more steps within one commit interval than
     * that, so a restart put transitions of the oldest of them into a second step. */
    if (retired && w->st.consumer) al_consumer_commit_async(w->st.consumer);
}

int batch_step_send(batch_worker *w, al_batch_step *st)
{
    batch_flight *f = calloc(1, sizeof *f);
    if (!f) {
        al_stage_fail(&w->st, "out of memory");
        al_batch_step_free(st);
        return -1;
    }
    f->step = st;
    al_log_debug(COMP, "%s step %" PRId64 " built: %zu chunk%s, %" PRId64 " tokens; sending", st->model,
                 st->step, st->n_chunks, st->n_chunks == 1 ? "" : "s", st->n_tokens);
    batch_flight **tail = &w->flights;
    while (*tail) tail = &(*tail)->next;
    *tail = f;
    /* a delivery report served while sending (a full queue, the test hook's flush) may retire
     * this step once its last chunk is acknowledged: nothing of it is used after that one */
    size_t n_chunks = st->n_chunks;
    int64_t step_no = st->step;
    for (size_t c = 0; c < n_chunks; c++) {
        al_kafka_out out = {
            .topic = w->o->output_topic,
            .partition = AL_KAFKA_PARTITION_ANY,
            .key = st->model,
            .keylen = strlen(st->model),
            .value = st->chunks[c].data,
            .len = st->chunks[c].len,
            .opaque = f,
        };
        rd_kafka_resp_err_t err = al_producer_produce(al_stage_producer(&w->st), &out);
        if (err) {
            al_stage_fail(
                &w->st, "cannot send chunk %zu of %s step %" PRId64 " (%zu bytes) to %s: %s", c,
                st->model, st->step, st->chunks[c].len, w->o->output_topic, rd_kafka_err2str(err));
            return -1;
        }
        if (AL_FAULT_POINTS && w->o->kill_step >= 0 && step_no == w->o->kill_step) {
            /* the fault point wants the kill at an exact chunk: one at a time */
            char e[256];
            al_producer_flush(al_stage_producer(&w->st), 10000, e, sizeof e);
        }
    }
    return 0;
}

static void release_input(void *ctx, void *opaque, const char *reason)
{
    (void)ctx;
    (void)reason;
    al_input_end(opaque);
}

void batch_flights_drop(batch_worker *w)
{
    while (w->flights) {
        batch_flight *f = w->flights;
        w->flights = f->next;
        end_inputs(f->step);
        al_batch_step_free(f->step);
        free(f);
    }
    al_batcher_release_all(w->batcher, release_input, NULL);
}

