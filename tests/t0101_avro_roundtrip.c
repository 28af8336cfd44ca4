/*
 * t0101_avro_roundtrip: every schema round-trips with every field set; the bytes are
 * valid Avro according to avro-c (it reads them with the schema and writes back the same
 * bytes); decode structs are reusable; al_avro_to_json output parses with jansson.
 */
#include "avro/codec.h"
#include "t0199_avro_fixtures.h"
#include "testlib.h"

#include <avro.h>
#include <jansson.h>

static char err[512];

/* avro-c reads the body of msg with the registered schema `name` and writes it back:
 * identical bytes mean the message is well-formed Avro for that schema. */
static int avro_c_agrees(const char *name, const al_buf *msg)
{
    const al_schema_info *in = al_schema_by_name(name);
    avro_schema_t schema;
    if (!in || avro_schema_from_json_length(in->json, strlen(in->json), &schema)) {
        fprintf(stderr, "  avro-c cannot parse %s: %s\n", name, avro_strerror());
        return 0;
    }
    avro_value_iface_t *iface = avro_generic_class_from_schema(schema);
    avro_value_t v;
    avro_generic_value_new(iface, &v);
    const char *body = (const char *)msg->data + AL_AVRO_HEADER_LEN;
    int64_t body_len = (int64_t)(msg->len - AL_AVRO_HEADER_LEN);
    avro_reader_t rd = avro_reader_memory(body, body_len);
    int ok = avro_value_read(rd, &v) == 0;
    size_t size = 0;
    ok = ok && avro_value_sizeof(&v, &size) == 0 && (int64_t)size == body_len;
    char *again = malloc(size ? size : 1);
    if (ok) {
        avro_writer_t wr = avro_writer_memory(again, (int64_t)size);
        ok = avro_value_write(wr, &v) == 0 && memcmp(again, body, size) == 0;
        avro_writer_free(wr);
    }
    if (!ok) fprintf(stderr, "  avro-c disagrees on %s: %s\n", name, avro_strerror());
    free(again);
    avro_reader_free(rd);
    avro_value_decref(&v);
    avro_value_iface_decref(iface);
    avro_schema_decref(schema);
    return ok;
}

static json_t *to_json(const al_buf *b)
{
    char *text = NULL;
    if (al_avro_to_json(b->data, b->len, &text, err, sizeof err)) {
        fprintf(stderr, "  to_json: %s\n", err);
        return NULL;
    }
    json_error_t je;
    json_t *j = json_loads(text, JSON_ALLOW_NUL, &je); /* \u0000 is valid JSON; jansson wants a flag */
    if (!j) fprintf(stderr, "  to_json output does not parse: %s\n", je.text);
    free(text);
    return j;
}

TEST(span_llm_call_round_trips)
{
    fx_span f;
    fx_span_llm(&f, 200, 37, 1000);
    al_buf b = {0}, b2 = {0};
    REQUIREF(al_span_encode(&f.s, &b, err, sizeof err) == 0, "%s", err);
    CHECK((uint8_t)b.data[0] == 0xC3 && (uint8_t)b.data[1] == 0x01);
    uint64_t fp = 0;
    for (int i = 7; i >= 0; i--) fp = (fp << 8) | (uint8_t)b.data[2 + i];
    CHECK(fp == al_schema_by_name("Span")->fingerprint);

    al_span d = {0};
    REQUIREF(al_span_decode(b.data, b.len, &d, err, sizeof err) == 0, "%s", err);
    CHECK_EQ_STR(d.trace_id, f.s.trace_id);
    CHECK_EQ_STR(d.span_id, f.s.span_id);
    CHECK_EQ_STR(d.parent_span_id, f.s.parent_span_id);
    CHECK_EQ_STR(d.task_id, "task-42");
    CHECK_EQ_STR(d.rollout_id, "rollout-7");
    CHECK_EQ_INT(d.attempt, 2);
    CHECK_EQ_INT(d.sequence, 5);
    CHECK_EQ_INT(d.timestamp_us, f.s.timestamp_us);
    CHECK_EQ_INT(d.kind, AL_SPAN_KIND_LLM_CALL);
    const al_llm_call *c = &d.llm_call, *e = &f.s.llm_call;
    CHECK_EQ_STR(c->agent, e->agent);
    CHECK_EQ_STR(c->model, e->model);
    CHECK_EQ_STR(c->upstream, e->upstream);
    CHECK_EQ_INT(c->policy_version, 17);
    CHECK_EQ_STR(c->request_json, e->request_json);
    CHECK_EQ_STR(c->response_json, e->response_json);
    CHECK_EQ_INT(c->stream, 1);
    REQUIRE(c->n_prompt_tokens == 200 && c->n_response_tokens == 37 && c->n_response_logprobs == 37);
    CHECK(memcmp(c->prompt_token_ids, e->prompt_token_ids, 200 * 4) == 0);
    CHECK(memcmp(c->response_token_ids, e->response_token_ids, 37 * 4) == 0);
    CHECK(memcmp(c->response_logprobs, e->response_logprobs, 37 * 4) == 0);
    CHECK_EQ_STR(c->finish_reason, "stop");
    CHECK_EQ_INT(c->http_status, 200);
    CHECK_EQ_STR(c->error, e->error);
    CHECK_EQ_INT(c->start_us, e->start_us);
    CHECK_EQ_INT(c->first_byte_us, e->first_byte_us);
    CHECK_EQ_INT(c->first_token_us, e->first_token_us);
    CHECK_EQ_INT(c->end_us, e->end_us);
    CHECK_EQ_INT(c->usage.prompt_tokens, 200);
    CHECK_EQ_INT(c->usage.completion_tokens, 37);
    CHECK_EQ_INT(c->usage.total_tokens, 237);
    CHECK_EQ_INT(c->usage.cached_tokens, 64);
    /* what decode gives, encode writes back byte for byte */
    REQUIREF(al_span_encode(&d, &b2, err, sizeof err) == 0, "%s", err);
    CHECK(b2.len == b.len && memcmp(b.data, b2.data, b.len) == 0);
    CHECK(avro_c_agrees("Span", &b));

    json_t *j = to_json(&b);
    REQUIRE(j);
    json_t *p = json_object_get(j, "payload");
    CHECK_EQ_STR(json_string_value(json_object_get(p, "_type")), "LlmCall");
    json_t *ids = json_object_get(p, "prompt_token_ids");
    CHECK(json_is_array(ids) && json_array_size(ids) == 200);
    CHECK_EQ_INT(json_integer_value(json_array_get(ids, 3)), e->prompt_token_ids[3]);
    json_t *lp = json_object_get(p, "response_logprobs");
    CHECK(json_array_size(lp) == 37);
    CHECK_NEAR(json_real_value(json_array_get(lp, 5)), e->response_logprobs[5], 1e-7);
    CHECK_EQ_STR(json_string_value(json_object_get(p, "request_json")), e->request_json);
    CHECK_EQ_INT(json_integer_value(json_object_get(json_object_get(p, "usage"), "cached_tokens")), 64);
    CHECK_EQ_INT(json_integer_value(json_object_get(j, "sequence")), 5);
    json_decref(j);

    al_span_clear(&d);
    al_buf_free(&b);
    al_buf_free(&b2);
    fx_span_free(&f);
}

TEST(span_reward_and_end_round_trip_with_nulls)
{
    al_span s, d = {0};
    al_buf b = {0}, b2 = {0};
    fx_span_reward(&s);
    REQUIREF(al_span_encode(&s, &b, err, sizeof err) == 0, "%s", err);
    REQUIREF(al_span_decode(b.data, b.len, &d, err, sizeof err) == 0, "%s", err);
    CHECK_EQ_INT(d.kind, AL_SPAN_KIND_REWARD);
    CHECK(d.parent_span_id == NULL);
    CHECK_EQ_STR(d.reward.name, "final");
    CHECK_NEAR(d.reward.value, 0.75, 0);
    CHECK_EQ_INT(d.reward.after_sequence, 5);
    CHECK(avro_c_agrees("Span", &b));
    json_t *j = to_json(&b);
    REQUIRE(j);
    CHECK(json_is_null(json_object_get(j, "parent_span_id")));
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(j, "payload"), "_type")), "Reward");
    json_decref(j);

    /* the same struct decodes the next message: the earlier one's data is replaced */
    fx_span_end(&s);
    REQUIREF(al_span_encode(&s, &b, err, sizeof err) == 0, "%s", err);
    REQUIREF(al_span_decode(b.data, b.len, &d, err, sizeof err) == 0, "%s", err);
    CHECK_EQ_INT(d.kind, AL_SPAN_KIND_ROLLOUT_END);
    CHECK_EQ_STR(d.task_id, "");
    CHECK_EQ_INT(d.rollout_end.status, AL_ROLLOUT_STATUS_TIMEOUT);
    CHECK_EQ_INT(d.rollout_end.group_size, 8);
    CHECK_EQ_STR(d.rollout_end.reason, "agent exceeded 600 s");
    CHECK(d.reward.name == NULL);
    REQUIREF(al_span_encode(&d, &b2, err, sizeof err) == 0, "%s", err);
    CHECK(b2.len == b.len && memcmp(b.data, b2.data, b.len) == 0);
    CHECK(avro_c_agrees("Span", &b));
    j = to_json(&b);
    REQUIRE(j);
    CHECK_EQ_STR(json_string_value(json_object_get(json_object_get(j, "payload"), "status")), "timeout");
    json_decref(j);

    s.rollout_end.group_size = 0; /* null */
    s.rollout_end.reason = NULL;
    REQUIREF(al_span_encode(&s, &b, err, sizeof err) == 0, "%s", err);
    REQUIREF(al_span_decode(b.data, b.len, &d, err, sizeof err) == 0, "%s", err);
    CHECK_EQ_INT(d.rollout_end.group_size, 0);
    CHECK(d.rollout_end.reason == NULL);
    CHECK(avro_c_agrees("Span", &b));

    CHECK_EQ_STR(al_rollout_status_name(AL_ROLLOUT_STATUS_ABORTED), "aborted");
    CHECK_EQ_INT(al_rollout_status_parse("succeeded"), AL_ROLLOUT_STATUS_SUCCEEDED);
    CHECK_EQ_INT(al_rollout_status_parse("bogus"), -1);
    al_span_clear(&d);
    al_buf_free(&b);
    al_buf_free(&b2);
}

TEST(transition_round_trips)
{
    fx_transition f;
    fx_transition_fill(&f);
    al_buf b = {0}, b2 = {0};
    al_transition d = {0};
    REQUIREF(al_transition_encode(&f.t, &b, err, sizeof err) == 0, "%s", err);
    REQUIREF(al_transition_decode(b.data, b.len, &d, err, sizeof err) == 0, "%s", err);
    CHECK_EQ_STR(d.id, "rollout-7:0:2");
    CHECK_EQ_STR(d.group_key, "task-42");
    CHECK_EQ_STR(d.group_id, "task-42#3");
    CHECK_EQ_INT(d.group_size, 8);
    CHECK_EQ_STR(d.task_id, "task-42");
    CHECK_EQ_STR(d.rollout_id, "rollout-7");
    REQUIRE(d.n_call_indices == 3);
    CHECK(d.call_indices[0] == 2 && d.call_indices[2] == 4);
    REQUIRE(d.n_prompt_tokens == 12 && d.n_response_tokens == 9 && d.n_loss_mask == 9 &&
            d.n_rollout_logprobs == 9 && d.n_token_advantages == 9);
    CHECK(memcmp(d.prompt_token_ids, f.prompt, sizeof f.prompt) == 0);
    CHECK(memcmp(d.response_token_ids, f.resp, sizeof f.resp) == 0);
    CHECK(memcmp(d.loss_mask, f.mask, sizeof f.mask) == 0);
    CHECK(memcmp(d.rollout_logprobs, f.lp, sizeof f.lp) == 0);
    CHECK(memcmp(d.token_advantages, f.adv, sizeof f.adv) == 0);
    CHECK_NEAR(d.reward, 1.0, 0);
    CHECK_NEAR(d.return_value, 0.9801, 0);
    CHECK_NEAR(d.advantage, 0.5, 0);
    CHECK_EQ_STR(d.estimator, "grpo");
    CHECK_EQ_INT(d.policy_version, 16);
    CHECK_EQ_STR(d.model, "Qwen/Qwen3-0.6B");
    CHECK_EQ_INT(d.timestamp_us, f.t.timestamp_us);
    REQUIREF(al_transition_encode(&d, &b2, err, sizeof err) == 0, "%s", err);
    CHECK(b2.len == b.len && memcmp(b.data, b2.data, b.len) == 0);
    CHECK(avro_c_agrees("Transition", &b));
    json_t *j = to_json(&b);
    REQUIRE(j);
    CHECK(json_array_size(json_object_get(j, "loss_mask")) == 9);
    CHECK_EQ_INT(json_integer_value(json_array_get(json_object_get(j, "loss_mask"), 4)), 0);
    CHECK(json_array_size(json_object_get(j, "call_indices")) == 3);
    json_decref(j);

    char id[64];
    al_transition_id(id, sizeof id, "rollout-7", 0, 2);
    CHECK_EQ_STR(id, "rollout-7:0:2");

    /* optional per-token arrays may be empty; a wrong count is refused by the encoder */
    f.t.n_token_advantages = 0;
    f.t.n_loss_mask = 0;
    REQUIREF(al_transition_encode(&f.t, &b, err, sizeof err) == 0, "%s", err);
    REQUIREF(al_transition_decode(b.data, b.len, &d, err, sizeof err) == 0, "%s", err);
    CHECK(d.n_token_advantages == 0 && d.token_advantages == NULL && d.n_loss_mask == 0);
    f.t.n_rollout_logprobs = 4;
    CHECK(al_transition_encode(&f.t, &b, err, sizeof err) == -1);
    CHECK(strstr(err, "rollout_logprobs has 4 entries"));
    al_transition_clear(&d);
    al_buf_free(&b);
    al_buf_free(&b2);
}

TEST(batch_chunk_round_trips)
{
    fx_batch f;
    fx_batch_fill(&f);
    al_buf b = {0}, b2 = {0};
    al_batch_chunk d = {0};
    REQUIREF(al_batch_chunk_encode(&f.c, &b, err, sizeof err) == 0, "%s", err);
    REQUIREF(al_batch_chunk_decode(b.data, b.len, &d, err, sizeof err) == 0, "%s", err);
    CHECK_EQ_STR(d.model, "Qwen/Qwen3-0.6B");
    CHECK_EQ_INT(d.step, 12);
    CHECK_EQ_INT(d.policy_version, 12);
    CHECK_EQ_INT(d.chunk_index, 1);
    CHECK_EQ_INT(d.chunk_count, 3);
    CHECK_EQ_INT(d.step_micro_batches, 6);
    CHECK_EQ_INT(d.step_sequences, 15);
    CHECK_EQ_INT(d.step_tokens, 60);
    CHECK_EQ_INT(d.step_loss_tokens, 30);
    REQUIRE(d.n_micro_batches == 2);
    for (int m = 0; m < 2; m++) {
        const al_micro_batch *mb = &d.micro_batches[m];
        CHECK_EQ_INT(mb->index, 4 + m);
        REQUIRE(mb->n_tokens == 10 && mb->n_sequences == (size_t)(m ? 2 : 3));
        CHECK(memcmp(mb->token_ids, f.tok[m], 40) == 0);
        CHECK(memcmp(mb->loss_mask, f.mask[m], 10) == 0);
        CHECK(memcmp(mb->position_ids, f.pos[m], 40) == 0);
        CHECK(memcmp(mb->rollout_logprobs, f.lp[m], 40) == 0);
        CHECK(memcmp(mb->advantages, f.adv[m], 40) == 0);
        CHECK(memcmp(mb->cu_seqlens, f.cu[m], (mb->n_sequences + 1) * 4) == 0);
        for (size_t s = 0; s < mb->n_sequences; s++) {
            CHECK_EQ_STR(mb->transition_ids[s], f.ids[m][s]);
            CHECK_EQ_INT(mb->policy_versions[s], f.versions[m][s]);
            REQUIRE(mb->n_rewards == mb->n_sequences);
            CHECK_NEAR(mb->rewards[s], f.rewards[m][s], 0);
        }
    }
    CHECK_EQ_INT(d.micro_batches[0].position_ids[4], 0); /* restarts per sequence */
    REQUIREF(al_batch_chunk_encode(&d, &b2, err, sizeof err) == 0, "%s", err);
    CHECK(b2.len == b.len && memcmp(b.data, b2.data, b.len) == 0);
    CHECK(avro_c_agrees("BatchChunk", &b));
    json_t *j = to_json(&b);
    REQUIRE(j);
    json_t *mb0 = json_array_get(json_object_get(j, "micro_batches"), 0);
    CHECK(json_array_size(json_object_get(mb0, "cu_seqlens")) == 4);
    CHECK(json_array_size(json_object_get(mb0, "transition_ids")) == 3);
    json_decref(j);

    /* bad sequence boundaries are refused by the encoder */
    f.cu[0][2] = 2;
    CHECK(al_batch_chunk_encode(&f.c, &b, err, sizeof err) == -1);
    CHECK(strstr(err, "cu_seqlens decreases"));
    al_batch_chunk_clear(&d);
    al_buf_free(&b);
    al_buf_free(&b2);
}

TEST(policy_version_round_trips)
{
    al_policy_version p, d = {0};
    fx_policy_fill(&p);
    al_buf b = {0}, b2 = {0};
    REQUIREF(al_policy_version_encode(&p, &b, err, sizeof err) == 0, "%s", err);
    REQUIREF(al_policy_version_decode(b.data, b.len, &d, err, sizeof err) == 0, "%s", err);
    CHECK_EQ_STR(d.model, p.model);
    CHECK_EQ_INT(d.version, 13);
    CHECK_EQ_INT(d.step, 12);
    CHECK_EQ_STR(d.checkpoint_uri, p.checkpoint_uri);
    CHECK_EQ_STR(d.sha256, p.sha256);
    CHECK_EQ_INT(d.created_us, p.created_us);
    CHECK_NEAR(d.metrics.loss, -0.0123, 0);
    CHECK_NEAR(d.metrics.kl, 0.0031, 0);
    CHECK_NEAR(d.metrics.entropy, 1.25, 0);
    CHECK_NEAR(d.metrics.clip_fraction, 0.0625, 0);
    CHECK_NEAR(d.metrics.grad_norm, 0.875, 0);
    CHECK_NEAR(d.metrics.tokens_per_s, 12345.5, 0);
    REQUIRE(d.metrics.n_extra == 3);
    CHECK_EQ_STR(d.metrics.extra[1].name, "reward_mean");
    CHECK_NEAR(d.metrics.extra[1].value, 0.4375, 0);
    REQUIREF(al_policy_version_encode(&d, &b2, err, sizeof err) == 0, "%s", err);
    CHECK(b2.len == b.len && memcmp(b.data, b2.data, b.len) == 0);
    CHECK(avro_c_agrees("PolicyVersion", &b));
    json_t *j = to_json(&b);
    REQUIRE(j);
    CHECK_NEAR(json_real_value(json_object_get(json_object_get(json_object_get(j, "metrics"), "extra"), "lr")), 1e-6, 1e-18);
    json_decref(j);
    al_policy_version_clear(&d);
    al_buf_free(&b);
    al_buf_free(&b2);
}

TEST(deadletter_round_trips_with_binary_key_and_null_header)
{
    al_deadletter dl, d = {0};
    fx_deadletter_fill(&dl);
    al_buf b = {0}, b2 = {0};
    REQUIREF(al_deadletter_encode(&dl, &b, err, sizeof err) == 0, "%s", err);
    REQUIREF(al_deadletter_decode(b.data, b.len, &d, err, sizeof err) == 0, "%s", err);
    CHECK_EQ_STR(d.source_topic, "arclight.spans");
    CHECK_EQ_INT(d.partition, 3);
    CHECK_EQ_INT(d.offset, 123456789012LL);
    REQUIRE(d.key && d.key_len == dl.key_len && d.value && d.value_len == dl.value_len);
    CHECK(memcmp(d.key, dl.key, d.key_len) == 0);
    CHECK(memcmp(d.value, dl.value, d.value_len) == 0);
    REQUIRE(d.n_headers == 3);
    CHECK_EQ_STR(d.headers[0].key, "traceparent");
    CHECK(d.headers[0].value_len == 2 && memcmp(d.headers[0].value, "v1", 2) == 0);
    CHECK(d.headers[1].value != NULL && d.headers[1].value_len == 0);
    CHECK(d.headers[2].value == NULL);
    CHECK_EQ_STR(d.reason, dl.reason);
    CHECK_EQ_STR(d.stage, "credit");
    CHECK_EQ_INT(d.source_timestamp_us, dl.source_timestamp_us);
    CHECK_EQ_INT(d.timestamp_us, dl.timestamp_us);
    REQUIREF(al_deadletter_encode(&d, &b2, err, sizeof err) == 0, "%s", err);
    CHECK(b2.len == b.len && memcmp(b.data, b2.data, b.len) == 0);
    CHECK(avro_c_agrees("DeadLetter", &b));
    json_t *j = to_json(&b);
    REQUIRE(j);
    /* bytes use Avro's JSON encoding: one code point per byte */
    const char *k = json_string_value(json_object_get(j, "key"));
    REQUIRE(k);
    CHECK(json_string_length(json_object_get(j, "key")) == 7 && memcmp(k, "task\0\xc3\xbf", 7) == 0);
    json_decref(j);

    /* no key, tombstone, no headers */
    dl.key = NULL;
    dl.value = NULL;
    dl.n_headers = 0;
    REQUIREF(al_deadletter_encode(&dl, &b, err, sizeof err) == 0, "%s", err);
    REQUIREF(al_deadletter_decode(b.data, b.len, &d, err, sizeof err) == 0, "%s", err);
    CHECK(d.key == NULL && d.value == NULL && d.n_headers == 0);
    CHECK(avro_c_agrees("DeadLetter", &b));
    al_deadletter_clear(&d);
    al_buf_free(&b);
    al_buf_free(&b2);
}

TEST(peek_names_the_schema_of_any_message)
{
    al_policy_version p;
    fx_policy_fill(&p);
    al_buf b = {0};
    REQUIRE(al_policy_version_encode(&p, &b, err, sizeof err) == 0);
    const al_schema_info *in = al_avro_peek(b.data, b.len, err, sizeof err);
    REQUIRE(in);
    CHECK_EQ_STR(in->name, "ai.arclight.PolicyVersion");
    /* a typed decoder refuses another schema's message by name */
    al_span s = {0};
    CHECK(al_span_decode(b.data, b.len, &s, err, sizeof err) == -1);
    CHECK(strstr(err, "wrong schema: the message is a ai.arclight.PolicyVersion, expected a ai.arclight.Span"));
    al_span_clear(&s);
    al_buf_free(&b);
}

#include <pthread.h>

/* Codecs are re-entrant: threads encode and decode at once (a consumer with several
 * handler threads), each with its own structs and buffers. */
static void *codec_thread(void *arg)
{
    long *failures = arg;
    char e[256];
    fx_transition f;
    fx_transition_fill(&f);
    al_transition d = {0};
    al_buf b = {0};
    for (int i = 0; i < 300; i++) {
        f.t.policy_version = i;
        if (al_transition_encode(&f.t, &b, e, sizeof e) ||
            al_transition_decode(b.data, b.len, &d, e, sizeof e) || d.policy_version != i)
            (*failures)++;
    }
    al_transition_clear(&d);
    al_buf_free(&b);
    return NULL;
}

TEST(codecs_run_in_several_threads_at_once)
{
    pthread_t th[4];
    long failures[4] = {0};
    for (int i = 0; i < 4; i++) pthread_create(&th[i], NULL, codec_thread, &failures[i]);
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ_INT(failures[i], 0);
    }
}
