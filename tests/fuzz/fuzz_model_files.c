/*
 * fuzz_model_files: libFuzzer target for what the model library reads from untrusted
 * places (checkpoints fetched from file:// or http:// URIs, config.json next to them).
 *
 * The first byte picks the parser: even, the rest is a safetensors file, parsed, every
 * tensor converted to f32, and loaded into a tiny Qwen2 model whose tensors a valid seed
 * matches; odd, the rest is a config.json, parsed, written back and re-parsed (the two must
 * agree), and when small enough a model of that shape is built and freed.
 */
#include "model/config.h"
#include "model/model.h"
#include "model/safetensors.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static al_model *tiny_model(void)
{
    static al_model *m;
    if (m) return m;
    al_model_config c = {0};
    al_model_config_set_arch(&c, AL_MODEL_ARCH_QWEN2);
    c.vocab_size = 8, c.hidden_size = 8, c.intermediate_size = 8, c.num_layers = 1;
    c.num_heads = 2, c.num_kv_heads = 1, c.head_dim = 4, c.rms_norm_eps = 1e-6;
    c.rope_theta = 1e4, c.tie_word_embeddings = 1, c.max_position_embeddings = 16;
    c.bos_token_id = c.eos_token_id = -1;
    m = al_model_new(&c, NULL, 0);
    if (!m) abort();
    return m;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1) return 0;
    char err[512];
    if ((data[0] & 1) == 0) {
        uint8_t *bytes = malloc(size - 1 ? size - 1 : 1);
        if (!bytes) return 0;
        memcpy(bytes, data + 1, size - 1);
        al_st_file f;
        if (al_st_parse(&f, bytes, size - 1, "fuzz", err, sizeof err) != 0) {
            if (!err[0]) abort(); /* every failure has a reason */
            return 0;
        }
        for (size_t i = 0; i < f.ntensors; i++) {
            float *out = malloc(sizeof(float) * (f.tensors[i].numel ? f.tensors[i].numel : 1));
            if (out) al_st_tensor_to_f32(&f.tensors[i], out);
            free(out);
        }
        al_model_load_st(tiny_model(), &f, "fuzz", err, sizeof err);
        al_st_close(&f);
    } else {
        al_model_config a, b;
        if (al_model_config_parse(&a, (const char *)data + 1, size - 1, err, sizeof err) != 0) {
            if (!err[0]) abort();
            return 0;
        }
        char *text = al_model_config_to_json(&a, NULL);
        if (!text) return 0;
        if (al_model_config_parse(&b, text, strlen(text), err, sizeof err) != 0) {
            fprintf(stderr, "fuzz_model_files: the written config does not parse again: %s\n%s\n",
                    err, text);
            abort();
        }
        free(text);
        if (al_model_config_num_params(&a) < 200000) {
            al_model *m = al_model_new(&a, err, sizeof err);
            al_model_free(m);
        }
    }
    return 0;
}
