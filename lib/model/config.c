/*
 * config.c: Hugging Face config.json <-> al_model_config.
 */
#include "model/config.h"

#include "core/util.h"
#include "text/json.h"
#include "model/safetensors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

void al_model_config_set_arch(al_model_config *cfg, al_model_arch arch)
{
    cfg->arch = arch;
    switch (arch) {
    case AL_MODEL_ARCH_QWEN2:
        snprintf(cfg->architecture, sizeof cfg->architecture, "Qwen2ForCausalLM");
        snprintf(cfg->model_type, sizeof cfg->model_type, "qwen2");
        cfg->qkv_bias = 1, cfg->o_bias = 0, cfg->qk_norm = 0;
        break;
    case AL_MODEL_ARCH_QWEN3:
        snprintf(cfg->architecture, sizeof cfg->architecture, "Qwen3ForCausalLM");
        snprintf(cfg->model_type, sizeof cfg->model_type, "qwen3");
        cfg->qkv_bias = 0, cfg->o_bias = 0, cfg->qk_norm = 1;
        break;
    case AL_MODEL_ARCH_LLAMA:
        snprintf(cfg->architecture, sizeof cfg->architecture, "LlamaForCausalLM");
        snprintf(cfg->model_type, sizeof cfg->model_type, "llama");
        cfg->qkv_bias = 0, cfg->o_bias = 0, cfg->qk_norm = 0;
        break;
    }
}

/* Reads an integer member that must be present, be an integer, and lie in [lo, hi]. */
static int get_size(const al_json *root, const char *key, int *out, int64_t lo, int64_t hi,
                    char *errstr, size_t errlen)
{
    const al_json *v = al_json_get(root, key);
    if (!v || v->type == AL_JSON_NULL)
        return al_err(errstr, errlen, "config.json: missing \"%s\"", key);
    if (v->type != AL_JSON_NUMBER || !v->is_integer)
        return al_err(errstr, errlen, "config.json: \"%s\" is not an integer", key);
    if (v->integer < lo || v->integer > hi)
        return al_err(errstr, errlen,
                            "config.json: \"%s\" = %lld is out of range [%lld, %lld]", key,
                            (long long)v->integer, (long long)lo, (long long)hi);
    *out = (int)v->integer;
    return 0;
}

/* A token id member: an integer, a list of integers (first one taken), null or absent. */
static int get_token_id(const al_json *root, const char *key, int64_t *out, char *errstr,
                        size_t errlen)
{
    const al_json *v = al_json_get(root, key);
    *out = -1;
    if (!v || v->type == AL_JSON_NULL) return 0;
    if (v->type == AL_JSON_ARRAY && v->count > 0) v = v->items[0];
    if (v->type == AL_JSON_ARRAY) return 0;
    if (v->type != AL_JSON_NUMBER || !v->is_integer || v->integer < 0)
        return al_err(errstr, errlen, "config.json: \"%s\" is not a token id", key);
    *out = v->integer;
    return 0;
}

int al_model_config_validate(const al_model_config *c, char *errstr, size_t errlen)
{
    if (c->vocab_size <= 0 || c->hidden_size <= 0 || c->intermediate_size <= 0 ||
        c->num_layers <= 0 || c->num_heads <= 0 || c->num_kv_heads <= 0 || c->head_dim <= 0)
        return al_err(errstr, errlen, "config: every size must be positive");
    if (c->num_heads % c->num_kv_heads != 0)
        return al_err(errstr, errlen,
                            "config: num_attention_heads (%d) is not a multiple of "
                            "num_key_value_heads (%d)",
                            c->num_heads, c->num_kv_heads);
    if (c->head_dim % 2 != 0)
        return al_err(errstr, errlen,
                            "config: head_dim (%d) must be even for rotary embeddings",
                            c->head_dim);
    /* Qwen2 implementations of transformers before 4.48 derive head_dim from hidden_size. */
    if (c->arch == AL_MODEL_ARCH_QWEN2 && c->head_dim * c->num_heads != c->hidden_size)
        return al_err(
            errstr, errlen,
            "config: hidden_size (%d) is not num_attention_heads (%d) x head_dim (%d)",
            c->hidden_size, c->num_heads, c->head_dim);
    /* finite too: a JSON number beyond the double range (1e506) reads as infinity */
    if (!(c->rms_norm_eps > 0 && c->rms_norm_eps < HUGE_VAL) ||
        !(c->rope_theta > 0 && c->rope_theta < HUGE_VAL))
        return al_err(errstr, errlen,
                            "config: rms_norm_eps and rope_theta must be positive finite numbers "
                            "(got %g and %g)",
                            c->rms_norm_eps, c->rope_theta);
    if ((int64_t)c->num_heads * c->head_dim > (1 << 20) ||
        (int64_t)c->num_kv_heads * c->head_dim > (1 << 20))
        return al_err(errstr, errlen, "config: attention width is implausibly large");
    /* Keep every tensor's element count and the total far from size_t overflow. */
    double total = (double)al_model_config_num_params(c);
    if (total > 1e12)
        return al_err(errstr, errlen, "config: %.3g parameters is too many", total);
    if (c->bos_token_id >= c->vocab_size || c->eos_token_id >= c->vocab_size)
        return al_err(errstr, errlen, "config: bos/eos token id is not below vocab_size (%d)",
                            c->vocab_size);
    return 0;
}

size_t al_model_config_num_params(const al_model_config *c)
{
    size_t C = (size_t)c->hidden_size, V = (size_t)c->vocab_size, I = (size_t)c->intermediate_size;
    size_t Q = (size_t)c->num_heads * c->head_dim, KV = (size_t)c->num_kv_heads * c->head_dim;
    size_t per_layer = 2 * C + Q * C + 2 * KV * C + C * Q + 3 * I * C;
    if (c->qkv_bias) per_layer += Q + 2 * KV;
    if (c->o_bias) per_layer += C;
    if (c->qk_norm) per_layer += 2 * (size_t)c->head_dim;
    size_t n = V * C + (size_t)c->num_layers * per_layer + C;
    if (!c->tie_word_embeddings) n += V * C;
    return n;
}

int al_model_config_parse(al_model_config *cfg, const char *text, size_t len, char *errstr,
                          size_t errlen)
{
    char jerr[200];
    al_json *root = al_json_parse(text, len, jerr, sizeof jerr);
    if (!root) return al_err(errstr, errlen, "config.json: %s", jerr);
    int rc = -1;
    memset(cfg, 0, sizeof *cfg);
    if (root->type != AL_JSON_OBJECT) {
        al_err(errstr, errlen, "config.json: not a JSON object");
        goto out;
    }

    const char *arch_name = NULL;
    const al_json *archs = al_json_get(root, "architectures");
    if (archs && archs->type == AL_JSON_ARRAY && archs->count > 0 &&
        archs->items[0]->type == AL_JSON_STRING)
        arch_name = archs->items[0]->string;
    const char *model_type = al_json_get_string(root, "model_type", NULL);
    if (arch_name) {
        if (!strcmp(arch_name, "Qwen2ForCausalLM"))
            al_model_config_set_arch(cfg, AL_MODEL_ARCH_QWEN2);
        else if (!strcmp(arch_name, "Qwen3ForCausalLM"))
            al_model_config_set_arch(cfg, AL_MODEL_ARCH_QWEN3);
        else if (!strcmp(arch_name, "LlamaForCausalLM"))
            al_model_config_set_arch(cfg, AL_MODEL_ARCH_LLAMA);
        else {
            al_err(
                errstr, errlen,
                "config.json: unsupported architecture \"%s\" (supported: Qwen2ForCausalLM, "
                "Qwen3ForCausalLM, LlamaForCausalLM)",
                arch_name);
            goto out;
        }
    } else if (model_type) {
        if (!strcmp(model_type, "qwen2"))
            al_model_config_set_arch(cfg, AL_MODEL_ARCH_QWEN2);
        else if (!strcmp(model_type, "qwen3"))
            al_model_config_set_arch(cfg, AL_MODEL_ARCH_QWEN3);
        else if (!strcmp(model_type, "llama"))
            al_model_config_set_arch(cfg, AL_MODEL_ARCH_LLAMA);
        else {
            al_err(errstr, errlen, "config.json: unsupported model_type \"%s\"", model_type);
            goto out;
        }
    } else {
        al_err(errstr, errlen,
                     "config.json: neither \"architectures\" nor \"model_type\" is given");
        goto out;
    }
    if (model_type && strcmp(model_type, cfg->model_type) != 0) {
        al_err(errstr, errlen,
                     "config.json: model_type \"%s\" does not match architecture %s", model_type,
                     cfg->architecture);
        goto out;
    }

    const int64_t big = 1 << 30;
    if (get_size(root, "vocab_size", &cfg->vocab_size, 1, big, errstr, errlen) ||
        get_size(root, "hidden_size", &cfg->hidden_size, 1, 1 << 20, errstr, errlen) ||
        get_size(root, "intermediate_size", &cfg->intermediate_size, 1, 1 << 22, errstr, errlen) ||
        get_size(root, "num_hidden_layers", &cfg->num_layers, 1, 4096, errstr, errlen) ||
        get_size(root, "num_attention_heads", &cfg->num_heads, 1, 4096, errstr, errlen))
        goto out;
    cfg->num_kv_heads = cfg->num_heads;
    if (al_json_get(root, "num_key_value_heads") &&
        al_json_get(root, "num_key_value_heads")->type != AL_JSON_NULL &&
        get_size(root, "num_key_value_heads", &cfg->num_kv_heads, 1, 4096, errstr, errlen))
        goto out;
    const al_json *hd = al_json_get(root, "head_dim");
    if (hd && hd->type != AL_JSON_NULL) {
        if (get_size(root, "head_dim", &cfg->head_dim, 1, 1 << 16, errstr, errlen)) goto out;
    } else {
        if (cfg->hidden_size % cfg->num_heads != 0) {
            al_err(
                errstr, errlen,
                "config.json: hidden_size (%d) is not a multiple of num_attention_heads (%d)"
                " and no head_dim is given",
                cfg->hidden_size, cfg->num_heads);
            goto out;
        }
        cfg->head_dim = cfg->hidden_size / cfg->num_heads;
    }
    cfg->max_position_embeddings = 32768;
    if (al_json_get(root, "max_position_embeddings") &&
        get_size(root, "max_position_embeddings", &cfg->max_position_embeddings, 1, big, errstr,
                 errlen))
        goto out;

    cfg->rms_norm_eps = al_json_get_number(root, "rms_norm_eps", 1e-6);
    cfg->rope_theta = al_json_get_number(root, "rope_theta", 10000.0);
    cfg->tie_word_embeddings = al_json_get_bool(root, "tie_word_embeddings", 0);
    if (cfg->arch != AL_MODEL_ARCH_QWEN2) {
        int ab = al_json_get_bool(root, "attention_bias", 0);
        cfg->qkv_bias = ab, cfg->o_bias = ab;
    }
    if (al_json_get_bool(root, "mlp_bias", 0)) {
        al_err(errstr, errlen, "config.json: mlp_bias is not supported");
        goto out;
    }
    const char *act = al_json_get_string(root, "hidden_act", "silu");
    if (strcmp(act, "silu") != 0) {
        al_err(errstr, errlen, "config.json: hidden_act \"%s\" is not supported (only silu)",
                     act);
        goto out;
    }
    const al_json *rs = al_json_get(root, "rope_scaling");
    if (rs && rs->type != AL_JSON_NULL) {
        const char *t = al_json_get_string(rs, "rope_type", al_json_get_string(rs, "type", ""));
        if (strcmp(t, "default") != 0) {
            al_err(errstr, errlen, "config.json: rope_scaling \"%s\" is not supported", t);
            goto out;
        }
    }
    if (al_json_get_bool(root, "use_sliding_window", 0)) {
        al_err(errstr, errlen, "config.json: use_sliding_window is not supported");
        goto out;
    }
    if (get_token_id(root, "bos_token_id", &cfg->bos_token_id, errstr, errlen) ||
        get_token_id(root, "eos_token_id", &cfg->eos_token_id, errstr, errlen))
        goto out;
    snprintf(cfg->torch_dtype, sizeof cfg->torch_dtype, "%s",
             al_json_get_string(root, "torch_dtype", "float32"));
    rc = al_model_config_validate(cfg, errstr, errlen);
out:
    al_json_free(root);
    return rc;
}

int al_model_config_load(al_model_config *cfg, const char *path, char *errstr, size_t errlen)
{
    char full[4096];
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(full, sizeof full, "%s/config.json", path);
        path = full;
    }
    size_t len;
    char ferr[256];
    uint8_t *text = (uint8_t *)al_file_read(path, &len, ferr, sizeof ferr);
    if (!text) return al_err(errstr, errlen, "%s", ferr);
    int rc = al_model_config_parse(cfg, (const char *)text, len, ferr, sizeof ferr);
    free(text);
    if (rc) return al_err(errstr, errlen, "%s: %s", path, ferr);
    return 0;
}

/* The shortest decimal that reads back as x, always with a '.' or an exponent so that
 * Python reads a float ("1e-06", "1000000.0"). */
static void fmt_double(char *out, size_t n, double x)
{
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(out, n, "%.*g", prec, x);
        if (strtod(out, NULL) == x) break;
    }
    if (!strpbrk(out, ".eEn")) strncat(out, ".0", n - strlen(out) - 1);
}

char *al_model_config_to_json(const al_model_config *c, const char *dtype)
{
    char eps[40], theta[40];
    fmt_double(eps, sizeof eps, c->rms_norm_eps);
    fmt_double(theta, sizeof theta, c->rope_theta);
    al_buf b = {0};
    al_buf_printf(&b, "{\n  \"architectures\": [");
    al_json_quote(&b, c->architecture, strlen(c->architecture));
    al_buf_printf(&b, "],\n  \"model_type\": ");
    al_json_quote(&b, c->model_type, strlen(c->model_type));
    al_buf_printf(&b,
                       ",\n  \"vocab_size\": %d,\n  \"hidden_size\": %d,\n"
                       "  \"intermediate_size\": %d,\n  \"num_hidden_layers\": %d,\n"
                       "  \"num_attention_heads\": %d,\n  \"num_key_value_heads\": %d,\n"
                       "  \"head_dim\": %d,\n  \"hidden_act\": \"silu\",\n"
                       "  \"max_position_embeddings\": %d,\n  \"rms_norm_eps\": %s,\n"
                       "  \"rope_theta\": %s,\n  \"rope_scaling\": null,\n"
                       "  \"tie_word_embeddings\": %s,\n",
                       c->vocab_size, c->hidden_size, c->intermediate_size, c->num_layers,
                       c->num_heads, c->num_kv_heads, c->head_dim, c->max_position_embeddings, eps,
                       theta, c->tie_word_embeddings ? "true" : "false");
    if (c->arch == AL_MODEL_ARCH_QWEN2)
        al_buf_printf(&b, "  \"use_sliding_window\": false,\n");
    else
        al_buf_printf(&b, "  \"attention_bias\": %s,\n  \"mlp_bias\": false,\n",
                           c->o_bias ? "true" : "false");
    al_buf_printf(&b, "  \"attention_dropout\": 0.0,\n  \"initializer_range\": 0.02,\n");
    if (c->bos_token_id >= 0)
        al_buf_printf(&b, "  \"bos_token_id\": %lld,\n", (long long)c->bos_token_id);
    if (c->eos_token_id >= 0)
        al_buf_printf(&b, "  \"eos_token_id\": %lld,\n", (long long)c->eos_token_id);
    const char *dt = dtype ? dtype : (c->torch_dtype[0] ? c->torch_dtype : "float32");
    al_buf_printf(&b, "  \"torch_dtype\": ");
    al_json_quote(&b, dt, strlen(dt));
    al_buf_printf(&b, ",\n  \"use_cache\": true\n}\n");
    if (b.oom) {
        free(b.data);
        return NULL;
    }
    return b.data;
}

int al_model_config_save(const al_model_config *cfg, const char *dtype, const char *path,
                         char *errstr, size_t errlen)
{
    char *text = al_model_config_to_json(cfg, dtype);
    if (!text) return al_err(errstr, errlen, "%s: out of memory", path);
    int rc = al_file_write_atomic2(path, text, strlen(text), NULL, 0, errstr, errlen);
    free(text);
    return rc;
}
