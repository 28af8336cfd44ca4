/*
 * policy.h: the serve stage's weight follower. Reads arclight.policy (PolicyVersion, keyed by
 * model name) with an assign-only reader (no consumer group, so nothing to join, leave or
 * commit) on a thread of its own, and keeps the newest version of its model seen so far. A
 * second thread loads that version: fetches the weights from checkpoint_uri (file:// under a
 * checkpoint root, or http(s):// through libcurl; a URI ending in '/' is a directory and
 * model.safetensors is fetched from it), checks their sha256, loads them into a new model of
 * the served shape, checks that every weight is finite and hands the model to the engine. A
 * version that cannot be fetched or does not match is logged and skipped (the old weights keep
 * serving). A newer version seen while one is being fetched cuts that fetch short, so a slow or
 * stalled download never holds up the versions after it.
 *
 * What a PolicyVersion may make the server read is bounded: see fetch.h.
 *
 * At start the follower reads the topic up to its end and loads the newest version it found
 * (al_serve_policy_wait_ready), so that a restarted server does not answer from its initial
 * weights, nor load every older version in turn.
 */
#ifndef ARCLIGHT_SERVE_POLICY_H
#define ARCLIGHT_SERVE_POLICY_H

#include "core/cli.h"
#include "engine.h"
#include "fetch.h"

#include <stddef.h>
#include <stdint.h>

/* The largest model.safetensors a model of m's shape may come as: every parameter as F32 (the
 * widest dtype read), an lm_head a tied model's file may carry anyway, a header of up to 1 KiB
 * per tensor plus 64 KiB, and 1/16 + 1 MiB of headroom. */
size_t al_serve_weights_max_bytes(const al_model *m);

/* Loads fetched bytes (takes ownership of bytes) into a new model of shape cfg, and checks
 * that every parameter is finite. NULL with errstr. */
al_model *al_serve_model_from_bytes(const al_model_config *cfg, uint8_t *bytes, size_t len,
                                    const char *what, char *errstr, size_t errlen);

/* ---- the follower --------------------------------------------------------------------- */

typedef struct al_serve_policy_opts {
    const char *topic, *model;   /* copied */
    const al_model_config *cfg;  /* the served shape (copied) */
    al_serve_fetch_opts fetch;   /* copied, roots included; abort is the follower's own */
} al_serve_policy_opts;

typedef struct al_serve_policy al_serve_policy;

/* Starts following with the client settings of `common`. NULL with errstr when the Kafka
 * client cannot be set up (a broker that cannot be reached is not an error: the follower
 * keeps trying and logs why). */
al_serve_policy *al_serve_policy_start(const al_cli_common *common,
                                       const al_serve_policy_opts *opts, al_serve_engine *eng,
                                       char *errstr, size_t errlen);

/* Waits until the follower has read the topic to the end it had at start and the newest
 * version of the model found there is loaded (or refused), or timeout_s passes. 0 when ready,
 * -1 on the timeout (with what it was waiting for in errstr). */
int al_serve_policy_wait_ready(al_serve_policy *p, double timeout_s, char *errstr, size_t errlen);

/* Stops both threads (a fetch in progress is abandoned) and frees. Never waits on the broker:
 * the reader is destroyed without a consumer close. NULL-safe. */
void al_serve_policy_stop(al_serve_policy *p);

/* 0 while the follower runs; 1 once it has stopped on a fatal client error (the reason in
 * reason, for /health: the server keeps serving the weights it has but no longer follows). */
int al_serve_policy_failed(al_serve_policy *p, char *reason, size_t reasonlen);

#endif
