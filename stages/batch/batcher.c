/*
 * batcher.c: group-preserving step assembly, staleness, whitening, sequence packing and
 * chunking (see batcher.h). No Kafka, no clock: the caller passes time in.
 */
#include "batcher.h"

#include "core/hash.h"
#include "core/util.h"
#include "core/vec.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ID_BYTES 1024
#define MAX_MODEL_BYTES 256
/* Per-chunk bytes besides its micro-batches: header (10), model name and its length, eight
 * longs and ints (<= 60), the array's block count and terminator (<= 6); rounded up. */
#define CHUNK_FIXED_BYTES(model_len) (128 + (int64_t)(model_len))

/* ---- duplicate window: FIFO ring of id hashes + linear-probing set ----------------------- */

/* The window holds a million ids by default and is asked once per transition on the hot path:
 * it keeps 8-byte hashes in an open-addressing table and a ring (24 MB for a million, nothing
 * allocated per id) rather than the ids themselves in core's al_map (a malloc'd entry holding
 * a copy of each id: some 100 MB for a million, and a malloc and a free per transition). */

typedef struct dedup {
    uint64_t *table; /* 0: empty */
    size_t mask;
    uint64_t *ring;
    size_t cap, head, len;
} dedup;

/* An id's hash for the window: FNV-1a mixed (its low bits index the table), never 0 (the
 * table's empty slot). */
static uint64_t id_hash(const char *s)
{
    uint64_t h = al_hash_mix(al_hash_str(s));
    return h ? h : 1;
}

static int dedup_init(dedup *d, size_t window)
{
    memset(d, 0, sizeof *d);
    if (window == 0) return 0;
    size_t n = 16;
    while (n < 2 * window) n <<= 1;
    d->table = calloc(n, sizeof *d->table);
    d->ring = malloc(window * sizeof *d->ring);
    if (!d->table || !d->ring) return -1;
    d->mask = n - 1;
    d->cap = window;
    return 0;
}

static void dedup_free(dedup *d)
{
    free(d->table);
    free(d->ring);
}

static int dedup_contains(const dedup *d, uint64_t h)
{
    if (!d->cap) return 0;
    for (size_t i = h & d->mask; d->table[i]; i = (i + 1) & d->mask)
        if (d->table[i] == h) return 1;
    return 0;
}

/* Removes h (present) with backward-shift deletion, so that no tombstones accumulate. */
static void dedup_remove(dedup *d, uint64_t h)
{
    size_t i = h & d->mask;
    while (d->table[i] != h) {
        if (!d->table[i]) return;
        i = (i + 1) & d->mask;
    }
    size_t j = i;
    for (;;) {
        j = (j + 1) & d->mask;
        if (!d->table[j]) break;
        size_t home = d->table[j] & d->mask;
        /* move table[j] into the hole at i when its home is not in (i, j] cyclically */
        int in_range = i <= j ? (home > i && home <= j) : (home > i || home <= j);
        if (!in_range) {
            d->table[i] = d->table[j];
            i = j;
        }
    }
    d->table[i] = 0;
}

static void dedup_insert(dedup *d, uint64_t h)
{
    if (!d->cap || dedup_contains(d, h)) return;
    if (d->len == d->cap) {
        dedup_remove(d, d->ring[d->head]);
        d->ring[d->head] = h;
        d->head = (d->head + 1) % d->cap;
    } else {
        d->ring[(d->head + d->len) % d->cap] = h;
        d->len++;
    }
    size_t i = h & d->mask;
    while (d->table[i]) i = (i + 1) & d->mask;
    d->table[i] = h;
}

/* ---- state ----------------------------------------------------------------------------- */

typedef struct seq {
    char *id;
    int64_t n_tokens, n_loss;
    int32_t *tokens;
    uint8_t *mask;
    float *logp, *adv;
    float reward;
    int64_t policy_version;
    void *opaque;
} seq;

typedef struct group {
    int model;
    char *group_id;
    int32_t group_size;
    int32_t lane;
    int64_t last_us;
    seq **seqs;
    size_t n_seqs, cap_seqs;
    int64_t n_tokens;
    /* distinct rollouts seen, up to group_size (for the lane rule) */
    char **rollouts;
    int32_t *attempts;
    size_t n_rollouts, cap_rollouts;
} group;

typedef struct model {
    char *name;
    int64_t next_step;
    int64_t policy_version; /* -1: none seen */
    group **queue;          /* closed groups in closing order */
    size_t n_queue, cap_queue;
    int64_t queued_seqs, queued_tokens;
} model;

/* Micro-batch arrays of one step, laid out in one allocation per array kind. */
typedef struct step_build {
    al_micro_batch *mbs;
    int32_t *tokens, *positions, *cu;
    uint8_t *mask;
    float *logp, *adv, *rewards;
    const char **ids;
    int64_t *versions;
    int64_t *mb_bytes;
    size_t cap_tokens, cap_seqs, cap_mbs; /* grow-only: reused from step to step */
} step_build;

/* Makes sb hold T tokens, n sequences and nb micro-batches. 0, or -1 out of memory (sb
 * stays valid). Reusing the arrays keeps large steps off mmap/munmap and page faults. */
static int step_build_reserve(step_build *sb, size_t T, size_t n, size_t nb)
{
#define SB_GROW(field, count, cap)                                                               \
    do {                                                                                         \
        void *q_ = realloc(sb->field, (count) * sizeof *sb->field);                              \
        if (!q_) return -1;                                                                      \
        sb->field = q_;                                                                          \
    } while (0)
    T = T ? T : 1;
    n = n ? n : 1;
    nb = nb ? nb : 1;
    if (T > sb->cap_tokens) {
        size_t c = T + T / 4;
        SB_GROW(tokens, c, cap);
        SB_GROW(positions, c, cap);
        SB_GROW(mask, c, cap);
        SB_GROW(logp, c, cap);
        SB_GROW(adv, c, cap);
        sb->cap_tokens = c;
    }
    if (n + nb + 1 > sb->cap_seqs) {
        size_t c = (n + nb + 1) + (n + nb + 1) / 4;
        SB_GROW(cu, c, cap);
        SB_GROW(rewards, c, cap);
        SB_GROW(ids, c, cap);
        SB_GROW(versions, c, cap);
        sb->cap_seqs = c;
    }
    if (nb > sb->cap_mbs) {
        size_t c = nb + nb / 4;
        SB_GROW(mbs, c, cap);
        SB_GROW(mb_bytes, c, cap);
        sb->cap_mbs = c;
    }
    memset(sb->mbs, 0, nb * sizeof *sb->mbs);
    return 0;
#undef SB_GROW
}



static void step_build_free(step_build *sb)
{
    free(sb->mbs);
    free(sb->tokens);
    free(sb->positions);
    free(sb->cu);
    free(sb->mask);
    free(sb->logp);
    free(sb->adv);
    free(sb->rewards);
    free(sb->ids);
    free(sb->versions);
    free(sb->mb_bytes);
}

struct al_batcher {
    al_batch_config cfg;
    step_build sb;
    dedup seen;
    model *models;
    size_t n_models, cap_models;
    group **open;
    size_t n_open, cap_open;
    group **lanes; /* lanes[lane]: the open group that last received a transition there */
    size_t n_lanes, cap_lanes;
    al_batcher_stats stats;
};

static void seq_free(seq *s)
{
    if (!s) return;
    free(s->id);
    free(s->tokens);
    free(s->mask);
    free(s->logp);
    free(s->adv);
    free(s);
}

static void group_free(group *g, int free_seqs)
{
    if (!g) return;
    if (free_seqs)
        for (size_t i = 0; i < g->n_seqs; i++) seq_free(g->seqs[i]);
    for (size_t i = 0; i < g->n_rollouts; i++) free(g->rollouts[i]);
    free(g->rollouts);
    free(g->attempts);
    free(g->seqs);
    free(g->group_id);
    free(g);
}

void al_batch_config_default(al_batch_config *c)
{
    memset(c, 0, sizeof *c);
    c->step_sequences = 64;
    c->micro_batch_tokens = 16384;
    c->max_message_bytes = 1048576 - 65536;
    c->max_staleness = 4;
    c->stale_policy = AL_BATCH_STALE_DROP;
    c->dedup_window = 1000000;
}

int64_t al_batch_micro_batch_bytes(int64_t n_tokens, int64_t n_sequences, int64_t id_bytes)
{
    /* 17 bytes per token (ids, mask, positions, logprobs, advantages); per sequence a
     * cu_seqlens entry, a reward, a policy version (<= 10) and an id's length prefix (<= 5);
     * per micro-batch its index, seven length prefixes and two block terminators. */
    return 17 * n_tokens + (4 + 4 + 10 + 5) * n_sequences + id_bytes + 4 + 10 + 7 * 5 + 2 + 10;
}

al_batcher *al_batcher_new(const al_batch_config *cfg, char *errstr, size_t errlen)
{
    int targets = (cfg->step_sequences > 0) + (cfg->step_tokens > 0) + (cfg->step_groups > 0);
    if (cfg->step_sequences < 0 || cfg->step_tokens < 0 || cfg->step_groups < 0 || !targets) {
        al_err(errstr, errlen,
               "batch: a step needs a positive target: step sequences, tokens or groups");
        return NULL;
    }
    if (targets > 1) {
        al_err(errstr, errlen,
               "batch: give a step target in sequences, in tokens or in groups, only one");
        return NULL;
    }
    if (cfg->micro_batch_tokens < 2 || cfg->micro_batch_tokens > INT32_MAX / 2) {
        al_err(errstr, errlen, "batch: micro-batch budget %lld tokens is out of range (2 .. %d)",
               (long long)cfg->micro_batch_tokens, INT32_MAX / 2);
        return NULL;
    }
    /* One micro-batch of the full budget holding a single sequence must fit a message. */
    int64_t need = al_batch_micro_batch_bytes(cfg->micro_batch_tokens, 1, MAX_ID_BYTES) +
                   CHUNK_FIXED_BYTES(MAX_MODEL_BYTES);
    if (cfg->max_message_bytes < need) {
        al_err(errstr, errlen,
               "batch: a micro-batch of %lld tokens needs up to %lld bytes but messages are "
               "limited to %lld bytes; lower the micro-batch budget or raise the limit",
               (long long)cfg->micro_batch_tokens, (long long)need,
               (long long)cfg->max_message_bytes);
        return NULL;
    }
    if (cfg->max_staleness < -1) {
        al_err(errstr, errlen, "batch: max staleness %lld is negative (use -1 for no bound)",
               (long long)cfg->max_staleness);
        return NULL;
    }
    al_batcher *b = calloc(1, sizeof *b);
    if (!b || dedup_init(&b->seen, cfg->dedup_window) != 0) {
        if (b) dedup_free(&b->seen);
        free(b);
        al_err(errstr, errlen, "batch: out of memory (duplicate window of %zu ids)",
               cfg->dedup_window);
        return NULL;
    }
    b->cfg = *cfg;
    return b;
}

void al_batcher_free(al_batcher *b)
{
    if (!b) return;
    for (size_t i = 0; i < b->n_open; i++) group_free(b->open[i], 1);
    free(b->open);
    for (size_t m = 0; m < b->n_models; m++) {
        for (size_t i = 0; i < b->models[m].n_queue; i++) group_free(b->models[m].queue[i], 1);
        free(b->models[m].queue);
        free(b->models[m].name);
    }
    free(b->models);
    free(b->lanes);
    step_build_free(&b->sb);
    dedup_free(&b->seen);
    free(b);
}

void al_batch_step_free(al_batch_step *s)
{
    if (!s) return;
    for (size_t i = 0; i < s->n_chunks; i++) al_buf_free(&s->chunks[i]);
    free(s->chunks);
    free(s->opaques);
    free(s->lags);
    free(s->model);
    free(s);
}

static int model_find(const al_batcher *b, const char *name)
{
    for (size_t i = 0; i < b->n_models; i++)
        if (strcmp(b->models[i].name, name) == 0) return (int)i;
    return -1;
}

static int model_get(al_batcher *b, const char *name)
{
    int m = model_find(b, name);
    if (m >= 0) return m;
    if (al_vec_grow((void **)&b->models, &b->cap_models, b->n_models + 1, sizeof *b->models))
        return -1;
    model *md = &b->models[b->n_models];
    memset(md, 0, sizeof *md);
    if (!(md->name = strdup(name))) return -1;
    md->policy_version = -1;
    return (int)b->n_models++;
}

int al_batcher_set_policy_version(al_batcher *b, const char *model_name, int64_t version)
{
    int m = model_get(b, model_name);
    if (m < 0) return -1;
    if (version > b->models[m].policy_version) b->models[m].policy_version = version;
    return 0;
}

int al_batcher_set_next_step(al_batcher *b, const char *model_name, int64_t step)
{
    if (step < 0 || step > AL_STEP_MAX) return -1;
    int m = model_get(b, model_name);
    if (m < 0) return -1;
    b->models[m].next_step = step;
    return 0;
}

int64_t al_batcher_next_step_number(const al_batcher *b, const char *model_name)
{
    int m = model_find(b, model_name);
    return m < 0 ? 0 : b->models[m].next_step;
}

void al_batcher_mark_seen(al_batcher *b, const char *id)
{
    dedup_insert(&b->seen, id_hash(id));
}

void al_batcher_get_stats(const al_batcher *b, al_batcher_stats *out)
{
    *out = b->stats;
    out->open_groups = (int64_t)b->n_open;
    out->queued_groups = out->queued_sequences = 0;
    for (size_t m = 0; m < b->n_models; m++) {
        out->queued_groups += (int64_t)b->models[m].n_queue;
        out->queued_sequences += b->models[m].queued_seqs;
    }
}

/* ---- adding ---------------------------------------------------------------------------- */

static int finite_all(const float *v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!isfinite(v[i])) return 0;
    return 1;
}

/* Names what makes t unusable, or NULL. */
static const char *transition_problem(const al_batcher *b, const al_transition *t, char *buf,
                                      size_t buflen)
{
    size_t nr = t->n_response_tokens, np = t->n_prompt_tokens;
    if (!t->id || !*t->id) return "the transition id is empty";
    if (strlen(t->id) > MAX_ID_BYTES) return "the transition id is longer than 1024 bytes";
    if (!t->model || !*t->model) return "the model name is empty";
    if (strlen(t->model) > MAX_MODEL_BYTES) return "the model name is longer than 256 bytes";
    if (!t->group_id || !*t->group_id) return "the group id is empty";
    if (nr == 0) return "the transition has no response tokens";
    if ((int64_t)(np + nr) > b->cfg.micro_batch_tokens) {
        snprintf(buf, buflen,
                 "the sequence has %zu tokens (%zu prompt + %zu response), over the micro-batch "
                 "budget of %lld tokens",
                 np + nr, np, nr, (long long)b->cfg.micro_batch_tokens);
        return buf;
    }
    if (t->n_loss_mask && t->n_loss_mask != nr) return "loss_mask length differs from the response length";
    if (t->n_rollout_logprobs && t->n_rollout_logprobs != nr)
        return "rollout_logprobs length differs from the response length";
    if (t->n_token_advantages && t->n_token_advantages != nr)
        return "token_advantages length differs from the response length";
    for (size_t i = 0; i < t->n_loss_mask; i++)
        if (t->loss_mask[i] > 1) return "loss_mask holds a value other than 0 or 1";
    for (size_t i = 0; i < np; i++)
        if (t->prompt_token_ids[i] < 0) return "a prompt token id is negative";
    for (size_t i = 0; i < nr; i++)
        if (t->response_token_ids[i] < 0) return "a response token id is negative";
    /* both travel to the trainer as 32-bit floats */
    if (!(fabs(t->advantage) <= FLT_MAX)) return "the advantage is not a finite 32-bit float";
    if (!(fabs(t->reward) <= FLT_MAX)) return "the reward is not a finite 32-bit float";
    if (!finite_all(t->token_advantages, t->n_token_advantages)) return "a token advantage is not finite";
    if (!finite_all(t->rollout_logprobs, t->n_rollout_logprobs)) return "a rollout logprob is not finite";
    if (t->policy_version < -1) return "the policy version is below -1";
    return NULL;
}

/* Copies t into a packed sequence: prompt then response, loss only on the masked response
 * tokens (never on the first token, which nothing predicts). */
static seq *seq_from_transition(const al_transition *t, void *opaque)
{
    size_t np = t->n_prompt_tokens, nr = t->n_response_tokens, L = np + nr;
    seq *s = calloc(1, sizeof *s);
    if (!s) return NULL;
    s->id = strdup(t->id);
    s->tokens = malloc(L * sizeof *s->tokens);
    s->mask = calloc(L, 1);
    s->logp = calloc(L, sizeof *s->logp);
    s->adv = calloc(L, sizeof *s->adv);
    if (!s->id || !s->tokens || !s->mask || !s->logp || !s->adv) {
        seq_free(s);
        return NULL;
    }
    if (np) memcpy(s->tokens, t->prompt_token_ids, np * sizeof *s->tokens);
    memcpy(s->tokens + np, t->response_token_ids, nr * sizeof *s->tokens);
    for (size_t i = 0; i < nr; i++) {
        size_t k = np + i;
        uint8_t m = t->n_loss_mask ? t->loss_mask[i] : 1;
        if (k == 0) m = 0;
        s->mask[k] = m;
        if (!m) continue;
        s->n_loss++;
        s->logp[k] = t->n_rollout_logprobs ? t->rollout_logprobs[i] : 0.0f;
        s->adv[k] = t->n_token_advantages ? t->token_advantages[i] : (float)t->advantage;
    }
    s->n_tokens = (int64_t)L;
    s->reward = (float)t->reward;
    s->policy_version = t->policy_version;
    s->opaque = opaque;
    return s;
}

static int group_add_seq(group *g, seq *s, const al_transition *t)
{
    if (al_vec_grow((void **)&g->seqs, &g->cap_seqs, g->n_seqs + 1, sizeof *g->seqs)) return -1;
    g->seqs[g->n_seqs++] = s;
    g->n_tokens += s->n_tokens;
    const char *rid = t->rollout_id ? t->rollout_id : "";
    for (size_t i = 0; i < g->n_rollouts; i++)
        if (g->attempts[i] == t->attempt && strcmp(g->rollouts[i], rid) == 0) return 0;
    if (g->n_rollouts >= (size_t)g->group_size) return 0; /* enough to decide */
    size_t cap = g->cap_rollouts;
    if (al_vec_grow((void **)&g->rollouts, &g->cap_rollouts, g->n_rollouts + 1,
                    sizeof *g->rollouts))
        return -1;
    if (al_vec_grow((void **)&g->attempts, &cap, g->n_rollouts + 1, sizeof *g->attempts)) return -1;
    if (!(g->rollouts[g->n_rollouts] = strdup(rid))) return -1;
    g->attempts[g->n_rollouts++] = t->attempt;
    return 0;
}

/* Moves open group i to its model's queue, keeping the open list's order. */
static int close_open(al_batcher *b, size_t i)
{
    group *g = b->open[i];
    model *m = &b->models[g->model];
    if (al_vec_grow((void **)&m->queue, &m->cap_queue, m->n_queue + 1, sizeof *m->queue)) return -1;
    m->queue[m->n_queue++] = g;
    m->queued_seqs += (int64_t)g->n_seqs;
    m->queued_tokens += g->n_tokens;
    memmove(&b->open[i], &b->open[i + 1], (b->n_open - i - 1) * sizeof *b->open);
    b->n_open--;
    /* a group may have been fed from several lanes: forget it on all of them */
    for (size_t l = 0; l < b->n_lanes; l++)
        if (b->lanes[l] == g) b->lanes[l] = NULL;
    return 0;
}

static size_t open_index(const al_batcher *b, const group *g)
{
    for (size_t i = 0; i < b->n_open; i++)
        if (b->open[i] == g) return i;
    return (size_t)-1;
}

al_batch_add_result al_batcher_add(al_batcher *b, const al_transition *t, int32_t lane,
                                   int64_t now_us, void *opaque, char *errstr, size_t errlen)
{
    char why[256];
    const char *problem = transition_problem(b, t, why, sizeof why);
    if (problem) {
        b->stats.invalid++;
        al_err(errstr, errlen, "transition %s: %s", t->id && *t->id ? t->id : "(no id)", problem);
        return AL_BATCH_INVALID;
    }
    uint64_t h = id_hash(t->id);
    if (dedup_contains(&b->seen, h)) {
        b->stats.duplicates++;
        return AL_BATCH_DUPLICATE;
    }
    int mi = model_get(b, t->model);
    seq *s = mi < 0 ? NULL : seq_from_transition(t, opaque);
    if (!s) goto oom;

    /* The group it belongs to: open, or closed and waiting in the queue, or a new one. */
    group *g = NULL;
    for (size_t i = 0; i < b->n_open && !g; i++)
        if (b->open[i]->model == mi && strcmp(b->open[i]->group_id, t->group_id) == 0)
            g = b->open[i];
    model *m = &b->models[mi];
    for (size_t i = 0; i < m->n_queue && !g; i++)
        if (strcmp(m->queue[i]->group_id, t->group_id) == 0) {
            g = m->queue[i];
            m->queued_seqs++;
            m->queued_tokens += s->n_tokens;
        }
    if (!g) {
        if (al_vec_grow((void **)&b->open, &b->cap_open, b->n_open + 1, sizeof *b->open) ||
            !(g = calloc(1, sizeof *g)) || !(g->group_id = strdup(t->group_id))) {
            free(g);
            seq_free(s);
            goto oom;
        }
        g->model = mi;
        g->group_size = t->group_size > 0 ? t->group_size : 1;
        g->lane = lane;
        b->open[b->n_open++] = g;
    }
    if (group_add_seq(g, s, t) != 0) {
        if (g->n_seqs && g->seqs[g->n_seqs - 1] == s) {
            g->n_seqs--;
            g->n_tokens -= s->n_tokens;
        }
        seq_free(s);
        goto oom;
    }
    g->last_us = now_us;
    dedup_insert(&b->seen, h);
    b->stats.added++;

    /* The lane rule: another group's transition after a group that has all its rollouts. */
    if (lane >= 0 && lane < 65536) {
        if ((size_t)lane >= b->n_lanes) {
            size_t n = (size_t)lane + 1;
            if (al_vec_grow((void **)&b->lanes, &b->cap_lanes, n, sizeof *b->lanes))
                goto oom_added;
            memset(b->lanes + b->n_lanes, 0, (n - b->n_lanes) * sizeof *b->lanes);
            b->n_lanes = n;
        }
        group *prev = b->lanes[lane];
        if (prev && prev != g && prev->n_rollouts >= (size_t)prev->group_size) {
            size_t i = open_index(b, prev);
            if (i != (size_t)-1 && close_open(b, i) != 0) goto oom_added;
        }
        if (open_index(b, g) != (size_t)-1) b->lanes[lane] = g;
    }
    return AL_BATCH_ADDED;
oom_added:
    al_err(errstr, errlen, "batch: out of memory");
    return AL_BATCH_ADDED; /* held all the same; the next call reports the trouble */
oom:
    b->stats.invalid++;
    al_err(errstr, errlen, "batch: out of memory adding transition %s", t->id);
    return AL_BATCH_INVALID;
}

void al_batcher_release_all(al_batcher *b, al_batch_drop_fn fn, void *ctx)
{
    if (!b) return;
    for (size_t i = 0; i < b->n_open; i++) {
        for (size_t k = 0; fn && k < b->open[i]->n_seqs; k++) fn(ctx, b->open[i]->seqs[k]->opaque, "shutdown");
        group_free(b->open[i], 1);
    }
    b->n_open = 0;
    for (size_t n = 0; n < b->n_lanes; n++) b->lanes[n] = NULL;
    for (size_t mi = 0; mi < b->n_models; mi++) {
        model *m = &b->models[mi];
        for (size_t i = 0; i < m->n_queue; i++) {
            for (size_t k = 0; fn && k < m->queue[i]->n_seqs; k++) fn(ctx, m->queue[i]->seqs[k]->opaque, "shutdown");
            group_free(m->queue[i], 1);
        }
        m->n_queue = 0;
        m->queued_seqs = m->queued_tokens = 0;
    }
}

int al_batcher_close_idle(al_batcher *b, int64_t now_us, int64_t idle_us,
                          al_batch_lane_quiet_fn quiet, void *quiet_ctx)
{
    int n = 0;
    for (size_t i = 0; i < b->n_open;) {
        group *g = b->open[i];
        if (g->last_us <= now_us - idle_us && (!quiet || quiet(quiet_ctx, g->lane))) {
            if (close_open(b, i) != 0) break;
            n++;
        } else {
            i++;
        }
    }
    return n;
}

int al_batcher_close_all(al_batcher *b)
{
    int n = 0;
    while (b->n_open && close_open(b, 0) == 0) n++;
    return n;
}

/* ---- steps ----------------------------------------------------------------------------- */

static int64_t seq_lag(const model *m, const seq *s)
{
    if (m->policy_version < 0 || s->policy_version < 0) return -1;
    return m->policy_version > s->policy_version ? m->policy_version - s->policy_version : 0;
}

static int seq_is_stale(const al_batcher *b, const model *m, const seq *s)
{
    int64_t lag = seq_lag(m, s);
    return b->cfg.max_staleness >= 0 && lag > b->cfg.max_staleness;
}

/* Drops queued groups that have a stale transition (drop policy). Returns transitions dropped. */
static int prune_stale(al_batcher *b, model *m)
{
    if (b->cfg.stale_policy != AL_BATCH_STALE_DROP || b->cfg.max_staleness < 0 ||
        m->policy_version < 0)
        return 0;
    int dropped = 0;
    size_t w = 0;
    for (size_t i = 0; i < m->n_queue; i++) {
        group *g = m->queue[i];
        int stale = 0;
        for (size_t k = 0; k < g->n_seqs && !stale; k++) stale = seq_is_stale(b, m, g->seqs[k]);
        if (!stale) {
            m->queue[w++] = g;
            continue;
        }
        m->queued_seqs -= (int64_t)g->n_seqs;
        m->queued_tokens -= g->n_tokens;
        for (size_t k = 0; k < g->n_seqs; k++) {
            if (b->cfg.on_drop) b->cfg.on_drop(b->cfg.on_drop_ctx, g->seqs[k]->opaque, "stale");
            dropped++;
        }
        group_free(g, 1);
    }
    m->n_queue = w;
    b->stats.dropped_stale += dropped;
    return dropped;
}

/* How many queued groups (from the front) make a step: the fewest reaching the target, or
 * all of them when `partial`; 0 when not ready. */
static size_t groups_for_step(const al_batcher *b, const model *m, int partial)
{
    if (b->cfg.step_groups > 0)
        return m->n_queue >= (size_t)b->cfg.step_groups ? (size_t)b->cfg.step_groups
               : partial                               ? m->n_queue
                                                       : 0;
    int64_t target = b->cfg.step_sequences > 0 ? b->cfg.step_sequences : b->cfg.step_tokens;
    int64_t sum = 0;
    for (size_t i = 0; i < m->n_queue; i++) {
        sum += b->cfg.step_sequences > 0 ? (int64_t)m->queue[i]->n_seqs : m->queue[i]->n_tokens;
        if (sum >= target) return i + 1;
    }
    return partial ? m->n_queue : 0;
}

typedef struct order_item {
    int64_t len;
    size_t idx;
} order_item;

static int order_cmp(const void *a, const void *b)
{
    const order_item *x = a, *y = b;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

int al_batch_pack_ffd(const int64_t *len, const int64_t *cost, size_t n, int64_t cap,
                      int64_t cost_cap, int32_t *bin_of)
{
    order_item *ord = malloc((n ? n : 1) * sizeof *ord);
    int64_t *room = malloc((n ? n : 1) * sizeof *room);
    int64_t *croom = malloc((n ? n : 1) * sizeof *croom);
    int nbins = 0;
    if (!ord || !room || !croom) {
        nbins = -1;
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        if (len[i] > cap || len[i] < 0 || (cost && cost[i] > cost_cap)) {
            nbins = -1;
            goto out;
        }
        ord[i].len = len[i];
        ord[i].idx = i;
    }
    qsort(ord, n, sizeof *ord, order_cmp);
    for (size_t k = 0; k < n; k++) {
        size_t i = ord[k].idx;
        int64_t c = cost ? cost[i] : 0;
        int bin = -1;
        for (int j = 0; j < nbins && bin < 0; j++)
            if (room[j] >= len[i] && croom[j] >= c) bin = j;
        if (bin < 0) {
            bin = nbins++;
            room[bin] = cap;
            croom[bin] = cost_cap;
        }
        room[bin] -= len[i];
        croom[bin] -= c;
        bin_of[i] = bin;
    }
out:
    free(ord);
    free(room);
    free(croom);
    return nbins;
}

/* Per-sequence part of al_batch_micro_batch_bytes. */
static int64_t seq_cost(const seq *s)
{
    return 17 * s->n_tokens + 4 + 4 + 10 + 5 + (int64_t)strlen(s->id);
}

/* Whitens the advantages of the loss tokens of a step's sequences: mean 0, deviation 1 over
 * all of them (loss_tokens > 0 of them). */
static void whiten_advantages(seq **seqs, size_t n, int64_t loss_tokens)
{
    double sum = 0, sq = 0;
    for (size_t i = 0; i < n; i++)
        for (int64_t t = 0; t < seqs[i]->n_tokens; t++)
            if (seqs[i]->mask[t]) sum += seqs[i]->adv[t];
    double mean = sum / (double)loss_tokens;
    for (size_t i = 0; i < n; i++)
        for (int64_t t = 0; t < seqs[i]->n_tokens; t++)
            if (seqs[i]->mask[t]) sq += (seqs[i]->adv[t] - mean) * (seqs[i]->adv[t] - mean);
    double sd = sqrt(sq / (double)loss_tokens);
    for (size_t i = 0; i < n; i++)
        for (int64_t t = 0; t < seqs[i]->n_tokens; t++)
            if (seqs[i]->mask[t])
                seqs[i]->adv[t] = (float)((seqs[i]->adv[t] - mean) / (sd + 1e-8));
}

/* Lays the step's sequences out in b's step_build, micro-batch by micro-batch (bin_of: each
 * sequence's bin from the packing), each in packing order, longest first; T: their tokens.
 * 0, or -1 when out of memory. */
static int layout_bins(step_build *sb, seq **seqs, const int64_t *len, const int32_t *bin_of,
                       size_t n, int nbins, size_t T)
{
    order_item *ord = malloc((n ? n : 1) * sizeof *ord);
    if (!ord) return -1;
    for (size_t i = 0; i < n; i++) {
        ord[i].len = len[i];
        ord[i].idx = i;
    }
    qsort(ord, n, sizeof *ord, order_cmp);
    if (step_build_reserve(sb, T, n, (size_t)nbins) != 0) {
        free(ord);
        return -1;
    }
    size_t tok = 0, sq = 0, cu = 0;
    for (int bin = 0; bin < nbins; bin++) {
        al_micro_batch *mb = &sb->mbs[bin];
        int64_t id_bytes = 0;
        mb->index = bin;
        mb->token_ids = sb->tokens + tok;
        mb->position_ids = sb->positions + tok;
        mb->loss_mask = sb->mask + tok;
        mb->rollout_logprobs = sb->logp + tok;
        mb->advantages = sb->adv + tok;
        mb->cu_seqlens = sb->cu + cu;
        mb->transition_ids = sb->ids + sq;
        mb->policy_versions = sb->versions + sq;
        mb->rewards = sb->rewards + sq;
        size_t tok0 = tok;
        sb->cu[cu++] = 0;
        for (size_t o = 0; o < n; o++) {
            size_t i = ord[o].idx;
            if (bin_of[i] != bin) continue;
            const seq *s = seqs[i];
            size_t L = (size_t)s->n_tokens;
            memcpy(sb->tokens + tok, s->tokens, L * sizeof *sb->tokens);
            memcpy(sb->mask + tok, s->mask, L);
            memcpy(sb->logp + tok, s->logp, L * sizeof *sb->logp);
            memcpy(sb->adv + tok, s->adv, L * sizeof *sb->adv);
            for (size_t p = 0; p < L; p++) sb->positions[tok + p] = (int32_t)p;
            tok += L;
            sb->cu[cu++] = (int32_t)(tok - tok0);
            sb->ids[sq] = s->id;
            sb->versions[sq] = s->policy_version;
            sb->rewards[sq] = s->reward;
            id_bytes += (int64_t)strlen(s->id);
            sq++;
            mb->n_sequences++;
        }
        mb->n_tokens = tok - tok0;
        mb->n_rewards = mb->n_sequences;
        sb->mb_bytes[bin] = al_batch_micro_batch_bytes((int64_t)mb->n_tokens,
                                                       (int64_t)mb->n_sequences, id_bytes);
    }
    free(ord);
    return 0;
}

/* Cuts the step's micro-batches (in b's step_build) into BatchChunk messages under the size
 * limit and encodes them into st->chunks. 0; -1 with errstr (an encoding failed, a chunk over
 * the limit); -2 when out of memory. */
static int encode_chunks(al_batcher *b, const model *m, al_batch_step *st, int nbins,
                         char *errstr, size_t errlen)
{
    step_build *sb = &b->sb;
    size_t n = (size_t)st->n_sequences;
    int64_t total_tokens = st->n_tokens, loss_tokens = st->n_loss_tokens;
    int64_t fixed = CHUNK_FIXED_BYTES(strlen(m->name));
    size_t *first = malloc(((size_t)nbins + 1) * sizeof *first);
    if (!first) return -2;
    size_t nchunks = 0;
    int64_t acc = 0;
    for (int bin = 0; bin < nbins; bin++) {
        if (nchunks == 0 || acc + sb->mb_bytes[bin] > b->cfg.max_message_bytes) {
            first[nchunks++] = (size_t)bin;
            acc = fixed;
        }
        acc += sb->mb_bytes[bin];
    }
    if (nchunks == 0) first[nchunks++] = 0; /* an empty step still says it exists */
    first[nchunks] = (size_t)nbins;
    st->chunks = calloc(nchunks, sizeof *st->chunks);
    if (!st->chunks) {
        free(first);
        return -2;
    }
    st->n_chunks = nchunks;
    for (size_t c = 0; c < nchunks; c++) {
        al_batch_chunk ch = {
            .model = m->name,
            .step = st->step,
            .policy_version = m->policy_version,
            .chunk_index = (int32_t)c,
            .chunk_count = (int32_t)nchunks,
            .step_micro_batches = nbins,
            .step_sequences = (int32_t)n,
            .step_tokens = total_tokens,
            .step_loss_tokens = loss_tokens,
            .micro_batches = sb->mbs + first[c],
            .n_micro_batches = first[c + 1] - first[c],
        };
        if (al_batch_chunk_encode(&ch, &st->chunks[c], errstr, errlen) != 0) {
            free(first);
            return -1;
        }
        if ((int64_t)st->chunks[c].len > b->cfg.max_message_bytes) {
            al_err(errstr, errlen, "batch: chunk %zu of step %lld is %zu bytes, over the limit of %lld (estimate bug)",
                   c, (long long)st->step, st->chunks[c].len, (long long)b->cfg.max_message_bytes);
            free(first);
            return -1;
        }
    }
    free(first);
    return 0;
}

/* Turns the first ngroups queued groups of model mi into a step. */
static int build_step(al_batcher *b, int mi, size_t ngroups, al_batch_step **out, char *errstr,
                      size_t errlen)
{
    model *m = &b->models[mi];
    size_t n = 0;
    int64_t total_tokens = 0, loss_tokens = 0;
    for (size_t i = 0; i < ngroups; i++) n += m->queue[i]->n_seqs;
    seq **seqs = malloc((n ? n : 1) * sizeof *seqs);
    int64_t *len = malloc((n ? n : 1) * sizeof *len);
    int64_t *cost = malloc((n ? n : 1) * sizeof *cost);
    int32_t *bin_of = malloc((n ? n : 1) * sizeof *bin_of);
    al_batch_step *st = calloc(1, sizeof *st);
    int rc = -1, nbins = 0;
    if (!seqs || !len || !cost || !bin_of || !st) goto oom;
    size_t k = 0;
    for (size_t i = 0; i < ngroups; i++)
        for (size_t j = 0; j < m->queue[i]->n_seqs; j++) seqs[k++] = m->queue[i]->seqs[j];

    st->model = strdup(m->name);
    st->opaques = malloc((n ? n : 1) * sizeof *st->opaques);
    st->lags = malloc((n ? n : 1) * sizeof *st->lags);
    if (!st->model || !st->opaques || !st->lags) goto oom;
    st->step = m->next_step;
    st->policy_version = m->policy_version;
    st->n_groups = (int32_t)ngroups;
    st->n_sequences = (int32_t)n;
    for (size_t i = 0; i < n; i++) {
        st->opaques[i] = seqs[i]->opaque;
        st->lags[i] = seq_lag(m, seqs[i]);
        if (seq_is_stale(b, m, seqs[i])) st->n_stale++;
        total_tokens += seqs[i]->n_tokens;
        loss_tokens += seqs[i]->n_loss;
    }
    st->n_opaques = n;

    if (b->cfg.whiten && loss_tokens > 0) whiten_advantages(seqs, n, loss_tokens);

    /* Packing: token budget and message bytes both bound a micro-batch. */
    int64_t mb_cost_cap = b->cfg.max_message_bytes - CHUNK_FIXED_BYTES(strlen(m->name)) -
                          al_batch_micro_batch_bytes(0, 0, 0);
    for (size_t i = 0; i < n; i++) {
        len[i] = seqs[i]->n_tokens;
        cost[i] = seq_cost(seqs[i]);
    }
    nbins = al_batch_pack_ffd(len, cost, n, b->cfg.micro_batch_tokens, mb_cost_cap, bin_of);
    if (nbins < 0) {
        al_err(errstr, errlen, "batch: packing step %lld of %s failed", (long long)st->step, m->name);
        goto fail;
    }

    /* Lay the sequences out bin by bin, each bin in packing order (longest first). */
    if (layout_bins(&b->sb, seqs, len, bin_of, n, nbins, (size_t)total_tokens) != 0) goto oom;
    st->n_micro_batches = nbins;
    st->n_tokens = total_tokens;
    st->n_loss_tokens = loss_tokens;
    st->capacity_tokens = (int64_t)nbins * b->cfg.micro_batch_tokens;
    st->efficiency = st->capacity_tokens ? (double)total_tokens / (double)st->capacity_tokens : 0;

    /* Chunks: consecutive micro-batches while the estimate stays under the limit. */
    int cr = encode_chunks(b, m, st, nbins, errstr, errlen);
    if (cr == -2) goto oom;
    if (cr != 0) goto fail;

    /* The step owns its transitions now: take the groups off the queue. */
    for (size_t i = 0; i < ngroups; i++) {
        m->queued_seqs -= (int64_t)m->queue[i]->n_seqs;
        m->queued_tokens -= m->queue[i]->n_tokens;
        group_free(m->queue[i], 1);
    }
    memmove(m->queue, m->queue + ngroups, (m->n_queue - ngroups) * sizeof *m->queue);
    m->n_queue -= ngroups;
    m->next_step++;
    *out = st;
    st = NULL;
    rc = 0;
    goto fail; /* shared clean-up */
oom:
    al_err(errstr, errlen, "batch: out of memory building a step of %zu sequences", n);
fail:
    al_batch_step_free(st);
    free(seqs);
    free(len);
    free(cost);
    free(bin_of);
    return rc;
}

static int next_step(al_batcher *b, int partial, al_batch_step **out, char *errstr,
                     size_t errlen)
{
    *out = NULL;
    for (size_t mi = 0; mi < b->n_models; mi++) {
        model *m = &b->models[mi];
        if (!m->n_queue) continue;
        int dropped = prune_stale(b, m);
        size_t ng = groups_for_step(b, m, partial);
        if (!ng) continue;
        if (build_step(b, (int)mi, ng, out, errstr, errlen) != 0) return -1;
        (*out)->n_dropped_stale = dropped;
        return 1;
    }
    return 0;
}

int al_batcher_next_step(al_batcher *b, al_batch_step **out, char *errstr, size_t errlen)
{
    return next_step(b, 0, out, errstr, errlen);
}

int al_batcher_flush_step(al_batcher *b, al_batch_step **out, char *errstr, size_t errlen)
{
    return next_step(b, 1, out, errstr, errlen);
}
