/*
 * trainer.c: the training step (see trainer.h).
 */
#include "model/trainer.h"

#include "model/dist.h"
#include "model/logprob.h"
#include "text/json.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* A stretch of the parameter vector with one weight decay. */
typedef struct decay_seg {
    size_t off, count;
    float wd;
} decay_seg;

struct al_trainer {
    al_trainer_config cfg;
    al_model *policy;    /* borrowed */
    al_model *reference; /* borrowed, NULL without KL */
    al_adamw opt;
    al_dist *dist; /* borrowed; NULL: one replica */
    int V;
    decay_seg *segs;
    int nsegs;
    /* AdamW moments on the policy's backend: opt.m / opt.v themselves on the CPU; on a
     * device, copies kept in step with them (moments_at) */
    al_backend *mbe;
    float *dm, *dv;
    int moments_at; /* 1: host current, 2: backend current, 3: both */
    /* scratch, grown to the largest chunk */
    int cap_T;
    float *logp, *entropy, *dlogp, *dentropy; /* (cap_T) each */
};

/* Per-chunk arrays of a step, shifted onto the logits rows (row t predicts token t+1). */
typedef struct chunk_prep {
    float *mem;
    int32_t *targets, *positions; /* (T) */
    float *mask, *adv, *rollout;  /* (T); adv NULL for sft without advantages, rollout NULL */
    float *old, *ref;             /* (T) or NULL */
    int owner;                    /* the replica that runs it (dist.h) */
} chunk_prep;

static int tr_err(char *errstr, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static int tr_err(char *errstr, size_t errlen, const char *fmt, ...)
{
    if (errstr && errlen) {
        char msg[512];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        snprintf(errstr, errlen, "trainer: %s", msg);
    }
    return -1;
}

static double mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void al_trainer_config_default(al_trainer_config *cfg)
{
    memset(cfg, 0, sizeof *cfg);
    al_loss_config_default(&cfg->loss);
    al_optim_config_default(&cfg->optim);
    cfg->ppo_epochs = 1;
    cfg->mini_batches = 1;
    cfg->temperature = 1.0f;
    cfg->decay_1d = 0;
}

static int parse_float(const char *key, const char *v, float *out, char *errstr, size_t errlen)
{
    char *end;
    errno = 0;
    double d = strtod(v, &end);
    if (end == v || *end != '\0' || errno == ERANGE || !isfinite(d))
        return tr_err(errstr, errlen, "%s: '%s' is not a number", key, v);
    *out = (float)d;
    return 0;
}

static int parse_int(const char *key, const char *v, int64_t *out, char *errstr, size_t errlen)
{
    char *end;
    errno = 0;
    long long n = strtoll(v, &end, 10);
    if (end == v || *end != '\0' || errno == ERANGE) {
        /* 1e3 or 10.0 from a JSON number: accept an integral value. */
        double d = strtod(v, &end);
        if (end == v || *end != '\0' || d != floor(d) || fabs(d) > 9e15)
            return tr_err(errstr, errlen, "%s: '%s' is not an integer", key, v);
        n = (long long)d;
    }
    *out = n;
    return 0;
}

int al_trainer_config_set(al_trainer_config *cfg, const char *key, const char *value,
                          char *errstr, size_t errlen)
{
    static const struct {
        const char *key;
        size_t off;
    } floats[] = {
        {"eps_low", offsetof(al_trainer_config, loss.eps_low)},
        {"eps_high", offsetof(al_trainer_config, loss.eps_high)},
        {"dual_clip", offsetof(al_trainer_config, loss.dual_clip)},
        {"tis_cap", offsetof(al_trainer_config, loss.tis_cap)},
        {"kl_beta", offsetof(al_trainer_config, loss.kl_beta)},
        {"entropy_coef", offsetof(al_trainer_config, loss.entropy_coef)},
        {"temperature", offsetof(al_trainer_config, temperature)},
        {"lr", offsetof(al_trainer_config, optim.lr)},
        {"beta1", offsetof(al_trainer_config, optim.beta1)},
        {"beta2", offsetof(al_trainer_config, optim.beta2)},
        {"adam_eps", offsetof(al_trainer_config, optim.eps)},
        {"weight_decay", offsetof(al_trainer_config, optim.weight_decay)},
        {"grad_clip", offsetof(al_trainer_config, optim.grad_clip)},
        {"min_lr_ratio", offsetof(al_trainer_config, optim.min_lr_ratio)},
    };
    if (!key || !value) return tr_err(errstr, errlen, "setting without a name or value");
    for (size_t i = 0; i < sizeof floats / sizeof floats[0]; i++)
        if (strcmp(key, floats[i].key) == 0)
            return parse_float(key, value, (float *)((char *)cfg + floats[i].off), errstr, errlen);
    int64_t n;
    if (strcmp(key, "ppo_epochs") == 0 || strcmp(key, "mini_batches") == 0) {
        if (parse_int(key, value, &n, errstr, errlen)) return -1;
        if (n < 1 || n > 1000000)
            return tr_err(errstr, errlen, "%s must be between 1 and 1000000 (got %s)", key, value);
        *(key[0] == 'p' ? &cfg->ppo_epochs : &cfg->mini_batches) = (int)n;
        return 0;
    }
    if (strcmp(key, "warmup_steps") == 0) return parse_int(key, value, &cfg->optim.warmup_steps, errstr, errlen);
    if (strcmp(key, "total_steps") == 0) return parse_int(key, value, &cfg->optim.total_steps, errstr, errlen);
    if (strcmp(key, "decay_1d") == 0) {
        if (!strcmp(value, "1") || !strcmp(value, "true")) cfg->decay_1d = 1;
        else if (!strcmp(value, "0") || !strcmp(value, "false")) cfg->decay_1d = 0;
        else return tr_err(errstr, errlen, "decay_1d: '%s' is not 0, 1, true or false", value);
        return 0;
    }
    char sub[256];
    int rc = -2;
    if (strcmp(key, "loss") == 0) rc = al_loss_kind_parse(value, &cfg->loss.kind, sub, sizeof sub);
    else if (strcmp(key, "loss_agg") == 0) rc = al_loss_agg_parse(value, &cfg->loss.agg, sub, sizeof sub);
    else if (strcmp(key, "kl") == 0) rc = al_kl_kind_parse(value, &cfg->loss.kl, sub, sizeof sub);
    else if (strcmp(key, "lr_schedule") == 0)
        rc = al_lr_schedule_parse(value, &cfg->optim.schedule, sub, sizeof sub);
    if (rc == -1) return tr_err(errstr, errlen, "%s: %s", key, sub);
    if (rc == 0) return 0;
    return tr_err(errstr, errlen,
                  "unknown setting '%s' (known: loss, loss_agg, eps_low, eps_high, dual_clip, "
                  "tis_cap, kl, kl_beta, entropy_coef, ppo_epochs, mini_batches, temperature, "
                  "decay_1d, lr, beta1, beta2, adam_eps, weight_decay, grad_clip, lr_schedule, "
                  "warmup_steps, total_steps, min_lr_ratio)",
                  key);
}

int al_trainer_config_from_json(al_trainer_config *cfg, const char *text, size_t len,
                                int ignore_unknown, char *errstr, size_t errlen)
{
    char perr[256];
    al_json *root = al_json_parse(text, len, perr, sizeof perr);
    if (!root) return tr_err(errstr, errlen, "config: %s", perr);
    int rc = 0;
    if (root->type != AL_JSON_OBJECT) {
        rc = tr_err(errstr, errlen, "config: expected a JSON object");
        goto out;
    }
    for (size_t i = 0; i < root->count && rc == 0; i++) {
        const al_json *v = root->items[i];
        const char *key = root->keys[i];
        char buf[64];
        const char *text_v;
        switch (v->type) {
        case AL_JSON_STRING: text_v = v->string; break;
        case AL_JSON_TRUE: text_v = "true"; break;
        case AL_JSON_FALSE: text_v = "false"; break;
        case AL_JSON_NUMBER:
            if (v->is_integer) snprintf(buf, sizeof buf, "%lld", (long long)v->integer);
            else snprintf(buf, sizeof buf, "%.17g", v->number);
            text_v = buf;
            break;
        default:
            if (ignore_unknown) continue;
            rc = tr_err(errstr, errlen, "config: \"%s\" must be a string, number or boolean", key);
            continue;
        }
        char sub[512];
        if (al_trainer_config_set(cfg, key, text_v, sub, sizeof sub) != 0) {
            if (ignore_unknown && strstr(sub, "unknown setting")) continue;
            rc = tr_err(errstr, errlen, "config: %s", sub + (strncmp(sub, "trainer: ", 9) ? 0 : 9));
        }
    }
out:
    al_json_free(root);
    return rc;
}

static int seg_cmp(const void *a, const void *b)
{
    const decay_seg *x = a, *y = b;
    return x->off < y->off ? -1 : x->off > y->off;
}

/* Splits the parameter vector into stretches of equal weight decay: 1-D tensors (norm
 * weights, biases) get none unless decay_1d; everything else, including anything the tensor
 * table does not name, gets the configured decay. */
static int build_decay_segments(al_trainer *tr)
{
    size_t n = al_model_num_params(tr->policy);
    size_t nt = al_model_num_tensors(tr->policy);
    const al_model_tensor *tt = al_model_tensors(tr->policy);
    float wd = tr->cfg.optim.weight_decay;
    decay_seg *t = calloc(nt ? nt : 1, sizeof *t);
    tr->segs = calloc(2 * nt + 2, sizeof *tr->segs);
    if (!t || !tr->segs) {
        free(t);
        return -1;
    }
    for (size_t i = 0; i < nt; i++) {
        t[i].off = tt[i].offset;
        t[i].count = tt[i].numel;
        t[i].wd = (tt[i].ndim == 1 && !tr->cfg.decay_1d) ? 0.0f : wd;
    }
    qsort(t, nt, sizeof *t, seg_cmp);
    size_t pos = 0;
    int k = 0;
    for (size_t i = 0; i < nt && pos < n; i++) {
        size_t b = t[i].off, e = t[i].off + t[i].count;
        if (e > n) e = n;
        if (b < pos) b = pos; /* overlapping (shared) tensors: first one wins */
        if (b >= e) continue;
        if (b > pos) tr->segs[k++] = (decay_seg){pos, b - pos, wd};
        if (k > 0 && tr->segs[k - 1].wd == t[i].wd && tr->segs[k - 1].off + tr->segs[k - 1].count == b)
            tr->segs[k - 1].count += e - b;
        else
            tr->segs[k++] = (decay_seg){b, e - b, t[i].wd};
        pos = e;
    }
    if (pos < n) tr->segs[k++] = (decay_seg){pos, n - pos, wd};
    tr->nsegs = k;
    free(t);
    return 0;
}

al_trainer *al_trainer_new(al_model *policy, al_model *reference, const al_trainer_config *cfg,
                           char *errstr, size_t errlen)
{
    if (!policy) {
        tr_err(errstr, errlen, "no policy model");
        return NULL;
    }
    if (al_loss_config_check(&cfg->loss, errstr, errlen) != 0) return NULL;
    if (cfg->ppo_epochs < 1) {
        tr_err(errstr, errlen, "ppo_epochs must be >= 1 (got %d)", cfg->ppo_epochs);
        return NULL;
    }
    if (cfg->mini_batches < 1) {
        tr_err(errstr, errlen, "mini_batches must be >= 1 (got %d)", cfg->mini_batches);
        return NULL;
    }
    if (!(cfg->temperature > 0.0f) || !isfinite(cfg->temperature)) {
        tr_err(errstr, errlen, "temperature must be > 0 (got %g)", (double)cfg->temperature);
        return NULL;
    }
    const al_model_config *pc = al_model_config_of(policy);
    if (cfg->loss.kl_beta > 0.0f) {
        if (!reference) {
            tr_err(errstr, errlen, "kl_beta > 0 needs a reference model");
            return NULL;
        }
        const al_model_config *rc = al_model_config_of(reference);
        if (al_model_num_params(reference) != al_model_num_params(policy) ||
            rc->vocab_size != pc->vocab_size) {
            tr_err(errstr, errlen, "the reference model's shape differs from the policy's");
            return NULL;
        }
    }
    al_trainer *tr = calloc(1, sizeof *tr);
    if (!tr) {
        tr_err(errstr, errlen, "out of memory");
        return NULL;
    }
    tr->cfg = *cfg;
    tr->policy = policy;
    tr->reference = cfg->loss.kl_beta > 0.0f ? reference : NULL;
    tr->V = pc->vocab_size;
    if (al_adamw_init(&tr->opt, &cfg->optim, al_model_num_params(policy), errstr, errlen) != 0) {
        free(tr);
        return NULL;
    }
    if (build_decay_segments(tr) != 0) {
        tr_err(errstr, errlen, "out of memory");
        al_trainer_free(tr);
        return NULL;
    }
    return tr;
}

/* The moments on the policy's backend, current. 0, or -1 when out of device memory. */
static int moments_to_backend(al_trainer *tr)
{
    al_backend *b = al_model_backend(tr->policy);
    if (b->ops->host_memory && b->ops->act_bytes == sizeof(float)) {
        if (tr->mbe && tr->mbe != b) tr->mbe->ops->free(tr->mbe, tr->dm), tr->mbe->ops->free(tr->mbe, tr->dv);
        tr->mbe = b, tr->dm = tr->opt.m, tr->dv = tr->opt.v, tr->moments_at = 3;
        return 0;
    }
    size_t bytes = sizeof(float) * tr->opt.n;
    if (tr->mbe != b) {
        if (tr->mbe && tr->dm != tr->opt.m) tr->mbe->ops->free(tr->mbe, tr->dm), tr->mbe->ops->free(tr->mbe, tr->dv);
        tr->dm = b->ops->alloc(b, bytes);
        tr->dv = b->ops->alloc(b, bytes);
        tr->mbe = b;
        if (!tr->dm || !tr->dv) {
            b->ops->free(b, tr->dm), b->ops->free(b, tr->dv);
            tr->dm = tr->dv = NULL, tr->mbe = NULL;
            return -1;
        }
        tr->moments_at = 1;
    }
    if (!(tr->moments_at & 2)) {
        b->ops->upload(b, tr->dm, tr->opt.m, bytes);
        b->ops->upload(b, tr->dv, tr->opt.v, bytes);
        tr->moments_at = 3;
    }
    return 0;
}

void al_trainer_free(al_trainer *tr)
{
    if (!tr) return;
    if (tr->mbe && tr->dm != tr->opt.m) {
        tr->mbe->ops->free(tr->mbe, tr->dm);
        tr->mbe->ops->free(tr->mbe, tr->dv);
    }
    al_adamw_free(&tr->opt);
    free(tr->segs);
    free(tr->logp);
    free(tr->entropy);
    free(tr->dlogp);
    free(tr->dentropy);
    free(tr);
}

al_model *al_trainer_clone_model(al_model *m, char *errstr, size_t errlen)
{
    al_model *c = al_model_new(al_model_config_of(m), errstr, errlen);
    if (!c) return NULL;
    memcpy(al_model_params(c), al_model_params(m), sizeof(float) * al_model_num_params(m));
    return c;
}

al_model *al_trainer_policy(al_trainer *tr)
{
    return tr->policy;
}

int al_trainer_set_dist(al_trainer *tr, al_dist *d, char *errstr, size_t errlen)
{
    tr->dist = d;
    if (al_dist_world(d) == 1) return 0;
    /* everyone starts from rank 0's weights, moments and step */
    al_model *m = tr->policy;
    if (moments_to_backend(tr))
        return tr_err(errstr, errlen, "out of %s memory for the optimizer's moments",
                      al_model_backend(m)->ops->name);
    al_dist_broadcast(d, al_model_backend_params(m), al_model_num_params(m), 0);
    al_model_backend_params_changed(m);
    al_dist_broadcast(d, tr->dm, tr->opt.n, 0);
    al_dist_broadcast(d, tr->dv, tr->opt.n, 0);
    if (tr->dm != tr->opt.m) tr->moments_at = 2;
    double step = (double)tr->opt.step;
    al_dist_allreduce_host(d, &step, 1, 1); /* rank 0's is the largest after a resume */
    tr->opt.step = (int64_t)step;
    return 0;
}

const al_adamw *al_trainer_optimizer_read(al_trainer *tr)
{
    if (tr->mbe && tr->dm != tr->opt.m && !(tr->moments_at & 1)) {
        size_t bytes = sizeof(float) * tr->opt.n;
        tr->mbe->ops->download(tr->mbe, tr->opt.m, tr->dm, bytes);
        tr->mbe->ops->download(tr->mbe, tr->opt.v, tr->dv, bytes);
        tr->moments_at = 3;
    }
    return &tr->opt;
}

al_adamw *al_trainer_optimizer(al_trainer *tr)
{
    /* on a device, the moments come down first; the caller may write them (a checkpoint
     * being loaded), so the device's copies count as stale after */
    if (tr->mbe && tr->dm != tr->opt.m) {
        if (!(tr->moments_at & 1)) {
            size_t bytes = sizeof(float) * tr->opt.n;
            tr->mbe->ops->download(tr->mbe, tr->opt.m, tr->dm, bytes);
            tr->mbe->ops->download(tr->mbe, tr->opt.v, tr->dv, bytes);
        }
        tr->moments_at = 1;
    }
    return &tr->opt;
}

const al_trainer_config *al_trainer_config_of(const al_trainer *tr)
{
    return &tr->cfg;
}

static int ensure_scratch(al_trainer *tr, int T)
{
    if (T <= tr->cap_T) return 0;
    float **bufs[4] = {&tr->logp, &tr->entropy, &tr->dlogp, &tr->dentropy};
    for (int i = 0; i < 4; i++) {
        float *b = realloc(*bufs[i], sizeof(float) * (size_t)T);
        if (!b) return -1;
        *bufs[i] = b;
    }
    tr->cap_T = T;
    return 0;
}

/* Checks one chunk before anything runs, so that a bad chunk fails the step before any
 * update. */
static int chunk_check(const al_trainer *tr, const al_train_chunk *c, int i, char *errstr,
                       size_t errlen)
{
    if (c->T <= 0 || c->nseq <= 0)
        return tr_err(errstr, errlen, "chunk %d is empty (T=%d, nseq=%d)", i, c->T, c->nseq);
    if (!c->tokens || !c->cu_seqlens || !c->mask)
        return tr_err(errstr, errlen, "chunk %d lacks %s", i,
                      !c->tokens ? "tokens" : !c->cu_seqlens ? "cu_seqlens" : "a mask");
    if (!c->adv && tr->cfg.loss.kind != AL_LOSS_SFT)
        return tr_err(errstr, errlen, "chunk %d lacks advantages (needed by the %s loss)", i,
                      al_loss_kind_name(tr->cfg.loss.kind));
    if (c->cu_seqlens[0] != 0 || c->cu_seqlens[c->nseq] != c->T)
        return tr_err(errstr, errlen, "chunk %d: cu_seqlens must run from 0 to T=%d (got %d..%d)",
                      i, c->T, (int)c->cu_seqlens[0], (int)c->cu_seqlens[c->nseq]);
    for (int s = 0; s < c->nseq; s++)
        if (c->cu_seqlens[s + 1] < c->cu_seqlens[s])
            return tr_err(errstr, errlen, "chunk %d: cu_seqlens decreases at sequence %d", i, s);
    for (int t = 0; t < c->T; t++) {
        if (c->tokens[t] < 0 || c->tokens[t] >= tr->V)
            return tr_err(errstr, errlen,
                          "chunk %d: token %d at position %d is outside the vocabulary (%d)", i,
                          (int)c->tokens[t], t, tr->V);
        if (!isfinite(c->mask[t]) || (c->adv && !isfinite(c->adv[t])) ||
            (c->rollout_logp && !isfinite(c->rollout_logp[t])))
            return tr_err(errstr, errlen, "chunk %d: non-finite mask, advantage or logprob at %d",
                          i, t);
    }
    return 0;
}

/* Builds the shifted per-row arrays of a chunk. */
static int chunk_prepare(const al_trainer *tr, const al_train_chunk *c, chunk_prep *p,
                         int need_old)
{
    int T = c->T;
    int nf = 2 + (c->rollout_logp ? 1 : 0) + (need_old ? 1 : 0) + (tr->reference ? 1 : 0);
    memset(p, 0, sizeof *p);
    p->mem = malloc(sizeof(float) * (size_t)T * (size_t)(nf + 2));
    if (!p->mem) return -1;
    float *f = p->mem;
    p->targets = (int32_t *)f, f += T;
    p->positions = (int32_t *)f, f += T;
    p->mask = f, f += T;
    p->adv = f, f += T;
    if (c->rollout_logp) p->rollout = f, f += T;
    if (need_old) p->old = f, f += T;
    if (tr->reference) p->ref = f, f += T;
    for (int s = 0; s < c->nseq; s++) {
        int b = c->cu_seqlens[s], e = c->cu_seqlens[s + 1];
        for (int t = b; t < e; t++) {
            int last = t + 1 >= e;
            p->positions[t] = c->positions ? c->positions[t] : t - b;
            p->targets[t] = last ? -1 : c->tokens[t + 1];
            p->mask[t] = last ? 0.0f : c->mask[t + 1];
            p->adv[t] = (last || !c->adv) ? 0.0f : c->adv[t + 1];
            if (p->rollout) p->rollout[t] = last ? 0.0f : c->rollout_logp[t + 1];
        }
    }
    return 0;
}

/* Logprobs of the targets under `m` for one chunk, into out (T). */
static int chunk_logprobs(al_trainer *tr, al_model *m, const al_train_chunk *c,
                          const chunk_prep *p, float *out, char *errstr, size_t errlen)
{
    if (al_model_forward_logprob(m, c->tokens, p->positions, c->cu_seqlens, c->nseq, c->T,
                                 p->targets, tr->cfg.temperature, out, NULL))
        return tr_err(errstr, errlen, "%s", al_model_error(m));
    return 0;
}

static void update_params(al_trainer *tr, double lr)
{
    for (int i = 0; i < tr->nsegs; i++) {
        al_adamw_args a = al_adamw_args_at(&tr->opt, lr, tr->segs[i].wd);
        al_model_adamw_range(tr->policy, tr->dm, tr->dv, tr->segs[i].off, tr->segs[i].count, &a);
    }
    if (tr->dm != tr->opt.m) tr->moments_at = 2;
    al_adamw_step_done(&tr->opt);
}

int al_trainer_step(al_trainer *tr, const al_train_chunk *chunks, int nchunks,
                    al_train_stats *out, char *errstr, size_t errlen)
{
    const al_trainer_config *cfg = &tr->cfg;
    memset(out, 0, sizeof *out);
    if (nchunks <= 0 || !chunks) return tr_err(errstr, errlen, "a step needs at least one chunk");
    int mb = cfg->mini_batches < nchunks ? cfg->mini_batches : nchunks;
    int updates = cfg->ppo_epochs * mb;
    int need_old = updates > 1;
    int maxT = 0;
    for (int i = 0; i < nchunks; i++) {
        if (chunk_check(tr, &chunks[i], i, errstr, errlen)) return -1;
        if (chunks[i].T > maxT) maxT = chunks[i].T;
    }
    double t0 = mono_s();
    if (ensure_scratch(tr, maxT)) return tr_err(errstr, errlen, "out of memory for %d tokens", maxT);
    if (moments_to_backend(tr))
        return tr_err(errstr, errlen, "out of %s memory for the optimizer's moments",
                      al_model_backend(tr->policy)->ops->name);
    chunk_prep *prep = calloc((size_t)nchunks, sizeof *prep);
    if (!prep) return tr_err(errstr, errlen, "out of memory");
    int rc = -1;
    for (int i = 0; i < nchunks; i++)
        if (chunk_prepare(tr, &chunks[i], &prep[i], need_old)) {
            tr_err(errstr, errlen, "out of memory");
            goto done;
        }

    /* Which replica runs each chunk: chunk i of its mini-batch goes to replica i mod world. */
    int world = al_dist_world(tr->dist), rank = al_dist_rank(tr->dist);
    for (int g = 0; g < mb; g++)
        for (int i = (int)((long)g * nchunks / mb); i < (int)((long)(g + 1) * nchunks / mb); i++)
            prep[i].owner = (i - (int)((long)g * nchunks / mb)) % world;

    /* Old and reference logprobs: once per step, before any update. */
    for (int i = 0; i < nchunks; i++) {
        if (prep[i].owner != rank) continue;
        if (need_old && chunk_logprobs(tr, tr->policy, &chunks[i], &prep[i], prep[i].old, errstr, errlen))
            goto done;
        if (tr->reference &&
            chunk_logprobs(tr, tr->reference, &chunks[i], &prep[i], prep[i].ref, errstr, errlen))
            goto done;
    }

    al_loss_stats st;
    al_loss_stats_init(&st);
    double loss_sum = 0.0, gn_sum = 0.0, gn_max = 0.0, lr = 0.0;
    for (int ep = 0; ep < cfg->ppo_epochs; ep++) {
        for (int g = 0; g < mb; g++) {
            int cb = (int)((long)g * nchunks / mb), ce = (int)((long)(g + 1) * nchunks / mb);
            double norm = 0.0;
            al_loss_input in[1];
            for (int i = cb; i < ce; i++) {
                in->T = chunks[i].T;
                in->nseq = chunks[i].nseq;
                in->cu_seqlens = chunks[i].cu_seqlens;
                in->mask = prep[i].mask;
                norm += al_loss_local_norm(&cfg->loss, in);
            }
            al_model_zero_grad(tr->policy);
            double update_loss = 0.0;
            for (int i = cb; i < ce; i++) {
                const al_train_chunk *c = &chunks[i];
                chunk_prep *p = &prep[i];
                if (p->owner != rank) continue;
                if (al_model_forward_logprob(tr->policy, c->tokens, p->positions, c->cu_seqlens,
                                             c->nseq, c->T, p->targets, cfg->temperature,
                                             tr->logp, tr->entropy)) {
                    tr_err(errstr, errlen, "%s", al_model_error(tr->policy));
                    goto done;
                }
                al_loss_input li = {.T = c->T,
                                    .nseq = c->nseq,
                                    .cu_seqlens = c->cu_seqlens,
                                    .logp = tr->logp,
                                    .old_logp = p->old,
                                    .rollout_logp = p->rollout,
                                    .ref_logp = p->ref,
                                    .entropy = tr->entropy,
                                    .adv = p->adv,
                                    .mask = p->mask};
                double l;
                if (al_loss_compute(&cfg->loss, &li, norm, &l, tr->dlogp, tr->dentropy, &st,
                                    errstr, errlen))
                    goto done;
                update_loss += l;
                if (al_model_backward_logprob(tr->policy, tr->dlogp,
                                              cfg->loss.entropy_coef != 0.0f ? tr->dentropy
                                                                              : NULL)) {
                    tr_err(errstr, errlen, "%s", al_model_error(tr->policy));
                    goto done;
                }
            }
            if (world > 1) { /* every replica's share of the mini-batch, summed */
                al_dist_allreduce(tr->dist, al_model_backend_grads(tr->policy),
                                  al_model_num_params(tr->policy));
                al_dist_allreduce_host(tr->dist, &update_loss, 1, 0);
            }
            double gn = al_model_clip_grads(tr->policy, cfg->optim.grad_clip);
            if (!isfinite(update_loss) || !isfinite(gn)) {
                tr_err(errstr, errlen,
                       "non-finite %s at update %d of the step (loss %g, grad norm %g); no update "
                       "applied",
                       isfinite(update_loss) ? "gradient norm" : "loss", ep * mb + g, update_loss,
                       gn);
                goto done;
            }
            lr = al_lr_at(&tr->opt.cfg, tr->opt.step);
            update_params(tr, lr);
            loss_sum += update_loss;
            gn_sum += gn;
            if (gn > gn_max) gn_max = gn;
        }
    }
    if (world > 1) {
        double sums[10] = {st.loss,      st.tokens,    st.seqs,    st.sum_pg,        st.sum_kl,
                           st.sum_entropy, st.sum_ratio, st.sum_clipped, st.sum_dual_clipped,
                           st.sum_tis};
        al_dist_allreduce_host(tr->dist, sums, 10, 0);
        al_dist_allreduce_host(tr->dist, &st.ratio_max, 1, 1);
        st.loss = sums[0], st.tokens = sums[1], st.seqs = sums[2], st.sum_pg = sums[3];
        st.sum_kl = sums[4], st.sum_entropy = sums[5], st.sum_ratio = sums[6];
        st.sum_clipped = sums[7], st.sum_dual_clipped = sums[8], st.sum_tis = sums[9];
    }
    al_loss_stats_finish(&st);
    out->step = tr->opt.step;
    out->updates = updates;
    out->loss = loss_sum / updates;
    out->pg_loss = st.pg_loss;
    out->kl = st.kl;
    out->entropy = st.entropy;
    out->clip_frac = st.clip_frac;
    out->dual_clip_frac = st.dual_clip_frac;
    out->ratio_mean = st.ratio_mean;
    out->ratio_max = st.ratio_max;
    out->tis_mean = st.tis_mean;
    out->grad_norm = gn_sum / updates;
    out->grad_norm_max = gn_max;
    out->lr = lr;
    out->tokens = st.tokens / cfg->ppo_epochs;
    out->seqs = st.seqs / cfg->ppo_epochs;
    for (int i = 0; i < nchunks; i++) out->step_tokens += chunks[i].T;
    out->seconds = mono_s() - t0;
    out->tokens_per_s =
        out->seconds > 0 ? (double)out->step_tokens * cfg->ppo_epochs / out->seconds : 0.0;
    rc = 0;
done:
    for (int i = 0; i < nchunks; i++) free(prep[i].mem);
    free(prep);
    return rc;
}
