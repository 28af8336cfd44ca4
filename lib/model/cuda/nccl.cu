/*
 * nccl.cu: the CUDA module's side of data parallelism (lib/model/dist.h): a NCCL
 * communicator per process (one process per GPU), sum all-reduce and broadcast on the
 * backend's stream. The rendezvous (who learns the unique id from whom) is dist.c's.
 */
#include "model/cuda/internal.h"

#include <string.h>

typedef struct cuda_comm {
    ncclComm_t comm;
    cuda_ctx *c;
} cuda_comm;

extern "C" int al_cuda_nccl_unique_id(uint8_t out[128])
{
    ncclUniqueId id;
    NCCL_CHECK(ncclGetUniqueId(&id));
    static_assert(sizeof id.internal == 128, "NCCL's unique id is 128 bytes");
    memcpy(out, id.internal, 128);
    return 0;
}

extern "C" void *al_cuda_nccl_init(al_backend *b, const uint8_t id_bytes[128], int rank, int world)
{
    cuda_ctx *c = (cuda_ctx *)b->ctx;
    CUDA_CHECK(cudaSetDevice(c->device));
    ncclUniqueId id;
    memcpy(id.internal, id_bytes, 128);
    cuda_comm *cm = (cuda_comm *)calloc(1, sizeof *cm);
    if (!cm) return NULL;
    cm->c = c;
    NCCL_CHECK(ncclCommInitRank(&cm->comm, world, id, rank));
    return cm;
}

static ncclDataType_t nccl_type(int f64)
{
    return f64 ? ncclFloat64 : ncclFloat32;
}

/* In place on the backend's stream; returns once the result is there (the next op reads it
 * on the same stream anyway; the wait keeps host-side timing honest). */
extern "C" void al_cuda_nccl_allreduce(void *comm, void *buf, size_t n, int f64, int max)
{
    cuda_comm *cm = (cuda_comm *)comm;
    CUDA_CHECK(cudaSetDevice(cm->c->device));
    NCCL_CHECK(ncclAllReduce(buf, buf, n, nccl_type(f64), max ? ncclMax : ncclSum, cm->comm,
                             cm->c->stream));
    CUDA_CHECK(cudaStreamSynchronize(cm->c->stream));
}

extern "C" void al_cuda_nccl_broadcast(void *comm, void *buf, size_t n, int f64, int root)
{
    cuda_comm *cm = (cuda_comm *)comm;
    CUDA_CHECK(cudaSetDevice(cm->c->device));
    NCCL_CHECK(ncclBroadcast(buf, buf, n, nccl_type(f64), root, cm->comm, cm->c->stream));
    CUDA_CHECK(cudaStreamSynchronize(cm->c->stream));
}

extern "C" void al_cuda_nccl_free(void *comm)
{
    cuda_comm *cm = (cuda_comm *)comm;
    if (!cm) return;
    NCCL_CHECK(ncclCommDestroy(cm->comm));
    free(cm);
}
