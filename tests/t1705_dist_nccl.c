/*
 * 1705: data parallelism over NCCL on two GPUs: two processes (ranks 0 and 1, one GPU each,
 * meeting on a free loopback port) train one PPO step of four chunks together; both end with
 * bitwise the same weights, within 1e-2 relative L2 of one GPU training the same step alone
 * (only the order of the gradient sums differs), with the same loss. Skipped (exit 77) with
 * fewer than two CUDA devices.
 */
#include "t1799_gpu_util.h"
#include "t1798_dist_model.h"

#include "model/dist.h"
#include "model/trainer.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

/* One step over four chunks on backend be (with d: this rank's share); params to `out`. */
static int train(al_backend *be, al_dist *d, float *out, double *loss)
{
    char err[512];
    al_model *m = dist_tiny_model();
    if (!m || al_model_set_backend(m, be, err, sizeof err)) return -1;
    static int32_t tok[160], cu[4][2];
    static float mask[160], adv[160];
    al_train_chunk ch[4];
    for (int t = 0; t < 160; t++)
        tok[t] = (t * 37 + 5) % 128, mask[t] = t % 40 > 6, adv[t] = (t / 40) % 2 ? 1.0f : -0.7f;
    for (int i = 0; i < 4; i++) {
        cu[i][0] = 0, cu[i][1] = 40;
        ch[i] = (al_train_chunk){.T = 40, .nseq = 1, .tokens = tok + 40 * i, .cu_seqlens = cu[i],
                                 .mask = mask + 40 * i, .adv = adv + 40 * i};
    }
    al_trainer_config tc;
    al_trainer_config_default(&tc);
    tc.optim.lr = 1e-3f;
    al_trainer *tr = al_trainer_new(m, NULL, &tc, err, sizeof err);
    if (!tr || (d && al_trainer_set_dist(tr, d, err, sizeof err))) return -1;
    al_train_stats st;
    if (al_trainer_step(tr, ch, 4, &st, err, sizeof err)) {
        fprintf(stderr, "step: %s\n", err);
        return -1;
    }
    *loss = st.loss;
    memcpy(out, al_model_params(m), sizeof(float) * al_model_num_params(m));
    al_trainer_free(tr);
    al_model_free(m);
    return 0;
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t l = sizeof a;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) || getsockname(fd, (struct sockaddr *)&a, &l)) return -1;
    close(fd);
    return ntohs(a.sin_port);
}

TEST(two_ranks_match_one_gpu)
{
    al_model *m = dist_tiny_model();
    REQUIRE(m);
    size_t np = al_model_num_params(m);
    al_model_free(m);
    float *one = malloc(sizeof(float) * np), *r[2] = {malloc(sizeof(float) * np), malloc(sizeof(float) * np)};
    double l1 = 0, lr[2] = {0, 0};
    REQUIRE(train(gpu_be, NULL, one, &l1) == 0);
    int port = free_port();
    REQUIRE(port > 0);
    char path[2][64];
    pid_t pid[2];
    for (int rank = 0; rank < 2; rank++) {
        snprintf(path[rank], sizeof path[rank], "/tmp/arclight-t1705-%d-%d", (int)getpid(), rank);
        /* fresh processes (exec): CUDA may not be used in a child forked after the parent
         * initialised it */
        if ((pid[rank] = fork()) == 0) {
            char rs[16], ps[16];
            snprintf(rs, sizeof rs, "%d", rank), snprintf(ps, sizeof ps, "%d", port);
            execl("/proc/self/exe", "t1705_dist_nccl", "--rank", rs, ps, path[rank], (char *)NULL);
            _exit(127);
        }
    }
    for (int rank = 0; rank < 2; rank++) {
        int stv = 0;
        waitpid(pid[rank], &stv, 0);
        CHECKF(WIFEXITED(stv) && WEXITSTATUS(stv) == 0, "rank %d failed", rank);
        FILE *f = fopen(path[rank], "rb");
        REQUIREF(f, "rank %d wrote no result", rank);
        REQUIRE(fread(&lr[rank], sizeof(double), 1, f) == 1 && fread(r[rank], sizeof(float), np, f) == np);
        fclose(f);
        unlink(path[rank]);
    }
    printf("    loss: one GPU %.6f, ranks %.6f / %.6f\n", l1, lr[0], lr[1]);
    CHECK(memcmp(r[0], r[1], sizeof(float) * np) == 0);
    double e = rel_l2(r[0], one, np);
    printf("    weights after the step vs one GPU: rel L2 %.3g\n", e);
    CHECKF(e <= 1e-2, "two ranks differ from one GPU by %.3g", e);
    CHECKF(fabs(lr[0] - l1) <= 1e-2 * fmax(1e-3, fabs(l1)), "loss %.6f vs %.6f", lr[0], l1);
    free(one), free(r[0]), free(r[1]);
}

/* A rank's process: t1705_dist_nccl --rank R PORT OUTFILE. */
static int rank_main(int rank, int port, const char *out)
{
    char dev[8], err[512], addr[32];
    snprintf(dev, sizeof dev, "%d", rank);
    setenv("ARCLIGHT_CUDA_DEVICE", dev, 1);
    snprintf(addr, sizeof addr, "127.0.0.1:%d", port);
    al_backend *be = al_backend_open("cuda", err, sizeof err);
    al_dist_opts o = {.rank = rank, .world = 2, .addr = addr, .timeout_s = 60};
    al_dist *d = be ? al_dist_new(be, &o, err, sizeof err) : NULL;
    al_model *m = dist_tiny_model();
    size_t np = al_model_num_params(m);
    al_model_free(m);
    float *p = malloc(sizeof(float) * np);
    double l = 0;
    if (!d || train(be, d, p, &l)) {
        fprintf(stderr, "rank %d: %s\n", rank, err);
        return 1;
    }
    FILE *f = fopen(out, "wb");
    if (!f) return 1;
    fwrite(&l, sizeof l, 1, f), fwrite(p, sizeof(float), np, f), fclose(f);
    al_dist_free(d);
    free(p);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 5 && !strcmp(argv[1], "--rank")) return rank_main(atoi(argv[2]), atoi(argv[3]), argv[4]);
    if (al_backend_cuda_load_error()) return gpu_test_main(argc, argv); /* reports the failure */
    typedef int (*count_fn)(void);
    count_fn n = (count_fn)al_backend_cuda_symbol("al_backend_cuda_device_count");
    if (!n || n() < 2) {
        printf("skipped: no CUDA device pair (data parallelism needs two GPUs)\n");
        printf("0 passed, 0 failed, 1 skipped\n");
        return GPU_SKIP;
    }
    return gpu_test_main(argc, argv);
}
