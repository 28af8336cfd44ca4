/*
 * assembler.c: trainer steps from BatchChunk messages (see assembler.h).
 */
#include "assembler.h"

#include "avro/codec.h"
#include "core/util.h"
#include "core/vec.h"

#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct held_chunk {
    al_batch_chunk *ch; /* NULL: not received */
    uint8_t hash[32];
    void *opaque;
} held_chunk;

typedef AL_VEC(void *) opaque_list;

typedef struct pending_step {
    int64_t step;
    int32_t count, got;
    held_chunk *slots; /* (count) */
    /* what the attempt's first chunk announced; later chunks must agree */
    int64_t policy_version, step_tokens, step_loss_tokens;
    int32_t step_micro_batches, step_sequences;
    int complete;
    int64_t completed_seq; /* order of completion */
    opaque_list retired;
    struct pending_step *next;
} pending_step;

struct al_train_asm {
    char *model;
    int vocab, max_pos;
    int64_t last_applied;
    int64_t completions;
    pending_step *steps;
};

struct al_train_ready_priv {
    al_batch_chunk **chunks;
    size_t n_chunks;
    float **masks;
    size_t n_masks;
};

static void chunk_free(al_batch_chunk *c)
{
    if (!c) return;
    al_batch_chunk_clear(c);
    free(c);
}

al_train_asm *al_train_asm_new(const char *model, int vocab_size, int max_positions,
                               int64_t last_applied, char *errstr, size_t errlen)
{
    if (!model || !*model) {
        al_err(errstr, errlen, "the assembler needs a model name");
        return NULL;
    }
    if (vocab_size < 1 || max_positions < 1) {
        al_err(errstr, errlen, "vocabulary size %d / max positions %d must be positive",
               vocab_size, max_positions);
        return NULL;
    }
    al_train_asm *a = calloc(1, sizeof *a);
    if (!a || !(a->model = strdup(model))) {
        free(a);
        al_err(errstr, errlen, "out of memory");
        return NULL;
    }
    a->vocab = vocab_size;
    a->max_pos = max_positions;
    a->last_applied = last_applied;
    return a;
}

static void pending_release(pending_step *p, void (*release)(void *, void *), void *ctx)
{
    for (int32_t i = 0; i < p->count; i++) {
        if (p->slots[i].ch && release) release(ctx, p->slots[i].opaque);
        chunk_free(p->slots[i].ch);
    }
    for (size_t i = 0; i < p->retired.n; i++)
        if (release) release(ctx, p->retired.v[i]);
    free(p->retired.v);
    free(p->slots);
    free(p);
}

void al_train_asm_free(al_train_asm *a, void (*release)(void *ctx, void *opaque), void *ctx)
{
    if (!a) return;
    while (a->steps) {
        pending_step *p = a->steps;
        a->steps = p->next;
        pending_release(p, release, ctx);
    }
    free(a->model);
    free(a);
}

/* Checks one decoded chunk on its own. 0, or -1 with why. */
static int check_chunk(const al_train_asm *a, const al_batch_chunk *c, char *why, size_t whylen)
{
    if (c->step < 0) return al_err(why, whylen, "step %" PRId64 " is negative", c->step), -1;
    if (c->step > AL_STEP_MAX)
        return al_err(why, whylen, "step %" PRId64 " is beyond the largest step number %" PRId64,
                      c->step, (int64_t)AL_STEP_MAX),
               -1;
    if (c->chunk_count < 1 || c->chunk_index < 0 || c->chunk_index >= c->chunk_count)
        return al_err(why, whylen, "chunk_index %d is outside chunk_count %d", c->chunk_index,
                      c->chunk_count),
               -1;
    if (c->n_micro_batches == 0)
        return al_err(why, whylen, "step %" PRId64 " chunk %d holds no micro-batch", c->step,
                      c->chunk_index),
               -1;
    for (size_t k = 0; k < c->n_micro_batches; k++) {
        const al_micro_batch *mb = &c->micro_batches[k];
        if (mb->n_tokens < 1 || mb->n_tokens > INT_MAX / 2)
            return al_err(why, whylen, "micro-batch %d has %zu tokens", mb->index, mb->n_tokens), -1;
        if (mb->n_sequences < 1 || mb->n_sequences > mb->n_tokens)
            return al_err(why, whylen, "micro-batch %d has %zu sequences for %zu tokens", mb->index,
                          mb->n_sequences, mb->n_tokens),
                   -1;
        for (size_t t = 0; t < mb->n_tokens; t++) {
            if (mb->token_ids[t] < 0 || mb->token_ids[t] >= a->vocab)
                return al_err(why, whylen,
                              "micro-batch %d token %zu: id %d is outside the vocabulary (0..%d)",
                              mb->index, t, mb->token_ids[t], a->vocab - 1),
                       -1;
            if (mb->position_ids[t] < 0 || mb->position_ids[t] >= a->max_pos)
                return al_err(why, whylen,
                              "micro-batch %d token %zu: position %d is outside 0..%d", mb->index,
                              t, mb->position_ids[t], a->max_pos - 1),
                       -1;
            if (mb->loss_mask[t] > 1)
                return al_err(why, whylen, "micro-batch %d token %zu: loss_mask %u is not 0 or 1",
                              mb->index, t, mb->loss_mask[t]),
                       -1;
            /* the trainer refuses a non-finite value anywhere in the chunk, masked or not */
            if (!isfinite(mb->advantages[t]) || !isfinite(mb->rollout_logprobs[t]))
                return al_err(why, whylen,
                              "micro-batch %d token %zu: advantage %g / rollout logprob %g is not finite",
                              mb->index, t, mb->advantages[t], mb->rollout_logprobs[t]),
                       -1;
        }
    }
    return 0;
}

static pending_step *pending_new(al_train_asm *a, const al_batch_chunk *c)
{
    pending_step *p = calloc(1, sizeof *p);
    if (!p) return NULL;
    p->slots = calloc((size_t)c->chunk_count, sizeof *p->slots);
    if (!p->slots) {
        free(p);
        return NULL;
    }
    p->step = c->step;
    p->count = c->chunk_count;
    p->policy_version = c->policy_version;
    p->step_tokens = c->step_tokens;
    p->step_loss_tokens = c->step_loss_tokens;
    p->step_micro_batches = c->step_micro_batches;
    p->step_sequences = c->step_sequences;
    pending_step **tail = &a->steps;
    while (*tail) tail = &(*tail)->next;
    *tail = p;
    return p;
}

/* Starts the step over from chunk 0 of a new attempt: the held chunks' opaques retire. */
static int pending_restart(pending_step *p, const al_batch_chunk *c)
{
    held_chunk *ns = calloc((size_t)c->chunk_count, sizeof *ns);
    if (!ns) return -1;
    for (int32_t i = 0; i < p->count; i++) {
        if (!p->slots[i].ch) continue;
        if (al_vec_push(&p->retired, p->slots[i].opaque) != 0) {
            free(ns);
            return -1;
        }
        chunk_free(p->slots[i].ch);
        p->slots[i].ch = NULL;
    }
    free(p->slots);
    p->slots = ns;
    p->count = c->chunk_count;
    p->got = 0;
    p->complete = 0;
    p->policy_version = c->policy_version;
    p->step_tokens = c->step_tokens;
    p->step_loss_tokens = c->step_loss_tokens;
    p->step_micro_batches = c->step_micro_batches;
    p->step_sequences = c->step_sequences;
    return 0;
}

al_train_asm_result al_train_asm_add(al_train_asm *a, const void *value, size_t len,
                                     void *opaque, char *why, size_t whylen)
{
    char e[400];
    if (!value || len == 0) {
        al_err(why, whylen, "empty value (tombstone): not a BatchChunk");
        return AL_TRAIN_ASM_BAD;
    }
    al_batch_chunk *c = calloc(1, sizeof *c);
    if (!c) {
        al_err(why, whylen, "out of memory decoding a chunk");
        return AL_TRAIN_ASM_BAD;
    }
    if (al_batch_chunk_decode(value, len, c, e, sizeof e) != 0) {
        al_err(why, whylen, "not a BatchChunk: %s", e);
        chunk_free(c);
        return AL_TRAIN_ASM_BAD;
    }
    if (!c->model || strcmp(c->model, a->model) != 0) {
        al_err(why, whylen, "a chunk of model '%s'", c->model ? c->model : "");
        chunk_free(c);
        return AL_TRAIN_ASM_OTHER_MODEL;
    }
    if (c->step >= 0 && c->step <= a->last_applied) {
        al_err(why, whylen, "step %" PRId64 " was trained on already (last: %" PRId64 ")", c->step,
               a->last_applied);
        chunk_free(c);
        return AL_TRAIN_ASM_APPLIED;
    }
    if (check_chunk(a, c, e, sizeof e) != 0) {
        al_err(why, whylen, "step %" PRId64 " chunk %d: %s", c->step, c->chunk_index, e);
        chunk_free(c);
        return AL_TRAIN_ASM_BAD;
    }
    uint8_t hash[32];
    al_sha256(value, len, hash);
    pending_step *p = a->steps;
    while (p && p->step != c->step) p = p->next;
    if (p && p->complete && c->chunk_index != 0) {
        /* complete steps leave at the next al_train_asm_next; a straggler is a duplicate */
        held_chunk *h = c->chunk_index < p->count ? &p->slots[c->chunk_index] : NULL;
        if (h && h->ch && memcmp(h->hash, hash, 32) == 0) {
            al_err(why, whylen, "duplicate of step %" PRId64 " chunk %d", c->step, c->chunk_index);
            chunk_free(c);
            return AL_TRAIN_ASM_DUPLICATE;
        }
    }
    if (!p) {
        if (!(p = pending_new(a, c))) goto oom;
    } else if (c->chunk_index == 0) {
        if (p->slots[0].ch && memcmp(p->slots[0].hash, hash, 32) == 0) {
            al_err(why, whylen, "duplicate of step %" PRId64 " chunk 0", c->step);
            chunk_free(c);
            return AL_TRAIN_ASM_DUPLICATE;
        }
        if (p->got > 0 && pending_restart(p, c) != 0) goto oom;
    } else {
        const char *field = NULL;
        if (c->chunk_count != p->count) field = "chunk_count";
        else if (c->policy_version != p->policy_version) field = "policy_version";
        else if (c->step_tokens != p->step_tokens) field = "step_tokens";
        else if (c->step_loss_tokens != p->step_loss_tokens) field = "step_loss_tokens";
        else if (c->step_micro_batches != p->step_micro_batches) field = "step_micro_batches";
        else if (c->step_sequences != p->step_sequences) field = "step_sequences";
        if (field) {
            al_err(why, whylen, "step %" PRId64 " chunk %d: %s differs from the step's other chunks",
                   c->step, c->chunk_index, field);
            chunk_free(c);
            return AL_TRAIN_ASM_BAD;
        }
        held_chunk *h = &p->slots[c->chunk_index];
        if (h->ch) {
            if (memcmp(h->hash, hash, 32) == 0) {
                al_err(why, whylen, "duplicate of step %" PRId64 " chunk %d", c->step, c->chunk_index);
                chunk_free(c);
                return AL_TRAIN_ASM_DUPLICATE;
            }
            /* other bytes under the same index: the later one belongs to the newer attempt */
            if (al_vec_push(&p->retired, h->opaque) != 0) goto oom;
            chunk_free(h->ch);
            h->ch = NULL;
            p->got--;
        }
    }
    held_chunk *h = &p->slots[c->chunk_index];
    h->ch = c;
    memcpy(h->hash, hash, 32);
    h->opaque = opaque;
    p->got++;
    if (p->got == p->count && !p->complete) {
        p->complete = 1;
        p->completed_seq = a->completions++;
    }
    al_err(why, whylen, "step %" PRId64 " chunk %d of %d", c->step, c->chunk_index, p->count);
    return AL_TRAIN_ASM_HELD;
oom:
    chunk_free(c);
    al_err(why, whylen, "out of memory holding a chunk");
    return AL_TRAIN_ASM_BAD;
}

static void unlink_step(al_train_asm *a, pending_step *p)
{
    for (pending_step **pp = &a->steps; *pp; pp = &(*pp)->next)
        if (*pp == p) {
            *pp = p->next;
            return;
        }
}

/* Moves p's opaques and chunks into a new ready step (bad or not). NULL when out of memory
 * (p untouched). */
static al_train_ready *ready_from(pending_step *p)
{
    al_train_ready *r = calloc(1, sizeof *r);
    struct al_train_ready_priv *pr = calloc(1, sizeof *pr);
    void **cur = calloc((size_t)p->count + 1, sizeof *cur);
    al_batch_chunk **chunks = calloc((size_t)p->count + 1, sizeof *chunks);
    if (!r || !pr || !cur || !chunks) {
        free(r), free(pr), free(cur), free(chunks);
        return NULL;
    }
    r->priv = pr;
    r->step = p->step;
    r->policy_version = p->policy_version;
    for (int32_t i = 0; i < p->count; i++) {
        if (!p->slots[i].ch) continue;
        cur[r->n_current++] = p->slots[i].opaque;
        chunks[pr->n_chunks++] = p->slots[i].ch;
        p->slots[i].ch = NULL;
    }
    r->current = cur;
    pr->chunks = chunks;
    r->retired = p->retired.v;
    r->n_retired = p->retired.n;
    p->retired.v = NULL;
    p->retired.n = p->retired.cap = 0;
    return r;
}

/* One sequence of a step, for call_entropy. */
typedef struct seq_ref {
    const char *id; /* transition id: ROLLOUT:ATTEMPT:CALL */
    size_t prefix;  /* length of ROLLOUT:ATTEMPT */
    long long call;
    double nlp;     /* sum of -rollout logprob over its trained tokens */
    int64_t n;      /* its trained tokens */
} seq_ref;

/* Orders by rollout attempt (the id's prefix), then by call index. */
static int seq_ref_cmp_prefix(const seq_ref *a, const seq_ref *b)
{
    size_t n = a->prefix < b->prefix ? a->prefix : b->prefix;
    int c = memcmp(a->id, b->id, n);
    if (c) return c;
    return a->prefix < b->prefix ? -1 : a->prefix > b->prefix;
}

static int seq_ref_cmp(const void *pa, const void *pb)
{
    const seq_ref *a = pa, *b = pb;
    int c = seq_ref_cmp_prefix(a, b);
    if (c) return c;
    return a->call < b->call ? -1 : a->call > b->call;
}

/* Fills r->call_entropy (see assembler.h) from the step's chunks: the sequences of a
 * rollout attempt are ranked by their call index, the k-th is call position k. A
 * transition id without two ':' counts as a rollout of its own. -1 when out of memory. */
static int call_entropy(al_train_ready *r, al_batch_chunk *const *chunks, size_t nchunks)
{
    for (int k = 0; k < AL_TRAIN_CALL_POSITIONS; k++)
        r->call_entropy[k] = NAN;
    AL_VEC(seq_ref) v = {0};
    for (size_t i = 0; i < nchunks; i++)
        for (size_t m = 0; m < chunks[i]->n_micro_batches; m++) {
            const al_micro_batch *mb = &chunks[i]->micro_batches[m];
            for (size_t q = 0; q < mb->n_sequences; q++) {
                seq_ref e = {.id = mb->transition_ids[q] ? mb->transition_ids[q] : ""};
                const char *c2 = strrchr(e.id, ':');
                e.prefix = c2 ? (size_t)(c2 - e.id) : strlen(e.id);
                e.call = c2 ? strtoll(c2 + 1, NULL, 10) : 0;
                for (int32_t t = mb->cu_seqlens[q]; t < mb->cu_seqlens[q + 1]; t++)
                    if (mb->loss_mask[t]) e.nlp -= mb->rollout_logprobs[t], e.n++;
                if (al_vec_push(&v, e)) {
                    al_vec_free(&v);
                    return -1;
                }
            }
        }
    if (v.n) qsort(v.v, v.n, sizeof *v.v, seq_ref_cmp);
    double sum[AL_TRAIN_CALL_POSITIONS] = {0};
    int64_t n[AL_TRAIN_CALL_POSITIONS] = {0};
    for (size_t i = 0, pos = 0; i < v.n; i++) {
        pos = i && !seq_ref_cmp_prefix(&v.v[i - 1], &v.v[i]) ? pos + 1 : 0;
        if (pos < AL_TRAIN_CALL_POSITIONS) sum[pos] += v.v[i].nlp, n[pos] += v.v[i].n;
    }
    for (int k = 0; k < AL_TRAIN_CALL_POSITIONS; k++)
        if (n[k]) r->call_entropy[k] = sum[k] / (double)n[k];
    al_vec_free(&v);
    return 0;
}

/* Builds the trainer's chunks of a complete step and checks the announced totals; marks r
 * bad with the reason when they do not add up. -1 when out of memory. */
static int ready_build(al_train_ready *r, const pending_step *p)
{
    struct al_train_ready_priv *pr = r->priv;
    size_t nmb = 0;
    for (size_t i = 0; i < pr->n_chunks; i++) nmb += pr->chunks[i]->n_micro_batches;
    if (!(r->chunks = calloc(nmb, sizeof *r->chunks)) || !(pr->masks = calloc(nmb, sizeof *pr->masks)))
        return -1;
    int64_t seqs = 0, toks = 0, loss = 0, nrew = 0;
    double rew = 0;
    for (size_t i = 0; i < pr->n_chunks; i++) {
        const al_batch_chunk *c = pr->chunks[i];
        for (size_t k = 0; k < c->n_micro_batches; k++) {
            const al_micro_batch *mb = &c->micro_batches[k];
            if (mb->index != r->nchunks && !r->bad) {
                r->bad = 1;
                snprintf(r->reason, sizeof r->reason,
                         "step %" PRId64 ": micro-batch index %d where %d was expected", r->step,
                         mb->index, r->nchunks);
            }
            float *mask = malloc(mb->n_tokens * sizeof *mask);
            if (!mask) return -1;
            pr->masks[pr->n_masks++] = mask;
            for (size_t t = 0; t < mb->n_tokens; t++) {
                mask[t] = mb->loss_mask[t] ? 1.0f : 0.0f;
                /* the first token of a sequence is never predicted: it trains nothing */
                loss += mb->loss_mask[t];
            }
            for (size_t s = 0; s < mb->n_sequences; s++)
                if (mb->cu_seqlens[s] < mb->cu_seqlens[s + 1] && mb->loss_mask[mb->cu_seqlens[s]])
                    loss--;
            for (size_t s = 0; s < mb->n_rewards; s++)
                if (isfinite(mb->rewards[s])) rew += mb->rewards[s], nrew++;
            al_train_chunk *tc = &r->chunks[r->nchunks++];
            tc->T = (int)mb->n_tokens;
            tc->nseq = (int)mb->n_sequences;
            tc->tokens = mb->token_ids;
            tc->positions = mb->position_ids;
            tc->cu_seqlens = mb->cu_seqlens;
            tc->mask = mask;
            tc->adv = mb->advantages;
            tc->rollout_logp = mb->rollout_logprobs;
            seqs += (int64_t)mb->n_sequences;
            toks += (int64_t)mb->n_tokens;
        }
    }
    r->tokens = toks;
    r->sequences = seqs;
    r->reward_mean = nrew ? rew / (double)nrew : NAN;
    /* the batch stage counts loss tokens as the mask says; count them the same way */
    int64_t mask_tokens = 0;
    for (size_t i = 0; i < pr->n_chunks; i++)
        for (size_t k = 0; k < pr->chunks[i]->n_micro_batches; k++) {
            const al_micro_batch *mb = &pr->chunks[i]->micro_batches[k];
            for (size_t t = 0; t < mb->n_tokens; t++) mask_tokens += mb->loss_mask[t];
        }
    r->loss_tokens = loss;
    if (call_entropy(r, pr->chunks, pr->n_chunks)) return -1;
    if (r->bad) return 0;
    const char *what = NULL;
    int64_t got = 0, want = 0;
    if (r->nchunks != p->step_micro_batches) what = "micro-batches", got = r->nchunks, want = p->step_micro_batches;
    else if (seqs != p->step_sequences) what = "sequences", got = seqs, want = p->step_sequences;
    else if (toks != p->step_tokens) what = "tokens", got = toks, want = p->step_tokens;
    else if (mask_tokens != p->step_loss_tokens)
        what = "loss tokens", got = mask_tokens, want = p->step_loss_tokens;
    if (what) {
        r->bad = 1;
        snprintf(r->reason, sizeof r->reason,
                 "step %" PRId64 ": its chunks hold %" PRId64 " %s but announce %" PRId64, r->step,
                 got, what, want);
    }
    return 0;
}

int al_train_asm_next(al_train_asm *a, al_train_ready **out)
{
    *out = NULL;
    pending_step *done = NULL;
    for (pending_step *p = a->steps; p; p = p->next)
        if (p->complete && (!done || p->completed_seq < done->completed_seq)) done = p;
    if (!done) return 0;
    /* an incomplete step older than the completed one will never complete */
    for (pending_step *p = a->steps; p; p = p->next) {
        if (p->complete || p->step >= done->step) continue;
        al_train_ready *r = ready_from(p);
        if (!r) return 0;
        r->bad = 1;
        snprintf(r->reason, sizeof r->reason,
                 "step %" PRId64 " incomplete (%d of %d chunks) when step %" PRId64 " completed",
                 p->step, p->got, p->count, done->step);
        unlink_step(a, p);
        pending_release(p, NULL, NULL);
        *out = r;
        return 1;
    }
    al_train_ready *r = ready_from(done);
    if (!r) return 0;
    if (done->step <= a->last_applied) {
        r->bad = 1;
        snprintf(r->reason, sizeof r->reason,
                 "step %" PRId64 " completed after step %" PRId64 " was trained on", done->step,
                 a->last_applied);
    } else if (ready_build(r, done) != 0) {
        r->bad = 1;
        snprintf(r->reason, sizeof r->reason, "out of memory assembling step %" PRId64, done->step);
    }
    if (done->step > a->last_applied) a->last_applied = done->step;
    unlink_step(a, done);
    pending_release(done, NULL, NULL);
    *out = r;
    return 1;
}

void al_train_ready_free(al_train_ready *r)
{
    if (!r) return;
    struct al_train_ready_priv *pr = r->priv;
    if (pr) {
        for (size_t i = 0; i < pr->n_chunks; i++) chunk_free(pr->chunks[i]);
        free(pr->chunks);
        for (size_t i = 0; i < pr->n_masks; i++) free(pr->masks[i]);
        free(pr->masks);
        free(pr);
    }
    free(r->chunks);
    free(r->current);
    free(r->retired);
    free(r);
}

size_t al_train_asm_pending(const al_train_asm *a)
{
    size_t n = 0;
    for (const pending_step *p = a->steps; p; p = p->next) n++;
    return n;
}

int64_t al_train_asm_last_applied(const al_train_asm *a)
{
    return a->last_applied;
}
