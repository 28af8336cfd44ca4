/*
 * policy.h: the serve stage's weight follower. Reads arclight.policy (PolicyVersion, keyed
 * by model name) on a thread of its own; for each version of its model newer than the one
 * served, fetches the weights from checkpoint_uri (file:// or http(s):// through libcurl; a
 * URI ending in '/' is a directory and model.safetensors is fetched from it), checks their
 * sha256, loads them into a new model of the served shape and hands it to the engine. A
 * version that cannot be fetched or does not match is logged and skipped (the old weights
 * keep serving); the next version is tried as usual.
 */
#ifndef ARCLIGHT_SERVE_POLICY_H
#define ARCLIGHT_SERVE_POLICY_H

#include "core/cli.h"
#include "engine.h"

#include <stddef.h>
#include <stdint.h>

typedef struct al_serve_policy al_serve_policy;

/* Starts following `topic` for versions of `model` (both copied) with the client settings of
 * `common`. `cfg` is the served shape (copied). NULL with errstr when Kafka cannot be set up. */
al_serve_policy *al_serve_policy_start(const al_cli_common *common, const char *topic,
                                       const char *model, const al_model_config *cfg,
                                       al_serve_engine *eng, char *errstr, size_t errlen);
void al_serve_policy_stop(al_serve_policy *p);
/* 0 while the follower runs; 1 once it has stopped on an error (the reason in reason, for
 * /health: the server keeps serving the weights it has but no longer follows). */
int al_serve_policy_failed(al_serve_policy *p, char *reason, size_t reasonlen);

/* Fetches the safetensors bytes a checkpoint URI points at (see above) into *out (malloc'd,
 * caller frees) and checks them against sha256_hex (64 lowercase hex; NULL or "": no check).
 * 0, or -1 with errstr naming the URI and what failed. */
int al_serve_fetch_weights(const char *uri, const char *sha256_hex, uint8_t **out, size_t *len,
                           char *errstr, size_t errlen);

/* Loads fetched bytes (takes ownership of bytes) into a new model of shape cfg. NULL with
 * errstr. */
al_model *al_serve_model_from_bytes(const al_model_config *cfg, uint8_t *bytes, size_t len,
                                    const char *what, char *errstr, size_t errlen);

#endif
