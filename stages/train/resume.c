/*
 * resume.c: --resume. The newest full checkpoint under --out gives back the weights, the
 * AdamW moments and the trainer's counts, and its trainer_state.json the batch step last
 * applied and the metrics of that update, with which its PolicyVersion is published again
 * (the crashed run may have written the version without the broker acknowledging it).
 */
#include "train.h"

#include "core/log.h"
#include "core/util.h"
#include "model/checkpoint.h"

#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double json_num(json_t *o, const char *k, double dflt)
{
    json_t *v = json_object_get(o, k);
    return json_is_number(v) ? json_number_value(v) : dflt;
}

/* Loads the newest full checkpoint under --out when there is one (--resume) and publishes its
 * version again. 0, 1 (nothing to resume), or -1 with errstr. */
int train_resume(train_worker *w, char *errstr, size_t errlen)
{
    char path[PATH_MAX + 64], e[512];
    int64_t step = 0;
    int r = al_checkpoint_latest(w->out_abs, path, sizeof path, &step, errstr, errlen);
    if (r <= 0) return r < 0 ? -1 : 1;
    al_checkpoint_info info;
    if (al_checkpoint_load(w->tr, path, &info, e, sizeof e) != 0)
        return al_err(errstr, errlen, "cannot resume from %s: %s", path, e), -1;
    char sp[PATH_MAX + 96];
    snprintf(sp, sizeof sp, "%s/trainer_state.json", path);
    json_error_t je;
    json_t *state = json_load_file(sp, 0, &je);
    json_t *m = state ? json_object_get(state, "metrics") : NULL;
    json_t *bs = m ? json_object_get(m, "batch_step") : NULL;
    json_t *mn = m ? json_object_get(m, "model") : NULL;
    if (!json_is_integer(bs)) {
        json_decref(state);
        return al_err(errstr, errlen, "%s has no metrics.batch_step: not written by arclight train", sp), -1;
    }
    if (json_is_string(mn) && strcmp(json_string_value(mn), w->o->model_name) != 0) {
        al_err(errstr, errlen, "%s is a checkpoint of model '%s', not '%s'", path,
               json_string_value(mn), w->o->model_name);
        json_decref(state);
        return -1;
    }
    w->version = info.step;
    w->last_full = info.step;
    w->batch_step = json_integer_value(bs);
    al_train_stats st = {0};
    st.loss = json_num(m, "loss", 0);
    st.pg_loss = json_num(m, "pg_loss", 0);
    st.kl = json_num(m, "kl", 0);
    st.entropy = json_num(m, "entropy", 0);
    st.clip_frac = json_num(m, "clip_fraction", 0);
    st.grad_norm = st.grad_norm_max = json_num(m, "grad_norm", 0);
    st.lr = json_num(m, "lr", 0);
    st.tokens_per_s = json_num(m, "tokens_per_s", 0);
    st.tokens = json_num(m, "trained_tokens", 0);
    st.step = info.optimizer_step;
    int64_t bpv = (int64_t)json_num(m, "batch_policy_version", -1);
    double rew = json_num(m, "reward_mean", NAN);
    char *dumped = json_dumps(m, JSON_COMPACT);
    snprintf(w->last_metrics, sizeof w->last_metrics, "%s", dumped ? dumped : "{}");
    free(dumped);
    json_decref(state);
    /* the crashed run may have written this version without its PolicyVersion reaching the
     * broker: send it again before consuming */
    if (train_version_publish(w, w->version, w->batch_step, info.weights_sha256, &st, rew, bpv,
                              NULL, errstr, errlen) != 0)
        return -1;
    if (al_producer_flush(al_stage_producer(&w->st), 30000, e, sizeof e) != 0)
        return al_err(errstr, errlen, "PolicyVersion %" PRId64 " of the resumed checkpoint: %s",
                      w->version, e), -1;
    al_log_info(COMP, "resumed %s at version %" PRId64 " (batch step %" PRId64 ", %" PRId64
                      " optimizer updates) from %s",
                w->o->model_name, w->version, w->batch_step, info.optimizer_step, path);
    return 0;
}

