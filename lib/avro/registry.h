/*
 * registry.h: Avro schemas without avro-c: Parsing Canonical Form, CRC-64-AVRO (Rabin)
 * fingerprints, and arclight's schema registry (every schemas/<name>.avsc and
 * schemas/history/<name>.avsc, embedded into the library at build time, known by fingerprint).
 *
 * The registry is built on first use (thread-safe) and lives until the process exits.
 */
#ifndef ARCLIGHT_AVRO_REGISTRY_H
#define ARCLIGHT_AVRO_REGISTRY_H

#include <stddef.h>
#include <stdint.h>

/* The CRC-64-AVRO fingerprint (64-bit Rabin, the Avro specification's algorithm) of a
 * byte string. Never fails. */
uint64_t al_avro_crc64(const void *data, size_t len);

/* Parses schema JSON text and returns its Parsing Canonical Form (Avro specification:
 * full names, only name/type/fields/symbols/items/values/size kept and in that order,
 * primitives as bare strings, no whitespace) as a malloc'd string the caller frees.
 * Returns NULL with the reason in errstr for text that is not a valid schema. */
char *al_avro_canonical_form(const char *schema_json, char *errstr, size_t errlen);

/* CRC-64-AVRO of the schema's Parsing Canonical Form. 0 or -1 with errstr. */
int al_avro_fingerprint(const char *schema_json, uint64_t *fp_out, char *errstr, size_t errlen);

/* A schema the registry knows. */
typedef struct al_schema_info {
    const char *name;      /* full name, e.g. "ai.arclight.Span" */
    const char *json;      /* the schema's JSON text as written in schemas/ */
    const char *canonical; /* its Parsing Canonical Form */
    uint64_t fingerprint;  /* CRC-64-AVRO of canonical */
    int current;           /* 1: the version the typed codecs read and write */
} al_schema_info;

/* The current version of a schema by full name ("ai.arclight.Span") or short name
 * ("Span", case-sensitive). NULL when unknown. The result lives as long as the process. */
const al_schema_info *al_schema_by_name(const char *name);

/* Any registered version (current, history, or added with al_schema_register) by
 * fingerprint. NULL when unknown. */
const al_schema_info *al_schema_by_fingerprint(uint64_t fp);

/* Every registered schema version, in registration order (current versions first).
 * *n_out receives the count. */
const al_schema_info *const *al_schema_list(size_t *n_out);

/* Registers another writer version of one of arclight's schemas (say, one that a newer
 * producer uses) so that messages written with it can be resolved. The text must parse
 * and its full name must be one of the current schemas' names. Registering a known
 * fingerprint again is a no-op. Returns 0, or -1 with errstr. The registry copies the
 * text. */
int al_schema_register(const char *schema_json, char *errstr, size_t errlen);

#endif
