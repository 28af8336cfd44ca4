/*
 * checkpoint.h: training checkpoints that resume exactly.
 *
 * al_checkpoint_save writes ROOT/step-N/ (N = the caller's training-step count):
 *   model.safetensors      the policy's weights in f32 with Hugging Face names (loads
 *                          unchanged in transformers / vLLM; f32 so that resume is exact)
 *   config.json            the model's config
 *   optimizer.safetensors  AdamW moments: "exp_avg" and "exp_avg_sq", each (num_params) f32
 *                          in the order of the flat parameter vector
 *   trainer_state.json     {"format": "arclight-trainer-state", "version": 1, "step": N,
 *                          "optimizer_step": updates done (the schedule position),
 *                          "num_params", "weights_sha256", the loss and optimizer settings,
 *                          and the caller's metrics}
 * The directory is written as ROOT/step-N.tmp-PID and renamed into place, so a crash never
 * leaves a half-written step-N; an existing step-N is replaced.
 *
 * al_checkpoint_load restores the weights, both moments and the optimizer step into a
 * trainer whose model has the same shape, after checking the weights' sha256 against the
 * state file. Continuing from there gives bitwise the same losses as never having stopped
 * (the trainer has no randomness).
 */
#ifndef ARCLIGHT_MODEL_CHECKPOINT_H
#define ARCLIGHT_MODEL_CHECKPOINT_H

#include "model/trainer.h"

#include <stddef.h>
#include <stdint.h>

typedef struct al_checkpoint_info {
    int64_t step;              /* training steps done */
    int64_t optimizer_step;    /* optimizer updates done */
    char dir[1024];            /* ROOT/step-N */
    char weights_path[1100];   /* ROOT/step-N/model.safetensors */
    char weights_sha256[65];   /* of model.safetensors, lowercase hex */
} al_checkpoint_info;

/* Writes ROOT/step-N (ROOT is created when missing). `metrics_json` (may be NULL) is a JSON
 * object's text stored as "metrics" in trainer_state.json (e.g. the step's loss, KL, ...).
 * Fills *info. 0, or -1 with errstr naming the path that failed. */
int al_checkpoint_save(al_trainer *tr, const char *root, int64_t step, const char *metrics_json,
                       al_checkpoint_info *info, char *errstr, size_t errlen);

/* Restores a checkpoint directory (ROOT/step-N) into tr: weights, AdamW moments and step.
 * Fills *info (may be NULL). 0, or -1 with errstr: missing or malformed file, a shape that
 * differs from tr's model, a sha256 mismatch. On failure tr may be partly overwritten. */
int al_checkpoint_load(al_trainer *tr, const char *dir, al_checkpoint_info *info, char *errstr,
                       size_t errlen);

/* Finds the newest complete checkpoint (highest N with a trainer_state.json) under ROOT.
 * 1 and its path in out (outlen bytes) and N in *step; 0 when there is none (or ROOT does
 * not exist); -1 with errstr when ROOT cannot be read. */
int al_checkpoint_latest(const char *root, char *out, size_t outlen, int64_t *step, char *errstr,
                         size_t errlen);

/* Removes all but the newest `keep` complete checkpoints under ROOT (keep >= 1), and any
 * step-N.tmp-PID left by a crashed save. Only the files a checkpoint writes (and the
 * companions below) are deleted; a directory holding anything else is left in place.
 * Returns the number of checkpoints removed, or -1 with errstr when ROOT cannot be read. */
int al_checkpoint_prune(const char *root, int keep, char *errstr, size_t errlen);

/* The files besides config.json and model.safetensors that make a checkpoint directory a
 * Hugging Face model directory that transformers, vLLM and SGLang load as it is: the
 * tokenizer (tokenizer.json, tokenizer_config.json, the slow tokenizer's vocab.json and
 * merges.txt, special_tokens_map.json, added_tokens.json, chat_template.jinja) and
 * generation_config.json. NULL-terminated. */
extern const char *const al_checkpoint_companions[];

/* Copies each companion file present in `from` (a model directory) into `to` (replacing any
 * there, each atomically). Returns how many were copied, or -1 with errstr naming the file
 * that could not be read or written. */
int al_checkpoint_copy_companions(const char *from, const char *to, char *errstr, size_t errlen);

#endif
