/*
 * generic.c: schema-driven walks over Avro binary for any registered message:
 * al_avro_to_json (decode to JSON) and al_avro_resolve (re-encode under another version of
 * the schema, Avro's resolution rules). Both validate every length, index and count before
 * use, so untrusted bytes only ever produce an error.
 */
#include "avro/binary.h"
#include "avro/codec.h"
#include "avro/tree.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GEN_MAX_DEPTH 100
/* Items of a type that takes no bytes (null, an empty record) cannot be bounded by the
 * message size; cap them so that a crafted count cannot run for hours. */
#define GEN_MAX_ZERO_SIZE_ITEMS (1u << 20)

static const char *type_name(const al_anode *n)
{
    static const char *const names[] = {"null",   "boolean", "int",    "long",  "float",
                                        "double", "bytes",   "string", "record", "enum",
                                        "array",  "map",     "fixed",  "union"};
    if (n->fullname) return n->fullname;
    return names[n->type];
}

/* Fewest bytes a value of this type takes (0 for null and records of such). */
static size_t min_size(const al_anode *n, int depth)
{
    if (depth > 8) return 0;
    switch (n->type) {
    case AL_AT_NULL: return 0;
    case AL_AT_FLOAT: return 4;
    case AL_AT_DOUBLE: return 8;
    case AL_AT_FIXED: return (size_t)n->size;
    case AL_AT_RECORD: {
        size_t s = 0;
        for (size_t i = 0; i < n->n_fields; i++) s += min_size(n->fields[i].type, depth + 1);
        return s;
    }
    default: return 1;
    }
}

/* Reads the next block count of an array or map of `items`; 0 ends it. */
static int read_block(al_rd *r, const char *field, const al_anode *items, int is_map,
                      size_t *total, size_t *count)
{
    size_t per = min_size(items, 0) + (is_map ? 1 : 0);
    if (al_rd_block(r, field, per, count)) return -1;
    *total += *count;
    if (per == 0 && *total > GEN_MAX_ZERO_SIZE_ITEMS)
        return al_err(r->errstr, r->errlen, "bad count: field %s has more than %u items",
                      field, GEN_MAX_ZERO_SIZE_ITEMS);
    return 0;
}

/* ---- to JSON ---------------------------------------------------------------------------- */

/* Bytes as a JSON string whose code points are the byte values (Avro's JSON encoding). */
static json_t *bytes_to_json(const uint8_t *p, size_t n)
{
    char *s = malloc(2 * n + 1);
    if (!s) return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i] < 0x80) {
            s[k++] = (char)p[i];
        } else {
            s[k++] = (char)(0xc0 | (p[i] >> 6));
            s[k++] = (char)(0x80 | (p[i] & 0x3f));
        }
    }
    json_t *j = json_stringn(s, k);
    free(s);
    return j;
}

static json_t *real_to_json(double v)
{
    if (isnan(v)) return json_string("NaN");
    if (isinf(v)) return json_string(v > 0 ? "Infinity" : "-Infinity");
    return json_real(v);
}

static json_t *packed_to_json(const uint8_t *p, size_t n, al_packed packed)
{
    json_t *a = json_array();
    size_t step = packed == AL_PACKED_UINT8 ? 1 : 4;
    for (size_t i = 0; a && i + step <= n; i += step) {
        json_t *v;
        if (packed == AL_PACKED_UINT8) {
            v = json_integer(p[i]);
        } else {
            uint32_t u = (uint32_t)p[i] | (uint32_t)p[i + 1] << 8 | (uint32_t)p[i + 2] << 16 |
                         (uint32_t)p[i + 3] << 24;
            if (packed == AL_PACKED_INT32LE) {
                v = json_integer((int32_t)u);
            } else {
                float f;
                memcpy(&f, &u, 4);
                v = real_to_json(f);
            }
        }
        if (!v || json_array_append_new(a, v)) {
            json_decref(a);
            return NULL;
        }
    }
    return a;
}

typedef struct gen {
    al_rd *r;
} gen;

static int oom(gen *g) { return al_err(g->r->errstr, g->r->errlen, "out of memory"); }

static int to_json(gen *g, const al_anode *n, const char *field, al_packed packed, int depth,
                   int tag_record, json_t **out);

static int record_to_json(gen *g, const al_anode *n, int depth, int tag, json_t **out)
{
    json_t *o = json_object();
    if (!o) return oom(g);
    if (tag && json_object_set_new(o, "_type", json_string(n->name))) {
        json_decref(o);
        return oom(g);
    }
    for (size_t i = 0; i < n->n_fields; i++) {
        json_t *v;
        if (to_json(g, n->fields[i].type, n->fields[i].name, n->fields[i].packed, depth + 1, 0,
                    &v)) {
            json_decref(o);
            return -1;
        }
        if (json_object_set_new(o, n->fields[i].name, v)) {
            json_decref(o);
            return oom(g);
        }
    }
    *out = o;
    return 0;
}

/* Decodes one value of type n into *out (a new reference). */
static int to_json(gen *g, const al_anode *n, const char *field, al_packed packed, int depth,
                   int tag_record, json_t **out)
{
    al_rd *r = g->r;
    if (depth > GEN_MAX_DEPTH)
        return al_err(r->errstr, r->errlen, "too deep: field %s nests more than %d levels",
                      field, GEN_MAX_DEPTH);
    json_t *v = NULL;
    switch (n->type) {
    case AL_AT_NULL: v = json_null(); break;
    case AL_AT_BOOLEAN: {
        int b;
        if (al_rd_bool(r, field, &b)) return -1;
        v = json_boolean(b);
        break;
    }
    case AL_AT_INT: {
        int32_t x;
        if (al_rd_int(r, field, &x)) return -1;
        v = json_integer(x);
        break;
    }
    case AL_AT_LONG: {
        int64_t x;
        if (al_rd_long(r, field, &x)) return -1;
        v = json_integer(x);
        break;
    }
    case AL_AT_FLOAT: {
        float f;
        if (al_rd_float(r, field, &f)) return -1;
        v = real_to_json(f);
        break;
    }
    case AL_AT_DOUBLE: {
        double d;
        if (al_rd_double(r, field, &d)) return -1;
        v = real_to_json(d);
        break;
    }
    case AL_AT_BYTES:
    case AL_AT_STRING:
    case AL_AT_FIXED: {
        size_t len, off = al_rd_off(r);
        const uint8_t *p;
        if (n->type == AL_AT_FIXED) len = (size_t)n->size;
        else if (al_rd_len(r, field, &len)) return -1;
        if (al_rd_fixed(r, field, len, &p)) return -1;
        if (n->type == AL_AT_STRING) {
            v = json_stringn((const char *)p, len);
            if (!v)
                return al_err(r->errstr, r->errlen,
                              "bad string: field %s is not valid UTF-8 at offset %zu", field, off);
        } else if (packed != AL_PACKED_NONE) {
            size_t step = packed == AL_PACKED_UINT8 ? 1 : 4;
            if (len % step)
                return al_err(r->errstr, r->errlen,
                              "bad packed array: field %s has %zu bytes, not a multiple of %zu, at offset %zu",
                              field, len, step, off);
            v = packed_to_json(p, len, packed);
        } else {
            v = bytes_to_json(p, len);
        }
        break;
    }
    case AL_AT_RECORD: return record_to_json(g, n, depth, tag_record, out);
    case AL_AT_ENUM: {
        int64_t i;
        if (al_rd_index(r, field, "enum", (int64_t)n->n_symbols, &i)) return -1;
        v = json_string(n->symbols[i]);
        break;
    }
    case AL_AT_UNION: {
        int64_t i;
        if (al_rd_index(r, field, "union", (int64_t)n->n_branches, &i)) return -1;
        const al_anode *b = n->branches[i];
        int tag = b->type == AL_AT_RECORD && n->n_branches > 2;
        return to_json(g, b, field, packed, depth + 1, tag, out);
    }
    case AL_AT_ARRAY:
    case AL_AT_MAP: {
        int is_map = n->type == AL_AT_MAP;
        json_t *c = is_map ? json_object() : json_array();
        size_t total = 0, count;
        if (!c) return oom(g);
        for (;;) {
            if (read_block(r, field, n->items, is_map, &total, &count)) goto fail;
            if (!count) break;
            for (size_t i = 0; i < count; i++) {
                json_t *key = NULL, *item;
                if (is_map && to_json(g, &(al_anode){.type = AL_AT_STRING}, field, 0, depth + 1,
                                      0, &key))
                    goto fail;
                if (to_json(g, n->items, field, packed, depth + 1, 0, &item)) {
                    json_decref(key);
                    goto fail;
                }
                int bad = is_map ? json_object_set_new(c, json_string_value(key), item)
                                 : json_array_append_new(c, item);
                json_decref(key);
                if (bad) {
                    oom(g);
                    goto fail;
                }
            }
        }
        *out = c;
        return 0;
    fail:
        json_decref(c);
        return -1;
    }
    }
    if (!v) return oom(g);
    *out = v;
    return 0;
}

int al_avro_to_json(const void *buf, size_t len, char **json_out, char *errstr, size_t errlen)
{
    *json_out = NULL;
    const al_schema_info *in = al_avro_peek(buf, len, errstr, errlen);
    if (!in) return -1;
    const al_aschema *s = al_schema_tree(in);
    al_rd r = {.base = buf,
               .p = (const uint8_t *)buf + AL_AVRO_HEADER_LEN,
               .end = (const uint8_t *)buf + len,
               .errstr = errstr,
               .errlen = errlen};
    gen g = {.r = &r};
    json_t *j;
    if (to_json(&g, s->root, in->name, 0, 0, 0, &j)) return -1;
    if (r.p != r.end) {
        json_decref(j);
        return al_err(errstr, errlen, "trailing bytes: %zu bytes left after the end of the %s at offset %zu",
                      al_rd_left(&r), in->name, al_rd_off(&r));
    }
    *json_out = json_dumps(j, JSON_COMPACT | JSON_ENSURE_ASCII);
    json_decref(j);
    if (!*json_out) return al_err(errstr, errlen, "out of memory writing JSON");
    return 0;
}

/* ---- resolution ------------------------------------------------------------------------- */

typedef struct tx {
    al_rd *r;
    int oom;
} tx;

static void put(tx *t, al_buf *out, const void *p, size_t n)
{
    if (out && al_buf_append(out, p, n)) t->oom = 1;
}

static void put_long(tx *t, al_buf *out, int64_t v)
{
    if (out && al_wr_long(out, v)) t->oom = 1;
}

static int names_match(const al_anode *w, const al_anode *rn)
{
    if (strcmp(w->name, rn->name) == 0 || strcmp(w->fullname, rn->fullname) == 0) return 1;
    for (size_t i = 0; i < rn->n_aliases; i++) {
        const char *a = rn->aliases[i], *dot = strrchr(a, '.');
        if (strcmp(a, w->fullname) == 0 || strcmp(dot ? dot + 1 : a, w->name) == 0) return 1;
    }
    return 0;
}

/* 2: same type, 1: the writer's type promotes to the reader's, 0: no match. Named types
 * match by name. */
static int type_match(const al_anode *w, const al_anode *rn)
{
    if (w->type == rn->type) {
        if (w->type == AL_AT_RECORD || w->type == AL_AT_ENUM || w->type == AL_AT_FIXED)
            return names_match(w, rn) && (w->type != AL_AT_FIXED || w->size == rn->size) ? 2 : 0;
        return 2;
    }
    switch (w->type) {
    case AL_AT_INT: return rn->type == AL_AT_LONG || rn->type == AL_AT_FLOAT || rn->type == AL_AT_DOUBLE;
    case AL_AT_LONG: return rn->type == AL_AT_FLOAT || rn->type == AL_AT_DOUBLE;
    case AL_AT_FLOAT: return rn->type == AL_AT_DOUBLE;
    case AL_AT_STRING: return rn->type == AL_AT_BYTES;
    case AL_AT_BYTES: return rn->type == AL_AT_STRING;
    default: return 0;
    }
}

static int encode_default(tx *t, const al_anode *rn, json_t *def, al_buf *out, const char *field,
                          int depth);

static int transcode(tx *t, const al_anode *w, const al_anode *rn, al_buf *out,
                     const char *field, int depth);

static int transcode_record(tx *t, const al_anode *w, const al_anode *rn, al_buf *out, int depth)
{
    al_rd *r = t->r;
    if (!out || w == rn) { /* same schema node: fields in the same order */
        for (size_t i = 0; i < w->n_fields; i++)
            if (transcode(t, w->fields[i].type, w->fields[i].type, out, w->fields[i].name,
                          depth + 1))
                return -1;
        return 0;
    }
    al_buf *parts = calloc(rn->n_fields ? rn->n_fields : 1, sizeof *parts);
    char *have = calloc(rn->n_fields ? rn->n_fields : 1, 1);
    int rc = -1;
    if (!parts || !have) {
        rc = al_err(r->errstr, r->errlen, "out of memory");
        goto done;
    }
    for (size_t i = 0; i < w->n_fields; i++) {
        const al_afield *wf = &w->fields[i];
        long k = -1;
        for (size_t j = 0; j < rn->n_fields && k < 0; j++) {
            const al_afield *rf = &rn->fields[j];
            if (strcmp(rf->name, wf->name) == 0) k = (long)j;
            for (size_t a = 0; a < rf->n_aliases && k < 0; a++)
                if (strcmp(rf->aliases[a], wf->name) == 0) k = (long)j;
        }
        if (k < 0 || have[k]) {
            if (transcode(t, wf->type, wf->type, NULL, wf->name, depth + 1)) goto done;
        } else {
            if (transcode(t, wf->type, rn->fields[k].type, &parts[k], wf->name, depth + 1))
                goto done;
            have[k] = 1;
        }
    }
    for (size_t k = 0; k < rn->n_fields; k++) {
        if (have[k]) {
            put(t, out, parts[k].data, parts[k].len);
        } else if (rn->fields[k].def) {
            if (encode_default(t, rn->fields[k].type, rn->fields[k].def, out,
                               rn->fields[k].name, depth + 1))
                goto done;
        } else {
            al_err(r->errstr, r->errlen,
                   "cannot resolve: reader field %s.%s has no default and the writer lacks it",
                   rn->fullname, rn->fields[k].name);
            goto done;
        }
    }
    rc = 0;
done:
    for (size_t k = 0; parts && k < rn->n_fields; k++) al_buf_free(&parts[k]);
    free(parts);
    free(have);
    return rc;
}

/* Reads one value of writer type w and, when out is not NULL, writes it as reader type rn.
 * out NULL skips (and validates) the value; rn is then w. */
static int transcode(tx *t, const al_anode *w, const al_anode *rn, al_buf *out,
                     const char *field, int depth)
{
    al_rd *r = t->r;
    if (depth > GEN_MAX_DEPTH)
        return al_err(r->errstr, r->errlen, "too deep: field %s nests more than %d levels",
                      field, GEN_MAX_DEPTH);
    if (t->oom) return al_err(r->errstr, r->errlen, "out of memory");
    if (w->type == AL_AT_UNION) {
        int64_t i;
        if (al_rd_index(r, field, "union", (int64_t)w->n_branches, &i)) return -1;
        return transcode(t, w->branches[i], out ? rn : w->branches[i], out, field, depth + 1);
    }
    if (out && rn->type == AL_AT_UNION) {
        long best = -1;
        for (size_t i = 0; i < rn->n_branches && best < 0; i++)
            if (type_match(w, rn->branches[i]) == 2) best = (long)i;
        for (size_t i = 0; i < rn->n_branches && best < 0; i++)
            if (type_match(w, rn->branches[i]) == 1) best = (long)i;
        if (best < 0)
            return al_err(r->errstr, r->errlen,
                          "cannot resolve: field %s: the writer's %s is in no branch of the reader's union",
                          field, type_name(w));
        put_long(t, out, best);
        return transcode(t, w, rn->branches[best], out, field, depth + 1);
    }
    if (out && !type_match(w, rn))
        return al_err(r->errstr, r->errlen,
                      "cannot resolve: field %s is a %s in the writer and a %s in the reader",
                      field, type_name(w), type_name(rn));
    switch (w->type) {
    case AL_AT_NULL: return 0;
    case AL_AT_BOOLEAN: {
        int b;
        if (al_rd_bool(r, field, &b)) return -1;
        uint8_t c = (uint8_t)b;
        put(t, out, &c, 1);
        return 0;
    }
    case AL_AT_INT:
    case AL_AT_LONG: {
        int64_t x;
        if (w->type == AL_AT_INT) {
            int32_t i32;
            if (al_rd_int(r, field, &i32)) return -1;
            x = i32;
        } else if (al_rd_long(r, field, &x)) {
            return -1;
        }
        if (!out) return 0;
        if (rn->type == AL_AT_FLOAT) {
            if (al_wr_float(out, (float)x)) t->oom = 1;
        } else if (rn->type == AL_AT_DOUBLE) {
            if (al_wr_double(out, (double)x)) t->oom = 1;
        } else {
            put_long(t, out, x);
        }
        return 0;
    }
    case AL_AT_FLOAT: {
        float f;
        if (al_rd_float(r, field, &f)) return -1;
        if (out && (rn->type == AL_AT_DOUBLE ? al_wr_double(out, f) : al_wr_float(out, f)))
            t->oom = 1;
        return 0;
    }
    case AL_AT_DOUBLE: {
        double d;
        if (al_rd_double(r, field, &d)) return -1;
        if (out && al_wr_double(out, d)) t->oom = 1;
        return 0;
    }
    case AL_AT_BYTES:
    case AL_AT_STRING: {
        size_t len;
        const uint8_t *p;
        if (al_rd_len(r, field, &len) || al_rd_fixed(r, field, len, &p)) return -1;
        if (out && al_wr_bytes(out, p, len)) t->oom = 1;
        return 0;
    }
    case AL_AT_FIXED: {
        const uint8_t *p;
        if (al_rd_fixed(r, field, (size_t)w->size, &p)) return -1;
        put(t, out, p, (size_t)w->size);
        return 0;
    }
    case AL_AT_ENUM: {
        int64_t i;
        if (al_rd_index(r, field, "enum", (int64_t)w->n_symbols, &i)) return -1;
        if (!out) return 0;
        const char *sym = w->symbols[i];
        long k = -1;
        for (size_t j = 0; j < rn->n_symbols && k < 0; j++)
            if (strcmp(rn->symbols[j], sym) == 0) k = (long)j;
        for (size_t j = 0; j < rn->n_symbols && k < 0 && rn->enum_default; j++)
            if (strcmp(rn->symbols[j], rn->enum_default) == 0) k = (long)j;
        if (k < 0)
            return al_err(r->errstr, r->errlen,
                          "cannot resolve: field %s: symbol %s is not in the reader's enum %s and it has no default",
                          field, sym, rn->fullname);
        put_long(t, out, k);
        return 0;
    }
    case AL_AT_RECORD: return transcode_record(t, w, rn, out, depth);
    case AL_AT_ARRAY:
    case AL_AT_MAP: {
        int is_map = w->type == AL_AT_MAP;
        size_t total = 0, count;
        for (;;) {
            if (read_block(r, field, w->items, is_map, &total, &count)) return -1;
            put_long(t, out, (int64_t)count);
            if (!count) return 0;
            for (size_t i = 0; i < count; i++) {
                if (is_map) {
                    size_t len;
                    const uint8_t *p;
                    if (al_rd_len(r, field, &len) || al_rd_fixed(r, field, len, &p)) return -1;
                    if (out && al_wr_bytes(out, p, len)) t->oom = 1;
                }
                if (transcode(t, w->items, out ? rn->items : w->items, out, field, depth + 1))
                    return -1;
            }
        }
    }
    case AL_AT_UNION: break;
    }
    return al_err(r->errstr, r->errlen, "internal error: unhandled type");
}

/* A default's text as bytes: each code point of the string is one byte (Avro's JSON
 * encoding of bytes and fixed). */
static int default_bytes(const char *s, size_t n, al_buf *b)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        uint8_t v = c;
        if (c >= 0x80) {
            if ((c & 0xe0) != 0xc0 || i + 1 >= n) return -1;
            v = (uint8_t)(((c & 0x1f) << 6) | ((unsigned char)s[++i] & 0x3f));
        }
        if (al_buf_append(b, &v, 1)) return -1;
    }
    return 0;
}

/* Writes a field default (JSON, from the reader schema) as reader type rn. */
static int encode_default(tx *t, const al_anode *rn, json_t *def, al_buf *out, const char *field,
                          int depth)
{
    al_rd *r = t->r;
    if (depth > GEN_MAX_DEPTH)
        return al_err(r->errstr, r->errlen, "too deep: default of %s", field);
    int ok = 1;
    switch (rn->type) {
    case AL_AT_NULL: ok = json_is_null(def); break;
    case AL_AT_BOOLEAN: {
        ok = json_is_boolean(def);
        uint8_t c = json_is_true(def);
        if (ok) put(t, out, &c, 1);
        break;
    }
    case AL_AT_INT:
    case AL_AT_LONG:
        ok = json_is_integer(def);
        if (ok) put_long(t, out, json_integer_value(def));
        break;
    case AL_AT_FLOAT:
    case AL_AT_DOUBLE:
        ok = json_is_number(def);
        if (ok && (rn->type == AL_AT_FLOAT ? al_wr_float(out, (float)json_number_value(def))
                                           : al_wr_double(out, json_number_value(def))))
            t->oom = 1;
        break;
    case AL_AT_STRING:
        ok = json_is_string(def);
        if (ok && al_wr_bytes(out, json_string_value(def), json_string_length(def))) t->oom = 1;
        break;
    case AL_AT_BYTES:
    case AL_AT_FIXED: {
        al_buf b = {0};
        ok = json_is_string(def) &&
             !default_bytes(json_string_value(def), json_string_length(def), &b) &&
             (rn->type == AL_AT_BYTES || b.len == (size_t)rn->size);
        if (ok && (rn->type == AL_AT_BYTES ? al_wr_bytes(out, b.data, b.len)
                                           : al_buf_append(out, b.data, b.len)))
            t->oom = 1;
        al_buf_free(&b);
        break;
    }
    case AL_AT_ENUM: {
        const char *s = json_string_value(def);
        long k = -1;
        for (size_t j = 0; s && j < rn->n_symbols && k < 0; j++)
            if (strcmp(rn->symbols[j], s) == 0) k = (long)j;
        ok = k >= 0;
        if (ok) put_long(t, out, k);
        break;
    }
    case AL_AT_RECORD:
        ok = json_is_object(def);
        for (size_t i = 0; ok && i < rn->n_fields; i++) {
            json_t *v = json_object_get(def, rn->fields[i].name);
            if (!v) v = rn->fields[i].def;
            if (!v)
                return al_err(r->errstr, r->errlen, "default of %s lacks field %s", field,
                              rn->fields[i].name);
            if (encode_default(t, rn->fields[i].type, v, out, rn->fields[i].name, depth + 1))
                return -1;
        }
        break;
    case AL_AT_ARRAY:
        ok = json_is_array(def);
        if (ok && json_array_size(def)) put_long(t, out, (int64_t)json_array_size(def));
        for (size_t i = 0; ok && i < json_array_size(def); i++)
            if (encode_default(t, rn->items, json_array_get(def, i), out, field, depth + 1))
                return -1;
        if (ok) put_long(t, out, 0);
        break;
    case AL_AT_MAP: {
        ok = json_is_object(def);
        const char *k;
        json_t *v;
        if (ok && json_object_size(def)) put_long(t, out, (int64_t)json_object_size(def));
        if (ok)
            json_object_foreach(def, k, v)
            {
                if (al_wr_string(out, k)) t->oom = 1;
                if (encode_default(t, rn->items, v, out, field, depth + 1)) return -1;
            }
        if (ok) put_long(t, out, 0);
        break;
    }
    case AL_AT_UNION: /* a union's default is a value of its first branch */
        ok = rn->n_branches > 0;
        if (ok) {
            put_long(t, out, 0);
            return encode_default(t, rn->branches[0], def, out, field, depth + 1);
        }
        break;
    }
    if (!ok)
        return al_err(r->errstr, r->errlen, "the reader's default for field %s is not a valid %s",
                      field, type_name(rn));
    if (t->oom) return al_err(r->errstr, r->errlen, "out of memory");
    return 0;
}

int al_avro_resolve(const void *buf, size_t len, const char *reader_schema_json, al_buf *out,
                    char *errstr, size_t errlen)
{
    const al_schema_info *win = al_avro_peek(buf, len, errstr, errlen);
    if (!win) return -1;
    /* The reader schema: a registered version when it is one (parsed once), else parsed
     * now. */
    const al_aschema *rs = NULL;
    al_aschema *parsed = NULL;
    size_t n;
    const al_schema_info *const *list = al_schema_list(&n);
    uint64_t rfp = 0;
    for (size_t i = 0; i < n && !rs; i++)
        if (list[i]->json == reader_schema_json || strcmp(list[i]->json, reader_schema_json) == 0) {
            rs = al_schema_tree(list[i]);
            rfp = list[i]->fingerprint;
        }
    if (!rs) {
        parsed = al_aschema_parse(reader_schema_json, errstr, errlen);
        if (!parsed) return -1;
        char *c = al_aschema_canonical(parsed);
        if (!c) {
            al_aschema_free(parsed);
            return al_err(errstr, errlen, "out of memory");
        }
        rfp = al_avro_crc64(c, strlen(c));
        free(c);
        rs = parsed;
    }
    al_rd r = {.base = buf,
               .p = (const uint8_t *)buf + AL_AVRO_HEADER_LEN,
               .end = (const uint8_t *)buf + len,
               .errstr = errstr,
               .errlen = errlen};
    tx t = {.r = &r};
    int rc = -1;
    if (al_wr_header(out, rfp)) {
        al_err(errstr, errlen, "out of memory");
        goto done;
    }
    if (transcode(&t, al_schema_tree(win)->root, rs->root, out, win->name, 0)) goto done;
    if (t.oom) {
        al_err(errstr, errlen, "out of memory");
        goto done;
    }
    if (r.p != r.end) {
        al_err(errstr, errlen, "trailing bytes: %zu bytes left after the end of the %s at offset %zu",
               al_rd_left(&r), win->name, al_rd_off(&r));
        goto done;
    }
    rc = 0;
done:
    al_aschema_free(parsed);
    return rc;
}
