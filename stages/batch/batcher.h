/*
 * batcher.h: the batching stage's logic, with no Kafka in it: transitions in, trainer steps
 * out. `arclight batch` (stage.c) feeds it from arclight.transitions and writes what it
 * returns to arclight.batches; tests and the benchmark call it directly.
 *
 *   transitions ──add──▶ open groups (per model, group id) ──close──▶ complete groups, queued
 *   per model in closing order ──next_step──▶ a step: whole groups adding up to the target
 *   (sequences or tokens), staleness applied, advantages optionally whitened, sequences
 *   packed into token-budgeted micro-batches (first-fit decreasing), micro-batches cut into
 *   BatchChunk messages under the maximum message size, each encoded.
 *
 * Groups. Credit emits a group's transitions together, keyed by group key, so they arrive on
 * one input lane (a Kafka partition) one after the other. A group is closed when a transition
 * of another group arrives on its lane after it has seen transitions of group_size distinct
 * rollouts, or by al_batcher_close_idle once nothing came for it for a while and nothing more
 * is waiting on its lane, or by al_batcher_close_all. A transition of a group that is closed but not yet in a step joins it;
 * one of a group already emitted starts a new group with the same id (nothing is dropped).
 *
 * Determinism: nothing here reads a clock or iterates a hash table to build output. The same
 * calls in the same order (with the same `now` values given to close_idle) produce the same
 * steps, byte for byte.
 *
 * Duplicates: a transition id seen before (within the last `dedup_window` ids) is refused.
 * The window holds 64-bit hashes of ids (FNV-1a then a 64-bit mixer) in a FIFO ring plus an
 * open-addressing table: 24 bytes per id at most, so the default window of 1,000,000 ids
 * costs about 24 MiB. Two different ids collide with probability ~n^2/2^65 (3e-8 at 1M).
 *
 * Inputs: each added transition carries an opaque pointer of the caller (the stage passes
 * its Kafka input handle). A step hands back the opaques of its transitions (release them
 * once the step's chunks are acknowledged); transitions dropped inside the batcher (a stale
 * group) hand theirs to the on_drop callback.
 *
 * Not thread-safe: one batcher per thread.
 */
#ifndef ARCLIGHT_STAGES_BATCH_BATCHER_H
#define ARCLIGHT_STAGES_BATCH_BATCHER_H

#include "avro/codec.h"

#include <stddef.h>
#include <stdint.h>

typedef enum al_batch_stale_policy {
    AL_BATCH_STALE_DROP = 0, /* a group with a transition lagging > max_staleness is dropped */
    AL_BATCH_STALE_KEEP = 1, /* kept; counted in the step's n_stale */
} al_batch_stale_policy;

/* Called for every transition the batcher drops after accepting it (reason: "stale"). */
typedef void (*al_batch_drop_fn)(void *ctx, void *opaque, const char *reason);

typedef struct al_batch_config {
    int64_t step_sequences;   /* close a step at >= this many sequences (0: another target) */
    int64_t step_tokens;      /* close a step at >= this many tokens (0: another target) */
    int64_t step_groups;      /* close a step at this many groups (0: another target); what
                                 a rollout controller paces on: a step is K groups however
                                 many calls their rollouts made */
    int64_t micro_batch_tokens; /* token budget of one micro-batch (default 16384) */
    int64_t max_message_bytes;  /* encoded BatchChunk limit (default 1048576 - 64 KiB slack) */
    int64_t max_staleness;    /* versions behind the latest; -1: no bound (default 4) */
    al_batch_stale_policy stale_policy;
    int whiten;               /* 1: advantages (x - mean) / (std + 1e-8) over the step's
                                 loss tokens (REINFORCE++ style) */
    size_t dedup_window;      /* ids remembered for duplicate detection (default 1000000) */
    al_batch_drop_fn on_drop; /* may be NULL */
    void *on_drop_ctx;
} al_batch_config;

/* Fills the defaults above (step_sequences 64, step_tokens 0, step_groups 0). */
void al_batch_config_default(al_batch_config *c);

typedef enum al_batch_add_result {
    AL_BATCH_ADDED = 0,     /* held: the opaque comes back with a step or via on_drop */
    AL_BATCH_DUPLICATE = 1, /* id seen before: not held (the caller releases its input) */
    AL_BATCH_INVALID = 2,   /* not held; errstr says why (dead-letter it) */
} al_batch_add_result;

/* One step, ready to send. Owned by the caller: al_batch_step_free. */
typedef struct al_batch_step {
    char *model;
    int64_t step;
    int64_t policy_version; /* the latest version known for the model when it closed; -1 */
    al_buf *chunks;         /* n_chunks encoded BatchChunk messages, in order */
    size_t n_chunks;
    void **opaques; /* n_opaques: one per transition in the step, group by group */
    size_t n_opaques;
    int32_t n_groups, n_sequences, n_micro_batches;
    int64_t n_tokens, n_loss_tokens;
    int64_t capacity_tokens; /* n_micro_batches x micro_batch_tokens */
    double efficiency;       /* n_tokens / capacity_tokens */
    int64_t *lags;           /* n_sequences: latest - sampled version; -1 when unknown */
    int32_t n_stale;         /* sequences kept although lagging > max_staleness */
    int32_t n_dropped_stale; /* transitions dropped as stale while building this step */
} al_batch_step;

void al_batch_step_free(al_batch_step *s);

typedef struct al_batcher al_batcher;

/* A batcher with a copy of cfg. NULL with errstr on a bad config (no or negative target,
 * budget < 2, message limit too small for one micro-batch of the budget). */
al_batcher *al_batcher_new(const al_batch_config *cfg, char *errstr, size_t errlen);
/* Frees everything; opaques still held are not released (the caller's inputs die with it). */
void al_batcher_free(al_batcher *b);

/* Hands every opaque the batcher still holds to fn(ctx, opaque, "shutdown") and forgets
 * those transitions (open and queued groups alike). */
void al_batcher_release_all(al_batcher *b, al_batch_drop_fn fn, void *ctx);

/* Checks and copies t (the batcher keeps no pointer into it). lane: the input it came from
 * (a partition), used to close the lane's previous group; now_us: a monotonic time used
 * only by al_batcher_close_idle. */
al_batch_add_result al_batcher_add(al_batcher *b, const al_transition *t, int32_t lane,
                                   int64_t now_us, void *opaque, char *errstr, size_t errlen);

/* Remembers an id as seen (recovery from the output topic). */
void al_batcher_mark_seen(al_batcher *b, const char *id);

/* Whether nothing more is waiting to be read on a lane (its partition is consumed up to its
 * high watermark): a group's missing transitions can then not be sitting in the lane. */
typedef int (*al_batch_lane_quiet_fn)(void *ctx, int32_t lane);

/* Closes groups with no transition since before now_us - idle_us whose lane is quiet
 * (quiet NULL: every lane is). Returns how many. A gap between two fetches of a busy
 * partition thus never cuts a group: there the next group's first transition closes it. */
int al_batcher_close_idle(al_batcher *b, int64_t now_us, int64_t idle_us,
                          al_batch_lane_quiet_fn quiet, void *quiet_ctx);
/* Closes every open group (end of input). */
int al_batcher_close_all(al_batcher *b);

/* The latest policy version of a model (ignored when older than the one known). 0 or -1
 * when out of memory. */
int al_batcher_set_policy_version(al_batcher *b, const char *model, int64_t version);
/* The number the model's next step gets (recovery). 0, or -1 when out of memory or when
 * step is outside [0, AL_STEP_MAX] (the BatchChunk contract's bound; recovery ignores a
 * chunk numbered AL_STEP_MAX or beyond, so that the next number stays within it). */
int al_batcher_set_next_step(al_batcher *b, const char *model, int64_t step);
int64_t al_batcher_next_step_number(const al_batcher *b, const char *model);

/* Builds the next step of any model that has enough complete groups (models in the order
 * they first appeared). 1 with *out, 0 when none is ready, -1 with errstr (out of memory,
 * an encoding failure). */
int al_batcher_next_step(al_batcher *b, al_batch_step **out, char *errstr, size_t errlen);
/* Like next_step, but also takes a final, smaller step from what is complete (end of input,
 * tests, benchmarks). */
int al_batcher_flush_step(al_batcher *b, al_batch_step **out, char *errstr, size_t errlen);

/* Counters since creation. */
typedef struct al_batcher_stats {
    int64_t added, duplicates, invalid, dropped_stale;
    int64_t open_groups, queued_groups, queued_sequences;
} al_batcher_stats;
void al_batcher_get_stats(const al_batcher *b, al_batcher_stats *out);

/* ---- pure helpers, exposed for tests and the benchmark ---------------------------------- */

/* First-fit decreasing: packs n items of size len[i] (each <= cap) into bins of capacity cap
 * and, when cost is not NULL, also of cost capacity cost_cap. Items are placed longest first
 * (ties: lower index first) into the first bin with room. bin_of[i] receives each item's
 * bin; returns the number of bins, or -1 (an item over a capacity, out of memory). */
int al_batch_pack_ffd(const int64_t *len, const int64_t *cost, size_t n, int64_t cap,
                      int64_t cost_cap, int32_t *bin_of);

/* Upper bound of the encoded size of one micro-batch with n_tokens tokens and n_sequences
 * sequences whose ids total id_bytes bytes. */
int64_t al_batch_micro_batch_bytes(int64_t n_tokens, int64_t n_sequences, int64_t id_bytes);

#endif
