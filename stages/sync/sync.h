/*
 * sync.h: what the files of `arclight sync` share (main.c: the follower loop and the record;
 * replica.c: one serving replica and the routes its back end has for new weights).
 */
#ifndef ARCLIGHT_SYNC_SYNC_H
#define ARCLIGHT_SYNC_SYNC_H

#include <stddef.h>
#include <stdint.h>

#define COMP "sync"

typedef enum sync_kind {
    SYNC_KIND_SGLANG,   /* /pause_generation, /update_weights_from_disk, /continue_generation */
    SYNC_KIND_VLLM,     /* /pause, /start_weight_update, /update_weights, /finish_weight_update,
                           /resume (VLLM_SERVER_DEV_MODE=1, the disk weight-transfer backend) */
    SYNC_KIND_ARCLIGHT, /* arclight serve --weight-routes: SGLang's routes */
} sync_kind;

/* One replica and where sync stands with it. */
typedef struct sync_replica {
    sync_kind kind;
    char url[512];       /* http://host:port, no trailing '/' */
    int64_t version;     /* the policy version it serves as far as sync knows; -1: unknown */
    int64_t failed_for;  /* the version the failures below are about; -1: none */
    int attempts;        /* failed attempts at failed_for */
    int64_t next_try_us; /* al_mono_us() before which it is not tried again */
    /* metrics (main.c; NULL without a registry) */
    struct al_gauge *g_version;
    struct al_counter *c_ok, *c_failed;
} sync_replica;

/* Parses "KIND=URL" (kinds sglang, vllm, arclight; URL http://host:port). 0, or -1 with what
 * it wants in err (worded for the flag parser: "wants ..."). */
int sync_replica_parse(sync_replica *r, const char *spec, char *err, size_t errlen);

/* The name of a kind ("sglang", ...). */
const char *sync_kind_name(sync_kind k);

/* Asks the replica which weight version it serves (/get_weight_version or /weight_info): 0 and
 * the number in *version when the label is a decimal integer (else -1 there), or -1 with err
 * when the replica does not answer. timeout_s bounds each request. */
int sync_replica_probe(const sync_replica *r, double timeout_s, int64_t *version, char *err,
                       size_t errlen);

/* Brings the replica to `version`, whose Hugging Face directory is `dir` (the replica's view of
 * the path), with its back end's routes in the order that back end wants (generation paused
 * around the load and resumed whatever happened). 0 once the replica says it serves it, or -1
 * with the step that failed and its answer in err (the replica keeps its old weights: every
 * back end loads all-or-nothing). */
int sync_replica_apply(const sync_replica *r, const char *dir, int64_t version, double timeout_s,
                       char *err, size_t errlen);

/* ---- fetch.c: --stage-dir ---- */

/* Copies the version directory at http(s) uri (ending in '/': the trainer's checkpoint server)
 * into root/step-N (N = version) whole or not at all, model.safetensors checked against sha256,
 * and removes staged versions older than the newest keep. A directory staged before with the
 * same sha256 is kept as it is. At most max_bytes are fetched (0: the bound its config.json
 * gives, fetch.c); a larger version is refused. Fills dir (root/step-N). 0, or -1 with err. */
int sync_stage_fetch(const char *uri, const char *sha256, const char *root, int64_t version,
                     int keep, uint64_t max_bytes, double timeout_s, char *dir, size_t dirlen,
                     char *err, size_t errlen);

#endif
