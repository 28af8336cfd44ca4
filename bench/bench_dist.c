/*
 * bench_dist.c: data parallelism on CPUs over gloo (lib/model/dist.h), the cost of the
 * collective against the step. For world W in 1..MAXW, W processes (ranks on loopback) train
 * STEPS steps of a ~2.6M-parameter Qwen2-style model on the same 12 chunks of 128 tokens
 * (one mini-batch: the gradients are all-reduced once a step), then time all-reduces alone
 * of the gradients' size (whole, then in buckets of 0.25, 1 and 4 MB) and of 1, 4 and
 * 16 MB. Rank 0 prints, per W: seconds per step,
 * steps/s and tokens/s, and the ratio to W = 1 in the same run; the all-reduce's time per
 * call and per MB, and its share of the step.
 *
 *   cmake --build build --target bench_dist && ./build/bench_dist [MAXW] [STEPS]
 *
 * Every process sets OMP/OpenBLAS to one thread, so that W replicas on W cores compare with
 * one replica on one core (a replica per core is how CPU data parallelism is used).
 */
#include "model/dist.h"
#include "model/model.h"
#include "model/trainer.h"

#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define CHUNKS 12
#define CT 128

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static al_model *bench_model(void)
{
    al_model_config c = {0};
    al_model_config_set_arch(&c, AL_MODEL_ARCH_QWEN2);
    c.vocab_size = 4096, c.hidden_size = 256, c.intermediate_size = 768, c.num_layers = 2;
    c.num_heads = 4, c.num_kv_heads = 2, c.head_dim = 64, c.rms_norm_eps = 1e-6;
    c.rope_theta = 1e6, c.tie_word_embeddings = 1, c.max_position_embeddings = 512;
    c.bos_token_id = c.eos_token_id = -1;
    char err[256];
    al_model *m = al_model_new(&c, err, sizeof err);
    if (m) al_model_init_random(m, 7);
    return m;
}

typedef struct bench_out {
    double step_s, reduce_grad_s, reduce_mb_s[3], bucket_s[3];
    size_t nparams;
} bench_out;

/* A rank done before this one leaves the group at its end: nothing is lost. */
static void bench_left(void *ud, const char *why)
{
    (void)ud, (void)why;
}

/* One rank's run; results in *o (rank 0's are printed). 0 or -1. */
static int bench_rank(int rank, int world, int port, int steps, bench_out *o)
{
    char err[512], addr[32];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    al_backend *be = al_backend_open("cpu", err, sizeof err);
    al_dist_opts dopt = {.rank = rank, .world = world, .addr = addr, .timeout_s = 120,
                         .lost = bench_left};
    al_dist *d = be ? al_dist_new(be, &dopt, err, sizeof err) : NULL;
    al_model *m = bench_model();
    if (!d || !m || al_model_set_backend(m, be, err, sizeof err)) {
        fprintf(stderr, "rank %d: %s\n", rank, err);
        return -1;
    }
    static int32_t tok[CHUNKS * CT], cu[CHUNKS][2];
    static float mask[CHUNKS * CT], adv[CHUNKS * CT];
    al_train_chunk ch[CHUNKS];
    for (int t = 0; t < CHUNKS * CT; t++)
        tok[t] = (t * 131 + 17) % 4096, mask[t] = t % CT > 16, adv[t] = (t / CT) % 2 ? 1.f : -1.f;
    for (int i = 0; i < CHUNKS; i++) {
        cu[i][0] = 0, cu[i][1] = CT;
        ch[i] = (al_train_chunk){.T = CT, .nseq = 1, .tokens = tok + CT * i, .cu_seqlens = cu[i],
                                 .mask = mask + CT * i, .adv = adv + CT * i};
    }
    al_trainer_config tc;
    al_trainer_config_default(&tc);
    al_trainer *tr = al_trainer_new(m, NULL, &tc, err, sizeof err);
    if (!tr || al_trainer_set_dist(tr, d, err, sizeof err)) return -1;
    al_train_stats st;
    if (al_trainer_step(tr, ch, CHUNKS, &st, err, sizeof err)) return -1; /* warm-up */
    double t0 = now_s();
    for (int s = 0; s < steps; s++)
        if (al_trainer_step(tr, ch, CHUNKS, &st, err, sizeof err)) return -1;
    o->step_s = (now_s() - t0) / steps;
    o->nparams = al_model_num_params(m);
    float *g = calloc(o->nparams, sizeof *g);
    float *big = calloc(16 * 1024 * 1024 / 4, sizeof *big);
    if (!g || !big) return -1;
    int reps = 10;
    t0 = now_s();
    for (int i = 0; i < reps; i++) al_dist_allreduce(d, g, o->nparams);
    o->reduce_grad_s = (now_s() - t0) / reps;
    const size_t mb[3] = {1, 4, 16};
    for (int k = 0; k < 3; k++) {
        t0 = now_s();
        for (int i = 0; i < reps; i++) al_dist_allreduce(d, big, mb[k] * 1024 * 1024 / 4);
        o->reduce_mb_s[k] = (now_s() - t0) / reps;
    }
    /* the gradient in buckets, one collective each (what ARCLIGHT_DIST_BUCKET_MB does) */
    const size_t bucket_kb[3] = {256, 1024, 4096};
    for (int k = 0; k < 3; k++) {
        size_t b = bucket_kb[k] * 1024 / 4;
        t0 = now_s();
        for (int i = 0; i < reps; i++)
            for (size_t at = 0; at < o->nparams; at += b)
                al_dist_allreduce(d, g + at, o->nparams - at < b ? o->nparams - at : b);
        o->bucket_s[k] = (now_s() - t0) / reps;
    }
    free(g), free(big);
    al_trainer_free(tr);
    al_model_free(m);
    al_dist_free(d);
    return 0;
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof a;
    int p = -1;
    if (fd >= 0 && !bind(fd, (struct sockaddr *)&a, sizeof a) &&
        !getsockname(fd, (struct sockaddr *)&a, &l))
        p = ntohs(a.sin_port);
    if (fd >= 0) close(fd);
    return p;
}

int main(int argc, char **argv)
{
    int maxw = argc > 1 ? atoi(argv[1]) : 3, steps = argc > 2 ? atoi(argv[2]) : 5;
    setenv("OMP_NUM_THREADS", "1", 1);
    setenv("OPENBLAS_NUM_THREADS", "1", 1);
    double base_step = 0;
    printf("bench_dist: %d chunks x %d tokens a step, %d timed steps; one thread per replica\n",
           CHUNKS, CT, steps);
    for (int w = 1; w <= maxw; w++) {
        int port = free_port(), fds[2];
        if (pipe(fds)) return 1;
        pid_t pid[8];
        for (int r = 0; r < w; r++) {
            if ((pid[r] = fork()) == 0) {
                bench_out o = {0};
                int rc = bench_rank(r, w, port, steps, &o);
                if (r == 0 && rc == 0 && write(fds[1], &o, sizeof o) != (ssize_t)sizeof o) rc = -1;
                _exit(rc ? 1 : 0);
            }
        }
        close(fds[1]);
        bench_out o;
        int got = read(fds[0], &o, sizeof o) == (ssize_t)sizeof o;
        close(fds[0]);
        for (int r = 0; r < w; r++) waitpid(pid[r], NULL, 0);
        if (!got) {
            fprintf(stderr, "world %d failed\n", w);
            return 1;
        }
        if (w == 1) base_step = o.step_s;
        double gmb = o.nparams * 4.0 / (1024 * 1024);
        printf("world %d: %.3f s/step, %.2f steps/s, %.0f tokens/s (%.2fx one replica); "
               "gradient all-reduce %.1f MB: %.2f ms (%.1f%% of the step, %.2f ms/MB); "
               "1/4/16 MB: %.2f / %.2f / %.2f ms; the gradient in buckets of 0.25/1/4 MB: "
               "%.2f / %.2f / %.2f ms\n",
               w, o.step_s, 1 / o.step_s, CHUNKS * CT / o.step_s, base_step / o.step_s, gmb,
               o.reduce_grad_s * 1e3, 100 * o.reduce_grad_s / o.step_s,
               w > 1 ? o.reduce_grad_s * 1e3 / gmb : 0, o.reduce_mb_s[0] * 1e3,
               o.reduce_mb_s[1] * 1e3, o.reduce_mb_s[2] * 1e3, o.bucket_s[0] * 1e3,
               o.bucket_s[1] * 1e3, o.bucket_s[2] * 1e3);
    }
    return 0;
}
