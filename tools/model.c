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
#include "core/flags.h"
#include "core/util.h"
#include "model.h"
#include "model/config.h"
#include "model/model.h"
#include "model/safetensors.h"

#include <errno.h>
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
    "init  writes a random model as DIR/config.json + DIR/model.safetensors (see its --help).\n"
    "info  loads DIR (config.json + model.safetensors or a sharded index) and prints its\n"
    "      architecture, sizes, parameter count and tensors.\n";

int model_parse_seed(void *dest, const char *v, char *err, size_t errlen)
{
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (!*v || *end || v[0] == '-' || errno) {
        snprintf(err, errlen, "wants an unsigned integer");
        return -1;
    }
    ((model_seed *)dest)->value = x;
    ((model_seed *)dest)->given = 1;
    return 0;
}

static const char *const model_dtypes[] = {"f32", "float32", "bf16", "bfloat16", NULL};

static int model_init(int argc, char **argv)
{
    const char *config = NULL, *out = NULL, *dtype_s = "f32";
    model_seed seed = {0, 0};
    const al_flag flags[] = {
        {"config", 'c', AL_FLAG_STRING, &config, .arg = "FILE",
         .help = "the model's config.json (or a directory holding one)"},
        {"out", 'o', AL_FLAG_STRING, &out, .arg = "DIR",
         .help = "output directory (created if missing)"},
        {"seed", 's', AL_FLAG_FUNC, &seed, .arg = "S", .help = "random seed (unsigned integer)",
         .parse = model_parse_seed},
        {"dtype", 'd', AL_FLAG_STRING, &dtype_s, .arg = "D", .choices = model_dtypes,
         .help = "f32 (default) or bf16"},
    };
    const al_cmd_spec spec = {
        "model init", "--config CONFIG.json --out DIR --seed S [--dtype f32|bf16]",
        "Writes a random model (normal(0, 0.02) weights, unit norms, zero biases, the same\n"
        "for the same seed on every machine) as DIR/config.json + DIR/model.safetensors.\n"
        "CONFIG.json is a Hugging Face config (Qwen2ForCausalLM, Qwen3ForCausalLM or\n"
        "LlamaForCausalLM); tests/model/tiny-qwen2.json and tiny-qwen3.json are tiny ones.\n",
        flags, AL_ARRAY_LEN(flags), .common = 0};
    int first;
    int rc = al_flags_parse(&spec, NULL, argc, argv, &first);
    if (rc != AL_FLAGS_GO) return rc;
    if (first < argc)
        return al_cli_usage_error("model init", "unexpected argument '%s'", argv[first]);
    if (!config) return al_cli_usage_error("model init", "--config CONFIG.json is required");
    if (!out) return al_cli_usage_error("model init", "--out DIR is required");
    if (!seed.given) return al_cli_usage_error("model init", "--seed S is required");
    al_st_dtype dtype = dtype_s[0] == 'f' ? AL_ST_DTYPE_F32 : AL_ST_DTYPE_BF16;

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
    al_model_init_random(m, seed.value);
    rc = al_model_save_dir(m, out, dtype, err, sizeof err);
    if (rc)
        fprintf(stderr, "arclight model init: %s\n", err);
    else
        printf("wrote %s: %s, %zu parameters, %s\n", out, cfg.architecture, al_model_num_params(m),
               dtype == AL_ST_DTYPE_BF16 ? "bf16" : "f32");
    al_model_free(m);
    return rc ? AL_EXIT_FAILURE : AL_EXIT_OK;
}


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
