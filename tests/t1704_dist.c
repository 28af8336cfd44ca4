/*
 * 1704: data parallelism's host side (lib/model/dist.h) without GPUs: where a process finds
 * its rank, world and rendezvous address (variables, a StatefulSet pod's ordinal), the
 * errors for wrong ones, that a group of more than one replica needs the CUDA backend, and
 * that a trainer in a world of one computes exactly what it computes alone.
 */
#include "testlib.h"
#include "support.h"

#include "model/dist.h"
#include "model/trainer.h"

static void clear_env(void)
{
    const char *v[] = {"ARCLIGHT_DIST_WORLD", "WORLD_SIZE", "ARCLIGHT_DIST_RANK", "RANK",
                       "ARCLIGHT_DIST_ADDR", "MASTER_ADDR", "MASTER_PORT", "HOSTNAME"};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
        unsetenv(v[i]);
}

TEST(options_from_the_environment)
{
    char err[256];
    al_dist_opts o;
    clear_env();
    REQUIRE(al_dist_opts_from_env(&o, err, sizeof err) == 0);
    CHECK_EQ_INT(o.world, 1);
    CHECK_EQ_INT(o.rank, 0);
    CHECK(o.addr == NULL);

    setenv("ARCLIGHT_DIST_WORLD", "4", 1);
    setenv("HOSTNAME", "arclight-train-3", 1);
    setenv("ARCLIGHT_DIST_ADDR", "arclight-train-0.arclight-train:29500", 1);
    REQUIRE(al_dist_opts_from_env(&o, err, sizeof err) == 0);
    CHECK_EQ_INT(o.world, 4);
    CHECK_EQ_INT(o.rank, 3);
    CHECK_EQ_STR(o.addr, "arclight-train-0.arclight-train:29500");

    clear_env();
    setenv("WORLD_SIZE", "2", 1);
    setenv("RANK", "1", 1);
    setenv("MASTER_ADDR", "10.0.0.7", 1);
    REQUIRE(al_dist_opts_from_env(&o, err, sizeof err) == 0);
    CHECK_EQ_INT(o.rank, 1);
    CHECK_EQ_STR(o.addr, "10.0.0.7:29500");

    clear_env();
    setenv("ARCLIGHT_DIST_WORLD", "2", 1);
    setenv("HOSTNAME", "trainer", 1);
    setenv("ARCLIGHT_DIST_ADDR", "h:1", 1);
    CHECK(al_dist_opts_from_env(&o, err, sizeof err) == -1 && strstr(err, "ARCLIGHT_DIST_RANK"));
    setenv("ARCLIGHT_DIST_RANK", "2", 1);
    CHECK(al_dist_opts_from_env(&o, err, sizeof err) == -1 && strstr(err, "outside a world of 2"));
    setenv("ARCLIGHT_DIST_RANK", "x1", 1);
    CHECK(al_dist_opts_from_env(&o, err, sizeof err) == -1 && strstr(err, "not a count"));
    setenv("ARCLIGHT_DIST_RANK", "1", 1);
    unsetenv("ARCLIGHT_DIST_ADDR");
    CHECK(al_dist_opts_from_env(&o, err, sizeof err) == -1 && strstr(err, "ARCLIGHT_DIST_ADDR"));
    clear_env();
}

/* A CPU group needs gloo (t1707 runs one); whose other ranks never come, it says so. */
TEST(a_group_that_cannot_form_says_why)
{
    char err[256];
    al_dist_opts o = {.rank = 0, .world = 2, .addr = "127.0.0.1:1", .timeout_s = 1};
#ifdef ARCLIGHT_HAVE_GLOO
    char addr[32];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", al_test_free_port());
    o.addr = addr;
    al_dist *d = al_dist_new(al_backend_cpu(), &o, err, sizeof err);
    CHECKF(d == NULL && strstr(err, "only 1 of 2 ranks reached rank 0 within 1 s"), "%s", err);
#else
    al_dist *d = al_dist_new(al_backend_cpu(), &o, err, sizeof err);
    CHECK(d == NULL && strstr(err, "--device cuda"));
#endif
    o.rank = 5;
    CHECK(al_dist_new(al_backend_cpu(), &o, err, sizeof err) == NULL && strstr(err, "outside"));
}

static al_model *tiny(void)
{
    al_model_config c = {0};
    al_model_config_set_arch(&c, AL_MODEL_ARCH_QWEN2);
    c.vocab_size = 64, c.hidden_size = 32, c.intermediate_size = 48, c.num_layers = 2;
    c.num_heads = 4, c.num_kv_heads = 2, c.head_dim = 8, c.rms_norm_eps = 1e-6;
    c.rope_theta = 1e6, c.tie_word_embeddings = 1, c.max_position_embeddings = 256;
    c.bos_token_id = c.eos_token_id = -1;
    char err[256];
    al_model *m = al_model_new(&c, err, sizeof err);
    if (m) al_model_init_random(m, 2);
    return m;
}

TEST(world_of_one_changes_nothing)
{
    char err[256];
    al_dist_opts o = {.rank = 0, .world = 1};
    al_dist *d = al_dist_new(al_backend_cpu(), &o, err, sizeof err);
    REQUIREF(d, "%s", err);
    CHECK_EQ_INT(al_dist_world(d), 1);
    al_model *a = tiny(), *b = tiny();
    REQUIRE(a && b);
    int32_t tok[40], cu[3] = {0, 17, 40};
    float mask[40], adv[40];
    for (int t = 0; t < 40; t++)
        tok[t] = (t * 11 + 3) % 64, mask[t] = t % 17 > 4, adv[t] = t < 17 ? 1.0f : -0.5f;
    al_train_chunk ch[2] = {{.T = 17, .nseq = 1, .tokens = tok, .cu_seqlens = cu, .mask = mask, .adv = adv},
                            {.T = 23, .nseq = 1, .tokens = tok + 17, .cu_seqlens = (int32_t[]){0, 23},
                             .mask = mask + 17, .adv = adv + 17}};
    al_trainer_config tc;
    al_trainer_config_default(&tc);
    tc.optim.lr = 1e-3f, tc.mini_batches = 2;
    al_trainer *ta = al_trainer_new(a, NULL, &tc, err, sizeof err);
    al_trainer *tb = al_trainer_new(b, NULL, &tc, err, sizeof err);
    REQUIRE(ta && tb);
    REQUIRE(al_trainer_set_dist(tb, d, err, sizeof err) == 0);
    al_train_stats sa, sb;
    REQUIRE(al_trainer_step(ta, ch, 2, &sa, err, sizeof err) == 0);
    REQUIRE(al_trainer_step(tb, ch, 2, &sb, err, sizeof err) == 0);
    CHECK(sa.loss == sb.loss && sa.grad_norm == sb.grad_norm);
    CHECK(memcmp(al_model_params(a), al_model_params(b), sizeof(float) * al_model_num_params(a)) == 0);
    al_trainer_free(ta), al_trainer_free(tb), al_model_free(a), al_model_free(b);
    al_dist_free(d);
}
