/* 1210: every version the trainer publishes is a Hugging Face model directory. For a tiny
 * Qwen2 (q/k/v biases, tied embeddings) and a tiny Qwen3 (q/k norms, untied), `arclight train`
 * makes one update against the embedded broker; then:
 *   - the PolicyVersion names file://OUT/step-1/ and OUT/step-1 holds config.json,
 *     model.safetensors (sha256 as published) and the tokenizer of --model;
 *   - transformers 5 (torch 2, the machine's local index) loads that directory with
 *     AutoConfig, AutoTokenizer and AutoModelForCausalLM.from_pretrained (what vLLM and
 *     SGLang do) and its tokenizer gives the same ids as `arclight serve`'s /tokenize;
 *   - its logprobs of the tokens `arclight serve --model OUT/step-1` generated equal the
 *     logprobs serve returned for them (1e-4).
 * The Python is $ARCLIGHT_PYTHON, ~/.cache/arclight/venv, or a venv made under the build
 * directory by tests/train/hf_venv.sh (local index only); when none can be had the test exits
 * 77, which ctest reports as skipped, with the reason. */
#include "testlib.h"

#include "broker_fixture.h"
#include "t1199_serve_helpers.h"
#include "t1249_train_fixtures.h"

#include "avro/codec.h"
#include "core/sha256.h"
#include "core/util.h"

#include <librdkafka/rdkafka.h>
#include <math.h>

static char g_work[256], g_python[600];
static al_test_broker g_broker;
static int g_ready;

/* 1 when py imports torch 2.x and transformers 5.x. */
static int python_ok(const char *py)
{
    if (access(py, X_OK) != 0) return 0;
    return sv_sh("%s -c 'import torch, transformers, sys; sys.exit(0 if "
                 "torch.__version__.startswith(\"2.\") and transformers.__version__.startswith(\"5.\") "
                 "else 1)' 2>/dev/null",
                 py) == 0;
}

/* Finds (or makes) the Python; exits 77 (skipped) with the reason when there is none. */
static void find_python(void)
{
    const char *env = getenv("ARCLIGHT_PYTHON"), *home = getenv("HOME");
    const char *build = getenv("ARCLIGHT_BUILD_DIR");
    char cand[3][600] = {{0}};
    snprintf(cand[0], sizeof cand[0], "%s", env ? env : "");
    snprintf(cand[1], sizeof cand[1], "%s/.cache/arclight/venv/bin/python3", home ? home : "/");
    snprintf(cand[2], sizeof cand[2], "%s/hf-venv/bin/python3", build ? build : "build");
    for (int i = 0; i < 3; i++)
        if (cand[i][0] && python_ok(cand[i])) {
            memcpy(g_python, cand[i], sizeof g_python); /* the same size */
            return;
        }
    printf("  no Python with torch 2 and transformers 5: making %s/hf-venv (a few minutes once)\n",
           build ? build : "build");
    fflush(stdout);
    if (sv_sh("tests/train/hf_venv.sh %s/hf-venv", build ? build : "build") == 0 &&
        python_ok(cand[2])) {
        snprintf(g_python, sizeof g_python, "%s", cand[2]);
        return;
    }
    printf("SKIPPED: no Python with torch 2.x and transformers 5.x (set ARCLIGHT_PYTHON, or see "
           "tests/train/hf_venv.sh's message above)\n");
    exit(77);
}

static void cleanup(void)
{
    if (g_work[0] && !getenv("T1210_KEEP")) al_test_rmtree(g_work);
}

static void setup(void)
{
    if (g_ready) return;
    find_python();
    REQUIRE(al_test_tmpdir(g_work, sizeof g_work, "t1210"));
    atexit(cleanup);
    char topics[300];
    snprintf(topics, sizeof topics, "%s/topics.conf", g_work);
    FILE *f = fopen(topics, "w");
    REQUIRE(f);
    fputs("arclight.deadletter 1 1\nhf.batches 1 1\nhf.policy 1 1\n", f);
    fclose(f);
    const char *extra[] = {"--topics", topics, NULL};
    REQUIRE(al_test_broker_start(&g_broker, extra) == 0);
    g_ready = 1;
}

/* The one PolicyVersion of `model` on hf.policy (waits up to 30 s); 0 or -1. Fills uri, sha. */
static int read_version(const char *model, char *uri, size_t urilen, char sha[65])
{
    char err[512];
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    rd_kafka_conf_set(c, "bootstrap.servers", g_broker.bootstrap, err, sizeof err);
    rd_kafka_conf_set(c, "group.id", "t1210-reader", err, sizeof err);
    rd_kafka_t *rk = rd_kafka_new(RD_KAFKA_CONSUMER, c, err, sizeof err);
    if (!rk) return -1;
    rd_kafka_poll_set_consumer(rk);
    rd_kafka_topic_partition_list_t *l = rd_kafka_topic_partition_list_new(1);
    rd_kafka_topic_partition_list_add(l, "hf.policy", 0)->offset = RD_KAFKA_OFFSET_BEGINNING;
    rd_kafka_assign(rk, l);
    rd_kafka_topic_partition_list_destroy(l);
    int found = -1;
    double t0 = testlib_now();
    while (found != 0 && testlib_now() - t0 < 30) {
        rd_kafka_message_t *m = rd_kafka_consumer_poll(rk, 200);
        if (!m) continue;
        al_policy_version pv = {0};
        if (!m->err && al_policy_version_decode(m->payload, m->len, &pv, err, sizeof err) == 0) {
            if (!strcmp(pv.model, model)) {
                snprintf(uri, urilen, "%s", pv.checkpoint_uri);
                snprintf(sha, 65, "%s", pv.sha256);
                found = 0;
            }
            al_policy_version_clear(&pv);
        }
        rd_kafka_message_destroy(m);
    }
    rd_kafka_destroy(rk);
    return found;
}

/* One update of `name` (a tiny model of config `config`) by `arclight train`; OUT/step-1. */
static void train_one(const char *name, const char *config, char *out, size_t outlen)
{
    char model[400];
    snprintf(model, sizeof model, "%s/%s", g_work, name);
    REQUIRE(sv_sh("%s model init --config tests/model/%s --out %s --seed 5 >/dev/null && cp "
                  "tests/tokenizer/tiny/tokenizer.json tests/tokenizer/tiny/tokenizer_config.json %s/",
                  sv_bin(), config, model, model) == 0);
    rd_kafka_conf_t *c = rd_kafka_conf_new();
    char err[256];
    rd_kafka_conf_set(c, "bootstrap.servers", g_broker.bootstrap, err, sizeof err);
    rd_kafka_t *p = rd_kafka_new(RD_KAFKA_PRODUCER, c, err, sizeof err);
    REQUIRE(p);
    for (int idx = 0; idx < 2; idx++) {
        al_buf b = {0};
        REQUIRE(fx_encode_chunk(&b, name, 0, idx, 2, 2, 3, -1, 0) == 0);
        rd_kafka_producev(p, RD_KAFKA_V_TOPIC("hf.batches"), RD_KAFKA_V_PARTITION(0),
                          RD_KAFKA_V_KEY(name, strlen(name)), RD_KAFKA_V_VALUE(b.data, b.len),
                          RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_END);
        al_buf_free(&b);
    }
    rd_kafka_flush(p, 10000);
    rd_kafka_destroy(p);
    snprintf(out, outlen, "%s/%s-out", g_work, name);
    char group[64];
    snprintf(group, sizeof group, "t1210-%s", name);
    const char *argv[] = {al_test_bin(), "train", "--bootstrap", g_broker.bootstrap, "--model",
                          model, "--out", out, "--input-topic", "hf.batches", "--policy-topic",
                          "hf.policy", "--group", group, "--loss", "sft", "--lr", "0.05",
                          "--steps", "1", "--log-level", "warn", NULL};
    int st = al_test_wait(al_test_spawn(argv, NULL, 1), 120);
    REQUIREF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "arclight train exited %d", st);
}

static void check_family(const char *name, const char *config, const char *arch)
{
    setup();
    char out[400], dir[460], uri[600], sha[65], path[600], err[256];
    train_one(name, config, out, sizeof out);
    snprintf(dir, sizeof dir, "%s/step-1", out);

    /* the PolicyVersion names the directory; its weights are what it says */
    REQUIRE(read_version(name, uri, sizeof uri, sha) == 0);
    char want[600];
    snprintf(want, sizeof want, "file://%s/", dir);
    CHECK_EQ_STR(uri, want);
    const char *files[] = {"config.json", "model.safetensors", "tokenizer.json",
                           "tokenizer_config.json"};
    for (size_t i = 0; i < 4; i++) {
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        CHECKF(stat(path, &sb) == 0 && sb.st_size > 0, "%s is missing", path);
    }
    char hex[65];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    CHECK(al_sha256_file(path, hex, err, sizeof err) == 0 && !strcmp(hex, sha));

    /* serve on the same directory: generated ids, their logprobs, a tokenization */
    sv_server s;
    const char *args[] = {"--model", dir, "--served-model-name", name, NULL};
    REQUIRE(sv_start(&s, args) == 0);
    long code = 0;
    json_t *j = sv_post_json(s.url, "/v1/completions",
                             "{\"prompt\":[11,22,33,44,55],\"max_tokens\":12,\"logprobs\":0,"
                             "\"return_token_ids\":true,\"ignore_eos\":true,\"seed\":7}",
                             &code);
    json_t *tj = sv_post_json(s.url, "/tokenize", "{\"prompt\":\"hello world, 42 times\"}", NULL);
    sv_stop(&s);
    REQUIREF(j && code == 200, "serve answered %ld", code);
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    json_t *gen = json_object_get(c0, "token_ids");
    json_t *lps = json_object_get(json_object_get(c0, "logprobs"), "token_logprobs");
    REQUIRE(json_array_size(gen) == 12 && json_array_size(lps) == 12);
    char genlist[256] = "";
    for (size_t i = 0; i < 12; i++)
        snprintf(genlist + strlen(genlist), sizeof genlist - strlen(genlist), "%s%lld",
                 i ? "," : "", (long long)json_integer_value(json_array_get(gen, i)));

    /* transformers on the directory */
    char res[600];
    snprintf(res, sizeof res, "%s/%s-hf.json", g_work, name);
    int rc = sv_sh("%s tests/train/hf_logprobs.py %s --prompt 11,22,33,44,55 --gen %s "
                   "--text 'hello world, 42 times' > %s 2>%s.err",
                   g_python, dir, genlist, res, res);
    if (rc != 0) {
        char *e = al_test_slurp_text(strcat(strcpy(path, res), ".err"));
        CHECKF(0, "hf_logprobs.py failed (%d): %s", rc, e);
        free(e);
    }
    char *text = al_test_slurp_text(res);
    json_t *h = json_loads(text, 0, NULL);
    free(text);
    REQUIRE(h);
    printf("  %s: transformers %s, torch %s, %s %s\n", name,
           json_string_value(json_object_get(h, "transformers")),
           json_string_value(json_object_get(h, "torch")),
           json_string_value(json_object_get(h, "architecture")),
           json_string_value(json_object_get(h, "dtype")));
    CHECK_EQ_STR(json_string_value(json_object_get(h, "architecture")), arch);
    json_t *hl = json_object_get(h, "logprobs");
    REQUIRE(json_array_size(hl) == 12);
    double maxd = 0;
    for (size_t i = 0; i < 12; i++) {
        double a = json_real_value(json_array_get(lps, i)), b = json_real_value(json_array_get(hl, i));
        if (fabs(a - b) > maxd) maxd = fabs(a - b);
    }
    printf("  %s: largest |serve - transformers| logprob difference %.3g\n", name, maxd);
    CHECKF(maxd < 1e-4, "%s: serve and transformers differ by %g", name, maxd);
    CHECKF(json_equal(json_object_get(h, "text_ids"), json_object_get(tj, "tokens")),
           "the tokenizer files give other ids than serve's /tokenize");
    json_decref(h);
    json_decref(j);
    json_decref(tj);
}

TEST(qwen2_version_dir_loads_in_transformers) { check_family("hfq2", "tiny-qwen2.json", "Qwen2ForCausalLM"); }
TEST(qwen3_version_dir_loads_in_transformers) { check_family("hfq3", "tiny-qwen3.json", "Qwen3ForCausalLM"); }
