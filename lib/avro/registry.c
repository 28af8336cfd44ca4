/*
 * registry.c: schema parsing (jansson), Parsing Canonical Form, CRC-64-AVRO, and the
 * registry of arclight's schemas by name and fingerprint.
 *
 * The schemas' text is compiled into the library (the build generates
 * al_schemas_embedded.c from schemas/<name>.avsc and schemas/history/<name>.avsc), so the binary
 * does not need the source tree at run time.
 */
#include "avro/registry.h"
#include "avro/tree.h"
#include "core/buf.h"
#include "core/util.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- CRC-64-AVRO ---------------------------------------------------------------------- */

#define AL_CRC64_EMPTY 0xc15d213aa4d7a795ULL

static uint64_t crc64_table[256];
static pthread_once_t crc64_once = PTHREAD_ONCE_INIT;

static void crc64_init(void)
{
    for (int i = 0; i < 256; i++) {
        uint64_t fp = (uint64_t)i;
        for (int j = 0; j < 8; j++) fp = (fp >> 1) ^ (AL_CRC64_EMPTY & (~(fp & 1) + 1));
        crc64_table[i] = fp;
    }
}

uint64_t al_avro_crc64(const void *data, size_t len)
{
    pthread_once(&crc64_once, crc64_init);
    const uint8_t *p = data;
    uint64_t fp = AL_CRC64_EMPTY;
    for (size_t i = 0; i < len; i++) fp = (fp >> 8) ^ crc64_table[(fp ^ p[i]) & 0xff];
    return fp;
}

/* ---- parsing --------------------------------------------------------------------------- */

typedef struct parser {
    al_aschema *s;
    char *errstr;
    size_t errlen;
    al_anode **named;
    size_t n_named, cap_named;
    int depth;
} parser;

static const char *const primitive_names[] = {"null",   "boolean", "int",   "long",
                                              "float",  "double",  "bytes", "string"};

static al_anode *node_new(parser *p, al_atype t)
{
    al_anode *n = calloc(1, sizeof *n);
    if (!n) {
        al_err(p->errstr, p->errlen, "out of memory parsing a schema");
        return NULL;
    }
    n->type = t;
    n->next_alloc = p->s->all;
    p->s->all = n;
    return n;
}

/* Keeps a string the schema owns (names built from namespace + name). */
static const char *keep_string(parser *p, char *str)
{
    if (!str) {
        al_err(p->errstr, p->errlen, "out of memory parsing a schema");
        return NULL;
    }
    al_aschema *s = p->s;
    if (s->n_strings == s->cap_strings) {
        size_t cap = s->cap_strings ? 2 * s->cap_strings : 16;
        char **ns = realloc(s->strings, cap * sizeof *ns);
        if (!ns) {
            free(str);
            al_err(p->errstr, p->errlen, "out of memory parsing a schema");
            return NULL;
        }
        s->strings = ns;
        s->cap_strings = cap;
    }
    s->strings[s->n_strings++] = str;
    return str;
}

static const char *join_name(parser *p, const char *ns, const char *name)
{
    if (strchr(name, '.') || !ns || !*ns) return name;
    size_t n = strlen(ns) + strlen(name) + 2;
    char *full = malloc(n);
    if (full) snprintf(full, n, "%s.%s", ns, name);
    return keep_string(p, full);
}

static al_anode *lookup_named(parser *p, const char *fullname)
{
    for (size_t i = 0; i < p->n_named; i++)
        if (strcmp(p->named[i]->fullname, fullname) == 0) return p->named[i];
    return NULL;
}

static int valid_name(const char *s)
{
    if (!*s) return 0;
    for (const char *c = s; *c; c++) {
        int alpha = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || *c == '_';
        int digit = *c >= '0' && *c <= '9';
        if (*c == '.') {
            if (c == s || c[1] == '\0' || c[-1] == '.') return 0;
            continue;
        }
        if (!alpha && !(digit && c != s && c[-1] != '.')) return 0;
    }
    return 1;
}

static int add_named(parser *p, al_anode *n)
{
    if (lookup_named(p, n->fullname))
        return al_err(p->errstr, p->errlen, "schema defines the name %s twice", n->fullname);
    if (p->n_named == p->cap_named) {
        size_t cap = p->cap_named ? 2 * p->cap_named : 16;
        al_anode **nn = realloc(p->named, cap * sizeof *nn);
        if (!nn) return al_err(p->errstr, p->errlen, "out of memory parsing a schema");
        p->named = nn;
        p->cap_named = cap;
    }
    p->named[p->n_named++] = n;
    return 0;
}

static al_anode *parse_node(parser *p, json_t *j, const char *ns);

static al_anode *resolve_name(parser *p, const char *name, const char *ns)
{
    for (size_t i = 0; i < AL_ARRAY_LEN(primitive_names); i++)
        if (strcmp(name, primitive_names[i]) == 0) return node_new(p, (al_atype)i);
    const char *full = join_name(p, ns, name);
    if (!full) return NULL;
    al_anode *n = lookup_named(p, full);
    if (!n) n = lookup_named(p, name);
    if (!n) al_err(p->errstr, p->errlen, "schema refers to unknown type \"%s\"", name);
    return n;
}

/* Aliases of a named type or field: an array of strings. Named-type aliases are made
 * full names in the type's namespace. */
static int parse_aliases(parser *p, json_t *obj, const char *ns, int qualify,
                         const char ***out, size_t *n_out)
{
    json_t *a = json_object_get(obj, "aliases");
    *out = NULL;
    *n_out = 0;
    if (!a) return 0;
    if (!json_is_array(a)) return al_err(p->errstr, p->errlen, "\"aliases\" must be an array");
    size_t n = json_array_size(a);
    if (!n) return 0;
    char *arr = calloc(n, sizeof(char *));
    if (!arr || !keep_string(p, arr)) return -1;
    const char **list = (const char **)(void *)arr;
    for (size_t i = 0; i < n; i++) {
        const char *s = json_string_value(json_array_get(a, i));
        if (!s) return al_err(p->errstr, p->errlen, "an alias must be a string");
        list[i] = qualify ? join_name(p, ns, s) : s;
        if (!list[i]) return -1;
    }
    *out = list;
    *n_out = n;
    return 0;
}

static al_anode *parse_named(parser *p, json_t *j, const char *type, const char *ns)
{
    const char *name = json_string_value(json_object_get(j, "name"));
    if (!name) {
        al_err(p->errstr, p->errlen, "a %s schema needs a \"name\" string", type);
        return NULL;
    }
    if (!valid_name(name)) {
        al_err(p->errstr, p->errlen, "\"%s\" is not a valid Avro name", name);
        return NULL;
    }
    json_t *nsj = json_object_get(j, "namespace");
    if (nsj && !json_is_string(nsj) && !json_is_null(nsj)) {
        al_err(p->errstr, p->errlen, "\"namespace\" of %s must be a string", name);
        return NULL;
    }
    const char *own_ns = ns;
    if (strchr(name, '.')) {
        /* the name carries its namespace: everything before the last dot */
        const char *dot = strrchr(name, '.');
        own_ns = keep_string(p, strndup(name, (size_t)(dot - name)));
        if (!own_ns) return NULL;
    } else if (nsj) {
        own_ns = json_is_string(nsj) ? json_string_value(nsj) : "";
    }
    al_atype t = strcmp(type, "enum") == 0    ? AL_AT_ENUM
                 : strcmp(type, "fixed") == 0 ? AL_AT_FIXED
                                              : AL_AT_RECORD;
    al_anode *n = node_new(p, t);
    if (!n) return NULL;
    n->fullname = strchr(name, '.') ? name : join_name(p, own_ns, name);
    if (!n->fullname) return NULL;
    const char *dot = strrchr(n->fullname, '.');
    n->name = dot ? dot + 1 : n->fullname;
    if (parse_aliases(p, j, own_ns, 1, &n->aliases, &n->n_aliases)) return NULL;
    if (add_named(p, n)) return NULL; /* before the fields: a record may refer to itself */

    if (t == AL_AT_FIXED) {
        json_t *size = json_object_get(j, "size");
        if (!json_is_integer(size) || json_integer_value(size) < 0) {
            al_err(p->errstr, p->errlen, "fixed %s needs a non-negative integer \"size\"", name);
            return NULL;
        }
        n->size = json_integer_value(size);
        return n;
    }
    if (t == AL_AT_ENUM) {
        json_t *syms = json_object_get(j, "symbols");
        if (!json_is_array(syms)) {
            al_err(p->errstr, p->errlen, "enum %s needs a \"symbols\" array", name);
            return NULL;
        }
        n->n_symbols = json_array_size(syms);
        char *arr = calloc(n->n_symbols ? n->n_symbols : 1, sizeof(char *));
        if (!arr || !keep_string(p, arr)) return NULL;
        n->symbols = (const char **)(void *)arr;
        for (size_t i = 0; i < n->n_symbols; i++) {
            n->symbols[i] = json_string_value(json_array_get(syms, i));
            if (!n->symbols[i]) {
                al_err(p->errstr, p->errlen, "enum %s: symbols must be strings", name);
                return NULL;
            }
            for (size_t k = 0; k < i; k++)
                if (strcmp(n->symbols[k], n->symbols[i]) == 0) {
                    al_err(p->errstr, p->errlen, "enum %s: symbol %s appears twice", name,
                           n->symbols[i]);
                    return NULL;
                }
        }
        json_t *def = json_object_get(j, "default");
        if (def) {
            n->enum_default = json_string_value(def);
            int found = 0;
            for (size_t i = 0; n->enum_default && i < n->n_symbols; i++)
                found |= strcmp(n->symbols[i], n->enum_default) == 0;
            if (!found) {
                al_err(p->errstr, p->errlen, "enum %s: default is not one of its symbols", name);
                return NULL;
            }
        }
        return n;
    }
    json_t *fields = json_object_get(j, "fields");
    if (!json_is_array(fields)) {
        al_err(p->errstr, p->errlen, "record %s needs a \"fields\" array", name);
        return NULL;
    }
    n->n_fields = json_array_size(fields);
    char *arr = calloc(n->n_fields ? n->n_fields : 1, sizeof(al_afield));
    if (!arr || !keep_string(p, arr)) return NULL;
    n->fields = (al_afield *)(void *)arr;
    for (size_t i = 0; i < n->n_fields; i++) {
        json_t *f = json_array_get(fields, i);
        al_afield *af = &n->fields[i];
        af->name = json_string_value(json_object_get(f, "name"));
        if (!json_is_object(f) || !af->name) {
            al_err(p->errstr, p->errlen, "record %s: field %zu needs a \"name\"", name, i);
            return NULL;
        }
        for (size_t k = 0; k < i; k++)
            if (strcmp(n->fields[k].name, af->name) == 0) {
                al_err(p->errstr, p->errlen, "record %s: field %s appears twice", name, af->name);
                return NULL;
            }
        json_t *ft = json_object_get(f, "type");
        if (!ft) {
            al_err(p->errstr, p->errlen, "record %s: field %s needs a \"type\"", name, af->name);
            return NULL;
        }
        af->type = parse_node(p, ft, own_ns);
        if (!af->type) return NULL;
        af->def = json_object_get(f, "default");
        if (parse_aliases(p, f, own_ns, 0, &af->aliases, &af->n_aliases)) return NULL;
        const char *packed = json_string_value(json_object_get(f, "arclight.packed"));
        if (packed) {
            if (strcmp(packed, "int32le") == 0) af->packed = AL_PACKED_INT32LE;
            else if (strcmp(packed, "float32le") == 0) af->packed = AL_PACKED_FLOAT32LE;
            else if (strcmp(packed, "uint8") == 0) af->packed = AL_PACKED_UINT8;
            else {
                al_err(p->errstr, p->errlen, "record %s: field %s: unknown arclight.packed \"%s\"",
                       name, af->name, packed);
                return NULL;
            }
            if (af->type->type != AL_AT_BYTES) {
                al_err(p->errstr, p->errlen, "record %s: field %s: arclight.packed needs bytes",
                       name, af->name);
                return NULL;
            }
        }
    }
    return n;
}

static al_anode *parse_node(parser *p, json_t *j, const char *ns)
{
    if (++p->depth > 64) {
        al_err(p->errstr, p->errlen, "schema nests deeper than 64 levels");
        return NULL;
    }
    al_anode *n = NULL;
    if (json_is_string(j)) {
        n = resolve_name(p, json_string_value(j), ns);
    } else if (json_is_array(j)) {
        n = node_new(p, AL_AT_UNION);
        if (n) {
            n->n_branches = json_array_size(j);
            char *arr = calloc(n->n_branches ? n->n_branches : 1, sizeof(al_anode *));
            if (!arr || !keep_string(p, arr)) n = NULL;
            else n->branches = (al_anode **)(void *)arr;
        }
        for (size_t i = 0; n && i < n->n_branches; i++) {
            n->branches[i] = parse_node(p, json_array_get(j, i), ns);
            if (!n->branches[i]) n = NULL;
            else if (n->branches[i]->type == AL_AT_UNION) {
                al_err(p->errstr, p->errlen, "a union may not contain a union directly");
                n = NULL;
            }
        }
    } else if (json_is_object(j)) {
        json_t *t = json_object_get(j, "type");
        const char *ts = json_string_value(t);
        if (!t) {
            al_err(p->errstr, p->errlen, "a schema object needs a \"type\"");
        } else if (!ts) {
            n = parse_node(p, t, ns);
        } else if (!strcmp(ts, "record") || !strcmp(ts, "error") || !strcmp(ts, "enum") ||
                   !strcmp(ts, "fixed")) {
            n = parse_named(p, j, ts, ns);
        } else if (!strcmp(ts, "array") || !strcmp(ts, "map")) {
            int is_map = ts[0] == 'm';
            json_t *inner = json_object_get(j, is_map ? "values" : "items");
            if (!inner) {
                al_err(p->errstr, p->errlen, "an %s schema needs \"%s\"", ts,
                       is_map ? "values" : "items");
            } else {
                n = node_new(p, is_map ? AL_AT_MAP : AL_AT_ARRAY);
                if (n) n->items = parse_node(p, inner, ns);
                if (n && !n->items) n = NULL;
            }
        } else {
            n = resolve_name(p, ts, ns);
        }
    } else {
        al_err(p->errstr, p->errlen, "a schema must be a string, an object or an array");
    }
    p->depth--;
    return n;
}

void al_aschema_free(al_aschema *s)
{
    if (!s) return;
    for (al_anode *n = s->all, *next; n; n = next) {
        next = n->next_alloc;
        free(n);
    }
    for (size_t i = 0; i < s->n_strings; i++) free(s->strings[i]);
    free(s->strings);
    json_decref(s->json);
    free(s);
}

al_aschema *al_aschema_parse(const char *json_text, char *errstr, size_t errlen)
{
    json_error_t jerr;
    json_t *j = json_loads(json_text, JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
    if (!j) {
        al_err(errstr, errlen, "schema is not valid JSON: %s (line %d, column %d)", jerr.text,
               jerr.line, jerr.column);
        return NULL;
    }
    al_aschema *s = calloc(1, sizeof *s);
    if (!s) {
        json_decref(j);
        al_err(errstr, errlen, "out of memory parsing a schema");
        return NULL;
    }
    s->json = j;
    parser p = {.s = s, .errstr = errstr, .errlen = errlen};
    s->root = parse_node(&p, j, "");
    free(p.named);
    if (!s->root) {
        al_aschema_free(s);
        return NULL;
    }
    return s;
}

/* ---- Parsing Canonical Form --------------------------------------------------------- */


/* A JSON string literal; names and symbols are plain identifiers, but escape anyway. */
static void put_quoted(al_buf *b, const char *s)
{
    al_buf_append(b, "\"", 1);
    for (const char *c = s; *c; c++) {
        if (*c == '"' || *c == '\\') {
            char e[2] = {'\\', *c};
            al_buf_append(b, e, 2);
        } else if ((unsigned char)*c < 0x20) {
            char e[8];
            snprintf(e, sizeof e, "\\u%04x", (unsigned char)*c);
            al_buf_puts(b, e);
        } else {
            al_buf_append(b, c, 1);
        }
    }
    al_buf_append(b, "\"", 1);
}

static void canon(al_buf *b, al_anode *n)
{
    char num[32];
    switch (n->type) {
    case AL_AT_NULL: case AL_AT_BOOLEAN: case AL_AT_INT: case AL_AT_LONG: case AL_AT_FLOAT:
    case AL_AT_DOUBLE: case AL_AT_BYTES: case AL_AT_STRING:
        put_quoted(b, primitive_names[n->type]);
        return;
    case AL_AT_UNION:
        al_buf_puts(b, "[");
        for (size_t i = 0; i < n->n_branches; i++) {
            if (i) al_buf_puts(b, ",");
            canon(b, n->branches[i]);
        }
        al_buf_puts(b, "]");
        return;
    case AL_AT_ARRAY:
    case AL_AT_MAP:
        al_buf_puts(b, n->type == AL_AT_ARRAY ? "{\"type\":\"array\",\"items\":"
                                          : "{\"type\":\"map\",\"values\":");
        canon(b, n->items);
        al_buf_puts(b, "}");
        return;
    case AL_AT_RECORD: case AL_AT_ENUM: case AL_AT_FIXED:
        break;
    }
    if (n->emitted) { /* defined earlier in this form: refer to it by name */
        put_quoted(b, n->fullname);
        return;
    }
    n->emitted = 1;
    al_buf_puts(b, "{\"name\":");
    put_quoted(b, n->fullname);
    if (n->type == AL_AT_FIXED) {
        snprintf(num, sizeof num, ",\"type\":\"fixed\",\"size\":%lld}", (long long)n->size);
        al_buf_puts(b, num);
    } else if (n->type == AL_AT_ENUM) {
        al_buf_puts(b, ",\"type\":\"enum\",\"symbols\":[");
        for (size_t i = 0; i < n->n_symbols; i++) {
            if (i) al_buf_puts(b, ",");
            put_quoted(b, n->symbols[i]);
        }
        al_buf_puts(b, "]}");
    } else {
        al_buf_puts(b, ",\"type\":\"record\",\"fields\":[");
        for (size_t i = 0; i < n->n_fields; i++) {
            if (i) al_buf_puts(b, ",");
            al_buf_puts(b, "{\"name\":");
            put_quoted(b, n->fields[i].name);
            al_buf_puts(b, ",\"type\":");
            canon(b, n->fields[i].type);
            al_buf_puts(b, "}");
        }
        al_buf_puts(b, "]}");
    }
}

char *al_aschema_canonical(al_aschema *s)
{
    for (al_anode *n = s->all; n; n = n->next_alloc) n->emitted = 0;
    al_buf b = {0};
    canon(&b, s->root);
    if (b.oom) {
        free(b.data);
        return NULL;
    }
    return b.data;
}

char *al_avro_canonical_form(const char *schema_json, char *errstr, size_t errlen)
{
    al_aschema *s = al_aschema_parse(schema_json, errstr, errlen);
    if (!s) return NULL;
    char *c = al_aschema_canonical(s);
    al_aschema_free(s);
    if (!c) al_err(errstr, errlen, "out of memory writing a canonical form");
    return c;
}

int al_avro_fingerprint(const char *schema_json, uint64_t *fp_out, char *errstr, size_t errlen)
{
    char *c = al_avro_canonical_form(schema_json, errstr, errlen);
    if (!c) return -1;
    *fp_out = al_avro_crc64(c, strlen(c));
    free(c);
    return 0;
}

/* ---- registry ------------------------------------------------------------------------ */

/* Generated at build time from schemas/ (lib/avro/embed_schemas.cmake). */
typedef struct al_embedded_schema {
    const char *path; /* relative to schemas/, e.g. "span.avsc", "history/span.v1.avsc" */
    const char *text;
} al_embedded_schema;
extern const al_embedded_schema al_embedded_schemas[];
extern const size_t al_n_embedded_schemas;

typedef struct reg_entry {
    al_schema_info info; /* first: al_schema_info pointers are reg_entry pointers */
    al_aschema *tree;
    char *json_copy;
} reg_entry;

#define AL_REGISTRY_MAX 256
static reg_entry *registry[AL_REGISTRY_MAX];
static const al_schema_info *registry_infos[AL_REGISTRY_MAX];
static size_t registry_n;
static pthread_once_t registry_once = PTHREAD_ONCE_INIT;
static pthread_rwlock_t registry_lock = PTHREAD_RWLOCK_INITIALIZER;

/* Adds one version; the caller holds the write lock. 1 when the fingerprint is already
 * there, 0 when added, -1 on error. */
static int registry_add_locked(const char *json, int current, const char *require_name,
                               char *errstr, size_t errlen)
{
    al_aschema *tree = al_aschema_parse(json, errstr, errlen);
    if (!tree) return -1;
    if (tree->root->type != AL_AT_RECORD) {
        al_aschema_free(tree);
        return al_err(errstr, errlen, "an arclight schema must be a record");
    }
    if (require_name) {
        int known = 0;
        for (size_t i = 0; i < registry_n; i++)
            known |= registry[i]->info.current &&
                     strcmp(registry[i]->info.name, tree->root->fullname) == 0;
        if (!known) {
            al_err(errstr, errlen, "%s is not one of arclight's schemas", tree->root->fullname);
            al_aschema_free(tree);
            return -1;
        }
    }
    char *canonical = al_aschema_canonical(tree);
    if (!canonical) {
        al_aschema_free(tree);
        return al_err(errstr, errlen, "out of memory");
    }
    uint64_t fp = al_avro_crc64(canonical, strlen(canonical));
    for (size_t i = 0; i < registry_n; i++)
        if (registry[i]->info.fingerprint == fp) {
            free(canonical);
            al_aschema_free(tree);
            return 1;
        }
    if (registry_n == AL_REGISTRY_MAX) {
        free(canonical);
        al_aschema_free(tree);
        return al_err(errstr, errlen, "schema registry is full (%d versions)", AL_REGISTRY_MAX);
    }
    reg_entry *e = calloc(1, sizeof *e);
    char *copy = strdup(json);
    if (!e || !copy) {
        free(e);
        free(copy);
        free(canonical);
        al_aschema_free(tree);
        return al_err(errstr, errlen, "out of memory");
    }
    e->tree = tree;
    e->json_copy = copy;
    e->info.name = tree->root->fullname;
    e->info.json = copy;
    e->info.canonical = canonical;
    e->info.fingerprint = fp;
    e->info.current = current;
    registry_infos[registry_n] = &e->info;
    registry[registry_n++] = e;
    return 0;
}

/* Current versions first (files directly in schemas/), then history/. A broken embedded
 * schema is a build defect: it is reported on stderr and left out. */
static void registry_init(void)
{
    char err[256];
    pthread_rwlock_wrlock(&registry_lock);
    for (int pass = 0; pass < 2; pass++)
        for (size_t i = 0; i < al_n_embedded_schemas; i++) {
            const al_embedded_schema *es = &al_embedded_schemas[i];
            int is_current = strchr(es->path, '/') == NULL;
            if (is_current != (pass == 0)) continue;
            if (registry_add_locked(es->text, is_current, NULL, err, sizeof err) < 0)
                fprintf(stderr, "arclight: embedded schema %s: %s\n", es->path, err);
        }
    pthread_rwlock_unlock(&registry_lock);
}

const al_schema_info *al_schema_by_name(const char *name)
{
    pthread_once(&registry_once, registry_init);
    const al_schema_info *found = NULL;
    pthread_rwlock_rdlock(&registry_lock);
    for (size_t i = 0; i < registry_n && !found; i++) {
        const al_schema_info *in = &registry[i]->info;
        if (!in->current) continue;
        const char *dot = strrchr(in->name, '.');
        if (strcmp(in->name, name) == 0 || (dot && strcmp(dot + 1, name) == 0)) found = in;
    }
    pthread_rwlock_unlock(&registry_lock);
    return found;
}

const al_schema_info *al_schema_by_fingerprint(uint64_t fp)
{
    pthread_once(&registry_once, registry_init);
    const al_schema_info *found = NULL;
    pthread_rwlock_rdlock(&registry_lock);
    for (size_t i = 0; i < registry_n && !found; i++)
        if (registry[i]->info.fingerprint == fp) found = &registry[i]->info;
    pthread_rwlock_unlock(&registry_lock);
    return found;
}

const al_schema_info *const *al_schema_list(size_t *n_out)
{
    pthread_once(&registry_once, registry_init);
    pthread_rwlock_rdlock(&registry_lock);
    *n_out = registry_n;
    pthread_rwlock_unlock(&registry_lock);
    return registry_infos;
}

int al_schema_register(const char *schema_json, char *errstr, size_t errlen)
{
    pthread_once(&registry_once, registry_init);
    pthread_rwlock_wrlock(&registry_lock);
    int rc = registry_add_locked(schema_json, 0, "", errstr, errlen);
    pthread_rwlock_unlock(&registry_lock);
    return rc < 0 ? -1 : 0;
}

const al_aschema *al_schema_tree(const al_schema_info *info)
{
    return ((const reg_entry *)(const void *)info)->tree;
}
