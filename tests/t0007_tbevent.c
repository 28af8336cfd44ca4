/*
 * t0007: the TensorBoard event writer (lib/core/tbevent.c). CRC32C against its published
 * check value; then a file of scalars read back by TensorBoard's own reader (tests/
 * tb_read.py on scripts/setup.sh's virtual environment; without it the test is skipped):
 * every tag, step, wall time and value as written, in order, and a record with a broken
 * CRC is what the reader then stops at (it checks them: the framing is not ignored).
 */
#include "testlib.h"
#include "support.h"
#include "venv.h"

#include "core/tbevent.h"

#include <jansson.h>
#include <math.h>

static char py[1024];

TEST(crc32c_matches_its_check_value)
{
    CHECK_EQ_INT(al_crc32c("123456789", 9), 0xe3069283u);
    CHECK_EQ_INT(al_crc32c("", 0), 0);
}

/* runs tests/tb_read.py on dir; the JSON it printed (a new reference) or NULL */
static json_t *tb_read(const char *dir)
{
    char cmd[3000], out[1200];
    snprintf(out, sizeof out, "%s.json", dir);
    snprintf(cmd, sizeof cmd, "'%s' tests/tb_read.py '%s' > '%s'", py, dir, out);
    CHECKF(system(cmd) == 0, "%s failed", cmd);
    json_error_t e;
    json_t *j = json_load_file(out, 0, &e);
    CHECKF(j, "%s: %s", out, e.text);
    return j;
}

TEST(tensorboard_reads_back_every_scalar)
{
    al_test_venv_python(py, sizeof py, "tensorboard");
    char dir[512], sub[600], err[256];
    REQUIRE(al_test_tmpdir(dir, sizeof dir, "t0007"));
    snprintf(sub, sizeof sub, "%s/run/a", dir); /* made with its parents */
    al_tb_writer w;
    REQUIRE(al_tb_open(&w, sub, "t0007", err, sizeof err) == 0);
    for (int step = 0; step < 50; step++) {
        al_tb_scalar s[3] = {{"reward/train", step / 50.0},
                             {"tokens_per_s", 1234.5 + step},
                             {"loss", -1e-3 * step}};
        /* the val reward at every tenth step instead of the loss */
        if (step % 10 == 0) s[2] = (al_tb_scalar){"reward/val", 0.5 + step / 100.0};
        REQUIRE(al_tb_scalars(&w, step, 1.7e9 + step * 0.25, s, 3, err, sizeof err) == 0);
    }
    al_tb_close(&w);
    json_t *j = tb_read(dir);
    json_t *run = json_object_get(j, "run/a");
    REQUIRE(run);
    json_t *train = json_object_get(run, "reward/train"), *val = json_object_get(run, "reward/val");
    CHECK_EQ_INT(json_array_size(train), 50);
    CHECK_EQ_INT(json_array_size(val), 5);
    CHECK_EQ_INT(json_array_size(json_object_get(run, "loss")), 45);
    CHECK_EQ_INT(json_array_size(json_object_get(run, "tokens_per_s")), 50);
    for (size_t i = 0; i < json_array_size(train); i++) {
        json_t *e = json_array_get(train, i);
        CHECK_EQ_INT(json_integer_value(json_array_get(e, 0)), (long long)i);
        CHECK_NEAR(json_real_value(json_array_get(e, 1)), 1.7e9 + i * 0.25, 1e-6);
        CHECK_NEAR(json_number_value(json_array_get(e, 2)), (float)(i / 50.0), 1e-7);
    }
    json_t *v3 = json_array_get(val, 3);
    CHECK_EQ_INT(json_integer_value(json_array_get(v3, 0)), 30);
    CHECK_NEAR(json_number_value(json_array_get(v3, 2)), (float)0.8, 1e-7);
    json_decref(j);

    /* a flipped bit in the last record's data: the reader drops that record */
    char path[5000];
    snprintf(path, sizeof path, "%s", w.path);
    size_t len;
    char *bytes = al_test_slurp(path, &len);
    REQUIRE(bytes && len > 20);
    bytes[len - 8] ^= 0x01;
    FILE *f = fopen(path, "wb");
    REQUIRE(f);
    fwrite(bytes, 1, len, f);
    fclose(f);
    free(bytes);
    j = tb_read(dir);
    CHECK_EQ_INT(json_array_size(json_object_get(json_object_get(j, "run/a"), "reward/train")), 49);
    json_decref(j);
    if (!testlib_cur_failed) al_test_rmtree(dir);
}

