/*
 * arclight model: model utilities.
 *
 *   arclight model init --config CONFIG.json --out DIR --seed S [--dtype f32|bf16]
 *       writes a randomly initialized model of that config: DIR/config.json and
 *       DIR/model.safetensors with Hugging Face tensor names (loads in transformers/vLLM).
 *   arclight model info DIR
 *       prints the architecture, sizes, parameter count and every tensor of DIR, after
 *       loading it fully (so a model that info accepts is one that train and serve load).
 *   arclight model sft --model DIR --data FILE --out DIR
 *       a supervised warm start from conversations in a file (model_sft.c).
 *
 * Uses lib/model and lib/core only.
 */
#include "core/cli.h"
#include "model/config.h"
#include "model/model.h"
#include "model/safetensors.h"

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char model_usage[] =
    "usage: arclight model init --config CONFIG.json --out DIR --seed S [--dtype f32|bf16]\n"
    "       arclight model info DIR\n"
    "       arclight model sft --model DIR --data FILE --out DIR [flags] (see its --help)\n"
    "\n"
    "init  writes a random model (normal(0, 0.02) weights, unit norms, zero biases, the same\n"
    "      for the same seed on every machine) as DIR/config.json + DIR/model.safetensors.\n"
    "      CONFIG.json is a Hugging Face config (Qwen2ForCausalLM, Qwen3ForCausalLM or\n"
    "      LlamaForCausalLM); tests/model/tiny-qwen2.json and tiny-qwen3.json are tiny ones.\n"
    "  --config FILE   the model's config.json (or a directory holding one)\n"
    "  --out DIR       output directory (created if missing)\n"
    "  --seed S        random seed (unsigned integer)\n"
    "  --dtype D       f32 (default) or bf16\n"
    "info  loads DIR (config.json + model.safetensors or a sharded index) and prints its\n"
    "      architecture, sizes, parameter count and tensors.\n";

static int model_init(int argc, char **argv)
{
    static const struct option opts[] = {
        {"config", required_argument, 0, 'c'}, {"out", required_argument, 0, 'o'},
        {"seed", required_argument, 0, 's'},   {"dtype", required_argument, 0, 'd'},
        {"help", no_argument, 0, 'h'},         {0, 0, 0, 0},
    };
    const char *config = NULL, *out = NULL, *seed_s = NULL, *dtype_s = "f32";
    int c;
    optind = 1;
    while ((c = getopt_long(argc, argv, "c:o:s:d:h", opts, NULL)) != -1) {
        switch (c) {
        case 'c':
            config = optarg;
            break;
        case 'o':
            out = optarg;
            break;
        case 's':
            seed_s = optarg;
            break;
        case 'd':
            dtype_s = optarg;
            break;
        case 'h':
            fputs(model_usage, stdout);
            return AL_EXIT_OK;
        default:
            return al_cli_usage_error("model init", "unknown option");
        }
    }
    if (optind < argc)
        return al_cli_usage_error("model init", "unexpected argument '%s'", argv[optind]);
    if (!config) return al_cli_usage_error("model init", "--config CONFIG.json is required");
    if (!out) return al_cli_usage_error("model init", "--out DIR is required");
    if (!seed_s) return al_cli_usage_error("model init", "--seed S is required");
    char *end;
    errno = 0;
    unsigned long long seed = strtoull(seed_s, &end, 10);
    if (!*seed_s || *end || seed_s[0] == '-' || errno)
        return al_cli_usage_error("model init", "--seed '%s' is not an unsigned integer", seed_s);
    al_st_dtype dtype;
    if (!strcmp(dtype_s, "f32") || !strcmp(dtype_s, "float32"))
        dtype = AL_ST_DTYPE_F32;
    else if (!strcmp(dtype_s, "bf16") || !strcmp(dtype_s, "bfloat16"))
        dtype = AL_ST_DTYPE_BF16;
    else
        return al_cli_usage_error("model init", "--dtype '%s': expected f32 or bf16", dtype_s);

    char err[1024];
    al_model_config cfg;
    if (al_model_config_load(&cfg, config, err, sizeof err)) {
        fprintf(stderr, "arclight model init: %s\n", err);
        return AL_EXIT_FAILURE;
    }
    al_model *m = al_model_new(&cfg, err, sizeof err);
    if (!m) {
        fprintf(stderr, "arclight model init: %s\n", err);
        return AL_EXIT_FAILURE;
    }
    al_model_init_random(m, seed);
    int rc = al_model_save_dir(m, out, dtype, err, sizeof err);
    if (rc)
        fprintf(stderr, "arclight model init: %s\n", err);
    else
        printf("wrote %s: %s, %zu parameters, %s\n", out, cfg.architecture, al_model_num_params(m),
               dtype == AL_ST_DTYPE_BF16 ? "bf16" : "f32");
    al_model_free(m);
    return rc ? AL_EXIT_FAILURE : AL_EXIT_OK;
}

int model_sft(int argc, char **argv); /* model_sft.c */

static int model_info(int argc, char **argv)
{
    if (argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        fputs(model_usage, stdout);
        return AL_EXIT_OK;
    }
    if (argc != 2) return al_cli_usage_error("model info", "expected exactly one model directory");
    const char *dir = argv[1];
    char err[1024];
    al_model *m = al_model_load_dir(dir, err, sizeof err);
    if (!m) {
        fprintf(stderr, "arclight model info: %s\n", err);
        return AL_EXIT_FAILURE;
    }
    const al_model_config *c = al_model_config_of(m);
    printf("model:        %s\n", dir);
    printf("architecture: %s (%s)\n", c->architecture, c->model_type);
    printf("vocab %d, hidden %d, intermediate %d, layers %d, heads %d, kv heads %d, head dim %d\n",
           c->vocab_size, c->hidden_size, c->intermediate_size, c->num_layers, c->num_heads,
           c->num_kv_heads, c->head_dim);
    printf("rope_theta %g, rms_norm_eps %g, tied embeddings %s, qkv bias %s, qk norm %s\n",
           c->rope_theta, c->rms_norm_eps, c->tie_word_embeddings ? "yes" : "no",
           c->qkv_bias ? "yes" : "no", c->qk_norm ? "yes" : "no");
    printf("parameters:   %zu (%.2f M)\n", al_model_num_params(m), al_model_num_params(m) / 1e6);
    printf("tensors:      %zu\n", al_model_num_tensors(m));
    for (size_t i = 0; i < al_model_num_tensors(m); i++) {
        const al_model_tensor *t = &al_model_tensors(m)[i];
        if (t->ndim == 2)
            printf("  %-56s [%" PRId64 ", %" PRId64 "]\n", t->name, t->shape[0], t->shape[1]);
        else
            printf("  %-56s [%" PRId64 "]\n", t->name, t->shape[0]);
    }
    al_model_free(m);
    return AL_EXIT_OK;
}

int cmd_model(int argc, char **argv)
{
    if (argc < 2) {
        fputs(model_usage, stderr);
        return AL_EXIT_USAGE;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") || !strcmp(argv[1], "help")) {
        fputs(model_usage, stdout);
        return AL_EXIT_OK;
    }
    if (!strcmp(argv[1], "init")) return model_init(argc - 1, argv + 1);
    if (!strcmp(argv[1], "info")) return model_info(argc - 1, argv + 1);
    if (!strcmp(argv[1], "sft")) return model_sft(argc - 1, argv + 1);
    return al_cli_usage_error("model", "unknown subcommand '%s' (init, info or sft)", argv[1]);
}
