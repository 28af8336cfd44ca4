/*
 * tree.h (internal to lib/avro): a parsed Avro schema, built from JSON with jansson.
 * Named types are nodes shared by every reference to them, so a tree can be a graph
 * (a record may contain itself through a union or an array).
 */
#ifndef ARCLIGHT_AVRO_TREE_H
#define ARCLIGHT_AVRO_TREE_H

#include "avro/registry.h"

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

typedef enum al_atype {
    AL_AT_NULL,
    AL_AT_BOOLEAN,
    AL_AT_INT,
    AL_AT_LONG,
    AL_AT_FLOAT,
    AL_AT_DOUBLE,
    AL_AT_BYTES,
    AL_AT_STRING,
    AL_AT_RECORD,
    AL_AT_ENUM,
    AL_AT_ARRAY,
    AL_AT_MAP,
    AL_AT_FIXED,
    AL_AT_UNION,
} al_atype;

/* How a bytes field packs numbers ("arclight.packed" attribute of the field). */
typedef enum al_packed {
    AL_PACKED_NONE = 0,
    AL_PACKED_INT32LE,
    AL_PACKED_FLOAT32LE,
    AL_PACKED_UINT8,
} al_packed;

typedef struct al_anode al_anode;

typedef struct al_afield {
    const char *name;
    al_anode *type;
    json_t *def; /* the default value, NULL when none (borrowed from the schema's JSON) */
    const char **aliases;
    size_t n_aliases;
    al_packed packed;
} al_afield;

struct al_anode {
    al_atype type;
    const char *fullname; /* record, enum, fixed */
    const char *name;     /* unqualified */
    const char **aliases; /* full names */
    size_t n_aliases;
    al_afield *fields; /* record */
    size_t n_fields;
    const char **symbols; /* enum */
    size_t n_symbols;
    const char *enum_default; /* NULL: none */
    al_anode **branches; /* union */
    size_t n_branches;
    al_anode *items; /* array items, map values */
    int64_t size;    /* fixed */
    al_anode *next_alloc;
    int emitted; /* scratch for the canonical-form writer */
};

typedef struct al_aschema {
    al_anode *root;
    al_anode *all;  /* every node, for freeing */
    json_t *json;   /* the parsed text; field names and defaults point into it */
    char **strings; /* full names built while parsing */
    size_t n_strings, cap_strings;
} al_aschema;

/* Parses schema JSON text. NULL with errstr when it is not a valid schema. */
al_aschema *al_aschema_parse(const char *json_text, char *errstr, size_t errlen);
void al_aschema_free(al_aschema *s);

/* Parsing Canonical Form of a parsed schema, malloc'd. NULL only when out of memory. */
char *al_aschema_canonical(al_aschema *s);

/* The parsed tree of a registered schema version (never NULL for a registry entry). */
const al_aschema *al_schema_tree(const al_schema_info *info);

#endif
