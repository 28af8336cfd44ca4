/*
 * config.h: a decoder's shape, as a Hugging Face config.json describes it.
 *
 * Supported architectures: Qwen2ForCausalLM (q/k/v biases), Qwen3ForCausalLM (per-head
 * q/k RMSNorm, explicit head_dim) and LlamaForCausalLM. Anything else, RoPE scaling,
 * sliding-window attention or sizes that do not fit together are rejected with an error
 * that names the field, so a model is never run with a silently different shape.
 */
#ifndef ARCLIGHT_MODEL_CONFIG_H
#define ARCLIGHT_MODEL_CONFIG_H

#include <stddef.h>
#include <stdint.h>

typedef enum al_model_arch {
    AL_MODEL_ARCH_QWEN2,
    AL_MODEL_ARCH_QWEN3,
    AL_MODEL_ARCH_LLAMA,
} al_model_arch;

typedef struct al_model_config {
    al_model_arch arch;
    char architecture[64]; /* "Qwen2ForCausalLM", ... (as written back out) */
    char model_type[32];   /* "qwen2", "qwen3", "llama" */
    int vocab_size;        /* V */
    int hidden_size;       /* C */
    int intermediate_size; /* I: SwiGLU width */
    int num_layers;        /* L: num_hidden_layers */
    int num_heads;         /* NH: num_attention_heads */
    int num_kv_heads;      /* NKV: num_key_value_heads (GQA; NH % NKV == 0) */
    int head_dim;          /* HD: Qwen3/Llama may set it; else C / NH */
    double rms_norm_eps;
    double rope_theta;
    int tie_word_embeddings; /* lm_head shares embed_tokens (no lm_head.weight in files) */
    int qkv_bias;            /* q_proj/k_proj/v_proj carry a bias (Qwen2 always) */
    int o_bias;              /* o_proj carries a bias (attention_bias in Llama/Qwen3) */
    int qk_norm;             /* per-head RMSNorm of q and k before RoPE (Qwen3) */
    int max_position_embeddings;
    int64_t bos_token_id; /* -1: absent */
    int64_t eos_token_id; /* -1: absent; the first one when config.json lists several */
    char torch_dtype[16]; /* "float32", "bfloat16", ... as found (default "float32") */
} al_model_config;

/* Fills cfg from config.json text. Returns 0, or -1 with the offending field in errstr
 * (unknown architecture, missing or non-positive size, heads that do not divide, ...). */
int al_model_config_parse(al_model_config *cfg, const char *json, size_t len, char *errstr,
                          size_t errlen);

/* Reads and parses the file at `path` (a config.json, or a directory holding one). */
int al_model_config_load(al_model_config *cfg, const char *path, char *errstr, size_t errlen);

/* Checks that the sizes fit together; al_model_config_parse calls it. 0 or -1. */
int al_model_config_validate(const al_model_config *cfg, char *errstr, size_t errlen);

/* Sets the architecture-dependent defaults (model_type, biases, qk_norm) for `arch` and
 * zeroes nothing else; for building configs in code. */
void al_model_config_set_arch(al_model_config *cfg, al_model_arch arch);

/* config.json text for cfg, in Hugging Face's field names, with `dtype` as torch_dtype
 * (NULL: cfg->torch_dtype). Returns a malloc'd NUL-terminated string (caller frees) or
 * NULL when out of memory. */
char *al_model_config_to_json(const al_model_config *cfg, const char *dtype);

/* Writes al_model_config_to_json() to `path` (replaced atomically). 0 or -1 with errstr. */
int al_model_config_save(const al_model_config *cfg, const char *dtype, const char *path,
                         char *errstr, size_t errlen);

/* Number of parameters (floats) a model of this config holds. */
size_t al_model_config_num_params(const al_model_config *cfg);

#endif
