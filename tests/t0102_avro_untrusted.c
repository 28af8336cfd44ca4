/*
 * t0102_avro_untrusted: decoders facing untrusted bytes. Crafted inputs (bad magic,
 * unknown fingerprint, negative and oversized lengths, bad union/enum/boolean values,
 * absurd array counts, overlong varints, trailing bytes, packed arrays of odd length),
 * truncation at every byte of a valid message of each schema, and random byte flips:
 * each must give an error that names the problem, never a crash (ASan/UBSan build).
 */
#define _GNU_SOURCE /* memmem */
#include "avro/binary.h"
#include "avro/codec.h"
#include "t0199_avro_fixtures.h"
#include "testlib.h"

static char err[512];

static uint64_t fp_of(const char *name) { return al_schema_by_name(name)->fingerprint; }

/* Decodes with the typed decoder the header names (or all of them) and al_avro_to_json;
 * returns how many succeeded. */
static int decode_all(const uint8_t *p, size_t n)
{
    int ok = 0;
    char *json = NULL;
    al_span s = {0};
    al_transition t = {0};
    al_batch_chunk c = {0};
    al_policy_version pv = {0};
    al_deadletter d = {0};
    ok += al_span_decode(p, n, &s, err, sizeof err) == 0;
    ok += al_transition_decode(p, n, &t, err, sizeof err) == 0;
    ok += al_batch_chunk_decode(p, n, &c, err, sizeof err) == 0;
    ok += al_policy_version_decode(p, n, &pv, err, sizeof err) == 0;
    ok += al_deadletter_decode(p, n, &d, err, sizeof err) == 0;
    if (al_avro_to_json(p, n, &json, err, sizeof err) == 0) ok++;
    free(json);
    al_span_clear(&s);
    al_transition_clear(&t);
    al_batch_chunk_clear(&c);
    al_policy_version_clear(&pv);
    al_deadletter_clear(&d);
    return ok;
}

/* One valid message of each schema (small, so that the every-byte loops stay quick). */
static size_t make_messages(al_buf *out, size_t max)
{
    size_t n = 0;
    fx_span f;
    fx_span_llm(&f, 24, 9, 160);
    al_span_encode(&f.s, &out[n++], err, sizeof err);
    fx_span_free(&f);
    al_span s;
    fx_span_reward(&s);
    al_span_encode(&s, &out[n++], err, sizeof err);
    fx_span_end(&s);
    al_span_encode(&s, &out[n++], err, sizeof err);
    fx_transition ft;
    fx_transition_fill(&ft);
    al_transition_encode(&ft.t, &out[n++], err, sizeof err);
    fx_batch fb;
    fx_batch_fill(&fb);
    al_batch_chunk_encode(&fb.c, &out[n++], err, sizeof err);
    al_policy_version p;
    fx_policy_fill(&p);
    al_policy_version_encode(&p, &out[n++], err, sizeof err);
    al_deadletter d;
    fx_deadletter_fill(&d);
    al_deadletter_encode(&d, &out[n++], err, sizeof err);
    (void)max;
    return n;
}

static int expect_error(int rc, const char *want)
{
    if (rc == 0) {
        fprintf(stderr, "  decoding succeeded, expected an error with \"%s\"\n", want);
        return 0;
    }
    if (!strstr(err, want)) {
        fprintf(stderr, "  error \"%s\" lacks \"%s\"\n", err, want);
        return 0;
    }
    return 1;
}

static int span_decode(const al_buf *b)
{
    al_span s = {0};
    int rc = al_span_decode(b->data, b->len, &s, err, sizeof err);
    al_span_clear(&s);
    return rc;
}

/* The span's identity fields as a writer would put them, up to the payload branch. */
static void span_prefix(al_buf *b)
{
    al_wr_header(b, fp_of("Span"));
    al_wr_string(b, "t");
    al_wr_string(b, "s");
    al_wr_long(b, 0); /* parent_span_id: null */
    al_wr_string(b, "task");
    al_wr_string(b, "r");
    al_wr_long(b, 0);
    al_wr_long(b, 1);
    al_wr_long(b, 2);
}

static void llm_call_head(al_buf *b)
{
    span_prefix(b);
    al_wr_long(b, 0); /* payload: LlmCall */
    al_wr_string(b, "agent");
    al_wr_string(b, "model");
    al_wr_string(b, "http://u");
    al_wr_long(b, 3);
    al_wr_string(b, "{}");
    al_wr_string(b, "{}");
    al_wr_byte(b, 0);
}

TEST(header_problems_are_named)
{
    uint8_t msg[16] = {0xC3, 0x01, 1, 2, 3, 4, 5, 6, 7, 8, 0};
    al_buf b = {.data = (char *)msg, .len = 11};
    CHECK(expect_error(span_decode(&b), "unknown schema fingerprint 0807060504030201"));
    msg[0] = 0x4F;
    CHECK(expect_error(span_decode(&b), "bad magic: 4f 01"));
    b.len = 5;
    CHECK(expect_error(span_decode(&b), "truncated: 5 bytes"));
    b.len = 0;
    CHECK(expect_error(span_decode(&b), "truncated: 0 bytes"));
    char *json = NULL;
    CHECK(expect_error(al_avro_to_json(msg, 11, &json, err, sizeof err), "bad magic"));
    CHECK(json == NULL);
}

TEST(negative_and_oversized_lengths_are_refused_before_use)
{
    al_buf b = {0};
    al_wr_header(&b, fp_of("Span"));
    al_wr_long(&b, -5);
    CHECK(expect_error(span_decode(&b), "bad length: field trace_id has negative length -5 at offset 10"));
    char *json = NULL;
    CHECK(expect_error(al_avro_to_json(b.data, b.len, &json, err, sizeof err), "negative length -5"));

    al_wr_header(&b, fp_of("Span"));
    al_wr_long(&b, 4000);
    al_buf_append(&b, "0123456789ab", 12);
    CHECK(expect_error(span_decode(&b), "truncated: field trace_id needs 4000 bytes, 12 left at offset 12"));
    CHECK(expect_error(al_avro_to_json(b.data, b.len, &json, err, sizeof err), "needs 4000 bytes"));

    /* a length as large as a varint can say */
    al_wr_header(&b, fp_of("Span"));
    al_wr_long(&b, INT64_MAX);
    CHECK(expect_error(span_decode(&b), "truncated: field trace_id needs 9223372036854775807 bytes"));
    al_wr_header(&b, fp_of("Span"));
    al_wr_long(&b, INT64_MIN);
    CHECK(expect_error(span_decode(&b), "negative length"));

    /* an overlong varint */
    al_wr_header(&b, fp_of("Span"));
    for (int i = 0; i < 11; i++) al_wr_byte(&b, 0xff);
    CHECK(expect_error(span_decode(&b), "longer than 10 bytes"));
    al_buf_free(&b);
}

TEST(bad_union_enum_and_boolean_values_are_refused)
{
    al_buf b = {0};
    span_prefix(&b);
    al_wr_long(&b, 7);
    CHECK(expect_error(span_decode(&b), "bad union index 7 for field payload"));
    span_prefix(&b);
    al_wr_long(&b, -1);
    CHECK(expect_error(span_decode(&b), "bad union index -1 for field payload"));

    span_prefix(&b);
    al_wr_long(&b, 2); /* RolloutEnd */
    al_wr_long(&b, 9); /* status */
    al_wr_long(&b, 0);
    al_wr_long(&b, 0);
    CHECK(expect_error(span_decode(&b), "bad enum index 9 for field status"));
    char *json = NULL;
    CHECK(expect_error(al_avro_to_json(b.data, b.len, &json, err, sizeof err), "bad enum index 9"));

    span_prefix(&b);
    al_wr_long(&b, 0);
    al_wr_string(&b, "agent");
    al_wr_string(&b, "model");
    al_wr_string(&b, "http://u");
    al_wr_long(&b, 3);
    al_wr_string(&b, "{}");
    al_wr_string(&b, "{}");
    al_wr_byte(&b, 2); /* stream */
    CHECK(expect_error(span_decode(&b), "bad boolean: field stream holds byte 2"));

    /* parent_span_id union branch out of range */
    al_wr_header(&b, fp_of("Span"));
    al_wr_string(&b, "t");
    al_wr_string(&b, "s");
    al_wr_long(&b, 2);
    CHECK(expect_error(span_decode(&b), "bad union index 2 for field parent_span_id"));
    al_buf_free(&b);
}

TEST(packed_arrays_of_odd_length_and_mismatched_counts_are_refused)
{
    al_buf b = {0};
    llm_call_head(&b);
    al_wr_bytes(&b, "\1\0\0\0\2", 5);
    CHECK(expect_error(span_decode(&b), "bad packed array: field prompt_token_ids has 5 bytes, not a multiple of 4"));
    char *json = NULL;
    CHECK(expect_error(al_avro_to_json(b.data, b.len, &json, err, sizeof err), "not a multiple of 4"));

    llm_call_head(&b);
    al_wr_bytes(&b, "", 0);
    al_wr_bytes(&b, "\1\0\0\0\2\0\0\0", 8);      /* 2 response tokens */
    al_wr_bytes(&b, "\0\0\0\0", 4);              /* 1 logprob */
    CHECK(expect_error(span_decode(&b), "response_logprobs has 1 entries for 2 response tokens"));
    al_buf_free(&b);
}

TEST(absurd_counts_ints_and_strings_are_refused)
{
    al_buf b = {0};
    al_deadletter dd = {0};
    al_wr_header(&b, fp_of("DeadLetter"));
    al_wr_string(&b, "arclight.spans");
    al_wr_long(&b, 1);
    al_wr_long(&b, 2);
    al_wr_long(&b, 0);
    al_wr_long(&b, 0);
    size_t at = b.len;
    al_wr_long(&b, (int64_t)1 << 40); /* headers */
    CHECK(expect_error(al_deadletter_decode(b.data, b.len, &dd, err, sizeof err),
                       "truncated: field headers claims 1099511627776 items"));
    char *json = NULL;
    CHECK(expect_error(al_avro_to_json(b.data, b.len, &json, err, sizeof err), "claims 1099511627776 items"));
    b.len = at;
    al_wr_long(&b, -3); /* a negative count with a byte size beyond the end */
    al_wr_long(&b, 1000);
    CHECK(expect_error(al_deadletter_decode(b.data, b.len, &dd, err, sizeof err),
                       "truncated: field headers needs 1000 bytes"));

    al_wr_header(&b, fp_of("DeadLetter"));
    al_wr_string(&b, "arclight.spans");
    al_wr_long(&b, (int64_t)1 << 40); /* partition is an int */
    CHECK(expect_error(al_deadletter_decode(b.data, b.len, &dd, err, sizeof err),
                       "bad int: field partition holds 1099511627776"));

    al_wr_header(&b, fp_of("DeadLetter"));
    al_wr_bytes(&b, "arc\0light", 9);
    CHECK(expect_error(al_deadletter_decode(b.data, b.len, &dd, err, sizeof err),
                       "field source_topic contains a NUL byte"));
    al_wr_header(&b, fp_of("DeadLetter"));
    al_wr_bytes(&b, "arc\xff", 4);
    al_wr_long(&b, 1);
    CHECK(expect_error(al_avro_to_json(b.data, b.len, &json, err, sizeof err), "not valid UTF-8"));
    al_deadletter_clear(&dd);
    al_buf_free(&b);
}

TEST(negative_block_counts_with_sizes_are_valid_avro)
{
    /* Avro lets a writer give a block as -count followed by its byte size */
    al_buf b = {0}, hdr = {0};
    al_wr_string(&hdr, "k");
    al_wr_long(&hdr, 1);
    al_wr_bytes(&hdr, "v", 1);
    al_wr_header(&b, fp_of("DeadLetter"));
    al_wr_string(&b, "arclight.spans");
    al_wr_long(&b, 1);
    al_wr_long(&b, 2);
    al_wr_long(&b, 0);
    al_wr_long(&b, 0);
    al_wr_long(&b, -1);
    al_wr_long(&b, (int64_t)hdr.len);
    al_buf_append(&b, hdr.data, hdr.len);
    al_wr_long(&b, 0);
    al_wr_string(&b, "why");
    al_wr_string(&b, "credit");
    al_wr_long(&b, -1);
    al_wr_long(&b, 5);
    al_deadletter d = {0};
    REQUIREF(al_deadletter_decode(b.data, b.len, &d, err, sizeof err) == 0, "%s", err);
    REQUIRE(d.n_headers == 1);
    CHECK_EQ_STR(d.headers[0].key, "k");
    CHECK(d.headers[0].value_len == 1 && d.headers[0].value[0] == 'v');
    char *json = NULL;
    CHECKF(al_avro_to_json(b.data, b.len, &json, err, sizeof err) == 0, "%s", err);
    free(json);
    al_deadletter_clear(&d);
    al_buf_free(&b);
    al_buf_free(&hdr);
}

TEST(trailing_bytes_and_bad_sequence_boundaries_are_refused)
{
    al_buf msgs[8] = {{0}};
    size_t n = make_messages(msgs, 8);
    for (size_t i = 0; i < n; i++) {
        REQUIRE(decode_all((const uint8_t *)msgs[i].data, msgs[i].len) == 2); /* its typed decoder + to_json */
        al_buf_append(&msgs[i], "\0", 1);
        CHECKF(decode_all((const uint8_t *)msgs[i].data, msgs[i].len) == 0, "message %zu with a trailing byte decoded", i);
        CHECKF(strstr(err, "trailing bytes: 1 bytes left"), "message %zu: %s", i, err);
    }
    for (size_t i = 0; i < n; i++) al_buf_free(&msgs[i]);

    /* cu_seqlens that does not end at the token count */
    fx_batch f;
    fx_batch_fill(&f);
    al_buf b = {0};
    REQUIRE(al_batch_chunk_encode(&f.c, &b, err, sizeof err) == 0);
    /* find the first cu_seqlens (0,4,7,10 as int32) and change its end */
    static const uint8_t cu[16] = {0, 0, 0, 0, 4, 0, 0, 0, 7, 0, 0, 0, 10, 0, 0, 0};
    uint8_t *at = memmem(b.data, b.len, cu, sizeof cu);
    REQUIRE(at);
    at[12] = 9;
    al_batch_chunk c = {0};
    CHECK(expect_error(al_batch_chunk_decode(b.data, b.len, &c, err, sizeof err),
                       "micro_batches.cu_seqlens does not end at the token count"));
    at[12] = 10;
    at[4] = 8;
    CHECK(expect_error(al_batch_chunk_decode(b.data, b.len, &c, err, sizeof err),
                       "micro_batches.cu_seqlens decreases"));
    al_batch_chunk_clear(&c);
    al_buf_free(&b);
}

TEST(truncation_at_every_byte_is_an_error)
{
    al_buf msgs[8] = {{0}};
    size_t n = make_messages(msgs, 8);
    size_t cases = 0;
    for (size_t i = 0; i < n; i++) {
        for (size_t len = 0; len < msgs[i].len; len++) {
            /* a copy of exactly len bytes, so that ASan sees any read past the end */
            uint8_t *cut = malloc(len ? len : 1);
            memcpy(cut, msgs[i].data, len);
            int ok = decode_all(cut, len);
            CHECKF(ok == 0, "message %zu cut at %zu of %zu bytes decoded", i, len, msgs[i].len);
            CHECKF(strstr(err, "truncated"), "message %zu cut at %zu: \"%s\"", i, len, err);
            al_buf out = {0};
            const al_schema_info *in = al_schema_by_fingerprint(fp_of("Span"));
            CHECK(al_avro_resolve(cut, len, in->json, &out, err, sizeof err) == -1);
            al_buf_free(&out);
            free(cut);
            cases++;
        }
    }
    CHECK(cases > 1000);
    for (size_t i = 0; i < n; i++) al_buf_free(&msgs[i]);
}

static uint64_t rng_state = 0x9E3779B97F4A7C15ULL;
static uint64_t rng(void)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return rng_state;
}

TEST(random_byte_flips_never_crash)
{
    al_buf msgs[8] = {{0}};
    size_t n = make_messages(msgs, 8);
    int decoded = 0, refused = 0;
    for (size_t i = 0; i < n; i++) {
        uint8_t *copy = malloc(msgs[i].len);
        for (int iter = 0; iter < 1500; iter++) {
            memcpy(copy, msgs[i].data, msgs[i].len);
            int flips = 1 + (int)(rng() % 3);
            for (int k = 0; k < flips; k++) {
                /* mostly the body: a flipped fingerprint only tests the lookup */
                size_t pos = AL_AVRO_HEADER_LEN + rng() % (msgs[i].len - AL_AVRO_HEADER_LEN);
                if (rng() % 16 == 0) pos = rng() % msgs[i].len;
                copy[pos] ^= (uint8_t)(1u << (rng() % 8));
            }
            int ok = decode_all(copy, msgs[i].len);
            if (ok) decoded++;
            else refused++;
        }
        free(copy);
    }
    /* both outcomes happen: flips inside numbers decode, flips in lengths do not */
    CHECKF(decoded > 100 && refused > 100, "decoded %d, refused %d", decoded, refused);
    for (size_t i = 0; i < n; i++) al_buf_free(&msgs[i]);
}
