/*
 * ckpt_http.h: the trainer's checkpoint server. Serves the files of ROOT/step-N/ (what
 * lib/model/checkpoint.h writes, or a weights-only snapshot) read-only over HTTP on a thread
 * of its own (lib/http/httpd.h), so that policy servers on other hosts can fetch a version:
 *
 *   GET /checkpoints/                    200 {"checkpoints": ["step-3", "step-4"]} (sorted)
 *   GET /checkpoints/step-N/FILE         200 the file (model.safetensors, config.json, ...)
 *   GET /checkpoints/step-N/             200 {"files": [...]} of that directory
 *   other paths, "..", hidden names      404 {"error": ...}; methods other than GET/HEAD 405
 */
#ifndef ARCLIGHT_TRAIN_CKPT_HTTP_H
#define ARCLIGHT_TRAIN_CKPT_HTTP_H

#include <stddef.h>

typedef struct al_ckpt_http al_ckpt_http;

/* Binds hostport ("127.0.0.1:8500"; port 0 picks a free one) and serves ROOT (copied).
 * NULL with errstr naming the address when it cannot be bound. */
al_ckpt_http *al_ckpt_http_start(const char *hostport, const char *root, char *errstr,
                                 size_t errlen);
/* The port bound. */
int al_ckpt_http_port(const al_ckpt_http *s);
/* Stops serving (requests in flight are cut off), joins the thread, frees. NULL-safe. */
void al_ckpt_http_stop(al_ckpt_http *s);

#endif
