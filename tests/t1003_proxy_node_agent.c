/*
 * t1003_proxy_node_agent: the official `openai` npm client as the agent
 * (tests/agents/openai_agent.js), unchanged but for OPENAI_BASE_URL, through the proxy to
 * the vLLM-like upstream: chat, streaming and tool calls work, and each call is a span.
 */
#define _GNU_SOURCE
#include "testlib.h"
#include "broker_fixture.h"
#include "t1099_proxy_helpers.h"

#include <jansson.h>

TEST(openai_npm_agent_through_proxy)
{
    curl_global_init(CURL_GLOBAL_DEFAULT);
    al_test_broker b;
    REQUIRE(al_test_broker_start(&b, NULL) == 0);
    fake_upstream *u = fake_upstream_start(0, 1);
    REQUIRE(u);
    char tmp[512], spool[700], log[700], up[128];
    al_test_tmpdir(tmp, sizeof tmp, "proxy");
    snprintf(spool, sizeof spool, "%s/spool", tmp);
    snprintf(log, sizeof log, "%s/proxy.log", tmp);
    snprintf(up, sizeof up, "http://127.0.0.1:%d", fake_upstream_port(u));
    const char *args[] = {"--listen",  "127.0.0.1:0", "--upstream", up,  "--bootstrap",
                          b.bootstrap, "--spool-dir", spool,        NULL};
    px_child p;
    REQUIRE(px_start(&p, log, args, NULL) == 0);

    const char *src = getenv("ARCLIGHT_SOURCE_DIR");
    char cmd[2048];
    snprintf(cmd, sizeof cmd,
             "OPENAI_BASE_URL='%s/r/task-n/roll-node/v1' OPENAI_API_KEY=sk-agent-local "
             "node '%s/tests/agents/openai_agent.js'",
             p.base, src && *src ? src : ".");
    FILE *f = popen(cmd, "r");
    REQUIRE(f);
    char line[8192] = "";
    char *got = fgets(line, sizeof line, f);
    int st = pclose(f);
    CHECKF(got && st == 0, "agent exit status %d, output: %s", st, line);
    json_t *o = json_loads(line, 0, NULL);
    CHECKF(o != NULL, "agent printed no JSON: %s", line);
    CHECK_EQ_STR(json_string_value(json_object_get(o, "chat")), "The answer is 4.");
    CHECK_EQ_INT(json_integer_value(json_object_get(o, "usage")), 4);
    /* the agent sees vLLM's fields without the ones the proxy asked for filled in */
    char *keys = json_dumps(json_object_get(o, "chat_keys"), JSON_COMPACT);
    CHECK_EQ_STR(
        keys ? keys : "",
        "[\"finish_reason\",\"index\",\"logprobs\",\"message\",\"stop_reason\",\"token_ids\"]");
    free(keys);
    CHECK_EQ_STR(json_string_value(json_object_get(o, "stream")), "The answer is 4.");
    CHECK_EQ_INT(json_integer_value(json_object_get(o, "stream_chunks")), 6);
    json_t *tool = json_object_get(o, "tool");
    CHECK_EQ_STR(json_string_value(json_object_get(tool, "name")), "get_weather");
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(tool, "args"), "city")),
                 "Paris");
    CHECK_EQ_STR(json_string_value(json_object_get(o, "final")), "The answer is 4.");
    json_t *stool = json_object_get(o, "stream_tool");
    CHECK_EQ_STR(json_string_value(json_object_get(stool, "name")), "get_weather");
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(stool, "args"), "city")),
                 "Paris");
    json_decref(o);

    /* five calls, five spans with tokens and logprobs, the stream flags right */
    al_test_msgs m;
    CHECK(al_test_topic_read(b.bootstrap, "arclight.spans", "roll-node", 5, 30000, &m) == 0);
    al_span s[8];
    size_t n = px_spans_of(&m, "roll-node", s, 8);
    CHECK_EQ_INT(n, 5);
    int streams = 0;
    for (size_t i = 0; i < n; i++) {
        CHECK_EQ_INT(s[i].sequence, (int64_t)i);
        CHECK_EQ_INT(s[i].llm_call.n_response_tokens, 4);
        CHECK_EQ_INT(s[i].llm_call.n_response_logprobs, 4);
        CHECK(s[i].llm_call.n_prompt_tokens > 0);
        streams += s[i].llm_call.stream;
    }
    CHECK_EQ_INT(streams, 2);
    if (n == 5) {
        CHECK(strstr(s[2].llm_call.response_json, "get_weather") != NULL);
        CHECK(strstr(s[3].llm_call.request_json, "\"tool_call_id\"") != NULL);
        CHECK(strstr(s[4].llm_call.response_json, "\"tool_calls\":[{") != NULL);
    }
    for (size_t i = 0; i < n; i++)
        al_span_clear(&s[i]);
    al_test_msgs_free(&m);
    CHECK(!px_file_contains(log, "sk-agent-local"));
    CHECK_EQ_INT(px_stop(&p, SIGTERM, 30), 0);
    fake_upstream_stop(u);
    al_test_broker_stop(&b);
    al_test_rmtree(tmp);
    curl_global_cleanup();
}
