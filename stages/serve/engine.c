/*
 * engine.c: the serve engine's thread, its queue and the refcounted weight sets (engine.h).
 */
#define _GNU_SOURCE
#include "engine.h"

#include "core/vec.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct al_serve_engine {
    pthread_mutex_t lock;
    pthread_cond_t wake;
    pthread_t thread;
    int stop;
    al_serve_engine_opts o;
    al_model_config cfg; /* the served shape (every weight set has it); read without the lock */
    const al_tokenizer *tok;
    al_serve_weights *cur; /* one reference held here */
    al_serve_req *queue_head, *queue_tail;
    int nqueued_seqs, nrunning;
    size_t kv_reserved;
    uint64_t tokens, steps, swaps;
    int weight_sets;
    int32_t eos[4];
    int neos;
    /* engine thread only */
    AL_VEC(al_serve_req *) running; /* requests with unfinished sequences */
    float *logits; /* (cap_batch, V) */
    int V;
    al_infer_sampler sampler;
    al_infer_scratch *scratch;
    int cap_batch;
    al_infer_kv **b_kv;
    const int32_t **b_tok;
    int *b_n;
    al_serve_seq **b_seq;
    al_serve_req **b_req;
};

al_serve_weights *al_serve_weights_new(al_model *m, int64_t version)
{
    al_serve_weights *w = calloc(1, sizeof *w);
    if (!w) {
        al_model_free(m);
        return NULL;
    }
    w->model = m, w->version = version, w->refs = 1;
    return w;
}

/* Drops one reference under e->lock; returns the set to free (outside the lock) or NULL. */
static al_serve_weights *weights_unref_locked(al_serve_engine *e, al_serve_weights *w)
{
    if (!w || --w->refs > 0) return NULL;
    e->weight_sets--;
    return w;
}

static void weights_free(al_serve_weights *w)
{
    if (!w) return;
    al_model_free(w->model);
    free(w);
}

size_t al_serve_kv_bytes(const al_model_config *c, int tokens)
{
    return 2 * sizeof(float) * (size_t)c->num_layers * (size_t)tokens * (size_t)c->num_kv_heads *
           (size_t)c->head_dim;
}

al_serve_req *al_serve_req_new(const int32_t *prompt, int nprompt, int nseq)
{
    al_serve_req *r = calloc(1, sizeof *r);
    if (!r) return NULL;
    r->prompt = malloc(sizeof(int32_t) * (size_t)(nprompt > 0 ? nprompt : 1));
    r->seqs = calloc((size_t)(nseq > 0 ? nseq : 1), sizeof *r->seqs);
    if (!r->prompt || !r->seqs) {
        free(r->prompt);
        free(r->seqs);
        free(r);
        return NULL;
    }
    if (nprompt > 0) memcpy(r->prompt, prompt, sizeof(int32_t) * (size_t)nprompt);
    r->nprompt = nprompt, r->nseq = nseq, r->refs = 1, r->policy_version = -1;
    for (int i = 0; i < nseq; i++) {
        r->seqs[i].top_logprobs = -1;
        r->seqs[i].stop_token = -1;
        r->seqs[i].sampling.top_p = 1;
    }
    pthread_mutex_init(&r->lock, NULL);
    return r;
}

static void seq_free(al_serve_seq *s)
{
    free(s->ids);
    free(s->logps);
    free(s->text_end);
    free(s->top_ids);
    free(s->top_logps);
    al_buf_free(&s->text);
    free(s->stop_reason);
    al_infer_kv_free(s->kv);
    al_tokenizer_stream_free(&s->ts);
}

void al_serve_req_unref(al_serve_req *r)
{
    if (!r) return;
    pthread_mutex_lock(&r->lock);
    int left = --r->refs;
    pthread_mutex_unlock(&r->lock);
    if (left > 0) return;
    for (int i = 0; i < r->nseq; i++)
        seq_free(&r->seqs[i]);
    for (int i = 0; i < r->nstop; i++)
        free(r->stop[i]);
    free(r->stop);
    free(r->stop_ids);
    free(r->seqs);
    free(r->prompt);
    pthread_mutex_destroy(&r->lock);
    free(r);
}

void al_serve_req_detach(al_serve_req *r)
{
    pthread_mutex_lock(&r->lock);
    r->cancelled = 1;
    r->notify = NULL;
    r->notify_ud = NULL;
    pthread_mutex_unlock(&r->lock);
}

static void notify(al_serve_req *r)
{
    /* Called with r->lock held, so that detach (which takes the lock) cannot free what
     * notify_ud points to while the callback runs; the callback must not take r->lock. */
    if (r->notify) r->notify(r, r->notify_ud);
}

/* After text grew from `prev` bytes: ends the sequence at the first stop string (the text
 * is cut before it) and sets safe_len to the end of the text minus the longest tail that
 * could still become a stop string. */
static void check_stops(al_serve_req *r, al_serve_seq *s, size_t prev)
{
    for (int i = 0; i < r->nstop; i++) {
        size_t L = strlen(r->stop[i]);
        if (!L || s->text.len < L) continue;
        size_t from = prev >= L - 1 ? prev - (L - 1) : 0;
        char *hit = memmem(s->text.data + from, s->text.len - from, r->stop[i], L);
        if (hit) {
            s->text.len = (size_t)(hit - s->text.data);
            s->text.data[s->text.len] = 0;
            s->finish = AL_SERVE_FINISH_STOP;
            free(s->stop_reason);
            s->stop_reason = strdup(r->stop[i]);
            prev = s->text.len;
        }
    }
    if (s->finish) {
        s->safe_len = s->text.len;
        return;
    }
    size_t hold = 0;
    for (int i = 0; i < r->nstop; i++) {
        size_t L = strlen(r->stop[i]);
        for (size_t k = L > 1 ? L - 1 : 0; k > hold; k--)
            if (k <= s->text.len && !memcmp(s->text.data + s->text.len - k, r->stop[i], k)) {
                hold = k;
                break;
            }
    }
    s->safe_len = s->text.len - hold;
}

/* Records token `id` (sampled from logits (V)) in s; decides whether s is done. Under r->lock.
 * -1 when out of memory. */
static int seq_record(al_serve_engine *e, al_serve_req *r, al_serve_seq *s, const float *logits,
                      int32_t id)
{
    int k = s->top_logprobs > 0 ? s->top_logprobs : 0;
    if (s->n == s->cap) {
        int cap = s->cap ? s->cap * 2 : 16;
        int32_t *ids = realloc(s->ids, sizeof(int32_t) * (size_t)cap);
        if (ids) s->ids = ids;
        double *lp = realloc(s->logps, sizeof(double) * (size_t)cap);
        if (lp) s->logps = lp;
        size_t *te = realloc(s->text_end, sizeof(size_t) * (size_t)cap);
        if (te) s->text_end = te;
        if (!ids || !lp || !te) return -1;
        if (k) {
            int32_t *ti = realloc(s->top_ids, sizeof(int32_t) * (size_t)cap * k);
            if (ti) s->top_ids = ti;
            double *tl = realloc(s->top_logps, sizeof(double) * (size_t)cap * k);
            if (tl) s->top_logps = tl;
            if (!ti || !tl) return -1;
        }
        s->cap = cap;
    }
    s->ids[s->n] = id;
    if (s->top_logprobs >= 0) {
        double T = e->o.logprobs_temperature && s->sampling.temperature > 0
                       ? s->sampling.temperature
                       : 1.0;
        double lse = al_infer_logsumexp_t(logits, e->V, T);
        s->logps[s->n] = al_infer_logprob_t(logits, lse, id, T);
        if (k)
            al_infer_top_logprobs_t(logits, e->V, lse, T, k, s->top_ids + (size_t)s->n * k,
                                    s->top_logps + (size_t)s->n * k);
    } else {
        s->logps[s->n] = 0;
    }
    s->n++;
    __atomic_fetch_add(&e->tokens, 1, __ATOMIC_RELAXED);

    int is_eos = 0;
    if (!r->ignore_eos)
        for (int i = 0; i < e->neos; i++)
            is_eos |= id == e->eos[i];
    int is_stop_id = 0;
    for (int i = 0; i < r->nstop_ids; i++)
        is_stop_id |= id == r->stop_ids[i];

    size_t prev = s->text.len, tl = 0;
    if (!is_eos && !is_stop_id) {
        const char *t =
            al_tokenizer_stream_push(e->tok, &s->ts, id, AL_TOKENIZER_SKIP_SPECIAL, &tl);
        if (!t || al_buf_append(&s->text, t, tl)) return -1;
    }
    if (is_eos || is_stop_id) {
        s->finish = AL_SERVE_FINISH_STOP;
        if (is_stop_id) s->stop_token = id;
    } else {
        check_stops(r, s, prev);
    }
    s->text_end[s->n - 1] = s->text.len;
    if (!s->finish && (s->n >= r->max_tokens || r->nprompt + s->n >= e->o.max_model_len))
        s->finish = AL_SERVE_FINISH_LENGTH;
    if (s->finish && !s->stop_reason) { /* held bytes of an unfinished character come out */
        size_t fl = 0;
        const char *t = al_tokenizer_stream_flush(&s->ts, &fl);
        if (t && fl) {
            size_t p2 = s->text.len;
            if (al_buf_append(&s->text, t, fl)) return -1;
            check_stops(r, s, p2);
            if (s->finish == AL_SERVE_FINISH_STOP) return 0;
        }
        s->safe_len = s->text.len;
    }
    return 0;
}

/* Ends a sequence: frees its cache, releases its weights and KV reservation (engine lock
 * taken here). */
static void seq_release(al_serve_engine *e, al_serve_seq *s)
{
    al_infer_kv_free(s->kv);
    s->kv = NULL;
    pthread_mutex_lock(&e->lock);
    al_serve_weights *dead = weights_unref_locked(e, s->w);
    e->kv_reserved -= s->kv_bytes;
    e->nrunning--;
    pthread_mutex_unlock(&e->lock);
    s->w = NULL, s->kv_bytes = 0;
    weights_free(dead);
}

/* Admits queued requests: every sequence gets the current weights and a KV cache. */
static void admit(al_serve_engine *e)
{
    for (;;) {
        pthread_mutex_lock(&e->lock);
        al_serve_req *r = e->queue_head;
        if (r) {
            e->queue_head = r->next;
            if (!e->queue_head) e->queue_tail = NULL;
            e->nqueued_seqs -= r->nseq;
            e->nrunning += r->nseq;
            for (int i = 0; i < r->nseq; i++) {
                r->seqs[i].w = e->cur;
                e->cur->refs++;
            }
        }
        pthread_mutex_unlock(&e->lock);
        if (!r) return;
        if (al_vec_push(&e->running, r) != 0)
            abort(); /* tiny; nothing sensible to do without it */
        pthread_mutex_lock(&r->lock);
        r->admitted = 1;
        r->policy_version = r->seqs[0].w->version;
        pthread_mutex_unlock(&r->lock);
        for (int i = 0; i < r->nseq; i++) {
            al_serve_seq *s = &r->seqs[i];
            char err[256];
            s->kv = al_infer_kv_new(s->w->model, r->nprompt + r->max_tokens,
                                    err, sizeof err);
            al_infer_rng_seed(&s->rng, s->seed, (uint64_t)i);
            if (!s->kv) {
                pthread_mutex_lock(&r->lock);
                snprintf(r->error, sizeof r->error, "%s", err);
                s->finish = AL_SERVE_FINISH_ABORT;
                pthread_mutex_unlock(&r->lock);
            }
        }
    }
}

/* One engine step: every running sequence advances by one token (a new one prefills its
 * prompt and samples its first token). Finished requests are notified and dropped. */
/* Grows the engine's per-step arrays to n sequences. 0 or -1. */
static int batch_ensure(al_serve_engine *e, int n)
{
    if (n <= e->cap_batch) return 0;
    int cap = e->cap_batch ? e->cap_batch : 16;
    while (cap < n)
        cap *= 2;
    float *lg = realloc(e->logits, sizeof(float) * (size_t)cap * e->V);
    if (lg) e->logits = lg;
    al_infer_kv **kv = realloc(e->b_kv, sizeof *kv * (size_t)cap);
    if (kv) e->b_kv = kv;
    const int32_t **tk = realloc(e->b_tok, sizeof *tk * (size_t)cap);
    if (tk) e->b_tok = tk;
    int *nt = realloc(e->b_n, sizeof *nt * (size_t)cap);
    if (nt) e->b_n = nt;
    al_serve_seq **sq = realloc(e->b_seq, sizeof *sq * (size_t)cap);
    if (sq) e->b_seq = sq;
    al_serve_req **rq = realloc(e->b_req, sizeof *rq * (size_t)cap);
    if (rq) e->b_req = rq;
    if (!lg || !kv || !tk || !nt || !sq || !rq) return -1;
    e->cap_batch = cap;
    return 0;
}

/* One engine step: every running sequence advances together in batched forwards (one per
 * weight set in use): a decoding sequence by one token, a new one by a chunk of its prompt
 * (its first token is sampled once the whole prompt is in). Finished requests are notified
 * and dropped. */
static void step(al_serve_engine *e)
{
    /* cancelled requests end here; the others' unfinished sequences form the batch */
    int nact = 0;
    for (size_t ri = 0; ri < e->running.n; ri++) {
        al_serve_req *r = e->running.v[ri];
        pthread_mutex_lock(&r->lock);
        int cancelled = r->cancelled;
        for (int i = 0; i < r->nseq; i++) {
            al_serve_seq *s = &r->seqs[i];
            if (s->finish || !s->kv) continue;
            if (cancelled) {
                s->finish = AL_SERVE_FINISH_ABORT;
                snprintf(r->error, sizeof r->error, "cancelled");
                continue;
            }
            /* n > 1: the other samples wait for the first one's prefill and copy it */
            al_serve_seq *s0 = &r->seqs[0];
            if (i > 0 && s->kv->len == 0 && s0->kv && !s0->finish && s0->kv->len < r->nprompt)
                continue;
            if (batch_ensure(e, nact + 1) != 0) {
                s->finish = AL_SERVE_FINISH_ABORT;
                snprintf(r->error, sizeof r->error, "out of memory");
                continue;
            }
            e->b_seq[nact] = s, e->b_req[nact] = r;
            nact++;
        }
        pthread_mutex_unlock(&r->lock);
    }
    /* one batched forward per weight set (two only while a swap drains) */
    for (int done = 0; done < nact;) {
        al_serve_weights *w = NULL;
        int n = 0;
        for (int j = done; j < nact; j++) {
            al_serve_seq *s = e->b_seq[j];
            if (!w) w = s->w;
            if (s->w != w) continue;
            /* move j to position done + n (stable grouping) */
            al_serve_seq *ts = e->b_seq[j];
            al_serve_req *tr = e->b_req[j];
            e->b_seq[j] = e->b_seq[done + n], e->b_req[j] = e->b_req[done + n];
            e->b_seq[done + n] = ts, e->b_req[done + n] = tr;
            n++;
        }
        for (int b = 0; b < n; b++) {
            al_serve_seq *s = e->b_seq[done + b];
            al_serve_req *r = e->b_req[done + b];
            e->b_kv[b] = s->kv;
            if (s->kv->len < r->nprompt) {
                int left = r->nprompt - s->kv->len;
                e->b_tok[b] = r->prompt + s->kv->len;
                e->b_n[b] = left < AL_SERVE_PREFILL_CHUNK ? left : AL_SERVE_PREFILL_CHUNK;
            } else {
                e->b_tok[b] = &s->ids[s->n - 1];
                e->b_n[b] = 1;
            }
        }
        char err[256];
        int rc = al_infer_forward(w->model, e->scratch, e->b_kv, e->b_tok, e->b_n, n, e->logits,
                                  err, sizeof err);
        for (int b = 0; b < n; b++) {
            al_serve_seq *s = e->b_seq[done + b];
            al_serve_req *r = e->b_req[done + b];
            if (rc == 0 && s->kv->len < r->nprompt) continue; /* prompt not all in yet */
            const float *lg = e->logits + (size_t)b * e->V;
            int first = rc == 0 && s == &r->seqs[0] && s->n == 0;
            pthread_mutex_lock(&r->lock);
            if (rc != 0) {
                snprintf(r->error, sizeof r->error, "%s", err);
                s->finish = AL_SERVE_FINISH_ABORT;
            } else {
                int32_t id = al_infer_sample(&e->sampler, lg, &s->sampling, &s->rng);
                if (seq_record(e, r, s, lg, id) != 0) {
                    snprintf(r->error, sizeof r->error, "out of memory");
                    s->finish = AL_SERVE_FINISH_ABORT;
                }
            }
            /* the first sample's prompt is in: the others take a copy of its cache and draw
             * their first token from the same logits */
            for (int j = 1; first && j < r->nseq; j++) {
                al_serve_seq *o = &r->seqs[j];
                if (o->finish || !o->kv || o->kv->len != 0) continue;
                if (al_infer_kv_copy_prefix(o->kv, s->kv, r->nprompt) != 0) {
                    snprintf(r->error, sizeof r->error, "kv cache copy failed");
                    o->finish = AL_SERVE_FINISH_ABORT;
                    continue;
                }
                int32_t id = al_infer_sample(&e->sampler, lg, &o->sampling, &o->rng);
                if (seq_record(e, r, o, lg, id) != 0) {
                    snprintf(r->error, sizeof r->error, "out of memory");
                    o->finish = AL_SERVE_FINISH_ABORT;
                }
            }
            pthread_mutex_unlock(&r->lock);
        }
        done += n;
    }
    for (size_t ri = 0; ri < e->running.n; ri++) {
        al_serve_req *r = e->running.v[ri];
        /* release finished sequences; notify once per request and step */
        int all_done = 1;
        for (int i = 0; i < r->nseq; i++) {
            al_serve_seq *s = &r->seqs[i];
            if (s->finish && s->w) seq_release(e, s);
            if (!s->finish) all_done = 0;
        }
        pthread_mutex_lock(&r->lock);
        if (all_done) r->done_seqs = r->nseq;
        if (!r->cancelled) notify(r);
        pthread_mutex_unlock(&r->lock);
        if (all_done) {
            e->running.v[ri] = e->running.v[--e->running.n];
            ri--; /* wraps at 0; the loop's ri++ brings it back */
            al_serve_req_unref(r);
        }
    }
    __atomic_fetch_add(&e->steps, 1, __ATOMIC_RELAXED);
}

static void *engine_main(void *arg)
{
    al_serve_engine *e = arg;
    for (;;) {
        pthread_mutex_lock(&e->lock);
        while (!e->stop && !e->queue_head && e->running.n == 0)
            pthread_cond_wait(&e->wake, &e->lock);
        int stop = e->stop;
        pthread_mutex_unlock(&e->lock);
        if (stop) break;
        admit(e);
        step(e);
    }
    /* abort what is left */
    admit(e);
    for (size_t ri = 0; ri < e->running.n; ri++) {
        al_serve_req *r = e->running.v[ri];
        for (int i = 0; i < r->nseq; i++) {
            al_serve_seq *s = &r->seqs[i];
            pthread_mutex_lock(&r->lock);
            if (!s->finish) {
                s->finish = AL_SERVE_FINISH_ABORT;
                snprintf(r->error, sizeof r->error, "server shutting down");
            }
            pthread_mutex_unlock(&r->lock);
            if (s->w) seq_release(e, s);
        }
        pthread_mutex_lock(&r->lock);
        r->done_seqs = r->nseq;
        notify(r);
        pthread_mutex_unlock(&r->lock);
        al_serve_req_unref(r);
    }
    e->running.n = 0;
    return NULL;
}

static void engine_free_batch(al_serve_engine *e)
{
    free(e->logits);
    free(e->b_kv);
    free(e->b_tok);
    free(e->b_n);
    free(e->b_seq);
    free(e->b_req);
    al_infer_scratch_free(e->scratch);
    al_infer_sampler_free(&e->sampler);
}

al_serve_engine *al_serve_engine_start(al_serve_weights *w, const al_tokenizer *tok,
                                       const al_serve_engine_opts *o, char *errstr, size_t errlen)
{
    al_serve_engine *e = calloc(1, sizeof *e);
    const al_model_config *c = al_model_config_of(w->model);
    if (!e) goto oom;
    e->o = *o, e->tok = tok, e->cur = w, e->weight_sets = 1, e->cfg = *c;
    if (!e->o.backend) e->o.backend = al_backend_cpu();
    if (al_model_set_backend(w->model, e->o.backend, errstr, errlen) != 0) goto fail;
    e->V = c->vocab_size;
    e->scratch = al_infer_scratch_new();
    if (!e->scratch || batch_ensure(e, 16) || al_infer_sampler_init(&e->sampler, e->V)) goto oom;
    /* what ends a sequence: the model's EOS, the tokenizer's, ChatML's end of turn */
    int32_t cand[4] = {(int32_t)c->eos_token_id, al_tokenizer_eos_id(tok),
                       al_tokenizer_token_to_id(tok, "<|im_end|>", 10),
                       al_tokenizer_token_to_id(tok, "<|endoftext|>", 13)};
    for (int i = 0; i < 4; i++) {
        int dup = cand[i] < 0 || cand[i] >= e->V;
        for (int j = 0; j < e->neos; j++)
            dup |= e->eos[j] == cand[i];
        if (!dup) e->eos[e->neos++] = cand[i];
    }
    pthread_mutex_init(&e->lock, NULL);
    pthread_cond_init(&e->wake, NULL);
    if (pthread_create(&e->thread, NULL, engine_main, e) != 0) {
        snprintf(errstr, errlen, "serve engine: cannot start its thread");
        pthread_mutex_destroy(&e->lock);
        pthread_cond_destroy(&e->wake);
        goto fail;
    }
    return e;
oom:
    snprintf(errstr, errlen, "serve engine: out of memory");
fail:
    if (e) {
        engine_free_batch(e);
        free(e);
    }
    weights_free(w);
    return NULL;
}

void al_serve_engine_stop(al_serve_engine *e)
{
    if (!e) return;
    pthread_mutex_lock(&e->lock);
    e->stop = 1;
    pthread_cond_signal(&e->wake);
    pthread_mutex_unlock(&e->lock);
    pthread_join(e->thread, NULL);
    weights_free(weights_unref_locked(e, e->cur));
    al_vec_free(&e->running);
    engine_free_batch(e);
    pthread_mutex_destroy(&e->lock);
    pthread_cond_destroy(&e->wake);
    free(e);
}

int al_serve_engine_submit(al_serve_engine *e, al_serve_req *r, char *errstr, size_t errlen)
{
    const al_model_config *c = &e->cfg; /* not e->cur: a swap may free it meanwhile */
    size_t need = al_serve_kv_bytes(c, r->nprompt + r->max_tokens) * (size_t)r->nseq;
    if (need > e->o.max_kv_bytes || r->nseq > e->o.max_seqs) {
        snprintf(errstr, errlen,
                 "the request needs %d sequences and %.1f MiB of KV cache; this server allows "
                 "%d sequences and %.1f MiB",
                 r->nseq, need / 1048576.0, e->o.max_seqs, e->o.max_kv_bytes / 1048576.0);
        return AL_SERVE_TOO_LARGE;
    }
    pthread_mutex_lock(&e->lock);
    int seqs = e->nrunning + e->nqueued_seqs;
    if (e->stop || seqs + r->nseq > e->o.max_seqs || e->kv_reserved + need > e->o.max_kv_bytes) {
        snprintf(errstr, errlen,
                 "server busy: %d sequences and %.1f MiB of KV cache in use (limits %d, %.1f MiB)",
                 seqs, e->kv_reserved / 1048576.0, e->o.max_seqs, e->o.max_kv_bytes / 1048576.0);
        pthread_mutex_unlock(&e->lock);
        return AL_SERVE_BUSY;
    }
    e->kv_reserved += need;
    for (int i = 0; i < r->nseq; i++)
        r->seqs[i].kv_bytes = need / (size_t)r->nseq;
    pthread_mutex_lock(&r->lock);
    r->refs++;
    pthread_mutex_unlock(&r->lock);
    r->next = NULL;
    if (e->queue_tail)
        e->queue_tail->next = r;
    else
        e->queue_head = r;
    e->queue_tail = r;
    e->nqueued_seqs += r->nseq;
    pthread_cond_signal(&e->wake);
    pthread_mutex_unlock(&e->lock);
    return AL_SERVE_OK;
}

void al_serve_engine_set_weights(al_serve_engine *e, al_serve_weights *w)
{
    pthread_mutex_lock(&e->lock);
    al_serve_weights *dead = weights_unref_locked(e, e->cur);
    e->cur = w;
    e->weight_sets++;
    e->swaps++;
    pthread_mutex_unlock(&e->lock);
    weights_free(dead);
}

al_backend *al_serve_engine_backend(al_serve_engine *e)
{
    return e->o.backend;
}

int64_t al_serve_engine_version(al_serve_engine *e)
{
    pthread_mutex_lock(&e->lock);
    int64_t v = e->cur->version;
    pthread_mutex_unlock(&e->lock);
    return v;
}

al_serve_weights *al_serve_engine_weights_ref(al_serve_engine *e)
{
    pthread_mutex_lock(&e->lock);
    al_serve_weights *w = e->cur;
    w->refs++;
    pthread_mutex_unlock(&e->lock);
    return w;
}

void al_serve_engine_weights_unref(al_serve_engine *e, al_serve_weights *w)
{
    pthread_mutex_lock(&e->lock);
    al_serve_weights *dead = weights_unref_locked(e, w);
    pthread_mutex_unlock(&e->lock);
    weights_free(dead);
}

void al_serve_engine_stats_get(al_serve_engine *e, al_serve_engine_stats *s)
{
    pthread_mutex_lock(&e->lock);
    s->running = e->nrunning;
    s->queued = e->nqueued_seqs;
    s->kv_bytes = e->kv_reserved;
    s->tokens_generated = __atomic_load_n(&e->tokens, __ATOMIC_RELAXED);
    s->steps = __atomic_load_n(&e->steps, __ATOMIC_RELAXED);
    s->swaps = e->swaps;
    s->weight_sets = e->weight_sets;
    pthread_mutex_unlock(&e->lock);
}
