/*
 * 1110: `arclight serve --weight-routes` answers SGLang's and vLLM's weight-update routes as
 * those servers do, field by field, errors included; a load is all-or-nothing and the served
 * logprobs of a fixed prompt become those of the new weights (checked against the CPU model on
 * the same directory).
 *
 * Fixtures written from the servers' source (read with the search tool):
 *   SGLang python/sglang/srt/entrypoints/http_server.py @ 0025436eab0556737d615b36a4dd3e1e26e82f3d
 *     (update_weights_from_disk: 200/400 {"success","message","num_paused_requests"}, the message
 *     " Weight version updated to V."; pause_generation / continue_generation {"message",
 *     "status": "ok"}; update_weight_version; RequestValidationError -> 400 {"object": "error",
 *     "message", "type": "Bad Request", "param": null, "code": 400})
 *   SGLang python/sglang/srt/managers/io_struct.py @ f11d231cea29f76f78aaa524783d6556267e3b58
 *     (UpdateWeightFromDiskReqInput: model_path required; load_format, weight_version optional
 *     strings; abort_all_requests, is_async, torch_empty_cache, keep_pause, recapture_cuda_graph,
 *     flush_cache booleans; token_step an integer)
 *   vLLM vllm/entrypoints/serve/dev/rlhf/api_router.py @ 6fbea1171830682c53ecb7d3ae67495fa799e62f
 *     and its later revision with /finish_weight_update {"weight_version"}, /update_weight_version
 *     {"new_version"}, /weight_info {"weight_version"} (/pause?mode= abort|wait|keep ->
 *     {"status": "paused"}, /resume {"status": "resumed"}, /is_paused, "Missing 'update_info'
 *     in request body", "Missing 'init_info' in request body")
 *   vLLM vllm/frontend/entrypoints/serve/dev/rpc/api_router.py @ 055e47c28003156421365af985d676fc921cb075
 *     (/collective_rpc: "Missing 'method' in request body", {"results": [...]})
 *   vLLM vllm/frontend/entrypoints/serve/exception_handling/handlers/http.py @ 055e47c2...
 *     (HTTPException -> {"error": {"message", "type": the status phrase, "param": null, "code"}})
 *   vLLM vllm/distributed/weight_transfer/disk_engine.py @ 3b98defb1248fa873096121529d457c0f5124905
 *     (update_info {"path": an absolute directory}; one checkpoint per session; a failed load
 *     ends the session; finish without a checkpoint is an error)
 */
#include "testlib.h"
#include "t1199_serve_helpers.h"

#include <math.h>

static char *g_dir;
static sv_server g_srv;
static char g_a[300], g_b[300], g_c[300], g_bad[300];
static const int32_t PROMPT[] = {11, 22, 33, 44};

static void setup(void)
{
    if (g_dir) return;
    g_dir = sv_tmpdir("t1110");
    REQUIRE(g_dir);
    REQUIRE(sv_make_model(g_dir, "a", 1) == 0);
    REQUIRE(sv_make_model(g_dir, "b", 2) == 0);
    REQUIRE(sv_make_model(g_dir, "c", 3) == 0);
    snprintf(g_a, sizeof g_a, "%s/a", g_dir);
    snprintf(g_b, sizeof g_b, "%s/b", g_dir);
    snprintf(g_c, sizeof g_c, "%s/c", g_dir);
    snprintf(g_bad, sizeof g_bad, "%s/q3", g_dir); /* another shape: Qwen3 */
    REQUIRE(sv_sh("%s model init --config tests/model/tiny-qwen3.json --out %s --seed 4 >/dev/null",
                  sv_bin(), g_bad) == 0);
    const char *args[] = {"--model", g_a, "--served-model-name", "tiny", "--weight-routes", NULL};
    REQUIRE(sv_start(&g_srv, args) == 0);
}

/* Generates from PROMPT; returns the policy version and checks the logprobs against the CPU
 * model of `dir` (and that they differ from those of `other`, when given). -1 when the
 * request fails (503 while paused: *code). */
static int64_t served_version(const char *dir, const char *other, long *code_out)
{
    long code = 0;
    json_t *j = sv_post_json(g_srv.url, "/v1/completions",
                             "{\"prompt\":[11,22,33,44],\"max_tokens\":8,\"logprobs\":0,"
                             "\"return_token_ids\":true,\"ignore_eos\":true,\"seed\":3}",
                             &code);
    if (code_out) *code_out = code;
    if (!j || code != 200) {
        json_decref(j);
        return -1;
    }
    int64_t v = json_integer_value(json_object_get(j, "policy_version"));
    json_t *c0 = json_array_get(json_object_get(j, "choices"), 0);
    int32_t *gen = NULL;
    int ng = sv_ids(json_object_get(c0, "token_ids"), &gen);
    json_t *lps = json_object_get(json_object_get(c0, "logprobs"), "token_logprobs");
    float want[16], not_want[16];
    CHECK(ng == 8 && sv_trainer_logprobs(dir, PROMPT, 4, gen, ng, want) == 0);
    int far_from_other = other != NULL;
    if (other) CHECK(sv_trainer_logprobs(other, PROMPT, 4, gen, ng, not_want) == 0);
    double maxd = 0, other_d = 0;
    for (int i = 0; i < ng && i < 16; i++) {
        double got = json_real_value(json_array_get(lps, (size_t)i));
        maxd = fmax(maxd, fabs(got - want[i]));
        if (other) other_d = fmax(other_d, fabs(got - not_want[i]));
    }
    CHECKF(maxd < 1e-4, "served logprobs differ from %s's by %g", dir, maxd);
    if (far_from_other) CHECKF(other_d > 1e-2, "served logprobs are still %s's", other);
    free(gen);
    json_decref(j);
    return v;
}

/* POSTs and checks the status; returns the JSON reply (caller decrefs). */
static json_t *post(const char *path, const char *body, long want)
{
    long code = 0;
    json_t *j = sv_post_json(g_srv.url, path, body, &code);
    CHECKF(code == want, "POST %s %s: %ld, want %ld", path, body ? body : "", code, want);
    CHECKF(j != NULL, "POST %s: no JSON", path);
    return j;
}

static const char *str(json_t *j, const char *k) { return json_string_value(json_object_get(j, k)); }

/* SGLang's validation error shape. */
static void check_sglang_400(json_t *j)
{
    CHECK_EQ_STR(str(j, "object"), "error");
    CHECK_EQ_STR(str(j, "type"), "Bad Request");
    CHECK(json_is_null(json_object_get(j, "param")));
    CHECK(json_integer_value(json_object_get(j, "code")) == 400);
    CHECK(str(j, "message") && *str(j, "message"));
}

/* vLLM's HTTPException shape, with the detail. */
static void check_vllm_error(json_t *j, int code, const char *detail)
{
    json_t *e = json_object_get(j, "error");
    CHECKF(json_is_object(e), "no error object");
    if (detail) CHECK_EQ_STR(str(e, "message"), detail);
    CHECK_EQ_STR(str(e, "type"), code == 400 ? "Bad Request" : "Internal Server Error");
    CHECK(json_is_null(json_object_get(e, "param")));
    CHECK(json_integer_value(json_object_get(e, "code")) == code);
}

static void check_version(const char *route, const char *want)
{
    json_t *j = sv_get_json(g_srv.url, route);
    CHECKF(j && str(j, "weight_version"), "GET %s: no weight_version", route);
    if (j && str(j, "weight_version")) CHECK_EQ_STR(str(j, "weight_version"), want);
    json_decref(j);
}

TEST(sglang_routes)
{
    setup();
    char body[800];
    check_version("/get_weight_version", "0");
    CHECK(served_version(g_a, NULL, NULL) == 0);
    json_t *j = post("/pause_generation", "", 200);
    CHECK_EQ_STR(str(j, "message"), "Generation paused successfully.");
    CHECK_EQ_STR(str(j, "status"), "ok");
    json_decref(j);
    long code = 0;
    CHECK(served_version(g_a, NULL, &code) == -1 && code == 503);
    snprintf(body, sizeof body,
             "{\"model_path\":\"%s\",\"load_format\":null,\"weight_version\":\"1\","
             "\"flush_cache\":true,\"abort_all_requests\":false,\"keep_pause\":true}", g_b);
    j = post("/update_weights_from_disk", body, 200);
    CHECK(json_is_true(json_object_get(j, "success")));
    CHECK_EQ_STR(str(j, "message"), "Succeeded to update model weights. Weight version updated to 1.");
    CHECK(json_integer_value(json_object_get(j, "num_paused_requests")) == 0);
    json_decref(j);
    CHECK(served_version(g_b, NULL, &code) == -1 && code == 503); /* keep_pause */
    j = post("/continue_generation", "", 200);
    CHECK_EQ_STR(str(j, "message"), "Generation continued successfully.");
    CHECK_EQ_STR(str(j, "status"), "ok");
    json_decref(j);
    CHECK(served_version(g_b, g_a, NULL) == 1);
    check_version("/get_weight_version", "1");
    check_version("/weight_version", "1");
    j = sv_get_json(g_srv.url, "/model_info");
    CHECK_EQ_STR(str(j, "model_path"), g_b);
    CHECK_EQ_STR(str(j, "weight_version"), "1");
    CHECK(json_is_true(json_object_get(j, "is_generation")));
    json_decref(j);

    /* bodies SGLang's parser refuses: its validation error */
    const char *bad[] = {"{\"model_path\":5}", "{\"weight_version\":\"2\"}", "[1,2]", "not json",
                         "{\"model_path\":\"/x\",\"flush_cache\":\"yes\"}",
                         "{\"model_path\":\"/x\",\"token_step\":\"one\"}"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        j = post("/update_weights_from_disk", bad[i], 400);
        check_sglang_400(j);
        json_decref(j);
    }
    /* loads that fail: 400 {"success": false}, the old weights keep serving */
    char bodies[5][800];
    snprintf(bodies[0], sizeof bodies[0], "{\"model_path\":\"%s\",\"weight_version\":\"2\"}", g_bad);
    snprintf(bodies[1], sizeof bodies[1], "{\"model_path\":\"relative/dir\",\"weight_version\":\"2\"}");
    snprintf(bodies[2], sizeof bodies[2], "{\"model_path\":\"%s/missing\"}", g_dir);
    snprintf(bodies[3], sizeof bodies[3], "{\"model_path\":\"%s\",\"load_format\":\"gguf\"}", g_c);
    /* a file far larger than the served weights is refused before it is read (sparse here) */
    REQUIRE(sv_sh("truncate -s 2G %s/big.safetensors", g_dir) == 0);
    snprintf(bodies[4], sizeof bodies[4], "{\"model_path\":\"%s/big.safetensors\"}", g_dir);
    for (int i = 0; i < 5; i++) {
        j = post("/update_weights_from_disk", bodies[i], 400);
        CHECK(json_is_false(json_object_get(j, "success")));
        CHECKF(strncmp(str(j, "message") ? str(j, "message") : "", "Failed to update weights", 24) == 0,
               "message %s", str(j, "message"));
        CHECK(json_integer_value(json_object_get(j, "num_paused_requests")) == 0);
        json_decref(j);
    }
    check_version("/get_weight_version", "1");
    CHECK(served_version(g_b, NULL, NULL) == 1);
    j = post("/update_weight_version", "{\"new_version\":\"1-tagged\"}", 200);
    CHECK(json_is_true(json_object_get(j, "success")));
    CHECK_EQ_STR(str(j, "new_version"), "1-tagged");
    CHECK_EQ_STR(str(j, "message"), "Weight version updated to 1-tagged");
    json_decref(j);
    j = post("/update_weight_version", "{}", 400);
    check_sglang_400(j);
    json_decref(j);
    json_decref(post("/update_weight_version", "{\"new_version\":\"1\"}", 200));
    sv_resp r;
    sv_http(g_srv.url, "/update_weights_from_disk", NULL, &r);
    CHECK(r.code == 405);
    sv_resp_free(&r);
}

TEST(vllm_routes)
{
    setup();
    char body[800];
    json_t *j = post("/pause?mode=bogus", "", 400);
    check_vllm_error(j, 400, NULL);
    json_decref(j);
    j = post("/pause?mode=keep", "", 200);
    CHECK_EQ_STR(str(j, "status"), "paused");
    json_decref(j);
    j = sv_get_json(g_srv.url, "/is_paused");
    CHECK(json_is_true(json_object_get(j, "is_paused")));
    json_decref(j);
    j = post("/init_weight_transfer_engine", "{}", 400);
    check_vllm_error(j, 400, "Missing 'init_info' in request body");
    json_decref(j);
    j = post("/init_weight_transfer_engine", "{\"init_info\":{}}", 200);
    CHECK_EQ_STR(str(j, "message"), "Weight transfer initialized");
    json_decref(j);

    snprintf(body, sizeof body, "{\"update_info\":{\"path\":\"%s\"}}", g_c);
    j = post("/update_weights", body, 400); /* no session yet */
    check_vllm_error(j, 400, "start_weight_update must be called before loading a checkpoint");
    json_decref(j);
    j = post("/start_weight_update", "", 200);
    CHECK_EQ_STR(str(j, "message"), "Weight update started");
    json_decref(j);
    j = post("/start_weight_update", "{}", 400);
    check_vllm_error(j, 400, NULL);
    json_decref(j);
    j = post("/update_weights", "{}", 400);
    check_vllm_error(j, 400, "Missing 'update_info' in request body");
    json_decref(j);
    j = post("/update_weights", "{\"update_info\":{\"path\":\"\"}}", 400);
    check_vllm_error(j, 400, "`path` must be a non-empty absolute local directory");
    json_decref(j);
    j = post("/update_weights", body, 200);
    CHECK_EQ_STR(str(j, "message"), "Weights updated");
    json_decref(j);
    check_version("/weight_info", "1"); /* staged, not yet served */
    j = post("/finish_weight_update", "{\"weight_version\":\"2\"}", 200);
    CHECK_EQ_STR(str(j, "message"), "Weight update finished");
    json_decref(j);
    check_version("/weight_info", "2");
    j = post("/resume", "", 200);
    CHECK_EQ_STR(str(j, "status"), "resumed");
    json_decref(j);
    j = sv_get_json(g_srv.url, "/is_paused");
    CHECK(json_is_false(json_object_get(j, "is_paused")));
    json_decref(j);
    CHECK(served_version(g_c, g_b, NULL) == 2);

    /* a failed load ends the session and leaves version 2 serving */
    j = post("/finish_weight_update", "", 400);
    check_vllm_error(j, 400, "No weight update is active");
    json_decref(j);
    json_decref(post("/start_weight_update", "", 200));
    snprintf(body, sizeof body, "{\"update_info\":{\"path\":\"%s\"}}", g_bad);
    j = post("/update_weights", body, 400);
    check_vllm_error(j, 400, NULL);
    json_decref(j);
    j = post("/finish_weight_update", "{\"weight_version\":\"3\"}", 400);
    check_vllm_error(j, 400, "No weight update is active");
    json_decref(j);
    json_decref(post("/start_weight_update", "", 200));
    j = post("/finish_weight_update", "", 400);
    check_vllm_error(j, 400, "No checkpoint was loaded during the weight update session");
    json_decref(j);
    check_version("/weight_info", "2");
    CHECK(served_version(g_c, NULL, NULL) == 2);

    /* collective_rpc reload_weights */
    j = post("/collective_rpc", "{}", 400);
    check_vllm_error(j, 400, "Missing 'method' in request body");
    json_decref(j);
    j = post("/collective_rpc", "{\"method\":\"sleep\"}", 400);
    check_vllm_error(j, 400, NULL);
    json_decref(j);
    snprintf(body, sizeof body, "{\"method\":\"reload_weights\",\"kwargs\":{\"weights_path\":\"%s\"}}", g_b);
    j = post("/collective_rpc", body, 200);
    json_t *res = json_object_get(j, "results");
    CHECK(json_is_array(res) && json_array_size(res) == 1 && json_is_null(json_array_get(res, 0)));
    json_decref(j);
    check_version("/weight_info", "3");
    CHECK(served_version(g_b, g_c, NULL) == 3);
    j = post("/update_weight_version", "{\"new_version\":\"7\"}", 200);
    CHECK_EQ_STR(str(j, "new_version"), "7");
    json_decref(j);
    check_version("/weight_info", "7");
}

TEST(routes_off_without_the_flag)
{
    setup();
    sv_server s;
    const char *args[] = {"--model", g_a, NULL};
    REQUIRE(sv_start(&s, args) == 0);
    long code = 0;
    json_t *j = sv_post_json(s.url, "/update_weights_from_disk", "{\"model_path\":\"/x\"}", &code);
    CHECK(code == 404);
    json_decref(j);
    sv_stop(&s);
    CHECK(sv_stop(&g_srv) == 0);
    al_test_rmtree(g_dir);
    free(g_dir);
}
