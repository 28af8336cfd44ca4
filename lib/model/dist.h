/*
 * dist.h: data-parallel training, one process per GPU. Every replica reads the whole step
 * (the same chunks in the same order); the chunks of each mini-batch are divided among the
 * replicas deterministically (chunk i of a mini-batch goes to replica i mod world), each
 * replica runs forward and backward on its share with the loss normalised over the whole
 * mini-batch, and the gradients are summed over NCCL before clipping and AdamW. Replicas
 * start from the same weights (rank 0's, broadcast) and apply the same update, so they stay
 * identical; rank 0 alone publishes versions and writes checkpoints (stages/train).
 *
 * The NCCL communicator lives in the CUDA module; dist.c does the rendezvous: rank 0 listens
 * on ADDR (HOST:PORT), makes NCCL's unique id and hands it to every other rank, which
 * connects (retrying until the timeout: pods start in any order).
 *
 * On CPUs (--device cpu) the collectives are gloo's over TCP (gloo/dist_gloo.h): rank 0
 * serves a key-value store on ADDR for the mesh's rendezvous and keeps a membership link to
 * every rank (dist_store.h). Failure: a rank gone closes its link (the kernel closes a dead
 * process's sockets; a vanished host fails the link's keepalive within ~4 s), and every
 * other rank hears of it within a second (opts.lost; by default SIGTERM, so that a trainer
 * stops after its last complete step); a collective that fails mid-step (a peer reset, or
 * nothing within timeout_s) exits the process at once, since no replica's state mid-step
 * can be kept. Either way the group is started again and resumes from rank 0's newest full
 * checkpoint (stages/train).
 */
#ifndef ARCLIGHT_MODEL_DIST_H
#define ARCLIGHT_MODEL_DIST_H

#include "model/ops.h"

#include <stddef.h>

typedef struct al_dist_opts {
    int rank, world;   /* 0 <= rank < world */
    const char *addr;  /* HOST:PORT where rank 0 listens for the others */
    double timeout_s;  /* how long ranks wait for each other (default 600) */
    /* al_dist_allreduce sums a buffer in buckets of this many bytes, one collective each
     * (0: the whole buffer in one; ARCLIGHT_DIST_BUCKET_MB, default 25 as PyTorch's DDP).
     * Buckets do not overlap the backward: on CPUs the whole all-reduce is under 1% of a
     * step (docs/BENCHMARKS.md, bench_dist), so there is nothing for an overlap to hide. */
    size_t bucket_bytes;
    /* CPU groups: called once, from another thread, when a member is gone (why: which);
     * NULL: a line on stderr and SIGTERM to this process */
    void (*lost)(void *ud, const char *why);
    void *lost_ud;
} al_dist_opts;

/* Fills o from the environment: ARCLIGHT_DIST_WORLD (or WORLD_SIZE), ARCLIGHT_DIST_RANK (or
 * RANK; else the trailing number of $HOSTNAME, a StatefulSet pod's ordinal),
 * ARCLIGHT_DIST_ADDR (or MASTER_ADDR:MASTER_PORT) and ARCLIGHT_DIST_BUCKET_MB. world 1 when none is set. 0, or -1 with
 * errstr naming the variable that is wrong. */
int al_dist_opts_from_env(al_dist_opts *o, char *errstr, size_t errlen);

typedef struct al_dist al_dist;

/* Joins the group on backend be (CUDA: NCCL; CPU: gloo, when built with it). world 1
 * needs no rendezvous. NULL with errstr (bad options, no collectives for the backend, a
 * rank that never came; NCCL's own errors abort with their file and line). */
al_dist *al_dist_new(al_backend *be, const al_dist_opts *o, char *errstr, size_t errlen);
void al_dist_free(al_dist *d);
int al_dist_rank(const al_dist *d);
int al_dist_world(const al_dist *d);

/* Sum (or max) over the replicas, in place. dev: backend memory of n floats; host: n host
 * doubles (small statistics). No-ops when world is 1. */
void al_dist_allreduce(al_dist *d, float *dev, size_t n);
void al_dist_allreduce_host(al_dist *d, double *host, size_t n, int max);
/* Rank root's n floats (backend memory) into everyone's. */
void al_dist_broadcast(al_dist *d, float *dev, size_t n, int root);

#endif
