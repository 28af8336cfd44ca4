/*
 * assembler.h: trainer steps from BatchChunk messages (arclight.batches), no Kafka.
 *
 * The batch stage writes a step as chunk_count chunks (index 0 .. count-1), in order, on the
 * model's partition. After a crash it rebuilds a step cut short under the same number and
 * sends it again from chunk 0, so for each step the assembler keeps the chunks that follow
 * the last chunk 0 it saw; the chunks of the abandoned attempt are retired (their opaques are
 * handed back with the step, so that their inputs are released together with it).
 *
 * Each chunk is decoded and checked when it arrives (model, indices, token ids inside the
 * vocabulary, positions, per-token arrays); a complete step is checked against the totals its
 * chunks announce (micro-batches, sequences, tokens, loss tokens). Steps at or below the last
 * applied step are not held again (they were trained on before a restart).
 *
 * Ownership: the assembler copies nothing the caller keeps; decoded chunks are its own. Each
 * add takes an `opaque` (the caller's handle on the message, e.g. its al_input): it is either
 * returned at once (any result but AL_TRAIN_ASM_HELD: the caller releases it) or kept and
 * handed back in an al_train_ready (which the caller frees with al_train_ready_free after
 * releasing the opaques).
 */
#ifndef ARCLIGHT_TRAIN_ASSEMBLER_H
#define ARCLIGHT_TRAIN_ASSEMBLER_H

#include "model/trainer.h"

#include <stddef.h>
#include <stdint.h>

typedef enum al_train_asm_result {
    AL_TRAIN_ASM_HELD = 0,        /* kept; its step is not complete yet, or just completed */
    AL_TRAIN_ASM_OTHER_MODEL = 1, /* a chunk of another model: not ours */
    AL_TRAIN_ASM_APPLIED = 2,     /* a chunk of a step applied already (<= last applied) */
    AL_TRAIN_ASM_DUPLICATE = 3,   /* the same bytes as a chunk held for this step */
    AL_TRAIN_ASM_BAD = 4,         /* undecodable or inconsistent: dead-letter it (why says) */
} al_train_asm_result;

typedef struct al_train_asm al_train_asm;

/* An assembler for `model` (copied), with the vocabulary size and maximum position of the
 * model being trained; steps <= last_applied (-1: none) are skipped. NULL with errstr. */
al_train_asm *al_train_asm_new(const char *model, int vocab_size, int max_positions,
                               int64_t last_applied, char *errstr, size_t errlen);
/* Frees held steps; their opaques are passed to release(ctx, opaque) first (NULL: none). */
void al_train_asm_free(al_train_asm *a, void (*release)(void *ctx, void *opaque), void *ctx);

/* Decodes and files one message value. Returns the result; on AL_TRAIN_ASM_BAD `why` holds
 * the reason (naming the field), on the others a short note for the log. */
al_train_asm_result al_train_asm_add(al_train_asm *a, const void *value, size_t len,
                                     void *opaque, char *why, size_t whylen);

/* A step taken out of the assembler: complete and checked (bad == 0), or to dead-letter
 * (bad == 1, reason in `reason`: totals that do not add up, or a step left incomplete when
 * a later step completed). */
/* Call positions whose sampled entropy a step reports (later calls are left out). */
#define AL_TRAIN_CALL_POSITIONS 4

typedef struct al_train_ready {
    int64_t step;               /* the batch stage's step number */
    int64_t policy_version;     /* the sampler's version the step was built for */
    int bad;
    char reason[512];
    al_train_chunk *chunks;     /* (nchunks) micro-batches in order, for al_trainer_step */
    int nchunks;
    void **current;             /* (n_current) opaques of the chunks making up the step */
    size_t n_current;
    void **retired;             /* (n_retired) opaques of abandoned attempts / duplicates */
    size_t n_retired;
    int64_t tokens, loss_tokens, sequences;
    double reward_mean;         /* over sequences with a reward; NaN when none has one */
    /* The sampler's entropy per call position k (the k-th call of its rollout in this step,
     * by the call index in the transition id; a merged sequence counts at its first call):
     * the mean of -rollout logprob over the trained tokens, an unbiased estimate of the
     * per-token entropy of the policy that sampled them. NaN where no sequence has a call
     * k. A position whose entropy falls towards 0 has collapsed onto one answer. */
    double call_entropy[AL_TRAIN_CALL_POSITIONS];
    struct al_train_ready_priv *priv;
} al_train_ready;

/* Takes the next step out: 1 with *out (bad or good), 0 when none is ready. Steps come out
 * in the order they complete; a held step older than a completed one comes out first, as
 * bad ("incomplete"). Taking a good step out makes it the last applied one. */
int al_train_asm_next(al_train_asm *a, al_train_ready **out);
void al_train_ready_free(al_train_ready *r);

/* Steps held (incomplete). */
size_t al_train_asm_pending(const al_train_asm *a);
int64_t al_train_asm_last_applied(const al_train_asm *a);

#endif
