/*
 * engine.h: the policy server's engine. One thread runs every sequence: prefill of a new
 * sequence's prompt into its own KV cache, then one decode step after another over all
 * running sequences (continuous batching: sequences join and leave between steps).
 *
 * A step is one batched forward (model/infer.h) over every running sequence.
 *
 * Weights are refcounted sets (al_serve_weights). A sequence takes a reference to the
 * current set when it is admitted and keeps it to its end, so al_serve_engine_set_weights
 * never changes the weights under a running sequence; the old set is freed when its last
 * sequence finishes.
 *
 * A request (al_serve_req) is n sequences of one prompt (OpenAI's n). It is shared by the
 * HTTP side and the engine, each holding one reference. The engine writes each sequence's
 * progress under the request's lock and then calls the request's notify function (on the
 * engine thread, lock not held); the HTTP side reads the progress under the lock.
 */
#ifndef ARCLIGHT_SERVE_ENGINE_H
#define ARCLIGHT_SERVE_ENGINE_H

#include "core/buf.h"
#include "model/infer.h"
#include "model/model.h"
#include "text/tokenizer.h"

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

/* Prompt tokens a new sequence prefills per engine step (chunked prefill: a long prompt
 * does not stall the sequences decoding meanwhile for more than one chunk). */
#define AL_SERVE_PREFILL_CHUNK 256

typedef struct al_serve_weights {
    al_model *model; /* owned */
    int64_t version; /* policy version (0: the weights loaded at start-up) */
    int refs;        /* under the engine's lock */
} al_serve_weights;

/* Wraps a loaded model (takes ownership of m, also on failure). NULL when out of memory. */
al_serve_weights *al_serve_weights_new(al_model *m, int64_t version);

typedef enum al_serve_finish {
    AL_SERVE_RUNNING = 0,
    AL_SERVE_FINISH_LENGTH, /* max_tokens or the context length reached */
    AL_SERVE_FINISH_STOP,   /* a stop token or a stop string */
    AL_SERVE_FINISH_ABORT,  /* cancelled, or an engine error (error says which) */
} al_serve_finish;

/* One sequence (an OpenAI choice). Inputs are set before submit; outputs are written by the
 * engine under the request's lock. */
typedef struct al_serve_seq {
    /* inputs */
    al_infer_sampling sampling;
    uint64_t seed;
    int top_logprobs; /* -1: no logprobs kept; 0: the chosen token's; k: and the top k */
    /* outputs */
    int32_t *ids;      /* (n) generated ids */
    double *logps;     /* (n) raw logprob of each */
    size_t *text_end;  /* (n) text.len once token i was decoded (streaming splits by it) */
    int32_t *top_ids;  /* (n, top_logprobs) */
    double *top_logps; /* (n, top_logprobs) */
    int n, cap;
    al_buf text; /* decoded text of ids (special tokens skipped); data NUL-terminated, NULL
                    until the first character */
    size_t safe_len;        /* text[0..safe_len) can be shown: never part of a stop string */
    al_serve_finish finish; /* once set, the sequence is done */
    char *stop_reason;      /* the stop string that ended it; or NULL */
    int32_t stop_token;     /* the stop_token_ids entry that ended it; or -1 (vLLM's
                               stop_reason is then that id; an EOS leaves both unset) */
    /* engine side */
    al_infer_kv *kv;
    al_serve_weights *w;
    al_tokenizer_stream ts;
    al_infer_rng rng; /* seeded from (seed, index of the sequence) at admission */
    size_t kv_bytes;
} al_serve_seq;

typedef struct al_serve_req al_serve_req;
typedef void (*al_serve_notify_fn)(al_serve_req *r, void *ud);

struct al_serve_req {
    pthread_mutex_t lock;
    int refs; /* under lock */
    int cancelled;
    int32_t *prompt; /* owned */
    int nprompt;
    int max_tokens;
    int ignore_eos;
    char **stop; /* stop strings, owned */
    int nstop;
    int32_t *stop_ids; /* extra stop token ids, owned */
    int nstop_ids;
    int nseq;
    al_serve_seq *seqs;     /* (nseq) */
    int64_t policy_version; /* of the weights the sequences run on; -1 until admitted */
    int admitted, done_seqs;
    char error[256];
    al_serve_notify_fn notify; /* NULL once the HTTP side has gone away */
    void *notify_ud;
    struct al_serve_req *next; /* engine queue */
};

/* A request for nseq sequences of prompt (copied); refs = 1 (the caller's). NULL when out
 * of memory. Set max_tokens, stops and each seq's inputs before submitting. */
al_serve_req *al_serve_req_new(const int32_t *prompt, int nprompt, int nseq);
/* Drops one reference; the last frees everything. */
void al_serve_req_unref(al_serve_req *r);
/* Marks the request cancelled: the engine finishes its sequences with ABORT at the next
 * step and no longer notifies. Call before dropping the HTTP side's reference. */
void al_serve_req_detach(al_serve_req *r);

typedef struct al_serve_engine_opts {
    int max_seqs;             /* sequences running or queued at once */
    size_t max_kv_bytes;      /* KV cache reserved by those sequences */
    int max_model_len;        /* prompt + generated tokens */
    int logprobs_temperature; /* 0: raw logprobs (vLLM's default); 1: log softmax(logits / T)
                                 with the request's temperature T (raw when T = 0) */
    al_backend *backend;      /* where the weights and KV caches live (NULL: the CPU); borrowed,
                                 outlives the engine */
} al_serve_engine_opts;

typedef struct al_serve_engine al_serve_engine;

/* Starts the engine thread on `w` (takes ownership of the caller's reference) and `tok`
 * (borrowed; outlives the engine); w's model is moved to o->backend. NULL with errstr. */
al_serve_engine *al_serve_engine_start(al_serve_weights *w, const al_tokenizer *tok,
                                       const al_serve_engine_opts *o, char *errstr, size_t errlen);
/* Stops: running sequences finish with ABORT, the thread is joined, everything freed. */
void al_serve_engine_stop(al_serve_engine *e);

/* Results of submit. */
enum {
    AL_SERVE_OK = 0,
    AL_SERVE_BUSY = 1,     /* over max_seqs or max_kv_bytes now: retry later (429) */
    AL_SERVE_TOO_LARGE = 2 /* can never fit (400); errstr says why */
};
/* Queues r (the engine takes its own reference). */
int al_serve_engine_submit(al_serve_engine *e, al_serve_req *r, char *errstr, size_t errlen);

/* The backend weight sets must be on (al_model_set_backend) before set_weights. */
al_backend *al_serve_engine_backend(al_serve_engine *e);

/* Replaces the weights new sequences start on (takes ownership of the caller's reference
 * to w; its model is on the engine's backend). Sequences already admitted keep theirs. */
void al_serve_engine_set_weights(al_serve_engine *e, al_serve_weights *w);
/* The version new sequences would get now. */
int64_t al_serve_engine_version(al_serve_engine *e);
/* A new reference to the current weights (release with al_serve_engine_weights_unref). */
al_serve_weights *al_serve_engine_weights_ref(al_serve_engine *e);
void al_serve_engine_weights_unref(al_serve_engine *e, al_serve_weights *w);

typedef struct al_serve_engine_stats {
    int running, queued;
    size_t kv_bytes;
    uint64_t tokens_generated, steps, swaps;
    int weight_sets; /* weight sets alive (current + those still used by sequences) */
} al_serve_engine_stats;
void al_serve_engine_stats_get(al_serve_engine *e, al_serve_engine_stats *s);

/* KV bytes one sequence of `tokens` tokens takes for model config c. */
size_t al_serve_kv_bytes(const al_model_config *c, int tokens);

#endif
