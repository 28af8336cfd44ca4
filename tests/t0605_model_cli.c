/*
 * 0605: `arclight model init` and `arclight model info`, run as a user would ($ARCLIGHT_BIN).
 */
#include "testlib.h"
#include "support.h"

#include "model/model.h"
#include "model/safetensors.h"

#include <sys/wait.h>

static char tmpdir[256];

/* Runs a shell command; returns its exit status and its stdout+stderr in out. */
static int run(char *out, size_t outlen, const char *fmt, ...)
{
    char cmd[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    strncat(cmd, " 2>&1", sizeof cmd - strlen(cmd) - 1);
    FILE *p = popen(cmd, "r");
    if (!p) return -1;
    size_t n = fread(out, 1, outlen - 1, p);
    out[n] = 0;
    int st = pclose(p);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

static const char *bin(void)
{
    const char *b = getenv("ARCLIGHT_BIN");
    return b ? b : "build/arclight";
}

TEST(init_writes_a_model_that_info_and_the_loader_accept)
{
    REQUIRE(al_test_tmpdir(tmpdir, sizeof tmpdir, "t0605"));
    char out[8192], err[256];
    int rc = run(out, sizeof out,
                 "%s model init --config tests/model/tiny-qwen2.json --out %s/a --seed 11", bin(),
                 tmpdir);
    REQUIREF(rc == 0, "exit %d: %s", rc, out);
    CHECKF(strstr(out, "107072 parameters"), "%s", out);
    rc = run(out, sizeof out, "%s model info %s/a", bin(), tmpdir);
    CHECK_EQ_INT(rc, 0);
    CHECKF(strstr(out, "Qwen2ForCausalLM") && strstr(out, "107072") &&
               strstr(out, "model.layers.1.self_attn.q_proj.bias") && strstr(out, "[512, 64]"),
           "%s", out);
    /* same seed, same bytes; another seed, other weights */
    rc = run(out, sizeof out,
             "%s model init --config tests/model/tiny-qwen2.json --out %s/b --seed 11 && cmp "
             "%s/a/model.safetensors %s/b/model.safetensors",
             bin(), tmpdir, tmpdir, tmpdir);
    CHECKF(rc == 0, "%s", out);
    rc = run(out, sizeof out,
             "%s model init --config tests/model/tiny-qwen2.json --out %s/c --seed 12 >/dev/null "
             "&& cmp -s %s/a/model.safetensors %s/c/model.safetensors",
             bin(), tmpdir, tmpdir, tmpdir);
    CHECK(rc == 1);
    /* bf16, Qwen3 */
    rc = run(out, sizeof out,
             "%s model init --config tests/model/tiny-qwen3.json --out %s/d --seed 1 --dtype bf16",
             bin(), tmpdir);
    CHECKF(rc == 0, "%s", out);
    char dir[400];
    snprintf(dir, sizeof dir, "%s/d", tmpdir);
    al_model *m = al_model_load_dir(dir, err, sizeof err);
    REQUIREF(m, "%s", err);
    CHECK_EQ_STR(al_model_config_of(m)->torch_dtype, "bfloat16");
    CHECK_EQ_INT(al_model_num_params(m), 164288);
    al_model_free(m);
}

TEST(usage_errors_exit_2_and_failures_exit_1)
{
    char out[4096];
    CHECK_EQ_INT(run(out, sizeof out, "%s model", bin()), 2);
    CHECK_EQ_INT(run(out, sizeof out, "%s model frobnicate", bin()), 2);
    CHECK(strstr(out, "frobnicate") != NULL);
    CHECK_EQ_INT(run(out, sizeof out, "%s model init --out /tmp/x --seed 1", bin()), 2);
    CHECK(strstr(out, "--config") != NULL);
    CHECK_EQ_INT(run(out, sizeof out,
                     "%s model init --config tests/model/tiny-qwen2.json --out /tmp/x --seed -3",
                     bin()),
                 2);
    CHECK_EQ_INT(
        run(out, sizeof out,
            "%s model init --config tests/model/tiny-qwen2.json --out /tmp/x --seed 1 --dtype f16",
            bin()),
        2);
    CHECK(strstr(out, "f16") != NULL);
    CHECK_EQ_INT(run(out, sizeof out, "%s model info", bin()), 2);
    CHECK_EQ_INT(run(out, sizeof out, "%s model init --help", bin()), 0);
    CHECK(strstr(out, "usage: arclight model init") != NULL);
    CHECK_EQ_INT(run(out, sizeof out,
                     "%s model init --config /nonexistent.json --out %s/e --seed 1", bin(), tmpdir),
                 1);
    CHECK(strstr(out, "/nonexistent.json") != NULL);
    CHECK_EQ_INT(run(out, sizeof out, "%s model info %s/nothing-here", bin(), tmpdir), 1);
    /* a model whose weights do not match its config */
    CHECK_EQ_INT(run(out, sizeof out,
                     "cp tests/model/tiny-qwen3.json %s/a/config.json && %s model info %s/a",
                     tmpdir, bin(), tmpdir),
                 1);
    CHECKF(strstr(out, "missing tensor") || strstr(out, "has shape") || strstr(out, "not part of"),
           "%s", out);
}

TEST(zz_cleanup)
{
    if (tmpdir[0]) al_test_rmtree(tmpdir);
}
