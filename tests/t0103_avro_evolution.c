/*
 * t0103_avro_evolution: readers and writers of different schema versions (the rules in
 * schemas/README.md). A "v2" Span adds a defaulted top-level field, a defaulted field at
 * the end of LlmCall and an enum symbol; the current (v1) typed decoder reads v2
 * messages, and al_avro_resolve turns v1 messages into v2 ones that avro-c reads with the
 * v2 schema, defaults filled in. Changes that break readers are refused with a reason.
 */
#include "avro/binary.h"
#include "avro/codec.h"
#include "t0199_avro_fixtures.h"
#include "testlib.h"

#include <avro.h>
#include <jansson.h>

static char err[512];

/* The current Span schema with the v2 additions. */
static char *span_v2_json(void)
{
    json_t *j = json_loads(al_schema_by_name("Span")->json, 0, NULL);
    json_t *fields = json_object_get(j, "fields");
    json_array_append_new(fields, json_pack("{s:s, s:s, s:s, s:s}", "name", "region", "type",
                                            "string", "default", "eu-west", "doc", "v2 field"));
    json_t *payload = NULL;
    for (size_t i = 0; i < json_array_size(fields); i++)
        if (!strcmp(json_string_value(json_object_get(json_array_get(fields, i), "name")),
                    "payload"))
            payload = json_object_get(json_array_get(fields, i), "type");
    json_t *llm = json_array_get(payload, 0);
    json_array_append_new(json_object_get(llm, "fields"),
                          json_pack("{s:s, s:s, s:f, s:s}", "name", "sampling_temperature", "type",
                                    "double", "default", 1.0, "doc", "v2 field"));
    json_t *end = json_array_get(payload, 2);
    json_t *status = json_object_get(json_array_get(json_object_get(end, "fields"), 0), "type");
    json_array_append_new(json_object_get(status, "symbols"), json_string("cancelled"));
    char *text = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    return text;
}

/* avro-c reads the body of msg with schema_json; returns the generic value (or a NULL
 * iface on failure). */
typedef struct c_read {
    avro_schema_t schema;
    avro_value_iface_t *iface;
    avro_value_t v;
    int ok;
} c_read;

static void c_read_msg(c_read *ar, const char *schema_json, const al_buf *msg)
{
    memset(ar, 0, sizeof *ar);
    if (avro_schema_from_json_length(schema_json, strlen(schema_json), &ar->schema)) {
        fprintf(stderr, "  avro-c: %s\n", avro_strerror());
        return;
    }
    ar->iface = avro_generic_class_from_schema(ar->schema);
    avro_generic_value_new(ar->iface, &ar->v);
    avro_reader_t rd = avro_reader_memory((const char *)msg->data + AL_AVRO_HEADER_LEN,
                                          (int64_t)(msg->len - AL_AVRO_HEADER_LEN));
    ar->ok = avro_value_read(rd, &ar->v) == 0;
    if (!ar->ok) fprintf(stderr, "  avro-c read: %s\n", avro_strerror());
    avro_reader_free(rd);
}

static void c_read_free(c_read *ar)
{
    if (ar->iface) {
        avro_value_decref(&ar->v);
        avro_value_iface_decref(ar->iface);
    }
    if (ar->schema) avro_schema_decref(ar->schema);
}

TEST(new_reader_resolves_an_old_writer_with_defaults)
{
    char *v2 = span_v2_json();
    REQUIREF(al_schema_register(v2, err, sizeof err) == 0, "%s", err);
    CHECK(al_schema_register(v2, err, sizeof err) == 0); /* again: no-op */
    uint64_t v2fp;
    REQUIRE(al_avro_fingerprint(v2, &v2fp, err, sizeof err) == 0);
    const al_schema_info *in = al_schema_by_fingerprint(v2fp);
    REQUIRE(in && !in->current);
    CHECK(v2fp != al_schema_by_name("Span")->fingerprint);

    fx_span f;
    fx_span_llm(&f, 30, 7, 200);
    al_buf v1msg = {0}, v2msg = {0};
    REQUIRE(al_span_encode(&f.s, &v1msg, err, sizeof err) == 0);
    REQUIREF(al_avro_resolve(v1msg.data, v1msg.len, v2, &v2msg, err, sizeof err) == 0, "%s", err);
    uint64_t fp = 0;
    for (int i = 7; i >= 0; i--) fp = (fp << 8) | (uint8_t)v2msg.data[2 + i];
    CHECK(fp == v2fp);

    c_read ar;
    c_read_msg(&ar, v2, &v2msg);
    REQUIRE(ar.ok);
    avro_value_t field, branch, temp;
    const char *str;
    size_t size;
    REQUIRE(avro_value_get_by_name(&ar.v, "region", &field, NULL) == 0);
    avro_value_get_string(&field, &str, &size);
    CHECK_EQ_STR(str, "eu-west");
    REQUIRE(avro_value_get_by_name(&ar.v, "rollout_id", &field, NULL) == 0);
    avro_value_get_string(&field, &str, &size);
    CHECK_EQ_STR(str, "rollout-7");
    REQUIRE(avro_value_get_by_name(&ar.v, "payload", &field, NULL) == 0);
    REQUIRE(avro_value_get_current_branch(&field, &branch) == 0);
    REQUIRE(avro_value_get_by_name(&branch, "sampling_temperature", &temp, NULL) == 0);
    double t = 0;
    avro_value_get_double(&temp, &t);
    CHECK_NEAR(t, 1.0, 0);
    c_read_free(&ar);

    al_buf_free(&v1msg);
    al_buf_free(&v2msg);
    fx_span_free(&f);
    free(v2);
}

TEST(old_reader_reads_a_newer_writer)
{
    char *v2 = span_v2_json();
    REQUIREF(al_schema_register(v2, err, sizeof err) == 0, "%s", err);
    fx_span f;
    fx_span_llm(&f, 30, 7, 200);
    al_buf v1msg = {0}, v2msg = {0};
    REQUIRE(al_span_encode(&f.s, &v1msg, err, sizeof err) == 0);
    REQUIRE(al_avro_resolve(v1msg.data, v1msg.len, v2, &v2msg, err, sizeof err) == 0);
    /* give the v2 fields (and eval) non-default values: the message ends with
     * sampling_temperature (double, last field of LlmCall), eval (boolean) and region
     * (string) */
    size_t tail = 8 + 1 + 1 + strlen("eu-west");
    REQUIRE(v2msg.len > tail);
    v2msg.len -= tail;
    al_wr_double(&v2msg, 0.75);
    al_wr_byte(&v2msg, 1);
    al_wr_string(&v2msg, "ap-south");

    c_read ar;
    c_read_msg(&ar, v2, &v2msg);
    CHECK(ar.ok); /* still a well-formed v2 message */
    c_read_free(&ar);

    al_span d = {0};
    REQUIREF(al_span_decode(v2msg.data, v2msg.len, &d, err, sizeof err) == 0, "%s", err);
    CHECK_EQ_STR(d.rollout_id, "rollout-7");
    CHECK_EQ_INT(d.sequence, 5);
    CHECK_EQ_INT(d.llm_call.n_prompt_tokens, 30);
    CHECK(memcmp(d.llm_call.prompt_token_ids, f.prompt, 30 * 4) == 0);
    CHECK_EQ_STR(d.llm_call.request_json, f.req);
    CHECK_EQ_INT(d.llm_call.usage.cached_tokens, 64);
    CHECK_EQ_INT(d.eval, 1);
    /* re-encoded by the v1 codec it is the v1 message again (once eval is back at its
     * value there) */
    d.eval = 0;
    al_buf again = {0};
    REQUIRE(al_span_encode(&d, &again, err, sizeof err) == 0);
    CHECK(again.len == v1msg.len && memcmp(again.data, v1msg.data, v1msg.len) == 0);

    /* a damaged message of the other version fails in resolution, naming the problem (and,
     * under ASan, leaks nothing) */
    CHECK(al_span_decode(v2msg.data, v2msg.len - 3, &d, err, sizeof err) == -1);
    CHECK(strstr(err, "truncated"));

    char *json = NULL;
    REQUIREF(al_avro_to_json(v2msg.data, v2msg.len, &json, err, sizeof err) == 0, "%s", err);
    CHECK(strstr(json, "\"region\":\"ap-south\""));
    CHECK(strstr(json, "\"sampling_temperature\":0.75"));
    free(json);

    /* a symbol the old reader does not know becomes the enum's default, "unknown" */
    al_buf endmsg = {0};
    uint64_t v2fp;
    REQUIRE(al_avro_fingerprint(v2, &v2fp, err, sizeof err) == 0);
    al_wr_header(&endmsg, v2fp);
    al_wr_string(&endmsg, "t");
    al_wr_string(&endmsg, "s");
    al_wr_long(&endmsg, 0);
    al_wr_string(&endmsg, "task");
    al_wr_string(&endmsg, "r");
    al_wr_long(&endmsg, 0);
    al_wr_long(&endmsg, 9);
    al_wr_long(&endmsg, 10);
    al_wr_long(&endmsg, 2); /* RolloutEnd */
    al_wr_long(&endmsg, 5); /* "cancelled", v2 only */
    al_wr_long(&endmsg, 0);
    al_wr_long(&endmsg, 0);
    al_wr_byte(&endmsg, 0); /* retried */
    al_wr_byte(&endmsg, 0); /* eval */
    al_wr_string(&endmsg, "eu-west");
    REQUIREF(al_span_decode(endmsg.data, endmsg.len, &d, err, sizeof err) == 0, "%s", err);
    CHECK_EQ_INT(d.kind, AL_SPAN_KIND_ROLLOUT_END);
    CHECK_EQ_INT(d.rollout_end.status, AL_ROLLOUT_STATUS_UNKNOWN);
    CHECK_EQ_INT(d.sequence, 9);

    al_span_clear(&d);
    al_buf_free(&again);
    al_buf_free(&endmsg);
    al_buf_free(&v1msg);
    al_buf_free(&v2msg);
    fx_span_free(&f);
    free(v2);
}

/* schemas/history/span.v1.avsc (Span before eval) is compiled in: a span written by a v1
 * proxy decodes with the current codec as a training span (eval false), and a current span
 * of an eval rollout keeps eval through a round trip. */
TEST(span_v1_reads_as_a_training_span)
{
    size_t n;
    const al_schema_info *const *list = al_schema_list(&n);
    const al_schema_info *v1 = NULL;
    for (size_t i = 0; i < n; i++)
        if (!list[i]->current && strcmp(list[i]->name, "ai.arclight.Span") == 0 &&
            !strstr(list[i]->json, "\"eval\""))
            v1 = list[i];
    REQUIREF(v1, "schemas/history/span.v1.avsc is not in the registry");
    fx_span f;
    fx_span_llm(&f, 12, 3, 40);
    f.s.eval = 1;
    al_buf cur = {0}, old = {0};
    REQUIRE(al_span_encode(&f.s, &cur, err, sizeof err) == 0);
    al_span d = {0};
    REQUIREF(al_span_decode(cur.data, cur.len, &d, err, sizeof err) == 0, "%s", err);
    CHECK_EQ_INT(d.eval, 1);
    REQUIREF(al_avro_resolve(cur.data, cur.len, v1->json, &old, err, sizeof err) == 0, "%s", err);
    CHECK(old.len == cur.len - 1);
    REQUIREF(al_span_decode(old.data, old.len, &d, err, sizeof err) == 0, "%s", err);
    CHECK_EQ_INT(d.eval, 0);
    CHECK_EQ_INT(d.llm_call.n_prompt_tokens, 12);
    CHECK_EQ_STR(d.llm_call.request_json, f.req);

    /* an end span of a retried attempt keeps retried; from a v1 writer it is false */
    al_span e;
    fx_span_end(&e);
    e.rollout_end.retried = 1;
    cur.len = 0;
    old.len = 0;
    REQUIRE(al_span_encode(&e, &cur, err, sizeof err) == 0);
    REQUIREF(al_span_decode(cur.data, cur.len, &d, err, sizeof err) == 0, "%s", err);
    CHECK_EQ_INT(d.rollout_end.retried, 1);
    CHECK_EQ_INT(d.eval, 0);
    REQUIREF(al_avro_resolve(cur.data, cur.len, v1->json, &old, err, sizeof err) == 0, "%s", err);
    CHECK(old.len == cur.len - 2);
    REQUIREF(al_span_decode(old.data, old.len, &d, err, sizeof err) == 0, "%s", err);
    CHECK_EQ_INT(d.rollout_end.retried, 0);
    CHECK_EQ_STR(d.rollout_end.reason, "agent exceeded 600 s");
    al_span_clear(&d);
    al_buf_free(&cur);
    al_buf_free(&old);
    fx_span_free(&f);
}

TEST(renamed_field_with_alias_resolves)
{
    json_t *j = json_loads(al_schema_by_name("DeadLetter")->json, 0, NULL);
    json_t *f0 = json_array_get(json_object_get(j, "fields"), 0);
    json_object_set_new(f0, "name", json_string("topic"));
    json_object_set_new(f0, "aliases", json_pack("[s]", "source_topic"));
    char *renamed = json_dumps(j, JSON_COMPACT);
    json_decref(j);

    al_deadletter dl;
    fx_deadletter_fill(&dl);
    al_buf msg = {0}, out = {0};
    REQUIRE(al_deadletter_encode(&dl, &msg, err, sizeof err) == 0);
    REQUIREF(al_avro_resolve(msg.data, msg.len, renamed, &out, err, sizeof err) == 0, "%s", err);
    c_read ar;
    c_read_msg(&ar, renamed, &out);
    REQUIRE(ar.ok);
    avro_value_t field;
    const char *str;
    size_t size;
    REQUIRE(avro_value_get_by_name(&ar.v, "topic", &field, NULL) == 0);
    avro_value_get_string(&field, &str, &size);
    CHECK_EQ_STR(str, "arclight.spans");
    c_read_free(&ar);
    al_buf_free(&msg);
    al_buf_free(&out);
    free(renamed);
}

TEST(breaking_changes_are_refused_with_a_reason)
{
    al_deadletter dl;
    fx_deadletter_fill(&dl);
    al_buf msg = {0}, out = {0};
    REQUIRE(al_deadletter_encode(&dl, &msg, err, sizeof err) == 0);

    /* a new field without a default */
    json_t *j = json_loads(al_schema_by_name("DeadLetter")->json, 0, NULL);
    json_array_append_new(json_object_get(j, "fields"), json_pack("{s:s,s:s}", "name", "extra", "type", "long"));
    char *s1 = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    CHECK(al_avro_resolve(msg.data, msg.len, s1, &out, err, sizeof err) == -1);
    CHECK(strstr(err, "reader field ai.arclight.DeadLetter.extra has no default and the writer lacks it"));

    /* a changed type */
    j = json_loads(al_schema_by_name("DeadLetter")->json, 0, NULL);
    json_object_set_new(json_array_get(json_object_get(j, "fields"), 1), "type", json_string("string"));
    char *s2 = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    CHECK(al_avro_resolve(msg.data, msg.len, s2, &out, err, sizeof err) == -1);
    CHECK(strstr(err, "field partition is a int in the writer and a string in the reader"));

    /* a promotion the rules allow: int -> long */
    j = json_loads(al_schema_by_name("DeadLetter")->json, 0, NULL);
    json_object_set_new(json_array_get(json_object_get(j, "fields"), 1), "type", json_string("long"));
    char *s3 = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    CHECKF(al_avro_resolve(msg.data, msg.len, s3, &out, err, sizeof err) == 0, "%s", err);

    /* a writer version of a schema arclight does not have cannot be registered */
    CHECK(al_schema_register("{\"type\":\"record\",\"name\":\"Other\",\"fields\":[]}", err, sizeof err) == -1);
    free(s1);
    free(s2);
    free(s3);
    al_buf_free(&msg);
    al_buf_free(&out);
}

/* schemas/history/batch_chunk.v1.avsc (BatchChunk before MicroBatch.rewards) is compiled in:
 * a message written by a v1 producer decodes with the current codec, rewards empty. */
TEST(history_versions_are_embedded_and_resolved)
{
    size_t n;
    const al_schema_info *const *list = al_schema_list(&n);
    const al_schema_info *v1 = NULL;
    for (size_t i = 0; i < n; i++)
        if (!list[i]->current && strcmp(list[i]->name, "ai.arclight.BatchChunk") == 0 &&
            !strstr(list[i]->json, "\"rewards\""))
            v1 = list[i];
    REQUIREF(v1, "schemas/history/batch_chunk.v1.avsc is not in the registry");
    CHECK(v1->fingerprint != al_schema_by_name("BatchChunk")->fingerprint);

    fx_batch f;
    fx_batch_fill(&f);
    al_buf cur = {0}, old = {0};
    REQUIRE(al_batch_chunk_encode(&f.c, &cur, err, sizeof err) == 0);
    /* what a v1 producer would have written: the same chunk without rewards */
    REQUIREF(al_avro_resolve(cur.data, cur.len, v1->json, &old, err, sizeof err) == 0, "%s", err);
    CHECK(old.len == cur.len - (1 + 12) - (1 + 8)); /* rewards of 3 and 2 sequences */
    c_read ar;
    c_read_msg(&ar, v1->json, &old);
    CHECK(ar.ok);
    c_read_free(&ar);

    al_batch_chunk d = {0};
    REQUIREF(al_batch_chunk_decode(old.data, old.len, &d, err, sizeof err) == 0, "%s", err);
    REQUIRE(d.n_micro_batches == 2);
    CHECK_EQ_INT(d.micro_batches[0].n_rewards, 0);
    CHECK_EQ_INT(d.micro_batches[1].n_sequences, 2);
    CHECK(memcmp(d.micro_batches[1].token_ids, f.tok[1], 40) == 0);
    CHECK_EQ_STR(d.micro_batches[0].transition_ids[2], "r3:1:0");
    al_batch_chunk_clear(&d);
    al_buf_free(&cur);
    al_buf_free(&old);
}
