/*
 * fuzz_decode: libFuzzer target for every decoder that faces Kafka bytes: the five typed
 * decoders, al_avro_to_json and al_avro_resolve.
 *
 * Each input is tried twice: as a whole framed message (the seed corpus holds valid
 * messages of every schema), and as a message body behind a valid header whose schema
 * the first byte picks, so that the fuzzer explores bodies without having to guess an
 * 8-byte fingerprint. Whatever a typed decoder accepts must encode again, and decode to
 * the same encoding (a decoder that accepts what its encoder cannot reproduce traps).
 *
 * A "v2" Span (the current one plus a defaulted field and an enum symbol) is registered at
 * start-up and can be picked too, so that the resolution of another writer version is
 * fuzzed as well.
 *
 * Build: tests/avro.cmake (clang-14 -fsanitize=fuzzer,address,undefined).
 * Run:   build-asan/fuzz_decode -max_total_time=60 /tmp/fuzz-new tests/fuzz/corpus
 */
#include "avro/codec.h"

#include <jansson.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static char err[512];

/* Decoded structs live across inputs, as a consumer's would, to exercise arena reuse. */
static al_span span;
static al_transition transition;
static al_batch_chunk chunk;
static al_policy_version policy;
static al_deadletter deadletter;
static al_buf enc1, enc2;

#define CHECK_REENCODE(type, var)                                                                  \
    do {                                                                                           \
        if (type##_encode(&var, &enc1, err, sizeof err)) __builtin_trap();                         \
        static type again;                                                                         \
        if (type##_decode(enc1.data, enc1.len, &again, err, sizeof err)) __builtin_trap();         \
        if (type##_encode(&again, &enc2, err, sizeof err)) __builtin_trap();                       \
        if (enc1.len != enc2.len || memcmp(enc1.data, enc2.data, enc1.len)) __builtin_trap();      \
    } while (0)

static void run_all(const uint8_t *p, size_t n)
{
    if (al_span_decode(p, n, &span, err, sizeof err) == 0) CHECK_REENCODE(al_span, span);
    if (al_transition_decode(p, n, &transition, err, sizeof err) == 0)
        CHECK_REENCODE(al_transition, transition);
    if (al_batch_chunk_decode(p, n, &chunk, err, sizeof err) == 0)
        CHECK_REENCODE(al_batch_chunk, chunk);
    if (al_policy_version_decode(p, n, &policy, err, sizeof err) == 0)
        CHECK_REENCODE(al_policy_version, policy);
    if (al_deadletter_decode(p, n, &deadletter, err, sizeof err) == 0)
        CHECK_REENCODE(al_deadletter, deadletter);
    char *json = NULL;
    if (al_avro_to_json(p, n, &json, err, sizeof err) == 0 && !json) __builtin_trap();
    free(json);
    const al_schema_info *in = al_avro_peek(p, n, err, sizeof err);
    if (in) {
        al_buf out = {0};
        al_avro_resolve(p, n, al_schema_by_name(in->name)->json, &out, err, sizeof err);
        al_buf_free(&out);
    }
}

static uint64_t fps[6];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    static const char *const names[] = {"Span", "Transition", "BatchChunk", "PolicyVersion",
                                        "DeadLetter"};
    for (int i = 0; i < 5; i++) fps[i] = al_schema_by_name(names[i])->fingerprint;
    json_t *j = json_loads(al_schema_by_name("Span")->json, 0, NULL);
    json_t *fields = json_object_get(j, "fields");
    json_array_append_new(fields, json_pack("{s:s,s:s,s:s}", "name", "region", "type", "string",
                                            "default", "eu"));
    json_t *payload = json_object_get(json_array_get(fields, json_array_size(fields) - 2), "type");
    json_t *end = json_array_get(payload, 2);
    json_t *status = json_object_get(json_array_get(json_object_get(end, "fields"), 0), "type");
    json_array_append_new(json_object_get(status, "symbols"), json_string("cancelled"));
    char *v2 = json_dumps(j, JSON_COMPACT);
    json_decref(j);
    if (!v2 || al_schema_register(v2, err, sizeof err) || al_avro_fingerprint(v2, &fps[5], err, sizeof err))
        __builtin_trap();
    free(v2);
    (void)argc;
    (void)argv;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    run_all(data, size);
    if (size < 1) return 0;
    uint64_t fp = fps[data[0] % 6];
    uint8_t *msg = malloc(size - 1 + AL_AVRO_HEADER_LEN);
    if (!msg) return 0;
    msg[0] = AL_AVRO_MAGIC0;
    msg[1] = AL_AVRO_MAGIC1;
    for (int i = 0; i < 8; i++) msg[2 + i] = (uint8_t)(fp >> (8 * i));
    memcpy(msg + AL_AVRO_HEADER_LEN, data + 1, size - 1);
    run_all(msg, size - 1 + AL_AVRO_HEADER_LEN);
    free(msg);
    return 0;
}
