/*
 * t1798_dist_model.h: what the data-parallel tests share (t1705 over NCCL, t1707 over gloo):
 * the tiny Qwen2-shaped model both train, from the same seed, and the relative L2 distance
 * they compare weights with.
 */
#ifndef ARCLIGHT_TESTS_DIST_MODEL_H
#define ARCLIGHT_TESTS_DIST_MODEL_H

#include "model/model.h"

#include <math.h>
#include <stddef.h>

/* 2 layers, hidden 64, vocabulary 128, random weights from seed 4; NULL when out of memory. */
static inline al_model *dist_tiny_model(void)
{
    al_model_config c = {0};
    al_model_config_set_arch(&c, AL_MODEL_ARCH_QWEN2);
    c.vocab_size = 128, c.hidden_size = 64, c.intermediate_size = 96, c.num_layers = 2;
    c.num_heads = 4, c.num_kv_heads = 2, c.head_dim = 16, c.rms_norm_eps = 1e-6;
    c.rope_theta = 1e6, c.tie_word_embeddings = 1, c.max_position_embeddings = 256;
    c.bos_token_id = c.eos_token_id = -1;
    char err[256];
    al_model *m = al_model_new(&c, err, sizeof err);
    if (m) al_model_init_random(m, 4);
    return m;
}

/* |a - b| / |b| over n floats. */
static inline double dist_rel_l2(const float *a, const float *b, size_t n)
{
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return sqrt(num) / (sqrt(den) + 1e-30);
}

#endif
