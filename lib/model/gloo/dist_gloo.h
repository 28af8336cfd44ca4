/*
 * dist_gloo.h: the CPU collectives of a data-parallel group (dist.h), through gloo's TCP
 * transport: a C face over the C++ library (dist_gloo.cc), so that lib/model stays C.
 * Built when CMake finds gloo (Debian's libgloo-dev); ARCLIGHT_HAVE_GLOO says so.
 *
 * Every call is a collective: all ranks make the same calls in the same order. A call that
 * fails (a peer gone: its connection reset; or nothing within the timeout) returns -1 with
 * gloo's reason, and the group is unusable after it.
 */
#ifndef ARCLIGHT_MODEL_DIST_GLOO_H
#define ARCLIGHT_MODEL_DIST_GLOO_H

#include "model/dist_store.h"

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct al_gloo al_gloo;

/* Connects the full mesh of `world` ranks over TCP, trading addresses through the store
 * (borrowed; it must outlive the call only). Pairs listen on `local_host`. timeout_s bounds
 * the mesh and, later, each collective. NULL with errstr. */
al_gloo *al_gloo_new(al_dist_store *store, int rank, int world, const char *local_host,
                     double timeout_s, char *errstr, size_t errlen);
void al_gloo_free(al_gloo *g);

/* In place over the ranks: the sum of n floats; the sum (or with max, the maximum) of n
 * doubles; root's n floats into everyone's. 0, or -1 with errstr. */
int al_gloo_allreduce_f32(al_gloo *g, float *x, size_t n, char *errstr, size_t errlen);
int al_gloo_allreduce_f64(al_gloo *g, double *x, size_t n, int max, char *errstr, size_t errlen);
int al_gloo_broadcast_f32(al_gloo *g, float *x, size_t n, int root, char *errstr, size_t errlen);

#ifdef __cplusplus
}
#endif

#endif
