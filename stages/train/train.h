/*
 * train.h: what the files of `arclight train` share (main.c, steps.c, versions.c, resume.c):
 * the options, the worker's state, and each file's entry points. Internal to stages/train.
 */
#ifndef ARCLIGHT_TRAIN_TRAIN_H
#define ARCLIGHT_TRAIN_TRAIN_H

#include "assembler.h"
#include "ckpt_http.h"

#include "core/tbevent.h"
#include "http/metrics.h"
#include "kafka/kafka.h"
#include "kafka/stage.h"
#include "model/dist.h"
#include "model/model.h"
#include "model/trainer.h"

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#define COMP "train"

typedef struct train_opts {
    const char *model_dir, *tok_dir, *out_dir, *model_name, *listen, *train_config;
    const char *tensorboard; /* --tensorboard DIR, or NULL */
    const char *input_topic, *policy_topic, *group;
    const char *device; /* cuda, cpu or auto (NULL: auto) */
    int resume;
    int model_wait; /* --model-wait S */
    int64_t checkpoint_every, keep, stop_after;
    int64_t kill_version;
    int kill_after_ack; /* fault point: 0 after the checkpoint, 1 after the PolicyVersion's ack */
    int diverge_rank;        /* fault point: this rank's weights change after ... */
    int64_t diverge_version; /* ... this version (-1: never) */
} train_opts;

typedef struct held_msg {
    rd_kafka_message_t *m;
    al_input *in;
} held_msg;

/* An applied step waiting for its PolicyVersion's ack and a full checkpoint: only the
 * input handles of its chunks are kept (the messages and decoded chunks are freed once the
 * update is done, so that --checkpoint-every N holds N steps' handles, not their bytes). */
typedef struct applied {
    int64_t version;
    held_msg **hs;
    size_t n;
    int acked;
    struct applied *next;
} applied;

typedef struct train_metrics {
    al_metrics *reg;
    al_counter *held, *other, *skipped, *dup, *bad, *steps, *bad_steps, *tokens;
    al_gauge *version, *loss, *kl, *entropy, *clip, *gnorm, *tps, *lr, *pending;
    al_gauge *call_entropy[AL_TRAIN_CALL_POSITIONS]; /* the sampler's, by call position */
} train_metrics;

typedef struct train_worker {
    train_opts *o;
    char out_abs[PATH_MAX];
    al_model *policy, *reference;
    al_backend *be; /* the models' backend (cpu or cuda) */
    al_dist *dist;  /* data-parallel group; NULL: alone */
    int follower;   /* a rank > 0 of the group: trains, never writes or publishes */
    al_trainer *tr;
    al_train_asm *asmb;
    al_ckpt_http *http;
    al_dist_opts dopt; /* from the environment, before the run */
    train_metrics met;
    int64_t version, last_full, batch_step;
    char last_metrics[2048]; /* metrics JSON of the last update (for the SIGTERM checkpoint) */
    applied *applied_head;
    al_stage st; /* the worker (kafka/stage.h): failure latch, /healthz, producer, consumer */
    char follower_group[PATH_MAX + 96];
    al_tb_writer tb; /* --tensorboard (tboard.c) */
    int tb_failed;
} train_worker;

/* ---- steps.c: what becomes of a complete step ---- */

/* Ends a held chunk's input and frees it with its message, if that is still
 * there; opaque is the held_msg, ctx unused (al_train_asm_free's release callback). */
void train_held_release(void *ctx, void *opaque);
/* Dead-letters the held messages msgs[0..n) with reason (a failure latches the stage). */
void train_step_deadletter(train_worker *w, void **msgs, size_t n, const char *reason);
/* Trains on one complete step and publishes its version. Takes ownership of r. */
void train_step_apply(train_worker *w, al_train_ready *r);
/* Releases the inputs of steps acknowledged and covered by a full checkpoint. */
void train_applied_retire(train_worker *w);
/* tboard.c: an update's scalars as a TensorBoard event (--tensorboard; rank 0 only). */
void train_tb_write(train_worker *w, const al_train_stats *st, double reward_mean,
                    int64_t batch_policy);
/* Releases one applied step's inputs and frees it. */
void train_applied_free(applied *a);

/* ---- versions.c: writing a version and publishing its PolicyVersion ---- */

/* The URI a PolicyVersion names for version: http:// on --listen, else file:// under --out. */
void train_version_uri(train_worker *w, int64_t version, char *out, size_t outlen);
/* Sends a PolicyVersion for version (weights sha) with stats; opaque goes to the delivery
 * callback. 0 or -1 with errstr. */
int train_version_publish(train_worker *w, int64_t version, int64_t batch_step, const char *sha,
                          const al_train_stats *st, double reward_mean, int64_t batch_policy,
                          void *opaque, char *errstr, size_t errlen);
/* The metrics JSON of an update, as the checkpoint's trainer_state.json records it. */
void train_version_stats_json(const al_train_stats *st, train_worker *w, int64_t batch_step,
                              int64_t batch_policy, double reward_mean, char *out, size_t outlen);
/* Writes the weights of the current version: a full checkpoint or a weights-only snapshot,
 * and prunes the old ones. Fills sha. 0 or -1 with errstr. */
int train_version_save(train_worker *w, int full, const char *metrics, char sha[65],
                       char *errstr, size_t errlen);

/* ---- resume.c: --resume ---- */

/* Loads the newest full checkpoint under --out when there is one and publishes its version
 * again. 0, 1 (nothing to resume), or -1 with errstr. */
int train_resume(train_worker *w, char *errstr, size_t errlen);

#endif
