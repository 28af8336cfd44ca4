/*
 * dist.c: the rendezvous of data-parallel replicas (dist.h) over TCP, and the calls into
 * the CUDA module's NCCL functions (GPUs) or into gloo (CPUs: gloo/dist_gloo.h, with rank
 * 0's key-value store and membership links from dist_store.h).
 */
#define _GNU_SOURCE
#include "model/dist.h"
#include "model/dist_store.h"
#ifdef ARCLIGHT_HAVE_GLOO
#include "model/gloo/dist_gloo.h"
#endif

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

typedef int (*uid_fn)(uint8_t out[128]);
typedef void *(*init_fn)(al_backend *, const uint8_t[128], int, int);
typedef void (*reduce_fn)(void *, void *, size_t, int, int);
typedef void (*bcast_fn)(void *, void *, size_t, int, int);
typedef void (*free_fn)(void *);

struct al_dist {
    int rank, world;
    al_backend *be;
    void *comm;
    reduce_fn reduce;
    bcast_fn bcast;
    free_fn comm_free;
    double *scratch; /* backend memory for host statistics */
    size_t scratch_n;
    al_dist_store *store; /* CPU: rank 0's store and the membership links */
    void *gloo;           /* CPU: al_gloo */
    al_dist_lost_fn lost;
    void *lost_ud;
    size_t bucket; /* floats per all-reduce; 0: the whole buffer */
};

/* A member gone (dist_store.h), when the caller gave no callback: say so and ask this
 * process to stop (SIGTERM), as a pod's termination would. */
static void dist_lost_default(void *ud, const char *why)
{
    (void)ud;
    fprintf(stderr, "arclight: dist: %s: the group is broken; stopping (start the group again: "
                    "it resumes from rank 0's newest full checkpoint)\n",
            why);
    raise(SIGTERM);
}

/* A collective that failed leaves the replicas in different places mid-step: nothing of this
 * process can be kept, and the group restarts from the newest full checkpoint. */
static void dist_broken(const char *err)
{
    fprintf(stderr, "arclight: dist: %s; the group is broken mid-step: exiting (start the "
                    "group again: it resumes from rank 0's newest full checkpoint)\n",
            err);
    fflush(stderr);
    _exit(1);
}

static void dist_lost(void *ud, const char *why)
{
    al_dist *d = ud;
    (d->lost ? d->lost : dist_lost_default)(d->lost_ud, why);
}

/* The CPU group: rank 0's store, every rank joined, gloo's mesh. 0, or -1 with errstr. */
static int dist_open_cpu(al_dist *d, const al_dist_opts *o, char *errstr, size_t errlen)
{
#ifdef ARCLIGHT_HAVE_GLOO
    d->store = al_dist_store_open(o->addr, o->rank, o->world, o->timeout_s, dist_lost, d, errstr,
                                  errlen);
    if (!d->store) return -1;
    d->gloo = al_gloo_new(d->store, o->rank, o->world, al_dist_store_local_host(d->store),
                          o->timeout_s, errstr, errlen);
    return d->gloo ? 0 : -1;
#else
    (void)d;
    snprintf(errstr, errlen,
             "dist: data parallelism over %d replicas needs --device cuda (NCCL), or a build "
             "with gloo (libgloo-dev) for CPU replicas",
             o->world);
    return -1;
#endif
}

static int env_int(const char *a, const char *b, int *out, char *errstr, size_t errlen)
{
    const char *v = getenv(a), *name = a;
    if (!v || !*v) v = getenv(b), name = b;
    if (!v || !*v) return 1;
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (*end || errno || n < 0 || n > 1 << 20) {
        snprintf(errstr, errlen, "%s='%s' is not a count", name, v);
        return -1;
    }
    *out = (int)n;
    return 0;
}

int al_dist_opts_from_env(al_dist_opts *o, char *errstr, size_t errlen)
{
    memset(o, 0, sizeof *o);
    o->world = 1, o->timeout_s = 600;
    if (env_int("ARCLIGHT_DIST_WORLD", "WORLD_SIZE", &o->world, errstr, errlen) < 0) return -1;
    int bucket_mb = 25;
    if (env_int("ARCLIGHT_DIST_BUCKET_MB", "ARCLIGHT_DIST_BUCKET_MB", &bucket_mb, errstr,
                errlen) < 0)
        return -1;
    o->bucket_bytes = (size_t)bucket_mb << 20;
    int r = env_int("ARCLIGHT_DIST_RANK", "RANK", &o->rank, errstr, errlen);
    if (r < 0) return -1;
    if (r == 1 && o->world > 1) {
        /* a StatefulSet pod is NAME-ORDINAL */
        const char *h = getenv("HOSTNAME");
        const char *d = h ? h + strlen(h) : NULL;
        while (d && d > h && isdigit((unsigned char)d[-1]))
            d--;
        if (!d || !*d || d == h || d[-1] != '-') {
            snprintf(errstr, errlen,
                     "world %d but no rank: set ARCLIGHT_DIST_RANK (or run as a StatefulSet pod "
                     "NAME-ORDINAL)",
                     o->world);
            return -1;
        }
        o->rank = atoi(d);
    }
    static char addr[300];
    addr[0] = 0;
    const char *a = getenv("ARCLIGHT_DIST_ADDR");
    if (a && *a) {
        snprintf(addr, sizeof addr, "%s", a);
    } else {
        const char *h = getenv("MASTER_ADDR"), *p = getenv("MASTER_PORT");
        if (h && *h) snprintf(addr, sizeof addr, "%s:%s", h, p && *p ? p : "29500");
    }
    o->addr = addr[0] ? addr : NULL;
    if (o->world < 1 || o->rank >= o->world) {
        snprintf(errstr, errlen, "rank %d is outside a world of %d", o->rank, o->world);
        return -1;
    }
    if (o->world > 1 && !o->addr) {
        snprintf(errstr, errlen, "world %d needs ARCLIGHT_DIST_ADDR=HOST:PORT (rank 0's address)",
                 o->world);
        return -1;
    }
    return 0;
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static int split_addr(const char *addr, char *host, size_t hl, char *port, size_t pl)
{
    const char *c = strrchr(addr, ':');
    if (!c || c == addr || !c[1]) return -1;
    snprintf(host, hl, "%.*s", (int)(c - addr), addr);
    snprintf(port, pl, "%s", c + 1);
    return 0;
}

static int full_io(int fd, void *buf, size_t n, int send_, double deadline)
{
    char *p = buf;
    while (n > 0) {
        struct pollfd pf = {fd, send_ ? POLLOUT : POLLIN, 0};
        int left = (int)((deadline - now_s()) * 1000);
        if (left <= 0 || poll(&pf, 1, left) <= 0) return -1;
        ssize_t k = send_ ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (k <= 0) {
            if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
            return -1;
        }
        p += k, n -= (size_t)k;
    }
    return 0;
}

/* Rank 0: listens, accepts world-1 ranks (each sends its rank as 4 bytes), sends the id. */
static int serve_id(const al_dist_opts *o, const uint8_t id[128], char *errstr, size_t errlen)
{
    char host[256], port[32];
    if (split_addr(o->addr, host, sizeof host, port, sizeof port))
        return snprintf(errstr, errlen, "dist: address '%s' is not HOST:PORT", o->addr), -1;
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *res = NULL;
    /* listen on every address: HOST is how the others reach rank 0, maybe not a local name */
    if (getaddrinfo(NULL, port, &hints, &res) != 0 || !res)
        return snprintf(errstr, errlen, "dist: bad port '%s'", port), -1;
    int fd = socket(res->ai_family, SOCK_STREAM, 0), one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, 64) != 0) {
        snprintf(errstr, errlen, "dist: rank 0 cannot listen on port %s: %s", port, strerror(errno));
        if (fd >= 0) close(fd);
        freeaddrinfo(res);
        return -1;
    }
    freeaddrinfo(res);
    double deadline = now_s() + o->timeout_s;
    char *seen = calloc((size_t)o->world, 1);
    int got = 0, rc = 0;
    while (got < o->world - 1) {
        struct pollfd pf = {fd, POLLIN, 0};
        int left = (int)((deadline - now_s()) * 1000);
        if (left <= 0 || poll(&pf, 1, left) <= 0) {
            snprintf(errstr, errlen, "dist: only %d of %d ranks reached rank 0 within %.0f s", got + 1,
                     o->world, o->timeout_s);
            rc = -1;
            break;
        }
        int c = accept(fd, NULL, NULL);
        if (c < 0) continue;
        uint32_t r = 0;
        if (full_io(c, &r, 4, 0, deadline) == 0 && r > 0 && (int)r < o->world && !seen[r] &&
            full_io(c, (void *)id, 128, 1, deadline) == 0) {
            seen[r] = 1, got++;
        }
        close(c);
    }
    free(seen);
    close(fd);
    return rc;
}

/* Rank > 0: connects to rank 0 (retrying until the timeout), sends its rank, reads the id. */
static int fetch_id(const al_dist_opts *o, uint8_t id[128], char *errstr, size_t errlen)
{
    char host[256], port[32];
    if (split_addr(o->addr, host, sizeof host, port, sizeof port))
        return snprintf(errstr, errlen, "dist: address '%s' is not HOST:PORT", o->addr), -1;
    double deadline = now_s() + o->timeout_s;
    while (now_s() < deadline) {
        struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
        struct addrinfo *res = NULL;
        if (getaddrinfo(host, port, &hints, &res) == 0 && res) {
            int fd = socket(res->ai_family, SOCK_STREAM, 0);
            if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) == 0) {
                uint32_t r = (uint32_t)o->rank;
                int ok = full_io(fd, &r, 4, 1, deadline) == 0 && full_io(fd, id, 128, 0, deadline) == 0;
                close(fd);
                freeaddrinfo(res);
                if (ok) return 0;
            } else if (fd >= 0) {
                close(fd);
                freeaddrinfo(res);
            } else {
                freeaddrinfo(res);
            }
        }
        usleep(200 * 1000);
    }
    snprintf(errstr, errlen, "dist: rank %d could not get NCCL's id from rank 0 at %s within %.0f s",
             o->rank, o->addr, o->timeout_s);
    return -1;
}

al_dist *al_dist_new(al_backend *be, const al_dist_opts *o, char *errstr, size_t errlen)
{
    if (o->world < 1 || o->rank < 0 || o->rank >= o->world) {
        snprintf(errstr, errlen, "dist: rank %d is outside a world of %d", o->rank, o->world);
        return NULL;
    }
    al_dist *d = calloc(1, sizeof *d);
    if (!d) {
        snprintf(errstr, errlen, "dist: out of memory");
        return NULL;
    }
    d->rank = o->rank, d->world = o->world, d->be = be;
    d->lost = o->lost, d->lost_ud = o->lost_ud;
    d->bucket = o->bucket_bytes / sizeof(float);
    if (o->world == 1) return d;
    if (strcmp(be->ops->name, "cuda") != 0) {
        if (strcmp(be->ops->name, "cpu") != 0 || dist_open_cpu(d, o, errstr, errlen) != 0) {
            if (strcmp(be->ops->name, "cpu") != 0)
                snprintf(errstr, errlen, "dist: no collectives for the %s backend", be->ops->name);
            al_dist_free(d);
            return NULL;
        }
        return d;
    }
    uid_fn uid = (uid_fn)al_backend_cuda_symbol("al_cuda_nccl_unique_id");
    init_fn init = (init_fn)al_backend_cuda_symbol("al_cuda_nccl_init");
    d->reduce = (reduce_fn)al_backend_cuda_symbol("al_cuda_nccl_allreduce");
    d->bcast = (bcast_fn)al_backend_cuda_symbol("al_cuda_nccl_broadcast");
    d->comm_free = (free_fn)al_backend_cuda_symbol("al_cuda_nccl_free");
    if (!uid || !init || !d->reduce || !d->bcast || !d->comm_free) {
        snprintf(errstr, errlen, "dist: the CUDA module has no NCCL functions");
        free(d);
        return NULL;
    }
    uint8_t id[128];
    int rc = o->rank == 0 ? (uid(id), serve_id(o, id, errstr, errlen)) : fetch_id(o, id, errstr, errlen);
    if (rc != 0 || !(d->comm = init(be, id, o->rank, o->world))) {
        if (rc == 0) snprintf(errstr, errlen, "dist: out of memory");
        free(d);
        return NULL;
    }
    return d;
}

void al_dist_free(al_dist *d)
{
    if (!d) return;
#ifdef ARCLIGHT_HAVE_GLOO
    al_gloo_free(d->gloo);
#endif
    al_dist_store_close(d->store); /* the others see this rank leave */
    if (d->comm) d->comm_free(d->comm);
    if (d->scratch) d->be->ops->free(d->be, d->scratch);
    free(d);
}

int al_dist_rank(const al_dist *d)
{
    return d ? d->rank : 0;
}
int al_dist_world(const al_dist *d)
{
    return d ? d->world : 1;
}

void al_dist_allreduce(al_dist *d, float *dev, size_t n)
{
    if (!d || d->world == 1 || !n) return;
    size_t step = d->bucket ? d->bucket : n;
    for (size_t at = 0; at < n; at += step) {
        size_t k = n - at < step ? n - at : step;
#ifdef ARCLIGHT_HAVE_GLOO
        char err[600];
        if (d->gloo) {
            if (al_gloo_allreduce_f32(d->gloo, dev + at, k, err, sizeof err)) dist_broken(err);
            continue;
        }
#endif
        d->reduce(d->comm, dev + at, k, 0, 0);
    }
}

void al_dist_allreduce_host(al_dist *d, double *host, size_t n, int max)
{
    if (!d || d->world == 1 || !n) return;
#ifdef ARCLIGHT_HAVE_GLOO
    char err[600];
    if (d->gloo) {
        if (al_gloo_allreduce_f64(d->gloo, host, n, max, err, sizeof err)) dist_broken(err);
        return;
    }
#endif
    if (n > d->scratch_n) {
        if (d->scratch) d->be->ops->free(d->be, d->scratch);
        d->scratch = d->be->ops->alloc(d->be, sizeof(double) * n);
        if (!d->scratch) abort(); /* a few doubles of device memory */
        d->scratch_n = n;
    }
    d->be->ops->upload(d->be, d->scratch, host, sizeof(double) * n);
    d->reduce(d->comm, d->scratch, n, 1, max);
    d->be->ops->download(d->be, host, d->scratch, sizeof(double) * n);
}

void al_dist_broadcast(al_dist *d, float *dev, size_t n, int root)
{
    if (!d || d->world == 1 || !n) return;
#ifdef ARCLIGHT_HAVE_GLOO
    char err[600];
    if (d->gloo) {
        if (al_gloo_broadcast_f32(d->gloo, dev, n, root, err, sizeof err)) dist_broken(err);
        return;
    }
#endif
    d->bcast(d->comm, dev, n, 0, root);
}
