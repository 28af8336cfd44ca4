/*
 * dist_store.c: rank 0's key-value store and the membership links of a CPU data-parallel
 * group (dist_store.h has the protocol).
 */
#define _GNU_SOURCE
#include "model/dist_store.h"

#include "core/buf.h"
#include "core/map.h"
#include "core/util.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define STORE_MAX_KEY 1024
#define STORE_MAX_VALUE (64 * 1024)
#define STORE_REQUEST_S 2.0 /* a request's bytes must all come within this */

typedef struct store_value {
    size_t n;
    char data[];
} store_value;

struct al_dist_store {
    int rank, world;
    char host[256], port[32];
    char local[INET6_ADDRSTRLEN];
    int listen_fd;        /* rank 0 */
    int *member_fd;       /* rank 0: the link of rank r at [r]; others: [0], rank 0's */
    int joined;           /* rank 0: links up */
    al_map kv;            /* rank 0: key -> store_value */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    pthread_t thread;
    int thread_up, stop, wake[2];
    al_dist_lost_fn lost;
    void *ud;
    int lost_told;
};

static double store_now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

/* All n bytes to or from fd before the deadline. 0, or -1 (timeout, EOF, error). */
static int store_io(int fd, void *buf, size_t n, int out, double deadline)
{
    char *p = buf;
    while (n > 0) {
        struct pollfd pf = {fd, out ? POLLOUT : POLLIN, 0};
        int left = (int)((deadline - store_now()) * 1000);
        if (left <= 0 || poll(&pf, 1, left) <= 0) return -1;
        ssize_t k = out ? send(fd, p, n, MSG_NOSIGNAL) : recv(fd, p, n, 0);
        if (k <= 0) {
            if (k < 0 && (errno == EINTR || errno == EAGAIN)) continue;
            return -1;
        }
        p += k, n -= (size_t)k;
    }
    return 0;
}

static int store_u32_out(int fd, uint32_t v, double deadline)
{
    uint8_t b[4] = {(uint8_t)v, (uint8_t)(v >> 8), (uint8_t)(v >> 16), (uint8_t)(v >> 24)};
    return store_io(fd, b, 4, 1, deadline);
}

static int store_u32_in(int fd, uint32_t *v, double deadline)
{
    uint8_t b[4];
    if (store_io(fd, b, 4, 0, deadline)) return -1;
    *v = (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
    return 0;
}

/* A link that should notice a vanished peer within seconds, not TCP's two hours. */
static void store_keepalive(int fd)
{
    int one = 1, idle = 1, intvl = 1, cnt = 3;
    setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
    setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* A connection to rank 0 (one try). fd, or -1. */
static int store_connect(const al_dist_store *s)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    if (getaddrinfo(s->host, s->port, &hints, &res) != 0 || !res) return -1;
    int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) != 0) {
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    return fd;
}

static void store_tell_lost(al_dist_store *s, const char *why)
{
    if (s->lost_told || s->stop) return;
    s->lost_told = 1;
    if (s->lost) s->lost(s->ud, why);
}

/* ---- rank 0 -------------------------------------------------------------------------------- */

/* One request on a fresh connection c (rank 0's thread). A join keeps c as a link. */
static void store_serve_one(al_dist_store *s, int c)
{
    double deadline = store_now() + STORE_REQUEST_S;
    char op;
    uint32_t kl = 0, vl = 0;
    if (store_io(c, &op, 1, 0, deadline)) goto done;
    if (op == 'J') {
        uint32_t r;
        if (store_u32_in(c, &r, deadline) || r == 0 || r >= (uint32_t)s->world) goto done;
        pthread_mutex_lock(&s->mu);
        if (s->member_fd[r] >= 0) {
            /* a rank joining again: its old process is gone, and so is this group */
            pthread_mutex_unlock(&s->mu);
            char why[128];
            snprintf(why, sizeof why, "rank %u joined again (it was restarted)", r);
            store_tell_lost(s, why);
            goto done;
        }
        store_keepalive(c);
        s->member_fd[r] = c;
        s->joined++;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        return;
    }
    if ((op != 'S' && op != 'G') || store_u32_in(c, &kl, deadline) || kl == 0 ||
        kl > STORE_MAX_KEY)
        goto done;
    char key[STORE_MAX_KEY + 1];
    if (store_io(c, key, kl, 0, deadline)) goto done;
    key[kl] = 0;
    if (op == 'S') {
        if (store_u32_in(c, &vl, deadline) || vl > STORE_MAX_VALUE) goto done;
        store_value *v = malloc(sizeof *v + vl);
        if (!v) goto done;
        v->n = vl;
        if (store_io(c, v->data, vl, 0, deadline)) {
            free(v);
            goto done;
        }
        pthread_mutex_lock(&s->mu);
        int created;
        al_map_entry *e = al_map_upsertn(&s->kv, key, kl, &created);
        if (e) {
            if (!created) free(e->value);
            e->value = v;
        } else {
            free(v);
        }
        pthread_mutex_unlock(&s->mu);
        char ok = e ? 0 : 1;
        store_io(c, &ok, 1, 1, deadline);
    } else {
        pthread_mutex_lock(&s->mu);
        store_value *v = al_map_get(&s->kv, key);
        char st = v ? 0 : 1;
        int bad = store_io(c, &st, 1, 1, deadline);
        if (v && !bad && !store_u32_out(c, (uint32_t)v->n, deadline))
            store_io(c, v->data, v->n, 1, deadline);
        pthread_mutex_unlock(&s->mu);
    }
done:
    close(c);
}

/* Rank 0's thread: requests, joins, and the links of the joined ranks. */
static void *store_server_main(void *arg)
{
    al_dist_store *s = arg;
    int n = s->world + 1;
    struct pollfd *pf = calloc((size_t)n, sizeof *pf);
    if (!pf) return NULL;
    while (!s->stop) {
        pf[0] = (struct pollfd){s->listen_fd, POLLIN, 0};
        pf[1] = (struct pollfd){s->wake[0], POLLIN, 0};
        pthread_mutex_lock(&s->mu);
        for (int r = 1; r < s->world; r++)
            pf[r + 1] = (struct pollfd){s->member_fd[r], POLLIN | POLLRDHUP, 0};
        pthread_mutex_unlock(&s->mu);
        if (poll(pf, (nfds_t)n, 1000) < 0 && errno != EINTR) break;
        if (s->stop) break;
        for (int r = 1; r < s->world; r++) {
            if (pf[r + 1].fd < 0 || !pf[r + 1].revents) continue;
            char b;
            if (recv(pf[r + 1].fd, &b, 1, MSG_DONTWAIT) > 0) continue; /* nothing is sent */
            char why[128];
            snprintf(why, sizeof why, "rank %d left the group (its link to rank 0 closed)", r);
            pthread_mutex_lock(&s->mu);
            close(s->member_fd[r]);
            s->member_fd[r] = -1;
            pthread_mutex_unlock(&s->mu);
            store_tell_lost(s, why);
        }
        if (pf[0].revents & POLLIN) {
            int c = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC);
            if (c >= 0) store_serve_one(s, c);
        }
    }
    free(pf);
    return NULL;
}

/* Rank 0: binds, starts the thread, waits for every rank's join and answers each. */
static int store_open_root(al_dist_store *s, double timeout_s, char *errstr, size_t errlen)
{
    struct addrinfo hints = {.ai_family = AF_INET6, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE};
    struct addrinfo *res = NULL;
    int fd = -1, one = 1, zero = 0;
    /* every address, v4 and v6: HOST is how the others reach rank 0, maybe a Service name */
    if (getaddrinfo(NULL, s->port, &hints, &res) == 0 && res) {
        fd = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd >= 0) setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
    }
    if (fd >= 0) setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (fd < 0 || bind(fd, res->ai_addr, res->ai_addrlen) != 0 || listen(fd, 64) != 0) {
        al_err(errstr, errlen, "dist: rank 0 cannot listen on port %s: %s", s->port,
               strerror(errno));
        if (fd >= 0) close(fd);
        if (res) freeaddrinfo(res);
        return -1;
    }
    freeaddrinfo(res);
    s->listen_fd = fd;
    if (pthread_create(&s->thread, NULL, store_server_main, s) != 0)
        return al_err(errstr, errlen, "dist: cannot start the store's thread");
    s->thread_up = 1;
    double deadline = store_now() + timeout_s;
    pthread_mutex_lock(&s->mu);
    while (s->joined < s->world - 1 && !s->lost_told && store_now() < deadline) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += 1;
        pthread_cond_timedwait(&s->cv, &s->mu, &ts);
    }
    int joined = s->joined;
    pthread_mutex_unlock(&s->mu);
    if (joined < s->world - 1)
        return al_err(errstr, errlen, "dist: only %d of %d ranks reached rank 0 within %.0f s",
                      joined + 1, s->world, timeout_s);
    char go = 0;
    for (int r = 1; r < s->world; r++)
        if (store_io(s->member_fd[r], &go, 1, 1, store_now() + STORE_REQUEST_S))
            return al_err(errstr, errlen, "dist: rank %d left while the group formed", r);
    return 0;
}

/* ---- the other ranks ------------------------------------------------------------------------ */

/* A rank's thread: watches its link to rank 0. */
static void *store_link_main(void *arg)
{
    al_dist_store *s = arg;
    while (!s->stop) {
        struct pollfd pf[2] = {{s->member_fd[0], POLLIN | POLLRDHUP, 0}, {s->wake[0], POLLIN, 0}};
        if (poll(pf, 2, 1000) < 0 && errno != EINTR) break;
        if (s->stop) break;
        char b;
        if (pf[0].revents && recv(s->member_fd[0], &b, 1, MSG_DONTWAIT) <= 0) {
            store_tell_lost(s, "rank 0 left the group (its link closed)");
            break;
        }
    }
    return NULL;
}

/* Joins rank 0 (retrying until the deadline), waits for the group, starts the watcher. */
static int store_open_rank(al_dist_store *s, double timeout_s, char *errstr, size_t errlen)
{
    double deadline = store_now() + timeout_s;
    int fd = -1;
    while (store_now() < deadline) {
        if ((fd = store_connect(s)) >= 0) {
            char op = 'J', go;
            if (!store_io(fd, &op, 1, 1, deadline) &&
                !store_u32_out(fd, (uint32_t)s->rank, deadline) &&
                !store_io(fd, &go, 1, 0, deadline))
                break;
            close(fd);
            fd = -1;
        }
        usleep(200 * 1000);
    }
    if (fd < 0)
        return al_err(errstr, errlen, "dist: rank %d could not join rank 0 at %s:%s within %.0f s",
                      s->rank, s->host, s->port, timeout_s);
    store_keepalive(fd);
    s->member_fd[0] = fd;
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
        getnameinfo((struct sockaddr *)&ss, sl, s->local, sizeof s->local, NULL, 0, NI_NUMERICHOST);
    if (pthread_create(&s->thread, NULL, store_link_main, s) != 0)
        return al_err(errstr, errlen, "dist: cannot start the link's thread");
    s->thread_up = 1;
    return 0;
}

/* Rank 0's own address as the others see it: HOST resolved (its first address). */
static void store_root_local(al_dist_store *s)
{
    struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
    struct addrinfo *res = NULL;
    if (getaddrinfo(s->host, NULL, &hints, &res) == 0 && res)
        getnameinfo(res->ai_addr, res->ai_addrlen, s->local, sizeof s->local, NULL, 0,
                    NI_NUMERICHOST);
    if (res) freeaddrinfo(res);
    if (!s->local[0]) snprintf(s->local, sizeof s->local, "127.0.0.1");
}

al_dist_store *al_dist_store_open(const char *addr, int rank, int world, double timeout_s,
                                  al_dist_lost_fn lost, void *ud, char *errstr, size_t errlen)
{
    const char *c = addr ? strrchr(addr, ':') : NULL;
    if (!c || c == addr || !c[1] || (size_t)(c - addr) >= 256 || strlen(c + 1) >= 32) {
        al_err(errstr, errlen, "dist: address '%s' is not HOST:PORT", addr ? addr : "");
        return NULL;
    }
    al_dist_store *s = calloc(1, sizeof *s);
    int *fds = calloc((size_t)world, sizeof *fds);
    if (!s || !fds || pipe2(s->wake, O_CLOEXEC) != 0) {
        free(s);
        free(fds);
        al_err(errstr, errlen, "dist: out of memory");
        return NULL;
    }
    for (int r = 0; r < world; r++) fds[r] = -1;
    s->member_fd = fds;
    s->rank = rank, s->world = world, s->listen_fd = -1, s->lost = lost, s->ud = ud;
    snprintf(s->host, sizeof s->host, "%.*s", (int)(c - addr), addr);
    if (s->host[0] == '[') { /* [v6]:port */
        memmove(s->host, s->host + 1, strlen(s->host));
        char *e = strchr(s->host, ']');
        if (e) *e = 0;
    }
    snprintf(s->port, sizeof s->port, "%s", c + 1);
    al_map_init(&s->kv);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    const char *over = getenv("ARCLIGHT_DIST_LOCAL_ADDR");
    int rc = rank == 0 ? store_open_root(s, timeout_s, errstr, errlen)
                       : store_open_rank(s, timeout_s, errstr, errlen);
    if (rank == 0) store_root_local(s);
    if (over && *over) snprintf(s->local, sizeof s->local, "%s", over);
    if (rc != 0) {
        al_dist_store_close(s);
        return NULL;
    }
    return s;
}

/* One request to rank 0 on a fresh connection: op, key, [value]; for a get the reply. */
static int store_request(al_dist_store *s, char op, const char *key, const void *value, size_t n,
                         al_buf *out, int *absent)
{
    size_t kl = strlen(key);
    if (kl == 0 || kl > STORE_MAX_KEY || n > STORE_MAX_VALUE) return -1;
    int fd = store_connect(s);
    if (fd < 0) return -1;
    double deadline = store_now() + STORE_REQUEST_S;
    char st = 1;
    int rc = store_io(fd, &op, 1, 1, deadline) || store_u32_out(fd, (uint32_t)kl, deadline) ||
             store_io(fd, (void *)key, kl, 1, deadline);
    if (!rc && op == 'S')
        rc = store_u32_out(fd, (uint32_t)n, deadline) || store_io(fd, (void *)value, n, 1, deadline);
    if (!rc) rc = store_io(fd, &st, 1, 0, deadline);
    if (!rc && op == 'G') {
        *absent = st != 0;
        uint32_t vl;
        if (!*absent) {
            rc = store_u32_in(fd, &vl, deadline) || vl > STORE_MAX_VALUE || al_buf_reserve(out, vl);
            if (!rc) rc = store_io(fd, out->data, vl, 0, deadline);
            if (!rc) out->len = vl;
        }
    } else if (!rc && st != 0) {
        rc = -1;
    }
    close(fd);
    return rc ? -1 : 0;
}

int al_dist_store_set(al_dist_store *s, const char *key, const void *value, size_t n,
                      char *errstr, size_t errlen)
{
    for (int attempt = 0; attempt < 5; attempt++) {
        if (store_request(s, 'S', key, value, n, NULL, NULL) == 0) return 0;
        usleep(100 * 1000);
    }
    return al_err(errstr, errlen, "dist: rank %d cannot set '%s' on rank 0's store at %s:%s",
                  s->rank, key, s->host, s->port);
}

void *al_dist_store_get(al_dist_store *s, const char *key, double timeout_s, size_t *n,
                        char *errstr, size_t errlen)
{
    double deadline = store_now() + timeout_s;
    al_buf b = {0};
    while (store_now() < deadline && !s->lost_told) {
        int absent = 1;
        b.len = 0;
        if (store_request(s, 'G', key, NULL, 0, &b, &absent) == 0 && !absent) {
            return al_buf_detach(&b, n);
        }
        usleep(20 * 1000);
    }
    al_buf_free(&b);
    al_err(errstr, errlen, "dist: rank %d: '%s' never came to rank 0's store within %.0f s",
           s->rank, key, timeout_s);
    return NULL;
}

const char *al_dist_store_local_host(const al_dist_store *s)
{
    return s->local;
}

void al_dist_store_close(al_dist_store *s)
{
    if (!s) return;
    s->stop = 1;
    if (write(s->wake[1], "x", 1) < 0) {
    }
    if (s->thread_up) pthread_join(s->thread, NULL);
    for (int r = 0; r < s->world; r++)
        if (s->member_fd[r] >= 0) close(s->member_fd[r]);
    if (s->listen_fd >= 0) close(s->listen_fd);
    close(s->wake[0]);
    close(s->wake[1]);
    al_map_free(&s->kv, free);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    free(s->member_fd);
    free(s);
}
