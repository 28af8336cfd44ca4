/*
 * codec.h: arclight's Avro messages as plain C structs.
 *
 * Every Kafka value arclight writes is Avro single-object encoded:
 *   C3 01 | CRC-64-AVRO fingerprint of the writer schema (8 bytes, little-endian) | Avro binary
 * Schemas live in schemas/<name>.avsc (namespace ai.arclight); see schemas/README.md.
 *
 * For each schema X in {span, transition, batch_chunk, policy_version, deadletter}:
 *
 *   int  al_X_encode(const al_X *m, al_buf *out, char *errstr, size_t errlen);
 *       Replaces out's contents with the framed message. 0, or -1 with errstr (a field
 *       out of range, an inconsistent array length). Reads m only.
 *   int  al_X_decode(const void *buf, size_t len, al_X *m, char *errstr, size_t errlen);
 *       Decodes a framed message into m. m must be zeroed or come from a previous
 *       decode/clear: every field is overwritten, and the memory of earlier decodes into m
 *       is reused. Strings, arrays and bytes of m then point into memory that m owns
 *       (m->arena) until the next decode into m or al_X_clear(m); buf is not referenced
 *       after the call. Untrusted input is fine: bad magic, unknown fingerprint,
 *       truncation, bad lengths, bad union branch or enum index, trailing bytes, packed
 *       arrays whose length is not a multiple of 4 each return -1 with a message that
 *       names the problem (and the field and offset where there is one).
 *       A message written with another registered version of the schema (older or newer,
 *       see schemas/README.md) is resolved to the current version first.
 *   void al_X_clear(al_X *m);
 *       Frees the memory the codec owns in m and zeroes m. Pointers a caller put into m
 *       are never freed.
 *
 * Filling a struct for encoding: zero it, set the fields; pointers stay the caller's.
 * A required string left NULL is written as "" ; a nullable one (marked "NULL: null")
 * is written as Avro null. Token ids and logprobs travel as packed little-endian
 * int32/float32 bytes and come back as int32_t / float arrays.
 *
 * Thread safety: the functions are re-entrant; one struct must not be used by two
 * threads at once.
 */
#ifndef ARCLIGHT_AVRO_CODEC_H
#define ARCLIGHT_AVRO_CODEC_H

#include "avro/registry.h" /* not "schema.h": avro-c owns <avro/schema.h> */
#include "core/buf.h"      /* al_buf: what encoders write into */

#include <stddef.h>
#include <stdint.h>

#define AL_AVRO_MAGIC0 0xC3
#define AL_AVRO_MAGIC1 0x01
#define AL_AVRO_HEADER_LEN 10 /* magic (2) + fingerprint (8) */

/* Memory a decoded message owns: a list of blocks, reused from decode to decode. */
typedef struct al_arena_block al_arena_block;
typedef struct al_arena {
    al_arena_block *head;
} al_arena;

/* Allocates n bytes aligned to 8 that live until al_arena_reset/free; NULL when out of
 * memory. */
void *al_arena_alloc(al_arena *a, size_t n);
/* Forgets every allocation but keeps the largest block for reuse. */
void al_arena_reset(al_arena *a);
void al_arena_free(al_arena *a);

/* ------------------------------------------------------------------------------------ */
/* Span (arclight.spans): an LLM call, a reward, or a rollout's end.                     */

typedef enum al_span_kind {
    AL_SPAN_KIND_LLM_CALL = 0, /* union branch 0: LlmCall */
    AL_SPAN_KIND_REWARD = 1,
    AL_SPAN_KIND_ROLLOUT_END = 2,
} al_span_kind;

typedef enum al_rollout_status {
    AL_ROLLOUT_STATUS_SUCCEEDED = 0,
    AL_ROLLOUT_STATUS_FAILED = 1,
    AL_ROLLOUT_STATUS_TIMEOUT = 2,
    AL_ROLLOUT_STATUS_ABORTED = 3,
    AL_ROLLOUT_STATUS_UNKNOWN = 4,
} al_rollout_status;

/* "succeeded", ...; "unknown" for a value out of range. */
const char *al_rollout_status_name(al_rollout_status s);
/* Parses a status name; -1 when it is none of them. */
int al_rollout_status_parse(const char *name);

typedef struct al_usage {
    int64_t prompt_tokens;
    int64_t completion_tokens;
    int64_t total_tokens;
    int64_t cached_tokens;
} al_usage;

typedef struct al_llm_call {
    const char *agent;
    const char *model;
    const char *upstream;
    int64_t policy_version; /* -1: unknown */
    const char *request_json;
    const char *response_json;
    int stream; /* 0 or 1 */
    const int32_t *prompt_token_ids;
    size_t n_prompt_tokens;
    const int32_t *response_token_ids;
    size_t n_response_tokens;
    const float *response_logprobs; /* n_response_logprobs: 0 or n_response_tokens */
    size_t n_response_logprobs;
    const char *finish_reason; /* NULL: null */
    int32_t http_status;       /* 0: no answer */
    const char *error;         /* NULL: null (success) */
    int64_t start_us, first_byte_us, first_token_us, end_us; /* 0: did not happen */
    al_usage usage;
} al_llm_call;

/* The rewards arclight takes: finite numbers within +-AL_REWARD_MAX. The proxy answers 400
 * to others and credit dead-letters a reward span beyond it; within it, sums, squares and
 * returns over any group stay finite. */
#define AL_REWARD_MAX 1e15

typedef struct al_reward {
    const char *name;
    double value;
    int64_t after_sequence; /* -1: before any call */
} al_reward;

typedef struct al_rollout_end {
    al_rollout_status status;
    int32_t group_size; /* 0: null (use the configured group size) */
    const char *reason; /* NULL: null */
    int retried;        /* 0 or 1: a new attempt of the rollout replaces this one */
} al_rollout_end;

typedef struct al_span {
    const char *trace_id;       /* 32 hex */
    const char *span_id;        /* 16 hex */
    const char *parent_span_id; /* NULL: null */
    const char *task_id;
    const char *rollout_id;
    int32_t attempt;
    int64_t sequence;
    int64_t timestamp_us;
    al_span_kind kind; /* which one of the three below is the payload */
    al_llm_call llm_call;
    al_reward reward;
    al_rollout_end rollout_end;
    int eval;       /* 0 or 1: a held-out evaluation rollout's span (credit trains on none) */
    al_arena arena; /* codec-owned memory of a decoded span */
} al_span;

int al_span_encode(const al_span *s, al_buf *out, char *errstr, size_t errlen);
int al_span_decode(const void *buf, size_t len, al_span *out, char *errstr, size_t errlen);
void al_span_clear(al_span *s);

/* ------------------------------------------------------------------------------------ */
/* Transition (arclight.transitions): one trainable sequence with its advantage.         */

typedef struct al_transition {
    const char *id; /* al_transition_id() */
    const char *group_key;
    const char *group_id;
    int32_t group_size;
    const char *task_id;
    const char *rollout_id;
    int32_t attempt;
    const int32_t *call_indices;
    size_t n_call_indices;
    const int32_t *prompt_token_ids;
    size_t n_prompt_tokens;
    const int32_t *response_token_ids;
    size_t n_response_tokens;
    const uint8_t *loss_mask; /* n_loss_mask: 0 (all ones) or n_response_tokens */
    size_t n_loss_mask;
    const float *rollout_logprobs; /* 0 or n_response_tokens */
    size_t n_rollout_logprobs;
    double reward;
    double return_value;
    double advantage;
    const float *token_advantages; /* 0 (use advantage) or n_response_tokens */
    size_t n_token_advantages;
    const char *estimator;
    int64_t policy_version;
    const char *model;
    int64_t timestamp_us;
    al_arena arena;
} al_transition;

/* Writes the deterministic transition id "{rollout_id}:{attempt}:{call_index}" into buf;
 * returns the length snprintf would have written (>= buflen: truncated). */
int al_transition_id(char *buf, size_t buflen, const char *rollout_id, int32_t attempt,
                     int32_t call_index);

int al_transition_encode(const al_transition *t, al_buf *out, char *errstr, size_t errlen);
int al_transition_decode(const void *buf, size_t len, al_transition *out, char *errstr,
                         size_t errlen);
void al_transition_clear(al_transition *t);

/* ------------------------------------------------------------------------------------ */
/* BatchChunk (arclight.batches): packed micro-batches of one trainer step.              */

typedef struct al_micro_batch {
    int32_t index; /* within the step */
    size_t n_tokens;
    const int32_t *token_ids;      /* n_tokens */
    const uint8_t *loss_mask;      /* n_tokens */
    const int32_t *position_ids;   /* n_tokens, restarting at 0 per sequence */
    const float *rollout_logprobs; /* n_tokens */
    const float *advantages;       /* n_tokens */
    size_t n_sequences;
    const int32_t *cu_seqlens;          /* n_sequences + 1: 0, len0, len0+len1, ..., n_tokens */
    const char *const *transition_ids;  /* n_sequences */
    const int64_t *policy_versions;     /* n_sequences */
    const float *rewards;               /* n_rewards: 0 or n_sequences */
    size_t n_rewards;
} al_micro_batch;

/* Step numbers of BatchChunk run from 0 to AL_STEP_MAX: the batch stage numbers no step
 * beyond it, and the trainer refuses a chunk beyond it (one chunk numbered INT64_MAX would
 * otherwise count every later step as trained on). */
#define AL_STEP_MAX (INT64_MAX / 2)

typedef struct al_batch_chunk {
    const char *model;
    int64_t step;
    int64_t policy_version;
    int32_t chunk_index;
    int32_t chunk_count;
    int32_t step_micro_batches;
    int32_t step_sequences;
    int64_t step_tokens;
    int64_t step_loss_tokens;
    const al_micro_batch *micro_batches;
    size_t n_micro_batches;
    al_arena arena;
} al_batch_chunk;

/* Encoding checks each micro-batch: cu_seqlens starts at 0, never decreases and ends at
 * n_tokens; decoding checks the same and that every per-token array has n_tokens
 * entries. */
int al_batch_chunk_encode(const al_batch_chunk *c, al_buf *out, char *errstr, size_t errlen);
int al_batch_chunk_decode(const void *buf, size_t len, al_batch_chunk *out, char *errstr,
                          size_t errlen);
void al_batch_chunk_clear(al_batch_chunk *c);

/* ------------------------------------------------------------------------------------ */
/* PolicyVersion (arclight.policy).                                                       */

typedef struct al_metric {
    const char *name;
    double value;
} al_metric;

typedef struct al_train_metrics {
    double loss, kl, entropy, clip_fraction, grad_norm, tokens_per_s;
    const al_metric *extra; /* an Avro map: names are unique */
    size_t n_extra;
} al_train_metrics;

typedef struct al_policy_version {
    const char *model;
    int64_t version;
    int64_t step;
    const char *checkpoint_uri;
    const char *sha256; /* 64 hex */
    int64_t created_us;
    al_train_metrics metrics;
    al_arena arena;
} al_policy_version;

int al_policy_version_encode(const al_policy_version *p, al_buf *out, char *errstr,
                             size_t errlen);
int al_policy_version_decode(const void *buf, size_t len, al_policy_version *out,
                             char *errstr, size_t errlen);
void al_policy_version_clear(al_policy_version *p);

/* ------------------------------------------------------------------------------------ */
/* DeadLetter (arclight.deadletter).                                                      */

typedef struct al_header {
    const char *key;
    const uint8_t *value; /* NULL: null */
    size_t value_len;
} al_header;

typedef struct al_deadletter {
    const char *source_topic;
    int32_t partition;
    int64_t offset;
    const uint8_t *key; /* NULL: null (no key); non-NULL with key_len 0: empty key */
    size_t key_len;
    const uint8_t *value; /* NULL: null (tombstone) */
    size_t value_len;
    const al_header *headers;
    size_t n_headers;
    const char *reason;
    const char *stage;
    int64_t source_timestamp_us; /* -1: none */
    int64_t timestamp_us;
    al_arena arena;
} al_deadletter;

int al_deadletter_encode(const al_deadletter *d, al_buf *out, char *errstr, size_t errlen);
int al_deadletter_decode(const void *buf, size_t len, al_deadletter *out, char *errstr,
                         size_t errlen);
void al_deadletter_clear(al_deadletter *d);

/* ------------------------------------------------------------------------------------ */
/* Any message.                                                                            */

/* Reads the single-object header: the writer schema of a message (any registered
 * version). NULL with the reason in errstr (too short, bad magic, unknown fingerprint). */
const al_schema_info *al_avro_peek(const void *buf, size_t len, char *errstr, size_t errlen);

/* Decodes any arclight message (any registered writer version) into a JSON object string
 * (malloc'd, the caller frees *json_out): the record's fields by name in schema order,
 * unions as the branch's value (null or the value itself; a record branch of a union of
 * more than two, like the Span payload, gets a first member "_type" naming it), enums as
 * their symbol, packed token/logprob/mask fields as JSON arrays of numbers, other bytes as
 * a string whose code points are the byte values (Avro's JSON encoding; a 0 byte is
 * \u0000, so parse with JSON_ALLOW_NUL in jansson), NaN and infinities as the strings
 * "NaN", "Infinity", "-Infinity". The output is one line of ASCII. 0, or -1 with errstr. */
int al_avro_to_json(const void *buf, size_t len, char **json_out, char *errstr, size_t errlen);

/* Re-encodes a message of any registered writer version under reader_schema_json (a
 * version of the same record, older or newer) following Avro's resolution rules: fields
 * matched by name (or the reader's aliases), reader fields the writer lacks take their
 * default, writer fields the reader lacks are skipped, int->long->float->double and
 * string<->bytes promotions, enum symbols by name (the reader's enum default for an
 * unknown symbol). out receives the framed message with the reader schema's fingerprint.
 * 0, or -1 with errstr. */
int al_avro_resolve(const void *buf, size_t len, const char *reader_schema_json, al_buf *out,
                    char *errstr, size_t errlen);

#endif
