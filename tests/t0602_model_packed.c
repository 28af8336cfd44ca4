/*
 * 0602: packing. Sequences concatenated into one micro-batch (positions restarting at 0,
 * attention never crossing a boundary) give the same logits as each sequence run alone, and
 * the gradients of the packed batch equal the sum of the per-sequence gradients. Also: the
 * forward's input checks, backward without a forward, growing buffers, deterministic init.
 */
#include "testlib.h"

#include "model/model.h"

static al_model *tiny(al_model_arch arch, int tied, char *err, size_t errlen)
{
    al_model_config c = {0};
    al_model_config_set_arch(&c, arch);
    c.vocab_size = 64, c.hidden_size = 32, c.intermediate_size = 48, c.num_layers = 2;
    c.num_heads = 4, c.num_kv_heads = 2, c.head_dim = arch == AL_MODEL_ARCH_QWEN3 ? 12 : 8;
    c.rms_norm_eps = 1e-6, c.rope_theta = 1e6, c.tie_word_embeddings = tied;
    c.max_position_embeddings = 512, c.bos_token_id = c.eos_token_id = -1;
    al_model *m = al_model_new(&c, err, errlen);
    if (m) {
        al_model_init_random(m, 42);
        /* beyond HF's 0.02 so attention is not uniform */
        float *p = al_model_params(m);
        for (size_t i = 0; i < al_model_num_params(m); i++)
            p[i] *= 10.0f;
        for (size_t i = 0; i < al_model_num_tensors(m); i++) {
            const al_model_tensor *t = &al_model_tensors(m)[i];
            if (strstr(t->name, "norm"))
                for (size_t j = 0; j < t->numel; j++)
                    p[t->offset + j] = 1.0f + 0.01f * (float)(j % 7);
        }
    }
    return m;
}

static double max_rel(const float *a, const float *b, size_t n)
{
    double e = 0, s = 1e-12;
    for (size_t i = 0; i < n; i++) {
        e = fmax(e, fabs((double)a[i] - b[i]));
        s = fmax(s, fabs(b[i]));
    }
    return e / s;
}

static void packed_vs_unpacked(al_model_arch arch, int tied)
{
    char err[256];
    al_model *m = tiny(arch, tied, err, sizeof err);
    REQUIREF(m, "%s", err);
    const int nseq = 3, lens[3] = {9, 1, 14}, T = 24, V = 64;
    int32_t tok[24], pos[24], cu[4] = {0, 9, 10, 24};
    for (int t = 0; t < T; t++)
        tok[t] = (t * 13 + 5) % V;
    for (int s = 0; s < nseq; s++)
        for (int i = 0; i < lens[s]; i++)
            pos[cu[s] + i] = i;
    float *logits = malloc(sizeof(float) * T * V), *dl = malloc(sizeof(float) * T * V);
    for (int i = 0; i < T * V; i++)
        dl[i] = (float)((i * 2654435761u) % 1000) / 1000.0f - 0.5f;
    size_t np = al_model_num_params(m);
    float *g_packed = malloc(sizeof(float) * np), *one = malloc(sizeof(float) * T * V);

    REQUIRE(al_model_forward(m, tok, pos, cu, nseq, T, logits) == 0);
    al_model_zero_grad(m);
    REQUIRE(al_model_backward(m, dl) == 0);
    memcpy(g_packed, al_model_grads(m), sizeof(float) * np);

    al_model_zero_grad(m); /* accumulate the single-sequence passes */
    for (int s = 0; s < nseq; s++) {
        int32_t cu1[2] = {0, lens[s]};
        REQUIRE(al_model_forward(m, tok + cu[s], pos + cu[s], cu1, 1, lens[s], one) == 0);
        double e = max_rel(one, logits + (size_t)cu[s] * V, (size_t)lens[s] * V);
        CHECKF(e < 1e-5, "sequence %d: logits alone vs packed differ by %.3g (relative)", s, e);
        REQUIRE(al_model_backward(m, dl + (size_t)cu[s] * V) == 0);
    }
    for (size_t i = 0; i < al_model_num_tensors(m); i++) {
        const al_model_tensor *t = &al_model_tensors(m)[i];
        double e = max_rel(al_model_grads(m) + t->offset, g_packed + t->offset, t->numel);
        CHECKF(e < 1e-4, "%s: summed per-sequence gradient vs packed differ by %.3g", t->name, e);
    }
    free(logits), free(dl), free(g_packed), free(one);
    al_model_free(m);
}

TEST(packed_equals_unpacked_qwen2_tied)
{
    packed_vs_unpacked(AL_MODEL_ARCH_QWEN2, 1);
}
TEST(packed_equals_unpacked_qwen3_untied)
{
    packed_vs_unpacked(AL_MODEL_ARCH_QWEN3, 0);
}

TEST(attention_never_crosses_a_sequence_boundary)
{
    char err[256];
    al_model *m = tiny(AL_MODEL_ARCH_LLAMA, 0, err, sizeof err);
    REQUIREF(m, "%s", err);
    int32_t tok[10], pos[10], cu[3] = {0, 4, 10};
    for (int t = 0; t < 10; t++)
        tok[t] = t * 3, pos[t] = t < 4 ? t : t - 4;
    float *a = malloc(sizeof(float) * 640), *b = malloc(sizeof(float) * 640);
    REQUIRE(al_model_forward(m, tok, pos, cu, 2, 10, a) == 0);
    tok[1] = 63; /* change the first sequence only */
    REQUIRE(al_model_forward(m, tok, pos, cu, 2, 10, b) == 0);
    CHECK(memcmp(a + 4 * 64, b + 4 * 64, sizeof(float) * 6 * 64) == 0);
    CHECK(memcmp(a + 64, b + 64, sizeof(float) * 64) != 0);
    CHECK(memcmp(a, b, sizeof(float) * 64) == 0); /* causal: token 0 does not see token 1 */
    free(a), free(b);
    al_model_free(m);
}

TEST(forward_rejects_bad_batches_with_a_reason)
{
    char err[256];
    al_model *m = tiny(AL_MODEL_ARCH_QWEN2, 1, err, sizeof err);
    REQUIREF(m, "%s", err);
    float logits[4 * 64];
    int32_t tok[4] = {1, 2, 3, 4}, pos[4] = {0, 1, 2, 3}, cu[3] = {0, 2, 4};
    CHECK(al_model_backward(m, logits) == -1);
    CHECK(strstr(al_model_error(m), "without a forward") != NULL);
    tok[2] = 64;
    CHECK(al_model_forward(m, tok, pos, cu, 2, 4, logits) == -1);
    CHECK(strstr(al_model_error(m), "outside the vocabulary") != NULL);
    tok[2] = -1;
    CHECK(al_model_forward(m, tok, pos, cu, 2, 4, logits) == -1);
    tok[2] = 3;
    int32_t bad_cu[3] = {0, 3, 2};
    CHECK(al_model_forward(m, tok, pos, bad_cu, 2, 4, logits) == -1);
    CHECK(strstr(al_model_error(m), "cu_seqlens") != NULL);
    int32_t short_cu[3] = {0, 2, 3};
    CHECK(al_model_forward(m, tok, pos, short_cu, 2, 4, logits) == -1);
    pos[1] = -5;
    CHECK(al_model_forward(m, tok, pos, cu, 2, 4, logits) == -1);
    CHECK(strstr(al_model_error(m), "position") != NULL);
    CHECK(al_model_forward(m, tok, pos, cu, 0, 0, logits) == -1);
    /* a failed forward leaves nothing to go back through */
    CHECK(al_model_backward(m, logits) == -1);
    pos[1] = 1;
    CHECK(al_model_forward(m, tok, pos, cu, 2, 4, logits) == 0);
    CHECK(al_model_backward(m, logits) == 0);
    al_model_free(m);
}

TEST(buffers_grow_and_shrinking_batches_reuse_them)
{
    char err[256];
    al_model *m = tiny(AL_MODEL_ARCH_QWEN3, 0, err, sizeof err);
    REQUIREF(m, "%s", err);
    int32_t tok[100], pos[100];
    for (int t = 0; t < 100; t++)
        tok[t] = t % 64, pos[t] = t;
    float *l1 = malloc(sizeof(float) * 100 * 64), *l2 = malloc(sizeof(float) * 100 * 64);
    int32_t cu_a[2] = {0, 5};
    REQUIRE(al_model_forward(m, tok, pos, cu_a, 1, 5, l1) == 0);
    size_t small = al_model_activation_bytes(m);
    int32_t cu_b[2] = {0, 100};
    REQUIRE(al_model_forward(m, tok, pos, cu_b, 1, 100, l2) == 0);
    CHECK(al_model_activation_bytes(m) > small);
    /* the first 5 tokens of the long sequence are the short sequence (causal) */
    double e = max_rel(l2, l1, 5 * 64);
    CHECKF(e < 1e-5, "prefix logits differ by %.3g", e);
    size_t big = al_model_activation_bytes(m);
    REQUIRE(al_model_forward(m, tok, pos, cu_a, 1, 5, l2) == 0);
    CHECK_EQ_INT(al_model_activation_bytes(m), big);
    CHECK(memcmp(l1, l2, sizeof(float) * 5 * 64) == 0);
    free(l1), free(l2);
    al_model_free(m);
}

TEST(random_init_is_deterministic_and_hf_like)
{
    char err[256];
    al_model_config c = {0};
    al_model_config_set_arch(&c, AL_MODEL_ARCH_QWEN2);
    c.vocab_size = 128, c.hidden_size = 64, c.intermediate_size = 96, c.num_layers = 2;
    c.num_heads = 4, c.num_kv_heads = 2, c.head_dim = 16, c.rms_norm_eps = 1e-6, c.rope_theta = 1e4;
    c.bos_token_id = c.eos_token_id = -1;
    al_model *a = al_model_new(&c, err, sizeof err), *b = al_model_new(&c, err, sizeof err);
    REQUIRE(a && b);
    al_model_init_random(a, 7);
    al_model_init_random(b, 7);
    size_t n = al_model_num_params(a);
    CHECK(memcmp(al_model_params(a), al_model_params(b), n * sizeof(float)) == 0);
    al_model_init_random(b, 8);
    CHECK(memcmp(al_model_params(a), al_model_params(b), n * sizeof(float)) != 0);
    const al_model_tensor *w = al_model_tensor_find(a, "model.layers.1.mlp.up_proj.weight");
    const al_model_tensor *bias = al_model_tensor_find(a, "model.layers.0.self_attn.k_proj.bias");
    const al_model_tensor *nw = al_model_tensor_find(a, "model.norm.weight");
    REQUIRE(w && bias && nw);
    CHECK(al_model_tensor_find(a, "lm_head.weight") != NULL); /* untied: its own head */
    double s = 0, s2 = 0;
    const float *p = al_model_params(a) + w->offset;
    for (size_t i = 0; i < w->numel; i++)
        s += p[i], s2 += (double)p[i] * p[i];
    double mean = s / w->numel, sd = sqrt(s2 / w->numel - mean * mean);
    CHECK_NEAR(mean, 0.0, 0.002);
    CHECK_NEAR(sd, 0.02, 0.001);
    for (size_t i = 0; i < bias->numel; i++)
        CHECK(al_model_params(a)[bias->offset + i] == 0.0f);
    for (size_t i = 0; i < nw->numel; i++)
        CHECK(al_model_params(a)[nw->offset + i] == 1.0f);
    CHECK_EQ_INT(n, al_model_config_num_params(&c));
    al_model_free(a), al_model_free(b);
}
