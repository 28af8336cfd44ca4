/*
 * 0603: safetensors. F32 and BF16 round trips through a model directory, BF16 rounding,
 * sharded checkpoints, and bad files: truncated at every header byte and many data bytes,
 * corrupted headers, and each malformation the loader names (header length past the end, bad
 * JSON, offsets out of range or overlapping, unknown dtype, duplicate names, shape mismatch
 * with the config, missing and extra tensors). None may crash (the ASan build runs this).
 */
#include "testlib.h"
#include "support.h"

#include "core/util.h"
#include "model/model.h"
#include "model/safetensors.h"

#include <sys/stat.h>
#include <unistd.h>

static char tmpdir[256];

static void make_tmpdir(void)
{
    if (!tmpdir[0] && !al_test_tmpdir(tmpdir, sizeof tmpdir, "t0603")) abort();
}

static al_model_config small_config(al_model_arch arch, int tied, int hidden)
{
    al_model_config c = {0};
    al_model_config_set_arch(&c, arch);
    c.vocab_size = 48, c.hidden_size = hidden, c.intermediate_size = 40, c.num_layers = 2;
    c.num_heads = 4, c.num_kv_heads = 2, c.head_dim = hidden / 4, c.rms_norm_eps = 1e-6;
    c.rope_theta = 1e4, c.tie_word_embeddings = tied, c.max_position_embeddings = 128;
    c.bos_token_id = -1, c.eos_token_id = 3;
    snprintf(c.torch_dtype, sizeof c.torch_dtype, "float32");
    return c;
}

static al_model *small_model(al_model_arch arch, int tied, int hidden, uint64_t seed)
{
    al_model_config c = small_config(arch, tied, hidden);
    char err[256];
    al_model *m = al_model_new(&c, err, sizeof err);
    if (!m) {
        fprintf(stderr, "%s\n", err);
        abort();
    }
    al_model_init_random(m, seed);
    /* norms and biases away from 1 and 0, so a mixed-up tensor shows */
    float *p = al_model_params(m);
    for (size_t i = 0; i < al_model_num_params(m); i++)
        if (p[i] == 0.0f || p[i] == 1.0f) p[i] += 0.001f * (float)(i % 13);
    return m;
}

static uint8_t *make_file(const char *header, const void *data, size_t dlen, size_t *len)
{
    size_t h = strlen(header);
    *len = 8 + h + dlen;
    uint8_t *b = malloc(*len);
    for (int i = 0; i < 8; i++)
        b[i] = (uint8_t)((uint64_t)h >> (8 * i));
    memcpy(b + 8, header, h);
    if (dlen) memcpy(b + 8 + h, data, dlen);
    return b;
}

static int write_bytes(const char *path, const void *b, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    size_t w = fwrite(b, 1, n, f);
    fclose(f);
    return w == n ? 0 : -1;
}

/* Parses a header (with `dlen` zero data bytes); returns 0/-1 and the error. */
static int parse_header(const char *header, size_t dlen, char *err, size_t errlen)
{
    uint8_t *zeros = calloc(dlen ? dlen : 1, 1);
    size_t len;
    uint8_t *b = make_file(header, zeros, dlen, &len);
    free(zeros);
    al_st_file f;
    int rc = al_st_parse(&f, b, len, "test.safetensors", err, errlen);
    if (rc == 0) al_st_close(&f);
    return rc;
}

TEST(f32_round_trip_through_a_model_directory_is_exact)
{
    make_tmpdir();
    char dir[400], err[512];
    snprintf(dir, sizeof dir, "%s/f32/nested", tmpdir);
    al_model *a = small_model(AL_MODEL_ARCH_QWEN3, 0, 32, 1);
    REQUIREF(al_model_save_dir(a, dir, AL_ST_DTYPE_F32, err, sizeof err) == 0, "%s", err);
    al_model *b = al_model_load_dir(dir, err, sizeof err);
    REQUIREF(b, "%s", err);
    CHECK_EQ_INT(al_model_num_params(a), al_model_num_params(b));
    CHECK(memcmp(al_model_params(a), al_model_params(b), sizeof(float) * al_model_num_params(a)) ==
          0);
    const al_model_config *ca = al_model_config_of(a), *cb = al_model_config_of(b);
    CHECK_EQ_STR(cb->architecture, "Qwen3ForCausalLM");
    CHECK_EQ_INT(cb->head_dim, ca->head_dim);
    CHECK_EQ_INT(cb->eos_token_id, 3);
    CHECK_EQ_INT(cb->bos_token_id, -1);
    CHECK_NEAR(cb->rope_theta, ca->rope_theta, 0);
    CHECK_NEAR(cb->rms_norm_eps, ca->rms_norm_eps, 0);
    /* the header names Hugging Face tensors and carries pt metadata */
    char path[500];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    al_st_file f;
    REQUIREF(al_st_open(&f, path, err, sizeof err) == 0, "%s", err);
    CHECK(al_st_find(&f, "model.layers.1.self_attn.k_norm.weight") != NULL);
    CHECK(al_st_find(&f, "lm_head.weight") != NULL);
    CHECK_EQ_INT(f.ntensors, al_model_num_tensors(a));
    CHECK_EQ_INT((f.bytes[0] | f.bytes[1] << 8) % 8, 0); /* header padded to 8 bytes */
    al_st_close(&f);
    al_model_free(a), al_model_free(b);
}

TEST(bf16_rounds_to_nearest_even_and_round_trips)
{
    CHECK_EQ_INT(al_f32_to_bf16(1.0f), 0x3f80);
    CHECK_EQ_INT(al_f32_to_bf16(1.0f + 1.0f / 256), 0x3f80); /* tie, to even (down) */
    CHECK_EQ_INT(al_f32_to_bf16(1.0f + 3.0f / 256), 0x3f82); /* tie, to even (up) */
    CHECK_EQ_INT(al_f32_to_bf16(1.0f + 1.5f / 256), 0x3f81); /* above the tie */
    CHECK_EQ_INT(al_f32_to_bf16(-2.0f), 0xc000);
    CHECK_EQ_INT(al_f32_to_bf16(INFINITY), 0x7f80);
    CHECK_EQ_INT(al_f32_to_bf16(3.4028235e38f), 0x7f80); /* rounds past the max */
    CHECK(isnan(al_bf16_to_f32(al_f32_to_bf16(NAN))));
    CHECK_NEAR(al_bf16_to_f32(0x3f81), 1.0078125, 0);

    make_tmpdir();
    char dir[400], err[512];
    snprintf(dir, sizeof dir, "%s/bf16", tmpdir);
    al_model *a = small_model(AL_MODEL_ARCH_QWEN2, 1, 32, 2);
    REQUIREF(al_model_save_dir(a, dir, AL_ST_DTYPE_BF16, err, sizeof err) == 0, "%s", err);
    al_model *b = al_model_load_dir(dir, err, sizeof err);
    REQUIREF(b, "%s", err);
    CHECK_EQ_STR(al_model_config_of(b)->torch_dtype, "bfloat16");
    const float *pa = al_model_params(a), *pb = al_model_params(b);
    size_t bad = 0;
    for (size_t i = 0; i < al_model_num_params(a); i++)
        if (pb[i] != al_bf16_to_f32(al_f32_to_bf16(pa[i]))) bad++;
    CHECKF(bad == 0, "%zu of %zu parameters are not their bf16 rounding", bad,
           al_model_num_params(a));
    /* saving the bf16 model again in bf16 changes nothing */
    char dir2[400];
    snprintf(dir2, sizeof dir2, "%s/bf16-again", tmpdir);
    REQUIRE(al_model_save_dir(b, dir2, AL_ST_DTYPE_BF16, err, sizeof err) == 0);
    al_model *c = al_model_load_dir(dir2, err, sizeof err);
    REQUIREF(c, "%s", err);
    CHECK(memcmp(pb, al_model_params(c), sizeof(float) * al_model_num_params(b)) == 0);
    /* a tied model writes no lm_head.weight */
    char path[500];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    al_st_file f;
    REQUIRE(al_st_open(&f, path, err, sizeof err) == 0);
    CHECK(al_st_find(&f, "lm_head.weight") == NULL);
    CHECK(al_st_find(&f, "model.layers.0.self_attn.q_proj.bias") != NULL);
    CHECK_EQ_INT(al_st_find(&f, "model.embed_tokens.weight")->dtype, AL_ST_DTYPE_BF16);
    al_st_close(&f);
    al_model_free(a), al_model_free(b), al_model_free(c);
}

/* Reads the bytes of a saved model's safetensors. */
static uint8_t *saved_bytes(al_model *m, const char *name, size_t *len)
{
    make_tmpdir();
    char path[400], err[256];
    snprintf(path, sizeof path, "%s/%s.safetensors", tmpdir, name);
    if (al_model_save_safetensors(m, path, AL_ST_DTYPE_F32, err, sizeof err)) abort();
    return (uint8_t *)al_file_read(path, len, err, sizeof err);
}

TEST(truncation_at_any_point_is_an_error)
{
    al_model *m = small_model(AL_MODEL_ARCH_LLAMA, 0, 16, 3);
    size_t len;
    uint8_t *full = saved_bytes(m, "trunc", &len);
    REQUIRE(full);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | full[i];
    int failures = 0, checked = 0;
    char err[512];
    for (size_t cut = 0; cut < len; cut += cut < 8 + hlen + 16 ? 1 : 61) {
        uint8_t *b = malloc(cut ? cut : 1);
        memcpy(b, full, cut);
        al_st_file f;
        int rc = al_st_parse(&f, b, cut, "cut.safetensors", err, sizeof err);
        if (rc == 0) {
            al_st_close(&f);
            printf("    cut at %zu of %zu parsed\n", cut, len);
        } else {
            failures++;
        }
        checked++;
    }
    CHECK_EQ_INT(failures, checked);
    /* and through the loader, with the error naming the file */
    make_tmpdir();
    char path[400];
    snprintf(path, sizeof path, "%s/truncated.safetensors", tmpdir);
    REQUIRE(write_bytes(path, full, len - 5) == 0);
    CHECK(al_model_load_safetensors(m, path, err, sizeof err) == -1);
    CHECKF(strstr(err, "truncated.safetensors") && strstr(err, "out of range"), "%s", err);
    REQUIRE(write_bytes(path, full, 20) == 0);
    CHECK(al_model_load_safetensors(m, path, err, sizeof err) == -1);
    CHECKF(strstr(err, "runs past the end"), "%s", err);
    free(full);
    al_model_free(m);
}

TEST(corrupted_headers_never_crash)
{
    al_model *m = small_model(AL_MODEL_ARCH_QWEN2, 1, 16, 4);
    size_t len;
    uint8_t *full = saved_bytes(m, "corrupt", &len);
    REQUIRE(full);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--)
        hlen = hlen << 8 | full[i];
    uint64_t s = 99;
    int parsed = 0;
    static const char junk[] = "{}[]\",:0123456789-eE. \\xF";
    for (int it = 0; it < 1500; it++) {
        uint8_t *b = malloc(len);
        memcpy(b, full, len);
        int edits = 1 + it % 3;
        for (int e = 0; e < edits; e++) {
            s = s * 6364136223846793005ULL + 1442695040888963407ULL;
            size_t at = (size_t)((s >> 33) % (8 + hlen));
            b[at] = (it & 1) ? (uint8_t)(s >> 20) : (uint8_t)junk[(s >> 24) % (sizeof junk - 1)];
        }
        al_st_file f;
        char err[512];
        if (al_st_parse(&f, b, len, "fuzz", err, sizeof err) == 0) {
            parsed++; /* still valid: every tensor's data must be readable */
            for (size_t i = 0; i < f.ntensors; i++) {
                float *tmp = malloc(sizeof(float) * (f.tensors[i].numel + 1));
                al_st_tensor_to_f32(&f.tensors[i], tmp);
                free(tmp);
            }
            al_st_close(&f);
        } else {
            CHECK(err[0] != 0);
        }
    }
    printf("    1500 corrupted headers, %d still parse (data checked in bounds)\n", parsed);
    free(full);
    al_model_free(m);
}

TEST(each_malformation_gets_a_named_error)
{
    char err[512];
    float data[8] = {0};
    size_t len;
    al_st_file f;
    uint8_t *b = make_file("{}", NULL, 0, &len);
    b[0] = 200; /* header length past the end */
    CHECK(al_st_parse(&f, b, len, "x", err, sizeof err) == -1);
    CHECKF(strstr(err, "runs past the end"), "%s", err);
    b = malloc(3);
    CHECK(al_st_parse(&f, b, 3, "x", err, sizeof err) == -1);
    CHECKF(strstr(err, "truncated"), "%s", err);

    CHECK(parse_header("{\"a\": {\"dtype\":\"F32\",", 0, err, sizeof err) == -1);
    CHECKF(strstr(err, "not valid JSON"), "%s", err);
    CHECK(parse_header("[1,2]", 0, err, sizeof err) == -1);
    CHECKF(strstr(err, "not a JSON object"), "%s", err);
    CHECK(parse_header("{\"w\":{\"dtype\":\"I64\",\"shape\":[2],\"data_offsets\":[0,16]}}", 16, err,
                       sizeof err) == -1);
    CHECKF(strstr(err, "unsupported dtype \"I64\"") && strstr(err, "\"w\""), "%s", err);
    CHECK(parse_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,32]}}", 16,
                       err, sizeof err) == -1);
    CHECKF(strstr(err, "out of range") && strstr(err, "\"w\""), "%s", err);
    CHECK(parse_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,16]}}", 16, err,
                       sizeof err) == -1);
    CHECKF(strstr(err, "do not hold"), "%s", err);
    CHECK(parse_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,0]}}", 16, err,
                       sizeof err) == -1);
    CHECK(parse_header("{\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[-8,0]}}", 16, err,
                       sizeof err) == -1);
    CHECK(parse_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                       "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                       16, err, sizeof err) == -1);
    CHECKF(strstr(err, "overlap"), "%s", err);
    CHECK(parse_header("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                       "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
                       16, err, sizeof err) == -1);
    CHECKF(strstr(err, "twice"), "%s", err);
    CHECK(
        parse_header(
            "{\"w\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,16]}}",
            16, err, sizeof err) == -1);
    CHECK(parse_header("{\"w\":{\"dtype\":\"F32\",\"shape\":\"2\",\"data_offsets\":[0,8]}}", 16,
                       err, sizeof err) == -1);
    CHECK(parse_header("{\"w\":{\"shape\":[2],\"data_offsets\":[0,8]}}", 16, err, sizeof err) ==
          -1);
    CHECK(parse_header("{\"w\":7}", 16, err, sizeof err) == -1);
    /* fine: metadata, BF16 and F16 values, a 0-d tensor */
    CHECK(parse_header("{\"__metadata__\":{\"format\":\"pt\"},\"h\":{\"dtype\":\"BF16\",\"shape\":["
                       "2,2],\"data_offsets\":[0,8]},"
                       "\"g\":{\"dtype\":\"F16\",\"shape\":[],\"data_offsets\":[8,10]}}",
                       16, err, sizeof err) == 0);
    uint16_t h[2] = {0x3c00, 0xc000}; /* F16 1.0, -2.0 */
    uint8_t *fb = make_file("{\"g\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}}    ",
                            h, 4, &len);
    REQUIRE(al_st_parse(&f, fb, len, "f16", err, sizeof err) == 0);
    al_st_tensor_to_f32(&f.tensors[0], data);
    CHECK(data[0] == 1.0f && data[1] == -2.0f);
    al_st_close(&f);
}

TEST(model_and_file_must_agree)
{
    make_tmpdir();
    char err[512], p16[400], p24[400];
    al_model *m16 = small_model(AL_MODEL_ARCH_QWEN2, 1, 16, 5);
    al_model *m24 = small_model(AL_MODEL_ARCH_QWEN2, 1, 24, 5);
    al_model *untied = small_model(AL_MODEL_ARCH_QWEN2, 0, 16, 6);
    al_model *llama = small_model(AL_MODEL_ARCH_LLAMA, 1, 16, 6);
    snprintf(p16, sizeof p16, "%s/m16.safetensors", tmpdir);
    snprintf(p24, sizeof p24, "%s/m24.safetensors", tmpdir);
    REQUIRE(al_model_save_safetensors(m16, p16, AL_ST_DTYPE_F32, err, sizeof err) == 0);
    REQUIRE(al_model_save_safetensors(m24, p24, AL_ST_DTYPE_F32, err, sizeof err) == 0);
    CHECK(al_model_load_safetensors(m24, p16, err, sizeof err) == -1);
    CHECKF(strstr(err, "model.embed_tokens.weight") && strstr(err, "has shape [48, 16]") &&
               strstr(err, "needs [48, 24]"),
           "%s", err);
    CHECK(al_model_load_safetensors(untied, p16, err, sizeof err) == -1);
    CHECKF(strstr(err, "missing tensor \"lm_head.weight\""), "%s", err);
    CHECK(al_model_load_safetensors(llama, p16, err, sizeof err) == -1); /* q/k/v biases */
    CHECKF(strstr(err, "q_proj.bias") && strstr(err, "not part of"), "%s", err);
    /* an untied file loads into a tied model? no: lm_head is ignored only when tied */
    char pu[400];
    snprintf(pu, sizeof pu, "%s/untied.safetensors", tmpdir);
    REQUIRE(al_model_save_safetensors(untied, pu, AL_ST_DTYPE_F32, err, sizeof err) == 0);
    CHECKF(al_model_load_safetensors(m16, pu, err, sizeof err) == 0, "%s", err);
    CHECK(memcmp(al_model_params(m16), al_model_params(untied),
                 sizeof(float) * al_model_num_params(m16)) == 0);
    char missing[400];
    snprintf(missing, sizeof missing, "%s/nope", tmpdir);
    CHECK(al_model_load_safetensors(m16, missing, err, sizeof err) == -1);
    CHECK(strstr(err, "nope") != NULL);
    CHECK(al_model_load_dir(tmpdir, err, sizeof err) == NULL); /* no config.json there */
    CHECKF(strstr(err, "config.json"), "%s", err);
    al_model_free(m16), al_model_free(m24), al_model_free(untied), al_model_free(llama);
}

TEST(sharded_checkpoints_load_through_their_index)
{
    make_tmpdir();
    char dir[400], err[512], path[500];
    snprintf(dir, sizeof dir, "%s/sharded", tmpdir);
    al_model *a = small_model(AL_MODEL_ARCH_QWEN2, 0, 16, 7);
    REQUIRE(al_model_save_dir(a, dir, AL_ST_DTYPE_F32, err, sizeof err) == 0);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    al_st_file f;
    REQUIRE(al_st_open(&f, path, err, sizeof err) == 0);
    /* split the tensors over two shards, each written by hand */
    char idx[8192] = "{\"metadata\":{},\"weight_map\":{";
    for (int shard = 0; shard < 2; shard++) {
        char header[8192] = "{";
        size_t off = 0, dlen = 0;
        for (size_t i = shard; i < f.ntensors; i += 2)
            dlen += f.tensors[i].nbytes;
        uint8_t *data = malloc(dlen);
        for (size_t i = shard; i < f.ntensors; i += 2) {
            const al_st_tensor *t = &f.tensors[i];
            char e[400];
            if (t->ndim == 2)
                snprintf(
                    e, sizeof e,
                    "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[%lld,%lld],\"data_offsets\":[%zu,%zu]}",
                    off ? "," : "", t->name, (long long)t->shape[0], (long long)t->shape[1], off,
                    off + t->nbytes);
            else
                snprintf(e, sizeof e,
                         "%s\"%s\":{\"dtype\":\"F32\",\"shape\":[%lld],\"data_offsets\":[%zu,%zu]}",
                         off ? "," : "", t->name, (long long)t->shape[0], off, off + t->nbytes);
            strcat(header, e);
            memcpy(data + off, t->data, t->nbytes);
            off += t->nbytes;
            snprintf(e, sizeof e, "%s\"%s\":\"model-%05d-of-00002.safetensors\"",
                     strlen(idx) > 30 ? "," : "", t->name, shard + 1);
            strcat(idx, e);
        }
        strcat(header, "}");
        size_t len;
        uint8_t *bytes = make_file(header, data, dlen, &len);
        snprintf(path, sizeof path, "%s/model-%05d-of-00002.safetensors", dir, shard + 1);
        REQUIRE(write_bytes(path, bytes, len) == 0);
        free(bytes), free(data);
    }
    strcat(idx, "}}");
    al_st_close(&f);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    unlink(path);
    snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
    REQUIRE(write_bytes(path, idx, strlen(idx)) == 0);
    al_model *b = al_model_load_dir(dir, err, sizeof err);
    REQUIREF(b, "%s", err);
    CHECK(memcmp(al_model_params(a), al_model_params(b), sizeof(float) * al_model_num_params(a)) ==
          0);
    al_model_free(b);
    /* an index pointing outside its directory is refused */
    const char *evil = "{\"weight_map\":{\"model.norm.weight\":\"../x.safetensors\"}}";
    REQUIRE(write_bytes(path, evil, strlen(evil)) == 0);
    CHECK(al_model_load_dir(dir, err, sizeof err) == NULL);
    CHECKF(strstr(err, "not a file name"), "%s", err);
    al_model_free(a);
}

TEST(zz_cleanup)
{
    if (tmpdir[0]) al_test_rmtree(tmpdir);
}
