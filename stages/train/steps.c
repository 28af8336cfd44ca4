/*
 * steps.c: what becomes of a complete step (assembler.h): trained, its version written and
 * its PolicyVersion sent (versions.c), its chunks' input handles held until that version is
 * acknowledged and a full checkpoint covers it, then released (which stores their offsets);
 * a step that is bad or that the trainer refuses is dead-lettered with the reason. A
 * follower rank only trains.
 */
#include "train.h"

#include "core/fault.h"
#include "core/hash.h"
#include "core/log.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void train_held_release(void *ctx, void *opaque)
{
    (void)ctx;
    held_msg *h = opaque;
    if (!h) return;
    al_input_end(h->in);
    if (h->m) rd_kafka_message_destroy(h->m);
    free(h);
}

void train_step_deadletter(train_worker *w, void **msgs, size_t n, const char *reason)
{
    char err[512];
    for (size_t i = 0; i < n; i++) {
        held_msg *h = msgs[i];
        if (al_deadletter_message(al_stage_producer(&w->st), h->m, reason, "train", h->in, err,
                                  sizeof err) != 0)
            al_stage_fail(&w->st, "cannot dead-letter %s [%d] offset %" PRId64 ": %s",
                          w->o->input_topic, (int)h->m->partition, h->m->offset, err);
        al_counter_inc(w->met.bad);
    }
}

static void ready_release(al_train_ready *r)
{
    for (size_t i = 0; i < r->n_current; i++) train_held_release(NULL, r->current[i]);
    for (size_t i = 0; i < r->n_retired; i++) train_held_release(NULL, r->retired[i]);
    al_train_ready_free(r);
}

/* The replicas of a data-parallel group must hold the same weights after every update
 * (dist.h: the same start, the same summed gradients, the same AdamW). On the CPU each rank
 * takes an order-free digest of its weights (a sum of mixed 64-bit words, GB/s: small next
 * to a step) and the group compares them (the maximum and minimum of both 32-bit halves);
 * replicas that disagree (a bug, a flipped bit, a rank on other weights) stop the group on
 * that version, on every rank alike, before rank 0 writes or publishes it. A restart starts
 * every rank from rank 0's newest full checkpoint. On CUDA the weights stay on the device
 * and are not compared. 0 when they agree (or there is nothing to compare), -1 when not. */
static int train_replicas_agree(train_worker *w)
{
    if (al_dist_world(w->dist) < 2 || strcmp(w->be->ops->name, "cpu") != 0) return 0;
    float *p = al_model_params(w->policy);
    size_t n = al_model_num_params(w->policy);
    if (AL_FAULT_POINTS && w->o->diverge_rank == al_dist_rank(w->dist) &&
        w->o->diverge_version == w->version)
        p[0] += 1e-3f; /* the fault point: this rank's weights differ from here on */
    uint64_t h = 0, word;
    for (size_t i = 0; i + 1 < n; i += 2) {
        memcpy(&word, p + i, sizeof word);
        h += al_hash_mix(word ^ (uint64_t)i);
    }
    if (n % 2) {
        uint32_t last;
        memcpy(&last, p + n - 1, sizeof last);
        h += al_hash_mix(last ^ (uint64_t)n);
    }
    double hi = (double)(h >> 32), lo = (double)(h & 0xffffffffu);
    double range[4] = {hi, lo, -hi, -lo}; /* max of each; min = -max of the negated */
    al_dist_allreduce_host(w->dist, range, 4, 1);
    if (range[0] == -range[2] && range[1] == -range[3]) return 0;
    al_stage_fail(&w->st,
                  "the replicas disagree on the weights after version %" PRId64 " (this rank, "
                  "%d of %d, holds digest %016" PRIx64 "): the group stops before the version is "
                  "written; restarted, every rank starts from rank 0's newest full checkpoint",
                  w->version, al_dist_rank(w->dist), al_dist_world(w->dist), h);
    return -1;
}

/* Trains on one complete step and publishes its version. Takes ownership of r. */
void train_step_apply(train_worker *w, al_train_ready *r)
{
    char err[1024];
    if (r->bad) {
        al_log_warn(COMP, "%s: dead-lettering its %zu chunk%s", r->reason, r->n_current,
                    r->n_current == 1 ? "" : "s");
        train_step_deadletter(w, r->current, r->n_current, r->reason);
        al_counter_inc(w->met.bad_steps);
        ready_release(r);
        return;
    }
    al_train_stats st;
    if (w->follower) {
        /* rank 0 does the writing, publishing and dead-lettering of the same step */
        int ok = al_trainer_step(w->tr, r->chunks, r->nchunks, &st, err, sizeof err) == 0;
        if (ok) w->version++, w->batch_step = r->step;
        else al_log_error(COMP, "step %" PRId64 ": the trainer refused it: %s", r->step, err);
        if (ok && train_replicas_agree(w) != 0) {
            ready_release(r);
            return;
        }
        al_log_info(COMP, "%s v%" PRId64 " (batch step %" PRId64 ", rank %d of %d)%s",
                    w->o->model_name, w->version, r->step, al_dist_rank(w->dist),
                    al_dist_world(w->dist), ok ? "" : ": refused");
        ready_release(r);
        return;
    }
    if (al_trainer_step(w->tr, r->chunks, r->nchunks, &st, err, sizeof err) != 0) {
        char reason[1200];
        snprintf(reason, sizeof reason, "step %" PRId64 ": the trainer refused it: %s", r->step, err);
        al_log_error(COMP, "%s", reason);
        train_step_deadletter(w, r->current, r->n_current, reason);
        al_counter_inc(w->met.bad_steps);
        ready_release(r);
        return;
    }
    w->version++;
    w->batch_step = r->step;
    if (train_replicas_agree(w) != 0) {
        ready_release(r);
        return;
    }
    train_version_stats_json(&st, w, r->step, r->policy_version, r->reward_mean,
                             w->last_metrics, sizeof w->last_metrics);
    int full = w->version % w->o->checkpoint_every == 0;
    char sha[65];
    if (train_version_save(w, full, w->last_metrics, sha, err, sizeof err) != 0) {
        al_stage_fail(&w->st, "cannot write version %" PRId64 " under %s: %s", w->version,
                      w->out_abs, err);
        ready_release(r);
        return;
    }
    if (AL_FAULT_POINTS && w->o->kill_version == w->version && !w->o->kill_after_ack)
        al_fault_kill(COMP, "after writing version %" PRId64, w->version);
    applied *a = calloc(1, sizeof *a);
    if (!a || !(a->hs = calloc(r->n_current + r->n_retired + 1, sizeof *a->hs))) {
        free(a);
        al_stage_fail(&w->st, "out of memory");
        ready_release(r);
        return;
    }
    a->version = w->version;
    for (size_t i = 0; i < r->n_current + r->n_retired; i++) {
        held_msg *h = i < r->n_current ? r->current[i] : r->retired[i - r->n_current];
        rd_kafka_message_destroy(h->m);
        h->m = NULL;
        a->hs[a->n++] = h;
    }
    int64_t batch_step = r->step, batch_policy = r->policy_version, step_tokens = r->tokens;
    int nmb = r->nchunks;
    double reward_mean = r->reward_mean;
    double call_h[AL_TRAIN_CALL_POSITIONS];
    memcpy(call_h, r->call_entropy, sizeof call_h);
    al_train_ready_free(r);
    applied **tail = &w->applied_head;
    while (*tail) tail = &(*tail)->next;
    *tail = a;
    if (train_version_publish(w, w->version, batch_step, sha, &st, reward_mean, batch_policy, a,
                              err, sizeof err) != 0) {
        al_stage_fail(&w->st, "%s", err);
        return;
    }
    if (AL_FAULT_POINTS && w->o->kill_version >= 0 && w->o->kill_after_ack) {
        /* the fault point wants its kill right at this version's ack: one version at a time */
        char e[256];
        al_producer_flush(al_stage_producer(&w->st), 10000, e, sizeof e);
    }
    train_metrics *m = &w->met;
    al_counter_inc(m->steps);
    al_counter_add(m->tokens, (double)st.step_tokens * al_trainer_config_of(w->tr)->ppo_epochs);
    al_gauge_set(m->version, (double)w->version);
    al_gauge_set(m->loss, st.loss);
    al_gauge_set(m->kl, st.kl);
    al_gauge_set(m->entropy, st.entropy);
    al_gauge_set(m->clip, st.clip_frac);
    al_gauge_set(m->gnorm, st.grad_norm);
    al_gauge_set(m->tps, st.tokens_per_s);
    al_gauge_set(m->lr, st.lr);
    /* the sampler's entropy by call position, "0.85/0.41" (positions present only) */
    char by_call[64] = "-";
    size_t at = 0;
    for (int k = 0; k < AL_TRAIN_CALL_POSITIONS; k++) {
        if (isnan(call_h[k])) continue;
        al_gauge_set(m->call_entropy[k], call_h[k]);
        if (at >= sizeof by_call - 8) continue;
        at += (size_t)snprintf(by_call + at, sizeof by_call - at, "%s%.3f", at ? "/" : "", call_h[k]);
    }
    train_tb_write(w, &st, reward_mean, batch_policy);
    al_log_info(COMP,
                "%s v%" PRId64 " (batch step %" PRId64 ", %d micro-batches, %" PRId64
                " tokens): loss %.5f kl %.5f entropy %.4f (sampled by call %s) clip %.3f "
                "grad-norm %.4f lr %.3g, %.0f tok/s%s",
                w->o->model_name, w->version, batch_step, nmb, step_tokens, st.loss, st.kl,
                st.entropy, by_call, st.clip_frac, st.grad_norm, st.lr, st.tokens_per_s,
                full ? ", checkpoint" : "");
}

void train_applied_free(applied *a)
{
    for (size_t i = 0; i < a->n; i++) train_held_release(NULL, a->hs[i]);
    free(a->hs);
    free(a);
}

/* Releases the inputs of steps whose version is acknowledged and covered by a checkpoint. */
void train_applied_retire(train_worker *w)
{
    while (w->applied_head && w->applied_head->acked && w->applied_head->version <= w->last_full) {
        applied *a = w->applied_head;
        w->applied_head = a->next;
        train_applied_free(a);
    }
}

