#include "text/json.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define JSON_MAX_DEPTH 512

/* Every node, string and item array of one document lives in a chain of arena blocks that
 * al_json_free releases together. The root node is the first allocation of the first block,
 * so the root pointer is also the handle of the whole arena. */
typedef struct arena_block {
    struct arena_block *next;
    size_t used, cap;
    max_align_t data[];
} arena_block;

typedef struct parser {
    const char *p, *start, *end;
    arena_block *head; /* first block: holds the root */
    arena_block *cur;
    char *errstr;
    size_t errlen;
    int failed;
} parser;

static void *arena_alloc(parser *ps, size_t n)
{
    n = (n + sizeof(max_align_t) - 1) & ~(sizeof(max_align_t) - 1);
    if (!ps->cur || ps->cur->cap - ps->cur->used < n) {
        size_t cap = n > (1u << 16) ? n : (1u << 16);
        arena_block *b = malloc(sizeof *b + cap);
        if (!b) return NULL;
        b->next = NULL;
        b->used = 0;
        b->cap = cap;
        if (ps->cur)
            ps->cur->next = b;
        else
            ps->head = b;
        ps->cur = b;
    }
    void *r = (char *)ps->cur->data + ps->cur->used;
    ps->cur->used += n;
    return r;
}

static void fail(parser *ps, const char *what)
{
    if (ps->failed) return;
    ps->failed = 1;
    if (ps->errstr && ps->errlen)
        snprintf(ps->errstr, ps->errlen, "invalid JSON: %s at byte %zu", what,
                 (size_t)(ps->p - ps->start));
}

static void skip_ws(parser *ps)
{
    while (ps->p < ps->end &&
           (*ps->p == ' ' || *ps->p == '\t' || *ps->p == '\n' || *ps->p == '\r'))
        ps->p++;
}

static int hex4(const char *s, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return -1;
    }
    *out = v;
    return 0;
}

static size_t utf8_put(char *o, unsigned cp)
{
    if (cp < 0x80) {
        o[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        o[0] = (char)(0xC0 | (cp >> 6));
        o[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | (cp >> 12));
        o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | (cp >> 18));
    o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Parses a string starting at the opening quote. The unescaped text is never longer than
 * the escaped one (a \uXXXX of 6 bytes yields at most 3, a surrogate pair of 12 yields 4). */
static const char *parse_string(parser *ps, size_t *len_out)
{
    const char *s = ++ps->p;
    const char *q = s;
    while (q < ps->end && *q != '"') {
        if (*q == '\\') q++;
        q++;
    }
    if (q >= ps->end) {
        fail(ps, "unterminated string");
        return NULL;
    }
    char *out = arena_alloc(ps, (size_t)(q - s) + 1);
    if (!out) {
        fail(ps, "out of memory");
        return NULL;
    }
    size_t n = 0;
    while (ps->p < q) {
        unsigned char c = (unsigned char)*ps->p;
        if (c < 0x20) {
            fail(ps, "control character in string");
            return NULL;
        }
        if (c != '\\') {
            out[n++] = (char)c;
            ps->p++;
            continue;
        }
        ps->p++;
        char e = *ps->p++;
        switch (e) {
        case '"': out[n++] = '"'; break;
        case '\\': out[n++] = '\\'; break;
        case '/': out[n++] = '/'; break;
        case 'b': out[n++] = '\b'; break;
        case 'f': out[n++] = '\f'; break;
        case 'n': out[n++] = '\n'; break;
        case 'r': out[n++] = '\r'; break;
        case 't': out[n++] = '\t'; break;
        case 'u': {
            unsigned cp, lo;
            if (q - ps->p < 4 || hex4(ps->p, &cp) != 0) {
                fail(ps, "bad \\u escape");
                return NULL;
            }
            ps->p += 4;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (q - ps->p >= 6 && ps->p[0] == '\\' && ps->p[1] == 'u' &&
                    hex4(ps->p + 2, &lo) == 0 && lo >= 0xDC00 && lo <= 0xDFFF) {
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                    ps->p += 6;
                } else {
                    cp = 0xFFFD; /* lone high surrogate */
                }
            } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
                cp = 0xFFFD; /* lone low surrogate */
            }
            n += utf8_put(out + n, cp);
            break;
        }
        default:
            ps->p--;
            fail(ps, "bad escape in string");
            return NULL;
        }
    }
    out[n] = '\0';
    ps->p = q + 1;
    *len_out = n;
    return out;
}

static al_json *new_node(parser *ps, al_json_type t)
{
    al_json *v = arena_alloc(ps, sizeof *v);
    if (!v) {
        fail(ps, "out of memory");
        return NULL;
    }
    memset(v, 0, sizeof *v);
    v->type = t;
    return v;
}

static int parse_value(parser *ps, al_json *v, int depth);

/* Items are collected on a growable heap array, then copied into the arena once the
 * count is known. */
typedef struct item_stack {
    al_json **vals;
    const char **keys;
    size_t *key_lens;
    size_t n, cap;
} item_stack;

static int stack_push(item_stack *st, al_json *v, const char *k, size_t klen)
{
    if (st->n == st->cap) {
        size_t cap = st->cap ? st->cap * 2 : 8;
        al_json **nv = realloc(st->vals, cap * sizeof *nv);
        if (!nv) return -1;
        st->vals = nv;
        const char **nk = realloc(st->keys, cap * sizeof *nk);
        if (!nk) return -1;
        st->keys = nk;
        size_t *nl = realloc(st->key_lens, cap * sizeof *nl);
        if (!nl) return -1;
        st->key_lens = nl;
        st->cap = cap;
    }
    st->vals[st->n] = v;
    st->keys[st->n] = k;
    st->key_lens[st->n] = klen;
    st->n++;
    return 0;
}

static int parse_container(parser *ps, al_json *v, int depth, int is_object)
{
    item_stack st = {0};
    char close = is_object ? '}' : ']';
    int rc = -1;

    ps->p++;
    skip_ws(ps);
    if (ps->p < ps->end && *ps->p == close) {
        ps->p++;
        return 0;
    }
    for (;;) {
        const char *key = NULL;
        size_t klen = 0;
        skip_ws(ps);
        if (is_object) {
            if (ps->p >= ps->end || *ps->p != '"') {
                fail(ps, "expected a member name");
                goto out;
            }
            key = parse_string(ps, &klen);
            if (!key) goto out;
            skip_ws(ps);
            if (ps->p >= ps->end || *ps->p != ':') {
                fail(ps, "expected ':'");
                goto out;
            }
            ps->p++;
        }
        al_json *item = new_node(ps, AL_JSON_NULL);
        if (!item || parse_value(ps, item, depth + 1) != 0) goto out;
        if (stack_push(&st, item, key, klen) != 0) {
            fail(ps, "out of memory");
            goto out;
        }
        skip_ws(ps);
        if (ps->p < ps->end && *ps->p == ',') {
            ps->p++;
            continue;
        }
        if (ps->p < ps->end && *ps->p == close) {
            ps->p++;
            break;
        }
        fail(ps, is_object ? "expected ',' or '}'" : "expected ',' or ']'");
        goto out;
    }
    v->count = st.n;
    v->items = arena_alloc(ps, st.n * sizeof *v->items);
    if (!v->items) {
        fail(ps, "out of memory");
        goto out;
    }
    memcpy(v->items, st.vals, st.n * sizeof *v->items);
    if (is_object) {
        v->keys = arena_alloc(ps, st.n * sizeof *v->keys);
        v->key_lens = arena_alloc(ps, st.n * sizeof *v->key_lens);
        if (!v->keys || !v->key_lens) {
            fail(ps, "out of memory");
            goto out;
        }
        memcpy(v->keys, st.keys, st.n * sizeof *v->keys);
        memcpy(v->key_lens, st.key_lens, st.n * sizeof *v->key_lens);
    }
    rc = 0;
out:
    free(st.vals);
    free(st.keys);
    free(st.key_lens);
    return rc;
}

static int parse_number(parser *ps, al_json *v)
{
    const char *s = ps->p;
    const char *q = s;
    int integral = 1;
    if (q < ps->end && *q == '-') q++;
    if (q >= ps->end || *q < '0' || *q > '9') {
        fail(ps, "bad number");
        return -1;
    }
    if (*q == '0' && q + 1 < ps->end && q[1] >= '0' && q[1] <= '9') {
        fail(ps, "leading zero in number");
        return -1;
    }
    while (q < ps->end && *q >= '0' && *q <= '9')
        q++;
    if (q < ps->end && *q == '.') {
        integral = 0;
        q++;
        if (q >= ps->end || *q < '0' || *q > '9') {
            fail(ps, "bad fraction");
            return -1;
        }
        while (q < ps->end && *q >= '0' && *q <= '9')
            q++;
    }
    if (q < ps->end && (*q == 'e' || *q == 'E')) {
        integral = 0;
        q++;
        if (q < ps->end && (*q == '+' || *q == '-')) q++;
        if (q >= ps->end || *q < '0' || *q > '9') {
            fail(ps, "bad exponent");
            return -1;
        }
        while (q < ps->end && *q >= '0' && *q <= '9')
            q++;
    }
    char buf[64];
    size_t n = (size_t)(q - s);
    char *heap = NULL, *text = buf;
    if (n >= sizeof buf) {
        heap = malloc(n + 1);
        if (!heap) {
            fail(ps, "out of memory");
            return -1;
        }
        text = heap;
    }
    memcpy(text, s, n);
    text[n] = '\0';
    v->type = AL_JSON_NUMBER;
    v->number = strtod(text, NULL);
    if (integral) {
        errno = 0;
        long long ll = strtoll(text, NULL, 10);
        if (errno == 0) {
            v->integer = ll;
            v->is_integer = 1;
        }
    }
    free(heap);
    ps->p = q;
    return 0;
}

static int literal(parser *ps, const char *word, size_t n)
{
    if ((size_t)(ps->end - ps->p) < n || memcmp(ps->p, word, n) != 0) {
        fail(ps, "unexpected token");
        return -1;
    }
    ps->p += n;
    return 0;
}

static int parse_value(parser *ps, al_json *v, int depth)
{
    if (depth > JSON_MAX_DEPTH) {
        fail(ps, "nesting too deep");
        return -1;
    }
    skip_ws(ps);
    if (ps->p >= ps->end) {
        fail(ps, "unexpected end of input");
        return -1;
    }
    switch (*ps->p) {
    case '{':
        v->type = AL_JSON_OBJECT;
        return parse_container(ps, v, depth, 1);
    case '[':
        v->type = AL_JSON_ARRAY;
        return parse_container(ps, v, depth, 0);
    case '"':
        v->type = AL_JSON_STRING;
        v->string = parse_string(ps, &v->string_len);
        return v->string ? 0 : -1;
    case 't':
        v->type = AL_JSON_TRUE;
        return literal(ps, "true", 4);
    case 'f':
        v->type = AL_JSON_FALSE;
        return literal(ps, "false", 5);
    case 'n':
        v->type = AL_JSON_NULL;
        return literal(ps, "null", 4);
    default:
        return parse_number(ps, v);
    }
}

static void arena_free_chain(arena_block *b)
{
    while (b) {
        arena_block *n = b->next;
        free(b);
        b = n;
    }
}

al_json *al_json_parse(const char *text, size_t len, char *errstr, size_t errlen)
{
    parser ps = {.p = text, .start = text, .end = text + len, .errstr = errstr, .errlen = errlen};
    al_json *root = new_node(&ps, AL_JSON_NULL);
    if (!root) {
        arena_free_chain(ps.head);
        return NULL;
    }
    if (parse_value(&ps, root, 0) == 0) {
        skip_ws(&ps);
        if (ps.p != ps.end) fail(&ps, "trailing characters after the document");
    }
    if (ps.failed) {
        arena_free_chain(ps.head);
        return NULL;
    }
    return root;
}

void al_json_free(al_json *root)
{
    if (!root) return;
    /* The root sits at the start of the first block's data. */
    arena_block *b = (arena_block *)((char *)root - offsetof(arena_block, data));
    arena_free_chain(b);
}

const al_json *al_json_get(const al_json *obj, const char *key)
{
    if (!obj || obj->type != AL_JSON_OBJECT) return NULL;
    for (size_t i = 0; i < obj->count; i++)
        if (strcmp(obj->keys[i], key) == 0) return obj->items[i];
    return NULL;
}

double al_json_get_number(const al_json *obj, const char *key, double dflt)
{
    const al_json *v = al_json_get(obj, key);
    return (v && v->type == AL_JSON_NUMBER) ? v->number : dflt;
}

int64_t al_json_get_int(const al_json *obj, const char *key, int64_t dflt)
{
    const al_json *v = al_json_get(obj, key);
    if (!v || v->type != AL_JSON_NUMBER) return dflt;
    return v->is_integer ? v->integer : (int64_t)v->number;
}

int al_json_get_bool(const al_json *obj, const char *key, int dflt)
{
    const al_json *v = al_json_get(obj, key);
    if (v && v->type == AL_JSON_TRUE) return 1;
    if (v && v->type == AL_JSON_FALSE) return 0;
    return dflt;
}

const char *al_json_get_string(const al_json *obj, const char *key, const char *dflt)
{
    const al_json *v = al_json_get(obj, key);
    return (v && v->type == AL_JSON_STRING) ? v->string : dflt;
}

void al_json_quote(al_buf *b, const char *s, size_t len)
{
    al_buf_append(b, "\"", 1);
    size_t run = 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c != '"' && c != '\\') continue;
        al_buf_append(b, s + run, i - run);
        run = i + 1;
        switch (c) {
        case '"': al_buf_append(b, "\\\"", 2); break;
        case '\\': al_buf_append(b, "\\\\", 2); break;
        case '\n': al_buf_append(b, "\\n", 2); break;
        case '\r': al_buf_append(b, "\\r", 2); break;
        case '\t': al_buf_append(b, "\\t", 2); break;
        default: al_buf_printf(b, "\\u%04x", c); break;
        }
    }
    al_buf_append(b, s + run, len - run);
    al_buf_append(b, "\"", 1);
}

void al_json_write(al_buf *b, const al_json *v)
{
    switch (v->type) {
    case AL_JSON_NULL:
        al_buf_append(b, "null", 4);
        break;
    case AL_JSON_TRUE:
        al_buf_append(b, "true", 4);
        break;
    case AL_JSON_FALSE:
        al_buf_append(b, "false", 5);
        break;
    case AL_JSON_NUMBER:
        if (v->is_integer)
            al_buf_printf(b, "%lld", (long long)v->integer);
        else
            al_buf_printf(b, "%.17g", v->number);
        break;
    case AL_JSON_STRING:
        al_json_quote(b, v->string, v->string_len);
        break;
    case AL_JSON_ARRAY:
        al_buf_append(b, "[", 1);
        for (size_t i = 0; i < v->count; i++) {
            if (i) al_buf_append(b, ",", 1);
            al_json_write(b, v->items[i]);
        }
        al_buf_append(b, "]", 1);
        break;
    case AL_JSON_OBJECT:
        al_buf_append(b, "{", 1);
        for (size_t i = 0; i < v->count; i++) {
            if (i) al_buf_append(b, ",", 1);
            al_json_quote(b, v->keys[i], v->key_lens[i]);
            al_buf_append(b, ":", 1);
            al_json_write(b, v->items[i]);
        }
        al_buf_append(b, "}", 1);
        break;
    }
}
