/*
 * 0606: inference with a KV cache. Feeding a sequence through al_model_kv_forward in chunks
 * (a prompt, then one token at a time) gives the logits al_model_forward gives for the whole
 * sequence, for Qwen2 (biases, tied) and Qwen3 (q/k norms); truncating the cache and
 * re-feeding reproduces them; a full cache and bad tokens are errors.
 */
#include "testlib.h"

#include "model/model.h"

static al_model *tiny(al_model_arch arch, char *err, size_t errlen)
{
    al_model_config c = {0};
    al_model_config_set_arch(&c, arch);
    c.vocab_size = 80, c.hidden_size = 32, c.intermediate_size = 40, c.num_layers = 3;
    c.num_heads = 4, c.num_kv_heads = 2, c.head_dim = arch == AL_MODEL_ARCH_QWEN3 ? 10 : 8;
    c.rms_norm_eps = 1e-6, c.rope_theta = 1e4, c.tie_word_embeddings = arch == AL_MODEL_ARCH_QWEN2;
    c.max_position_embeddings = 256, c.bos_token_id = c.eos_token_id = -1;
    al_model *m = al_model_new(&c, err, errlen);
    if (m) {
        al_model_init_random(m, 5);
        /* weights well above HF's 0.02 (sharp attention), norms left at 1 */
        for (size_t i = 0; i < al_model_num_tensors(m); i++) {
            const al_model_tensor *t = &al_model_tensors(m)[i];
            if (strstr(t->name, "norm")) continue;
            for (size_t j = 0; j < t->numel; j++)
                al_model_params(m)[t->offset + j] *= 12.0f;
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

static void kv_matches_full_forward(al_model_arch arch)
{
    char err[256];
    al_model *m = tiny(arch, err, sizeof err);
    REQUIREF(m, "%s", err);
    enum { T = 40, V = 80 };
    int32_t tok[T], pos[T], cu[2] = {0, T};
    for (int t = 0; t < T; t++)
        tok[t] = (t * 29 + 7) % V, pos[t] = t;
    float *full = malloc(sizeof(float) * T * V), *got = malloc(sizeof(float) * T * V);
    REQUIRE(al_model_forward(m, tok, pos, cu, 1, T, full) == 0);

    al_model_kv *kv = al_model_kv_new(m, T, err, sizeof err);
    REQUIREF(kv, "%s", err);
    /* a 13-token prompt with all logits, then one token at a time with the last only */
    REQUIRE(al_model_kv_forward(m, kv, tok, 13, got, 0) == 0);
    for (int t = 13; t < T; t++) {
        REQUIREF(al_model_kv_forward(m, kv, tok + t, 1, got + (size_t)t * V, 1) == 0, "%s",
                 al_model_error(m));
    }
    CHECK_EQ_INT(al_model_kv_len(kv), T);
    double e = max_rel(got, full, (size_t)T * V);
    printf("    incremental vs full forward: max relative error %.3g\n", e);
    CHECKF(e < 1e-5, "incremental logits differ from the full forward by %.3g", e);

    /* the cache is full */
    CHECK(al_model_kv_forward(m, kv, tok, 1, got, 1) == -1);
    CHECK(strstr(al_model_error(m), "do not fit") != NULL);

    /* back to 20 tokens, then the rest in one chunk */
    al_model_kv_truncate(kv, 20);
    CHECK_EQ_INT(al_model_kv_len(kv), 20);
    REQUIRE(al_model_kv_forward(m, kv, tok + 20, T - 20, got + 20 * V, 0) == 0);
    e = max_rel(got + 20 * V, full + 20 * V, (size_t)(T - 20) * V);
    CHECKF(e < 1e-5, "after truncation, logits differ by %.3g", e);

    al_model_kv_reset(kv);
    int32_t bad = V;
    CHECK(al_model_kv_forward(m, kv, &bad, 1, got, 1) == -1);
    CHECK(strstr(al_model_error(m), "vocabulary") != NULL);
    CHECK_EQ_INT(al_model_kv_len(kv), 0);
    /* a training step in between does not disturb the cache */
    REQUIRE(al_model_kv_forward(m, kv, tok, 5, got, 0) == 0);
    REQUIRE(al_model_forward(m, tok, pos, cu, 1, T, full) == 0);
    REQUIRE(al_model_kv_forward(m, kv, tok + 5, 1, got + 5 * V, 1) == 0);
    e = max_rel(got + 5 * V, full + 5 * V, V);
    CHECKF(e < 1e-5, "token 5 after an interleaved forward differs by %.3g", e);
    CHECK(al_model_kv_new(m, 0, err, sizeof err) == NULL);
    al_model_kv_free(kv);
    free(full), free(got);
    al_model_free(m);
}

TEST(kv_cache_matches_full_forward_qwen2)
{
    kv_matches_full_forward(AL_MODEL_ARCH_QWEN2);
}
TEST(kv_cache_matches_full_forward_qwen3)
{
    kv_matches_full_forward(AL_MODEL_ARCH_QWEN3);
}

TEST(long_prompts_go_through_in_chunks)
{
    char err[256];
    al_model *m = tiny(AL_MODEL_ARCH_QWEN3, err, sizeof err);
    REQUIREF(m, "%s", err);
    enum { T = 600, V = 80 };
    int32_t *tok = malloc(sizeof(int32_t) * T), *pos = malloc(sizeof(int32_t) * T), cu[2] = {0, T};
    for (int t = 0; t < T; t++)
        tok[t] = (t * 31 + 11) % V, pos[t] = t;
    float *full = malloc(sizeof(float) * T * V), *got = malloc(sizeof(float) * T * V);
    REQUIRE(al_model_forward(m, tok, pos, cu, 1, T, full) == 0);
    al_model_kv *kv = al_model_kv_new(m, T, err, sizeof err);
    REQUIREF(kv, "%s", err);
    REQUIRE(al_model_kv_forward(m, kv, tok, T - 1, got, 0) == 0); /* 3 chunks: 256, 256, 87 */
    double e = max_rel(got, full, (size_t)(T - 1) * V);
    CHECKF(e < 1e-5, "chunked prompt logits differ by %.3g", e);
    al_model_kv_reset(kv);
    REQUIRE(al_model_kv_forward(m, kv, tok, T, got, 1) == 0);
    e = max_rel(got, full + (size_t)(T - 1) * V, V);
    CHECKF(e < 1e-5, "last-token logits differ by %.3g", e);
    CHECK_EQ_INT(al_model_kv_len(kv), T);
    al_model_kv_free(kv);
    free(tok), free(pos), free(full), free(got);
    al_model_free(m);
}
